/* Works. Over 800 lines because a work's states (pending, parked for a
 * waiter, done, callbacks drained on the loop or on the completing thread)
 * share one lock and one reference count, and splitting them would spread
 * that invariant over files.
 *
 * Reference counting keeps a work alive while anyone may still touch it:
 * the creator's reference, one for the pending list (until completion), one for
 * a posted arm/drain task, one while its deadline timer is open. Whoever drops
 * the last one frees it, so a callback may release the work it is called for.
 *
 * Lock order: work->mutex, then the engine's mutex (posting). pending_mutex is
 * never held while taking a work's mutex. Both are futex locks (lock.h): a
 * group's op takes them five times. */
#include "work.h"

#include "block_cache.h"
#include "env.h"
#include "flight_recorder.h"
#include "list.h"
#include "lock.h"
#include "log.h"
#include "loop.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <limits.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#define MAX_WAIT_MS (100LL * 365 * 24 * 3600 * 1000)

/* A group's op has three callbacks (its bookkeeping before and after the
 * caller's), and its name is about a hundred bytes: kept in the work, they
 * save three of the four allocations an op made. */
#define INLINE_CALLBACKS 3
#define INLINE_WHAT      256

/* A name made when first read (c10d__work_create_named); zero: made. */
enum name_state { NAME_MADE, NAME_DEFERRED, NAME_MAKING };

struct work_callback {
    c10d_work_cb cb;
    void *arg;
    int anywhere; /* may run on the thread that completes the work (c10d__work_on_complete_anywhere)
                   */
};

/* Where a parked work's op is (c10d__work_park): waiting for a taker, run by
 * a waiting thread, or handed to its producer's loop. */
enum park_state { PARK_NONE, PARK_PARKED, PARK_CLAIMED, PARK_ADOPTED };

enum timer_state { TIMER_NONE, TIMER_ARMED, TIMER_CLOSING };

struct c10d_work {
    atomic_int refs;
    c10d__lock mutex; /* engine/lock.h: taken at least twice per op */
    /* Guarded by mutex. */
    int done;
    /* 1 once the work is done and every callback registered so far has run:
     * what waiters poll and sleep on as a futex word (no lock on the way in
     * or out); `sleepers` says whether the wake-up system call is needed. */
    atomic_int settled;
    atomic_int sleepers;
    int status;
    char *message;
    struct work_callback *callbacks; /* inline_callbacks until more are added */
    size_t ncallbacks, callbacks_cap, next_callback;
    struct work_callback inline_callbacks[INLINE_CALLBACKS];
    /* Runs once every callback registered before completion ran
     * (c10d__work_on_complete_around); cb NULL: none, or taken. */
    struct work_callback last;
    int drain_posted;
    /* A backend's way to make a stream wait for this work (NULL: host wait). */
    int (*stream_wait)(c10d_work *w, void *stream, void *arg);
    void *stream_wait_arg;
    /* How its producer stops it early; created by c10d_work_create: completes
     * it with C10D_ECANCELED. NULL: it cannot be cancelled. */
    int (*cancel)(c10d_work *w, void *arg);
    void *cancel_arg;
    int user_created;
    /* A shutdown's sweep completed it before its creator had it (work_new):
     * read by the creator's thread only. */
    int done_at_creation;
    /* What its producer hands back with it (a store op's result), freed with
     * the work; `payload_kind` tells producers' payloads apart. */
    const void *payload_kind;
    void *payload;
    void (*payload_free)(void *payload);
    /* Set at creation. */
    char *what; /* inline_what where it fits */
    /* A deferred name: what follows the prefix in inline_what, made from
     * name_args by name_make once name_state leaves NAME_DEFERRED. */
    atomic_int name_state;
    size_t name_at;
    void (*name_make)(const void *args, char *buf, size_t len);
    int64_t timeout_ms;
    uint64_t created_ms;
    atomic_int source_rank;
    atomic_int failed_rank;
    /* Device time of a GPU op with timing on (ms; < 0: none), written by its
     * backend before completing it, read once it has completed. */
    float duration_ms;
    /* Its flight recorder entry (record id + 1; 0: none), completed with it. */
    _Atomic uint64_t fr_id;
    /* A parked op (c10d__work_park): who runs it is decided once, by a
     * compare-and-swap on park_state. */
    atomic_int park_state;
    atomic_int awaited; /* a callback that runs on the loop was registered */
    const struct c10d__work_park *park;
    void *park_arg;
    atomic_int armed; /* the deadline was handed to the loop */
    /* Completed by someone else while a waiter ran its op: the callbacks
     * (which free the op) wait until that waiter let go of it. Set under
     * mutex; taken (exchanged to 0) by whichever of the completer and the
     * waiter sees the other's step last (run_parked). */
    atomic_int drain_deferred;
    /* Loop thread only. */
    enum timer_state timer_state;
    struct c10d__task arm_task;
    struct c10d__task drain_task;
    /* Guarded by pending_mutex. */
    struct c10d_work *pending_prev, *pending_next;
    int in_pending;
    /* Not zeroed at creation, half of the work's bytes: each is written
     * before it is read (the name by its maker, the timer when a deadline
     * is armed, timer_state saying so). */
    char inline_what[INLINE_WHAT];
    unsigned char name_args[C10D__WORK_NAME_ARGS];
    uv_timer_t timer;
};

#define WORK_ZEROED offsetof(struct c10d_work, inline_what)

/* Made per op from the thread's block cache, and by malloc when that is
 * empty: within glibc's per-thread cache of freed chunks (1032 bytes),
 * malloc stays on its fast path then too. */
_Static_assert(sizeof(struct c10d_work) <= 1024, "a work outgrew malloc's thread cache");

static c10d__lock pending_mutex;
static struct c10d_work *pending_head, *pending_tail;
static size_t pending_count;
static uv_once_t work_once = UV_ONCE_INIT;

static void pending_fork_prepare(void)
{
    c10d__lock_acquire(&pending_mutex);
}

static void pending_fork_parent(void)
{
    c10d__lock_release(&pending_mutex);
}

/* Works of the parent mean nothing in the child (see c10d_shutdown's note). */
static void pending_fork_child(void)
{
    c10d__lock_release(&pending_mutex);
    pending_head = pending_tail = NULL;
    pending_count = 0;
}

static void abort_all_at_shutdown(void)
{
    c10d__work_abort_all(C10D_EABORTED, "the engine was shut down (c10d_shutdown)");
}

static struct c10d__shutdown_sweep shutdown_sweep = {abort_all_at_shutdown, NULL};

static void work_init_once(void)
{
    pthread_atfork(pending_fork_prepare, pending_fork_parent, pending_fork_child);
    c10d__engine_add_sweep(&shutdown_sweep);
}

static void pending_add(c10d_work *w)
{
    c10d__lock_acquire(&pending_mutex);
    C10D__LIST_PUSH_FRONT(pending_head, pending_tail, w, pending_prev, pending_next);
    w->in_pending = 1;
    pending_count++;
    c10d__lock_release(&pending_mutex);
}

/* Returns 1 if it was in the list (the caller then owns the list's reference). */
static int pending_remove(c10d_work *w)
{
    c10d__lock_acquire(&pending_mutex);
    int was_in = w->in_pending;
    if (was_in) {
        C10D__LIST_REMOVE(pending_head, pending_tail, w, pending_prev, pending_next);
        w->in_pending = 0;
        pending_count--;
    }
    c10d__lock_release(&pending_mutex);
    return was_in;
}

void c10d__work_init(void)
{
    uv_once(&work_once, work_init_once);
}

size_t c10d__work_pending_count(void)
{
    uv_once(&work_once, work_init_once);
    c10d__lock_acquire(&pending_mutex);
    size_t n = pending_count;
    c10d__lock_release(&pending_mutex);
    return n;
}

static void work_free(c10d_work *w)
{
    if (w->payload_free != NULL)
        w->payload_free(w->payload);
    free(w->message);
    if (w->what != w->inline_what)
        free(w->what);
    if (w->callbacks != w->inline_callbacks)
        free(w->callbacks);
    c10d__block_put(C10D__BLOCK_WORK, w);
}

void c10d__work_set_payload(c10d_work *w, const void *kind, void *payload,
                            void (*free_fn)(void *payload))
{
    w->payload_kind = kind;
    w->payload = payload;
    w->payload_free = free_fn;
}

void *c10d__work_payload(c10d_work *w, const void *kind)
{
    return w != NULL && w->payload_kind == kind ? w->payload : NULL;
}

/* Any thread: the first reader of a deferred name makes it, the others
 * wait for that (a few hundred instructions). */
static const char *what_of(c10d_work *w)
{
    if (atomic_load_explicit(&w->name_state, memory_order_acquire) == NAME_MADE)
        return w->what;
    int expected = NAME_DEFERRED;
    if (atomic_compare_exchange_strong(&w->name_state, &expected, NAME_MAKING)) {
        w->name_make(w->name_args, w->inline_what + w->name_at, sizeof w->inline_what - w->name_at);
        atomic_store_explicit(&w->name_state, NAME_MADE, memory_order_release);
    }
    while (atomic_load_explicit(&w->name_state, memory_order_acquire) != NAME_MADE)
        sched_yield();
    return w->what;
}

const char *c10d__work_what(c10d_work *w)
{
    return what_of(w);
}

void c10d_work_retain(c10d_work *w)
{
    if (w != NULL)
        atomic_fetch_add_explicit(&w->refs, 1, memory_order_relaxed);
}

void c10d__work_drop(c10d_work *w)
{
    if (w != NULL && atomic_fetch_sub_explicit(&w->refs, 1, memory_order_acq_rel) == 1)
        work_free(w);
}

void c10d_work_release(c10d_work *w)
{
    if (w == NULL)
        return;
    /* A handle let go of without a wait: nobody will run its op here. */
    c10d__work_unpark(w);
    c10d__work_drop(w);
}

static void timer_closed(uv_handle_t *h)
{
    c10d_work_release(h->data);
}

/* w->mutex held: the work is done and no callback is left to run. Returns
 * whether a waiter sleeps and must be woken (after the unlock). */
static int settle_locked(c10d_work *w)
{
    /* The store and the sleepers' check are sequentially consistent, as are a
     * sleeper's increment and its check of `settled`: one side sees the other. */
    atomic_store(&w->settled, 1);
    return atomic_load(&w->sleepers) > 0;
}

/* w->mutex held: whether a callback is still to run. */
static int has_due_locked(const c10d_work *w)
{
    return w->next_callback < w->ncallbacks || w->last.cb != NULL;
}

/* Callbacks run in batches: one lock round per batch, not per callback. */
#define DRAIN_BATCH 4

/* w->mutex held, w done: takes the callbacks due next, in order, into out
 * (at most DRAIN_BATCH; with here_only, up to the first one that may not run
 * anywhere), the last one once the list is through. Returns how many. */
static size_t take_due_locked(c10d_work *w, struct work_callback *out, int here_only)
{
    size_t n = 0;
    while (n < DRAIN_BATCH && w->next_callback < w->ncallbacks) {
        if (here_only && !w->callbacks[w->next_callback].anywhere)
            return n;
        out[n++] = w->callbacks[w->next_callback++];
    }
    /* On the loop the last one runs in a batch of its own, taken after a
     * look at the list under the mutex: a callback its producer registers
     * after the op completed (a group's op_done waits for the submitter to
     * let go) still runs before it. The waiting thread's drain starts after
     * the submitter returned. */
    if (n < DRAIN_BATCH && w->next_callback == w->ncallbacks && w->last.cb != NULL &&
        (here_only ? w->last.anywhere : n == 0)) {
        out[n++] = w->last;
        w->last.cb = NULL;
    }
    return n;
}

/* Without the mutex: status was written before done, which the taker saw. */
static void run_batch(c10d_work *w, const struct work_callback *batch, size_t n)
{
    for (size_t i = 0; i < n; i++)
        batch[i].cb(w, w->status, batch[i].arg);
}

/* Loop thread: runs every callback not yet run, in order, then lets waiters
 * go. Holds the drain task's reference, so callbacks may release theirs. */
static void work_drain(c10d_work *w)
{
    c10d__lock_acquire(&w->mutex);
    w->drain_posted = 0;
    int close_timer = w->timer_state == TIMER_ARMED;
    if (close_timer)
        w->timer_state = TIMER_CLOSING;
    struct work_callback batch[DRAIN_BATCH];
    size_t n;
    while ((n = take_due_locked(w, batch, 0)) > 0) {
        c10d__lock_release(&w->mutex);
        run_batch(w, batch, n);
        c10d__lock_acquire(&w->mutex);
    }
    int wake = settle_locked(w);
    c10d__lock_release(&w->mutex);
    if (wake)
        c10d__futex_wake(&w->settled, INT_MAX);
    if (close_timer) {
        uv_timer_stop(&w->timer);
        uv_close((uv_handle_t *)&w->timer, timer_closed);
    }
    c10d_work_release(w);
}

static void drain_task_fn(struct c10d__task *t)
{
    work_drain((c10d_work *)((char *)t - offsetof(c10d_work, drain_task)));
}

/* Called with w->mutex held and w->done set. Schedules work_drain unless one is
 * already scheduled. Returns 0, or the posting error (nothing scheduled). */
static int schedule_drain_locked(c10d_work *w, int *run_inline)
{
    *run_inline = 0;
    if (w->drain_posted)
        return 0;
    c10d_work_retain(w);
    w->drain_posted = 1;
    int rc = c10d__engine_post(&w->drain_task);
    if (rc == 0)
        return 0;
    if (c10d__on_loop_thread()) {
        /* Shutdown has closed posting; we are the loop, so run it ourselves
         * once the lock is dropped. */
        *run_inline = 1;
        return 0;
    }
    w->drain_posted = 0;
    c10d_work_release(w);
    return rc;
}

/* w->mutex held, w done: whether the callbacks may run on this thread (a
 * success completed off the loop, every callback left one that may run
 * anywhere, no deadline timer to close on the loop). The waiter is then let
 * go without a turn of the loop. */
static int runs_here_locked(const c10d_work *w)
{
    if (c10d__on_loop_thread() || w->drain_posted || atomic_load(&w->drain_deferred) ||
        w->timer_state != TIMER_NONE || !has_due_locked(w))
        return 0;
    for (size_t i = w->next_callback; i < w->ncallbacks; i++)
        if (!w->callbacks[i].anywhere)
            return 0;
    return w->last.cb == NULL || w->last.anywhere;
}

/* The completing thread, its waiter, runs the callbacks that may run
 * anywhere, starting with the batch it took when it completed the work; the
 * first one that may not (added meanwhile) and the rest go to the loop, with
 * a reference of their own. The waiter's keeps the work until then. */
static void drain_here(c10d_work *w, struct work_callback *batch, size_t n)
{
    do {
        run_batch(w, batch, n);
        c10d__lock_acquire(&w->mutex);
        n = take_due_locked(w, batch, 1);
        if (n > 0)
            c10d__lock_release(&w->mutex);
    } while (n > 0);
    if (has_due_locked(w)) {
        c10d_work_retain(w); /* the drain's (work_drain lets it go) */
        int posted = c10d__engine_post(&w->drain_task) == 0;
        c10d__lock_release(&w->mutex);
        /* Posting closed (the engine stops): its last sweep may have passed
         * this work while its drain was ours (drain_posted), so this thread
         * runs the rest, as run_parked does (no timer was armed: the op
         * completed here). Off the pending list first, as run_parked's work
         * is by then: a sweep that came now would start a second drain
         * beside this one. */
        if (!posted) {
            if (pending_remove(w))
                c10d_work_release(w); /* the list's; never the last: the waiter holds one */
            work_drain(w);
        }
        return;
    }
    w->drain_posted = 0;
    int wake = settle_locked(w);
    c10d__lock_release(&w->mutex);
    if (wake)
        c10d__futex_wake(&w->settled, INT_MAX);
}

static int work_vcomplete(c10d_work *w, int here_ok, int status, const char *fmt, va_list ap)
{
    char *message = NULL;
    if (fmt != NULL && *fmt != '\0' && vasprintf(&message, fmt, ap) < 0)
        message = NULL;
    /* A parked op goes to its loop first: its task is posted before the
     * callbacks that free it. */
    c10d__work_unpark(w);
    c10d__lock_acquire(&w->mutex);
    if (w->done) {
        c10d__lock_release(&w->mutex);
        free(message);
        return 0;
    }
    w->done = 1;
    w->status = status;
    w->message = message;
    /* This call's own, to its last look at w: once orphaned, the engine's
     * last sweep may run the callbacks and free w meanwhile. A completion
     * on the waiting thread needs none: its waiter holds one through its
     * wait (c10d__work_complete_here), two locked instructions fewer per
     * op. */
    if (!here_ok)
        c10d_work_retain(w);
    /* Before any waiter can return: a waiter that returns and dumps at once sees its op
     * completed. */
    uint64_t rid = atomic_load(&w->fr_id);
    if (rid != 0)
        c10d__fr_completed(rid, status);
    int run_inline = 0, rc = 0;
    struct work_callback batch[DRAIN_BATCH];
    size_t here = 0;
    if (!here_ok && atomic_load(&w->park_state) == PARK_CLAIMED) {
        /* run_parked schedules it once the waiter let go, unless the waiter
         * let go between the two looks at park_state: then whoever takes the
         * flag back schedules it (all four steps sequentially consistent). */
        atomic_store(&w->drain_deferred, 1);
        if (atomic_load(&w->park_state) != PARK_CLAIMED && atomic_exchange(&w->drain_deferred, 0))
            rc = schedule_drain_locked(w, &run_inline);
    } else if (here_ok && status == 0 && runs_here_locked(w)) {
        /* The drain is ours: add_callback sees it as scheduled. */
        w->drain_posted = 1;
        here = take_due_locked(w, batch, 1);
    } else {
        rc = schedule_drain_locked(w, &run_inline);
    }
    /* Posting refused (the engine is stopping) with callbacks to run: the
     * work stays on the pending list, where the engine's last sweep, on the
     * loop thread, finds it done and runs them (abort_one). */
    int orphaned = rc != 0 && has_due_locked(w);
    /* With no callback to run waiters need not wait for the drain. */
    int wake = 0;
    if (!here && !has_due_locked(w))
        wake = settle_locked(w);
    c10d__lock_release(&w->mutex);
    /* After the unlock: a waiter woken on this CPU would otherwise run only to
     * block on the mutex we still hold (two more context switches per op). The
     * pending list's reference keeps the work alive until the end. */
    if (wake)
        c10d__futex_wake(&w->settled, INT_MAX);
    if (orphaned)
        C10D_DEBUG("work",
                   "'%s' completed while the engine stops: its callbacks run in the "
                   "engine's last sweep",
                   what_of(w));
    if (run_inline)
        work_drain(w);
    if (here)
        drain_here(w, batch, here);
    if (status < 0)
        C10D_DEBUG("work", "'%s' failed: %s: %s", what_of(w), c10d_status_name(status),
                   message != NULL ? message : "");
    if (!orphaned && pending_remove(w))
        c10d_work_release(w);
    if (!here_ok)
        c10d__work_drop(w);
    return 1;
}

int c10d__work_complete(c10d_work *w, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = work_vcomplete(w, 0, status, fmt, ap);
    va_end(ap);
    return rc;
}

/* A varargs frame only to hand work_vcomplete an (empty) va_list. */
static int complete_here(c10d_work *w, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = work_vcomplete(w, 1, 0, fmt, ap);
    va_end(ap);
    return rc;
}

int c10d__work_complete_here(c10d_work *w)
{
    return complete_here(w, NULL);
}

static int complete_plain(c10d_work *w, int status, const char *message)
{
    return c10d__work_complete(w, status, "%s", message != NULL ? message : "");
}

int c10d_work_complete(c10d_work *w, int status, const char *message)
{
    if (w == NULL)
        return c10d__fail(C10D_EINVAL, "c10d_work_complete: work is NULL");
    if (status > 0)
        return c10d__fail(C10D_EINVAL,
                          "c10d_work_complete: status must be 0 or a negative c10d_status (got %d)",
                          status);
    return complete_plain(w, status, message);
}

static void timer_fired(uv_timer_t *t)
{
    c10d_work *w = t->data;
    uint64_t now = c10d__now_ms();
    unsigned long long ran = (unsigned long long)(now > w->created_ms ? now - w->created_ms : 0);
    /* A group's op ("[PG 0 (desc) Rank 1] Work(SeqNum=..)") fails in torch's
     * watchdog words, which log scrapers look for. */
    const char *what = what_of(w), *body = strstr(what, "] Work(");
    if (what[0] == '[' && body != NULL)
        c10d__work_complete(w, C10D_ETIMEDOUT,
                            "%.*s Watchdog caught collective operation timeout: %s ran for %llu "
                            "milliseconds before timing out.",
                            (int)(body - what + 1), what, body + 2, ran);
    else
        c10d__work_complete(w, C10D_ETIMEDOUT, "%s timed out after %lld ms", what,
                            (long long)w->timeout_ms);
}

/* Loop thread: starts the deadline timer; its reference passes to the timer. */
static void arm_task_fn(struct c10d__task *t)
{
    c10d_work *w = (c10d_work *)((char *)t - offsetof(c10d_work, arm_task));
    c10d__lock_acquire(&w->mutex);
    int arm = !w->done;
    if (arm)
        w->timer_state = TIMER_ARMED;
    c10d__lock_release(&w->mutex);
    if (!arm) {
        c10d_work_release(w);
        return;
    }
    /* created_ms may lie a little ahead (c10d__coarse_lag_ns). */
    uint64_t now = c10d__now_ms();
    uint64_t elapsed = now > w->created_ms ? now - w->created_ms : 0;
    uint64_t left = (uint64_t)w->timeout_ms > elapsed ? (uint64_t)w->timeout_ms - elapsed : 0;
    uv_timer_init(c10d__engine_loop(), &w->timer);
    w->timer.data = w;
    uv_timer_start(&w->timer, timer_fired, left, 0);
}

/* Drops a work c10d_work_create will not hand out. Once it was on the pending
 * list a shutdown's sweep may hold a reference and be completing it right
 * now, so it is released, never freed outright: the last reference frees it. */
static void abandon_created(c10d_work *w)
{
    if (pending_remove(w))
        c10d_work_release(w);
    c10d_work_release(w);
}

static int arm(c10d_work *w);

/* A work made with hooks that its creation gives up (the engine stops): a
 * shutdown's sweep may have found it on the pending list meanwhile. Not
 * completed yet: its hooks go, so that the sweep's completion runs none
 * (1). Completed: they run, and the work is its creator's as made (0). */
static int drop_hooks_unless_done(c10d_work *w)
{
    c10d__lock_acquire(&w->mutex);
    int done = w->done;
    if (!done) {
        w->ncallbacks = 0;
        w->last.cb = NULL;
    }
    c10d__lock_release(&w->mutex);
    return !done;
}

int c10d_work_create(const char *what, int64_t timeout_ms, c10d_work **out)
{
    int rc = c10d__work_create(out, what, timeout_ms);
    if (rc == 0)
        (*out)->user_created = 1;
    return rc;
}

int c10d__work_create(c10d_work **out, const char *what, int64_t timeout_ms)
{
    C10D_CHECK(c10d__work_create_unarmed(out, what, timeout_ms));
    int rc = arm(*out);
    if (rc != 0) {
        abandon_created(*out);
        *out = NULL;
    }
    return rc;
}

/* Hands the deadline to the loop (once): 0, or the posting error. */
static int arm(c10d_work *w)
{
    /* Once; one that completed meanwhile is let go by the arm task. */
    if (w->timeout_ms <= 0 || atomic_exchange(&w->armed, 1))
        return 0;
    c10d_work_retain(w);
    int rc = c10d__engine_post(&w->arm_task);
    if (rc != 0)
        c10d_work_release(w); /* the arm task's */
    return rc;
}

void c10d__work_arm(c10d_work *w)
{
    if (atomic_load(&w->park_state) == PARK_NONE)
        arm(w); /* posting closed: the shutdown's sweep ends it instead */
}

/* A work with its name set by `name_it` (0, or nonzero: out of memory). */
static int work_new(c10d_work **out, int64_t timeout_ms, int (*name_it)(c10d_work *, const void *),
                    const void *name, const struct c10d__work_hooks *hooks)
{
    if (out == NULL)
        return c10d__fail(C10D_EINVAL, "c10d_work_create: out is NULL");
    *out = NULL;
    if (timeout_ms < 0)
        return c10d__fail(C10D_EINVAL, "c10d_work_create: timeout_ms must be >= 0 (got %lld)",
                          (long long)timeout_ms);
    uv_once(&work_once, work_init_once);
    C10D_CHECK(c10d__engine_start());
    c10d_work *w = c10d__block_take(C10D__BLOCK_WORK, sizeof *w);
    if (w == NULL)
        return c10d__fail(C10D_ENOMEM, "c10d_work_create: out of memory");
    memset(w, 0, WORK_ZEROED); /* its lock free */
    w->callbacks = w->inline_callbacks;
    w->callbacks_cap = INLINE_CALLBACKS;
    if (name_it(w, name) != 0) {
        if (w->what != w->inline_what)
            free(w->what);
        c10d__block_put(C10D__BLOCK_WORK, w);
        return c10d__fail(C10D_ENOMEM, "c10d_work_create: out of memory");
    }
    if (hooks != NULL) {
        w->callbacks[w->ncallbacks++] = (struct work_callback){hooks->first, hooks->arg, 1};
        w->last = (struct work_callback){hooks->last, hooks->arg, 1};
    }
    atomic_init(&w->refs, 2); /* the caller's and the pending list's */
    atomic_init(&w->source_rank, -1);
    atomic_init(&w->failed_rank, -1);
    w->duration_ms = -1;
    w->timeout_ms = timeout_ms;
    if (w->created_ms == 0) /* else its maker read the clock (name_later) */
        w->created_ms = c10d__now_ms();
    w->arm_task.fn = arm_task_fn;
    w->drain_task.fn = drain_task_fn;
    pending_add(w);
    /* Checked after joining the pending list: a shutdown that closes posting
     * later still finds this work in its last sweep, so none is left behind. */
    if (c10d__engine_stopping()) {
        if (hooks != NULL && !drop_hooks_unless_done(w)) {
            *out = w; /* the sweep failed it already, and its hooks run: as for any op then */
            w->done_at_creation = 1;
            return 0;
        }
        abandon_created(w);
        return c10d__fail(C10D_EABORTED, "c10d_work_create: the engine is shutting down");
    }
    *out = w;
    return 0;
}

static int name_now(c10d_work *w, const void *arg)
{
    const char *what = arg != NULL ? arg : "work";
    size_t len = strlen(what);
    w->what = len < sizeof w->inline_what ? memcpy(w->inline_what, what, len + 1) : strdup(what);
    return w->what == NULL;
}

/* Deferred where the prefix leaves room for the longest rest a maker writes
 * (four 20-digit numbers and an op's name); made here otherwise. */
static int name_later(c10d_work *w, const void *arg)
{
    const struct c10d__work_name *n = arg;
    w->created_ms = n->created_ns / 1000000u;
    if (n->prefix_len + 160 > sizeof w->inline_what || n->args_len > sizeof w->name_args) {
        char buf[INLINE_WHAT]; /* the longest name an op ever had */
        size_t at = n->prefix_len < sizeof buf - 1 ? n->prefix_len : sizeof buf - 1;
        memcpy(buf, n->prefix, at);
        n->make(n->args, buf + at, sizeof buf - at);
        return name_now(w, buf);
    }
    memcpy(w->inline_what, n->prefix, n->prefix_len);
    w->inline_what[n->prefix_len] = '\0';
    w->what = w->inline_what;
    w->name_at = n->prefix_len;
    w->name_make = n->make;
    memcpy(w->name_args, n->args, n->args_len);
    atomic_init(&w->name_state, NAME_DEFERRED);
    return 0;
}

int c10d__work_create_unarmed(c10d_work **out, const char *what, int64_t timeout_ms)
{
    return work_new(out, timeout_ms, name_now, what, NULL);
}

/* The model's name as it stands: made, a copy of it; not yet, a copy of its
 * recipe (the prefix, which its maker never writes, and the arguments, which
 * it only reads), so that neither work's name is made for the other. */
static int name_like(c10d_work *w, const void *arg)
{
    c10d_work *model = (c10d_work *)arg;
    w->created_ms = model->created_ms;
    if (atomic_load_explicit(&model->name_state, memory_order_acquire) == NAME_MADE)
        return name_now(w, model->what);
    memcpy(w->inline_what, model->inline_what, model->name_at);
    w->inline_what[model->name_at] = '\0';
    w->what = w->inline_what;
    w->name_at = model->name_at;
    w->name_make = model->name_make;
    memcpy(w->name_args, model->name_args, sizeof w->name_args);
    atomic_init(&w->name_state, NAME_DEFERRED);
    return 0;
}

int c10d__work_create_like(c10d_work **out, c10d_work *model, int64_t timeout_ms,
                           const struct c10d__work_hooks *hooks)
{
    return work_new(out, timeout_ms, name_like, model, hooks);
}

int c10d__work_create_named(c10d_work **out, const struct c10d__work_name *name, int64_t timeout_ms)
{
    return work_new(out, timeout_ms, name_later, name, name->hooks);
}

/* ------------------------------------------------------------- parking */

int c10d__work_park(c10d_work *w, const struct c10d__work_park *park, void *arg)
{
    w->park = park;
    w->park_arg = arg;
    /* add_callback stores `awaited`, then unparks: one of the two sees the
     * other (both sequentially consistent), so no lock is needed. */
    atomic_store(&w->park_state, PARK_PARKED);
    if (!atomic_load(&w->awaited))
        return 0;
    int expected = PARK_PARKED;
    if (atomic_compare_exchange_strong(&w->park_state, &expected, PARK_NONE))
        return -1;
    return 0; /* unparked meanwhile: its taker has it */
}

/* Claimed or taken: the loop has it from now on, deadline included. */
static void adopted(c10d_work *w)
{
    atomic_store(&w->park_state, PARK_ADOPTED);
    arm(w);
}

int c10d__work_unpark(c10d_work *w)
{
    int expected = PARK_PARKED;
    /* Sequentially consistent load: the lane's producer stores the park
     * state and then loads its group's failure, and a failing group stores
     * that and then comes here. */
    if (atomic_load(&w->park_state) != PARK_PARKED ||
        !atomic_compare_exchange_strong(&w->park_state, &expected, PARK_ADOPTED))
        return 0;
    w->park->adopt(w->park_arg);
    arm(w);
    return 1;
}

/* A waiting thread takes a parked op and runs it here. */
static void run_parked(c10d_work *w, uint64_t deadline_ns)
{
    int expected = PARK_PARKED;
    if (atomic_load_explicit(&w->park_state, memory_order_relaxed) != PARK_PARKED ||
        !atomic_compare_exchange_strong(&w->park_state, &expected, PARK_CLAIMED))
        return;
    /* It stops at the op's own deadline too: the loop's timer then fails
     * it at once, in the watchdog's words. */
    if (w->timeout_ms > 0) {
        uint64_t own = ((uint64_t)w->created_ms + (uint64_t)w->timeout_ms) * 1000000u;
        if (deadline_ns == 0 || own < deadline_ns)
            deadline_ns = own;
    }
    if (w->park->run(w->park_arg, deadline_ns) == 0)
        adopted(w);
    else
        atomic_store(&w->park_state, PARK_ADOPTED); /* done with it */
    /* After the store of park_state above: a completion that saw the op
     * still claimed left the flag for this thread (most ops: none did, and
     * no lock is taken). It is taken back only under the mutex, with the
     * drain scheduled in the same step, so that abort_one never sees the
     * flag gone and the drain not yet scheduled. */
    if (!atomic_load(&w->drain_deferred))
        return;
    c10d__lock_acquire(&w->mutex);
    int run_inline = 0;
    if (!atomic_exchange(&w->drain_deferred, 0)) {
        c10d__lock_release(&w->mutex); /* the completer saw this thread let go, and took it */
        return;
    }
    if (schedule_drain_locked(w, &run_inline) != 0) {
        /* Posting closed (the engine stops) and the work already left the
         * pending list: nobody else will run them, so this thread does, as
         * the engine's last sweep would have (no timer was armed: the loop
         * never took the op). */
        c10d_work_retain(w);
        w->drain_posted = 1;
        run_inline = 1;
    }
    c10d__lock_release(&w->mutex);
    if (run_inline)
        work_drain(w);
}

static int add_callback(c10d_work *w, c10d_work_cb cb, void *arg, int anywhere, c10d_work_cb last)
{
    c10d__lock_acquire(&w->mutex);
    if (last != NULL && w->last.cb != NULL) {
        c10d__lock_release(&w->mutex);
        return c10d__fail(C10D_EINVAL, "c10d__work_on_complete_around: '%s' has a last callback",
                          what_of(w));
    }
    if (w->ncallbacks == w->callbacks_cap) {
        size_t cap = 2 * w->callbacks_cap;
        int was_inline = w->callbacks == w->inline_callbacks;
        struct work_callback *grown =
            realloc(was_inline ? NULL : w->callbacks, cap * sizeof *grown);
        if (grown == NULL) {
            c10d__lock_release(&w->mutex);
            return c10d__fail(C10D_ENOMEM, "c10d_work_on_complete: out of memory");
        }
        if (was_inline)
            memcpy(grown, w->inline_callbacks, sizeof w->inline_callbacks);
        w->callbacks = grown;
        w->callbacks_cap = cap;
    }
    w->callbacks[w->ncallbacks++] = (struct work_callback){cb, arg, anywhere};
    if (!anywhere)
        atomic_store(&w->awaited, 1); /* before the unpark below (c10d__work_park) */
    if (last != NULL)
        w->last = (struct work_callback){last, arg, 1};
    int rc = 0, run_inline = 0;
    if (w->done && atomic_load(&w->drain_deferred)) {
        atomic_store(&w->settled, 0); /* run_parked's drain runs it too */
    } else if (w->done) {
        rc = schedule_drain_locked(w, &run_inline);
        if (rc != 0) {
            w->ncallbacks--; /* a failed call never calls back; settled stays as it was */
            if (last != NULL)
                w->last.cb = NULL;
        } else /* waiters from now on wait for this callback too; the drain
                * needs the mutex we hold, so it cannot settle before this */
            atomic_store(&w->settled, 0);
    }
    c10d__lock_release(&w->mutex);
    if (run_inline)
        work_drain(w);
    if (!anywhere) /* it is awaited on the loop: the loop runs it */
        c10d__work_unpark(w);
    return rc;
}

int c10d_work_on_complete(c10d_work *w, c10d_work_cb cb, void *arg)
{
    if (w == NULL || cb == NULL)
        return c10d__fail(C10D_EINVAL, "c10d_work_on_complete: %s is NULL",
                          w == NULL ? "work" : "callback");
    return add_callback(w, cb, arg, 0, NULL);
}

int c10d__work_on_complete(c10d_work *w, c10d_work_cb cb, void *arg)
{
    return add_callback(w, cb, arg, 0, NULL);
}

int c10d__work_on_complete_anywhere(c10d_work *w, c10d_work_cb cb, void *arg)
{
    return add_callback(w, cb, arg, 1, NULL);
}

int c10d__work_on_complete_around(c10d_work *w, c10d_work_cb first, c10d_work_cb last, void *arg,
                                  int anywhere)
{
    return add_callback(w, first, arg, anywhere, last);
}

/* blocking: torch's blocking wait (the public call with a deadline under
 * C10D_BLOCKING_WAIT=1): a wait that times out fails the work. */
/* C10D_WAIT_SPIN_US, read again only after the environment was (a lookup
 * per wait took the environment's mutex and parsed the text, on every op). */
static int64_t wait_spin_us(void)
{
    static _Atomic unsigned seen;
    static _Atomic int64_t value;
    unsigned gen = c10d__env_generation();
    if (atomic_load_explicit(&seen, memory_order_acquire) != gen) {
        atomic_store_explicit(&value, c10d__env_int(C10D_ENV_WAIT_SPIN_US), memory_order_relaxed);
        atomic_store_explicit(&seen, gen, memory_order_release);
    }
    return atomic_load_explicit(&value, memory_order_relaxed);
}

static int refuse_on_loop(c10d_work *w)
{
    return c10d__fail(C10D_EDEADLK,
                      "c10d_work_wait on the engine loop thread (inside a callback) would "
                      "deadlock: '%s' can only complete on this thread; use "
                      "c10d_work_on_complete instead",
                      what_of(w));
}

/* Runs w's parked op here, then watches and sleeps until w settles or
 * `deadline` (0: none). Whether it settled. The clock is read only after the
 * parked op: an op that ran here needs none. */
static int wait_settled(c10d_work *w, uint64_t deadline)
{
    run_parked(w, deadline);
    if (atomic_load_explicit(&w->settled, memory_order_acquire))
        return 1;
    int64_t spin_us = wait_spin_us();
    if (spin_us > 0) {
        /* Watch the work for a while before sleeping: an op that completes
         * within microseconds then costs no futex wake-up. The CPU is yielded
         * between looks, so the loop thread may run on this one. */
        uint64_t spin_end = c10d__now_ns() + (uint64_t)spin_us * 1000u;
        if (deadline != 0 && deadline < spin_end)
            spin_end = deadline;
        while (!atomic_load_explicit(&w->settled, memory_order_acquire) &&
               c10d__now_ns() < spin_end)
            sched_yield();
    }
    /* What the loop saw decides: settled may fall back to 0 afterwards (a
     * callback added to the completed work by another thread), and this
     * wait was for the callbacks registered when it began. */
    int settled;
    while (!(settled = atomic_load(&w->settled))) {
        uint64_t now = c10d__now_ns();
        if (deadline != 0 && now >= deadline)
            break;
        atomic_fetch_add(&w->sleepers, 1);
        if (!atomic_load(&w->settled))
            c10d__futex_wait(&w->settled, 0, deadline != 0 ? deadline - now : 0);
        atomic_fetch_sub(&w->sleepers, 1);
    }
    return settled;
}

/* A settled work's status, its message made the thread's error: both were
 * written once, under the mutex, before the store of `settled` this thread
 * saw; no lock needed. */
static int settled_status(c10d_work *w)
{
    int status = w->status;
    if (status < 0)
        c10d__fail(status, "%s", w->message != NULL ? w->message : c10d_strerror(status));
    return status;
}

static int work_wait(c10d_work *w, int64_t timeout_ms, int blocking)
{
    if (w == NULL)
        return c10d__fail(C10D_EINVAL, "c10d_work_wait: work is NULL");
    if (c10d__on_loop_thread())
        return refuse_on_loop(w);
    if (timeout_ms > MAX_WAIT_MS) /* beyond a century: no deadline (and no overflow) */
        timeout_ms = -1;
    uint64_t deadline = timeout_ms >= 0 ? c10d__now_ns() + (uint64_t)timeout_ms * 1000000u : 0;
    if (wait_settled(w, deadline))
        return settled_status(w);
    c10d__lock_acquire(&w->mutex);
    int done = w->done;
    c10d__lock_release(&w->mutex);
    if (!done && blocking) {
        /* The waiter's deadline is the op's: the work fails now, and the wait
         * returns once its callbacks ran, as for any completion, so that
         * its owner (a group's op fails its group and stops writing into the
         * buffers) is through before the caller reuses them. It may have
         * completed by itself in between: then that is the answer. */
        c10d__work_complete(w, C10D_ETIMEDOUT,
                            "'%s' timed out in blocking wait after %lld ms (C10D_BLOCKING_WAIT=1)",
                            what_of(w), (long long)timeout_ms);
        return work_wait(w, -1, 0);
    }
    return c10d__fail(C10D_ETIMEDOUT,
                      done ? "c10d_work_wait: '%s' completed, but its callbacks were still "
                             "running after waiting %lld ms"
                           : "c10d_work_wait: '%s' still pending after waiting %lld ms (the "
                             "work goes on)",
                      what_of(w), (long long)timeout_ms);
}

int c10d_work_wait(c10d_work *w, int64_t timeout_ms)
{
    return work_wait(w, timeout_ms, timeout_ms > 0 && c10d__env_bool(C10D_ENV_BLOCKING_WAIT));
}

int c10d__work_wait(c10d_work *w, int64_t timeout_ms)
{
    return work_wait(w, timeout_ms, 0);
}

int c10d__work_wait_until(c10d_work *w, uint64_t deadline_ns)
{
    if (c10d__on_loop_thread())
        return refuse_on_loop(w);
    if (!wait_settled(w, deadline_ns))
        return c10d__fail(C10D_ETIMEDOUT, "c10d_work_wait: '%s' still pending (the work goes on)",
                          what_of(w));
    return settled_status(w);
}

void c10d__work_set_stream_wait(c10d_work *w, int (*fn)(c10d_work *w, void *stream, void *arg),
                                void *arg)
{
    c10d__lock_acquire(&w->mutex);
    w->stream_wait = fn;
    w->stream_wait_arg = arg;
    c10d__lock_release(&w->mutex);
}

int c10d_work_wait_stream(c10d_work *w, void *stream)
{
    if (w == NULL)
        return c10d__fail(C10D_EINVAL, "c10d_work_wait_stream: work is NULL");
    c10d__lock_acquire(&w->mutex);
    int (*fn)(c10d_work *, void *, void *) = w->stream_wait;
    void *arg = w->stream_wait_arg;
    c10d__lock_release(&w->mutex);
    if (fn != NULL)
        return fn(w, stream, arg);
    return c10d_work_wait(w, -1);
}

void c10d__work_set_cancel(c10d_work *w, int (*fn)(c10d_work *w, void *arg), void *arg)
{
    c10d__lock_acquire(&w->mutex);
    w->cancel = fn;
    w->cancel_arg = arg;
    c10d__lock_release(&w->mutex);
}

int c10d_work_cancel(c10d_work *w)
{
    if (w == NULL)
        return c10d__fail(C10D_EINVAL, "c10d_work_cancel: work is NULL");
    c10d__work_unpark(w); /* polled: the loop runs it from now on */
    c10d__lock_acquire(&w->mutex);
    int done = w->done, user = w->user_created;
    int (*fn)(c10d_work *, void *) = w->cancel;
    void *arg = w->cancel_arg;
    c10d__lock_release(&w->mutex);
    if (done)
        return 0;
    if (fn != NULL)
        return fn(w, arg);
    if (user) {
        c10d__work_complete(w, C10D_ECANCELED, "%s was cancelled (c10d_work_cancel)", what_of(w));
        return 0;
    }
    /* A collective half run on some ranks cannot be taken back on one. */
    return c10d__fail(C10D_EUNSUPPORTED,
                      "c10d_work_cancel: '%s' cannot be cancelled (abort its group instead)",
                      what_of(w));
}

int c10d_work_test(c10d_work *w)
{
    if (w == NULL)
        return c10d__fail(C10D_EINVAL, "c10d_work_test: work is NULL");
    c10d__work_unpark(w); /* polled: the loop runs it from now on */
    c10d__lock_acquire(&w->mutex);
    int done = w->done;
    c10d__lock_release(&w->mutex);
    return done;
}

int c10d_work_status(c10d_work *w)
{
    if (w == NULL)
        return C10D_EINVAL;
    c10d__work_unpark(w); /* polled: the loop runs it from now on */
    c10d__lock_acquire(&w->mutex);
    int status = w->done ? w->status : C10D_PENDING;
    c10d__lock_release(&w->mutex);
    return status;
}

const char *c10d_work_message(c10d_work *w)
{
    if (w == NULL)
        return "";
    c10d__lock_acquire(&w->mutex);
    /* Written once, before done is set, never changed afterwards. */
    const char *m = w->done && w->message != NULL ? w->message : "";
    c10d__lock_release(&w->mutex);
    return m;
}

int c10d_work_source_rank(c10d_work *w)
{
    return w != NULL ? atomic_load(&w->source_rank) : -1;
}

int c10d_work_duration_ms(c10d_work *w, float *ms)
{
    if (w == NULL || ms == NULL)
        return c10d__fail(C10D_EINVAL, "c10d_work_duration_ms: work or ms is NULL");
    if (!c10d_work_test(w))
        return C10D_PENDING;
    if (w->duration_ms < 0)
        return c10d__fail(C10D_EUNSUPPORTED,
                          "c10d_work_duration_ms: no device time for %s (only nccl ops that "
                          "completed with C10D_NCCL_ENABLE_TIMING=1 have one)",
                          what_of(w));
    *ms = w->duration_ms;
    return 0;
}

void c10d__work_set_duration(c10d_work *w, float ms)
{
    w->duration_ms = ms;
}

void c10d__work_set_source_rank(c10d_work *w, int rank)
{
    atomic_store(&w->source_rank, rank);
}

int c10d_work_failed_rank(c10d_work *w)
{
    return w != NULL ? atomic_load(&w->failed_rank) : -1;
}

void c10d__work_set_failed_rank(c10d_work *w, int rank)
{
    atomic_store(&w->failed_rank, rank);
}

void c10d__work_set_fr_id(c10d_work *w, uint64_t rid)
{
    /* Release, not sequentially consistent: nothing is ordered after it, and
     * on x86 a sequentially consistent store is a locked exchange that waits
     * for every earlier store (the new op's record) to reach the cache. */
    atomic_store_explicit(&w->fr_id, rid, memory_order_release);
    /* Its completion came before it had a record to close: closed here
     * (its status was written before drop_hooks_unless_done took the lock). */
    if (w->done_at_creation)
        c10d__fr_completed(rid, w->status);
}

/* The sweep's step for one pending work: complete it, or, if another thread
 * completed it while posting was closed, run the callbacks that completion
 * could not schedule (here, on the loop thread) and take it off the list. */
static void abort_one(c10d_work *w, int status, const char *message)
{
    if (complete_plain(w, status, message))
        return;
    c10d__lock_acquire(&w->mutex);
    /* Not while a waiter still runs its op: run_parked drains it after. */
    int orphan =
        w->done && !w->drain_posted && !atomic_load(&w->drain_deferred) && has_due_locked(w);
    if (orphan) {
        c10d_work_retain(w); /* the drain's */
        w->drain_posted = 1;
    }
    c10d__lock_release(&w->mutex);
    if (orphan)
        work_drain(w);
    if (pending_remove(w))
        c10d_work_release(w);
}

void c10d__work_abort_all(int status, const char *message)
{
    uv_once(&work_once, work_init_once);
    for (;;) {
        /* Take a reference to each under the list lock, complete them outside it. */
        c10d__lock_acquire(&pending_mutex);
        size_t n = pending_count;
        c10d_work **batch = n ? malloc(n * sizeof *batch) : NULL;
        size_t k = 0;
        for (c10d_work *w = pending_head; w != NULL && batch != NULL; w = w->pending_next) {
            c10d_work_retain(w);
            batch[k++] = w;
        }
        c10d__lock_release(&pending_mutex);
        if (k == 0) {
            free(batch);
            return;
        }
        for (size_t i = 0; i < k; i++) {
            abort_one(batch[i], status, message);
            c10d_work_release(batch[i]);
        }
        free(batch);
    }
}
