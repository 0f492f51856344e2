/* c10d_store_barrier over TCP: one BARRIER request per rank when the server
 * runs it (ours, in the current dialect), ADD + WAIT in the legacy dialect,
 * both kinds of caller in one barrier, and the keys gone afterwards. The
 * server's own counters (c10d_store_server_stats_sync) show which requests
 * were sent. */
#include "c10d.h"

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

static int port;
static c10d_store_server *srv;

static c10d_store *connect_store(int dialect)
{
    c10d_store_tcp_opts o = C10D_STORE_TCP_OPTS_INIT;
    o.timeout_ms = 20000;
    o.dialect = dialect;
    c10d_store *s = NULL;
    assert_int_equal(c10d_store_tcp_connect("127.0.0.1", port, &o, &s), 0);
    return s;
}

/* How many `cmd` requests the server ran so far (0 if none). */
static long long ops_of(const char *cmd)
{
    c10d_store *s = connect_store(C10D_DIALECT_CURRENT);
    char *json = NULL;
    assert_int_equal(c10d_store_server_stats_sync(s, &json), 0);
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", cmd);
    const char *ops = strstr(json, "\"ops\"");
    assert_non_null(ops);
    const char *at = strstr(ops, pat);
    long long n = at ? atoll(at + strlen(pat)) : 0;
    free(json);
    c10d_store_release(s);
    return n;
}

static int64_t keys_left(void)
{
    c10d_store *s = connect_store(C10D_DIALECT_CURRENT);
    int64_t n = -1;
    assert_int_equal(c10d_store_num_keys_sync(s, &n), 0);
    c10d_store_release(s);
    return n;
}

struct caller {
    int dialect;
    const char *name;
    int world;
    int rc;
    int delay_ms;       /* arrives this late */
    uint64_t called_ms; /* when it called the barrier */
    uint64_t returned_ms;
};

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void *caller_main(void *p)
{
    struct caller *c = p;
    c10d_store *s = connect_store(c->dialect);
    c10d_store *ps = NULL; /* through a prefix store, as groups use it */
    assert_int_equal(c10d_store_prefix(s, "default_pg", &ps), 0);
    if (c->delay_ms > 0)
        usleep((useconds_t)c->delay_ms * 1000);
    c->called_ms = now_ms();
    c->rc = c10d_store_barrier(ps, c->name, c->world, 20000);
    c->returned_ms = now_ms();
    if (c->rc != 0)
        fprintf(stderr, "barrier: %s\n", c10d_last_error());
    c10d_store_release(ps);
    c10d_store_release(s);
    return NULL;
}

static void run_late(const int *dialects, int n, const char *name, int late, const int *delays)
{
    struct caller c[8];
    pthread_t th[8];
    for (int i = 0; i < n; i++) {
        c[i] = (struct caller){dialects[i], name, n, -1, delays != NULL ? delays[i] : 0, 0, 0};
        assert_int_equal(pthread_create(&th[i], NULL, caller_main, &c[i]), 0);
    }
    for (int i = 0; i < n; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(c[i].rc, 0);
    }
    /* Nobody got through before the last rank arrived. */
    for (int i = 0; late >= 0 && i < n; i++)
        assert_true(c[i].returned_ms >= c[late].called_ms);
}

static void run(const int *dialects, int n, const char *name)
{
    run_late(dialects, n, name, -1, NULL);
}

static void test_current_uses_barrier(void **state)
{
    (void)state;
    long long barriers = ops_of("BARRIER"), waits = ops_of("WAIT"), adds = ops_of("ADD");
    const int d[] = {C10D_DIALECT_CURRENT, C10D_DIALECT_CURRENT, C10D_DIALECT_CURRENT};
    run(d, 3, "cur");
    /* each store: one probe and one BARRIER; no WAIT; ADD only to count out */
    assert_int_equal(ops_of("BARRIER") - barriers, 6);
    assert_int_equal(ops_of("WAIT") - waits, 0);
    assert_int_equal(ops_of("ADD") - adds, 3);
    assert_int_equal(keys_left(), 0);
}

static void test_legacy_adds_and_waits(void **state)
{
    (void)state;
    long long barriers = ops_of("BARRIER");
    const int d[] = {C10D_DIALECT_LEGACY, C10D_DIALECT_LEGACY, C10D_DIALECT_LEGACY};
    run(d, 3, "legacy");
    assert_int_equal(ops_of("BARRIER") - barriers, 0);
    assert_int_equal(keys_left(), 0);
}

/* A BARRIER caller and ADD + WAIT callers meet in one barrier. */
static void test_mixed(void **state)
{
    (void)state;
    const int d[] = {C10D_DIALECT_LEGACY, C10D_DIALECT_CURRENT};
    for (int i = 0; i < 3; i++) {
        char name[16];
        snprintf(name, sizeof name, "mixed%d", i);
        run(d, 2, name);
    }
    assert_int_equal(keys_left(), 0);
}

/* A BARRIER parked on the counter is not released by another caller's ADD
 * that leaves the count short (a PyTorch rank's ADD 1, a reader's ADD 0):
 * with one rank late, every caller waits for it. */
static void test_mixed_with_a_late_rank(void **state)
{
    (void)state;
    /* The BARRIER parks first, an ADD + WAIT caller comes next, one is late. */
    const int d[] = {C10D_DIALECT_CURRENT, C10D_DIALECT_LEGACY, C10D_DIALECT_LEGACY};
    const int delays[] = {0, 150, 500};
    run_late(d, 3, "late", 2, delays);
    assert_int_equal(keys_left(), 0);
}

static int setup(void **state)
{
    (void)state;
    return c10d_store_tcp_serve("127.0.0.1", 0, &srv, &port);
}

static int teardown(void **state)
{
    (void)state;
    c10d_store_server_stop(srv);
    c10d_shutdown();
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_current_uses_barrier),
        cmocka_unit_test(test_legacy_adds_and_waits),
        cmocka_unit_test(test_mixed),
        cmocka_unit_test(test_mixed_with_a_late_rank),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
