/* Abuse: random bytes, huge lengths, half-sent requests then disconnect,
 * thousands of idle connections, clients that never read their replies,
 * readers of one big shared reply, a stalled first request, the connection limit. A well-behaved
 * client is served between and after every phase, on the same connection throughout. No timing
 * assertions: "closed" is waited for with a generous bound. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "store_test_util.h"

#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <poll.h>
#include <sys/resource.h>

#define PENDING_CAP (256 * 1024)

static struct store_ts ts;
static int port;
static struct store_tc good;
static int64_t good_counter;
static int idle_target;

/* The well-behaved client: a full round of commands with checked answers. */
static void good_round(void)
{
    struct c10d__wire_reply r;
    char val[32];
    snprintf(val, sizeof val, "v%" PRId64, good_counter);
    struct c10d__wire_str kv[] = {STR("/good/k"), {(const uint8_t *)val, strlen(val)}};
    assert_int_equal(store_tc_call(&good, C10D_STORE_SET, 0, 0, 2, kv, &r), 0);
    assert_int_equal(store_tc_call(&good, C10D_STORE_GET, 0, 0, 1, kv, &r), 0);
    assert_int_equal(r.vals[0].len, strlen(val));
    assert_memory_equal(r.vals[0].data, val, strlen(val));
    assert_int_equal(store_tc_call(&good, C10D_STORE_ADD, 0, 1, 1, &STR("/good/n"), &r), 0);
    assert_int_equal(r.i64, ++good_counter);
    assert_int_equal(store_tc_call(&good, C10D_STORE_WAIT, 0, 0, 1, kv, &r), 0);
    assert_int_equal(r.u8, C10D_STORE_STOP_WAITING);
    assert_int_equal(store_tc_call(&good, C10D_STORE_PING, 42, 0, 0, NULL, &r), 0);
    assert_int_equal(r.u32, 42);
}

static json_t *stats(void)
{
    char *text = store_ts_stats(&ts);
    assert_non_null(text);
    json_t *o = json_loads(text, 0, NULL);
    free(text);
    assert_non_null(o);
    return o;
}

static int64_t stat_int(json_t *o, const char *a, const char *b)
{
    json_t *v = json_object_get(o, a);
    if (b)
        v = json_object_get(v, b);
    return json_integer_value(v);
}

static int setup(void **state)
{
    (void)state;
    /* Raise the soft fd limit: idle connections cost two fds each here. */
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
    getrlimit(RLIMIT_NOFILE, &rl);
    idle_target = (int)((rl.rlim_cur - 200) / 2);
    if (idle_target > 3000)
        idle_target = 3000;
    struct c10d__store_server_opts o = {
        .port = 0,
        .limits = {.max_key_bytes = 1024,
                   .max_value_bytes = 4 << 20,
                   .max_keys_per_request = 1000,
                   .max_memory_bytes = 512 << 20,
                   .max_connections = (uint64_t)idle_target + 100,
                   .validate_timeout_ms = 1000,
                   .max_pending_write_bytes = PENDING_CAP},
    };
    port = store_ts_start(&ts, &o);
    if (port <= 0)
        return -1;
    if (store_tc_open(&good, port, AF_INET, C10D_STORE_DIALECT_CURRENT) < 0)
        return -1;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    store_tc_close(&good);
    store_ts_stop(&ts);
    return 0;
}

static void test_random_bytes(void **state)
{
    (void)state;
    srand(12345);
    int closed = 0;
    for (int i = 0; i < 40; i++) {
        int fd = store_tc_connect(port, i % 2 ? AF_INET6 : AF_INET);
        assert_true(fd >= 0);
        size_t n = 1 + (size_t)(rand() % 4096);
        uint8_t *junk = malloc(n);
        for (size_t k = 0; k < n; k++)
            junk[k] = (uint8_t)rand();
        if (i % 4 == 0)
            junk[0] = 0x00; /* looks like the current dialect's VALIDATE start */
        store_tc_send(fd, junk, n);
        free(junk);
        /* Most junk is malformed and gets closed; some only looks like an
         * unfinished request. Either way the good client is served. */
        closed += store_tc_wait_closed(fd, 200);
        close(fd);
        if (i % 10 == 0)
            good_round();
    }
    assert_true(closed > 0);
    good_round();
}

static void test_huge_lengths(void **state)
{
    (void)state;
    static const uint8_t cur_prefix[] = {0x00, 0xCE, 0xF7, 0x85, 0x3C};
    uint8_t reqs[][32] = {
        /* SET, key length 2^62 */
        {1, 0, 0, 0, 0, 0, 0, 0, 0x40},
        /* SET, key 1 byte, value length 2^40 */
        {1, 1, 0, 0, 0, 0, 0, 0, 0, 'k', 0, 0, 0, 0, 0, 1, 0, 0},
        /* MULTI_GET of 2^40 keys */
        {10, 0, 0, 0, 0, 0, 1, 0, 0},
        /* WAIT of UINT64_MAX keys */
        {6, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff},
    };
    size_t lens[] = {9, 18, 9, 9};
    for (size_t i = 0; i < 4; i++) {
        int fd = store_tc_connect(port, AF_INET);
        store_tc_send(fd, cur_prefix, sizeof cur_prefix);
        store_tc_send(fd, reqs[i], lens[i]);
        assert_int_equal(store_tc_wait_closed(fd, 20000), 1);
        close(fd);
        good_round();
    }
    /* Legacy dialect, key length 2^63. */
    uint8_t legacy_get[] = {2, 0, 0, 0, 0, 0, 0, 0, 0x80};
    int fd = store_tc_connect(port, AF_INET6);
    store_tc_send(fd, legacy_get, sizeof legacy_get);
    assert_int_equal(store_tc_wait_closed(fd, 20000), 1);
    close(fd);
    good_round();
}

static void test_half_sent_then_disconnect(void **state)
{
    (void)state;
    /* A SET whose 1 MiB value is cut off, on 100 connections, then gone. */
    struct c10d__wire_buf b = {0};
    uint8_t *val = calloc(1, 1 << 20);
    struct c10d__wire_str kv[] = {STR("/half"), {val, 1 << 20}};
    struct c10d__wire_request r = {.cmd = C10D_STORE_SET, .nargs = 2, .args = kv};
    c10d__wire_put_raw(&b, "\x00\xCE\xF7\x85\x3C", 5);
    c10d__wire_encode_request(&b, C10D_STORE_DIALECT_CURRENT, &r);
    for (int i = 0; i < 100; i++) {
        int fd = store_tc_connect(port, AF_INET);
        size_t cut = 1 + (size_t)i * (b.len / 100);
        store_tc_send(fd, b.data, cut < b.len ? cut : b.len - 1);
        close(fd);
        if (i % 25 == 0)
            good_round();
    }
    free(val);
    c10d__wire_buf_free(&b);
    good_round();
    /* The half value was never stored. */
    struct c10d__wire_reply rep;
    assert_int_equal(store_tc_call(&good, C10D_STORE_CHECK, 0, 0, 1, &STR("/half"), &rep), 0);
    assert_int_equal(rep.u8, C10D_STORE_NOT_READY);
}

static void test_thousands_of_idle_connections(void **state)
{
    (void)state;
    int *fds = malloc(sizeof(int) * (size_t)idle_target);
    int n = 0;
    for (; n < idle_target; n++) {
        fds[n] = store_tc_connect(port, n % 2 ? AF_INET6 : AF_INET);
        if (fds[n] < 0)
            break;
        if (n % 1000 == 0)
            good_round();
    }
    assert_true(n >= idle_target / 2);
    good_round();
    /* The server accepted them (connect() can complete before accept()). */
    for (int tries = 0; tries < 200; tries++) {
        json_t *o = stats();
        int64_t open = stat_int(o, "connections", "open");
        json_decref(o);
        if (open >= n)
            break;
        usleep(50000);
    }
    json_t *o = stats();
    assert_true(stat_int(o, "connections", "open") >= n);
    json_decref(o);
    /* Past the connection limit: refused, and the good client still works. */
    int extra[150], nextra = 0;
    for (; nextra < 150; nextra++)
        extra[nextra] = store_tc_connect(port, AF_INET);
    good_round();
    for (int i = 0; i < nextra; i++)
        if (extra[i] >= 0)
            close(extra[i]);
    for (int i = 0; i < n; i++)
        close(fds[i]);
    free(fds);
    good_round();
    o = stats();
    assert_true(stat_int(o, "connections", "refused") > 0);
    json_decref(o);
}

static void test_never_reads_replies(void **state)
{
    (void)state;
    struct c10d__wire_reply r;
    /* A 1 MiB value, then a client that pipelines GETs and never reads. */
    uint8_t *val = calloc(1, 1 << 20);
    struct c10d__wire_str kv[] = {STR("/bigval"), {val, 1 << 20}};
    assert_int_equal(store_tc_call(&good, C10D_STORE_SET, 0, 0, 2, kv, &r), 0);
    free(val);
    int fd = store_tc_connect(port, AF_INET);
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    struct c10d__wire_buf b = {0};
    c10d__wire_put_raw(&b, "\x00\xCE\xF7\x85\x3C", 5);
    for (int i = 0; i < 64; i++) {
        struct c10d__wire_request q = {.cmd = C10D_STORE_GET, .nargs = 1, .args = kv};
        c10d__wire_encode_request(&b, C10D_STORE_DIALECT_CURRENT, &q);
    }
    /* Keep sending GETs until the kernel buffers are full both ways. */
    size_t sent_total = 0;
    for (int rounds = 0; rounds < 2000; rounds++) {
        ssize_t n = send(fd, b.data, b.len, MSG_NOSIGNAL);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            if (poll(&p, 1, 300) == 0)
                break; /* the server stopped reading us */
            continue;
        }
        if (n <= 0)
            break; /* closed */
        sent_total += (size_t)n;
        if (rounds % 50 == 0)
            good_round();
    }
    c10d__wire_buf_free(&b);
    good_round();
    /* Buffered replies stay bounded: requests stop running past the cap, so
     * at most the cap plus one reply is queued. */
    json_t *o = stats();
    int64_t pending = stat_int(o, "pending_write_bytes", NULL);
    json_decref(o);
    assert_true(pending <= PENDING_CAP + (2 << 20));
    assert_true(sent_total > 0);
    close(fd);
    good_round();

    /* A 1.13 watcher that never reads while values change: pushes pile up
     * until the hard cap closes it. */
    struct store_tc w;
    assert_int_equal(store_tc_open(&w, port, AF_INET, C10D_STORE_DIALECT_LEGACY), 0);
    int one = 1024;
    setsockopt(w.fd, SOL_SOCKET, SO_RCVBUF, &one, sizeof one);
    assert_int_equal(store_tc_call(&w, C10D_STORE_WATCH_KEY, 0, 0, 1, &STR("/watched"), &r), 0);
    uint8_t *v64 = calloc(1, 64 * 1024);
    struct c10d__wire_str wkv[] = {STR("/watched"), {v64, 64 * 1024}};
    int closed = 0;
    for (int i = 0; i < 400 && !closed; i++) {
        assert_int_equal(store_tc_call(&good, C10D_STORE_SET, 0, 0, 2, wkv, &r), 0);
        if (i % 20 == 0) {
            json_t *s = stats();
            closed = stat_int(s, "connections", "closed_slow_readers") > 0;
            json_decref(s);
        }
    }
    free(v64);
    assert_true(closed);
    store_tc_close(&w);
    good_round();
}

/* Enough clients that never read to fill the server-wide reply cap: everyone
 * else would wait behind them forever; the stuck ones are closed instead. */
static void test_never_readers_fill_server_cap(void **state)
{
    (void)state;
    struct store_ts ts2;
    struct c10d__store_server_opts o = {
        .port = 0,
        .limits = {.max_pending_write_bytes = 128 * 1024,
                   .max_queued_reply_bytes = 512 * 1024,
                   .slow_reader_timeout_ms = 500},
    };
    int port2 = store_ts_start(&ts2, &o);
    assert_true(port2 > 0);
    struct store_tc good2;
    struct c10d__wire_reply r;
    assert_int_equal(store_tc_open(&good2, port2, AF_INET, C10D_STORE_DIALECT_CURRENT), 0);
    uint8_t *val = calloc(1, 64 * 1024);
    struct c10d__wire_str kv[] = {STR("/v"), {val, 64 * 1024}};
    assert_int_equal(store_tc_call(&good2, C10D_STORE_SET, 0, 0, 2, kv, &r), 0);
    free(val);
    struct c10d__wire_buf b = {0};
    c10d__wire_put_raw(&b, "\x00\xCE\xF7\x85\x3C", 5);
    for (int i = 0; i < 32; i++) {
        struct c10d__wire_request q = {.cmd = C10D_STORE_GET, .nargs = 1, .args = kv};
        c10d__wire_encode_request(&b, C10D_STORE_DIALECT_CURRENT, &q);
    }
    enum { NBAD = 12 };
    int bad[NBAD];
    for (int k = 0; k < NBAD; k++) {
        bad[k] = store_tc_connect(port2, AF_INET);
        assert_true(bad[k] >= 0);
        int small = 4096;
        setsockopt(bad[k], SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
        fcntl(bad[k], F_SETFL, fcntl(bad[k], F_GETFL) | O_NONBLOCK);
        /* Send GETs until the server stops reading them: the kernel buffers
         * both ways are full and the rest waits in the server. */
        for (int rounds = 0; rounds < 4000; rounds++) {
            ssize_t n = send(bad[k], b.data, b.len, MSG_NOSIGNAL);
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                struct pollfd p = {.fd = bad[k], .events = POLLOUT};
                if (poll(&p, 1, 100) == 0)
                    break;
                continue;
            }
            if (n <= 0)
                break;
        }
    }
    c10d__wire_buf_free(&b);
    usleep(200000);
    /* Served, after the stuck readers were closed (store_tc's 20 s receive
     * timeout fails the test if it never is). */
    assert_int_equal(store_tc_call(&good2, C10D_STORE_PING, 7, 0, 0, NULL, &r), 0);
    assert_int_equal(r.u32, 7);
    assert_int_equal(store_tc_call(&good2, C10D_STORE_GET, 0, 0, 1, kv, &r), 0);
    assert_int_equal(r.vals[0].len, 64 * 1024);
    char *text = store_ts_stats(&ts2);
    json_t *st = json_loads(text, 0, NULL);
    free(text);
    assert_true(stat_int(st, "connections", "closed_slow_readers") >= 1);
    json_decref(st);
    for (int k = 0; k < NBAD; k++)
        close(bad[k]);
    store_tc_close(&good2);
    store_ts_stop(&ts2);
}

/* A current-dialect client whose receive window is small from the start
 * (set before connecting, so the window scale fits it), so that a big reply
 * stays mostly in the server while the client does not read. */
static int open_small_window(struct store_tc *c, int port2)
{
    memset(c, 0, sizeof *c);
    c->dialect = C10D_STORE_DIALECT_CURRENT;
    c10d__wire_reply_parser_init(&c->rp, NULL);
    c->fd = socket(AF_INET, SOCK_STREAM, 0);
    int small = 8192;
    setsockopt(c->fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port2)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (c->fd < 0 || connect(c->fd, (struct sockaddr *)&a, sizeof a) < 0)
        return -1;
    struct timeval tv = {.tv_sec = 20};
    setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return store_tc_req(c->fd, c->dialect, C10D_STORE_VALIDATE, 0, 0, 0, NULL);
}

/* A rendezvous's readers: many clients ask for the same big MULTI_GET and
 * read it late. The reply is held once, by reference, not once per client:
 * nobody waits for the server-wide reply cap (here far below what the copies
 * would take), nobody is closed as a slow reader, the server's memory stays
 * near one copy, and each client then reads every byte right. */
static void test_readers_share_one_reply(void **state)
{
    (void)state;
    enum { NKEYS = 16, VLEN = 1 << 20, NREADERS = 8 };
    struct store_ts ts2;
    struct c10d__store_server_opts o = {
        .port = 0,
        .limits = {.max_pending_write_bytes = 128 * 1024,
                   .max_queued_reply_bytes = 512 * 1024,
                   .slow_reader_timeout_ms = 300},
    };
    int port2 = store_ts_start(&ts2, &o);
    assert_true(port2 > 0);
    struct store_tc setter, readers[NREADERS];
    struct c10d__wire_reply r;
    assert_int_equal(store_tc_open(&setter, port2, AF_INET, C10D_STORE_DIALECT_CURRENT), 0);
    char names[NKEYS][16];
    struct c10d__wire_str keys[NKEYS];
    uint8_t *val = malloc(VLEN);
    for (int k = 0; k < NKEYS; k++) {
        snprintf(names[k], sizeof names[k], "/addr/%d", k);
        keys[k] = (struct c10d__wire_str){(const uint8_t *)names[k], strlen(names[k])};
        memset(val, 'a' + k, VLEN);
        struct c10d__wire_str kv[] = {keys[k], {val, VLEN}};
        assert_int_equal(store_tc_call(&setter, C10D_STORE_SET, 0, 0, 2, kv, &r), 0);
    }
    /* SET has no reply: a PING behind them says they ran. */
    assert_int_equal(store_tc_call(&setter, C10D_STORE_PING, 8, 0, 0, NULL, &r), 0);
    for (int i = 0; i < NREADERS; i++) {
        assert_int_equal(open_small_window(&readers[i], port2), 0);
        assert_int_equal(store_tc_req(readers[i].fd, C10D_STORE_DIALECT_CURRENT,
                                      C10D_STORE_MULTI_GET, 0, 0, NKEYS, keys),
                         0);
    }
    /* Every request answered, the replies stuck in sockets nobody reads,
     * for longer than the slow-reader timeout. */
    assert_int_equal(store_tc_call(&setter, C10D_STORE_PING, 9, 0, 0, NULL, &r), 0);
    usleep(900000);
    assert_int_equal(store_tc_call(&setter, C10D_STORE_PING, 10, 0, 0, NULL, &r), 0);
    assert_int_equal(r.u32, 10);
    char *text = store_ts_stats(&ts2);
    json_t *st = json_loads(text, 0, NULL);
    free(text);
    assert_int_equal(stat_int(st, "connections", "closed_slow_readers"), 0);
    assert_int_equal(stat_int(st, "reply_cap_stalls", NULL), 0);
    assert_true(stat_int(st, "multi_get_cache", "shared_sends") >= NREADERS - 1);
    /* The values (16 MiB) and one copy of the reply, mostly still in the
     * server: the copies would be 8. */
    assert_true(stat_int(st, "memory", NULL) < 3 * NKEYS * VLEN);
    json_decref(st);
    for (int i = 0; i < NREADERS; i++) {
        int got = store_tc_recv(&readers[i], C10D_STORE_MULTI_GET, NKEYS, 0, &r);
        if (got)
            fprintf(stderr, "reader %d: %d errno %d len %zu used %zu\n", i, got, errno,
                    readers[i].len, readers[i].used);
        assert_int_equal(got, 0);
        for (int k = 0; k < NKEYS; k++) {
            memset(val, 'a' + k, VLEN);
            assert_int_equal(r.vals[k].len, VLEN);
            assert_memory_equal(r.vals[k].data, val, VLEN);
        }
        store_tc_close(&readers[i]);
    }
    free(val);
    store_tc_close(&setter);
    store_ts_stop(&ts2);
}

static void test_stalled_first_request(void **state)
{
    (void)state;
    /* Two bytes of VALIDATE, then nothing: closed after the validate timeout. */
    int fd = store_tc_connect(port, AF_INET);
    store_tc_send(fd, "\x00\xCE", 2);
    good_round();
    assert_int_equal(store_tc_wait_closed(fd, 30000), 1);
    close(fd);
    /* A silent connection is left alone (1.13 keeps one idle per store). */
    int quiet = store_tc_connect(port, AF_INET);
    assert_int_equal(store_tc_wait_closed(quiet, 1500), 0);
    close(quiet);
    good_round();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_bytes),
        cmocka_unit_test(test_huge_lengths),
        cmocka_unit_test(test_half_sent_then_disconnect),
        cmocka_unit_test(test_thousands_of_idle_connections),
        cmocka_unit_test(test_never_reads_replies),
        cmocka_unit_test(test_never_readers_fill_server_cap),
        cmocka_unit_test(test_readers_share_one_reply),
        cmocka_unit_test(test_stalled_first_request),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
