/* Backend-level all_reduce benchmark of the tcp backend: forks N ranks on
 * loopback (addresses over pipes, no store, no process-group layer) and
 * prints nccl-tests-like rows from rank 0.
 *
 *   bench_tcp_transport [-n ranks] [-b min_bytes] [-e max_bytes] [-i iters] [-o op]
 *   op: all_reduce (default), broadcast, all_gather, reduce_scatter, sendrecv */
#include "test/tcp_harness.h"

#include <getopt.h>

struct bench_args {
    size_t min, max;
    int iters;
    const char *op;
};

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int one(struct h_ctx *h, const char *opname, float *send, float *recv, size_t n)
{
    struct c10d__op o;
    int p = h->size;
    if (strcmp(opname, "broadcast") == 0) {
        o = h_op_init(C10D_OP_BROADCAST, n, C10D_FLOAT32);
        o.send = send;
        o.recv = recv;
    } else if (strcmp(opname, "all_gather") == 0) {
        o = h_op_init(C10D_OP_ALL_GATHER, n / (size_t)p, C10D_FLOAT32);
        o.send = send;
        o.recv = recv;
    } else if (strcmp(opname, "reduce_scatter") == 0) {
        o = h_op_init(C10D_OP_REDUCE_SCATTER, n / (size_t)p, C10D_FLOAT32);
        o.send = send;
        o.recv = recv;
        o.redop = C10D_SUM;
    } else if (strcmp(opname, "sendrecv") == 0) {
        struct c10d__op s = h_op_init(C10D_OP_SEND, n, C10D_FLOAT32);
        s.send = send;
        s.peer = (h->rank + 1) % p;
        struct c10d__op r = h_op_init(C10D_OP_RECV, n, C10D_FLOAT32);
        r.recv = recv;
        r.peer = (h->rank + p - 1) % p;
        c10d_work *ws = h_submit(h, &s), *wr = h_submit(h, &r);
        int rc = c10d_work_wait(wr, -1);
        if (rc == 0)
            rc = c10d_work_wait(ws, -1);
        c10d_work_release(ws);
        c10d_work_release(wr);
        return rc;
    } else {
        o = h_op_init(C10D_OP_ALL_REDUCE, n, C10D_FLOAT32);
        o.send = send;
        o.recv = recv;
        o.redop = C10D_SUM;
    }
    return h_op(h, &o);
}

static int bench_body(struct h_ctx *h, void *arg)
{
    struct bench_args *a = arg;
    size_t maxn = a->max / 4 + 1;
    float *send = malloc(maxn * 4), *recv = malloc(maxn * 4);
    for (size_t i = 0; i < maxn; i++)
        send[i] = 1.0f;
    int p = h->size;
    double factor = strcmp(a->op, "all_reduce") == 0 ? 2.0 * (p - 1) / p
                    : strcmp(a->op, "broadcast") == 0 || strcmp(a->op, "sendrecv") == 0
                        ? 1.0
                        : (double)(p - 1) / p;
    if (h->rank == 0)
        printf("# %s, %d ranks, float32, backend level (tcp)\n#%11s %12s %10s %10s\n", a->op, p,
               "size(B)", "time(us)", "algbw", "busbw");
    for (size_t bytes = a->min; bytes <= a->max; bytes *= 2) {
        size_t n = bytes / 4;
        int iters = a->iters;
        if (bytes >= (1u << 24))
            iters = iters / 10 > 5 ? iters / 10 : 5;
        for (int w = 0; w < 3; w++)
            if (one(h, a->op, send, recv, n) != 0)
                H_FAIL(h, "%s: %s", a->op, c10d_last_error());
        double t0 = now_us();
        for (int i = 0; i < iters; i++)
            if (one(h, a->op, send, recv, n) != 0)
                H_FAIL(h, "%s: %s", a->op, c10d_last_error());
        double us = (now_us() - t0) / iters;
        double algbw = (double)bytes / us / 1e3;
        if (h->rank == 0)
            printf("%12zu %12.1f %10.3f %10.3f\n", bytes, us, algbw, algbw * factor);
        fflush(stdout);
    }
    free(send);
    free(recv);
    return 0;
}

int main(int argc, char **argv)
{
    struct bench_args a = {4, (size_t)64 << 20, 200, "all_reduce"};
    int ranks = 2, c;
    while ((c = getopt(argc, argv, "n:b:e:i:o:")) != -1) {
        switch (c) {
        case 'n':
            ranks = atoi(optarg);
            break;
        case 'b':
            a.min = strtoull(optarg, NULL, 0);
            break;
        case 'e':
            a.max = strtoull(optarg, NULL, 0);
            break;
        case 'i':
            a.iters = atoi(optarg);
            break;
        case 'o':
            a.op = optarg;
            break;
        default:
            fprintf(stderr, "usage: %s [-n ranks] [-b min] [-e max] [-i iters] [-o op]\n", argv[0]);
            return 2;
        }
    }
    int st[64];
    return h_spawn(ranks, bench_body, &a, 3600, 600000, 0, st) == 0 ? 0 : 1;
}
