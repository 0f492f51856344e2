/* The blocking forms: async call, then a wait bounded by the work's own
 * deadline (every op of a group has one). */
#include "pg.h"

#include "engine/error.h"

int c10d_work_wait_release(c10d_work *work)
{
    if (work == NULL)
        return c10d__fail(C10D_EINVAL, "c10d_work_wait_release: work is NULL");
    int rc = c10d_work_wait(work, -1);
    c10d_work_release(work);
    return rc;
}

/* The body of every *_sync helper. A non-member gets an already completed
 * work back; a NULL work (nothing to wait for) counts as done. */
static int finish(int rc, c10d_work *w)
{
    if (rc != 0)
        return rc;
    return w != NULL ? c10d_work_wait_release(w) : 0;
}

int c10d_all_reduce_sync(c10d_pg *pg, const void *send, void *recv, size_t count, c10d_dtype dtype,
                         c10d_reduce_op op)
{
    /* The blocking form has no options, so no factor: refuse rather than
     * scale by zero. */
    if (op == C10D_PREMUL_SUM)
        return c10d__fail(C10D_EINVAL,
                          "c10d_all_reduce_sync: C10D_PREMUL_SUM needs a factor "
                          "(c10d_op_opts.premul_factor); use c10d_all_reduce");
    c10d_work *w = NULL;
    int rc = c10d_all_reduce(pg, send, recv, count, dtype, op, NULL, &w);
    return finish(rc, w);
}

int c10d_broadcast_sync(c10d_pg *pg, const void *send, void *recv, size_t count, c10d_dtype dtype,
                        int root)
{
    c10d_work *w = NULL;
    int rc = c10d_broadcast(pg, send, recv, count, dtype, root, NULL, &w);
    return finish(rc, w);
}

int c10d_barrier_sync(c10d_pg *pg)
{
    c10d_work *w = NULL;
    int rc = c10d_barrier(pg, NULL, &w);
    return finish(rc, w);
}
