/* Reading each child's stdout/stderr pipe, cutting it into lines and tagging
 * each line with the rank before it goes to the writer. */
#include "c10drun.h"

/* ------------------------------------------------------------------ output of children */

struct buf {
    char *p;
    size_t len, cap;
};

/* Appends to a growable buffer (*p, *len, *cap). */
static void grow_add(char **p, size_t *len, size_t *cap, const char *src, size_t n)
{
    if (n == 0)
        return;
    if (*len + n > *cap) {
        size_t c = *cap ? *cap : 256;
        while (c < *len + n)
            c *= 2;
        *p = xrealloc(*p, c);
        *cap = c;
    }
    memcpy(*p + *len, src, n);
    *len += n;
}

static void buf_add(struct buf *b, const char *p, size_t n)
{
    grow_add(&b->p, &b->len, &b->cap, p, n);
}

static void partial_add(struct out_stream *s, const char *p, size_t n)
{
    grow_add(&s->partial, &s->len, &s->cap, p, n);
}

static void start_reading(struct launcher *l);
static void stop_reading(struct launcher *l);

static void emit(struct out_stream *s, struct buf *b)
{
    if (b->len == 0)
        return;
    struct launcher *l = s->c->l;
    if (writer_push(l, s->fd, b->p, b->len))
        stop_reading(l);
    b->p = NULL;
    b->len = b->cap = 0;
}

/* One line (in up to two pieces, `nl` adding the newline it lacks) to the log file, as the
 * rank wrote it, and to the console, tagged. */
static void put_line(struct out_stream *s, struct buf *b, const char *p1, size_t n1, const char *p2,
                     size_t n2, bool nl)
{
    if (s->log_fd >= 0) {
        write_all(s->log_fd, p1, n1);
        write_all(s->log_fd, p2, n2);
        if (nl)
            write_all(s->log_fd, "\n", 1);
    }
    if (!s->console)
        return;
    buf_add(b, s->c->prefix, strlen(s->c->prefix));
    buf_add(b, p1, n1);
    buf_add(b, p2, n2);
    if (nl)
        buf_add(b, "\n", 1);
}

static void take_lines(struct out_stream *s, const char *data, size_t n)
{
    struct buf b = {0};
    while (n > 0) {
        const char *nl = memchr(data, '\n', n);
        if (!nl)
            break;
        size_t k = (size_t)(nl - data) + 1;
        put_line(s, &b, s->partial, s->len, data, k, false);
        s->len = 0;
        data += k;
        n -= k;
    }
    while (n > 0) {
        size_t k = n;
        if (s->len + k > MAX_LINE)
            k = MAX_LINE - s->len;
        partial_add(s, data, k);
        data += k;
        n -= k;
        if (s->len == MAX_LINE) {
            put_line(s, &b, s->partial, s->len, NULL, 0, true);
            s->len = 0;
        }
    }
    emit(s, &b);
}

static void flush_partial(struct out_stream *s)
{
    if (s->len == 0)
        return;
    struct buf b = {0};
    /* With a newline, so the next rank's line starts on its own line. */
    put_line(s, &b, s->partial, s->len, NULL, 0, true);
    s->len = 0;
    emit(s, &b);
}

static void on_pipe_closed(uv_handle_t *h)
{
    struct out_stream *s = h->data;
    if (s->log_fd >= 0)
        close(s->log_fd);
    s->log_fd = -1;
    free(s->partial);
    s->partial = NULL;
    s->len = s->cap = 0;
    s->c->l->up.settle(s->c->l);
}

void close_stream(struct out_stream *s)
{
    if (!s->open)
        return;
    flush_partial(s);
    s->open = false;
    uv_close((uv_handle_t *)&s->pipe, on_pipe_closed);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)suggested;
    struct out_stream *s = h->data;
    /* One buffer for all pipes: each read is consumed before the next allocation. */
    *buf = uv_buf_init(s->c->l->rbuf, sizeof s->c->l->rbuf);
}

static void on_read(uv_stream_t *h, ssize_t nread, const uv_buf_t *buf)
{
    struct out_stream *s = h->data;
    if (nread > 0)
        take_lines(s, buf->base, (size_t)nread);
    else if (nread < 0)
        close_stream(s);
}

void for_each_stream(struct launcher *l, void (*fn)(struct out_stream *))
{
    for (int i = 0; i < l->started; i++) {
        fn(&l->ranks[i].out);
        fn(&l->ranks[i].err);
    }
    if (l->have_store) {
        fn(&l->store.out);
        fn(&l->store.err);
    }
}

void read_start_one(struct out_stream *s)
{
    if (s->open)
        uv_read_start((uv_stream_t *)&s->pipe, on_alloc, on_read);
}

static void read_stop_one(struct out_stream *s)
{
    if (s->open)
        uv_read_stop((uv_stream_t *)&s->pipe);
}

static void stop_reading(struct launcher *l)
{
    for_each_stream(l, read_stop_one);
}

static void start_reading(struct launcher *l)
{
    for_each_stream(l, read_start_one);
}

/* Our stdout or stderr is gone (`c10drun ... | head`): close the ranks' ends of the pipes that
 * fed it, so their next write fails (SIGPIPE) as it would have without us in between. */
static void close_if_broken(struct out_stream *s)
{
    if (s->open && s->c->l->out_broken[s->fd]) {
        s->len = 0;
        close_stream(s);
    }
}

void on_resume(uv_async_t *a)
{
    struct launcher *l = a->data;
    pthread_mutex_lock(&l->w.mu);
    bool resume = l->w.paused && l->w.bytes < QUEUE_LOW;
    if (resume)
        l->w.paused = false;
    memcpy(l->out_broken, l->w.broken, sizeof l->out_broken);
    bool broken = l->out_broken[STDOUT_FILENO] || l->out_broken[STDERR_FILENO];
    pthread_mutex_unlock(&l->w.mu);
    if (broken)
        for_each_stream(l, close_if_broken);
    if (resume)
        start_reading(l);
}
