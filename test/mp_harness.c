#include "mp_harness.h"
#include "free_port.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <execinfo.h>
#include <fcntl.h>
#include <stdio.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int mp_free_port(void)
{
    return test_free_port();
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void set_env_int(const char *name, int v)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%d", v);
    setenv(name, buf, 1);
}

static void kill_all(struct mp_result *res, int n, const int *alive)
{
    for (int i = 0; i < n; i++)
        if (alive[i] && res->pids[i] > 0)
            kill(res->pids[i], SIGKILL);
}

/* A rank that overran its alarm says where it was before it dies: the
 * interrupted thread's stack, and every thread's state and kernel wait
 * point, so a rare hang in CI leaves something to read. */
static void overran(int sig)
{
    (void)sig;
    char line[160];
    int n = snprintf(line, sizeof line, "[rank pid %d] overran its alarm; stack:\n", (int)getpid());
    (void)!write(STDERR_FILENO, line, (size_t)n);
    void *frames[64];
    backtrace_symbols_fd(frames, backtrace(frames, 64), STDERR_FILENO);
    DIR *d = opendir("/proc/self/task");
    struct dirent *e;
    while (d != NULL && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char path[300], buf[256] = "", wchan[64] = "";
        snprintf(path, sizeof path, "/proc/self/task/%s/stat", e->d_name);
        int fd = open(path, O_RDONLY);
        if (fd >= 0) {
            ssize_t k = read(fd, buf, sizeof buf - 1);
            buf[k > 0 ? k : 0] = 0;
            close(fd);
        }
        snprintf(path, sizeof path, "/proc/self/task/%s/wchan", e->d_name);
        fd = open(path, O_RDONLY);
        if (fd >= 0) {
            ssize_t k = read(fd, wchan, sizeof wchan - 1);
            wchan[k > 0 ? k : 0] = 0;
            close(fd);
        }
        n = snprintf(line, sizeof line, "  thread %s wchan=%s stat=%.80s\n", e->d_name, wchan, buf);
        (void)!write(STDERR_FILENO, line, (size_t)n);
    }
    _exit(128 + SIGALRM);
}

int mp_run(const struct mp_opts *o, mp_rank_fn fn, void *arg, struct mp_result *res)
{
    int n = o->nranks;
    memset(res, 0, sizeof *res);
    if (n <= 0 || n > MP_MAX_RANKS)
        return -1;
    int port = o->external_store_port > 0 ? o->external_store_port : mp_free_port();
    if (port <= 0)
        return -1;
    int alive[MP_MAX_RANKS] = {0};
    fflush(NULL);
    for (int r = 0; r < n; r++) {
        pid_t pid = fork();
        if (pid < 0) {
            kill_all(res, r, alive);
            for (int i = 0; i < r; i++)
                waitpid(res->pids[i], NULL, 0);
            return -1;
        }
        if (pid == 0) {
            setenv("MASTER_ADDR", "127.0.0.1", 1);
            set_env_int("MASTER_PORT", port);
            set_env_int("RANK", r);
            set_env_int("LOCAL_RANK", r);
            set_env_int("WORLD_SIZE", n);
            set_env_int("LOCAL_WORLD_SIZE", n);
            setenv("TORCHELASTIC_USE_AGENT_STORE", o->external_store_port > 0 ? "True" : "False",
                   1);
            signal(SIGALRM, overran);
            alarm((unsigned)o->timeout_s);
            int code = fn(r, n, arg);
            fflush(NULL);
            _exit(code);
        }
        res->pids[r] = pid;
        alive[r] = 1;
    }
    double deadline = now_s() + o->timeout_s + 5;
    int left = n, exited = 0, failed = 0;
    while (left > 0) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid < 0 && errno != EINTR)
            break;
        if (pid <= 0) {
            if (now_s() > deadline) {
                res->timed_out = 1;
                kill_all(res, n, alive);
                deadline = now_s() + 3600; /* now just reap */
            }
            usleep(2000);
            continue;
        }
        for (int r = 0; r < n; r++) {
            if (res->pids[r] != pid)
                continue;
            alive[r] = 0;
            left--;
            exited++;
            res->codes[r] = WIFEXITED(status) ? WEXITSTATUS(status)
                                              : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
            if (res->codes[r] != 0)
                failed = 1;
            if ((failed && o->kill_on_failure) ||
                (o->kill_after_exits > 0 && exited >= o->kill_after_exits))
                kill_all(res, n, alive);
        }
    }
    if (res->timed_out)
        fprintf(stderr, "mp_run: ranks still running after %d s were killed\n", o->timeout_s + 5);
    for (int r = 0; r < n; r++)
        if (res->codes[r] != 0)
            fprintf(stderr, "mp_run: rank %d exited with %d\n", r, res->codes[r]);
    return failed || res->timed_out ? 1 : 0;
}

pid_t mp_start_store(int *port)
{
    const char *exe = getenv("C10D_STORE_EXE");
    if (exe == NULL || access(exe, X_OK) != 0)
        return -1;
    int p = mp_free_port();
    if (p <= 0)
        return -1;
    char ports[16];
    snprintf(ports, sizeof ports, "%d", p);
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        alarm(600); /* never outlive a broken test */
        execl(exe, exe, "serve", "--host", "127.0.0.1", "--port", ports, (char *)NULL);
        _exit(127);
    }
    /* Ready once it accepts a connection. */
    for (int i = 0; i < 500; i++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a;
        memset(&a, 0, sizeof a);
        a.sin_family = AF_INET;
        a.sin_port = htons((uint16_t)p);
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        int ok = connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
        close(fd);
        if (ok) {
            *port = p;
            return pid;
        }
        if (waitpid(pid, NULL, WNOHANG) == pid)
            return -1;
        usleep(10000);
    }
    mp_kill(pid);
    return -1;
}

void mp_kill(pid_t pid)
{
    if (pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
}
