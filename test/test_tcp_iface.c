/* tcp backend: the address a rank listens on and publishes (backends/tcp/
 * iface.c), chosen from the store's connection, the hostname and
 * C10D_SOCKET_IFNAME; and the store's route (c10d__store_route) through a
 * prefix store. The multi-host shapes themselves (a hostname mapped to
 * 127.0.1.1, a DNAT in front of the store) are test/net/route_addr_test.sh. */
#include "backends/backend.h"
#include "backends/tcp/tcp_backend.h"
#include "engine/env.h"
#include "engine/loop.h"
#include "free_port.h"
#include "store_server/client/store.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>
#include <cmocka.h>

struct on_loop {
    void (*fn)(void *arg);
    void *arg;
    uv_sem_t sem;
};

static void trampoline(void *p)
{
    struct on_loop *c = p;
    c->fn(c->arg);
    uv_sem_post(&c->sem);
}

/* Runs fn(arg) on the engine's loop thread and waits for it. */
static void run_on_loop(void (*fn)(void *), void *arg)
{
    struct on_loop c = {.fn = fn, .arg = arg};
    uv_sem_init(&c.sem, 0);
    assert_int_equal(c10d__engine_call(trampoline, &c), 0);
    uv_sem_wait(&c.sem);
    uv_sem_destroy(&c.sem);
}

struct open_call {
    const struct sockaddr *local; /* the store's connection, or NULL */
    const char *host;
    int rc;
    char address[128]; /* "ip:port" the rank publishes */
};

static void open_fn(void *p)
{
    struct open_call *o = p;
    struct c10d__backend_config cfg = {
        .rank = 1,
        .size = 2,
        .group_name = "iface",
        .timeout_ms = 1000,
        .store_local_addr = o->local,
        .store_host = o->host,
    };
    void *state = NULL;
    const char *address = NULL;
    o->rc = c10d__tcp_open(&cfg, &state, &address);
    if (o->rc == 0) {
        snprintf(o->address, sizeof o->address, "%s", address);
        c10d__tcp_backend.destroy(state, NULL, NULL);
    }
}

/* The address (without the port) a rank listens on, given the store's
 * connection. */
static void listen_ip(const struct sockaddr *local, const char *host, char *ip, size_t len)
{
    struct open_call o = {.local = local, .host = host};
    run_on_loop(open_fn, &o);
    assert_int_equal(o.rc, 0);
    char *colon = strrchr(o.address, ':');
    assert_non_null(colon);
    *colon = '\0';
    size_t n = strlen(o.address);
    assert_true(n < len);
    memcpy(ip, o.address, n + 1);
}

/* An IPv4 address of this host that is not loopback, or 0. */
static int other_ipv4(struct sockaddr_in *out, char *text, size_t len)
{
    uv_interface_address_t *ifs;
    int n;
    if (uv_interface_addresses(&ifs, &n) < 0)
        return 0;
    int found = 0;
    for (int i = 0; i < n && !found; i++) {
        if (ifs[i].is_internal || ifs[i].address.address4.sin_family != AF_INET)
            continue;
        *out = ifs[i].address.address4;
        uv_ip4_name(out, text, len);
        found = 1;
    }
    uv_free_interface_addresses(ifs, n);
    return found;
}

static void set_ifname(const char *name)
{
    if (name != NULL)
        setenv("C10D_SOCKET_IFNAME", name, 1);
    else
        unsetenv("C10D_SOCKET_IFNAME");
    unsetenv("GLOO_SOCKET_IFNAME");
    c10d__env_reload();
}

/* The store is reached from a non-loopback address: that is the one, whatever
 * the hostname resolves to; C10D_SOCKET_IFNAME still wins. */
static void test_route_address_wins(void **state)
{
    (void)state;
    struct sockaddr_in a;
    char want[INET6_ADDRSTRLEN], got[INET6_ADDRSTRLEN];
    if (!other_ipv4(&a, want, sizeof want))
        skip(); /* no interface but loopback */
    set_ifname(NULL);
    listen_ip((struct sockaddr *)&a, "job-master-0", got, sizeof got);
    assert_string_equal(got, want);
    set_ifname("lo");
    listen_ip((struct sockaddr *)&a, "job-master-0", got, sizeof got);
    assert_string_equal(got, "127.0.0.1");
    set_ifname(NULL);
}

/* A store reached over loopback whose host says loopback (MASTER_ADDR=
 * 127.0.0.1, localhost): a single-host job, which listens where it did
 * before there was a route to look at (the hostname's address). */
static void test_loopback_store_single_host(void **state)
{
    (void)state;
    set_ifname(NULL);
    char before[INET6_ADDRSTRLEN], got[INET6_ADDRSTRLEN];
    listen_ip(NULL, NULL, before, sizeof before);
    struct sockaddr_in lo;
    uv_ip4_addr("127.0.0.1", 40000, &lo);
    const char *hosts[] = {"127.0.0.1", "localhost", "::1", "job.localhost"};
    for (size_t i = 0; i < sizeof hosts / sizeof hosts[0]; i++) {
        listen_ip((struct sockaddr *)&lo, hosts[i], got, sizeof got);
        assert_string_equal(got, before);
    }
}

/* A store reached over loopback through a name (Debian's hosts file maps the
 * store host's own name to 127.0.1.1; the other hosts resolve it to a real
 * address): not loopback, when this host has a default route to take the
 * address from. */
static void test_loopback_store_by_name(void **state)
{
    (void)state;
    set_ifname(NULL);
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in probe;
    uv_ip4_addr("192.0.2.1", 9, &probe);
    int routed = fd >= 0 && connect(fd, (struct sockaddr *)&probe, sizeof probe) == 0;
    struct sockaddr_in src;
    socklen_t len = sizeof src;
    char want[INET6_ADDRSTRLEN] = "";
    if (routed && getsockname(fd, (struct sockaddr *)&src, &len) == 0)
        uv_ip4_name(&src, want, sizeof want);
    if (fd >= 0)
        close(fd);
    if (!routed || want[0] == '\0')
        skip(); /* no default route here */
    struct sockaddr_in lo;
    uv_ip4_addr("127.0.0.1", 40000, &lo);
    char got[INET6_ADDRSTRLEN];
    listen_ip((struct sockaddr *)&lo, "nodea", got, sizeof got);
    assert_string_equal(got, want);
}

/* An address nobody else could use as written is not published: IPv4-mapped
 * becomes IPv4. */
static void test_mapped_route_address(void **state)
{
    (void)state;
    struct sockaddr_in a;
    char want[INET6_ADDRSTRLEN], got[INET6_ADDRSTRLEN], mapped[80];
    if (!other_ipv4(&a, want, sizeof want))
        skip();
    set_ifname(NULL);
    snprintf(mapped, sizeof mapped, "::ffff:%s", want);
    struct sockaddr_in6 a6;
    assert_int_equal(uv_ip6_addr(mapped, 0, &a6), 0);
    listen_ip((struct sockaddr *)&a6, "job-master-0", got, sizeof got);
    assert_string_equal(got, want);
}

struct route_call {
    c10d_store *store;
    int rc;
    struct c10d__store_route route;
};

static void route_fn(void *p)
{
    struct route_call *r = p;
    r->rc = c10d__store_route(r->store, &r->route);
}

/* The route of a rendezvous store (a prefix store over a tcp one): the local
 * end of its connection and the host it was given. A store that is not
 * reached over TCP has none. */
static void test_store_route(void **state)
{
    (void)state;
    int port = test_free_port();
    assert_true(port > 0);
    char url[128];
    snprintf(url, sizeof url, "tcp://127.0.0.1:%d?rank=0&world_size=1", port);
    c10d_rendezvous_result rv;
    assert_int_equal(c10d_rendezvous(url, NULL, &rv), 0);
    struct route_call r = {.store = rv.store};
    run_on_loop(route_fn, &r);
    assert_int_equal(r.rc, 0);
    assert_string_equal(r.route.host, "127.0.0.1");
    assert_int_equal(r.route.local.ss_family, AF_INET);
    char ip[INET6_ADDRSTRLEN];
    uv_ip4_name((struct sockaddr_in *)&r.route.local, ip, sizeof ip);
    assert_string_equal(ip, "127.0.0.1");
    c10d_store_release(rv.store);

    c10d_store *hash;
    assert_int_equal(c10d_store_hash_create(&hash), 0);
    struct route_call h = {.store = hash};
    run_on_loop(route_fn, &h);
    assert_int_equal(h.rc, C10D_ENOTFOUND);
    c10d_store_release(hash);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_route_address_wins),
        cmocka_unit_test(test_loopback_store_single_host),
        cmocka_unit_test(test_loopback_store_by_name),
        cmocka_unit_test(test_mapped_route_address),
        cmocka_unit_test(test_store_route),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    c10d_shutdown();
    return rc;
}
