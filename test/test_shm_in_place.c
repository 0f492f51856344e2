/* Large broadcast, all_gather, scatter, all_reduce and all_to_all read in place
 * (backends/shm/in_place.h):
 * three ranks' segments driven in this process (so process_vm_readv reads
 * this very process), then real ranks through the public API. Covers the
 * read, the fall back through the slots when one rank cannot read this once
 * (a peer not attached yet) or ever (then no op offers again), and a rank
 * whose op ended while its peers read: it never lets them go. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "backends/shm/all_to_all.h"
#include "backends/shm/coll.h"
#include "backends/shm/in_place.h"
#include "backends/tcp/lane.h"
#include "c10d.h"
#include "mp_harness.h"

#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

enum { NR = 3, SLOT = 4096 };

static void make3_slots(struct c10d__shm_seg *seg[NR], size_t slot)
{
    char ref[C10D_SHM_REF_MAX];
    assert_int_equal(c10d__shm_create(NR, slot, &seg[0], ref, sizeof ref), 0);
    for (int r = 1; r < NR; r++)
        assert_int_equal(c10d__shm_attach(ref, NR, r, &seg[r]), 0);
    /* Three "ranks" polled by one thread: none waits for a CPU. */
    for (int r = 0; r < NR; r++)
        seg[r]->crowded = 0;
}

static void make3(struct c10d__shm_seg *seg[NR])
{
    make3_slots(seg, SLOT);
}

static void free3(struct c10d__shm_seg *seg[NR])
{
    for (int r = NR - 1; r >= 0; r--)
        c10d__shm_free(seg[r]);
}

static int never_live(void *arg)
{
    (void)arg;
    return 0;
}

/* Runs op[r] on seg[r] until every rank is done (or `polls` run out);
 * rank `dead` (-1: none) says its op ended before it lets its peers go. */
static void drive(struct c10d__shm_seg *seg[NR], struct c10d__op op[NR], int dead, int polls,
                  int rc[NR])
{
    struct c10d__fp fp;
    c10d__fp_of(&op[0], NR, &fp);
    struct c10d__shm_coll x[NR];
    for (int r = 0; r < NR; r++) {
        c10d__shm_coll_start(&x[r], seg[r], &op[r], 0, &fp);
        if (r == dead)
            x[r].live = never_live;
    }
    int moved;
    for (int r = 0; r < NR; r++)
        rc[r] = 0;
    for (int i = 0; i < polls; i++)
        for (int r = NR - 1; r >= 0; r--)
            if (rc[r] == 0)
                rc[r] = c10d__shm_coll_progress(&x[r], &moved);
}

/* Runs op[r] on seg[r] to its end on every rank. */
static void drive_done(struct c10d__shm_seg *seg[NR], struct c10d__op op[NR])
{
    int rc[NR];
    drive(seg, op, -1, 1000000, rc);
    for (int r = 0; r < NR; r++)
        assert_int_equal(rc[r], 1);
}

enum {
    BC = 60000,
    AG = 18000,
    SC = 33000
}; /* 240 KB broadcast, 3 x 72 KB all_gather,
      3 x 132 KB scatter */
static float bc[NR][BC], ag_in[NR][AG], ag_out[NR][NR * AG], sc_in[NR * SC], sc_out[NR][SC];

static void broadcast(struct c10d__shm_seg *seg[NR], int root, uint64_t seq)
{
    struct c10d__op op[NR];
    for (int r = 0; r < NR; r++) {
        for (int i = 0; i < BC; i++)
            bc[r][i] = r == root ? (float)(seq * 7 + (uint64_t)i) : -1.0f;
        op[r] = (struct c10d__op){.kind = C10D_OP_BROADCAST,
                                  .send = bc[r],
                                  .recv = bc[r],
                                  .count = BC,
                                  .dtype = C10D_FLOAT32,
                                  .root = root,
                                  .seq = seq};
    }
    drive_done(seg, op);
    for (int r = 0; r < NR; r++) {
        for (int i = 0; i < BC; i++)
            assert_true(bc[r][i] == (float)(seq * 7 + (uint64_t)i));
    }
}

/* in_place_rank: that rank's send is its own block of its output. */
static void all_gather(struct c10d__shm_seg *seg[NR], int in_place_rank, uint64_t seq)
{
    struct c10d__op op[NR];
    for (int r = 0; r < NR; r++) {
        memset(ag_out[r], 0, sizeof ag_out[r]);
        float *src = r == in_place_rank ? ag_out[r] + (size_t)r * AG : ag_in[r];
        for (int i = 0; i < AG; i++)
            src[i] = (float)(r * 100000 + i) + (float)seq;
        op[r] = (struct c10d__op){.kind = C10D_OP_ALL_GATHER,
                                  .send = src,
                                  .recv = ag_out[r],
                                  .count = AG,
                                  .dtype = C10D_FLOAT32,
                                  .seq = seq};
    }
    drive_done(seg, op);
    for (int r = 0; r < NR; r++) {
        for (int j = 0; j < NR; j++)
            for (int i = 0; i < AG; i++)
                assert_true(ag_out[r][(size_t)j * AG + (size_t)i] ==
                            (float)(j * 100000 + i) + (float)seq);
    }
}

/* in_place: the root's output is its own block of its input. */
static void scatter(struct c10d__shm_seg *seg[NR], int root, int in_place, uint64_t seq)
{
    struct c10d__op op[NR];
    for (size_t i = 0; i < NR * SC; i++)
        sc_in[i] = (float)(seq * 3 + i);
    for (int r = 0; r < NR; r++) {
        memset(sc_out[r], 0, sizeof sc_out[r]);
        op[r] =
            (struct c10d__op){.kind = C10D_OP_SCATTER,
                              .send = r == root ? sc_in : NULL,
                              .recv = r == root && in_place ? sc_in + (size_t)r * SC : sc_out[r],
                              .count = SC,
                              .dtype = C10D_FLOAT32,
                              .root = root,
                              .seq = seq};
    }
    drive_done(seg, op);
    for (int r = 0; r < NR; r++) {
        const float *got = op[r].recv;
        for (size_t i = 0; i < SC; i++)
            assert_true(got[i] == (float)(seq * 3 + (size_t)r * SC + i));
    }
}

static void test_read_in_place(void **st)
{
    (void)st;
    struct c10d__shm_seg *seg[NR];
    make3(seg);
    uint64_t b0 = c10d__shm_in_place_bytes();
    broadcast(seg, 1, 1);
    uint64_t b1 = c10d__shm_in_place_bytes();
    assert_int_equal(b1 - b0, 2u * BC * sizeof(float)); /* the two non-roots */
    all_gather(seg, -1, 2);
    all_gather(seg, 2, 3);
    scatter(seg, 2, 0, 4);
    scatter(seg, 0, 1, 5);
    uint64_t b2 = c10d__shm_in_place_bytes();
    assert_int_equal(b2 - b1, 2u * NR * (NR - 1) * AG * sizeof(float) +
                                  2u * (NR - 1) * SC * sizeof(float)); /* every non-root */
    /* Below the size, through the slots as before. */
    struct c10d__op op[NR];
    static float small[NR][64];
    for (int r = 0; r < NR; r++)
        op[r] = (struct c10d__op){.kind = C10D_OP_BROADCAST,
                                  .send = small[r],
                                  .recv = small[r],
                                  .count = 64,
                                  .dtype = C10D_FLOAT32,
                                  .root = 0,
                                  .seq = 6};
    int rc[NR];
    drive(seg, op, -1, 100000, rc);
    assert_true(rc[0] == 1 && rc[1] == 1 && rc[2] == 1);
    assert_int_equal(c10d__shm_in_place_bytes(), b2);
    free3(seg);
}

/* A rank whose peer has not published its pid yet offers "not now": the op
 * runs through the slots, and the next one reads in place again. */
static void test_not_now_then_in_place(void **st)
{
    (void)st;
    struct c10d__shm_seg *seg[NR];
    make3(seg);
    uint64_t pid = atomic_exchange(&seg[0]->ctl[2].pid, 0);
    uint64_t b0 = c10d__shm_in_place_bytes();
    broadcast(seg, 0, 1);
    assert_int_equal(c10d__shm_in_place_bytes(), b0); /* rank 0 could not probe rank 2 */
    atomic_store(&seg[0]->ctl[2].pid, pid);
    for (int r = 0; r < NR; r++)
        assert_int_equal(atomic_load(&seg[r]->no_offers), 0);
    broadcast(seg, 2, 2);
    assert_int_equal(c10d__shm_in_place_bytes() - b0, 2u * BC * sizeof(float));
    free3(seg);
}

/* One rank that can never read: every rank runs that op through the slots
 * and no later op offers (no extra round any more). */
static void test_never_stops_offers(void **st)
{
    (void)st;
    struct c10d__shm_seg *seg[NR];
    make3(seg);
    seg[1]->read_peers = 2;
    uint64_t b0 = c10d__shm_in_place_bytes();
    all_gather(seg, -1, 1);
    for (int r = 0; r < NR; r++)
        assert_int_equal(atomic_load(&seg[r]->no_offers), 1);
    uint64_t gen = seg[0]->gen;
    broadcast(seg, 2, 2);
    /* 240 KB in 4 KiB slots: 59 chunks, and no offer before them. */
    assert_int_equal(seg[0]->gen - gen, (BC * sizeof(float) + SLOT - 1) / SLOT);
    assert_int_equal(c10d__shm_in_place_bytes(), b0);
    free3(seg);
}

/* A rank whose op ended (its deadline) while its peers read its buffer never
 * releases them: they do not complete with bytes read from a buffer its
 * owner may have reused. Nobody fails here: the group's failure (the
 * deadline fails it) ends them all. */
static void test_ended_op_holds_readers(void **st)
{
    (void)st;
    struct c10d__shm_seg *seg[NR];
    make3(seg);
    struct c10d__op op[NR];
    for (int r = 0; r < NR; r++)
        op[r] = (struct c10d__op){.kind = C10D_OP_BROADCAST,
                                  .send = bc[r],
                                  .recv = bc[r],
                                  .count = BC,
                                  .dtype = C10D_FLOAT32,
                                  .root = 0,
                                  .seq = 1};
    int rc[NR];
    drive(seg, op, 0, 20000, rc);
    for (int r = 0; r < NR; r++)
        assert_int_equal(rc[r], 0);
    /* Its peers read and are past `reduced`; rank 0 never released. */
    for (int r = 0; r < NR; r++)
        assert_int_equal(atomic_load(&seg[r]->ctl[r].reduced), seg[r]->gen);
    assert_true(atomic_load(&seg[0]->ctl[0].released) < seg[0]->gen);
    free3(seg);
}

/* A read in place that failed (here: a wrong pid in the root's offer) fails
 * again when the op runs again, as the loop runs it after the caller's lane
 * handed it over, and never takes the offer for data; with the offer right
 * again, the same op reads and completes. */
static void test_failed_read_runs_again(void **st)
{
    (void)st;
    struct c10d__shm_seg *seg[NR];
    make3(seg);
    struct c10d__op op[NR];
    for (int r = 0; r < NR; r++) {
        for (int i = 0; i < BC; i++)
            bc[r][i] = r == 0 ? (float)(i + 5) : -1.0f;
        op[r] = (struct c10d__op){.kind = C10D_OP_BROADCAST,
                                  .send = bc[r],
                                  .recv = bc[r],
                                  .count = BC,
                                  .dtype = C10D_FLOAT32,
                                  .root = 0,
                                  .seq = 1};
    }
    struct c10d__fp fp;
    c10d__fp_of(&op[0], NR, &fp);
    struct c10d__shm_coll x[NR];
    for (int r = 0; r < NR; r++)
        c10d__shm_coll_start(&x[r], seg[r], &op[r], 0, &fp);
    int moved;
    /* Ranks 0 and 2 offer and wait for rank 1. */
    assert_int_equal(c10d__shm_coll_progress(&x[0], &moved), 0);
    assert_int_equal(c10d__shm_coll_progress(&x[2], &moved), 0);
    /* The offer's words: can, pid, address (in_place.c). */
    uint64_t *offer = (uint64_t *)c10d__shm_slot(seg[1], 0, x[0].gen);
    uint64_t pid = offer[1];
    offer[1] = 0x7ffffff0; /* no such process */
    for (int k = 0; k < 3; k++)
        assert_true(c10d__shm_coll_progress(&x[1], &moved) < 0);
    for (int i = 0; i < BC; i++)
        assert_true(bc[1][i] == -1.0f);
    offer[1] = pid;
    int rc[NR] = {0, 0, 0};
    for (int i = 0; i < 1000000 && !(rc[0] == 1 && rc[1] == 1 && rc[2] == 1); i++)
        for (int r = NR - 1; r >= 0; r--)
            if (rc[r] != 1) {
                rc[r] = c10d__shm_coll_progress(&x[r], &moved);
                assert_true(rc[r] >= 0);
            }
    for (int r = 0; r < NR; r++) {
        assert_int_equal(rc[r], 1);
        for (int i = 0; i < BC; i++)
            assert_true(bc[r][i] == (float)(i + 5));
    }
    free3(seg);
}

/* all_reduce, 2.4 MB in 64 KiB slots (smaller ones never offer: their
 * chunks are reduced whole): 36 chunks cut into uneven slices, and a last
 * one of 12 KB every rank reduces whole; rank 1 out of place, the others
 * in place. SUM, PREMUL_SUM and MAX of int32 exact; then random floats give
 * the same bits as through the slots (sums, averages, premultiplied sums
 * round alike only where every element adds its terms in the same order);
 * then a rank whose op ended never lets its peers go, as above. */
enum { AR_SLOT = 64 * 1024, AR_CHUNK = AR_SLOT / 4, AR = 36 * AR_CHUNK + 3001 };
static float ar_in[NR][AR], ar_out[NR][AR], ar_slots[NR][AR];

static void all_reduce_op(struct c10d__op op[NR], c10d_dtype dt, c10d_reduce_op redop, uint64_t seq)
{
    for (int r = 0; r < NR; r++)
        op[r] = (struct c10d__op){.kind = C10D_OP_ALL_REDUCE,
                                  .send = r == 1 ? ar_in[r] : ar_out[r],
                                  .recv = ar_out[r],
                                  .count = AR,
                                  .dtype = dt,
                                  .redop = redop,
                                  .premul_factor = 0.37,
                                  .seq = seq};
}

static void all_reduce(struct c10d__shm_seg *seg[NR], c10d_dtype dt, c10d_reduce_op redop,
                       uint64_t seq)
{
    struct c10d__op op[NR];
    all_reduce_op(op, dt, redop, seq);
    for (int r = 0; r < NR; r++) {
        float *in = (float *)op[r].send;
        int32_t *iin = (int32_t *)in;
        for (int i = 0; i < AR; i++) {
            if (dt == C10D_INT32)
                iin[i] = (i * 7 + r * 1000) % 100003 - 50000;
            else
                in[i] = (float)i * 0.5f + (float)(r + (int)seq);
        }
        if (r == 1)
            memset(ar_out[r], 0, sizeof ar_out[r]);
    }
    drive_done(seg, op);
    for (int r = 0; r < NR; r++) {
        for (int i = 0; i < AR; i++) {
            if (dt == C10D_INT32) {
                int32_t want = INT32_MIN;
                for (int k = 0; k < NR; k++) {
                    int32_t v = (i * 7 + k * 1000) % 100003 - 50000;
                    want = v > want ? v : want;
                }
                assert_int_equal(((int32_t *)ar_out[r])[i], want);
                continue;
            }
            float want = 0;
            for (int k = 0; k < NR; k++)
                want += (float)i * 0.5f + (float)(k + (int)seq);
            if (redop == C10D_PREMUL_SUM) /* 0.37 x each term: not exact, close */
                assert_true(ar_out[r][i] - want * 0.37f <= want * 1e-6f &&
                            want * 0.37f - ar_out[r][i] <= want * 1e-6f);
            else
                assert_true(ar_out[r][i] == want);
        }
    }
}

/* Random floats through `seg` (offering or not, as it stands) into out. */
static void all_reduce_random(struct c10d__shm_seg *seg[NR], c10d_reduce_op redop, uint64_t seq,
                              float out[NR][AR])
{
    struct c10d__op op[NR];
    all_reduce_op(op, C10D_FLOAT32, redop, seq);
    uint32_t x = 12345;
    for (int r = 0; r < NR; r++)
        for (int i = 0; i < AR; i++) {
            x = x * 1664525u + 1013904223u;
            ((float *)op[r].send)[i] = (float)(x >> 8) / (float)(1u << 24) * 200.0f - 100.0f;
        }
    drive_done(seg, op);
    for (int r = 0; r < NR; r++) {
        memcpy(out[r], ar_out[r], sizeof out[r]);
    }
}

static void test_all_reduce_in_place(void **st)
{
    (void)st;
    struct c10d__shm_seg *seg[NR];
    make3_slots(seg, AR_SLOT);
    uint64_t b0 = c10d__shm_in_place_bytes(), gen = seg[0]->gen;
    all_reduce(seg, C10D_FLOAT32, C10D_SUM, 1);
    /* Every rank reads each peer's copy of its slices, then each peer's
     * slices; and each peer's whole last chunk. */
    size_t sliced = 36 * AR_CHUNK, whole = AR - sliced;
    uint64_t per_op = (2u * (NR - 1) * sliced + NR * (NR - 1) * whole) * sizeof(float);
    assert_int_equal(c10d__shm_in_place_bytes() - b0, per_op);
    assert_int_equal(seg[0]->gen - gen, 2); /* the offer's chunk and the gather's */
    all_reduce(seg, C10D_FLOAT32, C10D_PREMUL_SUM, 2);
    all_reduce(seg, C10D_INT32, C10D_MAX, 3);
    assert_int_equal(c10d__shm_in_place_bytes() - b0, 3 * per_op);

    c10d_reduce_op redops[] = {C10D_SUM, C10D_AVG, C10D_PREMUL_SUM};
    for (int k = 0; k < 3; k++) {
        uint64_t b1 = c10d__shm_in_place_bytes();
        all_reduce_random(seg, redops[k], 10 + (uint64_t)k, ar_slots);
        assert_int_equal(c10d__shm_in_place_bytes() - b1, per_op);
        for (int r = 0; r < NR; r++)
            atomic_store(&seg[r]->no_offers, 1);
        all_reduce_random(seg, redops[k], 20 + (uint64_t)k, ar_out);
        for (int r = 0; r < NR; r++) {
            atomic_store(&seg[r]->no_offers, 0);
            assert_memory_equal(ar_out[r], ar_slots[r], sizeof ar_out[r]);
        }
        assert_int_equal(c10d__shm_in_place_bytes() - b1, per_op); /* nothing more */
    }

    struct c10d__op op[NR];
    all_reduce_op(op, C10D_FLOAT32, C10D_SUM, 30);
    int rc[NR];
    drive(seg, op, 2, 20000, rc);
    for (int r = 0; r < NR; r++) {
        assert_int_equal(rc[r], 0);
        assert_int_equal(atomic_load(&seg[r]->ctl[r].reduced), seg[r]->gen);
    }
    assert_true(atomic_load(&seg[2]->ctl[2].released) < seg[2]->gen);
    free3(seg);

    /* 4 KiB slots: every chunk would be reduced whole, so none offers. */
    make3(seg);
    uint64_t b2 = c10d__shm_in_place_bytes();
    all_reduce(seg, C10D_FLOAT32, C10D_SUM, 40);
    assert_int_equal(c10d__shm_in_place_bytes(), b2);
    free3(seg);
}

/* Runs an all_to_all on three ranks' segments, rank s sending sc[s][d]
 * elements to rank d (in[r] and out[r] of `cap` elements; in place: each
 * rank's input is its output), checks what every rank received, and returns
 * the bytes read in place. */
static uint64_t all_to_all_counts(struct c10d__shm_seg *seg[NR], size_t sc[NR][NR], float *in[NR],
                                  float *out[NR], size_t cap, int inplace, uint64_t seq)
{
    static size_t rcn[NR][NR];
    struct c10d__op op[NR];
    for (int r = 0; r < NR; r++) {
        size_t total = 0;
        for (int d = 0; d < NR; d++) {
            rcn[r][d] = sc[d][r];
            total += sc[r][d];
        }
        for (size_t i = 0; i < total; i++)
            in[r][i] = (float)(r * 1000000 + (int)i);
        memset(out[r], 0, cap * sizeof(float));
        if (inplace)
            memcpy(out[r], in[r], cap * sizeof(float));
        op[r] = (struct c10d__op){.kind = C10D_OP_ALL_TO_ALL,
                                  .send = inplace ? out[r] : in[r],
                                  .recv = out[r],
                                  .count = total,
                                  .send_counts = sc[r],
                                  .recv_counts = rcn[r],
                                  .dtype = C10D_FLOAT32,
                                  .seq = seq};
    }
    uint64_t b0 = c10d__shm_in_place_bytes();
    drive_done(seg, op);
    for (int r = 0; r < NR; r++) {
        size_t at = 0;
        for (int j = 0; j < NR; j++) {
            size_t from = 0; /* where block r starts in rank j's input */
            for (int d = 0; d < r; d++)
                from += sc[j][d];
            for (size_t i = 0; i < rcn[r][j]; i++)
                assert_true(out[r][at + i] == (float)(j * 1000000 + (int)(from + i)));
            at += rcn[r][j];
        }
    }
    return c10d__shm_in_place_bytes() - b0;
}

/* all_to_all: what is left after the first chunk is read in place once every
 * rank can, also where only some ranks have blocks longer than a chunk (rank
 * 0's are short: it reads nothing and nothing of its is read, and says so);
 * in place (input and output alike) it goes through the slots. */
static void test_all_to_all_rest(void **st)
{
    (void)st;
    struct c10d__shm_seg *seg[NR];
    make3(seg);
    enum { MOST = 3000 }; /* a chunk holds (4096 + 128 - 128) / 3 / 4 = 341 per pair */
    static float in[NR][NR * MOST], out[NR][NR * MOST];
    float *ins[NR] = {in[0], in[1], in[2]}, *outs[NR] = {out[0], out[1], out[2]};
    static size_t sc[NR][NR];
    for (int round = 0; round < 3; round++) {
        int inplace = round == 2;
        for (int s = 0; s < NR; s++)
            for (int d = 0; d < NR; d++)
                sc[s][d] =
                    round == 1 && (s == 0 || d == 0) ? 3 : (size_t)(s * 3 + d * 5) % 7 * 400 + 1;
        if (inplace) /* an even split, in place */
            for (int s = 0; s < NR; s++)
                for (int d = 0; d < NR; d++)
                    sc[s][d] = MOST;
        uint64_t read =
            all_to_all_counts(seg, sc, ins, outs, NR * MOST, inplace, (uint64_t)round + 1);
        if (inplace)
            assert_int_equal(read, 0);
        else
            assert_true(read > 0);
    }
    free3(seg);
}

/* all_to_all whose rank 1 sends blocks of C10D_SHM_A2A_EMPTY_MIN bytes or
 * more: it sends its first chunk empty, and its peers read those blocks in
 * place whole (exactly those bytes); where rank 0 can never read in place,
 * every rank runs the op again through the slots, nothing read in place. */
static void test_all_to_all_empty(void **st)
{
    (void)st;
    struct c10d__shm_seg *seg[NR];
    enum { BIG = C10D_SHM_A2A_EMPTY_MIN / 4 + 17, SMALL = 7, MOST = 2 * BIG + SMALL };
    static float in[NR][MOST], out[NR][MOST];
    float *ins[NR] = {in[0], in[1], in[2]}, *outs[NR] = {out[0], out[1], out[2]};
    static size_t sc[NR][NR];
    for (int s = 0; s < NR; s++)
        for (int d = 0; d < NR; d++)
            sc[s][d] = s == 1 && d != 1 ? BIG : SMALL;
    for (int round = 0; round < 2; round++) {
        make3(seg);
        if (round == 1)
            seg[0]->read_peers = 2; /* never */
        assert_int_equal(all_to_all_counts(seg, sc, ins, outs, MOST, 0, 1),
                         round == 0 ? 2 * (uint64_t)BIG * sizeof(float) : 0);
        free3(seg);
    }
}

/* Real ranks: large broadcast, all_gather, scatter (in place and not) and all_reduce
 * correct and
 * read in place, unless the ranks outnumber the CPUs (then nothing is); then
 * C10D_SHM_IN_PLACE=0 on rank 1 alone: correct through the slots, nothing
 * read in place. */
static int ranks_main(int rank, int n, void *arg)
{
    int off_on_1 = *(int *)arg;
    setenv("C10D_SHM", "1", 1);
    if (off_on_1 && rank == 1)
        setenv("C10D_SHM_IN_PLACE", "0", 1);
    c10d_pg_opts po = {0};
    po.timeout_ms = 60000;
    c10d_pg *pg = NULL;
    MP_CHECK(c10d_pg_init(&po, &pg) == 0, "init: %s", c10d_last_error());
    enum { COUNT = 1 << 18 }; /* 1 MiB of int32 */
    int32_t *buf = malloc(COUNT * sizeof *buf), *all = malloc((size_t)n * COUNT * sizeof *all);
    MP_CHECK(buf != NULL && all != NULL, "out of memory");
    uint64_t b0 = c10d__shm_in_place_bytes();
    for (int k = 0; k < 6; k++) {
        int root = k % n;
        for (int i = 0; i < COUNT; i++)
            buf[i] = rank == root ? k * 1000003 + i : -1;
        c10d_work *w;
        MP_CHECK(c10d_broadcast(pg, buf, buf, COUNT, C10D_INT32, root, NULL, &w) == 0 &&
                     c10d_work_wait(w, 30000) == 0,
                 "broadcast %d: %s", k, c10d_last_error());
        c10d_work_release(w);
        for (int i = 0; i < COUNT; i++)
            MP_CHECK(buf[i] == k * 1000003 + i, "broadcast %d: [%d] = %d", k, i, (int)buf[i]);
        int32_t *send = k % 2 ? all + (size_t)rank * COUNT : buf; /* in place every other */
        for (int i = 0; i < COUNT; i++)
            send[i] = rank * 7919 + k * 31 + i;
        MP_CHECK(c10d_all_gather(pg, send, all, COUNT, C10D_INT32, NULL, &w) == 0 &&
                     c10d_work_wait(w, 30000) == 0,
                 "all_gather %d: %s", k, c10d_last_error());
        c10d_work_release(w);
        for (int r = 0; r < n; r++)
            for (int i = 0; i < COUNT; i++)
                MP_CHECK(all[(size_t)r * COUNT + (size_t)i] == r * 7919 + k * 31 + i,
                         "all_gather %d: rank %d's [%d] = %d", k, r, i,
                         (int)all[(size_t)r * COUNT + (size_t)i]);
        /* Scatter from `all` (the root's), into its own block every other. */
        int32_t *out = rank == root && k % 2 ? all + (size_t)rank * COUNT : buf;
        for (size_t i = 0; rank == root && i < (size_t)n * COUNT; i++)
            all[i] = k * 17 + (int)i;
        MP_CHECK(c10d_scatter(pg, rank == root ? all : NULL, out, COUNT, C10D_INT32, root, NULL,
                              &w) == 0 &&
                     c10d_work_wait(w, 30000) == 0,
                 "scatter %d: %s", k, c10d_last_error());
        c10d_work_release(w);
        for (int i = 0; i < COUNT; i++)
            MP_CHECK(out[i] == k * 17 + rank * COUNT + i, "scatter %d: [%d] = %d", k, i,
                     (int)out[i]);
    }
    /* Up to 1 MiB an op read in place runs in the caller's lane: some of
     * 50 back to back do (one whose peer came later than 50 us goes to the
     * loop, as where the scheduler put both ranks on one CPU). */
    int reads = !off_on_1 && n <= sysconf(_SC_NPROCESSORS_ONLN);
    uint64_t here0, loop0, here1, loop1, b1 = c10d__shm_in_place_bytes();
    c10d__tcp_lane_counts(&here0, &loop0);
    for (int k = 0; k < 50; k++) {
        c10d_work *w;
        MP_CHECK(c10d_all_gather(pg, buf, all, 16 * 1024, C10D_INT32, NULL, &w) == 0 &&
                     c10d_work_wait(w, 30000) == 0,
                 "all_gather of 64 KiB: %s", c10d_last_error());
        c10d_work_release(w);
    }
    c10d__tcp_lane_counts(&here1, &loop1);
    MP_CHECK(!reads || (here1 > here0 && c10d__shm_in_place_bytes() > b1),
             "none of 50 ops read in place ran in the caller's lane (%llu in the lane, %llu "
             "to the loop)",
             (unsigned long long)(here1 - here0), (unsigned long long)(loop1 - loop0));

    /* all_to_all with blocks of 256 KiB (C10D_SHM_A2A_EMPTY_MIN or more, and
     * longer than a chunk: the lane takes it only as read in place): every
     * block read in place whole, no more, from an empty first chunk, in the
     * caller's lane; where one rank cannot read, run again through the
     * slots, nothing read. */
    {
        size_t blk = 64 * 1024, bytes = blk * sizeof(int32_t);
        int32_t *out = malloc((size_t)n * bytes);
        MP_CHECK(out != NULL && bytes >= C10D_SHM_A2A_EMPTY_MIN, "out of memory");
        uint64_t b2 = c10d__shm_in_place_bytes();
        c10d__tcp_lane_counts(&here0, &loop0);
        for (int k = 0; k < 50; k++) {
            for (int d = 0; d < n; d++)
                for (size_t i = 0; i < blk; i++)
                    all[(size_t)d * blk + i] = rank * 1000000 + d * 100000 + k * 1000 + (int)i;
            c10d_work *w;
            MP_CHECK(c10d_all_to_all_single(pg, all, out, (size_t)n * blk, NULL, NULL, C10D_INT32,
                                            NULL, &w) == 0 &&
                         c10d_work_wait(w, 30000) == 0,
                     "all_to_all of 256 KiB blocks: %s", c10d_last_error());
            c10d_work_release(w);
            for (int s = 0; s < n; s++)
                for (size_t i = 0; i < blk; i++)
                    MP_CHECK(out[(size_t)s * blk + i] ==
                                 s * 1000000 + rank * 100000 + k * 1000 + (int)i,
                             "all_to_all %d: from rank %d, element %zu: %d", k, s, i,
                             (int)out[(size_t)s * blk + i]);
        }
        c10d__tcp_lane_counts(&here1, &loop1);
        uint64_t got = c10d__shm_in_place_bytes() - b2,
                 want = reads ? 50u * (uint64_t)(n - 1) * bytes : 0;
        MP_CHECK(got == want, "all_to_all of 256 KiB blocks: %llu bytes read in place, not %llu",
                 (unsigned long long)got, (unsigned long long)want);
        MP_CHECK(!reads || here1 > here0,
                 "none of 50 all_to_all read in place ran in the caller's lane (%llu to the loop)",
                 (unsigned long long)(loop1 - loop0));
        free(out);
    }

    /* A peer that comes late: rank 0's broadcast waits for it in the lane,
     * then on the loop, while rank 0's caller blocks on the store until
     * every peer finished the same broadcast, which needs rank 0 to let them
     * go after their reads. Parked unfinished in the lane, it would hold them
     * until rank 0 waited for it. */
    {
        enum { HALF = 1 << 17 }; /* 512 KiB of int32 */
        for (int i = 0; i < HALF; i++)
            buf[i] = rank == 0 ? 77 + i : -1;
        if (rank != 0)
            usleep(100 * 1000);
        c10d_work *w;
        MP_CHECK(c10d_broadcast(pg, buf, buf, HALF, C10D_INT32, 0, NULL, &w) == 0,
                 "late broadcast: %s", c10d_last_error());
        c10d_store *store;
        MP_CHECK(c10d_pg_store(pg, &store) == 0, "store");
        char key[32];
        if (rank == 0) {
            for (int r = 1; r < n; r++) {
                snprintf(key, sizeof key, "late_bc_%d", r);
                const char *keys[1] = {key};
                MP_CHECK(c10d_store_wait_sync(store, keys, 1, 20000) == 0,
                         "rank %d never finished the late broadcast: %s", r, c10d_last_error());
            }
        } else {
            MP_CHECK(c10d_work_wait(w, 30000) == 0, "late broadcast: %s", c10d_last_error());
            snprintf(key, sizeof key, "late_bc_%d", rank);
            MP_CHECK(c10d_store_set_sync(store, key, "1", 1) == 0, "set");
        }
        MP_CHECK(c10d_work_wait(w, 30000) == 0, "late broadcast: %s", c10d_last_error());
        c10d_work_release(w);
        c10d_store_release(store);
        for (int i = 0; i < HALF; i++)
            MP_CHECK(buf[i] == 77 + i, "late broadcast: [%d] = %d", i, (int)buf[i]);
    }

    /* all_reduce of 2.5 MiB in place, as torch's: read in place. */
    {
        enum { ARN = 640 * 1024 + 3 };
        float *f = malloc(ARN * sizeof *f);
        MP_CHECK(f != NULL, "out of memory");
        for (int k = 0; k < 2; k++) {
            for (int i = 0; i < ARN; i++)
                f[i] = (float)(i % 4096) + (float)(rank * 3 + k);
            c10d_work *w;
            MP_CHECK(c10d_all_reduce(pg, f, f, ARN, C10D_FLOAT32, C10D_SUM, NULL, &w) == 0 &&
                         c10d_work_wait(w, 30000) == 0,
                     "all_reduce %d: %s", k, c10d_last_error());
            c10d_work_release(w);
            for (int i = 0; i < ARN; i++)
                MP_CHECK(f[i] == (float)(n * (i % 4096) + 3 * n * (n - 1) / 2 + n * k),
                         "all_reduce %d: [%d] = %g", k, i, (double)f[i]);
        }
        free(f);
    }

    /* all_to_all, 2 MiB per rank: what is left after the first chunk. */
    size_t per = (size_t)n * COUNT / 2 / (size_t)n;
    int32_t *a2a = malloc((size_t)n * per * sizeof *a2a);
    MP_CHECK(a2a != NULL, "out of memory");
    for (int d = 0; d < n; d++)
        for (size_t i = 0; i < per; i++)
            all[(size_t)d * per + i] = rank * 1000000 + d * 100000 + (int)(i % 100000);
    c10d_work *w;
    MP_CHECK(c10d_all_to_all_single(pg, all, a2a, (size_t)n * per, NULL, NULL, C10D_INT32, NULL,
                                    &w) == 0 &&
                 c10d_work_wait(w, 30000) == 0,
             "all_to_all: %s", c10d_last_error());
    c10d_work_release(w);
    for (int s = 0; s < n; s++)
        for (size_t i = 0; i < per; i++)
            MP_CHECK(a2a[(size_t)s * per + i] == s * 1000000 + rank * 100000 + (int)(i % 100000),
                     "all_to_all: from rank %d, element %zu: %d", s, i,
                     (int)a2a[(size_t)s * per + i]);
    free(a2a);
    uint64_t read = c10d__shm_in_place_bytes() - b0;
    if (!reads)
        MP_CHECK(read == 0, "%llu bytes read in place (C10D_SHM_IN_PLACE=0 on rank 1: %d)",
                 (unsigned long long)read, off_on_1);
    else
        MP_CHECK(read > 0, "nothing read in place");
    free(buf);
    free(all);
    c10d_pg_destroy(pg);
    c10d_shutdown();
    return 0;
}

static void run_ranks(int nranks, int off_on_1)
{
    struct mp_opts o = {0};
    o.nranks = nranks;
    o.timeout_s = 120;
    o.kill_on_failure = 1;
    struct mp_result res;
    int rc = mp_run(&o, ranks_main, &off_on_1, &res);
    assert_false(res.timed_out);
    assert_int_equal(rc, 0);
}

static void test_ranks(void **st)
{
    (void)st;
    run_ranks(2, 0);
    run_ranks(2, 1);
    run_ranks(3, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_read_in_place),
        cmocka_unit_test(test_not_now_then_in_place),
        cmocka_unit_test(test_never_stops_offers),
        cmocka_unit_test(test_ended_op_holds_readers),
        cmocka_unit_test(test_all_reduce_in_place),
        cmocka_unit_test(test_all_to_all_rest),
        cmocka_unit_test(test_all_to_all_empty),
        cmocka_unit_test(test_failed_read_runs_again),
        cmocka_unit_test(test_ranks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
