/* Engine micro-benchmarks:
 *  1. post latency: a task posted from another thread until it runs on the loop;
 *  2. complete->callback latency: c10d_work_complete on another thread until the
 *     work's callback runs on the loop (what an op's completion costs);
 *  3. throughput: works created, completed and called back per second.
 * One measurement in flight at a time for the latencies (ping-pong). */
#include "c10d.h"
#include "engine/loop.h"

#include <stdatomic.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static atomic_uint_least64_t stamp_ns; /* when the loop side ran */

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void report(const char *name, uint64_t *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_u64);
    printf("%-34s median %7.2f us   p99 %7.2f us   (n=%d)\n", name, v[n / 2] / 1e3,
           v[(int)(n * 0.99)] / 1e3, n);
}

static void wait_stamp(void)
{
    while (atomic_load_explicit(&stamp_ns, memory_order_acquire) == 0)
        ;
}

static void stamp_task(struct c10d__task *t)
{
    (void)t;
    atomic_store_explicit(&stamp_ns, c10d__now_ns(), memory_order_release);
}

static void stamp_cb(c10d_work *w, int status, void *arg)
{
    (void)w;
    (void)status;
    (void)arg;
    atomic_store_explicit(&stamp_ns, c10d__now_ns(), memory_order_release);
}

static void count_cb(c10d_work *w, int status, void *arg)
{
    (void)status;
    atomic_fetch_add((atomic_long *)arg, 1);
    c10d_work_release(w);
}

static void *empty_thread(void *arg)
{
    return arg;
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 20000;
    uint64_t *lat = malloc((size_t)n * sizeof *lat);
    struct c10d__task task = {stamp_task, NULL};
    c10d__engine_start();

    for (int i = 0; i < n + 1000; i++) {
        atomic_store(&stamp_ns, 0);
        uint64_t t0 = c10d__now_ns();
        c10d__engine_post(&task);
        wait_stamp();
        if (i >= 1000) /* warm-up */
            lat[i - 1000] = atomic_load(&stamp_ns) - t0;
    }
    report("post -> task runs on loop", lat, n);

    for (int i = 0; i < n + 1000; i++) {
        c10d_work *w;
        c10d_work_create("bench", 0, &w);
        c10d_work_on_complete(w, stamp_cb, NULL);
        atomic_store(&stamp_ns, 0);
        uint64_t t0 = c10d__now_ns();
        c10d_work_complete(w, C10D_OK, NULL);
        wait_stamp();
        if (i >= 1000)
            lat[i - 1000] = atomic_load(&stamp_ns) - t0;
        c10d_work_release(w);
    }
    report("work_complete -> callback", lat, n);

    /* What NCCL pays per ncclGroupEnd on a nonblocking communicator: it
     * starts a thread for the launch and the caller later joins it. The
     * floor of that cost, for docs/nccl.md's choice of communicator mode. */
    for (int i = 0; i < n / 4 + 100; i++) {
        uint64_t s0 = c10d__now_ns();
        pthread_t th;
        if (pthread_create(&th, NULL, empty_thread, NULL) == 0)
            pthread_join(th, NULL);
        if (i >= 100)
            lat[i - 100] = c10d__now_ns() - s0;
    }
    report("thread create+join (nonblocking", lat, n / 4);
    printf("  NCCL group end pays this per op)\n");

    int total = n * 10;
    atomic_long done = 0;
    uint64_t t0 = c10d__now_ns();
    for (int i = 0; i < total; i++) {
        c10d_work *w;
        c10d_work_create("bench", i % 2 ? 60000 : 0, &w); /* half with a deadline timer */
        c10d_work_on_complete(w, count_cb, &done);
        c10d_work_complete(w, C10D_OK, NULL);
    }
    while (atomic_load(&done) < total)
        ;
    double secs = (c10d__now_ns() - t0) / 1e9;
    printf("%-34s %.0f works/s (%d works, half with deadlines, %.3f s)\n",
           "create+complete+callback", total / secs, total, secs);
    free(lat);
    return c10d_shutdown();
}
