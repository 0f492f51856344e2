/* Works (futures): completed once, callbacks run exactly once on the loop
 * thread in registration order, optional deadline; a waiter returns after the
 * callbacks have run. The public half is in c10d.h. */
#ifndef C10D_ENGINE_WORK_H
#define C10D_ENGINE_WORK_H

#include "c10d.h"
#include "error.h"

#include <stdint.h>

/* As c10d_work_complete, with a printf-style message. Returns 1 if this call
 * completed the work, 0 if it was already complete. Any thread. */
int c10d__work_complete(c10d_work *work, int status, const char *fmt, ...) C10D_PRINTF(3, 4);

/* As c10d_work_create, for the library's own works: c10d_work_cancel refuses
 * them unless their producer set a cancel hook. */
int c10d__work_create(c10d_work **out, const char *what, int64_t timeout_ms);

/* As c10d__work_create, with the deadline not handed to the loop yet:
 * c10d__work_arm does that (counting from creation), unless the work was
 * parked meanwhile (whoever takes it from the park arms it). */
int c10d__work_create_unarmed(c10d_work **out, const char *what, int64_t timeout_ms);

/* A work's name made only when first read (a deadline's message, an error,
 * a log line): most ops' names never are, and making one was a tenth of a
 * small op's instructions. The name is `prefix` followed by what `make`
 * writes from a copy of `args` (at most C10D__WORK_NAME_ARGS bytes, holding
 * nothing that may go before the work does; `make` reads them with memcpy,
 * as they may sit at any alignment) into `buf` of `len` bytes, terminated.
 * Names are cut at 255 bytes, as they always were. */
#define C10D__WORK_NAME_ARGS 48
/* Callbacks a work has from its creation, before anyone else can see it
 * (so set without its lock): as c10d__work_on_complete_around with
 * anywhere = 1 registers them; last NULL: only first. */
struct c10d__work_hooks {
    c10d_work_cb first, last;
    void *arg;
};
struct c10d__work_name {
    const char *prefix;
    size_t prefix_len;
    void (*make)(const void *args, char *buf, size_t len);
    const void *args;
    size_t args_len;
    /* Its deadline's start (the monotonic clock, ns; a coarse reading plus
     * c10d__coarse_lag_ns for a group's op); 0: now. */
    uint64_t created_ns;
    const struct c10d__work_hooks *hooks; /* NULL: none */
};
/* As c10d__work_create_unarmed, named so. */
int c10d__work_create_named(c10d_work **out, const struct c10d__work_name *name,
                            int64_t timeout_ms);
/* As c10d__work_create_unarmed, named as `model` is (whose name is not made
 * for it) and counting its deadline from model's creation: the parts of an
 * op. */
int c10d__work_create_like(c10d_work **out, c10d_work *model, int64_t timeout_ms,
                           const struct c10d__work_hooks *hooks);
void c10d__work_arm(c10d_work *w);
/* As c10d__work_on_complete, for a callback that may also run on the thread
 * that completes the work with success off the loop (so it takes no lock a
 * waiter may hold, makes no uv call, calls no user code). When every callback
 * of a work is such, that thread runs them and lets the waiters go: no turn
 * of the loop. */
int c10d__work_on_complete_anywhere(c10d_work *w, c10d_work_cb cb, void *arg);
/* Registers `first` (with c10d__work_on_complete_anywhere where `anywhere`,
 * else c10d__work_on_complete) and, in the same step, `last`, which may run
 * anywhere and runs after every callback registered before the work
 * completed: a producer's bookkeeping around its user's callbacks. One `last`
 * per work (C10D_EINVAL otherwise). */
int c10d__work_on_complete_around(c10d_work *w, c10d_work_cb first, c10d_work_cb last, void *arg,
                                  int anywhere);

/* Completes the work with success on this thread, which is waiting for it
 * (so holds a reference through the call, which the completion leans on)
 * and holds no lock: callbacks registered with c10d__work_on_complete_anywhere
 * run here, and waiters go without a turn of the loop (any others run on the
 * loop, or here once the engine stops and cannot take them). Not from a
 * submit path: the group's mutex is held there. */
int c10d__work_complete_here(c10d_work *w);

/* As c10d_work_release, for a reference the library keeps for itself (the
 * lane's last parked op): dropping it hands nothing to the loop. */
void c10d__work_drop(c10d_work *w);

/* Parking: a producer that can run its op on a waiting thread leaves it
 * parked instead of handing it to the loop. One compare-and-swap decides who
 * takes it, once: c10d_work_wait on another thread than the loop calls `run`
 * there; anything else that awaits it from the loop (a callback, a poll with
 * c10d_work_test or c10d_work_status, c10d_work_cancel, c10d__work_unpark)
 * calls `adopt`. The deadline is armed when the loop takes the op; a waiter
 * stops at it by itself. */
struct c10d__work_park {
    /* Runs the op on the waiting thread until it completed the work (1) or
     * until deadline_ns (c10d__now_ns; 0: none) or the producer's own limit,
     * then hands it to the loop as adopt does (0). */
    int (*run)(void *arg, uint64_t deadline_ns);
    /* Hands the op to the loop; any thread. */
    void (*adopt)(void *arg);
};
/* Once per work, by its producer: 0 (parked; an unpark may have taken it
 * since), or -1 if a callback that runs on the loop awaits it already (its
 * producer hands the op to the loop itself). */
int c10d__work_park(c10d_work *w, const struct c10d__work_park *park, void *arg);
/* Hands a parked work's op to the loop: 1 if this call did, 0 if it was not
 * parked (never, run by a waiter, or taken already). */
int c10d__work_unpark(c10d_work *w);
/* As c10d_work_on_complete, for the library's own bookkeeping callbacks (the
 * same rules: the loop thread, in registration order, after completion). */
int c10d__work_on_complete(c10d_work *w, c10d_work_cb cb, void *arg);
/* c10d_work_wait without torch's blocking wait: the library's own waits (loop
 * calls, blocking store calls, wait_all) end the wait, never the work. */
int c10d__work_wait(c10d_work *w, int64_t timeout_ms);
/* The same, until an absolute deadline (c10d__now_ns; 0: none): a wait
 * whose op ends on this thread reads no clock. */
int c10d__work_wait_until(c10d_work *w, uint64_t deadline_ns);

/* A device backend's c10d_work_wait_stream for this work: returns 0 once the
 * stream waits (never blocks the host), or a negative status. */
void c10d__work_set_stream_wait(c10d_work *w, int (*fn)(c10d_work *w, void *stream, void *arg),
                                void *arg);

/* How c10d_work_cancel stops this work (a store WAIT, a pending receive):
 * fn completes it with C10D_ECANCELED and returns 0, or fails. */
void c10d__work_set_cancel(c10d_work *w, int (*fn)(c10d_work *w, void *arg), void *arg);

void c10d__work_set_source_rank(c10d_work *work, int rank);
/* The group rank a failed op's backend blames (c10d_work_failed_rank): set
 * before the work's other callbacks run. */
void c10d__work_set_failed_rank(c10d_work *work, int rank);

/* A GPU op's device time (c10d_work_duration_ms); before it completes. */
void c10d__work_set_duration(c10d_work *work, float ms);

/* The flight recorder entry (engine/flight_recorder.h) this work completes:
 * marked completed (or retired, on failure) at the moment the work completes,
 * before any waiter returns. */
void c10d__work_set_fr_id(c10d_work *work, uint64_t rid);

/* A producer's result carried by the work (set before anyone else sees the
 * work; read after it completed), freed by free_fn with the work. `kind` is
 * any address unique to the producer; c10d__work_payload returns NULL for
 * another kind. */
void c10d__work_set_payload(c10d_work *w, const void *kind, void *payload,
                            void (*free_fn)(void *payload));
void *c10d__work_payload(c10d_work *w, const void *kind);
/* The name it was created with (its deadline's message is built from it). */
const char *c10d__work_what(c10d_work *w);

/* Loop thread: completes every pending work with `status` and `message`
 * (engine shutdown). Callbacks run; inline when posting is already closed. */
void c10d__work_abort_all(int status, const char *message);

/* Number of works not yet complete (tests, leak checks). */
size_t c10d__work_pending_count(void);
/* Registers the works' fork handlers (once); see c10d__engine_init. */
void c10d__work_init(void);

#endif
