/* P2P in the caller's lane (backends/tcp/p2p_lane.h): small sends and
 * receives between ranks of one host carried through the pair's mailbox by
 * the callers' threads, and matched in order with everything that takes the
 * tcp path. Real ranks (processes), the public API: order across both paths
 * (sizes on both sides of the mailbox's limit, one tag, tags received out of
 * order, any-source), every way a parked op leaves the lane (its waiter, a
 * poll, a callback, a later receive, the waiter's spin limit, the deadline,
 * the group's end), and, for single ops and a batch alike, the deadline, a
 * mismatch and a peer killed mid-op. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "backends/shm/mailbox.h"
#include "backends/tcp/p2p_lane.h"
#include "c10d.h"
#include "mp_harness.h"
#include "p2p_lane_util.h"

#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAXB (64 * 1024)

/* Message k's size: mostly mailbox-sized, every fifth past its limit. */
static size_t size_of(int k)
{
    static const size_t sizes[] = {4, 1000, 32 * 1024, 40000, 0, 64, 3, 32 * 1024 + 1, 512, 8};
    return sizes[k % 10];
}

static int sendb(c10d_pg *pg, const void *b, size_t n, int to, int tag, c10d_work **w)
{
    return c10d_send(pg, b, n, C10D_UINT8, to, tag, NULL, w);
}

static int recvb(c10d_pg *pg, void *b, size_t n, int from, int tag, c10d_work **w)
{
    return c10d_recv(pg, b, n, C10D_UINT8, from, tag, NULL, w);
}

static int order_main(int rank, int n, void *arg)
{
    (void)arg;
    c10d_pg *pg = lane_init(60000);
    MP_CHECK(pg != NULL, "no group");
    MP_CHECK(strcmp(c10d_pg_host_path(pg), "shm") == 0, "path %s", c10d_pg_host_path(pg));
    static unsigned char out[40][MAXB], in[40][MAXB];
    uint64_t s0, r0, s1, r1;
    c10d__tcp_p2p_lane_counts(&s0, &r0);
    int peer = rank ^ 1;

    /* 1. Ping-pong between ranks 2k and 2k+1: blocking single ops. */
    if (peer < n) {
        for (int k = 0; k < 300; k++) {
            size_t len = k % 3 == 0 ? 4 : 256;
            fill(out[0], len, rank, k);
            memset(in[0], 0, len);
            c10d_work *w = NULL;
            if (rank % 2 == 0) {
                MP_CHECK(sendb(pg, out[0], len, peer, 5, &w) == 0, "send: %s", c10d_last_error());
                MP_CHECK(c10d_work_wait_release(w) == 0, "send %d: %s", k, c10d_last_error());
                MP_CHECK(recvb(pg, in[0], len, peer, 5, &w) == 0, "recv: %s", c10d_last_error());
                MP_CHECK(c10d_work_wait_release(w) == 0, "recv %d: %s", k, c10d_last_error());
            } else {
                MP_CHECK(recvb(pg, in[0], len, peer, 5, &w) == 0, "recv: %s", c10d_last_error());
                MP_CHECK(c10d_work_wait_release(w) == 0, "recv %d: %s", k, c10d_last_error());
                MP_CHECK(sendb(pg, out[0], len, peer, 5, &w) == 0, "send: %s", c10d_last_error());
                MP_CHECK(c10d_work_wait_release(w) == 0, "send %d: %s", k, c10d_last_error());
            }
            MP_CHECK(good(in[0], len, peer, k), "ping-pong %d: wrong bytes", k);
        }
    }
    MP_CHECK(c10d_barrier_sync(pg) == 0, "barrier: %s", c10d_last_error());
    c10d__tcp_p2p_lane_counts(&s1, &r1);
    fprintf(stderr, "rank %d: ping-pong: %llu sends and %llu receives in the lane\n", rank,
            (unsigned long long)(s1 - s0), (unsigned long long)(r1 - r0));
    MP_CHECK(peer >= n || (s1 > s0 && r1 > r0), "the lane carried nothing");

    /* The mailbox's limit: a message of its size goes through it, one byte
     * more takes the tcp path. */
    for (int k = 0; k < 2; k++) {
        size_t len = C10D_SHM_MAILBOX_BYTES + (size_t)k;
        uint64_t sa, ra, sb, rb;
        MP_CHECK(c10d_barrier_sync(pg) == 0, "barrier: %s", c10d_last_error());
        c10d__tcp_p2p_lane_counts(&sa, &ra);
        c10d_work *w = NULL;
        if (peer < n && rank % 2 == 0) {
            fill(out[0], len, rank, 1000 + k);
            MP_CHECK(sendb(pg, out[0], len, peer, 6, &w) == 0, "send: %s", c10d_last_error());
            MP_CHECK(c10d_work_wait_release(w) == 0, "send %zu: %s", len, c10d_last_error());
        } else if (peer < n) {
            memset(in[0], 0, len);
            MP_CHECK(recvb(pg, in[0], len, peer, 6, &w) == 0, "recv: %s", c10d_last_error());
            MP_CHECK(c10d_work_wait_release(w) == 0, "recv %zu: %s", len, c10d_last_error());
            MP_CHECK(good(in[0], len, peer, 1000 + k), "%zu bytes: wrong bytes", len);
        }
        c10d__tcp_p2p_lane_counts(&sb, &rb);
        MP_CHECK(peer >= n || rank % 2 == 1 || sb - sa == (k == 0 ? 1u : 0u),
                 "a send of %zu bytes took the lane %llu times", len,
                 (unsigned long long)(sb - sa));
    }

    /* 2. One tag, 40 messages in flight from rank 0 to rank 1 and back, of
     * sizes on both sides of the mailbox's limit: received in order, some
     * receives posted late, some early. The second time, rank 1 first holds
     * a send on its loop (not matched until the end), so its receives all
     * go to its loop, behind the frames rank 0 sent after its deposit. */
    for (int held = 0; held < 2 && rank < 2; held++) {
        c10d_work *ws[40], *wr[40], *big = NULL;
        if (held && rank == 1)
            MP_CHECK(sendb(pg, out[39], 40000, 0, 8, &big) == 0, "isend: %s", c10d_last_error());
        if (rank == 1)
            usleep(20000); /* rank 0's first sends find no receive */
        for (int k = 0; k < 40; k++) {
            fill(out[k], size_of(k), rank, k);
            MP_CHECK(sendb(pg, out[k], size_of(k), 1 - rank, 9, &ws[k]) == 0, "isend %d: %s", k,
                     c10d_last_error());
            if (k % 7 == 3)
                usleep(1000);
        }
        for (int k = 0; k < 40; k++) {
            memset(in[k], 0xee, size_of(k));
            MP_CHECK(recvb(pg, in[k], size_of(k), 1 - rank, 9, &wr[k]) == 0, "irecv %d: %s", k,
                     c10d_last_error());
        }
        for (int k = 39; k >= 0; k--) { /* waited last to first */
            MP_CHECK(c10d_work_wait_release(wr[k]) == 0, "recv %d: %s", k, c10d_last_error());
            MP_CHECK(good(in[k], size_of(k), 1 - rank, k), "burst %d: message %d out of order",
                     held, k);
        }
        for (int k = 0; k < 40; k++)
            MP_CHECK(c10d_work_wait_release(ws[k]) == 0, "send %d: %s", k, c10d_last_error());
        if (held && rank == 0) {
            c10d_work *w = NULL;
            MP_CHECK(recvb(pg, in[0], 40000, 1, 8, &w) == 0, "irecv: %s", c10d_last_error());
            MP_CHECK(c10d_work_wait_release(w) == 0, "recv: %s", c10d_last_error());
        }
        if (big != NULL)
            MP_CHECK(c10d_work_wait_release(big) == 0, "send: %s", c10d_last_error());
        uint64_t s2, r2;
        c10d__tcp_p2p_lane_counts(&s2, &r2);
        fprintf(stderr, "rank %d: one tag (%s): %llu sends and %llu receives in the lane\n", rank,
                held ? "a send held" : "free", (unsigned long long)(s2 - s1),
                (unsigned long long)(r2 - r1));
        s1 = s2;
        r1 = r2;
    }
    MP_CHECK(c10d_barrier_sync(pg) == 0, "barrier: %s", c10d_last_error());

    /* 3. Tags received in the other order: rank 0 sends tag 1 then tag 2,
     * rank 1 asks for tag 2 first; each receive still gets its own. */
    if (rank < 2) {
        for (int k = 0; k < 50; k++) {
            c10d_work *a = NULL, *b = NULL;
            if (rank == 0) {
                fill(out[0], 8, 0, 1000 + k);
                fill(out[1], 8, 0, 2000 + k);
                MP_CHECK(sendb(pg, out[0], 8, 1, 1, &a) == 0, "isend: %s", c10d_last_error());
                MP_CHECK(sendb(pg, out[1], 8, 1, 2, &b) == 0, "isend: %s", c10d_last_error());
            } else {
                MP_CHECK(recvb(pg, in[1], 8, 0, 2, &b) == 0, "irecv: %s", c10d_last_error());
                if (k % 2)
                    usleep(200);
                MP_CHECK(recvb(pg, in[0], 8, 0, 1, &a) == 0, "irecv: %s", c10d_last_error());
            }
            MP_CHECK(c10d_work_wait_release(b) == 0, "tag 2 %d: %s", k, c10d_last_error());
            MP_CHECK(c10d_work_wait_release(a) == 0, "tag 1 %d: %s", k, c10d_last_error());
            MP_CHECK(rank == 0 || (good(in[0], 8, 0, 1000 + k) && good(in[1], 8, 0, 2000 + k)),
                     "tags crossed at %d", k);
        }
    }
    MP_CHECK(c10d_barrier_sync(pg) == 0, "barrier: %s", c10d_last_error());

    /* 4. Any source: rank 0 receives from every other rank, each sending
     * small messages in order; per source they arrive in order. */
    if (n > 2) {
        int next[MP_MAX_RANKS] = {0};
        if (rank == 0) {
            for (int k = 0; k < 20 * (n - 1); k++) {
                c10d_work *w = NULL;
                MP_CHECK(recvb(pg, in[0], 64, C10D_ANY_SOURCE, 3, &w) == 0, "irecv: %s",
                         c10d_last_error());
                MP_CHECK(c10d_work_wait(w, -1) == 0, "any %d: %s", k, c10d_last_error());
                int from = c10d_work_source_rank(w);
                c10d_work_release(w);
                MP_CHECK(from > 0 && from < n, "source %d", from);
                MP_CHECK(good(in[0], 64, from, next[from]), "from %d: message %d out of order",
                         from, next[from]);
                next[from]++;
            }
        } else {
            for (int k = 0; k < 20; k++) {
                fill(out[0], 64, rank, k);
                c10d_work *w = NULL;
                MP_CHECK(sendb(pg, out[0], 64, 0, 3, &w) == 0, "send: %s", c10d_last_error());
                MP_CHECK(c10d_work_wait_release(w) == 0, "send %d: %s", k, c10d_last_error());
            }
        }
    }
    MP_CHECK(c10d_barrier_sync(pg) == 0, "barrier: %s", c10d_last_error());

    /* 5. A receive polled to completion, and one with a callback: both
     * leave the lane for the loop. */
    for (int cb = 0; cb < 2 && peer < n; cb++) {
        c10d_work *w = NULL;
        if (rank % 2 == 1) {
            atomic_store(&lane_callbacks, 0);
            MP_CHECK(recvb(pg, in[0], 32, peer, 4, &w) == 0, "irecv: %s", c10d_last_error());
            if (cb)
                MP_CHECK(c10d_work_on_complete(w, count_cb, NULL) == 0, "callback: %s",
                         c10d_last_error());
            double t0 = now_s();
            while (!c10d_work_test(w) && now_s() - t0 < 30)
                usleep(100);
            MP_CHECK(c10d_work_status(w) == 0, "polled: %s", c10d_work_message(w));
            MP_CHECK(c10d_work_wait(w, -1) == 0, "wait: %s", c10d_last_error());
            MP_CHECK(!cb || atomic_load(&lane_callbacks) == 1, "the callback ran %d times",
                     atomic_load(&lane_callbacks));
            c10d_work_release(w);
            MP_CHECK(good(in[0], 32, peer, 77 + cb), "polled: wrong bytes");
        } else {
            fill(out[0], 32, rank, 77 + cb);
            usleep(5000);
            MP_CHECK(sendb(pg, out[0], 32, peer, 4, &w) == 0, "send: %s", c10d_last_error());
            MP_CHECK(c10d_work_wait_release(w) == 0, "send: %s", c10d_last_error());
        }
    }
    MP_CHECK(c10d_barrier_sync(pg) == 0, "barrier: %s", c10d_last_error());

    /* 6. Any source from deposits: every other rank deposits one message for
     * rank 0 before a barrier; rank 0's receives from any source then take
     * them in the lane, each naming its sender, every sender once. */
    for (int round = 0; round < 20; round++) {
        c10d_work *w = NULL;
        if (rank != 0) {
            fill(out[0], 48, rank, 500 + round);
            MP_CHECK(sendb(pg, out[0], 48, 0, 6, &w) == 0, "isend: %s", c10d_last_error());
        }
        MP_CHECK(c10d_barrier_sync(pg) == 0, "barrier: %s", c10d_last_error());
        if (rank == 0) {
            uint64_t s2, r2, s3, r3;
            c10d__tcp_p2p_lane_counts(&s2, &r2);
            int seen[MP_MAX_RANKS] = {0};
            for (int k = 1; k < n; k++) {
                MP_CHECK(recvb(pg, in[0], 64, C10D_ANY_SOURCE, 6, &w) == 0, "irecv: %s",
                         c10d_last_error());
                MP_CHECK(c10d_work_wait(w, -1) == 0, "any %d: %s", k, c10d_last_error());
                int from = c10d_work_source_rank(w);
                c10d_work_release(w);
                MP_CHECK(from > 0 && from < n && !seen[from], "source %d", from);
                seen[from] = 1;
                MP_CHECK(good(in[0], 48, from, 500 + round), "any source: wrong bytes from %d",
                         from);
            }
            c10d__tcp_p2p_lane_counts(&s3, &r3);
            MP_CHECK(r3 - r2 == (uint64_t)(n - 1), "round %d: %llu of %d receives in the lane",
                     round, (unsigned long long)(r3 - r2), n - 1);
        } else {
            MP_CHECK(c10d_work_wait_release(w) == 0, "send: %s", c10d_last_error());
        }
        /* No rank deposits the next round's message before this one's are in. */
        MP_CHECK(c10d_barrier_sync(pg) == 0, "barrier: %s", c10d_last_error());
    }

    /* 7. Any source with several messages of a sender outstanding: each other
     * rank sends 8 without waiting (the first may sit in the mailbox while
     * the next take the tcp path behind it); rank 0's receives from any
     * source, waited one by one or three at a time, get each sender's in
     * order. */
    for (int round = 0; round < 30; round++) {
        c10d_work *ws[8];
        if (rank != 0) {
            for (int k = 0; k < 8; k++) {
                fill(out[k], 40, rank, 600 + k);
                MP_CHECK(sendb(pg, out[k], 40, 0, 7, &ws[k]) == 0, "isend: %s", c10d_last_error());
            }
            for (int k = 0; k < 8; k++)
                MP_CHECK(c10d_work_wait_release(ws[k]) == 0, "send %d: %s", k, c10d_last_error());
        } else {
            int next[MP_MAX_RANKS] = {0}, total = 8 * (n - 1);
            for (int k = 0; k < total;) {
                int batch = round % 2 ? 3 : 1;
                if (batch > total - k)
                    batch = total - k;
                c10d_work *wr[3];
                for (int j = 0; j < batch; j++)
                    MP_CHECK(recvb(pg, in[j], 64, C10D_ANY_SOURCE, 7, &wr[j]) == 0, "irecv: %s",
                             c10d_last_error());
                for (int j = 0; j < batch; j++, k++) {
                    MP_CHECK(c10d_work_wait(wr[j], -1) == 0, "any %d: %s", k, c10d_last_error());
                    int from = c10d_work_source_rank(wr[j]);
                    c10d_work_release(wr[j]);
                    MP_CHECK(from > 0 && from < n && next[from] < 8, "source %d", from);
                    MP_CHECK(good(in[j], 40, from, 600 + next[from]),
                             "round %d: from %d: message %d out of order", round, from, next[from]);
                    next[from]++;
                }
            }
        }
        MP_CHECK(c10d_barrier_sync(pg) == 0, "barrier: %s", c10d_last_error());
    }
    c10d_pg_destroy(pg);
    c10d_shutdown();
    return 0;
}

/* A receive nobody waits for yet, while its message takes the tcp path (the
 * sender holds another op on its loop): the receiver's loop matches it on
 * its own, so the sender's send completes and both reach the barrier.
 * arg 0: the receive is posted in the mailbox before the frames come (they
 * take it back); 1: after they came (the receive sees them, and does not
 * post). */
static int parked_main(int rank, int n, void *arg)
{
    (void)n;
    int late = *(int *)arg;
    c10d_pg *pg = lane_init(5000);
    MP_CHECK(pg != NULL, "no group");
    static unsigned char big[40000], small[16];
    c10d_work *wb = NULL, *ws = NULL;
    for (int k = 0; k < 20; k++) {
        if (rank == 1 && !late)
            MP_CHECK(recvb(pg, small, 16, 0, 9, &ws) == 0, "irecv: %s", c10d_last_error());
        MP_CHECK(c10d_barrier_sync(pg) == 0, "barrier 1: %s", c10d_last_error());
        if (rank == 0) {
            fill(big, sizeof big, 0, k);
            fill(small, 16, 0, k + 1);
            MP_CHECK(sendb(pg, big, sizeof big, 1, 8, &wb) == 0, "isend: %s", c10d_last_error());
            MP_CHECK(sendb(pg, small, 16, 1, 9, &ws) == 0, "isend: %s", c10d_last_error());
            MP_CHECK(c10d_work_wait_release(ws) == 0, "small send %d: %s", k, c10d_last_error());
        } else if (late) {
            usleep(20000);
            MP_CHECK(recvb(pg, small, 16, 0, 9, &ws) == 0, "irecv: %s", c10d_last_error());
        }
        MP_CHECK(c10d_barrier_sync(pg) == 0, "barrier 2 (%d): %s", k, c10d_last_error());
        if (rank == 1) {
            MP_CHECK(c10d_work_wait_release(ws) == 0, "small recv %d: %s", k, c10d_last_error());
            MP_CHECK(recvb(pg, big, sizeof big, 0, 8, &wb) == 0, "irecv: %s", c10d_last_error());
            MP_CHECK(good(small, 16, 0, k + 1), "small %d: wrong bytes", k);
        }
        MP_CHECK(c10d_work_wait_release(wb) == 0, "big %d: %s", k, c10d_last_error());
        MP_CHECK(rank == 0 || good(big, sizeof big, 0, k), "big %d: wrong bytes", k);
    }
    c10d_pg_destroy(pg);
    c10d_shutdown();
    return 0;
}

/* Receives on the loop meet messages that went the other way: an
 * any-source receive posted before a deposit it alone can take (the loop
 * looks at the mailboxes while receives are posted there), and two
 * receives for one tag, the first posted in the mailbox, the second on the
 * loop, while the sender's messages take the tcp path: they match in the
 * order they were called. */
static int loop_main(int rank, int n, void *arg)
{
    (void)n;
    (void)arg;
    c10d_pg *pg = lane_init(5000);
    MP_CHECK(pg != NULL, "no group");
    static unsigned char big[40000], a[16], b[16];
    double waited = 0;
    for (int k = 0; k < 20; k++) {
        c10d_work *w1 = NULL, *w2 = NULL, *wb = NULL;
        if (rank == 1)
            MP_CHECK(recvb(pg, a, 16, C10D_ANY_SOURCE, 3, &w1) == 0, "irecv: %s",
                     c10d_last_error());
        MP_CHECK(c10d_barrier_sync(pg) == 0, "barrier: %s", c10d_last_error());
        double t0 = now_s();
        if (rank == 0) {
            if (k % 2)
                usleep(5000); /* rank 1's loop sleeps: the deposit wakes it */
            fill(a, 16, 0, k);
            MP_CHECK(sendb(pg, a, 16, 1, 3, &w1) == 0, "isend: %s", c10d_last_error());
        }
        MP_CHECK(c10d_work_wait_release(w1) == 0, "any %d: %s", k, c10d_last_error());
        MP_CHECK(rank == 0 || good(a, 16, 0, k), "any %d: wrong bytes", k);
        waited += now_s() - t0;

        if (rank == 1) {
            MP_CHECK(recvb(pg, a, 16, 0, 5, &w1) == 0, "irecv: %s", c10d_last_error());
            MP_CHECK(recvb(pg, b, 16, 0, 5, &w2) == 0, "irecv: %s", c10d_last_error());
        } else {
            MP_CHECK(sendb(pg, big, sizeof big, 1, 8, &wb) == 0, "isend: %s", c10d_last_error());
        }
        MP_CHECK(c10d_barrier_sync(pg) == 0, "barrier: %s", c10d_last_error());
        if (rank == 0) {
            fill(a, 16, 0, 100 + k);
            fill(b, 16, 0, 200 + k);
            MP_CHECK(sendb(pg, a, 16, 1, 5, &w1) == 0, "isend: %s", c10d_last_error());
            MP_CHECK(sendb(pg, b, 16, 1, 5, &w2) == 0, "isend: %s", c10d_last_error());
        } else {
            MP_CHECK(recvb(pg, big, sizeof big, 0, 8, &wb) == 0, "irecv: %s", c10d_last_error());
        }
        MP_CHECK(c10d_work_wait_release(w2) == 0, "second %d: %s", k, c10d_last_error());
        MP_CHECK(c10d_work_wait_release(w1) == 0, "first %d: %s", k, c10d_last_error());
        MP_CHECK(c10d_work_wait_release(wb) == 0, "big %d: %s", k, c10d_last_error());
        MP_CHECK(rank == 0 || (good(a, 16, 0, 100 + k) && good(b, 16, 0, 200 + k)),
                 "one tag, %d: the receives got each other's message", k);
    }
    /* About 50 ms here; a deposit that does not wake a sleeping loop waits
     * for some unrelated timer instead (over a second each, measured). */
    MP_CHECK(waited < 5.0, "20 any-source receives took %.1f s: a deposit did not wake the loop",
             waited);
    c10d_pg_destroy(pg);
    c10d_shutdown();
    return 0;
}

/* Mode of the fault tests below: single ops, or the same in a batch (a
 * send and a receive together, c10d_batch_isend_irecv: p2p_lane_batch.c). */
enum { SINGLE_RECV, SINGLE_SEND, BATCHED };

/* One op with rank 1 - rank, of the mode: a receive of rcap bytes with tag
 * rtag (SINGLE_RECV), a send of sn bytes with tag stag (SINGLE_SEND), or
 * both in one batch, the receive first (BATCHED). */
static int submit(c10d_pg *pg, int rank, int mode, unsigned char *buf, size_t sn, size_t rcap,
                  int stag, int rtag, const c10d_op_opts *oo, c10d_work **w)
{
    int other = 1 - rank;
    static unsigned char back[64];
    if (mode == SINGLE_RECV)
        return c10d_recv(pg, back, rcap, C10D_UINT8, other, rtag, oo, w);
    if (mode == SINGLE_SEND)
        return c10d_send(pg, buf, sn, C10D_UINT8, other, stag, oo, w);
    c10d_p2p_op ops[2] = {{C10D_P2P_RECV, back, rcap, C10D_UINT8, other, rtag},
                          {C10D_P2P_SEND, buf, sn, C10D_UINT8, other, stag}};
    return c10d_batch_isend_irecv(pg, ops, 2, oo, w);
}

/* A receive (or batch) posted in the mailbox that no one sends to: its
 * deadline fails it (the waiter stops there, the loop's timer fails it), on
 * time. */
static int timeout_main(int rank, int n, void *arg)
{
    (void)n;
    int mode = *(int *)arg;
    setenv("C10D_SHM_LANE_SPIN_US", "60000000", 1);
    c10d_pg *pg = lane_init(60000);
    MP_CHECK(pg != NULL, "no group");
    MP_CHECK(c10d_barrier_sync(pg) == 0, "barrier: %s", c10d_last_error());
    if (rank == 0) {
        unsigned char b[16] = {0};
        c10d_op_opts oo = {0};
        oo.timeout_ms = 500;
        c10d_work *w = NULL;
        /* Its receive's tag is one rank 1 never sends. */
        MP_CHECK(submit(pg, rank, mode, b, 16, 16, 0, 1, &oo, &w) == 0, "submit: %s",
                 c10d_last_error());
        double t0 = now_s();
        int rc = c10d_work_wait(w, -1);
        double s = now_s() - t0;
        MP_CHECK(rc == C10D_ETIMEDOUT, "got %s: %s", c10d_status_name(rc), c10d_last_error());
        MP_CHECK(s >= 0.3 && s < 10, "the deadline fired after %.2f s", s);
        fprintf(stderr, "rank 0: timed out after %.2f s: %s\n", s, c10d_work_message(w));
        c10d_work_release(w);
    } else {
        sleep(3); /* an abort would end rank 0's receive before its deadline */
    }
    c10d_pg_abort(pg, "test over");
    c10d_shutdown();
    return 0;
}

/* A send larger than the receive posted for it (alone, or each in a batch):
 * an error on both ranks, naming the sizes, never a truncated success. */
static int mismatch_main(int rank, int n, void *arg)
{
    (void)n;
    int mode = *(int *)arg;
    c10d_pg *pg = lane_init(20000);
    MP_CHECK(pg != NULL, "no group");
    unsigned char b[64] = {0};
    c10d_work *w = NULL;
    /* Every rank's doorbell is out (a lane needs them) once all are here. */
    MP_CHECK(c10d_barrier_sync(pg) == 0, "barrier: %s", c10d_last_error());
    /* Batched: rank 0 sends 64 bytes with tag 0 into rank 1's 16-byte
     * receive at the head of its batch, and receives rank 1's 4 with tag 1. */
    int rc = mode == BATCHED ? submit(pg, rank, mode, b, rank == 0 ? 64 : 4, rank == 0 ? 4 : 16,
                                      rank, 1 - rank, NULL, &w)
                             : submit(pg, rank, rank == 0 ? SINGLE_SEND : SINGLE_RECV, b, 64, 16, 0,
                                      0, NULL, &w);
    MP_CHECK(rc == 0, "submit: %s", c10d_last_error());
    rc = c10d_work_wait(w, -1);
    MP_CHECK(rc != 0, "a 64-byte send into a 16-byte receive succeeded");
    fprintf(stderr, "rank %d: %s: %s\n", rank, c10d_status_name(rc), c10d_work_message(w));
    MP_CHECK(rank == 0 || strstr(c10d_work_message(w), "64") != NULL, "no size named: %s",
             c10d_work_message(w));
    c10d_work_release(w);
    c10d_pg_abort(pg, "test over");
    c10d_shutdown();
    return 0;
}

/* A peer killed while this rank waits in the lane, for its receive's fill,
 * its deposit's match or both (a batch): an error within seconds. */
static int killed_main(int rank, int n, void *arg)
{
    (void)n;
    int mode = *(int *)arg;
    setenv("C10D_SHM_LANE_SPIN_US", "60000000", 1);
    c10d_pg *pg = lane_init(60000);
    MP_CHECK(pg != NULL, "no group");
    unsigned char b[16] = {0};
    MP_CHECK(c10d_barrier_sync(pg) == 0, "barrier: %s", c10d_last_error());
    if (rank == 1) {
        usleep(300 * 1000);
        raise(SIGKILL);
    }
    c10d_work *w = NULL;
    MP_CHECK(submit(pg, rank, mode, b, 16, 16, 0, 0, NULL, &w) == 0, "submit: %s",
             c10d_last_error());
    double t0 = now_s();
    int rc = c10d_work_wait(w, -1);
    double s = now_s() - t0;
    MP_CHECK(rc < 0, "the op succeeded without its peer");
    MP_CHECK(s < 10, "the error took %.1f s", s);
    fprintf(stderr, "rank 0: %s after %.2f s: %s\n", c10d_status_name(rc), s, c10d_work_message(w));
    c10d_work_release(w);
    c10d_pg_abort(pg, "test over");
    c10d_shutdown();
    return 0;
}

/* Lane ops nobody waits for when the group ends. Abort: a receive posted in
 * the mailbox that no one sends to fails, and so does a deposit its receiver
 * never takes. Graceful destroy: ops that met their peers complete with it
 * at once (nothing holds the destroy up for the group's timeout), their bytes
 * delivered. */
static int abandon_main(int rank, int n, void *arg)
{
    (void)n;
    int graceful = *(int *)arg;
    c10d_pg *pg = lane_init(20000);
    MP_CHECK(pg != NULL, "no group");
    unsigned char b[16] = {0}, c[16];
    fill(c, 16, rank, 5);
    c10d_work *r = NULL, *s = NULL;
    uint64_t s0, r0, s1, r1;
    /* Every rank's doorbell is out (a lane needs them) once all are here. */
    MP_CHECK(c10d_barrier_sync(pg) == 0, "barrier: %s", c10d_last_error());
    c10d__tcp_p2p_lane_counts(&s0, &r0);
    if (graceful) { /* both ways, each meeting the other */
        MP_CHECK(recvb(pg, b, 16, 1 - rank, 1, &r) == 0, "irecv: %s", c10d_last_error());
        MP_CHECK(c10d_barrier_sync(pg) == 0, "barrier: %s", c10d_last_error());
        MP_CHECK(sendb(pg, c, 16, 1 - rank, 1, &s) == 0, "isend: %s", c10d_last_error());
    } else if (rank == 0) { /* a receive nobody fills, a deposit nobody takes */
        MP_CHECK(recvb(pg, b, 16, 1, 1, &r) == 0, "irecv: %s", c10d_last_error());
        MP_CHECK(c10d_barrier_sync(pg) == 0, "barrier: %s", c10d_last_error());
        MP_CHECK(sendb(pg, c, 16, 1, 2, &s) == 0, "isend: %s", c10d_last_error());
    } else {
        MP_CHECK(c10d_barrier_sync(pg) == 0, "barrier: %s", c10d_last_error());
    }
    MP_CHECK(c10d_barrier_sync(pg) == 0, "barrier: %s", c10d_last_error());
    c10d__tcp_p2p_lane_counts(&s1, &r1);
    MP_CHECK(rank == 1 && !graceful ? s1 == s0 : s1 == s0 + 1,
             "the send did not take the lane (%llu)", (unsigned long long)(s1 - s0));
    double t0 = now_s();
    if (graceful)
        c10d_pg_destroy(pg);
    else
        c10d_pg_abort(pg, "abandoned");
    double took = now_s() - t0;
    if (graceful) {
        MP_CHECK(took < 10, "the destroy waited %.1f s for ops that were done", took);
        MP_CHECK(c10d_work_wait(r, -1) == 0, "receive: %s", c10d_last_error());
        MP_CHECK(c10d_work_wait(s, -1) == 0, "send: %s", c10d_last_error());
        MP_CHECK(good(b, 16, 1 - rank, 5), "wrong bytes");
    } else if (rank == 0) {
        MP_CHECK(c10d_work_wait(r, -1) != 0, "a receive nobody sent to succeeded");
        MP_CHECK(c10d_work_wait(s, -1) != 0, "a deposit nobody took succeeded");
        fprintf(stderr, "rank 0: receive: %s; send: %s\n", c10d_work_message(r),
                c10d_work_message(s));
    }
    c10d_work_release(r);
    c10d_work_release(s);
    c10d_shutdown();
    return 0;
}

static void test_order_2_ranks(void **st)
{
    (void)st;
    lane_run(order_main, NULL, 2, NULL);
}

static void test_order_3_ranks(void **st)
{
    (void)st;
    lane_run(order_main, NULL, 3, NULL);
}

static void test_order_4_ranks_short_spin(void **st)
{
    (void)st;
    /* Waiters give up at once: every hand-over to the loop is taken. */
    lane_run(order_main, NULL, 4, "1");
}

static void test_parked_while_frames_come(void **st)
{
    (void)st;
    int late = 0;
    lane_run(parked_main, &late, 2, NULL);
}

static void test_parked_after_frames_came(void **st)
{
    (void)st;
    int late = 1;
    lane_run(parked_main, &late, 2, NULL);
}

static void test_loop_receives(void **st)
{
    (void)st;
    lane_run(loop_main, NULL, 2, NULL);
}

static void test_timeout(void **st)
{
    (void)st;
    int mode = SINGLE_RECV;
    lane_run(timeout_main, &mode, 2, NULL);
}

static void test_timeout_batched(void **st)
{
    (void)st;
    int mode = BATCHED;
    lane_run(timeout_main, &mode, 2, NULL);
}

static void test_mismatch(void **st)
{
    (void)st;
    int mode = SINGLE_RECV;
    lane_run(mismatch_main, &mode, 2, NULL);
}

static void test_mismatch_batched(void **st)
{
    (void)st;
    int mode = BATCHED;
    lane_run(mismatch_main, &mode, 2, NULL);
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

static void killed(int mode)
{
    struct mp_opts o = {0};
    o.nranks = 2;
    o.timeout_s = 60;
    struct mp_result res;
    mp_run(&o, killed_main, &mode, &res);
    assert_false(res.timed_out);
    assert_int_equal(res.codes[0], 0);
    assert_int_equal(res.codes[1], 128 + SIGKILL);
}

static void test_peer_killed_receiving(void **st)
{
    (void)st;
    killed(SINGLE_RECV);
}

static void test_peer_killed_sending(void **st)
{
    (void)st;
    killed(SINGLE_SEND);
}

static void test_peer_killed_batched(void **st)
{
    (void)st;
    killed(BATCHED);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_order_2_ranks),
        cmocka_unit_test(test_order_3_ranks),
        cmocka_unit_test(test_order_4_ranks_short_spin),
        cmocka_unit_test(test_parked_while_frames_come),
        cmocka_unit_test(test_parked_after_frames_came),
        cmocka_unit_test(test_loop_receives),
        cmocka_unit_test(test_timeout),
        cmocka_unit_test(test_timeout_batched),
        cmocka_unit_test(test_mismatch),
        cmocka_unit_test(test_mismatch_batched),
        cmocka_unit_test(test_abandoned_abort),
        cmocka_unit_test(test_abandoned_destroy),
        cmocka_unit_test(test_peer_killed_receiving),
        cmocka_unit_test(test_peer_killed_sending),
        cmocka_unit_test(test_peer_killed_batched),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
