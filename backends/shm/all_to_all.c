/* all_to_all through the segment (all_to_all.h). */
#include "all_to_all.h"

#include "in_place.h"

#include "engine/error.h"

#include <string.h>
#include <sys/uio.h>

/* A slot's header at an all_to_all's chunks: its owner's send and receive
 * counts, then, up to V_OFFER_MAX ranks, its offer (in_place.h): whether it
 * can read in place (V_CAN: one of the values below), its pid, and where
 * each of its send blocks starts. Larger segments have no offer and never
 * read in place. It fits the slot's head room (segment.h), so parts have
 * slot_bytes. */
enum { V_CAN = 0, V_PID = 1, V_ADDR = 2 }; /* after the 2 x ranks counts */
/* V_CAN: cannot; can, and its parts hold the chunk; can, and its parts are
 * empty (its peers read all of its blocks in place, or, if one cannot,
 * every rank runs the op through the slots from the next chunk on). */
enum { V_CANNOT = 0, V_CAN_FULL = 1, V_CAN_EMPTY = 2 };
#define V_OFFER_MAX 32

static size_t v_header_bytes(int nranks)
{
    size_t words = (size_t)nranks * 2 + (nranks <= V_OFFER_MAX ? (size_t)nranks + 2 : 0);
    return (words * sizeof(uint64_t) + 63) & ~(size_t)63;
}

size_t c10d__shm_a2a_part_elems(size_t slot_bytes, int nranks, size_t esz)
{
    size_t room = slot_bytes + c10d__shm_slot_head_bytes(nranks), hdr = v_header_bytes(nranks);
    return room > hdr ? (room - hdr) / (size_t)nranks / esz : 0;
}

static size_t v_count_of(const struct c10d__op *op, int nranks, const size_t *counts, int j)
{
    return counts != NULL ? counts[j] : op->count / (size_t)nranks;
}

static size_t v_count(const struct c10d__shm_coll *a, const size_t *counts, int j)
{
    return v_count_of(a->op, a->seg->nranks, counts, j);
}

/* Elements of a block of `count` that the chunk at `done` moves. */
static size_t v_window(const struct c10d__shm_coll *a, size_t count)
{
    if (count <= a->done_elems)
        return 0;
    size_t left = count - a->done_elems;
    return left < a->chunk_elems ? left : a->chunk_elems;
}

/* Whether some output block overlaps an input block that starts elsewhere.
 * Blocks that start at the same address are safe: a chunk overwrites the
 * window of the output that this very chunk already read from the input,
 * and later chunks read later windows (in-place even splits, all_gather_v's
 * own block). */
static int v_overlaps(const struct c10d__op *op, int p, size_t esz, int strict)
{
    size_t s_off = 0;
    for (int i = 0; i < p; i++) {
        size_t sc = v_count_of(op, p, op->send_counts, i);
        const char *s_lo = op->sends != NULL ? op->sends[i] : (const char *)op->send + s_off * esz;
        s_off += sc;
        size_t r_off = 0;
        for (int j = 0; j < p && sc > 0; j++) {
            size_t rc = v_count_of(op, p, op->recv_counts, j);
            const char *r_lo =
                op->recvs != NULL ? op->recvs[j] : (const char *)op->recv + r_off * esz;
            r_off += rc;
            if (rc > 0 && (strict || s_lo != r_lo) && s_lo < r_lo + rc * esz &&
                r_lo < s_lo + sc * esz)
                return 1;
        }
    }
    return 0;
}

static size_t v_send_total(const struct c10d__shm_coll *a)
{
    size_t total = 0;
    for (int j = 0; j < a->seg->nranks; j++)
        total += v_count(a, a->op->send_counts, j);
    return total * a->esz;
}

size_t c10d__shm_coll_copy_bytes(const struct c10d__shm_coll *a)
{
    if (!a->counted || !v_overlaps(a->op, a->seg->nranks, a->esz, 0))
        return 0;
    size_t bytes = v_send_total(a);
    return bytes > 0 ? bytes : 1;
}

void c10d__shm_coll_set_copy(struct c10d__shm_coll *a, void *copy)
{
    const struct c10d__op *op = a->op;
    char *at = copy;
    for (int j = 0; j < a->seg->nranks; j++) {
        size_t len = v_count(a, op->send_counts, j) * a->esz;
        const char *src =
            op->sends != NULL ? op->sends[j] : (const char *)op->send + (at - (char *)copy);
        if (len > 0)
            memcpy(at, src, len);
        at += len;
    }
    a->copy = copy;
}

static uint64_t *v_header(const struct c10d__shm_seg *seg, int r, uint64_t gen)
{
    return (uint64_t *)c10d__shm_slot(seg, r, gen);
}

/* Where the block this rank receives from rank j starts (`off`: the
 * elements received from the ranks before j). */
static char *v_recv_block(const struct c10d__shm_coll *a, int j, size_t off)
{
    const struct c10d__op *op = a->op;
    return op->recvs != NULL ? op->recvs[j] : (char *)op->recv + off * a->esz;
}

/* Where this rank's block for rank d starts in what it sends, `off` the
 * elements of the blocks before it. */
static const char *v_send_at(const struct c10d__shm_coll *a, int d, size_t off)
{
    const struct c10d__op *op = a->op;
    return a->copy != NULL     ? a->copy + off * a->esz
           : op->sends != NULL ? op->sends[d]
                               : (const char *)op->send + off * a->esz;
}

/* Where this rank's block for rank d starts in what it sends. */
static const char *v_send_block(const struct c10d__shm_coll *a, int d)
{
    size_t off = 0;
    for (int j = 0; j < d; j++)
        off += v_count(a, a->op->send_counts, j);
    return v_send_at(a, d, off);
}

/* Whether this rank may take part in reading its blocks in place:
 * trivially where none of its own blocks is longer than a chunk nor as long
 * as C10D_SHM_A2A_EMPTY_MIN (nothing of its own is read, it reads nothing:
 * a block read in place is one of these at both ends); else if it reads its
 * peers, no block it receives overlaps one it sends (the peers read its
 * input while it writes its output), and the kernel reads its input, whose
 * blocks start at addr[]. */
static int v_can(struct c10d__shm_coll *a, const uint64_t *addr)
{
    const struct c10d__op *op = a->op;
    int p = a->seg->nranks;
    int longer = 0;
    for (int j = 0; j < p; j++) {
        size_t s = v_count(a, op->send_counts, j), r = v_count(a, op->recv_counts, j);
        longer |= s > a->chunk_elems || r > a->chunk_elems ||
                  (j != a->seg->rank &&
                   (s * a->esz >= C10D_SHM_A2A_EMPTY_MIN || r * a->esz >= C10D_SHM_A2A_EMPTY_MIN));
    }
    if (!longer)
        return 1;
    if (a->copy == NULL && v_overlaps(op, p, a->esz, 1))
        return 0;
    if (!c10d__shm_in_place_peers(a->seg))
        return 0;
    struct iovec at[2 * V_OFFER_MAX];
    int n = 0;
    for (int d = 0; d < p; d++) {
        size_t len = v_count(a, op->send_counts, d) * a->esz;
        if (len == 0)
            continue;
        const char *b = (const char *)(uintptr_t)addr[d];
        at[n++] = (struct iovec){(void *)b, 1};
        at[n++] = (struct iovec){(void *)(b + len - 1), 1};
    }
    return c10d__shm_in_place_readable(at, n);
}

/* Whether this rank's first chunk goes out empty, its blocks read in place
 * from the start, where it can: one of its send blocks takes
 * C10D_SHM_A2A_EMPTY_MIN bytes at least. */
static int v_empty_worth(const struct c10d__shm_coll *a)
{
    for (int d = 0; d < a->seg->nranks; d++)
        if (d != a->seg->rank &&
            v_count(a, a->op->send_counts, d) * a->esz >= C10D_SHM_A2A_EMPTY_MIN)
            return 1;
    return 0;
}

void c10d__shm_a2a_write(struct c10d__shm_coll *a)
{
    struct c10d__shm_seg *seg = a->seg;
    const struct c10d__op *op = a->op;
    int p = seg->nranks;
    uint64_t *hdr = v_header(seg, seg->rank, a->gen);
    char *parts = (char *)hdr + v_header_bytes(p);
    /* At the first chunk, up to V_OFFER_MAX ranks, the offer follows the
     * counts. */
    uint64_t *offer = a->done_elems == 0 && p <= V_OFFER_MAX ? hdr + 2 * p : NULL;
    int empty = 0;
    if (offer != NULL) {
        size_t off = 0;
        for (int d = 0; d < p; d++) {
            offer[V_ADDR + d] = (uint64_t)(uintptr_t)v_send_at(a, d, off);
            off += v_count(a, op->send_counts, d);
        }
        int can = !a->slots_only && v_can(a, offer + V_ADDR);
        empty = can && v_empty_worth(a);
        offer[V_CAN] = !can ? V_CANNOT : empty ? V_CAN_EMPTY : V_CAN_FULL;
        offer[V_PID] = atomic_load_explicit(&seg->ctl[seg->rank].pid, memory_order_relaxed);
    }
    size_t off = 0;
    for (int d = 0; d < p; d++) {
        size_t count = v_count(a, op->send_counts, d), n = v_window(a, count);
        hdr[d] = count;
        hdr[p + d] = v_count(a, op->recv_counts, d);
        /* This rank's own block goes straight to its output (v_read). */
        if (n > 0 && d != seg->rank && !empty)
            memcpy(parts + (size_t)d * a->chunk_elems * a->esz,
                   v_send_at(a, d, off) + a->done_elems * a->esz, n * a->esz);
        off += count;
    }
}

/* After the first chunk, where two or more are left: every rank's offer
 * says it can, so the rest of each block is read in place (this rank's own
 * first, as in v_read), then the op finishes as any read in place. */
int c10d__shm_a2a_all_can(const struct c10d__shm_coll *a)
{
    int p = a->seg->nranks;
    if (p > V_OFFER_MAX)
        return 0;
    for (int r = 0; r < p; r++)
        if (v_header(a->seg, r, a->gen)[2 * p + V_CAN] == V_CANNOT)
            return 0;
    return 1;
}

/* Rank j's parts of the first chunk are empty (only then: the offer is
 * written at the first chunk alone). */
static int v_empty(const struct c10d__shm_coll *a, int j)
{
    int p = a->seg->nranks;
    return a->done_elems == 0 && p <= V_OFFER_MAX &&
           v_header(a->seg, j, a->gen)[2 * p + V_CAN] == V_CAN_EMPTY;
}

int c10d__shm_a2a_any_empty(const struct c10d__shm_coll *a)
{
    for (int r = 0; r < a->seg->nranks; r++)
        if (v_empty(a, r))
            return 1;
    return 0;
}

int c10d__shm_a2a_read_rest(struct c10d__shm_coll *a)
{
    const struct c10d__shm_seg *seg = a->seg;
    const struct c10d__op *op = a->op;
    int p = seg->nranks;
    for (int pass = 0; pass < 2; pass++) {
        size_t off = 0;
        for (int j = 0; j < p; j++) {
            size_t count = v_count(a, op->recv_counts, j);
            int own = j == seg->rank;
            /* An empty first chunk: all of j's block is left. */
            size_t from = !own && v_empty(a, j) ? 0 : a->chunk_elems;
            if (count > from && own == (pass == 0)) {
                size_t at = from * a->esz;
                char *dst = v_recv_block(a, j, off) + at;
                size_t bytes = (count - from) * a->esz;
                const uint64_t *offer = v_header(seg, j, a->gen) + 2 * p;
                const char *mine = own ? v_send_block(a, j) + at : NULL;
                if (own && dst != mine)
                    memcpy(dst, mine, bytes);
                else if (!own)
                    C10D_CHECK(c10d__shm_in_place_copy(a, j, offer[V_PID],
                                                       offer[V_ADDR + seg->rank] + at, dst, bytes));
            }
            off += count;
        }
    }
    return 0;
}

/* The first chunk: every rank checks every pair (sender's count against the
 * receiver's), so a mismatch fails every rank alike, and learns how many
 * chunks the largest block needs. */
int c10d__shm_a2a_check(struct c10d__shm_coll *a)
{
    const struct c10d__shm_seg *seg = a->seg;
    int p = seg->nranks;
    size_t most = 0;
    for (int j = 0; j < p; j++) {
        const uint64_t *from = v_header(seg, j, a->gen);
        for (int r = 0; r < p; r++) {
            uint64_t sends = from[r], expects = v_header(seg, r, a->gen)[p + j];
            if (sends != expects)
                return c10d__fail(C10D_EINVAL,
                                  "shm ALLTOALL (seq %llu): rank %d sends %llu elements to rank "
                                  "%d, which expects %llu from it (split sizes differ between "
                                  "ranks)",
                                  (unsigned long long)a->op->seq, j, (unsigned long long)sends, r,
                                  (unsigned long long)expects);
            if (sends > most)
                most = (size_t)sends;
        }
    }
    a->block_elems = most;
    return 0;
}

void c10d__shm_a2a_read(struct c10d__shm_coll *a)
{
    const struct c10d__shm_seg *seg = a->seg;
    const struct c10d__op *op = a->op;
    int p = seg->nranks;
    size_t part = a->chunk_elems * a->esz, at = a->done_elems * a->esz;
    /* This rank's own block first, from its input: a peer's block written
     * before it could land on that input, where a receive block starts where
     * this rank's send block does (v_overlaps allows it). Whatever the own
     * block overwrites was sent into the slot by this chunk's v_write. */
    for (int pass = 0; pass < 2; pass++) {
        size_t off = 0;
        for (int j = 0; j < p; j++) {
            size_t count = v_count(a, op->recv_counts, j), n = v_window(a, count);
            int own = j == seg->rank;
            if (n > 0 && own == (pass == 0) && (own || !v_empty(a, j))) {
                char *dst = v_recv_block(a, j, off) + at;
                const char *src = own ? v_send_block(a, j) + at
                                      : (const char *)v_header(seg, j, a->gen) + v_header_bytes(p) +
                                            (size_t)seg->rank * part;
                if (dst != src) /* the same address: an in-place op's own block */
                    memcpy(dst, src, n * a->esz);
            }
            off += count;
        }
    }
}

size_t c10d__shm_a2a_empty_likely(const struct c10d__op *op, const struct c10d__shm_seg *seg)
{
    int p = seg->nranks;
    size_t esz = c10d_dtype_size(op->dtype), total = 0;
    int big = 0;
    if (atomic_load_explicit(&seg->read_peers, memory_order_relaxed) != 1 || seg->crowded ||
        p > V_OFFER_MAX)
        return 0;
    for (int d = 0; d < p; d++) {
        size_t bytes = v_count_of(op, p, op->send_counts, d) * esz;
        big |= d != seg->rank && bytes >= C10D_SHM_A2A_EMPTY_MIN;
        total += bytes;
    }
    /* The overlap's look (every pair) only for an op that could read. */
    return big && !v_overlaps(op, p, esz, 1) ? total : 0;
}

int c10d__shm_a2a_own_fit(const struct c10d__op *op, size_t slot_bytes, int nranks)
{
    size_t esz = c10d_dtype_size(op->dtype),
           part = c10d__shm_a2a_part_elems(slot_bytes, nranks, esz);
    for (int j = 0; j < nranks; j++)
        if (v_count_of(op, nranks, op->send_counts, j) > part ||
            v_count_of(op, nranks, op->recv_counts, j) > part)
            return 0;
    return !v_overlaps(op, nranks, esz, 0);
}
