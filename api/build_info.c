#include "c10d.h"

#include "gpu/gpu_api.h"

#include <stdio.h>
#include <uv.h>

/* Rebuilt on each call: what is loaded changes once a group needs NCCL. */
static _Thread_local char build_info[640];

const char *c10d_build_info(void)
{
    char nccl[512];
    c10d__gpu_describe(nccl, sizeof nccl);
    snprintf(build_info, sizeof build_info, "libc10d %s; libuv %s; backends: tcp, nccl; %s",
             c10d_version(), uv_version_string(), nccl);
    return build_info;
}
