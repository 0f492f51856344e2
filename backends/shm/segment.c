/* The shared segment (segment.h): host identity, creating and attaching,
 * and the doorbells that wake a sleeping rank. */
#include "segment.h"

#include "engine/error.h"
#include "engine/log.h"
#include "engine/loop.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#define SEG_MAGIC   0x63313064736d3032ull /* "c10dsm02" */
#define HEADER_SIZE 4096

struct seg_header {
    uint64_t magic;
    uint64_t nonce;
    uint32_t nranks;
    uint32_t pad;
    uint64_t slot_bytes;
};

static int read_line(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    int ok = fgets(buf, (int)cap, f) != NULL;
    fclose(f);
    if (!ok)
        return -1;
    buf[strcspn(buf, "\n")] = '\0';
    return 0;
}

void c10d__shm_host_id(char *buf, size_t cap)
{
    char boot[64], host[65];
    struct stat pidns, netns;
    buf[0] = '\0';
    /* A different boot is a different machine (or a VM of one); another pid
     * namespace cannot see rank 0's /proc entry; another user may not open
     * its descriptors. Another network namespace or host name is what a
     * container (or a test's simulated host) looks like: treated as another
     * host even where the memory could be shared. */
    if (read_line("/proc/sys/kernel/random/boot_id", boot, sizeof boot) < 0 ||
        stat("/proc/self/ns/pid", &pidns) < 0 || stat("/proc/self/ns/net", &netns) < 0 ||
        gethostname(host, sizeof host - 1) < 0)
        return;
    host[sizeof host - 1] = '\0';
    snprintf(buf, cap, "%s.%u.%llu.%llu.%s", boot, (unsigned)getuid(),
             (unsigned long long)pidns.st_ino, (unsigned long long)netns.st_ino, host);
}

/* Whether a segment for nranks has a ring and a mailbox per ordered pair of
 * ranks. */
static int has_rings(int nranks)
{
    return nranks >= 2 && nranks <= C10D_SHM_RING_MAX_RANKS;
}

size_t c10d__shm_slot_head_bytes(int nranks)
{
    /* all_to_all's header at most: 3 words per rank and 2 (all_to_all.c). */
    size_t words = (size_t)nranks * 3 + 2;
    return (words * sizeof(uint64_t) + 63) & ~(size_t)63;
}

static size_t slot_stride(int nranks, size_t slot_bytes)
{
    return slot_bytes + c10d__shm_slot_head_bytes(nranks);
}

static size_t seg_bytes(int nranks, size_t slot_bytes, size_t *ctl_off, size_t *data_off)
{
    size_t ctl = (size_t)nranks * sizeof(struct c10d__shm_ctl);
    *ctl_off = HEADER_SIZE;
    *data_off = HEADER_SIZE + ((ctl + 4095) & ~(size_t)4095);
    size_t bytes = *data_off + (size_t)nranks * 2 * slot_stride(nranks, slot_bytes);
    bytes = (bytes + 4095) & ~(size_t)4095;
    if (has_rings(nranks)) /* pages are only made where a ring or mailbox is used */
        bytes += (size_t)nranks * (size_t)nranks * (C10D_SHM_RING_SIZE + C10D_SHM_MAILBOX_SIZE);
    return bytes;
}

/* The CPUs this process's ranks share: those it may run on where that is a
 * subset (a container's cpuset), else the machine's; a process bound to one
 * CPU says nothing about its peers, so the machine's count stands. */
static long usable_cpus(void)
{
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        long mine = CPU_COUNT(&set);
        if (mine > 1 && (online < 1 || mine < online))
            return mine;
    }
    return online > 0 ? online : 1;
}

/* This rank's pid and record, for its peers' reads in place (in_place.h):
 * only into a segment that checked out as this group's. */
static void publish_self(struct c10d__shm_seg *seg)
{
    atomic_store_explicit(&seg->ctl[seg->rank].self, (uint64_t)(uintptr_t)seg,
                          memory_order_relaxed);
    atomic_store_explicit(&seg->ctl[seg->rank].pid, (uint64_t)getpid(), memory_order_release);
}

static int map_it(int fd, int nranks, int rank, size_t slot_bytes, struct c10d__shm_seg **out)
{
    size_t ctl_off, data_off;
    size_t bytes = seg_bytes(nranks, slot_bytes, &ctl_off, &data_off);
    struct c10d__shm_seg *seg = calloc(1, sizeof *seg);
    if (seg == NULL)
        return c10d__fail(C10D_ENOMEM, "shm: out of memory");
    void *base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        int e = errno;
        free(seg);
        return c10d__fail(C10D_ENOMEM, "shm: mapping %zu bytes failed: %s", bytes, strerror(e));
    }
    seg->peer_bell = malloc((size_t)nranks * sizeof *seg->peer_bell);
    if (seg->peer_bell == NULL) {
        munmap(base, bytes);
        free(seg);
        return c10d__fail(C10D_ENOMEM, "shm: out of memory");
    }
    for (int r = 0; r < nranks; r++)
        atomic_init(&seg->peer_bell[r], -2);
    seg->bell_rd = seg->bell_wr = -1;
    seg->base = base;
    seg->map_bytes = bytes;
    seg->fd = -1;
    seg->nranks = nranks;
    seg->rank = rank;
    seg->slot_bytes = slot_bytes;
    seg->slot_stride = slot_stride(nranks, slot_bytes);
    seg->crowded = nranks > usable_cpus();
    seg->ctl = (struct c10d__shm_ctl *)((char *)base + ctl_off);
    seg->data = (char *)base + data_off;
    if (has_rings(nranks)) {
        size_t rings_off =
            (data_off + (size_t)nranks * 2 * seg->slot_stride + 4095) & ~(size_t)4095;
        seg->rings = (char *)base + rings_off;
        seg->mailboxes = seg->rings + (size_t)nranks * (size_t)nranks * C10D_SHM_RING_SIZE;
    }
    *out = seg;
    return 0;
}

/* The element of a per-ordered-pair array (`size` bytes each) that `from`
 * writes and `to` reads, NULL if there is none. */
static void *pair_of(const struct c10d__shm_seg *seg, char *base, size_t size, int from, int to)
{
    if (base == NULL || from == to || from < 0 || to < 0 || from >= seg->nranks ||
        to >= seg->nranks)
        return NULL;
    return base + ((size_t)from * (size_t)seg->nranks + (size_t)to) * size;
}

struct c10d__shm_ring *c10d__shm_ring_of(const struct c10d__shm_seg *seg, int from, int to)
{
    return pair_of(seg, seg->rings, C10D_SHM_RING_SIZE, from, to);
}

struct c10d__shm_mailbox *c10d__shm_mailbox_of(const struct c10d__shm_seg *seg, int from, int to)
{
    return pair_of(seg, seg->mailboxes, C10D_SHM_MAILBOX_SIZE, from, to);
}

/* Each "cannot" of the doorbells is said once per process, at DEBUG: the tcp
 * ring still wakes the rank, a little slower. */
static void bell_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void bell_note(const char *fmt, ...)
{
    static atomic_int said;
    if (atomic_exchange(&said, 1) != 0)
        return;
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    C10D_DEBUG("shm", "%s: that rank is woken over tcp instead", msg);
}

static _Atomic uint64_t rung_by_bell, rung_by_ring;

void c10d__shm_bell_counts(uint64_t *bells, uint64_t *fallbacks)
{
    *bells = atomic_load(&rung_by_bell);
    *fallbacks = atomic_load(&rung_by_ring);
}

/* This rank's doorbell: a pipe (an eventfd cannot be opened through
 * /proc/<pid>/fd: ENXIO; a pipe opens there as a FIFO, under the same
 * permission check as the memfd). Its write end's number is published in
 * the segment for the peers to open; the rank keeps that end too, so that
 * its read end never sees end-of-file. No pipe: the peers ring over tcp. */
static void bell_make(struct c10d__shm_seg *seg)
{
    int p[2];
    struct stat st;
    if (pipe2(p, O_CLOEXEC | O_NONBLOCK) < 0) {
        bell_note("shm: no doorbell pipe for rank %d: %s", seg->rank, strerror(errno));
        return;
    }
    if (fstat(p[1], &st) < 0) {
        bell_note("shm: no doorbell pipe for rank %d: %s", seg->rank, strerror(errno));
        close(p[0]);
        close(p[1]);
        return;
    }
    seg->bell_rd = p[0];
    seg->bell_wr = p[1];
    struct c10d__shm_ctl *c = &seg->ctl[seg->rank];
    atomic_store_explicit(&c->bell_ino, (uint64_t)st.st_ino, memory_order_relaxed);
    atomic_store_explicit(&c->bell, (uint64_t)getpid() << 32 | (uint32_t)p[1],
                          memory_order_release);
}

int c10d__shm_bell_fd(const struct c10d__shm_seg *seg)
{
    return seg->bell_rd;
}

void c10d__shm_bell_withdraw(struct c10d__shm_seg *seg)
{
    atomic_store_explicit(&seg->ctl[seg->rank].bell, 0, memory_order_relaxed);
}

/* Opens rank r's doorbell: its descriptor, or -1 (ring over tcp). */
static int bell_open(const struct c10d__shm_seg *seg, int r)
{
    const struct c10d__shm_ctl *c = &seg->ctl[r];
    uint64_t b = atomic_load_explicit(&c->bell, memory_order_acquire);
    uint64_t ino = atomic_load_explicit(&c->bell_ino, memory_order_relaxed);
    if (b == 0) {
        bell_note("shm: rank %d of a segment has no doorbell", r);
        return -1;
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/%u/fd/%u", (unsigned)(b >> 32), (unsigned)(b & UINT32_MAX));
    int fd = open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        bell_note("shm: cannot open the doorbell %s of rank %d: %s", path, r, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISFIFO(st.st_mode) || (uint64_t)st.st_ino != ino) {
        bell_note("shm: %s is not rank %d's doorbell", path, r);
        close(fd);
        return -1;
    }
    return fd;
}

/* Rank r's doorbell, opened on first use (so -1 for good once opening a
 * published one failed). One not published (yet, or withdrawn) is asked for
 * again next time: a ring before r published it must not cost every later
 * wake-up a tcp frame. The loop (P2P rings) and a caller's lane may race
 * here: the first answer stays, the other closes what it opened. */
static int bell_of(struct c10d__shm_seg *seg, int r)
{
    int known = atomic_load_explicit(&seg->peer_bell[r], memory_order_acquire);
    if (known != -2)
        return known;
    if (atomic_load_explicit(&seg->ctl[r].bell, memory_order_acquire) == 0) {
        bell_note("shm: rank %d of a segment has no doorbell (yet)", r);
        return -1;
    }
    int fd = bell_open(seg, r);
    if (!atomic_compare_exchange_strong(&seg->peer_bell[r], &known, fd)) {
        if (fd >= 0)
            close(fd);
        return known;
    }
    return fd;
}

int c10d__shm_create(int nranks, size_t slot_bytes, struct c10d__shm_seg **out, char *ref,
                     size_t cap)
{
    *out = NULL;
    size_t ctl_off, data_off;
    size_t bytes = seg_bytes(nranks, slot_bytes, &ctl_off, &data_off);
    int fd = memfd_create("c10d-shm", MFD_CLOEXEC);
    if (fd < 0)
        return c10d__fail(C10D_EIO, "shm: memfd_create failed: %s", strerror(errno));
    if (ftruncate(fd, (off_t)bytes) < 0) {
        int e = errno;
        close(fd);
        return c10d__fail(C10D_ENOMEM, "shm: sizing the segment to %zu bytes failed: %s", bytes,
                          strerror(e));
    }
    struct c10d__shm_seg *seg;
    int rc = map_it(fd, nranks, 0, slot_bytes, &seg);
    if (rc < 0) {
        close(fd);
        return rc;
    }
    struct seg_header *h = seg->base;
    if (getrandom(&h->nonce, sizeof h->nonce, 0) != (ssize_t)sizeof h->nonce)
        h->nonce = (uint64_t)getpid() << 32 ^ (uint64_t)(uintptr_t)seg;
    h->nranks = (uint32_t)nranks;
    h->slot_bytes = slot_bytes;
    h->magic = SEG_MAGIC;
    seg->fd = fd;
    bell_make(seg);
    publish_self(seg);
    snprintf(ref, cap, "%d.%d.%016" PRIx64 ".%zu", (int)getpid(), fd, h->nonce, slot_bytes);
    *out = seg;
    return 0;
}

int c10d__shm_attach(const char *ref, int nranks, int rank, struct c10d__shm_seg **out)
{
    *out = NULL;
    int pid, fd;
    uint64_t nonce;
    size_t slot_bytes;
    if (sscanf(ref, "%d.%d.%" SCNx64 ".%zu", &pid, &fd, &nonce, &slot_bytes) != 4 ||
        slot_bytes == 0)
        return c10d__fail(C10D_EPROTO, "shm: rank 0's segment reference '%s' is malformed", ref);
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", pid, fd);
    int mine = open(path, O_RDWR | O_CLOEXEC);
    if (mine < 0)
        return c10d__fail(C10D_EIO,
                          "shm: cannot open rank 0's segment %s: %s (set C10D_SHM=0 on every "
                          "rank to use tcp only)",
                          path, strerror(errno));
    struct stat st;
    size_t ctl_off, data_off;
    size_t bytes = seg_bytes(nranks, slot_bytes, &ctl_off, &data_off);
    if (fstat(mine, &st) < 0 || (size_t)st.st_size != bytes) {
        close(mine);
        return c10d__fail(C10D_EPROTO, "shm: %s is not a segment for %d ranks", path, nranks);
    }
    struct c10d__shm_seg *seg;
    int rc = map_it(mine, nranks, rank, slot_bytes, &seg);
    close(mine); /* the mapping keeps the memory */
    if (rc < 0)
        return rc;
    const struct seg_header *h = seg->base;
    if (h->magic != SEG_MAGIC || h->nonce != nonce || h->nranks != (uint32_t)nranks) {
        c10d__shm_free(seg);
        return c10d__fail(C10D_EPROTO, "shm: %s is not the segment rank 0 made for this group",
                          path);
    }
    bell_make(seg);
    publish_self(seg);
    *out = seg;
    return 0;
}

void c10d__shm_free(struct c10d__shm_seg *seg)
{
    if (seg == NULL)
        return;
    if (seg->bell_wr >= 0) { /* withdrawn first: its number may be reused */
        atomic_store_explicit(&seg->ctl[seg->rank].bell, 0, memory_order_relaxed);
        close(seg->bell_wr);
        close(seg->bell_rd);
    }
    for (int r = 0; r < seg->nranks; r++)
        if (seg->peer_bell[r] >= 0)
            close(seg->peer_bell[r]);
    free(seg->peer_bell);
    munmap(seg->base, seg->map_bytes);
    if (seg->fd >= 0)
        close(seg->fd);
    free(seg);
}

void c10d__shm_announce(struct c10d__shm_seg *seg, uint64_t seq, uint32_t member,
                        const struct c10d__fp *fp)
{
    struct c10d__shm_ctl *c = &seg->ctl[seg->rank];
    uint64_t w[2];
    memcpy(w, fp, sizeof w);
    atomic_store_explicit(&c->ann_seq, 0, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    atomic_store_explicit(&c->ann_member, member, memory_order_relaxed);
    atomic_store_explicit(&c->ann_fp[0], w[0], memory_order_relaxed);
    atomic_store_explicit(&c->ann_fp[1], w[1], memory_order_relaxed);
    atomic_store_explicit(&c->ann_seq, seq, memory_order_release);
}

int c10d__shm_peer_differs(const struct c10d__shm_seg *seg, int r, uint64_t seq, uint32_t member,
                           const struct c10d__fp *fp, struct c10d__fp *theirs)
{
    const struct c10d__shm_ctl *c = &seg->ctl[r];
    if (atomic_load_explicit(&c->ann_seq, memory_order_acquire) != seq)
        return 0;
    uint64_t m = atomic_load_explicit(&c->ann_member, memory_order_relaxed);
    uint64_t w[2] = {atomic_load_explicit(&c->ann_fp[0], memory_order_relaxed),
                     atomic_load_explicit(&c->ann_fp[1], memory_order_relaxed)};
    atomic_thread_fence(memory_order_acquire);
    if (atomic_load_explicit(&c->ann_seq, memory_order_relaxed) != seq || m != member)
        return 0; /* changing under us, or another member: asked again later */
    memcpy(theirs, w, sizeof w);
    return !c10d__fp_equal(theirs, fp);
}

/* The flag and the counters: the sleeper stores its flag, then a full fence,
 * then looks at the counters; a publisher stores a counter, then a full fence
 * (c10d__shm_wake_sleepers), then looks at the flags. Two seq_cst fences order
 * both store-then-load pairs, so at least one side sees the other's store: the
 * sleeper its new counter, or the publisher its flag (and rings). The flag's
 * store is also a release, and the publisher's exchange an acquire, so a
 * publisher that saw the flag sees the doorbell published before it. */
void c10d__shm_sleepy(struct c10d__shm_seg *seg)
{
    atomic_store_explicit(&seg->ctl[seg->rank].sleeping, 1, memory_order_release);
    atomic_thread_fence(memory_order_seq_cst);
}

void c10d__shm_awake(struct c10d__shm_seg *seg)
{
    if (atomic_load_explicit(&seg->ctl[seg->rank].sleeping, memory_order_relaxed) != 0)
        atomic_store_explicit(&seg->ctl[seg->rank].sleeping, 0, memory_order_relaxed);
}

/* One byte wakes the sleeper's epoll (level-triggered: a byte written before
 * it blocks wakes it as well). A full pipe already wakes it (EAGAIN); a
 * doorbell whose reader is gone (EPIPE: the loop thread blocks SIGPIPE) or
 * any other error falls back to the tcp ring. */
/* A thread of the caller's (the waiter's lane, docs/engine.md) does not
 * block SIGPIPE as the loop thread does: a closed doorbell must not end the
 * process, so the signal is blocked around the write and a pending one it
 * raised is taken back. Only a rank that sleeps is rung: never per op. */
static ssize_t bell_write(int fd)
{
    static const char one = 1;
    if (c10d__on_loop_thread())
        return write(fd, &one, 1);
    sigset_t pipe_set, old;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
    ssize_t n = write(fd, &one, 1);
    int err = errno;
    if (n < 0 && err == EPIPE && !sigismember(&old, SIGPIPE)) {
        const struct timespec zero = {0, 0};
        sigtimedwait(&pipe_set, NULL, &zero);
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    errno = err;
    return n;
}

static int bell_ring(struct c10d__shm_seg *seg, int r)
{
    int fd = bell_of(seg, r);
    if (fd < 0)
        return -1;
    if (bell_write(fd) == 1 || errno == EAGAIN) {
        atomic_fetch_add_explicit(&rung_by_bell, 1, memory_order_relaxed);
        return 0;
    }
    return -1;
}

int c10d__shm_bells_all(struct c10d__shm_seg *seg)
{
    for (int r = 0; r < seg->nranks; r++) {
        if (r == seg->rank)
            continue;
        /* Not published yet: asked again later, not given up for good. */
        if (atomic_load_explicit(&seg->peer_bell[r], memory_order_acquire) == -2 &&
            atomic_load_explicit(&seg->ctl[r].bell, memory_order_acquire) == 0)
            return 0;
        if (bell_of(seg, r) < 0)
            return 0;
    }
    return 1;
}

void c10d__shm_wake(struct c10d__shm_seg *seg, int r, void (*ring)(void *arg, int r), void *arg)
{
    if (bell_ring(seg, r) < 0) {
        atomic_fetch_add_explicit(&rung_by_ring, 1, memory_order_relaxed);
        ring(arg, r);
    }
}

void c10d__shm_wake_sleepers(struct c10d__shm_seg *seg, void (*ring)(void *arg, int r), void *arg)
{
    atomic_thread_fence(memory_order_seq_cst);
    for (int r = 0; r < seg->nranks; r++)
        if (r != seg->rank &&
            atomic_load_explicit(&seg->ctl[r].sleeping, memory_order_relaxed) != 0 &&
            atomic_exchange_explicit(&seg->ctl[r].sleeping, 0, memory_order_acquire) != 0 &&
            bell_ring(seg, r) < 0) {
            atomic_fetch_add_explicit(&rung_by_ring, 1, memory_order_relaxed);
            ring(arg, r);
        }
}
