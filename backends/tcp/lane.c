/* The caller's lane (lane.h). Who touches what: the lane's holder alone
 * reads and writes `op` and `coll` (the submitter until it parks the op, then
 * the one thread that takes it from its work, then the loop); the work's
 * park decides that taker once. */
#include "lane.h"

#include "cpu_relax.h"

#include "backends/fingerprint.h"
#include "backends/shm/all_to_all.h"
#include "backends/shm/in_place.h"
#include "engine/env.h"
#include "engine/error.h"
#include "engine/loop.h"
#include "engine/work.h"

#include <sched.h>

#define LANE_HELD  0x80000000u
#define LANE_COUNT 0x7fffffffu

/* Before yielding between looks: a peer a few microseconds behind costs no
 * system call. Not where the host's ranks outnumber its CPUs: there the
 * peer this rank waits for may be waiting for this very CPU, and spinning
 * first made 4 ranks on 2 CPUs 4-6x slower (docs/engine.md). */
#define SPIN_BEFORE_YIELD_NS 20000u

/* The waiter polls its peers' `arrive` on every turn, their announcements
 * (a peer that runs another collective) on every this many. */
#define LOOK_EVERY 64u

/* Tests: ops completed by their waiting thread, ops handed to the loop. */
static atomic_uint_fast64_t ran_here, handed;

void c10d__tcp_lane_counts(uint64_t *here, uint64_t *to_loop)
{
    *here = atomic_load(&ran_here);
    *to_loop = atomic_load(&handed);
}

void c10d__tcp_lane_init(struct c10d__tcp_lane *l)
{
    atomic_init(&l->word, 0);
    atomic_init(&l->op, NULL);
    l->on = c10d__env_bool(C10D_ENV_SHM_LANE);
    l->spin_us = c10d__env_int(C10D_ENV_SHM_LANE_SPIN_US);
}

void c10d__tcp_lane_destroy(struct c10d__tcp_lane *l)
{
    c10d__work_drop(atomic_load(&l->parked));
}

/* The holder lets go of an op that will not reach the loop (posting closed):
 * it fails here. */
static void fail_here(struct c10d__tcp_lane *l, struct c10d__op *op)
{
    atomic_store(&l->op, NULL);
    atomic_fetch_and(&l->word, ~LANE_HELD);
    c10d__work_complete(op->work, C10D_EABORTED, "tcp %s seq %llu: the engine is shutting down",
                        c10d__op_kind_name(op->kind), (unsigned long long)op->seq);
    l->done(l->owner);
}

/* The holder hands the op, where it stands, to the loop. */
static void hand_to_loop(struct c10d__tcp_lane *l)
{
    struct c10d__op *op = atomic_load(&l->op);
    atomic_fetch_add_explicit(&handed, 1, memory_order_relaxed);
    if (l->to_loop(l->owner, op) != 0)
        fail_here(l, op);
}

static void ring_none(void *arg, int r)
{
    /* Every doorbell opened before the op took the lane; one that fails now
     * belongs to a rank whose loop is gone, and its group fails over tcp. */
    (void)arg;
    (void)r;
}

static int lane_run(void *arg, uint64_t deadline_ns)
{
    struct c10d__tcp_lane *l = arg;
    c10d_work *w = atomic_load_explicit(&l->op, memory_order_relaxed)->work; /* ours now */
    /* The clock is read from the first check on: most ops are done before
     * it, and a read per op was a few percent of one. */
    uint64_t start = 0, spin_end = 0;
    int crowded = l->seg->crowded;
    uint64_t spin_free = crowded ? 0 : SPIN_BEFORE_YIELD_NS;
    int rc;
    for (unsigned n = 1;; n++) {
        int moved;
        rc = c10d__shm_coll_progress(&l->coll, &moved);
        if (rc != 0)
            break;
        if (crowded || (n & 63) == 0) {
            uint64_t now = c10d__now_ns();
            if (start == 0) {
                start = now;
                spin_end = now + (uint64_t)(l->spin_us > 0 ? l->spin_us : 0) * 1000u;
            }
            /* A failure, the deadline, a shutdown that ended the work, or
             * the spin limit: the loop takes it from here. */
            if (now >= spin_end || (deadline_ns != 0 && now >= deadline_ns) ||
                atomic_load_explicit(l->failed, memory_order_acquire) != 0 || c10d_work_test(w))
                break;
            if (now - start >= spin_free)
                sched_yield();
        }
        cpu_relax();
    }
    if (rc != 1) {
        hand_to_loop(l); /* a mismatch fails the group there, as for any shm op */
        return 0;
    }
    /* The lane goes first (collectives the loop got meanwhile may start),
     * then the work (its callbacks may end the group), then the state. The
     * op's release is ordered by the lane word's change after it, which
     * whoever looks at the op reads first. */
    atomic_store_explicit(&l->op, NULL, memory_order_release);
    if (atomic_fetch_and(&l->word, ~LANE_HELD) & LANE_COUNT)
        l->kick(l->owner);
    /* A statistic for tests, not a locked add per op: two lanes counting at
     * once may lose a count, or put back an older one. */
    atomic_store_explicit(&ran_here, atomic_load_explicit(&ran_here, memory_order_relaxed) + 1,
                          memory_order_relaxed);
    c10d__work_complete_here(w);
    l->done(l->owner);
    return 1;
}

static void lane_adopt(void *arg)
{
    hand_to_loop(arg);
}

static const struct c10d__work_park lane_park = {lane_run, lane_adopt};

/* Two kinds of op need this rank after its slot is written: an all_to_all
 * whose own blocks fit one chunk (a larger block between two other ranks,
 * known only once every rank wrote its slot, takes more chunks), and an op
 * read in place (its peers read this rank's buffers until they release
 * them). Parked unfinished, either could keep its peers waiting for a rank
 * whose caller waits for something else first, so it stays in the lane
 * only once done here, waiting for its peers at most this long since they
 * last moved; else the loop goes on with it. Where the host's ranks
 * outnumber its CPUs the peers may need this very CPU to get there:
 * longer, yielding. */
#define FINISH_SPIN_NS         5000u
#define FINISH_WAIT_NS         50000u
#define FINISH_WAIT_CROWDED_NS 200000u

static int finish_here(struct c10d__tcp_lane *l, uint64_t bytes)
{
    struct c10d__shm_seg *seg = l->seg;
    int crowded = seg->crowded;
    /* Plus a peer's copy of what the op moves at 2 GB/s at least: a root
     * waits for its readers' copies without moving itself. */
    uint64_t wait = (crowded ? FINISH_WAIT_CROWDED_NS : FINISH_WAIT_NS) + bytes / 2;
    uint64_t start = c10d__now_ns(), yield_from = start + (crowded ? 0 : FINISH_SPIN_NS);
    uint64_t end = start + wait;
    for (unsigned n = 1;; n++) {
        int moved;
        int rc = c10d__shm_coll_progress(&l->coll, &moved);
        if (moved) {
            c10d__shm_wake_sleepers(seg, ring_none, NULL);
            /* A read in place copies inside the call: not a wait. */
            end = c10d__now_ns() + wait;
        }
        if (rc != 0)
            return rc;
        if (crowded || (n & 15) == 0) {
            uint64_t now = c10d__now_ns();
            if (now >= end || atomic_load_explicit(l->failed, memory_order_acquire) != 0)
                return 0;
            if (now >= yield_from)
                sched_yield();
        }
        cpu_relax();
    }
}

/* Whether the lane takes op: FITS_PARK one chunk, parked once its slot is
 * written; FITS_FINISH an all_to_all whose own blocks fit one, or a read in
 * place small enough (in_place.h; an all_to_all's from its first chunk,
 * all_to_all.h), run to its end here or handed over. A larger offer stays
 * on the loop. */
enum { FITS_NOT, FITS_PARK, FITS_FINISH };

/* The bytes op reads in place where it offers, else 0. */
static size_t offered_size(const struct c10d__op *op, const struct c10d__shm_seg *seg)
{
    return op->kind == C10D_OP_ALL_TO_ALL ? c10d__shm_a2a_empty_likely(op, seg)
                                          : c10d__shm_in_place_size(op, seg);
}

/* *offered: what offered_size says, looked at once per op. */
static int lane_fits(const struct c10d__op *op, const struct c10d__shm_seg *seg, size_t *offered)
{
    *offered = offered_size(op, seg);
    if (*offered == 0 || op->kind == C10D_OP_ALL_TO_ALL) {
        if (c10d__shm_coll_one_chunk(op, seg->slot_bytes, seg->nranks))
            return FITS_PARK;
        if (c10d__shm_coll_one_chunk_here(op, seg->slot_bytes, seg->nranks))
            return FITS_FINISH;
    }
    return *offered > 0 && *offered <= C10D_SHM_IN_PLACE_LANE_MAX &&
                   c10d__shm_coll_supports(op, seg->slot_bytes, seg->nranks)
               ? FITS_FINISH
               : FITS_NOT;
}

int c10d__tcp_lane_try(struct c10d__tcp_lane *l, struct c10d__op *op)
{
    struct c10d__shm_seg *seg = l->seg;
    int fits;
    size_t fitted;
    if (seg == NULL || !l->on || op->next != NULL || c10d__on_loop_thread() ||
        atomic_load_explicit(l->failed, memory_order_acquire) != 0 ||
        (fits = lane_fits(op, seg, &fitted)) == FITS_NOT)
        return 0;
    unsigned idle = 0;
    if (!atomic_compare_exchange_strong(&l->word, &idle, LANE_HELD))
        return 0;
    /* A rank whose loop sleeps is rung through its doorbell only: the tcp
     * ring belongs to the loop. */
    if (!l->bells && !(l->bells = c10d__shm_bells_all(seg))) {
        atomic_fetch_and(&l->word, ~LANE_HELD);
        return 0;
    }
    /* Release: whoever else reads it got the op through the work's park or
     * the loop's post, both made after this store. */
    atomic_store_explicit(&l->op, op, memory_order_release);
    struct c10d__fp fp;
    c10d__fp_of(op, seg->nranks, &fp);
    c10d__shm_announce(seg, op->seq, 0, &fp);
    c10d__shm_coll_start(&l->coll, seg, op, 0, &fp);
    /* Done here, or on the loop: an op that needs this rank after its slot,
     * also one that fitted as an offer when lane_fits looked but no longer
     * offers (another thread's op stopped offers since) and so runs
     * through the slots, maybe in several chunks. */
    int finish = fits == FITS_FINISH;
    uint64_t offered = l->coll.offering || op->kind == C10D_OP_ALL_TO_ALL ? fitted : 0;
    l->coll.look_every = LOOK_EVERY;
    c10d__shm_awake(seg);
    int moved;
    int rc = c10d__shm_coll_progress(&l->coll, &moved);
    if (moved)
        c10d__shm_wake_sleepers(seg, ring_none, NULL);
    if (rc == 0 && finish && c10d__shm_coll_arrived(&l->coll))
        rc = finish_here(l, offered);
    if (rc < 0 || !c10d__shm_coll_arrived(&l->coll) || (finish && rc == 0)) {
        /* Not written (a peer is behind) or refused: the loop runs it. */
        hand_to_loop(l);
        return 1;
    }
    /* Done or not, the work completes on the waiter's thread or the loop:
     * never here, under the group's mutex its callbacks take. */
    c10d_work_retain(op->work);
    /* NULL if an unpark borrows it: that one lets it go. */
    c10d_work *before = atomic_exchange(&l->parked, op->work);
    c10d__work_drop(before); /* it ran: nothing to unpark (the group's mutex is held) */
    if (c10d__work_park(op->work, &lane_park, l) != 0) { /* a callback awaits it on the loop */
        hand_to_loop(l);
        return 1;
    }
    /* The group failed meanwhile: its unpark may have found the op not
     * parked yet (it stores `failed` before it looks; all sequentially
     * consistent). */
    if (atomic_load(l->failed) != 0)
        c10d__work_unpark(op->work);
    return 1;
}

void c10d__tcp_lane_unpark(struct c10d__tcp_lane *l)
{
    /* Borrowed with the lane's reference, so the next op cannot drop it
     * meanwhile. */
    c10d_work *w = atomic_exchange(&l->parked, NULL);
    if (w == NULL)
        return; /* none yet, or borrowed by a concurrent unpark, which looks again */
    c10d__work_unpark(w);
    c10d_work_retain(w);
    c10d_work *none = NULL;
    if (!atomic_compare_exchange_strong(&l->parked, &none, w))
        c10d__work_drop(w); /* replaced meanwhile: the lane's reference goes */
    /* Again, once back: an unpark that found it borrowed returned at once,
     * and the op may have been parked since the look above. */
    c10d__work_unpark(w);
    c10d__work_drop(w);
}

void c10d__tcp_lane_loop_add(struct c10d__tcp_lane *l)
{
    if (atomic_load(&l->word) & LANE_HELD)
        c10d__tcp_lane_unpark(l); /* it goes first */
    atomic_fetch_add(&l->word, 1);
}

void c10d__tcp_lane_loop_done(struct c10d__tcp_lane *l)
{
    atomic_fetch_sub(&l->word, 1);
}

int c10d__tcp_lane_held(struct c10d__tcp_lane *l)
{
    return (atomic_load(&l->word) & LANE_HELD) != 0;
}

int c10d__tcp_lane_taken(struct c10d__tcp_lane *l, const struct c10d__op *op,
                         struct c10d__shm_coll *coll)
{
    if (atomic_load_explicit(&l->op, memory_order_relaxed) != op)
        return 0;
    *coll = l->coll;
    coll->look_every = 0; /* the loop may sleep between looks: every one counts */
    atomic_store(&l->op, NULL);
    atomic_fetch_add(&l->word, 1u - LANE_HELD); /* counted, and the lane free */
    return 1;
}
