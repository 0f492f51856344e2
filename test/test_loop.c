/* The engine thread: cross-thread posting, shutdown with pending work,
 * restart, and fork. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "c10d.h"
#include "engine/env.h"
#include "engine/loop.h"
#include "engine/loop_call.h"
#include "engine/work.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define POSTERS 4
#define POSTS   5000

struct seq_task {
    struct c10d__task task;
    int poster, seq;
};

static int last_seen[POSTERS];
static atomic_int out_of_order, ran, wrong_thread;

static void seq_task_fn(struct c10d__task *t)
{
    struct seq_task *s = (struct seq_task *)t;
    if (!c10d__on_loop_thread())
        atomic_fetch_add(&wrong_thread, 1);
    if (s->seq != last_seen[s->poster] + 1) /* loop thread only: no race */
        atomic_fetch_add(&out_of_order, 1);
    last_seen[s->poster] = s->seq;
    atomic_fetch_add(&ran, 1);
    free(s);
}

static void *poster(void *arg)
{
    int id = (int)(intptr_t)arg;
    for (int i = 0; i < POSTS; i++) {
        struct seq_task *s = malloc(sizeof *s);
        s->task.fn = seq_task_fn;
        s->poster = id;
        s->seq = i;
        if (c10d__engine_post(&s->task) != 0)
            free(s);
    }
    return NULL;
}

static void test_post_fifo_from_many_threads(void **state)
{
    (void)state;
    for (int i = 0; i < POSTERS; i++)
        last_seen[i] = -1;
    pthread_t t[POSTERS];
    for (int i = 0; i < POSTERS; i++)
        pthread_create(&t[i], NULL, poster, (void *)(intptr_t)i);
    for (int i = 0; i < POSTERS; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < 10000 && atomic_load(&ran) < POSTERS * POSTS; i++)
        usleep(1000);
    assert_int_equal(atomic_load(&ran), POSTERS * POSTS);
    assert_int_equal(atomic_load(&out_of_order), 0);
    assert_int_equal(atomic_load(&wrong_thread), 0);
}

/* With one task per wake-up, a flood of posts exercises the carry-over path
 * (a lost wake-up there once left tasks queued forever). */
static void test_post_with_batch_of_one(void **state)
{
    assert_int_equal(c10d_shutdown(), 0);
    setenv("C10D_ENGINE_BATCH", "1", 1);
    c10d__env_reload();
    atomic_store(&ran, 0);
    test_post_fifo_from_many_threads(state);
    assert_int_equal(c10d_shutdown(), 0);
    unsetenv("C10D_ENGINE_BATCH");
    c10d__env_reload();
}

/* A task that posts a follow-up from the loop thread (the path that starts the
 * spin handle instead of writing to the eventfd) until `hops` reach zero. */
struct hop_task {
    struct c10d__task task;
    int hops;
};

static atomic_int hops_done;

static void hop_task_fn(struct c10d__task *t)
{
    struct hop_task *h = (struct hop_task *)t;
    if (h->hops-- > 0 && c10d__engine_post(&h->task) == 0)
        return;
    atomic_fetch_add(&hops_done, 1);
    free(h);
}

static void *slow_poster(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg;
    for (int i = 0; i < 300; i++) {
        struct hop_task *h = malloc(sizeof *h);
        h->task.fn = hop_task_fn;
        h->hops = 3;
        if (c10d__engine_post(&h->task) != 0)
            free(h);
        /* Gaps around the spin time: some posts land while the loop spins,
         * some just as it stops, some once it sleeps in epoll. */
        usleep(rand_r(&seed) % 40);
    }
    return NULL;
}

/* Posts racing the end of the loop's busy poll: none may be left without a
 * wake-up (a task stranded in the queue would never run). */
static void test_posts_racing_spin_end(void **state)
{
    (void)state;
    const char *spins[] = {"1", "20", "0"};
    for (size_t k = 0; k < sizeof spins / sizeof spins[0]; k++) {
        assert_int_equal(c10d_shutdown(), 0);
        setenv("C10D_LOOP_SPIN_US", spins[k], 1);
        c10d__env_reload();
        atomic_store(&hops_done, 0);
        pthread_t t[POSTERS];
        for (int i = 0; i < POSTERS; i++)
            pthread_create(&t[i], NULL, slow_poster, (void *)(intptr_t)(i + 1));
        for (int i = 0; i < POSTERS; i++)
            pthread_join(t[i], NULL);
        for (int i = 0; i < 10000 && atomic_load(&hops_done) < POSTERS * 300; i++)
            usleep(1000);
        assert_int_equal(atomic_load(&hops_done), POSTERS * 300);
    }
    assert_int_equal(c10d_shutdown(), 0);
    unsetenv("C10D_LOOP_SPIN_US");
    c10d__env_reload();
}

static void count_status(c10d_work *w, int status, void *arg)
{
    (void)w;
    if (status == C10D_EABORTED)
        atomic_fetch_add((atomic_int *)arg, 1);
}

static void test_shutdown_with_pending_work(void **state)
{
    (void)state;
    atomic_int aborted = 0;
    c10d_work *w[10];
    for (int i = 0; i < 10; i++) {
        assert_int_equal(c10d_work_create("pending", i % 2 ? 600000 : 0, &w[i]), 0);
        c10d_work_on_complete(w[i], count_status, &aborted);
    }
    assert_int_equal(c10d__work_pending_count(), 10);
    assert_int_equal(c10d_shutdown(), 0);
    /* Every callback ran before c10d_shutdown returned. */
    assert_int_equal(atomic_load(&aborted), 10);
    assert_int_equal(c10d__work_pending_count(), 0);
    for (int i = 0; i < 10; i++) {
        assert_int_equal(c10d_work_wait(w[i], 0), C10D_EABORTED);
        assert_non_null(strstr(c10d_work_message(w[i]), "shut down"));
        c10d_work_release(w[i]);
    }
    /* The engine starts again on the next use. */
    c10d_work *again;
    assert_int_equal(c10d_work_create("after restart", 20, &again), 0);
    assert_int_equal(c10d_work_wait(again, 5000), C10D_ETIMEDOUT);
    c10d_work_release(again);
    assert_int_equal(c10d_shutdown(), 0);
    assert_int_equal(c10d_shutdown(), 0); /* idempotent */
}

/* Works created by callbacks while c10d_shutdown runs: the first (before
 * posting closes) is failed by the last sweep; one created after posting
 * closed is refused, so no work is ever left pending past shutdown. */
static c10d_work *created_in_cb;
static atomic_int late_create_rc;

static void create_late(c10d_work *w, int status, void *arg)
{
    (void)w;
    (void)status;
    (void)arg;
    c10d_work *late = NULL;
    atomic_store(&late_create_rc, c10d_work_create("too late", 0, &late));
    if (late != NULL) {
        c10d_work_complete(late, C10D_OK, NULL);
        c10d_work_release(late);
    }
}

static void create_during_shutdown(c10d_work *w, int status, void *arg)
{
    (void)w;
    (void)status;
    (void)arg;
    if (c10d_work_create("created by a callback", 0, &created_in_cb) == 0)
        c10d_work_on_complete(created_in_cb, create_late, NULL);
}

static void test_works_created_during_shutdown(void **state)
{
    (void)state;
    c10d_work *w;
    assert_int_equal(c10d_work_create("pending at shutdown", 0, &w), 0);
    c10d_work_on_complete(w, create_during_shutdown, NULL);
    atomic_store(&late_create_rc, 1);
    assert_int_equal(c10d_shutdown(), 0);
    assert_non_null(created_in_cb);
    assert_int_equal(c10d_work_wait(created_in_cb, 0), C10D_EABORTED);
    assert_int_equal(atomic_load(&late_create_rc), C10D_EABORTED);
    assert_int_equal(c10d__work_pending_count(), 0);
    c10d_work_release(created_in_cb);
    c10d_work_release(w);
}

static atomic_int shutdown_rc;

static void shutdown_inside_callback(c10d_work *w, int status, void *arg)
{
    (void)w;
    (void)status;
    atomic_store(&shutdown_rc, c10d_shutdown());
    atomic_store((atomic_int *)arg, 1);
}

static void test_shutdown_from_callback_fails(void **state)
{
    (void)state;
    atomic_int done = 0;
    c10d_work *w;
    assert_int_equal(c10d_work_create("t", 0, &w), 0);
    c10d_work_on_complete(w, shutdown_inside_callback, &done);
    c10d_work_complete(w, C10D_OK, NULL);
    for (int i = 0; i < 5000 && !atomic_load(&done); i++)
        usleep(1000);
    assert_int_equal(atomic_load(&shutdown_rc), C10D_EDEADLK);
    c10d_work_release(w);
}

static void *shutdown_thread(void *arg)
{
    (void)arg;
    return (void *)(intptr_t)c10d_shutdown();
}

static void test_concurrent_shutdown(void **state)
{
    (void)state;
    for (int round = 0; round < 20; round++) {
        c10d_work *w;
        assert_int_equal(c10d_work_create("t", 1000, &w), 0);
        pthread_t t[3];
        for (int i = 0; i < 3; i++)
            pthread_create(&t[i], NULL, shutdown_thread, NULL);
        for (int i = 0; i < 3; i++) {
            void *rc;
            pthread_join(t[i], &rc);
            assert_int_equal((int)(intptr_t)rc, 0);
        }
        assert_int_equal(c10d_work_wait(w, 1000), C10D_EABORTED);
        c10d_work_release(w);
    }
}

static void *complete_soon(void *arg)
{
    usleep(10000);
    c10d_work_complete(arg, C10D_OK, NULL);
    return NULL;
}

/* In the child: a fresh engine must work (deadline timer, cross-thread completion). */
static int child_uses_engine(void)
{
    c10d_work *a, *b;
    if (c10d_work_create("child deadline", 20, &a) != 0)
        return 10;
    if (c10d_work_wait(a, 5000) != C10D_ETIMEDOUT)
        return 11;
    if (c10d_work_create("child completion", 5000, &b) != 0)
        return 12;
    pthread_t t;
    pthread_create(&t, NULL, complete_soon, b);
    int rc = c10d_work_wait(b, 5000);
    pthread_join(t, NULL);
    if (rc != 0)
        return 13;
    c10d_work_release(a);
    c10d_work_release(b);
    if (c10d_shutdown() != 0)
        return 14;
    return 0;
}

static void test_fork(void **state)
{
    (void)state;
#ifdef __SANITIZE_THREAD__
    /* TSan cannot start threads in the child of a multi-threaded process. */
    skip();
#endif
    /* Parent has a running engine with a pending work when it forks. */
    c10d_work *pending;
    assert_int_equal(c10d_work_create("parent pending", 600000, &pending), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        alarm(20); /* a hung child is killed, and the parent sees the signal */
        _exit(child_uses_engine());
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    /* The parent's engine is unaffected. */
    assert_int_equal(c10d_work_test(pending), 0);
    c10d_work_complete(pending, C10D_OK, NULL);
    assert_int_equal(c10d_work_wait(pending, 1000), 0);
    c10d_work_release(pending);
}

/* A fork while another thread reads the environment (under its lock, most
 * of the time here): the child's first read must not find that lock held by
 * a thread the child does not have. */
static atomic_int env_reader_stop;

static void *reread_env(void *arg)
{
    (void)arg;
    while (!atomic_load(&env_reader_stop))
        c10d__env_reload();
    return NULL;
}

static void test_fork_while_env_read(void **state)
{
    (void)state;
#ifdef __SANITIZE_THREAD__
    skip();
#endif
    atomic_store(&env_reader_stop, 0);
    pthread_t reader;
    assert_int_equal(pthread_create(&reader, NULL, reread_env, NULL), 0);
    int bad = 0;
    for (int i = 0; i < 200 && !bad; i++) {
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            alarm(5); /* a child stuck on the lock is killed, and counted */
            c10d__env_reload();
            _exit(c10d__env_generation() > 0 ? 0 : 1);
        }
        int status = 0;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        bad = !WIFEXITED(status) || WEXITSTATUS(status) != 0;
    }
    atomic_store(&env_reader_stop, 1);
    pthread_join(reader, NULL);
    assert_false(bad);
}

/* ------------------------------------------------ run on the loop and wait */

static void answer_at_once(struct c10d__loop_call *call, void *arg)
{
    *(int *)arg = c10d_on_loop_thread();
    c10d__loop_call_done(call, C10D_ESTORE, "the loop side's reason");
}

static struct c10d__loop_call *parked_call;
static atomic_int released;

static void answer_later(struct c10d__loop_call *call, void *arg)
{
    (void)arg;
    parked_call = call;
}

static void release_flag(void *arg)
{
    (void)arg;
    atomic_store(&released, 1);
}

static void answer_parked(void *arg)
{
    (void)arg;
    c10d__loop_call_done(parked_call, 0, NULL);
}

static void *shutdown_soon(void *arg)
{
    (void)arg;
    usleep(50000);
    c10d_shutdown();
    return NULL;
}

static void try_from_loop(struct c10d__loop_call *call, void *arg)
{
    int abandoned;
    int *rc = arg;
    *rc = c10d__loop_call_run(answer_at_once, NULL, NULL, 1000, "nested", &abandoned);
    c10d__loop_call_done(call, 0, NULL);
}

static void test_loop_call(void **state)
{
    (void)state;
    int on_loop = 0, abandoned = 1;
    /* The answer and its message come back; fn ran on the loop thread. */
    assert_int_equal(c10d__loop_call_run(answer_at_once, &on_loop, NULL, 5000, "late", &abandoned),
                     C10D_ESTORE);
    assert_false(abandoned);
    assert_true(on_loop);
    assert_string_equal(c10d_last_error(), "the loop side's reason");
    /* A loop side that answers after the deadline: the caller returns, and
     * release runs in its stead when the answer comes. */
    atomic_store(&released, 0);
    assert_int_equal(
        c10d__loop_call_run(answer_later, NULL, release_flag, 50, "gave up", &abandoned),
        C10D_ETIMEDOUT);
    assert_true(abandoned);
    assert_string_equal(c10d_last_error(), "gave up");
    assert_false(atomic_load(&released));
    assert_int_equal(c10d__engine_call(answer_parked, NULL), 0);
    for (int i = 0; i < 5000 && !atomic_load(&released); i++)
        usleep(1000);
    assert_true(atomic_load(&released));
    /* On the loop thread it would wait for itself. */
    int nested = 0;
    assert_int_equal(c10d__loop_call_run(try_from_loop, &nested, NULL, 5000, "late", &abandoned),
                     0);
    assert_int_equal(nested, C10D_EDEADLK);
    /* Shutdown while the loop side has not answered: the waiter returns at
     * once (the engine aborts the call's work), and the call is abandoned,
     * so the caller never touches arg again. */
    pthread_t stopper;
    assert_int_equal(pthread_create(&stopper, NULL, shutdown_soon, NULL), 0);
    uint64_t t0 = uv_hrtime();
    assert_int_equal(
        c10d__loop_call_run(answer_later, NULL, release_flag, 20000, "gave up", &abandoned),
        C10D_EABORTED);
    assert_true(abandoned);
    assert_true(uv_hrtime() - t0 < 10000000000ull);
    pthread_join(stopper, NULL);
}

/* A shutdown hook that holds the stop keeps the loop serving: a timer it
 * started fires, and only its release lets c10d_shutdown return. */
static uv_timer_t hold_timer;
static struct c10d__shutdown_hook hold_hook;
static atomic_int hold_released, hold_stopping_seen;

static void hold_timer_closed(uv_handle_t *h)
{
    (void)h;
}

static void on_hold_timer(uv_timer_t *t)
{
    /* Posting is still open while held: the stop has not gone past the hooks. */
    if (c10d__engine_stopping())
        atomic_store(&hold_stopping_seen, 1);
    atomic_store(&hold_released, 1);
    uv_close((uv_handle_t *)t, hold_timer_closed);
    c10d__engine_release_stop();
}

static void hold_hook_fn(struct c10d__shutdown_hook *h)
{
    (void)h;
    c10d__engine_hold_stop();
    uv_timer_init(c10d__engine_loop(), &hold_timer);
    uv_timer_start(&hold_timer, on_hold_timer, 200, 0);
}

static void register_hold(struct c10d__loop_call *call, void *arg)
{
    (void)arg;
    hold_hook.fn = hold_hook_fn;
    c10d__engine_on_shutdown(&hold_hook);
    c10d__loop_call_done(call, 0, NULL);
}

static void test_shutdown_hold(void **state)
{
    (void)state;
    atomic_store(&hold_released, 0);
    int abandoned = 0;
    assert_int_equal(c10d__loop_call_run(register_hold, NULL, NULL, 5000, "late", &abandoned), 0);
    assert_int_equal(c10d_shutdown(), 0);
    assert_int_equal(atomic_load(&hold_released), 1);
    assert_int_equal(atomic_load(&hold_stopping_seen), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_post_fifo_from_many_threads),
        cmocka_unit_test(test_post_with_batch_of_one),
        cmocka_unit_test(test_posts_racing_spin_end),
        cmocka_unit_test(test_shutdown_with_pending_work),
        cmocka_unit_test(test_works_created_during_shutdown),
        cmocka_unit_test(test_shutdown_from_callback_fails),
        cmocka_unit_test(test_concurrent_shutdown),
        cmocka_unit_test(test_fork),
        cmocka_unit_test(test_fork_while_env_read),
        cmocka_unit_test(test_loop_call),
        cmocka_unit_test(test_shutdown_hold),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    c10d_shutdown();
    return rc;
}
