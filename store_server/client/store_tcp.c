/* The TCPStore client on the engine loop (docs/store_client.md): the store's
 * vtable and c10d_store_tcp_connect, the part the rest of the library sees.
 *
 * One connection per store, one request awaiting a reply at a time, replies
 * in order. The connection's life (connect, handshake, reconnect, socket I/O,
 * timers) is store_tcp_conn.c; the requests on it (queue, encoding, replies,
 * deadlines) are store_tcp_pipeline.c; store_tcp_impl.h is what they share.
 */
#include "store_tcp_impl.h"

#include "engine/log.h"
#include "engine/opts.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ------------------------------------------------------------ the vtable */

static void on_engine_shutdown(struct c10d__shutdown_hook *hook)
{
    struct tcp_store *ts = (struct tcp_store *)((char *)hook - offsetof(struct tcp_store, hook));
    ts->hook_registered = 0;
    struct c10d__store_op *op = ts->inflight;
    ts->inflight = NULL;
    if (op)
        c10d__store_op_finish(op, C10D_EABORTED, "store tcp %s %s: the engine was shut down",
                              ts->name, c10d__store_tcp_op_name(op));
    c10d__store_tcp_fail_queue(ts, C10D_EABORTED, "the engine was shut down");
    c10d__store_tcp_close_conn(ts);
    ts->state = ST_DOWN;
    c10d__store_tcp_close_timers(ts);
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
                              ts->name, c10d__store_tcp_op_name(op));
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
    c10d__store_tcp_enqueue(ts, op);
    c10d__store_tcp_ensure_tick(ts);
    c10d__store_tcp_kick(ts);
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
                              c10d__store_tcp_op_name(op));
    c10d__store_tcp_fail_queue(ts, C10D_ECLOSED, "the store was released");
    if (ts->state == ST_RESOLVING)
        uv_cancel((uv_req_t *)&ts->gai);
    c10d__store_tcp_close_conn(ts);
    if (ts->addrs) {
        uv_freeaddrinfo(ts->addrs);
        ts->addrs = ts->next_addr = NULL;
    }
    ts->state = ST_DOWN;
    c10d__store_tcp_close_timers(ts);
    c10d__store_unref(s);
}

static void tcp_destroy(c10d_store *s)
{
    struct tcp_store *ts = (struct tcp_store *)s;
    /* Left by a shutdown that came while it connected, when no close ran
     * after it (c10d_store_release without an engine). */
    if (ts->addrs)
        uv_freeaddrinfo(ts->addrs);
    c10d__wire_reply_parser_free(&ts->rp);
    free(ts->rbuf);
    free(ts->host);
    free(ts);
}

static int tcp_route(c10d_store *s, struct c10d__store_route *out)
{
    struct tcp_store *ts = (struct tcp_store *)s;
    if (ts->local_addr.ss_family == 0)
        return C10D_ENOTFOUND;
    out->local = ts->local_addr;
    snprintf(out->host, sizeof out->host, "%s", ts->host);
    return 0;
}

/* A new client of the same server, speaking the dialect this one found. */
static int tcp_clone(c10d_store *s, c10d_store **out)
{
    struct tcp_store *ts = (struct tcp_store *)s;
    c10d_store_tcp_opts o = C10D_STORE_TCP_OPTS_INIT;
    o.timeout_ms = c10d_store_timeout(s);
    o.dialect = s->dialect;
    return c10d_store_tcp_connect(ts->host, ts->port, &o, out);
}

static const struct c10d__store_vtable tcp_vtable = {
    .kind = "tcp",
    .submit = tcp_submit,
    .close = tcp_close,
    .destroy = tcp_destroy,
    .route = tcp_route,
    .clone = tcp_clone,
};

/* ------------------------------------------------------- the constructor */

static int raw_add(struct tcp_store *ts, const char *key, int64_t delta, int64_t timeout_ms,
                   int64_t *value)
{
    struct c10d__wire_str k = {(const uint8_t *)key, strlen(key)};
    struct c10d__store_op *op;
    C10D_CHECK(c10d__store_op_new(&op, C10D_STORE_ADD, &k, 1, delta));
    op->raw_keys = 1;
    return c10d__store_op_run_sync(&ts->base, op, timeout_ms, value);
}

#define WORKERS_WARN_MS 30000

/* torch: with a known world size every client registers in "init/" and the
 * master waits for all of them. */
static int register_worker(struct tcp_store *ts, const c10d_store_tcp_opts *o, uint64_t deadline)
{
    int64_t v = 0;
    uint64_t now = c10d__now_ms();
    C10D_CHECK(raw_add(ts, "init/", 1, (int64_t)(deadline > now ? deadline - now : 1), &v));
    /* A missing rank (WORLD_SIZE above the ranks started) must not be a
     * silent wait until the timeout: warn every 30 s with the count. */
    uint64_t started = now, next_warning = now + WORKERS_WARN_MS;
    while (o->wait_for_workers && v < o->world_size) {
        now = c10d__now_ms();
        if (now >= next_warning && now < deadline) {
            C10D_WARN("store",
                      "store tcp %s: waiting for %lld more ranks: %lld of %d arrived after "
                      "%llu s (timeout %lld ms); is WORLD_SIZE the number of ranks started?",
                      ts->name, (long long)(o->world_size - v), (long long)v, o->world_size,
                      (unsigned long long)((now - started) / 1000), (long long)o->timeout_ms);
            next_warning = now + WORKERS_WARN_MS;
        }
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
    c10d_store_tcp_opts o;
    /* The 0.1 layout ends with wait_for_workers. */
    C10D_CHECK(c10d__opts_read(&o, sizeof o,
                               offsetof(c10d_store_tcp_opts, wait_for_workers) + sizeof(int), opts,
                               "store tcp_connect"));
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
    if (ts != NULL)
        ts->requests = &c10d__store_tcp_requests;
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
    ts->backoff_ms = BACKOFF_FIRST_MS;
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
    struct c10d__wire_codec_limits lim = {0};
    c10d__wire_reply_parser_init(&ts->rp, &lim);

    uint64_t deadline = c10d__now_ms() + (uint64_t)o.timeout_ms;
    struct c10d__store_op *op;
    int rc = c10d__store_op_new(&op, C10D_STORE_VALIDATE, NULL, 0, 0);
    if (rc == 0)
        rc = c10d__store_op_run_sync(&ts->base, op, o.timeout_ms, NULL);
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
