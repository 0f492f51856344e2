/* The caller's lane: a small collective on the host's segment run by the
 * thread that waits for it, not by the loop (docs/engine.md, "The caller's
 * lane").
 *
 * At submit, on the caller's thread, an op that needs one chunk of the
 * segment and nothing more from this rank once it wrote its slot takes the
 * lane (only while the loop holds no collective of the group), writes its
 * slot (so its peers never wait on this rank again) and is parked on its
 * work. A thread that waits on that work reads the peers' slots itself and
 * completes it: no post, no timer, no wake-up of the loop. An op that needs
 * this rank after its slot is written (an all_to_all whose own blocks fit
 * one chunk, an op read in place up to 1 MiB) takes the lane only to run
 * to its end there, its peers waited for a while; it is parked only once
 * done, else handed to the loop at once. Whatever else
 * awaits it (a callback, a poll, a later op of the group, a failure, the
 * spin limit, the deadline) hands it to the loop, which goes on from where
 * it stands.
 *
 * `word` orders the lane against the loop: HELD while an op is in the lane
 * (the loop starts no collective meanwhile), plus the collectives the loop
 * holds (an op takes the lane only when that count is 0). */
#ifndef C10D_BACKENDS_TCP_LANE_H
#define C10D_BACKENDS_TCP_LANE_H

#include "backends/backend.h"
#include "backends/shm/coll.h"

#include <stdatomic.h>
#include <uv.h>

struct c10d__tcp_lane {
    struct c10d__shm_seg *seg; /* set before the first op; NULL: no lane */
    int on;                    /* C10D_SHM_LANE */
    int bells;                 /* every peer's doorbell opens (checked until it does) */
    int64_t spin_us;
    atomic_uint word;
    /* The op in the lane: its holder's alone (the submitter, then the
     * waiter, then the loop once it took it). */
    _Atomic(struct c10d__op *) op;
    struct c10d__shm_coll coll;
    /* The work of the last op parked here, with a reference, kept until the
     * next one replaces it (a work that ran needs no unpark); an unpark
     * borrows it (c10d__tcp_lane_unpark). */
    _Atomic(c10d_work *) parked;
    /* The owner's (tcp_backend.c). */
    const atomic_int *failed; /* nonzero once the group failed */
    void *owner;
    /* Posts the op to the loop, which takes it with c10d__tcp_lane_taken: 0,
     * or < 0 if posting is closed. */
    int (*to_loop)(void *owner, struct c10d__op *op);
    /* The lane let go while the loop holds collectives that wait for it. */
    void (*kick)(void *owner);
    /* The op no longer needs its owner (after its work completed). */
    void (*done)(void *owner);
};

void c10d__tcp_lane_init(struct c10d__tcp_lane *l);
void c10d__tcp_lane_destroy(struct c10d__tcp_lane *l);
/* Caller's thread, in seq order (under the group's mutex): 1 if the lane
 * took op (parked on its work, or handed to the loop), 0 if the caller posts
 * it as usual. The owner counted it as submitted first. */
int c10d__tcp_lane_try(struct c10d__tcp_lane *l, struct c10d__op *op);
/* A collective for the loop: counted, and the parked one goes first. */
void c10d__tcp_lane_loop_add(struct c10d__tcp_lane *l);
/* Loop: one of the collectives it held finished. */
void c10d__tcp_lane_loop_done(struct c10d__tcp_lane *l);
/* Loop: whether an op is in the lane (start no collective). */
int c10d__tcp_lane_held(struct c10d__tcp_lane *l);
/* Loop: whether op is the lane's, posted by to_loop; if so the loop holds
 * it from now on (counted, the lane free) and *coll is where it stands. */
int c10d__tcp_lane_taken(struct c10d__tcp_lane *l, const struct c10d__op *op,
                         struct c10d__shm_coll *coll);
/* Any thread: a parked op goes to the loop (the group fails or ends). */
void c10d__tcp_lane_unpark(struct c10d__tcp_lane *l);

/* Tests: ops their waiting thread completed, ops handed to the loop, since
 * the process began. */
void c10d__tcp_lane_counts(uint64_t *here, uint64_t *to_loop);

#endif
