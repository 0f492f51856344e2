/* One conformance suite for every client store: hash, prefix (over hash), file,
 * TCP against the embedded server (both dialects) and against the c10d-store
 * process. Each kind opens fresh stores; tests keep to their own keys (a
 * per-test prefix) so the TCP server may be shared. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "free_port.h"
#include "c10d.h"
#include "engine/loop.h"
#include "store_server/client/store.h"
#include "store_server/server/server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---------------------------------------------------------------- kinds */

struct kind {
    const char *name;
    int (*open)(struct kind *k, c10d_store **out);
    int legacy; /* TCP in the 1.13 dialect: no APPEND, MULTI_*, QUEUE_*, PING */
    int port;
    char dir[256];
    c10d_store *shared; /* prefix kind: the hash store under every prefix */
};

static atomic_int test_seq;
static char test_prefix[64];

/* One hash store per group: "other clients" are other handles on it. */
static int open_hash(struct kind *k, c10d_store **out)
{
    if (!k->shared && c10d_store_hash_create(&k->shared) < 0)
        return -1;
    c10d_store_retain(k->shared);
    *out = k->shared;
    return 0;
}

static int open_prefix(struct kind *k, c10d_store **out)
{
    if (!k->shared && c10d_store_hash_create(&k->shared) < 0)
        return -1;
    return c10d_store_prefix(k->shared, "outer", out);
}

static int open_file(struct kind *k, c10d_store **out)
{
    char path[512];
    snprintf(path, sizeof path, "%s/store", k->dir);
    return c10d_store_file_open(path, 0, out);
}

static int open_tcp(struct kind *k, c10d_store **out)
{
    c10d_store_tcp_opts o = {.timeout_ms = 20000,
                             .dialect = k->legacy ? C10D_DIALECT_LEGACY : C10D_DIALECT_CURRENT};
    return c10d_store_tcp_connect("127.0.0.1", k->port, &o, out);
}

/* A fresh store for the current test: the kind's store under the test's prefix. */
static c10d_store *open_store(struct kind *k)
{
    c10d_store *base = NULL, *s = NULL;
    int rc = k->open(k, &base);
    if (rc < 0)
        fail_msg("%s: open: %s", k->name, c10d_last_error());
    assert_int_equal(c10d_store_prefix(base, test_prefix, &s), 0);
    c10d_store_release(base);
    return s;
}

static void begin_test(void)
{
    snprintf(test_prefix, sizeof test_prefix, "t%d.%d", (int)getpid(),
             atomic_fetch_add(&test_seq, 1));
}

/* ------------------------------------------------------------- helpers */

static void expect_str(c10d_store *s, const char *key, const char *want)
{
    void *v = NULL;
    size_t len = 0;
    int rc = c10d_store_get_sync(s, key, &v, &len);
    if (rc != 0)
        fail_msg("get %s: %s", key, c10d_last_error());
    assert_int_equal(len, strlen(want));
    assert_memory_equal(v, want, len);
    free(v);
}

static void set_str(c10d_store *s, const char *key, const char *value)
{
    int rc = c10d_store_set_sync(s, key, value, strlen(value));
    if (rc != 0)
        fail_msg("set %s: %s", key, c10d_last_error());
}

/* ---------------------------------------------------------------- tests */

static void test_set_get(void **state)
{
    struct kind *k = *state;
    begin_test();
    c10d_store *s = open_store(k);
    set_str(s, "a", "hello");
    expect_str(s, "a", "hello");
    set_str(s, "a", "");
    expect_str(s, "a", "");
    /* binary values survive */
    uint8_t bin[256];
    for (int i = 0; i < 256; i++)
        bin[i] = (uint8_t)i;
    assert_int_equal(c10d_store_set_sync(s, "bin", bin, sizeof bin), 0);
    void *v;
    size_t len;
    assert_int_equal(c10d_store_get_sync(s, "bin", &v, &len), 0);
    assert_int_equal(len, 256);
    assert_memory_equal(v, bin, 256);
    free(v);
    c10d_store_release(s);
}

static void test_counters(void **state)
{
    struct kind *k = *state;
    begin_test();
    c10d_store *s = open_store(k);
    int64_t v = 0;
    assert_int_equal(c10d_store_add_sync(s, "c", 1, &v), 0);
    assert_int_equal(v, 1);
    assert_int_equal(c10d_store_add_sync(s, "c", 2, &v), 0);
    assert_int_equal(v, 3);
    assert_int_equal(c10d_store_add_sync(s, "c", -5, &v), 0);
    assert_int_equal(v, -2);
    assert_int_equal(c10d_store_add_sync(s, "c", 5, &v), 0);
    expect_str(s, "c", "3");
    assert_int_equal(c10d_store_add_sync(s, "c", 0, &v), 0);
    assert_int_equal(v, 3);
    if (!k->legacy) {
        /* The 1.13 server answers a non-number by closing the connection. */
        set_str(s, "text", "abc");
        int rc = c10d_store_add_sync(s, "text", 1, &v);
        /* local stores answer ESTORE; a TCP server closes the connection */
        assert_true(rc == C10D_ESTORE || (k->open == open_tcp && rc == C10D_ECLOSED));
        /* the store still works afterwards */
        assert_int_equal(c10d_store_add_sync(s, "c", 1, &v), 0);
        assert_int_equal(v, 4);
    }
    c10d_store_release(s);
}

static void expect_cas(c10d_store *s, const char *key, const char *exp, const char *des,
                       const char *want)
{
    void *v = NULL;
    size_t len = 0;
    int rc = c10d_store_compare_set_sync(s, key, exp, strlen(exp), des, strlen(des), &v, &len);
    if (rc != 0)
        fail_msg("compare_set %s: %s", key, c10d_last_error());
    assert_int_equal(len, strlen(want));
    assert_memory_equal(v, want, len);
    free(v);
}

static void test_compare_set(void **state)
{
    struct kind *k = *state;
    begin_test();
    c10d_store *s = open_store(k);
    const char *key = "cas";
    int ready = -1;
    /* missing key, non-empty expected: reply expected, store nothing */
    expect_cas(s, key, "x", "y", "x");
    assert_int_equal(c10d_store_check_sync(s, &key, 1, &ready), 0);
    assert_int_equal(ready, 0);
    /* missing key, empty expected: store desired, reply desired */
    expect_cas(s, key, "", "first", "first");
    expect_str(s, key, "first");
    /* present and equal: store desired */
    expect_cas(s, key, "first", "second", "second");
    expect_str(s, key, "second");
    /* present, different: reply current, store nothing */
    expect_cas(s, key, "nope", "third", "second");
    expect_str(s, key, "second");
    c10d_store_release(s);
}

static void test_check_delete_num_keys(void **state)
{
    struct kind *k = *state;
    begin_test();
    c10d_store *s = open_store(k);
    int64_t before = 0, after = 0;
    assert_int_equal(c10d_store_num_keys_sync(s, &before), 0);
    set_str(s, "k1", "1");
    set_str(s, "k2", "2");
    assert_int_equal(c10d_store_num_keys_sync(s, &after), 0);
    assert_int_equal(after - before, 2);
    const char *both[] = {"k1", "k2"};
    const char *some[] = {"k1", "k3"};
    int ready = -1, deleted = -1;
    assert_int_equal(c10d_store_check_sync(s, both, 2, &ready), 0);
    assert_int_equal(ready, 1);
    assert_int_equal(c10d_store_check_sync(s, some, 2, &ready), 0);
    assert_int_equal(ready, 0);
    assert_int_equal(c10d_store_delete_key_sync(s, "k1", &deleted), 0);
    assert_int_equal(deleted, 1);
    assert_int_equal(c10d_store_delete_key_sync(s, "k1", &deleted), 0);
    assert_int_equal(deleted, 0);
    assert_int_equal(c10d_store_check_sync(s, both, 2, &ready), 0);
    assert_int_equal(ready, 0);
    assert_int_equal(c10d_store_num_keys_sync(s, &after), 0);
    assert_int_equal(after - before, 1);
    c10d_store_release(s);
}

static void test_wait_timeout_no_desync(void **state)
{
    struct kind *k = *state;
    begin_test();
    c10d_store *s = open_store(k);
    set_str(s, "present", "p");
    const char *present = "present", *missing = "missing";
    assert_int_equal(c10d_store_wait_sync(s, &present, 1, 1000), 0);
    uint64_t t0 = c10d__now_ms();
    int rc = c10d_store_wait_sync(s, &missing, 1, 300);
    uint64_t spent = c10d__now_ms() - t0;
    assert_int_equal(rc, C10D_ETIMEDOUT);
    assert_non_null(strstr(c10d_last_error(), "missing"));
    assert_true(spent >= 250);
    /* The key now appears: a late STOP_WAITING must not answer later requests. */
    set_str(s, "missing", "m");
    set_str(s, "after", "A");
    expect_str(s, "after", "A");
    int64_t v = 0;
    assert_int_equal(c10d_store_add_sync(s, "n", 7, &v), 0);
    assert_int_equal(v, 7);
    expect_str(s, "missing", "m");
    /* get on a missing key waits and times out too */
    c10d_store_set_timeout(s, 300);
    void *val = NULL;
    size_t len = 0;
    assert_int_equal(c10d_store_get_sync(s, "never", &val, &len), C10D_ETIMEDOUT);
    assert_null(val);
    c10d_store_set_timeout(s, 20000);
    expect_str(s, "after", "A");
    c10d_store_release(s);
}

struct delayed_set {
    c10d_store *s;
    const char *key;
    int delay_ms;
    int queue;
};

static void *delayed_set_main(void *arg)
{
    struct delayed_set *d = arg;
    usleep((useconds_t)d->delay_ms * 1000);
    if (d->queue)
        c10d_store_queue_push_sync(d->s, d->key, "late", 4);
    else
        c10d_store_set_sync(d->s, d->key, "late", 4);
    return NULL;
}

static void test_wait_across_clients(void **state)
{
    struct kind *k = *state;
    begin_test();
    c10d_store *s = open_store(k), *other = open_store(k);
    struct delayed_set d = {other, "w", 100, 0};
    pthread_t th;
    pthread_create(&th, NULL, delayed_set_main, &d);
    const char *key = "w";
    assert_int_equal(c10d_store_wait_sync(s, &key, 1, 10000), 0);
    expect_str(s, "w", "late");
    pthread_join(th, NULL);
    /* get waits for its key as well */
    d.key = "g";
    pthread_create(&th, NULL, delayed_set_main, &d);
    expect_str(s, "g", "late");
    pthread_join(th, NULL);
    c10d_store_release(other);
    c10d_store_release(s);
}

static void test_queues(void **state)
{
    struct kind *k = *state;
    if (k->legacy)
        skip();
    begin_test();
    c10d_store *s = open_store(k);
    int64_t len = -1;
    assert_int_equal(c10d_store_queue_len_sync(s, "q", &len), 0);
    assert_int_equal(len, 0);
    assert_int_equal(c10d_store_queue_push_sync(s, "q", "a", 1), 0);
    assert_int_equal(c10d_store_queue_push_sync(s, "q", "bb", 2), 0);
    assert_int_equal(c10d_store_queue_len_sync(s, "q", &len), 0);
    assert_int_equal(len, 2);
    void *v;
    size_t vl;
    assert_int_equal(c10d_store_queue_pop_sync(s, "q", 0, &v, &vl), 0);
    assert_int_equal(vl, 1);
    assert_memory_equal(v, "a", 1);
    free(v);
    assert_int_equal(c10d_store_queue_pop_sync(s, "q", 1, &v, &vl), 0);
    assert_int_equal(vl, 2);
    assert_memory_equal(v, "bb", 2);
    free(v);
    v = NULL;
    assert_int_equal(c10d_store_queue_pop_sync(s, "q", 0, &v, &vl), C10D_ENOTFOUND);
    assert_null(v);
    /* blocking pop: an item pushed later by another client */
    c10d_store *other = open_store(k);
    struct delayed_set d = {other, "q", 100, 1};
    pthread_t th;
    pthread_create(&th, NULL, delayed_set_main, &d);
    assert_int_equal(c10d_store_queue_pop_sync(s, "q", 1, &v, &vl), 0);
    assert_int_equal(vl, 4);
    assert_memory_equal(v, "late", 4);
    free(v);
    pthread_join(th, NULL);
    /* blocking pop times out on an empty queue, and the store still works */
    c10d_store_set_timeout(s, 300);
    assert_int_equal(c10d_store_queue_pop_sync(s, "q", 1, &v, &vl), C10D_ETIMEDOUT);
    c10d_store_set_timeout(s, 20000);
    assert_int_equal(c10d_store_queue_push_sync(other, "q", "z", 1), 0);
    /* QUEUE_PUSH has no reply: on a TCP store push_sync returns once the
     * request is written, not once the server ran it, and the server orders
     * requests per connection only, so s's non-blocking pop could run first.
     * A request with a reply on `other` is answered after the push ran (and
     * shows that the cancelled wait took nothing). */
    assert_int_equal(c10d_store_queue_len_sync(other, "q", &len), 0);
    assert_int_equal(len, 1);
    assert_int_equal(c10d_store_queue_pop_sync(s, "q", 0, &v, &vl), 0);
    assert_memory_equal(v, "z", 1);
    free(v);
    c10d_store_release(other);
    c10d_store_release(s);
}

static void test_multi_and_append(void **state)
{
    struct kind *k = *state;
    if (k->legacy)
        skip();
    begin_test();
    c10d_store *s = open_store(k);
    const char *keys[] = {"m0", "m1", "m2"};
    const void *vals[] = {"zero", "", "two"};
    size_t lens[] = {4, 0, 3};
    assert_int_equal(c10d_store_multi_set_sync(s, keys, vals, lens, 3), 0);
    void *out[3];
    size_t olens[3];
    assert_int_equal(c10d_store_multi_get_sync(s, keys, 3, out, olens), 0);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(olens[i], lens[i]);
        assert_memory_equal(out[i], vals[i], lens[i]);
        free(out[i]);
    }
    assert_int_equal(c10d_store_append_sync(s, "ap", "ab", 2), 0);
    assert_int_equal(c10d_store_append_sync(s, "ap", "cd", 2), 0);
    expect_str(s, "ap", "abcd");
    c10d_store_release(s);
}

static void test_prefix_isolation_list_keys(void **state)
{
    struct kind *k = *state;
    begin_test();
    c10d_store *s = open_store(k), *a, *b;
    assert_int_equal(c10d_store_prefix(s, "a", &a), 0);
    assert_int_equal(c10d_store_prefix(s, "b", &b), 0);
    set_str(a, "k", "in a");
    const char *key = "k";
    int ready = -1;
    assert_int_equal(c10d_store_check_sync(b, &key, 1, &ready), 0);
    assert_int_equal(ready, 0);
    set_str(b, "k", "in b");
    expect_str(a, "k", "in a");
    expect_str(b, "k", "in b");
    expect_str(s, "a/k", "in a");
    char **keys = NULL;
    size_t n = 0;
    int rc = c10d_store_list_keys_sync(a, &keys, &n);
    if (k->legacy) {
        assert_int_equal(rc, C10D_EUNSUPPORTED);
    } else {
        assert_int_equal(rc, 0);
        assert_int_equal(n, 1);
        assert_string_equal(keys[0], "k");
        for (size_t i = 0; i < n; i++)
            free(keys[i]);
        free(keys);
    }
    c10d_store_release(a);
    c10d_store_release(b);
    c10d_store_release(s);
}

struct cb_record {
    atomic_int calls;
    atomic_int on_loop;
    int status;
    int64_t value;
    pthread_t caller;
};

/* The asynchronous form as a user writes it: submit, attach a callback,
 * drop the work. */
static int call_async(c10d_store *s, c10d_store_request q, c10d_work_cb cb, void *arg)
{
    q.struct_size = sizeof q;
    c10d_work *w;
    int rc = c10d_store_submit(s, &q, &w);
    if (rc != 0)
        return rc;
    rc = c10d_work_on_complete(w, cb, arg);
    c10d_work_release(w);
    return rc;
}

static void record_cb(c10d_work *w, int status, void *arg)
{
    (void)status;
    const c10d_store_result *r = c10d_store_work_result(w);
    struct cb_record *rec = arg;
    rec->status = r->status;
    rec->value = r->value;
    atomic_fetch_add(&rec->on_loop, c10d_on_loop_thread());
    atomic_fetch_add(&rec->calls, 1);
}

static void test_async_callbacks(void **state)
{
    struct kind *k = *state;
    begin_test();
    c10d_store *s = open_store(k);
    struct cb_record rec[16];
    memset(rec, 0, sizeof rec);
    for (int i = 0; i < 16; i++)
        assert_int_equal(
            call_async(s, (c10d_store_request){.op = C10D_STORE_OP_ADD, .key = "ac", .delta = 1},
                       record_cb, &rec[i]),
            0);
    for (int i = 0; i < 16; i++) {
        for (int t = 0; t < 10000 && atomic_load(&rec[i].calls) == 0; t++)
            usleep(1000);
        assert_int_equal(atomic_load(&rec[i].calls), 1);
        assert_int_equal(atomic_load(&rec[i].on_loop), 1);
        assert_int_equal(rec[i].status, 0);
        /* replies come in order */
        assert_int_equal(rec[i].value, i + 1);
    }
    /* a bad argument fails at once and never calls back */
    struct cb_record bad = {0};
    assert_int_equal(
        call_async(
            s, (c10d_store_request){.op = C10D_STORE_OP_SET, .key = NULL, .value = "x", .len = 1},
            record_cb, &bad),
        C10D_EINVAL);
    assert_non_null(strstr(c10d_last_error(), "key"));
    usleep(20000);
    assert_int_equal(atomic_load(&bad.calls), 0);
    c10d_store_release(s);
}

struct adder {
    struct kind *k;
    c10d_store *s;
    int n;
};

static void *adder_main(void *arg)
{
    struct adder *a = arg;
    for (int i = 0; i < a->n; i++)
        if (c10d_store_add_sync(a->s, "shared", 1, NULL) != 0)
            return (void *)1;
    return NULL;
}

static void test_concurrent_clients(void **state)
{
    struct kind *k = *state;
    begin_test();
    enum { T = 4, N = 100 };
    struct adder ad[T];
    pthread_t th[T];
    for (int i = 0; i < T; i++) {
        ad[i].k = k;
        ad[i].s = open_store(k);
        ad[i].n = N;
        pthread_create(&th[i], NULL, adder_main, &ad[i]);
    }
    for (int i = 0; i < T; i++) {
        void *ret;
        pthread_join(th[i], &ret);
        assert_null(ret);
    }
    int64_t v = 0;
    assert_int_equal(c10d_store_add_sync(ad[0].s, "shared", 0, &v), 0);
    assert_int_equal(v, T * N);
    for (int i = 0; i < T; i++)
        c10d_store_release(ad[i].s);
}

/* Several processes (file and TCP kinds): children add to one counter. */
static void test_concurrent_processes(void **state)
{
    struct kind *k = *state;
    if (k->open == open_hash || k->open == open_prefix)
        skip(); /* in-process stores */
    begin_test();
    enum { P = 3, N = 50 };
    pid_t pids[P];
    for (int i = 0; i < P; i++) {
        pids[i] = fork();
        assert_true(pids[i] >= 0);
        if (pids[i] == 0) {
            c10d_store *base = NULL, *s = NULL;
            int ok = k->open(k, &base) == 0 && c10d_store_prefix(base, test_prefix, &s) == 0;
            for (int j = 0; ok && j < N; j++)
                ok = c10d_store_add_sync(s, "procs", 1, NULL) == 0;
            if (!ok)
                fprintf(stderr, "child: %s\n", c10d_last_error());
            c10d_store_release(s);
            c10d_store_release(base);
            c10d_shutdown();
            _exit(ok ? 0 : 1);
        }
    }
    int failed = 0;
    for (int i = 0; i < P; i++) {
        int st;
        /* children are bounded by the store timeout */
        while (waitpid(pids[i], &st, 0) < 0 && errno == EINTR)
            ;
        failed |= !WIFEXITED(st) || WEXITSTATUS(st) != 0;
    }
    assert_false(failed);
    c10d_store *s = open_store(k);
    int64_t v = 0;
    assert_int_equal(c10d_store_add_sync(s, "procs", 0, &v), 0);
    assert_int_equal(v, P * N);
    c10d_store_release(s);
}

/* The work form: the same ops through c10d_store_submit, waited on and read
 * back like group works; a rejected request makes no work. */
static void test_submit_works(void **state)
{
    struct kind *k = *state;
    begin_test();
    c10d_store *s = open_store(k);
    c10d_store_request q = C10D_STORE_REQUEST_INIT;
    c10d_work *w = NULL;
    q.op = C10D_STORE_OP_SET;
    q.key = "wk";
    q.value = "hello";
    q.len = 5;
    assert_int_equal(c10d_store_submit(s, &q, &w), 0);
    assert_int_equal(c10d_work_wait(w, -1), 0);
    c10d_work_release(w);
    q = (c10d_store_request)C10D_STORE_REQUEST_INIT;
    q.op = C10D_STORE_OP_GET;
    q.key = "wk";
    assert_int_equal(c10d_store_submit(s, &q, &w), 0);
    assert_int_equal(c10d_work_wait(w, -1), 0);
    const c10d_store_result *r = c10d_store_work_result(w);
    assert_non_null(r);
    assert_int_equal(r->data.len, 5);
    assert_memory_equal(r->data.data, "hello", 5);
    c10d_work_release(w);
    q = (c10d_store_request)C10D_STORE_REQUEST_INIT;
    q.op = C10D_STORE_OP_ADD;
    q.key = "wcount";
    q.delta = 41;
    assert_int_equal(c10d_store_submit(s, &q, &w), 0);
    assert_int_equal(c10d_work_wait(w, -1), 0);
    assert_int_equal(c10d_store_work_result(w)->value, 41);
    c10d_work_release(w);
    /* A failing op: its status and message are the work's. */
    const char *missing[] = {"never_set"};
    q = (c10d_store_request)C10D_STORE_REQUEST_INIT;
    q.op = C10D_STORE_OP_WAIT;
    q.keys = missing;
    q.nkeys = 1;
    q.timeout_ms = 200;
    assert_int_equal(c10d_store_submit(s, &q, &w), 0);
    assert_int_equal(c10d_work_wait(w, -1), C10D_ETIMEDOUT);
    assert_int_equal(c10d_store_work_result(w)->status, C10D_ETIMEDOUT);
    assert_non_null(strstr(c10d_work_message(w), "never_set"));
    c10d_work_release(w);
    /* Rejected at once: no work. */
    q = (c10d_store_request)C10D_STORE_REQUEST_INIT;
    q.op = C10D_STORE_OP_GET;
    w = (c10d_work *)0x1;
    assert_int_equal(c10d_store_submit(s, &q, &w), C10D_EINVAL);
    assert_null(w);
    q.op = (c10d_store_op)99;
    assert_int_equal(c10d_store_submit(s, &q, &w), C10D_EINVAL);
    assert_non_null(strstr(c10d_last_error(), "unknown op 99"));
    c10d_store_release(s);
}

/* A callback that runs while the engine stops (user callbacks run after the
 * stores' shutdown hooks) and starts more store ops, as c10d_pg_destroy's key
 * sweep does: c10d_shutdown must still return, the late ops failing. Once it
 * kept the loop alive for ever (a tcp store reconnecting). */
static void late_noop(c10d_work *w, int status, void *arg)
{
    (void)status;
    const c10d_store_result *res = c10d_store_work_result(w);
    (void)res;
    (void)arg;
}

static void late_more_ops(c10d_work *w, int status, void *arg)
{
    (void)status;
    const c10d_store_result *res = c10d_store_work_result(w);
    (void)res;
    c10d_store *s = arg;
    const char *never[] = {"never_set"};
    call_async(s, (c10d_store_request){.op = C10D_STORE_OP_DELETE_KEY, .key = "late"}, late_noop,
               NULL);
    call_async(s,
               (c10d_store_request){
                   .op = C10D_STORE_OP_WAIT, .keys = never, .nkeys = 1, .timeout_ms = 20000},
               late_noop, NULL);
}

static void test_shutdown_with_late_ops(void **state)
{
    struct kind *k = *state;
    begin_test();
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        alarm(60); /* a hang ends the child with SIGALRM */
        for (int i = 0; i < 40; i++) {
            c10d_store *base = NULL, *s = NULL;
            if (k->open(k, &base) != 0 || c10d_store_prefix(base, test_prefix, &s) != 0) {
                fprintf(stderr, "child: open: %s\n", c10d_last_error());
                _exit(2);
            }
            call_async(s, (c10d_store_request){.op = C10D_STORE_OP_ADD, .key = "late", .delta = 1},
                       late_more_ops, s);
            /* Let the add's reply land at different points of the stop. */
            usleep((useconds_t)(i % 8) * 100);
            if (c10d_shutdown() != 0)
                _exit(3);
            c10d_store_release(s);
            c10d_store_release(base);
        }
        _exit(0);
    }
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    if (WIFSIGNALED(st))
        fail_msg("%s: c10d_shutdown hung (child killed by signal %d)", k->name, WTERMSIG(st));
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
}

/* File store: an op parked in the very loop turn in which the store's retry
 * timer found nothing parked must still be retried. A stands in for "the
 * last parked op"; its callback (inside the retry tick) arms our timer for
 * the same instant as the retry timer's next tick, so in that later turn
 * the store's tick runs first and finds nothing, then ours submits B while
 * another open file description holds the lock. B parks; we release the
 * lock 50 ms later; B must then finish long before its deadline. */
#define FILE_STORE_POLL_MS 10 /* engine/store_file.c POLL_MS */

struct park_race {
    c10d_store *s;
    int lockfd;
    uv_timer_t submit_b, unlock;
    atomic_int a_done, b_done, b_status, timers_closed;
};

static void park_race_b_cb(c10d_work *w, int status, void *arg)
{
    (void)status;
    const c10d_store_result *r = c10d_store_work_result(w);
    struct park_race *pr = arg;
    atomic_store(&pr->b_status, r->status);
    atomic_store(&pr->b_done, 1);
}

static void park_race_unlock(uv_timer_t *t)
{
    struct park_race *pr = t->data;
    flock(pr->lockfd, LOCK_UN);
}

static void park_race_submit_b(uv_timer_t *t)
{
    struct park_race *pr = t->data;
    if (flock(pr->lockfd, LOCK_EX | LOCK_NB) < 0 ||
        call_async(pr->s,
                   (c10d_store_request){.op = C10D_STORE_OP_ADD, .key = "race_b", .delta = 1},
                   park_race_b_cb, pr) < 0) {
        atomic_store(&pr->b_status, -1000);
        atomic_store(&pr->b_done, 1);
        return;
    }
    uv_timer_start(&pr->unlock, park_race_unlock, 50, 0);
}

static void park_race_a_cb(c10d_work *w, int status, void *arg)
{
    (void)status;
    const c10d_store_result *r = c10d_store_work_result(w);
    struct park_race *pr = arg;
    (void)r;
    uv_timer_init(c10d__engine_loop(), &pr->submit_b);
    uv_timer_init(c10d__engine_loop(), &pr->unlock);
    pr->submit_b.data = pr->unlock.data = pr;
    uv_timer_start(&pr->submit_b, park_race_submit_b, FILE_STORE_POLL_MS, 0);
    atomic_store(&pr->a_done, 1);
}

static void park_race_timer_closed(uv_handle_t *h)
{
    struct park_race *pr = h->data;
    atomic_fetch_add(&pr->timers_closed, 1);
}

static void park_race_close_timers(void *arg)
{
    struct park_race *pr = arg;
    uv_close((uv_handle_t *)&pr->submit_b, park_race_timer_closed);
    uv_close((uv_handle_t *)&pr->unlock, park_race_timer_closed);
}

static void test_file_park_after_idle_tick(void **state)
{
    struct kind *k = *state;
    char path[512];
    snprintf(path, sizeof path, "%s/park_race", k->dir);
    struct park_race pr;
    memset(&pr, 0, sizeof pr);
    assert_int_equal(c10d_store_file_open(path, 0, &pr.s), 0);
    assert_int_equal(c10d_store_set_timeout(pr.s, 5000), 0);
    pr.lockfd = open(path, O_RDWR);
    assert_true(pr.lockfd >= 0);
    /* A parks behind our lock; the store's retry timer completes it. */
    assert_int_equal(flock(pr.lockfd, LOCK_EX), 0);
    assert_int_equal(
        call_async(pr.s, (c10d_store_request){.op = C10D_STORE_OP_ADD, .key = "race_a", .delta = 1},
                   park_race_a_cb, &pr),
        0);
    usleep(3 * FILE_STORE_POLL_MS * 1000);
    assert_int_equal(flock(pr.lockfd, LOCK_UN), 0);
    for (int t = 0; t < 3000 && !atomic_load(&pr.a_done); t++)
        usleep(1000);
    assert_true(atomic_load(&pr.a_done));
    /* B is retried after the unlock, well inside its 5 s deadline. */
    for (int t = 0; t < 2000 && !atomic_load(&pr.b_done); t++)
        usleep(1000);
    if (!atomic_load(&pr.b_done))
        fail_msg("an op parked right after an idle retry tick was never retried");
    assert_int_equal(atomic_load(&pr.b_status), 0);
    assert_int_equal(c10d__engine_call(park_race_close_timers, &pr), 0);
    for (int t = 0; t < 3000 && atomic_load(&pr.timers_closed) < 2; t++)
        usleep(1000);
    assert_int_equal(atomic_load(&pr.timers_closed), 2);
    close(pr.lockfd);
    c10d_store_release(pr.s);
}

/* --------------------------------------------------------- group setup */

static int setup_file(void **state)
{
    struct kind *k = *state;
    snprintf(k->dir, sizeof k->dir, "/tmp/c10d_store_conf.XXXXXX");
    return mkdtemp(k->dir) ? 0 : -1;
}

static int teardown_file(void **state)
{
    struct kind *k = *state;
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", k->dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* The embedded server on the engine's loop. */
struct server_call {
    struct c10d__store_server *server;
    int port;
    int rc;
    atomic_int done;
};

static struct server_call embedded;

static void start_server_on_loop(void *arg)
{
    struct server_call *c = arg;
    struct c10d__store_server_opts o = {.host = "127.0.0.1", .port = 0};
    c->rc = c10d__store_server_start(c10d__engine_loop(), &o, &c->server);
    if (c->rc == 0)
        c->port = c10d__store_server_port(c->server);
    atomic_store(&c->done, 1);
}

static void stop_server_on_loop(void *arg)
{
    struct server_call *c = arg;
    c10d__store_server_stop(c->server, NULL, NULL);
    c->server = NULL;
    atomic_store(&c->done, 1);
}

static void run_on_loop(void (*fn)(void *), struct server_call *c)
{
    atomic_store(&c->done, 0);
    c10d__engine_call(fn, c);
    for (int i = 0; i < 10000 && !atomic_load(&c->done); i++)
        usleep(1000);
}

static int setup_tcp(void **state)
{
    struct kind *k = *state;
    if (!embedded.server) {
        run_on_loop(start_server_on_loop, &embedded);
        if (embedded.rc < 0 || !embedded.server) {
            fprintf(stderr, "embedded server: %s\n", c10d_last_error());
            return -1;
        }
    }
    k->port = embedded.port;
    return 0;
}

/* The c10d-store process. */
static pid_t server_pid;

static int start_process_server(struct kind *k)
{
    const char *exe = getenv("C10D_STORE_EXE");
    if (!exe)
        return -1;
    char portfile[300];
    snprintf(portfile, sizeof portfile, "%s/port", k->dir);
    unlink(portfile);
    pid_t pid = fork();
    if (pid == 0) {
        char portarg[16];
        snprintf(portarg, sizeof portarg, "%d", k->port);
        execl(exe, exe, "serve", "--host", "127.0.0.1", "--port", portarg, "--port-file", portfile,
              (char *)NULL);
        _exit(127);
    }
    server_pid = pid;
    for (int i = 0; i < 10000; i++) {
        FILE *f = fopen(portfile, "r");
        if (f) {
            int port = 0;
            int got = fscanf(f, "%d", &port);
            fclose(f);
            if (got == 1 && port > 0) {
                k->port = port;
                return 0;
            }
        }
        if (waitpid(pid, NULL, WNOHANG) == pid) {
            server_pid = 0;
            return -1;
        }
        usleep(1000);
    }
    return -1;
}

static void stop_process_server(void)
{
    if (server_pid > 0) {
        kill(server_pid, SIGKILL);
        waitpid(server_pid, NULL, 0);
        server_pid = 0;
    }
}

static int setup_process(void **state)
{
    struct kind *k = *state;
    if (setup_file(state) < 0)
        return -1;
    k->port = 0;
    return start_process_server(k);
}

static int teardown_process(void **state)
{
    stop_process_server();
    return teardown_file(state);
}

/* -------------------------------------------------- TCP-specific tests */

static void test_tcp_refused(void **state)
{
    (void)state;
    /* A port nobody listens on (it binds now, and is outside the ephemeral
     * range other tests' connections use). */
    int port = test_free_port();
    assert_true(port > 0);
    c10d_store_tcp_opts o = {.timeout_ms = 1500};
    c10d_store *s = NULL;
    uint64_t t0 = c10d__now_ms();
    int rc = c10d_store_tcp_connect("127.0.0.1", port, &o, &s);
    uint64_t spent = c10d__now_ms() - t0;
    assert_int_equal(rc, C10D_ETIMEDOUT);
    assert_null(s);
    const char *msg = c10d_last_error();
    assert_non_null(strstr(msg, "connection refused"));
    assert_non_null(strstr(msg, "attempts"));
    assert_true(spent >= 1400);
}

static void test_tcp_server_restart(void **state)
{
    struct kind *k = *state;
    begin_test();
    c10d_store *s = open_store(k);
    set_str(s, "before", "1");
    /* an op pending when the server dies fails with ECLOSED */
    struct cb_record rec = {0};
    const char *key = "never";
    assert_int_equal(
        call_async(s,
                   (c10d_store_request){
                       .op = C10D_STORE_OP_WAIT, .keys = &key, .nkeys = 1, .timeout_ms = 10000},
                   record_cb, &rec),
        0);
    usleep(100000);
    stop_process_server();
    for (int t = 0; t < 10000 && atomic_load(&rec.calls) == 0; t++)
        usleep(1000);
    assert_int_equal(atomic_load(&rec.calls), 1);
    assert_int_equal(rec.status, C10D_ECLOSED);
    /* restart on the same port: later requests reconnect */
    assert_int_equal(start_process_server(k), 0);
    set_str(s, "after", "2");
    expect_str(s, "after", "2");
    c10d_store_release(s);
}

/* c10d-store's own STATS request: the server's JSON, counting this request;
 * refused cleanly by the legacy dialect and by stores without a server. */
static void test_server_stats(void **state)
{
    struct kind *k = *state;
    begin_test();
    c10d_store *s = open_store(k);
    set_str(s, "counted", "1");
    char *json = NULL;
    assert_int_equal(c10d_store_server_stats_sync(s, &json), 0);
    assert_non_null(strstr(json, "\"connections\""));
    assert_non_null(strstr(json, "\"STATS\":"));
    assert_non_null(strstr(json, "\"SET\":"));
    free(json);
    expect_str(s, "counted", "1"); /* the connection is still in step */
    c10d_store_release(s);

    c10d_store_tcp_opts o = {.timeout_ms = 20000, .dialect = C10D_DIALECT_LEGACY};
    c10d_store *legacy = NULL;
    assert_int_equal(c10d_store_tcp_connect("127.0.0.1", k->port, &o, &legacy), 0);
    assert_int_equal(c10d_store_server_stats_sync(legacy, &json), C10D_EUNSUPPORTED);
    assert_null(json);
    c10d_store_release(legacy);

    c10d_store *hash = NULL;
    assert_int_equal(c10d_store_hash_create(&hash), 0);
    assert_int_equal(c10d_store_server_stats_sync(hash, &json), C10D_EUNSUPPORTED);
    c10d_store_release(hash);
}

/* ---------------------------------------------------------------- main */

#define CONFORMANCE(k)                                                                             \
    cmocka_unit_test_prestate(test_set_get, &k), cmocka_unit_test_prestate(test_counters, &k),     \
        cmocka_unit_test_prestate(test_compare_set, &k),                                           \
        cmocka_unit_test_prestate(test_check_delete_num_keys, &k),                                 \
        cmocka_unit_test_prestate(test_wait_timeout_no_desync, &k),                                \
        cmocka_unit_test_prestate(test_wait_across_clients, &k),                                   \
        cmocka_unit_test_prestate(test_queues, &k),                                                \
        cmocka_unit_test_prestate(test_multi_and_append, &k),                                      \
        cmocka_unit_test_prestate(test_prefix_isolation_list_keys, &k),                            \
        cmocka_unit_test_prestate(test_async_callbacks, &k),                                       \
        cmocka_unit_test_prestate(test_concurrent_clients, &k),                                    \
        cmocka_unit_test_prestate(test_concurrent_processes, &k),                                  \
        cmocka_unit_test_prestate(test_submit_works, &k),                                          \
        cmocka_unit_test_prestate(test_shutdown_with_late_ops, &k)

static struct kind hash_kind = {.name = "hash", .open = open_hash};
static struct kind prefix_kind = {.name = "prefix", .open = open_prefix};
static struct kind file_kind = {.name = "file", .open = open_file};
static struct kind tcp_kind = {.name = "tcp", .open = open_tcp};
static struct kind legacy_kind = {.name = "tcp-legacy", .open = open_tcp, .legacy = 1};
static struct kind process_kind = {.name = "tcp-process", .open = open_tcp};

static int setup_none(void **state)
{
    (void)state;
    return 0;
}

static int teardown_shared_group(void **state)
{
    (void)state;
    c10d_store_release(prefix_kind.shared);
    prefix_kind.shared = NULL;
    c10d_store_release(hash_kind.shared);
    hash_kind.shared = NULL;
    return 0;
}

static int setup_file_group(void **state)
{
    (void)state;
    void *k = &file_kind;
    return setup_file(&k);
}

static int teardown_file_group(void **state)
{
    (void)state;
    void *k = &file_kind;
    return teardown_file(&k);
}

static int setup_tcp_group(void **state)
{
    (void)state;
    void *k = &tcp_kind;
    if (setup_tcp(&k) < 0)
        return -1;
    legacy_kind.port = tcp_kind.port;
    return 0;
}

static int setup_process_group(void **state)
{
    (void)state;
    void *k = &process_kind;
    return setup_process(&k);
}

static int teardown_process_group(void **state)
{
    (void)state;
    void *k = &process_kind;
    return teardown_process(&k);
}

static int teardown_tcp_group(void **state)
{
    (void)state;
    if (embedded.server)
        run_on_loop(stop_server_on_loop, &embedded);
    return 0;
}

int main(int argc, char **argv)
{
    /* argv[1]: run only this kind */
    const char *only = argc > 1 ? argv[1] : NULL;
    int failed = 0;
    const struct CMUnitTest hash_tests[] = {CONFORMANCE(hash_kind)};
    const struct CMUnitTest prefix_tests[] = {CONFORMANCE(prefix_kind)};
    const struct CMUnitTest file_tests[] = {
        CONFORMANCE(file_kind),
        cmocka_unit_test_prestate(test_file_park_after_idle_tick, &file_kind),
    };
    const struct CMUnitTest tcp_tests[] = {
        CONFORMANCE(tcp_kind),
        CONFORMANCE(legacy_kind),
        cmocka_unit_test_prestate(test_tcp_refused, &tcp_kind),
        cmocka_unit_test_prestate(test_server_stats, &tcp_kind),
    };
    const struct CMUnitTest process_tests[] = {
        CONFORMANCE(process_kind),
        cmocka_unit_test_prestate(test_tcp_server_restart, &process_kind),
    };
    if (!only || !strcmp(only, "hash"))
        failed +=
            cmocka_run_group_tests_name("hash", hash_tests, setup_none, teardown_shared_group);
    if (!only || !strcmp(only, "prefix"))
        failed +=
            cmocka_run_group_tests_name("prefix", prefix_tests, setup_none, teardown_shared_group);
    if (!only || !strcmp(only, "file"))
        failed +=
            cmocka_run_group_tests_name("file", file_tests, setup_file_group, teardown_file_group);
    if (!only || !strcmp(only, "tcp"))
        failed += cmocka_run_group_tests_name("tcp (embedded server)", tcp_tests, setup_tcp_group,
                                              teardown_tcp_group);
    if (!only || !strcmp(only, "process")) {
        if (getenv("C10D_STORE_EXE"))
            failed += cmocka_run_group_tests_name("tcp (c10d-store process)", process_tests,
                                                  setup_process_group, teardown_process_group);
        else
            fprintf(stderr, "C10D_STORE_EXE not set: skipping the c10d-store process group\n");
    }
    c10d_shutdown();
    return failed ? 1 : 0;
}
