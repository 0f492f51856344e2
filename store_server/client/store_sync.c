/* Blocking store calls: a store work submitted and waited for, the result
 * read from the op in place. Every blocking store call goes through
 * run_and_wait (the public _sync wrappers and the stores' own ops, such as the
 * TCP store's connect), so no caller blocks past an op's deadline plus a
 * margin. */
#include "store.h"

#include "engine/work.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The loop finishes every op by its deadline; this margin only guards
 * against a bug or a stuck callback of another op on the loop thread. */
#define GRACE_MS 30000

/* Waits for w (its op's deadline is deadline_ms from now). Returns the op's
 * status with c10d_last_error() set; when the wait gives up, *gave_up = 1
 * and w is released (the loop finishes and frees it, if ever). */
static int wait_op(c10d_work *w, int64_t deadline_ms, const char *what, int *gave_up)
{
    int rc = c10d__work_wait(w, deadline_ms + GRACE_MS);
    *gave_up = rc == C10D_ETIMEDOUT && c10d_work_test(w) == 0;
    if (*gave_up) {
        c10d_work_release(w);
        return c10d__fail(C10D_EINTERNAL,
                          "store %s: no answer %lld ms after the deadline (loop thread blocked?)",
                          what, (long long)GRACE_MS);
    }
    return rc;
}

static int refuse_on_loop(const char *what)
{
    return c10d__fail(C10D_EDEADLK,
                      "store %s_sync: called on the loop thread (from a callback); use "
                      "c10d_store_submit and a work callback",
                      what);
}

int c10d__store_op_run_sync(c10d_store *s, struct c10d__store_op *op, int64_t timeout_ms,
                            int64_t *value)
{
    const char *what = c10d__wire_cmd_name(op->req.cmd);
    if (c10d__on_loop_thread()) {
        c10d__store_op_discard(op);
        return c10d__fail(C10D_EDEADLK, "store %s: a blocking op on the loop thread", what);
    }
    op->timeout_ms = timeout_ms;
    c10d_work *w;
    C10D_CHECK(c10d__store_op_submit(s, op, &w));
    int gave_up;
    int rc = wait_op(w, timeout_ms > 0 ? timeout_ms : c10d_store_timeout(s), what, &gave_up);
    if (gave_up)
        return rc;
    if (rc >= 0 && value)
        *value = c10d__store_op_of(w)->res.value;
    c10d_work_release(w);
    return rc;
}

/* Submits q and waits. On success (0) *out is the op, valid until *work is
 * released; on failure nothing is left to release. */
static int run_and_wait(c10d_store *s, const c10d_store_request *q, const char *what,
                        c10d_work **work, struct c10d__store_op **out)
{
    *work = NULL;
    *out = NULL;
    if (c10d__on_loop_thread())
        return refuse_on_loop(what);
    c10d_work *w;
    C10D_CHECK(c10d_store_submit(s, q, &w));
    int64_t tmo = q->timeout_ms > 0 ? q->timeout_ms : c10d_store_timeout(s);
    int gave_up;
    int rc = wait_op(w, tmo, what, &gave_up);
    if (gave_up)
        return rc;
    if (rc < 0) {
        c10d_work_release(w);
        return rc;
    }
    *work = w;
    *out = c10d__store_op_of(w);
    return rc;
}

/* Runs q for its status and value only. */
static int run_value(c10d_store *s, const c10d_store_request *q, const char *what, int64_t *value)
{
    c10d_work *w;
    struct c10d__store_op *op;
    int rc = run_and_wait(s, q, what, &w, &op);
    if (rc < 0)
        return rc;
    if (value)
        *value = op->res.value;
    c10d_work_release(w);
    return rc;
}

/* Runs q and hands its value out (malloc'd, NUL-terminated past *len). */
static int run_data(c10d_store *s, const c10d_store_request *q, const char *what, void **value,
                    size_t *len)
{
    c10d_work *w;
    struct c10d__store_op *op;
    int rc = run_and_wait(s, q, what, &w, &op);
    if (rc < 0)
        return rc;
    void *data = op->res_data;
    size_t n = data ? op->res.data.len : 0;
    op->res_data = NULL;
    op->res.data.data = NULL;
    c10d_work_release(w);
    if (!data && !(data = calloc(1, 1)))
        return c10d__fail(C10D_ENOMEM, "store %s_sync: out of memory", what);
    if (value)
        *value = data;
    else
        free(data);
    if (len)
        *len = n;
    return rc;
}

#define REQUEST(...) ((c10d_store_request){.struct_size = sizeof(c10d_store_request), __VA_ARGS__})

int c10d_store_set_sync(c10d_store *s, const char *key, const void *value, size_t len)
{
    c10d_store_request q = REQUEST(.op = C10D_STORE_OP_SET, .key = key, .value = value, .len = len);
    return run_value(s, &q, "set", NULL);
}

int c10d_store_server_stats_sync(c10d_store *s, char **json)
{
    if (!json)
        return c10d__fail(C10D_EINVAL, "store server_stats_sync: json must not be NULL");
    *json = NULL;
    c10d_store_request q = REQUEST(.op = C10D_STORE_OP_SERVER_STATS);
    return run_data(s, &q, "server_stats", (void **)json, NULL);
}

int c10d_store_get_sync(c10d_store *s, const char *key, void **value, size_t *len)
{
    c10d_store_request q = REQUEST(.op = C10D_STORE_OP_GET, .key = key);
    return run_data(s, &q, "get", value, len);
}

int c10d__store_get_text_sync(c10d_store *s, const char *key, char *text, size_t cap, size_t *len)
{
    void *v = NULL;
    size_t n = 0;
    C10D_CHECK(c10d_store_get_sync(s, key, &v, &n));
    snprintf(text, cap, "%.*s", (int)(n < cap ? n : cap - 1), (const char *)v);
    free(v);
    if (len != NULL)
        *len = n;
    return 0;
}

int c10d__store_get_within_sync(c10d_store *s, const char *key, int64_t timeout_ms, void **value,
                                size_t *len)
{
    c10d_store_request q = REQUEST(.op = C10D_STORE_OP_GET, .key = key, .timeout_ms = timeout_ms);
    return run_data(s, &q, "get", value, len);
}

int c10d_store_add_sync(c10d_store *s, const char *key, int64_t delta, int64_t *result)
{
    c10d_store_request q = REQUEST(.op = C10D_STORE_OP_ADD, .key = key, .delta = delta);
    return run_value(s, &q, "add", result);
}

int c10d_store_compare_set_sync(c10d_store *s, const char *key, const void *expected,
                                size_t expected_len, const void *desired, size_t desired_len,
                                void **value, size_t *len)
{
    c10d_store_request q =
        REQUEST(.op = C10D_STORE_OP_COMPARE_SET, .key = key, .expected = expected,
                .expected_len = expected_len, .value = desired, .len = desired_len);
    return run_data(s, &q, "compare_set", value, len);
}

int c10d_store_wait_sync(c10d_store *s, const char *const *keys, size_t n, int64_t timeout_ms)
{
    c10d_store_request q =
        REQUEST(.op = C10D_STORE_OP_WAIT, .keys = keys, .nkeys = n, .timeout_ms = timeout_ms);
    return run_value(s, &q, "wait", NULL);
}

int c10d_store_check_sync(c10d_store *s, const char *const *keys, size_t n, int *ready)
{
    c10d_store_request q = REQUEST(.op = C10D_STORE_OP_CHECK, .keys = keys, .nkeys = n);
    int64_t v = 0;
    int rc = run_value(s, &q, "check", &v);
    if (rc >= 0 && ready)
        *ready = (int)v;
    return rc;
}

int c10d_store_delete_key_sync(c10d_store *s, const char *key, int *deleted)
{
    c10d_store_request q = REQUEST(.op = C10D_STORE_OP_DELETE_KEY, .key = key);
    int64_t v = 0;
    int rc = run_value(s, &q, "delete_key", &v);
    if (rc >= 0 && deleted)
        *deleted = (int)v;
    return rc;
}

int c10d_store_num_keys_sync(c10d_store *s, int64_t *count)
{
    c10d_store_request q = REQUEST(.op = C10D_STORE_OP_NUM_KEYS);
    return run_value(s, &q, "num_keys", count);
}

int c10d_store_append_sync(c10d_store *s, const char *key, const void *value, size_t len)
{
    c10d_store_request q =
        REQUEST(.op = C10D_STORE_OP_APPEND, .key = key, .value = value, .len = len);
    return run_value(s, &q, "append", NULL);
}

int c10d_store_multi_get_sync(c10d_store *s, const char *const *keys, size_t n, void **values,
                              size_t *lens)
{
    if (n && !values)
        return c10d__fail(C10D_EINVAL, "store multi_get_sync: values is NULL");
    c10d_store_request q = REQUEST(.op = C10D_STORE_OP_MULTI_GET, .keys = keys, .nkeys = n);
    c10d_work *w;
    struct c10d__store_op *op;
    int rc = run_and_wait(s, &q, "multi_get", &w, &op);
    if (rc < 0)
        return rc;
    for (size_t i = 0; i < n; i++)
        values[i] = NULL;
    const c10d_store_result *r = &op->res;
    for (size_t i = 0; i < n && i < r->count; i++) {
        if (!(values[i] = malloc(r->items[i].len + 1))) {
            for (size_t j = 0; j < i; j++) {
                free(values[j]);
                values[j] = NULL;
            }
            rc = c10d__fail(C10D_ENOMEM, "store multi_get_sync: out of memory");
            break;
        }
        memcpy(values[i], r->items[i].data, r->items[i].len + 1);
        if (lens)
            lens[i] = r->items[i].len;
    }
    c10d_work_release(w);
    return rc;
}

int c10d_store_multi_set_sync(c10d_store *s, const char *const *keys, const void *const *values,
                              const size_t *lens, size_t n)
{
    c10d_store_request q = REQUEST(.op = C10D_STORE_OP_MULTI_SET, .keys = keys, .values = values,
                                   .lens = lens, .nkeys = n);
    return run_value(s, &q, "multi_set", NULL);
}

int c10d_store_queue_push_sync(c10d_store *s, const char *key, const void *value, size_t len)
{
    c10d_store_request q =
        REQUEST(.op = C10D_STORE_OP_QUEUE_PUSH, .key = key, .value = value, .len = len);
    return run_value(s, &q, "queue_push", NULL);
}

int c10d_store_queue_pop_sync(c10d_store *s, const char *key, int block, void **value, size_t *len)
{
    c10d_store_request q = REQUEST(.op = C10D_STORE_OP_QUEUE_POP, .key = key, .block = block);
    return run_data(s, &q, "queue_pop", value, len);
}

int c10d_store_queue_len_sync(c10d_store *s, const char *key, int64_t *len)
{
    c10d_store_request q = REQUEST(.op = C10D_STORE_OP_QUEUE_LEN, .key = key);
    return run_value(s, &q, "queue_len", len);
}

int c10d_store_list_keys_sync(c10d_store *s, char ***keys, size_t *n)
{
    if (!keys || !n)
        return c10d__fail(C10D_EINVAL, "store list_keys_sync: keys and n must not be NULL");
    c10d_store_request q = REQUEST(.op = C10D_STORE_OP_LIST_KEYS);
    c10d_work *w;
    struct c10d__store_op *op;
    int rc = run_and_wait(s, &q, "list_keys", &w, &op);
    if (rc < 0)
        return rc;
    const c10d_store_result *r = &op->res;
    char **k = calloc(r->count + 1, sizeof *k);
    for (size_t i = 0; k && i < r->count; i++) {
        if (!(k[i] = strdup(r->items[i].data))) {
            for (size_t j = 0; j < i; j++)
                free(k[j]);
            free(k);
            k = NULL;
        }
    }
    if (k) {
        *keys = k;
        *n = r->count;
    } else {
        rc = c10d__fail(C10D_ENOMEM, "store list_keys_sync: out of memory");
    }
    c10d_work_release(w);
    return rc;
}

int c10d_store_ping_sync(c10d_store *s, int64_t *rtt_us)
{
    c10d_store_request q = REQUEST(.op = C10D_STORE_OP_PING);
    return run_value(s, &q, "ping", rtt_us);
}
