/* Where to listen, which is also the address others reach this rank at,
 * chosen once at creation (docs/tcp_backend.md, "Connection setup"):
 *
 * 1. C10D_SOCKET_IFNAME (or GLOO_SOCKET_IFNAME): that interface's address;
 *    with a list, each rail listens on its own (rails.c).
 * 2. The local address of the store's connection. Every rank reaches the
 *    store, so the address the route to it leaves this host from is on a
 *    network the ranks share, whatever this host's name resolves to (Debian
 *    maps it to 127.0.1.1) and whatever NAT sits in front of the store (a
 *    DNAT rewrites the far end of the connection, never this one).
 * 3. That address is loopback: the store is on this host. If its host was
 *    given as loopback (127.0.0.1, ::1, localhost) the job is on one host:
 *    as 4. If it is a name that resolves to loopback here only (Debian's
 *    /etc/hosts on the store's own host), the other hosts resolve it to a
 *    real address: the source address of the default route.
 * 4. Otherwise (no store connection: a file or hash store) the address the
 *    hostname resolves to, if it can be bound here, else loopback with a
 *    warning.
 *
 * Runs on the loop thread when a group's transport is created; it is about
 * the host rather than the protocol, which is why it has a file of its own. */
#include "transport_impl.h"

#include "engine/env.h"
#include "engine/log.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

static socklen_t sockaddr_len(const struct sockaddr_storage *ss)
{
    return ss->ss_family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
}

static void set_port(struct sockaddr_storage *ss, int port)
{
    if (ss->ss_family == AF_INET)
        ((struct sockaddr_in *)ss)->sin_port = htons((uint16_t)port);
    else
        ((struct sockaddr_in6 *)ss)->sin6_port = htons((uint16_t)port);
}

/* "a.b.c.d:port" or "[v6]:port". */
static void address_text(const struct sockaddr_storage *ss, char *buf, size_t len)
{
    char ip[INET6_ADDRSTRLEN] = "?";
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
        uv_ip4_name(a, ip, sizeof ip);
        snprintf(buf, len, "%s:%d", ip, ntohs(a->sin_port));
    } else {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;
        uv_ip6_name(a, ip, sizeof ip);
        snprintf(buf, len, "[%s]:%d", ip, ntohs(a->sin6_port));
    }
}

static int is_loopback(const struct sockaddr_storage *ss)
{
    if (ss->ss_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)ss)->sin_addr.s_addr) >> 24) == 127;
    return ss->ss_family == AF_INET6 &&
           IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)ss)->sin6_addr);
}

/* Whether `host` says loopback as written: a loopback literal or localhost
 * (RFC 6761), not a name that some hosts file maps to loopback. */
static int names_loopback(const char *host)
{
    struct in_addr a4;
    struct in6_addr a6;
    if (inet_pton(AF_INET, host, &a4) == 1)
        return (ntohl(a4.s_addr) >> 24) == 127;
    if (inet_pton(AF_INET6, host, &a6) == 1)
        return IN6_IS_ADDR_LOOPBACK(&a6) || (IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127);
    size_t n = strlen(host);
    return strcasecmp(host, "localhost") == 0 ||
           (n > 10 && strcasecmp(host + n - 10, ".localhost") == 0);
}

/* Copies `sa` into `out` as an address this rank can listen on and publish:
 * an IPv4-mapped IPv6 address becomes IPv4, the port is cleared; 0 for an
 * address nobody else can use as written (unspecified, IPv6 link-local,
 * whose zone a peer would need). */
static int publishable(const struct sockaddr *sa, struct sockaddr_storage *out)
{
    memset(out, 0, sizeof *out);
    if (sa->sa_family == AF_INET) {
        memcpy(out, sa, sizeof(struct sockaddr_in));
        if (((struct sockaddr_in *)out)->sin_addr.s_addr == htonl(INADDR_ANY))
            return 0;
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *a6 = (const struct sockaddr_in6 *)sa;
        if (IN6_IS_ADDR_V4MAPPED(&a6->sin6_addr)) {
            struct sockaddr_in *a4 = (struct sockaddr_in *)out;
            a4->sin_family = AF_INET;
            memcpy(&a4->sin_addr, &a6->sin6_addr.s6_addr[12], 4);
        } else {
            if (IN6_IS_ADDR_UNSPECIFIED(&a6->sin6_addr) || IN6_IS_ADDR_LINKLOCAL(&a6->sin6_addr))
                return 0;
            memcpy(out, sa, sizeof(struct sockaddr_in6));
        }
    } else {
        return 0;
    }
    set_port(out, 0);
    return 1;
}

/* The source address of the default route: a UDP socket "connected" to a
 * documentation address (RFC 5737, RFC 3849), which no network announces,
 * sends nothing, but the kernel picks its route, and with it the source, as
 * for any other destination off this host. 0 when there is no such route. */
static int default_route_source(struct sockaddr_storage *out)
{
    static const char *const probes[2] = {"192.0.2.1", "2001:db8::1"};
    for (int i = 0; i < 2; i++) {
        struct sockaddr_storage dst = {0};
        if (i == 0)
            uv_ip4_addr(probes[i], 9, (struct sockaddr_in *)&dst);
        else
            uv_ip6_addr(probes[i], 9, (struct sockaddr_in6 *)&dst);
        int fd = socket(dst.ss_family, SOCK_DGRAM, 0);
        if (fd < 0)
            continue;
        struct sockaddr_storage src;
        socklen_t len = sizeof src;
        int ok = connect(fd, (struct sockaddr *)&dst, sockaddr_len(&dst)) == 0 &&
                 getsockname(fd, (struct sockaddr *)&src, &len) == 0;
        close(fd);
        if (ok && publishable((struct sockaddr *)&src, out) && !is_loopback(out))
            return 1;
    }
    return 0;
}

/* Whether `ss` can be bound here (the hostname may resolve to an address of
 * another machine, or one that is not configured). */
static int bindable(const struct sockaddr_storage *ss)
{
    int fd = socket(ss->ss_family, SOCK_STREAM, 0);
    if (fd < 0)
        return 0;
    struct sockaddr_storage a = *ss;
    set_port(&a, 0);
    int ok = bind(fd, (struct sockaddr *)&a, sockaddr_len(&a)) == 0;
    close(fd);
    return ok;
}

static int interface_address(const char *ifname, struct sockaddr_storage *ss)
{
    uv_interface_address_t *ifs;
    int n;
    if (uv_interface_addresses(&ifs, &n) < 0)
        return c10d__fail(C10D_EIO, "tcp: cannot list network interfaces");
    int found = 0;
    for (int pass = 0; pass < 2 && !found; pass++) {
        for (int i = 0; i < n && !found; i++) {
            int fam = ifs[i].address.address4.sin_family;
            if (strcmp(ifs[i].name, ifname) != 0 || fam != (pass == 0 ? AF_INET : AF_INET6))
                continue;
            memcpy(ss, &ifs[i].address,
                   fam == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6));
            found = 1;
        }
    }
    uv_free_interface_addresses(ifs, n);
    if (!found)
        return c10d__fail(C10D_EINVAL,
                          "tcp: C10D_SOCKET_IFNAME/GLOO_SOCKET_IFNAME names '%s', which is "
                          "not an interface with an address on this host",
                          ifname);
    if (!bindable(ss))
        return c10d__fail(C10D_EIO, "tcp: cannot bind to the address of interface '%s'", ifname);
    return 0;
}

/* Steps 2 and 3 of the file's comment: 1 with `ss` and `why` set when the
 * store's connection decides, 0 to go on with the hostname. */
static int route_address(const struct c10d__tcp_transport_config *cfg, struct sockaddr_storage *ss,
                         char *why, size_t why_len)
{
    if (cfg->store_local_addr == NULL)
        return 0;
    const char *host = cfg->store_host != NULL ? cfg->store_host : "?";
    if (!publishable(cfg->store_local_addr, ss))
        return 0;
    if (!is_loopback(ss) && bindable(ss)) {
        snprintf(why, why_len,
                 "the local address of the connection to the store at '%s' (where the route "
                 "to it leaves this host)",
                 host);
        return 1;
    }
    if (!is_loopback(ss) || names_loopback(host))
        return 0; /* not bindable (cannot happen), or a single-host job: the hostname */
    if (default_route_source(ss) && bindable(ss)) {
        snprintf(why, why_len,
                 "the source address of the default route: the store's host '%s' resolves to "
                 "loopback here only (an /etc/hosts entry?), which the other hosts cannot reach",
                 host);
        return 1;
    }
    return 0;
}

/* Step 4: the hostname's address if it can be bound here. */
static int hostname_address(struct sockaddr_storage *ss, char *why, size_t why_len)
{
    char host[256];
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    memset(ss, 0, sizeof *ss);
    if (gethostname(host, sizeof host) != 0 || getaddrinfo(host, NULL, &hints, &res) != 0)
        return 0;
    for (struct addrinfo *a = res; a != NULL; a = a->ai_next) {
        if (a->ai_family == AF_INET || a->ai_family == AF_INET6) {
            memcpy(ss, a->ai_addr, a->ai_addrlen);
            break;
        }
    }
    freeaddrinfo(res);
    if (ss->ss_family == 0 || !bindable(ss))
        return 0;
    snprintf(why, why_len, "the address this host's name '%s' resolves to", host);
    return 1;
}

static int pick_address(struct c10d__tcp_transport *t, char *why, size_t why_len)
{
    const char *ifname =
        t->cfg.ifname != NULL ? t->cfg.ifname : c10d__env_str(C10D_ENV_SOCKET_IFNAME);
    struct sockaddr_storage *ss = &t->bind_addr;
    memset(ss, 0, sizeof *ss);
    if (ifname != NULL && *ifname != '\0') {
        C10D_CHECK(interface_address(ifname, ss));
        snprintf(why, why_len, "the address of interface '%s' (C10D_SOCKET_IFNAME)", ifname);
        return 0;
    }
    if (route_address(&t->cfg, ss, why, why_len) || hostname_address(ss, why, why_len))
        return 0;
    C10D_WARN("tcp", "cannot resolve this host's name to an address it can listen on; using "
                     "loopback (set C10D_SOCKET_IFNAME to choose an interface)");
    memset(ss, 0, sizeof *ss);
    uv_ip4_addr("127.0.0.1", 0, (struct sockaddr_in *)ss);
    snprintf(why, why_len, "loopback: no other address found");
    return 0;
}

int c10d__tcp_start_listening(struct c10d__tcp_transport *t, uv_connection_cb on_connection)
{
    char why[400];
    C10D_CHECK(pick_address(t, why, sizeof why));
    set_port(&t->bind_addr, 0);
    if (uv_tcp_init(t->loop, &t->listener) < 0)
        return c10d__fail(C10D_EIO, "tcp: cannot create the listening socket");
    t->handles++;
    t->listening = 1;
    t->listener.data = t;
    int rc = uv_tcp_bind(&t->listener, (struct sockaddr *)&t->bind_addr, 0);
    if (rc == 0 && t->cfg.socket_buffer > 0) {
        int v = t->cfg.socket_buffer;
        uv_recv_buffer_size((uv_handle_t *)&t->listener, &v);
    }
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&t->listener, t->cfg.size + 64, on_connection);
    if (rc < 0)
        return c10d__fail(C10D_EIO, "tcp: cannot listen: %s", uv_strerror(rc));
    struct sockaddr_storage bound;
    int len = sizeof bound;
    char text[INET6_ADDRSTRLEN + 16] = "?";
    if (uv_tcp_getsockname(&t->listener, (struct sockaddr *)&bound, &len) == 0)
        address_text(&bound, text, sizeof text);
    C10D_INFO("tcp", "listening on %s (rank %d of %d): %s", text, t->cfg.rank, t->cfg.size, why);
    return 0;
}

int c10d__tcp_format_address(struct c10d__tcp_transport *t)
{
    struct sockaddr_storage ss;
    int len = sizeof ss;
    if (uv_tcp_getsockname(&t->listener, (struct sockaddr *)&ss, &len) < 0)
        return c10d__fail(C10D_EIO, "tcp: getsockname failed");
    address_text(&ss, t->address, sizeof t->address);
    if (t->cfg.rank == 0)
        snprintf(t->published, sizeof t->published, "%s#%016llx", t->address,
                 (unsigned long long)t->job_id);
    else
        snprintf(t->published, sizeof t->published, "%s", t->address);
    return 0;
}
