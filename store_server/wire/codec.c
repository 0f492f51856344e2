#include "codec.h"

#include "engine/error.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Field layout after the command byte: [u32] [u64 count] strings [i64]. */
struct layout {
    uint8_t u32;      /* VALIDATE magic / PING nonce */
    uint8_t counted;  /* u64 count of items, then items */
    uint8_t per_item; /* strings per counted item */
    uint8_t nstr;     /* strings when not counted */
    uint8_t i64;      /* trailing i64 */
    uint8_t values;   /* bit i set: string i (of an item) is a value, else a key */
};

/* commands.h, one row per command. */
static const struct command {
    const char *name;
    int16_t wire[2]; /* current, legacy; -1: not in that dialect */
    struct layout layout;
    uint8_t reply, read_only, waits;
} commands[C10D_STORE_CMD_COUNT] = {
#define ROW(name, current, legacy, u32, counted, per_item, nstr, i64, values, reply, ro, waits)    \
    [C10D_STORE_##name] = {#name,                                                                  \
                           {current, legacy},                                                      \
                           {u32, counted, per_item, nstr, i64, values},                            \
                           C10D_STORE_REPLY_##reply,                                               \
                           ro,                                                                     \
                           waits},
    C10D__STORE_COMMANDS(ROW)
#undef ROW
};

static int dialect_index(int dialect)
{
    return dialect == C10D_STORE_DIALECT_CURRENT  ? 0
           : dialect == C10D_STORE_DIALECT_LEGACY ? 1
                                                  : -1;
}

const char *c10d__wire_cmd_name(int cmd)
{
    return cmd >= 0 && cmd < C10D_STORE_CMD_COUNT ? commands[cmd].name : "?";
}

/* Wire byte -> command + 1 (0: none), per dialect, indexed by byte + 1: one
 * load per request on the server's hot path (a scan of the table cost 30
 * instructions of ~900 per request). Rows a dialect lacks (-1) all land on
 * index 0, which no byte reads; their overriding one another is the point. */
#pragma GCC diagnostic push
#if defined(__clang__)
#pragma GCC diagnostic ignored "-Winitializer-overrides"
#else
#pragma GCC diagnostic ignored "-Woverride-init"
#endif
static const uint8_t from_wire[2][257] = {
#define CURRENT(name, current, ...)        [(current) + 1] = C10D_STORE_##name + 1,
#define LEGACY(name, current, legacy, ...) [(legacy) + 1] = C10D_STORE_##name + 1,
    {C10D__STORE_COMMANDS(CURRENT)},
    {C10D__STORE_COMMANDS(LEGACY)},
#undef CURRENT
#undef LEGACY
};
#pragma GCC diagnostic pop

int c10d__wire_cmd_from_wire(int dialect, uint8_t byte)
{
    int d = dialect_index(dialect);
    return d >= 0 ? from_wire[d][byte + 1] - 1 : -1;
}

int c10d__wire_cmd_to_wire(int dialect, int cmd)
{
    int d = dialect_index(dialect);
    return d >= 0 && cmd >= 0 && cmd < C10D_STORE_CMD_COUNT ? commands[cmd].wire[d] : -1;
}

int c10d__wire_cmd_read_only(int cmd)
{
    return cmd >= 0 && cmd < C10D_STORE_CMD_COUNT && commands[cmd].read_only;
}

int c10d__wire_cmd_waits(int cmd)
{
    return cmd >= 0 && cmd < C10D_STORE_CMD_COUNT ? commands[cmd].waits : 0;
}

int c10d__wire_cmd_arg_is_key(int cmd, size_t i)
{
    if (cmd < 0 || cmd >= C10D_STORE_CMD_COUNT)
        return 0;
    const struct layout *l = &commands[cmd].layout;
    size_t in_item = l->counted ? i % (l->per_item ? l->per_item : 1) : i;
    return in_item < 8 && !((l->values >> in_item) & 1);
}

static const struct layout *layout_of(int cmd)
{
    return &commands[cmd].layout;
}

/* --------------------------------------------------------------- integers */

uint32_t c10d__wire_get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

uint64_t c10d__wire_get_u64(const uint8_t *p)
{
    return (uint64_t)c10d__wire_get_u32(p) | (uint64_t)c10d__wire_get_u32(p + 4) << 32;
}

int c10d__wire_parse_i64(const uint8_t *d, size_t len, int64_t *out)
{
    size_t i = 0;
    while (i < len && (d[i] == ' ' || (d[i] >= '\t' && d[i] <= '\r')))
        i++;
    int neg = 0;
    if (i < len && (d[i] == '+' || d[i] == '-'))
        neg = d[i++] == '-';
    if (i >= len || d[i] < '0' || d[i] > '9')
        return C10D_EINVAL;
    /* Accumulate negatively so INT64_MIN parses. */
    int64_t v = 0;
    for (; i < len && d[i] >= '0' && d[i] <= '9'; i++) {
        int digit = d[i] - '0';
        if (v < (INT64_MIN + digit) / 10)
            return C10D_EINVAL;
        v = v * 10 - digit;
    }
    if (!neg) {
        if (v == INT64_MIN)
            return C10D_EINVAL;
        v = -v;
    }
    *out = v;
    return 0;
}

/* ---------------------------------------------------------------- parser */

enum phase {
    PH_START = 0, /* request: command byte; reply: first fixed field */
    PH_U32,
    PH_COUNT,
    PH_LEN,
    PH_BODY,
    PH_I64,
    PH_DONE,
    /* reply-only */
    PH_R_U8,
    PH_R_I64,
};

static int fail(struct c10d__wire_parser *p, int status, const char *fmt, ...) C10D_PRINTF(3, 4);
static int fail(struct c10d__wire_parser *p, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->error, sizeof p->error, fmt, ap);
    va_end(ap);
    p->phase = -1;
    return status;
}

void c10d__wire_parser_init(struct c10d__wire_parser *p,
                            const struct c10d__wire_codec_limits *limits)
{
    memset(p, 0, sizeof *p);
    if (limits)
        p->limits = *limits;
}

void c10d__wire_parser_free(struct c10d__wire_parser *p)
{
    free(p->offs);
    free(p->args);
    p->offs = NULL;
    p->args = NULL;
    p->cap = 0;
}

int c10d__wire_parser_idle(const struct c10d__wire_parser *p)
{
    return p->phase == PH_START && p->pos == 0;
}

/* Do we have n more bytes at p->pos? If not, record how many are missing. */
static int have(struct c10d__wire_parser *p, size_t len, uint64_t n)
{
    if (len >= p->pos && len - p->pos >= n)
        return 1;
    p->need = (size_t)(p->pos + n - len);
    return 0;
}

static void reset(struct c10d__wire_parser *p)
{
    p->phase = PH_START;
    p->pos = 0;
    p->count = 0;
    p->nstr = 0;
    p->cur_len = 0;
    p->u32 = 0;
    p->i64 = 0;
}

/* Whether string number `i` of the current request is a value (for limits). */
static int string_is_value(const struct c10d__wire_parser *p, size_t i)
{
    const struct layout *l = layout_of(p->cmd);
    size_t per = l->counted ? l->per_item : 1;
    size_t in_item = l->counted ? i % per : i;
    return (l->values >> in_item) & 1;
}

/* Makes room for n strings in the argument arrays (offs and args together:
 * the general parser keeps them the same size). */
static int reserve_args(struct c10d__wire_parser *p, size_t n)
{
    if (n <= p->cap)
        return 0;
    size_t cap = p->cap ? p->cap : 8;
    while (cap < n)
        cap *= 2;
    size_t *offs = realloc(p->offs, cap * sizeof *offs);
    if (!offs)
        return C10D_ENOMEM;
    p->offs = offs;
    struct c10d__wire_str *args = realloc(p->args, cap * sizeof *args);
    if (!args)
        return C10D_ENOMEM;
    p->args = args;
    p->cap = cap;
    return 0;
}

/* Reads `p->count` strings starting at PH_LEN; shared by requests and replies.
 * `value_rule`: 0 = request layout (key/value by layout), 1 = all values,
 * 2 = all keys. Returns DONE when the strings are complete, MORE, or error. */
static int read_strings(struct c10d__wire_parser *p, const uint8_t *buf, size_t len, int value_rule)
{
    while (p->nstr < p->count) {
        if (p->phase == PH_LEN) {
            if (!have(p, len, 8))
                return C10D_STORE_PARSE_MORE;
            uint64_t n = c10d__wire_get_u64(buf + p->pos);
            int is_value = value_rule == 1 || (value_rule == 0 && string_is_value(p, p->nstr));
            uint64_t max = is_value ? p->limits.max_value_bytes : p->limits.max_key_bytes;
            if (max && n > max)
                return fail(p, C10D_ENOMEM, "%s of %" PRIu64 " bytes over the limit of %" PRIu64,
                            is_value ? "value" : "key", n, max);
            p->pos += 8;
            if (p->limits.max_request_bytes && n > p->limits.max_request_bytes - p->pos)
                return fail(p, C10D_ENOMEM,
                            "message of at least %" PRIu64 " bytes over the limit of %" PRIu64,
                            (uint64_t)p->pos + n, p->limits.max_request_bytes);
            /* Even without limits: no buffer can hold 2^47 bytes, and this
             * keeps every offset sum far from overflowing. */
            if (n > ((uint64_t)1 << 47))
                return fail(p, C10D_ENOMEM, "string of %" PRIu64 " bytes", n);
            p->cur_len = n;
            p->phase = PH_BODY;
        }
        if (!have(p, len, p->cur_len))
            return C10D_STORE_PARSE_MORE;
        if (reserve_args(p, p->nstr + 1) < 0)
            return fail(p, C10D_ENOMEM, "out of memory");
        p->offs[p->nstr] = p->pos;
        p->args[p->nstr].len = (size_t)p->cur_len;
        p->nstr++;
        p->pos += (size_t)p->cur_len;
        p->phase = PH_LEN;
    }
    return C10D_STORE_PARSE_DONE;
}

static void resolve_args(struct c10d__wire_parser *p, const uint8_t *buf)
{
    for (size_t i = 0; i < p->nstr; i++)
        p->args[i].data = buf + p->offs[i];
}

static const uint8_t magic_bytes[5] = {0x00, 0xCE, 0xF7, 0x85, 0x3C};

/* Decides the dialect from the first bytes. A first byte other than 0 cannot
 * start VALIDATE, so it decides at once; that matters because a 1.13 client's
 * first request may be a single byte (GETNUMKEYS) whose reply it awaits. A
 * legacy SET (byte 0) is at least 17 bytes long, so waiting for 5 is safe. */
static int detect(struct c10d__wire_parser *p, const uint8_t *buf, size_t len)
{
    size_t n = len < 5 ? len : 5;
    if (memcmp(buf, magic_bytes, n) != 0) {
        p->dialect = C10D_STORE_DIALECT_LEGACY;
        return 1;
    }
    if (n == 5) {
        p->dialect = C10D_STORE_DIALECT_CURRENT;
        return 1;
    }
    p->need = 5 - len;
    return 0;
}

/* Counted requests with more strings than this take the general path: their
 * argument arrays would be grown here for a request the general parser may
 * reject by its size. */
#define WHOLE_MAX_ARGS 64

/* The common case, a request whose bytes have all arrived, in one pass and
 * without the state machine's bookkeeping (half of a GET's parsing cost).
 * Returns DONE with exactly what the general parser would return, or 0 when
 * anything is missing, over a limit or malformed: the general parser then
 * runs from the same start and says what is wrong or how much it needs. */
static int parse_whole(struct c10d__wire_parser *p, const uint8_t *buf, size_t len,
                       struct c10d__wire_request *req, size_t *used)
{
    int cmd = c10d__wire_cmd_from_wire(p->dialect, buf[0]);
    if (cmd < 0)
        return 0;
    const struct layout *l = layout_of(cmd);
    size_t pos = 1;
    uint32_t u32 = 0;
    int64_t i64 = 0;
    uint64_t count = l->nstr;
    if (l->u32) {
        if (len - pos < 4)
            return 0;
        u32 = c10d__wire_get_u32(buf + pos);
        pos += 4;
        if (cmd == C10D_STORE_VALIDATE && u32 != C10D_STORE_MAGIC)
            return 0;
    }
    if (l->counted) {
        if (len - pos < 8)
            return 0;
        uint64_t n = c10d__wire_get_u64(buf + pos);
        if ((p->limits.max_keys && n > p->limits.max_keys) || n > WHOLE_MAX_ARGS / l->per_item)
            return 0;
        count = n * l->per_item;
        pos += 8;
    }
    if (reserve_args(p, (size_t)count) < 0)
        return 0;
    for (size_t i = 0; i < count; i++) {
        if (len - pos < 8)
            return 0;
        uint64_t n = c10d__wire_get_u64(buf + pos);
        size_t in_item = l->counted ? i % l->per_item : i;
        uint64_t max =
            (l->values >> in_item) & 1 ? p->limits.max_value_bytes : p->limits.max_key_bytes;
        if (max && n > max)
            return 0;
        pos += 8;
        /* The general parser's checks, in its terms, so that no request it
         * refuses is accepted here. */
        if (p->limits.max_request_bytes && n > p->limits.max_request_bytes - pos)
            return 0;
        if (n > ((uint64_t)1 << 47) || n > len - pos)
            return 0;
        p->args[i].data = buf + pos;
        p->args[i].len = (size_t)n;
        pos += (size_t)n;
    }
    if (l->i64) {
        if (len - pos < 8)
            return 0;
        i64 = (int64_t)c10d__wire_get_u64(buf + pos);
        pos += 8;
    }
    p->cmd = cmd;
    req->cmd = cmd;
    req->u32 = u32;
    req->i64 = i64;
    req->nargs = (size_t)count;
    req->args = p->args;
    *used = pos;
    return C10D_STORE_PARSE_DONE;
}

/* The state machine: any request, in as many calls as its bytes take. Kept
 * out of line so that the one-pass path's callers do not pay its frame. */
static __attribute__((noinline)) int parse_general(struct c10d__wire_parser *p, const uint8_t *buf,
                                                   size_t len, struct c10d__wire_request *req,
                                                   size_t *used)
{
    if (p->phase < 0)
        return fail(p, C10D_EPROTO, "parser used after an error");
    p->need = 0;
    if (len < p->pos)
        return fail(p, C10D_EINVAL, "buffer shorter than what was parsed before");
    if (p->phase == PH_START) {
        if (len == 0) {
            p->need = 1;
            return C10D_STORE_PARSE_MORE;
        }
        if (p->dialect == C10D_STORE_DIALECT_UNKNOWN && !detect(p, buf, len))
            return C10D_STORE_PARSE_MORE;
        int cmd = c10d__wire_cmd_from_wire(p->dialect, buf[0]);
        if (cmd < 0)
            return fail(p, C10D_EPROTO, "unknown command byte %u (%s dialect)", buf[0],
                        p->dialect == C10D_STORE_DIALECT_LEGACY ? "1.13" : "current");
        p->cmd = cmd;
        p->pos = 1;
        const struct layout *l = layout_of(cmd);
        p->phase = l->u32 ? PH_U32 : l->counted ? PH_COUNT : PH_LEN;
        p->count = l->nstr;
    }
    const struct layout *l = layout_of(p->cmd);
    if (p->phase == PH_U32) {
        if (!have(p, len, 4))
            return C10D_STORE_PARSE_MORE;
        p->u32 = c10d__wire_get_u32(buf + p->pos);
        p->pos += 4;
        if (p->cmd == C10D_STORE_VALIDATE && p->u32 != C10D_STORE_MAGIC)
            return fail(p, C10D_EPROTO, "VALIDATE with wrong magic 0x%08" PRIx32, p->u32);
        p->phase = PH_LEN;
    }
    if (p->phase == PH_COUNT) {
        if (!have(p, len, 8))
            return C10D_STORE_PARSE_MORE;
        uint64_t n = c10d__wire_get_u64(buf + p->pos);
        if (p->limits.max_keys && n > p->limits.max_keys)
            return fail(p, C10D_ENOMEM, "%s with %" PRIu64 " keys over the limit of %" PRIu64,
                        commands[p->cmd].name, n, p->limits.max_keys);
        if (n > UINT64_MAX / 4)
            return fail(p, C10D_EPROTO, "%s with %" PRIu64 " keys", commands[p->cmd].name, n);
        p->count = n * l->per_item;
        p->pos += 8;
        p->phase = PH_LEN;
    }
    if (p->phase == PH_LEN || p->phase == PH_BODY) {
        int rc = read_strings(p, buf, len, 0);
        if (rc != C10D_STORE_PARSE_DONE)
            return rc;
        p->phase = l->i64 ? PH_I64 : PH_DONE;
    }
    if (p->phase == PH_I64) {
        if (!have(p, len, 8))
            return C10D_STORE_PARSE_MORE;
        p->i64 = (int64_t)c10d__wire_get_u64(buf + p->pos);
        p->pos += 8;
        p->phase = PH_DONE;
    }
    resolve_args(p, buf);
    req->cmd = p->cmd;
    req->u32 = p->u32;
    req->i64 = p->i64;
    req->nargs = p->nstr;
    req->args = p->args;
    *used = p->pos;
    reset(p);
    return C10D_STORE_PARSE_DONE;
}

int c10d__wire_parse_request(struct c10d__wire_parser *p, const uint8_t *buf, size_t len,
                             struct c10d__wire_request *req, size_t *used)
{
    if (p->phase == PH_START && p->pos == 0 && len > 0 && !p->general_only &&
        p->dialect != C10D_STORE_DIALECT_UNKNOWN && parse_whole(p, buf, len, req, used)) {
        p->need = 0;
        return C10D_STORE_PARSE_DONE;
    }
    return parse_general(p, buf, len, req, used);
}

/* -------------------------------------------------------------- encoding */

int c10d__wire_buf_reserve(struct c10d__wire_buf *b, size_t extra)
{
    if (extra <= b->cap - b->len)
        return 0;
    if (extra > SIZE_MAX / 2 - b->len)
        return C10D_ENOMEM;
    size_t cap = b->cap ? b->cap : 64;
    while (cap - b->len < extra)
        cap *= 2;
    uint8_t *d = realloc(b->data, cap);
    if (!d)
        return C10D_ENOMEM;
    b->data = d;
    b->cap = cap;
    return 0;
}

void c10d__wire_buf_free(struct c10d__wire_buf *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

int c10d__wire_put_raw(struct c10d__wire_buf *b, const void *data, size_t len)
{
    if (c10d__wire_buf_reserve(b, len) < 0)
        return C10D_ENOMEM;
    if (len)
        memcpy(b->data + b->len, data, len);
    b->len += len;
    return 0;
}

int c10d__wire_put_u8(struct c10d__wire_buf *b, uint8_t v)
{
    return c10d__wire_put_raw(b, &v, 1);
}

int c10d__wire_put_u32(struct c10d__wire_buf *b, uint32_t v)
{
    uint8_t x[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    return c10d__wire_put_raw(b, x, 4);
}

static void store_u64(uint8_t *d, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        d[i] = (uint8_t)(v >> (8 * i));
}

int c10d__wire_put_u64(struct c10d__wire_buf *b, uint64_t v)
{
    if (c10d__wire_buf_reserve(b, 8) < 0)
        return C10D_ENOMEM;
    store_u64(b->data + b->len, v);
    b->len += 8;
    return 0;
}

int c10d__wire_put_i64(struct c10d__wire_buf *b, int64_t v)
{
    return c10d__wire_put_u64(b, (uint64_t)v);
}

int c10d__wire_put_str(struct c10d__wire_buf *b, const void *data, size_t len)
{
    if (len > SIZE_MAX - 8 || c10d__wire_buf_reserve(b, 8 + len) < 0)
        return C10D_ENOMEM;
    /* One reservation for both parts: a GET's reply is built here. */
    store_u64(b->data + b->len, len);
    if (len)
        memcpy(b->data + b->len + 8, data, len);
    b->len += 8 + len;
    return 0;
}

int c10d__wire_encode_request(struct c10d__wire_buf *out, int dialect,
                              const struct c10d__wire_request *req)
{
    if (!req || req->cmd < 0 || req->cmd >= C10D_STORE_CMD_COUNT)
        return c10d__fail(C10D_EINVAL, "store codec: bad command");
    int wire = c10d__wire_cmd_to_wire(dialect, req->cmd);
    if (wire < 0)
        return c10d__fail(C10D_EUNSUPPORTED, "store codec: %s does not exist in the %s dialect",
                          commands[req->cmd].name,
                          dialect == C10D_STORE_DIALECT_LEGACY ? "1.13" : "current");
    const struct layout *l = layout_of(req->cmd);
    if (l->counted ? req->nargs % l->per_item != 0 : req->nargs != l->nstr)
        return c10d__fail(C10D_EINVAL, "store codec: %s takes %s%u strings, got %zu",
                          commands[req->cmd].name, l->counted ? "a multiple of " : "",
                          l->counted ? l->per_item : l->nstr, req->nargs);
    if (req->nargs && !req->args)
        return c10d__fail(C10D_EINVAL, "store codec: %s without arguments",
                          commands[req->cmd].name);
    size_t total = 1 + 4 + 8 + 8;
    for (size_t i = 0; i < req->nargs; i++) {
        if (req->args[i].len && !req->args[i].data)
            return c10d__fail(C10D_EINVAL, "store codec: NULL string");
        total += 8 + req->args[i].len;
    }
    size_t old_len = out->len;
    if (c10d__wire_buf_reserve(out, total) < 0)
        return c10d__fail(C10D_ENOMEM, "store codec: out of memory");
    c10d__wire_put_u8(out, (uint8_t)wire);
    if (l->u32)
        c10d__wire_put_u32(out, req->cmd == C10D_STORE_VALIDATE ? C10D_STORE_MAGIC : req->u32);
    if (l->counted)
        c10d__wire_put_u64(out, req->nargs / l->per_item);
    for (size_t i = 0; i < req->nargs; i++)
        c10d__wire_put_str(out, req->args[i].data, req->args[i].len);
    if (l->i64)
        c10d__wire_put_i64(out, req->i64);
    (void)old_len;
    return 0;
}

/* ----------------------------------------------------------- reply parser */

int c10d__wire_reply_shape(int cmd)
{
    return cmd >= 0 && cmd < C10D_STORE_CMD_COUNT ? commands[cmd].reply : C10D_STORE_REPLY_NONE;
}

void c10d__wire_reply_parser_init(struct c10d__wire_reply_parser *rp,
                                  const struct c10d__wire_codec_limits *limits)
{
    memset(rp, 0, sizeof *rp);
    if (limits)
        rp->limits = *limits;
    c10d__wire_parser_init(&rp->p, limits);
    rp->p.phase = -1; /* nothing expected yet */
    snprintf(rp->p.error, sizeof rp->p.error, "no reply expected");
}

void c10d__wire_reply_parser_free(struct c10d__wire_reply_parser *rp)
{
    c10d__wire_parser_free(&rp->p);
}

static void reply_start(struct c10d__wire_reply_parser *rp, int cmd, int shape, uint64_t nkeys)
{
    reset(&rp->p);
    rp->cmd = cmd;
    rp->shape = shape;
    rp->nkeys = nkeys;
    rp->p.cmd = C10D_STORE_GET; /* any command: only used for limits of requests */
    switch (shape) {
    case C10D_STORE_REPLY_U8:
    case C10D_STORE_REPLY_EVENT:
        rp->p.phase = PH_R_U8;
        break;
    case C10D_STORE_REPLY_U32:
        rp->p.phase = PH_U32;
        break;
    case C10D_STORE_REPLY_I64:
    case C10D_STORE_REPLY_LIST:
    case C10D_STORE_REPLY_QPOP:
        rp->p.phase = PH_R_I64;
        break;
    case C10D_STORE_REPLY_STR:
        rp->p.count = 1;
        rp->p.phase = PH_LEN;
        break;
    case C10D_STORE_REPLY_NSTR:
        rp->p.count = nkeys;
        rp->p.phase = PH_LEN;
        break;
    }
}

int c10d__wire_reply_expect(struct c10d__wire_reply_parser *rp, int cmd, size_t nkeys)
{
    int shape = c10d__wire_reply_shape(cmd);
    if (shape == C10D_STORE_REPLY_NONE)
        return c10d__fail(C10D_EINVAL, "store codec: %s has no reply", c10d__wire_cmd_name(cmd));
    reply_start(rp, cmd, shape, nkeys);
    return 0;
}

void c10d__wire_reply_expect_event(struct c10d__wire_reply_parser *rp)
{
    reply_start(rp, C10D_STORE_WATCH_KEY, C10D_STORE_REPLY_EVENT, 0);
}

static int reply_fail(struct c10d__wire_reply_parser *rp, int rc)
{
    memcpy(rp->error, rp->p.error, sizeof rp->error);
    return rc;
}

int c10d__wire_parse_reply(struct c10d__wire_reply_parser *rp, const uint8_t *buf, size_t len,
                           struct c10d__wire_reply *rep, size_t *used)
{
    struct c10d__wire_parser *p = &rp->p;
    if (p->phase < 0)
        return reply_fail(rp,
                          fail(p, C10D_EINVAL, "%s", p->error[0] ? p->error : "no reply expected"));
    p->need = rp->need = 0;
    if (len < p->pos)
        return reply_fail(rp, fail(p, C10D_EINVAL, "buffer shorter than what was parsed before"));
    int rc = C10D_STORE_PARSE_MORE;
    /* NSTR/STR/EVENT strings are values (keys in LIST_KEYS and events are
     * checked against the value limit too: a key-sized limit could reject a
     * legitimate value and the client has no way to know which). */
    if (p->phase == PH_R_U8) {
        if (!have(p, len, 1))
            goto more;
        p->u32 = buf[p->pos++];
        if (rp->shape == C10D_STORE_REPLY_EVENT) {
            p->count = 3;
            p->phase = PH_LEN;
        } else {
            p->phase = PH_DONE;
        }
    }
    if (p->phase == PH_U32) {
        if (!have(p, len, 4))
            goto more;
        p->u32 = c10d__wire_get_u32(buf + p->pos);
        p->pos += 4;
        p->phase = PH_DONE;
    }
    if (p->phase == PH_R_I64) {
        if (!have(p, len, 8))
            goto more;
        p->i64 = (int64_t)c10d__wire_get_u64(buf + p->pos);
        p->pos += 8;
        p->phase = PH_DONE;
        if (rp->shape == C10D_STORE_REPLY_LIST) {
            if (p->i64 < 0 || (p->limits.max_keys && (uint64_t)p->i64 > p->limits.max_keys))
                return reply_fail(rp,
                                  fail(p, C10D_ENOMEM,
                                       "LIST_KEYS reply with %" PRId64 " keys (limit %" PRIu64 ")",
                                       p->i64, p->limits.max_keys));
            p->count = (uint64_t)p->i64;
            p->phase = PH_LEN;
        } else if (rp->shape == C10D_STORE_REPLY_QPOP && p->i64 > 0) {
            p->count = 1;
            p->phase = PH_LEN;
        }
    }
    if (p->phase == PH_LEN || p->phase == PH_BODY) {
        rc = read_strings(p, buf, len, 1);
        if (rc < 0)
            return reply_fail(rp, rc);
        if (rc == C10D_STORE_PARSE_MORE)
            goto more;
        p->phase = PH_DONE;
    }
    resolve_args(p, buf);
    memset(rep, 0, sizeof *rep);
    rep->cmd = rp->cmd;
    rep->shape = rp->shape;
    rep->u8 = (uint8_t)p->u32;
    rep->u32 = p->u32;
    rep->i64 = p->i64;
    rep->nvals = p->nstr;
    rep->vals = p->args;
    *used = p->pos;
    p->phase = -1;
    p->error[0] = 0;
    snprintf(p->error, sizeof p->error, "no reply expected");
    return C10D_STORE_PARSE_DONE;
more:
    rp->need = p->need;
    return C10D_STORE_PARSE_MORE;
}
