/* Posting a call to the loop and waiting for it (see loop_call.h). */
#include "loop_call.h"

#include "error.h"
#include "loop.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <uv.h>

struct c10d__loop_call {
    struct c10d__task task;
    c10d__loop_call_fn fn;
    void *arg;
    void (*release)(void *arg);
    uv_mutex_t mutex;
    uv_cond_t cond;
    /* Guarded by mutex. */
    int done, abandoned, status;
    char message[1024];
    atomic_int refs; /* the waiter's and the loop side's */
};

static void call_unref(struct c10d__loop_call *c)
{
    if (atomic_fetch_sub_explicit(&c->refs, 1, memory_order_acq_rel) == 1) {
        uv_cond_destroy(&c->cond);
        uv_mutex_destroy(&c->mutex);
        free(c);
    }
}

static void call_task(struct c10d__task *t)
{
    struct c10d__loop_call *c = (struct c10d__loop_call *)t;
    c->fn(c, c->arg);
}

void c10d__loop_call_done(struct c10d__loop_call *c, int status, const char *message)
{
    uv_mutex_lock(&c->mutex);
    c->done = 1;
    c->status = status;
    snprintf(c->message, sizeof c->message, "%s", message != NULL ? message : "");
    int abandoned = c->abandoned;
    uv_cond_signal(&c->cond);
    uv_mutex_unlock(&c->mutex);
    if (abandoned && c->release != NULL)
        c->release(c->arg);
    call_unref(c);
}

int c10d__loop_call_run(c10d__loop_call_fn fn, void *arg, void (*release)(void *arg),
                        int64_t timeout_ms, const char *on_timeout, int *abandoned)
{
    *abandoned = 0;
    if (c10d__on_loop_thread())
        return c10d__fail(C10D_EDEADLK, "%s: a blocking call cannot run on the loop thread",
                          on_timeout);
    struct c10d__loop_call *c = calloc(1, sizeof *c);
    if (c == NULL)
        return c10d__fail(C10D_ENOMEM, "out of memory");
    c->fn = fn;
    c->arg = arg;
    c->release = release;
    c->task.fn = call_task;
    uv_mutex_init(&c->mutex);
    uv_cond_init(&c->cond);
    atomic_init(&c->refs, 2);
    int rc = c10d__engine_post(&c->task);
    if (rc != 0) {
        atomic_store(&c->refs, 1);
        call_unref(c);
        return rc;
    }
    /* Every blocking path has a deadline: there is no "wait for ever". */
    uint64_t deadline = c10d__now_ns() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 1) * 1000000u;
    uv_mutex_lock(&c->mutex);
    while (!c->done) {
        uint64_t now = c10d__now_ns();
        if (now >= deadline)
            break;
        uv_cond_timedwait(&c->cond, &c->mutex, deadline - now);
    }
    int done = c->done;
    if (!done)
        c->abandoned = *abandoned = 1;
    rc = done ? c->status : C10D_ETIMEDOUT;
    if (done && rc < 0)
        c10d__fail(rc, "%s", c->message);
    uv_mutex_unlock(&c->mutex);
    call_unref(c);
    if (!done)
        return c10d__fail(C10D_ETIMEDOUT, "%s", on_timeout);
    return rc;
}
