/* A lock for the critical sections every op passes through (a work's, the
 * pending list's, the flight recorder's): a futex word, taken and let go
 * inline with one atomic instruction each when nobody waits. Through
 * libuv, a pthread mutex pair is about 70 instructions; this is about 10.
 * A contended lock sleeps on the futex (no spinning, as glibc's default
 * mutex). Not recursive, no owner check, no condition variables: where
 * one is needed, a uv_mutex_t stays.
 *
 * The word: 0 free, 1 held, 2 held and someone may sleep on it. A releaser
 * that finds 2 wakes one sleeper, which takes the lock as 2 (it cannot know
 * whether others sleep), so no wake-up is lost.
 *
 * Zero-initialised (static storage, or a zeroed struct) is a free lock.
 *
 * A release may wake the futex after another thread took the lock, let go
 * and freed (or reused) its memory, as glibc's mutexes may: every futex
 * waiter in the process re-checks its word after a wake-up. */
#ifndef C10D_ENGINE_LOCK_H
#define C10D_ENGINE_LOCK_H

#include <stdatomic.h>
#include <stdint.h>

/* The futex calls the lock rests on, private to the process, for the
 * engine's other futex words too (a work's `settled`). wait sleeps while
 * *word == expected, at most timeout_ns (0: no limit), and returns on a
 * wake-up, a timeout, a signal or a changed word alike: callers re-check.
 * wake wakes up to n sleepers. */
void c10d__futex_wait(atomic_int *word, int expected, uint64_t timeout_ns);
void c10d__futex_wake(atomic_int *word, int n);

typedef struct {
    atomic_int word;
} c10d__lock;

/* The slow paths, out of line. */
void c10d__lock_wait(c10d__lock *l, int seen);
void c10d__lock_wake(c10d__lock *l);

static inline void c10d__lock_acquire(c10d__lock *l)
{
    int seen = 0;
    if (!atomic_compare_exchange_strong_explicit(&l->word, &seen, 1, memory_order_acquire,
                                                 memory_order_relaxed))
        c10d__lock_wait(l, seen);
}

static inline void c10d__lock_release(c10d__lock *l)
{
    if (atomic_exchange_explicit(&l->word, 0, memory_order_release) == 2)
        c10d__lock_wake(l);
}

#endif
