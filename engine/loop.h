/* The engine: one libuv loop on one thread per process, started on first use.
 * Only that thread runs the loop: every task, callback and uv handle runs
 * there; other threads hand it work through c10d__engine_post /
 * c10d__engine_call (a queue, and a uv_async_send only while the loop sleeps). */
#ifndef C10D_ENGINE_LOOP_H
#define C10D_ENGINE_LOOP_H

#include <stdatomic.h>
#include <uv.h>

/* An intrusive task: embed it in your own struct to post without allocating. */
struct c10d__task;
typedef void (*c10d__task_fn)(struct c10d__task *task);
struct c10d__task {
    c10d__task_fn fn;
    struct c10d__task *next;
};

/* Registers the engine's fork handlers, once, starting nothing. A module
 * whose fork handlers take a lock that is held while posting here (or while
 * taking a lock held while posting) calls it before registering its own:
 * prepare handlers run in the reverse order of registration, so its lock is
 * then taken before the engine's, the order every other path takes them in. */
void c10d__engine_init(void);

/* Starts the engine if needed. Returns 0 or a negative status. */
int c10d__engine_start(void);

/* Queues `task` to run on the loop thread (FIFO across all posters). Any thread,
 * the loop thread included (then it runs on a later turn, never inside this
 * call). Starts the engine if needed. Returns 0, or C10D_EABORTED while the
 * engine is shutting down (the task will not run). */
int c10d__engine_post(struct c10d__task *task);

/* As c10d__engine_post, but never starts an engine: C10D_EABORTED (no
 * message) when none runs. For what only an engine that already ran could
 * hold handles of: after c10d_shutdown, or before any use, only memory is
 * left, and a post would start a loop thread for nothing. */
int c10d__engine_post_if_running(struct c10d__task *task);

/* 1 on the engine's thread (as c10d__on_loop_thread: no other thread runs
 * the loop). */
int c10d__engine_own_thread(void);

/* Loop thread: whether the engine this thread drives has begun to stop (its
 * shutdown hooks may have run already). Code that would open a handle or start
 * an operation from a task queued before the stop checks it, or the loop would
 * stay alive past the shutdown sweep. */
int c10d__engine_stop_begun(void);

/* 1 while c10d_shutdown has closed posting and not yet finished. */
int c10d__engine_stopping(void);

/* Convenience: allocates a task that calls fn(arg) on the loop thread. */
int c10d__engine_call(void (*fn)(void *arg), void *arg);

/* The loop; use it only on the loop thread (inside a task or callback). */
uv_loop_t *c10d__engine_loop(void);

/* 1 on the engine's loop thread. */
int c10d__on_loop_thread(void);

/* Shutdown hooks run on the loop thread, in reverse registration order, when
 * c10d_shutdown() begins: modules fail their pending operations and close
 * their handles there. Register from the loop thread. */
struct c10d__shutdown_hook {
    void (*fn)(struct c10d__shutdown_hook *hook);
    struct c10d__shutdown_hook *next;
};
void c10d__engine_on_shutdown(struct c10d__shutdown_hook *hook);
void c10d__engine_remove_shutdown_hook(struct c10d__shutdown_hook *hook);

/* A shutdown hook whose module must keep serving others a while (the store
 * server a rank hosts: the other ranks may still need it after this one is
 * done) takes a hold; the rest of the shutdown (posting closed, every handle
 * closed) waits until each hold is released, the loop running as before.
 * Loop thread only; whoever holds must release in bounded time. */
void c10d__engine_hold_stop(void);
void c10d__engine_release_stop(void);

/* A sweep ends what a module still holds when an engine shuts down; unlike a
 * hook it is registered once per process (any thread) and runs at every
 * shutdown, twice: after the hooks, and again once posting is closed, so that
 * anything the hooks' callbacks created is ended too. The works module
 * registers one to fail every pending work; lower layers never call up. */
struct c10d__shutdown_sweep {
    void (*fn)(void);
    struct c10d__shutdown_sweep *next;
};
void c10d__engine_add_sweep(struct c10d__shutdown_sweep *sweep);

/* Loop thread only: something happened (a post, bytes from a peer, a completion).
 * The loop polls without sleeping for C10D_LOOP_SPIN_US after the last such call,
 * so the next message of an exchange is seen at once instead of after a wake-up. */
void c10d__engine_busy(void);
/* Loop thread: as c10d__engine_busy, polling at least `ns` from now (a
 * longer window a backend asks for; nothing where C10D_LOOP_SPIN_US=0). */
void c10d__engine_busy_for(uint64_t ns);

/* Loop thread only: this turn of the loop ends blocked in epoll (it is not
 * busy-polling), so a poller with nothing new should arrange to be woken. */
int c10d__engine_will_sleep(void);

/* Tests: with `on`, every change of the hand-off state checks, under the
 * queue's lock, that no task is queued while the loop may block in epoll
 * with no wake-up on its way; c10d__engine_handoff_violations counts the
 * failures (0 if the hand-off is right). Off by default. */
void c10d__engine_check_handoff(int on);
long c10d__engine_handoff_violations(void);

/* Monotonic milliseconds (same clock as the loop's timers). */
uint64_t c10d__now_ms(void);
uint64_t c10d__now_ns(void);
/* The same clock at the kernel's tick (behind it by up to a tick or two, 4-8
 * ms here; a fifth of c10d__now_ns's cost on a VM): for windows of tens of
 * milliseconds. */
uint64_t c10d__now_coarse_ns(void);
/* How far c10d__now_coarse_ns may lag c10d__now_ns (two of its ticks): a
 * deadline counted from a coarse reading plus this is never early. */
uint64_t c10d__coarse_lag_ns(void);

#endif
