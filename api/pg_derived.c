/* Collectives built from other ops, as torch builds them where a backend has
 * no primitive: all_gather with a size per rank as the list form of
 * all_to_all (each rank sends the same block to every rank); the list forms
 * of gather and scatter as one batch of send/recv (the root's own block
 * included: a batch may send to self). Every backend runs those. */
#include "pg.h"

#include "engine/error.h"

#include <stdint.h>
#include <stdlib.h>

int c10d_all_gather_v(c10d_pg *pg, const void *send, void *recv, const size_t *counts,
                      c10d_dtype dtype, const c10d_op_opts *opts, c10d_work **work)
{
    if (work != NULL)
        *work = NULL;
    if (pg == NULL)
        return c10d__fail(C10D_EINVAL, "c10d all_gather_v: pg is NULL");
    int n = pg->size, me = pg->rank;
    if (me < 0) /* not a member: the all_to_all says so, and does nothing */
        return c10d_all_to_all(pg, NULL, NULL, NULL, NULL, dtype, opts, work);
    if (counts == NULL)
        return c10d__fail(C10D_EINVAL,
                          "%s all_gather_v: counts is NULL (expected %d, one per rank)",
                          pg->backend_name, n);
    size_t esz = c10d_dtype_size(dtype);
    if (esz == 0)
        return c10d__fail(C10D_EINVAL, "%s all_gather_v: invalid dtype %d", pg->backend_name,
                          (int)dtype);
    const void **sends = malloc((size_t)n * sizeof *sends);
    void **recvs = malloc((size_t)n * sizeof *recvs);
    size_t *send_counts = malloc((size_t)n * sizeof *send_counts);
    if (sends == NULL || recvs == NULL || send_counts == NULL) {
        free(sends), free(recvs), free(send_counts);
        return c10d__fail(C10D_ENOMEM, "%s all_gather_v: out of memory", pg->backend_name);
    }
    size_t off = 0;
    int rc = 0;
    for (int r = 0; r < n; r++) {
        sends[r] = send;
        send_counts[r] = counts[me];
        recvs[r] = recv != NULL ? (char *)recv + off * esz : NULL;
        if (counts[r] > (SIZE_MAX / esz) - off) {
            rc = c10d__fail(C10D_EINVAL, "%s all_gather_v: counts overflow at index %d",
                            pg->backend_name, r);
            break;
        }
        off += counts[r];
    }
    /* The call copies the lists: they are ours to free at once. */
    if (rc == 0)
        rc = c10d_all_to_all(pg, (const void *const *)sends, send_counts, (void *const *)recvs,
                             counts, dtype, opts, work);
    free(sends), free(recvs), free(send_counts);
    return rc;
}

/* The root's half of a list gather or scatter: one op per rank, self included. */
static int rooted_batch(c10d_pg *pg, const char *opname, c10d_p2p_kind kind, void *const *bufs,
                        const void *own, size_t count, c10d_dtype dtype, int root,
                        const c10d_op_opts *opts, c10d_work **work)
{
    int n = pg->size, me = pg->rank;
    if (root < 0 || root >= n)
        return c10d__fail(C10D_EINVAL, "%s %s: invalid root rank %d (group size %d)",
                          pg->backend_name, opname, root, n);
    if (me != root) {
        c10d_p2p_op op = {kind == C10D_P2P_RECV ? C10D_P2P_SEND : C10D_P2P_RECV,
                          (void *)own,
                          count,
                          dtype,
                          root,
                          0};
        return c10d_batch_isend_irecv(pg, &op, 1, opts, work);
    }
    if (bufs == NULL)
        return c10d__fail(C10D_EINVAL, "%s %s: the root's list is NULL (expected %d buffers)",
                          pg->backend_name, opname, n);
    c10d_p2p_op *ops = calloc((size_t)n + 1, sizeof *ops);
    if (ops == NULL)
        return c10d__fail(C10D_ENOMEM, "%s %s: out of memory", pg->backend_name, opname);
    int k = 0;
    for (int r = 0; r < n; r++)
        ops[k++] = (c10d_p2p_op){kind, bufs[r], count, dtype, r, 0};
    /* The root's own block: the other half of its op to itself. */
    ops[k++] = (c10d_p2p_op){
        kind == C10D_P2P_RECV ? C10D_P2P_SEND : C10D_P2P_RECV, (void *)own, count, dtype, root, 0};
    int rc = c10d_batch_isend_irecv(pg, ops, k, opts, work);
    free(ops);
    return rc;
}

int c10d_gather_list(c10d_pg *pg, const void *send, void *const *recvs, size_t count,
                     c10d_dtype dtype, int root, const c10d_op_opts *opts, c10d_work **work)
{
    if (work != NULL)
        *work = NULL;
    if (pg == NULL)
        return c10d__fail(C10D_EINVAL, "c10d gather_list: pg is NULL");
    if (pg->rank < 0)
        return c10d_batch_isend_irecv(pg, NULL, 0, opts, work);
    return rooted_batch(pg, "gather_list", C10D_P2P_RECV, recvs, send, count, dtype, root, opts,
                        work);
}

int c10d_scatter_list(c10d_pg *pg, const void *const *sends, void *recv, size_t count,
                      c10d_dtype dtype, int root, const c10d_op_opts *opts, c10d_work **work)
{
    if (work != NULL)
        *work = NULL;
    if (pg == NULL)
        return c10d__fail(C10D_EINVAL, "c10d scatter_list: pg is NULL");
    if (pg->rank < 0)
        return c10d_batch_isend_irecv(pg, NULL, 0, opts, work);
    return rooted_batch(pg, "scatter_list", C10D_P2P_SEND, (void *const *)sends, recv, count, dtype,
                        root, opts, work);
}
