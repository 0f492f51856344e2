/* Every op through the public API on 2, 3 and 4 real processes (env://
 * rendezvous, tcp backend), against references computed locally: every dtype
 * x reduce op (invalid pairs must be rejected with the host table's message),
 * sizes 0, 1, 7, 4099 elements and 8 MiB, in place and out of place, uneven
 * all_to_all, tagged and any-source P2P, batches, coalescing, barriers.
 * Under AddressSanitizer the matrix shrinks (fewer dtypes, no 8 MiB) to keep
 * the suite within minutes on two cores. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "bench/data.h"
#include "c10d.h"
#include "mp_harness.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define REDUCED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define REDUCED 1
#endif
#endif
#ifndef REDUCED
#define REDUCED 0
#endif

static int reduced(void)
{
    const char *e = getenv("C10D_TEST_REDUCED");
    return REDUCED || (e != NULL && *e == '1');
}

static const c10d_dtype all_dtypes[] = {C10D_FLOAT32,  C10D_FLOAT64, C10D_FLOAT16,
                                        C10D_BFLOAT16, C10D_INT8,    C10D_UINT8,
                                        C10D_INT32,    C10D_INT64,   C10D_BOOL};
static const c10d_dtype few_dtypes[] = {C10D_FLOAT32, C10D_BFLOAT16, C10D_INT64, C10D_BOOL};

#define NSIZES 4
static const size_t sizes[NSIZES] = {0, 1, 7, 4099};
#define BIG_BYTES (8u << 20)

static int fails;

#define EXPECT(cond, ...)                                                                          \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "[rank %d] %s:%d: ", rank, __FILE__, __LINE__);                        \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            if (++fails > 20)                                                                      \
                return 1;                                                                          \
        }                                                                                          \
    } while (0)

static void *xmalloc(size_t n)
{
    void *p = malloc(n > 0 ? n : 1);
    if (p == NULL)
        abort();
    return p;
}

/* ------------------------------------------------------------ reductions */

static int check_all_reduce(c10d_pg *pg, int rank, int n, c10d_dtype dt, c10d_reduce_op op,
                            size_t count, int in_place)
{
    size_t es = c10d_dtype_size(dt);
    void *send = xmalloc(count * es), *recv = xmalloc(count * es);
    data_fill(send, count, 0, rank, dt, op);
    c10d_op_opts o = {0};
    o.premul_factor = 0.5;
    void *dst = in_place ? send : recv;
    int valid = c10d_reduce_op_check(op, dt) == 0;
    int rc = c10d_all_reduce(pg, send, dst, count, dt, op, &o, NULL);
    if (!valid) {
        EXPECT(rc == C10D_EINVAL && strstr(c10d_last_error(), "tcp all_reduce: ") != NULL,
               "all_reduce %s %s: expected rejection, got %d (%s)", c10d_dtype_name(dt),
               c10d_reduce_op_name(op), rc, c10d_last_error());
        free(send), free(recv);
        return 0;
    }
    if (rc == 0)
        rc = c10d_barrier_sync(pg);
    EXPECT(rc == 0, "all_reduce %s %s count %zu: %d %s", c10d_dtype_name(dt),
           c10d_reduce_op_name(op), count, rc, c10d_last_error());
    for (size_t i = 0; rc == 0 && i < count; i++) {
        double got = data_load(dst, i, dt), want = data_reduced(n, i, dt, op, 0.5);
        if (!data_close(got, want, dt)) {
            EXPECT(0, "all_reduce %s %s count %zu%s: [%zu] = %g, want %g", c10d_dtype_name(dt),
                   c10d_reduce_op_name(op), count, in_place ? " in place" : "", i, got, want);
            break;
        }
    }
    free(send), free(recv);
    return 0;
}

static int check_reduce_kinds(c10d_pg *pg, int rank, int n, c10d_dtype dt, size_t count)
{
    size_t es = c10d_dtype_size(dt);
    c10d_reduce_op op = dt == C10D_BOOL ? C10D_BOR : C10D_MAX;
    void *send = xmalloc(count * n * es), *recv = xmalloc(count * n * es);
    c10d_work *w;
    /* reduce to the last rank */
    int root = n - 1;
    data_fill(send, count, 0, rank, dt, op);
    int rc = c10d_reduce(pg, send, rank == root ? recv : NULL, count, dt, op, root, NULL, &w);
    if (rc == 0)
        rc = c10d_work_wait_release(w);
    EXPECT(rc == 0, "reduce %s: %s", c10d_dtype_name(dt), c10d_last_error());
    if (rank == root)
        for (size_t i = 0; i < count; i++)
            if (!data_close(data_load(recv, i, dt), data_reduced(n, i, dt, op, 0), dt)) {
                EXPECT(0, "reduce %s count %zu: [%zu] wrong", c10d_dtype_name(dt), count, i);
                break;
            }
    /* reduce_scatter, single buffer then list form */
    data_fill(send, count * n, 0, rank, dt, C10D_SUM);
    rc = c10d_reduce_scatter(pg, send, recv, count, dt, C10D_SUM, NULL, &w);
    if (rc == 0)
        rc = c10d_work_wait_release(w);
    EXPECT(rc == 0, "reduce_scatter %s: %s", c10d_dtype_name(dt), c10d_last_error());
    for (size_t i = 0; rc == 0 && i < count; i++)
        if (!data_close(data_load(recv, i, dt),
                        data_reduced(n, (size_t)rank * count + i, dt, C10D_SUM, 0), dt)) {
            EXPECT(0, "reduce_scatter %s count %zu: [%zu] wrong", c10d_dtype_name(dt), count, i);
            break;
        }
    const void *sends[MP_MAX_RANKS];
    for (int r = 0; r < n; r++)
        sends[r] = (const char *)send + (size_t)r * count * es;
    rc = c10d_reduce_scatter_list(pg, sends, recv, count, dt, C10D_SUM, NULL, &w);
    if (rc == 0)
        rc = c10d_work_wait_release(w);
    EXPECT(rc == 0, "reduce_scatter_list %s: %s", c10d_dtype_name(dt), c10d_last_error());
    for (size_t i = 0; rc == 0 && i < count; i++)
        if (!data_close(data_load(recv, i, dt),
                        data_reduced(n, (size_t)rank * count + i, dt, C10D_SUM, 0), dt)) {
            EXPECT(0, "reduce_scatter_list %s count %zu: [%zu] wrong", c10d_dtype_name(dt), count,
                   i);
            break;
        }
    free(send), free(recv);
    return 0;
}

/* ------------------------------------------------------ data movement */

static int check_movement(c10d_pg *pg, int rank, int n, c10d_dtype dt, size_t count)
{
    size_t es = c10d_dtype_size(dt);
    size_t total = count * (size_t)n;
    char *send = xmalloc(total * es), *recv = xmalloc(total * es);
    c10d_work *w;
    int rc;
    /* broadcast from each root, in place */
    for (int root = 0; root < n; root++) {
        if (rank == root)
            data_fill(recv, count, 0, root, dt, C10D_SUM);
        else
            memset(recv, 0x5a, count * es);
        rc = c10d_broadcast_sync(pg, NULL, recv, count, dt, root);
        EXPECT(rc == 0, "broadcast: %s", c10d_last_error());
        for (size_t i = 0; rc == 0 && i < count; i++)
            if (data_load(recv, i, dt) != data_value(root, i, dt, C10D_SUM)) {
                EXPECT(0, "broadcast %s root %d count %zu: [%zu] wrong", c10d_dtype_name(dt), root,
                       count, i);
                break;
            }
    }
    /* all_gather into one buffer, out of place then in place */
    for (int in_place = 0; in_place < 2; in_place++) {
        memset(recv, 0x5a, total * es);
        data_fill(in_place ? recv + (size_t)rank * count * es : send, count, 0, rank, dt, C10D_SUM);
        rc = c10d_all_gather(pg, in_place ? NULL : send, recv, count, dt, NULL, &w);
        if (rc == 0)
            rc = c10d_work_wait_release(w);
        EXPECT(rc == 0, "all_gather: %s", c10d_last_error());
        for (int p = 0; rc == 0 && p < n; p++)
            for (size_t i = 0; i < count; i++)
                if (data_load(recv, (size_t)p * count + i, dt) != data_value(p, i, dt, C10D_SUM)) {
                    EXPECT(0, "all_gather %s count %zu: rank %d's [%zu] wrong", c10d_dtype_name(dt),
                           count, p, i);
                    p = n;
                    break;
                }
    }
    /* all_gather, list form */
    void *recvs[MP_MAX_RANKS];
    for (int r = 0; r < n; r++)
        recvs[r] = recv + (size_t)(n - 1 - r) * count * es; /* any layout */
    data_fill(send, count, 0, rank, dt, C10D_SUM);
    rc = c10d_all_gather_list(pg, send, recvs, count, dt, NULL, &w);
    if (rc == 0)
        rc = c10d_work_wait_release(w);
    EXPECT(rc == 0, "all_gather_list: %s", c10d_last_error());
    for (int p = 0; rc == 0 && p < n; p++)
        for (size_t i = 0; i < count; i++)
            if (data_load(recvs[p], i, dt) != data_value(p, i, dt, C10D_SUM)) {
                EXPECT(0, "all_gather_list: rank %d's [%zu] wrong", p, i);
                p = n;
                break;
            }
    /* gather to rank 0, scatter from the last rank */
    data_fill(send, count, 0, rank, dt, C10D_SUM);
    rc = c10d_gather(pg, send, rank == 0 ? recv : NULL, count, dt, 0, NULL, &w);
    if (rc == 0)
        rc = c10d_work_wait_release(w);
    EXPECT(rc == 0, "gather: %s", c10d_last_error());
    if (rank == 0)
        for (int p = 0; rc == 0 && p < n; p++)
            for (size_t i = 0; i < count; i++)
                if (data_load(recv, (size_t)p * count + i, dt) != data_value(p, i, dt, C10D_SUM)) {
                    EXPECT(0, "gather: rank %d's [%zu] wrong", p, i);
                    p = n;
                    break;
                }
    int sroot = n - 1;
    if (rank == sroot)
        data_fill(send, total, 0, 100, dt, C10D_SUM);
    rc = c10d_scatter(pg, rank == sroot ? send : NULL, recv, count, dt, sroot, NULL, &w);
    if (rc == 0)
        rc = c10d_work_wait_release(w);
    EXPECT(rc == 0, "scatter: %s", c10d_last_error());
    for (size_t i = 0; rc == 0 && i < count; i++)
        if (data_load(recv, i, dt) != data_value(100, (size_t)rank * count + i, dt, C10D_SUM)) {
            EXPECT(0, "scatter count %zu: [%zu] wrong", count, i);
            break;
        }
    /* all_to_all_single, even split: block p of my output = block rank of p's input */
    data_fill(send, total, 0, rank, dt, C10D_SUM);
    rc = c10d_all_to_all_single(pg, send, recv, total, NULL, NULL, dt, NULL, &w);
    if (rc == 0)
        rc = c10d_work_wait_release(w);
    EXPECT(rc == 0, "all_to_all_single: %s", c10d_last_error());
    for (int p = 0; rc == 0 && p < n; p++)
        for (size_t i = 0; i < count; i++)
            if (data_load(recv, (size_t)p * count + i, dt) !=
                data_value(p, (size_t)rank * count + i, dt, C10D_SUM)) {
                EXPECT(0, "all_to_all_single count %zu: from %d [%zu] wrong", count, p, i);
                p = n;
                break;
            }
    free(send), free(recv);
    return 0;
}

/* Rank s sends (s + d + 1) * (count % 5 + 1) elements to rank d: uneven both ways. */
static size_t split(int s, int d, size_t count)
{
    return (size_t)(s + d + 1) * (count % 5 + 1);
}

static int check_uneven_all_to_all(c10d_pg *pg, int rank, int n, size_t count)
{
    size_t sc[MP_MAX_RANKS], rcn[MP_MAX_RANKS], st = 0, rt = 0;
    for (int p = 0; p < n; p++) {
        sc[p] = split(rank, p, count);
        rcn[p] = split(p, rank, count);
        st += sc[p];
        rt += rcn[p];
    }
    int32_t *send = xmalloc(st * 4), *recv = xmalloc(rt * 4);
    size_t off = 0;
    for (int p = 0; p < n; p++)
        for (size_t i = 0; i < sc[p]; i++)
            send[off++] = rank * 1000000 + p * 1000 + (int32_t)i;
    c10d_work *w;
    int rc = c10d_all_to_all_single(pg, send, recv, st, sc, rcn, C10D_INT32, NULL, &w);
    if (rc == 0)
        rc = c10d_work_wait_release(w);
    EXPECT(rc == 0, "uneven all_to_all_single: %s", c10d_last_error());
    off = 0;
    for (int p = 0; rc == 0 && p < n; p++)
        for (size_t i = 0; i < rcn[p]; i++, off++)
            if (recv[off] != p * 1000000 + rank * 1000 + (int32_t)i) {
                EXPECT(0, "uneven all_to_all_single: from %d [%zu] = %d", p, i, recv[off]);
                p = n;
                break;
            }
    /* list form with the same splits */
    const void *sends[MP_MAX_RANKS];
    void *recvs[MP_MAX_RANKS];
    size_t so = 0, ro = 0;
    for (int p = 0; p < n; p++) {
        sends[p] = send + so;
        recvs[p] = recv + ro;
        so += sc[p];
        ro += rcn[p];
    }
    memset(recv, 0, rt * 4);
    rc = c10d_all_to_all(pg, sends, sc, recvs, rcn, C10D_INT32, NULL, &w);
    if (rc == 0)
        rc = c10d_work_wait_release(w);
    EXPECT(rc == 0, "all_to_all list: %s", c10d_last_error());
    for (int p = 0; rc == 0 && p < n; p++)
        for (size_t i = 0; i < rcn[p]; i++)
            if (((int32_t *)recvs[p])[i] != p * 1000000 + rank * 1000 + (int32_t)i) {
                EXPECT(0, "all_to_all list: from %d [%zu] wrong", p, i);
                p = n;
                break;
            }
    free(send), free(recv);
    return 0;
}

/* ---------------------------------------------------------------- P2P */

static atomic_int cb_runs;

static void count_cb(c10d_work *w, int status, void *arg)
{
    (void)w;
    (void)status;
    (void)arg;
    atomic_fetch_add(&cb_runs, 1);
}

static int check_p2p(c10d_pg *pg, int rank, int n)
{
    int next = (rank + 1) % n, prev = (rank + n - 1) % n;
    int64_t out[64], in[64], in2[64];
    for (int i = 0; i < 64; i++)
        out[i] = rank * 100 + i;
    /* Two tags in flight at once, posted in opposite orders: tags keep them apart. */
    c10d_work *ws[4];
    int rc = c10d_recv(pg, in2, 64, C10D_INT64, prev, 8, NULL, &ws[0]);
    if (rc == 0)
        rc = c10d_recv(pg, in, 64, C10D_INT64, prev, 7, NULL, &ws[1]);
    if (rc == 0)
        rc = c10d_send(pg, out, 64, C10D_INT64, next, 7, NULL, &ws[2]);
    if (rc == 0)
        rc = c10d_send(pg, out, 32, C10D_INT64, next, 8, NULL, &ws[3]);
    EXPECT(rc == 0, "p2p post: %s", c10d_last_error());
    for (int i = 0; rc == 0 && i < 4; i++) {
        int st = c10d_work_wait_release(ws[i]);
        EXPECT(st == 0, "p2p %d: %s", i, c10d_last_error());
    }
    EXPECT(in[63] == prev * 100 + 63 && in2[31] == prev * 100 + 31, "p2p data wrong");
    /* Any source: rank 0 hears from every other rank and learns who sent. */
    if (rank == 0) {
        int seen = 0;
        for (int k = 1; k < n; k++) {
            int64_t v = -1;
            c10d_work *w;
            rc = c10d_recv(pg, &v, 1, C10D_INT64, C10D_ANY_SOURCE, 3, NULL, &w);
            EXPECT(rc == 0, "any-source recv: %s", c10d_last_error());
            if (rc != 0)
                break;
            EXPECT(c10d_work_wait(w, -1) == 0, "any-source wait: %s", c10d_last_error());
            int src = c10d_work_source_rank(w);
            c10d_work_release(w);
            EXPECT(src >= 1 && src < n && v == src * 11, "any-source: src %d value %lld", src,
                   (long long)v);
            if (src >= 1 && src < n)
                seen |= 1 << src;
        }
        EXPECT(seen == ((1 << n) - 2), "any-source: saw mask %x", seen);
    } else {
        int64_t v = rank * 11;
        c10d_work *w;
        rc = c10d_send(pg, &v, 1, C10D_INT64, 0, 3, NULL, &w);
        EXPECT(rc == 0 && c10d_work_wait_release(w) == 0, "send to 0: %s", c10d_last_error());
    }
    /* batch_isend_irecv: a ring exchange as one work */
    int64_t a[16], b[16];
    for (int i = 0; i < 16; i++)
        a[i] = rank * 1000 + i;
    c10d_p2p_op ops[2] = {{C10D_P2P_RECV, b, 16, C10D_INT64, prev, 0},
                          {C10D_P2P_SEND, a, 16, C10D_INT64, next, 0}};
    c10d_work *w;
    rc = c10d_batch_isend_irecv(pg, ops, 2, NULL, &w);
    EXPECT(rc == 0 && c10d_work_wait_release(w) == 0, "batch: %s", c10d_last_error());
    EXPECT(b[15] == prev * 1000 + 15, "batch data wrong: %lld", (long long)b[15]);
    /* An all_to_all written as one batch, the self peer included (torch allows
     * self inside batch_isend_irecv); two messages to self with one tag pair
     * in posting order, so the second recv gets the second send. */
    enum { MAXR = 8 };
    int64_t put[MAXR + 1], got[MAXR + 1];
    c10d_p2p_op a2a[2 * (MAXR + 1)];
    int k = 0;
    for (int j = 0; j < n && j < MAXR; j++) {
        put[j] = rank * 100 + j;
        got[j] = -1;
        a2a[k++] = (c10d_p2p_op){C10D_P2P_RECV, &got[j], 1, C10D_INT64, j, 5};
        a2a[k++] = (c10d_p2p_op){C10D_P2P_SEND, &put[j], 1, C10D_INT64, j, 5};
    }
    put[MAXR] = 4242;
    got[MAXR] = -1;
    a2a[k++] = (c10d_p2p_op){C10D_P2P_SEND, &put[MAXR], 1, C10D_INT64, rank, 5};
    a2a[k++] = (c10d_p2p_op){C10D_P2P_RECV, &got[MAXR], 1, C10D_INT64, rank, 5};
    rc = c10d_batch_isend_irecv(pg, a2a, k, NULL, &w);
    EXPECT(rc == 0 && c10d_work_wait_release(w) == 0, "batch with self: %s", c10d_last_error());
    for (int j = 0; j < n && j < MAXR; j++)
        EXPECT(got[j] == j * 100 + rank, "batch with self: from %d got %lld", j, (long long)got[j]);
    EXPECT(got[MAXR] == 4242, "second message to self: %lld", (long long)got[MAXR]);
    /* Complex travels as pairs of reals: SUM and AVG part by part; MAX has
     * no meaning on it and is refused at the call, the group unharmed. */
    double cz[2 * 3];
    for (int i = 0; i < 3; i++) {
        cz[2 * i] = rank + i;
        cz[2 * i + 1] = -(rank + i);
    }
    rc = c10d_all_reduce_sync(pg, cz, cz, 3, C10D_COMPLEX128, C10D_SUM);
    EXPECT(rc == 0, "complex all_reduce: %s", c10d_last_error());
    for (int i = 0; i < 3; i++) {
        double want = n * (n - 1) / 2.0 + n * i;
        EXPECT(cz[2 * i] == want && cz[2 * i + 1] == -want, "complex sum %d: %g%+gi", i, cz[2 * i],
               cz[2 * i + 1]);
    }
    EXPECT(c10d_all_reduce_sync(pg, cz, cz, 3, C10D_COMPLEX128, C10D_MAX) == C10D_EINVAL,
           "complex MAX was taken");
    EXPECT(c10d_barrier_sync(pg) == 0, "barrier after a refused call: %s", c10d_last_error());
    /* all_gather_v: rank r gives r % 3 elements (rank 0 none), out of place
     * and in place (rank r's own block is its send buffer). */
    size_t gv_counts[MAXR], total = 0, mine_at = 0;
    for (int j = 0; j < n && j < MAXR; j++) {
        gv_counts[j] = (size_t)(j % 3);
        if (j == rank)
            mine_at = total;
        total += gv_counts[j];
    }
    int32_t gv_send[3], gv_recv[3 * MAXR];
    for (int e = 0; e < 3; e++)
        gv_send[e] = rank * 10 + e;
    for (int pass = 0; pass < 2; pass++) {
        for (size_t e = 0; e < total; e++)
            gv_recv[e] = -1;
        const void *src = gv_send;
        if (pass == 1) { /* in place */
            memcpy(gv_recv + mine_at, gv_send, gv_counts[rank] * sizeof(int32_t));
            src = gv_recv + mine_at;
        }
        rc = c10d_all_gather_v(pg, src, gv_recv, gv_counts, C10D_INT32, NULL, &w);
        EXPECT(rc == 0 && c10d_work_wait_release(w) == 0, "all_gather_v: %s", c10d_last_error());
        size_t at = 0;
        for (int j = 0; j < n && j < MAXR; j++)
            for (size_t e = 0; e < gv_counts[j]; e++, at++)
                EXPECT(gv_recv[at] == j * 10 + (int)e, "all_gather_v pass %d: rank %d's %zu: %d",
                       pass, j, e, gv_recv[at]);
    }
    EXPECT(c10d_all_gather_v(pg, gv_send, gv_recv, NULL, C10D_INT32, NULL, NULL) == C10D_EINVAL,
           "NULL counts taken");
    /* The list forms of gather (to the last rank) and scatter (from rank 0):
     * blocks of 5, the root's own included. */
    int32_t blocks[MAXR][5], one[5];
    void *list[MAXR];
    for (int j = 0; j < n && j < MAXR; j++) {
        list[j] = blocks[j];
        for (int e = 0; e < 5; e++)
            blocks[j][e] = -1;
    }
    for (int e = 0; e < 5; e++)
        one[e] = rank * 100 + e;
    rc = c10d_gather_list(pg, one, rank == n - 1 ? list : NULL, 5, C10D_INT32, n - 1, NULL, &w);
    EXPECT(rc == 0 && c10d_work_wait_release(w) == 0, "gather_list: %s", c10d_last_error());
    for (int j = 0; rank == n - 1 && j < n && j < MAXR; j++)
        EXPECT(blocks[j][0] == j * 100 && blocks[j][4] == j * 100 + 4, "gather_list from %d: %d", j,
               blocks[j][0]);
    for (int j = 0; rank == 0 && j < n && j < MAXR; j++)
        for (int e = 0; e < 5; e++)
            blocks[j][e] = 1000 * j + e;
    rc = c10d_scatter_list(pg, rank == 0 ? (const void *const *)list : NULL, one, 5, C10D_INT32, 0,
                           NULL, &w);
    EXPECT(rc == 0 && c10d_work_wait_release(w) == 0, "scatter_list: %s", c10d_last_error());
    EXPECT(one[0] == 1000 * rank && one[4] == 1000 * rank + 4, "scatter_list got %d", one[0]);
    EXPECT(c10d_gather_list(pg, one, list, 5, C10D_INT32, n, NULL, NULL) == C10D_EINVAL,
           "root out of range taken");
    /* reduce_scatter_v: block j has j % 3 elements (rank 0's block: none);
     * rank r puts 100 r + 10 j + e in element e of block j. */
    int32_t rs_send[3 * MAXR], rs_recv[3] = {-1, -1, -1};
    size_t at = 0;
    for (int j = 0; j < n && j < MAXR; j++)
        for (size_t e = 0; e < gv_counts[j]; e++)
            rs_send[at++] = 100 * rank + 10 * j + (int32_t)e;
    c10d_op_opts rso = C10D_OP_OPTS_INIT;
    rso.cb = count_cb;
    rso.cb_arg = NULL;
    atomic_store(&cb_runs, 0);
    rc = c10d_reduce_scatter_v(pg, rs_send, rs_recv, gv_counts, C10D_INT32, C10D_SUM, &rso, &w);
    EXPECT(rc == 0 && c10d_work_wait_release(w) == 0, "reduce_scatter_v: %s", c10d_last_error());
    for (size_t e = 0; e < gv_counts[rank]; e++)
        EXPECT(rs_recv[e] == 100 * n * (n - 1) / 2 + n * (10 * rank + (int32_t)e),
               "reduce_scatter_v element %zu: %d", e, rs_recv[e]);
    EXPECT(gv_counts[rank] > 2 || rs_recv[2] == -1, "reduce_scatter_v wrote past its block");
    EXPECT(atomic_load(&cb_runs) == 1, "the callback ran %d times", atomic_load(&cb_runs));
    return 0;
}

static int check_coalesced(c10d_pg *pg, int rank, int n)
{
    float a[7], b[4099];
    int64_t c[3];
    data_fill(a, 7, 0, rank, C10D_FLOAT32, C10D_SUM);
    data_fill(b, 4099, 0, rank, C10D_FLOAT32, C10D_SUM);
    for (int i = 0; i < 3; i++)
        c[i] = rank + i;
    int rc = c10d_coalesce_begin(pg);
    if (rc == 0)
        rc = c10d_all_reduce(pg, a, a, 7, C10D_FLOAT32, C10D_SUM, NULL, NULL);
    if (rc == 0)
        rc = c10d_all_reduce(pg, b, b, 4099, C10D_FLOAT32, C10D_SUM, NULL, NULL);
    if (rc == 0)
        rc = c10d_all_reduce(pg, c, c, 3, C10D_INT64, C10D_MAX, NULL, NULL);
    c10d_work *w = NULL;
    if (rc == 0)
        rc = c10d_coalesce_end(pg, NULL, &w);
    if (rc == 0)
        rc = c10d_work_wait_release(w);
    EXPECT(rc == 0, "coalesced: %s", c10d_last_error());
    EXPECT(
        data_close(a[6], data_reduced(n, 6, C10D_FLOAT32, C10D_SUM, 0), C10D_FLOAT32) &&
            data_close(b[4098], data_reduced(n, 4098, C10D_FLOAT32, C10D_SUM, 0), C10D_FLOAT32) &&
            c[2] == n - 1 + 2,
        "coalesced results wrong");
    return 0;
}

/* ---------------------------------------------------------- the rank body */

static int rank_main(int rank, int n, void *arg)
{
    (void)arg;
    c10d_pg_opts po = {0};
    po.timeout_ms = 60000;
    c10d_pg *pg;
    int rc = c10d_pg_init(&po, &pg);
    MP_CHECK(rc == 0, "init: %s", c10d_last_error());
    MP_CHECK(c10d_pg_rank(pg) == rank && c10d_pg_size(pg) == n, "rank/size");
    c10d_pg *again = NULL;
    MP_CHECK(c10d_pg_init(&po, &again) == C10D_EINVAL &&
                 strcmp(c10d_last_error(), "c10d_pg_init: the default process group is already "
                                           "initialised (destroy it first)") == 0,
             "second init: %s", c10d_last_error());
    /* A subgroup of the first and last rank; the others hold a non-member handle. */
    int ends[2] = {n - 1, 0};
    c10d_pg *sub = NULL;
    MP_CHECK(c10d_pg_new_group(pg, ends, 2, NULL, &sub) == 0, "new_group: %s", c10d_last_error());
    int member = rank == 0 || rank == n - 1;
    MP_CHECK(c10d_pg_is_member(sub) == member, "membership");
    int64_t sv = rank + 1;
    MP_CHECK(c10d_all_reduce_sync(sub, &sv, &sv, 1, C10D_INT64, C10D_SUM) == 0, "sub: %s",
             c10d_last_error());
    MP_CHECK(sv == (member ? 1 + n : rank + 1), "subgroup sum %lld", (long long)sv);
    int red = reduced();
    const c10d_dtype *dts = red ? few_dtypes : all_dtypes;
    int ndt = red ? 4 : 9;
    for (int d = 0; d < ndt; d++)
        for (int op = 0; op < C10D_REDUCE_OP_COUNT; op++)
            for (int s = 0; s < NSIZES; s++)
                if (check_all_reduce(pg, rank, n, dts[d], (c10d_reduce_op)op, sizes[s], s % 2))
                    return 1;
    for (int d = 0; d < ndt; d++)
        for (int s = 0; s < NSIZES; s++)
            if (check_reduce_kinds(pg, rank, n, dts[d], sizes[s]) ||
                check_movement(pg, rank, n, dts[d], sizes[s]))
                return 1;
    if (!red) {
        /* 8 MiB: large enough for the pipelined algorithms. */
        size_t big = BIG_BYTES / 4;
        if (check_all_reduce(pg, rank, n, C10D_FLOAT32, C10D_SUM, big, 0) ||
            check_all_reduce(pg, rank, n, C10D_BFLOAT16, C10D_AVG, BIG_BYTES / 2, 1) ||
            check_reduce_kinds(pg, rank, n, C10D_FLOAT32, big / (size_t)n) ||
            check_movement(pg, rank, n, C10D_INT32, big / (size_t)n))
            return 1;
    }
    for (int s = 0; s < NSIZES; s++)
        if (check_uneven_all_to_all(pg, rank, n, sizes[s]))
            return 1;
    if (check_p2p(pg, rank, n) || check_coalesced(pg, rank, n))
        return 1;
    c10d_work *w;
    rc = c10d_monitored_barrier(pg, 1, &(c10d_op_opts){.timeout_ms = 20000}, &w);
    MP_CHECK(rc == 0 && c10d_work_wait_release(w) == 0, "monitored_barrier: %s", c10d_last_error());
    MP_CHECK(c10d_barrier_sync(pg) == 0, "barrier: %s", c10d_last_error());
    MP_CHECK(c10d_pg_destroy(sub) == 0, "destroy sub: %s", c10d_last_error());
    MP_CHECK(c10d_pg_destroy(pg) == 0, "destroy: %s", c10d_last_error());
    c10d_shutdown();
    return fails ? 1 : 0;
}

static void run_world(int n)
{
    struct mp_opts o = {0};
    o.nranks = n;
    o.timeout_s = reduced() ? 240 : 180;
    o.kill_on_failure = 1;
    struct mp_result res;
    assert_int_equal(mp_run(&o, rank_main, NULL, &res), 0);
}

static void test_ops_2(void **s)
{
    (void)s;
    run_world(2);
}

static void test_ops_3(void **s)
{
    (void)s;
    run_world(3);
}

static void test_ops_4(void **s)
{
    (void)s;
    run_world(4);
}

/* monitored_barrier with ranks that never arrive: rank 0 names them. */
static int mb_main(int rank, int n, void *arg)
{
    int wait_all = *(int *)arg;
    c10d_pg_opts po = {0};
    po.timeout_ms = 30000;
    c10d_pg *pg;
    MP_CHECK(c10d_pg_init(&po, &pg) == 0, "init: %s", c10d_last_error());
    c10d_work *w;
    MP_CHECK(c10d_monitored_barrier(pg, wait_all, &(c10d_op_opts){.timeout_ms = 20000}, &w) == 0 &&
                 c10d_work_wait_release(w) == 0,
             "first barrier: %s", c10d_last_error());
    if (rank >= n - 2 && (wait_all || rank == n - 1)) {
        /* Never arrives; stays alive until the others are done. */
        sleep(30);
        return 0;
    }
    int rc = c10d_monitored_barrier(pg, wait_all, &(c10d_op_opts){.timeout_ms = 1500}, &w);
    MP_CHECK(rc == 0, "post: %s", c10d_last_error());
    rc = c10d_work_wait_release(w);
    MP_CHECK(rc == C10D_ETIMEDOUT, "status %d: %s", rc, c10d_last_error());
    if (rank == 0) {
        char want[128];
        if (wait_all)
            snprintf(want, sizeof want,
                     "[Rank 0]: Ranks %d, %d failed to pass monitoredBarrier in 1500 ms", n - 2,
                     n - 1);
        else
            snprintf(want, sizeof want,
                     "[Rank 0]: Rank %d failed to pass monitoredBarrier in 1500 ms\n Original "
                     "exception: \n",
                     n - 1);
        /* wait_all: exactly torch's text; else torch's, then the receive's reason. */
        MP_CHECK(wait_all ? strcmp(c10d_last_error(), want) == 0
                          : strncmp(c10d_last_error(), want, strlen(want)) == 0,
                 "message \"%s\", want \"%s\"", c10d_last_error(), want);
        MP_CHECK(strstr(c10d_last_error(), "Watchdog caught") == NULL,
                 "an internal op's watchdog text leaked: %s", c10d_last_error());
    } else {
        char want[256];
        snprintf(want, sizeof want,
                 "Rank %d successfully reached monitoredBarrier, but received errors while "
                 "waiting for send/recv from rank 0. Please check rank 0 logs for faulty rank.\n "
                 "Original exception: \n",
                 rank);
        MP_CHECK(strncmp(c10d_last_error(), want, strlen(want)) == 0, "message \"%s\"",
                 c10d_last_error());
    }
    c10d_pg_abort(pg, "test done");
    c10d_shutdown();
    return 0;
}

static void test_monitored_barrier_missing(void **s)
{
    (void)s;
    for (int wait_all = 0; wait_all < 2; wait_all++) {
        struct mp_opts o = {0};
        o.nranks = 4;
        o.timeout_s = 60;
        o.kill_on_failure = 1;
        /* The absent ranks sleep: once the others are through, end them. */
        o.kill_after_exits = wait_all ? 2 : 3;
        struct mp_result res;
        mp_run(&o, mb_main, &wait_all, &res);
        int present = wait_all ? 2 : 3;
        assert_false(res.timed_out);
        for (int r = 0; r < present; r++)
            assert_int_equal(res.codes[r], 0);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ops_2),
        cmocka_unit_test(test_ops_3),
        cmocka_unit_test(test_ops_4),
        cmocka_unit_test(test_monitored_barrier_missing),
    };
    /* C10D_TEST_FILTER=test_ops_3 runs one test (for hunting a flaky one). */
    const char *only = getenv("C10D_TEST_FILTER");
    if (only != NULL && *only != '\0')
        cmocka_set_test_filter(only);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
