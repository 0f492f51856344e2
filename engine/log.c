#include "log.h"

#include "env.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

/* -1: not yet read from the environment. */
static atomic_int log_level = -1;
static atomic_int log_rank = -1;

static const char level_letter[] = {'T', 'D', 'I', 'W', 'E'};

int c10d__log_level(void)
{
    int level = atomic_load_explicit(&log_level, memory_order_relaxed);
    if (level < 0) {
        level = c10d__env_log_level();
        atomic_store(&log_level, level);
    }
    return level;
}

void c10d__log_set_level(int level)
{
    atomic_store(&log_level, level);
}

void c10d__log_set_rank(int rank)
{
    atomic_store(&log_rank, rank);
}

void c10d__log(int level, const char *component, const char *fmt, ...)
{
    if (level < C10D_LOG_TRACE || level >= C10D_LOG_OFF)
        return;
    char line[2048];
    struct timeval tv;
    struct tm tm;
    gettimeofday(&tv, NULL);
    gmtime_r(&tv.tv_sec, &tm);
    int n = (int)strftime(line, sizeof line, "%Y-%m-%dT%H:%M:%S", &tm);
    int rank = atomic_load_explicit(&log_rank, memory_order_relaxed);
    char rank_text[24] = "";
    if (rank >= 0)
        snprintf(rank_text, sizeof rank_text, " rank %d", rank);
    n += snprintf(line + n, sizeof line - (size_t)n, ".%06ldZ c10d[%d]%s %c %s: ", (long)tv.tv_usec,
                  (int)getpid(), rank_text, level_letter[level], component);
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    if (m < 0)
        m = 0;
    n += m;
    if ((size_t)n > sizeof line - 2)
        n = (int)sizeof line - 2; /* truncated: keep the newline */
    line[n++] = '\n';
    /* One write per line so lines of concurrent threads/processes never interleave. */
    ssize_t rc = write(STDERR_FILENO, line, (size_t)n);
    (void)rc;
}
