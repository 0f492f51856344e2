/* The NaN check kernel's ABI (nan_check.h says what the check is): its
 * name in the fatbin, the element kinds it is told, its arguments. Shared
 * by the kernel (nan_check.cu, C++), its launcher (nan_check.c) and the CPU
 * simulation of the CUDA runtime, which runs the same check on the host;
 * so it includes nothing. */
#ifndef C10D_GPU_NAN_CHECK_KERNEL_H
#define C10D_GPU_NAN_CHECK_KERNEL_H

/* The kernel's name in the fatbin, and what it is told about the elements. */
#define C10D_NAN_CHECK_KERNEL "c10d_nan_check"
enum c10d_nan_kind {
    C10D_NAN_F32,
    C10D_NAN_F64,
    C10D_NAN_F16,
    C10D_NAN_BF16,
    C10D_NAN_E4M3, /* float8, OCP e4m3fn: only S.1111.111 is NaN */
    C10D_NAN_E5M2,
};
/* Arguments, in order: const void *buf, unsigned long long count,
 * int kind, unsigned long long *flag, unsigned long long tag. */

#endif
