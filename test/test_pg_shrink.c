/* Shrink for fault tolerance (docs/api.md, "Shrinking a group"), real
 * processes on the tcp backend: C10D_SHRINK_ABORT with a peer killed while
 * the others are inside an op, and with a peer that stalls (its op can only
 * end by the abort); and a shrink of the default group, which becomes the
 * default and ends the groups made before it. Each survivor bounds its
 * recovery in time. */
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
#include <time.h>
#include <unistd.h>

#define OP_TIMEOUT_MS 60000 /* far above the bound: waiting for it would fail */
#define RECOVERY_MS   15000

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static c10d_pg *init_or_die(void)
{
    c10d_pg_opts po = C10D_PG_OPTS_INIT;
    po.timeout_ms = OP_TIMEOUT_MS;
    c10d_pg *pg = NULL;
    if (c10d_pg_init(&po, &pg) != 0) {
        fprintf(stderr, "init: %s\n", c10d_last_error());
        _exit(3);
    }
    return pg;
}

/* The sum of 1..size over the group, which must be right. */
static int sum_ok(c10d_pg *g)
{
    int32_t v = c10d_pg_rank(g) + 1, n = c10d_pg_size(g);
    MP_CHECK(c10d_all_reduce_sync(g, &v, &v, 1, C10D_INT32, C10D_SUM) == 0, "all_reduce: %s",
             c10d_last_error());
    MP_CHECK(v == n * (n + 1) / 2, "sum %d over %d ranks", v, n);
    return 0;
}

/* ---------------------------- a rank killed while the others are in an op */

static int killed_main(int rank, int n, void *arg)
{
    (void)arg;
    c10d_pg *world = init_or_die();
    MP_CHECK(sum_ok(world) == 0, "first all_reduce");
    int32_t buf[1024];
    for (int i = 0; i < 1024; i++)
        buf[i] = rank;
    c10d_work *w = NULL;
    if (rank != n - 1)
        MP_CHECK(c10d_all_reduce(world, buf, buf, 1024, C10D_INT32, C10D_SUM, NULL, &w) == 0,
                 "post: %s", c10d_last_error());
    if (rank == n - 1) {
        usleep(200000); /* the others are inside their all_reduce by now */
        raise(SIGKILL);
    }
    uint64_t t0 = now_ms();
    int failed[4], nf = 0;
    while ((nf = c10d_pg_failed_ranks(world, failed, 4)) == 0 && now_ms() - t0 < RECOVERY_MS)
        usleep(10000);
    MP_CHECK(nf == 1 && failed[0] == n - 1, "failed ranks: %d (%d)", nf, nf > 0 ? failed[0] : -1);
    c10d_pg_opts so = C10D_PG_OPTS_INIT;
    so.shrink_flags = C10D_SHRINK_ABORT;
    c10d_pg *rest = NULL;
    MP_CHECK(c10d_pg_shrink(world, failed, nf, &so, &rest) == 0, "shrink: %s", c10d_last_error());
    /* The op in flight is over by now: the dead peer failed it, or the abort. */
    MP_CHECK(c10d_work_test(w) == 1, "the parent's op is still pending after the shrink");
    int rc = c10d_work_wait(w, 0);
    MP_CHECK(rc == C10D_ECLOSED || rc == C10D_EABORTED, "in-flight op: %s: %s",
             c10d_status_name(rc), c10d_last_error());
    c10d_work_release(w);
    MP_CHECK(c10d_pg_size(rest) == n - 1 && c10d_pg_rank(rest) == rank, "rank %d size %d",
             c10d_pg_rank(rest), c10d_pg_size(rest));
    MP_CHECK(sum_ok(rest) == 0, "survivors");
    MP_CHECK(now_ms() - t0 < RECOVERY_MS, "recovery took %llu ms",
             (unsigned long long)(now_ms() - t0));
    /* The parent is failed: refused at once, its handle still destroyable. */
    rc = c10d_all_reduce_sync(world, buf, buf, 1, C10D_INT32, C10D_SUM);
    MP_CHECK(rc == C10D_EREVOKED, "parent after: %s", c10d_status_name(rc));
    MP_CHECK(c10d_pg_destroy(rest) == 0, "destroy rest: %s", c10d_last_error());
    c10d_pg_abort(world, "test over");
    c10d_shutdown();
    return 0;
}

static void test_shrink_abort_after_kill(void **state)
{
    (void)state;
    struct mp_opts o = {0};
    o.nranks = 3;
    o.timeout_s = 60;
    struct mp_result res;
    mp_run(&o, killed_main, NULL, &res);
    assert_false(res.timed_out);
    assert_int_equal(res.codes[0], 0);
    assert_int_equal(res.codes[1], 0);
    assert_int_equal(res.codes[2], 128 + SIGKILL);
}

/* ------------------------- a stalled rank: only the abort ends the op */

static int stalled_main(int rank, int n, void *arg)
{
    (void)arg;
    c10d_pg *world = init_or_die();
    MP_CHECK(sum_ok(world) == 0, "first all_reduce");
    c10d_store *st = NULL;
    MP_CHECK(c10d_pg_store(world, &st) == 0, "store: %s", c10d_last_error());
    if (rank == n - 1) {
        /* Takes no part until the others are done, then dies. */
        void *v = NULL;
        size_t len = 0;
        MP_CHECK(c10d_store_get_sync(st, "shrunk", &v, &len) == 0, "get: %s", c10d_last_error());
        free(v);
        raise(SIGKILL);
    }
    int32_t buf[256] = {0};
    c10d_work *w = NULL;
    MP_CHECK(c10d_all_reduce(world, buf, buf, 256, C10D_INT32, C10D_SUM, NULL, &w) == 0, "post: %s",
             c10d_last_error());
    usleep(100000);
    MP_CHECK(c10d_work_test(w) == 0, "the op ended without its third rank");
    uint64_t t0 = now_ms();
    /* Without the flag the op would wait its 60 s; with it, it ends now. */
    c10d_pg_opts so = C10D_PG_OPTS_INIT;
    so.shrink_flags = C10D_SHRINK_ABORT;
    c10d_pg *rest = NULL;
    MP_CHECK(c10d_pg_shrink(world, (int[]){n - 1}, 1, &so, &rest) == 0, "shrink: %s",
             c10d_last_error());
    MP_CHECK(c10d_work_test(w) == 1, "still pending after the shrink");
    int rc = c10d_work_wait(w, 0);
    MP_CHECK(rc == C10D_EABORTED && strstr(c10d_last_error(), "C10D_SHRINK_ABORT") != NULL,
             "in-flight op: %s: %s", c10d_status_name(rc), c10d_last_error());
    c10d_work_release(w);
    MP_CHECK(c10d_pg_error(world) == C10D_EABORTED, "parent's error");
    MP_CHECK(sum_ok(rest) == 0, "survivors");
    MP_CHECK(now_ms() - t0 < RECOVERY_MS, "recovery took %llu ms",
             (unsigned long long)(now_ms() - t0));
    /* An unknown flag is refused and has no effect. */
    c10d_pg *bad = NULL;
    so.shrink_flags = 4;
    MP_CHECK(c10d_pg_shrink(rest, (int[]){1 - rank}, 1, &so, &bad) == C10D_EINVAL && bad == NULL,
             "flag 4 accepted");
    MP_CHECK(sum_ok(rest) == 0, "survivors again");
    if (rank == 0)
        MP_CHECK(c10d_store_set_sync(st, "shrunk", "1", 1) == 0, "set: %s", c10d_last_error());
    c10d_store_release(st);
    MP_CHECK(c10d_pg_destroy(rest) == 0, "destroy rest: %s", c10d_last_error());
    c10d_pg_abort(world, "test over");
    c10d_shutdown();
    return 0;
}

static void test_shrink_abort_stalled(void **state)
{
    (void)state;
    struct mp_opts o = {0};
    o.nranks = 3;
    o.timeout_s = 60;
    struct mp_result res;
    mp_run(&o, stalled_main, NULL, &res);
    assert_false(res.timed_out);
    assert_int_equal(res.codes[0], 0);
    assert_int_equal(res.codes[1], 0);
    assert_int_equal(res.codes[2], 128 + SIGKILL);
}

/* ------------------------------------------------ the default group shrunk */

static int default_main(int rank, int n, void *arg)
{
    (void)arg;
    c10d_pg *world = init_or_die();
    c10d_pg *sub = NULL;
    MP_CHECK(c10d_pg_new_group(world, (int[]){0, 2}, 2, NULL, &sub) == 0, "new_group: %s",
             c10d_last_error());
    MP_CHECK(sum_ok(world) == 0, "first all_reduce");
    /* Rank 1 dies (rank 0 hosts the store, which the survivors still need):
     * global rank 2 becomes rank 1 of the new world. */
    if (rank == 1)
        raise(SIGKILL);
    int32_t v = rank;
    int rc = c10d_all_reduce_sync(world, &v, &v, 1, C10D_INT32, C10D_SUM);
    MP_CHECK(rc == C10D_ECLOSED, "all_reduce with a dead rank: %s", c10d_status_name(rc));
    int failed[4];
    MP_CHECK(c10d_pg_failed_ranks(world, failed, 4) == 1 && failed[0] == 1, "failed ranks");
    c10d_pg *w2 = NULL;
    MP_CHECK(c10d_pg_shrink(world, failed, 1, NULL, &w2) == 0, "shrink: %s", c10d_last_error());
    MP_CHECK(c10d_is_initialized() == 1, "no default group");
    int me = rank == 0 ? 0 : 1;
    MP_CHECK(c10d_pg_rank(w2) == me && c10d_pg_size(w2) == n - 1, "rank %d size %d",
             c10d_pg_rank(w2), c10d_pg_size(w2));
    /* The survivors are the world now. */
    MP_CHECK(c10d_pg_global_rank(w2, c10d_pg_rank(w2)) == me, "global rank %d",
             c10d_pg_global_rank(w2, c10d_pg_rank(w2)));
    MP_CHECK(sum_ok(w2) == 0, "new default");
    /* The old default and what was made from it are ended. */
    rc = c10d_all_reduce_sync(world, &v, &v, 1, C10D_INT32, C10D_SUM);
    MP_CHECK(rc == C10D_EREVOKED, "old default: %s", c10d_status_name(rc));
    rc = c10d_all_reduce_sync(sub, &v, &v, 1, C10D_INT32, C10D_SUM);
    MP_CHECK(rc == C10D_EREVOKED && strstr(c10d_last_error(), "shrunk") != NULL,
             "old subgroup: %s: %s", c10d_status_name(rc), c10d_last_error());
    /* Groups from the new default: world-wide creation among the survivors. */
    c10d_pg *all = NULL;
    MP_CHECK(c10d_pg_new_group(w2, NULL, 0, NULL, &all) == 0, "new_group after: %s",
             c10d_last_error());
    MP_CHECK(sum_ok(all) == 0, "group of the new default");
    MP_CHECK(c10d_pg_destroy(sub) == 0, "destroy sub: %s", c10d_last_error());
    MP_CHECK(c10d_pg_destroy(world) == 0, "destroy old default: %s", c10d_last_error());
    /* Destroying the new default ends the rest and the job's default group. */
    MP_CHECK(c10d_pg_destroy(w2) == 0, "destroy new default: %s", c10d_last_error());
    MP_CHECK(c10d_is_initialized() == 0, "default group left behind");
    rc = c10d_all_reduce_sync(all, &v, &v, 1, C10D_INT32, C10D_SUM);
    MP_CHECK(rc == C10D_EREVOKED, "group after its default's destroy: %s", c10d_status_name(rc));
    c10d_pg_destroy(all);
    c10d_shutdown();
    return 0;
}

static void test_shrink_default_group(void **state)
{
    (void)state;
    struct mp_opts o = {0};
    o.nranks = 3;
    o.timeout_s = 60;
    struct mp_result res;
    mp_run(&o, default_main, NULL, &res);
    assert_false(res.timed_out);
    assert_int_equal(res.codes[0], 0);
    assert_int_equal(res.codes[1], 128 + SIGKILL);
    assert_int_equal(res.codes[2], 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shrink_abort_after_kill),
        cmocka_unit_test(test_shrink_abort_stalled),
        cmocka_unit_test(test_shrink_default_group),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
