/* Rendezvous: 1-4 real processes by env://, tcp://, file://, with the agent
 * store and an external store; missing variables; the barrier's timeout. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "free_port.h"
#include "c10d.h"
#include "engine/loop.h"
#include "store_server/server/server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <uv.h>

#define CHILD_LIMIT_MS 60000

static char tmpdir[256];

static int free_port(void)
{
    return test_free_port();
}

enum mode { M_ENV, M_TCP, M_FILE, M_AGENT, M_EXTERNAL };

/* What every rank does: rendezvous, publish, read everyone, barrier. */
static int rank_main(enum mode m, int rank, int n, int port, const char *file)
{
    char url[600], text[32];
    c10d_rendezvous_opts o;
    memset(&o, 0, sizeof o);
    o.timeout_ms = 30000;
    snprintf(text, sizeof text, "%d", port);
    switch (m) {
    case M_AGENT:
        setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);
        /* fall through */
    case M_ENV:
        setenv("MASTER_ADDR", "127.0.0.1", 1);
        setenv("MASTER_PORT", text, 1);
        snprintf(text, sizeof text, "%d", rank);
        setenv("RANK", text, 1);
        snprintf(text, sizeof text, "%d", n);
        setenv("WORLD_SIZE", text, 1);
        snprintf(url, sizeof url, "env://");
        break;
    case M_EXTERNAL:
        o.external_store = 1;
        /* fall through */
    case M_TCP:
        snprintf(url, sizeof url, "tcp://127.0.0.1:%d?rank=%d&world_size=%d", port, rank, n);
        break;
    case M_FILE:
        snprintf(url, sizeof url, "file://%s?rank=%d&world_size=%d", file, rank, n);
        break;
    }
    c10d_rendezvous_result r;
    if (c10d_rendezvous(url, &o, &r) < 0) {
        fprintf(stderr, "rank %d: %s\n", rank, c10d_last_error());
        return 1;
    }
    if (r.rank != rank || r.world_size != n) {
        fprintf(stderr, "rank %d: got rank %d world_size %d\n", rank, r.rank, r.world_size);
        return 1;
    }
    char key[32], want[32];
    snprintf(key, sizeof key, "addr_%d", rank);
    snprintf(want, sizeof want, "rank %d here", rank);
    int ok = c10d_store_set_sync(r.store, key, want, strlen(want)) == 0;
    for (int i = 0; ok && i < n; i++) {
        void *v = NULL;
        size_t len = 0;
        snprintf(key, sizeof key, "addr_%d", i);
        snprintf(want, sizeof want, "rank %d here", i);
        ok = c10d_store_get_sync(r.store, key, &v, &len) == 0 && len == strlen(want) &&
             memcmp(v, want, len) == 0;
        free(v);
    }
    /* Nobody leaves (rank 0 hosts the server) before everyone has read. */
    ok = ok && c10d_store_barrier(r.store, "done", n, 30000) == 0;
    /* ... and rank 0 stays until every other rank stopped using its server. */
    if (ok && rank != 0)
        ok = c10d_store_add_sync(r.store, "left", 1, NULL) == 0;
    for (int64_t left = 0; ok && rank == 0 && left < n - 1; usleep(2000))
        ok = c10d_store_add_sync(r.store, "left", 0, &left) == 0;
    if (!ok)
        fprintf(stderr, "rank %d: %s\n", rank, c10d_last_error());
    c10d_store_release(r.store);
    c10d_shutdown();
    return ok ? 0 : 1;
}

/* Forks n ranks; every one is reaped (killed past the limit) before returning. */
static void run_ranks(enum mode m, int n, int port)
{
    char file[300];
    snprintf(file, sizeof file, "%s/rdzv_%d_%d_%d", tmpdir, (int)m, n, port);
    pid_t pids[8];
    for (int i = 0; i < n; i++) {
        pids[i] = fork();
        assert_true(pids[i] >= 0);
        if (pids[i] == 0)
            _exit(rank_main(m, i, n, port, file));
    }
    int failed = 0, left = n;
    uint64_t start = c10d__now_ms();
    while (left > 0) {
        for (int i = 0; i < n; i++) {
            int st;
            if (pids[i] <= 0 || waitpid(pids[i], &st, WNOHANG) != pids[i])
                continue;
            if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
                fprintf(stderr, "rank %d failed (status %d)\n", i, st);
                failed = 1;
            }
            pids[i] = 0;
            left--;
        }
        if (left && c10d__now_ms() - start > CHILD_LIMIT_MS) {
            for (int i = 0; i < n; i++)
                if (pids[i] > 0) {
                    kill(pids[i], SIGKILL);
                    waitpid(pids[i], NULL, 0);
                    fprintf(stderr, "rank %d hung: killed\n", i);
                }
            failed = 1;
            break;
        }
        usleep(2000);
    }
    assert_false(failed);
}

static void test_env(void **state)
{
    (void)state;
    for (int n = 1; n <= 4; n++)
        run_ranks(M_ENV, n, free_port());
}

static void test_tcp(void **state)
{
    (void)state;
    for (int n = 1; n <= 4; n++)
        run_ranks(M_TCP, n, free_port());
}

static void test_file(void **state)
{
    (void)state;
    for (int n = 1; n <= 4; n++)
        run_ranks(M_FILE, n, 0);
}

/* A server this process hosts on its engine (the "agent" or external one). */
struct server_call {
    struct c10d__store_server *server;
    int port, rc;
    atomic_int done;
};

static void start_on_loop(void *arg)
{
    struct server_call *c = arg;
    struct c10d__store_server_opts o = {.host = "127.0.0.1"};
    c->rc = c10d__store_server_start(c10d__engine_loop(), &o, &c->server);
    if (c->rc == 0)
        c->port = c10d__store_server_port(c->server);
    atomic_store(&c->done, 1);
}

static void stop_on_loop(void *arg)
{
    struct server_call *c = arg;
    c10d__store_server_stop(c->server, NULL, NULL);
    atomic_store(&c->done, 1);
}

static void call_and_wait(void (*fn)(void *), struct server_call *c)
{
    atomic_store(&c->done, 0);
    assert_int_equal(c10d__engine_call(fn, c), 0);
    for (int i = 0; i < 10000 && !atomic_load(&c->done); i++)
        usleep(1000);
    assert_true(atomic_load(&c->done));
}

static void test_agent_and_external_store(void **state)
{
    (void)state;
    struct server_call c = {0};
    call_and_wait(start_on_loop, &c);
    assert_int_equal(c.rc, 0);
    /* Rank 0 must not try to host: the port is taken by "the agent". */
    run_ranks(M_AGENT, 2, c.port);
    run_ranks(M_EXTERNAL, 3, c.port);
    call_and_wait(stop_on_loop, &c);
}

static void set_env4(const char *skip)
{
    const char *names[] = {"MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"};
    const char *vals[] = {"127.0.0.1", "29999", "0", "1"};
    for (int i = 0; i < 4; i++) {
        if (skip && !strcmp(skip, names[i]))
            unsetenv(names[i]);
        else
            setenv(names[i], vals[i], 1);
    }
}

static void test_missing_env(void **state)
{
    (void)state;
    const char *names[] = {"MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"};
    for (int i = 0; i < 4; i++) {
        set_env4(names[i]);
        c10d_rendezvous_result r;
        assert_int_equal(c10d_rendezvous("env://", NULL, &r), C10D_EINVAL);
        assert_non_null(strstr(c10d_last_error(), names[i]));
        assert_null(r.store);
    }
    set_env4(NULL);
    setenv("RANK", "two", 1);
    c10d_rendezvous_result r;
    assert_int_equal(c10d_rendezvous("env://", NULL, &r), C10D_EINVAL);
    assert_non_null(strstr(c10d_last_error(), "RANK='two'"));
    unsetenv("MASTER_ADDR");
    unsetenv("MASTER_PORT");
    unsetenv("RANK");
    unsetenv("WORLD_SIZE");
}

static void test_bad_urls(void **state)
{
    (void)state;
    c10d_rendezvous_result r;
    struct {
        const char *url, *needle;
    } cases[] = {
        {"foo://x", "unknown scheme"},
        {"tcp://127.0.0.1?rank=0&world_size=1", "host:port"},
        {"tcp://127.0.0.1:80?world_size=1", "rank"},
        {"tcp://127.0.0.1:80?rank=0", "world_size"},
        {"tcp://127.0.0.1:80?rank=2&world_size=2", "out of range"},
        {"file://relative?rank=0&world_size=1", "absolute"},
        {"nonsense", "malformed URL"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        assert_int_equal(c10d_rendezvous(cases[i].url, NULL, &r), C10D_EINVAL);
        if (!strstr(c10d_last_error(), cases[i].needle))
            fail_msg("%s: message '%s' lacks '%s'", cases[i].url, c10d_last_error(),
                     cases[i].needle);
    }
}

static void test_barrier_timeout_message(void **state)
{
    (void)state;
    c10d_store *s;
    assert_int_equal(c10d_store_hash_create(&s), 0);
    assert_int_equal(c10d_store_barrier(s, "g", 2, 500), C10D_ETIMEDOUT);
    const char *msg = c10d_last_error();
    assert_non_null(strstr(msg, "store_based_barrier_key:g"));
    assert_non_null(strstr(msg, "world_size=2"));
    assert_non_null(strstr(msg, "num_workers_joined=1"));
    /* the second arrival completes it (for both: the key stays set) */
    assert_int_equal(c10d_store_barrier(s, "g", 2, 5000), 0);
    /* The first caller never got through, so it never counted out: nobody
     * may delete what it might still read. */
    int64_t keys = -1;
    assert_int_equal(c10d_store_num_keys_sync(s, &keys), 0);
    assert_int_equal(keys, 3);
    c10d_store_release(s);
}

struct barrier_arg {
    c10d_store *store;
    int rc;
};

static void barrier_thread(void *p)
{
    struct barrier_arg *a = p;
    a->rc = c10d_store_barrier(a->store, "all", 3, 10000);
}

/* Once every participant got through, the barrier's keys are gone: the
 * last one out deletes them (a group's members cannot: non-members take part
 * in its barrier too). */
static void test_barrier_leaves_no_keys(void **state)
{
    (void)state;
    c10d_store *s;
    assert_int_equal(c10d_store_hash_create(&s), 0);
    struct barrier_arg args[3];
    uv_thread_t th[3];
    for (int i = 0; i < 3; i++) {
        args[i] = (struct barrier_arg){s, -1};
        assert_int_equal(uv_thread_create(&th[i], barrier_thread, &args[i]), 0);
    }
    for (int i = 0; i < 3; i++) {
        uv_thread_join(&th[i]);
        assert_int_equal(args[i].rc, 0);
    }
    int64_t keys = -1;
    assert_int_equal(c10d_store_num_keys_sync(s, &keys), 0);
    assert_int_equal(keys, 0);
    c10d_store_release(s);
}

static int setup(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/c10d_rdzv.XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    c10d_shutdown();
    return system(cmd) == 0 ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_missing_env),
        cmocka_unit_test(test_bad_urls),
        cmocka_unit_test(test_barrier_timeout_message),
        cmocka_unit_test(test_barrier_leaves_no_keys),
        cmocka_unit_test(test_env),
        cmocka_unit_test(test_tcp),
        cmocka_unit_test(test_file),
        cmocka_unit_test(test_agent_and_external_store),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
