/* The TCPStore wire codec (docs/store_protocol.md), both dialects, shared by
 * the server (store_server/server/) and the TCP store client
 * (store_server/client/). Its names are c10d__wire_*, apart from the client
 * stores' c10d__store_*; the command constants (C10D_STORE_SET, ...) are the
 * store's shared vocabulary.
 *
 * Nothing here does I/O or allocates per byte. There are four pieces:
 *
 *  1. Commands: one dialect-independent enum (c10d__wire_cmd), made with
 *     everything else the codec knows of a command from one table
 *     (commands.h): the wire byte of each dialect, the request layout, the
 *     reply shape, which arguments are keys.
 *
 *  2. Request parser (server side), an incremental state machine. Contract:
 *
 *        c10d__wire_parser_init(&p, &limits);           // dialect detected
 *        for each read:  append bytes to your buffer `in`
 *            while (1) {
 *                rc = c10d__wire_parse_request(&p, in + start, avail, &req, &used);
 *                if (rc == C10D_STORE_PARSE_MORE) break;   // p.need = bytes missing
 *                if (rc < 0) { close: p.error says why }
 *                handle(&req);                             // req points into `in`
 *                start += used; avail -= used;
 *            }
 *            compact: move the [start, start+avail) tail to the front if you like
 *
 *     Always pass the buffer from the first byte of the current (unfinished)
 *     request: the parser keeps offsets relative to it, never pointers, so the
 *     buffer may be moved or grown (realloc) between calls. It resumes where it
 *     stopped, so a 64 MiB value arriving in 4 KiB reads costs O(total), and the
 *     value is never copied by the codec: req.args point into your buffer and
 *     stay valid until you overwrite or free it. `p.need` tells how many more
 *     bytes the request needs at least (for a length field just read: the whole
 *     body), so the reader can grow the buffer once to fit a big value.
 *     Limits are checked as soon as a length or count field is complete, before
 *     its body is buffered: a 2^63 length is rejected after 9 bytes.
 *
 *  3. Reply encoding (server) and request encoding (client): appenders to a
 *     growable byte buffer (c10d__wire_buf). Integers are little-endian.
 *
 *  4. Reply parser (client side): same buffer contract as the request parser.
 *     Before each reply, tell it what to expect:
 *        c10d__wire_reply_expect(&rp, cmd, nkeys);    // nkeys for MULTI_GET
 *        rc = c10d__wire_parse_reply(&rp, buf, len, &rep, &used);
 *     For a 1.13 watch connection, call c10d__wire_reply_expect_event() for
 *     each pushed event after the WATCH_KEY reply.
 *
 * Client rules that the codec cannot enforce (see docs/store.md):
 *  - send VALIDATE first on a current-dialect connection (our server detects the
 *    dialect from the first 5 bytes);
 *  - do not send anything behind a pending WAIT or BARRIER except CANCEL_WAIT:
 *    our server treats any new request as "the client gave up" and drops the
 *    wait (so a late STOP_WAITING can never answer a later request);
 *  - after CANCEL_WAIT expect one or two bytes: a STOP_WAITING (0) that raced the
 *    cancel may come first, then WAIT_CANCELED (1). Parse them as two U8
 *    replies (expect CANCEL_WAIT again after a 0).
 */
#ifndef C10D_STORE_SERVER_WIRE_CODEC_H
#define C10D_STORE_SERVER_WIRE_CODEC_H

#include "c10d.h"
#include "commands.h"

#include <stddef.h>
#include <stdint.h>

/* VALIDATE's u32: the current dialect opens with 00 CE F7 85 3C. */
#define C10D_STORE_MAGIC 0x3C85F7CEu

/* One-byte replies. */
enum {
    C10D_STORE_READY = 0, /* CHECK */
    C10D_STORE_NOT_READY = 1,
    C10D_STORE_STOP_WAITING = 0,  /* WAIT, BARRIER */
    C10D_STORE_WAIT_CANCELED = 1, /* CANCEL_WAIT */
};

/* 1.13 watch events (first byte of each pushed event). */
enum c10d__wire_watch_event {
    C10D_STORE_KEY_UPDATED = 0,
    C10D_STORE_KEY_CREATED = 1,
    C10D_STORE_KEY_DELETED = 2,
    C10D_STORE_KEY_CALLBACK_REGISTERED = 3,
};

enum c10d__wire_dialect {
    C10D_STORE_DIALECT_UNKNOWN = 0, /* server side, before the first bytes */
    C10D_STORE_DIALECT_CURRENT,     /* PyTorch 2.5 .. 2.11 */
    C10D_STORE_DIALECT_LEGACY,      /* PyTorch 1.13 */
};

/* AUTH's one-byte answer (commands.h); REFUSED: the server closes next. */
enum {
    C10D_STORE_AUTH_REFUSED = 0,
    C10D_STORE_AUTH_OK = 1,
};

/* Dialect-independent commands, in commands.h's order. The values are ours,
 * not wire bytes. */
#define C10D__STORE_CMD_ENUM(name, ...) C10D_STORE_##name,
enum c10d__wire_cmd { C10D__STORE_COMMANDS(C10D__STORE_CMD_ENUM) C10D_STORE_CMD_COUNT };
#undef C10D__STORE_CMD_ENUM

/* "SET", "MULTI_GET", ...; "?" for an out-of-range value. */
const char *c10d__wire_cmd_name(int cmd);
/* 1 if `cmd` leaves the table as it was (commands.h's ro). */
int c10d__wire_cmd_read_only(int cmd);
/* 1 if argument i (of nargs) of a `cmd` request is a key, 0 if a value. */
int c10d__wire_cmd_arg_is_key(int cmd, size_t i);
/* Which key arguments a client waits for before `cmd` runs (commands.h's
 * waits): 0 none, 1 every key, 2 every key when the op blocks. */
int c10d__wire_cmd_waits(int cmd);
/* The wire byte of `cmd` in `dialect`, or -1 if that dialect lacks it. */
int c10d__wire_cmd_to_wire(int dialect, int cmd);
/* The command of wire byte `byte` in `dialect`, or -1 if unknown. */
int c10d__wire_cmd_from_wire(int dialect, uint8_t byte);

/* A byte string (key or value) that the codec does not own. */
struct c10d__wire_str {
    const uint8_t *data;
    size_t len;
};

/* A parsed (or to-be-encoded) request. Strings in `args`, by command:
 *   SET, APPEND, QUEUE_PUSH          key, value
 *   COMPARE_SET                      key, expected, desired
 *   GET, DELETE_KEY, QUEUE_POP,
 *   QUEUE_LEN, WATCH_KEY, ADD,
 *   BARRIER                          key
 *   AUTH                             token (a key: the key size limit applies)
 *   CHECK, WAIT, MULTI_GET           key x n
 *   MULTI_SET                        key0, value0, key1, value1, ...
 *   others                           none
 * `u32`: VALIDATE's magic, PING's nonce. `i64`: ADD's delta, BARRIER's world size.
 * For the counted commands the wire count is nargs (MULTI_SET: nargs / 2). */
struct c10d__wire_request {
    int cmd; /* enum c10d__wire_cmd */
    uint32_t u32;
    int64_t i64;
    size_t nargs;
    const struct c10d__wire_str *args;
};

/* Limits enforced by the parsers; 0 means "no limit" for that field. */
struct c10d__wire_codec_limits {
    uint64_t max_key_bytes;
    uint64_t max_value_bytes;
    uint64_t max_keys;          /* strings of a counted command / LIST_KEYS reply */
    uint64_t max_request_bytes; /* a whole request (or reply), header included */
};

/* Return values of the parsers (errors are negative c10d_status codes:
 * C10D_EPROTO for malformed input, C10D_ENOMEM for a limit or allocation). */
enum {
    C10D_STORE_PARSE_MORE = 0,
    C10D_STORE_PARSE_DONE = 1,
};

/* Parser state. The fields are private; read only `dialect`, `need`, `error`. */
struct c10d__wire_parser {
    int dialect; /* UNKNOWN until detected; set it before the first call to force one */
    struct c10d__wire_codec_limits limits;
    size_t need;     /* after MORE: at least this many more bytes are needed */
    char error[160]; /* after an error: why ("key of 9000000 bytes over the limit ...") */
    /* private */
    int phase;
    int cmd;
    size_t pos;
    uint64_t count; /* strings this request carries */
    size_t nstr;    /* strings complete */
    uint64_t cur_len;
    uint32_t u32;
    int64_t i64;
    size_t *offs;
    struct c10d__wire_str *args;
    size_t cap;
    /* Tests only: skip the one-pass parse of whole requests, so that the
     * general state machine can be compared with it. */
    int general_only;
};

void c10d__wire_parser_init(struct c10d__wire_parser *p,
                            const struct c10d__wire_codec_limits *limits);
/* Frees the parser's small argument arrays (never the caller's buffer). */
void c10d__wire_parser_free(struct c10d__wire_parser *p);
/* Parses one request from buf[0..len), which starts at the current request's
 * first byte. Returns DONE (req filled, *used = its size), MORE, or an error
 * (the parser is then unusable: close the connection). req stays valid until
 * the next call. The first bytes of a connection decide the dialect if it is
 * still UNKNOWN: a first byte other than 0, or a 5-byte prefix other than
 * 00 CE F7 85 3C, means LEGACY. */
int c10d__wire_parse_request(struct c10d__wire_parser *p, const uint8_t *buf, size_t len,
                             struct c10d__wire_request *req, size_t *used);
/* 1 if the parser is between requests (no byte of a next request seen). */
int c10d__wire_parser_idle(const struct c10d__wire_parser *p);

/* ------------------------------------------------------------- encoding */

/* A growable byte buffer. Zero-initialise it; free with c10d__wire_buf_free. */
struct c10d__wire_buf {
    uint8_t *data;
    size_t len;
    size_t cap;
};

/* Makes room for `extra` more bytes. 0 or C10D_ENOMEM. */
int c10d__wire_buf_reserve(struct c10d__wire_buf *b, size_t extra);
void c10d__wire_buf_free(struct c10d__wire_buf *b);
/* Appenders: 0 or C10D_ENOMEM (the buffer is unchanged on failure). */
int c10d__wire_put_u8(struct c10d__wire_buf *b, uint8_t v);
int c10d__wire_put_u32(struct c10d__wire_buf *b, uint32_t v);
int c10d__wire_put_u64(struct c10d__wire_buf *b, uint64_t v);
int c10d__wire_put_i64(struct c10d__wire_buf *b, int64_t v);
/* A length-prefixed string S (u64 len, bytes). */
int c10d__wire_put_str(struct c10d__wire_buf *b, const void *data, size_t len);
int c10d__wire_put_raw(struct c10d__wire_buf *b, const void *data, size_t len);

/* Appends `req` in `dialect` (CURRENT or LEGACY). The arguments are validated
 * (count and layout per command). Returns 0, C10D_EUNSUPPORTED if the dialect
 * lacks the command, C10D_EINVAL for a bad layout, C10D_ENOMEM. Note: the
 * value bytes are copied into `out`. */
int c10d__wire_encode_request(struct c10d__wire_buf *out, int dialect,
                              const struct c10d__wire_request *req);

/* Little-endian loads for hand-rolled decoding. */
uint32_t c10d__wire_get_u32(const uint8_t *p);
uint64_t c10d__wire_get_u64(const uint8_t *p);

/* -------------------------------------------------------- reply parsing */

/* Reply shapes, as the protocol table lists them. */
enum c10d__wire_reply_shape {
    C10D_STORE_REPLY_NONE = 0, /* VALIDATE, SET, APPEND, MULTI_SET, QUEUE_PUSH */
    C10D_STORE_REPLY_U8,       /* CHECK, WAIT, CANCEL_WAIT, BARRIER, WATCH_KEY, AUTH */
    C10D_STORE_REPLY_U32,      /* PING */
    C10D_STORE_REPLY_I64,      /* ADD, GETNUMKEYS, DELETE_KEY, QUEUE_LEN */
    C10D_STORE_REPLY_STR,      /* GET, COMPARE_SET */
    C10D_STORE_REPLY_NSTR,     /* MULTI_GET: nkeys x S */
    C10D_STORE_REPLY_LIST,     /* LIST_KEYS: i64 n, n x S */
    C10D_STORE_REPLY_QPOP,     /* QUEUE_POP: i64 len, S if len > 0 */
    C10D_STORE_REPLY_EVENT,    /* 1.13 watch push: u8 event, S key, S old, S new */
};

int c10d__wire_reply_shape(int cmd);

/* A parsed reply. `u8`: CHECK/WAIT/... byte or the watch event; `u32`: PING's
 * nonce; `i64`: the integer of I64/LIST/QPOP replies. vals: the strings (GET's
 * value, MULTI_GET's values, LIST_KEYS's keys, QUEUE_POP's value, an event's
 * key/old/new), pointing into the caller's buffer. */
struct c10d__wire_reply {
    int cmd;
    int shape;
    uint8_t u8;
    uint32_t u32;
    int64_t i64;
    size_t nvals;
    const struct c10d__wire_str *vals;
};

struct c10d__wire_reply_parser {
    struct c10d__wire_codec_limits limits;
    size_t need;
    char error[160];
    /* private: shares the request parser's machinery */
    struct c10d__wire_parser p;
    int shape;
    int cmd;
    uint64_t nkeys;
};

void c10d__wire_reply_parser_init(struct c10d__wire_reply_parser *rp,
                                  const struct c10d__wire_codec_limits *limits);
void c10d__wire_reply_parser_free(struct c10d__wire_reply_parser *rp);
/* Sets up the parser for the reply to `cmd` (nkeys: MULTI_GET's key count).
 * C10D_EINVAL if a reply is not expected for cmd (shape NONE). */
int c10d__wire_reply_expect(struct c10d__wire_reply_parser *rp, int cmd, size_t nkeys);
void c10d__wire_reply_expect_event(struct c10d__wire_reply_parser *rp);
/* Same contract as c10d__wire_parse_request. */
int c10d__wire_parse_reply(struct c10d__wire_reply_parser *rp, const uint8_t *buf, size_t len,
                           struct c10d__wire_reply *rep, size_t *used);

/* ------------------------------------------------------------ integers */

/* Parses a stored counter the way PyTorch's servers do (std::stoll): optional
 * leading white space, optional sign, at least one digit; stops at the first
 * non-digit. 0, or C10D_EINVAL (no digits / out of range). */
int c10d__wire_parse_i64(const uint8_t *data, size_t len, int64_t *out);

#endif
