/* Attempt namespaces: where a rendezvous keeps its keys in a store that
 * outlives the job (a long-lived `c10d-store serve`, torchrun's agent store
 * across restarts). docs/semantics.md (1) has the decision; in short:
 *
 * - the namespace: "/worker/attempt_<N>" (torch's, N =
 *   TORCHELASTIC_RESTART_COUNT, 0 when unset), with "/worker/<job>/..."
 *   when the launcher names the job (TORCHELASTIC_RUN_ID, else Slurm's
 *   "<job>.<step>", else the PMIx namespace), so jobs with different ids
 *   never meet;
 * - inside it, a generation: rank 0 takes g = ADD("c10d_generation", 1) and
 *   the group's keys go under "gen_<g>/default_pg/". Nothing else tells two
 *   jobs apart (same id, or none, through one store), so a rank other than 0
 *   asks rank 0 for g with a ticket only it holds, and never reads a key it
 *   did not see rank 0 write for that ticket:
 *     rank r: k = ADD("c10d_ask/<r>", 1); SET "c10d_ask/<r>/<k>" = "ask";
 *             g = GET "c10d_answer/<r>/<k>" (waits);
 *             k+1 = ADD(...); SET "c10d_ask/<r>/<k+1>" = "ack <g>"
 *     rank 0: for each r, from ticket a = ADD("c10d_ask/<r>", 0): wait for
 *             "c10d_ask/<r>/<n>"; "ask": answer it with g; "ack <g>": r has
 *             it, done; anything else (an ack of an earlier generation):
 *             stale; n++ (every rank's first ask is answered before any ack
 *             is waited for).
 *   Tickets are never reused (the counters are never deleted), so an answer
 *   key found for a fresh ticket was written by this job's rank 0. A ticket
 *   taken by a process that died before it wrote its ask is skipped once the
 *   counter passed it.
 * - clean-up: once every rank has its generation nobody reads an earlier
 *   generation's keys or an earlier attempt's namespace: rank 0 deletes them
 *   (asynchronously, best effort; a rank 0 that exits first leaves them to
 *   the next one), keeping only the counters and each rank's last ack.
 *
 * Callers' threads only (blocking store calls). */
#include "api/attempt.h"

#include "engine/env.h"
#include "engine/error.h"
#include "engine/log.h"
#include "engine/loop.h"
#include "store_server/client/store.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GENERATION_KEY "c10d_generation"
/* A ticket whose ask never appears (its process died between the ADD and
 * the SET) is noticed when a wait this long times out and the counter has
 * moved past it. */
#define ASK_SLICE_MS 500
/* Earlier attempts of one run that rank 0 looks for to delete. */
#define ATTEMPTS_SWEPT 64

/* The launcher's name for this job, or NULL. */
static const char *job_id(char *buf, size_t cap)
{
    const char *run = c10d__env_str(C10D_ENV_TORCHELASTIC_RUN_ID);
    if (run != NULL && *run)
        return run;
    const char *job = c10d__env_str(C10D_ENV_SLURM_JOB_ID);
    const char *step = c10d__env_str(C10D_ENV_SLURM_STEP_ID);
    if (job != NULL && *job) {
        snprintf(buf, cap, "%s.%s", job, step != NULL && *step ? step : "batch");
        return buf;
    }
    const char *pmix = c10d__env_str(C10D_ENV_PMIX_NAMESPACE);
    return pmix != NULL && *pmix ? pmix : NULL;
}

static int restart_count(void)
{
    const char *v = c10d__env_str(C10D_ENV_TORCHELASTIC_RESTART_COUNT);
    if (v == NULL || !*v)
        return 0;
    int64_t n = c10d__env_int(C10D_ENV_TORCHELASTIC_RESTART_COUNT);
    return n > 0 && n < INT32_MAX ? (int)n : 0;
}

static void attempt_namespace(char *out, size_t cap, int attempt)
{
    char buf[160];
    const char *job = job_id(buf, sizeof buf);
    if (job != NULL)
        snprintf(out, cap, "/worker/%.128s/attempt_%d", job, attempt);
    else
        snprintf(out, cap, "/worker/attempt_%d", attempt);
}

static int64_t left_ms(uint64_t deadline)
{
    uint64_t now = c10d__now_ms();
    return now < deadline ? (int64_t)(deadline - now) : 0;
}

/* ------------------------------------------------------------ rank r > 0 */

static int ask_generation(c10d_store *ns, int rank, uint64_t deadline, int64_t *gen)
{
    char counter[64], ask[96], answer[96];
    snprintf(counter, sizeof counter, "c10d_ask/%d", rank);
    int64_t ticket;
    C10D_CHECK(c10d_store_add_sync(ns, counter, 1, &ticket));
    snprintf(ask, sizeof ask, "c10d_ask/%d/%" PRId64, rank, ticket);
    snprintf(answer, sizeof answer, "c10d_answer/%d/%" PRId64, rank, ticket);
    C10D_CHECK(c10d_store_set_sync(ns, ask, "ask", 3));
    const char *keys[] = {answer};
    int rc = c10d_store_wait_sync(ns, keys, 1, left_ms(deadline) > 0 ? left_ms(deadline) : 1);
    if (rc == C10D_ETIMEDOUT)
        return c10d__fail(rc,
                          "rank 0 did not hand out the job's generation (ticket %" PRId64
                          " of rank %d): is rank 0 running, with the same job id and "
                          "restart count?",
                          ticket, rank);
    if (rc < 0)
        return rc;
    char text[32];
    C10D_CHECK(c10d__store_get_text_sync(ns, answer, text, sizeof text, NULL));
    char *end;
    long long g = strtoll(text, &end, 10);
    if (*end || g <= 0)
        return c10d__fail(C10D_EPROTO, "the generation key holds '%s'", text);
    *gen = g;
    /* The acknowledgement ends rank 0's wait for this rank. */
    C10D_CHECK(c10d_store_add_sync(ns, counter, 1, &ticket));
    snprintf(ask, sizeof ask, "c10d_ask/%d/%" PRId64, rank, ticket);
    snprintf(text, sizeof text, "ack %lld", g);
    return c10d_store_set_sync(ns, ask, text, strlen(text));
}

/* ---------------------------------------------------------------- rank 0 */

/* Walks rank r's tickets from *ticket (0: where its counter is), answering
 * every ask with g, until it has answered one (until_ack == 0) or found r's
 * acknowledgement of g (until_ack == 1). *ticket: the next ticket to look
 * at, or the ack's. Rank 0 first answers every rank, then collects the
 * acks, so the ranks' round trips overlap. */
static int answer_rank(c10d_store *ns, int rank, int64_t gen, uint64_t deadline, int until_ack,
                       int64_t *ticket)
{
    char counter[64], ask[96], answer[96], gen_text[32], ack[40];
    snprintf(counter, sizeof counter, "c10d_ask/%d", rank);
    snprintf(gen_text, sizeof gen_text, "%" PRId64, gen);
    snprintf(ack, sizeof ack, "ack %" PRId64, gen);
    int64_t n = *ticket;
    if (n < 1) {
        C10D_CHECK(c10d_store_add_sync(ns, counter, 0, &n));
        if (n < 1)
            n = 1;
    }
    for (;;) {
        int64_t left = left_ms(deadline);
        if (left <= 0)
            return c10d__fail(C10D_ETIMEDOUT,
                              "rank %d did not %s the job's generation (waiting at its ticket "
                              "%" PRId64 ")",
                              rank, until_ack ? "acknowledge" : "ask for", n);
        snprintf(ask, sizeof ask, "c10d_ask/%d/%" PRId64, rank, n);
        const char *keys[] = {ask};
        int rc = c10d_store_wait_sync(ns, keys, 1, left < ASK_SLICE_MS ? left : ASK_SLICE_MS);
        if (rc == C10D_ETIMEDOUT) {
            int64_t taken;
            C10D_CHECK(c10d_store_add_sync(ns, counter, 0, &taken));
            if (taken > n)
                n++; /* a ticket whose ask never came: its process is gone */
            continue;
        }
        if (rc < 0)
            return rc;
        void *value = NULL;
        size_t len = 0;
        C10D_CHECK(c10d_store_get_sync(ns, ask, &value, &len));
        int is_ask = len == 3 && memcmp(value, "ask", 3) == 0;
        int is_ours = len == strlen(ack) && memcmp(value, ack, len) == 0;
        free(value);
        if (is_ours && until_ack) {
            *ticket = n;
            return 0;
        }
        if (is_ask) {
            snprintf(answer, sizeof answer, "c10d_answer/%d/%" PRId64, rank, n);
            C10D_CHECK(c10d_store_set_sync(ns, answer, gen_text, strlen(gen_text)));
            if (!until_ack) {
                *ticket = n + 1;
                return 0;
            }
        }
        n++;
    }
}

/* ---------------------------------------------------------------- sweep */

static void deleted(c10d_work *w, int status, void *arg)
{
    (void)w;
    (void)status;
    c10d_store_release(arg);
}

static void delete_later(c10d_store *s, const char *key)
{
    c10d_store_request q = {.struct_size = sizeof q, .op = C10D_STORE_OP_DELETE_KEY, .key = key};
    c10d_store_retain(s);
    if (c10d__store_call(s, &q, deleted, s) != 0)
        c10d_store_release(s);
}

/* 1 if `key` (under a namespace) is a key of this file's that nobody will
 * read again: an earlier generation's (any but `gen`), an answer, an ask
 * below the rank's last ack (last_ack NULL: an earlier attempt, whose asks
 * all stay). The counters and last acks stay, so tickets only grow and the
 * next rank 0 finds each rank's last ticket at once; keys that are not this
 * file's (a PyTorch job's "default_pg/..." under the same "/worker/attempt_N")
 * are never touched. */
static int is_garbage(const char *key, int64_t gen, const int64_t *last_ack, int world_size)
{
    long long m, t;
    int r, used = 0;
    if (sscanf(key, "gen_%lld/%n", &m, &used) == 1 && used > 0)
        return m != gen;
    if (strncmp(key, "c10d_answer/", 12) == 0)
        return 1;
    if (last_ack != NULL && strncmp(key, "c10d_ask/", 9) == 0 &&
        sscanf(key + 9, "%d/%lld%n", &r, &t, &used) == 2 && key[9 + used] == '\0')
        return r > 0 && r < world_size && t < last_ack[r];
    return 0;
}

static size_t delete_garbage(c10d_store *ns, int64_t gen, const int64_t *last_ack, int world_size)
{
    char **keys = NULL;
    size_t n = 0, dropped = 0;
    if (c10d_store_list_keys_sync(ns, &keys, &n) != 0) {
        C10D_DEBUG("rendezvous", "cannot list keys (%s): earlier generations stay",
                   c10d_last_error());
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        if (is_garbage(keys[i], gen, last_ack, world_size)) {
            delete_later(ns, keys[i]);
            dropped++;
        }
        free(keys[i]);
    }
    free(keys);
    return dropped;
}

/* Earlier generations in this namespace and everything of the earlier
 * attempts of this run: nobody reads them any more. Stores without
 * LIST_KEYS (PyTorch's) keep them. */
static void sweep_earlier(c10d_store *base, c10d_store *ns, const char *ns_name, int attempt,
                          int64_t gen, const int64_t *last_ack, int world_size)
{
    size_t dropped = delete_garbage(ns, gen, last_ack, world_size);
    for (int a = attempt - 1; a >= 0 && a >= attempt - ATTEMPTS_SWEPT; a--) {
        char name[200];
        attempt_namespace(name, sizeof name, a);
        c10d_store *old = NULL;
        if (c10d_store_prefix(base, name, &old) != 0)
            break;
        dropped += delete_garbage(old, 0, NULL, world_size);
        c10d_store_release(old);
    }
    if (dropped > 0)
        C10D_DEBUG("rendezvous", "%s: deleting %zu keys of earlier generations and attempts",
                   ns_name, dropped);
}

/* ----------------------------------------------------------------- entry */

int c10d__attempt_store(c10d_store *base, int rank, int world_size, int shared, int64_t timeout_ms,
                        c10d_store **out)
{
    *out = NULL;
    if (!shared)
        return c10d_store_prefix(base, "default_pg", out);
    uint64_t deadline = c10d__now_ms() + (uint64_t)timeout_ms;
    int attempt = restart_count();
    char ns_name[200];
    attempt_namespace(ns_name, sizeof ns_name, attempt);
    c10d_store *ns = NULL;
    C10D_CHECK(c10d_store_prefix(base, ns_name, &ns));
    int64_t gen = 0;
    int rc = 0;
    if (rank != 0) {
        rc = ask_generation(ns, rank, deadline, &gen);
    } else {
        int64_t *last_ack = calloc((size_t)world_size, sizeof *last_ack);
        rc = last_ack != NULL ? c10d_store_add_sync(ns, GENERATION_KEY, 1, &gen)
                              : c10d__fail(C10D_ENOMEM, "out of memory");
        for (int r = 1; r < world_size && rc == 0; r++)
            rc = answer_rank(ns, r, gen, deadline, 0, &last_ack[r]);
        for (int r = 1; r < world_size && rc == 0; r++)
            rc = answer_rank(ns, r, gen, deadline, 1, &last_ack[r]);
        if (rc == 0)
            sweep_earlier(base, ns, ns_name, attempt, gen, last_ack, world_size);
        free(last_ack);
    }
    if (rc == 0) {
        char prefix[260];
        snprintf(prefix, sizeof prefix, "%s/gen_%" PRId64 "/default_pg", ns_name, gen);
        C10D_DEBUG("rendezvous", "rank %d: keys under %s", rank, prefix);
        rc = c10d_store_prefix(base, prefix, out);
    } else {
        char why[700];
        snprintf(why, sizeof why, "%s", c10d_last_error());
        rc = c10d__fail(rc, "agreeing on this job's key namespace under %s: %s", ns_name, why);
    }
    c10d_store_release(ns);
    return rc;
}
