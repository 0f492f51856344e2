/* What making and destroying groups costs a job: one process per rank
 * (c10drun -n N bench_new_group [-n GROUPS]).
 *
 * Times c10d_pg_init, then GROUPS rounds of c10d_pg_new_group of the pair
 * {0, 1} (the other ranks are not members) and its destroy, then GROUPS
 * rounds of a group of the whole world. Prints, on rank 0, each phase's
 * mean per group on the slowest rank (ms). Runs on the host backend (tcp). */
#include "c10d.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

#define CHECK(call)                                                                                \
    do {                                                                                           \
        if ((call) != 0) {                                                                         \
            fprintf(stderr, "bench_new_group: %s: %s\n", #call, c10d_last_error());                \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* The slowest rank's value. */
static double slowest(c10d_pg *world, double v)
{
    CHECK(c10d_all_reduce_sync(world, &v, &v, 1, C10D_FLOAT64, C10D_MAX));
    return v;
}

int main(int argc, char **argv)
{
    int groups = 100, c;
    while ((c = getopt(argc, argv, "n:")) != -1) {
        if (c != 'n' || (groups = atoi(optarg)) < 1) {
            fprintf(stderr, "usage: bench_new_group [-n GROUPS]\n");
            return 2;
        }
    }
    double t0 = now_ms();
    c10d_pg *world;
    CHECK(c10d_pg_init(NULL, &world));
    double init_ms = now_ms() - t0;
    int rank = c10d_pg_rank(world), size = c10d_pg_size(world);
    int *all = malloc((size_t)size * sizeof *all);
    for (int r = 0; r < size; r++)
        all[r] = r;
    const int pair[] = {0, 1};
    double per[2];
    for (int phase = 0; phase < 2; phase++) {
        CHECK(c10d_barrier_sync(world));
        t0 = now_ms();
        for (int i = 0; i < groups; i++) {
            c10d_pg *g;
            CHECK(
                c10d_pg_new_group(world, phase == 0 ? pair : all, phase == 0 ? 2 : size, NULL, &g));
            CHECK(c10d_pg_destroy(g));
        }
        per[phase] = (now_ms() - t0) / groups;
    }
    init_ms = slowest(world, init_ms);
    per[0] = slowest(world, per[0]);
    per[1] = slowest(world, per[1]);
    if (rank == 0)
        printf("bench_new_group: %d ranks, %d groups each: init %.1f ms; new_group+destroy, "
               "per group: pair %.2f ms, world %.2f ms\n",
               size, groups, init_ms, per[0], per[1]);
    free(all);
    CHECK(c10d_pg_destroy(world));
    c10d_shutdown();
    return 0;
}
