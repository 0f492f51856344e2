/* The futex calls and the futex lock's slow paths (lock.h). */
#include "lock.h"

#include <linux/futex.h>
#include <stddef.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

void c10d__futex_wait(atomic_int *word, int expected, uint64_t timeout_ns)
{
    struct timespec ts = {(time_t)(timeout_ns / 1000000000u), (long)(timeout_ns % 1000000000u)};
    syscall(SYS_futex, word, FUTEX_WAIT_PRIVATE, expected, timeout_ns > 0 ? &ts : NULL, NULL, 0);
}

void c10d__futex_wake(atomic_int *word, int n)
{
    syscall(SYS_futex, word, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
}

void c10d__lock_wait(c10d__lock *l, int seen)
{
    /* Marked contended before sleeping: the holder's release then wakes a
     * sleeper. A wake-up, a signal or a word that changed before the sleep
     * began all come back here to try again. */
    if (seen != 2)
        seen = atomic_exchange_explicit(&l->word, 2, memory_order_acquire);
    while (seen != 0) {
        c10d__futex_wait(&l->word, 2, 0);
        seen = atomic_exchange_explicit(&l->word, 2, memory_order_acquire);
    }
}

void c10d__lock_wake(c10d__lock *l)
{
    c10d__futex_wake(&l->word, 1);
}
