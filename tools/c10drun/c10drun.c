/*
 * c10drun: start N local ranks with torchrun's environment, tag their output with the rank,
 * forward signals, and turn the first rank failure into a stop of the whole job.
 *
 * The launcher runs its own uv loop; it does not use the library's engine, so it keeps
 * working (and keeps reporting) while the library is broken or being rebuilt.
 *
 * Every child (rank or external store) is started through this same executable in a hidden
 * "exec" mode that puts the child in its own process group and asks the kernel to SIGTERM it
 * if c10drun dies. Signals then go to the rank's whole group, so a rank that is a shell
 * script takes its own children down with it.
 */
#include <uv.h>

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <netdb.h>
#include <poll.h>
#include <sched.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#ifndef C10DRUN_VERSION
#define C10DRUN_VERSION "unknown"
#endif

/* argv[1] of the hidden mode; not an option a user would type. */
#define EXEC_MARK "--c10drun-internal-exec"

enum {
    EXIT_LAUNCHER = 1, /* c10drun itself could not do its job (spawn, store) */
    EXIT_USAGE = 2,
    EXIT_TIMEOUT = 124, /* as timeout(1) */
    EXIT_NOEXEC = 126,
    EXIT_NOTFOUND = 127,
};

/* A line longer than this is cut into pieces so one rank cannot make us buffer without bound. */
#define MAX_LINE (64 * 1024)
/* Output waiting for a slow stdout/stderr: above HIGH we stop reading the ranks' pipes (they
 * block on write, as they would without us), below LOW we read again. */
#define QUEUE_HIGH (8u << 20)
#define QUEUE_LOW  (1u << 20)
/* After the last child is gone, how long a pipe still held open by a leftover grandchild may
 * keep us waiting. */
#define DRAIN_MS 2000
/* How long we wait at exit for stdout/stderr to accept what is queued. */
#define FLUSH_MS   10000
#define PROBE_MS   50
#define MAX_NPROCS 4096

enum phase { PHASE_STORE_WAIT, PHASE_RUN, PHASE_DONE };

struct options {
    int nprocs;
    bool external_store;
    const char *master_addr;
    int master_port; /* 0: pick a free one */
    uint64_t grace_ms;
    double timeout_s;       /* 0: none */
    double store_timeout_s; /* bound on waiting for the external store's port */
    bool prefix;
    bool verbose;
    const char *store_bin;
    const char *run_id;
    bool bind_core; /* --bind-to core: rank r runs on the r-th CPU we may use */
    int argc;       /* PROGRAM and its arguments */
    char **argv;
};

struct launcher;
struct child;

struct out_stream {
    struct child *c;
    uv_pipe_t pipe;
    int fd; /* where its lines go: 1 or 2 */
    bool open;
    char *partial; /* the last line, until its newline arrives */
    size_t len, cap;
};

struct child {
    struct launcher *l;
    uv_process_t proc;
    int rank; /* -1: the store */
    char name[32];
    char prefix[32];
    pid_t pid;
    bool spawned, exited;
    int64_t exit_status;
    int term_signal;
    struct out_stream out, err;
};

struct out_item {
    struct out_item *next;
    int fd;
    size_t len;
    char *data;
};

/* stdout/stderr are written by a thread so that a stalled reader of our output never stalls
 * the loop: signals, deadlines and kills keep working. */
struct writer {
    pthread_t thread;
    bool started;
    pthread_mutex_t mu;
    pthread_cond_t work, idle;
    struct out_item *head, *tail;
    size_t bytes;
    bool busy, quit;
    bool paused;       /* the loop stopped reading pipes because of `bytes` */
    bool async_closed; /* resume_async must not be sent any more */
    bool broken[3];    /* EPIPE & co: drop what goes there */
};

struct launcher {
    struct options opt;
    uv_loop_t loop;
    struct child *ranks;
    int started;    /* ranks spawned */
    int live_ranks; /* spawned and not exited */
    struct child store;
    bool have_store;
    enum phase phase;
    bool stopping;
    bool store_stopping;
    bool drain_started;
    int drain_rearms;
    bool have_code;
    int exit_code;
    int signals_seen;
    uv_signal_t sigs[4];
    uv_timer_t grace_timer, store_kill_timer, deadline_timer, drain_timer, probe_timer,
        store_deadline_timer;
    uv_tcp_t probe;
    uv_connect_t probe_req;
    bool probe_open;
    uv_async_t resume_async;
    struct sockaddr_storage master_sa;
    char port_text[16];
    char *program_path;
    char *store_path;
    char run_id[96];
    int *cpus; /* --bind-to core: the CPU of each rank */
    char **base_env;
    size_t base_env_len;
    struct writer w;
    bool out_broken[3]; /* the loop's copy of w.broken */
    char rbuf[65536];
};

static const int forwarded_signals[4] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};

/* ------------------------------------------------------------------ small helpers */

static const char *signal_name(int sig)
{
    switch (sig) {
    case SIGHUP:
        return "SIGHUP";
    case SIGINT:
        return "SIGINT";
    case SIGQUIT:
        return "SIGQUIT";
    case SIGILL:
        return "SIGILL";
    case SIGTRAP:
        return "SIGTRAP";
    case SIGABRT:
        return "SIGABRT";
    case SIGBUS:
        return "SIGBUS";
    case SIGFPE:
        return "SIGFPE";
    case SIGKILL:
        return "SIGKILL";
    case SIGUSR1:
        return "SIGUSR1";
    case SIGSEGV:
        return "SIGSEGV";
    case SIGUSR2:
        return "SIGUSR2";
    case SIGPIPE:
        return "SIGPIPE";
    case SIGALRM:
        return "SIGALRM";
    case SIGTERM:
        return "SIGTERM";
    case SIGXCPU:
        return "SIGXCPU";
    case SIGXFSZ:
        return "SIGXFSZ";
    case SIGSYS:
        return "SIGSYS";
    default:
        return "unknown signal";
    }
}

static void oom(void) __attribute__((noreturn));
static void oom(void)
{
    static const char msg[] = "c10drun: out of memory\n";
    ssize_t rc = write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)rc;
    _exit(EXIT_LAUNCHER);
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        oom();
    return p;
}

static void *xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q)
        oom();
    return q;
}

static char *xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    return memcpy(xmalloc(n), s, n);
}

static char *xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *xasprintf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *s = xmalloc((size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(s, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return s;
}

static void write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t k = write(fd, p, n);
        if (k > 0) {
            p += k;
            n -= (size_t)k;
        } else if (k < 0 && errno == EINTR) {
            continue;
        } else if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            /* Someone sharing our stdout made it non-blocking; wait like a blocking write. */
            struct pollfd pfd = {.fd = fd, .events = POLLOUT};
            poll(&pfd, 1, -1);
        } else {
            return;
        }
    }
}

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

static int writer_start(struct launcher *l)
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
static bool writer_push(struct launcher *l, int fd, char *data, size_t len)
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
static void writer_finish(struct launcher *l, int timeout_ms)
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

static void say(struct launcher *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(struct launcher *l, const char *fmt, ...)
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

#define VERBOSE(l, ...)                                                                            \
    do {                                                                                           \
        if ((l)->opt.verbose)                                                                      \
            say((l), __VA_ARGS__);                                                                 \
    } while (0)

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

static void take_lines(struct out_stream *s, const char *data, size_t n)
{
    const char *prefix = s->c->prefix;
    size_t plen = strlen(prefix);
    struct buf b = {0};
    while (n > 0) {
        const char *nl = memchr(data, '\n', n);
        if (!nl)
            break;
        size_t k = (size_t)(nl - data) + 1;
        buf_add(&b, prefix, plen);
        buf_add(&b, s->partial, s->len);
        buf_add(&b, data, k);
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
            buf_add(&b, prefix, plen);
            buf_add(&b, s->partial, s->len);
            buf_add(&b, "\n", 1);
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
    buf_add(&b, s->c->prefix, strlen(s->c->prefix));
    buf_add(&b, s->partial, s->len);
    buf_add(&b, "\n", 1); /* so the next rank's line starts on its own line */
    s->len = 0;
    emit(s, &b);
}

static void maybe_finish(struct launcher *l);

static void on_pipe_closed(uv_handle_t *h)
{
    struct out_stream *s = h->data;
    free(s->partial);
    s->partial = NULL;
    s->len = s->cap = 0;
    maybe_finish(s->c->l);
}

static void close_stream(struct out_stream *s)
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

static void for_each_stream(struct launcher *l, void (*fn)(struct out_stream *))
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

static void read_start_one(struct out_stream *s)
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

static void on_resume(uv_async_t *a)
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

/* ------------------------------------------------------------------ signals to children */

static bool child_live(const struct child *c)
{
    return c->spawned && !c->exited;
}

static void signal_child(struct child *c, int sig)
{
    if (!child_live(c))
        return;
    /* The group covers what the rank started (a shell script's children); the plain kill
     * covers the instant before the child has its own group. */
    if (killpg(c->pid, sig) != 0)
        kill(c->pid, sig);
}

static void signal_ranks(struct launcher *l, int sig)
{
    for (int i = 0; i < l->started; i++)
        signal_child(&l->ranks[i], sig);
}

static void on_grace_expired(uv_timer_t *t)
{
    struct launcher *l = t->data;
    if (l->live_ranks > 0)
        say(l, "%d rank(s) still running %llu ms after being asked to stop; sending SIGKILL",
            l->live_ranks, (unsigned long long)l->opt.grace_ms);
    signal_ranks(l, SIGKILL);
}

static void stop_store(struct launcher *l);

/* Asks every rank to stop with `sig`, then SIGKILL after the grace period. */
static void begin_stop(struct launcher *l, int sig)
{
    if (l->stopping)
        return;
    l->stopping = true;
    uv_timer_stop(&l->deadline_timer);
    if (l->phase == PHASE_STORE_WAIT) {
        stop_store(l);
        maybe_finish(l);
        return;
    }
    signal_ranks(l, sig);
    if (l->live_ranks > 0)
        uv_timer_start(&l->grace_timer, on_grace_expired, l->opt.grace_ms, 0);
    maybe_finish(l);
}

static void set_code(struct launcher *l, int code)
{
    if (!l->have_code) {
        l->have_code = true;
        l->exit_code = code;
    }
}

static void on_signal(uv_signal_t *h, int sig)
{
    struct launcher *l = h->data;
    if (l->phase == PHASE_DONE)
        return;
    l->signals_seen++;
    if (l->signals_seen == 1 && !l->stopping) {
        say(l, "received %s; forwarding it to the ranks", signal_name(sig));
        set_code(l, 128 + sig);
        begin_stop(l, sig);
    } else {
        /* The second Ctrl-C means "now". */
        say(l, "received %s again; killing the ranks", signal_name(sig));
        set_code(l, 128 + sig);
        l->stopping = true;
        signal_ranks(l, SIGKILL);
        if (l->have_store && child_live(&l->store))
            signal_child(&l->store, SIGKILL);
    }
}

static void on_deadline(uv_timer_t *t)
{
    struct launcher *l = t->data;
    say(l, "timeout: the job is still running after %g s (--timeout); stopping it",
        l->opt.timeout_s);
    set_code(l, EXIT_TIMEOUT);
    begin_stop(l, SIGTERM);
}

/* ------------------------------------------------------------------ children */

static void describe_exit(const struct child *c, char *out, size_t n)
{
    if (c->term_signal)
        snprintf(out, n, "killed by signal %d (%s)", c->term_signal, signal_name(c->term_signal));
    else
        snprintf(out, n, "exited with status %lld", (long long)c->exit_status);
}

static void on_process_closed(uv_handle_t *h)
{
    struct child *c = h->data;
    maybe_finish(c->l);
}

static void start_ranks(struct launcher *l);

static void on_rank_exit(uv_process_t *p, int64_t exit_status, int term_signal)
{
    struct child *c = p->data;
    struct launcher *l = c->l;
    c->exited = true;
    c->exit_status = exit_status;
    c->term_signal = term_signal;
    /* Closed first: what follows may end the job, which closes every handle left. */
    uv_close((uv_handle_t *)p, on_process_closed);
    l->live_ranks--;
    char how[96];
    describe_exit(c, how, sizeof how);
    bool failed = term_signal != 0 || exit_status != 0;
    if (failed && !l->stopping) {
        say(l, "rank %d (pid %d) %s", c->rank, (int)c->pid, how);
        set_code(l, term_signal ? 128 + term_signal : (int)(exit_status & 0xff));
        if (l->exit_code == 0)
            l->exit_code = EXIT_LAUNCHER; /* a status that is a multiple of 256 */
        begin_stop(l, SIGTERM);
    } else {
        VERBOSE(l, "rank %d (pid %d) %s", c->rank, (int)c->pid, how);
    }
    if (l->stopping) {
        /* Whatever the rank left in its group goes with it. */
        killpg(c->pid, SIGKILL);
    }
    maybe_finish(l);
}

static void on_store_exit(uv_process_t *p, int64_t exit_status, int term_signal)
{
    struct child *c = p->data;
    struct launcher *l = c->l;
    c->exited = true;
    c->exit_status = exit_status;
    c->term_signal = term_signal;
    /* Closed first: what follows may end the job, which closes every handle left. */
    uv_close((uv_handle_t *)p, on_process_closed);
    char how[96];
    describe_exit(c, how, sizeof how);
    if (l->phase == PHASE_STORE_WAIT && !l->stopping) {
        say(l, "the store %s (pid %d) %s before accepting connections on %s:%s", l->store_path,
            (int)c->pid, how, l->opt.master_addr, l->port_text);
        set_code(l, EXIT_LAUNCHER);
        begin_stop(l, SIGTERM);
    } else if (!l->store_stopping && !l->stopping) {
        say(l, "the store %s (pid %d) %s while the ranks were running", l->store_path, (int)c->pid,
            how);
        set_code(l, EXIT_LAUNCHER);
        begin_stop(l, SIGTERM);
    } else {
        VERBOSE(l, "store (pid %d) %s", (int)c->pid, how);
    }
    uv_timer_stop(&l->store_kill_timer);
    maybe_finish(l);
}

static void on_store_kill(uv_timer_t *t)
{
    struct launcher *l = t->data;
    if (child_live(&l->store)) {
        say(l, "the store (pid %d) is still running %llu ms after SIGTERM; sending SIGKILL",
            (int)l->store.pid, (unsigned long long)l->opt.grace_ms);
        signal_child(&l->store, SIGKILL);
    }
}

static void stop_store(struct launcher *l)
{
    if (!l->have_store || l->store_stopping)
        return;
    l->store_stopping = true;
    uv_timer_stop(&l->store_deadline_timer);
    uv_timer_stop(&l->probe_timer);
    if (child_live(&l->store)) {
        signal_child(&l->store, SIGTERM);
        uv_timer_start(&l->store_kill_timer, on_store_kill, l->opt.grace_ms, 0);
    }
}

/* Real pipes rather than libuv's socketpairs: the rank sees what it would see under torchrun or
 * a shell pipeline (a FIFO; EPIPE, not ECONNRESET, once we stop reading). Returns the write end
 * to close after the spawn, -1 if none, or a uv error. */
static int init_stream(struct launcher *l, struct child *c, struct out_stream *s, int fd,
                       uv_stdio_container_t *stdio)
{
    s->c = c;
    s->fd = fd;
    stdio->flags = UV_INHERIT_FD;
    stdio->data.fd = fd;
    if (!l->opt.prefix)
        return -1;
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0)
        return uv_translate_sys_error(errno);
    uv_pipe_init(&l->loop, &s->pipe, 0);
    s->pipe.data = s;
    int rc = uv_pipe_open(&s->pipe, fds[0]);
    s->open = true;
    if (rc != 0) {
        close(fds[0]);
        close(fds[1]);
        return rc;
    }
    stdio->data.fd = fds[1];
    return fds[1];
}

static void close_failed_stream(struct out_stream *s)
{
    if (s->open) {
        s->open = false;
        uv_close((uv_handle_t *)&s->pipe, NULL);
    }
}

/* Starts `argv` (argv[0] = resolved path) through our exec mode. Returns 0 or a uv error. */
static int spawn_child(struct launcher *l, struct child *c, char **argv, char **env,
                       uv_exit_cb exit_cb)
{
    c->l = l;
    size_t argc = 0;
    while (argv[argc])
        argc++;
    /* "parent pid,cpu": cpu -1 leaves the child's affinity alone. */
    char ppid[32];
    int cpu = l->cpus != NULL && c->rank >= 0 ? l->cpus[c->rank] : -1;
    snprintf(ppid, sizeof ppid, "%d,%d", (int)getpid(), cpu);
    /* self, mark, parent pid, path, argv[0]..., NULL */
    char **args = xmalloc((argc + 5) * sizeof *args);
    args[0] = "c10drun";
    args[1] = EXEC_MARK;
    args[2] = ppid;
    args[3] = argv[0];
    for (size_t i = 0; i < argc; i++)
        args[4 + i] = argv[i];
    args[argc + 4] = NULL;
    /* argv[0] of the program is what the user typed, not the resolved path. */
    if (c->rank >= 0)
        args[4] = l->opt.argv[0];

    uv_stdio_container_t stdio[3];
    stdio[0].flags = UV_IGNORE; /* /dev/null: N ranks cannot share a terminal's input */
    int wr_out = init_stream(l, c, &c->out, STDOUT_FILENO, &stdio[1]);
    int wr_err = wr_out < -1 ? -1 : init_stream(l, c, &c->err, STDERR_FILENO, &stdio[2]);
    if (wr_out < -1 || wr_err < -1) {
        free(args);
        if (wr_out >= 0)
            close(wr_out);
        close_failed_stream(&c->out);
        close_failed_stream(&c->err);
        return wr_out < -1 ? wr_out : wr_err;
    }

    uv_process_options_t po;
    memset(&po, 0, sizeof po);
    /* /proc/self/exe, not a path: it stays right even if c10drun is rebuilt meanwhile. */
    po.file = "/proc/self/exe";
    po.args = args;
    po.env = env;
    po.stdio = stdio;
    po.stdio_count = 3;
    po.exit_cb = exit_cb;
    c->proc.data = c;
    int rc = uv_spawn(&l->loop, &c->proc, &po);
    free(args);
    /* The child has its copies; ours would keep the pipes from ever reaching EOF. */
    if (wr_out >= 0)
        close(wr_out);
    if (wr_err >= 0)
        close(wr_err);
    if (rc != 0) {
        uv_close((uv_handle_t *)&c->proc, NULL);
        close_failed_stream(&c->out);
        close_failed_stream(&c->err);
        return rc;
    }
    c->spawned = true;
    c->pid = c->proc.pid;
    /* Both sides set the group (the classic race fix); EACCES once the child has exec'd. */
    setpgid(c->pid, c->pid);
    if (c->out.open)
        read_start_one(&c->out);
    if (c->err.open)
        read_start_one(&c->err);
    return 0;
}

/* ------------------------------------------------------------------ environment */

static const char *const managed_vars[] = {
    "RANK",
    "LOCAL_RANK",
    "GROUP_RANK",
    "ROLE_RANK",
    "ROLE_NAME",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "ROLE_WORLD_SIZE",
    "GROUP_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_USE_AGENT_STORE",
    NULL,
};

static bool is_managed(const char *entry)
{
    for (const char *const *v = managed_vars; *v; v++) {
        size_t n = strlen(*v);
        if (strncmp(entry, *v, n) == 0 && entry[n] == '=')
            return true;
    }
    return false;
}

extern char **environ;

static void build_base_env(struct launcher *l)
{
    size_t n = 0;
    while (environ[n])
        n++;
    l->base_env = xmalloc((n + 1) * sizeof *l->base_env);
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (!is_managed(environ[i]))
            l->base_env[k++] = environ[i];
    l->base_env[k] = NULL;
    l->base_env_len = k;
}

#define RANK_VARS 17

/* The environment of one rank; the strings after the base entries are owned by it. */
static char **rank_env(struct launcher *l, int rank)
{
    char **env = xmalloc((l->base_env_len + RANK_VARS + 1) * sizeof *env);
    memcpy(env, l->base_env, l->base_env_len * sizeof *env);
    char **e = env + l->base_env_len;
    int n = l->opt.nprocs;
    *e++ = xasprintf("RANK=%d", rank);
    *e++ = xasprintf("LOCAL_RANK=%d", rank);
    *e++ = xasprintf("GROUP_RANK=0");
    *e++ = xasprintf("ROLE_RANK=%d", rank);
    *e++ = xasprintf("ROLE_NAME=default");
    *e++ = xasprintf("WORLD_SIZE=%d", n);
    *e++ = xasprintf("LOCAL_WORLD_SIZE=%d", n);
    *e++ = xasprintf("ROLE_WORLD_SIZE=%d", n);
    *e++ = xasprintf("GROUP_WORLD_SIZE=1");
    *e++ = xasprintf("MASTER_ADDR=%s", l->opt.master_addr);
    *e++ = xasprintf("MASTER_PORT=%s", l->port_text);
    *e++ = xasprintf("TORCHELASTIC_RUN_ID=%s", l->run_id);
    *e++ = xasprintf("TORCHELASTIC_RESTART_COUNT=0");
    *e++ = xasprintf("TORCHELASTIC_MAX_RESTARTS=0");
    *e++ = xasprintf("TORCHELASTIC_USE_AGENT_STORE=%s", l->opt.external_store ? "True" : "False");
    /* As torchrun: N ranks each spawning one thread per core would oversubscribe the host. */
    if (n > 1 && !getenv("OMP_NUM_THREADS"))
        *e++ = xasprintf("OMP_NUM_THREADS=1");
    *e = NULL;
    return env;
}

static void free_rank_env(struct launcher *l, char **env)
{
    for (char **e = env + l->base_env_len; *e; e++)
        free(*e);
    free(env);
}

/* ------------------------------------------------------------------ ranks, store */

static void start_ranks(struct launcher *l)
{
    l->phase = PHASE_RUN;
    if (l->opt.timeout_s > 0 && !uv_is_active((uv_handle_t *)&l->deadline_timer))
        uv_timer_start(&l->deadline_timer, on_deadline, (uint64_t)(l->opt.timeout_s * 1000), 0);
    char *argv[l->opt.argc + 1];
    argv[0] = l->program_path;
    for (int i = 1; i < l->opt.argc; i++)
        argv[i] = l->opt.argv[i];
    argv[l->opt.argc] = NULL;
    for (int r = 0; r < l->opt.nprocs; r++) {
        struct child *c = &l->ranks[r];
        c->rank = r;
        snprintf(c->name, sizeof c->name, "rank %d", r);
        snprintf(c->prefix, sizeof c->prefix, "[rank%d]: ", r);
        char **env = rank_env(l, r);
        int rc = spawn_child(l, c, argv, env, on_rank_exit);
        free_rank_env(l, env);
        if (rc != 0) {
            say(l, "cannot start rank %d (%s): %s", r, l->program_path, uv_strerror(rc));
            set_code(l, EXIT_LAUNCHER);
            begin_stop(l, SIGTERM);
            return;
        }
        l->started = r + 1;
        l->live_ranks++;
        VERBOSE(l, "rank %d: pid %d", r, (int)c->pid);
    }
}

static void probe_store(struct launcher *l);

static void on_probe_retry(uv_timer_t *t)
{
    probe_store(t->data);
}

static void on_probe_closed(uv_handle_t *h)
{
    struct launcher *l = h->data;
    l->probe_open = false;
    int status = (int)(intptr_t)l->probe_req.data;
    if (l->phase != PHASE_STORE_WAIT || l->stopping) {
        maybe_finish(l);
        return;
    }
    if (status == 0) {
        uv_timer_stop(&l->store_deadline_timer);
        VERBOSE(l, "the store (pid %d) accepts connections on %s:%s", (int)l->store.pid,
                l->opt.master_addr, l->port_text);
        start_ranks(l);
    } else {
        uv_timer_start(&l->probe_timer, on_probe_retry, PROBE_MS, 0);
    }
}

static void on_probe_connect(uv_connect_t *req, int status)
{
    struct launcher *l = req->data;
    req->data = (void *)(intptr_t)status;
    /* At the end of the job the probe may already be closing (UV_ECANCELED). */
    if (!uv_is_closing((uv_handle_t *)&l->probe))
        uv_close((uv_handle_t *)&l->probe, on_probe_closed);
}

static void probe_store(struct launcher *l)
{
    if (l->phase != PHASE_STORE_WAIT || l->stopping || l->probe_open)
        return;
    uv_tcp_init(&l->loop, &l->probe);
    l->probe.data = l;
    l->probe_open = true;
    l->probe_req.data = l;
    int rc = uv_tcp_connect(&l->probe_req, &l->probe, (struct sockaddr *)&l->master_sa,
                            on_probe_connect);
    if (rc != 0) {
        l->probe_req.data = (void *)(intptr_t)rc;
        uv_close((uv_handle_t *)&l->probe, on_probe_closed);
    }
}

static void on_store_deadline(uv_timer_t *t)
{
    struct launcher *l = t->data;
    if (l->phase != PHASE_STORE_WAIT)
        return;
    say(l,
        "the store %s (pid %d) did not accept connections on %s:%s within %g s "
        "(--store-timeout)",
        l->store_path, (int)l->store.pid, l->opt.master_addr, l->port_text, l->opt.store_timeout_s);
    set_code(l, EXIT_LAUNCHER);
    begin_stop(l, SIGTERM);
}

static void start_store(struct launcher *l)
{
    struct child *c = &l->store;
    c->rank = -1;
    snprintf(c->name, sizeof c->name, "store");
    snprintf(c->prefix, sizeof c->prefix, "[store]: ");
    char *argv[] = {l->store_path, "serve",      "--host", (char *)l->opt.master_addr,
                    "--port",      l->port_text, NULL};
    l->have_store = true;
    int rc = spawn_child(l, c, argv, environ, on_store_exit);
    if (rc != 0) {
        say(l, "cannot start the store %s: %s", l->store_path, uv_strerror(rc));
        set_code(l, EXIT_LAUNCHER);
        l->stopping = true;
        return;
    }
    VERBOSE(l, "store: %s serve --host %s --port %s (pid %d)", l->store_path, l->opt.master_addr,
            l->port_text, (int)c->pid);
    uv_timer_start(&l->store_deadline_timer, on_store_deadline,
                   (uint64_t)(l->opt.store_timeout_s * 1000), 0);
    if (l->opt.timeout_s > 0)
        uv_timer_start(&l->deadline_timer, on_deadline, (uint64_t)(l->opt.timeout_s * 1000), 0);
    probe_store(l);
}

/* ------------------------------------------------------------------ the end */

static bool any_stream_open(struct launcher *l)
{
    for (int i = 0; i < l->started; i++)
        if (l->ranks[i].out.open || l->ranks[i].err.open)
            return true;
    return l->have_store && (l->store.out.open || l->store.err.open);
}

static void close_handle(uv_handle_t *h, void *arg)
{
    (void)arg;
    if (!uv_is_closing(h))
        uv_close(h, NULL);
}

static void on_drain_expired(uv_timer_t *t)
{
    struct launcher *l = t->data;
    pthread_mutex_lock(&l->w.mu);
    bool paused = l->w.paused;
    pthread_mutex_unlock(&l->w.mu);
    /* Unread output is still in the pipes while our own stdout is slow: give it time, bounded. */
    if (paused && l->drain_rearms++ < FLUSH_MS / DRAIN_MS) {
        uv_timer_start(&l->drain_timer, on_drain_expired, DRAIN_MS, 0);
        return;
    }
    /* A pipe still open after its child exited is held by something the child left behind. */
    for (int i = 0; i < l->started; i++) {
        struct child *c = &l->ranks[i];
        if (c->out.open || c->err.open) {
            VERBOSE(l, "rank %d left processes holding its output; killing its process group",
                    c->rank);
            killpg(c->pid, SIGKILL);
        }
    }
    if (l->have_store && (l->store.out.open || l->store.err.open))
        killpg(l->store.pid, SIGKILL);
    for_each_stream(l, close_stream);
}

static void maybe_finish(struct launcher *l)
{
    if (l->phase == PHASE_DONE)
        return;
    if (l->phase == PHASE_STORE_WAIT && !l->stopping)
        return;
    if (l->live_ranks > 0)
        return;
    if (l->have_store && child_live(&l->store)) {
        stop_store(l);
        return;
    }
    if (any_stream_open(l)) {
        if (!l->drain_started) {
            l->drain_started = true;
            uv_timer_start(&l->drain_timer, on_drain_expired, DRAIN_MS, 0);
        }
        return;
    }
    l->phase = PHASE_DONE;
    pthread_mutex_lock(&l->w.mu);
    l->w.async_closed = true;
    pthread_mutex_unlock(&l->w.mu);
    uv_walk(&l->loop, close_handle, NULL);
}

/* ------------------------------------------------------------------ setup */

/* PATH lookup as execvp would do it, but up front, so a typo fails before anything starts. */
static char *find_in_path(const char *name)
{
    if (strchr(name, '/'))
        return access(name, X_OK) == 0 ? xstrdup(name) : NULL;
    const char *path = getenv("PATH");
    if (!path || !*path)
        path = "/usr/local/bin:/usr/bin:/bin";
    while (*path) {
        const char *colon = strchr(path, ':');
        size_t n = colon ? (size_t)(colon - path) : strlen(path);
        char *cand = n ? xasprintf("%.*s/%s", (int)n, path, name) : xasprintf("./%s", name);
        struct stat st;
        if (stat(cand, &st) == 0 && S_ISREG(st.st_mode) && access(cand, X_OK) == 0)
            return cand;
        free(cand);
        path += n;
        if (*path == ':')
            path++;
    }
    return NULL;
}

static char *find_store(struct launcher *l, char *looked, size_t looked_len)
{
    if (l->opt.store_bin)
        return find_in_path(l->opt.store_bin);
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) {
        self[n] = '\0';
        char *slash = strrchr(self, '/');
        if (slash)
            *slash = '\0';
        /* Installed next to us; or in a build tree: tools/c10drun/ and store_server/. */
        static const char *const rel[] = {"c10d-store", "../store_server/c10d-store",
                                          "../../store_server/c10d-store"};
        looked[0] = '\0';
        for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) {
            char *cand = xasprintf("%s/%s", self, rel[i]);
            size_t used = strlen(looked);
            snprintf(looked + used, looked_len - used, "%s, ", cand);
            struct stat st;
            if (stat(cand, &st) == 0 && S_ISREG(st.st_mode) && access(cand, X_OK) == 0)
                return cand;
            free(cand);
        }
    }
    return find_in_path("c10d-store");
}

/* Resolves host:port for the readiness probe; with port 0, binds port 0 and keeps the number
 * the kernel chose (torchrun's way of picking a free port). */
static int resolve_master(struct launcher *l, const char *host, int port)
{
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    int rc = getaddrinfo(host, service, &hints, &res);
    if (rc != 0) {
        fprintf(stderr, "c10drun: cannot resolve --master-addr %s: %s\n", host, gai_strerror(rc));
        return -1;
    }
    int chosen = port;
    int err = 0;
    struct addrinfo *ai;
    for (ai = res; ai; ai = ai->ai_next) {
        if (port != 0)
            break;
        int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            err = errno;
            continue;
        }
        struct sockaddr_storage ss;
        socklen_t len = sizeof ss;
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
            getsockname(fd, (struct sockaddr *)&ss, &len) == 0) {
            chosen = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                    : ((struct sockaddr_in *)&ss)->sin_port);
            close(fd);
            break;
        }
        err = errno;
        close(fd);
    }
    if (!ai) {
        fprintf(stderr, "c10drun: cannot pick a free port on %s: %s\n", host, strerror(err));
        freeaddrinfo(res);
        return -1;
    }
    memcpy(&l->master_sa, ai->ai_addr, ai->ai_addrlen);
    if (ai->ai_family == AF_INET6)
        ((struct sockaddr_in6 *)&l->master_sa)->sin6_port = htons((uint16_t)chosen);
    else
        ((struct sockaddr_in *)&l->master_sa)->sin_port = htons((uint16_t)chosen);
    freeaddrinfo(res);
    snprintf(l->port_text, sizeof l->port_text, "%d", chosen);
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: c10drun -n N [options] PROGRAM [ARGS...]\n"
            "\n"
            "Starts N local ranks of PROGRAM with torchrun's environment (RANK, LOCAL_RANK,\n"
            "WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...), prefixes their output with the rank,\n"
            "forwards SIGINT/SIGTERM/SIGHUP/SIGQUIT, and stops every rank when one fails.\n"
            "\n"
            "options:\n"
            "  -n, --nproc-per-node N   number of ranks (1..%d)\n"
            "  --store embedded|external\n"
            "                           embedded (default): rank 0 hosts the store;\n"
            "                           external: start `c10d-store serve` and make every rank a\n"
            "                           client (TORCHELASTIC_USE_AGENT_STORE=True)\n"
            "  --store-bin PATH         the c10d-store executable (default: next to c10drun,\n"
            "                           then ../store_server/, then PATH)\n"
            "  --store-timeout S        how long the external store may take to accept\n"
            "                           connections (default 30)\n"
            "  --master-addr A          MASTER_ADDR (default 127.0.0.1)\n"
            "  --master-port P          MASTER_PORT (default: a free port)\n"
            "  --grace-ms MS            after SIGTERM, wait this long before SIGKILL (default "
            "5000)\n"
            "  --timeout S              stop everything after S seconds, exit 124\n"
            "  --run-id ID              TORCHELASTIC_RUN_ID (default: c10drun-<pid>-<time>)\n"
            "  --no-prefix              ranks write straight to our stdout/stderr\n"
            "  --bind-to core|none      core: pin rank r (all its threads) to the r-th CPU\n"
            "                           c10drun may use, as mpirun does for 2 ranks; needs\n"
            "                           N <= CPUs (default none, as torchrun)\n"
            "  -v, --verbose            say what c10drun does\n"
            "  -h, --help               this text\n"
            "  --version                print the version\n"
            "\n"
            "exit status: 0 when every rank exits 0; else the first failing rank's status,\n"
            "128+N if it was killed by signal N or if c10drun received signal N, 124 on\n"
            "--timeout, 1 when c10drun itself failed, 2 on a usage error, 127 when PROGRAM\n"
            "is not found.\n",
            MAX_NPROCS);
}

static bool parse_double(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= 0) || v > 1e9)
        return false;
    *out = v;
    return true;
}

static bool parse_long(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

/* An option with two values: `off` gives false, `on` true; else a usage message. */
static bool parse_pair(const char *opt, const char *s, const char *off, const char *on, bool *out)
{
    if (strcmp(s, off) == 0 || strcmp(s, on) == 0) {
        *out = strcmp(s, on) == 0;
        return true;
    }
    fprintf(stderr, "c10drun: %s wants %s or %s, got '%s'\n", opt, off, on, s);
    return false;
}

enum {
    OPT_STORE = 256,
    OPT_STORE_BIN,
    OPT_STORE_TIMEOUT,
    OPT_MASTER_ADDR,
    OPT_MASTER_PORT,
    OPT_GRACE,
    OPT_TIMEOUT,
    OPT_RUN_ID,
    OPT_NO_PREFIX,
    OPT_BIND_TO,
    OPT_VERSION,
};

static int parse_args(struct options *o, int argc, char **argv)
{
    static const struct option longs[] = {
        {"nproc-per-node", required_argument, NULL, 'n'},
        {"nproc_per_node", required_argument, NULL, 'n'},
        {"store", required_argument, NULL, OPT_STORE},
        {"store-bin", required_argument, NULL, OPT_STORE_BIN},
        {"store-timeout", required_argument, NULL, OPT_STORE_TIMEOUT},
        {"master-addr", required_argument, NULL, OPT_MASTER_ADDR},
        {"master_addr", required_argument, NULL, OPT_MASTER_ADDR},
        {"master-port", required_argument, NULL, OPT_MASTER_PORT},
        {"master_port", required_argument, NULL, OPT_MASTER_PORT},
        {"grace-ms", required_argument, NULL, OPT_GRACE},
        {"timeout", required_argument, NULL, OPT_TIMEOUT},
        {"run-id", required_argument, NULL, OPT_RUN_ID},
        {"no-prefix", no_argument, NULL, OPT_NO_PREFIX},
        {"bind-to", required_argument, NULL, OPT_BIND_TO},
        {"verbose", no_argument, NULL, 'v'},
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, OPT_VERSION},
        {NULL, 0, NULL, 0},
    };
    o->nprocs = 0;
    o->master_addr = "127.0.0.1";
    o->grace_ms = 5000;
    o->store_timeout_s = 30;
    o->prefix = true;
    long v;
    int ch;
    /* '+': options end at PROGRAM, so PROGRAM's own options are left alone. */
    while ((ch = getopt_long(argc, argv, "+n:vh", longs, NULL)) != -1) {
        switch (ch) {
        case 'n':
            if (!parse_long(optarg, 1, MAX_NPROCS, &v)) {
                fprintf(stderr, "c10drun: -n wants a number of ranks in 1..%d, got '%s'\n",
                        MAX_NPROCS, optarg);
                return EXIT_USAGE;
            }
            o->nprocs = (int)v;
            break;
        case OPT_STORE:
            if (!parse_pair("--store", optarg, "embedded", "external", &o->external_store))
                return EXIT_USAGE;
            break;
        case OPT_STORE_BIN:
            o->store_bin = optarg;
            break;
        case OPT_STORE_TIMEOUT:
            if (!parse_double(optarg, &o->store_timeout_s) || o->store_timeout_s <= 0) {
                fprintf(stderr, "c10drun: --store-timeout wants seconds > 0, got '%s'\n", optarg);
                return EXIT_USAGE;
            }
            break;
        case OPT_MASTER_ADDR:
            o->master_addr = optarg;
            break;
        case OPT_MASTER_PORT:
            if (!parse_long(optarg, 1, 65535, &v)) {
                fprintf(stderr, "c10drun: --master-port wants 1..65535, got '%s'\n", optarg);
                return EXIT_USAGE;
            }
            o->master_port = (int)v;
            break;
        case OPT_GRACE:
            if (!parse_long(optarg, 0, 86400000L, &v)) {
                fprintf(stderr, "c10drun: --grace-ms wants milliseconds >= 0, got '%s'\n", optarg);
                return EXIT_USAGE;
            }
            o->grace_ms = (uint64_t)v;
            break;
        case OPT_TIMEOUT:
            if (!parse_double(optarg, &o->timeout_s) || o->timeout_s <= 0) {
                fprintf(stderr, "c10drun: --timeout wants seconds > 0, got '%s'\n", optarg);
                return EXIT_USAGE;
            }
            break;
        case OPT_RUN_ID:
            o->run_id = optarg;
            break;
        case OPT_NO_PREFIX:
            o->prefix = false;
            break;
        case OPT_BIND_TO:
            if (!parse_pair("--bind-to", optarg, "none", "core", &o->bind_core))
                return EXIT_USAGE;
            break;
        case 'v':
            o->verbose = true;
            break;
        case 'h':
            usage(stdout);
            exit(0);
        case OPT_VERSION:
            printf("c10drun %s\n", C10DRUN_VERSION);
            exit(0);
        default:
            usage(stderr);
            return EXIT_USAGE;
        }
    }
    if (optind >= argc) {
        fprintf(stderr, "c10drun: no PROGRAM given\n");
        usage(stderr);
        return EXIT_USAGE;
    }
    if (o->nprocs == 0) {
        fprintf(stderr, "c10drun: -n N is required\n");
        return EXIT_USAGE;
    }
    o->argc = argc - optind;
    o->argv = argv + optind;
    return 0;
}

/* --bind-to core: rank r gets the r-th CPU of our own affinity mask, so c10drun
 * under taskset or in a cpuset binds within it. More ranks than CPUs is refused:
 * two ranks pinned to one CPU is worse than letting the scheduler place them. */
static int pick_cpus(struct launcher *l)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0) {
        fprintf(stderr, "c10drun: --bind-to core: sched_getaffinity: %s\n", strerror(errno));
        return EXIT_LAUNCHER;
    }
    int have = CPU_COUNT(&set);
    if (l->opt.nprocs > have) {
        fprintf(stderr,
                "c10drun: --bind-to core: %d ranks but only %d CPUs available; use --bind-to "
                "none\n",
                l->opt.nprocs, have);
        return EXIT_USAGE;
    }
    l->cpus = xmalloc((size_t)l->opt.nprocs * sizeof *l->cpus);
    for (int cpu = 0, r = 0; cpu < CPU_SETSIZE && r < l->opt.nprocs; cpu++)
        if (CPU_ISSET(cpu, &set))
            l->cpus[r++] = cpu;
    return 0;
}

/* The hidden exec mode: runs in the child between fork and the program. */
static int exec_child(int argc, char **argv)
{
    if (argc < 5)
        return EXIT_USAGE;
    setpgid(0, 0);
    /* The kernel's guarantee that a rank does not outlive a c10drun killed with SIGKILL. */
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    char *end;
    long parent = strtol(argv[2], &end, 10);
    if (getppid() != (pid_t)parent)
        return 128 + SIGTERM; /* c10drun died before the line above took effect */
    long cpu = *end == ',' ? strtol(end + 1, NULL, 10) : -1;
    if (cpu >= 0 && cpu < CPU_SETSIZE) {
        /* Before exec, so every thread the program starts inherits it. */
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET((int)cpu, &set);
        if (sched_setaffinity(0, sizeof set, &set) != 0) {
            fprintf(stderr, "c10drun: --bind-to core: cannot bind to CPU %ld: %s\n", cpu,
                    strerror(errno));
            return EXIT_LAUNCHER;
        }
    }
    execv(argv[3], argv + 4);
    int err = errno;
    fprintf(stderr, "c10drun: cannot execute %s: %s\n", argv[3], strerror(err));
    return err == ENOENT ? EXIT_NOTFOUND : EXIT_NOEXEC;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], EXEC_MARK) == 0)
        return exec_child(argc, argv);

    static struct launcher L;
    struct launcher *l = &L;
    int rc = parse_args(&l->opt, argc, argv);
    if (rc != 0)
        return rc;

    if (l->opt.bind_core) {
        rc = pick_cpus(l);
        if (rc != 0)
            return rc;
    }
    l->program_path = find_in_path(l->opt.argv[0]);
    if (!l->program_path) {
        fprintf(stderr, "c10drun: %s: %s\n", l->opt.argv[0],
                strchr(l->opt.argv[0], '/') ? strerror(errno) : "command not found");
        return EXIT_NOTFOUND;
    }
    if (l->opt.external_store) {
        char looked[3 * PATH_MAX + 16];
        l->store_path = find_store(l, looked, sizeof looked);
        if (!l->store_path) {
            if (l->opt.store_bin)
                fprintf(stderr, "c10drun: --store-bin %s: not an executable\n", l->opt.store_bin);
            else
                fprintf(stderr,
                        "c10drun: --store external: cannot find c10d-store (looked in %sand "
                        "PATH); build the store_server target or pass --store-bin\n",
                        looked);
            free(l->program_path);
            return EXIT_LAUNCHER;
        }
    }
    if (resolve_master(l, l->opt.master_addr, l->opt.master_port) != 0) {
        free(l->program_path);
        free(l->store_path);
        return EXIT_USAGE;
    }
    if (l->opt.run_id)
        snprintf(l->run_id, sizeof l->run_id, "%s", l->opt.run_id);
    else
        snprintf(l->run_id, sizeof l->run_id, "c10drun-%d-%lld", (int)getpid(),
                 (long long)time(NULL));

    /* A reader of our output that goes away must not kill us before we stop the ranks. */
    signal(SIGPIPE, SIG_IGN);
    build_base_env(l);
    l->ranks = calloc((size_t)l->opt.nprocs, sizeof *l->ranks);
    if (!l->ranks || uv_loop_init(&l->loop) != 0 || writer_start(l) != 0) {
        fprintf(stderr, "c10drun: cannot initialise\n");
        return EXIT_LAUNCHER;
    }
    uv_timer_t *timers[] = {&l->grace_timer, &l->store_kill_timer, &l->deadline_timer,
                            &l->drain_timer, &l->probe_timer,      &l->store_deadline_timer};
    for (size_t i = 0; i < sizeof timers / sizeof timers[0]; i++) {
        uv_timer_init(&l->loop, timers[i]);
        timers[i]->data = l;
    }
    uv_async_init(&l->loop, &l->resume_async, on_resume);
    l->resume_async.data = l;
    for (int i = 0; i < 4; i++) {
        uv_signal_init(&l->loop, &l->sigs[i]);
        l->sigs[i].data = l;
        uv_signal_start(&l->sigs[i], on_signal, forwarded_signals[i]);
    }
    VERBOSE(l, "%d rank(s) of %s, MASTER_ADDR=%s MASTER_PORT=%s, %s store, run id %s",
            l->opt.nprocs, l->program_path, l->opt.master_addr, l->port_text,
            l->opt.external_store ? "external" : "embedded", l->run_id);

    if (l->opt.external_store) {
        l->phase = PHASE_STORE_WAIT;
        start_store(l);
    } else {
        start_ranks(l);
    }
    maybe_finish(l);
    uv_run(&l->loop, UV_RUN_DEFAULT);

    int code = l->have_code ? l->exit_code : 0;
    writer_finish(l, FLUSH_MS);
    if (uv_loop_close(&l->loop) != 0)
        fprintf(stderr, "c10drun: internal: handles left open at exit\n");
    free(l->ranks);
    free(l->base_env);
    free(l->program_path);
    free(l->cpus);
    free(l->store_path);
    return code;
}
