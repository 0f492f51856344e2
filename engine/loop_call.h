/* "Run this on the loop and wait for it": the one way a blocking call of the
 * library hands work to the loop thread and waits for the answer.
 *
 * The caller's thread posts `fn` and waits on a work (the engine's one
 * future) that the loop side completes with c10d__loop_call_done (at once
 * inside fn, or later from a callback), or until its deadline passes. A
 * caller that stops waiting abandons the call: the loop side goes on, and
 * when it calls done, `release(arg)` runs there in the caller's stead
 * (dropping what the caller would have dropped, e.g. its reference on arg,
 * or tearing down a result nobody will collect). The loop side may use arg
 * until it calls done; the caller reads arg only when the call returned the
 * loop side's status. */
#ifndef C10D_ENGINE_LOOP_CALL_H
#define C10D_ENGINE_LOOP_CALL_H

#include <stdint.h>

struct c10d__loop_call;

typedef void (*c10d__loop_call_fn)(struct c10d__loop_call *call, void *arg);

/* Never on the loop thread (C10D_EDEADLK). timeout_ms (> 0) bounds the wait.
 * Returns the status given to done (with c10d_last_error() set to its message
 * when negative); C10D_ETIMEDOUT with `on_timeout` as the message when the
 * wait gave up, and then *abandoned = 1: arg is the loop side's now, and
 * release(arg) will run if the loop side ever answers (also so when shutdown
 * aborted the call before fn ran: C10D_EABORTED); or the posting error (the
 * engine is shutting down: fn never runs, release is not called). */
int c10d__loop_call_run(c10d__loop_call_fn fn, void *arg, void (*release)(void *arg),
                        int64_t timeout_ms, const char *on_timeout, int *abandoned);

/* Loop thread (or any thread), exactly once: the answer. `message` (may be
 * NULL) is copied; it becomes the caller's c10d_last_error() when status < 0. */
void c10d__loop_call_done(struct c10d__loop_call *call, int status, const char *message);

#endif
