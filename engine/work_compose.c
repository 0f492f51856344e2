/* Composing works: waiting for all of a set or for any one of it (MPI_Waitall,
 * MPI_Waitany) and a work that follows another through a callback (torch's
 * Future.then). Built on the public work calls and c10d__work_on_complete only.
 *
 * A work counts as finished when c10d_work_wait would return its status (so
 * whatever that waits for, its callbacks included, these wait for too).
 * wait_all waits for each work in turn with c10d_work_wait. wait_any sleeps on a condition of its
 * own, signalled by a bookkeeping callback registered on every work of the set. Such a callback
 * cannot be taken back: it stays on a work still pending when the wait ends
 * and runs when that work completes (at the latest when c10d_shutdown fails
 * it). The state it signals is therefore on the heap, reference counted: one
 * reference for the waiter and one for each callback, and whoever drops the
 * last one frees it. */
#include "work.h"

#include "error.h"
#include "loop.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#define NO_DEADLINE UINT64_MAX

/* A wait longer than this (about 146 years) has no limit: its deadline in
 * nanoseconds would not fit. */
#define MAX_TIMEOUT_MS ((int64_t)1 << 42)

static uint64_t deadline_after(int64_t timeout_ms)
{
    if (timeout_ms < 0 || timeout_ms > MAX_TIMEOUT_MS)
        return NO_DEADLINE;
    return c10d__now_ns() + (uint64_t)timeout_ms * 1000000u;
}

/* Milliseconds to the deadline, rounded up (a wait never ends early); -1 for
 * no deadline; 0 once it passed. */
static int64_t ms_left(uint64_t deadline)
{
    if (deadline == NO_DEADLINE)
        return -1;
    uint64_t now = c10d__now_ns();
    return now >= deadline ? 0 : (int64_t)((deadline - now + 999999u) / 1000000u);
}

/* The checks both waits share: every entry present, not on the loop thread. */
static int check_set(const char *fn, c10d_work *const *works, size_t n)
{
    if (n > 0 && works == NULL)
        return c10d__fail(C10D_EINVAL, "%s: works is NULL (n = %zu)", fn, n);
    for (size_t i = 0; i < n; i++)
        if (works[i] == NULL)
            return c10d__fail(C10D_EINVAL, "%s: works[%zu] is NULL (n = %zu)", fn, i, n);
    if (c10d_on_loop_thread())
        return c10d__fail(C10D_EDEADLK,
                          "%s on the engine loop thread (inside a callback) would deadlock: the "
                          "works can only complete on this thread; use c10d_work_on_complete or "
                          "c10d_work_then instead",
                          fn);
    return 0;
}

/* Waits for one work as c10d_work_wait does (at most left_ms; 0: only looks),
 * so a work counts as finished exactly when c10d_work_wait would return its
 * status. Returns 1 with its status in *status, or 0 while it is pending (or
 * complete with callbacks still running, where c10d_work_wait waits for them). */
static int wait_one(c10d_work *w, int64_t left_ms, int *status)
{
    int rc = c10d__work_wait(w, left_ms);
    int s = c10d_work_status(w);
    if (s == C10D_PENDING || (rc == C10D_ETIMEDOUT && s != C10D_ETIMEDOUT))
        return 0;
    *status = s;
    return 1;
}

int c10d_work_wait_all(c10d_work *const *works, size_t n, int64_t timeout_ms)
{
    C10D_CHECK(check_set("c10d_work_wait_all", works, n));
    uint64_t deadline = deadline_after(timeout_ms);
    size_t pending = 0, first_pending = 0, failed = 0, first_failed = 0;
    for (size_t i = 0; i < n; i++) {
        int status;
        if (!wait_one(works[i], ms_left(deadline), &status)) {
            if (pending++ == 0)
                first_pending = i;
        } else if (status < 0) {
            if (failed++ == 0)
                first_failed = i;
        }
    }
    if (pending > 0) {
        if (failed == 0)
            return c10d__fail(C10D_ETIMEDOUT,
                              "c10d_work_wait_all: %zu of %zu works still pending after waiting "
                              "%lld ms, the first is works[%zu] (the works go on)",
                              pending, n, (long long)timeout_ms, first_pending);
        int fs = c10d_work_status(works[first_failed]);
        return c10d__fail(C10D_ETIMEDOUT,
                          "c10d_work_wait_all: %zu of %zu works still pending after waiting %lld "
                          "ms, the first is works[%zu] (the works go on); works[%zu] failed "
                          "meanwhile (%s): %s",
                          pending, n, (long long)timeout_ms, first_pending, first_failed,
                          c10d_status_name(fs), c10d_work_message(works[first_failed]));
    }
    if (failed == 0)
        return 0;
    int fs = c10d_work_status(works[first_failed]);
    if (failed == 1)
        return c10d__fail(fs, "c10d_work_wait_all: works[%zu] of %zu failed (%s): %s", first_failed,
                          n, c10d_status_name(fs), c10d_work_message(works[first_failed]));
    return c10d__fail(
        fs, "c10d_work_wait_all: works[%zu] of %zu failed (%s): %s (%zu works failed)",
        first_failed, n, c10d_status_name(fs), c10d_work_message(works[first_failed]), failed);
}

/* What a wait_any waiter sleeps on. */
struct any_state {
    atomic_int refs; /* the waiter's and one per registered callback */
    uv_mutex_t mutex;
    uv_cond_t cond;
    int fired; /* guarded by mutex: a work of the set completed */
};

static void any_release(struct any_state *s)
{
    if (atomic_fetch_sub_explicit(&s->refs, 1, memory_order_acq_rel) == 1) {
        uv_cond_destroy(&s->cond);
        uv_mutex_destroy(&s->mutex);
        free(s);
    }
}

/* A bookkeeping callback on the loop thread: takes no lock but the state's
 * own, so it never waits for a thread of the caller's. */
static void any_fired(c10d_work *w, int status, void *arg)
{
    (void)w;
    (void)status;
    struct any_state *s = arg;
    uv_mutex_lock(&s->mutex);
    s->fired = 1;
    uv_cond_signal(&s->cond);
    uv_mutex_unlock(&s->mutex);
    any_release(s);
}

/* The lowest index of a finished work (as wait_one says: a complete work's
 * callbacks may take until the deadline), or n; its status in *status. Never
 * waits for a work that is still pending. */
static size_t lowest_finished(c10d_work *const *works, size_t n, uint64_t deadline, int *status)
{
    for (size_t i = 0; i < n; i++)
        if (c10d_work_test(works[i]) && wait_one(works[i], ms_left(deadline), status))
            return i;
    return n;
}

static int any_result(c10d_work *const *works, size_t n, size_t i, int status, size_t *index)
{
    *index = i;
    if (status < 0)
        return c10d__fail(status, "c10d_work_wait_any: works[%zu] of %zu failed (%s): %s", i, n,
                          c10d_status_name(status), c10d_work_message(works[i]));
    return status;
}

/* Registers any_fired on every work; returns 0, or the first refusal. */
static int any_register(struct any_state *s, c10d_work *const *works, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        atomic_fetch_add_explicit(&s->refs, 1, memory_order_relaxed);
        int rc = c10d__work_on_complete(works[i], any_fired, s);
        if (rc != 0) {
            any_release(s); /* never called back: the waiter's reference remains */
            char why[512];
            snprintf(why, sizeof why, "%s", c10d_last_error());
            return c10d__fail(rc, "c10d_work_wait_any: cannot wait for works[%zu]: %s", i, why);
        }
    }
    return 0;
}

int c10d_work_wait_any(c10d_work *const *works, size_t n, int64_t timeout_ms, size_t *index)
{
    if (index == NULL)
        return c10d__fail(C10D_EINVAL, "c10d_work_wait_any: index is NULL");
    *index = SIZE_MAX;
    if (n == 0)
        return c10d__fail(C10D_EINVAL, "c10d_work_wait_any: no works to wait for (n = 0)");
    C10D_CHECK(check_set("c10d_work_wait_any", works, n));
    uint64_t deadline = deadline_after(timeout_ms);
    int status;
    size_t i = lowest_finished(works, n, deadline, &status);
    if (i < n)
        return any_result(works, n, i, status, index);

    struct any_state *s = calloc(1, sizeof *s);
    if (s == NULL)
        return c10d__fail(C10D_ENOMEM, "c10d_work_wait_any: out of memory");
    if (uv_mutex_init(&s->mutex) != 0) {
        free(s);
        return c10d__fail(C10D_ENOMEM, "c10d_work_wait_any: out of memory");
    }
    if (uv_cond_init(&s->cond) != 0) {
        uv_mutex_destroy(&s->mutex);
        free(s);
        return c10d__fail(C10D_ENOMEM, "c10d_work_wait_any: out of memory");
    }
    atomic_init(&s->refs, 1);
    int rc = any_register(s, works, n);
    if (rc == 0) {
        uv_mutex_lock(&s->mutex);
        while (!s->fired) {
            if (deadline == NO_DEADLINE) {
                uv_cond_wait(&s->cond, &s->mutex);
                continue;
            }
            uint64_t now = c10d__now_ns();
            if (now >= deadline)
                break;
            uv_cond_timedwait(&s->cond, &s->mutex, deadline - now);
        }
        uv_mutex_unlock(&s->mutex);
    }
    any_release(s);
    i = lowest_finished(works, n, deadline, &status);
    if (i < n)
        return any_result(works, n, i, status, index);
    if (rc != 0)
        return rc;
    return c10d__fail(C10D_ETIMEDOUT,
                      "c10d_work_wait_any: none of %zu works completed within %lld ms (the works "
                      "go on)",
                      n, (long long)timeout_ms);
}

struct then_state {
    c10d_work_then_cb cb;
    void *arg;
    c10d_work *child; /* a reference held until the callback ran */
};

/* A user callback on the parent: runs on the engine's own thread. */
static void then_fired(c10d_work *parent, int status, void *arg)
{
    struct then_state *t = arg;
    c10d__clear_error();
    int rc = t->cb(parent, status, t->child, t->arg);
    if (rc == 0) {
        c10d_work_complete(t->child, C10D_OK, NULL);
    } else if (rc < 0) {
        /* The message of the call that failed inside the callback, else the
         * parent's when its failure is passed on, else the status's name. */
        const char *err = c10d_last_error();
        if (*err != '\0')
            c10d__work_complete(t->child, rc, "%s", err);
        else if (rc == status)
            c10d__work_complete(t->child, rc, "%s", c10d_work_message(parent));
        else
            c10d__work_complete(t->child, rc, "c10d_work_then: the callback failed with %s (%s)",
                                c10d_status_name(rc), c10d_strerror(rc));
    } else if (rc != C10D_PENDING) {
        c10d__work_complete(t->child, C10D_EINVAL,
                            "c10d_work_then: the callback returned %d (expected 0, C10D_PENDING "
                            "or a negative c10d_status)",
                            rc);
    }
    /* C10D_PENDING: the callback completes the child itself, now or later. */
    c10d_work_release(t->child);
    free(t);
}

int c10d_work_then(c10d_work *work, c10d_work_then_cb cb, void *arg, c10d_work **out)
{
    if (out == NULL)
        return c10d__fail(C10D_EINVAL, "c10d_work_then: out is NULL");
    *out = NULL;
    if (work == NULL || cb == NULL)
        return c10d__fail(C10D_EINVAL, "c10d_work_then: %s is NULL",
                          work == NULL ? "work" : "callback");
    struct then_state *t = malloc(sizeof *t);
    if (t == NULL)
        return c10d__fail(C10D_ENOMEM, "c10d_work_then: out of memory");
    c10d_work *child;
    int rc = c10d_work_create("c10d_work_then", 0, &child);
    if (rc != 0) {
        free(t);
        return rc;
    }
    c10d_work_retain(child); /* the callback's */
    *t = (struct then_state){cb, arg, child};
    rc = c10d_work_on_complete(work, then_fired, t);
    if (rc != 0) {
        /* Never called back: complete the child (it leaves the pending list)
         * and drop both references. */
        char why[512];
        snprintf(why, sizeof why, "%s", c10d_last_error());
        c10d_work_complete(child, rc, why);
        c10d_work_release(child);
        c10d_work_release(child);
        free(t);
        return c10d__fail(rc, "c10d_work_then: %s", why);
    }
    *out = child;
    return 0;
}
