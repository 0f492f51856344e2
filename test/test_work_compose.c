/* Composing works: c10d_work_wait_all, c10d_work_wait_any, c10d_work_then.
 * Works complete from threads of the test, as a backend completes them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "c10d.h"
#include "engine/work.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Completes a work from a thread of its own after a delay. */
struct later {
    c10d_work *w;
    int delay_ms;
    int status;
    const char *message;
    pthread_t thread;
};

static void *later_main(void *arg)
{
    struct later *l = arg;
    usleep((useconds_t)l->delay_ms * 1000u);
    c10d_work_complete(l->w, l->status, l->message);
    c10d_work_release(l->w);
    return NULL;
}

static void complete_later(struct later *l, c10d_work *w, int delay_ms, int status,
                           const char *message)
{
    *l = (struct later){w, delay_ms, status, message, 0};
    c10d_work_retain(w);
    assert_int_equal(pthread_create(&l->thread, NULL, later_main, l), 0);
}

static void make_works(c10d_work **w, size_t n)
{
    for (size_t i = 0; i < n; i++)
        assert_int_equal(c10d_work_create("compose", 0, &w[i]), 0);
}

static void release_works(c10d_work **w, size_t n)
{
    for (size_t i = 0; i < n; i++)
        c10d_work_release(w[i]);
}

static void test_wait_all_succeed(void **state)
{
    (void)state;
    c10d_work *w[4];
    make_works(w, 4);
    struct later l[4];
    for (int i = 0; i < 4; i++)
        complete_later(&l[i], w[i], 40 - 10 * i, C10D_OK, NULL);
    assert_int_equal(c10d_work_wait_all(w, 4, -1), 0);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(c10d_work_test(w[i]), 1);
        pthread_join(l[i].thread, NULL);
    }
    /* Already complete, with a zero timeout: no waiting at all. */
    assert_int_equal(c10d_work_wait_all(w, 4, 0), 0);
    release_works(w, 4);
    /* Nothing to wait for. */
    assert_int_equal(c10d_work_wait_all(NULL, 0, -1), 0);
    assert_int_equal(c10d_work_wait_all(w, 0, 0), 0);
}

static void test_wait_all_names_first_failure(void **state)
{
    (void)state;
    c10d_work *w[5];
    make_works(w, 5);
    struct later l[5];
    complete_later(&l[0], w[0], 5, C10D_OK, NULL);
    complete_later(&l[1], w[1], 30, C10D_OK, NULL);
    complete_later(&l[2], w[2], 20, C10D_ECLOSED, "peer 3 went away");
    complete_later(&l[3], w[3], 0, C10D_ECANCELED, "cancelled early");
    complete_later(&l[4], w[4], 10, C10D_OK, NULL);
    /* works[3] fails first in time, works[2] is the lowest index that fails. */
    assert_int_equal(c10d_work_wait_all(w, 5, 10000), C10D_ECLOSED);
    const char *e = c10d_last_error();
    assert_non_null(strstr(e, "works[2]"));
    assert_non_null(strstr(e, "C10D_ECLOSED"));
    assert_non_null(strstr(e, "peer 3 went away"));
    assert_non_null(strstr(e, "2 works failed"));
    for (int i = 0; i < 5; i++) {
        assert_int_equal(c10d_work_test(w[i]), 1); /* it waited for every one */
        pthread_join(l[i].thread, NULL);
    }
    release_works(w, 5);
}

static void test_wait_all_timeout(void **state)
{
    (void)state;
    c10d_work *w[4];
    make_works(w, 4);
    c10d_work_complete(w[0], C10D_OK, NULL);
    c10d_work_complete(w[2], C10D_EIO, "disk on fire");
    assert_int_equal(c10d_work_wait_all(w, 4, 30), C10D_ETIMEDOUT);
    const char *e = c10d_last_error();
    assert_non_null(strstr(e, "2 of 4 works still pending"));
    assert_non_null(strstr(e, "works[1]"));
    assert_non_null(strstr(e, "works[2] failed"));
    assert_non_null(strstr(e, "disk on fire"));
    assert_int_equal(c10d_work_test(w[1]), 0); /* the works go on */
    /* A work's own deadline is a failure of that work, not of the wait. */
    c10d_work *d[2];
    assert_int_equal(c10d_work_create("deadline op", 20, &d[0]), 0);
    assert_int_equal(c10d_work_create("fine op", 0, &d[1]), 0);
    c10d_work_complete(d[1], C10D_OK, NULL);
    assert_int_equal(c10d_work_wait_all(d, 2, 10000), C10D_ETIMEDOUT);
    assert_non_null(strstr(c10d_last_error(), "works[0] of 2 failed"));
    assert_non_null(strstr(c10d_last_error(), "deadline op timed out after 20 ms"));
    release_works(d, 2);
    c10d_work_complete(w[1], C10D_OK, NULL);
    c10d_work_complete(w[3], C10D_OK, NULL);
    assert_int_equal(c10d_work_wait_all(w, 4, 0), C10D_EIO);
    release_works(w, 4);
}

static void test_bad_arguments(void **state)
{
    (void)state;
    c10d_work *w[3];
    make_works(w, 3);
    c10d_work *holes[3] = {w[0], NULL, w[2]};
    size_t index = 7;
    assert_int_equal(c10d_work_wait_all(holes, 3, -1), C10D_EINVAL);
    assert_non_null(strstr(c10d_last_error(), "works[1] is NULL"));
    assert_int_equal(c10d_work_wait_all(NULL, 2, -1), C10D_EINVAL);
    assert_int_equal(c10d_work_wait_any(holes, 3, -1, &index), C10D_EINVAL);
    assert_non_null(strstr(c10d_last_error(), "works[1] is NULL"));
    assert_true(index == SIZE_MAX);
    assert_int_equal(c10d_work_wait_any(w, 0, -1, &index), C10D_EINVAL);
    assert_int_equal(c10d_work_wait_any(w, 3, -1, NULL), C10D_EINVAL);
    c10d_work *child = w[0];
    assert_int_equal(c10d_work_then(NULL, NULL, NULL, &child), C10D_EINVAL);
    assert_null(child);
    assert_int_equal(c10d_work_then(w[0], NULL, NULL, &child), C10D_EINVAL);
    assert_int_equal(c10d_work_then(w[0], NULL, NULL, NULL), C10D_EINVAL);
    for (int i = 0; i < 3; i++)
        c10d_work_complete(w[i], C10D_OK, NULL);
    release_works(w, 3);
}

static void test_wait_any_picks_completed(void **state)
{
    (void)state;
    c10d_work *w[4];
    make_works(w, 4);
    struct later l;
    size_t index = 0;
    complete_later(&l, w[2], 20, C10D_OK, NULL);
    assert_int_equal(c10d_work_wait_any(w, 4, 10000, &index), 0);
    assert_int_equal(index, 2);
    assert_int_equal(c10d_work_test(w[0]) + c10d_work_test(w[1]) + c10d_work_test(w[3]), 0);
    pthread_join(l.thread, NULL);
    /* Several complete: the lowest index. */
    c10d_work_complete(w[3], C10D_OK, NULL);
    c10d_work_complete(w[1], C10D_ECLOSED, "rank 1 died");
    assert_int_equal(c10d_work_wait_any(w, 4, 10000, &index), C10D_ECLOSED);
    assert_int_equal(index, 1);
    assert_non_null(strstr(c10d_last_error(), "works[1]"));
    assert_non_null(strstr(c10d_last_error(), "rank 1 died"));
    /* A zero timeout only looks: a work counts once c10d_work_wait would
     * return it (here after the first wait's callbacks on it have run). */
    assert_int_equal(c10d_work_wait(w[1], 10000), C10D_ECLOSED);
    assert_int_equal(c10d_work_wait(w[3], 10000), C10D_OK);
    assert_int_equal(c10d_work_wait_any(w, 4, 0, &index), C10D_ECLOSED);
    assert_int_equal(index, 1);
    /* The MPI_Waitany loop: drop what completed, wait for the rest. */
    c10d_work *rest[1] = {w[0]};
    assert_int_equal(c10d_work_wait_any(rest, 1, 20, &index), C10D_ETIMEDOUT);
    assert_true(index == SIZE_MAX);
    assert_non_null(strstr(c10d_last_error(), "none of 1 works completed within 20 ms"));
    complete_later(&l, w[0], 10, C10D_ECANCELED, "late");
    assert_int_equal(c10d_work_wait_any(rest, 1, -1, &index), C10D_ECANCELED);
    assert_int_equal(index, 0);
    pthread_join(l.thread, NULL);
    release_works(w, 4);
}

/* A wait_any that times out leaves its callbacks on the works; they fire
 * later, after the waiter's frame is gone (the sanitizer build checks that
 * they touch no freed memory and that the state is freed). */
static void wait_any_times_out(c10d_work **w, size_t n)
{
    size_t index = 0;
    char scribble[256];
    memset(scribble, 0x5a, sizeof scribble);
    assert_int_equal(c10d_work_wait_any(w, n, 15, &index), C10D_ETIMEDOUT);
    assert_true(index == SIZE_MAX);
    assert_int_equal(scribble[0], 0x5a);
}

static void clobber_stack(void)
{
    volatile char junk[4096];
    for (size_t i = 0; i < sizeof junk; i++)
        junk[i] = (char)i;
}

struct flag {
    atomic_int n;
};

static void count_cb(c10d_work *w, int status, void *arg)
{
    (void)w;
    (void)status;
    atomic_fetch_add(&((struct flag *)arg)->n, 1);
}

static void test_wait_any_timeout_no_dangling(void **state)
{
    (void)state;
    c10d_work *w[6];
    make_works(w, 6);
    for (int round = 0; round < 5; round++)
        wait_any_times_out(w, 6);
    clobber_stack();
    struct flag f = {0};
    for (int i = 0; i < 6; i++)
        assert_int_equal(c10d_work_on_complete(w[i], count_cb, &f), 0);
    struct later l[6];
    for (int i = 0; i < 6; i++)
        complete_later(&l[i], w[i], i, i % 2 ? C10D_OK : C10D_EIO, "x");
    /* Callbacks run in order: ours last on each work. */
    for (int k = 0; k < 5000 && atomic_load(&f.n) < 6; k++)
        usleep(1000);
    assert_int_equal(atomic_load(&f.n), 6);
    for (int i = 0; i < 6; i++)
        pthread_join(l[i].thread, NULL);
    release_works(w, 6);
}

/* Works released by their owners while a timed-out wait_any's callbacks are
 * still on them: completion (here by c10d_shutdown) frees everything. */
static void test_wait_any_state_outlives_works(void **state)
{
    (void)state;
    c10d_work *w[3];
    make_works(w, 3);
    wait_any_times_out(w, 3);
    release_works(w, 3);
    assert_int_equal(c10d__work_pending_count(), 3);
    assert_int_equal(c10d_shutdown(), 0); /* fails them with C10D_EABORTED */
    assert_int_equal(c10d__work_pending_count(), 0);
}

/* Many waiters on one set while threads complete it in random order. */
#define RACE_WORKS   16
#define RACE_WAITERS 4

struct race {
    c10d_work *w[RACE_WORKS];
    atomic_int bad;
};

static void *race_waiter(void *arg)
{
    struct race *r = arg;
    c10d_work *left[RACE_WORKS];
    size_t n = RACE_WORKS;
    memcpy(left, r->w, sizeof left);
    while (n > 0) {
        size_t index;
        int rc = c10d_work_wait_any(left, n, 10000, &index);
        if (index >= n || !c10d_work_test(left[index]) || rc != c10d_work_status(left[index]))
            atomic_fetch_add(&r->bad, 1);
        if (index >= n)
            return NULL;
        left[index] = left[--n];
    }
    return NULL;
}

static void test_wait_any_races(void **state)
{
    (void)state;
    for (int round = 0; round < 20; round++) {
        struct race r = {0};
        make_works(r.w, RACE_WORKS);
        pthread_t t[RACE_WAITERS];
        for (int i = 0; i < RACE_WAITERS; i++)
            pthread_create(&t[i], NULL, race_waiter, &r);
        struct later l[RACE_WORKS];
        for (int i = 0; i < RACE_WORKS; i++)
            complete_later(&l[i], r.w[(i * 7 + round) % RACE_WORKS], rand() % 3,
                           i % 3 ? C10D_OK : C10D_ECLOSED, "raced");
        for (int i = 0; i < RACE_WAITERS; i++)
            pthread_join(t[i], NULL);
        for (int i = 0; i < RACE_WORKS; i++)
            pthread_join(l[i].thread, NULL);
        assert_int_equal(atomic_load(&r.bad), 0);
        assert_int_equal(c10d_work_wait_all(r.w, RACE_WORKS, 0), C10D_ECLOSED);
        release_works(r.w, RACE_WORKS);
    }
}

/* then */
struct step {
    atomic_int calls;
    atomic_int on_loop;
    atomic_int seen_status;
    int add;
    atomic_int *total;
    int ret;
    char parent_message[64];
};

static int step_cb(c10d_work *parent, int status, c10d_work *child, void *arg)
{
    struct step *s = arg;
    (void)child;
    snprintf(s->parent_message, sizeof s->parent_message, "%s", c10d_work_message(parent));
    atomic_store(&s->seen_status, status);
    atomic_fetch_add(&s->on_loop, c10d_on_loop_thread());
    if (s->total != NULL)
        atomic_fetch_add(s->total, s->add);
    atomic_fetch_add(&s->calls, 1);
    return s->ret;
}

static void test_then_chains(void **state)
{
    (void)state;
    atomic_int total = 0;
    struct step a = {.add = 1, .total = &total}, b = {.add = 10, .total = &total};
    c10d_work *p, *c1, *c2;
    assert_int_equal(c10d_work_create("parent", 0, &p), 0);
    assert_int_equal(c10d_work_then(p, step_cb, &a, &c1), 0);
    assert_int_equal(c10d_work_then(c1, step_cb, &b, &c2), 0);
    c10d_work_release(c1); /* the chain keeps going without the caller's reference */
    assert_int_equal(c10d_work_test(c2), 0);
    struct later l;
    complete_later(&l, p, 10, C10D_OK, NULL);
    assert_int_equal(c10d_work_wait(c2, 10000), 0);
    assert_int_equal(atomic_load(&total), 11);
    assert_int_equal(atomic_load(&a.calls), 1);
    assert_int_equal(atomic_load(&b.calls), 1);
    assert_int_equal(atomic_load(&a.on_loop) + atomic_load(&b.on_loop), 2);
    pthread_join(l.thread, NULL);
    c10d_work_release(c2);
    c10d_work_release(p);
}

static void test_then_on_completed_work(void **state)
{
    (void)state;
    struct step a = {0};
    c10d_work *p, *c;
    assert_int_equal(c10d_work_create("parent", 0, &p), 0);
    c10d_work_complete(p, C10D_ECLOSED, "peer 2 closed");
    assert_int_equal(c10d_work_then(p, step_cb, &a, &c), 0);
    assert_int_equal(c10d_work_wait(c, 10000), 0); /* the callback handled it */
    assert_int_equal(atomic_load(&a.calls), 1);
    assert_int_equal(atomic_load(&a.seen_status), C10D_ECLOSED);
    assert_string_equal(a.parent_message, "peer 2 closed");
    c10d_work_release(c);
    c10d_work_release(p);
}

static int fail_cb(c10d_work *parent, int status, c10d_work *child, void *arg)
{
    (void)parent;
    (void)child;
    (void)arg;
    return status < 0 ? status : C10D_EPROTO; /* propagate, or fail on our own */
}

static int failing_call_cb(c10d_work *parent, int status, c10d_work *child, void *arg)
{
    (void)status;
    (void)child;
    (void)arg;
    c10d_work *self[1] = {parent};
    return c10d_work_wait_all(self, 1, 1000); /* EDEADLK, with its message */
}

static int odd_cb(c10d_work *parent, int status, c10d_work *child, void *arg)
{
    (void)parent;
    (void)status;
    (void)child;
    (void)arg;
    return 42;
}

static void test_then_callback_failure(void **state)
{
    (void)state;
    c10d_work *p, *c;
    /* The parent's failure passed on: its status and message. */
    assert_int_equal(c10d_work_create("parent", 0, &p), 0);
    assert_int_equal(c10d_work_then(p, fail_cb, NULL, &c), 0);
    c10d_work_complete(p, C10D_ECLOSED, "peer 5 closed");
    assert_int_equal(c10d_work_wait(c, 10000), C10D_ECLOSED);
    assert_string_equal(c10d_work_message(c), "peer 5 closed");
    c10d_work_release(c);
    c10d_work_release(p);
    /* A parent that succeeded, a callback that fails with no message. */
    assert_int_equal(c10d_work_create("parent", 0, &p), 0);
    assert_int_equal(c10d_work_then(p, fail_cb, NULL, &c), 0);
    c10d_work_complete(p, C10D_OK, NULL);
    assert_int_equal(c10d_work_wait(c, 10000), C10D_EPROTO);
    assert_non_null(strstr(c10d_work_message(c), "C10D_EPROTO"));
    c10d_work_release(c);
    /* A call that failed inside the callback gives the message. */
    assert_int_equal(c10d_work_then(p, failing_call_cb, NULL, &c), 0);
    assert_int_equal(c10d_work_wait(c, 10000), C10D_EDEADLK);
    assert_non_null(strstr(c10d_work_message(c), "c10d_work_wait_all on the engine loop thread"));
    c10d_work_release(c);
    /* A result that is no status. */
    assert_int_equal(c10d_work_then(p, odd_cb, NULL, &c), 0);
    assert_int_equal(c10d_work_wait(c, 10000), C10D_EINVAL);
    assert_non_null(strstr(c10d_work_message(c), "returned 42"));
    c10d_work_release(c);
    c10d_work_release(p);
}

/* C10D_PENDING: the callback hands the child to something that completes it
 * later (here a thread; in a program, the next op's callback). */
static int handoff_cb(c10d_work *parent, int status, c10d_work *child, void *arg)
{
    (void)parent;
    (void)status;
    complete_later(arg, child, 10, C10D_ESTORE, "the store said no");
    return C10D_PENDING;
}

static void test_then_completes_child_itself(void **state)
{
    (void)state;
    c10d_work *p, *c;
    struct later l;
    memset(&l, 0, sizeof l);
    assert_int_equal(c10d_work_create("parent", 0, &p), 0);
    assert_int_equal(c10d_work_then(p, handoff_cb, &l, &c), 0);
    c10d_work_complete(p, C10D_OK, NULL);
    assert_int_equal(c10d_work_wait(c, 10000), C10D_ESTORE);
    assert_string_equal(c10d_work_message(c), "the store said no");
    pthread_join(l.thread, NULL);
    c10d_work_release(c);
    c10d_work_release(p);
}

static void test_then_child_cancelled(void **state)
{
    (void)state;
    struct step a = {0};
    c10d_work *p, *c;
    assert_int_equal(c10d_work_create("parent", 0, &p), 0);
    assert_int_equal(c10d_work_then(p, step_cb, &a, &c), 0);
    assert_int_equal(c10d_work_cancel(c), 0);
    assert_int_equal(c10d_work_wait(c, 0), C10D_ECANCELED);
    c10d_work_complete(p, C10D_OK, NULL);
    for (int k = 0; k < 5000 && atomic_load(&a.calls) < 1; k++)
        usleep(1000);
    assert_int_equal(atomic_load(&a.calls), 1);            /* the callback still ran */
    assert_int_equal(c10d_work_status(c), C10D_ECANCELED); /* first completion wins */
    c10d_work_release(c);
    c10d_work_release(p);
}

/* Waiting inside a callback is refused; then is not (it does not block). */
struct in_cb {
    c10d_work *other;
    atomic_int all_rc, any_rc, then_rc, done;
    size_t index;
    c10d_work *grandchild;
};

static void waits_in_callback(c10d_work *w, int status, void *arg)
{
    (void)status;
    struct in_cb *s = arg;
    c10d_work *set[2] = {w, s->other};
    atomic_store(&s->all_rc, c10d_work_wait_all(set, 2, 1000));
    atomic_store(&s->any_rc, c10d_work_wait_any(set, 2, 1000, &s->index));
    atomic_store(&s->then_rc, c10d_work_then(w, fail_cb, NULL, &s->grandchild));
    atomic_store(&s->done, 1);
}

static void test_wait_in_callback_refused(void **state)
{
    (void)state;
    struct in_cb s = {0};
    s.index = 3;
    c10d_work *w;
    assert_int_equal(c10d_work_create("t", 0, &w), 0);
    assert_int_equal(c10d_work_create("other", 0, &s.other), 0);
    c10d_work_complete(s.other, C10D_OK, NULL);
    assert_int_equal(c10d_work_on_complete(w, waits_in_callback, &s), 0);
    c10d_work_complete(w, C10D_OK, NULL);
    for (int k = 0; k < 5000 && !atomic_load(&s.done); k++)
        usleep(1000);
    assert_int_equal(atomic_load(&s.all_rc), C10D_EDEADLK);
    assert_int_equal(atomic_load(&s.any_rc), C10D_EDEADLK);
    assert_true(s.index == SIZE_MAX);
    assert_int_equal(atomic_load(&s.then_rc), 0);
    assert_int_equal(c10d_work_wait(s.grandchild, 10000), C10D_EPROTO);
    c10d_work_release(s.grandchild);
    c10d_work_release(s.other);
    c10d_work_release(w);
}

/* Chains left pending at shutdown: the engine fails the parents, the callbacks
 * run, nothing leaks. */
static void test_then_pending_at_shutdown(void **state)
{
    (void)state;
    struct step a = {0};
    c10d_work *p, *c;
    assert_int_equal(c10d_work_create("parent", 0, &p), 0);
    assert_int_equal(c10d_work_then(p, step_cb, &a, &c), 0);
    c10d_work_release(p);
    c10d_work_release(c);
    assert_int_equal(c10d_shutdown(), 0);
    assert_int_equal(atomic_load(&a.calls), 1);
    assert_int_equal(atomic_load(&a.seen_status), C10D_EABORTED);
    assert_int_equal(c10d__work_pending_count(), 0);
}

static int teardown_all(void **state)
{
    (void)state;
    for (int k = 0; k < 5000 && c10d__work_pending_count() > 0; k++)
        usleep(1000);
    assert_int_equal(c10d__work_pending_count(), 0);
    return c10d_shutdown();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wait_all_succeed),
        cmocka_unit_test(test_wait_all_names_first_failure),
        cmocka_unit_test(test_wait_all_timeout),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_wait_any_picks_completed),
        cmocka_unit_test(test_wait_any_timeout_no_dangling),
        cmocka_unit_test(test_wait_any_state_outlives_works),
        cmocka_unit_test(test_wait_any_races),
        cmocka_unit_test(test_then_chains),
        cmocka_unit_test(test_then_on_completed_work),
        cmocka_unit_test(test_then_callback_failure),
        cmocka_unit_test(test_then_completes_child_itself),
        cmocka_unit_test(test_then_child_cancelled),
        cmocka_unit_test(test_wait_in_callback_refused),
        cmocka_unit_test(test_then_pending_at_shutdown),
    };
    return cmocka_run_group_tests(tests, NULL, teardown_all);
}
