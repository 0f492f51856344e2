/* The thread that writes the ranks' output to our stdout/stderr, so that a
 * stalled reader of our output never stalls the loop (signals, deadlines and
 * kills keep working), with back-pressure on the ranks' pipes. */
#include "c10drun.h"

/* ------------------------------------------------------------------ output writer */

static void *writer_main(void *arg)
{
    struct launcher *l = arg;
    struct writer *w = &l->w;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->head && !w->quit)
            pthread_cond_wait(&w->work, &w->mu);
        if (!w->head)
            break;
        struct out_item *it = w->head;
        w->head = it->next;
        if (!w->head)
            w->tail = NULL;
        w->busy = true;
        bool broken = w->broken[it->fd];
        pthread_mutex_unlock(&w->mu);

        int err = 0;
        if (!broken) {
            errno = 0;
            write_all(it->fd, it->data, it->len);
            err = errno;
        }

        pthread_mutex_lock(&w->mu);
        if ((err == EPIPE || err == EBADF || err == EIO) && !w->broken[it->fd]) {
            w->broken[it->fd] = true;
            if (!w->async_closed)
                uv_async_send(&l->resume_async);
        }
        w->busy = false;
        w->bytes -= it->len;
        if (w->paused && w->bytes < QUEUE_LOW && !w->async_closed)
            uv_async_send(&l->resume_async);
        if (!w->head)
            pthread_cond_broadcast(&w->idle);
        free(it->data);
        free(it);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

int writer_start(struct launcher *l)
{
    struct writer *w = &l->w;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->work, NULL);
    pthread_cond_init(&w->idle, &ca);
    pthread_condattr_destroy(&ca);
    if (pthread_create(&w->thread, NULL, writer_main, l) != 0)
        return -1;
    w->started = true;
    return 0;
}

/* Takes ownership of `data` (malloc'd). Returns true when the queue is over its high mark. */
bool writer_push(struct launcher *l, int fd, char *data, size_t len)
{
    struct writer *w = &l->w;
    if (!w->started) {
        write_all(fd, data, len);
        free(data);
        return false;
    }
    struct out_item *it = xmalloc(sizeof *it);
    it->next = NULL;
    it->fd = fd;
    it->len = len;
    it->data = data;
    pthread_mutex_lock(&w->mu);
    if (w->tail)
        w->tail->next = it;
    else
        w->head = it;
    w->tail = it;
    w->bytes += len;
    bool full = w->bytes > QUEUE_HIGH;
    if (full)
        w->paused = true;
    pthread_cond_signal(&w->work);
    pthread_mutex_unlock(&w->mu);
    return full;
}

/* Waits (bounded) for the queue to drain. A reader that never reads must not keep us alive:
 * past the deadline we leave the thread blocked and exit anyway. */
void writer_finish(struct launcher *l, int timeout_ms)
{
    struct writer *w = &l->w;
    if (!w->started)
        return;
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += timeout_ms / 1000;
    deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&w->mu);
    w->quit = true;
    pthread_cond_signal(&w->work);
    int rc = 0;
    while ((w->head || w->busy) && rc != ETIMEDOUT)
        rc = pthread_cond_timedwait(&w->idle, &w->mu, &deadline);
    bool drained = !w->head && !w->busy;
    pthread_mutex_unlock(&w->mu);
    if (drained) {
        pthread_join(w->thread, NULL);
        w->started = false;
    }
}

void say(struct launcher *l, const char *fmt, ...)
{
    char line[1024];
    int n = snprintf(line, sizeof line, "c10drun: ");
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    if (m < 0)
        m = 0;
    n += m;
    if ((size_t)n > sizeof line - 2)
        n = (int)sizeof line - 2;
    line[n++] = '\n';
    char *data = xmalloc((size_t)n);
    memcpy(data, line, (size_t)n);
    writer_push(l, STDERR_FILENO, data, (size_t)n);
}
