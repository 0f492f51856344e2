/* Jobs through a store that outlives them (docs/semantics.md, 1: attempt
 * namespaces): one `c10d-store serve` process serves job after job, whose
 * ranks are all its clients (TORCHELASTIC_USE_AGENT_STORE=True), as under a
 * long-lived store or torchrun's agent store across restarts.
 *
 * - back-to-back: 6 jobs with no run id and no restart count, each ending
 *   with c10d_pg_destroy and an immediate exit (the clean-up that follows
 *   destroy may never reach the store);
 * - restarts: one run id, attempts 0-3 (TORCHELASTIC_RESTART_COUNT), every
 *   attempt but the last ending without destroy, as a crash would;
 * each in both start orders: rank 1 started 0.3 s before rank 0 (it reads
 * the store before rank 0 published anything), and rank 0 first.
 *
 * - explicit store: groups given the store itself (no rendezvous, so no
 *   namespace) read rank 0's earlier address, which refuses, and read it
 *   again until rank 0 published its own;
 * - stale handshake keys: what dead processes leave in the generation
 *   handshake (an unanswered ask, an old ack, a ticket never written).
 * A job fails when a rank cannot create the group or all-reduce within its
 * timeout. Every count is printed (so a run on older code shows how many
 * fail); the test asserts there are none, and that finished jobs do not
 * leave a growing number of keys behind. Every process started is killed
 * on the way out, also on failure. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "c10d.h"
#include "free_port.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define WORLD          2
#define GROUP_TIMEOUT  4000 /* ms: a rank stuck on a stale address fails by then */
#define JOB_DEADLINE   20   /* s: then the job's ranks are killed */
#define EARLY_START_US 300000
#define JOBS           6
#define RESTARTS       3

static pid_t server_pid;
static int store_port;
static char tmpdir[64];

/* ------------------------------------------------------------ processes */

static void kill_and_reap(pid_t pid)
{
    if (pid <= 0)
        return;
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

static void stop_server(void)
{
    kill_and_reap(server_pid);
    server_pid = 0;
    if (tmpdir[0]) {
        char path[128];
        snprintf(path, sizeof path, "%s/port", tmpdir);
        unlink(path);
        rmdir(tmpdir);
        tmpdir[0] = '\0';
    }
}

static void on_signal(int sig)
{
    stop_server();
    signal(sig, SIG_DFL);
    raise(sig);
}

static int start_server(void)
{
    const char *exe = getenv("C10D_STORE_EXE");
    if (exe == NULL)
        return -1;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/c10d_restarts.XXXXXX");
    if (mkdtemp(tmpdir) == NULL)
        return -1;
    char portfile[128], portarg[16];
    snprintf(portfile, sizeof portfile, "%s/port", tmpdir);
    store_port = test_free_port();
    snprintf(portarg, sizeof portarg, "%d", store_port);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        execl(exe, exe, "serve", "--host", "127.0.0.1", "--port", portarg, "--port-file", portfile,
              "--stats-interval-s", "0", (char *)NULL);
        _exit(127);
    }
    server_pid = pid;
    for (int i = 0; i < 10000; i++) {
        FILE *f = fopen(portfile, "r");
        if (f != NULL) {
            int port = 0;
            int got = fscanf(f, "%d", &port);
            fclose(f);
            if (got == 1 && port == store_port)
                return 0;
        }
        if (waitpid(pid, NULL, WNOHANG) == pid) {
            server_pid = 0;
            return -1;
        }
        usleep(1000);
    }
    return -1;
}

/* ---------------------------------------------------------------- ranks */

struct job {
    const char *run_id; /* NULL: unset */
    int restart_count;  /* < 0: unset */
    int destroy;        /* 0: exit without destroy, as a crash */
    int rank0_first;
    int explicit_store; /* the group gets the store itself: no rendezvous, no namespace */
};

/* One rank: the exit status says how far it got (0: all of it). */
static void rank_main(int rank, const struct job *j)
{
    char port[16], r[16], n[16], attempt[16];
    snprintf(port, sizeof port, "%d", store_port);
    snprintf(r, sizeof r, "%d", rank);
    snprintf(n, sizeof n, "%d", WORLD);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", port, 1);
    setenv("RANK", r, 1);
    setenv("WORLD_SIZE", n, 1);
    setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);
    if (j->run_id != NULL)
        setenv("TORCHELASTIC_RUN_ID", j->run_id, 1);
    else
        unsetenv("TORCHELASTIC_RUN_ID");
    if (j->restart_count >= 0) {
        snprintf(attempt, sizeof attempt, "%d", j->restart_count);
        setenv("TORCHELASTIC_RESTART_COUNT", attempt, 1);
    } else {
        unsetenv("TORCHELASTIC_RESTART_COUNT");
    }
    c10d_pg_opts po = {0};
    po.timeout_ms = GROUP_TIMEOUT;
    c10d_pg *pg = NULL;
    c10d_store *store = NULL;
    if (j->explicit_store) {
        c10d_store_tcp_opts so = {.timeout_ms = GROUP_TIMEOUT};
        if (c10d_store_tcp_connect("127.0.0.1", store_port, &so, &store) != 0) {
            fprintf(stderr, "rank %d: store: %s\n", rank, c10d_last_error());
            _exit(1);
        }
        po.store = store;
        po.rank = rank;
        po.world_size = WORLD;
    }
    if (c10d_pg_init(&po, &pg) != 0) {
        fprintf(stderr, "rank %d: init: %s\n", rank, c10d_last_error());
        _exit(1);
    }
    int32_t x = rank + 1, sum = 0;
    if (c10d_all_reduce_sync(pg, &x, &sum, 1, C10D_INT32, C10D_SUM) != 0 || sum != 3) {
        fprintf(stderr, "rank %d: all_reduce: %s (sum %d)\n", rank, c10d_last_error(), sum);
        _exit(2);
    }
    if (j->destroy && c10d_pg_destroy(pg) != 0) {
        fprintf(stderr, "rank %d: destroy: %s\n", rank, c10d_last_error());
        _exit(3);
    }
    _exit(0); /* at once: nothing the library queued after destroy gets to run */
}

static pid_t spawn_rank(int rank, const struct job *j)
{
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        rank_main(rank, j);
    }
    return pid;
}

/* 0 if every rank of the job succeeded. */
static int run_job(const struct job *j)
{
    pid_t pids[WORLD] = {0};
    int first = j->rank0_first ? 0 : 1;
    pids[first] = spawn_rank(first, j);
    usleep(EARLY_START_US);
    for (int r = 0; r < WORLD; r++)
        if (r != first)
            pids[r] = spawn_rank(r, j);
    int failed = 0, left = WORLD;
    time_t deadline = time(NULL) + JOB_DEADLINE;
    while (left > 0 && time(NULL) < deadline) {
        for (int r = 0; r < WORLD; r++) {
            int st;
            if (pids[r] <= 0 || waitpid(pids[r], &st, WNOHANG) != pids[r])
                continue;
            pids[r] = 0;
            left--;
            if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
                failed = 1;
        }
        usleep(10000);
    }
    for (int r = 0; r < WORLD; r++)
        if (pids[r] > 0) {
            kill_and_reap(pids[r]);
            failed = 1;
        }
    return failed;
}

/* How many keys the store holds (-1: cannot tell). The engine this starts
 * is shut down again, so the next fork starts clean. */
static int64_t store_keys(void)
{
    c10d_store_tcp_opts o = {.timeout_ms = 5000};
    c10d_store *s = NULL;
    int64_t n = -1;
    if (c10d_store_tcp_connect("127.0.0.1", store_port, &o, &s) == 0) {
        if (c10d_store_num_keys_sync(s, &n) != 0)
            n = -1;
        c10d_store_release(s);
    }
    c10d_shutdown();
    return n;
}

/* ---------------------------------------------------------------- tests */

static int setup(void **state)
{
    (void)state;
    if (start_server() != 0) {
        stop_server();
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    stop_server();
    return 0;
}

static void back_to_back(int rank0_first)
{
    int failed = 0;
    int64_t keys[JOBS];
    for (int i = 0; i < JOBS; i++) {
        struct job j = {
            .run_id = NULL, .restart_count = -1, .destroy = 1, .rank0_first = rank0_first};
        failed += run_job(&j);
        keys[i] = store_keys();
    }
    printf("back-to-back jobs, %s first: %d of %d failed; keys after each:",
           rank0_first ? "rank 0" : "rank 1", failed, JOBS);
    for (int i = 0; i < JOBS; i++)
        printf(" %lld", (long long)keys[i]);
    printf("\n");
    fflush(stdout);
    assert_int_equal(failed, 0);
    /* What a finished job leaves does not pile up job after job: at most
     * its own keys (a group and its addresses: 8) stay until the next one. */
    assert_true(keys[0] >= 0 && keys[JOBS - 1] >= 0);
    assert_true(keys[JOBS - 1] < keys[0] + 8);
}

/* Groups given the store itself share one set of keys job after job (as
 * torch's would): a rank that reads rank 0's earlier address connects once
 * rank 0 published its new one, since a refused address is read again. */
static void test_stale_address_read_again(void **s)
{
    (void)s;
    int failed = 0;
    for (int i = 0; i < 3; i++) {
        struct job j = {.run_id = NULL, .restart_count = -1, .destroy = 0, .explicit_store = 1};
        failed += run_job(&j);
    }
    printf("explicit store, rank 1 first: %d of 3 failed\n", failed);
    fflush(stdout);
    assert_int_equal(failed, 0);
}

/* What earlier jobs' deaths leave in the handshake (api/attempt.c): rank
 * 1's ticket 1 an ask nobody answered, ticket 2 an ack of another
 * generation, ticket 3 taken but never written (a crash between its ADD and
 * its SET). The job still agrees on a fresh generation. */
static void test_stale_handshake_keys(void **s)
{
    (void)s;
    char run_id[64], key[128];
    snprintf(run_id, sizeof run_id, "stale-%d", (int)getpid());
    c10d_store_tcp_opts o = {.timeout_ms = 5000};
    c10d_store *st = NULL;
    assert_int_equal(c10d_store_tcp_connect("127.0.0.1", store_port, &o, &st), 0);
    int64_t v;
    snprintf(key, sizeof key, "/worker/%s/attempt_0/c10d_ask/1", run_id);
    assert_int_equal(c10d_store_add_sync(st, key, 3, &v), 0);
    snprintf(key, sizeof key, "/worker/%s/attempt_0/c10d_ask/1/1", run_id);
    assert_int_equal(c10d_store_set_sync(st, key, "ask", 3), 0);
    snprintf(key, sizeof key, "/worker/%s/attempt_0/c10d_ask/1/2", run_id);
    assert_int_equal(c10d_store_set_sync(st, key, "ack 7", 5), 0);
    snprintf(key, sizeof key, "/worker/%s/attempt_0/c10d_generation", run_id);
    assert_int_equal(c10d_store_add_sync(st, key, 7, &v), 0);
    c10d_store_release(st);
    c10d_shutdown();
    struct job j = {.run_id = run_id, .restart_count = 0, .destroy = 1};
    int failed = run_job(&j);
    printf("stale handshake keys, rank 1 first: %d of 1 failed\n", failed);
    fflush(stdout);
    assert_int_equal(failed, 0);
}

static void restarts(int rank0_first)
{
    char run_id[64];
    snprintf(run_id, sizeof run_id, "restarts-%d-%d", (int)getpid(), rank0_first);
    int failed = 0;
    /* Attempt 0 crashes after it ran (its keys stay); so do 1 and 2. */
    for (int attempt = 0; attempt <= RESTARTS; attempt++) {
        struct job j = {.run_id = run_id,
                        .restart_count = attempt,
                        .destroy = attempt == RESTARTS,
                        .rank0_first = rank0_first};
        int f = run_job(&j);
        if (attempt > 0)
            failed += f;
    }
    printf("restarts, %s first: %d of %d failed\n", rank0_first ? "rank 0" : "rank 1", failed,
           RESTARTS);
    fflush(stdout);
    assert_int_equal(failed, 0);
}

static void test_back_to_back_rank1_first(void **s)
{
    (void)s;
    back_to_back(0);
}

static void test_back_to_back_rank0_first(void **s)
{
    (void)s;
    back_to_back(1);
}

static void test_restarts_rank1_first(void **s)
{
    (void)s;
    restarts(0);
}

static void test_restarts_rank0_first(void **s)
{
    (void)s;
    restarts(1);
}

int main(void)
{
    if (getenv("C10D_STORE_EXE") == NULL) {
        fprintf(stderr, "C10D_STORE_EXE not set: skipped\n");
        return 77;
    }
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    /* One store process for everything, as a long-lived store. */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_back_to_back_rank1_first),
        cmocka_unit_test(test_back_to_back_rank0_first),
        cmocka_unit_test(test_restarts_rank1_first),
        cmocka_unit_test(test_restarts_rank0_first),
        cmocka_unit_test(test_stale_address_read_again),
        cmocka_unit_test(test_stale_handshake_keys),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
