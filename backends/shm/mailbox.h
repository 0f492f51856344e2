/* A mailbox from one rank to another through their segment, for one small
 * P2P message at a time, used by both callers' threads and, where the
 * message must be matched in order with the tcp path's frames, by the
 * receiver's loop (docs/shm.md, "P2P in the caller's lane").
 *
 * `word` is (gen << 3 | state). Two ways a message goes:
 * - The receiver posts a receive (EMPTY or MATCHED -> POSTED, a new gen,
 *   after writing rtag and cap); a sender that finds it fills it (bytes and
 *   len, then POSTED -> DATA): matched and delivered at once. A post may be
 *   taken back (POSTED -> EMPTY) by the receiver's side.
 * - The sender deposits it (EMPTY or MATCHED -> EAGER, a new gen, after
 *   writing the bytes, stag and len); the receiver's caller or its loop
 *   claims it (EAGER -> TAKEN), copies it out, and says it matched it
 *   (TAKEN -> MATCHED), which completes the send.
 * Each transition out of a shared state is a compare-and-swap, so a message
 * or a post is taken by exactly one side. Memory order: every state is
 * published with release after the fields and bytes it covers, and read with
 * acquire before them. The data area is the sender's while the state is
 * EMPTY, MATCHED or POSTED (before its CAS), the receiver's otherwise; a
 * receiver posts again only after it copied the last message out. */
#ifndef C10D_BACKENDS_SHM_MAILBOX_H
#define C10D_BACKENDS_SHM_MAILBOX_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

/* The largest message a mailbox carries; larger ones take the tcp path.
 * A mailbox moves a message in two copies, one after the other on two CPUs;
 * the tcp path reads it in place (one copy) but through both loops' frames.
 * At 32 KiB the loops' hand-offs cost more than the second copy, at 64 KiB
 * not for `sendrecv` (2 ranks bound, p50 us, 16 / 32 / 64 KiB mailbox,
 * three alternating rounds: ping-pong 32 KiB 23.7-27.1 / 12.6-13.8 /
 * 12.6-13.6, 64 KiB 30.7-33.7 / 29.9-31.2 / 22.9-24.9; sendrecv 32 KiB
 * 13.5-14.1 / 11.0-12.7 / 10.5-11.1, 64 KiB 15.5-16.3 / 15.4-16.5 /
 * 18.2-19.1). */
#define C10D_SHM_MAILBOX_BYTES ((size_t)32 * 1024)

enum {
    C10D_SHM_MB_EMPTY = 0,
    C10D_SHM_MB_POSTED = 1,
    C10D_SHM_MB_DATA = 2,
    C10D_SHM_MB_EAGER = 3,
    C10D_SHM_MB_TAKEN = 4,
    C10D_SHM_MB_MATCHED = 5,
};

struct c10d__shm_mailbox {
    _Atomic uint64_t word;
    _Atomic uint64_t rtag, cap; /* the receiver's post */
    _Atomic uint64_t stag, len; /* the sender's message */
    /* The receiver's loop sleeps with receives posted that a deposit may
     * meet: the depositor wakes it (c10d__shm_mb_loop_to_wake). */
    _Atomic uint32_t loop_waits;
    /* The receiver matches deposits on its loop (c10d__tcp_transport_set_mailbox):
     * a sender deposits only then. */
    _Atomic uint32_t reader;
    char pad[64 - 5 * sizeof(uint64_t) - 2 * sizeof(uint32_t)];
    /* C10D_SHM_MAILBOX_BYTES of data follow */
};

#define C10D_SHM_MAILBOX_SIZE (sizeof(struct c10d__shm_mailbox) + C10D_SHM_MAILBOX_BYTES)

/* The state of the message or post `gen`: any state of that gen, or EMPTY if
 * the mailbox moved on to another gen. */
int c10d__shm_mb_state(struct c10d__shm_mailbox *m, uint64_t gen);
/* Sender's side: the last message filled a post that its receiver has not
 * collected yet (DATA): the receiver matched it, and frees the mailbox as
 * soon as its thread runs. */
int c10d__shm_mb_uncollected(struct c10d__shm_mailbox *m);

/* Receiver's caller: a message deposited with this tag and at most cap
 * bytes is copied into buf (*len) and matched: 1. -1 if a message it may not
 * take is there (another tag, too long, or claimed by its loop): the
 * receive takes the tcp path, whose loop matches that message first.
 * Otherwise posts a receive (tag, cap <= C10D_SHM_MAILBOX_BYTES): 0, *gen its
 * gen. The receiver has no post or unread data in this mailbox. */
int c10d__shm_mb_recv(struct c10d__shm_mailbox *m, uint64_t tag, size_t cap, void *buf, size_t *len,
                      uint64_t *gen);
/* Receiver's caller, posting nothing: a message deposited with this tag is
 * copied into buf (*len) and matched: 1 if it had at most cap bytes; -1 if
 * one with this tag is there but longer (the loop reports the mismatch) or
 * its loop claimed it first; 0 if none of this tag is there. */
int c10d__shm_mb_take(struct c10d__shm_mailbox *m, uint64_t tag, size_t cap, void *buf,
                      size_t *len);
/* Receiver's side: takes post `gen` back: 1, or 0 if a sender filled it
 * (DATA: collect it). */
int c10d__shm_mb_withdraw(struct c10d__shm_mailbox *m, uint64_t gen);
/* Receiver's side, once post `gen` holds DATA: copies the message out and
 * returns its length; the mailbox is free again. */
size_t c10d__shm_mb_collect(struct c10d__shm_mailbox *m, uint64_t gen, void *buf);

/* Receiver's loop: claims a deposited message: 1 with its gen, tag, length
 * and bytes (valid until c10d__shm_mb_matched), 0 if there is none. */
int c10d__shm_mb_claim(struct c10d__shm_mailbox *m, uint64_t *gen, uint64_t *tag, size_t *len,
                       const char **data);
/* The claimed message `gen` met its receive: its send completes. */
void c10d__shm_mb_matched(struct c10d__shm_mailbox *m, uint64_t gen);

enum { C10D_SHM_MB_REFUSED = 0, C10D_SHM_MB_FILLED = 1, C10D_SHM_MB_DEPOSITED = 2 };
/* Sender: fills a posted receive with this tag and room for n bytes
 * (FILLED: matched and delivered), or deposits the message in a free
 * mailbox (DEPOSITED, *gen its gen: the send completes once
 * c10d__shm_mb_sent says so), or REFUSED (a post for another tag or fewer
 * bytes, data not yet collected, or a message of its own still there):
 * nothing changed, send it the other way. n <= C10D_SHM_MAILBOX_BYTES. */
int c10d__shm_mb_send(struct c10d__shm_mailbox *m, uint64_t tag, const void *p, size_t n,
                      uint64_t *gen);
/* Receiver's loop, before it sleeps with receives posted: says so, then
 * (after a full fence) looks at the mailbox once more. The sender, after a
 * deposit: 1 if the loop said it sleeps (the flag is taken: wake it, once);
 * one of the two always sees the other. */
void c10d__shm_mb_loop_sleeps(struct c10d__shm_mailbox *m);
int c10d__shm_mb_loop_to_wake(struct c10d__shm_mailbox *m);
/* Sender: whether its deposited message `gen` was matched. */
int c10d__shm_mb_sent(struct c10d__shm_mailbox *m, uint64_t gen);

#endif
