/* A live group inspected and adjusted from any thread, without running an
 * op: its error, its timeout, its store, the path its host backend took,
 * and a hook on every op's completion (pg_ops.c calls it). */
#include "pg.h"

#include "engine/error.h"

#include <stdlib.h>

int c10d_pg_error(c10d_pg *pg)
{
    if (pg == NULL)
        return c10d__fail(C10D_EINVAL, "c10d_pg_error: pg is NULL");
    /* Under the lock: a live group's backend states stay until a close, which
     * marks the group closed under this lock first. */
    uv_mutex_lock(&pg->mutex);
    int rc = c10d__pg_cause_locked(pg);
    uv_mutex_unlock(&pg->mutex);
    return rc;
}

int c10d_pg_failed_ranks(c10d_pg *pg, int *ranks, int cap)
{
    if (pg == NULL || cap < 0 || (ranks == NULL && cap > 0))
        return c10d__fail(C10D_EINVAL, "c10d_pg_failed_ranks: %s",
                          pg == NULL ? "pg is NULL"
                          : cap < 0  ? "cap is negative"
                                     : "ranks is NULL");
    if (pg->size <= 0)
        return 0;
    int *seen = calloc((size_t)pg->size, sizeof *seen),
        *got = malloc((size_t)pg->size * sizeof *got);
    if (seen == NULL || got == NULL) {
        free(seen);
        free(got);
        return c10d__fail(C10D_ENOMEM, "c10d_pg_failed_ranks: out of memory");
    }
    int n = 0;
    uv_mutex_lock(&pg->mutex);
    /* Device and host backends may both have seen a loss: each rank once. */
    for (int d = 0; pg->state == C10D_PG_LIVE && pg->ended_by == NULL && d < C10D__PG_NDEV; d++) {
        const struct c10d__pg_backend *b = &pg->backends[d];
        int k = b->state != NULL && b->vt->failed_ranks != NULL
                    ? b->vt->failed_ranks(b->state, got, pg->size)
                    : 0;
        for (int i = 0; i < k && i < pg->size; i++) {
            if (got[i] < 0 || got[i] >= pg->size || seen[got[i]]++)
                continue;
            if (n < cap)
                ranks[n] = got[i];
            n++;
        }
    }
    uv_mutex_unlock(&pg->mutex);
    free(seen);
    free(got);
    return n;
}

int c10d_pg_set_timeout(c10d_pg *pg, int64_t timeout_ms)
{
    if (pg == NULL || timeout_ms <= 0)
        return c10d__fail(C10D_EINVAL, "c10d_pg_set_timeout: %s",
                          pg == NULL ? "pg is NULL" : "timeout_ms must be > 0");
    pg->timeout_ms = timeout_ms;
    return 0;
}

int c10d_pg_store(c10d_pg *pg, c10d_store **out)
{
    if (out != NULL)
        *out = NULL;
    if (pg == NULL || out == NULL)
        return c10d__fail(C10D_EINVAL, "c10d_pg_store: %s is NULL", pg == NULL ? "pg" : "out");
    if (pg->store == NULL)
        return c10d__fail(C10D_ENOTFOUND, "c10d_pg_store: process group %s has no store here%s",
                          pg->name, pg->rank < 0 ? " (this rank is not a member)" : "");
    c10d_store_retain(pg->store);
    *out = pg->store;
    return 0;
}

const char *c10d_pg_host_path(const c10d_pg *pg)
{
    return pg != NULL ? pg->host_path : NULL;
}

int c10d_pg_register_completion_hook(c10d_pg *pg, c10d_pg_completion_hook hook, void *arg)
{
    if (pg == NULL || hook == NULL)
        return c10d__fail(C10D_EINVAL, "c10d_pg_register_completion_hook: %s is NULL",
                          pg == NULL ? "pg" : "hook");
    uv_mutex_lock(&pg->mutex);
    int taken = pg->completion_hook != NULL;
    if (!taken) {
        pg->completion_hook = hook;
        pg->completion_arg = arg;
        atomic_store(&pg->has_completion_hook, 1);
    }
    uv_mutex_unlock(&pg->mutex);
    if (taken)
        return c10d__fail(C10D_EINVAL,
                          "c10d_pg_register_completion_hook: process group %s already has a "
                          "completion hook",
                          pg->name);
    return 0;
}

int c10d_pg_bound_device(const c10d_pg *pg)
{
    return pg != NULL && pg->rank >= 0 ? pg->device_index : -1;
}

int c10d_pg_supports(const c10d_pg *pg, c10d_capability cap)
{
    if (pg == NULL || (int)cap < 0 || cap >= C10D_CAP_COUNT)
        return c10d__fail(C10D_EINVAL, "c10d_pg_supports: %s",
                          pg == NULL ? "pg is NULL" : "unknown capability");
    const struct c10d__backend_vtable *host = pg->backends[C10D_DEVICE_CPU].vt;
    const struct c10d__backend_vtable *cuda = pg->backends[C10D_DEVICE_CUDA].vt;
    switch (cap) {
    case C10D_CAP_HOST:
        return host != NULL;
    case C10D_CAP_CUDA:
        return cuda != NULL;
    case C10D_CAP_COALESCING:
        return host != NULL || cuda != NULL;
    default: {
        /* Native split / shrink: every backend the group has must make it. */
        int any = 0, all = 1;
        for (int d = 0; d < C10D__PG_NDEV; d++) {
            const struct c10d__backend_vtable *vt = pg->backends[d].vt;
            if (vt == NULL)
                continue;
            any = 1;
            all &= (cap == C10D_CAP_SPLIT ? vt->split != NULL : vt->shrink != NULL);
        }
        return any && all;
    }
    }
}
