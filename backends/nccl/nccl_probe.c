#include "nccl_probe.h"

#include <nccl.h>
#include <stdio.h>

static void version_text(int code, char *buf, size_t len)
{
    /* NCCL >= 2.9 encodes versions as major*10000 + minor*100 + patch. */
    snprintf(buf, len, "%d.%d.%d", code / 10000, (code / 100) % 100, code % 100);
}

void c10d__nccl_describe(char *buf, size_t len)
{
    char compiled[32], runtime[32] = "unavailable";
    version_text(NCCL_VERSION_CODE, compiled, sizeof compiled);
    int code = 0;
    if (ncclGetVersion(&code) == ncclSuccess)
        version_text(code, runtime, sizeof runtime);
    snprintf(buf, len, "nccl %s (runtime %s)", compiled, runtime);
}
