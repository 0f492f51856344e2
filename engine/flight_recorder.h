/* The flight recorder: a process-wide ring of the last C10D_TRACE_BUFFER_SIZE
 * ops (default 2000, 0: off) and its JSON dump, in the layout of PyTorch's
 * NCCL flight recorder (docs/debugging.md). The group layer records an op
 * when it is numbered, marks it started when the backend gets it and
 * completed (or retired, when it failed) when its work completes; it also
 * decides when to dump. Any thread. */
#ifndef C10D_ENGINE_FLIGHT_RECORDER_H
#define C10D_ENGINE_FLIGHT_RECORDER_H

#include <stddef.h>
#include <stdint.h>

/* A group's name and description as an entry holds them: truncated and
 * zero-padded once, copied per op without measuring them again. */
struct c10d__fr_names {
    char pg_name[64];
    char pg_desc[64];
};
void c10d__fr_names_init(struct c10d__fr_names *n, const char *pg_name, const char *pg_desc);
/* The names interned for the process's life, once per (name, desc): an
 * entry keeps a pointer to them, 8 bytes where a copy was 128 per op (and
 * a ring of 2000 entries half the size, so that it stays in a core's L2),
 * and the pointer outlives the group. Like the recorder's list of groups,
 * they are kept: about 140 bytes per group name made while recording is on.
 * NULL: out of memory. */
const struct c10d__fr_names *c10d__fr_names_intern(const char *pg_name, const char *pg_desc);

/* What the group layer knows of an op when it numbers it. The group's names
 * are `names` (c10d__fr_names_intern's) where set, else pg_name and pg_desc
 * interned here (truncated to the names' fixed fields); `backend` and `op`
 * are kept by pointer, so they must be string literals or live as long as
 * the process. */
struct c10d__fr_op {
    const struct c10d__fr_names *names;
    const char *pg_name, *pg_desc;
    const char *backend; /* "tcp", "nccl": profiling_name is "<backend>:<op>" */
    const char *op;      /* "all_reduce", "coalesced", ... */
    uint64_t coll_seq, p2p_seq, op_id;
    int is_p2p;
    /* Each of in_tensors inputs holds in_numel elements (likewise outputs). */
    size_t in_numel, out_numel;
    int in_tensors, out_tensors;
    int dtype; /* c10d_dtype */
    int root;  /* -1: none */
    int peer;  /* P2P peer (group rank); -1: none */
    int64_t timeout_ms;
    /* Recorded as started at once: its backend takes it in the same call
     * (c10d__fr_refused undoes that if it refuses). */
    int started;
    /* When it was made (c10d__now_coarse_ns, the monotonic clock at the
     * kernel's tick), read once for the record and its work; 0: read here. */
    uint64_t now_ns;
};

/* 1 when recording is on. The first call reads the environment. */
int c10d__fr_enabled(void);
/* Registers the recorder's fork handlers (once); see c10d__engine_init. */
void c10d__fr_init(void);

/* Records an op as scheduled. Returns its record id + 1, or 0 when the
 * recorder is off (then the call cost one branch). */
uint64_t c10d__fr_record(const struct c10d__fr_op *op);

/* Marks record `rid` (c10d__fr_record's value; 0 is ignored) started or
 * completed. An entry the ring has reused since is left alone. `status` < 0
 * retires the entry without completing it, as PyTorch's watchdog does for a
 * timed-out op: it stays "scheduled" or "started", which is where it hung.
 * Started takes the time the op was recorded (a wall-clock read was 15-20 ns
 * of the recorder's 110 per op); the group layer records its ops started at
 * once instead (`started` above), as its backend takes them in that call. */
void c10d__fr_started(uint64_t rid);
void c10d__fr_completed(uint64_t rid, int status);
/* An op recorded as started that its backend refused: back to scheduled. */
void c10d__fr_refused(uint64_t rid);

/* A group's member ranks (global ranks) for the dump's pg_config; once per
 * group name is enough (later calls with the same name are ignored).
 * `global_rank` is this process's rank, which names its dump file. */
void c10d__fr_register_pg(const char *name, const char *desc, const int *ranks, int nranks,
                          int global_rank);

/* Writes the dump to `path` (NULL: "<prefix><rank>.json", prefix from
 * C10D_TRACE_FILE_PREFIX) through a temporary file and a rename, on the
 * calling thread. `reason` goes into the dump. Returns 0 or a negative status
 * with c10d_last_error() naming the file and what failed. */
int c10d__fr_dump(const char *path, const char *reason);

/* The same, on a detached thread of its own (the snapshot is taken here, the
 * JSON built and written there), so the loop never waits for a disk. A
 * failure is logged. Returns 0 or a negative status. */
int c10d__fr_dump_async(const char *reason);

/* The dump as JSON text (malloc'd, *out), only the entries not completed if
 * only_active; 0 or C10D_ENOMEM. */
int c10d__fr_dump_json(const char *reason, int only_active, char **out);
/* Forgets every entry recorded so far (groups stay known): later dumps
 * start from here. */
void c10d__fr_clear(void);

/* The file a dump without a path goes to; buf holds at least `len` bytes.
 * Returns 0, or C10D_EINVAL when this process has no rank yet or no prefix
 * was set (dumps go only where the user points). */
int c10d__fr_default_path(char *buf, size_t len);
/* 1 if the recorder is on and a dump prefix is set: automatic dumps (on a
 * failure, on another rank's request) are written only then. */
int c10d__fr_dumps_files(void);

/* Tests: drops every entry and group and reads the environment again. */
void c10d__fr_reset(void);
/* Tests: the ring's capacity (0: off) and the next record id. */
size_t c10d__fr_capacity(void);
uint64_t c10d__fr_next_id(void);

#endif
