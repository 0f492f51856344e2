/* The completion poller (poller.h). One mutex guards the queues' links and
 * the list of non-empty queues; `ready` and `done` run without it, on the
 * loop thread, which is the only one that takes items out (cancel included),
 * so the head it polls cannot vanish under it. */
#include "poller.h"

#include "error.h"
#include "loop.h"

#include <pthread.h>
#include <uv.h>

static uv_once_t poll_once = UV_ONCE_INIT;
static uv_mutex_t poll_mutex;
/* Guarded by poll_mutex. */
static struct c10d__poll_queue *active;
static uint64_t pending;
static int armed;      /* a loop polls (handles started) */
static int arm_posted; /* the arm task is queued */
static struct c10d__task arm_task;
/* Loop thread only. */
static int handles_open;
static uv_prepare_t prepare;
static uv_timer_t backoff;
static uint64_t interval_ms;
static struct c10d__shutdown_hook hook;

static void fork_child(void)
{
    uv_mutex_init(&poll_mutex);
    active = NULL;
    pending = 0;
    armed = arm_posted = 0;
    handles_open = 0;
}

static void poll_init_once(void)
{
    uv_mutex_init(&poll_mutex);
    pthread_atfork(NULL, NULL, fork_child);
}

void c10d__poll_queue_init(struct c10d__poll_queue *q)
{
    q->head = q->tail = NULL;
    q->next_active = NULL;
    q->active = 0;
}

uint64_t c10d__poll_pending(void)
{
    uv_once(&poll_once, poll_init_once);
    uv_mutex_lock(&poll_mutex);
    uint64_t n = pending;
    uv_mutex_unlock(&poll_mutex);
    return n;
}

/* poll_mutex held. */
static void unlink_queue(struct c10d__poll_queue *q)
{
    for (struct c10d__poll_queue **pp = &active; *pp != NULL; pp = &(*pp)->next_active)
        if (*pp == q) {
            *pp = q->next_active;
            break;
        }
    q->next_active = NULL;
    q->active = 0;
}

int c10d__poll_run(void)
{
    uv_once(&poll_once, poll_init_once);
    int completed = 0;
    uv_mutex_lock(&poll_mutex);
    struct c10d__poll_queue *q = active;
    while (q != NULL) {
        struct c10d__poll_item *item = q->head;
        if (item == NULL) {
            struct c10d__poll_queue *next = q->next_active;
            unlink_queue(q);
            q = next;
            continue;
        }
        uv_mutex_unlock(&poll_mutex);
        int finished = item->ready(item);
        uv_mutex_lock(&poll_mutex);
        if (!finished) {
            q = q->next_active;
            continue;
        }
        q->head = item->next;
        if (q->head == NULL) {
            q->tail = NULL;
            unlink_queue(q);
        }
        pending--;
        uv_mutex_unlock(&poll_mutex);
        item->next = NULL;
        item->done(item);
        completed++;
        uv_mutex_lock(&poll_mutex);
        /* `done` may have cancelled queues: start over from the list's head. */
        q = active;
    }
    uv_mutex_unlock(&poll_mutex);
    return completed;
}

/* Loop thread: stops the handles once every queue is empty. Returns whether
 * anything is left to poll. */
static int disarm_if_idle(void)
{
    uv_mutex_lock(&poll_mutex);
    int idle = active == NULL;
    if (idle)
        armed = 0;
    uv_mutex_unlock(&poll_mutex);
    if (idle) {
        uv_prepare_stop(&prepare);
        uv_timer_stop(&backoff);
    }
    return !idle;
}

static void on_prepare(uv_prepare_t *p)
{
    (void)p;
    if (c10d__poll_run() > 0) {
        c10d__engine_busy();
        interval_ms = 1;
    }
    disarm_if_idle();
}

/* The loop sleeps in epoll between turns once it stops busy-polling: this
 * wakes it to poll again, less often the longer nothing completes. */
static void on_backoff(uv_timer_t *t)
{
    if (c10d__poll_run() > 0) {
        c10d__engine_busy();
        interval_ms = 1;
    } else if (interval_ms < C10D__POLL_MAX_INTERVAL_MS) {
        interval_ms *= 2;
    }
    if (disarm_if_idle())
        uv_timer_start(t, on_backoff, interval_ms, 0);
}

static void on_shutdown(struct c10d__shutdown_hook *h)
{
    (void)h;
    uv_mutex_lock(&poll_mutex);
    armed = 0;
    uv_mutex_unlock(&poll_mutex);
    if (handles_open) {
        uv_close((uv_handle_t *)&prepare, NULL);
        uv_close((uv_handle_t *)&backoff, NULL);
        handles_open = 0;
    }
}

static void arm_task_fn(struct c10d__task *t)
{
    (void)t;
    if (c10d__engine_stop_begun()) {
        /* Our hook has run: the owners' aborts cancel their queues. */
        uv_mutex_lock(&poll_mutex);
        arm_posted = 0;
        uv_mutex_unlock(&poll_mutex);
        return;
    }
    if (!handles_open) {
        uv_prepare_init(c10d__engine_loop(), &prepare);
        uv_timer_init(c10d__engine_loop(), &backoff);
        hook.fn = on_shutdown;
        c10d__engine_on_shutdown(&hook);
        handles_open = 1;
    }
    uv_mutex_lock(&poll_mutex);
    arm_posted = 0;
    armed = 1;
    uv_mutex_unlock(&poll_mutex);
    interval_ms = 1;
    uv_prepare_start(&prepare, on_prepare);
    uv_timer_start(&backoff, on_backoff, interval_ms, 0);
    c10d__engine_busy();
}

int c10d__poll_push(struct c10d__poll_queue *q, struct c10d__poll_item *item)
{
    uv_once(&poll_once, poll_init_once);
    if (c10d__engine_stopping())
        return c10d__fail(C10D_EABORTED, "engine: shutting down; no new work is accepted");
    item->next = NULL;
    uv_mutex_lock(&poll_mutex);
    if (q->tail != NULL)
        q->tail->next = item;
    else
        q->head = item;
    q->tail = item;
    if (!q->active) {
        q->active = 1;
        q->next_active = active;
        active = q;
    }
    pending++;
    int post = !armed && !arm_posted;
    if (post) {
        arm_posted = 1;
        arm_task.fn = arm_task_fn;
    }
    uv_mutex_unlock(&poll_mutex);
    if (post && c10d__engine_post(&arm_task) != 0) {
        /* Shutdown began meanwhile: the owner's abort cancels the queue. */
        uv_mutex_lock(&poll_mutex);
        arm_posted = 0;
        uv_mutex_unlock(&poll_mutex);
    }
    return 0;
}

struct c10d__poll_item *c10d__poll_cancel(struct c10d__poll_queue *q)
{
    uv_once(&poll_once, poll_init_once);
    uv_mutex_lock(&poll_mutex);
    struct c10d__poll_item *items = q->head;
    for (struct c10d__poll_item *it = items; it != NULL; it = it->next)
        pending--;
    q->head = q->tail = NULL;
    if (q->active)
        unlink_queue(q);
    uv_mutex_unlock(&poll_mutex);
    return items;
}
