/* Failures through the public API, each bounded in time (every rank has an
 * alarm, the harness kills what is left): a rank killed during a 64 MiB
 * all_reduce, a stopped rank, the store killed after init, and abort/destroy
 * in every state. The checks are on statuses, never on timings: a survivor
 * must see C10D_ECLOSED (not a timeout) for a dead peer, C10D_ETIMEDOUT at
 * the per-op deadline for a stopped one, and fail fast afterwards. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "c10d.h"
#include "mp_harness.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static c10d_pg *init_or_die(int64_t timeout_ms)
{
    c10d_pg_opts po = {0};
    po.timeout_ms = timeout_ms;
    c10d_pg *pg = NULL;
    if (c10d_pg_init(&po, &pg) != 0) {
        fprintf(stderr, "init: %s\n", c10d_last_error());
        _exit(3);
    }
    return pg;
}

/* ---------------------------------------------- a rank dies mid all_reduce */

#define BIG (64u << 20)

static int killed_main(int rank, int n, void *arg)
{
    (void)arg;
    c10d_pg *pg = init_or_die(60000);
    /* Filled before the barrier: under a sanitizer filling 64 MiB takes longer
     * than the victim's 30 ms, and a rank still filling would post after the
     * kill and find the group failed already. */
    size_t count = BIG / 4;
    float *buf = malloc(BIG);
    MP_CHECK(buf != NULL, "malloc");
    for (size_t i = 0; i < count; i++)
        buf[i] = 1.0f;
    MP_CHECK(c10d_barrier_sync(pg) == 0, "barrier: %s", c10d_last_error());
    c10d_work *w;
    MP_CHECK(c10d_all_reduce(pg, buf, buf, count, C10D_FLOAT32, C10D_SUM, NULL, &w) == 0,
             "post: %s", c10d_last_error());
    if (rank == n - 1) {
        usleep(30000); /* in the middle of it (or, on a fast machine, just after) */
        raise(SIGKILL);
    }
    int rc = c10d_work_wait(w, -1);
    /* A fast machine may finish before the kill; then the next op sees it. */
    if (rc == 0) {
        c10d_work_release(w);
        MP_CHECK(c10d_all_reduce(pg, buf, buf, count, C10D_FLOAT32, C10D_SUM, NULL, &w) == 0,
                 "post 2: %s", c10d_last_error());
        rc = c10d_work_wait(w, -1);
    }
    MP_CHECK(rc == C10D_ECLOSED, "status %s: %s", c10d_status_name(rc), c10d_last_error());
    /* Whom to shrink away: the dead rank, named by the work and the group. */
    MP_CHECK(c10d_work_failed_rank(w) == n - 1, "work's failed rank %d", c10d_work_failed_rank(w));
    c10d_work_release(w);
    int failed[4] = {-1, -1, -1, -1};
    int nfailed = c10d_pg_failed_ranks(pg, failed, 4);
    MP_CHECK(nfailed == 1 && failed[0] == n - 1, "failed ranks: %d (%d)", nfailed, failed[0]);
    /* Poisoned: the next op is refused at once, and the cause stays readable. */
    rc = c10d_all_reduce_sync(pg, buf, buf, 1, C10D_FLOAT32, C10D_SUM);
    MP_CHECK(rc == C10D_EREVOKED && strstr(c10d_last_error(), "failed earlier") != NULL,
             "after: %s: %s", c10d_status_name(rc), c10d_last_error());
    rc = c10d_pg_error(pg);
    MP_CHECK(rc == C10D_ECLOSED, "cause: %s: %s", c10d_status_name(rc), c10d_last_error());
    MP_CHECK(c10d_pg_abort(pg, "peer died") == 0, "abort");
    free(buf);
    c10d_shutdown();
    return 0;
}

static void test_rank_killed(void **s)
{
    (void)s;
    struct mp_opts o = {0};
    o.nranks = 3;
    o.timeout_s = 90;
    struct mp_result res;
    mp_run(&o, killed_main, NULL, &res);
    assert_false(res.timed_out);
    assert_int_equal(res.codes[0], 0);
    assert_int_equal(res.codes[1], 0);
    assert_int_equal(res.codes[2], 128 + SIGKILL);
}

/* ---------------------------------------------------- a rank stops dead */

static int stopped_main(int rank, int n, void *arg)
{
    (void)arg;
    c10d_pg *pg = init_or_die(60000);
    MP_CHECK(c10d_barrier_sync(pg) == 0, "barrier: %s", c10d_last_error());
    if (rank == n - 1)
        raise(SIGSTOP); /* the harness kills it once the others are done */
    float x[1024] = {0};
    c10d_op_opts oo = {0};
    oo.timeout_ms = 1500;
    c10d_work *w;
    MP_CHECK(c10d_all_reduce(pg, x, x, 1024, C10D_FLOAT32, C10D_SUM, &oo, &w) == 0, "post");
    int rc = c10d_work_wait_release(w);
    MP_CHECK(rc == C10D_ETIMEDOUT, "status %s: %s", c10d_status_name(rc), c10d_last_error());
    MP_CHECK(strstr(c10d_last_error(), "OpType=ALLREDUCE") != NULL &&
                 strstr(c10d_last_error(), "Timeout(ms)=1500") != NULL,
             "message: %s", c10d_last_error());
    rc = c10d_barrier_sync(pg);
    MP_CHECK(rc == C10D_EREVOKED, "after: %s: %s", c10d_status_name(rc), c10d_last_error());
    MP_CHECK(c10d_pg_error(pg) == C10D_ETIMEDOUT, "cause: %s", c10d_last_error());
    MP_CHECK(c10d_pg_destroy(pg) == 0, "destroy");
    c10d_shutdown();
    return 0;
}

static void test_rank_stopped(void **s)
{
    (void)s;
    struct mp_opts o = {0};
    o.nranks = 3;
    o.timeout_s = 60;
    o.kill_after_exits = 2;
    struct mp_result res;
    mp_run(&o, stopped_main, NULL, &res);
    assert_false(res.timed_out);
    assert_int_equal(res.codes[0], 0);
    assert_int_equal(res.codes[1], 0);
}

/* ------------------------------------------------- the store goes away */

static int store_killed_main(int rank, int n, void *arg)
{
    (void)n;
    pid_t store = *(pid_t *)arg;
    c10d_pg *pg = init_or_die(20000);
    MP_CHECK(c10d_barrier_sync(pg) == 0, "barrier: %s", c10d_last_error());
    if (rank == 0)
        kill(store, SIGKILL);
    usleep(200000);
    /* The mesh is up: collectives need no store. Either way, nothing hangs. */
    int64_t v = rank;
    int rc = c10d_all_reduce_sync(pg, &v, &v, 1, C10D_INT64, C10D_SUM);
    MP_CHECK(rc == 0 || rc == C10D_ECLOSED || rc == C10D_ETIMEDOUT || rc == C10D_ESTORE,
             "all_reduce: %s", c10d_last_error());
    if (rc == 0)
        MP_CHECK(v == 3, "sum %lld", (long long)v);
    rc = c10d_barrier_sync(pg);
    MP_CHECK(rc == 0 || rc == C10D_ECLOSED || rc == C10D_ETIMEDOUT, "barrier: %s",
             c10d_last_error());
    MP_CHECK(c10d_pg_destroy(pg) == 0, "destroy");
    c10d_shutdown();
    return 0;
}

static void test_store_killed(void **s)
{
    (void)s;
    int port;
    pid_t store = mp_start_store(&port);
    if (store < 0)
        skip(); /* no c10d-store built ($C10D_STORE_EXE) */
    struct mp_opts o = {0};
    o.nranks = 3;
    o.timeout_s = 60;
    o.kill_on_failure = 1;
    o.external_store_port = port;
    struct mp_result res;
    int rc = mp_run(&o, store_killed_main, &store, &res);
    mp_kill(store);
    assert_int_equal(rc, 0);
}

/* ------------------------------------------- abort and destroy, any state */

static int abort_main(int rank, int n, void *arg)
{
    (void)n;
    (void)arg;
    float x[256] = {0};
    c10d_work *w;
    /* 1. abort with an op pending that the peer never joins */
    c10d_pg *pg = init_or_die(60000);
    if (rank == 0) {
        MP_CHECK(c10d_all_reduce(pg, x, x, 256, C10D_FLOAT32, C10D_SUM, NULL, &w) == 0, "post");
        usleep(100000);
        MP_CHECK(c10d_pg_abort(pg, "test abort") == 0, "abort");
        int rc = c10d_work_wait_release(w);
        MP_CHECK(rc == C10D_EABORTED, "pending after abort: %s: %s", c10d_status_name(rc),
                 c10d_last_error());
    } else {
        usleep(300000);
        /* The peer is gone or aborted: whatever we see, we see it fast. */
        c10d_pg_abort(pg, "test abort");
    }
    c10d_shutdown();
    return 0;
}

static void test_abort_pending(void **s)
{
    (void)s;
    struct mp_opts o = {0};
    o.nranks = 2;
    o.timeout_s = 60;
    struct mp_result res;
    mp_run(&o, abort_main, NULL, &res);
    assert_false(res.timed_out);
    assert_int_equal(res.codes[0], 0);
    assert_int_equal(res.codes[1], 0);
}

static int destroy_main(int rank, int n, void *arg)
{
    (void)n;
    (void)arg;
    float x[256] = {0};
    c10d_work *w;
    /* A generous init (parallel ASan tests share the cores); only the op under
     * test has a short deadline. */
    c10d_pg *pg = init_or_die(20000);
    MP_CHECK(c10d_barrier_sync(pg) == 0, "barrier");
    if (rank == 0) {
        /* The peer never joins: destroy waits for the op's deadline, no longer. */
        c10d_op_opts oo = {0};
        oo.timeout_ms = 2000;
        MP_CHECK(c10d_all_reduce(pg, x, x, 256, C10D_FLOAT32, C10D_SUM, &oo, &w) == 0, "post");
        MP_CHECK(c10d_pg_destroy(pg) == 0, "destroy");
        int rc = c10d_work_wait_release(w);
        MP_CHECK(rc == C10D_ETIMEDOUT || rc == C10D_EABORTED, "pending after destroy: %s",
                 c10d_status_name(rc));
    } else {
        sleep(4);
        c10d_pg_abort(pg, NULL); /* idle (or already failed) group */
    }
    c10d_shutdown();
    return 0;
}

static void test_destroy_pending(void **s)
{
    (void)s;
    struct mp_opts o = {0};
    o.nranks = 2;
    o.timeout_s = 60;
    struct mp_result res;
    mp_run(&o, destroy_main, NULL, &res);
    assert_false(res.timed_out);
    assert_int_equal(res.codes[0], 0);
    assert_int_equal(res.codes[1], 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rank_killed),     cmocka_unit_test(test_rank_stopped),
        cmocka_unit_test(test_store_killed),    cmocka_unit_test(test_abort_pending),
        cmocka_unit_test(test_destroy_pending),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
