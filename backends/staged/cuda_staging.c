/* CUDA buffers on the tcp backend ("cuda:tcp"), as torch's gloo does them:
 * each op is staged through pinned host memory around an ordinary tcp op.
 *
 *   caller's thread (submit, in submission order):
 *     record `start` on the caller's stream; the side stream waits for it and
 *     copies the op's inputs device -> pinned host, then records `in`; the
 *     caller's stream waits for `in`, so a write the caller enqueues after the
 *     call cannot reach the copy, while one enqueued before it does;
 *   loop, once `in` fired (the completion poller, in order):
 *     the host op runs on the inner tcp state over the pinned copies;
 *   loop, once it completed:
 *     the side stream copies the outputs host -> device and records `end`;
 *   loop, once `end` fired: the user's work completes.
 *
 * c10d_work_wait_stream makes a stream wait for `end` without blocking the
 * host (once `end` is recorded; before that it waits on the host, as there
 * is nothing on a stream to wait for yet). As with torch's gloo, an op's
 * outputs are in place only then: a later op on the same buffers must come
 * after a wait (host or stream), or its input copy may run first.
 *
 * A large elementwise op (all_reduce, broadcast, reduce) goes in segments
 * (parts), each with its own input event and host op, so that one part's
 * copies overlap another's transfer; the end event follows the last part's
 * output copy.
 *
 * Pinned buffers come from a per-group pool, reused across ops, bounded by
 * C10D_TCP_CUDA_STAGING_MAX bytes kept idle, freed at destroy.
 *
 * Over 800 lines because an op's three stages and their events, parts and
 * pool buffers form one lifetime that reads best in one place. */
#include "backends/backend.h"
#include "gpu/gpu_api.h"

#include "engine/env.h"
#include "engine/error.h"
#include "engine/loop.h"
#include "engine/offload.h"
#include "engine/poller.h"
#include "engine/work.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEVICES 64
#define MAX_PARTS   256

struct staging_block {
    struct staging_block *next;
    size_t cap;
    char *mem;  /* cudaHostAlloc'd */
    int device; /* current when it was allocated: freed with it current */
};

struct staged_state {
    const struct c10d__cudart_api *cu;
    void *inner; /* the tcp state running the host ops */
    int rank, size;
    uv_mutex_t mu;                      /* streams, pool */
    cudaStream_t side[MAX_DEVICES];     /* input copies, in submission order */
    cudaStream_t out_side[MAX_DEVICES]; /* output copies: never behind a later op's input */
    struct staging_block *free_blocks;
    size_t idle_bytes, idle_max;
    struct c10d__poll_queue in_q, out_q; /* inputs copied; outputs copied */
    atomic_int aborted;
    int refs; /* the owner's and each op's; loop thread after create */
    c10d__backend_done_fn destroy_done;
    void *destroy_arg;
};

/* One device buffer of the op. An in-place form may name one pointer with
 * two sizes (all_gather's input is block 0 of its output on rank 0): one
 * segment, copied in over in_len and out over out_len bytes from its start. */
struct seg {
    void *dev;
    char *host;
    size_t bytes; /* the larger */
    size_t in_len, out_len;
};

/* A piece of an op staged on its own: the whole op, or one segment of a
 * large elementwise op, so that one segment's copies overlap another's
 * transfer. */
struct part {
    struct c10d__poll_item item; /* first: in the state's in_q until its inputs are in */
    struct staged_op *so;
    int k;
    size_t lo, hi; /* element range of a segment (whole op: 0, 0) */
    cudaEvent_t in_ev;
    struct c10d__op *host; /* the host op (list) it runs */
    c10d_work *inner_work;
};

struct staged_op {
    struct c10d__poll_item item; /* first: in the state's out_q until the outputs are back */
    struct staged_state *s;
    struct c10d__op *user; /* the group's record: read only until the work completes */
    c10d_work *work;       /* the user's work: our reference until the op is finished */
    enum c10d__op_kind kind;
    uint64_t seq;
    struct c10d__op *hosts; /* the same op (list) over the pinned copies */
    int nmembers;
    struct part *parts;
    int nparts;
    struct c10d__op *seg_hosts; /* segmented: one host op per part */
    size_t esize;
    atomic_int pending; /* callbacks still to come (parts, inner ops, outputs) */
    int parts_out;      /* parts whose outputs are on the copy stream */
    int device;
    cudaEvent_t start_ev, end_ev;
    atomic_int end_recorded;
    int in_recorded;  /* input copies were enqueued */
    int out_started;  /* output copies may have been enqueued */
    int tainted;      /* a copy may run with no event to tell when it is done */
    struct seg *segs; /* one per distinct device buffer: grows (a list form has 2 x ranks) */
    int nsegs, capsegs;
    void **host_lists; /* per member: host copies of sends / recvs (list forms) */
    size_t *counts;    /* per member: copies of send_counts / recv_counts (all_to_all) */
    struct staging_block *block;
};

static void state_unref(struct staged_state *s);

/* ----------------------------------------------------------- the pool */

static struct staging_block *block_get(struct staged_state *s, size_t bytes)
{
    uv_mutex_lock(&s->mu);
    struct staging_block **pp = &s->free_blocks, *b = NULL;
    for (; *pp != NULL; pp = &(*pp)->next)
        if ((*pp)->cap >= bytes) {
            b = *pp;
            *pp = b->next;
            s->idle_bytes -= b->cap;
            break;
        }
    uv_mutex_unlock(&s->mu);
    if (b != NULL)
        return b;
    b = calloc(1, sizeof *b);
    if (b == NULL)
        return NULL;
    /* Rounded up so that ops of similar sizes share blocks. */
    size_t cap = 4096;
    while (cap < bytes)
        cap *= 2;
    b->device = -1;
    s->cu->cudaGetDevice(&b->device);
    if (s->cu->cudaHostAlloc((void **)&b->mem, cap, cudaHostAllocPortable) != cudaSuccess) {
        free(b);
        return NULL;
    }
    b->cap = cap;
    return b;
}

/* cudaFreeHost waits for the whole device: never on the loop or a caller's
 * thread, where a busy or stuck GPU would stall everything. */
struct host_free {
    const struct c10d__cudart_api *cu;
    struct staging_block *blocks;
};

/* The worker owns hf: `after` does not run once the engine has shut down. */
static void host_free_work(void *arg)
{
    struct host_free *hf = arg;
    for (struct staging_block *b = hf->blocks, *next; b != NULL; b = next) {
        next = b->next;
        c10d__gpu_use_device(hf->cu, b->device);
        hf->cu->cudaFreeHost(b->mem);
        free(b);
    }
    free(hf);
}

static void host_free_after(void *arg)
{
    (void)arg;
}

static void blocks_free(const struct c10d__cudart_api *cu, struct staging_block *blocks)
{
    if (blocks == NULL)
        return;
    struct host_free *hf = malloc(sizeof *hf);
    if (hf == NULL)
        return; /* left pinned until the process ends */
    *hf = (struct host_free){cu, blocks};
    if (c10d__engine_offload(host_free_work, host_free_after, hf) != 0)
        host_free_work(hf); /* the engine is gone: there is no loop left to stall */
}

static void block_put(struct staged_state *s, struct staging_block *b)
{
    if (b == NULL)
        return;
    uv_mutex_lock(&s->mu);
    int keep = s->idle_bytes + b->cap <= s->idle_max;
    if (keep) {
        b->next = s->free_blocks;
        s->free_blocks = b;
        s->idle_bytes += b->cap;
    }
    uv_mutex_unlock(&s->mu);
    if (!keep) {
        b->next = NULL;
        blocks_free(s->cu, b);
    }
}

/* ------------------------------------------------------ the op's bytes */

static int seg_add(struct staged_op *so, const void *dev, size_t bytes, int in, int out)
{
    if (dev == NULL || bytes == 0)
        return 0;
    struct seg *g = NULL;
    for (int i = 0; i < so->nsegs && g == NULL; i++)
        if (so->segs[i].dev == dev)
            g = &so->segs[i];
    if (g == NULL) {
        if (so->nsegs == so->capsegs) {
            int cap = so->capsegs > 0 ? 2 * so->capsegs : 16;
            struct seg *more = realloc(so->segs, (size_t)cap * sizeof *more);
            if (more == NULL)
                return c10d__fail(C10D_ENOMEM, "tcp (cuda): out of memory for %d buffers", cap);
            so->segs = more;
            so->capsegs = cap;
        }
        g = &so->segs[so->nsegs++];
        *g = (struct seg){(void *)dev, NULL, 0, 0, 0};
    }
    if (bytes > g->bytes)
        g->bytes = bytes;
    if (in && bytes > g->in_len)
        g->in_len = bytes;
    if (out && bytes > g->out_len)
        g->out_len = bytes;
    return 0;
}

static char *host_of(struct staged_op *so, const void *dev)
{
    if (dev == NULL)
        return NULL;
    for (int i = 0; i < so->nsegs; i++)
        if (so->segs[i].dev == dev)
            return so->segs[i].host;
    return NULL;
}

static size_t sum(const size_t *counts, int n)
{
    size_t t = 0;
    for (int i = 0; i < n; i++)
        t += counts[i];
    return t;
}

/* Which device bytes the op reads and writes, as the group checked them. */
static int plan(struct staged_op *so, const struct c10d__op *op, int size)
{
    size_t es = c10d_dtype_size(op->dtype), n = op->count, z = (size_t)size;
    switch (op->kind) {
    case C10D_OP_ALL_REDUCE:
        C10D_CHECK(seg_add(so, op->send, n * es, 1, 0));
        return seg_add(so, op->recv, n * es, 0, 1);
    case C10D_OP_BROADCAST: /* only the root's input is read */
        if (so->s->rank == op->root)
            C10D_CHECK(seg_add(so, op->send, n * es, 1, 0));
        return seg_add(so, op->recv, n * es, 0, 1);
    case C10D_OP_REDUCE: /* only the root's output is written */
        C10D_CHECK(seg_add(so, op->send, n * es, 1, 0));
        return so->s->rank == op->root ? seg_add(so, op->recv, n * es, 0, 1) : 0;
    case C10D_OP_ALL_GATHER:
    case C10D_OP_GATHER:
        C10D_CHECK(seg_add(so, op->send, n * es, 1, 0));
        if (op->recvs != NULL) {
            for (int r = 0; r < size; r++)
                C10D_CHECK(seg_add(so, op->recvs[r], n * es, 0, 1));
            return 0;
        }
        return seg_add(so, op->recv, n * z * es, 0, 1);
    case C10D_OP_SCATTER:
    case C10D_OP_REDUCE_SCATTER:
        if (op->sends != NULL) {
            for (int r = 0; r < size; r++)
                C10D_CHECK(seg_add(so, op->sends[r], n * es, 1, 0));
        } else {
            C10D_CHECK(seg_add(so, op->send, n * z * es, 1, 0));
        }
        return seg_add(so, op->recv, n * es, 0, 1);
    case C10D_OP_ALL_TO_ALL:
        if (op->sends != NULL) {
            for (int r = 0; r < size; r++) {
                C10D_CHECK(seg_add(so, op->sends[r], op->send_counts[r] * es, 1, 0));
                C10D_CHECK(seg_add(so, op->recvs[r], op->recv_counts[r] * es, 0, 1));
            }
            return 0;
        }
        C10D_CHECK(
            seg_add(so, op->send, (op->send_counts ? sum(op->send_counts, size) : n) * es, 1, 0));
        return seg_add(so, op->recv, (op->recv_counts ? sum(op->recv_counts, size) : n) * es, 0, 1);
    case C10D_OP_SEND:
        return seg_add(so, op->send, n * es, 1, 0);
    case C10D_OP_RECV:
        return seg_add(so, op->recv, n * es, 0, 1);
    case C10D_OP_BARRIER:
        return 0;
    default:
        return c10d__fail(C10D_EUNSUPPORTED, "tcp (cuda): op kind %d", (int)op->kind);
    }
}

/* The host op (list): the user's, over the pinned copies. Its lists and
 * counts are the op's own: the host op may outlive the group's record (a
 * timeout aborts it while the inner op still runs). */
static int rewrite(struct staged_op *so, int size)
{
    int n = 0;
    for (const struct c10d__op *u = so->user; u != NULL; u = u->next)
        n++;
    so->nmembers = n;
    so->hosts = calloc((size_t)n, sizeof *so->hosts);
    so->host_lists = calloc(2 * (size_t)size * (size_t)n, sizeof(void *));
    so->counts = calloc(2 * (size_t)size * (size_t)n, sizeof(size_t));
    if (so->hosts == NULL || so->host_lists == NULL || so->counts == NULL)
        return c10d__fail(C10D_ENOMEM, "tcp (cuda): out of memory");
    int m = 0;
    for (const struct c10d__op *u = so->user; u != NULL; u = u->next, m++) {
        struct c10d__op *h = &so->hosts[m];
        void **lists = so->host_lists + 2 * (size_t)size * (size_t)m;
        size_t *counts = so->counts + 2 * (size_t)size * (size_t)m;
        *h = *u;
        h->next = m + 1 < n ? &so->hosts[m + 1] : NULL;
        h->device_type = C10D_DEVICE_CPU;
        h->device_index = -1;
        h->stream = NULL;
        h->send = host_of(so, u->send);
        h->recv = host_of(so, u->recv);
        for (int r = 0; r < size; r++) {
            if (u->sends != NULL)
                lists[r] = host_of(so, u->sends[r]);
            if (u->recvs != NULL)
                lists[size + r] = host_of(so, u->recvs[r]);
            if (u->send_counts != NULL)
                counts[r] = u->send_counts[r];
            if (u->recv_counts != NULL)
                counts[size + r] = u->recv_counts[r];
        }
        h->sends = u->sends != NULL ? (const void *const *)lists : NULL;
        h->recvs = u->recvs != NULL ? (void *const *)(lists + size) : NULL;
        h->send_counts = u->send_counts != NULL ? counts : NULL;
        h->recv_counts = u->recv_counts != NULL ? counts + size : NULL;
    }
    return 0;
}

/* ---------------------------------------------------------- lifetime */

static void op_free(struct staged_op *so)
{
    struct staged_state *s = so->s;
    const struct c10d__cudart_api *cu = s->cu;
    int prev = c10d__gpu_switch_device(cu, so->device); /* any thread: the last release's */
    /* A copy may still run into or out of the block (the op timed out or
     * was aborted while it was queued): the block is then never reused, nor
     * freed (cudaFreeHost would wait for the device, possibly forever). */
    cudaEvent_t last = atomic_load(&so->end_recorded)      ? so->end_ev
                       : so->in_recorded && so->nparts > 0 ? so->parts[so->nparts - 1].in_ev
                                                           : NULL;
    int idle = last == NULL || cu->cudaEventQuery(last) == cudaSuccess;
    if (so->tainted || (so->out_started && !atomic_load(&so->end_recorded)))
        idle = 0; /* some copies went out with no event behind them */
    cudaEvent_t evs[2] = {so->start_ev, so->end_ev};
    for (int i = 0; i < 2; i++)
        if (evs[i] != NULL)
            cu->cudaEventDestroy(evs[i]);
    for (int k = 0; k < so->nparts; k++) {
        if (so->parts[k].in_ev != NULL)
            cu->cudaEventDestroy(so->parts[k].in_ev);
        if (so->parts[k].inner_work != NULL)
            c10d_work_release(so->parts[k].inner_work);
    }
    c10d__gpu_restore_device(cu, prev);
    free(so->parts);
    free(so->seg_hosts);
    if (idle)
        block_put(s, so->block);
    else if (so->block != NULL)
        free(so->block); /* the pinned memory is left to the copy */
    free(so->hosts);
    free(so->host_lists);
    free(so->counts);
    free(so->segs);
    free(so);
}

/* The work's payload: freed with the work, after the stream hook's last use. */
static const int payload_kind;

static void payload_free(void *p)
{
    struct staged_op *so = p;
    struct staged_state *s = so->s;
    op_free(so);
    state_unref(s);
}

static int stream_wait(c10d_work *w, void *stream, void *arg)
{
    struct staged_op *so = arg;
    if (!atomic_load(&so->end_recorded) || c10d_work_test(w))
        return c10d_work_wait(w, -1) < 0 ? c10d_work_status(w) : 0;
    C10D__CUDA_CHECK(so->s->cu, so->s->cu->cudaStreamWaitEvent((cudaStream_t)stream, so->end_ev, 0),
                     "c10d_work_wait_stream: cudaStreamWaitEvent");
    return 0;
}

/* -------------------------------------------------------------- phases */

/* One of the op's outstanding callbacks is over; with the last, our
 * reference on the user's work goes (and with the work's last one, the op). */
static void settle(struct staged_op *so)
{
    if (atomic_fetch_sub(&so->pending, 1) > 1)
        return;
    c10d_work *w = so->work;
    so->work = NULL;
    c10d_work_release(w);
}

/* Completes the user's work unless it already is (the first word wins). A
 * failure of ours also fails the inner tcp state, so that the peers, which
 * may wait for this rank's part, fail too instead of waiting for the timeout. */
static void fail_op(struct staged_op *so, int status, const char *why)
{
    if (c10d_work_test(so->work))
        return;
    c10d__work_complete(so->work, status, "tcp (cuda) %s seq %llu: %s",
                        c10d__op_kind_name(so->kind), (unsigned long long)so->seq, why);
    if (status != C10D_EABORTED && !atomic_exchange(&so->s->aborted, 1) && so->s->inner != NULL)
        c10d__tcp_backend.abort(so->s->inner, status, c10d_work_message(so->work), NULL, NULL);
}

static int event_ready(const struct c10d__cudart_api *cu, cudaEvent_t ev, int *failed)
{
    cudaError_t e = cu->cudaEventQuery(ev);
    *failed = e != cudaSuccess && e != cudaErrorNotReady;
    return e != cudaErrorNotReady;
}

static int part_ready(struct c10d__poll_item *item)
{
    struct part *pt = (struct part *)item;
    if (atomic_load(&pt->so->s->aborted) || c10d_work_test(pt->so->work))
        return 1;
    int failed;
    c10d__gpu_use_device(pt->so->s->cu, pt->so->device);
    return event_ready(pt->so->s->cu, pt->in_ev, &failed);
}

static void host_done(c10d_work *w, int status, void *arg);

/* A part's inputs are in pinned memory: its host op runs. */
static void part_done(struct c10d__poll_item *item)
{
    struct part *pt = (struct part *)item;
    struct staged_op *so = pt->so;
    struct staged_state *s = so->s;
    int failed = 0;
    if (!c10d_work_test(so->work)) {
        event_ready(s->cu, pt->in_ev, &failed);
        if (failed)
            fail_op(so, C10D_EIO, "copying the inputs to the host failed");
        else if (atomic_load(&s->aborted))
            fail_op(so, C10D_EABORTED, "the group was aborted");
        else if (c10d__work_create(&pt->inner_work, "tcp (cuda) host op", 0) != 0 ||
                 c10d__work_on_complete(pt->inner_work, host_done, pt) != 0)
            fail_op(so, C10D_ENOMEM, "out of memory");
        else {
            atomic_fetch_add(&so->pending, 1);
            for (struct c10d__op *h = pt->host; h != NULL; h = h->next)
                h->work = pt->inner_work;
            if (c10d__tcp_backend.submit(s->inner, pt->host) != 0)
                c10d__work_complete(pt->inner_work, C10D_EABORTED, "%s", c10d_last_error());
        }
    }
    settle(so);
}

static int copy_outputs(struct staged_op *so, struct part *pt, cudaStream_t side)
{
    const struct c10d__cudart_api *cu = so->s->cu;
    cudaError_t e = cudaSuccess;
    for (int i = 0; i < so->nsegs && e == cudaSuccess; i++) {
        struct seg *g = &so->segs[i];
        if (g->out_len == 0)
            continue;
        size_t off = pt->hi > 0 ? pt->lo * so->esize : 0;
        size_t len = pt->hi > 0 ? (pt->hi - pt->lo) * so->esize : g->out_len;
        e = cu->cudaMemcpyAsync((char *)g->dev + off, g->host + off, len, cudaMemcpyHostToDevice,
                                side);
    }
    return e;
}

/* A part's host op finished: its outputs go back to the device; after the
 * last part's, the end event. */
static void host_done(c10d_work *w, int status, void *arg)
{
    struct part *pt = arg;
    struct staged_op *so = pt->so;
    struct staged_state *s = so->s;
    if (c10d_work_test(so->work)) {
        settle(so); /* its buffers may be gone: nothing is written into them */
        return;
    }
    if (status == 0 && atomic_load(&s->aborted)) {
        fail_op(so, C10D_EABORTED, "the group was aborted");
        settle(so);
        return;
    }
    if (status != 0) {
        /* The inner message numbers the host op (seq << 16 | part): name the user's op too. */
        c10d__work_complete(so->work, status, "tcp (cuda) %s seq %llu (part %d of %d): %s",
                            c10d__op_kind_name(so->kind), (unsigned long long)so->seq, pt->k + 1,
                            so->nparts, c10d_work_message(w));
        settle(so);
        return;
    }
    const struct c10d__cudart_api *cu = s->cu;
    cudaStream_t side = s->out_side[so->device];
    c10d__gpu_use_device(cu, so->device); /* the loop thread */
    cudaError_t e = cudaSuccess;
    so->out_started = 1;
    if (e == cudaSuccess)
        e = copy_outputs(so, pt, side);
    if (e == cudaSuccess && ++so->parts_out == so->nparts) {
        e = cu->cudaEventRecord(so->end_ev, side);
        if (e == cudaSuccess) {
            atomic_store(&so->end_recorded, 1);
            atomic_fetch_add(&so->pending, 1); /* before the loop can run it */
            if (c10d__poll_push(&s->out_q, &so->item) != 0) {
                atomic_fetch_sub(&so->pending, 1);
                fail_op(so, C10D_EABORTED, "the engine is stopping");
            }
        }
    }
    if (e != cudaSuccess) {
        char why[256];
        snprintf(why, sizeof why, "copying the outputs back: %s", cu->cudaGetErrorString(e));
        fail_op(so, C10D_EIO, why);
    }
    settle(so);
}

static int outputs_ready(struct c10d__poll_item *item)
{
    struct staged_op *so = (struct staged_op *)item;
    if (atomic_load(&so->s->aborted) || c10d_work_test(so->work))
        return 1;
    int failed;
    c10d__gpu_use_device(so->s->cu, so->device);
    return event_ready(so->s->cu, so->end_ev, &failed);
}

static void outputs_done(struct c10d__poll_item *item)
{
    struct staged_op *so = (struct staged_op *)item;
    int failed;
    event_ready(so->s->cu, so->end_ev, &failed);
    if (failed)
        fail_op(so, C10D_EIO, "copying the outputs to the device failed");
    else if (atomic_load(&so->s->aborted))
        fail_op(so, C10D_EABORTED, "the group was aborted");
    else if (!c10d_work_test(so->work))
        c10d__work_complete(so->work, 0, NULL);
    settle(so);
}

/* ------------------------------------------------------------- vtable */

/* How the op is staged: whole, or, for a large elementwise op (all_reduce,
 * broadcast, reduce), in segments of about C10D_TCP_CUDA_SEGMENT bytes, each
 * its own host op, so that one segment's copies overlap another's transfer.
 * Host ops take their own sequence numbers, (seq << 16) | part, in the
 * inner tcp state, which nothing else uses. */
static int split_parts(struct staged_op *so, const struct c10d__op *op)
{
    size_t seg = (size_t)c10d__env_int(C10D_ENV_TCP_CUDA_SEGMENT);
    size_t bytes = op->count * so->esize;
    int elementwise =
        op->next == NULL && (op->kind == C10D_OP_ALL_REDUCE || op->kind == C10D_OP_BROADCAST ||
                             op->kind == C10D_OP_REDUCE);
    size_t n = elementwise && seg > 0 && bytes > seg ? (bytes + seg - 1) / seg : 1;
    if (n > op->count)
        n = op->count > 0 ? op->count : 1;
    if (n > MAX_PARTS)
        n = MAX_PARTS; /* segments grow instead: each part costs a host op */
    so->parts = calloc(n, sizeof *so->parts);
    if (so->parts == NULL)
        return c10d__fail(C10D_ENOMEM, "tcp (cuda): out of memory");
    so->nparts = (int)n;
    if (n > 1 && (so->seg_hosts = calloc(n, sizeof *so->seg_hosts)) == NULL)
        return c10d__fail(C10D_ENOMEM, "tcp (cuda): out of memory");
    for (size_t k = 0; k < n; k++) {
        struct part *pt = &so->parts[k];
        pt->so = so;
        pt->k = (int)k;
        pt->item.ready = part_ready;
        pt->item.done = part_done;
        if (n == 1) {
            pt->host = &so->hosts[0];
        } else {
            pt->lo = (size_t)((unsigned __int128)op->count * k / n);
            pt->hi = (size_t)((unsigned __int128)op->count * (k + 1) / n);
            struct c10d__op *h = &so->seg_hosts[k];
            *h = so->hosts[0];
            h->count = pt->hi - pt->lo;
            h->send = h->send != NULL ? (const char *)h->send + pt->lo * so->esize : NULL;
            h->recv = h->recv != NULL ? (char *)h->recv + pt->lo * so->esize : NULL;
            pt->host = h;
        }
        for (struct c10d__op *h = pt->host; h != NULL; h = h->next)
            h->seq = (so->seq << 16) | k;
    }
    return 0;
}

static int staged_check(const struct c10d__op *op)
{
    if (op->device_type != C10D_DEVICE_CUDA)
        return c10d__fail(C10D_EUNSUPPORTED, "tcp (cuda): only CUDA buffers go this way");
    if (op->device_index < 0 || op->device_index >= MAX_DEVICES)
        return c10d__fail(C10D_EINVAL, "tcp (cuda): invalid device index %d", op->device_index);
    for (const struct c10d__op *o = op; o != NULL; o = o->next)
        if (o->redop == C10D_PREMUL_SUM && o->premul_factor_dev != NULL)
            return c10d__fail(C10D_EINVAL,
                              "tcp (cuda): opts.premul_factor_dev needs NCCL (the host reduces "
                              "here): pass the factor in opts.premul_factor");
    struct c10d__op h = *op;
    h.device_type = C10D_DEVICE_CPU;
    return c10d__tcp_backend.check(&h);
}

static int staged_submit(void *state, struct c10d__op *op)
{
    struct staged_state *s = state;
    const struct c10d__cudart_api *cu = s->cu;
    struct staged_op *so = calloc(1, sizeof *so);
    if (so == NULL)
        return c10d__fail(C10D_ENOMEM, "tcp (cuda): out of memory");
    so->s = s;
    so->user = op;
    so->kind = op->kind;
    so->seq = op->seq;
    so->device = op->device_index;
    so->item.ready = outputs_ready;
    so->item.done = outputs_done;
    so->esize = c10d_dtype_size(op->dtype);
    int rc = 0;
    for (const struct c10d__op *m = op; m != NULL && rc == 0; m = m->next)
        rc = plan(so, m, s->size);
    size_t total = 0;
    for (int i = 0; i < so->nsegs; i++)
        total += (so->segs[i].bytes + 255) & ~(size_t)255;
    if (rc == 0 && total > 0 && (so->block = block_get(s, total)) == NULL)
        rc = c10d__fail(C10D_ENOMEM, "tcp (cuda): no pinned memory for %zu bytes", total);
    size_t off = 0;
    for (int i = 0; i < so->nsegs && rc == 0; i++) {
        so->segs[i].host = so->block->mem + off;
        off += (so->segs[i].bytes + 255) & ~(size_t)255;
    }
    if (rc == 0)
        rc = rewrite(so, s->size);
    if (rc == 0)
        rc = split_parts(so, op);
    if (rc != 0) {
        op_free(so);
        return rc;
    }
#define CU(expr, what)                                                                             \
    do {                                                                                           \
        cudaError_t e_ = (expr);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            rc = c10d__fail(C10D_EIO, "tcp (cuda): %s: %s", what, cu->cudaGetErrorString(e_));     \
            goto fail;                                                                             \
        }                                                                                          \
    } while (0)
    int prev_device = -1;
    cu->cudaGetDevice(&prev_device);
    CU(cu->cudaSetDevice(so->device), "cudaSetDevice");
    uv_mutex_lock(&s->mu);
    cudaError_t se = cudaSuccess;
    if (s->side[so->device] == NULL)
        se = cu->cudaStreamCreateWithPriority(&s->side[so->device], cudaStreamNonBlocking, 0);
    if (se == cudaSuccess && s->out_side[so->device] == NULL)
        se = cu->cudaStreamCreateWithPriority(&s->out_side[so->device], cudaStreamNonBlocking, 0);
    uv_mutex_unlock(&s->mu);
    CU(se, "creating the copy stream");
    cudaStream_t side = s->side[so->device], caller = (cudaStream_t)op->stream;
    CU(cu->cudaEventCreateWithFlags(&so->start_ev, cudaEventDisableTiming), "cudaEventCreate");
    CU(cu->cudaEventCreateWithFlags(&so->end_ev, cudaEventDisableTiming), "cudaEventCreate");
    for (int k = 0; k < so->nparts; k++)
        CU(cu->cudaEventCreateWithFlags(&so->parts[k].in_ev, cudaEventDisableTiming),
           "cudaEventCreate");
    CU(cu->cudaEventRecord(so->start_ev, caller), "cudaEventRecord");
    CU(cu->cudaStreamWaitEvent(side, so->start_ev, 0), "cudaStreamWaitEvent");
    so->in_recorded = 1; /* from here copies may be in flight */
    for (int k = 0; k < so->nparts; k++) {
        struct part *pt = &so->parts[k];
        for (int i = 0; i < so->nsegs; i++) {
            struct seg *g = &so->segs[i];
            if (g->in_len == 0)
                continue;
            size_t from = pt->hi > 0 ? pt->lo * so->esize : 0;
            size_t len = pt->hi > 0 ? (pt->hi - pt->lo) * so->esize : g->in_len;
            CU(cu->cudaMemcpyAsync(g->host + from, (char *)g->dev + from, len,
                                   cudaMemcpyDeviceToHost, side),
               "copying an input to the host");
        }
        CU(cu->cudaEventRecord(pt->in_ev, side), "cudaEventRecord");
    }
    /* Later work on the caller's stream may overwrite the inputs: after the copy. */
    CU(cu->cudaStreamWaitEvent(caller, so->parts[so->nparts - 1].in_ev, 0), "cudaStreamWaitEvent");
#undef CU
    if (prev_device >= 0 && prev_device != so->device)
        cu->cudaSetDevice(prev_device); /* the caller's thread keeps its device */
    uv_mutex_lock(&s->mu);
    s->refs++;
    uv_mutex_unlock(&s->mu);
    c10d__work_set_payload(op->work, &payload_kind, so, payload_free);
    c10d__work_set_stream_wait(op->work, stream_wait, so);
    c10d_work_retain(op->work);
    so->work = op->work;
    atomic_store(&so->pending, so->nparts);
    for (int k = 0; k < so->nparts; k++)
        if (c10d__poll_push(&s->in_q, &so->parts[k].item) != 0) {
            /* Only while the engine stops: the parts not queued settle here. */
            fail_op(so, C10D_EABORTED, "the engine is stopping");
            for (int j = k; j < so->nparts; j++)
                settle(so);
            break;
        }
    return 0;
fail:
    if (prev_device >= 0 && prev_device != so->device)
        cu->cudaSetDevice(prev_device);
    so->tainted = so->in_recorded; /* input copies may be queued behind no event */
    op_free(so);
    return rc;
}

static void inner_created(void *arg, int status);

struct create_ctx {
    c10d__backend_done_fn done;
    void *arg;
};

static void inner_created(void *arg, int status)
{
    struct create_ctx *cc = arg;
    c10d__backend_done_fn done = cc->done;
    void *done_arg = cc->arg;
    free(cc);
    done(done_arg, status);
}

static int staged_create(const struct c10d__backend_config *cfg, c10d__backend_done_fn done,
                         void *arg, void **state)
{
    const struct c10d__cudart_api *cu;
    C10D_CHECK(c10d__cuda_load(&cu));
    struct staged_state *s = calloc(1, sizeof *s);
    struct create_ctx *cc = calloc(1, sizeof *cc);
    if (s == NULL || cc == NULL) {
        free(s);
        free(cc);
        return c10d__fail(C10D_ENOMEM, "tcp (cuda): out of memory");
    }
    s->cu = cu;
    s->rank = cfg->rank;
    s->size = cfg->size;
    s->refs = 1;
    s->idle_max = (size_t)c10d__env_int(C10D_ENV_TCP_CUDA_STAGING_MAX);
    uv_mutex_init(&s->mu);
    c10d__poll_queue_init(&s->in_q);
    c10d__poll_queue_init(&s->out_q);
    struct c10d__backend_config inner = *cfg;
    inner.device_type = C10D_DEVICE_CPU;
    inner.device_index = -1;
    cc->done = done;
    cc->arg = arg;
    int rc = c10d__tcp_backend.create(&inner, inner_created, cc, &s->inner);
    if (rc != 0) {
        free(cc);
        uv_mutex_destroy(&s->mu);
        free(s);
        return rc;
    }
    *state = s;
    return 0;
}

/* Items taken off a queue without their `done`: their ops fail and the
 * callbacks they stood for are settled. */
static void fail_queue(struct c10d__poll_queue *q, int parts, int status, const char *reason)
{
    for (struct c10d__poll_item *it = c10d__poll_cancel(q), *next; it != NULL; it = next) {
        next = it->next;
        struct staged_op *so = parts ? ((struct part *)it)->so : (struct staged_op *)it;
        fail_op(so, status, reason);
        settle(so);
    }
}

static void staged_abort(void *state, int status, const char *reason, c10d__backend_done_fn done,
                         void *arg)
{
    struct staged_state *s = state;
    atomic_store(&s->aborted, 1);
    fail_queue(&s->in_q, 1, status, reason != NULL ? reason : "aborted");
    fail_queue(&s->out_q, 0, status, reason != NULL ? reason : "aborted");
    c10d__tcp_backend.abort(s->inner, status, reason, done, arg);
}

static void state_unref(struct staged_state *s)
{
    uv_mutex_lock(&s->mu);
    int last = --s->refs == 0;
    uv_mutex_unlock(&s->mu);
    if (!last)
        return;
    const struct c10d__cudart_api *cu = s->cu;
    /* Never waits: work still on a stream finishes on its own. */
    for (int d = 0; d < MAX_DEVICES; d++) {
        if (s->side[d] == NULL && s->out_side[d] == NULL)
            continue;
        int prev = c10d__gpu_switch_device(cu, d);
        if (s->side[d] != NULL)
            cu->cudaStreamDestroy(s->side[d]);
        if (s->out_side[d] != NULL)
            cu->cudaStreamDestroy(s->out_side[d]);
        c10d__gpu_restore_device(cu, prev);
    }
    blocks_free(cu, s->free_blocks);
    uv_mutex_destroy(&s->mu);
    free(s);
}

static void staged_destroy(void *state, c10d__backend_done_fn done, void *arg)
{
    struct staged_state *s = state;
    atomic_store(&s->aborted, 1);
    fail_queue(&s->in_q, 1, C10D_EABORTED, "the group was destroyed");
    fail_queue(&s->out_q, 0, C10D_EABORTED, "the group was destroyed");
    void *inner = s->inner;
    s->inner = NULL; /* ops settling later must not reach it */
    c10d__tcp_backend.destroy(inner, done, arg);
    state_unref(s);
}

const struct c10d__backend_vtable c10d__tcp_cuda_backend = {
    .name = "tcp",
    .check = staged_check,
    .create = staged_create,
    .submit = staged_submit,
    .abort = staged_abort,
    .destroy = staged_destroy,
    .published_key_fmt = "tcp/addr/%d", /* the inner tcp state's (tcp_backend.c) */
};
