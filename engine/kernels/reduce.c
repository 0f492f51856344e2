/* Host reduction kernels: dst = op(dst, src).
 *
 * Every kernel is one plain loop over memcpy loads and stores (so any
 * alignment is fine and UBSan stays quiet; GCC turns them into unaligned
 * vector moves) compiled three times: for the baseline ISA with restrict, for
 * AVX2 with restrict (chosen at run time, never by -march), and without
 * restrict for the dst == src case, which restrict would make undefined.
 *
 * float16 and the float8 types go through a small float32 block: decode
 * (F16C when present), the float32 kernel, encode. bfloat16's conversions
 * are a shift and an add, so its loops are fused and vectorise directly.
 *
 * Signed zeros: MIN treats -0 as smaller than +0 and MAX +0 as larger (IEEE
 * 754-2019 minimum/maximum), so both are commutative bit for bit. */
#include "reduce.h"

#include "engine/error.h"
#include "half.h"

#include <immintrin.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

typedef unsigned char u8;
typedef void (*kernel_fn)(u8 *d, const u8 *s, size_t n);

#define AVX2_ATTR __attribute__((target("avx2")))

/* ------------------------------------------------------ element ops */

/* MIN/MAX work on the bits: flipping the magnitude of negative numbers gives
 * integers that order like the floats, with -0 below +0, and integer
 * compares neither trap nor block if-conversion, so these loops vectorise.
 * A NaN operand wins, quieted, the first one if both are (as x86 a + b). */
static inline int32_t f32_key(int32_t u)
{
    return u ^ ((u >> 31) & INT32_MAX);
}

static inline float f32_pick(float a, float b, int want_max)
{
    int32_t ua, ub;
    memcpy(&ua, &a, 4);
    memcpy(&ub, &b, 4);
    int a_first = want_max ? f32_key(ua) > f32_key(ub) : f32_key(ua) < f32_key(ub);
    int32_t r = a_first ? ua : ub;
    r = (ub & INT32_MAX) > 0x7f800000 ? (ub | 0x400000) : r;
    r = (ua & INT32_MAX) > 0x7f800000 ? (ua | 0x400000) : r;
    float f;
    memcpy(&f, &r, 4);
    return f;
}

static inline int64_t f64_key(int64_t u)
{
    return u ^ ((u >> 63) & INT64_MAX);
}

static inline double f64_pick(double a, double b, int want_max)
{
    int64_t ua, ub;
    memcpy(&ua, &a, 8);
    memcpy(&ub, &b, 8);
    int a_first = want_max ? f64_key(ua) > f64_key(ub) : f64_key(ua) < f64_key(ub);
    int64_t r = a_first ? ua : ub;
    const int64_t inf = INT64_C(0x7ff0000000000000), quiet = INT64_C(0x0008000000000000);
    r = (ub & INT64_MAX) > inf ? (ub | quiet) : r;
    r = (ua & INT64_MAX) > inf ? (ua | quiet) : r;
    double f;
    memcpy(&f, &r, 8);
    return f;
}

#define OP_SUM(a, b)  ((a) + (b))
#define OP_PROD(a, b) ((a) * (b))
#define OP_AND(a, b)  ((a) & (b))
#define OP_OR(a, b)   ((a) | (b))
#define OP_XOR(a, b)  ((a) ^ (b))
#define OP_MIN(a, b)  ((a) < (b) ? (a) : (b))
#define OP_MAX(a, b)  ((a) > (b) ? (a) : (b))
#define OP_FMIN(a, b) f32_pick((a), (b), 0)
#define OP_FMAX(a, b) f32_pick((a), (b), 1)
#define OP_DMIN(a, b) f64_pick((a), (b), 0)
#define OP_DMAX(a, b) f64_pick((a), (b), 1)
/* Integer products in the unsigned type of the element: wraps, never UB.
 * (u8 operands promote to int, but 255*255 fits.) */
#define OP_UMUL(a, b) ((a) * (b))
/* uint16 operands promote to int, where 65535 * 65535 overflows: multiply
 * as unsigned int instead. */
#define OP_UMUL16(a, b) ((unsigned)(a) * (unsigned)(b))
/* bool: any non-zero byte is true; results are 0 or 1. */
#define OP_LOR(a, b)  ((u8)(((a) | (b)) != 0))
#define OP_LAND(a, b) ((u8)(((a) != 0) & ((b) != 0)))
#define OP_LXOR(a, b) ((u8)(((a) != 0) ^ ((b) != 0)))

/* c10d__f2bf without its NaN test, for results of SUM/PRODUCT/MIN/MAX on
 * bfloat16 operands: a NaN among those is either a quieted operand or the
 * default NaN, so its low 16 bits are zero and the rounding add cannot carry
 * into the exponent. Dropping the test makes the bf16 loops ~1.5x faster. */
static inline uint16_t bf16_round_combined(float f)
{
    uint32_t u = c10d__fbits(f);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* ---------------------------------------------------- kernel bodies */

#define BODY_PLAIN(T, OP)                                                                          \
    for (size_t i = 0; i < n; i++) {                                                               \
        T a, b, r;                                                                                 \
        memcpy(&a, d + i * sizeof(T), sizeof(T));                                                  \
        memcpy(&b, s + i * sizeof(T), sizeof(T));                                                  \
        r = (T)OP(a, b);                                                                           \
        memcpy(d + i * sizeof(T), &r, sizeof(T));                                                  \
    }

#define BODY_BF16(T, OP)                                                                           \
    for (size_t i = 0; i < n; i++) {                                                               \
        uint16_t a, b, r;                                                                          \
        memcpy(&a, d + 2 * i, 2);                                                                  \
        memcpy(&b, s + 2 * i, 2);                                                                  \
        r = bf16_round_combined(OP(c10d__bf2f(a), c10d__bf2f(b)));                                 \
        memcpy(d + 2 * i, &r, 2);                                                                  \
    }

#define DEFINE_KERNEL(name, BODY, T, OP)                                                           \
    static void name##_g(u8 *restrict d, const u8 *restrict s, size_t n){BODY(                     \
        T, OP)} AVX2_ATTR static void name##_a(u8 *restrict d, const u8 *restrict s, size_t n)     \
    {                                                                                              \
        BODY(T, OP)                                                                                \
    }                                                                                              \
    static void name##_x(u8 *d, const u8 *s, size_t n)                                             \
    {                                                                                              \
        BODY(T, OP)                                                                                \
    }

DEFINE_KERNEL(f32_sum, BODY_PLAIN, float, OP_SUM)
DEFINE_KERNEL(f32_prod, BODY_PLAIN, float, OP_PROD)
DEFINE_KERNEL(f32_min, BODY_PLAIN, float, OP_FMIN)
DEFINE_KERNEL(f32_max, BODY_PLAIN, float, OP_FMAX)
DEFINE_KERNEL(f64_sum, BODY_PLAIN, double, OP_SUM)
DEFINE_KERNEL(f64_prod, BODY_PLAIN, double, OP_PROD)
DEFINE_KERNEL(f64_min, BODY_PLAIN, double, OP_DMIN)
DEFINE_KERNEL(f64_max, BODY_PLAIN, double, OP_DMAX)
DEFINE_KERNEL(bf16_sum, BODY_BF16, float, OP_SUM)
DEFINE_KERNEL(bf16_prod, BODY_BF16, float, OP_PROD)
DEFINE_KERNEL(bf16_min, BODY_BF16, float, OP_FMIN)
DEFINE_KERNEL(bf16_max, BODY_BF16, float, OP_FMAX)
DEFINE_KERNEL(u8_sum, BODY_PLAIN, uint8_t, OP_SUM)
DEFINE_KERNEL(u8_prod, BODY_PLAIN, uint8_t, OP_UMUL)
DEFINE_KERNEL(u8_min, BODY_PLAIN, uint8_t, OP_MIN)
DEFINE_KERNEL(u8_max, BODY_PLAIN, uint8_t, OP_MAX)
DEFINE_KERNEL(u8_and, BODY_PLAIN, uint8_t, OP_AND)
DEFINE_KERNEL(u8_or, BODY_PLAIN, uint8_t, OP_OR)
DEFINE_KERNEL(u8_xor, BODY_PLAIN, uint8_t, OP_XOR)
DEFINE_KERNEL(i8_min, BODY_PLAIN, int8_t, OP_MIN)
DEFINE_KERNEL(i8_max, BODY_PLAIN, int8_t, OP_MAX)
DEFINE_KERNEL(u16_sum, BODY_PLAIN, uint16_t, OP_SUM)
DEFINE_KERNEL(u16_prod, BODY_PLAIN, uint16_t, OP_UMUL16)
DEFINE_KERNEL(u16_min, BODY_PLAIN, uint16_t, OP_MIN)
DEFINE_KERNEL(u16_max, BODY_PLAIN, uint16_t, OP_MAX)
DEFINE_KERNEL(u16_and, BODY_PLAIN, uint16_t, OP_AND)
DEFINE_KERNEL(u16_or, BODY_PLAIN, uint16_t, OP_OR)
DEFINE_KERNEL(u16_xor, BODY_PLAIN, uint16_t, OP_XOR)
DEFINE_KERNEL(i16_min, BODY_PLAIN, int16_t, OP_MIN)
DEFINE_KERNEL(i16_max, BODY_PLAIN, int16_t, OP_MAX)
DEFINE_KERNEL(u32_min, BODY_PLAIN, uint32_t, OP_MIN)
DEFINE_KERNEL(u32_max, BODY_PLAIN, uint32_t, OP_MAX)
DEFINE_KERNEL(u64_min, BODY_PLAIN, uint64_t, OP_MIN)
DEFINE_KERNEL(u64_max, BODY_PLAIN, uint64_t, OP_MAX)
DEFINE_KERNEL(u32_sum, BODY_PLAIN, uint32_t, OP_SUM)
DEFINE_KERNEL(u32_prod, BODY_PLAIN, uint32_t, OP_UMUL)
DEFINE_KERNEL(u32_and, BODY_PLAIN, uint32_t, OP_AND)
DEFINE_KERNEL(u32_or, BODY_PLAIN, uint32_t, OP_OR)
DEFINE_KERNEL(u32_xor, BODY_PLAIN, uint32_t, OP_XOR)
DEFINE_KERNEL(i32_min, BODY_PLAIN, int32_t, OP_MIN)
DEFINE_KERNEL(i32_max, BODY_PLAIN, int32_t, OP_MAX)
DEFINE_KERNEL(u64_sum, BODY_PLAIN, uint64_t, OP_SUM)
DEFINE_KERNEL(u64_prod, BODY_PLAIN, uint64_t, OP_UMUL)
DEFINE_KERNEL(u64_and, BODY_PLAIN, uint64_t, OP_AND)
DEFINE_KERNEL(u64_or, BODY_PLAIN, uint64_t, OP_OR)
DEFINE_KERNEL(u64_xor, BODY_PLAIN, uint64_t, OP_XOR)
DEFINE_KERNEL(i64_min, BODY_PLAIN, int64_t, OP_MIN)
DEFINE_KERNEL(i64_max, BODY_PLAIN, int64_t, OP_MAX)
DEFINE_KERNEL(bool_or, BODY_PLAIN, uint8_t, OP_LOR)
DEFINE_KERNEL(bool_and, BODY_PLAIN, uint8_t, OP_LAND)
DEFINE_KERNEL(bool_xor, BODY_PLAIN, uint8_t, OP_LXOR)

/* The ops a combine step can see: AVG and PREMUL_SUM combine as SUM. */
enum { K_SUM, K_PROD, K_MIN, K_MAX, K_AND, K_OR, K_XOR, K_COUNT };

struct kernel_set {
    kernel_fn g, a, x;
};
#define KS(name)                                                                                   \
    {                                                                                              \
        name##_g, name##_a, name##_x                                                               \
    }
#define KNONE                                                                                      \
    {                                                                                              \
        NULL, NULL, NULL                                                                           \
    }

/* Directly-reduced dtypes. float16/float8 rows hold the float32 kernels they
 * run on blocks. */
static const struct kernel_set kernels[C10D_DTYPE_COUNT][K_COUNT] = {
    [C10D_FLOAT32] = {KS(f32_sum), KS(f32_prod), KS(f32_min), KS(f32_max), KNONE, KNONE, KNONE},
    [C10D_FLOAT64] = {KS(f64_sum), KS(f64_prod), KS(f64_min), KS(f64_max), KNONE, KNONE, KNONE},
    [C10D_FLOAT16] = {KS(f32_sum), KS(f32_prod), KS(f32_min), KS(f32_max), KNONE, KNONE, KNONE},
    [C10D_BFLOAT16] = {KS(bf16_sum), KS(bf16_prod), KS(bf16_min), KS(bf16_max), KNONE, KNONE,
                       KNONE},
    [C10D_INT8] = {KS(u8_sum), KS(u8_prod), KS(i8_min), KS(i8_max), KS(u8_and), KS(u8_or),
                   KS(u8_xor)},
    [C10D_UINT8] = {KS(u8_sum), KS(u8_prod), KS(u8_min), KS(u8_max), KS(u8_and), KS(u8_or),
                    KS(u8_xor)},
    [C10D_INT32] = {KS(u32_sum), KS(u32_prod), KS(i32_min), KS(i32_max), KS(u32_and), KS(u32_or),
                    KS(u32_xor)},
    [C10D_INT64] = {KS(u64_sum), KS(u64_prod), KS(i64_min), KS(i64_max), KS(u64_and), KS(u64_or),
                    KS(u64_xor)},
    [C10D_BOOL] = {KS(bool_or), KS(bool_and), KS(bool_and), KS(bool_or), KS(bool_and), KS(bool_or),
                   KS(bool_xor)},
    [C10D_FLOAT8_E4M3] = {KS(f32_sum), KS(f32_prod), KS(f32_min), KS(f32_max), KNONE, KNONE, KNONE},
    [C10D_FLOAT8_E5M2] = {KS(f32_sum), KS(f32_prod), KS(f32_min), KS(f32_max), KNONE, KNONE, KNONE},
    [C10D_INT16] = {KS(u16_sum), KS(u16_prod), KS(i16_min), KS(i16_max), KS(u16_and), KS(u16_or),
                    KS(u16_xor)},
    [C10D_UINT16] = {KS(u16_sum), KS(u16_prod), KS(u16_min), KS(u16_max), KS(u16_and), KS(u16_or),
                     KS(u16_xor)},
    [C10D_UINT32] = {KS(u32_sum), KS(u32_prod), KS(u32_min), KS(u32_max), KS(u32_and), KS(u32_or),
                     KS(u32_xor)},
    [C10D_UINT64] = {KS(u64_sum), KS(u64_prod), KS(u64_min), KS(u64_max), KS(u64_and), KS(u64_or),
                     KS(u64_xor)},
    /* Complex: SUM alone, on the real type's kernel over twice the values. */
    [C10D_COMPLEX64] = {KS(f32_sum), KNONE, KNONE, KNONE, KNONE, KNONE, KNONE},
    [C10D_COMPLEX128] = {KS(f64_sum), KNONE, KNONE, KNONE, KNONE, KNONE, KNONE},
};

/* ------------------------------------------------------- ISA choice */

static _Atomic int isa_level = C10D_ISA_AUTO;

static int isa_detect(void)
{
    __builtin_cpu_init();
    /* The float16 blocks use F16C alongside AVX2; every AVX2 CPU so far has it,
     * but check rather than assume. */
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c"))
        return C10D_ISA_AVX2;
    return C10D_ISA_GENERIC;
}

static int isa_current(void)
{
    int level = atomic_load_explicit(&isa_level, memory_order_relaxed);
    if (level < 0) {
        level = isa_detect();
        atomic_store_explicit(&isa_level, level, memory_order_relaxed);
    }
    return level;
}

int c10d__reduce_set_isa(int isa)
{
    int best = isa_detect();
    int level = (isa < 0 || isa > best) ? best : isa;
    atomic_store_explicit(&isa_level, level, memory_order_relaxed);
    return level;
}

/* ------------------------------------------ float16 / float8 blocks */

#define BLOCK 512 /* elements: two float blocks stay in L1 */

typedef void (*decode_fn)(float *out, const u8 *in, size_t n);
typedef void (*encode_fn)(u8 *out, const float *in, size_t n);

static void f16_decode_g(float *out, const u8 *in, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, in + 2 * i, 2);
        out[i] = c10d__h2f(h);
    }
}

static void f16_encode_g(u8 *out, const float *in, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint16_t h = c10d__f2h(in[i]);
        memcpy(out + 2 * i, &h, 2);
    }
}

__attribute__((target("avx2,f16c"))) static void f16_decode_a(float *out, const u8 *in, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(in + 2 * i))));
    f16_decode_g(out + i, in + 2 * i, n - i);
}

__attribute__((target("avx2,f16c"))) static void f16_encode_a(u8 *out, const float *in, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(out + 2 * i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(in + i),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    f16_encode_g(out + 2 * i, in + i, n - i);
}

/* float8 codecs, baseline and AVX2 builds of the same loops. */
#define DEFINE_CODEC(name, to_f, from_f)                                                           \
    static void name##_decode_g(float *out, const u8 *in, size_t n)                                \
    {                                                                                              \
        for (size_t i = 0; i < n; i++)                                                             \
            out[i] = to_f(in[i]);                                                                  \
    }                                                                                              \
    AVX2_ATTR static void name##_decode_a(float *out, const u8 *in, size_t n)                      \
    {                                                                                              \
        for (size_t i = 0; i < n; i++)                                                             \
            out[i] = to_f(in[i]);                                                                  \
    }                                                                                              \
    static void name##_encode_g(u8 *out, const float *in, size_t n)                                \
    {                                                                                              \
        for (size_t i = 0; i < n; i++)                                                             \
            out[i] = from_f(in[i]);                                                                \
    }                                                                                              \
    AVX2_ATTR static void name##_encode_a(u8 *out, const float *in, size_t n)                      \
    {                                                                                              \
        for (size_t i = 0; i < n; i++)                                                             \
            out[i] = from_f(in[i]);                                                                \
    }

DEFINE_CODEC(e4m3, c10d__e4m3_to_f, c10d__f_to_e4m3)
DEFINE_CODEC(e5m2, c10d__e5m2_to_f, c10d__f_to_e5m2)

static void codec_for(c10d_dtype dtype, int isa, decode_fn *dec, encode_fn *enc, size_t *esize)
{
    switch (dtype) {
    case C10D_FLOAT16:
        *dec = isa >= C10D_ISA_AVX2 ? f16_decode_a : f16_decode_g;
        *enc = isa >= C10D_ISA_AVX2 ? f16_encode_a : f16_encode_g;
        *esize = 2;
        return;
    case C10D_FLOAT8_E4M3:
        *dec = isa >= C10D_ISA_AVX2 ? e4m3_decode_a : e4m3_decode_g;
        *enc = isa >= C10D_ISA_AVX2 ? e4m3_encode_a : e4m3_encode_g;
        *esize = 1;
        return;
    default:
        *dec = isa >= C10D_ISA_AVX2 ? e5m2_decode_a : e5m2_decode_g;
        *enc = isa >= C10D_ISA_AVX2 ? e5m2_encode_a : e5m2_encode_g;
        *esize = 1;
        return;
    }
}

static int needs_block(c10d_dtype dtype)
{
    return dtype == C10D_FLOAT16 || dtype == C10D_FLOAT8_E4M3 || dtype == C10D_FLOAT8_E5M2;
}

static void run_blocks(u8 *d, const u8 *s, size_t n, c10d_dtype dtype, kernel_fn k, int isa)
{
    decode_fn dec;
    encode_fn enc;
    size_t es;
    codec_for(dtype, isa, &dec, &enc, &es);
    float fd[BLOCK], fs[BLOCK];
    for (size_t off = 0; off < n; off += BLOCK) {
        size_t m = n - off < BLOCK ? n - off : BLOCK;
        dec(fd, d + off * es, m);
        dec(fs, s + off * es, m);
        k((u8 *)fd, (const u8 *)fs, m);
        enc(d + off * es, fd, m);
    }
}

/* -------------------------------------------------------- interface */

static int kernel_index(c10d_reduce_op op)
{
    switch (op) {
    case C10D_PRODUCT:
        return K_PROD;
    case C10D_MIN:
        return K_MIN;
    case C10D_MAX:
        return K_MAX;
    case C10D_BAND:
        return K_AND;
    case C10D_BOR:
        return K_OR;
    case C10D_BXOR:
        return K_XOR;
    default: /* SUM, AVG, PREMUL_SUM */
        return K_SUM;
    }
}

int c10d__reduce(void *dst, const void *src, size_t count, c10d_dtype dtype, c10d_reduce_op op)
{
    C10D_CHECK(c10d_reduce_op_check(op, dtype));
    if (count == 0)
        return 0;
    if (dst == NULL || src == NULL)
        return c10d__fail(C10D_EINVAL, "reduce: NULL buffer with %zu elements", count);
    size_t bytes = count * c10d_dtype_size(dtype);
    if (bytes / c10d_dtype_size(dtype) != count)
        return c10d__fail(C10D_EINVAL, "reduce: %zu elements overflow size_t", count);
    uintptr_t di = (uintptr_t)dst, si = (uintptr_t)src;
    if (dst != src && di < si + bytes && si < di + bytes)
        return c10d__fail(C10D_EINVAL, "reduce: dst and src overlap without being equal");
    c10d__reduce_checked(dst, src, count, dtype, op);
    return 0;
}

void c10d__reduce_checked(void *dst, const void *src, size_t count, c10d_dtype dtype,
                          c10d_reduce_op op)
{
    if (count == 0)
        return;
    u8 *d = dst;
    const u8 *s = src;
    const struct kernel_set *ks = &kernels[dtype][kernel_index(op)];
    int isa = isa_current();
    if (needs_block(dtype)) {
        /* Blocks decode both operands before writing, so dst == src is fine. */
        run_blocks(d, s, count, dtype, isa >= C10D_ISA_AVX2 ? ks->a : ks->g, isa);
        return;
    }
    kernel_fn k = d == s ? ks->x : isa >= C10D_ISA_AVX2 ? ks->a : ks->g;
    size_t per;
    c10d__dtype_real(dtype, &per);
    k(d, s, count * per);
}

c10d__reduce_fn c10d__reduce_kernel(c10d_dtype dtype, c10d_reduce_op op, size_t *per)
{
    c10d__dtype_real(dtype, per);
    if (needs_block(dtype))
        return NULL;
    const struct kernel_set *ks = &kernels[dtype][kernel_index(op)];
    return isa_current() >= C10D_ISA_AVX2 ? ks->a : ks->g;
}

/* x = x * f (PREMUL_SUM) or x = x / f (AVG), rounded once per element. */
static void scale(u8 *b, size_t n, c10d_dtype dtype, double factor, int divide)
{
    float ff = (float)factor;
    size_t per;
    dtype = c10d__dtype_real(dtype, &per); /* complex: each part alike (a real factor) */
    n *= per;
    switch (dtype) {
    case C10D_FLOAT64:
        for (size_t i = 0; i < n; i++) {
            double v;
            memcpy(&v, b + 8 * i, 8);
            v = divide ? v / factor : v * factor;
            memcpy(b + 8 * i, &v, 8);
        }
        return;
    case C10D_FLOAT32:
        for (size_t i = 0; i < n; i++) {
            float v;
            memcpy(&v, b + 4 * i, 4);
            v = divide ? v / ff : v * ff;
            memcpy(b + 4 * i, &v, 4);
        }
        return;
    case C10D_BFLOAT16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, b + 2 * i, 2);
            float v = c10d__bf2f(h);
            h = c10d__f2bf(divide ? v / ff : v * ff);
            memcpy(b + 2 * i, &h, 2);
        }
        return;
    default: {
        decode_fn dec;
        encode_fn enc;
        size_t es;
        codec_for(dtype, isa_current(), &dec, &enc, &es);
        float f[BLOCK];
        for (size_t off = 0; off < n; off += BLOCK) {
            size_t m = n - off < BLOCK ? n - off : BLOCK;
            dec(f, b + off * es, m);
            for (size_t i = 0; i < m; i++)
                f[i] = divide ? f[i] / ff : f[i] * ff;
            enc(b + off * es, f, m);
        }
        return;
    }
    }
}

static int is_floating(c10d_dtype dtype)
{
    return c10d_reduce_op_check(C10D_AVG, dtype) == 0;
}

int c10d__reduce_premul(void *buf, size_t count, c10d_dtype dtype, double factor)
{
    if (c10d_dtype_size(dtype) == 0)
        return c10d__fail(C10D_EINVAL, "reduce premul: invalid dtype %d", (int)dtype);
    if (!is_floating(dtype))
        return c10d__fail(C10D_EINVAL, "Cannot use ReduceOp.PREMUL_SUM with non-floating dtype %s",
                          c10d_dtype_name(dtype));
    if (count == 0)
        return 0;
    if (buf == NULL)
        return c10d__fail(C10D_EINVAL, "reduce premul: NULL buffer with %zu elements", count);
    scale(buf, count, dtype, factor, 0);
    return 0;
}

int c10d__reduce_finish(void *buf, size_t count, c10d_dtype dtype, c10d_reduce_op op, int nranks)
{
    C10D_CHECK(c10d_reduce_op_check(op, dtype));
    if (nranks <= 0)
        return c10d__fail(C10D_EINVAL, "reduce finish: nranks must be positive (got %d)", nranks);
    if (op != C10D_AVG || count == 0)
        return 0;
    if (buf == NULL)
        return c10d__fail(C10D_EINVAL, "reduce finish: NULL buffer with %zu elements", count);
    scale(buf, count, dtype, (double)nranks, 1);
    return 0;
}

/* ------------------------------------------------ scalar conversions */

float c10d__half_to_float(uint16_t h)
{
    return c10d__h2f(h);
}

uint16_t c10d__float_to_half(float f)
{
    return c10d__f2h(f);
}

float c10d__bf16_to_float(uint16_t b)
{
    return c10d__bf2f(b);
}

uint16_t c10d__float_to_bf16(float f)
{
    return c10d__f2bf(f);
}

float c10d__e4m3_to_float(uint8_t v)
{
    return c10d__e4m3_to_f(v);
}

uint8_t c10d__float_to_e4m3(float f)
{
    return c10d__f_to_e4m3(f);
}

float c10d__e5m2_to_float(uint8_t v)
{
    return c10d__e5m2_to_f(v);
}

uint8_t c10d__float_to_e5m2(float f)
{
    return c10d__f_to_e5m2(f);
}
