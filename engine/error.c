#include "error.h"

#include <stdio.h>
#include <string.h>
#include <uv.h>

#define C10D_ERROR_MAX 1024

static _Thread_local char last_error[C10D_ERROR_MAX];

static const struct {
    int status;
    const char *name;
    const char *text;
} status_table[] = {
    {C10D_OK, "C10D_OK", "success"},
    {C10D_PENDING, "C10D_PENDING", "pending"},
    {C10D_EINVAL, "C10D_EINVAL", "invalid argument"},
    {C10D_ETIMEDOUT, "C10D_ETIMEDOUT", "timed out"},
    {C10D_ECANCELED, "C10D_ECANCELED", "canceled"},
    {C10D_ECLOSED, "C10D_ECLOSED", "connection closed by peer"},
    {C10D_EABORTED, "C10D_EABORTED", "aborted"},
    {C10D_ESTORE, "C10D_ESTORE", "store error"},
    {C10D_EUNSUPPORTED, "C10D_EUNSUPPORTED", "not supported"},
    {C10D_ENOMEM, "C10D_ENOMEM", "out of memory or over a limit"},
    {C10D_EIO, "C10D_EIO", "I/O error"},
    {C10D_EPROTO, "C10D_EPROTO", "protocol error"},
    {C10D_EDEADLK, "C10D_EDEADLK", "call would deadlock"},
    {C10D_ENOTFOUND, "C10D_ENOTFOUND", "not found"},
    {C10D_EINTERNAL, "C10D_EINTERNAL", "internal error"},
    {C10D_EREVOKED, "C10D_EREVOKED", "process group no longer usable"},
};

static int status_index(int status)
{
    for (size_t i = 0; i < sizeof status_table / sizeof status_table[0]; i++)
        if (status_table[i].status == status)
            return (int)i;
    return -1;
}

const char *c10d_strerror(int status)
{
    int i = status_index(status);
    return i < 0 ? "unknown status" : status_table[i].text;
}

const char *c10d_status_name(int status)
{
    int i = status_index(status);
    return i < 0 ? "C10D_UNKNOWN" : status_table[i].name;
}

const char *c10d_last_error(void)
{
    return last_error;
}

const char *c10d_version(void)
{
    return C10D_VERSION_STRING;
}

int c10d__vfail(int status, const char *fmt, va_list ap)
{
    /* An argument may be c10d_last_error() itself (a message wrapped in its
     * context): formatting straight into it would overwrite what is read. */
    char buf[sizeof last_error];
    vsnprintf(buf, sizeof buf, fmt, ap);
    memcpy(last_error, buf, sizeof buf);
    return status;
}

int c10d__fail(int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    c10d__vfail(status, fmt, ap);
    va_end(ap);
    return status;
}

void c10d__clear_error(void)
{
    last_error[0] = '\0';
}

int c10d__status_from_uv(int uv_err)
{
    switch (uv_err) {
    case 0:
        return C10D_OK;
    case UV_EINVAL:
        return C10D_EINVAL;
    case UV_ETIMEDOUT:
        return C10D_ETIMEDOUT;
    case UV_ECANCELED:
        return C10D_ECANCELED;
    case UV_EOF:
    case UV_ECONNRESET:
    case UV_EPIPE:
    case UV_ECONNREFUSED:
    case UV_ECONNABORTED:
    case UV_ENOTCONN:
        return C10D_ECLOSED;
    case UV_ENOMEM:
    case UV_ENOBUFS:
    case UV_EMFILE:
    case UV_ENFILE:
        return C10D_ENOMEM;
    case UV_ENOTSUP:
        return C10D_EUNSUPPORTED;
    case UV_ENOENT:
        return C10D_ENOTFOUND;
    default:
        return C10D_EIO;
    }
}
