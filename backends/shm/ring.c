/* The byte ring between two ranks (ring.h). */
#include "ring.h"

#include <string.h>

static char *data_of(struct c10d__shm_ring *r)
{
    return (char *)(r + 1);
}

size_t c10d__shm_ring_put(struct c10d__shm_ring *r, const void *p, size_t n)
{
    uint64_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
    uint64_t tail = atomic_load_explicit(&r->tail, memory_order_acquire);
    size_t room = C10D_SHM_RING_BYTES - (size_t)(head - tail);
    if (n > room)
        n = room;
    if (n == 0)
        return 0;
    size_t at = (size_t)(head % C10D_SHM_RING_BYTES);
    size_t first = C10D_SHM_RING_BYTES - at < n ? C10D_SHM_RING_BYTES - at : n;
    memcpy(data_of(r) + at, p, first);
    if (n > first)
        memcpy(data_of(r), (const char *)p + first, n - first);
    atomic_store_explicit(&r->head, head + n, memory_order_release);
    return n;
}

/* Both sides: a flag the other side set is taken once (exchange), so one
 * wake answers one "I sleep" or "I wait". */
static int take_flag(_Atomic uint32_t *flag)
{
    atomic_thread_fence(memory_order_seq_cst);
    return atomic_load_explicit(flag, memory_order_relaxed) != 0 &&
           atomic_exchange_explicit(flag, 0, memory_order_acquire) != 0;
}

int c10d__shm_ring_reader_to_wake(struct c10d__shm_ring *r)
{
    return take_flag(&r->reader_sleeps);
}

int c10d__shm_ring_writer_wait(struct c10d__shm_ring *r)
{
    atomic_store_explicit(&r->writer_waits, 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_seq_cst);
    uint64_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
    return head - atomic_load_explicit(&r->tail, memory_order_acquire) < C10D_SHM_RING_BYTES;
}

void c10d__shm_ring_open_reader(struct c10d__shm_ring *r)
{
    atomic_store_explicit(&r->reader_open, 1, memory_order_release);
}

int c10d__shm_ring_reader_is_open(struct c10d__shm_ring *r)
{
    return atomic_load_explicit(&r->reader_open, memory_order_acquire) != 0;
}

size_t c10d__shm_ring_peek(struct c10d__shm_ring *r, const char **p)
{
    uint64_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
    uint64_t head = atomic_load_explicit(&r->head, memory_order_acquire);
    if (head == tail)
        return 0;
    size_t at = (size_t)(tail % C10D_SHM_RING_BYTES);
    size_t n = (size_t)(head - tail);
    *p = data_of(r) + at;
    return C10D_SHM_RING_BYTES - at < n ? C10D_SHM_RING_BYTES - at : n;
}

void c10d__shm_ring_take(struct c10d__shm_ring *r, size_t n)
{
    uint64_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
    atomic_store_explicit(&r->tail, tail + n, memory_order_release);
}

int c10d__shm_ring_writer_to_wake(struct c10d__shm_ring *r)
{
    return take_flag(&r->writer_waits);
}

int c10d__shm_ring_reader_sleep(struct c10d__shm_ring *r)
{
    atomic_store_explicit(&r->reader_sleeps, 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_seq_cst);
    uint64_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
    return atomic_load_explicit(&r->head, memory_order_acquire) != tail;
}
