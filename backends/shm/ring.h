/* A byte stream from one rank to another through their segment: one writer
 * and one reader, each on its own loop thread, carrying what the tcp
 * transport would otherwise write to the socket between two ranks of one
 * host (docs/shm.md, "P2P"). Bytes go in order and are never lost: a writer
 * that finds the ring full keeps the rest and writes it later.
 *
 * `head` (bytes written, ever) is the writer's, `tail` (bytes read, ever)
 * the reader's, each on its own cache lines. Memory order: the writer copies
 * bytes in, then stores head (release); the reader loads head (acquire),
 * copies the bytes out, then stores tail (release), which the writer loads
 * (acquire) before it reuses that space.
 *
 * Waking: a reader whose loop is about to sleep stores `reader_sleeps`, the
 * writer `writer_waits` when its bytes did not fit; each side then issues a
 * full fence and looks at the other's counter once more, and the other side
 * fences after moving its counter and looks at the flag: one of the two
 * always sees the other (docs/shm.md, the doorbell). */
#ifndef C10D_BACKENDS_SHM_RING_H
#define C10D_BACKENDS_SHM_RING_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

/* Bytes a ring holds: one eager message of the tcp transport (64 KiB) and
 * its header fit when the ring is empty. */
#define C10D_SHM_RING_BYTES ((size_t)128 * 1024)

struct c10d__shm_ring {
    _Atomic uint64_t head;         /* the writer's */
    _Atomic uint32_t writer_waits; /* the writer has bytes that did not fit */
    char pad0[128 - sizeof(uint64_t) - sizeof(uint32_t)];
    _Atomic uint64_t tail;          /* the reader's */
    _Atomic uint32_t reader_sleeps; /* the reader's loop sleeps: wake it after writing */
    _Atomic uint32_t reader_open;   /* the reader reads this ring */
    char pad1[128 - sizeof(uint64_t) - 2 * sizeof(uint32_t)];
    /* C10D_SHM_RING_BYTES of data follow */
};

#define C10D_SHM_RING_SIZE (sizeof(struct c10d__shm_ring) + C10D_SHM_RING_BYTES)

/* Writer: copies up to n bytes in (as many as there is room for) and
 * publishes them; returns how many. */
size_t c10d__shm_ring_put(struct c10d__shm_ring *r, const void *p, size_t n);
/* Writer, after a put that wrote something: 1 if the reader said it sleeps
 * (the flag is cleared: the caller wakes it, once). */
int c10d__shm_ring_reader_to_wake(struct c10d__shm_ring *r);
/* Writer, with bytes that did not fit: says so, then 1 if room appeared
 * meanwhile (write again now), 0 if the reader will wake it. */
int c10d__shm_ring_writer_wait(struct c10d__shm_ring *r);

/* Reader: from now on it reads this ring (a writer that sees this may
 * switch to it; one that does not keeps its socket). */
void c10d__shm_ring_open_reader(struct c10d__shm_ring *r);
/* Writer: whether the reader said it reads the ring. */
int c10d__shm_ring_reader_is_open(struct c10d__shm_ring *r);

/* Reader: the readable bytes that lie in one piece from the tail (0: none). */
size_t c10d__shm_ring_peek(struct c10d__shm_ring *r, const char **p);
/* Reader: n bytes of those were read; their room is the writer's again. */
void c10d__shm_ring_take(struct c10d__shm_ring *r, size_t n);
/* Reader, after takes: 1 if the writer waits for room (the flag is cleared:
 * the caller wakes it, once). */
int c10d__shm_ring_writer_to_wake(struct c10d__shm_ring *r);
/* Reader, before its loop sleeps: says so, then 1 if bytes arrived
 * meanwhile (read them now). */
int c10d__shm_ring_reader_sleep(struct c10d__shm_ring *r);

#endif
