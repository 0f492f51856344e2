/* A group's backends, created and ended from the group's blocking calls
 * through the loop: creation waits (bounded) for each backend to connect;
 * ending runs each backend's abort-then-destroy chain on the loop, each
 * possibly asynchronous (a device backend's abort may block in its driver and
 * runs off the loop), bounded by a loop timer (C10D_BACKEND_CLOSE_MS) so that
 * destroy and abort always return. */
#include "pg.h"

#include "engine/env.h"
#include "engine/error.h"
#include "engine/log.h"
#include "engine/loop.h"
#include "engine/loop_call.h"
#include "store_server/client/store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* How long abort/destroy wait for the loop to act on them. */
#define LOOP_STEP_BOUND_MS 10000
/* Beyond the group timeout, how long init waits for a backend's connect. */
#define CREATE_MARGIN_MS 5000

static const char *const device_names[C10D__PG_NDEV] = {"cpu", "cuda"};

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
    /* A subgroup: split from the parent's backend on this device where the
     * backend can (`split`), else created through the store. */
    c10d_pg *parent; /* holds a reference */
    int color, key;
    int *excluded; /* a shrink: the parent ranks left out (owned) */
    int nexcluded;
    int shrink_flags;               /* C10D_SHRINK_* */
    struct c10d__store_route route; /* cfg.store_local_addr/store_host point here */
};

static void create_call_free(struct create_call *cc)
{
    if (cc->parent != NULL)
        c10d__pg_unref(cc->parent);
    free(cc->name);
    free(cc->desc);
    free(cc->global_ranks);
    free(cc->excluded);
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
static int teardown_start(const struct c10d__backend_vtable *vt, void *state, int abort, int status,
                          const char *reason, struct close_call *cc)
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
    /* Read here: the store's connection belongs to the loop thread. */
    if (c10d__store_route(cc->cfg.store, &cc->route) == 0) {
        cc->cfg.store_local_addr = (const struct sockaddr *)&cc->route.local;
        cc->cfg.store_host = cc->route.host;
    }
    /* Read here: the parent's state changes only on the loop thread. */
    void *parent_state = NULL;
    if (cc->parent != NULL && cc->parent->backends[cc->cfg.device_type].vt == cc->vt)
        parent_state = cc->parent->backends[cc->cfg.device_type].state;
    int (*split)(void *, const struct c10d__backend_config *, int, int, c10d__backend_done_fn,
                 void *, void **) = cc->vt->split;
    int (*shrink)(void *, const struct c10d__backend_config *, const int *, int, int,
                  c10d__backend_done_fn, void *, void **) = cc->vt->shrink;
    int rc = 0;
    if (cc->excluded != NULL && parent_state != NULL && shrink != NULL)
        rc = shrink(parent_state, &cc->cfg, cc->excluded, cc->nexcluded, cc->shrink_flags,
                    create_done, cc, &state);
    else if (cc->excluded != NULL)
        rc = cc->vt->create(&cc->cfg, create_done, cc, &state);
    else if (parent_state != NULL && split != NULL)
        rc = split(parent_state, &cc->cfg, cc->color, cc->key, create_done, cc, &state);
    else if (cc->color < 0)
        cc->done = 1; /* outside the subgroup, and no parent state to split */
    else
        rc = cc->vt->create(&cc->cfg, create_done, cc, &state);
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

static int create_backend(c10d_pg *pg, int dev, const struct c10d__backend_vtable *vt,
                          c10d_pg *parent, const int *excluded, int nexcluded, int shrink_flags)
{
    struct c10d__pg_backend *b = &pg->backends[dev];
    char prefix[16];
    snprintf(prefix, sizeof prefix, "%s/", device_names[dev]);
    C10D_CHECK(c10d__pg_store_prefix(pg->store, prefix, &b->store));
    struct create_call *cc = calloc(1, sizeof *cc);
    if (cc == NULL)
        return c10d__fail(C10D_ENOMEM, "process group: out of memory");
    cc->vt = vt;
    cc->name = strdup(pg->wire_name != NULL ? pg->wire_name : pg->name);
    cc->desc = pg->desc != NULL ? strdup(pg->desc) : NULL;
    cc->global_ranks = malloc((size_t)pg->size * sizeof *cc->global_ranks);
    if (cc->name == NULL || (pg->desc != NULL && cc->desc == NULL) || cc->global_ranks == NULL) {
        create_call_free(cc);
        return c10d__fail(C10D_ENOMEM, "process group: out of memory");
    }
    memcpy(cc->global_ranks, pg->global_ranks, (size_t)pg->size * sizeof *cc->global_ranks);
    if (parent != NULL) {
        c10d__pg_ref(parent);
        cc->parent = parent;
        cc->color = pg->split_color;
        cc->key = pg->rank;
    }
    if (excluded != NULL) {
        cc->excluded = malloc((size_t)nexcluded * sizeof *cc->excluded + 1);
        if (cc->excluded == NULL) {
            create_call_free(cc);
            return c10d__fail(C10D_ENOMEM, "process group: out of memory");
        }
        memcpy(cc->excluded, excluded, (size_t)nexcluded * sizeof *cc->excluded);
        cc->nexcluded = nexcluded;
        cc->shrink_flags = shrink_flags;
    }
    c10d_store_retain(b->store);
    cc->cfg.rank = pg->rank;
    cc->cfg.size = pg->size;
    cc->cfg.global_ranks = cc->global_ranks;
    cc->cfg.group_name = cc->name;
    cc->cfg.group_desc = cc->desc;
    cc->cfg.timeout_ms = pg->timeout_ms;
    cc->cfg.store = b->store;
    cc->cfg.device_type = (c10d_device_type)dev;
    cc->cfg.device_index = dev == C10D_DEVICE_CUDA ? pg->device_index : -1;
    cc->cfg.nccl_opts = &pg->nccl_opts;
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
    /* Kept: the state may be torn down on the loop while a caller asks. */
    if (dev == C10D_DEVICE_CPU && vt->path != NULL)
        pg->host_path = vt->path(cc->state);
    create_call_free(cc);
    return 0;
}

int c10d__pg_create_backends(c10d_pg *pg, const struct c10d__backend_vtable *vts[C10D__PG_NDEV],
                             c10d_pg *parent)
{
    for (int d = 0; d < C10D__PG_NDEV; d++)
        if (vts[d] != NULL) {
            int rc = create_backend(pg, d, vts[d], parent, NULL, 0, 0);
            if (rc != 0)
                return rc;
        }
    return 0;
}

int c10d__pg_shrink_backends(c10d_pg *pg, const struct c10d__backend_vtable *vts[C10D__PG_NDEV],
                             c10d_pg *parent, const int *excluded, int nexcluded, int flags)
{
    for (int d = 0; d < C10D__PG_NDEV; d++)
        if (vts[d] != NULL) {
            int rc = create_backend(pg, d, vts[d], parent, excluded, nexcluded, flags);
            if (rc != 0)
                return rc;
        }
    return 0;
}

/* A parent rank outside a new subgroup: a backend that splits needs every
 * parent rank in the split (ncclCommSplit is collective over the parent), so
 * this rank takes part with no color (the same call as a member's, with no
 * store and no child state). */
int c10d__pg_split_out(c10d_pg *parent)
{
    for (int d = 0; d < C10D__PG_NDEV; d++) {
        const struct c10d__backend_vtable *vt = parent->backends[d].vt;
        if (vt == NULL || vt->split == NULL)
            continue;
        struct create_call *cc = calloc(1, sizeof *cc);
        if (cc == NULL)
            return c10d__fail(C10D_ENOMEM, "process group: out of memory");
        c10d__pg_ref(parent);
        cc->parent = parent;
        cc->vt = vt;
        cc->color = -1;
        cc->key = parent->rank;
        cc->cfg.rank = -1;
        cc->cfg.device_type = (c10d_device_type)d;
        cc->cfg.device_index = -1;
        char late[256];
        snprintf(late, sizeof late,
                 "%s: process group %s: rank %d did not finish a split within %lld ms", vt->name,
                 parent->name, parent->rank, (long long)parent->timeout_ms);
        int abandoned;
        int rc = c10d__loop_call_run(create_on_loop, cc, create_abandoned,
                                     parent->timeout_ms + CREATE_MARGIN_MS, late, &abandoned);
        if (!abandoned)
            create_call_free(cc);
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

static void unpark_on_loop(void *arg)
{
    c10d_pg *pg = arg;
    for (int d = 0; d < C10D__PG_NDEV; d++) {
        struct c10d__pg_backend *b = &pg->backends[d];
        if (b->state != NULL && b->vt->unpark != NULL)
            b->vt->unpark(b->state);
    }
    c10d__pg_unref(pg);
}

void c10d__pg_unpark_backends(c10d_pg *pg)
{
    c10d__pg_ref(pg);
    if (c10d__engine_call(unpark_on_loop, pg) != 0)
        c10d__pg_unref(pg); /* the engine ends: its shutdown fails what is parked */
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
void c10d__pg_close_backends(c10d_pg *pg, int abort, int status, const char *reason)
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
