/* The nccl backend through the public API, on 1, 2 and 3 real processes
 * (env:// rendezvous), CUDA buffers. In CI the CUDA runtime and NCCL are the
 * CPU simulation (test/gpusim/, named by C10D_CUDART_LIBRARY and
 * C10D_NCCL_LIBRARY); on a machine with a GPU the same binary runs against
 * the real libraries when those variables are unset. Checks: every op x
 * dtype x reduce op against references computed on the host; PyTorch's
 * rejections; stream order (a write enqueued on the caller's stream just
 * before an op is seen by it); c10d_work_wait_stream; a collective that
 * never ends (timeout on every rank, abort within its bound); an async
 * error; a rank that never joins init; split; a loop timer that keeps
 * firing while a communicator initialises; and a missing library. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "gpu/gpu_api.h"
#include "gpu/nan_check.h"
#include "bench/data.h"
#include "c10d.h"
#include "engine/env.h"
#include "mp_harness.h"

#include <dirent.h>
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static const struct c10d__cudart_api *cu;
static int fails;

#define EXPECT(cond, ...)                                                                          \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "[rank %d] %s:%d: ", rank, __FILE__, __LINE__);                        \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            if (++fails > 20)                                                                      \
                return 1;                                                                          \
        }                                                                                          \
    } while (0)

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void *dev_alloc(size_t bytes)
{
    void *p = NULL;
    if (cu->cudaMalloc(&p, bytes > 0 ? bytes : 1) != cudaSuccess)
        abort();
    return p;
}

static void to_dev(void *dst, const void *src, size_t bytes)
{
    if (bytes > 0 && cu->cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice) != cudaSuccess)
        abort();
}

static void dev_zero(void *p, size_t bytes)
{
    cu->cudaMemsetAsync(p, 0, bytes, 0);
    cu->cudaDeviceSynchronize();
}

static void to_host(void *dst, const void *src, size_t bytes)
{
    if (bytes > 0 && cu->cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost) != cudaSuccess)
        abort();
}

/* This rank's device: LOCAL_RANK modulo the devices visible, as a job with
 * one GPU per rank has it (ctest gives the simulation three devices, so
 * ranks of one communicator sit on different devices). Set by init_group. */
static int my_device;

static c10d_op_opts gpu_opts(void)
{
    c10d_op_opts o = C10D_OP_OPTS_INIT;
    o.device_type = C10D_DEVICE_CUDA;
    o.device_index = my_device;
    o.premul_factor = 0.5;
    return o;
}

/* Waits for the work, then for the device (the caller's stream). Takes the
 * work's address: the call that fills it is an argument too. */
static int finish(int rc, c10d_work **w)
{
    if (rc != 0)
        return rc;
    rc = c10d_work_wait_release(*w);
    if (rc == 0) /* a failed op's stream may be stuck until the abort */
        cu->cudaDeviceSynchronize();
    return rc;
}

/* Set before init_group: nonblocking NCCL communicators. */
static int use_nonblocking;

/* Loads CUDA (once) and makes the group on this rank's device. */
/* 1: CUDA buffers go to the tcp backend (staged through pinned host memory)
 * instead of nccl: the same checks, with the host backend's rules. */
static int use_tcp_cuda;
/* Non-NULL: the group's backend string as it is (no host backend, say). */
static const char *backend_override;

static c10d_pg *init_group(int bind, int64_t timeout_ms)
{
    if (c10d__cuda_load(&cu) != 0) {
        fprintf(stderr, "%s\n", c10d_last_error());
        return NULL;
    }
    int ndev = 0;
    const char *local = getenv("LOCAL_RANK");
    if (cu->cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1)
        return NULL;
    my_device = (local != NULL ? atoi(local) : 0) % ndev;
    if (cu->cudaSetDevice(my_device) != cudaSuccess)
        return NULL;
    c10d_nccl_opts no = C10D_NCCL_OPTS_INIT;
    no.nonblocking = use_nonblocking;
    c10d_pg_opts po = C10D_PG_OPTS_INIT;
    po.nccl = &no;
    po.backend = backend_override != NULL ? backend_override
                 : use_tcp_cuda           ? "cpu:tcp,cuda:tcp"
                                          : "cpu:tcp,cuda:nccl";
    po.timeout_ms = timeout_ms;
    po.bind_device = bind;
    po.device_index = my_device;
    c10d_pg *pg = NULL;
    if (c10d_pg_init(&po, &pg) != 0) {
        fprintf(stderr, "init: %s\n", c10d_last_error());
        return NULL;
    }
    return pg;
}

/* ------------------------------------------------------------ reductions */

static double expected(int n, size_t i, c10d_dtype dt, c10d_reduce_op op)
{
    if (op == C10D_AVG && !data_is_float(dt)) {
        int64_t sum = (int64_t)data_reduced(n, i, dt, C10D_SUM, 0);
        return (double)(sum / n);
    }
    return data_reduced(n, i, dt, op, 0.5);
}

static int check_all_reduce(c10d_pg *pg, int rank, int n, c10d_dtype dt, c10d_reduce_op op,
                            size_t count, int in_place)
{
    size_t es = c10d_dtype_size(dt), bytes = count * es;
    char *h = malloc(bytes + 1);
    void *send = dev_alloc(bytes), *recv = dev_alloc(bytes);
    data_fill(h, count, 0, rank, dt, op);
    to_dev(send, h, bytes);
    c10d_op_opts o = gpu_opts();
    c10d_work *w = NULL;
    void *dst = in_place ? send : recv;
    int rc = finish(c10d_all_reduce(pg, send, dst, count, dt, op, &o, &w), &w);
    int bitwise = op == C10D_BAND || op == C10D_BOR || op == C10D_BXOR;
    int premul_bad = op == C10D_PREMUL_SUM &&
                     (!data_is_float(dt) || dt == C10D_FLOAT8_E4M3 || dt == C10D_FLOAT8_E5M2);
    int avg_bad =
        op == C10D_AVG && (dt == C10D_BOOL || dt == C10D_FLOAT8_E4M3 || dt == C10D_FLOAT8_E5M2);
    if (use_tcp_cuda) {
        /* The host backend's rules: what c10d_reduce_op_check accepts works. */
        if (c10d_reduce_op_check(op, dt) != 0) {
            EXPECT(rc == C10D_EINVAL, "tcp all_reduce %s %s: expected rejection, got %d (%s)",
                   c10d_dtype_name(dt), c10d_reduce_op_name(op), rc, c10d_last_error());
            cu->cudaFree(send), cu->cudaFree(recv), free(h);
            return 0;
        }
        bitwise = premul_bad = avg_bad = 0;
    }
    if (bitwise || premul_bad || avg_bad) {
        char want[96];
        snprintf(want, sizeof want,
                 bitwise ? "Cannot use ReduceOp.%s with NCCL" : "Cannot use ReduceOp.%s",
                 c10d_reduce_op_name(op));
        EXPECT(rc == C10D_EINVAL && strstr(c10d_last_error(), want) != NULL,
               "all_reduce %s %s: expected rejection, got %d (%s)", c10d_dtype_name(dt),
               c10d_reduce_op_name(op), rc, c10d_last_error());
    } else {
        EXPECT(rc == 0, "all_reduce %s %s count %zu: %d %s", c10d_dtype_name(dt),
               c10d_reduce_op_name(op), count, rc, c10d_last_error());
        to_host(h, dst, bytes);
        for (size_t i = 0; rc == 0 && i < count; i++)
            if (!data_close(data_load(h, i, dt), expected(n, i, dt, op), dt)) {
                EXPECT(0, "all_reduce %s %s count %zu%s: [%zu] = %g, want %g", c10d_dtype_name(dt),
                       c10d_reduce_op_name(op), count, in_place ? " in place" : "", i,
                       data_load(h, i, dt), expected(n, i, dt, op));
                break;
            }
    }
    cu->cudaFree(send), cu->cudaFree(recv), free(h);
    return 0;
}

/* reduce, reduce_scatter (both forms), broadcast, all_gather (both forms),
 * gather, scatter, all_to_all (both forms) on one dtype. */
static int check_others(c10d_pg *pg, int rank, int n, c10d_dtype dt, size_t count)
{
    size_t es = c10d_dtype_size(dt), blk = count * es, all = blk * (size_t)n;
    char *h = malloc(all + 1), *got = malloc(all + 1);
    void *send = dev_alloc(all), *recv = dev_alloc(all);
    void *blocks[MP_MAX_RANKS];
    for (int r = 0; r < n; r++)
        blocks[r] = dev_alloc(blk);
    c10d_op_opts o = gpu_opts();
    c10d_work *w = NULL;
    int root = n - 1, rc;

    data_fill(h, count, 0, rank, dt, C10D_MAX);
    to_dev(send, h, blk);
    rc = finish(
        c10d_reduce(pg, send, rank == root ? recv : NULL, count, dt, C10D_MAX, root, &o, &w), &w);
    EXPECT(rc == 0, "reduce %s: %s", c10d_dtype_name(dt), c10d_last_error());
    if (rank == root) {
        to_host(got, recv, blk);
        for (size_t i = 0; i < count; i++)
            if (!data_close(data_load(got, i, dt), data_reduced(n, i, dt, C10D_MAX, 0), dt)) {
                EXPECT(0, "reduce %s [%zu]", c10d_dtype_name(dt), i);
                break;
            }
    }

    data_fill(h, count * (size_t)n, 0, rank, dt, C10D_SUM);
    to_dev(send, h, all);
    rc = finish(c10d_reduce_scatter(pg, send, recv, count, dt, C10D_SUM, &o, &w), &w);
    EXPECT(rc == 0, "reduce_scatter %s: %s", c10d_dtype_name(dt), c10d_last_error());
    to_host(got, recv, blk);
    for (size_t i = 0; rc == 0 && i < count; i++)
        if (!data_close(data_load(got, i, dt),
                        data_reduced(n, (size_t)rank * count + i, dt, C10D_SUM, 0), dt)) {
            EXPECT(0, "reduce_scatter %s [%zu]", c10d_dtype_name(dt), i);
            break;
        }
    const void *sends[MP_MAX_RANKS];
    for (int r = 0; r < n; r++)
        sends[r] = (const char *)send + (size_t)r * blk;
    dev_zero(recv, blk);
    rc = finish(c10d_reduce_scatter_list(pg, sends, recv, count, dt, C10D_SUM, &o, &w), &w);
    EXPECT(rc == 0, "reduce_scatter_list %s: %s", c10d_dtype_name(dt), c10d_last_error());
    to_host(got, recv, blk);
    for (size_t i = 0; rc == 0 && i < count; i++)
        if (!data_close(data_load(got, i, dt),
                        data_reduced(n, (size_t)rank * count + i, dt, C10D_SUM, 0), dt)) {
            EXPECT(0, "reduce_scatter_list %s [%zu]", c10d_dtype_name(dt), i);
            break;
        }

    /* broadcast from root, in place on the others' recv */
    data_fill(h, count, 0, root, dt, C10D_SUM);
    to_dev(send, h, blk);
    rc = finish(c10d_broadcast(pg, rank == root ? send : NULL, recv, count, dt, root, &o, &w), &w);
    EXPECT(rc == 0, "broadcast %s: %s", c10d_dtype_name(dt), c10d_last_error());
    to_host(got, recv, blk);
    EXPECT(rc != 0 || memcmp(got, h, blk) == 0, "broadcast %s: wrong data", c10d_dtype_name(dt));

    /* all_gather, flat and list */
    data_fill(h, count, 0, rank, dt, C10D_SUM);
    to_dev(send, h, blk);
    rc = finish(c10d_all_gather(pg, send, recv, count, dt, &o, &w), &w);
    EXPECT(rc == 0, "all_gather %s: %s", c10d_dtype_name(dt), c10d_last_error());
    to_host(got, recv, all);
    for (int r = 0; rc == 0 && r < n; r++) {
        data_fill(h, count, 0, r, dt, C10D_SUM);
        EXPECT(memcmp(got + (size_t)r * blk, h, blk) == 0, "all_gather %s: block %d",
               c10d_dtype_name(dt), r);
    }
    rc = finish(c10d_all_gather_list(pg, send, blocks, count, dt, &o, &w), &w);
    EXPECT(rc == 0, "all_gather_list %s: %s", c10d_dtype_name(dt), c10d_last_error());
    for (int r = 0; rc == 0 && r < n; r++) {
        data_fill(h, count, 0, r, dt, C10D_SUM);
        to_host(got, blocks[r], blk);
        EXPECT(memcmp(got, h, blk) == 0, "all_gather_list %s: block %d", c10d_dtype_name(dt), r);
    }

    /* gather to root, then scatter from it */
    data_fill(h, count, 0, rank, dt, C10D_SUM);
    to_dev(send, h, blk);
    rc = finish(c10d_gather(pg, send, rank == root ? recv : NULL, count, dt, root, &o, &w), &w);
    EXPECT(rc == 0, "gather %s: %s", c10d_dtype_name(dt), c10d_last_error());
    if (rank == root) {
        to_host(got, recv, all);
        for (int r = 0; r < n; r++) {
            data_fill(h, count, 0, r, dt, C10D_SUM);
            EXPECT(memcmp(got + (size_t)r * blk, h, blk) == 0, "gather %s: block %d",
                   c10d_dtype_name(dt), r);
        }
    }
    dev_zero(send, blk);
    rc = finish(c10d_scatter(pg, rank == root ? recv : NULL, send, count, dt, root, &o, &w), &w);
    EXPECT(rc == 0, "scatter %s: %s", c10d_dtype_name(dt), c10d_last_error());
    to_host(got, send, blk);
    data_fill(h, count, 0, rank, dt, C10D_SUM);
    EXPECT(rc != 0 || memcmp(got, h, blk) == 0, "scatter %s: wrong data", c10d_dtype_name(dt));

    /* all_to_all_single, even; block r of rank s holds s*n + r's values */
    for (int r = 0; r < n; r++)
        data_fill(h + (size_t)r * blk, count, 0, rank * n + r, dt, C10D_SUM);
    to_dev(send, h, all);
    rc = finish(c10d_all_to_all_single(pg, send, recv, count * (size_t)n, NULL, NULL, dt, &o, &w),
                &w);
    EXPECT(rc == 0, "all_to_all %s: %s", c10d_dtype_name(dt), c10d_last_error());
    to_host(got, recv, all);
    for (int r = 0; rc == 0 && r < n; r++) {
        data_fill(h, count, 0, r * n + rank, dt, C10D_SUM);
        EXPECT(memcmp(got + (size_t)r * blk, h, blk) == 0, "all_to_all %s: block %d",
               c10d_dtype_name(dt), r);
    }
    for (int r = 0; r < n; r++)
        cu->cudaFree(blocks[r]);
    cu->cudaFree(send), cu->cudaFree(recv), free(h), free(got);
    return 0;
}

/* Uneven all_to_all: rank s sends s + d + 1 elements to rank d. */
static int check_uneven(c10d_pg *pg, int rank, int n)
{
    size_t sc[MP_MAX_RANKS], rcn[MP_MAX_RANKS], st = 0, rt = 0;
    for (int p = 0; p < n; p++) {
        sc[p] = (size_t)(rank + p + 1);
        rcn[p] = (size_t)(p + rank + 1);
        st += sc[p], rt += rcn[p];
    }
    int32_t *h = malloc(st * 4), *got = malloc(rt * 4);
    size_t k = 0;
    for (int p = 0; p < n; p++)
        for (size_t i = 0; i < sc[p]; i++)
            h[k++] = rank * 1000 + p * 100 + (int32_t)i;
    void *send = dev_alloc(st * 4), *recv = dev_alloc(rt * 4);
    to_dev(send, h, st * 4);
    c10d_op_opts o = gpu_opts();
    c10d_work *w;
    int rc = finish(c10d_all_to_all_single(pg, send, recv, st, sc, rcn, C10D_INT32, &o, &w), &w);
    EXPECT(rc == 0, "uneven all_to_all: %s", c10d_last_error());
    to_host(got, recv, rt * 4);
    k = 0;
    for (int p = 0; rc == 0 && p < n; p++)
        for (size_t i = 0; i < rcn[p]; i++, k++)
            EXPECT(got[k] == p * 1000 + rank * 100 + (int32_t)i, "uneven all_to_all [%zu]", k);
    cu->cudaFree(send), cu->cudaFree(recv), free(h), free(got);
    return 0;
}

/* A ring of send/recv (a pair's communicator each: the group made none for
 * P2P), a batch, a coalesced pair of all_reduces, a barrier, ANY_SOURCE. */
static int check_p2p_and_lists(c10d_pg *pg, int rank, int n)
{
    c10d_op_opts o = gpu_opts();
    int64_t mine = 100 + rank, got = -1;
    void *sb = dev_alloc(8), *rb = dev_alloc(8);
    to_dev(sb, &mine, 8);
    c10d_work *ws, *wr;
    int next = (rank + 1) % n, prev = (rank + n - 1) % n;
    int rc = 0;
    if (n > 1) {
        /* Even ranks send first: each pair's communicator is made by both sides. */
        if (rank % 2 == 0) {
            rc = finish(c10d_send(pg, sb, 1, C10D_INT64, next, 0, &o, &ws), &ws);
            rc = rc ? rc : finish(c10d_recv(pg, rb, 1, C10D_INT64, prev, 0, &o, &wr), &wr);
        } else {
            rc = finish(c10d_recv(pg, rb, 1, C10D_INT64, prev, 0, &o, &wr), &wr);
            rc = rc ? rc : finish(c10d_send(pg, sb, 1, C10D_INT64, next, 0, &o, &ws), &ws);
        }
        EXPECT(rc == 0, "send/recv ring: %s", c10d_last_error());
        to_host(&got, rb, 8);
        EXPECT(rc != 0 || got == 100 + prev, "ring got %lld", (long long)got);
    }
    /* NCCL has no receive from any source (tcp has, and is tested on the host). */
    if (!use_tcp_cuda)
        EXPECT(c10d_recv(pg, rb, 1, C10D_INT64, C10D_ANY_SOURCE, 0, &o, &wr) == C10D_EINVAL &&
                   strstr(c10d_last_error(), "any source") != NULL,
               "ANY_SOURCE: %s", c10d_last_error());
    c10d_p2p_op ops[2] = {{C10D_P2P_SEND, sb, 1, C10D_INT64, next, 0},
                          {C10D_P2P_RECV, rb, 1, C10D_INT64, prev, 0}};
    dev_zero(rb, 8);
    if (n > 1) {
        rc = finish(c10d_batch_isend_irecv(pg, ops, 2, &o, &ws), &ws);
        EXPECT(rc == 0, "batch: %s", c10d_last_error());
        to_host(&got, rb, 8);
        EXPECT(rc != 0 || got == 100 + prev, "batch got %lld", (long long)got);
    }

    float one = 1.0f, two = 2.0f, a = 0, b = 0;
    void *da = dev_alloc(4), *db = dev_alloc(4);
    to_dev(da, &one, 4), to_dev(db, &two, 4);
    c10d_op_opts plain = gpu_opts();
    EXPECT(c10d_coalesce_begin(pg) == 0, "coalesce_begin: %s", c10d_last_error());
    EXPECT(c10d_all_reduce(pg, da, da, 1, C10D_FLOAT32, C10D_SUM, &plain, NULL) == 0, "coal 1");
    EXPECT(c10d_all_reduce(pg, db, db, 1, C10D_FLOAT32, C10D_MAX, &plain, NULL) == 0, "coal 2");
    rc = finish(c10d_coalesce_end(pg, &o, &ws), &ws);
    EXPECT(rc == 0, "coalesced: %s", c10d_last_error());
    to_host(&a, da, 4), to_host(&b, db, 4);
    EXPECT(a == (float)n && b == 2.0f, "coalesced got %g %g", a, b);
    rc = finish(c10d_barrier(pg, &o, &ws), &ws);
    EXPECT(rc == 0, "barrier: %s", c10d_last_error());
    cu->cudaFree(sb), cu->cudaFree(rb), cu->cudaFree(da), cu->cudaFree(db);
    return 0;
}

/* all_gather_v on device buffers: rank r gives r + 1 floats. */
static int check_all_gather_v(c10d_pg *pg, int rank, int n)
{
    size_t counts[8], total = 0;
    for (int j = 0; j < n; j++)
        total += counts[j] = (size_t)j + 1;
    float mine[8], got[64];
    for (int k = 0; k <= rank; k++)
        mine[k] = (float)(rank * 10 + k);
    float *dsend = dev_alloc(sizeof mine), *drecv = dev_alloc(total * sizeof(float));
    to_dev(dsend, mine, (size_t)(rank + 1) * sizeof(float));
    c10d_op_opts o = gpu_opts();
    c10d_work *w;
    int rc = finish(c10d_all_gather_v(pg, dsend, drecv, counts, C10D_FLOAT32, &o, &w), &w);
    EXPECT(rc == 0, "all_gather_v: %s", c10d_last_error());
    to_host(got, drecv, total * sizeof(float));
    size_t at = 0;
    for (int j = 0; j < n && rc == 0; j++)
        for (size_t e = 0; e < counts[j]; e++, at++)
            EXPECT(got[at] == (float)(j * 10 + (int)e), "all_gather_v: rank %d's %zu: %g", j, e,
                   got[at]);
    /* gather_list to rank 0: a batch of send/recv, the root's own included. */
    float *blocks[8];
    for (int j = 0; j < n; j++)
        blocks[j] = dev_alloc(sizeof(float));
    rc = finish(c10d_gather_list(pg, dsend, rank == 0 ? (void *const *)blocks : NULL, 1,
                                 C10D_FLOAT32, 0, &o, &w),
                &w);
    EXPECT(rc == 0, "gather_list: %s", c10d_last_error());
    for (int j = 0; rank == 0 && rc == 0 && j < n; j++) {
        float v = -1;
        to_host(&v, blocks[j], sizeof v);
        EXPECT(v == (float)(j * 10), "gather_list from %d: %g", j, v);
    }
    for (int j = 0; j < n; j++)
        cu->cudaFree(blocks[j]);
    cu->cudaFree(dsend), cu->cudaFree(drecv);
    return 0;
}

/* The uneven forms with a zero block (rank 1's), on nccl one op of their own
 * (grouped broadcasts / reduces; the flight recorder shows ALLGATHER and
 * REDUCE_SCATTER), and PREMUL_SUM's factor in device memory. cuda:tcp runs
 * all_gather_v as all_to_all and refuses the other two. */
static int check_uneven_and_device_factor(c10d_pg *pg, int rank, int n)
{
    size_t counts[8], total = 0, off[8];
    for (int j = 0; j < n; j++) {
        off[j] = total;
        total += counts[j] = j == 1 ? 0 : (size_t)j + 2;
    }
    float mine[16], got[64], want;
    for (size_t k = 0; k < counts[rank]; k++)
        mine[k] = (float)(rank * 10) + (float)k;
    float *dsend = dev_alloc(sizeof mine), *drecv = dev_alloc(total * sizeof(float));
    to_dev(dsend, mine, counts[rank] * sizeof(float));
    c10d_op_opts o = gpu_opts();
    c10d_work *w;
    c10d_flight_recorder_reset();
    int rc = finish(c10d_all_gather_v(pg, dsend, drecv, counts, C10D_FLOAT32, &o, &w), &w);
    EXPECT(rc == 0, "all_gather_v with a zero block: %s", c10d_last_error());
    to_host(got, drecv, total * sizeof(float));
    for (int j = 0; j < n && rc == 0; j++)
        for (size_t e = 0; e < counts[j]; e++)
            EXPECT(got[off[j] + e] == (float)(j * 10) + (float)e, "all_gather_v: rank %d's %zu: %g",
                   j, e, got[off[j] + e]);
    char *fr = NULL;
    EXPECT(c10d_flight_recorder_dump_json(0, &fr) == 0, "dump: %s", c10d_last_error());
    EXPECT(fr != NULL && strstr(fr, use_tcp_cuda ? ":all_to_all\"" : ":all_gather\"") != NULL,
           "flight recorder after all_gather_v: %s", fr != NULL ? fr : "(none)");
    free(fr);
    /* Wrong: this rank's count differs from its block; a NULL recv. */
    if (!use_tcp_cuda) {
        EXPECT(c10d_all_gather_v(pg, dsend, NULL, counts, C10D_FLOAT32, &o, &w) == C10D_EINVAL,
               "all_gather_v with a NULL recv");
    }
    /* reduce_scatter_v: rank r's block j element e is r + 100 j + e. */
    float *rs_send = dev_alloc(total * sizeof(float)), *rs_recv = dev_alloc(16 * sizeof(float));
    float *dfactor = dev_alloc(sizeof(float)), two = 2.0f;
    to_dev(dfactor, &two, sizeof two);
    for (int j = 0; j < n; j++)
        for (size_t e = 0; e < counts[j]; e++)
            got[off[j] + e] = (float)rank + 100.0f * (float)j + (float)e;
    to_dev(rs_send, got, total * sizeof(float));
    for (int pass = 0; pass < 2; pass++) {
        c10d_op_opts ro = gpu_opts(); /* premul_factor 0.5: the device's 2 wins */
        ro.premul_factor_dev = dfactor;
        c10d_reduce_op op = pass == 0 ? C10D_SUM : C10D_PREMUL_SUM;
        rc = finish(c10d_reduce_scatter_v(pg, rs_send, rs_recv, counts, C10D_FLOAT32, op, &ro, &w),
                    &w);
        if (use_tcp_cuda) {
            EXPECT(rc == C10D_EUNSUPPORTED, "cuda:tcp reduce_scatter_v refused: %d %s", rc,
                   c10d_last_error());
            continue;
        }
        EXPECT(rc == 0, "reduce_scatter_v %s: %s", c10d_reduce_op_name(op), c10d_last_error());
        float res[16];
        to_host(res, rs_recv, counts[rank] * sizeof(float));
        for (size_t e = 0; e < counts[rank] && rc == 0; e++) {
            want = (float)(n * (n - 1) / 2) + (float)n * (100.0f * (float)rank + (float)e);
            want *= pass == 0 ? 1.0f : 2.0f;
            EXPECT(res[e] == want, "reduce_scatter_v %s [%zu]: %g, want %g",
                   c10d_reduce_op_name(op), e, res[e], want);
        }
    }
    if (!use_tcp_cuda) {
        fr = NULL;
        EXPECT(c10d_flight_recorder_dump_json(0, &fr) == 0 && fr != NULL &&
                   strstr(fr, ":reduce_scatter\"") != NULL,
               "flight recorder after reduce_scatter_v");
        free(fr);
    }
    /* all_reduce PREMUL_SUM with the factor on the device, float64 too. */
    double *d64 = dev_alloc(2 * sizeof(double)), *f64 = dev_alloc(sizeof(double));
    double v64[2] = {rank + 1.0, 0.25}, three = 3.0;
    to_dev(d64, v64, sizeof v64), to_dev(f64, &three, sizeof three);
    c10d_op_opts po = gpu_opts();
    po.premul_factor_dev = f64;
    rc = finish(c10d_all_reduce(pg, d64, d64, 2, C10D_FLOAT64, C10D_PREMUL_SUM, &po, &w), &w);
    if (use_tcp_cuda) {
        EXPECT(rc == C10D_EINVAL && strstr(c10d_last_error(), "premul_factor_dev") != NULL,
               "cuda:tcp refuses a device factor: %d %s", rc, c10d_last_error());
    } else {
        EXPECT(rc == 0, "all_reduce PREMUL_SUM, device factor: %s", c10d_last_error());
        to_host(v64, d64, sizeof v64);
        EXPECT(v64[0] == 3.0 * n * (n + 1) / 2 && v64[1] == 0.75 * n,
               "all_reduce PREMUL_SUM, device factor: %g %g", v64[0], v64[1]);
    }
    /* Host buffers: the factor must be a host value. */
    double h = 1;
    c10d_op_opts hopt = C10D_OP_OPTS_INIT;
    hopt.premul_factor_dev = &three;
    rc = c10d_all_reduce(pg, &h, &h, 1, C10D_FLOAT64, C10D_PREMUL_SUM, &hopt, &w);
    EXPECT(rc == C10D_EINVAL && strstr(c10d_last_error(), "premul_factor_dev") != NULL,
           "host buffers refuse a device factor: %d %s", rc, c10d_last_error());
    cu->cudaFree(d64), cu->cudaFree(f64), cu->cudaFree(dfactor);
    cu->cudaFree(rs_send), cu->cudaFree(rs_recv), cu->cudaFree(dsend), cu->cudaFree(drecv);
    return 0;
}

/* 40 coalesced all_reduces of distinct device buffers: 80 buffers in one op
 * (cuda:tcp stages each; it used to stop at 64, so the list form of all_to_all
 * failed from 33 ranks). */
static int check_many_buffers(c10d_pg *pg, int rank, int n)
{
    enum { K = 40 };
    c10d_op_opts o = gpu_opts();
    float *in[K], *out[K];
    for (int k = 0; k < K; k++) {
        float v = (float)k;
        in[k] = dev_alloc(4), out[k] = dev_alloc(4);
        to_dev(in[k], &v, 4);
    }
    EXPECT(c10d_coalesce_begin(pg) == 0, "coalesce_begin: %s", c10d_last_error());
    for (int k = 0; k < K; k++)
        EXPECT(c10d_all_reduce(pg, in[k], out[k], 1, C10D_FLOAT32, C10D_SUM, &o, NULL) == 0,
               "coalesced %d: %s", k, c10d_last_error());
    c10d_work *w;
    int rc = finish(c10d_coalesce_end(pg, &o, &w), &w);
    EXPECT(rc == 0, "80 buffers in one op: %s", c10d_last_error());
    for (int k = 0; k < K && rc == 0; k++) {
        float got = -1;
        to_host(&got, out[k], 4);
        EXPECT(got == (float)(k * n), "buffer %d: %g", k, got);
    }
    for (int k = 0; k < K; k++)
        cu->cudaFree(in[k]), cu->cudaFree(out[k]);
    return 0;
}

static void slow_write(void *arg)
{
    /* A kernel-like write on the caller's stream, late on purpose. */
    struct timespec ts = {0, 200 * 1000000L};
    nanosleep(&ts, NULL);
    *(float *)arg = 5.0f;
}

/* Stream order: the op sees a write enqueued on the caller's stream just
 * before it; c10d_work_wait_stream orders a later copy after the op. */
static int check_streams(c10d_pg *pg, int rank, int n)
{
    cudaStream_t st;
    EXPECT(cu->cudaStreamCreateWithPriority(&st, cudaStreamNonBlocking, 0) == cudaSuccess,
           "stream");
    float *buf = dev_alloc(4), out = 0;
    float *host = NULL;
    cu->cudaHostAlloc((void **)&host, 4, 0);
    *host = 0;
    c10d_op_opts o = gpu_opts();
    o.stream = st;
    cu->cudaMemsetAsync(buf, 0, 4, st);
    /* The write goes to host memory the device can read in both worlds. */
    cu->cudaLaunchHostFunc(st, slow_write, host);
    cu->cudaMemcpyAsync(buf, host, 4, cudaMemcpyHostToDevice, st);
    c10d_work *w;
    int rc = c10d_all_reduce(pg, buf, buf, 1, C10D_FLOAT32, C10D_SUM, &o, &w);
    EXPECT(rc == 0, "stream all_reduce: %s", c10d_last_error());
    if (rc == 0) {
        EXPECT(c10d_work_wait_stream(w, st) == 0, "wait_stream: %s", c10d_last_error());
        cu->cudaMemcpyAsync(&out, buf, 4, cudaMemcpyDeviceToHost, st);
        cu->cudaStreamSynchronize(st);
        EXPECT(out == 5.0f * (float)n, "stream order: got %g, want %g", out, 5.0 * n);
        EXPECT(c10d_work_wait_release(w) == 0, "wait: %s", c10d_last_error());
    }
    cu->cudaFree(buf);
    cu->cudaFreeHost(host);
    cu->cudaStreamDestroy(st);
    return 0;
}

/* tcp with CUDA buffers: a write the caller enqueues on its stream right
 * after the call must not reach the op's input (the caller's stream waits
 * for the input copy). A large op issued just before, from another stream,
 * keeps the copy stream busy, so that without that wait the write would
 * land before the small op's input copy ran. */
static int check_write_after(c10d_pg *pg, int rank, int n)
{
    cudaStream_t st, st2;
    EXPECT(cu->cudaStreamCreateWithPriority(&st, cudaStreamNonBlocking, 0) == cudaSuccess &&
               cu->cudaStreamCreateWithPriority(&st2, cudaStreamNonBlocking, 0) == cudaSuccess,
           "streams");
    size_t big_n = (size_t)16 << 20;
    float *big = dev_alloc(big_n * 4);
    float *a = dev_alloc(4), *b = dev_alloc(4), mine = (float)(rank + 1), late = 1000.0f, out = 0;
    to_dev(a, &mine, 4);
    c10d_op_opts o = gpu_opts(), o2 = gpu_opts();
    o.stream = st;
    o2.stream = st2;
    c10d_work *w, *w2;
    int rc2 = c10d_all_reduce(pg, big, big, big_n, C10D_FLOAT32, C10D_SUM, &o2, &w2);
    EXPECT(rc2 == 0, "big all_reduce: %s", c10d_last_error());
    int rc = c10d_all_reduce(pg, a, b, 1, C10D_FLOAT32, C10D_SUM, &o, &w);
    EXPECT(rc == 0, "all_reduce: %s", c10d_last_error());
    cu->cudaMemcpyAsync(a, &late, 4, cudaMemcpyHostToDevice, st);
    if (rc2 == 0)
        EXPECT(c10d_work_wait_release(w2) == 0, "big wait: %s", c10d_last_error());
    if (rc == 0) {
        EXPECT(c10d_work_wait_release(w) == 0, "wait: %s", c10d_last_error());
        to_host(&out, b, 4);
        EXPECT(out == (float)(n * (n + 1) / 2), "a write after the call reached the op: got %g",
               out);
    }
    cu->cudaStreamSynchronize(st);
    cu->cudaFree(a), cu->cudaFree(b), cu->cudaFree(big);
    cu->cudaStreamDestroy(st);
    cu->cudaStreamDestroy(st2);
    return 0;
}

/* NCCL's in-place forms: all_gather's input is block `rank` of its output,
 * reduce_scatter's output is block `rank` of its input (on rank 0 the same
 * pointer as the whole buffer, with another size). */
static int check_in_place(c10d_pg *pg, int rank, int n)
{
    enum { C = 4 };
    float h[MP_MAX_RANKS * C];
    float *buf = dev_alloc((size_t)n * C * 4);
    c10d_op_opts o = gpu_opts();
    c10d_work *w;
    for (int i = 0; i < n * C; i++)
        h[i] = i / C == rank ? (float)(rank + 1) : -1.0f;
    to_dev(buf, h, (size_t)n * C * 4);
    int rc = finish(c10d_all_gather(pg, buf + rank * C, buf, C, C10D_FLOAT32, &o, &w), &w);
    EXPECT(rc == 0, "in-place all_gather: %s", c10d_last_error());
    to_host(h, buf, (size_t)n * C * 4);
    for (int i = 0; rc == 0 && i < n * C; i++)
        if (h[i] != (float)(i / C + 1)) {
            EXPECT(0, "in-place all_gather: [%d] = %g, want %d", i, h[i], i / C + 1);
            break;
        }
    for (int i = 0; i < n * C; i++)
        h[i] = (float)((rank + 1) * (i / C + 1));
    to_dev(buf, h, (size_t)n * C * 4);
    rc =
        finish(c10d_reduce_scatter(pg, buf, buf + rank * C, C, C10D_FLOAT32, C10D_SUM, &o, &w), &w);
    EXPECT(rc == 0, "in-place reduce_scatter: %s", c10d_last_error());
    to_host(h, buf + rank * C, C * 4);
    float want = (float)((rank + 1) * n * (n + 1) / 2);
    for (int i = 0; rc == 0 && i < C; i++)
        if (h[i] != want) {
            EXPECT(0, "in-place reduce_scatter: [%d] = %g, want %g", i, h[i], want);
            break;
        }
    cu->cudaFree(buf);
    return 0;
}

static const c10d_dtype dtypes[] = {C10D_FLOAT32, C10D_FLOAT64,     C10D_FLOAT16,    C10D_BFLOAT16,
                                    C10D_INT8,    C10D_UINT8,       C10D_INT32,      C10D_INT64,
                                    C10D_BOOL,    C10D_FLOAT8_E4M3, C10D_FLOAT8_E5M2};
#define NDT (sizeof dtypes / sizeof *dtypes)

static int ops_main(int rank, int n, void *arg)
{
    use_tcp_cuda = arg == (void *)3;
    int bind = arg != NULL && !use_tcp_cuda;
    if (use_tcp_cuda && n == 3) {
        /* Small segments: large all_reduce, broadcast and reduce go in pieces. */
        setenv("C10D_TCP_CUDA_SEGMENT", "1000", 1);
        c10d__env_reload();
    }
    use_nonblocking = arg == (void *)2;
    c10d_pg *pg = init_group(bind, 60000);
    MP_CHECK(pg != NULL, "init");
    static const size_t sizes[] = {0, 1, 7, 1000};
    for (size_t d = 0; d < NDT; d++)
        for (int op = 0; op < C10D_REDUCE_OP_COUNT; op++)
            for (size_t s = 0; s < 4; s++)
                if (check_all_reduce(pg, rank, n, dtypes[d], (c10d_reduce_op)op, sizes[s], s % 2))
                    return 1;
    /* Larger than the simulation's chunk, in place. */
    if (check_all_reduce(pg, rank, n, C10D_FLOAT32, C10D_SUM, 600000, 1))
        return 1;
    for (size_t d = 0; d < NDT; d++)
        if (check_others(pg, rank, n, dtypes[d], d % 2 ? 5 : 300))
            return 1;
    if (check_uneven(pg, rank, n) || check_p2p_and_lists(pg, rank, n) || check_streams(pg, rank, n))
        return 1;
    if (check_in_place(pg, rank, n) || (use_tcp_cuda && check_write_after(pg, rank, n)))
        return 1;
    if (check_many_buffers(pg, rank, n) || check_all_gather_v(pg, rank, n) ||
        check_uneven_and_device_factor(pg, rank, n))
        return 1;
    /* Host buffers in the same group go to tcp. */
    int64_t v = rank;
    MP_CHECK(c10d_all_reduce_sync(pg, &v, &v, 1, C10D_INT64, C10D_SUM) == 0, "host op: %s",
             c10d_last_error());
    MP_CHECK(v == (int64_t)n * (n - 1) / 2, "host sum");
    if (bind && n > 1) {
        /* Split from the bound group's communicator: ranks 0 and n-1. */
        int ends[2] = {0, n - 1};
        c10d_pg *sub;
        MP_CHECK(c10d_pg_new_group(pg, ends, 2, NULL, &sub) == 0, "new_group: %s",
                 c10d_last_error());
        if (c10d_pg_is_member(sub) &&
            check_all_reduce(sub, c10d_pg_rank(sub), 2, C10D_INT32, C10D_SUM, 33, 0))
            return 1;
        MP_CHECK(c10d_pg_destroy(sub) == 0, "destroy sub: %s", c10d_last_error());
    }
    MP_CHECK(c10d_pg_destroy(pg) == 0, "destroy: %s", c10d_last_error());
    c10d_shutdown();
    return fails ? 1 : 0;
}

/* C10D_TEST_MAX_RANKS=N skips the cases of more ranks (a machine with one
 * GPU whose NCCL refuses several ranks on it), saying so. */
static void run_on(int n, mp_rank_fn fn, void *arg, int timeout_s, int shares_gpus)
{
    const char *max = getenv("C10D_TEST_MAX_RANKS");
    if (!shares_gpus && max != NULL && *max != '\0' && n > atoi(max)) {
        printf("skipped: %d ranks > C10D_TEST_MAX_RANKS=%s\n", n, max);
        skip();
    }
    struct mp_opts o = {0};
    o.nranks = n;
    o.timeout_s = timeout_s;
    o.kill_on_failure = 1;
    struct mp_result res;
    assert_int_equal(mp_run(&o, fn, arg, &res), 0);
}

/* A case that arms a fault knob of the simulation (C10D_SIM_*) means
 * nothing against real NCCL, which has no such knobs: it is skipped there,
 * saying so. */
static void sim_only(void)
{
    const char *lib = getenv("C10D_NCCL_LIBRARY");
    void *h = lib != NULL ? dlopen(lib, RTLD_LAZY | RTLD_LOCAL) : NULL;
    int simulated = h != NULL && dlsym(h, "c10d_gpusim") != NULL;
    if (h != NULL)
        dlclose(h);
    if (!simulated) {
        printf("skipped: arms a fault knob of the simulation, and %s is not it\n",
               lib != NULL ? lib : "the default libnccl.so.2");
        skip();
    }
}

static void run(int n, mp_rank_fn fn, void *arg, int timeout_s)
{
    run_on(n, fn, arg, timeout_s, 0);
}

static void test_ops_1(void **s)
{
    (void)s;
    run(1, ops_main, NULL, 120);
}

/* Nonblocking on one rank: on one GPU, real NCCL's nonblocking paths
 * (ncclInProgress, a communicator handed out only when ready). */
static void test_ops_1_nonblocking(void **s)
{
    (void)s;
    run(1, ops_main, (void *)2, 120);
}

static void test_ops_2_lazy(void **s)
{
    (void)s;
    run(2, ops_main, NULL, 180);
}

/* Nonblocking communicators (c10d_nccl_opts.nonblocking): the same results. */
static void test_ops_2_nonblocking(void **s)
{
    (void)s;
    run(2, ops_main, (void *)2, 180);
}

static void test_ops_3_bound(void **s)
{
    (void)s;
    run(3, ops_main, (void *)1, 240);
}

/* Several bootstrap roots (ncclCommInitRankScalable): one per rank here,
 * lazily and bound; ranks that disagreed on the ids would never meet. */
static int roots_main(int rank, int n, void *arg)
{
    setenv("C10D_NCCL_RANKS_PER_ROOT", "1", 1);
    c10d__env_reload();
    c10d_pg *pg = init_group(arg != NULL, 30000);
    MP_CHECK(pg != NULL, "init");
    for (int op = 0; op < C10D_REDUCE_OP_COUNT; op++)
        if (check_all_reduce(pg, rank, n, C10D_FLOAT32, (c10d_reduce_op)op, 100, op % 2))
            return 1;
    if (check_others(pg, rank, n, C10D_INT32, 33))
        return 1;
    MP_CHECK(c10d_pg_destroy(pg) == 0, "destroy: %s", c10d_last_error());
    c10d_shutdown();
    return 0;
}

static void test_scalable_init(void **s)
{
    (void)s;
    run(3, roots_main, NULL, 90);
    run(3, roots_main, (void *)1, 90);
}

/* An NCCL older than 2.23 and 2.27 (the simulation built without
 * ncclCommInitRankScalable and ncclCommShrink, saying 2.26.5): the backend
 * loads, names what it lacks, and everything works the other way (one
 * bootstrap root; a shrink makes a new communicator). One older than 2.18
 * is refused at load, naming the version needed. */
static int use_old_nccl(void)
{
    const char *old = getenv("C10D_SIM_OLD_LIBRARY");
    if (old == NULL || *old == '\0')
        return -1;
    setenv("C10D_CUDART_LIBRARY", old, 1);
    setenv("C10D_NCCL_LIBRARY", old, 1);
    c10d__env_reload();
    return 0;
}

static int old_roots_main(int rank, int n, void *arg)
{
    MP_CHECK(use_old_nccl() == 0, "C10D_SIM_OLD_LIBRARY is not set");
    return roots_main(rank, n, arg);
}

static int shrink_main(int rank, int n, void *arg);

static int old_shrink_main(int rank, int n, void *arg)
{
    MP_CHECK(use_old_nccl() == 0, "C10D_SIM_OLD_LIBRARY is not set");
    return shrink_main(rank, n, arg);
}

/* NCCL 2.23 has no float8: an fp8 op is refused up front (EUNSUPPORTED,
 * naming the version), and the group goes on. */
static int no_fp8_main(int rank, int n, void *arg)
{
    (void)arg;
    MP_CHECK(use_old_nccl() == 0, "C10D_SIM_OLD_LIBRARY is not set");
    setenv("C10D_SIM_NCCL_VERSION", "22304", 1);
    c10d_pg *pg = init_group(1, 30000);
    MP_CHECK(pg != NULL, "init: %s", c10d_last_error());
    c10d_op_opts o = gpu_opts();
    void *buf = dev_alloc(64);
    c10d_work *w = NULL;
    int rc = c10d_all_reduce(pg, buf, buf, 8, C10D_FLOAT8_E4M3, C10D_SUM, &o, &w);
    MP_CHECK(rc == C10D_EUNSUPPORTED && strstr(c10d_last_error(), "needs NCCL 2.24") != NULL,
             "fp8 on 2.23.4: %d %s", rc, c10d_last_error());
    if (check_all_reduce(pg, rank, n, C10D_FLOAT32, C10D_SUM, 100, 0))
        return 1;
    cu->cudaFree(buf);
    c10d_pg_destroy(pg);
    c10d_shutdown();
    return 0;
}

static int too_old_main(int rank, int n, void *arg)
{
    (void)rank, (void)n, (void)arg;
    MP_CHECK(use_old_nccl() == 0, "C10D_SIM_OLD_LIBRARY is not set");
    setenv("C10D_SIM_NCCL_VERSION", "21705", 1);
    MP_CHECK(init_group(1, 30000) == NULL, "a group on NCCL 2.17.5");
    MP_CHECK(strstr(c10d_last_error(), "is NCCL 2.17.5; libc10d needs 2.18.1 or newer") != NULL,
             "message: %s", c10d_last_error());
    c10d_shutdown();
    return 0;
}

/* C10D_CUDART_LIBRARY names two runtimes; the first is newer than the
 * driver (the old simulation told to say so): the second one is used. */
static int driver_main(int rank, int n, void *arg)
{
    char both[2048], good[1024];
    snprintf(good, sizeof good, "%s", getenv("C10D_CUDART_LIBRARY"));
    snprintf(both, sizeof both, "%s:%s", getenv("C10D_SIM_OLD_LIBRARY"), good);
    setenv("C10D_CUDART_LIBRARY", both, 1);
    setenv("C10D_SIM_OLD_DRIVER", "1", 1);
    c10d__env_reload();
    c10d_pg *pg = init_group(1, 30000);
    MP_CHECK(pg != NULL, "init: %s", c10d_last_error());
    if (check_all_reduce(pg, rank, n, C10D_FLOAT32, C10D_SUM, 100, 0))
        return 1;
    const char *info = c10d_build_info();
    MP_CHECK(strstr(info, good) != NULL && strstr(info, getenv("C10D_SIM_OLD_LIBRARY")) == NULL,
             "build info: %s", info);
    (void)arg;
    c10d_pg_destroy(pg);
    c10d_shutdown();
    return 0;
}

static void test_older_nccl(void **s)
{
    (void)s;
    sim_only();
    run(3, old_roots_main, (void *)1, 90);
    run(3, old_shrink_main, NULL, 90);
    run(1, too_old_main, NULL, 30);
    run(2, no_fp8_main, NULL, 60);
    run(2, driver_main, NULL, 60);
}

/* ---------------------------------------------------------------- faults */

#define FAULT_TIMEOUT_MS 1500

/* Rank 1's third op never ends (C10D_SIM_HANG_AT, or a stream blocked by a
 * host function on a GPU): every rank's op times out within T + 2 s with
 * PyTorch's text, and abort returns within its bound. */
static int hang_main(int rank, int n, void *arg)
{
    (void)arg;
    (void)n;
    if (rank == 1)
        setenv("C10D_SIM_HANG_AT", "3", 1);
    c10d_pg *pg = init_group(1, FAULT_TIMEOUT_MS);
    MP_CHECK(pg != NULL, "init");
    c10d_op_opts o = gpu_opts();
    float *buf = dev_alloc(4 * 1024);
    int rc = 0;
    uint64_t t0 = 0;
    for (int i = 0; i < 3 && rc == 0; i++) {
        c10d_work *w;
        t0 = now_ms();
        rc = finish(c10d_all_reduce(pg, buf, buf, 1024, C10D_FLOAT32, C10D_SUM, &o, &w), &w);
    }
    uint64_t took = now_ms() - t0;
    MP_CHECK(rc == C10D_ETIMEDOUT, "expected a timeout, got %d: %s", rc, c10d_last_error());
    MP_CHECK(took <= FAULT_TIMEOUT_MS + 2000, "timeout took %llu ms", (unsigned long long)took);
    MP_CHECK(strstr(c10d_last_error(), "Watchdog caught collective operation timeout: "
                                       "WorkNCCL(SeqNum=3, OpType=ALLREDUCE") != NULL,
             "message: %s", c10d_last_error());
    /* The group is failed: the next op fails at once, naming the first error. */
    MP_CHECK(c10d_all_reduce(pg, buf, buf, 1, C10D_FLOAT32, C10D_SUM, &o, NULL) != 0,
             "op after failure");
    uint64_t a0 = now_ms();
    c10d_pg_abort(pg, "test");
    uint64_t abort_ms = now_ms() - a0;
    MP_CHECK(abort_ms < 12000, "abort took %llu ms", (unsigned long long)abort_ms);
    c10d_shutdown();
    return 0;
}

static void test_hang_times_out(void **s)
{
    (void)s;
    sim_only();
    run(2, hang_main, NULL, 60);
}

/* A stalled stream, as on a GPU (no fault knob): rank 1's caller stream is
 * held by a host function, so its all_reduce never starts. Rank 0's starts
 * and waits in NCCL for rank 1: it times out by its own clock (counted from
 * its start), rank 1, whose op never started, learns of it through the
 * store. Both within T + 2 s; abort returns within its bound with the stream
 * still held. */
static _Atomic int stall_gate;

static void CUDART_CB stall_fn(void *arg)
{
    (void)arg;
    /* Bounded: the stream must not outlive a broken test for ever. */
    for (int i = 0; i < 30000 && !atomic_load(&stall_gate); i++)
        usleep(1000);
}

static int stalled_main(int rank, int n, void *arg)
{
    (void)arg;
    (void)n;
    setenv("C10D_NCCL_PEER_CHECK_MS", "200", 1);
    c10d__env_reload();
    c10d_pg *pg = init_group(1, FAULT_TIMEOUT_MS);
    MP_CHECK(pg != NULL, "init");
    c10d_op_opts o = gpu_opts();
    float *buf = dev_alloc(4 * 1024);
    c10d_work *w;
    int rc = finish(c10d_all_reduce(pg, buf, buf, 1024, C10D_FLOAT32, C10D_SUM, &o, &w), &w);
    MP_CHECK(rc == 0, "first all_reduce: %s", c10d_last_error());
    if (rank == 1)
        MP_CHECK(cu->cudaLaunchHostFunc(NULL, stall_fn, NULL) == cudaSuccess, "host func");
    uint64_t t0 = now_ms();
    rc = c10d_all_reduce(pg, buf, buf, 1024, C10D_FLOAT32, C10D_SUM, &o, &w);
    if (rc == 0)
        rc = c10d_work_wait_release(w); /* not finish(): the stream is held */
    uint64_t took = now_ms() - t0;
    MP_CHECK(rc != 0, "the all_reduce behind a stalled stream passed");
    MP_CHECK(took <= FAULT_TIMEOUT_MS + 2000, "failure took %llu ms", (unsigned long long)took);
    if (rank == 0)
        MP_CHECK(rc == C10D_ETIMEDOUT &&
                     strstr(c10d_last_error(), "Watchdog caught collective operation timeout: "
                                               "WorkNCCL(SeqNum=2, OpType=ALLREDUCE") != NULL,
                 "rank 0: %d %s", rc, c10d_last_error());
    else
        MP_CHECK(strstr(c10d_last_error(), "rank 0 failed") != NULL &&
                     strstr(c10d_last_error(), "Watchdog caught collective operation timeout") !=
                         NULL,
                 "rank 1: %d %s", rc, c10d_last_error());
    uint64_t a0 = now_ms();
    c10d_pg_abort(pg, "test");
    uint64_t abort_ms = now_ms() - a0;
    MP_CHECK(abort_ms < 12000, "abort took %llu ms", (unsigned long long)abort_ms);
    atomic_store(&stall_gate, 1);
    if (rank == 0)
        usleep(1000 * 1000); /* rank 1 reads the news from the store rank 0 hosts */
    c10d_shutdown();
    return 0;
}

/* tcp with CUDA buffers behind a stalled caller stream on rank 1: its input
 * copy never starts, so rank 1 times out from the call (tcp times ops from
 * the call, as gloo does) and rank 0 with it; both within the timeout plus
 * a margin, and abort returns at once (nothing in it waits for the device). */
static int tcp_stalled_main(int rank, int n, void *arg)
{
    (void)arg;
    (void)n;
    use_tcp_cuda = 1;
    c10d_pg *pg = init_group(0, FAULT_TIMEOUT_MS);
    MP_CHECK(pg != NULL, "init");
    c10d_op_opts o = gpu_opts();
    float *buf = dev_alloc(4 * 1024);
    c10d_work *w;
    int rc = finish(c10d_all_reduce(pg, buf, buf, 1024, C10D_FLOAT32, C10D_SUM, &o, &w), &w);
    MP_CHECK(rc == 0, "first all_reduce: %s", c10d_last_error());
    if (rank == 1)
        MP_CHECK(cu->cudaLaunchHostFunc(NULL, stall_fn, NULL) == cudaSuccess, "host func");
    uint64_t t0 = now_ms();
    rc = c10d_all_reduce(pg, buf, buf, 1024, C10D_FLOAT32, C10D_SUM, &o, &w);
    if (rc == 0)
        rc = c10d_work_wait_release(w);
    uint64_t took = now_ms() - t0;
    MP_CHECK(rc != 0, "the all_reduce behind a stalled stream passed");
    MP_CHECK(took <= FAULT_TIMEOUT_MS + 2000, "failure took %llu ms", (unsigned long long)took);
    MP_CHECK(strstr(c10d_last_error(), "Watchdog caught collective operation timeout") != NULL,
             "rank %d: %d %s", rank, rc, c10d_last_error());
    uint64_t a0 = now_ms();
    c10d_pg_abort(pg, "test");
    uint64_t abort_ms = now_ms() - a0;
    MP_CHECK(abort_ms < 2000, "abort took %llu ms", (unsigned long long)abort_ms);
    atomic_store(&stall_gate, 1);
    c10d_shutdown();
    return 0;
}

static void test_tcp_cuda_stalled_stream(void **s)
{
    (void)s;
    run_on(2, tcp_stalled_main, NULL, 60, 1);
}

/* Rank 0's first launch on its communicator blocks in NCCL for 20 s (NCCL
 * making connections on first use while a peer is away; the knob stands in
 * for it, and, as NCCL's connection setup, ends when the communicator is
 * aborted from another thread): the caller's all_reduce still returns at
 * once (a worker issues the first ops), and abort frees that worker from
 * NCCL: it returns well before C10D_BACKEND_CLOSE_MS, and the op fails at
 * once instead of when NCCL gives up. Rank 1 fails with rank 0's abort. */
static int first_launch_main(int rank, int n, void *arg)
{
    (void)arg;
    (void)n;
    if (rank == 0)
        setenv("C10D_SIM_FIRST_LAUNCH_DELAY_MS", "20000", 1);
    setenv("C10D_BACKEND_CLOSE_MS", "10000", 1);
    setenv("C10D_NCCL_PEER_CHECK_MS", "200", 1);
    c10d__env_reload();
    c10d_pg *pg = init_group(1, 30000);
    MP_CHECK(pg != NULL, "init");
    c10d_op_opts o = gpu_opts();
    float *buf = dev_alloc(4 * 1024);
    c10d_work *w;
    uint64_t t0 = now_ms();
    MP_CHECK(c10d_all_reduce(pg, buf, buf, 1024, C10D_FLOAT32, C10D_SUM, &o, &w) == 0, "issue: %s",
             c10d_last_error());
    MP_CHECK(now_ms() - t0 < 1000, "the caller waited %llu ms in c10d_all_reduce",
             (unsigned long long)(now_ms() - t0));
    if (rank == 0) {
        usleep(300 * 1000);
        uint64_t a0 = now_ms();
        c10d_pg_abort(pg, "test: the first launch is stuck");
        uint64_t abort_ms = now_ms() - a0;
        MP_CHECK(abort_ms < 3000, "abort took %llu ms: it waited for the worker inside NCCL",
                 (unsigned long long)abort_ms);
        int rc = c10d_work_wait(w, 3000);
        MP_CHECK(rc != 0 && rc != C10D_ETIMEDOUT,
                 "the op was still inside NCCL 3 s after the abort (%d: %s)", rc,
                 c10d_last_error());
        c10d_work_release(w);
        usleep(1000 * 1000); /* rank 1 reads the news from the store rank 0 hosts */
    } else {
        int rc = c10d_work_wait_release(w);
        MP_CHECK(rc != 0 && now_ms() - t0 < 5000, "rank 1: %d after %llu ms: %s", rc,
                 (unsigned long long)(now_ms() - t0), c10d_last_error());
        c10d_pg_abort(pg, "test");
    }
    c10d_shutdown();
    return 0;
}

/* A CUDA context on a device costs hundreds of MiB there; a thread's first
 * call makes one on its current device (0 on a fresh thread), and
 * cudaSetDevice makes one since CUDA 12. So every thread that calls CUDA or
 * NCCL for a group (the caller, the workers issuing first ops and closing
 * communicators, the loop polling events, the worker freeing pinned
 * memory) must do so on the group's device. The ranks sit on devices 0
 * and 1 of the simulation's three; rank 1 checks, through the simulation's
 * record of the devices the process made contexts on, that it never
 * touched device 0: with nccl (first ops on a worker, events polled on the
 * loop, communicators aborted and destroyed on workers) and with CUDA
 * buffers on tcp (staged through pinned memory, freed on a worker). */
static unsigned long long (*sim_contexts)(void);

static int device_main(int rank, int n, void *arg)
{
    (void)n;
    (void)arg;
    for (int mode = 0; mode < 2; mode++) {
        use_tcp_cuda = mode;
        c10d_pg *pg = init_group(1, 30000);
        MP_CHECK(pg != NULL, "init");
        c10d_op_opts o = gpu_opts();
        float *buf = dev_alloc(64 * 1024 * sizeof(float));
        for (int i = 0; i < 4; i++) {
            c10d_work *w;
            MP_CHECK(
                finish(c10d_all_reduce(pg, buf, buf, 64 * 1024, C10D_FLOAT32, C10D_SUM, &o, &w),
                       &w) == 0,
                "all_reduce: %s", c10d_last_error());
        }
        if (mode == 0)
            c10d_pg_abort(pg, "test: closing by abort");
        else
            c10d_pg_destroy(pg);
        cu->cudaFree(buf);
    }
    c10d_shutdown();
    if (rank == 1) {
        void *h = dlopen(getenv("C10D_CUDART_LIBRARY"), RTLD_LAZY | RTLD_NOLOAD);
        sim_contexts =
            h != NULL ? (unsigned long long (*)(void))dlsym(h, "c10d_gpusim_contexts") : NULL;
        MP_CHECK(sim_contexts != NULL, "the simulation has no c10d_gpusim_contexts");
        unsigned long long mask = sim_contexts();
        MP_CHECK(my_device == 1, "rank 1 is on device %d", my_device);
        MP_CHECK(mask == 1ull << my_device,
                 "rank 1 (device 1) made CUDA contexts on devices 0x%llx: a thread called CUDA or "
                 "NCCL without the group's device current",
                 mask);
    }
    return 0;
}

static void test_threads_use_the_group_device(void **s)
{
    (void)s;
    sim_only();
    run(2, device_main, NULL, 120);
}

static void test_first_launch_blocks(void **s)
{
    (void)s;
    sim_only();
    run(2, first_launch_main, NULL, 60);
}

static void test_stalled_stream(void **s)
{
    (void)s;
    run(2, stalled_main, NULL, 60);
}

/* Rank 0's communicator reports an async error after two ops: its pending
 * op fails at once naming it, and rank 1, whose op waits for rank 0 with a
 * 30 s timeout, learns of it through the store within its check interval. */
static int async_main(int rank, int n, void *arg)
{
    (void)arg;
    (void)n;
    if (rank == 0)
        setenv("C10D_SIM_ASYNC_ERROR_AT", "2", 1);
    setenv("C10D_NCCL_PEER_CHECK_MS", "200", 1);
    c10d__env_reload();
    c10d_pg *pg = init_group(1, 30000);
    MP_CHECK(pg != NULL, "init");
    c10d_op_opts o = gpu_opts();
    float *buf = dev_alloc(16);
    int rc = 0;
    uint64_t t0 = 0;
    for (int i = 0; i < 4 && rc == 0; i++) {
        c10d_work *w;
        t0 = now_ms();
        rc = finish(c10d_all_reduce(pg, buf, buf, 4, C10D_FLOAT32, C10D_SUM, &o, &w), &w);
    }
    uint64_t took = now_ms() - t0;
    MP_CHECK(rc < 0, "expected a failure");
    MP_CHECK(took <= 3000, "failure took %llu ms", (unsigned long long)took);
    MP_CHECK(strstr(c10d_last_error(), "asynchronous error") != NULL, "message: %s",
             c10d_last_error());
    if (rank == 1)
        MP_CHECK(strstr(c10d_last_error(), "rank 0 failed") != NULL, "message: %s",
                 c10d_last_error());
    /* Poisoned on both ranks: the next op fails at once. */
    MP_CHECK(c10d_all_reduce(pg, buf, buf, 1, C10D_FLOAT32, C10D_SUM, &o, NULL) != 0,
             "op after failure");
    c10d_pg_abort(pg, "test");
    if (rank == 0)
        usleep(3000 * 1000); /* rank 1 reads the news from the store rank 0 hosts */
    c10d_shutdown();
    return 0;
}

static void test_async_error(void **s)
{
    (void)s;
    sim_only();
    run(2, async_main, NULL, 60);
}

/* C10D_NCCL_ENABLE_TIMING: a completed op has a device time, at most the
 * time the host saw it take; without it there is none, saying so. */
static int timing_main(int rank, int n, void *arg)
{
    (void)rank, (void)n;
    if (arg != NULL)
        setenv("C10D_NCCL_ENABLE_TIMING", "1", 1);
    c10d__env_reload();
    c10d_pg *pg = init_group(1, 30000);
    MP_CHECK(pg != NULL, "init");
    c10d_op_opts o = gpu_opts();
    size_t count = (size_t)4 << 20;
    float *in = dev_alloc(count * sizeof *in), *out = dev_alloc(count * sizeof *out);
    MP_CHECK(cu->cudaDeviceSynchronize() == cudaSuccess, "sync");
    for (int i = 0; i < 3; i++) {
        c10d_work *w;
        uint64_t t0 = now_ns();
        MP_CHECK(c10d_all_reduce(pg, in, out, count, C10D_FLOAT32, C10D_SUM, &o, &w) == 0,
                 "issue: %s", c10d_last_error());
        MP_CHECK(c10d_work_wait(w, -1) == 0, "wait: %s", c10d_last_error());
        double wall_ms = (double)(now_ns() - t0) / 1e6;
        float ms = -1;
        int rc = c10d_work_duration_ms(w, &ms);
        if (arg != NULL) {
            MP_CHECK(rc == 0, "duration: %d %s", rc, c10d_last_error());
            MP_CHECK(ms >= 0 && ms <= wall_ms, "device time %.3f ms, host saw %.3f ms", ms,
                     wall_ms);
            if (i == 2)
                printf("16 MiB all_reduce on 1 rank: device %.3f ms, host %.3f ms\n", ms, wall_ms);
        } else {
            MP_CHECK(rc == C10D_EUNSUPPORTED &&
                         strstr(c10d_last_error(), "C10D_NCCL_ENABLE_TIMING") != NULL,
                     "without timing: %d %s", rc, c10d_last_error());
        }
        c10d_work_release(w);
    }
    MP_CHECK(c10d_work_duration_ms(NULL, NULL) == C10D_EINVAL, "NULL");
    MP_CHECK(c10d_pg_destroy(pg) == 0, "destroy: %s", c10d_last_error());
    c10d_shutdown();
    return 0;
}

static void test_timing(void **s)
{
    (void)s;
    run(1, timing_main, NULL, 60);
    run(1, timing_main, (void *)1, 60);
}

/* A sticky CUDA error fails an op that has not started within a poll,
 * instead of leaving it "not started" for ever (no clock would run out).
 * The op waits behind a caller stream held by a host function; then a NaN
 * check kernel on another stream reads an address no allocation holds (an
 * illegal address on a GPU as in the simulation), and the fault sticks to
 * the whole process. The group is failed; abort and shutdown return. One
 * rank: it runs on one GPU against real NCCL too. */
static int sticky_main(int rank, int n, void *arg)
{
    (void)rank, (void)n, (void)arg;
    setenv("C10D_BACKEND_CLOSE_MS", "3000", 1);
    c10d__env_reload();
    c10d_pg *pg = init_group(1, 30000);
    MP_CHECK(pg != NULL, "init");
    MP_CHECK(c10d__nan_check_load() == 0, "NaN check kernel: %s", c10d_last_error());
    c10d_op_opts o = gpu_opts();
    float *buf = dev_alloc(4096);
    uint64_t *flag = dev_alloc(sizeof *flag);
    c10d_work *w;
    MP_CHECK(finish(c10d_all_reduce(pg, buf, buf, 1024, C10D_FLOAT32, C10D_SUM, &o, &w), &w) == 0,
             "a clean op: %s", c10d_last_error());
    cudaStream_t side;
    MP_CHECK(cu->cudaStreamCreateWithPriority(&side, cudaStreamNonBlocking, 0) == cudaSuccess,
             "stream");
    /* Launched once first: CUDA loads a kernel lazily at its first launch,
     * which waits for the device, and the held stream below would never let
     * it (seen on an H200). */
    MP_CHECK(c10d__nan_check_launch(cu, buf, 1024, C10D_FLOAT32, flag, 1, side) == 0 &&
                 cu->cudaStreamSynchronize(side) == cudaSuccess,
             "a clean check: %s", c10d_last_error());
    MP_CHECK(cu->cudaLaunchHostFunc(NULL, stall_fn, NULL) == cudaSuccess, "host func");
    uint64_t t0 = now_ms();
    MP_CHECK(c10d_all_reduce(pg, buf, buf, 1024, C10D_FLOAT32, C10D_SUM, &o, &w) == 0,
             "issue behind the held stream: %s", c10d_last_error());
    /* 1 TiB past the buffer: no allocation holds it. The simulation treats
     * host memory the process maps as reachable (as HMM does), and under
     * AddressSanitizer that address can be mapped: step on until it is not. */
    const char *wild = (const char *)buf + ((size_t)1 << 40);
    size_t page = (size_t)sysconf(_SC_PAGESIZE), span = (size_t)4 << 20;
    for (int i = 0; i < 64; i++) {
        void *lo = (void *)((uintptr_t)wild & ~(uintptr_t)(page - 1));
        if (msync(lo, span + page, MS_ASYNC) != 0)
            break;
        wild += (size_t)1 << 40;
    }
    MP_CHECK(c10d__nan_check_launch(cu, wild, span / 4, C10D_FLOAT32, flag, 1, side) == 0,
             "launch: %s", c10d_last_error());
    int rc = c10d_work_wait_release(w);
    uint64_t took = now_ms() - t0;
    MP_CHECK(rc == C10D_EIO, "the op behind a device fault: %d %s", rc, c10d_last_error());
    MP_CHECK(took <= 3000, "failure took %llu ms", (unsigned long long)took);
    MP_CHECK(strstr(c10d_last_error(), "illegal memory access") != NULL, "message: %s",
             c10d_last_error());
    printf("rank %d: failed after %llu ms: %s\n", rank, (unsigned long long)took,
           c10d_last_error());
    MP_CHECK(c10d_all_reduce(pg, buf, buf, 1, C10D_FLOAT32, C10D_SUM, &o, NULL) != 0,
             "op after failure");
    uint64_t a0 = now_ms();
    c10d_pg_abort(pg, "test: sticky error");
    uint64_t abort_ms = now_ms() - a0;
    MP_CHECK(abort_ms < 3000 + 2000, "abort took %llu ms", (unsigned long long)abort_ms);
    atomic_store(&stall_gate, 1);
    c10d_shutdown();
    return 0;
}

static void test_sticky_error(void **s)
{
    (void)s;
    if (!c10d__nan_check_built()) {
        /* Its fault comes from the NaN check kernel reading a wild address. */
        printf("skipped: this build has no NaN check kernel (built without nvcc)\n");
        skip();
    }
    run(1, sticky_main, NULL, 30);
}

/* C10D_NCCL_NAN_CHECK: a NaN in an input fails that op on its rank, and
 * the other ranks through the store; infinities and clean inputs pass. */
static void put_bits(void *buf, size_t i, c10d_dtype dt, uint64_t bits)
{
    memcpy((char *)buf + i * c10d_dtype_size(dt), &bits, c10d_dtype_size(dt)); /* little endian */
}

static const struct {
    c10d_dtype dt;
    uint64_t nan, inf; /* inf 0: the type has none */
} nan_types[] = {
    {C10D_FLOAT32, 0xffc00001u, 0x7f800000u},
    {C10D_FLOAT64, 0x7ff8000000000000ull, 0xfff0000000000000ull},
    {C10D_FLOAT16, 0x7c01u, 0xfc00u},
    {C10D_BFLOAT16, 0xffc1u, 0x7f80u},
    {C10D_FLOAT8_E4M3, 0xffu, 0},
    {C10D_FLOAT8_E5M2, 0x7du, 0x7cu},
};

static int nan_main(int rank, int n, void *arg)
{
    (void)arg;
    setenv("C10D_NCCL_NAN_CHECK", "1", 1);
    setenv("C10D_NCCL_PEER_CHECK_MS", "200", 1);
    c10d__env_reload();
    if (c10d__cuda_load(&cu) != 0)
        return 1;
    /* A build made without nvcc has no kernel: with the check on, making a
     * communicator fails, saying so (docs/nccl.md). */
    if (c10d__nan_check_load() != 0) {
        MP_CHECK(strstr(c10d_last_error(), "no NaN check kernel") != NULL, "load: %s",
                 c10d_last_error());
        printf("rank %d: %s\n", rank, c10d_last_error());
        MP_CHECK(init_group(1, 30000) == NULL, "init succeeded without the kernel");
        MP_CHECK(n > 1 || strstr(c10d_last_error(), "no NaN check kernel") != NULL, "init: %s",
                 c10d_last_error());
        return 0;
    }
    const size_t count = 3000;
    /* On this rank's device, as init_group will bind the groups (NCCL refuses
     * another device's memory). */
    int ndev = 1;
    const char *local = getenv("LOCAL_RANK");
    cu->cudaGetDeviceCount(&ndev);
    cu->cudaSetDevice((local != NULL ? atoi(local) : 0) % (ndev > 0 ? ndev : 1));
    void *buf = dev_alloc(count * 8);
    char *h = malloc(count * 8);
    c10d_work *w;
    if (n == 1) {
        /* Each float type: an infinity passes, a NaN fails naming op and dtype. */
        for (size_t t = 0; t < sizeof nan_types / sizeof *nan_types; t++) {
            c10d_dtype dt = nan_types[t].dt;
            c10d_pg *pg = init_group(1, 30000);
            MP_CHECK(pg != NULL, "init");
            c10d_op_opts o = gpu_opts(); /* after init_group: this rank's device */
            data_fill(h, count, 0, rank, dt, C10D_MAX);
            if (nan_types[t].inf != 0)
                put_bits(h, 17, dt, nan_types[t].inf);
            to_dev(buf, h, count * c10d_dtype_size(dt));
            int rc = finish(c10d_all_reduce(pg, buf, buf, count, dt, C10D_MAX, &o, &w), &w);
            MP_CHECK(rc == 0, "%s without NaN: %s", c10d_dtype_name(dt), c10d_last_error());
            put_bits(h, count - 1, dt, nan_types[t].nan);
            to_dev(buf, h, count * c10d_dtype_size(dt));
            rc = finish(c10d_all_reduce(pg, buf, buf, count, dt, C10D_MAX, &o, &w), &w);
            MP_CHECK(rc == C10D_EINVAL, "%s with a NaN: %d %s", c10d_dtype_name(dt), rc,
                     c10d_last_error());
            char want[96];
            snprintf(want, sizeof want, "NaN found in the input of ALLREDUCE (SeqNum=2, dtype %s)",
                     c10d_dtype_name(dt));
            MP_CHECK(strstr(c10d_last_error(), want) != NULL, "message: %s", c10d_last_error());
            c10d_pg_abort(pg, "test");
        }
        /* Two ops in flight, both with a NaN: the first is the one named. */
        {
            c10d_pg *pg = init_group(1, 30000);
            MP_CHECK(pg != NULL, "init");
            c10d_op_opts o = gpu_opts();
            void *second = dev_alloc(count * 4);
            data_fill(h, count, 0, rank, C10D_FLOAT32, C10D_SUM);
            put_bits(h, 5, C10D_FLOAT32, 0x7fc00000u);
            to_dev(buf, h, count * 4);
            to_dev(second, h, count * 4);
            c10d_work *w1, *w2;
            MP_CHECK(c10d_all_reduce(pg, buf, buf, count, C10D_FLOAT32, C10D_SUM, &o, &w1) == 0 &&
                         c10d_all_reduce(pg, second, second, count, C10D_FLOAT32, C10D_SUM, &o,
                                         &w2) == 0,
                     "issue: %s", c10d_last_error());
            int rc = c10d_work_wait_release(w1);
            MP_CHECK(rc == C10D_EINVAL && strstr(c10d_last_error(), "SeqNum=1,") != NULL,
                     "first of two: %d %s", rc, c10d_last_error());
            c10d_work_wait_release(w2);
            c10d_pg_abort(pg, "test");
            cu->cudaDeviceSynchronize();
            cu->cudaFree(second);
        }
        /* Integers are not checked: NaN's bits are just a number there. */
        c10d_pg *pg = init_group(1, 30000);
        MP_CHECK(pg != NULL, "init");
        c10d_op_opts o = gpu_opts();
        put_bits(h, 0, C10D_INT32, 0x7fc00000u);
        to_dev(buf, h, 4);
        MP_CHECK(finish(c10d_all_reduce(pg, buf, buf, 1, C10D_INT32, C10D_SUM, &o, &w), &w) == 0,
                 "int32: %s", c10d_last_error());
        c10d_pg_destroy(pg);
    } else {
        /* Rank 1, the root of a broadcast, sends a NaN: it fails at once,
         * rank 0 (whose input is not checked) on its next op, from the store. */
        c10d_pg *pg = init_group(1, 30000);
        MP_CHECK(pg != NULL, "init");
        c10d_op_opts o = gpu_opts();
        if (check_all_reduce(pg, rank, n, C10D_BFLOAT16, C10D_SUM, 1000, 1))
            return 1;
        data_fill(h, count, 0, rank, C10D_FLOAT32, C10D_SUM);
        if (rank == 1)
            put_bits(h, 1234, C10D_FLOAT32, 0x7fc00000u);
        to_dev(buf, h, count * 4);
        int rc = finish(c10d_broadcast(pg, buf, buf, count, C10D_FLOAT32, 1, &o, &w), &w);
        if (rank == 1) {
            MP_CHECK(rc == C10D_EINVAL, "root with a NaN: %d %s", rc, c10d_last_error());
        } else {
            MP_CHECK(rc == 0, "receiver: %s", c10d_last_error());
            uint64_t t0 = now_ms();
            rc = finish(c10d_barrier(pg, &o, &w), &w);
            MP_CHECK(rc != 0, "rank 0's next op passed");
            MP_CHECK(now_ms() - t0 < 5000, "rank 0 learnt of it after %llu ms",
                     (unsigned long long)(now_ms() - t0));
        }
        MP_CHECK(strstr(c10d_last_error(), "NaN found in the input of BROADCAST") != NULL,
                 "message: %s", c10d_last_error());
        MP_CHECK(strstr(c10d_last_error(), "on rank 1") != NULL, "message: %s", c10d_last_error());
        c10d_pg_abort(pg, "test");
        if (rank == 1)
            usleep(1000 * 1000); /* rank 0 reads the news from the store rank 0 hosts */
    }
    free(h);
    c10d_shutdown();
    return 0;
}

static void test_nan_check(void **s)
{
    (void)s;
    run(1, nan_main, NULL, 60);
    run(2, nan_main, NULL, 60);
}

static _Atomic uint64_t probe_fired_ms; /* written by the loop thread */

static void probe_cb(c10d_work *w, int status, void *arg)
{
    (void)w, (void)status, (void)arg;
    probe_fired_ms = now_ms();
}

/* A work with a 100 ms deadline; its callback notes when it fired. */
static c10d_work *probe_start(void)
{
    c10d_work *w = NULL;
    probe_fired_ms = 0;
    if (c10d_work_create("probe", 100, &w) != 0 || c10d_work_on_complete(w, probe_cb, NULL) != 0)
        abort();
    return w;
}

/* Rank 1 never joins the communicator's init: creating a bound group fails
 * on both ranks within the timeout, and a loop timer keeps its time while
 * the communicator initialises. */
static int never_main(int rank, int n, void *arg)
{
    (void)n;
    use_nonblocking = arg != NULL;
    if (rank == 1)
        setenv("C10D_SIM_INIT_NEVER", "1", 1);
    if (c10d__cuda_load(&cu) != 0)
        return 1;
    /* A 100 ms work deadline armed now must fire on time during init. */
    uint64_t t0 = now_ms();
    c10d_work *probe = probe_start();
    c10d_pg *pg = init_group(1, FAULT_TIMEOUT_MS);
    uint64_t took = now_ms() - t0;
    MP_CHECK(pg == NULL, "init should fail");
    MP_CHECK(took <= FAULT_TIMEOUT_MS + 2000 + 1000, "init failure took %llu ms",
             (unsigned long long)took);
    MP_CHECK(c10d_work_status(probe) == C10D_ETIMEDOUT, "probe did not time out");
    MP_CHECK(probe_fired_ms - t0 < 400, "a 100 ms timer fired after %llu ms during init",
             (unsigned long long)(probe_fired_ms - t0));
    c10d_work_release(probe);
    c10d_shutdown();
    return 0;
}

/* The simulation's segments in /dev/shm (its names: "c10dsim-..."). */
static int sim_segments(void)
{
    DIR *d = opendir("/dev/shm");
    int n = 0;
    for (struct dirent *e; d != NULL && (e = readdir(d)) != NULL;)
        n += strncmp(e->d_name, "c10dsim-", 8) == 0;
    if (d != NULL)
        closedir(d);
    return n;
}

/* Unlinks the names of simulated communicators whose maker exited: the
 * count, or -1 where the library is not the simulation. */
static int sim_reap(void)
{
    const char *lib = getenv("C10D_NCCL_LIBRARY");
    void *h = lib != NULL ? dlopen(lib, RTLD_LAZY | RTLD_LOCAL) : NULL;
    int (*reap)(void) = h != NULL ? (int (*)(void))dlsym(h, "c10d_gpusim_reap_orphans") : NULL;
    int n = reap != NULL ? reap() : -1;
    if (h != NULL)
        dlclose(h);
    return n;
}

static void test_init_never_joins(void **s)
{
    (void)s;
    sim_only();
    int before = sim_segments();
    run(2, never_main, NULL, 60);
    run(2, never_main, (void *)1, 60);
    /* Rank 0 made the segment and exited with its init still waiting for
     * rank 1: the name outlives it, as nothing of real NCCL's does. */
    assert_true(sim_reap() >= 1);
    assert_int_equal(sim_segments(), before);
}

/* The loop keeps its timers on time while init is slow (simulated delay)
 * and while an abort is stuck in NCCL. */
static int slow_main(int rank, int n, void *arg)
{
    (void)arg;
    (void)n;
    (void)rank;
    setenv("C10D_SIM_INIT_DELAY_MS", "800", 1);
    setenv("C10D_SIM_ABORT_DELAY_MS", "1500", 1);
    setenv("C10D_SIM_FIRST_LAUNCH_DELAY_MS", "1500", 1);
    c10d_pg *pg = init_group(0, 30000);
    MP_CHECK(pg != NULL, "init");
    c10d_op_opts o = gpu_opts();
    float *buf = dev_alloc(16);
    c10d_work *w, *probe;
    MP_CHECK(c10d_all_reduce(pg, buf, buf, 4, C10D_FLOAT32, C10D_SUM, &o, &w) == 0, "op: %s",
             c10d_last_error());
    uint64_t t0 = now_ms();
    probe = probe_start();
    MP_CHECK(c10d_work_wait(probe, 5000) == C10D_ETIMEDOUT, "probe");
    while (probe_fired_ms == 0)
        usleep(1000);
    MP_CHECK(probe_fired_ms - t0 < 400, "a 100 ms timer fired after %llu ms during init",
             (unsigned long long)(probe_fired_ms - t0));
    c10d_work_release(probe);
    /* Around 800 ms the communicator is ready and the op that waited for it
     * is issued; its first launch then blocks 1.5 s in NCCL, off the loop. */
    while (now_ms() - t0 < 750)
        usleep(1000);
    uint64_t t1 = now_ms();
    probe = probe_start();
    MP_CHECK(c10d_work_wait(probe, 5000) == C10D_ETIMEDOUT, "probe");
    while (probe_fired_ms == 0)
        usleep(1000);
    MP_CHECK(probe_fired_ms - t1 < 400,
             "a 100 ms timer fired after %llu ms while the first launch blocked",
             (unsigned long long)(probe_fired_ms - t1));
    c10d_work_release(probe);
    MP_CHECK(finish(0, &w) == 0, "op: %s", c10d_last_error());
    /* An abort stuck 1.5 s in NCCL: the loop still keeps time. */
    t0 = now_ms();
    probe = probe_start();
    c10d_pg_abort(pg, "test");
    uint64_t abort_ms = now_ms() - t0;
    while (probe_fired_ms == 0)
        usleep(1000);
    MP_CHECK(probe_fired_ms - t0 < 400, "a 100 ms timer fired after %llu ms during the abort",
             (unsigned long long)(probe_fired_ms - t0));
    MP_CHECK(abort_ms < 12000, "abort took %llu ms", (unsigned long long)abort_ms);
    c10d_work_release(probe);
    c10d_shutdown();
    return 0;
}

static void test_loop_never_blocks(void **s)
{
    (void)s;
    sim_only();
    run(2, slow_main, NULL, 60);
}

/* Shrink. Healthy: ranks 0 and 2 leave rank 1 out of a bound group while
 * rank 1 looks on (ncclCommShrink). After a failure: rank 1 is gone, the
 * survivors' op on the parent fails, and shrinking then connects them afresh
 * through the store (both backends of "cpu:tcp,cuda:nccl"). */
static int shrink_sum(c10d_pg *g, int rank, int *sum)
{
    c10d_op_opts o = gpu_opts();
    float *buf = dev_alloc(sizeof(float));
    float v = (float)(rank + 1);
    to_dev(buf, &v, sizeof v);
    c10d_work *w;
    int rc = finish(c10d_all_reduce(g, buf, buf, 1, C10D_FLOAT32, C10D_SUM, &o, &w), &w);
    to_host(&v, buf, sizeof v);
    *sum = (int)v;
    int64_t h = rank + 1; /* the host backend of the same group */
    if (rc == 0)
        rc = c10d_all_reduce_sync(g, &h, &h, 1, C10D_INT64, C10D_SUM);
    if (rc == 0 && h != *sum)
        rc = -1000 - (int)h;
    return rc;
}

static int shrink_main(int rank, int n, void *arg)
{
    (void)n;
    int after_failure = arg != NULL;
    setenv("C10D_NCCL_PEER_CHECK_MS", "200", 1);
    c10d__env_reload();
    c10d_pg *pg = init_group(1, after_failure ? FAULT_TIMEOUT_MS : 30000);
    MP_CHECK(pg != NULL, "init");
    int excluded[1] = {1}, sum = 0;
    if (rank == 1) {
        if (after_failure)
            _exit(0); /* gone without a word */
        /* Looks on, then leaves once the others are done with it. */
        c10d_pg_destroy(pg);
        c10d_shutdown();
        return 0;
    }
    if (after_failure) {
        int rc = shrink_sum(pg, rank, &sum);
        MP_CHECK(rc < 0, "an op with a dead peer should fail");
    }
    c10d_pg *small = NULL;
    MP_CHECK(c10d_pg_shrink(pg, excluded, 1, NULL, &small) == 0, "shrink: %s", c10d_last_error());
    MP_CHECK(c10d_pg_size(small) == 2 && c10d_pg_rank(small) == (rank == 0 ? 0 : 1),
             "size %d rank %d", c10d_pg_size(small), c10d_pg_rank(small));
    int rc = shrink_sum(small, rank, &sum);
    MP_CHECK(rc == 0 && sum == 1 + 3, "shrunk all_reduce: %d sum %d: %s", rc, sum,
             c10d_last_error());
    /* Wrong calls fail and change nothing. */
    c10d_pg *bad;
    MP_CHECK(c10d_pg_shrink(pg, (int[]){rank}, 1, NULL, &bad) == C10D_EINVAL &&
                 strstr(c10d_last_error(), "excludes itself") != NULL,
             "self: %s", c10d_last_error());
    MP_CHECK(c10d_pg_shrink(pg, (int[]){7}, 1, NULL, &bad) == C10D_EINVAL &&
                 strstr(c10d_last_error(), "out of range") != NULL,
             "range: %s", c10d_last_error());
    MP_CHECK(c10d_pg_destroy(small) == 0, "destroy: %s", c10d_last_error());
    if (after_failure)
        c10d_pg_abort(pg, "test");
    else
        c10d_pg_destroy(pg);
    c10d_shutdown();
    return 0;
}

/* C10D_SHRINK_ABORT on a healthy bound group: ranks 0 and 2 have a GPU
 * all_reduce stuck on the parent (rank 1 never joins it); the shrink fails it
 * with C10D_EABORTED and makes the child with ncclCommShrink(NCCL_SHRINK_ABORT),
 * which ends the stuck kernel; the child then works. Rank 1 leaves once told. */
static int shrink_abort_main(int rank, int n, void *arg)
{
    (void)n;
    (void)arg;
    c10d_pg *pg = init_group(1, 30000);
    MP_CHECK(pg != NULL, "init");
    c10d_store *st = NULL;
    MP_CHECK(c10d_pg_store(pg, &st) == 0, "store: %s", c10d_last_error());
    if (rank == 1) {
        void *v = NULL;
        size_t len = 0;
        MP_CHECK(c10d_store_get_sync(st, "shrunk", &v, &len) == 0, "get: %s", c10d_last_error());
        free(v);
        c10d_store_release(st);
        c10d_pg_abort(pg, "excluded");
        c10d_shutdown();
        return 0;
    }
    c10d_op_opts o = gpu_opts();
    float *buf = dev_alloc(sizeof(float));
    float v = 5.0f;
    to_dev(buf, &v, sizeof v);
    c10d_work *w = NULL;
    MP_CHECK(c10d_all_reduce(pg, buf, buf, 1, C10D_FLOAT32, C10D_SUM, &o, &w) == 0, "post: %s",
             c10d_last_error());
    usleep(100000);
    MP_CHECK(c10d_work_test(w) == 0, "the op ended without rank 1");
    c10d_pg_opts so = C10D_PG_OPTS_INIT;
    so.shrink_flags = C10D_SHRINK_ABORT;
    c10d_pg *small = NULL;
    MP_CHECK(c10d_pg_shrink(pg, (int[]){1}, 1, &so, &small) == 0, "shrink: %s", c10d_last_error());
    MP_CHECK(c10d_work_test(w) == 1, "the parent's op still pending");
    int rc = c10d_work_wait(w, 0);
    MP_CHECK(rc == C10D_EABORTED, "stuck op: %s: %s", c10d_status_name(rc), c10d_last_error());
    c10d_work_release(w);
    int sum = 0;
    rc = shrink_sum(small, rank, &sum);
    MP_CHECK(rc == 0 && sum == 1 + 3, "shrunk all_reduce: %d sum %d: %s", rc, sum,
             c10d_last_error());
    MP_CHECK(c10d_pg_error(pg) == C10D_EABORTED, "parent's error");
    if (rank == 0)
        MP_CHECK(c10d_store_set_sync(st, "shrunk", "1", 1) == 0, "set: %s", c10d_last_error());
    c10d_store_release(st);
    MP_CHECK(c10d_pg_destroy(small) == 0, "destroy: %s", c10d_last_error());
    c10d_pg_abort(pg, "test");
    c10d_shutdown();
    return 0;
}

/* c10d_pg_split of a bound group splits its communicator with every rank's
 * color in one ncclCommSplit (rank 1: no color), ordered by key; then
 * C10D_DEBUG=DETAIL catches a dtype mismatch NCCL's wire cannot carry: the
 * call fails on every rank, and the group goes on. */
static int split_detail_main(int rank, int n, void *arg)
{
    (void)arg;
    c10d_pg *pg = init_group(1, 60000);
    MP_CHECK(pg != NULL, "init");
    c10d_pg *sub = NULL;
    MP_CHECK(c10d_pg_split(pg, rank == 1 ? C10D_SPLIT_NO_COLOR : 5, -rank, NULL, &sub) == 0,
             "split: %s", c10d_last_error());
    if (rank == 1) {
        MP_CHECK(!c10d_pg_is_member(sub), "rank 1 is a member");
    } else {
        /* Keys -2 and 0: rank 2 comes first. */
        MP_CHECK(c10d_pg_size(sub) == 2 && c10d_pg_rank(sub) == (rank == 2 ? 0 : 1),
                 "split rank %d", c10d_pg_rank(sub));
        if (check_all_reduce(sub, c10d_pg_rank(sub), 2, C10D_INT32, C10D_SUM, 33, 0))
            return 1;
    }
    MP_CHECK(c10d_pg_destroy(sub) == 0, "destroy split: %s", c10d_last_error());
    setenv("C10D_DEBUG", "DETAIL", 1);
    c10d__env_reload();
    void *buf = dev_alloc(64);
    c10d_op_opts o = gpu_opts();
    c10d_work *w = NULL;
    int rc =
        c10d_all_reduce(pg, buf, buf, 4, rank == 0 ? C10D_FLOAT32 : C10D_INT32, C10D_SUM, &o, &w);
    MP_CHECK(rc == C10D_EINVAL &&
                 strstr(c10d_last_error(), "Detected mismatch between collectives") != NULL &&
                 strstr(c10d_last_error(), "Tensor dtypes: ") != NULL,
             "DETAIL: %s: %s", c10d_status_name(rc), c10d_last_error());
    if (check_all_reduce(pg, rank, n, C10D_FLOAT32, C10D_SUM, 9, 0))
        return 1;
    cu->cudaFree(buf);
    MP_CHECK(c10d_pg_destroy(pg) == 0, "destroy: %s", c10d_last_error());
    c10d_shutdown();
    return fails ? 1 : 0;
}

static void test_split_and_detail(void **s)
{
    (void)s;
    run(3, split_detail_main, NULL, 90);
}

/* Object collectives of a group without a host backend ("nccl" alone,
 * "cuda:tcp" alone) go through device memory: 0 B, 1 B and 1 MiB strings. */
static size_t obj_len(int who)
{
    static const size_t lens[] = {0, 1, (size_t)1 << 20};
    return lens[who % 3];
}

static int obj_same(const c10d_bytes *b, int who)
{
    if (b->len != obj_len(who))
        return 0;
    for (size_t i = 0; i < b->len; i++)
        if (((unsigned char *)b->data)[i] != (unsigned char)(who * 7 + i))
            return 0;
    return 1;
}

static c10d_bytes obj_make(int who)
{
    c10d_bytes b = {malloc(obj_len(who) + 1), obj_len(who)};
    for (size_t i = 0; i < b.len; i++)
        ((unsigned char *)b.data)[i] = (unsigned char)(who * 7 + i);
    return b;
}

static int objects_main(int rank, int n, void *arg)
{
    backend_override = arg != NULL ? "cuda:tcp" : "nccl";
    c10d_pg *pg = init_group(arg == NULL, 60000);
    MP_CHECK(pg != NULL, "init");
    MP_CHECK(c10d_pg_bound_device(pg) == (arg == NULL ? my_device : -1), "bound device %d",
             c10d_pg_bound_device(pg));
    /* nccl alone: CUDA buffers only, split and shrink by NCCL itself. */
    if (arg == NULL)
        MP_CHECK(c10d_pg_supports(pg, C10D_CAP_HOST) == 0 &&
                     c10d_pg_supports(pg, C10D_CAP_CUDA) == 1 &&
                     c10d_pg_supports(pg, C10D_CAP_SPLIT) == 1 &&
                     c10d_pg_supports(pg, C10D_CAP_SHRINK) == 1,
                 "nccl capabilities");
    /* Bound to a device, the group's objects go through that device whatever
     * the caller's thread has current (NCCL refuses memory of another
     * device), and the caller keeps its own. */
    int other = (my_device + 1) % 3;
    void *sim = dlopen(getenv("C10D_NCCL_LIBRARY"), RTLD_LAZY | RTLD_NOLOAD);
    unsigned long (*comms_made)(void) =
        sim != NULL ? (unsigned long (*)(void))dlsym(sim, "c10d_gpusim_comms_made") : NULL;
    unsigned long comms0 = 0;
    if (arg == NULL) {
        /* The group's communicator, made now rather than by the objects. */
        c10d_op_opts o = gpu_opts();
        float *one = dev_alloc(sizeof(float));
        c10d_work *w;
        MP_CHECK(finish(c10d_all_reduce(pg, one, one, 1, C10D_FLOAT32, C10D_SUM, &o, &w), &w) == 0,
                 "all_reduce: %s", c10d_last_error());
        cu->cudaFree(one);
        comms0 = comms_made != NULL ? comms_made() : 0;
        cu->cudaSetDevice(other);
    }
    c10d_bytes mine = obj_make(rank), all[4];
    MP_CHECK(c10d_all_gather_object(pg, mine.data, mine.len, all, NULL) == 0,
             "all_gather_object: %s", c10d_last_error());
    for (int r = 0; r < n; r++)
        MP_CHECK(obj_same(&all[r], r), "all_gather_object: rank %d's %zu bytes", r, all[r].len);
    c10d_bytes_free(all, n);
    /* A barrier names no device: it runs on the bound (or current) one, as
     * torch's does, rather than asking for a host backend the group lacks. */
    MP_CHECK(c10d_barrier_sync(pg) == 0, "barrier without device options: %s", c10d_last_error());
    c10d_bytes list[3];
    for (int i = 0; i < 3; i++)
        list[i] = rank == 0 ? obj_make(i + 3) : (c10d_bytes){NULL, 0};
    MP_CHECK(c10d_broadcast_object_list(pg, list, 3, 0, NULL) == 0, "broadcast_object_list: %s",
             c10d_last_error());
    for (int i = 0; i < 3; i++)
        MP_CHECK(obj_same(&list[i], i + 3), "broadcast_object_list: object %d", i);
    c10d_bytes_free(list, 3);
    c10d_bytes_free(&mine, 1);
    int cur = -1;
    cu->cudaGetDevice(&cur);
    MP_CHECK(arg != NULL || cur == other, "the caller's device is %d after the objects, not %d",
             cur, other);
    MP_CHECK(arg != NULL || comms_made == NULL || comms_made() == comms0,
             "the objects made %lu more communicators (on the caller's device, not the group's)",
             comms_made() - comms0);
    MP_CHECK(c10d_pg_destroy(pg) == 0, "destroy: %s", c10d_last_error());
    c10d_shutdown();
    return 0;
}

static void test_objects_nccl_only(void **s)
{
    (void)s;
    run(2, objects_main, NULL, 90);
}

static void test_objects_tcp_cuda_only(void **s)
{
    (void)s;
    run_on(2, objects_main, (void *)1, 90, 1);
}

/* CUDA buffers on the tcp backend: the whole matrix, staged. */
static void test_tcp_cuda_2(void **s)
{
    (void)s;
    run_on(2, ops_main, (void *)3, 180, 1); /* tcp: ranks may share a GPU */
}

static void test_tcp_cuda_3(void **s)
{
    (void)s;
    run_on(3, ops_main, (void *)3, 180, 1);
}

static void test_shrink(void **s)
{
    (void)s;
    run(3, shrink_main, NULL, 90);
    run(3, shrink_main, (void *)1, 90);
    run(3, shrink_abort_main, NULL, 90);
}

/* A missing library: the tcp group works from the same binary; asking for
 * nccl fails naming what is missing. */
static int missing_main(int rank, int n, void *arg)
{
    (void)arg;
    setenv("C10D_NCCL_LIBRARY", "/nonexistent/libnccl.so.2", 1);
    c10d__env_reload();
    c10d_pg_opts po = C10D_PG_OPTS_INIT;
    po.backend = "nccl";
    c10d_pg *pg;
    int rc = c10d_pg_init(&po, &pg);
    MP_CHECK(rc == C10D_EUNSUPPORTED && strstr(c10d_last_error(), "/nonexistent/libnccl.so.2"),
             "got %d: %s", rc, c10d_last_error());
    po.backend = "tcp";
    MP_CHECK(c10d_pg_init(&po, &pg) == 0, "tcp: %s", c10d_last_error());
    int64_t v = rank;
    MP_CHECK(c10d_all_reduce_sync(pg, &v, &v, 1, C10D_INT64, C10D_SUM) == 0, "tcp op");
    MP_CHECK(v == (int64_t)n * (n - 1) / 2, "sum");
    c10d_pg_destroy(pg);
    c10d_shutdown();
    return 0;
}

static void test_missing_library(void **s)
{
    (void)s;
    run_on(2, missing_main, NULL, 60, 1); /* no communicator is made */
}

/* Whatever a rank that died left in /dev/shm (the simulation's names). */
static int reap_at_end(void **s)
{
    (void)s;
    (void)sim_reap();
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ops_1),
        cmocka_unit_test(test_ops_1_nonblocking),
        cmocka_unit_test(test_ops_2_lazy),
        cmocka_unit_test(test_ops_2_nonblocking),
        cmocka_unit_test(test_ops_3_bound),
        cmocka_unit_test(test_scalable_init),
        cmocka_unit_test(test_hang_times_out),
        cmocka_unit_test(test_stalled_stream),
        cmocka_unit_test(test_older_nccl),
        cmocka_unit_test(test_first_launch_blocks),
        cmocka_unit_test(test_threads_use_the_group_device),
        cmocka_unit_test(test_async_error),
        cmocka_unit_test(test_nan_check),
        cmocka_unit_test(test_timing),
        cmocka_unit_test(test_sticky_error),
        cmocka_unit_test(test_init_never_joins),
        cmocka_unit_test(test_loop_never_blocks),
        cmocka_unit_test(test_shrink),
        cmocka_unit_test(test_split_and_detail),
        cmocka_unit_test(test_tcp_cuda_2),
        cmocka_unit_test(test_tcp_cuda_3),
        cmocka_unit_test(test_objects_nccl_only),
        cmocka_unit_test(test_objects_tcp_cuda_only),
        cmocka_unit_test(test_tcp_cuda_stalled_stream),
        cmocka_unit_test(test_missing_library),
    };
    /* C10D_TEST_FILTER=test_ops_2_lazy runs the tests it matches (cmocka's filter). */
    const char *only = getenv("C10D_TEST_FILTER");
    if (only != NULL && *only != '\0')
        cmocka_set_test_filter(only);
    return cmocka_run_group_tests(tests, NULL, reap_at_end);
}
