/* Rendezvous (docs/semantics.md, 1): a URL becomes a store, a rank and a
 * world size; rank 0 hosts the store on the engine's loop unless told
 * otherwise; the store-based barrier of init_process_group. */
#include "c10d.h"

#include "api/attempt.h"
#include "api/launch_env.h"
#include "engine/env.h"
#include "engine/error.h"
#include "engine/log.h"
#include "engine/loop.h"
#include "engine/loop_call.h"
#include "engine/opts.h"
#include "engine/token.h"
#include "store_server/server/server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_TIMEOUT_MS 300000

/* ----------------------------------------------------- embedded servers */

/* Servers hosted by this process, one per port, kept until c10d_shutdown:
 * other ranks may still use the store after rank 0 released its handle. */
struct hosted {
    struct c10d__store_server *server;
    int port;
    int64_t linger_ms; /* how long it waited for its clients, for the warning, */
    int capped;        /* and whether a failure cut it to FAILED_LINGER_MS */
    struct hosted *next;
};

static struct hosted *hosted_list; /* loop thread only */
static atomic_int skip_linger;

void c10d__hosted_store_skip_linger(void)
{
    atomic_store(&skip_linger, 1);
}
static struct c10d__shutdown_hook hosted_hook;
static int hosted_hook_registered;

/* After a failure, at most this long: a peer that is still reading what
 * the failed creation published (the peers' addresses, which tell it why
 * they disagree) gets its own precise error instead of a closed store,
 * while a stopped or cut-off peer holds the exit this long, not the whole
 * C10D_STORE_LINGER_MS. */
#define FAILED_LINGER_MS 500

static void on_drained(void *arg, size_t left)
{
    struct hosted *h = arg;
    if (left > 0)
        C10D_WARN("rendezvous",
                  "stopping the store on port %d with %zu client(s) still connected after %lld ms "
                  "(%s); ranks still running lose it",
                  h->port, left, (long long)h->linger_ms,
                  h->capped ? "the wait after a failure" : "C10D_STORE_LINGER_MS");
    c10d__store_server_stop(h->server, NULL, NULL);
    free(h);
    c10d__engine_release_stop();
}

/* Other ranks may still need the store when this one is done (a rank that
 * connects lazily reads a peer's address on first use): each server keeps
 * serving until its last client left, C10D_STORE_LINGER_MS at most, and
 * FAILED_LINGER_MS at most once a group failed. This process's own clients
 * closed in their hooks. */
static void stop_hosted(struct c10d__shutdown_hook *hook)
{
    (void)hook;
    hosted_hook_registered = 0;
    /* Read and reset: a later job in this process starts clean. */
    int64_t linger = c10d__env_int(C10D_ENV_STORE_LINGER_MS);
    int capped = atomic_exchange(&skip_linger, 0) && linger > FAILED_LINGER_MS;
    if (capped)
        linger = FAILED_LINGER_MS;
    while (hosted_list) {
        struct hosted *h = hosted_list;
        hosted_list = h->next;
        if (linger <= 0) {
            c10d__store_server_stop(h->server, NULL, NULL);
            free(h);
            continue;
        }
        h->linger_ms = linger;
        h->capped = capped;
        c10d__engine_hold_stop();
        if (c10d__store_server_drain(h->server, (uint64_t)linger, on_drained, h) != 0) {
            c10d__engine_release_stop();
            c10d__store_server_stop(h->server, NULL, NULL);
            free(h);
        }
    }
}

/* Heap-allocated: a caller that gave up waiting leaves it to the loop. */
struct host_call {
    char host_buf[256];
    const char *host; /* NULL: every address; else host_buf */
    int any_if_not_local;
    int port;
    int world_size;
};

static void host_on_loop(struct c10d__loop_call *call, void *arg)
{
    struct host_call *c = arg;
    int rc = 0;
    for (struct hosted *h = hosted_list; h; h = h->next)
        if (h->port == c->port)
            goto out; /* already serving (a second rendezvous in this process) */
    struct c10d__store_server_opts o = {.host = c->host,
                                        .any_if_not_local = c->any_if_not_local,
                                        .port = c->port,
                                        .world_size = c->world_size};
    rc = c10d__token_get(&o.token, &o.token_len);
    if (rc < 0)
        goto out;
    struct hosted *h = calloc(1, sizeof *h);
    if (!h) {
        rc = c10d__fail(C10D_ENOMEM, "out of memory");
        goto out;
    }
    rc = c10d__store_server_start(c10d__engine_loop(), &o, &h->server);
    if (rc < 0) {
        free(h);
        goto out;
    }
    h->port = c10d__store_server_port(h->server);
    h->next = hosted_list;
    hosted_list = h;
    if (!hosted_hook_registered) {
        hosted_hook.fn = stop_hosted;
        c10d__engine_on_shutdown(&hosted_hook);
        hosted_hook_registered = 1;
    }
out:
    c10d__loop_call_done(call, rc, rc < 0 ? c10d_last_error() : NULL);
}

/* What a host name resolves to here. */
enum resolved {
    RESOLVES_NOT,      /* no address (yet): *error says why */
    RESOLVES_LOOPBACK, /* loopback addresses only */
    RESOLVES_OTHER,    /* at least one address that is not loopback */
};

static enum resolved resolve_kind(const char *name, const char **error)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *res = NULL;
    int gai = getaddrinfo(name, NULL, &hints, &res);
    if (gai != 0 || res == NULL) {
        *error = gai != 0 ? gai_strerror(gai) : "no address";
        return RESOLVES_NOT;
    }
    int all = 1;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        if (ai->ai_family == AF_INET) {
            uint32_t a = ntohl(((struct sockaddr_in *)ai->ai_addr)->sin_addr.s_addr);
            all &= (a >> 24) == 127;
        } else if (ai->ai_family == AF_INET6) {
            all &= IN6_IS_ADDR_LOOPBACK(&((struct sockaddr_in6 *)ai->ai_addr)->sin6_addr);
        }
    }
    freeaddrinfo(res);
    return all ? RESOLVES_LOOPBACK : RESOLVES_OTHER;
}

/* Where rank 0's store listens: C10D_STORE_BIND ('*': every address), else
 * the address the other ranks were told (MASTER_ADDR or the URL's host), so
 * that MASTER_ADDR=127.0.0.1 keeps the store off the network; every address
 * when that name cannot be what the others reach. */
static const char *store_bind_host(const char *master, int *any_if_not_local)
{
    const char *bind = c10d__env_str(C10D_ENV_STORE_BIND);
    *any_if_not_local = 0;
    if (bind && *bind)
        return strcmp(bind, "*") ? bind : NULL;
    unsigned char buf[sizeof(struct in6_addr)];
    int numeric = inet_pton(AF_INET, master, buf) == 1 || inet_pton(AF_INET6, master, buf) == 1;
    const char *error = NULL;
    enum resolved kind =
        numeric || !strcmp(master, "localhost") ? RESOLVES_OTHER : resolve_kind(master, &error);
    /* A host name that this machine resolves to loopback only (Debian maps
     * its own name to 127.0.1.1) is not what the other nodes resolve it to. */
    if (kind == RESOLVES_LOOPBACK) {
        C10D_INFO("rendezvous",
                  "MASTER_ADDR '%s' resolves to a loopback address here only: the store "
                  "listens on every address (C10D_STORE_BIND chooses one)",
                  master);
        return NULL;
    }
    /* A name with no address yet (a Kubernetes headless service's record
     * appears seconds after its pod starts) will name an address of this
     * host: listen on all of them now, as torch's TCPStore always does,
     * while the clients, this rank's own included, retry the name. */
    if (kind == RESOLVES_NOT) {
        C10D_WARN("rendezvous",
                  "MASTER_ADDR '%s' does not resolve here yet (%s): the store listens on every "
                  "address (C10D_STORE_BIND chooses one) and the ranks retry the name until "
                  "their timeout",
                  master, error);
        return NULL;
    }
    *any_if_not_local = 1;
    return master;
}

/* Starting a server does not block the loop: anything slower than this is a
 * loop held up by someone else, reported instead of waited for. */
#define HOST_BOUND_MS 30000

static int host_store(const char *master, int port, int world_size)
{
    struct host_call *c = calloc(1, sizeof *c);
    if (c == NULL)
        return c10d__fail(C10D_ENOMEM, "rendezvous: out of memory");
    c->port = port;
    c->world_size = world_size;
    const char *host = store_bind_host(master, &c->any_if_not_local);
    if (host != NULL) {
        snprintf(c->host_buf, sizeof c->host_buf, "%s", host);
        c->host = c->host_buf;
    }
    char late[128];
    snprintf(late, sizeof late,
             "the loop thread did not start the store server within %d ms (is a callback "
             "blocking it?)",
             HOST_BOUND_MS);
    int abandoned;
    int rc = c10d__loop_call_run(host_on_loop, c, free, HOST_BOUND_MS, late, &abandoned);
    if (!abandoned)
        free(c);
    if (rc < 0) {
        char why[1024];
        snprintf(why, sizeof why, "%s", c10d_last_error());
        return c10d__fail(rc, "rendezvous: rank 0 cannot host the store on port %d: %s", port, why);
    }
    return 0;
}

/* ------------------------------------------------------------ URL parsing */

struct url {
    char scheme[8]; /* "env", "tcp", "file" */
    char host[256];
    int port;
    char path[1024];
    int rank;
    int world_size;
    int has_rank, has_world_size;
};

static int parse_int(const char *text, size_t len, long lo, long hi, long *out)
{
    char buf[32];
    if (len == 0 || len >= sizeof buf)
        return -1;
    memcpy(buf, text, len);
    buf[len] = 0;
    char *end;
    errno = 0;
    long v = strtol(buf, &end, 10);
    if (errno || *end || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

static int parse_query(const char *url, const char *q, struct url *u)
{
    while (q && *q) {
        const char *amp = strchr(q, '&');
        size_t len = amp ? (size_t)(amp - q) : strlen(q);
        const char *eq = memchr(q, '=', len);
        long v;
        if (!eq)
            return c10d__fail(C10D_EINVAL, "rendezvous %s: malformed query parameter '%.*s'", url,
                              (int)len, q);
        size_t klen = (size_t)(eq - q), vlen = len - klen - 1;
        if (klen == 4 && !strncmp(q, "rank", 4)) {
            if (parse_int(eq + 1, vlen, 0, INT32_MAX, &v) < 0)
                return c10d__fail(C10D_EINVAL, "rendezvous %s: rank '%.*s' is not an integer >= 0",
                                  url, (int)vlen, eq + 1);
            u->rank = (int)v;
            u->has_rank = 1;
        } else if (klen == 10 && !strncmp(q, "world_size", 10)) {
            if (parse_int(eq + 1, vlen, 1, INT32_MAX, &v) < 0)
                return c10d__fail(C10D_EINVAL,
                                  "rendezvous %s: world_size '%.*s' is not an integer > 0", url,
                                  (int)vlen, eq + 1);
            u->world_size = (int)v;
            u->has_world_size = 1;
        } else {
            /* torch ignores what it does not know; say so. */
            C10D_WARN("rendezvous", "%s: ignoring query parameter '%.*s'", url, (int)klen, q);
        }
        q = amp ? amp + 1 : NULL;
    }
    return 0;
}

static int parse_url(const char *url, struct url *u)
{
    memset(u, 0, sizeof *u);
    const char *sep = strstr(url, "://");
    if (!sep || sep == url || (size_t)(sep - url) >= sizeof u->scheme)
        return c10d__fail(C10D_EINVAL,
                          "rendezvous: malformed URL '%s' (expected env://, tcp://host:port or "
                          "file:///path)",
                          url);
    memcpy(u->scheme, url, (size_t)(sep - url));
    const char *rest = sep + 3;
    const char *q = strchr(rest, '?');
    size_t rlen = q ? (size_t)(q - rest) : strlen(rest);
    if (!strcmp(u->scheme, "env")) {
        if (rlen)
            return c10d__fail(C10D_EINVAL, "rendezvous %s: env:// takes no address", url);
    } else if (!strcmp(u->scheme, "tcp")) {
        const char *colon;
        const char *hs = rest, *he;
        if (*rest == '[') { /* [v6]:port */
            he = memchr(rest, ']', rlen);
            if (!he)
                return c10d__fail(C10D_EINVAL, "rendezvous %s: unterminated '['", url);
            hs = rest + 1;
            colon = he + 1 < rest + rlen && he[1] == ':' ? he + 1 : NULL;
        } else {
            colon = NULL;
            for (const char *p = rest; p < rest + rlen; p++)
                if (*p == ':')
                    colon = p;
            he = colon ? colon : rest + rlen;
        }
        long port;
        if (!colon || parse_int(colon + 1, (size_t)(rest + rlen - colon - 1), 1, 65535, &port) < 0)
            return c10d__fail(C10D_EINVAL,
                              "rendezvous %s: expected tcp://host:port (port 1..65535)", url);
        if (he == hs || (size_t)(he - hs) >= sizeof u->host)
            return c10d__fail(C10D_EINVAL, "rendezvous %s: missing or overlong host", url);
        memcpy(u->host, hs, (size_t)(he - hs));
        u->port = (int)port;
    } else if (!strcmp(u->scheme, "file")) {
        if (rlen == 0 || rlen >= sizeof u->path || rest[0] != '/')
            return c10d__fail(C10D_EINVAL, "rendezvous %s: expected file:///absolute/path", url);
        memcpy(u->path, rest, rlen);
    } else {
        return c10d__fail(C10D_EINVAL,
                          "rendezvous: unknown scheme '%s' in '%s' (expected env, tcp or file)",
                          u->scheme, url);
    }
    return parse_query(url, q ? q + 1 : NULL, u);
}

/* ------------------------------------------------------------ rendezvous */

/* At least 1 ms: a step that finds the time spent fails by its own timeout,
 * with its own message. */
static int64_t time_left(uint64_t start_ms, int64_t timeout_ms)
{
    int64_t left = timeout_ms - (int64_t)(c10d__now_ms() - start_ms);
    return left > 0 ? left : 1;
}

int c10d__rendezvous(const char *url, const c10d_rendezvous_opts *opts, c10d_rendezvous_result *out,
                     int *store_outlives_job)
{
    *store_outlives_job = 0;
    c10d_rendezvous_opts o;
    /* The 0.1 layout ends with dialect. */
    C10D_CHECK(c10d__opts_read(&o, sizeof o, offsetof(c10d_rendezvous_opts, dialect) + sizeof(int),
                               opts, "rendezvous"));
    if (!out)
        return c10d__fail(C10D_EINVAL, "rendezvous: out is NULL");
    memset(out, 0, sizeof *out);
    if (!url || !*url)
        url = "env://";
    if (o.timeout_ms < 0)
        return c10d__fail(C10D_EINVAL, "rendezvous: timeout_ms must be >= 0");
    if (!o.timeout_ms)
        o.timeout_ms = DEFAULT_TIMEOUT_MS;
    if (c10d__on_loop_thread())
        return c10d__fail(C10D_EDEADLK, "rendezvous: called on the loop thread");
    uint64_t start_ms = c10d__now_ms();
    struct url u;
    C10D_CHECK(parse_url(url, &u));
    if (o.world_size > 0) { /* the caller's rank/world_size fill what the URL lacks */
        if (!u.has_rank) {
            u.rank = o.rank;
            u.has_rank = 1;
        }
        if (!u.has_world_size) {
            u.world_size = o.world_size;
            u.has_world_size = 1;
        }
    }
    int agent = 0;
    if (!strcmp(u.scheme, "env")) {
        /* torch reads os.environ at init time: so do we. */
        c10d__env_reload();
        struct c10d__launch launch; /* the launcher's variables (launch_env.c) */
        C10D_CHECK(c10d__launch_detect(!u.has_rank || !u.has_world_size, o.timeout_ms, &launch));
        snprintf(u.host, sizeof u.host, "%s", launch.master_addr);
        u.port = launch.master_port;
        if (!u.has_rank) {
            u.rank = launch.rank;
            u.has_rank = 1;
        }
        if (!u.has_world_size) {
            u.world_size = launch.world_size;
            u.has_world_size = 1;
        }
        const char *a = c10d__env_str(C10D_ENV_USE_AGENT_STORE);
        agent = a && *a && c10d__env_bool(C10D_ENV_USE_AGENT_STORE);
    }
    if (!u.has_rank)
        return c10d__fail(C10D_EINVAL, "rendezvous %s: rank parameter missing", url);
    if (!u.has_world_size)
        return c10d__fail(C10D_EINVAL, "rendezvous %s: world_size parameter missing", url);
    if (u.rank >= u.world_size)
        return c10d__fail(C10D_EINVAL, "rendezvous %s: rank %d is out of range for world_size %d",
                          url, u.rank, u.world_size);

    c10d_store *base = NULL;
    if (!strcmp(u.scheme, "file")) {
        C10D_CHECK(c10d_store_file_open(u.path, u.world_size, &base));
        c10d_store_set_timeout(base, o.timeout_ms);
    } else {
        int hosting = u.rank == 0 && !o.external_store && !agent;
        if (hosting)
            C10D_CHECK(host_store(u.host, u.port, u.world_size));
        c10d_store_tcp_opts to = {.timeout_ms = o.timeout_ms,
                                  .dialect = o.dialect,
                                  .world_size = u.world_size,
                                  .wait_for_workers = hosting};
        int rc = c10d_store_tcp_connect(u.host, u.port, &to, &base);
        if (rc < 0) {
            /* Copied first: c10d__fail writes the buffer c10d_last_error() reads. */
            char msg[700];
            snprintf(msg, sizeof msg, "%s", c10d_last_error());
            return c10d__fail(rc, "rendezvous %s (rank %d of %d): %s", url, u.rank, u.world_size,
                              msg);
        }
    }
    /* A store this job did not start may hold earlier jobs' and attempts'
     * keys: this job's go under a namespace of its own (attempt.c). */
    int shared_store = strcmp(u.scheme, "file") != 0 && (agent || o.external_store);
    *store_outlives_job = shared_store;
    c10d_store *store = NULL;
    /* The steps after connecting share what is left of the timeout (the
     * connection keeps the whole of it as its ops' deadline). */
    int rc = c10d__attempt_store(base, u.rank, u.world_size, shared_store,
                                 time_left(start_ms, o.timeout_ms), &store);
    c10d_store_release(base);
    if (rc < 0) {
        char msg[800];
        snprintf(msg, sizeof msg, "%s", c10d_last_error());
        return c10d__fail(rc, "rendezvous %s (rank %d of %d): %s", url, u.rank, u.world_size, msg);
    }
    if (!o.no_barrier) {
        rc = c10d_store_barrier(store, "0", u.world_size, time_left(start_ms, o.timeout_ms));
        if (rc < 0) {
            char msg[700];
            snprintf(msg, sizeof msg, "%s", c10d_last_error());
            c10d_store_release(store);
            return c10d__fail(rc, "rendezvous %s (rank %d): %s", url, u.rank, msg);
        }
    }
    out->store = store;
    out->rank = u.rank;
    out->world_size = u.world_size;
    return 0;
}

int c10d_rendezvous(const char *url, const c10d_rendezvous_opts *opts, c10d_rendezvous_result *out)
{
    int store_outlives_job;
    return c10d__rendezvous(url, opts, out, &store_outlives_job);
}
