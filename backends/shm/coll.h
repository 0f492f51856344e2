/* Collectives through a shared segment (segment.h), each a state machine the
 * loop polls: each call goes as far as the peers let it and returns.
 *
 * An op runs in chunks of at most one slot, and every rank takes part in
 * every chunk: it writes what it contributes into its slot (nothing, for a
 * barrier or a broadcast's non-root), publishes `arrive`, waits for every
 * rank's, checks that all run the same collective, then reads:
 *   all_reduce  small chunks: every rank reduces all slots, in rank order,
 *               into its own output (the same operands in the same order: the
 *               same bits everywhere); large chunks: rank r reduces slice r
 *               of every slot into its own slot, publishes `reduced`, and
 *               every rank copies each slice from the rank that reduced it;
 *   reduce      the root reduces all slots in rank order;
 *   broadcast   every rank copies the root's slot;
 *   all_gather  every rank copies every slot into that rank's block;
 *   reduce_scatter  every rank writes its part of every block into its slot,
 *               then rank r reduces block r of all slots, in rank order;
 *   gather      as all_gather, at the root only;
 *   scatter     the root writes its part of every block into its slot, rank r
 *               copies part r;
 *   all_to_all  every rank writes its part of every block into its slot,
 *               after a header of its send and receive counts; rank r
 *               copies part r of every slot j into block j; every rank
 *               checks every pair's counts at the first chunk and runs as
 *               many chunks as the largest count needs (even splits, counts
 *               and lists alike);
 *   barrier     nothing: arriving was the point.
 * A slot is written again two chunks later, once every rank has arrived at
 * the chunk in between (so it finished reading this one). A large broadcast
 * or all_gather starts with an offer instead: its ranks read each other's
 * buffers in place (in_place.h), or, if one cannot, run the chunks above
 * from the next one on. */
#ifndef C10D_BACKENDS_SHM_COLL_H
#define C10D_BACKENDS_SHM_COLL_H

#include "segment.h"

#include "backends/backend.h"
#include "engine/kernels/reduce.h"

#include <stddef.h>
#include <stdint.h>

/* all_reduce chunks up to this many bytes are reduced whole by every rank
 * (reading every slot); larger ones by slices, one per rank, which reads
 * less but costs a second round of flags. An op that is one chunk in all
 * is reduced whole while its bytes times the ranks stay within
 * C10D_SHM_SMALL_SUM (256 KiB on 2 ranks, 128 KiB on 4): then it runs in
 * the caller's lane, whose saved hand-off outweighs the extra reads. */
#define C10D_SHM_SMALL_MAX (16 * 1024)
#define C10D_SHM_SMALL_SUM (512 * 1024)

/* Whether an all_reduce chunk of `bytes` on `nranks` is reduced whole; `only`:
 * it is the op's only chunk. Inline, as the slice below: an all_reduce read
 * in place (in_place.c, which coll.c calls) cuts its chunks the same way,
 * to the same bits. */
static inline int c10d__shm_small_chunk(size_t bytes, int nranks, int only)
{
    return bytes <= C10D_SHM_SMALL_MAX || (only && bytes * (size_t)nranks <= C10D_SHM_SMALL_SUM);
}

/* Rank r's slice of an all_reduce chunk of n elements that is not reduced
 * whole: elements lo to lo + cnt, which r reduces for every rank. */
static inline void c10d__shm_slice(size_t n, int nranks, int r, size_t *lo, size_t *cnt)
{
    *lo = n * (size_t)r / (size_t)nranks;
    *cnt = n * (size_t)(r + 1) / (size_t)nranks - *lo;
}

struct c10d__shm_coll {
    struct c10d__shm_seg *seg;
    const struct c10d__op *op;
    struct c10d__fp fp;
    size_t esz, chunk_elems, done_elems;
    size_t block_elems; /* elements of one rank's block: what the chunks cover */
    uint64_t gen;       /* the chunk running */
    uint32_t member;
    int phase;
    int counted;      /* all_to_all: block_elems is learnt at chunk 0 */
    const char *copy; /* all_to_all's input, when it overlaps its output */
    /* A one-chunk all_reduce every rank reduces whole: its own short path
     * through the same phases, with the reduction kernel looked up once
     * (NULL: the generic one). */
    int small;
    c10d__reduce_fn kernel;
    size_t per;
    /* While a peer is behind, look whether it announced another collective
     * on every look_every-th call that finds it so (0 or 1: every one);
     * the caller's to set after start. */
    unsigned look_every, waits;
    /* The first chunk is an offer to read in place (in_place.h). */
    int offering;
    /* all_to_all: every rank can read its peers, what is left after the
     * first chunk is read in place. */
    int rest_in_place;
    /* all_to_all: a rank sent its first chunk empty, another cannot read in
     * place: the op runs again through the slots, no offer. */
    int slots_only;
    /* Whether the op's buffers are still its own (its work not completed
     * otherwise, as by its deadline): checked before this rank lets its
     * peers stop reading them. Start sets it to look at op->work (none:
     * always live); a test may replace it. */
    int (*live)(void *arg);
    void *live_arg;
};

/* Whether `op` runs on a segment with slots of `slot_bytes` for `nranks`
 * ranks (its kind and form; the rest on tcp). */
int c10d__shm_coll_supports(const struct c10d__op *op, size_t slot_bytes, int nranks);
/* Sets up `a` for `op` (checked by the caller and announced as `member` of
 * its seq). */
void c10d__shm_coll_start(struct c10d__shm_coll *a, struct c10d__shm_seg *seg,
                          const struct c10d__op *op, uint32_t member, const struct c10d__fp *fp);
/* An all_to_all whose input and output overlap must read its input
 * from a copy (a chunk's output would overwrite input a later chunk sends):
 * the bytes it needs, 0 if none. The caller then hands that much memory,
 * kept until the op ends, to set_copy, which fills it. */
size_t c10d__shm_coll_copy_bytes(const struct c10d__shm_coll *a);
void c10d__shm_coll_set_copy(struct c10d__shm_coll *a, void *copy);
/* Goes on as far as the peers allow: 1 done, 0 waiting for a peer, < 0
 * failed (c10d_last_error: a peer runs a different collective, or a
 * reduction the kernels refuse). *moved: it got further this call. */
int c10d__shm_coll_progress(struct c10d__shm_coll *a, int *moved);
/* Whether op runs on the segment (c10d__shm_coll_supports) and, once this
 * rank has written its slot, only reads (one chunk, no reduced slice to
 * publish): its peers never wait for this rank again, whoever runs the rest
 * and when. */
int c10d__shm_coll_one_chunk(const struct c10d__op *op, size_t slot_bytes, int nranks);
/* An all_to_all (every form) whose blocks to and from this rank each fit
 * one chunk and whose input needs no copy: one chunk for this rank's part,
 * but a larger block between two other ranks makes more, which this rank
 * learns only once every rank wrote its slot. */
int c10d__shm_coll_one_chunk_here(const struct c10d__op *op, size_t slot_bytes, int nranks);
/* This rank has written its slot of the op's (only) chunk, or it is done. */
int c10d__shm_coll_arrived(const struct c10d__shm_coll *a);
/* The op is done (progress returned 1). */
int c10d__shm_coll_done(const struct c10d__shm_coll *a);

/* Where rank r's block of a gathering op's output starts (its list form,
 * or blocks of block_elems in rank order). Inline: in_place.c, which coll.c
 * calls, uses it too. */
static inline char *c10d__shm_coll_block(const struct c10d__shm_coll *a, int r)
{
    if (a->op->recvs != NULL)
        return a->op->recvs[r];
    return (char *)a->op->recv + (size_t)r * a->block_elems * a->esz;
}

#endif
