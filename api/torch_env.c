/* PyTorch variables that libc10d knows and does not read: a job moved from
 * torch often still sets them, and silence would let its author believe
 * they act. Each set one is named once per process, at the first
 * c10d_pg_init, with what libc10d does instead. */
#include "api/torch_env.h"

#include "engine/log.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

static const struct {
    const char *name, *instead;
} ignored[] = {
    {"TORCH_NCCL_ASYNC_ERROR_HANDLING",
     "a failed or timed-out op always fails its group and every later op on it (torch's mode 3: "
     "tear down, keep the process); nothing kills the process"},
    {"TORCH_NCCL_HIGH_PRIORITY", "ops run on c10d_op_opts.stream or the group's stream"},
    {"TORCH_NCCL_DESYNC_DEBUG",
     "C10D_DEBUG=DETAIL checks every collective's fingerprint first; c10d-fr reads the flight "
     "recorder's dumps"},
    {"TORCH_NCCL_ENABLE_MONITORING",
     "no heartbeat monitor: the loop's deadlines fail late ops, and nothing aborts the process"},
    {"TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", "no heartbeat monitor (see TORCH_NCCL_ENABLE_MONITORING)"},
    {"TORCH_NCCL_TRACE_CPP_STACK", "flight-recorder entries carry no stack traces"},
    {"TORCH_NCCL_AVOID_RECORD_STREAMS",
     "buffers stay the caller's: nothing is recorded on a stream"},
};

size_t c10d__torch_env_ignored(const char **names, size_t cap)
{
    size_t n = 0;
    for (size_t i = 0; i < sizeof ignored / sizeof ignored[0]; i++) {
        const char *v = getenv(ignored[i].name);
        if (v == NULL || *v == '\0')
            continue;
        if (n < cap)
            names[n] = ignored[i].name;
        n++;
    }
    return n;
}

void c10d__torch_env_warn_once(void)
{
    static atomic_int warned;
    if (atomic_exchange(&warned, 1))
        return;
    for (size_t i = 0; i < sizeof ignored / sizeof ignored[0]; i++) {
        const char *v = getenv(ignored[i].name);
        if (v != NULL && *v != '\0')
            C10D_WARN("env", "%s=%s is set; libc10d does not read it: %s", ignored[i].name, v,
                      ignored[i].instead);
    }
}
