/* Posting and matching. A transfer posted before its peer's frame arrives
 * waits on a list; a frame that arrives before its transfer is posted waits in
 * the peer's unexpected queue. Both halves of every rule, the posting side and
 * the arriving side, are in this file because they must agree: one changed
 * without the other loses or duplicates messages.
 *
 * Small collective messages go eagerly; a large one waits for the receiver's
 * clear-to-send (CTS), which the receiver sends as soon as it posts the
 * receive, so on the hot path nobody waits for a round trip the other side
 * could have started earlier. A P2P message asks first (RTS) unless it is
 * small and within its peer's credit; then it goes eagerly and its send
 * completes when the receiver acknowledges (ACK) that it met a posted receive.
 * Either way a P2P send completes only once its receiver has posted, and a
 * receive from any source picks its sender among the messages announced so
 * far. A collective frame whose fingerprint differs from the op this rank
 * runs (fingerprint.c), or a size that differs from the posted one, fails the
 * transport: the collective was called differently on the two ranks. */
#include "transport_impl.h"

#include "engine/list.h"
#include "engine/log.h"
#include "engine/loop.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

/* Eager P2P bytes a sender may have unacknowledged per peer: what a receiver
 * may have to hold for sends it has not posted receives for. */
#define P2P_CREDIT ((size_t)1 << 20)

/* A P2P message to a rank of this host larger than this is offered in place
 * (cma_read) even where it could go eager: the receiver's one copy instead
 * of two through the ring (docs/shm.md, "P2P"). Smaller ones go eager. Up to
 * a mailbox's size (mailbox.h) a message most often skips this path, through
 * the mailbox in the callers' lanes. */
#define LOCAL_OFFER_MIN ((size_t)16 << 10)

/* Whether a P2P message of `len` bytes that could go eager goes to `pe`
 * with its offer instead: not once that peer refused one (it reads nothing
 * in place: each offer would cost a round trip more), nor where this rank
 * reads nothing in place itself (both are most often refused alike). */
static int offer_not_eager(const struct c10d__tcp_transport *t, const struct peer *pe, size_t len)
{
    return pe->local && len > LOCAL_OFFER_MIN && !pe->offer_refused && !t->cma_off;
}

/* ------------------------------------------------------------- lists */

static void xlist_push(struct xlist *l, int id, struct c10d__tcp_xfer *x)
{
    x->list = id;
    C10D__LIST_PUSH_BACK(l->head, l->tail, x, prev, next);
}

static void xlist_remove(struct xlist *l, struct c10d__tcp_xfer *x)
{
    C10D__LIST_REMOVE(l->head, l->tail, x, prev, next);
    x->list = L_NONE;
}

static struct c10d__tcp_xfer *xlist_find(struct xlist *l, int p2p, uint64_t tag, uint32_t sub)
{
    for (struct c10d__tcp_xfer *x = l->head; x != NULL; x = x->next)
        if (x->p2p == p2p && x->tag == tag && c10d__tcp_xfer_key_sub(x) == sub)
            return x;
    return NULL;
}

static struct c10d__tcp_xfer *xlist_find_tag(struct xlist *l, uint64_t tag)
{
    for (struct c10d__tcp_xfer *x = l->head; x != NULL; x = x->next)
        if (x->tag == tag)
            return x;
    return NULL;
}

/* ----------------------------------------------- unexpected messages */

static struct unexp *unexp_new(struct c10d__tcp_transport *t, const struct wire *w, size_t data)
{
    struct unexp *u = t->unexp_pool;
    if (u != NULL)
        t->unexp_pool = u->next;
    else if ((u = calloc(1, sizeof *u)) == NULL)
        return NULL;
    if (data > u->cap) {
        char *grown = realloc(u->data, data);
        if (grown == NULL) {
            u->next = t->unexp_pool;
            t->unexp_pool = u;
            return NULL;
        }
        u->data = grown;
        u->cap = data;
    }
    u->next = NULL;
    u->w = *w;
    u->order = t->next_order++;
    u->complete = 0;
    u->claimed = NULL;
    u->mb_gen = 0;
    return u;
}

static void unexp_free(struct c10d__tcp_transport *t, struct unexp *u)
{
    /* Keep modest buffers for reuse; give big ones back. */
    if (u->cap > (1u << 20)) {
        free(u->data);
        u->data = NULL;
        u->cap = 0;
    }
    u->next = t->unexp_pool;
    t->unexp_pool = u;
}

static int unexp_is_p2p(const struct unexp *u)
{
    return (u->w.type == F_EAGER || u->w.type == F_RTS) && (u->w.flags & FLAG_P2P);
}

/* Every unexpected message is linked and unlinked here, so t->unexp_n
 * counts them (a start with none queued skips looking through them), and a
 * P2P one is counted for its peer and told to the caller's lane, which
 * takes back a receive it posted in a mailbox (p2p_lane.c): this message
 * comes first. */
static void unexp_append(struct c10d__tcp_transport *t, struct peer *pe, struct unexp *u)
{
    t->unexp_n++;
    if (unexp_is_p2p(u)) {
        atomic_fetch_add(&pe->p2p_waiting, 1);
        if (t->p2p_unexpected != NULL)
            t->p2p_unexpected(t->p2p_unexpected_arg, pe->rank);
    }
    if (pe->unexp_tail != NULL)
        pe->unexp_tail->next = u;
    else
        pe->unexp_head = u;
    pe->unexp_tail = u;
}

static void unexp_unlink(struct c10d__tcp_transport *t, struct peer *pe, struct unexp *u)
{
    struct unexp **pp = &pe->unexp_head, *prev = NULL;
    while (*pp != NULL && *pp != u) {
        prev = *pp;
        pp = &(*pp)->next;
    }
    if (*pp == NULL)
        return;
    t->unexp_n--;
    if (unexp_is_p2p(u))
        atomic_fetch_sub(&pe->p2p_waiting, 1);
    *pp = u->next;
    if (pe->unexp_tail == u)
        pe->unexp_tail = prev;
    u->next = NULL;
}

/* ----------------------------------------------------------- posting */

static void mismatch(struct c10d__tcp_transport *t, const struct c10d__tcp_xfer *x, int from,
                     uint64_t sent, size_t posted)
{
    if (x->p2p)
        c10d__tcp_error(
            t, C10D_EINVAL,
            "tcp recv (tag %llu): rank %d sent %llu bytes but the posted buffer holds %zu",
            (unsigned long long)x->tag, from, (unsigned long long)sent, posted);
    else
        c10d__tcp_error(t, C10D_EINVAL,
                        "tcp %s seq %llu: rank %d sent %llu bytes but this rank posted %zu bytes "
                        "(collective mismatch?)",
                        c10d__op_kind_name((enum c10d__op_kind)x->kind), (unsigned long long)x->tag,
                        from, (unsigned long long)sent, posted);
}

static void recv_finish(struct c10d__tcp_xfer *x, int from, size_t len)
{
    x->received = len;
    x->source = from;
    x->done(x);
}

/* An RTS whose sender on this host offered its buffer (FLAG_CMA): copy the
 * bytes straight from its memory, one copy instead of two through the
 * kernel's socket buffers, then acknowledge (the send completes) and wait
 * for the sender's F_FIN (the receive completes). 1 if read; 0 if the read
 * was refused (another user's process, ptrace restrictions, a seccomp
 * filter): the receive then asks for the bytes as usual, and this transport
 * stops trying. */
static int cma_read(struct c10d__tcp_transport *t, struct c10d__tcp_xfer *x, int from,
                    const struct wire *w)
{
    if (c10d__tcp_work_gone(x))
        return 0;
    pid_t pid = (pid_t)w->fp.root;
    uintptr_t addr = (uintptr_t)w->fp.count;
    for (size_t done = 0; done < w->len;) {
        struct iovec mine = {(char *)x->buf + done, w->len - done};
        struct iovec theirs = {(void *)(addr + done), w->len - done};
        ssize_t n = process_vm_readv(pid, &mine, 1, &theirs, 1, 0);
        if (n <= 0) {
            int err = n < 0 ? errno : EIO;
            if (err == EPERM || err == EACCES || err == ENOSYS || err == ESRCH) {
                t->cma_off = 1;
                C10D_DEBUG("tcp",
                           "rank %d: cannot read rank %d's memory (%s): large P2P messages from "
                           "ranks on this host go through the socket",
                           t->cfg.rank, from, strerror(err));
            }
            return 0; /* the sender sends it all again after the CTS */
        }
        done += (size_t)n;
    }
    atomic_fetch_add_explicit(&t->cma_bytes, w->len, memory_order_relaxed);
    /* The bytes are only good if the sender's buffer was still its send's
     * when they were read (a send that timed out gives it back to its
     * owner): the receive completes on the sender's F_FIN, which says so. */
    x->received = w->len;
    xlist_push(&t->peers[from].recvs, L_RECVS, x);
    c10d__tcp_send_ack(t, x);
    return 1;
}

/* A P2P receive matched an RTS: from now on it waits for that sender's data. */
static void p2p_accept(struct c10d__tcp_transport *t, struct c10d__tcp_xfer *x, int from,
                       const struct wire *w)
{
    if (w->len > x->len) {
        mismatch(t, x, from, w->len, x->len);
        return;
    }
    x->peer_sub = w->sub;
    x->source = from;
    if ((w->flags & FLAG_CMA) && t->peers[from].local && !t->cma_off && cma_read(t, x, from, w))
        return;
    xlist_push(&t->peers[from].recvs, L_RECVS, x);
    c10d__tcp_send_cts(t, x);
}

void c10d__tcp_send(struct c10d__tcp_transport *t, struct c10d__tcp_xfer *x)
{
    if (t->failed)
        return;
    struct peer *pe = &t->peers[x->peer];
    if (!x->p2p && x->len <= t->cfg.eager_max) {
        c10d__tcp_wire_encode(x->data_hdr, F_EAGER, x->kind, 0, x->sub, x->tag, x->len, &x->fp);
        c10d__tcp_peer_write(t, pe, x, W_DATA);
        return;
    }
    if (x->p2p && x->len <= t->cfg.eager_max && pe->eager_out + x->len <= P2P_CREDIT &&
        !offer_not_eager(t, pe, x->len)) {
        /* Small P2P: the data goes now; the send completes when the receiver
         * acknowledges having matched it to a posted receive. */
        x->peer_sub = pe->next_send_id++;
        x->await_ack = 1;
        pe->eager_out += x->len;
        xlist_push(&pe->sends, L_SENDS, x);
        c10d__tcp_wire_encode(x->data_hdr, F_EAGER, x->kind, FLAG_P2P, x->peer_sub, x->tag, x->len,
                              &x->fp);
        c10d__tcp_peer_write(t, pe, x, W_DATA);
        return;
    }
    if (x->p2p) {
        x->peer_sub = pe->next_send_id++;
    } else {
        for (struct unexp *u = pe->unexp_head; u != NULL; u = u->next) {
            if (u->w.type == F_CTS && !(u->w.flags & FLAG_P2P) && u->w.tag == x->tag &&
                u->w.sub == x->sub) {
                uint64_t cap = u->w.len;
                unexp_unlink(t, pe, u);
                unexp_free(t, u);
                c10d__tcp_send_data(t, x, cap);
                return;
            }
        }
    }
    xlist_push(&pe->sends, L_SENDS, x);
    if (x->p2p && pe->local && x->len > 0) {
        /* A rank of this host may copy it from here itself (cma_read); a
         * CTS instead means it could not. */
        struct c10d__fp at = {.root = (int32_t)getpid(), .count = (uint64_t)(uintptr_t)x->buf};
        x->cma = 1;
        x->await_ack = 1;
        c10d__tcp_wire_encode(x->ctl_hdr, F_RTS, x->kind, FLAG_P2P | FLAG_CMA,
                              c10d__tcp_xfer_key_sub(x), x->tag, x->len, &at);
        c10d__tcp_peer_write(t, pe, x, W_CTL);
        return;
    }
    c10d__tcp_wire_encode(x->ctl_hdr, F_RTS, x->kind, x->p2p ? FLAG_P2P : 0,
                          c10d__tcp_xfer_key_sub(x), x->tag, x->len, &x->fp);
    c10d__tcp_peer_write(t, pe, x, W_CTL);
}

static void recv_p2p(struct c10d__tcp_transport *t, struct c10d__tcp_xfer *x)
{
    struct unexp *best = NULL;
    int best_rank = -1;
    int lo = x->peer == C10D_ANY_SOURCE ? 0 : x->peer;
    int hi = x->peer == C10D_ANY_SOURCE ? t->cfg.size : x->peer + 1;
    /* A message deposited in a mailbox was sent before any frame still to
     * come from its sender: it is among those this receive may match. */
    if (x->peer != C10D_ANY_SOURCE) {
        if (c10d__tcp_mailbox_drain(t, &t->peers[x->peer]) < 0)
            return;
    } else {
        for (int i = 0; i < t->nring_peers; i++)
            if (c10d__tcp_mailbox_drain(t, &t->peers[t->ring_peers[i]]) < 0)
                return;
    }
    for (int r = lo; r < hi; r++) {
        if (r == t->cfg.rank)
            continue;
        if (x->peer == C10D_ANY_SOURCE && t->cfg.lazy && t->peers[r].conn == NULL)
            c10d__tcp_peer_connect(t, r);
        for (struct unexp *u = t->peers[r].unexp_head; u != NULL; u = u->next) {
            /* One still arriving that an earlier receive claimed is that
             * receive's: this one takes the next. */
            if ((u->w.type == F_RTS || u->w.type == F_EAGER) && (u->w.flags & FLAG_P2P) &&
                u->w.tag == x->tag && u->claimed == NULL) {
                if (best == NULL || u->order < best->order) {
                    best = u;
                    best_rank = r;
                }
                break;
            }
        }
    }
    if (best != NULL && best->w.type == F_EAGER) {
        if (best->w.len > x->len) {
            mismatch(t, x, best_rank, best->w.len, x->len);
            return;
        }
        x->peer_sub = best->w.sub;
        x->source = best_rank;
        x->ack_needed = 1;
        x->mb_gen = best->mb_gen;
        if (!best->complete) {
            best->claimed = x; /* still arriving: finished by c10d__tcp_body_done */
            return;
        }
        size_t len = best->w.len;
        if (len > 0)
            memcpy(x->buf, best->data, len);
        unexp_unlink(t, &t->peers[best_rank], best);
        unexp_free(t, best);
        x->received = len;
        c10d__tcp_send_ack(t, x);
        recv_finish(x, best_rank, len);
        return;
    }
    if (best != NULL) {
        struct wire w = best->w;
        unexp_unlink(t, &t->peers[best_rank], best);
        unexp_free(t, best);
        p2p_accept(t, x, best_rank, &w);
        return;
    }
    if (x->peer != C10D_ANY_SOURCE && t->peers[x->peer].gone) {
        c10d__tcp_error(t, C10D_ECLOSED, "tcp: rank %d has left the group (it destroyed it)",
                        x->peer);
        return;
    }
    x->order = t->next_order++;
    if (x->peer == C10D_ANY_SOURCE) {
        xlist_push(&t->any_recvs, L_ANY_RECVS, x);
    } else {
        xlist_push(&t->peers[x->peer].p2p_recvs, L_P2P_RECVS, x);
        if (t->cfg.lazy && t->peers[x->peer].conn == NULL)
            c10d__tcp_peer_connect(t, x->peer);
    }
}

void c10d__tcp_recv(struct c10d__tcp_transport *t, struct c10d__tcp_xfer *x)
{
    if (t->failed)
        return;
    if (x->p2p) {
        recv_p2p(t, x);
        return;
    }
    struct peer *pe = &t->peers[x->peer];
    x->source = x->peer;
    for (struct unexp *u = pe->unexp_head; u != NULL; u = u->next) {
        if ((u->w.flags & FLAG_P2P) || u->w.tag != x->tag || u->w.sub != x->sub ||
            (u->w.type != F_EAGER && u->w.type != F_RTS))
            continue;
        if (u->w.kind != x->kind) {
            c10d__tcp_error(t, C10D_EINVAL,
                            "tcp %s seq %llu: rank %d runs %s with the same sequence number "
                            "(collective mismatch?)",
                            c10d__op_kind_name((enum c10d__op_kind)x->kind),
                            (unsigned long long)x->tag, x->peer,
                            c10d__op_kind_name((enum c10d__op_kind)u->w.kind));
            return;
        }
        if (u->w.len != x->len) {
            mismatch(t, x, x->peer, u->w.len, x->len);
            return;
        }
        if (u->w.type == F_RTS) {
            unexp_unlink(t, pe, u);
            unexp_free(t, u);
            xlist_push(&pe->recvs, L_RECVS, x);
            c10d__tcp_send_cts(t, x);
            return;
        }
        if (!u->complete) {
            u->claimed = x; /* the body is arriving: finish when it has */
            return;
        }
        size_t len = u->w.len;
        if (len > 0)
            memcpy(x->buf, u->data, len);
        unexp_unlink(t, pe, u);
        unexp_free(t, u);
        recv_finish(x, x->peer, len);
        return;
    }
    if (pe->gone) {
        c10d__tcp_error(t, C10D_ECLOSED, "tcp: rank %d has left the group (it destroyed it)",
                        x->peer);
        return;
    }
    xlist_push(&pe->recvs, L_RECVS, x);
    if (x->len > t->cfg.eager_max)
        c10d__tcp_send_cts(t, x);
    else if (t->cfg.lazy && pe->conn == NULL)
        c10d__tcp_peer_connect(t, x->peer);
}

/* ---------------------------------------------------------- arriving */

static void body_start(struct conn *c, const struct wire *w, char *dst, struct c10d__tcp_xfer *x,
                       struct unexp *u)
{
    c->in_body = 1;
    c->body_w = *w;
    c->dst = dst;
    c->remaining = w->len;
    c->body_x = x;
    c->body_u = u;
    if (x != NULL && c10d__tcp_work_gone(x))
        c->dst = NULL; /* its op timed out: the buffer may be gone */
}

void c10d__tcp_body_done(struct conn *c)
{
    struct c10d__tcp_transport *t = c->t;
    struct peer *pe = &t->peers[c->rank];
    c->in_body = 0;
    struct c10d__tcp_xfer *x = c->body_x;
    struct unexp *u = c->body_u;
    c->body_x = NULL;
    c->body_u = NULL;
    if (c->body_w.type == F_ABORT) {
        c->abort_msg[c->body_w.len] = '\0';
        uint32_t lost = c->body_w.sub; /* the rank it knows died, + 1 */
        if (lost > 0 && lost <= (uint32_t)t->cfg.size && (int)lost - 1 != t->cfg.rank &&
            t->told_lost < 0)
            t->told_lost = (int)lost - 1;
        c10d__tcp_error(t, (int)(int64_t)c->body_w.tag, "rank %d failed: %s", c->rank,
                        c->abort_msg);
        return;
    }
    if (x != NULL) {
        xlist_remove(&pe->recvs, x);
        if (c->dst != NULL || c->body_w.len == 0) {
            if (x->ack_needed) {
                x->received = c->body_w.len;
                c10d__tcp_send_ack(t, x);
            }
            recv_finish(x, c->rank, c->body_w.len);
        }
        return;
    }
    if (u != NULL) {
        u->complete = 1;
        if (u->claimed != NULL) {
            struct c10d__tcp_xfer *cx = u->claimed;
            size_t len = u->w.len;
            if (!c10d__tcp_work_gone(cx) && len > 0)
                memcpy(cx->buf, u->data, len);
            unexp_unlink(t, pe, u);
            unexp_free(t, u);
            if (cx->ack_needed) {
                cx->received = len;
                c10d__tcp_send_ack(t, cx);
            }
            recv_finish(cx, c->rank, len);
        }
    }
}

int c10d__tcp_mailbox_drain(struct c10d__tcp_transport *t, struct peer *pe)
{
    uint64_t gen, tag;
    size_t len;
    const char *data;
    if (pe->mb_in == NULL || t->failed || !c10d__shm_mb_claim(pe->mb_in, &gen, &tag, &len, &data))
        return 0;
    /* As its F_EAGER frame would be (c10d__tcp_handle_frame), answered in
     * the mailbox instead of with an F_ACK. */
    struct c10d__tcp_xfer *a = xlist_find_tag(&pe->p2p_recvs, tag);
    struct c10d__tcp_xfer *b = xlist_find_tag(&t->any_recvs, tag);
    struct c10d__tcp_xfer *x = a != NULL && (b == NULL || a->order < b->order) ? a : b;
    if (x != NULL) {
        if (len > x->len) {
            mismatch(t, x, pe->rank, len, x->len);
            return -1;
        }
        xlist_remove(x == a ? &pe->p2p_recvs : &t->any_recvs, x);
        if (c10d__tcp_work_gone(x)) {
            /* Timed out: its buffer is its owner's again, and the message
             * stays unmatched (the sender's send fails with the group, never
             * an OK for bytes nobody kept). */
            recv_finish(x, pe->rank, 0);
            return 1;
        }
        if (len > 0)
            memcpy(x->buf, data, len);
        c10d__shm_mb_matched(pe->mb_in, gen);
        recv_finish(x, pe->rank, len);
        return 1;
    }
    struct wire w = {0};
    w.type = F_EAGER;
    w.kind = C10D_OP_SEND;
    w.flags = FLAG_P2P;
    w.tag = tag;
    w.len = len;
    struct unexp *u = unexp_new(t, &w, len);
    if (u == NULL) {
        c10d__tcp_error(t, C10D_ENOMEM, "tcp: out of memory buffering %zu bytes from rank %d", len,
                        pe->rank);
        return -1;
    }
    if (len > 0)
        memcpy(u->data, data, len);
    u->complete = 1;
    u->mb_gen = gen;
    unexp_append(t, pe, u);
    return 1;
}

void c10d__tcp_handle_frame(struct conn *c, const struct wire *w)
{
    struct c10d__tcp_transport *t = c->t;
    struct peer *pe = &t->peers[c->rank];
    int p2p = (w->flags & FLAG_P2P) != 0;
    struct c10d__tcp_xfer *x;
    if (!p2p && (w->type == F_EAGER || w->type == F_RTS || w->type == F_CTS) &&
        c10d__tcp_fp_check(t, c->rank, w) < 0)
        return;
    /* Its sender deposited that one before it sent this frame. */
    if (p2p && (w->type == F_EAGER || w->type == F_RTS) && c10d__tcp_mailbox_drain(t, pe) < 0)
        return;
    switch (w->type) {
    case F_EAGER:
        if (p2p) {
            struct c10d__tcp_xfer *a = xlist_find_tag(&pe->p2p_recvs, w->tag);
            struct c10d__tcp_xfer *b = xlist_find_tag(&t->any_recvs, w->tag);
            x = a != NULL && (b == NULL || a->order < b->order) ? a : b;
            if (x != NULL) {
                if (w->len > x->len) {
                    mismatch(t, x, c->rank, w->len, x->len);
                    return;
                }
                xlist_remove(x == a ? &pe->p2p_recvs : &t->any_recvs, x);
                x->peer_sub = w->sub;
                x->source = c->rank;
                x->ack_needed = 1;
                xlist_push(&pe->recvs, L_RECVS, x);
                body_start(c, w, x->buf, x, NULL);
                break;
            }
            x = NULL;
        } else {
            x = xlist_find(&pe->recvs, 0, w->tag, w->sub);
        }
        if (x != NULL) {
            if (x->kind != w->kind) {
                c10d__tcp_error(t, C10D_EINVAL,
                                "tcp %s seq %llu: rank %d runs %s with the same sequence number "
                                "(collective mismatch?)",
                                c10d__op_kind_name((enum c10d__op_kind)x->kind),
                                (unsigned long long)x->tag, c->rank,
                                c10d__op_kind_name((enum c10d__op_kind)w->kind));
                return;
            }
            if (w->len != x->len) {
                mismatch(t, x, c->rank, w->len, x->len);
                return;
            }
            body_start(c, w, x->buf, x, NULL);
        } else {
            struct unexp *u = unexp_new(t, w, w->len);
            if (u == NULL) {
                c10d__tcp_error(t, C10D_ENOMEM,
                                "tcp: out of memory buffering %llu bytes from rank %d",
                                (unsigned long long)w->len, c->rank);
                return;
            }
            unexp_append(t, pe, u);
            body_start(c, w, u->data, NULL, u);
        }
        break;
    case F_RTS:
        if (p2p) {
            struct c10d__tcp_xfer *a = xlist_find_tag(&pe->p2p_recvs, w->tag);
            struct c10d__tcp_xfer *b = xlist_find_tag(&t->any_recvs, w->tag);
            x = a != NULL && (b == NULL || a->order < b->order) ? a : b;
            if (x != NULL) {
                xlist_remove(x == a ? &pe->p2p_recvs : &t->any_recvs, x);
                p2p_accept(t, x, c->rank, w);
                return;
            }
        } else if ((x = xlist_find(&pe->recvs, 0, w->tag, w->sub)) != NULL) {
            if (w->len != x->len)
                mismatch(t, x, c->rank, w->len, x->len);
            else if (!x->cts_sent)
                c10d__tcp_send_cts(t, x);
            return;
        }
        goto keep;
    case F_CTS:
        x = xlist_find(&pe->sends, p2p, w->tag, w->sub);
        if (x != NULL) {
            xlist_remove(&pe->sends, x);
            if (x->cma)
                pe->offer_refused = 1;
            x->cma = x->await_ack = 0; /* the receiver asks for the bytes after all */
            c10d__tcp_send_data(t, x, w->len);
            return;
        }
        goto keep;
    case F_DATA:
        x = xlist_find(&pe->recvs, p2p, w->tag, w->sub);
        if (x == NULL) {
            c10d__tcp_error(t, C10D_EPROTO, "tcp: rank %d sent data (tag %llu) nobody asked for",
                            c->rank, (unsigned long long)w->tag);
            return;
        }
        if (x->p2p ? w->len > x->len : w->len != x->len) {
            mismatch(t, x, c->rank, w->len, x->len);
            return;
        }
        body_start(c, w, x->buf, x, NULL);
        break;
    case F_ACK:
        x = xlist_find(&pe->sends, 1, w->tag, w->sub);
        if (x == NULL || !x->await_ack) {
            c10d__tcp_error(t, C10D_EPROTO,
                            "tcp: rank %d acknowledged a message (tag %llu) never sent", c->rank,
                            (unsigned long long)w->tag);
            return;
        }
        xlist_remove(&pe->sends, x);
        if (!x->cma) /* read in place (cma_read): it took no credit */
            pe->eager_out -= x->len;
        x->await_ack = 0;
        if (c10d__tcp_work_gone(x))
            return; /* no F_FIN: the receiver's copy may be stale; it fails with the group */
        if (x->cma)
            c10d__tcp_send_fin(t, x);
        x->cma = 0;
        x->done(x);
        return;
    case F_FIN:
        x = xlist_find(&pe->recvs, 1, w->tag, w->sub);
        if (x == NULL || x->received != w->len) {
            c10d__tcp_error(t, C10D_EPROTO,
                            "tcp: rank %d finished a message (tag %llu) never read in place",
                            c->rank, (unsigned long long)w->tag);
            return;
        }
        xlist_remove(&pe->recvs, x);
        if (!c10d__tcp_work_gone(x)) /* as a body that arrives for a receive that timed out */
            recv_finish(x, c->rank, x->received);
        return;
    case F_WAKE:
        c10d__engine_busy(); /* the peer moved on shared memory: poll it */
        return;
    case F_RING:
        if (pe->ring_in == NULL) {
            c10d__tcp_error(t, C10D_EPROTO,
                            "tcp: rank %d writes to a shared-memory ring this rank does not read",
                            c->rank);
            return;
        }
        pe->ring_started = 1; /* every earlier frame came on the socket */
        c10d__engine_busy();
        return;
    case F_BYE:
        c10d__tcp_ring_drain(t, pe); /* what it wrote there before it left */
        c->bye = 1;
        pe->gone = 1;
        return;
    case F_ABORT:
        if (w->len > ABORT_MSG_MAX) {
            c10d__tcp_error(t, C10D_EPROTO, "tcp: rank %d sent a malformed abort frame", c->rank);
            return;
        }
        body_start(c, w, c->abort_msg, NULL, NULL);
        break;
    default:
        c10d__tcp_error(t, C10D_EPROTO, "tcp: rank %d sent an unknown frame type %d", c->rank,
                        w->type);
        return;
    }
    if (c->in_body && c->remaining == 0)
        c10d__tcp_body_done(c);
    return;
keep : {
    struct unexp *u = unexp_new(t, w, 0);
    if (u == NULL) {
        c10d__tcp_error(t, C10D_ENOMEM, "tcp: out of memory");
        return;
    }
    u->complete = 1;
    unexp_append(t, pe, u);
}
}
