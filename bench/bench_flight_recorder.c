/* The flight recorder's cost per op, without the noise of a collective:
 * record + started + completed, as the group layer calls them for every op,
 * with the ring on (C10D_TRACE_BUFFER_SIZE, default 2000) and off (0), on one
 * thread and on two threads recording at once (the ring's one mutex).
 * Usage: bench_flight_recorder [ops]  (bench/README.md, "Flight recorder"). */
#include "c10d.h"
#include "engine/flight_recorder.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static long ops = 2000000;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void *loop(void *arg)
{
    (void)arg;
    struct c10d__fr_op o = {
        .names = c10d__fr_names_intern("0", "default_pg"), /* as a group does, once */
        .pg_name = "0",
        .pg_desc = "default_pg",
        .backend = "tcp",
        .op = "all_reduce",
        .in_numel = 1024,
        .out_numel = 1024,
        .in_tensors = 1,
        .out_tensors = 1,
        .dtype = C10D_FLOAT32,
        .root = -1,
        .peer = -1,
        .timeout_ms = 1000,
    };
    for (long i = 0; i < ops; i++) {
        o.coll_seq = o.op_id = (uint64_t)i + 1;
        uint64_t rid = c10d__fr_record(&o);
        c10d__fr_started(rid);
        c10d__fr_completed(rid, 0);
    }
    return NULL;
}

static double run(const char *size, int threads)
{
    setenv("C10D_TRACE_BUFFER_SIZE", size, 1);
    c10d__fr_reset();
    pthread_t t[2];
    double t0 = now_s();
    for (int i = 0; i < threads; i++)
        pthread_create(&t[i], NULL, loop, NULL);
    for (int i = 0; i < threads; i++)
        pthread_join(t[i], NULL);
    return (now_s() - t0) / (double)(ops * threads) * 1e9;
}

int main(int argc, char **argv)
{
    if (argc > 1)
        ops = atol(argv[1]);
    for (int threads = 1; threads <= 2; threads++)
        for (int rep = 0; rep < 3; rep++)
            printf("threads %d  buffer 2000: %6.1f ns/op   buffer 0: %5.2f ns/op\n", threads,
                   run("2000", threads), run("0", threads));
    return 0;
}
