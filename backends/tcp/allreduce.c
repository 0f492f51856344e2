/* all_reduce: recursive doubling (small), recursive halving + doubling
 * (Rabenseifner, medium), pipelined ring reduce-scatter + all-gather (large).
 * Cost models and thresholds: docs/algorithms.md.
 *
 * Bit-identical results: in recursive doubling both partners combine the same
 * two partial results, a op b on one and b op a on the other, and every
 * reduce op of the host kernels is commutative bit for bit (IEEE 754 + and *
 * are). Halving-doubling and the ring reduce each block on one rank only,
 * then distribute it. */
#include "coll.h"

#include "engine/error.h"
#include "engine/kernels/reduce.h"

#include <string.h>

enum { SUB_FOLD = 0, SUB_UNFOLD = 1, SUB_STEP = 2 };
enum { P_FOLD, P_MAIN, P_GATHER, P_UNFOLD, P_DONE };

/* Non-power-of-two rank counts: the first 2*rem ranks pair up, the even one
 * of each pair hands its data to the odd one and sits out the power-of-two
 * core, then gets the result back. */
static void fold_setup(struct c10d__tcp_coll *c)
{
    c->pof2 = 1;
    while (c->pof2 * 2 <= c->size)
        c->pof2 *= 2;
    c->rem = c->size - c->pof2;
    if (c->rank < 2 * c->rem)
        c->vrank = c->rank % 2 ? c->rank / 2 : -1;
    else
        c->vrank = c->rank - c->rem;
}

static int real_rank(const struct c10d__tcp_coll *c, int v)
{
    return v < c->rem ? 2 * v + 1 : v + c->rem;
}

static size_t bytes_of(const struct c10d__tcp_coll *c, size_t n)
{
    return n * c->esz;
}

/* Posts the fold step; returns 1 if this rank has something to do in it. */
static void fold(struct c10d__tcp_chain *ch)
{
    struct c10d__tcp_coll *c = ch->c;
    size_t n = c->op->count;
    if (c->rank < 2 * c->rem) {
        if (c->rank % 2 == 0) {
            c10d__tcp_chain_send(ch, c->rank + 1, SUB_FOLD, c->buf, bytes_of(c, n));
        } else {
            c10d__tcp_chain_recv(ch, c->rank - 1, SUB_FOLD, c->tmp, bytes_of(c, n));
            ch->red_dst = c->buf;
            ch->red_src = c->tmp;
            ch->red_count = n;
        }
    }
}

static void unfold(struct c10d__tcp_chain *ch)
{
    struct c10d__tcp_coll *c = ch->c;
    size_t n = c->op->count;
    if (c->rank < 2 * c->rem) {
        if (c->rank % 2 == 0)
            c10d__tcp_chain_recv(ch, c->rank + 1, SUB_UNFOLD, c->buf, bytes_of(c, n));
        else
            c10d__tcp_chain_send(ch, c->rank - 1, SUB_UNFOLD, c->buf, bytes_of(c, n));
    }
}

static int finish(struct c10d__tcp_coll *c, void *buf, size_t n)
{
    int rc = c10d__reduce_finish(buf, n, c->op->dtype, c->op->redop, c->size);
    if (rc < 0 && !c->failed) {
        c->failed = 1;
        c->finished(c, rc);
    }
    return rc;
}

static void rd_step(struct c10d__tcp_chain *ch)
{
    struct c10d__tcp_coll *c = ch->c;
    size_t n = c->op->count;
    switch (ch->step) {
    case P_FOLD:
        fold(ch);
        ch->step = P_MAIN;
        ch->mask = 1;
        return;
    case P_MAIN:
        if (c->vrank >= 0 && ch->mask < c->pof2) {
            int peer = real_rank(c, c->vrank ^ ch->mask);
            uint32_t sub = SUB_STEP + (uint32_t)ch->k++;
            c10d__tcp_chain_send(ch, peer, sub, c->buf, bytes_of(c, n));
            c10d__tcp_chain_recv(ch, peer, sub, c->tmp, bytes_of(c, n));
            ch->red_dst = c->buf;
            ch->red_src = c->tmp;
            ch->red_count = n;
            ch->mask <<= 1;
            return;
        }
        if (c->vrank >= 0 && finish(c, c->buf, n) < 0)
            return;
        unfold(ch);
        ch->step = P_DONE;
        return;
    default:
        ch->done = 1;
    }
}

/* Rabenseifner: the vector is cut into pof2 blocks; halving leaves each
 * virtual rank with the full reduction of its own block, doubling gathers. */
static void rh_step(struct c10d__tcp_chain *ch)
{
    struct c10d__tcp_coll *c = ch->c;
    size_t n = c->op->count;
    int pof2 = c->pof2;
    switch (ch->step) {
    case P_FOLD:
        fold(ch);
        ch->step = c->vrank >= 0 ? P_MAIN : P_UNFOLD;
        ch->mask = pof2 / 2;
        c->nblocks = 0; /* first block of the kept range */
        return;
    case P_MAIN:
        if (ch->mask >= 1) {
            int m = ch->mask, bl = c->nblocks;
            int peer = real_rank(c, c->vrank ^ m);
            int keep_lo = c->vrank & m ? bl + m : bl;
            int send_lo = c->vrank & m ? bl : bl + m;
            size_t klo = c10d__tcp_split(n, pof2, keep_lo),
                   khi = c10d__tcp_split(n, pof2, keep_lo + m);
            size_t slo = c10d__tcp_split(n, pof2, send_lo),
                   shi = c10d__tcp_split(n, pof2, send_lo + m);
            uint32_t sub = SUB_STEP + (uint32_t)ch->k++;
            c10d__tcp_chain_send(ch, peer, sub, c->buf + bytes_of(c, slo), bytes_of(c, shi - slo));
            c10d__tcp_chain_recv(ch, peer, sub, c->tmp, bytes_of(c, khi - klo));
            ch->red_dst = c->buf + bytes_of(c, klo);
            ch->red_src = c->tmp;
            ch->red_count = khi - klo;
            c->nblocks = keep_lo;
            ch->mask >>= 1;
            return;
        }
        {
            size_t lo = c10d__tcp_split(n, pof2, c->vrank),
                   hi = c10d__tcp_split(n, pof2, c->vrank + 1);
            if (finish(c, c->buf + bytes_of(c, lo), hi - lo) < 0)
                return;
        }
        ch->step = P_GATHER;
        ch->mask = 1;
        /* fall through */
    case P_GATHER:
        if (ch->mask < pof2) {
            int m = ch->mask;
            int mine = c->vrank & ~(m - 1), theirs = mine ^ m;
            int peer = real_rank(c, c->vrank ^ m);
            size_t mlo = c10d__tcp_split(n, pof2, mine), mhi = c10d__tcp_split(n, pof2, mine + m);
            size_t tlo = c10d__tcp_split(n, pof2, theirs),
                   thi = c10d__tcp_split(n, pof2, theirs + m);
            uint32_t sub = SUB_STEP + (uint32_t)ch->k++;
            c10d__tcp_chain_send(ch, peer, sub, c->buf + bytes_of(c, mlo), bytes_of(c, mhi - mlo));
            c10d__tcp_chain_recv(ch, peer, sub, c->buf + bytes_of(c, tlo), bytes_of(c, thi - tlo));
            ch->mask <<= 1;
            return;
        }
        ch->step = P_UNFOLD;
        /* fall through */
    case P_UNFOLD:
        unfold(ch);
        ch->step = P_DONE;
        return;
    default:
        ch->done = 1;
    }
}

/* The ring. Every chunk is cut into nsegs segments; lane l owns segments l,
 * l + nlanes, ... of every chunk and runs the 2(p-1) steps for one segment
 * after another (its `step` counts them), so lanes overlap each other and
 * only nlanes segments are in flight: with small segments a received
 * segment is still in cache when it is reduced and sent on. */
#define RING_MAX_SEGS 4096 /* sub = segment << 12 | step must fit 24 bits */

static void ring_seg(const struct c10d__tcp_coll *c, int chunk, int seg, size_t *off, size_t *cnt)
{
    size_t n = c->op->count;
    size_t clo = c10d__tcp_split(n, c->size, chunk), chi = c10d__tcp_split(n, c->size, chunk + 1);
    size_t lo = clo + c10d__tcp_split(chi - clo, c->nsegs, seg);
    size_t hi = clo + c10d__tcp_split(chi - clo, c->nsegs, seg + 1);
    *off = lo;
    *cnt = hi - lo;
}

static int mod(int a, int p)
{
    return ((a % p) + p) % p;
}

static void ring_step(struct c10d__tcp_chain *ch)
{
    struct c10d__tcp_coll *c = ch->c;
    int p = c->size, r = c->rank, lane = ch->lane;
    if (ch->k >= 2 * (p - 1)) { /* this segment is done: the lane's next one */
        ch->step++;
        ch->k = 0;
    }
    int k = ch->k, seg = lane + ch->step * c->nlanes;
    if (seg >= c->nsegs) {
        ch->done = 1;
        return;
    }
    int right = mod(r + 1, p), left = mod(r - 1, p);
    /* zero-copy: out of place, no premul: receive partial sums straight into
     * recv and combine them with our untouched send buffer. */
    int direct = c->tmp == NULL;
    const char *send = c->op->send;
    size_t so, sc, ro, rcnt;
    uint32_t sub = ((uint32_t)seg << 12) | (uint32_t)k;
    if (k < p - 1) {
        ring_seg(c, mod(r - k, p), seg, &so, &sc);
        ring_seg(c, mod(r - k - 1, p), seg, &ro, &rcnt);
        const char *src = direct && k == 0 ? send : c->buf;
        c10d__tcp_chain_send(ch, right, sub, src + bytes_of(c, so), bytes_of(c, sc));
        if (direct) {
            c10d__tcp_chain_recv(ch, left, sub, c->buf + bytes_of(c, ro), bytes_of(c, rcnt));
            ch->red_dst = c->buf + bytes_of(c, ro);
            ch->red_src = send + bytes_of(c, ro);
        } else {
            char *tmp = c->tmp + bytes_of(c, c->seg_count) * (size_t)lane;
            c10d__tcp_chain_recv(ch, left, sub, tmp, bytes_of(c, rcnt));
            ch->red_dst = c->buf + bytes_of(c, ro);
            ch->red_src = tmp;
        }
        ch->red_count = rcnt;
    } else {
        int j = k - (p - 1);
        if (j == 0) {
            ring_seg(c, mod(r + 1, p), seg, &so, &sc);
            if (finish(c, c->buf + bytes_of(c, so), sc) < 0)
                return;
        }
        ring_seg(c, mod(r + 1 - j, p), seg, &so, &sc);
        ring_seg(c, mod(r - j, p), seg, &ro, &rcnt);
        c10d__tcp_chain_send(ch, right, sub, c->buf + bytes_of(c, so), bytes_of(c, sc));
        c10d__tcp_chain_recv(ch, left, sub, c->buf + bytes_of(c, ro), bytes_of(c, rcnt));
    }
    ch->k++;
}

int c10d__tcp_all_reduce(struct c10d__tcp_coll *c)
{
    struct c10d__op *op = c->op;
    size_t n = op->count, bytes = n * c->esz;
    int premul = op->redop == C10D_PREMUL_SUM;
    c->buf = op->recv;
    int ring = c->size > 1 && n >= (size_t)c->size &&
               (bytes >= c->tune->ring_min || (c->size == 2 && bytes > c->tune->rd_max));
    if (ring && op->send != op->recv && !premul) {
        /* The zero-copy ring reads the send buffer itself. */
        c->tmp = NULL;
    } else {
        if (op->send != op->recv && bytes > 0)
            memcpy(c->buf, op->send, bytes);
        if (premul)
            C10D_CHECK(c10d__reduce_premul(c->buf, n, op->dtype, op->premul_factor));
    }
    if (c->size == 1 || n == 0) {
        C10D_CHECK(c10d__reduce_finish(c->buf, n, op->dtype, op->redop, c->size));
        c10d__tcp_coll_start(c, 0, NULL);
        return 0;
    }
    if (ring) {
        size_t chunk = bytes_of(c, (n + (size_t)c->size - 1) / (size_t)c->size);
        size_t segs = chunk / (c->tune->segment ? c->tune->segment : 1);
        if (segs < 2)
            segs = 2;
        if (segs > RING_MAX_SEGS)
            segs = RING_MAX_SEGS;
        size_t lanes = segs < C10D_TCP_MAX_CHAINS ? segs : C10D_TCP_MAX_CHAINS;
        c->nsegs = (int)segs;
        c->nlanes = (int)lanes;
        c->seg_count = (n + (size_t)c->size - 1) / (size_t)c->size / segs + 1;
        if (!(op->send != op->recv && !premul)) {
            c->tmp = c->scratch(c, bytes_of(c, c->seg_count) * lanes);
            if (c->tmp == NULL)
                return c10d__fail(C10D_ENOMEM, "tcp ALLREDUCE: out of memory for %zu bytes",
                                  bytes_of(c, c->seg_count) * lanes);
        }
        c10d__tcp_coll_start(c, c->nlanes, ring_step);
        return 0;
    }
    fold_setup(c);
    c->tmp = c->scratch(c, bytes);
    if (c->tmp == NULL)
        return c10d__fail(C10D_ENOMEM, "tcp ALLREDUCE: out of memory for %zu bytes", bytes);
    if (bytes <= c->tune->rd_max || n < (size_t)c->pof2)
        c10d__tcp_coll_start(c, 1, rd_step);
    else
        c10d__tcp_coll_start(c, 1, rh_step);
    return 0;
}
