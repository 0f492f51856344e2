/* C10D_DEBUG=DETAIL (torch's TORCH_DISTRIBUTED_DEBUG=DETAIL): before each
 * collective every rank publishes the op's fingerprint in the group's store
 * and compares it with every other rank's, so ranks that call a collective
 * differently fail that call, every one of them, before any byte moves.
 *
 * The tcp backend catches most mismatches for free from the fingerprints its
 * frames carry; this catches the rest (ranks that exchange nothing for the
 * op, a root whose part is send-only) and covers backends whose wire carries
 * none (nccl). It costs a store round trip and a wait for the slowest rank
 * per collective, and blocks the calling thread for them, as torch's check
 * does: a debugging mode. */
#include "pg.h"

#include "backends/fingerprint.h"
#include "engine/env.h"
#include "engine/error.h"
#include "engine/log.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Asked on every collective: parsed once per environment load, not under
 * the environment table's lock each time. */
static atomic_uint detail_seen; /* generation << 1 | enabled; 0: never read */

int c10d__pg_detail_enabled(void)
{
    unsigned gen = c10d__env_generation();
    unsigned seen = atomic_load_explicit(&detail_seen, memory_order_relaxed);
    if (seen >> 1 != gen) {
        seen = gen << 1 | (strcasecmp(c10d__env_str(C10D_ENV_DEBUG), "DETAIL") == 0);
        atomic_store_explicit(&detail_seen, seen, memory_order_relaxed);
    }
    return (int)(seen & 1);
}

/* While the ranks gather: a group whose backend already failed (a peer
 * died, its connection lost) will never see them all, and the op would fail
 * on that error anyway, as it does without the check. */
static int group_failed(void *arg)
{
    c10d_pg *pg = arg;
    for (int d = 0; d < C10D__PG_NDEV; d++) {
        const struct c10d__pg_backend *b = &pg->backends[d];
        char msg[1024];
        int status =
            b->vt && b->vt->failure && b->state ? b->vt->failure(b->state, msg, sizeof msg) : 0;
        if (status != 0)
            return c10d__fail(status, "%s", msg);
    }
    return 0;
}

int c10d__pg_detail_check(c10d_pg *pg, const char *opname, const struct c10d__op *op,
                          int64_t timeout_ms, int *fatal)
{
    *fatal = 0;
    if (pg->store == NULL || pg->size < 2)
        return 0;
    if (c10d_on_loop_thread()) {
        static atomic_int warned;
        if (atomic_exchange(&warned, 1) == 0) {
            C10D_WARN("pg", "C10D_DEBUG=DETAIL: collectives called from a completion callback "
                            "are not checked (the check would block the loop)");
        }
        return 0;
    }
    /* The number this op will take: the check assumes, as torch's does, that
     * one thread at a time submits to a group. */
    uv_mutex_lock(&pg->mutex);
    uint64_t seq = pg->coll_seq + 1;
    int coalescing = pg->coalescing;
    /* Keys are per check, not per sequence number: a call this check
     * rejects takes no number, so the next call has the same one, and must
     * not read the rejected call's keys. Every rank rejects the same calls
     * (any difference is seen by every rank), so rounds stay in step. */
    uint64_t round = coalescing ? 0 : ++pg->detail_round;
    uv_mutex_unlock(&pg->mutex);
    if (coalescing)
        return 0; /* members of a list may differ, as in torch */
    struct c10d__fp mine;
    c10d__fp_of(op, pg->size, &mine);
    char prefix[48];
    snprintf(prefix, sizeof prefix, "detail/%llu", (unsigned long long)round);
    int n = pg->size;
    struct c10d__pg_exchanged got;
    int rc = c10d__pg_store_exchange(pg->store, prefix, pg->rank, n, &mine, sizeof mine, timeout_ms,
                                     group_failed, pg, &got);
    if (rc == C10D_ETIMEDOUT) {
        rc = c10d__fail(rc,
                        "%s %s: C10D_DEBUG=DETAIL: not every rank reached collective "
                        "SeqNum=%llu within %lld ms: %s",
                        pg->backend_name, opname, (unsigned long long)seq, (long long)timeout_ms,
                        c10d_last_error());
    } else if (rc != 0) {
        rc = c10d__fail(rc,
                        "%s %s: C10D_DEBUG=DETAIL: collective SeqNum=%llu not checked, the ranks "
                        "could not gather: %s",
                        pg->backend_name, opname, (unsigned long long)seq, c10d_last_error());
    }
    if (rc != 0) {
        /* A rank that comes later finds this round's keys complete and runs
         * its op alone: the ranks are out of step from here, so the group
         * fails, as it would on an op's timeout. */
        *fatal = 1;
        goto out;
    }
    for (int r = 0; r < n; r++) {
        struct c10d__fp theirs;
        if (got.lens[r] != sizeof theirs) {
            rc = c10d__fail(C10D_EPROTO,
                            "%s %s: C10D_DEBUG=DETAIL: rank %d's fingerprint has %zu bytes",
                            pg->backend_name, opname, r, got.lens[r]);
            goto out;
        }
        memcpy(&theirs, got.values[r], sizeof theirs);
        if (!c10d__fp_equal(&mine, &theirs)) {
            char msg[1024];
            c10d__fp_mismatch_message(msg, sizeof msg, seq, 0, pg->rank, &mine, r, &theirs);
            rc = c10d__fail(C10D_EINVAL, "%s %s: %s", pg->backend_name, opname, msg);
            goto out;
        }
    }
    /* Every rank has published this round, so every rank has read the
     * previous round's keys: this rank's key of the round before that is
     * read by nobody any more. */
    if (round > 2) {
        snprintf(prefix, sizeof prefix, "detail/%llu", (unsigned long long)(round - 2));
        c10d__pg_store_forget(pg->store, prefix, pg->rank);
    }
out:
    c10d__pg_exchanged_free(&got);
    return rc;
}
