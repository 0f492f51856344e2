/* The engine thread: one uv loop, one task queue fed by any thread, shutdown and fork.
 *
 * The hand-off, and why no post is lost. Only the engine thread runs uv_run,
 * and the only place it can block is epoll, in the poll phase of a turn it
 * entered with UV_RUN_ONCE. In the prepare phase just before it, prepare_cb
 * sets `sleeping` under engine_mutex only if the queue is empty (else it sends
 * itself a wake-up and the poll does not block).
 * A poster appends under engine_mutex and calls uv_async_send iff `sleeping`.
 * Both sides hold the same lock, so either the poster's append comes first and
 * prepare_cb sees the task, or `sleeping` comes first and the poster wakes
 * the loop. The rule holds for posts from the loop thread too, whatever order
 * libuv runs prepare callbacks in. `sleeping` is cleared when the wake-up is
 * received or the turn ends. Busy polling is the loop thread's own choice
 * (UV_RUN_NOWAIT turns: `sleeping` stays 0 and posts need no wake-up).
 *
 * Locking: engine_mutex guards the `engine` pointer, the queue, `sleeping`,
 * `wake_pending` and `stopping`. Posting holds it across uv_async_send, so once
 * `stopping` is set nobody touches the async handle and it can be closed.
 * shutdown_mutex serialises whole shutdowns (start -> join -> free). */
#include "loop.h"

#include "env.h"
#include "error.h"
#include "fdlimit.h"
#include "log.h"
#include "tls.h"

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <time.h>
#include <stdatomic.h>
#include <stdlib.h>

struct engine {
    uv_loop_t loop;
    uv_async_t wake;
    uv_prepare_t before_poll; /* prepare_cb: the last word before epoll */
    uv_thread_t thread;
    struct c10d__task *head; /* FIFO of posted tasks (engine_mutex) */
    struct c10d__task *tail;
    int sleeping;     /* the loop may block in epoll this turn (engine_mutex) */
    int wake_pending; /* a wake-up was sent and not yet received (engine_mutex) */
    int stopping;     /* posts are refused (engine_mutex) */
    /* Loop thread only from here on. */
    int stop_requested;
    int hooks_ran;  /* the shutdown hooks of this stop ran */
    int stop_holds; /* c10d__engine_hold_stop: the rest of the stop waits */
    struct c10d__shutdown_hook *hooks;
    struct c10d__task stop_task;
    int64_t batch;            /* tasks run per turn (C10D_ENGINE_BATCH) */
    struct c10d__task *ready; /* taken from the queue, not yet run */
    int may_sleep;            /* this turn was entered with UV_RUN_ONCE */
    /* Busy polling: until spin_until the loop runs zero-timeout turns, taking
     * posted tasks between them, so a post needs no eventfd write and an
     * incoming message is seen at once. It ends spin_ns after the last
     * activity (c10d__engine_busy). */
    uint64_t spin_ns;
    uint64_t spin_until;
};

static struct engine *engine;
/* engine != NULL && !engine->stopping, written under engine_mutex: what a
 * work's creation asks on every op, answered without the mutex. A work that
 * checks after joining the pending list still sees a stop whose sweep missed
 * it: the stop stored 0 before its sweep took the list's lock, and that lock
 * was let go before the work's join took it. */
static atomic_int engine_live;
/* Every registered sweep (engine_mutex); they outlive engines. */
static struct c10d__shutdown_sweep *sweeps;
static uv_mutex_t engine_mutex;
static uv_mutex_t shutdown_mutex;
static uv_once_t engine_once = UV_ONCE_INIT;
/* The engine whose loop this thread runs: set on the engine thread only. */
static _Thread_local C10D__TLS_HOT struct engine *loop_engine;
/* Debug check of the hand-off (c10d__engine_check_handoff). */
static atomic_int check_handoff;
static atomic_long handoff_violations;

/* Not shutdown_mutex: c10d_shutdown holds it while it joins a loop thread
 * that may need locks other modules' fork handlers (run before this one)
 * already took; the child makes its own anyway. */
static void fork_prepare(void)
{
    uv_mutex_lock(&engine_mutex);
}

static void fork_parent(void)
{
    uv_mutex_unlock(&engine_mutex);
}

/* The child has no loop thread: the parent's engine (and every handle on it) is
 * abandoned, its memory leaked on purpose, since freeing uv state owned by a
 * thread that does not exist here is unsafe. The next use starts a new engine.
 * The forking thread is not a loop thread in the child, even if it was one. */
static void fork_child(void)
{
    engine = NULL;
    atomic_store(&engine_live, 0);
    loop_engine = NULL;
    uv_mutex_init(&engine_mutex);
    uv_mutex_init(&shutdown_mutex);
}

static void engine_init_once(void)
{
    c10d__env_init(); /* read under engine_mutex: its lock is the inner one */
    uv_mutex_init(&engine_mutex);
    uv_mutex_init(&shutdown_mutex);
    pthread_atfork(fork_prepare, fork_parent, fork_child);
}

/* engine_mutex held: the hand-off invariant. A queued task while the loop
 * may be blocked in epoll needs a wake-up on its way. */
static void check_handoff_locked(struct engine *e)
{
    if (atomic_load_explicit(&check_handoff, memory_order_relaxed) && e->sleeping &&
        e->head != NULL && !e->wake_pending)
        atomic_fetch_add(&handoff_violations, 1);
}

void c10d__engine_check_handoff(int on)
{
    atomic_store(&check_handoff, on);
}

long c10d__engine_handoff_violations(void)
{
    return atomic_load(&handoff_violations);
}

static struct c10d__task *take_all_tasks(struct engine *e)
{
    uv_mutex_lock(&engine_mutex);
    struct c10d__task *list = e->head;
    e->head = e->tail = NULL;
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

static void run_hooks(struct engine *e)
{
    while (e->hooks != NULL) {
        struct c10d__shutdown_hook *h = e->hooks;
        e->hooks = h->next;
        h->next = NULL;
        h->fn(h);
    }
}

/* Loop thread. Order matters: modules fail their operations first, in their
 * hooks (run_posted; their callbacks may post tasks, which still run), and
 * any hold ends; then posting is closed, then works created in the meantime
 * are failed too, then every handle is closed and uv_run returns once their
 * close callbacks have run. The loop never polls busily again: it has
 * nothing left to wait for but close callbacks. */
static void engine_stop_on_loop(struct engine *e)
{
    e->spin_ns = e->spin_until = 0;
    run_hooks(e); /* any registered while a hold kept the loop serving */
    run_tasks(e->ready);
    e->ready = NULL;
    run_sweeps();
    for (struct c10d__task *t; (t = take_all_tasks(e)) != NULL;)
        run_tasks(t);
    uv_mutex_lock(&engine_mutex);
    e->stopping = 1;
    atomic_store(&engine_live, 0);
    uv_mutex_unlock(&engine_mutex);
    run_sweeps();
    run_tasks(take_all_tasks(e));
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

void c10d__engine_busy(void)
{
    struct engine *e = loop_engine;
    if (e == NULL || e->spin_ns == 0)
        return;
    /* Never shortens a longer window asked for (c10d__engine_busy_for). */
    uint64_t until = uv_hrtime() + e->spin_ns;
    if (until > e->spin_until)
        e->spin_until = until;
}

void c10d__engine_busy_for(uint64_t ns)
{
    struct engine *e = loop_engine;
    if (e == NULL || e->spin_ns == 0)
        return;
    uint64_t until = uv_hrtime() + (ns > e->spin_ns ? ns : e->spin_ns);
    if (until > e->spin_until)
        e->spin_until = until;
}

int c10d__engine_will_sleep(void)
{
    struct engine *e = loop_engine;
    return e != NULL && e->may_sleep;
}

/* Runs just before the poll phase of every turn (see the top of the file). */
static void prepare_cb(uv_prepare_t *p)
{
    struct engine *e = p->data;
    if (!e->may_sleep)
        return;
    uv_mutex_lock(&engine_mutex);
    if (e->head == NULL) {
        e->sleeping = 1;
    } else if (!e->wake_pending) {
        /* Posted by a callback of this turn: do not block on it. */
        e->wake_pending = 1;
        uv_async_send(&e->wake);
    }
    uv_mutex_unlock(&engine_mutex);
}

static void wake_cb(uv_async_t *async)
{
    struct engine *e = async->data;
    uv_mutex_lock(&engine_mutex);
    e->sleeping = 0;
    e->wake_pending = 0;
    check_handoff_locked(e);
    uv_mutex_unlock(&engine_mutex);
    c10d__engine_busy();
}

/* Loop thread, between turns: runs at most `batch` tasks so socket and timer
 * callbacks are never starved by a flood of posts; the rest stay in `ready`,
 * ahead of anything posted later, and the next turn does not sleep. */
static void run_posted(struct engine *e)
{
    if (e->ready == NULL)
        e->ready = take_all_tasks(e);
    if (e->ready != NULL)
        c10d__engine_busy();
    for (int64_t n = 0; e->ready != NULL && n < e->batch; n++) {
        struct c10d__task *t = e->ready;
        e->ready = t->next;
        t->next = NULL;
        t->fn(t);
    }
    if (e->stop_requested && !e->stopping) {
        /* The hooks first; a hook that must keep serving a while holds the
         * rest (posting closed, every handle closed) back. */
        if (!e->hooks_ran) {
            e->hooks_ran = 1;
            e->spin_ns = e->spin_until = 0;
            run_hooks(e);
        }
        if (e->stop_holds == 0)
            engine_stop_on_loop(e);
    }
}

static void stop_task_fn(struct c10d__task *t)
{
    struct engine *e = (struct engine *)((char *)t - offsetof(struct engine, stop_task));
    e->stop_requested = 1;
}

/* Every socket write of the loop (libuv's, the store server's, the tcp
 * transport's) happens on the engine thread. A write to a peer that reset its
 * connection raises SIGPIPE on the writing thread, and the default action ends
 * the process: a stranger's RST must be an EPIPE for us instead. The engine
 * thread blocks SIGPIPE for its whole life; no other thread is touched. */
static void loop_thread_main(void *arg)
{
    struct engine *e = arg;
    loop_engine = e;
    sigset_t pipe_set;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, NULL);
    for (;;) {
        run_posted(e);
        int spin = e->ready != NULL || uv_hrtime() < e->spin_until;
        e->may_sleep = !spin;
        int alive = uv_run(&e->loop, spin ? UV_RUN_NOWAIT : UV_RUN_ONCE);
        if (e->may_sleep) {
            uv_mutex_lock(&engine_mutex);
            e->sleeping = 0;
            uv_mutex_unlock(&engine_mutex);
        }
        if (e->stopping) {
            if (!alive)
                break;
            close_late_handles(e);
        } else if (spin && e->ready == NULL) {
            /* Polling: let the caller's thread and other ranks sharing
             * this CPU run between turns. */
            sched_yield();
        }
    }
    int rc = uv_loop_close(&e->loop);
    if (rc != 0)
        C10D_ERROR("engine", "uv_loop_close at shutdown: %s", uv_strerror(rc));
    loop_engine = NULL;
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
    uv_prepare_init(&e->loop, &e->before_poll);
    e->before_poll.data = e;
    uv_prepare_start(&e->before_poll, prepare_cb);
    uv_unref((uv_handle_t *)&e->before_poll);
    int64_t spin_us = c10d__env_int(C10D_ENV_LOOP_SPIN_US);
    e->spin_ns = spin_us > 0 ? (uint64_t)spin_us * 1000u : 0;
    e->stop_task.fn = stop_task_fn;
    e->batch = c10d__env_int(C10D_ENV_ENGINE_BATCH);
    if (e->batch < 1)
        e->batch = 1;
    rc = uv_thread_create(&e->thread, loop_thread_main, e);
    if (rc != 0) {
        uv_close((uv_handle_t *)&e->wake, NULL);
        uv_close((uv_handle_t *)&e->before_poll, NULL);
        uv_run(&e->loop, UV_RUN_DEFAULT);
        uv_loop_close(&e->loop);
        free(e);
        return c10d__fail(c10d__status_from_uv(rc), "engine: cannot start the loop thread: %s",
                          uv_strerror(rc));
    }
    engine = e;
    atomic_store(&engine_live, 1);
    C10D_DEBUG("engine", "engine started");
    return 0;
}

void c10d__engine_init(void)
{
    uv_once(&engine_once, engine_init_once);
}

int c10d__engine_start(void)
{
    if (atomic_load(&engine_live))
        return 0;
    uv_once(&engine_once, engine_init_once);
    uv_mutex_lock(&engine_mutex);
    int rc = engine_start_locked();
    uv_mutex_unlock(&engine_mutex);
    return rc;
}

/* engine_mutex held. */
static int engine_post_locked(struct c10d__task *task)
{
    int rc = engine_start_locked();
    if (rc != 0)
        return rc;
    if (engine->stopping)
        return c10d__fail(C10D_EABORTED, "engine: shutting down; no new work is accepted");
    task->next = NULL;
    if (engine->tail != NULL)
        engine->tail->next = task;
    else
        engine->head = task;
    engine->tail = task;
    /* The same rule on the loop thread: another prepare callback may run
     * after prepare_cb and post before the poll. Posts from the poll's own
     * I/O callbacks, while `sleeping` is still 1, pay a needless write. */
    if (engine->sleeping && !engine->wake_pending) {
        engine->wake_pending = 1;
        uv_async_send(&engine->wake);
    }
    check_handoff_locked(engine);
    return 0;
}

int c10d__engine_post(struct c10d__task *task)
{
    uv_once(&engine_once, engine_init_once);
    uv_mutex_lock(&engine_mutex);
    int rc = engine_post_locked(task);
    uv_mutex_unlock(&engine_mutex);
    return rc;
}

int c10d__engine_post_if_running(struct c10d__task *task)
{
    uv_once(&engine_once, engine_init_once);
    uv_mutex_lock(&engine_mutex);
    int rc = engine != NULL ? engine_post_locked(task) : C10D_EABORTED;
    uv_mutex_unlock(&engine_mutex);
    return rc;
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
    if (atomic_load(&engine_live))
        return 0;
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

int c10d__engine_own_thread(void)
{
    return loop_engine != NULL;
}

int c10d__on_loop_thread(void)
{
    return loop_engine != NULL;
}

int c10d_on_loop_thread(void)
{
    return loop_engine != NULL;
}

void c10d__engine_on_shutdown(struct c10d__shutdown_hook *hook)
{
    if (loop_engine == NULL)
        return;
    hook->next = loop_engine->hooks;
    loop_engine->hooks = hook;
}

void c10d__engine_hold_stop(void)
{
    if (loop_engine != NULL)
        loop_engine->stop_holds++;
}

void c10d__engine_release_stop(void)
{
    if (loop_engine != NULL && loop_engine->stop_holds > 0)
        loop_engine->stop_holds--;
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
    if (loop_engine != NULL)
        return c10d__fail(C10D_EDEADLK,
                          "c10d_shutdown called on the engine loop thread (from a callback); "
                          "it would wait for itself");
    uv_once(&engine_once, engine_init_once);
    uv_mutex_lock(&shutdown_mutex);
    uv_mutex_lock(&engine_mutex);
    struct engine *e = engine;
    int rc = 0;
    if (e != NULL)
        rc = engine_post_locked(&e->stop_task);
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

uint64_t c10d__now_coarse_ns(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_MONOTONIC_COARSE, &ts) != 0)
        return uv_hrtime();
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t c10d__coarse_lag_ns(void)
{
    static _Atomic uint64_t lag;
    uint64_t v = atomic_load_explicit(&lag, memory_order_relaxed);
    if (v == 0) {
        struct timespec res;
        v = clock_getres(CLOCK_MONOTONIC_COARSE, &res) == 0
                ? 2 * ((uint64_t)res.tv_sec * 1000000000u + (uint64_t)res.tv_nsec)
                : 20000000u;
        atomic_store_explicit(&lag, v, memory_order_relaxed);
    }
    return v;
}

uint64_t c10d__now_ms(void)
{
    return uv_hrtime() / 1000000u;
}
