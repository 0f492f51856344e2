/* The mailbox between two ranks (mailbox.h). */
#include "mailbox.h"

#include <string.h>

#define STATE(w)      ((int)((w)&7u))
#define GEN(w)        ((w) >> 3)
#define WORD(gen, st) ((gen) << 3 | (uint64_t)(st))

static char *data_of(struct c10d__shm_mailbox *m)
{
    return (char *)(m + 1);
}

static int is_free(uint64_t w)
{
    return STATE(w) == C10D_SHM_MB_EMPTY || STATE(w) == C10D_SHM_MB_MATCHED;
}

int c10d__shm_mb_state(struct c10d__shm_mailbox *m, uint64_t gen)
{
    uint64_t w = atomic_load_explicit(&m->word, memory_order_acquire);
    return GEN(w) == gen ? STATE(w) : C10D_SHM_MB_EMPTY;
}

int c10d__shm_mb_uncollected(struct c10d__shm_mailbox *m)
{
    return STATE(atomic_load_explicit(&m->word, memory_order_acquire)) == C10D_SHM_MB_DATA;
}

/* EAGER(gen) -> TAKEN(gen): 1 if this call claimed it. */
static int claim(struct c10d__shm_mailbox *m, uint64_t w)
{
    return atomic_compare_exchange_strong_explicit(&m->word, &w, WORD(GEN(w), C10D_SHM_MB_TAKEN),
                                                   memory_order_acquire, memory_order_relaxed);
}

void c10d__shm_mb_matched(struct c10d__shm_mailbox *m, uint64_t gen)
{
    atomic_store_explicit(&m->word, WORD(gen, C10D_SHM_MB_MATCHED), memory_order_release);
}

/* The deposit w (EAGER): claimed, copied out and matched (1), or -1 if it
 * has another tag, more than cap bytes, or its loop claimed it first. */
static int take_eager(struct c10d__shm_mailbox *m, uint64_t w, uint64_t tag, size_t cap, void *buf,
                      size_t *len)
{
    size_t n = (size_t)atomic_load_explicit(&m->len, memory_order_relaxed);
    if (atomic_load_explicit(&m->stag, memory_order_relaxed) != tag || n > cap || !claim(m, w))
        return -1;
    if (n > 0)
        memcpy(buf, data_of(m), n);
    *len = n;
    c10d__shm_mb_matched(m, GEN(w));
    return 1;
}

int c10d__shm_mb_take(struct c10d__shm_mailbox *m, uint64_t tag, size_t cap, void *buf, size_t *len)
{
    uint64_t w = atomic_load_explicit(&m->word, memory_order_acquire);
    if (STATE(w) != C10D_SHM_MB_EAGER ||
        atomic_load_explicit(&m->stag, memory_order_relaxed) != tag)
        return 0;
    return take_eager(m, w, tag, cap, buf, len) > 0 ? 1 : -1;
}

int c10d__shm_mb_recv(struct c10d__shm_mailbox *m, uint64_t tag, size_t cap, void *buf, size_t *len,
                      uint64_t *gen)
{
    atomic_store_explicit(&m->rtag, tag, memory_order_relaxed);
    atomic_store_explicit(&m->cap, cap, memory_order_relaxed);
    uint64_t w = atomic_load_explicit(&m->word, memory_order_acquire);
    for (;;) {
        if (STATE(w) == C10D_SHM_MB_EAGER)
            return take_eager(m, w, tag, cap, buf, len);
        if (!is_free(w))
            return -1;
        /* Sequentially consistent: the poster then looks at what reached its
         * loop from this sender (p2p_lane.c). A deposit that won the race
         * is taken on the next round. */
        if (atomic_compare_exchange_strong(&m->word, &w, WORD(GEN(w) + 1, C10D_SHM_MB_POSTED))) {
            *gen = GEN(w) + 1;
            return 0;
        }
    }
}

int c10d__shm_mb_withdraw(struct c10d__shm_mailbox *m, uint64_t gen)
{
    uint64_t want = WORD(gen, C10D_SHM_MB_POSTED);
    return atomic_compare_exchange_strong(&m->word, &want, WORD(gen, C10D_SHM_MB_EMPTY));
}

size_t c10d__shm_mb_collect(struct c10d__shm_mailbox *m, uint64_t gen, void *buf)
{
    size_t n = (size_t)atomic_load_explicit(&m->len, memory_order_relaxed);
    if (n > 0)
        memcpy(buf, data_of(m), n);
    /* Release: the sender writes the data area again only after this. */
    atomic_store_explicit(&m->word, WORD(gen, C10D_SHM_MB_EMPTY), memory_order_release);
    return n;
}

int c10d__shm_mb_claim(struct c10d__shm_mailbox *m, uint64_t *gen, uint64_t *tag, size_t *len,
                       const char **data)
{
    uint64_t w = atomic_load_explicit(&m->word, memory_order_acquire);
    if (STATE(w) != C10D_SHM_MB_EAGER || !claim(m, w))
        return 0;
    *gen = GEN(w);
    *tag = atomic_load_explicit(&m->stag, memory_order_relaxed);
    *len = (size_t)atomic_load_explicit(&m->len, memory_order_relaxed);
    *data = data_of(m);
    return 1;
}

int c10d__shm_mb_send(struct c10d__shm_mailbox *m, uint64_t tag, const void *p, size_t n,
                      uint64_t *gen)
{
    uint64_t w = atomic_load_explicit(&m->word, memory_order_acquire);
    for (;;) {
        if (STATE(w) == C10D_SHM_MB_POSTED) {
            if (atomic_load_explicit(&m->rtag, memory_order_relaxed) != tag ||
                atomic_load_explicit(&m->cap, memory_order_relaxed) < n)
                return C10D_SHM_MB_REFUSED;
            /* A post taken back meanwhile changed the word: the CAS below
             * fails and these bytes are never read. */
            if (n > 0)
                memcpy(data_of(m), p, n);
            atomic_store_explicit(&m->len, n, memory_order_relaxed);
            if (atomic_compare_exchange_strong_explicit(&m->word, &w,
                                                        WORD(GEN(w), C10D_SHM_MB_DATA),
                                                        memory_order_acq_rel, memory_order_acquire))
                return C10D_SHM_MB_FILLED;
            continue; /* w is the word now */
        }
        if (!is_free(w) || !atomic_load_explicit(&m->reader, memory_order_acquire))
            return C10D_SHM_MB_REFUSED;
        if (n > 0)
            memcpy(data_of(m), p, n);
        atomic_store_explicit(&m->stag, tag, memory_order_relaxed);
        atomic_store_explicit(&m->len, n, memory_order_relaxed);
        if (atomic_compare_exchange_strong_explicit(&m->word, &w,
                                                    WORD(GEN(w) + 1, C10D_SHM_MB_EAGER),
                                                    memory_order_acq_rel, memory_order_acquire)) {
            *gen = GEN(w) + 1;
            return C10D_SHM_MB_DEPOSITED;
        }
    }
}

void c10d__shm_mb_loop_sleeps(struct c10d__shm_mailbox *m)
{
    atomic_store_explicit(&m->loop_waits, 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_seq_cst);
}

int c10d__shm_mb_loop_to_wake(struct c10d__shm_mailbox *m)
{
    atomic_thread_fence(memory_order_seq_cst);
    return atomic_load_explicit(&m->loop_waits, memory_order_relaxed) != 0 &&
           atomic_exchange_explicit(&m->loop_waits, 0, memory_order_acquire) != 0;
}

int c10d__shm_mb_sent(struct c10d__shm_mailbox *m, uint64_t gen)
{
    uint64_t w = atomic_load_explicit(&m->word, memory_order_acquire);
    return GEN(w) > gen || (GEN(w) == gen && STATE(w) == C10D_SHM_MB_MATCHED);
}
