/* P2P in the caller's lane: a small send or receive between two ranks of
 * one host's segment carried by the callers' threads through the pair's
 * mailbox (backends/shm/mailbox.h), not by their loops (docs/shm.md, "P2P in
 * the caller's lane").
 *
 * - A send fills its receiver's posted receive (done: matched and
 *   delivered), or deposits the message in the mailbox; then its work
 *   completes once the receiver matched it, seen by the send's waiter (or,
 *   handed over, the loop's poller).
 * - A receive takes a deposited message of its tag (done), or posts itself
 *   in the mailbox and parks on its work: its waiter polls for the sender's
 *   fill and completes it on its own thread.
 * - Everything else takes the tcp path (the transport's frames through the
 *   rings), and the receiver's loop matches a deposited message that the
 *   tcp path must see first (match.c: before a later frame of that sender,
 *   before a receive posted there).
 *
 * Matching order holds across both paths because each side uses the
 * mailbox only when none of the group's P2P ops is on its loop: a sender's
 * loop sends are all matched (a send completes only then), and a receiver's
 * earlier receives are all done. A message of the sender's that reaches the
 * receiver's loop while a receive is posted in the mailbox (sent before the
 * post was seen) takes the post back and hands the receive to the loop,
 * where it matches that message; so does the caller's next receive that
 * could otherwise overtake it. Whoever takes a post back (one CAS against
 * the sender's fill) hands its receive to the loop, under the lane's mutex,
 * before any later op of the caller is posted. */
#ifndef C10D_BACKENDS_TCP_P2P_LANE_H
#define C10D_BACKENDS_TCP_P2P_LANE_H

#include "backends/backend.h"
#include "backends/shm/segment.h"
#include "engine/lock.h"
#include "transport.h"

#include <stdatomic.h>
#include <uv.h>

struct p2p_lane_recv;
struct p2p_lane_op;

struct c10d__tcp_p2p_lane {
    struct c10d__shm_seg *seg;     /* NULL: no lane */
    struct c10d__tcp_transport *t; /* the one transport P2P takes to a peer */
    int group_size;
    int *seg_of;   /* a group rank's rank in seg, -1 for one on another host */
    int *group_of; /* a rank of seg's group rank */
    int on;        /* C10D_SHM_LANE and C10D_SHM_P2P */
    int bells;     /* every peer's doorbell opens here */
    int64_t spin_us;
    atomic_int broken;             /* counting failed once: no lane any more */
    atomic_int loop_ops;           /* the group's P2P ops on the loop, not completed */
    atomic_int owed;               /* `done` calls owed (p2p_lane.c, settle) */
    c10d__lock mutex;              /* engine/lock.h: taken twice per message */
    struct p2p_lane_recv **posted; /* per peer: its receive posted in the mailbox */
    struct p2p_lane_op *ops;       /* sends and taken receives whose works are pending */
    struct c10d__task *failing;    /* ops of `owed` that fail in settle (op->task.next) */
    int ended;                     /* (mutex) c10d__tcp_p2p_lane_end ran: no more polling */
    /* The owner's (tcp_backend.c). */
    const atomic_int *failed;
    void *owner;
    /* Posts op (its task) to the loop, which runs it as if just submitted,
     * and counts it done there: 0, or < 0 if posting is closed. */
    int (*to_loop)(void *owner, struct c10d__op *op);
    /* An op that took the lane, or a count of an op on the loop, no longer
     * needs its owner; `hold` takes one more such need. */
    void (*done)(void *owner);
    void (*hold)(void *owner);
    /* Loop: the group's failure (status, message), 0 if none. */
    int (*failure)(void *owner, char *msg, size_t n);
    /* Loop: a send's work ended before its receiver matched it (its
     * deadline): the group fails, as for any op completed outside. */
    void (*lost)(void *owner, c10d_work *w, int status);
};

void c10d__tcp_p2p_lane_init(struct c10d__tcp_p2p_lane *l);
/* Loop thread, before the group's first op: the lane runs on seg with
 * transport t, which matches deposited messages on the loop
 * (c10d__tcp_transport_set_mailbox). members: the group rank of each of seg's
 * ranks (a host-aware group's host), NULL where seg's ranks are the group's;
 * group_size: the group's. */
int c10d__tcp_p2p_lane_start(struct c10d__tcp_p2p_lane *l, struct c10d__shm_seg *seg,
                             struct c10d__tcp_transport *t, const int *members, int group_size);
void c10d__tcp_p2p_lane_destroy(struct c10d__tcp_p2p_lane *l);
/* Caller's thread, under the group's mutex: 1 if the lane took the single
 * P2P op (its work completes on its waiter or the loop), 0 if the caller
 * posts it with c10d__tcp_p2p_lane_post. A batch: c10d__tcp_p2p_lane_try_batch. */
int c10d__tcp_p2p_lane_try(struct c10d__tcp_p2p_lane *l, struct c10d__op *op);

/* The parts of c10d__tcp_p2p_lane_try a batch (p2p_lane_batch.c) takes
 * member by member, under the group's mutex. open: whether the lane may take
 * an op now; fits: whether it could take this one (a send or receive of at
 * most a mailbox to another rank of the segment, or a receive from any
 * source); try_one: takes a single op that fits (op->next NULL), as
 * c10d__tcp_p2p_lane_try. */
int c10d__tcp_p2p_lane_open(struct c10d__tcp_p2p_lane *l);
int c10d__tcp_p2p_lane_fits(const struct c10d__tcp_p2p_lane *l, const struct c10d__op *op);
int c10d__tcp_p2p_lane_try_one(struct c10d__tcp_p2p_lane *l, struct c10d__op *op);
/* As c10d__tcp_p2p_lane_try, for a batch (op->next set): its members go through the lane
 * one by one, each with a work of its own, until one does not fit or is
 * refused; that one and the rest go to the loop as one batch. The batch's
 * work completes once every part did, with the first failure. 1 if the lane
 * took at least the first member, 0 if the caller posts the whole batch. */
int c10d__tcp_p2p_lane_try_batch(struct c10d__tcp_p2p_lane *l, struct c10d__op *head);
/* A P2P op for the loop: counted, and the posted receives it could
 * overtake go first; returns to_loop's answer. */
int c10d__tcp_p2p_lane_post(struct c10d__tcp_p2p_lane *l, struct c10d__op *op);
/* Any thread: every parked op goes to the loop (the group fails or ends). */
void c10d__tcp_p2p_lane_unpark(struct c10d__tcp_p2p_lane *l);
/* Loop, as the group ends: unpark, and a deposit still waiting for its
 * match on the loop's poller completes now. */
void c10d__tcp_p2p_lane_end(struct c10d__tcp_p2p_lane *l);

/* Tests: sends and receives the lane carried since the process began. */
void c10d__tcp_p2p_lane_counts(uint64_t *sends, uint64_t *recvs);

#endif
