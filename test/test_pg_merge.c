/* c10d_pg_merge_remote (docs/api.md, "Merging groups"), real processes on
 * the tcp backend: two independent 2-rank jobs (each its own default group
 * and its own store, served by its rank 0 through tcp://) merge through a
 * third store into one 4-rank group; callers asking for different sizes all
 * fail within the timeout; a merge nobody else joins times out naming how
 * many arrived. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "c10d.h"
#include "mp_harness.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MERGE_TIMEOUT_MS 20000

struct ports {
    int job[2];
    int merge;
    int sizes[2]; /* the size each job asks for */
};

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Rank `local` of a 2-rank job of its own, whose store its rank 0 serves. */
static c10d_pg *job_init(int port, int local)
{
    unsetenv("RANK");
    unsetenv("WORLD_SIZE");
    char url[96];
    snprintf(url, sizeof url, "tcp://127.0.0.1:%d?rank=%d&world_size=2", port, local);
    c10d_pg_opts po = C10D_PG_OPTS_INIT;
    po.init_method = url;
    po.timeout_ms = 30000;
    c10d_pg *pg = NULL;
    if (c10d_pg_init(&po, &pg) != 0) {
        fprintf(stderr, "job init: %s\n", c10d_last_error());
        _exit(3);
    }
    return pg;
}

/* The merge store: served in the process of harness rank 0. */
static c10d_store *merge_store(int port, int host, c10d_store_server **srv)
{
    *srv = NULL;
    if (host && c10d_store_tcp_serve("127.0.0.1", port, srv, NULL) != 0) {
        fprintf(stderr, "serve: %s\n", c10d_last_error());
        _exit(4);
    }
    c10d_store_tcp_opts so = C10D_STORE_TCP_OPTS_INIT;
    so.timeout_ms = 30000;
    c10d_store *st = NULL;
    if (c10d_store_tcp_connect("127.0.0.1", port, &so, &st) != 0) {
        fprintf(stderr, "connect: %s\n", c10d_last_error());
        _exit(5);
    }
    return st;
}

/* Everyone is done with the merge store before its host stops serving it. */
static int leave_store(c10d_store *st, c10d_store_server *srv, int n)
{
    int64_t done = 0;
    MP_CHECK(c10d_store_add_sync(st, "test/done", 1, &done) == 0, "done: %s", c10d_last_error());
    uint64_t t0 = now_ms();
    while (srv != NULL && done < n && now_ms() - t0 < 20000) {
        usleep(20000);
        MP_CHECK(c10d_store_add_sync(st, "test/done", 0, &done) == 0, "done: %s",
                 c10d_last_error());
    }
    c10d_store_release(st);
    if (srv != NULL)
        c10d_store_server_stop(srv);
    return 0;
}

static int sum_of(c10d_pg *g, int32_t v, int32_t *out)
{
    MP_CHECK(c10d_all_reduce_sync(g, &v, out, 1, C10D_INT32, C10D_SUM) == 0, "all_reduce: %s",
             c10d_last_error());
    return 0;
}

/* --------------------------------------------- two jobs merge into one */

static int merge_main(int rank, int n, void *arg)
{
    const struct ports *p = arg;
    int job = rank / 2, local = rank % 2;
    c10d_pg *world = job_init(p->job[job], local);
    int32_t s = 0;
    MP_CHECK(sum_of(world, local + 1, &s) == 0 && s == 3, "job %d alone: %d", job, s);
    c10d_store_server *srv;
    c10d_store *st = merge_store(p->merge, rank == 0, &srv);
    c10d_pg_opts mo = C10D_PG_OPTS_INIT;
    mo.timeout_ms = MERGE_TIMEOUT_MS;
    if (job == 0)
        mo.group_name = "merged";
    c10d_pg *m = NULL;
    MP_CHECK(c10d_pg_merge_remote(world, st, n, &mo, &m) == 0, "merge: %s", c10d_last_error());
    int me = c10d_pg_rank(m);
    MP_CHECK(c10d_pg_size(m) == n && me >= 0 && me < n, "rank %d size %d", me, c10d_pg_size(m));
    /* Each process's own bit: 15 only if all four processes took part. */
    MP_CHECK(sum_of(m, 1 << (2 * job + local), &s) == 0 && s == 15, "processes: %d", s);
    /* Each merged rank's bit: the ranks are 0..3, once each. */
    MP_CHECK(sum_of(m, 1 << me, &s) == 0 && s == 15, "merged ranks: %d", s);
    MP_CHECK(c10d_pg_global_rank(m, me) == me, "global rank %d", c10d_pg_global_rank(m, me));
    /* torch's names: the given one, else "<parent name>:merge". */
    const char *want = job == 0 ? "merged" : "0:merge";
    MP_CHECK(strcmp(c10d_pg_name(m), want) == 0, "name %s", c10d_pg_name(m));
    MP_CHECK(strstr(c10d_pg_desc(m), ":merge") != NULL, "desc %s", c10d_pg_desc(m));
    /* The original group is left as it was. */
    MP_CHECK(c10d_pg_rank(world) == local && c10d_pg_size(world) == 2, "job group changed");
    MP_CHECK(sum_of(world, local + 1, &s) == 0 && s == 3, "job %d after: %d", job, s);
    /* new_group counts groups world-wide: the merged callers share no world. */
    c10d_pg *sub = NULL;
    int rc = c10d_pg_new_group(m, NULL, 0, NULL, &sub);
    MP_CHECK(rc == C10D_EUNSUPPORTED, "new_group of a merged group: %s", c10d_status_name(rc));
    MP_CHECK(c10d_barrier_sync(m) == 0, "barrier: %s", c10d_last_error());
    MP_CHECK(c10d_pg_destroy(m) == 0, "destroy merged: %s", c10d_last_error());
    MP_CHECK(leave_store(st, srv, n) == 0, "leave");
    MP_CHECK(c10d_pg_destroy(world) == 0, "destroy job group: %s", c10d_last_error());
    c10d_shutdown();
    return 0;
}

static void run4(mp_rank_fn fn, struct ports *p)
{
    p->job[0] = mp_free_port();
    p->job[1] = mp_free_port();
    p->merge = mp_free_port();
    struct mp_opts o = {0};
    o.nranks = 4;
    o.timeout_s = 60;
    o.kill_on_failure = 1;
    struct mp_result res;
    mp_run(&o, fn, p, &res);
    assert_false(res.timed_out);
    for (int r = 0; r < 4; r++)
        assert_int_equal(res.codes[r], 0);
}

static void test_merge_two_jobs(void **state)
{
    (void)state;
    struct ports p = {.sizes = {4, 4}};
    run4(merge_main, &p);
}

/* ------------------------------------------- callers disagree on the size */

static int mismatch_main(int rank, int n, void *arg)
{
    (void)n;
    const struct ports *p = arg;
    int job = rank / 2, local = rank % 2;
    c10d_pg *world = job_init(p->job[job], local);
    c10d_store_server *srv;
    c10d_store *st = merge_store(p->merge, rank == 0, &srv);
    c10d_pg_opts mo = C10D_PG_OPTS_INIT;
    mo.timeout_ms = MERGE_TIMEOUT_MS;
    c10d_pg *m = NULL;
    uint64_t t0 = now_ms();
    int rc = c10d_pg_merge_remote(world, st, p->sizes[job], &mo, &m);
    uint64_t took = now_ms() - t0;
    MP_CHECK(rc == C10D_EINVAL && m == NULL, "merge: %s: %s", c10d_status_name(rc),
             c10d_last_error());
    const char *e = c10d_last_error();
    MP_CHECK(strstr(e, "size mismatch") != NULL || strstr(e, "more callers") != NULL, "error: %s",
             e);
    MP_CHECK(took < MERGE_TIMEOUT_MS / 2, "failed after %llu ms", (unsigned long long)took);
    /* The job's own group is untouched. */
    int32_t s = 0;
    MP_CHECK(sum_of(world, local + 1, &s) == 0 && s == 3, "job %d after: %d", job, s);
    MP_CHECK(leave_store(st, srv, 4) == 0, "leave");
    MP_CHECK(c10d_pg_destroy(world) == 0, "destroy: %s", c10d_last_error());
    c10d_shutdown();
    return 0;
}

static void test_merge_size_mismatch(void **state)
{
    (void)state;
    struct ports p = {.sizes = {4, 3}};
    run4(mismatch_main, &p);
    p.sizes[0] = 4;
    p.sizes[1] = 5;
    run4(mismatch_main, &p);
}

/* ---------------------------------- nobody else comes: a bounded timeout */

static int alone_main(int rank, int n, void *arg)
{
    (void)n;
    const struct ports *p = arg;
    c10d_pg *world = job_init(p->job[0], rank);
    c10d_store_server *srv;
    c10d_store *st = merge_store(p->merge, rank == 0, &srv);
    c10d_pg_opts mo = C10D_PG_OPTS_INIT;
    c10d_pg *m = NULL;
    /* Arguments first: refused at once, nothing taken from the store. */
    MP_CHECK(c10d_pg_merge_remote(world, st, 0, &mo, &m) == C10D_EINVAL, "size 0");
    MP_CHECK(c10d_pg_merge_remote(world, NULL, 4, &mo, &m) == C10D_EINVAL, "no store");
    mo.backend = "tcp";
    MP_CHECK(c10d_pg_merge_remote(world, st, 4, &mo, &m) == C10D_EINVAL, "backend in opts");
    mo.backend = NULL;
    mo.timeout_ms = 1500;
    uint64_t t0 = now_ms();
    int rc = c10d_pg_merge_remote(world, st, 4, &mo, &m);
    uint64_t took = now_ms() - t0;
    MP_CHECK(rc == C10D_ETIMEDOUT && m == NULL, "merge: %s: %s", c10d_status_name(rc),
             c10d_last_error());
    MP_CHECK(strstr(c10d_last_error(), "only 2 of 4 ranks arrived") != NULL, "error: %s",
             c10d_last_error());
    MP_CHECK(took >= 1400 && took < 6000, "timed out after %llu ms", (unsigned long long)took);
    MP_CHECK(leave_store(st, srv, 2) == 0, "leave");
    MP_CHECK(c10d_pg_destroy(world) == 0, "destroy: %s", c10d_last_error());
    c10d_shutdown();
    return 0;
}

static void test_merge_timeout(void **state)
{
    (void)state;
    struct ports p = {0};
    p.job[0] = mp_free_port();
    p.merge = mp_free_port();
    struct mp_opts o = {0};
    o.nranks = 2;
    o.timeout_s = 60;
    o.kill_on_failure = 1;
    struct mp_result res;
    mp_run(&o, alone_main, &p, &res);
    assert_false(res.timed_out);
    assert_int_equal(res.codes[0], 0);
    assert_int_equal(res.codes[1], 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_merge_two_jobs),
        cmocka_unit_test(test_merge_size_mismatch),
        cmocka_unit_test(test_merge_timeout),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
