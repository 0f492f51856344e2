/* test_gpusim: the CPU simulation of CUDA and NCCL (libc10d_gpusim.so, a
 * test double) against what the nccl backend's tests rely on. It links the
 * simulator directly (no dlopen) and forks real rank processes through
 * mp_harness; everything that starts simulator threads runs in a child, so
 * the cmocka process itself stays single-threaded. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "gpu/gpu_decls.h"

#include "mp_harness.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CK(expr)        MP_CHECK((expr) == 0, "%s", #expr) /* cudaSuccess / ncclSuccess */
#define NCK(expr, want) MP_CHECK((expr) == (want), "%s", ncclGetLastError(NULL))

struct job {
    ncclUniqueId id;
    int arg;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Runs fn on n forked ranks; fails the test unless every rank exits 0. */
static void run_ranks(int n, mp_rank_fn fn, struct job *j)
{
    struct mp_opts o = {0};
    o.nranks = n;
    o.timeout_s = 60;
    o.kill_on_failure = 1;
    struct mp_result res;
    assert_int_equal(mp_run(&o, fn, j, &res), 0);
}

static struct job new_job(int arg)
{
    struct job j;
    memset(&j, 0, sizeof j);
    assert_int_equal(ncclGetUniqueId(&j.id), ncclSuccess);
    j.arg = arg;
    return j;
}

/* The id's segment is gone from /dev/shm. */
static void assert_unlinked(const struct job *j)
{
    char path[160];
    snprintf(path, sizeof path, "/dev/shm%.64s", j->id.internal);
    assert_int_not_equal(access(path, F_OK), 0);
}

/* Each rank on a device of its own, as NCCL requires (main() gives the
 * simulation 8 devices). */
static int init(ncclComm_t *c, int n, int rank, const struct job *j)
{
    cudaSetDevice(rank);
    return ncclCommInitRankConfig(c, n, j->id, rank, NULL);
}

/* ---------------------------------------------------- small floats (test) */
/* Encodes an integer (|v| < 2048) as IEEE half, exactly. */
static uint16_t half_of_int(int v)
{
    uint16_t sign = v < 0 ? 0x8000 : 0;
    unsigned a = (unsigned)(v < 0 ? -v : v);
    if (a == 0)
        return sign;
    int e = 0;
    while ((a >> (e + 1)) != 0)
        e++;
    unsigned mant = e <= 10 ? a << (10 - e) : a >> (e - 10);
    return (uint16_t)(sign | ((e + 15) << 10) | (mant & 0x3ff));
}

/* ---------------------------------------------------------- all_reduce */
enum { T_F32, T_I64, T_F16 };
static const ncclDataType_t tdt[] = {ncclFloat32, ncclInt64, ncclFloat16};
static const size_t tsize[] = {4, 8, 2};

static double val(int t, int r, size_t i)
{
    if (t == T_I64)
        return (double)(i % 8) - 4 + (r == 0);
    if (t == T_F16 && i < 2) /* 1027+1024 = 2051 -> 2052, 1025+1024 = 2049 -> 2048 (ties to even) */
        return r == 0 ? (i == 0 ? 1027 : 1025) : r == 1 ? 1024 : 0;
    return (double)(i % 8) + r;
}

static void put(int t, void *buf, size_t i, double v)
{
    if (t == T_F32)
        ((float *)buf)[i] = (float)v;
    else if (t == T_I64)
        ((int64_t *)buf)[i] = (int64_t)v;
    else
        ((uint16_t *)buf)[i] = half_of_int((int)v);
}

static int same(int t, const void *buf, size_t i, double want)
{
    if (t == T_F32)
        return ((const float *)buf)[i] == (float)want;
    if (t == T_I64)
        return ((const int64_t *)buf)[i] == (int64_t)want;
    int w = (int)want;
    if (w == 2051) /* rounded to even */
        w = 2052;
    if (w == 2049)
        w = 2048;
    return ((const uint16_t *)buf)[i] == half_of_int(w);
}

/* op: ncclSum/ncclAvg/ncclMax, or ncclNumOps for PreMulSum (scalar rank+1). */
static int check_allreduce(ncclComm_t comm, cudaStream_t s, int rank, int n, int t, int op,
                           size_t count)
{
    size_t bytes = count * tsize[t];
    void *in, *out;
    CK(cudaMalloc(&in, bytes));
    CK(cudaMalloc(&out, bytes));
    for (size_t i = 0; i < count; i++)
        put(t, in, i, val(t, rank, i));
    ncclRedOp_t rop = (ncclRedOp_t)op;
    unsigned char scalar[8];
    if (op == ncclNumOps) {
        put(t, scalar, 0, rank + 1);
        CK(ncclRedOpCreatePreMulSum(&rop, scalar, tdt[t], ncclScalarHostImmediate, comm));
        memset(scalar, 0, sizeof scalar); /* read at creation */
    }
    CK(ncclAllReduce(in, out, count, tdt[t], rop, comm, s));
    CK(cudaStreamSynchronize(s));
    if (op == ncclNumOps)
        CK(ncclRedOpDestroy(rop, comm));
    for (size_t i = t == T_F16 && op != ncclSum ? 2 : 0; i < count; i++) {
        double sum = 0, max = -1e300;
        for (int r = 0; r < n; r++) {
            double v = val(t, r, i);
            sum += op == ncclNumOps ? v * (r + 1) : v;
            max = v > max ? v : max;
        }
        double want = op == ncclMax   ? max
                      : op == ncclAvg ? (t == T_I64 ? (double)((int64_t)sum / n) : sum / n)
                                      : sum;
        MP_CHECK(same(t, out, i, want), "type %d op %d element %zu: want %g", t, op, i, want);
    }
    CK(cudaFree(in));
    CK(cudaFree(out));
    return 0;
}

static pthread_mutex_t gate_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cv = PTHREAD_COND_INITIALIZER;
static int gate;

static void gate_wait(void *p)
{
    (void)p;
    pthread_mutex_lock(&gate_mu);
    while (!gate)
        pthread_cond_wait(&gate_cv, &gate_mu);
    pthread_mutex_unlock(&gate_mu);
}

static void gate_open(void)
{
    pthread_mutex_lock(&gate_mu);
    gate = 1;
    pthread_cond_broadcast(&gate_cv);
    pthread_mutex_unlock(&gate_mu);
}

static int allreduce_main(int rank, int n, void *arg)
{
    ncclComm_t comm;
    CK(init(&comm, n, rank, arg));
    cudaStream_t s;
    CK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, 0));
    int ops[] = {ncclSum, ncclAvg, ncclMax, ncclNumOps};
    for (int t = 0; t < 3; t++)
        for (int k = 0; k < 4; k++)
            if (check_allreduce(comm, s, rank, n, t, ops[k], t == T_F32 && k == 0 ? 300000 : 5000))
                return 1;
    /* In place, several chunks. */
    size_t count = 700000;
    float *buf;
    CK(cudaMalloc((void **)&buf, count * sizeof *buf));
    for (size_t i = 0; i < count; i++)
        buf[i] = (float)(rank * 10 + (int)(i % 5));
    CK(ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, comm, s));
    CK(cudaStreamSynchronize(s));
    for (size_t i = 0; i < count; i++)
        MP_CHECK(buf[i] == (float)(10 * n * (n - 1) / 2 + n * (int)(i % 5)), "in place %zu", i);
    /* PreMulSum with the scalar in device memory: read when the op runs. */
    float *dscalar, x = 1;
    CK(cudaMalloc((void **)&dscalar, sizeof *dscalar));
    CK(cudaMemcpy(dscalar, &x, sizeof x, cudaMemcpyHostToDevice));
    ncclRedOp_t pm;
    CK(ncclRedOpCreatePreMulSum(&pm, dscalar, ncclFloat32, ncclScalarDevice, comm));
    for (size_t i = 0; i < 10; i++)
        buf[i] = 1;
    CK(cudaLaunchHostFunc(s, gate_wait, NULL)); /* the op cannot run before the gate opens */
    CK(ncclAllReduce(buf, buf, 10, ncclFloat32, pm, comm, s));
    *dscalar = 0.5f;
    gate_open();
    CK(cudaStreamSynchronize(s));
    MP_CHECK(buf[0] == 0.5f * (float)n, "device scalar: %g", (double)buf[0]);
    CK(ncclRedOpDestroy(pm, comm));
    NCK(ncclRedOpDestroy(pm, comm), ncclInvalidArgument);
    CK(cudaFree(dscalar));
    CK(cudaFree(buf));
    CK(ncclCommDestroy(comm));
    CK(cudaStreamDestroy(s));
    return 0;
}

static void test_allreduce(void **state)
{
    (void)state;
    struct job j = new_job(0);
    run_ranks(3, allreduce_main, &j);
    assert_unlinked(&j);
}

/* The 8- and 16-bit float conversions, on a 1-rank communicator (PreMulSum
 * rounds through them). */
static int small_float_main(int rank, int n, void *arg)
{
    ncclComm_t comm;
    CK(init(&comm, n, rank, arg));
    struct {
        ncclDataType_t dt;
        unsigned x, scalar, want;
    } cases[] = {
        {ncclBfloat16, 0x3f81, 0x3f81, 0x3f82}, /* 1.0078125^2 = 1.01568... -> 1.015625 */
        {ncclBfloat16, 0x7f7f, 0x4000, 0x7f80}, /* max * 2 -> inf */
        {ncclFloat16, 0x7bff, 0x4000, 0x7c00},  /* 65504 * 2 -> inf */
        {ncclFloat16, 0x0001, 0x3800, 0x0000},  /* smallest subnormal / 2: tie -> 0 */
        {ncclFloat16, 0x0003, 0x3800, 0x0002},  /* 1.5 ulp: tie -> 2 */
        {ncclFloat8e4m3, 0x7e, 0x40, 0x7e},     /* 448 * 2 saturates */
        {ncclFloat8e4m3, 0x38, 0x38, 0x38},     /* 1 * 1 */
        {ncclFloat8e4m3, 0x01, 0x30, 0x00},     /* 2^-9 / 2: tie -> 0 */
        {ncclFloat8e4m3, 0x03, 0x30, 0x02},     /* 1.5 * 2^-9 -> 2 * 2^-9 */
        {ncclFloat8e4m3, 0xb8, 0x3c, 0xbc},     /* -1 * 1.5 */
        {ncclFloat8e5m2, 0x7b, 0x40, 0x7b},     /* 57344 * 2 saturates */
        {ncclFloat8e5m2, 0x3c, 0x3e, 0x3e},     /* 1 * 1.5 */
        {ncclFloat8e5m2, 0x3d, 0x3d, 0x3e},     /* 1.25^2 = 1.5625 -> 1.5 */
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        size_t es = cases[k].dt == ncclFloat16 || cases[k].dt == ncclBfloat16 ? 2 : 1;
        unsigned char in[2], out[2] = {0}, sc[2];
        memcpy(in, &cases[k].x, es); /* little endian */
        memcpy(sc, &cases[k].scalar, es);
        ncclRedOp_t op;
        CK(ncclRedOpCreatePreMulSum(&op, sc, cases[k].dt, ncclScalarHostImmediate, comm));
        CK(ncclAllReduce(in, out, 1, cases[k].dt, op, comm, NULL));
        CK(cudaStreamSynchronize(NULL));
        CK(ncclRedOpDestroy(op, comm));
        unsigned got = es == 2 ? (unsigned)(out[0] | out[1] << 8) : out[0];
        MP_CHECK(got == cases[k].want, "case %zu: 0x%x, want 0x%x", k, got, cases[k].want);
    }
    /* Every type and op runs; integers wrap; Avg truncates. */
    int8_t a = 100, b;
    CK(ncclAllReduce(&a, &b, 1, ncclInt8, ncclProd, comm, NULL));
    uint64_t u = 7, v;
    CK(ncclAllReduce(&u, &v, 1, ncclUint64, ncclMin, comm, NULL));
    CK(cudaStreamSynchronize(NULL));
    MP_CHECK(b == 100 && v == 7, "1-rank ops");
    CK(ncclCommDestroy(comm));
    return 0;
}

static void test_small_floats(void **state)
{
    (void)state;
    struct job j = new_job(0);
    run_ranks(1, small_float_main, &j);
}

/* ------------------------------------- gather, scatter, broadcast, reduce */
static int rooted_main(int rank, int n, void *arg)
{
    ncclComm_t comm;
    CK(init(&comm, n, rank, arg));
    cudaStream_t s;
    CK(cudaStreamCreateWithPriority(&s, 0, -5));
    size_t count = 200000; /* n * count * 4 > 1 MiB: several chunks */
    int32_t *buf;
    CK(cudaMalloc((void **)&buf, (size_t)n * count * sizeof *buf));
    /* all_gather in place: my block sits at rank * count. */
    for (size_t i = 0; i < count; i++)
        buf[(size_t)rank * count + i] = (int32_t)(rank * 1000000 + (int)i);
    CK(ncclAllGather(buf + (size_t)rank * count, buf, count, ncclInt32, comm, s));
    CK(cudaStreamSynchronize(s));
    for (int r = 0; r < n; r++)
        for (size_t i = 0; i < count; i++)
            MP_CHECK(buf[(size_t)r * count + i] == (int32_t)(r * 1000000 + (int)i), "ag %d %zu", r,
                     i);
    /* reduce_scatter in place: my result lands on my block. */
    for (size_t i = 0; i < (size_t)n * count; i++)
        buf[i] = (int32_t)(i % 1000) + rank;
    CK(ncclReduceScatter(buf, buf + (size_t)rank * count, count, ncclInt32, ncclSum, comm, s));
    CK(cudaStreamSynchronize(s));
    for (size_t i = 0; i < count; i++) {
        size_t g = (size_t)rank * count + i;
        MP_CHECK(buf[g] == (int32_t)(n * (int)(g % 1000) + n * (n - 1) / 2), "rs %zu: %d", i,
                 buf[g]);
    }
    /* reduce_scatter Max out of place. */
    int32_t *out;
    CK(cudaMalloc((void **)&out, count * sizeof *out));
    CK(ncclReduceScatter(buf, out, count, ncclInt32, ncclMax, comm, s));
    /* broadcast from rank 1 (non-root send buffers are not read) */
    double d[3] = {rank == 1 ? 1.5 : 0, rank == 1 ? -2.25 : 0, 7};
    CK(ncclBroadcast(rank == 1 ? d : NULL, d, 3, ncclFloat64, 1, comm, s));
    /* reduce Min to rank 2; the others' recv buffers are not written */
    int64_t in = 10 - rank, red = -1;
    CK(ncclReduce(&in, rank == n - 1 ? &red : NULL, 1, ncclInt64, ncclMin, n - 1, comm, s));
    CK(cudaStreamSynchronize(s));
    MP_CHECK(d[0] == 1.5 && d[1] == -2.25 && d[2] == 7, "broadcast %g %g", d[0], d[1]);
    MP_CHECK(rank != n - 1 || red == 10 - (n - 1), "reduce %lld", (long long)red);
    CK(cudaFree(out));
    CK(cudaFree(buf));
    CK(ncclCommDestroy(comm));
    return 0;
}

static void test_rooted_and_in_place(void **state)
{
    (void)state;
    struct job j = new_job(0);
    run_ranks(3, rooted_main, &j);
    assert_unlinked(&j);
}

/* ---------------------------------------------------------------- P2P */
static int p2p_main(int rank, int n, void *arg)
{
    ncclComm_t comm;
    CK(init(&comm, n, rank, arg));
    size_t count = 300000; /* more than a channel holds */
    int32_t *sendb, *recvb;
    CK(cudaMalloc((void **)&sendb, count * sizeof *sendb));
    CK(cudaMalloc((void **)&recvb, (size_t)n * count * sizeof *recvb));
    for (size_t i = 0; i < count; i++)
        sendb[i] = (int32_t)(rank * 7 + (int)i);
    /* A ring: everyone sends before anyone receives, in one group. */
    CK(ncclGroupStart());
    CK(ncclSend(sendb, count, ncclInt32, (rank + 1) % n, comm, NULL));
    CK(ncclRecv(recvb, count, ncclInt32, (rank + n - 1) % n, comm, NULL));
    CK(ncclGroupEnd());
    CK(cudaStreamSynchronize(NULL));
    int from = (rank + n - 1) % n;
    for (size_t i = 0; i < count; i++)
        MP_CHECK(recvb[i] == (int32_t)(from * 7 + (int)i), "ring %zu", i);
    /* All to all, self included, nested groups, two messages per pair. */
    CK(ncclGroupStart());
    for (int p = 0; p < n; p++) {
        CK(ncclGroupStart());
        CK(ncclSend(sendb, count / 2, ncclInt32, p, comm, NULL));
        CK(ncclSend(sendb + count / 2, count - count / 2, ncclInt32, p, comm, NULL));
        CK(ncclRecv(recvb + (size_t)p * count, count / 2, ncclInt32, p, comm, NULL));
        CK(ncclRecv(recvb + (size_t)p * count + count / 2, count - count / 2, ncclInt32, p, comm,
                    NULL));
        CK(ncclGroupEnd());
    }
    CK(ncclGroupEnd());
    CK(cudaDeviceSynchronize());
    for (int p = 0; p < n; p++)
        for (size_t i = 0; i < count; i++)
            MP_CHECK(recvb[(size_t)p * count + i] == (int32_t)(p * 7 + (int)i), "a2a %d %zu", p, i);
    /* Ungrouped small messages, ordered per pair. */
    if (rank == 0) {
        for (int32_t k = 0; k < 3; k++) {
            CK(ncclSend(&k, 1, ncclInt32, 1, comm, NULL));
            CK(cudaStreamSynchronize(NULL));
        }
    } else if (rank == 1) {
        int32_t got[3];
        for (int k = 0; k < 3; k++)
            CK(ncclRecv(&got[k], 1, ncclInt32, 0, comm, NULL));
        CK(cudaStreamSynchronize(NULL));
        MP_CHECK(got[0] == 0 && got[1] == 1 && got[2] == 2, "order");
    }
    CK(cudaFree(sendb));
    CK(cudaFree(recvb));
    CK(ncclCommDestroy(comm));
    return 0;
}

static void test_p2p(void **state)
{
    (void)state;
    struct job j = new_job(0);
    run_ranks(3, p2p_main, &j);
}

/* Zero counts: every call is legal and does nothing, NULL buffers too. */
static int zero_main(int rank, int n, void *arg)
{
    ncclComm_t comm;
    CK(init(&comm, n, rank, arg));
    CK(ncclAllReduce(NULL, NULL, 0, ncclFloat32, ncclSum, comm, NULL));
    CK(ncclBroadcast(NULL, NULL, 0, ncclInt8, 0, comm, NULL));
    CK(ncclReduce(NULL, NULL, 0, ncclBfloat16, ncclMax, 1, comm, NULL));
    CK(ncclAllGather(NULL, NULL, 0, ncclUint64, comm, NULL));
    CK(ncclReduceScatter(NULL, NULL, 0, ncclFloat8e4m3, ncclAvg, comm, NULL));
    CK(ncclGroupStart());
    CK(ncclSend(NULL, 0, ncclFloat64, (rank + 1) % n, comm, NULL));
    CK(ncclRecv(NULL, 0, ncclFloat64, (rank + n - 1) % n, comm, NULL));
    CK(ncclGroupEnd());
    CK(ncclGroupStart());
    CK(ncclGroupEnd()); /* empty */
    CK(cudaMemcpyAsync(NULL, NULL, 0, cudaMemcpyDefault, NULL));
    CK(cudaMemsetAsync(NULL, 0, 0, NULL));
    CK(cudaStreamSynchronize(NULL));
    CK(ncclCommDestroy(comm));
    return 0;
}

static void test_zero_count(void **state)
{
    (void)state;
    struct job j = new_job(0);
    run_ranks(2, zero_main, &j);
}

/* Communicators whose ranks are threads of one process. */
struct thr {
    struct job *j;
    int rank, rc;
};

static void *thread_rank(void *p)
{
    struct thr *t = p;
    ncclComm_t comm;
    t->rc = 1;
    if (init(&comm, 2, t->rank, t->j) != ncclSuccess)
        return NULL;
    cudaStream_t s;
    float x = (float)(t->rank + 1), y = 0;
    if (cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, 0) != cudaSuccess ||
        ncclAllReduce(&x, &y, 1, ncclFloat32, ncclSum, comm, s) != ncclSuccess ||
        cudaStreamSynchronize(s) != cudaSuccess || ncclCommDestroy(comm) != ncclSuccess ||
        cudaStreamDestroy(s) != cudaSuccess)
        return NULL;
    t->rc = y == 3.0f ? 0 : 1;
    return NULL;
}

static int threads_main(int rank, int n, void *arg)
{
    (void)rank;
    (void)n;
    struct thr t[2] = {{arg, 0, 1}, {arg, 1, 1}};
    pthread_t tid[2];
    for (int i = 0; i < 2; i++)
        MP_CHECK(pthread_create(&tid[i], NULL, thread_rank, &t[i]) == 0, "thread");
    for (int i = 0; i < 2; i++)
        pthread_join(tid[i], NULL);
    MP_CHECK(t[0].rc == 0 && t[1].rc == 0, "thread ranks failed");
    return 0;
}

static void test_thread_ranks(void **state)
{
    (void)state;
    struct job j = new_job(0);
    run_ranks(1, threads_main, &j);
    assert_unlinked(&j);
}

/* ------------------------------------------------------ streams, events */
static volatile int step;
static pthread_mutex_t step_mu = PTHREAD_MUTEX_INITIALIZER;

static void slow_set(void *p)
{
    (void)p;
    usleep(500000);
    pthread_mutex_lock(&step_mu);
    step = 1;
    pthread_mutex_unlock(&step_mu);
}

static void observe(void *p)
{
    pthread_mutex_lock(&step_mu);
    *(int *)p = step;
    pthread_mutex_unlock(&step_mu);
}

static int stream_main(int rank, int n, void *arg)
{
    (void)rank;
    (void)n;
    (void)arg;
    int count, dev, v;
    unsetenv("C10D_SIM_DEVICES"); /* the default: one device */
    CK(cudaGetDeviceCount(&count));
    MP_CHECK(count == 1, "devices %d", count);
    CK(cudaSetDevice(0));
    CK(cudaGetDevice(&dev));
    MP_CHECK(cudaSetDevice(1) == cudaErrorInvalidDevice, "set device 1");
    MP_CHECK(cudaGetLastError() == cudaErrorInvalidDevice && cudaGetLastError() == cudaSuccess,
             "last error");
    MP_CHECK(strcmp(cudaGetErrorString(cudaErrorNotReady), "device not ready") == 0, "string");
    CK(cudaRuntimeGetVersion(&v));
    MP_CHECK(v == 13000, "runtime %d", v);
    CK(ncclGetVersion(&v));
    MP_CHECK(v == NCCL_VERSION_CODE, "nccl %d", v);
    int lo, hi;
    CK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    MP_CHECK(lo == 0 && hi == -5, "priorities");
    setenv("C10D_SIM_DEVICES", "4", 1);
    CK(cudaGetDeviceCount(&count));
    CK(cudaSetDevice(3));
    MP_CHECK(count == 4, "C10D_SIM_DEVICES");
    CK(cudaSetDevice(0));
    setenv("C10D_SIM_DEVICES", "8", 1); /* main()'s */

    cudaStream_t a, b;
    cudaEvent_t e, never;
    CK(cudaStreamCreateWithPriority(&a, cudaStreamNonBlocking, 0));
    CK(cudaStreamCreateWithPriority(&b, cudaStreamNonBlocking, -1));
    CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&never, 0));
    CK(cudaEventQuery(never)); /* never recorded: complete */
    CK(cudaStreamWaitEvent(b, never, 0));
    /* b waits for a's slow host function without blocking the host. */
    int seen = -1;
    double t0 = now_s();
    CK(cudaLaunchHostFunc(a, slow_set, NULL));
    CK(cudaEventRecord(e, a));
    CK(cudaStreamWaitEvent(b, e, 0));
    CK(cudaLaunchHostFunc(b, observe, &seen));
    MP_CHECK(now_s() - t0 < 0.4, "the host blocked");
    MP_CHECK(cudaEventQuery(e) == cudaErrorNotReady, "event ready too early");
    MP_CHECK(cudaGetLastError() == cudaSuccess, "NotReady is not sticky");
    CK(cudaStreamSynchronize(b));
    MP_CHECK(seen == 1, "b ran before a's work: %d", seen);
    CK(cudaEventQuery(e));
    /* Re-recording: the wait is for the record made before it. */
    CK(cudaEventRecord(e, b));
    CK(cudaEventSynchronize(e));
    /* Copies and sets run in stream order; cudaMemcpy waits for the default stream. */
    char *d, h[64];
    CK(cudaMalloc((void **)&d, 64));
    MP_CHECK(((uintptr_t)d & 255) == 0, "alignment");
    CK(cudaMemsetAsync(d, 'x', 64, a));
    CK(cudaMemcpyAsync(d, "hello", 6, cudaMemcpyHostToDevice, a));
    CK(cudaStreamSynchronize(a));
    CK(cudaMemcpy(h, d, 64, cudaMemcpyDeviceToHost));
    MP_CHECK(strcmp(h, "hello") == 0 && h[6] == 'x' && h[63] == 'x', "copies");
    CK(cudaMemsetAsync(d, 'y', 64, NULL));
    CK(cudaMemcpy(h, d, 1, cudaMemcpyDeviceToHost));
    MP_CHECK(h[0] == 'y', "cudaMemcpy did not wait for the default stream");
    MP_CHECK(cudaMemcpy(h, d, 1, (enum cudaMemcpyKind)9) == cudaErrorInvalidMemcpyDirection,
             "kind");
    enum cudaStreamCaptureStatus cs;
    CK(cudaStreamIsCapturing(a, &cs));
    MP_CHECK(cs == cudaStreamCaptureStatusNone, "capture");
    enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    CK(cudaThreadExchangeStreamCaptureMode(&mode));
    CK(cudaThreadExchangeStreamCaptureMode(&mode));
    MP_CHECK(mode == cudaStreamCaptureModeRelaxed, "capture mode");
    void *ph;
    CK(cudaHostAlloc(&ph, 100, 0));
    CK(cudaFreeHost(ph));
    /* Destroy returns at once and the queued work still runs; the device's
     * synchronisations wait for it, cudaFree's too, as CUDA's do (a buffer
     * an aborted communicator's last kernel still wrote was freed under it). */
    pthread_mutex_lock(&step_mu);
    step = 0;
    seen = -1;
    pthread_mutex_unlock(&step_mu);
    CK(cudaLaunchHostFunc(a, slow_set, NULL));
    CK(cudaLaunchHostFunc(a, observe, &seen));
    t0 = now_s();
    CK(cudaStreamDestroy(a));
    MP_CHECK(now_s() - t0 < 0.3, "cudaStreamDestroy waited");
    CK(cudaFree(d));
    pthread_mutex_lock(&step_mu);
    v = seen;
    pthread_mutex_unlock(&step_mu);
    MP_CHECK(v == 1, "cudaFree returned before a destroyed stream's work ran (%d)", v);
    CK(cudaDeviceSynchronize());
    CK(cudaStreamSynchronize(NULL));
    MP_CHECK(cudaStreamDestroy(NULL) == cudaErrorInvalidResourceHandle, "destroy default");
    CK(cudaEventDestroy(e));
    CK(cudaEventDestroy(never));
    CK(cudaStreamDestroy(b));
    return 0;
}

static void test_streams_events(void **state)
{
    (void)state;
    run_ranks(1, stream_main, NULL);
}

/* ------------------------------------------------------ creation paths */
static int nonblocking_main(int rank, int n, void *arg)
{
    if (rank == 1)
        setenv("C10D_SIM_INIT_DELAY_MS", "300", 1);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclComm_t comm;
    double t0 = now_s();
    const struct job *j = arg;
    CK(cudaSetDevice(rank));
    NCK(ncclCommInitRankConfig(&comm, n, j->id, rank, &cfg), ncclInProgress);
    MP_CHECK(comm != NULL, "no comm");
    int cnt;
    if (rank == 1) /* not before C10D_SIM_INIT_DELAY_MS */
        NCK(ncclCommCount(comm, &cnt), ncclInvalidArgument);
    ncclResult_t st = ncclInProgress;
    while (st == ncclInProgress) {
        CK(ncclCommGetAsyncError(comm, &st));
        usleep(1000);
    }
    MP_CHECK(st == ncclSuccess, "init: %s", ncclGetErrorString(st));
    MP_CHECK(rank != 1 || now_s() - t0 >= 0.3, "INIT_DELAY_MS");
    CK(ncclCommCount(comm, &cnt));
    MP_CHECK(cnt == n, "count");
    /* A nonblocking split: every rank in, colors by parity, keys reversed. */
    ncclComm_t child;
    NCK(ncclCommSplit(comm, rank % 2, -rank, &child, &cfg), ncclInProgress);
    do {
        CK(ncclCommGetAsyncError(child, &st));
        usleep(1000);
    } while (st == ncclInProgress);
    MP_CHECK(st == ncclSuccess, "split: %s", ncclGetErrorString(st));
    int crank;
    CK(ncclCommUserRank(child, &crank));
    CK(ncclCommCount(child, &cnt));
    int members = (n - rank % 2 + 1) / 2, above = 0;
    for (int r = rank + 2; r < n; r += 2)
        above++;
    MP_CHECK(cnt == members && crank == above, "child %d/%d, want %d/%d", crank, cnt, above,
             members);
    /* A nonblocking communicator's op is enqueued later: "in progress" until
     * then (and the communicator refuses anything else meanwhile). */
    int32_t x = rank, y = 0;
    NCK(ncclAllReduce(&x, &y, 1, ncclInt32, ncclSum, child, NULL), ncclInProgress);
    do {
        CK(ncclCommGetAsyncError(child, &st));
        usleep(100);
    } while (st == ncclInProgress);
    MP_CHECK(st == ncclSuccess, "all_reduce: %s", ncclGetErrorString(st));
    CK(cudaStreamSynchronize(NULL));
    MP_CHECK(y == (rank % 2 ? 1 + 3 : 0 + 2), "child sum %d", y); /* n == 4 */
    CK(ncclCommFinalize(child));
    CK(ncclCommDestroy(child));
    CK(ncclCommDestroy(comm));
    return 0;
}

static void test_nonblocking_init_and_split(void **state)
{
    (void)state;
    struct job j = new_job(0);
    run_ranks(4, nonblocking_main, &j);
    assert_unlinked(&j);
}

static int split_main(int rank, int n, void *arg)
{
    ncclComm_t comm, child;
    CK(init(&comm, n, rank, arg));
    /* Rank 1 opts out; 0 and 2 form a child ordered by key: 2 first. */
    CK(ncclCommSplit(comm, rank == 1 ? NCCL_SPLIT_NOCOLOR : 5, -rank, &child, NULL));
    if (rank == 1) {
        MP_CHECK(child == NULL, "NOCOLOR gives NULL");
    } else {
        int crank, cnt;
        CK(ncclCommUserRank(child, &crank));
        CK(ncclCommCount(child, &cnt));
        MP_CHECK(cnt == 2 && crank == (rank == 2 ? 0 : 1), "child rank %d", crank);
        int64_t v = crank == 0 ? 42 : 0;
        CK(ncclBroadcast(&v, &v, 1, ncclInt64, 0, child, NULL));
        CK(cudaStreamSynchronize(NULL));
        MP_CHECK(v == 42, "child broadcast");
        CK(ncclCommDestroy(child));
    }
    /* The parent still works after the split. */
    float x = 1, y;
    CK(ncclAllReduce(&x, &y, 1, ncclFloat32, ncclSum, comm, NULL));
    CK(cudaStreamSynchronize(NULL));
    MP_CHECK(y == (float)n, "parent after split");
    /* A second split, everyone in one color: a fresh segment. */
    CK(ncclCommSplit(comm, 0, 0, &child, NULL));
    CK(ncclAllReduce(&x, &y, 1, ncclFloat32, ncclMax, child, NULL));
    CK(cudaStreamSynchronize(NULL));
    CK(ncclCommDestroy(child));
    CK(ncclCommDestroy(comm));
    return 0;
}

static void test_split(void **state)
{
    (void)state;
    struct job j = new_job(0);
    run_ranks(3, split_main, &j);
}

static int shrink_main(int rank, int n, void *arg)
{
    ncclComm_t comm, child;
    CK(init(&comm, n, rank, arg));
    if (rank == 1)
        _exit(0); /* gone before anyone shrinks */
    usleep(100000);
    int excl[] = {1};
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = rank == 0; /* one of each */
    ncclResult_t r = ncclCommShrink(comm, excl, 1, &child, &cfg, NCCL_SHRINK_DEFAULT);
    MP_CHECK(r == (rank == 0 ? ncclSuccess : ncclInProgress), "shrink: %d", r);
    ncclResult_t st;
    do
        CK(ncclCommGetAsyncError(child, &st));
    while (st == ncclInProgress && usleep(1000) == 0);
    MP_CHECK(st == ncclSuccess, "shrink: %s", ncclGetErrorString(st));
    int crank, cnt;
    CK(ncclCommUserRank(child, &crank));
    CK(ncclCommCount(child, &cnt));
    MP_CHECK(cnt == 2 && crank == (rank == 0 ? 0 : 1), "shrunk rank %d of %d", crank, cnt);
    int32_t v = rank, out[2];
    NCK(ncclAllGather(&v, out, 1, ncclInt32, child, NULL),
        rank == 0 ? ncclSuccess : ncclInProgress);
    do /* the nonblocking one is enqueued later */
        CK(ncclCommGetAsyncError(child, &st));
    while (st == ncclInProgress && usleep(100) == 0);
    CK(cudaStreamSynchronize(NULL));
    MP_CHECK(out[0] == 0 && out[1] == 2, "gathered %d %d", out[0], out[1]);
    NCK(ncclCommShrink(comm, excl, 1, &child, NULL, 0x4), ncclInvalidArgument);
    int self[] = {rank};
    NCK(ncclCommShrink(comm, self, 1, &child, NULL, 0), ncclInvalidArgument);
    CK(ncclCommDestroy(child));
    CK(ncclCommAbort(comm));
    return 0;
}

static void test_shrink(void **state)
{
    (void)state;
    struct job j = new_job(0);
    run_ranks(3, shrink_main, &j);
}

/* ------------------------------------------------------- fault knobs */
static void set_flag(void *p)
{
    *(volatile int *)p = 1;
}

static int hang_main(int rank, int n, void *arg)
{
    setenv("C10D_SIM_HANG_AT", "2", 1); /* each process's 2nd task */
    ncclComm_t comm;
    CK(init(&comm, n, rank, arg));
    cudaStream_t s;
    CK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, 0));
    float x = 1, y = 0;
    CK(ncclAllReduce(&x, &y, 1, ncclFloat32, ncclSum, comm, s));
    CK(cudaStreamSynchronize(s));
    MP_CHECK(y == (float)n, "first op");
    cudaEvent_t e;
    CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    CK(ncclAllReduce(&x, &y, 1, ncclFloat32, ncclSum, comm, s));
    CK(cudaEventRecord(e, s));
    volatile int after = 0;
    CK(cudaLaunchHostFunc(s, set_flag, (void *)&after));
    usleep(300000);
    MP_CHECK(cudaEventQuery(e) == cudaErrorNotReady, "the hung op completed");
    ncclResult_t st;
    CK(ncclCommGetAsyncError(comm, &st));
    MP_CHECK(st == ncclSuccess, "a hang is no error");
    double t0 = now_s();
    CK(ncclCommAbort(comm)); /* returns with the task stuck on the stream */
    MP_CHECK(now_s() - t0 < 1.0, "abort took %.2f s", now_s() - t0);
    CK(cudaEventSynchronize(e)); /* the stuck task ended */
    CK(cudaStreamSynchronize(s));
    MP_CHECK(after == 1, "later work on the stream ran");
    CK(cudaEventDestroy(e));
    CK(cudaStreamDestroy(s));
    return 0;
}

static void test_hang_at_and_abort(void **state)
{
    (void)state;
    struct job j = new_job(0);
    run_ranks(2, hang_main, &j);
    assert_unlinked(&j);
}

static int async_error_main(int rank, int n, void *arg)
{
    setenv("C10D_SIM_ASYNC_ERROR_AT", "2", 1);
    setenv("C10D_SIM_ABORT_DELAY_MS", "300", 1);
    ncclComm_t comm;
    CK(init(&comm, n, rank, arg));
    ncclResult_t st;
    int32_t x = 1, y = 0;
    for (int k = 0; k < 2; k++) {
        CK(ncclCommGetAsyncError(comm, &st));
        MP_CHECK(st == ncclSuccess, "error after %d tasks", k);
        CK(ncclAllReduce(&x, &y, 1, ncclInt32, ncclSum, comm, NULL));
        CK(cudaStreamSynchronize(NULL));
        MP_CHECK(y == n, "op %d", k);
    }
    CK(ncclCommGetAsyncError(comm, &st));
    MP_CHECK(st == ncclRemoteError, "async error: %s", ncclGetErrorString(st));
    MP_CHECK(strstr(ncclGetLastError(comm), "remote process exited") != NULL, "text: %s",
             ncclGetLastError(comm));
    /* Later tasks of the communicator block until it is aborted. */
    cudaEvent_t e;
    CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    CK(ncclAllReduce(&x, &y, 1, ncclInt32, ncclSum, comm, NULL));
    CK(cudaEventRecord(e, NULL));
    usleep(200000);
    MP_CHECK(cudaEventQuery(e) == cudaErrorNotReady, "a task ran after the error");
    double t0 = now_s();
    CK(ncclCommAbort(comm));
    double took = now_s() - t0;
    MP_CHECK(took >= 0.3 && took < 2.0, "C10D_SIM_ABORT_DELAY_MS: abort took %.2f s", took);
    CK(cudaEventSynchronize(e));
    CK(cudaEventDestroy(e));
    return 0;
}

static void test_async_error_and_abort_delay(void **state)
{
    (void)state;
    struct job j = new_job(0);
    run_ranks(2, async_error_main, &j);
}

static int init_never_main(int rank, int n, void *arg)
{
    if (rank == 1)
        setenv("C10D_SIM_INIT_NEVER", "1", 1);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclComm_t comm;
    const struct job *j = arg;
    CK(cudaSetDevice(rank));
    NCK(ncclCommInitRankConfig(&comm, n, j->id, rank, &cfg), ncclInProgress);
    ncclResult_t st;
    for (int k = 0; k < 300; k++) {
        CK(ncclCommGetAsyncError(comm, &st));
        MP_CHECK(st == ncclInProgress, "init finished without rank 1");
        usleep(1000);
    }
    NCK(ncclAllReduce(NULL, NULL, 0, ncclInt8, ncclSum, comm, NULL), ncclInvalidArgument);
    CK(ncclCommAbort(comm));
    return 0;
}

static void test_init_never(void **state)
{
    (void)state;
    struct job j = new_job(0);
    run_ranks(2, init_never_main, &j);
    assert_unlinked(&j);
}

/* ------------------------------------------------------ argument errors */
static int args_main(int rank, int n, void *arg)
{
    ncclComm_t comm;
    const struct job *j = arg;
    NCK(ncclCommInitRankConfig(&comm, n, j->id, 1, NULL), ncclInvalidArgument);
    MP_CHECK(strstr(ncclGetLastError(NULL), "rank 1") != NULL, "%s", ncclGetLastError(NULL));
    NCK(ncclCommInitRankConfig(NULL, n, j->id, 0, NULL), ncclInvalidArgument);
    ncclUniqueId junk;
    memset(&junk, 'z', sizeof junk);
    NCK(ncclCommInitRankConfig(&comm, n, junk, 0, NULL), ncclInvalidArgument);
    ncclConfig_t raw;
    memset(&raw, 0, sizeof raw);
    NCK(ncclCommInitRankConfig(&comm, n, j->id, 0, &raw), ncclInvalidArgument);
    CK(ncclCommInitRankScalable(&comm, n, rank, 1, (ncclUniqueId *)&j->id, NULL));
    float x = 0;
    NCK(ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, NULL, NULL), ncclInvalidArgument);
    NCK(ncclAllReduce(&x, &x, 1, (ncclDataType_t)12, ncclSum, comm, NULL), ncclInvalidArgument);
    MP_CHECK(strstr(ncclGetLastError(comm), "datatype") != NULL, "%s", ncclGetLastError(comm));
    NCK(ncclAllReduce(&x, &x, 1, ncclFloat32, (ncclRedOp_t)9, comm, NULL), ncclInvalidArgument);
    MP_CHECK(strstr(ncclGetLastError(comm), "op") != NULL, "%s", ncclGetLastError(comm));
    NCK(ncclSend(&x, 1, ncclFloat32, 1, comm, NULL), ncclInvalidArgument);
    MP_CHECK(strstr(ncclGetLastError(comm), "peer") != NULL, "%s", ncclGetLastError(comm));
    NCK(ncclBroadcast(&x, &x, 1, ncclFloat32, -1, comm, NULL), ncclInvalidArgument);
    NCK(ncclAllReduce(NULL, &x, 1, ncclFloat32, ncclSum, comm, NULL), ncclInvalidArgument);
    ncclRedOp_t pm;
    double dd = 2;
    CK(ncclRedOpCreatePreMulSum(&pm, &dd, ncclFloat64, ncclScalarHostImmediate, comm));
    NCK(ncclAllReduce(&x, &x, 1, ncclFloat32, pm, comm, NULL), ncclInvalidArgument);
    CK(ncclRedOpDestroy(pm, comm));
    NCK(ncclRedOpDestroy(ncclSum, comm), ncclInvalidArgument);
    NCK(ncclGroupEnd(), ncclInvalidUsage);
    /* A failed call poisons its group: nothing runs, ncclGroupEnd reports it. */
    CK(ncclGroupStart());
    CK(ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, comm, NULL));
    NCK(ncclSend(&x, 1, ncclFloat32, 3, comm, NULL), ncclInvalidArgument);
    NCK(ncclGroupEnd(), ncclInvalidArgument);
    ncclComm_t child = NULL;
    NCK(ncclCommSplit(comm, -7, 0, &child, NULL), ncclInvalidArgument);
    MP_CHECK(strcmp(ncclGetErrorString(ncclRemoteError),
                    "remote process exited or there was a network error") == 0,
             "string");
    CK(ncclCommAbort(NULL));
    CK(ncclCommDestroy(NULL));
    CK(ncclCommDestroy(comm));
    return 0;
}

static void test_argument_errors(void **state)
{
    (void)state;
    struct job j = new_job(0);
    run_ranks(1, args_main, &j);
}

/* Two ranks on one device: NCCL 2.28 refuses them (every rank, naming
 * both); 2.30.3+ with NCCL_MULTI_RANK_GPU_ENABLE=1 takes them. */
static int same_device_main(int rank, int n, void *arg)
{
    const struct job *j = arg;
    if (j->arg) {
        setenv("C10D_SIM_NCCL_VERSION", "23007", 1);
        setenv("NCCL_MULTI_RANK_GPU_ENABLE", "1", 1);
    }
    CK(cudaSetDevice(0));
    ncclComm_t comm = NULL;
    ncclResult_t r = ncclCommInitRankConfig(&comm, n, j->id, rank, NULL);
    if (!j->arg) {
        MP_CHECK(r == ncclInvalidUsage, "two ranks on device 0: %d", r);
        MP_CHECK(strstr(ncclGetLastError(NULL), "Duplicate GPU detected : rank 0 and rank 1") !=
                     NULL,
                 "message: %s", ncclGetLastError(NULL));
        return 0;
    }
    MP_CHECK(r == ncclSuccess, "multi-rank GPU enabled: %d %s", r, ncclGetLastError(NULL));
    int32_t x = rank + 1, y = 0;
    CK(ncclAllReduce(&x, &y, 1, ncclInt32, ncclSum, comm, NULL));
    CK(cudaStreamSynchronize(NULL));
    MP_CHECK(y == 3, "sum %d", y);
    CK(ncclCommDestroy(comm));
    return 0;
}

static void test_one_device_two_ranks(void **state)
{
    (void)state;
    struct job j = new_job(0);
    run_ranks(2, same_device_main, &j);
    j = new_job(1);
    run_ranks(2, same_device_main, &j);
}

int main(void)
{
    setenv("C10D_SIM_DEVICES", "8", 1); /* each rank on a device of its own */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_streams_events),
        cmocka_unit_test(test_one_device_two_ranks),
        cmocka_unit_test(test_allreduce),
        cmocka_unit_test(test_small_floats),
        cmocka_unit_test(test_rooted_and_in_place),
        cmocka_unit_test(test_p2p),
        cmocka_unit_test(test_zero_count),
        cmocka_unit_test(test_thread_ranks),
        cmocka_unit_test(test_nonblocking_init_and_split),
        cmocka_unit_test(test_split),
        cmocka_unit_test(test_shrink),
        cmocka_unit_test(test_hang_at_and_abort),
        cmocka_unit_test(test_async_error_and_abort_delay),
        cmocka_unit_test(test_init_never),
        cmocka_unit_test(test_argument_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
