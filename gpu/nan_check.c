/* Loading and launching the NaN check kernel (nan_check.h). */
#include "gpu/nan_check.h"

#include "engine/error.h"

#include <stdio.h>
#include <uv.h>

#ifdef C10D_HAVE_NAN_KERNEL
/* nvcc's fatbin of nan_check.cu, made into an array at build time. */
extern const unsigned char c10d__nan_check_fatbin[];
#endif

static uv_once_t load_once = UV_ONCE_INIT;
static int load_status;
static char load_error[256];
static cudaKernel_t kernel;

static void load(void)
{
#ifdef C10D_HAVE_NAN_KERNEL
    const struct c10d__cudart_api *api;
    if (c10d__cuda_load(&api) != 0) { /* loaded already by whoever asks */
        snprintf(load_error, sizeof load_error, "C10D_NCCL_NAN_CHECK: %s", c10d_last_error());
        load_status = C10D_EUNSUPPORTED;
        return;
    }
    cudaLibrary_t lib;
    cudaError_t e =
        api->cudaLibraryLoadData(&lib, c10d__nan_check_fatbin, NULL, NULL, 0, NULL, NULL, 0);
    if (e == cudaSuccess)
        e = api->cudaLibraryGetKernel(&kernel, lib, C10D_NAN_CHECK_KERNEL);
    /* The library stays loaded for the life of the process, like a
     * kernel linked into a program. */
    if (e != cudaSuccess) {
        snprintf(load_error, sizeof load_error,
                 "C10D_NCCL_NAN_CHECK: the NaN check kernel does not load: %s",
                 api->cudaGetErrorString(e));
        load_status = C10D_EUNSUPPORTED;
    }
#else
    snprintf(load_error, sizeof load_error,
             "C10D_NCCL_NAN_CHECK: this build of libc10d has no NaN check kernel (it was built "
             "without a usable nvcc)");
    load_status = C10D_EUNSUPPORTED;
#endif
}

int c10d__nan_check_applies(c10d_dtype dt)
{
    return dt == C10D_FLOAT32 || dt == C10D_FLOAT64 || dt == C10D_FLOAT16 || dt == C10D_BFLOAT16 ||
           dt == C10D_FLOAT8_E4M3 || dt == C10D_FLOAT8_E5M2;
}

int c10d__nan_check_built(void)
{
#ifdef C10D_HAVE_NAN_KERNEL
    return 1;
#else
    return 0;
#endif
}

int c10d__nan_check_load(void)
{
    uv_once(&load_once, load);
    return load_status == 0 ? 0 : c10d__fail(load_status, "%s", load_error);
}

int c10d__nan_check_launch(const struct c10d__cudart_api *api, const void *buf, size_t count,
                           c10d_dtype dt, uint64_t *flag, uint64_t tag, cudaStream_t stream)
{
    if (count == 0 || !c10d__nan_check_applies(dt))
        return 0;
    int kind = dt == C10D_FLOAT32       ? C10D_NAN_F32
               : dt == C10D_FLOAT64     ? C10D_NAN_F64
               : dt == C10D_FLOAT16     ? C10D_NAN_F16
               : dt == C10D_BFLOAT16    ? C10D_NAN_BF16
               : dt == C10D_FLOAT8_E4M3 ? C10D_NAN_E4M3
                                        : C10D_NAN_E5M2;
    unsigned long long n = count, t = tag;
    unsigned long long *f = (unsigned long long *)flag;
    void *args[] = {(void *)&buf, &n, &kind, &f, &t};
    /* Enough blocks to cover the device, not one per 256 elements: each
     * thread strides through the buffer. */
    size_t blocks = (count + 255) / 256;
    dim3 grid = {(unsigned)(blocks < 1024 ? blocks : 1024), 1, 1}, block = {256, 1, 1};
    cudaError_t e = api->cudaLaunchKernel((const void *)kernel, grid, block, args, 0, stream);
    if (e != cudaSuccess)
        return c10d__fail(C10D_EIO, "the NaN check kernel did not launch: %s",
                          api->cudaGetErrorString(e));
    return 0;
}
