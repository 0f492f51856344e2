/* The engine of the hash and file stores: requests against a store_server
 * table, parked waits, deadlines. Everything here runs on the loop thread. */
#include "store_local.h"

#include "engine/list.h"
#include "engine/log.h"
#include "store_server/table/exec.h"
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

/* LIST_KEYS and GETNUMKEYS do not count the hidden key. */
static void hide(const struct c10d__local_store *ls, struct c10d__store_op *op,
                 struct c10d__wire_reply *rep, struct c10d__wire_str *kept)
{
    struct c10d__wire_str hk = {(const uint8_t *)ls->hidden_key, ls->hidden_len};
    struct c10d__wire_str v;
    if (op->req.cmd == C10D_STORE_GETNUMKEYS && c10d__store_table_get(ls->table, hk, &v))
        rep->i64--;
    if (op->req.cmd == C10D_STORE_LIST_KEYS && kept) {
        size_t n = 0;
        for (size_t i = 0; i < rep->nvals; i++)
            if (!hidden(ls, rep->vals[i]))
                kept[n++] = rep->vals[i];
        rep->vals = kept;
        rep->nvals = n;
    }
}

static int exec_error(const struct c10d__local_store *ls, const struct c10d__wire_request *r,
                      int rc)
{
    if (rc == C10D_EINVAL)
        return c10d__fail(C10D_ESTORE,
                          "store %s: the value of key " KEYF " is not an integer (or the "
                          "sum overflows)",
                          c10d__wire_cmd_name(r->cmd), KEYA(r->args[0]));
    if (rc == C10D_EUNSUPPORTED)
        return c10d__fail(C10D_EUNSUPPORTED, "%s store: %s is not supported", ls->base.vt->kind,
                          c10d__wire_cmd_name(r->cmd));
    return c10d__fail(rc, "store %s: out of memory", c10d__wire_cmd_name(r->cmd));
}

/* The commands a local store runs: the client ops, not the server's own
 * (its waits are parked here, not in the table). */
static int local_command(int cmd)
{
    switch (cmd) {
    case C10D_STORE_VALIDATE:
    case C10D_STORE_CANCEL_WAIT:
    case C10D_STORE_BARRIER:
    case C10D_STORE_WATCH_KEY:
    case C10D_STORE_STATS:
    case C10D_STORE_AUTH:
        return 0;
    default:
        return 1;
    }
}

int c10d__local_store_run(struct c10d__local_store *ls, struct c10d__store_op *op, int *mutated)
{
    struct c10d__store_table *t = ls->table;
    const struct c10d__wire_request *r = &op->req;
    *mutated = 0;

    const struct c10d__wire_str *wkeys;
    size_t nw = c10d__store_op_wait_keys(op, &wkeys);
    if (nw && !c10d__store_table_check(t, wkeys, nw))
        return 1;
    if (!local_command(r->cmd))
        return exec_error(ls, r, C10D_EUNSUPPORTED);

    /* The keys are there: WAIT answers now and never parks in the table. */
    struct c10d__store_client now = {0};
    struct c10d__wire_buf out = {0};
    struct c10d__store_exec_result res;
    int rc = c10d__store_exec(t, &now, r, NULL, &out, &res);
    if (rc < 0) {
        c10d__wire_buf_free(&out);
        return exec_error(ls, r, rc);
    }
    *mutated =
        !c10d__wire_cmd_read_only(r->cmd) &&
        ((r->cmd != C10D_STORE_DELETE_KEY && r->cmd != C10D_STORE_QUEUE_POP) || res.value > 0);
    if (r->cmd == C10D_STORE_GET && !res.value)
        rc = c10d__fail(C10D_ENOTFOUND, "store get: key " KEYF " not found", KEYA(r->args[0]));
    else if (r->cmd == C10D_STORE_QUEUE_POP && res.value == 0)
        /* The key may be present as a value, or another popper won. */
        rc = op->block ? 1
                       : c10d__fail(C10D_ENOTFOUND, "store queue_pop: queue " KEYF " is empty",
                                    KEYA(r->args[0]));
    else if (c10d__wire_reply_shape(r->cmd) == C10D_STORE_REPLY_NONE)
        rc = 0;
    else {
        /* Back through the codec: the reply a tcp store would read. */
        struct c10d__wire_codec_limits lim = {0};
        struct c10d__wire_reply_parser rp;
        struct c10d__wire_reply rep;
        struct c10d__wire_str *kept = NULL;
        size_t used;
        c10d__wire_reply_parser_init(&rp, &lim);
        rc = c10d__wire_reply_expect(&rp, r->cmd, r->cmd == C10D_STORE_MULTI_GET ? r->nargs : 0);
        if (rc == 0 &&
            c10d__wire_parse_reply(&rp, out.data, out.len, &rep, &used) != C10D_STORE_PARSE_DONE)
            rc = c10d__fail(C10D_EINTERNAL, "store %s: the local reply did not parse: %s",
                            c10d__wire_cmd_name(r->cmd), rp.error);
        if (rc == 0 && ls->hidden_key) {
            if (rep.nvals && !(kept = malloc(rep.nvals * sizeof *kept)))
                rc = c10d__fail(C10D_ENOMEM, "store list_keys: out of memory");
            else
                hide(ls, op, &rep, kept);
        }
        if (rc == 0)
            rc = c10d__store_op_take_reply(op, &rep);
        free(kept);
        c10d__wire_reply_parser_free(&rp);
    }
    c10d__store_table_client_gone(t, &now);
    c10d__wire_buf_free(&out);
    return rc;
}

int c10d__local_store_apply(struct c10d__store_table *t, const struct c10d__wire_request *req)
{
    if (c10d__wire_cmd_read_only(req->cmd) || !local_command(req->cmd) ||
        req->cmd == C10D_STORE_WAIT)
        return c10d__fail(C10D_EPROTO, "store log: unexpected %s record",
                          c10d__wire_cmd_name(req->cmd));
    struct c10d__wire_buf out = {0};
    struct c10d__store_exec_result res;
    int rc = c10d__store_exec(t, NULL, req, NULL, &out, &res);
    c10d__wire_buf_free(&out);
    return rc;
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
