/*
 * libc10d: torch.distributed's collectives for programs without Python.
 *
 * Conventions (see docs/api.md):
 *  - every public name starts with c10d_ / C10D_;
 *  - functions return 0 on success or a negative c10d_status; on failure
 *    c10d_last_error() holds a message naming what was wrong (thread-local);
 *  - an async call that fails never invokes its callback; one that succeeds
 *    invokes it exactly once, on the engine's own thread (never on a thread
 *    of yours, even one waiting in c10d_work_wait);
 *  - callbacks must not block: they run on the thread that does all I/O.
 *  - options structs start with `struct_size`: initialise them with their
 *    C10D_*_OPTS_INIT macro (or `= {0}`, read as version 0.1's layout); a
 *    zero field means "default";
 *  - out-parameters come last.
 */
#ifndef C10D_H
#define C10D_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(C10D_BUILDING) && defined(__GNUC__)
#define C10D_EXPORT __attribute__((visibility("default")))
#else
#define C10D_EXPORT
#endif

/* An options struct with only its size set, the rest zero (the defaults):
 * `c10d_pg_opts o = C10D_PG_OPTS_INIT;`. C++ has designated initializers
 * only from C++20, and -Wextra warns on a partial one: it gets a lambda. */
#ifdef __cplusplus
#define C10D__SIZED_INIT(T)                                                                        \
    ([] {                                                                                          \
        T c10d_init_{};                                                                            \
        c10d_init_.struct_size = sizeof(T);                                                        \
        return c10d_init_;                                                                         \
    }())
#else
#define C10D__SIZED_INIT(T)                                                                        \
    {                                                                                              \
        .struct_size = sizeof(T)                                                                   \
    }
#endif

#define C10D_VERSION_MAJOR 0
#define C10D_VERSION_MINOR 2
#define C10D_VERSION_PATCH 0

/* ---------------------------------------------------------------- status */

typedef enum c10d_status {
    C10D_OK = 0,
    C10D_PENDING = 1,       /* not an error: the work has not completed yet */
    C10D_EINVAL = -1,       /* a bad argument; the call had no effect */
    C10D_ETIMEDOUT = -2,    /* a deadline passed */
    C10D_ECANCELED = -3,    /* cancelled by the caller */
    C10D_ECLOSED = -4,      /* the peer (or store) closed the connection / died */
    C10D_EABORTED = -5,     /* the group or engine was aborted / shut down */
    C10D_ESTORE = -6,       /* the store answered with an error */
    C10D_EUNSUPPORTED = -7, /* valid request this backend/build cannot do */
    C10D_ENOMEM = -8,       /* out of memory, or a configured limit was reached */
    C10D_EIO = -9,          /* an OS-level I/O error */
    C10D_EPROTO = -10,      /* the peer spoke something we did not expect */
    C10D_EDEADLK = -11,     /* the call would deadlock (e.g. wait on the loop thread) */
    C10D_ENOTFOUND = -12,   /* no such key / object */
    C10D_EINTERNAL = -13,   /* a bug in libc10d: please report it */
    C10D_EREVOKED = -14,    /* the group failed earlier, was ended or destroyed: the call did
                               nothing (c10d_pg_error gives the original status and why) */
} c10d_status;

/* A short, static description of a status code ("connection closed by peer"). */
C10D_EXPORT const char *c10d_strerror(int status);

/* The status code's name ("C10D_ETIMEDOUT"). */
C10D_EXPORT const char *c10d_status_name(int status);

/* The detailed message of the last failed call on this thread ("" if none). */
C10D_EXPORT const char *c10d_last_error(void);

C10D_EXPORT const char *c10d_version(void);

/* What this build contains, e.g. "libc10d 0.2.0; backends: tcp; nccl 2.28.3 (runtime 2.28.3)". */
C10D_EXPORT const char *c10d_build_info(void);

/* ---------------------------------------------------- dtypes, reduce ops */

typedef enum c10d_dtype {
    C10D_FLOAT32 = 0,
    C10D_FLOAT64,
    C10D_FLOAT16,
    C10D_BFLOAT16,
    C10D_INT8,
    C10D_UINT8,
    C10D_INT32,
    C10D_INT64,
    C10D_BOOL,        /* one byte, 0 or 1 */
    C10D_FLOAT8_E4M3, /* e4m3fn: no infinities, 0x7f/0xff are NaN */
    C10D_FLOAT8_E5M2,
    C10D_INT16,
    C10D_UINT16,
    C10D_UINT32,
    C10D_UINT64,
    /* Pairs of float32 / float64 (real, imaginary), as C's float complex: reduced
     * as pairs of reals (SUM, AVG, PREMUL_SUM only), as torch does. */
    C10D_COMPLEX64,
    C10D_COMPLEX128,
    C10D_DTYPE_COUNT
} c10d_dtype;

typedef enum c10d_reduce_op {
    C10D_SUM = 0,
    C10D_AVG,
    C10D_PRODUCT,
    C10D_MIN,
    C10D_MAX,
    C10D_BAND,
    C10D_BOR,
    C10D_BXOR,
    C10D_PREMUL_SUM, /* each rank's input is multiplied by a factor, then summed */
    C10D_REDUCE_OP_COUNT
} c10d_reduce_op;

/* Size in bytes of one element; 0 for an unknown dtype. */
C10D_EXPORT size_t c10d_dtype_size(c10d_dtype dtype);
/* "float32", "bfloat16", ...; NULL for an unknown dtype. */
C10D_EXPORT const char *c10d_dtype_name(c10d_dtype dtype);
/* Parses a dtype name (also torch spellings: "float", "half", "bf16", "int", "long"). */
C10D_EXPORT int c10d_dtype_from_name(const char *name, c10d_dtype *out);
/* "SUM", "AVG", ...; NULL for an unknown op. */
C10D_EXPORT const char *c10d_reduce_op_name(c10d_reduce_op op);
C10D_EXPORT int c10d_reduce_op_from_name(const char *name, c10d_reduce_op *out);

/* Whether the host backend can reduce `dtype` with `op` (docs/semantics.md, 3).
 * Returns 0, or C10D_EINVAL with c10d_last_error() saying why, e.g.
 * "Cannot use ReduceOp.BAND with non-integral dtype float32". */
C10D_EXPORT int c10d_reduce_op_check(c10d_reduce_op op, c10d_dtype dtype);

/* ------------------------------------------------------------- engine */

/* The engine (one libuv loop on one thread per process) starts on first use.
 * c10d_shutdown() fails every pending work with C10D_EABORTED (their callbacks
 * run), closes every handle, joins the loop thread and frees the engine. A
 * later call that needs the engine starts a fresh one. Must not be called from
 * a callback (returns C10D_EDEADLK).
 *
 * fork(): the child starts with no engine, whatever the parent had; works and
 * groups inherited from the parent must not be used in the child (their
 * memory is merely leaked). The child may start its own engine by using the
 * library. */
C10D_EXPORT int c10d_shutdown(void);

/* Whether the calling thread is the engine's loop thread (the only thread
 * that runs callbacks). */
C10D_EXPORT int c10d_on_loop_thread(void);

/* -------------------------------------------------------- works/futures */

typedef struct c10d_work c10d_work;

/* Runs exactly once on the loop thread after `work` completes. `status` is the
 * work's final status. The callback may release `work`. Must not block. */
typedef void (*c10d_work_cb)(c10d_work *work, int status, void *arg);

/* A work created by the caller: a future to be completed with
 * c10d_work_complete(). timeout_ms > 0 gives it a deadline after which it
 * fails with C10D_ETIMEDOUT; 0 means no deadline. `what` names it in
 * messages (copied; may be NULL). The caller holds one reference. */
C10D_EXPORT int c10d_work_create(const char *what, int64_t timeout_ms, c10d_work **out);

/* Completes `work` with `status` (0 or a negative c10d_status) and an optional
 * message. Returns 1 if this call completed it, 0 if it was already complete
 * (the first completion wins), C10D_EINVAL for bad arguments. Any thread. */
C10D_EXPORT int c10d_work_complete(c10d_work *work, int status, const char *message);

/* Adds a completion callback. Callbacks run in registration order, on the
 * engine's own thread; one added after completion still runs (never inside
 * this call, except while c10d_shutdown runs: then it may run at once). */
C10D_EXPORT int c10d_work_on_complete(c10d_work *work, c10d_work_cb cb, void *arg);

/* Blocks until `work` completes and every callback registered on it so far
 * has run, or timeout_ms passes (< 0: no limit beyond the work's own
 * deadline). Returns the work's status, or C10D_ETIMEDOUT if the wait itself
 * timed out (the work goes on; with C10D_BLOCKING_WAIT=1 and timeout_ms > 0
 * the work fails instead, and the call returns once its callbacks ran, as
 * torch's blocking wait), or C10D_EDEADLK on the loop thread. The
 * waiting thread only waits: callbacks and I/O run on the engine's thread (or,
 * once c10d_shutdown stopped it, on the thread that completes the work), so
 * do not wait while holding a lock this work's own callbacks take. */
C10D_EXPORT int c10d_work_wait(c10d_work *work, int64_t timeout_ms);

/* Blocks until every one of works[0..n) completed or timeout_ms passes (< 0:
 * no limit beyond the works' own deadlines), as MPI_Waitall. Returns 0 if all
 * succeeded, else the status of the failed work of lowest index, with
 * c10d_last_error() naming that index and its message; C10D_ETIMEDOUT if some
 * are still pending at the timeout (this wins over a failure: the message
 * says how many are pending, which is first, and any failure so far; the works
 * go on). n == 0 returns 0. A NULL entry is C10D_EINVAL naming its index
 * (nothing waited for). C10D_EDEADLK on the loop thread. */
C10D_EXPORT int c10d_work_wait_all(c10d_work *const *works, size_t n, int64_t timeout_ms);

/* Blocks until at least one of works[0..n) completed or timeout_ms passes
 * (< 0: no limit), as MPI_Waitany. Sets *index to the lowest index among the
 * completed works (complete: c10d_work_wait would return its status) and
 * returns that work's status (a failure's message in c10d_last_error(), naming
 * the index); C10D_ETIMEDOUT with *index SIZE_MAX if none completed (the works
 * go on). timeout_ms == 0 only looks. n == 0, a NULL entry (named) or a NULL
 * index is C10D_EINVAL; C10D_EDEADLK on the loop thread. A wait that sleeps
 * leaves a small callback on each pending work, freed when that completes. */
C10D_EXPORT int c10d_work_wait_any(c10d_work *const *works, size_t n, int64_t timeout_ms,
                                   size_t *index);

/* torch's Future.then: runs once on the loop thread after `parent` completed,
 * whatever its status (`status`, message: c10d_work_message(parent)). Returns
 * 0 to complete `child` with success, a negative status to fail it (message:
 * c10d_last_error() if a call in the callback set it, else the parent's when
 * the callback returns the parent's status, else the status's name), or
 * C10D_PENDING when it completes `child` itself with c10d_work_complete, now
 * or later (retain `child` to keep it past the callback). Must not block. */
typedef int (*c10d_work_then_cb)(c10d_work *parent, int status, c10d_work *child, void *arg);

/* A new work (*out, one reference for the caller) that completes after `cb`
 * ran on `work`'s completion, as the callback says. Also on a work that has
 * already completed, and from a callback. The child has no deadline of its
 * own; c10d_work_cancel completes it with C10D_ECANCELED (`cb` still runs). */
C10D_EXPORT int c10d_work_then(c10d_work *work, c10d_work_then_cb cb, void *arg, c10d_work **out);

/* Makes `stream` (a cudaStream_t) wait for `work` without blocking the host,
 * where the work's backend can (a GPU backend enqueues a wait on its end
 * event). For a host work it is c10d_work_wait(work, -1): it blocks. The
 * caller keeps the work's buffers alive until the work completed. */
C10D_EXPORT int c10d_work_wait_stream(c10d_work *work, void *stream);

/* Stops a pending work early where that means something: a work made by
 * c10d_work_create completes with C10D_ECANCELED. Group ops cannot be
 * cancelled on one rank (C10D_EUNSUPPORTED: abort the group instead).
 * Returns 0 also when the work had already completed (it keeps its status). */
C10D_EXPORT int c10d_work_cancel(c10d_work *work);

/* 1 if complete, 0 if pending. Never blocks. */
C10D_EXPORT int c10d_work_test(c10d_work *work);

/* The final status once complete; C10D_PENDING (positive) while pending. */
C10D_EXPORT int c10d_work_status(c10d_work *work);

/* The failure message ("" on success or while pending). Valid while the caller
 * holds a reference. */
C10D_EXPORT const char *c10d_work_message(c10d_work *work);

/* The source rank of a receive from any source; -1 otherwise. */
C10D_EXPORT int c10d_work_source_rank(c10d_work *work);

/* For a group's op that failed: the group rank its backend blames (the first
 * peer whose process died or left the group, as c10d_pg_failed_ranks lists
 * them); -1 when no rank is known to have failed (a timeout, a mismatch, an
 * abort) and for any other work. Final once the work completed. */
C10D_EXPORT int c10d_work_failed_rank(c10d_work *work);

/* The device time of a completed GPU op in milliseconds, from its start to
 * its end event on the communicator's stream (torch's Work.get_duration()).
 * Needs C10D_NCCL_ENABLE_TIMING=1 (TORCH_NCCL_ENABLE_TIMING) when the group's
 * communicator was made. 0 and *ms set; C10D_PENDING while pending;
 * C10D_EUNSUPPORTED for a work with no device time (timing off, a failed op,
 * a host op). */
C10D_EXPORT int c10d_work_duration_ms(c10d_work *work, float *ms);

/* One more reference / one fewer. Each reference is released exactly once:
 * a second release of the same one is undefined, as a second free(). */
C10D_EXPORT void c10d_work_retain(c10d_work *work);
C10D_EXPORT void c10d_work_release(c10d_work *work);

/* ------------------------------------------------------- process groups
 * (docs/api.md) */

typedef struct c10d_store c10d_store;
typedef struct c10d_pg c10d_pg;

typedef enum c10d_device_type { C10D_DEVICE_CPU = 0, C10D_DEVICE_CUDA = 1 } c10d_device_type;

/* Root/peer value for a receive from any source (host backend only). */
#define C10D_ANY_SOURCE (-1)

typedef struct c10d_pg_opts {
    size_t struct_size;      /* sizeof(c10d_pg_opts): C10D_PG_OPTS_INIT */
    const char *backend;     /* "tcp" (alias "gloo"), "nccl", "cpu:tcp,cuda:nccl"; NULL: "tcp" */
    const char *init_method; /* rendezvous URL (env://, tcp://, file://); NULL: env:// */
    c10d_store *store;       /* explicit store instead of a URL (then rank/world_size needed) */
    int rank;                /* with a store, or to override the URL's */
    int world_size;          /* 0: from the URL / environment */
    int64_t timeout_ms;      /* default per-op timeout; 0: 30 min (tcp), 10 min (nccl) */
    const char *group_desc;  /* free text shown in messages and the flight recorder */
    /* 1: the group is bound to CUDA device `device_index` (torch's device_id):
     * the nccl backend creates its communicator during creation, and
     * subgroups split it (ncclCommSplit). 0: communicators are made on first
     * use of each device. Subgroups inherit the parent's binding. */
    int bind_device;
    int device_index;
    const struct c10d_nccl_opts *nccl; /* NULL: NCCL's defaults (copied at creation) */
    /* c10d_pg_new_group: 1: only the members call it and wait for each other
     * (torch's use_local_synchronization); the group is named from its
     * members, not from the world's group counter. */
    int use_local_synchronization;
    /* c10d_pg_shrink only: C10D_SHRINK_DEFAULT (0) or C10D_SHRINK_ABORT
     * (torch's shrink_flags, NCCL's NCCL_SHRINK_*). Added in 0.2: a caller
     * whose struct_size ends before it gets the default. */
    int shrink_flags;
    /* c10d_pg_merge_remote only: the merged group's name (torch's
     * group_name); NULL: "<parent name>:merge". Added in 0.2, after
     * shrink_flags: a caller whose struct_size ends before it gets the
     * default. */
    const char *group_name;
} c10d_pg_opts;

/* c10d_pg_opts.shrink_flags. DEFAULT: the parent's ops in flight are left
 * alone (they complete or fail on their own). ABORT: they are failed with
 * C10D_EABORTED first, and their buffers are no longer written once the
 * shrink returns; the parent is failed (later calls C10D_EREVOKED). */
#define C10D_SHRINK_DEFAULT 0
#define C10D_SHRINK_ABORT   1

/* The nccl backend's communicator settings (ncclConfig_t); zero: NCCL's
 * default (or its NCCL_* environment variable). */
typedef struct c10d_nccl_opts {
    size_t struct_size;       /* sizeof(c10d_nccl_opts): C10D_NCCL_OPTS_INIT */
    int high_priority_stream; /* 1: the communicator's stream gets the highest priority */
    int cga_cluster_size;
    int min_ctas;
    int max_ctas;
    const char *net_name;  /* "IB", "Socket", ... */
    const char *comm_name; /* default: "<group name>:<group desc>" */
    int split_share;       /* 1: children made by split share the parent's resources */
    int cta_policy;        /* NCCL_CTA_POLICY_* + 1 (0: default) */
    /* 1: nonblocking communicators (ncclConfig_t.blocking = 0): every NCCL
     * call returns at once and every wait is bounded, but NCCL starts a
     * thread for each op's launch. 0: blocking (torch's default), unless
     * C10D_NCCL_NONBLOCKING says otherwise; init runs on a worker thread
     * either way (docs/nccl.md). */
    int nonblocking;
} c10d_nccl_opts;
#define C10D_NCCL_OPTS_INIT C10D__SIZED_INIT(c10d_nccl_opts)
#define C10D_PG_OPTS_INIT   C10D__SIZED_INIT(c10d_pg_opts)

/* Per-call options; zero-initialised means defaults. */
typedef struct c10d_op_opts {
    size_t struct_size; /* sizeof(c10d_op_opts): C10D_OP_OPTS_INIT */
    int64_t timeout_ms; /* 0: the group's default */
    c10d_work_cb cb;    /* optional completion callback (loop thread, exactly once) */
    void *cb_arg;
    double premul_factor; /* the factor of C10D_PREMUL_SUM */
    c10d_device_type device_type;
    int device_index; /* CUDA device of the buffers */
    void *stream;     /* CUDA: the caller's cudaStream_t (NULL: the default stream) */
    /* PREMUL_SUM's factor as one element in device memory, in the op's dtype
     * (torch's one-element tensor factor), read by the device when the op
     * runs: it must stay alive and unchanged until the work completes. When
     * set it replaces premul_factor; nccl only (ncclScalarDevice): host
     * buffers and cuda:tcp refuse it with C10D_EINVAL. NULL: premul_factor. */
    const void *premul_factor_dev;
} c10d_op_opts;
#define C10D_OP_OPTS_INIT C10D__SIZED_INIT(c10d_op_opts)

/* Creates the default group: rendezvous, then connects the backend. Blocks
 * until ready or failed (bounded by opts->timeout_ms). */
C10D_EXPORT int c10d_pg_init(const c10d_pg_opts *opts, c10d_pg **out);
/* A subgroup of `parent` made of `ranks` (sorted; every rank of the parent calls
 * it, in the same order). Non-members get a handle for which c10d_pg_is_member
 * is 0 and whose collectives are no-ops with a warning. */
C10D_EXPORT int c10d_pg_new_group(c10d_pg *parent, const int *ranks, int nranks,
                                  const c10d_pg_opts *opts, c10d_pg **out);
/* `parent` without the ranks in `excluded` (parent group ranks): how a job
 * goes on after ranks failed or left. Only the surviving ranks call it, in
 * the same order and with the same list; the excluded ranks take no part and
 * need not be alive. A backend that can shrinks the parent's state (nccl:
 * ncclCommShrink, when this rank's parent communicator is healthy); else the
 * survivors connect afresh through the store (always so after the parent
 * failed). The new group is named "<parent name>/shrink<k>", k counting the
 * parent's shrinks, so the world's other group names stay in step.
 * opts->shrink_flags: C10D_SHRINK_ABORT ends the parent's ops in flight first
 * (nccl: NCCL_SHRINK_ABORT). Shrinking the default group makes the result the
 * default group; the old default and every group made before the shrink are
 * ended (their calls C10D_EREVOKED; destroy their handles). */
C10D_EXPORT int c10d_pg_shrink(c10d_pg *parent, const int *excluded, int nexcluded,
                               const c10d_pg_opts *opts, c10d_pg **out);
/* MPI_Comm_split / ncclCommSplit: every rank of `parent` calls it; ranks
 * with one color form a group, ordered by key (ties: parent rank). A rank
 * with C10D_SPLIT_NO_COLOR gets a handle for which c10d_pg_is_member is 0.
 * Only the parent's ranks take part (torch's use_local_synchronization); a
 * backend that can splits the parent's state (nccl: ncclCommSplit, all
 * colors in one call), else each group connects through the store. Named
 * "<parent name>/split<k>.<color>", k counting the parent's splits. */
#define C10D_SPLIT_NO_COLOR (-1)
C10D_EXPORT int c10d_pg_split(c10d_pg *parent, int color, int key, const c10d_pg_opts *opts,
                              c10d_pg **out);
/* torch's ProcessGroup.merge_remote_group: a new group of `size` ranks made
 * of the processes, from any number of groups (other jobs), that call it with
 * the same `store` (a store they all reach, used for one merge). Each caller
 * gets the next merged rank in order of arrival (torch's counter
 * "mergeGroupRank" in the store); the new group has the parent's backends
 * (tcp; nccl on the parent's device), connected through `store`, and its own
 * numbering (global rank = merged rank). `parent` is left as it was.
 * Bounded by opts->timeout_ms (0: 30 min): fewer than `size` callers is
 * C10D_ETIMEDOUT naming how many arrived; callers asking for different sizes,
 * or more callers than `size`, fail with C10D_EINVAL. opts may set
 * timeout_ms, group_name, group_desc (default "<parent desc>:merge") and the
 * device options; not store, init_method or backend. */
C10D_EXPORT int c10d_pg_merge_remote(c10d_pg *parent, c10d_store *store, int size,
                                     const c10d_pg_opts *opts, c10d_pg **out);
/* torch's new_subgroups: the parent cut into consecutive groups of
 * `group_size` ranks (which must divide its size); *out is this rank's. */
C10D_EXPORT int c10d_pg_new_subgroups(c10d_pg *parent, int group_size, const c10d_pg_opts *opts,
                                      c10d_pg **out);
/* torch's new_subgroups_by_enumeration: lists[i] (sizes[i] parent ranks) is
 * group i; a rank in two lists is an error; a rank in none gets a
 * non-member handle. Every parent rank calls it with the same lists. */
C10D_EXPORT int c10d_pg_new_subgroups_by_enumeration(c10d_pg *parent, const int *const *lists,
                                                     const int *sizes, int nlists,
                                                     const c10d_pg_opts *opts, c10d_pg **out);
C10D_EXPORT int c10d_pg_rank(const c10d_pg *pg);
C10D_EXPORT int c10d_pg_size(const c10d_pg *pg);
C10D_EXPORT int c10d_pg_is_member(const c10d_pg *pg);
/* Rank translation (torch's get_global_rank / get_group_rank /
 * get_process_group_ranks); global means the default group's rank. A rank
 * not in the group: C10D_ENOTFOUND. c10d_pg_ranks writes up to `cap` global
 * ranks in group order and returns the group's size. */
C10D_EXPORT int c10d_pg_global_rank(const c10d_pg *pg, int group_rank);
C10D_EXPORT int c10d_pg_group_rank(const c10d_pg *pg, int global_rank);
C10D_EXPORT int c10d_pg_ranks(const c10d_pg *pg, int *ranks, int cap);
/* The group's name ("0" for the default group), description, backend
 * ("tcp", "nccl", "tcp+nccl") and the sequence number of its last
 * collective (torch's _get_sequence_number_for_group); NULL / 0 for NULL. */
C10D_EXPORT const char *c10d_pg_name(const c10d_pg *pg);
C10D_EXPORT const char *c10d_pg_desc(const c10d_pg *pg);
C10D_EXPORT const char *c10d_pg_backend(const c10d_pg *pg);
C10D_EXPORT uint64_t c10d_pg_seq(c10d_pg *pg);
/* How the group's host (CPU) backend moves data between its ranks, as chosen
 * at creation: "shm" (every rank on this host: shared memory, docs/shm.md),
 * "shm+tcp" (several hosts, several ranks on some: all_reduce, broadcast and
 * reduce through shared memory within each host and tcp between hosts) or
 * "tcp"; NULL for NULL, a group this rank is not in, or one without a host
 * backend. */
C10D_EXPORT const char *c10d_pg_host_path(const c10d_pg *pg);
/* The sequence number of the group's last point-to-point op (or batch). */
C10D_EXPORT uint64_t c10d_pg_p2p_seq(c10d_pg *pg);
/* 0 while the group is usable; else the status that failed it (an op's
 * error, a lost peer the backend saw, an abort, a destroy), with its message
 * in c10d_last_error(), without running an op (torch's get_error). */
C10D_EXPORT int c10d_pg_error(c10d_pg *pg);
/* The group ranks the group's backends know failed (their connection was
 * lost: the process died or left), the first seen first: up to `cap` of them
 * into ranks (which may be NULL when cap is 0). Returns how many there are (0
 * for a healthy group), or C10D_EINVAL. What to pass to c10d_pg_shrink. The
 * tcp backend knows them; the nccl backend names none (NCCL reports no peer). */
C10D_EXPORT int c10d_pg_failed_ranks(c10d_pg *pg, int *ranks, int cap);
/* What a group's backends can do (torch's Backend.supports_*): */
typedef enum c10d_capability {
    C10D_CAP_SPLIT = 0,  /* split made by the backend from the parent (ncclCommSplit), not
                          * through the store */
    C10D_CAP_SHRINK,     /* shrink made by the backend (ncclCommShrink) */
    C10D_CAP_COALESCING, /* c10d_coalesce_begin / _end */
    C10D_CAP_HOST,       /* CPU buffers */
    C10D_CAP_CUDA,       /* CUDA buffers */
    C10D_CAP_COUNT
} c10d_capability;
/* 1 if every backend of the group that the capability concerns has it, 0 if
 * not, C10D_EINVAL for NULL or an unknown capability. */
C10D_EXPORT int c10d_pg_supports(const c10d_pg *pg, c10d_capability cap);
/* The CUDA device the group is bound to (c10d_pg_opts.bind_device; torch's
 * bound_device_id), or -1 for an unbound group, a non-member's, or NULL. */
C10D_EXPORT int c10d_pg_bound_device(const c10d_pg *pg);
/* The timeout of the group's later ops (those already submitted keep theirs),
 * as torch's _set_pg_timeout. C10D_EINVAL for timeout_ms <= 0. */
C10D_EXPORT int c10d_pg_set_timeout(c10d_pg *pg, int64_t timeout_ms);
/* The group's store: the job's store under the group's prefix, as the
 * backends use it (torch's _get_process_group_store). A new reference
 * (c10d_store_release it); C10D_ENOTFOUND on a rank not in the group. */
C10D_EXPORT int c10d_pg_store(c10d_pg *pg, c10d_store **out);
/* What a group's completion hook is told of each op (torch's WorkInfo). */
typedef struct c10d_work_info {
    const char *op_type;       /* torch's OpType name: "ALLREDUCE", "SEND", "COALESCED" */
    uint64_t seq;              /* the collective's (or P2P op's) sequence number */
    int status;                /* 0, or the status the op failed with */
    int64_t time_started_us;   /* wall clock (Unix epoch, us): handed to the backend */
    int64_t time_finished_us;  /* wall clock: completed */
    double active_duration_ms; /* device time where measured (C10D_NCCL_ENABLE_TIMING),
                                * else finished - started */
} c10d_work_info;
typedef void (*c10d_pg_completion_hook)(const c10d_work_info *info, void *arg);
/* Calls hook(info, arg) once for each op of the group when it completes,
 * failed ones included (the library's own internal ops excepted), on the
 * loop thread: it must not block. One hook per group (torch's
 * _register_on_completion_hook); a second is C10D_EINVAL. */
C10D_EXPORT int c10d_pg_register_completion_hook(c10d_pg *pg, c10d_pg_completion_hook hook,
                                                 void *arg);
/* 1 while the default group exists (torch's is_initialized). */
C10D_EXPORT int c10d_is_initialized(void);
/* Graceful: waits (bounded) for pending ops, then frees. */
C10D_EXPORT int c10d_pg_destroy(c10d_pg *pg);
/* Immediate: fails pending works with C10D_EABORTED, closes transports, frees. */
C10D_EXPORT int c10d_pg_abort(c10d_pg *pg, const char *reason);

/* The flight recorder (docs/debugging.md): writes the last ops of every
 * group of this process as JSON to `path`, or with NULL to
 * "<C10D_TRACE_FILE_PREFIX><rank>.json", through a temporary file and a
 * rename, on the calling thread. Returns 0, C10D_EUNSUPPORTED when the
 * recorder is off (C10D_TRACE_BUFFER_SIZE=0), C10D_EINVAL for NULL before any
 * op gave this process a rank, C10D_EIO when the file cannot be written. */
C10D_EXPORT int c10d_flight_recorder_dump(const char *path);
/* The same dump as JSON text in memory (*out, malloc'd: free() it), with
 * only_active only the ops not completed yet (torch's onlyActive), for a
 * program that ships it elsewhere. */
C10D_EXPORT int c10d_flight_recorder_dump_json(int only_active, char **out);
/* Forgets the ops recorded so far (the groups stay known), so that the next
 * dump shows only what came after (torch's _reset_fr_recording_nccl). */
C10D_EXPORT int c10d_flight_recorder_reset(void);

/* Collectives. NCCL-style buffers: `send` and `recv` may be the same pointer
 * (in place). Counts are elements of `dtype`. Each returns 0 and, when `work`
 * is not NULL, a work the caller must release; on error nothing was sent,
 * no sequence number was consumed and the callback will not run. */
C10D_EXPORT int c10d_broadcast(c10d_pg *pg, const void *send, void *recv, size_t count,
                               c10d_dtype dtype, int root, const c10d_op_opts *opts,
                               c10d_work **work);
C10D_EXPORT int c10d_all_reduce(c10d_pg *pg, const void *send, void *recv, size_t count,
                                c10d_dtype dtype, c10d_reduce_op op, const c10d_op_opts *opts,
                                c10d_work **work);
/* recv is only written on root (may be NULL elsewhere). */
C10D_EXPORT int c10d_reduce(c10d_pg *pg, const void *send, void *recv, size_t count,
                            c10d_dtype dtype, c10d_reduce_op op, int root, const c10d_op_opts *opts,
                            c10d_work **work);
/* recv holds size x count elements, rank r's at r * count. */
C10D_EXPORT int c10d_all_gather(c10d_pg *pg, const void *send, void *recv, size_t count,
                                c10d_dtype dtype, const c10d_op_opts *opts, c10d_work **work);
/* List form: recvs[r] receives rank r's count elements. */
C10D_EXPORT int c10d_all_gather_list(c10d_pg *pg, const void *send, void *const *recvs,
                                     size_t count, c10d_dtype dtype, const c10d_op_opts *opts,
                                     c10d_work **work);
/* On root recv holds size x count elements; elsewhere recv must be NULL. */
C10D_EXPORT int c10d_gather(c10d_pg *pg, const void *send, void *recv, size_t count,
                            c10d_dtype dtype, int root, const c10d_op_opts *opts, c10d_work **work);
/* On root send holds size x count elements; elsewhere send must be NULL. */
C10D_EXPORT int c10d_scatter(c10d_pg *pg, const void *send, void *recv, size_t count,
                             c10d_dtype dtype, int root, const c10d_op_opts *opts,
                             c10d_work **work);
/* List forms: on the root, recvs[r] gets rank r's count elements (gather) or
 * sends[r] goes to rank r (scatter); the list is ignored elsewhere. They run
 * as one batch of send/recv (P2P numbering, tag 0), as torch's NCCL gather
 * and scatter do. */
C10D_EXPORT int c10d_gather_list(c10d_pg *pg, const void *send, void *const *recvs, size_t count,
                                 c10d_dtype dtype, int root, const c10d_op_opts *opts,
                                 c10d_work **work);
C10D_EXPORT int c10d_scatter_list(c10d_pg *pg, const void *const *sends, void *recv, size_t count,
                                  c10d_dtype dtype, int root, const c10d_op_opts *opts,
                                  c10d_work **work);
/* Reduce-scatter with a size per rank (host buffers, or CUDA buffers on
 * nccl): `send` holds sum(counts) elements, block r (counts[r] of them) at
 * the sum of counts[0..r); `recv` gets counts[rank] elements, the reduction
 * of every rank's block `rank`. Every rank passes the same counts. On nccl
 * one op: an ncclReduce per rank in one NCCL group. */
C10D_EXPORT int c10d_reduce_scatter_v(c10d_pg *pg, const void *send, void *recv,
                                      const size_t *counts, c10d_dtype dtype, c10d_reduce_op op,
                                      const c10d_op_opts *opts, c10d_work **work);
/* send holds size x count elements; recv gets the reduction of block `rank`. */
C10D_EXPORT int c10d_reduce_scatter(c10d_pg *pg, const void *send, void *recv, size_t count,
                                    c10d_dtype dtype, c10d_reduce_op op, const c10d_op_opts *opts,
                                    c10d_work **work);
/* List form: sends[r] (count elements each) is this rank's contribution to rank r. */
C10D_EXPORT int c10d_reduce_scatter_list(c10d_pg *pg, const void *const *sends, void *recv,
                                         size_t count, c10d_dtype dtype, c10d_reduce_op op,
                                         const c10d_op_opts *opts, c10d_work **work);
/* send_counts[r] elements go to rank r, recv_counts[r] come from rank r, packed
 * in rank order. NULL counts: `count` split evenly (count % size == 0). */
C10D_EXPORT int c10d_all_to_all_single(c10d_pg *pg, const void *send, void *recv, size_t count,
                                       const size_t *send_counts, const size_t *recv_counts,
                                       c10d_dtype dtype, const c10d_op_opts *opts,
                                       c10d_work **work);
/* List form: sends[r] / recvs[r] with send_counts[r] / recv_counts[r] elements. */
C10D_EXPORT int c10d_all_to_all(c10d_pg *pg, const void *const *sends, const size_t *send_counts,
                                void *const *recvs, const size_t *recv_counts, c10d_dtype dtype,
                                const c10d_op_opts *opts, c10d_work **work);
/* All-gather with a size per rank (torch's all_gather of tensors of different
 * sizes): rank r contributes counts[r] elements (its `send`), and `recv`
 * holds them all, rank r's at the sum of counts[0..r). Every rank passes the
 * same counts. On nccl one op (an ncclBroadcast per rank in one NCCL group);
 * elsewhere the list form of all_to_all (one message per pair). */
C10D_EXPORT int c10d_all_gather_v(c10d_pg *pg, const void *send, void *recv, const size_t *counts,
                                  c10d_dtype dtype, const c10d_op_opts *opts, c10d_work **work);
/* Completes once every rank has entered it and every earlier op of this rank's group is done. */
C10D_EXPORT int c10d_barrier(c10d_pg *pg, const c10d_op_opts *opts, c10d_work **work);
/* torch's monitored_barrier: rank 0 names the ranks that did not arrive in
 * time (opts->timeout_ms, 0: the group's); with wait_all_ranks it names all of
 * them, else the first. Host backend only. */
C10D_EXPORT int c10d_monitored_barrier(c10d_pg *pg, int wait_all_ranks, const c10d_op_opts *opts,
                                       c10d_work **work);

/* Point to point. tag >= 0. recv with peer C10D_ANY_SOURCE reports the sender
 * through c10d_work_source_rank. */
C10D_EXPORT int c10d_send(c10d_pg *pg, const void *buf, size_t count, c10d_dtype dtype, int peer,
                          int tag, const c10d_op_opts *opts, c10d_work **work);
C10D_EXPORT int c10d_recv(c10d_pg *pg, void *buf, size_t count, c10d_dtype dtype, int peer, int tag,
                          const c10d_op_opts *opts, c10d_work **work);

typedef enum c10d_p2p_kind { C10D_P2P_SEND = 0, C10D_P2P_RECV = 1 } c10d_p2p_kind;
typedef struct c10d_p2p_op {
    c10d_p2p_kind kind;
    void *buf;
    size_t count;
    c10d_dtype dtype;
    int peer;
    int tag;
} c10d_p2p_op;
/* torch's batch_isend_irecv: one work for the whole batch. */
C10D_EXPORT int c10d_batch_isend_irecv(c10d_pg *pg, const c10d_p2p_op *ops, int nops,
                                       const c10d_op_opts *opts, c10d_work **work);

/* Coalescing: collectives issued between begin and end form one group (one
 * sequence number); end returns one work for all of them. */
C10D_EXPORT int c10d_coalesce_begin(c10d_pg *pg);
C10D_EXPORT int c10d_coalesce_end(c10d_pg *pg, const c10d_op_opts *opts, c10d_work **work);

/* Waits for `work` (bounded by its own deadline), releases it and returns its
 * status: the body of every *_sync helper. */
C10D_EXPORT int c10d_work_wait_release(c10d_work *work);
C10D_EXPORT int c10d_all_reduce_sync(c10d_pg *pg, const void *send, void *recv, size_t count,
                                     c10d_dtype dtype, c10d_reduce_op op);
C10D_EXPORT int c10d_broadcast_sync(c10d_pg *pg, const void *send, void *recv, size_t count,
                                    c10d_dtype dtype, int root);
C10D_EXPORT int c10d_barrier_sync(c10d_pg *pg);

/* Object collectives (torch's *_object and *_object_list) over byte strings
 * the caller serialized: sizes first (int64), then the payloads, so each rank
 * may pass a different length (docs/api.md). They block the calling thread
 * (C10D_EDEADLK inside a callback) and run as ordinary ops of the group on
 * host buffers, each bounded by `opts->timeout_ms` (NULL: the group's).
 * Received strings are malloc'd: free them with c10d_bytes_free. A failure
 * fails the call; the group's state is that of the failed op. */
typedef struct c10d_bytes {
    void *data;
    size_t len;
} c10d_bytes;
C10D_EXPORT void c10d_bytes_free(c10d_bytes *items, int n);
/* out[size]: every rank's string, in group rank order. */
C10D_EXPORT int c10d_all_gather_object(c10d_pg *pg, const void *obj, size_t len, c10d_bytes *out,
                                       const c10d_op_opts *opts);
/* out[size] on the root (NULL elsewhere). */
C10D_EXPORT int c10d_gather_object(c10d_pg *pg, const void *obj, size_t len, c10d_bytes *out,
                                   int root, const c10d_op_opts *opts);
/* objs[n]: the root's strings are sent; the others' are replaced (any data
 * they held is not freed). Every rank passes the same n. */
C10D_EXPORT int c10d_broadcast_object_list(c10d_pg *pg, c10d_bytes *objs, int n, int root,
                                           const c10d_op_opts *opts);
/* in[size] on the root: rank i receives in[i] into *out. */
C10D_EXPORT int c10d_scatter_object_list(c10d_pg *pg, const c10d_bytes *in, c10d_bytes *out,
                                         int root, const c10d_op_opts *opts);
/* n strings to / from one peer (tag 0, as torch); the receiver passes the
 * same n and gets them in objs. */
C10D_EXPORT int c10d_send_object_list(c10d_pg *pg, const c10d_bytes *objs, int n, int dst,
                                      const c10d_op_opts *opts);
C10D_EXPORT int c10d_recv_object_list(c10d_pg *pg, c10d_bytes *objs, int n, int src,
                                      const c10d_op_opts *opts);

/* ------------------------------------------------------------------ store
 * (docs/store_client.md)
 *
 * A key-value store for rendezvous, compatible with torch.distributed's
 * stores: TCP (PyTorch's TCPStore wire protocol, either dialect), prefix
 * (PrefixStore), in-memory hash (HashStore) and file (FileStore).
 *
 * Every operation is a work, as group ops are: c10d_store_submit checks a
 * request on the caller's thread (an error returns at once and makes no
 * work), then the operation runs on the engine's loop thread and completes
 * its work with the result, which c10d_store_work_result reads in place for
 * as long as the work is held. Wait on it, test it, attach callbacks
 * (c10d_work_on_complete), compose it (c10d_work_wait_all, c10d_work_then).
 * Every operation has a deadline (the store's timeout, or the one given to
 * WAIT): nothing waits forever. The _sync wrappers are submit + wait: they
 * block the calling thread (C10D_EDEADLK on the loop thread) and hand back
 * malloc'd copies the caller frees with free().
 *
 * Keys are NUL-terminated strings; values are byte strings. GET and MULTI_GET
 * wait for their keys up to the store's timeout (C10D_ETIMEDOUT); a key that
 * vanished after the wait is C10D_ENOTFOUND "key not found", never an empty
 * value. Counters (ADD) are stored as decimal text. */

typedef struct c10d_store_bytes {
    const void *data;
    size_t len;
} c10d_store_bytes;

typedef struct c10d_store_result {
    int status;          /* 0 or a negative c10d_status */
    const char *message; /* why it failed; "" on success */
    /* ADD: the new value; NUM_KEYS, QUEUE_LEN, LIST_KEYS: the count; CHECK: 1
     * ready / 0 not; DELETE_KEY: 1 deleted / 0 absent; QUEUE_POP: the queue's
     * length before the pop; PING: the round trip in microseconds. */
    int64_t value;
    c10d_store_bytes data; /* GET, COMPARE_SET, QUEUE_POP */
    size_t count;          /* MULTI_GET values, LIST_KEYS keys */
    const c10d_store_bytes *items;
} c10d_store_result;

typedef enum c10d_store_dialect {
    C10D_DIALECT_AUTO = 0, /* current first; falls back to legacy (docs/store_client.md) */
    C10D_DIALECT_CURRENT,  /* PyTorch 2.5 .. 2.11 (VALIDATE + PING after connect) */
    C10D_DIALECT_LEGACY,   /* PyTorch 1.13: no CANCEL_WAIT, PING, APPEND, MULTI_*, QUEUE_* */
} c10d_store_dialect;

typedef struct c10d_store_tcp_opts {
    size_t struct_size; /* sizeof(c10d_store_tcp_opts): C10D_STORE_TCP_OPTS_INIT */
    int64_t timeout_ms; /* connect and per-operation deadline [300000, torch's default] */
    int dialect;        /* c10d_store_dialect [AUTO] */
    /* > 0: register as a worker (ADD init/ 1), as torch's TCPStore does when
     * it knows the world size. */
    int world_size;
    /* With world_size: also wait until init/ reaches world_size (torch's
     * master waits for its workers) before returning. */
    int wait_for_workers;
} c10d_store_tcp_opts;
#define C10D_STORE_TCP_OPTS_INIT C10D__SIZED_INIT(c10d_store_tcp_opts)

/* Connects (retrying with exponential backoff until the timeout) and returns
 * a connected store. opts may be NULL. */
C10D_EXPORT int c10d_store_tcp_connect(const char *host, int port, const c10d_store_tcp_opts *opts,
                                       c10d_store **out);
/* A TCPStore server in this process (torch's TCPStore(is_master=True)), on the
 * library's loop: `host` NULL, "" or "*" listens on every address, `port` 0
 * on a free one (*port_out, may be NULL, gets it). With C10D_STORE_TOKEN set,
 * clients must present it. Serves until c10d_store_server_stop (which frees
 * the handle) or c10d_shutdown (after which stop only frees it). */
typedef struct c10d_store_server c10d_store_server;
C10D_EXPORT int c10d_store_tcp_serve(const char *host, int port, c10d_store_server **out,
                                     int *port_out);
C10D_EXPORT int c10d_store_server_stop(c10d_store_server *server);
/* The same store over connections of its own, for a thread that waits
 * (torch's Store.clone): a TCP client connects anew (blocks; the dialect and
 * timeout of `store`), a prefix store clones its base; an in-process store
 * is itself (a new reference). Release it like any store. */
C10D_EXPORT int c10d_store_clone(c10d_store *store, c10d_store **out);
/* Every key becomes "<prefix>/<key>" in `base` (which gains a reference). */
C10D_EXPORT int c10d_store_prefix(c10d_store *base, const char *prefix, c10d_store **out);
/* In-process, thread-safe; waits see sets from any thread. */
C10D_EXPORT int c10d_store_hash_create(c10d_store **out);
/* Several processes on one host share `path` (created if missing). With
 * world_size > 0 the last of world_size users to release it removes the file. */
C10D_EXPORT int c10d_store_file_open(const char *path, int world_size, c10d_store **out);

/* A store you implement (torch's Store subclass: etcd, Redis, a cluster's
 * own key-value service); docs/store_client.md, "User stores". Every
 * function runs on a thread of its own, never the engine's loop, and may
 * block. Each returns 0 or a negative c10d_status (C10D_ETIMEDOUT when a
 * timeout passed, C10D_ENOTFOUND for a missing key); `error` (may be NULL),
 * called on the same thread right after a failure, may say why. Values
 * handed back (*value) are malloc'd by you and freed by the library with
 * free(). Functions may be called from several threads at once. Required:
 * set, get, add, check, wait, delete_key. Optional (NULL): the rest;
 * MULTI_GET, MULTI_SET and APPEND are derived, other commands the store
 * lacks fail with C10D_EUNSUPPORTED. */
typedef struct c10d_store_impl {
    size_t struct_size; /* sizeof(c10d_store_impl): C10D_STORE_IMPL_INIT */
    void *ctx;          /* passed to every function */
    const char *name;   /* for messages ("user" if NULL); copied */
    int (*set)(void *ctx, const char *key, const void *value, size_t len);
    /* Waits up to timeout_ms (> 0) for the key to exist. */
    int (*get)(void *ctx, const char *key, int64_t timeout_ms, void **value, size_t *len);
    /* A missing key counts as 0; stores the sum as decimal text. */
    int (*add)(void *ctx, const char *key, int64_t delta, int64_t *result);
    /* *ready: 1 if every key exists. */
    int (*check)(void *ctx, const char *const *keys, size_t n, int *ready);
    /* Until every key exists, up to timeout_ms (> 0): C10D_ETIMEDOUT. */
    int (*wait)(void *ctx, const char *const *keys, size_t n, int64_t timeout_ms);
    /* *deleted: 1 if the key existed. */
    int (*delete_key)(void *ctx, const char *key, int *deleted);
    /* Optional from here on. docs/store_protocol.md's rule; *value: what the
     * store answers (the value it holds after, or `expected` for a missing
     * key and a non-empty `expected`). */
    int (*compare_set)(void *ctx, const char *key, const void *expected, size_t expected_len,
                       const void *desired, size_t desired_len, void **value, size_t *len);
    int (*num_keys)(void *ctx, int64_t *count);
    const char *(*error)(void *ctx);
    /* Once, after the last operation finished (any thread; must not block long). */
    void (*destroy)(void *ctx);
} c10d_store_impl;
#define C10D_STORE_IMPL_INIT C10D__SIZED_INIT(c10d_store_impl)

/* A store over `impl` (copied; ctx is yours until destroy). */
C10D_EXPORT int c10d_store_from_impl(const c10d_store_impl *impl, c10d_store **out);

C10D_EXPORT void c10d_store_retain(c10d_store *store);
/* Drops a reference; the last one fails pending operations with C10D_ECLOSED
 * (their callbacks run) and frees the store once they are done. */
C10D_EXPORT void c10d_store_release(c10d_store *store);
/* The per-operation deadline (torch's set_timeout); > 0. */
C10D_EXPORT int c10d_store_set_timeout(c10d_store *store, int64_t timeout_ms);
C10D_EXPORT int64_t c10d_store_timeout(c10d_store *store);
/* "tcp", "prefix", "hash", "file", "user". */
C10D_EXPORT const char *c10d_store_kind(c10d_store *store);
/* The dialect a TCP store speaks (after auto detection); 0 for other stores. */
C10D_EXPORT int c10d_store_dialect_of(c10d_store *store);

/* The operations, one request struct for all (torch's Store methods). */
typedef enum c10d_store_op {
    C10D_STORE_OP_SET = 0,
    C10D_STORE_OP_GET,
    C10D_STORE_OP_ADD,
    C10D_STORE_OP_COMPARE_SET, /* docs/store_protocol.md's rule; data: what the store answered */
    C10D_STORE_OP_WAIT,
    C10D_STORE_OP_CHECK,
    C10D_STORE_OP_DELETE_KEY,
    C10D_STORE_OP_NUM_KEYS,
    C10D_STORE_OP_APPEND,
    C10D_STORE_OP_MULTI_GET,
    C10D_STORE_OP_MULTI_SET,
    C10D_STORE_OP_QUEUE_PUSH,
    C10D_STORE_OP_QUEUE_POP,
    C10D_STORE_OP_QUEUE_LEN,
    C10D_STORE_OP_LIST_KEYS,    /* keys with a value (servers that have LIST_KEYS; prefix
                                 * stores list their own keys) */
    C10D_STORE_OP_SERVER_STATS, /* c10d-store only; data: JSON */
    C10D_STORE_OP_PING,
} c10d_store_op;

typedef struct c10d_store_request {
    size_t struct_size; /* sizeof(c10d_store_request): C10D_STORE_REQUEST_INIT */
    c10d_store_op op;
    const char *key;   /* single-key ops */
    const void *value; /* SET, APPEND, QUEUE_PUSH; COMPARE_SET: the desired value */
    size_t len;
    const void *expected; /* COMPARE_SET */
    size_t expected_len;
    int64_t delta;           /* ADD */
    const char *const *keys; /* WAIT, CHECK, MULTI_GET, MULTI_SET */
    size_t nkeys;
    const void *const *values; /* MULTI_SET */
    const size_t *lens;
    int64_t timeout_ms; /* the op's deadline (a WAIT's, a GET's wait for
                         * its key); <= 0: the store's timeout */
    int block;          /* QUEUE_POP: wait up to the store's timeout for an item;
                         * else an empty queue is C10D_ENOTFOUND */
} c10d_store_request;
#define C10D_STORE_REQUEST_INIT C10D__SIZED_INIT(c10d_store_request)

/* Checks and starts `req` on `s`; *work (not NULL) completes with the op's
 * status and message, bounded by the store's deadline. The arguments are
 * copied: they may be freed when the call returns. A rejected call returns
 * the error and makes no work. */
C10D_EXPORT int c10d_store_submit(c10d_store *s, const c10d_store_request *req, c10d_work **work);
/* The result of a completed store work (NULL while pending or for another
 * kind of work); valid while the caller holds the work. */
C10D_EXPORT const c10d_store_result *c10d_store_work_result(c10d_work *work);

/* Sync wrappers: same semantics; outputs are malloc'd (free() them). */
C10D_EXPORT int c10d_store_set_sync(c10d_store *s, const char *key, const void *value, size_t len);
C10D_EXPORT int c10d_store_get_sync(c10d_store *s, const char *key, void **value, size_t *len);
/* c10d-store only (not PyTorch's servers, which close the connection on it):
 * the server's stats (connections, keys, bytes, waiters, ops and ops/s per
 * command) as a JSON string in result.data / a malloc'd NUL-terminated *json.
 * C10D_EUNSUPPORTED on the legacy dialect and on local stores. */
C10D_EXPORT int c10d_store_server_stats_sync(c10d_store *s, char **json);
C10D_EXPORT int c10d_store_add_sync(c10d_store *s, const char *key, int64_t delta, int64_t *result);
C10D_EXPORT int c10d_store_compare_set_sync(c10d_store *s, const char *key, const void *expected,
                                            size_t expected_len, const void *desired,
                                            size_t desired_len, void **value, size_t *len);
C10D_EXPORT int c10d_store_wait_sync(c10d_store *s, const char *const *keys, size_t n,
                                     int64_t timeout_ms);
C10D_EXPORT int c10d_store_check_sync(c10d_store *s, const char *const *keys, size_t n, int *ready);
C10D_EXPORT int c10d_store_delete_key_sync(c10d_store *s, const char *key, int *deleted);
C10D_EXPORT int c10d_store_num_keys_sync(c10d_store *s, int64_t *count);
C10D_EXPORT int c10d_store_append_sync(c10d_store *s, const char *key, const void *value,
                                       size_t len);
/* values[i] / lens[i] for each of the n keys. */
C10D_EXPORT int c10d_store_multi_get_sync(c10d_store *s, const char *const *keys, size_t n,
                                          void **values, size_t *lens);
C10D_EXPORT int c10d_store_multi_set_sync(c10d_store *s, const char *const *keys,
                                          const void *const *values, const size_t *lens, size_t n);
C10D_EXPORT int c10d_store_queue_push_sync(c10d_store *s, const char *key, const void *value,
                                           size_t len);
C10D_EXPORT int c10d_store_queue_pop_sync(c10d_store *s, const char *key, int block, void **value,
                                          size_t *len);
C10D_EXPORT int c10d_store_queue_len_sync(c10d_store *s, const char *key, int64_t *len);
/* *keys: an array of *n NUL-terminated strings; free each, then the array. */
C10D_EXPORT int c10d_store_list_keys_sync(c10d_store *s, char ***keys, size_t *n);
/* *rtt_us (may be NULL): the round trip. */
C10D_EXPORT int c10d_store_ping_sync(c10d_store *s, int64_t *rtt_us);

/* ------------------------------------------------------------ rendezvous
 * (docs/store_client.md) */

typedef struct c10d_rendezvous_opts {
    size_t struct_size; /* sizeof(c10d_rendezvous_opts): C10D_RENDEZVOUS_OPTS_INIT */
    int64_t timeout_ms; /* store deadline and barrier timeout [300000] */
    /* The URL's host:port is an external server (c10d-store or torchrun's
     * agent): rank 0 connects instead of hosting one. */
    int external_store;
    /* Skip the store-based barrier after rendezvous. */
    int no_barrier;
    /* With world_size > 0: rank and world_size for what the URL (or, for
     * env://, the environment) does not give. Zero: unset. */
    int rank;
    int world_size;
    int dialect; /* c10d_store_dialect for TCP [AUTO] */
} c10d_rendezvous_opts;
#define C10D_RENDEZVOUS_OPTS_INIT C10D__SIZED_INIT(c10d_rendezvous_opts)

typedef struct c10d_rendezvous_result {
    /* PrefixStore("default_pg") over the rendezvous store; on an agent or
     * external store, "<attempt namespace>/default_pg" (docs/store_client.md,
     * "Stores that outlive a job"). Release it. */
    c10d_store *store;
    int rank;
    int world_size;
} c10d_rendezvous_result;

/* url: "env://", "tcp://host:port?rank=R&world_size=N",
 * "file:///path?rank=R&world_size=N" (NULL: "env://"). Rank 0 hosts the
 * store on the engine's loop unless opts->external_store or
 * TORCHELASTIC_USE_AGENT_STORE=True. Ends with the store-based barrier. */
C10D_EXPORT int c10d_rendezvous(const char *url, const c10d_rendezvous_opts *opts,
                                c10d_rendezvous_result *out);

/* Who started this process (docs/launchers.md): what the env:// rendezvous
 * reads from torchrun/c10drun, Kubeflow's PyTorchJob, Open MPI's mpirun,
 * MPICH/Hydra or Slurm's srun. Usable before any group exists, e.g. to pick
 * this rank's GPU from local_rank. */
typedef struct c10d_launch_info {
    size_t struct_size;   /* sizeof(c10d_launch_info): C10D_LAUNCH_INFO_INIT (0: this layout) */
    int rank;             /* -1: no launcher detected */
    int world_size;       /* -1: no launcher detected */
    int local_rank;       /* rank on this node; -1: the launcher does not say */
    int local_world_size; /* processes on this node; -1: the launcher does not say */
    const char *launcher; /* "torchrun/c10drun", "Open MPI", "Slurm srun", ..., "none" */
} c10d_launch_info;
#define C10D_LAUNCH_INFO_INIT C10D__SIZED_INIT(c10d_launch_info)

/* Reads the environment now (no I/O, no engine). No launcher: 0 with
 * rank -1 and launcher "none". A launcher whose variables are half-set or
 * inconsistent: C10D_EINVAL with the message env:// would give. */
C10D_EXPORT int c10d_launch_query(c10d_launch_info *info);

/* The store-based barrier of init_process_group on `store`: every one of
 * world_size callers adds itself to "store_based_barrier_key:<name>" and waits
 * for the last. */
C10D_EXPORT int c10d_store_barrier(c10d_store *store, const char *name, int world_size,
                                   int64_t timeout_ms);

/* -------------------------------------------------------- end of store */

#ifdef __cplusplus
}
#endif
#endif /* C10D_H */
