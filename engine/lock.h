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

/* Under ThreadSanitizer the lock is announced as a mutex, so that its lock
 * order is checked with every other's (a cycle through it is reported as
 * one through a pthread mutex would be). A zeroed lock needs no creation. */
#if defined(__SANITIZE_THREAD__)
#define C10D__LOCK_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define C10D__LOCK_TSAN 1
#endif
#endif
#ifdef C10D__LOCK_TSAN
#include <sanitizer/tsan_interface.h>
#define C10D__LOCK_PRE_LOCK(l)    __tsan_mutex_pre_lock((l), __tsan_mutex_linker_init)
#define C10D__LOCK_POST_LOCK(l)   __tsan_mutex_post_lock((l), __tsan_mutex_linker_init, 0)
#define C10D__LOCK_PRE_UNLOCK(l)  __tsan_mutex_pre_unlock((l), __tsan_mutex_linker_init)
#define C10D__LOCK_POST_UNLOCK(l) __tsan_mutex_post_unlock((l), __tsan_mutex_linker_init)
#else
#define C10D__LOCK_PRE_LOCK(l)    ((void)0)
#define C10D__LOCK_POST_LOCK(l)   ((void)0)
#define C10D__LOCK_PRE_UNLOCK(l)  ((void)0)
#define C10D__LOCK_POST_UNLOCK(l) ((void)0)
#endif

static inline void c10d__lock_acquire(c10d__lock *l)
{
    C10D__LOCK_PRE_LOCK(l);
    int seen = 0;
    if (!atomic_compare_exchange_strong_explicit(&l->word, &seen, 1, memory_order_acquire,
                                                 memory_order_relaxed))
        c10d__lock_wait(l, seen);
    C10D__LOCK_POST_LOCK(l);
}

static inline void c10d__lock_release(c10d__lock *l)
{
    C10D__LOCK_PRE_UNLOCK(l);
    int contended = atomic_exchange_explicit(&l->word, 0, memory_order_release) == 2;
    C10D__LOCK_POST_UNLOCK(l);
    if (contended)
        c10d__lock_wake(l);
}

#endif
