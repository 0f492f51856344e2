/* Rooted collectives: binomial-tree broadcast and reduce (large buffers run
 * as several lanes, one per segment, so a segment moves down or up the tree
 * while the next one is still arriving), direct gather and scatter. */
#include "coll.h"

#include "engine/error.h"
#include "engine/kernels/reduce.h"

#include <string.h>

static int vrank_of(const struct c10d__tcp_coll *c)
{
    return (c->rank - c->op->root + c->size) % c->size;
}

static int real_of(const struct c10d__tcp_coll *c, int v)
{
    return (v + c->op->root) % c->size;
}

static int lanes_for(const struct c10d__tcp_coll *c, size_t bytes, size_t n)
{
    size_t lanes = bytes / (c->tune->segment ? c->tune->segment : 1);
    if (lanes > C10D_TCP_MAX_CHAINS)
        lanes = C10D_TCP_MAX_CHAINS;
    if (lanes > n)
        lanes = n;
    return lanes < 1 ? 1 : (int)lanes;
}

static void lane_range(const struct c10d__tcp_coll *c, int lane, size_t *off, size_t *cnt)
{
    size_t n = c->op->count;
    size_t lo = c10d__tcp_split(n, c->nlanes, lane), hi = c10d__tcp_split(n, c->nlanes, lane + 1);
    *off = lo * c->esz;
    *cnt = hi - lo;
}

/* Highest power of two not above x (x >= 1). */
static int top_bit(int x)
{
    int m = 1;
    while (m * 2 <= x)
        m *= 2;
    return m;
}

static void bcast_step(struct c10d__tcp_chain *ch)
{
    struct c10d__tcp_coll *c = ch->c;
    int vr = vrank_of(c);
    size_t off, cnt;
    lane_range(c, ch->lane, &off, &cnt);
    size_t bytes = cnt * c->esz;
    switch (ch->step) {
    case 0:
        ch->step = 1;
        if (vr != 0) {
            int parent = real_of(c, vr - (vr & -vr));
            c10d__tcp_chain_recv(ch, parent, (uint32_t)ch->lane, c->buf + off, bytes);
            return;
        }
        /* fall through */
    case 1: {
        int m = vr != 0 ? (vr & -vr) / 2 : top_bit(c->size - 1);
        const char *src = vr == 0 ? (const char *)c->op->send : c->buf;
        for (; m >= 1; m /= 2)
            if (vr + m < c->size)
                c10d__tcp_chain_send(ch, real_of(c, vr + m), (uint32_t)ch->lane, src + off, bytes);
        ch->step = 2;
        return;
    }
    default:
        ch->done = 1;
    }
}

int c10d__tcp_broadcast(struct c10d__tcp_coll *c)
{
    struct c10d__op *op = c->op;
    size_t bytes = op->count * c->esz;
    c->buf = op->recv;
    if (c->rank == op->root && op->recv != NULL && op->recv != op->send && bytes > 0)
        memcpy(op->recv, op->send, bytes);
    if (c->size == 1 || bytes == 0) {
        c10d__tcp_coll_start(c, 0, NULL);
        return 0;
    }
    c->nlanes = lanes_for(c, bytes, op->count);
    c10d__tcp_coll_start(c, c->nlanes, bcast_step);
    return 0;
}

/* Children are combined in ascending distance, so the order of every
 * element's reduction is fixed by the tree alone. */
static void reduce_step(struct c10d__tcp_chain *ch)
{
    struct c10d__tcp_coll *c = ch->c;
    int vr = vrank_of(c);
    size_t off, cnt;
    lane_range(c, ch->lane, &off, &cnt);
    size_t bytes = cnt * c->esz;
    if (ch->step == 0) {
        ch->step = 1;
        ch->mask = 1;
    }
    if (ch->step == 2) {
        ch->done = 1;
        return;
    }
    for (; ch->mask < c->size; ch->mask *= 2) {
        int m = ch->mask;
        if (vr & m) {
            c10d__tcp_chain_send(ch, real_of(c, vr - m), (uint32_t)ch->lane, c->buf + off, bytes);
            ch->step = 2;
            return;
        }
        if (vr + m < c->size) {
            c10d__tcp_chain_recv(ch, real_of(c, vr + m), (uint32_t)ch->lane, c->tmp + off, bytes);
            ch->red_dst = c->buf + off;
            ch->red_src = c->tmp + off;
            ch->red_count = cnt;
            ch->mask *= 2;
            return;
        }
    }
    if (vr == 0) {
        int rc = c10d__reduce_finish(c->buf + off, cnt, c->op->dtype, c->op->redop, c->size);
        if (rc < 0 && !c->failed) {
            c->failed = 1;
            c->finished(c, rc);
            return;
        }
    }
    ch->done = 1;
}

int c10d__tcp_reduce(struct c10d__tcp_coll *c)
{
    struct c10d__op *op = c->op;
    size_t n = op->count, bytes = n * c->esz;
    int root = c->rank == op->root;
    int leaf = vrank_of(c) % 2 == 1 || c->size == 1; /* sends its own input untouched */
    int premul = op->redop == C10D_PREMUL_SUM;
    if (root) {
        c->buf = op->recv;
    } else if (leaf && !premul) {
        c->buf = (char *)op->send;
    } else {
        c->buf = c->scratch(c, 2 * bytes);
        if (c->buf == NULL && bytes > 0)
            return c10d__fail(C10D_ENOMEM, "tcp REDUCE: out of memory for %zu bytes", 2 * bytes);
    }
    if (c->buf != op->send && bytes > 0)
        memcpy(c->buf, op->send, bytes);
    if (premul)
        C10D_CHECK(c10d__reduce_premul(c->buf, n, op->dtype, op->premul_factor));
    if (!leaf) {
        c->tmp = root ? c->scratch(c, bytes) : c->buf + bytes;
        if (c->tmp == NULL && bytes > 0)
            return c10d__fail(C10D_ENOMEM, "tcp REDUCE: out of memory for %zu bytes", bytes);
    }
    if (c->size == 1 || n == 0) {
        if (root)
            C10D_CHECK(c10d__reduce_finish(c->buf, n, op->dtype, op->redop, c->size));
        c10d__tcp_coll_start(c, 0, NULL);
        return 0;
    }
    c->nlanes = lanes_for(c, bytes, n);
    c10d__tcp_coll_start(c, c->nlanes, reduce_step);
    return 0;
}

static void gather_step(struct c10d__tcp_chain *ch)
{
    struct c10d__tcp_coll *c = ch->c;
    struct c10d__op *op = c->op;
    size_t bytes = op->count * c->esz;
    if (ch->step++ > 0) {
        ch->done = 1;
        return;
    }
    if (c->rank != op->root) {
        c10d__tcp_chain_send(ch, op->root, 0, op->send, bytes);
        return;
    }
    for (int i = 0; i < c->size; i++)
        if (i != c->rank)
            c10d__tcp_chain_recv(ch, i, 0, (char *)op->recv + (size_t)i * bytes, bytes);
}

int c10d__tcp_gather(struct c10d__tcp_coll *c)
{
    struct c10d__op *op = c->op;
    size_t bytes = op->count * c->esz;
    if (c->rank == op->root) {
        char *mine = (char *)op->recv + (size_t)c->rank * bytes;
        if (mine != op->send && bytes > 0)
            memmove(mine, op->send, bytes);
    }
    if (c->size == 1 || bytes == 0) {
        c10d__tcp_coll_start(c, 0, NULL);
        return 0;
    }
    c10d__tcp_coll_start(c, 1, gather_step);
    return 0;
}

static void scatter_step(struct c10d__tcp_chain *ch)
{
    struct c10d__tcp_coll *c = ch->c;
    struct c10d__op *op = c->op;
    size_t bytes = op->count * c->esz;
    if (ch->step++ > 0) {
        ch->done = 1;
        return;
    }
    if (c->rank != op->root) {
        c10d__tcp_chain_recv(ch, op->root, 0, op->recv, bytes);
        return;
    }
    /* Farthest ranks first would not help on a flat tree; rank order it is. */
    for (int i = 1; i < c->size; i++) {
        int dst = (c->rank + i) % c->size;
        c10d__tcp_chain_send(ch, dst, 0, (const char *)op->send + (size_t)dst * bytes, bytes);
    }
}

int c10d__tcp_scatter(struct c10d__tcp_coll *c)
{
    struct c10d__op *op = c->op;
    size_t bytes = op->count * c->esz;
    if (c->rank == op->root) {
        const char *mine = (const char *)op->send + (size_t)c->rank * bytes;
        if (mine != op->recv && bytes > 0)
            memmove(op->recv, mine, bytes);
    }
    if (c->size == 1 || bytes == 0) {
        c10d__tcp_coll_start(c, 0, NULL);
        return 0;
    }
    c10d__tcp_coll_start(c, 1, scatter_step);
    return 0;
}
