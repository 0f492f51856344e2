/* The shared segment (segment.h): host identity, creating and attaching. */
#include "segment.h"

#include "engine/error.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#define SEG_MAGIC   0x63313064736d3031ull /* "c10dsm01" */
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

static size_t seg_bytes(int nranks, size_t slot_bytes, size_t *ctl_off, size_t *data_off)
{
    size_t ctl = (size_t)nranks * sizeof(struct c10d__shm_ctl);
    *ctl_off = HEADER_SIZE;
    *data_off = HEADER_SIZE + ((ctl + 4095) & ~(size_t)4095);
    return *data_off + (size_t)nranks * 2 * slot_bytes;
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
    seg->base = base;
    seg->map_bytes = bytes;
    seg->fd = -1;
    seg->nranks = nranks;
    seg->rank = rank;
    seg->slot_bytes = slot_bytes;
    seg->ctl = (struct c10d__shm_ctl *)((char *)base + ctl_off);
    seg->data = (char *)base + data_off;
    *out = seg;
    return 0;
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
    *out = seg;
    return 0;
}

void c10d__shm_free(struct c10d__shm_seg *seg)
{
    if (seg == NULL)
        return;
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

void c10d__shm_sleepy(struct c10d__shm_seg *seg)
{
    atomic_store_explicit(&seg->ctl[seg->rank].sleeping, 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_seq_cst);
}

void c10d__shm_awake(struct c10d__shm_seg *seg)
{
    if (atomic_load_explicit(&seg->ctl[seg->rank].sleeping, memory_order_relaxed) != 0)
        atomic_store_explicit(&seg->ctl[seg->rank].sleeping, 0, memory_order_relaxed);
}

void c10d__shm_wake_sleepers(struct c10d__shm_seg *seg, void (*ring)(void *arg, int r), void *arg)
{
    atomic_thread_fence(memory_order_seq_cst);
    for (int r = 0; r < seg->nranks; r++)
        if (r != seg->rank &&
            atomic_load_explicit(&seg->ctl[r].sleeping, memory_order_relaxed) != 0 &&
            atomic_exchange_explicit(&seg->ctl[r].sleeping, 0, memory_order_relaxed) != 0)
            ring(arg, r);
}
