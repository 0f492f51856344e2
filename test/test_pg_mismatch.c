/* Ranks that call one collective differently fail at once on every rank,
 * with a message naming the ranks and what differs: never a silent success
 * with mixed bytes, never a wait for the timeout. Real processes, tcp
 * backend, each op's timeout far beyond the test's, so a hang shows as a
 * timeout message and fails the assertions. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "c10d.h"
#include "engine/env.h"
#include "mp_harness.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum mcase {
    M_DTYPE,        /* all_reduce float32 vs int32, same byte size */
    M_REDOP,        /* all_reduce SUM vs MAX */
    M_COUNT,        /* all_reduce 4 vs 8 elements */
    M_KIND,         /* all_reduce vs broadcast */
    M_BARRIER,      /* barrier vs all_reduce */
    M_ROOT,         /* broadcast: every rank believes it is the root */
    M_ROOT_GATHER,  /* gather: roots 0 and 1 */
    M_REJECTED_ONE, /* rank 0's all_reduce is rejected (no seq used), then a barrier */
    M_COMPLEX,      /* all_reduce complex64 x 2 vs float32 x 4: the same reals underneath */
};

struct mcase_spec {
    enum mcase c;
    int nranks;
    const char *aspect; /* must appear in every rank's message */
    int detail;         /* C10D_DEBUG=DETAIL: the explicit exchange before the op */
};

static int run_first(enum mcase c, c10d_pg *pg, int rank, c10d_work **w)
{
    static float f[8];
    static int32_t i32[8];
    const c10d_op_opts *o = NULL;
    switch (c) {
    case M_DTYPE:
        return rank == 0 ? c10d_all_reduce(pg, f, f, 4, C10D_FLOAT32, C10D_SUM, o, w)
                         : c10d_all_reduce(pg, i32, i32, 4, C10D_INT32, C10D_SUM, o, w);
    case M_REDOP:
        return c10d_all_reduce(pg, f, f, 4, C10D_FLOAT32, rank == 0 ? C10D_SUM : C10D_MAX, o, w);
    case M_COUNT:
        return c10d_all_reduce(pg, f, f, rank == 0 ? 4 : 8, C10D_FLOAT32, C10D_SUM, o, w);
    case M_KIND:
        if (rank == 1)
            return c10d_broadcast(pg, f, f, 4, C10D_FLOAT32, 0, o, w);
        return c10d_all_reduce(pg, f, f, 4, C10D_FLOAT32, C10D_SUM, o, w);
    case M_BARRIER:
        if (rank == 0)
            return c10d_barrier(pg, o, w);
        return c10d_all_reduce(pg, f, f, 4, C10D_FLOAT32, C10D_SUM, o, w);
    case M_ROOT:
        return c10d_broadcast(pg, f, f, 4, C10D_FLOAT32, rank, o, w);
    case M_ROOT_GATHER:
        return c10d_gather(pg, f, rank <= 1 ? f : NULL, 2, C10D_FLOAT32, rank <= 1 ? rank : 0, o,
                           w);
    case M_REJECTED_ONE:
        if (rank == 0) {
            /* BAND is not defined for floats: rejected before a sequence
             * number is taken; the rank then goes on to its barrier. */
            if (c10d_all_reduce(pg, f, f, 4, C10D_FLOAT32, C10D_BAND, o, w) == 0)
                return C10D_EINTERNAL;
            return c10d_barrier(pg, o, w);
        }
        return c10d_all_reduce(pg, i32, i32, 4, C10D_INT32, C10D_BAND, o, w);
    case M_COMPLEX:
        return c10d_all_reduce(pg, f, f, rank == 0 ? 2 : 4,
                               rank == 0 ? C10D_COMPLEX64 : C10D_FLOAT32, C10D_SUM, o, w);
    }
    return C10D_EINTERNAL;
}

/* Rank 0 hosts the store, and its server goes with the process. A rank that
 * learns of the mismatch from a peer's ABORT frame may still be in
 * c10d_pg_init, waiting for the store's answer to its creation barrier: rank
 * 0 leaves only once every rank has said, through the store, that it is done
 * with it. */
static int all_done_with_store(int rank, int n)
{
    c10d_store_tcp_opts so = C10D_STORE_TCP_OPTS_INIT;
    so.timeout_ms = 20000;
    c10d_store *st = NULL;
    MP_CHECK(c10d_store_tcp_connect(getenv("MASTER_ADDR"), atoi(getenv("MASTER_PORT")), &so, &st) ==
                 0,
             "store: %s", c10d_last_error());
    const char *all = "test_pg_mismatch/all_done";
    int rc = 0;
    if (rank == 0) {
        rc = c10d_store_wait_sync(st, &all, 1, 20000);
    } else {
        int64_t v = 0;
        rc = c10d_store_add_sync(st, "test_pg_mismatch/done", 1, &v);
        if (rc == 0 && v == n - 1)
            rc = c10d_store_set_sync(st, all, "1", 1);
    }
    char why[512];
    snprintf(why, sizeof why, "%s", rc == 0 ? "" : c10d_last_error());
    c10d_store_release(st);
    MP_CHECK(rc == 0, "store: %s", why);
    return 0;
}

static int mismatch_main(int rank, int n, void *arg)
{
    (void)n;
    const struct mcase_spec *spec = arg;
    if (spec->detail) {
        setenv("C10D_DEBUG", "DETAIL", 1);
        c10d__env_reload();
    }
    c10d_pg_opts po = {0};
    po.timeout_ms = 120000; /* far beyond the harness's alarm: only a mismatch ends the ops */
    c10d_pg *pg = NULL;
    int rc = c10d_pg_init(&po, &pg);
    char why[2048];
    if (rc != 0) {
        /* Peers that met this rank ran the op and failed it before this rank
         * finished creating the group: creation fails here with their reason
         * (an error on every rank all the same). */
        snprintf(why, sizeof why, "%s", c10d_last_error());
        MP_CHECK(!spec->detail && strstr(why, "Detected mismatch between collectives on ranks"),
                 "init: %s", why);
        fprintf(stderr, "rank %d (creation): %s: %s\n", rank, c10d_status_name(rc), why);
        if (all_done_with_store(rank, n) != 0)
            return 1;
        c10d_shutdown();
        return 0;
    }
    c10d_work *w = NULL;
    rc = run_first(spec->c, pg, rank, &w);
    int first_ok;
    if (spec->detail) {
        /* The call itself fails, on every rank, and the group stays usable. */
        MP_CHECK(rc == C10D_EINVAL, "DETAIL: the call returned %s", c10d_status_name(rc));
        snprintf(why, sizeof why, "%s", c10d_last_error());
        first_ok = 0;
        float x = 1;
        MP_CHECK(c10d_all_reduce_sync(pg, &x, &x, 1, C10D_FLOAT32, C10D_SUM) == 0 && x == (float)n,
                 "the group is not usable after a rejected call: %s", c10d_last_error());
    } else {
        /* Peers that failed the op before this rank called it: refused at
         * the call (C10D_EREVOKED) with their reason; else it fails at the wait. */
        MP_CHECK(rc == 0 || rc == C10D_EREVOKED, "call: %s", c10d_last_error());
        if (rc == 0)
            rc = c10d_work_wait_release(w);
        snprintf(why, sizeof why, "%s", rc == 0 ? "" : c10d_last_error());
        first_ok = rc == 0;
    }
    if (rc == 0) {
        /* Only a rank whose part was send-only may have finished before it
         * heard of the disagreement; the group is failed by now or soon, so
         * its next op reports the mismatch. */
        MP_CHECK(spec->c == M_ROOT || spec->c == M_ROOT_GATHER,
                 "the mismatched op returned OK on rank %d", rank);
        /* Refused at the call once the backend knows (C10D_EREVOKED), else it
         * fails at its wait. */
        rc = c10d_barrier(pg, NULL, &w);
        MP_CHECK(rc == 0 || rc == C10D_EREVOKED, "barrier call: %s", c10d_last_error());
        if (rc == 0)
            rc = c10d_work_wait_release(w);
        MP_CHECK(rc != 0, "the op after a mismatch returned OK on rank %d", rank);
        snprintf(why, sizeof why, "%s", c10d_last_error());
    }
    fprintf(stderr, "rank %d (%s): %s: %s\n", rank, first_ok ? "next op" : "the op",
            c10d_status_name(rc), why);
    MP_CHECK(strstr(why, "Detected mismatch between collectives on ranks") != NULL,
             "no mismatch named: %s", why);
    MP_CHECK(strstr(why, spec->aspect) != NULL, "'%s' not named: %s", spec->aspect, why);
    MP_CHECK(strstr(why, "Rank 0 ") != NULL || strstr(why, "Rank 1 ") != NULL, "no rank: %s", why);
    if (all_done_with_store(rank, n) != 0)
        return 1;
    if (spec->detail) {
        /* The group is healthy here, and the check all_reduce having
         * completed on this rank says only that this rank's part is done: a
         * peer may still wait for another peer's bytes. An abort fails the
         * group and tells every peer so (docs/tcp_backend.md, "Tell the
         * others"), which would fail that peer's all_reduce; destroy says
         * goodbye, and peers that still run the op among themselves carry on. */
        MP_CHECK(c10d_pg_destroy(pg) == 0, "destroy: %s", c10d_last_error());
    } else {
        c10d_pg_abort(pg, "test over"); /* the group failed already */
    }
    c10d_shutdown();
    return 0;
}

static void run_case_mode(enum mcase c, int nranks, const char *aspect, int detail)
{
    struct mcase_spec spec = {c, nranks, aspect, detail};
    struct mp_opts o = {0};
    o.nranks = nranks;
    o.timeout_s = 30;
    o.kill_on_failure = 1;
    struct mp_result res;
    mp_run(&o, mismatch_main, &spec, &res);
    assert_false(res.timed_out);
    for (int r = 0; r < nranks; r++)
        assert_int_equal(res.codes[r], 0);
}

static void run_case(enum mcase c, int nranks, const char *aspect)
{
    run_case_mode(c, nranks, aspect, 0);
}

static void test_dtype(void **state)
{
    (void)state;
    run_case(M_DTYPE, 2, "Tensor dtypes: ");
}

static void test_reduce_op(void **state)
{
    (void)state;
    run_case(M_REDOP, 2, "Reduce op: ");
}

static void test_count(void **state)
{
    (void)state;
    run_case(M_COUNT, 2, "Tensor shapes: ");
}

static void test_kind_2(void **state)
{
    (void)state;
    run_case(M_KIND, 2, "Op type: ");
}

static void test_kind_3(void **state)
{
    (void)state;
    run_case(M_KIND, 3, "Op type: ");
}

static void test_barrier_vs_all_reduce(void **state)
{
    (void)state;
    run_case(M_BARRIER, 2, "Op type: ");
}

static void test_two_roots_broadcast(void **state)
{
    (void)state;
    run_case(M_ROOT, 2, "Root: ");
}

/* Ranks 0 and 1 both gather, rank 2 sends to 0: no frame ever passes
 * between the two roots, so only the explicit exchange can see it. */
static void test_two_roots_gather_3_detail(void **state)
{
    (void)state;
    run_case_mode(M_ROOT_GATHER, 3, "Root: ", 1);
}

static void test_dtype_detail(void **state)
{
    (void)state;
    run_case_mode(M_DTYPE, 2, "Tensor dtypes: ", 1);
}

/* A complex op runs as its reals: DETAIL compares what each rank called. */
static void test_complex_vs_reals_detail(void **state)
{
    (void)state;
    run_case_mode(M_COMPLEX, 2, "Tensor dtypes: ", 1);
}

static void test_two_roots_broadcast_detail(void **state)
{
    (void)state;
    run_case_mode(M_ROOT, 2, "Root: ", 1);
}

static void test_rejected_on_one_rank(void **state)
{
    (void)state;
    run_case(M_REJECTED_ONE, 2, "Op type: ");
}

/* DETAIL with a dead peer: the exchange times out, the group fails, and the
 * next call fails at once instead of waiting for the dead rank again. */
static int detail_dead_main(int rank, int n, void *arg)
{
    (void)n;
    (void)arg;
    setenv("C10D_DEBUG", "DETAIL", 1);
    c10d__env_reload();
    c10d_pg_opts po = {0};
    po.timeout_ms = 2000;
    c10d_pg *pg = NULL;
    MP_CHECK(c10d_pg_init(&po, &pg) == 0, "init: %s", c10d_last_error());
    if (rank == 1)
        raise(SIGKILL);
    float x = 1;
    int rc = c10d_all_reduce_sync(pg, &x, &x, 1, C10D_FLOAT32, C10D_SUM);
    MP_CHECK(rc != 0, "all_reduce with a dead peer succeeded");
    fprintf(stderr, "rank 0: %s\n", c10d_last_error());
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    rc = c10d_all_reduce_sync(pg, &x, &x, 1, C10D_FLOAT32, C10D_SUM);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double waited = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) / 1e9;
    MP_CHECK(rc != 0 && strstr(c10d_last_error(), "failed earlier") != NULL, "second call: %s: %s",
             c10d_status_name(rc), c10d_last_error());
    /* Not a timing assertion: a second full timeout (2 s) means it waited again. */
    MP_CHECK(waited < 1.5, "the second call waited %.1f s", waited);
    c10d_pg_abort(pg, "test over");
    c10d_shutdown();
    return 0;
}

static void test_detail_dead_peer_fails_fast(void **state)
{
    (void)state;
    struct mp_opts o = {0};
    o.nranks = 2;
    o.timeout_s = 30;
    struct mp_result res;
    mp_run(&o, detail_dead_main, NULL, &res);
    assert_false(res.timed_out);
    assert_int_equal(res.codes[0], 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dtype),
        cmocka_unit_test(test_reduce_op),
        cmocka_unit_test(test_count),
        cmocka_unit_test(test_kind_2),
        cmocka_unit_test(test_kind_3),
        cmocka_unit_test(test_barrier_vs_all_reduce),
        cmocka_unit_test(test_two_roots_broadcast),
        cmocka_unit_test(test_two_roots_gather_3_detail),
        cmocka_unit_test(test_dtype_detail),
        cmocka_unit_test(test_complex_vs_reals_detail),
        cmocka_unit_test(test_two_roots_broadcast_detail),
        cmocka_unit_test(test_rejected_on_one_rank),
        cmocka_unit_test(test_detail_dead_peer_fails_fast),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
