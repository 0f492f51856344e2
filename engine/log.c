#include "log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

/* -1: not yet read from the environment. */
static atomic_int log_level = -1;
static atomic_int log_rank = -1;

/* Our names, and torch's (c10 logging: 0 INFO, 1 WARNING, 2 ERROR, 3 FATAL). */
static int parse_level(const char *v, int torch_numbers, int *out)
{
    static const struct {
        const char *name;
        int level;
    } names[] = {
        {"TRACE", C10D_LOG_TRACE}, {"DEBUG", C10D_LOG_DEBUG},  {"INFO", C10D_LOG_INFO},
        {"WARN", C10D_LOG_WARN},   {"WARNING", C10D_LOG_WARN}, {"ERROR", C10D_LOG_ERROR},
        {"FATAL", C10D_LOG_OFF},   {"OFF", C10D_LOG_OFF},      {"NONE", C10D_LOG_OFF},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcasecmp(v, names[i].name) == 0)
            return *out = names[i].level, 0;
    char *end = NULL;
    long n = strtol(v, &end, 10);
    if (end == v || *end != '\0')
        return -1;
    if (torch_numbers) {
        static const int torch_levels[] = {C10D_LOG_INFO, C10D_LOG_WARN, C10D_LOG_ERROR,
                                           C10D_LOG_OFF};
        if (n < 0 || n > 3)
            return -1;
        return *out = torch_levels[n], 0;
    }
    if (n < C10D_LOG_TRACE || n > C10D_LOG_OFF)
        return -1;
    return *out = (int)n, 0;
}

/* Logging sits below env.c (which logs bad values), so it reads its own two
 * variables; their row in env.h's table documents them. */
static int level_from_env(void)
{
    const char *v = getenv("C10D_LOG_LEVEL");
    int from_fallback = 0;
    if (v == NULL || *v == '\0') {
        v = getenv("TORCH_CPP_LOG_LEVEL");
        from_fallback = v != NULL && *v != '\0';
        if (!from_fallback)
            v = NULL;
    }
    int level = C10D_LOG_WARN;
    if (v != NULL && parse_level(v, from_fallback, &level) != 0) {
        level = C10D_LOG_WARN;
        /* Written directly: C10D_WARN would recurse into the level we are computing. */
        c10d__log(C10D_LOG_WARN, "env", "%s=\"%s\" is not a log level; using WARN",
                  from_fallback ? "TORCH_CPP_LOG_LEVEL" : "C10D_LOG_LEVEL", v);
    }
    return level;
}

static const char level_letter[] = {'T', 'D', 'I', 'W', 'E'};

int c10d__log_level(void)
{
    int level = atomic_load_explicit(&log_level, memory_order_relaxed);
    if (level < 0) {
        level = level_from_env();
        atomic_store(&log_level, level);
    }
    return level;
}

void c10d__log_set_level(int level)
{
    atomic_store(&log_level, level);
}

void c10d__log_reload_level(void)
{
    atomic_store(&log_level, level_from_env());
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
