/* store_floor: the least a TCPStore server can do per GET or ADD on this
 * kernel, to measure c10d-store's CPU per op against (store_floor_compare.sh).
 *
 *   store_floor [--host H] [--port P] [--port-file F] [--value-bytes B]
 *
 * A bare epoll loop, level-triggered, with no library and no table: each
 * readiness costs one recv and, if a request completed, one send. It speaks
 * just enough of the wire format (docs/store_protocol.md, both dialects) for
 * store_loadgen's get and add patterns and their setup: VALIDATE and SET
 * (no reply), CHECK (READY), PING (its nonce), GET (a fixed value of
 * --value-bytes bytes, default 64 as the load generator expects) and ADD (a
 * counter shared by all keys). Anything else closes the connection. What
 * this costs per op is the kernel's loopback TCP plus one epoll_wait share,
 * which a real server pays too; the rest of a real server's CPU is overhead.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAX_EVENTS 512
/* Fits a setup SET with a value of up to IN_CAP - 64 bytes; a request that
 * cannot fit closes its connection. */
#define IN_CAP  8192
#define OUT_CAP (64 * 1024)
#define MAGIC   0x3C85F7CEu

enum { D_UNKNOWN, D_CURRENT, D_LEGACY };
enum { C_VALIDATE, C_SET, C_GET, C_ADD, C_CHECK, C_PING, C_OTHER };

struct fconn {
    int fd;
    int dialect;
    size_t len;
    uint8_t in[IN_CAP];
};

static size_t value_bytes = 64;
static uint8_t *get_reply; /* u64 length + the value, built once */
static size_t get_reply_len;
static int64_t counter;

static uint64_t load_u64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8); /* little-endian hosts only, like the wire */
    return v;
}

static int cmd_of(int dialect, uint8_t b)
{
    if (dialect == D_CURRENT) {
        switch (b) {
        case 0:
            return C_VALIDATE;
        case 1:
            return C_SET;
        case 3:
            return C_GET;
        case 4:
            return C_ADD;
        case 5:
            return C_CHECK;
        case 13:
            return C_PING;
        }
        return C_OTHER;
    }
    switch (b) {
    case 0:
        return C_SET;
    case 2:
        return C_GET;
    case 3:
        return C_ADD;
    case 4:
        return C_CHECK;
    }
    return C_OTHER;
}

/* Skips one S at p[*pos]; 0 if it is not all there yet. */
static int skip_str(const uint8_t *p, size_t n, size_t *pos)
{
    if (n - *pos < 8)
        return 0;
    uint64_t len = load_u64(p + *pos);
    if (len > n - *pos - 8)
        return 0;
    *pos += 8 + (size_t)len;
    return 1;
}

/* Answers every complete request in c->in into out; returns the bytes of
 * replies, or -1 to close the connection. */
static long serve(struct fconn *c, uint8_t *out)
{
    size_t pos = 0, olen = 0;
    const uint8_t *p = c->in;
    size_t n = c->len;
    while (pos < n) {
        if (c->dialect == D_UNKNOWN) {
            if (n < 5)
                break;
            static const uint8_t hello[5] = {0x00, 0xCE, 0xF7, 0x85, 0x3C};
            c->dialect = memcmp(p, hello, 5) ? D_LEGACY : D_CURRENT;
        }
        size_t q = pos + 1;
        int cmd = cmd_of(c->dialect, p[pos]);
        int done = 1;
        switch (cmd) {
        case C_VALIDATE:
            done = n - q >= 4;
            q += 4;
            break;
        case C_PING:
            if ((done = n - q >= 4)) {
                memcpy(out + olen, p + q, 4);
                olen += 4;
            }
            q += 4;
            break;
        case C_SET:
            done = skip_str(p, n, &q) && skip_str(p, n, &q);
            break;
        case C_GET:
            if ((done = skip_str(p, n, &q))) {
                memcpy(out + olen, get_reply, get_reply_len);
                olen += get_reply_len;
            }
            break;
        case C_ADD:
            if ((done = skip_str(p, n, &q) && n - q >= 8)) {
                counter += (int64_t)load_u64(p + q);
                memcpy(out + olen, &counter, 8);
                olen += 8;
            }
            q += 8;
            break;
        case C_CHECK: {
            if (n - q < 8) {
                done = 0;
                break;
            }
            uint64_t k = load_u64(p + q);
            q += 8;
            for (uint64_t i = 0; i < k && done; i++)
                done = skip_str(p, n, &q);
            if (done)
                out[olen++] = 0; /* READY */
            break;
        }
        default:
            return -1;
        }
        if (!done)
            break;
        pos = q;
        if (olen + get_reply_len + 16 > OUT_CAP)
            return -1; /* the load generator never pipelines this deep */
    }
    if (pos == n) {
        c->len = 0;
    } else if (pos) {
        memmove(c->in, c->in + pos, n - pos);
        c->len = n - pos;
    } else if (n == IN_CAP) {
        return -1; /* a request larger than the buffer */
    }
    return (long)olen;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: store_floor [--host H] [--port P] [--port-file F] [--value-bytes B]\n");
}

int main(int argc, char **argv)
{
    const char *host = "127.0.0.1", *port_file = NULL;
    int port = 0;
    static const struct option lo[] = {{"host", required_argument, 0, 'h'},
                                       {"port", required_argument, 0, 'p'},
                                       {"port-file", required_argument, 0, 'f'},
                                       {"value-bytes", required_argument, 0, 'v'},
                                       {"help", no_argument, 0, 'H'},
                                       {0, 0, 0, 0}};
    int o;
    while ((o = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (o) {
        case 'h':
            host = optarg;
            break;
        case 'p':
            port = atoi(optarg);
            break;
        case 'f':
            port_file = optarg;
            break;
        case 'v':
            value_bytes = (size_t)strtoull(optarg, NULL, 10);
            break;
        case 'H':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (value_bytes > OUT_CAP / 2) {
        fprintf(stderr, "store_floor: --value-bytes at most %d\n", OUT_CAP / 2);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    get_reply_len = 8 + value_bytes;
    get_reply = malloc(get_reply_len);
    if (!get_reply)
        return 1;
    uint64_t vlen = value_bytes;
    memcpy(get_reply, &vlen, 8);
    memset(get_reply + 8, 'x', value_bytes);

    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int on = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, host, &a.sin_addr) != 1) {
        fprintf(stderr, "store_floor: --host must be an IPv4 address\n");
        return 2;
    }
    if (bind(lfd, (struct sockaddr *)&a, sizeof a) || listen(lfd, 4096)) {
        perror("store_floor: bind/listen");
        return 1;
    }
    socklen_t alen = sizeof a;
    getsockname(lfd, (struct sockaddr *)&a, &alen);
    if (port_file) {
        /* Written then renamed: a reader never sees half a number. */
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s.tmp", port_file);
        FILE *f = fopen(tmp, "w");
        if (!f || fprintf(f, "%d\n", ntohs(a.sin_port)) < 0 || fclose(f) ||
            rename(tmp, port_file)) {
            perror("store_floor: port file");
            return 1;
        }
    } else {
        printf("%d\n", ntohs(a.sin_port));
        fflush(stdout);
    }

    int ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
    epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev);
    static uint8_t out[OUT_CAP];
    struct epoll_event evs[MAX_EVENTS];
    for (;;) {
        int n = epoll_wait(ep, evs, MAX_EVENTS, -1);
        if (n < 0 && errno != EINTR) {
            perror("store_floor: epoll_wait");
            return 1;
        }
        for (int i = 0; i < n; i++) {
            struct fconn *c = evs[i].data.ptr;
            if (!c) {
                int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
                if (fd < 0)
                    continue;
                c = calloc(1, sizeof *c);
                if (!c) {
                    close(fd);
                    continue;
                }
                c->fd = fd;
                struct epoll_event cev = {.events = EPOLLIN, .data.ptr = c};
                epoll_ctl(ep, EPOLL_CTL_ADD, fd, &cev);
                continue;
            }
            ssize_t r = recv(c->fd, c->in + c->len, IN_CAP - c->len, 0);
            long olen = 0;
            if (r > 0) {
                c->len += (size_t)r;
                olen = serve(c, out);
            } else if (r < 0 && (errno == EAGAIN || errno == EINTR)) {
                continue;
            }
            /* A short send never happens with one small reply in flight per
             * connection; were it to, the client would see a closed
             * connection, never a silently wrong number. */
            if (r <= 0 || olen < 0 ||
                (olen > 0 && send(c->fd, out, (size_t)olen, MSG_NOSIGNAL) != olen)) {
                close(c->fd); /* also leaves the epoll set */
                free(c);
            }
        }
    }
}
