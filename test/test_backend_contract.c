/* The backend contract, proved with the test-only stream backend: ops are
 * enqueued on the caller's thread in sequence order, complete through the
 * engine's completion poller with every callback run exactly once, a stuck op
 * times out, and abort returns within its bound while the backend's own
 * abort blocks. Also run under ThreadSanitizer (scripts/test.sh tsan). */
#include "api/pg.h"
#include "engine/env.h"
#include "engine/poller.h"
#include "engine/work.h"
#include "stream_backend.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static c10d_pg *new_group(void)
{
    c10d_pg *pg = NULL;
    assert_int_equal(c10d__pg_create_with_backend(&stream_backend, NULL, 0, 1, 60000, &pg), 0);
    return pg;
}

static void reset_record(void)
{
    pthread_mutex_lock(&stream_rec.mutex);
    stream_rec.n_enqueued = stream_rec.n_completed = stream_rec.n_split = 0;
    stream_rec.enqueued_on_engine_thread = 0;
    stream_rec.stick_next = 0;
    stream_rec.abort_block_ms = 0;
    pthread_mutex_unlock(&stream_rec.mutex);
}

/* ------------------------------------------- order and exactly-once callbacks */

enum { THREADS = 4, OPS_PER_THREAD = 250 };

static atomic_int cb_count[THREADS * OPS_PER_THREAD];
static atomic_int cb_off_engine_thread;

static void count_cb(c10d_work *w, int status, void *arg)
{
    (void)w;
    (void)status;
    if (!c10d__engine_own_thread())
        atomic_fetch_add(&cb_off_engine_thread, 1);
    atomic_fetch_add(&cb_count[(intptr_t)arg], 1);
}

struct issuer {
    c10d_pg *pg;
    int id;
    int failures;
};

static void *issue(void *arg)
{
    struct issuer *is = arg;
    float send[4] = {1, 2, 3, 4}, recv[4];
    for (int i = 0; i < OPS_PER_THREAD; i++) {
        c10d_op_opts o;
        memset(&o, 0, sizeof o);
        o.cb = count_cb;
        o.cb_arg = (void *)(intptr_t)(is->id * OPS_PER_THREAD + i);
        c10d_work *w = NULL;
        if (c10d_all_reduce(is->pg, send, recv, 4, C10D_FLOAT32, C10D_SUM, &o, &w) != 0 ||
            c10d_work_wait(w, 20000) != 0 || recv[3] != 4)
            is->failures++;
        c10d_work_release(w);
    }
    return NULL;
}

static void test_enqueue_order_and_callbacks(void **state)
{
    (void)state;
    reset_record();
    c10d_pg *pg = new_group();
    pthread_t t[THREADS];
    struct issuer is[THREADS];
    for (int i = 0; i < THREADS; i++) {
        is[i] = (struct issuer){pg, i, 0};
        assert_int_equal(pthread_create(&t[i], NULL, issue, &is[i]), 0);
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(is[i].failures, 0);
    }
    assert_int_equal(c10d_pg_destroy(pg), 0);
    /* Every callback exactly once, on the engine's own thread. */
    for (int k = 0; k < 2000; k++) {
        int all = 1;
        for (int i = 0; i < THREADS * OPS_PER_THREAD && all; i++)
            all = atomic_load(&cb_count[i]) >= 1;
        if (all)
            break;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    for (int i = 0; i < THREADS * OPS_PER_THREAD; i++)
        assert_int_equal(atomic_load(&cb_count[i]), 1);
    assert_int_equal(atomic_load(&cb_off_engine_thread), 0);
    /* Enqueued on the callers' threads, in sequence order whatever the thread. */
    pthread_mutex_lock(&stream_rec.mutex);
    int n = stream_rec.n_enqueued, completed = stream_rec.n_completed;
    int on_engine = stream_rec.enqueued_on_engine_thread;
    int in_order = 1;
    for (int i = 0; i < n; i++)
        in_order &= stream_rec.enqueued_seq[i] == (uint64_t)i + 1;
    pthread_mutex_unlock(&stream_rec.mutex);
    assert_int_equal(n, THREADS * OPS_PER_THREAD);
    assert_int_equal(completed, THREADS * OPS_PER_THREAD);
    assert_int_equal(on_engine, 0);
    assert_true(in_order);
    assert_int_equal(c10d__poll_pending(), 0);
}

/* -------------------------------------------------------------- split */

/* A subgroup of a group whose backend splits is made by split, not through
 * the store, and works; a backend without split (tcp) goes through the store,
 * as test_pg_ops's subgroups prove. */
static void test_subgroup_by_split(void **state)
{
    (void)state;
    reset_record();
    c10d_store *store = NULL;
    assert_int_equal(c10d_store_hash_create(&store), 0);
    c10d_pg *pg = NULL;
    assert_int_equal(c10d__pg_create_with_backend(&stream_backend, store, 0, 1, 60000, &pg), 0);
    int ranks[1] = {0};
    c10d_pg *sub = NULL;
    assert_int_equal(c10d_pg_new_group(pg, ranks, 1, NULL, &sub), 0);
    pthread_mutex_lock(&stream_rec.mutex);
    int splits = stream_rec.n_split;
    pthread_mutex_unlock(&stream_rec.mutex);
    assert_int_equal(splits, 1);
    float x[4] = {1, 2, 3, 4};
    c10d_work *w = NULL;
    assert_int_equal(c10d_all_reduce(sub, x, x, 4, C10D_FLOAT32, C10D_SUM, NULL, &w), 0);
    assert_int_equal(c10d_work_wait_release(w), 0);
    assert_int_equal(c10d_pg_destroy(sub), 0);
    assert_int_equal(c10d_pg_destroy(pg), 0);
    c10d_store_release(store);
}

/* ------------------------------------------------------------ a stuck op */

static void test_stuck_op_times_out(void **state)
{
    (void)state;
    reset_record();
    c10d_pg *pg = new_group();
    float send[4] = {1, 2, 3, 4}, recv[4];
    pthread_mutex_lock(&stream_rec.mutex);
    stream_rec.stick_next = 1;
    pthread_mutex_unlock(&stream_rec.mutex);
    c10d_op_opts o;
    memset(&o, 0, sizeof o);
    o.timeout_ms = 200;
    c10d_work *w = NULL;
    assert_int_equal(c10d_all_reduce(pg, send, recv, 4, C10D_FLOAT32, C10D_SUM, &o, &w), 0);
    uint64_t t0 = now_ms();
    assert_int_equal(c10d_work_wait(w, 10000), C10D_ETIMEDOUT);
    assert_true(now_ms() - t0 < 5000);
    assert_non_null(strstr(c10d_work_message(w), "before timing out"));
    c10d_work_release(w);
    /* The group is failed from then on: the next op fails at once. */
    c10d_work *w2 = NULL;
    int rc = c10d_all_reduce(pg, send, recv, 4, C10D_FLOAT32, C10D_SUM, NULL, &w2);
    if (rc == 0) {
        assert_int_not_equal(c10d_work_wait(w2, 5000), 0);
        c10d_work_release(w2);
    }
    assert_int_equal(c10d_pg_abort(pg, "test over"), 0);
}

/* ------------------------------------------- abort bounded while an op is stuck */

static void test_abort_returns_within_bound(void **state)
{
    (void)state;
    reset_record();
    setenv("C10D_BACKEND_CLOSE_MS", "300", 1);
    c10d__env_reload();
    c10d_pg *pg = new_group();
    float send[4] = {1, 2, 3, 4}, recv[4];
    pthread_mutex_lock(&stream_rec.mutex);
    stream_rec.stick_next = 1;
    stream_rec.abort_block_ms = 30000; /* a communicator abort that hangs */
    pthread_mutex_unlock(&stream_rec.mutex);
    c10d_work *w = NULL;
    assert_int_equal(c10d_all_reduce(pg, send, recv, 4, C10D_FLOAT32, C10D_SUM, NULL, &w), 0);
    assert_int_equal(c10d_work_test(w), 0);
    assert_int_equal(c10d_work_status(w), C10D_PENDING);
    uint64_t t0 = now_ms();
    assert_int_equal(c10d_pg_abort(pg, "test abort"), 0);
    uint64_t took = now_ms() - t0;
    assert_true(took < 3000); /* bound 300 ms, plus the loop's own step */
    assert_int_equal(c10d_work_wait(w, 5000), C10D_EABORTED);
    c10d_work_release(w);
    pthread_mutex_lock(&stream_rec.mutex);
    int aborts = stream_rec.n_aborts;
    stream_rec.abort_block_ms = 0;
    pthread_mutex_unlock(&stream_rec.mutex);
    assert_true(aborts >= 1);
    unsetenv("C10D_BACKEND_CLOSE_MS");
    c10d__env_reload();
}

/* ------------------------------------------------ wait_stream and cancel */

static void test_wait_stream_and_cancel_on_host_works(void **state)
{
    (void)state;
    c10d_work *w;
    assert_int_equal(c10d_work_create("host", 0, &w), 0);
    assert_int_equal(c10d_work_status(w), C10D_PENDING);
    assert_int_equal(c10d_work_cancel(w), 0);
    /* A host work: the "stream" wait is a plain wait. */
    assert_int_equal(c10d_work_wait_stream(w, NULL), C10D_ECANCELED);
    assert_int_equal(c10d_work_status(w), C10D_ECANCELED);
    c10d_work_release(w);
    /* A group op cannot be cancelled on one rank. */
    reset_record();
    c10d_pg *pg = new_group();
    pthread_mutex_lock(&stream_rec.mutex);
    stream_rec.stick_next = 1;
    pthread_mutex_unlock(&stream_rec.mutex);
    float send[4] = {1, 2, 3, 4}, recv[4];
    assert_int_equal(c10d_all_reduce(pg, send, recv, 4, C10D_FLOAT32, C10D_SUM, NULL, &w), 0);
    assert_int_equal(c10d_work_cancel(w), C10D_EUNSUPPORTED);
    assert_int_equal(c10d_pg_abort(pg, "test over"), 0);
    assert_int_equal(c10d_work_wait(w, 5000), C10D_EABORTED);
    c10d_work_release(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_enqueue_order_and_callbacks),
        cmocka_unit_test(test_stuck_op_times_out),
        cmocka_unit_test(test_subgroup_by_split),
        cmocka_unit_test(test_abort_returns_within_bound),
        cmocka_unit_test(test_wait_stream_and_cancel_on_host_works),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    c10d_shutdown();
    return rc;
}
