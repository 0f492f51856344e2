/* The group layer's side of the flight recorder (docs/debugging.md): what an
 * op's entry says, when a process dumps, and how one rank's dump makes every
 * rank dump.
 *
 * The signal between ranks is one key of the default group's store,
 * "c10d/fr/dump", set by the first rank that dumps because an op failed.
 * Every rank looks for it every C10D_TRACE_SIGNAL_CHECK_MS from an
 * unreferenced loop timer with a store CHECK (never a WAIT: a WAIT would
 * hold a store connection's pipeline and has a deadline of its own), so
 * watching costs one small request per interval, never blocks the loop and
 * never keeps a process alive. A rank that finds the key dumps once and
 * stops looking: the key stays set. */
#include "pg.h"

#include "engine/env.h"
#include "engine/error.h"
#include "engine/flight_recorder.h"
#include "engine/log.h"
#include "engine/loop.h"
#include "store_server/client/store.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char signal_key[] = "c10d/fr/dump";

/* A burst of failures (a timeout fails every later op of the group, and
 * often other groups) makes one dump: the next automatic one comes only this
 * long after the last. */
#define FR_BURST_MS 60000

/* ------------------------------------------------------------- recording */

static const char *op_name(enum c10d__op_kind kind)
{
    static const char *const names[C10D_OP_KIND_COUNT] = {
        [C10D_OP_BROADCAST] = "broadcast",
        [C10D_OP_ALL_REDUCE] = "all_reduce",
        [C10D_OP_REDUCE] = "reduce",
        [C10D_OP_ALL_GATHER] = "all_gather",
        [C10D_OP_GATHER] = "gather",
        [C10D_OP_SCATTER] = "scatter",
        [C10D_OP_REDUCE_SCATTER] = "reduce_scatter",
        [C10D_OP_ALL_TO_ALL] = "all_to_all",
        [C10D_OP_BARRIER] = "barrier",
        [C10D_OP_SEND] = "send",
        [C10D_OP_RECV] = "recv",
    };
    return (unsigned)kind < C10D_OP_KIND_COUNT && names[kind] != NULL ? names[kind] : "unknown";
}

static void watch_arm(c10d_pg *pg);

void c10d__pg_fr_on_created(c10d_pg *pg)
{
    if (!c10d__fr_enabled())
        return;
    /* Armed now, not at the first op: a job that starts with
     * monitored_barrier (not recorded) or uses only subgroups must still
     * hear another rank's request to dump. */
    uv_mutex_lock(&pg->mutex);
    if (!pg->fr_seen) {
        pg->fr_seen = 1;
        c10d__fr_register_pg(pg->name, pg->desc, pg->global_ranks, pg->size, pg->global_rank);
        watch_arm(pg);
    }
    uv_mutex_unlock(&pg->mutex);
}

void c10d__pg_fr_record(c10d_pg *pg, struct c10d__pg_op *head, const char *label, size_t in,
                        size_t out, int64_t timeout_ms, uint64_t now_ns)
{
    if (!c10d__fr_enabled())
        return;
    const struct c10d__op *op = &head->op;
    int is_p2p = op->kind == C10D_OP_SEND || op->kind == C10D_OP_RECV;
    if (label != NULL)
        is_p2p = strcmp(label, "BATCH_P2P") == 0;
    /* A group's first recorded op (or its creation, for the default group):
     * its members for pg_config, and the store watch. */
    if (!pg->fr_seen) {
        pg->fr_seen = 1;
        c10d__fr_register_pg(pg->name, pg->desc, pg->global_ranks, pg->size, pg->global_rank);
        watch_arm(pg);
    }
    const struct c10d__backend_vtable *vt = pg->backends[head->dev].vt;
    struct c10d__fr_op r = {
        .names = pg->fr_names,
        .pg_name = pg->name,
        .pg_desc = pg->desc,
        .backend = vt != NULL ? vt->name : "c10d", /* a literal: kept by pointer */
        .op = label == NULL                     ? op_name(op->kind)
              : strcmp(label, "BATCH_P2P") == 0 ? "batch_isend_irecv"
                                                : "coalesced",
        .coll_seq = pg->coll_seq,
        .p2p_seq = pg->p2p_seq,
        .op_id = pg->coll_seq + pg->p2p_seq,
        .is_p2p = is_p2p,
        .in_numel = in,
        .out_numel = out,
        .in_tensors = 1,
        .out_tensors = 1,
        .dtype = (int)op->dtype,
        .root = label == NULL ? op->root : -1,
        .peer = label == NULL ? op->peer : -1,
        .timeout_ms = timeout_ms,
        .started = 1, /* hand_over gives it to its backend next */
        .now_ns = now_ns,
    };
    /* The list forms hold one buffer per rank, as torch's tensor lists do. */
    if (label == NULL && op->kind != C10D_OP_ALL_TO_ALL) {
        if (op->recvs != NULL) {
            r.out_tensors = pg->size;
            r.out_numel = op->count;
        }
        if (op->sends != NULL) {
            r.in_tensors = pg->size;
            r.in_numel = op->count;
        }
    }
    if (op->kind == C10D_OP_BARRIER && label == NULL)
        r.in_tensors = r.out_tensors = 0;
    head->fr_id = c10d__fr_record(&r);
}

/* ------------------------------------------------------- the store watch */

/* Guarded by watch_mutex: the default group's store (one reference) and
 * the group it belongs to (compared, never dereferenced). */
static uv_once_t watch_once = UV_ONCE_INIT;
static uv_mutex_t watch_mutex;
static c10d_store *watch_store;
static const c10d_pg *watch_pg;
static atomic_int watch_armed; /* a timer runs, or its start is posted */
static atomic_int watch_done;  /* the signal was seen: stop looking */
static atomic_llong last_auto_ms;

/* Loop thread only. */
static uv_timer_t watch_timer;
static int watch_timer_open;
static int watch_busy; /* a CHECK is in flight */
static struct c10d__shutdown_hook watch_hook;
static int watch_hook_registered; /* the hook stays registered while the timer stops and starts */

/* A forked child starts with no engine: the parent's timer and store are
 * not its own (the store is left to the parent, as the group's is). */
static void watch_fork_prepare(void)
{
    uv_mutex_lock(&watch_mutex);
}

static void watch_fork_parent(void)
{
    uv_mutex_unlock(&watch_mutex);
}

static void watch_fork_child(void)
{
    /* Taken by the forking thread in prepare, the child's only thread. */
    uv_mutex_unlock(&watch_mutex);
    watch_store = NULL;
    watch_pg = NULL;
    watch_timer_open = 0;
    watch_busy = 0;
    watch_hook_registered = 0;
    atomic_store(&watch_armed, 0);
    atomic_store(&watch_done, 0);
    atomic_store(&last_auto_ms, 0);
}

static void watch_init(void)
{
    uv_mutex_init(&watch_mutex);
    pthread_atfork(watch_fork_prepare, watch_fork_parent, watch_fork_child);
}

void c10d__pg_fr_init(void)
{
    uv_once(&watch_once, watch_init);
}

static c10d_store *watch_store_get(void)
{
    uv_once(&watch_once, watch_init);
    uv_mutex_lock(&watch_mutex);
    c10d_store *s = watch_store;
    if (s != NULL)
        c10d_store_retain(s);
    uv_mutex_unlock(&watch_mutex);
    return s;
}

/* The first automatic dump of a burst claims it; 1 if this caller did. */
static int claim_auto_dump(void)
{
    long long now = (long long)c10d__now_ms();
    long long last = atomic_load(&last_auto_ms);
    do {
        if (last != 0 && now - last < FR_BURST_MS)
            return 0;
    } while (!atomic_compare_exchange_weak(&last_auto_ms, &last, now));
    return 1;
}

static void timer_closed(uv_handle_t *h)
{
    (void)h;
    watch_timer_open = 0;
}

static void watch_stop(void)
{
    if (watch_timer_open && !uv_is_closing((uv_handle_t *)&watch_timer))
        uv_close((uv_handle_t *)&watch_timer, timer_closed);
    atomic_store(&watch_armed, 0);
}

static void watch_on_shutdown(struct c10d__shutdown_hook *h)
{
    (void)h;
    watch_hook_registered = 0; /* the engine popped it */
    watch_stop();
}

static void checked(c10d_work *w, int status, void *arg)
{
    (void)status;
    const c10d_store_result *r = c10d_store_work_result(w);
    c10d_store *store = arg;
    watch_busy = 0;
    if (r->status == 0 && r->value == 1 && !atomic_exchange(&watch_done, 1)) {
        if (claim_auto_dump()) {
            int rc = c10d__fr_dump_async("another rank asked for a dump (store key c10d/fr/dump)");
            if (rc != 0)
                C10D_WARN("fr", "flight recorder: no dump: %s", c10d_last_error());
        }
        watch_stop();
    } else if (r->status != 0) {
        C10D_DEBUG("fr", "flight recorder: looking for %s in the store failed: %s", signal_key,
                   r->message);
    }
    c10d_store_release(store);
}

static void watch_tick(uv_timer_t *t)
{
    (void)t;
    if (watch_busy || c10d__engine_stop_begun())
        return;
    c10d_store *store = watch_store_get();
    if (store == NULL || atomic_load(&watch_done)) {
        /* The default group is gone: its next first op arms us again. */
        if (store != NULL)
            c10d_store_release(store);
        watch_stop();
        return;
    }
    const char *keys[1] = {signal_key};
    watch_busy = 1;
    c10d_store_request q = {
        .struct_size = sizeof q, .op = C10D_STORE_OP_CHECK, .keys = keys, .nkeys = 1};
    if (c10d__store_call(store, &q, checked, store) != 0) {
        watch_busy = 0;
        c10d_store_release(store);
    }
}

static void watch_start(void *arg)
{
    (void)arg;
    int64_t every = c10d__env_int(C10D_ENV_TRACE_SIGNAL_CHECK_MS);
    if (watch_timer_open || every <= 0 || c10d__engine_stop_begun()) {
        if (!watch_timer_open)
            atomic_store(&watch_armed, 0);
        return;
    }
    uv_timer_init(c10d__engine_loop(), &watch_timer);
    uv_unref((uv_handle_t *)&watch_timer);
    watch_timer_open = 1;
    watch_busy = 0;
    uv_timer_start(&watch_timer, watch_tick, (uint64_t)every, (uint64_t)every);
    /* Registered once: pushing the same hook twice would loop the engine's
     * list and lose the hooks registered before it. */
    if (!watch_hook_registered) {
        watch_hook_registered = 1;
        watch_hook.fn = watch_on_shutdown;
        c10d__engine_on_shutdown(&watch_hook);
    }
}

/* Under pg->mutex (a first op): the default group's store becomes the one
 * watched, and the timer is started on the loop if it is not running. */
static void watch_arm(c10d_pg *pg)
{
    if (!pg->is_default || pg->base_store == NULL || pg->inherited || !c10d__fr_dumps_files() ||
        c10d__env_int(C10D_ENV_TRACE_SIGNAL_CHECK_MS) <= 0)
        return;
    uv_once(&watch_once, watch_init);
    uv_mutex_lock(&watch_mutex);
    c10d_store *old = watch_pg != pg ? watch_store : NULL;
    if (watch_pg != pg) {
        c10d_store_retain(pg->base_store);
        watch_store = pg->base_store;
        watch_pg = pg;
        atomic_store(&watch_done, 0);
    }
    uv_mutex_unlock(&watch_mutex);
    if (old != NULL)
        c10d_store_release(old);
    if (!atomic_exchange(&watch_armed, 1) && c10d__engine_call(watch_start, NULL) != 0)
        atomic_store(&watch_armed, 0);
}

void c10d__pg_fr_forget(c10d_pg *pg)
{
    uv_once(&watch_once, watch_init);
    uv_mutex_lock(&watch_mutex);
    c10d_store *s = NULL;
    if (watch_pg == pg) {
        s = watch_store;
        watch_store = NULL;
        watch_pg = NULL;
    }
    uv_mutex_unlock(&watch_mutex);
    if (s != NULL)
        c10d_store_release(s);
}

/* --------------------------------------------------------- dump on failure */

static void signal_set(c10d_work *w, int status, void *arg)
{
    (void)status;
    const c10d_store_result *r = c10d_store_work_result(w);
    /* Cut short by this process's own shutdown (a program that ends right
     * after a failure): its ranks fail their own ops and dump for those;
     * nothing for the user to act on. */
    if (r->status == C10D_EABORTED)
        C10D_INFO("fr",
                  "flight recorder: c10d_shutdown came before the other ranks were asked "
                  "to dump: %s",
                  r->message);
    else if (r->status != 0)
        C10D_WARN("fr", "flight recorder: could not ask the other ranks to dump: %s", r->message);
    c10d_store_release(arg);
}

void c10d__pg_fr_on_failure(c10d_pg *pg, int status, const char *message)
{
    if (!c10d__fr_enabled() || !c10d__env_bool(C10D_ENV_TRACE_DUMP_ON_FAILURE))
        return;
    /* Without a prefix no file is written, here or (asked) on the other ranks. */
    if (!c10d__fr_dumps_files()) {
        static atomic_int told;
        if (!atomic_exchange(&told, 1))
            C10D_INFO("fr",
                      "flight recorder: an op of process group %s failed; no dump written "
                      "(set C10D_TRACE_FILE_PREFIX to have one)",
                      pg->name);
        return;
    }
    if (!claim_auto_dump())
        return;
    char reason[768];
    snprintf(reason, sizeof reason, "rank %d: an op of process group %s failed (%s): %s",
             pg->global_rank, pg->name, c10d_status_name(status),
             message != NULL ? message : c10d_strerror(status));
    if (c10d__fr_dump_async(reason) != 0)
        C10D_WARN("fr", "flight recorder: no dump: %s", c10d_last_error());
    /* This rank needs no signal of its own, and must not dump twice. */
    atomic_store(&watch_done, 1);
    c10d_store *store = watch_store_get();
    if (store == NULL)
        return;
    char value[800];
    int n = snprintf(value, sizeof value, "%d %s", pg->global_rank, reason);
    size_t len = n < 0 ? 0 : (size_t)n < sizeof value ? (size_t)n : sizeof value - 1;
    c10d_store_request q = {.struct_size = sizeof q,
                            .op = C10D_STORE_OP_SET,
                            .key = signal_key,
                            .value = value,
                            .len = len};
    if (c10d__store_call(store, &q, signal_set, store) != 0) {
        C10D_WARN("fr", "flight recorder: could not ask the other ranks to dump: %s",
                  c10d_last_error());
        c10d_store_release(store);
    }
}

/* ----------------------------------------------------------- public call */

int c10d_flight_recorder_dump(const char *path)
{
    if (!c10d__fr_enabled())
        return c10d__fail(C10D_EUNSUPPORTED,
                          "c10d_flight_recorder_dump: the flight recorder is off "
                          "(C10D_TRACE_BUFFER_SIZE=0)");
    return c10d__fr_dump(path, "on request (c10d_flight_recorder_dump)");
}

int c10d_flight_recorder_dump_json(int only_active, char **out)
{
    if (out == NULL)
        return c10d__fail(C10D_EINVAL, "c10d_flight_recorder_dump_json: out is NULL");
    *out = NULL;
    if (!c10d__fr_enabled())
        return c10d__fail(C10D_EUNSUPPORTED,
                          "c10d_flight_recorder_dump_json: the flight recorder is off "
                          "(C10D_TRACE_BUFFER_SIZE=0)");
    return c10d__fr_dump_json("on request (c10d_flight_recorder_dump_json)", only_active, out);
}

int c10d_flight_recorder_reset(void)
{
    c10d__fr_clear();
    return 0;
}
