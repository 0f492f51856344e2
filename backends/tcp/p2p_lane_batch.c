/* A batch of P2P ops in the caller's lane (p2p_lane.h). Each member the lane
 * takes runs exactly as a single op would, under a work of its own (a
 * part, with the batch's name and deadline); the first member it does not
 * take and the rest go to the loop as one batch, under one more part. The
 * batch's own work is parked: its waiter waits for the parts in turn (each
 * one's own waiter, so a receive collects its message on this thread), and
 * anything else that awaits it hands every part to the loop. It completes
 * once every part did, with the first failure; completed otherwise (its
 * deadline on the loop, the caller), it fails the parts still running, as a
 * single op's work completed outside the backend fails the group.
 *
 * The parts run on copies of the members, which live as long as the last
 * part's work (its payload): the caller's records may go as soon as the
 * batch's work completed, while a part's callbacks may still read its op.
 *
 * Matching order holds because the members are taken in the batch's order,
 * as single ops called one after the other would be: what goes to the loop
 * after the lane is the order single ops already keep (the receiver's loop
 * matches a deposit before a later frame of its sender, and a receive posted
 * to the loop takes the mailbox's posts back first). */
#include "p2p_lane.h"

#include "engine/block_cache.h"
#include "engine/error.h"
#include "engine/loop.h"
#include "engine/tls.h"
#include "engine/work.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

/* Batches of up to this many parts, and copies of up to this many members,
 * come from the threads' block caches: a send and a receive, the common
 * exchange, made no malloc/free pair of each (about 600 instructions). */
#define BATCH_BLOCK_PARTS 8
#define COPIES_BLOCK_OPS  4

/* The members' copies, one reference per part made. */
struct batch_ops {
    atomic_int refs;
    int cached; /* a block (C10D__BLOCK_P2P_COPIES) */
    struct c10d__op ops[];
};

struct p2p_lane_batch {
    c10d_work *work; /* the batch's (a reference) */
    /* Parts not completed, plus one while the batch is set up: whoever takes
     * it to 0 completes the batch's work. */
    atomic_int left;
    /* One for that completion, one for the park (its waiter, or its adopt,
     * which also comes when the work completes still parked), one for the
     * batch's work's callback. */
    atomic_int refs;
    atomic_int completed;
    atomic_int status;  /* the first part that failed: its status, */
    char msg[512];      /* and its message, written by whoever set status */
    int abandoned;      /* set up failed: the caller posts the batch itself */
    int cached;         /* a block (C10D__BLOCK_P2P_BATCH) */
    atomic_int nparts;  /* parts in use (0 until set up) */
    c10d_work *parts[]; /* references */
};

/* The batch whose waiter runs on this thread (batch_run). */
static _Thread_local C10D__TLS_HOT struct p2p_lane_batch *running_here;

static const char ops_kind = 0; /* the parts' payload */

static void ops_unref(void *arg)
{
    struct batch_ops *o = arg;
    if (atomic_fetch_sub(&o->refs, 1) == 1)
        c10d__block_give(C10D__BLOCK_P2P_COPIES, o, o->cached);
}

static void batch_unref(struct p2p_lane_batch *b)
{
    if (atomic_fetch_sub(&b->refs, 1) != 1)
        return;
    for (int i = 0; i < b->nparts; i++)
        c10d_work_release(b->parts[i]);
    c10d_work_release(b->work);
    c10d__block_give(C10D__BLOCK_P2P_BATCH, b, b->cached);
}

static void batch_finish(struct p2p_lane_batch *b)
{
    int status = atomic_load(&b->status);
    atomic_store(&b->completed, 1);
    if (b->abandoned)
        ;
    else if (status != 0)
        c10d__work_complete(b->work, status, "%s", b->msg);
    else if (running_here == b) /* its waiter, inside its wait for the last part */
        c10d__work_complete_here(b->work);
    else
        c10d__work_complete(b->work, 0, NULL);
    batch_unref(b);
}

static void let_go(struct p2p_lane_batch *b)
{
    if (atomic_fetch_sub(&b->left, 1) == 1)
        batch_finish(b);
}

/* Anywhere: a part completed. */
static void part_done(c10d_work *w, int status, void *arg)
{
    struct p2p_lane_batch *b = arg;
    int none = 0;
    if (status != 0 && atomic_compare_exchange_strong(&b->status, &none, status))
        snprintf(b->msg, sizeof b->msg, "%s", c10d_work_message(w));
    let_go(b);
}

/* Anywhere: the batch's work completed. Not by its last part: the parts
 * still running fail (the tcp path then fails the group, and no byte lands
 * in a buffer the caller got back). */
static void whole_done(c10d_work *w, int status, void *arg)
{
    struct p2p_lane_batch *b = arg;
    const char *why = c10d_work_message(w);
    if (!atomic_load(&b->completed))
        for (int i = 0; i < b->nparts; i++)
            c10d__work_complete(b->parts[i], status < 0 ? status : C10D_EABORTED,
                                "tcp batch: its work was completed outside the backend (%s)%s%s",
                                c10d_status_name(status), *why != '\0' ? ": " : "", why);
    batch_unref(b);
}

/* How long the waiter waits for a part before it looks at the batch's own
 * work again (completed by another thread meanwhile: it stops). */
#define LOOK_MS 20

static int batch_run(void *arg, uint64_t deadline_ns)
{
    struct p2p_lane_batch *b = arg;
    running_here = b;
    int i = 0;
    for (; i < b->nparts; i++) {
        /* The coarse clock for the look (its tick is well under LOOK_MS):
         * two precise reads per part were a tenth of a small batch's time. */
        uint64_t look = c10d__now_coarse_ns() + LOOK_MS * 1000000u;
        for (;;) {
            uint64_t until = deadline_ns != 0 && deadline_ns < look ? deadline_ns : look;
            (void)c10d__work_wait_until(b->parts[i], until);
            if (c10d_work_test(b->parts[i]))
                break;
            /* The deadline, or the work completed by someone else. */
            uint64_t now = c10d__now_ns();
            if ((deadline_ns != 0 && now >= deadline_ns) || c10d_work_test(b->work))
                goto out;
            look = now + LOOK_MS * 1000000u;
        }
    }
out:
    running_here = NULL;
    int done = atomic_load(&b->completed);
    if (!done) /* the loop finishes them, and the batch */
        for (; i < b->nparts; i++)
            c10d__work_unpark(b->parts[i]);
    batch_unref(b);
    return done;
}

static void batch_adopt(void *arg)
{
    struct p2p_lane_batch *b = arg;
    for (int i = 0; i < b->nparts; i++)
        c10d__work_unpark(b->parts[i]);
    batch_unref(b);
}

static const struct c10d__work_park batch_park = {batch_run, batch_adopt};

/* A part that is not needed after all: it completes at once (its part_done
 * counts it) and goes. */
static void part_drop(c10d_work *w)
{
    c10d__work_complete(w, 0, NULL);
    c10d_work_release(w);
}

/* Every part before anything moves, so nothing can fail half-way: 1, or 0
 * with the batch given up (the caller posts it as it came). */
static int make_parts(struct p2p_lane_batch *b, struct batch_ops *copies, int n,
                      const struct c10d__op *head)
{
    int made = 0;
    const struct c10d__work_hooks counted = {part_done, NULL, b};
    while (made < n) {
        c10d_work *w;
        if (c10d__work_create_like(&w, b->work, head->timeout_ms, &counted) != 0)
            break;
        atomic_fetch_add(&copies->refs, 1);
        c10d__work_set_payload(w, &ops_kind, copies, ops_unref);
        b->parts[made++] = w;
    }
    int watched = made == n && c10d__work_on_complete_anywhere(b->work, whole_done, b) == 0;
    if (watched)
        return 1;
    b->abandoned = 1;
    for (int i = 0; i < made; i++)
        part_drop(b->parts[i]);
    for (int i = made; i <= n; i++) /* the parts never made, and the setup */
        let_go(b);
    batch_unref(b); /* never parked */
    batch_unref(b); /* never watched */
    return 0;
}

int c10d__tcp_p2p_lane_try_batch(struct c10d__tcp_p2p_lane *l, struct c10d__op *head)
{
    if (!c10d__tcp_p2p_lane_open(l) || !c10d__tcp_p2p_lane_fits(l, head))
        return 0;
    int n = 0;
    for (const struct c10d__op *op = head; op != NULL; op = op->next)
        n++;
    /* A mailbox per peer each way: more members than that cannot all take
     * the lane, so the last part carries whatever is left of a long batch
     * (no work made per member that would only be dropped). */
    int nmake = n < 2 * l->seg->nranks + 1 ? n : 2 * l->seg->nranks + 1;
    int b_cached, ops_cached;
    /* Every field is set below: msg is read only once status says it was
     * written, a part only once nparts covers it. */
    struct p2p_lane_batch *b = c10d__block_take_fit(
        C10D__BLOCK_P2P_BATCH, sizeof *b + BATCH_BLOCK_PARTS * sizeof *b->parts,
        sizeof *b + (size_t)nmake * sizeof *b->parts, &b_cached);
    struct batch_ops *copies = c10d__block_take_fit(
        C10D__BLOCK_P2P_COPIES, sizeof *copies + COPIES_BLOCK_OPS * sizeof *copies->ops,
        sizeof *copies + (size_t)n * sizeof *copies->ops, &ops_cached);
    if (b == NULL || copies == NULL) {
        c10d__block_give(C10D__BLOCK_P2P_BATCH, b, b_cached);
        c10d__block_give(C10D__BLOCK_P2P_COPIES, copies, ops_cached);
        return 0;
    }
    b->cached = b_cached;
    copies->cached = ops_cached;
    b->abandoned = 0;
    b->msg[0] = '\0';
    atomic_init(&copies->refs, 1); /* this call's, until the parts hold it */
    int k = 0;
    for (const struct c10d__op *m = head; m != NULL; m = m->next, k++) {
        copies->ops[k] = *m;
        copies->ops[k].next = m->next != NULL ? &copies->ops[k + 1] : NULL;
        /* Any member may go to the loop on its own (a posted receive taken
         * back), as the head would. */
        copies->ops[k].task.fn = head->task.fn;
        copies->ops[k].state = head->state;
    }
    c10d_work *whole = head->work;
    c10d_work_retain(b->work = whole);
    atomic_init(&b->left, nmake + 1);
    atomic_init(&b->refs, 3);
    atomic_init(&b->nparts, 0);
    atomic_init(&b->completed, 0);
    atomic_init(&b->status, 0);
    if (!make_parts(b, copies, nmake, head)) {
        ops_unref(copies);
        return 0;
    }
    int i = 0;
    struct c10d__op *op = &copies->ops[0], *rest = NULL;
    while (op != NULL) {
        struct c10d__op *next = op->next;
        if (i > 0 && (!c10d__tcp_p2p_lane_open(l) || !c10d__tcp_p2p_lane_fits(l, op) ||
                      (i == nmake - 1 && next != NULL))) {
            rest = op;
            break;
        }
        op->work = b->parts[i];
        op->next = NULL;
        if (!c10d__tcp_p2p_lane_try_one(l, op)) {
            op->next = next;
            rest = op;
            break;
        }
        if (next != NULL)
            l->hold(l->owner); /* the next part's, in the lane or on the loop */
        i++;
        op = next;
    }
    if (i == 0) { /* nothing moved: the caller posts the batch as it came */
        b->abandoned = 1;
        for (int j = 0; j < nmake; j++)
            part_drop(b->parts[j]);
        let_go(b);
        batch_unref(b); /* never parked; the watch ends with the work */
        ops_unref(copies);
        return 0;
    }
    int used = i + (rest != NULL);
    atomic_store(&b->nparts, used);
    for (int j = used; j < nmake; j++)
        part_drop(b->parts[j]);
    if (rest != NULL) {
        c10d_work *w = b->parts[i];
        for (struct c10d__op *m = rest; m != NULL; m = m->next)
            m->work = w;
        if (c10d__tcp_p2p_lane_post(l, rest) != 0) {
            c10d__work_complete(w, C10D_EABORTED, "tcp %s seq %llu: the engine is shutting down",
                                c10d__op_kind_name(rest->kind), (unsigned long long)rest->seq);
            l->done(l->owner);
        }
        c10d__work_arm(w); /* on the loop: its deadline counts from the batch's creation */
    }
    if (c10d__work_park(whole, &batch_park, b) != 0)
        batch_adopt(b); /* a callback awaits it on the loop */
    let_go(b);          /* parked first: a completion finds it there */
    ops_unref(copies);  /* the parts hold them from here on */
    return 1;
}
