/* The tcp transport (docs/tcp_backend.md has the protocol).
 *
 * Frames are a 24-byte header, then the payload. Small collective messages go
 * eagerly; a large one waits for the receiver's clear-to-send (CTS), which the
 * receiver sends as soon as it posts the receive, so on the hot path nobody
 * waits for a round trip the other side could have started earlier. P2P
 * messages always ask first (RTS), which is what lets a receive from any source
 * choose its sender and a send complete only once its receiver has posted.
 *
 * Reading: while a payload is being received and enough of it is left, the
 * alloc callback hands libuv the destination itself, so bulk data goes from
 * the kernel straight into the user's buffer; headers, small payloads and
 * everything between land in a per-connection staging buffer first. */
#include "transport.h"

#include "backends/backend.h"
#include "engine/env.h"
#include "engine/error.h"
#include "engine/log.h"
#include "engine/loop.h"
#include "engine/token.h"

#include <arpa/inet.h>
#include <limits.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#define HDR_LEN        24
#define HELLO_FIXED    32
#define HELLO_MAX      (HELLO_FIXED + C10D_TOKEN_MAX)
#define HELLO_MAGIC    0x43313044u /* "C10D" */
#define HELLO_VERSION  2
#define HELLO_ACCEPTED 1u
/* An inbound connection that has not completed its hello by then is closed:
 * a stranger (or a half-open socket) costs one descriptor for this long at
 * most, and never more than PENDING_MAX of them at once. */
#define PENDING_HELLO_MS 10000
#define PENDING_MAX      64
#define PENDING_TICK_MS  1000
/* Connect attempts that keep failing this long are worth a warning naming
 * the address: a bad published address otherwise looks like a hang. */
#define CONNECT_WARN_MS  2000
#define CONNECT_WARN_GAP 10000
#define STRANGER_LOG_MS  1000
#define STAGING_LEN      (256 * 1024)
#define DIRECT_MIN       (16 * 1024)
#define ABORT_MSG_MAX    1000
#define CONNECT_RETRY_MS 10
/* How long a broken connection waits for more news before the transport
 * fails: when rank A dies, rank B may notice first and close its connection
 * to us; waiting a moment lets our own connection to A report too, so the
 * message names the rank that died, not only the one that gave up. */
#define LOST_GRACE_MS 100
#define IOV_PIECE     ((size_t)1 << 30)
#define MAX_IOV       17
/* Eager P2P bytes a sender may have unacknowledged per peer: what a receiver
 * may have to hold for sends it has not posted receives for. */
#define P2P_CREDIT ((size_t)1 << 20)

enum frame_type { F_EAGER = 1, F_RTS, F_CTS, F_DATA, F_ABORT, F_BYE, F_ACK };
enum { FLAG_P2P = 1 };
enum xlist_id { L_NONE, L_RECVS, L_P2P_RECVS, L_ANY_RECVS, L_SENDS };
enum { W_CTL, W_DATA };
enum conn_state { C_CONNECTING, C_HELLO, C_READY, C_CLOSED };

struct wire {
    uint8_t type, kind, flags, pad;
    uint32_t sub;
    uint64_t tag;
    uint64_t len;
};

struct xlist {
    struct c10d__tcp_xfer *head, *tail;
};

/* A message that arrived before its transfer was posted: eager data (kept),
 * an RTS or a CTS (just the header). */
struct unexp {
    struct unexp *next;
    struct wire w;
    uint64_t order;
    char *data;
    size_t cap;
    int complete;
    struct c10d__tcp_xfer *claimed;
};

struct conn;

struct peer {
    int rank;
    struct conn *conn;       /* ready connection */
    struct conn *connecting; /* our own attempt in progress (lazy/eager) */
    struct xlist recvs;      /* posted, matched: waiting for data */
    struct xlist p2p_recvs;  /* P2P receives not matched to an RTS yet */
    struct xlist sends;      /* waiting for CTS */
    struct unexp *unexp_head, *unexp_tail;
    struct c10d__tcp_xfer *out_head, *out_tail; /* writes waiting for the connection */
    uint32_t next_send_id;
    uint64_t retry_at;
    uint64_t connect_fail_since; /* first failed attempt of the current streak (0: none) */
    uint64_t connect_warned_at;
    char connect_error[96]; /* why the last attempt failed */
    int gone;               /* said goodbye (destroyed its group cleanly) */
    int lost;               /* its connection broke: the transport fails after the grace period */
    size_t eager_out;       /* P2P eager bytes sent, not yet acknowledged */
};

struct conn {
    uv_tcp_t tcp;
    uv_connect_t connect_req;
    uv_write_t hello_req;
    unsigned char hello_out[HELLO_MAX];
    unsigned char hello_in[HELLO_MAX];
    size_t hello_have;
    uint64_t accepted_ms;             /* inbound: when accepted (pending-hello deadline) */
    char peer[INET6_ADDRSTRLEN + 16]; /* inbound: who connected, for log lines */
    int parked;                       /* inbound hello complete, waiting for the job id */
    struct c10d__tcp_transport *t;
    struct conn *all_next, *all_prev;
    int rank; /* -1 until the handshake named it */
    int initiator;
    int bye; /* the peer said goodbye: its EOF is no failure by itself */
    enum conn_state state;
    /* reading */
    unsigned char hdr[HDR_LEN];
    size_t hdr_have;
    int in_body;
    struct wire body_w;
    char *dst; /* NULL: discard */
    size_t remaining;
    struct c10d__tcp_xfer *body_x;
    struct unexp *body_u;
    char abort_msg[ABORT_MSG_MAX + 1];
    char *staging;
};

struct retry {
    uv_timer_t timer;
    struct c10d__tcp_transport *t;
    int rank;
};

struct c10d__tcp_transport {
    struct c10d__tcp_transport_config cfg;
    uv_loop_t *loop;
    uv_tcp_t listener;
    uv_timer_t deadline;
    uv_timer_t grace;
    uv_timer_t pending; /* closes inbound connections stuck before their hello */
    int listening, deadline_open, grace_open, grace_armed, pending_open;
    /* The job's identity: rank 0 draws it, the others learn it from rank 0's
     * published address; hellos of any other job are dropped. */
    uint64_t job_id;
    int job_known;
    char published[INET6_ADDRSTRLEN + 40]; /* address, and the job id on rank 0 */
    uint8_t token[C10D_TOKEN_MAX];
    size_t token_len;
    uint64_t stranger_log_ms, strangers_unlogged;
    int first_lost; /* the first peer whose connection broke */
    int handles;    /* open uv handles; freed once 0 after free was asked */
    int freeing;
    int failed;
    char address[INET6_ADDRSTRLEN + 16];
    struct sockaddr_storage bind_addr;
    struct peer *peers;
    char **addrs;
    struct conn *conns; /* every connection, for closing */
    struct xlist any_recvs;
    struct c10d__tcp_xfer *pool, *all_xfers;
    struct unexp *unexp_pool;
    uint64_t next_order;
    void (*ready)(void *arg, int status);
    void *ready_arg;
    int nready;
    int ready_called;
};

static const char *kind_name(int kind)
{
    static const char *const names[] = {
        "BROADCAST",      "ALLREDUCE", "REDUCE",  "ALLGATHER", "GATHER", "SCATTER",
        "REDUCE_SCATTER", "ALLTOALL",  "BARRIER", "SEND",      "RECV"};
    return kind >= 0 && kind < (int)(sizeof names / sizeof names[0]) ? names[kind] : "UNKNOWN";
}

static void conn_close(struct conn *c);
static void peer_write(struct c10d__tcp_transport *t, struct peer *pe, struct c10d__tcp_xfer *x,
                       int which);
static void peer_connect(struct c10d__tcp_transport *t, int rank);
static void peer_lost(struct c10d__tcp_transport *t, int rank, int err);

/* ------------------------------------------------------------ errors */

static void t_verror(struct c10d__tcp_transport *t, int status, const char *fmt, va_list ap)
{
    if (t->failed)
        return;
    char msg[1024];
    vsnprintf(msg, sizeof msg, fmt, ap);
    C10D_DEBUG("tcp", "rank %d: transport failed: %s", t->cfg.rank, msg);
    c10d__tcp_transport_fail(t, status, msg);
    if (t->cfg.on_error != NULL)
        t->cfg.on_error(t->cfg.arg, status, msg);
}

static void t_error(struct c10d__tcp_transport *t, int status, const char *fmt, ...)
    C10D_PRINTF(3, 4);
static void t_error(struct c10d__tcp_transport *t, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    t_verror(t, status, fmt, ap);
    va_end(ap);
}

/* ------------------------------------------------------------- lists */

static void xlist_push(struct xlist *l, int id, struct c10d__tcp_xfer *x)
{
    x->list = id;
    x->next = NULL;
    x->prev = l->tail;
    if (l->tail != NULL)
        l->tail->next = x;
    else
        l->head = x;
    l->tail = x;
}

static void xlist_remove(struct xlist *l, struct c10d__tcp_xfer *x)
{
    if (x->prev != NULL)
        x->prev->next = x->next;
    else
        l->head = x->next;
    if (x->next != NULL)
        x->next->prev = x->prev;
    else
        l->tail = x->prev;
    x->next = x->prev = NULL;
    x->list = L_NONE;
}

static uint32_t xfer_key_sub(const struct c10d__tcp_xfer *x)
{
    return x->p2p ? x->peer_sub : x->sub;
}

static struct c10d__tcp_xfer *xlist_find(struct xlist *l, int p2p, uint64_t tag, uint32_t sub)
{
    for (struct c10d__tcp_xfer *x = l->head; x != NULL; x = x->next)
        if (x->p2p == p2p && x->tag == tag && xfer_key_sub(x) == sub)
            return x;
    return NULL;
}

static struct c10d__tcp_xfer *xlist_find_tag(struct xlist *l, uint64_t tag)
{
    for (struct c10d__tcp_xfer *x = l->head; x != NULL; x = x->next)
        if (x->tag == tag)
            return x;
    return NULL;
}

/* ------------------------------------------------------------- pools */

struct c10d__tcp_xfer *c10d__tcp_xfer_get(struct c10d__tcp_transport *t)
{
    struct c10d__tcp_xfer *x = t->pool;
    if (x != NULL) {
        t->pool = x->next;
    } else {
        x = malloc(sizeof *x);
        if (x == NULL)
            return NULL;
        x->all_next = t->all_xfers;
        t->all_xfers = x;
    }
    struct c10d__tcp_xfer *keep = x->all_next;
    memset(x, 0, sizeof *x);
    x->all_next = keep;
    x->source = -1;
    return x;
}

static void pool_push(struct c10d__tcp_transport *t, struct c10d__tcp_xfer *x)
{
    x->next = t->pool;
    t->pool = x;
}

void c10d__tcp_xfer_put(struct c10d__tcp_transport *t, struct c10d__tcp_xfer *x)
{
    if (x->writes > 0)
        x->released = 1;
    else
        pool_push(t, x);
}

static struct unexp *unexp_new(struct c10d__tcp_transport *t, const struct wire *w, size_t data)
{
    struct unexp *u = t->unexp_pool;
    if (u != NULL)
        t->unexp_pool = u->next;
    else if ((u = calloc(1, sizeof *u)) == NULL)
        return NULL;
    if (data > u->cap) {
        char *grown = realloc(u->data, data);
        if (grown == NULL) {
            u->next = t->unexp_pool;
            t->unexp_pool = u;
            return NULL;
        }
        u->data = grown;
        u->cap = data;
    }
    u->next = NULL;
    u->w = *w;
    u->order = t->next_order++;
    u->complete = 0;
    u->claimed = NULL;
    return u;
}

static void unexp_free(struct c10d__tcp_transport *t, struct unexp *u)
{
    /* Keep modest buffers for reuse; give big ones back. */
    if (u->cap > (1u << 20)) {
        free(u->data);
        u->data = NULL;
        u->cap = 0;
    }
    u->next = t->unexp_pool;
    t->unexp_pool = u;
}

static void unexp_append(struct peer *pe, struct unexp *u)
{
    if (pe->unexp_tail != NULL)
        pe->unexp_tail->next = u;
    else
        pe->unexp_head = u;
    pe->unexp_tail = u;
}

static void unexp_unlink(struct peer *pe, struct unexp *u)
{
    struct unexp **pp = &pe->unexp_head, *prev = NULL;
    while (*pp != NULL && *pp != u) {
        prev = *pp;
        pp = &(*pp)->next;
    }
    if (*pp == NULL)
        return;
    *pp = u->next;
    if (pe->unexp_tail == u)
        pe->unexp_tail = prev;
    u->next = NULL;
}

/* ---------------------------------------------------------- framing */

static void wire_encode(unsigned char *out, int type, int kind, int flags, uint32_t sub,
                        uint64_t tag, uint64_t len)
{
    struct wire w = {(uint8_t)type, (uint8_t)kind, (uint8_t)flags, 0, sub, tag, len};
    memcpy(out, &w, HDR_LEN);
}

static void xfer_written(uv_write_t *req, int status, int which)
{
    struct c10d__tcp_xfer *x = req->data;
    struct c10d__tcp_transport *t = ((struct conn *)req->handle->data)->t;
    x->writes--;
    if (status < 0 || x->released || t->failed) {
        struct conn *c = req->handle->data;
        if (status < 0 && status != UV_ECANCELED && c->rank >= 0)
            peer_lost(t, c->rank, status);
        if (x->released && x->writes == 0)
            pool_push(t, x);
        return;
    }
    if (which == W_DATA && !x->await_ack)
        x->done(x);
}

static void on_ctl_written(uv_write_t *req, int status)
{
    xfer_written(req, status, W_CTL);
}

static void on_data_written(uv_write_t *req, int status)
{
    xfer_written(req, status, W_DATA);
}

static void peer_write(struct c10d__tcp_transport *t, struct peer *pe, struct c10d__tcp_xfer *x,
                       int which)
{
    if (t->failed)
        return;
    if (pe->conn == NULL && pe->lost)
        return; /* the transport is about to fail */
    if (pe->conn == NULL && pe->gone) {
        t_error(t, C10D_ECLOSED, "tcp: rank %d has left the group (it destroyed it)", pe->rank);
        return;
    }
    if (pe->conn == NULL) {
        x->out_which = which;
        x->out_next = NULL;
        if (pe->out_tail != NULL)
            pe->out_tail->out_next = x;
        else
            pe->out_head = x;
        pe->out_tail = x;
        peer_connect(t, pe->rank);
        return;
    }
    uv_buf_t b[MAX_IOV];
    unsigned n = 1;
    size_t total = HDR_LEN;
    uv_write_t *req;
    if (which == W_CTL) {
        b[0] = uv_buf_init((char *)x->ctl_hdr, HDR_LEN);
        req = &x->ctl_req;
    } else {
        b[0] = uv_buf_init((char *)x->data_hdr, HDR_LEN);
        /* uv_buf_t lengths are 32-bit: big payloads go as several pieces. */
        for (size_t off = 0; off < x->len;) {
            size_t piece = x->len - off < IOV_PIECE ? x->len - off : IOV_PIECE;
            if (n == MAX_IOV) {
                t_error(t, C10D_EUNSUPPORTED, "tcp: a message of %zu bytes is too large", x->len);
                return;
            }
            b[n++] = uv_buf_init((char *)x->buf + off, (unsigned)piece);
            off += piece;
        }
        total += x->len;
        req = &x->data_req;
    }
    uv_stream_t *stream = (uv_stream_t *)&pe->conn->tcp;
    /* Nothing queued: write now, and if it all went out, the send is done
     * without waiting for a write callback on a later loop turn. */
    if (uv_stream_get_write_queue_size(stream) == 0) {
        int w = uv_try_write(stream, b, n);
        if (w < 0 && w != UV_EAGAIN) {
            peer_lost(t, pe->rank, w);
            return;
        }
        size_t done = w > 0 ? (size_t)w : 0;
        if (done == total) {
            if (which == W_DATA && !x->await_ack)
                x->done(x);
            return;
        }
        unsigned skip = 0;
        while (done >= b[skip].len) {
            done -= b[skip].len;
            skip++;
        }
        b[skip].base += done;
        b[skip].len -= (unsigned)done;
        memmove(b, b + skip, (n - skip) * sizeof b[0]);
        n -= skip;
    }
    req->data = x;
    x->writes++;
    int rc = uv_write(req, stream, b, n, which == W_CTL ? on_ctl_written : on_data_written);
    if (rc < 0) {
        x->writes--;
        peer_lost(t, pe->rank, rc);
    }
}

static void peer_flush(struct c10d__tcp_transport *t, struct peer *pe)
{
    struct c10d__tcp_xfer *x = pe->out_head;
    pe->out_head = pe->out_tail = NULL;
    while (x != NULL && !t->failed) {
        struct c10d__tcp_xfer *next = x->out_next;
        x->out_next = NULL;
        peer_write(t, pe, x, x->out_which);
        x = next;
    }
}

static int work_gone(const struct c10d__tcp_xfer *x)
{
    return x->work != NULL && c10d_work_test(x->work);
}

static void send_cts(struct c10d__tcp_transport *t, struct c10d__tcp_xfer *x)
{
    x->cts_sent = 1;
    wire_encode(x->ctl_hdr, F_CTS, x->kind, x->p2p ? FLAG_P2P : 0, xfer_key_sub(x), x->tag, x->len);
    peer_write(t, &t->peers[x->source], x, W_CTL);
}

static void mismatch(struct c10d__tcp_transport *t, const struct c10d__tcp_xfer *x, int from,
                     uint64_t sent, size_t posted)
{
    if (x->p2p)
        t_error(t, C10D_EINVAL,
                "tcp recv (tag %llu): rank %d sent %llu bytes but the posted buffer holds %zu",
                (unsigned long long)x->tag, from, (unsigned long long)sent, posted);
    else
        t_error(t, C10D_EINVAL,
                "tcp %s seq %llu: rank %d sent %llu bytes but this rank posted %zu bytes "
                "(collective mismatch?)",
                kind_name(x->kind), (unsigned long long)x->tag, from, (unsigned long long)sent,
                posted);
}

/* The CTS arrived for a send: send the payload. */
static void send_data(struct c10d__tcp_transport *t, struct c10d__tcp_xfer *x, uint64_t cap)
{
    if (x->p2p ? x->len > cap : x->len != cap) {
        if (x->p2p)
            t_error(t, C10D_EINVAL,
                    "tcp send (tag %llu): %zu bytes to rank %d, which posted a buffer of %llu",
                    (unsigned long long)x->tag, x->len, x->peer, (unsigned long long)cap);
        else
            t_error(t, C10D_EINVAL,
                    "tcp %s seq %llu: sending %zu bytes to rank %d, which posted %llu bytes "
                    "(collective mismatch?)",
                    kind_name(x->kind), (unsigned long long)x->tag, x->len, x->peer,
                    (unsigned long long)cap);
        return;
    }
    if (work_gone(x))
        return;
    wire_encode(x->data_hdr, F_DATA, x->kind, x->p2p ? FLAG_P2P : 0, xfer_key_sub(x), x->tag,
                x->len);
    peer_write(t, &t->peers[x->peer], x, W_DATA);
}

static void send_ack(struct c10d__tcp_transport *t, struct c10d__tcp_xfer *x)
{
    wire_encode(x->ctl_hdr, F_ACK, x->kind, FLAG_P2P, x->peer_sub, x->tag, x->received);
    peer_write(t, &t->peers[x->source], x, W_CTL);
}

/* A P2P receive matched an RTS: from now on it waits for that sender's data. */
static void p2p_accept(struct c10d__tcp_transport *t, struct c10d__tcp_xfer *x, int from,
                       const struct wire *w)
{
    if (w->len > x->len) {
        mismatch(t, x, from, w->len, x->len);
        return;
    }
    x->peer_sub = w->sub;
    x->source = from;
    xlist_push(&t->peers[from].recvs, L_RECVS, x);
    send_cts(t, x);
}

/* ------------------------------------------------------------ posting */

void c10d__tcp_send(struct c10d__tcp_transport *t, struct c10d__tcp_xfer *x)
{
    if (t->failed)
        return;
    struct peer *pe = &t->peers[x->peer];
    if (!x->p2p && x->len <= t->cfg.eager_max) {
        wire_encode(x->data_hdr, F_EAGER, x->kind, 0, x->sub, x->tag, x->len);
        peer_write(t, pe, x, W_DATA);
        return;
    }
    if (x->p2p && x->len <= t->cfg.eager_max && pe->eager_out + x->len <= P2P_CREDIT) {
        /* Small P2P: the data goes now; the send completes when the receiver
         * acknowledges having matched it to a posted receive. */
        x->peer_sub = pe->next_send_id++;
        x->await_ack = 1;
        pe->eager_out += x->len;
        xlist_push(&pe->sends, L_SENDS, x);
        wire_encode(x->data_hdr, F_EAGER, x->kind, FLAG_P2P, x->peer_sub, x->tag, x->len);
        peer_write(t, pe, x, W_DATA);
        return;
    }
    if (x->p2p) {
        x->peer_sub = pe->next_send_id++;
    } else {
        for (struct unexp *u = pe->unexp_head; u != NULL; u = u->next) {
            if (u->w.type == F_CTS && !(u->w.flags & FLAG_P2P) && u->w.tag == x->tag &&
                u->w.sub == x->sub) {
                uint64_t cap = u->w.len;
                unexp_unlink(pe, u);
                unexp_free(t, u);
                send_data(t, x, cap);
                return;
            }
        }
    }
    xlist_push(&pe->sends, L_SENDS, x);
    wire_encode(x->ctl_hdr, F_RTS, x->kind, x->p2p ? FLAG_P2P : 0, xfer_key_sub(x), x->tag, x->len);
    peer_write(t, pe, x, W_CTL);
}

static void recv_finish(struct c10d__tcp_xfer *x, int from, size_t len)
{
    x->received = len;
    x->source = from;
    x->done(x);
}

static void recv_p2p(struct c10d__tcp_transport *t, struct c10d__tcp_xfer *x)
{
    struct unexp *best = NULL;
    int best_rank = -1;
    int lo = x->peer == C10D_ANY_SOURCE ? 0 : x->peer;
    int hi = x->peer == C10D_ANY_SOURCE ? t->cfg.size : x->peer + 1;
    for (int r = lo; r < hi; r++) {
        if (r == t->cfg.rank)
            continue;
        if (x->peer == C10D_ANY_SOURCE && t->cfg.lazy && t->peers[r].conn == NULL)
            peer_connect(t, r);
        for (struct unexp *u = t->peers[r].unexp_head; u != NULL; u = u->next) {
            if ((u->w.type == F_RTS || u->w.type == F_EAGER) && (u->w.flags & FLAG_P2P) &&
                u->w.tag == x->tag) {
                if (best == NULL || u->order < best->order) {
                    best = u;
                    best_rank = r;
                }
                break;
            }
        }
    }
    if (best != NULL && best->w.type == F_EAGER) {
        if (best->w.len > x->len) {
            mismatch(t, x, best_rank, best->w.len, x->len);
            return;
        }
        x->peer_sub = best->w.sub;
        x->source = best_rank;
        x->ack_needed = 1;
        if (!best->complete) {
            best->claimed = x; /* still arriving: finished by body_done */
            return;
        }
        size_t len = best->w.len;
        if (len > 0)
            memcpy(x->buf, best->data, len);
        unexp_unlink(&t->peers[best_rank], best);
        unexp_free(t, best);
        x->received = len;
        send_ack(t, x);
        recv_finish(x, best_rank, len);
        return;
    }
    if (best != NULL) {
        struct wire w = best->w;
        unexp_unlink(&t->peers[best_rank], best);
        unexp_free(t, best);
        p2p_accept(t, x, best_rank, &w);
        return;
    }
    if (x->peer != C10D_ANY_SOURCE && t->peers[x->peer].gone) {
        t_error(t, C10D_ECLOSED, "tcp: rank %d has left the group (it destroyed it)", x->peer);
        return;
    }
    x->order = t->next_order++;
    if (x->peer == C10D_ANY_SOURCE) {
        xlist_push(&t->any_recvs, L_ANY_RECVS, x);
    } else {
        xlist_push(&t->peers[x->peer].p2p_recvs, L_P2P_RECVS, x);
        if (t->cfg.lazy && t->peers[x->peer].conn == NULL)
            peer_connect(t, x->peer);
    }
}

void c10d__tcp_recv(struct c10d__tcp_transport *t, struct c10d__tcp_xfer *x)
{
    if (t->failed)
        return;
    if (x->p2p) {
        recv_p2p(t, x);
        return;
    }
    struct peer *pe = &t->peers[x->peer];
    x->source = x->peer;
    for (struct unexp *u = pe->unexp_head; u != NULL; u = u->next) {
        if ((u->w.flags & FLAG_P2P) || u->w.tag != x->tag || u->w.sub != x->sub ||
            (u->w.type != F_EAGER && u->w.type != F_RTS))
            continue;
        if (u->w.kind != x->kind) {
            t_error(t, C10D_EINVAL,
                    "tcp %s seq %llu: rank %d runs %s with the same sequence number "
                    "(collective mismatch?)",
                    kind_name(x->kind), (unsigned long long)x->tag, x->peer, kind_name(u->w.kind));
            return;
        }
        if (u->w.len != x->len) {
            mismatch(t, x, x->peer, u->w.len, x->len);
            return;
        }
        if (u->w.type == F_RTS) {
            unexp_unlink(pe, u);
            unexp_free(t, u);
            xlist_push(&pe->recvs, L_RECVS, x);
            send_cts(t, x);
            return;
        }
        if (!u->complete) {
            u->claimed = x; /* the body is arriving: finish when it has */
            return;
        }
        size_t len = u->w.len;
        if (len > 0)
            memcpy(x->buf, u->data, len);
        unexp_unlink(pe, u);
        unexp_free(t, u);
        recv_finish(x, x->peer, len);
        return;
    }
    if (pe->gone) {
        t_error(t, C10D_ECLOSED, "tcp: rank %d has left the group (it destroyed it)", x->peer);
        return;
    }
    xlist_push(&pe->recvs, L_RECVS, x);
    if (x->len > t->cfg.eager_max)
        send_cts(t, x);
    else if (t->cfg.lazy && pe->conn == NULL)
        peer_connect(t, x->peer);
}

/* ------------------------------------------------------------ reading */

static void body_start(struct conn *c, const struct wire *w, char *dst, struct c10d__tcp_xfer *x,
                       struct unexp *u)
{
    c->in_body = 1;
    c->body_w = *w;
    c->dst = dst;
    c->remaining = w->len;
    c->body_x = x;
    c->body_u = u;
    if (x != NULL && work_gone(x))
        c->dst = NULL; /* its op timed out: the buffer may be gone */
}

static void body_done(struct conn *c)
{
    struct c10d__tcp_transport *t = c->t;
    struct peer *pe = &t->peers[c->rank];
    c->in_body = 0;
    struct c10d__tcp_xfer *x = c->body_x;
    struct unexp *u = c->body_u;
    c->body_x = NULL;
    c->body_u = NULL;
    if (c->body_w.type == F_ABORT) {
        c->abort_msg[c->body_w.len] = '\0';
        t_error(t, (int)(int64_t)c->body_w.tag, "rank %d failed: %s", c->rank, c->abort_msg);
        return;
    }
    if (x != NULL) {
        xlist_remove(&pe->recvs, x);
        if (c->dst != NULL || c->body_w.len == 0) {
            if (x->ack_needed) {
                x->received = c->body_w.len;
                send_ack(t, x);
            }
            recv_finish(x, c->rank, c->body_w.len);
        }
        return;
    }
    if (u != NULL) {
        u->complete = 1;
        if (u->claimed != NULL) {
            struct c10d__tcp_xfer *cx = u->claimed;
            size_t len = u->w.len;
            if (!work_gone(cx) && len > 0)
                memcpy(cx->buf, u->data, len);
            unexp_unlink(pe, u);
            unexp_free(t, u);
            if (cx->ack_needed) {
                cx->received = len;
                send_ack(t, cx);
            }
            recv_finish(cx, c->rank, len);
        }
    }
}

static void handle_frame(struct conn *c, const struct wire *w)
{
    struct c10d__tcp_transport *t = c->t;
    struct peer *pe = &t->peers[c->rank];
    int p2p = (w->flags & FLAG_P2P) != 0;
    struct c10d__tcp_xfer *x;
    switch (w->type) {
    case F_EAGER:
        if (p2p) {
            struct c10d__tcp_xfer *a = xlist_find_tag(&pe->p2p_recvs, w->tag);
            struct c10d__tcp_xfer *b = xlist_find_tag(&t->any_recvs, w->tag);
            x = a != NULL && (b == NULL || a->order < b->order) ? a : b;
            if (x != NULL) {
                if (w->len > x->len) {
                    mismatch(t, x, c->rank, w->len, x->len);
                    return;
                }
                xlist_remove(x == a ? &pe->p2p_recvs : &t->any_recvs, x);
                x->peer_sub = w->sub;
                x->source = c->rank;
                x->ack_needed = 1;
                xlist_push(&pe->recvs, L_RECVS, x);
                body_start(c, w, x->buf, x, NULL);
                break;
            }
            x = NULL;
        } else {
            x = xlist_find(&pe->recvs, 0, w->tag, w->sub);
        }
        if (x != NULL) {
            if (x->kind != w->kind) {
                t_error(t, C10D_EINVAL,
                        "tcp %s seq %llu: rank %d runs %s with the same sequence number "
                        "(collective mismatch?)",
                        kind_name(x->kind), (unsigned long long)x->tag, c->rank,
                        kind_name(w->kind));
                return;
            }
            if (w->len != x->len) {
                mismatch(t, x, c->rank, w->len, x->len);
                return;
            }
            body_start(c, w, x->buf, x, NULL);
        } else {
            struct unexp *u = unexp_new(t, w, w->len);
            if (u == NULL) {
                t_error(t, C10D_ENOMEM, "tcp: out of memory buffering %llu bytes from rank %d",
                        (unsigned long long)w->len, c->rank);
                return;
            }
            unexp_append(pe, u);
            body_start(c, w, u->data, NULL, u);
        }
        break;
    case F_RTS:
        if (p2p) {
            struct c10d__tcp_xfer *a = xlist_find_tag(&pe->p2p_recvs, w->tag);
            struct c10d__tcp_xfer *b = xlist_find_tag(&t->any_recvs, w->tag);
            x = a != NULL && (b == NULL || a->order < b->order) ? a : b;
            if (x != NULL) {
                xlist_remove(x == a ? &pe->p2p_recvs : &t->any_recvs, x);
                p2p_accept(t, x, c->rank, w);
                return;
            }
        } else if ((x = xlist_find(&pe->recvs, 0, w->tag, w->sub)) != NULL) {
            if (w->len != x->len)
                mismatch(t, x, c->rank, w->len, x->len);
            else if (!x->cts_sent)
                send_cts(t, x);
            return;
        }
        goto keep;
    case F_CTS:
        x = xlist_find(&pe->sends, p2p, w->tag, w->sub);
        if (x != NULL) {
            xlist_remove(&pe->sends, x);
            send_data(t, x, w->len);
            return;
        }
        goto keep;
    case F_DATA:
        x = xlist_find(&pe->recvs, p2p, w->tag, w->sub);
        if (x == NULL) {
            t_error(t, C10D_EPROTO, "tcp: rank %d sent data (tag %llu) nobody asked for", c->rank,
                    (unsigned long long)w->tag);
            return;
        }
        if (x->p2p ? w->len > x->len : w->len != x->len) {
            mismatch(t, x, c->rank, w->len, x->len);
            return;
        }
        body_start(c, w, x->buf, x, NULL);
        break;
    case F_ACK:
        x = xlist_find(&pe->sends, 1, w->tag, w->sub);
        if (x == NULL || !x->await_ack) {
            t_error(t, C10D_EPROTO, "tcp: rank %d acknowledged a message (tag %llu) never sent",
                    c->rank, (unsigned long long)w->tag);
            return;
        }
        xlist_remove(&pe->sends, x);
        pe->eager_out -= x->len;
        x->await_ack = 0;
        if (!work_gone(x))
            x->done(x);
        return;
    case F_BYE:
        c->bye = 1;
        pe->gone = 1;
        return;
    case F_ABORT:
        if (w->len > ABORT_MSG_MAX) {
            t_error(t, C10D_EPROTO, "tcp: rank %d sent a malformed abort frame", c->rank);
            return;
        }
        body_start(c, w, c->abort_msg, NULL, NULL);
        break;
    default:
        t_error(t, C10D_EPROTO, "tcp: rank %d sent an unknown frame type %d", c->rank, w->type);
        return;
    }
    if (c->in_body && c->remaining == 0)
        body_done(c);
    return;
keep : {
    struct unexp *u = unexp_new(t, w, 0);
    if (u == NULL) {
        t_error(t, C10D_ENOMEM, "tcp: out of memory");
        return;
    }
    u->complete = 1;
    unexp_append(pe, u);
}
}

static void hello_done(struct conn *c);
static void connect_failed(struct c10d__tcp_transport *t, int rank, const char *why);

static void peer_name(uv_tcp_t *tcp, char *out, size_t size)
{
    struct sockaddr_storage ss;
    int len = sizeof ss;
    char ip[INET6_ADDRSTRLEN] = "?";
    snprintf(out, size, "?");
    if (uv_tcp_getpeername(tcp, (struct sockaddr *)&ss, &len) != 0)
        return;
    if (ss.ss_family == AF_INET) {
        uv_ip4_name((struct sockaddr_in *)&ss, ip, sizeof ip);
        snprintf(out, size, "%s:%d", ip, ntohs(((struct sockaddr_in *)&ss)->sin_port));
    } else if (ss.ss_family == AF_INET6) {
        uv_ip6_name((struct sockaddr_in6 *)&ss, ip, sizeof ip);
        snprintf(out, size, "[%s]:%d", ip, ntohs(((struct sockaddr_in6 *)&ss)->sin6_port));
    }
}

/* A connection that never became one of the group's: close it, and say so at
 * most once a second, so a flood of strangers costs a log line, never the
 * group. */
static void drop_stranger(struct conn *c, const char *fmt, ...) C10D_PRINTF(2, 3);
static void drop_stranger(struct conn *c, const char *fmt, ...)
{
    struct c10d__tcp_transport *t = c->t;
    uint64_t now = c10d__now_ms();
    if (now - t->stranger_log_ms >= STRANGER_LOG_MS || t->stranger_log_ms == 0) {
        char why[256];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, sizeof why, fmt, ap);
        va_end(ap);
        C10D_WARN("tcp",
                  "rank %d: dropping a connection from %s: %s (%llu more dropped since the "
                  "last such line)",
                  t->cfg.rank, c->peer[0] ? c->peer : "?", why,
                  (unsigned long long)t->strangers_unlogged);
        t->stranger_log_ms = now;
        t->strangers_unlogged = 0;
    } else {
        t->strangers_unlogged++;
    }
    conn_close(c);
}

/* The hello, both ways (host byte order, as every frame):
 *   u32 magic, u16 version, u16 flags (answer: HELLO_ACCEPTED), u32 group id,
 *   u32 rank (the sender's), u32 world size, u32 token length, u64 job id,
 *   then the token. */
static size_t hello_encode(const struct c10d__tcp_transport *t, unsigned char *out, uint16_t flags)
{
    uint32_t magic = HELLO_MAGIC, gid = t->cfg.group_id, rank = (uint32_t)t->cfg.rank;
    uint32_t size = (uint32_t)t->cfg.size, tlen = (uint32_t)t->token_len;
    uint16_t version = HELLO_VERSION;
    memcpy(out, &magic, 4);
    memcpy(out + 4, &version, 2);
    memcpy(out + 6, &flags, 2);
    memcpy(out + 8, &gid, 4);
    memcpy(out + 12, &rank, 4);
    memcpy(out + 16, &size, 4);
    memcpy(out + 20, &tlen, 4);
    memcpy(out + 24, &t->job_id, 8);
    memcpy(out + HELLO_FIXED, t->token, t->token_len);
    return HELLO_FIXED + t->token_len;
}

struct hello {
    uint32_t magic, group_id, rank, size, token_len;
    uint16_t version, flags;
    uint64_t job_id;
    const unsigned char *token;
};

static void hello_decode(const unsigned char *in, struct hello *h)
{
    memcpy(&h->magic, in, 4);
    memcpy(&h->version, in + 4, 2);
    memcpy(&h->flags, in + 6, 2);
    memcpy(&h->group_id, in + 8, 4);
    memcpy(&h->rank, in + 12, 4);
    memcpy(&h->size, in + 16, 4);
    memcpy(&h->token_len, in + 20, 4);
    memcpy(&h->job_id, in + 24, 8);
    h->token = in + HELLO_FIXED;
}

/* What is wrong with a hello for this transport (NULL: nothing). The token
 * is compared first and in constant time. */
static const char *hello_problem(const struct c10d__tcp_transport *t, const struct hello *h,
                                 char *buf, size_t size)
{
    if (!c10d__token_equal(h->token, h->token_len, t->token, t->token_len))
        return t->token_len ? "wrong or missing token"
                            : "it presents a token and this job has none";
    if (h->job_id != t->job_id) {
        snprintf(buf, size, "it belongs to another job (job id %016llx, this job's %016llx)",
                 (unsigned long long)h->job_id, (unsigned long long)t->job_id);
        return buf;
    }
    if (h->group_id != t->cfg.group_id || (int)h->size != t->cfg.size) {
        snprintf(buf, size, "it is for another group (id %08x of %u ranks; this group: %08x of %d)",
                 h->group_id, h->size, t->cfg.group_id, t->cfg.size);
        return buf;
    }
    return NULL;
}

/* Inbound: a complete hello. Nothing here can fail the group: the
 * connection only joins it once the answer is out. */
static void accept_hello(struct conn *c)
{
    struct c10d__tcp_transport *t = c->t;
    if (!t->job_known) {
        /* A peer read our address before we read rank 0's: answer once we
         * know the job id (c10d__tcp_transport_connect). */
        c->parked = 1;
        return;
    }
    c->parked = 0;
    struct hello h;
    hello_decode(c->hello_in, &h);
    char buf[160];
    const char *problem = hello_problem(t, &h, buf, sizeof buf);
    if (problem != NULL) {
        drop_stranger(c, "%s", problem);
        return;
    }
    int r = (int)h.rank;
    if (r < 0 || r >= t->cfg.size || r == t->cfg.rank) {
        drop_stranger(c, "it claims rank %d of %d", r, t->cfg.size);
        return;
    }
    struct peer *pe = &t->peers[r];
    /* Both sides connecting at once (lazy): the lower rank's connection wins.
     * A rank already connected keeps its connection. */
    int accept = pe->conn == NULL && !pe->lost && !(pe->connecting != NULL && t->cfg.rank < r);
    size_t n = hello_encode(t, c->hello_out, accept ? HELLO_ACCEPTED : 0);
    uv_buf_t b = uv_buf_init((char *)c->hello_out, (unsigned)n);
    if (uv_try_write((uv_stream_t *)&c->tcp, &b, 1) != (int)n) {
        /* The other end is gone already (or never meant it): not a peer of
         * ours until the hello is answered. */
        C10D_DEBUG("tcp", "rank %d: cannot answer a handshake claiming rank %d; closing it",
                   t->cfg.rank, r);
        conn_close(c);
        return;
    }
    if (!accept) {
        conn_close(c);
        return;
    }
    c->rank = r;
    hello_done(c);
}

/* Outbound: the answer of the rank we connected to. */
static void answer_hello(struct conn *c)
{
    struct c10d__tcp_transport *t = c->t;
    struct hello h;
    hello_decode(c->hello_in, &h);
    char buf[160];
    const char *problem = hello_problem(t, &h, buf, sizeof buf);
    if (problem == NULL && (int)h.rank != c->rank) {
        snprintf(buf, sizeof buf, "it answers as rank %u", h.rank);
        problem = buf;
    }
    int rank = c->rank;
    if (problem != NULL) {
        /* Whoever listens on that address now is not the peer we want (a
         * reused port, another job): keep trying until the deadline. */
        char why[200];
        snprintf(why, sizeof why, "the handshake failed: %s", problem);
        conn_close(c);
        connect_failed(t, rank, why);
        return;
    }
    if (!(h.flags & HELLO_ACCEPTED)) {
        /* A refusal means the peer keeps its own connection to us. */
        conn_close(c);
        return;
    }
    hello_done(c);
}

/* Bytes of a hello: the fixed part first, whose token length (bounded) says
 * how much more. Garbage is dropped as soon as the fixed part shows it. */
static size_t hello_bytes(struct conn *c, const char *p, size_t n)
{
    struct c10d__tcp_transport *t = c->t;
    size_t want = HELLO_FIXED;
    if (c->hello_have >= HELLO_FIXED) {
        uint32_t tlen;
        memcpy(&tlen, c->hello_in + 20, 4);
        want += tlen;
    }
    size_t k = want - c->hello_have < n ? want - c->hello_have : n;
    memcpy(c->hello_in + c->hello_have, p, k);
    c->hello_have += k;
    if (c->hello_have == HELLO_FIXED) {
        struct hello h;
        hello_decode(c->hello_in, &h);
        if (h.magic != HELLO_MAGIC || h.version != HELLO_VERSION || h.token_len > C10D_TOKEN_MAX) {
            if (c->initiator) {
                int rank = c->rank;
                conn_close(c);
                connect_failed(t, rank, "the peer's answer is not a libc10d handshake");
            } else {
                drop_stranger(c, "not a libc10d handshake of version %d", HELLO_VERSION);
            }
            return k;
        }
        want += h.token_len;
    }
    if (c->hello_have == want) {
        if (c->initiator)
            answer_hello(c);
        else
            accept_hello(c);
    }
    return k;
}

static void check_ready(struct c10d__tcp_transport *t)
{
    if (t->ready_called || t->ready == NULL || t->nready < t->cfg.size - 1)
        return;
    t->ready_called = 1;
    if (t->deadline_open)
        uv_timer_stop(&t->deadline);
    t->ready(t->ready_arg, 0);
}

static void hello_done(struct conn *c)
{
    struct c10d__tcp_transport *t = c->t;
    struct peer *pe = &t->peers[c->rank];
    c->state = C_READY;
    pe->connect_fail_since = 0;
    if (pe->connecting == c)
        pe->connecting = NULL;
    pe->conn = c;
    t->nready++;
    C10D_DEBUG("tcp", "rank %d: connected to rank %d", t->cfg.rank, c->rank);
    peer_flush(t, pe);
    check_ready(t);
}

static void parse(struct conn *c, const char *p, size_t n)
{
    struct c10d__tcp_transport *t = c->t;
    while (n > 0 && !t->failed && c->state != C_CLOSED) {
        if (c->state == C_HELLO) {
            if (c->parked)
                return; /* nothing may follow a hello before its answer */
            size_t k = hello_bytes(c, p, n);
            p += k;
            n -= k;
            continue;
        }
        if (!c->in_body) {
            size_t k = HDR_LEN - c->hdr_have < n ? HDR_LEN - c->hdr_have : n;
            memcpy(c->hdr + c->hdr_have, p, k);
            c->hdr_have += k;
            p += k;
            n -= k;
            if (c->hdr_have == HDR_LEN) {
                struct wire w;
                memcpy(&w, c->hdr, HDR_LEN);
                c->hdr_have = 0;
                handle_frame(c, &w);
            }
            continue;
        }
        size_t k = c->remaining < n ? c->remaining : n;
        if (c->dst != NULL && c->body_x != NULL && work_gone(c->body_x))
            c->dst = NULL;
        if (c->dst != NULL) {
            memcpy(c->dst, p, k);
            c->dst += k;
        }
        c->remaining -= k;
        p += k;
        n -= k;
        if (c->remaining == 0)
            body_done(c);
    }
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)suggested;
    struct conn *c = h->data;
    if (c->in_body && c->dst != NULL && c->remaining >= DIRECT_MIN) {
        if (c->body_x != NULL && work_gone(c->body_x)) {
            c->dst = NULL;
        } else {
            size_t len = c->remaining < (size_t)INT_MAX ? c->remaining : (size_t)INT_MAX;
            *buf = uv_buf_init(c->dst, (unsigned)len);
            return;
        }
    }
    *buf = uv_buf_init(c->staging, STAGING_LEN);
}

/* Peers whose connection broke within the grace period. When one process
 * dies, the ranks that noticed first fail their groups and close their
 * connections too, so a rank that hears several EOFs names the first as
 * lost and the later ones as closing after it, not as dead. */
static void on_grace(uv_timer_t *tm)
{
    struct c10d__tcp_transport *t = tm->data;
    char later[256] = "";
    size_t off = 0;
    int n = 0;
    for (int r = 0; r < t->cfg.size && off < sizeof later - 16; r++)
        if (t->peers[r].lost && r != t->first_lost)
            off += (size_t)snprintf(later + off, sizeof later - off, "%s%d", n++ ? ", " : "", r);
    if (n == 0)
        t_error(t, C10D_ECLOSED,
                "tcp: connection to rank %d lost (the peer process died or left the group)",
                t->first_lost);
    else
        t_error(t, C10D_ECLOSED,
                "tcp: connection to rank %d lost (the peer process died or left the group); "
                "rank%s %s closed %s connection%s within %d ms after it (likely failing on "
                "the same loss)",
                t->first_lost, n > 1 ? "s" : "", later, n > 1 ? "their" : "its", n > 1 ? "s" : "",
                LOST_GRACE_MS);
}

static void peer_lost(struct c10d__tcp_transport *t, int rank, int err)
{
    if (t->failed)
        return;
    struct peer *pe = &t->peers[rank];
    C10D_DEBUG("tcp", "rank %d: connection to rank %d lost: %s", t->cfg.rank, rank,
               err == UV_EOF ? "closed by the peer" : uv_strerror(err));
    pe->lost = 1;
    if (pe->conn != NULL)
        conn_close(pe->conn);
    if (!t->grace_armed)
        t->first_lost = rank;
    if (!t->grace_armed && t->grace_open) {
        t->grace_armed = 1;
        uv_timer_start(&t->grace, on_grace, LOST_GRACE_MS, 0);
    }
}

static int peer_waited_on(const struct c10d__tcp_transport *t, const struct peer *pe)
{
    return pe->recvs.head != NULL || pe->p2p_recvs.head != NULL || pe->sends.head != NULL ||
           pe->out_head != NULL || t->any_recvs.head != NULL;
}

static void conn_lost(struct conn *c, ssize_t err)
{
    struct c10d__tcp_transport *t = c->t;
    if (c->state == C_READY && c->bye && !peer_waited_on(t, &t->peers[c->rank]))
        conn_close(c);
    else if (c->state == C_READY && c->bye)
        t_error(t, C10D_ECLOSED, "tcp: rank %d left the group while this rank waits on it",
                c->rank);
    else if (c->state == C_READY)
        peer_lost(t, c->rank, (int)err);
    else if (c->initiator && c->rank >= 0 && t->cfg.lazy)
        conn_close(c); /* the peer refused: its own connection wins */
    else if (c->initiator && c->rank >= 0) {
        /* Not a peer of the group's yet: whoever listens there hung up. */
        int rank = c->rank;
        char why[128];
        snprintf(why, sizeof why, "closed during the handshake: %s", uv_strerror((int)err));
        conn_close(c);
        connect_failed(t, rank, why);
    } else
        conn_close(c);
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    struct conn *c = s->data;
    if (nread < 0) {
        conn_lost(c, nread);
        return;
    }
    if (nread == 0 || c->state == C_CLOSED)
        return;
    c10d__engine_busy();
    if (buf->base != c->staging) {
        c->dst += nread;
        c->remaining -= (size_t)nread;
        if (c->remaining == 0)
            body_done(c);
        return;
    }
    parse(c, buf->base, (size_t)nread);
}

/* -------------------------------------------------------- connections */

static void on_handle_closed(uv_handle_t *h)
{
    struct c10d__tcp_transport *t = h->data;
    t->handles--;
    if (t->freeing && t->handles == 0)
        c10d__tcp_transport_free(t);
}

static void on_conn_closed(uv_handle_t *h)
{
    struct conn *c = h->data;
    struct c10d__tcp_transport *t = c->t;
    if (c->all_prev != NULL)
        c->all_prev->all_next = c->all_next;
    else
        t->conns = c->all_next;
    if (c->all_next != NULL)
        c->all_next->all_prev = c->all_prev;
    free(c->staging);
    free(c);
    t->handles--;
    if (t->freeing && t->handles == 0)
        c10d__tcp_transport_free(t);
}

static void conn_close(struct conn *c)
{
    if (c->state == C_CLOSED)
        return;
    struct c10d__tcp_transport *t = c->t;
    if (c->rank >= 0) {
        struct peer *pe = &t->peers[c->rank];
        if (pe->conn == c) {
            pe->conn = NULL;
            t->nready--;
        }
        if (pe->connecting == c)
            pe->connecting = NULL;
    }
    c->state = C_CLOSED;
    uv_close((uv_handle_t *)&c->tcp, on_conn_closed);
}

static void tune_socket(struct c10d__tcp_transport *t, uv_tcp_t *tcp)
{
    uv_tcp_nodelay(tcp, 1);
    if (t->cfg.socket_buffer > 0) {
        int v = t->cfg.socket_buffer;
        uv_send_buffer_size((uv_handle_t *)tcp, &v);
        v = t->cfg.socket_buffer;
        uv_recv_buffer_size((uv_handle_t *)tcp, &v);
    }
}

static struct conn *conn_new(struct c10d__tcp_transport *t, int family)
{
    struct conn *c = calloc(1, sizeof *c);
    if (c == NULL)
        return NULL;
    c->staging = malloc(STAGING_LEN);
    int rc = c->staging == NULL ? UV_ENOMEM
                                : (family ? uv_tcp_init_ex(t->loop, &c->tcp, (unsigned)family)
                                          : uv_tcp_init(t->loop, &c->tcp));
    if (rc < 0) {
        free(c->staging);
        free(c);
        return NULL;
    }
    t->handles++;
    c->tcp.data = c;
    c->t = t;
    c->rank = -1;
    c->all_next = t->conns;
    if (t->conns != NULL)
        t->conns->all_prev = c;
    t->conns = c;
    return c;
}

static void on_retry_closed(uv_handle_t *h)
{
    struct retry *r = h->data;
    struct c10d__tcp_transport *t = r->t;
    free(r);
    t->handles--;
    if (t->freeing && t->handles == 0)
        c10d__tcp_transport_free(t);
}

static void on_retry(uv_timer_t *tm)
{
    struct retry *r = tm->data;
    struct peer *pe = &r->t->peers[r->rank];
    /* This timer is the retry: clear its placeholder first, or a timer that
     * fires a hair before retry_at (the loop's clock is coarser than ours)
     * makes peer_connect believe an attempt is in progress, and retries end
     * for good. */
    if (pe->connecting == (struct conn *)r) {
        pe->connecting = NULL;
        pe->retry_at = 0;
    }
    if (!r->t->failed)
        peer_connect(r->t, r->rank);
    uv_close((uv_handle_t *)&r->timer, on_retry_closed);
}

/* An attempt to connect to `rank` failed: retry until the deadline, which
 * the transport's timer enforces (the peer may not listen yet, be briefly
 * overloaded, or lazy). A streak of failures is worth a warning naming the
 * address, since a bad published address otherwise looks like a hang. */
static void connect_failed(struct c10d__tcp_transport *t, int rank, const char *why)
{
    if (t->failed)
        return;
    struct peer *pe = &t->peers[rank];
    uint64_t now = c10d__now_ms();
    snprintf(pe->connect_error, sizeof pe->connect_error, "%s", why);
    if (pe->connect_fail_since == 0)
        pe->connect_fail_since = now;
    if (now - pe->connect_fail_since >= CONNECT_WARN_MS &&
        (pe->connect_warned_at == 0 || now - pe->connect_warned_at >= CONNECT_WARN_GAP)) {
        C10D_WARN("tcp",
                  "rank %d: cannot connect to rank %d at %s for %llu ms (%s); retrying until the "
                  "group's timeout",
                  t->cfg.rank, rank, t->addrs[rank],
                  (unsigned long long)(now - pe->connect_fail_since), why);
        pe->connect_warned_at = now;
    }
    struct retry *r = calloc(1, sizeof *r);
    if (r == NULL || uv_timer_init(t->loop, &r->timer) < 0) {
        free(r);
        t_error(t, C10D_ENOMEM, "tcp: out of memory");
        return;
    }
    t->handles++;
    r->t = t;
    r->rank = rank;
    r->timer.data = r;
    pe->connecting = (struct conn *)r; /* a placeholder: "in progress" */
    pe->retry_at = now + CONNECT_RETRY_MS;
    C10D_DEBUG("tcp", "rank %d: connecting to rank %d at %s: %s; retrying", t->cfg.rank, rank,
               t->addrs[rank], why);
    uv_timer_start(&r->timer, on_retry, CONNECT_RETRY_MS, 0);
}

static void on_connected(uv_connect_t *req, int status)
{
    struct conn *c = req->data;
    struct c10d__tcp_transport *t = c->t;
    if (c->state == C_CLOSED || t->failed)
        return;
    if (status < 0) {
        int rank = c->rank;
        conn_close(c);
        connect_failed(t, rank, uv_strerror(status));
        return;
    }
    tune_socket(t, &c->tcp);
    c->state = C_HELLO;
    size_t n = hello_encode(t, c->hello_out, 0);
    uv_buf_t b = uv_buf_init((char *)c->hello_out, (unsigned)n);
    int rc = uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
    if (rc == 0)
        rc = uv_write(&c->hello_req, (uv_stream_t *)&c->tcp, &b, 1, NULL);
    if (rc < 0) {
        int rank = c->rank;
        char why[128];
        snprintf(why, sizeof why, "sending the handshake failed: %s", uv_strerror(rc));
        conn_close(c);
        connect_failed(t, rank, why);
    }
}

static int parse_addr(const char *text, struct sockaddr_storage *ss)
{
    char host[INET6_ADDRSTRLEN + 2];
    const char *colon = strrchr(text, ':');
    if (colon == NULL || (size_t)(colon - text) >= sizeof host)
        return -1;
    memcpy(host, text, (size_t)(colon - text));
    host[colon - text] = '\0';
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (*end != '\0' || port <= 0 || port > 65535)
        return -1;
    if (host[0] == '[') {
        size_t l = strlen(host);
        if (l < 2 || host[l - 1] != ']')
            return -1;
        host[l - 1] = '\0';
        return uv_ip6_addr(host + 1, (int)port, (struct sockaddr_in6 *)ss) == 0 ? 0 : -1;
    }
    return uv_ip4_addr(host, (int)port, (struct sockaddr_in *)ss) == 0 ? 0 : -1;
}

static void peer_connect(struct c10d__tcp_transport *t, int rank)
{
    struct peer *pe = &t->peers[rank];
    if (t->failed || pe->conn != NULL || t->addrs == NULL || pe->lost)
        return;
    if (pe->connecting != NULL && (pe->retry_at == 0 || c10d__now_ms() < pe->retry_at))
        return;
    pe->retry_at = 0;
    pe->connecting = NULL;
    struct sockaddr_storage ss;
    if (parse_addr(t->addrs[rank], &ss) != 0) {
        t_error(t, C10D_EINVAL, "tcp: rank %d published an unusable address '%s'", rank,
                t->addrs[rank]);
        return;
    }
    struct conn *c = conn_new(t, ss.ss_family);
    if (c == NULL) {
        t_error(t, C10D_ENOMEM, "tcp: cannot create a socket for rank %d", rank);
        return;
    }
    tune_socket(t, &c->tcp);
    c->initiator = 1;
    c->rank = rank;
    c->state = C_CONNECTING;
    c->connect_req.data = c;
    pe->connecting = c;
    int rc = uv_tcp_connect(&c->connect_req, &c->tcp, (struct sockaddr *)&ss, on_connected);
    if (rc < 0)
        t_error(t, C10D_EIO, "tcp: connecting to rank %d at %s failed: %s", rank, t->addrs[rank],
                uv_strerror(rc));
}

static void on_connection(uv_stream_t *server, int status)
{
    struct c10d__tcp_transport *t = server->data;
    if (status < 0 || t->failed) {
        if (status < 0)
            C10D_WARN("tcp", "rank %d: accept failed: %s", t->cfg.rank, uv_strerror(status));
        return;
    }
    struct conn *c = conn_new(t, 0);
    if (c == NULL) {
        t_error(t, C10D_ENOMEM, "tcp: out of memory accepting a connection");
        return;
    }
    if (uv_accept(server, (uv_stream_t *)&c->tcp) < 0) {
        conn_close(c);
        return;
    }
    tune_socket(t, &c->tcp);
    c->state = C_HELLO;
    c->accepted_ms = c10d__now_ms();
    peer_name(&c->tcp, c->peer, sizeof c->peer);
    /* Bound what strangers can hold: past PENDING_MAX unfinished hellos the
     * oldest goes (a peer's own hello completes in one round trip). */
    int pending = 0;
    struct conn *oldest = NULL;
    for (struct conn *o = t->conns; o != NULL; o = o->all_next)
        if (o != c && !o->initiator && o->state == C_HELLO) {
            pending++;
            if (oldest == NULL || o->accepted_ms <= oldest->accepted_ms)
                oldest = o;
        }
    if (pending >= PENDING_MAX && oldest != NULL)
        drop_stranger(oldest, "%d connections are waiting for their handshake; closing the oldest",
                      pending + 1);
    if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) < 0)
        conn_close(c);
}

/* Inbound connections that did not complete their hello in time. */
static void on_pending_tick(uv_timer_t *tm)
{
    struct c10d__tcp_transport *t = tm->data;
    uint64_t limit = PENDING_HELLO_MS;
    if (t->cfg.timeout_ms > 0 && (uint64_t)t->cfg.timeout_ms < limit)
        limit = (uint64_t)t->cfg.timeout_ms;
    uint64_t now = c10d__now_ms();
    for (struct conn *c = t->conns, *next; c != NULL; c = next) {
        next = c->all_next;
        if (!c->initiator && c->state == C_HELLO && !c->parked && now - c->accepted_ms >= limit)
            drop_stranger(c, "no complete handshake within %llu ms (%zu bytes of it arrived)",
                          (unsigned long long)limit, c->hello_have);
    }
}

static void on_deadline(uv_timer_t *tm)
{
    struct c10d__tcp_transport *t = tm->data;
    if (t->ready_called)
        return;
    if (t->cfg.lazy || t->nready >= t->cfg.size - 1) {
        t->ready_called = 1;
        t->ready(t->ready_arg, 0);
        return;
    }
    char missing[768] = "";
    size_t off = 0;
    for (int r = 0; r < t->cfg.size && off < sizeof missing - 200; r++) {
        const struct peer *pe = &t->peers[r];
        if (r == t->cfg.rank || pe->conn != NULL)
            continue;
        off += (size_t)snprintf(missing + off, sizeof missing - off, "%s%d", off ? ", " : "", r);
        /* The ranks this one connects to: say where it tried and why not. */
        if (pe->connect_fail_since != 0)
            off += (size_t)snprintf(missing + off, sizeof missing - off, " (at %s: %s)",
                                    t->addrs[r], pe->connect_error);
    }
    t_error(t, C10D_ETIMEDOUT,
            "tcp: connecting rank %d's peers timed out after %lld ms; not connected: rank %s",
            t->cfg.rank, (long long)t->cfg.timeout_ms, missing);
}

/* ----------------------------------------------------- interface choice */

static int pick_address(struct c10d__tcp_transport *t)
{
    const char *ifname = c10d__env_str(C10D_ENV_SOCKET_IFNAME);
    struct sockaddr_storage *ss = &t->bind_addr;
    memset(ss, 0, sizeof *ss);
    if (ifname != NULL && *ifname != '\0') {
        uv_interface_address_t *ifs;
        int n;
        if (uv_interface_addresses(&ifs, &n) < 0)
            return c10d__fail(C10D_EIO, "tcp: cannot list network interfaces");
        int found = 0;
        for (int pass = 0; pass < 2 && !found; pass++) {
            for (int i = 0; i < n && !found; i++) {
                int fam = ifs[i].address.address4.sin_family;
                if (strcmp(ifs[i].name, ifname) != 0 || fam != (pass == 0 ? AF_INET : AF_INET6))
                    continue;
                memcpy(ss, &ifs[i].address,
                       fam == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6));
                found = 1;
            }
        }
        uv_free_interface_addresses(ifs, n);
        if (!found)
            return c10d__fail(C10D_EINVAL,
                              "tcp: C10D_SOCKET_IFNAME/GLOO_SOCKET_IFNAME names '%s', which is "
                              "not an interface with an address on this host",
                              ifname);
        return 0;
    }
    char host[256];
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    if (gethostname(host, sizeof host) == 0 && getaddrinfo(host, NULL, &hints, &res) == 0) {
        for (struct addrinfo *a = res; a != NULL; a = a->ai_next) {
            if (a->ai_family == AF_INET || a->ai_family == AF_INET6) {
                memcpy(ss, a->ai_addr, a->ai_addrlen);
                break;
            }
        }
        freeaddrinfo(res);
        if (ss->ss_family != 0)
            return 0;
    }
    C10D_WARN("tcp", "cannot resolve this host's name to an address; using loopback (set "
                     "C10D_SOCKET_IFNAME to choose an interface)");
    uv_ip4_addr("127.0.0.1", 0, (struct sockaddr_in *)ss);
    return 0;
}

/* Whether `ss` can be bound here (the hostname may resolve to an address of
 * another machine, or one that is not configured). */
static int bindable(const struct sockaddr_storage *ss)
{
    int fd = socket(ss->ss_family, SOCK_STREAM, 0);
    if (fd < 0)
        return 0;
    struct sockaddr_storage a = *ss;
    if (a.ss_family == AF_INET)
        ((struct sockaddr_in *)&a)->sin_port = 0;
    else
        ((struct sockaddr_in6 *)&a)->sin6_port = 0;
    socklen_t len =
        a.ss_family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
    int ok = bind(fd, (struct sockaddr *)&a, len) == 0;
    close(fd);
    return ok;
}

static int start_listening(struct c10d__tcp_transport *t)
{
    C10D_CHECK(pick_address(t));
    if (!bindable(&t->bind_addr)) {
        if (c10d__env_str(C10D_ENV_SOCKET_IFNAME)[0] != '\0')
            return c10d__fail(C10D_EIO, "tcp: cannot bind to the address of interface '%s'",
                              c10d__env_str(C10D_ENV_SOCKET_IFNAME));
        C10D_WARN("tcp", "cannot listen on this host's address; using loopback (set "
                         "C10D_SOCKET_IFNAME to choose an interface)");
        memset(&t->bind_addr, 0, sizeof t->bind_addr);
        uv_ip4_addr("127.0.0.1", 0, (struct sockaddr_in *)&t->bind_addr);
    }
    if (t->bind_addr.ss_family == AF_INET)
        ((struct sockaddr_in *)&t->bind_addr)->sin_port = 0;
    else
        ((struct sockaddr_in6 *)&t->bind_addr)->sin6_port = 0;
    if (uv_tcp_init(t->loop, &t->listener) < 0)
        return c10d__fail(C10D_EIO, "tcp: cannot create the listening socket");
    t->handles++;
    t->listening = 1;
    t->listener.data = t;
    int rc = uv_tcp_bind(&t->listener, (struct sockaddr *)&t->bind_addr, 0);
    if (rc == 0 && t->cfg.socket_buffer > 0) {
        int v = t->cfg.socket_buffer;
        uv_recv_buffer_size((uv_handle_t *)&t->listener, &v);
    }
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&t->listener, t->cfg.size + 64, on_connection);
    if (rc < 0)
        return c10d__fail(C10D_EIO, "tcp: cannot listen: %s", uv_strerror(rc));
    return 0;
}

static int format_address(struct c10d__tcp_transport *t)
{
    struct sockaddr_storage ss;
    int len = sizeof ss;
    if (uv_tcp_getsockname(&t->listener, (struct sockaddr *)&ss, &len) < 0)
        return c10d__fail(C10D_EIO, "tcp: getsockname failed");
    char ip[INET6_ADDRSTRLEN];
    if (ss.ss_family == AF_INET) {
        struct sockaddr_in *a = (struct sockaddr_in *)&ss;
        uv_ip4_name(a, ip, sizeof ip);
        snprintf(t->address, sizeof t->address, "%s:%d", ip, ntohs(a->sin_port));
    } else {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
        uv_ip6_name(a, ip, sizeof ip);
        snprintf(t->address, sizeof t->address, "[%s]:%d", ip, ntohs(a->sin6_port));
    }
    if (t->cfg.rank == 0)
        snprintf(t->published, sizeof t->published, "%s#%016llx", t->address,
                 (unsigned long long)t->job_id);
    else
        snprintf(t->published, sizeof t->published, "%s", t->address);
    return 0;
}

/* ------------------------------------------------------------- public */

int c10d__tcp_transport_new(const struct c10d__tcp_transport_config *cfg,
                            struct c10d__tcp_transport **out)
{
    *out = NULL;
    struct c10d__tcp_transport *t = calloc(1, sizeof *t);
    if (t == NULL || (t->peers = calloc((size_t)cfg->size, sizeof *t->peers)) == NULL) {
        free(t);
        return c10d__fail(C10D_ENOMEM, "tcp: out of memory");
    }
    t->cfg = *cfg;
    t->loop = c10d__engine_loop();
    for (int r = 0; r < cfg->size; r++)
        t->peers[r].rank = r;
    uv_timer_init(t->loop, &t->grace);
    t->grace.data = t;
    t->grace_open = 1;
    t->handles++;
    uv_timer_init(t->loop, &t->pending);
    t->pending.data = t;
    t->pending_open = 1;
    t->handles++;
    uv_timer_start(&t->pending, on_pending_tick, PENDING_TICK_MS, PENDING_TICK_MS);
    const uint8_t *token;
    int rc = c10d__token_get(&token, &t->token_len);
    if (rc < 0) {
        c10d__tcp_transport_free(t);
        return rc;
    }
    memcpy(t->token, token, t->token_len);
    if (cfg->rank == 0) {
        if (getrandom(&t->job_id, sizeof t->job_id, 0) != (ssize_t)sizeof t->job_id)
            t->job_id = uv_hrtime() ^ ((uint64_t)getpid() << 32);
        t->job_known = 1;
    }
    rc = start_listening(t);
    if (rc < 0) {
        c10d__tcp_transport_free(t);
        return rc;
    }
    rc = format_address(t);
    if (rc < 0) {
        c10d__tcp_transport_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

const char *c10d__tcp_transport_address(const struct c10d__tcp_transport *t)
{
    return t->published;
}

int c10d__tcp_transport_connect(struct c10d__tcp_transport *t, const char *const *addrs,
                                void (*ready)(void *arg, int status), void *arg)
{
    if (t->failed)
        return c10d__fail(C10D_EABORTED, "tcp: the transport was closed");
    t->addrs = calloc((size_t)t->cfg.size, sizeof *t->addrs);
    if (t->addrs == NULL)
        return c10d__fail(C10D_ENOMEM, "tcp: out of memory");
    for (int r = 0; r < t->cfg.size; r++) {
        struct sockaddr_storage ss;
        const char *a = addrs[r] != NULL ? addrs[r] : "(null)";
        size_t len = strcspn(a, "#");
        if ((t->addrs[r] = strndup(a, len)) == NULL)
            return c10d__fail(C10D_ENOMEM, "tcp: out of memory");
        if (addrs[r] == NULL || parse_addr(t->addrs[r], &ss) != 0)
            return c10d__fail(C10D_EINVAL, "tcp: rank %d's address '%s' is not host:port", r, a);
        /* Rank 0 publishes the job id after its address. */
        if (r == 0 && t->cfg.rank != 0) {
            char *end = NULL;
            unsigned long long id = a[len] == '#' ? strtoull(a + len + 1, &end, 16) : 0;
            if (a[len] != '#' || end == a + len + 1 || *end != '\0')
                return c10d__fail(C10D_EINVAL,
                                  "tcp: rank 0's address '%s' carries no job id (a rank of an "
                                  "older libc10d, or the store entry was overwritten)",
                                  a);
            t->job_id = id;
            t->job_known = 1;
        }
    }
    /* Hellos that arrived before the job id was known are answered now. */
    for (struct conn *c = t->conns, *next; c != NULL; c = next) {
        next = c->all_next;
        if (c->parked && c->state == C_HELLO)
            accept_hello(c);
    }
    t->ready = ready;
    t->ready_arg = arg;
    uv_timer_init(t->loop, &t->deadline);
    t->handles++;
    t->deadline_open = 1;
    t->deadline.data = t;
    if (t->cfg.lazy) {
        /* Ready at once, but never inside this call. */
        uv_timer_start(&t->deadline, on_deadline, 0, 0);
        return 0;
    }
    uint64_t timeout = t->cfg.timeout_ms > 0 ? (uint64_t)t->cfg.timeout_ms : 30u * 60 * 1000;
    uv_timer_start(&t->deadline, on_deadline, timeout, 0);
    /* The higher rank of each pair connects, so no two connections race. */
    for (int r = 0; r < t->cfg.rank; r++)
        peer_connect(t, r);
    /* Peers may all have connected before we were asked (they only need our
     * listening socket): then we are ready now, reported on a later turn. */
    if (t->nready >= t->cfg.size - 1)
        uv_timer_start(&t->deadline, on_deadline, 0, 0);
    return 0;
}

int c10d__tcp_transport_failed(const struct c10d__tcp_transport *t)
{
    return t->failed;
}

/* Connection setup ends with the transport: its waiter hears why. */
static void ready_fail(struct c10d__tcp_transport *t, int status, const char *message)
{
    if (t->ready_called || t->ready == NULL)
        return;
    t->ready_called = 1;
    c10d__fail(status, "%s", message);
    t->ready(t->ready_arg, status);
}

/* Best effort: a last frame to every ready peer with nothing queued, so a peer
 * still waiting on us learns at once why we are going. */
static void tell_idle_peers(struct c10d__tcp_transport *t, uv_buf_t *bufs, unsigned nbufs)
{
    for (struct conn *c = t->conns; c != NULL; c = c->all_next)
        if (c->state == C_READY && uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp) == 0)
            uv_try_write((uv_stream_t *)&c->tcp, bufs, nbufs);
}

/* Closes every connection, the listener and the timers. */
static void close_all_handles(struct c10d__tcp_transport *t)
{
    for (struct conn *c = t->conns; c != NULL; c = c->all_next)
        conn_close(c);
    if (t->listening) {
        t->listening = 0;
        uv_close((uv_handle_t *)&t->listener, on_handle_closed);
    }
    if (t->deadline_open) {
        t->deadline_open = 0;
        uv_close((uv_handle_t *)&t->deadline, on_handle_closed);
    }
    if (t->grace_open) {
        t->grace_open = 0;
        uv_close((uv_handle_t *)&t->grace, on_handle_closed);
    }
    if (t->pending_open) {
        t->pending_open = 0;
        uv_close((uv_handle_t *)&t->pending, on_handle_closed);
    }
}

void c10d__tcp_transport_fail(struct c10d__tcp_transport *t, int status, const char *message)
{
    if (t->failed)
        return;
    t->failed = 1;
    size_t mlen = strlen(message);
    if (mlen > ABORT_MSG_MAX)
        mlen = ABORT_MSG_MAX;
    unsigned char hdr[HDR_LEN];
    wire_encode(hdr, F_ABORT, 0, 0, 0, (uint64_t)(int64_t)status, mlen);
    uv_buf_t b[2] = {uv_buf_init((char *)hdr, HDR_LEN),
                     uv_buf_init((char *)message, (unsigned)mlen)};
    tell_idle_peers(t, b, 2);
    close_all_handles(t);
    ready_fail(t, status, message);
}

/* A clean goodbye: peers that still run ops among themselves carry on. */
static void transport_close_quietly(struct c10d__tcp_transport *t)
{
    unsigned char hdr[HDR_LEN];
    wire_encode(hdr, F_BYE, 0, 0, 0, 0, 0);
    uv_buf_t b = uv_buf_init((char *)hdr, HDR_LEN);
    tell_idle_peers(t, &b, 1);
    t->failed = 1;
    close_all_handles(t);
    ready_fail(t, C10D_EABORTED, "tcp: the group was closed during connection setup");
}

void c10d__tcp_transport_free(struct c10d__tcp_transport *t)
{
    if (!t->failed)
        transport_close_quietly(t);
    t->freeing = 1;
    if (t->handles > 0)
        return;
    for (struct c10d__tcp_xfer *x = t->all_xfers; x != NULL;) {
        struct c10d__tcp_xfer *next = x->all_next;
        free(x);
        x = next;
    }
    for (int r = 0; r < t->cfg.size; r++) {
        for (struct unexp *u = t->peers[r].unexp_head; u != NULL;) {
            struct unexp *next = u->next;
            free(u->data);
            free(u);
            u = next;
        }
        if (t->addrs != NULL)
            free(t->addrs[r]);
    }
    for (struct unexp *u = t->unexp_pool; u != NULL;) {
        struct unexp *next = u->next;
        free(u->data);
        free(u);
        u = next;
    }
    free(t->addrs);
    free(t->peers);
    free(t);
}
