/* Communicators of the nccl backend (nccl_impl.h).
 *
 * Start: a worker thread sets the device, creates the stream, the barrier
 * buffer and the event pool, exchanges the unique id(s) through the group's
 * store (the first rank of each bootstrap root publishes one) and calls
 * ncclCommInitRankConfig, ncclCommInitRankScalable, ncclCommSplit or
 * ncclCommShrink. The loop watches the start through the completion poller
 * until the communicator is ready, failed, or the group's timeout passed;
 * nothing here blocks the loop.
 *
 * Blocking communicators by default, as PyTorch and torchcomms: NCCL 2.28
 * starts a thread for every ncclGroupEnd of a nonblocking communicator, a
 * cost on every op. A blocking init cannot be aborted (its handle exists
 * only once it returns), so it runs on a worker under the poller's
 * deadline: past it the group fails on every rank, and the worker, if NCCL
 * never lets it go, is left to its continuation, which aborts what it made
 * should it ever return. Nonblocking communicators (an option) are polled
 * with ncclCommGetAsyncError instead, and an op they answer with
 * ncclInProgress is waited out in place, bounded by its timeout
 * (launch.c). */
#include "nccl_impl.h"

#include "gpu/nan_check.h"
#include "engine/env.h"

#include "engine/error.h"
#include "engine/log.h"
#include "engine/loop.h"
#include "engine/offload.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------------ event pool */

static struct nccl_event_pool *pool_new(int device)
{
    struct nccl_event_pool *p = calloc(1, sizeof *p);
    if (p == NULL)
        return NULL;
    uv_mutex_init(&p->mutex);
    p->refs = 1;
    p->device = device;
    p->timing = c10d__env_int(C10D_ENV_NCCL_ENABLE_TIMING) != 0;
    return p;
}

int c10d__nccl_event_get(struct nccl_event_pool *p, const struct c10d__gpu_api *api,
                         cudaEvent_t *ev)
{
    uv_mutex_lock(&p->mutex);
    if (p->n > 0) {
        *ev = p->free_events[--p->n];
        p->refs++;
        uv_mutex_unlock(&p->mutex);
        return 0;
    }
    p->refs++;
    uv_mutex_unlock(&p->mutex);
    /* Made on the pool's device: the caller has it current. */
    cudaError_t e = api->cuda.cudaEventCreateWithFlags(ev, p->timing ? 0 : cudaEventDisableTiming);
    if (e != cudaSuccess) {
        c10d__nccl_pool_unref(p, api);
        return c10d__fail(C10D_EIO, "nccl: cudaEventCreateWithFlags: %s",
                          api->cuda.cudaGetErrorString(e));
    }
    return 0;
}

void c10d__nccl_event_put(struct nccl_event_pool *p, const struct c10d__gpu_api *api,
                          cudaEvent_t ev)
{
    uv_mutex_lock(&p->mutex);
    if (!p->closed && p->n == p->cap) {
        size_t cap = p->cap ? 2 * p->cap : 16;
        cudaEvent_t *grown = realloc(p->free_events, cap * sizeof *grown);
        if (grown != NULL) {
            p->free_events = grown;
            p->cap = cap;
        }
    }
    int keep = !p->closed && p->n < p->cap;
    if (keep)
        p->free_events[p->n++] = ev;
    uv_mutex_unlock(&p->mutex);
    if (!keep)
        api->cuda.cudaEventDestroy(ev);
    c10d__nccl_pool_unref(p, api);
}

void c10d__nccl_pool_unref(struct nccl_event_pool *p, const struct c10d__gpu_api *api)
{
    uv_mutex_lock(&p->mutex);
    int last = --p->refs == 0;
    uv_mutex_unlock(&p->mutex);
    if (!last)
        return;
    for (size_t i = 0; i < p->n; i++)
        api->cuda.cudaEventDestroy(p->free_events[i]);
    free(p->free_events);
    uv_mutex_destroy(&p->mutex);
    free(p);
}

/* Closes the pool: events in it are destroyed, returned ones from now on. */
static void pool_close(struct nccl_event_pool *p, const struct c10d__gpu_api *api)
{
    uv_mutex_lock(&p->mutex);
    p->closed = 1;
    cudaEvent_t *evs = p->free_events;
    size_t n = p->n;
    p->free_events = NULL;
    p->n = p->cap = 0;
    uv_mutex_unlock(&p->mutex);
    for (size_t i = 0; i < n; i++)
        api->cuda.cudaEventDestroy(evs[i]);
    free(evs);
    c10d__nccl_pool_unref(p, api);
}

/* ----------------------------------------------------------------- start */

void c10d__nccl_comm_fail_start(struct nccl_comm *c, int status, const char *fmt, ...)
{
    int unclaimed = 0;
    if (!atomic_compare_exchange_strong(&c->init_claimed, &unclaimed, 1))
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->init_error, sizeof c->init_error, fmt, ap);
    va_end(ap);
    atomic_store(&c->init_status, status);
}

static void fill_config(const struct nccl_state *s, const struct nccl_comm *c, ncclConfig_t *cfg,
                        char *name, size_t namelen)
{
    ncclConfig_t init = NCCL_CONFIG_INITIALIZER;
    *cfg = init;
    /* A child made from a parent keeps its mode: NCCL runs the parent and
     * the child in one group, which cannot mix the two. */
    cfg->blocking = c->blocking;
    const c10d_nccl_opts *o = &s->nccl_opts;
    if (o->cga_cluster_size > 0)
        cfg->cgaClusterSize = o->cga_cluster_size;
    if (o->min_ctas > 0)
        cfg->minCTAs = o->min_ctas;
    if (o->max_ctas > 0)
        cfg->maxCTAs = o->max_ctas;
    if (o->net_name != NULL)
        cfg->netName = o->net_name;
    if (o->split_share)
        cfg->splitShare = 1;
    if (o->cta_policy > 0)
        cfg->CTAPolicy = o->cta_policy - 1;
    if (o->comm_name != NULL)
        snprintf(name, namelen, "%s", o->comm_name);
    else if (c->peer < 0)
        snprintf(name, namelen, "%.60s:%.100s", s->name, s->desc);
    else
        snprintf(name, namelen, "%.60s:%.100s:p2p %d-%d", s->name, s->desc,
                 s->rank < c->peer ? s->rank : c->peer, s->rank < c->peer ? c->peer : s->rank);
    cfg->commName = name;
}

/* Above C10D_NCCL_RANKS_PER_ROOT ranks, init goes through several
 * bootstrap roots (ncclCommInitRankScalable), so no single process accepts
 * every rank's connection. */
static int roots_for(int nranks)
{
    int64_t per = c10d__env_int(C10D_ENV_NCCL_RANKS_PER_ROOT);
    if (per < 1)
        per = 1;
    int64_t n = (nranks + per - 1) / per;
    return n < 1 ? 1 : n > C10D__NCCL_MAX_ROOTS ? C10D__NCCL_MAX_ROOTS : (int)n;
}

/* The rank that makes root i's unique id: the first rank NCCL assigns to
 * that root (the id carries the address of the bootstrap thread that
 * ncclGetUniqueId starts in the calling process). */
static int root_rank(int i, int nranks, int nroots)
{
    int rem = nranks % nroots;
    return i * (nranks / nroots) + (i < rem ? i : rem);
}

static void id_key(const struct nccl_comm *c, int i, int nroots, char *key, size_t len)
{
    if (nroots == 1)
        snprintf(key, len, "%s", c->key);
    else
        snprintf(key, len, "%s/root%d", c->key, i);
}

/* Worker: everything before polling. Errors land in c->init_error. */
static void start_work(void *arg)
{
    struct nccl_comm *c = arg;
    struct nccl_state *s = c->s;
    const struct c10d__gpu_api *api = s->api;
    cudaError_t e = api->cuda.cudaSetDevice(c->device);
    if (e != cudaSuccess) {
        c10d__nccl_comm_fail_start(c, C10D_EIO, "cudaSetDevice(%d): %s", c->device,
                                   api->cuda.cudaGetErrorString(e));
        return;
    }
    int lo, hi;
    api->cuda.cudaDeviceGetStreamPriorityRange(&lo, &hi);
    e = api->cuda.cudaStreamCreateWithPriority(&c->stream, cudaStreamNonBlocking,
                                               s->nccl_opts.high_priority_stream ? hi : 0);
    if (e == cudaSuccess)
        e = api->cuda.cudaMalloc(&c->barrier_buf, 16);
    if (e != cudaSuccess) {
        c10d__nccl_comm_fail_start(c, C10D_EIO, "cannot create the communicator's stream: %s",
                                   api->cuda.cudaGetErrorString(e));
        return;
    }
    if (s->nan_check) {
        if (c10d__nan_check_load() != 0) {
            c10d__nccl_comm_fail_start(c, C10D_EUNSUPPORTED, "%s", c10d_last_error());
            return;
        }
        /* Mapped and portable: with unified addressing every device
         * writes it through the host pointer. */
        void *flag = NULL;
        e = api->cuda.cudaHostAlloc(&flag, C10D__NCCL_NAN_SLOTS * sizeof *c->nan_flag,
                                    cudaHostAllocMapped | cudaHostAllocPortable);
        if (e != cudaSuccess) {
            c10d__nccl_comm_fail_start(c, C10D_EIO,
                                       "C10D_NCCL_NAN_CHECK: cannot allocate its flag: %s",
                                       api->cuda.cudaGetErrorString(e));
            return;
        }
        c->nan_flag = flag;
        for (int i = 0; i < C10D__NCCL_NAN_SLOTS; i++)
            c->nan_flag[i] = 0;
        /* CUDA loads a kernel lazily, at its first launch, and that load waits
         * for the device: behind a user's stream held by a host function it
         * never returned (seen on an H200). Loaded here, with nothing pending
         * yet; tag 0 marks no op, whatever the 16 bytes hold. */
        if (c10d__nan_check_launch(&api->cuda, c->barrier_buf, 4, C10D_FLOAT32,
                                   (uint64_t *)c->nan_flag, 0, c->stream) != 0 ||
            (e = api->cuda.cudaStreamSynchronize(c->stream)) != cudaSuccess) {
            c10d__nccl_comm_fail_start(c, C10D_EIO, "C10D_NCCL_NAN_CHECK: %s",
                                       e != cudaSuccess ? api->cuda.cudaGetErrorString(e)
                                                        : c10d_last_error());
            return;
        }
    }
    char name[256];
    ncclConfig_t cfg;
    fill_config(s, c, &cfg, name, sizeof name);
    ncclResult_t r;
    char buf[256];
    if (c->split_parent != NULL) {
        struct nccl_comm *p = c->split_parent;
        const char *fn = c->shrink_excluded != NULL ? "ncclCommShrink" : "ncclCommSplit";
        uv_mutex_lock(&p->lock);
        if (c->shrink_excluded != NULL)
            r = api->nccl.ncclCommShrink(p->comm, c->shrink_excluded, c->shrink_nexcluded, &c->comm,
                                         &cfg, c->shrink_flags);
        else
            r = api->nccl.ncclCommSplit(p->comm,
                                        c->split_color < 0 ? NCCL_SPLIT_NOCOLOR : c->split_color,
                                        c->split_key, &c->comm, &cfg);
        uv_mutex_unlock(&p->lock);
        if (r != ncclSuccess && r != ncclInProgress)
            c10d__nccl_comm_fail_start(c, C10D_EIO, "%s: %s", fn,
                                       c10d__nccl_error_text(api, r, buf, sizeof buf));
        return;
    }
    ncclUniqueId ids[C10D__NCCL_MAX_ROOTS];
    /* Without ncclCommInitRankScalable (NCCL < 2.23), one root. */
    int nroots = api->nccl.ncclCommInitRankScalable != NULL ? roots_for(c->nranks) : 1;
    for (int i = 0; i < nroots; i++) {
        if (c->rank != root_rank(i, c->nranks, nroots))
            continue;
        r = api->nccl.ncclGetUniqueId(&ids[i]);
        if (r != ncclSuccess) {
            c10d__nccl_comm_fail_start(c, C10D_EIO, "ncclGetUniqueId: %s",
                                       c10d__nccl_error_text(api, r, buf, sizeof buf));
            return;
        }
        char key[96];
        id_key(c, i, nroots, key, sizeof key);
        if (c10d_store_set_sync(c->store, key, &ids[i], sizeof ids[i]) != 0) {
            c10d__nccl_comm_fail_start(c, C10D_ESTORE, "cannot publish the unique id: %s",
                                       c10d_last_error());
            return;
        }
    }
    for (int i = 0; i < nroots; i++) {
        if (c->rank == root_rank(i, c->nranks, nroots))
            continue;
        char key[96];
        id_key(c, i, nroots, key, sizeof key);
        void *v = NULL;
        size_t len = 0;
        int rc = c10d_store_get_sync(c->store, key, &v, &len);
        if (rc != 0 || len != sizeof ids[i]) {
            c10d__nccl_comm_fail_start(
                c, rc != 0 ? rc : C10D_EPROTO,
                "no unique id from rank %d of the communicator (store key %s): %s",
                root_rank(i, c->nranks, nroots), key, rc != 0 ? c10d_last_error() : "wrong size");
            free(v);
            return;
        }
        memcpy(&ids[i], v, sizeof ids[i]);
        free(v);
    }
    if (nroots == 1) {
        r = api->nccl.ncclCommInitRankConfig(&c->comm, c->nranks, ids[0], c->rank, &cfg);
        if (r != ncclSuccess && r != ncclInProgress)
            c10d__nccl_comm_fail_start(c, C10D_EIO, "ncclCommInitRankConfig: %s",
                                       c10d__nccl_error_text(api, r, buf, sizeof buf));
        return;
    }
    r = api->nccl.ncclCommInitRankScalable(&c->comm, c->nranks, c->rank, nroots, ids, &cfg);
    if (r != ncclSuccess && r != ncclInProgress)
        c10d__nccl_comm_fail_start(c, C10D_EIO, "ncclCommInitRankScalable (%d roots): %s", nroots,
                                   c10d__nccl_error_text(api, r, buf, sizeof buf));
}

/* Loop, through the poller: is the nonblocking init (or split) done? */
static int init_ready(struct c10d__poll_item *item)
{
    struct nccl_comm *c =
        (struct nccl_comm *)((char *)item - offsetof(struct nccl_comm, init_item));
    const struct c10d__gpu_api *api = c->s->api;
    if (c->blocking && atomic_load(&c->start_busy)) {
        /* A blocking init is under way on a worker: only its deadline. The
         * worker stays in NCCL; closing the group waits for it off the loop
         * and aborts what it made, if it ever returns. */
        if (c10d__now_ms() - c->init_started_ms < (uint64_t)c->s->timeout_ms) {
            c10d__nccl_peer_error_poll(c->s);
            return 0;
        }
        c10d__nccl_comm_fail_start(
            c, C10D_ETIMEDOUT,
            "the NCCL communicator (%d ranks, blocking) did not finish initialising "
            "within %lld ms: a rank never joined, or its unique id never came",
            c->nranks, (long long)c->s->timeout_ms);
        return 1;
    }
    if (c->init_status != 0)
        return 1;
    ncclResult_t st = ncclSuccess, pst = ncclSuccess;
    if (c->comm != NULL)
        api->nccl.ncclCommGetAsyncError(c->comm, &st);
    if (c->split_parent != NULL) {
        /* The parent may have been closed meanwhile (its comm NULL or
         * aborted): then only the child's own state says anything. */
        struct nccl_comm *p = c->split_parent;
        uv_mutex_lock(&p->lock);
        if (p->comm != NULL && !atomic_load(&p->aborted_under))
            api->nccl.ncclCommGetAsyncError(p->comm, &pst);
        uv_mutex_unlock(&p->lock);
    }
    /* NCCL_SHRINK_ABORT ended the parent on purpose: its error is not ours. */
    if (c->shrink_excluded != NULL && (c->shrink_flags & NCCL_SHRINK_ABORT) &&
        pst != ncclInProgress)
        pst = ncclSuccess;
    if (st == ncclInProgress || pst == ncclInProgress) {
        if (c10d__now_ms() - c->init_started_ms < (uint64_t)c->s->timeout_ms) {
            c10d__nccl_peer_error_poll(c->s);
            return 0;
        }
        c10d__nccl_comm_fail_start(
            c, C10D_ETIMEDOUT,
            "the NCCL communicator (%d ranks) did not finish initialising within "
            "%lld ms: a rank never joined, or its unique id never came",
            c->nranks, (long long)c->s->timeout_ms);
        return 1;
    }
    char buf[256];
    if (st != ncclSuccess || pst != ncclSuccess)
        c10d__nccl_comm_fail_start(
            c, C10D_EIO, "NCCL communicator init failed: %s",
            c10d__nccl_error_text(api, st != ncclSuccess ? st : pst, buf, sizeof buf));
    return 1;
}

static void init_done(struct c10d__poll_item *item)
{
    struct nccl_comm *c =
        (struct nccl_comm *)((char *)item - offsetof(struct nccl_comm, init_item));
    c->s->up->comm_settled(c);
}

static void start_after(void *arg)
{
    struct nccl_comm *c = arg;
    int busy = START_BUSY;
    if (!atomic_compare_exchange_strong(&c->start_busy, &busy, START_IDLE)) {
        /* The group closed without us: its state may be gone; c is ours. */
        c10d__nccl_comm_orphan_release(c);
        return;
    }
    if (c->blocking)
        return; /* the init item, queued at the start, sees it */
    if (c->init_status != 0 || c->s->closing) {
        if (c->init_status == 0)
            c10d__nccl_comm_fail_start(c, C10D_EABORTED,
                                       "the group ended during communicator setup");
        c->s->up->comm_settled(c);
        return;
    }
    c->init_item.ready = init_ready;
    c->init_item.done = init_done;
    if (c10d__poll_push(&c->completions, &c->init_item) != 0) {
        c10d__nccl_comm_fail_start(c, C10D_EABORTED, "the engine is shutting down");
        c->s->up->comm_settled(c);
    }
}

static int comm_start(struct nccl_comm *c)
{
    c->init_started_ms = c10d__now_ms();
    atomic_store(&c->start_busy, START_BUSY);
    int rc = c10d__engine_offload(start_work, start_after, c);
    if (rc != 0) {
        atomic_store(&c->start_busy, START_IDLE);
        return rc;
    }
    /* Blocking: the worker returns only once init is over, so the deadline
     * is kept from now by the poller. */
    if (c->blocking) {
        c->init_item.ready = init_ready;
        c->init_item.done = init_done;
        if (c10d__poll_push(&c->completions, &c->init_item) != 0)
            c10d__nccl_comm_fail_start(c, C10D_EABORTED, "the engine is shutting down");
    }
    return 0;
}

static void comm_free(struct nccl_comm *c);

static struct nccl_comm *comm_new(struct nccl_state *s, int device, int peer)
{
    struct nccl_comm *c = calloc(1, sizeof *c);
    if (c != NULL)
        c->pool = pool_new(device);
    if (c == NULL || c->pool == NULL) {
        free(c);
        c10d__fail(C10D_ENOMEM, "nccl: out of memory");
        return NULL;
    }
    c->s = s;
    c->api = s->api;
    c->device = device;
    c->peer = peer;
    c->nranks = peer < 0 ? s->size : 2;
    c->rank = peer < 0 ? s->rank : s->rank < peer ? 0 : 1;
    c->blocking = !s->nccl_opts.nonblocking && !c10d__env_bool(C10D_ENV_NCCL_NONBLOCKING);
    c->store = s->store;
    c10d_store_retain(c->store);
    uv_mutex_init(&c->lock);
    uv_mutex_init(&c->defer_mu);
    atomic_init(&c->phase, COMM_STARTING);
    c10d__poll_queue_init(&c->completions);
    return c;
}

/* Names the store key of c's unique id and puts c on the group's list; under
 * s->mutex. The key cannot hold the device index: with one GPU per rank,
 * every rank makes the same communicator on a different device. It counts
 * instead the communicators of the same kind (the group's, or the pair's)
 * this rank made before, as PyTorch counts its communicators: ranks make
 * them in the same order, since they issue the same ops in the same order. */
static void comm_insert(struct nccl_state *s, struct nccl_comm *c)
{
    int before = 0;
    for (const struct nccl_comm *o = s->comms; o != NULL; o = o->next)
        before += o->peer == c->peer;
    if (c->peer < 0)
        snprintf(c->key, sizeof c->key, "nccl/uid/%d", before);
    else
        snprintf(c->key, sizeof c->key, "nccl/uid/p2p/%d-%d/%d",
                 s->rank < c->peer ? s->rank : c->peer, s->rank < c->peer ? c->peer : s->rank,
                 before);
    c->next = s->comms;
    s->comms = c;
}

static void start_task(void *arg)
{
    struct nccl_comm *c = arg;
    if (c->s->closing) {
        c10d__nccl_comm_fail_start(c, C10D_EABORTED,
                                   "the group ended before its communicator started");
        c->s->up->comm_settled(c);
        return;
    }
    if (comm_start(c) != 0) {
        c10d__nccl_comm_fail_start(c, C10D_EIO, "%s", c10d_last_error());
        c->s->up->comm_settled(c);
    }
}

struct nccl_comm *c10d__nccl_comm_get(struct nccl_state *s, int device, int peer)
{
    uv_mutex_lock(&s->mutex);
    struct nccl_comm *c = s->comms;
    while (c != NULL && (c->device != device || c->peer != peer))
        c = c->next;
    if (c != NULL) {
        uv_mutex_unlock(&s->mutex);
        return c;
    }
    c = comm_new(s, device, peer);
    if (c != NULL)
        comm_insert(s, c);
    uv_mutex_unlock(&s->mutex);
    if (c != NULL && c10d__engine_call(start_task, c) != 0) {
        /* Stays STARTING with nothing to settle it: the group is ending. */
        atomic_store(&c->phase, COMM_FAILED);
        return NULL;
    }
    return c;
}

int c10d__nccl_comm_start_eager(struct nccl_state *s, int device, c10d__backend_done_fn done,
                                void *arg)
{
    struct nccl_comm *c = comm_new(s, device, -1);
    if (c == NULL)
        return C10D_ENOMEM;
    c->ready_done = done;
    c->ready_arg = arg;
    uv_mutex_lock(&s->mutex);
    comm_insert(s, c);
    uv_mutex_unlock(&s->mutex);
    int rc = comm_start(c);
    if (rc != 0)
        c->ready_done = NULL; /* the caller reports the error; nobody settles */
    return rc;
}

int c10d__nccl_comm_split(struct nccl_state *child, struct nccl_state *parent_state,
                          struct nccl_comm *parent, int color, int key, c10d__backend_done_fn done,
                          void *arg)
{
    /* A rank without a color has no state of its own: its split record
     * lives in the parent's list, as a communicator that never becomes one. */
    struct nccl_state *owner = child != NULL ? child : parent_state;
    struct nccl_comm *c = comm_new(owner, parent->device, child != NULL ? -1 : -2);
    if (c == NULL)
        return C10D_ENOMEM;
    c->split_parent = parent;
    parent->children++;
    c->blocking = parent->blocking; /* NCCL's children keep the parent's mode */
    c->split_color = color;
    c->split_key = key;
    c->ready_done = done;
    c->ready_arg = arg;
    uv_mutex_lock(&owner->mutex);
    comm_insert(owner, c);
    uv_mutex_unlock(&owner->mutex);
    int rc = comm_start(c);
    if (rc != 0)
        c->ready_done = NULL;
    return rc;
}

int c10d__nccl_comm_shrink(struct nccl_state *child, struct nccl_comm *parent, const int *excluded,
                           int nexcluded, int nccl_flags, c10d__backend_done_fn done, void *arg)
{
    struct nccl_comm *c = comm_new(child, parent->device, -1);
    if (c == NULL)
        return C10D_ENOMEM;
    c->shrink_excluded = malloc((size_t)nexcluded * sizeof(int));
    if (c->shrink_excluded == NULL) {
        comm_free(c);
        return c10d__fail(C10D_ENOMEM, "nccl: out of memory");
    }
    memcpy(c->shrink_excluded, excluded, (size_t)nexcluded * sizeof(int));
    c->shrink_nexcluded = nexcluded;
    c->shrink_flags = nccl_flags;
    c->split_parent = parent;
    parent->children++;
    c->blocking = parent->blocking;
    c->ready_done = done;
    c->ready_arg = arg;
    uv_mutex_lock(&child->mutex);
    comm_insert(child, c);
    uv_mutex_unlock(&child->mutex);
    int rc = comm_start(c);
    if (rc != 0)
        c->ready_done = NULL;
    return rc;
}

/* ----------------------------------------------------------------- close */

struct close_job {
    const struct c10d__gpu_api *api;
    struct nccl_comm *comms; /* taken from the state */
    int abort;
    void (*done)(void *arg);
    void *arg;
};

/* Any thread: a thread stuck inside NCCL on c (a blocking launch waiting
 * for the peers) holds c->lock; abort the communicator under it, once, so
 * that it returns (nccl_impl.h, in_nccl). */
static void abort_under(struct nccl_comm *c)
{
    atomic_store(&c->aborting, 1);
    if (atomic_load(&c->in_nccl) && !atomic_exchange(&c->aborted_under, 1))
        c->api->nccl.ncclCommAbort(c->comm);
}

/* Any thread, with nobody else inside NCCL on c: its resources go. */
static void comm_release(struct nccl_comm *c, int abort)
{
    const struct c10d__gpu_api *api = c->api;
    /* NCCL's destroy and abort switch to the communicator's device and back:
     * back must not be a fresh worker's device 0. */
    c10d__gpu_use_device(&api->cuda, c->device);
    /* An abort first frees whoever is inside NCCL on this communicator; a
     * destroy waits for them (new callers see the group poisoned). */
    if (abort)
        abort_under(c);
    uv_mutex_lock(&c->lock);
    if (c->comm != NULL && !atomic_load(&c->aborted_under)) {
        if (abort)
            api->nccl.ncclCommAbort(c->comm);
        else
            api->nccl.ncclCommDestroy(c->comm);
    }
    c->comm = NULL;
    uv_mutex_unlock(&c->lock);
    if (c->stream != NULL) {
        if (!abort)
            api->cuda.cudaStreamSynchronize(c->stream);
        api->cuda.cudaStreamDestroy(c->stream);
        c->stream = NULL;
    }
    if (c->barrier_buf != NULL)
        api->cuda.cudaFree(c->barrier_buf);
    c->barrier_buf = NULL;
    if (c->nan_flag != NULL)
        api->cuda.cudaFreeHost((void *)c->nan_flag);
    c->nan_flag = NULL;
}

static void comm_free(struct nccl_comm *c)
{
    struct nccl_comm *parent = c->split_parent;
    c->split_parent = NULL;
    if (c->children > 0) { /* the last child frees it */
        c->free_deferred = 1;
        return;
    }
    if (parent != NULL && --parent->children == 0 && parent->free_deferred)
        comm_free(parent);
    if (c->pool != NULL) {
        c10d__gpu_use_device(&c->api->cuda, c->device); /* its events' */
        pool_close(c->pool, c->api);
    }
    uv_mutex_destroy(&c->lock);
    uv_mutex_destroy(&c->defer_mu);
    c10d_store_release(c->store);
    free(c->shrink_excluded);
    free(c);
}

static void orphan_work(void *arg)
{
    comm_release(arg, 1);
}

static void orphan_after(void *arg)
{
    comm_free(arg);
}

void c10d__nccl_comm_orphan_release(struct nccl_comm *c)
{
    if (c10d__engine_offload(orphan_work, orphan_after, c) != 0)
        orphan_after(c);
}

static void close_work(void *arg)
{
    struct close_job *j = arg;
    struct nccl_comm **pp = &j->comms;
    while (*pp != NULL) {
        struct nccl_comm *c = *pp;
        /* A start still under way (a blocking init may never return) is
         * left to its own continuation, which aborts what it made. */
        int busy = START_BUSY;
        struct nccl_comm *next = c->next;
        if (atomic_compare_exchange_strong(&c->start_busy, &busy, START_ORPHANED)) {
            /* Its worker may be stuck issuing the first ops: free it. */
            if (j->abort)
                abort_under(c);
            *pp = next;
            continue;
        }
        comm_release(c, j->abort);
        pp = &c->next;
    }
}

static void close_after(void *arg)
{
    struct close_job *j = arg;
    while (j->comms != NULL) {
        struct nccl_comm *c = j->comms;
        j->comms = c->next;
        comm_free(c);
    }
    if (j->done != NULL)
        j->done(j->arg);
    free(j);
}

void c10d__nccl_comms_close(struct nccl_state *s, int abort, void (*done)(void *arg), void *arg)
{
    struct close_job *j = calloc(1, sizeof *j);
    uv_mutex_lock(&s->mutex);
    struct nccl_comm *comms = s->comms;
    if (j != NULL)
        s->comms = NULL;
    uv_mutex_unlock(&s->mutex);
    if (j == NULL) {
        /* No memory to close them properly: leak them, say so, go on. */
        C10D_WARN("nccl", "group %s: out of memory closing communicators", s->name);
        if (done != NULL)
            done(arg);
        return;
    }
    *j = (struct close_job){s->api, comms, abort, done, arg};
    if (comms == NULL || c10d__engine_offload(close_work, close_after, j) != 0)
        close_after(j);
}
