/* A live group inspected and adjusted without running an op: its error
 * (c10d_pg_error), its store (c10d_pg_store), its timeout
 * (c10d_pg_set_timeout), a hook on every op's completion
 * (c10d_pg_register_completion_hook). Real processes on the tcp backend. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "c10d.h"
#include "engine/env.h"
#include "mp_harness.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* c10d_pg_error until it reports a failure, 10 s at most. */
static int wait_for_error(c10d_pg *pg)
{
    int rc = 0;
    for (int i = 0; i < 200 && (rc = c10d_pg_error(pg)) == 0; i++)
        usleep(50 * 1000);
    return rc;
}

/* Two ranks run fn; both must exit 0. */
static void run_two(mp_rank_fn fn)
{
    struct mp_opts o = {0};
    o.nranks = 2;
    o.timeout_s = 60;
    o.kill_on_failure = 1;
    struct mp_result res;
    mp_run(&o, fn, NULL, &res);
    assert_false(res.timed_out);
    assert_int_equal(res.codes[0], 0);
    assert_int_equal(res.codes[1], 0);
}

/* What the completion hook saw (it runs on the loop thread). */
static pthread_mutex_t seen_mu = PTHREAD_MUTEX_INITIALIZER;
static char seen_types[8][32];
static uint64_t seen_seq[8];
static int seen_status[8], seen_n, seen_bad_times;

static void on_completed(const c10d_work_info *info, void *arg)
{
    (void)arg;
    pthread_mutex_lock(&seen_mu);
    if (seen_n < 8) {
        snprintf(seen_types[seen_n], sizeof seen_types[0], "%s", info->op_type);
        seen_seq[seen_n] = info->seq;
        seen_status[seen_n] = info->status;
    }
    seen_n++;
    if (info->time_finished_us < info->time_started_us || info->active_duration_ms < 0)
        seen_bad_times++;
    pthread_mutex_unlock(&seen_mu);
}

static int seen_count(void)
{
    pthread_mutex_lock(&seen_mu);
    int n = seen_n;
    pthread_mutex_unlock(&seen_mu);
    return n;
}

static int inspect_main(int rank, int n, void *arg)
{
    (void)arg;
    (void)n;
    c10d_pg_opts po = {0};
    po.timeout_ms = 60000;
    c10d_pg *pg = NULL;
    MP_CHECK(c10d_pg_init(&po, &pg) == 0, "init: %s", c10d_last_error());
    MP_CHECK(c10d_pg_error(pg) == 0, "a fresh group reports %s", c10d_last_error());
    /* A tcp group: host buffers and coalescing; split and shrink go through
     * the store, not the backend. */
    if (strcmp(c10d_pg_backend(pg), "tcp") == 0) {
        MP_CHECK(c10d_pg_supports(pg, C10D_CAP_HOST) == 1 &&
                     c10d_pg_supports(pg, C10D_CAP_COALESCING) == 1 &&
                     c10d_pg_supports(pg, C10D_CAP_CUDA) == 0 &&
                     c10d_pg_supports(pg, C10D_CAP_SPLIT) == 0 &&
                     c10d_pg_supports(pg, C10D_CAP_SHRINK) == 0,
                 "tcp capabilities");
    }
    MP_CHECK(c10d_pg_supports(pg, C10D_CAP_COUNT) == C10D_EINVAL, "unknown capability taken");

    /* The group's store is the one its ranks share. */
    c10d_store *st = NULL;
    MP_CHECK(c10d_pg_store(pg, &st) == 0, "pg_store: %s", c10d_last_error());
    if (rank == 0)
        MP_CHECK(c10d_store_set_sync(st, "inspect", "from rank 0", 11) == 0, "set: %s",
                 c10d_last_error());
    const char *keys[] = {"inspect"};
    MP_CHECK(c10d_store_wait_sync(st, keys, 1, 10000) == 0, "wait: %s", c10d_last_error());
    c10d_store_release(st);
    MP_CHECK(c10d_pg_store(pg, NULL) == C10D_EINVAL, "pg_store without out");

    /* The completion hook: each op once, with torch's names and the seq. */
    MP_CHECK(c10d_pg_register_completion_hook(pg, on_completed, NULL) == 0, "hook: %s",
             c10d_last_error());
    MP_CHECK(c10d_pg_register_completion_hook(pg, on_completed, NULL) == C10D_EINVAL,
             "a second hook was taken");
    float v = 1.0f;
    MP_CHECK(c10d_all_reduce_sync(pg, &v, &v, 1, C10D_FLOAT32, C10D_SUM) == 0, "all_reduce: %s",
             c10d_last_error());
    MP_CHECK(c10d_broadcast_sync(pg, &v, &v, 1, C10D_FLOAT32, 0) == 0, "broadcast: %s",
             c10d_last_error());
    uint64_t seq = c10d_pg_seq(pg);
    /* The hook runs on the loop, after the work completed: wait for it. */
    for (int i = 0; i < 200 && seen_count() < 2; i++)
        usleep(10 * 1000);
    pthread_mutex_lock(&seen_mu);
    MP_CHECK(seen_n == 2, "hook called %d times", seen_n);
    MP_CHECK(strcmp(seen_types[0], "ALLREDUCE") == 0 && strcmp(seen_types[1], "BROADCAST") == 0,
             "types %s, %s", seen_types[0], seen_types[1]);
    MP_CHECK(seen_seq[1] == seq && seen_seq[0] == seq - 1, "seqs %llu %llu, group at %llu",
             (unsigned long long)seen_seq[0], (unsigned long long)seen_seq[1],
             (unsigned long long)seq);
    MP_CHECK(seen_status[0] == 0 && seen_status[1] == 0 && seen_bad_times == 0, "status/times");
    pthread_mutex_unlock(&seen_mu);

    /* A bad timeout fails that call only. */
    MP_CHECK(c10d_pg_set_timeout(pg, 0) == C10D_EINVAL, "timeout 0 taken");
    MP_CHECK(c10d_pg_error(pg) == 0, "a refused call failed the group: %s", c10d_last_error());
    MP_CHECK(c10d_barrier_sync(pg) == 0, "barrier: %s", c10d_last_error());

    /* 500 ms from now on: rank 0's all_reduce, which rank 1 never joins,
     * times out by it (the group's 60 s would outlast the test). */
    MP_CHECK(c10d_pg_set_timeout(pg, 500) == 0, "set_timeout: %s", c10d_last_error());
    if (rank == 0) {
        float x = 1.0f;
        int rc = c10d_all_reduce_sync(pg, &x, &x, 1, C10D_FLOAT32, C10D_SUM);
        MP_CHECK(rc == C10D_ETIMEDOUT, "all_reduce returned %d: %s", rc, c10d_last_error());
        MP_CHECK(c10d_pg_error(pg) == C10D_ETIMEDOUT, "error after the timeout: %s",
                 c10d_last_error());
        MP_CHECK(strstr(c10d_last_error(), "Timeout(ms)=500") != NULL, "message: %s",
                 c10d_last_error());
        /* The failed op reached the hook too, with its status. */
        for (int i = 0; i < 200 && seen_count() < 4; i++)
            usleep(10 * 1000);
        pthread_mutex_lock(&seen_mu);
        int last = seen_n - 1;
        MP_CHECK(last >= 0 && last < 8 && seen_status[last] == C10D_ETIMEDOUT,
                 "the hook saw status %d last", last >= 0 && last < 8 ? seen_status[last] : 0);
        pthread_mutex_unlock(&seen_mu);
    } else {
        /* Rank 1 runs no op: the error still reaches it (rank 0's group
         * failing closes its connections). */
        MP_CHECK(wait_for_error(pg) < 0, "rank 1 never saw rank 0's failure");
        MP_CHECK(strstr(c10d_last_error(), "process group 0") != NULL, "message: %s",
                 c10d_last_error());
    }
    c10d_pg_abort(pg, "test over");
    c10d_shutdown();
    return 0;
}

static void test_inspect(void **state)
{
    (void)state;
    run_two(inspect_main);
}

/* A wait that times out: the work goes on by default; with blocking wait
 * (C10D_BLOCKING_WAIT=1, torch's TORCH_NCCL_BLOCKING_WAIT) it fails, and so
 * does its group, on every rank. */
static int blocking_main(int rank, int n, void *arg)
{
    (void)arg;
    (void)n;
    unsetenv("C10D_BLOCKING_WAIT");
    unsetenv("TORCH_NCCL_BLOCKING_WAIT");
    c10d__env_reload();
    c10d_pg_opts po = {0};
    po.timeout_ms = 60000;
    c10d_pg *pg = NULL;
    MP_CHECK(c10d_pg_init(&po, &pg) == 0, "init: %s", c10d_last_error());
    float x = 1.0f;
    c10d_work *w = NULL;
    if (rank == 1)
        usleep(600 * 1000);
    MP_CHECK(c10d_all_reduce(pg, &x, &x, 1, C10D_FLOAT32, C10D_SUM, NULL, &w) == 0, "post: %s",
             c10d_last_error());
    if (rank == 0) {
        MP_CHECK(c10d_work_wait(w, 100) == C10D_ETIMEDOUT, "a short wait did not time out");
        MP_CHECK(c10d_work_test(w) == 0, "the work did not go on");
    }
    MP_CHECK(c10d_work_wait_release(w) == 0, "the op itself: %s", c10d_last_error());
    MP_CHECK(x == 2.0f, "sum %g", x);

    setenv("TORCH_NCCL_BLOCKING_WAIT", "1", 1);
    c10d__env_reload();
    MP_CHECK(c10d_barrier_sync(pg) == 0, "barrier: %s", c10d_last_error());
    if (rank == 0) {
        MP_CHECK(c10d_all_reduce(pg, &x, &x, 1, C10D_FLOAT32, C10D_SUM, NULL, &w) == 0, "post: %s",
                 c10d_last_error());
        MP_CHECK(c10d_work_wait(w, 300) == C10D_ETIMEDOUT, "the blocking wait did not time out");
        MP_CHECK(strstr(c10d_last_error(), "blocking wait") != NULL, "message: %s",
                 c10d_last_error());
        MP_CHECK(c10d_work_wait(w, 5000) == C10D_ETIMEDOUT, "the work was not failed: %s",
                 c10d_last_error());
        c10d_work_release(w);
    }
    /* Rank 1 never joined that op: the failure reaches it all the same. */
    int rc = wait_for_error(pg);
    MP_CHECK(rc == C10D_ETIMEDOUT || (rank == 1 && rc < 0), "rank %d: group error %d: %s", rank, rc,
             c10d_last_error());
    c10d_pg_abort(pg, "test over");
    c10d_shutdown();
    return 0;
}

static void test_blocking_wait(void **state)
{
    (void)state;
    run_two(blocking_main);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_inspect),
        cmocka_unit_test(test_blocking_wait),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
