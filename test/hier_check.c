/* One rank of test_hier.sh: a group whose ranks sit in two network
 * namespaces ("hosts"), several in each, checks every host-aware op
 * (all_reduce, broadcast, reduce, all_gather, reduce_scatter: reductions,
 * dtypes, sizes across the segment's chunking, every root, in place and not)
 * against values it computes itself, and says which path the group took. env:// rendezvous
 * (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE). Exit 0 when every check passed. */
#include "backends/tcp/p2p_lane.h"
#include "c10d.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank, world, fails;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "rank %d: ", rank);                                                    \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            if (++fails > 10)                                                                      \
                exit(1);                                                                           \
        }                                                                                          \
    } while (0)

static double input(int r, size_t i)
{
    return (double)((r + 1) * (int)(i % 7 + 1));
}

static double expect_reduced(c10d_reduce_op op, size_t i)
{
    double sum = 0, max = 0;
    for (int r = 0; r < world; r++) {
        sum += input(r, i);
        max = fmax(max, input(r, i));
    }
    switch (op) {
    case C10D_AVG:
        return sum / world;
    case C10D_MAX:
        return max;
    case C10D_PREMUL_SUM:
        return sum * 0.5;
    default:
        return sum;
    }
}

static void fill(void *buf, c10d_dtype dt, size_t n, int r)
{
    for (size_t i = 0; i < n; i++) {
        if (dt == C10D_FLOAT32)
            ((float *)buf)[i] = (float)input(r, i);
        else if (dt == C10D_FLOAT64)
            ((double *)buf)[i] = input(r, i);
        else
            ((int64_t *)buf)[i] = (int64_t)input(r, i);
    }
}

static double at(const void *buf, c10d_dtype dt, size_t i)
{
    return dt == C10D_FLOAT32   ? ((const float *)buf)[i]
           : dt == C10D_FLOAT64 ? ((const double *)buf)[i]
                                : (double)((const int64_t *)buf)[i];
}

/* The op's call status, else its work's. */
static int waited(int rc, c10d_work **w)
{
    return rc != 0 ? rc : c10d_work_wait_release(*w);
}

static int close_to(double got, double want)
{
    return fabs(got - want) <= 1e-5 * fmax(1.0, fabs(want));
}

static void check_all_reduce(c10d_pg *pg, c10d_dtype dt, c10d_reduce_op op, size_t n, int in_place)
{
    size_t esz = c10d_dtype_size(dt);
    char *a = malloc(n * esz + 1), *b = in_place ? a : malloc(n * esz + 1);
    fill(a, dt, n, rank);
    c10d_op_opts o = C10D_OP_OPTS_INIT;
    o.premul_factor = 0.5;
    c10d_work *w = NULL;
    int rc = waited(c10d_all_reduce(pg, a, b, n, dt, op, &o, &w), &w);
    CHECK(rc == 0, "all_reduce %s op %d n %zu: %s", c10d_dtype_name(dt), (int)op, n,
          c10d_last_error());
    for (size_t i = 0; rc == 0 && i < n; i++)
        if (!close_to(at(b, dt, i), expect_reduced(op, i))) {
            CHECK(0, "all_reduce %s op %d n %zu%s: [%zu] = %g, want %g", c10d_dtype_name(dt),
                  (int)op, n, in_place ? " in place" : "", i, at(b, dt, i), expect_reduced(op, i));
            break;
        }
    if (!in_place)
        free(b);
    free(a);
}

static void check_broadcast(c10d_pg *pg, size_t n, int root, int in_place)
{
    float *a = malloc(n * 4 + 4), *b = in_place ? a : malloc(n * 4 + 4);
    fill(a, C10D_FLOAT32, n, rank);
    if (!in_place)
        memset(b, 0xff, n * 4);
    int rc = c10d_broadcast_sync(pg, a, b, n, C10D_FLOAT32, root);
    CHECK(rc == 0, "broadcast root %d n %zu: %s", root, n, c10d_last_error());
    for (size_t i = 0; rc == 0 && i < n; i++)
        if (b[i] != (float)input(root, i)) {
            CHECK(0, "broadcast root %d n %zu: [%zu] = %g, want %g", root, n, i, b[i],
                  input(root, i));
            break;
        }
    if (!in_place)
        free(b);
    free(a);
}

/* reduce; in place: the root reduces into its input, the others pass no
 * output at all. */
static void check_reduce(c10d_pg *pg, size_t n, int root, c10d_reduce_op op, int in_place)
{
    float *a = malloc(n * 4 + 4), *b = in_place ? (rank == root ? a : NULL) : malloc(n * 4 + 4);
    fill(a, C10D_FLOAT32, n, rank);
    c10d_op_opts o = C10D_OP_OPTS_INIT;
    o.premul_factor = 0.5;
    c10d_work *w = NULL;
    int rc = waited(c10d_reduce(pg, a, b, n, C10D_FLOAT32, op, root, &o, &w), &w);
    CHECK(rc == 0, "reduce root %d n %zu: %s", root, n, c10d_last_error());
    for (size_t i = 0; rc == 0 && rank == root && i < n; i++)
        if (!close_to(b[i], expect_reduced(op, i))) {
            CHECK(0, "reduce op %d root %d n %zu%s: [%zu] = %g, want %g", (int)op, root, n,
                  in_place ? " in place" : "", i, b[i], expect_reduced(op, i));
            break;
        }
    if (!in_place)
        free(b);
    free(a);
}

/* all_gather, in place (send NULL: this rank's block of recv) or not. */
static void check_all_gather(c10d_pg *pg, c10d_dtype dt, size_t n, int in_place)
{
    size_t esz = dt == C10D_FLOAT32 ? 4 : 8;
    char *g = malloc((size_t)world * n * esz + 1), *mine = malloc(n * esz + 1);
    memset(g, 0xee, (size_t)world * n * esz);
    fill(in_place ? g + (size_t)rank * n * esz : mine, dt, n, rank);
    c10d_work *w = NULL;
    int rc = waited(c10d_all_gather(pg, in_place ? NULL : mine, g, n, dt, NULL, &w), &w);
    CHECK(rc == 0, "all_gather n %zu: %s", n, c10d_last_error());
    for (int r = 0; rc == 0 && r < world; r++)
        for (size_t i = 0; i < n; i++)
            if (at(g + (size_t)r * n * esz, dt, i) != input(r, i)) {
                CHECK(0, "all_gather dtype %d n %zu in place %d: block %d [%zu] = %g, want %g",
                      (int)dt, n, in_place, r, i, at(g + (size_t)r * n * esz, dt, i), input(r, i));
                r = world;
                break;
            }
    free(g);
    free(mine);
}

static void put(void *buf, c10d_dtype dt, size_t i, double v)
{
    if (dt == C10D_FLOAT32)
        ((float *)buf)[i] = (float)v;
    else if (dt == C10D_FLOAT64)
        ((double *)buf)[i] = v;
    else
        ((int64_t *)buf)[i] = (int64_t)v;
}

/* reduce_scatter: element i of block b holds this rank's input at i + b, so
 * a block that lands on the wrong rank shows. */
static void check_reduce_scatter(c10d_pg *pg, c10d_dtype dt, c10d_reduce_op op, size_t n)
{
    size_t esz = dt == C10D_FLOAT32 ? 4 : 8;
    char *in = malloc((size_t)world * n * esz + 1), *out = malloc(n * esz + 1);
    for (int b = 0; b < world; b++)
        for (size_t i = 0; i < n; i++)
            put(in, dt, (size_t)b * n + i, input(rank, i + (size_t)b));
    c10d_op_opts oo = C10D_OP_OPTS_INIT;
    oo.premul_factor = 0.5;
    c10d_work *w = NULL;
    int rc = waited(c10d_reduce_scatter(pg, in, out, n, dt, op, &oo, &w), &w);
    CHECK(rc == 0, "reduce_scatter n %zu: %s", n, c10d_last_error());
    for (size_t i = 0; rc == 0 && i < n; i++)
        if (!close_to(at(out, dt, i), expect_reduced(op, i + (size_t)rank))) {
            CHECK(0, "reduce_scatter dtype %d op %d n %zu: [%zu] = %g, want %g", (int)dt, (int)op,
                  n, i, at(out, dt, i), expect_reduced(op, i + (size_t)rank));
            break;
        }
    free(in);
    free(out);
}

/* P2P, each rank to the rank `step` after it: pairs within a host (through
 * that host's segment's rings) and across hosts (the sockets) alike. */
static void check_p2p(c10d_pg *pg, size_t n, int step)
{
    int to = (rank + step) % world, from = (rank + world - step % world) % world;
    int64_t *out = malloc(n * sizeof *out), *in = calloc(n, sizeof *in);
    for (size_t i = 0; i < n; i++)
        out[i] = (int64_t)rank * 1000003 + (int64_t)i;
    c10d_p2p_op ops[2] = {{C10D_P2P_SEND, out, n, C10D_INT64, to, step},
                          {C10D_P2P_RECV, in, n, C10D_INT64, from, step}};
    c10d_work *w = NULL;
    int rc = waited(c10d_batch_isend_irecv(pg, ops, 2, NULL, &w), &w);
    CHECK(rc == 0, "p2p %zu to %d from %d: %s", n, to, from, c10d_last_error());
    for (size_t i = 0; rc == 0 && i < n; i++)
        if (in[i] != (int64_t)from * 1000003 + (int64_t)i) {
            CHECK(0, "p2p %zu from %d: element %zu wrong", n, from, i);
            break;
        }
    free(out);
    free(in);
}

/* Receives from any source at rank 0: a message from every other rank of
 * rank 0's host first (waiting in their mailboxes: taken in the lane), then
 * from every rank of the other hosts (the sockets); each arrives once,
 * naming its sender's group rank. HIER_HOSTS: the job's layout, a letter a
 * host per rank (test_hier.sh); without it, all in one phase. */
static void check_any_source(c10d_pg *pg)
{
    const char *hosts = getenv("HIER_HOSTS");
    int layout = hosts != NULL && (int)strlen(hosts) == world;
    for (int phase = 0; phase < 2; phase++) {
        int64_t v = (int64_t)rank * 7919, got = -1;
        int local = !layout || hosts[rank] == hosts[0];
        int sends_now = rank != 0 && (phase == 0 ? local : !local);
        c10d_work *sent = NULL;
        if (sends_now)
            CHECK(c10d_send(pg, &v, 1, C10D_INT64, 0, 9, NULL, &sent) == 0, "any-source send: %s",
                  c10d_last_error());
        CHECK(c10d_barrier_sync(pg) == 0, "barrier: %s", c10d_last_error());
        for (int r = 1; rank == 0 && r < world; r++) {
            int r_local = !layout || hosts[r] == hosts[0];
            if (phase == 0 ? !r_local : r_local)
                continue;
            c10d_work *w = NULL;
            int rc = c10d_recv(pg, &got, 1, C10D_INT64, C10D_ANY_SOURCE, 9, NULL, &w);
            rc = rc != 0 ? rc : c10d_work_wait(w, -1);
            int from = rc == 0 ? c10d_work_source_rank(w) : -1;
            c10d_work_release(w);
            CHECK(rc == 0 && from > 0 && from < world && got == (int64_t)from * 7919,
                  "any-source receive (phase %d): %s, source %d, value %lld", phase,
                  rc != 0 ? c10d_last_error() : "ok", from, (long long)got);
        }
        if (sent != NULL)
            CHECK(c10d_work_wait_release(sent) == 0, "any-source send: %s", c10d_last_error());
        CHECK(c10d_barrier_sync(pg) == 0, "barrier: %s", c10d_last_error());
    }
}

int main(void)
{
    c10d_pg *pg = NULL;
    c10d_pg_opts po = C10D_PG_OPTS_INIT;
    po.timeout_ms = 60000;
    if (c10d_pg_init(&po, &pg) != 0) {
        fprintf(stderr, "init: %s\n", c10d_last_error());
        /* In a mismatch run a fast rank's first all_reduce may fail the group
         * before a slower one finished creating it: that rank learns of the
         * mismatch at creation, which is as good. */
        if (getenv("HIER_MISMATCH") != NULL &&
            strstr(c10d_last_error(), "Detected mismatch") != NULL)
            return 3;
        return 2;
    }
    rank = c10d_pg_rank(pg);
    world = c10d_pg_size(pg);
    const char *want = getenv("HIER_EXPECT_PATH");
    const char *path = c10d_pg_host_path(pg);
    CHECK(want == NULL || (path != NULL && strcmp(path, want) == 0), "host path %s, want %s",
          path ? path : "(none)", want);
    /* HIER_MISMATCH="r1,r2,...": those ranks call the first all_reduce with
     * another dtype; every rank must fail naming the mismatch (exit 3).
     * HIER_MISMATCH_COUNT: its elements (4; from 65536, by slices where the
     * hosts hold equal numbers of ranks). */
    const char *mm = getenv("HIER_MISMATCH");
    if (mm != NULL) {
        char me[16];
        snprintf(me, sizeof me, "%d", rank);
        int odd = 0;
        for (const char *p = mm; *p != '\0'; p += strcspn(p, ","), p += *p == ',')
            odd |= strncmp(p, me, strcspn(p, ",")) == 0 && strcspn(p, ",") == strlen(me);
        const char *mc = getenv("HIER_MISMATCH_COUNT");
        size_t count = mc != NULL ? strtoul(mc, NULL, 10) : 4;
        float *x = calloc(count, sizeof *x);
        CHECK(x != NULL, "out of memory");
        c10d_work *w = NULL;
        int rc = waited(
            c10d_all_reduce(pg, x, x, count, odd ? C10D_INT32 : C10D_FLOAT32, C10D_SUM, NULL, &w),
            &w);
        free(x);
        fprintf(stderr, "rank %d (mismatch run, %s): %s: %s\n", rank, odd ? "int32" : "float32",
                c10d_status_name(rc), rc ? c10d_last_error() : "");
        int named = rc != 0 && strstr(c10d_last_error(), "Detected mismatch") != NULL;
        c10d_pg_abort(pg, "mismatch run");
        c10d_shutdown();
        return named ? 3 : 4;
    }
    /* HIER_TRAFFIC=n: only 10 all_gathers and 10 reduce_scatters of n
     * floats per block, for test_hier.sh to count the bytes that cross
     * between the hosts. */
    const char *traffic = getenv("HIER_TRAFFIC");
    if (traffic != NULL) {
        size_t n = strtoul(traffic, NULL, 10);
        for (int k = 0; k < 10; k++) {
            check_all_gather(pg, C10D_FLOAT32, n, k & 1);
            check_reduce_scatter(pg, C10D_FLOAT32, C10D_SUM, n);
        }
        CHECK(c10d_barrier_sync(pg) == 0, "barrier: %s", c10d_last_error());
        c10d_pg_destroy(pg);
        c10d_shutdown();
        return fails == 0 ? 0 : 1;
    }
    /* 150000 spans several 256 KiB chunks; it and 70001 are all_reduced by
     * slices where the hosts hold equal numbers of ranks, 70001 with a
     * remainder on 2 and on 3 ranks per host. */
    const size_t sizes[] = {1, 7, 1000, 150000, 70001};
    const size_t nsizes = sizeof sizes / sizeof sizes[0];
    const c10d_dtype dts[] = {C10D_FLOAT32, C10D_FLOAT64, C10D_INT64};
    /* HIER_LOOP: over and over until something fails (a peer killed). */
    int loop = getenv("HIER_LOOP") != NULL;
    for (size_t s = 0; s < nsizes; s = loop && fails == 0 ? (s + 1) % nsizes : s + 1) {
        for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++) {
            check_all_reduce(pg, dts[d], C10D_SUM, sizes[s], s & 1);
            check_all_reduce(pg, dts[d], C10D_MAX, sizes[s], !(s & 1));
        }
        check_all_reduce(pg, C10D_FLOAT32, C10D_AVG, sizes[s], 0);
        check_all_reduce(pg, C10D_FLOAT64, C10D_PREMUL_SUM, sizes[s], 1);
        for (int root = 0; root < world; root++) {
            check_broadcast(pg, sizes[s], root, root & 1);
            check_reduce(pg, sizes[s], root, root & 1 ? C10D_AVG : C10D_SUM, 0);
            check_reduce(pg, sizes[s], root, root & 1 ? C10D_PREMUL_SUM : C10D_MAX, 1);
        }
        /* Host-aware where the hosts hold equal ranges of ranks, flat
         * otherwise: the same answers either way. */
        check_all_gather(pg, C10D_FLOAT32, sizes[s], s & 1);
        check_all_gather(pg, C10D_INT64, sizes[s], !(s & 1));
        check_reduce_scatter(pg, C10D_FLOAT32, C10D_SUM, sizes[s]);
        check_reduce_scatter(pg, C10D_FLOAT64, C10D_AVG, sizes[s]);
        check_reduce_scatter(pg, C10D_INT64, C10D_MAX, sizes[s]);
        check_reduce_scatter(pg, C10D_FLOAT64, C10D_PREMUL_SUM, sizes[s]);
        check_p2p(pg, sizes[s], 1);
        check_p2p(pg, sizes[s], 2);
    }
    if (!loop) {
        check_any_source(pg);
        CHECK(c10d_barrier_sync(pg) == 0, "barrier: %s", c10d_last_error());
    }
    uint64_t lane_sends, lane_recvs;
    c10d__tcp_p2p_lane_counts(&lane_sends, &lane_recvs);
    printf("rank %d: P2P lane: %llu sends, %llu receives\n", rank, (unsigned long long)lane_sends,
           (unsigned long long)lane_recvs);
    if (fails == 0)
        printf("rank %d: all checks passed on path %s\n", rank, path ? path : "(none)");
    c10d_pg_destroy(pg);
    c10d_shutdown();
    return fails == 0 ? 0 : 1;
}
