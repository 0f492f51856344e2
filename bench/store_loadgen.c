/* store_loadgen: a load generator for TCPStore servers, ours (c10d-store) or
 * PyTorch's, in either wire dialect (docs/store_protocol.md). Over 800 lines:
 * its four modes (ops, rendezvous, group creation, idle memory) share one epoll
 * client, and a benchmark reads best as one program.
 *
 *   store_loadgen --port P [--dialect legacy|current] --mode ops --pattern set|get|add|wait|setwait
 *                 --conns K [--duration S] [--warmup S]
 *   store_loadgen --port P --mode rdzv --ranks N [--barrier add|cmd] [--read multiget|get|lazy]
 *   store_loadgen --port P --mode groups --ranks N --groups G [--check hash|lists]
 *   store_loadgen --port P --mode idle --conns N --server-pid PID
 *   (rdzv, groups: --probe-ms M also PINGs the server every M ms from a thread
 *   of its own and reports the slowest answer: is the store still serving?)
 *
 * One thread, one epoll set, non-blocking sockets. Each connection keeps one
 * request in flight, as PyTorch's clients do, so ops/s at K connections is what
 * K clients hammering the server would see. Replies are decoded as a stream
 * (a few bytes of state per connection, one shared read buffer), so 10k ranks
 * reading 10k addresses each cost no memory here; requests are encoded once
 * with the store codec and re-sent from the same bytes.
 *
 * The last line on stdout is "RESULT key=value ..." for scripts (store_compare.sh);
 * everything else goes to stderr. Exit status: 0 ok, 1 the run failed or timed
 * out (the RESULT line says how far it got), 2 usage.
 */
#include "store_server/wire/codec.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------ utilities */

static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "store_loadgen: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(2);
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* CPU seconds (user + system) a process has used; -1 if unreadable. */
static double proc_cpu_s(int pid)
{
    char path[64], buf[2048];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    /* comm may hold spaces: fields restart after the last ')'. */
    char *p = strrchr(buf, ')');
    unsigned long long ut, st;
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
        return -1;
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

static double self_cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec / 1e6;
}

/* VmRSS of a process in KiB; -1 if unreadable. */
static long proc_rss_kib(int pid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    long kib = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld kB", &kib) == 1)
            break;
    fclose(f);
    return kib;
}

/* ------------------------------------------------------------- options */

enum mode { MODE_OPS, MODE_RDZV, MODE_GROUPS, MODE_IDLE };
enum pattern { PAT_SET, PAT_GET, PAT_ADD, PAT_WAIT, PAT_SETWAIT };
static const char *const pattern_names[] = {"set", "get", "add", "wait", "setwait"};

static struct {
    const char *host;
    const char *port;
    int dialect;
    int mode;
    int pattern;
    int conns;
    double duration_s;
    double warmup_s;
    double timeout_s;
    int connect_concurrency; /* 0: every connection at once */
    int server_pid;
    size_t value_bytes;
    int barrier_cmd; /* rdzv: BARRIER instead of ADD + WAIT last_worker */
    int read_multiget;
    int read_lazy;    /* rdzv: what a lazy tcp rank reads: rank 0's key and its ring neighbours' */
    int sync_barrier; /* rdzv: a second barrier, not WAIT on all keys, before reading */
    int groups;       /* groups: how many groups each rank creates */
    int check_lists;  /* groups: the old member check (every list read, then a barrier) */
    int probe_ms;     /* rdzv, groups: PING period of the probe thread; 0: no probe */
    const char *label;
} opt = {
    .host = "127.0.0.1",
    .dialect = C10D_STORE_DIALECT_LEGACY,
    .mode = MODE_OPS,
    .pattern = PAT_SET,
    .conns = 1,
    .duration_s = 3,
    .warmup_s = 0.5,
    .timeout_s = 60,
    .connect_concurrency = -1,
    .value_bytes = 64,
    .read_multiget = -1,
    .groups = 100,
    .label = "-",
};

/* ------------------------------------------------------------ encoding */

static void encode(struct c10d__wire_buf *b, int cmd, uint32_t u32, int64_t i64, size_t nargs,
                   const struct c10d__wire_str *args)
{
    struct c10d__wire_request req = {
        .cmd = cmd, .u32 = u32, .i64 = i64, .nargs = nargs, .args = args};
    int rc = c10d__wire_encode_request(b, opt.dialect, &req);
    if (rc < 0)
        die("cannot encode %s in the %s dialect: %s", c10d__wire_cmd_name(cmd),
            opt.dialect == C10D_STORE_DIALECT_LEGACY ? "legacy" : "current", c10d_strerror(rc));
}

static struct c10d__wire_str str_of(const char *s)
{
    return (struct c10d__wire_str){(const uint8_t *)s, strlen(s)};
}

static char *values; /* rdzv: the value of every rank, back to back */

/* The value rank/connection `i` publishes: recognisable prefix, fixed size. */
static void make_value(char *out, size_t len, int i)
{
    memset(out, 'x', len);
    char head[32];
    int n = snprintf(head, sizeof head, "addr-%08d-", i);
    memcpy(out, head, (size_t)n < len ? (size_t)n : len);
}

/* --------------------------------------------------- streaming replies */

/* Decodes one reply as bytes arrive, keeping only what the benchmark checks:
 * the integer of U8/U32/I64 replies and, for strings, their length and first
 * bytes. Strings are skipped, never buffered. */
enum shape { SH_NONE, SH_U8, SH_U32, SH_I64, SH_STR, SH_NSTR };
#define NO_CHECK (-2) /* check_first: take strings of any length and content */

struct rdec {
    int shape;
    int done;
    uint64_t strs_left; /* strings still to come (STR: 1, NSTR: n) */
    uint64_t strs_seen;
    int in_body; /* reading a string's bytes (else a fixed-size field) */
    uint8_t tmp[8];
    unsigned tmp_have, tmp_need;
    uint64_t body_left;
    uint64_t cur_len;
    uint8_t head[16];
    unsigned head_have;
    int64_t ival;
    uint64_t bad;    /* strings whose length or prefix was not the expected one */
    int check_first; /* index of the value the first string should carry; -1: no check */
};

static void rdec_expect(struct rdec *d, int shape, uint64_t nstr, int check_first)
{
    memset(d, 0, sizeof *d);
    d->shape = shape;
    d->check_first = check_first;
    d->strs_left = shape == SH_STR ? 1 : nstr;
    d->tmp_need = shape == SH_U8 ? 1 : shape == SH_U32 ? 4 : 8;
    if (shape == SH_NSTR && nstr == 0)
        d->done = 1;
}

static void rdec_string_done(struct rdec *d)
{
    if (d->check_first == NO_CHECK) {
        /* groups mode: lists and hashes of any length */
    } else if (d->check_first >= 0) {
        /* values[] holds what every rank published (rdzv mode); no printf
         * here: this runs 100M times in a 10k-rank rendezvous. */
        const char *want = values + (size_t)(d->check_first + (int)d->strs_seen) * opt.value_bytes;
        if (d->cur_len != opt.value_bytes || d->head_have < sizeof d->head ||
            memcmp(d->head, want, sizeof d->head) != 0)
            d->bad++;
    } else if (d->cur_len != opt.value_bytes) {
        d->bad++;
    }
    d->strs_seen++;
    d->strs_left--;
    if (d->strs_left == 0)
        d->done = 1;
    d->in_body = 0;
    d->tmp_have = 0;
    d->tmp_need = 8;
}

/* Consumes bytes of the reply; returns how many (less than n once done). */
static size_t rdec_feed(struct rdec *d, const uint8_t *p, size_t n)
{
    size_t used = 0;
    while (!d->done && used < n) {
        if (d->in_body) {
            size_t take = d->body_left < n - used ? (size_t)d->body_left : n - used;
            if (d->head_have < sizeof d->head) {
                size_t h = sizeof d->head - d->head_have;
                h = h < take ? h : take;
                memcpy(d->head + d->head_have, p + used, h);
                d->head_have += (unsigned)h;
            }
            used += take;
            d->body_left -= take;
            if (d->body_left == 0)
                rdec_string_done(d);
            continue;
        }
        size_t take = d->tmp_need - d->tmp_have;
        take = take < n - used ? take : n - used;
        memcpy(d->tmp + d->tmp_have, p + used, take);
        d->tmp_have += (unsigned)take;
        used += take;
        if (d->tmp_have < d->tmp_need)
            break;
        if (d->shape == SH_STR || d->shape == SH_NSTR) {
            d->cur_len = c10d__wire_get_u64(d->tmp);
            d->body_left = d->cur_len;
            d->head_have = 0;
            d->in_body = 1;
            if (d->cur_len == 0)
                rdec_string_done(d);
        } else {
            d->ival = d->shape == SH_U8    ? d->tmp[0]
                      : d->shape == SH_U32 ? (int64_t)c10d__wire_get_u32(d->tmp)
                                           : (int64_t)c10d__wire_get_u64(d->tmp);
            d->done = 1;
        }
    }
    return used;
}

/* ---------------------------------------------------------- connections */

enum cstate { C_NEW, C_CONNECTING, C_BACKOFF, C_OPEN, C_DONE, C_DEAD };

struct conn {
    int fd;
    int idx;
    int state;
    int out_armed; /* EPOLLOUT in the interest set */
    int busy;      /* a reply is expected */
    int tries;
    uint64_t retry_at;
    uint64_t sent_at;
    /* what is being written: up to two parts (own bytes, then shared bytes) */
    struct iovec iov[2];
    int niov;
    struct c10d__wire_buf own;   /* this connection's encoded requests */
    struct c10d__wire_buf setup; /* ops mode: its first request */
    struct rdec dec;
    int phase; /* ops: 0 setup, 1 measuring; rdzv: see enum rphase */
    int next_get;
    int lazy_targets[3], nlazy, lazy_i; /* rdzv --read lazy: the keys this rank reads */
    int sub;                            /* rdzv, second barrier by ADD: 0 ADD sent, 1 WAIT sent */
    int group, step;                    /* groups: the group being created, its step */
};

static struct conn *conns;
static int nconns;
static int epfd;
static struct addrinfo *target;
static uint64_t t_start, deadline;
static uint64_t connects_failed_tries, conn_resets, conns_dead, proto_errors, bad_values;
static int connecting_now, connected_count, connect_cursor;
static char first_error[256];

static void note_error(const char *fmt, ...)
{
    if (first_error[0])
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(first_error, sizeof first_error, fmt, ap);
    va_end(ap);
}

static void raise_nofile(int want)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return;
    rlim_t need = (rlim_t)want + 64;
    if (rl.rlim_cur < need) {
        rl.rlim_cur = need < rl.rlim_max ? need : rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    if (rl.rlim_cur < need)
        die("need %d file descriptors, RLIMIT_NOFILE allows %llu (raise the hard limit)", want,
            (unsigned long long)rl.rlim_cur);
}

static void conn_close(struct conn *c)
{
    if (c->fd >= 0) {
        /* RST instead of FIN: no TIME_WAIT pile-up across thousands of runs. */
        struct linger lg = {1, 0};
        setsockopt(c->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
        close(c->fd);
        c->fd = -1;
    }
}

static void conn_dead(struct conn *c, const char *why)
{
    if (c->state == C_DEAD)
        return;
    note_error("connection %d: %s", c->idx, why);
    if (c->state == C_OPEN)
        connected_count--;
    conn_close(c);
    c->state = C_DEAD;
    conns_dead++;
}

static void set_out(struct conn *c, int want)
{
    if (c->out_armed == want)
        return;
    struct epoll_event ev = {.events = EPOLLIN | (want ? EPOLLOUT : 0), .data.ptr = c};
    epoll_ctl(epfd, EPOLL_CTL_MOD, c->fd, &ev);
    c->out_armed = want;
}

static void conn_flush(struct conn *c)
{
    while (c->niov > 0) {
        ssize_t w = writev(c->fd, c->iov, c->niov);
        if (w < 0) {
            if (errno == EAGAIN || errno == EINTR) {
                set_out(c, 1);
                return;
            }
            conn_resets++;
            conn_dead(c, strerror(errno));
            return;
        }
        size_t left = (size_t)w;
        while (c->niov > 0 && left >= c->iov[0].iov_len) {
            left -= c->iov[0].iov_len;
            c->iov[0] = c->iov[1];
            c->niov--;
        }
        if (c->niov > 0) {
            c->iov[0].iov_base = (uint8_t *)c->iov[0].iov_base + left;
            c->iov[0].iov_len -= left;
        }
    }
    set_out(c, 0);
}

/* Sends a (own) then b (shared, not copied), expecting a reply of `shape`. */
static void conn_send(struct conn *c, const void *a, size_t alen, const void *b, size_t blen,
                      int shape, uint64_t nstr, int check_first)
{
    c->niov = 0;
    if (alen)
        c->iov[c->niov++] = (struct iovec){(void *)a, alen};
    if (blen)
        c->iov[c->niov++] = (struct iovec){(void *)b, blen};
    rdec_expect(&c->dec, shape, nstr, check_first);
    c->busy = 1;
    c->sent_at = now_ns();
    conn_flush(c);
}

static void conn_start_connect(struct conn *c)
{
    c->fd = socket(target->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c->fd < 0)
        die("socket: %s", strerror(errno));
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    c->tries++;
    c->state = C_CONNECTING;
    c->out_armed = 1;
    connecting_now++;
    struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.ptr = c};
    if (epoll_ctl(epfd, EPOLL_CTL_ADD, c->fd, &ev) != 0)
        die("epoll_ctl: %s", strerror(errno));
    if (connect(c->fd, target->ai_addr, target->ai_addrlen) != 0 && errno != EINPROGRESS) {
        /* reported through EPOLLOUT/EPOLLERR on the next round */
    }
}

static void conn_backoff(struct conn *c, int err)
{
    connects_failed_tries++;
    connecting_now--;
    conn_close(c);
    if (c->tries >= 1000) {
        c->state = C_CONNECTING; /* so conn_dead does not count it as open */
        conn_dead(c, strerror(err));
        return;
    }
    /* Like PyTorch's clients: exponential backoff with jitter, capped. */
    uint64_t ms = 10;
    for (int i = 1; i < c->tries && ms < 1000; i++)
        ms = ms * 3 / 2;
    ms = ms > 1000 ? 1000 : ms;
    ms += (uint64_t)rand() % (ms / 2 + 1);
    c->retry_at = now_ns() + ms * 1000000u;
    c->state = C_BACKOFF;
}

/* Starts connects up to the concurrency limit and retries whose time came. */
static void pump_connects(void)
{
    uint64_t t = now_ns();
    int limit = opt.connect_concurrency > 0 ? opt.connect_concurrency : nconns;
    for (int i = 0; i < nconns && connecting_now < limit; i++) {
        struct conn *c = &conns[i];
        if (c->state == C_BACKOFF && c->retry_at <= t)
            conn_start_connect(c);
    }
    while (connect_cursor < nconns && connecting_now < limit)
        conn_start_connect(&conns[connect_cursor++]);
}

/* ------------------------------------------------------------ the modes */

/* ops mode */
static struct c10d__wire_buf op_add_buf; /* ADD /bench/add 1: the same for everyone */
static uint64_t win_start, win_end;
static uint64_t ops_done, *lat;
/* Every op answered, in the window or not (warm-up, tail): what the server
 * did, for counts of its work per request (store_floor_callgrind.sh). */
static uint64_t ops_all;
static size_t nlat, caplat;
static int measuring_done;
static double srv_cpu_start;
static int cpu_sampled;
static double gen_cpu[2], srv_cpu[2];

static void sample_cpu(void)
{
    gen_cpu[cpu_sampled] = self_cpu_s();
    srv_cpu[cpu_sampled] = opt.server_pid ? proc_cpu_s(opt.server_pid) : 0;
    cpu_sampled++;
}

static void ops_prepare(struct conn *c)
{
    char key[64], value[4096];
    size_t vlen = opt.value_bytes < sizeof value ? opt.value_bytes : sizeof value;
    make_value(value, vlen, c->idx);
    struct c10d__wire_str kv[2];
    if (opt.dialect == C10D_STORE_DIALECT_CURRENT) {
        encode(&c->setup, C10D_STORE_VALIDATE, C10D_STORE_MAGIC, 0, 0, NULL);
    }
    /* Every pattern's setup publishes the connection's key and checks it: one
     * round trip that also proves the connection works before timing starts. */
    snprintf(key, sizeof key, "/bench/%s/%d", pattern_names[opt.pattern], c->idx);
    kv[0] = str_of(key);
    kv[1] = (struct c10d__wire_str){(const uint8_t *)value, vlen};
    encode(&c->setup, C10D_STORE_SET, 0, 0, 2, kv);
    encode(&c->setup, C10D_STORE_CHECK, 0, 0, 1, kv);
    switch (opt.pattern) {
    case PAT_SET: /* SET has no reply: a pipelined CHECK acknowledges it */
        encode(&c->own, C10D_STORE_SET, 0, 0, 2, kv);
        encode(&c->own, C10D_STORE_CHECK, 0, 0, 1, kv);
        break;
    case PAT_GET:
        encode(&c->own, C10D_STORE_GET, 0, 0, 1, kv);
        break;
    case PAT_ADD:
        break; /* op_add_buf */
    case PAT_WAIT:
        encode(&c->own, C10D_STORE_WAIT, 0, 0, 1, kv);
        break;
    case PAT_SETWAIT:
        encode(&c->own, C10D_STORE_SET, 0, 0, 2, kv);
        encode(&c->own, C10D_STORE_WAIT, 0, 0, 1, kv);
        break;
    }
}

static void ops_send(struct conn *c)
{
    static const int shapes[] = {SH_U8, SH_STR, SH_I64, SH_U8, SH_U8};
    if (opt.pattern == PAT_ADD)
        conn_send(c, op_add_buf.data, op_add_buf.len, NULL, 0, SH_I64, 0, -1);
    else
        conn_send(c, c->own.data, c->own.len, NULL, 0, shapes[opt.pattern], 1, -1);
}

static void ops_on_open(struct conn *c)
{
    c->phase = 0;
    conn_send(c, c->setup.data, c->setup.len, NULL, 0, SH_U8, 0, -1);
}

static void ops_on_reply(struct conn *c)
{
    uint64_t t = c->busy ? now_ns() : 0;
    c->busy = 0;
    if (c->phase == 0) {
        if (c->dec.ival != C10D_STORE_READY) {
            proto_errors++;
            conn_dead(c, "setup CHECK answered NOT_READY");
            return;
        }
        c->phase = 1;
    } else {
        ops_all++;
        if (c->dec.bad)
            bad_values += c->dec.bad;
        if (win_start && c->sent_at >= win_start && t <= win_end) {
            ops_done++;
            if (nlat == caplat) {
                caplat = caplat ? caplat * 2 : 1 << 16;
                lat = realloc(lat, caplat * sizeof *lat);
                if (!lat)
                    die("out of memory");
            }
            lat[nlat++] = t - c->sent_at;
        }
    }
    if (t && win_end && t >= win_end) {
        c->state = C_DONE;
        return;
    }
    ops_send(c);
}

/* rdzv mode */
enum rphase { R_PING, R_INIT, R_BARRIER_ADD, R_BARRIER_WAIT, R_WAIT_ALL, R_READ, R_DONE };
static const char *const rphase_names[] = {"ping",     "init", "barrier", "barrier",
                                           "wait-all", "read", "done"};
static struct c10d__wire_buf init_buf, barrier_buf, wait_last_buf, wait_all_buf, mget_buf;
static struct c10d__wire_buf barrier2_buf, wait_last2_buf;
static uint64_t *phase_done_at; /* per phase: when the last rank passed it */
static int *phase_count;
static int ranks_done;

static void rdzv_prepare(void)
{
    int n = nconns;
    struct c10d__wire_str k = str_of("init/");
    encode(&init_buf, C10D_STORE_ADD, 0, 1, 1, &k);
    k = str_of("/rdzv/barrier");
    if (opt.barrier_cmd)
        encode(&barrier_buf, C10D_STORE_BARRIER, 0, n, 1, &k);
    else
        encode(&barrier_buf, C10D_STORE_ADD, 0, 1, 1, &k);
    k = str_of("/rdzv/barrier/last_worker");
    encode(&wait_last_buf, C10D_STORE_WAIT, 0, 0, 1, &k);
    k = str_of("/rdzv/barrier2");
    if (opt.barrier_cmd)
        encode(&barrier2_buf, C10D_STORE_BARRIER, 0, n, 1, &k);
    else
        encode(&barrier2_buf, C10D_STORE_ADD, 0, 1, 1, &k);
    k = str_of("/rdzv/barrier2/last_worker");
    encode(&wait_last2_buf, C10D_STORE_WAIT, 0, 0, 1, &k);
    /* Every rank waits for and reads the same N keys: encode them once. */
    char *names = malloc((size_t)n * 24);
    struct c10d__wire_str *keys = malloc((size_t)n * sizeof *keys);
    if (!names || !keys)
        die("out of memory");
    for (int i = 0; i < n; i++) {
        int len = snprintf(names + (size_t)i * 24, 24, "/rdzv/addr/%d", i);
        keys[i] = (struct c10d__wire_str){(const uint8_t *)names + (size_t)i * 24, (size_t)len};
    }
    encode(&wait_all_buf, C10D_STORE_WAIT, 0, 0, (size_t)n, keys);
    if (opt.read_multiget)
        encode(&mget_buf, C10D_STORE_MULTI_GET, 0, 0, (size_t)n, keys);
    free(keys);
    free(names);
    values = malloc((size_t)n * opt.value_bytes);
    if (!values)
        die("out of memory");
    for (int i = 0; i < n; i++)
        make_value(values + (size_t)i * opt.value_bytes, opt.value_bytes, i);
}

static void rdzv_enter(struct conn *c, int phase)
{
    c->phase = phase;
    if (phase > R_PING) {
        /* The phase before this one is complete for this rank. */
        int prev = phase - 1;
        if (++phase_count[prev] == nconns)
            phase_done_at[prev] = now_ns();
    }
}

static void rdzv_send_get(struct conn *c)
{
    char key[32];
    snprintf(key, sizeof key, "/rdzv/addr/%d", c->next_get);
    struct c10d__wire_str k = str_of(key);
    c->own.len = 0;
    encode(&c->own, C10D_STORE_GET, 0, 0, 1, &k);
    conn_send(c, c->own.data, c->own.len, NULL, 0, SH_STR, 1, c->next_get);
}

static void rdzv_on_open(struct conn *c)
{
    c->own.len = 0;
    if (opt.dialect == C10D_STORE_DIALECT_CURRENT) {
        /* What our client and PyTorch >= 2.5 do after connecting. */
        encode(&c->own, C10D_STORE_VALIDATE, C10D_STORE_MAGIC, 0, 0, NULL);
        encode(&c->own, C10D_STORE_PING, (uint32_t)c->idx, 0, 0, NULL);
        rdzv_enter(c, R_PING);
        conn_send(c, c->own.data, c->own.len, NULL, 0, SH_U32, 0, -1);
        return;
    }
    rdzv_enter(c, R_PING);
    rdzv_enter(c, R_INIT);
    conn_send(c, init_buf.data, init_buf.len, NULL, 0, SH_I64, 0, -1);
}

static void rdzv_on_reply(struct conn *c)
{
    struct rdec *d = &c->dec;
    c->busy = 0;
    switch (c->phase) {
    case R_PING:
        if ((uint32_t)d->ival != (uint32_t)c->idx) {
            proto_errors++;
            conn_dead(c, "PING answered with a different nonce");
            return;
        }
        rdzv_enter(c, R_INIT);
        conn_send(c, init_buf.data, init_buf.len, NULL, 0, SH_I64, 0, -1);
        return;
    case R_INIT:
        rdzv_enter(c, R_BARRIER_ADD);
        conn_send(c, barrier_buf.data, barrier_buf.len, NULL, 0, opt.barrier_cmd ? SH_U8 : SH_I64,
                  0, -1);
        return;
    case R_BARRIER_ADD:
        if (opt.barrier_cmd) {
            rdzv_enter(c, R_BARRIER_WAIT);
            rdzv_on_reply(c); /* BARRIER's reply is the end of the barrier */
            return;
        }
        rdzv_enter(c, R_BARRIER_WAIT);
        c->own.len = 0;
        if (d->ival == nconns) {
            /* The last arrival releases everyone (PyTorch's store barrier). */
            struct c10d__wire_str kv[2] = {str_of("/rdzv/barrier/last_worker"), str_of("1")};
            encode(&c->own, C10D_STORE_SET, 0, 0, 2, kv);
        }
        conn_send(c, c->own.data, c->own.len, wait_last_buf.data, wait_last_buf.len, SH_U8, 0, -1);
        return;
    case R_BARRIER_WAIT: {
        /* Publish the address, then wait until every rank has published. */
        rdzv_enter(c, R_WAIT_ALL);
        char key[32];
        snprintf(key, sizeof key, "/rdzv/addr/%d", c->idx);
        struct c10d__wire_str kv[2] = {
            str_of(key),
            {(const uint8_t *)values + (size_t)c->idx * opt.value_bytes, opt.value_bytes}};
        c->own.len = 0;
        encode(&c->own, C10D_STORE_SET, 0, 0, 2, kv);
        c->sub = 0;
        if (opt.read_lazy) {
            /* A lazy tcp rank: rank 0's address at creation, a peer's on first
             * use (a ring: the next and previous ranks), each GET preceded by
             * the WAIT the client sends for it. */
            int cand[3] = {0, (c->idx + 1) % nconns, (c->idx + nconns - 1) % nconns};
            c->nlazy = 0;
            for (int i = 0; i < 3; i++) {
                int dup = cand[i] == c->idx;
                for (int j = 0; j < c->nlazy; j++)
                    dup |= c->lazy_targets[j] == cand[i];
                if (!dup)
                    c->lazy_targets[c->nlazy++] = cand[i];
            }
            c->lazy_i = 0;
            if (c->nlazy == 0) {
                rdzv_enter(c, R_READ);
                c->next_get = -1;
                rdzv_on_reply(c);
                return;
            }
            char wk[32];
            snprintf(wk, sizeof wk, "/rdzv/addr/%d", c->lazy_targets[0]);
            struct c10d__wire_str w = str_of(wk);
            encode(&c->own, C10D_STORE_WAIT, 0, 0, 1, &w);
            conn_send(c, c->own.data, c->own.len, NULL, 0, SH_U8, 0, -1);
            return;
        }
        if (!opt.sync_barrier)
            conn_send(c, c->own.data, c->own.len, wait_all_buf.data, wait_all_buf.len, SH_U8, 0,
                      -1);
        else
            conn_send(c, c->own.data, c->own.len, barrier2_buf.data, barrier2_buf.len,
                      opt.barrier_cmd ? SH_U8 : SH_I64, 0, -1);
        return;
    }
    case R_WAIT_ALL:
        if (opt.read_lazy) {
            if (c->lazy_i == 0)
                rdzv_enter(c, R_READ); /* phases count each rank once */
            else
                c->phase = R_READ;
            c->next_get = c->lazy_targets[c->lazy_i];
            rdzv_send_get(c);
            return;
        }
        if (opt.sync_barrier && !opt.barrier_cmd && c->sub == 0) {
            c->sub = 1;
            c->own.len = 0;
            if (d->ival == nconns) {
                struct c10d__wire_str kv[2] = {str_of("/rdzv/barrier2/last_worker"), str_of("1")};
                encode(&c->own, C10D_STORE_SET, 0, 0, 2, kv);
            }
            conn_send(c, c->own.data, c->own.len, wait_last2_buf.data, wait_last2_buf.len, SH_U8, 0,
                      -1);
            return;
        }
        rdzv_enter(c, R_READ);
        if (opt.read_multiget) {
            conn_send(c, mget_buf.data, mget_buf.len, NULL, 0, SH_NSTR, (uint64_t)nconns, 0);
        } else {
            c->next_get = 0;
            rdzv_send_get(c);
        }
        return;
    case R_READ:
        if (c->next_get >= 0)
            bad_values += d->bad;
        if (opt.read_lazy && ++c->lazy_i < c->nlazy) {
            /* The next peer: its WAIT, then (R_WAIT_ALL's reply) its GET. */
            c->phase = R_WAIT_ALL;
            char wk[32];
            snprintf(wk, sizeof wk, "/rdzv/addr/%d", c->lazy_targets[c->lazy_i]);
            struct c10d__wire_str w = str_of(wk);
            c->own.len = 0;
            encode(&c->own, C10D_STORE_WAIT, 0, 0, 1, &w);
            conn_send(c, c->own.data, c->own.len, NULL, 0, SH_U8, 0, -1);
            return;
        }
        if (!opt.read_lazy && !opt.read_multiget && ++c->next_get < nconns) {
            rdzv_send_get(c);
            return;
        }
        rdzv_enter(c, R_DONE);
        c->state = C_DONE;
        ranks_done++;
        conn_close(c); /* a finished rank goes away, as a real one would */
        connected_count--;
        return;
    }
}

/* groups mode: what every rank of a job sends to the store for each
 * c10d_pg_new_group of the whole world, G groups back to back (no barrier
 * between them, as ranks of a real job run ahead of each other).
 *
 * --check hash (the member check now): rank 0 SETs the member list and its
 * hash and ADDs a read receipt; every other rank GETs the hash (the client
 * sends WAIT, then GET) and ADDs the receipt; whoever reads last deletes the
 * three keys. --check lists (before): every rank SETs its list, WAITs for
 * and MULTI_GETs all N lists, then a store barrier (ADD, WAIT last_worker).
 * Then the new group's tcp rendezvous (--read): each rank SETs its address;
 * lazy: WAIT + GET of rank 0's; multiget: WAIT for and MULTI_GET all N;
 * none: nothing. */
enum gstep {
    GS_HASH_WAIT,
    GS_HASH_GET,
    GS_SEEN,
    GS_DELETE, /* sub counts the three deletes */
    GS_LISTS_WAIT,
    GS_LISTS_READ,
    GS_BAR_ADD,
    GS_BAR_WAIT,
    GS_ADDR_WAIT,
    GS_ADDR_READ,
};
static char *member_list; /* "0,1,...,N-1": what a world group's ranks write */
static struct c10d__wire_buf *lists_wait_bufs, *lists_mget_bufs; /* per group (--check lists) */
static struct c10d__wire_buf *addr_wait_bufs, *addr_mget_bufs;   /* per group (--read multiget) */
static int *group_count;                                         /* ranks done with each group */
static uint64_t *group_done_at; /* when the last rank finished each group */
static int groups_ranks_done;

static void groups_encode_all(struct c10d__wire_buf *wait, struct c10d__wire_buf *mget, int g,
                              const char *what)
{
    int n = nconns;
    char *names = malloc((size_t)n * 40);
    struct c10d__wire_str *keys = malloc((size_t)n * sizeof *keys);
    if (!names || !keys)
        die("out of memory");
    for (int i = 0; i < n; i++) {
        int len = snprintf(names + (size_t)i * 40, 40, "pg%d/%s/%d", g, what, i);
        keys[i] = (struct c10d__wire_str){(const uint8_t *)names + (size_t)i * 40, (size_t)len};
    }
    encode(wait, C10D_STORE_WAIT, 0, 0, (size_t)n, keys);
    encode(mget, C10D_STORE_MULTI_GET, 0, 0, (size_t)n, keys);
    free(keys);
    free(names);
}

static void groups_prepare(void)
{
    int n = nconns, g = opt.groups;
    member_list = malloc((size_t)n * 8 + 1);
    values = malloc((size_t)n * opt.value_bytes);
    group_count = calloc((size_t)g, sizeof *group_count);
    group_done_at = calloc((size_t)g, sizeof *group_done_at);
    lists_wait_bufs = calloc((size_t)g, sizeof *lists_wait_bufs);
    lists_mget_bufs = calloc((size_t)g, sizeof *lists_mget_bufs);
    addr_wait_bufs = calloc((size_t)g, sizeof *addr_wait_bufs);
    addr_mget_bufs = calloc((size_t)g, sizeof *addr_mget_bufs);
    if (!member_list || !values || !group_count || !group_done_at || !lists_wait_bufs ||
        !lists_mget_bufs || !addr_wait_bufs || !addr_mget_bufs)
        die("out of memory");
    size_t off = 0;
    for (int i = 0; i < n; i++)
        off += (size_t)sprintf(member_list + off, i ? ",%d" : "%d", i);
    for (int i = 0; i < n; i++)
        make_value(values + (size_t)i * opt.value_bytes, opt.value_bytes, i);
    for (int i = 0; i < g; i++) {
        if (opt.check_lists)
            groups_encode_all(&lists_wait_bufs[i], &lists_mget_bufs[i], i, "list");
        if (opt.read_multiget)
            groups_encode_all(&addr_wait_bufs[i], &addr_mget_bufs[i], i, "addr");
    }
}

/* Encodes a one-key command for group g's key `what` into c->own. */
static void groups_encode_key(struct conn *c, int cmd, int64_t i64, const char *what,
                              const void *value, size_t len)
{
    char key[48];
    snprintf(key, sizeof key, "pg%d/%s", c->group, what);
    struct c10d__wire_str kv[2] = {str_of(key), {(const uint8_t *)value, len}};
    encode(&c->own, cmd, 0, i64, value ? 2 : 1, kv);
}

static void groups_begin(struct conn *c)
{
    c->own.len = 0;
    if (opt.check_lists) {
        char key[32];
        snprintf(key, sizeof key, "list/%d", c->idx);
        groups_encode_key(c, C10D_STORE_SET, 0, key, member_list, strlen(member_list));
        c->step = GS_LISTS_WAIT;
        conn_send(c, c->own.data, c->own.len, lists_wait_bufs[c->group].data,
                  lists_wait_bufs[c->group].len, SH_U8, 0, -1);
    } else if (c->idx == 0) {
        groups_encode_key(c, C10D_STORE_SET, 0, "list", member_list, strlen(member_list));
        groups_encode_key(c, C10D_STORE_SET, 0, "hash", "0123456789abcdef", 16);
        groups_encode_key(c, C10D_STORE_ADD, 1, "seen", NULL, 0);
        c->step = GS_SEEN;
        conn_send(c, c->own.data, c->own.len, NULL, 0, SH_I64, 0, -1);
    } else {
        groups_encode_key(c, C10D_STORE_WAIT, 0, "hash", NULL, 0);
        c->step = GS_HASH_WAIT;
        conn_send(c, c->own.data, c->own.len, NULL, 0, SH_U8, 0, -1);
    }
}

/* The member check is over: the new group's rendezvous. */
static void groups_rendezvous(struct conn *c)
{
    c->own.len = 0;
    char key[32];
    snprintf(key, sizeof key, "addr/%d", c->idx);
    groups_encode_key(c, C10D_STORE_SET, 0, key, values + (size_t)c->idx * opt.value_bytes,
                      opt.value_bytes);
    c->step = GS_ADDR_WAIT;
    if (opt.read_multiget) {
        conn_send(c, c->own.data, c->own.len, addr_wait_bufs[c->group].data,
                  addr_wait_bufs[c->group].len, SH_U8, 0, -1);
    } else if (opt.read_lazy) {
        groups_encode_key(c, C10D_STORE_WAIT, 0, "addr/0", NULL, 0);
        conn_send(c, c->own.data, c->own.len, NULL, 0, SH_U8, 0, -1);
    } else {
        /* SET has no reply: a CHECK of the key rides along for one. */
        groups_encode_key(c, C10D_STORE_CHECK, 0, key, NULL, 0);
        conn_send(c, c->own.data, c->own.len, NULL, 0, SH_U8, 0, -1);
        c->step = GS_ADDR_READ;
    }
}

static void groups_next_group(struct conn *c)
{
    if (++group_count[c->group] == nconns)
        group_done_at[c->group] = now_ns();
    if (++c->group < opt.groups) {
        groups_begin(c);
        return;
    }
    c->state = C_DONE;
    groups_ranks_done++;
    conn_close(c);
    connected_count--;
}

static void groups_on_delete(struct conn *c)
{
    static const char *const gone[] = {"hash", "list", "seen"};
    if (c->sub == 3) {
        groups_rendezvous(c);
        return;
    }
    groups_encode_key(c, C10D_STORE_DELETE_KEY, 0, gone[c->sub++], NULL, 0);
    conn_send(c, c->own.data, c->own.len, NULL, 0, SH_I64, 0, -1);
}

static void groups_on_reply(struct conn *c)
{
    struct rdec *d = &c->dec;
    c->busy = 0;
    c->own.len = 0;
    if (c->step < 0) { /* VALIDATE + PING answered */
        groups_begin(c);
        return;
    }
    switch (c->step) {
    case GS_HASH_WAIT:
        c->step = GS_HASH_GET;
        groups_encode_key(c, C10D_STORE_GET, 0, "hash", NULL, 0);
        conn_send(c, c->own.data, c->own.len, NULL, 0, SH_STR, 1, NO_CHECK);
        return;
    case GS_HASH_GET:
        if (d->cur_len != 16)
            bad_values++;
        c->step = GS_SEEN;
        groups_encode_key(c, C10D_STORE_ADD, 1, "seen", NULL, 0);
        conn_send(c, c->own.data, c->own.len, NULL, 0, SH_I64, 0, -1);
        return;
    case GS_SEEN:
        if (d->ival != nconns) {
            groups_rendezvous(c);
            return;
        }
        /* The last reader deletes hash, list and seen. */
        c->step = GS_DELETE;
        c->sub = 0;
        groups_on_delete(c);
        return;
    case GS_DELETE:
        groups_on_delete(c);
        return;
    case GS_LISTS_WAIT:
        c->step = GS_LISTS_READ;
        conn_send(c, lists_mget_bufs[c->group].data, lists_mget_bufs[c->group].len, NULL, 0,
                  SH_NSTR, (uint64_t)nconns, NO_CHECK);
        return;
    case GS_LISTS_READ:
        c->step = GS_BAR_ADD;
        groups_encode_key(c, C10D_STORE_ADD, 1, "barrier", NULL, 0);
        conn_send(c, c->own.data, c->own.len, NULL, 0, SH_I64, 0, -1);
        return;
    case GS_BAR_ADD:
        c->step = GS_BAR_WAIT;
        if (d->ival == nconns)
            groups_encode_key(c, C10D_STORE_SET, 0, "barrier/last_worker", "1", 1);
        groups_encode_key(c, C10D_STORE_WAIT, 0, "barrier/last_worker", NULL, 0);
        conn_send(c, c->own.data, c->own.len, NULL, 0, SH_U8, 0, -1);
        return;
    case GS_BAR_WAIT:
        groups_rendezvous(c);
        return;
    case GS_ADDR_WAIT:
        c->step = GS_ADDR_READ;
        if (opt.read_multiget) {
            conn_send(c, addr_mget_bufs[c->group].data, addr_mget_bufs[c->group].len, NULL, 0,
                      SH_NSTR, (uint64_t)nconns, 0);
        } else {
            groups_encode_key(c, C10D_STORE_GET, 0, "addr/0", NULL, 0);
            conn_send(c, c->own.data, c->own.len, NULL, 0, SH_STR, 1, 0);
        }
        return;
    case GS_ADDR_READ:
        bad_values += d->bad;
        groups_next_group(c);
        return;
    }
}

static void groups_on_open(struct conn *c)
{
    c->own.len = 0;
    c->group = 0;
    if (opt.dialect == C10D_STORE_DIALECT_CURRENT) {
        encode(&c->own, C10D_STORE_VALIDATE, C10D_STORE_MAGIC, 0, 0, NULL);
        encode(&c->own, C10D_STORE_PING, (uint32_t)c->idx, 0, 0, NULL);
        c->step = -1;
        conn_send(c, c->own.data, c->own.len, NULL, 0, SH_U32, 0, -1);
        return;
    }
    groups_begin(c);
}

/* ------------------------------------------------------------ the probe */

/* One more client, on a thread of its own with a blocking socket so the
 * generator's busy loop does not delay it: a PING every probe_ms, each
 * answer's time kept. */
static atomic_int probe_stop;
static uint64_t *probe_lat;
static size_t probe_n, probe_cap;
static uint64_t probe_worst, probe_worst_at; /* the slowest answer, and when it was asked */
static int probe_failed;

static void *probe_main(void *arg)
{
    (void)arg;
    int fd = socket(target->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (fd < 0 || connect(fd, target->ai_addr, target->ai_addrlen) != 0) {
        probe_failed = 1;
        if (fd >= 0)
            close(fd);
        return NULL;
    }
    struct c10d__wire_buf b = {0};
    if (opt.dialect == C10D_STORE_DIALECT_CURRENT)
        encode(&b, C10D_STORE_VALIDATE, C10D_STORE_MAGIC, 0, 0, NULL);
    size_t validate_len = b.len;
    for (uint32_t nonce = 1; !atomic_load(&probe_stop); nonce++) {
        size_t from = nonce == 1 ? 0 : validate_len;
        b.len = validate_len;
        if (opt.dialect == C10D_STORE_DIALECT_CURRENT)
            encode(&b, C10D_STORE_PING, nonce, 0, 0, NULL);
        else
            encode(&b, C10D_STORE_GETNUMKEYS, 0, 0, 0, NULL);
        uint64_t t0 = now_ns();
        size_t want = opt.dialect == C10D_STORE_DIALECT_CURRENT ? 4 : 8;
        uint8_t reply[8];
        size_t got = 0;
        if (write(fd, b.data + from, b.len - from) != (ssize_t)(b.len - from))
            probe_failed = 1;
        while (!probe_failed && got < want) {
            ssize_t r = read(fd, reply + got, want - got);
            if (r <= 0)
                probe_failed = 1;
            else
                got += (size_t)r;
        }
        if (probe_failed)
            break;
        if (probe_n == probe_cap) {
            probe_cap = probe_cap ? probe_cap * 2 : 1024;
            probe_lat = realloc(probe_lat, probe_cap * sizeof *probe_lat);
            if (!probe_lat)
                die("out of memory");
        }
        probe_lat[probe_n++] = now_ns() - t0;
        if (probe_lat[probe_n - 1] > probe_worst) {
            probe_worst = probe_lat[probe_n - 1];
            probe_worst_at = t0 - t_start;
        }
        usleep((useconds_t)opt.probe_ms * 1000);
    }
    c10d__wire_buf_free(&b);
    close(fd);
    return NULL;
}

/* idle mode: one round trip each, so the server has set the connection up */
static void idle_on_open(struct conn *c)
{
    c->own.len = 0;
    if (opt.dialect == C10D_STORE_DIALECT_CURRENT) {
        encode(&c->own, C10D_STORE_VALIDATE, C10D_STORE_MAGIC, 0, 0, NULL);
        encode(&c->own, C10D_STORE_PING, 7, 0, 0, NULL);
        conn_send(c, c->own.data, c->own.len, NULL, 0, SH_U32, 0, -1);
    } else {
        encode(&c->own, C10D_STORE_GETNUMKEYS, 0, 0, 0, NULL);
        conn_send(c, c->own.data, c->own.len, NULL, 0, SH_I64, 0, -1);
    }
}

static int idle_ready;

static void on_open(struct conn *c)
{
    if (opt.mode == MODE_OPS)
        ops_on_open(c);
    else if (opt.mode == MODE_RDZV)
        rdzv_on_open(c);
    else if (opt.mode == MODE_GROUPS)
        groups_on_open(c);
    else
        idle_on_open(c);
}

static void on_reply(struct conn *c)
{
    if (opt.mode == MODE_OPS) {
        ops_on_reply(c);
    } else if (opt.mode == MODE_RDZV) {
        rdzv_on_reply(c);
    } else if (opt.mode == MODE_GROUPS) {
        groups_on_reply(c);
    } else {
        c->busy = 0;
        idle_ready++;
    }
}

/* ------------------------------------------------------------ event loop */

static uint8_t rbuf[256 * 1024];

static void on_event(struct conn *c, uint32_t ev)
{
    if (c->state == C_CONNECTING) {
        if (!(ev & (EPOLLOUT | EPOLLERR | EPOLLHUP)))
            return;
        int err = 0;
        socklen_t len = sizeof err;
        getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err || (ev & (EPOLLERR | EPOLLHUP))) {
            conn_backoff(c, err ? err : ECONNRESET);
            return;
        }
        connecting_now--;
        connected_count++;
        c->state = C_OPEN;
        set_out(c, 0);
        on_open(c);
        return;
    }
    if (c->state != C_OPEN)
        return;
    if (ev & EPOLLOUT)
        conn_flush(c);
    if (c->state != C_OPEN || !(ev & (EPOLLIN | EPOLLERR | EPOLLHUP)))
        return;
    ssize_t r = read(c->fd, rbuf, sizeof rbuf);
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
        conn_resets++;
        conn_dead(c, r == 0 ? "server closed the connection" : strerror(errno));
        return;
    }
    if (r < 0)
        return;
    size_t off = 0;
    while (off < (size_t)r && c->state == C_OPEN) {
        if (!c->busy) {
            proto_errors++;
            conn_dead(c, "bytes arrived with no request outstanding");
            return;
        }
        off += rdec_feed(&c->dec, rbuf + off, (size_t)r - off);
        if (c->dec.done)
            on_reply(c);
    }
}

static int finished(void)
{
    switch (opt.mode) {
    case MODE_OPS:
        return measuring_done;
    case MODE_RDZV:
        return ranks_done + (int)conns_dead >= nconns;
    case MODE_GROUPS:
        return groups_ranks_done + (int)conns_dead >= nconns;
    default:
        return idle_ready + (int)conns_dead >= nconns;
    }
}

static void run_loop(void)
{
    struct epoll_event evs[512];
    while (!finished()) {
        uint64_t t = now_ns();
        if (t >= deadline)
            return;
        if (opt.mode == MODE_OPS) {
            /* The window opens once every connection is set up (or given up). */
            if (!win_start) {
                int ready = 0;
                for (int i = 0; i < nconns; i++)
                    ready += conns[i].state == C_OPEN && conns[i].phase == 1;
                if (ready + (int)conns_dead >= nconns) {
                    win_start = t + (uint64_t)(opt.warmup_s * 1e9);
                    win_end = win_start + (uint64_t)(opt.duration_s * 1e9);
                }
            } else if (cpu_sampled == 0 && t >= win_start) {
                sample_cpu();
            } else if (cpu_sampled == 1 && t >= win_end) {
                sample_cpu();
            } else if (t >= win_end + 200000000u) {
                /* Replies still outstanding 200 ms after the window are
                 * waits that never end or a server that stalled: stop. */
                measuring_done = 1;
                return;
            } else if (t >= win_end) {
                int open = 0;
                for (int i = 0; i < nconns; i++)
                    open += conns[i].state == C_OPEN;
                if (!open)
                    measuring_done = 1;
            }
        }
        if (connect_cursor < nconns || connects_failed_tries)
            pump_connects();
        int n = epoll_wait(epfd, evs, 512, 5);
        for (int i = 0; i < n; i++)
            on_event(evs[i].data.ptr, evs[i].events);
    }
}

/* ----------------------------------------------------------------- main */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: store_loadgen --port P [options]\n"
            "  --host H              server address (default 127.0.0.1)\n"
            "  --port P              server port (required)\n"
            "  --dialect D           legacy (PyTorch 1.13, default) | current (PyTorch >= 2.5)\n"
            "  --mode M              ops (default) | rdzv | groups | idle\n"
            "  --label L             copied into the RESULT line\n"
            "  --timeout S           give up after S seconds (default 60)\n"
            "  --server-pid PID      report the server's CPU use (ops) / RSS (idle)\n"
            "  --value-bytes B       value size (default 64)\n"
            "  --connect-concurrency C  connects in flight at once (default: ops/idle 64,\n"
            "                        rdzv 0 = all at once, like ranks starting together)\n"
            " ops:  --pattern set|get|add|wait|setwait  --conns K  --duration S (3)  --warmup S "
            "(0.5)\n"
            "       set = SET + pipelined CHECK (SET has no reply); get = GET; add = ADD on one\n"
            "       shared counter; wait = WAIT on a key that exists; setwait = SET then WAIT\n"
            " rdzv: --ranks N  --barrier add|cmd  --read multiget|get|lazy  --sync wait|barrier\n"
            "       connect, [VALIDATE+PING], ADD init/, barrier (ADD + WAIT last_worker, or\n"
            "       BARRIER), SET a value, then WAIT on all N values (--sync wait) or a\n"
            "       second barrier (--sync barrier), read all (MULTI_GET or N GETs)\n"
            " groups: --ranks N  --groups G (100)  --check hash|lists  --read lazy|multiget|none\n"
            "       G world groups back to back: the member check (hash: rank 0 publishes the\n"
            "       list's hash, the others read it; lists: everyone reads every list, then a\n"
            "       barrier), then the group's tcp rendezvous (SET the address; lazy: read\n"
            "       rank 0's; multiget: read all N)\n"
            " rdzv, groups: --probe-ms M  a PING every M ms on a thread of its own; reports\n"
            "       the slowest answer\n"
            " idle: --conns N --server-pid PID: server RSS before/after N idle connections\n");
}

static double parse_num(const char *name, const char *s, double lo, double hi)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || v < lo || v > hi)
        die("bad value '%s' for --%s (expected a number in [%g, %g])", s, name, lo, hi);
    return v;
}

static void parse_args(int argc, char **argv)
{
    static const struct option lo[] = {
        {"host", required_argument, NULL, 'h'},
        {"port", required_argument, NULL, 'p'},
        {"dialect", required_argument, NULL, 'd'},
        {"mode", required_argument, NULL, 'm'},
        {"pattern", required_argument, NULL, 't'},
        {"conns", required_argument, NULL, 'k'},
        {"ranks", required_argument, NULL, 'n'},
        {"duration", required_argument, NULL, 'D'},
        {"warmup", required_argument, NULL, 'W'},
        {"timeout", required_argument, NULL, 'T'},
        {"connect-concurrency", required_argument, NULL, 'C'},
        {"server-pid", required_argument, NULL, 'P'},
        {"value-bytes", required_argument, NULL, 'V'},
        {"barrier", required_argument, NULL, 'B'},
        {"read", required_argument, NULL, 'R'},
        {"label", required_argument, NULL, 'L'},
        {"sync", required_argument, NULL, 'S'},
        {"groups", required_argument, NULL, 'G'},
        {"check", required_argument, NULL, 'K'},
        {"probe-ms", required_argument, NULL, 'Q'},
        {"help", no_argument, NULL, '?' + 256},
        {NULL, 0, NULL, 0},
    };
    int o, read_none = 0;
    while ((o = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (o) {
        case 'h':
            opt.host = optarg;
            break;
        case 'p':
            opt.port = optarg;
            break;
        case 'd':
            if (!strcmp(optarg, "legacy"))
                opt.dialect = C10D_STORE_DIALECT_LEGACY;
            else if (!strcmp(optarg, "current"))
                opt.dialect = C10D_STORE_DIALECT_CURRENT;
            else
                die("bad --dialect '%s' (legacy or current)", optarg);
            break;
        case 'm':
            if (!strcmp(optarg, "ops"))
                opt.mode = MODE_OPS;
            else if (!strcmp(optarg, "rdzv"))
                opt.mode = MODE_RDZV;
            else if (!strcmp(optarg, "groups"))
                opt.mode = MODE_GROUPS;
            else if (!strcmp(optarg, "idle"))
                opt.mode = MODE_IDLE;
            else
                die("bad --mode '%s' (ops, rdzv, groups or idle)", optarg);
            break;
        case 't': {
            int found = -1;
            for (int i = 0; i < (int)(sizeof pattern_names / sizeof *pattern_names); i++)
                if (!strcmp(optarg, pattern_names[i]))
                    found = i;
            if (found < 0)
                die("bad --pattern '%s' (set, get, add, wait or setwait)", optarg);
            opt.pattern = found;
            break;
        }
        case 'k':
        case 'n':
            opt.conns = (int)parse_num(o == 'k' ? "conns" : "ranks", optarg, 1, 1000000);
            break;
        case 'D':
            opt.duration_s = parse_num("duration", optarg, 0.01, 3600);
            break;
        case 'W':
            opt.warmup_s = parse_num("warmup", optarg, 0, 3600);
            break;
        case 'T':
            opt.timeout_s = parse_num("timeout", optarg, 0.1, 86400);
            break;
        case 'C':
            opt.connect_concurrency = (int)parse_num("connect-concurrency", optarg, 0, 1000000);
            break;
        case 'P':
            opt.server_pid = (int)parse_num("server-pid", optarg, 1, 1 << 30);
            break;
        case 'V':
            opt.value_bytes = (size_t)parse_num("value-bytes", optarg, 16, 4096);
            break;
        case 'B':
            if (strcmp(optarg, "add") && strcmp(optarg, "cmd"))
                die("bad --barrier '%s' (add or cmd)", optarg);
            opt.barrier_cmd = !strcmp(optarg, "cmd");
            break;
        case 'R':
            if (strcmp(optarg, "multiget") && strcmp(optarg, "get") && strcmp(optarg, "lazy") &&
                strcmp(optarg, "none"))
                die("bad --read '%s' (multiget, get, lazy or none)", optarg);
            opt.read_multiget = !strcmp(optarg, "multiget");
            opt.read_lazy = !strcmp(optarg, "lazy");
            read_none = !strcmp(optarg, "none");
            break;
        case 'G':
            opt.groups = (int)parse_num("groups", optarg, 1, 100000);
            break;
        case 'K':
            if (strcmp(optarg, "hash") && strcmp(optarg, "lists"))
                die("bad --check '%s' (hash or lists)", optarg);
            opt.check_lists = !strcmp(optarg, "lists");
            break;
        case 'Q':
            opt.probe_ms = (int)parse_num("probe-ms", optarg, 1, 60000);
            break;
        case 'L':
            opt.label = optarg;
            break;
        case 'S':
            if (strcmp(optarg, "wait") && strcmp(optarg, "barrier"))
                die("bad --sync '%s' (wait or barrier)", optarg);
            opt.sync_barrier = !strcmp(optarg, "barrier");
            break;
        case '?' + 256:
            usage(stdout);
            exit(0);
        default:
            usage(stderr);
            exit(2);
        }
    }
    if (optind < argc)
        die("unexpected argument '%s'", argv[optind]);
    if (!opt.port)
        die("--port is required (see --help)");
    if (opt.mode == MODE_IDLE && !opt.server_pid)
        die("--mode idle needs --server-pid");
    if (opt.mode == MODE_GROUPS && opt.read_multiget < 0) {
        opt.read_lazy = 1; /* what a group of more than 1024 ranks does by default */
        opt.read_multiget = 0;
    }
    if (opt.read_multiget < 0)
        opt.read_multiget = opt.dialect == C10D_STORE_DIALECT_CURRENT && !read_none;
    if (opt.mode == MODE_GROUPS && !opt.read_lazy && !opt.read_multiget && !read_none)
        die("--mode groups reads with lazy, multiget or none");
    if (opt.mode == MODE_GROUPS && opt.check_lists && opt.dialect != C10D_STORE_DIALECT_CURRENT)
        die("--check lists needs MULTI_GET: --dialect current");
    if (opt.dialect == C10D_STORE_DIALECT_LEGACY && (opt.read_multiget || opt.barrier_cmd))
        die("the legacy dialect has no MULTI_GET or BARRIER: use --read get --barrier add");
    if (opt.connect_concurrency < 0)
        opt.connect_concurrency = opt.mode == MODE_RDZV || opt.mode == MODE_GROUPS ? 0 : 64;
}

int main(int argc, char **argv)
{
    parse_args(argc, argv);
    srand((unsigned)getpid());
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM};
    int rc = getaddrinfo(opt.host, opt.port, &hints, &target);
    if (rc != 0)
        die("cannot resolve %s:%s: %s", opt.host, opt.port, gai_strerror(rc));
    nconns = opt.conns;
    raise_nofile(nconns);
    conns = calloc((size_t)nconns, sizeof *conns);
    if (!conns)
        die("out of memory");
    epfd = epoll_create1(EPOLL_CLOEXEC);
    for (int i = 0; i < nconns; i++) {
        conns[i].fd = -1;
        conns[i].idx = i;
    }
    const char *dialect = opt.dialect == C10D_STORE_DIALECT_LEGACY ? "legacy" : "current";
    long rss0 = opt.server_pid ? proc_rss_kib(opt.server_pid) : -1;
    if (opt.mode == MODE_OPS) {
        struct c10d__wire_str k = str_of("/bench/add");
        encode(&op_add_buf, C10D_STORE_ADD, 0, 1, 1, &k);
        for (int i = 0; i < nconns; i++)
            ops_prepare(&conns[i]);
    } else if (opt.mode == MODE_RDZV) {
        rdzv_prepare();
        phase_done_at = calloc(R_DONE + 1, sizeof *phase_done_at);
        phase_count = calloc(R_DONE + 1, sizeof *phase_count);
    } else if (opt.mode == MODE_GROUPS) {
        groups_prepare();
    }
    pthread_t probe;
    int probing = opt.probe_ms > 0 && (opt.mode == MODE_RDZV || opt.mode == MODE_GROUPS) &&
                  pthread_create(&probe, NULL, probe_main, NULL) == 0;
    srv_cpu_start = opt.server_pid ? proc_cpu_s(opt.server_pid) : 0;
    t_start = now_ns();
    deadline = t_start + (uint64_t)(opt.timeout_s * 1e9);

    run_loop();
    uint64_t t_end = now_ns();
    if (probing) {
        atomic_store(&probe_stop, 1);
        pthread_join(probe, NULL);
    }
    int done = finished();
    int ok = done && !conns_dead && !proto_errors && !bad_values && !(probing && probe_failed);
    printf("RESULT label=%s mode=%s dialect=%s status=%s", opt.label,
           opt.mode == MODE_OPS      ? "ops"
           : opt.mode == MODE_RDZV   ? "rdzv"
           : opt.mode == MODE_GROUPS ? "groups"
                                     : "idle",
           dialect,
           ok     ? "ok"
           : done ? "errors"
                  : "timeout");
    if (opt.mode == MODE_OPS) {
        double win = (double)opt.duration_s;
        if (nlat)
            qsort(lat, nlat, sizeof *lat, cmp_u64);
        printf(" pattern=%s conns=%d connected=%d ops=%" PRIu64 " ops_s=%.0f",
               pattern_names[opt.pattern], nconns, nconns - (int)conns_dead, ops_done,
               win_start ? (double)ops_done / win : 0.0);
        printf(" ops_all=%" PRIu64, ops_all);
        printf(" p50_us=%.1f p99_us=%.1f", nlat ? lat[nlat / 2] / 1e3 : 0.0,
               nlat ? lat[(size_t)((double)nlat * 0.99)] / 1e3 : 0.0);
        if (cpu_sampled == 2) {
            printf(" gen_cpu=%.2f", (gen_cpu[1] - gen_cpu[0]) / win);
            if (opt.server_pid)
                printf(" server_cpu=%.2f", (srv_cpu[1] - srv_cpu[0]) / win);
        }
    } else if (opt.mode == MODE_RDZV) {
        printf(" ranks=%d done=%d total_s=%.3f", nconns, ranks_done, (t_end - t_start) / 1e9);
        static const int shown[] = {R_INIT, R_BARRIER_WAIT, R_WAIT_ALL, R_READ};
        static const char *const names[] = {"connect_s", "init_s", "barrier_s", "publish_wait_s"};
        for (int i = 0; i < 4; i++) {
            int ph = shown[i] - 1;
            if (phase_done_at[ph])
                printf(" %s=%.3f", names[i], (phase_done_at[ph] - t_start) / 1e9);
            else
                printf(" %s=-", names[i]);
        }
        printf(" read=%s barrier=%s sync=%s",
               opt.read_lazy       ? "lazy"
               : opt.read_multiget ? "multiget"
                                   : "get",
               opt.barrier_cmd ? "cmd" : "add", opt.sync_barrier ? "barrier" : "wait");
        printf(" gen_cpu_s=%.2f", self_cpu_s());
        if (opt.server_pid)
            printf(" server_cpu_s=%.2f", proc_cpu_s(opt.server_pid) - srv_cpu_start);
        int slowest = R_DONE;
        for (int i = 0; i < nconns; i++)
            if (conns[i].phase < slowest)
                slowest = conns[i].phase;
        if (!done)
            printf(" stuck_in=%s", rphase_names[slowest]);
    } else if (opt.mode == MODE_GROUPS) {
        int whole = 0;
        for (int i = 0; i < opt.groups; i++)
            whole += group_done_at[i] != 0;
        printf(" ranks=%d groups=%d groups_done=%d total_s=%.3f ms_per_group=%.2f", nconns,
               opt.groups, whole, (t_end - t_start) / 1e9,
               whole ? (t_end - t_start) / 1e6 / whole : 0.0);
        printf(" check=%s read=%s", opt.check_lists ? "lists" : "hash",
               opt.read_lazy       ? "lazy"
               : opt.read_multiget ? "multiget"
                                   : "none");
        printf(" gen_cpu_s=%.2f", self_cpu_s());
        if (opt.server_pid)
            printf(" server_cpu_s=%.2f", proc_cpu_s(opt.server_pid) - srv_cpu_start);
    } else {
        usleep(500000); /* let the server finish what the last replies started */
        long rss1 = proc_rss_kib(opt.server_pid);
        printf(" conns=%d connected=%d rss_before_kib=%ld rss_after_kib=%ld bytes_per_conn=%.0f",
               nconns, idle_ready, rss0, rss1,
               idle_ready ? (double)(rss1 - rss0) * 1024.0 / idle_ready : 0.0);
    }
    if (probing) {
        if (probe_n)
            qsort(probe_lat, probe_n, sizeof *probe_lat, cmp_u64);
        printf(" probe_pings=%zu probe_p50_ms=%.2f probe_p99_ms=%.2f probe_max_ms=%.2f"
               " probe_max_at_s=%.3f%s",
               probe_n, probe_n ? probe_lat[probe_n / 2] / 1e6 : 0.0,
               probe_n ? probe_lat[(size_t)((double)probe_n * 0.99)] / 1e6 : 0.0,
               probe_n ? probe_lat[probe_n - 1] / 1e6 : 0.0, probe_worst_at / 1e9,
               probe_failed ? " probe_failed=1" : "");
    }
    printf(" connect_retries=%" PRIu64 " dead=%" PRIu64 " resets=%" PRIu64 " proto_errors=%" PRIu64
           " bad_values=%" PRIu64 "\n",
           connects_failed_tries, conns_dead, conn_resets, proto_errors, bad_values);
    if (first_error[0])
        fprintf(stderr, "store_loadgen: first error: %s\n", first_error);
    fflush(stdout);
    for (int i = 0; i < nconns; i++) {
        conn_close(&conns[i]);
        c10d__wire_buf_free(&conns[i].own);
        c10d__wire_buf_free(&conns[i].setup);
    }
    return ok ? 0 : 1;
}
