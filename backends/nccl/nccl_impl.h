/* The nccl backend's private pieces, shared by its files:
 *   comm.c          communicators: unique id through the store, nonblocking
 *                   init polled by the loop, split, abort and destroy off the
 *                   loop, the event pool
 *   launch.c        which NCCL calls an op becomes (dtypes, reduce ops, list
 *                   forms as grouped send/recv)
 *   nccl_backend.c  the backend table: submit on the caller's thread,
 *                   completion and deadlines through the engine's poller,
 *                   failure and poisoning
 *   peer_error.c    failure news between the ranks through the store
 * Threads: `submit` runs on callers' threads; everything else on the loop,
 * except the calls that may block (init's first call, abort, destroy), which
 * run on offload workers. A communicator's `lock` keeps any two threads
 * from being inside NCCL on it at once. */
#ifndef C10D_BACKENDS_NCCL_NCCL_IMPL_H
#define C10D_BACKENDS_NCCL_NCCL_IMPL_H

#include "backends/backend.h"
#include "gpu/gpu_api.h"
#include "engine/poller.h"

#include <stdatomic.h>
#include <stdint.h>
#include <uv.h>

struct nccl_state;
struct nccl_comm;

/* How comm.c and peer_error.c report to the backend: nccl_backend.c installs
 * these in every state it makes, so the lower files never call up into it. */
struct nccl_reports {
    /* Loop: `c` became ready (status 0: issue the ops that waited) or failed. */
    void (*comm_settled)(struct nccl_comm *c);
    /* Another rank reported the group's failure: fail it here too (not told
     * to the others again). */
    void (*peer_failed)(struct nccl_state *s, int status, const char *message);
    /* Loop: frees the state once destroy asked, its communicators are closed
     * and no store callback is to come. */
    void (*maybe_free)(struct nccl_state *s);
};

/* Events, created without timing on one device and reused. Shared by the
 * communicator and the ops that hold its events: the last of them frees it,
 * so a work released after its group ended still returns its events. */
struct nccl_event_pool {
    uv_mutex_t mutex;
    int refs;
    int device;
    int timing; /* C10D_NCCL_ENABLE_TIMING: events that can be timed */
    int closed; /* the communicator is gone: returned events are destroyed */
    cudaEvent_t *free_events;
    size_t n, cap;
};

enum nccl_comm_phase {
    COMM_STARTING, /* unique id and init under way; ops wait in `deferred` */
    /* Made, nothing launched yet: ops still go to `deferred`, and a worker
     * issues them. NCCL makes its connections at the first launch, which
     * may wait for the peers; a caller's thread must not wait there, since
     * it holds the group's lock. */
    COMM_COLD,
    COMM_READY,  /* callers issue their ops themselves, under `lock` */
    COMM_FAILED, /* init failed or the communicator was aborted */
};

struct nccl_op;

enum { START_IDLE, START_BUSY, START_ORPHANED };

/* NaN check flags per communicator (nan_flag). */
#define C10D__NCCL_NAN_SLOTS 64

/* Most bootstrap roots of one init (ncclCommInitRankScalable). */
#define C10D__NCCL_MAX_ROOTS 256

/* One NCCL communicator: the group's on a device, or a pair's for P2P. */
struct nccl_comm {
    struct nccl_state *s;
    int device;
    int peer;         /* -1: the whole group; else the pair (rank, peer) */
    int nranks, rank; /* in the communicator */
    char key[64];     /* the store key of its unique id */
    uv_mutex_t lock;  /* held by whoever calls NCCL on `comm` */
    _Atomic int phase;
    ncclComm_t comm;
    /* An abort must not wait for c->lock while its holder is stuck inside
     * NCCL (a blocking communicator's first launch waits there for the
     * peers): NCCL's abort is made to be called from another thread then.
     * Who launches sets in_nccl, then reads aborting; the abort sets
     * aborting, then reads in_nccl (both sequentially consistent): either
     * the launcher sees the abort and stays out, or the abort sees the
     * launcher inside and aborts without the lock. Blocking communicators
     * only: a nonblocking launch is bounded by the op's timeout. */
    _Atomic int in_nccl;
    _Atomic int aborting;
    _Atomic int aborted_under; /* that abort happened: comm is gone */
    cudaStream_t stream;
    void *barrier_buf; /* one float on the device, for barrier */
    /* C10D_NCCL_NAN_CHECK: mapped host memory, C10D__NCCL_NAN_SLOTS flags;
     * the check of the op tagged t writes t into slot t % SLOTS where it
     * finds a NaN, so up to that many ops in flight are told apart. NULL
     * when the check is off. */
    volatile uint64_t *nan_flag;
    uint64_t nan_tags; /* under lock: the last tag given out */
    struct nccl_event_pool *pool;
    struct c10d__poll_queue completions; /* ops in stream order */
    /* Ops waiting for a worker to issue them (STARTING, COLD), in call
     * order, and the phase's changes: under defer_mu, never held across
     * an NCCL call, so a caller never waits for NCCL to append. */
    uv_mutex_t defer_mu;
    struct nccl_op *deferred_head, *deferred_tail;
    int drain_scheduled;              /* a worker is to issue `deferred` (under defer_mu) */
    struct c10d__poll_item init_item; /* polls a nonblocking init */
    uint64_t init_started_ms;
    /* START_BUSY while a start worker or its continuation is pending; a close
     * that finds it so hands the communicator over (START_ORPHANED) to that
     * continuation, which cleans up if the worker ever returns. */
    _Atomic int start_busy;
    const struct c10d__gpu_api *api;
    /* Eager creation or split: told once the communicator is ready. */
    c10d__backend_done_fn ready_done;
    void *ready_arg;
    /* split: the parent and the arguments (loop thread) */
    struct nccl_comm *split_parent;
    /* Loop thread: children made from this communicator (split, shrink) that
     * still point at it; its memory outlives them (free_deferred), so an
     * abort of the parent while a child initialises frees nothing under it. */
    int children;
    int free_deferred;
    int split_color, split_key;
    int *shrink_excluded; /* a shrink (ncclCommShrink) rather than a split; owned */
    int shrink_nexcluded;
    int shrink_flags; /* NCCL_SHRINK_DEFAULT or NCCL_SHRINK_ABORT */
    /* The first failure of the start wins (a worker and the loop's deadline
     * may both fail it): init_claimed is taken, init_error written, then
     * init_status stored, so whoever reads a status finds its words. */
    _Atomic int init_claimed;
    char init_error[320];
    _Atomic int init_status;
    int blocking;      /* a blocking NCCL communicator (fixed at creation) */
    c10d_store *store; /* the group's, retained: a start worker may outlive the group */
    struct nccl_comm *next;
};

/* One op (or one coalesced list) in flight. Lives until its work is freed
 * (the work's payload), so c10d_work_wait_stream can use its end event. */
struct nccl_op {
    struct c10d__poll_item item; /* first: the poller hands it back */
    struct nccl_comm *c;
    struct c10d__op *op;
    const struct c10d__gpu_api *api;
    struct nccl_event_pool *pool;
    cudaEvent_t ready_ev; /* on the caller's stream at the call */
    cudaEvent_t start_ev; /* on the communicator's stream before the op */
    cudaEvent_t end_ev;   /* after it */
    _Atomic int issued;   /* start/end events recorded */
    int captured;         /* issued into a CUDA graph capture: nothing to poll */
    uint64_t nan_tag;     /* its inputs' NaN check wrote this where it found one; 0: none */
    const char *type;     /* op_type(op) and op->seq, for a worker's messages after NCCL */
    uint64_t seq;         /* returned (the record may be gone by then) */
    uint64_t started_ms;  /* loop: when start_ev was first seen done; 0 before */
    int status;           /* loop: what to complete with (0: success) */
    char why[384];
    struct nccl_op *next_deferred;
};

struct nccl_state {
    const struct nccl_reports *up;
    const struct c10d__gpu_api *api;
    int rank, size;
    char name[64], desc[128];
    int64_t timeout_ms;
    c10d_store *store;
    c10d_nccl_opts nccl_opts; /* strings point into the group, which outlives us */
    int bound_device;         /* the device the group is bound to, -1: none */
    int nan_check;            /* C10D_NCCL_NAN_CHECK: inputs checked for NaN before each op */
    uv_mutex_t mutex;         /* the comms list and the first error */
    struct nccl_comm *comms;
    _Atomic int poisoned;
    int first_status;
    char first_error[512];
    int first_from_peer;              /* the first error came from another rank (peer_error.c) */
    int publish_pending;              /* a failure of our own still to be told to the others */
    int publishing;                   /* loop: ... and the store has not answered yet */
    void (*after_publish)(void *arg); /* loop: a close waiting for that answer */
    void *after_publish_arg;
    int closing;               /* loop: abort or destroy began closing the communicators */
    int close_finished;        /* loop: ... and they are closed */
    int free_requested;        /* loop: destroy came: free once closed */
    _Atomic int pending_calls; /* tasks and store callbacks still to run on the loop */
    int freed;
    uint64_t peer_checked_ms; /* loop: the last look at the failure key */
    int peer_check_busy;
};

/* ---- comm.c */
/* Caller's thread: the communicator for `device` (peer -1) or for the pair
 * with `peer`, created and started if new. NULL with c10d_last_error() set. */
struct nccl_comm *c10d__nccl_comm_get(struct nccl_state *s, int device, int peer);
/* Loop: starts the group's communicator on `device` now (a bound group);
 * done(arg, status) once it is ready or failed. */
int c10d__nccl_comm_start_eager(struct nccl_state *s, int device, c10d__backend_done_fn done,
                                void *arg);
/* Loop: the child's communicator split from `parent` (ncclCommSplit); every
 * parent rank calls it; color < 0 takes part without a child. */
int c10d__nccl_comm_split(struct nccl_state *child, struct nccl_state *parent_state,
                          struct nccl_comm *parent, int color, int key, c10d__backend_done_fn done,
                          void *arg);
/* Loop: the child's communicator shrunk from `parent` without `excluded`
 * (ncclCommShrink with nccl_flags, NCCL_SHRINK_*); only the surviving ranks
 * call it. */
int c10d__nccl_comm_shrink(struct nccl_state *child, struct nccl_comm *parent, const int *excluded,
                           int nexcluded, int nccl_flags, c10d__backend_done_fn done, void *arg);
/* Loop: aborts (abort != 0) or destroys every communicator of `s` on an
 * offload worker, then calls done(arg) on the loop (never if the worker is
 * stuck: the group's timer bounds the wait). Frees the communicators. */
void c10d__nccl_comms_close(struct nccl_state *s, int abort, void (*done)(void *arg), void *arg);
/* Loop: c was left to its start's continuation by the group's close
 * (START_ORPHANED): aborts and frees it off the loop. */
void c10d__nccl_comm_orphan_release(struct nccl_comm *c);
/* Any thread: fails c's start, unless it failed already (the first wins). */
void c10d__nccl_comm_fail_start(struct nccl_comm *c, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Event pool. get: 0 or C10D_EIO; put and unref: any thread. */
int c10d__nccl_event_get(struct nccl_event_pool *p, const struct c10d__gpu_api *api,
                         cudaEvent_t *ev);
void c10d__nccl_event_put(struct nccl_event_pool *p, const struct c10d__gpu_api *api,
                          cudaEvent_t ev);
void c10d__nccl_pool_unref(struct nccl_event_pool *p, const struct c10d__gpu_api *api);

/* ---- launch.c */
/* Any thread: may this backend run `op`? (dtype, reduce op, device, peer). */
int c10d__nccl_check(const struct c10d__op *op);
/* Under c->lock, with c->device current: the NCCL calls of `op` and of the
 * ops linked after it, on c->stream, inside one NCCL group. 0 or C10D_EIO
 * with the message set. */
int c10d__nccl_launch(struct nccl_comm *c, const struct c10d__op *op);
/* Under c->lock, with c->device current, before the op's NCCL calls: the
 * NaN check of every floating-point input of `op` and of the ops linked
 * after it, on c->stream, writing `tag` to its slot of c->nan_flag where one
 * has a NaN.
 * 0 or C10D_EIO with the message set. */
int c10d__nccl_nan_check(struct nccl_comm *c, const struct c10d__op *op, uint64_t tag);
/* NCCL's name for `r` and its last error text, for messages. */
const char *c10d__nccl_error_text(const struct c10d__gpu_api *api, ncclResult_t r, char *buf,
                                  size_t len);

/* ---- nccl_backend.c */
/* Any thread: fails the group (the first error wins) and, on the loop,
 * fails every pending op and aborts the communicators. */
void c10d__nccl_fail(struct nccl_state *s, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- peer_error.c */
/* Loop: tells the other ranks of the group's first error if it is ours and
 * not told yet (first writer of the group's failure key wins); `publishing`
 * stays set until the store answers. */
void c10d__nccl_peer_error_publish(struct nccl_state *s);
/* Loop, while ops or an init are in flight: looks for another rank's failure
 * every C10D_NCCL_PEER_CHECK_MS and fails the group with it. */
void c10d__nccl_peer_error_poll(struct nccl_state *s);

#endif
