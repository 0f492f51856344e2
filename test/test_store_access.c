/* Who may reach the store and what an attacker on the network can lock out:
 * a client that vanishes with replies unread, the file-descriptor limit,
 * the shared-secret token (AUTH), the embedded store's bind address. Real
 * c10d-store processes ($C10D_STORE_EXE) and real sockets. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "free_port.h"
#include "store_test_util.h"
#include "c10d.h"
#include "engine/env.h"
#include "engine/loop.h"
#include "engine/token.h"

#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>

static char tmpdir[256];

/* Helpers of store_test_util.h this file does not need. */
static void *const unused_helpers[] __attribute__((unused)) = {
    (void *)store_ts_start, (void *)store_ts_stats, (void *)store_ts_stop};

/* ------------------------------------------------------- c10d-store child */

struct proc {
    pid_t pid;
    int status; /* once exited */
    int port;
    char log[300];
};

/* Starts `c10d-store serve --host 127.0.0.1 --port 0 extra...` with its
 * stderr in a log file; nofile > 0 sets soft = hard RLIMIT_NOFILE first.
 * Returns 0 once it listens. */
static int spawn_store(struct proc *p, int nofile, const char *const *extra)
{
    const char *exe = getenv("C10D_STORE_EXE");
    if (!exe)
        return -1;
    static int seq;
    char portfile[300];
    snprintf(portfile, sizeof portfile, "%s/port%d", tmpdir, seq);
    snprintf(p->log, sizeof p->log, "%s/store%d.log", tmpdir, seq++);
    unlink(portfile);
    const char *argv[32] = {exe, "serve",       "--host", "127.0.0.1",          "--port",
                            "0", "--port-file", portfile, "--stats-interval-s", "0"};
    int n = 10;
    for (int i = 0; extra && extra[i] && n < 30; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(p->log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 2);
            dup2(fd, 1);
            close(fd);
        }
        /* An ignored signal stays ignored across exec: give the server the
         * default disposition, as a shell would. */
        signal(SIGPIPE, SIG_DFL);
        setenv("C10D_LOG_LEVEL", "INFO", 1);
        if (nofile > 0) {
            struct rlimit rl = {.rlim_cur = (rlim_t)nofile, .rlim_max = (rlim_t)nofile};
            setrlimit(RLIMIT_NOFILE, &rl);
        }
        execv(exe, (char *const *)argv);
        _exit(127);
    }
    p->pid = pid;
    p->status = -1;
    for (int i = 0; i < 10000; i++) {
        FILE *f = fopen(portfile, "r");
        if (f) {
            int port = 0;
            int got = fscanf(f, "%d", &port);
            fclose(f);
            if (got == 1 && port > 0) {
                p->port = port;
                return 0;
            }
        }
        if (waitpid(pid, NULL, WNOHANG) == pid) {
            p->pid = 0;
            return -1;
        }
        usleep(1000);
    }
    return -1;
}

/* The exit status (raw, as waitpid gives it) if it exited, else -1. */
static int proc_exited(struct proc *p)
{
    int st;
    if (p->pid > 0 && waitpid(p->pid, &st, WNOHANG) == p->pid) {
        p->pid = 0;
        p->status = st;
    }
    return p->pid > 0 ? -1 : p->status;
}

static void proc_kill(struct proc *p)
{
    if (p->pid > 0) {
        kill(p->pid, SIGKILL);
        waitpid(p->pid, NULL, 0);
        p->pid = 0;
    }
}

static int log_has(const struct proc *p, const char *needle)
{
    FILE *f = fopen(p->log, "r");
    if (!f)
        return 0;
    char line[2048];
    int found = 0;
    while (!found && fgets(line, sizeof line, f))
        found = strstr(line, needle) != NULL;
    fclose(f);
    return found;
}

static void dump_log(const struct proc *p)
{
    FILE *f = fopen(p->log, "r");
    if (!f)
        return;
    char line[2048];
    int n = 0;
    while (fgets(line, sizeof line, f) && n++ < 40)
        fprintf(stderr, "  store log: %s", line);
    fclose(f);
}

/* STATS over a fresh connection: the "refused" count, or -1. */
static int64_t stats_refused(int port, const char *token)
{
    struct store_tc c;
    int64_t v = -1;
    if (store_tc_open(&c, port, AF_INET, C10D_STORE_DIALECT_CURRENT) == 0) {
        struct c10d__wire_reply r;
        if (token) {
            struct c10d__wire_str t = {(const uint8_t *)token, strlen(token)};
            if (store_tc_call(&c, C10D_STORE_AUTH, 0, 0, 1, &t, &r) < 0) {
                store_tc_close(&c);
                return -1;
            }
        }
        if (store_tc_call(&c, C10D_STORE_STATS, 0, 0, 0, NULL, &r) == 0) {
            json_t *o = json_loadb((const char *)r.vals[0].data, r.vals[0].len, 0, NULL);
            json_t *conns = o ? json_object_get(o, "connections") : NULL;
            json_t *ref = conns ? json_object_get(conns, "refused") : NULL;
            if (ref)
                v = json_integer_value(ref);
            json_decref(o);
        }
    }
    store_tc_close(&c);
    return v;
}

static int ping_ok(int port)
{
    struct store_tc c;
    int ok = 0;
    if (store_tc_open(&c, port, AF_INET, C10D_STORE_DIALECT_CURRENT) == 0) {
        struct c10d__wire_reply r;
        ok = store_tc_call(&c, C10D_STORE_PING, 4242, 0, 0, NULL, &r) == 0 && r.u32 == 4242;
    }
    store_tc_close(&c);
    return ok;
}

static void skip_without_exe(void)
{
    if (!getenv("C10D_STORE_EXE")) {
        fprintf(stderr, "C10D_STORE_EXE not set\n");
        skip();
    }
}

/* ----------------------------------------------------------------- SIGPIPE */

static int sigpipe_ignored(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    unsigned long long mask = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "SigIgn: %llx", &mask) == 1)
            break;
    fclose(f);
    return (mask >> (SIGPIPE - 1)) & 1;
}

/* A client pipelines GETs of a large value and resets the connection
 * without reading: the server's writes then fail with EPIPE. It must lose
 * that connection, not its life. */
static void test_sigpipe_does_not_kill_the_server(void **state)
{
    (void)state;
    skip_without_exe();
    struct proc p = {0};
    assert_int_equal(spawn_store(&p, 0, NULL), 0);
    static uint8_t value[64 * 1024];
    memset(value, 'v', sizeof value);
    struct c10d__wire_str kv[2] = {STR("/big"), {value, sizeof value}};
    struct store_tc c;
    assert_int_equal(store_tc_open(&c, p.port, AF_INET, C10D_STORE_DIALECT_CURRENT), 0);
    assert_int_equal(store_tc_req(c.fd, c.dialect, C10D_STORE_SET, 0, 0, 2, kv), 0);
    struct c10d__wire_reply rep;
    assert_int_equal(store_tc_call(&c, C10D_STORE_GET, 0, 0, 1, kv, &rep), 0);
    assert_int_equal(rep.vals[0].len, sizeof value);
    store_tc_close(&c);
    struct c10d__wire_buf gets = {0};
    struct c10d__wire_request g = {.cmd = C10D_STORE_GET, .nargs = 1, .args = kv};
    for (int i = 0; i < 20000; i++)
        assert_int_equal(c10d__wire_encode_request(&gets, C10D_STORE_DIALECT_CURRENT, &g), 0);
    /* A race (the reset must land while replies are queued): many rounds. */
    for (int round = 0; round < 10 && proc_exited(&p) < 0; round++) {
        int fd = store_tc_connect(p.port, AF_INET);
        assert_true(fd >= 0);
        struct c10d__wire_request v = {.cmd = C10D_STORE_VALIDATE, .u32 = C10D_STORE_MAGIC};
        struct c10d__wire_buf b = {0};
        c10d__wire_encode_request(&b, C10D_STORE_DIALECT_CURRENT, &v);
        store_tc_send(fd, b.data, b.len);
        c10d__wire_buf_free(&b);
        /* Send what the kernel takes without blocking: the server stops
         * reading once its replies back up. */
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
        size_t off = 0;
        for (int spins = 0; off < gets.len && spins < 200; spins++) {
            ssize_t n = send(fd, gets.data + off, gets.len - off, MSG_NOSIGNAL);
            if (n > 0)
                off += (size_t)n;
            else
                usleep(1000);
        }
        struct linger lg = {.l_onoff = 1, .l_linger = 0};
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
        close(fd); /* RST */
        usleep(200 * 1000);
    }
    c10d__wire_buf_free(&gets);
    int st = proc_exited(&p);
    if (st >= 0) {
        fprintf(stderr, "c10d-store exited: %s %d\n", WIFSIGNALED(st) ? "signal" : "status",
                WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
        dump_log(&p);
    }
    assert_int_equal(st, -1);
    assert_true(ping_ok(p.port));
    /* The reset lands in a write only by chance; that SIGPIPE is ignored is
     * certain to show in the process's signal mask. */
    assert_true(sigpipe_ignored(p.pid));
    proc_kill(&p);
}

/* ------------------------------------------------------------ the fd limit */

/* With a hard limit of 128 descriptors, idle connections must not lock
 * everyone out silently: the server turns the surplus away at once, says
 * so, counts it, and serves again once the idle ones leave. */
static void test_fd_limit_refuses_visibly(void **state)
{
    (void)state;
    skip_without_exe();
    struct proc p = {0};
    assert_int_equal(spawn_store(&p, 128, NULL), 0);
    enum { N = 160 };
    int fds[N];
    int opened = 0;
    for (int i = 0; i < N; i++) {
        fds[i] = store_tc_connect(p.port, AF_INET);
        if (fds[i] >= 0)
            opened++;
    }
    assert_true(opened > 128);
    usleep(500 * 1000);
    int closed = 0, alive = 0;
    for (int i = 0; i < N; i++) {
        if (fds[i] < 0)
            continue;
        struct pollfd pf = {.fd = fds[i], .events = POLLIN};
        if (poll(&pf, 1, 0) == 1)
            closed++;
        else
            alive++;
    }
    fprintf(stderr, "%d idle connections kept, %d turned away\n", alive, closed);
    assert_true(closed > 0);
    assert_true(alive > 0);
    /* A newcomer at the limit is told at once, not left hanging. */
    int fresh = store_tc_connect(p.port, AF_INET);
    assert_true(fresh >= 0);
    assert_true(store_tc_wait_closed(fresh, 3000));
    close(fresh);
    for (int i = 0; i < N; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    usleep(300 * 1000);
    int64_t refused = stats_refused(p.port, NULL);
    fprintf(stderr, "stats: refused %lld\n", (long long)refused);
    int logged = log_has(&p, "closing connection from 127.0.0.1");
    if (refused <= 0 || !logged)
        dump_log(&p);
    assert_true(refused > 0);
    assert_true(logged);
    assert_true(log_has(&p, "file descriptor limit 128"));
    assert_true(ping_ok(p.port));
    assert_int_equal(proc_exited(&p), -1);
    proc_kill(&p);
}

/* The server is one of many users of the process's descriptors (rank 0's
 * store shares it with the job): when accept itself fails with EMFILE, the
 * reserve descriptor lets it turn the client away, visibly. In a child that
 * fills its own descriptor table. */
static int emfile_child(void)
{
    struct rlimit rl = {.rlim_cur = 64, .rlim_max = 64};
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
        return 10;
    uv_loop_t loop;
    uv_loop_init(&loop);
    struct c10d__store_server_opts o = {.host = "127.0.0.1"};
    struct c10d__store_server *srv;
    if (c10d__store_server_start(&loop, &o, &srv) < 0)
        return 11;
    int port = c10d__store_server_port(srv);
    int last = -1;
    for (;;) {
        int fd = open("/dev/null", O_RDONLY);
        if (fd < 0)
            break;
        last = fd;
    }
    if (last < 0)
        return 12;
    close(last);
    int client = store_tc_connect(port, AF_INET); /* completes in the backlog */
    if (client < 0)
        return 13;
    int64_t refused = 0;
    for (int i = 0; i < 200 && refused == 0; i++) {
        uv_run(&loop, UV_RUN_NOWAIT);
        char *json = c10d__store_server_stats_json(srv);
        json_t *obj = json ? json_loads(json, 0, NULL) : NULL;
        refused = obj ? json_integer_value(
                            json_object_get(json_object_get(obj, "connections"), "refused"))
                      : 0;
        json_decref(obj);
        free(json);
        usleep(5000);
    }
    if (refused != 1) {
        fprintf(stderr, "emfile child: refused %lld\n", (long long)refused);
        return 14;
    }
    if (!store_tc_wait_closed(client, 2000))
        return 15;
    return 0;
}

static void test_emfile_uses_the_reserve(void **state)
{
    (void)state;
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0)
        _exit(emfile_child());
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
}

/* ---------------------------------------------------------------- the token */

#define TOKEN "s3cret-of-this-job"

static void set_token(const char *t)
{
    if (t)
        setenv("C10D_STORE_TOKEN", t, 1);
    else
        unsetenv("C10D_STORE_TOKEN");
    unsetenv("C10D_STORE_TOKEN_FILE");
    c10d__env_reload();
}

static int raw_closed_after(int port, const uint8_t *bytes, size_t len)
{
    int fd = store_tc_connect(port, AF_INET);
    if (fd < 0)
        return 0;
    store_tc_send(fd, bytes, len);
    int closed = store_tc_wait_closed(fd, 3000);
    close(fd);
    return closed;
}

static void test_token_server(void **state)
{
    (void)state;
    skip_without_exe();
    char tf[300];
    snprintf(tf, sizeof tf, "%s/token", tmpdir);
    FILE *f = fopen(tf, "w");
    assert_non_null(f);
    fprintf(f, "%s\n", TOKEN);
    fclose(f);
    set_token(NULL);
    const char *extra[] = {"--token-file", tf, NULL};
    struct proc p = {0};
    assert_int_equal(spawn_store(&p, 0, extra), 0);

    /* No AUTH: VALIDATE passes, the next command closes the connection. */
    static const uint8_t get_no_auth[] = {0x00, 0xCE, 0xF7, 0x85, 0x3C, 0x03, 1,  0,
                                          0,    0,    0,    0,    0,    0,    'k'};
    assert_true(raw_closed_after(p.port, get_no_auth, sizeof get_no_auth));
    /* The legacy dialect cannot present a token: closed at its first request. */
    static const uint8_t legacy_numkeys[] = {6};
    assert_true(raw_closed_after(p.port, legacy_numkeys, sizeof legacy_numkeys));
    /* A wrong token is answered REFUSED, then closed. */
    struct store_tc c;
    struct c10d__wire_reply r;
    struct c10d__wire_str bad = STR("s3cret-of-another-job");
    assert_int_equal(store_tc_open(&c, p.port, AF_INET, C10D_STORE_DIALECT_CURRENT), 0);
    assert_int_equal(store_tc_call(&c, C10D_STORE_AUTH, 0, 0, 1, &bad, &r), 0);
    assert_int_equal(r.u8, C10D_STORE_AUTH_REFUSED);
    assert_true(store_tc_wait_closed(c.fd, 3000));
    store_tc_close(&c);
    /* The right one opens every command. */
    struct c10d__wire_str good = STR(TOKEN), kv[2] = {STR("/k"), STR("v")};
    assert_int_equal(store_tc_open(&c, p.port, AF_INET, C10D_STORE_DIALECT_CURRENT), 0);
    assert_int_equal(store_tc_call(&c, C10D_STORE_AUTH, 0, 0, 1, &good, &r), 0);
    assert_int_equal(r.u8, C10D_STORE_AUTH_OK);
    assert_int_equal(store_tc_call(&c, C10D_STORE_SET, 0, 0, 2, kv, &r), 0);
    assert_int_equal(store_tc_call(&c, C10D_STORE_GET, 0, 0, 1, kv, &r), 0);
    assert_int_equal(r.vals[0].len, 1);
    store_tc_close(&c);
    usleep(200 * 1000);
    int ok = log_has(&p, "no valid token presented before GET") &&
             log_has(&p, "closing connection from 127.0.0.1:") &&
             log_has(&p, "legacy dialect cannot present one") &&
             log_has(&p, "wrong token presented") && log_has(&p, "clients must present the token");
    if (!ok)
        dump_log(&p);
    assert_true(ok);

    /* The library's client: right token, wrong token (fails at once, not at
     * the deadline), none. */
    c10d_store *st = NULL;
    c10d_store_tcp_opts o = {.timeout_ms = 20000};
    set_token(TOKEN);
    assert_int_equal(c10d_store_tcp_connect("127.0.0.1", p.port, &o, &st), 0);
    assert_int_equal(c10d_store_set_sync(st, "x", "1", 1), 0);
    c10d_store_release(st);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", p.port);
    set_token("wrong");
    uint64_t t0 = c10d__now_ms();
    assert_true(c10d_store_tcp_connect("127.0.0.1", p.port, &o, &st) < 0);
    fprintf(stderr, "wrong token: %s\n", c10d_last_error());
    assert_true(c10d__now_ms() - t0 < 10000);
    assert_non_null(strstr(c10d_last_error(), "refused the token"));
    assert_non_null(strstr(c10d_last_error(), addr));
    set_token(NULL);
    o.timeout_ms = 2000;
    assert_true(c10d_store_tcp_connect("127.0.0.1", p.port, &o, &st) < 0);
    fprintf(stderr, "no token: %s\n", c10d_last_error());
    assert_non_null(strstr(c10d_last_error(), "C10D_STORE_TOKEN"));
    assert_non_null(strstr(c10d_last_error(), addr));

    /* The CLI presents the environment's token. */
    char cmd[700];
    snprintf(cmd, sizeof cmd, "C10D_STORE_TOKEN=%s %s ping --port %d >/dev/null 2>&1", TOKEN,
             getenv("C10D_STORE_EXE"), p.port);
    assert_int_equal(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "%s ping --port %d --timeout-ms 1500 >/dev/null 2>&1",
             getenv("C10D_STORE_EXE"), p.port);
    assert_true(system(cmd) != 0);
    assert_int_equal(proc_exited(&p), -1);
    proc_kill(&p);
    assert_true(c10d__token_equal((const uint8_t *)"ab", 2, (const uint8_t *)"ab", 2));
    assert_false(c10d__token_equal((const uint8_t *)"ab", 2, (const uint8_t *)"abc", 3));
    assert_false(c10d__token_equal((const uint8_t *)"ab", 2, (const uint8_t *)"ax", 2));
}

/* A store that dies mid-job: the client's error names it. */
static void test_errors_name_the_store(void **state)
{
    (void)state;
    skip_without_exe();
    set_token(NULL);
    struct proc p = {0};
    assert_int_equal(spawn_store(&p, 0, NULL), 0);
    c10d_store *st = NULL;
    c10d_store_tcp_opts o = {.timeout_ms = 2000};
    assert_int_equal(c10d_store_tcp_connect("127.0.0.1", p.port, &o, &st), 0);
    proc_kill(&p);
    void *v;
    size_t len;
    assert_true(c10d_store_get_sync(st, "missing", &v, &len) < 0);
    fprintf(stderr, "dead store: %s\n", c10d_last_error());
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", p.port);
    assert_non_null(strstr(c10d_last_error(), addr));
    c10d_store_release(st);
}

/* ----------------------------------------------------- the embedded store */

/* 1 if a TCP connection from the loopback to ip:port is accepted. */
static int reachable(const char *ip, int port)
{
    int v6 = strchr(ip, ':') != NULL;
    int fd = socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return 0;
    int rc;
    if (v6) {
        struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_port = htons((uint16_t)port)};
        inet_pton(AF_INET6, ip, &a.sin6_addr);
        rc = connect(fd, (struct sockaddr *)&a, sizeof a);
    } else {
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        inet_pton(AF_INET, ip, &a.sin_addr);
        rc = connect(fd, (struct sockaddr *)&a, sizeof a);
    }
    close(fd);
    return rc == 0;
}

static int rendezvous_alone(int port, c10d_store **out)
{
    char text[16];
    snprintf(text, sizeof text, "%d", port);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", text, 1);
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "1", 1);
    c10d_rendezvous_opts o;
    memset(&o, 0, sizeof o);
    o.timeout_ms = 20000;
    c10d_rendezvous_result r;
    int rc = c10d_rendezvous("env://", &o, &r);
    *out = rc == 0 ? r.store : NULL;
    return rc;
}

/* MASTER_ADDR=127.0.0.1: rank 0's store listens there and nowhere else
 * (127.0.0.2 is loopback too, but not the address a 127.0.0.1 socket
 * takes); C10D_STORE_BIND='*' opens it to every address. */
static void test_embedded_store_binds_master_addr(void **state)
{
    (void)state;
    set_token(NULL);
    unsetenv("C10D_STORE_BIND");
    int port = test_free_port();
    c10d_store *st;
    assert_int_equal(rendezvous_alone(port, &st), 0);
    assert_true(reachable("127.0.0.1", port));
    assert_false(reachable("127.0.0.2", port));
    assert_false(reachable("::1", port));
    c10d_store_release(st);

    setenv("C10D_STORE_BIND", "*", 1);
    c10d__env_reload();
    port = test_free_port();
    assert_int_equal(rendezvous_alone(port, &st), 0);
    assert_true(reachable("127.0.0.1", port));
    assert_true(reachable("127.0.0.2", port));
    c10d_store_release(st);
    unsetenv("C10D_STORE_BIND");
}

/* Every rank has the token: the job runs as before. One rank without it
 * cannot join. Real processes. */
static int token_rank(int rank, int n, int port, const char *token)
{
    char text[16];
    if (token)
        setenv("C10D_STORE_TOKEN", token, 1);
    else
        unsetenv("C10D_STORE_TOKEN");
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    snprintf(text, sizeof text, "%d", port);
    setenv("MASTER_PORT", text, 1);
    snprintf(text, sizeof text, "%d", rank);
    setenv("RANK", text, 1);
    snprintf(text, sizeof text, "%d", n);
    setenv("WORLD_SIZE", text, 1);
    c10d_rendezvous_opts o;
    memset(&o, 0, sizeof o);
    o.timeout_ms = 8000;
    c10d_rendezvous_result r;
    if (c10d_rendezvous("env://", &o, &r) < 0) {
        fprintf(stderr, "rank %d: %s\n", rank, c10d_last_error());
        return 1;
    }
    snprintf(text, sizeof text, "r%d", rank);
    int rc = c10d_store_set_sync(r.store, text, "x", 1);
    const char *keys[] = {"r0", "r1"};
    if (rc == 0)
        rc = c10d_store_wait_sync(r.store, keys, 2, 8000);
    /* Rank 0's store must outlive rank 1's last request. */
    const char *done[] = {"done"};
    if (rc == 0 && rank == 1)
        rc = c10d_store_set_sync(r.store, "done", "x", 1);
    if (rc == 0 && rank == 0)
        rc = c10d_store_wait_sync(r.store, done, 1, 8000);
    if (rc < 0)
        fprintf(stderr, "rank %d: %s\n", rank, c10d_last_error());
    c10d_store_release(r.store);
    c10d_shutdown();
    return rc == 0 ? 0 : 2;
}

static void run_ranks(const char *tok0, const char *tok1, int *st0, int *st1)
{
    int port = test_free_port();
    fflush(stderr);
    pid_t pids[2];
    for (int i = 0; i < 2; i++) {
        pids[i] = fork();
        if (pids[i] == 0) {
            alarm(30);
            _exit(token_rank(i, 2, port, i ? tok1 : tok0));
        }
    }
    int st[2];
    for (int i = 0; i < 2; i++) {
        waitpid(pids[i], &st[i], 0);
        fprintf(stderr, "rank %d: exit %d signal %d\n", i,
                WIFEXITED(st[i]) ? WEXITSTATUS(st[i]) : -1,
                WIFSIGNALED(st[i]) ? WTERMSIG(st[i]) : 0);
    }
    *st0 = st[0];
    *st1 = st[1];
}

static void test_rendezvous_with_token(void **state)
{
    (void)state;
    int a, b;
    run_ranks(TOKEN, TOKEN, &a, &b);
    assert_true(WIFEXITED(a) && WEXITSTATUS(a) == 0);
    assert_true(WIFEXITED(b) && WEXITSTATUS(b) == 0);
    run_ranks(TOKEN, NULL, &a, &b);
    assert_true(WIFEXITED(b) && WEXITSTATUS(b) != 0);
    assert_true(WIFEXITED(a) && WEXITSTATUS(a) != 0); /* rank 1 never joined */
}

/* ------------------------------------------------------------------- main */

static int setup(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/c10d_store_access.XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sigpipe_does_not_kill_the_server),
        cmocka_unit_test(test_fd_limit_refuses_visibly),
        cmocka_unit_test(test_emfile_uses_the_reserve),
        cmocka_unit_test(test_token_server),
        cmocka_unit_test(test_errors_name_the_store),
        cmocka_unit_test(test_rendezvous_with_token),
        cmocka_unit_test(test_embedded_store_binds_master_addr),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
