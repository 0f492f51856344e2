/* Where to listen: the interface C10D_SOCKET_IFNAME (or GLOO_SOCKET_IFNAME)
 * names, else the address the hostname resolves to if it can be bound here,
 * else loopback with a warning; and the address others reach this rank at.
 * Runs once, at creation, and is about the host rather than the protocol,
 * which is why it has a file of its own. */
#include "transport_impl.h"

#include "engine/env.h"
#include "engine/log.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static int pick_address(struct c10d__tcp_transport *t)
{
    const char *ifname = c10d__env_str(C10D_ENV_SOCKET_IFNAME);
    struct sockaddr_storage *ss = &t->bind_addr;
    memset(ss, 0, sizeof *ss);
    if (ifname != NULL && *ifname != '\0') {
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
        return 0;
    }
    char host[256];
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    if (gethostname(host, sizeof host) == 0 && getaddrinfo(host, NULL, &hints, &res) == 0) {
        for (struct addrinfo *a = res; a != NULL; a = a->ai_next) {
            if (a->ai_family == AF_INET || a->ai_family == AF_INET6) {
                memcpy(ss, a->ai_addr, a->ai_addrlen);
                break;
            }
        }
        freeaddrinfo(res);
        if (ss->ss_family != 0)
            return 0;
    }
    C10D_WARN("tcp", "cannot resolve this host's name to an address; using loopback (set "
                     "C10D_SOCKET_IFNAME to choose an interface)");
    uv_ip4_addr("127.0.0.1", 0, (struct sockaddr_in *)ss);
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
    if (a.ss_family == AF_INET)
        ((struct sockaddr_in *)&a)->sin_port = 0;
    else
        ((struct sockaddr_in6 *)&a)->sin6_port = 0;
    socklen_t len =
        a.ss_family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
    int ok = bind(fd, (struct sockaddr *)&a, len) == 0;
    close(fd);
    return ok;
}

int c10d__tcp_start_listening(struct c10d__tcp_transport *t)
{
    C10D_CHECK(pick_address(t));
    if (!bindable(&t->bind_addr)) {
        if (c10d__env_str(C10D_ENV_SOCKET_IFNAME)[0] != '\0')
            return c10d__fail(C10D_EIO, "tcp: cannot bind to the address of interface '%s'",
                              c10d__env_str(C10D_ENV_SOCKET_IFNAME));
        C10D_WARN("tcp", "cannot listen on this host's address; using loopback (set "
                         "C10D_SOCKET_IFNAME to choose an interface)");
        memset(&t->bind_addr, 0, sizeof t->bind_addr);
        uv_ip4_addr("127.0.0.1", 0, (struct sockaddr_in *)&t->bind_addr);
    }
    if (t->bind_addr.ss_family == AF_INET)
        ((struct sockaddr_in *)&t->bind_addr)->sin_port = 0;
    else
        ((struct sockaddr_in6 *)&t->bind_addr)->sin6_port = 0;
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
        rc = uv_listen((uv_stream_t *)&t->listener, t->cfg.size + 64, c10d__tcp_on_connection);
    if (rc < 0)
        return c10d__fail(C10D_EIO, "tcp: cannot listen: %s", uv_strerror(rc));
    return 0;
}

int c10d__tcp_format_address(struct c10d__tcp_transport *t)
{
    struct sockaddr_storage ss;
    int len = sizeof ss;
    if (uv_tcp_getsockname(&t->listener, (struct sockaddr *)&ss, &len) < 0)
        return c10d__fail(C10D_EIO, "tcp: getsockname failed");
    char ip[INET6_ADDRSTRLEN];
    if (ss.ss_family == AF_INET) {
        struct sockaddr_in *a = (struct sockaddr_in *)&ss;
        uv_ip4_name(a, ip, sizeof ip);
        snprintf(t->address, sizeof t->address, "%s:%d", ip, ntohs(a->sin_port));
    } else {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
        uv_ip6_name(a, ip, sizeof ip);
        snprintf(t->address, sizeof t->address, "[%s]:%d", ip, ntohs(a->sin6_port));
    }
    if (t->cfg.rank == 0)
        snprintf(t->published, sizeof t->published, "%s#%016llx", t->address,
                 (unsigned long long)t->job_id);
    else
        snprintf(t->published, sizeof t->published, "%s", t->address);
    return 0;
}
