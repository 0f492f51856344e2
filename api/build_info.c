#include "c10d.h"

#ifdef C10D_HAVE_NCCL
#include "backends/nccl/nccl_probe.h"
#endif

#include <stdio.h>
#include <uv.h>

static char build_info[256];
static uv_once_t build_info_once = UV_ONCE_INIT;

static void build_info_init(void)
{
    char nccl[96] = "nccl not built";
#ifdef C10D_HAVE_NCCL
    c10d__nccl_describe(nccl, sizeof nccl);
#endif
    snprintf(build_info, sizeof build_info, "libc10d %s; libuv %s; %s", c10d_version(),
             uv_version_string(), nccl);
}

const char *c10d_build_info(void)
{
    uv_once(&build_info_once, build_info_init);
    return build_info;
}
