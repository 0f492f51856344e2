/* The store server: listening sockets, connections and their reads and
 * writes, limits (connections, memory, idle), stats and shutdown, on one libuv
 * loop. Over 800 lines because a connection's life (accept, the read path,
 * the direct-send write path, back-pressure, close) is one state machine that
 * reads best in one place; the protocol is in session.c, the data in
 * ../table/. */
#include "server.h"

#include "session.h"

#include "engine/fdlimit.h"
#include "engine/log.h"
#include "engine/token.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define TICK_MS 250
/* Connections accepted per wake-up of the listener: the loop stays fair to
 * the connections already open while thousands connect at once. */
#define ACCEPT_BATCH 128
/* Descriptors kept out of max_connections for everything else the process
 * opens (files, the library's own sockets), on top of those open at start. */
#define FD_MARGIN_MIN 32

struct conn {
    struct c10d__store_session s;
    uv_tcp_t tcp;
    int fd; /* tcp's socket, for flush()'s direct send */
    struct c10d__store_server *srv;
    struct conn *prev, *next;   /* every open connection */
    struct conn *vprev, *vnext; /* not yet started, in accept order */
    struct conn *rprev, *rnext; /* in the middle of a request, by last byte */
    struct conn *wprev, *wnext; /* with replies queued in uv_write */
    uint64_t accepted_ms;
    uint64_t last_byte_ms;                  /* in rlist: when the partial request last grew */
    size_t pending_write;                   /* bytes handed to uv_write, not yet written */
    size_t pending_shared;                  /* of them, shared replies' (held by reference) */
    struct wreq *shared_head, *shared_tail; /* those writes, in write order */
    size_t last_wq;                         /* libuv's write queue size at the last tick */
    uint64_t write_moved_ms;                /* when a queued byte last went to the kernel */
    int reading;
    int closing;
    int in_vlist;
    int in_rlist;
    int in_wlist;
};

struct wreq {
    uv_write_t req;
    struct conn *c;
    uint8_t *data;                 /* freed once written (NULL for a blob) */
    struct c10d__store_blob *blob; /* or a shared reply's reference */
    struct wreq *next_shared;      /* the connection's next blob write */
    size_t len;
    size_t charged; /* to the memory budget, released once written */
};

struct c10d__store_server {
    uv_loop_t *loop;
    /* We accept ourselves (not uv_listen) so that running out of descriptors
     * is seen, counted and logged: libuv sheds such connections silently. */
    int listen_fd;
    uv_poll_t *listener;
    int listen_paused; /* out of descriptors with no reserve: retried on the tick */
    int reserve_fd;    /* /dev/null, given up to accept-and-close at EMFILE */
    uint64_t nofile_soft;
    uint8_t token[C10D_TOKEN_MAX];
    char bound[INET6_ADDRSTRLEN + 16]; /* for the log: what we listen on */
    uv_timer_t timer;
    struct c10d__store_ctx ctx;
    struct c10d__store_limits lim;
    int world_size;
    int port;
    struct conn *conns;
    size_t nconns;
    struct conn *vhead, *vtail;
    struct conn *rhead, *rtail; /* partial requests, oldest last byte first */
    struct conn *whead;         /* connections with queued writes */
    size_t nwconns;
    uint64_t accepted, rejected, closed_for_errors, closed_slow;
    uint64_t closed_request_timeout, closed_over_share;
    uint64_t last_ops[C10D_STORE_CMD_COUNT];
    uint64_t start_ms, last_stats_ms;
    uint64_t last_reject_log_ms, rejects_unlogged;
    int stopping;
    int open_handles;
    void (*drain_cb)(void *arg, size_t left); /* c10d__store_server_drain */
    void *drain_arg;
    uint64_t drain_until;
    void (*stop_cb)(void *arg);
    void *stop_arg;
};

void c10d__store_limits_defaults(struct c10d__store_limits *l)
{
    if (!l->max_key_bytes)
        l->max_key_bytes = 64 * 1024;
    if (!l->max_value_bytes)
        l->max_value_bytes = 256ull << 20;
    if (!l->max_keys_per_request)
        l->max_keys_per_request = 128 * 1024;
    if (!l->max_request_bytes)
        l->max_request_bytes = 1ull << 30;
    if (!l->max_memory_bytes)
        l->max_memory_bytes = 4ull << 30;
    if (!l->max_connections)
        l->max_connections = 65536;
    if (!l->validate_timeout_ms)
        l->validate_timeout_ms = 30000;
    if (!l->max_pending_write_bytes)
        l->max_pending_write_bytes = 8ull << 20;
    if (!l->max_queued_reply_bytes)
        l->max_queued_reply_bytes = 256ull << 20;
    if (!l->slow_reader_timeout_ms)
        l->slow_reader_timeout_ms = 10000;
    if (!l->max_reply_bytes)
        l->max_reply_bytes = l->max_value_bytes > UINT64_MAX - (1ull << 20)
                                 ? UINT64_MAX
                                 : l->max_value_bytes + (1ull << 20);
    if (!l->request_timeout_ms)
        l->request_timeout_ms = 30000;
}

static struct conn *conn_of(struct c10d__store_session *s)
{
    return s->data;
}

/* ------------------------------------------------------------- closing */

static void handle_closed(struct c10d__store_server *srv)
{
    if (--srv->open_handles > 0 || !srv->stopping)
        return;
    c10d__store_ctx_free(&srv->ctx);
    void (*cb)(void *) = srv->stop_cb;
    void *arg = srv->stop_arg;
    free(srv);
    if (cb)
        cb(arg);
}

static void vlist_remove(struct c10d__store_server *srv, struct conn *c)
{
    if (!c->in_vlist)
        return;
    if (c->vprev)
        c->vprev->vnext = c->vnext;
    else
        srv->vhead = c->vnext;
    if (c->vnext)
        c->vnext->vprev = c->vprev;
    else
        srv->vtail = c->vprev;
    c->vprev = c->vnext = NULL;
    c->in_vlist = 0;
}

/* rlist: connections in the middle of a request, ordered by their last byte
 * (append on every read), so the tick only looks at its expired head. */
static void rlist_remove(struct c10d__store_server *srv, struct conn *c)
{
    if (!c->in_rlist)
        return;
    if (c->rprev)
        c->rprev->rnext = c->rnext;
    else
        srv->rhead = c->rnext;
    if (c->rnext)
        c->rnext->rprev = c->rprev;
    else
        srv->rtail = c->rprev;
    c->rprev = c->rnext = NULL;
    c->in_rlist = 0;
}

/* After the session ran: keep c in rlist while the client owes us bytes of a
 * request and we read from it. `got_bytes`: a read just arrived (restarts
 * the clock); a connection that (re)joins the list starts its clock now, so
 * time spent stalled by the server never counts against the client. */
static void track_request(struct conn *c, int got_bytes)
{
    struct c10d__store_server *srv = c->srv;
    if (c->closing || !c->reading || !c10d__store_session_mid_request(&c->s)) {
        rlist_remove(srv, c);
        return;
    }
    if (c->in_rlist && !got_bytes)
        return;
    rlist_remove(srv, c);
    c->last_byte_ms = uv_now(srv->loop);
    c->rprev = srv->rtail;
    if (srv->rtail)
        srv->rtail->rnext = c;
    else
        srv->rhead = c;
    srv->rtail = c;
    c->in_rlist = 1;
}

static void wlist_add(struct c10d__store_server *srv, struct conn *c)
{
    if (c->in_wlist)
        return;
    c->wprev = NULL;
    c->wnext = srv->whead;
    if (srv->whead)
        srv->whead->wprev = c;
    srv->whead = c;
    c->in_wlist = 1;
    srv->nwconns++;
}

static void wlist_remove(struct c10d__store_server *srv, struct conn *c)
{
    if (!c->in_wlist)
        return;
    if (c->wprev)
        c->wprev->wnext = c->wnext;
    else
        srv->whead = c->wnext;
    if (c->wnext)
        c->wnext->wprev = c->wprev;
    c->wprev = c->wnext = NULL;
    c->in_wlist = 0;
    srv->nwconns--;
}

static void resume_waiting(struct c10d__store_server *srv);

/* The drain is over once nobody is connected, or at its deadline. */
static void check_drain(struct c10d__store_server *srv)
{
    if (srv->drain_cb == NULL || srv->stopping ||
        (srv->nconns > 0 && uv_now(srv->loop) < srv->drain_until))
        return;
    void (*cb)(void *, size_t) = srv->drain_cb;
    srv->drain_cb = NULL;
    cb(srv->drain_arg, srv->nconns);
}

static void on_conn_closed(uv_handle_t *h)
{
    struct conn *c = h->data;
    struct c10d__store_server *srv = c->srv;
    /* Table clean-up happens here, never inside a table callback. */
    c10d__store_session_free(&c->s);
    free(c);
    resume_waiting(srv);
    check_drain(srv);
    handle_closed(srv);
}

/* Closes one connection; `reason` NULL means an orderly goodbye. */
static void conn_close(struct conn *c, const char *reason)
{
    if (c->closing)
        return;
    c->closing = 1;
    c->s.closing = 1;
    struct c10d__store_server *srv = c->srv;
    if (reason) {
        srv->closed_for_errors++;
        C10D_WARN("store", "closing connection from %s: %s", c->s.peer, reason);
    }
    vlist_remove(srv, c);
    rlist_remove(srv, c);
    wlist_remove(srv, c);
    if (c->prev)
        c->prev->next = c->next;
    else
        srv->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    srv->nconns--;
    uv_close((uv_handle_t *)&c->tcp, on_conn_closed);
}

/* -------------------------------------------------------------- writing */

static void on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf);
static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf);

/* After a session ran again: read more, or stop reading, or close it. */
static void after_run(struct c10d__store_session *s)
{
    struct conn *c = conn_of(s);
    if (c->closing)
        return;
    if (s->closing) {
        conn_close(c, s->reason);
        return;
    }
    if (s->stalled) {
        if (c->reading) {
            uv_read_stop((uv_stream_t *)&c->tcp);
            c->reading = 0;
        }
        return;
    }
    if (!c->reading && c->pending_write <= c->srv->lim.max_pending_write_bytes) {
        if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) == 0)
            c->reading = 1;
    }
    track_request(c, 0);
}

/* Writes drained somewhere: let the sessions waiting for the server-wide
 * reply cap run, oldest first. */
static void resume_waiting(struct c10d__store_server *srv)
{
    if (!srv->stopping)
        c10d__store_ctx_resume(&srv->ctx, after_run);
}

static void on_written(uv_write_t *req, int status)
{
    struct wreq *w = (struct wreq *)req;
    struct conn *c = w->c;
    struct c10d__store_server *srv = c->srv;
    c->pending_write -= w->len;
    if (w->blob) {
        /* Writes finish in order, so w is the first; cancelled ones at a
         * close need not be. */
        c->pending_shared -= w->len;
        struct wreq **pp = &c->shared_head, *prev = NULL;
        while (*pp != w) {
            prev = *pp;
            pp = &(*pp)->next_shared;
        }
        *pp = w->next_shared;
        if (c->shared_tail == w)
            c->shared_tail = prev;
    }
    c->write_moved_ms = uv_now(srv->loop);
    c->last_wq = uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp);
    c10d__store_session_set_pending(&c->s, c->pending_write - c->pending_shared);
    c10d__store_ctx_release_reply(&srv->ctx, w->charged);
    free(w->data);
    c10d__store_blob_unref(w->blob);
    free(w);
    if (c->pending_write == 0)
        wlist_remove(srv, c);
    if (!c->closing && status < 0)
        conn_close(c, NULL);
    /* Backpressure released: run the requests left buffered, then read again.
     * A session waiting for the server-wide cap keeps its place in the FIFO. */
    if (!c->closing && c->pending_write <= srv->lim.max_pending_write_bytes && !c->s.in_fifo) {
        if (c->s.stalled)
            c10d__store_session_received(&c->s, 0);
        after_run(&c->s);
    }
    resume_waiting(srv);
}

/* A client that lets this much pile up does not read: close it rather than
 * queue more. */
static int refuse_slow_reader(struct conn *c)
{
    struct c10d__store_server *srv = c->srv;
    if (c->pending_write < 4 * srv->lim.max_pending_write_bytes)
        return 0;
    srv->closed_slow++;
    char why[160];
    snprintf(why, sizeof why,
             "client does not read its replies (%zu bytes pending, limit %" PRIu64 ")",
             c->pending_write, 4 * srv->lim.max_pending_write_bytes);
    conn_close(c, why);
    return 1;
}

/* Sends what it can of data[0..len) at once, if nothing of ours is queued in
 * libuv (one send, without uv_try_write's bookkeeping; MSG_NOSIGNAL: a peer
 * that went away is an error here, never a SIGPIPE). Returns the bytes sent,
 * or -1 after closing the connection. */
static ssize_t send_now(struct conn *c, const uint8_t *data, size_t len)
{
    if (c->pending_write != 0)
        return 0;
    ssize_t n = send(c->fd, data, len, MSG_NOSIGNAL);
    if (n >= 0)
        return n;
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
        return 0;
    conn_close(c, NULL);
    return -1;
}

/* The kernel is full: queue the rest of a reply in libuv, either the
 * session's buffer itself (`owned`, freed once written, with its charge) or
 * a shared reply's bytes (`blob`, referenced until written). */
static int queue_write(struct conn *c, uint8_t *owned, size_t charged,
                       struct c10d__store_blob *blob, const uint8_t *from, size_t len)
{
    struct c10d__store_server *srv = c->srv;
    struct wreq *w = malloc(sizeof *w);
    if (!w) {
        c10d__store_ctx_release_reply(&srv->ctx, charged);
        free(owned);
        conn_close(c, "out of memory queueing a reply");
        return -1;
    }
    *w = (struct wreq){.c = c, .data = owned, .blob = blob, .len = len, .charged = charged};
    if (blob)
        c10d__store_blob_ref(blob);
    uv_buf_t b = uv_buf_init((char *)from, (unsigned)len);
    if (uv_write(&w->req, (uv_stream_t *)&c->tcp, &b, 1, on_written) < 0) {
        c10d__store_ctx_release_reply(&srv->ctx, charged);
        free(owned);
        c10d__store_blob_unref(blob);
        free(w);
        conn_close(c, NULL);
        return -1;
    }
    if (c->pending_write == 0)
        c->write_moved_ms = uv_now(srv->loop);
    c->pending_write += len;
    if (blob) {
        c->pending_shared += len;
        if (c->shared_tail)
            c->shared_tail->next_shared = w;
        else
            c->shared_head = w;
        c->shared_tail = w;
    }
    c->last_wq = uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp);
    wlist_add(srv, c);
    c10d__store_session_set_pending(&c->s, c->pending_write - c->pending_shared);
    if (c->reading && c->pending_write > srv->lim.max_pending_write_bytes) {
        uv_read_stop((uv_stream_t *)&c->tcp);
        c->reading = 0;
    }
    return 0;
}

static void flush(struct c10d__store_session *s)
{
    struct conn *c = conn_of(s);
    if (c->closing) {
        s->out.len = 0;
        return;
    }
    if (s->closing && !s->out.len) {
        /* A refused reply or watch event: close now, whether or not the
         * client sends anything again. */
        conn_close(c, s->reason[0] ? s->reason : NULL);
        return;
    }
    if (!s->out.len)
        return;
    if (refuse_slow_reader(c)) {
        s->out.len = 0;
        return;
    }
    ssize_t off = send_now(c, s->out.data, s->out.len);
    if (off < 0) {
        s->out.len = 0;
        return;
    }
    if ((size_t)off == s->out.len) {
        s->out.len = 0;
        if (s->out.cap > 64 * 1024)
            c10d__wire_buf_free(&s->out); /* the session releases its charge */
        if (s->closing)
            conn_close(c, s->reason[0] ? s->reason : NULL);
        return;
    }
    /* Hand the buffer itself to uv_write (no copy). */
    uint8_t *data = s->out.data;
    size_t len = s->out.len - (size_t)off;
    size_t charged = c10d__store_session_take_out_charge(s);
    s->out = (struct c10d__wire_buf){0};
    if (queue_write(c, data, charged, NULL, data + off, len) < 0)
        return;
    if (s->closing)
        conn_close(c, s->reason[0] ? s->reason : NULL);
}

/* A shared reply: sent from the one copy, whatever is left queued by
 * reference. */
static void send_blob(struct c10d__store_session *s, struct c10d__store_blob *b)
{
    struct conn *c = conn_of(s);
    if (c->closing || refuse_slow_reader(c))
        return;
    ssize_t off = send_now(c, b->data, b->len);
    if (off >= 0 && (size_t)off < b->len)
        queue_write(c, NULL, 0, b, b->data + off, b->len - (size_t)off);
}

/* -------------------------------------------------------------- reading */

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    struct conn *c = h->data;
    uint8_t *base;
    size_t len;
    c10d__store_session_rbuf(&c->s, suggested, &base, &len);
    if (len > UINT32_MAX)
        len = UINT32_MAX;
    *buf = uv_buf_init((char *)base, (unsigned)len);
}

static void on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf)
{
    (void)buf;
    struct conn *c = stream->data;
    if (c->closing)
        return;
    if (nread == 0)
        return;
    if (nread < 0) {
        if (nread == UV_ENOBUFS)
            conn_close(c, c->s.reason[0] ? c->s.reason : "no buffer for the request");
        else {
            if (nread == UV_EOF && !c10d__wire_parser_idle(&c->s.parser))
                C10D_DEBUG("store", "%s disconnected in the middle of a request", c->s.peer);
            conn_close(c, NULL);
        }
        return;
    }
    int rc = c10d__store_session_received(&c->s, (size_t)nread);
    if (c->closing)
        return;
    if (rc < 0) {
        conn_close(c, c->s.reason);
        return;
    }
    if (c->in_vlist && c10d__store_session_started(&c->s))
        vlist_remove(c->srv, c);
    if (c->s.stalled && c->reading) {
        uv_read_stop((uv_stream_t *)&c->tcp);
        c->reading = 0;
    }
    track_request(c, 1);
}

/* ------------------------------------------------------------ accepting */

static void peer_name(uv_tcp_t *tcp, char *out, size_t size)
{
    struct sockaddr_storage ss;
    int len = sizeof ss;
    snprintf(out, size, "?");
    if (uv_tcp_getpeername(tcp, (struct sockaddr *)&ss, &len) != 0)
        return;
    char host[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (ss.ss_family == AF_INET) {
        struct sockaddr_in *a = (struct sockaddr_in *)&ss;
        uv_ip4_name(a, host, sizeof host);
        port = ntohs(a->sin_port);
        snprintf(out, size, "%s:%d", host, port);
    } else if (ss.ss_family == AF_INET6) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
        uv_ip6_name(a, host, sizeof host);
        port = ntohs(a->sin6_port);
        /* Show v4-mapped peers of the dual-stack socket as plain IPv4. */
        if (!strncmp(host, "::ffff:", 7) && strchr(host + 7, '.'))
            snprintf(out, size, "%s:%d", host + 7, port);
        else
            snprintf(out, size, "[%s]:%d", host, port);
    }
}

/* Counts a connection turned away at once; logs at most once a second. */
static void refused(struct c10d__store_server *srv, int fd, const char *why)
{
    srv->rejected++;
    srv->rejects_unlogged++;
    uint64_t now = uv_now(srv->loop);
    if (now - srv->last_reject_log_ms >= 1000 || srv->last_reject_log_ms == 0) {
        char peer[64] = "?";
        struct sockaddr_storage ss;
        socklen_t len = sizeof ss;
        if (fd >= 0 && getpeername(fd, (struct sockaddr *)&ss, &len) == 0) {
            char host[INET6_ADDRSTRLEN] = "?";
            if (ss.ss_family == AF_INET) {
                struct sockaddr_in *a = (struct sockaddr_in *)&ss;
                uv_ip4_name(a, host, sizeof host);
                snprintf(peer, sizeof peer, "%s:%d", host, ntohs(a->sin_port));
            } else if (ss.ss_family == AF_INET6) {
                struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
                uv_ip6_name(a, host, sizeof host);
                if (!strncmp(host, "::ffff:", 7) && strchr(host + 7, '.'))
                    snprintf(peer, sizeof peer, "%s:%d", host + 7, ntohs(a->sin6_port));
                else
                    snprintf(peer, sizeof peer, "[%s]:%d", host, ntohs(a->sin6_port));
            }
        }
        C10D_WARN("store",
                  "closing connection from %s: %s (%" PRIu64 " refused since the last such line)",
                  peer, why, srv->rejects_unlogged);
        srv->last_reject_log_ms = now;
        srv->rejects_unlogged = 0;
    }
}

static int open_reserve(void)
{
    return open("/dev/null", O_RDONLY | O_CLOEXEC);
}

/* Out of descriptors: give up the reserve to accept the next connection and
 * close it, so that the client learns at once instead of hanging in the
 * backlog. Returns 1 if one was turned away, 0 if nothing was pending. */
static int shed_one(struct c10d__store_server *srv, int err)
{
    char why[160];
    snprintf(why, sizeof why,
             "%s: out of file descriptors (limit %" PRIu64 ", %zu connections open)",
             err == EMFILE ? "EMFILE" : "ENFILE", srv->nofile_soft, srv->nconns);
    if (srv->reserve_fd < 0)
        srv->reserve_fd = open_reserve();
    if (srv->reserve_fd < 0) {
        /* Nothing to give up: stop listening for a tick rather than spin. */
        if (!srv->listen_paused) {
            uv_poll_stop(srv->listener);
            srv->listen_paused = 1;
        }
        refused(srv, -1, why);
        return 0;
    }
    close(srv->reserve_fd);
    srv->reserve_fd = -1;
    int fd = accept4(srv->listen_fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd >= 0) {
        refused(srv, fd, why);
        close(fd);
    }
    srv->reserve_fd = open_reserve();
    return fd >= 0;
}

static void adopt(struct c10d__store_server *srv, int fd)
{
    if (srv->nconns >= srv->lim.max_connections) {
        char why[160];
        snprintf(why, sizeof why, "connection limit of %" PRIu64 " reached",
                 srv->lim.max_connections);
        refused(srv, fd, why);
        close(fd);
        return;
    }
    struct conn *c = calloc(1, sizeof *c);
    if (!c) {
        refused(srv, fd, "out of memory");
        close(fd);
        return;
    }
    c->srv = srv;
    uv_tcp_init(srv->loop, &c->tcp);
    c->tcp.data = c;
    srv->open_handles++;
    char peer[64];
    int rc = uv_tcp_open(&c->tcp, fd);
    c->fd = rc == 0 ? fd : -1;
    if (rc == 0)
        peer_name(&c->tcp, peer, sizeof peer);
    else {
        close(fd);
        snprintf(peer, sizeof peer, "?");
    }
    c10d__store_session_init(&c->s, &srv->ctx, peer);
    c->s.data = c;
    c->next = srv->conns;
    if (srv->conns)
        srv->conns->prev = c;
    srv->conns = c;
    srv->nconns++;
    if (rc < 0) {
        conn_close(c, NULL);
        return;
    }
    srv->accepted++;
    uv_tcp_nodelay(&c->tcp, 1);
    c->accepted_ms = uv_now(srv->loop);
    c->prev = NULL;
    c->vprev = srv->vtail;
    if (srv->vtail)
        srv->vtail->vnext = c;
    else
        srv->vhead = c;
    srv->vtail = c;
    c->in_vlist = 1;
    if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) < 0) {
        conn_close(c, NULL);
        return;
    }
    c->reading = 1;
}

static void on_listen_io(uv_poll_t *h, int status, int events)
{
    (void)events;
    struct c10d__store_server *srv = h->data;
    if (srv->stopping)
        return;
    if (status < 0) {
        C10D_WARN("store", "listening socket: %s", uv_strerror(status));
        return;
    }
    for (int i = 0; i < ACCEPT_BATCH && !srv->stopping && !srv->listen_paused; i++) {
        int fd = accept4(srv->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
            adopt(srv, fd);
            continue;
        }
        int err = errno;
        if (err == EINTR || err == ECONNABORTED)
            continue;
        if (err == EAGAIN || err == EWOULDBLOCK)
            return;
        if (err == EMFILE || err == ENFILE) {
            if (!shed_one(srv, err))
                return;
            continue;
        }
        C10D_WARN("store", "accept failed: %s", strerror(err));
        return;
    }
}

/* 1 if the connection's socket has room in its send buffer. */
static int socket_writable(struct conn *c)
{
    uv_os_fd_t fd;
    if (uv_fileno((uv_handle_t *)&c->tcp, &fd) != 0)
        return 0;
    struct pollfd p = {.fd = fd, .events = POLLOUT};
    return poll(&p, 1, 0) == 1 && (p.revents & POLLOUT) && !(p.revents & (POLLERR | POLLHUP));
}

/* The bytes a connection's queued replies hold for it alone: all but those
 * of the reply the MULTI_GET cache still holds (one copy, whoever reads it).
 * A shared reply the cache let go lives on only for its readers, so a
 * client that never reads one is charged for it like for a reply of its
 * own. */
static size_t own_pending(struct c10d__store_server *srv, struct conn *c)
{
    size_t own = c->pending_write;
    for (struct wreq *w = c->shared_head; w; w = w->next_shared)
        if (w->blob == srv->ctx.mget.reply)
            own -= w->len;
    return own;
}

/* Connections with queued replies that do not drain. Progress is any byte
 * the kernel took (libuv's write queue shrank), not only a finished write: a
 * reader draining one 256 MiB reply slowly keeps its connection.
 *  - Over its share: a connection holding more queued replies than
 *    max_queued_reply_bytes / (connections with queued replies) that has not
 *    moved for a quarter of slow_reader_timeout_ms is closed, whether or not
 *    anyone waits: its bytes are charged to --max-memory.
 *  - While the server-wide cap holds others back (sessions wait, or the queued
 *    total is at the cap), any connection that has not moved for
 *    slow_reader_timeout_ms is closed.
 * Readers that drain, however slowly, keep their connection, and so does one
 * whose socket has room when looked at: the bytes were late because this
 * server was (busy with a burst, stopped), not because the client did not
 * read. */
static void close_stuck_readers(struct c10d__store_server *srv, uint64_t now)
{
    if (!srv->whead)
        return;
    size_t cap = srv->ctx.queued_cap;
    int contended = srv->ctx.stall_head != NULL || (cap && srv->ctx.queued >= cap);
    size_t share = cap ? cap / (srv->nwconns ? srv->nwconns : 1) : 0;
    uint64_t t_all = srv->lim.slow_reader_timeout_ms;
    uint64_t t_share = t_all / 4 ? t_all / 4 : 1;
    for (struct conn *c = srv->whead, *next; c; c = next) {
        next = c->wnext;
        size_t wq = uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp);
        if (wq < c->last_wq)
            c->write_moved_ms = now;
        c->last_wq = wq;
        uint64_t still = now - c->write_moved_ms;
        if ((still >= t_share || still >= t_all) && socket_writable(c)) {
            /* The kernel would take bytes now: the client read them, and the
             * time went by in this server (a burst, a stop), not in it. */
            c->write_moved_ms = now;
            continue;
        }
        char why[256];
        size_t own = own_pending(srv, c);
        if (share && own > share && still >= t_share) {
            snprintf(why, sizeof why,
                     "client has not read its replies for %" PRIu64
                     " ms and holds %zu bytes of them, over its share of %zu",
                     still, own, share);
            srv->closed_slow++;
            srv->closed_over_share++;
            conn_close(c, why);
        } else if (contended && still >= t_all) {
            snprintf(why, sizeof why,
                     "client has not read its replies for %" PRIu64
                     " ms (%zu bytes pending) while the server-wide reply cap holds others back",
                     still, c->pending_write);
            srv->closed_slow++;
            conn_close(c, why);
        }
    }
}

/* A connection in the middle of a request that sent nothing for
 * request_timeout_ms is closed: an unfinished request holds its buffer, and
 * its announced size, forever otherwise. */
static void close_stalled_requests(struct c10d__store_server *srv, uint64_t now)
{
    uint64_t t = srv->lim.request_timeout_ms;
    struct conn *c = srv->rhead;
    while (c && now - c->last_byte_ms >= t) {
        struct conn *next = c->rnext;
        if (!c->reading || !c10d__store_session_mid_request(&c->s)) {
            rlist_remove(srv, c);
        } else {
            int cmd = c10d__store_session_partial_cmd(&c->s);
            char why[200];
            snprintf(why, sizeof why,
                     "no bytes for %" PRIu64 " ms in the middle of a%s%s request (%zu bytes of it "
                     "buffered)",
                     now - c->last_byte_ms, cmd >= 0 ? " " : "",
                     cmd >= 0 ? c10d__wire_cmd_name(cmd) : "", c->s.in_len);
            srv->closed_request_timeout++;
            conn_close(c, why);
        }
        c = next;
    }
}

/* Closes connections that started a first request but did not finish it in
 * time (and, if configured, connections that never said anything). */
static void on_tick(uv_timer_t *t)
{
    struct c10d__store_server *srv = t->data;
    /* Belt and braces: every drain already resumes waiting sessions. */
    resume_waiting(srv);
    if (srv->listen_paused && !srv->stopping) {
        srv->listen_paused = 0;
        uv_poll_start(srv->listener, UV_READABLE, on_listen_io);
    }
    check_drain(srv);
    if (srv->stopping)
        return;
    uint64_t now = uv_now(srv->loop);
    close_stuck_readers(srv, now);
    close_stalled_requests(srv, now);
    uint64_t vt = srv->lim.validate_timeout_ms, st = srv->lim.silent_timeout_ms;
    /* The idle second connection of 1.13 clients is why silence is allowed;
     * with a token those clients cannot connect at all, and a stranger's
     * idle connections must not hold descriptors. */
    if (srv->ctx.token_len && (!st || st > vt))
        st = vt;
    uint64_t min_t = st && st < vt ? st : vt;
    struct conn *c = srv->vhead;
    while (c && now - c->accepted_ms >= min_t) {
        struct conn *next = c->vnext;
        char why[128];
        if (c->s.bytes_in > 0 && now - c->accepted_ms >= vt) {
            snprintf(why, sizeof why,
                     "no complete first request (VALIDATE%s) within %" PRIu64 " ms",
                     srv->ctx.token_len ? " and AUTH" : "", vt);
            conn_close(c, why);
        } else if (c->s.bytes_in == 0 && st && now - c->accepted_ms >= st) {
            snprintf(why, sizeof why, "silent for %" PRIu64 " ms", st);
            conn_close(c, why);
        }
        c = next;
    }
}

/* ---------------------------------------------------------------- start */

static int somaxconn(void)
{
    int v = 0;
    FILE *f = fopen("/proc/sys/net/core/somaxconn", "r");
    if (f) {
        if (fscanf(f, "%d", &v) != 1)
            v = 0;
        fclose(f);
    }
    return v > 0 ? v : 4096;
}

static void free_handle(uv_handle_t *h)
{
    free(h);
}

static int try_listen(struct c10d__store_server *srv, const struct sockaddr *addr,
                      socklen_t addrlen)
{
    int fd = socket(addr->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return uv_translate_sys_error(errno);
    int on = 1, off = 0;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    /* [::] serves IPv4 too (dual stack); a named v6 address only itself. */
    if (addr->sa_family == AF_INET6)
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off);
    if (bind(fd, addr, addrlen) != 0 || listen(fd, somaxconn()) != 0) {
        int err = errno;
        close(fd);
        return uv_translate_sys_error(err);
    }
    uv_poll_t *p = malloc(sizeof *p);
    if (!p) {
        close(fd);
        return UV_ENOMEM;
    }
    int rc = uv_poll_init_socket(srv->loop, p, fd);
    if (rc == 0) {
        p->data = srv;
        rc = uv_poll_start(p, UV_READABLE, on_listen_io);
        if (rc < 0)
            uv_close((uv_handle_t *)p, free_handle);
    } else {
        free(p);
    }
    if (rc < 0) {
        close(fd);
        return rc;
    }
    srv->listen_fd = fd;
    srv->listener = p;
    return 0;
}

static void on_listener_closed(uv_handle_t *h)
{
    struct c10d__store_server *srv = h->data;
    free(h);
    close(srv->listen_fd);
    srv->listen_fd = -1;
    if (srv->reserve_fd >= 0)
        close(srv->reserve_fd);
    srv->reserve_fd = -1;
    handle_closed(srv);
}

static void on_timer_closed(uv_handle_t *h)
{
    handle_closed(h->data);
}

static int bind_any(struct c10d__store_server *srv, int port)
{
    snprintf(srv->bound, sizeof srv->bound, "every address");
    struct sockaddr_in6 a6;
    uv_ip6_addr("::", port, &a6);
    int rc = try_listen(srv, (struct sockaddr *)&a6, sizeof a6);
    if (rc == 0)
        return 0;
    C10D_INFO("store", "dual-stack listen on [::]:%d failed (%s); trying 0.0.0.0", port,
              uv_strerror(rc));
    struct sockaddr_in a4;
    uv_ip4_addr("0.0.0.0", port, &a4);
    rc = try_listen(srv, (struct sockaddr *)&a4, sizeof a4);
    if (rc < 0)
        return c10d__fail(c10d__status_from_uv(rc), "store server: cannot listen on port %d: %s",
                          port, uv_strerror(rc));
    return 0;
}

static int do_bind(struct c10d__store_server *srv, const char *host, int port, int any_if_not_local)
{
    int rc;
    char portstr[16];
    snprintf(portstr, sizeof portstr, "%d", port);
    if (!host || !*host || !strcmp(host, "*"))
        return bind_any(srv, port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    int gai = getaddrinfo(host, portstr, &hints, &res);
    if (gai != 0)
        return c10d__fail(C10D_EINVAL, "store server: cannot resolve '%s': %s", host,
                          gai_strerror(gai));
    rc = UV_EADDRNOTAVAIL;
    int all_not_local = 1;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        if ((rc = try_listen(srv, ai->ai_addr, ai->ai_addrlen)) == 0) {
            char name[INET6_ADDRSTRLEN] = "?";
            if (ai->ai_family == AF_INET6)
                uv_ip6_name((struct sockaddr_in6 *)ai->ai_addr, name, sizeof name);
            else
                uv_ip4_name((struct sockaddr_in *)ai->ai_addr, name, sizeof name);
            snprintf(srv->bound, sizeof srv->bound, ai->ai_family == AF_INET6 ? "[%s]" : "%s",
                     name);
            break;
        }
        all_not_local &= rc == UV_EADDRNOTAVAIL;
    }
    freeaddrinfo(res);
    if (rc < 0 && all_not_local && any_if_not_local) {
        C10D_WARN("store",
                  "'%s' is not an address of this machine (a NAT or virtual address?): "
                  "listening on every address instead; set C10D_STORE_BIND to choose one",
                  host);
        return bind_any(srv, port);
    }
    if (rc < 0)
        return c10d__fail(c10d__status_from_uv(rc), "store server: cannot listen on %s:%d: %s",
                          host, port, uv_strerror(rc));
    return 0;
}

/* Each connection costs a descriptor: past the process's limit accept fails
 * and nobody can connect, so keep max_connections within what is left. */
static void clamp_connections(struct c10d__store_server *srv)
{
    c10d__raise_nofile_limit(&srv->nofile_soft);
    if (srv->nofile_soft == UINT64_MAX)
        return;
    int64_t open_now = c10d__open_fd_count();
    uint64_t used = open_now > 0 ? (uint64_t)open_now : 16;
    /* + the listener and the reserve, and room for what the process opens later */
    uint64_t margin = FD_MARGIN_MIN + srv->nofile_soft / 16 + 2;
    uint64_t avail = srv->nofile_soft > used + margin ? srv->nofile_soft - used - margin : 1;
    if (srv->lim.max_connections > avail) {
        C10D_INFO("store",
                  "max connections lowered from %" PRIu64 " to %" PRIu64
                  " to fit the file descriptor limit of %" PRIu64 " (%" PRIu64 " open)",
                  srv->lim.max_connections, avail, srv->nofile_soft, used);
        srv->lim.max_connections = avail;
    }
}

static char *ctx_stats_json(struct c10d__store_ctx *ctx)
{
    return c10d__store_server_stats_json(ctx->data);
}

int c10d__store_server_start(uv_loop_t *loop, const struct c10d__store_server_opts *opts,
                             struct c10d__store_server **out)
{
    if (!loop || !opts || !out || opts->port < 0 || opts->port > 65535)
        return c10d__fail(C10D_EINVAL, "store server: bad arguments");
    struct c10d__store_server *srv = calloc(1, sizeof *srv);
    if (!srv)
        return c10d__fail(C10D_ENOMEM, "store server: out of memory");
    srv->loop = loop;
    srv->lim = opts->limits;
    c10d__store_limits_defaults(&srv->lim);
    srv->world_size = opts->world_size;
    struct c10d__wire_codec_limits cl = {
        .max_key_bytes = srv->lim.max_key_bytes,
        .max_value_bytes = srv->lim.max_value_bytes,
        .max_keys = srv->lim.max_keys_per_request,
        .max_request_bytes = srv->lim.max_request_bytes,
    };
    int rc = c10d__store_ctx_init(&srv->ctx, &cl, srv->lim.max_memory_bytes, flush);
    if (rc < 0) {
        free(srv);
        return rc;
    }
    srv->ctx.world_size = opts->world_size;
    srv->ctx.out_cap = srv->lim.max_pending_write_bytes;
    srv->ctx.queued_cap = srv->lim.max_queued_reply_bytes;
    srv->ctx.max_reply =
        srv->lim.max_reply_bytes > SIZE_MAX ? SIZE_MAX : (size_t)srv->lim.max_reply_bytes;
    srv->ctx.data = srv;
    srv->ctx.stats_json = ctx_stats_json;
    srv->ctx.send_blob = send_blob;
    if (opts->token_len > C10D_TOKEN_MAX || (opts->token_len && !opts->token)) {
        c10d__store_ctx_free(&srv->ctx);
        free(srv);
        return c10d__fail(C10D_EINVAL, "store server: a token of %zu bytes (at most %d)",
                          opts->token_len, C10D_TOKEN_MAX);
    }
    if (opts->token_len) {
        memcpy(srv->token, opts->token, opts->token_len);
        srv->ctx.token = srv->token;
        srv->ctx.token_len = opts->token_len;
    }
    srv->listen_fd = srv->reserve_fd = -1;
    clamp_connections(srv);
    rc = do_bind(srv, opts->host, opts->port, opts->any_if_not_local);
    if (rc < 0) {
        c10d__store_ctx_free(&srv->ctx);
        free(srv);
        return rc;
    }
    srv->reserve_fd = open_reserve();
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    getsockname(srv->listen_fd, (struct sockaddr *)&ss, &len);
    srv->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                               : ((struct sockaddr_in *)&ss)->sin_port);
    uv_timer_init(loop, &srv->timer);
    srv->timer.data = srv;
    uv_timer_start(&srv->timer, on_tick, TICK_MS, TICK_MS);
    uv_unref((uv_handle_t *)&srv->timer);
    srv->open_handles = 2;
    srv->start_ms = srv->last_stats_ms = uv_now(loop);
    char fdlim[32] = "unlimited";
    if (srv->nofile_soft != UINT64_MAX)
        snprintf(fdlim, sizeof fdlim, "%" PRIu64, srv->nofile_soft);
    C10D_INFO("store",
              "store server listening on %s port %d (max connections %" PRIu64
              ", file descriptor limit %s, memory limit %" PRIu64 " bytes, %s)",
              srv->bound, srv->port, srv->lim.max_connections, fdlim, srv->lim.max_memory_bytes,
              srv->ctx.token_len ? "clients must present the token" : "no token");
    *out = srv;
    return 0;
}

int c10d__store_server_port(const struct c10d__store_server *s)
{
    return s->port;
}

void c10d__store_server_stop(struct c10d__store_server *s, void (*cb)(void *arg), void *arg)
{
    if (s->stopping)
        return;
    s->stopping = 1;
    /* A drain under way ends here, answered: its caller may hold something
     * until it hears. */
    void (*drained)(void *, size_t) = s->drain_cb;
    void *drained_arg = s->drain_arg;
    size_t left = s->nconns;
    s->drain_cb = NULL;
    s->stop_cb = cb;
    s->stop_arg = arg;
    uv_close((uv_handle_t *)s->listener, on_listener_closed);
    uv_close((uv_handle_t *)&s->timer, on_timer_closed);
    while (s->conns)
        conn_close(s->conns, NULL);
    if (drained != NULL)
        drained(drained_arg, left);
}

int c10d__store_server_drain(struct c10d__store_server *s, uint64_t ms,
                             void (*cb)(void *arg, size_t left), void *arg)
{
    if (s->stopping)
        return -1;
    s->drain_cb = cb;
    s->drain_arg = arg;
    s->drain_until = uv_now(s->loop) + ms;
    uv_timer_start(&s->timer, on_tick, 0, TICK_MS); /* nobody connected: says so soon */
    return 0;
}

/* ---------------------------------------------------------------- stats */

char *c10d__store_server_stats_json(struct c10d__store_server *s)
{
    struct c10d__store_table_stats ts;
    c10d__store_table_get_stats(s->ctx.table, &ts);
    uint64_t now = uv_now(s->loop);
    double dt = (double)(now - s->last_stats_ms) / 1000.0;
    json_t *ops = json_object(), *rates = json_object();
    uint64_t total = 0, total_delta = 0;
    size_t waiting_conns = 0, pending_write = 0;
    for (struct conn *c = s->conns; c; c = c->next) {
        waiting_conns += c->s.client.wait != NULL;
        pending_write += c->pending_write;
    }
    for (int i = 0; i < C10D_STORE_CMD_COUNT; i++) {
        uint64_t n = s->ctx.ops[i], d = n - s->last_ops[i];
        total += n;
        total_delta += d;
        if (n)
            json_object_set_new(ops, c10d__wire_cmd_name(i), json_integer((json_int_t)n));
        if (d && dt > 0)
            json_object_set_new(rates, c10d__wire_cmd_name(i), json_real((double)d / dt));
        s->last_ops[i] = n;
    }
    s->last_stats_ms = now;
    json_t *o = json_pack(
        "{s:i, s:f, s:{s:I, s:I, s:I, s:I, s:I}, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, "
        "s:I, s:o, s:o, s:I, s:f}",
        "port", s->port, "uptime_s", (double)(now - s->start_ms) / 1000.0, "connections", "open",
        (json_int_t)s->nconns, "accepted", (json_int_t)s->accepted, "refused",
        (json_int_t)s->rejected, "closed_for_errors", (json_int_t)s->closed_for_errors,
        "closed_slow_readers", (json_int_t)s->closed_slow, "keys", (json_int_t)ts.keys, "queues",
        (json_int_t)ts.queues, "queue_items", (json_int_t)ts.queue_items, "bytes",
        (json_int_t)ts.value_bytes, "memory", (json_int_t)ts.memory, "memory_limit",
        (json_int_t)ts.memory_limit, "waiters", (json_int_t)ts.waiters, "watchers",
        (json_int_t)ts.watchers, "pending_write_bytes", (json_int_t)pending_write, "missing_gets",
        (json_int_t)s->ctx.missing_gets, "ops", ops, "ops_per_s", rates, "ops_total",
        (json_int_t)total, "ops_per_s_total", dt > 0 ? (double)total_delta / dt : 0.0);
    (void)waiting_conns;
    if (!o)
        return NULL;
    size_t partial = 0;
    for (struct conn *c = s->rhead; c; c = c->rnext)
        partial++;
    size_t fifo = 0;
    for (struct c10d__store_session *q = s->ctx.stall_head; q; q = q->fifo_next)
        fifo++;
    json_object_set_new(o, "auth_failures", json_integer((json_int_t)s->ctx.auth_failures));
    json_object_set_new(o, "queued_reply_bytes", json_integer((json_int_t)s->ctx.queued));
    json_object_set_new(o, "queued_reply_limit", json_integer((json_int_t)s->ctx.queued_cap));
    json_object_set_new(o, "waiting_for_reply_cap", json_integer((json_int_t)fifo));
    json_object_set_new(o, "reply_cap_stalls", json_integer((json_int_t)s->ctx.stalls));
    size_t request_bytes = 0;
    for (struct conn *c = s->conns; c; c = c->next)
        request_bytes += c->s.in_cap;
    json_object_set_new(o, "reply_bytes", json_integer((json_int_t)s->ctx.reply_charged));
    json_object_set_new(o, "reply_limit", json_integer((json_int_t)s->ctx.max_reply));
    json_object_set_new(o, "request_bytes", json_integer((json_int_t)request_bytes));
    json_object_set_new(o, "partial_requests", json_integer((json_int_t)partial));
    json_object_set_new(o, "closed_reply_cap", json_integer((json_int_t)s->ctx.closed_reply_cap));
    json_object_set_new(o, "closed_request_timeout",
                        json_integer((json_int_t)s->closed_request_timeout));
    json_object_set_new(o, "closed_over_share", json_integer((json_int_t)s->closed_over_share));
    json_object_set_new(o, "multi_get_cache",
                        json_pack("{s:I, s:I, s:I}", "hits", (json_int_t)s->ctx.mget_hits, "misses",
                                  (json_int_t)s->ctx.mget_misses, "shared_sends",
                                  (json_int_t)s->ctx.blob_sends));
    char *text = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return text;
}
