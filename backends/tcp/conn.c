/* Connections: one per peer pair, from connect (or accept) to close. Attempts
 * that fail are retried until the group's deadline, a connection that breaks
 * fails the transport after a short grace period, and timers bound how long
 * connection setup and unfinished hellos may take. Kept apart from the
 * messages: here a connection is a stream to a rank, or the news that there
 * is none; what travels on it is wire.c's and match.c's business. */
#include "transport_impl.h"

#include "engine/log.h"
#include "engine/loop.h"

#include <arpa/inet.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STRANGER_LOG_MS 1000

/* Connect attempts that keep failing this long are worth a warning naming
 * the address: a bad published address otherwise looks like a hang. */
#define CONNECT_WARN_MS  2000
#define CONNECT_WARN_GAP 10000
#define CONNECT_RETRY_MS 10
/* While attempts to a peer fail, its address is looked up again this often:
 * the one read may be an earlier job's (a store that outlived it). */
#define REREAD_MS 200
/* How long a broken connection waits for more news before the transport
 * fails: when rank A dies, rank B may notice first and close its connection
 * to us; waiting a moment lets our own connection to A report too, so the
 * message names the rank that died, not only the one that gave up. */
#define LOST_GRACE_MS 100

struct retry {
    uv_timer_t timer;
    struct c10d__tcp_transport *t;
    int rank;
};

/* -------------------------------------------------------------- loss */

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
        c10d__tcp_error(t, C10D_ECLOSED,
                        "tcp: connection to rank %d lost (the peer process died or left the group)",
                        t->first_lost);
    else
        c10d__tcp_error(
            t, C10D_ECLOSED,
            "tcp: connection to rank %d lost (the peer process died or left the group); "
            "rank%s %s closed %s connection%s within %d ms after it (likely failing on "
            "the same loss)",
            t->first_lost, n > 1 ? "s" : "", later, n > 1 ? "their" : "its", n > 1 ? "s" : "",
            LOST_GRACE_MS);
}

void c10d__tcp_peer_lost(struct c10d__tcp_transport *t, int rank, int err)
{
    if (t->failed)
        return;
    struct peer *pe = &t->peers[rank];
    C10D_DEBUG("tcp", "rank %d: connection to rank %d lost: %s", t->cfg.rank, rank,
               err == UV_EOF ? "closed by the peer" : uv_strerror(err));
    pe->lost = 1;
    if (pe->conn != NULL)
        c10d__tcp_conn_close(pe->conn);
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

void c10d__tcp_conn_lost(struct conn *c, ssize_t err)
{
    struct c10d__tcp_transport *t = c->t;
    if (c->state == C_READY && c->bye && !peer_waited_on(t, &t->peers[c->rank]))
        c10d__tcp_conn_close(c);
    else if (c->state == C_READY && c->bye)
        c10d__tcp_error(t, C10D_ECLOSED, "tcp: rank %d left the group while this rank waits on it",
                        c->rank);
    else if (c->state == C_READY)
        c10d__tcp_peer_lost(t, c->rank, (int)err);
    else if (c->initiator && c->rank >= 0 && t->cfg.lazy)
        c10d__tcp_conn_close(c); /* the peer refused: its own connection wins */
    else if (c->initiator && c->rank >= 0) {
        /* Not a peer of the group's yet: whoever listens there hung up. */
        int rank = c->rank;
        char why[128];
        snprintf(why, sizeof why, "closed during the handshake: %s", uv_strerror((int)err));
        c10d__tcp_conn_close(c);
        c10d__tcp_connect_failed(t, rank, why);
    } else
        c10d__tcp_conn_close(c);
}

/* --------------------------------------------------------- lifecycle */

/* A connection that never became one of the group's: close it, and say so at
 * most once a second, so a flood of strangers costs a log line, never the
 * group. */
void c10d__tcp_drop_stranger(struct conn *c, const char *fmt, ...)
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
    c10d__tcp_conn_close(c);
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
    c10d__tcp_handle_closed(t);
}

void c10d__tcp_conn_close(struct conn *c)
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

/* -------------------------------------------------------- connecting */

static void on_retry_closed(uv_handle_t *h)
{
    struct retry *r = h->data;
    struct c10d__tcp_transport *t = r->t;
    free(r);
    c10d__tcp_handle_closed(t);
}

static void on_retry(uv_timer_t *tm)
{
    struct retry *r = tm->data;
    struct peer *pe = &r->t->peers[r->rank];
    /* This timer is the retry: clear its placeholder first, or a timer that
     * fires a hair before retry_at (the loop's clock is coarser than ours)
     * makes c10d__tcp_peer_connect believe an attempt is in progress, and retries end
     * for good. */
    if (pe->connecting == (struct conn *)r) {
        pe->connecting = NULL;
        pe->retry_at = 0;
    }
    if (!r->t->failed)
        c10d__tcp_peer_connect(r->t, r->rank);
    uv_close((uv_handle_t *)&r->timer, on_retry_closed);
}

/* An attempt to connect to `rank` failed: retry until the deadline, which
 * the transport's timer enforces (the peer may not listen yet, be briefly
 * overloaded, or lazy), and ask the owner to look its address up again
 * (it may have been an earlier job's). A streak of failures is worth a
 * warning naming the address, since a bad published address otherwise looks
 * like a hang. */
void c10d__tcp_connect_failed(struct c10d__tcp_transport *t, int rank, const char *why)
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
                  t->cfg.rank, rank, t->addrs[rank] != NULL ? t->addrs[rank] : "?",
                  (unsigned long long)(now - pe->connect_fail_since), why);
        pe->connect_warned_at = now;
    }
    struct retry *r = calloc(1, sizeof *r);
    if (r == NULL || uv_timer_init(t->loop, &r->timer) < 0) {
        free(r);
        c10d__tcp_error(t, C10D_ENOMEM, "tcp: out of memory");
        return;
    }
    t->handles++;
    r->t = t;
    r->rank = rank;
    r->timer.data = r;
    pe->connecting = (struct conn *)r; /* a placeholder: "in progress" */
    pe->retry_at = now + CONNECT_RETRY_MS;
    C10D_DEBUG("tcp", "rank %d: connecting to rank %d at %s: %s; retrying", t->cfg.rank, rank,
               t->addrs[rank] != NULL ? t->addrs[rank] : "?", why);
    uv_timer_start(&r->timer, on_retry, CONNECT_RETRY_MS, 0);
    if (t->reread != NULL && now - pe->reread_at >= REREAD_MS) {
        pe->reread_at = now;
        t->reread(t->reread_arg, rank);
    }
}

static void on_connected(uv_connect_t *req, int status)
{
    struct conn *c = req->data;
    struct c10d__tcp_transport *t = c->t;
    if (c->state == C_CLOSED || t->failed)
        return;
    if (status < 0) {
        int rank = c->rank;
        c10d__tcp_conn_close(c);
        c10d__tcp_connect_failed(t, rank, uv_strerror(status));
        return;
    }
    tune_socket(t, &c->tcp);
    c->state = C_HELLO;
    size_t n = t->up->hello_encode(t, c->hello_out, 0);
    uv_buf_t b = uv_buf_init((char *)c->hello_out, (unsigned)n);
    int rc = uv_read_start((uv_stream_t *)&c->tcp, t->up->alloc, t->up->read);
    if (rc == 0)
        rc = uv_write(&c->hello_req, (uv_stream_t *)&c->tcp, &b, 1, NULL);
    if (rc < 0) {
        int rank = c->rank;
        char why[128];
        snprintf(why, sizeof why, "sending the handshake failed: %s", uv_strerror(rc));
        c10d__tcp_conn_close(c);
        c10d__tcp_connect_failed(t, rank, why);
    }
}

int c10d__tcp_parse_addr(const char *text, struct sockaddr_storage *ss)
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

void c10d__tcp_peer_connect(struct c10d__tcp_transport *t, int rank)
{
    struct peer *pe = &t->peers[rank];
    if (t->failed || pe->conn != NULL || t->addrs == NULL || pe->lost)
        return;
    if (pe->connecting != NULL && (pe->retry_at == 0 || c10d__now_ms() < pe->retry_at))
        return;
    pe->retry_at = 0;
    pe->connecting = NULL;
    if (t->addrs[rank] == NULL) {
        /* Lazy: not read yet. The failure path asks for it and retries. */
        c10d__tcp_connect_failed(t, rank, "its address is being read from the store");
        return;
    }
    struct sockaddr_storage ss;
    if (c10d__tcp_parse_addr(t->addrs[rank], &ss) != 0) {
        c10d__tcp_error(t, C10D_EINVAL, "tcp: rank %d published an unusable address '%s'", rank,
                        t->addrs[rank]);
        return;
    }
    struct conn *c = conn_new(t, ss.ss_family);
    if (c == NULL) {
        c10d__tcp_error(t, C10D_ENOMEM, "tcp: cannot create a socket for rank %d", rank);
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
        c10d__tcp_error(t, C10D_EIO, "tcp: connecting to rank %d at %s failed: %s", rank,
                        t->addrs[rank], uv_strerror(rc));
}

/* --------------------------------------------------------- accepting */

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

void c10d__tcp_on_connection(uv_stream_t *server, int status)
{
    struct c10d__tcp_transport *t = server->data;
    if (status < 0 || t->failed) {
        if (status < 0)
            C10D_WARN("tcp", "rank %d: accept failed: %s", t->cfg.rank, uv_strerror(status));
        return;
    }
    struct conn *c = conn_new(t, 0);
    if (c == NULL) {
        c10d__tcp_error(t, C10D_ENOMEM, "tcp: out of memory accepting a connection");
        return;
    }
    if (uv_accept(server, (uv_stream_t *)&c->tcp) < 0) {
        c10d__tcp_conn_close(c);
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
        c10d__tcp_drop_stranger(
            oldest, "%d connections are waiting for their handshake; closing the oldest",
            pending + 1);
    if (uv_read_start((uv_stream_t *)&c->tcp, t->up->alloc, t->up->read) < 0)
        c10d__tcp_conn_close(c);
}

/* --------------------------------------------------------- deadlines */

/* Inbound connections that did not complete their hello in time. */
void c10d__tcp_on_pending_tick(uv_timer_t *tm)
{
    struct c10d__tcp_transport *t = tm->data;
    uint64_t limit = PENDING_HELLO_MS;
    if (t->cfg.timeout_ms > 0 && (uint64_t)t->cfg.timeout_ms < limit)
        limit = (uint64_t)t->cfg.timeout_ms;
    uint64_t now = c10d__now_ms();
    for (struct conn *c = t->conns, *next; c != NULL; c = next) {
        next = c->all_next;
        if (!c->initiator && c->state == C_HELLO && !c->parked && now - c->accepted_ms >= limit)
            c10d__tcp_drop_stranger(
                c, "no complete handshake within %llu ms (%zu bytes of it arrived)",
                (unsigned long long)limit, c->hello_have);
    }
}

void c10d__tcp_on_deadline(uv_timer_t *tm)
{
    struct c10d__tcp_transport *t = tm->data;
    if (t->ready_called)
        return;
    if (t->cfg.lazy || t->nmet >= t->cfg.size - 1) {
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
                                    t->addrs[r] != NULL ? t->addrs[r] : "?", pe->connect_error);
    }
    c10d__tcp_error(
        t, C10D_ETIMEDOUT,
        "tcp: connecting rank %d's peers timed out after %lld ms; not connected: rank %s",
        t->cfg.rank, (long long)t->cfg.timeout_ms, missing);
}
