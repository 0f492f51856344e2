/* Host cost per op of the nccl backend against raw NCCL, on one GPU.
 *
 *   bench_nccl_host [-n ITERS] [-r ROUNDS] [-b BYTES] [-m raw|c10d|both] [-d DEVICE]
 *
 * One rank, an in-place float32 all_reduce of BYTES (default 4): NCCL has no
 * peer to talk to, so the GPU has (almost) nothing to do and what is timed
 * is the host's share: the time to issue ITERS back-to-back ops, divided by
 * ITERS, before waiting for them. Each round is one such loop; the median of
 * ROUNDS rounds is printed (and the min), then the time until all of a
 * round's ops completed. `raw` calls ncclAllReduce on a stream; `c10d` calls
 * c10d_all_reduce on a 1-rank group bound to the device and releases each
 * work (the caller's stream event, the communicator stream's wait, start and
 * end events and the poller are all in it). bench/nccl_host_torch.py does
 * the same with torch.distributed; bench/gpu_proof.sh runs all three.
 *
 * CUDA and NCCL are the ones libc10d loads (C10D_CUDART_LIBRARY,
 * C10D_NCCL_LIBRARY), so both modes use the very same libraries. */
#include "gpu/gpu_api.h"
#include "c10d.h"
#include "engine/error.h"
#include "engine/loop.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct opts {
    int iters, rounds, device;
    size_t bytes;
    int raw, c10d;
};

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void report(const char *name, const struct opts *o, double *issue_us, double *done_us)
{
    qsort(issue_us, (size_t)o->rounds, sizeof *issue_us, cmp_double);
    qsort(done_us, (size_t)o->rounds, sizeof *done_us, cmp_double);
    printf("%-6s %9zu B  host us/op: median %7.3f  min %7.3f   issue+complete us/op: median "
           "%7.3f  (%d rounds x %d ops)\n",
           name, o->bytes, issue_us[o->rounds / 2], issue_us[0], done_us[o->rounds / 2], o->rounds,
           o->iters);
}

#define NCCL_OK(call, what)                                                                        \
    do {                                                                                           \
        ncclResult_t r_ = (call);                                                                  \
        if (r_ != ncclSuccess) {                                                                   \
            fprintf(stderr, "bench_nccl_host: %s: %s\n", what, api->nccl.ncclGetErrorString(r_));  \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)
#define CUDA_OK(call, what)                                                                        \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "bench_nccl_host: %s: %s\n", what, api->cuda.cudaGetErrorString(e_));  \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

static int run_raw(const struct c10d__gpu_api *api, const struct opts *o, void *buf)
{
    cudaStream_t st;
    CUDA_OK(api->cuda.cudaStreamCreateWithPriority(&st, cudaStreamNonBlocking, 0), "stream");
    ncclUniqueId id;
    NCCL_OK(api->nccl.ncclGetUniqueId(&id), "ncclGetUniqueId");
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    ncclComm_t comm;
    NCCL_OK(api->nccl.ncclCommInitRankConfig(&comm, 1, id, 0, &cfg), "ncclCommInitRankConfig");
    size_t count = o->bytes / 4;
    double *issue = calloc((size_t)o->rounds, sizeof *issue);
    double *done = calloc((size_t)o->rounds, sizeof *done);
    for (int w = 0; w < o->iters; w++) /* warm-up */
        NCCL_OK(api->nccl.ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, comm, st),
                "ncclAllReduce");
    CUDA_OK(api->cuda.cudaStreamSynchronize(st), "sync");
    for (int r = 0; r < o->rounds; r++) {
        uint64_t t0 = c10d__now_ns();
        for (int i = 0; i < o->iters; i++)
            NCCL_OK(api->nccl.ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, comm, st),
                    "ncclAllReduce");
        uint64_t t1 = c10d__now_ns();
        CUDA_OK(api->cuda.cudaStreamSynchronize(st), "sync");
        uint64_t t2 = c10d__now_ns();
        issue[r] = (double)(t1 - t0) / 1e3 / o->iters;
        done[r] = (double)(t2 - t0) / 1e3 / o->iters;
    }
    report("raw", o, issue, done);
    free(issue);
    free(done);
    api->nccl.ncclCommDestroy(comm);
    api->cuda.cudaStreamDestroy(st);
    return 0;
}

static int run_c10d(const struct c10d__gpu_api *api, const struct opts *o, void *buf)
{
    c10d_store *store;
    if (c10d_store_hash_create(&store) != 0)
        return 1;
    c10d_pg_opts po = C10D_PG_OPTS_INIT;
    po.backend = "nccl";
    po.store = store;
    po.rank = 0;
    po.world_size = 1;
    po.bind_device = 1;
    po.device_index = o->device;
    c10d_pg *pg;
    if (c10d_pg_init(&po, &pg) != 0) {
        fprintf(stderr, "bench_nccl_host: c10d_pg_init: %s\n", c10d_last_error());
        return 1;
    }
    c10d_op_opts oo = C10D_OP_OPTS_INIT;
    oo.device_type = C10D_DEVICE_CUDA;
    oo.device_index = o->device;
    size_t count = o->bytes / 4;
    double *issue = calloc((size_t)o->rounds, sizeof *issue);
    double *done = calloc((size_t)o->rounds, sizeof *done);
    int rc = 0;
    for (int r = -1; r < o->rounds && rc == 0; r++) { /* round -1: warm-up */
        c10d_work *w = NULL;
        uint64_t t0 = c10d__now_ns();
        for (int i = 0; i < o->iters && rc == 0; i++) {
            rc = c10d_all_reduce(pg, buf, buf, count, C10D_FLOAT32, C10D_SUM, &oo, &w);
            if (rc == 0 && i + 1 < o->iters)
                c10d_work_release(w);
        }
        uint64_t t1 = c10d__now_ns();
        if (rc == 0)
            rc = c10d_work_wait_release(w); /* the last: completions are in order */
        uint64_t t2 = c10d__now_ns();
        if (r >= 0) {
            issue[r] = (double)(t1 - t0) / 1e3 / o->iters;
            done[r] = (double)(t2 - t0) / 1e3 / o->iters;
        }
    }
    if (rc != 0)
        fprintf(stderr, "bench_nccl_host: c10d_all_reduce: %s\n", c10d_last_error());
    else
        report("c10d", o, issue, done);
    free(issue);
    free(done);
    c10d_pg_destroy(pg);
    c10d_store_release(store);
    (void)api;
    return rc != 0;
}

int main(int argc, char **argv)
{
    struct opts o = {.iters = 1000, .rounds = 11, .bytes = 4, .raw = 1, .c10d = 1};
    int c;
    while ((c = getopt(argc, argv, "n:r:b:m:d:")) != -1) {
        switch (c) {
        case 'n':
            o.iters = atoi(optarg);
            break;
        case 'r':
            o.rounds = atoi(optarg);
            break;
        case 'b':
            o.bytes = strtoull(optarg, NULL, 10);
            break;
        case 'd':
            o.device = atoi(optarg);
            break;
        case 'm':
            o.raw = strcmp(optarg, "c10d") != 0;
            o.c10d = strcmp(optarg, "raw") != 0;
            break;
        default:
            fprintf(stderr, "usage: bench_nccl_host [-n ITERS] [-r ROUNDS] [-b BYTES] "
                            "[-m raw|c10d|both] [-d DEVICE]\n");
            return 2;
        }
    }
    if (o.iters < 1 || o.rounds < 1 || o.bytes < 4) {
        fprintf(stderr, "bench_nccl_host: -n, -r >= 1 and -b >= 4\n");
        return 2;
    }
    const struct c10d__gpu_api *api;
    if (c10d__nccl_load(&api) != 0) {
        fprintf(stderr, "bench_nccl_host: %s\n", c10d_last_error());
        return 1;
    }
    char info[512];
    c10d__gpu_describe(info, sizeof info);
    printf("# bench_nccl_host: %s\n", info);
    void *buf = NULL;
    if (api->cuda.cudaSetDevice(o.device) != cudaSuccess ||
        api->cuda.cudaMalloc(&buf, o.bytes) != cudaSuccess) {
        fprintf(stderr, "bench_nccl_host: no buffer on device %d\n", o.device);
        return 1;
    }
    int rc = 0;
    if (o.raw)
        rc |= run_raw(api, &o, buf);
    if (o.c10d && rc == 0)
        rc |= run_c10d(api, &o, buf);
    api->cuda.cudaFree(buf);
    c10d_shutdown();
    return rc;
}
