/* Store ops and the public async entry points: check on the caller's thread,
 * copy, post to the loop, finish exactly once there. */
#include "store.h"

#include "engine/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_TIMEOUT_MS 300000

void c10d__store_init(c10d_store *s, const struct c10d__store_vtable *vt)
{
    s->vt = vt;
    atomic_init(&s->users, 1);
    atomic_init(&s->refs, 1);
    atomic_init(&s->timeout_ms, DEFAULT_TIMEOUT_MS);
    s->dialect = 0;
}

void c10d__store_ref(c10d_store *s)
{
    atomic_fetch_add(&s->refs, 1);
}

void c10d__store_unref(c10d_store *s)
{
    if (atomic_fetch_sub(&s->refs, 1) == 1)
        s->vt->destroy(s);
}

int c10d__store_route(c10d_store *s, struct c10d__store_route *out)
{
    if (s == NULL || s->vt->route == NULL)
        return C10D_ENOTFOUND;
    return s->vt->route(s, out);
}

void c10d_store_retain(c10d_store *store)
{
    if (store)
        atomic_fetch_add(&store->users, 1);
}

static void close_task_fn(struct c10d__task *t)
{
    c10d_store *s = (c10d_store *)((char *)t - offsetof(c10d_store, close_task));
    s->vt->close(s);
}

void c10d_store_release(c10d_store *store)
{
    if (!store || atomic_fetch_sub(&store->users, 1) != 1)
        return;
    store->close_task.fn = close_task_fn;
    /* Without an engine (shut down or never started) nothing of the store is
     * on a loop: only memory is left. */
    if (c10d__engine_post(&store->close_task) < 0)
        c10d__store_unref(store);
}

int c10d_store_set_timeout(c10d_store *store, int64_t timeout_ms)
{
    if (!store)
        return c10d__fail(C10D_EINVAL, "store set_timeout: store is NULL");
    if (timeout_ms <= 0)
        return c10d__fail(C10D_EINVAL, "store set_timeout: timeout must be > 0 ms (got %lld)",
                          (long long)timeout_ms);
    atomic_store(&store->timeout_ms, timeout_ms);
    return 0;
}

int64_t c10d_store_timeout(c10d_store *store)
{
    return store ? (int64_t)atomic_load(&store->timeout_ms) : 0;
}

const char *c10d_store_kind(c10d_store *store)
{
    return store ? store->vt->kind : "?";
}

int c10d_store_dialect_of(c10d_store *store)
{
    return store ? store->dialect : 0;
}

/* ------------------------------------------------------------------ ops */

struct c10d__store_op *c10d__store_op_new(int cmd, const struct c10d__store_str *args, size_t nargs,
                                          int64_t i64)
{
    size_t bytes = 0;
    for (size_t i = 0; i < nargs; i++)
        bytes += args[i].len + 1;
    struct c10d__store_op *op = calloc(1, sizeof *op + nargs * sizeof *op->args + bytes);
    if (!op) {
        c10d__fail(C10D_ENOMEM, "store %s: out of memory", c10d__store_cmd_name(cmd));
        return NULL;
    }
    op->args = (struct c10d__store_str *)(op + 1);
    uint8_t *p = (uint8_t *)(op->args + nargs);
    for (size_t i = 0; i < nargs; i++) {
        if (args[i].len)
            memcpy(p, args[i].data, args[i].len);
        p[args[i].len] = 0; /* keys stay usable as C strings */
        op->args[i].data = p;
        op->args[i].len = args[i].len;
        p += args[i].len + 1;
    }
    op->req.cmd = cmd;
    op->req.i64 = i64;
    op->req.nargs = nargs;
    op->req.args = op->args;
    op->res.message = "";
    return op;
}

static void op_free_result(struct c10d__store_op *op)
{
    free(op->res_data);
    free(op->res_items);
    free(op->res_message);
    op->res_data = NULL;
    op->res_items = NULL;
    op->res_message = NULL;
}

void c10d__store_op_free(struct c10d__store_op *op)
{
    if (!op)
        return;
    op_free_result(op);
    if (op->req.args != op->args)
        free((void *)op->req.args);
    free(op->list_prefix);
    free(op);
}

static void submit_task_fn(struct c10d__task *t)
{
    struct c10d__store_op *op =
        (struct c10d__store_op *)((char *)t - offsetof(struct c10d__store_op, task));
    op->deadline_ms = c10d__now_ms() + (uint64_t)op->timeout_ms;
    op->store->vt->submit(op->store, op);
}

int c10d__store_op_submit(c10d_store *s, struct c10d__store_op *op)
{
    if (op->timeout_ms <= 0)
        op->timeout_ms = atomic_load(&s->timeout_ms);
    c10d__store_ref(s);
    op->store = s;
    op->task.fn = submit_task_fn;
    int rc = c10d__engine_post(&op->task);
    if (rc < 0) {
        c10d__store_unref(s);
        c10d__store_op_free(op);
        return c10d__fail(rc, "store: the engine is shutting down");
    }
    return 0;
}

void c10d__store_op_forward(c10d_store *s, struct c10d__store_op *op)
{
    c10d_store *prev = op->store;
    c10d__store_ref(s);
    op->store = s;
    c10d__store_unref(prev);
    s->vt->submit(s, op);
}

int c10d__store_op_add_list_prefix(struct c10d__store_op *op, const char *prefix, size_t plen)
{
    size_t old = op->list_prefix ? strlen(op->list_prefix) : 0;
    char *p = malloc(plen + old + 1);
    if (!p)
        return c10d__fail(C10D_ENOMEM, "store: out of memory");
    memcpy(p, prefix, plen);
    if (old)
        memcpy(p + plen, op->list_prefix, old);
    p[plen + old] = 0;
    free(op->list_prefix);
    op->list_prefix = p;
    return 0;
}

int c10d__store_op_set_data(struct c10d__store_op *op, const void *data, size_t len)
{
    free(op->res_data);
    op->res_data = malloc(len ? len : 1);
    if (!op->res_data)
        return c10d__fail(C10D_ENOMEM, "store: out of memory for a %zu-byte value", len);
    if (len)
        memcpy(op->res_data, data, len);
    op->res.data.data = op->res_data;
    op->res.data.len = len;
    return 0;
}

static int keep_item(const struct c10d__store_op *op, struct c10d__store_str item, size_t strip,
                     size_t plen)
{
    if (!op->list_prefix)
        return 1;
    return item.len >= strip + plen && memcmp(item.data + strip, op->list_prefix, plen) == 0;
}

int c10d__store_op_set_items(struct c10d__store_op *op, const struct c10d__store_str *items,
                             size_t n, size_t strip)
{
    size_t plen = op->list_prefix ? strlen(op->list_prefix) : 0;
    size_t bytes = 0, kept = 0;
    for (size_t i = 0; i < n; i++) {
        if (!keep_item(op, items[i], strip, plen))
            continue;
        kept++;
        bytes += (items[i].len >= strip + plen ? items[i].len - strip - plen : 0) + 1;
    }
    free(op->res_items);
    op->res_items = malloc(kept * sizeof *op->res_items + bytes + 1);
    if (!op->res_items)
        return c10d__fail(C10D_ENOMEM, "store: out of memory for %zu values", n);
    uint8_t *p = (uint8_t *)(op->res_items + kept);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (!keep_item(op, items[i], strip, plen))
            continue;
        size_t skip = items[i].len >= strip + plen ? strip + plen : items[i].len;
        size_t len = items[i].len - skip;
        if (len)
            memcpy(p, items[i].data + skip, len);
        p[len] = 0;
        op->res_items[k].data = p;
        op->res_items[k].len = len;
        k++;
        p += len + 1;
    }
    op->res.items = op->res_items;
    op->res.count = kept;
    return 0;
}

static void op_vfinish(struct c10d__store_op *op, int status, const char *fmt, va_list ap)
{
    if (op->finished) {
        C10D_ERROR("store", "internal: %s finished twice", c10d__store_cmd_name(op->req.cmd));
        return;
    }
    op->finished = 1;
    op->res.status = status;
    if (status < 0) {
        char buf[512];
        vsnprintf(buf, sizeof buf, fmt ? fmt : "", ap);
        op->res_message = strdup(buf);
        op->res.message = op->res_message ? op->res_message : c10d_strerror(status);
        op->res.data.data = NULL;
        op->res.data.len = 0;
        op->res.items = NULL;
        op->res.count = 0;
    }
    c10d_store *s = op->store;
    if (op->cb)
        op->cb(&op->res, op->arg);
    c10d__store_op_free(op);
    if (s)
        c10d__store_unref(s);
}

void c10d__store_op_finish(struct c10d__store_op *op, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    op_vfinish(op, status, fmt, ap);
    va_end(ap);
}

void c10d__store_op_fail_list(struct c10d__store_op *list, int status, const char *fmt, ...)
{
    while (list) {
        struct c10d__store_op *next = list->next;
        va_list ap;
        va_start(ap, fmt);
        op_vfinish(list, status, fmt, ap);
        va_end(ap);
        list = next;
    }
}

int c10d__store_arg_is_key(int cmd, size_t i, size_t nargs)
{
    (void)nargs;
    switch (cmd) {
    case C10D_STORE_CHECK:
    case C10D_STORE_WAIT:
    case C10D_STORE_MULTI_GET:
        return 1;
    case C10D_STORE_MULTI_SET:
        return i % 2 == 0;
    default:
        return i == 0 && nargs > 0;
    }
}

int c10d__store_op_prefix_keys(struct c10d__store_op *op, const char *prefix, size_t plen)
{
    size_t n = op->req.nargs, bytes = 0;
    for (size_t i = 0; i < n; i++)
        if (c10d__store_arg_is_key(op->req.cmd, i, n))
            bytes += plen + op->req.args[i].len + 1;
    struct c10d__store_str *args = malloc(n * sizeof *args + bytes + 1);
    if (!args)
        return c10d__fail(C10D_ENOMEM, "store: out of memory");
    uint8_t *p = (uint8_t *)(args + n);
    for (size_t i = 0; i < n; i++) {
        args[i] = op->req.args[i];
        if (!c10d__store_arg_is_key(op->req.cmd, i, n))
            continue;
        memcpy(p, prefix, plen);
        if (args[i].len)
            memcpy(p + plen, op->req.args[i].data, args[i].len);
        p[plen + args[i].len] = 0;
        args[i].data = p;
        args[i].len += plen;
        p += args[i].len + 1;
    }
    /* Values always point into op->args (only keys are rewritten), so the
     * previous block of rewritten keys can go. */
    if (op->req.args != op->args)
        free((void *)op->req.args);
    op->req.args = args;
    return 0;
}

int64_t c10d__store_op_remaining_ms(const struct c10d__store_op *op)
{
    uint64_t now = c10d__now_ms();
    return now >= op->deadline_ms ? 0 : (int64_t)(op->deadline_ms - now);
}

size_t c10d__store_op_wait_keys(const struct c10d__store_op *op,
                                const struct c10d__store_str **keys)
{
    switch (op->req.cmd) {
    case C10D_STORE_GET:
        *keys = op->req.args;
        return 1;
    case C10D_STORE_QUEUE_POP:
        *keys = op->req.args;
        return op->block ? 1 : 0;
    case C10D_STORE_WAIT:
    case C10D_STORE_MULTI_GET:
        *keys = op->req.args;
        return op->req.nargs;
    default:
        *keys = NULL;
        return 0;
    }
}

/* ------------------------------------------------------ public entry points */

static int check_store(c10d_store *s, const char *what)
{
    if (!s)
        return c10d__fail(C10D_EINVAL, "store %s: store is NULL", what);
    if (atomic_load(&s->users) <= 0)
        return c10d__fail(C10D_EINVAL, "store %s: store was released", what);
    return 0;
}

static int check_key(const char *key, const char *what)
{
    if (!key)
        return c10d__fail(C10D_EINVAL, "store %s: key is NULL", what);
    return 0;
}

static int check_value(const void *value, size_t len, const char *what, const char *name)
{
    if (!value && len)
        return c10d__fail(C10D_EINVAL, "store %s: %s is NULL but its length is %zu", what, name,
                          len);
    return 0;
}

static struct c10d__store_str str_of(const void *data, size_t len)
{
    struct c10d__store_str s = {data, len};
    return s;
}

static struct c10d__store_str key_of(const char *key)
{
    return str_of(key, strlen(key));
}

static int post(c10d_store *s, int cmd, const struct c10d__store_str *args, size_t nargs,
                int64_t i64, int block, int64_t timeout_ms, c10d_store_cb cb, void *arg)
{
    struct c10d__store_op *op = c10d__store_op_new(cmd, args, nargs, i64);
    if (!op)
        return C10D_ENOMEM;
    op->block = block;
    op->timeout_ms = timeout_ms;
    op->cb = cb;
    op->arg = arg;
    return c10d__store_op_submit(s, op);
}

static int key_value_op(c10d_store *s, int cmd, const char *what, const char *key,
                        const void *value, size_t len, c10d_store_cb cb, void *arg)
{
    C10D_CHECK(check_store(s, what));
    C10D_CHECK(check_key(key, what));
    C10D_CHECK(check_value(value, len, what, "value"));
    struct c10d__store_str args[2] = {key_of(key), str_of(value, len)};
    return post(s, cmd, args, 2, 0, 0, 0, cb, arg);
}

static int key_op(c10d_store *s, int cmd, const char *what, const char *key, int block,
                  c10d_store_cb cb, void *arg)
{
    C10D_CHECK(check_store(s, what));
    C10D_CHECK(check_key(key, what));
    struct c10d__store_str k = key_of(key);
    return post(s, cmd, &k, 1, 0, block, 0, cb, arg);
}

static int keys_op(c10d_store *s, int cmd, const char *what, const char *const *keys, size_t n,
                   int64_t timeout_ms, c10d_store_cb cb, void *arg)
{
    C10D_CHECK(check_store(s, what));
    if (n && !keys)
        return c10d__fail(C10D_EINVAL, "store %s: keys is NULL but n is %zu", what, n);
    struct c10d__store_str *args = malloc((n ? n : 1) * sizeof *args);
    if (!args)
        return c10d__fail(C10D_ENOMEM, "store %s: out of memory", what);
    for (size_t i = 0; i < n; i++) {
        if (!keys[i]) {
            free(args);
            return c10d__fail(C10D_EINVAL, "store %s: key at index %zu is NULL", what, i);
        }
        args[i] = key_of(keys[i]);
    }
    int rc = post(s, cmd, args, n, 0, 0, timeout_ms, cb, arg);
    free(args);
    return rc;
}

int c10d_store_set(c10d_store *s, const char *key, const void *value, size_t len, c10d_store_cb cb,
                   void *arg)
{
    return key_value_op(s, C10D_STORE_SET, "set", key, value, len, cb, arg);
}

int c10d_store_append(c10d_store *s, const char *key, const void *value, size_t len,
                      c10d_store_cb cb, void *arg)
{
    return key_value_op(s, C10D_STORE_APPEND, "append", key, value, len, cb, arg);
}

int c10d_store_queue_push(c10d_store *s, const char *key, const void *value, size_t len,
                          c10d_store_cb cb, void *arg)
{
    return key_value_op(s, C10D_STORE_QUEUE_PUSH, "queue_push", key, value, len, cb, arg);
}

int c10d_store_get(c10d_store *s, const char *key, c10d_store_cb cb, void *arg)
{
    return key_op(s, C10D_STORE_GET, "get", key, 0, cb, arg);
}

int c10d_store_delete_key(c10d_store *s, const char *key, c10d_store_cb cb, void *arg)
{
    return key_op(s, C10D_STORE_DELETE_KEY, "delete_key", key, 0, cb, arg);
}

int c10d_store_queue_pop(c10d_store *s, const char *key, int block, c10d_store_cb cb, void *arg)
{
    return key_op(s, C10D_STORE_QUEUE_POP, "queue_pop", key, block != 0, cb, arg);
}

int c10d_store_queue_len(c10d_store *s, const char *key, c10d_store_cb cb, void *arg)
{
    return key_op(s, C10D_STORE_QUEUE_LEN, "queue_len", key, 0, cb, arg);
}

int c10d_store_add(c10d_store *s, const char *key, int64_t delta, c10d_store_cb cb, void *arg)
{
    C10D_CHECK(check_store(s, "add"));
    C10D_CHECK(check_key(key, "add"));
    struct c10d__store_str k = key_of(key);
    return post(s, C10D_STORE_ADD, &k, 1, delta, 0, 0, cb, arg);
}

int c10d_store_compare_set(c10d_store *s, const char *key, const void *expected,
                           size_t expected_len, const void *desired, size_t desired_len,
                           c10d_store_cb cb, void *arg)
{
    C10D_CHECK(check_store(s, "compare_set"));
    C10D_CHECK(check_key(key, "compare_set"));
    C10D_CHECK(check_value(expected, expected_len, "compare_set", "expected"));
    C10D_CHECK(check_value(desired, desired_len, "compare_set", "desired"));
    struct c10d__store_str args[3] = {key_of(key), str_of(expected, expected_len),
                                      str_of(desired, desired_len)};
    return post(s, C10D_STORE_COMPARE_SET, args, 3, 0, 0, 0, cb, arg);
}

int c10d_store_wait(c10d_store *s, const char *const *keys, size_t n, int64_t timeout_ms,
                    c10d_store_cb cb, void *arg)
{
    return keys_op(s, C10D_STORE_WAIT, "wait", keys, n, timeout_ms > 0 ? timeout_ms : 0, cb, arg);
}

int c10d_store_check(c10d_store *s, const char *const *keys, size_t n, c10d_store_cb cb, void *arg)
{
    return keys_op(s, C10D_STORE_CHECK, "check", keys, n, 0, cb, arg);
}

int c10d_store_multi_get(c10d_store *s, const char *const *keys, size_t n, c10d_store_cb cb,
                         void *arg)
{
    return keys_op(s, C10D_STORE_MULTI_GET, "multi_get", keys, n, 0, cb, arg);
}

int c10d_store_multi_set(c10d_store *s, const char *const *keys, const void *const *values,
                         const size_t *lens, size_t n, c10d_store_cb cb, void *arg)
{
    C10D_CHECK(check_store(s, "multi_set"));
    if (n && (!keys || !values || !lens))
        return c10d__fail(C10D_EINVAL, "store multi_set: keys, values and lens must not be NULL");
    struct c10d__store_str *args = malloc((2 * n + 1) * sizeof *args);
    if (!args)
        return c10d__fail(C10D_ENOMEM, "store multi_set: out of memory");
    for (size_t i = 0; i < n; i++) {
        if (!keys[i] || (!values[i] && lens[i])) {
            free(args);
            return c10d__fail(C10D_EINVAL, "store multi_set: %s at index %zu is NULL",
                              keys[i] ? "value" : "key", i);
        }
        args[2 * i] = key_of(keys[i]);
        args[2 * i + 1] = str_of(values[i], lens[i]);
    }
    int rc = post(s, C10D_STORE_MULTI_SET, args, 2 * n, 0, 0, 0, cb, arg);
    free(args);
    return rc;
}

int c10d_store_num_keys(c10d_store *s, c10d_store_cb cb, void *arg)
{
    C10D_CHECK(check_store(s, "num_keys"));
    return post(s, C10D_STORE_GETNUMKEYS, NULL, 0, 0, 0, 0, cb, arg);
}

int c10d_store_list_keys(c10d_store *s, c10d_store_cb cb, void *arg)
{
    C10D_CHECK(check_store(s, "list_keys"));
    return post(s, C10D_STORE_LIST_KEYS, NULL, 0, 0, 0, 0, cb, arg);
}

int c10d_store_server_stats(c10d_store *s, c10d_store_cb cb, void *arg)
{
    C10D_CHECK(check_store(s, "server_stats"));
    return post(s, C10D_STORE_STATS, NULL, 0, 0, 0, 0, cb, arg);
}

int c10d_store_ping(c10d_store *s, c10d_store_cb cb, void *arg)
{
    C10D_CHECK(check_store(s, "ping"));
    return post(s, C10D_STORE_PING, NULL, 0, 0, 0, 0, cb, arg);
}
