/* Collectives where every rank ends with something different from every
 * other: ring all_gather, ring reduce_scatter, pairwise all_to_all, and the
 * dissemination barrier. */
#include "coll.h"

#include "engine/error.h"
#include "engine/kernels/reduce.h"

#include <string.h>

static int mod(int a, int p)
{
    return ((a % p) + p) % p;
}

/* ---------------------------------------------------------- all_gather */

static char *gather_block(const struct c10d__tcp_coll *c, int i)
{
    const struct c10d__op *op = c->op;
    if (op->recvs != NULL)
        return op->recvs[i];
    return (char *)op->recv + (size_t)i * op->count * c->esz;
}

/* Large blocks run as several lanes, one per segment of every block, each
 * advancing through the ring on its own (as the all_reduce ring). */
static int exchange_lanes(const struct c10d__tcp_coll *c, size_t n)
{
    size_t lanes = n * c->esz / (c->tune->segment ? c->tune->segment : 1);
    if (lanes > C10D_TCP_MAX_CHAINS)
        lanes = C10D_TCP_MAX_CHAINS;
    if (lanes > n)
        lanes = n;
    return lanes < 1 ? 1 : (int)lanes;
}

static void lane_seg(const struct c10d__tcp_coll *c, int lane, size_t *lo, size_t *cnt)
{
    size_t n = c->op->count;
    size_t a = c10d__tcp_split(n, c->nlanes, lane), b = c10d__tcp_split(n, c->nlanes, lane + 1);
    *lo = a * c->esz;
    *cnt = b - a;
}

static void all_gather_step(struct c10d__tcp_chain *ch)
{
    struct c10d__tcp_coll *c = ch->c;
    int p = c->size, r = c->rank, k = ch->k;
    size_t lo, cnt;
    lane_seg(c, ch->lane, &lo, &cnt);
    size_t bytes = cnt * c->esz;
    uint32_t sub = ((uint32_t)ch->lane << 12) | (uint32_t)k;
    if (k >= p - 1) {
        ch->done = 1;
        return;
    }
    c10d__tcp_chain_send(ch, mod(r + 1, p), sub, gather_block(c, mod(r - k, p)) + lo, bytes);
    c10d__tcp_chain_recv(ch, mod(r - 1, p), sub, gather_block(c, mod(r - k - 1, p)) + lo, bytes);
    ch->k++;
}

int c10d__tcp_all_gather(struct c10d__tcp_coll *c)
{
    struct c10d__op *op = c->op;
    size_t bytes = op->count * c->esz;
    char *mine = gather_block(c, c->rank);
    if (mine != op->send && bytes > 0)
        memmove(mine, op->send, bytes);
    if (c->size == 1 || bytes == 0) {
        c10d__tcp_coll_start(c, 0, NULL);
        return 0;
    }
    c->nlanes = exchange_lanes(c, op->count);
    c10d__tcp_coll_start(c, c->nlanes, all_gather_step);
    return 0;
}

/* ------------------------------------------------------ reduce_scatter */

static const char *rs_block(const struct c10d__tcp_coll *c, int i)
{
    const struct c10d__op *op = c->op;
    if (op->sends != NULL)
        return op->sends[i];
    return (const char *)op->send + (size_t)i * op->count * c->esz;
}

static int rs_fail(struct c10d__tcp_coll *c, int rc)
{
    if (!c->failed) {
        c->failed = 1;
        c->finished(c, rc);
    }
    return rc;
}

/* This lane's segment of our own contribution to block b, PREMUL_SUM's
 * factor applied on a copy (the user's send buffer is never written). */
static const char *rs_own(struct c10d__tcp_coll *c, char *scratch, int b, size_t lo, size_t cnt)
{
    const struct c10d__op *op = c->op;
    const char *own = rs_block(c, b) + lo;
    if (op->redop != C10D_PREMUL_SUM)
        return own;
    memcpy(scratch, own, cnt * c->esz);
    if (c10d__reduce_premul(scratch, cnt, op->dtype, op->premul_factor) < 0) {
        rs_fail(c, C10D_EINVAL);
        return NULL;
    }
    return scratch;
}

/* Block b's partial sum starts at rank b + 1 and travels the ring, each rank
 * adding its own contribution, until it ends at rank b: one fixed order. At
 * step k rank r sends block r - k - 1 and receives block r - k - 2. Per lane,
 * two buffers alternate (what arrived at step k leaves at step k + 1) and a
 * third holds our scaled contribution for PREMUL_SUM. */
static void reduce_scatter_step(struct c10d__tcp_chain *ch)
{
    struct c10d__tcp_coll *c = ch->c;
    struct c10d__op *op = c->op;
    int p = c->size, r = c->rank, k = ch->k;
    size_t lo, cnt;
    lane_seg(c, ch->lane, &lo, &cnt);
    size_t seg = c->seg_count * c->esz, bytes = cnt * c->esz;
    char *in[2] = {c->tmp + (size_t)ch->lane * 3 * seg, c->tmp + (size_t)ch->lane * 3 * seg + seg};
    char *scaled = in[1] + seg;
    uint32_t sub = ((uint32_t)ch->lane << 12) | (uint32_t)k;
    if (k > 0) {
        /* The data of step k - 1 is in: add our contribution. */
        const char *own = rs_own(c, scaled, mod(r - k - 1, p), lo, cnt);
        if (own == NULL || c10d__tcp_coll_reduce(c, in[(k - 1) % 2], own, cnt) < 0)
            return;
    }
    if (k == p - 1) {
        char *last = in[(k - 1) % 2];
        int rc = c10d__reduce_finish(last, cnt, op->dtype, op->redop, p);
        if (rc < 0) {
            rs_fail(c, rc);
            return;
        }
        if (bytes > 0)
            memcpy((char *)op->recv + lo, last, bytes);
        ch->done = 1;
        return;
    }
    const char *src = k == 0 ? rs_own(c, scaled, mod(r - 1, p), lo, cnt) : in[(k - 1) % 2];
    if (src == NULL)
        return;
    c10d__tcp_chain_send(ch, mod(r + 1, p), sub, src, bytes);
    c10d__tcp_chain_recv(ch, mod(r - 1, p), sub, in[k % 2], bytes);
    ch->k++;
}

int c10d__tcp_reduce_scatter(struct c10d__tcp_coll *c)
{
    struct c10d__op *op = c->op;
    size_t n = op->count, bytes = n * c->esz;
    if (c->size == 1 || n == 0) {
        const char *own = rs_block(c, c->rank);
        if (own != op->recv && bytes > 0)
            memmove(op->recv, own, bytes);
        if (op->redop == C10D_PREMUL_SUM)
            C10D_CHECK(c10d__reduce_premul(op->recv, n, op->dtype, op->premul_factor));
        C10D_CHECK(c10d__reduce_finish(op->recv, n, op->dtype, op->redop, c->size));
        c10d__tcp_coll_start(c, 0, NULL);
        return 0;
    }
    c->nlanes = exchange_lanes(c, n);
    c->seg_count = n / (size_t)c->nlanes + 1;
    size_t need = (size_t)c->nlanes * 3 * c->seg_count * c->esz;
    c->tmp = c->scratch(c, need);
    if (c->tmp == NULL)
        return c10d__fail(C10D_ENOMEM, "tcp REDUCE_SCATTER: out of memory for %zu bytes", need);
    c10d__tcp_coll_start(c, c->nlanes, reduce_scatter_step);
    return 0;
}

/* --------------------------------------------------------- all_to_all */

static size_t a2a_count(const struct c10d__tcp_coll *c, const size_t *counts, int i)
{
    return counts != NULL ? counts[i] : c->op->count / (size_t)c->size;
}

static size_t a2a_offset(const struct c10d__tcp_coll *c, const size_t *counts, int i)
{
    if (counts == NULL)
        return (size_t)i * (c->op->count / (size_t)c->size);
    size_t off = 0;
    for (int j = 0; j < i; j++)
        off += counts[j];
    return off;
}

static int ranges_meet(const char *a, size_t an, const char *b, size_t bn)
{
    return an > 0 && bn > 0 && a < b + bn && b < a + an;
}

/* Whether some send block overlaps some receive block. One buffer each:
 * their blocks tile them, so the buffers meeting is the blocks meeting.
 * Lists: every pair, once the lists' hulls meet. */
static int a2a_overlaps(const struct c10d__tcp_coll *c)
{
    const struct c10d__op *op = c->op;
    int p = c->size;
    size_t st = 0, rt = 0;
    for (int i = 0; i < p; i++) {
        st += a2a_count(c, op->send_counts, i);
        rt += a2a_count(c, op->recv_counts, i);
    }
    if (op->sends == NULL)
        return ranges_meet(op->send, st * c->esz, op->recv, rt * c->esz);
    const char *slo = NULL, *shi = NULL, *rlo = NULL, *rhi = NULL;
    for (int i = 0; i < p; i++) {
        size_t sb = a2a_count(c, op->send_counts, i) * c->esz;
        size_t rb = a2a_count(c, op->recv_counts, i) * c->esz;
        const char *s = op->sends[i], *r = op->recvs[i];
        if (sb > 0 && (slo == NULL || s < slo))
            slo = s;
        if (sb > 0 && (shi == NULL || s + sb > shi))
            shi = s + sb;
        if (rb > 0 && (rlo == NULL || r < rlo))
            rlo = r;
        if (rb > 0 && (rhi == NULL || r + rb > rhi))
            rhi = r + rb;
    }
    if (slo == NULL || rlo == NULL ||
        !ranges_meet(slo, (size_t)(shi - slo), rlo, (size_t)(rhi - rlo)))
        return 0;
    for (int i = 0; i < p; i++)
        for (int j = 0; j < p; j++)
            if (ranges_meet(op->sends[i], a2a_count(c, op->send_counts, i) * c->esz, op->recvs[j],
                            a2a_count(c, op->recv_counts, j) * c->esz))
                return 1;
    return 0;
}

static const char *a2a_send(const struct c10d__tcp_coll *c, int i)
{
    const struct c10d__op *op = c->op;
    if (c->tmp != NULL)
        return c->tmp + a2a_offset(c, op->send_counts, i) * c->esz;
    if (op->sends != NULL)
        return op->sends[i];
    return (const char *)op->send + a2a_offset(c, op->send_counts, i) * c->esz;
}

static char *a2a_recv(const struct c10d__tcp_coll *c, int i)
{
    const struct c10d__op *op = c->op;
    if (op->recvs != NULL)
        return op->recvs[i];
    return (char *)op->recv + a2a_offset(c, op->recv_counts, i) * c->esz;
}

/* Pairwise: at distance d rank r sends to r + d and receives from r - d, so
 * every rank talks to a different partner at the same time. All distances are
 * posted at once: their buffers are disjoint. */
static void all_to_all_step(struct c10d__tcp_chain *ch)
{
    struct c10d__tcp_coll *c = ch->c;
    int p = c->size, r = c->rank;
    if (ch->step++ > 0) {
        ch->done = 1;
        return;
    }
    for (int d = 1; d < p; d++) {
        int to = mod(r + d, p), from = mod(r - d, p);
        c10d__tcp_chain_recv(ch, from, 0, a2a_recv(c, from),
                             a2a_count(c, c->op->recv_counts, from) * c->esz);
        c10d__tcp_chain_send(ch, to, 0, a2a_send(c, to),
                             a2a_count(c, c->op->send_counts, to) * c->esz);
    }
}

int c10d__tcp_all_to_all(struct c10d__tcp_coll *c)
{
    struct c10d__op *op = c->op;
    int p = c->size;
    /* In place (some send block overlaps some receive block: every transfer
     * is posted at once, so a receive may land before the send of those
     * bytes went out): work from a copy. */
    c->tmp = NULL;
    int overlap = a2a_overlaps(c);
    if (overlap) {
        size_t total = 0;
        for (int i = 0; i < p; i++)
            total += a2a_count(c, op->send_counts, i);
        char *copy = c->scratch(c, total * c->esz);
        if (copy == NULL && total > 0)
            return c10d__fail(C10D_ENOMEM, "tcp ALLTOALL: out of memory for %zu bytes",
                              total * c->esz);
        for (int i = 0; i < p; i++) {
            const char *src = op->sends != NULL ? op->sends[i]
                                                : (const char *)op->send +
                                                      a2a_offset(c, op->send_counts, i) * c->esz;
            size_t len = a2a_count(c, op->send_counts, i) * c->esz;
            if (len > 0)
                memcpy(copy + a2a_offset(c, op->send_counts, i) * c->esz, src, len);
        }
        c->tmp = copy;
    }
    size_t mine = a2a_count(c, op->send_counts, c->rank) * c->esz;
    size_t room = a2a_count(c, op->recv_counts, c->rank) * c->esz;
    if (mine > room)
        return c10d__fail(C10D_EINVAL,
                          "tcp all_to_all: this rank sends itself %zu bytes but receives %zu", mine,
                          room);
    if (mine > 0)
        memmove(a2a_recv(c, c->rank), a2a_send(c, c->rank), mine);
    if (p == 1) {
        c10d__tcp_coll_start(c, 0, NULL);
        return 0;
    }
    c10d__tcp_coll_start(c, 1, all_to_all_step);
    return 0;
}

/* ------------------------------------------------------------ barrier */

/* Dissemination: in round k everyone signals r + 2^k and waits for r - 2^k;
 * after ceil(log2 p) rounds everyone has heard, transitively, from everyone. */
static void barrier_step(struct c10d__tcp_chain *ch)
{
    struct c10d__tcp_coll *c = ch->c;
    int p = c->size, r = c->rank;
    int dist = 1 << ch->k;
    if (dist >= p) {
        ch->done = 1;
        return;
    }
    c10d__tcp_chain_send(ch, mod(r + dist, p), (uint32_t)ch->k, NULL, 0);
    c10d__tcp_chain_recv(ch, mod(r - dist, p), (uint32_t)ch->k, NULL, 0);
    ch->k++;
}

int c10d__tcp_barrier(struct c10d__tcp_coll *c)
{
    c10d__tcp_coll_start(c, c->size > 1 ? 1 : 0, barrier_step);
    return 0;
}
