/* One connection's protocol state, without I/O: input buffering, the request
 * parser, command dispatch into the table, and the reply bytes. The libuv
 * server wraps it around a socket; the fuzzer drives it directly.
 *
 * Input: ask c10d__store_session_rbuf() where to read, then report the bytes
 * with c10d__store_session_received(). Whole requests are parsed straight out
 * of a buffer shared by all sessions of a context; only the unfinished tail
 * of a read is copied into the session's own buffer, which doubles as bytes
 * arrive (up to what the parser says the request still needs).
 *
 * Output: replies are appended to s->out; the context's flush() is called
 * after each batch and for every asynchronous push (a WAIT that fires, a 1.13
 * watch event). flush() must not call into the table or free the session.
 *
 * Memory: every byte the session holds is charged to the table's budget
 * (--max-memory) while it is held. The input buffer is charged at its
 * capacity, which grows with the bytes that arrived (never more than about
 * twice them), not with what a request announces. s->out is charged at its
 * capacity: each reply's size is computed before it is built, refused past
 * ctx->max_reply, and charged first. After flush() returns, whatever capacity
 * s->out lost is released; an owner that takes the buffer away (to send it
 * later) takes its charge with c10d__store_session_take_out_charge() and gives
 * it back with c10d__store_ctx_release_reply() once the bytes are sent.
 *
 * Shared replies: a reply many sessions send unchanged (a rendezvous's cached
 * MULTI_GET answer) is a blob, charged once and held by reference. With
 * ctx->send_blob set, a session hands the owner a reference instead of a copy
 * (after flushing what s->out held, so replies keep their order); without it,
 * the bytes are copied into s->out.
 */
#ifndef C10D_STORE_SERVER_SERVER_SESSION_H
#define C10D_STORE_SERVER_SERVER_SESSION_H

#include "store_server/wire/codec.h"
#include "store_server/table/table.h"

#include <stddef.h>
#include <stdint.h>

struct c10d__store_session;

/* Reply bytes shared by reference (see Shared replies above). */
struct c10d__store_blob {
    size_t refs;
    size_t len;
    size_t charged; /* to table's budget, released with the last reference */
    struct c10d__store_table *table;
    uint8_t data[];
};
void c10d__store_blob_ref(struct c10d__store_blob *b);
void c10d__store_blob_unref(struct c10d__store_blob *b);

/* What sessions share (one per server). */
struct c10d__store_ctx {
    struct c10d__store_table *table;
    struct c10d__wire_codec_limits limits;
    void (*flush)(struct c10d__store_session *s);
    /* Optional: send b's bytes after everything flush() was given, taking a
     * reference (c10d__store_blob_ref) for as long as the owner needs them;
     * the bytes do not count in `queued` (they take no memory per session). */
    void (*send_blob)(struct c10d__store_session *s, struct c10d__store_blob *b);
    uint64_t blob_sends; /* replies sent by reference */
    void *data;
    int world_size; /* > 0: log when init/ reaches it */
    /* Replies a session may have queued (s->out + s->pending_out) before it
     * stops running requests until the owner drains them (0: no limit). */
    size_t out_cap;
    /* Server-wide: replies every session handed to the owner but the owner has
     * not sent yet (the sum of pending_out). At queued_cap (0: no cap) sessions
     * stop running requests and wait in a FIFO; the owner resumes them with
     * c10d__store_ctx_resume() as writes drain. Without it, 10k clients that
     * each ask for a 720 KB MULTI_GET make the server hold 7 GB of replies. */
    size_t queued;
    size_t queued_cap;
    struct c10d__store_session *stall_head, *stall_tail;
    uint64_t stalls; /* times a session waited for the server-wide cap */
    /* Bumped by every command that is not read-only: a cached MULTI_GET reply
     * from an older generation may be stale. */
    uint64_t generation;
    struct c10d__store_mget_cache {
        size_t nkeys;
        size_t *key_lens;
        uint8_t *key_bytes;             /* the keys, back to back */
        struct c10d__store_blob *reply; /* the cache's reference */
        size_t charged;                 /* the keys', to the table's memory budget */
        uint64_t generation;
    } mget;
    size_t mget_cache_max; /* largest reply cached (0: no cache) */
    uint64_t mget_hits, mget_misses;
    uint64_t ops[C10D_STORE_CMD_COUNT];
    /* STATS: the owner's stats as a malloc'd JSON string (NULL: "{}"). */
    char *(*stats_json)(struct c10d__store_ctx *ctx);
    uint64_t missing_gets;
    /* One reply (one request's, or one watch event) larger than this closes
     * the connection (0: no limit). */
    size_t max_reply;
    /* Reply bytes charged to the budget: sessions' s->out and what owners
     * took with c10d__store_session_take_out_charge() and have not released. */
    size_t reply_charged;
    /* A session whose queued replies plus the next reply stay within this
     * many bytes is never held back by the server-wide cap (PING, ADD, small
     * GETs answer at once whatever the slow readers hold) [64 KiB, at most
     * queued_cap / 16]. */
    size_t small_backlog;
    uint64_t closed_reply_cap; /* connections closed for a reply over max_reply */
    /* The shared secret (token_len 0: none). With one, a session runs nothing
     * but VALIDATE and AUTH until AUTH presented it, and the legacy dialect,
     * which cannot present it, is closed at once. */
    const uint8_t *token;
    size_t token_len;
    uint64_t auth_failures; /* connections closed for a missing or wrong token */
    /* One read buffer for every session: reads that hold whole requests are
     * parsed in place and never copied. */
    uint8_t *shared;
    size_t shared_cap;
    int shared_busy;
};

/* Creates the context's table and shared buffer. */
int c10d__store_ctx_init(struct c10d__store_ctx *ctx, const struct c10d__wire_codec_limits *lim,
                         size_t max_memory, void (*flush)(struct c10d__store_session *s));
void c10d__store_ctx_free(struct c10d__store_ctx *ctx);

struct c10d__store_session {
    struct c10d__store_client client; /* table registrations; client.data = this */
    struct c10d__store_ctx *ctx;
    struct c10d__wire_parser parser;
    uint8_t *in;   /* own buffer: the unfinished request, from in[0] */
    size_t in_len; /* bytes in it */
    size_t in_cap; /* charged to the table's memory budget */
    int reading_shared;
    struct c10d__wire_buf out; /* replies not yet handed to flush() */
    size_t out_charged;        /* out.cap's bytes charged to the budget */
    size_t pending_out;        /* the owner's: bytes flushed but not yet sent */
    int stalled; /* stopped at out_cap with requests left: call received(s, 0) later */
    /* Waiting in ctx's FIFO for the server-wide cap (then stalled is set too):
     * only c10d__store_ctx_resume() runs it again. */
    int in_fifo;
    int resuming;
    struct c10d__store_session *fifo_prev, *fifo_next;
    uint64_t bytes_in;
    uint64_t requests;
    int authed;       /* AUTH presented the context's token */
    int closing;      /* set on an error: the owner must close the connection */
    char reason[256]; /* why, for the log */
    char peer[64];
    void *data; /* the owner's */
};

void c10d__store_session_init(struct c10d__store_session *s, struct c10d__store_ctx *ctx,
                              const char *peer);
/* Drops the session's waits and watches and frees its buffers. */
void c10d__store_session_free(struct c10d__store_session *s);
/* Where to read next: *base, *len (len 0 when over the memory budget: the
 * session is then marked closing). */
void c10d__store_session_rbuf(struct c10d__store_session *s, size_t suggested, uint8_t **base,
                              size_t *len);
/* `n` bytes arrived in the buffer rbuf() gave (n may be 0: just run what is
 * buffered, e.g. after a stall). Parses and runs every complete request (until
 * the replies reach ctx->out_cap: then s->stalled is set), then flushes. Returns 0, or a negative
 * status with s->reason set: close the connection. */
int c10d__store_session_received(struct c10d__store_session *s, size_t n);
/* Convenience (tests, fuzzer): copies data in through rbuf()/received(). */
int c10d__store_session_feed(struct c10d__store_session *s, const uint8_t *data, size_t len);
/* The owner's queued bytes for this session changed to `pending` (keeps
 * ctx->queued, the server-wide sum, in step). */
void c10d__store_session_set_pending(struct c10d__store_session *s, size_t pending);
/* Runs sessions waiting for the server-wide cap, oldest first, while the
 * queued bytes are under it. For each one it calls received(s, 0) and then
 * after(s) (the owner restarts reading or closes the session); after() must
 * not free the session. Safe to call at any time; does nothing when no
 * session waits. */
void c10d__store_ctx_resume(struct c10d__store_ctx *ctx,
                            void (*after)(struct c10d__store_session *s));
/* The owner takes s->out's buffer (it sets s->out to zero itself): returns
 * the bytes charged for it, which the owner now holds and must give back with
 * c10d__store_ctx_release_reply() when the buffer is freed. */
size_t c10d__store_session_take_out_charge(struct c10d__store_session *s);
void c10d__store_ctx_release_reply(struct c10d__store_ctx *ctx, size_t charged);
/* 1 while part of a request is buffered (the parser is not between requests,
 * or bytes wait in the own buffer) and the session is not stalled: the
 * client owes the server bytes. A pending WAIT is not a partial request. */
int c10d__store_session_mid_request(const struct c10d__store_session *s);
/* The command of the partial request (enum c10d__wire_cmd), or -1 when its
 * command byte has not been read yet. */
int c10d__store_session_partial_cmd(const struct c10d__store_session *s);
/* 1 once the first request (VALIDATE in the current dialect) completed and,
 * where the context has a token, AUTH presented it. */
int c10d__store_session_started(const struct c10d__store_session *s);
/* Marks the session closing with a reason (first reason wins). */
void c10d__store_session_fail(struct c10d__store_session *s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif
