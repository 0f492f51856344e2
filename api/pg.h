/* The process-group object shared by api/'s files: the group's state, the op
 * record handed to a backend, and the internal entry points (argument checks,
 * submission, store steps). The public half is the "process groups" section
 * of c10d.h; the backend half is backends/backend.h.
 *
 * Threads: the caller's thread checks arguments and, under pg->mutex, takes
 * the sequence number and posts the op, so posting order is sequence order.
 * Everything a backend sees runs on the loop thread. */
#ifndef C10D_API_PG_H
#define C10D_API_PG_H

#include "c10d.h"
#include "backends/backend.h"
#include "engine/flight_recorder.h"
#include "engine/loop.h"

#include <stdatomic.h>
#include <stdint.h>
#include <uv.h>

/* P2P tags at and above this are the library's own (monitored_barrier). */
#define C10D__TAG_RESERVED          0x7fff0000
#define C10D__TAG_MONITORED_BARRIER (C10D__TAG_RESERVED + 1)

/* The longest group name: derived names ("<parent>/split<k>.<color>",
 * "<parent>/shrink<k>") that would exceed it are refused, never cut (a cut
 * name could be a sibling's, and share its store keys). */
#define C10D__PG_NAME_MAX 120

/* Per-device backends a group can hold ("cpu:tcp,cuda:nccl"). */
#define C10D__PG_NDEV C10D__DEVICE_TYPES

struct c10d__pg_backend {
    const struct c10d__backend_vtable *vt; /* NULL: no backend for this device */
    void *state;
    c10d_store *store; /* "<device>/" over the group's store */
};

enum c10d__pg_state {
    C10D_PG_LIVE = 0,
    C10D_PG_CLOSED, /* destroyed or aborted: the handle only awaits its free */
};

struct c10d_pg {
    uv_mutex_t mutex;
    uv_cond_t idle_cond; /* pending reached 0 */
    atomic_int refs;     /* user handle + live ops */
    /* Set at creation. */
    int rank, size; /* -1, -1 for a non-member */
    int global_rank;
    int *global_ranks; /* group rank -> global rank (size entries) */
    char *name, *desc;
    _Atomic int64_t timeout_ms; /* c10d_pg_set_timeout changes it */
    int is_default;
    c10d_store *store;      /* "<name>/" over the default_pg store; NULL for tests */
    c10d_store *base_store; /* the default_pg store (barriers) */
    struct c10d__pg_backend backends[C10D__PG_NDEV];
    const char *host_path; /* the CPU backend's path at creation (c10d_pg_host_path) */
    c10d_pg_completion_hook completion_hook; /* guarded by mutex */
    atomic_int has_completion_hook;          /* set once: ops read it without the lock */
    void *completion_arg;
    int device_index;         /* the CUDA device the group is bound to; -1: none */
    c10d_nccl_opts nccl_opts; /* copied from the creator's (strings owned) */
    const char *backend_name; /* for messages: "tcp", "nccl", "tcp+nccl" */
    char backend_name_buf[32];
    /* Guarded by mutex. */
    enum c10d__pg_state state;
    uint64_t coll_seq, p2p_seq;
    uint64_t detail_round; /* C10D_DEBUG=DETAIL checks made, rejected calls included */
    /* Ops whose work has not completed: raised under the mutex, dropped
     * without it by c10d__pg_op_ended, which broadcasts idle_cond under it. */
    atomic_size_t pending;
    atomic_int idle_waiters; /* threads about to sleep on idle_cond */
    char *what_prefix;       /* "[PG name (desc) Rank r] Work(SeqNum=": every op's name starts so */
    size_t what_prefix_len;
    /* Name and desc as flight-recorder entries hold them (interned); NULL: out of memory, each
     * record interns them again. */
    const struct c10d__fr_names *fr_names;
    int first_status;
    char *first_error;
    /* Set when the group ended without a destroy or abort of its own (the
     * library was shut down, or this is a forked child's copy): ops and waits
     * then fail with C10D_EABORTED saying so. */
    const char *ended_by;
    /* A forked child's copy: its stores and backend state belong to the
     * parent's loop, which does not exist here; they are left alone. */
    int inherited;
    int coalescing;
    /* A shrink with C10D_SHRINK_ABORT is under way: it aborts the backends
     * itself once the survivors have their child (a failing op must not
     * abort the nccl communicator the child is being shrunk from). */
    int abort_deferred;
    int shrink_count; /* groups shrunk from this one (their names) */
    int split_count;  /* c10d_pg_split calls on this one (their names and keys) */
    int fr_seen;      /* the flight recorder knows the group (pg_config, store watch) */
    int split_color;  /* the color this group was split with (backend splits) */
    int merged;       /* made by c10d_pg_merge_remote: its own rank numbering */
    /* The name the backends are given (tcp checks it in every connection's
     * hello); NULL: name. A merged group's callers may name it differently,
     * so its backends get one fixed name. Static storage. */
    const char *wire_name;
    struct c10d__pg_op *coal_head, *coal_tail;
    size_t coal_n;
    /* Loop thread only. */
    int aborted_on_loop;
    struct c10d_pg *next_group; /* registry of live groups */
};

/* An op in flight: the backend's record plus what it points to (copies of the
 * caller's count arrays and buffer lists). Freed once the backend has run it
 * and its work has completed. */
struct c10d__pg_op {
    c10d_pg *pg;
    int dev;      /* index into pg->backends */
    int internal; /* the library's own op (monitored_barrier): no poisoning */
    int cached;   /* a block of the thread's cache (engine/block_cache.h) */
    struct c10d__op op;
    struct c10d__pg_op *next_in_list; /* coalesced / batched members */
    void *storage;                    /* copied arrays */
    uint64_t fr_id;                   /* flight recorder record id + 1; 0: not recorded */
    /* The work's first reference went to the caller's handle: op_final has
     * none to drop. Set under pg->mutex after the op was handed over: its
     * callbacks run on the loop, where op_done takes that mutex before
     * op_final reads this, or on the handle's waiter, after the return. */
    int work_handed_out;
    uint64_t started_ns;
    int64_t started_wall_us; /* handed to the backend (completion hook) */
};

/* op_name.c: what an op's name is made from, when it is read; optype is a
 * string literal or the op table's (never freed). */
struct c10d__pg_op_name {
    const char *optype;
    uint64_t seq;
    size_t in, out;
    int64_t timeout_ms;
};
/* The group's part ("[PG name (desc) Rank r] Work(SeqNum="), under pg->mutex. */
const char *c10d__pg_op_name_prefix(c10d_pg *pg, size_t *len);
/* c10d__work_name's maker: the rest from a struct c10d__pg_op_name. */
void c10d__pg_make_op_name(const void *args, char *buf, size_t len);

/* check.c: docs/semantics.md, 2. Returns 0 or C10D_EINVAL with
 * c10d_last_error() = "<backend> <opname>: <what was wrong>". `op` holds the
 * call's arguments (group ranks); rank/size are the group's. list_form: the
 * list form of a collective, or a P2P op inside a batch. */
int c10d__pg_check_op(const c10d_pg *pg, const char *opname, const struct c10d__op *op,
                      int list_form);
/* pg_ops.c: an op record of `kind` with no buffers, no root and no peer. */
struct c10d__op c10d__pg_op_init(enum c10d__op_kind kind, size_t count, c10d_dtype dtype);
/* pg_ops.c: what every public op call does with its c10d__op (options read,
 * arguments checked, counts and lists copied, handed to the backend of the
 * buffers' device). list_form: the op's list form (check.c). */
int c10d__pg_dispatch(c10d_pg *pg, const char *opname, const struct c10d__op *args, int list_form,
                      const c10d_op_opts *opts, c10d_work **work);
/* pg_ops.c: creates the work of a (list of) op(s), registers the callbacks
 * and posts the head. Under pg->mutex; `seq` is already taken and is given
 * back by the caller on failure. */
int c10d__pg_post_locked(c10d_pg *pg, struct c10d__pg_op *head, const char *optype, uint64_t seq,
                         size_t in, size_t out, const c10d_op_opts *opts, c10d_work **work,
                         int *handed_over);
/* check.c: complex dtypes become pairs of reals (dtype and count; *per = 2,
 * by which the caller scales count arrays) before the backend sees the op;
 * C10D_EINVAL for a reduction complex values do not have. */
int c10d__pg_complex_as_reals(const c10d_pg *pg, const char *opname, struct c10d__op *op,
                              size_t *per);
/* Reads the caller's op options (may be NULL) into `out` (engine/opts.h's
 * size rule) and checks them: timeout >= 0, device type known. */
int c10d__pg_read_op_opts(const c10d_pg *pg, const char *opname, const c10d_op_opts *user,
                          c10d_op_opts *out);

/* The 0.1 layouts (what struct_size 0 means): they end with these fields. */
#define C10D__PG_OPTS_V1_SIZE (offsetof(c10d_pg_opts, group_desc) + sizeof(const char *))
#define C10D__OP_OPTS_V1_SIZE (offsetof(c10d_op_opts, stream) + sizeof(void *))

/* pg_store.c: once every rank destroyed the group, the last one deletes its
 * store keys (asynchronous, best effort). The result (NULL: nothing was
 * sent) is for c10d__pg_sweep_flush, which must be called once. */
struct c10d__pg_sweep_flush;
struct c10d__pg_sweep_flush *c10d__pg_sweep_keys(c10d_pg *pg);
/* Waits up to `ms` for the sweep's requests to be answered, so a program that
 * exits right after destroy does not take them with it; then lets go of it.
 * Never on the loop thread. */
void c10d__pg_sweep_flush(struct c10d__pg_sweep_flush *f, int64_t ms);

/* pg_backends.c: creates the backends named in vts (blocking, bounded by the
 * group's timeout), and aborts (when `abort`) and destroys them (bounded). */
int c10d__pg_create_backends(c10d_pg *pg, const struct c10d__backend_vtable *vts[C10D__PG_NDEV],
                             c10d_pg *parent);
/* A shrunk group's backends: each one's `shrink` from the parent's state
 * where the backend has one and the parent still holds it, else through the
 * store among the survivors. `excluded` are parent group ranks; flags are
 * C10D_SHRINK_*, handed to the backend's shrink. */
int c10d__pg_shrink_backends(c10d_pg *pg, const struct c10d__backend_vtable *vts[C10D__PG_NDEV],
                             c10d_pg *parent, const int *excluded, int nexcluded, int flags);
/* A subgroup's backends come from the parent's by `split` where the backend
 * has one (else through the store, as a new group); a parent rank outside the
 * subgroup takes part in each such split with no color. */
int c10d__pg_split_out(c10d_pg *parent);
void c10d__pg_close_backends(c10d_pg *pg, int abort, int status, const char *reason);
/* Every open backend hands the ops it parked for their waiters to the loop
 * (backend.h, `unpark`), on the loop, where a backend's state is freed too;
 * posted ahead of any close that follows. */
void c10d__pg_unpark_backends(c10d_pg *pg);

/* process_group.c: a group's start and end, shared with pg_subgroups.c. */
void c10d__pg_registry_once(void);
/* Makes sure c10d_shutdown ends every group first (a hook on the loop). */
void c10d__pg_end_at_shutdown(void);
/* The next group name (creation order) and the default group's size (0 if
 * none): every rank takes one per group it creates, member or not. */
int c10d__pg_take_group_id(int *world_size);
void c10d__pg_set_backend_name(c10d_pg *pg, const struct c10d__backend_vtable *vts[C10D__PG_NDEV]);
/* The device binding and NCCL settings of a new group: the caller's, else the
 * parent's. */
int c10d__pg_set_device_opts(c10d_pg *pg, const c10d_pg_opts *o, const c10d_pg *parent,
                             const char *what);
/* Creates, connects and registers a group whose name, store and ranks are set. */
int c10d__pg_start(c10d_pg *pg, c10d_store *base, const struct c10d__backend_vtable *vts[],
                   c10d_pg *parent);
/* c10d_pg_shrink of the default group `old`: `pg` (just made) becomes the
 * default group, its ranks the global ranks; every other live group (the old
 * default included) is ended: aborted, its calls refused with C10D_EREVOKED,
 * its handle left for destroy. Nothing when `old` is not the default. */
void c10d__pg_shrunk_default(c10d_pg *old, c10d_pg *pg);
/* A group whose creation failed part way: closed and dropped; the error names
 * the call and the group. Returns rc. */
int c10d__pg_creation_failed(c10d_pg *pg, int rc, const char *what);

/* pg_object.c: the group object and the registry of live groups. The
 * registry lock also guards the default-group bookkeeping of process_group.c;
 * walk the list (newest first, by next_group) only while holding it. */
void c10d__pg_registry_lock(void);
void c10d__pg_registry_unlock(void);
c10d_pg *c10d__pg_registry_head(void);
/* A group object with one reference, in the registry. */
int c10d__pg_alloc(const char *name, const char *desc, int rank, int size, int global_rank,
                   const int *global_ranks, int64_t timeout_ms, c10d_pg **out);

/* pg_object.c: op records (their lifetime is the group's business). */
struct c10d__pg_op *c10d__pg_op_new(c10d_pg *pg, int dev, size_t extra_bytes);
void c10d__pg_op_free(struct c10d__pg_op *po);

/* pg_ops.c: numbers and hands ops to the backend. */
/* Numbers op (unless coalescing), creates its work, posts it. On error
 * nothing was consumed and po is freed. */
int c10d__pg_submit(c10d_pg *pg, const char *opname, struct c10d__pg_op *po,
                    const c10d_op_opts *opts, c10d_work **work);
/* Loop thread: runs an internal op whose work the caller created; the work
 * completes through the backend as usual. */
void c10d__pg_submit_internal(c10d_pg *pg, struct c10d__pg_op *po);
/* One of the group's ops completed (its `pending` count drops). */
void c10d__pg_op_ended(c10d_pg *pg);
/* Records the group's first error and aborts its backends (loop thread). */
void c10d__pg_poison(c10d_pg *pg, int status, const char *message);
/* The device index for opts (0 = cpu, 1 = cuda), or an error naming the group. */
int c10d__pg_device(const c10d_pg *pg, const char *opname, const c10d_op_opts *opts);
/* Returns a work that is already complete (status 0) for a non-member's call;
 * its callback still runs later on the loop thread. */
int c10d__pg_noop(const c10d_pg *pg, const char *opname, const c10d_op_opts *opts,
                  c10d_work **work);
/* 0, or C10D_EREVOKED with a message naming why a call must be refused now
 * (the group failed earlier, also by a backend's own failure seen here, was
 * ended or destroyed). Under pg->mutex. */
int c10d__pg_usable_locked(c10d_pg *pg, const char *opname);
/* 0 for a usable group, else the status that made it unusable (its first
 * failure, C10D_EABORTED when the library ended it, C10D_EREVOKED when it was
 * destroyed), with the message. Under pg->mutex. */
int c10d__pg_cause_locked(c10d_pg *pg);

/* settings_check.c: the settings that change the wire (thresholds, lazy
 * connections, DETAIL) compared across the ranks of a new default group;
 * C10D_EINVAL on every rank, naming each setting and both values, when one
 * differs. A NULL store or a single rank checks nothing. */
int c10d__pg_settings_check(c10d_store *store, int rank, int size, int64_t timeout_ms);
/* The same check on `store` itself, not on a per-process numbered prefix of
 * it: for ranks that do not share a count of checks made (a merge of
 * groups from other jobs). */
int c10d__pg_settings_check_in(c10d_store *store, int rank, int size, int64_t timeout_ms);

/* detail_check.c: C10D_DEBUG=DETAIL's fingerprint exchange before a
 * collective (caller's thread, blocking, bounded by timeout_ms); 0 or the
 * failure of this call, naming the ranks and what differs. *fatal = 1 when
 * the exchange itself failed (a rank did not come): the ranks may be out of
 * step from there, and the caller fails the group. */
int c10d__pg_detail_enabled(void);
int c10d__pg_detail_check(c10d_pg *pg, const char *opname, const struct c10d__op *op,
                          int64_t timeout_ms, int *fatal);
/* flight_recorder.c: the group layer's side of the flight recorder
 * (engine/flight_recorder.h, docs/debugging.md). */
/* Registers the store watch's fork handlers (once); see registry_init. */
void c10d__pg_fr_init(void);
/* Under pg->mutex, once the op (list) has its number and timeout: records it
 * in head->fr_id. `label` is the torch OpType of a list ("COALESCED",
 * "BATCH_P2P"), NULL for a single op; `now_ns` when it was made
 * (c10d__now_coarse_ns, read once for the record and the work's deadline). */
void c10d__pg_fr_record(c10d_pg *pg, struct c10d__pg_op *head, const char *label, size_t in,
                        size_t out, int64_t timeout_ms, uint64_t now_ns);
/* An op of the group failed: dumps (once per burst of failures) and asks the
 * other ranks to dump, through the default group's store. Loop thread. */
void c10d__pg_fr_on_failure(c10d_pg *pg, int status, const char *message);
/* The group is being freed: the store watch lets go of its store. */
void c10d__pg_fr_forget(c10d_pg *pg);
/* The default group was created: the recorder learns it and starts watching
 * the store for other ranks' requests to dump. */
void c10d__pg_fr_on_created(c10d_pg *pg);

/* pg_store.c: the store and backend steps of group creation. */
int c10d__pg_rendezvous(const char *url, int rank, int world_size, int64_t timeout_ms,
                        c10d_store **store, int *rank_out, int *world_size_out,
                        int *store_outlives_job);
int c10d__pg_store_prefix(c10d_store *base, const char *prefix, c10d_store **out);
void c10d__pg_store_retain(c10d_store *store);
void c10d__pg_store_release(c10d_store *store);
/* torch's _store_based_barrier on `store` for group `name`. */
int c10d__pg_store_barrier(c10d_store *store, const char *name, int world_size, int64_t timeout_ms);
/* Every one of n ranks publishes `mine` as "<prefix>/<me>" and reads all n
 * ("<prefix>/<r>" into out->values[r] / out->lens[r]), waiting up to
 * timeout_ms for the last; the caller's thread, blocking. With `give_up`
 * (else NULL), the wait is cut into slices and give_up(arg) asked after each:
 * a nonzero status (c10d_last_error() set) ends it with that status. On
 * failure *out is empty; either way c10d__pg_exchanged_free releases it.
 * c10d__pg_store_forget deletes this rank's key once nobody reads it any
 * more (asynchronous, best effort). */
struct c10d__pg_exchanged {
    int n;
    void **values;
    size_t *lens;
};
int c10d__pg_store_exchange(c10d_store *s, const char *prefix, int me, int n, const void *mine,
                            size_t len, int64_t timeout_ms, int (*give_up)(void *arg), void *arg,
                            struct c10d__pg_exchanged *out);
void c10d__pg_exchanged_free(struct c10d__pg_exchanged *x);
void c10d__pg_store_forget(c10d_store *s, const char *prefix, int me);

/* pg_object.c: references (a group is forgotten at its last unref). */
void c10d__pg_ref(c10d_pg *pg);
void c10d__pg_unref(c10d_pg *pg);
/* Backend close, bounded: abort (when asked) then destroy every backend of
 * the group, waiting at most C10D_BACKEND_CLOSE_MS for the backends. */
void c10d__pg_close_backends(c10d_pg *pg, int abort, int status, const char *reason);
/* pg_create.c needs these of the registry. */
void c10d__pg_set_default(c10d_pg *pg);

/* Test hook: creates a group of `size` ranks (this one `rank`) over `store`
 * (may be NULL) with the given backend, without rendezvous or barrier. */
int c10d__pg_create_with_backend(const struct c10d__backend_vtable *vt, c10d_store *store, int rank,
                                 int size, int64_t timeout_ms, c10d_pg **out);

#endif
