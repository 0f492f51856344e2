/* The flight recorder (flight_recorder.h, docs/debugging.md).
 *
 * One lock guards the ring (engine/lock.h, a futex word: an op records and
 * completes its entry with two atomic instructions each): an op costs a lock,
 * a fixed-size copy into a preallocated slot and an unlock, and nothing is
 * allocated per op. An entry
 * is found again by its record id (slot = id % capacity); the slot's own id
 * says whether the ring has reused it since, so a late completion never
 * touches a newer op's entry. A dump copies the ring under the lock and
 * builds the JSON outside it. */
#include "flight_recorder.h"

#include "env.h"
#include "error.h"
#include "lock.h"
#include "log.h"

#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

/* Version of the dump layout: PyTorch's field names and meanings, as of its
 * layout 2.4, plus fields of our own (root, peer, status, dump_reason). */
#define FR_VERSION "2.4"

enum { FR_SCHEDULED = 0, FR_STARTED, FR_COMPLETED };

struct fr_entry {
    uint64_t rid; /* record id + 1; 0: never used (a calloc'd ring stays untouched) */
    const struct c10d__fr_names *names; /* interned: never freed */
    const char *backend, *op;           /* literals: "<backend>:<op>" is made at the dump */
    uint64_t coll_seq, p2p_seq, op_id;
    uint64_t t_created, t_started, t_completed; /* wall clock ns; 0: not yet */
    int64_t timeout_ms;
    size_t in_numel, out_numel;
    int in_tensors, out_tensors;
    int dtype, root, peer;
    int status;
    unsigned char state, is_p2p, retired;
};

/* A group's names, interned (c10d__fr_names_intern): kept for the process's
 * life, since entries and groups point at them. */
struct interned_names {
    struct interned_names *next;
    struct c10d__fr_names names;
};

/* What an entry whose names could not be interned (out of memory) names. */
static const struct c10d__fr_names no_names;

struct fr_group {
    struct fr_group *next;
    char *name, *desc, *ranks; /* ranks: "[0, 1, 2]", as PyTorch writes it */
};

enum { FR_UNREAD = 0, FR_ON, FR_OFF };

static uv_once_t fr_once = UV_ONCE_INIT;
static c10d__lock fr_mutex; /* engine/lock.h: twice per op */
static atomic_int fr_mode;  /* FR_UNREAD until the first use reads the environment */
/* Guarded by fr_mutex. */
static struct fr_entry *fr_ring;
static size_t fr_cap;
static uint64_t fr_next;
static uint64_t fr_floor; /* c10d__fr_clear: records below it are gone */
static struct fr_group *fr_groups;
static struct interned_names *interned;
static int fr_rank = -1;

/* A fork while another thread records must not leave the child's copy of
 * the lock held: the child records its own groups' ops. */
static void fr_fork_prepare(void)
{
    c10d__lock_acquire(&fr_mutex);
}

static void fr_fork_parent(void)
{
    c10d__lock_release(&fr_mutex);
}

static void fr_fork_child(void)
{
    /* The forking thread took it in prepare and is the child's only thread:
     * it may release it (re-initialising a held mutex is undefined). */
    c10d__lock_release(&fr_mutex);
}

static void fr_register_fork_handlers(void)
{
    c10d__env_init(); /* read under fr_mutex: its lock is the inner one */
    pthread_atfork(fr_fork_prepare, fr_fork_parent, fr_fork_child);
}

/* Under fr_mutex. */
static void fr_configure_locked(void)
{
    free(fr_ring);
    fr_ring = NULL;
    fr_cap = 0;
    fr_next = 0;
    fr_floor = 0;
    int64_t n = c10d__env_int(C10D_ENV_TRACE_BUFFER_SIZE);
    if (n < 0) {
        C10D_WARN("fr", "C10D_TRACE_BUFFER_SIZE=%lld is negative: the flight recorder is off",
                  (long long)n);
        n = 0;
    }
    /* Far beyond any use (torch's default is 2000), and small enough that
     * the size of the ring cannot overflow. */
    const int64_t most = (int64_t)1 << 20;
    if (n > most) {
        C10D_WARN("fr", "C10D_TRACE_BUFFER_SIZE=%lld is too large: %lld entries kept", (long long)n,
                  (long long)most);
        n = most;
    }
    if (n > 0) {
        /* Zeroed by the allocator, not by a loop: a huge ring costs memory
         * only as ops fill it. */
        fr_ring = calloc((size_t)n, sizeof *fr_ring);
        if (fr_ring == NULL) {
            C10D_WARN("fr", "no memory for %lld flight recorder entries: the recorder is off",
                      (long long)n);
            n = 0;
        }
    }
    fr_cap = (size_t)n;
    atomic_store(&fr_mode, n > 0 ? FR_ON : FR_OFF);
}

static void fr_ensure(void)
{
    uv_once(&fr_once, fr_register_fork_handlers);
    c10d__lock_acquire(&fr_mutex);
    if (atomic_load(&fr_mode) == FR_UNREAD)
        fr_configure_locked();
    c10d__lock_release(&fr_mutex);
}

int c10d__fr_dumps_files(void)
{
    return c10d__fr_enabled() && c10d__env_str(C10D_ENV_TRACE_FILE_PREFIX)[0] != '\0';
}

int c10d__fr_enabled(void)
{
    int m = atomic_load_explicit(&fr_mode, memory_order_relaxed);
    if (m == FR_UNREAD) {
        fr_ensure();
        m = atomic_load(&fr_mode);
    }
    return m == FR_ON;
}

static uint64_t clock_ns(clockid_t c)
{
    struct timespec ts;
    clock_gettime(c, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Wall-clock time of a monotonic reading (the clock of c10d__now_ns): the
 * offset between the two clocks is read again once a second, so that an op's
 * record shares its one clock read with its work's deadline. A clock that
 * is stepped shows in the records a second later at most. */
static _Atomic int64_t wall_offset;
static _Atomic uint64_t wall_offset_until;

static uint64_t wall_of(uint64_t mono_ns)
{
    /* The offset is stored before the time it holds until (release), and
     * read after it (acquire): a reader that skips the refresh sees it. */
    if (mono_ns >= atomic_load_explicit(&wall_offset_until, memory_order_acquire)) {
        uint64_t m = clock_ns(CLOCK_MONOTONIC), w = clock_ns(CLOCK_REALTIME);
        atomic_store_explicit(&wall_offset, (int64_t)(w - m), memory_order_relaxed);
        atomic_store_explicit(&wall_offset_until, m + 1000000000u, memory_order_release);
    }
    return mono_ns + (uint64_t)atomic_load_explicit(&wall_offset, memory_order_relaxed);
}

/* Truncating copies without snprintf: they are on every op's path. */
static size_t copy_str(char *dst, size_t len, const char *src)
{
    size_t n = src != NULL ? strnlen(src, len - 1) : 0;
    memcpy(dst, src != NULL ? src : "", n);
    dst[n] = '\0';
    return n;
}

void c10d__fr_names_init(struct c10d__fr_names *n, const char *pg_name, const char *pg_desc)
{
    memset(n, 0, sizeof *n);
    copy_str(n->pg_name, sizeof n->pg_name, pg_name);
    copy_str(n->pg_desc, sizeof n->pg_desc, pg_desc);
}

/* Under fr_mutex: the interned copy of `want`, or NULL. */
static const struct c10d__fr_names *interned_locked(const struct c10d__fr_names *want)
{
    for (const struct interned_names *i = interned; i != NULL; i = i->next)
        if (memcmp(&i->names, want, sizeof *want) == 0)
            return &i->names;
    return NULL;
}

const struct c10d__fr_names *c10d__fr_names_intern(const char *pg_name, const char *pg_desc)
{
    struct c10d__fr_names want;
    c10d__fr_names_init(&want, pg_name, pg_desc);
    /* Maybe this process's first use of the lock: a fork from now on must
     * find its handlers. */
    uv_once(&fr_once, fr_register_fork_handlers);
    c10d__lock_acquire(&fr_mutex);
    const struct c10d__fr_names *found = interned_locked(&want);
    c10d__lock_release(&fr_mutex);
    if (found != NULL)
        return found;
    /* Made outside the lock, as a group's record is; a twin made meanwhile
     * by another thread wins. */
    struct interned_names *made = malloc(sizeof *made);
    if (made == NULL)
        return NULL;
    made->names = want;
    c10d__lock_acquire(&fr_mutex);
    found = interned_locked(&want);
    if (found == NULL) {
        made->next = interned;
        interned = made;
        found = &made->names;
        made = NULL;
    }
    c10d__lock_release(&fr_mutex);
    free(made);
    return found;
}

uint64_t c10d__fr_record(const struct c10d__fr_op *op)
{
    if (atomic_load_explicit(&fr_mode, memory_order_relaxed) == FR_OFF || !c10d__fr_enabled())
        return 0;
    uint64_t t_created = wall_of(op->now_ns != 0 ? op->now_ns : clock_ns(CLOCK_MONOTONIC_COARSE));
    const struct c10d__fr_names *names =
        op->names != NULL ? op->names : c10d__fr_names_intern(op->pg_name, op->pg_desc);
    /* Written in place, under the lock: one copy of the entry, not two. */
    c10d__lock_acquire(&fr_mutex);
    if (fr_cap == 0) {
        c10d__lock_release(&fr_mutex);
        return 0;
    }
    uint64_t rid = ++fr_next;
    struct fr_entry *e = &fr_ring[(rid - 1) % fr_cap];
    e->rid = rid;
    e->names = names != NULL ? names : &no_names;
    e->backend = op->backend != NULL ? op->backend : "c10d";
    e->op = op->op != NULL ? op->op : "?";
    e->coll_seq = op->coll_seq;
    e->p2p_seq = op->p2p_seq;
    e->op_id = op->op_id;
    e->t_created = t_created;
    e->t_started = op->started ? t_created : 0;
    e->t_completed = 0;
    e->timeout_ms = op->timeout_ms;
    e->in_numel = op->in_numel;
    e->out_numel = op->out_numel;
    e->in_tensors = op->in_tensors;
    e->out_tensors = op->out_tensors;
    e->dtype = op->dtype;
    e->root = op->root;
    e->peer = op->peer;
    e->status = 0;
    e->state = op->started ? FR_STARTED : FR_SCHEDULED;
    e->is_p2p = op->is_p2p != 0;
    e->retired = 0;
    c10d__lock_release(&fr_mutex);
    return rid;
}

/* Under fr_mutex: the entry of rid if the ring still holds it. */
static struct fr_entry *entry_locked(uint64_t rid)
{
    if (rid == 0 || fr_cap == 0)
        return NULL;
    struct fr_entry *e = &fr_ring[(rid - 1) % fr_cap];
    return e->rid == rid ? e : NULL;
}

void c10d__fr_started(uint64_t rid)
{
    if (rid == 0)
        return;
    c10d__lock_acquire(&fr_mutex);
    struct fr_entry *e = entry_locked(rid);
    if (e != NULL && e->state == FR_SCHEDULED && !e->retired) {
        e->state = FR_STARTED;
        e->t_started = e->t_created; /* the header says why no clock is read */
    }
    c10d__lock_release(&fr_mutex);
}

void c10d__fr_refused(uint64_t rid)
{
    if (rid == 0)
        return;
    c10d__lock_acquire(&fr_mutex);
    struct fr_entry *e = entry_locked(rid);
    if (e != NULL && e->state == FR_STARTED) { /* a failure leaves the state as it is */
        e->state = FR_SCHEDULED;
        e->t_started = 0;
    }
    c10d__lock_release(&fr_mutex);
}

void c10d__fr_completed(uint64_t rid, int status)
{
    if (rid == 0)
        return;
    uint64_t now = wall_of(clock_ns(CLOCK_MONOTONIC_COARSE));
    c10d__lock_acquire(&fr_mutex);
    struct fr_entry *e = entry_locked(rid);
    if (e != NULL && !e->retired) {
        e->retired = 1;
        e->status = status;
        if (status >= 0) {
            if (e->t_started == 0)
                e->t_started = now;
            e->state = FR_COMPLETED;
            e->t_completed = now;
        }
    }
    c10d__lock_release(&fr_mutex);
}

void c10d__fr_register_pg(const char *name, const char *desc, const int *ranks, int nranks,
                          int global_rank)
{
    if (!c10d__fr_enabled() || name == NULL)
        return;
    c10d__lock_acquire(&fr_mutex);
    fr_rank = global_rank;
    for (struct fr_group *g = fr_groups; g != NULL; g = g->next)
        if (strcmp(g->name, name) == 0) {
            c10d__lock_release(&fr_mutex);
            return;
        }
    c10d__lock_release(&fr_mutex);
    /* Built outside the lock: ops of other threads need not wait for it. */
    struct fr_group *g = calloc(1, sizeof *g);
    size_t cap = 3 + (size_t)(nranks > 0 ? nranks : 0) * 13;
    char *r = malloc(cap);
    if (g == NULL || r == NULL) {
        free(g);
        free(r);
        return;
    }
    size_t off = 0;
    r[off++] = '[';
    for (int i = 0; i < nranks; i++)
        off += (size_t)snprintf(r + off, cap - off, "%s%d", i ? ", " : "", ranks[i]);
    snprintf(r + off, cap - off, "]");
    g->name = strdup(name);
    g->desc = strdup(desc != NULL ? desc : "undefined");
    g->ranks = r;
    if (g->name == NULL || g->desc == NULL) {
        free(g->name);
        free(g->desc);
        free(r);
        free(g);
        return;
    }
    c10d__lock_acquire(&fr_mutex);
    for (struct fr_group *o = fr_groups; o != NULL; o = o->next)
        if (strcmp(o->name, name) == 0) {
            c10d__lock_release(&fr_mutex);
            free(g->name);
            free(g->desc);
            free(r);
            free(g);
            return;
        }
    g->next = fr_groups;
    fr_groups = g;
    c10d__lock_release(&fr_mutex);
}

/* ------------------------------------------------------------------ dump */

struct fr_snapshot {
    struct fr_entry *entries; /* oldest first */
    size_t n;
    json_t *pg_config;
    int rank;
    char *reason;
};

static void snapshot_free(struct fr_snapshot *s)
{
    if (s == NULL)
        return;
    free(s->entries);
    json_decref(s->pg_config);
    free(s->reason);
    free(s);
}

static struct fr_snapshot *snapshot_take(const char *reason, int only_active)
{
    fr_ensure();
    struct fr_snapshot *s = calloc(1, sizeof *s);
    if (s == NULL)
        return NULL;
    s->reason = strdup(reason != NULL ? reason : "");
    s->pg_config = json_object();
    c10d__lock_acquire(&fr_mutex);
    size_t n = fr_next < fr_cap ? (size_t)fr_next : fr_cap;
    if (fr_next - n < fr_floor)
        n = (size_t)(fr_next - fr_floor);
    s->entries = n > 0 ? malloc(n * sizeof *s->entries) : NULL;
    if (s->reason == NULL || s->pg_config == NULL || (n > 0 && s->entries == NULL)) {
        c10d__lock_release(&fr_mutex);
        snapshot_free(s);
        return NULL;
    }
    uint64_t first = fr_next - n;
    size_t kept = 0;
    for (size_t i = 0; i < n; i++) {
        const struct fr_entry *e = &fr_ring[(first + i) % fr_cap];
        if (!only_active || e->state != FR_COMPLETED)
            s->entries[kept++] = *e;
    }
    s->n = kept;
    s->rank = fr_rank;
    for (struct fr_group *g = fr_groups; g != NULL; g = g->next) {
        json_t *c =
            json_pack("{s:s, s:s, s:s}", "name", g->name, "desc", g->desc, "ranks", g->ranks);
        if (c != NULL)
            json_object_set_new(s->pg_config, g->name, c);
    }
    c10d__lock_release(&fr_mutex);
    return s;
}

/* PyTorch's ScalarType names, so dumps of both compare. */
static const char *torch_dtype(int dtype)
{
    static const char *names[] = {
        "Float",  "Double", "Half",   "BFloat16",      "Char",         "Byte",
        "Int",    "Long",   "Bool",   "Float8_e4m3fn", "Float8_e5m2",  "Short",
        "UInt16", "UInt32", "UInt64", "ComplexFloat",  "ComplexDouble"};
    _Static_assert(sizeof names / sizeof names[0] == C10D_DTYPE_COUNT, "a dtype without a name");
    if (dtype < 0 || (size_t)dtype >= sizeof names / sizeof names[0])
        return "Unknown";
    return names[dtype];
}

static json_t *sizes_json(size_t numel, int ntensors)
{
    json_t *a = json_array();
    for (int i = 0; i < ntensors; i++)
        json_array_append_new(a, json_pack("[I]", (json_int_t)numel));
    return a;
}

static json_t *dtypes_json(int dtype, int ntensors)
{
    json_t *a = json_array();
    for (int i = 0; i < ntensors; i++)
        json_array_append_new(a, json_string(torch_dtype(dtype)));
    return a;
}

static const char *state_name(int state)
{
    return state == FR_COMPLETED ? "completed" : state == FR_STARTED ? "started" : "scheduled";
}

static json_t *entry_json(const struct fr_entry *e)
{
    json_t *o = json_object();
    if (o == NULL)
        return NULL;
    char *end = NULL;
    long long pg_id = strtoll(e->names->pg_name, &end, 10);
    if (end == e->names->pg_name || *end != '\0')
        pg_id = -1;
    json_object_set_new(o, "record_id", json_integer((json_int_t)(e->rid - 1)));
    json_object_set_new(o, "pg_id", json_integer(pg_id));
    json_object_set_new(o, "process_group",
                        json_pack("[s, s]", e->names->pg_name, e->names->pg_desc));
    json_object_set_new(o, "collective_seq_id", json_integer((json_int_t)e->coll_seq));
    json_object_set_new(o, "p2p_seq_id", json_integer((json_int_t)e->p2p_seq));
    json_object_set_new(o, "op_id", json_integer((json_int_t)e->op_id));
    char profiling_name[96];
    snprintf(profiling_name, sizeof profiling_name, "%s:%s", e->backend, e->op);
    json_object_set_new(o, "profiling_name", json_string(profiling_name));
    json_object_set_new(o, "time_created_ns", json_integer((json_int_t)e->t_created));
    json_object_set_new(o, "time_discovered_started_ns",
                        e->t_started ? json_integer((json_int_t)e->t_started) : json_null());
    json_object_set_new(o, "time_discovered_completed_ns",
                        e->t_completed ? json_integer((json_int_t)e->t_completed) : json_null());
    json_object_set_new(o, "duration_ms",
                        e->t_completed && e->t_started
                            ? json_real((double)(e->t_completed - e->t_started) / 1e6)
                            : json_null());
    json_object_set_new(o, "state", json_string(state_name(e->state)));
    json_object_set_new(o, "input_sizes", sizes_json(e->in_numel, e->in_tensors));
    json_object_set_new(o, "input_dtypes", dtypes_json(e->dtype, e->in_tensors));
    json_object_set_new(o, "output_sizes", sizes_json(e->out_numel, e->out_tensors));
    json_object_set_new(o, "output_dtypes", dtypes_json(e->dtype, e->out_tensors));
    json_object_set_new(o, "timeout_ms", json_integer((json_int_t)e->timeout_ms));
    json_object_set_new(o, "is_p2p", json_boolean(e->is_p2p));
    json_object_set_new(o, "retired", json_boolean(e->retired));
    json_object_set_new(o, "frames", json_array());
    json_object_set_new(o, "root", json_integer(e->root));
    json_object_set_new(o, "peer", json_integer(e->peer));
    json_object_set_new(o, "status", json_integer(e->status));
    return o;
}

/* pg_status as PyTorch writes it (values are strings), derived from the
 * entries still in the ring: the highest collective number per state. */
static json_t *pg_status_json(const struct fr_snapshot *s)
{
    json_t *st = json_object();
    for (size_t i = 0; i < s->n; i++) {
        const struct fr_entry *e = &s->entries[i];
        if (e->is_p2p)
            continue;
        json_t *g = json_object_get(st, e->names->pg_name);
        if (g == NULL) {
            g = json_pack("{s:s, s:s, s:s}", "last_enqueued_collective", "-1",
                          "last_started_collective", "-1", "last_completed_collective", "-1");
            json_object_set_new(st, e->names->pg_name, g);
        }
        char seq[24];
        snprintf(seq, sizeof seq, "%llu", (unsigned long long)e->coll_seq);
        json_object_set_new(g, "last_enqueued_collective", json_string(seq));
        if (e->state >= FR_STARTED)
            json_object_set_new(g, "last_started_collective", json_string(seq));
        if (e->state == FR_COMPLETED)
            json_object_set_new(g, "last_completed_collective", json_string(seq));
    }
    return st;
}

static json_t *snapshot_json(const struct fr_snapshot *s)
{
    json_t *entries = json_array();
    for (size_t i = 0; i < s->n; i++)
        json_array_append_new(entries, entry_json(&s->entries[i]));
    json_t *root = json_object();
    json_object_set_new(root, "version", json_string(FR_VERSION));
    json_object_set_new(root, "rank", json_integer(s->rank));
    json_object_set_new(root, "dump_reason", json_string(s->reason));
    json_object_set_new(root, "pg_config", json_incref(s->pg_config));
    json_object_set_new(root, "pg_status", pg_status_json(s));
    json_object_set_new(root, "nccl_comm_state", json_object());
    json_object_set_new(root, "entries", entries);
    return root;
}

int c10d__fr_default_path(char *buf, size_t len)
{
    fr_ensure();
    c10d__lock_acquire(&fr_mutex);
    int rank = fr_rank;
    c10d__lock_release(&fr_mutex);
    if (rank < 0)
        return c10d__fail(C10D_EINVAL,
                          "flight recorder: this process has no rank yet (no op of a process "
                          "group was recorded), so its dump file has no name; pass a path");
    const char *prefix = c10d__env_str(C10D_ENV_TRACE_FILE_PREFIX);
    if (prefix[0] == '\0')
        return c10d__fail(C10D_EINVAL,
                          "flight recorder: no dump path: set C10D_TRACE_FILE_PREFIX (or "
                          "TORCH_FR_DUMP_TEMP_FILE) or pass a path");
    int n = snprintf(buf, len, "%s%d.json", prefix, rank);
    if (n < 0 || (size_t)n >= len)
        return c10d__fail(C10D_EINVAL, "flight recorder: C10D_TRACE_FILE_PREFIX is too long");
    return 0;
}

static int write_snapshot(const struct fr_snapshot *s, const char *path)
{
    json_t *root = snapshot_json(s);
    if (root == NULL)
        return c10d__fail(C10D_ENOMEM, "flight recorder: out of memory building the dump");
    char tmp[4200];
    int n = snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    if (n < 0 || (size_t)n >= sizeof tmp) {
        json_decref(root);
        return c10d__fail(C10D_EINVAL, "flight recorder: dump path too long: %s", path);
    }
    int rc = json_dump_file(root, tmp, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (rc != 0) {
        unlink(tmp);
        return c10d__fail(C10D_EIO, "flight recorder: cannot write %s (for %s): %s", tmp, path,
                          strerror(errno));
    }
    if (rename(tmp, path) != 0) {
        int err = errno;
        unlink(tmp);
        return c10d__fail(C10D_EIO, "flight recorder: cannot rename %s to %s: %s", tmp, path,
                          strerror(err));
    }
    return 0;
}

int c10d__fr_dump(const char *path, const char *reason)
{
    char def[4096];
    if (path == NULL) {
        C10D_CHECK(c10d__fr_default_path(def, sizeof def));
        path = def;
    }
    struct fr_snapshot *s = snapshot_take(reason, 0);
    if (s == NULL)
        return c10d__fail(C10D_ENOMEM, "flight recorder: out of memory taking the snapshot");
    int rc = write_snapshot(s, path);
    snapshot_free(s);
    if (rc == 0)
        C10D_WARN("fr", "flight recorder dump written to %s (%s)", path,
                  reason != NULL ? reason : "on request");
    return rc;
}

int c10d__fr_dump_json(const char *reason, int only_active, char **out)
{
    *out = NULL;
    struct fr_snapshot *s = snapshot_take(reason, only_active);
    json_t *root = s != NULL ? snapshot_json(s) : NULL;
    snapshot_free(s);
    if (root != NULL)
        *out = json_dumps(root, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (*out == NULL)
        return c10d__fail(C10D_ENOMEM, "flight recorder: out of memory building the dump");
    return 0;
}

void c10d__fr_clear(void)
{
    fr_ensure();
    c10d__lock_acquire(&fr_mutex);
    fr_floor = fr_next;
    c10d__lock_release(&fr_mutex);
}

/* Dumps being written by their threads: a process that returns from main
 * right after a failure waits for them at exit (bounded), so its dump is not
 * lost to the exit. */
static uv_mutex_t async_mutex;
static uv_cond_t async_cond;
static int async_running;
static uv_once_t async_once = UV_ONCE_INIT;

static void async_wait_at_exit(void)
{
    uint64_t deadline = uv_hrtime() + 2000000000u;
    uv_mutex_lock(&async_mutex);
    while (async_running > 0) {
        uint64_t now = uv_hrtime();
        if (now >= deadline || uv_cond_timedwait(&async_cond, &async_mutex, deadline - now) != 0)
            break;
    }
    uv_mutex_unlock(&async_mutex);
}

static void async_init(void)
{
    uv_mutex_init(&async_mutex);
    uv_cond_init(&async_cond);
    atexit(async_wait_at_exit);
}

struct async_dump {
    struct fr_snapshot *snap;
    char path[4096];
};

static void *async_main(void *p)
{
    struct async_dump *a = p;
    if (write_snapshot(a->snap, a->path) == 0)
        C10D_WARN("fr", "flight recorder dump written to %s (%s)", a->path, a->snap->reason);
    else
        C10D_WARN("fr", "%s", c10d_last_error());
    snapshot_free(a->snap);
    free(a);
    uv_mutex_lock(&async_mutex);
    if (--async_running == 0)
        uv_cond_broadcast(&async_cond);
    uv_mutex_unlock(&async_mutex);
    return NULL;
}

int c10d__fr_dump_async(const char *reason)
{
    struct async_dump *a = malloc(sizeof *a);
    if (a == NULL)
        return c10d__fail(C10D_ENOMEM, "flight recorder: out of memory");
    int rc = c10d__fr_default_path(a->path, sizeof a->path);
    if (rc == 0 && (a->snap = snapshot_take(reason, 0)) == NULL)
        rc = c10d__fail(C10D_ENOMEM, "flight recorder: out of memory taking the snapshot");
    if (rc != 0) {
        free(a);
        return rc;
    }
    uv_once(&async_once, async_init);
    uv_mutex_lock(&async_mutex);
    async_running++;
    uv_mutex_unlock(&async_mutex);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t t;
    int err = pthread_create(&t, &attr, async_main, a);
    pthread_attr_destroy(&attr);
    if (err != 0) {
        uv_mutex_lock(&async_mutex);
        async_running--;
        uv_mutex_unlock(&async_mutex);
        snapshot_free(a->snap);
        free(a);
        return c10d__fail(C10D_EIO, "flight recorder: cannot start the dump thread: %s",
                          strerror(err));
    }
    return 0;
}

void c10d__fr_init(void)
{
    uv_once(&fr_once, fr_register_fork_handlers);
}

/* ----------------------------------------------------------------- tests */

void c10d__fr_reset(void)
{
    uv_once(&fr_once, fr_register_fork_handlers);
    c10d__env_reload();
    c10d__lock_acquire(&fr_mutex);
    while (fr_groups != NULL) {
        struct fr_group *g = fr_groups;
        fr_groups = g->next;
        free(g->name);
        free(g->desc);
        free(g->ranks);
        free(g);
    }
    fr_rank = -1;
    fr_configure_locked();
    c10d__lock_release(&fr_mutex);
}

size_t c10d__fr_capacity(void)
{
    fr_ensure();
    c10d__lock_acquire(&fr_mutex);
    size_t c = fr_cap;
    c10d__lock_release(&fr_mutex);
    return c;
}

uint64_t c10d__fr_next_id(void)
{
    fr_ensure();
    c10d__lock_acquire(&fr_mutex);
    uint64_t n = fr_next;
    c10d__lock_release(&fr_mutex);
    return n;
}
