/* all_reduce through a shared segment (segment.h), as a state machine the
 * loop polls: each call goes as far as the peers let it and returns.
 *
 * The buffer runs in chunks of at most one slot. Per chunk every rank copies
 * its contribution into its slot and publishes `arrive`; then either
 *   - small chunks: every rank reduces all slots, in rank order, into its own
 *     output (the same operands in the same order: the same bits everywhere);
 *   - large chunks: rank r reduces slice r of every slot into its own slot,
 *     publishes `reduced`, and every rank copies each slice from the slot of
 *     the rank that reduced it.
 * A slot is written again two chunks later, once every peer has arrived at
 * the chunk in between (so it finished reading this one). */
#ifndef C10D_BACKENDS_SHM_ALLREDUCE_H
#define C10D_BACKENDS_SHM_ALLREDUCE_H

#include "segment.h"

#include "backends/backend.h"

#include <stddef.h>
#include <stdint.h>

/* Chunks up to this many bytes are reduced whole by every rank. */
#define C10D_SHM_SMALL_MAX (16 * 1024)

struct c10d__shm_allreduce {
    struct c10d__shm_seg *seg;
    const struct c10d__op *op;
    struct c10d__fp fp;
    size_t esz, chunk_elems, done_elems;
    uint64_t gen; /* the chunk running */
    uint32_t member;
    int phase;
};

/* Sets up `a` for `op` (an all_reduce the caller checked and announced as
 * `member` of its seq). */
void c10d__shm_allreduce_start(struct c10d__shm_allreduce *a, struct c10d__shm_seg *seg,
                               const struct c10d__op *op, uint32_t member,
                               const struct c10d__fp *fp);
/* Goes on as far as the peers allow: 1 done, 0 waiting for a peer, < 0
 * failed (c10d_last_error: a peer runs a different collective, or a
 * reduction the kernels refuse). *moved: it got further this call. */
int c10d__shm_allreduce_progress(struct c10d__shm_allreduce *a, int *moved);

#endif
