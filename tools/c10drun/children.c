/* The children: spawning ranks and the external store, forwarding signals
 * to their process groups, turning the first failure into a stop of the whole
 * job within the grace period, and the end of the run once every child and
 * pipe is gone. */
#include "c10drun.h"

/* ------------------------------------------------------------------ signals to children */

const int forwarded_signals[4] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};

static bool child_live(const struct child *c)
{
    return c->spawned && !c->exited;
}

static void signal_child(struct child *c, int sig)
{
    if (!child_live(c))
        return;
    /* The group covers what the rank started (a shell script's children); the plain kill
     * covers the instant before the child has its own group. */
    if (killpg(c->pid, sig) != 0)
        kill(c->pid, sig);
}

static void signal_ranks(struct launcher *l, int sig)
{
    for (int i = 0; i < l->started; i++)
        signal_child(&l->ranks[i], sig);
}

static void on_grace_expired(uv_timer_t *t)
{
    struct launcher *l = t->data;
    if (l->live_ranks > 0)
        say(l, "%d rank(s) still running %llu ms after being asked to stop; sending SIGKILL",
            l->live_ranks, (unsigned long long)l->opt.grace_ms);
    signal_ranks(l, SIGKILL);
}

static void stop_store(struct launcher *l);

/* Asks every rank to stop with `sig`, then SIGKILL after the grace period. */
void begin_stop(struct launcher *l, int sig)
{
    if (l->stopping)
        return;
    l->stopping = true;
    uv_timer_stop(&l->failure_timer);
    if (!l->restart_wanted)
        uv_timer_stop(&l->deadline_timer);
    if (l->phase == PHASE_STORE_WAIT) {
        stop_store(l);
        maybe_finish(l);
        return;
    }
    signal_ranks(l, sig);
    if (l->live_ranks > 0)
        uv_timer_start(&l->grace_timer, on_grace_expired, l->opt.grace_ms, 0);
    maybe_finish(l);
}

static void on_failure_grace(uv_timer_t *t)
{
    struct launcher *l = t->data;
    if (l->live_ranks > 0)
        VERBOSE(l, "%d rank(s) still running %llu ms after the failure; sending SIGTERM",
                l->live_ranks, (unsigned long long)l->opt.failure_grace_ms);
    begin_stop(l, SIGTERM);
}

/* A rank of this attempt failed (here, or on another node: agent.c). The others first get
 * --failure-grace-ms to exit by themselves: a rank that waits on the failed one is about to
 * report it ("peer 1 died"), and that line is the one the user needs. Then SIGTERM. */
void begin_failure(struct launcher *l)
{
    if (l->failing || l->stopping)
        return;
    l->failing = true;
    l->restart_wanted = !l->no_restart && l->restart_count < l->opt.max_restarts;
    if (l->live_ranks > 0 && l->opt.failure_grace_ms > 0) {
        VERBOSE(l, "the other ranks have %llu ms to exit before SIGTERM (--failure-grace-ms)",
                (unsigned long long)l->opt.failure_grace_ms);
        uv_timer_start(&l->failure_timer, on_failure_grace, l->opt.failure_grace_ms, 0);
    } else {
        begin_stop(l, SIGTERM);
    }
    maybe_finish(l);
}

void set_code(struct launcher *l, int code)
{
    if (!l->have_code) {
        l->have_code = true;
        l->exit_code = code;
    }
}

void on_signal(uv_signal_t *h, int sig)
{
    struct launcher *l = h->data;
    if (l->phase == PHASE_DONE)
        return;
    l->signals_seen++;
    l->no_restart = true;
    l->restart_wanted = false;
    if (l->signals_seen == 1 && !l->stopping) {
        say(l, "received %s; forwarding it to the ranks", signal_name(sig));
        set_code(l, 128 + sig);
        /* The other nodes' ranks would only notice when ours vanish from a collective. */
        if (l->coordinate && (l->phase == PHASE_RUN || l->phase == PHASE_JOIN) && !l->failing) {
            char what[96];
            snprintf(what, sizeof what, "node %d: c10drun received %s", l->opt.node_rank,
                     signal_name(sig));
            l->up.agent_report_failure(l, what);
        }
        begin_stop(l, sig);
    } else {
        /* The second Ctrl-C means "now". */
        say(l, "received %s again; killing the ranks", signal_name(sig));
        set_code(l, 128 + sig);
        l->stopping = true;
        signal_ranks(l, SIGKILL);
        if (l->have_store && child_live(&l->store))
            signal_child(&l->store, SIGKILL);
    }
}

void on_deadline(uv_timer_t *t)
{
    struct launcher *l = t->data;
    say(l, "timeout: the job is still running after %g s (--timeout); stopping it",
        l->opt.timeout_s);
    set_code(l, EXIT_TIMEOUT);
    l->no_restart = true;
    l->restart_wanted = false;
    begin_stop(l, SIGTERM);
}

/* ------------------------------------------------------------------ children */

static void describe_exit(const struct child *c, char *out, size_t n)
{
    if (c->term_signal)
        snprintf(out, n, "killed by signal %d (%s)", c->term_signal, signal_name(c->term_signal));
    else
        snprintf(out, n, "exited with status %lld", (long long)c->exit_status);
}

static void on_process_closed(uv_handle_t *h)
{
    struct child *c = h->data;
    maybe_finish(c->l);
}

void on_rank_exit(uv_process_t *p, int64_t exit_status, int term_signal)
{
    struct child *c = p->data;
    struct launcher *l = c->l;
    c->exited = true;
    c->exit_status = exit_status;
    c->term_signal = term_signal;
    /* Closed first: what follows may end the job, which closes every handle left. */
    uv_close((uv_handle_t *)p, on_process_closed);
    l->live_ranks--;
    char how[96];
    describe_exit(c, how, sizeof how);
    bool failed = term_signal != 0 || exit_status != 0;
    if (failed && !l->stopping && !l->failing) {
        say(l, "rank %d (pid %d) %s", c->rank, (int)c->pid, how);
        set_code(l, term_signal ? 128 + term_signal : (int)(exit_status & 0xff));
        if (l->exit_code == 0)
            l->exit_code = EXIT_LAUNCHER; /* a status that is a multiple of 256 */
        if (l->coordinate) {
            char what[200];
            snprintf(what, sizeof what, "node %d: rank %d (pid %d) %s", l->opt.node_rank, c->rank,
                     (int)c->pid, how);
            l->up.agent_report_failure(l, what);
        }
        begin_failure(l);
    } else {
        VERBOSE(l, "rank %d (pid %d) %s", c->rank, (int)c->pid, how);
    }
    if (l->stopping || l->failing) {
        /* Whatever the rank left in its group goes with it. */
        killpg(c->pid, SIGKILL);
    }
    maybe_finish(l);
}

void on_store_exit(uv_process_t *p, int64_t exit_status, int term_signal)
{
    struct child *c = p->data;
    struct launcher *l = c->l;
    c->exited = true;
    c->exit_status = exit_status;
    c->term_signal = term_signal;
    /* Closed first: what follows may end the job, which closes every handle left. */
    uv_close((uv_handle_t *)p, on_process_closed);
    char how[96];
    describe_exit(c, how, sizeof how);
    if (l->phase == PHASE_STORE_WAIT && !l->stopping) {
        say(l, "the store %s (pid %d) %s before accepting connections on %s:%s", l->store_path,
            (int)c->pid, how, l->opt.master_addr, l->port_text);
        set_code(l, EXIT_LAUNCHER);
        begin_stop(l, SIGTERM);
    } else if (!l->store_stopping && !l->stopping) {
        say(l, "the store %s (pid %d) %s while %s", l->store_path, (int)c->pid, how,
            l->phase == PHASE_JOIN ? "the nodes were joining" : "the ranks were running");
        set_code(l, EXIT_LAUNCHER);
        l->no_restart = true;
        l->restart_wanted = false;
        begin_stop(l, SIGTERM);
    } else {
        VERBOSE(l, "store (pid %d) %s", (int)c->pid, how);
    }
    uv_timer_stop(&l->store_kill_timer);
    maybe_finish(l);
}

static void on_store_kill(uv_timer_t *t)
{
    struct launcher *l = t->data;
    if (child_live(&l->store)) {
        say(l, "the store (pid %d) is still running %llu ms after SIGTERM; sending SIGKILL",
            (int)l->store.pid, (unsigned long long)l->opt.grace_ms);
        signal_child(&l->store, SIGKILL);
    }
}

static void stop_store(struct launcher *l)
{
    if (!l->have_store || l->store_stopping)
        return;
    l->store_stopping = true;
    uv_timer_stop(&l->store_deadline_timer);
    uv_timer_stop(&l->probe_timer);
    if (child_live(&l->store)) {
        signal_child(&l->store, SIGTERM);
        uv_timer_start(&l->store_kill_timer, on_store_kill, l->opt.grace_ms, 0);
    }
}

/* Real pipes rather than libuv's socketpairs: the rank sees what it would see under torchrun or
 * a shell pipeline (a FIFO; EPIPE, not ECONNRESET, once we stop reading). Returns the write end
 * to close after the spawn, -1 if none, or a uv error. */
static int init_stream(struct launcher *l, struct child *c, struct out_stream *s, int fd,
                       uv_stdio_container_t *stdio)
{
    s->c = c;
    s->fd = fd;
    stdio->flags = UV_INHERIT_FD;
    stdio->data.fd = fd;
    /* Straight to our fd only when nothing is done to the lines. */
    if (!l->opt.prefix && s->log_fd < 0)
        return -1;
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0)
        return uv_translate_sys_error(errno);
    uv_pipe_init(&l->loop, &s->pipe, 0);
    s->pipe.data = s;
    int rc = uv_pipe_open(&s->pipe, fds[0]);
    s->open = true;
    if (rc != 0) {
        close(fds[0]);
        close(fds[1]);
        return rc;
    }
    stdio->data.fd = fds[1];
    return fds[1];
}

static void close_failed_stream(struct out_stream *s)
{
    if (s->open) {
        s->open = false;
        uv_close((uv_handle_t *)&s->pipe, NULL);
    }
}

/* Starts `argv` (argv[0] = resolved path) through our exec mode. Returns 0 or a uv error. */
int spawn_child(struct launcher *l, struct child *c, char **argv, char **env, uv_exit_cb exit_cb)
{
    c->l = l;
    size_t argc = 0;
    while (argv[argc])
        argc++;
    /* "parent pid,cpu": cpu -1 leaves the child's affinity alone. */
    char ppid[32];
    int cpu = l->cpus != NULL && c->rank >= 0 ? l->cpus[c->rank] : -1;
    snprintf(ppid, sizeof ppid, "%d,%d", (int)getpid(), cpu);
    /* self, mark, parent pid, path, argv[0]..., NULL */
    char **args = xmalloc((argc + 5) * sizeof *args);
    args[0] = "c10drun";
    args[1] = EXEC_MARK;
    args[2] = ppid;
    args[3] = argv[0];
    for (size_t i = 0; i < argc; i++)
        args[4 + i] = argv[i];
    args[argc + 4] = NULL;
    /* argv[0] of the program is what the user typed, not the resolved path. */
    if (c->rank >= 0)
        args[4] = l->opt.argv[0];

    uv_stdio_container_t stdio[3];
    stdio[0].flags = UV_IGNORE; /* /dev/null: N ranks cannot share a terminal's input */
    int wr_out = init_stream(l, c, &c->out, STDOUT_FILENO, &stdio[1]);
    int wr_err = wr_out < -1 ? -1 : init_stream(l, c, &c->err, STDERR_FILENO, &stdio[2]);
    if (wr_out < -1 || wr_err < -1) {
        free(args);
        if (wr_out >= 0)
            close(wr_out);
        close_failed_stream(&c->out);
        close_failed_stream(&c->err);
        return wr_out < -1 ? wr_out : wr_err;
    }

    uv_process_options_t po;
    memset(&po, 0, sizeof po);
    /* /proc/self/exe, not a path: it stays right even if c10drun is rebuilt meanwhile. */
    po.file = "/proc/self/exe";
    po.args = args;
    po.env = env;
    po.stdio = stdio;
    po.stdio_count = 3;
    po.exit_cb = exit_cb;
    c->proc.data = c;
    int rc = uv_spawn(&l->loop, &c->proc, &po);
    free(args);
    /* The child has its copies; ours would keep the pipes from ever reaching EOF. */
    if (wr_out >= 0)
        close(wr_out);
    if (wr_err >= 0)
        close(wr_err);
    if (rc != 0) {
        uv_close((uv_handle_t *)&c->proc, NULL);
        close_failed_stream(&c->out);
        close_failed_stream(&c->err);
        return rc;
    }
    c->spawned = true;
    c->pid = c->proc.pid;
    /* Both sides set the group (the classic race fix); EACCES once the child has exec'd. */
    setpgid(c->pid, c->pid);
    if (c->out.open)
        read_start_one(&c->out);
    if (c->err.open)
        read_start_one(&c->err);
    return 0;
}

/* ------------------------------------------------------------------ the end */

static bool any_rank_stream_open(struct launcher *l)
{
    for (int i = 0; i < l->started; i++)
        if (l->ranks[i].out.open || l->ranks[i].err.open)
            return true;
    return false;
}

static bool any_stream_open(struct launcher *l)
{
    return any_rank_stream_open(l) || (l->have_store && (l->store.out.open || l->store.err.open));
}

static void close_handle(uv_handle_t *h, void *arg)
{
    (void)arg;
    if (!uv_is_closing(h))
        uv_close(h, NULL);
}

static void on_drain_expired(uv_timer_t *t)
{
    struct launcher *l = t->data;
    pthread_mutex_lock(&l->w.mu);
    bool paused = l->w.paused;
    pthread_mutex_unlock(&l->w.mu);
    /* Unread output is still in the pipes while our own stdout is slow: give it time, bounded. */
    if (paused && l->drain_rearms++ < FLUSH_MS / DRAIN_MS) {
        uv_timer_start(&l->drain_timer, on_drain_expired, DRAIN_MS, 0);
        return;
    }
    /* A pipe still open after its child exited is held by something the child left behind. */
    for (int i = 0; i < l->started; i++) {
        struct child *c = &l->ranks[i];
        if (c->out.open || c->err.open) {
            VERBOSE(l, "rank %d left processes holding its output; killing its process group",
                    c->rank);
            killpg(c->pid, SIGKILL);
        }
        close_stream(&c->out);
        close_stream(&c->err);
    }
    /* The store's pipes only once it is gone: it outlives the ranks' attempts. */
    if (l->have_store && !child_live(&l->store)) {
        if (l->store.out.open || l->store.err.open)
            killpg(l->store.pid, SIGKILL);
        close_stream(&l->store.out);
        close_stream(&l->store.err);
    }
}

static void start_drain(struct launcher *l)
{
    if (!uv_is_active((uv_handle_t *)&l->drain_timer)) {
        l->drain_rearms = 0;
        uv_timer_start(&l->drain_timer, on_drain_expired, DRAIN_MS, 0);
    }
}

void maybe_finish(struct launcher *l)
{
    if (l->phase == PHASE_DONE)
        return;
    if ((l->phase == PHASE_STORE_WAIT || l->phase == PHASE_JOIN) && !l->stopping)
        return;
    if (l->live_ranks > 0)
        return;
    uv_timer_stop(&l->failure_timer);
    if (any_rank_stream_open(l)) {
        start_drain(l);
        return;
    }
    /* This attempt's ranks and their output are gone. */
    if (l->phase == PHASE_RUN) {
        if (l->restart_wanted && !l->no_restart) {
            uv_timer_stop(&l->grace_timer);
            if (!l->coordinate) {
                l->up.restart(l);
                return;
            }
            /* agent.c restarts once every node's ranks are gone. */
            l->phase = PHASE_RESTART_WAIT;
            l->wait_since = uv_now(&l->loop);
            return;
        }
        if (l->coordinate && !l->failing && !l->stopping && !l->agent_done) {
            /* Success here; agent.c waits for the other nodes. */
            l->phase = PHASE_NODES_WAIT;
            l->wait_since = uv_now(&l->loop);
            return;
        }
    }
    /* agent.c decides when these end; a signal, --timeout or the store's end (no_restart)
     * ends them at once. */
    if ((l->phase == PHASE_RESTART_WAIT || l->phase == PHASE_NODES_WAIT) && !l->no_restart &&
        !l->agent_done)
        return;
    l->up.agent_close(l);
    if (l->have_store && child_live(&l->store)) {
        stop_store(l);
        return;
    }
    if (any_stream_open(l)) {
        start_drain(l);
        return;
    }
    l->phase = PHASE_DONE;
    pthread_mutex_lock(&l->w.mu);
    l->w.async_closed = true;
    pthread_mutex_unlock(&l->w.mu);
    uv_walk(&l->loop, close_handle, NULL);
}
