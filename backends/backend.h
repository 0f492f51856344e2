/* The backend contract: what the group layer (api/) asks of a backend, and
 * all a backend sees of a group. Arguments reaching a backend have been
 * checked (docs/semantics.md) and carry their sequence number.
 *
 * An op is handed over once: `submit` runs on the caller's thread, under the
 * group's lock, in sequence order. A device backend records the event on the
 * caller's stream and launches there, so the op is ordered after exactly the
 * work the caller had enqueued; a host backend posts the op to the loop
 * thread, where its sockets live (op->task). Completion is seen on the loop:
 * through the engine's completion poller (engine/poller.h) for device work,
 * through sockets for host work. Everything else runs on the loop thread
 * unless it says otherwise. docs/architecture.md walks an op through both. */
#ifndef C10D_BACKENDS_BACKEND_H
#define C10D_BACKENDS_BACKEND_H

#include "c10d.h"
#include "engine/loop.h"

#include <stddef.h>
#include <stdint.h>

struct sockaddr;

/* Device types a group can hold a backend for, indexed by c10d_device_type. */
#define C10D__DEVICE_TYPES 2

enum c10d__op_kind {
    C10D_OP_BROADCAST,
    C10D_OP_ALL_REDUCE,
    C10D_OP_REDUCE,
    C10D_OP_ALL_GATHER, /* recv or recvs (list form) */
    C10D_OP_GATHER,
    C10D_OP_SCATTER,
    C10D_OP_REDUCE_SCATTER, /* send or sends (list form) */
    C10D_OP_ALL_TO_ALL,     /* send/recv + counts, or sends/recvs (list form) */
    C10D_OP_BARRIER,
    C10D_OP_SEND,
    C10D_OP_RECV,
    C10D_OP_KIND_COUNT
};

/* Op names as torch's flight recorder and messages spell them ("ALLREDUCE"...). */
const char *c10d__op_kind_name(enum c10d__op_kind kind);

struct c10d__op;
/* The op's NumelIn / NumelOut as torch reports them, in a group of `size`. */
void c10d__op_numel(const struct c10d__op *op, int size, size_t *in, size_t *out);
/* counts[0] + ... + counts[size - 1] (checked not to overflow before). */
size_t c10d__op_counts_sum(const size_t *counts, int size);

struct c10d__op {
    enum c10d__op_kind kind;
    const void *send; /* single-buffer forms */
    void *recv;
    const void *const *sends; /* list forms (NULL otherwise) */
    void *const *recvs;
    size_t count;              /* elements per rank block (see c10d.h per op) */
    const size_t *send_counts; /* all_to_all: per peer, NULL = even split */
    const size_t *recv_counts;
    /* The uneven forms, for a backend with `uneven` set: ALL_GATHER with
     * recv_counts (count = this rank's, recv holds the blocks in rank order)
     * and REDUCE_SCATTER with send_counts (count = this rank's block). */
    c10d_dtype dtype;
    c10d_reduce_op redop;
    double premul_factor;
    const void *premul_factor_dev; /* non-NULL: PREMUL_SUM's factor on the device */
    int root;                      /* group rank */
    int peer;                      /* group rank, or C10D_ANY_SOURCE for RECV */
    int tag;                       /* P2P tag (>= 0) */
    uint64_t seq;                  /* collective seq, or P2P seq for SEND/RECV */
    int64_t timeout_ms;
    c10d_device_type device_type;
    int device_index;
    void *stream;
    /* The backend completes this exactly once (c10d__work_complete), with a
     * message naming backend, op, seq and peer on failure; the caller holds a
     * reference until then. For RECV from any source it sets the source rank. */
    c10d_work *work;
    struct c10d__op *next; /* coalesced / batched ops: a list run as one unit */
    /* The backend's own: how a host backend hands the op to the loop thread
     * (post `task`; `state` says whose op it is when it runs). */
    struct c10d__task task;
    void *state;
};

struct c10d__backend_config {
    int rank; /* rank in this group */
    int size;
    const int *global_ranks; /* global rank of each group rank */
    const char *group_name;  /* "0" for the default group */
    const char *group_desc;
    int64_t timeout_ms; /* default op timeout; also bounds connection setup */
    c10d_store *store;  /* already prefixed for this group and device */
    /* Where the route to the store leaves this host: the local address of
     * the store's connection, and the store's host as given (MASTER_ADDR).
     * NULL when the store is not reached over TCP. A host backend listens
     * there: it is an address the other ranks can reach whatever this
     * host's name resolves to. */
    const struct sockaddr *store_local_addr;
    const char *store_host;
    c10d_device_type device_type;
    /* >= 0: the group was created for this device (torch's device_id): the
     * backend may set up its per-device state now. -1: on first use of each
     * device (op->device_index), lazily. */
    int device_index;
    const c10d_nccl_opts *nccl_opts; /* the group's NCCL settings (struct_size set) */
};

/* Called exactly once, on the loop thread, when an asynchronous entry point
 * finished; status 0 or negative. */
typedef void (*c10d__backend_done_fn)(void *arg, int status);

struct c10d__backend_vtable {
    const char *name; /* "tcp", "nccl" */
    /* Any thread. Whether this backend can run `op` (dtype/redop/device); 0 or
     * C10D_EINVAL / C10D_EUNSUPPORTED with a message such as "Cannot use
     * ReduceOp.BAND with NCCL". */
    int (*check)(const struct c10d__op *op);
    /* Creates the backend's state for a group and starts connecting; calls
     * done(arg, status) exactly once when connected or failed, unless it
     * returns an error (then never). */
    int (*create)(const struct c10d__backend_config *cfg, c10d__backend_done_fn done, void *arg,
                  void **state);
    /* Takes an op (or a list of coalesced ops, one work): the caller's
     * thread, under the group's lock, in sequence order (the group's own
     * internal ops: the loop thread); must not block. Returns 0 when the
     * backend took the op: it completes op->work exactly once, from any
     * thread, and may read the op record until then. Or a negative status
     * with c10d_last_error() set: nothing was taken and the group fails the
     * work. Ops are matched across ranks by seq. The state stays valid for
     * every op submitted before the group asks for abort or destroy. */
    int (*submit)(void *state, struct c10d__op *op);
    /* Fails every pending op with `status`/`reason` and poisons the state:
     * later ops fail at once naming the first error. It may hand blocking work
     * (a communicator abort) to a worker (c10d__engine_offload) and call
     * done later; done may be NULL (nobody waits). The group bounds how long
     * it waits by a loop timer (C10D_BACKEND_CLOSE_MS); past it, the state is
     * left to the backend and never touched again. */
    void (*abort)(void *state, int status, const char *reason, c10d__backend_done_fn done,
                  void *arg);
    /* Optional; any thread, while the state is valid. 0 while the backend
     * works; once it failed (a peer lost, an op's error), the status it failed
     * with, its message copied into msg[0..n). What a caller blocked outside
     * the backend (C10D_DEBUG=DETAIL's store exchange) checks to stop waiting
     * for ranks that will never come. */
    int (*failure)(void *state, char *msg, size_t n);
    /* Optional; any thread, while the state is valid. The group ranks this
     * backend knows failed (their connection was lost: the process died or
     * left), the first it saw first: up to `cap` into out, returning how many
     * there are (0 while none). */
    int (*failed_ranks)(void *state, int *out, int cap);
    /* Optional; asked once the state is created, before any op: how data
     * moves between the group's ranks ("shm", "tcp"). */
    const char *(*path)(void *state);
    /* Optional; any thread, while the state is valid: every op parked for
     * its waiter (engine/work.h) goes to the loop, where it completes by
     * itself; a graceful destroy waits for ops nobody waits on. */
    void (*unpark)(void *state);
    /* Frees the state, after abort or once idle; same rules for done. */
    void (*destroy)(void *state, c10d__backend_done_fn done, void *arg);
    /* printf format of the key (under the backend's store, one per rank) where
     * a rank published what its peers need to connect, or NULL. Once every
     * rank destroyed the group, the group deletes them. */
    const char *published_key_fmt;
    /* Optional (NULL: the group creates the subgroup through the store like
     * any other group). A child state from the parent's, as ncclCommSplit:
     * every parent rank calls it, in the same order; ranks passing a
     * negative color get no child (*state NULL, done still called). */
    int (*split)(void *parent, const struct c10d__backend_config *cfg, int color, int key,
                 c10d__backend_done_fn done, void *arg, void **state);
    /* Optional (NULL: through the store). The parent without `excluded`
     * (group ranks), as ncclCommShrink; only surviving ranks call it. flags:
     * C10D_SHRINK_ABORT: the parent's pending ops fail with C10D_EABORTED
     * before the child is made, and the device stops writing their buffers
     * (NCCL_SHRINK_ABORT); the group aborts the parent state afterwards. */
    int (*shrink)(void *parent, const struct c10d__backend_config *cfg, const int *excluded,
                  int nexcluded, int flags, c10d__backend_done_fn done, void *arg, void **state);
    /* Nonzero: the backend enforces op->timeout_ms itself, counting from when
     * the op started on the device (not from the call: an op queued behind
     * long compute is not late), and fails the work with C10D_ETIMEDOUT; the
     * group then gives the work no deadline of its own. */
    int timeout_from_start;
    /* Nonzero: submit takes the uneven forms of ALL_GATHER and REDUCE_SCATTER
     * (c10d__op's counts) as one op; else the group builds c10d_all_gather_v
     * and c10d_reduce_scatter_v from other ops (api/pg_derived.c). */
    int uneven;
};

/* The backends this build has (backends/registry.c). */
extern const struct c10d__backend_vtable c10d__tcp_backend;
extern const struct c10d__backend_vtable c10d__nccl_backend;
/* tcp for CUDA buffers, staged through pinned host memory ("cuda:tcp"). */
extern const struct c10d__backend_vtable c10d__tcp_cuda_backend;

/* The backend called `name` ("tcp", "gloo", "nccl"): 0, C10D_EINVAL
 * (unknown name). */
int c10d__backend_find(const char *name, const struct c10d__backend_vtable **out);
/* Parses "tcp", "nccl", "cpu:tcp,cuda:nccl" into one backend per device type. */
int c10d__backend_parse(const char *spec,
                        const struct c10d__backend_vtable *out[C10D__DEVICE_TYPES]);

#endif
