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
    if (op->kind == C10D_OP_ALL_REDUCE) /* slots that make sliced chunks: reduce_own_slices */
        return bytes >= C10D_SHM_IN_PLACE_ALL_REDUCE_MIN &&
                       bytes <= C10D_SHM_IN_PLACE_ALL_REDUCE_MAX &&
                       seg->slot_bytes / c10d_dtype_size(op->dtype) * c10d_dtype_size(op->dtype) >
                           C10D_SHM_SMALL_MAX
                   ? bytes
                   : 0;
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

/* An all_reduce read in place cuts its elements as the slots' path does
 * (coll.c), so that every element is reduced in the same order, to the same
 * bits: chunks of a slot's elements, each cut into one slice per rank,
 * which its owner reduces (its own input first, then its peers' in rank
 * order) and everyone gathers; but a last chunk of C10D_SHM_SMALL_MAX
 * bytes or less every rank reduces whole, in rank order. Only slots larger
 * than that are offered (offered_size), so that one chunk at most is so. */
static int whole_chunk(const struct c10d__shm_coll *a, size_t n)
{
    return c10d__shm_small_chunk(n * a->esz, a->seg->nranks, 0);
}

/* Elements of the chunk that starts at element `at`. */
static size_t chunk_at(const struct c10d__shm_coll *a, size_t at)
{
    size_t left = a->op->count - at;
    return left < a->chunk_elems ? left : a->chunk_elems;
}

/* Where this rank reads its peers' pieces: its slot for the next chunk
 * (free: every peer's `arrive` at this chunk says it is done with the one
 * before, the last that used it). */
static char *piece_of(const struct c10d__shm_coll *a)
{
    return c10d__shm_slot(a->seg, a->seg->rank, a->gen + 1);
}

/* Where a whole last chunk is reduced, until this rank may write its output
 * (its peers read its input there until every rank reduced): past the offer
 * in the offer's slot, whose head room makes a slot's bytes fit there. */
_Static_assert(sizeof(struct offer) <= 64, "the offer fits the head room's first line");
static char *whole_of(const struct c10d__shm_coll *a)
{
    return c10d__shm_slot(a->seg, a->seg->rank, a->gen) + 64;
}

/* Peer r's n elements from byte `at` of its input into piece, premultiplied
 * as its slot would hold them. */
static int read_input(struct c10d__shm_coll *a, int r, size_t at, size_t n, char *piece)
{
    const struct offer *o = offer_of(a->seg, r, a->gen);
    C10D_CHECK(c10d__shm_in_place_copy(a, r, o->pid, o->addr + at, piece, n * a->esz));
    if (a->op->redop == C10D_PREMUL_SUM)
        C10D_CHECK(c10d__reduce_premul(piece, n, a->op->dtype, a->op->premul_factor));
    return 0;
}

/* A last chunk of n elements from element `at`, whole, in rank order (as
 * reduce_all in coll.c), into whole_of. */
static int reduce_whole(struct c10d__shm_coll *a, size_t at, size_t n)
{
    const struct c10d__op *op = a->op;
    char *acc = whole_of(a), *piece = piece_of(a);
    size_t bytes = n * a->esz;
    for (int r = 0; r < a->seg->nranks; r++) {
        const char *src = piece;
        if (r != a->seg->rank) {
            C10D_CHECK(read_input(a, r, at * a->esz, n, piece));
        } else if (op->redop == C10D_PREMUL_SUM) { /* this rank's own, as its slot would hold it */
            memcpy(piece, (const char *)op->send + at * a->esz, bytes);
            C10D_CHECK(c10d__reduce_premul(piece, n, op->dtype, op->premul_factor));
        } else {
            src = (const char *)op->send + at * a->esz;
        }
        if (r == 0)
            memcpy(acc, src, bytes);
        else
            C10D_CHECK(c10d__reduce(acc, src, n, op->dtype, op->redop));
    }
    return c10d__reduce_finish(acc, n, op->dtype, op->redop, a->seg->nranks);
}

/* Ranges in one process_vm_readv: an all_reduce's slices, one per chunk,
 * in one system call (each costs about a microsecond here, and pins its
 * pages either way). */
enum { READ_V_MAX = 64 };

/* n ranges of rank r's memory into this process's: one system call, or
 * where it comes back short, range by range from where it stopped (which
 * goes on past a read cut short, or names the failure). */
static int read_v(const struct c10d__shm_coll *a, int r, uint64_t pid, const struct iovec *mine,
                  const struct iovec *theirs, int n)
{
    size_t total = 0;
    for (int i = 0; i < n; i++)
        total += mine[i].iov_len;
    ssize_t got = process_vm_readv((pid_t)pid, mine, (unsigned long)n, theirs, (unsigned long)n, 0);
    size_t skip = got > 0 ? (size_t)got : 0;
    atomic_fetch_add_explicit(&read_bytes, skip, memory_order_relaxed);
    for (int i = 0; i < n && skip < total; i++) {
        size_t len = mine[i].iov_len;
        if (skip >= len) {
            skip -= len;
            total -= len;
            continue;
        }
        C10D_CHECK(c10d__shm_in_place_copy(a, r, pid,
                                           (uint64_t)(uintptr_t)theirs[i].iov_base + skip,
                                           (char *)mine[i].iov_base + skip, len - skip));
        total -= len;
        skip = 0;
    }
    return 0;
}

/* This rank's slice of every chunk, into its output: its own input
 * (premultiplied), then each peer's copy of the slice, read into piece_of,
 * in rank order, as reduce_slice in coll.c. As many chunks at a time as
 * their slices fill the piece, each peer's in one read; those slices of
 * the output stay in cache from their first operand to their last. */
static int reduce_own_slices(struct c10d__shm_coll *a)
{
    const struct c10d__op *op = a->op;
    const struct c10d__shm_seg *seg = a->seg;
    char *piece = piece_of(a);
    size_t most = (a->chunk_elems + (size_t)seg->nranks - 1) / (size_t)seg->nranks;
    size_t per = seg->slot_bytes / (most * a->esz);
    per = per < 1 ? 1 : per > READ_V_MAX ? READ_V_MAX : per;
    struct iovec mine[READ_V_MAX], theirs[READ_V_MAX];
    size_t off[READ_V_MAX], cnt[READ_V_MAX];
    for (size_t at = 0; at < op->count;) {
        int k = 0;
        while ((size_t)k < per && at < op->count) {
            size_t n = chunk_at(a, at), lo;
            if (whole_chunk(a, n)) /* the last chunk (offered_size) */
                break;
            c10d__shm_slice(n, seg->nranks, seg->rank, &lo, &cnt[k]);
            off[k++] = (at + lo) * a->esz;
            at += n;
        }
        if (k == 0) {
            C10D_CHECK(reduce_whole(a, at, op->count - at));
            break;
        }
        for (int j = 0; j < k; j++) {
            char *out = (char *)op->recv + off[j];
            const char *in = (const char *)op->send + off[j];
            if (out != in)
                memcpy(out, in, cnt[j] * a->esz);
            if (op->redop == C10D_PREMUL_SUM)
                C10D_CHECK(c10d__reduce_premul(out, cnt[j], op->dtype, op->premul_factor));
        }
        for (int r = 0; r < seg->nranks; r++) {
            if (r == seg->rank)
                continue;
            const struct offer *o = offer_of(seg, r, a->gen);
            for (int j = 0; j < k; j++) {
                mine[j] = (struct iovec){piece + (size_t)j * most * a->esz, cnt[j] * a->esz};
                theirs[j] = (struct iovec){(void *)(uintptr_t)(o->addr + off[j]), cnt[j] * a->esz};
            }
            C10D_CHECK(read_v(a, r, o->pid, mine, theirs, k));
            for (int j = 0; j < k; j++) {
                if (op->redop == C10D_PREMUL_SUM)
                    C10D_CHECK(c10d__reduce_premul(mine[j].iov_base, cnt[j], op->dtype,
                                                   op->premul_factor));
                C10D_CHECK(c10d__reduce((char *)op->recv + off[j], mine[j].iov_base, cnt[j],
                                        op->dtype, op->redop));
            }
        }
        for (int j = 0; j < k; j++)
            C10D_CHECK(c10d__reduce_finish((char *)op->recv + off[j], cnt[j], op->dtype, op->redop,
                                           seg->nranks));
    }
    return 0;
}

int c10d__shm_in_place_gather(struct c10d__shm_coll *a)
{
    const struct c10d__op *op = a->op;
    const struct c10d__shm_seg *seg = a->seg;
    struct iovec mine[READ_V_MAX], theirs[READ_V_MAX];
    size_t whole_at = op->count;
    for (int r = 0; r < seg->nranks; r++) {
        if (r == seg->rank)
            continue;
        const struct offer *o = offer_of(seg, r, a->gen);
        int k = 0;
        for (size_t at = 0; at < op->count; at += a->chunk_elems) {
            size_t n = chunk_at(a, at), lo, cnt;
            if (whole_chunk(a, n)) {
                whole_at = at;
                break;
            }
            c10d__shm_slice(n, seg->nranks, r, &lo, &cnt);
            size_t off = (at + lo) * a->esz;
            mine[k] = (struct iovec){(char *)op->recv + off, cnt * a->esz};
            theirs[k++] = (struct iovec){(void *)(uintptr_t)(o->out + off), cnt * a->esz};
            if (k == READ_V_MAX) {
                C10D_CHECK(read_v(a, r, o->pid, mine, theirs, k));
                k = 0;
            }
        }
        if (k > 0)
            C10D_CHECK(read_v(a, r, o->pid, mine, theirs, k));
    }
    if (whole_at < op->count) /* every peer read this rank's input there */
        memcpy((char *)op->recv + whole_at * a->esz, whole_of(a), (op->count - whole_at) * a->esz);
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
        return reduce_own_slices(a);
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
