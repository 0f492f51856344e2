/* Process groups: the default group from a rendezvous or a store, the start
 * every group shares (pg_subgroups.c makes the others), queries, and their
 * end (graceful destroy, immediate abort).
 *
 * Store layout as torch's: the rendezvous store is "default_pg/"-prefixed,
 * each group adds "<name>/", each backend "<device>/". Group names count
 * creation order on every rank ("0" is the default group), so every rank must
 * create groups in the same order, members or not. */
#include "pg.h"

#include "api/torch_env.h"
#include "engine/env.h"
#include "engine/error.h"
#include "engine/work.h"
#include "engine/log.h"
#include "engine/loop.h"
#include "engine/opts.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define TCP_DEFAULT_TIMEOUT_MS  (30 * 60 * 1000)
#define NCCL_DEFAULT_TIMEOUT_MS (10 * 60 * 1000)
/* The most destroy waits for its key sweep to be answered, on a store that
 * outlives the job: a round trip for the count, one per key for the last
 * rank out. */
#define SWEEP_FLUSH_MS 2000

/* ------------------------------------------------------------ registry */

static uv_once_t registry_once = UV_ONCE_INIT;
static c10d_pg *default_pg;
static int default_initialising;
static int group_count; /* names handed out since the default group */
/* The default group's store may outlive the job (an agent, external or
 * caller's store): destroys wait for their key sweep (SWEEP_FLUSH_MS). A
 * store rank 0 hosts dies with it, sweep or not. */
static int store_outlives_job;

#define ENDED_BY_SHUTDOWN "ended when the library was shut down (c10d_shutdown)"
/* Groups ended by a shrink of the default group: refused, but their destroy
 * is the ordinary way to let go of them (it returns 0). */
static const char ended_by_shrink[] =
    "ended when the default group was shrunk (c10d_pg_shrink); use the shrunk group";
/* A forked child starts over (pg_object.c marks the inherited group objects
 * ended): it may create a default group of its own. Only this thread exists. */
static void registry_fork_child(void)
{
    default_pg = NULL;
    default_initialising = 0;
    group_count = 0;
}

static void registry_init(void)
{
    pthread_atfork(NULL, NULL, registry_fork_child);
}

void c10d__pg_registry_once(void)
{
    uv_once(&registry_once, registry_init);
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
        c10d__pg_registry_lock();
        c10d_pg *victim = NULL;
        for (c10d_pg *g = c10d__pg_registry_head(); g != NULL && victim == NULL;
             g = g->next_group) {
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
        c10d__pg_registry_unlock();
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

void c10d__pg_end_at_shutdown(void)
{
    c10d__engine_call(register_groups_hook, NULL);
}

void c10d__pg_set_backend_name(c10d_pg *pg, const struct c10d__backend_vtable *vts[C10D__PG_NDEV])
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

/* Ends a group: graceful waits (bounded by the group's timeout) for pending
 * ops, abort fails them. The handle stays valid until its last unref. */
static void pg_close(c10d_pg *pg, int graceful, const char *reason)
{
    /* An op parked for a waiter that never comes (the caller's lanes,
     * docs/engine.md) would hold the drain up: the backends hand theirs to
     * the loop first (on the loop, outside the group's mutex, which their
     * completion may take). Not for a group that is closed, or was ended by
     * c10d_shutdown (which completed every op) or a fork (its backends are
     * the parent's): asking its loop would start an engine for nothing. */
    uv_mutex_lock(&pg->mutex);
    int live = pg->state != C10D_PG_CLOSED && pg->ended_by == NULL && !pg->inherited;
    uv_mutex_unlock(&pg->mutex);
    if (live)
        c10d__pg_unpark_backends(pg);
    uv_mutex_lock(&pg->mutex);
    if (pg->state == C10D_PG_CLOSED) {
        uv_mutex_unlock(&pg->mutex);
        return;
    }
    int drained = 1;
    if (graceful) {
        uint64_t deadline = c10d__now_ns() + (uint64_t)pg->timeout_ms * 1000000u;
        atomic_fetch_add(&pg->idle_waiters, 1);
        while (atomic_load(&pg->pending) > 0) {
            uint64_t now = c10d__now_ns();
            if (now >= deadline)
                break;
            uv_cond_timedwait(&pg->idle_cond, &pg->mutex, deadline - now);
        }
        atomic_fetch_sub(&pg->idle_waiters, 1);
        drained = atomic_load(&pg->pending) == 0;
    }
    pg->state = C10D_PG_CLOSED;
    struct c10d__pg_op *coalesced = pg->coal_head;
    pg->coal_head = pg->coal_tail = NULL;
    pg->coalescing = 0;
    char why[512];
    if (!drained)
        snprintf(why, sizeof why,
                 "process group %s destroyed with %zu ops still pending after %lld ms", pg->name,
                 atomic_load(&pg->pending), (long long)pg->timeout_ms);
    else
        snprintf(why, sizeof why, "process group %s aborted: %s", pg->name,
                 reason != NULL ? reason : "c10d_pg_abort");
    if ((!graceful || !drained) && pg->first_status == 0) {
        pg->first_status = C10D_EABORTED;
        pg->first_error = strdup(why);
    }
    uv_mutex_unlock(&pg->mutex);
    c10d__pg_op_free(coalesced);
    c10d__pg_close_backends(pg, !graceful || !drained, C10D_EABORTED, why);
}

/* -------------------------------------------------------------- creation */

static int64_t default_timeout(const struct c10d__backend_vtable *vts[C10D__PG_NDEV])
{
    return vts[0] == NULL && vts[1] != NULL ? NCCL_DEFAULT_TIMEOUT_MS : TCP_DEFAULT_TIMEOUT_MS;
}

/* The device binding and NCCL settings of a new group: the caller's, else
 * the parent's. */
int c10d__pg_set_device_opts(c10d_pg *pg, const c10d_pg_opts *o, const c10d_pg *parent,
                             const char *what)
{
    if (o->bind_device && o->device_index < 0)
        return c10d__fail(C10D_EINVAL, "%s: invalid device_index %d", what, o->device_index);
    pg->device_index = o->bind_device   ? o->device_index
                       : parent != NULL ? parent->device_index
                                        : -1;
    const c10d_nccl_opts *src = o->nccl != NULL  ? o->nccl
                                : parent != NULL ? &parent->nccl_opts
                                                 : NULL;
    C10D_CHECK(
        c10d__opts_read(&pg->nccl_opts, sizeof pg->nccl_opts, sizeof pg->nccl_opts, src, what));
    const char *net = pg->nccl_opts.net_name, *comm = pg->nccl_opts.comm_name;
    pg->nccl_opts.net_name = net != NULL ? strdup(net) : NULL;
    pg->nccl_opts.comm_name = comm != NULL ? strdup(comm) : NULL;
    if ((net != NULL && pg->nccl_opts.net_name == NULL) ||
        (comm != NULL && pg->nccl_opts.comm_name == NULL))
        return c10d__fail(C10D_ENOMEM, "%s: out of memory", what);
    return 0;
}

/* Creates, connects and registers a group: name, store and ranks are set. */
int c10d__pg_start(c10d_pg *pg, c10d_store *base, const struct c10d__backend_vtable *vts[],
                   c10d_pg *parent)
{
    pg->base_store = base;
    c10d__pg_store_retain(base);
    c10d__pg_end_at_shutdown();
    if (pg->rank < 0)
        return parent != NULL ? c10d__pg_split_out(parent) : 0;
    char prefix[C10D__PG_NAME_MAX + 2];
    snprintf(prefix, sizeof prefix, "%s/", pg->name);
    C10D_CHECK(c10d__pg_store_prefix(base, prefix, &pg->store));
    c10d__pg_set_backend_name(pg, vts);
    return c10d__pg_create_backends(pg, vts, parent);
}

/* A group whose creation failed part way: closed and dropped; the error
 * names the call and the group. */
int c10d__pg_creation_failed(c10d_pg *pg, int rc, const char *what)
{
    char why[1024];
    snprintf(why, sizeof why, "%s", c10d_last_error());
    char name[C10D__PG_NAME_MAX + 1];
    snprintf(name, sizeof name, "%s", pg->name);
    pg_close(pg, 0, "creation failed");
    c10d__pg_unref(pg);
    return c10d__fail(rc, "%s: group %s: %s", what, name, why);
}

int c10d__pg_create_with_backend(const struct c10d__backend_vtable *vt, c10d_store *store, int rank,
                                 int size, int64_t timeout_ms, c10d_pg **out)
{
    c10d__pg_registry_once();
    if (out == NULL || vt == NULL || size <= 0 || rank < 0 || rank >= size)
        return c10d__fail(C10D_EINVAL, "c10d__pg_create_with_backend: bad arguments");
    c10d_pg *pg;
    C10D_CHECK(c10d__pg_alloc("test", "test", rank, size, rank, NULL,
                              timeout_ms > 0 ? timeout_ms : TCP_DEFAULT_TIMEOUT_MS, &pg));
    const struct c10d__backend_vtable *vts[C10D__PG_NDEV] = {vt, NULL};
    int rc = c10d__pg_start(pg, store, vts, NULL);
    if (rc != 0) {
        c10d__pg_close_backends(pg, 1, C10D_EABORTED, "creation failed");
        c10d__pg_unref(pg);
        return rc;
    }
    *out = pg;
    return 0;
}

int c10d_pg_init(const c10d_pg_opts *opts, c10d_pg **out)
{
    c10d__pg_registry_once();
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
    c10d__torch_env_warn_once();
    /* As torch, which refuses to start with a debug level it does not know. */
    const char *debug = c10d__env_str(C10D_ENV_DEBUG);
    if (debug[0] != '\0' && strcasecmp(debug, "OFF") != 0 && strcasecmp(debug, "INFO") != 0 &&
        strcasecmp(debug, "DETAIL") != 0)
        return c10d__fail(C10D_EINVAL,
                          "c10d_pg_init: the value of C10D_DEBUG (or TORCH_DISTRIBUTED_DEBUG) "
                          "must be OFF, INFO, or DETAIL (got '%s')",
                          debug);
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

    c10d__pg_registry_lock();
    int busy = default_pg != NULL || default_initialising;
    if (!busy)
        default_initialising = 1;
    c10d__pg_registry_unlock();
    if (busy)
        return c10d__fail(C10D_EINVAL,
                          "c10d_pg_init: the default process group is already initialised "
                          "(destroy it first)");

    c10d_store *base = o.store;
    int rank = o.rank, size = o.world_size;
    int rc = 0, outlives = 1;
    if (base == NULL) {
        rc = c10d__pg_rendezvous(o.init_method != NULL ? o.init_method : "env://", o.rank,
                                 o.world_size, timeout, &base, &rank, &size, &outlives);
    } else {
        c10d__pg_store_retain(base);
    }
    /* Before any backend starts: a differing wire setting would hang it. */
    if (rc == 0)
        rc = c10d__pg_settings_check(base, rank, size, timeout);
    c10d_pg *pg = NULL;
    if (rc == 0)
        rc = c10d__pg_alloc("0", o.group_desc != NULL ? o.group_desc : "default_pg", rank, size,
                            rank, NULL, timeout, &pg);
    if (rc == 0)
        rc = c10d__pg_set_device_opts(pg, &o, NULL, "c10d_pg_init");
    if (rc == 0) {
        pg->is_default = 1;
        c10d__log_set_rank(rank);
        rc = c10d__pg_start(pg, base, vts, NULL);
    }
    /* The ranks met in the settings check and the backends' start; a world
     * barrier besides only where asked (torch's TORCH_DIST_INIT_BARRIER). */
    if (rc == 0 && c10d__env_bool(C10D_ENV_DIST_INIT_BARRIER))
        rc = c10d__pg_store_barrier(base, "0", size, timeout);
    c10d__pg_store_release(base); /* the group holds its own reference */
    c10d__pg_registry_lock();
    default_initialising = 0;
    if (rc == 0) {
        default_pg = pg;
        group_count = 1;
        store_outlives_job = outlives;
    }
    c10d__pg_registry_unlock();
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
    c10d__pg_fr_on_created(pg);
    *out = pg;
    return 0;
}

int c10d__pg_take_group_id(int *world_size)
{
    c10d__pg_registry_lock();
    int id = group_count++;
    *world_size = default_pg != NULL ? default_pg->size : 0;
    c10d__pg_registry_unlock();
    return id;
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

int c10d_pg_global_rank(const c10d_pg *pg, int group_rank)
{
    if (pg == NULL || pg->rank < 0)
        return c10d__fail(C10D_EINVAL, "c10d_pg_global_rank: %s",
                          pg == NULL ? "pg is NULL" : "this rank is not a member of the group");
    if (group_rank < 0 || group_rank >= pg->size)
        return c10d__fail(C10D_ENOTFOUND, "c10d_pg_global_rank: group %s has no rank %d (size %d)",
                          pg->name, group_rank, pg->size);
    return pg->global_ranks[group_rank];
}

int c10d_pg_group_rank(const c10d_pg *pg, int global_rank)
{
    if (pg == NULL || pg->rank < 0)
        return c10d__fail(C10D_EINVAL, "c10d_pg_group_rank: %s",
                          pg == NULL ? "pg is NULL" : "this rank is not a member of the group");
    for (int i = 0; i < pg->size; i++)
        if (pg->global_ranks[i] == global_rank)
            return i;
    return c10d__fail(C10D_ENOTFOUND, "c10d_pg_group_rank: global rank %d is not in group %s",
                      global_rank, pg->name);
}

int c10d_pg_ranks(const c10d_pg *pg, int *ranks, int cap)
{
    if (pg == NULL || pg->rank < 0)
        return c10d__fail(C10D_EINVAL, "c10d_pg_ranks: %s",
                          pg == NULL ? "pg is NULL" : "this rank is not a member of the group");
    if (cap < 0 || (ranks == NULL && cap > 0))
        return c10d__fail(C10D_EINVAL, "c10d_pg_ranks: invalid buffer (%p, %d entries)",
                          (void *)ranks, cap);
    for (int i = 0; i < pg->size && i < cap; i++)
        ranks[i] = pg->global_ranks[i];
    return pg->size;
}

const char *c10d_pg_name(const c10d_pg *pg)
{
    return pg != NULL ? pg->name : NULL;
}

const char *c10d_pg_desc(const c10d_pg *pg)
{
    return pg != NULL ? pg->desc : NULL;
}

const char *c10d_pg_backend(const c10d_pg *pg)
{
    return pg != NULL ? pg->backend_name : NULL;
}

uint64_t c10d_pg_seq(c10d_pg *pg)
{
    if (pg == NULL)
        return 0;
    uv_mutex_lock(&pg->mutex);
    uint64_t seq = pg->coll_seq;
    uv_mutex_unlock(&pg->mutex);
    return seq;
}

uint64_t c10d_pg_p2p_seq(c10d_pg *pg)
{
    if (pg == NULL)
        return 0;
    uv_mutex_lock(&pg->mutex);
    uint64_t seq = pg->p2p_seq;
    uv_mutex_unlock(&pg->mutex);
    return seq;
}

int c10d_is_initialized(void)
{
    c10d__pg_registry_once();
    c10d__pg_registry_lock();
    int up = default_pg != NULL;
    c10d__pg_registry_unlock();
    return up;
}

/* ------------------------------------------------------------------- end */

/* The default group takes every other group with it, newest first (torch:
 * reverse name order); their handles stay valid until destroyed. */
static void close_all_groups(c10d_pg *world, int graceful, const char *reason)
{
    for (;;) {
        c10d__pg_registry_lock();
        c10d_pg *victim = NULL;
        for (c10d_pg *g = c10d__pg_registry_head(); g != NULL; g = g->next_group) {
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
        c10d__pg_registry_unlock();
        if (victim == NULL)
            return;
        pg_close(victim, graceful, reason);
        c10d__pg_unref(victim);
    }
}

static void forget_default(c10d_pg *pg)
{
    c10d__pg_registry_lock();
    if (default_pg == pg) {
        default_pg = NULL;
        group_count = 0;
    }
    c10d__pg_registry_unlock();
}

void c10d__pg_shrunk_default(c10d_pg *old, c10d_pg *pg)
{
    c10d__pg_registry_lock();
    int was = default_pg == old;
    if (was) {
        default_pg = pg;
        pg->is_default = 1;
        old->is_default = 0;
        /* The survivors are the world now: global ranks are its ranks. */
        for (int r = 0; r < pg->size; r++)
            pg->global_ranks[r] = r;
        pg->global_rank = pg->rank;
    }
    c10d__pg_registry_unlock();
    if (!was)
        return;
    C10D_INFO("pg", "default process group is now %s (%d ranks); the groups made before are ended",
              pg->name, pg->size);
    for (;;) {
        c10d__pg_registry_lock();
        c10d_pg *victim = NULL;
        for (c10d_pg *g = c10d__pg_registry_head(); g != NULL && victim == NULL;
             g = g->next_group) {
            if (g == pg)
                continue;
            uv_mutex_lock(&g->mutex);
            if (g->ended_by == NULL && !g->inherited && g->state == C10D_PG_LIVE) {
                g->ended_by = ended_by_shrink;
                victim = g;
            }
            uv_mutex_unlock(&g->mutex);
        }
        if (victim != NULL)
            c10d__pg_ref(victim);
        c10d__pg_registry_unlock();
        if (victim == NULL)
            return;
        pg_close(victim, 0, ended_by_shrink);
        c10d__pg_unref(victim);
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
    /* Waited for, briefly, where the store outlives the job: a program that
     * exits right after destroy would otherwise take the sweep's requests
     * with it (pg_store.c). */
    c10d__pg_registry_lock();
    int64_t flush_ms = store_outlives_job ? SWEEP_FLUSH_MS : 0;
    c10d__pg_registry_unlock();
    if (flush_ms > pg->timeout_ms)
        flush_ms = pg->timeout_ms;
    if (ended_by == NULL && healthy)
        c10d__pg_sweep_flush(c10d__pg_sweep_keys(pg), flush_ms);
    if (pg->is_default)
        forget_default(pg);
    char name[64];
    snprintf(name, sizeof name, "%s", pg->name);
    c10d__pg_unref(pg);
    /* The handle is freed all the same: nothing else could free it. */
    if (ended_by != NULL && ended_by != ended_by_shrink)
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
