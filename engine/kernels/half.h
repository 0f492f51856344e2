/* Inline scalar conversions between float32 and the 8/16-bit floating dtypes,
 * shared by the reduction kernels (reduce.c). The out-of-line c10d__*_to_*
 * wrappers declared in reduce.h are the interface for everybody else.
 *
 * NaN rules (chosen to match x86 F16C, so the scalar tails and the vector
 * bodies of a kernel give the same bits): widening keeps the payload and sets
 * the quiet bit; narrowing keeps the payload's top bits, sets the quiet bit
 * and keeps the sign. float8 has one NaN per sign (0x7f/0xff), as in torch. */
#ifndef C10D_ENGINE_KERNELS_HALF_H
#define C10D_ENGINE_KERNELS_HALF_H

#include <stdint.h>
#include <string.h>

static inline uint32_t c10d__fbits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float c10d__bitsf(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* A select written as masks: with a conditional expression GCC sinks the
 * float operation computing `a` into a branch (under the default
 * -ftrapping-math it may not execute it speculatively again), and the loop
 * no longer vectorises. */
static inline uint32_t c10d__sel(int cond, uint32_t a, uint32_t b)
{
    uint32_t m = 0u - (uint32_t)(cond != 0);
    return (a & m) | (b & ~m);
}

/* Decoders are branch-free (selects only) so block loops over them vectorise. */
static inline float c10d__h2f(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t mag = h & 0x7fffu, e = mag >> 10;
    uint32_t norm = (mag << 13) + (112u << 23);
    uint32_t sub = c10d__fbits((float)mag * 0x1p-24f); /* zero or subnormal: exact */
    uint32_t special = (mag << 13) | 0x7f800000u | ((mag & 0x3ffu) ? 0x400000u : 0);
    uint32_t r = c10d__sel(e == 0, sub, e == 0x1f ? special : norm);
    return c10d__bitsf(sign | r);
}

/* float -> a binary format with `mbits` mantissa bits and exponent bias
 * `bias`, rounding to nearest even. Rounded results above `max_finite`
 * become `overflow` (inf, or NaN for e4m3fn); NaN becomes `nan`; the sign
 * goes to bit `sign_bit`. Branch-free: normal results round with an integer
 * add (bias plus the lowest kept bit, the usual RNE trick); results below
 * the smallest normal are rounded by the FPU, adding a power of two whose
 * ulp is the target's smallest subnormal. The FPU step assumes the default
 * rounding mode, as every other float operation of the kernels does. */
static inline uint32_t c10d__f2small(float f, int mbits, int bias, int sign_bit,
                                     uint32_t max_finite, uint32_t overflow, uint32_t nan)
{
    uint32_t u = c10d__fbits(f);
    uint32_t sign = (u >> 31) << sign_bit;
    uint32_t a = u & 0x7fffffffu;
    int sh = 23 - mbits;
    uint32_t min_normal = (uint32_t)(127 - bias + 1) << 23;
    uint32_t odd = (a >> sh) & 1u;
    uint32_t norm = (a - ((uint32_t)(127 - bias) << 23) + ((1u << (sh - 1)) - 1) + odd) >> sh;
    uint32_t magic = (uint32_t)(127 - bias + sh + 1) << 23;
    uint32_t sub = c10d__fbits(c10d__bitsf(a) + c10d__bitsf(magic)) - magic;
    uint32_t r = c10d__sel(a < min_normal, sub, norm);
    r = c10d__sel(r > max_finite, overflow, r);
    r = c10d__sel(a > 0x7f800000u, nan, r);
    return sign | r;
}

static inline uint16_t c10d__f2h(float f)
{
    uint32_t a = c10d__fbits(f) & 0x7fffffffu;
    uint32_t nan = 0x7e00u | ((a >> 13) & 0x3ffu);
    return (uint16_t)c10d__f2small(f, 10, 15, 15, 0x7bffu, 0x7c00u, nan);
}

static inline float c10d__bf2f(uint16_t b)
{
    return c10d__bitsf((uint32_t)b << 16);
}

/* Branch-free so that loops calling it vectorise. */
static inline uint16_t c10d__f2bf(float f)
{
    uint32_t u = c10d__fbits(f);
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t quiet = (u >> 16) | 0x40u;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
}

static inline float c10d__e4m3_to_f(uint8_t v)
{
    uint32_t sign = (uint32_t)(v & 0x80u) << 24;
    uint32_t mag = v & 0x7fu;
    uint32_t norm = (mag << 20) + (120u << 23);
    uint32_t sub = c10d__fbits((float)mag * 0x1p-9f);
    uint32_t r = c10d__sel((mag >> 3) == 0, sub, norm);
    r = c10d__sel(mag == 0x7fu, 0x7fc00000u, r);
    return c10d__bitsf(sign | r);
}

static inline uint8_t c10d__f_to_e4m3(float f)
{
    return (uint8_t)c10d__f2small(f, 3, 7, 7, 0x7eu, 0x7fu, 0x7fu);
}

static inline float c10d__e5m2_to_f(uint8_t v)
{
    return c10d__h2f((uint16_t)(v << 8));
}

static inline uint8_t c10d__f_to_e5m2(float f)
{
    return (uint8_t)c10d__f2small(f, 2, 15, 7, 0x7bu, 0x7cu, 0x7fu);
}

/* Kernel instruction-set selection, for tests and benches that compare the
 * vector paths with the portable ones. C10D_ISA_AUTO picks the best the CPU
 * has; asking for more than the CPU has gives the best it has. Returns the
 * level now in use. */
enum { C10D_ISA_AUTO = -1, C10D_ISA_GENERIC = 0, C10D_ISA_AVX2 = 1 };
int c10d__reduce_set_isa(int isa);

#endif
