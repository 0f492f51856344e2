/* Op dispatch: every public collective and P2P call is checked here on the
 * caller's thread, then numbered, given its work and handed to the backend
 * (its `submit`). Numbering and hand-over happen under the group's mutex, so
 * backends see ops in sequence order whatever thread issued them. */
#include "pg.h"

#include "api/attempt.h"
#include "engine/error.h"
#include "engine/flight_recorder.h"
#include "engine/kernels/reduce.h"
#include "engine/log.h"
#include "engine/loop.h"
#include "engine/work.h"
#include "gpu/gpu_api.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------------ op records */

static const char *first_error_locked(const c10d_pg *pg)
{
    return pg->first_error != NULL ? pg->first_error : c10d_strerror(pg->first_status);
}

static int64_t wall_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* Hands the op (list) to its backend: 0, or the backend's refusal, with the
 * work failed either way it was not taken. The record lives until the work
 * completed (op_final). Failing the work here may hold pg->mutex: its
 * callbacks (op_done takes that mutex) then run later on the loop; they could
 * run inline only on the loop thread once posting closed, and by then the
 * shutdown hook has ended every group, so no op gets this far. */
static int hand_over(c10d_pg *pg, struct c10d__pg_op *po)
{
    struct c10d__pg_backend *b = &pg->backends[po->dev];
    int rc = b->state != NULL
                 ? b->vt->submit(b->state, &po->op)
                 : c10d__fail(C10D_EABORTED, "%s %s: process group %s is closed", pg->backend_name,
                              c10d__op_kind_name(po->op.kind), pg->name);
    if (rc != 0) {
        c10d__fr_refused(po->fr_id); /* recorded as started (c10d__pg_fr_record) */
        c10d__work_complete(po->op.work, rc, "%s", c10d_last_error());
        return rc;
    }
    /* Only a completion hook reads these: no clock reads per op without one. */
    if (atomic_load_explicit(&pg->has_completion_hook, memory_order_relaxed)) {
        po->started_ns = c10d__now_ns();
        po->started_wall_us = wall_us();
    }
    return 0;
}

/* The work's last callback: by now every callback registered before
 * completion (the backend's own included) has run, so the record can go. */
static void op_final(c10d_work *w, int status, void *arg)
{
    (void)status;
    struct c10d__pg_op *po = arg;
    c10d_pg *pg = po->pg;
    if (!po->work_handed_out)
        c10d_work_release(w);
    c10d__pg_op_free(po);
    c10d__pg_unref(pg);
}

static void call_completion_hook(c10d_pg_completion_hook hook, void *arg, c10d_work *w, int status,
                                 const struct c10d__pg_op *po)
{
    c10d_work_info info = {
        .op_type = po->next_in_list != NULL ? "COALESCED" : c10d__op_kind_name(po->op.kind),
        .seq = po->op.seq,
        .status = status,
        .time_started_us = po->started_wall_us,
        .time_finished_us = wall_us(),
    };
    /* Never handed over (refused at submit), or handed over before the hook
     * was registered: it started, as far as anyone timed it, as it finished. */
    if (po->started_ns == 0)
        info.time_started_us = info.time_finished_us;
    float device_ms;
    if (c10d_work_duration_ms(w, &device_ms) == 0)
        info.active_duration_ms = device_ms;
    else if (po->started_ns != 0)
        info.active_duration_ms = (double)(c10d__now_ns() - po->started_ns) / 1e6;
    hook(&info, arg);
}

struct deferred_hook {
    c10d_pg_completion_hook hook;
    void *arg;
    c10d_work_info info;
};

static void deferred_hook_fn(void *arg)
{
    struct deferred_hook *d = arg;
    d->hook(&d->info, d->arg);
    free(d);
}

/* A success completed on the waiting thread (its op ran there, docs/engine.md):
 * the user's hook still runs on the loop, as every user callback does. */
static void defer_completion_hook(c10d_pg_completion_hook hook, void *arg, c10d_work *w, int status,
                                  const struct c10d__pg_op *po)
{
    struct deferred_hook *d = calloc(1, sizeof *d);
    if (d == NULL)
        return; /* out of memory: this op goes unreported */
    d->hook = hook;
    d->arg = arg;
    d->info = (c10d_work_info){
        .op_type = po->next_in_list != NULL ? "COALESCED" : c10d__op_kind_name(po->op.kind),
        .seq = po->op.seq,
        .status = status,
        .time_started_us = po->started_ns != 0 ? po->started_wall_us : wall_us(),
        .time_finished_us = wall_us(),
        .active_duration_ms =
            po->started_ns != 0 ? (double)(c10d__now_ns() - po->started_ns) / 1e6 : 0,
    };
    (void)w;
    if (c10d__engine_call(deferred_hook_fn, d) != 0)
        free(d);
}

/* Runs anywhere on success (the bookkeeping below takes only the group's
 * mutex, which no caller holds while waiting); failures run on the loop. */
static void op_done(c10d_work *w, int status, void *arg)
{
    struct c10d__pg_op *po = arg;
    c10d_pg *pg = po->pg;
    if (status < 0 && !po->internal) {
        const struct c10d__pg_backend *b = &pg->backends[po->dev];
        int blamed = -1;
        if (b->state != NULL && b->vt->failed_ranks != NULL &&
            b->vt->failed_ranks(b->state, &blamed, 1) > 0)
            c10d__work_set_failed_rank(w, blamed);
        c10d__pg_poison(pg, status, c10d_work_message(w));
        c10d__pg_fr_on_failure(pg, status, c10d_work_message(w));
    }
    /* On the loop, this can run while the submitter is still in
     * c10d__pg_post_locked with the work (the loop took the op at once, or a
     * shutdown's sweep failed it): wait until it let go of the group's mutex,
     * before op_final frees the record. A waiting thread completes an op
     * only after its submitter returned it. */
    if (c10d__on_loop_thread()) {
        uv_mutex_lock(&pg->mutex);
        uv_mutex_unlock(&pg->mutex);
    }
    c10d__pg_op_ended(pg);
    /* Set once, before has_completion_hook: no lock needed to read it. */
    c10d_pg_completion_hook hook = NULL;
    void *hook_arg = NULL;
    if (!po->internal && atomic_load_explicit(&pg->has_completion_hook, memory_order_acquire)) {
        hook = pg->completion_hook;
        hook_arg = pg->completion_arg;
    }
    if (hook != NULL && c10d__on_loop_thread())
        call_completion_hook(hook, hook_arg, w, status, po);
    else if (hook != NULL)
        defer_completion_hook(hook, hook_arg, w, status, po);
}

void c10d__pg_op_ended(c10d_pg *pg)
{
    /* A waiter counts itself in idle_waiters, then checks `pending` under the
     * mutex before it sleeps on idle_cond: one of the two sees the other,
     * and taking the mutex to broadcast cannot miss the sleeper. */
    if (atomic_fetch_sub(&pg->pending, 1) == 1 && atomic_load(&pg->idle_waiters) > 0) {
        uv_mutex_lock(&pg->mutex);
        uv_cond_broadcast(&pg->idle_cond);
        uv_mutex_unlock(&pg->mutex);
    }
}

void c10d__pg_poison(c10d_pg *pg, int status, const char *message)
{
    uv_mutex_lock(&pg->mutex);
    int deferred = pg->abort_deferred;
    if (pg->first_status == 0) {
        pg->first_status = status;
        free(pg->first_error);
        pg->first_error = strdup(message != NULL && *message ? message : c10d_strerror(status));
        C10D_WARN("pg", "process group %s is now failed: %s", pg->name, first_error_locked(pg));
        c10d__hosted_store_skip_linger();
    }
    uv_mutex_unlock(&pg->mutex);
    if (pg->aborted_on_loop || deferred)
        return;
    /* A timed-out op's buffers must no longer be written: the backend drops
     * everything pending and fails fast from now on (gloo closes every pair). */
    for (int d = 0; d < C10D__PG_NDEV; d++)
        if (pg->backends[d].state != NULL)
            pg->backends[d].vt->abort(pg->backends[d].state, status,
                                      message != NULL ? message : c10d_strerror(status), NULL,
                                      NULL);
}

struct poison_call {
    c10d_pg *pg;
    int status;
    char message[1024];
};

static void poison_on_loop(void *arg)
{
    struct poison_call *p = arg;
    c10d__pg_poison(p->pg, p->status, p->message);
    c10d__pg_unref(p->pg);
    free(p);
}

/* The caller's thread: the group fails now for later calls; its backends
 * are aborted on the loop, where they live. */
static void poison_from_caller(c10d_pg *pg, int status, const char *message)
{
    uv_mutex_lock(&pg->mutex);
    if (pg->first_status == 0) {
        pg->first_status = status;
        free(pg->first_error);
        pg->first_error = strdup(message);
        c10d__hosted_store_skip_linger();
    }
    uv_mutex_unlock(&pg->mutex);
    struct poison_call *p = calloc(1, sizeof *p);
    if (p == NULL)
        return; /* later calls fail anyway; the backends stay up until destroy */
    c10d__pg_ref(pg);
    p->pg = pg;
    p->status = status;
    snprintf(p->message, sizeof p->message, "%s", message);
    if (c10d__engine_call(poison_on_loop, p) != 0) {
        c10d__pg_unref(pg);
        free(p);
    }
}

/* ------------------------------------------------------------ submission */

/* A backend that failed by itself (a lost peer, a transport error) before
 * any op of the group failed: the group fails now, so that this call and
 * every later one are refused at once instead of failing at their wait. */
static int backend_failed_locked(c10d_pg *pg)
{
    for (int d = 0; d < C10D__PG_NDEV; d++) {
        const struct c10d__pg_backend *b = &pg->backends[d];
        if (b->state == NULL || b->vt->failure == NULL)
            continue;
        char msg[768];
        int st = b->vt->failure(b->state, msg, sizeof msg);
        if (st < 0) {
            pg->first_status = st;
            free(pg->first_error);
            pg->first_error = strdup(msg);
            c10d__hosted_store_skip_linger();
            return st;
        }
    }
    return 0;
}

int c10d__pg_usable_locked(c10d_pg *pg, const char *opname)
{
    if (pg->ended_by != NULL)
        return c10d__fail(C10D_EREVOKED, "%s %s: process group %s %s", pg->backend_name, opname,
                          pg->name, pg->ended_by);
    if (pg->state != C10D_PG_LIVE)
        return c10d__fail(C10D_EREVOKED, "%s %s: process group %s was destroyed", pg->backend_name,
                          opname, pg->name);
    if (pg->first_status != 0 || backend_failed_locked(pg) != 0)
        return c10d__fail(C10D_EREVOKED, "%s %s: process group %s failed earlier: %s",
                          pg->backend_name, opname, pg->name, first_error_locked(pg));
    return 0;
}

int c10d__pg_cause_locked(c10d_pg *pg)
{
    if (pg->ended_by != NULL)
        return c10d__fail(C10D_EABORTED, "process group %s %s", pg->name, pg->ended_by);
    if (pg->state != C10D_PG_LIVE)
        return c10d__fail(C10D_EREVOKED, "process group %s was destroyed", pg->name);
    if (pg->first_status != 0 || backend_failed_locked(pg) != 0)
        return c10d__fail(pg->first_status, "%s group: process group %s failed: %s",
                          pg->backend_name, pg->name, first_error_locked(pg));
    return 0;
}

static int is_p2p(enum c10d__op_kind k)
{
    return k == C10D_OP_SEND || k == C10D_OP_RECV;
}

int c10d__pg_post_locked(c10d_pg *pg, struct c10d__pg_op *head, const char *optype, uint64_t seq,
                         size_t in, size_t out, const c10d_op_opts *opts, c10d_work **work,
                         int *handed_over)
{
    *handed_over = 0;
    int64_t timeout = opts != NULL && opts->timeout_ms > 0 ? opts->timeout_ms : pg->timeout_ms;
    struct c10d__pg_backend *b = &pg->backends[head->dev];
    /* A device backend that times ops from their start on the device keeps
     * the deadline itself. */
    int own_deadline = b->vt != NULL && b->vt->timeout_from_start;
    c10d_work *w;
    /* Armed once handed over: a backend may park the op for its waiter. */
    struct c10d__pg_op_name args = {optype, seq, in, out, timeout};
    struct c10d__work_hooks hooks = {op_done, op_final, head};
    /* One read of the coarse clock for the op's record and its work's
     * deadline (a fifth of the precise one's cost, two of them per op were
     * a tenth of a small op's time); the deadline counts from the latest
     * time it may stand for, so that it never fires early. */
    uint64_t now = c10d__now_coarse_ns();
    struct c10d__work_name name = {.make = c10d__pg_make_op_name,
                                   .args = &args,
                                   .args_len = sizeof args,
                                   .created_ns = now + c10d__coarse_lag_ns(),
                                   .hooks = &hooks};
    name.prefix = c10d__pg_op_name_prefix(pg, &name.prefix_len);
    C10D_CHECK(c10d__work_create_named(&w, &name, own_deadline ? 0 : timeout));
    for (struct c10d__pg_op *po = head; po != NULL; po = po->next_in_list) {
        po->op.seq = seq;
        po->op.timeout_ms = timeout;
        po->op.work = w;
        po->op.next = po->next_in_list != NULL ? &po->next_in_list->op : NULL;
    }
    c10d__pg_fr_record(pg, head, head->next_in_list != NULL ? optype : NULL, in, out, timeout, now);
    if (head->fr_id != 0)
        c10d__work_set_fr_id(w, head->fr_id);
    head->work_handed_out = 0;
    pg->pending++;
    pg->refs++;
    *handed_over = 1;
    /* Here, on the caller's thread and under the group's lock: a device
     * backend orders the op after what the caller enqueued before; a host
     * backend posts it to the loop. A refusal (c10d_shutdown closed posting,
     * say) fails the work, and op_done cleans up as for any op; the user's
     * callback is not registered yet, so this failed call never calls back. */
    int rc = hand_over(pg, head);
    if (rc != 0)
        return rc;
    c10d__work_arm(w);
    /* Registered after the post: a work that already completed still calls
     * back (later, on the loop). Only during shutdown can this fail; the op
     * is then aborted and the call reports it without a callback. */
    if (opts != NULL && opts->cb != NULL) {
        rc = c10d_work_on_complete(w, opts->cb, opts->cb_arg);
        if (rc != 0)
            return rc;
    }
    if (work != NULL) {
        /* The creator's reference, the group's (op_final's) until now. */
        head->work_handed_out = 1;
        *work = w;
    } else {
        /* Nobody can wait for it: a parked op goes to the loop at once. */
        c10d__work_unpark(w);
    }
    /* Else the creator's reference stays the group's, dropped in op_final. */
    return 0;
}

int c10d__pg_submit(c10d_pg *pg, const char *opname, struct c10d__pg_op *po,
                    const c10d_op_opts *opts, c10d_work **work)
{
    uv_mutex_lock(&pg->mutex);
    int rc = c10d__pg_usable_locked(pg, opname);
    if (rc == 0 && pg->coalescing) {
        if (is_p2p(po->op.kind) || po->op.kind == C10D_OP_BARRIER)
            rc = c10d__fail(C10D_EINVAL,
                            "%s %s: cannot be coalesced (between c10d_coalesce_begin and "
                            "c10d_coalesce_end only collectives; use c10d_batch_isend_irecv for "
                            "P2P)",
                            pg->backend_name, opname);
        else if (opts != NULL && opts->cb != NULL)
            rc = c10d__fail(C10D_EINVAL,
                            "%s %s: a coalesced op has no callback of its own (pass it to "
                            "c10d_coalesce_end)",
                            pg->backend_name, opname);
        else if (pg->coal_head != NULL && pg->coal_head->dev != po->dev)
            rc = c10d__fail(C10D_EINVAL, "%s %s: coalesced ops must all use the same device type",
                            pg->backend_name, opname);
        if (rc == 0) {
            if (pg->coal_tail != NULL)
                pg->coal_tail->next_in_list = po;
            else
                pg->coal_head = po;
            pg->coal_tail = po;
            pg->coal_n++;
            uv_mutex_unlock(&pg->mutex);
            if (work != NULL)
                *work = NULL;
            return 0;
        }
    }
    if (rc != 0) {
        uv_mutex_unlock(&pg->mutex);
        c10d__pg_op_free(po);
        return rc;
    }
    uint64_t *counter = is_p2p(po->op.kind) ? &pg->p2p_seq : &pg->coll_seq;
    uint64_t seq = ++*counter;
    size_t in, out;
    c10d__op_numel(&po->op, pg->size, &in, &out);
    int handed;
    rc = c10d__pg_post_locked(pg, po, c10d__op_kind_name(po->op.kind), seq, in, out, opts, work,
                              &handed);
    if (rc != 0 && !handed) {
        /* Nothing reached the loop: the number was never seen by anyone. */
        --*counter;
        uv_mutex_unlock(&pg->mutex);
        c10d__pg_op_free(po);
        return rc;
    }
    if (rc != 0)
        --*counter;
    uv_mutex_unlock(&pg->mutex);
    return rc;
}

void c10d__pg_submit_internal(c10d_pg *pg, struct c10d__pg_op *po)
{
    po->internal = 1;
    uv_mutex_lock(&pg->mutex);
    pg->pending++;
    pg->refs++;
    uv_mutex_unlock(&pg->mutex);
    if (c10d__work_on_complete_around(po->op.work, op_done, op_final, po, 0) != 0) {
        /* Cannot call back: complete it so its owner sees the failure. */
        c10d__work_complete(po->op.work, C10D_ENOMEM, "out of memory");
        c10d__pg_op_ended(pg);
        c10d_work_release(po->op.work);
        c10d__pg_op_free(po);
        c10d__pg_unref(pg);
        return;
    }
    uv_mutex_lock(&pg->mutex);
    int status = pg->first_status;
    char *why = status != 0 ? strdup(first_error_locked(pg)) : NULL;
    uv_mutex_unlock(&pg->mutex);
    if (status != 0)
        c10d__work_complete(po->op.work, status, "%s %s: process group %s failed earlier: %s",
                            pg->backend_name, c10d__op_kind_name(po->op.kind), pg->name,
                            why != NULL ? why : "");
    else
        hand_over(pg, po);
    free(why);
}

/* ---------------------------------------------------------- public calls */

int c10d__pg_device(const c10d_pg *pg, const char *opname, const c10d_op_opts *opts)
{
    int dev = opts != NULL && opts->device_type == C10D_DEVICE_CUDA ? 1 : 0;
    if (pg->backends[dev].vt == NULL)
        return c10d__fail(C10D_EUNSUPPORTED,
                          "%s %s: process group %s has no backend for %s buffers", pg->backend_name,
                          opname, pg->name, dev ? "cuda" : "cpu");
    return dev;
}

static void noop_warn(const c10d_pg *pg, const char *opname)
{
    C10D_WARN("pg", "%s on process group %s, which this rank is not a member of: nothing to do",
              opname, pg->name);
}

int c10d__pg_noop(const c10d_pg *pg, const char *opname, const c10d_op_opts *opts, c10d_work **work)
{
    noop_warn(pg, opname);
    c10d_work *w;
    C10D_CHECK(c10d__work_create(&w, "no-op (not a member)", 0));
    c10d__work_complete(w, 0, NULL);
    if (opts != NULL && opts->cb != NULL) {
        int rc = c10d_work_on_complete(w, opts->cb, opts->cb_arg);
        if (rc != 0) {
            c10d_work_release(w);
            return rc;
        }
    }
    if (work != NULL)
        *work = w;
    else
        c10d_work_release(w);
    return 0;
}

/* A barrier has no buffers to say where it runs: on a group without a host
 * backend it goes to the bound CUDA device, else the current one, as torch's
 * NCCL barrier picks a device itself. */
static int barrier_device(const c10d_pg *pg, c10d_op_opts *o)
{
    if (o->device_type != C10D_DEVICE_CPU || pg->backends[C10D_DEVICE_CPU].vt != NULL ||
        pg->backends[C10D_DEVICE_CUDA].vt == NULL)
        return 0;
    int dev = pg->device_index;
    if (dev < 0) {
        const struct c10d__cudart_api *cu = NULL;
        C10D_CHECK(c10d__cuda_load(&cu));
        C10D__CUDA_CHECK(cu, cu->cudaGetDevice(&dev), "barrier: cudaGetDevice");
    }
    o->device_type = C10D_DEVICE_CUDA;
    o->device_index = dev;
    return 0;
}

/* Copies what the op points to that the caller may free after the call: the
 * count arrays and the buffer lists (the buffers stay the caller's). */
static int dispatch(c10d_pg *pg, const char *opname, const struct c10d__op *args, int list_form,
                    const c10d_op_opts *user_opts, c10d_work **work)
{
    if (work != NULL)
        *work = NULL;
    if (pg == NULL)
        return c10d__fail(C10D_EINVAL, "c10d %s: pg is NULL", opname);
    c10d_op_opts opts_copy;
    C10D_CHECK(c10d__pg_read_op_opts(pg, opname, user_opts, &opts_copy));
    const c10d_op_opts *opts = &opts_copy;
    if (pg->rank < 0)
        return c10d__pg_noop(pg, opname, opts, work);
    if (args->kind == C10D_OP_BARRIER)
        C10D_CHECK(barrier_device(pg, &opts_copy));
    int dev = c10d__pg_device(pg, opname, opts);
    if (dev < 0)
        return dev;
    struct c10d__op op = *args;
    if (opts != NULL) {
        op.premul_factor = opts->premul_factor;
        op.premul_factor_dev = opts->premul_factor_dev;
        op.device_type = opts->device_type;
        op.device_index = opts->device_index;
        op.stream = opts->stream;
    }
    C10D_CHECK(c10d__pg_check_op(pg, opname, &op, list_form));
    size_t per = 1;
    /* DETAIL compares what the ranks called: the two fields a complex dtype
     * changes are kept, not the 200-byte op (remade only with DETAIL). */
    c10d_dtype called_dtype = op.dtype;
    size_t called_count = op.count;
    C10D_CHECK(c10d__pg_complex_as_reals(pg, opname, &op, &per));
    const struct c10d__backend_vtable *vt = pg->backends[dev].vt;
    if (vt->check != NULL) {
        int rc = vt->check(&op);
        if (rc < 0) {
            /* A copy: the message is rewritten from it. */
            char why[512];
            snprintf(why, sizeof why, "%s", c10d_last_error());
            /* Backends may or may not name themselves: make sure the op is named. */
            if (strncmp(why, vt->name, strlen(vt->name)) == 0)
                return rc;
            return c10d__fail(rc, "%s %s: %s", pg->backend_name, opname, why);
        }
    }
    if (!is_p2p(op.kind) && c10d__pg_detail_enabled()) {
        struct c10d__op as_called = op;
        as_called.dtype = called_dtype;
        as_called.count = called_count;
        /* A failed group fails the call at once, as without the check: the
         * exchange would wait for ranks that are gone. */
        uv_mutex_lock(&pg->mutex);
        int rc = c10d__pg_usable_locked(pg, opname);
        uv_mutex_unlock(&pg->mutex);
        C10D_CHECK(rc);
        int fatal;
        rc =
            c10d__pg_detail_check(pg, opname, &as_called,
                                  opts->timeout_ms > 0 ? opts->timeout_ms : pg->timeout_ms, &fatal);
        if (fatal)
            poison_from_caller(pg, rc, c10d_last_error());
        C10D_CHECK(rc);
    }
    size_t s = (size_t)pg->size;
    size_t extra = 2 * s * sizeof(void *) + 2 * s * sizeof(size_t);
    struct c10d__pg_op *po = c10d__pg_op_new(pg, dev, extra);
    if (po == NULL)
        return C10D_ENOMEM;
    po->op = op;
    void **lists = po->storage;
    size_t *counts = (size_t *)(lists + 2 * s);
    if (op.sends != NULL) {
        memcpy(lists, op.sends, s * sizeof(void *));
        po->op.sends = (const void *const *)lists;
    }
    if (op.recvs != NULL) {
        memcpy(lists + s, op.recvs, s * sizeof(void *));
        po->op.recvs = (void *const *)(lists + s);
    }
    if (op.send_counts != NULL) {
        memcpy(counts, op.send_counts, s * sizeof(size_t));
        po->op.send_counts = counts;
    }
    if (op.recv_counts != NULL) {
        memcpy(counts + s, op.recv_counts, s * sizeof(size_t));
        po->op.recv_counts = counts + s;
    }
    for (size_t i = 0; per > 1 && i < 2 * s; i++)
        counts[i] *= per;
    return c10d__pg_submit(pg, opname, po, opts, work);
}

int c10d__pg_dispatch(c10d_pg *pg, const char *opname, const struct c10d__op *args, int list_form,
                      const c10d_op_opts *opts, c10d_work **work)
{
    return dispatch(pg, opname, args, list_form, opts, work);
}

struct c10d__op c10d__pg_op_init(enum c10d__op_kind kind, size_t count, c10d_dtype dtype)
{
    struct c10d__op op;
    memset(&op, 0, sizeof op);
    op.kind = kind;
    op.count = count;
    op.dtype = dtype;
    op.root = -1;
    op.peer = -1;
    return op;
}

int c10d_broadcast(c10d_pg *pg, const void *send, void *recv, size_t count, c10d_dtype dtype,
                   int root, const c10d_op_opts *opts, c10d_work **work)
{
    struct c10d__op op = c10d__pg_op_init(C10D_OP_BROADCAST, count, dtype);
    op.send = send != NULL ? send : recv;
    op.recv = recv;
    op.root = root;
    return dispatch(pg, "broadcast", &op, 0, opts, work);
}

int c10d_reduce(c10d_pg *pg, const void *send, void *recv, size_t count, c10d_dtype dtype,
                c10d_reduce_op redop, int root, const c10d_op_opts *opts, c10d_work **work)
{
    struct c10d__op op = c10d__pg_op_init(C10D_OP_REDUCE, count, dtype);
    op.send = send != NULL ? send : recv;
    op.recv = recv;
    op.redop = redop;
    op.root = root;
    return dispatch(pg, "reduce", &op, 0, opts, work);
}

int c10d_all_gather(c10d_pg *pg, const void *send, void *recv, size_t count, c10d_dtype dtype,
                    const c10d_op_opts *opts, c10d_work **work)
{
    struct c10d__op op = c10d__pg_op_init(C10D_OP_ALL_GATHER, count, dtype);
    op.send = send;
    op.recv = recv;
    /* NCCL's in-place form: this rank's block of recv is the input. */
    if (send == NULL && recv != NULL && pg != NULL && pg->rank >= 0)
        op.send = (const char *)recv + (size_t)pg->rank * count * c10d_dtype_size(dtype);
    return dispatch(pg, "all_gather", &op, 0, opts, work);
}

int c10d_all_gather_list(c10d_pg *pg, const void *send, void *const *recvs, size_t count,
                         c10d_dtype dtype, const c10d_op_opts *opts, c10d_work **work)
{
    struct c10d__op op = c10d__pg_op_init(C10D_OP_ALL_GATHER, count, dtype);
    op.send = send;
    op.recvs = recvs;
    return dispatch(pg, "all_gather", &op, 1, opts, work);
}

int c10d_gather(c10d_pg *pg, const void *send, void *recv, size_t count, c10d_dtype dtype, int root,
                const c10d_op_opts *opts, c10d_work **work)
{
    struct c10d__op op = c10d__pg_op_init(C10D_OP_GATHER, count, dtype);
    op.send = send;
    op.recv = recv;
    op.root = root;
    return dispatch(pg, "gather", &op, 0, opts, work);
}

int c10d_scatter(c10d_pg *pg, const void *send, void *recv, size_t count, c10d_dtype dtype,
                 int root, const c10d_op_opts *opts, c10d_work **work)
{
    struct c10d__op op = c10d__pg_op_init(C10D_OP_SCATTER, count, dtype);
    op.send = send;
    op.recv = recv;
    op.root = root;
    return dispatch(pg, "scatter", &op, 0, opts, work);
}

int c10d_reduce_scatter(c10d_pg *pg, const void *send, void *recv, size_t count, c10d_dtype dtype,
                        c10d_reduce_op redop, const c10d_op_opts *opts, c10d_work **work)
{
    struct c10d__op op = c10d__pg_op_init(C10D_OP_REDUCE_SCATTER, count, dtype);
    op.send = send;
    op.recv = recv;
    op.redop = redop;
    return dispatch(pg, "reduce_scatter", &op, 0, opts, work);
}

int c10d_reduce_scatter_list(c10d_pg *pg, const void *const *sends, void *recv, size_t count,
                             c10d_dtype dtype, c10d_reduce_op redop, const c10d_op_opts *opts,
                             c10d_work **work)
{
    struct c10d__op op = c10d__pg_op_init(C10D_OP_REDUCE_SCATTER, count, dtype);
    op.sends = sends;
    op.recv = recv;
    op.redop = redop;
    return dispatch(pg, "reduce_scatter", &op, 1, opts, work);
}

int c10d_all_to_all_single(c10d_pg *pg, const void *send, void *recv, size_t count,
                           const size_t *send_counts, const size_t *recv_counts, c10d_dtype dtype,
                           const c10d_op_opts *opts, c10d_work **work)
{
    struct c10d__op op = c10d__pg_op_init(C10D_OP_ALL_TO_ALL, count, dtype);
    op.send = send;
    op.recv = recv;
    op.send_counts = send_counts;
    op.recv_counts = recv_counts;
    return dispatch(pg, "all_to_all", &op, 0, opts, work);
}

int c10d_all_to_all(c10d_pg *pg, const void *const *sends, const size_t *send_counts,
                    void *const *recvs, const size_t *recv_counts, c10d_dtype dtype,
                    const c10d_op_opts *opts, c10d_work **work)
{
    struct c10d__op op = c10d__pg_op_init(C10D_OP_ALL_TO_ALL, 0, dtype);
    op.sends = sends;
    op.recvs = recvs;
    op.send_counts = send_counts;
    op.recv_counts = recv_counts;
    return dispatch(pg, "all_to_all", &op, 1, opts, work);
}

int c10d_barrier(c10d_pg *pg, const c10d_op_opts *opts, c10d_work **work)
{
    struct c10d__op op = c10d__pg_op_init(C10D_OP_BARRIER, 0, C10D_UINT8);
    return dispatch(pg, "barrier", &op, 0, opts, work);
}

int c10d_send(c10d_pg *pg, const void *buf, size_t count, c10d_dtype dtype, int peer, int tag,
              const c10d_op_opts *opts, c10d_work **work)
{
    struct c10d__op op = c10d__pg_op_init(C10D_OP_SEND, count, dtype);
    op.send = buf;
    op.peer = peer;
    op.tag = tag;
    return dispatch(pg, "send", &op, 0, opts, work);
}

int c10d_recv(c10d_pg *pg, void *buf, size_t count, c10d_dtype dtype, int peer, int tag,
              const c10d_op_opts *opts, c10d_work **work)
{
    struct c10d__op op = c10d__pg_op_init(C10D_OP_RECV, count, dtype);
    op.recv = buf;
    op.peer = peer;
    op.tag = tag;
    return dispatch(pg, "recv", &op, 0, opts, work);
}
