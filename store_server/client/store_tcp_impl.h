/* The TCP store's private header: the state its parts share and the calls one
 * part makes into another. The client is split so that the connection (getting
 * one, keeping it, reading and writing it: store_tcp_conn.c) reads apart from
 * the requests that travel on it (store_tcp_pipeline.c); store_tcp.c is what
 * the rest of the library sees. Only those files include this one.
 *
 * Everything here runs on the engine's loop thread.
 */
#ifndef C10D_STORE_SERVER_CLIENT_STORE_TCP_IMPL_H
#define C10D_STORE_SERVER_CLIENT_STORE_TCP_IMPL_H

#include "store.h"

#include "engine/token.h"

#include <netdb.h>
#include <stddef.h>
#include <stdint.h>

/* A fresh store retries from here: its usual failure is a rank that started
 * before rank 0's server listens, milliseconds later, and at 500 ms that race
 * cost a job's start 0.5 s one run in a few (bench/README.md). */
#define BACKOFF_FIRST_MS 50.0
/* A connection that had completed its handshake retries from here: the
 * server went away, and every rank of the job is reconnecting at once. */
#define BACKOFF_START_MS 500.0

enum conn_state {
    ST_DOWN = 0,  /* no connection; the next op connects */
    ST_RESOLVING, /* getaddrinfo */
    ST_CONNECTING,
    ST_HANDSHAKE, /* VALIDATE + PING (or legacy CHECK) sent */
    ST_READY,
    ST_BACKOFF, /* waiting before the next attempt */
};

struct conn;

struct tcp_store;

/* What the connection reports to the requests: store_tcp_pipeline.c's table
 * (c10d__store_tcp_requests), installed by store_tcp.c, so the connection
 * never calls the pipeline by name. */
struct tcp_store_requests {
    /* An op that never reached the wire goes back in line. */
    void (*requeue)(struct tcp_store *ts, struct c10d__store_op *op);
    /* Gave up connecting: fail every queued op. */
    void (*fail_queue)(struct tcp_store *ts, int status, const char *why);
    /* The tick: fail the ops past their deadline, queued or on the wire. */
    void (*expire)(struct tcp_store *ts, uint64_t now);
    /* The connection is ready: put queued ops on it. */
    void (*pump)(struct tcp_store *ts);
    /* A reply for the op on the wire. */
    void (*handle_reply)(struct tcp_store *ts, const struct c10d__wire_reply *r);
};

struct tcp_store {
    c10d_store base;
    const struct tcp_store_requests *requests;
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
    /* The local end of the last connection that completed a handshake
     * (ss_family 0: none yet): c10d__store_route. */
    struct sockaddr_storage local_addr;
    /* When the last "cannot resolve" warning was logged (c10d__now_ms). */
    uint64_t resolve_warned_ms;
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
    struct c10d__wire_reply_parser rp;
    uint8_t *rbuf;
    size_t rlen, rcap;
    int closed;
    struct c10d__shutdown_hook hook;
    int hook_registered;
};

static inline int has_work(const struct tcp_store *ts)
{
    return ts->head || ts->inflight;
}

/* The connection (store_tcp_conn.c). */

/* Moves things along: connects if ops wait and nothing is under way, or puts
 * the next requests on a ready connection. */
void c10d__store_tcp_kick(struct tcp_store *ts);
/* The connection is gone or unusable: fail what is on the wire, keep the queue. */
void c10d__store_tcp_drop_conn(struct tcp_store *ts, int status, const char *why);
void c10d__store_tcp_close_conn(struct tcp_store *ts);
void c10d__store_tcp_ensure_tick(struct tcp_store *ts);
void c10d__store_tcp_close_timers(struct tcp_store *ts);
/* Writes b (taking its bytes). op: finish it once written (no reply). */
void c10d__store_tcp_send_bytes(struct tcp_store *ts, struct c10d__wire_buf *b,
                                struct c10d__store_op *op);
/* Writes CANCEL_WAIT for the WAIT on the wire and sets ts->cancelling; leaves
 * it clear if the request could not be written. */
void c10d__store_tcp_send_cancel(struct tcp_store *ts, uint64_t now);
/* The op's name in messages ("get", "connect", ...). */
const char *c10d__store_tcp_op_name(const struct c10d__store_op *op);

/* The requests (store_tcp_pipeline.c). */

extern const struct tcp_store_requests c10d__store_tcp_requests;
void c10d__store_tcp_enqueue(struct tcp_store *ts, struct c10d__store_op *op);
void c10d__store_tcp_fail_queue(struct tcp_store *ts, int status, const char *why);
/* Fails the ops past their deadline, queued or on the wire. */
void c10d__store_tcp_expire_ops(struct tcp_store *ts, uint64_t now);
/* Puts queued ops on a ready connection until one awaits a reply. */
void c10d__store_tcp_pump(struct tcp_store *ts);
/* A reply for the op on the wire. */
void c10d__store_tcp_handle_reply(struct tcp_store *ts, const struct c10d__wire_reply *r);

#endif
