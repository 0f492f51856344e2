/* Parked works (engine/work.h): one taker, decided once. A waiter runs the
 * op on its own thread; everything else that awaits the work hands it to the
 * loop; a completion by someone else while a waiter runs it holds the
 * callbacks back until the waiter let go. A fake producer stands in for the
 * caller's lane (test_shm_lane runs the real one). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "c10d.h"
#include "engine/loop.h"
#include "engine/work.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

struct fake {
    c10d_work *w;
    atomic_int runs, adopts;
    int run_completes;             /* run completes the work here (else hands it over) */
    atomic_int hold_run;           /* run waits while set */
    atomic_int in_run;             /* run has begun */
    atomic_int done_seen_at_adopt; /* the work was already done when adopt ran */
    uint64_t deadline_seen;
};

static int fake_run(void *arg, uint64_t deadline_ns)
{
    struct fake *f = arg;
    atomic_fetch_add(&f->runs, 1);
    f->deadline_seen = deadline_ns;
    atomic_store(&f->in_run, 1);
    while (atomic_load(&f->hold_run))
        usleep(1000);
    if (f->run_completes) {
        c10d__work_complete_here(f->w);
        return 1;
    }
    return 0;
}

static void fake_adopt(void *arg)
{
    struct fake *f = arg;
    atomic_fetch_add(&f->adopts, 1);
    atomic_store(&f->done_seen_at_adopt, c10d_work_status(f->w) != C10D_PENDING);
}

static const struct c10d__work_park fake_park = {fake_run, fake_adopt};

struct cb_log {
    atomic_int calls, on_loop;
    pthread_t thread;
};

static void log_cb(c10d_work *w, int status, void *arg)
{
    (void)w;
    (void)status;
    struct cb_log *l = arg;
    l->thread = pthread_self();
    atomic_fetch_add(&l->on_loop, c10d_on_loop_thread());
    atomic_fetch_add(&l->calls, 1);
}

static c10d_work *parked(struct fake *f, struct cb_log *anywhere, int64_t timeout_ms)
{
    c10d_work *w;
    assert_int_equal(c10d__work_create_unarmed(&w, "parked", timeout_ms), 0);
    if (anywhere != NULL)
        assert_int_equal(c10d__work_on_complete_anywhere(w, log_cb, anywhere), 0);
    f->w = w;
    assert_int_equal(c10d__work_park(w, &fake_park, f), 0);
    return w;
}

/* The waiter takes it and runs it; its callbacks run on the waiter's thread. */
static void test_waiter_runs_it(void **st)
{
    (void)st;
    struct fake f = {.run_completes = 1};
    struct cb_log log = {0};
    c10d_work *w = parked(&f, &log, 0);
    c10d__work_arm(w); /* parked: the taker arms it, not this */
    assert_int_equal(c10d_work_wait(w, 10000), 0);
    assert_int_equal(atomic_load(&f.runs), 1);
    assert_int_equal(atomic_load(&f.adopts), 0);
    assert_int_equal(atomic_load(&log.calls), 1);
    assert_int_equal(atomic_load(&log.on_loop), 0);
    assert_true(pthread_equal(log.thread, pthread_self()));
    c10d_work_release(w);
}

/* Polling hands it to the loop, once; a later wait does not run it. */
static void test_poll_hands_it_over(void **st)
{
    (void)st;
    struct fake f = {.run_completes = 1};
    c10d_work *w = parked(&f, NULL, 0);
    assert_int_equal(c10d_work_test(w), 0);
    assert_int_equal(c10d_work_status(w), C10D_PENDING);
    assert_int_equal(atomic_load(&f.adopts), 1);
    assert_int_equal(c10d__work_unpark(w), 0); /* taken already */
    c10d__work_complete(w, 0, NULL);
    assert_int_equal(c10d_work_wait(w, 10000), 0);
    assert_int_equal(atomic_load(&f.runs), 0);
    c10d_work_release(w);
}

/* A user's callback hands it over; the callback runs on the loop. */
static void test_callback_hands_it_over(void **st)
{
    (void)st;
    struct fake f = {0};
    struct cb_log user = {0};
    c10d_work *w = parked(&f, NULL, 0);
    assert_int_equal(c10d_work_on_complete(w, log_cb, &user), 0);
    assert_int_equal(atomic_load(&f.adopts), 1);
    c10d__work_complete(w, 0, NULL);
    assert_int_equal(c10d_work_wait(w, 10000), 0);
    assert_int_equal(atomic_load(&user.calls), 1);
    assert_int_equal(atomic_load(&user.on_loop), 1);
    assert_int_equal(atomic_load(&f.runs), 0);
    c10d_work_release(w);
}

/* A handle let go of without a wait: nobody would run it here. */
static void test_release_hands_it_over(void **st)
{
    (void)st;
    struct fake f = {0};
    c10d_work *w = parked(&f, NULL, 0);
    c10d_work_retain(w); /* the producer's */
    c10d_work_release(w);
    assert_int_equal(atomic_load(&f.adopts), 1);
    c10d__work_complete(w, 0, NULL);
    c10d_work_release(w);
}

/* Completing a parked work hands the op over first (its producer then
 * finds it pending: the op reaches the loop before the callbacks that free
 * it). */
static void test_completing_parked_hands_over_first(void **st)
{
    (void)st;
    struct fake f = {0};
    struct cb_log log = {0};
    c10d_work *w = parked(&f, &log, 0);
    c10d__work_complete(w, C10D_EABORTED, "stopped");
    assert_int_equal(atomic_load(&f.adopts), 1);
    assert_int_equal(atomic_load(&f.done_seen_at_adopt), 0);
    assert_int_equal(c10d_work_wait(w, 10000), C10D_EABORTED);
    assert_int_equal(atomic_load(&log.calls), 1);
    c10d_work_release(w);
}

struct outside {
    c10d_work *w;
    struct fake *f;
    struct cb_log *log;
    atomic_int completed; /* the outside completion returned */
    atomic_int seen;      /* callbacks run while the runner held the op */
};

static void *complete_from_outside(void *arg)
{
    struct outside *o = arg;
    while (!atomic_load(&o->f->in_run))
        usleep(1000);
    c10d__work_complete(o->w, C10D_ETIMEDOUT, "timed out elsewhere");
    atomic_store(&o->completed, 1);
    return NULL;
}

/* Lets the runner go only after the outside completion returned and had
 * time to run callbacks it must not run. */
static void *hold_then_release(void *arg)
{
    struct outside *o = arg;
    while (!atomic_load(&o->completed))
        usleep(1000);
    /* A callback added now waits for the runner too. */
    if (c10d_work_on_complete(o->w, log_cb, o->log) != 0)
        return NULL;
    usleep(100 * 1000);
    atomic_store(&o->seen, atomic_load(&o->log->calls));
    atomic_store(&o->f->hold_run, 0);
    return NULL;
}

/* Completed by another thread while the waiter runs the op: the callbacks
 * (which would free the op) wait until the waiter let go of it, then run
 * once; the waiter returns after them, with the outside status. */
static void test_completion_while_running_waits_for_runner(void **st)
{
    (void)st;
    struct fake f = {.run_completes = 1};
    atomic_store(&f.hold_run, 1);
    struct cb_log log = {0};
    c10d_work *w = parked(&f, &log, 0);
    struct outside o = {.w = w, .f = &f, .log = &log};
    atomic_store(&o.seen, -1);
    pthread_t completer, holder;
    assert_int_equal(pthread_create(&completer, NULL, complete_from_outside, &o), 0);
    assert_int_equal(pthread_create(&holder, NULL, hold_then_release, &o), 0);
    int rc = c10d_work_wait(w, 10000);
    pthread_join(completer, NULL);
    pthread_join(holder, NULL);
    assert_int_equal(rc, C10D_ETIMEDOUT);
    assert_int_equal(atomic_load(&o.seen), 0);
    assert_int_equal(atomic_load(&log.calls), 2); /* the group's and the late one, once each */
    assert_int_equal(atomic_load(&f.runs), 1);
    c10d_work_release(w);
}

/* The op's own deadline counts from its creation: a waiter that comes late
 * hands it over at once and the loop's timer fails it. */
static void test_deadline_counts_from_creation(void **st)
{
    (void)st;
    struct fake f = {0};
    c10d_work *w = parked(&f, NULL, 100);
    usleep(150 * 1000);
    uint64_t t0 = c10d__now_ns();
    assert_int_equal(c10d_work_wait(w, 10000), C10D_ETIMEDOUT);
    assert_true(c10d__now_ns() - t0 < 5000ull * 1000 * 1000);
    assert_int_equal(atomic_load(&f.runs), 1);
    assert_true(f.deadline_seen != 0 && f.deadline_seen <= t0);
    c10d_work_release(w);
}

/* c10d__work_on_complete_around: `first` where it was registered, `last`
 * after every callback registered before completion (in batches of any
 * length), one `last` per work; a callback added later runs after it. */
struct around_log {
    atomic_int n;
    int order[16];
    atomic_int wrong_thread;
    pthread_t expect;
    int check_thread;
};

struct around_cb {
    struct around_log *log;
    int id;
};

static void around_cb(c10d_work *w, int status, void *arg)
{
    (void)w;
    (void)status;
    struct around_cb *c = arg;
    if (c->log->check_thread && !pthread_equal(pthread_self(), c->log->expect))
        atomic_fetch_add(&c->log->wrong_thread, 1);
    c->log->order[atomic_fetch_add(&c->log->n, 1)] = c->id;
}

static void around_first(c10d_work *w, int status, void *arg)
{
    around_cb(w, status, &((struct around_cb *)arg)[0]);
}

static void around_last(c10d_work *w, int status, void *arg)
{
    around_cb(w, status, &((struct around_cb *)arg)[1]);
}

static void run_around(int here)
{
    struct around_log log = {.expect = pthread_self(), .check_thread = here};
    struct around_cb ends[2] = {{&log, 0}, {&log, 99}}, mid[7];
    c10d_work *w;
    struct fake f = {.run_completes = 1};
    assert_int_equal(c10d__work_create_unarmed(&w, "around", 0), 0);
    f.w = w;
    assert_int_equal(c10d__work_on_complete_around(w, around_first, around_last, ends, 1), 0);
    assert_int_equal(c10d__work_on_complete_around(w, around_first, around_last, ends, 1),
                     C10D_EINVAL);
    for (int i = 0; i < 6; i++) {
        mid[i] = (struct around_cb){&log, i + 1};
        assert_int_equal(c10d__work_on_complete_anywhere(w, around_cb, &mid[i]), 0);
    }
    if (here) {
        assert_int_equal(c10d__work_park(w, &fake_park, &f), 0);
        assert_int_equal(c10d_work_wait(w, 10000), 0); /* runs them all on this thread */
    } else {
        assert_true(c10d_work_complete(w, C10D_OK, NULL) >= 0);
        assert_int_equal(c10d_work_wait(w, 10000), 0);
    }
    assert_int_equal(atomic_load(&log.n), 8);
    mid[6] = (struct around_cb){&log, 7};
    log.check_thread = 0;
    assert_int_equal(c10d__work_on_complete_anywhere(w, around_cb, &mid[6]), 0);
    assert_int_equal(c10d_work_wait(w, 10000), 0);
    int want[9] = {0, 1, 2, 3, 4, 5, 6, 99, 7};
    assert_int_equal(atomic_load(&log.n), 9);
    for (int i = 0; i < 9; i++)
        assert_int_equal(log.order[i], want[i]);
    assert_int_equal(atomic_load(&log.wrong_thread), 0);
    c10d_work_release(w);
}

static void test_last_callback_runs_last(void **st)
{
    (void)st;
    run_around(1);
    run_around(0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_waiter_runs_it),
        cmocka_unit_test(test_poll_hands_it_over),
        cmocka_unit_test(test_callback_hands_it_over),
        cmocka_unit_test(test_release_hands_it_over),
        cmocka_unit_test(test_completing_parked_hands_over_first),
        cmocka_unit_test(test_completion_while_running_waits_for_runner),
        cmocka_unit_test(test_deadline_counts_from_creation),
        cmocka_unit_test(test_last_callback_runs_last),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    c10d_shutdown();
    return rc;
}
