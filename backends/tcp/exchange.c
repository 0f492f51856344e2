/* Collectives where every rank ends with something different from every
 * other: ring all_gather, ring reduce_scatter, pairwise all_to_all, and the
 * dissemination barrier. */
#include "coll.h"

#include "engine/error.h"
#include "engine/reduce.h"

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

static void all_gather_step(struct c10d__tcp_chain *ch)
{
    struct c10d__tcp_coll *c = ch->c;
    int p = c->size, r = c->rank, k = ch->k;
    size_t bytes = c->op->count * c->esz;
    if (k >= p - 1) {
        ch->done = 1;
        return;
    }
    c10d__tcp_chain_send(ch, mod(r + 1, p), (uint32_t)k, gather_block(c, mod(r - k, p)), bytes);
    c10d__tcp_chain_recv(ch, mod(r - 1, p), (uint32_t)k, gather_block(c, mod(r - k - 1, p)), bytes);
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
    c10d__tcp_coll_start(c, 1, all_gather_step);
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

/* Block b's partial sum starts at rank b + 1 and travels the ring, each rank
 * adding its own contribution, until it ends at rank b: one fixed order. At
 * step k rank r sends block r - k - 1 and receives block r - k - 2. Two
 * buffers alternate: what arrived at step k is what leaves at step k + 1. */
static void reduce_scatter_step(struct c10d__tcp_chain *ch)
{
    struct c10d__tcp_coll *c = ch->c;
    struct c10d__op *op = c->op;
    int p = c->size, r = c->rank, k = ch->k;
    size_t n = op->count, bytes = n * c->esz;
    int premul = op->redop == C10D_PREMUL_SUM;
    if (k == p - 1) {
        char *last = c->tmp + (size_t)((k - 1) % 2) * bytes;
        int rc = c10d__reduce_finish(last, n, op->dtype, op->redop, p);
        if (rc < 0) {
            c->failed = 1;
            c->finished(c, rc);
            return;
        }
        memcpy(op->recv, last, bytes);
        ch->done = 1;
        return;
    }
    const char *src;
    if (k == 0) {
        src = rs_block(c, mod(r - 1, p));
        if (premul) {
            memcpy(c->tmp2, src, bytes);
            int rc = c10d__reduce_premul(c->tmp2, n, op->dtype, op->premul_factor);
            if (rc < 0) {
                c->failed = 1;
                c->finished(c, rc);
                return;
            }
            src = c->tmp2;
        }
    } else {
        src = c->tmp + (size_t)((k - 1) % 2) * bytes;
    }
    char *in = c->tmp + (size_t)(k % 2) * bytes;
    c10d__tcp_chain_send(ch, mod(r + 1, p), (uint32_t)k, src, bytes);
    c10d__tcp_chain_recv(ch, mod(r - 1, p), (uint32_t)k, in, bytes);
    const char *own = rs_block(c, mod(r - k - 2, p));
    if (premul) {
        /* tmp2 was sent at step 0 and is free once that step is done; the
         * reduction below runs after this step's transfers. */
        ch->red_src = NULL;
        ch->mask = mod(r - k - 2, p) + 1; /* remembered for the premul copy */
    } else {
        ch->red_src = own;
    }
    ch->red_dst = premul ? NULL : in;
    ch->red_count = n;
    ch->k++;
}

/* PREMUL_SUM needs our contribution scaled before it is added: do that copy
 * when the step's data is in, then add. */
static void reduce_scatter_premul_step(struct c10d__tcp_chain *ch)
{
    struct c10d__tcp_coll *c = ch->c;
    struct c10d__op *op = c->op;
    if (ch->mask > 0 && !c->failed) {
        size_t n = op->count, bytes = n * c->esz;
        char *in = c->tmp + (size_t)((ch->k - 1) % 2) * bytes;
        memcpy(c->tmp2, rs_block(c, ch->mask - 1), bytes);
        if (c10d__reduce_premul(c->tmp2, n, op->dtype, op->premul_factor) < 0 ||
            c10d__tcp_coll_reduce(c, in, c->tmp2, n) < 0) {
            if (!c->failed) {
                c->failed = 1;
                c->finished(c, C10D_EINVAL);
            }
            return;
        }
        ch->mask = 0;
    }
    reduce_scatter_step(ch);
}

int c10d__tcp_reduce_scatter(struct c10d__tcp_coll *c)
{
    struct c10d__op *op = c->op;
    size_t n = op->count, bytes = n * c->esz;
    int premul = op->redop == C10D_PREMUL_SUM;
    if (c->size == 1 || n == 0) {
        const char *own = rs_block(c, c->rank);
        if (own != op->recv && bytes > 0)
            memmove(op->recv, own, bytes);
        if (premul)
            C10D_CHECK(c10d__reduce_premul(op->recv, n, op->dtype, op->premul_factor));
        C10D_CHECK(c10d__reduce_finish(op->recv, n, op->dtype, op->redop, c->size));
        c10d__tcp_coll_start(c, 0, NULL);
        return 0;
    }
    c->tmp = c->scratch(c, 3 * bytes);
    if (c->tmp == NULL)
        return c10d__fail(C10D_ENOMEM, "tcp REDUCE_SCATTER: out of memory for %zu bytes",
                          3 * bytes);
    c->tmp2 = c->tmp + 2 * bytes;
    c10d__tcp_coll_start(c, 1, premul ? reduce_scatter_premul_step : reduce_scatter_step);
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
    /* In place (send and receive memory overlap): work from a copy. */
    int overlap = 0;
    if (op->sends != NULL) {
        for (int i = 0; i < p && !overlap; i++)
            for (int j = 0; j < p && !overlap; j++)
                overlap = op->sends[i] == op->recvs[j] && a2a_count(c, op->send_counts, i) > 0;
    } else {
        overlap = op->send == op->recv;
    }
    c->tmp = NULL;
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
