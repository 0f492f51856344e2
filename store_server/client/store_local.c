/* The engine of the hash and file stores: requests against a store_server
 * table, parked waits, deadlines. Everything here runs on the loop thread. */
#include "store_local.h"

#include "engine/list.h"
#include "engine/log.h"
#include "store_server/table/table.h"

#include <stdlib.h>
#include <string.h>

struct c10d__local_waiter {
    struct c10d__store_op *op;
    struct c10d__local_store *ls;
    struct c10d__local_waiter *prev, *next;
    uv_timer_t timer;
    int ran; /* tried once (waits for keys) or never (waits for the lock) */
};

/* Ops done in one pass, finished after the store's lock is released. */
struct done {
    struct c10d__store_op *head, **tail;
};

#define KEYF    "'%.*s'"
#define KEYA(s) (int)((s).len > 200 ? 200 : (s).len), (const char *)(s).data

/* ------------------------------------------------------ running requests */

static int hidden(const struct c10d__local_store *ls, struct c10d__wire_str key)
{
    return ls->hidden_key && key.len == ls->hidden_len &&
           memcmp(key.data, ls->hidden_key, key.len) == 0;
}

struct key_list {
    const struct c10d__local_store *ls;
    struct c10d__wire_str *keys;
    size_t n, cap;
    int oom;
};

static int collect_key(void *arg, struct c10d__wire_str key)
{
    struct key_list *kl = arg;
    if (hidden(kl->ls, key))
        return 0;
    if (kl->n == kl->cap) {
        size_t cap = kl->cap ? 2 * kl->cap : 64;
        struct c10d__wire_str *k = realloc(kl->keys, cap * sizeof *k);
        if (!k) {
            kl->oom = 1;
            return 1;
        }
        kl->keys = k;
        kl->cap = cap;
    }
    kl->keys[kl->n++] = key;
    return 0;
}

static int run_multi_get(struct c10d__store_table *t, struct c10d__store_op *op)
{
    size_t n = op->req.nargs;
    struct c10d__wire_str *vals = malloc((n ? n : 1) * sizeof *vals);
    if (!vals)
        return c10d__fail(C10D_ENOMEM, "store multi_get: out of memory");
    for (size_t i = 0; i < n; i++) {
        if (!c10d__store_table_get(t, op->req.args[i], &vals[i])) {
            free(vals);
            return c10d__fail(C10D_ENOTFOUND, "store multi_get: key " KEYF " not found",
                              KEYA(op->req.args[i]));
        }
    }
    int rc = c10d__store_op_set_items(op, vals, n, 0);
    free(vals);
    return rc;
}

int c10d__local_store_run(struct c10d__local_store *ls, struct c10d__store_op *op, int *mutated)
{
    struct c10d__store_table *t = ls->table;
    const struct c10d__wire_request *r = &op->req;
    const struct c10d__wire_str *a = r->args;
    struct c10d__wire_str v;
    int64_t i;
    int rc;
    *mutated = 0;

    const struct c10d__wire_str *wkeys;
    size_t nw = c10d__store_op_wait_keys(op, &wkeys);
    if (nw && !c10d__store_table_check(t, wkeys, nw))
        return 1;

    switch (r->cmd) {
    case C10D_STORE_SET:
        C10D_CHECK(c10d__store_table_set(t, a[0], a[1]));
        *mutated = 1;
        return 0;
    case C10D_STORE_GET:
        if (!c10d__store_table_get(t, a[0], &v))
            return c10d__fail(C10D_ENOTFOUND, "store get: key " KEYF " not found", KEYA(a[0]));
        return c10d__store_op_set_data(op, v.data, v.len);
    case C10D_STORE_ADD:
        rc = c10d__store_table_add(t, a[0], r->i64, &i);
        if (rc == C10D_EINVAL)
            return c10d__fail(C10D_ESTORE,
                              "store add: the value of key " KEYF " is not an integer (or the "
                              "sum overflows)",
                              KEYA(a[0]));
        C10D_CHECK(rc);
        op->res.value = i;
        *mutated = 1;
        return 0;
    case C10D_STORE_COMPARE_SET:
        C10D_CHECK(c10d__store_table_compare_set(t, a[0], a[1], a[2], &v));
        *mutated = 1;
        return c10d__store_op_set_data(op, v.data, v.len);
    case C10D_STORE_CHECK:
        op->res.value = c10d__store_table_check(t, a, r->nargs);
        return 0;
    case C10D_STORE_WAIT:
        return 0;
    case C10D_STORE_GETNUMKEYS: {
        size_t n = c10d__store_table_num_keys(t);
        if (ls->hidden_key) {
            struct c10d__wire_str hk = {(const uint8_t *)ls->hidden_key, ls->hidden_len};
            if (c10d__store_table_get(t, hk, &v))
                n--;
        }
        op->res.value = (int64_t)n;
        return 0;
    }
    case C10D_STORE_DELETE_KEY:
        op->res.value = c10d__store_table_delete(t, a[0]);
        *mutated = op->res.value > 0;
        return 0;
    case C10D_STORE_APPEND:
        C10D_CHECK(c10d__store_table_append(t, a[0], a[1]));
        *mutated = 1;
        return 0;
    case C10D_STORE_MULTI_GET:
        return run_multi_get(t, op);
    case C10D_STORE_MULTI_SET:
        for (size_t k = 0; k + 1 < r->nargs; k += 2) {
            rc = c10d__store_table_set(t, a[k], a[k + 1]);
            if (rc < 0)
                return rc;
            *mutated = 1;
        }
        return 0;
    case C10D_STORE_QUEUE_PUSH:
        C10D_CHECK(c10d__store_table_queue_push(t, a[0], a[1]));
        *mutated = 1;
        return 0;
    case C10D_STORE_QUEUE_POP:
        C10D_CHECK(c10d__store_table_queue_pop(t, a[0], &i, &v));
        if (i == 0) {
            /* The key may be present as a value, or another popper won. */
            if (op->block)
                return 1;
            return c10d__fail(C10D_ENOTFOUND, "store queue_pop: queue " KEYF " is empty",
                              KEYA(a[0]));
        }
        op->res.value = i;
        *mutated = 1;
        return c10d__store_op_set_data(op, v.data, v.len);
    case C10D_STORE_QUEUE_LEN:
        op->res.value = c10d__store_table_queue_len(t, a[0]);
        return 0;
    case C10D_STORE_LIST_KEYS: {
        struct key_list kl = {.ls = ls};
        c10d__store_table_foreach_key(t, collect_key, &kl);
        if (kl.oom) {
            free(kl.keys);
            return c10d__fail(C10D_ENOMEM, "store list_keys: out of memory");
        }
        rc = c10d__store_op_set_items(op, kl.keys, kl.n, 0);
        free(kl.keys);
        if (rc == 0)
            op->res.value = (int64_t)op->res.count;
        return rc;
    }
    case C10D_STORE_PING:
        op->res.value = 0;
        return 0;
    default:
        return c10d__fail(C10D_EUNSUPPORTED, "%s store: %s is not supported", ls->base.vt->kind,
                          c10d__wire_cmd_name(r->cmd));
    }
}

int c10d__local_store_apply(struct c10d__store_table *t, const struct c10d__wire_request *req)
{
    const struct c10d__wire_str *a = req->args;
    struct c10d__wire_str v;
    int64_t i;
    switch (req->cmd) {
    case C10D_STORE_SET:
        return c10d__store_table_set(t, a[0], a[1]);
    case C10D_STORE_ADD:
        return c10d__store_table_add(t, a[0], req->i64, &i);
    case C10D_STORE_COMPARE_SET:
        return c10d__store_table_compare_set(t, a[0], a[1], a[2], &v);
    case C10D_STORE_DELETE_KEY:
        return c10d__store_table_delete(t, a[0]);
    case C10D_STORE_APPEND:
        return c10d__store_table_append(t, a[0], a[1]);
    case C10D_STORE_MULTI_SET:
        for (size_t k = 0; k + 1 < req->nargs; k += 2)
            C10D_CHECK(c10d__store_table_set(t, a[k], a[k + 1]));
        return 0;
    case C10D_STORE_QUEUE_PUSH:
        return c10d__store_table_queue_push(t, a[0], a[1]);
    case C10D_STORE_QUEUE_POP:
        return c10d__store_table_queue_pop(t, a[0], &i, &v);
    default:
        return c10d__fail(C10D_EPROTO, "store log: unexpected %s record",
                          c10d__wire_cmd_name(req->cmd));
    }
}

/* --------------------------------------------------------------- passes */

static void done_push(struct done *d, struct c10d__store_op *op, int status)
{
    op->res.status = status;
    if (status < 0) {
        free(op->res_message);
        op->res_message = strdup(c10d_last_error());
    }
    op->next = NULL;
    *d->tail = op;
    d->tail = &op->next;
}

static void done_finish(struct done *d)
{
    struct c10d__store_op *op = d->head;
    d->head = NULL;
    d->tail = &d->head;
    while (op) {
        struct c10d__store_op *next = op->next;
        char *msg = op->res_message;
        op->res_message = NULL;
        c10d__store_op_finish(op, op->res.status, "%s", msg ? msg : "");
        free(msg);
        op = next;
    }
}

/* 0 done (status in *status), 1 must wait. */
static int run_one(struct c10d__local_store *ls, struct c10d__store_op *op, int *status,
                   int *mutated)
{
    int rc = c10d__local_store_run(ls, op, mutated);
    if (rc == 1)
        return 1;
    if (rc == 0 && *mutated && ls->hooks && ls->hooks->commit)
        rc = ls->hooks->commit(ls, &op->req);
    *status = rc;
    return 0;
}

static void on_waiter_closed(uv_handle_t *h)
{
    struct c10d__local_waiter *w = h->data;
    struct c10d__local_store *ls = w->ls;
    free(w);
    ls->handles--;
    if (ls->closed && ls->handles == 0)
        c10d__store_unref(&ls->base);
}

static void unlink_waiter(struct c10d__local_waiter *w)
{
    struct c10d__local_store *ls = w->ls;
    C10D__LIST_REMOVE(ls->head, ls->tail, w, prev, next);
    uv_timer_stop(&w->timer);
    uv_close((uv_handle_t *)&w->timer, on_waiter_closed);
}

/* Re-runs parked ops in FIFO order until nothing changes. */
static void run_waiters(struct c10d__local_store *ls, struct done *d)
{
    for (int again = 1; again;) {
        again = 0;
        for (struct c10d__local_waiter *w = ls->head, *next; w; w = next) {
            next = w->next;
            int status, mutated = 0;
            if (run_one(ls, w->op, &status, &mutated) == 1) {
                w->ran = 1;
                continue;
            }
            again |= mutated;
            struct c10d__store_op *op = w->op;
            w->op = NULL;
            unlink_waiter(w);
            done_push(d, op, status);
        }
    }
}

static const char *what_of(int cmd)
{
    switch (cmd) {
    case C10D_STORE_GET:
        return "get";
    case C10D_STORE_MULTI_GET:
        return "multi_get";
    case C10D_STORE_QUEUE_POP:
        return "queue_pop";
    case C10D_STORE_WAIT:
        return "wait";
    default:
        return c10d__wire_cmd_name(cmd);
    }
}

static void on_waiter_timeout(uv_timer_t *t)
{
    struct c10d__local_waiter *w = t->data;
    struct c10d__local_store *ls = w->ls;
    struct c10d__store_op *op = w->op;
    w->op = NULL;
    unlink_waiter(w);
    const struct c10d__wire_str *keys;
    size_t n = c10d__store_op_wait_keys(op, &keys);
    if (!w->ran)
        c10d__store_op_finish(op, C10D_ETIMEDOUT,
                              "%s store %s: timed out after %lld ms waiting for the lock",
                              ls->base.vt->kind, what_of(op->req.cmd), (long long)op->timeout_ms);
    else if (n)
        c10d__store_op_finish(op, C10D_ETIMEDOUT,
                              "%s store %s: timed out after %lld ms waiting for key " KEYF "%s",
                              ls->base.vt->kind, what_of(op->req.cmd), (long long)op->timeout_ms,
                              KEYA(keys[0]), n > 1 ? " (and others)" : "");
    else
        c10d__store_op_finish(op, C10D_ETIMEDOUT, "%s store %s: timed out after %lld ms",
                              ls->base.vt->kind, what_of(op->req.cmd), (long long)op->timeout_ms);
}

static void poll_tick(uv_timer_t *t);

static void park(struct c10d__local_store *ls, struct c10d__store_op *op, int ran)
{
    struct c10d__local_waiter *w = calloc(1, sizeof *w);
    if (!w) {
        c10d__store_op_finish(op, C10D_ENOMEM, "%s store: out of memory", ls->base.vt->kind);
        return;
    }
    w->op = op;
    w->ls = ls;
    w->ran = ran;
    C10D__LIST_PUSH_BACK(ls->head, ls->tail, w, prev, next);
    uv_timer_init(c10d__engine_loop(), &w->timer);
    w->timer.data = w;
    ls->handles++;
    uv_timer_start(&w->timer, on_waiter_timeout, (uint64_t)c10d__store_op_remaining_ms(op), 0);
    if (!ls->hooks || !ls->hooks->poll_ms)
        return;
    if (!ls->poll_open) {
        uv_timer_init(c10d__engine_loop(), &ls->poll);
        ls->poll.data = ls;
        ls->poll_open = 1;
        ls->handles++;
    }
    /* A closing timer (the store is being released) retries nothing; the
     * op then ends at its deadline or when the release fails it. */
    if (!uv_is_active((uv_handle_t *)&ls->poll) && !uv_is_closing((uv_handle_t *)&ls->poll))
        uv_timer_start(&ls->poll, poll_tick, ls->hooks->poll_ms, ls->hooks->poll_ms);
}

static void on_poll_closed(uv_handle_t *h)
{
    struct c10d__local_store *ls = h->data;
    ls->poll_open = 0;
    ls->handles--;
    if (ls->closed && ls->handles == 0)
        c10d__store_unref(&ls->base);
}

static void close_poll(struct c10d__local_store *ls)
{
    if (ls->poll_open && !uv_is_closing((uv_handle_t *)&ls->poll))
        uv_close((uv_handle_t *)&ls->poll, on_poll_closed);
}

static int has_unran(const struct c10d__local_store *ls)
{
    for (const struct c10d__local_waiter *w = ls->head; w; w = w->next)
        if (!w->ran)
            return 1;
    return 0;
}

static void poll_tick(uv_timer_t *t)
{
    struct c10d__local_store *ls = t->data;
    /* Stopped, not closed: an op parked later in this same loop turn (a post
     * run by the idle handle) restarts it. A closed timer would only be
     * reopened after its close callback and would strand that op. */
    if (!ls->head) {
        uv_timer_stop(&ls->poll);
        return;
    }
    if (!has_unran(ls) && ls->hooks->changed && !ls->hooks->changed(ls))
        return;
    int rc = ls->hooks->begin ? ls->hooks->begin(ls) : 0;
    if (rc != 0)
        return; /* busy, or an I/O error that the waiters' deadlines will report */
    struct done d = {NULL, &d.head};
    run_waiters(ls, &d);
    if (ls->hooks->end)
        ls->hooks->end(ls);
    done_finish(&d);
}

/* ----------------------------------------------------------- the vtable */

static void fail_waiters(struct c10d__local_store *ls, int status, const char *why)
{
    while (ls->head) {
        struct c10d__local_waiter *w = ls->head;
        struct c10d__store_op *op = w->op;
        w->op = NULL;
        unlink_waiter(w);
        c10d__store_op_finish(op, status, "%s store %s: %s", ls->base.vt->kind,
                              what_of(op->req.cmd), why);
    }
    close_poll(ls);
}

static void on_engine_shutdown(struct c10d__shutdown_hook *hook)
{
    struct c10d__local_store *ls =
        (struct c10d__local_store *)((char *)hook - offsetof(struct c10d__local_store, hook));
    ls->hook_registered = 0;
    fail_waiters(ls, C10D_EABORTED, "the engine was shut down");
}

static void local_submit(c10d_store *s, struct c10d__store_op *op)
{
    struct c10d__local_store *ls = (struct c10d__local_store *)s;
    if (ls->closed) {
        c10d__store_op_finish(op, C10D_ECLOSED, "%s store: released", s->vt->kind);
        return;
    }
    /* Queued before the engine began to stop, run after this store's hook: a
     * wait parked now would hold the loop open until its timeout. */
    if (c10d__engine_stop_begun()) {
        c10d__store_op_finish(op, C10D_EABORTED, "%s store: the engine was shut down", s->vt->kind);
        return;
    }
    if (!ls->hook_registered) {
        ls->hook.fn = on_engine_shutdown;
        c10d__engine_on_shutdown(&ls->hook);
        ls->hook_registered = 1;
    }
    /* Ops parked for the lock keep their order: later ones queue behind. */
    if (has_unran(ls)) {
        park(ls, op, 0);
        return;
    }
    int rc = ls->hooks && ls->hooks->begin ? ls->hooks->begin(ls) : 0;
    if (rc == 1) {
        park(ls, op, 0);
        return;
    }
    if (rc < 0) {
        c10d__store_op_finish(op, rc, "%s", c10d_last_error());
        return;
    }
    struct done d = {NULL, &d.head};
    int status, mutated = 0;
    if (run_one(ls, op, &status, &mutated) == 1)
        park(ls, op, 1);
    else
        done_push(&d, op, status);
    if (mutated && ls->head)
        run_waiters(ls, &d);
    if (ls->hooks && ls->hooks->end)
        ls->hooks->end(ls);
    done_finish(&d);
}

static void local_close(c10d_store *s)
{
    struct c10d__local_store *ls = (struct c10d__local_store *)s;
    ls->closed = 1;
    if (ls->hook_registered) {
        c10d__engine_remove_shutdown_hook(&ls->hook);
        ls->hook_registered = 0;
    }
    fail_waiters(ls, C10D_ECLOSED, "the store was released");
    if (ls->handles == 0)
        c10d__store_unref(s);
}

static void local_destroy(c10d_store *s)
{
    struct c10d__local_store *ls = (struct c10d__local_store *)s;
    if (ls->hooks && ls->hooks->destroy)
        ls->hooks->destroy(ls);
    c10d__store_table_free(ls->table);
    free(ls);
}

int c10d__local_store_init(struct c10d__local_store *ls, const struct c10d__store_vtable *vt,
                           const struct c10d__local_hooks *hooks)
{
    c10d__store_init(&ls->base, vt);
    ls->hooks = hooks;
    return c10d__store_table_create(NULL, 0, &ls->table);
}

const struct c10d__store_vtable c10d__hash_store_vtable = {
    .kind = "hash",
    .submit = local_submit,
    .close = local_close,
    .destroy = local_destroy,
};

const struct c10d__store_vtable c10d__file_store_vtable = {
    .kind = "file",
    .submit = local_submit,
    .close = local_close,
    .destroy = local_destroy,
};
