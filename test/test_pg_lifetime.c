/* Group handles that outlive the library or cross a fork: after
 * c10d_shutdown every op, wait and destroy of an old group fails with
 * C10D_EABORTED (never reaching a loop that is gone), and a new default group
 * can be created; a forked child sees its copies of the parent's groups as
 * ended and can create its own default group, while the parent carries on. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "c10d.h"
#include "mp_harness.h"
#include "sanitizers.h"

#include <stdio.h>
#include <stdlib.h>
#include <dirent.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* A one-rank job: rank 0 hosts its own store on a fresh port. */
static c10d_pg *solo_group(void)
{
    char port[16];
    snprintf(port, sizeof port, "%d", mp_free_port());
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", port, 1);
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "1", 1);
    setenv("TORCHELASTIC_USE_AGENT_STORE", "False", 1);
    c10d_pg_opts po = {0};
    po.timeout_ms = 10000;
    c10d_pg *pg = NULL;
    int rc = c10d_pg_init(&po, &pg);
    if (rc != 0)
        fprintf(stderr, "init: %s\n", c10d_last_error());
    return rc == 0 ? pg : NULL;
}

/* Threads of this process: an engine started by mistake is one more. */
static int thread_count(void)
{
    DIR *d = opendir("/proc/self/task");
    if (d == NULL)
        return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

static int sum_ok(c10d_pg *pg)
{
    float x[4] = {1, 2, 3, 4};
    return c10d_all_reduce_sync(pg, x, x, 4, C10D_FLOAT32, C10D_SUM);
}

/* These fork after this process ran the engine's threads, and TSan cannot
 * start threads in such a child; under TSan this file checks the shutdown's
 * lock order (test_ops_after_shutdown). */
#if UNDER_TSAN
#define SKIP_AFTER_THREADS_UNDER_TSAN() skip()
#else
#define SKIP_AFTER_THREADS_UNDER_TSAN() ((void)0)
#endif

static void test_ops_after_shutdown(void **s)
{
    (void)s;
    c10d_pg *pg = solo_group();
    assert_non_null(pg);
    c10d_pg *sub = NULL;
    int ranks[1] = {0};
    assert_int_equal(c10d_pg_new_group(pg, ranks, 1, NULL, &sub), 0);
    assert_int_equal(sum_ok(pg), 0);
    assert_int_equal(c10d_shutdown(), 0);
    /* The joined loop thread may still be listed for a moment as it exits:
     * the count is kept once it held still for 20 ms. */
    int threads = thread_count();
    for (int still = 0, i = 0; still < 10 && i < 500; i++) {
        usleep(2000);
        int now = thread_count();
        still = now == threads ? still + 1 : 0;
        threads = now;
    }
    assert_int_equal(sum_ok(pg), C10D_EREVOKED);
    assert_non_null(strstr(c10d_last_error(), "c10d_shutdown"));
    assert_int_equal(c10d_pg_error(pg), C10D_EABORTED); /* the cause */
    assert_non_null(strstr(c10d_last_error(), "c10d_shutdown"));
    assert_int_equal(sum_ok(sub), C10D_EREVOKED);
    assert_int_equal(c10d_barrier_sync(pg), C10D_EREVOKED);
    float x = 1;
    c10d_work *w = NULL;
    assert_int_equal(c10d_broadcast(pg, &x, &x, 1, C10D_FLOAT32, 0, NULL, &w), C10D_EREVOKED);
    assert_null(w);
    assert_int_equal(c10d_pg_destroy(sub), C10D_EABORTED);
    assert_int_equal(c10d_pg_destroy(pg), C10D_EABORTED);
    /* None of it started an engine: a group that c10d_shutdown ended holds
     * nothing on a loop (its stores included). */
    assert_int_equal(thread_count(), threads);
    /* And the library starts over. */
    pg = solo_group();
    assert_non_null(pg);
    assert_int_equal(sum_ok(pg), 0);
    assert_int_equal(c10d_pg_destroy(pg), 0);
    assert_int_equal(c10d_shutdown(), 0);
}

static void test_forked_child_starts_over(void **s)
{
    (void)s;
    SKIP_AFTER_THREADS_UNDER_TSAN();
    c10d_pg *pg = solo_group();
    assert_non_null(pg);
    assert_int_equal(sum_ok(pg), 0);
    fflush(NULL);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        alarm(30);
        int code = 0;
        if (sum_ok(pg) != C10D_EREVOKED || strstr(c10d_last_error(), "fork") == NULL) {
            fprintf(stderr, "child: inherited group: %s\n", c10d_last_error());
            code = 1;
        }
        c10d_pg *mine = solo_group();
        if (mine == NULL || sum_ok(mine) != 0) {
            fprintf(stderr, "child: own group: %s\n", c10d_last_error());
            code = 2;
        }
        if (mine != NULL && c10d_pg_destroy(mine) != 0)
            code = 3;
        if (c10d_pg_destroy(pg) != C10D_EABORTED)
            code = 4;
        c10d_shutdown();
        _exit(code);
    }
    int status = 0;
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    /* The parent's group is untouched. */
    assert_int_equal(sum_ok(pg), 0);
    assert_int_equal(c10d_pg_destroy(pg), 0);
    assert_int_equal(c10d_shutdown(), 0);
}

/* ------------------------------------ store keys of destroyed groups */

#define GROUPS 200

static int churn_main(int rank, int n, void *arg)
{
    (void)arg;
    c10d_pg_opts po = {0};
    po.timeout_ms = 30000;
    c10d_pg *pg = NULL;
    MP_CHECK(c10d_pg_init(&po, &pg) == 0, "init: %s", c10d_last_error());
    int ranks[2] = {0, 1};
    for (int i = 0; i < GROUPS; i++) {
        c10d_pg *sub = NULL;
        MP_CHECK(c10d_pg_new_group(pg, ranks, n, NULL, &sub) == 0, "group %d: %s", i,
                 c10d_last_error());
        float x = (float)rank;
        MP_CHECK(c10d_all_reduce_sync(sub, &x, &x, 1, C10D_FLOAT32, C10D_SUM) == 0, "op: %s",
                 c10d_last_error());
        MP_CHECK(c10d_pg_destroy(sub) == 0, "destroy %d: %s", i, c10d_last_error());
        if (i % 4 == 0) {
            /* Splits leave nothing behind either (one color, or none). */
            MP_CHECK(c10d_pg_split(pg, i % 8 == 0 ? 0 : (rank == 0 ? 0 : C10D_SPLIT_NO_COLOR), rank,
                                   NULL, &sub) == 0,
                     "split %d: %s", i, c10d_last_error());
            MP_CHECK(c10d_pg_destroy(sub) == 0, "destroy split %d: %s", i, c10d_last_error());
        }
    }
    MP_CHECK(c10d_barrier_sync(pg) == 0, "barrier: %s", c10d_last_error());
    MP_CHECK(c10d_pg_destroy(pg) == 0, "destroy: %s", c10d_last_error());
    c10d_shutdown();
    return 0;
}

/* Two ranks that are clients of the c10d-store on `port`. */
static int two_ranks_on_store(int port, int timeout_s, mp_rank_fn fn, void *arg)
{
    struct mp_opts o = {0};
    o.nranks = 2;
    o.timeout_s = timeout_s;
    o.kill_on_failure = 1;
    o.external_store_port = port;
    struct mp_result res;
    return mp_run(&o, fn, arg, &res);
}

static void test_destroyed_groups_leave_no_keys(void **s)
{
    (void)s;
    SKIP_AFTER_THREADS_UNDER_TSAN();
    int port;
    pid_t store = mp_start_store(&port);
    if (store < 0)
        skip();
    int rc = two_ranks_on_store(port, 90, churn_main, NULL);
    int64_t keys = -1;
    c10d_store *st = NULL;
    if (c10d_store_tcp_connect("127.0.0.1", port, NULL, &st) == 0) {
        c10d_store_num_keys_sync(st, &keys);
        c10d_store_release(st);
    }
    mp_kill(store);
    c10d_shutdown();
    print_message("%lld keys left in the store after %d groups\n", (long long)keys, GROUPS);
    assert_int_equal(rc, 0);
    assert_true(keys >= 0);
    /* Rendezvous keys and at most the last group's stay; not 2-4 per group. */
    assert_true(keys < 30);
}

/* ------------------------------------------ the store dies mid-job */

static int store_gone_main(int rank, int n, void *arg)
{
    pid_t store = *(pid_t *)arg;
    c10d_pg_opts po = {0};
    po.timeout_ms = 5000;
    c10d_pg *pg = NULL;
    MP_CHECK(c10d_pg_init(&po, &pg) == 0, "init: %s", c10d_last_error());
    MP_CHECK(c10d_barrier_sync(pg) == 0, "barrier: %s", c10d_last_error());
    if (rank == 0)
        kill(store, SIGKILL);
    usleep(300000);
    int ranks[2] = {0, 1};
    c10d_pg *sub = NULL;
    int rc = c10d_pg_new_group(pg, ranks, n, NULL, &sub);
    MP_CHECK(rc != 0, "new_group succeeded without a store");
    /* The message says the store is the problem, and where it was. */
    MP_CHECK(strstr(c10d_last_error(), "store") != NULL &&
                 strstr(c10d_last_error(), "127.0.0.1:") != NULL,
             "new_group's error does not name the store: %s", c10d_last_error());
    fprintf(stderr, "rank %d: %s\n", rank, c10d_last_error());
    c10d_pg_abort(pg, "store gone");
    c10d_shutdown();
    return 0;
}

static void test_new_group_names_a_dead_store(void **s)
{
    (void)s;
    SKIP_AFTER_THREADS_UNDER_TSAN();
    int port;
    pid_t store = mp_start_store(&port);
    if (store < 0)
        skip();
    int rc = two_ranks_on_store(port, 60, store_gone_main, &store);
    mp_kill(store);
    assert_int_equal(rc, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ops_after_shutdown),
        cmocka_unit_test(test_forked_child_starts_over),
        cmocka_unit_test(test_destroyed_groups_leave_no_keys),
        cmocka_unit_test(test_new_group_names_a_dead_store),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
