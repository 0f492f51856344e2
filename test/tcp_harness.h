/* Backend-level multi-process harness for the tcp backend tests: forks N
 * ranks, exchanges their listening addresses over pipes (the store's job in
 * a real group), connects them, runs a body in each, and collects exit
 * statuses. Every child is killed before h_spawn returns, also on failure
 * or timeout. Children report failures on stderr and exit non-zero. */
#ifndef C10D_TEST_TCP_HARNESS_H
#define C10D_TEST_TCP_HARNESS_H

#include "backends/backend.h"
#include "backends/tcp/tcp_backend.h"
#include "engine/loop.h"
#include "engine/work.h"

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

struct h_ctx {
    int rank, size;
    void *state;
    uint64_t seq, p2p_seq;
    int64_t timeout_ms;
};

typedef int (*h_body)(struct h_ctx *h, void *arg);

#define H_FAIL(h, ...)                                                                             \
    do {                                                                                           \
        fprintf(stderr, "[rank %d] %s:%d: ", (h)->rank, __FILE__, __LINE__);                       \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fprintf(stderr, "\n");                                                                     \
        return 1;                                                                                  \
    } while (0)

#define H_CHECK(h, cond, ...)                                                                      \
    do {                                                                                           \
        if (!(cond))                                                                               \
            H_FAIL(h, __VA_ARGS__);                                                                \
    } while (0)

struct h_call {
    void (*fn)(void *arg);
    void *arg;
    uv_sem_t sem;
};

static void h_trampoline(void *p)
{
    struct h_call *c = p;
    c->fn(c->arg);
    uv_sem_post(&c->sem);
}

/* Runs fn(arg) on the engine's loop thread and waits for it. */
static void h_on_loop(void (*fn)(void *), void *arg)
{
    struct h_call c;
    memset(&c, 0, sizeof c);
    c.fn = fn;
    c.arg = arg;
    uv_sem_init(&c.sem, 0);
    if (c10d__engine_call(h_trampoline, &c) != 0) {
        fprintf(stderr, "cannot post to the engine: %s\n", c10d_last_error());
        _exit(3);
    }
    uv_sem_wait(&c.sem);
    uv_sem_destroy(&c.sem);
}

struct h_open_args {
    struct c10d__backend_config cfg;
    void *state;
    const char *address;
    int rc;
    char err[512];
};

static void h_open_fn(void *p)
{
    struct h_open_args *a = p;
    a->rc = c10d__tcp_open(&a->cfg, &a->state, &a->address);
    if (a->rc < 0)
        snprintf(a->err, sizeof a->err, "%s", c10d_last_error());
}

struct h_connect_args {
    void *state;
    const char *const *addrs;
    int rc, status;
    uv_sem_t done;
    char err[512];
};

static void h_connected(void *p, int status)
{
    struct h_connect_args *a = p;
    a->status = status;
    if (status < 0)
        snprintf(a->err, sizeof a->err, "%s", c10d_last_error());
    uv_sem_post(&a->done);
}

static void h_connect_fn(void *p)
{
    struct h_connect_args *a = p;
    a->rc = c10d__tcp_connect(a->state, a->addrs, h_connected, a);
    if (a->rc < 0)
        snprintf(a->err, sizeof a->err, "%s", c10d_last_error());
}

/* Submits op (numbered like the pg would) and returns its work, not waited for. */
static c10d_work *h_submit(struct h_ctx *h, struct c10d__op *op)
{
    c10d_work *w = NULL;
    if (c10d_work_create("tcp test op", h->timeout_ms, &w) != 0)
        return NULL;
    op->work = w;
    op->timeout_ms = h->timeout_ms;
    if (op->kind == C10D_OP_SEND || op->kind == C10D_OP_RECV)
        op->seq = ++h->p2p_seq;
    else
        op->seq = ++h->seq;
    /* Handed over without waiting for it to run, as the process group does. */
    if (c10d__tcp_backend.submit(h->state, op) != 0)
        c10d_work_complete(w, C10D_EABORTED, c10d_last_error());
    return w;
}

/* Runs op to completion; returns its status (message in c10d_last_error()). */
static int h_op(struct h_ctx *h, struct c10d__op *op)
{
    c10d_work *w = h_submit(h, op);
    if (w == NULL)
        return C10D_ENOMEM;
    int rc = c10d_work_wait(w, -1);
    c10d_work_release(w);
    return rc;
}

static struct c10d__op h_op_init(enum c10d__op_kind kind, size_t count, c10d_dtype dtype)
{
    struct c10d__op op;
    memset(&op, 0, sizeof op);
    op.kind = kind;
    op.count = count;
    op.dtype = dtype;
    op.peer = -1;
    return op;
}

static void h_destroy_fn(void *p)
{
    c10d__tcp_backend.destroy(p, NULL, NULL);
}

static int h_read_line(int fd, char *buf, size_t len)
{
    size_t n = 0;
    while (n + 1 < len) {
        ssize_t k = read(fd, buf + n, 1);
        if (k <= 0)
            return -1;
        if (buf[n] == '\n')
            break;
        n++;
    }
    buf[n] = '\0';
    return 0;
}

static int h_child(int rank, int size, int up, int down, h_body body, void *arg, int64_t timeout_ms)
{
    struct h_open_args oa;
    memset(&oa, 0, sizeof oa);
    oa.cfg.rank = rank;
    oa.cfg.size = size;
    oa.cfg.group_name = "test";
    oa.cfg.timeout_ms = 60000;
    h_on_loop(h_open_fn, &oa);
    if (oa.rc < 0) {
        fprintf(stderr, "[rank %d] open failed: %s\n", rank, oa.err);
        return 2;
    }
    char line[256];
    snprintf(line, sizeof line, "%s\n", oa.address);
    if (write(up, line, strlen(line)) < 0)
        return 2;
    char **addrs = calloc((size_t)size, sizeof *addrs);
    for (int r = 0; r < size; r++) {
        if (h_read_line(down, line, sizeof line) < 0)
            return 2;
        addrs[r] = strdup(line);
    }
    struct h_connect_args ca;
    memset(&ca, 0, sizeof ca);
    ca.state = oa.state;
    ca.addrs = (const char *const *)addrs;
    uv_sem_init(&ca.done, 0);
    h_on_loop(h_connect_fn, &ca);
    if (ca.rc < 0) {
        fprintf(stderr, "[rank %d] connect failed: %s\n", rank, ca.err);
        return 2;
    }
    uv_sem_wait(&ca.done);
    if (ca.status < 0) {
        fprintf(stderr, "[rank %d] connect failed: %s\n", rank, ca.err);
        return 2;
    }
    struct h_ctx h = {rank, size, oa.state, 0, 0, timeout_ms};
    /* Everyone connected before any body starts (a body may kill its rank). */
    struct c10d__op b = h_op_init(C10D_OP_BARRIER, 0, C10D_UINT8);
    if (h_op(&h, &b) != 0) {
        fprintf(stderr, "[rank %d] first barrier failed: %s\n", rank, c10d_last_error());
        return 2;
    }
    int rc = body(&h, arg);
    h_on_loop(h_destroy_fn, oa.state);
    for (int r = 0; r < size; r++)
        free(addrs[r]);
    free(addrs);
    c10d_shutdown();
    return rc;
}

/* Forks `size` ranks running body; waits up to timeout_s for all of them.
 * status[r] is the wait status of rank r (-1 if it had to be killed). Ranks
 * set in may_hang are killed once every other rank has exited. Returns 0 if
 * every rank not in may_hang exited 0. */
static int h_spawn(int size, h_body body, void *arg, int timeout_s, int64_t op_timeout_ms,
                   unsigned may_hang, int *status)
{
    pid_t pids[64];
    int ups[64], downs[64];
    fflush(stdout);
    fflush(stderr);
    for (int r = 0; r < size; r++) {
        int up[2], down[2];
        if (pipe(up) != 0 || pipe(down) != 0)
            return -1;
        pid_t pid = fork();
        if (pid == 0) {
            close(up[0]);
            close(down[1]);
            for (int q = 0; q < r; q++) {
                close(ups[q]);
                close(downs[q]);
            }
            alarm((unsigned)timeout_s + 5); /* never outlive the test */
            _exit(h_child(r, size, up[1], down[0], body, arg, op_timeout_ms));
        }
        close(up[1]);
        close(down[0]);
        pids[r] = pid;
        ups[r] = up[0];
        downs[r] = down[1];
        status[r] = -1;
    }
    char lines[64][256];
    int ok = 1;
    for (int r = 0; r < size && ok; r++) {
        if (h_read_line(ups[r], lines[r], sizeof lines[r]) < 0)
            ok = 0;
    }
    for (int r = 0; r < size && ok; r++)
        for (int q = 0; q < size; q++)
            if (dprintf(downs[r], "%s\n", lines[q]) < 0)
                ok = 0;
    struct timespec start;
    clock_gettime(CLOCK_MONOTONIC, &start);
    int left = size, failed = !ok;
    while (left > 0) {
        int live_nonhang = 0;
        for (int r = 0; r < size; r++) {
            if (pids[r] <= 0)
                continue;
            int st;
            pid_t got = waitpid(pids[r], &st, WNOHANG);
            if (got == pids[r]) {
                status[r] = st;
                pids[r] = 0;
                left--;
                if (!(may_hang & (1u << r)) && !(WIFEXITED(st) && WEXITSTATUS(st) == 0))
                    failed = 1;
                continue;
            }
            if (!(may_hang & (1u << r)))
                live_nonhang++;
        }
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        int expired = now.tv_sec - start.tv_sec >= timeout_s;
        if (expired || failed || live_nonhang == 0) {
            if (expired && live_nonhang > 0) {
                fprintf(stderr, "h_spawn: ranks still running after %d s; killing them\n",
                        timeout_s);
                failed = 1;
            }
            for (int r = 0; r < size; r++) {
                if (pids[r] > 0) {
                    kill(pids[r], SIGKILL);
                    kill(pids[r], SIGCONT);
                }
            }
            for (int r = 0; r < size; r++) {
                if (pids[r] > 0) {
                    waitpid(pids[r], &status[r], 0);
                    if (!(may_hang & (1u << r)))
                        failed = 1;
                    pids[r] = 0;
                }
            }
            left = 0;
            break;
        }
        usleep(5000);
    }
    for (int r = 0; r < size; r++) {
        close(ups[r]);
        close(downs[r]);
        if (failed && !(may_hang & (1u << r)))
            fprintf(stderr, "h_spawn: rank %d: %s %d\n", r,
                    status[r] == -1          ? "not started"
                    : WIFSIGNALED(status[r]) ? "killed by signal"
                                             : "exit code",
                    WIFSIGNALED(status[r]) ? WTERMSIG(status[r]) : WEXITSTATUS(status[r]));
    }
    return failed ? -1 : 0;
}

#endif
