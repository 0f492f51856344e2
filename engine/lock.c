/* The futex lock's slow paths (lock.h). */
#include "lock.h"

#include <linux/futex.h>
#include <stddef.h>
#include <sys/syscall.h>
#include <unistd.h>

void c10d__lock_wait(c10d__lock *l, int seen)
{
    /* Marked contended before sleeping: the holder's release then wakes a
     * sleeper. A wake-up, a signal or a word that changed before the sleep
     * began all come back here to try again. */
    if (seen != 2)
        seen = atomic_exchange_explicit(&l->word, 2, memory_order_acquire);
    while (seen != 0) {
        syscall(SYS_futex, &l->word, FUTEX_WAIT_PRIVATE, 2, NULL, NULL, 0);
        seen = atomic_exchange_explicit(&l->word, 2, memory_order_acquire);
    }
}

void c10d__lock_wake(c10d__lock *l)
{
    syscall(SYS_futex, &l->word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}
