/* A TCPStore server any program can start in its own process
 * (c10d_store_tcp_serve), on the engine loop like rank 0's: PyTorch's
 * TCPStore(is_master=True) without a job around it. It serves until
 * c10d_store_server_stop, or until c10d_shutdown stops it with the loop. */
#include "c10d.h"

#include "engine/error.h"
#include "engine/loop.h"
#include "engine/loop_call.h"
#include "engine/token.h"
#include "store_server/server/server.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct c10d_store_server {
    struct c10d__store_server *server; /* NULL once stopped (loop thread) */
    atomic_int ended;                  /* stopped by c10d_shutdown: only the handle is left */
    struct c10d__shutdown_hook hook;
    int port;
    char host[256];
    int any_host;
};

/* The engine stops: so does the server, and the handle only awaits its free. */
static void stop_at_shutdown(struct c10d__shutdown_hook *hook)
{
    struct c10d_store_server *s =
        (struct c10d_store_server *)((char *)hook - offsetof(struct c10d_store_server, hook));
    if (s->server != NULL)
        c10d__store_server_stop(s->server, NULL, NULL);
    s->server = NULL;
    atomic_store(&s->ended, 1);
}

static void serve_on_loop(struct c10d__loop_call *call, void *arg)
{
    struct c10d_store_server *s = arg;
    struct c10d__store_server_opts o = {.host = s->any_host ? NULL : s->host, .port = s->port};
    int rc = c10d__token_get(&o.token, &o.token_len);
    if (rc == 0)
        rc = c10d__store_server_start(c10d__engine_loop(), &o, &s->server);
    if (rc == 0) {
        s->port = c10d__store_server_port(s->server);
        s->hook.fn = stop_at_shutdown;
        c10d__engine_on_shutdown(&s->hook);
    }
    c10d__loop_call_done(call, rc, rc < 0 ? c10d_last_error() : NULL);
}

/* The caller gave up waiting: the loop side stops what it may have started. */
static void serve_abandoned(void *arg)
{
    struct c10d_store_server *s = arg;
    if (s->server != NULL) {
        c10d__engine_remove_shutdown_hook(&s->hook);
        c10d__store_server_stop(s->server, NULL, NULL);
    }
    free(s);
}

int c10d_store_tcp_serve(const char *host, int port, c10d_store_server **out, int *port_out)
{
    if (out != NULL)
        *out = NULL;
    if (out == NULL)
        return c10d__fail(C10D_EINVAL, "c10d_store_tcp_serve: out is NULL");
    if (port < 0 || port > 65535)
        return c10d__fail(C10D_EINVAL, "c10d_store_tcp_serve: port %d is out of range (0: any)",
                          port);
    if (host != NULL && strlen(host) >= sizeof((struct c10d_store_server *)0)->host)
        return c10d__fail(C10D_EINVAL, "c10d_store_tcp_serve: host name too long");
    C10D_CHECK(c10d__engine_start());
    struct c10d_store_server *s = calloc(1, sizeof *s);
    if (s == NULL)
        return c10d__fail(C10D_ENOMEM, "c10d_store_tcp_serve: out of memory");
    s->any_host = host == NULL || host[0] == '\0' || strcmp(host, "*") == 0;
    if (!s->any_host)
        snprintf(s->host, sizeof s->host, "%s", host);
    s->port = port;
    int abandoned = 0;
    int rc =
        c10d__loop_call_run(serve_on_loop, s, serve_abandoned, 30000,
                            "c10d_store_tcp_serve: the loop did not answer in 30 s", &abandoned);
    if (abandoned)
        return rc;
    if (rc < 0) {
        free(s);
        return rc;
    }
    if (port_out != NULL)
        *port_out = s->port;
    *out = s;
    return 0;
}

static void stop_on_loop(struct c10d__loop_call *call, void *arg)
{
    struct c10d_store_server *s = arg;
    if (s->server != NULL) {
        c10d__engine_remove_shutdown_hook(&s->hook);
        c10d__store_server_stop(s->server, NULL, NULL);
        s->server = NULL;
    }
    c10d__loop_call_done(call, 0, NULL);
}

int c10d_store_server_stop(c10d_store_server *s)
{
    if (s == NULL)
        return 0;
    /* An engine that shut down since stopped the server already: only the
     * handle is left (a loop call would start a new engine for nothing). */
    if (atomic_load(&s->ended)) {
        free(s);
        return 0;
    }
    int abandoned = 0;
    /* Posting fails if the engine is stopping: its hook has run (or runs
     * before posting closes), so the server is stopped either way. */
    int rc =
        c10d__loop_call_run(stop_on_loop, s, free, 30000,
                            "c10d_store_server_stop: the loop did not answer in 30 s", &abandoned);
    if (abandoned)
        return rc;
    free(s);
    return rc == C10D_EABORTED || rc == C10D_ECLOSED ? 0 : rc;
}
