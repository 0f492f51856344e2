/* The chain runner shared by every algorithm (coll.h). */
#include "coll.h"

#include "engine/error.h"
#include "engine/kernels/reduce.h"

static void chain_finished(struct c10d__tcp_chain *ch)
{
    struct c10d__tcp_coll *c = ch->c;
    if (--c->chains_left == 0 && !c->failed)
        c->finished(c, 0);
}

/* Runs the step function until the chain waits for transfers or is done. A
 * transfer that completes inside fn (its data was already here) only counts
 * down; the loop notices. */
static void chain_run(struct c10d__tcp_chain *ch)
{
    struct c10d__tcp_coll *c = ch->c;
    for (;;) {
        if (c->failed || c10d__tcp_transport_failed(c->t) ||
            (c->op->work != NULL && c10d_work_test(c->op->work)))
            return; /* the backend fails the op; buffers are off limits now */
        if (ch->red_dst != NULL) {
            void *dst = ch->red_dst;
            ch->red_dst = NULL;
            if (c10d__tcp_coll_reduce(c, dst, ch->red_src, ch->red_count) < 0)
                return;
        }
        ch->running = 1;
        ch->fn(ch);
        ch->running = 0;
        if (c->failed)
            return;
        if (ch->done) {
            chain_finished(ch);
            return;
        }
        if (ch->pending > 0)
            return;
    }
}

static void xfer_done(struct c10d__tcp_xfer *x)
{
    struct c10d__tcp_chain *ch = x->ctx;
    c10d__tcp_xfer_put(c10d__tcp_chain_rail(ch), x);
    if (--ch->pending == 0 && !ch->running)
        chain_run(ch);
}

static struct c10d__tcp_xfer *chain_xfer(struct c10d__tcp_chain *ch, int peer, uint32_t sub,
                                         void *buf, size_t bytes)
{
    struct c10d__tcp_coll *c = ch->c;
    struct c10d__tcp_xfer *x = c10d__tcp_xfer_get(c10d__tcp_chain_rail(ch));
    if (x == NULL) {
        c->failed = 1;
        c10d__fail(C10D_ENOMEM, "tcp: out of memory");
        c->finished(c, C10D_ENOMEM);
        return NULL;
    }
    x->peer = c->members != NULL ? c->members[peer] : peer;
    /* The collective the user called, as its fingerprint says: a step of a
     * host-aware op may run another algorithm (the leaders' all_to_all of an
     * all_gather), and peers compare frames with the op they called. */
    x->kind = c->fp.kind;
    x->sub = c->sub_base | sub;
    x->tag = c->op->seq;
    x->fp = c->fp;
    x->buf = buf;
    x->len = bytes;
    x->work = c->op->work;
    x->done = xfer_done;
    x->ctx = ch;
    ch->pending++;
    return x;
}

void c10d__tcp_chain_send(struct c10d__tcp_chain *ch, int peer, uint32_t sub, const void *buf,
                          size_t bytes)
{
    struct c10d__tcp_xfer *x = chain_xfer(ch, peer, sub, (void *)buf, bytes);
    if (x != NULL)
        c10d__tcp_send(c10d__tcp_chain_rail(ch), x);
}

void c10d__tcp_chain_recv(struct c10d__tcp_chain *ch, int peer, uint32_t sub, void *buf,
                          size_t bytes)
{
    struct c10d__tcp_xfer *x = chain_xfer(ch, peer, sub, buf, bytes);
    if (x != NULL)
        c10d__tcp_recv(c10d__tcp_chain_rail(ch), x);
}

void c10d__tcp_coll_start(struct c10d__tcp_coll *c, int n, void (*fn)(struct c10d__tcp_chain *))
{
    c->nchains = c->chains_left = n;
    if (n == 0) {
        c->finished(c, 0);
        return;
    }
    for (int i = 0; i < n; i++) {
        struct c10d__tcp_chain *ch = &c->chains[i];
        *ch = (struct c10d__tcp_chain){.c = c, .fn = fn, .lane = i};
    }
    for (int i = 0; i < n && !c->failed; i++)
        chain_run(&c->chains[i]);
}

int c10d__tcp_coll_reduce(struct c10d__tcp_coll *c, void *dst, const void *src, size_t count)
{
    int rc = c10d__reduce(dst, src, count, c->op->dtype, c->op->redop);
    if (rc < 0 && !c->failed) {
        c->failed = 1;
        c->finished(c, rc);
    }
    return rc;
}
