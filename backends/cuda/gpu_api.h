/* The CUDA runtime and NCCL behind one function table, loaded at run time.
 *
 * libc10d links neither libcudart nor libnccl: the first group that needs
 * the nccl backend (or a CUDA buffer) loads them with dlopen, by their
 * versioned sonames or by the files C10D_CUDART_LIBRARY / C10D_NCCL_LIBRARY
 * name. One build thus runs on machines with and without GPUs, and a test
 * can point both variables at the CPU simulation (test/gpusim/) to run the
 * very suite that runs against real hardware. Building needs only the
 * headers, which also type every entry below: a table entry has exactly the
 * type of the function it holds. */
#ifndef C10D_BACKENDS_CUDA_GPU_API_H
#define C10D_BACKENDS_CUDA_GPU_API_H

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <stddef.h>

#define C10D__GPU_FN(name) __typeof__(&name) name

/* The CUDA runtime entries the library and its tests use. */
struct c10d__cudart_api {
    C10D__GPU_FN(cudaGetDeviceCount);
    C10D__GPU_FN(cudaSetDevice);
    C10D__GPU_FN(cudaGetDevice);
    C10D__GPU_FN(cudaRuntimeGetVersion);
    C10D__GPU_FN(cudaDriverGetVersion);
    C10D__GPU_FN(cudaGetErrorString);
    C10D__GPU_FN(cudaGetLastError);
    C10D__GPU_FN(cudaDeviceGetStreamPriorityRange);
    C10D__GPU_FN(cudaStreamCreateWithPriority);
    C10D__GPU_FN(cudaStreamDestroy);
    C10D__GPU_FN(cudaStreamSynchronize);
    C10D__GPU_FN(cudaStreamWaitEvent);
    C10D__GPU_FN(cudaStreamIsCapturing);
    C10D__GPU_FN(cudaThreadExchangeStreamCaptureMode);
    C10D__GPU_FN(cudaEventCreateWithFlags);
    C10D__GPU_FN(cudaEventDestroy);
    C10D__GPU_FN(cudaEventRecord);
    C10D__GPU_FN(cudaEventQuery);
    C10D__GPU_FN(cudaEventSynchronize);
    C10D__GPU_FN(cudaLaunchHostFunc);
    C10D__GPU_FN(cudaMalloc);
    C10D__GPU_FN(cudaFree);
    C10D__GPU_FN(cudaHostAlloc);
    C10D__GPU_FN(cudaFreeHost);
    C10D__GPU_FN(cudaMemcpy);
    C10D__GPU_FN(cudaMemcpyAsync);
    C10D__GPU_FN(cudaMemsetAsync);
    C10D__GPU_FN(cudaDeviceSynchronize);
    /* the NaN check kernel (nan_check.h) */
    C10D__GPU_FN(cudaLibraryLoadData);
    C10D__GPU_FN(cudaLibraryGetKernel);
    C10D__GPU_FN(cudaLaunchKernel);
};

/* The NCCL entries the nccl backend uses. */
struct c10d__nccl_api {
    C10D__GPU_FN(ncclGetVersion);
    C10D__GPU_FN(ncclGetErrorString);
    C10D__GPU_FN(ncclGetLastError);
    C10D__GPU_FN(ncclGetUniqueId);
    C10D__GPU_FN(ncclCommInitRankConfig);
    C10D__GPU_FN(ncclCommInitRankScalable);
    C10D__GPU_FN(ncclCommSplit);
    C10D__GPU_FN(ncclCommShrink);
    C10D__GPU_FN(ncclCommFinalize);
    C10D__GPU_FN(ncclCommDestroy);
    C10D__GPU_FN(ncclCommAbort);
    C10D__GPU_FN(ncclCommGetAsyncError);
    C10D__GPU_FN(ncclCommCount);
    C10D__GPU_FN(ncclCommUserRank);
    C10D__GPU_FN(ncclRedOpCreatePreMulSum);
    C10D__GPU_FN(ncclRedOpDestroy);
    C10D__GPU_FN(ncclAllReduce);
    C10D__GPU_FN(ncclBroadcast);
    C10D__GPU_FN(ncclReduce);
    C10D__GPU_FN(ncclAllGather);
    C10D__GPU_FN(ncclReduceScatter);
    C10D__GPU_FN(ncclSend);
    C10D__GPU_FN(ncclRecv);
    C10D__GPU_FN(ncclGroupStart);
    C10D__GPU_FN(ncclGroupEnd);
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

/* Calls `expr` (a cudaError_t); on failure records "what: <CUDA's text>" and
 * returns C10D_EIO from the enclosing function. */
#define C10D__CUDA_CHECK(api, expr, what)                                                          \
    do {                                                                                           \
        cudaError_t c10d__ce = (expr);                                                             \
        if (c10d__ce != cudaSuccess)                                                               \
            return c10d__fail(C10D_EIO, "%s: %s", (what), (api)->cudaGetErrorString(c10d__ce));    \
    } while (0)

#endif
