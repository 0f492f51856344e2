/* torch's monitored_barrier on the host path (docs/semantics.md, 5): rank 0
 * receives a token from every other rank, then releases each; the others
 * send, then wait for the release. All of it runs on the loop as internal
 * P2P ops on a reserved tag, each bounded by the barrier's timeout, so rank 0
 * can name exactly the ranks that did not arrive. */
#include "pg.h"

#include "engine/error.h"
#include "engine/log.h"
#include "engine/loop.h"
#include "engine/work.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Beyond twice the barrier timeout (arrival, then release), the user's work
 * fails on its own should an internal op never complete. */
#define BACKSTOP_MS 5000

struct mb;
struct mb_slot {
    struct mb *mb;
    int peer;
    int status;
    char *message; /* why it failed (malloc'd) */
    uint8_t token;
};

struct mb {
    struct c10d__task task;
    c10d_pg *pg;
    c10d_work *work; /* the caller's */
    int dev;
    int64_t timeout_ms;
    int wait_all;
    uint64_t seq;
    int outstanding;
    int releasing;
    struct mb_slot *slots; /* one per rank; [rank] unused */
};

static void mb_finish(struct mb *mb, int status, const char *msg)
{
    c10d_pg *pg = mb->pg;
    if (status != 0)
        c10d__pg_poison(pg, status, msg);
    c10d__work_complete(mb->work, status, "%s", msg != NULL ? msg : "");
    c10d_work_release(mb->work);
    c10d__pg_op_ended(pg);
    for (int r = 0; r < pg->size; r++)
        free(mb->slots[r].message);
    free(mb->slots);
    free(mb);
    c10d__pg_unref(pg);
}

static void slot_done(c10d_work *w, int status, void *arg);

/* Whether `msg` names "rank <r>" (not a longer number). */
static int names_rank(const char *msg, int r)
{
    char pat[24];
    int n = snprintf(pat, sizeof pat, "rank %d", r);
    for (const char *p = msg; p != NULL && (p = strstr(p, pat)) != NULL; p += n)
        if (p[n] < '0' || p[n] > '9')
            return 1;
    return 0;
}

/* Whether rank 0's receive from r failed because of r. The first failure of
 * any peer fails the whole group (every pending receive, with that peer's
 * message): a rank that was still on its way is not to be named for it. A
 * receive that timed out did not arrive in time, whichever deadline fired
 * first (they all share one). */
static int slot_failed_itself(const struct mb_slot *slot)
{
    if (slot->status == 0)
        return 0;
    return slot->status == C10D_ETIMEDOUT ||
           (slot->message != NULL && names_rank(slot->message, slot->peer));
}

static int post_p2p(struct mb *mb, struct mb_slot *slot, enum c10d__op_kind kind)
{
    struct c10d__pg_op *po = c10d__pg_op_new(mb->pg, mb->dev, 0);
    c10d_work *w = NULL;
    char what[160];
    snprintf(what, sizeof what, "[PG %s Rank %d] monitoredBarrier %s rank %d (SeqNum=%llu)",
             mb->pg->name, mb->pg->rank, kind == C10D_OP_SEND ? "send to" : "recv from", slot->peer,
             (unsigned long long)mb->seq);
    if (po == NULL || c10d__work_create(&w, what, mb->timeout_ms) != 0 ||
        c10d__work_on_complete(w, slot_done, slot) != 0) {
        c10d__pg_op_free(po);
        if (w != NULL) {
            c10d__work_complete(w, C10D_ENOMEM, "out of memory");
            c10d_work_release(w);
        }
        return C10D_ENOMEM;
    }
    po->op.kind = kind;
    po->op.send = &slot->token;
    po->op.recv = &slot->token;
    po->op.count = 1;
    po->op.dtype = C10D_UINT8;
    po->op.peer = slot->peer;
    po->op.root = -1;
    po->op.tag = C10D__TAG_MONITORED_BARRIER;
    po->op.seq = mb->seq;
    po->op.timeout_ms = mb->timeout_ms;
    po->op.work = w;
    mb->outstanding++;
    c10d__pg_submit_internal(mb->pg, po);
    return 0;
}

static void rank0_arrivals_done(struct mb *mb)
{
    c10d_pg *pg = mb->pg;
    char list[512] = "";
    size_t len = 0;
    int nmissing = 0, first_status = 0, nfailed = 0;
    const char *first_message = NULL;
    for (int r = 1; r < pg->size; r++) {
        if (mb->slots[r].status == 0)
            continue;
        if (nfailed++ == 0)
            first_message = mb->slots[r].message;
        if (!slot_failed_itself(&mb->slots[r]))
            continue;
        if (nmissing == 0)
            first_status = mb->slots[r].status;
        nmissing++;
        if (len < sizeof list - 16)
            len += (size_t)snprintf(list + len, sizeof list - len, "%s%d", nmissing > 1 ? ", " : "",
                                    r);
        if (!mb->wait_all)
            break;
    }
    if (nmissing == 0 && nfailed > 0) {
        /* Something failed the group that no receive can be blamed on. */
        char msg[1024];
        snprintf(msg, sizeof msg, "[Rank 0]: monitoredBarrier failed before every rank arrived: %s",
                 first_message != NULL ? first_message : "unknown error");
        for (int r = 1; r < pg->size; r++)
            if (mb->slots[r].status != 0) {
                first_status = mb->slots[r].status;
                break;
            }
        mb_finish(mb, first_status, msg);
        return;
    }
    if (nmissing == 0) {
        mb->releasing = 1;
        for (int r = 1; r < pg->size; r++)
            if (post_p2p(mb, &mb->slots[r], C10D_OP_SEND) != 0)
                mb->slots[r].status = C10D_ENOMEM;
        if (mb->outstanding == 0)
            mb_finish(mb, C10D_ENOMEM, "monitoredBarrier: out of memory");
        return;
    }
    char msg[1536];
    if (mb->wait_all) {
        snprintf(msg, sizeof msg, "[Rank 0]: Ranks %s failed to pass monitoredBarrier in %lld ms",
                 list, (long long)mb->timeout_ms);
    } else {
        /* torch's text, then why the receive from that rank failed. */
        const char *why = NULL;
        for (int r = 1; r < pg->size && why == NULL; r++)
            if (slot_failed_itself(&mb->slots[r]))
                why = mb->slots[r].message;
        snprintf(msg, sizeof msg,
                 "[Rank 0]: Rank %s failed to pass monitoredBarrier in %lld ms\n Original "
                 "exception: \n%s",
                 list, (long long)mb->timeout_ms, why != NULL ? why : "unknown error");
    }
    /* A dead peer is ECLOSED; anything else (timeout, or aborted by another
     * rank's timeout) is the barrier's timeout. */
    mb_finish(mb, first_status == C10D_ECLOSED ? C10D_ECLOSED : C10D_ETIMEDOUT, msg);
}

static void all_done(struct mb *mb)
{
    c10d_pg *pg = mb->pg;
    if (pg->rank == 0 && !mb->releasing) {
        rank0_arrivals_done(mb);
        return;
    }
    char msg[1536];
    if (pg->rank == 0) {
        for (int r = 1; r < pg->size; r++) {
            int st = mb->slots[r].status;
            if (st == 0)
                continue;
            snprintf(msg, sizeof msg,
                     "[Rank 0]: monitoredBarrier could not release rank %d within %lld ms", r,
                     (long long)mb->timeout_ms);
            mb_finish(mb, st == C10D_ECLOSED ? C10D_ECLOSED : C10D_ETIMEDOUT, msg);
            return;
        }
        mb_finish(mb, 0, NULL);
        return;
    }
    int st = mb->slots[0].status != 0 ? mb->slots[0].status : mb->slots[pg->rank].status;
    if (st == 0) {
        mb_finish(mb, 0, NULL);
        return;
    }
    const char *why =
        mb->slots[0].message != NULL ? mb->slots[0].message : mb->slots[pg->rank].message;
    snprintf(msg, sizeof msg,
             "Rank %d successfully reached monitoredBarrier, but received errors while waiting "
             "for send/recv from rank 0. Please check rank 0 logs for faulty rank.\n Original "
             "exception: \n%s",
             pg->rank, why != NULL ? why : "unknown error");
    mb_finish(mb, st == C10D_ECLOSED ? C10D_ECLOSED : C10D_ETIMEDOUT, msg);
}

static void slot_done(c10d_work *w, int status, void *arg)
{
    (void)w;
    struct mb_slot *slot = arg;
    struct mb *mb = slot->mb;
    if (status != 0 && slot->status == 0) {
        slot->status = status;
        slot->message = strdup(c10d_work_message(w));
    }
    if (--mb->outstanding == 0)
        all_done(mb);
}

static void mb_start(struct c10d__task *t)
{
    struct mb *mb = (struct mb *)t;
    c10d_pg *pg = mb->pg;
    if (pg->size == 1) {
        mb_finish(mb, 0, NULL);
        return;
    }
    /* Hold one count so completions during posting cannot finish early. */
    mb->outstanding = 1;
    if (pg->rank == 0) {
        for (int r = 1; r < pg->size; r++)
            if (post_p2p(mb, &mb->slots[r], C10D_OP_RECV) != 0)
                mb->slots[r].status = C10D_ENOMEM;
    } else {
        /* The token and the release share a slot's status: any failure counts. */
        struct mb_slot *s0 = &mb->slots[0];
        s0->token = 1;
        if (post_p2p(mb, s0, C10D_OP_SEND) != 0 ||
            post_p2p(mb, &mb->slots[pg->rank], C10D_OP_RECV) != 0)
            s0->status = C10D_ENOMEM;
    }
    if (--mb->outstanding == 0)
        all_done(mb);
}

int c10d_monitored_barrier(c10d_pg *pg, int wait_all_ranks, const c10d_op_opts *user_opts,
                           c10d_work **work)
{
    const char *opname = "monitored_barrier";
    if (work != NULL)
        *work = NULL;
    if (pg == NULL)
        return c10d__fail(C10D_EINVAL, "c10d %s: pg is NULL", opname);
    c10d_op_opts opts;
    C10D_CHECK(c10d__pg_read_op_opts(pg, opname, user_opts, &opts));
    if (pg->rank < 0)
        return c10d__pg_noop(pg, opname, &opts, work);
    if (opts.device_type != C10D_DEVICE_CPU)
        return c10d__fail(C10D_EUNSUPPORTED,
                          "%s %s: runs on the host backend only (no device buffers)",
                          pg->backend_name, opname);
    int64_t timeout_ms = opts.timeout_ms;
    /* The host path: a GPU-only group has none. */
    if (pg->backends[0].vt == NULL)
        return c10d__fail(C10D_EUNSUPPORTED, "%s %s: needs a host (cpu) backend in the group",
                          pg->backend_name, opname);
    struct mb *mb = calloc(1, sizeof *mb);
    struct mb_slot *slots = calloc((size_t)pg->size, sizeof *slots);
    if (mb == NULL || slots == NULL) {
        free(mb);
        free(slots);
        return c10d__fail(C10D_ENOMEM, "%s %s: out of memory", pg->backend_name, opname);
    }
    mb->pg = pg;
    mb->slots = slots;
    mb->dev = 0;
    mb->timeout_ms = timeout_ms > 0 ? timeout_ms : pg->timeout_ms;
    mb->wait_all = wait_all_ranks != 0;
    mb->task.fn = mb_start;
    for (int r = 0; r < pg->size; r++) {
        slots[r].mb = mb;
        /* Rank 0 talks to r; the others use slot 0 for the token to rank 0
         * and their own slot for the release from it. */
        slots[r].peer = pg->rank == 0 ? r : 0;
    }
    uv_mutex_lock(&pg->mutex);
    int rc = c10d__pg_usable_locked(pg, opname);
    if (rc == 0 && pg->coalescing)
        rc = c10d__fail(C10D_EINVAL, "%s %s: cannot be coalesced", pg->backend_name, opname);
    c10d_work *w = NULL;
    if (rc == 0) {
        mb->seq = ++pg->coll_seq;
        char what[256];
        snprintf(what, sizeof what,
                 "[PG %s (%s) Rank %d] Work(SeqNum=%llu, OpType=MONITORED_BARRIER, NumelIn=0, "
                 "NumelOut=0, Timeout(ms)=%lld)",
                 pg->name, pg->desc, pg->rank, (unsigned long long)mb->seq,
                 (long long)mb->timeout_ms);
        rc = c10d__work_create(&w, what, 2 * mb->timeout_ms + BACKSTOP_MS);
        if (rc != 0)
            pg->coll_seq--;
    }
    if (rc == 0) {
        mb->work = w;
        /* The call's own reference: the barrier may end and drop mb's before
         * this function returns. */
        c10d_work_retain(w);
        pg->pending++;
        pg->refs++;
        rc = c10d__engine_post(&mb->task);
        if (rc != 0) {
            pg->pending--;
            pg->refs--;
            pg->coll_seq--;
            c10d_work_release(w);
        }
    }
    uv_mutex_unlock(&pg->mutex);
    if (rc != 0) {
        if (w != NULL) {
            c10d__work_complete(w, rc, "not started");
            c10d_work_release(w);
        }
        free(slots);
        free(mb);
        return rc;
    }
    /* The callback is registered after the post, as for every op: one that
     * already completed still calls back. Only shutdown makes this fail. */
    if (opts.cb != NULL && (rc = c10d_work_on_complete(w, opts.cb, opts.cb_arg)) != 0) {
        c10d_work_release(w);
        return rc;
    }
    if (work != NULL)
        *work = w;
    else
        c10d_work_release(w);
    return 0;
}
