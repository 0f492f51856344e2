/* tcp backend: every collective against a reference computed here, with real
 * processes on loopback (2, 3, 4, 5 ranks), every dtype and reduce op, sizes
 * 0, 1, 7, 4099 elements and 8 MiB, in place and out of place, under the
 * default thresholds and with each algorithm forced; results bit-identical on
 * every rank. */
#include "tcp_harness.h"

#include "bench/data.h"
#include "engine/kernels/reduce.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>
#include <cmocka.h>

static const c10d_dtype dtypes[] = {C10D_FLOAT32, C10D_FLOAT64,   C10D_FLOAT16,   C10D_BFLOAT16,
                                    C10D_INT8,    C10D_UINT8,     C10D_INT32,     C10D_INT64,
                                    C10D_BOOL,    C10D_INT16,     C10D_UINT16,    C10D_UINT32,
                                    C10D_UINT64,  C10D_COMPLEX64, C10D_COMPLEX128};
#define NDTYPES (sizeof dtypes / sizeof dtypes[0])
static const size_t small_sizes[] = {0, 1, 7, 4099};
#define NSIZES (sizeof small_sizes / sizeof small_sizes[0])
#define PREMUL 0.5

/* Values whose reductions are exact in every dtype (bfloat16 included), so
 * any summation order gives the reference's bits. */
static double gen(c10d_reduce_op op, c10d_dtype dt, int rank, size_t i)
{
    if (dt == C10D_BOOL)
        return (double)(((i + (size_t)rank) % 3) != 0);
    if (op == C10D_PRODUCT)
        return 1.0 + (double)((i + (size_t)rank) % 2);
    if (op == C10D_BAND || op == C10D_BOR || op == C10D_BXOR)
        return (double)((i * 7 + (size_t)rank * 3) & 0x3f);
    return (double)((rank + 1) * (int)((i % 5) + 1));
}

/* rank's contribution: element i of block b is gen(rank, b * 1000 + i). */
static void fill(c10d_reduce_op op, c10d_dtype dt, int rank, void *buf, size_t n, size_t block)
{
    for (size_t i = 0; i < n; i++)
        data_store(buf, i, dt, gen(op, dt, rank, block * 1000 + i));
}

/* The reduction over all ranks of block `block`, in rank order. */
static void reference(c10d_reduce_op op, c10d_dtype dt, int size, void *out, size_t n, size_t block)
{
    size_t esz = c10d_dtype_size(dt);
    void *tmp = malloc(n * esz + 1);
    fill(op, dt, 0, out, n, block);
    if (op == C10D_PREMUL_SUM)
        c10d__reduce_premul(out, n, dt, PREMUL);
    for (int q = 1; q < size; q++) {
        fill(op, dt, q, tmp, n, block);
        if (op == C10D_PREMUL_SUM)
            c10d__reduce_premul(tmp, n, dt, PREMUL);
        c10d__reduce(out, tmp, n, dt, op);
    }
    c10d__reduce_finish(out, n, dt, op, size);
    free(tmp);
}

static int same(const void *a, const void *b, size_t bytes)
{
    return bytes == 0 || memcmp(a, b, bytes) == 0;
}

#define DESC(h, what, dt, op, n, inplace)                                                          \
    "%s %s %s n=%zu %s (ranks %d)", what, c10d_dtype_name(dt), c10d_reduce_op_name(op), n,         \
        inplace ? "in place" : "out of place", (h)->size

/* ---------------------------------------------------------- reductions */

static int check_reductions(struct h_ctx *h, c10d_dtype dt, c10d_reduce_op op, size_t n,
                            int inplace)
{
    int p = h->size, r = h->rank;
    size_t esz = c10d_dtype_size(dt), bytes = n * esz;
    char *send = malloc((size_t)p * bytes + 1), *recv = malloc((size_t)p * bytes + 1);
    char *ref = malloc((size_t)p * bytes + 1);
    int rc;

    /* all_reduce */
    fill(op, dt, r, send, n, 0);
    reference(op, dt, p, ref, n, 0);
    struct c10d__op o = h_op_init(C10D_OP_ALL_REDUCE, n, dt);
    o.send = send;
    o.recv = inplace ? send : recv;
    o.redop = op;
    o.premul_factor = PREMUL;
    rc = h_op(h, &o);
    H_CHECK(h, rc == 0, DESC(h, "all_reduce", dt, op, n, inplace));
    H_CHECK(h, same(o.recv, ref, bytes), DESC(h, "all_reduce wrong", dt, op, n, inplace));
    if (!inplace) {
        char *orig = malloc(bytes + 1);
        fill(op, dt, r, orig, n, 0);
        H_CHECK(h, same(send, orig, bytes),
                DESC(h, "all_reduce modified the send buffer", dt, op, n, inplace));
        free(orig);
    }

    /* reduce to the last rank */
    int root = p - 1;
    fill(op, dt, r, send, n, 0);
    o = h_op_init(C10D_OP_REDUCE, n, dt);
    o.send = send;
    o.recv = r == root ? (inplace ? send : recv) : NULL;
    o.redop = op;
    o.premul_factor = PREMUL;
    o.root = root;
    rc = h_op(h, &o);
    H_CHECK(h, rc == 0, DESC(h, "reduce", dt, op, n, inplace));
    if (r == root)
        H_CHECK(h, same(o.recv, ref, bytes), DESC(h, "reduce wrong", dt, op, n, inplace));

    /* reduce_scatter: block b of our send buffer is our contribution to rank b */
    for (int b = 0; b < p; b++)
        fill(op, dt, r, send + (size_t)b * bytes, n, (size_t)b);
    reference(op, dt, p, ref, n, (size_t)r);
    o = h_op_init(C10D_OP_REDUCE_SCATTER, n, dt);
    o.send = send;
    o.recv = inplace ? send + (size_t)r * bytes : recv;
    o.redop = op;
    o.premul_factor = PREMUL;
    rc = h_op(h, &o);
    H_CHECK(h, rc == 0, DESC(h, "reduce_scatter", dt, op, n, inplace));
    H_CHECK(h, same(o.recv, ref, bytes), DESC(h, "reduce_scatter wrong", dt, op, n, inplace));

    /* list form */
    const void *sends[64];
    for (int b = 0; b < p; b++) {
        fill(op, dt, r, send + (size_t)b * bytes, n, (size_t)b);
        sends[b] = send + (size_t)b * bytes;
    }
    o = h_op_init(C10D_OP_REDUCE_SCATTER, n, dt);
    o.sends = sends;
    o.recv = recv;
    o.redop = op;
    o.premul_factor = PREMUL;
    rc = h_op(h, &o);
    H_CHECK(h, rc == 0, DESC(h, "reduce_scatter_list", dt, op, n, inplace));
    H_CHECK(h, same(recv, ref, bytes), DESC(h, "reduce_scatter_list wrong", dt, op, n, inplace));

    free(send);
    free(recv);
    free(ref);
    return 0;
}

/* ------------------------------------------------------- data movement */

static int check_movement(struct h_ctx *h, c10d_dtype dt, size_t n, int inplace)
{
    int p = h->size, r = h->rank;
    c10d_reduce_op op = C10D_SUM;
    size_t esz = c10d_dtype_size(dt), bytes = n * esz;
    size_t cap = (size_t)p * (bytes + 4 * esz) + 1;
    char *send = malloc(cap), *recv = malloc(cap), *ref = malloc(cap);
    int rc;

    /* broadcast from rank 1 % p */
    int root = 1 % p;
    fill(op, dt, r, send, n, 0);
    fill(op, dt, root, ref, n, 0);
    memset(recv, 0xab, bytes);
    struct c10d__op o = h_op_init(C10D_OP_BROADCAST, n, dt);
    o.send = send;
    o.recv = inplace ? send : recv;
    o.root = root;
    rc = h_op(h, &o);
    H_CHECK(h, rc == 0, DESC(h, "broadcast", dt, op, n, inplace));
    H_CHECK(h, same(o.recv, ref, bytes), DESC(h, "broadcast wrong", dt, op, n, inplace));

    /* all_gather, single buffer and list */
    for (int q = 0; q < p; q++)
        fill(op, dt, q, ref + (size_t)q * bytes, n, 0);
    memset(recv, 0xab, (size_t)p * bytes);
    if (inplace)
        fill(op, dt, r, recv + (size_t)r * bytes, n, 0);
    else
        fill(op, dt, r, send, n, 0);
    o = h_op_init(C10D_OP_ALL_GATHER, n, dt);
    o.send = inplace ? recv + (size_t)r * bytes : send;
    o.recv = recv;
    rc = h_op(h, &o);
    H_CHECK(h, rc == 0, DESC(h, "all_gather", dt, op, n, inplace));
    H_CHECK(h, same(recv, ref, (size_t)p * bytes), DESC(h, "all_gather wrong", dt, op, n, inplace));
    void *recvs[64];
    memset(recv, 0xab, (size_t)p * bytes);
    for (int q = 0; q < p; q++)
        recvs[p - 1 - q] = recv + (size_t)q * bytes; /* not in rank order in memory */
    fill(op, dt, r, send, n, 0);
    o = h_op_init(C10D_OP_ALL_GATHER, n, dt);
    o.send = send;
    o.recvs = recvs;
    rc = h_op(h, &o);
    H_CHECK(h, rc == 0, DESC(h, "all_gather_list", dt, op, n, inplace));
    for (int q = 0; q < p; q++)
        H_CHECK(h, same(recvs[q], ref + (size_t)q * bytes, bytes),
                DESC(h, "all_gather_list wrong", dt, op, n, inplace));

    /* gather to rank 0 */
    fill(op, dt, r, send, n, 0);
    memset(recv, 0xab, (size_t)p * bytes);
    o = h_op_init(C10D_OP_GATHER, n, dt);
    o.send = send;
    o.recv = r == 0 ? recv : NULL;
    o.root = 0;
    if (inplace && r == 0) {
        fill(op, dt, r, recv, n, 0);
        o.send = recv;
    }
    rc = h_op(h, &o);
    H_CHECK(h, rc == 0, DESC(h, "gather", dt, op, n, inplace));
    if (r == 0)
        H_CHECK(h, same(recv, ref, (size_t)p * bytes), DESC(h, "gather wrong", dt, op, n, inplace));

    /* scatter from the last rank: block q of the root's buffer goes to q */
    root = p - 1;
    for (int q = 0; q < p; q++)
        fill(op, dt, root, send + (size_t)q * bytes, n, (size_t)q);
    fill(op, dt, root, ref, n, (size_t)r);
    memset(recv, 0xab, bytes);
    o = h_op_init(C10D_OP_SCATTER, n, dt);
    o.send = r == root ? send : NULL;
    o.recv = inplace && r == root ? send + (size_t)r * bytes : recv;
    o.root = root;
    rc = h_op(h, &o);
    H_CHECK(h, rc == 0, DESC(h, "scatter", dt, op, n, inplace));
    H_CHECK(h, same(o.recv, ref, bytes), DESC(h, "scatter wrong", dt, op, n, inplace));

    /* all_to_all_single, even split: block d of rank q's input goes to d */
    for (int d = 0; d < p; d++)
        fill(op, dt, r, send + (size_t)d * bytes, n, (size_t)d);
    for (int q = 0; q < p; q++)
        fill(op, dt, q, ref + (size_t)q * bytes, n, (size_t)r);
    o = h_op_init(C10D_OP_ALL_TO_ALL, (size_t)p * n, dt);
    o.send = send;
    o.recv = inplace ? send : recv;
    rc = h_op(h, &o);
    H_CHECK(h, rc == 0, DESC(h, "all_to_all_single", dt, op, n, inplace));
    H_CHECK(h, same(o.recv, ref, (size_t)p * bytes),
            DESC(h, "all_to_all_single wrong", dt, op, n, inplace));

    /* uneven splits: rank q sends (q + d) % 3 + n elements to d */
    size_t scounts[64], rcounts[64], total_s = 0, total_r = 0;
    for (int d = 0; d < p; d++) {
        scounts[d] = (size_t)((r + d) % 3) + n;
        rcounts[d] = (size_t)((d + r) % 3) + n;
        fill(op, dt, r, send + total_s * esz, scounts[d], (size_t)d);
        fill(op, dt, d, ref + total_r * esz, rcounts[d], (size_t)r);
        total_s += scounts[d];
        total_r += rcounts[d];
    }
    o = h_op_init(C10D_OP_ALL_TO_ALL, total_s, dt);
    o.send = send;
    o.recv = recv;
    o.send_counts = scounts;
    o.recv_counts = rcounts;
    rc = h_op(h, &o);
    H_CHECK(h, rc == 0, DESC(h, "all_to_all uneven", dt, op, n, inplace));
    H_CHECK(h, same(recv, ref, total_r * esz),
            DESC(h, "all_to_all uneven wrong", dt, op, n, inplace));

    /* list form, uneven */
    const void *sl[64];
    void *rl[64];
    size_t off_s = 0, off_r = 0;
    for (int d = 0; d < p; d++) {
        sl[d] = send + off_s * esz;
        rl[d] = recv + off_r * esz;
        off_s += scounts[d];
        off_r += rcounts[d];
    }
    memset(recv, 0xab, total_r * esz);
    o = h_op_init(C10D_OP_ALL_TO_ALL, 0, dt);
    o.sends = sl;
    o.recvs = rl;
    o.send_counts = scounts;
    o.recv_counts = rcounts;
    rc = h_op(h, &o);
    H_CHECK(h, rc == 0, DESC(h, "all_to_all list", dt, op, n, inplace));
    H_CHECK(h, same(recv, ref, total_r * esz),
            DESC(h, "all_to_all list wrong", dt, op, n, inplace));

    struct c10d__op b = h_op_init(C10D_OP_BARRIER, 0, C10D_UINT8);
    H_CHECK(h, h_op(h, &b) == 0, "barrier: %s", c10d_last_error());
    free(send);
    free(recv);
    free(ref);
    return 0;
}

static int matrix_body(struct h_ctx *h, void *arg)
{
    int reductions_only = arg != NULL;
    for (size_t di = 0; di < NDTYPES; di++) {
        c10d_dtype dt = dtypes[di];
        for (size_t si = 0; si < NSIZES; si++) {
            for (int inplace = 0; inplace < 2; inplace++) {
                for (int op = 0; op < C10D_REDUCE_OP_COUNT; op++) {
                    if (c10d_reduce_op_check((c10d_reduce_op)op, dt) != 0)
                        continue;
                    if (check_reductions(h, dt, (c10d_reduce_op)op, small_sizes[si], inplace))
                        return 1;
                }
                if (!reductions_only && check_movement(h, dt, small_sizes[si], inplace))
                    return 1;
            }
        }
    }
    /* 8 MiB: the bandwidth algorithms. */
    size_t big = (size_t)8 << 20;
    for (int inplace = 0; inplace < 2; inplace++) {
        if (check_reductions(h, C10D_FLOAT32, C10D_SUM, big / 4 / (size_t)h->size, inplace) ||
            check_reductions(h, C10D_BFLOAT16, C10D_AVG, big / 2 / (size_t)h->size, inplace) ||
            check_reductions(h, C10D_FLOAT32, C10D_PREMUL_SUM, big / 4 / (size_t)h->size,
                             inplace) ||
            check_reductions(h, C10D_INT64, C10D_MAX, big / 8, inplace))
            return 1;
        if (!reductions_only && check_movement(h, C10D_FLOAT32, big / 4 / (size_t)h->size, inplace))
            return 1;
    }
    return 0;
}

static void run_matrix(int size, const char *variant)
{
    int st[8];
    unsetenv("C10D_TCP_RD_MAX");
    unsetenv("C10D_TCP_RING_MIN");
    unsetenv("C10D_TCP_SEGMENT");
    unsetenv("C10D_TCP_EAGER_MAX");
    void *arg = NULL;
    if (strcmp(variant, "halving") == 0) {
        setenv("C10D_TCP_RD_MAX", "1", 1);
        setenv("C10D_TCP_RING_MIN", "1000000000000", 1);
        arg = (void *)1;
    } else if (strcmp(variant, "ring") == 0) {
        setenv("C10D_TCP_RING_MIN", "1", 1);
        setenv("C10D_TCP_SEGMENT", "4096", 1);
        setenv("C10D_TCP_EAGER_MAX", "64", 1); /* rendezvous for nearly everything */
        arg = (void *)1;
    }
    fprintf(stderr, "matrix: %d ranks, %s\n", size, variant);
    int rc = h_spawn(size, matrix_body, arg, 400, 120000, 0, st);
    unsetenv("C10D_TCP_RD_MAX");
    unsetenv("C10D_TCP_RING_MIN");
    unsetenv("C10D_TCP_SEGMENT");
    unsetenv("C10D_TCP_EAGER_MAX");
    assert_int_equal(rc, 0);
}

static void test_matrix_2(void **state)
{
    (void)state;
    run_matrix(2, "default");
}

static void test_matrix_3(void **state)
{
    (void)state;
    run_matrix(3, "default");
}

static void test_matrix_4(void **state)
{
    (void)state;
    run_matrix(4, "default");
}

static void test_matrix_5(void **state)
{
    (void)state;
    run_matrix(5, "default");
}

static void test_forced_algorithms(void **state)
{
    (void)state;
    run_matrix(3, "halving");
    run_matrix(5, "halving");
    run_matrix(6, "halving");
    run_matrix(3, "ring");
    run_matrix(6, "ring");
}

/* ----------------------------------------------------- bit-identical */

static uint64_t *hashes; /* shared with the children: [rank][case] */
#define NCASES 4

static int identical_body(struct h_ctx *h, void *arg)
{
    (void)arg;
    /* Random floats: the sum depends on the order, so equal bits on every
     * rank mean one order was used and the result distributed. */
    size_t sizes[NCASES] = {4099, 100003, 3000017, 7};
    uint64_t seed = 0x9e3779b97f4a7c15ull * (uint64_t)(h->rank + 1);
    for (int c = 0; c < NCASES; c++) {
        size_t n = sizes[c];
        float *buf = malloc(n * sizeof(float));
        for (size_t i = 0; i < n; i++) {
            seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
            buf[i] = (float)((double)(seed >> 11) / 9007199254740992.0 * 2.0 - 1.0) *
                     (float)(1 + (i % 1000));
        }
        struct c10d__op o = h_op_init(C10D_OP_ALL_REDUCE, n, C10D_FLOAT32);
        o.send = o.recv = buf;
        o.redop = c == 3 ? C10D_AVG : C10D_SUM;
        H_CHECK(h, h_op(h, &o) == 0, "all_reduce %zu: %s", n, c10d_last_error());
        uint64_t x = 1469598103934665603ull;
        const unsigned char *b = (const unsigned char *)buf;
        for (size_t i = 0; i < n * sizeof(float); i++)
            x = (x ^ b[i]) * 1099511628211ull;
        hashes[h->rank * NCASES + c] = x;
        free(buf);
    }
    return 0;
}

static void test_bit_identical(void **state)
{
    (void)state;
    hashes = mmap(NULL, 64 * NCASES * sizeof(uint64_t), PROT_READ | PROT_WRITE,
                  MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(hashes != MAP_FAILED);
    int st[8];
    for (int size = 2; size <= 6; size++) {
        memset(hashes, 0, 64 * NCASES * sizeof(uint64_t));
        assert_int_equal(h_spawn(size, identical_body, NULL, 120, 60000, 0, st), 0);
        for (int r = 1; r < size; r++)
            for (int c = 0; c < NCASES; c++)
                assert_true(hashes[r * NCASES + c] == hashes[c]);
    }
    munmap(hashes, 64 * NCASES * sizeof(uint64_t));
}

/* A coalesced list: two all_reduces and a broadcast, one work. */
static int coalesced_body(struct h_ctx *h, void *arg)
{
    (void)arg;
    float a[5], b[3000], c[4];
    for (int i = 0; i < 5; i++)
        a[i] = (float)(h->rank + i);
    for (int i = 0; i < 3000; i++)
        b[i] = 1.0f;
    for (int i = 0; i < 4; i++)
        c[i] = h->rank == 0 ? 42.0f : 0.0f;
    struct c10d__op o1 = h_op_init(C10D_OP_ALL_REDUCE, 5, C10D_FLOAT32);
    o1.send = o1.recv = a;
    o1.redop = C10D_SUM;
    struct c10d__op o2 = h_op_init(C10D_OP_ALL_REDUCE, 3000, C10D_FLOAT32);
    o2.send = o2.recv = b;
    o2.redop = C10D_MAX;
    struct c10d__op o3 = h_op_init(C10D_OP_BROADCAST, 4, C10D_FLOAT32);
    o3.send = o3.recv = c;
    o3.root = 0;
    o1.next = &o2;
    o2.next = &o3;
    H_CHECK(h, h_op(h, &o1) == 0, "coalesced: %s", c10d_last_error());
    int p = h->size;
    for (int i = 0; i < 5; i++)
        H_CHECK(h, a[i] == (float)(p * (p - 1) / 2 + p * i), "a[%d] = %g", i, a[i]);
    H_CHECK(h, b[2999] == 1.0f && c[3] == 42.0f, "b or c wrong");
    return 0;
}

static void test_coalesced(void **state)
{
    (void)state;
    int st[8];
    assert_int_equal(h_spawn(3, coalesced_body, NULL, 60, 30000, 0, st), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matrix_2),          cmocka_unit_test(test_matrix_3),
        cmocka_unit_test(test_matrix_4),          cmocka_unit_test(test_matrix_5),
        cmocka_unit_test(test_forced_algorithms), cmocka_unit_test(test_bit_identical),
        cmocka_unit_test(test_coalesced),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
