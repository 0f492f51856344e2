/* c10d-bench: nccl-tests for libc10d. Launch one per rank (c10drun):
 *
 *   c10drun -n 2 build/bench/c10d-bench -o all_reduce -b 4 -e 64M -f 2
 *
 * Sizes are bytes of the largest buffer of the op (nccl-tests' convention);
 * `count` is that size in elements. time(us) is the slowest rank's mean over
 * the timed iterations; algbw = size / time; busbw = algbw x the op's
 * nccl-tests factor, which makes it comparable with the link speed. With
 * -z 1 each op is timed alone too, and p50/p99/max(us) give the slowest
 * rank's percentiles of those times: a stall anywhere shows in max. That
 * costs a clock read per op in the timed loop (25 ns here); -p 0 leaves it
 * out, as peer benches that time the loop alone do.
 *
 * --backend nccl --device cuda runs on one GPU per rank (LOCAL_RANK). Inputs
 * are made and outputs checked on the host and copied across, outside the
 * timed loop, so one reference serves both backends. */
#include "c10d.h"
#include "data.h"
#include "engine/error.h"

#include "gpu/gpu_api.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

enum bench_op {
    B_ALL_REDUCE,
    B_ALL_GATHER,
    B_REDUCE_SCATTER,
    B_BROADCAST,
    B_REDUCE,
    B_ALL_TO_ALL,
    B_GATHER,
    B_SCATTER,
    B_SENDRECV,
    B_PINGPONG,
    B_NOPS
};
static const char *const op_names[B_NOPS] = {
    "all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce",
    "all_to_all", "gather",     "scatter",        "sendrecv",  "pingpong"};

struct opts {
    enum bench_op op;
    c10d_dtype dtype;
    c10d_reduce_op redop;
    size_t min_bytes, max_bytes;
    double factor;
    int iters, warmup, check, blocking, percentiles;
    int in_place;   /* all_reduce, reduce: one buffer is input and output */
    int timeout_ms; /* the group's; 0: the library's default */
    const char *backend;
    c10d_device_type device;
    int root;
};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: c10d-bench [-o OP] [-d DTYPE] [-r REDOP] [-b MIN] [-e MAX] [-f FACTOR]\n"
            "                  [-n ITERS] [-w WARMUP] [-c 0|1] [-z 0|1] [-p 0|1] [-i 0|1]\n"
            "                  [-t MS] [--root R] [--backend tcp|nccl] [--device cpu|cuda]\n"
            "  -o  all_reduce (default), all_gather, reduce_scatter, broadcast, reduce,\n"
            "      all_to_all, gather, scatter (the size: the root's whole buffer),\n"
            "      sendrecv, pingpong (ranks 2k and 2k+1: a send, then the answer back;\n"
            "      one op's time is the round trip)\n"
            "  -d  dtype (float32 default; float64 float16 bfloat16 int8 uint8 int32 int64 bool)\n"
            "  -r  reduce op (sum default; avg prod min max band bor bxor premul_sum)\n"
            "  -b, -e  smallest / largest size in bytes, K/M/G suffixes (default 4 .. 64M)\n"
            "  -f  multiply the size by this each step (default 2)\n"
            "  -n  timed iterations per size (default 20), -w warm-up iterations (default 5)\n"
            "  -c  1: after each size's timed ops, one more on fresh inputs, its result\n"
            "      checked against a reference, as nccl-tests' -c (default 1)\n"
            "  -z  1: wait for each op before issuing the next, as MPI and blocking torch\n"
            "      calls do (time = latency), and print p50/p99/max of the ops' times;\n"
            "      0: issue all, then wait (default 0)\n"
            "  -p  0: with -z 1, time only the loop, without a clock read per op (as the\n"
            "      MPI and gloo peer benches time theirs; no p50/p99/max); 1: default\n"
            "  -i  1: all_reduce and reduce in place, one buffer for input and output, as\n"
            "      torch's all_reduce and MPI_IN_PLACE (default 0: two buffers, as\n"
            "      nccl-tests' out-of-place column)\n"
            "  -t  the group's timeout in ms (default: the library's, 30 minutes, 10 with\n"
            "      nccl): a peer that stops or never comes fails the group's creation or\n"
            "      op after it\n"
            "  --root  the root of broadcast, reduce, gather and scatter (default 0)\n"
            "  --backend nccl --device cuda: CUDA buffers, one GPU per rank (LOCAL_RANK)\n"
            "  --backend tcp --device cuda: CUDA buffers staged through host memory (several\n"
            "      ranks may share a GPU)\n"
            "Run one process per rank, e.g. with c10drun -n 2 c10d-bench ...\n");
}

/* "64M" -> 67108864. 0 on a malformed size. */
static int parse_size(const char *s, size_t *out)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || v < 0)
        return -1;
    double mult = 1;
    switch (*end) {
    case 'k':
    case 'K':
        mult = 1024.0;
        end++;
        break;
    case 'm':
    case 'M':
        mult = 1024.0 * 1024;
        end++;
        break;
    case 'g':
    case 'G':
        mult = 1024.0 * 1024 * 1024;
        end++;
        break;
    default:
        break;
    }
    if (*end == 'B' || *end == 'b')
        end++;
    if (*end != '\0')
        return -1;
    *out = (size_t)(v * mult);
    return 0;
}

static int parse_int(const char *s, int lo, int *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || *end != '\0' || v < lo || v > 1000000000)
        return -1;
    *out = (int)v;
    return 0;
}

static int parse_args(int argc, char **argv, struct opts *o)
{
    memset(o, 0, sizeof *o);
    o->op = B_ALL_REDUCE;
    o->dtype = C10D_FLOAT32;
    o->redop = C10D_SUM;
    o->min_bytes = 4;
    o->max_bytes = 64u << 20;
    o->factor = 2;
    o->iters = 20;
    o->warmup = 5;
    o->check = 1;
    o->percentiles = 1;
    o->backend = "tcp";
    // clang-format off
    static const struct option longopts[] = {
        {"op", required_argument, NULL, 'o'},
        {"dtype", required_argument, NULL, 'd'},
        {"redop", required_argument, NULL, 'r'},
        {"minbytes", required_argument, NULL, 'b'},
        {"maxbytes", required_argument, NULL, 'e'},
        {"stepfactor", required_argument, NULL, 'f'},
        {"iters", required_argument, NULL, 'n'},
        {"warmup_iters", required_argument, NULL, 'w'},
        {"check", required_argument, NULL, 'c'},
        {"backend", required_argument, NULL, 'B'},
        {"device", required_argument, NULL, 'D'},
        {"root", required_argument, NULL, 'R'},
        {"blocking", required_argument, NULL, 'z'},
        {"percentiles", required_argument, NULL, 'p'},
        {"in_place", required_argument, NULL, 'i'},
        {"timeout_ms", required_argument, NULL, 't'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    // clang-format on
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "o:d:r:b:e:f:n:w:c:z:p:i:t:h", longopts, NULL)) != -1) {
        int bad = 0;
        switch (c) {
        case 'o':
            bad = 1;
            for (int i = 0; i < B_NOPS; i++)
                if (strcasecmp(optarg, op_names[i]) == 0)
                    o->op = (enum bench_op)i, bad = 0;
            break;
        case 'd':
            bad = c10d_dtype_from_name(optarg, &o->dtype) != 0;
            break;
        case 'r':
            bad = c10d_reduce_op_from_name(optarg, &o->redop) != 0;
            break;
        case 'b':
            bad = parse_size(optarg, &o->min_bytes) != 0;
            break;
        case 'e':
            bad = parse_size(optarg, &o->max_bytes) != 0;
            break;
        case 'f':
            o->factor = strtod(optarg, NULL);
            bad = !(o->factor > 1.0);
            break;
        case 'n':
            bad = parse_int(optarg, 1, &o->iters) != 0;
            break;
        case 'w':
            bad = parse_int(optarg, 0, &o->warmup) != 0;
            break;
        case 'c':
            bad = parse_int(optarg, 0, &o->check) != 0 || o->check > 1;
            break;
        case 'z':
            bad = parse_int(optarg, 0, &o->blocking) != 0 || o->blocking > 1;
            break;
        case 'p':
            bad = parse_int(optarg, 0, &o->percentiles) != 0 || o->percentiles > 1;
            break;
        case 'i':
            bad = parse_int(optarg, 0, &o->in_place) != 0 || o->in_place > 1;
            break;
        case 't':
            bad = parse_int(optarg, 1, &o->timeout_ms) != 0;
            break;
        case 'R':
            bad = parse_int(optarg, 0, &o->root) != 0;
            break;
        case 'B':
            o->backend = optarg;
            bad = strcmp(optarg, "tcp") != 0 && strcmp(optarg, "nccl") != 0;
            break;
        case 'D':
            if (strcmp(optarg, "cpu") == 0)
                o->device = C10D_DEVICE_CPU;
            else if (strcmp(optarg, "cuda") == 0)
                o->device = C10D_DEVICE_CUDA;
            else
                bad = 1;
            break;
        case 'h':
            usage(stdout);
            exit(0);
        default:
            usage(stderr);
            return -1;
        }
        if (bad) {
            fprintf(stderr, "c10d-bench: invalid value \"%s\" for -%c\n", optarg,
                    c < 128    ? c
                    : c == 'B' ? 'B'
                               : '-');
            return -1;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "c10d-bench: unexpected argument \"%s\"\n", argv[optind]);
        return -1;
    }
    if (o->min_bytes > o->max_bytes) {
        fprintf(stderr, "c10d-bench: -b %zu is larger than -e %zu\n", o->min_bytes, o->max_bytes);
        return -1;
    }
    if (o->in_place && o->op != B_ALL_REDUCE && o->op != B_REDUCE) {
        fprintf(stderr,
                "c10d-bench: -i 1 is for all_reduce and reduce (broadcast is always in "
                "place), not %s\n",
                op_names[o->op]);
        return -1;
    }
    int nccl = strcmp(o->backend, "nccl") == 0;
    if (nccl && o->device != C10D_DEVICE_CUDA) {
        fprintf(stderr, "c10d-bench: --backend nccl takes CUDA buffers: add --device cuda\n");
        return -1;
    }
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int is_reduction(enum bench_op op)
{
    return op == B_ALL_REDUCE || op == B_REDUCE_SCATTER || op == B_REDUCE;
}

static double bus_factor(enum bench_op op, int n)
{
    switch (op) {
    case B_ALL_REDUCE:
        return 2.0 * (n - 1) / n;
    case B_REDUCE_SCATTER:
    case B_ALL_GATHER:
    case B_ALL_TO_ALL:
    case B_GATHER:
    case B_SCATTER:
        return (double)(n - 1) / n;
    default:
        return 1.0;
    }
}

struct run {
    const struct opts *o;
    c10d_pg *pg;
    int rank, n;
    size_t esize;
    size_t count;        /* elements of the largest buffer */
    size_t block;        /* per-rank block (gather/scatter/all-to-all kinds) */
    void *send, *recv;   /* the op's buffers: on the device with --device cuda */
    void *hsend, *hrecv; /* where inputs are made and outputs checked: send/recv on the host */
    void *scratch;       /* device: the one element of the bench's own all_reduces */
    c10d_op_opts op_opts;
    c10d_op_opts book_opts; /* the bench's own ops: the buffers' device, nothing else */
    const struct c10d__cudart_api *cu;
    double *lat; /* -z 1: each timed op's time in us, or NULL (warm-up) */
};

static int on_device(const struct run *r)
{
    return r->o->device == C10D_DEVICE_CUDA;
}

/* Host -> op buffer (a copy when the op's buffer is on the device). cudaMemcpy
 * is ordered on the default stream, the stream the ops are issued after. */
static int put(struct run *r, void *dst, const void *src, size_t bytes)
{
    if (dst == src || bytes == 0)
        return 0;
    C10D__CUDA_CHECK(r->cu, r->cu->cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice),
                     "cudaMemcpy to the device");
    return 0;
}

/* Op buffer -> host; only after the op's work completed (its end event fired). */
static int get(struct run *r, void *dst, const void *src, size_t bytes)
{
    if (dst == src || bytes == 0)
        return 0;
    C10D__CUDA_CHECK(r->cu, r->cu->cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost),
                     "cudaMemcpy to the host");
    return 0;
}

/* The bench's own one-element all_reduce (slowest time, wrong count). A nccl
 * group has no host backend, so with --device cuda it goes through the
 * device. */
static int agree(struct run *r, void *v, c10d_dtype dt, c10d_reduce_op op)
{
    if (!on_device(r))
        return c10d_all_reduce_sync(r->pg, v, v, 1, dt, op);
    size_t es = c10d_dtype_size(dt);
    C10D_CHECK(put(r, r->scratch, v, es));
    c10d_work *w = NULL;
    int rc = c10d_all_reduce(r->pg, r->scratch, r->scratch, 1, dt, op, &r->book_opts, &w);
    if (rc == 0)
        rc = c10d_work_wait_release(w);
    return rc != 0 ? rc : get(r, v, r->scratch, es);
}

static int barrier(struct run *r)
{
    if (!on_device(r))
        return c10d_barrier_sync(r->pg);
    c10d_work *w = NULL;
    int rc = c10d_barrier(r->pg, &r->book_opts, &w);
    return rc != 0 ? rc : c10d_work_wait_release(w);
}

/* Issues one op; the work goes to *w. */
static int issue(struct run *r, c10d_work **w)
{
    const struct opts *o = r->o;
    switch (o->op) {
    case B_ALL_REDUCE:
        return c10d_all_reduce(r->pg, o->in_place ? r->recv : r->send, r->recv, r->count, o->dtype,
                               o->redop, &r->op_opts, w);
    case B_ALL_GATHER:
        return c10d_all_gather(r->pg, r->send, r->recv, r->block, o->dtype, &r->op_opts, w);
    case B_REDUCE_SCATTER:
        return c10d_reduce_scatter(r->pg, r->send, r->recv, r->block, o->dtype, o->redop,
                                   &r->op_opts, w);
    case B_BROADCAST:
        /* In place, as torch's (one tensor) and MPI_Bcast: the root's output
         * holds its input (fill_inputs). */
        return c10d_broadcast(r->pg, r->recv, r->recv, r->count, o->dtype, o->root, &r->op_opts, w);
    case B_REDUCE:
        return c10d_reduce(r->pg, o->in_place ? r->recv : r->send, r->recv, r->count, o->dtype,
                           o->redop, o->root, &r->op_opts, w);
    case B_GATHER: /* the root's output holds every block, elsewhere none */
        return c10d_gather(r->pg, r->send, r->rank == o->root ? r->recv : NULL, r->block, o->dtype,
                           o->root, &r->op_opts, w);
    case B_SCATTER:
        return c10d_scatter(r->pg, r->rank == o->root ? r->send : NULL, r->recv, r->block, o->dtype,
                            o->root, &r->op_opts, w);
    case B_ALL_TO_ALL:
        return c10d_all_to_all_single(r->pg, r->send, r->recv, r->block * (size_t)r->n, NULL, NULL,
                                      o->dtype, &r->op_opts, w);
    case B_SENDRECV: {
        c10d_p2p_op ops[2] = {
            {C10D_P2P_SEND, r->send, r->count, o->dtype, (r->rank + 1) % r->n, 0},
            {C10D_P2P_RECV, r->recv, r->count, o->dtype, (r->rank + r->n - 1) % r->n, 0},
        };
        return c10d_batch_isend_irecv(r->pg, ops, 2, &r->op_opts, w);
    }
    case B_PINGPONG: {
        /* Single blocking ops, as osu_latency: the even rank serves first. */
        int peer = r->rank ^ 1;
        c10d_work *first = NULL;
        int rc = r->rank % 2 == 0
                     ? c10d_send(r->pg, r->send, r->count, o->dtype, peer, 0, &r->op_opts, &first)
                     : c10d_recv(r->pg, r->recv, r->count, o->dtype, peer, 0, &r->op_opts, &first);
        if (rc == 0)
            rc = c10d_work_wait_release(first);
        if (rc != 0)
            return rc;
        return r->rank % 2 == 0
                   ? c10d_recv(r->pg, r->recv, r->count, o->dtype, peer, 0, &r->op_opts, w)
                   : c10d_send(r->pg, r->send, r->count, o->dtype, peer, 0, &r->op_opts, w);
    }
    default:
        return C10D_EINVAL;
    }
}

static int fill_inputs(struct run *r)
{
    const struct opts *o = r->o;
    size_t in = o->op == B_REDUCE_SCATTER || o->op == B_ALL_TO_ALL || o->op == B_SCATTER
                    ? r->block * (size_t)r->n
                : o->op == B_ALL_GATHER || o->op == B_GATHER ? r->block
                                                             : r->count;
    data_fill(r->hsend, in, 0, r->rank, o->dtype, o->redop);
    if ((o->op == B_BROADCAST && r->rank == o->root) || o->in_place)
        memcpy(r->hrecv, r->hsend, r->count * r->esize);
    else
        memset(r->hrecv, 0xEE, r->count * r->esize);
    C10D_CHECK(put(r, r->send, r->hsend, in * r->esize));
    return put(r, r->recv, r->hrecv, r->count * r->esize);
}

/* Counts the wrong elements of this rank's output. */
static long check_outputs(struct run *r)
{
    const struct opts *o = r->o;
    long wrong = 0;
    double pre = r->op_opts.premul_factor;
    switch (o->op) {
    case B_ALL_REDUCE:
        for (size_t i = 0; i < r->count; i++)
            wrong += !data_close(data_load(r->hrecv, i, o->dtype),
                                 data_reduced(r->n, i, o->dtype, o->redop, pre), o->dtype);
        break;
    case B_REDUCE:
        if (r->rank == o->root)
            for (size_t i = 0; i < r->count; i++)
                wrong += !data_close(data_load(r->hrecv, i, o->dtype),
                                     data_reduced(r->n, i, o->dtype, o->redop, pre), o->dtype);
        break;
    case B_REDUCE_SCATTER:
        for (size_t i = 0; i < r->block; i++)
            wrong += !data_close(
                data_load(r->hrecv, i, o->dtype),
                data_reduced(r->n, (size_t)r->rank * r->block + i, o->dtype, o->redop, pre),
                o->dtype);
        break;
    case B_BROADCAST:
        for (size_t i = 0; i < r->count; i++)
            wrong += data_load(r->hrecv, i, o->dtype) != data_value(o->root, i, o->dtype, o->redop);
        break;
    case B_ALL_GATHER:
        for (int p = 0; p < r->n; p++)
            for (size_t i = 0; i < r->block; i++)
                wrong += data_load(r->hrecv, (size_t)p * r->block + i, o->dtype) !=
                         data_value(p, i, o->dtype, o->redop);
        break;
    case B_GATHER:
        for (int p = 0; r->rank == o->root && p < r->n; p++)
            for (size_t i = 0; i < r->block; i++)
                wrong += data_load(r->hrecv, (size_t)p * r->block + i, o->dtype) !=
                         data_value(p, i, o->dtype, o->redop);
        break;
    case B_SCATTER: /* block `rank` of the root's input */
        for (size_t i = 0; i < r->block; i++)
            wrong += data_load(r->hrecv, i, o->dtype) !=
                     data_value(o->root, (size_t)r->rank * r->block + i, o->dtype, o->redop);
        break;
    case B_ALL_TO_ALL:
        /* Block p of my output is block `rank` of rank p's input. */
        for (int p = 0; p < r->n; p++)
            for (size_t i = 0; i < r->block; i++)
                wrong += data_load(r->hrecv, (size_t)p * r->block + i, o->dtype) !=
                         data_value(p, (size_t)r->rank * r->block + i, o->dtype, o->redop);
        break;
    case B_PINGPONG:
        for (size_t i = 0; i < r->count; i++)
            wrong +=
                data_load(r->hrecv, i, o->dtype) != data_value(r->rank ^ 1, i, o->dtype, o->redop);
        break;
    case B_SENDRECV: {
        int from = (r->rank + r->n - 1) % r->n;
        for (size_t i = 0; i < r->count; i++)
            wrong += data_load(r->hrecv, i, o->dtype) != data_value(from, i, o->dtype, o->redop);
        break;
    }
    default:
        break;
    }
    return wrong;
}

/* Issues `iters` ops back to back and waits for all (with -z 1, waits for each
 * before the next); 0 or the first error. */
static int run_iters(struct run *r, int iters)
{
    if (r->o->blocking) {
        double t = r->lat != NULL ? now_s() : 0;
        for (int i = 0; i < iters; i++) {
            c10d_work *w = NULL;
            int rc = issue(r, &w);
            if (rc == 0)
                rc = c10d_work_wait_release(w);
            if (rc != 0)
                return rc;
            if (r->lat != NULL) {
                double t1 = now_s();
                r->lat[i] = (t1 - t) * 1e6;
                t = t1;
            }
        }
        return 0;
    }
    c10d_work **ws = calloc((size_t)iters, sizeof *ws);
    if (ws == NULL)
        return C10D_ENOMEM;
    int rc = 0, issued = 0;
    for (; issued < iters; issued++) {
        rc = issue(r, &ws[issued]);
        if (rc != 0)
            break;
    }
    for (int i = 0; i < issued; i++) {
        int st = c10d_work_wait_release(ws[i]);
        if (st != 0 && rc == 0)
            rc = st;
    }
    free(ws);
    return rc;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The q-quantile (nearest rank) of n sorted values. */
static double quantile(const double *v, int n, double q)
{
    int i = (int)(q * n + 0.999999) - 1;
    return v[i < 0 ? 0 : i >= n ? n - 1 : i];
}

/* time_us: mean per op; pct (-z 1): p50, p99, max per op, each the slowest rank's. */
static int run_size(struct run *r, size_t bytes, double *time_us, double pct[3], long *wrong)
{
    const struct opts *o = r->o;
    size_t elems = bytes / r->esize;
    int blocky = o->op == B_ALL_GATHER || o->op == B_REDUCE_SCATTER || o->op == B_ALL_TO_ALL ||
                 o->op == B_GATHER || o->op == B_SCATTER;
    r->block = blocky ? elems / (size_t)r->n : elems;
    r->count = blocky ? r->block * (size_t)r->n : elems;
    int rc = fill_inputs(r);
    if (rc == 0)
        rc = run_iters(r, o->warmup);
    if (rc == 0)
        rc = barrier(r);
    if (o->blocking && o->percentiles && rc == 0 &&
        (r->lat = malloc((size_t)o->iters * sizeof *r->lat)) == NULL)
        rc = C10D_ENOMEM;
    double t0 = now_s();
    if (rc == 0)
        rc = run_iters(r, o->iters);
    double mine = (now_s() - t0) / o->iters * 1e6;
    if (rc == 0 && r->lat != NULL) {
        qsort(r->lat, (size_t)o->iters, sizeof *r->lat, cmp_double);
        pct[0] = quantile(r->lat, o->iters, 0.50);
        pct[1] = quantile(r->lat, o->iters, 0.99);
        pct[2] = r->lat[o->iters - 1];
        for (int i = 0; i < 3 && rc == 0; i++)
            rc = agree(r, &pct[i], C10D_FLOAT64, C10D_MAX);
    }
    free(r->lat);
    r->lat = NULL;
    if (rc != 0)
        return rc;
    /* The slowest rank's time, as nccl-tests reports. */
    double slowest = mine;
    rc = agree(r, &slowest, C10D_FLOAT64, C10D_MAX);
    if (rc != 0)
        return rc;
    *time_us = slowest;
    *wrong = 0;
    if (o->check) {
        c10d_work *w = NULL;
        rc = fill_inputs(r);
        if (rc == 0)
            rc = issue(r, &w);
        if (rc == 0)
            rc = c10d_work_wait_release(w);
        if (rc == 0)
            rc = get(r, r->hrecv, r->recv, r->count * r->esize);
        if (rc != 0)
            return rc;
        int64_t bad = check_outputs(r);
        rc = agree(r, &bad, C10D_INT64, C10D_SUM);
        *wrong = (long)bad;
    }
    return rc;
}

/* One GPU per rank: LOCAL_RANK (c10drun and torchrun set it), else RANK
 * modulo the devices visible. It is made current before the group exists,
 * so that the group's communicator and the buffers land on it. */
static int pick_device(const struct c10d__cudart_api *cu, int shared, int *out)
{
    int n = 0;
    C10D__CUDA_CHECK(cu, cu->cudaGetDeviceCount(&n), "cudaGetDeviceCount");
    if (n <= 0)
        return c10d__fail(C10D_EUNSUPPORTED, "no CUDA device is visible");
    const char *local = getenv("LOCAL_RANK"), *rank = getenv("RANK");
    int dev = 0;
    if (local != NULL && *local != '\0') {
        /* Staged tcp lets several ranks share a GPU; NCCL wants one each. */
        if (parse_int(local, 0, &dev) == 0 && shared)
            dev %= n;
        else if (parse_int(local, 0, &dev) != 0 || dev >= n)
            return c10d__fail(C10D_EINVAL,
                              "LOCAL_RANK=%s names no CUDA device (%d visible; one GPU per rank)",
                              local, n);
    } else if (rank != NULL && parse_int(rank, 0, &dev) == 0) {
        dev %= n;
    }
    char what[64];
    snprintf(what, sizeof what, "cudaSetDevice(%d)", dev);
    C10D__CUDA_CHECK(cu, cu->cudaSetDevice(dev), what);
    *out = dev;
    return 0;
}

/* The op buffers on the device, their host twins in host memory. */
static int alloc_device(struct run *r, size_t cap)
{
    C10D__CUDA_CHECK(r->cu, r->cu->cudaMalloc(&r->send, cap), "cudaMalloc");
    C10D__CUDA_CHECK(r->cu, r->cu->cudaMalloc(&r->recv, cap), "cudaMalloc");
    C10D__CUDA_CHECK(r->cu, r->cu->cudaMalloc(&r->scratch, sizeof(int64_t)), "cudaMalloc");
    return 0;
}

static void free_buffers(struct run *r)
{
    if (on_device(r)) {
        /* After the group is gone: cudaFree waits for the device, and a
         * failed op's stream may be stuck until its communicator is aborted. */
        r->cu->cudaFree(r->send);
        r->cu->cudaFree(r->recv);
        r->cu->cudaFree(r->scratch);
    }
    free(r->hsend);
    free(r->hrecv);
}

int main(int argc, char **argv)
{
    struct opts o;
    if (parse_args(argc, argv, &o) != 0)
        return 2;
    struct run r = {0};
    r.o = &o;
    c10d_pg_opts po = C10D_PG_OPTS_INIT;
    if (o.timeout_ms > 0)
        po.timeout_ms = o.timeout_ms;
    /* tcp with CUDA buffers: staged through pinned host memory ("cuda:tcp"). */
    po.backend = o.device == C10D_DEVICE_CUDA && strcmp(o.backend, "tcp") == 0 ? "cpu:tcp,cuda:tcp"
                                                                               : o.backend;
    if (on_device(&r)) {
        int dev = 0;
        if (c10d__cuda_load(&r.cu) != 0 ||
            pick_device(r.cu, strcmp(o.backend, "tcp") == 0, &dev) != 0) {
            fprintf(stderr, "c10d-bench: %s\n", c10d_last_error());
            return 1;
        }
        /* Bound: the communicator is made now, so a missing library or a
         * peer that never comes fails here, not inside the first timed op. */
        po.bind_device = 1;
        po.device_index = dev;
        r.op_opts.device_index = dev;
    }
    c10d_pg *pg;
    int rc = c10d_pg_init(&po, &pg);
    if (rc != 0) {
        fprintf(stderr, "c10d-bench: init failed: %s: %s\n", c10d_status_name(rc),
                c10d_last_error());
        /* A peer may still be reading what this rank published from the
         * store it hosts: shutdown lets it finish (docs/store_client.md). */
        c10d_shutdown();
        return 1;
    }
    r.pg = pg;
    r.rank = c10d_pg_rank(pg);
    r.n = c10d_pg_size(pg);
    r.esize = c10d_dtype_size(o.dtype);
    r.op_opts.device_type = o.device;
    r.book_opts = r.op_opts;
    r.op_opts.premul_factor = o.redop == C10D_PREMUL_SUM ? 0.5 : 0;
    int exit_code = 0;
    if (o.root >= r.n || (o.op == B_SENDRECV && r.n < 2) || (o.op == B_PINGPONG && r.n % 2 != 0)) {
        if (r.rank == 0)
            fprintf(stderr, "c10d-bench: %s\n",
                    o.root >= r.n        ? "root out of range"
                    : o.op == B_SENDRECV ? "sendrecv needs at least 2 ranks"
                                         : "pingpong needs an even number of ranks");
        c10d_pg_destroy(pg);
        c10d_shutdown();
        return 2;
    }
    if (is_reduction(o.op) && c10d_reduce_op_check(o.redop, o.dtype) != 0) {
        if (r.rank == 0)
            fprintf(stderr, "c10d-bench: %s\n", c10d_last_error());
        c10d_pg_destroy(pg);
        c10d_shutdown();
        return 2;
    }
    size_t cap = o.max_bytes + (size_t)r.n * r.esize;
    /* all_gather writes n blocks; the others stay within the size. */
    r.hsend = malloc(cap);
    r.hrecv = malloc(cap);
    if (r.hsend == NULL || r.hrecv == NULL) {
        fprintf(stderr, "c10d-bench: out of memory for %zu-byte buffers\n", cap);
        return 1;
    }
    r.send = r.hsend;
    r.recv = r.hrecv;
    if (on_device(&r)) {
        r.send = r.recv = NULL;
        if (alloc_device(&r, cap) != 0) {
            fprintf(stderr, "c10d-bench: rank %d: %zu-byte device buffers: %s\n", r.rank, cap,
                    c10d_last_error());
            c10d_pg_abort(pg, "c10d-bench failed");
            free_buffers(&r);
            c10d_shutdown();
            return 1;
        }
    }
    const char *redop = is_reduction(o.op) ? c10d_reduce_op_name(o.redop) : "none";
    int root = o.op == B_BROADCAST || o.op == B_REDUCE || o.op == B_GATHER || o.op == B_SCATTER
                   ? o.root
                   : -1;
    if (r.rank == 0) {
        printf("# c10d-bench %s: %s, %d ranks, backend %s, device %s, dtype %s, iters %d, "
               "warmup %d, check %d\n",
               c10d_version(), op_names[o.op], r.n, o.backend,
               o.device == C10D_DEVICE_CPU ? "cpu" : "cuda", c10d_dtype_name(o.dtype), o.iters,
               o.warmup, o.check);
        printf("#\n# %12s %12s %8s %6s %6s %10s %12s %12s %8s", "size", "count", "type", "redop",
               "root", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong");
        if (o.blocking && o.percentiles)
            printf(" %10s %10s %10s", "p50(us)", "p99(us)", "max(us)");
        printf("\n");
    }
    double sum_busbw = 0;
    int rows = 0;
    long total_wrong = 0;
    size_t bytes = o.min_bytes;
    for (;;) {
        double t = 0, pct[3] = {0, 0, 0};
        long wrong = 0;
        rc = run_size(&r, bytes, &t, pct, &wrong);
        if (rc != 0) {
            fprintf(stderr, "c10d-bench: rank %d: %s of %zu bytes failed: %s: %s\n", r.rank,
                    op_names[o.op], bytes, c10d_status_name(rc), c10d_last_error());
            exit_code = 1;
            break;
        }
        size_t real = r.count * r.esize;
        double algbw = t > 0 ? (double)real / (t * 1e-6) / 1e9 : 0;
        double busbw = algbw * bus_factor(o.op, r.n);
        if (r.rank == 0) {
            printf("  %12zu %12zu %8s %6s %6d %10.2f %12.4f %12.4f %8ld", real, r.count,
                   c10d_dtype_name(o.dtype), redop, root, t, algbw, busbw, wrong);
            if (o.blocking && o.percentiles)
                printf(" %10.2f %10.2f %10.2f", pct[0], pct[1], pct[2]);
            printf("\n");
        }
        fflush(stdout);
        sum_busbw += busbw;
        rows++;
        total_wrong += wrong;
        if (bytes >= o.max_bytes)
            break;
        size_t next = (size_t)((double)bytes * o.factor);
        bytes = next > bytes ? next : bytes + 1;
        if (bytes > o.max_bytes)
            bytes = o.max_bytes;
    }
    if (r.rank == 0) {
        /* OK only for a run that checked every size it was asked for. */
        printf("# Out of bounds values : %ld %s\n", total_wrong,
               total_wrong != 0 || exit_code != 0 ? "FAILED" : "OK");
        printf("# Avg bus bandwidth    : %.4f GB/s\n", rows ? sum_busbw / rows : 0.0);
    }
    if (total_wrong != 0)
        exit_code = 1;
    if (exit_code == 0)
        c10d_pg_destroy(pg);
    else
        c10d_pg_abort(pg, "c10d-bench failed");
    free_buffers(&r);
    c10d_shutdown();
    return exit_code;
}
