/* A rank's data port is reachable by anyone who can reach the host. Nothing a
 * stranger sends there may fail the group: handshakes of an older or foreign
 * format, hellos of another job, hellos reset before their answer, and
 * half-sent hellos held open, all while two ranks run checked all_reduces.
 * Half-sent hellos are closed after the pending deadline (10 s). With a token, the same job runs
 * and strangers without it are dropped. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "c10d.h"
#include "mp_harness.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#define GROUP_TIMEOUT_MS 30000
/* Unfinished inbound hellos are closed after min(10 s, the group timeout). */
#define PENDING_HELLO_MS 10000
#define OPS              400
#define COUNT            1024
#define HELD_PER_RANK    24

static char port_dir[64];

/* The TCP port this process listens on (its one listening socket: the store
 * is a separate process here). */
static int own_listen_port(void)
{
    char inodes[64][32];
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    if (d == NULL)
        return -1;
    struct dirent *e;
    while ((e = readdir(d)) != NULL && n < 64) {
        char path[300], link[64];
        snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
        ssize_t l = readlink(path, link, sizeof link - 1);
        if (l > 0) {
            link[l] = 0;
            if (sscanf(link, "socket:[%31[0-9]]", inodes[n]) == 1)
                n++;
        }
    }
    closedir(d);
    const char *tables[] = {"/proc/self/net/tcp", "/proc/self/net/tcp6"};
    for (int t = 0; t < 2; t++) {
        FILE *f = fopen(tables[t], "r");
        if (f == NULL)
            continue;
        char line[512];
        while (fgets(line, sizeof line, f) != NULL) {
            char local[64], state[8], inode[32];
            if (sscanf(line, " %*d: %63s %*s %7s %*s %*s %*s %*s %*s %31s", local, state, inode) !=
                    3 ||
                strcmp(state, "0A") != 0)
                continue;
            for (int i = 0; i < n; i++)
                if (strcmp(inodes[i], inode) == 0) {
                    fclose(f);
                    return (int)strtol(strrchr(local, ':') + 1, NULL, 16);
                }
        }
        fclose(f);
    }
    return -1;
}

static int socket_fds(void)
{
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    while (d != NULL && (e = readdir(d)) != NULL) {
        char path[300], link[64];
        snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
        ssize_t l = readlink(path, link, sizeof link - 1);
        if (l > 0 && strncmp(link, "socket:", 7) == 0)
            n++;
    }
    if (d != NULL)
        closedir(d);
    return n;
}

static int rank_main(int rank, int n, void *arg)
{
    (void)n;
    (void)arg;
    c10d_pg_opts po = {0};
    po.timeout_ms = GROUP_TIMEOUT_MS;
    c10d_pg *pg = NULL;
    MP_CHECK(c10d_pg_init(&po, &pg) == 0, "init: %s", c10d_last_error());
    /* Tell the stranger where to knock. */
    char path[128], tmp[140];
    snprintf(path, sizeof path, "%s/%d", port_dir, rank);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    MP_CHECK(f != NULL, "port file");
    fprintf(f, "%d\n", own_listen_port());
    fclose(f);
    rename(tmp, path);
    float *buf = malloc(COUNT * sizeof *buf);
    MP_CHECK(buf != NULL, "malloc");
    for (int op = 0; op < OPS; op++) {
        for (int i = 0; i < COUNT; i++)
            buf[i] = (float)(rank + 1 + i % 7 + op % 5);
        int rc = c10d_all_reduce_sync(pg, buf, buf, COUNT, C10D_FLOAT32, C10D_SUM);
        MP_CHECK(rc == 0, "op %d: %s: %s", op, c10d_status_name(rc), c10d_last_error());
        for (int i = 0; i < COUNT; i++) {
            float want = (float)(1 + 2 + 2 * (i % 7 + op % 5));
            MP_CHECK(buf[i] == want, "op %d element %d: %g, want %g", op, i, buf[i], want);
        }
        usleep(3000);
    }
    /* The stranger stops knocking (it keeps its half-sent hellos open), then
     * those are closed by the pending deadline. */
    snprintf(path, sizeof path, "%s/done%d", port_dir, rank);
    f = fopen(path, "w");
    MP_CHECK(f != NULL, "done file");
    fclose(f);
    usleep((PENDING_HELLO_MS + 2500) * 1000);
    int sockets = socket_fds();
    MP_CHECK(sockets < 10, "%d sockets still open (half-sent hellos kept)", sockets);
    MP_CHECK(c10d_barrier_sync(pg) == 0, "final barrier: %s", c10d_last_error());
    free(buf);
    MP_CHECK(c10d_pg_destroy(pg) == 0, "destroy");
    c10d_shutdown();
    return 0;
}

/* ------------------------------------------------------------ the stranger */

struct stranger {
    atomic_int stop;
    int ports[2];
    int held[2 * HELD_PER_RANK];
    int nheld;
    int sent;
};

static int dial(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

static void reset_close(int fd)
{
    struct linger lg = {1, 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    close(fd);
}

static uint32_t fnv1a(const char *str)
{
    uint32_t h = 2166136261u;
    for (; *str; str++)
        h = (h ^ (unsigned char)*str) * 16777619u;
    return h;
}

static void *stranger_main(void *arg)
{
    struct stranger *st = arg;
    for (int r = 0; r < 2; r++) {
        char path[128];
        snprintf(path, sizeof path, "%s/%d", port_dir, r);
        while (!atomic_load(&st->stop)) {
            FILE *f = fopen(path, "r");
            if (f != NULL) {
                if (fscanf(f, "%d", &st->ports[r]) != 1)
                    st->ports[r] = 0;
                fclose(f);
                if (st->ports[r] > 0)
                    break;
            }
            usleep(10000);
        }
    }
    uint32_t gid = fnv1a("0");
    uint64_t round = 0;
    char done0[128], done1[128];
    snprintf(done0, sizeof done0, "%s/done0", port_dir);
    snprintf(done1, sizeof done1, "%s/done1", port_dir);
    for (int spins = 0; spins < 60000 && (access(done0, F_OK) != 0 || access(done1, F_OK) != 0);
         spins++) {
        for (int r = 0; r < 2; r++) {
            /* The first format's hello (magic, group id, rank, size), then a reset. */
            uint32_t v1[4] = {0x43313044u, gid, (uint32_t)(1 - r), 2};
            int fd = dial(st->ports[r]);
            if (fd >= 0) {
                (void)!write(fd, v1, sizeof v1);
                reset_close(fd);
                st->sent++;
            }
            /* This format, another job's id, then a reset. */
            unsigned char v2[32] = {0};
            uint32_t magic = 0x43313044u, rank = (uint32_t)(1 - r), size = 2, tlen = 0;
            uint16_t version = 2, flags = 0;
            uint64_t job = 0x5eed000000000000ull + round;
            memcpy(v2, &magic, 4);
            memcpy(v2 + 4, &version, 2);
            memcpy(v2 + 6, &flags, 2);
            memcpy(v2 + 8, &gid, 4);
            memcpy(v2 + 12, &rank, 4);
            memcpy(v2 + 16, &size, 4);
            memcpy(v2 + 20, &tlen, 4);
            memcpy(v2 + 24, &job, 8);
            fd = dial(st->ports[r]);
            if (fd >= 0) {
                (void)!write(fd, v2, sizeof v2);
                reset_close(fd);
                st->sent++;
            }
            /* Half a hello, held open. */
            if (st->nheld < 2 * HELD_PER_RANK && round % 4 == 0) {
                fd = dial(st->ports[r]);
                if (fd >= 0) {
                    (void)!write(fd, v2, 5);
                    st->held[st->nheld++] = fd;
                }
            }
        }
        round++;
        usleep(2000);
    }
    return NULL;
}

/* The stranger is a process of its own: a thread in this process would be
 * inherited mid-lock by the ranks mp_run forks (a rank then hangs in its
 * first malloc). It reports its counts through a pipe and keeps its
 * half-sent hellos open until it is killed. */
static void run_attacked_job(const char *token)
{
    if (token != NULL)
        setenv("C10D_STORE_TOKEN", token, 1);
    int port;
    pid_t store = mp_start_store(&port);
    if (store < 0) {
        unsetenv("C10D_STORE_TOKEN");
        skip();
    }
    snprintf(port_dir, sizeof port_dir, "/tmp/c10d_dataport.%d", (int)getpid());
    mkdir(port_dir, 0700);
    int counts[2];
    assert_int_equal(pipe(counts), 0);
    fflush(NULL);
    pid_t stranger = fork();
    assert_true(stranger >= 0);
    if (stranger == 0) {
        close(counts[0]);
        struct stranger st = {0};
        stranger_main(&st);
        int out[2] = {st.sent, st.nheld};
        (void)!write(counts[1], out, sizeof out);
        for (;;)
            pause();
    }
    close(counts[1]);
    struct mp_opts o = {0};
    o.nranks = 2;
    o.timeout_s = 60;
    o.kill_on_failure = 1;
    o.external_store_port = port;
    struct mp_result res;
    int rc = mp_run(&o, rank_main, NULL, &res);
    int got[2] = {0, 0};
    fcntl(counts[0], F_SETFL, O_NONBLOCK);
    (void)!read(counts[0], got, sizeof got);
    close(counts[0]);
    kill(stranger, SIGKILL);
    waitpid(stranger, NULL, 0);
    mp_kill(store);
    for (int r = 0; r < 2; r++) {
        char path[128];
        snprintf(path, sizeof path, "%s/%d", port_dir, r);
        unlink(path);
        snprintf(path, sizeof path, "%s/done%d", port_dir, r);
        unlink(path);
    }
    rmdir(port_dir);
    unsetenv("C10D_STORE_TOKEN");
    print_message("stranger: %d hellos reset, %d half-sent held\n", got[0], got[1]);
    assert_int_equal(rc, 0);
    assert_true(got[0] > 100);
}

static void test_strangers_cannot_fail_the_group(void **s)
{
    (void)s;
    run_attacked_job(NULL);
}

static void test_strangers_without_the_token(void **s)
{
    (void)s;
    run_attacked_job("dataport-test-secret");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_strangers_cannot_fail_the_group),
        cmocka_unit_test(test_strangers_without_the_token),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
