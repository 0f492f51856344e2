/* Posting a call to the loop and waiting for it (see loop_call.h): a work the
 * loop side completes, and one atomic word that settles who owns `arg` when
 * the waiter gives up at the moment the loop side answers. */
#include "loop_call.h"

#include "error.h"
#include "loop.h"
#include "work.h"

#include <stdatomic.h>
#include <stdlib.h>

enum { CALL_PENDING, CALL_ANSWERED, CALL_ABANDONED };

struct c10d__loop_call {
    struct c10d__task task;
    c10d__loop_call_fn fn;
    void *arg;
    void (*release)(void *arg);
    c10d_work *work; /* the call is its payload */
    atomic_int state;
};

/* Any unique address: tells loop calls from other producers' payloads. */
static const char payload_kind = 'c';

static void call_task(struct c10d__task *t)
{
    struct c10d__loop_call *c = (struct c10d__loop_call *)t;
    c->fn(c, c->arg);
}

void c10d__loop_call_done(struct c10d__loop_call *c, int status, const char *message)
{
    c10d_work *w = c->work;
    int was = CALL_PENDING;
    /* The waiter left first: arg is ours, and nobody reads the answer. */
    if (!atomic_compare_exchange_strong(&c->state, &was, CALL_ANSWERED) && c->release != NULL)
        c->release(c->arg);
    c10d__work_complete(w, status, "%s", message != NULL ? message : "");
    c10d_work_release(w); /* the loop side's */
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
    c10d_work *w;
    int rc = c10d__work_create(&w, "loop call", 0);
    if (rc != 0) {
        free(c);
        return rc;
    }
    c10d__work_set_payload(w, &payload_kind, c, free);
    c->fn = fn;
    c->arg = arg;
    c->release = release;
    c->work = w;
    c->task.fn = call_task;
    atomic_init(&c->state, CALL_PENDING);
    c10d_work_retain(w); /* the loop side's */
    rc = c10d__engine_post(&c->task);
    if (rc != 0) {
        c10d_work_release(w);
        c10d__work_complete(w, rc, "%s", c10d_last_error());
        c10d_work_release(w);
        return rc;
    }
    /* Every blocking path has a deadline: there is no "wait for ever". */
    rc = c10d__work_wait(w, timeout_ms > 0 ? timeout_ms : 1);
    int was = CALL_PENDING;
    if (atomic_compare_exchange_strong(&c->state, &was, CALL_ABANDONED)) {
        /* No answer: the wait timed out, or shutdown aborted the work before
         * the loop side ran. Either way arg is the loop side's now. */
        *abandoned = 1;
        int done = c10d_work_test(w) == 1;
        c10d_work_release(w);
        return done ? rc : c10d__fail(C10D_ETIMEDOUT, "%s", on_timeout);
    }
    /* Answered: the completion follows the answer at once. */
    rc = c10d__work_wait(w, -1);
    c10d_work_release(w);
    return rc;
}
