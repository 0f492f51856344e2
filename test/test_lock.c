/* The futex lock (engine/lock.h): mutual exclusion under contention, a
 * waiter that sleeps until the holder lets go, and a free word at the end. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "engine/lock.h"

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#define THREADS 4
#define ROUNDS  200000

static c10d__lock counted_lock;
static long counter; /* guarded by counted_lock; a plain int, so a lost update shows */

static void *count_up(void *arg)
{
    (void)arg;
    for (int i = 0; i < ROUNDS; i++) {
        c10d__lock_acquire(&counted_lock);
        long v = counter;
        if ((i & 1023) == 0)
            sched_yield(); /* let another thread find it held and sleep */
        counter = v + 1;
        c10d__lock_release(&counted_lock);
    }
    return NULL;
}

static void test_exclusion_under_contention(void **state)
{
    (void)state;
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_create(&t[i], NULL, count_up, NULL), 0);
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_join(t[i], NULL), 0);
    assert_int_equal(counter, (long)THREADS * ROUNDS);
    assert_int_equal(atomic_load(&counted_lock.word), 0);
}

static c10d__lock held_lock;
static atomic_int got_it;

static void *take_it(void *arg)
{
    (void)arg;
    c10d__lock_acquire(&held_lock);
    atomic_store(&got_it, 1);
    c10d__lock_release(&held_lock);
    return NULL;
}

static void test_waiter_sleeps_until_release(void **state)
{
    (void)state;
    c10d__lock_acquire(&held_lock);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, take_it, NULL), 0);
    /* The waiter marks the word contended before it sleeps. */
    for (int i = 0; i < 2000 && atomic_load(&held_lock.word) != 2; i++)
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    assert_int_equal(atomic_load(&held_lock.word), 2);
    nanosleep(&(struct timespec){0, 20000000}, NULL);
    assert_int_equal(atomic_load(&got_it), 0);
    c10d__lock_release(&held_lock);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(atomic_load(&got_it), 1);
    assert_int_equal(atomic_load(&held_lock.word), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exclusion_under_contention),
        cmocka_unit_test(test_waiter_sleeps_until_release),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
