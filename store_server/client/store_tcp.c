/* The TCPStore client on the engine loop (docs/store_client.md).
 *
 * One connection per store, one request awaiting a reply at a time, replies
 * in order; requests without a reply (SET, APPEND, ...) are written back to
 * back. GET, MULTI_GET and a blocking QUEUE_POP are WAIT then the command,
 * as PyTorch's client does.
 *
 * Deadlines: a tick timer runs while ops are pending. An op past its
 * deadline fails with C10D_ETIMEDOUT. If it was on the wire:
 *  - a WAIT in the current dialect is cancelled with CANCEL_WAIT; the
 *    connection stays in sync by reading the one or two bytes that follow
 *    (a STOP_WAITING that raced the cancel, then WAIT_CANCELED);
 *  - anything else (and every legacy WAIT: 1.13 has no CANCEL_WAIT) taints
 *    the connection: it is closed, and later ops use a new one, so a late
 *    reply can never be read as the answer to a later request.
 * A connection that fails takes its awaited op with it (C10D_ECLOSED); the
 * queued ops reconnect with backoff until their own deadlines.
 *
 * Dialect AUTO: connect and send VALIDATE + PING. PyTorch 1.13's server
 * resets the connection when it reads VALIDATE as a SET with a huge key, so
 * a connection that is closed (or a PING that is not answered within a few
 * seconds) before the handshake completes is retried in the legacy dialect,
 * whose handshake is a CHECK of zero keys (answered READY by every server).
 * The dialect found is kept for reconnects.
 */
#include "store.h"

#include "engine/log.h"
#include "engine/token.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TICK_MS           20
#define BACKOFF_START_MS  500.0
#define BACKOFF_FACTOR    1.5
#define BACKOFF_CAP_MS    5000.0
#define AUTO_HANDSHAKE_MS 3000
#define CANCEL_GRACE_MS   5000

enum conn_state {
    ST_DOWN = 0,  /* no connection; the next op connects */
    ST_RESOLVING, /* getaddrinfo */
    ST_CONNECTING,
    ST_HANDSHAKE, /* VALIDATE + PING (or legacy CHECK) sent */
    ST_READY,
    ST_BACKOFF, /* waiting before the next attempt */
};

/* Phases of an op on the wire. */
enum { PH_MAIN = 0, PH_WAIT, PH_CHECK_EMPTY };

struct tcp_store;

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

struct tcp_store {
    c10d_store base;
    char *host;
    int port;
    char name[300]; /* "host:port" for messages */
    int want;       /* requested c10d_store_dialect */
    int trying;     /* codec dialect of the current attempt */
    int dialect;    /* codec dialect once a handshake succeeded (0: none yet) */
    enum conn_state state;
    struct conn *conn;
    uv_getaddrinfo_t gai;
    struct addrinfo *addrs, *next_addr;
    uv_timer_t timer; /* backoff and handshake */
    uv_timer_t tick;  /* op deadlines */
    int timers_open;
    int tick_running;
    int attempts;
    double backoff_ms;
    char last_error[400];
    uint32_t nonce;
    uint64_t handshake_deadline;
    /* The job's secret, presented with AUTH after VALIDATE (len 0: none). */
    uint8_t token[C10D_TOKEN_MAX];
    size_t token_len;
    int awaiting_auth; /* handshake: AUTH's verdict not read yet */
    /* requests */
    struct c10d__store_op *head, *tail; /* not yet on the wire */
    struct c10d__store_op *inflight;    /* awaiting its reply */
    uint64_t sent_ns;
    int cancelling; /* CANCEL_WAIT sent, WAIT_CANCELED not yet read */
    uint64_t cancel_deadline;
    struct c10d__store_reply_parser rp;
    uint8_t *rbuf;
    size_t rlen, rcap;
    int closed;
    struct c10d__shutdown_hook hook;
    int hook_registered;
};

#define KEYF    "'%.*s'"
#define KEYA(s) (int)((s).len > 200 ? 200 : (s).len), (const char *)(s).data

static void kick(struct tcp_store *ts);
static void start_attempt(struct tcp_store *ts);
static void drop_conn(struct tcp_store *ts, int status, const char *why);

static const char *op_name(const struct c10d__store_op *op)
{
    switch (op->req.cmd) {
    case C10D_STORE_VALIDATE:
        return "connect";
    case C10D_STORE_GETNUMKEYS:
        return "num_keys";
    default: {
        static _Thread_local char buf[32];
        const char *n = c10d__store_cmd_name(op->req.cmd);
        size_t i = 0;
        for (; n[i] && i < sizeof buf - 1; i++)
            buf[i] = (char)(n[i] >= 'A' && n[i] <= 'Z' ? n[i] + 32 : n[i]);
        buf[i] = 0;
        return buf;
    }
    }
}

static const char *dialect_name(int d)
{
    return d == C10D_STORE_DIALECT_LEGACY ? "legacy (1.13)" : "current";
}

/* ------------------------------------------------------------ the queue */

static void enqueue(struct tcp_store *ts, struct c10d__store_op *op)
{
    op->next = NULL;
    if (ts->tail)
        ts->tail->next = op;
    else
        ts->head = op;
    ts->tail = op;
}

static struct c10d__store_op *dequeue(struct tcp_store *ts)
{
    struct c10d__store_op *op = ts->head;
    if (op) {
        ts->head = op->next;
        if (!ts->head)
            ts->tail = NULL;
        op->next = NULL;
    }
    return op;
}

static int has_work(const struct tcp_store *ts)
{
    return ts->head || ts->inflight;
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

static void ensure_tick(struct tcp_store *ts)
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

static void close_timers(struct tcp_store *ts)
{
    if (ts->timers_open != 2 || uv_is_closing((uv_handle_t *)&ts->timer))
        return;
    ts->tick_running = 0;
    uv_close((uv_handle_t *)&ts->timer, on_timer_closed);
    uv_close((uv_handle_t *)&ts->tick, on_timer_closed);
}

/* --------------------------------------------------------- finishing ops */

static void timeout_message(struct tcp_store *ts, struct c10d__store_op *op, char *buf, size_t len)
{
    if (ts->state != ST_READY && ts->attempts > 0) {
        if (ts->last_error[0]) {
            snprintf(
                buf, len, "store tcp %s %s: could not connect within %lld ms: %s after %d attempts",
                ts->name, op_name(op), (long long)op->timeout_ms, ts->last_error, ts->attempts);
        } else {
            snprintf(buf, len,
                     "store tcp %s %s: could not connect within %lld ms (%d attempts, the last "
                     "one still in progress)",
                     ts->name, op_name(op), (long long)op->timeout_ms, ts->attempts);
        }
        return;
    }
    const struct c10d__store_str *keys;
    size_t n = c10d__store_op_wait_keys(op, &keys);
    if (n && (op->req.cmd == C10D_STORE_WAIT || op->phase == PH_WAIT))
        snprintf(buf, len, "store tcp %s %s: timed out after %lld ms waiting for key " KEYF "%s",
                 ts->name, op_name(op), (long long)op->timeout_ms, KEYA(keys[0]),
                 n > 1 ? " (and others)" : "");
    else
        snprintf(buf, len, "store tcp %s %s: no reply within %lld ms", ts->name, op_name(op),
                 (long long)op->timeout_ms);
}

static void fail_queue(struct tcp_store *ts, int status, const char *why)
{
    struct c10d__store_op *list = ts->head;
    ts->head = ts->tail = NULL;
    c10d__store_op_fail_list(list, status, "store tcp %s: %s", ts->name, why);
}

static void on_written(uv_write_t *req, int status);

/* The tick: deadlines of queued ops, of the op on the wire, of a cancel. */
static void on_tick(uv_timer_t *t)
{
    struct tcp_store *ts = t->data;
    uint64_t now = c10d__now_ms();
    char msg[1024];
    /* queued ops (not on the wire: nothing to undo) */
    for (struct c10d__store_op **pp = &ts->head; *pp;) {
        struct c10d__store_op *op = *pp;
        if (now < op->deadline_ms) {
            pp = &op->next;
            continue;
        }
        *pp = op->next;
        if (ts->tail == op) {
            ts->tail = NULL;
            for (struct c10d__store_op *q = ts->head; q; q = q->next)
                ts->tail = q;
        }
        timeout_message(ts, op, msg, sizeof msg);
        c10d__store_op_finish(op, C10D_ETIMEDOUT, "%s", msg);
    }
    struct c10d__store_op *op = ts->inflight;
    if (op && now >= op->deadline_ms) {
        ts->inflight = NULL;
        timeout_message(ts, op, msg, sizeof msg);
        int can_cancel = op->phase == PH_WAIT || op->req.cmd == C10D_STORE_WAIT;
        if (can_cancel && ts->dialect == C10D_STORE_DIALECT_CURRENT && ts->state == ST_READY) {
            struct c10d__store_request req = {.cmd = C10D_STORE_CANCEL_WAIT};
            struct write_req *w = calloc(1, sizeof *w);
            struct c10d__store_buf b = {0};
            if (w && c10d__store_encode_request(&b, ts->dialect, &req) == 0) {
                w->ts = ts;
                w->conn = ts->conn;
                w->data = b.data;
                uv_buf_t ub = uv_buf_init((char *)b.data, (unsigned)b.len);
                if (uv_write(&w->req, (uv_stream_t *)&ts->conn->tcp, &ub, 1, on_written) == 0) {
                    ts->cancelling = 1;
                    ts->cancel_deadline = now + CANCEL_GRACE_MS;
                    c10d__store_reply_expect(&ts->rp, C10D_STORE_CANCEL_WAIT, 0);
                } else {
                    free(b.data);
                    free(w);
                    w = NULL;
                }
            } else {
                free(w);
                c10d__store_buf_free(&b);
                w = NULL;
            }
            c10d__store_op_finish(op, C10D_ETIMEDOUT, "%s", msg);
            if (!ts->cancelling)
                drop_conn(ts, C10D_ECLOSED, "connection dropped after a timeout");
        } else {
            c10d__store_op_finish(op, C10D_ETIMEDOUT, "%s", msg);
            /* A late reply would answer the next request: start afresh. */
            if (ts->state == ST_READY || ts->state == ST_HANDSHAKE)
                drop_conn(ts, C10D_ECLOSED,
                          "connection dropped after a timeout (a late reply must not answer "
                          "a later request)");
        }
    }
    if (ts->cancelling && now >= ts->cancel_deadline)
        drop_conn(ts, C10D_ECLOSED, "no WAIT_CANCELED from the server");
    if (ts->state == ST_HANDSHAKE && ts->handshake_deadline && now >= ts->handshake_deadline)
        drop_conn(ts, C10D_ETIMEDOUT, "no answer to the handshake");
    if (!has_work(ts) && !ts->cancelling && ts->tick_running && ts->state != ST_HANDSHAKE) {
        uv_timer_stop(&ts->tick);
        ts->tick_running = 0;
        /* Nobody is waiting for a connection any more. */
        if (ts->state == ST_BACKOFF) {
            uv_timer_stop(&ts->timer);
            ts->state = ST_DOWN;
        }
    }
    kick(ts);
}

/* ---------------------------------------------------------- connection */

static void on_conn_closed(uv_handle_t *h)
{
    struct conn *c = h->data;
    struct tcp_store *ts = c->ts;
    free(c);
    c10d__store_unref(&ts->base);
}

static void close_conn(struct tcp_store *ts)
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

/* The connection is gone or unusable: fail what is on the wire, keep the queue. */
static void drop_conn(struct tcp_store *ts, int status, const char *why)
{
    int was_handshake = ts->state == ST_HANDSHAKE;
    close_conn(ts);
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
                enqueue(ts, op); /* never on the wire */
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
        c10d__store_op_finish(op, status, "store tcp %s %s: %s%s", ts->name, op_name(op), why,
                              hint);
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

static void send_bytes(struct tcp_store *ts, struct c10d__store_buf *b, struct c10d__store_op *op);

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf);

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
    struct c10d__store_buf b = {0};
    c10d__store_reply_parser_free(&ts->rp);
    struct c10d__store_codec_limits lim = {0};
    c10d__store_reply_parser_init(&ts->rp, &lim);
    if (ts->trying == C10D_STORE_DIALECT_CURRENT) {
        struct c10d__store_request v = {.cmd = C10D_STORE_VALIDATE, .u32 = C10D_STORE_MAGIC};
        struct c10d__store_request p = {.cmd = C10D_STORE_PING, .u32 = ts->nonce};
        c10d__store_encode_request(&b, ts->trying, &v);
        ts->awaiting_auth = 0;
        if (ts->token_len) {
            struct c10d__store_str t = {ts->token, ts->token_len};
            struct c10d__store_request a = {.cmd = C10D_STORE_AUTH, .nargs = 1, .args = &t};
            c10d__store_encode_request(&b, ts->trying, &a);
            ts->awaiting_auth = 1;
        }
        c10d__store_encode_request(&b, ts->trying, &p);
        c10d__store_reply_expect(&ts->rp, ts->token_len ? C10D_STORE_AUTH : C10D_STORE_PING, 0);
    } else {
        struct c10d__store_request c = {.cmd = C10D_STORE_CHECK};
        c10d__store_encode_request(&b, ts->trying, &c);
        c10d__store_reply_expect(&ts->rp, C10D_STORE_CHECK, 0);
    }
    ts->state = ST_HANDSHAKE;
    ts->handshake_deadline =
        ts->want == C10D_DIALECT_AUTO && !ts->dialect ? c10d__now_ms() + AUTO_HANDSHAKE_MS : 0;
    ensure_tick(ts);
    send_bytes(ts, &b, NULL);
}

static void try_next_addr(struct tcp_store *ts, int last_err);

static void on_connect(uv_connect_t *req, int status)
{
    struct conn *c = req->data;
    struct tcp_store *ts = c->ts;
    if (c != ts->conn || ts->closed)
        return; /* abandoned: its close is already under way */
    if (status < 0) {
        close_conn(ts);
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
        close_conn(ts);
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
        attempt_failed(ts, "resolve host", status);
        return;
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
        attempt_failed(ts, "resolve host", rc);
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
                              ts ? ts->name : "?", op_name(op), uv_strerror(status));
    else
        c10d__store_op_finish(op, 0, NULL);
}

/* Writes b (taking its bytes). op: finish it once written (no reply). */
static void send_bytes(struct tcp_store *ts, struct c10d__store_buf *b, struct c10d__store_op *op)
{
    struct write_req *w = calloc(1, sizeof *w);
    if (!w) {
        c10d__store_buf_free(b);
        if (op)
            c10d__store_op_finish(op, C10D_ENOMEM, "store tcp %s: out of memory", ts->name);
        drop_conn(ts, C10D_ENOMEM, "out of memory");
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
                                  op_name(op), uv_strerror(rc));
        drop_conn(ts, C10D_ECLOSED, "write failed");
    }
}

/* Puts the current phase of op on the wire. */
static void send_phase(struct tcp_store *ts, struct c10d__store_op *op)
{
    struct c10d__store_request req = op->req;
    if (op->phase == PH_WAIT) {
        const struct c10d__store_str *keys;
        req.cmd = C10D_STORE_WAIT;
        req.nargs = c10d__store_op_wait_keys(op, &keys);
        req.args = keys;
    } else if (op->phase == PH_CHECK_EMPTY) {
        req.cmd = C10D_STORE_CHECK;
        req.nargs = 1;
    } else if (req.cmd == C10D_STORE_PING && ts->dialect == C10D_STORE_DIALECT_LEGACY) {
        req.cmd = C10D_STORE_CHECK; /* 1.13 has no PING: a CHECK of no keys is as cheap */
        req.nargs = 0;
    } else if (req.cmd == C10D_STORE_PING) {
        req.u32 = ts->nonce;
    }
    struct c10d__store_buf b = {0};
    int rc = c10d__store_encode_request(&b, ts->dialect, &req);
    if (rc < 0) {
        c10d__store_buf_free(&b);
        c10d__store_op_finish(op, rc, "store tcp %s %s: %s", ts->name, op_name(op),
                              c10d_last_error());
        return;
    }
    int shape = c10d__store_reply_shape(req.cmd);
    if (shape == C10D_STORE_REPLY_NONE) {
        send_bytes(ts, &b, op);
        return;
    }
    ts->inflight = op;
    ts->sent_ns = c10d__now_ns();
    c10d__store_reply_expect(&ts->rp, req.cmd, req.cmd == C10D_STORE_MULTI_GET ? req.nargs : 0);
    send_bytes(ts, &b, NULL);
}

static int waits_first(const struct c10d__store_op *op)
{
    const struct c10d__store_str *keys;
    return op->req.cmd != C10D_STORE_WAIT && c10d__store_op_wait_keys(op, &keys) > 0;
}

static void pump(struct tcp_store *ts)
{
    while (ts->state == ST_READY && !ts->inflight && !ts->cancelling && ts->head) {
        struct c10d__store_op *op = dequeue(ts);
        if (op->req.cmd == C10D_STORE_VALIDATE) { /* the constructor's "connect" */
            c10d__store_op_finish(op, 0, NULL);
            continue;
        }
        if (c10d__store_cmd_to_wire(ts->dialect, op->req.cmd) < 0 &&
            !(op->req.cmd == C10D_STORE_PING)) {
            c10d__store_op_finish(op, C10D_EUNSUPPORTED,
                                  "store tcp %s %s: not supported by a PyTorch 1.13 server "
                                  "(legacy dialect)",
                                  ts->name, op_name(op));
            continue;
        }
        op->phase = waits_first(op) ? PH_WAIT : PH_MAIN;
        send_phase(ts, op);
    }
}

static void kick(struct tcp_store *ts)
{
    if (ts->closed)
        return;
    if (ts->state == ST_DOWN && ts->head)
        start_attempt(ts);
    else if (ts->state == ST_READY)
        pump(ts);
}

/* --------------------------------------------------------------- reading */

/* A reply for the op on the wire. */
static void handle_reply(struct tcp_store *ts, const struct c10d__store_reply *r)
{
    struct c10d__store_op *op = ts->inflight;
    ts->inflight = NULL;
    int rc = 0;
    if (op->phase == PH_WAIT) {
        op->phase = PH_MAIN;
        send_phase(ts, op);
        return;
    }
    if (op->phase == PH_CHECK_EMPTY) {
        if (r->u8 == C10D_STORE_READY)
            rc = c10d__store_op_set_data(op, "", 0);
        else
            rc = c10d__fail(C10D_ENOTFOUND, "store tcp %s get: key " KEYF " not found", ts->name,
                            KEYA(op->req.args[0]));
        goto done;
    }
    switch (op->req.cmd) {
    case C10D_STORE_GET:
        if (r->vals[0].len == 0) {
            /* Our server answers a missing key (deleted after the wait) with an
             * empty value: tell the two apart. */
            op->phase = PH_CHECK_EMPTY;
            send_phase(ts, op);
            return;
        }
        /* fall through */
    case C10D_STORE_COMPARE_SET:
    case C10D_STORE_STATS:
        rc = c10d__store_op_set_data(op, r->vals[0].data, r->vals[0].len);
        break;
    case C10D_STORE_ADD:
    case C10D_STORE_GETNUMKEYS:
    case C10D_STORE_DELETE_KEY:
    case C10D_STORE_QUEUE_LEN:
        op->res.value = r->i64;
        break;
    case C10D_STORE_CHECK:
        op->res.value = r->u8 == C10D_STORE_READY;
        break;
    case C10D_STORE_WAIT:
        break;
    case C10D_STORE_PING:
        if (ts->dialect == C10D_STORE_DIALECT_CURRENT && r->u32 != ts->nonce)
            rc = c10d__fail(C10D_EPROTO, "store tcp %s ping: answered %u, sent %u", ts->name,
                            (unsigned)r->u32, (unsigned)ts->nonce);
        op->res.value = (int64_t)((c10d__now_ns() - ts->sent_ns) / 1000);
        break;
    case C10D_STORE_MULTI_GET:
        rc = c10d__store_op_set_items(op, r->vals, r->nvals, 0);
        break;
    case C10D_STORE_LIST_KEYS:
        rc = c10d__store_op_set_items(op, r->vals, r->nvals, 0);
        if (rc == 0)
            op->res.value = (int64_t)op->res.count;
        break;
    case C10D_STORE_QUEUE_POP:
        if (r->i64 <= 0) {
            if (op->block) {
                op->phase = PH_WAIT; /* another popper won: wait again */
                send_phase(ts, op);
                return;
            }
            rc = c10d__fail(C10D_ENOTFOUND, "store tcp %s queue_pop: queue " KEYF " is empty",
                            ts->name, KEYA(op->req.args[0]));
            break;
        }
        op->res.value = r->i64;
        rc = c10d__store_op_set_data(op, r->vals[0].data, r->vals[0].len);
        break;
    default:
        rc = c10d__fail(C10D_EINTERNAL, "store tcp: unexpected reply to %s",
                        c10d__store_cmd_name(op->req.cmd));
    }
done:
    if (rc < 0)
        c10d__store_op_finish(op, rc, "%s", c10d_last_error());
    else
        c10d__store_op_finish(op, 0, NULL);
}

static void handshake_done(struct tcp_store *ts, const struct c10d__store_reply *r)
{
    if (ts->trying == C10D_STORE_DIALECT_CURRENT && r->u32 != ts->nonce) {
        drop_conn(ts, C10D_EPROTO, "PING answered with a different nonce");
        return;
    }
    if (ts->trying == C10D_STORE_DIALECT_LEGACY && r->u8 != C10D_STORE_READY) {
        drop_conn(ts, C10D_EPROTO, "CHECK of no keys not answered READY");
        return;
    }
    if (ts->dialect != ts->trying)
        C10D_INFO("store", "tcp %s: connected, %s dialect", ts->name, dialect_name(ts->trying));
    ts->dialect = ts->trying;
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
    close_conn(ts);
    struct c10d__store_op *op = ts->inflight;
    ts->inflight = NULL;
    if (op)
        c10d__store_op_finish(op, C10D_ECLOSED, "store tcp %s %s: %s", ts->name, op_name(op), why);
    fail_queue(ts, C10D_ECLOSED, why);
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
        drop_conn(ts, C10D_ECLOSED, why);
        return;
    }
    ts->rlen += (size_t)n;
    size_t off = 0;
    while (off < ts->rlen && ts->conn == c) {
        int expecting = ts->state == ST_HANDSHAKE || ts->cancelling || ts->inflight;
        if (!expecting) {
            drop_conn(ts, C10D_EPROTO, "protocol mismatch: the server sent bytes nobody asked for");
            return;
        }
        struct c10d__store_reply r;
        size_t used = 0;
        int rc = c10d__store_parse_reply(&ts->rp, ts->rbuf + off, ts->rlen - off, &r, &used);
        if (rc == C10D_STORE_PARSE_MORE)
            break;
        if (rc < 0) {
            char why[220];
            snprintf(why, sizeof why, "protocol mismatch: %s", ts->rp.error);
            drop_conn(ts, C10D_EPROTO, why);
            return;
        }
        off += used;
        if (ts->state == ST_HANDSHAKE && ts->awaiting_auth) {
            ts->awaiting_auth = 0;
            if (r.u8 != C10D_STORE_AUTH_OK) {
                auth_refused(ts);
                return;
            }
            c10d__store_reply_expect(&ts->rp, C10D_STORE_PING, 0);
        } else if (ts->state == ST_HANDSHAKE) {
            handshake_done(ts, &r);
        } else if (ts->cancelling) {
            if (r.u8 == C10D_STORE_WAIT_CANCELED)
                ts->cancelling = 0;
            else /* the STOP_WAITING that raced the cancel */
                c10d__store_reply_expect(&ts->rp, C10D_STORE_CANCEL_WAIT, 0);
        } else {
            handle_reply(ts, &r);
        }
    }
    if (ts->conn != c)
        return;
    /* Keep the unfinished reply at the front (the parser counts from it). */
    if (off) {
        memmove(ts->rbuf, ts->rbuf + off, ts->rlen - off);
        ts->rlen -= off;
    }
    kick(ts);
}

/* ------------------------------------------------------------ the vtable */

static void on_engine_shutdown(struct c10d__shutdown_hook *hook)
{
    struct tcp_store *ts = (struct tcp_store *)((char *)hook - offsetof(struct tcp_store, hook));
    ts->hook_registered = 0;
    struct c10d__store_op *op = ts->inflight;
    ts->inflight = NULL;
    if (op)
        c10d__store_op_finish(op, C10D_EABORTED, "store tcp %s %s: the engine was shut down",
                              ts->name, op_name(op));
    fail_queue(ts, C10D_EABORTED, "the engine was shut down");
    close_conn(ts);
    ts->state = ST_DOWN;
    close_timers(ts);
}

static void tcp_submit(c10d_store *s, struct c10d__store_op *op)
{
    struct tcp_store *ts = (struct tcp_store *)s;
    if (ts->closed) {
        c10d__store_op_finish(op, C10D_ECLOSED, "store tcp %s: released", ts->name);
        return;
    }
    /* A request queued before the engine began to stop, run after this
     * store's shutdown hook: connecting now would retry for ever on a loop
     * that must end. */
    if (c10d__engine_stop_begun()) {
        c10d__store_op_finish(op, C10D_EABORTED, "store tcp %s %s: the engine was shut down",
                              ts->name, op_name(op));
        return;
    }
    if (!ts->hook_registered) {
        ts->hook.fn = on_engine_shutdown;
        c10d__engine_on_shutdown(&ts->hook);
        ts->hook_registered = 1;
    }
    int rc = 0;
    if (!op->raw_keys)
        rc = c10d__store_op_prefix_keys(op, "/", 1);
    if (rc == 0 && op->req.cmd == C10D_STORE_LIST_KEYS)
        rc = c10d__store_op_add_list_prefix(op, "/", 1);
    if (rc < 0) {
        c10d__store_op_finish(op, rc, "%s", c10d_last_error());
        return;
    }
    enqueue(ts, op);
    ensure_tick(ts);
    kick(ts);
}

static void tcp_close(c10d_store *s)
{
    struct tcp_store *ts = (struct tcp_store *)s;
    ts->closed = 1;
    if (ts->hook_registered) {
        c10d__engine_remove_shutdown_hook(&ts->hook);
        ts->hook_registered = 0;
    }
    struct c10d__store_op *op = ts->inflight;
    ts->inflight = NULL;
    if (op)
        c10d__store_op_finish(op, C10D_ECLOSED, "store tcp %s %s: the store was released", ts->name,
                              op_name(op));
    fail_queue(ts, C10D_ECLOSED, "the store was released");
    if (ts->state == ST_RESOLVING)
        uv_cancel((uv_req_t *)&ts->gai);
    close_conn(ts);
    if (ts->addrs) {
        uv_freeaddrinfo(ts->addrs);
        ts->addrs = ts->next_addr = NULL;
    }
    ts->state = ST_DOWN;
    close_timers(ts);
    c10d__store_unref(s);
}

static void tcp_destroy(c10d_store *s)
{
    struct tcp_store *ts = (struct tcp_store *)s;
    c10d__store_reply_parser_free(&ts->rp);
    free(ts->rbuf);
    free(ts->host);
    free(ts);
}

static const struct c10d__store_vtable tcp_vtable = {
    .kind = "tcp",
    .submit = tcp_submit,
    .close = tcp_close,
    .destroy = tcp_destroy,
};

/* ------------------------------------------------------- the constructor */

struct waiter {
    uv_mutex_t mutex;
    uv_cond_t cond;
    int done;
    int status;
    int64_t value;
    char message[512];
};

static void waiter_cb(const c10d_store_result *r, void *arg)
{
    struct waiter *w = arg;
    uv_mutex_lock(&w->mutex);
    w->status = r->status;
    w->value = r->value;
    snprintf(w->message, sizeof w->message, "%s", r->message);
    w->done = 1;
    uv_cond_signal(&w->cond);
    uv_mutex_unlock(&w->mutex);
}

/* Runs an internal op and waits for it (its deadline bounds the wait). */
static int run_internal(struct tcp_store *ts, struct c10d__store_op *op, int64_t timeout_ms,
                        int64_t *value)
{
    struct waiter w = {0};
    uv_mutex_init(&w.mutex);
    uv_cond_init(&w.cond);
    op->cb = waiter_cb;
    op->arg = &w;
    op->timeout_ms = timeout_ms;
    int rc = c10d__store_op_submit(&ts->base, op);
    if (rc == 0) {
        uv_mutex_lock(&w.mutex);
        while (!w.done)
            uv_cond_wait(&w.cond, &w.mutex);
        uv_mutex_unlock(&w.mutex);
        rc = w.status;
        if (rc < 0)
            c10d__fail(rc, "%s", w.message);
        else if (value)
            *value = w.value;
    }
    uv_mutex_destroy(&w.mutex);
    uv_cond_destroy(&w.cond);
    return rc;
}

static int raw_add(struct tcp_store *ts, const char *key, int64_t delta, int64_t timeout_ms,
                   int64_t *value)
{
    struct c10d__store_str k = {(const uint8_t *)key, strlen(key)};
    struct c10d__store_op *op = c10d__store_op_new(C10D_STORE_ADD, &k, 1, delta);
    if (!op)
        return C10D_ENOMEM;
    op->raw_keys = 1;
    return run_internal(ts, op, timeout_ms, value);
}

/* torch: with a known world size every client registers in "init/" and the
 * master waits for all of them. */
static int register_worker(struct tcp_store *ts, const c10d_store_tcp_opts *o, uint64_t deadline)
{
    int64_t v = 0;
    uint64_t now = c10d__now_ms();
    C10D_CHECK(raw_add(ts, "init/", 1, (int64_t)(deadline > now ? deadline - now : 1), &v));
    while (o->wait_for_workers && v < o->world_size) {
        now = c10d__now_ms();
        if (now >= deadline)
            return c10d__fail(C10D_ETIMEDOUT,
                              "store tcp %s: timed out after %lld ms waiting for workers: %lld "
                              "of %d registered",
                              ts->name, (long long)o->timeout_ms, (long long)v, o->world_size);
        usleep(10000);
        C10D_CHECK(raw_add(ts, "init/", 0, (int64_t)(deadline - now), &v));
    }
    return 0;
}

int c10d_store_tcp_connect(const char *host, int port, const c10d_store_tcp_opts *opts,
                           c10d_store **out)
{
    c10d_store_tcp_opts o = {0};
    if (opts)
        o = *opts;
    if (!host || !*host)
        return c10d__fail(C10D_EINVAL, "store tcp_connect: host is empty or NULL");
    if (!out)
        return c10d__fail(C10D_EINVAL, "store tcp_connect: out is NULL");
    if (port <= 0 || port > 65535)
        return c10d__fail(C10D_EINVAL, "store tcp_connect: port must be 1..65535 (got %d)", port);
    if (o.timeout_ms < 0)
        return c10d__fail(C10D_EINVAL, "store tcp_connect: timeout_ms must be >= 0 (got %lld)",
                          (long long)o.timeout_ms);
    if (o.dialect < C10D_DIALECT_AUTO || o.dialect > C10D_DIALECT_LEGACY)
        return c10d__fail(C10D_EINVAL, "store tcp_connect: unknown dialect %d", o.dialect);
    if (o.world_size < 0)
        return c10d__fail(C10D_EINVAL, "store tcp_connect: world_size must be >= 0 (got %d)",
                          o.world_size);
    if (c10d__on_loop_thread())
        return c10d__fail(C10D_EDEADLK, "store tcp_connect: called on the loop thread");
    if (o.timeout_ms == 0)
        o.timeout_ms = 300000;
    *out = NULL;
    struct tcp_store *ts = calloc(1, sizeof *ts);
    if (!ts || !(ts->host = strdup(host))) {
        free(ts);
        return c10d__fail(C10D_ENOMEM, "store tcp_connect: out of memory");
    }
    c10d__store_init(&ts->base, &tcp_vtable);
    atomic_store(&ts->base.timeout_ms, o.timeout_ms);
    ts->port = port;
    snprintf(ts->name, sizeof ts->name, strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, port);
    ts->want = o.dialect;
    ts->trying =
        o.dialect == C10D_DIALECT_LEGACY ? C10D_STORE_DIALECT_LEGACY : C10D_STORE_DIALECT_CURRENT;
    ts->backoff_ms = BACKOFF_START_MS;
    ts->nonce = (uint32_t)uv_os_getpid();
    const uint8_t *tok;
    size_t tok_len;
    if (c10d__token_get(&tok, &tok_len) < 0) {
        char msg[600];
        snprintf(msg, sizeof msg, "store tcp_connect %s: %s", ts->name, c10d_last_error());
        free(ts->host);
        free(ts);
        return c10d__fail(C10D_EINVAL, "%s", msg);
    }
    if (tok_len && o.dialect == C10D_DIALECT_LEGACY) {
        char name[sizeof ts->name];
        snprintf(name, sizeof name, "%s", ts->name);
        free(ts->host);
        free(ts);
        return c10d__fail(C10D_EINVAL,
                          "store tcp_connect %s: a token is configured (C10D_STORE_TOKEN or "
                          "C10D_STORE_TOKEN_FILE) but the legacy (1.13) dialect cannot present one",
                          name);
    }
    memcpy(ts->token, tok, tok_len);
    ts->token_len = tok_len;
    struct c10d__store_codec_limits lim = {0};
    c10d__store_reply_parser_init(&ts->rp, &lim);

    uint64_t deadline = c10d__now_ms() + (uint64_t)o.timeout_ms;
    struct c10d__store_op *op = c10d__store_op_new(C10D_STORE_VALIDATE, NULL, 0, 0);
    int rc = op ? run_internal(ts, op, o.timeout_ms, NULL) : C10D_ENOMEM;
    if (rc == 0 && o.world_size > 0)
        rc = register_worker(ts, &o, deadline);
    if (rc < 0) {
        char msg[600];
        snprintf(msg, sizeof msg, "%s", c10d_last_error());
        c10d_store_release(&ts->base);
        return c10d__fail(rc, "%s", msg);
    }
    *out = &ts->base;
    return 0;
}
