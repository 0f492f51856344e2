/* The nccl backend: NCCL collectives on CUDA buffers, driven by the loop
 * (nccl_impl.h for the file map, docs/nccl.md for the behaviour).
 *
 * An op is issued on the caller's thread (`submit`): an event recorded on
 * the caller's stream orders it after the caller's work, the communicator's
 * stream waits on it, and the NCCL calls go between a start and an end
 * event. The loop's completion poller watches the head of each
 * communicator's queue: the start event starts the op's clock (its timeout
 * counts from when it began on the GPU), the end event completes its work,
 * ncclCommGetAsyncError is read with them. A timeout or an async error fails
 * the group: every pending op fails, the communicators are aborted off the
 * loop, and later ops fail at once naming the first error. There is no
 * watchdog thread and nothing kills the process.
 *
 * Over 800 lines because the backend table's entries share one per-group
 * state and its locking; communicators, launches and peer errors are in
 * comm.c, launch.c and peer_error.c. */
#include "nccl_impl.h"

#include "engine/env.h"
#include "engine/error.h"
#include "engine/log.h"
#include "engine/loop.h"
#include "engine/offload.h"
#include "engine/work.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void state_maybe_free(struct nccl_state *s);

/* -------------------------------------------------------------- ops */

static const char payload_kind = 0; /* tells our works' payloads apart */

static void op_free(void *arg)
{
    struct nccl_op *no = arg;
    const struct c10d__gpu_api *api = no->api;
    if (no->pool != NULL) {
        /* A captured op's events are nodes of the user's graph, recorded at
         * every replay: never reused nor destroyed under it (three events
         * per captured op live as long as the process). */
        cudaEvent_t evs[3] = {no->ready_ev, no->start_ev, no->end_ev};
        for (int i = 0; i < 3 && !no->captured; i++)
            if (evs[i] != NULL)
                c10d__nccl_event_put(no->pool, api, evs[i]);
        c10d__nccl_pool_unref(no->pool, api);
    }
    free(no);
}

/* c10d_work_wait_stream: the stream waits for the op's end event. */
static int op_stream_wait(c10d_work *w, void *stream, void *arg)
{
    struct nccl_op *no = arg;
    if (!atomic_load(&no->issued) || c10d_work_test(w))
        return c10d_work_wait(w, -1) < 0 ? c10d_work_status(w) : 0;
    cudaError_t e = no->api->cuda.cudaStreamWaitEvent((cudaStream_t)stream, no->end_ev, 0);
    if (e != cudaSuccess)
        return c10d__fail(C10D_EIO, "c10d_work_wait_stream: cudaStreamWaitEvent: %s",
                          no->api->cuda.cudaGetErrorString(e));
    return 0;
}

static const char *op_type(const struct c10d__op *op)
{
    return op->next != NULL && op->kind != C10D_OP_SEND && op->kind != C10D_OP_RECV
               ? "COALESCED"
               : c10d__op_kind_name(op->kind);
}

/* torch's NCCL barrier is an all_reduce of one element, and says so. */
static void numel(const struct nccl_state *s, const struct c10d__op *op, size_t *in, size_t *out)
{
    c10d__op_numel(op, s->size, in, out);
    if (op->kind == C10D_OP_BARRIER)
        *in = *out = 1;
}

/* Loop, through the poller: started? done? late? failed? */
static int op_ready(struct c10d__poll_item *item)
{
    struct nccl_op *no = (struct nccl_op *)item;
    const struct c10d__gpu_api *api = no->api;
    struct nccl_comm *c = no->c;
    /* Event queries must not join a capture another thread of the process
     * has open in global mode. */
    c10d__gpu_use_device(&api->cuda, c->device);
    enum cudaStreamCaptureMode mode = cudaStreamCaptureModeThreadLocal;
    api->cuda.cudaThreadExchangeStreamCaptureMode(&mode);
    int ready = 0;
    if (no->started_ms == 0) {
        cudaError_t e = api->cuda.cudaEventQuery(no->start_ev);
        if (e == cudaSuccess) {
            no->started_ms = c10d__now_ms();
        } else if (e != cudaErrorNotReady) {
            /* A sticky error (a kernel's illegal address, an Xid): the op will
             * never start and no clock would ever run out; fail it now. */
            no->status = C10D_EIO;
            snprintf(no->why, sizeof no->why,
                     "CUDA error before %s (SeqNum=%llu) started on the communicator's "
                     "stream: %s; the device context is unusable, abort the group",
                     op_type(no->op), (unsigned long long)no->op->seq,
                     api->cuda.cudaGetErrorString(e));
            ready = 1;
        }
    }
    if (!ready && no->started_ms != 0) {
        cudaError_t e = api->cuda.cudaEventQuery(no->end_ev);
        if (e == cudaSuccess) {
            /* Tags are unique: a slot holding ours was written by our check
             * (a later op's in the same slot, 64 ops on, may overwrite it). */
            if (no->nan_tag != 0 &&
                c->nan_flag[no->nan_tag % C10D__NCCL_NAN_SLOTS] == no->nan_tag) {
                no->status = C10D_EINVAL;
                snprintf(no->why, sizeof no->why,
                         "NaN found in the input of %s (SeqNum=%llu, dtype %s) on rank %d of "
                         "process group %s (C10D_NCCL_NAN_CHECK); the op ran, and its output on "
                         "every rank is suspect",
                         op_type(no->op), (unsigned long long)no->op->seq,
                         c10d_dtype_name(no->op->dtype), c->s->rank, c->s->name);
            }
            float ms;
            if (no->status == 0 && no->pool->timing &&
                api->cuda.cudaEventElapsedTime(&ms, no->start_ev, no->end_ev) == cudaSuccess)
                c10d__work_set_duration(no->op->work, ms);
            ready = 1;
        } else if (e != cudaErrorNotReady) {
            no->status = C10D_EIO;
            snprintf(no->why, sizeof no->why, "CUDA error on the communicator's stream: %s",
                     api->cuda.cudaGetErrorString(e));
            ready = 1;
        } else if (c10d__now_ms() - no->started_ms >= (uint64_t)no->op->timeout_ms &&
                   no->op->timeout_ms > 0) {
            size_t in, out;
            numel(c->s, no->op, &in, &out);
            no->status = C10D_ETIMEDOUT;
            snprintf(no->why, sizeof no->why,
                     "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=%llu, "
                     "OpType=%s, NumelIn=%zu, NumelOut=%zu, Timeout(ms)=%lld) ran for %llu "
                     "milliseconds before timing out.",
                     (unsigned long long)no->op->seq, op_type(no->op), in, out,
                     (long long)no->op->timeout_ms,
                     (unsigned long long)(c10d__now_ms() - no->started_ms));
            ready = 1;
        }
    }
    if (!ready)
        c10d__nccl_peer_error_poll(c->s);
    if (!ready && c->comm != NULL) {
        ncclResult_t st = ncclSuccess;
        api->nccl.ncclCommGetAsyncError(c->comm, &st);
        if (st != ncclSuccess && st != ncclInProgress) {
            char buf[256];
            no->status = C10D_EIO;
            snprintf(no->why, sizeof no->why,
                     "NCCL communicator of process group %s reported an asynchronous error "
                     "during %s seq %llu: %s",
                     c->s->name, op_type(no->op), (unsigned long long)no->op->seq,
                     c10d__nccl_error_text(api, st, buf, sizeof buf));
            ready = 1;
        }
    }
    api->cuda.cudaThreadExchangeStreamCaptureMode(&mode);
    return ready;
}

static void op_done(struct c10d__poll_item *item)
{
    struct nccl_op *no = (struct nccl_op *)item;
    struct nccl_state *s = no->c->s;
    c10d_work *w = no->op->work;
    if (no->status == 0) {
        c10d__work_complete(w, 0, NULL);
    } else {
        /* The group fails first: whoever the work wakes finds it failed. */
        C10D_WARN("nccl", "[PG %s Rank %d] %s", s->name, s->rank, no->why);
        c10d__nccl_fail(s, no->status, "%s", no->why);
        c10d__work_complete(w, no->status, "%s", no->why);
    }
    c10d_work_release(w); /* the poll item's */
}

/* Under c->lock, any thread with c's device current: the NCCL calls of one
 * op on c's stream. */
static int issue(struct nccl_comm *c, struct nccl_op *no)
{
    const struct c10d__gpu_api *api = c->s->api;
    int rc = 0;
    cudaError_t e = api->cuda.cudaStreamWaitEvent(c->stream, no->ready_ev, 0);
    if (e == cudaSuccess)
        e = api->cuda.cudaEventRecord(no->start_ev, c->stream);
    if (e != cudaSuccess)
        rc = c10d__fail(C10D_EIO, "nccl %s: %s", no->type, api->cuda.cudaGetErrorString(e));
    /* Not in a capture: a graph's replays would write a flag nobody reads. */
    if (rc == 0 && c->nan_flag != NULL && !no->captured) {
        no->nan_tag = ++c->nan_tags;
        rc = c10d__nccl_nan_check(c, no->op, no->nan_tag);
    }
    if (rc == 0 && c->blocking) {
        /* A blocking launch may wait inside NCCL for the peers: an abort
         * frees it from there (nccl_impl.h). A nonblocking one is bounded
         * by the op's timeout, and an abort waits for it. */
        atomic_store(&c->in_nccl, 1);
        if (atomic_load(&c->aborting))
            rc = c10d__fail(C10D_EABORTED, "nccl %s: the communicator is being aborted", no->type);
        else
            rc = c10d__nccl_launch(c, no->op);
        atomic_store(&c->in_nccl, 0);
    } else if (rc == 0) {
        rc = c10d__nccl_launch(c, no->op);
    }
    if (rc == 0 && (e = api->cuda.cudaEventRecord(no->end_ev, c->stream)) != cudaSuccess)
        rc = c10d__fail(C10D_EIO, "nccl %s: %s", no->type, api->cuda.cudaGetErrorString(e));
    /* Captured: the caller's stream joins the communicator's stream back
     * (a capture must end on its origin stream), and the work is done now. */
    if (rc == 0 && no->captured &&
        (e = api->cuda.cudaStreamWaitEvent((cudaStream_t)no->op->stream, no->end_ev, 0)) !=
            cudaSuccess)
        rc = c10d__fail(C10D_EIO, "nccl %s: %s", no->type, api->cuda.cudaGetErrorString(e));
    if (rc != 0)
        return rc;
    atomic_store(&no->issued, 1);
    if (no->captured) {
        c10d_work *w = no->op->work; /* completing it may free no->op */
        c10d__work_complete(w, 0, NULL);
        c10d_work_release(w); /* the queue's, never queued */
        return 0;
    }
    return c10d__poll_push(&c->completions, &no->item);
}

/* An op that could not be issued: its work fails, and so does the group
 * (a collective the other ranks issued and this one did not would hang
 * them). */
static void fail_op(struct nccl_op *no, int status, const char *why)
{
    c10d_work *w = no->op->work;
    c10d__nccl_fail(no->c->s, status, "%s", why);
    c10d__work_complete(w, status, "%s", why);
    c10d_work_release(w); /* the deferred list's */
}

/* The ops that waited for a communicator (STARTING), and the first ops on
 * it (COLD), are issued by a worker, never by the loop or a caller: the
 * first launch on a blocking communicator makes NCCL's connections and may
 * wait there for the peers. The worker holds c->lock (no abort meanwhile);
 * callers only append under defer_mu, so none waits for NCCL holding the
 * group's lock. Once the list is empty the communicator is READY. c stays
 * START_BUSY meanwhile (a close leaves it to drain_after) and the state
 * keeps a pending call. */
struct drain {
    struct nccl_comm *c;
    struct nccl_state *s;
    struct nccl_op *failed; /* ops that could not be issued, with status and why */
    c10d__backend_done_fn ready_done;
    void *ready_arg;
};

static void drain_work(void *arg)
{
    struct drain *d = arg;
    struct nccl_comm *c = d->c;
    struct nccl_op **tail = &d->failed;
    c10d__gpu_use_device(&c->s->api->cuda, c->device);
    uv_mutex_lock(&c->lock);
    for (;;) {
        /* One at a time: what is still in the list is what a failure of
         * the group takes out and fails at once (fail_pending), even while
         * this thread is stuck in NCCL with the op it took. */
        uv_mutex_lock(&c->defer_mu);
        struct nccl_op *no = c->deferred_head;
        if (no == NULL) {
            c->deferred_tail = NULL;
            c->drain_scheduled = 0;
            atomic_store(&c->phase, COMM_READY);
        } else {
            c->deferred_head = no->next_deferred;
            if (c->deferred_head == NULL)
                c->deferred_tail = NULL;
            no->next_deferred = NULL;
        }
        uv_mutex_unlock(&c->defer_mu);
        if (no == NULL)
            break;
        int gone = atomic_load(&d->s->poisoned) || atomic_load(&c->start_busy) == START_ORPHANED;
        int rc = gone ? C10D_EABORTED : issue(c, no);
        if (rc != 0) {
            no->status = rc;
            snprintf(no->why, sizeof no->why, "nccl %s seq %llu: %.300s", no->type,
                     (unsigned long long)no->seq,
                     gone ? "the process group failed or was closed before the op was issued"
                          : c10d_last_error());
            *tail = no;
            tail = &no->next_deferred;
        }
    }
    uv_mutex_unlock(&c->lock);
}

static void drain_after(void *arg)
{
    struct drain *d = arg;
    struct nccl_state *s = d->s;
    struct nccl_comm *c = d->c;
    while (d->failed != NULL) {
        struct nccl_op *no = d->failed;
        d->failed = no->next_deferred;
        c10d_work *w = no->op->work;
        c10d__nccl_fail(s, no->status, "%s", no->why);
        c10d__work_complete(w, no->status, "%s", no->why);
        c10d_work_release(w); /* the deferred list's */
    }
    int busy = START_BUSY;
    if (!atomic_compare_exchange_strong(&c->start_busy, &busy, START_IDLE)) {
        /* The group closed meanwhile and left c to us: what the worker
         * issued is still queued for the poller, which must let go of it
         * before c goes. */
        struct c10d__poll_item *items = c10d__poll_cancel(&c->completions);
        while (items != NULL) {
            struct c10d__poll_item *it = items;
            items = items->next;
            c10d_work *w = ((struct nccl_op *)it)->op->work;
            c10d__work_complete(w, C10D_EABORTED, "nccl: process group %s was closed", s->name);
            c10d_work_release(w); /* the poll item's */
        }
        c10d__nccl_comm_orphan_release(c);
    }
    if (d->ready_done != NULL)
        d->ready_done(d->ready_arg, 0);
    atomic_fetch_sub(&s->pending_calls, 1);
    free(d);
    state_maybe_free(s);
}

/* Under c->defer_mu, any thread, with ops in `deferred`: starts the worker
 * that issues them, unless one is on its way. 0, or C10D_EABORTED (the
 * engine is shutting down) or C10D_ENOMEM. */
static int drain_schedule(struct nccl_comm *c, c10d__backend_done_fn ready_done, void *ready_arg)
{
    if (c->drain_scheduled)
        return 0;
    struct drain *d = calloc(1, sizeof *d);
    if (d == NULL)
        return c10d__fail(C10D_ENOMEM, "nccl: out of memory");
    *d = (struct drain){c, c->s, NULL, ready_done, ready_arg};
    atomic_store(&c->start_busy, START_BUSY);
    atomic_fetch_add(&c->s->pending_calls, 1);
    if (c10d__engine_offload(drain_work, drain_after, d) != 0) {
        atomic_fetch_sub(&c->s->pending_calls, 1);
        atomic_store(&c->start_busy, START_IDLE);
        free(d);
        return c10d__fail(C10D_EABORTED, "nccl: the engine is shutting down");
    }
    c->drain_scheduled = 1;
    return 0;
}

static void comm_settled(struct nccl_comm *c)
{
    struct nccl_state *s = c->s;
    int ok = atomic_load(&c->init_status) == 0;
    uv_mutex_lock(&c->defer_mu);
    if (ok) {
        atomic_store(&c->phase, COMM_COLD);
        if (c->deferred_head != NULL) {
            if (drain_schedule(c, c->ready_done, c->ready_arg) == 0) {
                c->ready_done = NULL;
                uv_mutex_unlock(&c->defer_mu);
                return;
            }
            ok = 0;
            c10d__nccl_comm_fail_start(c, C10D_EABORTED, "%s", c10d_last_error());
        }
    }
    struct nccl_op *list = NULL;
    if (!ok) {
        list = c->deferred_head;
        c->deferred_head = c->deferred_tail = NULL;
        atomic_store(&c->phase, COMM_FAILED);
        C10D_WARN("nccl", "[PG %s Rank %d] communicator on device %d: %s", s->name, s->rank,
                  c->device, c->init_error);
    }
    uv_mutex_unlock(&c->defer_mu);
    char why[512];
    while (list != NULL) {
        struct nccl_op *no = list;
        list = no->next_deferred;
        snprintf(why, sizeof why, "nccl %s seq %llu: %.400s", op_type(no->op),
                 (unsigned long long)no->op->seq, c->init_error);
        fail_op(no, atomic_load(&c->init_status), why);
    }
    if (!ok && c->ready_done == NULL)
        c10d__nccl_fail(s, c->init_status, "%s", c->init_error);
    if (c->ready_done != NULL) {
        c10d__backend_done_fn done = c->ready_done;
        c->ready_done = NULL;
        if (!ok)
            c10d__fail(c->init_status, "%s", c->init_error);
        done(c->ready_arg, ok ? 0 : c->init_status);
    }
}

/* ---------------------------------------------------------- failing */

static void fail_pending(struct nccl_state *s, int status, const char *why)
{
    uv_mutex_lock(&s->mutex);
    struct nccl_comm *comms = s->comms;
    uv_mutex_unlock(&s->mutex);
    for (struct nccl_comm *c = comms; c != NULL; c = c->next) {
        /* Ops a worker has yet to issue leave its list and fail now. (The
         * one it may be stuck issuing is its own until NCCL lets go: its
         * record is in use.) While the communicator starts, its settling
         * fails the list instead. */
        struct nccl_op *list = NULL;
        uv_mutex_lock(&c->defer_mu);
        if (atomic_load(&c->phase) != COMM_STARTING) {
            list = c->deferred_head;
            c->deferred_head = c->deferred_tail = NULL;
        }
        uv_mutex_unlock(&c->defer_mu);
        while (list != NULL) {
            struct nccl_op *no = list;
            list = no->next_deferred;
            c10d_work *w = no->op->work; /* completing it may free no->op */
            c10d__work_complete(w, status, "%s", why);
            c10d_work_release(w); /* the deferred list's */
        }
        struct c10d__poll_item *items = c10d__poll_cancel(&c->completions);
        while (items != NULL) {
            struct c10d__poll_item *it = items;
            items = items->next;
            if (it == &c->init_item) {
                c10d__nccl_comm_fail_start(c, status, "%s", why);
                comm_settled(c);
                continue;
            }
            c10d_work *w = ((struct nccl_op *)it)->op->work;
            c10d__work_complete(w, status, "%s", why);
            c10d_work_release(w); /* the poll item's */
        }
    }
}

static void abort_comms_task(void *arg)
{
    struct nccl_state *s = arg;
    c10d__nccl_peer_error_publish(s);
    if (!s->closing)
        fail_pending(s, s->first_status, s->first_error);
    atomic_fetch_sub(&s->pending_calls, 1);
    state_maybe_free(s);
}

enum fail_origin { FAIL_OURS, FAIL_PEER, FAIL_QUIET };

static void fail_v(struct nccl_state *s, int status, enum fail_origin origin, const char *fmt,
                   va_list ap)
{
    uv_mutex_lock(&s->mutex);
    int first = !atomic_load(&s->poisoned);
    if (first) {
        vsnprintf(s->first_error, sizeof s->first_error, fmt, ap);
        s->first_status = status;
        s->first_from_peer = origin == FAIL_PEER;
        s->publish_pending = origin == FAIL_OURS;
        atomic_store(&s->poisoned, 1);
    }
    uv_mutex_unlock(&s->mutex);
    /* Fails what is queued now; the group layer then calls abort, which
     * aborts the communicators off the loop. */
    if (first) {
        atomic_fetch_add(&s->pending_calls, 1);
        if (c10d__engine_call(abort_comms_task, s) != 0)
            atomic_fetch_sub(&s->pending_calls, 1);
    }
}

void c10d__nccl_fail(struct nccl_state *s, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fail_v(s, status, FAIL_OURS, fmt, ap);
    va_end(ap);
}

static void fail_from_peer(struct nccl_state *s, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void fail_from_peer(struct nccl_state *s, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fail_v(s, status, FAIL_PEER, fmt, ap);
    va_end(ap);
}

static void peer_failed(struct nccl_state *s, int status, const char *message)
{
    fail_from_peer(s, status, "%s", message);
}

static void fail_quiet(struct nccl_state *s, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void fail_quiet(struct nccl_state *s, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fail_v(s, status, FAIL_QUIET, fmt, ap);
    va_end(ap);
}

/* ------------------------------------------------------------ the table */

/* A group's state from its config (the group passes its NCCL options,
 * inherited from the parent where it set none). */
/* What comm.c and peer_error.c call up through (nccl_impl.h). */
static const struct nccl_reports reports = {comm_settled, peer_failed, state_maybe_free};

static struct nccl_state *state_new(const struct c10d__gpu_api *api,
                                    const struct c10d__backend_config *cfg, int bound_device)
{
    struct nccl_state *s = calloc(1, sizeof *s);
    if (s == NULL)
        return NULL;
    s->up = &reports;
    s->api = api;
    s->rank = cfg->rank;
    s->size = cfg->size;
    snprintf(s->name, sizeof s->name, "%s", cfg->group_name != NULL ? cfg->group_name : "?");
    snprintf(s->desc, sizeof s->desc, "%s", cfg->group_desc != NULL ? cfg->group_desc : "");
    s->timeout_ms = cfg->timeout_ms > 0 ? cfg->timeout_ms : 600000;
    s->store = cfg->store;
    c10d_store_retain(s->store);
    if (cfg->nccl_opts != NULL)
        s->nccl_opts = *cfg->nccl_opts;
    s->bound_device = bound_device;
    s->nan_check = c10d__env_bool(C10D_ENV_NCCL_NAN_CHECK);
    uv_mutex_init(&s->mutex);
    return s;
}

static int nccl_create(const struct c10d__backend_config *cfg, c10d__backend_done_fn done,
                       void *arg, void **state)
{
    const struct c10d__gpu_api *api;
    C10D_CHECK(c10d__nccl_load(&api));
    if (cfg->device_index >= api->device_count)
        return c10d__fail(C10D_EINVAL, "nccl: device %d does not exist (%d visible)",
                          cfg->device_index, api->device_count);
    struct nccl_state *s = state_new(api, cfg, cfg->device_index);
    if (s == NULL)
        return c10d__fail(C10D_ENOMEM, "nccl: out of memory");
    *state = s;
    if (cfg->device_index < 0) {
        done(arg, 0);
        return 0;
    }
    int rc = c10d__nccl_comm_start_eager(s, cfg->device_index, done, arg);
    if (rc != 0) {
        c10d_store_release(s->store);
        uv_mutex_destroy(&s->mutex);
        free(s);
        *state = NULL;
    }
    return rc;
}

/* Caller's thread: puts `no` on c's waiting list while c has not launched
 * an op yet (a worker issues it). 1 if so, or if that failed (*rc set); 0
 * if c is READY or failed: the caller issues or fails it itself. A warm
 * communicator costs one atomic load here: READY never goes back. */
static int defer_op(struct nccl_comm *c, struct nccl_op *no, int *rc)
{
    if (atomic_load(&c->phase) == COMM_READY)
        return 0;
    uv_mutex_lock(&c->defer_mu);
    int phase = atomic_load(&c->phase);
    int waits = phase == COMM_STARTING || phase == COMM_COLD;
    if (waits && no->captured) {
        *rc = c10d__fail(C10D_EINVAL,
                         "nccl %s: cannot capture an op into a CUDA graph before the group's "
                         "communicator has run an op (run one op before capturing)",
                         no->type);
    } else if (waits) {
        *rc = phase == COMM_COLD ? drain_schedule(c, NULL, NULL) : 0;
        if (*rc == 0) {
            if (c->deferred_tail != NULL)
                c->deferred_tail->next_deferred = no;
            else
                c->deferred_head = no;
            c->deferred_tail = no;
        }
    }
    uv_mutex_unlock(&c->defer_mu);
    return waits;
}

static int nccl_submit(void *state, struct c10d__op *op)
{
    struct nccl_state *s = state;
    if (atomic_load(&s->poisoned))
        return c10d__fail(s->first_status != 0 ? s->first_status : C10D_EABORTED,
                          "nccl %s: process group %s failed earlier: %s", op_type(op), s->name,
                          s->first_error);
    const struct c10d__gpu_api *api = s->api;
    int peer = -1;
    /* Unbatched P2P on a lazily made group runs on the pair's communicator:
     * the group's would need every rank to join. */
    if ((op->kind == C10D_OP_SEND || op->kind == C10D_OP_RECV) && op->next == NULL) {
        uv_mutex_lock(&s->mutex);
        struct nccl_comm *g = s->comms;
        while (g != NULL && (g->device != op->device_index || g->peer != -1))
            g = g->next;
        uv_mutex_unlock(&s->mutex);
        if (g == NULL)
            peer = op->peer;
    }
    struct nccl_comm *c = c10d__nccl_comm_get(s, op->device_index, peer);
    if (c == NULL)
        return C10D_EABORTED;
    struct nccl_op *no = calloc(1, sizeof *no);
    if (no == NULL)
        return c10d__fail(C10D_ENOMEM, "nccl: out of memory");
    no->item.ready = op_ready;
    no->item.done = op_done;
    no->type = op_type(op);
    no->seq = op->seq;
    no->c = c;
    no->op = op;
    no->api = api;
    int prev = -1;
    api->cuda.cudaGetDevice(&prev);
    if (prev != c->device)
        api->cuda.cudaSetDevice(c->device);
    no->pool = c->pool;
    uv_mutex_lock(&no->pool->mutex);
    no->pool->refs++;
    uv_mutex_unlock(&no->pool->mutex);
    int rc = c10d__nccl_event_get(c->pool, api, &no->ready_ev);
    if (rc == 0)
        rc = c10d__nccl_event_get(c->pool, api, &no->start_ev);
    if (rc == 0)
        rc = c10d__nccl_event_get(c->pool, api, &no->end_ev);
    cudaError_t e = cudaSuccess;
    /* An op issued while the caller's stream captures a CUDA graph goes into
     * the graph: its events are graph nodes, not something to poll. */
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (rc == 0 && api->cuda.cudaStreamIsCapturing((cudaStream_t)op->stream, &cs) == cudaSuccess &&
        cs == cudaStreamCaptureStatusActive)
        no->captured = 1;
    if (rc == 0 &&
        (e = api->cuda.cudaEventRecord(no->ready_ev, (cudaStream_t)op->stream)) != cudaSuccess)
        rc = c10d__fail(C10D_EINVAL, "nccl %s: cannot record an event on the caller's stream: %s",
                        op_type(op), api->cuda.cudaGetErrorString(e));
    if (rc == 0) {
        /* Before anyone can complete it: the work frees the record, and
         * the queue the record goes to holds a reference to the work. */
        c10d__work_set_payload(op->work, &payload_kind, no, op_free);
        c10d__work_set_stream_wait(op->work, op_stream_wait, no);
        c10d_work_retain(op->work);
        if (!defer_op(c, no, &rc)) {
            /* READY (it never goes back), or failed. */
            uv_mutex_lock(&c->lock);
            if (atomic_load(&c->phase) == COMM_READY && !atomic_load(&s->poisoned))
                rc = issue(c, no);
            else
                rc = c10d__fail(C10D_EABORTED, "nccl %s: process group %s failed earlier: %s",
                                op_type(op), s->name,
                                s->first_error[0] ? s->first_error : c->init_error);
            uv_mutex_unlock(&c->lock);
        }
    }
    if (prev >= 0 && prev != c->device)
        api->cuda.cudaSetDevice(prev);
    if (rc != 0 && c10d__work_payload(op->work, &payload_kind) == no) {
        c10d_work_release(op->work); /* not queued after all */
    } else if (rc != 0) {
        op_free(no);
    }
    if (rc != 0) {
        /* The op may be out on other ranks: they would wait for this one. */
        if (rc != C10D_EABORTED)
            c10d__nccl_fail(s, rc, "%s", c10d_last_error());
        return rc;
    }
    return 0;
}

struct close_call {
    struct nccl_state *s;
    c10d__backend_done_fn done;
    void *arg;
    int parts; /* the communicators' close, and the failure's publication */
};

static void state_free(struct nccl_state *s)
{
    c10d_store_release(s->store);
    uv_mutex_destroy(&s->mutex);
    free(s);
}

static void state_maybe_free(struct nccl_state *s)
{
    if (s->free_requested && s->close_finished && atomic_load(&s->pending_calls) == 0 &&
        !s->freed) {
        s->freed = 1;
        state_free(s);
    }
}

static void closed(void *arg)
{
    struct close_call *cc = arg;
    if (--cc->parts > 0)
        return;
    struct nccl_state *s = cc->s;
    s->close_finished = 1;
    c10d__backend_done_fn done = cc->done;
    void *done_arg = cc->arg;
    free(cc);
    state_maybe_free(s);
    if (done != NULL)
        done(done_arg, 0);
}

/* Loop: closes the communicators once (abort or destroy, whichever comes
 * first); a destroy frees the state when they are closed. */
static void nccl_close(struct nccl_state *s, int abort, c10d__backend_done_fn done, void *arg)
{
    if (!abort)
        s->free_requested = 1;
    if (s->closing) {
        /* Already closing: a destroy after an abort frees when that ends. */
        if (!abort)
            state_maybe_free(s);
        if (done != NULL)
            done(arg, 0);
        return;
    }
    s->closing = 1;
    struct close_call *cc = calloc(1, sizeof *cc);
    if (cc == NULL) {
        C10D_WARN("nccl", "group %s: out of memory closing it; its communicators are leaked",
                  s->name);
        if (done != NULL)
            done(arg, C10D_ENOMEM);
        return;
    }
    *cc = (struct close_call){s, done, arg, 1};
    /* The others hear of our failure before abort returns: a process that
     * ends right after it would otherwise take the news with it. */
    c10d__nccl_peer_error_publish(s);
    if (s->publishing && s->after_publish == NULL) {
        cc->parts++;
        s->after_publish = closed;
        s->after_publish_arg = cc;
    }
    c10d__nccl_comms_close(s, abort, closed, cc);
}

static void nccl_abort(void *state, int status, const char *reason, c10d__backend_done_fn done,
                       void *arg)
{
    struct nccl_state *s = state;
    c10d__nccl_fail(s, status, "%s", reason);
    fail_pending(s, s->first_status, s->first_error);
    nccl_close(s, 1, done, arg);
}

static void nccl_destroy(void *state, c10d__backend_done_fn done, void *arg)
{
    struct nccl_state *s = state;
    if (!atomic_load(&s->poisoned))
        fail_quiet(s, C10D_EABORTED, "process group %s was destroyed", s->name);
    fail_pending(s, C10D_EABORTED, s->first_error);
    nccl_close(s, 0, done, arg);
}

/* The communicator a child can be split or shrunk from: the bound device's,
 * ready. Only a group bound to a device splits: then every parent rank holds
 * that communicator by now (it was made during creation), whatever ops each
 * rank ran, so all of them take the same path. */
static struct nccl_comm *bound_comm(struct nccl_state *ps)
{
    if (ps->bound_device < 0)
        return NULL;
    uv_mutex_lock(&ps->mutex);
    struct nccl_comm *pc = ps->comms;
    while (pc != NULL &&
           (pc->peer != -1 || pc->device != ps->bound_device ||
            (atomic_load(&pc->phase) != COMM_READY && atomic_load(&pc->phase) != COMM_COLD)))
        pc = pc->next;
    uv_mutex_unlock(&ps->mutex);
    return pc;
}

static int nccl_split(void *parent, const struct c10d__backend_config *cfg, int color, int key,
                      c10d__backend_done_fn done, void *arg, void **state)
{
    struct nccl_state *ps = parent;
    struct nccl_comm *pc = bound_comm(ps);
    if (pc == NULL) {
        if (color < 0) {
            *state = NULL;
            done(arg, 0);
            return 0;
        }
        return nccl_create(cfg, done, arg, state);
    }
    struct nccl_state *s = NULL;
    if (color >= 0) {
        s = state_new(ps->api, cfg, pc->device);
        if (s == NULL)
            return c10d__fail(C10D_ENOMEM, "nccl: out of memory");
    }
    int rc = c10d__nccl_comm_split(s, ps, pc, color, key, done, arg);
    if (rc != 0) {
        if (s != NULL)
            state_free(s);
        return rc;
    }
    *state = s;
    return 0;
}

/* A healthy parent shrinks with ncclCommShrink; a failed one (the usual
 * case: a dead rank failed the group everywhere, and its communicators are
 * aborted) cannot, so the survivors make a new communicator instead, as they
 * do with an NCCL that has no ncclCommShrink (< 2.27). C10D_SHRINK_ABORT: the
 * parent's pending works fail with C10D_EABORTED first (before NCCL ends
 * their kernels, so none completes as a success), then NCCL_SHRINK_ABORT
 * stops them on the device; without ncclCommShrink the group's abort of the
 * parent (ncclCommAbort) stops them once the child is made. */
static int nccl_shrink(void *parent, const struct c10d__backend_config *cfg, const int *excluded,
                       int nexcluded, int flags, c10d__backend_done_fn done, void *arg,
                       void **state)
{
    struct nccl_state *ps = parent;
    struct nccl_comm *pc =
        atomic_load(&ps->poisoned) || ps->closing || ps->api->nccl.ncclCommShrink == NULL
            ? NULL
            : bound_comm(ps);
    if (flags & C10D_SHRINK_ABORT) {
        fail_quiet(ps, C10D_EABORTED,
                   "process group %s was aborted by c10d_pg_shrink (C10D_SHRINK_ABORT)", ps->name);
        fail_pending(ps, ps->first_status, ps->first_error);
    }
    if (pc == NULL)
        return nccl_create(cfg, done, arg, state);
    struct nccl_state *s = state_new(ps->api, cfg, pc->device);
    if (s == NULL)
        return c10d__fail(C10D_ENOMEM, "nccl: out of memory");
    int rc = c10d__nccl_comm_shrink(
        s, pc, excluded, nexcluded,
        (flags & C10D_SHRINK_ABORT) ? NCCL_SHRINK_ABORT : NCCL_SHRINK_DEFAULT, done, arg);
    if (rc != 0) {
        state_free(s);
        return rc;
    }
    *state = s;
    return 0;
}

const struct c10d__backend_vtable c10d__nccl_backend = {
    .name = "nccl",
    .check = c10d__nccl_check,
    .create = nccl_create,
    .submit = nccl_submit,
    .abort = nccl_abort,
    .destroy = nccl_destroy,
    .published_key_fmt = NULL,
    .split = nccl_split,
    .shrink = nccl_shrink,
    .timeout_from_start = 1,
    .uneven = 1,
};
