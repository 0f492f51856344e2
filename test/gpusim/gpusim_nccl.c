/* gpusim, the NCCL communicator part: a TEST DOUBLE, never installed, never
 * benchmarked (see gpusim.h and README.md).
 *
 * A communicator is a POSIX shared-memory segment named by its unique id
 * ("/c10dsim-<hex>"), mapped by every rank, whether ranks are processes or
 * threads. Creation is a state machine that never blocks: a blocking init
 * runs it to the end, a nonblocking one (config->blocking == 0) advances it
 * each time ncclCommGetAsyncError asks. The first rank to create the name
 * lays the segment out and raises its ready flag; the last rank to join
 * unlinks the name. A split first exchanges (color, key) through the
 * parent's segment; its child's name derives from the parent's, the
 * parent's split counter and the color. The fault knobs (README.md) are read
 * from the environment when a communicator is created. */
#include "gpusim.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <fcntl.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define COMM_MAGIC  0x434f4d4du
#define SEG_MAGIC   0x53494d31u
#define NAME_PREFIX "/c10dsim-"

_Atomic uint64_t sim_tasks_done;
static _Thread_local char t_error[256];

void sim_set_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t_error, sizeof t_error, fmt, ap);
    va_end(ap);
}

static ncclResult_t fail(ncclResult_t r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static ncclResult_t fail(ncclResult_t r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t_error, sizeof t_error, fmt, ap);
    va_end(ap);
    return r;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static long env_long(const char *name)
{
    const char *s = getenv(name);
    return s != NULL && *s != 0 ? strtol(s, NULL, 10) : 0;
}

int sim_backoff(struct sim_comm *c, unsigned *spins)
{
    if (c != NULL && atomic_load_explicit(&c->aborted, memory_order_acquire))
        return -1;
    if ((*spins)++ < 64)
        sched_yield();
    else
        usleep(50);
    return 0;
}

/* Its presence tells a test that the simulation, not real NCCL, is loaded:
 * the fault knobs (C10D_SIM_*) exist only here. */
SIM_API const char c10d_gpusim[] = "libc10d CPU simulation of CUDA + NCCL";

SIM_API ncclResult_t ncclGetVersion(int *version)
{
    if (version == NULL)
        return fail(ncclInvalidArgument, "ncclGetVersion: version is NULL");
        /* C10D_SIM_NCCL_VERSION: what an older or newer NCCL would say. */
#ifdef C10D_SIM_OLD_NCCL
    *version = 22605;
#else
    *version = NCCL_VERSION_CODE;
#endif
    const char *v = getenv("C10D_SIM_NCCL_VERSION");
    if (v != NULL && *v != '\0')
        *version = atoi(v);
    return ncclSuccess;
}

SIM_API const char *ncclGetErrorString(ncclResult_t result)
{
    switch (result) {
    case ncclSuccess:
        return "no error";
    case ncclUnhandledCudaError:
        return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError:
        return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
        return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument:
        return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage:
        return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError:
        return "remote process exited or there was a network error";
    case ncclInProgress:
        return "NCCL operation in progress";
    default:
        return "unknown result code";
    }
}

/* The last error this thread saw (any communicator). */
SIM_API const char *ncclGetLastError(ncclComm_t comm)
{
    (void)comm;
    return t_error;
}

SIM_API ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId)
{
    if (uniqueId == NULL)
        return fail(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
    unsigned char r[16];
    size_t got = 0;
    while (got < sizeof r) {
        ssize_t k = getrandom(r + got, sizeof r - got, 0);
        if (k < 0 && errno != EINTR)
            return fail(ncclSystemError, "ncclGetUniqueId: getrandom: %s", strerror(errno));
        got += k > 0 ? (size_t)k : 0;
    }
    memset(uniqueId, 0, sizeof *uniqueId);
    int n = snprintf(uniqueId->internal, sizeof uniqueId->internal, NAME_PREFIX);
    for (size_t i = 0; i < sizeof r; i++)
        n += snprintf(uniqueId->internal + n, sizeof uniqueId->internal - (size_t)n, "%02x", r[i]);
    return ncclSuccess;
}

/* ------------------------------------------------------------ lifetime */
struct sim_comm *sim_comm_get(ncclComm_t h)
{
    struct sim_comm *c = (struct sim_comm *)h;
    return c != NULL && c->magic == COMM_MAGIC ? c : NULL;
}

void sim_comm_unref(struct sim_comm *c)
{
    if (atomic_fetch_sub(&c->refs, 1) != 1)
        return;
    if (c->parent != NULL)
        sim_comm_unref(c->parent);
    if (c->seg != NULL)
        munmap(c->seg, c->seg_size);
    if (c->fd >= 0)
        close(c->fd);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    c->magic = 0;
    free(c);
}

/* Destroy and abort: the name goes if it is still there, the handle dies,
 * the memory goes with the last queued task. */
static void comm_release(struct sim_comm *c)
{
    pthread_mutex_lock(&c->mu);
    if (c->fd >= 0 && (c->seg == NULL || atomic_exchange(&sim_hdr(c)->unlinked, 1) == 0))
        shm_unlink(c->name);
    c->magic = 0;
    pthread_mutex_unlock(&c->mu);
    sim_comm_unref(c);
}

static size_t align_up(size_t v, size_t a)
{
    return (v + a - 1) / a * a;
}

static void layout(struct sim_comm *c)
{
    size_t n = (size_t)c->nranks, off = align_up(sizeof(struct sim_seg_hdr), 64);
    c->off_present = off;
    off = align_up(off + n * sizeof(_Atomic uint32_t), 64);
    c->off_arrive = off;
    off = align_up(off + n * sizeof(_Atomic uint64_t), 64);
    c->off_posts = off;
    off = align_up(off + n * SIM_SPLIT_RING * sizeof(struct sim_split_post), 64);
    c->off_chan = off;
    off = align_up(off + n * n * sizeof(struct sim_chan), 4096);
    c->off_slots = off;
    off += n * SIM_SLOT_BYTES;
    c->off_chandata = off;
    c->seg_size = off + n * n * SIM_CHAN_BYTES;
}

static struct sim_split_post *split_post(struct sim_comm *c, int r, uint64_t seq)
{
    return (struct sim_split_post *)(c->seg + c->off_posts) + (size_t)r * SIM_SPLIT_RING +
           seq % SIM_SPLIT_RING;
}

static uint64_t fnv1a(const char *s, uint64_t h)
{
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

static void derive_name(char out[64], const char *parent, const char *kind, uint64_t seq, int color)
{
    char buf[160];
    snprintf(buf, sizeof buf, "%s|%s|%llu|%d", parent, kind, (unsigned long long)seq, color);
    uint64_t h1 = fnv1a(buf, 0xcbf29ce484222325ull), h2 = fnv1a(buf, h1 ^ 0x9e3779b97f4a7c15ull);
    snprintf(out, 64, NAME_PREFIX "%016llx%016llx", (unsigned long long)h1, (unsigned long long)h2);
}

static ncclResult_t init_failed(struct sim_comm *c, ncclResult_t r)
{
    c->state = SIM_FAILED;
    c->init_error = r;
    return r;
}

/* One step of creation, never blocking (under c->mu). ncclInProgress until
 * every rank has joined; then ncclSuccess; or the error, remembered. */
static ncclResult_t progress(struct sim_comm *c)
{
    for (;;) {
        switch (c->state) {
        case SIM_EXCHANGE: { /* split: every parent rank's (color, key) */
            struct sim_comm *p = c->parent;
            int n = 0, me = 0;
            for (int r = 0; r < p->nranks; r++) {
                struct sim_split_post *post = split_post(p, r, c->split_seq);
                uint64_t seq = atomic_load_explicit(&post->seq, memory_order_acquire);
                if (seq > c->split_seq)
                    return init_failed(c,
                                       fail(ncclInternalError,
                                            "ncclCommSplit: rank %d is more than %d splits ahead",
                                            r, SIM_SPLIT_RING));
                if (seq < c->split_seq)
                    return ncclInProgress;
            }
            for (int r = 0; r < p->nranks; r++) {
                struct sim_split_post *post = split_post(p, r, c->split_seq);
                if (post->color != c->color)
                    continue;
                n++;
                if (post->key < c->key || (post->key == c->key && r < p->rank))
                    me++;
            }
            c->nranks = n;
            c->rank = me;
            derive_name(c->name, p->name, "split", c->split_seq, c->color);
            c->parent = NULL;
            sim_comm_unref(p);
            layout(c);
            c->state = SIM_OPEN;
            continue;
        }
        case SIM_OPEN:
            if (c->init_never)
                return ncclInProgress;
            c->fd = shm_open(c->name, O_RDWR | O_CREAT | O_EXCL, 0600);
            if (c->fd >= 0) {
                if (ftruncate(c->fd, (off_t)c->seg_size) != 0)
                    return init_failed(
                        c, fail(ncclSystemError, "ftruncate %s: %s", c->name, strerror(errno)));
                c->creator = 1;
            } else if (errno == EEXIST) {
                c->fd = shm_open(c->name, O_RDWR, 0600);
                if (c->fd < 0 && errno == ENOENT)
                    return ncclInProgress; /* gone in between: try again */
            }
            if (c->fd < 0)
                return init_failed(
                    c, fail(ncclSystemError, "shm_open %s: %s", c->name, strerror(errno)));
            c->state = SIM_MAP;
            continue;
        case SIM_MAP: {
            struct stat st;
            if (fstat(c->fd, &st) != 0)
                return init_failed(c, fail(ncclSystemError, "fstat: %s", strerror(errno)));
            if (st.st_size == 0)
                return ncclInProgress; /* the creator has not sized it yet */
            if ((size_t)st.st_size != c->seg_size)
                return init_failed(c,
                                   fail(ncclInvalidUsage,
                                        "ranks disagree on the communicator's size (%d ranks here)",
                                        c->nranks));
            void *m = mmap(NULL, c->seg_size, PROT_READ | PROT_WRITE, MAP_SHARED, c->fd, 0);
            if (m == MAP_FAILED)
                return init_failed(c, fail(ncclSystemError, "mmap: %s", strerror(errno)));
            c->seg = m;
            if (c->creator) {
                sim_hdr(c)->creator_pid = (int32_t)getpid();
                sim_hdr(c)->magic = SEG_MAGIC;
                sim_hdr(c)->nranks = c->nranks;
                atomic_store_explicit(&sim_hdr(c)->ready, 1, memory_order_release);
            }
            c->state = SIM_JOIN;
            continue;
        }
        case SIM_JOIN: {
            struct sim_seg_hdr *h = sim_hdr(c);
            if (!atomic_load_explicit(&h->ready, memory_order_acquire))
                return ncclInProgress;
            if (h->magic != SEG_MAGIC || h->nranks != c->nranks)
                return init_failed(
                    c, fail(ncclInvalidUsage, "ranks disagree on nranks (%d here)", c->nranks));
            /* Each rank's slot holds its device + 1 (nonzero: joined). */
            _Atomic uint32_t *present = (_Atomic uint32_t *)(c->seg + c->off_present) + c->rank;
            if (atomic_exchange(present, (uint32_t)c->device + 1) != 0)
                return init_failed(c, fail(ncclInvalidUsage, "rank %d joined twice", c->rank));
            if (atomic_fetch_add(&h->joined, 1) + 1 == c->nranks &&
                atomic_exchange(&h->unlinked, 1) == 0)
                shm_unlink(c->name); /* every rank has it mapped: the name is not needed */
            c->state = SIM_WAIT;
            continue;
        }
        case SIM_WAIT: {
            if (atomic_load(&sim_hdr(c)->joined) < c->nranks ||
                now_s() - c->init_start < (double)c->init_delay_ms / 1000.0)
                return ncclInProgress;
            /* NCCL refuses two ranks of a communicator on one GPU, unless it
             * is 2.30.3+ and NCCL_MULTI_RANK_GPU_ENABLE=1 (all on one host
             * here). Every rank sees the same pair and fails alike. */
            int version = 0;
            ncclGetVersion(&version);
            const char *multi = getenv("NCCL_MULTI_RANK_GPU_ENABLE");
            int allowed = version >= 23003 && multi != NULL && strcmp(multi, "1") == 0;
            _Atomic uint32_t *slots = (_Atomic uint32_t *)(c->seg + c->off_present);
            for (int a = 0; a < c->nranks && !allowed; a++)
                for (int b = a + 1; b < c->nranks; b++)
                    if (atomic_load(&slots[a]) == atomic_load(&slots[b]))
                        return init_failed(c, fail(ncclInvalidUsage,
                                                   "Duplicate GPU detected : rank %d and rank %d "
                                                   "both on CUDA device %u",
                                                   a, b, atomic_load(&slots[a]) - 1));
            c->state = SIM_READY;
            continue;
        }
        case SIM_READY:
            return ncclSuccess;
        case SIM_FAILED:
            return c->init_error;
        }
    }
}

ncclResult_t sim_comm_check_ready(struct sim_comm *c, const char *who)
{
    if (c == NULL)
        return fail(ncclInvalidArgument, "%s: comm is NULL or not a live communicator", who);
    pthread_mutex_lock(&c->mu);
    ncclResult_t r = progress(c);
    if (r == ncclSuccess && c->enqueuing > 0)
        r = ncclInProgress;
    pthread_mutex_unlock(&c->mu);
    if (r == ncclInProgress)
        return fail(ncclInvalidArgument,
                    "%s: attempt to use communicator before the previous operation returned "
                    "ncclSuccess",
                    who);
    return r;
}

int sim_comm_async_failed(struct sim_comm *c)
{
    return c->async_at > 0 && atomic_load(&sim_tasks_done) >= (uint64_t)c->async_at;
}

static _Atomic unsigned long comms_made;

SIM_API unsigned long c10d_gpusim_comms_made(void)
{
    return atomic_load(&comms_made);
}

/* Makes a communicator: nranks/rank/name are known, or (parent != NULL)
 * come from the split exchange. Blocking: runs creation to its end. */
static ncclResult_t comm_create(ncclComm_t *out, int nranks, int rank, const char *name,
                                struct sim_comm *parent, uint64_t seq, int color, int key,
                                ncclConfig_t *config, const char *who)
{
    if (config != NULL && config->magic != 0xcafebeef)
        return fail(ncclInvalidArgument, "%s: config not initialized with NCCL_CONFIG_INITIALIZER",
                    who);
    int blocking = config == NULL || config->blocking != 0;
    struct sim_comm *c = calloc(1, sizeof *c);
    if (c == NULL)
        return fail(ncclSystemError, "%s: out of memory", who);
    atomic_fetch_add(&comms_made, 1);
    c->blocking = blocking;
    c->magic = COMM_MAGIC;
    c->nranks = nranks;
    c->rank = rank;
    c->device = sim_current_device();
    c->fd = -1;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    atomic_init(&c->refs, 1);
    c->init_start = now_s();
    c->hang_at = env_long("C10D_SIM_HANG_AT");
    c->async_at = env_long("C10D_SIM_ASYNC_ERROR_AT");
    c->abort_delay_ms = env_long("C10D_SIM_ABORT_DELAY_MS");
    c->init_delay_ms = env_long("C10D_SIM_INIT_DELAY_MS");
    c->init_never = env_long("C10D_SIM_INIT_NEVER") != 0;
    c->first_launch_delay_ms = env_long("C10D_SIM_FIRST_LAUNCH_DELAY_MS");
    if (parent != NULL) {
        atomic_fetch_add(&parent->refs, 1);
        c->parent = parent;
        c->split_seq = seq;
        c->color = color;
        c->key = key;
        c->state = SIM_EXCHANGE;
    } else {
        snprintf(c->name, sizeof c->name, "%s", name);
        layout(c);
        c->state = SIM_OPEN;
    }
    ncclResult_t r;
    unsigned spins = 0;
    pthread_mutex_lock(&c->mu);
    while ((r = progress(c)) == ncclInProgress && blocking) {
        pthread_mutex_unlock(&c->mu);
        sim_backoff(NULL, &spins);
        pthread_mutex_lock(&c->mu);
    }
    pthread_mutex_unlock(&c->mu);
    if (blocking && r != ncclSuccess) {
        comm_release(c);
        *out = NULL;
        return r;
    }
    *out = (ncclComm_t)c;
    /* Nonblocking: errors, like completion, show in ncclCommGetAsyncError. */
    return blocking ? ncclSuccess : ncclInProgress;
}

static ncclResult_t check_id(const ncclUniqueId *id, const char *who)
{
    if (strncmp(id->internal, NAME_PREFIX, strlen(NAME_PREFIX)) != 0 ||
        memchr(id->internal, 0, 64) == NULL)
        return fail(ncclInvalidArgument, "%s: the unique id was not made by this library", who);
    return ncclSuccess;
}

static ncclResult_t check_size(ncclComm_t *comm, int nranks, int rank, const char *who)
{
    if (comm == NULL)
        return fail(ncclInvalidArgument, "%s: comm is NULL", who);
    *comm = NULL;
    if (nranks < 1 || nranks > SIM_MAX_RANKS)
        return fail(ncclInvalidArgument, "%s: invalid nranks %d (1..%d)", who, nranks,
                    SIM_MAX_RANKS);
    if (rank < 0 || rank >= nranks)
        return fail(ncclInvalidArgument, "%s: rank %d out of range (nranks %d)", who, rank, nranks);
    return ncclSuccess;
}

SIM_API ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId,
                                            int rank, ncclConfig_t *config)
{
    sim_mark_context();
    const char *who = "ncclCommInitRankConfig";
    ncclResult_t r = check_size(comm, nranks, rank, who);
    if (r == ncclSuccess)
        r = check_id(&commId, who);
    if (r != ncclSuccess)
        return r;
    return comm_create(comm, nranks, rank, commId.internal, NULL, 0, 0, 0, config, who);
}

#ifndef C10D_SIM_OLD_NCCL /* NCCL < 2.23 has no scalable init */
SIM_API ncclResult_t ncclCommInitRankScalable(ncclComm_t *newcomm, int nranks, int myrank, int nId,
                                              ncclUniqueId *commIds, ncclConfig_t *config)
{
    sim_mark_context();
    const char *who = "ncclCommInitRankScalable";
    ncclResult_t r = check_size(newcomm, nranks, myrank, who);
    if (r != ncclSuccess)
        return r;
    if (nId < 1 || commIds == NULL)
        return fail(ncclInvalidArgument, "%s: needs at least one unique id", who);
    /* The segment is named by every id, in order: ranks that disagree on
     * the list never meet, as they would not in NCCL. */
    uint64_t h = 0xcbf29ce484222325ull;
    for (int i = 0; i < nId; i++) {
        if ((r = check_id(&commIds[i], who)) != ncclSuccess)
            return r;
        h = fnv1a(commIds[i].internal, h);
    }
    char name[64];
    derive_name(name, commIds[0].internal, "roots", h, nId);
    return comm_create(newcomm, nranks, myrank, name, NULL, 0, 0, 0, config, who);
}
#endif

SIM_API ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                                   ncclConfig_t *config)
{
    sim_mark_context();
    struct sim_comm *p = sim_comm_get(comm);
    ncclResult_t r = sim_comm_check_ready(p, "ncclCommSplit");
    if (r != ncclSuccess)
        return r;
    if (newcomm == NULL)
        return fail(ncclInvalidArgument, "ncclCommSplit: newcomm is NULL");
    if (color < 0 && color != NCCL_SPLIT_NOCOLOR)
        return fail(ncclInvalidArgument, "ncclCommSplit: invalid color %d", color);
    *newcomm = NULL;
    pthread_mutex_lock(&p->mu);
    uint64_t seq = ++p->split_count;
    pthread_mutex_unlock(&p->mu);
    struct sim_split_post *post = split_post(p, p->rank, seq);
    post->color = color;
    post->key = key;
    atomic_store_explicit(&post->seq, seq, memory_order_release);
    if (color == NCCL_SPLIT_NOCOLOR)
        return ncclSuccess;
    return comm_create(newcomm, 0, 0, NULL, p, seq, color, key, config, "ncclCommSplit");
}

/* Only the survivors call it: no exchange, each computes the same child. */
#ifndef C10D_SIM_OLD_NCCL /* NCCL < 2.27 has no shrink */
SIM_API ncclResult_t ncclCommShrink(ncclComm_t comm, int *excludeRanksList, int excludeRanksCount,
                                    ncclComm_t *newcomm, ncclConfig_t *config, int shrinkFlags)
{
    sim_mark_context();
    const char *who = "ncclCommShrink";
    struct sim_comm *p = sim_comm_get(comm);
    ncclResult_t r = sim_comm_check_ready(p, who);
    if (r != ncclSuccess)
        return r;
    if (newcomm == NULL)
        return fail(ncclInvalidArgument, "%s: newcomm is NULL", who);
    *newcomm = NULL;
    if (excludeRanksCount < 0 || (excludeRanksCount > 0 && excludeRanksList == NULL))
        return fail(ncclInvalidArgument, "%s: invalid exclude list", who);
    if ((shrinkFlags & ~NCCL_SHRINK_ABORT) != 0)
        return fail(ncclInvalidArgument, "%s: invalid flags 0x%x", who, (unsigned)shrinkFlags);
    unsigned char excluded[SIM_MAX_RANKS] = {0};
    for (int i = 0; i < excludeRanksCount; i++) {
        int x = excludeRanksList[i];
        if (x < 0 || x >= p->nranks)
            return fail(ncclInvalidArgument, "%s: excluded rank %d out of range", who, x);
        if (x == p->rank)
            return fail(ncclInvalidArgument, "%s: rank %d excludes itself", who, x);
        excluded[x] = 1;
    }
    int n = 0, me = 0;
    for (int i = 0; i < p->nranks; i++) {
        n += !excluded[i];
        me += !excluded[i] && i < p->rank;
    }
    if (shrinkFlags & NCCL_SHRINK_ABORT)
        atomic_store(&p->aborted, 1); /* the parent's stuck operations end */
    pthread_mutex_lock(&p->mu);
    uint64_t seq = ++p->split_count;
    pthread_mutex_unlock(&p->mu);
    char name[64];
    derive_name(name, p->name, "shrink", seq, 0);
    return comm_create(newcomm, n, me, name, NULL, 0, 0, 0, config, who);
}
#endif

SIM_API ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError)
{
    struct sim_comm *c = sim_comm_get(comm);
    if (c == NULL || asyncError == NULL)
        return fail(ncclInvalidArgument, "ncclCommGetAsyncError: comm or asyncError is NULL");
    pthread_mutex_lock(&c->mu);
    ncclResult_t r = progress(c);
    if (r == ncclSuccess && c->enqueuing > 0)
        r = ncclInProgress;
    else if (r == ncclSuccess)
        r = c->enqueue_error;
    pthread_mutex_unlock(&c->mu);
    if (r == ncclSuccess && sim_comm_async_failed(c))
        r = fail(ncclRemoteError, "remote process exited or there was a network error");
    *asyncError = r;
    return ncclSuccess;
}

SIM_API ncclResult_t ncclCommCount(const ncclComm_t comm, int *count)
{
    struct sim_comm *c = sim_comm_get(comm);
    ncclResult_t r = sim_comm_check_ready(c, "ncclCommCount");
    if (r == ncclSuccess && count == NULL)
        r = fail(ncclInvalidArgument, "ncclCommCount: count is NULL");
    if (r == ncclSuccess)
        *count = c->nranks;
    return r;
}

SIM_API ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)
{
    struct sim_comm *c = sim_comm_get(comm);
    ncclResult_t r = sim_comm_check_ready(c, "ncclCommUserRank");
    if (r == ncclSuccess && rank == NULL)
        r = fail(ncclInvalidArgument, "ncclCommUserRank: rank is NULL");
    if (r == ncclSuccess)
        *rank = c->rank;
    return r;
}

SIM_API ncclResult_t ncclCommFinalize(ncclComm_t comm)
{
    if (sim_comm_get(comm) == NULL)
        return fail(ncclInvalidArgument,
                    "ncclCommFinalize: comm is NULL or not a live communicator");
    return ncclSuccess;
}

/* Waits for the communicator's queued tasks (forever, if one hangs). */
SIM_API ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    sim_mark_context();
    if (comm == NULL)
        return ncclSuccess;
    struct sim_comm *c = sim_comm_get(comm);
    if (c == NULL)
        return fail(ncclInvalidArgument, "ncclCommDestroy: not a live communicator");
    pthread_mutex_lock(&c->mu);
    while (c->pending > 0)
        pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
    comm_release(c);
    return ncclSuccess;
}

/* Returns without waiting for the queued tasks: each one that is waiting,
 * or starts later, ends at once; the last one frees the memory. */
SIM_API ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    sim_mark_context();
    if (comm == NULL)
        return ncclSuccess;
    struct sim_comm *c = sim_comm_get(comm);
    if (c == NULL)
        return fail(ncclInvalidArgument, "ncclCommAbort: not a live communicator");
    if (c->abort_delay_ms > 0)
        usleep((useconds_t)c->abort_delay_ms * 1000u);
    atomic_store_explicit(&c->aborted, 1, memory_order_release);
    comm_release(c);
    return ncclSuccess;
}

SIM_API int c10d_gpusim_reap_orphans(void)
{
    DIR *d = opendir("/dev/shm");
    if (d == NULL)
        return 0;
    int reaped = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (strncmp(e->d_name, "c10dsim-", 8) != 0)
            continue;
        char name[300];
        snprintf(name, sizeof name, "/%s", e->d_name);
        int fd = shm_open(name, O_RDONLY, 0);
        if (fd < 0)
            continue;
        struct sim_seg_hdr h;
        ssize_t got = pread(fd, &h, sizeof h, 0);
        close(fd);
        /* Not laid out yet: its maker may still be at it. */
        if (got != (ssize_t)sizeof h || h.magic != SEG_MAGIC || h.creator_pid <= 0)
            continue;
        if (kill((pid_t)h.creator_pid, 0) == 0 || errno != ESRCH)
            continue;
        if (shm_unlink(name) == 0)
            reaped++;
    }
    closedir(d);
    return reaped;
}
