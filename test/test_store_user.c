/* User stores (c10d_store_from_impl): a key-value map under a mutex and a
 * condition variable stands in for a network service. The conformance ops
 * through it, the derived and refused commands, the user's errors, a GET
 * that waits while another thread SETs, and a process group of two ranks
 * (threads) over a store with only the required functions. */
#include "c10d.h"

#include "api/pg.h"
#include "backends/backend.h"

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <stdatomic.h>
#include <unistd.h>

#include <cmocka.h>

/* ------------------------------------------------ the user's store (~100 lines) */

#define MAXKEYS 256

struct kv {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    size_t n;
    char *keys[MAXKEYS];
    char *vals[MAXKEYS];
    size_t lens[MAXKEYS];
    int fail_set;            /* set() fails with C10D_EIO */
    atomic_int set_delay_ms; /* set() takes this long first */
    int destroyed;
};

static long find(struct kv *kv, const char *key)
{
    for (size_t i = 0; i < kv->n; i++)
        if (strcmp(kv->keys[i], key) == 0)
            return (long)i;
    return -1;
}

static int put(struct kv *kv, const char *key, const void *v, size_t len)
{
    long i = find(kv, key);
    if (i < 0) {
        if (kv->n == MAXKEYS)
            return C10D_ENOMEM;
        i = (long)kv->n++;
        kv->keys[i] = strdup(key);
    } else {
        free(kv->vals[i]);
    }
    kv->vals[i] = malloc(len + 1);
    memcpy(kv->vals[i], v, len);
    ((char *)kv->vals[i])[len] = '\0'; /* add_locked parses it as a C string */
    kv->lens[i] = len;
    pthread_cond_broadcast(&kv->cv);
    return 0;
}

static char *copy(struct kv *kv, long i, size_t *len)
{
    char *c = malloc(kv->lens[i] + 1);
    memcpy(c, kv->vals[i], kv->lens[i]);
    c[kv->lens[i]] = '\0';
    *len = kv->lens[i];
    return c;
}

/* Until every key exists or the deadline passed (mutex held). */
static int wait_locked(struct kv *kv, const char *const *keys, size_t n, int64_t ms)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += ms / 1000;
    until.tv_nsec += (ms % 1000) * 1000000;
    if (until.tv_nsec >= 1000000000)
        until.tv_sec++, until.tv_nsec -= 1000000000;
    for (size_t i = 0; i < n; i++)
        while (find(kv, keys[i]) < 0)
            if (pthread_cond_timedwait(&kv->cv, &kv->mu, &until) != 0 && find(kv, keys[i]) < 0)
                return C10D_ETIMEDOUT;
    return 0;
}

#define LOCKED(kv, expr)                                                                           \
    do {                                                                                           \
        pthread_mutex_lock(&(kv)->mu);                                                             \
        int rc_ = (expr);                                                                          \
        pthread_mutex_unlock(&(kv)->mu);                                                           \
        return rc_;                                                                                \
    } while (0)

static int kv_set(void *ctx, const char *key, const void *v, size_t len)
{
    struct kv *kv = ctx;
    if (kv->fail_set)
        return C10D_EIO;
    int delay = atomic_load(&kv->set_delay_ms);
    if (delay > 0)
        usleep((useconds_t)delay * 1000);
    LOCKED(kv, put(kv, key, v, len));
}

static int get_locked(struct kv *kv, const char *key, int64_t ms, void **v, size_t *len)
{
    int rc = wait_locked(kv, &key, 1, ms);
    if (rc == 0)
        *v = copy(kv, find(kv, key), len);
    return rc;
}

static int kv_get(void *ctx, const char *key, int64_t ms, void **v, size_t *len)
{
    LOCKED((struct kv *)ctx, get_locked(ctx, key, ms, v, len));
}

static int add_locked(struct kv *kv, const char *key, int64_t delta, int64_t *out)
{
    long i = find(kv, key);
    *out = (i < 0 ? 0 : strtoll(kv->vals[i], NULL, 10)) + delta;
    char buf[32];
    return put(kv, key, buf, (size_t)snprintf(buf, sizeof buf, "%lld", (long long)*out));
}

static int kv_add(void *ctx, const char *key, int64_t delta, int64_t *out)
{
    LOCKED((struct kv *)ctx, add_locked(ctx, key, delta, out));
}

static int check_locked(struct kv *kv, const char *const *keys, size_t n, int *ready)
{
    *ready = 1;
    for (size_t i = 0; i < n; i++)
        *ready &= find(kv, keys[i]) >= 0;
    return 0;
}

static int kv_check(void *ctx, const char *const *keys, size_t n, int *ready)
{
    LOCKED((struct kv *)ctx, check_locked(ctx, keys, n, ready));
}

static int kv_wait(void *ctx, const char *const *keys, size_t n, int64_t ms)
{
    LOCKED((struct kv *)ctx, wait_locked(ctx, keys, n, ms));
}

static int cas_locked(struct kv *kv, const char *key, const void *exp, size_t elen,
                      const void *want, size_t wlen, void **v, size_t *len)
{
    long i = find(kv, key);
    if ((i < 0 && elen == 0) ||
        (i >= 0 && kv->lens[i] == elen && memcmp(kv->vals[i], exp, elen) == 0))
        put(kv, key, want, wlen);
    else if (i < 0)
        return *v = memcpy(malloc(elen + 1), exp, elen), *len = elen, 0;
    *v = copy(kv, find(kv, key), len);
    return 0;
}

static int kv_compare_set(void *ctx, const char *key, const void *exp, size_t elen,
                          const void *want, size_t wlen, void **v, size_t *len)
{
    LOCKED((struct kv *)ctx, cas_locked(ctx, key, exp, elen, want, wlen, v, len));
}

static int delete_locked(struct kv *kv, const char *key, int *deleted)
{
    long i = find(kv, key);
    *deleted = i >= 0;
    if (i >= 0) {
        free(kv->keys[i]);
        free(kv->vals[i]);
        kv->n--;
        kv->keys[i] = kv->keys[kv->n], kv->vals[i] = kv->vals[kv->n];
        kv->lens[i] = kv->lens[kv->n];
    }
    return 0;
}

static int kv_delete(void *ctx, const char *key, int *deleted)
{
    LOCKED((struct kv *)ctx, delete_locked(ctx, key, deleted));
}

static int kv_num_keys(void *ctx, int64_t *count)
{
    struct kv *kv = ctx;
    LOCKED(kv, (*count = (int64_t)kv->n, 0));
}

static const char *kv_error(void *ctx)
{
    return ((struct kv *)ctx)->fail_set ? "the disk is on fire" : NULL;
}

static void kv_destroy(void *ctx)
{
    struct kv *kv = ctx;
    for (size_t i = 0; i < kv->n; i++)
        free(kv->keys[i]), free(kv->vals[i]);
    kv->n = 0;
    kv->destroyed = 1;
}

/* ------------------------------------------------------------------ tests */

static void kv_init(struct kv *kv)
{
    memset(kv, 0, sizeof *kv);
    pthread_mutex_init(&kv->mu, NULL);
    pthread_cond_init(&kv->cv, NULL);
}

/* full: every optional function; else only the required ones. */
static c10d_store *open_store(struct kv *kv, int full)
{
    kv_init(kv);
    c10d_store_impl im = C10D_STORE_IMPL_INIT;
    im.ctx = kv;
    im.name = full ? "kv" : "core";
    im.set = kv_set, im.get = kv_get, im.add = kv_add, im.check = kv_check, im.wait = kv_wait;
    im.delete_key = kv_delete, im.error = kv_error, im.destroy = kv_destroy;
    if (full)
        im.compare_set = kv_compare_set, im.num_keys = kv_num_keys;
    c10d_store *s = NULL;
    assert_int_equal(c10d_store_from_impl(&im, &s), 0);
    assert_string_equal(c10d_store_kind(s), "user");
    return s;
}

static void expect_val(c10d_store *s, const char *key, const char *want)
{
    void *v = NULL;
    size_t len = 0;
    assert_int_equal(c10d_store_get_sync(s, key, &v, &len), 0);
    assert_int_equal(len, strlen(want));
    assert_memory_equal(v, want, len);
    free(v);
}

static void test_conformance(void **state)
{
    (void)state;
    static struct kv kv;
    c10d_store *s = open_store(&kv, 1);
    assert_int_equal(c10d_store_set_sync(s, "a", "1", 1), 0);
    expect_val(s, "a", "1");
    int64_t n = 0;
    assert_int_equal(c10d_store_add_sync(s, "c", 2, &n), 0);
    assert_int_equal(c10d_store_add_sync(s, "c", 1, &n), 0);
    assert_int_equal(n, 3);
    expect_val(s, "c", "3");
    const char *both[] = {"a", "missing"};
    assert_int_equal(c10d_store_wait_sync(s, both, 1, 1000), 0);
    assert_int_equal(c10d_store_wait_sync(s, both, 2, 100), C10D_ETIMEDOUT);
    assert_non_null(strstr(c10d_last_error(), "user store kv: wait of key 'a' timed out"));
    int ready = -1;
    assert_int_equal(c10d_store_check_sync(s, both, 2, &ready), 0);
    assert_int_equal(ready, 0);
    assert_int_equal(c10d_store_check_sync(s, both, 1, &ready), 0);
    assert_int_equal(ready, 1);
    void *v = NULL;
    size_t len = 0;
    assert_int_equal(c10d_store_compare_set_sync(s, "a", "1", 1, "x", 1, &v, &len), 0);
    assert_memory_equal(v, "x", 1);
    free(v);
    assert_int_equal(c10d_store_compare_set_sync(s, "a", "1", 1, "y", 1, &v, &len), 0);
    assert_memory_equal(v, "x", 1); /* not the expected value: the current one */
    free(v);
    assert_int_equal(c10d_store_append_sync(s, "a", "yz", 2), 0);
    assert_int_equal(c10d_store_append_sync(s, "new", "q", 1), 0);
    expect_val(s, "a", "xyz");
    expect_val(s, "new", "q");
    const char *mk[] = {"m1", "m2"};
    const void *mv[] = {"one", "two"};
    size_t ml[] = {3, 3};
    assert_int_equal(c10d_store_multi_set_sync(s, mk, mv, ml, 2), 0);
    void *got[2];
    size_t gl[2];
    assert_int_equal(c10d_store_multi_get_sync(s, mk, 2, got, gl), 0);
    assert_memory_equal(got[0], "one", 3);
    assert_memory_equal(got[1], "two", 3);
    free(got[0]), free(got[1]);
    assert_int_equal(c10d_store_num_keys_sync(s, &n), 0);
    assert_int_equal(n, 5);
    int deleted = -1;
    assert_int_equal(c10d_store_delete_key_sync(s, "m1", &deleted), 0);
    assert_int_equal(deleted, 1);
    assert_int_equal(c10d_store_delete_key_sync(s, "m1", &deleted), 0);
    assert_int_equal(deleted, 0);
    /* GET of a key that never comes: the store's deadline */
    c10d_store_set_timeout(s, 150);
    assert_int_equal(c10d_store_get_sync(s, "never", &v, &len), C10D_ETIMEDOUT);
    c10d_store_release(s);
}

/* Commands the store lacks: derived, or refused naming what is missing. */
static void test_missing_and_errors(void **state)
{
    (void)state;
    static struct kv kv;
    c10d_store *s = open_store(&kv, 0);
    int64_t n = 0;
    assert_int_equal(c10d_store_num_keys_sync(s, &n), C10D_EUNSUPPORTED);
    assert_string_equal(c10d_last_error(), "user store core: GETNUMKEYS is not supported: the "
                                           "store's c10d_store_impl lacks num_keys");
    void *v = NULL;
    size_t len = 0;
    assert_int_equal(c10d_store_compare_set_sync(s, "a", "", 0, "1", 1, &v, &len),
                     C10D_EUNSUPPORTED);
    assert_non_null(strstr(c10d_last_error(), "lacks compare_set"));
    assert_int_equal(c10d_store_queue_push_sync(s, "q", "1", 1), C10D_EUNSUPPORTED);
    assert_non_null(strstr(c10d_last_error(), "QUEUE_PUSH is not supported"));
    char **keys = NULL;
    size_t nk = 0;
    assert_int_equal(c10d_store_list_keys_sync(s, &keys, &nk), C10D_EUNSUPPORTED);
    /* APPEND without compare_set: get + set */
    assert_int_equal(c10d_store_append_sync(s, "a", "12", 2), 0);
    assert_int_equal(c10d_store_append_sync(s, "a", "3", 1), 0);
    expect_val(s, "a", "123");
    /* the user's failure becomes the op's, with the user's words */
    kv.fail_set = 1;
    assert_int_equal(c10d_store_set_sync(s, "b", "1", 1), C10D_EIO);
    assert_string_equal(c10d_last_error(),
                        "user store core: set of key 'b' failed: the disk is on fire");
    c10d_store_release(s);
    /* bad impls */
    c10d_store_impl im = C10D_STORE_IMPL_INIT;
    im.set = kv_set, im.get = kv_get, im.add = kv_add, im.check = kv_check;
    im.delete_key = kv_delete;
    c10d_store *t = NULL;
    assert_int_equal(c10d_store_from_impl(&im, &t), C10D_EINVAL);
    assert_non_null(strstr(c10d_last_error(), "required function wait is NULL"));
    im.struct_size = 0;
    assert_int_equal(c10d_store_from_impl(&im, &t), C10D_EINVAL);
    assert_null(t);
}

struct getter {
    c10d_store *s;
    int rc;
    char value[16];
};

static void *get_thread(void *p)
{
    struct getter *g = p;
    void *v = NULL;
    size_t len = 0;
    g->rc = c10d_store_get_sync(g->s, "late", &v, &len);
    if (g->rc == 0)
        snprintf(g->value, sizeof g->value, "%.*s", (int)len, (char *)v);
    free(v);
    return NULL;
}

/* A GET blocked in the user's function does not hold up a SET or an ADD. */
static void test_get_does_not_block_set(void **state)
{
    (void)state;
    static struct kv kv;
    c10d_store *s = open_store(&kv, 1);
    struct getter g = {s, -1, ""};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, get_thread, &g), 0);
    usleep(100000);
    int64_t n = 0;
    assert_int_equal(c10d_store_add_sync(s, "other", 1, &n), 0);
    assert_int_equal(g.rc, -1); /* still waiting */
    assert_int_equal(c10d_store_set_sync(s, "late", "here", 4), 0);
    pthread_join(th, NULL);
    assert_int_equal(g.rc, 0);
    assert_string_equal(g.value, "here");
    c10d_store_release(s);
}

struct rank_arg {
    c10d_store *store;
    int rank;
    int rc;
    int32_t sum;
};

static void *rank_main(void *p)
{
    struct rank_arg *a = p;
    /* What c10d_pg_init does with a store, less what a process has once (the
     * default group; the settings check, whose keys are numbered per
     * process): the tcp backend's start over the store. */
    c10d_pg *pg = NULL;
    a->rc = c10d__pg_create_with_backend(&c10d__tcp_backend, a->store, a->rank, 2, 30000, &pg);
    if (a->rc != 0) {
        fprintf(stderr, "rank %d: init: %s\n", a->rank, c10d_last_error());
        return NULL;
    }
    int32_t x = a->rank + 1;
    a->rc = c10d_all_reduce_sync(pg, &x, &a->sum, 1, C10D_INT32, C10D_SUM);
    if (a->rc == 0)
        a->rc = c10d_store_barrier(a->store, "user", 2, 30000);
    if (a->rc == 0)
        a->rc = c10d_barrier_sync(pg);
    if (a->rc != 0)
        fprintf(stderr, "rank %d: %s\n", a->rank, c10d_last_error());
    int rc = c10d_pg_destroy(pg);
    if (a->rc == 0)
        a->rc = rc;
    return NULL;
}

/* A group of two ranks (threads: a process has one default group, so the
 * group is made the way c10d_pg_init makes it) over a store with the
 * required functions only. */
static void test_process_group(void **state)
{
    (void)state;
    static struct kv kv;
    c10d_store *s = open_store(&kv, 0);
    struct rank_arg args[2];
    pthread_t th[2];
    for (int r = 0; r < 2; r++) {
        args[r] = (struct rank_arg){s, r, -1, 0};
        assert_int_equal(pthread_create(&th[r], NULL, rank_main, &args[r]), 0);
    }
    for (int r = 0; r < 2; r++) {
        pthread_join(th[r], NULL);
        assert_int_equal(args[r].rc, 0);
        assert_int_equal(args[r].sum, 3);
    }
    c10d_store_release(s);
}

struct barrier_arg {
    c10d_store *store;
    int rc;
    char msg[600];
};

static void *barrier_thread(void *p)
{
    struct barrier_arg *a = p;
    a->rc = c10d_store_barrier(a->store, "all", 3, 10000);
    if (a->rc != 0)
        snprintf(a->msg, sizeof a->msg, "%s", c10d_last_error());
    return NULL;
}

/* The store barrier cleans up after itself on a user store as well. */
static void test_barrier_leaves_no_keys(void **state)
{
    (void)state;
    static struct kv kv;
    c10d_store *s = open_store(&kv, 1);
    struct barrier_arg args[3];
    pthread_t th[3];
    for (int i = 0; i < 3; i++) {
        args[i] = (struct barrier_arg){s, -1, ""};
        assert_int_equal(pthread_create(&th[i], NULL, barrier_thread, &args[i]), 0);
    }
    for (int i = 0; i < 3; i++) {
        pthread_join(th[i], NULL);
        if (args[i].rc != 0)
            fprintf(stderr, "barrier %d: %s\n", i, args[i].msg);
        assert_int_equal(args[i].rc, 0);
    }
    int64_t n = -1;
    assert_int_equal(c10d_store_num_keys_sync(s, &n), 0);
    assert_int_equal(n, 0);
    c10d_store_release(s);
}

static void *slow_set_thread(void *p)
{
    struct getter *g = p;
    g->rc = c10d_store_set_sync(g->s, "slow", "x", 1);
    return NULL;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* c10d_shutdown while a set sits in the user's function for longer than the
 * shutdown waits: it returns, the waiting caller gets an error, and when the
 * function comes back later the store goes on in order (its next set runs;
 * under ASan: nothing leaks). */
static void test_shutdown_with_op_in_user_function(void **state)
{
    (void)state;
    static struct kv kv;
    c10d_store *s = open_store(&kv, 1);
    atomic_store(&kv.set_delay_ms, 3000);
    struct getter g = {s, 1, ""};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, slow_set_thread, &g), 0);
    usleep(200000); /* the set is in kv_set now */
    double t0 = now_s();
    c10d_shutdown();
    double took = now_s() - t0;
    pthread_join(th, NULL);
    assert_true(g.rc < 0);
    assert_true(took < 10.0); /* bounded (the grace is 2 s), not a hang */
    atomic_store(&kv.set_delay_ms, 0);
    usleep(3200000); /* the left-behind set returns, on a new engine */
    assert_int_equal(c10d_store_set_sync(s, "after", "y", 1), 0);
    expect_val(s, "after", "y");
    c10d_store_release(s);
}

static int teardown(void **state)
{
    (void)state;
    c10d_shutdown();
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conformance),
        cmocka_unit_test(test_missing_and_errors),
        cmocka_unit_test(test_get_does_not_block_set),
        cmocka_unit_test(test_barrier_leaves_no_keys),
        cmocka_unit_test(test_process_group),
        cmocka_unit_test(test_shutdown_with_op_in_user_function),
    };
    return cmocka_run_group_tests(tests, NULL, teardown);
}
