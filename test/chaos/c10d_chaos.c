/* c10d_chaos: a fault campaign against real rank processes, and the rank
 * program the network-namespace test runs.
 *
 *   c10d_chaos campaign [options]   N trials: 4 ranks in one tcp group stream
 *                                   checked all_reduces; at a seeded moment one
 *                                   rank is SIGKILLed or SIGSTOPped; every
 *                                   survivor must exit "errored" within a bound.
 *   c10d_chaos rank [options]       one rank (env:// rendezvous): the stream of
 *                                   all_reduces, results verified, until an op
 *                                   fails, a stop is agreed, or --ops is reached.
 *
 * Rank exit codes (the driver and netns_test.sh rely on them):
 *   0  every op done and verified (only with --ops, or after an agreed stop)
 *   10 an op failed with a c10d status (printed with its message)
 *   11 an op completed with a wrong result
 *   12 init (rendezvous, connection) failed
 *   2  usage
 * See docs/faults.md. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "c10d.h"

#include "test/free_port.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define EX_USAGE   2
#define EX_ERRORED 10
#define EX_WRONG   11
#define EX_INIT    12

#define MAX_RANKS 16

/* ------------------------------------------------------------- helpers */

static int64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* splitmix64: every rank seeded alike draws the same sizes. */
static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static long parse_long(const char *opt, const char *s, long lo, long hi)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi) {
        fprintf(stderr, "c10d_chaos: bad value for %s: '%s' (%ld..%ld)\n", opt, s, lo, hi);
        exit(EX_USAGE);
    }
    return v;
}

/* ----------------------------------------------------------------- rank */

static const size_t k_sizes[] = {4, 4096, 65536, 1u << 20, 8u << 20};
#define NSIZES (sizeof k_sizes / sizeof k_sizes[0])

/* Small integers: every partial sum is exact in float32 whatever the
 * reduction order, so a result is either right to the bit or wrong. Depends on
 * the op index too, so a stale buffer from an earlier op does not pass. */
static inline uint32_t contrib(uint32_t r, uint32_t i, uint32_t k)
{
    uint32_t h = i * 2654435761u + k * 40503u + r * 2246822519u;
    return ((h >> 13) & 255u) + 1u;
}

static volatile sig_atomic_t g_stop_requested;

static void on_usr1(int sig)
{
    (void)sig;
    g_stop_requested = 1;
}

struct rank_cfg {
    uint64_t seed;
    int64_t timeout_ms;
    long ops; /* 0: until an op fails or a stop is agreed */
    size_t max_bytes;
    const char *stop_file;
    int report_fd; /* -1: none */
};

/* One line to the driver; shorter than PIPE_BUF, so ranks sharing the pipe
 * never interleave. */
static void report(int fd, const char *fmt, ...)
{
    if (fd < 0)
        return;
    char line[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n > 0 && (size_t)n < sizeof line) {
        ssize_t w = write(fd, line, (size_t)n);
        (void)w;
    }
}

static int rank_fail(const struct rank_cfg *c, c10d_pg *pg, int rank, long op, size_t bytes, int rc)
{
    int64_t t = mono_ns();
    printf("chaos-rank %d: ERRORED op=%ld bytes=%zu status=%s wall_ms=%" PRId64 " msg=%s\n", rank,
           op, bytes, c10d_status_name(rc), wall_ms(), c10d_last_error());
    fflush(stdout);
    report(c->report_fd, "%d err %" PRId64 " %ld %s\n", rank, t, op, c10d_status_name(rc));
    /* What a real program does next: abort the group and leave. If either
     * hangs, the driver sees a late exit after an early "err". */
    if (pg != NULL)
        c10d_pg_abort(pg, "chaos: op failed");
    c10d_shutdown();
    return EX_ERRORED;
}

static int rank_main(const struct rank_cfg *c)
{
    const char *rs = getenv("RANK");
    int rank = rs != NULL ? atoi(rs) : -1;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sigaction(SIGUSR1, &sa, NULL);
    setvbuf(stdout, NULL, _IOLBF, 0);

    c10d_pg_opts po = {0};
    po.timeout_ms = c->timeout_ms;
    po.group_desc = "chaos";
    c10d_pg *pg = NULL;
    int rc = c10d_pg_init(&po, &pg);
    if (rc == 0) {
        rank = c10d_pg_rank(pg);
        rc = c10d_barrier_sync(pg);
    }
    if (rc != 0) {
        printf("chaos-rank %d: INIT-FAILED status=%s msg=%s\n", rank, c10d_status_name(rc),
               c10d_last_error());
        report(c->report_fd, "%d initfail %" PRId64 " 0 %s\n", rank, mono_ns(),
               c10d_status_name(rc));
        if (pg != NULL)
            c10d_pg_abort(pg, "chaos: init failed");
        c10d_shutdown();
        return EX_INIT;
    }
    int n = c10d_pg_size(pg);
    printf("chaos-rank %d/%d: ready wall_ms=%" PRId64 "\n", rank, n, wall_ms());
    report(c->report_fd, "%d ready %" PRId64 " 0 -\n", rank, mono_ns());

    size_t nsizes = 0;
    while (nsizes < NSIZES && k_sizes[nsizes] <= c->max_bytes)
        nsizes++;
    if (nsizes == 0)
        nsizes = 1;
    /* One extra element carries the stop vote (see below). */
    float *buf = malloc(k_sizes[nsizes - 1] + sizeof(float));
    if (buf == NULL) {
        fprintf(stderr, "chaos-rank %d: out of memory\n", rank);
        return EX_INIT;
    }
    uint64_t rs_state = c->seed;
    long op = 0;
    int64_t max_op_ns = 0; /* evidence that a partition stalled an op in flight */
    for (; c->ops == 0 || op < c->ops; op++) {
        size_t bytes = k_sizes[rng_next(&rs_state) % nsizes];
        size_t count = bytes / sizeof(float);
        for (size_t i = 0; i < count; i++)
            buf[i] = (float)contrib((uint32_t)rank, (uint32_t)i, (uint32_t)op);
        /* The stop vote: a rank told to stop (signal or file) votes 1. Every
         * rank sees the same sum, so all stop after the same op, and a stop
         * never leaves a peer waiting in an op nobody else joins. */
        int want_stop =
            g_stop_requested || (c->stop_file != NULL && access(c->stop_file, F_OK) == 0);
        buf[count] = want_stop ? 1.0f : 0.0f;
        int64_t t_op = mono_ns();
        rc = c10d_all_reduce_sync(pg, buf, buf, count + 1, C10D_FLOAT32, C10D_SUM);
        t_op = mono_ns() - t_op;
        if (t_op > max_op_ns)
            max_op_ns = t_op;
        if (rc != 0) {
            int ex = rank_fail(c, pg, rank, op, bytes, rc);
            free(buf);
            return ex;
        }
        for (size_t i = 0; i < count; i++) {
            uint32_t want = 0;
            for (int r = 0; r < n; r++)
                want += contrib((uint32_t)r, (uint32_t)i, (uint32_t)op);
            if (buf[i] != (float)want) {
                printf("chaos-rank %d: WRONG op=%ld bytes=%zu element %zu = %.1f, expected %u "
                       "wall_ms=%" PRId64 "\n",
                       rank, op, bytes, i, (double)buf[i], want, wall_ms());
                report(c->report_fd, "%d wrong %" PRId64 " %ld -\n", rank, mono_ns(), op);
                free(buf);
                c10d_pg_abort(pg, "chaos: wrong result");
                c10d_shutdown();
                return EX_WRONG;
            }
        }
        if (buf[count] < 0.0f || buf[count] > (float)n || buf[count] != (float)(int)buf[count]) {
            printf("chaos-rank %d: WRONG op=%ld stop vote %.1f\n", rank, op, (double)buf[count]);
            report(c->report_fd, "%d wrong %" PRId64 " %ld -\n", rank, mono_ns(), op);
            free(buf);
            c10d_pg_abort(pg, "chaos: wrong result");
            c10d_shutdown();
            return EX_WRONG;
        }
        if (buf[count] > 0.0f) {
            op++;
            break;
        }
    }
    free(buf);
    printf("chaos-rank %d: DONE ops=%ld max_op_ms=%" PRId64 " wall_ms=%" PRId64 "\n", rank, op,
           max_op_ns / 1000000, wall_ms());
    report(c->report_fd, "%d done %" PRId64 " %ld -\n", rank, mono_ns(), op);
    rc = c10d_pg_destroy(pg);
    c10d_shutdown();
    if (rc != 0) {
        printf("chaos-rank %d: destroy failed: %s\n", rank, c10d_status_name(rc));
        return EX_ERRORED;
    }
    return 0;
}

/* ------------------------------------------------------------- campaign */

enum fault { FAULT_KILL = 0, FAULT_STOP = 1 };
static const char *const k_fault_names[] = {"kill", "stop"};

struct campaign_cfg {
    int trials;
    uint64_t seed;
    int nranks;
    int64_t timeout_ms;
    int fault;  /* -1: by seed */
    int victim; /* -1: by seed */
    int store;  /* 0 embedded, 1 external, -1 by seed */
    const char *store_exe;
    int64_t min_fault_ms, max_fault_ms;
    int64_t kill_bound_ms;  /* survivors of a kill -9 exit within this */
    int64_t stop_slack_ms;  /* survivors of a SIGSTOP exit within T + this */
    int64_t hang_slack_ms;  /* after T + this nothing is left running: HANG */
    int64_t ready_bound_ms; /* init + barrier of every rank */
    size_t max_bytes;
    int keep_logs;
    int verbose;
    const char *self;
};

/* What the signal handler must kill if the driver is interrupted. */
static volatile pid_t g_pgid;
static volatile pid_t g_store_pid;
/* The trial's log files and their directory (unlink and rmdir are
 * async-signal-safe): an interrupted run leaves nothing behind. */
static char g_paths[MAX_RANKS + 1][PATH_MAX];
static char g_dir[PATH_MAX];
static volatile int g_npaths;

static void on_term(int sig)
{
    if (g_pgid > 0)
        kill(-g_pgid, SIGKILL);
    if (g_store_pid > 0)
        kill(g_store_pid, SIGKILL);
    for (int i = 0; i < g_npaths; i++)
        unlink(g_paths[i]);
    if (g_npaths > 0)
        rmdir(g_dir);
    signal(sig, SIG_DFL);
    raise(sig);
}

struct rank_state {
    pid_t pid;
    int alive;
    int status;      /* waitpid's */
    int64_t exit_ns; /* when reaped */
    int64_t err_ns;  /* the rank's own "err" report; 0: none */
    char what[16];   /* last report: ready, err, wrong, done, initfail */
    char status_name[32];
    long op;
    int ready;
};

static void drain_reports(int fd, struct rank_state *rs, int n)
{
    static char acc[8192];
    static size_t len;
    for (;;) {
        ssize_t r = read(fd, acc + len, sizeof acc - 1 - len);
        if (r <= 0)
            break;
        len += (size_t)r;
        acc[len] = '\0';
        char *line = acc, *nl;
        while ((nl = strchr(line, '\n')) != NULL) {
            *nl = '\0';
            int rk;
            int64_t t;
            long op;
            char what[16], st[32];
            if (sscanf(line, "%d %15s %" SCNd64 " %ld %31s", &rk, what, &t, &op, st) == 5 &&
                rk >= 0 && rk < n) {
                snprintf(rs[rk].what, sizeof rs[rk].what, "%s", what);
                if (strcmp(what, "ready") == 0) {
                    rs[rk].ready = 1;
                } else {
                    rs[rk].op = op;
                    if (strcmp(what, "err") == 0) {
                        rs[rk].err_ns = t;
                        snprintf(rs[rk].status_name, sizeof rs[rk].status_name, "%s", st);
                    }
                }
            }
            line = nl + 1;
        }
        len = strlen(line);
        memmove(acc, line, len);
    }
}

/* Reaps whatever exited; returns how many of the ranks are still alive. */
static int reap(struct rank_state *rs, int n)
{
    int left = 0;
    for (int r = 0; r < n; r++) {
        if (!rs[r].alive)
            continue;
        int st;
        pid_t p = waitpid(rs[r].pid, &st, WNOHANG);
        if (p == rs[r].pid) {
            rs[r].alive = 0;
            rs[r].status = st;
            rs[r].exit_ns = mono_ns();
        } else {
            left++;
        }
    }
    return left;
}

static void sleep_ms(int64_t ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

static pid_t start_store(const struct campaign_cfg *c, int port, const char *log)
{
    char ports[16];
    snprintf(ports, sizeof ports, "%d", port);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        execl(c->store_exe, c->store_exe, "serve", "--host", "127.0.0.1", "--port", ports,
              (char *)NULL);
        _exit(127);
    }
    g_store_pid = pid;
    for (int i = 0; i < 500; i++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a;
        memset(&a, 0, sizeof a);
        a.sin_family = AF_INET;
        a.sin_port = htons((uint16_t)port);
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        int ok = connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
        close(fd);
        if (ok)
            return pid;
        if (waitpid(pid, NULL, WNOHANG) == pid) {
            g_store_pid = 0;
            return -1;
        }
        sleep_ms(10);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    g_store_pid = 0;
    return -1;
}

static void print_log_tail(const char *path, int lines)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return;
    char ring[16][512];
    int count = 0;
    while (fgets(ring[count % 16], sizeof ring[0], f) != NULL)
        count++;
    fclose(f);
    if (lines > 16)
        lines = 16;
    int first = count > lines ? count - lines : 0;
    for (int i = first; i < count; i++)
        printf("    | %s%s", ring[i % 16], strchr(ring[i % 16], '\n') ? "" : "\n");
}

struct trial_result {
    int fault;
    int pass;
    int hang;
    double worst_exit_ms; /* the last survivor's exit after the fault */
    double worst_err_ms;  /* the last survivor's own error report after the fault */
};

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void run_trial(const struct campaign_cfg *c, int trial, struct trial_result *out)
{
    uint64_t seed = c->seed + (uint64_t)trial;
    uint64_t rng = seed ^ 0x5deece66dull;
    int n = c->nranks;
    /* Kind and victim cycle with the seed, so a run covers every (kind,
     * victim) pair, rank 0 (the store's host) included; the rest is drawn. */
    int fault = c->fault >= 0 ? c->fault : (int)(seed & 1);
    int victim = c->victim >= 0 ? c->victim : (int)((seed >> 1) % (uint64_t)n);
    int64_t span = c->max_fault_ms - c->min_fault_ms;
    int64_t delay_ms =
        c->min_fault_ms + (span > 0 ? (int64_t)(rng_next(&rng) % (uint64_t)span) : 0);
    int external = c->store >= 0 ? c->store : (int)((rng_next(&rng) >> 7) & 1);
    if (external && c->store_exe == NULL)
        external = 0;

    memset(out, 0, sizeof *out);
    out->fault = fault;
    char dir[] = "/tmp/c10d_chaos.XXXXXX";
    if (mkdtemp(dir) == NULL) {
        perror("mkdtemp");
        exit(1);
    }
    char(*path)[PATH_MAX] = g_paths;
    g_npaths = 0;
    snprintf(g_dir, sizeof g_dir, "%s", dir);
    for (int r = 0; r < n; r++)
        snprintf(path[r], sizeof path[r], "%s/rank%d.log", dir, r);
    snprintf(path[n], sizeof path[n], "%s/store.log", dir);
    g_npaths = n + 1;

    int port = test_free_port();
    pid_t store = -1;
    if (external) {
        store = start_store(c, port, path[n]);
        if (store < 0) {
            printf("trial %d seed %" PRIu64 ": could not start %s\n", trial, seed, c->store_exe);
            exit(1);
        }
    }
    int pfd[2];
    if (pipe2(pfd, O_CLOEXEC) != 0) {
        perror("pipe");
        exit(1);
    }
    fcntl(pfd[0], F_SETFL, O_NONBLOCK);

    char seeds[32], tos[32], maxb[32];
    snprintf(seeds, sizeof seeds, "%" PRIu64, seed);
    snprintf(tos, sizeof tos, "%" PRId64, c->timeout_ms);
    snprintf(maxb, sizeof maxb, "%zu", c->max_bytes);

    struct rank_state rs[MAX_RANKS];
    memset(rs, 0, sizeof rs);
    fflush(NULL);
    pid_t pgid = 0;
    for (int r = 0; r < n; r++) {
        pid_t pid = fork();
        if (pid < 0) {
            perror("fork");
            if (pgid > 0)
                kill(-pgid, SIGKILL);
            exit(1);
        }
        if (pid == 0) {
            /* One process group per trial: one kill(-pgid) takes them all. */
            setpgid(0, pgid);
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            int fd = open(path[r], O_WRONLY | O_CREAT | O_TRUNC, 0644);
            if (fd >= 0) {
                dup2(fd, 1);
                dup2(fd, 2);
                close(fd);
            }
            /* The report pipe as fd 3, without close-on-exec (dup2 clears it,
             * except when the pipe already is fd 3). */
            if (pfd[1] == 3)
                fcntl(3, F_SETFD, 0);
            else
                dup2(pfd[1], 3);
            /* A real program does not ignore SIGPIPE: neither do the ranks. */
            signal(SIGPIPE, SIG_DFL);
            char env[64];
            setenv("MASTER_ADDR", "127.0.0.1", 1);
            snprintf(env, sizeof env, "%d", port);
            setenv("MASTER_PORT", env, 1);
            snprintf(env, sizeof env, "%d", r);
            setenv("RANK", env, 1);
            setenv("LOCAL_RANK", env, 1);
            snprintf(env, sizeof env, "%d", n);
            setenv("WORLD_SIZE", env, 1);
            setenv("LOCAL_WORLD_SIZE", env, 1);
            setenv("TORCHELASTIC_USE_AGENT_STORE", external ? "True" : "False", 1);
            execl(c->self, c->self, "rank", "--seed", seeds, "--timeout-ms", tos, "--max-bytes",
                  maxb, "--report-fd", "3", (char *)NULL);
            _exit(127);
        }
        if (pgid == 0)
            pgid = pid;
        setpgid(pid, pgid); /* also from here: no race with the first kill */
        g_pgid = pgid;
        rs[r].pid = pid;
        rs[r].alive = 1;
    }
    close(pfd[1]);

    const char *verdict = NULL;
    char why[512] = "";
    size_t wl = 0;
#define WHY(...)                                                                                   \
    do {                                                                                           \
        if (wl < sizeof why)                                                                       \
            wl += (size_t)snprintf(why + wl, sizeof why - wl, __VA_ARGS__);                        \
    } while (0)

    /* 1. every rank ready (init + a barrier) */
    int64_t t0 = mono_ns(), deadline = t0 + c->ready_bound_ms * 1000000;
    int nready = 0;
    while (nready < n) {
        drain_reports(pfd[0], rs, n);
        nready = 0;
        for (int r = 0; r < n; r++)
            nready += rs[r].ready;
        int left = reap(rs, n);
        if (left < n || mono_ns() > deadline)
            break;
        if (nready < n)
            sleep_ms(1);
    }
    int64_t t_fault = 0;
    if (nready < n) {
        verdict = "SETUP";
        WHY(" only %d of %d ranks ready", nready, n);
    } else {
        /* 2. the stream runs; nothing may exit before the fault */
        int64_t t_ready = mono_ns(), when = t_ready + delay_ms * 1000000;
        while (mono_ns() < when) {
            if (reap(rs, n) < n)
                break;
            sleep_ms(1);
        }
        if (reap(rs, n) < n) {
            drain_reports(pfd[0], rs, n);
            verdict = "PREFAULT";
            for (int r = 0; r < n; r++)
                if (!rs[r].alive)
                    WHY(" rank %d exited before the fault (%s %s)", r, rs[r].what,
                        rs[r].status_name);
        } else {
            /* 3. the fault */
            kill(rs[victim].pid, fault == FAULT_KILL ? SIGKILL : SIGSTOP);
            t_fault = mono_ns();
            int64_t bound_ms =
                fault == FAULT_KILL ? c->kill_bound_ms : c->timeout_ms + c->stop_slack_ms;
            int64_t hard = t_fault + (c->timeout_ms + c->hang_slack_ms) * 1000000;
            for (;;) {
                reap(rs, n);
                drain_reports(pfd[0], rs, n);
                int survivors_left = 0;
                for (int r = 0; r < n; r++)
                    if (r != victim && rs[r].alive)
                        survivors_left++;
                if (survivors_left == 0 || mono_ns() > hard)
                    break;
                sleep_ms(1);
            }
            /* 4. verdicts of the survivors */
            int hung = 0;
            for (int r = 0; r < n; r++) {
                if (r == victim)
                    continue;
                if (rs[r].alive) {
                    hung = 1;
                    WHY(" rank %d still running after %" PRId64 " ms (last: %s)", r,
                        c->timeout_ms + c->hang_slack_ms, rs[r].what[0] ? rs[r].what : "-");
                    continue;
                }
                double ms = (double)(rs[r].exit_ns - t_fault) / 1e6;
                if (ms > out->worst_exit_ms)
                    out->worst_exit_ms = ms;
                if (rs[r].err_ns > 0 && (double)(rs[r].err_ns - t_fault) / 1e6 > out->worst_err_ms)
                    out->worst_err_ms = (double)(rs[r].err_ns - t_fault) / 1e6;
                int st = rs[r].status;
                if (WIFSIGNALED(st)) {
                    WHY(" rank %d CRASH signal %d", r, WTERMSIG(st));
                    if (verdict == NULL)
                        verdict = "CRASH";
                } else if (WEXITSTATUS(st) == EX_WRONG) {
                    WHY(" rank %d WRONG result at op %ld", r, rs[r].op);
                    verdict = "WRONG";
                } else if (WEXITSTATUS(st) == 0) {
                    WHY(" rank %d exited 0 mid-stream", r);
                    if (verdict == NULL)
                        verdict = "EXIT0";
                } else if (WEXITSTATUS(st) != EX_ERRORED) {
                    WHY(" rank %d exit %d", r, WEXITSTATUS(st));
                    if (verdict == NULL)
                        verdict = "EXIT";
                } else if (strcmp(rs[r].status_name, "C10D_ECLOSED") != 0 &&
                           strcmp(rs[r].status_name, "C10D_ETIMEDOUT") != 0 &&
                           strcmp(rs[r].status_name, "C10D_EABORTED") != 0) {
                    WHY(" rank %d unexpected status %s", r, rs[r].status_name);
                    if (verdict == NULL)
                        verdict = "STATUS";
                } else if (ms > (double)bound_ms) {
                    WHY(" rank %d exited %.0f ms after the fault (bound %" PRId64 ")", r, ms,
                        bound_ms);
                    if (verdict == NULL)
                        verdict = "SLOW";
                }
            }
            if (hung) {
                verdict = "HANG";
                out->hang = 1;
                /* Where they are stuck, before they go. */
                for (int r = 0; r < n; r++) {
                    if (r == victim || !rs[r].alive)
                        continue;
                    char wpath[64], wchan[64] = "?";
                    snprintf(wpath, sizeof wpath, "/proc/%d/wchan", (int)rs[r].pid);
                    FILE *f = fopen(wpath, "r");
                    if (f != NULL) {
                        if (fgets(wchan, sizeof wchan, f) == NULL)
                            snprintf(wchan, sizeof wchan, "?");
                        fclose(f);
                    }
                    WHY(" [rank %d wchan %s]", r, wchan);
                }
            }
        }
    }
    /* 5. nothing outlives the trial: the stopped victim, a hung rank, all */
    kill(-pgid, SIGKILL);
    for (int r = 0; r < n; r++) {
        if (rs[r].alive) {
            int st;
            waitpid(rs[r].pid, &st, 0);
            rs[r].alive = 0;
            rs[r].status = st;
            rs[r].exit_ns = mono_ns();
        }
    }
    g_pgid = 0;
    close(pfd[0]);
    if (store > 0) {
        kill(store, SIGKILL);
        waitpid(store, NULL, 0);
        g_store_pid = 0;
    }
    if (verdict == NULL)
        verdict = "PASS";
    out->pass = strcmp(verdict, "PASS") == 0;

    printf("trial %3d seed %-6" PRIu64 " fault=%s victim=%d store=%s t_fault=%4" PRId64 "ms |",
           trial, seed, k_fault_names[fault], victim, external ? "ext" : "emb", delay_ms);
    for (int r = 0; r < n; r++) {
        int st = rs[r].status;
        char code[16];
        if (WIFSIGNALED(st))
            snprintf(code, sizeof code, "sig%d", WTERMSIG(st));
        else
            snprintf(code, sizeof code, "%d", WEXITSTATUS(st));
        if (r == victim || t_fault == 0) {
            printf(" r%d:%s%s", r, code, r == victim ? "(victim)" : "");
            continue;
        }
        const char *sn = rs[r].status_name[0] ? rs[r].status_name + 5 : "-"; /* drop "C10D_" */
        printf(" r%d:%s %s op%ld err=%.0f exit=%.0fms", r, code, sn, rs[r].op,
               rs[r].err_ns > 0 ? (double)(rs[r].err_ns - t_fault) / 1e6 : -1.0,
               (double)(rs[r].exit_ns - t_fault) / 1e6);
    }
    printf(" | %s%s\n", verdict, why);
    if (!out->pass || c->verbose) {
        for (int r = 0; r <= n; r++) {
            if (r == n && store <= 0)
                break;
            printf("  %s:\n", path[r]);
            print_log_tail(path[r], 6);
        }
    }
    fflush(stdout);
    g_npaths = 0;
    if (out->pass || !c->keep_logs) {
        for (int r = 0; r <= n; r++)
            unlink(path[r]);
        rmdir(dir);
    } else {
        printf("  logs kept in %s\n", dir);
    }
}

static void usage(void)
{
    fprintf(
        stderr,
        "usage: c10d_chaos campaign [--trials N] [--seed S] [--ranks N] [--timeout-ms T]\n"
        "           [--fault kill|stop|mixed] [--victim R] [--store embedded|external|mixed]\n"
        "           [--store-exe PATH] [--fault-window MIN_MS MAX_MS] [--kill-bound-ms B]\n"
        "           [--stop-slack-ms S] [--hang-slack-ms H] [--max-bytes B] [--keep-logs] [-v]\n"
        "       c10d_chaos rank [--seed S] [--timeout-ms T] [--ops N] [--max-bytes B]\n"
        "           [--stop-file PATH] [--report-fd FD]   (env:// rendezvous)\n");
    exit(EX_USAGE);
}

static int campaign_main(int argc, char **argv)
{
    struct campaign_cfg c = {0};
    c.trials = 10;
    c.seed = 1;
    c.nranks = 4;
    c.timeout_ms = 3000;
    c.fault = -1;
    c.victim = -1;
    c.store = -1;
    c.store_exe = getenv("C10D_STORE_EXE");
    c.min_fault_ms = 50;
    c.max_fault_ms = 1500;
    c.kill_bound_ms = 1000;
    c.stop_slack_ms = 2000;
    c.hang_slack_ms = 10000;
    c.ready_bound_ms = 60000;
    c.max_bytes = 8u << 20;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define ARG(name) (strcmp(a, name) == 0 && v != NULL && ++i)
        if (ARG("--trials"))
            c.trials = (int)parse_long(a, v, 1, 1000000);
        else if (ARG("--seed"))
            c.seed = (uint64_t)parse_long(a, v, 0, LONG_MAX / 2);
        else if (ARG("--ranks"))
            c.nranks = (int)parse_long(a, v, 2, MAX_RANKS);
        else if (ARG("--timeout-ms"))
            c.timeout_ms = parse_long(a, v, 100, 3600000);
        else if (ARG("--fault"))
            c.fault = strcmp(v, "kill") == 0    ? FAULT_KILL
                      : strcmp(v, "stop") == 0  ? FAULT_STOP
                      : strcmp(v, "mixed") == 0 ? -1
                                                : (usage(), 0);
        else if (ARG("--victim"))
            c.victim = (int)parse_long(a, v, 0, MAX_RANKS - 1);
        else if (ARG("--store"))
            c.store = strcmp(v, "embedded") == 0   ? 0
                      : strcmp(v, "external") == 0 ? 1
                      : strcmp(v, "mixed") == 0    ? -1
                                                   : (usage(), 0);
        else if (ARG("--store-exe"))
            c.store_exe = v;
        else if (strcmp(a, "--fault-window") == 0 && i + 2 < argc) {
            c.min_fault_ms = parse_long(a, argv[i + 1], 0, 600000);
            c.max_fault_ms = parse_long(a, argv[i + 2], c.min_fault_ms, 600000);
            i += 2;
        } else if (ARG("--kill-bound-ms"))
            c.kill_bound_ms = parse_long(a, v, 1, 3600000);
        else if (ARG("--stop-slack-ms"))
            c.stop_slack_ms = parse_long(a, v, 0, 3600000);
        else if (ARG("--hang-slack-ms"))
            c.hang_slack_ms = parse_long(a, v, 0, 3600000);
        else if (ARG("--max-bytes"))
            c.max_bytes = (size_t)parse_long(a, v, 4, 1L << 30);
        else if (strcmp(a, "--keep-logs") == 0)
            c.keep_logs = 1;
        else if (strcmp(a, "-v") == 0)
            c.verbose = 1;
        else
            usage();
#undef ARG
    }
    if (c.victim >= c.nranks)
        usage();
    if (c.store == 1 && (c.store_exe == NULL || access(c.store_exe, X_OK) != 0)) {
        fprintf(stderr, "c10d_chaos: --store external needs --store-exe or $C10D_STORE_EXE\n");
        return EX_USAGE;
    }
    if (c.store_exe != NULL && access(c.store_exe, X_OK) != 0)
        c.store_exe = NULL;
    static char self[PATH_MAX];
    ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
    if (sl <= 0) {
        perror("readlink /proc/self/exe");
        return 1;
    }
    self[sl] = '\0';
    c.self = self;

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_term;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    setvbuf(stdout, NULL, _IOLBF, 0);

    printf("c10d_chaos campaign: %d trials, seeds %" PRIu64 "..%" PRIu64 ", %d ranks, T=%" PRId64
           " ms, fault in [%" PRId64 ", %" PRId64 "] ms after ready; bounds: kill %" PRId64
           " ms, stop T+%" PRId64 " ms, hang T+%" PRId64 " ms; store %s\n",
           c.trials, c.seed, c.seed + (uint64_t)c.trials - 1, c.nranks, c.timeout_ms,
           c.min_fault_ms, c.max_fault_ms, c.kill_bound_ms, c.stop_slack_ms, c.hang_slack_ms,
           c.store == 0   ? "embedded"
           : c.store == 1 ? "external"
           : c.store_exe  ? "mixed"
                          : "embedded (no c10d-store)");
    struct trial_result *res = calloc((size_t)c.trials, sizeof *res);
    if (res == NULL)
        return 1;
    int passed = 0, hangs = 0;
    for (int t = 0; t < c.trials; t++) {
        run_trial(&c, t, &res[t]);
        passed += res[t].pass;
        hangs += res[t].hang;
    }
    printf("summary: trials %d passed %d failed %d hangs %d", c.trials, passed, c.trials - passed,
           hangs);
    for (int k = 0; k < 2; k++) {
        double *v = calloc((size_t)c.trials, sizeof *v), *e = calloc((size_t)c.trials, sizeof *e);
        int m = 0;
        for (int t = 0; t < c.trials; t++) {
            if (res[t].fault == k && !res[t].hang && res[t].worst_exit_ms > 0) {
                v[m] = res[t].worst_exit_ms;
                e[m] = res[t].worst_err_ms;
                m++;
            }
        }
        if (m > 0) {
            qsort(v, (size_t)m, sizeof *v, cmp_double);
            qsort(e, (size_t)m, sizeof *e, cmp_double);
            printf(" | %s (%d): all survivors exited max %.0f median %.0f ms, errored max %.0f "
                   "median %.0f ms",
                   k_fault_names[k], m, v[m - 1], v[m / 2], e[m - 1], e[m / 2]);
        }
        free(v);
        free(e);
    }
    printf("\n");
    free(res);
    return passed == c.trials ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        usage();
    if (strcmp(argv[1], "campaign") == 0)
        return campaign_main(argc, argv);
    if (strcmp(argv[1], "rank") != 0)
        usage();
    struct rank_cfg c = {0};
    c.seed = 1;
    c.timeout_ms = 3000;
    c.max_bytes = 8u << 20;
    c.report_fd = -1;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (i + 1 >= argc)
            usage();
        const char *v = argv[++i];
        if (strcmp(a, "--seed") == 0)
            c.seed = (uint64_t)parse_long(a, v, 0, LONG_MAX);
        else if (strcmp(a, "--timeout-ms") == 0)
            c.timeout_ms = parse_long(a, v, 1, 3600000);
        else if (strcmp(a, "--ops") == 0)
            c.ops = parse_long(a, v, 0, LONG_MAX);
        else if (strcmp(a, "--max-bytes") == 0)
            c.max_bytes = (size_t)parse_long(a, v, 4, 1L << 30);
        else if (strcmp(a, "--stop-file") == 0)
            c.stop_file = v;
        else if (strcmp(a, "--report-fd") == 0)
            c.report_fd = (int)parse_long(a, v, 0, 1024);
        else
            usage();
    }
    return rank_main(&c);
}
