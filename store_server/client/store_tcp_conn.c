/* The TCP store's connection: resolve, connect, handshake, keep it, and when
 * it fails try again with backoff for as long as ops wait for it; plus the
 * socket I/O (writes, reading replies into the parser) and the timers. What
 * the requests on it mean is store_tcp_pipeline.c's business; here an op is
 * at most the one awaiting a reply, which a broken connection takes with it
 * (C10D_ECLOSED) while the queued ops wait for the next connection until
 * their own deadlines.
 *
 * Dialect AUTO: connect and send VALIDATE + PING. PyTorch 1.13's server
 * resets the connection when it reads VALIDATE as a SET with a huge key, so
 * a connection that is closed (or a PING that is not answered within a few
 * seconds) before the handshake completes is retried in the legacy dialect,
 * whose handshake is a CHECK of zero keys (answered READY by every server).
 * The dialect found is kept for reconnects.
 */
#include "store_tcp_impl.h"

#include "engine/log.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TICK_MS           20
#define BACKOFF_FACTOR    1.5
#define BACKOFF_CAP_MS    5000.0
#define AUTO_HANDSHAKE_MS 3000
#define CANCEL_GRACE_MS   5000
/* A host name that does not resolve yet is retried (a Kubernetes service's
 * DNS record often appears seconds after the pod starts), with a warning
 * this often so that a name that never resolves is seen long before the
 * timeout. */
#define RESOLVE_WARN_MS 5000

struct conn {
    uv_tcp_t tcp;
    uv_connect_t creq;
    struct tcp_store *ts;
};

struct write_req {
    uv_write_t req;
    struct c10d__store_op *op; /* finished when written (no reply) or NULL */
    struct tcp_store *ts;
    struct conn *conn;
    uint8_t *data;
};

static void start_attempt(struct tcp_store *ts);
static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf);

static const char *dialect_name(int d)
{
    return d == C10D_STORE_DIALECT_LEGACY ? "legacy (1.13)" : "current";
}

/* ------------------------------------------------------------- timers */

static void on_tick(uv_timer_t *t);

static void ensure_timers(struct tcp_store *ts)
{
    if (ts->timers_open)
        return;
    uv_timer_init(c10d__engine_loop(), &ts->timer);
    uv_timer_init(c10d__engine_loop(), &ts->tick);
    ts->timer.data = ts->tick.data = ts;
    ts->timers_open = 2;
    c10d__store_ref(&ts->base);
}

void c10d__store_tcp_ensure_tick(struct tcp_store *ts)
{
    ensure_timers(ts);
    if (!ts->tick_running) {
        uv_timer_start(&ts->tick, on_tick, TICK_MS, TICK_MS);
        ts->tick_running = 1;
    }
}

static void on_timer_closed(uv_handle_t *h)
{
    struct tcp_store *ts = h->data;
    if (--ts->timers_open == 0)
        c10d__store_unref(&ts->base);
}

void c10d__store_tcp_close_timers(struct tcp_store *ts)
{
    if (ts->timers_open != 2 || uv_is_closing((uv_handle_t *)&ts->timer))
        return;
    ts->tick_running = 0;
    uv_close((uv_handle_t *)&ts->timer, on_timer_closed);
    uv_close((uv_handle_t *)&ts->tick, on_timer_closed);
}

/* The tick: deadlines of queued ops, of the op on the wire, of a cancel, of
 * the handshake. */
static void on_tick(uv_timer_t *t)
{
    struct tcp_store *ts = t->data;
    uint64_t now = c10d__now_ms();
    ts->requests->expire(ts, now);
    if (ts->cancelling && now >= ts->cancel_deadline)
        c10d__store_tcp_drop_conn(ts, C10D_ECLOSED, "no WAIT_CANCELED from the server");
    if (ts->state == ST_HANDSHAKE && ts->handshake_deadline && now >= ts->handshake_deadline)
        c10d__store_tcp_drop_conn(ts, C10D_ETIMEDOUT, "no answer to the handshake");
    if (!has_work(ts) && !ts->cancelling && ts->tick_running && ts->state != ST_HANDSHAKE) {
        uv_timer_stop(&ts->tick);
        ts->tick_running = 0;
        /* Nobody is waiting for a connection any more. */
        if (ts->state == ST_BACKOFF) {
            uv_timer_stop(&ts->timer);
            ts->state = ST_DOWN;
        }
    }
    c10d__store_tcp_kick(ts);
}

/* ---------------------------------------------------------- connection */

static void on_conn_closed(uv_handle_t *h)
{
    struct conn *c = h->data;
    struct tcp_store *ts = c->ts;
    free(c);
    c10d__store_unref(&ts->base);
}

void c10d__store_tcp_close_conn(struct tcp_store *ts)
{
    struct conn *c = ts->conn;
    ts->conn = NULL;
    if (c && !uv_is_closing((uv_handle_t *)&c->tcp))
        uv_close((uv_handle_t *)&c->tcp, on_conn_closed);
    ts->rlen = 0;
    ts->cancelling = 0;
    ts->handshake_deadline = 0;
}

static void schedule_retry(struct tcp_store *ts);

void c10d__store_tcp_drop_conn(struct tcp_store *ts, int status, const char *why)
{
    int was_handshake = ts->state == ST_HANDSHAKE;
    c10d__store_tcp_close_conn(ts);
    struct c10d__store_op *op = ts->inflight;
    ts->inflight = NULL;
    if (was_handshake) {
        int awaiting_auth = ts->awaiting_auth;
        ts->awaiting_auth = 0;
        /* AUTO: a server that will not take VALIDATE is probably 1.13 (which
         * cannot check a token: with one there is nothing to fall back to). */
        if (ts->want == C10D_DIALECT_AUTO && ts->trying == C10D_STORE_DIALECT_CURRENT &&
            !ts->dialect && !ts->token_len) {
            C10D_INFO("store",
                      "tcp %s: current-dialect handshake failed (%s); trying the 1.13 "
                      "dialect",
                      ts->name, why);
            ts->trying = C10D_STORE_DIALECT_LEGACY;
            ts->state = ST_DOWN;
            if (op)
                ts->requests->requeue(ts, op); /* never on the wire */
            start_attempt(ts);
            return;
        }
        const char *hint = "";
        if (ts->token_len && awaiting_auth)
            hint = "; it closed before answering AUTH: a store that is not libc10d's "
                   "(PyTorch's) cannot take the token";
        else if (!ts->token_len)
            hint = "; a store that requires a token closes connections without one "
                   "(C10D_STORE_TOKEN)";
        snprintf(ts->last_error, sizeof ts->last_error,
                 "protocol mismatch: the server did not answer the %s handshake (%s)%s",
                 dialect_name(ts->trying), why, hint);

        if (ts->want == C10D_DIALECT_AUTO && !ts->dialect)
            ts->trying = C10D_STORE_DIALECT_CURRENT;
        ts->state = ST_DOWN;
        schedule_retry(ts);
        return;
    }
    ts->state = ST_DOWN;
    if (op) {
        const char *hint = op->req.cmd == C10D_STORE_ADD
                               ? " (the server closes the connection on errors, e.g. ADD on a "
                                 "value that is not an integer)"
                               : "";
        c10d__store_op_finish(op, status, "store tcp %s %s: %s%s", ts->name,
                              c10d__store_tcp_op_name(op), why, hint);
    }
    if (ts->head)
        start_attempt(ts);
}

static void on_backoff(uv_timer_t *t)
{
    struct tcp_store *ts = t->data;
    if (ts->state == ST_BACKOFF) {
        ts->state = ST_DOWN;
        if (ts->head)
            start_attempt(ts);
    }
}

static void schedule_retry(struct tcp_store *ts)
{
    if (!ts->head) {
        ts->state = ST_DOWN;
        return;
    }
    /* Jitter spreads thousands of ranks that lost the server at once. */
    double jitter = 0.75 + 0.5 * ((double)rand() / RAND_MAX);
    uint64_t delay = (uint64_t)(ts->backoff_ms * jitter);
    ts->backoff_ms *= BACKOFF_FACTOR;
    if (ts->backoff_ms > BACKOFF_CAP_MS)
        ts->backoff_ms = BACKOFF_CAP_MS;
    ensure_timers(ts);
    ts->state = ST_BACKOFF;
    uv_timer_start(&ts->timer, on_backoff, delay, 0);
}

static void attempt_failed(struct tcp_store *ts, const char *what, int uv_err)
{
    if (uv_err == UV_ECONNREFUSED)
        snprintf(ts->last_error, sizeof ts->last_error, "connection refused (ECONNREFUSED)");
    else
        snprintf(ts->last_error, sizeof ts->last_error, "%s: %s (%s)", what, uv_strerror(uv_err),
                 uv_err_name(uv_err));
    C10D_DEBUG("store", "tcp %s: attempt %d: %s", ts->name, ts->attempts, ts->last_error);
    ts->state = ST_DOWN;
    schedule_retry(ts);
}

/* The resolver has no address for the host (yet): retried like a refused
 * connection, until the waiting ops' deadlines, warning every few seconds. */
static void resolve_failed(struct tcp_store *ts, int uv_err)
{
    uint64_t now = c10d__now_ms();
    if (ts->resolve_warned_ms == 0 || now - ts->resolve_warned_ms >= RESOLVE_WARN_MS) {
        ts->resolve_warned_ms = now;
        uint64_t deadline = ts->head ? ts->head->deadline_ms : 0;
        C10D_WARN("store",
                  "tcp %s: cannot resolve '%s': %s (%s); retrying for up to %llu s more (the "
                  "name may not be published yet)",
                  ts->name, ts->host, uv_strerror(uv_err), uv_err_name(uv_err),
                  (unsigned long long)(deadline > now ? (deadline - now + 999) / 1000 : 0));
    }
    attempt_failed(ts, "resolve host", uv_err);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    struct conn *c = h->data;
    struct tcp_store *ts = c->ts;
    size_t want = suggested < 65536 ? 65536 : suggested;
    if (ts->rp.need > want)
        want = ts->rp.need;
    if (ts->rcap - ts->rlen < want) {
        size_t cap = ts->rlen + want;
        uint8_t *p = realloc(ts->rbuf, cap);
        if (!p) {
            *buf = uv_buf_init(NULL, 0);
            return;
        }
        ts->rbuf = p;
        ts->rcap = cap;
    }
    *buf = uv_buf_init((char *)ts->rbuf + ts->rlen, (unsigned)(ts->rcap - ts->rlen));
}

static void send_handshake(struct tcp_store *ts)
{
    struct c10d__wire_buf b = {0};
    c10d__wire_reply_parser_free(&ts->rp);
    struct c10d__wire_codec_limits lim = {0};
    c10d__wire_reply_parser_init(&ts->rp, &lim);
    if (ts->trying == C10D_STORE_DIALECT_CURRENT) {
        struct c10d__wire_request v = {.cmd = C10D_STORE_VALIDATE, .u32 = C10D_STORE_MAGIC};
        struct c10d__wire_request p = {.cmd = C10D_STORE_PING, .u32 = ts->nonce};
        c10d__wire_encode_request(&b, ts->trying, &v);
        ts->awaiting_auth = 0;
        if (ts->token_len) {
            struct c10d__wire_str t = {ts->token, ts->token_len};
            struct c10d__wire_request a = {.cmd = C10D_STORE_AUTH, .nargs = 1, .args = &t};
            c10d__wire_encode_request(&b, ts->trying, &a);
            ts->awaiting_auth = 1;
        }
        c10d__wire_encode_request(&b, ts->trying, &p);
        c10d__wire_reply_expect(&ts->rp, ts->token_len ? C10D_STORE_AUTH : C10D_STORE_PING, 0);
    } else {
        struct c10d__wire_request c = {.cmd = C10D_STORE_CHECK};
        c10d__wire_encode_request(&b, ts->trying, &c);
        c10d__wire_reply_expect(&ts->rp, C10D_STORE_CHECK, 0);
    }
    ts->state = ST_HANDSHAKE;
    ts->handshake_deadline =
        ts->want == C10D_DIALECT_AUTO && !ts->dialect ? c10d__now_ms() + AUTO_HANDSHAKE_MS : 0;
    c10d__store_tcp_ensure_tick(ts);
    c10d__store_tcp_send_bytes(ts, &b, NULL);
}

static void try_next_addr(struct tcp_store *ts, int last_err);

static void on_connect(uv_connect_t *req, int status)
{
    struct conn *c = req->data;
    struct tcp_store *ts = c->ts;
    if (c != ts->conn || ts->closed)
        return; /* abandoned: its close is already under way */
    if (status < 0) {
        c10d__store_tcp_close_conn(ts);
        try_next_addr(ts, status);
        return;
    }
    uv_freeaddrinfo(ts->addrs);
    ts->addrs = ts->next_addr = NULL;
    uv_tcp_nodelay(&c->tcp, 1);
    uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
    send_handshake(ts);
}

static void try_next_addr(struct tcp_store *ts, int last_err)
{
    struct addrinfo *ai = ts->next_addr;
    if (!ai) {
        uv_freeaddrinfo(ts->addrs);
        ts->addrs = ts->next_addr = NULL;
        attempt_failed(ts, "connect", last_err);
        return;
    }
    ts->next_addr = ai->ai_next;
    struct conn *c = calloc(1, sizeof *c);
    if (!c) {
        attempt_failed(ts, "connect", UV_ENOMEM);
        return;
    }
    c->ts = ts;
    uv_tcp_init(c10d__engine_loop(), &c->tcp);
    c->tcp.data = c;
    c->creq.data = c;
    c10d__store_ref(&ts->base);
    ts->conn = c;
    ts->state = ST_CONNECTING;
    int rc = uv_tcp_connect(&c->creq, &c->tcp, ai->ai_addr, on_connect);
    if (rc < 0) {
        c10d__store_tcp_close_conn(ts);
        try_next_addr(ts, rc);
    }
}

static void on_resolved(uv_getaddrinfo_t *req, int status, struct addrinfo *res)
{
    struct tcp_store *ts = req->data;
    if (ts->closed || ts->state != ST_RESOLVING) {
        uv_freeaddrinfo(res);
        c10d__store_unref(&ts->base);
        return;
    }
    c10d__store_unref(&ts->base);
    if (status < 0) {
        resolve_failed(ts, status);
        return;
    }
    if (ts->resolve_warned_ms != 0) {
        C10D_INFO("store", "tcp %s: '%s' resolves now", ts->name, ts->host);
        ts->resolve_warned_ms = 0;
    }
    ts->addrs = ts->next_addr = res;
    try_next_addr(ts, UV_ECONNREFUSED);
}

static void start_attempt(struct tcp_store *ts)
{
    if (ts->closed || ts->state != ST_DOWN)
        return;
    ts->attempts++;
    ts->state = ST_RESOLVING;
    char port[16];
    snprintf(port, sizeof port, "%d", ts->port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    ts->gai.data = ts;
    c10d__store_ref(&ts->base);
    int rc = uv_getaddrinfo(c10d__engine_loop(), &ts->gai, on_resolved, ts->host, port, &hints);
    if (rc < 0) {
        c10d__store_unref(&ts->base);
        resolve_failed(ts, rc);
    }
}

/* --------------------------------------------------------------- writing */

static void on_written(uv_write_t *req, int status)
{
    struct write_req *w = (struct write_req *)req;
    struct c10d__store_op *op = w->op;
    struct tcp_store *ts = w->ts;
    free(w->data);
    free(w);
    if (!op)
        return;
    if (status < 0)
        c10d__store_op_finish(op, C10D_ECLOSED, "store tcp %s %s: connection lost: %s",
                              ts ? ts->name : "?", c10d__store_tcp_op_name(op),
                              uv_strerror(status));
    else
        c10d__store_op_finish(op, 0, NULL);
}

void c10d__store_tcp_send_bytes(struct tcp_store *ts, struct c10d__wire_buf *b,
                                struct c10d__store_op *op)
{
    struct write_req *w = calloc(1, sizeof *w);
    if (!w) {
        c10d__wire_buf_free(b);
        if (op)
            c10d__store_op_finish(op, C10D_ENOMEM, "store tcp %s: out of memory", ts->name);
        c10d__store_tcp_drop_conn(ts, C10D_ENOMEM, "out of memory");
        return;
    }
    w->op = op;
    w->ts = ts;
    w->conn = ts->conn;
    w->data = b->data;
    uv_buf_t ub = uv_buf_init((char *)b->data, (unsigned)b->len);
    int rc = uv_write(&w->req, (uv_stream_t *)&ts->conn->tcp, &ub, 1, on_written);
    if (rc < 0) {
        free(w->data);
        free(w);
        if (op)
            c10d__store_op_finish(op, C10D_ECLOSED, "store tcp %s %s: write: %s", ts->name,
                                  c10d__store_tcp_op_name(op), uv_strerror(rc));
        c10d__store_tcp_drop_conn(ts, C10D_ECLOSED, "write failed");
    }
}

void c10d__store_tcp_send_cancel(struct tcp_store *ts, uint64_t now)
{
    struct c10d__wire_request req = {.cmd = C10D_STORE_CANCEL_WAIT};
    struct write_req *w = calloc(1, sizeof *w);
    struct c10d__wire_buf b = {0};
    if (w && c10d__wire_encode_request(&b, ts->dialect, &req) == 0) {
        w->ts = ts;
        w->conn = ts->conn;
        w->data = b.data;
        uv_buf_t ub = uv_buf_init((char *)b.data, (unsigned)b.len);
        if (uv_write(&w->req, (uv_stream_t *)&ts->conn->tcp, &ub, 1, on_written) == 0) {
            ts->cancelling = 1;
            ts->cancel_deadline = now + CANCEL_GRACE_MS;
            c10d__wire_reply_expect(&ts->rp, C10D_STORE_CANCEL_WAIT, 0);
        } else {
            free(b.data);
            free(w);
        }
    } else {
        free(w);
        c10d__wire_buf_free(&b);
    }
}

void c10d__store_tcp_kick(struct tcp_store *ts)
{
    if (ts->closed)
        return;
    if (ts->state == ST_DOWN && ts->head)
        start_attempt(ts);
    else if (ts->state == ST_READY)
        ts->requests->pump(ts);
}

/* --------------------------------------------------------------- reading */

static void handshake_done(struct tcp_store *ts, const struct c10d__wire_reply *r)
{
    if (ts->trying == C10D_STORE_DIALECT_CURRENT && r->u32 != ts->nonce) {
        c10d__store_tcp_drop_conn(ts, C10D_EPROTO, "PING answered with a different nonce");
        return;
    }
    if (ts->trying == C10D_STORE_DIALECT_LEGACY && r->u8 != C10D_STORE_READY) {
        c10d__store_tcp_drop_conn(ts, C10D_EPROTO, "CHECK of no keys not answered READY");
        return;
    }
    if (ts->dialect != ts->trying)
        C10D_INFO("store", "tcp %s: connected, %s dialect", ts->name, dialect_name(ts->trying));
    ts->dialect = ts->trying;
    /* Kept for c10d__store_route: the address the route to the store leaves
     * this host from (a NAT in between changes the far end, not this one). */
    int len = sizeof ts->local_addr;
    if (uv_tcp_getsockname(&ts->conn->tcp, (struct sockaddr *)&ts->local_addr, &len) < 0)
        memset(&ts->local_addr, 0, sizeof ts->local_addr);
    ts->base.dialect =
        ts->dialect == C10D_STORE_DIALECT_LEGACY ? C10D_DIALECT_LEGACY : C10D_DIALECT_CURRENT;
    ts->state = ST_READY;
    ts->handshake_deadline = 0;
    ts->attempts = 0;
    ts->last_error[0] = 0;
    ts->backoff_ms = BACKOFF_START_MS;
}

/* A wrong token does not get better by retrying: fail what waits now. */
static void auth_refused(struct tcp_store *ts)
{
    const char *why = "the store closed the connection: it refused the token presented "
                      "(C10D_STORE_TOKEN or C10D_STORE_TOKEN_FILE differs from the store's)";
    C10D_WARN("store", "tcp %s: %s", ts->name, why);
    snprintf(ts->last_error, sizeof ts->last_error, "%s", why);
    ts->state = ST_DOWN;
    c10d__store_tcp_close_conn(ts);
    struct c10d__store_op *op = ts->inflight;
    ts->inflight = NULL;
    if (op)
        c10d__store_op_finish(op, C10D_ECLOSED, "store tcp %s %s: %s", ts->name,
                              c10d__store_tcp_op_name(op), why);
    ts->requests->fail_queue(ts, C10D_ECLOSED, why);
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    (void)buf;
    struct conn *c = s->data;
    struct tcp_store *ts = c->ts;
    if (c != ts->conn)
        return;
    if (n < 0) {
        char why[160];
        if (n == UV_EOF)
            snprintf(why, sizeof why, "connection closed by the server");
        else
            snprintf(why, sizeof why, "connection lost: %s", uv_strerror((int)n));
        c10d__store_tcp_drop_conn(ts, C10D_ECLOSED, why);
        return;
    }
    ts->rlen += (size_t)n;
    size_t off = 0;
    while (off < ts->rlen && ts->conn == c) {
        int expecting = ts->state == ST_HANDSHAKE || ts->cancelling || ts->inflight;
        if (!expecting) {
            c10d__store_tcp_drop_conn(ts, C10D_EPROTO,
                                      "protocol mismatch: the server sent bytes nobody asked for");
            return;
        }
        struct c10d__wire_reply r;
        size_t used = 0;
        int rc = c10d__wire_parse_reply(&ts->rp, ts->rbuf + off, ts->rlen - off, &r, &used);
        if (rc == C10D_STORE_PARSE_MORE)
            break;
        if (rc < 0) {
            char why[220];
            snprintf(why, sizeof why, "protocol mismatch: %s", ts->rp.error);
            c10d__store_tcp_drop_conn(ts, C10D_EPROTO, why);
            return;
        }
        off += used;
        if (ts->state == ST_HANDSHAKE && ts->awaiting_auth) {
            ts->awaiting_auth = 0;
            if (r.u8 != C10D_STORE_AUTH_OK) {
                auth_refused(ts);
                return;
            }
            c10d__wire_reply_expect(&ts->rp, C10D_STORE_PING, 0);
        } else if (ts->state == ST_HANDSHAKE) {
            handshake_done(ts, &r);
        } else if (ts->cancelling) {
            if (r.u8 == C10D_STORE_WAIT_CANCELED)
                ts->cancelling = 0;
            else /* the STOP_WAITING that raced the cancel */
                c10d__wire_reply_expect(&ts->rp, C10D_STORE_CANCEL_WAIT, 0);
        } else {
            ts->requests->handle_reply(ts, &r);
        }
    }
    if (ts->conn != c)
        return;
    /* Keep the unfinished reply at the front (the parser counts from it). */
    if (off) {
        memmove(ts->rbuf, ts->rbuf + off, ts->rlen - off);
        ts->rlen -= off;
    }
    c10d__store_tcp_kick(ts);
}

const char *c10d__store_tcp_op_name(const struct c10d__store_op *op)
{
    switch (op->req.cmd) {
    case C10D_STORE_VALIDATE:
        return "connect";
    case C10D_STORE_GETNUMKEYS:
        return "num_keys";
    default: {
        static _Thread_local char buf[32];
        const char *n = c10d__wire_cmd_name(op->req.cmd);
        size_t i = 0;
        for (; n[i] && i < sizeof buf - 1; i++)
            buf[i] = (char)(n[i] >= 'A' && n[i] <= 'Z' ? n[i] + 32 : n[i]);
        buf[i] = 0;
        return buf;
    }
    }
}
