/* Reduction kernels of the host backend: dst = op(dst, src), element-wise.
 *
 * AVG and PREMUL_SUM combine as SUM; their scaling is a separate step
 * (c10d__reduce_premul on each rank's own input before the first combine,
 * c10d__reduce_finish once on the final result), so every combine step is
 * the same function and results are bit-identical for a fixed order.
 * float16/bfloat16/float8 are computed in float32 and rounded once per step
 * (round to nearest even). Float MIN/MAX propagate NaN (torch.minimum /
 * IEEE 754-2019 minimum). Integer SUM/PRODUCT wrap (two's complement). bool
 * is one byte holding 0/1: SUM/MAX/BOR = or, PRODUCT/MIN/BAND = and, BXOR = xor.
 * Pointers need no alignment; count may be 0. */
#ifndef C10D_ENGINE_KERNELS_REDUCE_H
#define C10D_ENGINE_KERNELS_REDUCE_H

#include "c10d.h"

#include <stddef.h>

/* A complex dtype's real type (complex64: float32), with *per = 2 values per
 * element; any other dtype itself, *per = 1 (per may be NULL). */
c10d_dtype c10d__dtype_real(c10d_dtype dtype, size_t *per);

/* dst = dst op src, elementwise. Returns 0, or C10D_EINVAL (with
 * c10d_last_error) for a pair that c10d_reduce_op_check rejects, NULL
 * buffers, buffers that overlap without being equal, or a size overflow. */
int c10d__reduce(void *dst, const void *src, size_t count, c10d_dtype dtype, c10d_reduce_op op);
/* The same for arguments the caller has checked (an op that passed the
 * group's checks, buffers it owns): a small collective's reduction is a few
 * instructions, and the checks were most of them. */
void c10d__reduce_checked(void *dst, const void *src, size_t count, c10d_dtype dtype,
                          c10d_reduce_op op);

/* The kernel c10d__reduce_checked runs for (dtype, op) on distinct buffers,
 * for a caller that reduces a small op's pieces without its dispatch:
 * kernel(dst, src, count * *per) is dst = dst op src over count elements.
 * NULL for the dtypes reduced through float blocks (float16, float8). */
typedef void (*c10d__reduce_fn)(unsigned char *dst, const unsigned char *src, size_t values);
c10d__reduce_fn c10d__reduce_kernel(c10d_dtype dtype, c10d_reduce_op op, size_t *per);

/* buf *= factor (floating dtypes only), in float64 for float64 and float32 otherwise. */
int c10d__reduce_premul(void *buf, size_t count, c10d_dtype dtype, double factor);

/* The last step of a reduction over `nranks` contributions: AVG divides by
 * nranks (floating dtypes); every other op leaves buf as it is. */
int c10d__reduce_finish(void *buf, size_t count, c10d_dtype dtype, c10d_reduce_op op, int nranks);

/* Scalar conversions used by the kernels, the tests and the benches. */
float c10d__half_to_float(uint16_t h);
uint16_t c10d__float_to_half(float f);
float c10d__bf16_to_float(uint16_t b);
uint16_t c10d__float_to_bf16(float f);
float c10d__e4m3_to_float(uint8_t v);
uint8_t c10d__float_to_e4m3(float f);
float c10d__e5m2_to_float(uint8_t v);
uint8_t c10d__float_to_e5m2(float f);

#endif
