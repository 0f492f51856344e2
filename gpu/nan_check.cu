// The NaN check kernel (nan_check.h says how it is used, nan_check_kernel.h
// what it is passed). nvcc compiles it into a fatbin embedded in libc10d.
// Every test is on the bits, so no float type (and no CUDA header) is needed.
#include "nan_check_kernel.h"

__device__ static bool is_nan_bits(unsigned long long b, int kind)
{
    switch (kind) {
    case C10D_NAN_F32:
        return (b & 0x7fffffffull) > 0x7f800000ull;
    case C10D_NAN_F64:
        return (b & 0x7fffffffffffffffull) > 0x7ff0000000000000ull;
    case C10D_NAN_F16:
        return (b & 0x7fffu) > 0x7c00u;
    case C10D_NAN_BF16:
        return (b & 0x7fffu) > 0x7f80u;
    case C10D_NAN_E4M3:
        return (b & 0x7fu) == 0x7fu;
    case C10D_NAN_E5M2:
        return (b & 0x7fu) > 0x7cu;
    default:
        return false;
    }
}

__device__ static unsigned long long load_bits(const void *buf, unsigned long long i, int kind)
{
    switch (kind) {
    case C10D_NAN_F32:
        return ((const unsigned int *)buf)[i];
    case C10D_NAN_F64:
        return ((const unsigned long long *)buf)[i];
    case C10D_NAN_F16:
    case C10D_NAN_BF16:
        return ((const unsigned short *)buf)[i];
    default:
        return ((const unsigned char *)buf)[i];
    }
}

extern "C" __global__ void c10d_nan_check(const void *buf, unsigned long long count, int kind,
                                          unsigned long long *flag, unsigned long long tag)
{
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
         i < count; i += stride) {
        if (is_nan_bits(load_bits(buf, i, kind), kind)) {
            *(volatile unsigned long long *)flag = tag;
            return;
        }
    }
}
