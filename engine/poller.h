/* The completion poller: the loop's way to see completions that no file
 * descriptor announces (a CUDA event, an NCCL communicator's async error, a
 * test backend's stream thread).
 *
 * A backend owns ordered queues (one per stream, say) and pushes items onto
 * them from any thread. Work in one queue completes in order, so the loop
 * polls only the head of each non-empty queue. While something completes, it
 * polls on every loop turn (the loop then busy-polls, docs/engine.md); when
 * nothing has for a while it backs off to a timer, from 1 ms up to
 * C10D__POLL_MAX_INTERVAL_MS. With every queue empty it costs nothing. */
#ifndef C10D_ENGINE_POLLER_H
#define C10D_ENGINE_POLLER_H

#include <stdint.h>

#define C10D__POLL_MAX_INTERVAL_MS 2

struct c10d__poll_item;
struct c10d__poll_item {
    /* Loop thread: nonzero once the item is finished. Must not block, and
     * must not touch the queue (push or cancel) itself. */
    int (*ready)(struct c10d__poll_item *item);
    /* Loop thread, once after `ready` said so and the item left its queue:
     * complete the work, recycle the item (it may be freed here). */
    void (*done)(struct c10d__poll_item *item);
    struct c10d__poll_item *next;
};

struct c10d__poll_queue {
    struct c10d__poll_item *head, *tail;
    struct c10d__poll_queue *next_active; /* the poller's list of non-empty queues */
    int active;
};

/* A zeroed queue is ready to use; this says so explicitly. */
void c10d__poll_queue_init(struct c10d__poll_queue *q);

/* Any thread: appends `item`; the loop starts polling if it was not. Returns
 * 0, or C10D_EABORTED while the engine shuts down (the item was not queued). */
int c10d__poll_push(struct c10d__poll_queue *q, struct c10d__poll_item *item);

/* Any thread: takes every item out of `q` (oldest first, linked by ->next)
 * and stops polling it; their `done` is not called: the caller fails or frees
 * them. On the loop thread this is safe even inside another item's `done`. */
struct c10d__poll_item *c10d__poll_cancel(struct c10d__poll_queue *q);

/* Any thread: items queued and not yet done, across all queues (tests). */
uint64_t c10d__poll_pending(void);

/* Loop thread: one polling pass now. Returns how many items completed. */
int c10d__poll_run(void);

#endif
