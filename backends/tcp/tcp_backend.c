/* The tcp backend: the vtable the process group drives (backends/backend.h).
 *
 * Collectives run one at a time in submission order (they are matched
 * across ranks by sequence number, and one at a time keeps every rank at
 * most one collective ahead of another, which bounds what a receiver must
 * buffer). P2P operations run as soon as they are submitted.
 *
 * Failure policy (docs/semantics.md, 4): the first failure of any kind
 * (a peer gone, a mismatch, a timeout, an abort) fails every pending op with
 * the reason, closes every connection after telling the peers why, and
 * poisons the group: later ops fail at once naming that first error.
 *
 * Over 800 lines because the op queue, the failure policy, the address
 * exchange at creation and the running of an op's phases (shared memory,
 * host-aware) all change the same per-group state; the transport
 * (transport.h, rails.h), the algorithms (coll.h), the segment's protocol
 * (backends/shm/) and the host map (hier.h) are elsewhere. Splitting off the
 * address exchange behind a private header of this state is the next cut. */
#include "tcp_backend.h"

#include "coll.h"
#include "hier.h"
#include "lane.h"
#include "p2p_lane.h"
#include "rails.h"
#include "transport.h"

#include "backends/shm/bell.h"
#include "backends/shm/coll.h"
#include "backends/shm/path.h"

#include "engine/block_cache.h"
#include "engine/env.h"
#include "engine/error.h"
#include "engine/log.h"
#include "engine/loop.h"
#include "engine/poller.h"
#include "engine/kernels/reduce.h"
#include "engine/work.h"
#include "store_server/client/store.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

struct tcp_state;
struct tcp_op;

/* One send to or receive from this very rank (inside a batch), waiting for
 * its other half: halves pair by tag, in posting order, as a peer's would. */
struct self_p2p {
    struct tcp_op *o;
    const struct c10d__op *op;
    struct self_p2p *next;
};

/* An op's lifetime: one reference for the group's lists (the queue, the
 * running collective or the P2P list, then the dead list until the next
 * advance or run frees it) and one for its work's completion callback, which
 * is given the op itself as its argument; so a completion finds its op in
 * O(1), and the op stays valid until that callback ran, whichever comes
 * first. */
struct tcp_op {
    struct tcp_state *s;
    struct tcp_op *next, *prev; /* the queue or the P2P list; `next` alone on the dead list */
    int refs;
    int linked;            /* in the queue, active or in the P2P list */
    struct c10d__op *head; /* the op, or the first of a coalesced / batched list */
    struct c10d__op *cur;  /* the member running (collectives) */
    c10d_work *work;
    int p2p;
    int left; /* P2P transfers not yet complete */
    int idx;
    int completed;
    int next_member; /* the current member finished; run the next one */
    int any_source;  /* a single receive from any source: report the sender */
    uint64_t start_ms;
    struct c10d__tcp_coll coll;
    /* a collective on shared memory: polled by the loop until done */
    struct c10d__poll_item poll;
    struct c10d__shm_coll shm;
    int shm_status;
    /* A host-aware op (hier.h): its phases, the one running, its buffers. */
    struct c10d__tcp_hier_phase ph[C10D_TCP_HIER_MAX_PHASES];
    int nph, iph;
    int next_phase; /* the running phase finished; start the next one */
    int *leaders;
    void *hbuf;
};

struct tcp_state {
    int rank, size;
    char *group_name;
    int64_t timeout_ms;
    uint64_t crowded_spin_ns; /* C10D_SHM_CROWDED_SPIN_US */
    /* One transport per listed interface (rails.h); t is rail 0, which
     * carries the hello notes and the shared-memory wake-ups. */
    struct c10d__tcp_rails *rails;
    struct c10d__tcp_transport *t;
    struct c10d__tcp_tuning tune;
    int refs; /* the owner's, each registered work callback, a posted advance */
    /* Ops tcp_submit took whose task has not run, or still in the lane, plus
     * one for the loop's references: the state's last holder frees it (the
     * loop, or a thread that ran the lane's op after the loop let go). */
    atomic_int submitted;
    /* Small collectives the waiting thread runs (lane.h). */
    struct c10d__tcp_lane lane;
    /* Small P2P ops between ranks of one segment (p2p_lane.h). */
    struct c10d__tcp_p2p_lane p2p;
    struct c10d__task kick_task;
    atomic_int kick_posted;
    int destroyed;
    int poisoned;
    int poison_status;
    char poison_msg[1024];
    /* poison_status for other threads (tcp_failure), stored once poison_msg
     * is final: a nonzero value published with release order. */
    atomic_int failed_status;
    /* The ranks lost when it failed (tcp_failed_ranks), final before
     * failed_status is published. */
    int *lost_ranks;
    int nlost;
    struct tcp_op *active;                  /* the collective running */
    struct tcp_op *queue_head, *queue_tail; /* collectives waiting their turn */
    struct tcp_op *p2p_ops, *p2p_tail;      /* P2P ops in flight, oldest first */
    struct tcp_op *dead;                    /* finished; freed by the advance task */
    /* A batch's sends to and receives from this rank, not matched yet. */
    struct self_p2p *self_sends, *self_recvs;
    struct c10d__task advance_task;
    int advance_posted;
    char *scratch;
    size_t scratch_len;
    void (*connect_done)(void *arg, int status);
    void *connect_arg;
    /* Where peers' addresses are read again (an attempt failed) or, lazily,
     * first (lookup_addr). */
    c10d_store *lookup_store;
    /* Every rank on this host: collectives run on this segment (docs/shm.md). */
    struct c10d__shm_seg *shm;
    /* The loop's ears for shm's and hier.seg's doorbells (docs/shm.md). */
    struct c10d__shm_bell *shm_bell, *hier_bell;
    struct c10d__poll_queue shm_polls;
    int shm_offered;                  /* this rank's handshake carries a shm note */
    int shm_lost;                     /* chosen, but not mapped here (shm_error says why) */
    char shm_note[C10D_SHM_NOTE_MAX]; /* docs/shm.md */
    char shm_error[1024];
    /* Ranks on several hosts, several on some: host-aware collectives over
     * this host's own segment (hier.h), set up after the handshake. */
    struct c10d__tcp_hier hier;
    int hier_on;
    int hier_pending; /* connected; waiting for the host's segment (connect_done pending) */
    /* The segment could not be mapped: its leader may have failed and gone,
     * and its reason, already sent to us, is the error to report; this timer
     * bounds the wait for it (hier_attach_failed). */
    uv_timer_t hier_grace;
    int hier_grace_open;
    int hier_attach_rc;
    char hier_attach_msg[1024];
    char hier_ref[C10D_SHM_REF_MAX]; /* the segment's name, as the host's leader sends it */
};

static void state_unref(struct tcp_state *s);
static void hier_step(struct tcp_op *o);
static void hier_grace_close(struct tcp_state *s);
static void connect_finished(struct tcp_state *s, int status);
static void group_fail(struct tcp_state *s, int status, const char *fmt, ...) C10D_PRINTF(3, 4);

/* --------------------------------------------------------- bookkeeping */

static void hier_release(struct tcp_op *o)
{
    free(o->leaders);
    free(o->hbuf);
    o->leaders = NULL;
    o->hbuf = NULL;
    o->nph = o->iph = 0;
}

static void op_unref(struct tcp_op *o)
{
    if (--o->refs == 0) {
        hier_release(o);
        c10d__block_put(C10D__BLOCK_TCP_OP, o);
    }
}

static void free_dead(struct tcp_state *s)
{
    while (s->dead != NULL) {
        struct tcp_op *o = s->dead;
        s->dead = o->next;
        op_unref(o);
    }
}

/* Doubly linked: an op leaves the queue or the P2P list in O(1), from
 * anywhere in it (a timeout may end any of 20000 ops in flight). */
static void list_append(struct tcp_op **head, struct tcp_op **tail, struct tcp_op *o)
{
    o->next = NULL;
    o->prev = *tail;
    if (*tail != NULL)
        (*tail)->next = o;
    else
        *head = o;
    *tail = o;
}

static void list_remove(struct tcp_op **head, struct tcp_op **tail, struct tcp_op *o)
{
    if (o->prev != NULL)
        o->prev->next = o->next;
    else
        *head = o->next;
    if (o->next != NULL)
        o->next->prev = o->prev;
    else
        *tail = o->prev;
    o->next = o->prev = NULL;
}

/* Loop thread: nothing wakes this rank through the doorbells any more (the
 * group failed or goes). Their pipes close with the segments. */
static void close_bells(struct tcp_state *s)
{
    c10d__shm_bell_close(s->shm_bell);
    c10d__shm_bell_close(s->hier_bell);
    s->shm_bell = s->hier_bell = NULL;
}

static void state_free(struct tcp_state *s)
{
    close_bells(s);
    if (s->lookup_store != NULL)
        c10d_store_release(s->lookup_store);
    free_dead(s);
    struct self_p2p *lists[2] = {s->self_sends, s->self_recvs};
    for (int i = 0; i < 2; i++)
        while (lists[i] != NULL) {
            struct self_p2p *e = lists[i];
            lists[i] = e->next;
            free(e);
        }
    c10d__shm_free(s->shm);
    c10d__tcp_hier_free(&s->hier);
    free(s->scratch);
    free(s->lost_ranks);
    free(s->group_name);
    c10d__tcp_lane_destroy(&s->lane);
    c10d__tcp_p2p_lane_destroy(&s->p2p);
    free(s);
}

/* Any thread: a submitted op's task ran, or the lane's op completed; or
 * (state_unref) the loop let go of its last reference. The last of them
 * frees the state. */
static void submitted_done(struct tcp_state *s)
{
    if (atomic_fetch_sub(&s->submitted, 1) == 1)
        state_free(s); /* no uv handle left: its bells closed with state_destroy */
}

static void state_unref(struct tcp_state *s)
{
    if (--s->refs == 0)
        submitted_done(s); /* the loop's share: freed now, or by the last op still out */
}

static void start_next(struct tcp_state *s);
static void run_member(struct tcp_op *o);

static void advance_fn(struct c10d__task *task)
{
    struct tcp_state *s =
        (struct tcp_state *)((char *)task - offsetof(struct tcp_state, advance_task));
    s->advance_posted = 0;
    if (!s->destroyed) {
        free_dead(s);
        struct tcp_op *o = s->active;
        if (o != NULL && o->next_phase) {
            o->next_phase = 0;
            hier_step(o);
        }
        if (o != NULL && o->next_member) {
            o->next_member = 0;
            o->cur = o->cur->next;
            o->idx++;
            run_member(o);
        }
        start_next(s);
    }
    state_unref(s);
}

static void schedule_advance(struct tcp_state *s)
{
    if (s->advance_posted)
        return;
    s->advance_task.fn = advance_fn;
    if (c10d__engine_post(&s->advance_task) == 0) {
        s->advance_posted = 1;
        s->refs++;
    }
}

/* Out of its list (O(1)) and onto the dead list. */
static void unlink_op(struct tcp_state *s, struct tcp_op *o)
{
    if (o->linked) {
        if (s->active == o)
            s->active = NULL;
        else if (o->p2p)
            list_remove(&s->p2p_ops, &s->p2p_tail, o);
        else
            list_remove(&s->queue_head, &s->queue_tail, o);
        o->linked = 0;
    }
    o->prev = NULL;
    o->next = s->dead;
    s->dead = o;
}

/* A completed op's unmatched halves to self go: nothing may touch its
 * buffers any more. */
static void self_forget(struct tcp_state *s, const struct tcp_op *o)
{
    struct self_p2p **lists[2] = {&s->self_sends, &s->self_recvs};
    for (int i = 0; i < 2; i++)
        for (struct self_p2p **pp = lists[i]; *pp != NULL;) {
            struct self_p2p *e = *pp;
            if (e->o == o) {
                *pp = e->next;
                free(e);
            } else {
                pp = &e->next;
            }
        }
}

/* Completes o's work; o is freed later (its frames may still be on the stack). */
static void op_complete(struct tcp_state *s, struct tcp_op *o, int status, const char *msg)
{
    if (o->completed)
        return;
    o->completed = 1;
    o->coll.failed = 1;
    self_forget(s, o);
    unlink_op(s, o);
    if (!o->p2p)
        c10d__tcp_lane_loop_done(&s->lane);
    if (status == 0)
        c10d__work_complete(o->work, 0, NULL);
    else
        c10d__work_complete(o->work, status, "tcp %s seq %llu (group %s, rank %d): %s",
                            c10d__op_kind_name(o->head->kind), (unsigned long long)o->head->seq,
                            s->group_name, s->rank, msg);
    /* o is freed by the next run or advance; the next queued op starts on a
     * later turn, outside the frames that completed this one. */
    if (s->queue_head != NULL)
        schedule_advance(s);
}

static void group_fail(struct tcp_state *s, int status, const char *fmt, ...)
{
    if (s->poisoned)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->poison_msg, sizeof s->poison_msg, fmt, ap);
    va_end(ap);
    s->poisoned = 1;
    s->poison_status = status;
    if (s->rails != NULL && (s->lost_ranks = malloc((size_t)s->size * sizeof(int))) != NULL)
        s->nlost = c10d__tcp_rails_lost_ranks(s->rails, s->lost_ranks, s->size);
    /* Sequentially consistent: an op parking in the lane stores its park
     * state and then loads this; the unpark below does the opposite. */
    atomic_store(&s->failed_status, status);
    C10D_WARN("tcp", "group %s rank %d failed: %s", s->group_name, s->rank, s->poison_msg);
    if (s->rails != NULL)
        c10d__tcp_rails_fail(s->rails, status, s->poison_msg);
    close_bells(s);
    /* A shared-memory op stops being polled: its peers may never come. */
    for (struct c10d__poll_item *it = c10d__poll_cancel(&s->shm_polls), *next; it != NULL;
         it = next) {
        next = it->next;
        op_unref((struct tcp_op *)((char *)it - offsetof(struct tcp_op, poll)));
    }
    while (s->active != NULL)
        op_complete(s, s->active, status, s->poison_msg);
    while (s->queue_head != NULL)
        op_complete(s, s->queue_head, status, s->poison_msg);
    while (s->p2p_ops != NULL)
        op_complete(s, s->p2p_ops, status, s->poison_msg);
    c10d__tcp_lane_unpark(&s->lane); /* it fails on the loop */
    c10d__tcp_p2p_lane_unpark(&s->p2p);
    hier_grace_close(s);
    if (s->hier_pending) { /* failed while waiting for the host's segment */
        s->hier_pending = 0;
        c10d__fail(status, "%s", s->poison_msg);
        connect_finished(s, status);
    }
}

static int tcp_failure(void *state, char *msg, size_t n)
{
    struct tcp_state *s = state;
    int status = atomic_load_explicit(&s->failed_status, memory_order_acquire);
    if (status != 0 && n > 0)
        snprintf(msg, n, "%s", s->poison_msg);
    return status;
}

static int tcp_failed_ranks(void *state, int *out, int cap)
{
    struct tcp_state *s = state;
    if (atomic_load_explicit(&s->failed_status, memory_order_acquire) == 0)
        return 0;
    for (int i = 0; i < s->nlost && i < cap; i++)
        out[i] = s->lost_ranks[i];
    return s->nlost;
}

static void on_transport_error(void *arg, int status, const char *message)
{
    group_fail(arg, status, "%s", message);
}

/* A work can also complete without us: its deadline passed (the pg armed
 * it), or someone completed it. Either way the op is dead and its buffers
 * may be gone, so the group fails: that closes the sockets, and nothing is
 * written into those buffers any more. */
static void on_work_done(c10d_work *work, int status, void *arg)
{
    struct tcp_op *found = arg; /* held by this callback's reference */
    struct tcp_state *s = found->s;
    /* An op not linked yet (its callback ran inline at shutdown, inside
     * tcp_run) or any more (it completed) is not ours to fail. */
    if (!s->destroyed && found->linked && !found->completed) {
        /* Its work already carries its own status: take it out first. */
        found->completed = 1;
        found->coll.failed = 1;
        unlink_op(s, found);
        int counted = !found->p2p;
        /* The deadline's own text: torch's watchdog words for a user's op
         * (SeqNum, NumelIn/Out as the group counts them), the internal op's
         * own name for the group's helpers (monitored_barrier). */
        if (status == C10D_ETIMEDOUT)
            group_fail(s, status, "%s", c10d_work_message(work));
        else
            group_fail(s, status < 0 ? status : C10D_EABORTED,
                       "%s seq %llu was completed outside the backend (%s): %s",
                       c10d__op_kind_name(found->head->kind), (unsigned long long)found->head->seq,
                       c10d_status_name(status), c10d_work_message(work));
        /* After the failure is published: an op taking the lane now sees it. */
        if (counted)
            c10d__tcp_lane_loop_done(&s->lane);
        schedule_advance(s);
    }
    op_unref(found);
    state_unref(s);
}

/* --------------------------------------------------------- collectives */

static char *scratch_get(struct c10d__tcp_coll *c, size_t bytes)
{
    struct tcp_state *s = c->scratch_arg;
    if (bytes == 0)
        bytes = 1;
    if (bytes > s->scratch_len) {
        free(s->scratch);
        s->scratch = malloc(bytes);
        s->scratch_len = s->scratch != NULL ? bytes : 0;
    }
    return s->scratch;
}

static void coll_finished(struct c10d__tcp_coll *c, int status)
{
    struct tcp_op *o = (struct tcp_op *)((char *)c - offsetof(struct tcp_op, coll));
    struct tcp_state *s = o->s;
    if (o->completed)
        return;
    if (status < 0) {
        group_fail(s, status, "%s", c10d_last_error());
        return;
    }
    if (o->iph < o->nph) {
        const struct c10d__tcp_hier_phase *p = &o->ph[o->iph++];
        if (p->after != NULL) {
            int rc = p->after(&s->hier, p);
            if (rc < 0) {
                group_fail(s, rc, "%s", c10d_last_error());
                return;
            }
        }
        if (p->avg_after) {
            int rc = c10d__reduce_finish(p->op.recv, p->op.count, p->op.dtype, C10D_AVG, s->size);
            if (rc < 0) {
                group_fail(s, rc, "%s", c10d_last_error());
                return;
            }
        }
        if (o->iph < o->nph) { /* on a later turn: this may run inside the phase's frames */
            o->next_phase = 1;
            schedule_advance(s);
            return;
        }
    }
    if (o->cur->next != NULL) {
        o->next_member = 1;
        schedule_advance(s);
        return;
    }
    op_complete(s, o, 0, NULL);
}

/* ---------------------------------------------- shared-memory collectives */

/* The tcp ring: the fallback for a sleeper whose doorbell cannot be used
 * (c10d__shm_wake_sleepers tries that first). */
static void ring_peer(void *arg, int r)
{
    struct tcp_state *s = arg;
    if (s->t != NULL)
        c10d__tcp_transport_ring(s->t, r);
}

/* A rank of this host's segment (host-aware ops) is rung by its group rank. */
static void ring_local_peer(void *arg, int r)
{
    struct tcp_state *s = arg;
    if (s->t != NULL)
        c10d__tcp_transport_ring(s->t, s->hier.local[r]);
}

/* The transport's rings (docs/shm.md, "P2P"): a rank whose ring says it
 * sleeps or waits for room is woken through its doorbell. */
static void wake_ring_peer(void *arg, int r)
{
    struct tcp_state *s = arg;
    if (s->shm != NULL)
        c10d__shm_wake(s->shm, r, ring_peer, s);
}

/* The same on a host's segment of a group that spans hosts: its ranks are
 * numbered by their place on the host there. */
static void wake_hier_peer(void *arg, int r)
{
    struct tcp_state *s = arg;
    if (s->hier.seg != NULL)
        c10d__shm_wake(s->hier.seg, s->hier.idx_in_host[r], ring_local_peer, s);
}

/* Frames between the ranks of a segment go through its rings: `members`
 * are their group ranks in the segment's order (NULL: the same numbers),
 * `me` this rank's place. Every rank reads them; C10D_SHM_P2P=0 keeps this
 * rank writing to the sockets (its peers still read what the others
 * write). Rail 0 alone: a ring has one writer. */
static void use_rings(struct tcp_state *s, struct c10d__shm_seg *seg, const int *members, int me,
                      void (*wake)(void *arg, int r))
{
    int write = c10d__env_bool(C10D_ENV_SHM_P2P);
    for (int i = 0; i < seg->nranks; i++)
        if (i != me)
            c10d__tcp_transport_set_ring(s->t, members != NULL ? members[i] : i,
                                         write ? c10d__shm_ring_of(seg, me, i) : NULL,
                                         c10d__shm_ring_of(seg, i, me), wake, s);
}

static int shm_ready(struct c10d__poll_item *item)
{
    struct tcp_op *o = (struct tcp_op *)((char *)item - offsetof(struct tcp_op, poll));
    if (o->completed)
        return 1;
    struct tcp_state *s = o->s;
    struct c10d__shm_seg *seg = o->shm.seg;
    int moved;
    o->shm_status = c10d__shm_coll_progress(&o->shm, &moved);
    if (!moved && o->shm_status == 0 && c10d__engine_will_sleep()) {
        /* The loop is about to block: ask to be rung, then look once more. */
        c10d__shm_sleepy(seg);
        o->shm_status = c10d__shm_coll_progress(&o->shm, &moved);
    }
    if (moved) {
        /* A peer is here: keep polling on every turn. Longer where ranks
         * outnumber CPUs: a loop that slept is woken through the scheduler,
         * behind the ranks holding the CPUs, at every later step and op. */
        if (seg->crowded && s->crowded_spin_ns != 0)
            c10d__engine_busy_for(s->crowded_spin_ns);
        else
            c10d__engine_busy();
        c10d__shm_awake(seg);
        c10d__shm_wake_sleepers(seg, seg == s->shm ? ring_peer : ring_local_peer, s);
    }
    if (o->shm_status < 0)
        snprintf(s->shm_error, sizeof s->shm_error, "%s", c10d_last_error());
    return o->shm_status != 0;
}

static void shm_done(struct c10d__poll_item *item)
{
    struct tcp_op *o = (struct tcp_op *)((char *)item - offsetof(struct tcp_op, poll));
    if (!o->completed) {
        if (o->shm_status < 0)
            c10d__fail(o->shm_status, "%s", o->s->shm_error);
        coll_finished(&o->coll, o->shm_status < 0 ? o->shm_status : 0);
    }
    op_unref(o);
}

static int shm_poll(struct tcp_op *o);

/* Runs `op` on `seg` as far as it can now; the poller takes it from there. */
static int shm_coll(struct tcp_op *o, struct c10d__shm_seg *seg, const struct c10d__op *op)
{
    struct c10d__tcp_coll *c = &o->coll;
    c10d__shm_coll_start(&o->shm, seg, op, (uint32_t)(o->idx & 0xff), &c->fp);
    size_t copy_bytes = c10d__shm_coll_copy_bytes(&o->shm);
    if (copy_bytes > 0) {
        char *copy = c->scratch(c, copy_bytes);
        if (copy == NULL)
            return c10d__fail(C10D_ENOMEM, "tcp %s: out of memory for %zu bytes",
                              c10d__op_kind_name(op->kind), copy_bytes);
        c10d__shm_coll_set_copy(&o->shm, copy);
    }
    return shm_poll(o);
}

/* Polls o->shm, started, until done: here as far as it goes, then on the
 * loop's poller. */
static int shm_poll(struct tcp_op *o)
{
    struct c10d__tcp_coll *c = &o->coll;
    o->poll.ready = shm_ready;
    o->poll.done = shm_done;
    o->refs++;
    if (shm_ready(&o->poll)) {
        shm_done(&o->poll);
        return 0;
    }
    int rc = c10d__poll_push(&o->s->shm_polls, &o->poll);
    if (rc < 0) {
        op_unref(o);
        return c10d__fail(rc, "tcp %s: the engine is shutting down",
                          c10d__op_kind_name(c->op->kind));
    }
    return 0;
}

static int start_algorithm(struct c10d__tcp_coll *c)
{
    switch (c->op->kind) {
    case C10D_OP_ALL_REDUCE:
        return c10d__tcp_all_reduce(c);
    case C10D_OP_BROADCAST:
        return c10d__tcp_broadcast(c);
    case C10D_OP_REDUCE:
        return c10d__tcp_reduce(c);
    case C10D_OP_ALL_GATHER:
        return c10d__tcp_all_gather(c);
    case C10D_OP_GATHER:
        return c10d__tcp_gather(c);
    case C10D_OP_SCATTER:
        return c10d__tcp_scatter(c);
    case C10D_OP_REDUCE_SCATTER:
        return c10d__tcp_reduce_scatter(c);
    case C10D_OP_ALL_TO_ALL:
        return c10d__tcp_all_to_all(c);
    case C10D_OP_BARRIER:
        return c10d__tcp_barrier(c);
    default:
        return c10d__fail(C10D_EUNSUPPORTED, "op kind %d cannot be coalesced with collectives",
                          (int)c->op->kind);
    }
}

/* The next phase of a host-aware op: on this host's segment, or among the
 * leaders over tcp (the collective's own algorithm on a subset of ranks). */
static void hier_step(struct tcp_op *o)
{
    struct tcp_state *s = o->s;
    if (o->completed)
        return;
    const struct c10d__tcp_hier_phase *p = &o->ph[o->iph];
    struct c10d__tcp_coll *c = &o->coll;
    int rc;
    if (p->on_shm) {
        rc = shm_coll(o, s->hier.seg, &p->op);
    } else {
        c->op = (struct c10d__op *)&p->op;
        c->rank = p->rank;
        c->size = p->size;
        c->members = p->ranks;
        c->esz = c10d_dtype_size(p->op.dtype);
        c->nchains = c->chains_left = 0;
        c->failed = 0;
        rc = start_algorithm(c);
    }
    if (rc < 0 && !o->completed)
        group_fail(s, rc, "%s", c10d_last_error());
}

static int hier_start(struct tcp_op *o)
{
    struct tcp_state *s = o->s;
    const struct c10d__op *op = o->cur;
    hier_release(o);
    o->leaders = malloc((size_t)s->hier.nhosts * sizeof *o->leaders);
    if (o->leaders == NULL)
        return c10d__fail(C10D_ENOMEM, "tcp: out of memory");
    size_t buf_bytes = c10d__tcp_hier_buf_bytes(&s->hier, op, s->rank);
    if (buf_bytes > 0 && (o->hbuf = malloc(buf_bytes)) == NULL)
        return c10d__fail(C10D_ENOMEM, "tcp: out of memory for %zu bytes", buf_bytes);
    C10D_CHECK(c10d__tcp_hier_prepare(&s->hier, op, s->rank, o->hbuf));
    int n = c10d__tcp_hier_phases(&s->hier, op, s->rank, o->leaders, o->hbuf, o->ph);
    if (n < 0)
        return n;
    if (c10d__tcp_hier_by_slices(&s->hier, op))
        C10D_DEBUG("tcp", "group %s rank %d: %s seq %llu by slices, %d ranks per host",
                   s->group_name, s->rank, c10d__op_kind_name(op->kind),
                   (unsigned long long)op->seq, s->hier.nlocal);
    o->nph = n;
    o->iph = 0;
    if (n == 0) { /* a leader alone on its host, of a group with nothing to do */
        coll_finished(&o->coll, 0);
        return 0;
    }
    hier_step(o);
    return 0;
}

static void run_member(struct tcp_op *o)
{
    struct tcp_state *s = o->s;
    struct c10d__op *op = o->cur;
    struct c10d__tcp_coll *c = &o->coll;
    memset(c, 0, sizeof *c);
    c->t = c10d__tcp_rails_pick(s->rails, op->seq);
    c->rails = c10d__tcp_rails_all(s->rails);
    c->nrails = c10d__tcp_rails_count(s->rails);
    c->tune = &s->tune;
    c->op = op;
    c->rank = s->rank;
    c->size = s->size;
    c->sub_base = (uint32_t)(o->idx & 0xff) << 24;
    c->esz = c10d_dtype_size(op->dtype);
    c->scratch = scratch_get;
    c->scratch_arg = s;
    c->finished = coll_finished;
    c10d__fp_of(op, s->size, &c->fp);
    for (int k = 0; k < c->nrails; k++) /* its frames may come on any rail */
        c10d__tcp_expect(c->rails[k], op->seq, (uint32_t)(o->idx & 0xff), &c->fp);
    if (s->shm != NULL)
        c10d__shm_announce(s->shm, op->seq, (uint32_t)(o->idx & 0xff), &c->fp);
    if (s->hier.seg != NULL)
        c10d__shm_announce(s->hier.seg, op->seq, (uint32_t)(o->idx & 0xff), &c->fp);
    if (o->completed)
        return; /* frames already here disagree: the group failed */
    int rc;
    hier_release(o);
    if (s->shm != NULL && c10d__shm_coll_supports(op, s->shm->slot_bytes, s->size)) {
        rc = shm_coll(o, s->shm, op);
        goto started;
    }
    if (s->hier_on && c10d__tcp_hier_supports(&s->hier, op)) {
        rc = hier_start(o);
        goto started;
    }
    if (s->shm_lost && c10d__shm_coll_supports(op, SIZE_MAX, s->size)) {
        rc = c10d__fail(C10D_ECLOSED, "%s", s->shm_error);
        goto started;
    }
    rc = start_algorithm(c);
started:
    if (rc < 0 && !o->completed) {
        /* Nothing was posted for this member, but earlier members (or other
         * ranks) may be in flight: the group cannot go on consistently. */
        group_fail(s, rc, "%s", c10d_last_error());
    }
}

static void start_next(struct tcp_state *s)
{
    while (s->active == NULL && s->queue_head != NULL && !s->poisoned &&
           !c10d__tcp_lane_held(&s->lane)) {
        struct tcp_op *o = s->queue_head;
        list_remove(&s->queue_head, &s->queue_tail, o);
        s->active = o;
        o->cur = o->head;
        o->idx = 0;
        run_member(o);
    }
}

/* ----------------------------------------------------------------- P2P */

static void p2p_done(struct c10d__tcp_xfer *x)
{
    struct tcp_op *o = x->ctx;
    struct tcp_state *s = o->s;
    if (o->any_source)
        c10d__work_set_source_rank(o->work, x->source);
    c10d__tcp_xfer_put(c10d__tcp_rails_pick(s->rails, (uint32_t)x->tag), x);
    if (--o->left == 0 && !o->completed)
        op_complete(s, o, 0, NULL);
}

/* One half of a transfer to self was done: the op completes with its last. */
static void self_half_done(struct tcp_state *s, struct tcp_op *o)
{
    if (--o->left == 0 && !o->completed)
        op_complete(s, o, 0, NULL);
}

/* A batch's send to (or receive from) this rank: copied once its other half,
 * with the same tag, is there (the first such, in posting order). < 0: the
 * group failed (the sizes disagree, or no memory). */
static int self_post(struct tcp_state *s, struct tcp_op *o, const struct c10d__op *op)
{
    int sending = op->kind == C10D_OP_SEND;
    struct self_p2p **other = sending ? &s->self_recvs : &s->self_sends;
    struct self_p2p **mine = sending ? &s->self_sends : &s->self_recvs;
    for (struct self_p2p **pp = other; *pp != NULL; pp = &(*pp)->next) {
        struct self_p2p *e = *pp;
        if (e->op->tag != op->tag)
            continue;
        *pp = e->next;
        const struct c10d__op *snd = sending ? op : e->op, *rcv = sending ? e->op : op;
        struct tcp_op *peer_op = e->o;
        free(e);
        size_t len = snd->count * c10d_dtype_size(snd->dtype);
        size_t cap = rcv->count * c10d_dtype_size(rcv->dtype);
        if (len > cap) {
            /* As a peer's oversized message: the group cannot go on. */
            group_fail(s, C10D_EINVAL,
                       "tcp: a send to self of %zu bytes (tag %d) does not fit the receive of %zu "
                       "bytes",
                       len, snd->tag, cap);
            return -1;
        }
        if (len > 0 && rcv->recv != snd->send)
            memmove(rcv->recv, snd->send, len);
        if (peer_op != o)
            self_half_done(s, peer_op);
        else
            o->left--; /* both halves are this batch's: its own count */
        self_half_done(s, o);
        return 0;
    }
    struct self_p2p *e = malloc(sizeof *e);
    if (e == NULL) {
        group_fail(s, C10D_ENOMEM, "tcp: out of memory");
        return -1;
    }
    *e = (struct self_p2p){o, op, NULL};
    while (*mine != NULL)
        mine = &(*mine)->next;
    *mine = e;
    return 0;
}

static void run_p2p(struct tcp_state *s, struct tcp_op *o)
{
    list_append(&s->p2p_ops, &s->p2p_tail, o);
    o->linked = 1;
    o->left = 1; /* held until every member is posted */
    o->any_source =
        o->head->kind == C10D_OP_RECV && o->head->next == NULL && o->head->peer == C10D_ANY_SOURCE;
    for (struct c10d__op *op = o->head; op != NULL && !o->completed; op = op->next) {
        if (op->kind != C10D_OP_SEND && op->kind != C10D_OP_RECV) {
            group_fail(s, C10D_EUNSUPPORTED, "a batch of P2P ops holds a %s",
                       c10d__op_kind_name(op->kind));
            return;
        }
        if (op->peer == s->rank) {
            o->left++;
            if (self_post(s, o, op) < 0)
                return;
            continue;
        }
        /* A P2P message goes on the rail of its tag, as gloo's context of
         * the tag: same (peer, tag), same rail, so their order holds. */
        struct c10d__tcp_transport *t = c10d__tcp_rails_pick(s->rails, (uint32_t)op->tag);
        struct c10d__tcp_xfer *x = c10d__tcp_xfer_get(t);
        if (x == NULL) {
            group_fail(s, C10D_ENOMEM, "tcp: out of memory");
            return;
        }
        x->peer = op->peer;
        x->kind = (uint8_t)op->kind;
        x->p2p = 1;
        x->tag = (uint64_t)op->tag;
        x->buf = op->kind == C10D_OP_SEND ? (void *)op->send : op->recv;
        x->len = op->count * c10d_dtype_size(op->dtype);
        x->work = o->work;
        x->done = p2p_done;
        x->ctx = o;
        o->left++;
        if (op->kind == C10D_OP_SEND)
            c10d__tcp_send(t, x);
        else
            c10d__tcp_recv(t, x);
    }
    if (--o->left == 0 && !o->completed)
        op_complete(s, o, 0, NULL);
}

/* -------------------------------------------------------------- vtable */

static int tcp_check(const struct c10d__op *op)
{
    if (op->device_type != C10D_DEVICE_CPU)
        return c10d__fail(C10D_EUNSUPPORTED, "tcp: only CPU buffers are supported");
    if (c10d_dtype_size(op->dtype) == 0)
        return c10d__fail(C10D_EINVAL, "tcp: unknown dtype %d", (int)op->dtype);
    if (op->kind == C10D_OP_ALL_REDUCE || op->kind == C10D_OP_REDUCE ||
        op->kind == C10D_OP_REDUCE_SCATTER)
        return c10d_reduce_op_check(op->redop, op->dtype);
    return 0;
}

static int is_p2p_kind(enum c10d__op_kind k)
{
    return k == C10D_OP_SEND || k == C10D_OP_RECV;
}

/* The lane's op, handed over where it stands: it runs first (the lane held
 * back every collective the loop got meanwhile), polled from its state. */
static void run_taken(struct tcp_state *s, struct tcp_op *o, const struct c10d__shm_coll *taken)
{
    struct c10d__tcp_coll *c = &o->coll;
    o->cur = o->head;
    c->t = c10d__tcp_rails_pick(s->rails, o->head->seq);
    c->op = o->head;
    c->rank = s->rank;
    c->size = s->size;
    c->esz = c10d_dtype_size(o->head->dtype);
    c->finished = coll_finished;
    c10d__fp_of(o->head, s->size, &c->fp);
    s->active = o;
    o->linked = 1;
    o->shm = *taken;
    if (shm_poll(o) < 0 && !o->completed)
        group_fail(s, C10D_EABORTED, "%s", c10d_last_error());
}

static void tcp_run(void *state, struct c10d__op *op)
{
    struct tcp_state *s = state;
    free_dead(s); /* never called from inside an op's own frames */
    int coll = !is_p2p_kind(op->kind);
    struct c10d__shm_coll taken;
    int from_lane = coll && c10d__tcp_lane_taken(&s->lane, op, &taken);
    if (s->poisoned || s->destroyed) {
        c10d__work_complete(op->work, s->poisoned ? s->poison_status : C10D_EABORTED,
                            "tcp %s seq %llu (group %s, rank %d): the group failed earlier: %s",
                            c10d__op_kind_name(op->kind), (unsigned long long)op->seq,
                            s->group_name, s->rank, s->poisoned ? s->poison_msg : "destroyed");
        if (coll)
            c10d__tcp_lane_loop_done(&s->lane);
        return;
    }
    /* From the loop thread's cache, where it goes back: a calloc of its
     * 2 KiB (past glibc's per-thread cache) was 2500 instructions. */
    struct tcp_op *o = c10d__block_take_zeroed(C10D__BLOCK_TCP_OP, sizeof *o);
    if (o == NULL) {
        c10d__work_complete(op->work, C10D_ENOMEM, "tcp %s seq %llu: out of memory",
                            c10d__op_kind_name(op->kind), (unsigned long long)op->seq);
        if (coll)
            c10d__tcp_lane_loop_done(&s->lane);
        if (from_lane) /* its slot is written, the peers went on: the group cannot */
            group_fail(s, C10D_ENOMEM, "tcp: out of memory");
        return;
    }
    o->s = s;
    o->head = op;
    o->work = op->work;
    o->start_ms = c10d__now_ms();
    o->p2p = !coll;
    /* The lists' reference and the callback's, both taken before the
     * callback is registered: at shutdown it may run inside this call. */
    o->refs = 2;
    s->refs++;
    if (c10d__work_on_complete(op->work, on_work_done, o) != 0) {
        o->refs--;
        s->refs--;
    }
    if (o->p2p) {
        run_p2p(s, o);
        return;
    }
    if (from_lane) {
        run_taken(s, o, &taken);
        return;
    }
    list_append(&s->queue_head, &s->queue_tail, o);
    o->linked = 1;
    start_next(s);
}

static void run_task(struct c10d__task *t)
{
    struct c10d__op *op = (struct c10d__op *)((char *)t - offsetof(struct c10d__op, task));
    struct tcp_state *s = op->state;
    tcp_run(s, op);
    submitted_done(s);
}

/* The lane let go while collectives waited (lane.h): start them. */
static void kick_fn(struct c10d__task *t)
{
    struct tcp_state *s = (struct tcp_state *)((char *)t - offsetof(struct tcp_state, kick_task));
    atomic_store(&s->kick_posted, 0);
    if (!s->destroyed)
        start_next(s);
    submitted_done(s);
}

static void lane_kick(void *owner)
{
    struct tcp_state *s = owner;
    if (atomic_exchange(&s->kick_posted, 1))
        return;
    atomic_fetch_add(&s->submitted, 1); /* keeps the state until it ran */
    s->kick_task.fn = kick_fn;
    if (c10d__engine_post(&s->kick_task) != 0) {
        atomic_store(&s->kick_posted, 0);
        submitted_done(s);
    }
}

/* Loop: a P2P send the lane deposited lost its work before its receiver
 * took it (its deadline): as for any op completed outside (on_work_done). */
static void p2p_lost(void *owner, c10d_work *w, int status)
{
    struct tcp_state *s = owner;
    if (!s->destroyed)
        group_fail(s, status == C10D_ETIMEDOUT ? status : C10D_EABORTED, "%s",
                   c10d_work_message(w));
}

static int lane_to_loop(void *owner, struct c10d__op *op)
{
    (void)owner;
    return c10d__engine_post(&op->task); /* its submitted count goes with it */
}

static void lane_done(void *owner)
{
    submitted_done(owner);
}

static void lane_hold(void *owner)
{
    struct tcp_state *s = owner;
    atomic_fetch_add(&s->submitted, 1);
}

/* The caller's thread: only posts. The group submits nothing after it asked
 * for abort or destroy, so the state's last reference goes only after every
 * increment here; the count keeps the state until each op's task ran. */
static int tcp_submit(void *state, struct c10d__op *op)
{
    struct tcp_state *s = state;
    op->state = s;
    op->task.fn = run_task;
    atomic_fetch_add(&s->submitted, 1);
    int coll = !is_p2p_kind(op->kind);
    if (coll               ? c10d__tcp_lane_try(&s->lane, op)
        : op->next != NULL ? c10d__tcp_p2p_lane_try_batch(&s->p2p, op)
                           : c10d__tcp_p2p_lane_try(&s->p2p, op))
        return 0;
    if (coll)
        c10d__tcp_lane_loop_add(&s->lane);
    int rc = coll ? c10d__engine_post(&op->task) : c10d__tcp_p2p_lane_post(&s->p2p, op);
    if (rc != 0) {
        if (coll)
            c10d__tcp_lane_loop_done(&s->lane);
        submitted_done(s);
        return c10d__fail(rc, "tcp %s seq %llu: the engine is shutting down",
                          c10d__op_kind_name(op->kind), (unsigned long long)op->seq);
    }
    return 0;
}

/* Closing sockets never blocks: both end before they return. */
static void tcp_abort(void *state, int status, const char *reason, c10d__backend_done_fn done,
                      void *arg)
{
    struct tcp_state *s = state;
    group_fail(s, status < 0 ? status : C10D_EABORTED, "%s",
               reason != NULL ? reason : "the group was aborted");
    if (done != NULL)
        done(arg, 0);
}

static void state_destroy(struct tcp_state *s)
{
    if (!s->poisoned && (s->active != NULL || s->queue_head != NULL || s->p2p_ops != NULL))
        group_fail(s, C10D_EABORTED, "the group was destroyed with operations pending");
    s->destroyed = 1;
    c10d__tcp_lane_unpark(&s->lane);
    c10d__tcp_p2p_lane_end(&s->p2p);
    close_bells(s);
    hier_grace_close(s);
    if (s->rails != NULL)
        c10d__tcp_rails_free(s->rails);
    s->rails = NULL;
    s->t = NULL;
    state_unref(s);
}

static void tcp_unpark(void *state)
{
    struct tcp_state *s = state;
    c10d__tcp_lane_unpark(&s->lane);
    c10d__tcp_p2p_lane_unpark(&s->p2p);
}

static void tcp_destroy(void *state, c10d__backend_done_fn done, void *arg)
{
    state_destroy(state);
    if (done != NULL)
        done(arg, 0);
}

/* Above this many ranks "auto" connects lazily: the full mesh's address
 * exchange reads N addresses per rank, N^2 through one store (bench/README.md,
 * "Scale: the rendezvous": 0.46 s at 2k ranks, 18.9 s at 10k, against 0.13 s
 * and 0.93 s lazily). */
#define LAZY_AUTO_ABOVE 1024

static int lazy_for(int size)
{
    if (strcasecmp(c10d__env_str(C10D_ENV_TCP_LAZY_INIT), "auto") == 0)
        return size > LAZY_AUTO_ABOVE;
    return c10d__env_bool(C10D_ENV_TCP_LAZY_INIT);
}

static uint32_t fnv1a(const char *str)
{
    uint32_t h = 2166136261u;
    for (; str != NULL && *str; str++)
        h = (h ^ (unsigned char)*str) * 16777619u;
    return h;
}

int c10d__tcp_open(const struct c10d__backend_config *cfg, void **state, const char **address)
{
    *state = NULL;
    if (cfg->size < 1 || cfg->rank < 0 || cfg->rank >= cfg->size)
        return c10d__fail(C10D_EINVAL, "tcp: rank %d is not in [0, %d)", cfg->rank, cfg->size);
    struct tcp_state *s = calloc(1, sizeof *s);
    if (s == NULL)
        return c10d__fail(C10D_ENOMEM, "tcp: out of memory");
    s->rank = cfg->rank;
    s->size = cfg->size;
    s->group_name = strdup(cfg->group_name != NULL ? cfg->group_name : "0");
    s->timeout_ms = cfg->timeout_ms;
    s->refs = 1;
    atomic_init(&s->submitted, 1); /* the loop's share (state_unref) */
    c10d__tcp_lane_init(&s->lane);
    c10d__tcp_p2p_lane_init(&s->p2p);
    s->p2p.failed = &s->failed_status;
    s->p2p.owner = s;
    s->p2p.to_loop = lane_to_loop;
    s->p2p.done = lane_done;
    s->p2p.hold = lane_hold;
    s->p2p.failure = tcp_failure;
    s->p2p.lost = p2p_lost;
    s->lane.failed = &s->failed_status;
    s->lane.owner = s;
    s->lane.to_loop = lane_to_loop;
    s->lane.kick = lane_kick;
    s->lane.done = lane_done;
    int64_t v;
    v = c10d__env_int(C10D_ENV_TCP_RD_MAX);
    s->tune.rd_max = v > 0 ? (size_t)v : 0;
    v = c10d__env_int(C10D_ENV_TCP_RING_MIN);
    s->tune.ring_min = v > 0 ? (size_t)v : 0;
    v = c10d__env_int(C10D_ENV_TCP_SEGMENT);
    s->tune.segment = v > 0 ? (size_t)v : 1u << 20;
    v = c10d__env_int(C10D_ENV_SHM_CROWDED_SPIN_US);
    s->crowded_spin_ns = v > 0 ? (uint64_t)v * 1000u : 0;
    struct c10d__tcp_transport_config tc = {
        .rank = cfg->rank,
        .size = cfg->size,
        .group_id = fnv1a(cfg->group_name),
        .lazy = lazy_for(cfg->size),
        .eager_max = (size_t)(c10d__env_int(C10D_ENV_TCP_EAGER_MAX) > 0
                                  ? c10d__env_int(C10D_ENV_TCP_EAGER_MAX)
                                  : 0),
        .socket_buffer = (int)c10d__env_int(C10D_ENV_TCP_SOCKET_BUFFER),
        .timeout_ms = cfg->timeout_ms,
        .store_local_addr = cfg->store_local_addr,
        .store_host = cfg->store_host,
        .on_error = on_transport_error,
        .arg = s,
    };
    if (s->group_name == NULL) {
        free(s);
        return c10d__fail(C10D_ENOMEM, "tcp: out of memory");
    }
    if (c10d__shm_wanted(cfg->size) && !tc.lazy) {
        s->shm_offered = 1;
        if (c10d__shm_note(cfg->rank, cfg->size, s->shm_note, sizeof s->shm_note, &s->shm) < 0) {
            free(s->group_name);
            free(s);
            return C10D_ENOMEM;
        }
        tc.hello_note = s->shm_note;
    }
    int rc = c10d__tcp_rails_new(&tc, &s->rails);
    if (rc < 0) {
        c10d__shm_free(s->shm);
        free(s->group_name);
        free(s);
        return rc;
    }
    s->t = c10d__tcp_rails_pick(s->rails, 0);
    *state = s;
    *address = c10d__tcp_rails_address(s->rails);
    return 0;
}

/* Every peer met, each handshake with its note: every rank decides alike
 * (docs/shm.md). 0, or < 0 if the group cannot run consistently. */
static int choose_shm(struct tcp_state *s, const char *const *notes)
{
    int rc = c10d__shm_decide(s->rank, s->size, notes, &s->shm);
    if (rc < 0 && s->rank != 0) {
        /* Rank 0 was here for the handshake, yet its segment is gone: it most
         * likely destroyed the group already (nothing waits for a slower
         * rank). Creation succeeds, as it would on tcp; an all_reduce fails
         * the group, telling the peers why. */
        s->shm_lost = 1;
        snprintf(s->shm_error, sizeof s->shm_error,
                 "the group's shared memory could not be mapped at its creation (rank 0 had "
                 "left the group, or: %s)",
                 c10d_last_error());
        C10D_INFO("shm", "group %s rank %d: %s", s->group_name, s->rank, s->shm_error);
        return 0;
    }
    if (rc > 0)
        s->shm_bell = c10d__shm_bell_listen(s->shm);
    if (rc > 0)
        s->lane.seg = s->shm; /* before the group's first op: set up on creation */
    if (rc > 0)
        use_rings(s, s->shm, NULL, s->rank, wake_ring_peer);
    /* One transport carries P2P to every peer (rings are rail 0's alone);
     * without memory for its table the lane is off, nothing else. */
    if (rc > 0 && c10d__tcp_rails_count(s->rails) == 1)
        (void)c10d__tcp_p2p_lane_start(&s->p2p, s->shm, s->t, NULL, s->size);
    if (rc > 0 && s->rank == 0)
        C10D_INFO("shm",
                  "group %s: every rank is on this host: collectives run on shared memory "
                  "(docs/shm.md)",
                  s->group_name);
    return rc < 0 ? c10d__fail(rc, "tcp: group %s, rank %d: %s", s->group_name, s->rank,
                               c10d_last_error())
                  : 0;
}

/* ------------------------------------------- host-aware set-up (hier.h) */

static void connect_finished(struct tcp_state *s, int status)
{
    void (*done)(void *, int) = s->connect_done;
    s->connect_done = NULL;
    if (done != NULL)
        done(s->connect_arg, status);
}

/* The segment's name travels from the host's leader to each of its local
 * peers as a message of the group (sequence 0: no collective has it). */
#define HIER_SUB 0x00fffffe

static struct c10d__tcp_xfer *hier_xfer(struct tcp_state *s, int peer,
                                        void (*done)(struct c10d__tcp_xfer *))
{
    struct c10d__tcp_xfer *x = c10d__tcp_xfer_get(s->t);
    if (x == NULL)
        return NULL;
    x->peer = peer;
    x->kind = (uint8_t)C10D_OP_BARRIER;
    x->p2p = 0;
    x->sub = HIER_SUB;
    x->tag = 0;
    memset(&x->fp, 0, sizeof x->fp);
    x->buf = s->hier_ref;
    x->len = sizeof s->hier_ref;
    x->work = NULL;
    x->done = done;
    x->ctx = s;
    return x;
}

static void hier_ref_sent(struct c10d__tcp_xfer *x)
{
    struct tcp_state *s = x->ctx;
    c10d__tcp_xfer_put(s->t, x);
}

/* The host's ranks trade small P2P through their mailboxes too (the lane
 * maps group ranks to the host segment's); off the host, the sockets. */
static void hier_p2p_lane(struct tcp_state *s)
{
    if (c10d__tcp_rails_count(s->rails) == 1)
        (void)c10d__tcp_p2p_lane_start(&s->p2p, s->hier.seg, s->t, s->hier.local, s->size);
}

static void hier_grace_closed(uv_handle_t *h)
{
    state_unref((struct tcp_state *)h->data);
}

static void hier_grace_close(struct tcp_state *s)
{
    if (!s->hier_grace_open)
        return;
    s->hier_grace_open = 0;
    uv_timer_stop(&s->hier_grace);
    uv_close((uv_handle_t *)&s->hier_grace, hier_grace_closed);
}

/* No failure of the group came while we waited: the mapping's own error. */
static void hier_grace_over(uv_timer_t *t)
{
    struct tcp_state *s = t->data;
    hier_grace_close(s);
    if (!s->hier_pending)
        return;
    s->hier_pending = 0;
    connect_finished(s, c10d__fail(s->hier_attach_rc, "%s", s->hier_attach_msg));
}

/* A segment that cannot be mapped is most often one whose leader already
 * failed (a collective of the group, run by the ranks that were ready) and
 * exited, closing it; the leader's reason is in our socket behind its
 * segment's name, and group_fail reports it. Ranks of one host see its
 * failure within milliseconds, so a short wait suffices. */
#define HIER_GRACE_MS 500

static int hier_attach_failed(struct tcp_state *s, int rc)
{
    snprintf(s->hier_attach_msg, sizeof s->hier_attach_msg, "%s", c10d_last_error());
    s->hier_attach_rc = rc;
    if (uv_timer_init(c10d__engine_loop(), &s->hier_grace) < 0)
        return 0;
    s->hier_grace.data = s;
    s->hier_grace_open = 1;
    s->refs++; /* hier_grace_closed */
    uv_timer_start(&s->hier_grace, hier_grace_over, HIER_GRACE_MS, 0);
    return 1;
}

static void hier_ref_received(struct c10d__tcp_xfer *x)
{
    struct tcp_state *s = x->ctx;
    size_t got = x->received;
    c10d__tcp_xfer_put(s->t, x);
    s->hier_ref[sizeof s->hier_ref - 1] = '\0';
    if (s->poisoned) { /* group_fail finished the connect */
        s->hier_pending = 0;
        return;
    }
    int rc;
    if (got == 0 || s->hier_ref[0] == '\0') {
        /* The leader could not make it, and says so to every peer at once. */
        rc = c10d__fail(C10D_ENOMEM,
                        "tcp: group %s, rank %d: this host's leader (rank %d) could not make the "
                        "host's shared segment (C10D_SHM=0 avoids it)",
                        s->group_name, s->rank, s->hier.local[0]);
    } else if ((rc = c10d__shm_attach(s->hier_ref, s->hier.nlocal, s->hier.local_idx,
                                      &s->hier.seg)) < 0) {
        rc = c10d__fail(rc, "tcp: group %s, rank %d: mapping this host's shared segment: %s",
                        s->group_name, s->rank, c10d_last_error());
        if (hier_attach_failed(s, rc))
            return; /* hier_pending stays: group_fail or hier_grace_over */
    }
    s->hier_on = rc == 0;
    if (rc == 0) {
        s->hier_bell = c10d__shm_bell_listen(s->hier.seg);
        use_rings(s, s->hier.seg, s->hier.local, s->hier.local_idx, wake_hier_peer);
        hier_p2p_lane(s);
    }
    s->hier_pending = 0;
    connect_finished(s, rc);
}

/* 0: ready (host-aware or not), 1: waiting for the leader's segment, < 0. */
static int hier_setup(struct tcp_state *s, const char *const *notes)
{
    int rc = c10d__tcp_hier_plan(&s->hier, s->rank, s->size, notes);
    if (rc <= 0)
        return rc;
    if (s->rank == 0)
        C10D_INFO("shm",
                  "group %s: %d hosts, several ranks on some: all_reduce, broadcast, reduce, "
                  "all_gather and reduce_scatter run on shared memory within each host and over "
                  "tcp between one leader per host (docs/shm.md)",
                  s->group_name, s->hier.nhosts);
    if (s->hier.nlocal == 1) {
        s->hier_on = 1;
        return 0;
    }
    if (s->hier.local_idx > 0) {
        struct c10d__tcp_xfer *x = hier_xfer(s, s->hier.local[0], hier_ref_received);
        if (x == NULL)
            return c10d__fail(C10D_ENOMEM, "tcp: out of memory");
        c10d__tcp_recv(s->t, x);
        return 1;
    }
    rc = c10d__shm_create(s->hier.nlocal, c10d__shm_slot_bytes(), &s->hier.seg, s->hier_ref,
                          sizeof s->hier_ref);
    char why[512] = "";
    if (rc < 0) {
        snprintf(why, sizeof why, "%s", c10d_last_error());
        s->hier_ref[0] = '\0'; /* the peers fail as we do, at once */
    }
    for (int i = 1; i < s->hier.nlocal; i++) {
        struct c10d__tcp_xfer *x = hier_xfer(s, s->hier.local[i], hier_ref_sent);
        if (x == NULL)
            return c10d__fail(C10D_ENOMEM, "tcp: out of memory");
        c10d__tcp_send(s->t, x);
    }
    if (rc < 0)
        return c10d__fail(rc, "tcp: group %s, rank %d: making this host's shared segment: %s",
                          s->group_name, s->rank, why);
    s->hier_on = 1;
    s->hier_bell = c10d__shm_bell_listen(s->hier.seg);
    use_rings(s, s->hier.seg, s->hier.local, s->hier.local_idx, wake_hier_peer);
    hier_p2p_lane(s);
    return 0;
}

uint64_t c10d__tcp_bytes_in_place(void *state)
{
    struct tcp_state *s = state;
    uint64_t n = 0;
    struct c10d__tcp_transport *const *rails = c10d__tcp_rails_all(s->rails);
    for (int k = 0; k < c10d__tcp_rails_count(s->rails); k++)
        n += c10d__tcp_transport_bytes_in_place(rails[k]);
    return n;
}

uint64_t c10d__tcp_ring_bytes(void *state)
{
    struct tcp_state *s = state;
    return s->t != NULL ? c10d__tcp_transport_ring_bytes(s->t) : 0;
}

/* The ranks the shared-memory decision found on this host (all, or the
 * host's for host-aware ops): large P2P messages to them are read in place
 * (docs/shm.md, "P2P"). */
static void mark_local_peers(struct tcp_state *s)
{
    struct c10d__tcp_transport *const *rails = c10d__tcp_rails_all(s->rails);
    for (int k = 0; k < c10d__tcp_rails_count(s->rails); k++) {
        c10d__tcp_transport_read_in_place(rails[k], c10d__env_bool(C10D_ENV_P2P_IN_PLACE));
        if (s->shm != NULL)
            for (int r = 0; r < s->size; r++)
                c10d__tcp_transport_set_local(rails[k], r);
        else if (s->hier.local != NULL) /* host-aware (or about to be) */
            for (int i = 0; i < s->hier.nlocal; i++)
                c10d__tcp_transport_set_local(rails[k], s->hier.local[i]);
    }
}

static void on_connected(void *arg, int status)
{
    struct tcp_state *s = arg;
    const char **notes = NULL;
    /* A peer failed the group while we still connected (it ran a collective
     * without us): its reason is ours, and a host segment it made may be
     * gone with it. */
    if (status == 0 && s->poisoned)
        status = c10d__fail(s->poison_status, "%s", s->poison_msg);
    if (status == 0 && s->shm_offered) {
        notes = calloc((size_t)s->size, sizeof *notes);
        if (notes == NULL)
            status = c10d__fail(C10D_ENOMEM, "tcp: out of memory");
        for (int r = 0; notes != NULL && r < s->size; r++)
            notes[r] = r == s->rank ? s->shm_note : c10d__tcp_transport_peer_note(s->t, r);
    }
    if (status == 0 && notes != NULL)
        status = choose_shm(s, notes);
    if (status == 0 && notes != NULL && s->shm == NULL && !s->shm_lost) {
        status = hier_setup(s, notes);
        if (status == 0 && !s->hier_on && s->rank == 0)
            C10D_INFO("shm", "group %s: tcp only (one rank per host, or C10D_SHM=0 on one)",
                      s->group_name);
    }
    free(notes);
    if (status >= 0)
        mark_local_peers(s);
    if (status == 1) {
        s->hier_pending = 1; /* hier_ref_received goes on (or group_fail) */
        return;
    }
    connect_finished(s, status);
}

int c10d__tcp_connect(void *state, const char *const *addrs, void (*done)(void *arg, int status),
                      void *arg)
{
    struct tcp_state *s = state;
    /* A peer that met us, ran its first op and failed it (its abort came to
     * our listener) before we got here: the group is gone for us too, and
     * its reason, not "the transport was closed", is what to report. */
    if (s->poisoned)
        return c10d__fail(s->poison_status, "%s", s->poison_msg);
    s->connect_done = done;
    s->connect_arg = arg;
    return c10d__tcp_rails_connect(s->rails, addrs, on_connected, s);
}

#define ADDR_KEY_FMT "tcp/addr/%d"

/* Connection setup through the store: each rank publishes "tcp/addr/<rank>"
 * and reads everyone's (the store's wait bounds it), then connects; while an
 * attempt to a peer fails, its key is read again (a store that outlived an
 * earlier job may have handed out that job's address before the peer
 * published its own). */
struct exchange {
    struct tcp_state *s;
    c10d_store *store;
    void (*done)(void *arg, int status);
    void *arg;
    int size;
    int64_t timeout_ms; /* the group's: the exchange's store ops end by it */
    char **keys;
    int refs; /* the setup's own, and one per re-read in flight */
};

static void exchange_free(struct exchange *x)
{
    if (x->keys != NULL)
        for (int r = 0; r < x->size; r++)
            free(x->keys[r]);
    free(x->keys);
    c10d_store_release(x->store);
    state_unref(x->s);
    free(x);
}

static void exchange_unref(struct exchange *x)
{
    if (--x->refs == 0)
        exchange_free(x);
}

/* A peer's address, read when the transport cannot reach the address it
 * has (a store that outlived an earlier job may have handed out that job's
 * address before the peer published its own) or, lazily, when it first
 * needs the peer. */
struct lookup {
    struct tcp_state *s;
    int rank;
};

static void on_lookup(c10d_work *w, int status, void *arg)
{
    (void)status;
    const c10d_store_result *res = c10d_store_work_result(w);
    struct lookup *lk = arg;
    struct tcp_state *s = lk->s;
    if (!s->destroyed && s->rails != NULL && res->status == 0) {
        char *published = strndup((const char *)res->data.data, res->data.len);
        if (published == NULL || c10d__tcp_rails_update_addr(s->rails, lk->rank, published) < 0)
            C10D_DEBUG("tcp", "rank %d: rank %d's address is unusable: %s", s->rank, lk->rank,
                       published != NULL ? c10d_last_error() : "out of memory");
        free(published);
    }
    free(lk);
    state_unref(s);
}

static void lookup_addr(void *arg, int rank)
{
    struct tcp_state *s = arg;
    struct lookup *lk = malloc(sizeof *lk);
    char key[32];
    if (s->destroyed || lk == NULL) {
        free(lk);
        return;
    }
    snprintf(key, sizeof key, ADDR_KEY_FMT, rank);
    lk->s = s;
    lk->rank = rank;
    s->refs++;
    c10d_store_request q = {
        .struct_size = sizeof q, .op = C10D_STORE_OP_GET, .key = key, .timeout_ms = s->timeout_ms};
    if (c10d__store_call(s->lookup_store, &q, on_lookup, lk) != 0) {
        s->refs--;
        free(lk);
    }
}

/* The setup is over: its own reference goes. */
static void exchange_finish(struct exchange *x, int status)
{
    if (x->s->rails != NULL && status != 0)
        c10d__tcp_rails_on_connect_failed(x->s->rails, NULL, NULL);
    x->done(x->arg, status);
    exchange_unref(x);
}

static void exchange_fail(struct exchange *x, int status, const char *what, const char *why)
{
    c10d__fail(status, "tcp: connection setup of group %s, rank %d: %s: %s", x->s->group_name,
               x->s->rank, what, why);
    exchange_finish(x, status);
}

static void on_exchange_connected(void *arg, int status)
{
    exchange_finish(arg, status);
}

static void on_addrs(c10d_work *w, int status, void *arg)
{
    (void)status;
    const c10d_store_result *res = c10d_store_work_result(w);
    struct exchange *x = arg;
    if (x->s->destroyed) {
        exchange_fail(x, C10D_EABORTED, "reading the peers' addresses", "the group was closed");
        return;
    }
    int lazy = c10d__tcp_transport_lazy(x->s->t);
    if (res->status < 0 || (!lazy && res->count != (size_t)x->size)) {
        exchange_fail(x, res->status < 0 ? res->status : C10D_EPROTO,
                      "reading the peers' addresses from the store",
                      res->status < 0 ? res->message : "wrong number of values");
        return;
    }
    char **addrs = calloc((size_t)x->size, sizeof *addrs);
    int ok = addrs != NULL;
    if (ok && lazy) /* rank 0's alone (its job id); the others on first use */
        ok = (addrs[0] = strndup((const char *)res->data.data, res->data.len)) != NULL;
    for (int r = 0; ok && !lazy && r < x->size; r++) {
        addrs[r] = strndup(res->items[r].data, res->items[r].len);
        ok = addrs[r] != NULL;
    }
    if (ok)
        c10d__tcp_rails_on_connect_failed(x->s->rails, lookup_addr, x->s);
    int rc = ok ? c10d__tcp_connect(x->s, (const char *const *)addrs, on_exchange_connected, x)
                : c10d__fail(C10D_ENOMEM, "tcp: out of memory");
    if (addrs != NULL)
        for (int r = 0; r < x->size; r++)
            free(addrs[r]);
    free(addrs);
    if (rc < 0)
        exchange_fail(x, rc, "connecting", c10d_last_error());
}

static void on_addr_published(c10d_work *w, int status, void *arg)
{
    (void)status;
    const c10d_store_result *res = c10d_store_work_result(w);
    struct exchange *x = arg;
    if (res->status < 0) {
        exchange_fail(x, res->status, "publishing this rank's address", res->message);
        return;
    }
    if (x->s->destroyed) {
        exchange_fail(x, C10D_EABORTED, "publishing this rank's address", "the group was closed");
        return;
    }
    c10d_store_request q = {.struct_size = sizeof q,
                            .op = C10D_STORE_OP_MULTI_GET,
                            .keys = (const char *const *)x->keys,
                            .nkeys = (size_t)x->size,
                            .timeout_ms = x->timeout_ms};
    if (c10d__tcp_transport_lazy(x->s->t)) {
        /* Lazy: O(1) store reads per rank here (rank 0's address carries the
         * job id every hello is checked against), one per peer later. */
        q.op = C10D_STORE_OP_GET;
        q.key = x->keys[0];
    }
    int rc = c10d__store_call(x->store, &q, on_addrs, x);
    if (rc < 0)
        exchange_fail(x, rc, "reading the peers' addresses", c10d_last_error());
}

static int tcp_create(const struct c10d__backend_config *cfg, void (*done)(void *arg, int status),
                      void *arg, void **state)
{
    *state = NULL;
    if (cfg->store == NULL)
        return c10d__fail(C10D_EINVAL, "tcp: connection setup needs a store");
    const char *address;
    void *st;
    C10D_CHECK(c10d__tcp_open(cfg, &st, &address));
    struct tcp_state *s = st;
    struct exchange *x = calloc(1, sizeof *x);
    if (x == NULL || (x->keys = calloc((size_t)cfg->size, sizeof *x->keys)) == NULL) {
        free(x);
        state_destroy(s);
        return c10d__fail(C10D_ENOMEM, "tcp: out of memory");
    }
    x->s = s;
    x->store = cfg->store;
    x->done = done;
    x->arg = arg;
    x->size = cfg->size;
    x->timeout_ms = cfg->timeout_ms;
    x->refs = 1;
    s->refs++;
    c10d_store_retain(cfg->store);
    s->lookup_store = cfg->store;
    c10d_store_retain(cfg->store);
    for (int r = 0; r < cfg->size; r++) {
        if (asprintf(&x->keys[r], ADDR_KEY_FMT, r) < 0) {
            x->keys[r] = NULL;
            exchange_free(x);
            state_destroy(s);
            return c10d__fail(C10D_ENOMEM, "tcp: out of memory");
        }
    }
    c10d_store_request q = {.struct_size = sizeof q,
                            .op = C10D_STORE_OP_SET,
                            .key = x->keys[cfg->rank],
                            .value = address,
                            .len = strlen(address)};
    int rc = c10d__store_call(cfg->store, &q, on_addr_published, x);
    if (rc < 0) {
        exchange_free(x);
        state_destroy(s);
        return rc;
    }
    *state = s;
    return 0;
}

/* s->shm is set before creation completes and stays until destroy. */
static const char *tcp_path(void *state)
{
    const struct tcp_state *s = state;
    return s->shm != NULL || s->shm_lost ? "shm" : s->hier_on ? "shm+tcp" : "tcp";
}

const struct c10d__backend_vtable c10d__tcp_backend = {
    .name = "tcp",
    .check = tcp_check,
    .create = tcp_create,
    .submit = tcp_submit,
    .abort = tcp_abort,
    .failure = tcp_failure,
    .failed_ranks = tcp_failed_ranks,
    .path = tcp_path,
    .unpark = tcp_unpark,
    .destroy = tcp_destroy,
    .published_key_fmt = ADDR_KEY_FMT,
};
