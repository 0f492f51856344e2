/* The c10drun instances of one job (one per node) meeting in the job's store, as torchrun's
 * agents meet in theirs: no node starts its ranks before every node is there with the same
 * number of ranks, a failure on any node stops every node's ranks, a node whose c10drun
 * falls silent (heartbeats) stops the others, a restart waits until every node's ranks are
 * gone and node 0 has emptied the store of the last attempt's keys, and node 0 keeps the
 * store up until every node's ranks are done.
 *
 * Only when the store is c10drun's own (TORCHELASTIC_USE_AGENT_STORE=True) and there is
 * something to coordinate: several nodes, or restarts. Keys, all under
 * c10drun/<run id>/, per attempt <a>: nproc/<a>/<node> and nproc_how/<a>/<node> (its
 * number of ranks, and the option it came from), joined/<a> (nodes that published theirs),
 * fail/<a> (a counter: > 0 once any node failed), fail_who/<a> (that node's one-line
 * account), stopped/<a> (nodes whose ranks are gone), cleaned/<a> (node 0 removed the
 * workers' keys), done/<a> (nodes whose ranks all exited 0), left/<a> (nodes that saw every
 * node done, or the nodes' numbers of ranks differ, and will not touch the store again),
 * done_by/<a>/<node> (that node's ranks all exited 0);
 * for the whole run: beat/<node> (a counter each node bumps at every poll).
 *
 * The client speaks the TCPStore wire protocol (docs/store_protocol.md, current dialect,
 * AUTH with C10D_STORE_TOKEN[_FILE] when set) with blocking calls on the loop thread from a
 * 200 ms timer: each call is bounded (connect 1 s, a reply 2 s), so signals and deadlines
 * wait at most that long. c10drun does not link the library, which may be the thing
 * being debugged. */
#include "c10drun.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/time.h>

#define AGENT_POLL_MS       200
#define AGENT_CONNECT_MS    1000
#define AGENT_IO_MS         2000
#define AGENT_LOST_AFTER    10    /* polls in a row without the store: it is gone */
#define AGENT_LEAVE_WAIT_MS 10000 /* node 0: how long the others may take to leave */
#define AGENT_WATCH_EVERY   5     /* polls between looks at the other nodes' heartbeats */

enum {
    CMD_VALIDATE = 0,
    CMD_SET = 1,
    CMD_GET = 3,
    CMD_ADD = 4,
    CMD_DELETE_KEY = 8,
    CMD_LIST_KEYS = 17,
    CMD_AUTH = 0x41,
};
#define VALIDATE_MAGIC 0x3C85F7CEu

struct msg {
    char *p;
    size_t len, cap;
};

static void msg_put(struct msg *m, const void *src, size_t n)
{
    if (m->len + n > m->cap) {
        m->cap = (m->len + n) * 2 + 64;
        m->p = xrealloc(m->p, m->cap);
    }
    memcpy(m->p + m->len, src, n);
    m->len += n;
}

static void put_u8(struct msg *m, uint8_t v)
{
    msg_put(m, &v, 1);
}

/* Little-endian, as the protocol wants, whatever the host. */
static void put_le(struct msg *m, uint64_t v, int bytes)
{
    uint8_t b[8];
    for (int i = 0; i < bytes; i++)
        b[i] = (uint8_t)(v >> (8 * i));
    msg_put(m, b, (size_t)bytes);
}

static void put_str(struct msg *m, const char *s, size_t n)
{
    put_le(m, n, 8);
    msg_put(m, s, n);
}

static void store_close(struct launcher *l)
{
    if (l->store_fd >= 0)
        close(l->store_fd);
    l->store_fd = -1;
}

static int io_all(struct launcher *l, void *buf, size_t n, bool out)
{
    char *p = buf;
    while (n > 0) {
        ssize_t k = out ? send(l->store_fd, p, n, MSG_NOSIGNAL) : recv(l->store_fd, p, n, 0);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

static int recv_le(struct launcher *l, uint64_t *v, int bytes)
{
    uint8_t b[8];
    if (io_all(l, b, (size_t)bytes, false) != 0)
        return -1;
    *v = 0;
    for (int i = 0; i < bytes; i++)
        *v |= (uint64_t)b[i] << (8 * i);
    return 0;
}

/* A value of at most `max` bytes, malloc'd and NUL-terminated. */
static int recv_str(struct launcher *l, char **out, size_t max)
{
    uint64_t n;
    if (recv_le(l, &n, 8) != 0 || n > max)
        return -1;
    char *s = xmalloc((size_t)n + 1);
    if (io_all(l, s, (size_t)n, false) != 0) {
        free(s);
        return -1;
    }
    s[n] = '\0';
    *out = s;
    return 0;
}

static char *read_token(void)
{
    const char *t = getenv("C10D_STORE_TOKEN");
    if (t && *t)
        return xstrdup(t);
    const char *file = getenv("C10D_STORE_TOKEN_FILE");
    if (!file || !*file)
        return NULL;
    FILE *f = fopen(file, "r");
    if (!f)
        return NULL;
    char line[4096];
    char *tok = fgets(line, sizeof line, f) ? xstrdup(line) : NULL;
    fclose(f);
    if (tok)
        tok[strcspn(tok, "\r\n")] = '\0';
    return tok;
}

static int store_connect(struct launcher *l)
{
    if (l->store_fd >= 0)
        return 0;
    const struct sockaddr *sa = (const struct sockaddr *)&l->master_sa;
    socklen_t len =
        sa->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
    int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return -1;
    l->store_fd = fd;
    if (connect(fd, sa, len) != 0) {
        struct pollfd pfd = {.fd = fd, .events = POLLOUT};
        int err = 0;
        socklen_t el = sizeof err;
        if (errno != EINPROGRESS || poll(&pfd, 1, AGENT_CONNECT_MS) != 1 ||
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0 || err != 0) {
            store_close(l);
            return -1;
        }
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    struct timeval tv = {.tv_sec = AGENT_IO_MS / 1000, .tv_usec = (AGENT_IO_MS % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct msg m = {0};
    put_u8(&m, CMD_VALIDATE);
    put_le(&m, VALIDATE_MAGIC, 4);
    char *token = read_token();
    bool auth = token != NULL; /* the token itself is freed before the reply is read */
    if (auth) {
        put_u8(&m, CMD_AUTH);
        put_str(&m, token, strlen(token));
        free(token);
    }
    int rc = io_all(l, m.p, m.len, true);
    free(m.p);
    uint64_t accepted = 1;
    if (rc == 0 && auth)
        rc = recv_le(l, &accepted, 1);
    if (rc != 0 || accepted != 1) {
        store_close(l);
        return -1;
    }
    return 0;
}

/* Sends `m` (and frees it) on a connection made first if needed. */
static int store_send(struct launcher *l, struct msg *m)
{
    int rc = store_connect(l) == 0 ? io_all(l, m->p, m->len, true) : -1;
    free(m->p);
    m->p = NULL;
    if (rc != 0)
        store_close(l);
    return rc;
}

static char *agent_key(struct launcher *l, const char *what)
{
    return xasprintf("c10drun/%s/%s/%d", l->run_id, what, l->restart_count);
}

/* This attempt's key `what` of node `node`. */
static char *node_key(struct launcher *l, const char *what, int node)
{
    return xasprintf("c10drun/%s/%s/%d/%d", l->run_id, what, l->restart_count, node);
}

/* Node `node`'s heartbeat: one counter for the whole run, not per attempt. */
static char *beat_key(struct launcher *l, int node)
{
    return xasprintf("c10drun/%s/beat/%d", l->run_id, node);
}

/* ADD `delta` to the counter `key` (freed here); delta 0 reads it (0 when it is not set). */
static int store_add_key(struct launcher *l, char *key, int64_t delta, int64_t *out)
{
    struct msg m = {0};
    put_u8(&m, CMD_ADD);
    put_str(&m, key, strlen(key));
    put_le(&m, (uint64_t)delta, 8);
    free(key);
    uint64_t v;
    if (store_send(l, &m) != 0 || recv_le(l, &v, 8) != 0) {
        store_close(l);
        return -1;
    }
    *out = (int64_t)v;
    return 0;
}

/* ADD `delta` to this attempt's counter `what`; delta 0 reads it. */
static int store_add(struct launcher *l, const char *what, int64_t delta, int64_t *out)
{
    return store_add_key(l, agent_key(l, what), delta, out);
}

/* SET `key` (freed here). */
static int store_set_key(struct launcher *l, char *key, const char *value)
{
    struct msg m = {0};
    put_u8(&m, CMD_SET);
    put_str(&m, key, strlen(key));
    put_str(&m, value, strlen(value));
    free(key);
    return store_send(l, &m);
}

static int store_set(struct launcher *l, const char *what, const char *value)
{
    return store_set_key(l, agent_key(l, what), value);
}

/* GET `key` (freed here). Our server answers GET of a missing key with an empty value: only
 * read keys known set. */
static char *store_get_key(struct launcher *l, char *key)
{
    struct msg m = {0};
    put_u8(&m, CMD_GET);
    put_str(&m, key, strlen(key));
    free(key);
    char *v = NULL;
    if (store_send(l, &m) != 0 || recv_str(l, &v, 4096) != 0)
        store_close(l);
    return v;
}

static char *store_get(struct launcher *l, const char *what)
{
    return store_get_key(l, agent_key(l, what));
}

/* Node 0, between attempts, once every node's ranks are gone: the workers' keys of the last
 * attempt go, so the next one starts in an empty store. libc10d's env:// and torch's ranks
 * keep attempts apart by prefix anyway; a program using the store some other way may not,
 * and the store's memory would grow with every attempt. */
static int clean_worker_keys(struct launcher *l)
{
    struct msg m = {0};
    put_u8(&m, CMD_LIST_KEYS);
    uint64_t n;
    if (store_send(l, &m) != 0 || recv_le(l, &n, 8) != 0 || n > (1u << 24)) {
        store_close(l);
        return -1;
    }
    char **keys = xmalloc((size_t)n * sizeof *keys + 1);
    uint64_t got = 0;
    for (; got < n; got++)
        if (recv_str(l, &keys[got], 1 << 20) != 0)
            break;
    int rc = got == n ? 0 : -1;
    int removed = 0;
    for (uint64_t i = 0; i < got; i++) {
        if (rc == 0 && strncmp(keys[i], "c10drun/", 8) != 0) {
            struct msg d = {0};
            put_u8(&d, CMD_DELETE_KEY);
            put_str(&d, keys[i], strlen(keys[i]));
            uint64_t deleted;
            if (store_send(l, &d) != 0 || recv_le(l, &deleted, 8) != 0)
                rc = -1;
            else
                removed++;
        }
        free(keys[i]);
    }
    free(keys);
    if (rc != 0)
        store_close(l);
    else
        VERBOSE(l, "removed %d key(s) of attempt %d from the store", removed, l->restart_count);
    return rc;
}

/* ------------------------------------------------------------------ the poll */

static void agent_end(struct launcher *l)
{
    l->agent_done = true;
    uv_timer_stop(&l->agent_timer);
    maybe_finish(l);
}

static void store_lost(struct launcher *l)
{
    say(l, "lost the store at %s:%s (%d tries in a row without an answer); stopping",
        l->opt.master_addr, l->port_text, AGENT_LOST_AFTER);
    set_code(l, EXIT_LAUNCHER);
    l->no_restart = true;
    l->restart_wanted = false;
    begin_stop(l, SIGTERM);
    agent_end(l);
}

/* Another node failed: its account, or a plain line if it could not leave one. */
static void remote_failure(struct launcher *l)
{
    char *who = store_get(l, "fail_who");
    say(l, "%s; stopping this node's ranks", who && *who ? who : "another node failed");
    free(who);
    set_code(l, EXIT_LAUNCHER);
}

static bool can_restart(struct launcher *l)
{
    return !l->no_restart && l->restart_count < l->opt.max_restarts;
}

/* ------------------------------------------------------------------ joining */

/* The job cannot start: stop (there are no ranks yet) and end. */
static void join_end(struct launcher *l)
{
    set_code(l, EXIT_LAUNCHER);
    l->no_restart = true;
    l->restart_wanted = false;
    begin_stop(l, SIGTERM);
    agent_end(l);
}

/* Each node says it saw how the job ends (a failed join, every node done); node 0 keeps the
 * store until the others have (at most AGENT_LEAVE_WAIT_MS), so every node reports it rather
 * than losing the store first. Then `end`. */
static int leave_when_seen(struct launcher *l, void (*end)(struct launcher *))
{
    int64_t n;
    if (!l->hosts_store) {
        store_add(l, "left", 1, &n); /* best effort: node 0 waits a bounded time anyway */
        end(l);
        return 0;
    }
    if (l->all_done_at == 0)
        l->all_done_at = uv_now(&l->loop);
    if (store_add(l, "left", 0, &n) != 0)
        return -1;
    if (n >= l->opt.nnodes - 1 || uv_now(&l->loop) - l->all_done_at > AGENT_LEAVE_WAIT_MS)
        end(l);
    return 0;
}

static int join_leave(struct launcher *l)
{
    return leave_when_seen(l, join_end);
}

/* Appends ", " (after the first) and the formatted text to out[cap], "..." once full. */
static void list_add(char *out, size_t cap, const char *fmt, int k, const char *extra)
{
    size_t used = strlen(out);
    if (used + 4 >= cap)
        return;
    int w = snprintf(out + used, cap - used, "%s", used ? ", " : "");
    w += snprintf(out + used + w, cap - used - (size_t)w, fmt, k, extra);
    if (used + (size_t)w >= cap - 4)
        snprintf(out + used, cap - used, "%s...", used ? ", " : "");
}

/* Every node runs the same number of ranks, or RANK (node rank x n + local rank) and
 * WORLD_SIZE (nodes x n) disagree between nodes and the ranks wait for each other until a
 * timeout. So before the first attempt, every node publishes its n (and where it came from:
 * -n auto/cpu/gpu or PET_NPROC_PER_NODE can make it differ) and starts its ranks only once
 * every node has, with the same n; each node compares all of them itself, so a mismatch
 * stops every node at once, each with the same line. Bounded by --store-timeout (default
 * 600 s here, on every node: nodes may be started in any order within 10 minutes). */
static int poll_join(struct launcher *l)
{
    int64_t n, failed;
    int nn = l->opt.nnodes;
    if (l->join_failed)
        return join_leave(l);
    /* One step at a time, so a step retried after a store error is not done twice. */
    if (l->join_step == 0) {
        char how[160];
        snprintf(how, sizeof how, "%s %s", l->opt.nproc_src, l->opt.nproc_spec);
        if (store_set_key(l, node_key(l, "nproc_how", l->opt.node_rank), how) != 0)
            return -1;
        l->join_step = 1;
    }
    if (l->join_step == 1) {
        if (store_add_key(l, node_key(l, "nproc", l->opt.node_rank), l->opt.nprocs, &n) != 0)
            return -1;
        l->join_step = 2;
    }
    if (l->join_step == 2) {
        if (store_add(l, "joined", 1, &n) != 0)
            return -1;
        l->join_step = 3;
    }
    if (store_add(l, "fail", 0, &failed) != 0)
        return -1;
    if (store_add(l, "joined", 0, &n) != 0)
        return -1;
    if (failed > 0) {
        remote_failure(l);
        if (n >= nn && can_restart(l)) {
            /* Every node joined, and another node's ranks already failed this attempt
             * before this node saw the join complete: the job restarts as a whole once
             * every node stopped (this one has no rank to stop). */
            l->watching = true;
            l->watch_reset = true;
            l->phase = PHASE_RESTART_WAIT;
            l->marked = false;
            l->wait_since = uv_now(&l->loop);
            return 0;
        }
        join_end(l); /* another node got a signal while joining, or no restart is left */
        return 0;
    }
    int64_t *v = xmalloc((size_t)nn * sizeof *v);
    bool all = n >= nn;
    bool late = !all && uv_now(&l->loop) - l->wait_since > (uint64_t)(l->opt.join_timeout_s * 1000);
    if (all || late) {
        for (int k = 0; k < nn; k++) {
            if (store_add_key(l, node_key(l, "nproc", k), 0, &v[k]) != 0) {
                free(v);
                return -1;
            }
        }
    }
    char list[1024] = "";
    if (late) {
        for (int k = 0; k < nn; k++)
            if (v[k] == 0)
                list_add(list, sizeof list, "%d%s", k, "");
        say(l, "node(s) %s did not join within %g s (--store-timeout); not starting the ranks",
            list, l->opt.join_timeout_s);
        free(v);
        join_end(l);
        return 0;
    }
    if (!all) {
        free(v);
        return 0;
    }
    bool same = true;
    for (int k = 1; k < nn; k++)
        same = same && v[k] == v[0];
    if (same) {
        free(v);
        VERBOSE(l, "all %d node(s) joined, %d rank(s) each", nn, l->opt.nprocs);
        l->watching = true;
        l->watch_reset = true;
        start_ranks(l);
        return 0;
    }
    for (int k = 0; k < nn; k++) {
        char *how = store_get_key(l, node_key(l, "nproc_how", k));
        char val[256];
        snprintf(val, sizeof val, "%lld (%s)", (long long)v[k], how && *how ? how : "?");
        free(how);
        list_add(list, sizeof list, "node %d: %s", k, val);
    }
    free(v);
    say(l,
        "the nodes do not run the same number of ranks: %s; every node needs the same -n "
        "(WORLD_SIZE is --nnodes x n); not starting the ranks",
        list);
    l->join_failed = true;
    set_code(l, EXIT_LAUNCHER);
    l->no_restart = true;
    return join_leave(l);
}

/* ------------------------------------------------------------------ heartbeats */

/* Every node bumps its counter at every poll once the nodes joined. Every AGENT_WATCH_EVERY
 * polls, node 0 looks at every other node's, the others at node 0's (node 0's c10drun gone
 * takes its store along, which the others notice anyway; this covers a node 0 that hangs). A
 * counter that has not moved for --store-timeout: that c10drun is gone (SIGKILL, its host
 * lost, cut off from the store). */
static int beat(struct launcher *l)
{
    int64_t n;
    if (l->opt.nnodes < 2 || !l->watching)
        return 0;
    return store_add_key(l, beat_key(l, l->opt.node_rank), 1, &n);
}

static void peers_lost(struct launcher *l, const char *nodes)
{
    char what[1200];
    snprintf(what, sizeof what,
             "no word from the c10drun of node(s) %s for %g s (--store-timeout): killed, or its "
             "host lost",
             nodes, l->opt.store_timeout_s);
    char account[1300];
    snprintf(account, sizeof account, "node %d: %s", l->opt.node_rank, what);
    l->no_restart = true; /* a restart needs every node */
    l->restart_wanted = false;
    if (l->phase == PHASE_NODES_WAIT) {
        say(l,
            "this node's ranks all exited 0, but %s; how the ranks there ended is unknown, "
            "so the job failed",
            what);
        set_code(l, EXIT_LAUNCHER);
        agent_report_failure(l, account);
        agent_end(l);
        return;
    }
    say(l, "%s; stopping this node's ranks", what);
    set_code(l, EXIT_LAUNCHER);
    agent_report_failure(l, account);
    begin_failure(l);
}

/* Called where a silent node would keep this one waiting: the ranks running, or done and
 * waiting for the other nodes. */
static int watch_peers(struct launcher *l)
{
    int nn = l->opt.nnodes;
    if (!l->watching || nn < 2 || l->polls % AGENT_WATCH_EVERY != 0)
        return 0;
    uint64_t now = uv_now(&l->loop);
    if (!l->beat_seen) {
        l->beat_seen = xmalloc((size_t)nn * sizeof *l->beat_seen);
        l->beat_at = xmalloc((size_t)nn * sizeof *l->beat_at);
    }
    if (l->watch_reset) { /* the window counts only while watching */
        for (int k = 0; k < nn; k++) {
            l->beat_seen[k] = -1;
            l->beat_at[k] = now;
        }
        l->watch_reset = false;
    }
    char list[1024] = "";
    int first = l->opt.node_rank == 0 ? 1 : 0, last = l->opt.node_rank == 0 ? nn - 1 : 0;
    for (int k = first; k <= last; k++) {
        int64_t v;
        if (store_add_key(l, beat_key(l, k), 0, &v) != 0)
            return -1;
        if (v != l->beat_seen[k]) {
            l->beat_seen[k] = v;
            l->beat_at[k] = now;
        } else if (now - l->beat_at[k] > (uint64_t)(l->opt.store_timeout_s * 1000)) {
            /* Silent after saying its ranks succeeded: its part is done, not lost. */
            int64_t done;
            if (store_add_key(l, node_key(l, "done_by", k), 0, &done) != 0)
                return -1;
            if (done == 0)
                list_add(list, sizeof list, "%d%s", k, "");
        }
    }
    if (list[0])
        peers_lost(l, list);
    return 0;
}

/* Returns 0, or -1 when the store did not answer. */
static int poll_once(struct launcher *l)
{
    int64_t failed, n;
    if (beat(l) != 0)
        return -1;
    switch (l->phase) {
    case PHASE_JOIN:
        return poll_join(l);
    case PHASE_RUN:
        if (l->failing || l->stopping) {
            l->watch_reset = true;
            return 0;
        }
        if (store_add(l, "fail", 0, &failed) != 0)
            return -1;
        if (failed > 0) {
            remote_failure(l);
            begin_failure(l);
            return 0;
        }
        return watch_peers(l);
    case PHASE_RESTART_WAIT:
        l->watch_reset = true;
        if (!l->marked) {
            if (store_add(l, "stopped", 1, &n) != 0)
                return -1;
            l->marked = true;
        }
        if (store_add(l, "stopped", 0, &n) != 0)
            return -1;
        if (n < l->opt.nnodes) {
            if (uv_now(&l->loop) - l->wait_since > (uint64_t)(l->opt.store_timeout_s * 1000)) {
                say(l,
                    "only %lld of %d node(s) stopped their ranks within %g s "
                    "(--store-timeout); no restart",
                    (long long)n, l->opt.nnodes, l->opt.store_timeout_s);
                set_code(l, EXIT_LAUNCHER); /* kept if the attempt's failure set one */
                l->no_restart = true;
                agent_end(l);
            }
            return 0;
        }
        if (store_add(l, "cleaned", 0, &n) != 0)
            return -1;
        if (n == 0 && l->hosts_store) {
            if (clean_worker_keys(l) != 0 || store_add(l, "cleaned", 1, &n) != 0)
                return -1;
        }
        if (n > 0)
            restart_ranks(l);
        return 0;
    case PHASE_NODES_WAIT:
        if (!l->marked) {
            /* Per node first: a node done and then gone is no node lost (watch_peers). */
            if (store_add_key(l, node_key(l, "done_by", l->opt.node_rank), 1, &n) != 0 ||
                store_add(l, "done", 1, &n) != 0)
                return -1;
            l->marked = true;
        }
        if (store_add(l, "fail", 0, &failed) != 0)
            return -1;
        if (failed > 0) {
            /* This node's ranks succeeded, another's did not: this node restarts too (the
             * job restarts as a whole) or ends with the failure. */
            remote_failure(l);
            if (can_restart(l)) {
                l->phase = PHASE_RESTART_WAIT;
                l->marked = false;
                l->wait_since = uv_now(&l->loop);
            } else {
                agent_end(l);
            }
            return 0;
        }
        if (store_add(l, "done", 0, &n) != 0)
            return -1;
        if (n < l->opt.nnodes)
            return watch_peers(l);
        /* Node 0 keeps the store until the others have seen that every node is done. */
        return leave_when_seen(l, agent_end);
    default:
        return 0;
    }
}

static void on_agent_poll(uv_timer_t *t)
{
    struct launcher *l = t->data;
    if (l->agent_done || l->phase == PHASE_DONE)
        return;
    l->polls++;
    if (poll_once(l) == 0) {
        l->store_errors = 0;
    } else if (++l->store_errors >= AGENT_LOST_AFTER && !l->agent_done) {
        store_lost(l);
    }
}

void agent_start(struct launcher *l)
{
    if (!uv_is_active((uv_handle_t *)&l->agent_timer))
        uv_timer_start(&l->agent_timer, on_agent_poll, AGENT_POLL_MS, AGENT_POLL_MS);
}

/* This node's first failure of the attempt, for the other nodes to see at their next poll.
 * If another node failed first, its account stays (ours is likely a consequence of it) and
 * is printed here too, since it names where the job broke. */
void agent_report_failure(struct launcher *l, const char *what)
{
    int64_t n;
    int rc = store_add(l, "fail", 0, &n);
    if (rc == 0 && n > 0) {
        char *who = store_get(l, "fail_who");
        if (who && *who)
            say(l, "before that, %s", who);
        free(who);
    } else if (rc == 0) {
        rc = store_set(l, "fail_who", what);
    }
    if (rc != 0 || store_add(l, "fail", 1, &n) != 0)
        say(l,
            "cannot tell the other nodes about the failure: the store at %s:%s does not "
            "answer",
            l->opt.master_addr, l->port_text);
}

void agent_close(struct launcher *l)
{
    uv_timer_stop(&l->agent_timer);
    store_close(l);
    free(l->beat_seen);
    free(l->beat_at);
    l->beat_seen = NULL;
    l->beat_at = NULL;
    l->watching = false;
}
