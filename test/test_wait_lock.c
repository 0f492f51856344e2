/* A thread that waits on one work while holding its own lock never runs
 * another work's callback that takes that lock: callbacks run on the engine's
 * thread only, however long the loop and the waiter poll (docs/engine.md).
 * The lock here is an error-checking mutex, so a relock on the waiting thread
 * would report EDEADLK instead of hanging. */
#include "engine/env.h"
#include "engine/work.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

static pthread_mutex_t user_lock;
static atomic_int relocked;  /* the callback found the lock held by its own thread */
static atomic_int on_waiter; /* the callback ran on the waiting thread */
static atomic_int callbacks_run;
static pthread_t waiter;

static void locking_cb(c10d_work *w, int status, void *arg)
{
    (void)w, (void)status, (void)arg;
    if (pthread_equal(pthread_self(), waiter))
        atomic_fetch_add(&on_waiter, 1);
    int rc = pthread_mutex_lock(&user_lock);
    if (rc == EDEADLK) {
        atomic_fetch_add(&relocked, 1);
    } else {
        pthread_mutex_unlock(&user_lock);
    }
    atomic_fetch_add(&callbacks_run, 1);
}

struct pair {
    c10d_work *other, *waited;
};

static void *completer(void *arg)
{
    struct pair *p = arg;
    /* The unrelated work first, while the waiter polls; then the waited one. */
    c10d_work_complete(p->other, 0, NULL);
    struct timespec ts = {0, 200 * 1000};
    nanosleep(&ts, NULL);
    c10d_work_complete(p->waited, 0, NULL);
    return NULL;
}

static void test_waiting_with_a_lock_held(void **state)
{
    (void)state;
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_ERRORCHECK);
    pthread_mutex_init(&user_lock, &attr);
    waiter = pthread_self();
    enum { ROUNDS = 300 };
    for (int i = 0; i < ROUNDS; i++) {
        struct pair p;
        assert_int_equal(c10d_work_create("unrelated", 0, &p.other), 0);
        assert_int_equal(c10d_work_create("waited", 0, &p.waited), 0);
        assert_int_equal(c10d_work_on_complete(p.other, locking_cb, NULL), 0);
        pthread_mutex_lock(&user_lock);
        pthread_t t;
        assert_int_equal(pthread_create(&t, NULL, completer, &p), 0);
        assert_int_equal(c10d_work_wait(p.waited, 10000), 0);
        pthread_mutex_unlock(&user_lock);
        pthread_join(t, NULL);
        c10d_work_release(p.other);
        c10d_work_release(p.waited);
    }
    for (int i = 0; i < 10000 && atomic_load(&callbacks_run) < ROUNDS; i++) {
        struct timespec ts = {0, 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    assert_int_equal(atomic_load(&callbacks_run), ROUNDS);
    assert_int_equal(atomic_load(&relocked), 0);
    assert_int_equal(atomic_load(&on_waiter), 0);
}

int main(void)
{
    /* The loop and the waiter poll for a long time after each activity:
     * the case where a waiter used to run the loop itself. */
    setenv("C10D_LOOP_SPIN_US", "1000000", 1);
    setenv("C10D_WAIT_SPIN_US", "1000000", 1);
    c10d__env_reload();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_waiting_with_a_lock_held),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
