/* Backend-level all_reduce benchmark of the tcp backend: forks N ranks on
 * loopback (addresses over pipes, no store, no process-group layer) and
 * prints nccl-tests-like rows from rank 0.
 *
 *   bench_tcp_transport [-n ranks] [-b min_bytes] [-e max_bytes] [-i iters] [-o op] [-s spin_us]
 *   op: all_reduce (default), broadcast, all_gather, reduce_scatter, sendrecv
 *   -s: the waiting thread polls its work for up to spin_us before blocking,
 *       to measure what a spinning c10d_work_wait would save. */
#include "test/tcp_harness.h"

#include <getopt.h>

struct bench_args {
    size_t min, max;
    int iters;
    const char *op;
    int spin_us; /* poll the work this long before blocking (what a spinning wait would give) */
};

static int g_spin_us;

static int wait_work(c10d_work *w)
{
    if (g_spin_us > 0) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (;;) {
            if (c10d_work_test(w))
                break;
            clock_gettime(CLOCK_MONOTONIC, &t1);
            if ((t1.tv_sec - t0.tv_sec) * 1000000 + (t1.tv_nsec - t0.tv_nsec) / 1000 > g_spin_us)
                break;
        }
    }
    return c10d_work_wait(w, -1);
}

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
        int rc = wait_work(wr);
        if (rc == 0)
            rc = wait_work(ws);
        c10d_work_release(ws);
        c10d_work_release(wr);
        return rc;
    } else {
        o = h_op_init(C10D_OP_ALL_REDUCE, n, C10D_FLOAT32);
        o.send = send;
        o.recv = recv;
        o.redop = C10D_SUM;
    }
    c10d_work *w = h_submit(h, &o);
    if (w == NULL)
        return C10D_ENOMEM;
    int rc = wait_work(w);
    c10d_work_release(w);
    return rc;
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
    struct bench_args a = {4, (size_t)64 << 20, 200, "all_reduce", 0};
    int ranks = 2, c;
    while ((c = getopt(argc, argv, "n:b:e:i:o:s:")) != -1) {
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
        case 's':
            a.spin_us = atoi(optarg);
            break;
        default:
            fprintf(stderr, "usage: %s [-n ranks] [-b min] [-e max] [-i iters] [-o op]\n", argv[0]);
            return 2;
        }
    }
    g_spin_us = a.spin_us;
    int st[64];
    return h_spawn(ranks, bench_body, &a, 3600, 600000, 0, st) == 0 ? 0 : 1;
}
