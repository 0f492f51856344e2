/* Argument checks of every op (docs/semantics.md, 2), on the caller's
 * thread and before anything is numbered or sent: a rejected call leaves the
 * group as it was, so the next valid call still lines up on every rank.
 * Messages read "<backend> <op>: <what>", naming the offending index/value. */
#include "pg.h"

#include "engine/error.h"
#include "engine/kernels/reduce.h"
#include "engine/opts.h"

#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>

#define FAIL(pg, opname, ...) check_fail((pg), (opname), __VA_ARGS__)

static int check_fail(const c10d_pg *pg, const char *opname, const char *fmt, ...)
    C10D_PRINTF(3, 4);

static int check_fail(const c10d_pg *pg, const char *opname, const char *fmt, ...)
{
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return c10d__fail(C10D_EINVAL, "%s %s: %s", pg->backend_name, opname, what);
}

int c10d__pg_read_op_opts(const c10d_pg *pg, const char *opname, const c10d_op_opts *user,
                          c10d_op_opts *out)
{
    /* Every op comes here: the message is formatted only on failure. */
    if (c10d__opts_read(out, sizeof *out, C10D__OP_OPTS_V1_SIZE, user, NULL) != 0)
        return FAIL(pg, opname, "%s", c10d_last_error());
    const c10d_op_opts *opts = out;
    if (opts->timeout_ms < 0)
        return FAIL(pg, opname, "invalid timeout %lld ms (must be >= 0; 0 = the group's)",
                    (long long)opts->timeout_ms);
    if (opts->device_type != C10D_DEVICE_CPU && opts->device_type != C10D_DEVICE_CUDA)
        return FAIL(pg, opname, "invalid device type %d", (int)opts->device_type);
    if (opts->device_index < 0)
        return FAIL(pg, opname, "invalid device index %d", opts->device_index);
    return 0;
}

static int check_rank(const c10d_pg *pg, const char *opname, const char *what, int r)
{
    if (r < 0 || r >= pg->size)
        return FAIL(pg, opname, "invalid %s rank %d (group size %d)", what, r, pg->size);
    return 0;
}

/* A buffer may be NULL only when it holds no elements. */
static int check_buf(const c10d_pg *pg, const char *opname, const char *what, const void *p,
                     size_t count)
{
    if (p == NULL && count > 0)
        return FAIL(pg, opname, "%s buffer is NULL (expected %zu elements)", what, count);
    return 0;
}

static int check_list(const c10d_pg *pg, const char *opname, const char *what,
                      const void *const *list, const size_t *counts, size_t count, size_t esz)
{
    if (list == NULL)
        return FAIL(pg, opname, "%s list is NULL (expected %d buffers, one per rank)", what,
                    pg->size);
    for (int i = 0; i < pg->size; i++) {
        size_t n = counts != NULL ? counts[i] : count, bytes;
        if (__builtin_mul_overflow(n, esz, &bytes))
            return FAIL(pg, opname, "count %zu at index %d of %s is too large", n, i, what);
        if (list[i] == NULL && n > 0)
            return FAIL(pg, opname,
                        "invalid tensor at index %d of %s (NULL buffer for %zu elements)", i, what,
                        n);
    }
    return 0;
}

static int check_redop(const c10d_pg *pg, const char *opname, const struct c10d__op *op)
{
    if ((int)op->redop < 0 || op->redop >= C10D_REDUCE_OP_COUNT)
        return FAIL(pg, opname, "invalid reduce op %d", (int)op->redop);
    if (op->redop == C10D_PREMUL_SUM && op->premul_factor_dev != NULL &&
        op->device_type == C10D_DEVICE_CPU)
        return FAIL(pg, opname,
                    "opts.premul_factor_dev is a device pointer, for CUDA buffers on nccl: "
                    "host buffers take the factor in opts.premul_factor");
    if (op->redop == C10D_PREMUL_SUM && op->premul_factor_dev == NULL &&
        !isfinite(op->premul_factor))
        return FAIL(pg, opname, "PREMUL_SUM factor must be finite (got %g)", op->premul_factor);
    /* The host table applies to CPU buffers; a GPU backend has its own (check). */
    if (op->device_type == C10D_DEVICE_CPU && c10d_reduce_op_check(op->redop, op->dtype) != 0)
        return FAIL(pg, opname, "%s", c10d_last_error());
    return 0;
}

/* all_to_all_single: counts absent -> an even split of count; present ->
 * size entries, and send_counts must sum to count. */
static int check_splits(const c10d_pg *pg, const char *opname, const struct c10d__op *op)
{
    if (op->send_counts == NULL || op->recv_counts == NULL) {
        if (op->count % (size_t)pg->size != 0)
            return FAIL(pg, opname,
                        "count %zu is not divisible by the group size %d (pass split sizes for "
                        "an uneven split)",
                        op->count, pg->size);
    }
    if (op->send_counts != NULL) {
        size_t sum = 0;
        for (int i = 0; i < pg->size; i++) {
            if (op->send_counts[i] > SIZE_MAX - sum)
                return FAIL(pg, opname, "send split sizes overflow at index %d", i);
            sum += op->send_counts[i];
        }
        if (sum != op->count)
            return FAIL(pg, opname, "send split sizes sum to %zu (expected count %zu)", sum,
                        op->count);
    }
    size_t recv_total = op->count;
    if (op->recv_counts != NULL) {
        recv_total = 0;
        for (int i = 0; i < pg->size; i++) {
            if (op->recv_counts[i] > SIZE_MAX - recv_total)
                return FAIL(pg, opname, "recv split sizes overflow at index %d", i);
            recv_total += op->recv_counts[i];
        }
        size_t bytes;
        if (__builtin_mul_overflow(recv_total, c10d_dtype_size(op->dtype), &bytes))
            return FAIL(pg, opname, "recv split sizes sum to %zu elements: too large", recv_total);
    }
    C10D_CHECK(check_buf(pg, opname, "send", op->send, op->count));
    return check_buf(pg, opname, "recv", op->recv, recv_total);
}

/* The uneven all_gather / reduce_scatter: `buf` holds every rank's block,
 * sum(counts) elements, and this rank's block is `mine` of them. */
static int check_uneven(const c10d_pg *pg, const char *opname, const char *what, const void *buf,
                        const size_t *counts, size_t mine, size_t esz)
{
    size_t total = 0, bytes;
    for (int i = 0; i < pg->size; i++) {
        if (counts[i] > SIZE_MAX - total)
            return FAIL(pg, opname, "counts overflow at index %d", i);
        total += counts[i];
    }
    if (__builtin_mul_overflow(total, esz, &bytes))
        return FAIL(pg, opname, "counts sum to %zu elements: too large", total);
    if (counts[pg->rank] != mine)
        return FAIL(pg, opname, "counts[%d] = %zu, but this rank's block has %zu elements",
                    pg->rank, counts[pg->rank], mine);
    return check_buf(pg, opname, what, buf, total);
}

/* Self is a peer only inside a batch, as in torch (whose isend and irecv
 * refuse it with these words): an all_to_all written as a batch includes it. */
static int check_p2p(const c10d_pg *pg, const char *opname, const struct c10d__op *op, int in_batch)
{
    int any_ok = op->kind == C10D_OP_RECV;
    if (!(any_ok && op->peer == C10D_ANY_SOURCE)) {
        C10D_CHECK(check_rank(pg, opname, "peer", op->peer));
        const char *which = op->kind == C10D_OP_SEND ? "destination" : "source";
        if (op->peer == pg->rank && !in_batch)
            return FAIL(pg, opname,
                        "Invalid %s rank: %s rank should not be the same as the rank of the "
                        "current process (rank %d; c10d_batch_isend_irecv takes it)",
                        which, which, op->peer);
    }
    if (op->tag < 0)
        return FAIL(pg, opname, "invalid tag %d (tags must be >= 0)", op->tag);
    if (op->tag >= C10D__TAG_RESERVED)
        return FAIL(pg, opname, "tag %d is reserved for the library (tags must be < %d)", op->tag,
                    C10D__TAG_RESERVED);
    if (op->kind == C10D_OP_SEND)
        return check_buf(pg, opname, "send", op->send, op->count);
    return check_buf(pg, opname, "recv", op->recv, op->count);
}

int c10d__pg_check_op(const c10d_pg *pg, const char *opname, const struct c10d__op *op,
                      int list_form)
{
    if ((int)op->dtype < 0 || op->dtype >= C10D_DTYPE_COUNT)
        return FAIL(pg, opname, "invalid dtype %d", (int)op->dtype);
    size_t n = op->count, size = (size_t)pg->size, total, esz = c10d_dtype_size(op->dtype);
    if (__builtin_mul_overflow(n, size, &total) ||
        __builtin_mul_overflow(total, c10d_dtype_size(op->dtype), &total))
        return FAIL(pg, opname, "count %zu is too large", n);
    int is_root = 0;
    switch (op->kind) {
    case C10D_OP_BROADCAST:
        C10D_CHECK(check_rank(pg, opname, "root", op->root));
        is_root = op->root == pg->rank;
        if (is_root)
            C10D_CHECK(check_buf(pg, opname, "send", op->send, n));
        return check_buf(pg, opname, "recv", op->recv, n);
    case C10D_OP_ALL_REDUCE:
        C10D_CHECK(check_redop(pg, opname, op));
        C10D_CHECK(check_buf(pg, opname, "send", op->send, n));
        return check_buf(pg, opname, "recv", op->recv, n);
    case C10D_OP_REDUCE:
        C10D_CHECK(check_rank(pg, opname, "root", op->root));
        C10D_CHECK(check_redop(pg, opname, op));
        C10D_CHECK(check_buf(pg, opname, "send", op->send, n));
        if (op->root == pg->rank)
            return check_buf(pg, opname, "recv", op->recv, n);
        return 0;
    case C10D_OP_ALL_GATHER:
        C10D_CHECK(check_buf(pg, opname, "send", op->send, n));
        if (op->recv_counts != NULL)
            return check_uneven(pg, opname, "recv", op->recv, op->recv_counts, n, esz);
        if (list_form)
            return check_list(pg, opname, "recvs", (const void *const *)op->recvs, NULL, n, esz);
        return check_buf(pg, opname, "recv", op->recv, n * size);
    case C10D_OP_GATHER:
        C10D_CHECK(check_rank(pg, opname, "root", op->root));
        C10D_CHECK(check_buf(pg, opname, "send", op->send, n));
        if (op->root == pg->rank)
            return check_buf(pg, opname, "recv", op->recv, n * size);
        if (op->recv != NULL)
            return FAIL(pg, opname, "recv must be NULL on a non-root rank (rank %d, root %d)",
                        pg->rank, op->root);
        return 0;
    case C10D_OP_SCATTER:
        C10D_CHECK(check_rank(pg, opname, "root", op->root));
        C10D_CHECK(check_buf(pg, opname, "recv", op->recv, n));
        if (op->root == pg->rank)
            return check_buf(pg, opname, "send", op->send, n * size);
        if (op->send != NULL)
            return FAIL(pg, opname, "send must be NULL on a non-root rank (rank %d, root %d)",
                        pg->rank, op->root);
        return 0;
    case C10D_OP_REDUCE_SCATTER:
        C10D_CHECK(check_redop(pg, opname, op));
        C10D_CHECK(check_buf(pg, opname, "recv", op->recv, n));
        if (op->send_counts != NULL)
            return check_uneven(pg, opname, "send", op->send, op->send_counts, n, esz);
        if (list_form)
            return check_list(pg, opname, "sends", op->sends, NULL, n, esz);
        return check_buf(pg, opname, "send", op->send, n * size);
    case C10D_OP_ALL_TO_ALL:
        if (!list_form)
            return check_splits(pg, opname, op);
        if (op->send_counts == NULL || op->recv_counts == NULL)
            return FAIL(pg, opname, "the list form needs send_counts and recv_counts");
        C10D_CHECK(check_list(pg, opname, "sends", op->sends, op->send_counts, 0, esz));
        return check_list(pg, opname, "recvs", (const void *const *)op->recvs, op->recv_counts, 0,
                          esz);
    case C10D_OP_BARRIER:
        return 0;
    case C10D_OP_SEND:
    case C10D_OP_RECV:
        return check_p2p(pg, opname, op, list_form);
    default:
        return FAIL(pg, opname, "unknown op kind %d", (int)op->kind);
    }
}

/* Complex values travel as pairs of reals, as torch's view_as_real before any
 * backend: every backend sees float32 / float64 and twice the elements (the
 * caller scales count arrays by *per). A reduction other than SUM, AVG and
 * PREMUL_SUM is refused on every device, not only where the host table looks. */
int c10d__pg_complex_as_reals(const c10d_pg *pg, const char *opname, struct c10d__op *op,
                              size_t *per)
{
    c10d_dtype real = c10d__dtype_real(op->dtype, per);
    if (*per == 1)
        return 0;
    int reduces = op->kind == C10D_OP_ALL_REDUCE || op->kind == C10D_OP_REDUCE ||
                  op->kind == C10D_OP_REDUCE_SCATTER;
    if (reduces && op->redop != C10D_SUM && op->redop != C10D_AVG && op->redop != C10D_PREMUL_SUM)
        return c10d__fail(C10D_EINVAL, "%s %s: %s does not support ReduceOp.%s on complex tensors",
                          pg->backend_name, opname, opname, c10d_reduce_op_name(op->redop));
    op->dtype = real;
    op->count *= *per;
    return 0;
}
