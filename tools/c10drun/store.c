/* Starting the job: where its store listens (MASTER_ADDR/port), finding and
 * starting the external c10d-store, probing its port until it answers, then
 * the ranks. */
#include "c10drun.h"

/* ------------------------------------------------------------------ ranks, store */

/* mkdir -p */
static int make_dirs(char *path)
{
    for (char *p = path + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        int rc = mkdir(path, 0755);
        *p = '/';
        if (rc != 0 && errno != EEXIST)
            return -1;
    }
    return mkdir(path, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

/* --tee/--redirects: opens the files of one rank's streams, torchrun's layout but without
 * its random part: <log dir>/<run id>/attempt_<n>/<local rank>/std{out,err}.log. */
static int open_logs(struct launcher *l, struct child *c)
{
    c->out.log_fd = c->err.log_fd = -1;
    c->out.console = c->err.console = true;
    if (!l->opt.log_dir)
        return 0;
    int tee = std_spec_for(l->opt.tee, c->local_rank);
    int redirect = std_spec_for(l->opt.redirects, c->local_rank);
    int to_file = tee | redirect;
    if (!to_file)
        return 0;
    char *dir = xasprintf("%s/%s/attempt_%d/%d", l->opt.log_dir, l->run_id, l->restart_count,
                          c->local_rank);
    int rc = make_dirs(dir);
    struct out_stream *streams[2] = {&c->out, &c->err};
    static const char *const names[2] = {"stdout.log", "stderr.log"};
    for (int i = 0; rc == 0 && i < 2; i++) {
        int bit = 1 << i; /* 1 stdout, 2 stderr */
        if (!(to_file & bit))
            continue;
        char *path = xasprintf("%s/%s", dir, names[i]);
        streams[i]->log_fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (streams[i]->log_fd < 0)
            rc = -1;
        streams[i]->console = !(redirect & bit) || (tee & bit);
        free(path);
    }
    if (rc != 0)
        say(l, "--log-dir: cannot create the log files of rank %d under %s: %s", c->rank, dir,
            strerror(errno));
    free(dir);
    return rc;
}

void start_ranks(struct launcher *l)
{
    l->phase = PHASE_RUN;
    if (l->opt.timeout_s > 0 && !uv_is_active((uv_handle_t *)&l->deadline_timer))
        uv_timer_start(&l->deadline_timer, on_deadline, (uint64_t)(l->opt.timeout_s * 1000), 0);
    char *argv[l->opt.argc + 1];
    argv[0] = l->program_path;
    for (int i = 1; i < l->opt.argc; i++)
        argv[i] = l->opt.argv[i];
    argv[l->opt.argc] = NULL;
    if (l->restart_count > 0)
        say(l, "restarting the ranks: attempt %d of at most %d restarts", l->restart_count,
            l->opt.max_restarts);
    for (int r = 0; r < l->opt.nprocs; r++) {
        struct child *c = &l->ranks[r];
        c->local_rank = r;
        c->rank = l->opt.node_rank * l->opt.nprocs + r;
        snprintf(c->name, sizeof c->name, "rank %d", c->rank);
        snprintf(c->prefix, sizeof c->prefix, l->opt.prefix ? "[rank%d]: " : "", c->rank);
        if (open_logs(l, c) != 0) {
            set_code(l, EXIT_LAUNCHER);
            l->no_restart = true;
            begin_stop(l, SIGTERM);
            return;
        }
        char **env = rank_env(l, r);
        int rc = spawn_child(l, c, argv, env, on_rank_exit);
        free_rank_env(l, env);
        if (rc != 0) {
            say(l, "cannot start rank %d (%s): %s", c->rank, l->program_path, uv_strerror(rc));
            set_code(l, EXIT_LAUNCHER);
            l->no_restart = true;
            begin_stop(l, SIGTERM);
            return;
        }
        l->started = r + 1;
        l->live_ranks++;
        VERBOSE(l, "rank %d: pid %d", c->rank, (int)c->pid);
    }
}

/* The next attempt: the last one's ranks and pipes are gone; their memory is kept (their
 * handles may still be closing). */
void restart_ranks(struct launcher *l)
{
    struct old_ranks *o = xmalloc(sizeof *o);
    o->ranks = l->ranks;
    o->next = l->old;
    l->old = o;
    l->ranks = calloc((size_t)l->opt.nprocs, sizeof *l->ranks);
    if (!l->ranks) {
        say(l, "out of memory");
        exit(EXIT_LAUNCHER);
    }
    l->restart_count++;
    l->started = 0;
    l->failing = l->restart_wanted = l->stopping = false;
    l->have_code = false;
    l->exit_code = 0;
    l->marked = false;
    uv_timer_stop(&l->grace_timer);
    uv_timer_stop(&l->failure_timer);
    start_ranks(l);
}

static void probe_store(struct launcher *l);

static void on_probe_retry(uv_timer_t *t)
{
    probe_store(t->data);
}

static void on_probe_closed(uv_handle_t *h)
{
    struct launcher *l = h->data;
    l->probe_open = false;
    int status = (int)(intptr_t)l->probe_req.data;
    if (l->phase != PHASE_STORE_WAIT || l->stopping) {
        maybe_finish(l);
        return;
    }
    if (status == 0) {
        uv_timer_stop(&l->store_deadline_timer);
        VERBOSE(l, "the store accepts connections on %s:%s", l->opt.master_addr, l->port_text);
        if (l->coordinate)
            l->up.agent_start(l);
        if (l->coordinate && l->opt.nnodes > 1) {
            /* agent.c starts the ranks once every node joined with the same -n. */
            l->phase = PHASE_JOIN;
            l->wait_since = uv_now(&l->loop);
        } else {
            start_ranks(l);
        }
    } else {
        uv_timer_start(&l->probe_timer, on_probe_retry, PROBE_MS, 0);
    }
}

static void on_probe_connect(uv_connect_t *req, int status)
{
    struct launcher *l = req->data;
    req->data = (void *)(intptr_t)status;
    /* At the end of the job the probe may already be closing (UV_ECANCELED). */
    if (!uv_is_closing((uv_handle_t *)&l->probe))
        uv_close((uv_handle_t *)&l->probe, on_probe_closed);
}

static void on_resolved(uv_getaddrinfo_t *req, int status, struct addrinfo *res)
{
    struct launcher *l = req->data;
    l->resolving = false;
    if (status == 0 && res && res->ai_addrlen <= sizeof l->master_sa) {
        memcpy(&l->master_sa, res->ai_addr, res->ai_addrlen);
        l->master_unresolved = false;
        VERBOSE(l, "%s resolves now", l->opt.master_addr);
    }
    uv_freeaddrinfo(res);
    if (l->phase != PHASE_STORE_WAIT || l->stopping) {
        maybe_finish(l);
        return;
    }
    uv_timer_start(&l->probe_timer, on_probe_retry, l->master_unresolved ? RESOLVE_RETRY_MS : 0, 0);
}

/* Node 0's name may appear only after this node started (a Kubernetes Service): it is
 * looked up again, off the loop thread (a slow resolver must not delay signals). */
static void start_resolve(struct launcher *l)
{
    static const struct addrinfo hints = {
        .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
    l->resolve_req.data = l;
    if (uv_getaddrinfo(&l->loop, &l->resolve_req, on_resolved, l->opt.master_addr, l->port_text,
                       &hints) == 0)
        l->resolving = true;
    else
        uv_timer_start(&l->probe_timer, on_probe_retry, RESOLVE_RETRY_MS, 0);
}

static void probe_store(struct launcher *l)
{
    if (l->phase != PHASE_STORE_WAIT || l->stopping || l->probe_open || l->resolving)
        return;
    if (l->master_unresolved) {
        start_resolve(l);
        return;
    }
    uv_tcp_init(&l->loop, &l->probe);
    l->probe.data = l;
    l->probe_open = true;
    l->probe_req.data = l;
    int rc = uv_tcp_connect(&l->probe_req, &l->probe, (struct sockaddr *)&l->master_sa,
                            on_probe_connect);
    if (rc != 0) {
        l->probe_req.data = (void *)(intptr_t)rc;
        uv_close((uv_handle_t *)&l->probe, on_probe_closed);
    }
}

static void on_store_deadline(uv_timer_t *t)
{
    struct launcher *l = t->data;
    if (l->phase != PHASE_STORE_WAIT)
        return;
    if (l->have_store)
        say(l,
            "the store %s (pid %d) did not accept connections on %s:%s within %g s "
            "(--store-timeout)",
            l->store_path, (int)l->store.pid, l->opt.master_addr, l->port_text,
            l->opt.store_timeout_s);
    else if (l->master_unresolved)
        say(l, "node 0's address %s did not resolve within %g s (--store-timeout)",
            l->opt.master_addr, l->opt.store_timeout_s);
    else
        say(l,
            "node 0's store did not accept connections on %s:%s within %g s (--store-timeout); "
            "is c10drun --node-rank 0 running there?",
            l->opt.master_addr, l->port_text, l->opt.store_timeout_s);
    set_code(l, EXIT_LAUNCHER);
    begin_stop(l, SIGTERM);
}

void start_store(struct launcher *l)
{
    struct child *c = &l->store;
    c->rank = -1;
    c->out.log_fd = c->err.log_fd = -1;
    c->out.console = c->err.console = true;
    snprintf(c->name, sizeof c->name, "store");
    snprintf(c->prefix, sizeof c->prefix, "[store]: ");
    char *argv[] = {l->store_path, "serve",      "--host", (char *)l->store_host,
                    "--port",      l->port_text, NULL};
    l->have_store = true;
    int rc = spawn_child(l, c, argv, environ, on_store_exit);
    if (rc != 0) {
        say(l, "cannot start the store %s: %s", l->store_path, uv_strerror(rc));
        set_code(l, EXIT_LAUNCHER);
        l->stopping = true;
        return;
    }
    VERBOSE(l, "store: %s serve --host %s --port %s (pid %d)", l->store_path, l->store_host,
            l->port_text, (int)c->pid);
    await_store(l);
}

/* Probes the store's port until it accepts connections, within --store-timeout. */
void await_store(struct launcher *l)
{
    l->phase = PHASE_STORE_WAIT;
    uv_timer_start(&l->store_deadline_timer, on_store_deadline,
                   (uint64_t)(l->opt.store_timeout_s * 1000), 0);
    if (l->opt.timeout_s > 0)
        uv_timer_start(&l->deadline_timer, on_deadline, (uint64_t)(l->opt.timeout_s * 1000), 0);
    probe_store(l);
}

/* ------------------------------------------------------------------ setup */

/* PATH lookup as execvp would do it, but up front, so a typo fails before anything starts. */
char *find_in_path(const char *name)
{
    if (strchr(name, '/'))
        return access(name, X_OK) == 0 ? xstrdup(name) : NULL;
    const char *path = getenv("PATH");
    if (!path || !*path)
        path = "/usr/local/bin:/usr/bin:/bin";
    while (*path) {
        const char *colon = strchr(path, ':');
        size_t n = colon ? (size_t)(colon - path) : strlen(path);
        char *cand = n ? xasprintf("%.*s/%s", (int)n, path, name) : xasprintf("./%s", name);
        struct stat st;
        if (stat(cand, &st) == 0 && S_ISREG(st.st_mode) && access(cand, X_OK) == 0)
            return cand;
        free(cand);
        path += n;
        if (*path == ':')
            path++;
    }
    return NULL;
}

char *find_store(struct launcher *l, char *looked, size_t looked_len)
{
    if (l->opt.store_bin)
        return find_in_path(l->opt.store_bin);
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) {
        self[n] = '\0';
        char *slash = strrchr(self, '/');
        if (slash)
            *slash = '\0';
        /* Installed next to us; or in a build tree: tools/c10drun/ and store_server/. */
        static const char *const rel[] = {"c10d-store", "../store_server/c10d-store",
                                          "../../store_server/c10d-store"};
        looked[0] = '\0';
        for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) {
            char *cand = xasprintf("%s/%s", self, rel[i]);
            size_t used = strlen(looked);
            snprintf(looked + used, looked_len - used, "%s, ", cand);
            struct stat st;
            if (stat(cand, &st) == 0 && S_ISREG(st.st_mode) && access(cand, X_OK) == 0)
                return cand;
            free(cand);
        }
    }
    return find_in_path("c10d-store");
}

/* Resolves host:port for the readiness probe; with port 0, binds port 0 and keeps the number
 * the kernel chose (torchrun's way of picking a free port). */
int resolve_master(struct launcher *l, const char *host, int port, bool quiet)
{
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    int rc = getaddrinfo(host, service, &hints, &res);
    if (rc != 0) {
        if (!quiet)
            fprintf(stderr, "c10drun: cannot resolve --master-addr %s: %s\n", host,
                    gai_strerror(rc));
        return -1;
    }
    int chosen = port;
    int err = 0;
    struct addrinfo *ai;
    for (ai = res; ai; ai = ai->ai_next) {
        if (port != 0)
            break;
        int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            err = errno;
            continue;
        }
        struct sockaddr_storage ss;
        socklen_t len = sizeof ss;
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
            getsockname(fd, (struct sockaddr *)&ss, &len) == 0) {
            chosen = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                    : ((struct sockaddr_in *)&ss)->sin_port);
            close(fd);
            break;
        }
        err = errno;
        close(fd);
    }
    if (!ai) {
        fprintf(stderr, "c10drun: cannot pick a free port on %s: %s\n", host, strerror(err));
        freeaddrinfo(res);
        return -1;
    }
    memcpy(&l->master_sa, ai->ai_addr, ai->ai_addrlen);
    if (ai->ai_family == AF_INET6)
        ((struct sockaddr_in6 *)&l->master_sa)->sin6_port = htons((uint16_t)chosen);
    else
        ((struct sockaddr_in *)&l->master_sa)->sin_port = htons((uint16_t)chosen);
    freeaddrinfo(res);
    snprintf(l->port_text, sizeof l->port_text, "%d", chosen);
    return 0;
}
