/* Large collectives read in place (in_place.h). */
#include "in_place.h"

#include "engine/env.h"
#include "engine/error.h"
#include "engine/kernels/reduce.h"
#include "engine/log.h"

#include <errno.h>
#include <stddef.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

/* What a rank says in its offer. */
enum { CAN_NOT_NOW = 0, CAN_READ = 1, CAN_NEVER = 2 };

/* At the start of the offering rank's slot for the chunk. */
struct offer {
    uint64_t can;
    uint64_t pid;
    uint64_t addr; /* its data: a broadcast or scatter root's, an all_gather rank's block,
                      an all_reduce's input */
    uint64_t out;  /* an all_reduce's output, where its peers read the slice it reduced */
};

static atomic_uint_fast64_t read_bytes;

uint64_t c10d__shm_in_place_bytes(void)
{
    return atomic_load(&read_bytes);
}

static struct offer *offer_of(const struct c10d__shm_seg *seg, int r, uint64_t gen)
{
    return (struct offer *)c10d__shm_slot(seg, r, gen);
}

/* The bytes an offered op moves in all (0: `op` never offers). */
static size_t offered_size(const struct c10d__op *op, const struct c10d__shm_seg *seg)
{
    if ((op->kind != C10D_OP_BROADCAST && op->kind != C10D_OP_ALL_GATHER &&
         op->kind != C10D_OP_SCATTER && op->kind != C10D_OP_ALL_REDUCE) ||
        atomic_load_explicit(&seg->no_offers, memory_order_relaxed))
        return 0;
    size_t bytes = op->count * c10d_dtype_size(op->dtype);
    if (op->kind == C10D_OP_ALL_REDUCE)
        return bytes >= C10D_SHM_IN_PLACE_ALL_REDUCE_MIN ? bytes : 0;
    if (op->kind == C10D_OP_BROADCAST)
        return bytes >= C10D_SHM_IN_PLACE_BROADCAST_MIN && bytes <= C10D_SHM_IN_PLACE_BROADCAST_MAX
                   ? bytes
                   : 0;
    bytes *= (size_t)seg->nranks;
    if (op->kind == C10D_OP_ALL_GATHER && op->recv_counts == NULL)
        return bytes >= C10D_SHM_IN_PLACE_ALL_GATHER_MIN ? bytes : 0;
    if (op->kind == C10D_OP_SCATTER)
        return bytes >= C10D_SHM_IN_PLACE_SCATTER_MIN ? bytes : 0;
    return 0;
}

int c10d__shm_in_place_offers(const struct c10d__op *op, const struct c10d__shm_seg *seg)
{
    return offered_size(op, seg) > 0;
}

size_t c10d__shm_in_place_size(const struct c10d__op *op, const struct c10d__shm_seg *seg)
{
    return offered_size(op, seg);
}

/* Whether this rank reads every peer's memory: tried once, by reading the
 * `nranks` of each peer's own segment record where its control block says it
 * is. A peer that has not attached yet: not now. */
static int peers_readable(struct c10d__shm_seg *seg)
{
    if (seg->read_peers != 0)
        return seg->read_peers == 1 ? CAN_READ : CAN_NEVER;
    if (!c10d__env_bool(C10D_ENV_SHM_IN_PLACE) || seg->crowded) {
        seg->read_peers = 2;
        return CAN_NEVER;
    }
    for (int r = 0; r < seg->nranks; r++) {
        if (r == seg->rank)
            continue;
        uint64_t pid = atomic_load_explicit(&seg->ctl[r].pid, memory_order_acquire);
        uint64_t self = atomic_load_explicit(&seg->ctl[r].self, memory_order_relaxed);
        if (pid == 0)
            return CAN_NOT_NOW;
        int theirs = 0;
        struct iovec mine = {&theirs, sizeof theirs};
        struct iovec at = {(void *)(uintptr_t)(self + offsetof(struct c10d__shm_seg, nranks)),
                           sizeof theirs};
        ssize_t n = process_vm_readv((pid_t)pid, &mine, 1, &at, 1, 0);
        if (n != (ssize_t)sizeof theirs || theirs != seg->nranks) {
            C10D_INFO("shm",
                      "rank %d cannot read rank %d's memory (%s): large broadcast, all_gather, "
                      "scatter, all_reduce and all_to_all copy through the segment's slots",
                      seg->rank, r, n < 0 ? strerror(errno) : "another process");
            seg->read_peers = 2;
            return CAN_NEVER;
        }
    }
    seg->read_peers = 1;
    return CAN_READ;
}

int c10d__shm_in_place_peers(struct c10d__shm_seg *seg)
{
    return peers_readable(seg) == CAN_READ;
}

int c10d__shm_in_place_readable(const struct iovec *at, int n)
{
    if (n == 0)
        return 1;
    char got[64];
    if ((size_t)n > sizeof got)
        return 0;
    size_t total = 0;
    for (int i = 0; i < n; i++)
        total += at[i].iov_len;
    struct iovec mine = {got, total};
    return total <= sizeof got &&
           process_vm_readv(getpid(), &mine, 1, at, (unsigned long)n, 0) == (ssize_t)total;
}

/* The a_len bytes at a and the b_len bytes at b share one at least. */
static int overlap(const char *a, size_t a_len, const char *b, size_t b_len)
{
    return a < b + b_len && b < a + a_len;
}

/* What this rank offers its peers to read, NULL if nothing, and its bytes. */
static const char *offered_data(const struct c10d__shm_coll *a)
{
    const struct c10d__op *op = a->op;
    if (op->kind == C10D_OP_ALL_GATHER || op->kind == C10D_OP_ALL_REDUCE)
        return op->send;
    if (a->seg->rank != op->root)
        return NULL;
    if (op->kind == C10D_OP_SCATTER)
        return op->send;
    return op->send != NULL ? op->send : op->recv;
}

static size_t offered_bytes(const struct c10d__shm_coll *a)
{
    size_t n = a->op->count * a->esz;
    return a->op->kind == C10D_OP_SCATTER ? n * (size_t)a->seg->nranks : n;
}

/* This op's buffers allow reading in place: nothing this rank writes may
 * overlap what its peers read from it, but for its own block in place. */
static int buffers_allow(const struct c10d__shm_coll *a)
{
    const struct c10d__op *op = a->op;
    const char *src = offered_data(a);
    size_t n = op->count * a->esz;
    if (op->sends != NULL) /* blocks apart: one address cannot say where each is */
        return 0;
    if (src == NULL || n == 0)
        return 1;
    switch (op->kind) {
    case C10D_OP_BROADCAST: /* the root writes only its own output */
        return op->recv == NULL || op->recv == src || !overlap(op->recv, n, src, n);
    case C10D_OP_ALL_REDUCE: /* in place, or apart: a peer reads the input while it is reduced */
        return op->recv == src || !overlap(op->recv, n, src, n);
    case C10D_OP_SCATTER: { /* the same, its own block of the input in place */
        const char *own = src + (size_t)a->seg->rank * n;
        return op->recv == own || !overlap(op->recv, n, src, offered_bytes(a));
    }
    default:
        break;
    }
    for (int r = 0; r < a->seg->nranks; r++) {
        const char *dst = c10d__shm_coll_block(a, r);
        if (overlap(dst, n, src, n) && !(r == a->seg->rank && dst == src))
            return 0;
    }
    return 1;
}

/* Whether the kernel reads what this rank offers: memory it cannot pin
 * (a device's mapping, say) fails a peer's read with EFAULT. Its first and
 * last byte, read by this very process. */
static int offered_readable(const struct c10d__shm_coll *a)
{
    const char *src = offered_data(a);
    size_t n = offered_bytes(a);
    if (src == NULL || n == 0)
        return 1;
    const char *out = a->op->kind == C10D_OP_ALL_REDUCE ? a->op->recv : src;
    struct iovec at[4] = {
        {(void *)src, 1}, {(void *)(src + n - 1), 1}, {(void *)out, 1}, {(void *)(out + n - 1), 1}};
    return c10d__shm_in_place_readable(at, 4);
}

void c10d__shm_in_place_offer(struct c10d__shm_coll *a)
{
    struct c10d__shm_seg *seg = a->seg;
    struct offer *o = offer_of(seg, seg->rank, a->gen);
    int can = peers_readable(seg);
    if (can == CAN_READ && (!buffers_allow(a) || !offered_readable(a)))
        can = CAN_NOT_NOW;
    o->can = (uint64_t)can;
    o->pid = atomic_load_explicit(&seg->ctl[seg->rank].pid, memory_order_relaxed);
    o->addr = (uint64_t)(uintptr_t)offered_data(a);
    o->out = (uint64_t)(uintptr_t)a->op->recv;
}

int c10d__shm_in_place_agreed(const struct c10d__shm_coll *a)
{
    const struct c10d__shm_seg *seg = a->seg;
    int all = 1;
    for (int r = 0; r < seg->nranks; r++) {
        uint64_t can = offer_of(seg, r, a->gen)->can;
        if (can == CAN_NEVER) /* every rank sees it at this very op */
            atomic_store_explicit(&a->seg->no_offers, 1, memory_order_relaxed);
        all &= can == CAN_READ;
    }
    return all;
}

int c10d__shm_in_place_copy(const struct c10d__shm_coll *a, int r, uint64_t pid, uint64_t addr,
                            char *dst, size_t bytes)
{
    for (size_t done = 0; done < bytes;) {
        struct iovec mine = {dst + done, bytes - done};
        struct iovec theirs = {(void *)(uintptr_t)(addr + done), bytes - done};
        ssize_t n = process_vm_readv((pid_t)pid, &mine, 1, &theirs, 1, 0);
        if (n <= 0)
            return c10d__fail(C10D_ECLOSED,
                              "shm %s (seq %llu): reading rank %d's buffer in place failed: %s",
                              c10d__op_kind_name(a->op->kind), (unsigned long long)a->op->seq, r,
                              n < 0 ? strerror(errno) : "nothing read");
        done += (size_t)n;
    }
    atomic_fetch_add_explicit(&read_bytes, bytes, memory_order_relaxed);
    return 0;
}

static int read_from(const struct c10d__shm_coll *a, int r, char *dst, size_t bytes)
{
    const struct offer *o = offer_of(a->seg, r, a->gen);
    return c10d__shm_in_place_copy(a, r, o->pid, o->addr, dst, bytes);
}

/* Rank r's slice of an all_reduce of n elements, as the slots' path cuts a
 * chunk. */
static void slice_of(size_t n, int nranks, int r, size_t *lo, size_t *cnt)
{
    *lo = n * (size_t)r / (size_t)nranks;
    *cnt = n * (size_t)(r + 1) / (size_t)nranks - *lo;
}

/* This rank's slice of an all_reduce: its own input (premultiplied), then
 * every peer's, read piece by piece into this rank's slot for the next
 * chunk (free: every peer's `arrive` at this chunk says it is done with the
 * one before, the last that used it), reduced into the output in rank
 * order, as reduce_slice in coll.c does. The slices are the whole op's, not
 * each chunk's as there: on 3 ranks or more a float sum may round
 * otherwise than through the slots (on 2 the same bits); every rank still
 * gets the same result. A piece of the output stays in cache from its first
 * operand to its last. */
static int reduce_own_slice(struct c10d__shm_coll *a)
{
    const struct c10d__op *op = a->op;
    const struct c10d__shm_seg *seg = a->seg;
    size_t lo, cnt, step = seg->slot_bytes / a->esz;
    slice_of(op->count, seg->nranks, seg->rank, &lo, &cnt);
    char *out = (char *)op->recv + lo * a->esz, *piece = c10d__shm_slot(seg, seg->rank, a->gen + 1);
    const char *in = (const char *)op->send + lo * a->esz;
    int premul = op->redop == C10D_PREMUL_SUM;
    for (size_t i = 0; i < cnt; i += step) {
        size_t m = cnt - i < step ? cnt - i : step, off = i * a->esz;
        if (out != in)
            memcpy(out + off, in + off, m * a->esz);
        if (premul)
            C10D_CHECK(c10d__reduce_premul(out + off, m, op->dtype, op->premul_factor));
        for (int r = 0; r < seg->nranks; r++) {
            if (r == seg->rank)
                continue;
            const struct offer *o = offer_of(seg, r, a->gen);
            C10D_CHECK(c10d__shm_in_place_copy(a, r, o->pid, o->addr + lo * a->esz + off, piece,
                                               m * a->esz));
            if (premul)
                C10D_CHECK(c10d__reduce_premul(piece, m, op->dtype, op->premul_factor));
            C10D_CHECK(c10d__reduce(out + off, piece, m, op->dtype, op->redop));
        }
        C10D_CHECK(c10d__reduce_finish(out + off, m, op->dtype, op->redop, seg->nranks));
    }
    return 0;
}

int c10d__shm_in_place_gather(struct c10d__shm_coll *a)
{
    const struct c10d__op *op = a->op;
    const struct c10d__shm_seg *seg = a->seg;
    for (int r = 0; r < seg->nranks; r++) {
        size_t lo, cnt;
        if (r == seg->rank)
            continue;
        slice_of(op->count, seg->nranks, r, &lo, &cnt);
        const struct offer *o = offer_of(seg, r, a->gen);
        C10D_CHECK(c10d__shm_in_place_copy(a, r, o->pid, o->out + lo * a->esz,
                                           (char *)op->recv + lo * a->esz, cnt * a->esz));
    }
    return 0;
}

int c10d__shm_in_place_read(struct c10d__shm_coll *a)
{
    const struct c10d__op *op = a->op;
    const struct c10d__shm_seg *seg = a->seg;
    size_t n = op->count * a->esz;
    const char *mine = offered_data(a);
    switch (op->kind) {
    case C10D_OP_ALL_REDUCE:
        return reduce_own_slice(a);
    case C10D_OP_BROADCAST:
        if (seg->rank != op->root) /* a rank may take part without an output */
            return op->recv != NULL ? read_from(a, op->root, op->recv, n) : 0;
        if (op->recv != NULL && op->recv != mine)
            memcpy(op->recv, mine, n);
        return 0;
    case C10D_OP_SCATTER: {
        size_t at = (size_t)seg->rank * n; /* this rank's block of the root's input */
        if (seg->rank != op->root) {
            const struct offer *o = offer_of(seg, op->root, a->gen);
            return c10d__shm_in_place_copy(a, op->root, o->pid, o->addr + at, op->recv, n);
        }
        if (op->recv != mine + at)
            memcpy(op->recv, mine + at, n);
        return 0;
    }
    default:
        break;
    }
    for (int r = 0; r < seg->nranks; r++) {
        char *dst = c10d__shm_coll_block(a, r);
        if (r != seg->rank)
            C10D_CHECK(read_from(a, r, dst, n));
        else if (dst != mine)
            memcpy(dst, mine, n);
    }
    return 0;
}
