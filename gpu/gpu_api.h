/* The CUDA runtime and NCCL behind one function table, loaded at run time.
 *
 * libc10d links neither libcudart nor libnccl: the first group that needs
 * the nccl backend (or a CUDA buffer) loads them with dlopen, by their
 * versioned sonames or by the files C10D_CUDART_LIBRARY / C10D_NCCL_LIBRARY
 * name. One build thus runs on machines with and without GPUs, and a test
 * can point both variables at the CPU simulation (test/gpusim/) to run the
 * very suite that runs against real hardware. Building needs no CUDA file
 * at all: gpu_decls.h declares the part of both interfaces we use, and each
 * table below is made from its list there, so an entry has exactly the type
 * of the function it holds. */
#ifndef C10D_GPU_GPU_API_H
#define C10D_GPU_GPU_API_H

#include "gpu/gpu_decls.h"

#include <stddef.h>

#define C10D__GPU_FN(ret, name, params) __typeof__(&name) name;

/* The CUDA runtime entries the library and its tests use. */
struct c10d__cudart_api {
    C10D__CUDART_FUNCTIONS(C10D__GPU_FN)
};

/* The NCCL entries the nccl backend uses. */
struct c10d__nccl_api {
    C10D__NCCL_FUNCTIONS(C10D__GPU_FN)
};

struct c10d__gpu_api {
    struct c10d__cudart_api cuda;
    struct c10d__nccl_api nccl;
    char cudart_path[256]; /* the file each part was loaded from ("" if not) */
    char nccl_path[256];
    int nccl_version;   /* ncclGetVersion's code, 0 before loading */
    int cudart_version; /* cudaRuntimeGetVersion's, 0 before loading */
    int device_count;   /* cudaGetDeviceCount's at load time */
};

/* Any thread, idempotent, thread-safe. Loads the CUDA runtime: 0, or
 * C10D_EUNSUPPORTED with c10d_last_error() naming the library that is
 * missing (and every file tried) or the entry it lacks, or that it sees no
 * device. The first failure is remembered and returned again. */
int c10d__cuda_load(const struct c10d__cudart_api **out);
/* The CUDA runtime and NCCL, both. */
int c10d__nccl_load(const struct c10d__gpu_api **out);
/* What was loaded, for c10d_build_info ("" when nothing was tried). */
void c10d__gpu_describe(char *buf, size_t len);

/* The library's own threads (the loop, workers) make `device` current
 * before any CUDA or NCCL call for a group bound to it, and leave it so: a
 * thread's first call on a device makes a context there (hundreds of MiB),
 * and since CUDA 12 cudaSetDevice does too, so "restoring" a fresh thread to
 * device 0 would put one on GPU 0 for every rank of a node. Caller threads
 * save and restore their device themselves. Sets only when it differs. */
void c10d__gpu_use_device(const struct c10d__cudart_api *cu, int device);
/* Where the thread may be the caller's: makes `device` current and returns
 * what was (-1: nothing changed); c10d__gpu_restore_device puts it back. */
int c10d__gpu_switch_device(const struct c10d__cudart_api *cu, int device);
void c10d__gpu_restore_device(const struct c10d__cudart_api *cu, int prev);

/* Calls `expr` (a cudaError_t); on failure records "what: <CUDA's text>" and
 * returns C10D_EIO from the enclosing function. */
#define C10D__CUDA_CHECK(api, expr, what)                                                          \
    do {                                                                                           \
        cudaError_t c10d__ce = (expr);                                                             \
        if (c10d__ce != cudaSuccess)                                                               \
            return c10d__fail(C10D_EIO, "%s: %s", (what), (api)->cudaGetErrorString(c10d__ce));    \
    } while (0)

#endif
