/* What each op becomes in NCCL calls (nccl_impl.h). Collectives NCCL has
 * are called directly; the others (gather, scatter, all_to_all, the list
 * forms) are grouped send/recv, and the uneven all_gather / reduce_scatter
 * grouped broadcasts / reduces, as PyTorch's NCCL backend does, so no op
 * needs a scratch buffer on the device. Every op, coalesced lists and P2P
 * batches included, is one ncclGroupStart/ncclGroupEnd. */
#include "nccl_impl.h"

#include "gpu/nan_check.h"
#include "engine/error.h"
#include "engine/kernels/reduce.h"
#include "engine/loop.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

static const ncclDataType_t nccl_dtypes[C10D_DTYPE_COUNT] = {
    [C10D_FLOAT32] = ncclFloat32,
    [C10D_FLOAT64] = ncclFloat64,
    [C10D_FLOAT16] = ncclFloat16,
    [C10D_BFLOAT16] = ncclBfloat16,
    [C10D_INT8] = ncclInt8,
    [C10D_UINT8] = ncclUint8,
    [C10D_INT32] = ncclInt32,
    [C10D_INT64] = ncclInt64,
    [C10D_BOOL] = ncclUint8,
    [C10D_FLOAT8_E4M3] = ncclFloat8e4m3,
    [C10D_FLOAT8_E5M2] = ncclFloat8e5m2,
    [C10D_UINT32] = ncclUint32,
    [C10D_UINT64] = ncclUint64,
    /* No 16-bit integers in NCCL, and complex reaches a backend as pairs of
     * reals (the group layer's rewrite): check refuses those four. */
};

static int is_float(c10d_dtype d)
{
    return d == C10D_FLOAT32 || d == C10D_FLOAT64 || d == C10D_FLOAT16 || d == C10D_BFLOAT16 ||
           d == C10D_FLOAT8_E4M3 || d == C10D_FLOAT8_E5M2;
}

static int has_redop(enum c10d__op_kind k)
{
    return k == C10D_OP_ALL_REDUCE || k == C10D_OP_REDUCE || k == C10D_OP_REDUCE_SCATTER;
}

int c10d__nccl_check(const struct c10d__op *op)
{
    for (; op != NULL; op = op->next) {
        if (op->device_type != C10D_DEVICE_CUDA)
            return c10d__fail(C10D_EINVAL,
                              "nccl %s: the nccl backend takes CUDA buffers only "
                              "(opts.device_type = C10D_DEVICE_CUDA)",
                              c10d__op_kind_name(op->kind));
        if (op->kind == C10D_OP_RECV && op->peer == C10D_ANY_SOURCE)
            return c10d__fail(C10D_EINVAL,
                              "nccl recv: receiving from any source is not supported by NCCL "
                              "(name the peer)");
        if ((unsigned)op->dtype >= C10D_DTYPE_COUNT)
            return c10d__fail(C10D_EINVAL, "nccl %s: unknown dtype %d",
                              c10d__op_kind_name(op->kind), (int)op->dtype);
        if (op->dtype == C10D_COMPLEX64 || op->dtype == C10D_COMPLEX128)
            return c10d__fail(C10D_EINVAL,
                              "nccl %s: %s reaches NCCL as pairs of reals (the group's calls "
                              "rewrite it)",
                              c10d__op_kind_name(op->kind), c10d_dtype_name(op->dtype));
        if (op->dtype == C10D_INT16 || op->dtype == C10D_UINT16)
            return c10d__fail(C10D_EUNSUPPORTED,
                              "nccl %s: NCCL has no %s (no 16-bit integer type): use int32, or "
                              "the tcp backend",
                              c10d__op_kind_name(op->kind), c10d_dtype_name(op->dtype));
        /* An NCCL without float8 (< 2.24) fails such an op at launch, which
         * would fail the group: refuse it here instead. */
        const struct c10d__gpu_api *api;
        if ((op->dtype == C10D_FLOAT8_E4M3 || op->dtype == C10D_FLOAT8_E5M2) &&
            c10d__nccl_load(&api) == 0 && api->nccl_version < 22400)
            return c10d__fail(
                C10D_EUNSUPPORTED, "nccl %s: dtype %s needs NCCL 2.24 or newer (loaded: %d.%d.%d)",
                c10d__op_kind_name(op->kind), c10d_dtype_name(op->dtype), api->nccl_version / 10000,
                api->nccl_version / 100 % 100, api->nccl_version % 100);
        if (!has_redop(op->kind))
            continue;
        switch (op->redop) {
        case C10D_BAND:
        case C10D_BOR:
        case C10D_BXOR:
            return c10d__fail(C10D_EINVAL, "Cannot use ReduceOp.%s with NCCL",
                              c10d_reduce_op_name(op->redop));
        case C10D_AVG:
            if (op->dtype == C10D_BOOL)
                return c10d__fail(C10D_EINVAL, "Cannot use ReduceOp.AVG with boolean inputs");
            /* NCCL (2.28.9 on an H200) fails the launch with ncclInvalidArgument,
             * which would fail the whole group; refused here, the group lives. */
            if (op->dtype == C10D_FLOAT8_E4M3 || op->dtype == C10D_FLOAT8_E5M2)
                return c10d__fail(C10D_EINVAL,
                                  "Cannot use ReduceOp.AVG with dtype %s on NCCL (NCCL has no "
                                  "average of fp8 values; SUM, then scale)",
                                  c10d_dtype_name(op->dtype));
            break;
        case C10D_PREMUL_SUM:
            if (!is_float(op->dtype) || op->dtype == C10D_FLOAT8_E4M3 ||
                op->dtype == C10D_FLOAT8_E5M2)
                return c10d__fail(C10D_EINVAL,
                                  "Cannot use ReduceOp.PREMUL_SUM with dtype %s on NCCL "
                                  "(float32, float64, float16 and bfloat16 only)",
                                  c10d_dtype_name(op->dtype));
            break;
        default:
            if ((unsigned)op->redop >= C10D_REDUCE_OP_COUNT)
                return c10d__fail(C10D_EINVAL, "nccl: unknown reduce op %d", (int)op->redop);
        }
    }
    return 0;
}

const char *c10d__nccl_error_text(const struct c10d__gpu_api *api, ncclResult_t r, char *buf,
                                  size_t len)
{
    const char *last = api->nccl.ncclGetLastError(NULL);
    snprintf(buf, len, "%s%s%s", api->nccl.ncclGetErrorString(r), last != NULL && *last ? ": " : "",
             last != NULL ? last : "");
    return buf;
}

/* ------------------------------------------------------------- launching */

struct launch {
    struct nccl_comm *c;
    const struct c10d__gpu_api *api;
    ncclRedOp_t premul[64]; /* PreMulSum ops to destroy after the group */
    int npremul;
};

static ncclResult_t redop_of(struct launch *l, const struct c10d__op *op, ncclRedOp_t *out)
{
    switch (op->redop) {
    case C10D_SUM:
        *out = op->dtype == C10D_BOOL ? ncclMax : ncclSum;
        return ncclSuccess;
    case C10D_PRODUCT:
        *out = op->dtype == C10D_BOOL ? ncclMin : ncclProd;
        return ncclSuccess;
    case C10D_MIN:
        *out = ncclMin;
        return ncclSuccess;
    case C10D_MAX:
        *out = ncclMax;
        return ncclSuccess;
    case C10D_AVG:
        *out = ncclAvg;
        return ncclSuccess;
    case C10D_PREMUL_SUM: {
        if (l->npremul == (int)(sizeof l->premul / sizeof *l->premul))
            return ncclInvalidUsage;
        if (op->premul_factor_dev != NULL) {
            /* One element in device memory, read by the kernel when it runs. */
            ncclResult_t r = l->api->nccl.ncclRedOpCreatePreMulSum(
                out, (void *)op->premul_factor_dev, nccl_dtypes[op->dtype], ncclScalarDevice,
                l->c->comm);
            if (r == ncclSuccess)
                l->premul[l->npremul++] = *out;
            return r;
        }
        /* The factor in the buffers' dtype, read by NCCL at the call. */
        union {
            double d;
            float f;
            uint16_t h;
        } factor;
        if (op->dtype == C10D_FLOAT64)
            factor.d = op->premul_factor;
        else if (op->dtype == C10D_FLOAT32)
            factor.f = (float)op->premul_factor;
        else if (op->dtype == C10D_FLOAT16)
            factor.h = c10d__float_to_half((float)op->premul_factor);
        else
            factor.h = c10d__float_to_bf16((float)op->premul_factor);
        ncclResult_t r = l->api->nccl.ncclRedOpCreatePreMulSum(out, &factor, nccl_dtypes[op->dtype],
                                                               ncclScalarHostImmediate, l->c->comm);
        if (r == ncclSuccess)
            l->premul[l->npremul++] = *out;
        return r;
    }
    default:
        return ncclInvalidArgument;
    }
}

static size_t block(const size_t *counts, size_t even, int i)
{
    return counts != NULL ? counts[i] : even;
}

/* The calls of one op, inside the caller's group. */
static ncclResult_t launch_one(struct launch *l, const struct c10d__op *op)
{
    const struct c10d__nccl_api *n = &l->api->nccl;
    struct nccl_comm *c = l->c;
    ncclComm_t comm = c->comm;
    cudaStream_t st = c->stream;
    ncclDataType_t dt = nccl_dtypes[op->dtype];
    size_t es = c10d_dtype_size(op->dtype);
    int size = c->nranks, me = c->rank;
    ncclRedOp_t rop = ncclSum;
    ncclResult_t r = ncclSuccess;
    if (has_redop(op->kind) && (r = redop_of(l, op, &rop)) != ncclSuccess)
        return r;
    switch (op->kind) {
    case C10D_OP_ALL_REDUCE:
        return n->ncclAllReduce(op->send, op->recv, op->count, dt, rop, comm, st);
    case C10D_OP_BROADCAST:
        return n->ncclBroadcast(me == op->root ? op->send : op->recv, op->recv, op->count, dt,
                                op->root, comm, st);
    case C10D_OP_REDUCE:
        return n->ncclReduce(op->send, op->recv, op->count, dt, rop, op->root, comm, st);
    case C10D_OP_ALL_GATHER:
        if (op->recv_counts != NULL) {
            /* Uneven blocks: one broadcast per rank, rooted at the block's
             * owner, into its place in recv (torch's all_gather of
             * different sizes). */
            size_t off = 0;
            for (int p = 0; p < size && r == ncclSuccess; p++) {
                char *at = (char *)op->recv + off * es;
                r = n->ncclBroadcast(p == me ? op->send : at, at, op->recv_counts[p], dt, p, comm,
                                     st);
                off += op->recv_counts[p];
            }
            return r;
        }
        if (op->recvs == NULL)
            return n->ncclAllGather(op->send, op->recv, op->count, dt, comm, st);
        for (int p = 0; p < size && r == ncclSuccess; p++) {
            r = n->ncclSend(op->send, op->count, dt, p, comm, st);
            if (r == ncclSuccess)
                r = n->ncclRecv(op->recvs[p], op->count, dt, p, comm, st);
        }
        return r;
    case C10D_OP_REDUCE_SCATTER:
        if (op->send_counts != NULL) {
            /* Uneven blocks: one reduce per rank, rooted at the block's owner. */
            size_t off = 0;
            for (int p = 0; p < size && r == ncclSuccess; p++) {
                r = n->ncclReduce((const char *)op->send + off * es, p == me ? op->recv : NULL,
                                  op->send_counts[p], dt, rop, p, comm, st);
                off += op->send_counts[p];
            }
            return r;
        }
        if (op->sends == NULL)
            return n->ncclReduceScatter(op->send, op->recv, op->count, dt, rop, comm, st);
        /* List form: one reduce per destination, rooted there. */
        for (int p = 0; p < size && r == ncclSuccess; p++)
            r = n->ncclReduce(op->sends[p], p == me ? op->recv : NULL, op->count, dt, rop, p, comm,
                              st);
        return r;
    case C10D_OP_GATHER:
        if (me == op->root)
            for (int p = 0; p < size && r == ncclSuccess; p++)
                r = n->ncclRecv((char *)op->recv + (size_t)p * op->count * es, op->count, dt, p,
                                comm, st);
        if (r == ncclSuccess)
            r = n->ncclSend(op->send, op->count, dt, op->root, comm, st);
        return r;
    case C10D_OP_SCATTER:
        if (me == op->root)
            for (int p = 0; p < size && r == ncclSuccess; p++)
                r = n->ncclSend((const char *)op->send + (size_t)p * op->count * es, op->count, dt,
                                p, comm, st);
        if (r == ncclSuccess)
            r = n->ncclRecv(op->recv, op->count, dt, op->root, comm, st);
        return r;
    case C10D_OP_ALL_TO_ALL: {
        size_t even = op->count / (size_t)size, soff = 0, roff = 0;
        for (int p = 0; p < size && r == ncclSuccess; p++) {
            size_t sc = block(op->send_counts, even, p), rc = block(op->recv_counts, even, p);
            const void *sb = op->sends != NULL ? op->sends[p] : (const char *)op->send + soff * es;
            void *rb = op->recvs != NULL ? op->recvs[p] : (char *)op->recv + roff * es;
            r = n->ncclSend(sb, sc, dt, p, comm, st);
            if (r == ncclSuccess)
                r = n->ncclRecv(rb, rc, dt, p, comm, st);
            soff += sc;
            roff += rc;
        }
        return r;
    }
    case C10D_OP_BARRIER:
        return n->ncclAllReduce(c->barrier_buf, c->barrier_buf, 1, ncclFloat32, ncclSum, comm, st);
    case C10D_OP_SEND:
        return n->ncclSend(op->send, op->count, dt, c->peer >= 0 ? 1 - me : op->peer, comm, st);
    case C10D_OP_RECV:
        return n->ncclRecv(op->recv, op->count, dt, c->peer >= 0 ? 1 - me : op->peer, comm, st);
    default:
        return ncclInvalidArgument;
    }
}

/* ------------------------------------------------------------ NaN check */

static int check_input(struct nccl_comm *c, const void *buf, size_t count, c10d_dtype dt,
                       uint64_t tag)
{
    return c10d__nan_check_launch(&c->s->api->cuda, buf, count, dt,
                                  (uint64_t *)&c->nan_flag[tag % C10D__NCCL_NAN_SLOTS], tag,
                                  c->stream);
}

/* The inputs of one op: what this rank sends or reduces. */
static int check_one(struct nccl_comm *c, const struct c10d__op *op, uint64_t tag)
{
    int size = c->nranks, me = c->rank, rc = 0;
    size_t es = c10d_dtype_size(op->dtype);
    switch (op->kind) {
    case C10D_OP_ALL_REDUCE:
    case C10D_OP_REDUCE:
    case C10D_OP_ALL_GATHER:
    case C10D_OP_GATHER:
    case C10D_OP_SEND:
        return check_input(c, op->send, op->count, op->dtype, tag);
    case C10D_OP_BROADCAST:
        return me == op->root ? check_input(c, op->send, op->count, op->dtype, tag) : 0;
    case C10D_OP_SCATTER:
        return me == op->root ? check_input(c, op->send, op->count * (size_t)size, op->dtype, tag)
                              : 0;
    case C10D_OP_REDUCE_SCATTER:
        if (op->send_counts != NULL)
            return check_input(c, op->send, c10d__op_counts_sum(op->send_counts, size), op->dtype,
                               tag);
        if (op->sends == NULL)
            return check_input(c, op->send, op->count * (size_t)size, op->dtype, tag);
        for (int p = 0; p < size && rc == 0; p++)
            rc = check_input(c, op->sends[p], op->count, op->dtype, tag);
        return rc;
    case C10D_OP_ALL_TO_ALL: {
        size_t even = op->count / (size_t)size, off = 0;
        for (int p = 0; p < size && rc == 0; p++) {
            size_t n = block(op->send_counts, even, p);
            const void *b = op->sends != NULL ? op->sends[p] : (const char *)op->send + off * es;
            rc = check_input(c, b, n, op->dtype, tag);
            off += n;
        }
        return rc;
    }
    default: /* recv, barrier: no input */
        return 0;
    }
}

int c10d__nccl_nan_check(struct nccl_comm *c, const struct c10d__op *op, uint64_t tag)
{
    int rc = 0;
    for (; op != NULL && rc == 0; op = op->next)
        rc = check_one(c, op, tag);
    return rc;
}

/* A nonblocking communicator may answer ncclInProgress: the call is not
 * enqueued yet. Wait it out here, bounded by the op's timeout. */
static ncclResult_t settle(const struct launch *l, ncclResult_t r, int64_t timeout_ms)
{
    if (r != ncclInProgress)
        return r;
    uint64_t until = c10d__now_ms() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 600000);
    for (;;) {
        ncclResult_t st = ncclInProgress;
        l->api->nccl.ncclCommGetAsyncError(l->c->comm, &st);
        if (st != ncclInProgress)
            return st;
        if (c10d__now_ms() >= until)
            return ncclInProgress;
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
    }
}

int c10d__nccl_launch(struct nccl_comm *c, const struct c10d__op *op)
{
    struct launch l = {.c = c, .api = c->s->api};
    ncclResult_t r = l.api->nccl.ncclGroupStart();
    /* What the messages need is read now: once ncclGroupEnd returns, a
     * shutdown meanwhile may have completed the op and freed its record. */
    const char *kind = c10d__op_kind_name(op->kind);
    unsigned long long seq = (unsigned long long)op->seq;
    long long timeout_ms = (long long)op->timeout_ms;
    ncclResult_t call = ncclSuccess;
    for (const struct c10d__op *o = op; o != NULL && call == ncclSuccess; o = o->next) {
        kind = c10d__op_kind_name(o->kind);
        seq = (unsigned long long)o->seq;
        call = launch_one(&l, o);
    }
    r = settle(&l, l.api->nccl.ncclGroupEnd(), timeout_ms);
    /* An abort from another thread freed the communicator meanwhile (its
     * ops went with it): nothing of it may be touched any more. */
    for (int i = 0; i < l.npremul && !atomic_load(&c->aborting); i++)
        l.api->nccl.ncclRedOpDestroy(l.premul[i], c->comm);
    if (call == ncclSuccess)
        call = r;
    if (call == ncclSuccess)
        return 0;
    char buf[256];
    if (call == ncclInProgress)
        return c10d__fail(C10D_ETIMEDOUT,
                          "nccl %s seq %llu: NCCL did not accept the op within %lld ms", kind, seq,
                          timeout_ms);
    return c10d__fail(C10D_EIO, "nccl %s seq %llu: %s", kind, seq,
                      c10d__nccl_error_text(l.api, call, buf, sizeof buf));
}
