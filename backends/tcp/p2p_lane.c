/* P2P in the caller's lane (p2p_lane.h). Who touches what: a receive's
 * record is in `posted` from its post until it is handed to the loop or its
 * message is copied out; the lane's mutex guards `posted`, `ops` and each
 * record's `handed` and `unparked`; the work's park decides once who
 * finishes the op (its waiter, or whoever hands it to the loop), and that
 * one frees the record. */
#include "p2p_lane.h"

#include "cpu_relax.h"

#include "engine/block_cache.h"
#include "engine/env.h"
#include "engine/error.h"
#include "engine/loop.h"
#include "engine/poller.h"
#include "engine/work.h"

#include <sched.h>
#include <stdlib.h>

/* A receive posted in a mailbox, waiting for its sender's fill. */
struct p2p_lane_recv {
    struct c10d__tcp_p2p_lane *l;
    struct c10d__op *op;
    c10d_work *work; /* a reference, until the record goes */
    struct c10d__shm_mailbox *mb;
    uint64_t gen;
    int peer;               /* the sender's rank in the segment */
    int handed;             /* (mutex) given to the loop: posted there as a receive */
    struct c10d__task task; /* copies the message out on the loop */
};

/* A send or receive the lane carried: done (filled, or a deposit taken at
 * the receive's call), or a send deposited and not matched yet. */
struct p2p_lane_op {
    struct c10d__tcp_p2p_lane *l;
    c10d_work *work; /* a reference, until the record goes */
    struct c10d__shm_mailbox *mb;
    uint64_t gen;
    int deposited;                   /* a send waiting for its receiver to match it */
    int polled;                      /* (mutex) on the loop's poller (op_adopt) */
    int unparked;                    /* (mutex) c10d__tcp_p2p_lane_unpark took it */
    struct p2p_lane_op *next, *prev; /* (mutex) on `ops` */
    struct c10d__task task;          /* completes the work on the loop */
    struct c10d__poll_queue polls;   /* the loop watches a deposit here */
    struct c10d__poll_item poll;
};

static atomic_uint_fast64_t sent_here, received_here;

void c10d__tcp_p2p_lane_counts(uint64_t *sends, uint64_t *recvs)
{
    *sends = atomic_load(&sent_here);
    *recvs = atomic_load(&received_here);
}

void c10d__tcp_p2p_lane_init(struct c10d__tcp_p2p_lane *l)
{
    atomic_init(&l->mutex.word, 0);
    atomic_init(&l->broken, 0);
    atomic_init(&l->loop_ops, 0);
    atomic_init(&l->owed, 0);
    /* A rank that writes its sockets (C10D_SHM_P2P=0) posts no receives
     * either: its peers may be set alike, and a post nobody fills only
     * costs a hand-over. */
    l->on = c10d__env_bool(C10D_ENV_SHM_LANE) && c10d__env_bool(C10D_ENV_SHM_P2P);
    l->spin_us = c10d__env_int(C10D_ENV_SHM_LANE_SPIN_US);
}

static void on_unexpected(void *arg, int r);

int c10d__tcp_p2p_lane_start(struct c10d__tcp_p2p_lane *l, struct c10d__shm_seg *seg,
                             struct c10d__tcp_transport *t, const int *members, int group_size)
{
    if (seg->mailboxes == NULL || !l->on)
        return 0;
    l->posted = calloc((size_t)seg->nranks, sizeof *l->posted);
    l->seg_of = malloc((size_t)group_size * sizeof *l->seg_of);
    l->group_of = malloc((size_t)seg->nranks * sizeof *l->group_of);
    if (l->posted == NULL || l->seg_of == NULL || l->group_of == NULL) {
        free(l->posted);
        free(l->seg_of);
        free(l->group_of);
        l->posted = NULL;
        l->seg_of = l->group_of = NULL;
        return c10d__fail(C10D_ENOMEM, "tcp: out of memory");
    }
    for (int g = 0; g < group_size; g++)
        l->seg_of[g] = -1;
    for (int r = 0; r < seg->nranks; r++) {
        l->group_of[r] = members != NULL ? members[r] : r;
        l->seg_of[l->group_of[r]] = r;
    }
    l->group_size = group_size;
    l->t = t;
    c10d__tcp_transport_on_p2p_unexpected(t, on_unexpected, l);
    for (int r = 0; r < seg->nranks; r++)
        if (r != seg->rank)
            c10d__tcp_transport_set_mailbox(t, members != NULL ? members[r] : r,
                                            c10d__shm_mailbox_of(seg, r, seg->rank));
    l->seg = seg;
    return 0;
}

void c10d__tcp_p2p_lane_destroy(struct c10d__tcp_p2p_lane *l)
{
    free(l->posted);
    free(l->seg_of);
    free(l->group_of);
}

/* Mutex held: an op that can reach no loop (posting closed) fails in
 * settle, outside the mutex its completion may take. */
static void fail_later(struct c10d__tcp_p2p_lane *l, struct c10d__op *op)
{
    op->task.next = l->failing;
    l->failing = &op->task;
    atomic_fetch_add(&l->owed, 1);
}

/* What the mutex held back: the ops that fail, and the owner's `done` for
 * each, once nothing here touches the lane any more (the last may free it). */
static void settle(struct c10d__tcp_p2p_lane *l)
{
    void (*done)(void *) = l->done;
    void *owner = l->owner;
    int n = atomic_exchange(&l->owed, 0);
    if (n == 0)
        return;
    c10d__lock_acquire(&l->mutex);
    struct c10d__task *failing = l->failing;
    l->failing = NULL;
    c10d__lock_release(&l->mutex);
    for (struct c10d__task *t = failing, *next; t != NULL; t = next) {
        next = t->next;
        struct c10d__op *op = (struct c10d__op *)((char *)t - offsetof(struct c10d__op, task));
        c10d__work_complete(op->work, C10D_EABORTED, "tcp %s seq %llu: the engine is shutting down",
                            c10d__op_kind_name(op->kind), (unsigned long long)op->seq);
    }
    for (; n > 0; n--)
        done(owner);
}

static inline int waiter_gives_up(struct c10d__tcp_p2p_lane *l, c10d_work *w, uint64_t now,
                                  uint64_t spin_end, uint64_t deadline_ns)
{
    return now >= spin_end || (deadline_ns != 0 && now >= deadline_ns) ||
           atomic_load_explicit(l->failed, memory_order_acquire) != 0 || c10d_work_test(w);
}

/* The waiter's poll: until done(arg) says 1 or it gives up (0). */
static int spin(struct c10d__tcp_p2p_lane *l, c10d_work *w, uint64_t deadline_ns,
                int (*done)(void *arg), void *arg)
{
    /* Unlike the collectives' lane (lane.c), the waiter yields from the
     * start: a message that took the tcp path needs this process's loop,
     * which may share the waiter's CPU (a rank bound to one core). Bound
     * to cores, 2 ranks, 4 B ping-pong: 1.3 against 2.5 us at the median,
     * and 54 against 95 us where every message took the tcp path. */
    int crowded = l->seg->crowded;
    uint64_t start = 0, spin_end = 0;
    for (unsigned n = 1;; n++) {
        if (done(arg))
            return 1;
        if (crowded || (n & 63) == 0) {
            uint64_t now = c10d__now_ns();
            if (start == 0) {
                start = now;
                spin_end = now + (uint64_t)(l->spin_us > 0 ? l->spin_us : 0) * 1000u;
            }
            if (waiter_gives_up(l, w, now, spin_end, deadline_ns))
                return done(arg);
            sched_yield();
        }
        cpu_relax();
    }
}

/* ------------------------------------------------------------ counting */

static void loop_op_done(c10d_work *w, int status, void *arg)
{
    struct c10d__tcp_p2p_lane *l = arg;
    (void)w;
    (void)status;
    atomic_fetch_sub(&l->loop_ops, 1);
    l->done(l->owner);
}

/* An op the loop runs: counted until its work completed, wherever that is;
 * the count holds the owner (a work may complete after its group ended). */
static void count_loop_op(struct c10d__tcp_p2p_lane *l, struct c10d__op *op)
{
    atomic_fetch_add(&l->loop_ops, 1);
    l->hold(l->owner);
    if (c10d__work_on_complete_anywhere(op->work, loop_op_done, l) != 0) {
        atomic_store(&l->broken, 1); /* never counted down: never sure again */
        atomic_fetch_add(&l->owed, 1);
    }
}

/* ------------------------------------------------- sends, taken receives */

static void op_finish(struct p2p_lane_op *o)
{
    struct c10d__tcp_p2p_lane *l = o->l;
    c10d__lock_acquire(&l->mutex);
    if (o->prev != NULL)
        o->prev->next = o->next;
    else
        l->ops = o->next;
    if (o->next != NULL)
        o->next->prev = o->prev;
    c10d__lock_release(&l->mutex);
    c10d_work_release(o->work);
    c10d__block_put(C10D__BLOCK_P2P_OP, o);
    l->done(l->owner);
}

static int op_sent(void *arg)
{
    struct p2p_lane_op *o = arg;
    return !o->deposited || c10d__shm_mb_sent(o->mb, o->gen);
}

static void op_adopt(void *arg);

static int op_run(void *arg, uint64_t deadline_ns)
{
    struct p2p_lane_op *o = arg;
    if (!op_sent(o)) { /* counted as waiting in the lane (send_when_collected) */
        _Atomic uint32_t *waits = &o->l->seg->ctl[o->l->seg->rank].lane_waits;
        atomic_fetch_add_explicit(waits, 1, memory_order_relaxed);
        int sent = spin(o->l, o->work, deadline_ns, op_sent, o);
        atomic_fetch_sub_explicit(waits, 1, memory_order_relaxed);
        if (!sent) {
            op_adopt(o);
            return 0;
        }
    }
    c10d__work_complete_here(o->work);
    op_finish(o);
    return 1;
}

static void op_task(struct c10d__task *t)
{
    struct p2p_lane_op *o = (struct p2p_lane_op *)((char *)t - offsetof(struct p2p_lane_op, task));
    c10d__work_complete(o->work, 0, NULL);
    op_finish(o);
}

/* The loop's watch over a deposit its sender's waiter left: matched, the
 * group failed, or the work ended otherwise (its deadline). */
static int poll_ready(struct c10d__poll_item *it)
{
    struct p2p_lane_op *o = (struct p2p_lane_op *)((char *)it - offsetof(struct p2p_lane_op, poll));
    return op_sent(o) || atomic_load(o->l->failed) != 0 || c10d_work_test(o->work);
}

static void poll_done(struct c10d__poll_item *it)
{
    struct p2p_lane_op *o = (struct p2p_lane_op *)((char *)it - offsetof(struct p2p_lane_op, poll));
    struct c10d__tcp_p2p_lane *l = o->l;
    if (op_sent(o)) {
        c10d__work_complete(o->work, 0, NULL);
    } else if (c10d_work_test(o->work)) {
        l->lost(l->owner, o->work, c10d_work_status(o->work));
    } else {
        char msg[512] = "";
        int status = l->failure(l->owner, msg, sizeof msg);
        c10d__work_complete(o->work, status != 0 ? status : C10D_EABORTED,
                            "tcp send: the group failed before its receiver took it: %s", msg);
    }
    op_finish(o);
}

/* A deposit the loop's poller does not watch (the group ended): delivered or
 * not, its send ends now. */
static void op_end_unwatched(struct p2p_lane_op *o)
{
    if (op_sent(o))
        c10d__work_complete(o->work, 0, NULL);
    else
        c10d__work_complete(o->work, C10D_EABORTED,
                            "tcp send: the group ended before its receiver took it");
    op_finish(o);
}

static void op_adopt(void *arg)
{
    struct p2p_lane_op *o = arg;
    if (o->deposited) {
        struct c10d__tcp_p2p_lane *l = o->l;
        o->poll.ready = poll_ready;
        o->poll.done = poll_done;
        /* Under the mutex: the group's end (c10d__tcp_p2p_lane_end) takes
         * what is on the poller off it, and after it nothing goes there. */
        c10d__lock_acquire(&l->mutex);
        int pushed = !l->ended && c10d__poll_push(&o->polls, &o->poll) == 0;
        o->polled = pushed;
        c10d__lock_release(&l->mutex);
        if (pushed)
            return;
        op_end_unwatched(o);
        return;
    }
    o->task.fn = op_task;
    if (c10d__engine_post(&o->task) != 0)
        op_task(&o->task); /* no loop any more: its message went all the same */
}

static const struct c10d__work_park op_park = {op_run, op_adopt};

/* Parks an op the lane carried (o filled in but for the list). */
static void op_park_it(struct c10d__tcp_p2p_lane *l, struct p2p_lane_op *o, c10d_work *w)
{
    o->l = l;
    o->work = w;
    c10d_work_retain(w);
    c10d__lock_acquire(&l->mutex);
    o->next = l->ops;
    if (l->ops != NULL)
        l->ops->prev = o;
    l->ops = o;
    c10d__lock_release(&l->mutex);
    /* Never completed here, under the group's mutex its callbacks take. */
    if (c10d__work_park(w, &op_park, o) != 0)
        op_adopt(o); /* a callback awaits it on the loop */
    else if (atomic_load(l->failed) != 0)
        c10d__work_unpark(w); /* the group's unpark may have come first */
}

static void wake_none(void *arg, int r)
{
    /* Every doorbell opened before the lane was used; one that fails now
     * belongs to a rank whose loop is gone, and the group fails over tcp. */
    (void)arg;
    (void)r;
}

/* A receiver that matched this sender's last message but has not copied it
 * out yet is most often a rank waiting for a CPU: where ranks outnumber the
 * CPUs, or where the scheduler put two ranks on one (2 ranks unbound on 2
 * CPUs: a third to half the runs spent 45 us per exchange, every batch
 * handed to the loop). Yielding lets it run, where a refusal sends the whole
 * batch to the loop, a hand-off that costs tens of microseconds. At most
 * this long. Where every rank may have a CPU, briefly, yielding only while
 * the receiver's caller waits in its lane (it copies the message out as
 * soon as it runs). A receiver waiting for nothing is most often between
 * submitting its batch and waiting for it: a look of COLLECT_GRACE_NS
 * without yielding (a yield hands a bound rank's CPU to its loop thread). */
#define COLLECT_WAIT_CROWDED_NS 200000u
#define COLLECT_WAIT_NS         20000u
#define COLLECT_GRACE_NS        5000u

static int collect_expected(const struct c10d__tcp_p2p_lane *l, int to)
{
    return l->seg->crowded ||
           atomic_load_explicit(&l->seg->ctl[to].lane_waits, memory_order_relaxed) != 0;
}

static int send_when_collected(struct c10d__tcp_p2p_lane *l, struct p2p_lane_op *o,
                               const struct c10d__op *op, size_t bytes, int to)
{
    int yield = collect_expected(l, to);
    uint64_t end = c10d__now_ns() + (l->seg->crowded ? COLLECT_WAIT_CROWDED_NS
                                     : yield         ? COLLECT_WAIT_NS
                                                     : COLLECT_GRACE_NS);
    int how = C10D_SHM_MB_REFUSED;
    while (how == C10D_SHM_MB_REFUSED && c10d__shm_mb_uncollected(o->mb) &&
           atomic_load_explicit(l->failed, memory_order_acquire) == 0 && c10d__now_ns() < end) {
        if (yield)
            sched_yield();
        else
            for (int i = 0; i < 32; i++)
                cpu_relax();
        how = c10d__shm_mb_send(o->mb, (uint64_t)op->tag, op->send, bytes, &o->gen);
    }
    return how;
}

static int try_send(struct c10d__tcp_p2p_lane *l, struct c10d__op *op, size_t bytes)
{
    if (!l->on)
        return 0;
    /* The records of a message come from the thread's block cache: calloc
     * and free of them were a tenth of a small batch's instructions. */
    struct p2p_lane_op *o = c10d__block_take_zeroed(C10D__BLOCK_P2P_OP, sizeof *o);
    if (o == NULL)
        return 0;
    int to = l->seg_of[op->peer];
    o->mb = c10d__shm_mailbox_of(l->seg, l->seg->rank, to);
    int how = c10d__shm_mb_send(o->mb, (uint64_t)op->tag, op->send, bytes, &o->gen);
    if (how == C10D_SHM_MB_REFUSED)
        how = send_when_collected(l, o, op, bytes, to);
    if (how == C10D_SHM_MB_REFUSED) {
        c10d__block_put(C10D__BLOCK_P2P_OP, o);
        return 0;
    }
    if (how == C10D_SHM_MB_DEPOSITED) {
        /* Its receiver's loop may sleep with a receive that takes it. */
        o->deposited = 1;
        if (c10d__shm_mb_loop_to_wake(o->mb))
            c10d__shm_wake(l->seg, to, wake_none, NULL);
    }
    atomic_fetch_add_explicit(&sent_here, 1, memory_order_relaxed);
    op_park_it(l, o, op->work);
    return 1;
}

/* ------------------------------------------------------ posted receives */

static void recv_free(struct p2p_lane_recv *rec)
{
    c10d_work_release(rec->work);
    c10d__block_put(C10D__BLOCK_P2P_RECV, rec);
}

/* Mutex held: rec's receive goes to the loop, as if just submitted. */
static void hand(struct p2p_lane_recv *rec)
{
    struct c10d__tcp_p2p_lane *l = rec->l;
    rec->handed = 1;
    l->posted[rec->peer] = NULL;
    count_loop_op(l, rec->op);
    if (l->to_loop(l->owner, rec->op) != 0)
        fail_later(l, rec->op);
}

/* The sender filled rec's post: out into the receive's buffer; then (only
 * then) the caller may post to this mailbox again. */
static void collect(struct p2p_lane_recv *rec)
{
    struct c10d__tcp_p2p_lane *l = rec->l;
    c10d__shm_mb_collect(rec->mb, rec->gen, rec->op->recv);
    c10d__lock_acquire(&l->mutex);
    l->posted[rec->peer] = NULL;
    c10d__lock_release(&l->mutex);
    atomic_fetch_add_explicit(&received_here, 1, memory_order_relaxed);
}

static void collect_task(struct c10d__task *t)
{
    struct p2p_lane_recv *rec =
        (struct p2p_lane_recv *)((char *)t - offsetof(struct p2p_lane_recv, task));
    struct c10d__tcp_p2p_lane *l = rec->l;
    collect(rec);
    c10d__work_complete(rec->work, 0, NULL);
    recv_free(rec);
    l->done(l->owner);
}

/* Mutex held, rec posted and not handed: the loop takes it from here,
 * filled (it collects it) or not (a receive there). 1 if rec is no longer
 * needed here, 0 if the loop's task frees it. */
static int to_loop_locked(struct p2p_lane_recv *rec)
{
    struct c10d__tcp_p2p_lane *l = rec->l;
    if (c10d__shm_mb_withdraw(rec->mb, rec->gen)) {
        hand(rec);
        return 1;
    }
    rec->task.fn = collect_task;
    if (c10d__engine_post(&rec->task) == 0)
        return 0;
    rec->handed = 1; /* no loop any more: nobody collects it */
    l->posted[rec->peer] = NULL;
    fail_later(l, rec->op);
    return 1;
}

static int recv_filled(void *arg)
{
    struct p2p_lane_recv *rec = arg;
    return c10d__shm_mb_state(rec->mb, rec->gen) != C10D_SHM_MB_POSTED;
}

/* The waiter: polls the mailbox until the sender filled it (completed
 * here: 1) or it gives up (handed to the loop: 0), as lane.c's waiter. */
static int recv_run(void *arg, uint64_t deadline_ns)
{
    struct p2p_lane_recv *rec = arg;
    struct c10d__tcp_p2p_lane *l = rec->l;
    void (*done)(void *) = l->done;
    void *owner = l->owner;
    /* Held until this call let go of the lane: the loop may take the post
     * back meanwhile (a tcp message of its sender came first), complete the
     * receive and end the group while this thread still looks here. */
    l->hold(owner);
    /* Counted as waiting until the message is copied out, not only while
     * polling, so that a sender whose next message finds this one still
     * here waits for the copy (send_when_collected) rather than hand its
     * batch to the loop (at 8 KiB, half the receives had gone there). */
    _Atomic uint32_t *waits = &l->seg->ctl[l->seg->rank].lane_waits;
    atomic_fetch_add_explicit(waits, 1, memory_order_relaxed);
    spin(l, rec->work, deadline_ns, recv_filled, rec);
    if (c10d__shm_mb_state(rec->mb, rec->gen) != C10D_SHM_MB_DATA) {
        /* Taken back by someone who handed it to the loop, or given up. */
        c10d__lock_acquire(&l->mutex);
        int gone = rec->handed || c10d__shm_mb_withdraw(rec->mb, rec->gen);
        if (gone && !rec->handed)
            hand(rec);
        c10d__lock_release(&l->mutex);
        if (gone) {
            atomic_fetch_sub_explicit(waits, 1, memory_order_relaxed);
            recv_free(rec);
            settle(l);
            done(owner);
            return 0;
        }
    }
    collect(rec);
    atomic_fetch_sub_explicit(waits, 1, memory_order_relaxed);
    c10d__work_complete_here(rec->work);
    recv_free(rec);
    done(owner); /* the receive's */
    done(owner); /* this call's */
    return 1;
}

static void recv_adopt(void *arg)
{
    struct p2p_lane_recv *rec = arg;
    struct c10d__tcp_p2p_lane *l = rec->l;
    /* Any thread: once the op is the loop's, its counts may go there and the
     * group may end; this call holds the owner until it let go of the lane. */
    l->hold(l->owner);
    c10d__lock_acquire(&l->mutex);
    int gone = rec->handed || to_loop_locked(rec);
    c10d__lock_release(&l->mutex);
    if (gone)
        recv_free(rec);
    atomic_fetch_add(&l->owed, 1);
    settle(l);
}

static const struct c10d__work_park recv_park = {recv_run, recv_adopt};

/* Mutex held: takes every posted receive back (one already filled stays),
 * handing each to the loop; their works go to out[], to unpark once the
 * mutex is let go. */
static int take_back_all(struct c10d__tcp_p2p_lane *l, c10d_work **out)
{
    int n = 0;
    for (int r = 0; r < l->seg->nranks; r++) {
        struct p2p_lane_recv *rec = l->posted[r];
        if (rec != NULL && c10d__shm_mb_withdraw(rec->mb, rec->gen)) {
            hand(rec);
            c10d_work_retain(rec->work);
            out[n++] = rec->work;
        }
    }
    return n;
}

static void unpark_all(c10d_work **works, int n)
{
    for (int i = 0; i < n; i++) {
        c10d__work_unpark(works[i]); /* its record goes with the adopt */
        c10d_work_release(works[i]);
    }
}

/* The loop: a P2P message from rank r waits unmatched. A receive posted for
 * r in the mailbox was posted after it was sent: it takes it on the loop. */
static void on_unexpected(void *arg, int r)
{
    struct c10d__tcp_p2p_lane *l = arg;
    if (r < 0 || r >= l->group_size || l->seg_of[r] < 0)
        return;
    c10d_work *w = NULL;
    c10d__lock_acquire(&l->mutex);
    struct p2p_lane_recv *rec = l->posted[l->seg_of[r]];
    if (rec != NULL && c10d__shm_mb_withdraw(rec->mb, rec->gen)) {
        hand(rec);
        c10d_work_retain(w = rec->work);
    }
    c10d__lock_release(&l->mutex);
    if (w != NULL)
        unpark_all(&w, 1);
    settle(l);
}

static int try_recv(struct c10d__tcp_p2p_lane *l, struct c10d__op *op, size_t bytes)
{
    int from = l->seg_of[op->peer];
    struct c10d__shm_mailbox *mb = c10d__shm_mailbox_of(l->seg, from, l->seg->rank);
    struct p2p_lane_recv *rec = c10d__block_take_zeroed(C10D__BLOCK_P2P_RECV, sizeof *rec);
    struct p2p_lane_op *o = c10d__block_take_zeroed(C10D__BLOCK_P2P_OP, sizeof *o);
    if (rec == NULL || o == NULL) {
        c10d__block_put(C10D__BLOCK_P2P_RECV, rec);
        c10d__block_put(C10D__BLOCK_P2P_OP, o);
        return 0;
    }
    c10d__lock_acquire(&l->mutex);
    /* Again under the mutex: another thread's waiter may have handed an
     * earlier receive to the loop meanwhile (this one must not overtake it). */
    if (atomic_load(&l->loop_ops) != 0 || l->posted[from] != NULL) {
        c10d__lock_release(&l->mutex);
        c10d__block_put(C10D__BLOCK_P2P_RECV, rec);
        c10d__block_put(C10D__BLOCK_P2P_OP, o);
        return 0;
    }
    size_t got;
    uint64_t gen;
    int how = c10d__shm_mb_recv(mb, (uint64_t)op->tag, bytes, op->recv, &got, &gen);
    if (how != 0) {
        c10d__lock_release(&l->mutex);
        c10d__block_put(C10D__BLOCK_P2P_RECV, rec);
        if (how < 0) { /* the loop matches what is there first */
            c10d__block_put(C10D__BLOCK_P2P_OP, o);
            return 0;
        }
        atomic_fetch_add_explicit(&received_here, 1, memory_order_relaxed);
        op_park_it(l, o, op->work);
        return 1;
    }
    c10d__block_put(C10D__BLOCK_P2P_OP, o);
    rec->l = l;
    rec->op = op;
    rec->work = op->work;
    c10d_work_retain(rec->work);
    rec->peer = from;
    rec->mb = mb;
    rec->gen = gen;
    l->posted[from] = rec;
    /* After the post (sequentially consistent): a message that reached the
     * loop before it is seen here; one after it finds the post there. */
    if (c10d__tcp_transport_p2p_waiting(l->t, op->peer) != 0 && c10d__shm_mb_withdraw(mb, gen)) {
        l->posted[from] = NULL; /* the caller posts it to the loop */
        c10d__lock_release(&l->mutex);
        recv_free(rec);
        return 0;
    }
    int free_now = 0;
    if (c10d__work_park(op->work, &recv_park, rec) != 0) /* a callback awaits it on the loop */
        free_now = to_loop_locked(rec);
    c10d__lock_release(&l->mutex);
    if (free_now)
        recv_free(rec);
    else if (atomic_load(l->failed) != 0)
        c10d__work_unpark(op->work); /* the group's unpark may have come first */
    settle(l);
    return 1;
}

/* A receive from any source takes a message one of the segment's ranks
 * deposited (the first in rank order), and only while no P2P message from
 * any rank of the group (another host's too) waits unmatched on the loop,
 * which matches in arrival order; otherwise it takes the loop. It never
 * posts: two senders could fill two posts at once. */
static int try_recv_any(struct c10d__tcp_p2p_lane *l, struct c10d__op *op, size_t bytes)
{
    struct p2p_lane_op *o = c10d__block_take_zeroed(C10D__BLOCK_P2P_OP, sizeof *o);
    if (o == NULL)
        return 0;
    int from = -1, me = l->seg->rank;
    size_t got;
    c10d__lock_acquire(&l->mutex);
    int clear = atomic_load(&l->loop_ops) == 0;
    for (int g = 0; clear && g < l->group_size; g++)
        clear = g == l->group_of[me] || c10d__tcp_transport_p2p_waiting(l->t, g) == 0;
    for (int r = 0; clear && from < 0 && r < l->seg->nranks; r++) {
        if (r == me || l->posted[r] != NULL) /* that mailbox is its post's */
            continue;
        int how = c10d__shm_mb_take(c10d__shm_mailbox_of(l->seg, r, me), (uint64_t)op->tag, bytes,
                                    op->recv, &got);
        if (how < 0) /* too long, or the loop has it: the loop matches it */
            break;
        if (how > 0)
            from = r;
    }
    c10d__lock_release(&l->mutex);
    if (from < 0) {
        c10d__block_put(C10D__BLOCK_P2P_OP, o);
        return 0;
    }
    c10d__work_set_source_rank(op->work, l->group_of[from]);
    atomic_fetch_add_explicit(&received_here, 1, memory_order_relaxed);
    op_park_it(l, o, op->work);
    return 1;
}

/* ------------------------------------------------------------- entries */

int c10d__tcp_p2p_lane_open(struct c10d__tcp_p2p_lane *l)
{
    if (l->seg == NULL || c10d__on_loop_thread() || atomic_load(&l->broken) != 0 ||
        atomic_load_explicit(l->failed, memory_order_acquire) != 0 ||
        atomic_load(&l->loop_ops) != 0)
        return 0;
    /* Doorbells only: the tcp wake-up belongs to the loop. */
    return l->bells || (l->bells = c10d__shm_bells_all(l->seg));
}

int c10d__tcp_p2p_lane_fits(const struct c10d__tcp_p2p_lane *l, const struct c10d__op *op)
{
    if (op->kind == C10D_OP_RECV && op->peer == C10D_ANY_SOURCE)
        return op->count * c10d_dtype_size(op->dtype) <= C10D_SHM_MAILBOX_BYTES;
    return (op->kind == C10D_OP_SEND || op->kind == C10D_OP_RECV) && op->peer >= 0 &&
           op->peer < l->group_size && l->seg_of[op->peer] >= 0 &&
           l->seg_of[op->peer] != l->seg->rank &&
           op->count * c10d_dtype_size(op->dtype) <= C10D_SHM_MAILBOX_BYTES;
}

int c10d__tcp_p2p_lane_try_one(struct c10d__tcp_p2p_lane *l, struct c10d__op *op)
{
    size_t bytes = op->count * c10d_dtype_size(op->dtype);
    if (op->kind == C10D_OP_SEND)
        return try_send(l, op, bytes);
    return op->peer == C10D_ANY_SOURCE ? try_recv_any(l, op, bytes) : try_recv(l, op, bytes);
}

int c10d__tcp_p2p_lane_try(struct c10d__tcp_p2p_lane *l, struct c10d__op *op)
{
    return op->next == NULL && c10d__tcp_p2p_lane_open(l) && c10d__tcp_p2p_lane_fits(l, op) &&
           c10d__tcp_p2p_lane_try_one(l, op);
}

int c10d__tcp_p2p_lane_post(struct c10d__tcp_p2p_lane *l, struct c10d__op *op)
{
    if (l->seg == NULL)
        return l->to_loop(l->owner, op);
    int recvs = 0;
    for (const struct c10d__op *m = op; m != NULL; m = m->next)
        recvs |= m->kind == C10D_OP_RECV;
    c10d_work *works[C10D_SHM_RING_MAX_RANKS];
    int n = 0;
    c10d__lock_acquire(&l->mutex);
    if (recvs) /* posted receives go first: they were called first */
        n = take_back_all(l, works);
    count_loop_op(l, op); /* a refused post fails the work: counted down then */
    int rc = l->to_loop(l->owner, op);
    c10d__lock_release(&l->mutex);
    unpark_all(works, n);
    settle(l);
    return rc;
}

void c10d__tcp_p2p_lane_unpark(struct c10d__tcp_p2p_lane *l)
{
    if (l->seg == NULL)
        return;
    c10d_work *works[C10D_SHM_RING_MAX_RANKS];
    c10d__lock_acquire(&l->mutex);
    int n = take_back_all(l, works);
    /* Receives filled already go too: nobody may wait for them. */
    for (int r = 0; r < l->seg->nranks; r++)
        if (l->posted[r] != NULL && n < C10D_SHM_RING_MAX_RANKS) {
            c10d_work_retain(l->posted[r]->work);
            works[n++] = l->posted[r]->work;
        }
    c10d__lock_release(&l->mutex);
    unpark_all(works, n);
    for (;;) {
        c10d__lock_acquire(&l->mutex);
        c10d_work *w = NULL;
        for (struct p2p_lane_op *o = l->ops; o != NULL && w == NULL; o = o->next)
            if (!o->unparked) {
                o->unparked = 1;
                c10d_work_retain(w = o->work);
            }
        c10d__lock_release(&l->mutex);
        if (w == NULL)
            break;
        c10d__work_unpark(w);
        c10d_work_release(w);
    }
    settle(l);
}

void c10d__tcp_p2p_lane_end(struct c10d__tcp_p2p_lane *l)
{
    c10d__tcp_p2p_lane_unpark(l);
    if (l->seg == NULL)
        return;
    /* Deposits the loop's poller watches: a poller already stopped (the
     * engine ends) would never finish them. */
    for (;;) {
        struct p2p_lane_op *o = NULL;
        c10d__lock_acquire(&l->mutex);
        l->ended = 1;
        for (struct p2p_lane_op *x = l->ops; x != NULL && o == NULL; x = x->next)
            if (x->polled && c10d__poll_cancel(&x->polls) != NULL)
                o = x;
            else
                x->polled = 0; /* its poll_done finishes it, or did */
        c10d__lock_release(&l->mutex);
        if (o == NULL)
            break;
        op_end_unwatched(o);
    }
}
