/* Codec vectors for both TCPStore dialects: every command, requests split at
 * every byte boundary, several requests per read, malformed input, limits. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "store_server/wire/codec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define S(lit) ((struct c10d__wire_str){(const uint8_t *)(lit), sizeof(lit) - 1})

static const struct c10d__wire_codec_limits no_limits = {0};

/* Parses `len` bytes fed as a growing prefix, byte by byte: every prefix but
 * the whole must say MORE, with `need` never overshooting. */
static void parse_split(int dialect, const uint8_t *buf, size_t len, struct c10d__wire_request *req,
                        struct c10d__wire_parser *p)
{
    c10d__wire_parser_init(p, &no_limits);
    p->dialect = dialect;
    size_t used = 0;
    for (size_t i = 0; i < len; i++) {
        int rc = c10d__wire_parse_request(p, buf, i, req, &used);
        assert_int_equal(rc, C10D_STORE_PARSE_MORE);
        assert_true(p->need >= 1);
        assert_true(i + p->need <= len);
    }
    assert_int_equal(c10d__wire_parse_request(p, buf, len, req, &used), C10D_STORE_PARSE_DONE);
    assert_int_equal(used, len);
}

static void assert_same_request(const struct c10d__wire_request *a,
                                const struct c10d__wire_request *b)
{
    assert_int_equal(a->cmd, b->cmd);
    assert_int_equal(a->nargs, b->nargs);
    for (size_t i = 0; i < a->nargs; i++) {
        assert_int_equal(a->args[i].len, b->args[i].len);
        if (a->args[i].len)
            assert_memory_equal(a->args[i].data, b->args[i].data, a->args[i].len);
    }
    if (a->cmd == C10D_STORE_PING)
        assert_int_equal(a->u32, b->u32);
    if (a->cmd == C10D_STORE_ADD || a->cmd == C10D_STORE_BARRIER)
        assert_int_equal(a->i64, b->i64);
}

/* One sample request per command. */
static size_t nreq, nstore;

static void add_req(struct c10d__wire_request *out, struct c10d__wire_str *store, int cmd,
                    uint32_t u32, int64_t i64, size_t nargs, const struct c10d__wire_str *args)
{
    out[nreq] = (struct c10d__wire_request){
        .cmd = cmd, .u32 = u32, .i64 = i64, .nargs = nargs, .args = &store[nstore]};
    memcpy(&store[nstore], args, nargs * sizeof *args);
    nstore += nargs;
    nreq++;
}

static size_t sample_requests(struct c10d__wire_request *out, struct c10d__wire_str *store)
{
    static const uint8_t big[300] = {1, 2, 3};
    nreq = nstore = 0;
#define R(cmd, u32, i64, ...)                                                                      \
    do {                                                                                           \
        const struct c10d__wire_str a_[] = {S("unused"), __VA_ARGS__};                             \
        add_req(out, store, cmd, u32, i64, sizeof a_ / sizeof a_[0] - 1, a_ + 1);                  \
    } while (0)
    R(C10D_STORE_VALIDATE, 0, 0, );
    R(C10D_STORE_PING, 0xdeadbeef, 0, );
    R(C10D_STORE_SET, 0, 0, S("/k"), S("value"));
    R(C10D_STORE_SET, 0, 0, S(""), S(""));
    R(C10D_STORE_COMPARE_SET, 0, 0, S("/k"), S("old"), S("new"));
    R(C10D_STORE_GET, 0, 0, S("/k"));
    R(C10D_STORE_ADD, 0, -5, S("init/"));
    R(C10D_STORE_CHECK, 0, 0, S("/a"), S("/b"));
    R(C10D_STORE_WAIT, 0, 0, S("/a"));
    R(C10D_STORE_WAIT, 0, 0, );
    R(C10D_STORE_GETNUMKEYS, 0, 0, );
    R(C10D_STORE_DELETE_KEY, 0, 0, S("/k"));
    R(C10D_STORE_APPEND, 0, 0, S("/k"), ((struct c10d__wire_str){big, sizeof big}));
    R(C10D_STORE_MULTI_GET, 0, 0, S("/a"), S("/b"), S("/c"));
    R(C10D_STORE_MULTI_SET, 0, 0, S("/a"), S("1"), S("/b"), S("22"));
    R(C10D_STORE_CANCEL_WAIT, 0, 0, );
    R(C10D_STORE_QUEUE_PUSH, 0, 0, S("/q"), S("item"));
    R(C10D_STORE_QUEUE_POP, 0, 0, S("/q"));
    R(C10D_STORE_QUEUE_LEN, 0, 0, S("/q"));
    R(C10D_STORE_LIST_KEYS, 0, 0, );
    R(C10D_STORE_BARRIER, 0, 4, S("/barrier"));
    R(C10D_STORE_WATCH_KEY, 0, 0, S("/w"));
    R(C10D_STORE_AUTH, 0, 0, S("s3cret"));
#undef R
    return nreq;
}

static void test_cmd_tables(void **state)
{
    (void)state;
    assert_int_equal(c10d__wire_cmd_to_wire(C10D_STORE_DIALECT_CURRENT, C10D_STORE_VALIDATE), 0);
    assert_int_equal(c10d__wire_cmd_to_wire(C10D_STORE_DIALECT_LEGACY, C10D_STORE_SET), 0);
    assert_int_equal(c10d__wire_cmd_to_wire(C10D_STORE_DIALECT_LEGACY, C10D_STORE_WATCH_KEY), 7);
    assert_int_equal(c10d__wire_cmd_to_wire(C10D_STORE_DIALECT_CURRENT, C10D_STORE_GETNUMKEYS), 7);
    assert_int_equal(c10d__wire_cmd_to_wire(C10D_STORE_DIALECT_CURRENT, C10D_STORE_BARRIER), 18);
    assert_int_equal(c10d__wire_cmd_to_wire(C10D_STORE_DIALECT_LEGACY, C10D_STORE_PING), -1);
    assert_int_equal(c10d__wire_cmd_to_wire(C10D_STORE_DIALECT_CURRENT, C10D_STORE_WATCH_KEY), -1);
    assert_int_equal(c10d__wire_cmd_from_wire(C10D_STORE_DIALECT_LEGACY, 8), C10D_STORE_DELETE_KEY);
    assert_int_equal(c10d__wire_cmd_from_wire(C10D_STORE_DIALECT_LEGACY, 9), -1);
    assert_int_equal(c10d__wire_cmd_from_wire(C10D_STORE_DIALECT_CURRENT, 13), C10D_STORE_PING);
    assert_int_equal(c10d__wire_cmd_from_wire(C10D_STORE_DIALECT_CURRENT, 19), -1);
    for (int c = 0; c < C10D_STORE_CMD_COUNT; c++)
        assert_string_not_equal(c10d__wire_cmd_name(c), "?");
}

/* Hand-written wire bytes: the encoder must match them byte for byte. */
static void test_known_bytes(void **state)
{
    (void)state;
    struct c10d__wire_buf b = {0};
    struct c10d__wire_request r = {.cmd = C10D_STORE_VALIDATE};
    assert_int_equal(c10d__wire_encode_request(&b, C10D_STORE_DIALECT_CURRENT, &r), 0);
    static const uint8_t validate[] = {0x00, 0xCE, 0xF7, 0x85, 0x3C};
    assert_int_equal(b.len, sizeof validate);
    assert_memory_equal(b.data, validate, sizeof validate);

    b.len = 0;
    struct c10d__wire_str args[2] = {S("/k"), S("v")};
    r = (struct c10d__wire_request){.cmd = C10D_STORE_SET, .nargs = 2, .args = args};
    static const uint8_t set_cur[] = {1,   2, 0, 0, 0, 0, 0, 0, 0, '/',
                                      'k', 1, 0, 0, 0, 0, 0, 0, 0, 'v'};
    assert_int_equal(c10d__wire_encode_request(&b, C10D_STORE_DIALECT_CURRENT, &r), 0);
    assert_int_equal(b.len, sizeof set_cur);
    assert_memory_equal(b.data, set_cur, sizeof set_cur);
    b.len = 0;
    assert_int_equal(c10d__wire_encode_request(&b, C10D_STORE_DIALECT_LEGACY, &r), 0);
    assert_int_equal(b.data[0], 0);
    assert_memory_equal(b.data + 1, set_cur + 1, sizeof set_cur - 1);

    b.len = 0;
    r = (struct c10d__wire_request){.cmd = C10D_STORE_ADD, .nargs = 1, .args = args, .i64 = 1};
    static const uint8_t add_legacy[] = {3,   2, 0, 0, 0, 0, 0, 0, 0, '/',
                                         'k', 1, 0, 0, 0, 0, 0, 0, 0};
    assert_int_equal(c10d__wire_encode_request(&b, C10D_STORE_DIALECT_LEGACY, &r), 0);
    assert_int_equal(b.len, sizeof add_legacy);
    assert_memory_equal(b.data, add_legacy, sizeof add_legacy);

    b.len = 0;
    r = (struct c10d__wire_request){.cmd = C10D_STORE_WAIT, .nargs = 1, .args = args};
    static const uint8_t wait_cur[] = {6, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, '/', 'k'};
    assert_int_equal(c10d__wire_encode_request(&b, C10D_STORE_DIALECT_CURRENT, &r), 0);
    assert_int_equal(b.len, sizeof wait_cur);
    assert_memory_equal(b.data, wait_cur, sizeof wait_cur);

    b.len = 0;
    r = (struct c10d__wire_request){.cmd = C10D_STORE_PING, .u32 = 0x01020304};
    static const uint8_t ping[] = {13, 4, 3, 2, 1};
    assert_int_equal(c10d__wire_encode_request(&b, C10D_STORE_DIALECT_CURRENT, &r), 0);
    assert_memory_equal(b.data, ping, sizeof ping);

    /* Commands a dialect lacks, bad layouts. */
    b.len = 0;
    assert_int_equal(c10d__wire_encode_request(&b, C10D_STORE_DIALECT_LEGACY, &r),
                     C10D_EUNSUPPORTED);
    r = (struct c10d__wire_request){.cmd = C10D_STORE_SET, .nargs = 1, .args = args};
    assert_int_equal(c10d__wire_encode_request(&b, C10D_STORE_DIALECT_CURRENT, &r), C10D_EINVAL);
    r = (struct c10d__wire_request){.cmd = C10D_STORE_MULTI_SET, .nargs = 1, .args = args};
    assert_int_equal(c10d__wire_encode_request(&b, C10D_STORE_DIALECT_CURRENT, &r), C10D_EINVAL);
    assert_int_equal(b.len, 0);
    c10d__wire_buf_free(&b);
}

/* AUTH (ours): byte 0x41, one string, current dialect only; a U8 reply. */
static void test_auth(void **state)
{
    (void)state;
    assert_int_equal(c10d__wire_cmd_to_wire(C10D_STORE_DIALECT_CURRENT, C10D_STORE_AUTH), 0x41);
    assert_int_equal(c10d__wire_cmd_to_wire(C10D_STORE_DIALECT_LEGACY, C10D_STORE_AUTH), -1);
    assert_int_equal(c10d__wire_cmd_from_wire(C10D_STORE_DIALECT_CURRENT, 0x41), C10D_STORE_AUTH);
    assert_int_equal(c10d__wire_cmd_from_wire(C10D_STORE_DIALECT_LEGACY, 0x41), -1);
    assert_string_equal(c10d__wire_cmd_name(C10D_STORE_AUTH), "AUTH");
    struct c10d__wire_buf b = {0};
    struct c10d__wire_str tok = S("tok");
    struct c10d__wire_request r = {.cmd = C10D_STORE_AUTH, .nargs = 1, .args = &tok};
    static const uint8_t auth[] = {0x41, 3, 0, 0, 0, 0, 0, 0, 0, 't', 'o', 'k'};
    assert_int_equal(c10d__wire_encode_request(&b, C10D_STORE_DIALECT_CURRENT, &r), 0);
    assert_int_equal(b.len, sizeof auth);
    assert_memory_equal(b.data, auth, sizeof auth);
    assert_int_equal(c10d__wire_encode_request(&b, C10D_STORE_DIALECT_LEGACY, &r),
                     C10D_EUNSUPPORTED);
    r.nargs = 0;
    assert_int_equal(c10d__wire_encode_request(&b, C10D_STORE_DIALECT_CURRENT, &r), C10D_EINVAL);
    c10d__wire_buf_free(&b);
    /* Parsed after VALIDATE; a token longer than the key limit is refused
     * from its length field alone. */
    struct c10d__wire_codec_limits lim = {.max_key_bytes = 8};
    struct c10d__wire_parser p;
    c10d__wire_parser_init(&p, &lim);
    static const uint8_t wire[] = {0x00, 0xCE, 0xF7, 0x85, 0x3C, 0x41, 3,    0, 0, 0, 0,
                                   0,    0,    0,    't',  'o',  'k',  0x41, 9, 0, 0, 0};
    struct c10d__wire_request got;
    size_t used;
    assert_int_equal(c10d__wire_parse_request(&p, wire, sizeof wire, &got, &used),
                     C10D_STORE_PARSE_DONE);
    assert_int_equal(got.cmd, C10D_STORE_VALIDATE);
    size_t off = used;
    assert_int_equal(c10d__wire_parse_request(&p, wire + off, sizeof wire - off, &got, &used),
                     C10D_STORE_PARSE_DONE);
    assert_int_equal(got.cmd, C10D_STORE_AUTH);
    assert_int_equal(got.nargs, 1);
    assert_memory_equal(got.args[0].data, "tok", 3);
    off += used;
    static const uint8_t too_long[] = {0x41, 9, 0, 0, 0, 0, 0, 0, 0};
    assert_true(c10d__wire_parse_request(&p, too_long, sizeof too_long, &got, &used) < 0);
    c10d__wire_parser_free(&p);
    /* The reply: one byte. */
    struct c10d__wire_reply_parser rp;
    c10d__wire_reply_parser_init(&rp, NULL);
    assert_int_equal(c10d__wire_reply_expect(&rp, C10D_STORE_AUTH, 0), 0);
    static const uint8_t ok[] = {C10D_STORE_AUTH_OK};
    struct c10d__wire_reply rep;
    assert_int_equal(c10d__wire_parse_reply(&rp, ok, 1, &rep, &used), C10D_STORE_PARSE_DONE);
    assert_int_equal(rep.u8, C10D_STORE_AUTH_OK);
    assert_int_equal(used, 1);
    c10d__wire_reply_parser_free(&rp);
}

static void roundtrip_dialect(int dialect)
{
    struct c10d__wire_request reqs[32];
    struct c10d__wire_str store[64];
    size_t n = sample_requests(reqs, store);
    struct c10d__wire_buf all = {0};
    size_t count = 0;
    struct c10d__wire_parser p;
    for (size_t i = 0; i < n; i++) {
        struct c10d__wire_buf b = {0};
        int rc = c10d__wire_encode_request(&b, dialect, &reqs[i]);
        if (c10d__wire_cmd_to_wire(dialect, reqs[i].cmd) < 0) {
            assert_int_equal(rc, C10D_EUNSUPPORTED);
            continue;
        }
        assert_int_equal(rc, 0);
        struct c10d__wire_request got;
        parse_split(dialect, b.data, b.len, &got, &p);
        assert_same_request(&reqs[i], &got);
        c10d__wire_parser_free(&p);
        c10d__wire_put_raw(&all, b.data, b.len);
        c10d__wire_buf_free(&b);
        count++;
    }
    /* All of them in one read, then fed in chunks of every size. */
    for (size_t chunk = 1; chunk <= all.len; chunk += (chunk < 40 ? 1 : 97)) {
        c10d__wire_parser_init(&p, &no_limits);
        p.dialect = dialect;
        size_t start = 0, avail = 0, got_n = 0, k = 0;
        while (start + avail < all.len || avail) {
            size_t add = all.len - start - avail < chunk ? all.len - start - avail : chunk;
            avail += add;
            for (;;) {
                struct c10d__wire_request got;
                size_t used;
                int rc = c10d__wire_parse_request(&p, all.data + start, avail, &got, &used);
                assert_true(rc >= 0);
                if (rc == C10D_STORE_PARSE_MORE)
                    break;
                while (c10d__wire_cmd_to_wire(dialect, reqs[k].cmd) < 0)
                    k++;
                assert_same_request(&reqs[k], &got);
                k++;
                got_n++;
                start += used;
                avail -= used;
            }
            if (add == 0)
                break;
        }
        assert_int_equal(got_n, count);
        assert_int_equal(avail, 0);
        c10d__wire_parser_free(&p);
    }
    c10d__wire_buf_free(&all);
}

/* The one-pass parse of whole requests must answer exactly what the general
 * state machine answers: same status, request, size, `need` and error text,
 * on valid, truncated, corrupted and over-limit input. */
static uint64_t rng = 0x9E3779B97F4A7C15ull;

static uint64_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static size_t compared_done, compared_errors;

static void compare_parsers(int dialect, const struct c10d__wire_codec_limits *lim,
                            const uint8_t *buf, size_t len)
{
    struct c10d__wire_parser fast, gen;
    c10d__wire_parser_init(&fast, lim);
    c10d__wire_parser_init(&gen, lim);
    fast.dialect = gen.dialect = dialect;
    gen.general_only = 1;
    size_t start = 0;
    for (;;) {
        struct c10d__wire_request rf, rg;
        size_t uf = 0, ug = 0;
        int rcf = c10d__wire_parse_request(&fast, buf + start, len - start, &rf, &uf);
        int rcg = c10d__wire_parse_request(&gen, buf + start, len - start, &rg, &ug);
        assert_int_equal(rcf, rcg);
        assert_int_equal(fast.need, gen.need);
        assert_int_equal(fast.dialect, gen.dialect);
        if (rcf < 0) {
            assert_string_equal(fast.error, gen.error);
            compared_errors++;
            break;
        }
        if (rcf == C10D_STORE_PARSE_MORE)
            break;
        assert_int_equal(uf, ug);
        assert_int_equal(rf.cmd, rg.cmd);
        assert_int_equal(rf.u32, rg.u32);
        assert_int_equal(rf.i64, rg.i64);
        assert_int_equal(rf.nargs, rg.nargs);
        for (size_t i = 0; i < rf.nargs; i++) {
            assert_ptr_equal(rf.args[i].data, rg.args[i].data);
            assert_int_equal(rf.args[i].len, rg.args[i].len);
        }
        assert_int_equal(c10d__wire_parser_idle(&fast), c10d__wire_parser_idle(&gen));
        compared_done++;
        start += uf;
    }
    c10d__wire_parser_free(&fast);
    c10d__wire_parser_free(&gen);
}

static void test_whole_parse_equivalence(void **state)
{
    (void)state;
    static const struct c10d__wire_codec_limits tight = {
        .max_key_bytes = 4, .max_value_bytes = 300, .max_keys = 2, .max_request_bytes = 64};
    static const struct c10d__wire_codec_limits loose = {
        .max_key_bytes = 1 << 16, .max_value_bytes = 1 << 20, .max_keys = 1 << 10};
    const struct c10d__wire_codec_limits *limits[] = {&no_limits, &tight, &loose};
    static const int dialects[] = {C10D_STORE_DIALECT_CURRENT, C10D_STORE_DIALECT_LEGACY,
                                   C10D_STORE_DIALECT_UNKNOWN};
    struct c10d__wire_request reqs[32];
    struct c10d__wire_str store[64];
    size_t n = sample_requests(reqs, store);
    for (size_t d = 0; d < 2; d++) {
        /* Every sample request, then a MULTI_GET past the one-pass path's
         * argument count, back to back. */
        struct c10d__wire_buf all = {0};
        if (dialects[d] == C10D_STORE_DIALECT_CURRENT)
            c10d__wire_put_raw(&all, "\x00\xce\xf7\x85\x3c", 5);
        for (size_t i = 0; i < n; i++)
            if (c10d__wire_cmd_to_wire(dialects[d], reqs[i].cmd) >= 0)
                assert_int_equal(c10d__wire_encode_request(&all, dialects[d], &reqs[i]), 0);
        if (dialects[d] == C10D_STORE_DIALECT_CURRENT) {
            struct c10d__wire_str keys[100];
            for (size_t i = 0; i < 100; i++)
                keys[i] = S("/k");
            struct c10d__wire_request mg = {
                .cmd = C10D_STORE_MULTI_GET, .nargs = 100, .args = keys};
            assert_int_equal(c10d__wire_encode_request(&all, dialects[d], &mg), 0);
        }
        uint8_t *mut = malloc(all.len);
        assert_non_null(mut);
        for (size_t li = 0; li < sizeof limits / sizeof limits[0]; li++) {
            for (size_t di = 0; di < 3; di++) {
                int dia = dialects[di] == C10D_STORE_DIALECT_UNKNOWN ? dialects[di] : dialects[d];
                /* Every prefix: truncation at each byte. */
                for (size_t k = 0; k <= all.len; k++)
                    compare_parsers(dia, limits[li], all.data, k);
                /* Corruption: a few bytes replaced, some with values that make
                 * command bytes, small lengths or huge ones. */
                for (int it = 0; it < 3000; it++) {
                    memcpy(mut, all.data, all.len);
                    int flips = 1 + (int)(rnd() % 3);
                    for (int f = 0; f < flips; f++) {
                        size_t at = (size_t)(rnd() % all.len);
                        uint64_t r = rnd();
                        mut[at] = r & 1 ? (uint8_t)(r >> 8) : (uint8_t)((r >> 8) % 24);
                    }
                    size_t cut = rnd() % 4 ? all.len : (size_t)(rnd() % all.len);
                    compare_parsers(dia, limits[li], mut, cut);
                }
            }
        }
        free(mut);
        c10d__wire_buf_free(&all);
    }
    /* Random bytes, mostly small ones (command bytes, short lengths). */
    uint8_t junk[96];
    for (int it = 0; it < 20000; it++) {
        size_t len = (size_t)(rnd() % sizeof junk);
        for (size_t i = 0; i < len; i++) {
            uint64_t r = rnd();
            junk[i] = r % 8 == 0 ? (uint8_t)(r >> 8) : (uint8_t)((r >> 8) % 20);
        }
        compare_parsers(dialects[it % 3], limits[(it / 3) % 3], junk, len);
    }
    print_message("%zu requests and %zu errors compared\n", compared_done, compared_errors);
    /* The comparisons covered both outcomes many times. */
    assert_true(compared_done > 10000);
    assert_true(compared_errors > 1000);
}

static void test_roundtrip_current(void **state)
{
    (void)state;
    roundtrip_dialect(C10D_STORE_DIALECT_CURRENT);
}

static void test_roundtrip_legacy(void **state)
{
    (void)state;
    roundtrip_dialect(C10D_STORE_DIALECT_LEGACY);
}

static int detect(const uint8_t *buf, size_t len, int *rc_out)
{
    struct c10d__wire_parser p;
    c10d__wire_parser_init(&p, &no_limits);
    struct c10d__wire_request r;
    size_t used;
    *rc_out = c10d__wire_parse_request(&p, buf, len, &r, &used);
    int d = p.dialect;
    c10d__wire_parser_free(&p);
    return d;
}

static void test_dialect_detection(void **state)
{
    (void)state;
    int rc;
    static const uint8_t validate[] = {0x00, 0xCE, 0xF7, 0x85, 0x3C};
    for (size_t i = 0; i < 5; i++) {
        assert_int_equal(detect(validate, i, &rc), C10D_STORE_DIALECT_UNKNOWN);
        assert_int_equal(rc, C10D_STORE_PARSE_MORE);
    }
    assert_int_equal(detect(validate, 5, &rc), C10D_STORE_DIALECT_CURRENT);
    assert_int_equal(rc, C10D_STORE_PARSE_DONE);
    /* 1.13 GETNUMKEYS: one byte, answered at once. */
    static const uint8_t numkeys[] = {6};
    assert_int_equal(detect(numkeys, 1, &rc), C10D_STORE_DIALECT_LEGACY);
    assert_int_equal(rc, C10D_STORE_PARSE_DONE);
    /* 1.13 SET: byte 0 then a length that is not the magic. */
    static const uint8_t set[] = {0, 1, 0, 0, 0, 0, 0, 0, 0, 'k', 0, 0, 0, 0, 0, 0, 0, 0};
    assert_int_equal(detect(set, 2, &rc), C10D_STORE_DIALECT_LEGACY);
    assert_int_equal(rc, C10D_STORE_PARSE_MORE);
    assert_int_equal(detect(set, sizeof set, &rc), C10D_STORE_DIALECT_LEGACY);
    assert_int_equal(rc, C10D_STORE_PARSE_DONE);
    static const uint8_t almost[] = {0x00, 0xCE, 0xF7, 0x85, 0x3D};
    assert_int_equal(detect(almost, 5, &rc), C10D_STORE_DIALECT_LEGACY);
}

static int parse_once(const struct c10d__wire_codec_limits *lim, int dialect, const uint8_t *buf,
                      size_t len, char *why, size_t why_len)
{
    struct c10d__wire_parser p;
    c10d__wire_parser_init(&p, lim);
    p.dialect = dialect;
    struct c10d__wire_request r;
    size_t used;
    int rc = c10d__wire_parse_request(&p, buf, len, &r, &used);
    snprintf(why, why_len, "%s", p.error);
    c10d__wire_parser_free(&p);
    return rc;
}

static void test_malformed_and_limits(void **state)
{
    (void)state;
    char why[200];
    struct c10d__wire_codec_limits lim = {
        .max_key_bytes = 16, .max_value_bytes = 100, .max_keys = 4, .max_request_bytes = 1000};
    static const uint8_t unknown[] = {200};
    assert_int_equal(parse_once(&lim, C10D_STORE_DIALECT_CURRENT, unknown, 1, why, sizeof why),
                     C10D_EPROTO);
    assert_non_null(strstr(why, "unknown command"));
    static const uint8_t unknown_legacy[] = {9};
    assert_int_equal(
        parse_once(&lim, C10D_STORE_DIALECT_LEGACY, unknown_legacy, 1, why, sizeof why),
        C10D_EPROTO);
    static const uint8_t bad_magic[] = {0, 1, 2, 3, 4};
    assert_int_equal(parse_once(&lim, C10D_STORE_DIALECT_CURRENT, bad_magic, 5, why, sizeof why),
                     C10D_EPROTO);
    assert_non_null(strstr(why, "magic"));
    /* A 2^63 key length is refused after its 8 length bytes, before any body. */
    static const uint8_t huge_key[] = {3, 0, 0, 0, 0, 0, 0, 0, 0x80};
    assert_int_equal(parse_once(&lim, C10D_STORE_DIALECT_CURRENT, huge_key, 9, why, sizeof why),
                     C10D_ENOMEM);
    assert_non_null(strstr(why, "key"));
    /* Same with no limits at all: still refused (cannot be buffered). */
    assert_int_equal(
        parse_once(&no_limits, C10D_STORE_DIALECT_CURRENT, huge_key, 9, why, sizeof why),
        C10D_ENOMEM);
    static const uint8_t big_value[] = {1, 1, 0, 0, 0, 0, 0, 0, 0, 'k', 101, 0, 0, 0, 0, 0, 0, 0};
    assert_int_equal(
        parse_once(&lim, C10D_STORE_DIALECT_CURRENT, big_value, sizeof big_value, why, sizeof why),
        C10D_ENOMEM);
    assert_non_null(strstr(why, "value"));
    static const uint8_t many_keys[] = {6, 5, 0, 0, 0, 0, 0, 0, 0};
    assert_int_equal(
        parse_once(&lim, C10D_STORE_DIALECT_CURRENT, many_keys, sizeof many_keys, why, sizeof why),
        C10D_ENOMEM);
    assert_non_null(strstr(why, "keys"));
    static const uint8_t huge_count[] = {11, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    assert_true(parse_once(&no_limits, C10D_STORE_DIALECT_CURRENT, huge_count, sizeof huge_count,
                           why, sizeof why) < 0);
    /* Request size limit: four values of 100 bytes in a MULTI_SET. */
    struct c10d__wire_buf b = {0};
    uint8_t v[100] = {0};
    struct c10d__wire_str args[8];
    for (int i = 0; i < 8; i += 2) {
        args[i] = S("key");
        args[i + 1] = (struct c10d__wire_str){v, sizeof v};
    }
    struct c10d__wire_request r = {.cmd = C10D_STORE_MULTI_SET, .nargs = 8, .args = args};
    assert_int_equal(c10d__wire_encode_request(&b, C10D_STORE_DIALECT_CURRENT, &r), 0);
    lim.max_request_bytes = 300;
    assert_int_equal(parse_once(&lim, C10D_STORE_DIALECT_CURRENT, b.data, b.len, why, sizeof why),
                     C10D_ENOMEM);
    assert_non_null(strstr(why, "message"));
    lim.max_request_bytes = 0;
    assert_int_equal(parse_once(&lim, C10D_STORE_DIALECT_CURRENT, b.data, b.len, why, sizeof why),
                     C10D_STORE_PARSE_DONE);
    c10d__wire_buf_free(&b);
}

/* A big value in small reads: the parser resumes, never rescans, and `need`
 * names the rest of the body right after the length. */
static void test_need_hint(void **state)
{
    (void)state;
    size_t vlen = 1 << 20;
    uint8_t *v = calloc(1, vlen);
    struct c10d__wire_str args[2] = {S("/big"), {v, vlen}};
    struct c10d__wire_request r = {.cmd = C10D_STORE_SET, .nargs = 2, .args = args};
    struct c10d__wire_buf b = {0};
    assert_int_equal(c10d__wire_encode_request(&b, C10D_STORE_DIALECT_CURRENT, &r), 0);
    struct c10d__wire_parser p;
    c10d__wire_parser_init(&p, &no_limits);
    p.dialect = C10D_STORE_DIALECT_CURRENT;
    struct c10d__wire_request got;
    size_t used;
    size_t hdr = 1 + 8 + 4 + 8;
    assert_int_equal(c10d__wire_parse_request(&p, b.data, hdr, &got, &used), C10D_STORE_PARSE_MORE);
    assert_int_equal(p.need, vlen);
    for (size_t len = hdr; len < b.len; len += 4096)
        assert_int_equal(c10d__wire_parse_request(&p, b.data, len, &got, &used),
                         C10D_STORE_PARSE_MORE);
    assert_int_equal(c10d__wire_parse_request(&p, b.data, b.len, &got, &used),
                     C10D_STORE_PARSE_DONE);
    assert_int_equal(got.args[1].len, vlen);
    assert_ptr_equal(got.args[1].data, b.data + hdr);
    c10d__wire_parser_free(&p);
    c10d__wire_buf_free(&b);
    free(v);
}

/* ----------------------------------------------------------------- replies */

struct reply_case {
    int cmd;
    size_t nkeys;
    struct c10d__wire_buf bytes;
    int64_t i64;
    uint8_t u8;
    uint32_t u32;
    size_t nvals;
    const char *vals[4];
};

static void build_reply(struct reply_case *c)
{
    struct c10d__wire_buf *b = &c->bytes;
    switch (c10d__wire_reply_shape(c->cmd)) {
    case C10D_STORE_REPLY_U8:
        c10d__wire_put_u8(b, c->u8);
        break;
    case C10D_STORE_REPLY_U32:
        c10d__wire_put_u32(b, c->u32);
        break;
    case C10D_STORE_REPLY_I64:
        c10d__wire_put_i64(b, c->i64);
        break;
    case C10D_STORE_REPLY_LIST:
    case C10D_STORE_REPLY_QPOP:
        c10d__wire_put_i64(b, c->i64);
        /* fall through */
    default:
        for (size_t i = 0; i < c->nvals; i++)
            c10d__wire_put_str(b, c->vals[i], strlen(c->vals[i]));
    }
}

static void check_reply(const struct reply_case *c, const struct c10d__wire_reply *r)
{
    assert_int_equal(r->cmd, c->cmd);
    int shape = c10d__wire_reply_shape(c->cmd);
    if (shape == C10D_STORE_REPLY_U8)
        assert_int_equal(r->u8, c->u8);
    if (shape == C10D_STORE_REPLY_U32)
        assert_int_equal(r->u32, c->u32);
    if (shape == C10D_STORE_REPLY_I64 || shape == C10D_STORE_REPLY_LIST ||
        shape == C10D_STORE_REPLY_QPOP)
        assert_int_equal(r->i64, c->i64);
    assert_int_equal(r->nvals, c->nvals);
    for (size_t i = 0; i < c->nvals; i++) {
        assert_int_equal(r->vals[i].len, strlen(c->vals[i]));
        assert_memory_equal(r->vals[i].data, c->vals[i], r->vals[i].len);
    }
}

static void test_replies(void **state)
{
    (void)state;
    struct reply_case cases[] = {
        {.cmd = C10D_STORE_PING, .u32 = 4242},
        {.cmd = C10D_STORE_GET, .nvals = 1, .vals = {"value"}},
        {.cmd = C10D_STORE_GET, .nvals = 1, .vals = {""}},
        {.cmd = C10D_STORE_COMPARE_SET, .nvals = 1, .vals = {"cur"}},
        {.cmd = C10D_STORE_ADD, .i64 = -3},
        {.cmd = C10D_STORE_CHECK, .u8 = C10D_STORE_NOT_READY},
        {.cmd = C10D_STORE_WAIT, .u8 = C10D_STORE_STOP_WAITING},
        {.cmd = C10D_STORE_GETNUMKEYS, .i64 = 7},
        {.cmd = C10D_STORE_DELETE_KEY, .i64 = 1},
        {.cmd = C10D_STORE_MULTI_GET, .nkeys = 3, .nvals = 3, .vals = {"a", "", "ccc"}},
        {.cmd = C10D_STORE_MULTI_GET, .nkeys = 0, .nvals = 0},
        {.cmd = C10D_STORE_CANCEL_WAIT, .u8 = C10D_STORE_WAIT_CANCELED},
        {.cmd = C10D_STORE_QUEUE_POP, .i64 = 0, .nvals = 0},
        {.cmd = C10D_STORE_QUEUE_POP, .i64 = 2, .nvals = 1, .vals = {"item"}},
        {.cmd = C10D_STORE_QUEUE_LEN, .i64 = 5},
        {.cmd = C10D_STORE_LIST_KEYS, .i64 = 2, .nvals = 2, .vals = {"/a", "/bb"}},
        {.cmd = C10D_STORE_LIST_KEYS, .i64 = 0, .nvals = 0},
        {.cmd = C10D_STORE_BARRIER, .u8 = C10D_STORE_STOP_WAITING},
        {.cmd = C10D_STORE_WATCH_KEY, .u8 = C10D_STORE_KEY_CALLBACK_REGISTERED},
    };
    size_t n = sizeof cases / sizeof cases[0];
    struct c10d__wire_reply_parser rp;
    c10d__wire_reply_parser_init(&rp, &no_limits);
    struct c10d__wire_buf all = {0};
    for (size_t i = 0; i < n; i++) {
        build_reply(&cases[i]);
        struct c10d__wire_buf *b = &cases[i].bytes;
        assert_int_equal(c10d__wire_reply_expect(&rp, cases[i].cmd, cases[i].nkeys), 0);
        struct c10d__wire_reply r;
        size_t used;
        for (size_t k = 0; k < b->len; k++)
            assert_int_equal(c10d__wire_parse_reply(&rp, b->data, k, &r, &used),
                             C10D_STORE_PARSE_MORE);
        assert_int_equal(c10d__wire_parse_reply(&rp, b->data, b->len, &r, &used),
                         C10D_STORE_PARSE_DONE);
        assert_int_equal(used, b->len);
        check_reply(&cases[i], &r);
        /* Done: parsing again without expect() is an error. */
        assert_true(c10d__wire_parse_reply(&rp, b->data, b->len, &r, &used) < 0);
        c10d__wire_put_raw(&all, b->data, b->len);
    }
    /* All replies back to back in one buffer. */
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        struct c10d__wire_reply r;
        size_t used;
        c10d__wire_reply_expect(&rp, cases[i].cmd, cases[i].nkeys);
        assert_int_equal(c10d__wire_parse_reply(&rp, all.data + off, all.len - off, &r, &used),
                         C10D_STORE_PARSE_DONE);
        check_reply(&cases[i], &r);
        off += used;
        c10d__wire_buf_free(&cases[i].bytes);
    }
    assert_int_equal(off, all.len);
    /* No reply for SET. */
    assert_int_equal(c10d__wire_reply_expect(&rp, C10D_STORE_SET, 0), C10D_EINVAL);
    /* A watch event. */
    all.len = 0;
    c10d__wire_put_u8(&all, C10D_STORE_KEY_UPDATED);
    c10d__wire_put_str(&all, "/k", 2);
    c10d__wire_put_str(&all, "1", 1);
    c10d__wire_put_str(&all, "2", 1);
    c10d__wire_reply_expect_event(&rp);
    struct c10d__wire_reply r;
    size_t used;
    assert_int_equal(c10d__wire_parse_reply(&rp, all.data, all.len, &r, &used),
                     C10D_STORE_PARSE_DONE);
    assert_int_equal(r.u8, C10D_STORE_KEY_UPDATED);
    assert_int_equal(r.nvals, 3);
    assert_memory_equal(r.vals[2].data, "2", 1);
    /* Limits apply to replies too: a LIST_KEYS count and a value length. */
    struct c10d__wire_codec_limits lim = {.max_value_bytes = 10, .max_keys = 10};
    c10d__wire_reply_parser_free(&rp);
    c10d__wire_reply_parser_init(&rp, &lim);
    all.len = 0;
    c10d__wire_put_i64(&all, 11);
    c10d__wire_reply_expect(&rp, C10D_STORE_LIST_KEYS, 0);
    assert_int_equal(c10d__wire_parse_reply(&rp, all.data, all.len, &r, &used), C10D_ENOMEM);
    assert_true(strlen(rp.error) > 0);
    all.len = 0;
    c10d__wire_put_i64(&all, -1);
    c10d__wire_reply_expect(&rp, C10D_STORE_LIST_KEYS, 0);
    assert_true(c10d__wire_parse_reply(&rp, all.data, all.len, &r, &used) < 0);
    all.len = 0;
    c10d__wire_put_u64(&all, 11);
    c10d__wire_reply_expect(&rp, C10D_STORE_GET, 0);
    assert_int_equal(c10d__wire_parse_reply(&rp, all.data, all.len, &r, &used), C10D_ENOMEM);
    c10d__wire_reply_parser_free(&rp);
    c10d__wire_buf_free(&all);
}

static void test_parse_i64(void **state)
{
    (void)state;
    int64_t v;
#define OK(text, want)                                                                             \
    do {                                                                                           \
        assert_int_equal(c10d__wire_parse_i64((const uint8_t *)(text), strlen(text), &v), 0);      \
        assert_true(v == (want));                                                                  \
    } while (0)
#define BAD(text)                                                                                  \
    assert_int_equal(c10d__wire_parse_i64((const uint8_t *)(text), strlen(text), &v), C10D_EINVAL)
    OK("0", 0);
    OK("42", 42);
    OK("-7", -7);
    OK("+8", 8);
    OK("  12", 12);
    OK("12abc", 12);
    OK("9223372036854775807", INT64_MAX);
    OK("-9223372036854775808", INT64_MIN);
    BAD("");
    BAD("abc");
    BAD("-");
    BAD(" ");
    BAD("9223372036854775808");
    BAD("-9223372036854775809");
#undef OK
#undef BAD
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cmd_tables),
        cmocka_unit_test(test_known_bytes),
        cmocka_unit_test(test_roundtrip_current),
        cmocka_unit_test(test_roundtrip_legacy),
        cmocka_unit_test(test_dialect_detection),
        cmocka_unit_test(test_malformed_and_limits),
        cmocka_unit_test(test_need_hint),
        cmocka_unit_test(test_replies),
        cmocka_unit_test(test_parse_i64),
        cmocka_unit_test(test_auth),
        cmocka_unit_test(test_whole_parse_equivalence),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
