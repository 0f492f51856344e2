/* Collectives built from other ops, as torch builds them where a backend has
 * no primitive: all_gather with a size per rank as the list form of
 * all_to_all (each rank sends the same block to every rank); the list forms
 * of gather and scatter as one batch of send/recv (the root's own block
 * included: a batch may send to self); reduce_scatter with a size per rank
 * (host buffers) as all_to_all into a scratch buffer, then each rank reduces
 * the blocks it received, in rank order. Every backend runs those. A backend
 * that takes the uneven forms itself (nccl: grouped broadcasts / reduces)
 * gets all_gather_v and reduce_scatter_v as one op of their own. */
#include "pg.h"

#include "engine/error.h"
#include "engine/kernels/reduce.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Whether the backend of the buffers' device takes the uneven forms (a
 * negative status: the options are invalid). */
static int native_uneven(c10d_pg *pg, const char *opname, const c10d_op_opts *opts)
{
    c10d_op_opts o;
    C10D_CHECK(c10d__pg_read_op_opts(pg, opname, opts, &o));
    int dev = o.device_type == C10D_DEVICE_CUDA ? 1 : 0;
    return pg->backends[dev].vt != NULL && pg->backends[dev].vt->uneven;
}

/* The uneven form as one op: this rank's block is counts[rank] elements. */
static int uneven_op(c10d_pg *pg, const char *opname, enum c10d__op_kind kind, const void *send,
                     void *recv, const size_t *counts, c10d_dtype dtype, c10d_reduce_op redop,
                     const c10d_op_opts *opts, c10d_work **work)
{
    struct c10d__op op = c10d__pg_op_init(kind, counts[pg->rank], dtype);
    op.send = send;
    op.recv = recv;
    op.redop = redop;
    if (kind == C10D_OP_ALL_GATHER)
        op.recv_counts = counts;
    else
        op.send_counts = counts;
    return c10d__pg_dispatch(pg, opname, &op, 0, opts, work);
}

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
    int native = native_uneven(pg, "all_gather_v", opts);
    if (native < 0)
        return native;
    if (native)
        return uneven_op(pg, "all_gather_v", C10D_OP_ALL_GATHER, send, recv, counts, dtype,
                         C10D_SUM, opts, work);
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

/* After the all_to_all of reduce_scatter_v: block j of the scratch is rank
 * j's contribution to ours. */
struct rs_v {
    char *tmp;
    void *recv;
    size_t count; /* ours */
    int nranks;
    c10d_dtype dtype;
    c10d_reduce_op op;
    double premul;
};

static int rs_v_reduce(c10d_work *parent, int status, c10d_work *child, void *arg)
{
    (void)parent;
    (void)child;
    struct rs_v *r = arg;
    size_t bytes = r->count * c10d_dtype_size(r->dtype);
    int rc = status;
    for (int j = 0; rc == 0 && j < r->nranks && r->count > 0; j++) {
        char *block = r->tmp + (size_t)j * bytes;
        if (r->op == C10D_PREMUL_SUM)
            rc = c10d__reduce_premul(block, r->count, r->dtype, r->premul);
        if (rc == 0 && j == 0)
            memcpy(r->recv, block, bytes);
        else if (rc == 0)
            rc = c10d__reduce(r->recv, block, r->count, r->dtype, r->op);
    }
    if (rc == 0 && r->count > 0)
        rc = c10d__reduce_finish(r->recv, r->count, r->dtype, r->op, r->nranks);
    free(r->tmp);
    free(r);
    return rc;
}

int c10d_reduce_scatter_v(c10d_pg *pg, const void *send, void *recv, const size_t *counts,
                          c10d_dtype dtype, c10d_reduce_op op, const c10d_op_opts *opts,
                          c10d_work **work)
{
    if (work != NULL)
        *work = NULL;
    if (pg == NULL)
        return c10d__fail(C10D_EINVAL, "c10d reduce_scatter_v: pg is NULL");
    int n = pg->size, me = pg->rank;
    if (me < 0)
        return c10d_all_to_all(pg, NULL, NULL, NULL, NULL, dtype, opts, work);
    if (counts == NULL)
        return c10d__fail(C10D_EINVAL,
                          "%s reduce_scatter_v: counts is NULL (expected %d, one per rank)",
                          pg->backend_name, n);
    int native = native_uneven(pg, "reduce_scatter_v", opts);
    if (native < 0)
        return native;
    if (native)
        return uneven_op(pg, "reduce_scatter_v", C10D_OP_REDUCE_SCATTER, send, recv, counts, dtype,
                         op, opts, work);
    c10d_op_opts o; /* read as the struct_size rule says */
    C10D_CHECK(c10d__pg_read_op_opts(pg, "reduce_scatter_v", opts, &o));
    if (o.device_type != C10D_DEVICE_CPU)
        return c10d__fail(C10D_EUNSUPPORTED,
                          "%s reduce_scatter_v: CUDA buffers need the nccl backend (this one "
                          "reduces on the host); reduce_scatter takes CUDA buffers of equal "
                          "counts",
                          pg->backend_name);
    if (op == C10D_PREMUL_SUM && o.premul_factor_dev != NULL)
        return c10d__fail(C10D_EINVAL,
                          "%s reduce_scatter_v: opts.premul_factor_dev is a device pointer, for "
                          "CUDA buffers on nccl: host buffers take the factor in "
                          "opts.premul_factor",
                          pg->backend_name);
    C10D_CHECK(c10d_reduce_op_check(op, dtype));
    size_t esz = c10d_dtype_size(dtype), mine = counts[me], scratch;
    if (__builtin_mul_overflow(mine, (size_t)n * esz, &scratch))
        return c10d__fail(C10D_EINVAL, "%s reduce_scatter_v: counts[%d] = %zu is too large",
                          pg->backend_name, me, mine);
    struct rs_v *r = calloc(1, sizeof *r);
    const void **sends = malloc((size_t)n * sizeof *sends);
    void **recvs = malloc((size_t)n * sizeof *recvs);
    size_t *recv_counts = malloc((size_t)n * sizeof *recv_counts);
    char *tmp = malloc(scratch > 0 ? scratch : 1);
    int rc = r != NULL && sends != NULL && recvs != NULL && recv_counts != NULL && tmp != NULL
                 ? 0
                 : c10d__fail(C10D_ENOMEM, "%s reduce_scatter_v: out of memory", pg->backend_name);
    size_t off = 0;
    for (int j = 0; rc == 0 && j < n; j++) {
        sends[j] = send != NULL ? (const char *)send + off * esz : NULL;
        recvs[j] = tmp + (size_t)j * mine * esz;
        recv_counts[j] = mine;
        if (counts[j] > SIZE_MAX / esz - off)
            rc = c10d__fail(C10D_EINVAL, "%s reduce_scatter_v: counts overflow at index %d",
                            pg->backend_name, j);
        off += counts[j];
    }
    c10d_work *exchanged = NULL;
    if (rc == 0) {
        /* The caller's callback belongs to the reduced result, not the exchange. */
        c10d_op_opts xo = o;
        xo.cb = NULL;
        xo.cb_arg = NULL;
        rc = c10d_all_to_all(pg, (const void *const *)sends, counts, (void *const *)recvs,
                             recv_counts, dtype, &xo, &exchanged);
    }
    free(sends), free(recvs), free(recv_counts);
    if (rc != 0) {
        free(tmp);
        free(r);
        return rc;
    }
    *r = (struct rs_v){tmp, recv, mine, n, dtype, op, o.premul_factor};
    c10d_work *done = NULL;
    rc = c10d_work_then(exchanged, rs_v_reduce, r, &done);
    if (rc != 0) {
        /* Not registered: the exchange goes on into tmp, which must outlive it. */
        c10d_work_wait(exchanged, -1);
        free(tmp);
        free(r);
    }
    c10d_work_release(exchanged);
    if (rc != 0)
        return rc;
    if (o.cb != NULL && (rc = c10d_work_on_complete(done, o.cb, o.cb_arg)) != 0) {
        c10d_work_release(done);
        return rc;
    }
    if (work != NULL)
        *work = done;
    else
        c10d_work_release(done);
    return 0;
}
