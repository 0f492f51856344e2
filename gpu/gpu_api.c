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

/* The oldest libraries whose every entry we need (docs/nccl.md). */
#define MIN_NCCL_VERSION   21801 /* 2.18.1 */
#define MIN_CUDART_VERSION 12000 /* 12.0 */

static struct c10d__gpu_api api;

static void version_text(int code, char *buf, size_t len);
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

/* Entries an older library may lack, and what happens without them: their
 * table slot stays NULL and the code that uses them takes the other way. */
static const struct optional {
    const char *name, *since, *without;
} optional[] = {
    {"ncclCommShrink", "2.27",
     "c10d_pg_shrink makes the smaller group's communicator anew through the store"},
    {"ncclCommInitRankScalable", "2.23",
     "C10D_NCCL_RANKS_PER_ROOT is ignored: one bootstrap root per communicator"},
};

static const struct optional *optional_entry(const char *name)
{
    for (size_t i = 0; i < sizeof optional / sizeof *optional; i++)
        if (strcmp(optional[i].name, name) == 0)
            return &optional[i];
    return NULL;
}

/* Fills the table at `table` (n function pointers, in the order of `names`);
 * the first missing entry that is not optional is named in the error. */
static int resolve(void *h, const char *lib, const char *const *names, void *table, size_t n,
                   char *err, size_t errlen)
{
    for (size_t i = 0; i < n; i++) {
        void *sym = dlsym(h, names[i]);
        const struct optional *o = sym == NULL ? optional_entry(names[i]) : NULL;
        if (o != NULL)
            C10D_INFO("nccl", "%s has no %s (NCCL %s+): %s", lib, o->name, o->since, o->without);
        if (sym == NULL && o == NULL) {
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

enum tried { TRIED_OK, TRIED_MISSING, TRIED_TOO_NEW, TRIED_FAILED };

/* One candidate CUDA runtime: the table filled (TRIED_OK), or why not in
 * cuda_error: not there, newer than the driver (a CUDA 13 runtime on a CUDA
 * 12 driver: an older runtime may still work), or failing otherwise. */
static enum tried try_cudart(const char *name)
{
    const char *const one[] = {name, NULL};
    void *h = open_library(NULL, one, api.cudart_path, sizeof api.cudart_path, cuda_error,
                           sizeof cuda_error);
    if (h == NULL)
        return TRIED_MISSING;
    if (resolve(h, api.cudart_path, cudart_names, &api.cuda,
                sizeof cudart_names / sizeof *cudart_names, cuda_error, sizeof cuda_error) != 0)
        return TRIED_FAILED;
    api.cuda.cudaRuntimeGetVersion(&api.cudart_version);
    if (api.cudart_version < MIN_CUDART_VERSION) {
        snprintf(cuda_error, sizeof cuda_error,
                 "%s is CUDA runtime %d.%d; libc10d needs %d.%d or newer (cudaLibraryLoadData)",
                 api.cudart_path, api.cudart_version / 1000, api.cudart_version % 1000 / 10,
                 MIN_CUDART_VERSION / 1000, MIN_CUDART_VERSION % 1000 / 10);
        return TRIED_FAILED;
    }
    int n = 0;
    cudaError_t e = api.cuda.cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n <= 0) {
        snprintf(cuda_error, sizeof cuda_error, "no CUDA device is visible (%s: %s)",
                 api.cudart_path, e != cudaSuccess ? api.cuda.cudaGetErrorString(e) : "0 devices");
        if (e != cudaErrorInsufficientDriver)
            return TRIED_FAILED;
        dlclose(h); /* nothing of it is kept: the next candidate refills the table */
        return TRIED_TOO_NEW;
    }
    api.device_count = n;
    return TRIED_OK;
}

/* The runtimes tried: C10D_CUDART_LIBRARY's (one path, or several separated
 * by ':'), else the sonames, newest first. One that is missing or newer than
 * the driver gives way to the next; any other failure is the answer. */
static void load_cuda(void)
{
    static const char *const sonames[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so"};
    char list[1024];
    const char *names[16];
    size_t nn = 0;
    snprintf(list, sizeof list, "%s", c10d__env_str(C10D_ENV_CUDART_LIBRARY));
    for (char *save = NULL, *t = strtok_r(list, ":", &save); t != NULL && nn < 16;
         t = strtok_r(NULL, ":", &save))
        names[nn++] = t;
    if (nn == 0) {
        memcpy(names, sonames, sizeof sonames);
        nn = sizeof sonames / sizeof *sonames;
    }
    char passed[768] = "";
    size_t used = 0;
    for (size_t i = 0; i < nn; i++) {
        enum tried t = try_cudart(names[i]);
        if (t == TRIED_OK) {
            if (used)
                C10D_INFO("cuda", "passed over: %s", passed);
            C10D_INFO("cuda", "loaded %s (runtime %d, %d devices)", api.cudart_path,
                      api.cudart_version, api.device_count);
            cuda_status = 0;
            return;
        }
        cuda_status = C10D_EUNSUPPORTED;
        if (t == TRIED_FAILED)
            return;
        int n = snprintf(passed + used, sizeof passed - used, "%s%s", used ? "; " : "", cuda_error);
        if (n > 0 && (size_t)n < sizeof passed - used)
            used += (size_t)n;
    }
    snprintf(cuda_error, sizeof cuda_error,
             "the CUDA runtime could not be loaded (%.600s); set C10D_CUDART_LIBRARY to "
             "libcudart.so's path",
             passed);
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
    if (api.nccl_version < MIN_NCCL_VERSION) {
        char have[32];
        version_text(api.nccl_version, have, sizeof have);
        snprintf(nccl_error, sizeof nccl_error,
                 "%s is NCCL %s; libc10d needs 2.18.1 or newer (ncclCommSplit, nonblocking "
                 "communicators); set C10D_NCCL_LIBRARY to a newer libnccl.so",
                 api.nccl_path, have);
        nccl_status = C10D_EUNSUPPORTED;
        return;
    }
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
