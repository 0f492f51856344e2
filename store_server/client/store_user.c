/* A store over the functions of a c10d_store_impl (torch's Store subclass):
 * the user's key-value service (etcd, Redis, a cluster's own) behind the
 * library's store interface.
 *
 * The user's functions may block on a network, so none runs on the loop
 * thread: each op runs on a worker thread of its own (engine/offload.h) and
 * is finished on the loop afterwards. Ops keep the store's order where it
 * matters without letting a waiting op hold up the rest: the ops that change
 * or read the store now (SET, ADD, CHECK, ...) run one at a time in
 * submission order; an op that waits for keys (GET, MULTI_GET, WAIT) starts
 * once the ops before it finished, then runs beside whatever comes next, so a
 * GET waiting for a key never blocks the SET that creates it.
 *
 * MULTI_GET and MULTI_SET are loops of get and set (as torch's base Store);
 * APPEND is compare_set in a loop when the store has it, else get + set (not
 * atomic). Everything else the store lacks is refused with
 * C10D_EUNSUPPORTED. */
#include "store.h"

#include "engine/log.h"
#include "engine/loop.h"
#include "engine/offload.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

/* How long the engine's stop waits for ops still in a user store's
 * functions: their results need the loop to come back to. */
#define STOP_GRACE_MS 2000

struct user_store {
    c10d_store base;
    c10d_store_impl impl;
    char name[64];
    /* Loop thread only. */
    struct c10d__store_op *head, *tail; /* waiting for their turn */
    int serial_busy;                    /* an op of the ordered kind runs */
    int closed;
};

/* One op on its worker thread; the result travels back in here. */
struct job {
    struct user_store *us;
    struct c10d__store_op *op;
    int ordered;
    int status;
    char msg[400];
    int64_t value;
    void *data;
    size_t len;
    c10d_store_bytes *items; /* MULTI_GET */
    size_t nitems;
    struct job *out_prev, *out_next; /* on the list of jobs out (loop thread) */
    unsigned gen;                    /* out_gen when it started */
};

/* Jobs on worker threads, over every user store (loop thread only). When
 * the engine stops with some still out, the stop is held until the last
 * comes back (its op then finishes as usual) or STOP_GRACE_MS passed (a user
 * function that blocks longer is left behind: c10d_shutdown returns in
 * bounded time; if its result comes back later, on another engine, it only
 * releases its op, whose work the stop failed). out_gen tells the jobs of
 * the current round from those left behind. */
static struct job *out_head;
static int jobs_out;
static unsigned out_gen;
static int stop_hook_registered;
static struct c10d__shutdown_hook stop_hook;
static uv_timer_t *stop_grace; /* non-NULL while the stop is held */

static void pump(struct user_store *us);

/* A forked child has none of the parent's workers, loop or hook. */
static void fork_child(void)
{
    out_head = NULL;
    jobs_out = 0;
    out_gen++;
    stop_hook_registered = 0;
    stop_grace = NULL;
}

static void register_fork_handler(void)
{
    pthread_atfork(NULL, NULL, fork_child);
}

static void out_remove(struct job *j)
{
    if (j->out_prev)
        j->out_prev->out_next = j->out_next;
    else
        out_head = j->out_next;
    if (j->out_next)
        j->out_next->out_prev = j->out_prev;
    j->out_prev = j->out_next = NULL;
}

static void grace_closed(uv_handle_t *h)
{
    free(h);
}

static void release_stop(void)
{
    if (stop_grace == NULL)
        return;
    uv_close((uv_handle_t *)stop_grace, grace_closed);
    stop_grace = NULL;
    c10d__engine_release_stop();
}

static void grace_over(uv_timer_t *timer)
{
    (void)timer;
    C10D_WARN("store",
              "user store: %d operation(s) still in the store's functions %d ms into the "
              "shutdown: left behind",
              jobs_out, STOP_GRACE_MS);
    while (out_head) {
        struct job *j = out_head;
        out_remove(j);
        if (j->ordered) { /* its store's next ops are not held up by it */
            j->us->serial_busy = 0;
            pump(j->us); /* the stop has begun: they fail */
        }
    }
    jobs_out = 0;
    out_gen++;
    release_stop();
}

static void on_engine_stop(struct c10d__shutdown_hook *hook)
{
    (void)hook;
    stop_hook_registered = 0;
    if (jobs_out == 0 || stop_grace != NULL)
        return;
    uv_timer_t *t = malloc(sizeof *t);
    if (t == NULL || uv_timer_init(c10d__engine_loop(), t) != 0) {
        free(t);
        return;
    }
    stop_grace = t;
    c10d__engine_hold_stop();
    uv_timer_start(t, grace_over, STOP_GRACE_MS, 0);
}

static void job_started(struct job *j)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, register_fork_handler);
    j->gen = out_gen;
    j->out_prev = NULL;
    j->out_next = out_head;
    if (out_head)
        out_head->out_prev = j;
    out_head = j;
    jobs_out++;
    if (!stop_hook_registered) {
        stop_hook.fn = on_engine_stop;
        c10d__engine_on_shutdown(&stop_hook);
        stop_hook_registered = 1;
    }
}

/* 1 if j is of the current round (and is off the list now), 0 if it was
 * left behind at an earlier stop. */
static int job_back(struct job *j)
{
    if (j->gen != out_gen)
        return 0;
    out_remove(j);
    if (--jobs_out == 0)
        release_stop();
    return 1;
}

static int waits_for_keys(int cmd)
{
    return cmd == C10D_STORE_GET || cmd == C10D_STORE_MULTI_GET || cmd == C10D_STORE_WAIT;
}

/* NULL: the command is run; else what the store lacks, for the message. */
static const char *lacks(const struct user_store *us, int cmd)
{
    switch (cmd) {
    case C10D_STORE_SET:
    case C10D_STORE_GET:
    case C10D_STORE_ADD:
    case C10D_STORE_CHECK:
    case C10D_STORE_WAIT:
    case C10D_STORE_MULTI_GET:
    case C10D_STORE_MULTI_SET:
    case C10D_STORE_APPEND:
    case C10D_STORE_DELETE_KEY:
    case C10D_STORE_PING:
        return NULL;
    case C10D_STORE_COMPARE_SET:
        return us->impl.compare_set ? NULL : "compare_set";
    case C10D_STORE_GETNUMKEYS:
        return us->impl.num_keys ? NULL : "num_keys";
    default:
        return "a function for it";
    }
}

static const char *key_at(const struct c10d__store_op *op, size_t i)
{
    return (const char *)op->req.args[i].data; /* NUL-terminated by the op */
}

static int64_t remaining_ms(const struct c10d__store_op *op)
{
    int64_t left = c10d__store_op_remaining_ms(op);
    return left > 0 ? left : 1;
}

/* Records a failure of the user's function `fn` on key `key` (may be NULL). */
static void job_fail(struct job *j, int rc, const char *fn, const char *key, int64_t timeout_ms)
{
    const struct user_store *us = j->us;
    const char *why = us->impl.error ? us->impl.error(us->impl.ctx) : NULL;
    if (rc >= 0) /* a positive return is not a status: report it as one */
        rc = C10D_ESTORE;
    j->status = rc;
    char where[300] = "";
    if (key)
        snprintf(where, sizeof where, " of key '%.200s'", key);
    if (rc == C10D_ETIMEDOUT)
        snprintf(j->msg, sizeof j->msg, "user store %s: %s%s timed out after %lld ms%s%s", us->name,
                 fn, where, (long long)timeout_ms, why && *why ? ": " : "", why ? why : "");
    else
        snprintf(j->msg, sizeof j->msg, "user store %s: %s%s failed: %s", us->name, fn, where,
                 why && *why ? why : c10d_strerror(rc));
}

/* The keys of op as C strings (args first..first+n step `step`). */
static const char **key_list(const struct c10d__store_op *op, size_t n)
{
    const char **keys = malloc((n ? n : 1) * sizeof *keys);
    for (size_t i = 0; keys && i < n; i++)
        keys[i] = key_at(op, i);
    return keys;
}

static int same(const void *a, size_t alen, const void *b, size_t blen)
{
    return alen == blen && (alen == 0 || memcmp(a, b, alen) == 0);
}

/* APPEND: compare_set until nobody changed the value in between, or get +
 * set without compare_set (another writer's change in between is lost). */
static void run_append(struct job *j)
{
    const c10d_store_impl *im = &j->us->impl;
    const struct c10d__store_op *op = j->op;
    const char *key = key_at(op, 0);
    const struct c10d__wire_str *add = &op->req.args[1];
    for (;;) {
        int ready = 0;
        void *cur = NULL;
        size_t clen = 0;
        int rc = im->check(im->ctx, &key, 1, &ready);
        if (rc != 0) {
            job_fail(j, rc, "check", key, 0);
            return;
        }
        if (ready && (rc = im->get(im->ctx, key, remaining_ms(op), &cur, &clen)) != 0) {
            job_fail(j, rc, "get", key, remaining_ms(op));
            return;
        }
        char *want = malloc(clen + add->len + 1);
        if (!want) {
            free(cur);
            j->status = C10D_ENOMEM;
            snprintf(j->msg, sizeof j->msg, "user store %s: append: out of memory", j->us->name);
            return;
        }
        if (clen)
            memcpy(want, cur, clen);
        if (add->len)
            memcpy(want + clen, add->data, add->len);
        size_t wlen = clen + add->len;
        if (!im->compare_set) {
            rc = im->set(im->ctx, key, want, wlen);
            free(cur);
            free(want);
            if (rc != 0)
                job_fail(j, rc, "set", key, 0);
            return;
        }
        void *got = NULL;
        size_t glen = 0;
        rc = im->compare_set(im->ctx, key, cur, clen, want, wlen, &got, &glen);
        int done = rc == 0 && same(got, glen, want, wlen);
        free(cur);
        free(want);
        free(got);
        if (rc != 0) {
            job_fail(j, rc, "compare_set", key, 0);
            return;
        }
        if (done)
            return;
        if (c10d__store_op_remaining_ms(op) == 0) {
            j->status = C10D_ETIMEDOUT;
            snprintf(j->msg, sizeof j->msg,
                     "user store %s: append to key '%.200s': the value kept changing until the "
                     "deadline",
                     j->us->name, key);
            return;
        }
    }
}

static void run_multi_get(struct job *j)
{
    const c10d_store_impl *im = &j->us->impl;
    const struct c10d__store_op *op = j->op;
    size_t n = op->req.nargs;
    j->items = calloc(n ? n : 1, sizeof *j->items);
    if (!j->items) {
        j->status = C10D_ENOMEM;
        snprintf(j->msg, sizeof j->msg, "user store %s: multi_get: out of memory", j->us->name);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        void *v = NULL;
        size_t len = 0;
        int64_t t = remaining_ms(op);
        int rc = im->get(im->ctx, key_at(op, i), t, &v, &len);
        if (rc != 0) {
            job_fail(j, rc, "get", key_at(op, i), t);
            return;
        }
        j->items[i].data = v;
        j->items[i].len = len;
        j->nitems = i + 1;
    }
}

/* Worker thread: the user's functions, blocking as they like. */
static void job_run(void *arg)
{
    struct job *j = arg;
    const c10d_store_impl *im = &j->us->impl;
    void *ctx = im->ctx;
    const struct c10d__store_op *op = j->op;
    const struct c10d__wire_str *a = op->req.args;
    const char *key = op->req.nargs ? key_at(op, 0) : NULL;
    int64_t t = remaining_ms(op);
    int rc = 0, flag = 0;
    const char *fn = "?";
    switch (op->req.cmd) {
    case C10D_STORE_SET:
        rc = im->set(ctx, key, a[1].data, a[1].len), fn = "set";
        break;
    case C10D_STORE_GET:
        rc = im->get(ctx, key, t, &j->data, &j->len), fn = "get";
        break;
    case C10D_STORE_ADD:
        rc = im->add(ctx, key, op->req.i64, &j->value), fn = "add";
        break;
    case C10D_STORE_COMPARE_SET:
        rc = im->compare_set(ctx, key, a[1].data, a[1].len, a[2].data, a[2].len, &j->data, &j->len);
        fn = "compare_set";
        break;
    case C10D_STORE_DELETE_KEY:
        rc = im->delete_key(ctx, key, &flag), fn = "delete_key";
        j->value = flag != 0;
        break;
    case C10D_STORE_GETNUMKEYS:
        rc = im->num_keys(ctx, &j->value), fn = "num_keys", key = NULL;
        break;
    case C10D_STORE_CHECK:
    case C10D_STORE_WAIT: {
        const char **keys = key_list(op, op->req.nargs);
        fn = op->req.cmd == C10D_STORE_CHECK ? "check" : "wait";
        if (!keys)
            rc = C10D_ENOMEM;
        else if (op->req.cmd == C10D_STORE_CHECK)
            rc = im->check(ctx, keys, op->req.nargs, &flag);
        else
            rc = im->wait(ctx, keys, op->req.nargs, t);
        j->value = flag != 0;
        free(keys);
        break;
    }
    case C10D_STORE_MULTI_SET:
        for (size_t i = 0; rc == 0 && i + 1 < op->req.nargs; i += 2)
            rc = im->set(ctx, key_at(op, i), a[i + 1].data, a[i + 1].len), key = key_at(op, i);
        fn = "set";
        break;
    case C10D_STORE_MULTI_GET:
        run_multi_get(j);
        return;
    case C10D_STORE_APPEND:
        run_append(j);
        return;
    default: /* PING: the store is in this process; its service is its own */
        return;
    }
    if (rc != 0)
        job_fail(j, rc, fn, key, t);
}

static void job_free(struct job *j)
{
    free(j->data);
    for (size_t i = 0; i < j->nitems; i++)
        free((void *)j->items[i].data);
    free(j->items);
    free(j);
}

/* Loop thread: the result into the op, which finishes. */
static void job_after(void *arg)
{
    struct job *j = arg;
    struct user_store *us = j->us;
    struct c10d__store_op *op = j->op;
    if (!job_back(j)) {
        /* Left behind at a stop; the store has moved on (its order, its
         * queue), and the op's work was failed then: release the op. */
        c10d__store_op_finish(op, C10D_EABORTED, "user store %s: left behind at shutdown",
                              us->name);
        job_free(j);
        return;
    }
    c10d__store_ref(&us->base); /* the op's reference may be the last */
    if (j->ordered)
        us->serial_busy = 0;
    int rc = j->status;
    if (rc == 0) {
        op->res.value = j->value;
        if (op->req.cmd == C10D_STORE_GET || op->req.cmd == C10D_STORE_COMPARE_SET)
            rc = c10d__store_op_set_data(op, j->data, j->len);
        else if (op->req.cmd == C10D_STORE_MULTI_GET) {
            struct c10d__wire_str *v = calloc(j->nitems ? j->nitems : 1, sizeof *v);
            for (size_t i = 0; v && i < j->nitems; i++)
                v[i] = (struct c10d__wire_str){j->items[i].data, j->items[i].len};
            rc = v ? c10d__store_op_set_items(op, v, j->nitems, 0) : C10D_ENOMEM;
            free(v);
        }
        if (rc < 0)
            snprintf(j->msg, sizeof j->msg, "user store %s: out of memory for the result",
                     us->name);
    }
    c10d__store_op_finish(op, rc, "%s", j->msg);
    job_free(j);
    pump(us);
    c10d__store_unref(&us->base);
}

/* Loop thread: starts the ops whose turn it is. */
static void pump(struct user_store *us)
{
    while (us->head && !us->serial_busy) {
        struct c10d__store_op *op = us->head;
        us->head = op->next;
        if (!us->head)
            us->tail = NULL;
        op->next = NULL;
        /* An op that finished during the engine's stop must not start the
         * next on a worker: its result could no longer reach the loop, and
         * the op would be lost (and leaked) instead of failed. */
        if (c10d__engine_stop_begun()) {
            c10d__store_op_finish(op, C10D_EABORTED, "user store %s: the engine is shutting down",
                                  us->name);
            continue;
        }
        struct job *j = calloc(1, sizeof *j);
        int rc = j ? 0 : C10D_ENOMEM;
        if (j) {
            *j = (struct job){.us = us, .op = op, .ordered = !waits_for_keys(op->req.cmd)};
            rc = c10d__engine_offload(job_run, job_after, j);
        }
        if (rc < 0) {
            free(j);
            c10d__store_op_finish(op, rc, "user store %s: cannot start the operation: %s", us->name,
                                  c10d_last_error());
            continue;
        }
        job_started(j);
        if (j->ordered)
            us->serial_busy = 1;
    }
}

static void user_submit(c10d_store *s, struct c10d__store_op *op)
{
    struct user_store *us = (struct user_store *)s;
    if (us->closed) {
        c10d__store_op_finish(op, C10D_ECLOSED, "user store %s: closed", us->name);
        return;
    }
    const char *missing = lacks(us, op->req.cmd);
    if (missing) {
        c10d__store_op_finish(op, C10D_EUNSUPPORTED,
                              "user store %s: %s is not supported: the store's c10d_store_impl "
                              "lacks %s",
                              us->name, c10d__wire_cmd_name(op->req.cmd), missing);
        return;
    }
    op->next = NULL;
    if (us->tail)
        us->tail->next = op;
    else
        us->head = op;
    us->tail = op;
    pump(us);
}

/* Ops on worker threads finish on their own (each holds a reference). */
static void user_close(c10d_store *s)
{
    struct user_store *us = (struct user_store *)s;
    us->closed = 1;
    struct c10d__store_op *list = us->head;
    us->head = us->tail = NULL;
    c10d__store_op_fail_list(list, C10D_ECLOSED, "user store %s: closed", us->name);
    c10d__store_unref(s);
}

static void user_destroy(c10d_store *s)
{
    struct user_store *us = (struct user_store *)s;
    if (us->impl.destroy)
        us->impl.destroy(us->impl.ctx);
    free(us);
}

static const struct c10d__store_vtable user_vtable = {
    .kind = "user",
    .submit = user_submit,
    .close = user_close,
    .destroy = user_destroy,
};

int c10d_store_from_impl(const c10d_store_impl *impl, c10d_store **out)
{
    if (out)
        *out = NULL;
    if (!impl || !out)
        return c10d__fail(C10D_EINVAL, "store from_impl: %s is NULL", !impl ? "impl" : "out");
    size_t need = offsetof(c10d_store_impl, delete_key) + sizeof impl->delete_key;
    if (impl->struct_size < need)
        return c10d__fail(C10D_EINVAL,
                          "store from_impl: impl->struct_size is %zu (initialise it with "
                          "C10D_STORE_IMPL_INIT)",
                          impl->struct_size);
    struct user_store *us = calloc(1, sizeof *us);
    if (!us)
        return c10d__fail(C10D_ENOMEM, "store from_impl: out of memory");
    memcpy(&us->impl, impl,
           impl->struct_size < sizeof us->impl ? impl->struct_size : sizeof us->impl);
    const char *missing = !us->impl.set          ? "set"
                          : !us->impl.get        ? "get"
                          : !us->impl.add        ? "add"
                          : !us->impl.check      ? "check"
                          : !us->impl.wait       ? "wait"
                          : !us->impl.delete_key ? "delete_key"
                                                 : NULL;
    if (missing) {
        free(us);
        return c10d__fail(C10D_EINVAL, "store from_impl: the required function %s is NULL",
                          missing);
    }
    snprintf(us->name, sizeof us->name, "%s", us->impl.name ? us->impl.name : "user");
    us->impl.name = NULL; /* the caller's string need not outlive this call */
    c10d__store_init(&us->base, &user_vtable);
    *out = &us->base;
    return 0;
}
