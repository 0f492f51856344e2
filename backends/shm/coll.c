/* Collectives through the shared segment (coll.h). Memory order: a rank
 * writes its slot and stamp, then stores `arrive` with release; a reader
 * loads `arrive` with acquire before it reads that slot, so it sees the
 * data. `reduced` orders the reduced slice the same way. Reusing a slot two
 * chunks later waits until every peer's `arrive` (acquire) shows it moved
 * past the chunk in between, which it only does after its last read of the
 * slot. */
#include "coll.h"

#include "all_to_all.h"
#include "in_place.h"

#include "engine/error.h"
#include "engine/kernels/reduce.h"

#include <string.h>

/* PH_GATHER_IN_PLACE (an all_reduce's second read), PH_RELEASE and
 * PH_FINISH: an op read in place (in_place.h). */
enum { PH_WRITE, PH_REDUCE, PH_GATHER, PH_GATHER_IN_PLACE, PH_RELEASE, PH_FINISH, PH_DONE };

/* Kinds whose slot holds a part of every rank's block: this rank's part for
 * rank j at j x (chunk elements). */
static int spread(enum c10d__op_kind kind)
{
    return kind == C10D_OP_REDUCE_SCATTER || kind == C10D_OP_SCATTER;
}

/* all_to_all, in every form (all_to_all.h). */
static int counted(const struct c10d__op *op)
{
    return op->kind == C10D_OP_ALL_TO_ALL;
}

int c10d__shm_coll_supports(const struct c10d__op *op, size_t slot_bytes, int nranks)
{
    if (counted(op))
        return c10d__shm_a2a_part_elems(slot_bytes, nranks, c10d_dtype_size(op->dtype)) > 0;
    switch (op->kind) {
    case C10D_OP_REDUCE_SCATTER:
    case C10D_OP_SCATTER: /* a chunk holds one element of every block at least */
        return slot_bytes / ((size_t)nranks * c10d_dtype_size(op->dtype)) > 0;
    case C10D_OP_ALL_REDUCE:
    case C10D_OP_REDUCE:
    case C10D_OP_BROADCAST:
    case C10D_OP_BARRIER:
    case C10D_OP_ALL_GATHER:
    case C10D_OP_GATHER:
        return 1;
    default:
        return 0;
    }
}

/* Elements of a (non-counted) op's chunk in slots of slot_bytes. */
static size_t chunk_elems_of(const struct c10d__op *op, size_t esz, size_t slot_bytes, int nranks)
{
    size_t n = slot_bytes / esz;
    return spread(op->kind) ? n / (size_t)nranks : n;
}

/* The default of a->live: the op's work is not completed. */
static int work_live(void *work)
{
    return work == NULL || c10d_work_test(work) == 0;
}

void c10d__shm_coll_start(struct c10d__shm_coll *a, struct c10d__shm_seg *seg,
                          const struct c10d__op *op, uint32_t member, const struct c10d__fp *fp)
{
    memset(a, 0, sizeof *a);
    a->seg = seg;
    a->op = op;
    a->member = member;
    a->fp = *fp;
    a->live = work_live;
    a->live_arg = op->work;
    a->esz = op->kind == C10D_OP_BARRIER ? 1 : c10d_dtype_size(op->dtype);
    a->chunk_elems = chunk_elems_of(op, a->esz, seg->slot_bytes, seg->nranks);
    a->block_elems = op->count;
    /* all_to_all learns its length (the largest count of any pair) from the
     * first chunk's headers, so every rank runs that chunk. */
    a->counted = counted(op);
    if (a->counted) {
        a->chunk_elems = c10d__shm_a2a_part_elems(seg->slot_bytes, seg->nranks, a->esz);
        a->block_elems = 1;
    }
    /* A barrier is one chunk of nothing; another op of nothing is done. */
    a->phase = a->block_elems == 0 && op->kind != C10D_OP_BARRIER ? PH_DONE : PH_WRITE;
    if (a->phase == PH_WRITE)
        a->gen = ++seg->gen;
    a->offering = a->phase == PH_WRITE && c10d__shm_in_place_offers(op, seg);
    if (op->kind == C10D_OP_ALL_REDUCE && a->phase == PH_WRITE &&
        a->block_elems <= a->chunk_elems &&
        c10d__shm_small_chunk(a->block_elems * a->esz, seg->nranks, 1)) {
        a->small = 1;
        a->kernel = c10d__reduce_kernel(op->dtype, op->redop, &a->per);
    }
}

/* Every rank's `arrive` (or, by `which`, `reduced` or `released`) has
 * reached `gen`. */
enum { AT_ARRIVE, AT_REDUCED, AT_RELEASED };

static int all_at(const struct c10d__shm_seg *seg, int which, uint64_t gen)
{
    for (int r = 0; r < seg->nranks; r++) {
        const _Atomic uint64_t *c = which == AT_REDUCED    ? &seg->ctl[r].reduced
                                    : which == AT_RELEASED ? &seg->ctl[r].released
                                                           : &seg->ctl[r].arrive;
        if (atomic_load_explicit(c, memory_order_acquire) < gen)
            return 0;
    }
    return 1;
}

/* While waiting for peers: one that announced this very collective with
 * another fingerprint runs something else (on tcp, say), and will never
 * come. */
static int check_waited(const struct c10d__shm_coll *a)
{
    const struct c10d__shm_seg *seg = a->seg;
    struct c10d__fp theirs;
    for (int r = 0; r < seg->nranks; r++) {
        if (r == seg->rank ||
            !c10d__shm_peer_differs(seg, r, a->op->seq, a->member, &a->fp, &theirs))
            continue;
        char msg[768];
        c10d__fp_mismatch_message(msg, sizeof msg, a->op->seq, a->member, seg->rank, &a->fp, r,
                                  &theirs);
        return c10d__fail(C10D_EINVAL, "%s", msg);
    }
    return 0;
}

/* A wait that found a peer behind. Looking at its announcement on every
 * such call would read the line that peer is about to write, on each turn
 * of a spinning waiter, and slow the very peer it waits for: where the
 * caller polls tightly (look_every > 1), look at every look_every-th. */
static int waited(struct c10d__shm_coll *a)
{
    if (a->look_every > 1 && ++a->waits % a->look_every != 0)
        return 0;
    return check_waited(a);
}

static int check_stamps(struct c10d__shm_coll *a)
{
    const struct c10d__shm_seg *seg = a->seg;
    for (int r = 0; r < seg->nranks; r++) {
        const struct c10d__shm_stamp *st = &seg->ctl[r].stamp[a->gen & 1];
        if (st->gen == a->gen && st->seq == a->op->seq && c10d__fp_equal(&st->fp, &a->fp))
            continue;
        char msg[768];
        if (st->gen != a->gen || st->seq != a->op->seq)
            snprintf(msg, sizeof msg,
                     "shm %s (seq %llu): rank %d is at another collective (seq %llu, "
                     "chunk %llu; this rank: chunk %llu)",
                     c10d__op_kind_name(a->op->kind), (unsigned long long)a->op->seq, r,
                     (unsigned long long)st->seq, (unsigned long long)st->gen,
                     (unsigned long long)a->gen);
        else
            c10d__fp_mismatch_message(msg, sizeof msg, a->op->seq, 0, seg->rank, &a->fp, r,
                                      &st->fp);
        return c10d__fail(C10D_EINVAL, "%s", msg);
    }
    return 0;
}

static size_t chunk_count(const struct c10d__shm_coll *a)
{
    size_t left = a->block_elems - a->done_elems;
    return left < a->chunk_elems ? left : a->chunk_elems;
}

/* A gather's root copies its own block from its input to its output
 * directly, and puts nothing in its slot (nobody reads it): one copy of
 * that block instead of two. Not where the input overlaps the output
 * elsewhere than its own block (the chunks before would overwrite what a
 * later chunk reads). */
static int gather_root_direct(const struct c10d__shm_coll *a)
{
    const struct c10d__op *op = a->op;
    if (op->kind != C10D_OP_GATHER || a->seg->rank != op->root)
        return 0;
    const char *in = op->send, *out = op->recv;
    size_t block = a->block_elems * a->esz, all = block * (size_t)a->seg->nranks;
    return in == out + (size_t)op->root * block || in + block <= out || out + all <= in;
}

/* What this rank contributes to the chunk, by kind. */
static const char *source_of(const struct c10d__shm_coll *a)
{
    const struct c10d__op *op = a->op;
    switch (op->kind) {
    case C10D_OP_GATHER:
        return gather_root_direct(a) ? NULL : op->send;
    case C10D_OP_BROADCAST: /* the root's data: its send buffer, or in place */
        if (a->seg->rank != op->root)
            return NULL;
        return op->send != NULL ? op->send : op->recv;
    case C10D_OP_BARRIER:
        return NULL;
    default:
        return op->send;
    }
}

/* ---------------------------------------------------------- chunks */

/* An all_reduce chunk too large for every rank to reduce whole: rank r
 * reduces slice r for everyone. */
static int sliced(const struct c10d__shm_coll *a)
{
    return a->op->kind == C10D_OP_ALL_REDUCE &&
           !c10d__shm_small_chunk(chunk_count(a) * a->esz, a->seg->nranks,
                                  a->block_elems <= a->chunk_elems);
}

static void slice_of(const struct c10d__shm_coll *a, int r, size_t *lo, size_t *cnt)
{
    c10d__shm_slice(chunk_count(a), a->seg->nranks, r, lo, cnt);
}

/* dst = src (n elements), premultiplied for PREMUL_SUM: a rank's own
 * contribution to a reduction as the others will read it. */
static int copy_scaled(const struct c10d__shm_coll *a, char *dst, const char *src, size_t n)
{
    const struct c10d__op *op = a->op;
    if (n == 0)
        return 0;
    if (dst != src)
        memcpy(dst, src, n * a->esz);
    if (op->redop == C10D_PREMUL_SUM &&
        (op->kind == C10D_OP_ALL_REDUCE || op->kind == C10D_OP_REDUCE))
        return c10d__reduce_premul(dst, n, op->dtype, op->premul_factor);
    return 0;
}

/* This rank's slot of the chunk is written: its stamp, then `arrive` with
 * release, after which the peers may read both. */
static void publish(struct c10d__shm_coll *a)
{
    struct c10d__shm_seg *seg = a->seg;
    struct c10d__shm_stamp *st = &seg->ctl[seg->rank].stamp[a->gen & 1];
    st->gen = a->gen;
    st->seq = a->op->seq;
    st->fp = a->fp;
    atomic_store_explicit(&seg->ctl[seg->rank].arrive, a->gen, memory_order_release);
}

static int write_slot(struct c10d__shm_coll *a)
{
    struct c10d__shm_seg *seg = a->seg;
    const struct c10d__op *op = a->op;
    size_t n = chunk_count(a);
    char *slot = c10d__shm_slot(seg, seg->rank, a->gen);
    if (a->counted) {
        c10d__shm_a2a_write(a);
        n = 0;
    }
    int spreads = spread(op->kind) && (op->kind != C10D_OP_SCATTER || seg->rank == op->root);
    for (int j = 0; spreads && j < seg->nranks && n > 0; j++) {
        const char *block = op->sends != NULL
                                ? op->sends[j]
                                : (const char *)op->send + (size_t)j * a->block_elems * a->esz;
        memcpy(slot + (size_t)j * n * a->esz, block + a->done_elems * a->esz, n * a->esz);
    }
    if (op->kind == C10D_OP_REDUCE_SCATTER && op->redop == C10D_PREMUL_SUM && n > 0)
        C10D_CHECK(
            c10d__reduce_premul(slot, n * (size_t)seg->nranks, op->dtype, op->premul_factor));
    const char *src = spread(op->kind) ? NULL : source_of(a);
    if (src != NULL && n > 0) {
        /* A sliced chunk's own slice is read by nobody but this rank, which
         * takes it from its input when it reduces: copy the rest. */
        size_t lo = 0, cnt = 0;
        if (sliced(a))
            slice_of(a, seg->rank, &lo, &cnt);
        src += a->done_elems * a->esz;
        C10D_CHECK(copy_scaled(a, slot, src, lo));
        C10D_CHECK(
            copy_scaled(a, slot + (lo + cnt) * a->esz, src + (lo + cnt) * a->esz, n - lo - cnt));
    }
    publish(a);
    return 0;
}

/* out = slot 0 op slot 1 op ... in rank order, each slot read from byte `at`
 * of the chunk (small all_reduce chunks and reduce's root: 0; reduce_scatter:
 * this rank's block). */
static int reduce_all(struct c10d__shm_coll *a, size_t at)
{
    const struct c10d__shm_seg *seg = a->seg;
    const struct c10d__op *op = a->op;
    size_t n = chunk_count(a);
    char *out = (char *)op->recv + a->done_elems * a->esz;
    memcpy(out, c10d__shm_slot(seg, 0, a->gen) + at, n * a->esz);
    /* The op passed the group's checks, and `out` is the caller's own
     * buffer, apart from the segment. */
    for (int r = 1; r < seg->nranks; r++)
        c10d__reduce_checked(out, c10d__shm_slot(seg, r, a->gen) + at, n, op->dtype, op->redop);
    return op->redop == C10D_AVG ? c10d__reduce_finish(out, n, op->dtype, op->redop, seg->nranks)
                                 : 0;
}

/* Everything but all_reduce's large chunks, once every slot is written: 0,
 * 1 where an all_to_all runs again through the slots (from a new chunk),
 * or < 0. */
static int read_chunk(struct c10d__shm_coll *a)
{
    const struct c10d__shm_seg *seg = a->seg;
    const struct c10d__op *op = a->op;
    size_t n = chunk_count(a), off = a->done_elems * a->esz;
    size_t mine = (size_t)seg->rank * n * a->esz; /* this rank's part of a spread slot */
    if (a->counted) {
        if (a->done_elems == 0) {
            C10D_CHECK(c10d__shm_a2a_check(a));
            int all_can = c10d__shm_a2a_all_can(a), empty = c10d__shm_a2a_any_empty(a);
            if (empty && !all_can) { /* every rank reads the same headers */
                a->slots_only = 1;
                a->gen = ++a->seg->gen;
                a->phase = PH_WRITE;
                return 1;
            }
            /* Two chunks or more left: a second chunk alone is cheaper
             * through the slot than the reads' two rounds (2 ranks, 256
             * KiB: 29-32 us against 33-35). */
            a->rest_in_place = all_can && (empty || a->block_elems > 2 * a->chunk_elems);
        }
        c10d__shm_a2a_read(a);
        return a->rest_in_place ? c10d__shm_a2a_read_rest(a) : 0;
    }
    switch (op->kind) {
    case C10D_OP_ALL_REDUCE:
        return reduce_all(a, 0);
    case C10D_OP_REDUCE:
        return seg->rank == op->root ? reduce_all(a, 0) : 0;
    case C10D_OP_BROADCAST:
        if (op->recv != NULL && (seg->rank != op->root || op->recv != op->send))
            memcpy((char *)op->recv + off, c10d__shm_slot(seg, op->root, a->gen), n * a->esz);
        return 0;
    case C10D_OP_REDUCE_SCATTER: /* each slot holds this chunk of every block */
        return reduce_all(a, (size_t)seg->rank * n * a->esz);
    case C10D_OP_SCATTER:
        memcpy((char *)op->recv + off, c10d__shm_slot(seg, op->root, a->gen) + mine, n * a->esz);
        return 0;
    case C10D_OP_GATHER:
        if (seg->rank != op->root)
            return 0;
        for (int r = 0; r < seg->nranks; r++) {
            const char *from = c10d__shm_slot(seg, r, a->gen);
            if (r == seg->rank && gather_root_direct(a))
                from = (const char *)op->send + off;
            char *to = c10d__shm_coll_block(a, r) + off;
            if (to != from)
                memcpy(to, from, n * a->esz);
        }
        return 0;
    case C10D_OP_ALL_GATHER:
        for (int r = 0; r < seg->nranks; r++)
            memcpy(c10d__shm_coll_block(a, r) + off, c10d__shm_slot(seg, r, a->gen), n * a->esz);
        return 0;
    default: /* barrier */
        return 0;
    }
}

/* Bytes of a slice reduced at a time: the block of the output stays in L1
 * from its first operand to its copy into the slot. */
#define SLICE_BLOCK (8 * 1024)

/* Large chunks: this rank's slice, its own input (premultiplied) then every
 * peer's slot in rank order, reduced straight into its output and copied
 * into its own slot for the peers. Block by block, so each byte of the
 * result is written to memory twice and read from it never: the output
 * and the slot, where reducing in the slot and copying it out read it
 * again. */
static int reduce_slice(struct c10d__shm_coll *a)
{
    struct c10d__shm_seg *seg = a->seg;
    const struct c10d__op *op = a->op;
    size_t lo, cnt;
    slice_of(a, seg->rank, &lo, &cnt);
    size_t at = (a->done_elems + lo) * a->esz, step = SLICE_BLOCK / a->esz;
    char *out = (char *)op->recv + at;
    const char *in = (const char *)op->send + at;
    char *mine = c10d__shm_slot(seg, seg->rank, a->gen) + lo * a->esz;
    for (size_t i = 0; i < cnt; i += step) {
        size_t m = cnt - i < step ? cnt - i : step, off = i * a->esz;
        C10D_CHECK(copy_scaled(a, out + off, in + off, m));
        for (int r = 0; r < seg->nranks; r++)
            if (r != seg->rank)
                C10D_CHECK(c10d__reduce(out + off,
                                        c10d__shm_slot(seg, r, a->gen) + lo * a->esz + off, m,
                                        op->dtype, op->redop));
        C10D_CHECK(c10d__reduce_finish(out + off, m, op->dtype, op->redop, seg->nranks));
        memcpy(mine + off, out + off, m * a->esz);
    }
    atomic_store_explicit(&seg->ctl[seg->rank].reduced, a->gen, memory_order_release);
    return 0;
}

/* The peers' reduced slices; this rank's own is in its output already. */
static void gather_slices(struct c10d__shm_coll *a)
{
    const struct c10d__shm_seg *seg = a->seg;
    char *out = (char *)a->op->recv + a->done_elems * a->esz;
    for (int r = 0; r < seg->nranks; r++) {
        size_t lo, cnt;
        if (r == seg->rank)
            continue;
        slice_of(a, r, &lo, &cnt);
        memcpy(out + lo * a->esz, c10d__shm_slot(seg, r, a->gen) + lo * a->esz, cnt * a->esz);
    }
}

static void next_chunk(struct c10d__shm_coll *a)
{
    a->done_elems += chunk_count(a);
    if (a->done_elems == a->block_elems) {
        a->phase = PH_DONE;
        return;
    }
    a->gen = ++a->seg->gen;
    a->phase = PH_WRITE;
}

/* write_slot, read_chunk and next_chunk for a small all_reduce (a->small),
 * without their cases for every other kind. */
static int small_write(struct c10d__shm_coll *a)
{
    struct c10d__shm_seg *seg = a->seg;
    const struct c10d__op *op = a->op;
    C10D_CHECK(copy_scaled(a, c10d__shm_slot(seg, seg->rank, a->gen), op->send, a->block_elems));
    publish(a);
    return 0;
}

static int small_reduce(struct c10d__shm_coll *a)
{
    const struct c10d__shm_seg *seg = a->seg;
    const struct c10d__op *op = a->op;
    size_t n = a->block_elems;
    if (a->kernel == NULL)
        C10D_CHECK(reduce_all(a, 0));
    else {
        unsigned char *out = op->recv;
        memcpy(out, c10d__shm_slot(seg, 0, a->gen), n * a->esz);
        for (int r = 1; r < seg->nranks; r++)
            a->kernel(out, (const unsigned char *)c10d__shm_slot(seg, r, a->gen), n * a->per);
        if (op->redop == C10D_AVG)
            C10D_CHECK(c10d__reduce_finish(out, n, op->dtype, op->redop, seg->nranks));
    }
    a->done_elems = n;
    a->phase = PH_DONE;
    return 0;
}

static int small_progress(struct c10d__shm_coll *a, int *moved)
{
    struct c10d__shm_seg *seg = a->seg;
    *moved = 0;
    if (a->phase == PH_WRITE) {
        if (!all_at(seg, AT_ARRIVE, a->gen - 1))
            return waited(a);
        C10D_CHECK(small_write(a));
        a->phase = PH_REDUCE;
        *moved = 1;
    }
    if (a->phase == PH_REDUCE) {
        if (!all_at(seg, AT_ARRIVE, a->gen))
            return waited(a);
        C10D_CHECK(check_stamps(a));
        *moved = 1;
        C10D_CHECK(small_reduce(a));
    }
    return 1;
}

int c10d__shm_coll_progress(struct c10d__shm_coll *a, int *moved)
{
    struct c10d__shm_seg *seg = a->seg;
    if (a->small)
        return small_progress(a, moved);
    *moved = 0;
    for (;;) {
        switch (a->phase) {
        case PH_WRITE:
            /* Our slot for this chunk was last read two chunks ago. */
            if (!all_at(seg, AT_ARRIVE, a->gen - 1))
                return waited(a);
            if (a->offering) {
                c10d__shm_in_place_offer(a);
                publish(a);
            } else {
                C10D_CHECK(write_slot(a));
            }
            a->phase = PH_REDUCE;
            *moved = 1;
            break;
        case PH_REDUCE:
            if (!all_at(seg, AT_ARRIVE, a->gen))
                return waited(a);
            C10D_CHECK(check_stamps(a));
            *moved = 1;
            if (a->offering) {
                if (!c10d__shm_in_place_agreed(a)) { /* through the slots from the next chunk */
                    a->offering = 0;
                    a->gen = ++seg->gen;
                    a->phase = PH_WRITE;
                    break;
                }
                /* A failed read leaves the op here: run again (the lane
                 * hands a failure to the loop, which runs it to its end),
                 * it reads again or fails again, never reads the offer as
                 * data. Not an all_reduce, whose read adds into its
                 * output: it never runs in the lane (in_place.h). */
                C10D_CHECK(c10d__shm_in_place_read(a));
                a->offering = 0;
                atomic_store_explicit(&seg->ctl[seg->rank].reduced, a->gen, memory_order_release);
                a->phase = a->op->kind == C10D_OP_ALL_REDUCE ? PH_GATHER_IN_PLACE : PH_RELEASE;
            } else if (!sliced(a)) {
                int again = read_chunk(a);
                if (again < 0)
                    return again;
                if (again > 0) /* all_to_all: through the slots from the start */
                    break;
                if (a->rest_in_place) { /* all_to_all: the rest was read in place */
                    atomic_store_explicit(&seg->ctl[seg->rank].reduced, a->gen,
                                          memory_order_release);
                    a->phase = PH_RELEASE;
                } else {
                    next_chunk(a);
                }
            } else {
                C10D_CHECK(reduce_slice(a));
                a->phase = PH_GATHER;
            }
            break;
        case PH_GATHER:
            if (!all_at(seg, AT_REDUCED, a->gen))
                return waited(a);
            gather_slices(a);
            *moved = 1;
            next_chunk(a);
            break;
        case PH_GATHER_IN_PLACE: /* an all_reduce's slices, reduced in place */
            if (!all_at(seg, AT_REDUCED, a->gen))
                return waited(a);
            C10D_CHECK(c10d__shm_in_place_gather(a));
            /* Its second chunk: arrived (for the next op's first chunk,
             * which waits for it) and read. */
            a->gen = ++seg->gen;
            publish(a);
            atomic_store_explicit(&seg->ctl[seg->rank].reduced, a->gen, memory_order_release);
            a->phase = PH_RELEASE;
            *moved = 1;
            break;
        case PH_RELEASE: /* every peer read what it needed from this rank */
            if (!all_at(seg, AT_REDUCED, a->gen))
                return waited(a);
            /* Ended meanwhile (its deadline): it never releases its peers,
             * and the group's failure, with the work's own words, ends it. */
            if (a->live != NULL && !a->live(a->live_arg))
                return 0;
            atomic_store_explicit(&seg->ctl[seg->rank].released, a->gen, memory_order_release);
            a->phase = PH_FINISH;
            *moved = 1;
            break;
        case PH_FINISH: /* every buffer this rank read was still its op's after the read */
            if (!all_at(seg, AT_RELEASED, a->gen))
                return waited(a);
            a->phase = PH_DONE;
            a->done_elems = a->block_elems;
            *moved = 1;
            break;
        default:
            return 1;
        }
    }
}

int c10d__shm_coll_one_chunk(const struct c10d__op *op, size_t slot_bytes, int nranks)
{
    size_t esz = c10d_dtype_size(op->dtype);
    if (op->kind == C10D_OP_ALL_REDUCE) /* the common case, supported whole */
        return op->count <= slot_bytes / esz && c10d__shm_small_chunk(op->count * esz, nranks, 1);
    if (counted(op) || !c10d__shm_coll_supports(op, slot_bytes, nranks))
        return 0;
    if (op->kind == C10D_OP_BARRIER)
        return 1;
    if (op->count > chunk_elems_of(op, esz, slot_bytes, nranks))
        return 0;
    return op->kind != C10D_OP_ALL_REDUCE || c10d__shm_small_chunk(op->count * esz, nranks, 1);
}

int c10d__shm_coll_one_chunk_here(const struct c10d__op *op, size_t slot_bytes, int nranks)
{
    return counted(op) && c10d__shm_coll_supports(op, slot_bytes, nranks) &&
           c10d__shm_a2a_own_fit(op, slot_bytes, nranks);
}

int c10d__shm_coll_arrived(const struct c10d__shm_coll *a)
{
    return a->phase != PH_WRITE;
}

int c10d__shm_coll_done(const struct c10d__shm_coll *a)
{
    return a->phase == PH_DONE;
}
