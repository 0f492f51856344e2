/* Deterministic inputs and reference results for checking collectives, shared
 * by c10d-bench (-c 1) and the multi-process tests: every rank can compute
 * every other rank's input, so each checks its own output without talking.
 * Values are small integers so float sums are exact; integer products wrap
 * like the kernels do (two's complement), half types get a tolerance. */
#ifndef C10D_BENCH_DATA_H
#define C10D_BENCH_DATA_H

#include "c10d.h"
#include "engine/kernels/reduce.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

/* The value rank r contributes at element i: 1..4 (0/1 for bool). For
 * PRODUCT, mostly 1 so that products of many ranks stay exact. */
static inline double data_value(int r, size_t i, c10d_dtype dt, c10d_reduce_op op)
{
    if (dt == C10D_BOOL)
        return (double)((r + i) % 2);
    if (op == C10D_PRODUCT)
        return ((size_t)r * 3 + i) % 5 == 0 ? 2.0 : 1.0;
    return (double)(((size_t)r * 7 + i * 3) % 4 + 1);
}

static inline void data_store(void *buf, size_t i, c10d_dtype dt, double v)
{
    switch (dt) {
    case C10D_FLOAT32:
        ((float *)buf)[i] = (float)v;
        break;
    case C10D_FLOAT64:
        ((double *)buf)[i] = v;
        break;
    case C10D_FLOAT16:
        ((uint16_t *)buf)[i] = c10d__float_to_half((float)v);
        break;
    case C10D_BFLOAT16:
        ((uint16_t *)buf)[i] = c10d__float_to_bf16((float)v);
        break;
    case C10D_FLOAT8_E4M3:
        ((uint8_t *)buf)[i] = c10d__float_to_e4m3((float)v);
        break;
    case C10D_FLOAT8_E5M2:
        ((uint8_t *)buf)[i] = c10d__float_to_e5m2((float)v);
        break;
    case C10D_INT8:
        ((int8_t *)buf)[i] = (int8_t)(int64_t)v;
        break;
    case C10D_UINT8:
        ((uint8_t *)buf)[i] = (uint8_t)(int64_t)v;
        break;
    case C10D_BOOL:
        ((uint8_t *)buf)[i] = v != 0;
        break;
    case C10D_INT32:
        ((int32_t *)buf)[i] = (int32_t)(int64_t)v;
        break;
    case C10D_INT64:
        ((int64_t *)buf)[i] = (int64_t)v;
        break;
    case C10D_INT16:
        ((int16_t *)buf)[i] = (int16_t)(int64_t)v;
        break;
    case C10D_UINT16:
        ((uint16_t *)buf)[i] = (uint16_t)(int64_t)v;
        break;
    case C10D_UINT32:
        ((uint32_t *)buf)[i] = (uint32_t)(int64_t)v;
        break;
    case C10D_UINT64:
        ((uint64_t *)buf)[i] = (uint64_t)(int64_t)v;
        break;
    /* Complex: (v, 2v), so that both parts are checked (data_load). */
    case C10D_COMPLEX64:
        ((float *)buf)[2 * i] = (float)v;
        ((float *)buf)[2 * i + 1] = (float)(2 * v);
        break;
    case C10D_COMPLEX128:
        ((double *)buf)[2 * i] = v;
        ((double *)buf)[2 * i + 1] = 2 * v;
        break;
    default:
        break;
    }
}

static inline double data_load(const void *buf, size_t i, c10d_dtype dt)
{
    switch (dt) {
    case C10D_FLOAT32:
        return ((const float *)buf)[i];
    case C10D_FLOAT64:
        return ((const double *)buf)[i];
    case C10D_FLOAT16:
        return c10d__half_to_float(((const uint16_t *)buf)[i]);
    case C10D_BFLOAT16:
        return c10d__bf16_to_float(((const uint16_t *)buf)[i]);
    case C10D_FLOAT8_E4M3:
        return c10d__e4m3_to_float(((const uint8_t *)buf)[i]);
    case C10D_FLOAT8_E5M2:
        return c10d__e5m2_to_float(((const uint8_t *)buf)[i]);
    case C10D_INT8:
        return ((const int8_t *)buf)[i];
    case C10D_UINT8:
        return ((const uint8_t *)buf)[i];
    case C10D_BOOL:
        return ((const uint8_t *)buf)[i];
    case C10D_INT32:
        return ((const int32_t *)buf)[i];
    case C10D_INT64:
        return (double)((const int64_t *)buf)[i];
    case C10D_INT16:
        return ((const int16_t *)buf)[i];
    case C10D_UINT16:
        return ((const uint16_t *)buf)[i];
    case C10D_UINT32:
        return ((const uint32_t *)buf)[i];
    case C10D_UINT64:
        return (double)(int64_t)((const uint64_t *)buf)[i];
    /* The real part, if the imaginary one is still twice it; else NaN. */
    case C10D_COMPLEX64: {
        float re = ((const float *)buf)[2 * i], im = ((const float *)buf)[2 * i + 1];
        return im == 2 * re ? re : NAN;
    }
    case C10D_COMPLEX128: {
        double re = ((const double *)buf)[2 * i], im = ((const double *)buf)[2 * i + 1];
        return im == 2 * re ? re : NAN;
    }
    default:
        return 0;
    }
}

static inline int data_is_float(c10d_dtype dt)
{
    return dt == C10D_FLOAT32 || dt == C10D_FLOAT64 || dt == C10D_FLOAT16 || dt == C10D_BFLOAT16 ||
           dt == C10D_FLOAT8_E4M3 || dt == C10D_FLOAT8_E5M2 || dt == C10D_COMPLEX64 ||
           dt == C10D_COMPLEX128;
}

/* Fills count elements of rank r's input (element index offset `base`). */
static inline void data_fill(void *buf, size_t count, size_t base, int r, c10d_dtype dt,
                             c10d_reduce_op op)
{
    for (size_t i = 0; i < count; i++)
        data_store(buf, i, dt, data_value(r, base + i, dt, op));
}

/* The integer result of reducing `nranks` contributions of element i, wrapped
 * to the dtype's width the way the kernels wrap. */
static inline int64_t data_wrap(int64_t v, c10d_dtype dt)
{
    switch (dt) {
    case C10D_INT8:
        return (int8_t)v;
    case C10D_UINT8:
        return (uint8_t)v;
    case C10D_BOOL:
        return v != 0;
    case C10D_INT32:
        return (int32_t)v;
    case C10D_INT16:
        return (int16_t)v;
    case C10D_UINT16:
        return (uint16_t)v;
    case C10D_UINT32:
        return (uint32_t)v;
    default:
        return v;
    }
}

/* The reduced value of element i over ranks 0..nranks-1. */
static inline double data_reduced(int nranks, size_t i, c10d_dtype dt, c10d_reduce_op op,
                                  double premul)
{
    if (data_is_float(dt)) {
        double acc = data_value(0, i, dt, op);
        if (op == C10D_PREMUL_SUM)
            acc *= premul;
        for (int r = 1; r < nranks; r++) {
            double v = data_value(r, i, dt, op);
            switch (op) {
            case C10D_PRODUCT:
                acc *= v;
                break;
            case C10D_MIN:
                acc = v < acc ? v : acc;
                break;
            case C10D_MAX:
                acc = v > acc ? v : acc;
                break;
            case C10D_PREMUL_SUM:
                acc += v * premul;
                break;
            default:
                acc += v;
            }
        }
        return op == C10D_AVG ? acc / nranks : acc;
    }
    int64_t acc = (int64_t)data_value(0, i, dt, op);
    for (int r = 1; r < nranks; r++) {
        int64_t v = (int64_t)data_value(r, i, dt, op);
        switch (op) {
        case C10D_PRODUCT:
            acc = (int64_t)((uint64_t)acc * (uint64_t)v);
            break;
        case C10D_MIN:
            acc = v < acc ? v : acc;
            break;
        case C10D_MAX:
            acc = v > acc ? v : acc;
            break;
        case C10D_BAND:
            acc &= v;
            break;
        case C10D_BOR:
            acc |= v;
            break;
        case C10D_BXOR:
            acc ^= v;
            break;
        default:
            acc = (int64_t)((uint64_t)acc + (uint64_t)v);
        }
        acc = data_wrap(acc, dt);
    }
    return (double)data_wrap(acc, dt);
}

/* Whether `got` matches `want` for dtype dt (exact for integers; relative
 * tolerance for the narrow floats, which round at every step). */
static inline int data_close(double got, double want, c10d_dtype dt)
{
    double tol;
    switch (dt) {
    case C10D_FLOAT64:
    case C10D_COMPLEX128:
        tol = 1e-12;
        break;
    case C10D_FLOAT32:
    case C10D_COMPLEX64:
        tol = 1e-6;
        break;
    case C10D_FLOAT16:
        tol = 2e-3;
        break;
    case C10D_BFLOAT16:
        tol = 1.6e-2;
        break;
    case C10D_FLOAT8_E4M3:
    case C10D_FLOAT8_E5M2:
        tol = 0.25;
        break;
    default:
        return got == want;
    }
    return fabs(got - want) <= tol * fmax(1.0, fabs(want));
}

#endif
