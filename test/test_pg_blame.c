/* Failure messages name only ranks that really failed: monitored_barrier's
 * rank 0 must not list a live rank whose receive was failed by another
 * rank's death (the group's first failure fails every pending receive). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "c10d.h"
#include "mp_harness.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Lazy connections: rank 2 talks to rank 0 only, then dies; rank 1 is
 * alive and on its way, connected to nobody. Rank 0's barrier fails when
 * rank 2's connection closes, which fails every pending receive of the
 * group: rank 0 must name rank 2 alone. */
static int mb_blame_main(int rank, int n, void *arg)
{
    (void)n;
    (void)arg;
    setenv("C10D_TCP_LAZY_INIT", "1", 1);
    c10d_pg_opts po = {0};
    po.timeout_ms = 20000;
    c10d_pg *pg = NULL;
    MP_CHECK(c10d_pg_init(&po, &pg) == 0, "init: %s", c10d_last_error());
    int32_t v = rank;
    c10d_work *w = NULL;
    if (rank == 2) {
        MP_CHECK(c10d_send(pg, &v, 1, C10D_INT32, 0, 7, NULL, &w) == 0, "send: %s",
                 c10d_last_error());
        MP_CHECK(c10d_work_wait_release(w) == 0, "send: %s", c10d_last_error());
        usleep(300000);
        raise(SIGKILL);
    }
    if (rank == 1) {
        usleep(2000000);
        /* Whatever happens to it: its peer 0 has failed by now. */
        if (c10d_monitored_barrier(pg, 1, &(c10d_op_opts){.timeout_ms = 5000}, &w) == 0)
            c10d_work_wait_release(w);
        c10d_pg_abort(pg, "test over");
        c10d_shutdown();
        return 0;
    }
    MP_CHECK(c10d_recv(pg, &v, 1, C10D_INT32, 2, 7, NULL, &w) == 0, "recv: %s", c10d_last_error());
    MP_CHECK(c10d_work_wait_release(w) == 0 && v == 2, "recv: %s", c10d_last_error());
    MP_CHECK(c10d_monitored_barrier(pg, 1, &(c10d_op_opts){.timeout_ms = 10000}, &w) == 0,
             "monitored_barrier: %s", c10d_last_error());
    int rc = c10d_work_wait_release(w);
    const char *why = c10d_last_error();
    fprintf(stderr, "rank 0: monitored_barrier: %s: %s\n", c10d_status_name(rc), why);
    MP_CHECK(rc == C10D_ECLOSED, "status %s: %s", c10d_status_name(rc), why);
    MP_CHECK(strstr(why, "Ranks 2 failed to pass monitoredBarrier") != NULL,
             "rank 2 alone should be named: %s", why);
    c10d_pg_abort(pg, "test over");
    c10d_shutdown();
    return 0;
}

static void test_monitored_barrier_names_only_failed(void **state)
{
    (void)state;
    struct mp_opts o = {0};
    o.nranks = 3;
    o.timeout_s = 60;
    struct mp_result res;
    mp_run(&o, mb_blame_main, NULL, &res);
    assert_false(res.timed_out);
    assert_int_equal(res.codes[0], 0);
    assert_int_equal(res.codes[1], 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_monitored_barrier_names_only_failed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
