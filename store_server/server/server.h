/* The TCPStore server on a libuv loop: its own process (c10d-store) or the
 * engine's loop (rank 0's embedded store). Every function runs on the loop's
 * thread. Both dialects of docs/store_protocol.md on one port.
 *
 * Protection: each limit below closes only the offending connection, with a
 * C10D_WARN("store", ...) line naming the peer and the reason; the server and
 * every other client carry on.
 */
#ifndef C10D_STORE_SERVER_SERVER_SERVER_H
#define C10D_STORE_SERVER_SERVER_SERVER_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

/* Zero fields take the default in brackets. */
struct c10d__store_limits {
    uint64_t max_key_bytes;        /* [64 KiB] one key */
    uint64_t max_value_bytes;      /* [256 MiB] one value */
    uint64_t max_keys_per_request; /* [128 Ki] CHECK/WAIT/MULTI_* keys */
    uint64_t max_request_bytes;    /* [1 GiB] a whole request */
    /* [4 GiB] everything the server holds: the table, request bytes as they
     * arrive (never what a request only announces), and every reply byte
     * until it is written to the socket. */
    uint64_t max_memory_bytes;
    uint64_t max_connections; /* [65536] */
    /* A connection that sent some bytes but no complete first request
     * (VALIDATE in the current dialect) within this time is closed [30000]. */
    uint64_t validate_timeout_ms;
    /* A connection that sent nothing at all within this time is closed
     * [0 = never: PyTorch 1.13 clients keep an idle second connection]. */
    uint64_t silent_timeout_ms;
    /* Replies queued to a client that does not read them: past this many
     * bytes the server stops reading its requests; past 4x it closes the
     * connection (asynchronous pushes can still pile up) [8 MiB]. */
    uint64_t max_pending_write_bytes;
    /* Replies queued to all clients together: past this many bytes a request
     * whose reply would take its connection's queued replies past 64 KiB (at
     * most 1/16 of this) waits until writes drain; waiting connections resume
     * in the order they stopped. Smaller replies never wait for it, so a
     * client that does not read its big reply cannot delay anyone's PING
     * [256 MiB]. Size max_memory_bytes for the table plus this plus
     * max_reply_bytes, so that queued replies never make a SET fail. */
    uint64_t max_queued_reply_bytes;
    /* A connection whose queued replies have not moved (no byte taken by the
     * kernel) for this long is closed while that server-wide cap holds others
     * back; one holding more than its share of the cap (the cap divided by
     * the connections with queued replies) is closed after a quarter of it,
     * whether or not anyone waits [10000]. */
    uint64_t slow_reader_timeout_ms;
    /* One reply: a request whose reply would be larger (a MULTI_GET naming a
     * big key many times), or a 1.13 watch event that large, closes the
     * connection (the protocol has no error reply) [max_value_bytes + 1 MiB:
     * a GET of one largest value, or COMPARE_SET/QUEUE_POP of one, fits]. */
    uint64_t max_reply_bytes;
    /* A connection in the middle of a request (some of its bytes buffered)
     * that sends nothing for this long is closed, before and after VALIDATE.
     * A pending WAIT is not a partial request; idle connections between
     * requests are never affected [30000]. */
    uint64_t request_timeout_ms;
};

/* The defaults, filled into the zero fields of *l. */
void c10d__store_limits_defaults(struct c10d__store_limits *l);

struct c10d__store_server_opts {
    const char *host; /* NULL/""/"*": dual-stack any address (:: then 0.0.0.0) */
    int port;         /* 0: pick a free port */
    int world_size;   /* > 0: log when init/ reaches it */
    struct c10d__store_limits limits;
    /* The shared secret clients must present with AUTH (copied; token_len 0:
     * none). With one, the legacy dialect is refused and connections that
     * say nothing are closed after validate_timeout_ms (docs/security.md). */
    const uint8_t *token;
    size_t token_len;
    /* host names an address of another machine (EADDRNOTAVAIL: a NAT or
     * virtual address): listen on every address instead, with a warning. */
    int any_if_not_local;
};

struct c10d__store_server;

/* Binds, listens (backlog from /proc/sys/net/core/somaxconn) and serves on
 * `loop`. 0 or a negative status (c10d_last_error() says why). */
int c10d__store_server_start(uv_loop_t *loop, const struct c10d__store_server_opts *opts,
                             struct c10d__store_server **out);
int c10d__store_server_port(const struct c10d__store_server *s);
/* Stats as a JSON object (malloc'd; free() it): connections, keys, bytes,
 * waiters, ops and ops/s per command (rate since the previous call). */
char *c10d__store_server_stats_json(struct c10d__store_server *s);
/* Closes the listener and every connection; once all handles are closed, frees
 * the server and calls cb(arg) (cb may be NULL). */
void c10d__store_server_stop(struct c10d__store_server *s, void (*cb)(void *arg), void *arg);
/* Calls cb(arg, connections left) once no client is connected, or after
 * `ms` at the latest (the tick's resolution), or when the server is stopped
 * first, never inside this call; the server serves as before meanwhile. One
 * drain at a time. -1 (and no cb) if the server is stopping already. */
int c10d__store_server_drain(struct c10d__store_server *s, uint64_t ms,
                             void (*cb)(void *arg, size_t left), void *arg);

#endif
