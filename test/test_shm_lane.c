/* The caller's lane (backends/tcp/lane.h): small collectives on shared
 * memory that the waiting thread runs itself. Real ranks (processes), the
 * public API; every way a parked op can leave the lane is taken once:
 * its waiter, a callback, polling, a later op of the group, the deadline. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "backends/tcp/lane.h"
#include "c10d.h"
#include "engine/work.h"
#include "mp_harness.h"

#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static atomic_int callbacks_run;

static void count_cb(c10d_work *w, int status, void *arg)
{
    (void)w;
    (void)arg;
    if (status == 0)
        atomic_fetch_add(&callbacks_run, 1);
}

static int sum_ok(const int32_t *v, size_t n, int nranks, int base)
{
    for (size_t i = 0; i < n; i++)
        if (v[i] != (int32_t)(nranks * (base + (int)i)) + nranks * (nranks - 1) / 2)
            return 0;
    return 1;
}

static void fill(int32_t *v, size_t n, int rank, int base)
{
    for (size_t i = 0; i < n; i++)
        v[i] = base + (int)i + rank;
}

/* The world group on shared memory with the lane on, or NULL. */
static c10d_pg *lane_group(void)
{
    setenv("C10D_SHM", "1", 1);
    setenv("C10D_SHM_LANE", "1", 1);
    c10d_pg_opts po = {0};
    po.timeout_ms = 60000;
    c10d_pg *pg = NULL;
    if (c10d_pg_init(&po, &pg) != 0 || strcmp(c10d_pg_host_path(pg), "shm") != 0) {
        fprintf(stderr, "init: %s (path %s)\n", c10d_last_error(),
                pg != NULL ? c10d_pg_host_path(pg) : "none");
        return NULL;
    }
    return pg;
}

static int lane_main(int rank, int n, void *arg)
{
    (void)arg;
    c10d_pg *pg = lane_group();
    MP_CHECK(pg != NULL, "no group on shared memory");
    int32_t v[64];
    uint64_t here0, loop0, here1, loop1;
    c10d__tcp_lane_counts(&here0, &loop0);

    /* 1. Blocking: the waiter runs them. */
    for (int k = 0; k < 200; k++) {
        fill(v, 64, rank, k);
        MP_CHECK(c10d_all_reduce_sync(pg, v, v, 64, C10D_INT32, C10D_SUM) == 0, "sync: %s",
                 c10d_last_error());
        MP_CHECK(sum_ok(v, 64, n, k), "sync %d: wrong sum", k);
    }
    c10d__tcp_lane_counts(&here1, &loop1);
    MP_CHECK(here1 > here0, "no op completed in the lane");
    fprintf(stderr, "rank %d: %llu of 200 in the lane, %llu handed to the loop\n", rank,
            (unsigned long long)(here1 - here0), (unsigned long long)(loop1 - loop0));

    /* 2. Several in flight, waited in reverse: each later op hands the one
     * parked before it to the loop, which keeps their order. */
    int32_t a[3][64];
    c10d_work *w[3];
    for (int k = 0; k < 3; k++) {
        fill(a[k], 64, rank, 100 + k);
        MP_CHECK(c10d_all_reduce(pg, a[k], a[k], 64, C10D_INT32, C10D_SUM, NULL, &w[k]) == 0,
                 "post %d", k);
    }
    for (int k = 2; k >= 0; k--) {
        MP_CHECK(c10d_work_wait(w[k], 30000) == 0, "wait %d: %s", k, c10d_last_error());
        c10d_work_release(w[k]);
    }
    for (int k = 0; k < 3; k++)
        MP_CHECK(sum_ok(a[k], 64, n, 100 + k), "in flight %d: wrong sum", k);

    /* 2b. Over and over: a collective for the loop (two slots) right after
     * one parked in the lane, so the loop's add borrows the parked work while
     * the next round's lane op replaces it; waited in either order. */
    enum { BIG = 128 * 1024 };
    int32_t *big = malloc(BIG * sizeof *big);
    MP_CHECK(big != NULL, "out of memory");
    for (int k = 0; k < 300; k++) {
        c10d_work *ws, *wb;
        fill(v, 64, rank, 300 + k);
        fill(big, BIG, rank, 700 + k);
        MP_CHECK(c10d_all_reduce(pg, v, v, 64, C10D_INT32, C10D_SUM, NULL, &ws) == 0, "post");
        MP_CHECK(c10d_all_reduce(pg, big, big, BIG, C10D_INT32, C10D_SUM, NULL, &wb) == 0, "post");
        c10d_work *first = k % 2 ? ws : wb, *second = k % 2 ? wb : ws;
        MP_CHECK(c10d_work_wait(first, 30000) == 0, "round %d: %s", k, c10d_last_error());
        MP_CHECK(c10d_work_wait(second, 30000) == 0, "round %d: %s", k, c10d_last_error());
        c10d_work_release(ws);
        c10d_work_release(wb);
        MP_CHECK(sum_ok(v, 64, n, 300 + k) && sum_ok(big, BIG, n, 700 + k), "round %d: wrong sum",
                 k);
    }
    free(big);

    /* 3. A callback added after submit: the loop runs the op; the wait
     * returns after the callback ran. */
    c10d_work *cw;
    fill(v, 64, rank, 7);
    MP_CHECK(c10d_all_reduce(pg, v, v, 64, C10D_INT32, C10D_SUM, NULL, &cw) == 0, "post");
    MP_CHECK(c10d_work_on_complete(cw, count_cb, NULL) == 0, "on_complete");
    MP_CHECK(c10d_work_wait(cw, 30000) == 0, "wait: %s", c10d_last_error());
    MP_CHECK(atomic_load(&callbacks_run) == 1, "callback ran %d times before the wait returned",
             atomic_load(&callbacks_run));
    MP_CHECK(sum_ok(v, 64, n, 7), "callback op: wrong sum");
    c10d_work_release(cw);

    /* 4. Polled, never waited: it completes all the same. */
    fill(v, 64, rank, 9);
    MP_CHECK(c10d_all_reduce(pg, v, v, 64, C10D_INT32, C10D_SUM, NULL, &cw) == 0, "post");
    for (int i = 0; i < 30000 && c10d_work_test(cw) == 0; i++)
        usleep(1000);
    MP_CHECK(c10d_work_status(cw) == 0, "polled op: status %d", c10d_work_status(cw));
    MP_CHECK(sum_ok(v, 64, n, 9), "polled op: wrong sum");
    c10d_work_release(cw);

    /* 4b. A handle let go of without a wait: the op still completes (its
     * output appears), nothing later of the group needed. */
    int32_t lone[64];
    fill(lone, 64, rank, 13);
    size_t pending0 = c10d__work_pending_count();
    MP_CHECK(c10d_all_reduce(pg, lone, lone, 64, C10D_INT32, C10D_SUM, NULL, &cw) == 0, "post");
    c10d_work_release(cw);
    /* The pending list's lock orders the op's writes before this read. */
    for (int i = 0; i < 10000 && c10d__work_pending_count() > pending0; i++)
        usleep(1000);
    MP_CHECK(sum_ok(lone, 64, n, 13), "released op never completed");

    /* 4c. No handle asked for: it completes by itself all the same. */
    int32_t nowork[64];
    fill(nowork, 64, rank, 17);
    pending0 = c10d__work_pending_count();
    MP_CHECK(c10d_all_reduce(pg, nowork, nowork, 64, C10D_INT32, C10D_SUM, NULL, NULL) == 0,
             "post");
    for (int i = 0; i < 10000 && c10d__work_pending_count() > pending0; i++)
        usleep(1000);
    MP_CHECK(sum_ok(nowork, 64, n, 17), "an op without a handle never completed");

    /* 5. A rank that issued its op and then blocks on something else (here
     * the store, until every other rank finished the same op) holds nobody
     * up: its slot was written at submit. */
    c10d_store *store;
    MP_CHECK(c10d_pg_store(pg, &store) == 0, "store");
    fill(v, 64, rank, 11);
    MP_CHECK(c10d_all_reduce(pg, v, v, 64, C10D_INT32, C10D_SUM, NULL, &cw) == 0, "post");
    if (rank == 0) {
        for (int r = 1; r < n; r++) {
            char key[32];
            snprintf(key, sizeof key, "lane_done_%d", r);
            const char *keys[1] = {key};
            MP_CHECK(c10d_store_wait_sync(store, keys, 1, 30000) == 0, "store wait: %s",
                     c10d_last_error());
        }
    } else {
        MP_CHECK(c10d_work_wait(cw, 30000) == 0, "wait: %s", c10d_last_error());
        char key[32];
        snprintf(key, sizeof key, "lane_done_%d", rank);
        MP_CHECK(c10d_store_set_sync(store, key, "1", 1) == 0, "set");
    }
    MP_CHECK(c10d_work_wait(cw, 30000) == 0, "wait: %s", c10d_last_error());
    MP_CHECK(sum_ok(v, 64, n, 11), "store op: wrong sum");
    c10d_work_release(cw);
    c10d_store_release(store);

    /* 5b. A group destroyed with a collective parked for a waiter that has
     * not come yet: the destroy hands it to the loop, where it completes,
     * instead of waiting out the group's timeout (20 s here). */
    int members[8];
    MP_CHECK(n <= 8, "%d ranks: members[] holds 8", n);
    for (int r = 0; r < n; r++)
        members[r] = r;
    c10d_pg_opts so = {0};
    so.timeout_ms = 20000;
    c10d_pg *sub = NULL;
    MP_CHECK(c10d_pg_new_group(pg, members, n, &so, &sub) == 0, "new_group: %s", c10d_last_error());
    int32_t kept[64];
    fill(kept, 64, rank, 19);
    MP_CHECK(c10d_all_reduce(sub, kept, kept, 64, C10D_INT32, C10D_SUM, NULL, &cw) == 0, "post");
    struct timespec d0, d1;
    clock_gettime(CLOCK_MONOTONIC, &d0);
    c10d_pg_destroy(sub);
    clock_gettime(CLOCK_MONOTONIC, &d1);
    double took = (double)(d1.tv_sec - d0.tv_sec) + (double)(d1.tv_nsec - d0.tv_nsec) / 1e9;
    MP_CHECK(took < 10, "destroy waited %.1f s for a parked op", took);
    MP_CHECK(c10d_work_wait(cw, 30000) == 0, "parked op: %s", c10d_last_error());
    MP_CHECK(sum_ok(kept, 64, n, 19), "parked op: wrong sum");
    c10d_work_release(cw);

    /* 6. A peer that never comes: the waiter stops at the op's deadline
     * with the watchdog's words, and the group fails. */
    if (rank == 0) {
        c10d_op_opts o = {0};
        o.timeout_ms = 300;
        MP_CHECK(c10d_all_reduce(pg, v, v, 64, C10D_INT32, C10D_SUM, &o, &cw) == 0, "post");
        int rc = c10d_work_wait(cw, 30000);
        MP_CHECK(rc == C10D_ETIMEDOUT, "wait: %d (%s)", rc, c10d_last_error());
        MP_CHECK(strstr(c10d_work_message(cw), "Watchdog caught collective operation timeout"),
                 "message: %s", c10d_work_message(cw));
        c10d_work_release(cw);
    } else {
        usleep(1000 * 1000);
    }
    c10d_pg_destroy(pg);
    c10d_shutdown();
    return 0;
}

/* all_to_all in the lane: it stays there only once done at submit, so a
 * rank whose own blocks are small never keeps peers with a larger block
 * between them waiting for its caller. */
static int a2a_main(int rank, int n, void *arg)
{
    (void)arg;
    c10d_pg *pg = lane_group();
    MP_CHECK(pg != NULL, "no group on shared memory");
    uint64_t here0, loop0, here1, loop1;
    c10d__tcp_lane_counts(&here0, &loop0);

    /* 1. Even splits, blocking, in place every other round. */
    enum { PER = 16 };
    int32_t in[8 * PER], out[8 * PER];
    MP_CHECK(n <= 8, "%d ranks: the buffers hold 8", n);
    for (int k = 0; k < 200; k++) {
        for (int d = 0; d < n; d++)
            for (int i = 0; i < PER; i++)
                in[d * PER + i] = k * 10000 + rank * 100 + d * 10 + i % 10;
        int32_t *dst = k % 2 ? in : out;
        c10d_work *w;
        MP_CHECK(c10d_all_to_all_single(pg, in, dst, (size_t)(n * PER), NULL, NULL, C10D_INT32,
                                        NULL, &w) == 0 &&
                     c10d_work_wait(w, 30000) == 0,
                 "round %d: %s", k, c10d_last_error());
        c10d_work_release(w);
        for (int s = 0; s < n; s++)
            for (int i = 0; i < PER; i++)
                MP_CHECK(dst[s * PER + i] == k * 10000 + s * 100 + rank * 10 + i % 10,
                         "round %d: block from rank %d, element %d: %d", k, s, i,
                         (int)dst[s * PER + i]);
    }
    c10d__tcp_lane_counts(&here1, &loop1);
    MP_CHECK(here1 > here0, "no all_to_all completed in the lane");
    fprintf(stderr, "rank %d: %llu of 200 all_to_all in the lane, %llu handed to the loop\n", rank,
            (unsigned long long)(here1 - here0), (unsigned long long)(loop1 - loop0));

    /* 1b. The output one block past the input (recv = send + block): each
     * receive block starts where the next send block does, which needs no
     * copy of the input, so a rank's own block must be taken from its input
     * before a peer's lands on it. One chunk (the lane) and several. */
    for (size_t per = 16; per <= 100000; per += 100000 - 16) {
        int32_t *buf = malloc((size_t)(n + 1) * per * sizeof *buf);
        MP_CHECK(buf != NULL, "out of memory");
        for (int d = 0; d < n; d++)
            for (size_t i = 0; i < per; i++)
                buf[(size_t)d * per + i] = rank * 100 + d * 10 + (int)(i % 10);
        c10d_work *w;
        MP_CHECK(c10d_all_to_all_single(pg, buf, buf + per, (size_t)n * per, NULL, NULL, C10D_INT32,
                                        NULL, &w) == 0 &&
                     c10d_work_wait(w, 30000) == 0,
                 "shifted, %zu per block: %s", per, c10d_last_error());
        c10d_work_release(w);
        for (int s = 0; s < n; s++)
            for (size_t i = 0; i < per; i++)
                MP_CHECK(buf[(size_t)(s + 1) * per + i] == s * 100 + rank * 10 + (int)(i % 10),
                         "shifted, %zu per block: from rank %d, element %zu: %d", per, s, i,
                         (int)buf[(size_t)(s + 1) * per + i]);
        free(buf);
    }

    /* 2. Rank 0's blocks are 4 elements each way; ranks 1 and 2 trade 256
     * KiB, several chunks. Rank 0 issues its op and then blocks on the
     * store until both finished theirs: they need it through every chunk. */
    if (n >= 3) {
        enum { LARGE = 64 * 1024 };
        size_t sc[8], rc[8], total_s = 0, total_r = 0;
        for (int d = 0; d < n; d++) {
            int large = (rank == 1 && d == 2) || (rank == 2 && d == 1);
            sc[d] = rc[d] = large ? LARGE : 4;
            total_s += sc[d];
            total_r += rc[d];
        }
        int32_t *s_buf = malloc(total_s * sizeof *s_buf), *r_buf = malloc(total_r * sizeof *r_buf);
        MP_CHECK(s_buf != NULL && r_buf != NULL, "out of memory");
        for (size_t i = 0, at = 0; (int)i < n; at += sc[i], i++)
            for (size_t e = 0; e < sc[i]; e++)
                s_buf[at + e] = rank * 1000000 + (int)i * 100000 + (int)(e % 100000);
        c10d_work *w;
        MP_CHECK(c10d_all_to_all_single(pg, s_buf, r_buf, total_s, sc, rc, C10D_INT32, NULL, &w) ==
                     0,
                 "uneven: %s", c10d_last_error());
        c10d_store *store;
        MP_CHECK(c10d_pg_store(pg, &store) == 0, "store");
        if (rank == 0) {
            const char *keys[2] = {"a2a_done_1", "a2a_done_2"};
            MP_CHECK(c10d_store_wait_sync(store, keys, 2, 20000) == 0,
                     "ranks 1 and 2 never finished: %s", c10d_last_error());
        } else {
            MP_CHECK(c10d_work_wait(w, 30000) == 0, "uneven: %s", c10d_last_error());
            if (rank <= 2)
                MP_CHECK(c10d_store_set_sync(store, rank == 1 ? "a2a_done_1" : "a2a_done_2", "1",
                                             1) == 0,
                         "set");
        }
        MP_CHECK(c10d_work_wait(w, 30000) == 0, "uneven: %s", c10d_last_error());
        c10d_work_release(w);
        c10d_store_release(store);
        for (size_t s = 0, at = 0; (int)s < n; at += rc[s], s++)
            for (size_t e = 0; e < rc[s]; e++)
                MP_CHECK(r_buf[at + e] == (int32_t)s * 1000000 + rank * 100000 + (int)(e % 100000),
                         "uneven: from rank %zu, element %zu: %d", s, e, (int)r_buf[at + e]);
        free(s_buf);
        free(r_buf);
    }

    /* 3. Split sizes that differ between ranks: every rank fails, in a
     * group of its own so the world goes on. */
    int members[8];
    for (int r = 0; r < n; r++)
        members[r] = r;
    c10d_pg *sub = NULL;
    MP_CHECK(c10d_pg_new_group(pg, members, n, NULL, &sub) == 0, "new_group: %s",
             c10d_last_error());
    size_t sc[8], rc[8];
    for (int d = 0; d < n; d++)
        sc[d] = rc[d] = 2;
    if (rank == 0)
        rc[n - 1] = 1; /* rank n-1 sends 2 */
    int32_t small_in[16] = {0}, small_out[16];
    c10d_work *mw;
    MP_CHECK(c10d_all_to_all_single(sub, small_in, small_out, (size_t)(2 * n), sc, rc, C10D_INT32,
                                    NULL, &mw) == 0,
             "mismatched: %s", c10d_last_error());
    MP_CHECK(c10d_work_wait(mw, 30000) != 0, "mismatched split sizes succeeded");
    MP_CHECK(strstr(c10d_work_message(mw), "split sizes differ") != NULL, "error: %s",
             c10d_work_message(mw));
    c10d_work_release(mw);
    c10d_pg_destroy(sub);

    MP_CHECK(c10d_all_to_all_single(pg, in, out, (size_t)(n * PER), NULL, NULL, C10D_INT32, NULL,
                                    &mw) == 0 &&
                 c10d_work_wait(mw, 30000) == 0,
             "after the failed group: %s", c10d_last_error());
    c10d_work_release(mw);
    c10d_pg_destroy(pg);
    c10d_shutdown();
    return 0;
}

static void test_all_to_all(void **st)
{
    (void)st;
    for (int nranks = 2; nranks <= 3; nranks++) {
        struct mp_opts o = {0};
        o.nranks = nranks;
        o.timeout_s = 120;
        o.kill_on_failure = 1;
        struct mp_result res;
        int rc = mp_run(&o, a2a_main, NULL, &res);
        assert_false(res.timed_out);
        assert_int_equal(rc, 0);
    }
}

/* A peer killed while this rank's waiter polls the segment in the lane:
 * the waiter sees the group fail (the tcp connection is the liveness
 * signal) and the wait returns an error within the transport's bound. */
static int killed_main(int rank, int n, void *arg)
{
    (void)n;
    (void)arg;
    setenv("C10D_SHM", "1", 1);
    setenv("C10D_SHM_LANE_SPIN_US", "60000000", 1); /* stay in the lane throughout */
    c10d_pg_opts po = {0};
    po.timeout_ms = 60000;
    c10d_pg *pg = NULL;
    MP_CHECK(c10d_pg_init(&po, &pg) == 0, "init: %s", c10d_last_error());
    int32_t v[16] = {0};
    for (int k = 0; k < 20; k++)
        MP_CHECK(c10d_all_reduce_sync(pg, v, v, 16, C10D_INT32, C10D_SUM) == 0, "warm-up: %s",
                 c10d_last_error());
    if (rank == 1) {
        usleep(300 * 1000);
        raise(SIGKILL);
    }
    uint64_t here0, loop0, here1, loop1;
    c10d__tcp_lane_counts(&here0, &loop0);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = c10d_all_reduce_sync(pg, v, v, 16, C10D_INT32, C10D_SUM);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    c10d__tcp_lane_counts(&here1, &loop1);
    MP_CHECK(rc < 0, "the op succeeded without its peer");
    MP_CHECK(s < 10, "the error took %.1f s", s);
    MP_CHECK(loop1 == loop0 + 1 && here1 == here0, "not waited in the lane (%llu to the loop)",
             (unsigned long long)(loop1 - loop0));
    fprintf(stderr, "rank 0: %s after %.2f s: %s\n", c10d_status_name(rc), s, c10d_last_error());
    c10d_pg_abort(pg, "test over");
    c10d_shutdown();
    return 0;
}

static void test_peer_killed_in_the_lane(void **st)
{
    (void)st;
    struct mp_opts o = {0};
    o.nranks = 2;
    o.timeout_s = 60;
    struct mp_result res;
    mp_run(&o, killed_main, NULL, &res);
    assert_false(res.timed_out);
    assert_int_equal(res.codes[0], 0);
    assert_int_equal(res.codes[1], 128 + SIGKILL);
}

static void run(int nranks)
{
    struct mp_opts o = {0};
    o.nranks = nranks;
    o.timeout_s = 120;
    o.kill_on_failure = 1;
    struct mp_result res;
    int rc = mp_run(&o, lane_main, NULL, &res);
    assert_false(res.timed_out);
    assert_int_equal(rc, 0);
}

static void test_lane_2_ranks(void **st)
{
    (void)st;
    run(2);
}

static void test_lane_3_ranks(void **st)
{
    (void)st;
    run(3);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lane_2_ranks),
        cmocka_unit_test(test_lane_3_ranks),
        cmocka_unit_test(test_all_to_all),
        cmocka_unit_test(test_peer_killed_in_the_lane),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
