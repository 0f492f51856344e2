/* Batches of P2P ops in the caller's lane (backends/tcp/p2p_lane.h,
 * c10d__tcp_p2p_lane_try_batch): real ranks, the public API. The sendrecv
 * pattern waited, polled and called back; batches whose members split
 * between the lane and the loop (sizes past the mailbox, a second message to
 * one peer, members to this very rank, long batches) matched in order with
 * single ops of the same tag, also on the rings alone; threads trading at
 * once; a deadline nobody waits for; the batch's work completed by the
 * caller; batches nobody waited for when the group ends. A batch's deadline,
 * mismatch and killed peer are test_p2p_lane's, beside the single ops'. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "backends/tcp/p2p_lane.h"
#include "c10d.h"
#include "mp_harness.h"
#include "p2p_lane_util.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAXB (40 * 1024)

static c10d_p2p_op op(c10d_p2p_kind kind, void *b, size_t n, int peer, int tag)
{
    c10d_p2p_op o = {kind, b, n, C10D_UINT8, peer, tag};
    return o;
}

static int batch(c10d_pg *pg, const c10d_p2p_op *ops, int n, const c10d_op_opts *oo, c10d_work **w)
{
    return c10d_batch_isend_irecv(pg, ops, n, oo, w);
}

/* Waits for w three ways (how % 3): a wait, a poll, a callback. */
static int finish(c10d_work *w, int how)
{
    if (how % 3 == 1) {
        double t0 = now_s();
        while (!c10d_work_test(w) && now_s() - t0 < 30)
            usleep(20);
    } else if (how % 3 == 2) {
        atomic_store(&lane_callbacks, 0);
        if (c10d_work_on_complete(w, count_cb, NULL) != 0)
            return -100;
    }
    int rc = c10d_work_wait(w, -1);
    if (rc == 0 && how % 3 == 2 && atomic_load(&lane_callbacks) != 1)
        rc = -101;
    c10d_work_release(w);
    return rc;
}

/* Sizes around the mailbox's limit (32 KiB): the mixed batches' members. */
static size_t size_of(int k)
{
    static const size_t sizes[] = {4, 32 * 1024, 0, 40000, 64, 32 * 1024 + 1, 1000, 3, 9000};
    return sizes[k % 9];
}

/* arg: 0 with the lane, 1 on the rings alone (C10D_SHM_LANE=0). */
static int pattern_main(int rank, int n, void *arg)
{
    int lane = arg == NULL || *(int *)arg == 0;
    if (!lane)
        setenv("C10D_SHM_LANE", "0", 1);
    c10d_pg *pg = lane_init(60000);
    MP_CHECK(pg != NULL, "no group");
    MP_CHECK(strcmp(c10d_pg_host_path(pg), "shm") == 0, "path %s", c10d_pg_host_path(pg));
    static unsigned char out[8][MAXB], in[8][MAXB];
    int next = (rank + 1) % n, prev = (rank + n - 1) % n;
    uint64_t s0, r0, s1, r1;
    c10d__tcp_p2p_lane_counts(&s0, &r0);

    /* 1. The sendrecv pattern (a send to the next rank, a receive from the
     * previous), either order, waited, polled and called back. */
    for (int k = 0; k < 600; k++) {
        size_t len = k % 7 == 0 ? 32 * 1024 : k % 7 == 1 ? 0 : (size_t)(4 + k % 300);
        fill(out[0], len, rank, k);
        memset(in[0], 0xee, len);
        c10d_p2p_op s = op(C10D_P2P_SEND, out[0], len, next, 3);
        c10d_p2p_op r = op(C10D_P2P_RECV, in[0], len, prev, 3);
        c10d_p2p_op ops[2] = {k % 2 ? r : s, k % 2 ? s : r};
        c10d_work *w = NULL;
        MP_CHECK(batch(pg, ops, 2, NULL, &w) == 0, "batch: %s", c10d_last_error());
        int rc = finish(w, k / 2);
        MP_CHECK(rc == 0, "sendrecv %d: %d %s", k, rc, c10d_last_error());
        MP_CHECK(good(in[0], len, prev, k), "sendrecv %d: wrong bytes", k);
    }
    c10d__tcp_p2p_lane_counts(&s1, &r1);
    fprintf(stderr, "rank %d: sendrecv: %llu sends and %llu receives in the lane\n", rank,
            (unsigned long long)(s1 - s0), (unsigned long long)(r1 - r0));
    MP_CHECK(!lane || (s1 - s0 >= 300 && r1 - r0 >= 100), "the lane carried too few batches");
    MP_CHECK(lane || (s1 == s0 && r1 == r0), "the lane is off, yet it carried messages");
    MP_CHECK(c10d_barrier_sync(pg) == 0, "barrier: %s", c10d_last_error());

    /* 2. One tag, singles and batches mixed, sizes on both sides of the
     * mailbox's limit: to the next rank a single, a batch of three (the
     * second to the same peer finds the mailbox taken), a single; from the
     * previous a batch of two, a single, a batch of two. Every message
     * meets its receive in order. */
    for (int k = 0; k < 60; k++) {
        size_t sz[5];
        for (int j = 0; j < 5; j++) {
            sz[j] = size_of(k + 2 * j);
            fill(out[j], sz[j], rank, k * 5 + j);
            memset(in[j], 0xee, sz[j]);
        }
        c10d_work *ws[3], *wr[3];
        c10d_p2p_op b3[3] = {op(C10D_P2P_SEND, out[1], sz[1], next, 9),
                             op(C10D_P2P_SEND, out[2], sz[2], next, 9),
                             op(C10D_P2P_SEND, out[3], sz[3], next, 9)};
        c10d_p2p_op ra[2] = {op(C10D_P2P_RECV, in[0], sz[0], prev, 9),
                             op(C10D_P2P_RECV, in[1], sz[1], prev, 9)};
        c10d_p2p_op rb[2] = {op(C10D_P2P_RECV, in[3], sz[3], prev, 9),
                             op(C10D_P2P_RECV, in[4], sz[4], prev, 9)};
        if (rank % 2) { /* receives first on odd ranks: posted before the sends */
            MP_CHECK(batch(pg, ra, 2, NULL, &wr[0]) == 0, "batch: %s", c10d_last_error());
            MP_CHECK(c10d_recv(pg, in[2], sz[2], C10D_UINT8, prev, 9, NULL, &wr[1]) == 0,
                     "irecv: %s", c10d_last_error());
            MP_CHECK(batch(pg, rb, 2, NULL, &wr[2]) == 0, "batch: %s", c10d_last_error());
        }
        MP_CHECK(c10d_send(pg, out[0], sz[0], C10D_UINT8, next, 9, NULL, &ws[0]) == 0, "isend: %s",
                 c10d_last_error());
        MP_CHECK(batch(pg, b3, 3, NULL, &ws[1]) == 0, "batch: %s", c10d_last_error());
        MP_CHECK(c10d_send(pg, out[4], sz[4], C10D_UINT8, next, 9, NULL, &ws[2]) == 0, "isend: %s",
                 c10d_last_error());
        if (rank % 2 == 0) {
            if (k % 3 == 0)
                usleep(300); /* some deposits wait for their receives */
            MP_CHECK(batch(pg, ra, 2, NULL, &wr[0]) == 0, "batch: %s", c10d_last_error());
            MP_CHECK(c10d_recv(pg, in[2], sz[2], C10D_UINT8, prev, 9, NULL, &wr[1]) == 0,
                     "irecv: %s", c10d_last_error());
            MP_CHECK(batch(pg, rb, 2, NULL, &wr[2]) == 0, "batch: %s", c10d_last_error());
        }
        for (int j = 2; j >= 0; j--) /* waited last to first */
            MP_CHECK(finish(wr[j], k + j) == 0, "mixed %d: receive %d: %s", k, j,
                     c10d_last_error());
        for (int j = 0; j < 5; j++)
            MP_CHECK(good(in[j], sz[j], prev, k * 5 + j), "mixed %d: message %d out of order", k,
                     j);
        for (int j = 0; j < 3; j++)
            MP_CHECK(finish(ws[j], k) == 0, "mixed %d: send %d: %s", k, j, c10d_last_error());
    }
    MP_CHECK(c10d_barrier_sync(pg) == 0, "barrier: %s", c10d_last_error());

    /* 3. Members to this very rank, first and in the middle: the loop pairs
     * them, the rest still meet their peers. */
    for (int k = 0; k < 40; k++) {
        fill(out[0], 32, rank, k);
        fill(out[1], 48, rank, 100 + k);
        memset(in[0], 0, 32);
        memset(in[1], 0, 48);
        c10d_p2p_op mid[4] = {
            op(C10D_P2P_SEND, out[0], 32, next, 5), op(C10D_P2P_SEND, out[1], 48, rank, 6),
            op(C10D_P2P_RECV, in[1], 48, rank, 6), op(C10D_P2P_RECV, in[0], 32, prev, 5)};
        c10d_p2p_op first[4] = {mid[1], mid[0], mid[3], mid[2]};
        c10d_work *w = NULL;
        MP_CHECK(batch(pg, k % 2 ? first : mid, 4, NULL, &w) == 0, "batch: %s", c10d_last_error());
        MP_CHECK(finish(w, k) == 0, "self %d: %s", k, c10d_last_error());
        MP_CHECK(good(in[0], 32, prev, k) && good(in[1], 48, rank, 100 + k), "self %d: wrong bytes",
                 k);
    }
    MP_CHECK(c10d_barrier_sync(pg) == 0, "barrier: %s", c10d_last_error());

    /* 4. Long batches (more members than the lane has parts for: the last
     * part carries the rest): 8 sends to the next rank and 8 receives from
     * the previous, one tag, interleaved; each message meets its receive. */
    for (int k = 0; k < 40; k++) {
        c10d_p2p_op ops[16];
        for (int j = 0; j < 8; j++) {
            size_t len = (size_t)(1 + (k * 7 + j * 13) % 3000);
            fill(out[j], len, rank, k * 8 + j);
            memset(in[j], 0xee, len);
            ops[2 * j] = op(C10D_P2P_SEND, out[j], len, next, 14);
            ops[2 * j + 1] = op(C10D_P2P_RECV, in[j], len, prev, 14);
        }
        c10d_work *w = NULL;
        MP_CHECK(batch(pg, ops, 16, NULL, &w) == 0, "batch: %s", c10d_last_error());
        MP_CHECK(finish(w, k) == 0, "long %d: %s", k, c10d_last_error());
        for (int j = 0; j < 8; j++)
            MP_CHECK(good(in[j], (size_t)(1 + (k * 7 + j * 13) % 3000), prev, k * 8 + j),
                     "long %d: message %d out of order", k, j);
    }
    MP_CHECK(c10d_barrier_sync(pg) == 0, "barrier: %s", c10d_last_error());
    c10d_pg_destroy(pg);
    c10d_shutdown();
    return 0;
}

/* Nobody waits on a batch whose receive (in the mailbox) and large send (on
 * the loop) meet no peer: its deadline still fires (a part on the loop has
 * it), the group fails, and a later call says why. */
static int unwaited_main(int rank, int n, void *arg)
{
    (void)n;
    (void)arg;
    c10d_pg *pg = lane_init(60000);
    MP_CHECK(pg != NULL, "no group");
    MP_CHECK(c10d_barrier_sync(pg) == 0, "barrier: %s", c10d_last_error());
    if (rank == 0) {
        static unsigned char a[40000], b[16];
        c10d_op_opts oo = {0};
        oo.timeout_ms = 500;
        c10d_p2p_op ops[2] = {op(C10D_P2P_RECV, b, 16, 1, 1), op(C10D_P2P_SEND, a, 40000, 1, 2)};
        c10d_work *w = NULL;
        MP_CHECK(batch(pg, ops, 2, &oo, &w) == 0, "batch: %s", c10d_last_error());
        sleep(2);
        c10d_work *bw = NULL;
        int rc = c10d_barrier(pg, NULL, &bw);
        if (rc == 0)
            rc = c10d_work_wait_release(bw);
        MP_CHECK(rc != 0, "the group went on past a batch's deadline");
        fprintf(stderr, "rank 0: after the deadline: %s\n", c10d_last_error());
        MP_CHECK(strstr(c10d_last_error(), "timeout") != NULL ||
                     strstr(c10d_last_error(), "timed out") != NULL,
                 "not the deadline: %s", c10d_last_error());
        MP_CHECK(c10d_work_wait(w, -1) == C10D_ETIMEDOUT, "batch: %s", c10d_last_error());
        c10d_work_release(w);
    } else {
        sleep(3);
    }
    c10d_pg_abort(pg, "test over");
    c10d_shutdown();
    return 0;
}

/* The caller completes a batch's work itself while its parts run (one in
 * the mailbox, one on the loop): the parts stop, the group fails as for a
 * single op completed outside its backend, nothing hangs or is used after
 * the caller's records went. */
static int outside_main(int rank, int n, void *arg)
{
    (void)n;
    (void)arg;
    c10d_pg *pg = lane_init(20000);
    MP_CHECK(pg != NULL, "no group");
    MP_CHECK(c10d_barrier_sync(pg) == 0, "barrier: %s", c10d_last_error());
    if (rank == 0) {
        static unsigned char a[40000], b[16];
        c10d_p2p_op ops[2] = {op(C10D_P2P_RECV, b, 16, 1, 1), op(C10D_P2P_SEND, a, 40000, 1, 2)};
        c10d_work *w = NULL;
        MP_CHECK(batch(pg, ops, 2, NULL, &w) == 0, "batch: %s", c10d_last_error());
        usleep(100 * 1000);
        /* Success: the group does not fail for the work's status, only
         * for the parts the backend still ran. */
        MP_CHECK(c10d_work_complete(w, 0, NULL) == 1, "complete: %s", c10d_last_error());
        MP_CHECK(c10d_work_wait(w, -1) == 0, "batch: %s", c10d_last_error());
        c10d_work_release(w);
        double t0 = now_s();
        c10d_work *bw = NULL;
        int rc = c10d_barrier(pg, NULL, &bw);
        if (rc == 0)
            rc = c10d_work_wait_release(bw);
        MP_CHECK(rc != 0, "the group went on after a batch's work was completed outside");
        MP_CHECK(now_s() - t0 < 10, "the failure took %.1f s", now_s() - t0);
        MP_CHECK(strstr(c10d_last_error(), "outside") != NULL, "not the parts' failure: %s",
                 c10d_last_error());
        fprintf(stderr, "rank 0: then: %s\n", c10d_last_error());
    } else {
        sleep(2);
    }
    c10d_pg_abort(pg, "test over");
    c10d_shutdown();
    return 0;
}

/* As above, with this thread already waiting on the batch's work when
 * another one completes it: the wait ends within moments, not at the
 * deadline. */
static void *complete_later(void *w)
{
    usleep(200 * 1000);
    c10d_work_complete(w, 0, NULL);
    return NULL;
}

static int outside_waited_main(int rank, int n, void *arg)
{
    (void)n;
    (void)arg;
    setenv("C10D_SHM_LANE_SPIN_US", "60000000", 1);
    c10d_pg *pg = lane_init(20000);
    MP_CHECK(pg != NULL, "no group");
    MP_CHECK(c10d_barrier_sync(pg) == 0, "barrier: %s", c10d_last_error());
    if (rank == 0) {
        static unsigned char a[16], b[16];
        c10d_p2p_op ops[2] = {op(C10D_P2P_RECV, b, 16, 1, 1), op(C10D_P2P_SEND, a, 16, 1, 2)};
        c10d_work *w = NULL;
        MP_CHECK(batch(pg, ops, 2, NULL, &w) == 0, "batch: %s", c10d_last_error());
        pthread_t th;
        MP_CHECK(pthread_create(&th, NULL, complete_later, w) == 0, "pthread_create");
        double t0 = now_s();
        int rc = c10d_work_wait(w, -1);
        double took = now_s() - t0;
        pthread_join(th, NULL);
        MP_CHECK(rc == 0, "batch: %s", c10d_last_error());
        MP_CHECK(took < 3, "the waiter saw the completion after %.1f s", took);
        fprintf(stderr, "rank 0: the waiter let go after %.2f s\n", took);
        c10d_work_release(w);
    } else {
        sleep(6); /* its abort would end rank 0's batch: not before rank 0 checked */
    }
    c10d_pg_abort(pg, "test over");
    c10d_shutdown();
    return 0;
}

/* Three threads per rank, each trading with the other rank on a tag of its
 * own: singles and batches, sizes on both sides of the mailbox's limit, all
 * at once on one group. Per tag the order holds and the bytes are right
 * (the lane's counts are checked again under its mutex for this). How much
 * the lane carries varies from run to run (any thread's op on the loop
 * closes it to all), so it is printed, not checked. */
struct thread_arg {
    c10d_pg *pg;
    int rank, tag, fails;
    char why[256];
};

static void *trader(void *p)
{
    struct thread_arg *a = p;
    static _Thread_local unsigned char out[2][MAXB], in[2][MAXB];
    int other = 1 - a->rank;
    for (int k = 0; k < 300 && a->fails == 0; k++) {
        size_t n0 = k % 25 == 24 ? 20000 : (size_t)(8 + (k * 37 + a->tag) % 4000);
        size_t n1 = (size_t)(1 + (k * 11) % 900);
        fill(out[0], n0, a->rank, k * 2 + a->tag);
        fill(out[1], n1, a->rank, k * 2 + 1 + a->tag);
        c10d_work *w[3] = {NULL, NULL, NULL};
        int rc = 0;
        if (k % 2) { /* a batch each way */
            c10d_p2p_op ops[4] = {op(C10D_P2P_SEND, out[0], n0, other, a->tag),
                                  op(C10D_P2P_SEND, out[1], n1, other, a->tag),
                                  op(C10D_P2P_RECV, in[0], n0, other, a->tag),
                                  op(C10D_P2P_RECV, in[1], n1, other, a->tag)};
            rc = batch(a->pg, ops, 4, NULL, &w[0]);
        } else { /* singles: rank 0 sends first, rank 1 receives first */
            for (int j = 0; j < 2 && rc == 0; j++) {
                int send_first = a->rank == 0;
                rc = send_first ? c10d_send(a->pg, out[j], j ? n1 : n0, C10D_UINT8, other, a->tag,
                                            NULL, &w[j])
                                : c10d_recv(a->pg, in[j], j ? n1 : n0, C10D_UINT8, other, a->tag,
                                            NULL, &w[j]);
            }
            for (int j = 0; j < 2 && rc == 0; j++) {
                if ((rc = c10d_work_wait_release(w[j])) != 0)
                    break;
                w[j] = NULL;
            }
            if (rc == 0) {
                c10d_p2p_op back[2] = {a->rank == 0 ? op(C10D_P2P_RECV, in[0], n0, other, a->tag)
                                                    : op(C10D_P2P_SEND, out[0], n0, other, a->tag),
                                       a->rank == 0 ? op(C10D_P2P_RECV, in[1], n1, other, a->tag)
                                                    : op(C10D_P2P_SEND, out[1], n1, other, a->tag)};
                rc = batch(a->pg, back, 2, NULL, &w[0]);
            }
        }
        if (rc == 0 && w[0] != NULL)
            rc = c10d_work_wait_release(w[0]);
        if (rc != 0) {
            snprintf(a->why, sizeof a->why, "tag %d, round %d: %s", a->tag, k, c10d_last_error());
            a->fails++;
            break;
        }
        if (!good(in[0], n0, other, k * 2 + a->tag) ||
            !good(in[1], n1, other, k * 2 + 1 + a->tag)) {
            snprintf(a->why, sizeof a->why, "tag %d, round %d: wrong bytes", a->tag, k);
            a->fails++;
        }
    }
    return NULL;
}

static int threads_main(int rank, int n, void *arg)
{
    (void)n;
    (void)arg;
    c10d_pg *pg = lane_init(60000);
    MP_CHECK(pg != NULL, "no group");
    MP_CHECK(c10d_barrier_sync(pg) == 0, "barrier: %s", c10d_last_error());
    uint64_t s0, r0, s1, r1;
    c10d__tcp_p2p_lane_counts(&s0, &r0);
    pthread_t th[3];
    struct thread_arg args[3];
    for (int t = 0; t < 3; t++) {
        args[t] = (struct thread_arg){pg, rank, 20 + t, 0, ""};
        MP_CHECK(pthread_create(&th[t], NULL, trader, &args[t]) == 0, "pthread_create");
    }
    for (int t = 0; t < 3; t++)
        pthread_join(th[t], NULL);
    for (int t = 0; t < 3; t++)
        MP_CHECK(args[t].fails == 0, "thread %d: %s", t, args[t].why);
    c10d__tcp_p2p_lane_counts(&s1, &r1);
    fprintf(stderr, "rank %d: threads: %llu sends and %llu receives in the lane\n", rank,
            (unsigned long long)(s1 - s0), (unsigned long long)(r1 - r0));
    MP_CHECK(c10d_barrier_sync(pg) == 0, "barrier: %s", c10d_last_error());
    c10d_pg_destroy(pg);
    c10d_shutdown();
    return 0;
}

/* Batches nobody waited for when the group ends gracefully: the ones that
 * met their peers complete with the destroy at once, bytes delivered; one
 * that met nobody fails at an abort. */
static int abandon_main(int rank, int n, void *arg)
{
    (void)n;
    int graceful = *(int *)arg;
    c10d_pg *pg = lane_init(20000);
    MP_CHECK(pg != NULL, "no group");
    unsigned char b[2][16], c[2][16];
    fill(c[0], 16, rank, 5);
    fill(c[1], 16, rank, 6);
    int other = 1 - rank;
    c10d_p2p_op rs[2] = {op(C10D_P2P_RECV, b[0], 16, other, 1),
                         op(C10D_P2P_RECV, b[1], 16, other, 2)};
    c10d_p2p_op ss[2] = {op(C10D_P2P_SEND, c[0], 16, other, 1),
                         op(C10D_P2P_SEND, c[1], 16, other, 2)};
    c10d_work *r = NULL, *s = NULL;
    MP_CHECK(c10d_barrier_sync(pg) == 0, "barrier: %s", c10d_last_error());
    MP_CHECK(batch(pg, rs, 2, NULL, &r) == 0, "batch: %s", c10d_last_error());
    MP_CHECK(c10d_barrier_sync(pg) == 0, "barrier: %s", c10d_last_error());
    if (graceful || rank == 0)
        MP_CHECK(batch(pg, ss, 2, NULL, &s) == 0, "batch: %s", c10d_last_error());
    MP_CHECK(c10d_barrier_sync(pg) == 0, "barrier: %s", c10d_last_error());
    double t0 = now_s();
    if (graceful)
        c10d_pg_destroy(pg);
    else
        c10d_pg_abort(pg, "abandoned");
    double took = now_s() - t0;
    if (graceful) {
        MP_CHECK(took < 10, "the destroy waited %.1f s for batches that were done", took);
        MP_CHECK(c10d_work_wait(r, -1) == 0, "receives: %s", c10d_last_error());
        MP_CHECK(c10d_work_wait(s, -1) == 0, "sends: %s", c10d_last_error());
        MP_CHECK(good(b[0], 16, other, 5) && good(b[1], 16, other, 6), "wrong bytes");
    } else if (rank == 0) {
        MP_CHECK(c10d_work_wait(r, -1) != 0, "receives nobody sent to succeeded");
        fprintf(stderr, "rank 0: receives: %s\n", c10d_work_message(r));
    }
    c10d_work_release(r);
    if (s != NULL)
        c10d_work_release(s);
    c10d_shutdown();
    return 0;
}

static void test_pattern_2_ranks(void **st)
{
    (void)st;
    lane_run(pattern_main, NULL, 2, NULL);
}

static void test_pattern_2_ranks_rings(void **st)
{
    (void)st;
    /* The same order through the rings alone: a message still arriving that
     * one receive claimed is not taken again by the next. */
    int rings = 1;
    lane_run(pattern_main, &rings, 2, NULL);
}

static void test_pattern_3_ranks(void **st)
{
    (void)st;
    lane_run(pattern_main, NULL, 3, NULL);
}

static void test_pattern_4_ranks_short_spin(void **st)
{
    (void)st;
    /* Waiters give up at once: every hand-over to the loop is taken. */
    lane_run(pattern_main, NULL, 4, "1");
}

static void test_threads(void **st)
{
    (void)st;
    lane_run(threads_main, NULL, 2, NULL);
}

static void test_unwaited_deadline(void **st)
{
    (void)st;
    lane_run(unwaited_main, NULL, 2, NULL);
}

static void test_completed_outside(void **st)
{
    (void)st;
    lane_run(outside_main, NULL, 2, NULL);
}

static void test_completed_outside_waited(void **st)
{
    (void)st;
    lane_run(outside_waited_main, NULL, 2, NULL);
}

static void test_abandoned_abort(void **st)
{
    (void)st;
    int graceful = 0;
    lane_run(abandon_main, &graceful, 2, NULL);
}

static void test_abandoned_destroy(void **st)
{
    (void)st;
    int graceful = 1;
    lane_run(abandon_main, &graceful, 2, NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pattern_2_ranks),   cmocka_unit_test(test_pattern_2_ranks_rings),
        cmocka_unit_test(test_pattern_3_ranks),   cmocka_unit_test(test_pattern_4_ranks_short_spin),
        cmocka_unit_test(test_threads),           cmocka_unit_test(test_unwaited_deadline),
        cmocka_unit_test(test_completed_outside), cmocka_unit_test(test_completed_outside_waited),
        cmocka_unit_test(test_abandoned_abort),   cmocka_unit_test(test_abandoned_destroy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
