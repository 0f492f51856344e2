/* The backend interface: what api/ (the process-group object) asks of a
 * backend, and all a backend sees of a group. Arguments reaching a backend
 * have been checked (docs/semantics.md, 2) and carry their sequence number.
 * Everything here runs on the engine's loop thread. */
#ifndef C10D_BACKENDS_BACKEND_H
#define C10D_BACKENDS_BACKEND_H

#include "c10d.h"

#include <stddef.h>
#include <stdint.h>

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

struct c10d__op {
    enum c10d__op_kind kind;
    const void *send; /* single-buffer forms */
    void *recv;
    const void *const *sends; /* list forms (NULL otherwise) */
    void *const *recvs;
    size_t count;              /* elements per rank block (see c10d.h per op) */
    const size_t *send_counts; /* all_to_all: per peer, NULL = even split */
    const size_t *recv_counts;
    c10d_dtype dtype;
    c10d_reduce_op redop;
    double premul_factor;
    int root;     /* group rank */
    int peer;     /* group rank, or C10D_ANY_SOURCE for RECV */
    int tag;      /* P2P tag (>= 0) */
    uint64_t seq; /* collective seq, or P2P seq for SEND/RECV */
    int64_t timeout_ms;
    c10d_device_type device_type;
    int device_index;
    void *stream;
    /* The backend completes this exactly once (c10d__work_complete), with a
     * message naming backend, op, seq and peer on failure; the caller holds a
     * reference until then. For RECV from any source it sets the source rank. */
    c10d_work *work;
    struct c10d__op *next; /* coalesced / batched ops: a list run as one unit */
};

struct c10d__backend_config {
    int rank; /* rank in this group */
    int size;
    const int *global_ranks; /* global rank of each group rank */
    const char *group_name;  /* "0" for the default group */
    const char *group_desc;
    int64_t timeout_ms; /* default op timeout; also bounds connection setup */
    c10d_store *store;  /* already prefixed for this group and device */
};

struct c10d__backend_vtable {
    const char *name; /* "tcp", "nccl" */
    /* Whether this backend can run `op` (dtype/redop/device); 0 or C10D_EINVAL /
     * C10D_EUNSUPPORTED with a message such as "Cannot use ReduceOp.BAND with NCCL". */
    int (*check)(const struct c10d__op *op);
    /* Creates the backend's state for a group and starts connecting; calls
     * done(arg, status) exactly once when connected or failed. */
    int (*create)(const struct c10d__backend_config *cfg, void (*done)(void *arg, int status),
                  void *arg, void **state);
    /* Runs an op (or a list of coalesced ops, one work). The backend keeps its
     * own order: ops are started in submission order and matched across ranks
     * by seq. */
    void (*run)(void *state, struct c10d__op *op);
    /* Fails every pending op with `status`/`reason` and poisons the group:
     * later ops fail at once naming the first error. Closes transports. */
    void (*abort)(void *state, int status, const char *reason);
    /* Frees the state; called after abort or once idle. */
    void (*destroy)(void *state);
    /* printf format of the key (under the backend's store, one per rank) where
     * a rank published what its peers need to connect, or NULL. Once every
     * rank destroyed the group, the group deletes them. */
    const char *published_key_fmt;
};

extern const struct c10d__backend_vtable c10d__tcp_backend;
#ifdef C10D_HAVE_NCCL
extern const struct c10d__backend_vtable c10d__nccl_backend;
#endif

#endif
