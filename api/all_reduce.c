/* c10d_all_reduce. Its common case, host buffers with the common options, is
 * what small ops on one host pay per call for: dispatch's checks made for this kind,
 * and the op written once, into its record, where dispatch copies it
 * through a generic form. The checks are the same ones: a call that any of
 * them would refuse, or that needs more than this path does (device
 * buffers, complex dtypes, C10D_DEBUG=DETAIL, options of another size),
 * goes to dispatch, which refuses it with its own message or runs it. */
#include "pg.h"

#include "engine/kernels/reduce.h"

#include <math.h>

/* The options this path reads in place: the first version and
 * premul_factor_dev. A field added to c10d_op_opts must be handled here. */
_Static_assert(C10D__OP_OPTS_V1_SIZE + sizeof(void *) == sizeof(c10d_op_opts),
               "c10d_op_opts grew: teach all_reduce.c's express its new field");

/* 1 if it took the call (its result in *rc), 0 for dispatch to. */
static int express(c10d_pg *pg, const void *send, void *recv, size_t count, c10d_dtype dtype,
                   c10d_reduce_op redop, const c10d_op_opts *opts, c10d_work **work, int *rc)
{
    if (pg == NULL || pg->rank < 0 || (unsigned)dtype >= C10D_DTYPE_COUNT ||
        (unsigned)redop >= C10D_REDUCE_OP_COUNT || count == 0 || recv == NULL ||
        count > SIZE_MAX / 16 / (size_t)pg->size)
        return 0;
    /* A struct_size of 0 reads as the first version's, which ends before
     * premul_factor_dev (that field is then NULL). */
    if (opts != NULL &&
        ((opts->struct_size != sizeof *opts && opts->struct_size != 0) || opts->timeout_ms < 0 ||
         opts->device_type != C10D_DEVICE_CPU || opts->device_index < 0 ||
         (opts->struct_size != 0 && opts->premul_factor_dev != NULL)))
        return 0;
    size_t per;
    c10d__dtype_real(dtype, &per);
    double factor = opts != NULL ? opts->premul_factor : 0.0;
    const struct c10d__backend_vtable *vt = pg->backends[0].vt;
    if (per != 1 || vt == NULL || c10d_reduce_op_check(redop, dtype) != 0 ||
        (redop == C10D_PREMUL_SUM && !isfinite(factor)) || c10d__pg_detail_enabled())
        return 0;
    struct c10d__pg_op *po = c10d__pg_op_new(pg, 0, 0);
    if (po == NULL)
        return 0; /* dispatch meets it too, and says so */
    struct c10d__op *op = &po->op;
    op->kind = C10D_OP_ALL_REDUCE;
    op->send = send != NULL ? send : recv;
    op->recv = recv;
    op->count = count;
    op->dtype = dtype;
    op->redop = redop;
    op->premul_factor = factor;
    op->root = -1;
    op->peer = -1;
    op->device_type = C10D_DEVICE_CPU;
    if (opts != NULL) {
        op->device_index = opts->device_index;
        op->stream = opts->stream;
    }
    if (vt->check != NULL && vt->check(op) != 0) {
        c10d__pg_op_free(po);
        return 0;
    }
    if (work != NULL)
        *work = NULL;
    *rc = c10d__pg_submit(pg, "all_reduce", po, opts, work);
    return 1;
}

int c10d_all_reduce(c10d_pg *pg, const void *send, void *recv, size_t count, c10d_dtype dtype,
                    c10d_reduce_op redop, const c10d_op_opts *opts, c10d_work **work)
{
    int rc;
    if (express(pg, send, recv, count, dtype, redop, opts, work, &rc))
        return rc;
    struct c10d__op op = c10d__pg_op_init(C10D_OP_ALL_REDUCE, count, dtype);
    op.send = send != NULL ? send : recv;
    op.recv = recv;
    op.redop = redop;
    return c10d__pg_dispatch(pg, "all_reduce", &op, 0, opts, work);
}
