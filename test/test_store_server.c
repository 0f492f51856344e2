/* The store's table semantics, then the server over real loopback sockets
 * (both dialects, IPv4 and IPv6) with a minimal blocking client. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "store_test_util.h"
#include "store_server/table/table.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>

/* ------------------------------------------------------------------ table */

static int woken[8];
static int events[16], nevents;

static void t_wake(struct c10d__store_client *c)
{
    woken[(intptr_t)c->data]++;
}

static void t_watch(struct c10d__store_client *c, int event, struct c10d__wire_str key,
                    struct c10d__wire_str old_value, struct c10d__wire_str new_value)
{
    (void)c, (void)key, (void)old_value, (void)new_value;
    if (nevents < 16)
        events[nevents++] = event;
}

static struct c10d__store_table *new_table(size_t max_memory)
{
    struct c10d__store_table_cbs cbs = {.wake = t_wake, .watch = t_watch};
    struct c10d__store_table *t;
    assert_int_equal(c10d__store_table_create(&cbs, max_memory, &t), 0);
    memset(woken, 0, sizeof woken);
    nevents = 0;
    return t;
}

static void assert_value(struct c10d__store_table *t, const char *key, const char *want)
{
    struct c10d__wire_str v;
    struct c10d__wire_str k = {(const uint8_t *)key, strlen(key)};
    assert_int_equal(c10d__store_table_get(t, k, &v), want != NULL);
    if (want) {
        assert_int_equal(v.len, strlen(want));
        assert_memory_equal(v.data, want, v.len);
    }
}

static void test_table_values(void **state)
{
    (void)state;
    struct c10d__store_table *t = new_table(0);
    assert_int_equal(c10d__store_table_set(t, STR("/a"), STR("x")), 0);
    assert_value(t, "/a", "x");
    assert_value(t, "/b", NULL);
    int64_t v;
    assert_int_equal(c10d__store_table_add(t, STR("/n"), 3, &v), 0);
    assert_int_equal(v, 3);
    assert_int_equal(c10d__store_table_add(t, STR("/n"), -10, &v), 0);
    assert_int_equal(v, -7);
    assert_value(t, "/n", "-7"); /* decimal text */
    assert_int_equal(c10d__store_table_add(t, STR("/a"), 1, &v), C10D_EINVAL);
    assert_value(t, "/a", "x"); /* unchanged */
    assert_int_equal(c10d__store_table_set(t, STR("/big"), STR("9223372036854775807")), 0);
    assert_int_equal(c10d__store_table_add(t, STR("/big"), 1, &v), C10D_EINVAL);
    /* ADD keeps the counter it wrote: whatever replaces the value (SET,
     * APPEND, DELETE) must be what the next ADD reads. */
    assert_int_equal(c10d__store_table_add(t, STR("/c"), INT64_MIN, &v), 0);
    assert_value(t, "/c", "-9223372036854775808");
    assert_int_equal(c10d__store_table_add(t, STR("/c"), -1, &v), C10D_EINVAL);
    assert_int_equal(c10d__store_table_add(t, STR("/c"), INT64_MAX, &v), 0);
    assert_value(t, "/c", "-1");
    assert_int_equal(c10d__store_table_add(t, STR("/c"), 1, &v), 0);
    assert_value(t, "/c", "0");
    assert_int_equal(c10d__store_table_add(t, STR("/c"), INT64_MAX, &v), 0);
    assert_value(t, "/c", "9223372036854775807");
    assert_int_equal(c10d__store_table_set(t, STR("/c"), STR(" 40x")), 0);
    assert_int_equal(c10d__store_table_add(t, STR("/c"), 2, &v), 0);
    assert_int_equal(v, 42);
    assert_int_equal(c10d__store_table_append(t, STR("/c"), STR("0")), 0);
    assert_int_equal(c10d__store_table_add(t, STR("/c"), 1, &v), 0);
    assert_int_equal(v, 421);
    assert_int_equal(c10d__store_table_delete(t, STR("/c")), 1);
    assert_int_equal(c10d__store_table_add(t, STR("/c"), 5, &v), 0);
    assert_int_equal(v, 5);
    assert_int_equal(c10d__store_table_delete(t, STR("/c")), 1);
    /* Every digit count and sign, written in place and fresh, as printf does. */
    for (int64_t p = 1; p > 0 && p <= INT64_MAX / 10; p *= 10) {
        const int64_t vals[] = {p - 1, p, p + 1, 9 * p + (p - 1), -p, -(p + 1), -(9 * p + p - 1)};
        for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++) {
            char want[32];
            snprintf(want, sizeof want, "%" PRId64, vals[i]);
            int64_t cur = 0, got;
            struct c10d__wire_str sv;
            if (c10d__store_table_get(t, STR("/d"), &sv))
                assert_int_equal(c10d__wire_parse_i64(sv.data, sv.len, &cur), 0);
            assert_int_equal(c10d__store_table_add(t, STR("/d"), vals[i] - cur, &got), 0);
            assert_int_equal(got, vals[i]);
            assert_value(t, "/d", want);
        }
    }
    assert_int_equal(c10d__store_table_delete(t, STR("/d")), 1);
    assert_int_equal(c10d__store_table_append(t, STR("/a"), STR("yz")), 0);
    assert_int_equal(c10d__store_table_append(t, STR("/new"), STR("1")), 0);
    for (int i = 0; i < 100; i++)
        assert_int_equal(c10d__store_table_append(t, STR("/new"), STR("2")), 0);
    assert_value(t, "/a", "xyz");
    struct c10d__wire_str nv;
    c10d__store_table_get(t, STR("/new"), &nv);
    assert_int_equal(nv.len, 101);
    assert_int_equal(c10d__store_table_num_keys(t), 4);
    assert_int_equal(c10d__store_table_delete(t, STR("/a")), 1);
    assert_int_equal(c10d__store_table_delete(t, STR("/a")), 0);
    assert_int_equal(c10d__store_table_num_keys(t), 3);
    /* Empty key and empty value are ordinary. */
    assert_int_equal(c10d__store_table_set(t, STR(""), STR("")), 0);
    assert_value(t, "", "");
    c10d__store_table_free(t);
}

static void test_table_compare_set(void **state)
{
    (void)state;
    struct c10d__store_table *t = new_table(0);
    struct c10d__wire_str r;
    /* missing, empty expected: store desired, reply desired */
    assert_int_equal(c10d__store_table_compare_set(t, STR("/k"), STR(""), STR("d1"), &r), 0);
    assert_int_equal(r.len, 2);
    assert_memory_equal(r.data, "d1", 2);
    assert_value(t, "/k", "d1");
    /* missing, non-empty expected: reply expected, store nothing */
    assert_int_equal(c10d__store_table_compare_set(t, STR("/m"), STR("e"), STR("d"), &r), 0);
    assert_memory_equal(r.data, "e", 1);
    assert_value(t, "/m", NULL);
    /* present and equal: store desired */
    assert_int_equal(c10d__store_table_compare_set(t, STR("/k"), STR("d1"), STR("d2"), &r), 0);
    assert_memory_equal(r.data, "d2", 2);
    assert_value(t, "/k", "d2");
    /* present, different: reply current */
    assert_int_equal(c10d__store_table_compare_set(t, STR("/k"), STR("zz"), STR("d3"), &r), 0);
    assert_memory_equal(r.data, "d2", 2);
    assert_value(t, "/k", "d2");
    c10d__store_table_free(t);
}

static void test_table_waits(void **state)
{
    (void)state;
    struct c10d__store_table *t = new_table(0);
    struct c10d__store_client c[4];
    memset(c, 0, sizeof c);
    for (int i = 0; i < 4; i++)
        c[i].data = (void *)(intptr_t)i;
    struct c10d__wire_str ab[] = {STR("/a"), STR("/b")};
    assert_int_equal(c10d__store_table_check(t, ab, 2), 0);
    assert_int_equal(c10d__store_table_wait(t, &c[0], ab, 2), 0);
    assert_non_null(c[0].wait);
    struct c10d__wire_str aa[] = {STR("/a"), STR("/a")};
    assert_int_equal(c10d__store_table_wait(t, &c[1], aa, 2), 0);
    assert_int_equal(c10d__store_table_set(t, STR("/a"), STR("1")), 0);
    assert_int_equal(woken[0], 0); /* still needs /b */
    assert_int_equal(woken[1], 1); /* duplicate key counted twice, fired once */
    assert_null(c[1].wait);
    /* DELETE wakes nobody */
    assert_int_equal(c10d__store_table_wait(t, &c[2], &ab[1], 1), 0);
    c10d__store_table_delete(t, STR("/b"));
    assert_int_equal(woken[2], 0);
    assert_int_equal(c10d__store_table_add(t, STR("/b"), 1, &(int64_t){0}), 0);
    assert_int_equal(woken[0], 1);
    assert_int_equal(woken[2], 1);
    /* All present: answer at once, nothing registered. */
    assert_int_equal(c10d__store_table_wait(t, &c[3], ab, 2), 1);
    assert_null(c[3].wait);
    assert_int_equal(c10d__store_table_wait(t, &c[3], ab, 0), 1);
    /* cancel */
    assert_int_equal(c10d__store_table_wait(t, &c[3], &STR("/never"), 1), 0);
    assert_int_equal(c10d__store_table_cancel_wait(t, &c[3]), 1);
    assert_int_equal(c10d__store_table_cancel_wait(t, &c[3]), 0);
    assert_int_equal(c10d__store_table_set(t, STR("/never"), STR("")), 0);
    assert_int_equal(woken[3], 0);
    struct c10d__store_table_stats st;
    c10d__store_table_get_stats(t, &st);
    assert_int_equal(st.waiters, 0);
    for (int i = 0; i < 4; i++)
        c10d__store_table_client_gone(t, &c[i]);
    c10d__store_table_free(t);
}

/* A QUEUE_PUSH wakes one waiter, which owes the queue a pop: if it asks for
 * something else first (its CANCEL_WAIT raced the wake) or leaves, the wake
 * passes to the next waiter while items remain; a pop settles it. Before,
 * the other waiters slept beside a non-empty queue until the next push. */
static void test_table_queue_wake_passes_on(void **state)
{
    (void)state;
    struct c10d__store_table *t = new_table(0);
    struct c10d__store_client c[4];
    memset(c, 0, sizeof c);
    for (int i = 0; i < 4; i++)
        c[i].data = (void *)(intptr_t)i;
    struct c10d__wire_str none = {NULL, 0};
    for (int i = 0; i < 3; i++)
        assert_int_equal(c10d__store_table_wait(t, &c[i], &STR("/q"), 1), 0);
    assert_int_equal(c10d__store_table_queue_push(t, STR("/q"), STR("one")), 0);
    assert_int_equal(woken[0] + woken[1] + woken[2], 1);
    assert_int_equal(woken[0], 1);
    /* Client 0 gave up: its next request is the CANCEL_WAIT. */
    c10d__store_table_client_request(t, &c[0], C10D_STORE_CANCEL_WAIT, none);
    assert_int_equal(woken[1], 1);
    assert_int_equal(woken[2], 0);
    /* Client 1 pops: the wake is used; client 2 sleeps on (the queue is empty). */
    c10d__store_table_client_request(t, &c[1], C10D_STORE_QUEUE_POP, STR("/q"));
    int64_t n;
    struct c10d__wire_str v;
    assert_int_equal(c10d__store_table_queue_pop(t, STR("/q"), &n, &v), 0);
    assert_int_equal(n, 1);
    assert_int_equal(woken[2], 0);
    /* A woken client that leaves passes the wake on too. */
    assert_int_equal(c10d__store_table_wait(t, &c[3], &STR("/q"), 1), 0);
    assert_int_equal(c10d__store_table_queue_push(t, STR("/q"), STR("two")), 0);
    assert_int_equal(woken[2], 1);
    c10d__store_table_client_gone(t, &c[2]);
    assert_int_equal(woken[3], 1);
    /* A pop of another key does not settle it: the wake passes on (nobody is
     * left) and the entry is freed once the queue is empty. */
    c10d__store_table_client_request(t, &c[3], C10D_STORE_QUEUE_POP, STR("/other"));
    c10d__store_table_client_request(t, &c[0], C10D_STORE_QUEUE_POP, STR("/q"));
    assert_int_equal(c10d__store_table_queue_pop(t, STR("/q"), &n, &v), 0);
    assert_int_equal(n, 1);
    struct c10d__store_table_stats st;
    c10d__store_table_get_stats(t, &st);
    assert_int_equal(st.waiters, 0);
    for (int i = 0; i < 4; i++)
        c10d__store_table_client_gone(t, &c[i]);
    c10d__store_table_free(t);
}

static void test_table_queues_barrier(void **state)
{
    (void)state;
    struct c10d__store_table *t = new_table(0);
    struct c10d__store_client c[4];
    memset(c, 0, sizeof c);
    for (int i = 0; i < 4; i++)
        c[i].data = (void *)(intptr_t)i;
    assert_int_equal(c10d__store_table_queue_len(t, STR("/q")), 0);
    assert_int_equal(c10d__store_table_wait(t, &c[0], &STR("/q"), 1), 0);
    assert_int_equal(c10d__store_table_wait(t, &c[1], &STR("/q"), 1), 0);
    assert_int_equal(c10d__store_table_queue_push(t, STR("/q"), STR("one")), 0);
    assert_int_equal(woken[0] + woken[1], 1); /* only the first waiter */
    assert_int_equal(woken[0], 1);
    assert_int_equal(c10d__store_table_check(t, &STR("/q"), 1), 1); /* queue counts */
    assert_int_equal(c10d__store_table_num_keys(t), 0);             /* but is no key */
    assert_int_equal(c10d__store_table_queue_push(t, STR("/q"), STR("two")), 0);
    assert_int_equal(woken[1], 1);
    int64_t n;
    struct c10d__wire_str v;
    assert_int_equal(c10d__store_table_queue_pop(t, STR("/q"), &n, &v), 0);
    assert_int_equal(n, 2);
    assert_memory_equal(v.data, "one", 3);
    assert_int_equal(c10d__store_table_queue_len(t, STR("/q")), 1);
    c10d__store_table_queue_pop(t, STR("/q"), &n, &v);
    c10d__store_table_queue_pop(t, STR("/q"), &n, &v);
    assert_int_equal(n, 0);
    /* BARRIER of 3: two wait, the third releases all. */
    memset(woken, 0, sizeof woken);
    assert_int_equal(c10d__store_table_barrier(t, &c[0], STR("/bar"), 3), 0);
    assert_int_equal(c10d__store_table_barrier(t, &c[1], STR("/bar"), 3), 0);
    assert_int_equal(woken[0] + woken[1], 0);
    assert_value(t, "/bar", "2");
    assert_int_equal(c10d__store_table_barrier(t, &c[2], STR("/bar"), 3), 1);
    assert_int_equal(woken[0], 1);
    assert_int_equal(woken[1], 1);
    assert_value(t, "/bar", "3");
    assert_int_equal(c10d__store_table_set(t, STR("/txt"), STR("abc")), 0);
    assert_int_equal(c10d__store_table_barrier(t, &c[3], STR("/txt"), 3), C10D_EINVAL);
    for (int i = 0; i < 4; i++)
        c10d__store_table_client_gone(t, &c[i]);
    c10d__store_table_free(t);
}

/* DELETE_KEY removes a queue of that name, its items and their memory, so
 * that CHECK no longer counts the key as present. */
static void test_table_delete_queue(void **state)
{
    (void)state;
    struct c10d__store_table *t = new_table(0);
    struct c10d__store_table_stats st0, st;
    c10d__store_table_get_stats(t, &st0);
    assert_int_equal(c10d__store_table_queue_push(t, STR("/q"), STR("one")), 0);
    assert_int_equal(c10d__store_table_queue_push(t, STR("/q"), STR("two")), 0);
    assert_int_equal(c10d__store_table_delete(t, STR("/q")), 1);
    assert_int_equal(c10d__store_table_queue_len(t, STR("/q")), 0);
    assert_int_equal(c10d__store_table_check(t, &STR("/q"), 1), 0);
    c10d__store_table_get_stats(t, &st);
    assert_int_equal(st.queues, 0);
    assert_int_equal(st.queue_items, 0);
    assert_int_equal(st.value_bytes, st0.value_bytes);
    assert_int_equal(st.memory, st0.memory);
    assert_int_equal(c10d__store_table_delete(t, STR("/q")), 0);
    /* A key with both: one DELETE removes both, and a watcher sees DELETED. */
    struct c10d__store_client w = {0};
    assert_int_equal(c10d__store_table_set(t, STR("/both"), STR("v")), 0);
    assert_int_equal(c10d__store_table_queue_push(t, STR("/both"), STR("item")), 0);
    assert_int_equal(c10d__store_table_watch(t, &w, STR("/both")), 0);
    nevents = 0;
    assert_int_equal(c10d__store_table_delete(t, STR("/both")), 1);
    assert_int_equal(nevents, 1);
    assert_int_equal(events[0], C10D_STORE_KEY_DELETED);
    assert_int_equal(c10d__store_table_queue_len(t, STR("/both")), 0);
    assert_int_equal(c10d__store_table_num_keys(t), 0);
    c10d__store_table_client_gone(t, &w);
    c10d__store_table_free(t);
}

static void test_table_watch_and_memory(void **state)
{
    (void)state;
    struct c10d__store_table *t = new_table(0);
    struct c10d__store_client w = {0};
    assert_int_equal(c10d__store_table_watch(t, &w, STR("/w")), 0);
    c10d__store_table_set(t, STR("/w"), STR("1"));
    c10d__store_table_set(t, STR("/w"), STR("2"));
    c10d__store_table_delete(t, STR("/w"));
    int64_t v;
    c10d__store_table_add(t, STR("/w"), 5, &v);
    assert_int_equal(nevents, 4);
    assert_int_equal(events[0], C10D_STORE_KEY_CREATED);
    assert_int_equal(events[1], C10D_STORE_KEY_UPDATED);
    assert_int_equal(events[2], C10D_STORE_KEY_DELETED);
    assert_int_equal(events[3], C10D_STORE_KEY_CREATED);
    c10d__store_table_client_gone(t, &w);
    c10d__store_table_set(t, STR("/w"), STR("3"));
    assert_int_equal(nevents, 4);
    c10d__store_table_free(t);

    /* The memory budget: a value that does not fit fails and changes nothing. */
    t = new_table(64 * 1024);
    static uint8_t big[40000];
    struct c10d__wire_str bs = {big, sizeof big};
    assert_int_equal(c10d__store_table_set(t, STR("/1"), bs), 0);
    assert_int_equal(c10d__store_table_set(t, STR("/2"), bs), C10D_ENOMEM);
    assert_int_equal(c10d__store_table_queue_push(t, STR("/2"), bs), C10D_ENOMEM);
    assert_int_equal(c10d__store_table_num_keys(t), 1);
    assert_int_equal(c10d__store_table_delete(t, STR("/1")), 1);
    assert_int_equal(c10d__store_table_set(t, STR("/2"), bs), 0);
    c10d__store_table_free(t);
}

/* ----------------------------------------------------------------- server */

static struct store_ts ts;
static int port;

static int start_server(void **state)
{
    (void)state;
    struct c10d__store_server_opts o = {.port = 0, .world_size = 2};
    port = store_ts_start(&ts, &o);
    return port > 0 ? 0 : -1;
}

static int stop_server(void **state)
{
    (void)state;
    store_ts_stop(&ts);
    return 0;
}

static void expect_str(const struct c10d__wire_reply *r, size_t i, const char *want)
{
    assert_true(i < r->nvals);
    assert_int_equal(r->vals[i].len, strlen(want));
    assert_memory_equal(r->vals[i].data, want, r->vals[i].len);
}

static void test_server_current(void **state)
{
    (void)state;
    struct store_tc c;
    struct c10d__wire_reply r;
    assert_int_equal(store_tc_open(&c, port, AF_INET, C10D_STORE_DIALECT_CURRENT), 0);
    assert_int_equal(store_tc_call(&c, C10D_STORE_PING, 1234, 0, 0, NULL, &r), 0);
    assert_int_equal(r.u32, 1234);
    struct c10d__wire_str kv[] = {STR("/cur/a"), STR("va")};
    assert_int_equal(store_tc_call(&c, C10D_STORE_SET, 0, 0, 2, kv, &r), 0);
    assert_int_equal(store_tc_call(&c, C10D_STORE_GET, 0, 0, 1, kv, &r), 0);
    expect_str(&r, 0, "va");
    assert_int_equal(store_tc_call(&c, C10D_STORE_ADD, 0, 5, 1, &STR("/cur/n"), &r), 0);
    assert_int_equal(r.i64, 5);
    assert_int_equal(store_tc_call(&c, C10D_STORE_GET, 0, 0, 1, &STR("/cur/n"), &r), 0);
    expect_str(&r, 0, "5");
    struct c10d__wire_str cas[] = {STR("/cur/a"), STR("va"), STR("vb")};
    assert_int_equal(store_tc_call(&c, C10D_STORE_COMPARE_SET, 0, 0, 3, cas, &r), 0);
    expect_str(&r, 0, "vb");
    struct c10d__wire_str chk[] = {STR("/cur/a"), STR("/cur/none")};
    assert_int_equal(store_tc_call(&c, C10D_STORE_CHECK, 0, 0, 2, chk, &r), 0);
    assert_int_equal(r.u8, C10D_STORE_NOT_READY);
    assert_int_equal(store_tc_call(&c, C10D_STORE_CHECK, 0, 0, 1, chk, &r), 0);
    assert_int_equal(r.u8, C10D_STORE_READY);
    assert_int_equal(store_tc_call(&c, C10D_STORE_WAIT, 0, 0, 1, chk, &r), 0);
    assert_int_equal(r.u8, C10D_STORE_STOP_WAITING);
    struct c10d__wire_str ms[] = {STR("/cur/m1"), STR("1"), STR("/cur/m2"), STR("22")};
    assert_int_equal(store_tc_call(&c, C10D_STORE_MULTI_SET, 0, 0, 4, ms, &r), 0);
    struct c10d__wire_str mg[] = {STR("/cur/m1"), STR("/cur/m2"), STR("/cur/none")};
    assert_int_equal(store_tc_call(&c, C10D_STORE_MULTI_GET, 0, 0, 3, mg, &r), 0);
    expect_str(&r, 0, "1");
    expect_str(&r, 1, "22");
    expect_str(&r, 2, "");
    struct c10d__wire_str ap[] = {STR("/cur/m1"), STR("+")};
    assert_int_equal(store_tc_call(&c, C10D_STORE_APPEND, 0, 0, 2, ap, &r), 0);
    assert_int_equal(store_tc_call(&c, C10D_STORE_GET, 0, 0, 1, ap, &r), 0);
    expect_str(&r, 0, "1+");
    struct c10d__wire_str qp[] = {STR("/cur/q"), STR("item")};
    assert_int_equal(store_tc_call(&c, C10D_STORE_QUEUE_PUSH, 0, 0, 2, qp, &r), 0);
    assert_int_equal(store_tc_call(&c, C10D_STORE_QUEUE_LEN, 0, 0, 1, qp, &r), 0);
    assert_int_equal(r.i64, 1);
    assert_int_equal(store_tc_call(&c, C10D_STORE_QUEUE_POP, 0, 0, 1, qp, &r), 0);
    assert_int_equal(r.i64, 1);
    expect_str(&r, 0, "item");
    assert_int_equal(store_tc_call(&c, C10D_STORE_QUEUE_POP, 0, 0, 1, qp, &r), 0);
    assert_int_equal(r.i64, 0);
    assert_int_equal(r.nvals, 0);
    assert_int_equal(store_tc_call(&c, C10D_STORE_GETNUMKEYS, 0, 0, 0, NULL, &r), 0);
    int64_t nkeys = r.i64;
    assert_true(nkeys >= 4);
    assert_int_equal(store_tc_call(&c, C10D_STORE_LIST_KEYS, 0, 0, 0, NULL, &r), 0);
    assert_int_equal(r.i64, nkeys);
    assert_int_equal(r.nvals, (size_t)nkeys);
    assert_int_equal(store_tc_call(&c, C10D_STORE_DELETE_KEY, 0, 0, 1, ap, &r), 0);
    assert_int_equal(r.i64, 1);
    assert_int_equal(store_tc_call(&c, C10D_STORE_DELETE_KEY, 0, 0, 1, ap, &r), 0);
    assert_int_equal(r.i64, 0);
    /* GET of a missing key: an empty value, the connection stays. */
    assert_int_equal(store_tc_call(&c, C10D_STORE_GET, 0, 0, 1, ap, &r), 0);
    expect_str(&r, 0, "");
    assert_int_equal(store_tc_call(&c, C10D_STORE_PING, 9, 0, 0, NULL, &r), 0);
    assert_int_equal(r.u32, 9);
    store_tc_close(&c);
}

static void test_server_wait_and_cancel(void **state)
{
    (void)state;
    struct store_tc a, b;
    struct c10d__wire_reply r;
    assert_int_equal(store_tc_open(&a, port, AF_INET6, C10D_STORE_DIALECT_CURRENT), 0);
    assert_int_equal(store_tc_open(&b, port, AF_INET, C10D_STORE_DIALECT_CURRENT), 0);
    /* A pending WAIT fires when the last missing key appears. */
    struct c10d__wire_str keys[] = {STR("/w/1"), STR("/w/2")};
    assert_int_equal(store_tc_req(a.fd, a.dialect, C10D_STORE_WAIT, 0, 0, 2, keys), 0);
    assert_int_equal(store_tc_call(&b, C10D_STORE_SET, 0, 0, 2,
                                   (struct c10d__wire_str[]){STR("/w/1"), STR("x")}, &r),
                     0);
    assert_int_equal(store_tc_call(&b, C10D_STORE_PING, 1, 0, 0, NULL, &r), 0); /* ordered */
    assert_int_equal(store_tc_call(&b, C10D_STORE_SET, 0, 0, 2,
                                   (struct c10d__wire_str[]){STR("/w/2"), STR("y")}, &r),
                     0);
    assert_int_equal(store_tc_recv(&a, C10D_STORE_WAIT, 0, 0, &r), 0);
    assert_int_equal(r.u8, C10D_STORE_STOP_WAITING);
    /* CANCEL_WAIT drops a pending wait and answers WAIT_CANCELED. */
    assert_int_equal(store_tc_req(a.fd, a.dialect, C10D_STORE_WAIT, 0, 0, 1, &STR("/w/never")), 0);
    assert_int_equal(store_tc_call(&a, C10D_STORE_CANCEL_WAIT, 0, 0, 0, NULL, &r), 0);
    assert_int_equal(r.u8, C10D_STORE_WAIT_CANCELED);
    /* A new request while a WAIT is pending: the wait is dropped, so setting
     * the key later must not put a stray byte in front of a later reply. */
    assert_int_equal(store_tc_req(a.fd, a.dialect, C10D_STORE_WAIT, 0, 0, 1, &STR("/w/late")), 0);
    assert_int_equal(store_tc_call(&a, C10D_STORE_PING, 77, 0, 0, NULL, &r), 0);
    assert_int_equal(r.u32, 77);
    assert_int_equal(store_tc_call(&b, C10D_STORE_SET, 0, 0, 2,
                                   (struct c10d__wire_str[]){STR("/w/late"), STR("z")}, &r),
                     0);
    assert_int_equal(store_tc_call(&a, C10D_STORE_PING, 78, 0, 0, NULL, &r), 0);
    assert_int_equal(r.u32, 78);
    assert_int_equal(store_tc_call(&a, C10D_STORE_ADD, 0, 1, 1, &STR("/w/ctr"), &r), 0);
    assert_int_equal(r.i64, 1);
    /* BARRIER of 3 over three connections. */
    struct store_tc c;
    assert_int_equal(store_tc_open(&c, port, AF_INET, C10D_STORE_DIALECT_CURRENT), 0);
    assert_int_equal(store_tc_req(a.fd, a.dialect, C10D_STORE_BARRIER, 0, 3, 1, &STR("/bar")), 0);
    assert_int_equal(store_tc_req(b.fd, b.dialect, C10D_STORE_BARRIER, 0, 3, 1, &STR("/bar")), 0);
    assert_int_equal(store_tc_call(&c, C10D_STORE_BARRIER, 0, 3, 1, &STR("/bar"), &r), 0);
    assert_int_equal(r.u8, C10D_STORE_STOP_WAITING);
    assert_int_equal(store_tc_recv(&a, C10D_STORE_BARRIER, 0, 0, &r), 0);
    assert_int_equal(store_tc_recv(&b, C10D_STORE_BARRIER, 0, 0, &r), 0);
    /* A pipelined burst: several requests in one write, replies in order. */
    struct c10d__wire_buf burst = {0};
    for (int i = 0; i < 50; i++) {
        struct c10d__wire_request q = {.cmd = C10D_STORE_PING, .u32 = (uint32_t)i};
        c10d__wire_encode_request(&burst, C10D_STORE_DIALECT_CURRENT, &q);
    }
    assert_int_equal(store_tc_send(c.fd, burst.data, burst.len), 0);
    for (int i = 0; i < 50; i++) {
        assert_int_equal(store_tc_recv(&c, C10D_STORE_PING, 0, 0, &r), 0);
        assert_int_equal(r.u32, (uint32_t)i);
    }
    c10d__wire_buf_free(&burst);
    store_tc_close(&a);
    store_tc_close(&b);
    store_tc_close(&c);
}

static void test_server_legacy(void **state)
{
    (void)state;
    struct store_tc c, w;
    struct c10d__wire_reply r;
    assert_int_equal(store_tc_open(&c, port, AF_INET, C10D_STORE_DIALECT_LEGACY), 0);
    assert_int_equal(store_tc_open(&w, port, AF_INET, C10D_STORE_DIALECT_LEGACY), 0);
    /* GETNUMKEYS is one byte: answered without waiting for more. */
    assert_int_equal(store_tc_call(&c, C10D_STORE_GETNUMKEYS, 0, 0, 0, NULL, &r), 0);
    assert_int_equal(store_tc_call(&w, C10D_STORE_WATCH_KEY, 0, 0, 1, &STR("/leg/w"), &r), 0);
    assert_int_equal(r.u8, C10D_STORE_KEY_CALLBACK_REGISTERED);
    struct c10d__wire_str kv[] = {STR("/leg/w"), STR("1")};
    assert_int_equal(store_tc_call(&c, C10D_STORE_SET, 0, 0, 2, kv, &r), 0);
    assert_int_equal(store_tc_call(&c, C10D_STORE_ADD, 0, 2, 1, kv, &r), 0);
    assert_int_equal(r.i64, 3);
    assert_int_equal(store_tc_call(&c, C10D_STORE_GET, 0, 0, 1, kv, &r), 0);
    expect_str(&r, 0, "3");
    assert_int_equal(store_tc_call(&c, C10D_STORE_DELETE_KEY, 0, 0, 1, kv, &r), 0);
    assert_int_equal(store_tc_recv(&w, 0, 0, 1, &r), 0);
    assert_int_equal(r.u8, C10D_STORE_KEY_CREATED);
    expect_str(&r, 0, "/leg/w");
    expect_str(&r, 1, "");
    expect_str(&r, 2, "1");
    assert_int_equal(store_tc_recv(&w, 0, 0, 1, &r), 0);
    assert_int_equal(r.u8, C10D_STORE_KEY_UPDATED);
    expect_str(&r, 1, "1");
    expect_str(&r, 2, "3");
    assert_int_equal(store_tc_recv(&w, 0, 0, 1, &r), 0);
    assert_int_equal(r.u8, C10D_STORE_KEY_DELETED);
    expect_str(&r, 1, "3");
    /* ADD on a non-number: that connection is closed, the others carry on. */
    struct c10d__wire_str txt[] = {STR("/leg/txt"), STR("abc")};
    assert_int_equal(store_tc_call(&c, C10D_STORE_SET, 0, 0, 2, txt, &r), 0);
    assert_int_equal(store_tc_req(c.fd, c.dialect, C10D_STORE_ADD, 0, 1, 1, txt), 0);
    assert_int_equal(store_tc_wait_closed(c.fd, 20000), 1);
    struct store_tc d;
    assert_int_equal(store_tc_open(&d, port, AF_INET6, C10D_STORE_DIALECT_CURRENT), 0);
    assert_int_equal(store_tc_call(&d, C10D_STORE_GET, 0, 0, 1, txt, &r), 0);
    expect_str(&r, 0, "abc");
    store_tc_close(&c);
    store_tc_close(&w);
    store_tc_close(&d);
}

static void test_server_stats(void **state)
{
    (void)state;
    char *text = store_ts_stats(&ts);
    assert_non_null(text);
    json_error_t err;
    json_t *o = json_loads(text, 0, &err);
    assert_non_null(o);
    assert_true(json_integer_value(json_object_get(o, "keys")) > 0);
    assert_true(json_integer_value(json_object_get(json_object_get(o, "ops"), "PING")) > 0);
    assert_non_null(json_object_get(o, "ops_per_s"));
    assert_non_null(json_object_get(json_object_get(o, "connections"), "open"));
    assert_non_null(json_object_get(o, "waiters"));
    assert_true(json_integer_value(json_object_get(o, "port")) == port);
    json_decref(o);
    free(text);
}

int main(void)
{
    const struct CMUnitTest table_tests[] = {
        cmocka_unit_test(test_table_values),
        cmocka_unit_test(test_table_compare_set),
        cmocka_unit_test(test_table_waits),
        cmocka_unit_test(test_table_queues_barrier),
        cmocka_unit_test(test_table_queue_wake_passes_on),
        cmocka_unit_test(test_table_delete_queue),
        cmocka_unit_test(test_table_watch_and_memory),
    };
    const struct CMUnitTest server_tests[] = {
        cmocka_unit_test(test_server_current),
        cmocka_unit_test(test_server_wait_and_cancel),
        cmocka_unit_test(test_server_legacy),
        cmocka_unit_test(test_server_stats),
    };
    int rc = cmocka_run_group_tests(table_tests, NULL, NULL);
    rc |= cmocka_run_group_tests(server_tests, start_server, stop_server);
    return rc;
}
