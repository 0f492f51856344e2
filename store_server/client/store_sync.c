/* Blocking store calls: the async op plus a condition variable, the one
 * waiter every blocking store call goes through (the public _sync wrappers and
 * the stores' own ops, such as the TCP store's connect), so that no caller can
 * block past an op's deadline plus a margin. The results are copied (malloc)
 * in the callback, since the op's buffers die with it. */
#include "store.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The loop finishes every op by its deadline; this margin only guards
 * against a bug or a stuck callback of another op on the loop thread. */
#define GRACE_MS 30000

struct sync_call {
    atomic_int refs; /* the waiter and the callback */
    uv_mutex_t mutex;
    uv_cond_t cond;
    int done;
    int status;
    char message[512];
    int64_t value;
    int want; /* what to copy */
    void *data;
    size_t len;
    size_t count;
    c10d_store_bytes *items; /* one block: array then bytes */
};

enum { WANT_NONE = 0, WANT_DATA = 1, WANT_ITEMS = 2 };

static void sync_unref(struct sync_call *c)
{
    if (atomic_fetch_sub(&c->refs, 1) != 1)
        return;
    uv_mutex_destroy(&c->mutex);
    uv_cond_destroy(&c->cond);
    free(c->data);
    free(c->items);
    free(c);
}

static void copy_result(struct sync_call *c, const c10d_store_result *r)
{
    c->value = r->value;
    if (c->want & WANT_DATA) {
        c->data = malloc(r->data.len + 1);
        if (!c->data) {
            c->status = C10D_ENOMEM;
            snprintf(c->message, sizeof c->message, "store: out of memory for a result");
            return;
        }
        if (r->data.len)
            memcpy(c->data, r->data.data, r->data.len);
        ((char *)c->data)[r->data.len] = 0;
        c->len = r->data.len;
    }
    if (c->want & WANT_ITEMS) {
        size_t bytes = 0;
        for (size_t i = 0; i < r->count; i++)
            bytes += r->items[i].len + 1;
        c->items = malloc(r->count * sizeof *c->items + bytes + 1);
        if (!c->items) {
            c->status = C10D_ENOMEM;
            snprintf(c->message, sizeof c->message, "store: out of memory for a result");
            return;
        }
        char *p = (char *)(c->items + r->count);
        for (size_t i = 0; i < r->count; i++) {
            if (r->items[i].len)
                memcpy(p, r->items[i].data, r->items[i].len);
            p[r->items[i].len] = 0;
            c->items[i].data = p;
            c->items[i].len = r->items[i].len;
            p += r->items[i].len + 1;
        }
        c->count = r->count;
    }
}

static void sync_cb(const c10d_store_result *r, void *arg)
{
    struct sync_call *c = arg;
    uv_mutex_lock(&c->mutex);
    c->status = r->status;
    if (r->status < 0)
        snprintf(c->message, sizeof c->message, "%s", r->message);
    else
        copy_result(c, r);
    c->done = 1;
    uv_cond_signal(&c->cond);
    uv_mutex_unlock(&c->mutex);
    sync_unref(c);
}

static struct sync_call *sync_new(int want)
{
    struct sync_call *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    atomic_init(&c->refs, 2);
    uv_mutex_init(&c->mutex);
    uv_cond_init(&c->cond);
    c->want = want;
    return c;
}

/* Waits for the callback; returns the op's status with c10d_last_error set. */
static int sync_wait(struct sync_call *c, int64_t timeout_ms, const char *what, int *abandoned)
{
    *abandoned = 0;
    uint64_t limit_ns = (uint64_t)(timeout_ms + GRACE_MS) * 1000000u;
    uint64_t start = uv_hrtime();
    uv_mutex_lock(&c->mutex);
    while (!c->done) {
        uint64_t spent = uv_hrtime() - start;
        if (spent >= limit_ns || uv_cond_timedwait(&c->cond, &c->mutex, limit_ns - spent) != 0) {
            if (c->done)
                break;
            uv_mutex_unlock(&c->mutex);
            sync_unref(c);
            *abandoned = 1;
            return c10d__fail(C10D_EINTERNAL,
                              "store %s: no answer %lld ms after the deadline (loop thread "
                              "blocked?)",
                              what, (long long)GRACE_MS);
        }
    }
    uv_mutex_unlock(&c->mutex);
    int rc = c->status;
    if (rc < 0)
        c10d__fail(rc, "%s", c->message);
    return rc;
}

int c10d__store_op_run_sync(c10d_store *s, struct c10d__store_op *op, int64_t timeout_ms,
                            int64_t *value)
{
    /* Named now: once submitted, the op is the loop's to free. */
    const char *what = c10d__store_cmd_name(op->req.cmd);
    if (c10d__on_loop_thread()) {
        c10d__store_op_free(op);
        return c10d__fail(C10D_EDEADLK, "store %s: a blocking op on the loop thread", what);
    }
    struct sync_call *c = sync_new(WANT_NONE);
    if (!c) {
        c10d__store_op_free(op);
        return c10d__fail(C10D_ENOMEM, "store %s: out of memory", what);
    }
    int64_t tmo = timeout_ms > 0 ? timeout_ms : c10d_store_timeout(s);
    op->cb = sync_cb;
    op->arg = c;
    op->timeout_ms = timeout_ms;
    int rc = c10d__store_op_submit(s, op);
    if (rc < 0) {
        sync_unref(c);
        sync_unref(c);
        return rc;
    }
    int abandoned;
    rc = sync_wait(c, tmo, what, &abandoned);
    if (abandoned)
        return rc;
    if (rc >= 0 && value)
        *value = c->value;
    sync_unref(c);
    return rc;
}

/* The common shape of every wrapper. */
#define SYNC_BEGIN(s, want, what)                                                                  \
    if (c10d__on_loop_thread())                                                                    \
        return c10d__fail(C10D_EDEADLK,                                                            \
                          "store %s_sync: called on the loop thread (from a "                      \
                          "callback); use the async form",                                         \
                          what);                                                                   \
    struct sync_call *c = sync_new(want);                                                          \
    if (!c)                                                                                        \
        return c10d__fail(C10D_ENOMEM, "store %s_sync: out of memory", what);                      \
    int64_t tmo = c10d_store_timeout(s)

#define SYNC_SUBMIT(expr, what)                                                                    \
    do {                                                                                           \
        int rc_ = (expr);                                                                          \
        if (rc_ < 0) {                                                                             \
            sync_unref(c);                                                                         \
            sync_unref(c);                                                                         \
            return rc_;                                                                            \
        }                                                                                          \
    } while (0)

static void take_data(struct sync_call *c, void **value, size_t *len)
{
    if (value) {
        *value = c->data;
        c->data = NULL;
    }
    if (len)
        *len = c->len;
}

/* Every wrapper ends the same way: on success, take the outputs. */
#define SYNC_RETURN(what, on_success)                                                              \
    int abandoned_;                                                                                \
    int rc = sync_wait(c, tmo, what, &abandoned_);                                                 \
    if (abandoned_)                                                                                \
        return rc;                                                                                 \
    if (rc >= 0) {                                                                                 \
        on_success;                                                                                \
    }                                                                                              \
    sync_unref(c);                                                                                 \
    return rc

int c10d_store_set_sync(c10d_store *s, const char *key, const void *value, size_t len)
{
    SYNC_BEGIN(s, WANT_NONE, "set");
    SYNC_SUBMIT(c10d_store_set(s, key, value, len, sync_cb, c), "set");
    SYNC_RETURN("set", (void)0);
}

int c10d_store_server_stats_sync(c10d_store *s, char **json)
{
    if (!json)
        return c10d__fail(C10D_EINVAL, "store server_stats_sync: json must not be NULL");
    *json = NULL;
    SYNC_BEGIN(s, WANT_DATA, "server_stats");
    SYNC_SUBMIT(c10d_store_server_stats(s, sync_cb, c), "server_stats");
    SYNC_RETURN("server_stats", take_data(c, (void **)json, NULL)); /* NUL-terminated */
}

int c10d_store_get_sync(c10d_store *s, const char *key, void **value, size_t *len)
{
    SYNC_BEGIN(s, WANT_DATA, "get");
    SYNC_SUBMIT(c10d_store_get(s, key, sync_cb, c), "get");
    SYNC_RETURN("get", take_data(c, value, len));
}

int c10d_store_add_sync(c10d_store *s, const char *key, int64_t delta, int64_t *result)
{
    SYNC_BEGIN(s, WANT_NONE, "add");
    SYNC_SUBMIT(c10d_store_add(s, key, delta, sync_cb, c), "add");
    SYNC_RETURN("add", if (result) *result = c->value);
}

int c10d_store_compare_set_sync(c10d_store *s, const char *key, const void *expected,
                                size_t expected_len, const void *desired, size_t desired_len,
                                void **value, size_t *len)
{
    SYNC_BEGIN(s, WANT_DATA, "compare_set");
    SYNC_SUBMIT(
        c10d_store_compare_set(s, key, expected, expected_len, desired, desired_len, sync_cb, c),
        "compare_set");
    SYNC_RETURN("compare_set", take_data(c, value, len));
}

int c10d_store_wait_sync(c10d_store *s, const char *const *keys, size_t n, int64_t timeout_ms)
{
    SYNC_BEGIN(s, WANT_NONE, "wait");
    if (timeout_ms > 0)
        tmo = timeout_ms;
    SYNC_SUBMIT(c10d_store_wait(s, keys, n, timeout_ms, sync_cb, c), "wait");
    SYNC_RETURN("wait", (void)0);
}

int c10d_store_check_sync(c10d_store *s, const char *const *keys, size_t n, int *ready)
{
    SYNC_BEGIN(s, WANT_NONE, "check");
    SYNC_SUBMIT(c10d_store_check(s, keys, n, sync_cb, c), "check");
    SYNC_RETURN("check", if (ready) *ready = (int)c->value);
}

int c10d_store_delete_key_sync(c10d_store *s, const char *key, int *deleted)
{
    SYNC_BEGIN(s, WANT_NONE, "delete_key");
    SYNC_SUBMIT(c10d_store_delete_key(s, key, sync_cb, c), "delete_key");
    SYNC_RETURN("delete_key", if (deleted) *deleted = (int)c->value);
}

int c10d_store_num_keys_sync(c10d_store *s, int64_t *count)
{
    SYNC_BEGIN(s, WANT_NONE, "num_keys");
    SYNC_SUBMIT(c10d_store_num_keys(s, sync_cb, c), "num_keys");
    SYNC_RETURN("num_keys", if (count) *count = c->value);
}

int c10d_store_append_sync(c10d_store *s, const char *key, const void *value, size_t len)
{
    SYNC_BEGIN(s, WANT_NONE, "append");
    SYNC_SUBMIT(c10d_store_append(s, key, value, len, sync_cb, c), "append");
    SYNC_RETURN("append", (void)0);
}

static int take_items(struct sync_call *c, size_t n, void **values, size_t *lens)
{
    for (size_t i = 0; i < n; i++)
        values[i] = NULL;
    for (size_t i = 0; i < n && i < c->count; i++) {
        values[i] = malloc(c->items[i].len + 1);
        if (!values[i]) {
            for (size_t j = 0; j < i; j++) {
                free(values[j]);
                values[j] = NULL;
            }
            return c10d__fail(C10D_ENOMEM, "store multi_get_sync: out of memory");
        }
        memcpy(values[i], c->items[i].data, c->items[i].len + 1);
        if (lens)
            lens[i] = c->items[i].len;
    }
    return 0;
}

int c10d_store_multi_get_sync(c10d_store *s, const char *const *keys, size_t n, void **values,
                              size_t *lens)
{
    if (n && !values)
        return c10d__fail(C10D_EINVAL, "store multi_get_sync: values is NULL");
    SYNC_BEGIN(s, WANT_ITEMS, "multi_get");
    SYNC_SUBMIT(c10d_store_multi_get(s, keys, n, sync_cb, c), "multi_get");
    SYNC_RETURN("multi_get", rc = take_items(c, n, values, lens));
}

int c10d_store_multi_set_sync(c10d_store *s, const char *const *keys, const void *const *values,
                              const size_t *lens, size_t n)
{
    SYNC_BEGIN(s, WANT_NONE, "multi_set");
    SYNC_SUBMIT(c10d_store_multi_set(s, keys, values, lens, n, sync_cb, c), "multi_set");
    SYNC_RETURN("multi_set", (void)0);
}

int c10d_store_queue_push_sync(c10d_store *s, const char *key, const void *value, size_t len)
{
    SYNC_BEGIN(s, WANT_NONE, "queue_push");
    SYNC_SUBMIT(c10d_store_queue_push(s, key, value, len, sync_cb, c), "queue_push");
    SYNC_RETURN("queue_push", (void)0);
}

int c10d_store_queue_pop_sync(c10d_store *s, const char *key, int block, void **value, size_t *len)
{
    SYNC_BEGIN(s, WANT_DATA, "queue_pop");
    SYNC_SUBMIT(c10d_store_queue_pop(s, key, block, sync_cb, c), "queue_pop");
    SYNC_RETURN("queue_pop", take_data(c, value, len));
}

int c10d_store_queue_len_sync(c10d_store *s, const char *key, int64_t *len)
{
    SYNC_BEGIN(s, WANT_NONE, "queue_len");
    SYNC_SUBMIT(c10d_store_queue_len(s, key, sync_cb, c), "queue_len");
    SYNC_RETURN("queue_len", if (len) *len = c->value);
}

static int take_keys(struct sync_call *c, char ***keys, size_t *n)
{
    char **k = calloc(c->count + 1, sizeof *k);
    if (!k)
        return c10d__fail(C10D_ENOMEM, "store list_keys_sync: out of memory");
    for (size_t i = 0; i < c->count; i++) {
        k[i] = strdup(c->items[i].data);
        if (!k[i]) {
            for (size_t j = 0; j < i; j++)
                free(k[j]);
            free(k);
            return c10d__fail(C10D_ENOMEM, "store list_keys_sync: out of memory");
        }
    }
    *keys = k;
    *n = c->count;
    return 0;
}

int c10d_store_list_keys_sync(c10d_store *s, char ***keys, size_t *n)
{
    if (!keys || !n)
        return c10d__fail(C10D_EINVAL, "store list_keys_sync: keys and n must not be NULL");
    SYNC_BEGIN(s, WANT_ITEMS, "list_keys");
    SYNC_SUBMIT(c10d_store_list_keys(s, sync_cb, c), "list_keys");
    SYNC_RETURN("list_keys", rc = take_keys(c, keys, n));
}

int c10d_store_ping_sync(c10d_store *s, int64_t *rtt_us)
{
    SYNC_BEGIN(s, WANT_NONE, "ping");
    SYNC_SUBMIT(c10d_store_ping(s, sync_cb, c), "ping");
    SYNC_RETURN("ping", if (rtt_us) *rtt_us = c->value);
}
