/* How the tcp backend runs one collective: a few "chains", each a small state
 * machine that posts sends and receives for a step and is called again once
 * all of them completed. A single chain is a lock-step algorithm (recursive
 * doubling, trees); several chains are independent pipelines over segments
 * of the buffer (the ring), so one segment's reduction overlaps the others'
 * transfers. The collective is done when every chain is. */
#ifndef C10D_BACKENDS_TCP_COLL_H
#define C10D_BACKENDS_TCP_COLL_H

#include "backends/backend.h"
#include "transport.h"

#include <stddef.h>
#include <stdint.h>

#define C10D_TCP_MAX_CHAINS 8

struct c10d__tcp_coll;

struct c10d__tcp_chain {
    struct c10d__tcp_coll *c;
    void (*fn)(struct c10d__tcp_chain *ch);
    int pending; /* transfers posted and not complete */
    int running; /* inside fn: completions only count down */
    int done;    /* fn sets it when the chain has nothing left to do */
    int step;    /* the algorithm's phase */
    int lane;
    uint32_t nsub; /* messages numbered so far (the next sub) */
    int mask;
    int k;
    /* A reduction to do once this step's transfers are in: dst = op(dst, src). */
    void *red_dst;
    const void *red_src;
    size_t red_count;
};

/* Thresholds and sizes (from the environment; see docs/algorithms.md). */
struct c10d__tcp_tuning {
    size_t rd_max;   /* all_reduce: recursive doubling up to this many bytes */
    size_t ring_min; /* all_reduce: pipelined ring from this many bytes */
    size_t segment;  /* ring segment size */
};

struct c10d__tcp_coll {
    /* The rail of lane 0. With several rails (rails.h), lane l of op `seq`
     * runs on rails[(seq + l) % nrails] on every rank alike, so the lanes of
     * one large op move over every interface at once; nrails 0: all on t. */
    struct c10d__tcp_transport *t;
    struct c10d__tcp_transport *const *rails;
    int nrails;
    const struct c10d__tcp_tuning *tune;
    struct c10d__op *op;
    int rank, size;
    /* The ranks taking part, by their index (rank/size count among them):
     * NULL for the whole group; a host-aware op's leaders (hier.h). */
    const int *members;
    uint32_t sub_base;  /* distinguishes the members of a coalesced list */
    struct c10d__fp fp; /* the op's fingerprint, carried by every frame */
    size_t esz;
    int nchains, chains_left;
    struct c10d__tcp_chain chains[C10D_TCP_MAX_CHAINS];
    /* Scratch owned by the backend (grown on demand, kept between ops). */
    char *(*scratch)(struct c10d__tcp_coll *c, size_t bytes);
    void *scratch_arg;
    /* Called when every chain is done (or at once if the algorithm posted
     * nothing); status < 0 with c10d_last_error on a local failure. */
    void (*finished)(struct c10d__tcp_coll *c, int status);
    int failed;
    /* Algorithm state. */
    char *buf, *tmp, *tmp2;
    int vrank, pof2, rem, mask;
    int nblocks;
    size_t lo, hi; /* element range (halving) */
    size_t seg_count;
    int nlanes;
    int nsegs; /* ring: segments per chunk, run nlanes at a time */
};

/* Posting from a chain's step function. `sub` is the message's number within
 * the op (< 2^24), the same on sender and receiver. */
void c10d__tcp_chain_send(struct c10d__tcp_chain *ch, int peer, uint32_t sub, const void *buf,
                          size_t bytes);
void c10d__tcp_chain_recv(struct c10d__tcp_chain *ch, int peer, uint32_t sub, void *buf,
                          size_t bytes);
/* Starts `n` chains running `fn` (lane = index) and returns; they complete
 * through c->finished. */
void c10d__tcp_coll_start(struct c10d__tcp_coll *c, int n, void (*fn)(struct c10d__tcp_chain *));
/* dst = op(dst, src) with the op's reduce op; on failure fails the collective. */
int c10d__tcp_coll_reduce(struct c10d__tcp_coll *c, void *dst, const void *src, size_t count);

/* The transport a chain's messages travel on (see rails above). */
static inline struct c10d__tcp_transport *c10d__tcp_chain_rail(const struct c10d__tcp_chain *ch)
{
    const struct c10d__tcp_coll *c = ch->c;
    if (c->nrails <= 1)
        return c->t;
    return c->rails[(c->op->seq + (uint64_t)ch->lane) % (uint64_t)c->nrails];
}

/* Start functions, one per op kind: each sets up its chains (or finishes at
 * once) and returns 0, or an error before anything was posted. */
int c10d__tcp_all_reduce(struct c10d__tcp_coll *c);
int c10d__tcp_broadcast(struct c10d__tcp_coll *c);
int c10d__tcp_reduce(struct c10d__tcp_coll *c);
int c10d__tcp_all_gather(struct c10d__tcp_coll *c);
int c10d__tcp_gather(struct c10d__tcp_coll *c);
int c10d__tcp_scatter(struct c10d__tcp_coll *c);
int c10d__tcp_reduce_scatter(struct c10d__tcp_coll *c);
int c10d__tcp_all_to_all(struct c10d__tcp_coll *c);
int c10d__tcp_barrier(struct c10d__tcp_coll *c);

/* Element i's byte offset when `count` elements are split into `parts` near
 * equal blocks: block b is [split(b), split(b + 1)). */
static inline size_t c10d__tcp_split(size_t count, int parts, int b)
{
    return (size_t)((unsigned __int128)count * (unsigned)b / (unsigned)parts);
}

#endif
