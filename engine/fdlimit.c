#include "fdlimit.h"

#include "error.h"
#include "log.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <string.h>
#include <sys/resource.h>

static uint64_t as_u64(rlim_t v)
{
    return v == RLIM_INFINITY ? UINT64_MAX : (uint64_t)v;
}

int c10d__raise_nofile_limit(uint64_t *soft_out)
{
    struct rlimit rl;
    if (soft_out)
        *soft_out = UINT64_MAX;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return c10d__fail(C10D_EIO, "getrlimit(RLIMIT_NOFILE): %s", strerror(errno));
    if (rl.rlim_cur != rl.rlim_max) {
        struct rlimit want = {.rlim_cur = rl.rlim_max, .rlim_max = rl.rlim_max};
        if (setrlimit(RLIMIT_NOFILE, &want) == 0) {
            C10D_DEBUG("engine",
                       "raised the soft file-descriptor limit from %" PRIu64 " to %" PRIu64,
                       as_u64(rl.rlim_cur), as_u64(rl.rlim_max));
            rl.rlim_cur = rl.rlim_max;
        } else {
            /* Some systems refuse RLIM_INFINITY (macOS: OPEN_MAX); keep the old one. */
            C10D_DEBUG("engine",
                       "cannot raise the soft file-descriptor limit %" PRIu64
                       " to the hard limit %" PRIu64 ": %s",
                       as_u64(rl.rlim_cur), as_u64(rl.rlim_max), strerror(errno));
        }
    }
    if (soft_out)
        *soft_out = as_u64(rl.rlim_cur);
    return 0;
}

int64_t c10d__open_fd_count(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return -1;
    int64_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n > 0 ? n - 1 : 0; /* the directory's own descriptor */
}
