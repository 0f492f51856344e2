/* Settings that change what goes on the wire must be the same on every rank:
 * a rank with another all_reduce threshold (C10D_TCP_RD_MAX) runs another
 * algorithm than its peers and waits for messages that never come; one with
 * C10D_TCP_LAZY_INIT waits for connections the others never open; one with
 * C10D_DEBUG=DETAIL waits in a store exchange the others skip. Each of these
 * would hang until the group's timeout (30 minutes by default) and then
 * report a generic watchdog timeout, so the default group compares them
 * once, at creation, before its backends start.
 *
 * Rank 0 publishes its values; every other rank reads them, and a rank that
 * differs leaves a description of the difference; then all meet in a store
 * barrier, after which every rank looks for such a description and fails
 * with it. O(N) store traffic: no rank reads more than rank 0's values. */
#include "pg.h"

#include "engine/env.h"
#include "engine/error.h"
#include "engine/log.h"
#include "store_server/client/store.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Under "c10d_settings/<n>/", n counting this process's checks: a default
 * group made again in the same job (init, destroy, init) meets a store
 * (rank 0's, alive until c10d_shutdown) that holds the first check's keys,
 * its barrier passed among them. Every rank counts the same checks: one
 * runs only after a rendezvous that every rank got through. */
#define SETTINGS_KEY "rank0"
#define MISMATCH_KEY "mismatch"
#define TOLD_KEY     "told"
#define ALL_TOLD_KEY "all_told"
#define BARRIER_NAME "settings"
#define TOLD_WAIT_MS 10000

/* The settings that change the wire protocol or the algorithm every rank
 * must agree on. Local tuning (spin times, socket buffers, staging memory,
 * log level) may differ freely. */
static const enum c10d__env_id must_match[] = {
    C10D_ENV_DEBUG,
    C10D_ENV_TCP_LAZY_INIT,
    C10D_ENV_TCP_EAGER_MAX,
    C10D_ENV_TCP_RD_MAX,
    C10D_ENV_TCP_RING_MIN,
    C10D_ENV_TCP_SEGMENT,
    C10D_ENV_TCP_CUDA_SEGMENT,
    C10D_ENV_NCCL_RANKS_PER_ROOT,
};
#define N_MUST_MATCH (sizeof must_match / sizeof must_match[0])

/* The value a setting has for the wire, as text: parsed, so that an unset
 * variable and one set to its default are the same. */
static void effective_value(enum c10d__env_id id, char *buf, size_t cap)
{
    switch (id) {
    case C10D_ENV_DEBUG:
        /* Only DETAIL adds store exchanges; OFF and INFO are alike on the wire. */
        snprintf(buf, cap, "%s",
                 strcasecmp(c10d__env_str(id), "DETAIL") == 0 ? "DETAIL" : "not DETAIL");
        break;
    case C10D_ENV_TCP_LAZY_INIT:
        if (strcasecmp(c10d__env_str(id), "auto") == 0)
            snprintf(buf, cap, "auto");
        else
            snprintf(buf, cap, "%d", c10d__env_bool(id));
        break;
    default:
        snprintf(buf, cap, "%" PRId64, c10d__env_int(id));
        break;
    }
}

/* "NAME=value\n" for every setting, in the table's order. */
static void describe_settings(char *buf, size_t cap)
{
    const struct c10d__env_var *table = c10d__env_table();
    size_t used = 0;
    buf[0] = 0;
    for (size_t i = 0; i < N_MUST_MATCH && used < cap; i++) {
        char v[64];
        effective_value(must_match[i], v, sizeof v);
        int n = snprintf(buf + used, cap - used, "%s=%s\n", table[must_match[i]].name, v);
        if (n > 0)
            used += (size_t)n;
    }
}

/* The value of `name` in a description, or NULL (written into `out`). */
static const char *find_value(const char *text, size_t len, const char *name, char *out, size_t cap)
{
    size_t nlen = strlen(name);
    const char *p = text, *end = text + len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *line_end = nl ? nl : end;
        if ((size_t)(line_end - p) > nlen && memcmp(p, name, nlen) == 0 && p[nlen] == '=') {
            size_t vlen = (size_t)(line_end - p) - nlen - 1;
            snprintf(out, cap, "%.*s", (int)vlen, p + nlen + 1);
            return out;
        }
        p = line_end + 1;
    }
    return NULL;
}

/* Every difference between rank 0's description and ours, or "" if none. */
static void compare_with_rank0(const char *theirs, size_t len, int rank, char *msg, size_t cap)
{
    const struct c10d__env_var *table = c10d__env_table();
    size_t used = 0;
    msg[0] = 0;
    for (size_t i = 0; i < N_MUST_MATCH; i++) {
        const char *name = table[must_match[i]].name;
        char mine[64], buf[64];
        effective_value(must_match[i], mine, sizeof mine);
        const char *v0 = find_value(theirs, len, name, buf, sizeof buf);
        if (v0 != NULL && strcmp(v0, mine) == 0)
            continue;
        const char *fallback = table[must_match[i]].fallback;
        int n = snprintf(msg + used, cap - used, "%s%s%s%s%s is %s on rank 0 but %s on rank %d",
                         used ? "; " : "", name, fallback ? " (or " : "", fallback ? fallback : "",
                         fallback ? ")" : "", v0 ? v0 : "unknown (an older libc10d)", mine, rank);
        if (n < 0 || (size_t)n >= cap - used)
            break;
        used += (size_t)n;
    }
}

/* Every rank fails; rank 0 may host the store and end the program as soon
 * as it returns, taking the store with it before the others have read why.
 * So the others report that they know, and rank 0 waits for that (bounded:
 * a rank that vanished must not keep rank 0 from reporting). */
static void see_everyone_told(c10d_store *store, int rank, int size, int64_t timeout_ms)
{
    if (rank != 0) {
        int64_t told = 0;
        if (c10d_store_add_sync(store, TOLD_KEY, 1, &told) == 0 && told == size - 1)
            c10d_store_set_sync(store, ALL_TOLD_KEY, "1", 1);
        return;
    }
    const char *keys[] = {ALL_TOLD_KEY};
    if (c10d_store_wait_sync(store, keys, 1, timeout_ms < TOLD_WAIT_MS ? timeout_ms : TOLD_WAIT_MS))
        C10D_WARN("pg", "not every rank confirmed it saw the settings mismatch: %s",
                  c10d_last_error());
}

static atomic_uint checks_made;

static int check_in(c10d_store *store, int rank, int size, int64_t timeout_ms);

int c10d__pg_settings_check(c10d_store *base, int rank, int size, int64_t timeout_ms)
{
    if (base == NULL || size <= 1)
        return 0;
    char prefix[64];
    snprintf(prefix, sizeof prefix, "c10d_settings/%u/", atomic_fetch_add(&checks_made, 1) + 1);
    c10d_store *store = NULL;
    C10D_CHECK(c10d_store_prefix(base, prefix, &store));
    int rc = check_in(store, rank, size, timeout_ms);
    c10d_store_release(store);
    return rc;
}

int c10d__pg_settings_check_in(c10d_store *store, int rank, int size, int64_t timeout_ms)
{
    return store == NULL || size <= 1 ? 0 : check_in(store, rank, size, timeout_ms);
}

static int check_in(c10d_store *store, int rank, int size, int64_t timeout_ms)
{
    char mine[1024], diff[1024] = "";
    describe_settings(mine, sizeof mine);
    if (rank == 0) {
        /* A store the caller gave us may hold an earlier job's verdict (a
         * store from the rendezvous is fresh or namespaced per attempt); the
         * others write theirs only after reading ours, so this goes first. */
        static const char *const stale[] = {MISMATCH_KEY, TOLD_KEY, ALL_TOLD_KEY};
        for (size_t i = 0; i < sizeof stale / sizeof stale[0]; i++)
            C10D_CHECK(c10d_store_delete_key_sync(store, stale[i], NULL));
        C10D_CHECK(c10d_store_set_sync(store, SETTINGS_KEY, mine, strlen(mine)));
    } else {
        void *theirs = NULL;
        size_t len = 0;
        C10D_CHECK(c10d__store_get_within_sync(store, SETTINGS_KEY, timeout_ms, &theirs, &len));
        compare_with_rank0(theirs, len, rank, diff, sizeof diff);
        free(theirs);
        if (diff[0]) /* for the ranks that agree with rank 0 to report */
            C10D_CHECK(c10d_store_set_sync(store, MISMATCH_KEY, diff, strlen(diff)));
    }
    C10D_CHECK(c10d__pg_store_barrier(store, BARRIER_NAME, size, timeout_ms));
    if (!diff[0]) {
        const char *keys[] = {MISMATCH_KEY};
        int found = 0;
        C10D_CHECK(c10d_store_check_sync(store, keys, 1, &found));
        if (found) {
            void *v = NULL;
            size_t len = 0;
            C10D_CHECK(c10d_store_get_sync(store, MISMATCH_KEY, &v, &len));
            snprintf(diff, sizeof diff, "%.*s", (int)len, (const char *)v);
            free(v);
        }
    }
    if (diff[0]) {
        see_everyone_told(store, rank, size, timeout_ms);
        return c10d__fail(C10D_EINVAL,
                          "settings that must match on every rank differ: %s (set them alike "
                          "on every rank, or unset them everywhere)",
                          diff);
    }
    C10D_DEBUG("pg", "wire settings agree on all %d ranks", size);
    return 0;
}
