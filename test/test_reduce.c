/* Reduction kernels, dtype/op tables and conversions against references
 * written here from the format definitions (ldexp decoding, rounding by
 * searching the sorted list of representable values), not from the
 * library's bit tricks. */
#include "c10d.h"
#include "engine/kernels/half.h"
#include "engine/kernels/reduce.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

/* ------------------------------------------------------------ random */

static uint64_t rng_state = 0x9e3779b97f4a7c15u;

static uint64_t rnd(void)
{
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return rng_state = x;
}

/* ------------------------------------------------- format reference */

/* A small binary float format: positive finite patterns 0..max_finite
 * increase in value, so rounding is a search over that list. */
struct fmt {
    int bits;          /* 16 or 8 */
    int mbits, bias;   /* mantissa bits, exponent bias */
    int has_inf;       /* all-ones exponent with zero mantissa is inf */
    uint32_t max_fin;  /* largest finite positive pattern */
    uint32_t overflow; /* what rounding past max_fin gives (inf, or NaN for e4m3fn) */
    double *val;       /* val[p] for p in 0..max_fin */
};

static struct fmt fmt_half = {16, 10, 15, 1, 0x7bff, 0x7c00, NULL};
static struct fmt fmt_bf16 = {16, 7, 127, 1, 0x7f7f, 0x7f80, NULL};
static struct fmt fmt_e4m3 = {8, 3, 7, 0, 0x7e, 0x7f, NULL};
static struct fmt fmt_e5m2 = {8, 2, 15, 1, 0x7b, 0x7c, NULL};

static double ref_decode(const struct fmt *f, uint32_t p)
{
    int ebits = f->bits - 1 - f->mbits;
    uint32_t sign = p >> (f->bits - 1) & 1;
    uint32_t e = p >> f->mbits & ((1u << ebits) - 1);
    uint32_t m = p & ((1u << f->mbits) - 1);
    double v;
    if (!f->has_inf && (p & ((1u << (f->bits - 1)) - 1)) == ((1u << (f->bits - 1)) - 1))
        v = NAN; /* e4m3fn: S.1111.111 */
    else if (f->has_inf && e == (1u << ebits) - 1)
        v = m ? NAN : INFINITY;
    else if (e == 0)
        v = ldexp((double)m, 1 - f->bias - f->mbits);
    else
        v = ldexp((double)((1u << f->mbits) + m), (int)e - f->bias - f->mbits);
    return sign ? -v : v;
}

static void fmt_init(struct fmt *f)
{
    if (f->val)
        return;
    f->val = malloc((f->max_fin + 1) * sizeof(double));
    for (uint32_t p = 0; p <= f->max_fin; p++)
        f->val[p] = ref_decode(f, p);
}

/* Round to nearest, ties to the even pattern. NaN gives some NaN pattern. */
static uint32_t ref_round(struct fmt *f, double x)
{
    fmt_init(f);
    uint32_t sign = signbit(x) ? 1u << (f->bits - 1) : 0;
    if (isnan(x))
        return sign | (f->has_inf ? f->overflow | 1 : f->overflow);
    double a = fabs(x);
    uint32_t lo = 0, hi = f->max_fin; /* largest p with val[p] <= a */
    if (a >= f->val[hi]) {
        lo = hi;
    } else {
        while (hi - lo > 1) {
            uint32_t mid = (lo + hi) / 2;
            if (f->val[mid] <= a)
                lo = mid;
            else
                hi = mid;
        }
    }
    if (f->val[lo] == a)
        return sign | lo;
    double below = f->val[lo], above;
    if (lo == f->max_fin) /* the value one ulp further, had the format one */
        above = below + (below - f->val[lo - 1]);
    else
        above = f->val[lo + 1];
    uint32_t up = lo == f->max_fin ? f->overflow : lo + 1;
    if (isinf(a))
        return sign | f->overflow;
    double dl = a - below, du = above - a;
    if (dl < du)
        return sign | lo;
    if (du < dl)
        return sign | up;
    return sign | ((lo & 1) ? up : lo);
}

static int fmt_isnan(struct fmt *f, uint32_t p)
{
    return isnan(ref_decode(f, p));
}

static struct fmt *fmt_of(c10d_dtype dt)
{
    switch (dt) {
    case C10D_FLOAT16:
        return &fmt_half;
    case C10D_BFLOAT16:
        return &fmt_bf16;
    case C10D_FLOAT8_E4M3:
        return &fmt_e4m3;
    case C10D_FLOAT8_E5M2:
        return &fmt_e5m2;
    default:
        return NULL;
    }
}

static float f32_of(uint64_t bits)
{
    uint32_t u = (uint32_t)bits;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint64_t bits_of_f32(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static double f64_of(uint64_t bits)
{
    double d;
    memcpy(&d, &bits, 8);
    return d;
}

static uint64_t bits_of_f64(double d)
{
    uint64_t u;
    memcpy(&u, &d, 8);
    return u;
}

static int is_complex_dtype(c10d_dtype dt)
{
    return dt == C10D_COMPLEX64 || dt == C10D_COMPLEX128;
}

static int is_float_dtype(c10d_dtype dt)
{
    return dt == C10D_FLOAT32 || dt == C10D_FLOAT64 || fmt_of(dt) != NULL;
}

/* ------------------------------------------------ op reference */

static double ref_min(double a, double b)
{
    if (isnan(a) || isnan(b))
        return NAN;
    if (a == 0 && b == 0)
        return (signbit(a) || signbit(b)) ? -0.0 : 0.0;
    return a < b ? a : b;
}

static double ref_max(double a, double b)
{
    if (isnan(a) || isnan(b))
        return NAN;
    if (a == 0 && b == 0)
        return (signbit(a) && signbit(b)) ? -0.0 : 0.0;
    return a > b ? a : b;
}

struct expect {
    uint64_t bits;
    int nan; /* any NaN is right */
};

static double decode_any(c10d_dtype dt, uint64_t bits)
{
    if (dt == C10D_FLOAT32)
        return f32_of(bits);
    if (dt == C10D_FLOAT64)
        return f64_of(bits);
    return ref_decode(fmt_of(dt), (uint32_t)bits);
}

/* A value computed in float32 (or float64), stored in dt. */
static struct expect encode_any(c10d_dtype dt, double v)
{
    struct expect e = {0, isnan(v)};
    if (e.nan)
        return e;
    if (dt == C10D_FLOAT32)
        e.bits = bits_of_f32((float)v);
    else if (dt == C10D_FLOAT64)
        e.bits = bits_of_f64(v);
    else
        e.bits = ref_round(fmt_of(dt), v);
    return e;
}

static struct expect ref_combine(c10d_dtype dt, c10d_reduce_op op, uint64_t a, uint64_t b)
{
    struct expect e = {0, 0};
    if (is_float_dtype(dt)) {
        double r;
        if (dt == C10D_FLOAT64) {
            double x = f64_of(a), y = f64_of(b);
            r = op == C10D_PRODUCT ? x * y
                : op == C10D_MIN   ? ref_min(x, y)
                : op == C10D_MAX   ? ref_max(x, y)
                                   : x + y;
        } else {
            /* Every narrower float is computed in float32, one rounding. */
            float x = (float)decode_any(dt, a), y = (float)decode_any(dt, b);
            float fr = op == C10D_PRODUCT ? x * y
                       : op == C10D_MIN   ? (float)ref_min(x, y)
                       : op == C10D_MAX   ? (float)ref_max(x, y)
                                          : x + y;
            r = fr;
        }
        return encode_any(dt, r);
    }
    if (dt == C10D_BOOL) {
        int x = a != 0, y = b != 0;
        switch (op) {
        case C10D_SUM:
        case C10D_MAX:
        case C10D_BOR:
            e.bits = x || y;
            break;
        case C10D_BXOR:
            e.bits = x != y;
            break;
        default:
            e.bits = x && y;
        }
        return e;
    }
    unsigned bits = (unsigned)c10d_dtype_size(dt) * 8;
    uint64_t mask = bits == 64 ? UINT64_MAX : (UINT64_C(1) << bits) - 1;
    int is_signed = dt != C10D_UINT8 && dt != C10D_UINT16 && dt != C10D_UINT32 && dt != C10D_UINT64;
    /* sign-extend to compare */
    int64_t sa = (int64_t)a, sb = (int64_t)b;
    if (bits < 64 && is_signed) {
        sa = (a >> (bits - 1)) & 1 ? (int64_t)(a | ~mask) : (int64_t)a;
        sb = (b >> (bits - 1)) & 1 ? (int64_t)(b | ~mask) : (int64_t)b;
    }
    int a_less = is_signed ? sa < sb : a < b;
    switch (op) {
    case C10D_SUM:
        e.bits = (a + b) & mask;
        break;
    case C10D_PRODUCT:
        e.bits = (uint64_t)((unsigned __int128)a * b) & mask;
        break;
    case C10D_MIN:
        e.bits = a_less ? a : b;
        break;
    case C10D_MAX:
        e.bits = a_less ? b : a;
        break;
    case C10D_BAND:
        e.bits = a & b;
        break;
    case C10D_BOR:
        e.bits = a | b;
        break;
    case C10D_BXOR:
        e.bits = a ^ b;
        break;
    default:
        fail_msg("no integer reference for op %d", op);
    }
    return e;
}

/* ------------------------------------------------- element helpers */

static uint64_t load_el(const unsigned char *p, size_t es)
{
    uint64_t v = 0;
    memcpy(&v, p, es); /* little-endian host */
    return v;
}

static void store_el(unsigned char *p, size_t es, uint64_t v)
{
    memcpy(p, &v, es);
}

static uint64_t special_f32[] = {
    0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000, 0xffc00001, 0x7f800001,
    0x00000001, 0x80000001, 0x007fffff, 0x00800000, 0x7f7fffff, 0xff7fffff, 0x3f800000,
};
static uint64_t special_f64[] = {
    0,
    UINT64_C(0x8000000000000000),
    UINT64_C(0x7ff0000000000000),
    UINT64_C(0xfff0000000000000),
    UINT64_C(0x7ff8000000000000),
    UINT64_C(0x7ff0000000000001),
    1,
    UINT64_C(0x000fffffffffffff),
    UINT64_C(0x7fefffffffffffff),
    UINT64_C(0x3ff0000000000000),
};

static uint64_t random_el(c10d_dtype dt)
{
    uint64_t r = rnd();
    unsigned pick = (unsigned)(r % 8);
    r = rnd();
    switch (dt) {
    case C10D_FLOAT32:
        if (pick == 0)
            return special_f32[r % (sizeof special_f32 / sizeof special_f32[0])];
        if (pick < 3)
            return r & 0xffffffffu;
        /* moderate magnitudes so sums and products round */
        return bits_of_f32(
            (float)ldexp((double)(r & 0xffffff) / 0x1000000 + 0.5, (int)(r >> 40 & 31) - 15) *
            ((r >> 60) & 1 ? -1.0f : 1.0f));
    case C10D_FLOAT64:
        if (pick == 0)
            return special_f64[r % (sizeof special_f64 / sizeof special_f64[0])];
        if (pick < 3)
            return r;
        return bits_of_f64(
            ldexp((double)(r >> 11) / 9007199254740992.0 + 0.5, (int)(rnd() % 61) - 30) *
            ((r & 1) ? -1.0 : 1.0));
    case C10D_FLOAT16:
    case C10D_BFLOAT16:
        if (pick < 4)
            return r & 0xffff;
        /* near 1.0 and its neighbourhood, where sums tie and round */
        return (dt == C10D_FLOAT16 ? 0x3800 : 0x3f00) + (r & 0x7ff) + ((r >> 20 & 1) << 15);
    case C10D_BOOL:
        if (pick == 0)
            return (uint64_t[]){2, 0x80, 0xff}[r % 3];
        return r & 1;
    case C10D_INT64:
    case C10D_UINT64:
        if (pick == 0)
            return (uint64_t[]){0, UINT64_MAX, INT64_MAX, (uint64_t)INT64_MIN}[r % 4];
        return pick < 3 ? r : r % 7;
    default:
        if (pick == 0)
            return (uint64_t[]){0, UINT64_MAX, INT64_MAX, (uint64_t)INT64_MIN}[r % 4] &
                   ((UINT64_C(1) << (c10d_dtype_size(dt) * 8)) - 1);
        return r & ((UINT64_C(1) << (c10d_dtype_size(dt) * 8)) - 1);
    }
}

static int result_ok(c10d_dtype dt, struct expect e, uint64_t got)
{
    if (e.nan)
        return is_float_dtype(dt) && isnan(decode_any(dt, got));
    return got == e.bits;
}

static void check_one(c10d_dtype dt, c10d_reduce_op op, uint64_t a, uint64_t b, uint64_t got,
                      const char *what, size_t i)
{
    struct expect e = ref_combine(dt, op, a, b);
    if (!result_ok(dt, e, got))
        fail_msg("%s %s %s[%zu]: a=%#llx b=%#llx got %#llx want %s%#llx", what, c10d_dtype_name(dt),
                 c10d_reduce_op_name(op), i, (unsigned long long)a, (unsigned long long)b,
                 (unsigned long long)got, e.nan ? "NaN " : "", (unsigned long long)e.bits);
}

static const int isa_levels[] = {C10D_ISA_GENERIC, C10D_ISA_AVX2};

/* ------------------------------------------------------- tests */

static void test_names(void **state)
{
    (void)state;
    static const struct {
        c10d_dtype dt;
        const char *name;
        size_t size;
    } want[] = {
        {C10D_FLOAT32, "float32", 4},
        {C10D_FLOAT64, "float64", 8},
        {C10D_FLOAT16, "float16", 2},
        {C10D_BFLOAT16, "bfloat16", 2},
        {C10D_INT8, "int8", 1},
        {C10D_UINT8, "uint8", 1},
        {C10D_INT32, "int32", 4},
        {C10D_INT64, "int64", 8},
        {C10D_BOOL, "bool", 1},
        {C10D_FLOAT8_E4M3, "float8_e4m3fn", 1},
        {C10D_FLOAT8_E5M2, "float8_e5m2", 1},
        {C10D_INT16, "int16", 2},
        {C10D_UINT16, "uint16", 2},
        {C10D_UINT32, "uint32", 4},
        {C10D_UINT64, "uint64", 8},
        {C10D_COMPLEX64, "complex64", 8},
        {C10D_COMPLEX128, "complex128", 16},
    };
    assert_int_equal(sizeof want / sizeof want[0], C10D_DTYPE_COUNT);
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        c10d_dtype got;
        assert_int_equal(c10d_dtype_size(want[i].dt), want[i].size);
        assert_string_equal(c10d_dtype_name(want[i].dt), want[i].name);
        assert_int_equal(c10d_dtype_from_name(want[i].name, &got), 0);
        assert_int_equal(got, want[i].dt);
    }
    assert_int_equal(c10d_dtype_size(C10D_DTYPE_COUNT), 0);
    assert_int_equal(c10d_dtype_size((c10d_dtype)-1), 0);
    assert_null(c10d_dtype_name(C10D_DTYPE_COUNT));

    static const struct {
        const char *name;
        c10d_dtype dt;
    } alias[] = {
        {"float", C10D_FLOAT32},
        {"half", C10D_FLOAT16},
        {"bf16", C10D_BFLOAT16},
        {"int", C10D_INT32},
        {"long", C10D_INT64},
        {"double", C10D_FLOAT64},
        {"torch.float32", C10D_FLOAT32},
        {"torch.bfloat16", C10D_BFLOAT16},
        {"float8_e4m3", C10D_FLOAT8_E4M3},
        {"torch.float8_e5m2", C10D_FLOAT8_E5M2},
    };
    for (size_t i = 0; i < sizeof alias / sizeof alias[0]; i++) {
        c10d_dtype got = C10D_DTYPE_COUNT;
        assert_int_equal(c10d_dtype_from_name(alias[i].name, &got), 0);
        assert_int_equal(got, alias[i].dt);
    }
    c10d_dtype dt;
    assert_int_equal(c10d_dtype_from_name("cfloat", &dt), 0);
    assert_int_equal(dt, C10D_COMPLEX64);
    assert_int_equal(c10d_dtype_from_name("short", &dt), 0);
    assert_int_equal(dt, C10D_INT16);
    assert_int_equal(c10d_dtype_from_name("complex32", &dt), C10D_EINVAL);
    assert_string_equal(c10d_last_error(), "unknown dtype 'complex32'");
    assert_int_equal(c10d_dtype_from_name(NULL, &dt), C10D_EINVAL);
    assert_int_equal(c10d_dtype_from_name("float32", NULL), C10D_EINVAL);

    static const char *ops[] = {"SUM",  "AVG", "PRODUCT", "MIN",       "MAX",
                                "BAND", "BOR", "BXOR",    "PREMUL_SUM"};
    assert_int_equal(sizeof ops / sizeof ops[0], C10D_REDUCE_OP_COUNT);
    for (int i = 0; i < C10D_REDUCE_OP_COUNT; i++) {
        c10d_reduce_op op;
        char buf[64];
        assert_string_equal(c10d_reduce_op_name((c10d_reduce_op)i), ops[i]);
        assert_int_equal(c10d_reduce_op_from_name(ops[i], &op), 0);
        assert_int_equal(op, i);
        snprintf(buf, sizeof buf, "ReduceOp.%s", ops[i]);
        assert_int_equal(c10d_reduce_op_from_name(buf, &op), 0);
        assert_int_equal(op, i);
    }
    c10d_reduce_op op;
    assert_int_equal(c10d_reduce_op_from_name("sum", &op), 0);
    assert_int_equal(op, C10D_SUM);
    assert_null(c10d_reduce_op_name(C10D_REDUCE_OP_COUNT));
    assert_int_equal(c10d_reduce_op_from_name("MEDIAN", &op), C10D_EINVAL);
    assert_string_equal(c10d_last_error(), "unknown reduce op 'MEDIAN'");
}

/* The validity matrix, written out rather than derived. */
static int expect_valid(c10d_reduce_op op, c10d_dtype dt)
{
    if (is_complex_dtype(dt))
        return op == C10D_SUM || op == C10D_AVG || op == C10D_PREMUL_SUM;
    int fl = is_float_dtype(dt);
    switch (op) {
    case C10D_SUM:
    case C10D_PRODUCT:
    case C10D_MIN:
    case C10D_MAX:
        return 1;
    case C10D_AVG:
    case C10D_PREMUL_SUM:
        return fl;
    default:
        return !fl;
    }
}

static void test_check_matrix(void **state)
{
    (void)state;
    unsigned char dst[8] = {1, 2, 3, 4, 5, 6, 7, 8}, src[8] = {0}, before[8];
    memcpy(before, dst, sizeof dst);
    for (int o = 0; o < C10D_REDUCE_OP_COUNT; o++) {
        for (int d = 0; d < C10D_DTYPE_COUNT; d++) {
            c10d_reduce_op op = (c10d_reduce_op)o;
            c10d_dtype dt = (c10d_dtype)d;
            int rc = c10d_reduce_op_check(op, dt);
            if (expect_valid(op, dt)) {
                assert_int_equal(rc, 0);
                continue;
            }
            assert_int_equal(rc, C10D_EINVAL);
            char want[160];
            if (is_complex_dtype(dt)) {
                snprintf(want, sizeof want, "Cannot use ReduceOp.%s with complex dtype %s",
                         c10d_reduce_op_name(op), c10d_dtype_name(dt));
                if (strncmp(c10d_last_error(), want, strlen(want)) != 0)
                    fail_msg("message '%s' does not start with '%s'", c10d_last_error(), want);
            } else if (o == C10D_BAND || o == C10D_BOR || o == C10D_BXOR) {
                snprintf(want, sizeof want, "Cannot use ReduceOp.%s with non-integral dtype %s",
                         c10d_reduce_op_name(op), c10d_dtype_name(dt));
                assert_string_equal(c10d_last_error(), want);
            } else {
                snprintf(want, sizeof want, "Cannot use ReduceOp.%s with non-floating dtype %s",
                         c10d_reduce_op_name(op), c10d_dtype_name(dt));
                if (strncmp(c10d_last_error(), want, strlen(want)) != 0)
                    fail_msg("message '%s' does not start with '%s'", c10d_last_error(), want);
            }
            /* the kernel refuses the same pair and leaves dst alone */
            assert_int_equal(c10d__reduce(dst, src, 1, dt, op), C10D_EINVAL);
            assert_memory_equal(dst, before, sizeof dst);
        }
    }
    assert_int_equal(c10d_reduce_op_check(C10D_BAND, C10D_FLOAT32), C10D_EINVAL);
    assert_string_equal(c10d_last_error(),
                        "Cannot use ReduceOp.BAND with non-integral dtype float32");
    assert_int_equal(c10d_reduce_op_check(C10D_REDUCE_OP_COUNT, C10D_FLOAT32), C10D_EINVAL);
    assert_int_equal(c10d_reduce_op_check(C10D_SUM, C10D_DTYPE_COUNT), C10D_EINVAL);
    assert_int_equal(c10d_reduce_op_check((c10d_reduce_op)-3, C10D_FLOAT32), C10D_EINVAL);
    assert_int_equal(c10d__reduce(dst, src, 1, C10D_DTYPE_COUNT, C10D_SUM), C10D_EINVAL);
    /* NULL is fine for an empty buffer, not otherwise */
    assert_int_equal(c10d__reduce(NULL, NULL, 0, C10D_FLOAT32, C10D_SUM), 0);
    assert_int_equal(c10d__reduce(NULL, src, 1, C10D_FLOAT32, C10D_SUM), C10D_EINVAL);
    /* partial overlap is refused, exact aliasing is not */
    assert_int_equal(c10d__reduce(dst + 1, dst, 1, C10D_FLOAT32, C10D_SUM), C10D_EINVAL);
    assert_int_equal(c10d__reduce(dst, dst, 2, C10D_FLOAT32, C10D_SUM), 0);
    assert_int_equal(c10d__reduce(dst, dst + 4, 1, C10D_FLOAT32, C10D_SUM), 0);
}

static const size_t lengths[] = {0, 1, 2, 7, 8, 15, 16, 17, 33, 511, 512, 513, 1025, 4099};
static const size_t offsets[] = {0, 1, 3};

/* Random buffers, every valid pair, odd lengths, unaligned, both ISA
 * levels; bytes around the buffers must stay untouched. */
static void test_kernels_random(void **state)
{
    (void)state;
    size_t maxn = lengths[sizeof lengths / sizeof lengths[0] - 1];
    uint64_t *a = malloc(maxn * 8), *b = malloc(maxn * 8);
    unsigned char *dbuf = malloc(maxn * 8 + 32), *sbuf = malloc(maxn * 8 + 32);
    for (size_t il = 0; il < 2; il++) {
        int isa = c10d__reduce_set_isa(isa_levels[il]);
        if (isa != isa_levels[il]) {
            print_message("ISA level %d not available, skipped\n", isa_levels[il]);
            continue;
        }
        for (int d = 0; d < C10D_DTYPE_COUNT; d++) {
            c10d_dtype dt = (c10d_dtype)d;
            if (is_complex_dtype(dt))
                continue; /* pairs of reals: test_complex */
            size_t es = c10d_dtype_size(dt);
            for (int o = 0; o < C10D_REDUCE_OP_COUNT; o++) {
                c10d_reduce_op op = (c10d_reduce_op)o;
                if (!expect_valid(op, dt))
                    continue;
                for (size_t li = 0; li < sizeof lengths / sizeof lengths[0]; li++) {
                    for (size_t oi = 0; oi < sizeof offsets / sizeof offsets[0]; oi++) {
                        size_t n = lengths[li], off = offsets[oi];
                        memset(dbuf, 0xa5, maxn * 8 + 32);
                        memset(sbuf, 0x5a, maxn * 8 + 32);
                        for (size_t i = 0; i < n; i++) {
                            a[i] = random_el(dt);
                            /* half the time a partner of similar magnitude */
                            b[i] = (rnd() & 1) ? random_el(dt) : a[i] ^ (rnd() & 0x1f);
                            store_el(dbuf + off + i * es, es, a[i]);
                            store_el(sbuf + 16 - off + i * es, es, b[i]);
                        }
                        assert_int_equal(c10d__reduce(dbuf + off, sbuf + 16 - off, n, dt, op), 0);
                        for (size_t i = 0; i < n; i++)
                            check_one(dt, op, a[i], b[i], load_el(dbuf + off + i * es, es),
                                      isa ? "avx2" : "generic", i);
                        for (size_t i = 0; i < off; i++)
                            assert_int_equal(dbuf[i], 0xa5);
                        for (size_t i = off + n * es; i < maxn * 8 + 32; i++)
                            if (dbuf[i] != 0xa5)
                                fail_msg("%s %s n=%zu: byte %zu past the end changed",
                                         c10d_dtype_name(dt), c10d_reduce_op_name(op), n, i);
                        for (size_t i = 0; i < n; i++)
                            assert_int_equal(load_el(sbuf + 16 - off + i * es, es), b[i]);
                    }
                }
            }
        }
    }
    c10d__reduce_set_isa(C10D_ISA_AUTO);
    free(a);
    free(b);
    free(dbuf);
    free(sbuf);
}

/* Narrow floats exhaustively: every float8 pair, every 16-bit pattern
 * against a handful of partners. */
static void test_kernels_exhaustive_narrow(void **state)
{
    (void)state;
    static const c10d_dtype dts[] = {C10D_FLOAT16, C10D_BFLOAT16, C10D_FLOAT8_E4M3,
                                     C10D_FLOAT8_E5M2};
    static const c10d_reduce_op ops[] = {C10D_SUM, C10D_PRODUCT, C10D_MIN, C10D_MAX};
    uint16_t *d = malloc(65536 * 2), *s = malloc(65536 * 2), *a = malloc(65536 * 2);
    for (size_t il = 0; il < 2; il++) {
        if (c10d__reduce_set_isa(isa_levels[il]) != isa_levels[il])
            continue;
        for (size_t di = 0; di < 4; di++) {
            c10d_dtype dt = dts[di];
            size_t es = c10d_dtype_size(dt);
            size_t n = es == 1 ? 256 * 256 : 65536;
            int partners = es == 1 ? 1 : 12;
            for (size_t oi = 0; oi < 4; oi++) {
                for (int p = 0; p < partners; p++) {
                    uint16_t partner = p == 0 ? 0x8000 : (uint16_t)rnd();
                    unsigned char *db = (unsigned char *)d, *sb = (unsigned char *)s;
                    for (size_t i = 0; i < n; i++) {
                        uint64_t x = es == 1 ? i & 0xff : i;
                        uint64_t y = es == 1 ? i >> 8 : partner;
                        a[i] = (uint16_t)x;
                        store_el(db + i * es, es, x);
                        store_el(sb + i * es, es, y);
                    }
                    assert_int_equal(c10d__reduce(d, s, n, dt, ops[oi]), 0);
                    for (size_t i = 0; i < n; i++)
                        check_one(dt, ops[oi], a[i], load_el(sb + i * es, es),
                                  load_el(db + i * es, es), "exhaustive", i);
                }
            }
        }
    }
    c10d__reduce_set_isa(C10D_ISA_AUTO);
    free(d);
    free(s);
    free(a);
}

static uint64_t one_op(c10d_dtype dt, c10d_reduce_op op, uint64_t x, uint64_t y)
{
    unsigned char d[8], s[8];
    size_t es = c10d_dtype_size(dt);
    store_el(d, es, x);
    store_el(s, es, y);
    assert_int_equal(c10d__reduce(d, s, 1, dt, op), 0);
    return load_el(d, es);
}

/* Hand-picked IEEE corners, so a failure names a rule, not a random seed. */
static void test_specials(void **state)
{
    (void)state;
    for (size_t il = 0; il < 2; il++) {
        if (c10d__reduce_set_isa(isa_levels[il]) != isa_levels[il])
            continue;
        /* float32 */
        assert_int_equal(one_op(C10D_FLOAT32, C10D_SUM, 1, 1), 2); /* denormals add exactly */
        assert_true(isnan(f32_of(one_op(C10D_FLOAT32, C10D_SUM, 0x7f800000, 0xff800000))));
        assert_int_equal(one_op(C10D_FLOAT32, C10D_SUM, 0x7f7fffff, 0x7f7fffff), 0x7f800000);
        assert_int_equal(one_op(C10D_FLOAT32, C10D_SUM, 0x80000000, 0x80000000), 0x80000000);
        assert_int_equal(one_op(C10D_FLOAT32, C10D_SUM, 0x80000000, 0), 0);
        assert_true(isnan(f32_of(one_op(C10D_FLOAT32, C10D_PRODUCT, 0x7f800000, 0))));
        assert_true(isnan(f32_of(one_op(C10D_FLOAT32, C10D_MIN, 0x7fc00000, 0x3f800000))));
        assert_true(isnan(f32_of(one_op(C10D_FLOAT32, C10D_MIN, 0x3f800000, 0x7fc00000))));
        assert_true(isnan(f32_of(one_op(C10D_FLOAT32, C10D_MAX, 0xff800000, 0x7f800001))));
        assert_int_equal(one_op(C10D_FLOAT32, C10D_MIN, 0, 0x80000000), 0x80000000);
        assert_int_equal(one_op(C10D_FLOAT32, C10D_MIN, 0x80000000, 0), 0x80000000);
        assert_int_equal(one_op(C10D_FLOAT32, C10D_MAX, 0, 0x80000000), 0);
        assert_int_equal(one_op(C10D_FLOAT32, C10D_MAX, 0x80000000, 0), 0);
        assert_int_equal(one_op(C10D_FLOAT32, C10D_MIN, 0xff800000, 0x7f800000), 0xff800000);
        assert_int_equal(one_op(C10D_FLOAT32, C10D_MAX, 0x80000001, 0x00000001), 1);
        /* float64 */
        assert_int_equal(one_op(C10D_FLOAT64, C10D_SUM, 1, 1), 2);
        assert_int_equal(one_op(C10D_FLOAT64, C10D_MIN, 0, UINT64_C(0x8000000000000000)),
                         UINT64_C(0x8000000000000000));
        assert_true(isnan(f64_of(one_op(C10D_FLOAT64, C10D_MAX, UINT64_C(0x7ff8000000000000),
                                        UINT64_C(0x7ff0000000000000)))));
        /* float16: denormals, overflow at the tie, ties to even */
        assert_int_equal(one_op(C10D_FLOAT16, C10D_SUM, 0x0001, 0x0001), 0x0002);
        assert_int_equal(one_op(C10D_FLOAT16, C10D_SUM, 0x03ff, 0x0001), 0x0400);
        assert_int_equal(one_op(C10D_FLOAT16, C10D_SUM, 0x7bff, 0x4c00), 0x7c00); /* 65504+16 */
        assert_int_equal(one_op(C10D_FLOAT16, C10D_SUM, 0x7bff, 0x4bff), 0x7bff);
        assert_int_equal(one_op(C10D_FLOAT16, C10D_SUM, 0x3c00, 0x1000), 0x3c00); /* 1+2^-11 */
        assert_int_equal(one_op(C10D_FLOAT16, C10D_SUM, 0x3c01, 0x1000), 0x3c02);
        assert_int_equal(one_op(C10D_FLOAT16, C10D_PRODUCT, 0x0001, 0x3800), 0x0000); /* tie */
        assert_int_equal(one_op(C10D_FLOAT16, C10D_PRODUCT, 0x0003, 0x3800), 0x0002);
        assert_int_equal(one_op(C10D_FLOAT16, C10D_MIN, 0x0000, 0x8000), 0x8000);
        assert_true(one_op(C10D_FLOAT16, C10D_MAX, 0x7e00, 0x3c00) >= 0x7c01);
        /* bfloat16 */
        assert_int_equal(one_op(C10D_BFLOAT16, C10D_SUM, 0x0001, 0x0001), 0x0002);
        assert_int_equal(one_op(C10D_BFLOAT16, C10D_SUM, 0x3f80, 0x3b80), 0x3f80); /* tie */
        assert_int_equal(one_op(C10D_BFLOAT16, C10D_SUM, 0x3f81, 0x3b80), 0x3f82);
        assert_int_equal(one_op(C10D_BFLOAT16, C10D_SUM, 0x7f7f, 0x7f7f), 0x7f80);
        assert_int_equal(one_op(C10D_BFLOAT16, C10D_MAX, 0x8000, 0x0000), 0x0000);
        assert_true(
            isnan(c10d__bf16_to_float((uint16_t)one_op(C10D_BFLOAT16, C10D_SUM, 0x7f80, 0xff80))));
        /* float8: e4m3fn saturates to NaN, e5m2 to inf */
        assert_int_equal(one_op(C10D_FLOAT8_E4M3, C10D_SUM, 0x7e, 0x7e), 0x7f);
        assert_int_equal(one_op(C10D_FLOAT8_E4M3, C10D_SUM, 0xfe, 0xfe), 0xff);
        assert_int_equal(one_op(C10D_FLOAT8_E4M3, C10D_SUM, 0x7e, 0x01), 0x7e);
        assert_int_equal(one_op(C10D_FLOAT8_E5M2, C10D_SUM, 0x7b, 0x7b), 0x7c);
        assert_int_equal(one_op(C10D_FLOAT8_E5M2, C10D_SUM, 0xfb, 0xfb), 0xfc);
        assert_int_equal(one_op(C10D_FLOAT8_E5M2, C10D_SUM, 0x01, 0x01), 0x02);
        /* integers wrap */
        assert_int_equal(one_op(C10D_INT32, C10D_SUM, 0x7fffffff, 1), 0x80000000);
        assert_int_equal(one_op(C10D_INT32, C10D_PRODUCT, 0x80000000, 0xffffffff), 0x80000000);
        assert_int_equal(one_op(C10D_INT64, C10D_SUM, INT64_MAX, 1), (uint64_t)INT64_MIN);
        assert_int_equal(one_op(C10D_INT8, C10D_SUM, 0x7f, 1), 0x80);
        assert_int_equal(one_op(C10D_INT8, C10D_MIN, 0x80, 0x7f), 0x80);
        assert_int_equal(one_op(C10D_UINT8, C10D_MIN, 0x80, 0x7f), 0x7f);
        assert_int_equal(one_op(C10D_UINT8, C10D_PRODUCT, 16, 16), 0);
        /* bool normalised */
        assert_int_equal(one_op(C10D_BOOL, C10D_SUM, 1, 1), 1);
        assert_int_equal(one_op(C10D_BOOL, C10D_BAND, 2, 1), 1);
        assert_int_equal(one_op(C10D_BOOL, C10D_BXOR, 0xff, 1), 0);
        assert_int_equal(one_op(C10D_BOOL, C10D_BOR, 0, 0x80), 1);
    }
    c10d__reduce_set_isa(C10D_ISA_AUTO);
}

/* Complex values reduce as pairs of reals: SUM part by part, AVG and
 * PREMUL_SUM scale both parts; nothing else is allowed. */
static void test_complex(void **state)
{
    (void)state;
    float a[2 * 37], b[2 * 37];
    double c[2 * 5], d[2 * 5];
    for (int i = 0; i < 2 * 37; i++) {
        a[i] = (float)i;
        b[i] = (float)(3 * i) + 0.5f;
    }
    for (int i = 0; i < 2 * 5; i++) {
        c[i] = -i;
        d[i] = 0.25 * i;
    }
    assert_int_equal(c10d__reduce(a, b, 37, C10D_COMPLEX64, C10D_SUM), 0);
    for (int i = 0; i < 2 * 37; i++)
        assert_true(a[i] == (float)(4 * i) + 0.5f);
    assert_int_equal(c10d__reduce_finish(a, 37, C10D_COMPLEX64, C10D_AVG, 2), 0);
    for (int i = 0; i < 2 * 37; i++)
        assert_true(a[i] == ((float)(4 * i) + 0.5f) / 2);
    assert_int_equal(c10d__reduce(c, d, 5, C10D_COMPLEX128, C10D_SUM), 0);
    assert_int_equal(c10d__reduce_premul(c, 5, C10D_COMPLEX128, 4.0), 0);
    for (int i = 0; i < 2 * 5; i++)
        assert_true(c[i] == 4.0 * (-i + 0.25 * i));
    assert_int_equal(c10d__reduce(c, d, 5, C10D_COMPLEX128, C10D_MAX), C10D_EINVAL);
    assert_int_equal(c10d__reduce(a, b, 37, C10D_COMPLEX64, C10D_PRODUCT), C10D_EINVAL);
}

/* dst == src: op(x, x) */
static void test_alias(void **state)
{
    (void)state;
    unsigned char buf[1025 * 8 + 1];
    uint64_t a[1025];
    for (size_t il = 0; il < 2; il++) {
        if (c10d__reduce_set_isa(isa_levels[il]) != isa_levels[il])
            continue;
        for (int d = 0; d < C10D_DTYPE_COUNT; d++) {
            c10d_dtype dt = (c10d_dtype)d;
            if (is_complex_dtype(dt))
                continue; /* pairs of reals: test_complex */
            size_t es = c10d_dtype_size(dt);
            for (int o = 0; o < C10D_REDUCE_OP_COUNT; o++) {
                c10d_reduce_op op = (c10d_reduce_op)o;
                if (!expect_valid(op, dt))
                    continue;
                size_t n = 1025;
                for (size_t i = 0; i < n; i++) {
                    a[i] = random_el(dt);
                    store_el(buf + 1 + i * es, es, a[i]);
                }
                assert_int_equal(c10d__reduce(buf + 1, buf + 1, n, dt, op), 0);
                for (size_t i = 0; i < n; i++)
                    check_one(dt, op, a[i], a[i], load_el(buf + 1 + i * es, es), "alias", i);
            }
        }
    }
    c10d__reduce_set_isa(C10D_ISA_AUTO);
}

static void test_premul_finish(void **state)
{
    (void)state;
    static const double factors[] = {1.0, 0.5, 1.0 / 3.0, -3.0, 1e-3, 65536.0, 0.0};
    size_t n = 1025;
    unsigned char *buf = malloc(n * 8 + 1);
    uint64_t *a = malloc(n * 8);
    for (size_t il = 0; il < 2; il++) {
        if (c10d__reduce_set_isa(isa_levels[il]) != isa_levels[il])
            continue;
        for (int d = 0; d < C10D_DTYPE_COUNT; d++) {
            c10d_dtype dt = (c10d_dtype)d;
            if (is_complex_dtype(dt))
                continue; /* pairs of reals: test_complex */
            size_t es = c10d_dtype_size(dt);
            if (!is_float_dtype(dt)) {
                assert_int_equal(c10d__reduce_premul(buf, 1, dt, 2.0), C10D_EINVAL);
                assert_int_equal(c10d__reduce_finish(buf, 1, dt, C10D_AVG, 2), C10D_EINVAL);
                assert_int_equal(c10d__reduce_finish(buf, 1, dt, C10D_SUM, 2), 0);
                continue;
            }
            for (size_t fi = 0; fi < sizeof factors / sizeof factors[0] + 4; fi++) {
                int finish = fi >= sizeof factors / sizeof factors[0];
                int nranks =
                    finish ? (int[]){1, 2, 3, 7}[fi - sizeof factors / sizeof factors[0]] : 0;
                for (size_t i = 0; i < n; i++) {
                    a[i] = random_el(dt);
                    store_el(buf + 1 + i * es, es, a[i]);
                }
                if (finish)
                    assert_int_equal(c10d__reduce_finish(buf + 1, n, dt, C10D_AVG, nranks), 0);
                else
                    assert_int_equal(c10d__reduce_premul(buf + 1, n, dt, factors[fi]), 0);
                for (size_t i = 0; i < n; i++) {
                    double x = decode_any(dt, a[i]), r;
                    if (dt == C10D_FLOAT64)
                        r = finish ? x / nranks : x * factors[fi];
                    else
                        r = finish ? (float)x / (float)nranks : (float)x * (float)factors[fi];
                    struct expect e = encode_any(dt, r);
                    uint64_t got = load_el(buf + 1 + i * es, es);
                    if (!result_ok(dt, e, got))
                        fail_msg("%s %s %g [%zu]: x=%#llx got %#llx want %#llx",
                                 finish ? "finish" : "premul", c10d_dtype_name(dt),
                                 finish ? (double)nranks : factors[fi], i, (unsigned long long)a[i],
                                 (unsigned long long)got, (unsigned long long)e.bits);
                }
            }
            /* every op but AVG leaves the buffer alone */
            store_el(buf, es, 0x1234567);
            for (int o = 0; o < C10D_REDUCE_OP_COUNT; o++)
                if (o != C10D_AVG && expect_valid((c10d_reduce_op)o, dt))
                    assert_int_equal(c10d__reduce_finish(buf, 1, dt, (c10d_reduce_op)o, 4), 0);
            assert_int_equal(load_el(buf, es),
                             0x1234567 & (es == 8 ? UINT64_MAX : (UINT64_C(1) << es * 8) - 1));
            assert_int_equal(c10d__reduce_finish(buf, 1, dt, C10D_AVG, 0), C10D_EINVAL);
            assert_int_equal(c10d__reduce_premul(buf, 0, dt, 2.0), 0);
        }
    }
    /* AVG on float32 over 4 ranks: (1+2+3+4)/4 */
    float v[2] = {1, 2}, w[2] = {3, 4};
    assert_int_equal(c10d__reduce(v, w, 2, C10D_FLOAT32, C10D_AVG), 0);
    assert_int_equal(c10d__reduce_finish(v, 2, C10D_FLOAT32, C10D_AVG, 2), 0);
    assert_true(v[0] == 2.0f && v[1] == 3.0f);
    c10d__reduce_set_isa(C10D_ISA_AUTO);
    free(buf);
    free(a);
}

static void test_convert_roundtrip(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = c10d__half_to_float((uint16_t)h);
        double ref = ref_decode(&fmt_half, h);
        uint16_t back = c10d__float_to_half(f);
        if (isnan(ref)) {
            /* NaN stays NaN with its sign and payload, quieted */
            assert_true(isnan(f));
            assert_int_equal(back, h | 0x0200);
        } else {
            if ((double)f != ref || !signbit(f) != !signbit(ref))
                fail_msg("half %#x: got %a want %a", h, f, ref);
            assert_int_equal(back, h);
        }
        float bf = c10d__bf16_to_float((uint16_t)h);
        ref = ref_decode(&fmt_bf16, h);
        back = c10d__float_to_bf16(bf);
        if (isnan(ref)) {
            assert_true(isnan(bf));
            assert_int_equal(back, h | 0x0040);
        } else {
            if ((double)bf != ref || !signbit(bf) != !signbit(ref))
                fail_msg("bf16 %#x: got %a want %a", h, bf, ref);
            assert_int_equal(back, h);
        }
    }
    for (uint32_t v = 0; v < 256; v++) {
        float f = c10d__e4m3_to_float((uint8_t)v);
        double ref = ref_decode(&fmt_e4m3, v);
        if (isnan(ref)) {
            assert_true(isnan(f));
            assert_int_equal(c10d__float_to_e4m3(f), v); /* only 0x7f and 0xff are NaN */
        } else {
            assert_true((double)f == ref && !signbit(f) == !signbit(ref));
            assert_int_equal(c10d__float_to_e4m3(f), v);
        }
        f = c10d__e5m2_to_float((uint8_t)v);
        ref = ref_decode(&fmt_e5m2, v);
        if (isnan(ref)) {
            assert_true(isnan(f));
            assert_int_equal(c10d__float_to_e5m2(f), v | 0x7f);
        } else {
            assert_true((double)f == ref && !signbit(f) == !signbit(ref));
            assert_int_equal(c10d__float_to_e5m2(f), v);
        }
    }
    assert_true(ref_decode(&fmt_e4m3, 0x7e) == 448.0);
    assert_true(ref_decode(&fmt_e5m2, 0x7b) == 57344.0);
    assert_true(ref_decode(&fmt_half, 0x0001) == ldexp(1, -24));
}

static void check_narrowing(float f)
{
    uint32_t got, want;
    if ((got = c10d__float_to_half(f)) != (want = ref_round(&fmt_half, f)) &&
        !(isnan(f) && fmt_isnan(&fmt_half, got)))
        fail_msg("float_to_half(%a = %#x) = %#x, want %#x", f, (unsigned)bits_of_f32(f), got, want);
    if ((got = c10d__float_to_bf16(f)) != (want = ref_round(&fmt_bf16, f)) &&
        !(isnan(f) && fmt_isnan(&fmt_bf16, got)))
        fail_msg("float_to_bf16(%a) = %#x, want %#x", f, got, want);
    if ((got = c10d__float_to_e4m3(f)) != (want = ref_round(&fmt_e4m3, f)) &&
        !(isnan(f) && fmt_isnan(&fmt_e4m3, got)))
        fail_msg("float_to_e4m3(%a) = %#x, want %#x", f, got, want);
    if ((got = c10d__float_to_e5m2(f)) != (want = ref_round(&fmt_e5m2, f)) &&
        !(isnan(f) && fmt_isnan(&fmt_e5m2, got)))
        fail_msg("float_to_e5m2(%a) = %#x, want %#x", f, got, want);
}

/* float -> narrow, RNE: a stride through all float patterns, every
 * midpoint between neighbours (the ties) and the floats either side. */
static void test_convert_rne(void **state)
{
    (void)state;
    for (uint64_t u = 0; u < UINT64_C(0x100000000); u += 4099)
        check_narrowing(f32_of(u));
    struct fmt *fmts[] = {&fmt_half, &fmt_bf16, &fmt_e4m3, &fmt_e5m2};
    for (size_t k = 0; k < 4; k++) {
        struct fmt *f = fmts[k];
        fmt_init(f);
        for (uint32_t p = 0; p < f->max_fin; p++) {
            float mid = (float)((f->val[p] + f->val[p + 1]) / 2);
            assert_true((double)mid == (f->val[p] + f->val[p + 1]) / 2); /* exact */
            uint32_t mb = (uint32_t)bits_of_f32(mid);
            for (int sgn = 0; sgn < 2; sgn++) {
                uint32_t sb = sgn ? 0x80000000u : 0;
                check_narrowing(f32_of((mb | sb)));
                check_narrowing(f32_of((mb - 1) | sb));
                check_narrowing(f32_of((mb + 1) | sb));
            }
        }
    }
    /* the cases by name */
    assert_int_equal(c10d__float_to_half(65520.0f), 0x7c00);
    assert_int_equal(c10d__float_to_half(65519.996f), 0x7bff);
    assert_int_equal(c10d__float_to_half(INFINITY), 0x7c00);
    assert_int_equal(c10d__float_to_half(-INFINITY), 0xfc00);
    assert_int_equal(c10d__float_to_half(ldexpf(1, -25)), 0x0000);       /* tie to even 0 */
    assert_int_equal(c10d__float_to_half(ldexpf(1.5f, -25)), 0x0001);    /* above the tie */
    assert_int_equal(c10d__float_to_half(-ldexpf(1, -26)), 0x8000);      /* underflow keeps sign */
    assert_int_equal(c10d__float_to_bf16(1.0f + ldexpf(1, -8)), 0x3f80); /* tie to even */
    assert_int_equal(c10d__float_to_e4m3(448.0f), 0x7e);
    assert_int_equal(c10d__float_to_e4m3(464.0f), 0x7e); /* tie, 0x7e is even */
    assert_int_equal(c10d__float_to_e4m3(464.5f), 0x7f); /* past it: NaN, no inf in e4m3fn */
    assert_int_equal(c10d__float_to_e4m3(-INFINITY), 0xff);
    assert_int_equal(c10d__float_to_e4m3(ldexpf(1, -10)), 0x00); /* half the smallest: tie to 0 */
    assert_int_equal(c10d__float_to_e5m2(57344.0f), 0x7b);
    assert_int_equal(c10d__float_to_e5m2(61440.0f), 0x7c); /* tie, 0x7b is odd: inf */
    assert_int_equal(c10d__float_to_e5m2(61439.0f), 0x7b);
    assert_int_equal(c10d__float_to_e5m2(NAN), 0x7f);
}

int main(void)
{
    const char *seed = getenv("C10D_TEST_SEED");
    if (seed && *seed)
        rng_state = strtoull(seed, NULL, 0) | 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_check_matrix),
        cmocka_unit_test(test_specials),
        cmocka_unit_test(test_convert_roundtrip),
        cmocka_unit_test(test_convert_rne),
        cmocka_unit_test(test_kernels_random),
        cmocka_unit_test(test_kernels_exhaustive_narrow),
        cmocka_unit_test(test_alias),
        cmocka_unit_test(test_complex),
        cmocka_unit_test(test_premul_finish),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
