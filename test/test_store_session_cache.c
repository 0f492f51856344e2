/* The session layer's MULTI_GET reply cache (every mutating command must
 * invalidate it) and the server-wide cap on queued replies (sessions wait in
 * FIFO order and resume as the owner drains). Sessions are driven directly,
 * with a fake owner that keeps every flushed reply "unsent" until told. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "store_server/server/session.h"

#include <stdlib.h>
#include <string.h>

/* What the fake owner received from a session, in order. */
struct capture {
    struct c10d__wire_buf got;
};

static void fake_flush(struct c10d__store_session *s)
{
    struct capture *c = s->data;
    assert_int_equal(c10d__wire_put_raw(&c->got, s->out.data, s->out.len), 0);
    /* Not sent yet: counts against the server-wide cap until drained. */
    c10d__store_session_set_pending(s, s->pending_out + s->out.len);
    s->out.len = 0;
}

static void drain(struct c10d__store_session *s)
{
    c10d__store_session_set_pending(s, 0);
}

static void after_nothing(struct c10d__store_session *s)
{
    assert_false(s->closing);
}

static void send_req(struct c10d__store_session *s, int cmd, int64_t i64, size_t nargs,
                     const char *const *args)
{
    struct c10d__wire_str a[16];
    assert_true(nargs <= 16);
    for (size_t i = 0; i < nargs; i++)
        a[i] = (struct c10d__wire_str){(const uint8_t *)args[i], strlen(args[i])};
    struct c10d__wire_request r = {.cmd = cmd, .i64 = i64, .nargs = nargs, .args = a};
    if (cmd == C10D_STORE_VALIDATE)
        r.u32 = C10D_STORE_MAGIC;
    struct c10d__wire_buf b = {0};
    assert_int_equal(c10d__wire_encode_request(&b, C10D_STORE_DIALECT_CURRENT, &r), 0);
    assert_int_equal(c10d__store_session_feed(s, b.data, b.len), 0);
    c10d__wire_buf_free(&b);
}

struct fixture {
    struct c10d__store_ctx ctx;
    struct c10d__store_session a, b, c;
    struct capture ca, cb, cc;
};

static void open_session(struct fixture *f, struct c10d__store_session *s, struct capture *c)
{
    c10d__store_session_init(s, &f->ctx, "test");
    s->data = c;
    send_req(s, C10D_STORE_VALIDATE, 0, 0, NULL);
}

static int setup(void **state)
{
    struct fixture *f = calloc(1, sizeof *f);
    assert_non_null(f);
    assert_int_equal(c10d__store_ctx_init(&f->ctx, NULL, 1 << 30, fake_flush), 0);
    open_session(f, &f->a, &f->ca);
    open_session(f, &f->b, &f->cb);
    open_session(f, &f->c, &f->cc);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    c10d__store_session_free(&f->a);
    c10d__store_session_free(&f->b);
    c10d__store_session_free(&f->c);
    assert_int_equal(f->ctx.queued, 0);
    c10d__store_ctx_free(&f->ctx);
    c10d__wire_buf_free(&f->ca.got);
    c10d__wire_buf_free(&f->cb.got);
    c10d__wire_buf_free(&f->cc.got);
    free(f);
    return 0;
}

static const char *const KEYS[] = {"k0", "k1", "ctr", "bar"};
#define NKEYS 4

/* MULTI_GET of KEYS on `s`; returns the raw reply (caller frees) and its
 * length, and checks its shape. */
static uint8_t *mget(struct c10d__store_session *s, size_t *len)
{
    struct capture *c = s->data;
    c->got.len = 0;
    send_req(s, C10D_STORE_MULTI_GET, 0, NKEYS, KEYS);
    drain(s);
    *len = c->got.len;
    uint8_t *copy = malloc(*len ? *len : 1);
    assert_non_null(copy);
    memcpy(copy, c->got.data, *len);
    return copy;
}

/* The i-th value of a MULTI_GET reply, as a NUL-terminated string. */
static void value_at(const uint8_t *reply, size_t len, size_t idx, char *out, size_t size)
{
    size_t off = 0;
    for (size_t i = 0;; i++) {
        assert_true(off + 8 <= len);
        uint64_t n = c10d__wire_get_u64(reply + off);
        off += 8;
        assert_true(off + n <= len);
        if (i == idx) {
            assert_true(n < size);
            memcpy(out, reply + off, n);
            out[n] = 0;
            return;
        }
        off += n;
    }
}

static void want_value(struct c10d__store_session *s, size_t idx, const char *want)
{
    size_t len;
    uint8_t *r = mget(s, &len);
    char v[64];
    value_at(r, len, idx, v, sizeof v);
    assert_string_equal(v, want);
    free(r);
}

static void test_repeat_is_cached_and_identical(void **state)
{
    struct fixture *f = *state;
    const char *set0[] = {"k0", "v0"}, *set1[] = {"k1", "v1"};
    send_req(&f->a, C10D_STORE_SET, 0, 2, set0);
    send_req(&f->a, C10D_STORE_SET, 0, 2, set1);
    size_t l1, l2, l3;
    uint8_t *r1 = mget(&f->a, &l1);
    uint64_t hits = f->ctx.mget_hits;
    uint8_t *r2 = mget(&f->b, &l2);
    uint8_t *r3 = mget(&f->a, &l3);
    assert_int_equal(f->ctx.mget_hits, hits + 2);
    assert_int_equal(l1, l2);
    assert_int_equal(l1, l3);
    assert_memory_equal(r1, r2, l1);
    assert_memory_equal(r1, r3, l1);
    char v[64];
    value_at(r1, l1, 1, v, sizeof v);
    assert_string_equal(v, "v1");
    value_at(r1, l1, 2, v, sizeof v);
    assert_string_equal(v, ""); /* missing */
    /* A different key list (same keys, other order) is not the cached one. */
    const char *rev[] = {"k1", "k0"};
    f->cb.got.len = 0;
    send_req(&f->b, C10D_STORE_MULTI_GET, 0, 2, rev);
    drain(&f->b);
    value_at(f->cb.got.data, f->cb.got.len, 0, v, sizeof v);
    assert_string_equal(v, "v1");
    value_at(f->cb.got.data, f->cb.got.len, 1, v, sizeof v);
    assert_string_equal(v, "v0");
    free(r1);
    free(r2);
    free(r3);
}

/* Found by the fuzzer: a MULTI_GET of no keys (empty reply, no buffer) and
 * of empty keys must neither be cached from a NULL buffer nor crash. GCC's
 * UBSan does not flag NULL + 0, clang's does: the fuzz build (clang) keeps
 * the input as a seed, test/fuzz/seeds/regress-mget-no-keys. */
static void test_empty_key_lists(void **state)
{
    struct fixture *f = *state;
    f->ca.got.len = 0;
    send_req(&f->a, C10D_STORE_MULTI_GET, 0, 0, NULL);
    drain(&f->a);
    assert_int_equal(f->ca.got.len, 0);
    const char *empty[] = {"", ""};
    send_req(&f->a, C10D_STORE_MULTI_GET, 0, 2, empty);
    drain(&f->a);
    uint64_t hits = f->ctx.mget_hits;
    send_req(&f->b, C10D_STORE_MULTI_GET, 0, 2, empty);
    drain(&f->b);
    assert_int_equal(f->ctx.mget_hits, hits + 1);
    assert_false(f->a.closing || f->b.closing);
}

/* Every mutating command, sent on another session, shows up in the next
 * MULTI_GET of a list that was cached just before. */
static void test_mutations_invalidate(void **state)
{
    struct fixture *f = *state;
    const char *set1[] = {"k1", "old"}, *ctr[] = {"ctr", "5"};
    send_req(&f->a, C10D_STORE_SET, 0, 2, set1);
    send_req(&f->a, C10D_STORE_SET, 0, 2, ctr);
    drain(&f->a);
    want_value(&f->a, 1, "old");

    const char *set[] = {"k1", "new"};
    send_req(&f->b, C10D_STORE_SET, 0, 2, set);
    want_value(&f->a, 1, "new");

    const char *add[] = {"ctr"};
    want_value(&f->a, 2, "5");
    send_req(&f->b, C10D_STORE_ADD, 3, 1, add);
    drain(&f->b);
    want_value(&f->a, 2, "8");

    const char *app[] = {"k1", "+x"};
    send_req(&f->b, C10D_STORE_APPEND, 0, 2, app);
    want_value(&f->a, 1, "new+x");

    const char *cas[] = {"k1", "new+x", "swapped"};
    send_req(&f->b, C10D_STORE_COMPARE_SET, 0, 3, cas);
    drain(&f->b);
    want_value(&f->a, 1, "swapped");

    const char *del[] = {"k1"};
    send_req(&f->b, C10D_STORE_DELETE_KEY, 0, 1, del);
    drain(&f->b);
    want_value(&f->a, 1, "");

    /* BARRIER stores its arrival count under its key. */
    const char *bar[] = {"bar"};
    want_value(&f->a, 3, "");
    send_req(&f->b, C10D_STORE_BARRIER, 2, 1, bar);
    drain(&f->b);
    size_t len;
    uint8_t *r = mget(&f->a, &len);
    char v[64];
    value_at(r, len, 3, v, sizeof v);
    assert_string_not_equal(v, "");
    free(r);

    /* QUEUE_PUSH does not touch values, but must still drop the cache: the
     * invalidation is counted per command, not per key. */
    uint64_t misses = f->ctx.mget_misses;
    const char *push[] = {"k0", "item"};
    send_req(&f->b, C10D_STORE_QUEUE_PUSH, 0, 2, push);
    want_value(&f->a, 0, "");
    assert_int_equal(f->ctx.mget_misses, misses + 1);

    /* Read-only commands keep it. */
    uint64_t hits = f->ctx.mget_hits;
    const char *chk[] = {"k0"};
    send_req(&f->b, C10D_STORE_CHECK, 0, 1, chk);
    send_req(&f->b, C10D_STORE_GET, 0, 1, chk);
    drain(&f->b);
    want_value(&f->a, 0, "");
    assert_int_equal(f->ctx.mget_hits, hits + 1);
}

/* Over the server-wide cap, sessions with big replies wait and resume oldest
 * first; small replies on a small backlog are never held back. */
static void test_queued_cap_fifo(void **state)
{
    struct fixture *f = *state;
    char big[1000];
    memset(big, 'v', sizeof big - 1);
    big[sizeof big - 1] = 0;
    const char *set[] = {"big", big}, *get[] = {"big"};
    send_req(&f->a, C10D_STORE_SET, 0, 2, set);
    f->ctx.queued_cap = 900;
    f->ca.got.len = f->cb.got.len = f->cc.got.len = 0;

    send_req(&f->a, C10D_STORE_GET, 0, 1, get); /* ~1 KB queued: over the cap */
    assert_false(f->a.stalled);
    assert_true(f->ctx.queued >= f->ctx.queued_cap);
    send_req(&f->b, C10D_STORE_GET, 0, 1, get);
    send_req(&f->c, C10D_STORE_GET, 0, 1, get);
    assert_true(f->b.stalled && f->b.in_fifo);
    assert_true(f->c.stalled && f->c.in_fifo);
    assert_int_equal(f->cb.got.len, 0);
    assert_int_equal(f->cc.got.len, 0);
    /* A session with nothing queued is not held back for a small reply (a
     * client that never reads a big one must not delay everyone's PING)... */
    drain(&f->a);
    send_req(&f->a, C10D_STORE_PING, 0, 0, NULL);
    assert_false(f->a.in_fifo);
    assert_int_equal(f->ca.got.len, (8 + 999) + 4);
    drain(&f->a);
    /* ...but a big one may not overtake the FIFO, even once the cap clears. */
    send_req(&f->a, C10D_STORE_GET, 0, 1, get);
    assert_true(f->a.in_fifo);

    c10d__store_ctx_resume(&f->ctx, after_nothing);
    /* b ran first and filled the cap again; c and a still wait, in order. */
    assert_int_equal(f->cb.got.len, 8 + 999);
    assert_int_equal(f->cc.got.len, 0);
    assert_ptr_equal(f->ctx.stall_head, &f->c);
    drain(&f->b);
    c10d__store_ctx_resume(&f->ctx, after_nothing);
    assert_int_equal(f->cc.got.len, 8 + 999);
    assert_ptr_equal(f->ctx.stall_head, &f->a);
    drain(&f->c);
    c10d__store_ctx_resume(&f->ctx, after_nothing);
    assert_null(f->ctx.stall_head);
    assert_false(f->a.stalled);
    assert_int_equal(f->ca.got.len, 2 * (8 + 999) + 4); /* both GETs and the PING */
    drain(&f->a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_repeat_is_cached_and_identical, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mutations_invalidate, setup, teardown),
        cmocka_unit_test_setup_teardown(test_queued_cap_fifo, setup, teardown),
        cmocka_unit_test_setup_teardown(test_empty_key_lists, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
