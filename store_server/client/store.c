/* Store ops and the public entry point: check on the caller's thread, copy
 * into an op that is its work's payload, post to the loop, finish exactly
 * once there by completing the work. */
#include "store.h"

#include "engine/log.h"
#include "engine/opts.h"
#include "engine/work.h"

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
    atomic_init(&s->barrier_cmd, 0);
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

c10d_store *c10d__store_root(c10d_store *s)
{
    while (s != NULL && s->vt->inner != NULL)
        s = s->vt->inner(s);
    return s;
}

int c10d_store_clone(c10d_store *store, c10d_store **out)
{
    if (out != NULL)
        *out = NULL;
    if (store == NULL || out == NULL)
        return c10d__fail(C10D_EINVAL, "store clone: %s is NULL", store == NULL ? "store" : "out");
    if (store->vt->clone == NULL) {
        c10d_store_retain(store);
        *out = store;
        return 0;
    }
    C10D_CHECK(store->vt->clone(store, out));
    c10d_store_set_timeout(*out, c10d_store_timeout(store));
    return 0;
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
    if (c10d__engine_post_if_running(&store->close_task) < 0)
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

/* Any unique address: tells store ops from other producers' payloads. */
static const char op_payload_kind = 's';

static void op_free(void *payload);

int c10d__store_op_new(struct c10d__store_op **out, int cmd, const struct c10d__wire_str *args,
                       size_t nargs, int64_t i64)
{
    *out = NULL;
    size_t bytes = 0;
    for (size_t i = 0; i < nargs; i++)
        bytes += args[i].len + 1;
    struct c10d__store_op *op = calloc(1, sizeof *op + nargs * sizeof *op->args + bytes);
    if (!op)
        return c10d__fail(C10D_ENOMEM, "store %s: out of memory", c10d__wire_cmd_name(cmd));
    char what[64];
    snprintf(what, sizeof what, "store %s", c10d__wire_cmd_name(cmd));
    int rc = c10d__work_create(&op->work, what, 0);
    if (rc != 0) {
        free(op);
        return rc;
    }
    c10d__work_set_payload(op->work, &op_payload_kind, op, op_free);
    op->args = (struct c10d__wire_str *)(op + 1);
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
    *out = op;
    return 0;
}

struct c10d__store_op *c10d__store_op_of(c10d_work *work)
{
    return work != NULL ? c10d__work_payload(work, &op_payload_kind) : NULL;
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

/* The work's payload destructor: the op goes with its work. */
static void op_free(void *payload)
{
    struct c10d__store_op *op = payload;
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

void c10d__store_op_discard(struct c10d__store_op *op)
{
    if (!op)
        return;
    /* Completed first: that takes the work off the engine's pending list. */
    c10d__work_complete(op->work, C10D_ECANCELED, "store %s: not submitted",
                        c10d__wire_cmd_name(op->req.cmd));
    c10d_work_release(op->work);
}

int c10d__store_op_submit(c10d_store *s, struct c10d__store_op *op, c10d_work **work)
{
    /* Read before posting: from then on the loop may finish the op and drop
     * the op's reference at any moment. */
    c10d_work *w = op->work;
    if (op->timeout_ms <= 0)
        op->timeout_ms = atomic_load(&s->timeout_ms);
    c10d__store_ref(s);
    op->store = s;
    op->task.fn = submit_task_fn;
    if (work)
        c10d_work_retain(w);
    int rc = c10d__engine_post(&op->task);
    if (rc < 0) {
        op->store = NULL;
        c10d__store_unref(s);
        if (work)
            c10d_work_release(w);
        c10d__store_op_discard(op);
        return c10d__fail(rc, "store: the engine is shutting down");
    }
    if (work)
        *work = w;
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
    op->res_data = malloc(len + 1);
    if (!op->res_data)
        return c10d__fail(C10D_ENOMEM, "store: out of memory for a %zu-byte value", len);
    if (len)
        memcpy(op->res_data, data, len);
    ((char *)op->res_data)[len] = 0;
    op->res.data.data = op->res_data;
    op->res.data.len = len;
    return 0;
}

static int keep_item(const struct c10d__store_op *op, struct c10d__wire_str item, size_t strip,
                     size_t plen)
{
    if (!op->list_prefix)
        return 1;
    return item.len >= strip + plen && memcmp(item.data + strip, op->list_prefix, plen) == 0;
}

int c10d__store_op_set_items(struct c10d__store_op *op, const struct c10d__wire_str *items,
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

int c10d__store_op_take_reply(struct c10d__store_op *op, const struct c10d__wire_reply *r)
{
    switch (r->shape) {
    case C10D_STORE_REPLY_U8:
        op->res.value = op->req.cmd == C10D_STORE_CHECK ? r->u8 == C10D_STORE_READY : 0;
        return 0;
    case C10D_STORE_REPLY_U32: /* PING: the store puts its round trip here */
        op->res.value = 0;
        return 0;
    case C10D_STORE_REPLY_I64:
        op->res.value = r->i64;
        return 0;
    case C10D_STORE_REPLY_STR:
        return c10d__store_op_set_data(op, r->vals[0].data, r->vals[0].len);
    case C10D_STORE_REPLY_NSTR:
        return c10d__store_op_set_items(op, r->vals, r->nvals, 0);
    case C10D_STORE_REPLY_LIST: {
        int rc = c10d__store_op_set_items(op, r->vals, r->nvals, 0);
        if (rc == 0)
            op->res.value = (int64_t)op->res.count;
        return rc;
    }
    case C10D_STORE_REPLY_QPOP:
        op->res.value = r->i64;
        return r->i64 > 0 ? c10d__store_op_set_data(op, r->vals[0].data, r->vals[0].len) : 0;
    case C10D_STORE_REPLY_NONE:
        return 0;
    default:
        return c10d__fail(C10D_EINTERNAL, "store: unexpected reply to %s",
                          c10d__wire_cmd_name(op->req.cmd));
    }
}

static void op_vfinish(struct c10d__store_op *op, int status, const char *fmt, va_list ap)
{
    if (op->finished) {
        C10D_ERROR("store", "internal: %s finished twice", c10d__wire_cmd_name(op->req.cmd));
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
    c10d_work *w = op->work;
    op->store = NULL;
    /* The op belongs to its work from here on: a waiter may be reading it. */
    c10d__work_complete(w, status, "%s", status < 0 ? op->res.message : "");
    if (s)
        c10d__store_unref(s);
    c10d_work_release(w);
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

int c10d__store_op_prefix_keys(struct c10d__store_op *op, const char *prefix, size_t plen)
{
    size_t n = op->req.nargs, bytes = 0;
    for (size_t i = 0; i < n; i++)
        if (c10d__wire_cmd_arg_is_key(op->req.cmd, i))
            bytes += plen + op->req.args[i].len + 1;
    struct c10d__wire_str *args = malloc(n * sizeof *args + bytes + 1);
    if (!args)
        return c10d__fail(C10D_ENOMEM, "store: out of memory");
    uint8_t *p = (uint8_t *)(args + n);
    for (size_t i = 0; i < n; i++) {
        args[i] = op->req.args[i];
        if (!c10d__wire_cmd_arg_is_key(op->req.cmd, i))
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

size_t c10d__store_op_wait_keys(const struct c10d__store_op *op, const struct c10d__wire_str **keys)
{
    int waits = c10d__wire_cmd_waits(op->req.cmd);
    *keys = waits ? op->req.args : NULL;
    return waits == 1 || (waits == 2 && op->block) ? op->req.nargs : 0;
}
