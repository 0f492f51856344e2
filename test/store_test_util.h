/* Test helpers for the store: a server on its own uv loop in a thread, and a
 * minimal blocking client over real sockets (uses the codec). Header-only:
 * every function is static. */
#ifndef C10D_TEST_STORE_TEST_UTIL_H
#define C10D_TEST_STORE_TEST_UTIL_H

#include "store_server/wire/codec.h"
#include "store_server/server/server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>
#include <uv.h>

/* ------------------------------------------------------ server in a thread */

struct store_ts {
    uv_loop_t loop;
    uv_async_t async;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct c10d__store_server_opts opts;
    struct c10d__store_server *server;
    int port;
    int started; /* 1 ok, -1 failed */
    /* a call posted to the loop */
    void (*fn)(struct store_ts *ts, void *arg);
    void *arg;
    int done;
    int stop;
};

static void store_ts_stopped(void *arg)
{
    struct store_ts *ts = arg;
    uv_close((uv_handle_t *)&ts->async, NULL);
}

static void store_ts_on_async(uv_async_t *a)
{
    struct store_ts *ts = a->data;
    pthread_mutex_lock(&ts->mu);
    if (ts->fn) {
        ts->fn(ts, ts->arg);
        ts->fn = NULL;
        ts->done = 1;
        pthread_cond_broadcast(&ts->cv);
    }
    int stop = ts->stop;
    pthread_mutex_unlock(&ts->mu);
    if (stop && ts->server) {
        struct c10d__store_server *s = ts->server;
        ts->server = NULL;
        c10d__store_server_stop(s, store_ts_stopped, ts);
    }
}

static void *store_ts_main(void *arg)
{
    struct store_ts *ts = arg;
    uv_loop_init(&ts->loop);
    uv_async_init(&ts->loop, &ts->async, store_ts_on_async);
    ts->async.data = ts;
    int rc = c10d__store_server_start(&ts->loop, &ts->opts, &ts->server);
    pthread_mutex_lock(&ts->mu);
    ts->started = rc == 0 ? 1 : -1;
    if (rc == 0)
        ts->port = c10d__store_server_port(ts->server);
    pthread_cond_broadcast(&ts->cv);
    pthread_mutex_unlock(&ts->mu);
    if (rc < 0) {
        fprintf(stderr, "store server start failed: %s\n", c10d_last_error());
        uv_close((uv_handle_t *)&ts->async, NULL);
    }
    uv_run(&ts->loop, UV_RUN_DEFAULT);
    uv_loop_close(&ts->loop);
    return NULL;
}

static int store_ts_start(struct store_ts *ts, const struct c10d__store_server_opts *opts)
{
    memset(ts, 0, sizeof *ts);
    ts->opts = *opts;
    pthread_mutex_init(&ts->mu, NULL);
    pthread_cond_init(&ts->cv, NULL);
    pthread_create(&ts->thread, NULL, store_ts_main, ts);
    pthread_mutex_lock(&ts->mu);
    while (!ts->started)
        pthread_cond_wait(&ts->cv, &ts->mu);
    pthread_mutex_unlock(&ts->mu);
    return ts->started > 0 ? ts->port : -1;
}

/* Runs fn(ts, arg) on the server's loop and waits for it. */
static void store_ts_call(struct store_ts *ts, void (*fn)(struct store_ts *, void *), void *arg)
{
    pthread_mutex_lock(&ts->mu);
    ts->fn = fn;
    ts->arg = arg;
    ts->done = 0;
    uv_async_send(&ts->async);
    while (!ts->done)
        pthread_cond_wait(&ts->cv, &ts->mu);
    pthread_mutex_unlock(&ts->mu);
}

static void store_ts_stats_fn(struct store_ts *ts, void *arg)
{
    *(char **)arg = c10d__store_server_stats_json(ts->server);
}

/* The stats JSON (free() it). */
static char *store_ts_stats(struct store_ts *ts)
{
    char *json = NULL;
    store_ts_call(ts, store_ts_stats_fn, &json);
    return json;
}

static void store_ts_stop(struct store_ts *ts)
{
    pthread_mutex_lock(&ts->mu);
    ts->stop = 1;
    pthread_mutex_unlock(&ts->mu);
    uv_async_send(&ts->async);
    pthread_join(ts->thread, NULL);
    pthread_mutex_destroy(&ts->mu);
    pthread_cond_destroy(&ts->cv);
}

/* --------------------------------------------------------- blocking client */

/* Connects to the loopback; family AF_INET or AF_INET6. Reads time out after
 * 20 s so that a broken server fails the test instead of hanging it. */
static int store_tc_connect(int port, int family)
{
    int fd = socket(family, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    int rc;
    if (family == AF_INET6) {
        struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_port = htons((uint16_t)port)};
        a.sin6_addr = in6addr_loopback;
        rc = connect(fd, (struct sockaddr *)&a, sizeof a);
    } else {
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        rc = connect(fd, (struct sockaddr *)&a, sizeof a);
    }
    if (rc < 0) {
        close(fd);
        return -1;
    }
    struct timeval tv = {.tv_sec = 20};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

static int store_tc_send(int fd, const void *data, size_t len)
{
    const uint8_t *p = data;
    while (len) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* Sends one request; 0 or -1. */
static int store_tc_req(int fd, int dialect, int cmd, uint32_t u32, int64_t i64, size_t nargs,
                        const struct c10d__wire_str *args)
{
    struct c10d__wire_buf b = {0};
    struct c10d__wire_request r = {
        .cmd = cmd, .u32 = u32, .i64 = i64, .nargs = nargs, .args = args};
    int rc = c10d__wire_encode_request(&b, dialect, &r);
    if (rc == 0)
        rc = store_tc_send(fd, b.data, b.len);
    c10d__wire_buf_free(&b);
    return rc;
}

/* A client connection's reply state. */
struct store_tc {
    int fd;
    int dialect;
    struct c10d__wire_reply_parser rp;
    uint8_t *buf;
    size_t len, cap, used; /* buf[used..len) not yet consumed */
};

static int store_tc_open(struct store_tc *c, int port, int family, int dialect)
{
    memset(c, 0, sizeof *c);
    c->fd = store_tc_connect(port, family);
    c->dialect = dialect;
    c10d__wire_reply_parser_init(&c->rp, NULL);
    if (c->fd < 0)
        return -1;
    if (dialect == C10D_STORE_DIALECT_CURRENT)
        return store_tc_req(c->fd, dialect, C10D_STORE_VALIDATE, 0, 0, 0, NULL);
    return 0;
}

static void store_tc_close(struct store_tc *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    free(c->buf);
    c->buf = NULL;
    c10d__wire_reply_parser_free(&c->rp);
}

/* Receives one reply of the expected shape. 0 ok, -1 closed/timeout/bad. The
 * reply points into c->buf until the next call. */
static int store_tc_recv(struct store_tc *c, int cmd, size_t nkeys, int event,
                         struct c10d__wire_reply *rep)
{
    if (event)
        c10d__wire_reply_expect_event(&c->rp);
    else if (c10d__wire_reply_expect(&c->rp, cmd, nkeys) < 0)
        return -1;
    /* drop what the previous reply consumed */
    if (c->used)
        memmove(c->buf, c->buf + c->used, c->len - c->used);
    c->len -= c->used;
    c->used = 0;
    for (;;) {
        size_t used;
        int rc = c10d__wire_parse_reply(&c->rp, c->buf, c->len, rep, &used);
        if (rc < 0)
            return -1;
        if (rc == C10D_STORE_PARSE_DONE) {
            c->used = used;
            return 0;
        }
        if (c->cap - c->len < 65536) {
            c->cap = c->cap * 2 + 65536;
            c->buf = realloc(c->buf, c->cap);
        }
        ssize_t n = recv(c->fd, c->buf + c->len, c->cap - c->len, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        c->len += (size_t)n;
    }
}

/* Request + reply (cmd must have a reply). */
static int store_tc_call(struct store_tc *c, int cmd, uint32_t u32, int64_t i64, size_t nargs,
                         const struct c10d__wire_str *args, struct c10d__wire_reply *rep)
{
    if (store_tc_req(c->fd, c->dialect, cmd, u32, i64, nargs, args) < 0)
        return -1;
    if (c10d__wire_reply_shape(cmd) == C10D_STORE_REPLY_NONE)
        return 0;
    size_t nkeys = cmd == C10D_STORE_MULTI_GET ? nargs : 0;
    return store_tc_recv(c, cmd, nkeys, 0, rep);
}

/* 1 if the server closed the connection (EOF or reset) before `ms`. */
static int store_tc_wait_closed(int fd, int ms)
{
    struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char junk[4096];
    for (;;) {
        ssize_t n = recv(fd, junk, sizeof junk, 0);
        if (n == 0 || (n < 0 && errno == ECONNRESET))
            return 1;
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return 0;
    }
}

#define STR(lit) ((struct c10d__wire_str){(const uint8_t *)(lit), sizeof(lit) - 1})

#endif
