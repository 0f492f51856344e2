/* A write to a peer that reset its connection must never end the process.
 * Only the engine's thread runs the loop and blocks SIGPIPE; a waiting user
 * thread writes nothing and keeps its mask. The program keeps SIGPIPE's
 * default action here, as most programs do (docs/engine.md). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "c10d.h"
#include "engine/env.h"
#include "engine/loop.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

struct broken_write {
    c10d_work *w;
    pthread_t waiter;
    int fd; /* its peer is closed: a write raises SIGPIPE */
    atomic_int on_waiter, epipe;
};

static void write_to_closed_peer(void *arg)
{
    struct broken_write *b = arg;
    if (pthread_equal(pthread_self(), b->waiter))
        atomic_fetch_add(&b->on_waiter, 1);
    char byte = 0;
    /* A plain write(), as libuv's stream writes are: no MSG_NOSIGNAL. */
    if (write(b->fd, &byte, 1) < 0)
        atomic_fetch_add(&b->epipe, 1);
    c10d_work_complete(b->w, C10D_OK, NULL);
}

static int rounds_of_broken_writes(struct broken_write *b, int rounds)
{
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    close(sv[1]);
    b->fd = sv[0];
    b->waiter = pthread_self();
    for (int i = 0; i < rounds; i++) {
        assert_int_equal(c10d_work_create("broken write", 0, &b->w), 0);
        assert_int_equal(c10d__engine_call(write_to_closed_peer, b), 0);
        assert_int_equal(c10d_work_wait(b->w, 10000), 0);
        c10d_work_release(b->w);
    }
    close(sv[0]);
    return atomic_load(&b->epipe);
}

static void assert_mask_untouched(void)
{
    sigset_t mask, pending;
    pthread_sigmask(SIG_SETMASK, NULL, &mask);
    assert_false(sigismember(&mask, SIGPIPE));
    sigpending(&pending);
    assert_false(sigismember(&pending, SIGPIPE));
}

static void test_loop_thread_write(void **state)
{
    (void)state;
    /* Waiters sleep: every task runs on the engine's thread. */
    setenv("C10D_WAIT_SPIN_US", "0", 1);
    c10d__env_reload();
    struct broken_write b = {0};
    assert_int_equal(rounds_of_broken_writes(&b, 20), 20);
    assert_int_equal(atomic_load(&b.on_waiter), 0);
    unsetenv("C10D_WAIT_SPIN_US");
    c10d__env_reload();
    assert_mask_untouched();
    assert_int_equal(c10d_shutdown(), 0);
}

static void test_waiter_thread_write(void **state)
{
    (void)state;
    /* The loop and the waiter both poll between rounds: still every write
     * runs on the engine's thread, and the waiter's mask is not touched. */
    setenv("C10D_LOOP_SPIN_US", "200000", 1);
    setenv("C10D_WAIT_SPIN_US", "200000", 1);
    c10d__env_reload();
    struct broken_write b = {0};
    assert_int_equal(rounds_of_broken_writes(&b, 2000), 2000);
    unsetenv("C10D_LOOP_SPIN_US");
    unsetenv("C10D_WAIT_SPIN_US");
    c10d__env_reload();
    assert_int_equal(atomic_load(&b.on_waiter), 0);
    assert_mask_untouched();
    assert_int_equal(c10d_shutdown(), 0);
}

/* A program that blocks SIGPIPE itself keeps it blocked. */
static void test_program_mask_kept(void **state)
{
    (void)state;
    sigset_t pipe_set, old, mask;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
    setenv("C10D_LOOP_SPIN_US", "200000", 1);
    c10d__env_reload();
    struct broken_write b = {0};
    rounds_of_broken_writes(&b, 200);
    unsetenv("C10D_LOOP_SPIN_US");
    c10d__env_reload();
    pthread_sigmask(SIG_SETMASK, NULL, &mask);
    assert_true(sigismember(&mask, SIGPIPE));
    /* Drop what our own writes left pending on this thread. */
    const struct timespec zero = {0, 0};
    while (sigtimedwait(&pipe_set, NULL, &zero) == SIGPIPE)
        ;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    assert_int_equal(c10d_shutdown(), 0);
}

int main(void)
{
    signal(SIGPIPE, SIG_DFL);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_loop_thread_write),
        cmocka_unit_test(test_waiter_thread_write),
        cmocka_unit_test(test_program_mask_kept),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
