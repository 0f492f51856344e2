/* The shared-memory path (docs/shm.md): the choice every rank draws from the
 * handshake notes (one host id for all, C10D_SHM=0 on one rank, another
 * host), attaching and its errors, all_reduce through the public API with
 * small slots (many chunks, both reduction schemes) and a rank that opts out,
 * sleeping ranks woken through their doorbells (no tcp ring, no CPU while
 * idle, no descriptor left after), and no named segment left anywhere after
 * every rank is killed mid-op. The full dtype x reduce-op matrix runs in
 * test_tcp_algorithms_shm (ctest). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "backends/shm/coll.h"
#include "backends/shm/path.h"
#include "c10d.h"
#include "engine/env.h"
#include "engine/loop.h"
#include "mp_harness.h"

#include <dirent.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------ the choice, alone */

static void test_host_id(void **st)
{
    (void)st;
    char a[C10D_SHM_HOST_ID_MAX], b[C10D_SHM_HOST_ID_MAX];
    c10d__shm_host_id(a, sizeof a);
    c10d__shm_host_id(b, sizeof b);
    assert_true(a[0] != '\0'); /* Linux with /proc: always */
    assert_string_equal(a, b);
}

/* Rank 0's side of three groups: one host, one rank elsewhere, one rank
 * that said C10D_SHM=0 (published nothing). */
static void test_decide(void **st)
{
    (void)st;
    char mine[C10D_SHM_NOTE_MAX];
    struct c10d__shm_seg *seg = NULL;
    assert_int_equal(c10d__shm_note(0, 3, mine, sizeof mine, &seg), 0);
    assert_non_null(seg);
    char id[C10D_SHM_HOST_ID_MAX];
    c10d__shm_host_id(id, sizeof id);
    assert_true(strncmp(mine, id, strlen(id)) == 0 && mine[strlen(id)] == ',');

    const char *same[3] = {mine, id, id};
    assert_int_equal(c10d__shm_decide(0, 3, same, &seg), 1);
    assert_non_null(seg);

    const char *other_host[3] = {mine, id, "another-boot.1000.4026531836"};
    assert_int_equal(c10d__shm_decide(0, 3, other_host, &seg), 0);
    assert_null(seg); /* rank 0's segment is freed */

    const char *opted_out[3] = {"", id, id}; /* rank 0 itself said 0 */
    assert_int_equal(c10d__shm_decide(1, 3, opted_out, &seg), 0);
    const char *peer_out[3] = {mine, "", id};
    assert_int_equal(c10d__shm_decide(2, 3, peer_out, &seg), 0);
    assert_null(seg);
}

static void test_attach_errors(void **st)
{
    (void)st;
    struct c10d__shm_seg *seg = NULL, *peer = NULL;
    char ref[C10D_SHM_REF_MAX];
    assert_int_equal(c10d__shm_attach("nonsense", 2, 1, &peer), C10D_EPROTO);
    assert_non_null(strstr(c10d_last_error(), "malformed"));
    /* A process that cannot exist: the message says how to opt out. */
    assert_int_equal(c10d__shm_attach("2147483647.3.00ff.4096", 2, 1, &peer), C10D_EIO);
    assert_non_null(strstr(c10d_last_error(), "C10D_SHM=0"));

    assert_int_equal(c10d__shm_create(2, 4096, &seg, ref, sizeof ref), 0);
    assert_int_equal(c10d__shm_attach(ref, 2, 1, &peer), 0);
    c10d__shm_free(peer);
    /* Made for 2 ranks: not a segment for 3. */
    assert_int_equal(c10d__shm_attach(ref, 3, 1, &peer), C10D_EPROTO);
    /* Another nonce: not the segment rank 0 announced. */
    char wrong[C10D_SHM_REF_MAX];
    snprintf(wrong, sizeof wrong, "%s", ref);
    char *nonce = strchr(strchr(wrong, '.') + 1, '.') + 1;
    nonce[0] = nonce[0] == '0' ? '1' : '0';
    assert_int_equal(c10d__shm_attach(wrong, 2, 1, &peer), C10D_EPROTO);
    assert_non_null(strstr(c10d_last_error(), "not the segment"));
    c10d__shm_free(seg);
}

/* Descriptors this process holds now. */
static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    if (d == NULL)
        return -1;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        n += e->d_name[0] != '.';
    closedir(d);
    return n - 1; /* opendir's own */
}

static void count_ring(void *arg, int r)
{
    (void)r;
    ++*(int *)arg;
}

/* 1 if fd has a byte to read now (then reads it all). */
static int bell_rang(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, 0) != 1)
        return 0;
    char buf[64];
    while (read(fd, buf, sizeof buf) > 0)
        ;
    return 1;
}

/* A sleeper is woken through its doorbell (a byte in its pipe), not the tcp
 * ring; a doorbell that is not the one published falls back to the ring;
 * every descriptor goes with the segments. */
static void test_doorbell(void **st)
{
    (void)st;
    int fds0 = count_fds();
    struct c10d__shm_seg *a, *b;
    char ref[C10D_SHM_REF_MAX];
    uint64_t bells0, falls0, bells, falls;
    int rings = 0;
    c10d__shm_bell_counts(&bells0, &falls0);
    assert_int_equal(c10d__shm_create(2, 4096, &a, ref, sizeof ref), 0);
    assert_int_equal(c10d__shm_attach(ref, 2, 1, &b), 0);
    assert_true(c10d__shm_bell_fd(a) >= 0 && c10d__shm_bell_fd(b) >= 0);
    c10d__shm_wake_sleepers(a, count_ring, &rings); /* nobody sleeps */
    assert_false(bell_rang(c10d__shm_bell_fd(b)));
    for (int i = 0; i < 3; i++) {
        c10d__shm_sleepy(b);
        c10d__shm_wake_sleepers(a, count_ring, &rings);
        assert_true(bell_rang(c10d__shm_bell_fd(b)));
        c10d__shm_wake_sleepers(a, count_ring, &rings); /* the flag was taken */
        assert_false(bell_rang(c10d__shm_bell_fd(b)));
    }
    c10d__shm_sleepy(a); /* and the other way */
    c10d__shm_wake_sleepers(b, count_ring, &rings);
    assert_true(bell_rang(c10d__shm_bell_fd(a)));
    assert_int_equal(rings, 0);
    c10d__shm_bell_counts(&bells, &falls);
    assert_true(bells - bells0 >= 4 && falls == falls0);
    c10d__shm_free(b);
    c10d__shm_free(a);

    /* A published inode that is not the pipe's: never written, rung over tcp. */
    assert_int_equal(c10d__shm_create(2, 4096, &a, ref, sizeof ref), 0);
    assert_int_equal(c10d__shm_attach(ref, 2, 1, &b), 0);
    atomic_fetch_add(&b->ctl[1].bell_ino, 1);
    c10d__shm_sleepy(b);
    c10d__shm_wake_sleepers(a, count_ring, &rings);
    assert_int_equal(rings, 1);
    assert_false(bell_rang(c10d__shm_bell_fd(b)));
    c10d__shm_sleepy(b); /* once failed, tcp for good */
    c10d__shm_wake_sleepers(a, count_ring, &rings);
    assert_int_equal(rings, 2);
    /* No doorbell published (yet): tcp, and asked for again next time. */
    uint64_t published = atomic_exchange(&a->ctl[0].bell, 0);
    c10d__shm_sleepy(a);
    c10d__shm_wake_sleepers(b, count_ring, &rings);
    assert_int_equal(rings, 3);
    assert_false(bell_rang(c10d__shm_bell_fd(a)));
    atomic_store(&a->ctl[0].bell, published); /* published now: rung through it */
    c10d__shm_sleepy(a);
    c10d__shm_wake_sleepers(b, count_ring, &rings);
    assert_int_equal(rings, 3);
    assert_true(bell_rang(c10d__shm_bell_fd(a)));
    c10d__shm_bell_counts(&bells, &falls);
    assert_int_equal(falls - falls0, 3);
    c10d__shm_free(b);
    c10d__shm_free(a);
    assert_int_equal(count_fds(), fds0);
}

/* The P2P rings (ring.h), both ends mapped here: bytes in order across the
 * wrap, a full ring takes what fits, and each flag handshake answers once. */
static void test_ring(void **st)
{
    (void)st;
    struct c10d__shm_seg *a, *b;
    char ref[C10D_SHM_REF_MAX];
    assert_int_equal(c10d__shm_create(3, 4096, &a, ref, sizeof ref), 0);
    assert_int_equal(c10d__shm_attach(ref, 3, 1, &b), 0);
    assert_null(c10d__shm_ring_of(a, 0, 0));
    struct c10d__shm_ring *w = c10d__shm_ring_of(a, 0, 1), *r = c10d__shm_ring_of(b, 0, 1);
    assert_non_null(w);
    assert_true(c10d__shm_ring_of(a, 1, 0) != w && c10d__shm_ring_of(a, 0, 2) != w);
    assert_false(c10d__shm_ring_reader_is_open(w));
    c10d__shm_ring_open_reader(r);
    assert_true(c10d__shm_ring_reader_is_open(w));

    static unsigned char out[C10D_SHM_RING_BYTES + 1000], in[sizeof out];
    for (size_t i = 0; i < sizeof out; i++)
        out[i] = (unsigned char)(i * 7 + 3);
    const char *p;
    assert_int_equal(c10d__shm_ring_peek(r, &p), 0);
    /* Fill to the brim: what does not fit is refused, and the writer that
     * says it waits is told the ring is still full. */
    size_t put = c10d__shm_ring_put(w, out, sizeof out);
    assert_int_equal(put, C10D_SHM_RING_BYTES);
    assert_int_equal(c10d__shm_ring_put(w, out + put, 1), 0);
    assert_false(c10d__shm_ring_writer_wait(w));
    /* The reader takes some: the waiting writer is to be woken, once. */
    size_t got = 0, n = c10d__shm_ring_peek(r, &p);
    assert_true(n > 0);
    memcpy(in, p, 1000);
    c10d__shm_ring_take(r, 1000);
    got = 1000;
    assert_true(c10d__shm_ring_writer_to_wake(r));
    assert_false(c10d__shm_ring_writer_to_wake(r));
    /* The rest goes in across the end of the ring and comes out in order. */
    assert_int_equal(c10d__shm_ring_put(w, out + put, sizeof out - put), sizeof out - put);
    while ((n = c10d__shm_ring_peek(r, &p)) > 0) {
        memcpy(in + got, p, n);
        c10d__shm_ring_take(r, n);
        got += n;
    }
    assert_int_equal(got, sizeof out);
    assert_memory_equal(in, out, sizeof out);
    /* A sleeping reader: nothing there, so it sleeps; a write wakes it once. */
    assert_false(c10d__shm_ring_reader_sleep(r));
    assert_false(c10d__shm_ring_writer_wait(w) == 0); /* room: the writer goes on */
    assert_int_equal(c10d__shm_ring_put(w, "x", 1), 1);
    assert_true(c10d__shm_ring_reader_to_wake(w));
    assert_false(c10d__shm_ring_reader_to_wake(w));
    /* Bytes already there when the reader looks before sleeping: it reads. */
    assert_true(c10d__shm_ring_reader_sleep(r));
    c10d__shm_free(b);
    c10d__shm_free(a);
}

/* Two ranks in one process, stepped by hand: one waits for the other. */
static void test_state_machine(void **st)
{
    (void)st;
    struct c10d__shm_seg *s0 = NULL, *s1 = NULL;
    char ref[C10D_SHM_REF_MAX];
    assert_int_equal(c10d__shm_create(2, 4096, &s0, ref, sizeof ref), 0);
    assert_int_equal(c10d__shm_attach(ref, 2, 1, &s1), 0);
    enum { N = 5000 }; /* 5 chunks of 1024 floats: small scheme */
    static float a[N], b[N], ra[N], rb[N];
    for (int i = 0; i < N; i++) {
        a[i] = (float)i;
        b[i] = 1.0f;
    }
    struct c10d__op op0 = {.kind = C10D_OP_ALL_REDUCE,
                           .send = a,
                           .recv = ra,
                           .count = N,
                           .dtype = C10D_FLOAT32,
                           .redop = C10D_SUM,
                           .seq = 1};
    struct c10d__op op1 = op0;
    op1.send = b;
    op1.recv = rb;
    struct c10d__fp fp;
    c10d__fp_of(&op0, 2, &fp);
    struct c10d__shm_coll x0, x1;
    c10d__shm_coll_start(&x0, s0, &op0, 0, &fp);
    c10d__shm_coll_start(&x1, s1, &op1, 0, &fp);
    int moved;
    assert_int_equal(c10d__shm_coll_progress(&x0, &moved), 0); /* rank 1 is not there */
    assert_true(moved);                                        /* it wrote its slot */
    assert_int_equal(c10d__shm_coll_progress(&x0, &moved), 0);
    assert_false(moved);
    int d0 = 0, d1 = 0;
    for (int i = 0; i < 100 && !(d0 && d1); i++) {
        if (!d1)
            d1 = c10d__shm_coll_progress(&x1, &moved);
        if (!d0)
            d0 = c10d__shm_coll_progress(&x0, &moved);
    }
    assert_int_equal(d0, 1);
    assert_int_equal(d1, 1);
    for (int i = 0; i < N; i++) {
        assert_true(ra[i] == (float)i + 1.0f);
        assert_true(rb[i] == ra[i]);
    }
    /* A different count on rank 1: both ranks fail, naming the difference. */
    op1.count = N - 1;
    op0.seq = op1.seq = 2;
    struct c10d__fp fp1;
    c10d__fp_of(&op1, 2, &fp1);
    c10d__shm_coll_start(&x0, s0, &op0, 0, &fp);
    c10d__shm_coll_start(&x1, s1, &op1, 0, &fp1);
    c10d__shm_coll_progress(&x0, &moved);
    assert_true(c10d__shm_coll_progress(&x1, &moved) < 0);
    assert_non_null(strstr(c10d_last_error(), "mismatch"));
    assert_true(c10d__shm_coll_progress(&x0, &moved) < 0);
    c10d__shm_free(s1);
    c10d__shm_free(s0);
}

/* Three ranks' state machines on one segment, driven in turn until done. */
static void drive3(struct c10d__shm_seg *seg[3], struct c10d__op op[3])
{
    struct c10d__fp fp;
    c10d__fp_of(&op[0], 2, &fp);
    struct c10d__shm_coll x[3];
    for (int r = 0; r < 3; r++)
        c10d__shm_coll_start(&x[r], seg[r], &op[r], 0, &fp);
    int done[3] = {0, 0, 0}, moved;
    for (int i = 0; i < 100000 && !(done[0] && done[1] && done[2]); i++)
        for (int r = 2; r >= 0; r--)
            if (!done[r]) {
                done[r] = c10d__shm_coll_progress(&x[r], &moved);
                assert_true(done[r] >= 0);
            }
    for (int r = 0; r < 3; r++)
        assert_int_equal(done[r], 1);
}

/* gather, scatter, the even all_to_all and the list form of all_gather, in
 * chunks of a few elements (slots of 152 bytes: 12 floats of every block;
 * all_to_all: 12 per pair, its 128-byte header in the slot's head room),
 * with counts that end mid-chunk. */
static void test_rooted_and_exchange_ops(void **st)
{
    (void)st;
    enum { C = 37 }; /* elements per block */
    struct c10d__shm_seg *seg[3];
    char ref[C10D_SHM_REF_MAX];
    assert_int_equal(c10d__shm_create(3, 152, &seg[0], ref, sizeof ref), 0);
    for (int r = 1; r < 3; r++)
        assert_int_equal(c10d__shm_attach(ref, 3, r, &seg[r]), 0);
    seg[1]->read_peers = 2; /* every chunk through the slots, on any host */
    static float in[3][3 * C], out[3][3 * C];
    for (int r = 0; r < 3; r++)
        for (int i = 0; i < 3 * C; i++)
            in[r][i] = (float)(r * 1000 + i);
    struct c10d__op op[3];
    uint64_t seq = 1;
    /* all_to_all: block j of rank r goes to block r of rank j. */
    memset(out, 0, sizeof out);
    for (int r = 0; r < 3; r++)
        op[r] = (struct c10d__op){.kind = C10D_OP_ALL_TO_ALL,
                                  .send = in[r],
                                  .recv = out[r],
                                  .count = 3 * C,
                                  .dtype = C10D_FLOAT32,
                                  .seq = seq};
    drive3(seg, op);
    for (int r = 0; r < 3; r++)
        for (int j = 0; j < 3; j++)
            for (int i = 0; i < C; i++)
                assert_true(out[r][j * C + i] == in[j][r * C + i]);
    /* scatter from rank 1: block r of its buffer to rank r. */
    seq++;
    memset(out, 0, sizeof out);
    for (int r = 0; r < 3; r++)
        op[r] = (struct c10d__op){.kind = C10D_OP_SCATTER,
                                  .send = r == 1 ? in[1] : NULL,
                                  .recv = out[r],
                                  .count = C,
                                  .dtype = C10D_FLOAT32,
                                  .root = 1,
                                  .seq = seq};
    drive3(seg, op);
    for (int r = 0; r < 3; r++)
        for (int i = 0; i < C; i++)
            assert_true(out[r][i] == in[1][r * C + i]);
    /* gather to rank 2: every rank's first C elements, in rank order. */
    seq++;
    memset(out, 0, sizeof out);
    for (int r = 0; r < 3; r++)
        op[r] = (struct c10d__op){.kind = C10D_OP_GATHER,
                                  .send = in[r],
                                  .recv = r == 2 ? out[2] : NULL,
                                  .count = C,
                                  .dtype = C10D_FLOAT32,
                                  .root = 2,
                                  .seq = seq};
    drive3(seg, op);
    for (int j = 0; j < 3; j++)
        for (int i = 0; i < C; i++)
            assert_true(out[2][j * C + i] == in[j][i]);
    /* Again, the root's input its own block of its output (in place). */
    seq++;
    memset(out, 0, sizeof out);
    for (int i = 0; i < C; i++)
        out[2][2 * C + i] = in[2][i];
    op[2].send = out[2] + 2 * C;
    for (int r = 0; r < 3; r++)
        op[r].seq = seq;
    drive3(seg, op);
    for (int j = 0; j < 3; j++)
        for (int i = 0; i < C; i++)
            assert_true(out[2][j * C + i] == in[j][i]);
    /* all_gather's list form: rank j's elements land in recvs[j]. */
    seq++;
    memset(out, 0, sizeof out);
    static float lists[3][3][C];
    void *recvs[3][3];
    for (int r = 0; r < 3; r++) {
        for (int j = 0; j < 3; j++)
            recvs[r][j] = lists[r][2 - j]; /* not in rank order in memory */
        op[r] = (struct c10d__op){.kind = C10D_OP_ALL_GATHER,
                                  .send = in[r],
                                  .recvs = (void *const *)recvs[r],
                                  .count = C,
                                  .dtype = C10D_FLOAT32,
                                  .seq = seq};
    }
    drive3(seg, op);
    for (int r = 0; r < 3; r++)
        for (int j = 0; j < 3; j++)
            for (int i = 0; i < C; i++)
                assert_true(lists[r][2 - j][i] == in[j][i]);
    for (int r = 2; r >= 0; r--)
        c10d__shm_free(seg[r]);
}

/* Three ranks' state machines driven in turn; each one's result (1 or < 0). */
static void drive3_status(struct c10d__shm_seg *seg[3], struct c10d__op op[3], int rc[3],
                          void *copy[3])
{
    struct c10d__fp fp;
    c10d__fp_of(&op[0], 3, &fp);
    struct c10d__shm_coll x[3];
    for (int r = 0; r < 3; r++) {
        c10d__shm_coll_start(&x[r], seg[r], &op[r], 0, &fp);
        size_t need = c10d__shm_coll_copy_bytes(&x[r]);
        assert_true((need > 0) == (copy != NULL && copy[r] != NULL));
        if (need > 0)
            c10d__shm_coll_set_copy(&x[r], copy[r]);
    }
    int moved;
    rc[0] = rc[1] = rc[2] = 0;
    for (int i = 0; i < 100000 && !(rc[0] && rc[1] && rc[2]); i++)
        for (int r = 2; r >= 0; r--)
            if (rc[r] == 0)
                rc[r] = c10d__shm_coll_progress(&x[r], &moved);
}

/* all_to_all with per-pair counts (zeros among them) in chunks of two
 * elements per pair, in place in both forms, and split sizes that disagree
 * between a sender and its receiver: every rank fails, naming the pair. */
static void test_uneven_all_to_all(void **st)
{
    (void)st;
    struct c10d__shm_seg *seg[3];
    char ref[C10D_SHM_REF_MAX];
    /* 152-byte slots: a 128-byte header (counts, then the offer to read what
     * is left after the first chunk in place), then 2 floats per pair. */
    assert_int_equal(c10d__shm_create(3, 152, &seg[0], ref, sizeof ref), 0);
    for (int r = 1; r < 3; r++)
        assert_int_equal(c10d__shm_attach(ref, 3, r, &seg[r]), 0);
    seg[1]->read_peers = 2; /* every chunk through the slots, on any host */
    size_t sc[3][3], rc_[3][3], stot[3] = {0}, rtot[3] = {0};
    for (int q = 0; q < 3; q++)
        for (int d = 0; d < 3; d++) {
            sc[q][d] = (size_t)(q * 3 + d * 5) % 7; /* 0..6: up to three chunks */
            stot[q] += sc[q][d];
        }
    for (int r = 0; r < 3; r++)
        for (int j = 0; j < 3; j++) {
            rc_[r][j] = sc[j][r];
            rtot[r] += rc_[r][j];
        }
    static float in[3][32], out[3][32];
    struct c10d__op op[3];
    int status[3];
    for (int inplace = 0; inplace < 2; inplace++) {
        for (int r = 0; r < 3; r++) {
            for (int i = 0; i < 32; i++)
                in[r][i] = (float)(r * 100 + i);
            memset(out[r], 0, sizeof out[r]);
            if (inplace)
                memcpy(out[r], in[r], sizeof out[r]);
        }
        static char copies[3][32 * sizeof(float)];
        void *copy[3] = {copies[0], copies[1], copies[2]};
        for (int r = 0; r < 3; r++)
            op[r] = (struct c10d__op){.kind = C10D_OP_ALL_TO_ALL,
                                      .send = inplace ? out[r] : in[r],
                                      .recv = out[r],
                                      .count = stot[r],
                                      .send_counts = sc[r],
                                      .recv_counts = rc_[r],
                                      .dtype = C10D_FLOAT32,
                                      .seq = 1 + (uint64_t)inplace};
        drive3_status(seg, op, status, inplace ? copy : NULL);
        for (int r = 0; r < 3; r++) {
            assert_int_equal(status[r], 1);
            size_t at = 0;
            for (int j = 0; j < 3; j++) {
                size_t from = 0; /* where block r starts in rank j's input */
                for (int d = 0; d < r; d++)
                    from += sc[j][d];
                for (size_t i = 0; i < rc_[r][j]; i++)
                    assert_true(out[r][at + i] == in[j][from + i]);
                at += rc_[r][j];
            }
        }
    }
    /* The list form, blocks in reverse order in memory, in place: each
     * block's input and output start at the same address, which needs no
     * copy (a chunk rewrites only the window it has just sent). */
    static float lists[3][3][8];
    const void *sends[3][3];
    void *recvs[3][3];
    for (int r = 0; r < 3; r++)
        for (int j = 0; j < 3; j++) {
            for (int i = 0; i < 8; i++)
                lists[r][2 - j][i] = (float)(r * 100 + j * 10 + i);
            sends[r][j] = recvs[r][j] = lists[r][2 - j];
        }
    for (int r = 0; r < 3; r++)
        op[r] = (struct c10d__op){.kind = C10D_OP_ALL_TO_ALL,
                                  .sends = (const void *const *)sends[r],
                                  .recvs = (void *const *)recvs[r],
                                  .send_counts = sc[r],
                                  .recv_counts = rc_[r],
                                  .dtype = C10D_FLOAT32,
                                  .seq = 3};
    drive3_status(seg, op, status, NULL);
    for (int r = 0; r < 3; r++) {
        assert_int_equal(status[r], 1);
        for (int j = 0; j < 3; j++)
            for (size_t i = 0; i < rc_[r][j]; i++)
                assert_true(lists[r][2 - j][i] == (float)(j * 100 + r * 10 + (int)i));
    }
    /* Rank 2 expects one element fewer from rank 0 than rank 0 sends it. */
    size_t wrong[3] = {rc_[2][0] - 1, rc_[2][1], rc_[2][2]};
    assert_true(rc_[2][0] > 0);
    for (int r = 0; r < 3; r++)
        op[r] = (struct c10d__op){.kind = C10D_OP_ALL_TO_ALL,
                                  .send = in[r],
                                  .recv = out[r],
                                  .count = stot[r],
                                  .send_counts = sc[r],
                                  .recv_counts = r == 2 ? wrong : rc_[r],
                                  .dtype = C10D_FLOAT32,
                                  .seq = 4};
    drive3_status(seg, op, status, NULL);
    for (int r = 0; r < 3; r++)
        assert_true(status[r] < 0);
    assert_non_null(strstr(c10d_last_error(), "rank 0 sends"));
    assert_non_null(strstr(c10d_last_error(), "to rank 2"));
    /* The same even split, given as a count by rank 0 and as split sizes by
     * the others: one layout, the right data everywhere. */
    size_t even[3] = {4, 4, 4};
    for (int r = 0; r < 3; r++) {
        memset(out[r], 0, sizeof out[r]);
        op[r] = (struct c10d__op){.kind = C10D_OP_ALL_TO_ALL,
                                  .send = in[r],
                                  .recv = out[r],
                                  .count = 12,
                                  .send_counts = r == 0 ? NULL : even,
                                  .recv_counts = r == 0 ? NULL : even,
                                  .dtype = C10D_FLOAT32,
                                  .seq = 5};
    }
    drive3_status(seg, op, status, NULL);
    for (int r = 0; r < 3; r++) {
        assert_int_equal(status[r], 1);
        for (int j = 0; j < 3; j++)
            for (int i = 0; i < 4; i++)
                assert_true(out[r][j * 4 + i] == in[j][r * 4 + i]);
    }
    /* Even splits of different totals: every rank fails. */
    for (int r = 0; r < 3; r++)
        op[r] = (struct c10d__op){.kind = C10D_OP_ALL_TO_ALL,
                                  .send = in[r],
                                  .recv = out[r],
                                  .count = r == 1 ? 9 : 12,
                                  .dtype = C10D_FLOAT32,
                                  .seq = 6};
    drive3_status(seg, op, status, NULL);
    for (int r = 0; r < 3; r++)
        assert_true(status[r] < 0);
    assert_non_null(strstr(c10d_last_error(), "split sizes differ"));
    for (int r = 2; r >= 0; r--)
        c10d__shm_free(seg[r]);
}

/* ------------------------------------------------- through the public API */

/* Named shared memory of ours (other files, Open MPI's or the GPU
 * simulation's, are not counted: tests run side by side). The segment is a
 * memfd and has no name; this catches a change that would give it one. */
static int count_dev_shm(void)
{
    DIR *d = opendir("/dev/shm");
    int n = 0;
    if (d == NULL)
        return 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        n += strncmp(e->d_name, "c10d-shm", 8) == 0;
    closedir(d);
    return n;
}

struct job {
    const char *slot; /* C10D_SHM_SLOT_BYTES */
    int opt_out_rank; /* this rank sets C10D_SHM=0; -1: none */
    int die;          /* every rank kills itself inside an all_reduce */
    int sleepy;       /* C10D_LOOP_SPIN_US=0: every wait sleeps; checks the doorbells */
    int crowded;      /* every rank on the same two CPUs: the loop polls longer */
};

static double cpu_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static int job_main(int rank, int n, void *arg)
{
    const struct job *j = arg;
    setenv("C10D_SHM", rank == j->opt_out_rank ? "0" : "1", 1);
    if (j->slot != NULL)
        setenv("C10D_SHM_SLOT_BYTES", j->slot, 1);
    if (j->sleepy)
        setenv("C10D_LOOP_SPIN_US", "0", 1);
    if (j->crowded) {                  /* before the loop thread starts, which inherits it */
        unsetenv("C10D_LOOP_SPIN_US"); /* the defaults: the window is on */
        unsetenv("C10D_SHM_CROWDED_SPIN_US");
        cpu_set_t all, two;
        CPU_ZERO(&two);
        MP_CHECK(sched_getaffinity(0, sizeof all, &all) == 0, "getaffinity");
        for (int c = 0, k = 0; c < CPU_SETSIZE && k < 2; c++)
            if (CPU_ISSET(c, &all) && ++k)
                CPU_SET(c, &two);
        MP_CHECK(sched_setaffinity(0, sizeof two, &two) == 0, "setaffinity");
    }
    /* libuv opens a pipe for its signal lock once per process: the
     * descriptors are counted with an engine running, before and after
     * (one started with this rank's settings, read again here). */
    c10d__env_reload();
    MP_CHECK(c10d__engine_start() == 0, "engine");
    int fds0 = count_fds();
    uint64_t bells0, falls0;
    c10d__shm_bell_counts(&bells0, &falls0);
    c10d_pg_opts po = {0};
    po.timeout_ms = 60000;
    c10d_pg *pg = NULL;
    MP_CHECK(c10d_pg_init(&po, &pg) == 0, "init: %s", c10d_last_error());
    /* One rank opting out keeps every rank's group on tcp. */
    const char *path = c10d_pg_host_path(pg);
    const char *path_want = j->opt_out_rank >= 0 ? "tcp" : "shm";
    MP_CHECK(path != NULL && strcmp(path, path_want) == 0, "path %s, want %s", path ? path : "NULL",
             path_want);
    /* Sizes around the slot and the small/large switch, odd counts: with the
     * default slot (32768 int64), 16384 is one chunk reduced whole on up to
     * 4 ranks, 20000 one chunk reduced whole on 3 but by slices on 4, 32768
     * a full slot by slices from 3 ranks on, 33768 two chunks whose second
     * (8000 bytes) is reduced whole; 24676 = 3 x 8192 + 100 the same with
     * 64 KiB slots. */
    static const size_t counts[] = {1,     3,     1023,  1024,  1025,  4097,   16384,
                                    20000, 24676, 32768, 33768, 70001, 1 << 20};
    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
        size_t c = counts[k];
        int64_t *x = malloc(c * sizeof *x);
        double *y = malloc(c * sizeof *y);
        MP_CHECK(x != NULL && y != NULL, "malloc");
        for (size_t i = 0; i < c; i++) {
            x[i] = (int64_t)(i * 3 + (size_t)rank);
            y[i] = (double)(rank + 1) * 0.5;
        }
        MP_CHECK(c10d_all_reduce_sync(pg, x, x, c, C10D_INT64, C10D_SUM) == 0, "sum: %s",
                 c10d_last_error());
        MP_CHECK(c10d_all_reduce_sync(pg, y, y, c, C10D_FLOAT64, C10D_AVG) == 0, "avg: %s",
                 c10d_last_error());
        for (size_t i = 0; i < c; i++) {
            int64_t want = (int64_t)(i * 3 * (size_t)n) + (int64_t)(n * (n - 1) / 2);
            MP_CHECK(x[i] == want, "count %zu: x[%zu] = %lld, want %lld", c, i, (long long)x[i],
                     (long long)want);
            MP_CHECK(y[i] == (double)(n + 1) / 4.0, "count %zu: y[%zu] = %g", c, i, y[i]);
        }
        free(x);
        free(y);
    }
    if (j->die) {
        float *big = calloc(1 << 22, sizeof *big);
        c10d_work *w;
        MP_CHECK(c10d_all_reduce(pg, big, big, 1 << 22, C10D_FLOAT32, C10D_SUM, NULL, &w) == 0,
                 "post");
        usleep(2000);
        raise(SIGKILL);
    }
    if (j->crowded) {
        double t0 = cpu_ms(); /* the loop polled 2 ms past each step, then sleeps */
        usleep(300 * 1000);
        double idle = cpu_ms() - t0;
        MP_CHECK(idle < 30, "an idle rank on crowded CPUs used %.1f ms of CPU in 300 ms", idle);
    }
    if (j->sleepy) {
        /* Sleepers were woken, all through their doorbells; then an idle
         * rank's loop sleeps (no CPU), and nothing is left open after. */
        float v = 1;
        for (int i = 0; i < 200; i++)
            MP_CHECK(c10d_all_reduce_sync(pg, &v, &v, 1, C10D_FLOAT32, C10D_MAX) == 0, "max: %s",
                     c10d_last_error());
        uint64_t bells, falls;
        c10d__shm_bell_counts(&bells, &falls);
        MP_CHECK(falls == falls0, "%llu sleepers rung over tcp",
                 (unsigned long long)(falls - falls0));
        MP_CHECK(bells > bells0, "no sleeper was rung");
        fprintf(stderr, "rank %d: %llu doorbell rings\n", rank,
                (unsigned long long)(bells - bells0));
        double t0 = cpu_ms();
        usleep(300 * 1000);
        double idle = cpu_ms() - t0;
        MP_CHECK(idle < 30, "an idle rank used %.1f ms of CPU in 300 ms", idle);
    }
    MP_CHECK(c10d_pg_destroy(pg) == 0, "destroy: %s", c10d_last_error());
    c10d_shutdown();
    MP_CHECK(c10d__engine_start() == 0, "engine");
    if (j->sleepy)
        MP_CHECK(count_fds() == fds0, "%d descriptors before the group, %d after shutdown", fds0,
                 count_fds());
    return 0;
}

static void run_job(const struct job *j, int nranks)
{
    assert_int_equal(count_dev_shm(), 0);
    struct mp_opts o = {0};
    o.nranks = nranks;
    o.timeout_s = 120;
    o.kill_on_failure = !j->die;
    struct mp_result res;
    int rc = mp_run(&o, job_main, (void *)j, &res);
    assert_false(res.timed_out);
    if (j->die) {
        for (int r = 0; r < nranks; r++)
            assert_int_equal(res.codes[r], 128 + SIGKILL);
    } else {
        assert_int_equal(rc, 0);
    }
    /* The segment is a memfd: nothing named is left behind, kill -9 or not. */
    assert_int_equal(count_dev_shm(), 0);
}

static void test_small_slots_3_ranks(void **st)
{
    (void)st;
    struct job j = {"4096", -1, 0, 0, 0}; /* every chunk small */
    run_job(&j, 3);
}

static void test_large_chunks_4_ranks(void **st)
{
    (void)st;
    struct job j = {"65536", -1, 0, 0, 0}; /* chunks of 8192 int64: reduce-scatter scheme */
    run_job(&j, 4);
}

static void test_default_slots_4_ranks(void **st)
{
    (void)st;
    struct job j = {NULL, -1, 0, 0, 0}; /* one chunk by slices (20000), or whole (16384) */
    run_job(&j, 4);
}

static void test_one_rank_opts_out(void **st)
{
    (void)st;
    struct job j = {NULL, 1, 0, 0, 0}; /* the group stays on tcp, and agrees on it */
    run_job(&j, 3);
}

static void test_sleeping_ranks_3(void **st)
{
    (void)st;
    struct job j = {"4096", -1, 0, 1, 0};
    run_job(&j, 3);
}

static void test_crowded_ranks_idle(void **st)
{
    (void)st;
    struct job j = {NULL, -1, 0, 0, 1};
    run_job(&j, 3);
}

static void test_every_rank_killed(void **st)
{
    (void)st;
    struct job j = {NULL, -1, 1, 0, 0};
    run_job(&j, 3);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_host_id),
        cmocka_unit_test(test_decide),
        cmocka_unit_test(test_attach_errors),
        cmocka_unit_test(test_doorbell),
        cmocka_unit_test(test_ring),
        cmocka_unit_test(test_state_machine),
        cmocka_unit_test(test_rooted_and_exchange_ops),
        cmocka_unit_test(test_uneven_all_to_all),
        cmocka_unit_test(test_small_slots_3_ranks),
        cmocka_unit_test(test_large_chunks_4_ranks),
        cmocka_unit_test(test_default_slots_4_ranks),
        cmocka_unit_test(test_one_rank_opts_out),
        cmocka_unit_test(test_sleeping_ranks_3),
        cmocka_unit_test(test_crowded_ranks_idle),
        cmocka_unit_test(test_every_rank_killed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
