/* test_gpu_decls' program (test_gpu_decls.sh builds and runs it): libc10d's
 * own declarations of CUDA and NCCL (gpu/gpu_decls.h) against the
 * real headers. Compiling it is most of the check: gpu_decls.h in check
 * mode redeclares every typedef and prototype after the real ones and
 * asserts every value, size and field offset. What is not an integer
 * constant expression is compared here, when it runs. */
#include <cuda_runtime_api.h>
#include <nccl.h>

#define C10D__GPU_DECLS_CHECK 1
#include "gpu/gpu_decls.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

static int failures;

static void expect(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "FAIL: %s\n", what);
        failures++;
    }
}

int main(void)
{
#define CHECK_HANDLE(name, value)                                                                  \
    expect((uintptr_t)(name) == (value), #name " is not (cudaStream_t)" #value);
    C10D__GPU_STREAM_HANDLES(CHECK_HANDLE)

    /* Each field of our NCCL_CONFIG_INITIALIZER against NCCL's. */
    ncclConfig_t real = NCCL_CONFIG_INITIALIZER, ours = C10D__NCCL_CONFIG_INITIALIZER;
#define CHECK_CONFIG_VALUE(type, name, init)                                                       \
    expect(memcmp(&real.name, &ours.name, sizeof real.name) == 0,                                  \
           "NCCL_CONFIG_INITIALIZER: ." #name " is not " #init);
    C10D__NCCL_CONFIG_FIELDS(CHECK_CONFIG_VALUE)

    printf("checked against CUDA runtime %d, NCCL %d: %s\n", CUDART_VERSION, NCCL_VERSION_CODE,
           failures ? "MISMATCH" : "all declarations match");
    return failures ? 1 : 0;
}
