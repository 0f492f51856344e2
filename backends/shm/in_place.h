/* Large collectives read in place: instead of copying its data into its slot
 * for the peers to copy out (two copies), a rank offers its buffer (pid and
 * address, in its slot) and each reader copies straight from it with
 * process_vm_readv (one copy), as Open MPI's vader does. Broadcast,
 * all_gather of equal blocks, scatter and all_reduce, from the sizes below:
 * kinds whose size every rank checks against the others' (the
 * fingerprint), so that every rank starts the op with an offer, or none
 * does. (Gather is not
 * read in place: its root alone would copy every block, the slower copy
 * through the kernel at that, where through the slots its peers copy their
 * blocks in at once; 2 ranks, 4 MiB: 471-503 us in place, 412-475 through
 * the slots. Nor written in place by its peers: a write that came after the
 * root's op ended, at its deadline, would land in a buffer its caller has
 * back. all_to_all, whose sizes are not in the fingerprint, offers in its
 * first chunk's header: all_to_all.h.)
 *
 * An offered op is one chunk: every rank writes its offer and arrives; once
 * all arrived, each reads what it needs and publishes `reduced`; once all
 * did, each publishes `released` if its op is still live (its work not
 * completed: a rank whose op timed out may have its buffer back already);
 * once all did, each is done. An all_reduce reads twice and takes two
 * chunks: once all arrived, each rank reduces its slices (cut as the
 * slots' path cuts them, to the same bits) from its peers' inputs into its
 * output and publishes `reduced`; once all did, it reads
 * every peer's reduced slice from that peer's output, and publishes the
 * next chunk's `arrive` and `reduced`; release and end as above, at that
 * chunk. So a reader's bytes count only if every
 * buffer it read was still its op's after the read. A rank that cannot read
 * this time (a peer not attached yet, buffers that overlap) says so in its
 * offer, one that never can (refused, or C10D_SHM_IN_PLACE=0) too; then
 * every rank runs the op through the slots from the next chunk on, and
 * after a "never" no op offers any more. Where the ranks outnumber the CPUs
 * a rank says "never": each round needs every rank on a CPU, and there the
 * offer's three rounds cost more than a copy (4 ranks on 2 CPUs, 1 MiB
 * broadcast: 464 us against 378 through the slots). Up to
 * C10D_SHM_IN_PLACE_LANE_MAX the op runs in the caller's lane, done there
 * or handed to the loop (docs/engine.md). docs/shm.md has the argument. */
#ifndef C10D_BACKENDS_SHM_IN_PLACE_H
#define C10D_BACKENDS_SHM_IN_PLACE_H

#include "coll.h"

#include <sys/uio.h>

/* The sizes read in place (bytes: a broadcast's buffer, an all_gather's
 * whole output, a scatter's whole input, an all_reduce's buffer). Below the least, the offer's
 * extra rounds cost more than the copy they save; a broadcast above its
 * most pipelines better through the slots, where its root copies chunks in
 * while its peers copy the last ones out, each on its own CPU, than one
 * reader's copy through the kernel, slower than memcpy here. 2 ranks, in
 * the caller's lane, us in place / through the slots (median of 5):
 * broadcast 128 KiB 10.7 / 10.7, 256 KiB 18.1 / 21.0, 4 MiB (on the loop)
 * 547-578 / 460; all_gather 64 KiB 8.0 / 9.4, 128 KiB 11.0 / 15.6; scatter
 * 64 KiB 5.8 / 6.0, 128 KiB 7.3 / 10.4. */
#define C10D_SHM_IN_PLACE_BROADCAST_MIN  (192 * 1024)
#define C10D_SHM_IN_PLACE_BROADCAST_MAX  (1024 * 1024)
#define C10D_SHM_IN_PLACE_ALL_GATHER_MIN (64 * 1024)
#define C10D_SHM_IN_PLACE_SCATTER_MIN    (128 * 1024)
/* An all_reduce's buffer. Through the slots each rank copies its input in,
 * reduces its slice from its peers' slots and copies their slices out;
 * read in place, the first copy is gone. Below the least the slots win:
 * their chunks stay in cache from one rank's copy to its peer's. Above the
 * most too, where the slots' pipeline keeps each rank's copies going while
 * its peer reduces. (Gathering each batch of slices as soon as every rank
 * reduced it, rather than after the last, was slower at every size: a
 * slice just written by its owner, which reads this rank's buffer next to
 * it meanwhile; bench/README.md.) 2 ranks bound to cores, in place, us read in
 * place / through the slots (medians of 5, three sets of runs): 2 MiB
 * 374-412 / 396-427, 4 MiB 612-683 / 802-872, 8 MiB 1311-1440 / 1527-1666,
 * 16 MiB 3021-4195 / 3111-3615; 32 and 64 MiB (two runs) 10.7-11.9 /
 * 8.1-9.1 and 22.3-25.9 / 16.7-18.3 ms; 1 MiB, in a stand-alone test of both
 * schemes, 201-218 / 161-170. */
#define C10D_SHM_IN_PLACE_ALL_REDUCE_MIN (2 * 1024 * 1024)
#define C10D_SHM_IN_PLACE_ALL_REDUCE_MAX (8 * 1024 * 1024)

/* Whether `op` starts with an offer on seg: the same answer on every rank
 * for ops whose fingerprints agree. */
int c10d__shm_in_place_offers(const struct c10d__op *op, const struct c10d__shm_seg *seg);
/* Offered ops up to this many bytes (the whole output, or a scatter's
 * input) may run in the caller's lane, done there before it lets them go
 * (docs/engine.md): the copy is then made by the submitting thread, in the
 * call that submits the op, so larger ones stay on the loop, where a caller
 * may compute meanwhile. */
#define C10D_SHM_IN_PLACE_LANE_MAX (1024 * 1024)
/* A failed read is run again only in the lane (coll.c); an all_reduce's
 * first read, which adds into its output, must never be: it stays on the
 * loop, and fails once. */
_Static_assert(C10D_SHM_IN_PLACE_ALL_REDUCE_MIN > C10D_SHM_IN_PLACE_LANE_MAX,
               "an all_reduce read in place never runs in the lane");
/* The bytes an offering op moves in all (its whole output, or a scatter's
 * input); 0 if it does not offer. */
size_t c10d__shm_in_place_size(const struct c10d__op *op, const struct c10d__shm_seg *seg);
/* Writes this rank's offer for a's first chunk into its slot. */
void c10d__shm_in_place_offer(struct c10d__shm_coll *a);
/* Every rank arrived with its offer: 1 if all can read in place; 0 if not
 * (after a "never", seg offers no more). */
int c10d__shm_in_place_agreed(const struct c10d__shm_coll *a);
/* Reads this rank's part of the op from its peers' buffers: 0, or < 0 (a
 * peer's memory could not be read). */
int c10d__shm_in_place_read(struct c10d__shm_coll *a);
/* An all_reduce, once every rank reduced its slice: reads the peers' slices
 * from their outputs into this rank's. 0, or < 0 as above. */
int c10d__shm_in_place_gather(struct c10d__shm_coll *a);

/* all_to_all (coll.c) learns its length from its first chunk's headers,
 * which carry each rank's offer too; once every rank can, what is left
 * after the first chunk is read in place. These are its parts: whether this
 * rank reads its peers (probed once per segment, as above); whether the
 * kernel reads each of `n` single bytes of this process (memory it cannot
 * pin fails a peer's read); and one read of `bytes` from rank r (pid, its
 * address) into dst. */
int c10d__shm_in_place_peers(struct c10d__shm_seg *seg);
int c10d__shm_in_place_readable(const struct iovec *at, int n);
int c10d__shm_in_place_copy(const struct c10d__shm_coll *a, int r, uint64_t pid, uint64_t addr,
                            char *dst, size_t bytes);

/* Tests: bytes read from peers in place since the process began. */
uint64_t c10d__shm_in_place_bytes(void);

#endif
