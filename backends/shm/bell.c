/* The doorbell's listener (bell.h). */
#include "bell.h"

#include "engine/log.h"
#include "engine/loop.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct c10d__shm_bell {
    uv_poll_t poll;
    int fd; /* a dup of the segment's read end, closed with the handle */
};

static void on_readable(uv_poll_t *h, int status, int events)
{
    struct c10d__shm_bell *b = h->data;
    (void)events;
    if (status < 0) { /* cannot happen on a pipe; never spin on it */
        C10D_DEBUG("shm", "doorbell: %s; the poller's timer wakes this rank", uv_strerror(status));
        uv_poll_stop(h);
        return;
    }
    char buf[64];
    while (read(b->fd, buf, sizeof buf) == (ssize_t)sizeof buf)
        ;
    c10d__engine_busy();
}

static void on_closed(uv_handle_t *h);

/* Nobody would hear it: the peers ring this rank over tcp instead. */
static struct c10d__shm_bell *deaf(struct c10d__shm_seg *seg, const char *what, const char *why)
{
    C10D_DEBUG("shm", "doorbell: %s failed (%s): this rank is woken over tcp", what, why);
    c10d__shm_bell_withdraw(seg);
    return NULL;
}

struct c10d__shm_bell *c10d__shm_bell_listen(struct c10d__shm_seg *seg)
{
    int rd = c10d__shm_bell_fd(seg);
    if (rd < 0)
        return NULL;
    struct c10d__shm_bell *b = calloc(1, sizeof *b);
    if (b == NULL)
        return deaf(seg, "allocating", "out of memory");
    b->fd = fcntl(rd, F_DUPFD_CLOEXEC, 0);
    if (b->fd < 0) {
        int e = errno;
        free(b);
        return deaf(seg, "dup", strerror(e));
    }
    int rc = uv_poll_init(c10d__engine_loop(), &b->poll, b->fd);
    if (rc < 0) {
        close(b->fd);
        free(b);
        return deaf(seg, "polling it", uv_strerror(rc));
    }
    b->poll.data = b;
    rc = uv_poll_start(&b->poll, UV_READABLE, on_readable);
    if (rc < 0) {
        c10d__shm_bell_close(b);
        return deaf(seg, "polling it", uv_strerror(rc));
    }
    return b;
}

static void on_closed(uv_handle_t *h)
{
    struct c10d__shm_bell *b = h->data;
    close(b->fd);
    free(b);
}

void c10d__shm_bell_close(struct c10d__shm_bell *b)
{
    if (b == NULL)
        return;
    if (uv_is_closing((uv_handle_t *)&b->poll)) {
        /* The engine's shutdown walk closed it first, with no callback: the
         * handle's memory must outlive that close, so it stays (a few bytes,
         * once per engine); polling stopped, so the descriptor can go. */
        close(b->fd);
        return;
    }
    uv_close((uv_handle_t *)&b->poll, on_closed);
}
