#include "c10d.h"

#ifdef C10D_HAVE_NCCL
#include "backends/cuda/gpu_api.h"
#endif

#include <stdio.h>
#include <uv.h>

/* Rebuilt on each call: what is loaded changes once a group needs NCCL. */
static _Thread_local char build_info[640];

const char *c10d_build_info(void)
{
    char nccl[512] = "nccl backend not built (no CUDA/NCCL headers at build time)";
#ifdef C10D_HAVE_NCCL
    c10d__gpu_describe(nccl, sizeof nccl);
#endif
    snprintf(build_info, sizeof build_info, "libc10d %s; libuv %s; backends: tcp%s; %s",
             c10d_version(), uv_version_string(),
#ifdef C10D_HAVE_NCCL
             ", nccl",
#else
             "",
#endif
             nccl);
    return build_info;
}
