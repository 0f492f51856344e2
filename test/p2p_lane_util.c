/* The P2P lane tests' shared helpers (p2p_lane_util.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "p2p_lane_util.h"

#include "mp_harness.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

atomic_int lane_callbacks;

void count_cb(c10d_work *w, int status, void *arg)
{
    (void)w;
    (void)arg;
    if (status == 0)
        atomic_fetch_add(&lane_callbacks, 1);
}

void fill(unsigned char *b, size_t n, int from, int k)
{
    for (size_t i = 0; i < n; i++)
        b[i] = (unsigned char)(k * 31 + from * 7 + (int)i);
}

int good(const unsigned char *b, size_t n, int from, int k)
{
    for (size_t i = 0; i < n; i++)
        if (b[i] != (unsigned char)(k * 31 + from * 7 + (int)i))
            return 0;
    return 1;
}

double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

c10d_pg *lane_init(int64_t timeout_ms)
{
    setenv("C10D_SHM", "1", 1);
    c10d_pg_opts po = {0};
    po.timeout_ms = timeout_ms;
    c10d_pg *pg = NULL;
    if (c10d_pg_init(&po, &pg) != 0) {
        fprintf(stderr, "init: %s\n", c10d_last_error());
        return NULL;
    }
    return pg;
}

void lane_run(int (*fn)(int, int, void *), void *arg, int nranks, const char *spin_us)
{
    if (spin_us != NULL)
        setenv("C10D_SHM_LANE_SPIN_US", spin_us, 1);
    struct mp_opts o = {0};
    o.nranks = nranks;
    o.timeout_s = 120;
    o.kill_on_failure = 1;
    struct mp_result res;
    int rc = mp_run(&o, fn, arg, &res);
    unsetenv("C10D_SHM_LANE_SPIN_US");
    assert_false(res.timed_out);
    assert_int_equal(rc, 0);
}
