/* Works and futures: exactly-once callbacks under races, ordering, deadlines,
 * waits, and reference counting. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "c10d.h"
#include "engine/env.h"
#include "engine/loop.h"
#include "engine/work.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct record {
    atomic_int calls;
    atomic_int on_loop;
    int status;
    int order[64];
    atomic_int norder;
};

static void record_cb(c10d_work *w, int status, void *arg)
{
    (void)w;
    struct record *r = arg;
    r->status = status; /* published by the atomic increment below */
    atomic_fetch_add(&r->on_loop, c10d_on_loop_thread());
    atomic_fetch_add(&r->calls, 1);
}

struct ordered {
    struct record *rec;
    int id;
};

static void ordered_cb(c10d_work *w, int status, void *arg)
{
    (void)w;
    (void)status;
    struct ordered *o = arg;
    int i = atomic_fetch_add(&o->rec->norder, 1);
    if (i < 64)
        o->rec->order[i] = o->id;
}

static void wait_calls(struct record *r, int n)
{
    for (int i = 0; i < 5000 && atomic_load(&r->calls) < n; i++)
        usleep(1000);
}

static void test_callback_once_on_loop(void **state)
{
    (void)state;
    struct record r = {0};
    c10d_work *w;
    assert_int_equal(c10d_work_create("t", 0, &w), 0);
    assert_int_equal(c10d_work_test(w), 0);
    assert_int_equal(c10d_work_on_complete(w, record_cb, &r), 0);
    assert_int_equal(c10d_work_complete(w, C10D_ECLOSED, "peer 3 went away"), 1);
    assert_int_equal(c10d_work_complete(w, C10D_OK, NULL), 0); /* first completion wins */
    assert_int_equal(c10d_work_wait(w, 1000), C10D_ECLOSED);
    assert_string_equal(c10d_last_error(), "peer 3 went away");
    assert_string_equal(c10d_work_message(w), "peer 3 went away");
    wait_calls(&r, 1);
    usleep(20000);
    assert_int_equal(atomic_load(&r.calls), 1);
    assert_int_equal(atomic_load(&r.on_loop), 1);
    assert_int_equal(r.status, C10D_ECLOSED);
    assert_int_equal(c10d_work_test(w), 1);
    c10d_work_release(w);
}

static void test_order_before_and_after_completion(void **state)
{
    (void)state;
    struct record r = {0};
    struct ordered o[20];
    c10d_work *w;
    assert_int_equal(c10d_work_create("t", 0, &w), 0);
    for (int i = 0; i < 10; i++) {
        o[i] = (struct ordered){&r, i};
        assert_int_equal(c10d_work_on_complete(w, ordered_cb, &o[i]), 0);
    }
    c10d_work_complete(w, C10D_OK, NULL);
    for (int i = 10; i < 20; i++) {
        o[i] = (struct ordered){&r, i};
        assert_int_equal(c10d_work_on_complete(w, ordered_cb, &o[i]), 0);
    }
    assert_int_equal(c10d_work_on_complete(w, record_cb, &r), 0);
    wait_calls(&r, 1);
    assert_int_equal(atomic_load(&r.norder), 20);
    for (int i = 0; i < 20; i++)
        assert_int_equal(r.order[i], i);
    c10d_work_release(w);
}

static void test_deadline(void **state)
{
    (void)state;
    struct record r = {0};
    c10d_work *w;
    assert_int_equal(c10d_work_create("all_reduce seq 7", 50, &w), 0);
    c10d_work_on_complete(w, record_cb, &r);
    assert_int_equal(c10d_work_wait(w, 10000), C10D_ETIMEDOUT);
    assert_string_equal(c10d_work_message(w), "all_reduce seq 7 timed out after 50 ms");
    wait_calls(&r, 1);
    assert_int_equal(r.status, C10D_ETIMEDOUT);
    /* A late completion loses to the deadline. */
    assert_int_equal(c10d_work_complete(w, C10D_OK, NULL), 0);
    c10d_work_release(w);
}

static void test_completion_beats_deadline(void **state)
{
    (void)state;
    c10d_work *w;
    assert_int_equal(c10d_work_create("t", 100, &w), 0);
    c10d_work_complete(w, C10D_OK, NULL);
    usleep(200000);
    assert_int_equal(c10d_work_wait(w, 0), C10D_OK);
    c10d_work_release(w);
}

static void test_wait_timeout_leaves_work_pending(void **state)
{
    (void)state;
    c10d_work *w;
    assert_int_equal(c10d_work_create("slow op", 0, &w), 0);
    assert_int_equal(c10d_work_wait(w, 30), C10D_ETIMEDOUT);
    assert_non_null(strstr(c10d_last_error(), "still pending"));
    assert_int_equal(c10d_work_test(w), 0);
    c10d_work_complete(w, C10D_OK, NULL);
    assert_int_equal(c10d_work_wait(w, -1), C10D_OK);
    c10d_work_release(w);
}

#define SLEEPERS 6

struct sleeper {
    c10d_work *w;
    int64_t timeout_ms;
    atomic_int rc;
};

static void *sleeper_main(void *arg)
{
    struct sleeper *s = arg;
    atomic_store(&s->rc, c10d_work_wait(s->w, s->timeout_ms));
    return NULL;
}

/* Waiters asleep on the work (no polling), some with a deadline and some
 * without: one completion from another thread wakes every one of them with the
 * work's status, and a waiter whose deadline passes first times out alone. */
static void test_sleeping_waiters_all_woken(void **state)
{
    (void)state;
    assert_int_equal(c10d_shutdown(), 0);
    setenv("C10D_WAIT_SPIN_US", "0", 1);
    c10d__env_reload();
    c10d_work *w;
    assert_int_equal(c10d_work_create("shared op", 0, &w), 0);
    struct sleeper s[SLEEPERS + 1];
    pthread_t t[SLEEPERS + 1];
    for (int i = 0; i <= SLEEPERS; i++) {
        s[i].w = w;
        s[i].timeout_ms = i == SLEEPERS ? 20 : i % 2 ? 60000 : -1;
        atomic_init(&s[i].rc, 1);
        pthread_create(&t[i], NULL, sleeper_main, &s[i]);
    }
    pthread_join(t[SLEEPERS], NULL);
    assert_int_equal(atomic_load(&s[SLEEPERS].rc), C10D_ETIMEDOUT);
    for (int i = 0; i < SLEEPERS; i++)
        assert_int_equal(atomic_load(&s[i].rc), 1); /* still asleep */
    c10d_work_complete(w, C10D_ECLOSED, "peer gone");
    for (int i = 0; i < SLEEPERS; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(atomic_load(&s[i].rc), C10D_ECLOSED);
    }
    c10d_work_release(w);
    unsetenv("C10D_WAIT_SPIN_US");
    c10d__env_reload();
}

struct loop_wait {
    atomic_int rc;
    atomic_int done;
};

static void wait_inside_callback(c10d_work *w, int status, void *arg)
{
    (void)status;
    struct loop_wait *lw = arg;
    atomic_store(&lw->rc, c10d_work_wait(w, 1000));
    atomic_store(&lw->done, 1);
}

static void test_wait_on_loop_thread_fails(void **state)
{
    (void)state;
    struct loop_wait lw = {0};
    c10d_work *w;
    assert_int_equal(c10d_work_create("t", 0, &w), 0);
    c10d_work_on_complete(w, wait_inside_callback, &lw);
    c10d_work_complete(w, C10D_OK, NULL);
    for (int i = 0; i < 5000 && !atomic_load(&lw.done); i++)
        usleep(1000);
    assert_int_equal(atomic_load(&lw.rc), C10D_EDEADLK);
    c10d_work_release(w);
}

static void release_in_callback(c10d_work *w, int status, void *arg)
{
    (void)status;
    c10d_work_release(w);
    atomic_fetch_add((atomic_int *)arg, 1);
}

static void test_callback_releases_last_reference(void **state)
{
    (void)state;
    atomic_int n = 0;
    for (int i = 0; i < 100; i++) {
        c10d_work *w;
        assert_int_equal(c10d_work_create("t", i % 2 ? 1000 : 0, &w), 0);
        c10d_work_on_complete(w, release_in_callback, &n);
        c10d_work_complete(w, C10D_OK, NULL); /* the callback owns the only reference now */
    }
    for (int i = 0; i < 5000 && atomic_load(&n) < 100; i++)
        usleep(1000);
    assert_int_equal(atomic_load(&n), 100);
}

/* A wait with no deadline never reports a timeout, even while another
 * thread keeps adding callbacks to the completed work it waits on (each
 * makes the work unsettled again for a moment). */
struct adder {
    c10d_work *w;
    atomic_int stop;
    atomic_int added;
};

static void count_added_cb(c10d_work *w, int status, void *arg)
{
    (void)w;
    (void)status;
    atomic_fetch_add((atomic_int *)arg, 1);
}

static void *adder_main(void *arg)
{
    struct adder *a = arg;
    static atomic_int ran;
    /* Bounded: a thread adding callbacks without pause keeps the work
     * unsettled, and waiters wait for every callback there is. */
    for (int i = 0; i < 5000 && !atomic_load(&a->stop); i++) {
        if (c10d_work_on_complete(a->w, count_added_cb, &ran) == 0)
            atomic_fetch_add(&a->added, 1);
        if (i % 16 == 0)
            sched_yield();
    }
    atomic_store(&a->stop, 1);
    return NULL;
}

static void test_unbounded_wait_never_times_out(void **state)
{
    (void)state;
    struct adder a = {0};
    assert_int_equal(c10d_work_create("t", 0, &a.w), 0);
    c10d_work_complete(a.w, C10D_OK, NULL);
    pthread_t t;
    pthread_create(&t, NULL, adder_main, &a);
    while (atomic_load(&a.added) == 0)
        sched_yield();
    for (int i = 0; !atomic_load(&a.stop); i++) {
        int rc = c10d_work_wait(a.w, -1);
        if (rc != 0)
            fail_msg("wait %d returned %s: %s", i, c10d_status_name(rc), c10d_last_error());
    }
    pthread_join(t, NULL);
    assert_true(atomic_load(&a.added) > 0);
    assert_int_equal(c10d_work_wait(a.w, -1), 0);
    c10d_work_release(a.w);
}

static void test_bad_arguments(void **state)
{
    (void)state;
    c10d_work *w;
    assert_int_equal(c10d_work_create("t", 0, NULL), C10D_EINVAL);
    assert_int_equal(c10d_work_create("t", -5, &w), C10D_EINVAL);
    assert_non_null(strstr(c10d_last_error(), "timeout_ms"));
    assert_int_equal(c10d_work_create("t", 0, &w), 0);
    assert_int_equal(c10d_work_complete(w, 3, NULL), C10D_EINVAL);
    assert_int_equal(c10d_work_on_complete(w, NULL, NULL), C10D_EINVAL);
    assert_int_equal(c10d_work_test(w), 0);
    c10d_work_complete(w, C10D_OK, NULL);
    c10d_work_release(w);
}

/* Many threads race to complete, register, wait and release on the same works. */
#define RACE_WORKS   200
#define RACE_THREADS 8

struct race {
    c10d_work *works[RACE_WORKS];
    atomic_int wins[RACE_WORKS];
    atomic_int calls[RACE_WORKS];
    atomic_int registered[RACE_WORKS];
    atomic_int wait_errors;
    pthread_barrier_t start;
};

struct race_arg {
    struct race *race;
    int index;
};

static void race_cb(c10d_work *w, int status, void *arg)
{
    (void)w;
    (void)status;
    atomic_fetch_add((atomic_int *)arg, 1);
}

static void *race_thread(void *p)
{
    struct race_arg *a = p;
    struct race *r = a->race;
    pthread_barrier_wait(&r->start);
    for (int i = 0; i < RACE_WORKS; i++) {
        c10d_work *w = r->works[i];
        c10d_work_retain(w);
        if (c10d_work_on_complete(w, race_cb, &r->calls[i]) == 0)
            atomic_fetch_add(&r->registered[i], 1);
        if ((i + a->index) % 3 == 0)
            atomic_fetch_add(&r->wins[i], c10d_work_complete(w, -(a->index % 2), "raced"));
        if ((i + a->index) % 4 == 0 && c10d_work_wait(w, 20000) > 0)
            atomic_fetch_add(&r->wait_errors, 1);
        c10d_work_release(w);
        if (a->index == 0)
            c10d_work_complete(w, C10D_OK, NULL); /* make sure every work completes */
    }
    return NULL;
}

static void test_exactly_once_under_races(void **state)
{
    (void)state;
    struct race *r = calloc(1, sizeof *r);
    for (int i = 0; i < RACE_WORKS; i++)
        assert_int_equal(c10d_work_create("race", i % 5 == 0 ? 1 : 0, &r->works[i]), 0);
    pthread_barrier_init(&r->start, NULL, RACE_THREADS);
    pthread_t t[RACE_THREADS];
    struct race_arg args[RACE_THREADS];
    for (int i = 0; i < RACE_THREADS; i++) {
        args[i] = (struct race_arg){r, i};
        pthread_create(&t[i], NULL, race_thread, &args[i]);
    }
    for (int i = 0; i < RACE_THREADS; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < RACE_WORKS; i++) {
        assert_int_not_equal(c10d_work_wait(r->works[i], 20000), 1);
        assert_true(atomic_load(&r->wins[i]) <= 1);
    }
    /* Every registered callback runs exactly once, none more. */
    for (int spin = 0; spin < 10000; spin++) {
        int all = 1;
        for (int i = 0; i < RACE_WORKS; i++)
            all &= atomic_load(&r->calls[i]) == atomic_load(&r->registered[i]);
        if (all)
            break;
        usleep(1000);
    }
    usleep(20000);
    for (int i = 0; i < RACE_WORKS; i++) {
        assert_int_equal(atomic_load(&r->registered[i]), RACE_THREADS);
        assert_int_equal(atomic_load(&r->calls[i]), RACE_THREADS);
        c10d_work_release(r->works[i]);
    }
    assert_int_equal(atomic_load(&r->wait_errors), 0);
    pthread_barrier_destroy(&r->start);
    free(r);
}

/* Only the engine's thread runs the loop: tasks and callbacks never run on a
 * waiting thread, however long the loop and the waiter poll. */
struct drive_probe {
    c10d_work *w;
    pthread_t waiter;
    atomic_int on_waiter, not_on_loop;
};

static void complete_task(void *arg)
{
    struct drive_probe *p = arg;
    if (pthread_equal(pthread_self(), p->waiter))
        atomic_fetch_add(&p->on_waiter, 1);
    if (!c10d_on_loop_thread())
        atomic_fetch_add(&p->not_on_loop, 1);
    c10d_work_complete(p->w, C10D_OK, NULL);
}

static int drive_rounds(int rounds)
{
    struct drive_probe p = {.waiter = pthread_self()};
    for (int i = 0; i < rounds; i++) {
        assert_int_equal(c10d_work_create("driven", 0, &p.w), 0);
        assert_int_equal(c10d__engine_call(complete_task, &p), 0);
        assert_int_equal(c10d_work_wait(p.w, 10000), 0);
        c10d_work_release(p.w);
    }
    assert_int_equal(atomic_load(&p.not_on_loop), 0);
    return atomic_load(&p.on_waiter);
}

static void test_waiter_never_runs_loop(void **state)
{
    (void)state;
    assert_int_equal(c10d_shutdown(), 0);
    setenv("C10D_LOOP_SPIN_US", "200000", 1);
    setenv("C10D_WAIT_SPIN_US", "200000", 1);
    c10d__env_reload();
    assert_int_equal(drive_rounds(2000), 0);
    unsetenv("C10D_LOOP_SPIN_US");
    unsetenv("C10D_WAIT_SPIN_US");
    c10d__env_reload();
    assert_int_equal(c10d_shutdown(), 0);
    setenv("C10D_WAIT_SPIN_US", "0", 1);
    c10d__env_reload();
    assert_int_equal(drive_rounds(500), 0);
    unsetenv("C10D_WAIT_SPIN_US");
    c10d__env_reload();
}

/* c10d_shutdown from another thread while a waiter polls its work: the
 * shutdown returns, and every wait ends with success or EABORTED. */
struct busy_waiter {
    atomic_int stop, rounds, bad;
};

static void complete_from_loop(void *arg)
{
    c10d_work_complete(arg, C10D_OK, NULL);
    c10d_work_release(arg);
}

static void *busy_waiter_main(void *arg)
{
    struct busy_waiter *b = arg;
    while (!atomic_load(&b->stop)) {
        c10d_work *w;
        if (c10d_work_create("busy", 0, &w) != 0)
            continue;
        c10d_work_retain(w); /* the task's reference */
        if (c10d__engine_call(complete_from_loop, w) != 0) {
            c10d_work_release(w);
            c10d_work_complete(w, C10D_EABORTED, "not posted");
        }
        int rc = c10d_work_wait(w, 10000);
        if (rc != 0 && rc != C10D_EABORTED)
            atomic_fetch_add(&b->bad, 1);
        c10d_work_release(w);
        atomic_fetch_add(&b->rounds, 1);
    }
    return NULL;
}

static void test_shutdown_while_waiter_polls(void **state)
{
    (void)state;
    struct busy_waiter b = {0};
    pthread_t t;
    pthread_create(&t, NULL, busy_waiter_main, &b);
    for (int i = 0; i < 5; i++) {
        int before = atomic_load(&b.rounds);
        for (int k = 0; k < 5000 && atomic_load(&b.rounds) < before + 100; k++)
            usleep(100);
        assert_int_equal(c10d_shutdown(), 0);
    }
    atomic_store(&b.stop, 1);
    pthread_join(t, NULL);
    assert_int_equal(atomic_load(&b.bad), 0);
    /* The last completer may still be leaving c10d_work_complete (it drops the
     * pending list's reference after waking the waiter). */
    for (int k = 0; k < 5000 && c10d__work_pending_count() > 0; k++)
        usleep(1000);
}

static int teardown_all(void **state)
{
    (void)state;
    assert_int_equal(c10d__work_pending_count(), 0);
    return c10d_shutdown();
}

/* A waiter returns only after the work's callbacks have run: a user who
 * counts finished buckets in callbacks and then waits on every bucket's work
 * reads an exact count. Completed from another thread and from the loop. */
#define BUCKETS 8

struct bucket_step {
    c10d_work *works[BUCKETS];
    atomic_int ran[BUCKETS];
    atomic_int finished;
};

static void bucket_cb(c10d_work *w, int status, void *arg)
{
    (void)w, (void)status;
    atomic_int *ran = arg;
    struct timespec ts = {0, 2000}; /* a callback that takes a moment */
    nanosleep(&ts, NULL);
    atomic_store(ran, 1);
}

static void count_cb(c10d_work *w, int status, void *arg)
{
    (void)w, (void)status;
    atomic_fetch_add((atomic_int *)arg, 1);
}

static void *bucket_completer(void *arg)
{
    struct bucket_step *s = arg;
    for (int b = 0; b < BUCKETS; b++)
        c10d_work_complete(s->works[b], C10D_OK, NULL);
    return NULL;
}

static void complete_on_loop(void *arg)
{
    bucket_completer(arg);
}

static void test_wait_returns_after_callbacks(void **state)
{
    (void)state;
    for (int step = 0; step < 500; step++) {
        struct bucket_step s = {0};
        for (int b = 0; b < BUCKETS; b++) {
            assert_int_equal(c10d_work_create("bucket", 0, &s.works[b]), 0);
            assert_int_equal(c10d_work_on_complete(s.works[b], bucket_cb, &s.ran[b]), 0);
            assert_int_equal(c10d_work_on_complete(s.works[b], count_cb, &s.finished), 0);
        }
        pthread_t t;
        if (step % 2)
            pthread_create(&t, NULL, bucket_completer, &s);
        else
            assert_int_equal(c10d__engine_call(complete_on_loop, &s), 0);
        for (int b = 0; b < BUCKETS; b++) {
            assert_int_equal(c10d_work_wait(s.works[b], 10000), 0);
            assert_int_equal(atomic_load(&s.ran[b]), 1);
        }
        assert_int_equal(atomic_load(&s.finished), BUCKETS);
        if (step % 2)
            pthread_join(t, NULL);
        /* A callback added after completion is waited for too. */
        assert_int_equal(c10d_work_on_complete(s.works[0], count_cb, &s.finished), 0);
        assert_int_equal(c10d_work_wait(s.works[0], 10000), 0);
        assert_int_equal(atomic_load(&s.finished), BUCKETS + 1);
        for (int b = 0; b < BUCKETS; b++)
            c10d_work_release(s.works[b]);
    }
}

/* A user thread completes works while c10d_shutdown stops the engine, after
 * posting closed and before the work module's last sweep: such a completion
 * cannot schedule its callbacks, and the last sweep must run them (on the
 * loop thread), so every callback runs exactly once and shutdown returns.
 * The works must be pending then: made by a task that runs between the
 * first sweep (which fails every pending work) and the closing of posting.
 * A sweep of the test's own, registered after the work module's and so run
 * before it, posts that task in the first sweep and lets the completer go in
 * the last. Before the fix those callbacks were dropped (a c10d_work_then
 * child never completed). */
#define STOP_RACE_WORKS 64
static c10d_work *stop_race_works[STOP_RACE_WORKS];
static atomic_int stop_race_armed, stop_race_made, stop_race_go, stop_race_done, stop_race_calls,
    stop_race_off_loop;

static void stop_race_cb(c10d_work *w, int status, void *arg)
{
    (void)w;
    (void)status;
    (void)arg;
    atomic_fetch_add(&stop_race_calls, 1);
    if (!c10d_on_loop_thread())
        atomic_fetch_add(&stop_race_off_loop, 1);
}

static void *stop_race_completer(void *p)
{
    (void)p;
    while (!atomic_load(&stop_race_go))
        sched_yield();
    for (int i = 0; i < STOP_RACE_WORKS; i++)
        c10d_work_complete(stop_race_works[i], 0, NULL);
    atomic_store(&stop_race_done, 1);
    return NULL;
}

static void stop_race_make(void *arg)
{
    (void)arg;
    for (int i = 0; i < STOP_RACE_WORKS; i++)
        if (c10d_work_create("race", 0, &stop_race_works[i]) != 0 ||
            c10d_work_on_complete(stop_race_works[i], stop_race_cb, NULL) != 0)
            return;
    atomic_store(&stop_race_made, 1);
}

/* Runs twice per shutdown: posts the task that makes the works in the first
 * run, lets the completer go in the second, once posting is closed. */
static void stop_race_sweep(void)
{
    if (!atomic_load(&stop_race_armed))
        return;
    if (!c10d__engine_stopping()) {
        c10d__engine_call(stop_race_make, NULL);
        return;
    }
    atomic_store(&stop_race_armed, 0);
    atomic_store(&stop_race_go, 1);
    for (int i = 0; i < 5000 && !atomic_load(&stop_race_done); i++)
        usleep(1000);
}

static struct c10d__shutdown_sweep stop_race = {stop_race_sweep, NULL};

static void test_completions_while_engine_stops(void **state)
{
    (void)state;
    c10d_work *first;
    assert_int_equal(c10d_work_create("registers the work module's sweep", 0, &first), 0);
    c10d_work_release(first);
    c10d__engine_add_sweep(&stop_race); /* after it: runs before it */
    for (int round = 0; round < 5; round++) {
        atomic_store(&stop_race_calls, 0);
        atomic_store(&stop_race_made, 0);
        atomic_store(&stop_race_go, 0);
        atomic_store(&stop_race_done, 0);
        c10d_work *start;
        assert_int_equal(c10d_work_create("starts the engine", 0, &start), 0);
        c10d_work_release(start);
        pthread_t t;
        assert_int_equal(pthread_create(&t, NULL, stop_race_completer, NULL), 0);
        atomic_store(&stop_race_armed, 1);
        assert_int_equal(c10d_shutdown(), 0);
        pthread_join(t, NULL);
        assert_true(atomic_load(&stop_race_made));
        assert_true(atomic_load(&stop_race_done));
        /* The completer's status won every race: the sweep let it go first. */
        for (int i = 0; i < STOP_RACE_WORKS; i++) {
            assert_int_equal(c10d_work_wait(stop_race_works[i], 10000), 0);
            c10d_work_release(stop_race_works[i]);
        }
        assert_int_equal(atomic_load(&stop_race_calls), STOP_RACE_WORKS);
    }
    assert_int_equal(atomic_load(&stop_race_off_loop), 0);
    c10d_shutdown();
}

/* A work keeps a short name in itself and a long one on the heap: both
 * come back whole, at and around the boundary (ASan checks the frees). */
static void test_names_of_every_length(void **state)
{
    (void)state;
    char name[400];
    for (size_t len = 0; len < sizeof name; len += len < 150 || len > 170 ? 37 : 1) {
        memset(name, 'a' + (int)(len % 26), len);
        name[len] = '\0';
        c10d_work *w;
        assert_int_equal(c10d__work_create_unarmed(&w, name, 0), 0);
        assert_string_equal(c10d__work_what(w), name);
        c10d_work_complete(w, C10D_OK, NULL);
        assert_int_equal(c10d_work_wait(w, -1), C10D_OK);
        c10d_work_release(w);
    }
    c10d_work *w;
    assert_int_equal(c10d__work_create_unarmed(&w, NULL, 0), 0);
    assert_string_equal(c10d__work_what(w), "work");
    c10d_work_complete(w, C10D_OK, NULL);
    c10d_work_release(w);
}

/* Deferred names: made at the first read, once, whoever reads first; a
 * prefix too long for the work's own buffer is named at creation. */
static atomic_int names_made;

static void make_rest(const void *args, char *buf, size_t len)
{
    atomic_fetch_add(&names_made, 1);
    int seq;
    memcpy(&seq, args, sizeof seq);
    snprintf(buf, len, "%d, OpType=ALLREDUCE)", seq);
}

static void *read_name(void *arg)
{
    return (void *)c10d__work_what(arg);
}

static c10d_work *named(const char *prefix, int seq, int64_t timeout_ms)
{
    struct c10d__work_name n = {.prefix = prefix,
                                .prefix_len = strlen(prefix),
                                .make = make_rest,
                                .args = &seq,
                                .args_len = sizeof seq};
    c10d_work *w;
    assert_int_equal(c10d__work_create_named(&w, &n, timeout_ms), 0);
    return w;
}

static void test_deferred_names(void **state)
{
    (void)state;
    atomic_store(&names_made, 0);
    c10d_work *w = named("[PG 0 (p) Rank 1] Work(SeqNum=", 42, 0);
    assert_int_equal(atomic_load(&names_made), 0);
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&t[i], NULL, read_name, w), 0);
    for (int i = 0; i < 4; i++) {
        void *got;
        pthread_join(t[i], &got);
        assert_string_equal(got, "[PG 0 (p) Rank 1] Work(SeqNum=42, OpType=ALLREDUCE)");
    }
    assert_int_equal(atomic_load(&names_made), 1);
    c10d_work_complete(w, C10D_OK, NULL);
    c10d_work_release(w);

    char prefix[201];
    memset(prefix, 'p', 200);
    prefix[200] = '\0';
    w = named(prefix, 7, 0);
    assert_int_equal(atomic_load(&names_made), 2);
    assert_int_equal(strncmp(c10d__work_what(w), prefix, 200), 0);
    assert_string_equal(c10d__work_what(w) + 200, "7, OpType=ALLREDUCE)");
    c10d_work_complete(w, C10D_OK, NULL);
    c10d_work_release(w);

    /* The deadline's message names the op in torch's watchdog words. */
    w = named("[PG 0 (p) Rank 1] Work(SeqNum=", 9, 50);
    c10d__work_arm(w);
    assert_int_equal(c10d_work_wait(w, 10000), C10D_ETIMEDOUT);
    assert_non_null(strstr(c10d_work_message(w), "Work(SeqNum=9, OpType=ALLREDUCE) ran for "));
    c10d_work_release(w);
}

/* A work named as another (an op's parts): neither name is made for the
 * other, and each reads as the model's. */
static void test_named_like(void **state)
{
    (void)state;
    const char *full = "[PG 0 (p) Rank 1] Work(SeqNum=5, OpType=ALLREDUCE)";
    atomic_store(&names_made, 0);
    c10d_work *model = named("[PG 0 (p) Rank 1] Work(SeqNum=", 5, 0), *part;
    assert_int_equal(c10d__work_create_like(&part, model, 0, NULL), 0);
    assert_int_equal(atomic_load(&names_made), 0);
    assert_string_equal(c10d__work_what(part), full);
    assert_int_equal(atomic_load(&names_made), 1);
    assert_string_equal(c10d__work_what(model), full);
    assert_int_equal(atomic_load(&names_made), 2);
    /* A model whose name is made: copied as it is, nothing made again. */
    c10d_work *late;
    assert_int_equal(c10d__work_create_like(&late, model, 0, NULL), 0);
    assert_string_equal(c10d__work_what(late), full);
    assert_int_equal(atomic_load(&names_made), 2);
    c10d_work *works[3] = {model, part, late};
    for (int i = 0; i < 3; i++) {
        c10d_work_complete(works[i], C10D_OK, NULL);
        c10d_work_release(works[i]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_callback_once_on_loop),
        cmocka_unit_test(test_sleeping_waiters_all_woken),
        cmocka_unit_test(test_order_before_and_after_completion),
        cmocka_unit_test(test_names_of_every_length),
        cmocka_unit_test(test_deferred_names),
        cmocka_unit_test(test_named_like),
        cmocka_unit_test(test_deadline),
        cmocka_unit_test(test_completion_beats_deadline),
        cmocka_unit_test(test_wait_timeout_leaves_work_pending),
        cmocka_unit_test(test_wait_on_loop_thread_fails),
        cmocka_unit_test(test_callback_releases_last_reference),
        cmocka_unit_test(test_unbounded_wait_never_times_out),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_exactly_once_under_races),
        cmocka_unit_test(test_waiter_never_runs_loop),
        cmocka_unit_test(test_shutdown_while_waiter_polls),
        cmocka_unit_test(test_wait_returns_after_callbacks),
        cmocka_unit_test(test_completions_while_engine_stops),
    };
    return cmocka_run_group_tests(tests, NULL, teardown_all);
}
