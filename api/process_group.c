/* Process-group objects: the default group from a rendezvous or a store,
 * subgroups, and their end (graceful destroy, immediate abort).
 *
 * Store layout as torch's: the rendezvous store is "default_pg/"-prefixed,
 * each group adds "<name>/", each backend "<device>/". Group names count
 * creation order on every rank ("0" is the default group), so every rank must
 * create groups in the same order, members or not. */
#include "pg.h"

#include "engine/env.h"
#include "engine/error.h"
#include "engine/log.h"
#include "engine/loop.h"
#include "engine/loop_call.h"
#include "engine/opts.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TCP_DEFAULT_TIMEOUT_MS  (30 * 60 * 1000)
#define NCCL_DEFAULT_TIMEOUT_MS (10 * 60 * 1000)
/* How long abort/destroy wait for the loop to act on them. */
#define LOOP_STEP_BOUND_MS 10000
/* Beyond the group timeout, how long init waits for a backend's connect. */
#define CREATE_MARGIN_MS 5000

static const char *const device_names[C10D__PG_NDEV] = {"cpu", "cuda"};

/* ------------------------------------------------------------ registry */

static uv_once_t registry_once = UV_ONCE_INIT;
static uv_mutex_t registry_mutex;
static c10d_pg *default_pg;
static int default_initialising;
static int group_count; /* names handed out since the default group */
static c10d_pg *groups; /* live groups, newest first */

#define ENDED_BY_SHUTDOWN "ended when the library was shut down (c10d_shutdown)"
#define ENDED_BY_FORK                                                                              \
    "was inherited from the parent process across fork(); a child creates its own groups"

/* A forked child keeps copies of the parent's groups, whose backends and
 * stores live on the parent's loop: mark them ended and start over, so the
 * child can create a default group of its own. Only this thread exists. */
static void registry_fork_prepare(void)
{
    uv_mutex_lock(&registry_mutex);
}

static void registry_fork_parent(void)
{
    uv_mutex_unlock(&registry_mutex);
}

static void registry_fork_child(void)
{
    uv_mutex_init(&registry_mutex);
    for (c10d_pg *g = groups; g != NULL; g = g->next_group) {
        uv_mutex_init(&g->mutex);
        uv_cond_init(&g->idle_cond);
        g->inherited = 1;
        g->ended_by = ENDED_BY_FORK;
        g->state = C10D_PG_CLOSED;
        g->pending = 0;
    }
    default_pg = NULL;
    default_initialising = 0;
    group_count = 0;
}

static void registry_init(void)
{
    uv_mutex_init(&registry_mutex);
    pthread_atfork(registry_fork_prepare, registry_fork_parent, registry_fork_child);
}

/* c10d_shutdown ends every group first, on the loop while it still runs
 * (newest first, as a destroy of the default group would), so that their
 * handles fail with C10D_EABORTED afterwards instead of reaching a loop that
 * is gone, and a later c10d_pg_init starts a new job. */
static struct c10d__shutdown_hook groups_hook;
static int groups_hook_registered; /* loop thread only */

static void pg_close(c10d_pg *pg, int graceful, const char *reason);

static void end_groups_at_shutdown(struct c10d__shutdown_hook *hook)
{
    (void)hook;
    groups_hook_registered = 0;
    for (;;) {
        uv_mutex_lock(&registry_mutex);
        c10d_pg *victim = NULL;
        for (c10d_pg *g = groups; g != NULL && victim == NULL; g = g->next_group) {
            uv_mutex_lock(&g->mutex);
            if (g->ended_by == NULL && !g->inherited) {
                g->ended_by = ENDED_BY_SHUTDOWN;
                victim = g;
            }
            uv_mutex_unlock(&g->mutex);
        }
        if (victim != NULL)
            c10d__pg_ref(victim);
        else {
            default_pg = NULL;
            default_initialising = 0;
            group_count = 0;
        }
        uv_mutex_unlock(&registry_mutex);
        if (victim == NULL)
            return;
        pg_close(victim, 0, "the library was shut down (c10d_shutdown)");
        c10d__pg_unref(victim);
    }
}

static void register_groups_hook(void *arg)
{
    (void)arg;
    if (groups_hook_registered)
        return;
    groups_hook.fn = end_groups_at_shutdown;
    c10d__engine_on_shutdown(&groups_hook);
    groups_hook_registered = 1;
}

static void registry_add(c10d_pg *pg)
{
    uv_mutex_lock(&registry_mutex);
    pg->next_group = groups;
    groups = pg;
    uv_mutex_unlock(&registry_mutex);
}

static void registry_remove(c10d_pg *pg)
{
    uv_mutex_lock(&registry_mutex);
    for (c10d_pg **p = &groups; *p != NULL; p = &(*p)->next_group)
        if (*p == pg) {
            *p = pg->next_group;
            break;
        }
    uv_mutex_unlock(&registry_mutex);
}

/* -------------------------------------------------------------- lifetime */

struct c10d__pg_op *c10d__pg_op_new(c10d_pg *pg, int dev, size_t extra_bytes)
{
    struct c10d__pg_op *po = calloc(1, sizeof *po + extra_bytes);
    if (po == NULL) {
        c10d__fail(C10D_ENOMEM, "%s: out of memory", pg->backend_name);
        return NULL;
    }
    po->pg = pg;
    po->dev = dev;
    po->refs = 2;
    po->storage = po + 1;
    return po;
}

void c10d__pg_op_free(struct c10d__pg_op *po)
{
    while (po != NULL) {
        struct c10d__pg_op *next = po->next_in_list;
        free(po);
        po = next;
    }
}

void c10d__pg_ref(c10d_pg *pg)
{
    uv_mutex_lock(&pg->mutex);
    pg->refs++;
    uv_mutex_unlock(&pg->mutex);
}

static void pg_free(c10d_pg *pg)
{
    registry_remove(pg);
    if (!pg->inherited) {
        for (int d = 0; d < C10D__PG_NDEV; d++)
            c10d__pg_store_release(pg->backends[d].store);
        c10d__pg_store_release(pg->store);
        c10d__pg_store_release(pg->base_store);
    }
    c10d__pg_op_free(pg->coal_head);
    free(pg->global_ranks);
    free(pg->name);
    free(pg->desc);
    free(pg->first_error);
    uv_cond_destroy(&pg->idle_cond);
    uv_mutex_destroy(&pg->mutex);
    free(pg);
}

void c10d__pg_unref(c10d_pg *pg)
{
    uv_mutex_lock(&pg->mutex);
    int last = --pg->refs == 0;
    uv_mutex_unlock(&pg->mutex);
    if (last)
        pg_free(pg);
}

static int pg_alloc(const char *name, const char *desc, int rank, int size, int global_rank,
                    const int *global_ranks, int64_t timeout_ms, c10d_pg **out)
{
    c10d_pg *pg = calloc(1, sizeof *pg);
    if (pg == NULL)
        return c10d__fail(C10D_ENOMEM, "process group: out of memory");
    uv_mutex_init(&pg->mutex);
    uv_cond_init(&pg->idle_cond);
    pg->refs = 1;
    pg->rank = rank;
    pg->size = size;
    pg->global_rank = global_rank;
    pg->timeout_ms = timeout_ms;
    pg->name = strdup(name);
    pg->desc = strdup(desc != NULL ? desc : "undefined");
    int n = size > 0 ? size : 0;
    pg->global_ranks = calloc((size_t)n + 1, sizeof(int));
    if (pg->name == NULL || pg->desc == NULL || pg->global_ranks == NULL) {
        pg_free(pg);
        return c10d__fail(C10D_ENOMEM, "process group: out of memory");
    }
    for (int i = 0; i < n; i++)
        pg->global_ranks[i] = global_ranks != NULL ? global_ranks[i] : i;
    strcpy(pg->backend_name_buf, "c10d");
    pg->backend_name = pg->backend_name_buf;
    registry_add(pg);
    *out = pg;
    return 0;
}

static void set_backend_name(c10d_pg *pg, const struct c10d__backend_vtable *vts[C10D__PG_NDEV])
{
    char *p = pg->backend_name_buf;
    size_t left = sizeof pg->backend_name_buf;
    p[0] = '\0';
    for (int d = 0; d < C10D__PG_NDEV; d++) {
        if (vts[d] == NULL)
            continue;
        int w = snprintf(p, left, "%s%s", p == pg->backend_name_buf ? "" : "+", vts[d]->name);
        if (w < 0 || (size_t)w >= left)
            break;
        p += w;
        left -= (size_t)w;
    }
    if (pg->backend_name_buf[0] == '\0')
        strcpy(pg->backend_name_buf, "c10d");
}

/* ------------------------------------------------- backend creation (sync) */

struct create_call {
    struct c10d__loop_call *call;
    int returned, done; /* loop thread only */
    int status;
    /* Why it failed, taken on the loop thread: the error text is per thread,
     * and the waiter would otherwise report whatever its own last error was. */
    char message[512];
    void *state;
    const struct c10d__backend_vtable *vt;
    /* cfg points at copies owned here, never into the group: a waiter that
     * gave up may free the group before a stalled loop runs the task. */
    struct c10d__backend_config cfg;
    char *name, *desc;
    int *global_ranks;
};

static void create_call_free(struct create_call *cc)
{
    free(cc->name);
    free(cc->desc);
    free(cc->global_ranks);
    if (cc->cfg.store != NULL)
        c10d_store_release(cc->cfg.store);
    free(cc);
}

/* ------------------------------------------------------ backend teardown */

/* One backend's abort-then-destroy chain on the loop. `cc` (may be NULL) is
 * told when it ends; it holds a reference on cc until then, so a backend that
 * calls back after the group stopped waiting finds live memory. */
struct close_call;
struct teardown {
    const struct c10d__backend_vtable *vt;
    void *state;
    struct close_call *cc;
};
static void close_call_backend_done(struct close_call *cc);

static void teardown_destroyed(void *arg, int status)
{
    struct teardown *td = arg;
    if (status != 0)
        C10D_WARN("pg", "%s: destroying the backend failed: %s", td->vt->name,
                  c10d_strerror(status));
    if (td->cc != NULL)
        close_call_backend_done(td->cc);
    free(td);
}

static void teardown_aborted(void *arg, int status)
{
    struct teardown *td = arg;
    (void)status;
    td->vt->destroy(td->state, teardown_destroyed, td);
}

/* Loop thread. Returns 0, or ENOMEM (the state is then destroyed without
 * waiting, best effort). */
static int teardown_start(const struct c10d__backend_vtable *vt, void *state, int abort,
                          int status, const char *reason, struct close_call *cc)
{
    struct teardown *td = malloc(sizeof *td);
    if (td == NULL) {
        if (abort)
            vt->abort(state, status, reason, NULL, NULL);
        vt->destroy(state, NULL, NULL);
        return C10D_ENOMEM;
    }
    *td = (struct teardown){vt, state, cc};
    if (abort)
        vt->abort(state, status, reason, teardown_aborted, td);
    else
        teardown_aborted(td, 0);
    return 0;
}

/* Loop thread: the answer goes back once create both called done and
 * returned (a backend may call done inside create). */
static void create_settle(struct create_call *cc)
{
    if (cc->done && cc->returned)
        c10d__loop_call_done(cc->call, cc->status, cc->message);
}

static void create_done(void *arg, int status)
{
    struct create_call *cc = arg;
    cc->done = 1;
    cc->status = status;
    if (status != 0)
        snprintf(cc->message, sizeof cc->message, "%s", c10d_last_error());
    create_settle(cc);
}

static void create_on_loop(struct c10d__loop_call *call, void *arg)
{
    struct create_call *cc = arg;
    cc->call = call;
    void *state = NULL;
    int rc = cc->vt->create(&cc->cfg, create_done, cc, &state);
    cc->returned = 1;
    cc->state = rc == 0 ? state : NULL;
    if (rc != 0) {
        /* A create that fails at once never calls done. */
        cc->done = 1;
        cc->status = rc;
        snprintf(cc->message, sizeof cc->message, "%s", c10d_last_error());
    }
    create_settle(cc);
}

/* Loop thread, when the waiter had given up: a state nobody will use is torn
 * down. */
static void create_abandoned(void *arg)
{
    struct create_call *cc = arg;
    if (cc->state != NULL)
        teardown_start(cc->vt, cc->state, 1, C10D_EABORTED, "process group creation timed out",
                       NULL);
    create_call_free(cc);
}

static int create_backend(c10d_pg *pg, int dev, const struct c10d__backend_vtable *vt)
{
    struct c10d__pg_backend *b = &pg->backends[dev];
    char prefix[16];
    snprintf(prefix, sizeof prefix, "%s/", device_names[dev]);
    C10D_CHECK(c10d__pg_store_prefix(pg->store, prefix, &b->store));
    struct create_call *cc = calloc(1, sizeof *cc);
    if (cc == NULL)
        return c10d__fail(C10D_ENOMEM, "process group: out of memory");
    cc->vt = vt;
    cc->name = strdup(pg->name);
    cc->desc = pg->desc != NULL ? strdup(pg->desc) : NULL;
    cc->global_ranks = malloc((size_t)pg->size * sizeof *cc->global_ranks);
    if (cc->name == NULL || (pg->desc != NULL && cc->desc == NULL) || cc->global_ranks == NULL) {
        create_call_free(cc);
        return c10d__fail(C10D_ENOMEM, "process group: out of memory");
    }
    memcpy(cc->global_ranks, pg->global_ranks, (size_t)pg->size * sizeof *cc->global_ranks);
    c10d_store_retain(b->store);
    cc->cfg.rank = pg->rank;
    cc->cfg.size = pg->size;
    cc->cfg.global_ranks = cc->global_ranks;
    cc->cfg.group_name = cc->name;
    cc->cfg.group_desc = cc->desc;
    cc->cfg.timeout_ms = pg->timeout_ms;
    cc->cfg.store = b->store;
    cc->cfg.device_type = (c10d_device_type)dev;
    cc->cfg.device_index = -1;
    char late[256];
    snprintf(late, sizeof late, "%s: process group %s: rank %d could not connect within %lld ms",
             vt->name, pg->name, pg->rank, (long long)pg->timeout_ms);
    int abandoned;
    int rc = c10d__loop_call_run(create_on_loop, cc, create_abandoned,
                                 pg->timeout_ms + CREATE_MARGIN_MS, late, &abandoned);
    if (abandoned)
        return rc;
    if (cc->returned && rc != 0) {
        if (cc->state != NULL) {
            /* Connected part way: tear it down on the loop. */
            b->vt = vt;
            b->state = cc->state;
        }
        char why[512];
        snprintf(why, sizeof why, "%s", cc->message[0] ? cc->message : c10d_strerror(rc));
        create_call_free(cc);
        return c10d__fail(rc, "%s: process group %s: rank %d failed to connect: %s", vt->name,
                          pg->name, pg->rank, why);
    }
    if (rc != 0) {
        /* Never ran: the engine is shutting down. */
        create_call_free(cc);
        return rc;
    }
    b->vt = vt;
    b->state = cc->state;
    create_call_free(cc);
    return 0;
}

static int create_backends(c10d_pg *pg, const struct c10d__backend_vtable *vts[C10D__PG_NDEV])
{
    set_backend_name(pg, vts);
    for (int d = 0; d < C10D__PG_NDEV; d++)
        if (vts[d] != NULL) {
            int rc = create_backend(pg, d, vts[d]);
            if (rc != 0)
                return rc;
        }
    return 0;
}

/* ----------------------------------------------------------------- close */

struct close_call {
    struct c10d__loop_call *call; /* NULL when run inline on the loop thread */
    c10d_pg *pg;
    int abort;
    int status;
    char *reason;
    uv_mutex_t mutex;
    int refs; /* the loop side's, one per teardown and the timer's; guarded by mutex */
    /* Loop thread only. */
    int outstanding; /* backends whose teardown has not ended */
    int finished;
    uv_timer_t bound;
    int64_t bound_ms;
};

static void close_call_unref(struct close_call *cc)
{
    uv_mutex_lock(&cc->mutex);
    int last = --cc->refs == 0;
    uv_mutex_unlock(&cc->mutex);
    if (last) {
        free(cc->reason);
        uv_mutex_destroy(&cc->mutex);
        free(cc);
    }
}

static void bound_closed(uv_handle_t *h)
{
    close_call_unref(h->data);
}

/* Loop thread: the group is done with its backends (or stopped waiting). */
static void close_finish(struct close_call *cc)
{
    if (cc->finished)
        return;
    cc->finished = 1;
    /* A timer the shutdown walk already closed keeps its reference: cc then
     * stays allocated (the loop's closing list points into it). */
    if (cc->bound.data != NULL && !uv_is_closing((uv_handle_t *)&cc->bound)) {
        uv_timer_stop(&cc->bound);
        uv_close((uv_handle_t *)&cc->bound, bound_closed);
    }
    if (cc->call != NULL)
        c10d__loop_call_done(cc->call, 0, NULL);
    c10d__pg_unref(cc->pg);
    cc->pg = NULL;
}

static void close_call_backend_done(struct close_call *cc)
{
    if (--cc->outstanding == 0)
        close_finish(cc);
    close_call_unref(cc);
}

static void close_bound_fired(uv_timer_t *t)
{
    struct close_call *cc = t->data;
    C10D_WARN("pg",
              "process group %s: a backend did not finish closing within %lld ms "
              "(C10D_BACKEND_CLOSE_MS); going on without it, its state is left behind",
              cc->pg->name, (long long)cc->bound_ms);
    close_finish(cc);
}

/* Loop thread: abort (when asked) and destroy every backend of the group,
 * each possibly asynchronous, bounded by a timer. Ops whose run task comes
 * later see aborted_on_loop and fail without the backend. */
static void close_on_loop(struct close_call *cc)
{
    c10d_pg *pg = cc->pg;
    cc->outstanding = 1; /* this function's own, so nothing finishes mid-loop */
    if (!pg->aborted_on_loop) {
        pg->aborted_on_loop = 1;
        for (int d = 0; d < C10D__PG_NDEV; d++) {
            struct c10d__pg_backend *b = &pg->backends[d];
            if (b->state == NULL)
                continue;
            void *state = b->state;
            b->state = NULL;
            uv_mutex_lock(&cc->mutex);
            cc->refs++;
            uv_mutex_unlock(&cc->mutex);
            cc->outstanding++;
            if (teardown_start(b->vt, state, cc->abort, cc->status, cc->reason, cc) != 0)
                close_call_backend_done(cc);
        }
    }
    if (cc->outstanding > 1) {
        cc->bound_ms = c10d__env_int(C10D_ENV_BACKEND_CLOSE_MS);
        uv_timer_init(c10d__engine_loop(), &cc->bound);
        cc->bound.data = cc;
        uv_mutex_lock(&cc->mutex);
        cc->refs++; /* the timer's, dropped when its handle is closed */
        uv_mutex_unlock(&cc->mutex);
        uv_timer_start(&cc->bound, close_bound_fired, (uint64_t)cc->bound_ms, 0);
    }
    if (--cc->outstanding == 0)
        close_finish(cc);
    close_call_unref(cc);
}

static void close_call_fn(struct c10d__loop_call *call, void *arg)
{
    struct close_call *cc = arg;
    cc->call = call;
    close_on_loop(cc);
}

static int has_backend(const c10d_pg *pg)
{
    for (int d = 0; d < C10D__PG_NDEV; d++)
        if (pg->backends[d].state != NULL)
            return 1;
    return 0;
}

/* Closes the group's backends on the loop (aborting them first when `abort`),
 * waiting a bounded time for the loop to do it. */
static void close_backends(c10d_pg *pg, int abort, int status, const char *reason)
{
    if (!has_backend(pg))
        return;
    struct close_call *cc = calloc(1, sizeof *cc);
    if (cc == NULL)
        return;
    cc->pg = pg;
    cc->abort = abort;
    cc->status = status;
    cc->reason = strdup(reason != NULL ? reason : "aborted");
    uv_mutex_init(&cc->mutex);
    cc->refs = 1; /* the loop side's: the caller reads nothing back */
    c10d__pg_ref(pg);
    if (c10d__on_loop_thread()) {
        close_on_loop(cc);
        return;
    }
    char late[256];
    snprintf(late, sizeof late,
             "process group %s: the loop thread did not close the backend within %d ms (is a "
             "callback blocking it?); it will when it gets there",
             pg->name, LOOP_STEP_BOUND_MS);
    int abandoned;
    int rc = c10d__loop_call_run(close_call_fn, cc, NULL,
                                 LOOP_STEP_BOUND_MS + c10d__env_int(C10D_ENV_BACKEND_CLOSE_MS),
                                 late, &abandoned);
    if (abandoned) {
        C10D_WARN("pg", "%s", late);
    } else if (rc != 0) {
        /* Never ran: the engine is gone, and every handle with it. */
        c10d__pg_unref(pg);
        close_call_unref(cc);
    }
}

/* Ends a group: graceful waits (bounded by the group's timeout) for pending
 * ops, abort fails them. The handle stays valid until its last unref. */
static void pg_close(c10d_pg *pg, int graceful, const char *reason)
{
    uv_mutex_lock(&pg->mutex);
    if (pg->state == C10D_PG_CLOSED) {
        uv_mutex_unlock(&pg->mutex);
        return;
    }
    int drained = 1;
    if (graceful) {
        uint64_t deadline = c10d__now_ns() + (uint64_t)pg->timeout_ms * 1000000u;
        while (pg->pending > 0) {
            uint64_t now = c10d__now_ns();
            if (now >= deadline)
                break;
            uv_cond_timedwait(&pg->idle_cond, &pg->mutex, deadline - now);
        }
        drained = pg->pending == 0;
    }
    pg->state = C10D_PG_CLOSED;
    struct c10d__pg_op *coalesced = pg->coal_head;
    pg->coal_head = pg->coal_tail = NULL;
    pg->coalescing = 0;
    char why[512];
    if (!drained)
        snprintf(why, sizeof why,
                 "process group %s destroyed with %zu ops still pending after %lld ms", pg->name,
                 pg->pending, (long long)pg->timeout_ms);
    else
        snprintf(why, sizeof why, "process group %s aborted: %s", pg->name,
                 reason != NULL ? reason : "c10d_pg_abort");
    if ((!graceful || !drained) && pg->first_status == 0) {
        pg->first_status = C10D_EABORTED;
        pg->first_error = strdup(why);
    }
    uv_mutex_unlock(&pg->mutex);
    c10d__pg_op_free(coalesced);
    close_backends(pg, !graceful || !drained, C10D_EABORTED, why);
}

/* -------------------------------------------------------------- creation */

static int64_t default_timeout(const struct c10d__backend_vtable *vts[C10D__PG_NDEV])
{
    return vts[0] == NULL && vts[1] != NULL ? NCCL_DEFAULT_TIMEOUT_MS : TCP_DEFAULT_TIMEOUT_MS;
}

/* Creates, connects and registers a group: name, store and ranks are set. */
static int pg_start(c10d_pg *pg, c10d_store *base, const struct c10d__backend_vtable *vts[])
{
    pg->base_store = base;
    c10d__pg_store_retain(base);
    c10d__engine_call(register_groups_hook, NULL);
    if (pg->rank < 0)
        return 0;
    char prefix[32];
    snprintf(prefix, sizeof prefix, "%s/", pg->name);
    C10D_CHECK(c10d__pg_store_prefix(base, prefix, &pg->store));
    return create_backends(pg, vts);
}

int c10d__pg_create_with_backend(const struct c10d__backend_vtable *vt, c10d_store *store, int rank,
                                 int size, int64_t timeout_ms, c10d_pg **out)
{
    uv_once(&registry_once, registry_init);
    if (out == NULL || vt == NULL || size <= 0 || rank < 0 || rank >= size)
        return c10d__fail(C10D_EINVAL, "c10d__pg_create_with_backend: bad arguments");
    c10d_pg *pg;
    C10D_CHECK(pg_alloc("test", "test", rank, size, rank, NULL,
                        timeout_ms > 0 ? timeout_ms : TCP_DEFAULT_TIMEOUT_MS, &pg));
    const struct c10d__backend_vtable *vts[C10D__PG_NDEV] = {vt, NULL};
    int rc = pg_start(pg, store, vts);
    if (rc != 0) {
        close_backends(pg, 1, C10D_EABORTED, "creation failed");
        c10d__pg_unref(pg);
        return rc;
    }
    *out = pg;
    return 0;
}

int c10d_pg_init(const c10d_pg_opts *opts, c10d_pg **out)
{
    uv_once(&registry_once, registry_init);
    if (out == NULL)
        return c10d__fail(C10D_EINVAL, "c10d_pg_init: out is NULL");
    *out = NULL;
    if (c10d__on_loop_thread())
        return c10d__fail(C10D_EDEADLK, "c10d_pg_init blocks: it cannot run inside a callback");
    c10d_pg_opts o;
    C10D_CHECK(c10d__opts_read(&o, sizeof o, C10D__PG_OPTS_V1_SIZE, opts, "c10d_pg_init"));
    if (o.store != NULL && o.init_method != NULL)
        return c10d__fail(C10D_EINVAL,
                          "c10d_pg_init: both a store and an init_method (\"%s\") were given; "
                          "pass one of them",
                          o.init_method);
    if (o.timeout_ms < 0)
        return c10d__fail(C10D_EINVAL, "c10d_pg_init: invalid timeout %lld ms",
                          (long long)o.timeout_ms);
    if (o.store != NULL) {
        if (o.world_size <= 0)
            return c10d__fail(C10D_EINVAL,
                              "c10d_pg_init: world_size must be > 0 with a store (got %d)",
                              o.world_size);
        if (o.rank < 0 || o.rank >= o.world_size)
            return c10d__fail(C10D_EINVAL,
                              "c10d_pg_init: rank must be in [0, %d) with a store (got %d)",
                              o.world_size, o.rank);
    } else if (o.world_size < 0 || (o.world_size > 0 && (o.rank < 0 || o.rank >= o.world_size))) {
        return c10d__fail(C10D_EINVAL, "c10d_pg_init: invalid rank %d / world_size %d", o.rank,
                          o.world_size);
    }
    const struct c10d__backend_vtable *vts[C10D__PG_NDEV];
    C10D_CHECK(c10d__backend_parse(o.backend, vts));
    int64_t timeout = o.timeout_ms > 0 ? o.timeout_ms : default_timeout(vts);

    uv_mutex_lock(&registry_mutex);
    int busy = default_pg != NULL || default_initialising;
    if (!busy)
        default_initialising = 1;
    uv_mutex_unlock(&registry_mutex);
    if (busy)
        return c10d__fail(C10D_EINVAL,
                          "c10d_pg_init: the default process group is already initialised "
                          "(destroy it first)");

    c10d_store *base = o.store;
    int rank = o.rank, size = o.world_size;
    int rc = 0;
    if (base == NULL) {
        rc = c10d__pg_rendezvous(o.init_method != NULL ? o.init_method : "env://", o.rank,
                                 o.world_size, timeout, &base, &rank, &size);
    } else {
        c10d__pg_store_retain(base);
    }
    c10d_pg *pg = NULL;
    if (rc == 0)
        rc = pg_alloc("0", o.group_desc != NULL ? o.group_desc : "default_pg", rank, size, rank,
                      NULL, timeout, &pg);
    if (rc == 0) {
        pg->is_default = 1;
        c10d__log_set_rank(rank);
        rc = pg_start(pg, base, vts);
    }
    if (rc == 0)
        rc = c10d__pg_store_barrier(base, "0", size, timeout);
    c10d__pg_store_release(base); /* the group holds its own reference */
    uv_mutex_lock(&registry_mutex);
    default_initialising = 0;
    if (rc == 0) {
        default_pg = pg;
        group_count = 1;
    }
    uv_mutex_unlock(&registry_mutex);
    if (rc != 0) {
        char why[1024];
        snprintf(why, sizeof why, "%s", c10d_last_error());
        if (pg != NULL) {
            pg_close(pg, 0, "initialisation failed");
            c10d__pg_unref(pg);
        }
        return c10d__fail(rc, "%s", why);
    }
    C10D_INFO("pg", "default process group ready: rank %d of %d, backend %s", rank, size,
              pg->backend_name);
    *out = pg;
    return 0;
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

int c10d_pg_new_group(c10d_pg *parent, const int *ranks, int nranks, const c10d_pg_opts *opts,
                      c10d_pg **out)
{
    uv_once(&registry_once, registry_init);
    if (out == NULL)
        return c10d__fail(C10D_EINVAL, "c10d_pg_new_group: out is NULL");
    *out = NULL;
    if (parent == NULL)
        return c10d__fail(C10D_EINVAL, "c10d_pg_new_group: parent is NULL");
    c10d_pg_opts o;
    C10D_CHECK(c10d__opts_read(&o, sizeof o, C10D__PG_OPTS_V1_SIZE, opts, "c10d_pg_new_group"));
    opts = &o;
    if (c10d__on_loop_thread())
        return c10d__fail(C10D_EDEADLK,
                          "c10d_pg_new_group blocks: it cannot run inside a callback");
    if (parent->rank < 0)
        return c10d__fail(C10D_EINVAL,
                          "c10d_pg_new_group: this rank is not a member of parent group %s",
                          parent->name);
    if (nranks < 0 || (ranks == NULL && nranks > 0))
        return c10d__fail(C10D_EINVAL, "c10d_pg_new_group: invalid ranks list (%p, %d entries)",
                          (const void *)ranks, nranks);
    if (opts != NULL && (opts->store != NULL || opts->init_method != NULL))
        return c10d__fail(C10D_EINVAL,
                          "c10d_pg_new_group: a subgroup uses its parent's store (no store or "
                          "init_method)");
    if (opts != NULL && opts->timeout_ms < 0)
        return c10d__fail(C10D_EINVAL, "c10d_pg_new_group: invalid timeout %lld ms",
                          (long long)opts->timeout_ms);
    int n = nranks > 0 ? nranks : parent->size;
    int *sorted = malloc((size_t)n * sizeof(int));
    int *global = malloc((size_t)n * sizeof(int));
    if (sorted == NULL || global == NULL) {
        free(sorted);
        free(global);
        return c10d__fail(C10D_ENOMEM, "c10d_pg_new_group: out of memory");
    }
    for (int i = 0; i < n; i++)
        sorted[i] = nranks > 0 ? ranks[i] : i;
    qsort(sorted, (size_t)n, sizeof(int), cmp_int);
    int rc = 0, my_rank = -1;
    for (int i = 0; i < n && rc == 0; i++) {
        if (sorted[i] < 0 || sorted[i] >= parent->size)
            rc = c10d__fail(C10D_EINVAL,
                            "c10d_pg_new_group: rank %d is out of range (parent group size %d)",
                            sorted[i], parent->size);
        else if (i > 0 && sorted[i] == sorted[i - 1])
            rc = c10d__fail(C10D_EINVAL, "c10d_pg_new_group: rank %d appears more than once",
                            sorted[i]);
        else {
            global[i] = parent->global_ranks[sorted[i]];
            if (sorted[i] == parent->rank)
                my_rank = i;
        }
    }
    const struct c10d__backend_vtable *vts[C10D__PG_NDEV];
    for (int d = 0; d < C10D__PG_NDEV; d++)
        vts[d] = parent->backends[d].vt;
    if (rc == 0 && opts != NULL && opts->backend != NULL)
        rc = c10d__backend_parse(opts->backend, vts);
    free(sorted);
    if (rc != 0) {
        free(global);
        return rc;
    }
    /* From here the name is taken on every rank: failures are fatal anyway. */
    uv_mutex_lock(&registry_mutex);
    int id = group_count++;
    c10d_pg *world = default_pg;
    int world_size = world != NULL ? world->size : parent->size;
    uv_mutex_unlock(&registry_mutex);
    char name[16];
    snprintf(name, sizeof name, "%d", id);
    int64_t timeout = opts != NULL && opts->timeout_ms > 0 ? opts->timeout_ms : parent->timeout_ms;
    c10d_pg *pg;
    rc = pg_alloc(name, opts != NULL ? opts->group_desc : NULL, my_rank, my_rank >= 0 ? n : -1,
                  parent->global_rank, global, timeout, &pg);
    free(global);
    if (rc != 0)
        return rc;
    if (my_rank < 0) {
        /* Keep the members for rank translation, but no backend. */
        set_backend_name(pg, vts);
    }
    c10d_store *base = parent->base_store;
    rc = pg_start(pg, base, vts);
    if (rc == 0)
        rc = c10d__pg_store_barrier(base, name, world_size, timeout);
    if (rc != 0) {
        char why[1024];
        snprintf(why, sizeof why, "%s", c10d_last_error());
        pg_close(pg, 0, "creation failed");
        c10d__pg_unref(pg);
        return c10d__fail(rc, "c10d_pg_new_group: group %s: %s", name, why);
    }
    if (my_rank < 0)
        C10D_INFO("pg", "group %s created; this rank is not a member", name);
    *out = pg;
    return 0;
}

/* --------------------------------------------------------------- queries */

int c10d_pg_rank(const c10d_pg *pg)
{
    if (pg == NULL)
        return c10d__fail(C10D_EINVAL, "c10d_pg_rank: pg is NULL");
    return pg->rank;
}

int c10d_pg_size(const c10d_pg *pg)
{
    if (pg == NULL)
        return c10d__fail(C10D_EINVAL, "c10d_pg_size: pg is NULL");
    return pg->size;
}

int c10d_pg_is_member(const c10d_pg *pg)
{
    return pg != NULL && pg->rank >= 0;
}

/* ------------------------------------------------------------------- end */

/* The default group takes every other group with it, newest first (torch:
 * reverse name order); their handles stay valid until destroyed. */
static void close_all_groups(c10d_pg *world, int graceful, const char *reason)
{
    for (;;) {
        uv_mutex_lock(&registry_mutex);
        c10d_pg *victim = NULL;
        for (c10d_pg *g = groups; g != NULL; g = g->next_group) {
            if (g == world)
                continue;
            uv_mutex_lock(&g->mutex);
            int live = g->state == C10D_PG_LIVE;
            uv_mutex_unlock(&g->mutex);
            if (live) {
                victim = g;
                break;
            }
        }
        if (victim != NULL)
            c10d__pg_ref(victim);
        uv_mutex_unlock(&registry_mutex);
        if (victim == NULL)
            return;
        pg_close(victim, graceful, reason);
        c10d__pg_unref(victim);
    }
}

static void forget_default(c10d_pg *pg)
{
    uv_mutex_lock(&registry_mutex);
    if (default_pg == pg) {
        default_pg = NULL;
        group_count = 0;
    }
    uv_mutex_unlock(&registry_mutex);
}

/* The group's store keys (its creation barrier, each rank's published
 * address) are garbage once every rank destroyed it: each rank counts itself
 * out, and the last one deletes them, so a long job that creates and destroys
 * many groups does not grow the store. All of it runs asynchronously, best
 * effort: a rank that aborts (or never gets here) leaves them. PyTorch keeps
 * them; nothing reads them after creation. */
struct key_sweep {
    c10d_store *base, *group;
    c10d_store *dev[C10D__PG_NDEV];
    const char *fmt[C10D__PG_NDEV];
    char name[64];
    int size;
};

static void sweep_release(const c10d_store_result *res, void *arg)
{
    (void)res;
    c10d_store_release(arg);
}

static void sweep_delete(c10d_store *s, const char *key)
{
    c10d_store_retain(s);
    if (c10d_store_delete_key(s, key, sweep_release, s) != 0)
        c10d_store_release(s);
}

static void on_counted_out(const c10d_store_result *res, void *arg)
{
    struct key_sweep *k = arg;
    if (res->status == 0 && res->value == k->size) {
        char key[600];
        snprintf(key, sizeof key, "store_based_barrier_key:%s", k->name);
        sweep_delete(k->base, key);
        snprintf(key, sizeof key, "store_based_barrier_key:%s:last_worker", k->name);
        sweep_delete(k->base, key);
        sweep_delete(k->group, "destroyed_ranks");
        for (int d = 0; d < C10D__PG_NDEV; d++)
            for (int r = 0; k->dev[d] != NULL && r < k->size; r++) {
                snprintf(key, sizeof key, k->fmt[d], r);
                sweep_delete(k->dev[d], key);
            }
    }
    c10d_store_release(k->base);
    c10d_store_release(k->group);
    for (int d = 0; d < C10D__PG_NDEV; d++)
        if (k->dev[d] != NULL)
            c10d_store_release(k->dev[d]);
    free(k);
}

static void sweep_keys(c10d_pg *pg)
{
    if (pg->rank < 0 || pg->store == NULL || pg->base_store == NULL)
        return;
    struct key_sweep *k = calloc(1, sizeof *k);
    if (k == NULL)
        return;
    k->base = pg->base_store;
    k->group = pg->store;
    k->size = pg->size;
    snprintf(k->name, sizeof k->name, "%s", pg->name);
    c10d_store_retain(k->base);
    c10d_store_retain(k->group);
    for (int d = 0; d < C10D__PG_NDEV; d++) {
        const struct c10d__pg_backend *b = &pg->backends[d];
        if (b->vt != NULL && b->vt->published_key_fmt != NULL && b->store != NULL) {
            k->dev[d] = b->store;
            k->fmt[d] = b->vt->published_key_fmt;
            c10d_store_retain(b->store);
        }
    }
    if (c10d_store_add(pg->store, "destroyed_ranks", 1, on_counted_out, k) != 0) {
        c10d_store_result none = {.status = C10D_EABORTED};
        on_counted_out(&none, k);
    }
}

int c10d_pg_destroy(c10d_pg *pg)
{
    if (pg == NULL)
        return c10d__fail(C10D_EINVAL, "c10d_pg_destroy: pg is NULL");
    if (c10d__on_loop_thread())
        return c10d__fail(C10D_EDEADLK,
                          "c10d_pg_destroy waits for pending ops: it cannot run inside a "
                          "callback (use c10d_pg_abort there)");
    uv_mutex_lock(&pg->mutex);
    const char *ended_by = pg->ended_by;
    uv_mutex_unlock(&pg->mutex);
    if (pg->is_default && ended_by == NULL)
        close_all_groups(pg, 1, NULL);
    pg_close(pg, 1, NULL);
    uv_mutex_lock(&pg->mutex);
    int healthy = pg->first_status == 0;
    uv_mutex_unlock(&pg->mutex);
    if (ended_by == NULL && healthy)
        sweep_keys(pg);
    if (pg->is_default)
        forget_default(pg);
    char name[64];
    snprintf(name, sizeof name, "%s", pg->name);
    c10d__pg_unref(pg);
    /* The handle is freed all the same: nothing else could free it. */
    if (ended_by != NULL)
        return c10d__fail(C10D_EABORTED, "c10d_pg_destroy: process group %s %s", name, ended_by);
    return 0;
}

int c10d_pg_abort(c10d_pg *pg, const char *reason)
{
    if (pg == NULL)
        return c10d__fail(C10D_EINVAL, "c10d_pg_abort: pg is NULL");
    if (pg->is_default)
        close_all_groups(pg, 0, reason);
    pg_close(pg, 0, reason);
    if (pg->is_default)
        forget_default(pg);
    c10d__pg_unref(pg);
    return 0;
}
