/* One connection's protocol: the dialect, parsing requests (a one-pass fast
 * path and a state machine for partial or bad input), the reply budget, the
 * MULTI_GET cache, parked waits. Commands run in store_server/table/exec.c. */
#include "session.h"

#include "engine/log.h"
#include "engine/token.h"
#include "store_server/table/exec.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SHARED_BUF_BYTES (64 * 1024)
#define MIN_OWN_BUF      4096
/* An own buffer left with a small tail after a big request shrinks to the
 * tail plus this. */
#define OWN_SHRINK_ROOM    (64 * 1024)
#define MGET_CACHE_MAX     (64u << 20)
#define DEFAULT_QUEUED_CAP (256u << 20)
#define SMALL_BACKLOG      (64 * 1024)
/* s->out grows at most this much past what a reply needs. */
#define OUT_SLACK (1u << 20)
/* Admission estimate of a STATS reply (its real size is charged once built). */
#define STATS_ESTIMATE 4096

static size_t add_sat(size_t a, size_t b)
{
    return a > SIZE_MAX - b ? SIZE_MAX : a + b;
}

void c10d__store_session_fail(struct c10d__store_session *s, const char *fmt, ...)
{
    if (s->closing)
        return;
    s->closing = 1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->reason, sizeof s->reason, fmt, ap);
    va_end(ap);
}

/* Keys are mostly text; show them safely in log lines. */
static const char *printable(struct c10d__wire_str key, char *buf, size_t size)
{
    size_t j = 0;
    for (size_t i = 0; i < key.len && j + 5 < size; i++) {
        uint8_t c = key.data[i];
        if (c >= 0x20 && c < 0x7f && c != '\\') {
            buf[j++] = (char)c;
        } else {
            j += (size_t)snprintf(buf + j, size - j, "\\x%02x", c);
        }
        if (i + 1 < key.len && j + 5 >= size) {
            buf[j++] = '.';
            break;
        }
    }
    buf[j] = 0;
    return buf;
}

/* ------------------------------------------------------- table callbacks */

static struct c10d__store_session *session_of(struct c10d__store_client *c)
{
    return c->data;
}

static int out_reserve(struct c10d__store_session *s, size_t n, const char *what);
static void do_flush(struct c10d__store_session *s);

static void on_wake(struct c10d__store_client *c)
{
    struct c10d__store_session *s = session_of(c);
    if (s->closing)
        return;
    if (out_reserve(s, 1, "STOP_WAITING") == 0)
        c10d__wire_put_u8(&s->out, C10D_STORE_STOP_WAITING);
    do_flush(s);
}

/* A watch event cannot wait for the server-wide reply cap as a request can:
 * one that does not fit (over max_reply, past what the server may queue, or
 * over the memory budget) closes that watcher's connection. Without this, a
 * change of a 256 MiB key pushes 512 MiB to every watcher. */
static void on_watch(struct c10d__store_client *c, int event, struct c10d__wire_str key,
                     struct c10d__wire_str old_value, struct c10d__wire_str new_value)
{
    struct c10d__store_session *s = session_of(c);
    struct c10d__store_ctx *ctx = s->ctx;
    if (s->closing)
        return;
    size_t n = add_sat(add_sat(25 + key.len, old_value.len), new_value.len);
    size_t hard = add_sat(ctx->queued_cap, ctx->max_reply ? ctx->max_reply : ctx->queued_cap);
    if (ctx->queued_cap && n > ctx->small_backlog &&
        add_sat(add_sat(ctx->queued, s->out.len), n) > hard) {
        c10d__store_session_fail(s,
                                 "watch event of %zu bytes: the server already queues %zu bytes "
                                 "of replies (limit %zu)",
                                 n, ctx->queued, hard);
    } else if (out_reserve(s, n, "watch event") == 0) {
        c10d__wire_put_u8(&s->out, (uint8_t)event);
        c10d__wire_put_str(&s->out, key.data, key.len);
        c10d__wire_put_str(&s->out, old_value.data, old_value.len);
        c10d__wire_put_str(&s->out, new_value.data, new_value.len);
    }
    do_flush(s);
}

int c10d__store_ctx_init(struct c10d__store_ctx *ctx, const struct c10d__wire_codec_limits *lim,
                         size_t max_memory, void (*flush)(struct c10d__store_session *s))
{
    memset(ctx, 0, sizeof *ctx);
    if (lim)
        ctx->limits = *lim;
    ctx->flush = flush;
    ctx->queued_cap = DEFAULT_QUEUED_CAP;
    ctx->small_backlog = SMALL_BACKLOG;
    ctx->mget_cache_max = MGET_CACHE_MAX;
    struct c10d__store_table_cbs cbs = {.wake = on_wake, .watch = on_watch};
    C10D_CHECK(c10d__store_table_create(&cbs, max_memory, &ctx->table));
    ctx->shared_cap = SHARED_BUF_BYTES;
    ctx->shared = malloc(ctx->shared_cap);
    if (!ctx->shared) {
        c10d__store_table_free(ctx->table);
        return c10d__fail(C10D_ENOMEM, "store: out of memory");
    }
    return 0;
}

void c10d__store_blob_ref(struct c10d__store_blob *b)
{
    b->refs++;
}

void c10d__store_blob_unref(struct c10d__store_blob *b)
{
    if (b && --b->refs == 0) {
        c10d__store_table_release(b->table, b->charged);
        free(b);
    }
}

static void mget_drop(struct c10d__store_ctx *ctx)
{
    struct c10d__store_mget_cache *m = &ctx->mget;
    if (m->charged)
        c10d__store_table_release(ctx->table, m->charged);
    free(m->key_lens);
    free(m->key_bytes);
    c10d__store_blob_unref(m->reply);
    memset(m, 0, sizeof *m);
}

void c10d__store_ctx_free(struct c10d__store_ctx *ctx)
{
    mget_drop(ctx);
    c10d__store_table_free(ctx->table);
    free(ctx->shared);
    ctx->table = NULL;
    ctx->shared = NULL;
}

/* ------------------------------------------------ server-wide reply cap */

static void fifo_push(struct c10d__store_session *s)
{
    struct c10d__store_ctx *ctx = s->ctx;
    if (s->in_fifo)
        return;
    s->in_fifo = 1;
    s->fifo_next = NULL;
    s->fifo_prev = ctx->stall_tail;
    if (ctx->stall_tail)
        ctx->stall_tail->fifo_next = s;
    else
        ctx->stall_head = s;
    ctx->stall_tail = s;
    ctx->stalls++;
}

static void fifo_remove(struct c10d__store_session *s)
{
    struct c10d__store_ctx *ctx = s->ctx;
    if (!s->in_fifo)
        return;
    if (s->fifo_prev)
        s->fifo_prev->fifo_next = s->fifo_next;
    else
        ctx->stall_head = s->fifo_next;
    if (s->fifo_next)
        s->fifo_next->fifo_prev = s->fifo_prev;
    else
        ctx->stall_tail = s->fifo_prev;
    s->fifo_prev = s->fifo_next = NULL;
    s->in_fifo = 0;
}

void c10d__store_session_set_pending(struct c10d__store_session *s, size_t pending)
{
    s->ctx->queued = s->ctx->queued - s->pending_out + pending;
    s->pending_out = pending;
}

/* A session must wait when the cap is reached, and also while others wait
 * for it, so that a newcomer cannot overtake the FIFO. Except a session whose
 * own backlog stays small with this reply (`reply` bytes): the cap exists for
 * big replies, and a client that never reads a big one must not delay every
 * other client's PING. */
static int over_queued_cap(const struct c10d__store_session *s, size_t reply)
{
    const struct c10d__store_ctx *ctx = s->ctx;
    if (!ctx->queued_cap)
        return 0;
    size_t small =
        ctx->small_backlog < ctx->queued_cap / 16 ? ctx->small_backlog : ctx->queued_cap / 16;
    if (add_sat(s->out.len + s->pending_out, reply) <= small)
        return 0;
    return ctx->queued >= ctx->queued_cap || (ctx->stall_head && !s->resuming);
}

void c10d__store_ctx_resume(struct c10d__store_ctx *ctx,
                            void (*after)(struct c10d__store_session *s))
{
    while (ctx->stall_head && (!ctx->queued_cap || ctx->queued < ctx->queued_cap)) {
        struct c10d__store_session *s = ctx->stall_head;
        fifo_remove(s);
        s->resuming = 1;
        c10d__store_session_received(s, 0);
        s->resuming = 0;
        after(s);
    }
}

/* -------------------------------------------------------------- session */

void c10d__store_session_init(struct c10d__store_session *s, struct c10d__store_ctx *ctx,
                              const char *peer)
{
    memset(s, 0, sizeof *s);
    s->ctx = ctx;
    s->client.data = s;
    c10d__wire_parser_init(&s->parser, &ctx->limits);
    snprintf(s->peer, sizeof s->peer, "%s", peer ? peer : "?");
}

static void free_own(struct c10d__store_session *s)
{
    if (s->in) {
        c10d__store_table_release(s->ctx->table, s->in_cap);
        free(s->in);
    }
    s->in = NULL;
    s->in_cap = s->in_len = 0;
}

void c10d__store_ctx_release_reply(struct c10d__store_ctx *ctx, size_t charged)
{
    if (!charged)
        return;
    c10d__store_table_release(ctx->table, charged);
    ctx->reply_charged = charged > ctx->reply_charged ? 0 : ctx->reply_charged - charged;
}

size_t c10d__store_session_take_out_charge(struct c10d__store_session *s)
{
    size_t n = s->out_charged;
    s->out_charged = 0;
    return n;
}

/* After the owner ran: release what s->out no longer holds. */
static void out_sync(struct c10d__store_session *s)
{
    if (s->out.cap < s->out_charged) {
        c10d__store_ctx_release_reply(s->ctx, s->out_charged - s->out.cap);
        s->out_charged = s->out.cap;
    }
}

static void do_flush(struct c10d__store_session *s)
{
    s->ctx->flush(s);
    out_sync(s);
}

/* Room for an n-byte reply in s->out, charged to the memory budget before it
 * is allocated. A reply over ctx->max_reply, or one the budget cannot hold,
 * closes the connection: the protocol has no error reply. */
static int out_reserve(struct c10d__store_session *s, size_t n, const char *what)
{
    struct c10d__store_ctx *ctx = s->ctx;
    if (s->closing)
        return C10D_EPROTO;
    if (ctx->max_reply && n > ctx->max_reply) {
        ctx->closed_reply_cap++;
        c10d__store_session_fail(s, "%s reply of %zu bytes over the limit of %zu", what, n,
                                 ctx->max_reply);
        return C10D_ENOMEM;
    }
    struct c10d__wire_buf *b = &s->out;
    if (n <= b->cap - b->len)
        return 0;
    size_t want = add_sat(b->len, n);
    size_t cap = b->cap ? b->cap * 2 : 256;
    if (cap > add_sat(want, OUT_SLACK))
        cap = add_sat(want, OUT_SLACK);
    if (cap < want)
        cap = want;
    if (want == SIZE_MAX || c10d__store_table_charge(ctx->table, cap - b->cap) < 0) {
        struct c10d__store_table_stats st;
        c10d__store_table_get_stats(ctx->table, &st);
        c10d__store_session_fail(s,
                                 "%s reply of %zu bytes: server memory limit reached "
                                 "(%zu of %zu bytes in use, %zu of them replies)",
                                 what, n, st.memory, st.memory_limit, ctx->reply_charged);
        return C10D_ENOMEM;
    }
    uint8_t *p = realloc(b->data, cap);
    if (!p) {
        c10d__store_table_release(ctx->table, cap - b->cap);
        c10d__store_session_fail(s, "out of memory for a %s reply of %zu bytes", what, n);
        return C10D_ENOMEM;
    }
    ctx->reply_charged += cap - b->cap;
    s->out_charged += cap - b->cap;
    b->data = p;
    b->cap = cap;
    return 0;
}

void c10d__store_session_free(struct c10d__store_session *s)
{
    fifo_remove(s);
    c10d__store_session_set_pending(s, 0);
    c10d__store_table_client_gone(s->ctx->table, &s->client);
    free_own(s);
    c10d__wire_parser_free(&s->parser);
    c10d__wire_buf_free(&s->out);
    out_sync(s);
}

int c10d__store_session_mid_request(const struct c10d__store_session *s)
{
    return !s->stalled && !s->closing && (s->in_len > 0 || !c10d__wire_parser_idle(&s->parser));
}

int c10d__store_session_partial_cmd(const struct c10d__store_session *s)
{
    /* The command is known once the parser left its start phase. */
    if (c10d__wire_parser_idle(&s->parser) || s->parser.phase <= 0)
        return -1;
    return s->parser.cmd;
}

int c10d__store_session_started(const struct c10d__store_session *s)
{
    return s->requests > 0 && (!s->ctx->token_len || s->authed);
}

/* How much to grow an own buffer holding `held` bytes: what the parser needs,
 * but never more than max(held, MIN_OWN_BUF) at once (doubling), so the
 * buffer and its charge stay within about twice the bytes that arrived: a
 * header that announces a 256 MiB value is charged 4 KiB, not 256 MiB. */
static size_t own_step(const struct c10d__store_session *s, size_t held)
{
    size_t step = held > MIN_OWN_BUF ? held : MIN_OWN_BUF;
    size_t need = s->parser.need;
    if (need < step)
        step = need;
    return step < MIN_OWN_BUF ? MIN_OWN_BUF : step;
}

/* Makes the own buffer hold at least `cap` bytes (charged to the budget). */
static int own_reserve(struct c10d__store_session *s, size_t cap)
{
    if (cap <= s->in_cap)
        return 0;
    if (c10d__store_table_charge(s->ctx->table, cap - s->in_cap) < 0) {
        c10d__store_session_fail(s, "server memory limit reached (buffering a %zu-byte request)",
                                 cap);
        return C10D_ENOMEM;
    }
    uint8_t *p = realloc(s->in, cap);
    if (!p) {
        c10d__store_table_release(s->ctx->table, cap - s->in_cap);
        c10d__store_session_fail(s, "out of memory buffering a %zu-byte request", cap);
        return C10D_ENOMEM;
    }
    s->in = p;
    s->in_cap = cap;
    return 0;
}

void c10d__store_session_rbuf(struct c10d__store_session *s, size_t suggested, uint8_t **base,
                              size_t *len)
{
    (void)suggested;
    if (s->in_len == 0) {
        s->reading_shared = 1;
        *base = s->ctx->shared;
        *len = s->ctx->shared_cap;
        return;
    }
    s->reading_shared = 0;
    size_t room = s->in_cap - s->in_len;
    size_t need = s->parser.need ? s->parser.need : 1;
    if (room < need && room < MIN_OWN_BUF) {
        if (own_reserve(s, s->in_len + own_step(s, s->in_len)) < 0) {
            *base = NULL;
            *len = 0;
            return;
        }
    }
    *base = s->in + s->in_len;
    *len = s->in_cap - s->in_len;
}

/* ------------------------------------------------------------- dispatch */

static int reply_ok(struct c10d__store_session *s, int rc)
{
    if (rc < 0)
        c10d__store_session_fail(s, "out of memory for a reply");
    return rc;
}

/* In a rendezvous every rank asks for the same N keys once the table stopped
 * changing: answer repeats with one copy instead of N lookups and encodes. */
static int mget_match(struct c10d__store_session *s, const struct c10d__wire_request *r)
{
    struct c10d__store_mget_cache *m = &s->ctx->mget;
    if (!s->ctx->mget_cache_max || !m->reply || m->generation != s->ctx->generation ||
        m->nkeys != r->nargs)
        return 0;
    const uint8_t *p = m->key_bytes;
    for (size_t i = 0; i < r->nargs; i++) {
        if (m->key_lens[i] != r->args[i].len ||
            (r->args[i].len && memcmp(p, r->args[i].data, r->args[i].len)))
            return 0;
        p += r->args[i].len;
    }
    return 1;
}

/* By reference: N ranks reading N addresses cost one copy. What s->out
 * holds goes first, so replies keep their order. */
static void send_shared(struct c10d__store_session *s, struct c10d__store_blob *b)
{
    if (s->out.len)
        do_flush(s);
    if (!s->closing) {
        s->ctx->send_blob(s, b);
        s->ctx->blob_sends++;
    }
}

static int mget_hit(struct c10d__store_session *s, const struct c10d__wire_request *r)
{
    struct c10d__store_ctx *ctx = s->ctx;
    struct c10d__store_blob *b = ctx->mget.reply;
    if (!mget_match(s, r))
        return 0;
    ctx->mget_hits++;
    if (ctx->send_blob) {
        send_shared(s, b);
        return 1;
    }
    reply_ok(s, c10d__wire_put_raw(&s->out, b->data, b->len));
    return 1;
}

/* The size of the reply `r` will get, known before it runs. */
static size_t reply_size(struct c10d__store_session *s, const struct c10d__wire_request *r,
                         struct c10d__store_exec_plan *plan)
{
    if (r->cmd == C10D_STORE_STATS)
        return STATS_ESTIMATE;
    if (r->cmd == C10D_STORE_MULTI_GET && mget_match(s, r)) /* by reference, or copied */
        return s->ctx->send_blob ? 0 : s->ctx->mget.reply->len;
    return c10d__store_exec_reply_bound(s->ctx->table, r, plan);
}

static void mget_remember(struct c10d__store_session *s, const struct c10d__wire_request *r,
                          const uint8_t *reply, size_t reply_len)
{
    struct c10d__store_ctx *ctx = s->ctx;
    mget_drop(ctx);
    if (reply_len > ctx->mget_cache_max || r->nargs == 0)
        return;
    size_t key_total = 0;
    for (size_t i = 0; i < r->nargs; i++)
        key_total += r->args[i].len;
    size_t charge = key_total + r->nargs * sizeof(size_t);
    size_t blob_charge = sizeof(struct c10d__store_blob) + reply_len;
    /* The cache is an optimisation: never let it refuse a client's data. */
    if (c10d__store_table_charge(ctx->table, charge) < 0)
        return;
    struct c10d__store_mget_cache *m = &ctx->mget;
    m->charged = charge;
    if (c10d__store_table_charge(ctx->table, blob_charge) < 0) {
        mget_drop(ctx);
        return;
    }
    m->reply = malloc(blob_charge);
    if (m->reply)
        *m->reply = (struct c10d__store_blob){1, reply_len, blob_charge, ctx->table};
    else
        c10d__store_table_release(ctx->table, blob_charge);
    m->key_lens = malloc(r->nargs * sizeof(size_t));
    m->key_bytes = malloc(key_total ? key_total : 1);
    if (!m->key_lens || !m->key_bytes || !m->reply) {
        mget_drop(ctx);
        return;
    }
    uint8_t *p = m->key_bytes;
    for (size_t i = 0; i < r->nargs; i++) {
        m->key_lens[i] = r->args[i].len;
        if (r->args[i].len) /* an empty key may have no data pointer */
            memcpy(p, r->args[i].data, r->args[i].len);
        p += r->args[i].len;
    }
    if (reply_len)
        memcpy(m->reply->data, reply, reply_len);
    m->nkeys = r->nargs;
    m->generation = ctx->generation;
}

static void table_error(struct c10d__store_session *s, int rc, const struct c10d__wire_request *r)
{
    char k[80];
    if (rc == C10D_EINVAL)
        c10d__store_session_fail(s,
                                 "%s on key '%s' whose value is not a decimal integer "
                                 "(or the result overflows int64)",
                                 c10d__wire_cmd_name(r->cmd),
                                 r->nargs ? printable(r->args[0], k, sizeof k) : "");
    else
        c10d__store_session_fail(s, "%s: server memory limit reached (or no memory for the reply)",
                                 c10d__wire_cmd_name(r->cmd));
}

/* out_reserve() when the reply may not fit; the command's name is only
 * looked up for the message of a failure. */
static inline int out_room(struct c10d__store_session *s, size_t n, int cmd)
{
    struct c10d__wire_buf *b = &s->out;
    if (!s->closing && (!s->ctx->max_reply || n <= s->ctx->max_reply) && n <= b->cap - b->len)
        return 0;
    return out_reserve(s, n, c10d__wire_cmd_name(cmd));
}

/* A MULTI_GET answered into s->out from `start` is kept for the next reader
 * (with send_blob, this reader too sends the cached copy). */
static void mget_after(struct c10d__store_session *s, const struct c10d__wire_request *r,
                       size_t start)
{
    struct c10d__store_ctx *ctx = s->ctx;
    if (!ctx->mget_cache_max || r->nargs == 0) /* else s->out.data may be NULL */
        return;
    ctx->mget_misses++;
    mget_remember(s, r, s->out.data + start, s->out.len - start);
    if (ctx->send_blob && ctx->mget.reply) {
        s->out.len = start;
        if (start == 0) { /* and its room goes back to the budget */
            c10d__wire_buf_free(&s->out);
            out_sync(s);
        }
        send_shared(s, ctx->mget.reply);
    }
}

/* Runs `r` (reply: at most `reply` bytes) through the executor, with what
 * this host adds around it: budget, MULTI_GET cache, STATS, logs. */
static void handle(struct c10d__store_session *s, const struct c10d__wire_request *r, size_t reply,
                   const struct c10d__store_exec_plan *plan)
{
    struct c10d__store_ctx *ctx = s->ctx;
    struct c10d__store_table *t = ctx->table;
    struct c10d__wire_buf *out = &s->out;
    const struct c10d__wire_str *a = r->args;
    ctx->ops[r->cmd]++;
    /* A wake this client owes a queue is settled by what it asks next (a
     * test here: the call is rare, and this is every request's path). */
    if (s->client.owed_wake != NULL) {
        struct c10d__wire_str none = {NULL, 0};
        c10d__store_table_client_request(t, &s->client, r->cmd, r->nargs ? a[0] : none);
    }
    /* Charged before the command runs: a refused reply leaves the table as it
     * was (STATS charges its real size once built). */
    if (reply && r->cmd != C10D_STORE_STATS && out_room(s, reply, r->cmd) < 0)
        return;
    if (!c10d__wire_cmd_read_only(r->cmd)) {
        ctx->generation++;
        if (ctx->mget.reply)
            mget_drop(ctx);
    }
    if (r->cmd == C10D_STORE_STATS) {
        char *json = ctx->stats_json ? ctx->stats_json(ctx) : NULL;
        const char *text = json ? json : "{}";
        if (out_reserve(s, 8 + strlen(text), "STATS") == 0)
            reply_ok(s, c10d__wire_put_str(out, text, strlen(text)));
        free(json);
        return;
    }
    if (r->cmd == C10D_STORE_MULTI_GET && mget_hit(s, r))
        return;
    size_t start = out->len;
    struct c10d__store_exec_result res;
    int rc = c10d__store_exec(t, &s->client, r, plan, out, &res);
    if (rc < 0) {
        table_error(s, rc, r);
        return;
    }
    switch (r->cmd) {
    case C10D_STORE_GET:
        if (!res.value) {
            /* Only a race with DELETE_KEY gets here: PyTorch clients WAIT first. */
            char k[80];
            ctx->missing_gets++;
            C10D_INFO("store", "%s: GET of missing key '%s': answered with an empty value", s->peer,
                      printable(a[0], k, sizeof k));
        }
        break;
    case C10D_STORE_ADD:
        if (ctx->world_size > 0 && res.value == ctx->world_size && a[0].len == 5 &&
            !memcmp(a[0].data, "init/", 5))
            C10D_INFO("store", "all %d workers registered (init/ reached %d)", ctx->world_size,
                      ctx->world_size);
        break;
    case C10D_STORE_MULTI_GET:
        mget_after(s, r, start);
        break;
    }
}

/* With a token: 1 if the request may run. Otherwise the session is marked
 * closing (an AUTH with the wrong token is answered REFUSED first, so that
 * the client can tell a wrong token from a dropped connection). */
static int gate(struct c10d__store_session *s, const struct c10d__wire_request *r)
{
    struct c10d__store_ctx *ctx = s->ctx;
    if (!ctx->token_len || s->authed)
        return 1;
    if (s->parser.dialect == C10D_STORE_DIALECT_LEGACY) {
        ctx->auth_failures++;
        c10d__store_session_fail(
            s, "this server requires a token and the legacy dialect cannot present one");
        return 0;
    }
    if (r->cmd == C10D_STORE_VALIDATE)
        return 1;
    if (r->cmd == C10D_STORE_AUTH) {
        ctx->ops[r->cmd]++;
        if (c10d__token_equal(r->args[0].data, r->args[0].len, ctx->token, ctx->token_len)) {
            s->authed = 1;
            reply_ok(s, c10d__wire_put_u8(&s->out, C10D_STORE_AUTH_OK));
            return 0;
        }
        ctx->auth_failures++;
        reply_ok(s, c10d__wire_put_u8(&s->out, C10D_STORE_AUTH_REFUSED));
        c10d__store_session_fail(s, "wrong token presented (AUTH)");
        return 0;
    }
    ctx->auth_failures++;
    c10d__store_session_fail(s, "no valid token presented before %s", c10d__wire_cmd_name(r->cmd));
    return 0;
}

/* Runs every complete request in buf[0..len); returns the bytes consumed. */
static size_t process(struct c10d__store_session *s, const uint8_t *buf, size_t len)
{
    size_t start = 0;
    size_t cap = s->ctx->out_cap;
    s->stalled = 0;
    while (!s->closing && start < len) {
        /* A client that pipelines requests without reading the replies must
         * not make one read (64 KiB of GETs) queue gigabytes: stop here and
         * keep the rest of the input until the owner drained the replies. */
        if (cap && s->out.len + s->pending_out >= cap) {
            if (s->out.len)
                do_flush(s);
            if (s->closing || s->out.len + s->pending_out >= cap) {
                s->stalled = 1;
                break;
            }
        }
        /* Bytes of a new request while a WAIT/BARRIER is pending: the client
         * gave up on it (1.13 clients cannot cancel), so its late answer must
         * never land on this request. */
        if (s->client.wait && c10d__wire_parser_idle(&s->parser))
            c10d__store_table_cancel_wait(s->ctx->table, &s->client);
        struct c10d__wire_request req;
        size_t used;
        int rc = c10d__wire_parse_request(&s->parser, buf + start, len - start, &req, &used);
        if (rc == C10D_STORE_PARSE_MORE)
            break;
        if (rc < 0) {
            c10d__store_session_fail(s, "%s", s->parser.error);
            break;
        }
        /* The reply's size is known before it is built: refuse one over the
         * per-request cap, and let a big one wait for the server-wide cap
         * (hand over what this session has and queue it behind the sessions
         * already waiting). A request that waits is parsed again later: the
         * parser is between requests and its bytes stay in the buffer. */
        struct c10d__store_exec_plan plan = {0, 0, {NULL, 0}};
        size_t reply = reply_size(s, &req, &plan);
        if (s->ctx->max_reply && reply > s->ctx->max_reply) {
            s->ctx->closed_reply_cap++;
            c10d__store_session_fail(s, "%s reply of %zu bytes over the limit of %zu",
                                     c10d__wire_cmd_name(req.cmd), reply, s->ctx->max_reply);
            break;
        }
        if (over_queued_cap(s, reply)) {
            if (s->out.len)
                do_flush(s);
            if (s->closing)
                break;
            if (over_queued_cap(s, reply)) {
                s->stalled = 1;
                fifo_push(s);
                break;
            }
        }
        s->requests++;
        if (gate(s, &req))
            handle(s, &req, reply, &plan);
        start += used;
        /* A 10k-key MULTI_GET leaves 240 KB of argument arrays behind; kept
         * by 10k sessions that is gigabytes of RSS. */
        if (s->parser.cap > 1024)
            c10d__wire_parser_free(&s->parser);
    }
    return start;
}

int c10d__store_session_received(struct c10d__store_session *s, size_t n)
{
    if (s->closing)
        return C10D_EPROTO;
    s->bytes_in += n;
    if (s->reading_shared && n == 0)
        s->reading_shared = 0;
    if (s->reading_shared) {
        s->reading_shared = 0;
        const uint8_t *buf = s->ctx->shared;
        size_t used = process(s, buf, n);
        /* Keep the unfinished tail: sized for what the parser says it needs. */
        if (!s->closing && used < n) {
            size_t rest = n - used;
            if (own_reserve(s, rest + own_step(s, rest)) == 0) {
                memcpy(s->in, buf + used, rest);
                s->in_len = rest;
            }
        }
    } else {
        s->in_len += n;
        size_t used = process(s, s->in, s->in_len);
        if (used) {
            memmove(s->in, s->in + used, s->in_len - used);
            s->in_len -= used;
        }
        if (s->in_len == 0) {
            free_own(s); /* the next read goes to the shared buffer */
        } else if (used && s->in_cap > 4 * s->in_len + 2 * OWN_SHRINK_ROOM) {
            /* A big request left a small tail: do not keep (and charge) its room. */
            size_t cap = s->in_len + OWN_SHRINK_ROOM;
            uint8_t *p = realloc(s->in, cap);
            if (p) {
                c10d__store_table_release(s->ctx->table, s->in_cap - cap);
                s->in = p;
                s->in_cap = cap;
            }
        }
    }
    if (s->out.len || s->closing)
        do_flush(s);
    return s->closing ? C10D_EPROTO : 0;
}

int c10d__store_session_feed(struct c10d__store_session *s, const uint8_t *data, size_t len)
{
    while (len > 0) {
        uint8_t *base;
        size_t room;
        c10d__store_session_rbuf(s, len, &base, &room);
        if (room == 0)
            return C10D_ENOMEM;
        size_t n = len < room ? len : room;
        memcpy(base, data, n);
        C10D_CHECK(c10d__store_session_received(s, n));
        data += n;
        len -= n;
    }
    return 0;
}
