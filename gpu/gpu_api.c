/* Loading the CUDA runtime and NCCL at run time (gpu_api.h says why). Each
 * part is loaded once per process; a failure is remembered with its message,
 * so every later group names the same missing file. */
#include "gpu/gpu_api.h"

#include "engine/env.h"
#include "engine/error.h"
#include "engine/log.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <uv.h>

static struct c10d__gpu_api api;
static uv_once_t cuda_once = UV_ONCE_INIT, nccl_once = UV_ONCE_INIT;
static int cuda_status, nccl_status;
static char cuda_error[768], nccl_error[768];

/* dlopen of the configured file, else of each soname in turn. On failure
 * `why` lists every file tried with dlerror's reason. */
static void *open_library(const char *configured, const char *const *sonames, char *path,
                          size_t pathlen, char *why, size_t whylen)
{
    size_t used = 0;
    why[0] = '\0';
    const char *single[] = {configured, NULL};
    const char *const *names = configured != NULL && *configured ? single : sonames;
    for (; *names != NULL; names++) {
        void *h = dlopen(*names, RTLD_NOW | RTLD_LOCAL);
        if (h != NULL) {
            snprintf(path, pathlen, "%s", *names);
            return h;
        }
        const char *err = dlerror();
        int n = snprintf(why + used, whylen - used, "%s%s", used ? "; " : "",
                         err != NULL ? err : *names);
        if (n > 0 && (size_t)n < whylen - used)
            used += (size_t)n;
    }
    return NULL;
}

/* Fills the table at `table` (n function pointers, in the order of `names`);
 * the first missing entry is named in the error. */
static int resolve(void *h, const char *lib, const char *const *names, void *table, size_t n,
                   char *err, size_t errlen)
{
    for (size_t i = 0; i < n; i++) {
        void *sym = dlsym(h, names[i]);
        if (sym == NULL) {
            snprintf(err, errlen, "%s has no %s (an older version?)", lib, names[i]);
            return C10D_EUNSUPPORTED;
        }
        memcpy((char *)table + i * sizeof(void (*)(void)), &sym, sizeof sym);
    }
    return 0;
}

/* The symbol names, in the order of the tables' entries (one list makes both). */
#define NAME(ret, fn, params) #fn,
static const char *const cudart_names[] = {C10D__CUDART_FUNCTIONS(NAME)};
static const char *const nccl_names[] = {C10D__NCCL_FUNCTIONS(NAME)};
#undef NAME

static void load_cuda(void)
{
    static const char *const sonames[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so",
                                          NULL};
    char why[512];
    void *h = open_library(c10d__env_str(C10D_ENV_CUDART_LIBRARY), sonames, api.cudart_path,
                           sizeof api.cudart_path, why, sizeof why);
    if (h == NULL) {
        snprintf(cuda_error, sizeof cuda_error,
                 "the CUDA runtime could not be loaded (%s); set C10D_CUDART_LIBRARY to "
                 "libcudart.so's path",
                 why);
        cuda_status = C10D_EUNSUPPORTED;
        return;
    }
    cuda_status =
        resolve(h, api.cudart_path, cudart_names, &api.cuda,
                sizeof cudart_names / sizeof *cudart_names, cuda_error, sizeof cuda_error);
    if (cuda_status != 0)
        return;
    api.cuda.cudaRuntimeGetVersion(&api.cudart_version);
    int n = 0;
    cudaError_t e = api.cuda.cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n <= 0) {
        snprintf(cuda_error, sizeof cuda_error, "no CUDA device is visible (%s: %s)",
                 api.cudart_path, e != cudaSuccess ? api.cuda.cudaGetErrorString(e) : "0 devices");
        cuda_status = C10D_EUNSUPPORTED;
        return;
    }
    api.device_count = n;
    C10D_INFO("cuda", "loaded %s (runtime %d, %d devices)", api.cudart_path, api.cudart_version, n);
}

static void load_nccl(void)
{
    static const char *const sonames[] = {"libnccl.so.2", "libnccl.so", NULL};
    char why[512];
    void *h = open_library(c10d__env_str(C10D_ENV_NCCL_LIBRARY), sonames, api.nccl_path,
                           sizeof api.nccl_path, why, sizeof why);
    if (h == NULL) {
        snprintf(nccl_error, sizeof nccl_error,
                 "NCCL could not be loaded (%s); set C10D_NCCL_LIBRARY to libnccl.so's path", why);
        nccl_status = C10D_EUNSUPPORTED;
        return;
    }
    nccl_status = resolve(h, api.nccl_path, nccl_names, &api.nccl,
                          sizeof nccl_names / sizeof *nccl_names, nccl_error, sizeof nccl_error);
    if (nccl_status != 0)
        return;
    api.nccl.ncclGetVersion(&api.nccl_version);
    C10D_INFO("nccl", "loaded %s (version %d)", api.nccl_path, api.nccl_version);
}

int c10d__cuda_load(const struct c10d__cudart_api **out)
{
    uv_once(&cuda_once, load_cuda);
    if (cuda_status != 0)
        return c10d__fail(cuda_status, "%s", cuda_error);
    *out = &api.cuda;
    return 0;
}

int c10d__nccl_load(const struct c10d__gpu_api **out)
{
    const struct c10d__cudart_api *cuda;
    C10D_CHECK(c10d__cuda_load(&cuda));
    uv_once(&nccl_once, load_nccl);
    if (nccl_status != 0)
        return c10d__fail(nccl_status, "%s", nccl_error);
    *out = &api;
    return 0;
}

static void version_text(int code, char *buf, size_t len)
{
    /* NCCL >= 2.9 encodes versions as major*10000 + minor*100 + patch. */
    snprintf(buf, len, "%d.%d.%d", code / 10000, (code / 100) % 100, code % 100);
}

void c10d__gpu_describe(char *buf, size_t len)
{
    char declared[32], loaded[32] = "not loaded";
    version_text(NCCL_VERSION_CODE, declared, sizeof declared);
    if (api.nccl_version != 0)
        version_text(api.nccl_version, loaded, sizeof loaded);
    snprintf(buf, len, "nccl backend (declared for nccl %s, cuda runtime %d; loaded: nccl %s%s%s)",
             declared, CUDART_VERSION, loaded, api.nccl_path[0] ? " from " : "", api.nccl_path);
}

void c10d__gpu_use_device(const struct c10d__cudart_api *cu, int device)
{
    int cur = -1;
    if (device < 0 || (cu->cudaGetDevice(&cur) == cudaSuccess && cur == device))
        return;
    cu->cudaSetDevice(device);
}

int c10d__gpu_switch_device(const struct c10d__cudart_api *cu, int device)
{
    int cur = -1;
    if (device < 0 || cu->cudaGetDevice(&cur) != cudaSuccess || cur == device)
        return -1;
    cu->cudaSetDevice(device);
    return cur;
}

void c10d__gpu_restore_device(const struct c10d__cudart_api *cu, int prev)
{
    if (prev >= 0)
        cu->cudaSetDevice(prev);
}
