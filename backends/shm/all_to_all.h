/* all_to_all through the segment, in every form (even splits, counts,
 * lists): coll.c runs its chunks, these fill and read them.
 *
 * Every slot starts with a header: its owner's send and receive counts (so
 * every rank checks every pair at the first chunk and learns the op's
 * length, the largest block of any pair), then its offer to read in place
 * (in_place.h: whether it can, its pid, where each of its send blocks
 * starts), then a part per rank. One layout for even splits, counts and
 * lists alike: ranks may describe the same even split either way (the
 * fingerprint does not tell them apart), and must still lay out their
 * slots alike. A rank's own block goes from its input to its output
 * directly. Where two chunks or more are left after the first and every
 * rank can, the rest of each block is read in place. A rank with a block
 * of C10D_SHM_A2A_EMPTY_MIN bytes or more for a peer sends its first chunk
 * empty where it can read in place: if every rank can, each block is read
 * in place from the start (one copy, as vader's); if one cannot, every
 * rank runs the op through the slots from the next chunk on. */
#ifndef C10D_BACKENDS_SHM_ALL_TO_ALL_H
#define C10D_BACKENDS_SHM_ALL_TO_ALL_H

#include "coll.h"

/* The least block that sends its first chunk empty (bytes). */
#define C10D_SHM_A2A_EMPTY_MIN ((size_t)64 * 1024)

/* Elements of a part (one pair's window of a chunk) in slots of slot_bytes. */
size_t c10d__shm_a2a_part_elems(size_t slot_bytes, int nranks, size_t esz);
/* Whether an all_to_all's blocks to and from this rank each fit one part
 * and its input needs no copy (c10d__shm_coll_one_chunk_here). */
int c10d__shm_a2a_own_fit(const struct c10d__op *op, size_t slot_bytes, int nranks);
/* The bytes this rank sends where it will most likely send its first chunk
 * empty (it reads its peers, as found before, it has a block of
 * C10D_SHM_A2A_EMPTY_MIN bytes or more for a peer, and its input and output
 * do not overlap); 0 otherwise. */
size_t c10d__shm_a2a_empty_likely(const struct c10d__op *op, const struct c10d__shm_seg *seg);
/* This rank's slot for the chunk at a->done_elems (the header and offer at
 * the first). */
void c10d__shm_a2a_write(struct c10d__shm_coll *a);
/* The first chunk, every slot written: every pair's counts agree (else < 0,
 * the same message on every rank); a->block_elems is the op's length. */
int c10d__shm_a2a_check(struct c10d__shm_coll *a);
/* Copies this rank's part of every slot of the chunk into its output. */
void c10d__shm_a2a_read(struct c10d__shm_coll *a);
/* Whether every rank's offer says it can read the rest in place. */
int c10d__shm_a2a_all_can(const struct c10d__shm_coll *a);
/* Whether some rank sent its first chunk empty (read only at the first
 * chunk). */
int c10d__shm_a2a_any_empty(const struct c10d__shm_coll *a);
/* Reads what is left after the first chunk from the peers' inputs (all of
 * the blocks of a rank that sent it empty). */
int c10d__shm_a2a_read_rest(struct c10d__shm_coll *a);

#endif
