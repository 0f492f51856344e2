/* A thread's cache of freed blocks of one size: what is made and freed per
 * op (a work, an op's record) is taken from here and put back here, not
 * handed to malloc and free each time (glibc's pair costs about 130
 * instructions for a block of a work's size; this, about 50). A few blocks
 * per thread: an op is usually freed on the thread that made the next one.
 * The blocks go with their thread (freed when it exits) and a block put
 * on a full cache is freed at once. Under AddressSanitizer every block is
 * malloc'd and freed, so that it sees each use after free.
 *
 * Any thread. */
#ifndef C10D_ENGINE_BLOCK_CACHE_H
#define C10D_ENGINE_BLOCK_CACHE_H

#include <stddef.h>

/* The caches there are: each block kind has its own. */
enum c10d__block_kind {
    C10D__BLOCK_WORK,       /* engine/work.c */
    C10D__BLOCK_OP_RECORD,  /* a group's op record, api/pg_object.c */
    C10D__BLOCK_TCP_OP,     /* the tcp backend's op on its loop (2 KiB: past glibc's tcache) */
    C10D__BLOCK_P2P_OP,     /* a message the P2P lane carries, backends/tcp/p2p_lane.c */
    C10D__BLOCK_P2P_RECV,   /* a receive the P2P lane posted, backends/tcp/p2p_lane.c */
    C10D__BLOCK_P2P_BATCH,  /* a small batch in the P2P lane, backends/tcp/p2p_lane_batch.c */
    C10D__BLOCK_P2P_COPIES, /* its members' copies, the same */
    C10D__BLOCK_KINDS
};

/* A block of `size` bytes (uninitialised) of that kind, NULL if out of
 * memory. Every block of a kind has the same size. */
void *c10d__block_take(enum c10d__block_kind kind, size_t size);
/* The same, zeroed, as calloc's would be. */
void *c10d__block_take_zeroed(enum c10d__block_kind kind, size_t size);
/* Gives back a block from c10d__block_take (NULL: nothing). */
void c10d__block_put(enum c10d__block_kind kind, void *block);

/* For records whose size varies: a block of the kind (every one
 * `block_size` bytes) where `size` fits it, else malloc's `size` bytes;
 * *cached says which, for c10d__block_give. Uninitialised; NULL if out of
 * memory. */
void *c10d__block_take_fit(enum c10d__block_kind kind, size_t block_size, size_t size, int *cached);
/* Gives back what c10d__block_take_fit returned, with its *cached. */
void c10d__block_give(enum c10d__block_kind kind, void *block, int cached);

#endif
