/* Status codes and the thread-local message of the last failure. */
#ifndef C10D_ENGINE_ERROR_H
#define C10D_ENGINE_ERROR_H

#include "c10d.h"

#include <stdarg.h>

#if defined(__GNUC__)
#define C10D_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define C10D_PRINTF(a, b)
#endif

/* Records `fmt` as this thread's last error and returns `status`, so callers
 * can write: return c10d__fail(C10D_EINVAL, "tcp all_reduce: ...", ...); */
int c10d__fail(int status, const char *fmt, ...) C10D_PRINTF(2, 3);
int c10d__vfail(int status, const char *fmt, va_list ap);

/* Clears the last error (successful public calls need not do this). */
void c10d__clear_error(void);

/* NCCLCHECK-style propagation: evaluate, return the negative status. */
#define C10D_CHECK(expr)                                                                           \
    do {                                                                                           \
        int c10d_check_rc_ = (expr);                                                               \
        if (c10d_check_rc_ < 0)                                                                    \
            return c10d_check_rc_;                                                                 \
    } while (0)

/* Maps a libuv error (negative errno) to a c10d status. */
int c10d__status_from_uv(int uv_err);

#endif
