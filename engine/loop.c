/* The engine thread: one uv loop, a task queue fed by any thread, shutdown and fork.
 *
 * Locking: engine_mutex guards the `engine` pointer, the task queue and the
 * stopping flag. Posting holds it while appending and calling uv_async_send, so
 * once `stopping` is set nobody can touch the async handle and it can be closed.
 * shutdown_mutex serialises whole shutdowns (start -> join -> free). */
#include "loop.h"

#include "env.h"
#include "error.h"
#include "fdlimit.h"
#include "log.h"

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>

struct engine {
    uv_loop_t loop;
    uv_async_t wake;
    uv_thread_t thread;
    struct c10d__task *head; /* FIFO of posted tasks (engine_mutex) */
    struct c10d__task *tail;
    /* Tasks only the engine's own thread runs, never a driving waiter (engine_mutex). */
    struct c10d__task *own_head, *own_tail;
    int stopping;                      /* posts are refused (engine_mutex) */
    int stop_requested;                /* loop thread only */
    struct c10d__shutdown_hook *hooks; /* loop thread only */
    struct c10d__task stop_task;
    int64_t batch;            /* tasks run per wake-up (C10D_ENGINE_BATCH) */
    struct c10d__task *ready; /* taken from the queue, not yet run (loop thread only) */
    /* Busy polling: while `spin` is active, uv_run polls with a zero timeout
     * instead of sleeping in epoll, and spin_cb takes posted tasks itself, so a
     * post needs no uv_async_send (no eventfd write, read and epoll wake-up). It
     * stops `spin_ns` after the last activity (c10d__engine_busy). */
    uv_idle_t spin;
    uv_timer_t safety;              /* runs tasks whose wake-up was lost (safety_cb) */
    struct c10d__task *safety_seen; /* first queued task at the last tick */
    int spinning;                   /* spin is active: posts skip the wake-up (engine_mutex) */
    uint64_t spin_ns;               /* loop thread only */
    uint64_t spin_until;            /* loop thread only */
};

static struct engine *engine;
/* Every registered sweep (engine_mutex); they outlive engines. */
static struct c10d__shutdown_sweep *sweeps;
/* Mirrors `spinning` for waiters, who read it without the lock. */
static atomic_int loop_polling;
static uv_mutex_t engine_mutex;
static uv_mutex_t shutdown_mutex;
static uv_once_t engine_once = UV_ONCE_INIT;
/* Set while this thread drives the loop: the loop thread inside its turns, or
 * a waiter inside c10d__engine_drive. Callbacks see it as "on the loop thread". */
static _Thread_local int on_loop_thread;
/* The engine this thread drives (set while it drives). */
static _Thread_local struct engine *loop_engine;
/* Set once on the engine's own thread (not on a driving waiter). */
static _Thread_local int is_engine_thread;
/* Whoever holds drive_mutex may run the loop (uv_run is not reentrant and not
 * thread-safe, but any one thread at a time may run it). The loop thread takes
 * it for each turn; a waiter may take it between turns while the loop polls.
 * drive_engine is the engine that may be driven (drive_mutex): NULL before it
 * starts and once its loop thread has left. */
static uv_mutex_t drive_mutex;
static struct engine *drive_engine;
/* A waiter drives this long before it yields the CPU between turns: long
 * enough for an exchange with a peer that answers at once, short enough that
 * ranks oversubscribing the CPUs are not starved by one that polls. */
#define DRIVE_NO_YIELD_NS 10000

static void fork_prepare(void)
{
    uv_mutex_lock(&shutdown_mutex);
    uv_mutex_lock(&engine_mutex);
}

static void fork_parent(void)
{
    uv_mutex_unlock(&engine_mutex);
    uv_mutex_unlock(&shutdown_mutex);
}

/* The child has no loop thread: the parent's engine (and every handle on it) is
 * abandoned, its memory leaked on purpose, since freeing uv state owned by a
 * thread that does not exist here is unsafe. The next use starts a new engine. */
static void fork_child(void)
{
    engine = NULL;
    on_loop_thread = 0;
    loop_engine = NULL;
    atomic_store(&loop_polling, 0);
    drive_engine = NULL;
    uv_mutex_init(&engine_mutex);
    uv_mutex_init(&shutdown_mutex);
    uv_mutex_init(&drive_mutex);
}

static void engine_init_once(void)
{
    uv_mutex_init(&engine_mutex);
    uv_mutex_init(&shutdown_mutex);
    uv_mutex_init(&drive_mutex);
    pthread_atfork(fork_prepare, fork_parent, fork_child);
}

static struct c10d__task *take_all_tasks(struct engine *e)
{
    uv_mutex_lock(&engine_mutex);
    struct c10d__task *list = e->head;
    e->head = e->tail = NULL;
    uv_mutex_unlock(&engine_mutex);
    return list;
}

static struct c10d__task *take_own_tasks(struct engine *e)
{
    uv_mutex_lock(&engine_mutex);
    struct c10d__task *list = e->own_head;
    e->own_head = e->own_tail = NULL;
    uv_mutex_unlock(&engine_mutex);
    return list;
}

static void run_tasks(struct c10d__task *t)
{
    while (t != NULL) {
        struct c10d__task *next = t->next;
        t->next = NULL;
        t->fn(t);
        t = next;
    }
}

/* arg (may be NULL) counts the handles it closed. */
static void close_any_handle(uv_handle_t *h, void *arg)
{
    if (!uv_is_closing(h)) {
        C10D_DEBUG("engine", "closing a leftover %s handle at shutdown",
                   uv_handle_type_name(h->type));
        uv_close(h, NULL);
        if (arg != NULL)
            ++*(int *)arg;
    }
}

void c10d__engine_add_sweep(struct c10d__shutdown_sweep *sweep)
{
    uv_once(&engine_once, engine_init_once);
    uv_mutex_lock(&engine_mutex);
    sweep->next = sweeps;
    sweeps = sweep;
    uv_mutex_unlock(&engine_mutex);
}

/* Loop thread. The list only grows, and from its head, so a snapshot of the
 * head is safe to walk without the lock (sweeps may post tasks). */
static void run_sweeps(void)
{
    uv_mutex_lock(&engine_mutex);
    struct c10d__shutdown_sweep *s = sweeps;
    uv_mutex_unlock(&engine_mutex);
    for (; s != NULL; s = s->next)
        s->fn();
}

/* Loop thread. Order matters: modules fail their operations first (their
 * callbacks may post tasks, which still run), then posting is closed, then
 * works created in the meantime are failed too, then every handle is closed
 * and uv_run returns once their close callbacks have run. */
static void engine_stop_on_loop(struct engine *e)
{
    while (e->hooks != NULL) {
        struct c10d__shutdown_hook *h = e->hooks;
        e->hooks = h->next;
        h->next = NULL;
        h->fn(h);
    }
    run_tasks(e->ready);
    e->ready = NULL;
    run_tasks(take_own_tasks(e));
    run_sweeps();
    for (struct c10d__task *t; (t = take_all_tasks(e)) != NULL;)
        run_tasks(t);
    uv_mutex_lock(&engine_mutex);
    e->stopping = 1;
    uv_mutex_unlock(&engine_mutex);
    run_sweeps();
    run_tasks(take_all_tasks(e));
    run_tasks(take_own_tasks(e));
    uv_walk(&e->loop, close_any_handle, NULL);
}

/* Loop thread, after the shutdown walk: a handle opened since (by a close
 * callback, or a task queued before the stop that started an operation) would
 * keep uv_run alive and c10d_shutdown waiting for ever. Each is a bug in its
 * module; shutdown still returns, and says so. */
static void close_late_handles(struct engine *e)
{
    static atomic_int said;
    int closed = 0;
    uv_walk(&e->loop, close_any_handle, &closed);
    if (closed > 0 && atomic_exchange(&said, 1) == 0)
        C10D_WARN("engine", "%d handle(s) opened after shutdown began; closed them", closed);
}

static void run_posted(struct engine *e);
static void start_spinning(struct engine *e);

/* Runs once per loop iteration while spinning (the loop thread yields between
 * such turns, outside the drive lock). It stops only with the queue empty,
 * under the lock posters check `spinning` with, so no post is left without a
 * wake-up. */
static void spin_cb(uv_idle_t *spin)
{
    struct engine *e = spin->data;
    run_posted(e);
    if (uv_hrtime() < e->spin_until)
        return;
    uv_mutex_lock(&engine_mutex);
    int idle = e->head == NULL && e->ready == NULL && e->own_head == NULL;
    if (idle)
        e->spinning = 0;
    uv_mutex_unlock(&engine_mutex);
    if (idle) {
        atomic_store_explicit(&loop_polling, 0, memory_order_relaxed);
        uv_idle_stop(spin);
    }
}

int c10d__engine_polling(void)
{
    return atomic_load_explicit(&loop_polling, memory_order_relaxed);
}

/* Loop thread, engine_mutex held: start polling unless it runs or shutdown
 * closed the handle. Returns whether the loop polls now. */
static int start_spinning_locked(struct engine *e)
{
    if (uv_is_closing((uv_handle_t *)&e->spin))
        return 0;
    if (!uv_is_active((uv_handle_t *)&e->spin)) {
        e->spinning = 1;
        atomic_store_explicit(&loop_polling, 1, memory_order_relaxed);
        uv_idle_start(&e->spin, spin_cb);
    }
    return 1;
}

/* Loop thread. */
static void start_spinning(struct engine *e)
{
    if (uv_is_active((uv_handle_t *)&e->spin))
        return;
    uv_mutex_lock(&engine_mutex);
    start_spinning_locked(e);
    uv_mutex_unlock(&engine_mutex);
}

void c10d__engine_busy(void)
{
    struct engine *e = loop_engine;
    if (e == NULL || e->spin_ns == 0)
        return;
    e->spin_until = uv_hrtime() + e->spin_ns;
    start_spinning(e);
}

static void wake_cb(uv_async_t *async)
{
    struct engine *e = async->data;
    c10d__engine_busy();
    run_posted(e);
}

static void run_posted(struct engine *e)
{
    if (is_engine_thread && e->own_head != NULL)
        run_tasks(take_own_tasks(e));
    /* At most `batch` tasks per wake-up so socket and timer callbacks are never
     * starved by a flood of posts; the rest stay in `ready` (FIFO before anything
     * posted later) and spin_cb takes them after the next poll. */
    if (e->ready == NULL)
        e->ready = take_all_tasks(e);
    for (int64_t n = 0; e->ready != NULL && n < e->batch; n++) {
        struct c10d__task *t = e->ready;
        e->ready = t->next;
        t->next = NULL;
        t->fn(t);
    }
    /* Posts coalesced into this wake-up may sit behind the batch: pick them up
     * now, or no later wake-up would come for them. */
    if (e->ready == NULL)
        e->ready = take_all_tasks(e);
    if (e->ready != NULL)
        start_spinning(e); /* spin_cb runs them on the next iteration */
    if (e->stop_requested && !e->stopping)
        engine_stop_on_loop(e);
}

#define SAFETY_TICK_MS 50

static void safety_cb(uv_timer_t *t)
{
    struct engine *e = t->data;
    static atomic_int said;
    /* A safety net for a race not found yet (docs/engine.md, "The safety
     * tick"): a task still first in line one tick later lost its wake-up. One
     * merely posted since the last tick may have its eventfd wake-up on the
     * way (timers run before the poll phase): that is not a loss. */
    uv_mutex_lock(&engine_mutex);
    struct c10d__task *first = e->ready != NULL  ? e->ready
                               : e->head != NULL ? e->head
                                                 : e->own_head;
    int lost = first != NULL && first == e->safety_seen;
    e->safety_seen = first;
    /* A task that waited a whole tick was lost whatever `spinning` says: a
     * polling loop takes it within microseconds. Seen in a trace: the loop
     * asleep in epoll with the stop task queued. If `spinning` claims a poll
     * that is not running, posts skip the wake-up: make it true again. */
    if (lost && e->spinning && !uv_is_active((uv_handle_t *)&e->spin))
        e->spinning = 0;
    uv_mutex_unlock(&engine_mutex);
    if (!lost)
        return;
    if (atomic_exchange(&said, 1) == 0)
        C10D_WARN("engine",
                  "a posted task waited for the %d ms safety tick: its wake-up was lost "
                  "(reported once per process)",
                  SAFETY_TICK_MS);
    run_posted(e);
}

static void stop_task_fn(struct c10d__task *t)
{
    struct engine *e = (struct engine *)((char *)t - offsetof(struct engine, stop_task));
    e->stop_requested = 1;
}

/* Every socket write of the loop (libuv's, the store server's, the tcp
 * transport's) happens on whichever thread drives it. A write to a peer that
 * reset its connection raises SIGPIPE on that thread, and the default action
 * ends the process: a stranger's RST must be an EPIPE for us instead. Every
 * thread that drives the loop blocks SIGPIPE, once, and keeps it blocked: the
 * engine's own thread from its start, a user thread the first time it drives
 * from c10d_work_wait. Blocking and restoring it around each drive would be
 * cleaner for the program's mask but costs three system calls per wait (3 us
 * in a VM, against an 8 us all_reduce); a program that needs SIGPIPE on that
 * thread can unblock it, and one that ignores SIGPIPE sees no difference. */
static _Thread_local int pipe_blocked;

static void block_sigpipe(void)
{
    if (pipe_blocked)
        return;
    sigset_t pipe_set;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, NULL);
    pipe_blocked = 1;
}

/* One turn of the loop by the thread holding drive_mutex. Returns whether the
 * loop has anything left (0 once shutdown closed every handle). */
static int drive_turn(struct engine *e, uv_run_mode mode)
{
    on_loop_thread = 1;
    loop_engine = e;
    int alive = uv_run(&e->loop, mode);
    on_loop_thread = 0;
    loop_engine = NULL;
    return alive;
}

/* While the loop polls, each turn is a zero-timeout poll with the drive lock
 * dropped and the CPU yielded in between: a waiter on this CPU may then drive
 * the loop itself (c10d__engine_drive) and the threads this loop waits for
 * (the caller's, other ranks' loops) run on a small machine. Otherwise a turn
 * sleeps in epoll, holding the lock, until a post or an event. */
static void loop_thread_main(void *arg)
{
    struct engine *e = arg;
    is_engine_thread = 1;
    block_sigpipe();
    /* Published here, not by the starter: it holds engine_mutex, which
     * drivers take after drive_mutex. */
    uv_mutex_lock(&drive_mutex);
    drive_engine = e;
    for (;;) {
        int alive = drive_turn(e, e->spinning ? UV_RUN_NOWAIT : UV_RUN_ONCE);
        int polling = e->spinning;
        if (!alive && e->stopping) {
            drive_engine = NULL;
            uv_mutex_unlock(&drive_mutex);
            break;
        }
        if (alive && e->stopping)
            close_late_handles(e);
        uv_mutex_unlock(&drive_mutex);
        if (!polling) {
            uv_mutex_lock(&drive_mutex);
            continue;
        }
        /* A waiter may drive meanwhile; its turns count as ours. */
        do
            sched_yield();
        while (uv_mutex_trylock(&drive_mutex) != 0);
    }
    /* Shutdown closed the spin handle wherever it was: no loop polls now. */
    atomic_store(&loop_polling, 0);
    int rc = uv_loop_close(&e->loop);
    if (rc != 0)
        C10D_ERROR("engine", "uv_loop_close at shutdown: %s", uv_strerror(rc));
}

int c10d__engine_drive(const atomic_int *flag, uint64_t until_ns)
{
    if (on_loop_thread || uv_mutex_trylock(&drive_mutex) != 0)
        return 0;
    struct engine *e = drive_engine;
    if (e == NULL || e->stop_requested || !e->spinning) {
        uv_mutex_unlock(&drive_mutex);
        return 0;
    }
    block_sigpipe();
    uint64_t polite_from = uv_hrtime() + DRIVE_NO_YIELD_NS;
    for (;;) {
        drive_turn(e, UV_RUN_NOWAIT);
        if (atomic_load_explicit(flag, memory_order_acquire) || !e->spinning)
            break;
        uint64_t now = uv_hrtime();
        if (now >= until_ns)
            break;
        if (now >= polite_from)
            sched_yield();
    }
    uv_mutex_unlock(&drive_mutex);
    return 1;
}

static int engine_start_locked(void)
{
    if (engine != NULL)
        return 0;
    /* Once per process: a job opens a connection per peer and per store
     * client, and a soft limit of 1024 is reached at a few hundred ranks. */
    static int nofile_raised;
    if (!nofile_raised) {
        nofile_raised = 1;
        c10d__raise_nofile_limit(NULL);
    }
    struct engine *e = calloc(1, sizeof *e);
    if (e == NULL)
        return c10d__fail(C10D_ENOMEM, "engine: out of memory");
    int rc = uv_loop_init(&e->loop);
    if (rc != 0) {
        free(e);
        return c10d__fail(c10d__status_from_uv(rc), "engine: uv_loop_init: %s", uv_strerror(rc));
    }
    uv_async_init(&e->loop, &e->wake, wake_cb);
    e->wake.data = e;
    uv_idle_init(&e->loop, &e->spin);
    e->spin.data = e;
    uv_timer_init(&e->loop, &e->safety);
    e->safety.data = e;
    uv_timer_start(&e->safety, safety_cb, SAFETY_TICK_MS, SAFETY_TICK_MS);
    uv_unref((uv_handle_t *)&e->safety);
    int64_t spin_us = c10d__env_int(C10D_ENV_LOOP_SPIN_US);
    e->spin_ns = spin_us > 0 ? (uint64_t)spin_us * 1000u : 0;
    e->stop_task.fn = stop_task_fn;
    e->batch = c10d__env_int(C10D_ENV_ENGINE_BATCH);
    if (e->batch < 1)
        e->batch = 1;
    rc = uv_thread_create(&e->thread, loop_thread_main, e);
    if (rc != 0) {
        uv_close((uv_handle_t *)&e->wake, NULL);
        uv_close((uv_handle_t *)&e->spin, NULL);
        uv_close((uv_handle_t *)&e->safety, NULL);
        uv_run(&e->loop, UV_RUN_DEFAULT);
        uv_loop_close(&e->loop);
        free(e);
        return c10d__fail(c10d__status_from_uv(rc), "engine: cannot start the loop thread: %s",
                          uv_strerror(rc));
    }
    engine = e;
    C10D_DEBUG("engine", "engine started");
    return 0;
}

int c10d__engine_start(void)
{
    uv_once(&engine_once, engine_init_once);
    uv_mutex_lock(&engine_mutex);
    int rc = engine_start_locked();
    uv_mutex_unlock(&engine_mutex);
    return rc;
}

static int engine_post_locked(struct c10d__task *task, int own)
{
    int rc = engine_start_locked();
    if (rc != 0)
        return rc;
    if (engine->stopping)
        return c10d__fail(C10D_EABORTED, "engine: shutting down; no new work is accepted");
    task->next = NULL;
    struct c10d__task **head = own ? &engine->own_head : &engine->head;
    struct c10d__task **tail = own ? &engine->own_tail : &engine->tail;
    if (*tail != NULL)
        (*tail)->next = task;
    else
        *head = task;
    *tail = task;
    if (engine->spinning)
        return 0; /* spin_cb takes it on the next iteration */
    /* A post from a callback: run it on the next iteration without writing to
     * our own eventfd. */
    if (on_loop_thread && loop_engine == engine && start_spinning_locked(engine))
        return 0;
    uv_async_send(&engine->wake);
    return 0;
}

int c10d__engine_post(struct c10d__task *task)
{
    uv_once(&engine_once, engine_init_once);
    uv_mutex_lock(&engine_mutex);
    int rc = engine_post_locked(task, 0);
    uv_mutex_unlock(&engine_mutex);
    return rc;
}

int c10d__engine_post_own(struct c10d__task *task)
{
    uv_once(&engine_once, engine_init_once);
    uv_mutex_lock(&engine_mutex);
    int rc = engine_post_locked(task, 1);
    uv_mutex_unlock(&engine_mutex);
    return rc;
}

int c10d__engine_own_thread(void)
{
    return is_engine_thread;
}

struct call_task {
    struct c10d__task task;
    void (*fn)(void *arg);
    void *arg;
};

static void call_task_fn(struct c10d__task *t)
{
    struct call_task *c = (struct call_task *)t;
    void (*fn)(void *) = c->fn;
    void *arg = c->arg;
    free(c);
    fn(arg);
}

int c10d__engine_call(void (*fn)(void *arg), void *arg)
{
    struct call_task *c = malloc(sizeof *c);
    if (c == NULL)
        return c10d__fail(C10D_ENOMEM, "engine: out of memory");
    c->task.fn = call_task_fn;
    c->fn = fn;
    c->arg = arg;
    int rc = c10d__engine_post(&c->task);
    if (rc != 0)
        free(c);
    return rc;
}

int c10d__engine_stopping(void)
{
    uv_once(&engine_once, engine_init_once);
    uv_mutex_lock(&engine_mutex);
    int stopping = engine != NULL && engine->stopping;
    uv_mutex_unlock(&engine_mutex);
    return stopping;
}

int c10d__engine_stop_begun(void)
{
    return loop_engine != NULL && loop_engine->stop_requested;
}

uv_loop_t *c10d__engine_loop(void)
{
    return loop_engine != NULL ? &loop_engine->loop : NULL;
}

int c10d__on_loop_thread(void)
{
    return on_loop_thread;
}

int c10d_on_loop_thread(void)
{
    return on_loop_thread;
}

void c10d__engine_on_shutdown(struct c10d__shutdown_hook *hook)
{
    if (loop_engine == NULL)
        return;
    hook->next = loop_engine->hooks;
    loop_engine->hooks = hook;
}

void c10d__engine_remove_shutdown_hook(struct c10d__shutdown_hook *hook)
{
    if (loop_engine == NULL)
        return;
    for (struct c10d__shutdown_hook **p = &loop_engine->hooks; *p != NULL; p = &(*p)->next) {
        if (*p == hook) {
            *p = hook->next;
            hook->next = NULL;
            return;
        }
    }
}

int c10d_shutdown(void)
{
    if (on_loop_thread)
        return c10d__fail(C10D_EDEADLK,
                          "c10d_shutdown called on the engine loop thread (from a callback); "
                          "it would wait for itself");
    uv_once(&engine_once, engine_init_once);
    uv_mutex_lock(&shutdown_mutex);
    uv_mutex_lock(&engine_mutex);
    struct engine *e = engine;
    int rc = 0;
    if (e != NULL)
        rc = engine_post_locked(&e->stop_task, 0);
    uv_mutex_unlock(&engine_mutex);
    if (e != NULL && rc == 0) {
        uv_thread_join(&e->thread);
        uv_mutex_lock(&engine_mutex);
        engine = NULL;
        uv_mutex_unlock(&engine_mutex);
        free(e);
        C10D_DEBUG("engine", "engine shut down");
    }
    uv_mutex_unlock(&shutdown_mutex);
    return rc;
}

uint64_t c10d__now_ns(void)
{
    return uv_hrtime();
}

uint64_t c10d__now_ms(void)
{
    return uv_hrtime() / 1000000u;
}
