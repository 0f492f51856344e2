/* Our TCP store client and the c10d-store CLI against PyTorch 1.13's own
 * TCPStore server (Debian's python3-torch, run with /usr/bin/python3).
 * Skips (77) where torch cannot be imported. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "c10d.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define PYTHON "/usr/bin/python3"

/* The server: prints its port, lives until its stdin closes (so it dies
 * with us even if we crash) or it is killed. */
static const char *server_py =
    "import sys, datetime\n"
    "import torch.distributed as d\n"
    "s = d.TCPStore('127.0.0.1', 0, 1, True, timeout=datetime.timedelta(seconds=60),\n"
    "               wait_for_workers=False)\n"
    "print(s.port, flush=True)\n"
    "sys.stdin.read()\n";

static pid_t server_pid;
static int server_stdin = -1;
static int port;

static int start_torch_server(void)
{
    int in[2], out[2];
    if (pipe(in) < 0 || pipe(out) < 0)
        return -1;
    server_pid = fork();
    if (server_pid < 0)
        return -1;
    if (server_pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        close(in[1]);
        close(out[0]);
        execl(PYTHON, PYTHON, "-c", server_py, (char *)NULL);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    server_stdin = in[1];
    FILE *f = fdopen(out[0], "r");
    /* bounded: python exits (EOF) if torch fails to start */
    if (!f || fscanf(f, "%d", &port) != 1 || port <= 0) {
        if (f)
            fclose(f);
        return -1;
    }
    fclose(f);
    return 0;
}

static void stop_torch_server(void)
{
    if (server_stdin >= 0)
        close(server_stdin);
    server_stdin = -1;
    if (server_pid > 0) {
        kill(server_pid, SIGKILL);
        waitpid(server_pid, NULL, 0);
    }
    server_pid = 0;
}

static c10d_store *connect_legacy(int dialect)
{
    c10d_store_tcp_opts o = {.timeout_ms = 10000, .dialect = dialect};
    c10d_store *s = NULL;
    if (c10d_store_tcp_connect("127.0.0.1", port, &o, &s) < 0)
        fail_msg("connect: %s", c10d_last_error());
    assert_int_equal(c10d_store_dialect_of(s), C10D_DIALECT_LEGACY);
    return s;
}

static void expect_get(c10d_store *s, const char *key, const char *want)
{
    void *v = NULL;
    size_t len = 0;
    if (c10d_store_get_sync(s, key, &v, &len) != 0)
        fail_msg("get %s: %s", key, c10d_last_error());
    assert_int_equal(len, strlen(want));
    assert_memory_equal(v, want, len);
    free(v);
}

static void expect_cas(c10d_store *s, const char *key, const char *exp, const char *des,
                       const char *want)
{
    void *v = NULL;
    size_t len = 0;
    if (c10d_store_compare_set_sync(s, key, exp, strlen(exp), des, strlen(des), &v, &len) != 0)
        fail_msg("compare_set %s: %s", key, c10d_last_error());
    assert_int_equal(len, strlen(want));
    assert_memory_equal(v, want, len);
    free(v);
}

static void test_every_113_command(void **state)
{
    (void)state;
    c10d_store *s = connect_legacy(C10D_DIALECT_LEGACY);
    int64_t v = 0, before = 0, after = 0;
    int ready = -1, deleted = -1;
    assert_int_equal(c10d_store_num_keys_sync(s, &before), 0);
    assert_int_equal(c10d_store_set_sync(s, "k", "value", 5), 0);
    expect_get(s, "k", "value");
    assert_int_equal(c10d_store_add_sync(s, "n", 2, &v), 0);
    assert_int_equal(v, 2);
    assert_int_equal(c10d_store_add_sync(s, "n", 3, &v), 0);
    assert_int_equal(v, 5);
    expect_get(s, "n", "5");
    expect_cas(s, "cas", "x", "y", "x");
    expect_cas(s, "cas", "", "a", "a");
    expect_cas(s, "cas", "a", "b", "b");
    expect_cas(s, "cas", "zz", "c", "b");
    const char *keys[] = {"k", "n"}, *missing[] = {"k", "nope"};
    assert_int_equal(c10d_store_check_sync(s, keys, 2, &ready), 0);
    assert_int_equal(ready, 1);
    assert_int_equal(c10d_store_check_sync(s, missing, 2, &ready), 0);
    assert_int_equal(ready, 0);
    assert_int_equal(c10d_store_wait_sync(s, keys, 2, 2000), 0);
    assert_int_equal(c10d_store_num_keys_sync(s, &after), 0);
    assert_int_equal(after - before, 3);
    assert_int_equal(c10d_store_delete_key_sync(s, "k", &deleted), 0);
    assert_int_equal(deleted, 1);
    assert_int_equal(c10d_store_delete_key_sync(s, "k", &deleted), 0);
    assert_int_equal(deleted, 0);
    int64_t rtt = -1;
    assert_int_equal(c10d_store_ping_sync(s, &rtt), 0); /* emulated with CHECK */
    /* what 1.13 lacks is refused up front, naming the reason */
    assert_int_equal(c10d_store_append_sync(s, "k", "x", 1), C10D_EUNSUPPORTED);
    assert_non_null(strstr(c10d_last_error(), "1.13"));
    c10d_store_release(s);
}

/* 1.13 has no CANCEL_WAIT: a WAIT that timed out must not leave a late
 * STOP_WAITING to be read as the answer to a later request. */
static void test_wait_timeout_no_desync(void **state)
{
    (void)state;
    c10d_store *s = connect_legacy(C10D_DIALECT_LEGACY);
    const char *key = "late";
    assert_int_equal(c10d_store_wait_sync(s, &key, 1, 300), C10D_ETIMEDOUT);
    assert_non_null(strstr(c10d_last_error(), "late"));
    assert_int_equal(c10d_store_set_sync(s, "late", "1", 1), 0);
    int64_t v = 0;
    assert_int_equal(c10d_store_add_sync(s, "after_timeout", 41, &v), 0);
    assert_int_equal(v, 41);
    expect_get(s, "late", "1");
    c10d_store_release(s);
}

static void test_auto_detects_legacy(void **state)
{
    (void)state;
    c10d_store *s = connect_legacy(C10D_DIALECT_AUTO);
    assert_int_equal(c10d_store_set_sync(s, "auto", "yes", 3), 0);
    expect_get(s, "auto", "yes");
    c10d_store_release(s);
}

static void test_current_dialect_is_refused_clearly(void **state)
{
    (void)state;
    c10d_store_tcp_opts o = {.timeout_ms = 1500, .dialect = C10D_DIALECT_CURRENT};
    c10d_store *s = NULL;
    assert_true(c10d_store_tcp_connect("127.0.0.1", port, &o, &s) < 0);
    assert_null(s);
    assert_non_null(strstr(c10d_last_error(), "protocol mismatch"));
}

/* Runs the CLI; returns its exit status and its stdout in out. */
static int cli(char *out, size_t cap, const char *args)
{
    const char *exe = getenv("C10D_STORE_EXE");
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s %s --port %d --timeout-ms 5000 --dialect legacy 2>&1", exe, args,
             port);
    FILE *p = popen(cmd, "r");
    if (!p)
        return -1;
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_cli(void **state)
{
    (void)state;
    if (!getenv("C10D_STORE_EXE"))
        skip();
    char out[4096];
    assert_int_equal(cli(out, sizeof out, "set cli_key hello"), 0);
    assert_int_equal(cli(out, sizeof out, "get cli_key"), 0);
    assert_string_equal(out, "hello\n");
    assert_int_equal(cli(out, sizeof out, "add cli_n 7"), 0);
    assert_string_equal(out, "7\n");
    assert_int_equal(cli(out, sizeof out, "compare-set cli_key hello bye"), 0);
    assert_string_equal(out, "bye\n");
    assert_int_equal(cli(out, sizeof out, "check cli_key cli_n"), 0);
    assert_string_equal(out, "ready\n");
    assert_int_equal(cli(out, sizeof out, "wait cli_key"), 0);
    assert_int_equal(cli(out, sizeof out, "delete cli_key"), 0);
    assert_string_equal(out, "1\n");
    assert_int_equal(cli(out, sizeof out, "num-keys"), 0);
    assert_int_equal(cli(out, sizeof out, "ping"), 0);
    assert_non_null(strstr(out, "1.13"));
    assert_int_equal(cli(out, sizeof out, "barrier cli 1"), 0);
    /* failures say what happened */
    assert_int_equal(cli(out, sizeof out, "queue-len q"), 1);
    assert_non_null(strstr(out, "not supported"));
    assert_int_equal(cli(out, sizeof out, "wait never"), 1);
    assert_non_null(strstr(out, "timed out"));
}

static int setup(void **state)
{
    (void)state;
    return start_torch_server();
}

static int teardown(void **state)
{
    (void)state;
    stop_torch_server();
    c10d_shutdown();
    return 0;
}

int main(void)
{
    if (access(PYTHON, X_OK) != 0 ||
        system(PYTHON " -c 'import torch.distributed' > /dev/null 2>&1") != 0) {
        fprintf(stderr, "skipped: %s cannot import torch.distributed (install python3-torch)\n",
                PYTHON);
        return 77;
    }
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_113_command),
        cmocka_unit_test(test_wait_timeout_no_desync),
        cmocka_unit_test(test_auto_detects_legacy),
        cmocka_unit_test(test_current_dialect_is_refused_clearly),
        cmocka_unit_test(test_cli),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
