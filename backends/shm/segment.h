/* A shared-memory segment for the ranks of one group on one host: a memfd
 * made by the group's rank 0 and opened by the others through
 * /proc/<pid>/fd/<fd>, so no name exists that could outlive the job (the
 * memory goes when the last rank unmaps it, kill -9 included) and only a
 * process allowed to read rank 0's descriptors (its user, in its pid
 * namespace) can map it.
 *
 * Layout: a header page (magic, nonce, ranks, slot size), then a control
 * block per rank (its counters, each on its own cache lines), then each
 * rank's two data slots (double buffering: a rank fills one while its peers
 * still read the other; each slot_bytes of data plus a head's room,
 * c10d__shm_slot_head_bytes), then (up to C10D_SHM_RING_MAX_RANKS ranks) a byte
 * ring per ordered pair of ranks for the tcp transport's frames (ring.h) and
 * a mailbox per ordered pair for small P2P messages (mailbox.h).
 * docs/shm.md has the protocol that uses them.
 *
 * Any thread; a segment is used by one thread at a time (the loop's), but
 * for its doorbells, which the loop and a caller's lane may ring at once. */
#ifndef C10D_BACKENDS_SHM_SEGMENT_H
#define C10D_BACKENDS_SHM_SEGMENT_H

#include "backends/fingerprint.h"
#include "mailbox.h"
#include "ring.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define C10D_SHM_HOST_ID_MAX 160
#define C10D_SHM_REF_MAX     64

/* What a rank publishes of one slot's contents with its arrival. */
struct c10d__shm_stamp {
    uint64_t gen; /* the chunk it belongs to */
    uint64_t seq; /* the op's sequence number */
    struct c10d__fp fp;
};

/* One rank's control block: what it has done, each counter alone on a pair of
 * cache lines so that a rank polling one does not steal the line its owner
 * writes next. */
struct c10d__shm_ctl {
    _Atomic uint64_t arrive; /* its slot for chunk `arrive` is written */
    struct c10d__shm_stamp stamp[2];
    /* The collective it runs now, on either path (c10d__shm_announce): a
     * seqlock, `ann_seq` 0 while the words change. */
    _Atomic uint64_t ann_seq, ann_member, ann_fp[2];
    char pad1[128 - 5 * sizeof(uint64_t) - 2 * sizeof(struct c10d__shm_stamp)];
    _Atomic uint64_t reduced;  /* its slice of chunk `reduced` is reduced */
    _Atomic uint32_t sleeping; /* its loop sleeps: ring it after a change */
    /* Its callers' threads polling P2P ops in their lane: a message it
     * matched is copied out as soon as such a thread runs. */
    _Atomic uint32_t lane_waits;
    /* Its doorbell (c10d__shm_wake_sleepers): (pid << 32 | fd) of the write
     * end of a pipe its loop polls, 0 if none; and that pipe's inode, so
     * that a reused descriptor number is never written to. */
    _Atomic uint64_t bell, bell_ino;
    /* An op read in place (in_place.h): its peers may stop reading its
     * buffers once this reaches the op's chunk. */
    _Atomic uint64_t released;
    /* Written once at attach: its pid, and where its own `struct
     * c10d__shm_seg` lies in its memory (a peer's probe reads its `nranks`
     * there to see whether process_vm_readv reaches it). */
    _Atomic uint64_t pid, self;
    char pad2[128 - 7 * sizeof(uint64_t)];
};

struct c10d__shm_seg {
    void *base;
    size_t map_bytes;
    int fd; /* rank 0's memfd (kept so that late peers can open it), else -1 */
    int nranks, rank;
    size_t slot_bytes;
    size_t slot_stride;        /* slot_bytes and the head's room */
    struct c10d__shm_ctl *ctl; /* nranks of them */
    char *data;
    uint64_t gen;         /* chunks run so far: the same count on every rank */
    int bell_rd, bell_wr; /* this rank's doorbell pipe (-1: none, peers use tcp) */
    /* Per rank: its doorbell opened here, -2 not yet, -1 cannot. Atomic: the
     * loop (P2P rings) and a caller's lane may both open one. */
    _Atomic int *peer_bell;
    char *rings;     /* a ring per ordered pair (ring.h), NULL: none */
    char *mailboxes; /* a mailbox per ordered pair (mailbox.h), with the rings */
    /* Its ranks outnumber the CPUs they can share (those this process may
     * run on where that is a subset, as in a container's cpuset, else the
     * machine's): a waiter in the caller's lane yields between looks. */
    int crowded;
    /* Reading peers in place (in_place.h): 0 not tried, 1 every peer read,
     * 2 never (refused, or C10D_SHM_IN_PLACE=0). Atomic: a caller's thread
     * looks at it before it takes the lane (all_to_all.c), while the loop
     * may set it. */
    atomic_int read_peers;
    /* A rank refused reading in place for good, seen by every rank at the
     * same op: no op offers its buffers any more. */
    atomic_int no_offers;
};

/* Segments for up to this many ranks carry a byte ring per ordered pair of
 * ranks (ring.h): 32 x 32 x 128 KiB of address space at most, the pages
 * made only as rings are used. */
#define C10D_SHM_RING_MAX_RANKS 32

/* This process's host identity for the shm path, or "" when it has none:
 * equal ids (same boot, user, pid and network namespace, host name) can map
 * each other's memfds through /proc, and are treated as one host. */
void c10d__shm_host_id(char *buf, size_t cap);

/* Rank 0: makes the segment for `nranks` ranks with `slot_bytes` slots; `ref`
 * gets the text the others attach with. */
int c10d__shm_create(int nranks, size_t slot_bytes, struct c10d__shm_seg **out, char *ref,
                     size_t cap);
/* The others: maps the segment `ref` names and checks that it is the one made
 * for these `nranks` ranks. */
int c10d__shm_attach(const char *ref, int nranks, int rank, struct c10d__shm_seg **out);
void c10d__shm_free(struct c10d__shm_seg *seg);

/* This rank starts collective (seq, member) with fingerprint fp, on shared
 * memory or not: a rank waiting on the segment for a peer that runs another
 * collective over tcp can tell (c10d__shm_peer_differs). */
void c10d__shm_announce(struct c10d__shm_seg *seg, uint64_t seq, uint32_t member,
                        const struct c10d__fp *fp);
/* 1 if rank r announced (seq, member) with a fingerprint other than `fp`
 * (then *theirs is it); 0 if it did not (yet), or agrees. */
int c10d__shm_peer_differs(const struct c10d__shm_seg *seg, int r, uint64_t seq, uint32_t member,
                           const struct c10d__fp *fp, struct c10d__fp *theirs);

/* Waking a rank whose loop sleeps while it waits on the segment (the
 * sleeper's flag and the publisher's counter, each checked after a full
 * fence, so that one of them always sees the other): the sleeper calls
 * c10d__shm_sleepy, then looks at the segment once more before its loop
 * blocks; a rank that published something calls c10d__shm_wake_sleepers,
 * which writes a byte to the doorbell of each rank that said it sleeps (a
 * pipe that rank's loop polls, c10d__shm_bell_fd: its epoll wakes), or,
 * where that rank has none or its doorbell cannot be opened here, calls
 * ring(arg, r) (the tcp F_WAKE frame). */
void c10d__shm_sleepy(struct c10d__shm_seg *seg);
/* This rank moved on by itself: no ring wanted (a flag left set would have
 * a peer ring a rank that may have left the group since). */
void c10d__shm_awake(struct c10d__shm_seg *seg);
void c10d__shm_wake_sleepers(struct c10d__shm_seg *seg, void (*ring)(void *arg, int r), void *arg);
/* 1 if every peer's doorbell opens here (none has to be rung over tcp). */
int c10d__shm_bells_all(struct c10d__shm_seg *seg);
/* The read end of this rank's doorbell (its loop polls it; it does not own
 * it), or -1 if it has none. */
int c10d__shm_bell_fd(const struct c10d__shm_seg *seg);
/* Nothing polls this rank's doorbell: its peers ring it over tcp (those that
 * opened it already are not told; call it before any op runs). */
void c10d__shm_bell_withdraw(struct c10d__shm_seg *seg);
/* Wakes rank r's loop now: its doorbell, or ring(arg, r) where it has none. */
void c10d__shm_wake(struct c10d__shm_seg *seg, int r, void (*ring)(void *arg, int r), void *arg);
/* The ring rank `from` writes and rank `to` reads, NULL if the segment has
 * none (too many ranks). */
struct c10d__shm_ring *c10d__shm_ring_of(const struct c10d__shm_seg *seg, int from, int to);
/* The mailbox rank `from` fills and rank `to` posts, NULL if the segment
 * has none (as for rings). */
struct c10d__shm_mailbox *c10d__shm_mailbox_of(const struct c10d__shm_seg *seg, int from, int to);
/* Tests: rings through doorbells and through ring() since the process began. */
void c10d__shm_bell_counts(uint64_t *bells, uint64_t *fallbacks);

/* Room in every slot beyond its slot_bytes, whole cache lines: an all_to_all
 * chunk's header (its counts and offer, all_to_all.c) rides there, so that a
 * block of a power of two still fits one chunk (a 256 KiB all_to_all on 2
 * ranks was two chunks, the second of 64 bytes, and went to the loop). */
size_t c10d__shm_slot_head_bytes(int nranks);

/* Rank r's slot for chunk `gen`. */
static inline char *c10d__shm_slot(const struct c10d__shm_seg *seg, int r, uint64_t gen)
{
    return seg->data + ((size_t)r * 2 + (gen & 1)) * seg->slot_stride;
}

#endif
