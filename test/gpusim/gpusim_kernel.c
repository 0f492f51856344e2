/* gpusim: libraries and kernel launches. The one kernel libc10d launches is
 * the NaN check (gpu/nan_check_kernel.h); its fatbin is accepted
 * as opaque bytes and the kernel runs on the CPU, as a task on its stream,
 * with the arguments copied at the launch as CUDA copies them. */
#include "gpusim.h"

#include "gpu/nan_check_kernel.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* Handles: addresses of these, checked on use. */
static const char library_tag[] = "gpusim library";
static const char nan_kernel_tag[] = C10D_NAN_CHECK_KERNEL;

SIM_API cudaError_t cudaLibraryLoadData(cudaLibrary_t *library, const void *code,
                                        enum cudaJitOption *jitOptions, void **jitOptionsValues,
                                        unsigned int numJitOptions,
                                        enum cudaLibraryOption *libraryOptions,
                                        void **libraryOptionValues, unsigned int numLibraryOptions)
{
    sim_mark_context();
    (void)jitOptions, (void)jitOptionsValues, (void)numJitOptions;
    (void)libraryOptions, (void)libraryOptionValues, (void)numLibraryOptions;
    if (library == NULL || code == NULL)
        return cudaErrorInvalidValue;
    *library = (cudaLibrary_t)(void *)library_tag;
    return cudaSuccess;
}

SIM_API cudaError_t cudaLibraryGetKernel(cudaKernel_t *pKernel, cudaLibrary_t library,
                                         const char *name)
{
    if (pKernel == NULL || name == NULL)
        return cudaErrorInvalidValue;
    if ((const void *)library != (const void *)library_tag)
        return cudaErrorInvalidResourceHandle;
    if (strcmp(name, C10D_NAN_CHECK_KERNEL) != 0)
        return cudaErrorSymbolNotFound;
    *pKernel = (cudaKernel_t)(void *)nan_kernel_tag;
    return cudaSuccess;
}

struct nan_task {
    const unsigned char *buf;
    unsigned long long count;
    int kind;
    unsigned long long *flag;
    unsigned long long tag;
};

static int is_nan(const unsigned char *p, int kind)
{
    uint64_t b = 0;
    switch (kind) {
    case C10D_NAN_F32: {
        uint32_t v;
        memcpy(&v, p, 4);
        return (v & 0x7fffffffu) > 0x7f800000u;
    }
    case C10D_NAN_F64:
        memcpy(&b, p, 8);
        return (b & 0x7fffffffffffffffull) > 0x7ff0000000000000ull;
    case C10D_NAN_F16:
    case C10D_NAN_BF16: {
        uint16_t v;
        memcpy(&v, p, 2);
        return (v & 0x7fffu) > (kind == C10D_NAN_F16 ? 0x7c00u : 0x7f80u);
    }
    case C10D_NAN_E4M3:
        return (*p & 0x7fu) == 0x7fu;
    default:
        return (*p & 0x7fu) > 0x7cu;
    }
}

static void nan_run(void *arg)
{
    struct nan_task *t = arg;
    size_t es = t->kind == C10D_NAN_F64    ? 8
                : t->kind == C10D_NAN_F32  ? 4
                : t->kind <= C10D_NAN_BF16 ? 2
                                           : 1;
    /* A GPU faults on memory no allocation holds, and the fault sticks. */
    if (t->count > 0 && !sim_dev_range_valid(t->buf, t->count * es)) {
        sim_fault(cudaErrorIllegalAddress);
        free(t);
        return;
    }
    for (unsigned long long i = 0; i < t->count; i++)
        if (is_nan(t->buf + i * es, t->kind)) {
            *(volatile unsigned long long *)t->flag = t->tag;
            break;
        }
    free(t);
}

SIM_API cudaError_t cudaLaunchKernel(const void *func, dim3 gridDim, dim3 blockDim, void **args,
                                     size_t sharedMem, cudaStream_t stream)
{
    sim_mark_context();
    (void)gridDim, (void)blockDim, (void)sharedMem;
    if (sim_sticky() != cudaSuccess)
        return sim_sticky();
    if (func != (const void *)nan_kernel_tag)
        return cudaErrorInvalidDeviceFunction;
    /* CUDA loads a kernel at its first launch (lazy loading, the default),
     * and the load waits for the device: a stream held by a host function
     * holds the launch too. */
    static _Atomic int loaded;
    if (!atomic_load(&loaded)) {
        cudaDeviceSynchronize();
        atomic_store(&loaded, 1);
    }
    if (args == NULL)
        return cudaErrorInvalidValue;
    struct nan_task *t = malloc(sizeof *t);
    if (t == NULL)
        return cudaErrorMemoryAllocation;
    memcpy(&t->buf, args[0], sizeof t->buf);
    memcpy(&t->count, args[1], sizeof t->count);
    memcpy(&t->kind, args[2], sizeof t->kind);
    memcpy(&t->flag, args[3], sizeof t->flag);
    memcpy(&t->tag, args[4], sizeof t->tag);
    if (t->kind < C10D_NAN_F32 || t->kind > C10D_NAN_E5M2) {
        free(t);
        return cudaErrorInvalidValue;
    }
    cudaError_t rc = sim_stream_enqueue(stream, nan_run, t);
    if (rc != cudaSuccess)
        free(t);
    return rc;
}
