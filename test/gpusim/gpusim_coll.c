/* gpusim, collectives and P2P: a TEST DOUBLE, never installed, never
 * benchmarked (see gpusim.h and README.md).
 *
 * Each call (or each stream's share of an ncclGroupStart/End) becomes one
 * task on its stream. Tasks of a communicator run in call order (a ticket
 * taken at submission; NCCL serialises a communicator's kernels the same
 * way). Collectives move data through one 1 MiB slot per rank in chunks,
 * two barriers per chunk (written, read), and every rank reduces the slots
 * in rank order, so all ranks get bit-identical results. P2P goes through
 * a ring buffer per (sender, receiver): a byte stream, ordered per pair. A
 * group's sends and receives progress together, then its collectives run in
 * call order. Every wait ends when the communicator is aborted. */
#include "gpusim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ------------------------------------------------------------ datatypes */
size_t sim_dtype_size(ncclDataType_t dt)
{
    static const unsigned char size[ncclNumTypes] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
    return (int)dt >= 0 && dt < ncclNumTypes ? size[dt] : 0;
}

/* A 1-E-M binary float: f16, bf16, fp8 e4m3 (no infinity; only the all-ones
 * pattern is NaN) and e5m2. sat: overflow gives the largest finite value,
 * as the CUDA fp8 conversions (__NV_SATFINITE) do. */
struct fmt {
    int e, m, ieee, sat;
};
static const struct fmt F16 = {5, 10, 1, 0}, BF16 = {8, 7, 1, 0}, E4M3 = {4, 3, 0, 1},
                        E5M2 = {5, 2, 1, 1};

static const struct fmt *small_fmt(ncclDataType_t dt)
{
    switch (dt) {
    case ncclFloat16:
        return &F16;
    case ncclBfloat16:
        return &BF16;
    case ncclFloat8e4m3:
        return &E4M3;
    case ncclFloat8e5m2:
        return &E5M2;
    default:
        return NULL;
    }
}

static float small_to_float(uint32_t bits, const struct fmt *f)
{
    int bias = (1 << (f->e - 1)) - 1;
    uint32_t expmask = (1u << f->e) - 1, manmask = (1u << f->m) - 1;
    uint32_t ex = (bits >> f->m) & expmask, man = bits & manmask;
    double v;
    if (ex == expmask && (f->ieee || man == manmask))
        v = f->ieee && man == 0 ? INFINITY : NAN;
    else if (ex == 0)
        v = ldexp((double)man, 1 - bias - f->m);
    else
        v = ldexp((double)(man | (1u << f->m)), (int)ex - bias - f->m);
    return (float)((bits >> (f->e + f->m)) & 1 ? -v : v);
}

/* Round to nearest, ties to even. */
static uint32_t float_to_small(float x, const struct fmt *f)
{
    int bias = (1 << (f->e - 1)) - 1;
    uint32_t expmask = (1u << f->e) - 1, manmask = (1u << f->m) - 1;
    uint32_t sign = signbit(x) ? 1u << (f->e + f->m) : 0;
    uint32_t nan = f->ieee ? (expmask << f->m) | (1u << (f->m - 1)) : (expmask << f->m) | manmask;
    uint32_t maxfin =
        f->ieee ? ((expmask - 1) << f->m) | manmask : (expmask << f->m) | (manmask - 1);
    uint32_t over = f->sat ? maxfin : f->ieee ? expmask << f->m : nan;
    int emax = f->ieee ? (int)expmask - 1 - bias : (int)expmask - bias, emin = 1 - bias;
    if (isnan(x))
        return sign | nan;
    if (isinf(x))
        return sign | over;
    double a = fabs((double)x);
    if (a < ldexp(1.0, emin)) /* subnormal; may round up to the smallest normal */
        return sign | (uint32_t)rint(ldexp(a, f->m - emin));
    int e;
    frexp(a, &e);
    e -= 1; /* a in [2^e, 2^(e+1)) */
    double q = rint(ldexp(a, f->m - e));
    if (q >= ldexp(1.0, f->m + 1)) {
        q /= 2;
        e++;
    }
    if (e > emax)
        return sign | over;
    uint32_t bits = ((uint32_t)(e + bias) << f->m) | ((uint32_t)q - (1u << f->m));
    return sign | (bits > maxfin ? over : bits);
}

static float load_small(const void *p, size_t i, const struct fmt *f)
{
    uint32_t b = f->e + f->m == 15 ? ((const uint16_t *)p)[i] : ((const uint8_t *)p)[i];
    return small_to_float(b, f);
}

static void store_small(void *p, size_t i, float v, const struct fmt *f)
{
    uint32_t b = float_to_small(v, f);
    if (f->e + f->m == 15)
        ((uint16_t *)p)[i] = (uint16_t)b;
    else
        ((uint8_t *)p)[i] = (uint8_t)b;
}

/* T the type, U its arithmetic (unsigned for signed integers: wrapping, not
 * undefined), W its division for ncclAvg. */
#define COMBINE(op, a, b, T, U)                                                                    \
    ((op) == ncclProd  ? (T)((U)(a) * (U)(b))                                                      \
     : (op) == ncclMax ? ((b) > (a) ? (b) : (a))                                                   \
     : (op) == ncclMin ? ((b) < (a) ? (b) : (a))                                                   \
                       : (T)((U)(a) + (U)(b)))
#define REDUCE(T, U, W)                                                                            \
    do {                                                                                           \
        for (size_t i = 0; i < k; i++) {                                                           \
            T a = ((const T *)src[0])[i];                                                          \
            for (int r = 1; r < n; r++)                                                            \
                a = COMBINE(op, a, ((const T *)src[r])[i], T, U);                                  \
            if (op == ncclAvg)                                                                     \
                a = (T)((W)a / (W)n);                                                              \
            ((T *)dst)[i] = a;                                                                     \
        }                                                                                          \
    } while (0)
#define SCALE(T, U)                                                                                \
    do {                                                                                           \
        T s;                                                                                       \
        memcpy(&s, scalar, sizeof s);                                                              \
        for (size_t i = 0; i < k; i++)                                                             \
            ((T *)dst)[i] = (T)((U)((const T *)src)[i] * (U)s);                                    \
    } while (0)

/* dst[i] = src[0][i] op src[1][i] op ... in rank order. */
static void reduce(void *dst, unsigned char *const *src, int n, size_t k, ncclDataType_t dt,
                   ncclRedOp_t op)
{
    switch (dt) {
    case ncclInt8:
        REDUCE(int8_t, uint8_t, int64_t);
        break;
    case ncclUint8:
        REDUCE(uint8_t, uint8_t, uint64_t);
        break;
    case ncclInt32:
        REDUCE(int32_t, uint32_t, int64_t);
        break;
    case ncclUint32:
        REDUCE(uint32_t, uint32_t, uint64_t);
        break;
    case ncclInt64:
        REDUCE(int64_t, uint64_t, int64_t);
        break;
    case ncclUint64:
        REDUCE(uint64_t, uint64_t, uint64_t);
        break;
    case ncclFloat32:
        REDUCE(float, float, float);
        break;
    case ncclFloat64:
        REDUCE(double, double, double);
        break;
    default: { /* 16- and 8-bit floats: through float, rounded once */
        const struct fmt *f = small_fmt(dt);
        for (size_t i = 0; i < k; i++) {
            float a = load_small(src[0], i, f);
            for (int r = 1; r < n; r++)
                a = COMBINE(op, a, load_small(src[r], i, f), float, float);
            if (op == ncclAvg)
                a /= (float)n;
            store_small(dst, i, a, f);
        }
    }
    }
}

/* dst[i] = src[i] * scalar (PreMulSum's first step). */
static void scale(void *dst, const void *src, size_t k, ncclDataType_t dt, const void *scalar)
{
    switch (dt) {
    case ncclInt8:
        SCALE(int8_t, uint8_t);
        break;
    case ncclUint8:
        SCALE(uint8_t, uint8_t);
        break;
    case ncclInt32:
        SCALE(int32_t, uint32_t);
        break;
    case ncclUint32:
        SCALE(uint32_t, uint32_t);
        break;
    case ncclInt64:
        SCALE(int64_t, uint64_t);
        break;
    case ncclUint64:
        SCALE(uint64_t, uint64_t);
        break;
    case ncclFloat32:
        SCALE(float, float);
        break;
    case ncclFloat64:
        SCALE(double, double);
        break;
    default: {
        const struct fmt *f = small_fmt(dt);
        float s = load_small(scalar, 0, f);
        for (size_t i = 0; i < k; i++)
            store_small(dst, i, load_small(src, i, f) * s, f);
    }
    }
}

/* ------------------------------------------------------- PreMulSum ops */
SIM_API ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar,
                                              ncclDataType_t datatype,
                                              ncclScalarResidence_t residence, ncclComm_t comm)
{
    const char *who = "ncclRedOpCreatePreMulSum";
    struct sim_comm *c = sim_comm_get(comm);
    ncclResult_t r = sim_comm_check_ready(c, who);
    if (r != ncclSuccess)
        return r;
    size_t es = sim_dtype_size(datatype);
    if (op == NULL || scalar == NULL || es == 0 ||
        (residence != ncclScalarDevice && residence != ncclScalarHostImmediate)) {
        sim_set_error("%s: invalid argument (op, scalar, datatype %d or residence %d)", who,
                      (int)datatype, (int)residence);
        return ncclInvalidArgument;
    }
    pthread_mutex_lock(&c->mu);
    int i = 0;
    while (i < SIM_PREMUL_MAX && c->premul[i].used)
        i++;
    if (i < SIM_PREMUL_MAX) {
        struct sim_premul *p = &c->premul[i];
        memset(p, 0, sizeof *p);
        p->used = 1;
        p->dt = datatype;
        p->residence = residence;
        if (residence == ncclScalarHostImmediate)
            memcpy(p->value, scalar, es);
        else
            p->ptr = scalar;
    }
    pthread_mutex_unlock(&c->mu);
    if (i == SIM_PREMUL_MAX) {
        sim_set_error("%s: more than %d live PreMulSum ops", who, SIM_PREMUL_MAX);
        return ncclInvalidUsage;
    }
    *op = (ncclRedOp_t)(ncclNumOps + i);
    return ncclSuccess;
}

SIM_API ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm)
{
    struct sim_comm *c = sim_comm_get(comm);
    if (c == NULL) {
        sim_set_error("ncclRedOpDestroy: comm is NULL or not a live communicator");
        return ncclInvalidArgument;
    }
    int i = (int)op - (int)ncclNumOps;
    pthread_mutex_lock(&c->mu);
    int ok = i >= 0 && i < SIM_PREMUL_MAX && c->premul[i].used;
    if (ok)
        c->premul[i].used = 0;
    pthread_mutex_unlock(&c->mu);
    if (!ok) {
        sim_set_error("ncclRedOpDestroy: %d is not a live user-defined op", (int)op);
        return ncclInvalidArgument;
    }
    return ncclSuccess;
}

/* ----------------------------------------------------- operations, jobs */
enum kind { K_ALLREDUCE, K_BCAST, K_REDUCE, K_ALLGATHER, K_REDSCAT, K_SEND, K_RECV };
static const char *const kind_name[] = {"ncclAllReduce", "ncclBroadcast",     "ncclReduce",
                                        "ncclAllGather", "ncclReduceScatter", "ncclSend",
                                        "ncclRecv"};

struct sim_op {
    enum kind kind;
    struct sim_comm *c;
    cudaStream_t stream;
    const void *send;
    void *recv;
    size_t count; /* sendcount for all_gather, recvcount for reduce_scatter */
    ncclDataType_t dt;
    ncclRedOp_t op; /* built-in; a PreMulSum is ncclSum with premul set */
    int root;       /* or peer */
    int premul;
    unsigned char scalar[8];
    const void *scalar_ptr; /* ncclScalarDevice: read when the op runs */
    size_t moved;           /* P2P bytes so far */
};

/* One task: the operations of one call, or of one stream in a group. */
struct sim_job {
    size_t nops, ncomms;
    int hang;
    struct sim_op *ops;
    struct sim_comm **comms;
    uint64_t *tickets;
};

static int is_p2p(const struct sim_op *o)
{
    return o->kind == K_SEND || o->kind == K_RECV;
}

/* 0, or -1 once c is aborted. Every rank passes the same barriers in order. */
static int barrier(struct sim_comm *c)
{
    uint64_t k = ++c->bar_seq;
    atomic_store_explicit(sim_arrive(c, c->rank), k, memory_order_release);
    for (int r = 0; r < c->nranks; r++) {
        unsigned spins = 0;
        while (atomic_load_explicit(sim_arrive(c, r), memory_order_acquire) < k)
            if (sim_backoff(c, &spins))
                return -1;
    }
    return 0;
}

static int wait_abort(struct sim_comm *c)
{
    unsigned spins = 64; /* straight to sleeping */
    while (!sim_backoff(c, &spins))
        ;
    return -1;
}

/* all_reduce, reduce, broadcast, all_gather, reduce_scatter. */
static int run_coll(struct sim_op *o)
{
    struct sim_comm *c = o->c;
    int n = c->nranks, me = c->rank;
    size_t es = sim_dtype_size(o->dt);
    size_t per = SIM_SLOT_BYTES / es / (o->kind == K_REDSCAT ? (size_t)n : 1);
    const unsigned char *in = o->send;
    unsigned char *out = o->recv, *mine = sim_slot(c, me), *src[SIM_MAX_RANKS];
    unsigned char scalar[8];
    if (o->premul)
        memcpy(scalar, o->scalar_ptr != NULL ? o->scalar_ptr : o->scalar, es);
    for (size_t off = 0; off < o->count; off += per) {
        size_t k = o->count - off < per ? o->count - off : per, bytes = k * es;
        if (barrier(c)) /* everyone has read the previous chunk */
            return -1;
        switch (o->kind) {
        case K_ALLREDUCE:
        case K_REDUCE:
            if (o->premul)
                scale(mine, in + off * es, k, o->dt, scalar);
            else
                memcpy(mine, in + off * es, bytes);
            break;
        case K_BCAST:
            if (me == o->root)
                memcpy(mine, in + off * es, bytes);
            break;
        case K_ALLGATHER:
            memcpy(mine, in + off * es, bytes);
            break;
        case K_REDSCAT:
            for (int d = 0; d < n; d++) {
                const unsigned char *blk = in + ((size_t)d * o->count + off) * es;
                if (o->premul)
                    scale(mine + (size_t)d * bytes, blk, k, o->dt, scalar);
                else
                    memcpy(mine + (size_t)d * bytes, blk, bytes);
            }
            break;
        default:
            break;
        }
        if (barrier(c)) /* everyone has written this chunk */
            return -1;
        for (int r = 0; r < n; r++)
            src[r] = sim_slot(c, r) + (o->kind == K_REDSCAT ? (size_t)me * bytes : 0);
        switch (o->kind) {
        case K_ALLREDUCE:
            reduce(out + off * es, src, n, k, o->dt, o->op);
            break;
        case K_REDUCE:
            if (me == o->root)
                reduce(out + off * es, src, n, k, o->dt, o->op);
            break;
        case K_BCAST:
            memcpy(out + off * es, src[o->root], bytes);
            break;
        case K_ALLGATHER:
            for (int r = 0; r < n; r++)
                memcpy(out + ((size_t)r * o->count + off) * es, src[r], bytes);
            break;
        case K_REDSCAT:
            reduce(out + off * es, src, n, k, o->dt, o->op);
            break;
        default:
            break;
        }
    }
    return 0;
}

/* Moves what the channel allows; returns the bytes moved. */
static size_t p2p_step(struct sim_op *o)
{
    struct sim_comm *c = o->c;
    size_t total = o->count * sim_dtype_size(o->dt);
    int send = o->kind == K_SEND, from = send ? c->rank : o->root, to = send ? o->root : c->rank;
    struct sim_chan *ch = sim_chan(c, from, to);
    unsigned char *data = sim_chandata(c, from, to);
    uint64_t head =
        atomic_load_explicit(&ch->head, send ? memory_order_relaxed : memory_order_acquire);
    uint64_t tail =
        atomic_load_explicit(&ch->tail, send ? memory_order_acquire : memory_order_relaxed);
    size_t room = send ? SIM_CHAN_BYTES - (size_t)(head - tail) : (size_t)(head - tail);
    size_t n = total - o->moved < room ? total - o->moved : room;
    size_t at = (size_t)((send ? head : tail) % SIM_CHAN_BYTES);
    size_t first = n < SIM_CHAN_BYTES - at ? n : SIM_CHAN_BYTES - at;
    if (n == 0)
        return 0;
    if (send) {
        const unsigned char *p = (const unsigned char *)o->send + o->moved;
        memcpy(data + at, p, first);
        memcpy(data, p + first, n - first);
        atomic_store_explicit(&ch->head, head + n, memory_order_release);
    } else {
        unsigned char *p = (unsigned char *)o->recv + o->moved;
        memcpy(p, data + at, first);
        memcpy(p + first, data, n - first);
        atomic_store_explicit(&ch->tail, tail + n, memory_order_release);
    }
    o->moved += n;
    return n;
}

static int job_aborted(const struct sim_job *j)
{
    for (size_t i = 0; i < j->ncomms; i++)
        if (atomic_load_explicit(&j->comms[i]->aborted, memory_order_acquire))
            return 1;
    return 0;
}

/* All sends and receives together; those sharing a channel in call order. */
static int run_p2p(struct sim_job *j)
{
    unsigned spins = 0;
    for (;;) {
        int left = 0;
        size_t moved = 0;
        for (size_t i = 0; i < j->nops; i++) {
            struct sim_op *o = &j->ops[i];
            if (!is_p2p(o) || o->moved == o->count * sim_dtype_size(o->dt))
                continue;
            int behind = 0;
            for (size_t e = 0; e < i && !behind; e++) {
                struct sim_op *p = &j->ops[e];
                behind = p->kind == o->kind && p->c == o->c && p->root == o->root &&
                         p->moved < p->count * sim_dtype_size(p->dt);
            }
            if (!behind)
                moved += p2p_step(o);
            left |= o->moved < o->count * sim_dtype_size(o->dt);
        }
        if (!left)
            return 0;
        if (job_aborted(j))
            return -1;
        if (moved > 0)
            spins = 0;
        else
            sim_backoff(NULL, &spins);
    }
}

/* 1 if an op's buffers reach outside every allocation: on a GPU that is
 * an illegal address, a fault that sticks (NCCL's kernels read them all). */
static int job_faults(const struct sim_job *j)
{
    for (size_t i = 0; i < j->nops; i++) {
        const struct sim_op *o = &j->ops[i];
        if (o->count == 0)
            continue;
        size_t one = o->count * sim_dtype_size(o->dt), n = (size_t)o->c->nranks;
        int root = o->root == o->c->rank;
        size_t in = o->kind == K_REDSCAT                                 ? one * n
                    : o->kind == K_RECV || (o->kind == K_BCAST && !root) ? 0
                                                                         : one;
        size_t out = o->kind == K_ALLGATHER                                ? one * n
                     : o->kind == K_SEND || (o->kind == K_REDUCE && !root) ? 0
                                                                           : one;
        if ((in > 0 && !sim_dev_range_valid(o->send, in)) ||
            (out > 0 && !sim_dev_range_valid(o->recv, out)))
            return 1;
        /* A PreMulSum scalar of ncclScalarDevice is read by the kernel too:
         * host memory there is an illegal address as well. */
        if (o->premul && o->scalar_ptr != NULL &&
            !sim_dev_range_valid(o->scalar_ptr, sim_dtype_size(o->dt)))
            return 1;
    }
    return 0;
}

static void run_job(void *p)
{
    struct sim_job *j = p;
    int stop = 0;
    /* After a fault the device runs nothing more. */
    if (sim_sticky() != cudaSuccess) {
        stop = -1;
    } else if (job_faults(j)) {
        sim_fault(cudaErrorIllegalAddress);
        stop = -1;
    }
    for (size_t i = 0; i < j->ncomms && !stop; i++) { /* this communicator's turn */
        unsigned spins = 0;
        while (!stop &&
               atomic_load_explicit(&j->comms[i]->turn, memory_order_acquire) != j->tickets[i])
            stop = sim_backoff(j->comms[i], &spins);
    }
    if (j->hang && !stop) /* C10D_SIM_HANG_AT: stuck until aborted */
        stop = wait_abort(j->ops[0].c);
    for (size_t i = 0; i < j->ncomms && !stop; i++)
        if (sim_comm_async_failed(j->comms[i])) /* C10D_SIM_ASYNC_ERROR_AT */
            stop = wait_abort(j->comms[i]);
    if (!stop) /* a task that starts after the abort touches nothing */
        stop = job_aborted(j) ? -1 : run_p2p(j);
    for (size_t i = 0; i < j->nops && !stop; i++)
        if (!is_p2p(&j->ops[i]))
            stop = run_coll(&j->ops[i]);
    for (size_t i = 0; i < j->ncomms; i++) {
        struct sim_comm *c = j->comms[i];
        atomic_fetch_add_explicit(&c->turn, 1, memory_order_release);
        pthread_mutex_lock(&c->mu);
        c->pending--;
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
        sim_comm_unref(c);
    }
    atomic_fetch_add(&sim_tasks_done, 1);
    free(j);
}

static pthread_mutex_t submit_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t tasks_submitted; /* under submit_mu: C10D_SIM_HANG_AT counts these */

static int same_stream(cudaStream_t a, cudaStream_t b)
{
    int da = a == NULL || a == cudaStreamLegacy || a == cudaStreamPerThread;
    int db = b == NULL || b == cudaStreamLegacy || b == cudaStreamPerThread;
    return da ? db : a == b;
}

/* One job per stream, in the order the streams first appear. */
static ncclResult_t submit(const struct sim_op *ops, size_t nops)
{
    unsigned char *taken = calloc(nops, 1);
    if (taken == NULL) {
        sim_set_error("out of memory");
        return ncclSystemError;
    }
    ncclResult_t rc = ncclSuccess;
    pthread_mutex_lock(&submit_mu);
    for (size_t first = 0; first < nops; first++) {
        if (taken[first])
            continue;
        size_t n = 0;
        for (size_t i = first; i < nops; i++)
            n += same_stream(ops[i].stream, ops[first].stream);
        struct sim_job *j =
            calloc(1, sizeof *j + n * (sizeof *j->ops + sizeof *j->comms + sizeof *j->tickets));
        if (j == NULL) {
            sim_set_error("out of memory");
            rc = ncclSystemError;
            break;
        }
        j->ops = (struct sim_op *)(j + 1);
        j->tickets = (uint64_t *)(j->ops + n);
        j->comms = (struct sim_comm **)(j->tickets + n);
        for (size_t i = first; i < nops; i++) {
            if (!same_stream(ops[i].stream, ops[first].stream))
                continue;
            taken[i] = 1;
            j->ops[j->nops++] = ops[i];
            struct sim_comm *c = ops[i].c;
            size_t k = 0;
            while (k < j->ncomms && j->comms[k] != c)
                k++;
            if (k < j->ncomms)
                continue;
            j->comms[j->ncomms++] = c;
            j->tickets[k] = c->next_ticket++;
            atomic_fetch_add(&c->refs, 1);
            pthread_mutex_lock(&c->mu);
            c->pending++;
            pthread_mutex_unlock(&c->mu);
        }
        uint64_t seq = ++tasks_submitted;
        j->hang = j->ops[0].c->hang_at > 0 && seq == (uint64_t)j->ops[0].c->hang_at;
        /* Under submit_mu: a stream's queue order is its tickets' order. */
        if (sim_stream_enqueue(ops[first].stream, run_job, j) != cudaSuccess) {
            sim_set_error("%s: could not enqueue on the stream", kind_name[ops[first].kind]);
            rc = ncclUnhandledCudaError;
            j->hang = 0;
            for (size_t i = 0; i < j->ncomms; i++) /* runs as aborted, keeping the tickets */
                atomic_store(&j->comms[i]->aborted, 1);
            run_job(j);
        }
    }
    pthread_mutex_unlock(&submit_mu);
    free(taken);
    return rc;
}

/* --------------------------------------------------------------- groups */
static _Thread_local int t_depth;
static _Thread_local ncclResult_t t_group_error;
static _Thread_local struct sim_op *t_ops;
static _Thread_local size_t t_nops, t_cap;

/* nccl.h declares these without a prototype ("()"): give them one. */
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);

SIM_API ncclResult_t ncclGroupStart(void)
{
    if (t_depth++ == 0)
        t_group_error = ncclSuccess;
    return ncclSuccess;
}

/* NCCL makes a communicator's connections at its first launch, waiting for
 * the peers there, until they come or until ncclCommAbort, from another
 * thread, sets the abort flag NCCL's connection setup polls. The abort frees
 * the communicator: a reference keeps the simulation's record alive, and
 * nothing of the aborted group runs. */
static ncclResult_t first_launch(struct sim_comm *first)
{
    if (first->first_launch_delay_ms <= 0 || atomic_exchange(&first->launched, 1) != 0)
        return ncclSuccess;
    atomic_fetch_add(&first->refs, 1);
    for (long waited = 0; waited < first->first_launch_delay_ms; waited += 5) {
        if (atomic_load_explicit(&first->aborted, memory_order_acquire))
            break;
        usleep(5000);
    }
    ncclResult_t r = ncclSuccess;
    if (atomic_load_explicit(&first->aborted, memory_order_acquire)) {
        sim_set_error("ncclGroupEnd: the communicator was aborted while connecting");
        r = ncclInternalError;
    }
    sim_comm_unref(first);
    return r;
}

/* A nonblocking communicator's group is enqueued by a thread of NCCL's:
 * ncclGroupEnd answers ncclInProgress, and ncclCommGetAsyncError says
 * ncclInProgress (and an operation on the communicator is refused) until it
 * is done. Each op holds a reference to its communicator meanwhile. */
struct nb_group {
    struct sim_op *ops;
    size_t nops;
};

static void *nb_group_main(void *arg)
{
    struct nb_group *g = arg;
    usleep(300); /* always later than the call, never at once */
    ncclResult_t r = first_launch(g->ops[0].c);
    if (r == ncclSuccess)
        r = submit(g->ops, g->nops);
    for (size_t i = 0; i < g->nops; i++) {
        struct sim_comm *c = g->ops[i].c;
        pthread_mutex_lock(&c->mu);
        if (r != ncclSuccess && c->enqueue_error == ncclSuccess)
            c->enqueue_error = r;
        c->enqueuing--;
        pthread_mutex_unlock(&c->mu);
        sim_comm_unref(c);
    }
    free(g->ops);
    free(g);
    return NULL;
}

static ncclResult_t nb_group_start(struct sim_op *ops, size_t nops)
{
    struct nb_group *g = malloc(sizeof *g);
    if (g == NULL) {
        sim_set_error("out of memory");
        return ncclSystemError;
    }
    *g = (struct nb_group){ops, nops};
    for (size_t i = 0; i < nops; i++) {
        struct sim_comm *c = ops[i].c;
        atomic_fetch_add(&c->refs, 1);
        pthread_mutex_lock(&c->mu);
        c->enqueuing++;
        pthread_mutex_unlock(&c->mu);
    }
    pthread_t t;
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&t, &a, nb_group_main, g);
    pthread_attr_destroy(&a);
    if (rc != 0)
        nb_group_main(g); /* no thread: enqueue here, then say "in progress" anyway */
    return ncclInProgress;
}

SIM_API ncclResult_t ncclGroupEnd(void)
{
    sim_mark_context();
    if (t_depth == 0) {
        sim_set_error("ncclGroupEnd: no matching ncclGroupStart");
        return ncclInvalidUsage;
    }
    if (--t_depth > 0)
        return ncclSuccess;
    ncclResult_t r = t_group_error;
    if (r == ncclSuccess && t_nops > 0 && !t_ops[0].c->blocking) {
        r = nb_group_start(t_ops, t_nops); /* takes t_ops */
        t_ops = NULL;
        t_nops = t_cap = 0;
        return r;
    }
    if (r == ncclSuccess && t_nops > 0)
        r = first_launch(t_ops[0].c);
    if (r == ncclSuccess && t_nops > 0)
        r = submit(t_ops, t_nops);
    free(t_ops); /* a failed group runs nothing, as NCCL's */
    t_ops = NULL;
    t_nops = t_cap = 0;
    return r;
}

static ncclResult_t bad(struct sim_op *o, ncclResult_t r, const char *what, long v)
{
    sim_set_error("%s: %s %ld", kind_name[o->kind], what, v);
    return r;
}

static ncclResult_t check(struct sim_op *o, ncclComm_t comm)
{
    const char *who = kind_name[o->kind];
    struct sim_comm *c = sim_comm_get(comm);
    ncclResult_t r = sim_comm_check_ready(c, who);
    if (r != ncclSuccess)
        return r;
    if (sim_sticky() != cudaSuccess) {
        sim_set_error("%s: Cuda failure '%s'", who, cudaGetErrorString(sim_sticky()));
        return ncclUnhandledCudaError;
    }
    o->c = c;
    /* NCCL checks each buffer's attributes: device memory of another
     * device than the communicator's is refused. */
    const void *bufs[2] = {o->send, o->recv};
    for (int i = 0; i < 2; i++) {
        int d = bufs[i] != NULL ? sim_dev_ptr_device(bufs[i]) : -1;
        if (d >= 0 && d != c->device) {
            sim_set_error("%s: %s buffer allocated on device %d mismatches with NCCL device %d",
                          who, i == 0 ? "send" : "recv", d, c->device);
            return ncclInvalidArgument;
        }
    }
    size_t es = sim_dtype_size(o->dt);
    if (es == 0)
        return bad(o, ncclInvalidArgument, "invalid datatype", (long)o->dt);
    if (o->kind == K_ALLREDUCE || o->kind == K_REDUCE || o->kind == K_REDSCAT) {
        if ((int)o->op < 0)
            return bad(o, ncclInvalidArgument, "invalid reduction op", (long)o->op);
        if (o->op >= ncclNumOps) {
            int i = (int)o->op - (int)ncclNumOps;
            pthread_mutex_lock(&c->mu);
            struct sim_premul p = i < SIM_PREMUL_MAX ? c->premul[i] : (struct sim_premul){0};
            pthread_mutex_unlock(&c->mu);
            if (!p.used)
                return bad(o, ncclInvalidArgument, "invalid reduction op", (long)o->op);
            if (p.dt != o->dt)
                return bad(o, ncclInvalidArgument, "PreMulSum op made for another datatype, op",
                           (long)o->op);
            o->premul = 1;
            memcpy(o->scalar, p.value, sizeof o->scalar);
            o->scalar_ptr = p.ptr;
            o->op = ncclSum;
        }
    }
    /* Real NCCL has no fp8 average (seen on NCCL 2.28.9, H200). */
    if ((o->kind == K_ALLREDUCE || o->kind == K_REDUCE || o->kind == K_REDSCAT) &&
        o->op == ncclAvg && (o->dt == ncclFloat8e4m3 || o->dt == ncclFloat8e5m2) && o->count > 0)
        return bad(o, ncclInvalidArgument, "ncclAvg is not supported for fp8 datatype",
                   (long)o->dt);
    if ((o->kind == K_BCAST || o->kind == K_REDUCE || is_p2p(o)) &&
        (o->root < 0 || o->root >= c->nranks))
        return bad(o, ncclInvalidArgument, is_p2p(o) ? "invalid peer" : "invalid root",
                   (long)o->root);
    size_t mult = o->kind == K_ALLGATHER || o->kind == K_REDSCAT ? (size_t)c->nranks : 1;
    if (o->count > SIZE_MAX / es / mult)
        return bad(o, ncclInvalidArgument, "count too large:", (long)o->count);
    if (o->count > 0) {
        int root = o->root == c->rank;
        if (o->send == NULL && o->kind != K_RECV && (o->kind != K_BCAST || root))
            return bad(o, ncclInvalidArgument, "sendbuff is NULL, count", (long)o->count);
        if (o->recv == NULL && o->kind != K_SEND && (o->kind != K_REDUCE || root))
            return bad(o, ncclInvalidArgument, "recvbuff is NULL, count", (long)o->count);
    }
    if (!sim_stream_valid(o->stream))
        return bad(o, ncclInvalidArgument, "invalid stream", 0);
    return ncclSuccess;
}

/* Checks one call; in a group, collects it, else submits it at once. */
static ncclResult_t call(struct sim_op o, ncclComm_t comm)
{
    ncclResult_t r = check(&o, comm);
    if (t_depth == 0 && r == ncclSuccess && !o.c->blocking) {
        struct sim_op *one = malloc(sizeof *one);
        if (one == NULL) {
            sim_set_error("out of memory");
            return ncclSystemError;
        }
        *one = o;
        return nb_group_start(one, 1);
    }
    if (t_depth == 0)
        return r == ncclSuccess ? submit(&o, 1) : r;
    if (r == ncclSuccess && t_nops == t_cap) {
        size_t cap = t_cap ? 2 * t_cap : 16;
        struct sim_op *ops = realloc(t_ops, cap * sizeof *ops);
        if (ops == NULL) {
            sim_set_error("out of memory");
            r = ncclSystemError;
        } else {
            t_ops = ops;
            t_cap = cap;
        }
    }
    if (r == ncclSuccess)
        t_ops[t_nops++] = o;
    else if (t_group_error == ncclSuccess)
        t_group_error = r;
    return r;
}

SIM_API ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                                   ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                   cudaStream_t stream)
{
    return call((struct sim_op){.kind = K_ALLREDUCE,
                                .send = sendbuff,
                                .recv = recvbuff,
                                .count = count,
                                .dt = datatype,
                                .op = op,
                                .stream = stream},
                comm);
}

SIM_API ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                                   ncclDataType_t datatype, int root, ncclComm_t comm,
                                   cudaStream_t stream)
{
    return call((struct sim_op){.kind = K_BCAST,
                                .send = sendbuff,
                                .recv = recvbuff,
                                .count = count,
                                .dt = datatype,
                                .root = root,
                                .stream = stream},
                comm);
}

SIM_API ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count,
                                ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                                cudaStream_t stream)
{
    return call((struct sim_op){.kind = K_REDUCE,
                                .send = sendbuff,
                                .recv = recvbuff,
                                .count = count,
                                .dt = datatype,
                                .op = op,
                                .root = root,
                                .stream = stream},
                comm);
}

SIM_API ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                                   ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
    return call((struct sim_op){.kind = K_ALLGATHER,
                                .send = sendbuff,
                                .recv = recvbuff,
                                .count = sendcount,
                                .dt = datatype,
                                .stream = stream},
                comm);
}

SIM_API ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                                       ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                       cudaStream_t stream)
{
    return call((struct sim_op){.kind = K_REDSCAT,
                                .send = sendbuff,
                                .recv = recvbuff,
                                .count = recvcount,
                                .dt = datatype,
                                .op = op,
                                .stream = stream},
                comm);
}

SIM_API ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                              ncclComm_t comm, cudaStream_t stream)
{
    return call((struct sim_op){.kind = K_SEND,
                                .send = sendbuff,
                                .count = count,
                                .dt = datatype,
                                .root = peer,
                                .stream = stream},
                comm);
}

SIM_API ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                              ncclComm_t comm, cudaStream_t stream)
{
    return call((struct sim_op){.kind = K_RECV,
                                .recv = recvbuff,
                                .count = count,
                                .dt = datatype,
                                .root = peer,
                                .stream = stream},
                comm);
}
