/* c10drun's entry: the hidden exec mode every child starts through, CPU
 * binding, and the run itself. */
#include "c10drun.h"

static int pick_cpus(struct launcher *l)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0) {
        fprintf(stderr, "c10drun: --bind-to core: sched_getaffinity: %s\n", strerror(errno));
        return EXIT_LAUNCHER;
    }
    int have = CPU_COUNT(&set);
    if (l->opt.nprocs > have) {
        fprintf(stderr,
                "c10drun: --bind-to core: %d ranks but only %d CPUs available; use --bind-to "
                "none\n",
                l->opt.nprocs, have);
        return EXIT_USAGE;
    }
    l->cpus = xmalloc((size_t)l->opt.nprocs * sizeof *l->cpus);
    for (int cpu = 0, r = 0; cpu < CPU_SETSIZE && r < l->opt.nprocs; cpu++)
        if (CPU_ISSET(cpu, &set))
            l->cpus[r++] = cpu;
    return 0;
}

/* The hidden exec mode: runs in the child between fork and the program. */
static int exec_child(int argc, char **argv)
{
    if (argc < 5)
        return EXIT_USAGE;
    setpgid(0, 0);
    /* The kernel's guarantee that a rank does not outlive a c10drun killed with SIGKILL. */
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    char *end;
    long parent = strtol(argv[2], &end, 10);
    if (getppid() != (pid_t)parent)
        return 128 + SIGTERM; /* c10drun died before the line above took effect */
    long cpu = *end == ',' ? strtol(end + 1, NULL, 10) : -1;
    if (cpu >= 0 && cpu < CPU_SETSIZE) {
        /* Before exec, so every thread the program starts inherits it. */
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET((int)cpu, &set);
        if (sched_setaffinity(0, sizeof set, &set) != 0) {
            fprintf(stderr, "c10drun: --bind-to core: cannot bind to CPU %ld: %s\n", cpu,
                    strerror(errno));
            return EXIT_LAUNCHER;
        }
    }
    execv(argv[3], argv + 4);
    int err = errno;
    fprintf(stderr, "c10drun: cannot execute %s: %s\n", argv[3], strerror(err));
    return err == ENOENT ? EXIT_NOTFOUND : EXIT_NOEXEC;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], EXEC_MARK) == 0)
        return exec_child(argc, argv);

    static struct launcher L;
    struct launcher *l = &L;
    l->up = (struct launcher_up){maybe_finish, restart_ranks, agent_start, agent_report_failure,
                                 agent_close};
    int rc = parse_args(&l->opt, argc, argv);
    if (rc != 0)
        return rc;

    if (l->opt.bind_core) {
        rc = pick_cpus(l);
        if (rc != 0)
            return rc;
    }
    l->program_path = find_in_path(l->opt.argv[0]);
    if (!l->program_path) {
        fprintf(stderr, "c10drun: %s: %s\n", l->opt.argv[0],
                strchr(l->opt.argv[0], '/') ? strerror(errno) : "command not found");
        return EXIT_NOTFOUND;
    }
    l->store_fd = -1;
    l->agent_store = l->opt.external_store;
    /* Node 0 hosts the store; the others wait for it to accept connections. */
    l->hosts_store = l->agent_store && l->opt.node_rank == 0;
    l->coordinate = l->agent_store && (l->opt.nnodes > 1 || l->opt.max_restarts > 0);
    if (l->hosts_store) {
        char looked[3 * PATH_MAX + 16];
        l->store_path = find_store(l, looked, sizeof looked);
        if (!l->store_path) {
            if (l->opt.store_bin)
                fprintf(stderr, "c10drun: --store-bin %s: not an executable\n", l->opt.store_bin);
            else
                fprintf(stderr,
                        "c10drun: --store external: cannot find c10d-store (looked in %sand "
                        "PATH); build the store_server target or pass --store-bin\n",
                        looked);
            free(l->program_path);
            return EXIT_LAUNCHER;
        }
    }
    /* The store c10drun starts listens where rank 0's embedded one would:
     * C10D_STORE_BIND ('*': every address), else MASTER_ADDR; we probe it there. */
    const char *bind = getenv("C10D_STORE_BIND");
    const char *probe_host = l->opt.master_addr;
    l->store_host = l->opt.master_addr;
    if (l->hosts_store && bind && *bind) {
        l->store_host = bind;
        probe_host = strcmp(bind, "*") != 0 ? bind : "127.0.0.1";
    }
    bool joining = l->agent_store && !l->hosts_store;
    if (resolve_master(l, probe_host, l->opt.master_port, joining) != 0) {
        if (!joining) {
            free(l->program_path);
            free(l->store_path);
            return EXIT_USAGE;
        }
        /* Retried until --store-timeout: node 0's name may not exist yet. */
        l->master_unresolved = true;
        snprintf(l->port_text, sizeof l->port_text, "%d", l->opt.master_port);
    }
    if (l->opt.run_id)
        snprintf(l->run_id, sizeof l->run_id, "%s", l->opt.run_id);
    else
        snprintf(l->run_id, sizeof l->run_id, "c10drun-%d-%lld", (int)getpid(),
                 (long long)time(NULL));

    /* A reader of our output that goes away must not kill us before we stop the ranks. */
    signal(SIGPIPE, SIG_IGN);
    build_base_env(l);
    l->ranks = calloc((size_t)l->opt.nprocs, sizeof *l->ranks);
    if (!l->ranks || uv_loop_init(&l->loop) != 0 || writer_start(l) != 0) {
        fprintf(stderr, "c10drun: cannot initialise\n");
        return EXIT_LAUNCHER;
    }
    uv_timer_t *timers[] = {&l->failure_timer,    &l->agent_timer,         &l->grace_timer,
                            &l->store_kill_timer, &l->deadline_timer,      &l->drain_timer,
                            &l->probe_timer,      &l->store_deadline_timer};
    for (size_t i = 0; i < sizeof timers / sizeof timers[0]; i++) {
        uv_timer_init(&l->loop, timers[i]);
        timers[i]->data = l;
    }
    uv_async_init(&l->loop, &l->resume_async, on_resume);
    l->resume_async.data = l;
    for (int i = 0; i < 4; i++) {
        uv_signal_init(&l->loop, &l->sigs[i]);
        l->sigs[i].data = l;
        uv_signal_start(&l->sigs[i], on_signal, forwarded_signals[i]);
    }
    VERBOSE(l,
            "node %d of %d: %d rank(s) of %s, MASTER_ADDR=%s MASTER_PORT=%s, %s store, run id "
            "%s, up to %d restart(s)",
            l->opt.node_rank, l->opt.nnodes, l->opt.nprocs, l->program_path, l->opt.master_addr,
            l->port_text,
            l->hosts_store   ? "c10drun's"
            : l->agent_store ? "node 0's"
                             : "rank 0's embedded",
            l->run_id, l->opt.max_restarts);

    if (l->hosts_store) {
        l->phase = PHASE_STORE_WAIT;
        start_store(l);
    } else if (l->agent_store) {
        await_store(l);
    } else {
        start_ranks(l);
    }
    maybe_finish(l);
    uv_run(&l->loop, UV_RUN_DEFAULT);

    int code = l->have_code ? l->exit_code : 0;
    writer_finish(l, FLUSH_MS);
    if (uv_loop_close(&l->loop) != 0)
        fprintf(stderr, "c10drun: internal: handles left open at exit\n");
    free(l->ranks);
    while (l->old) {
        struct old_ranks *o = l->old;
        l->old = o->next;
        free(o->ranks);
        free(o);
    }
    free(l->base_env);
    free(l->program_path);
    free(l->cpus);
    free(l->store_path);
    return code;
}
