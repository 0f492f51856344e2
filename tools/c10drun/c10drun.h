/*
 * c10drun: start N local ranks with torchrun's environment, tag their output with the rank,
 * forward signals, and turn the first rank failure into a stop of the whole job; with
 * --nnodes, one c10drun per node, meeting in node 0's store; with --max-restarts, start
 * every node's ranks again after a failure.
 *
 * The launcher runs its own uv loop; it does not use the library's engine, so it keeps
 * working (and keeps reporting) while the library is broken or being rebuilt.
 *
 * Every child (rank or external store) is started through this same executable in a hidden
 * "exec" mode that puts the child in its own process group and asks the kernel to SIGTERM it
 * if c10drun dies. Signals then go to the rank's whole group, so a rank that is a shell
 * script takes its own children down with it.
 *
 * One file per concern, sharing this header: args.c (the command line, PET_* defaults),
 * env.c (each rank's environment), store.c (the store, log files, then the ranks),
 * children.c (spawning, signals, failures, stopping, the end of an attempt and of the
 * job), agent.c (the nodes meeting in the store: failures, restarts, the end), output.c
 * (reading the ranks' pipes into tagged lines and log files), writer.c (writing them out
 * on a thread), util.c. All of it runs on the loop thread but writer.c's thread.
 *
 * The files stack: output.c < children.c < store.c < agent.c < main.c. A lower file
 * reaches a higher one only through `struct launcher_up`, which main.c fills.
 */
#ifndef C10D_TOOLS_C10DRUN_C10DRUN_H
#define C10D_TOOLS_C10DRUN_C10DRUN_H

#include <uv.h>

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <netdb.h>
#include <poll.h>
#include <sched.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#ifndef C10DRUN_VERSION
#define C10DRUN_VERSION "unknown"
#endif

/* argv[1] of the hidden mode; not an option a user would type. */
#define EXEC_MARK "--c10drun-internal-exec"

enum {
    EXIT_LAUNCHER = 1, /* c10drun itself could not do its job (spawn, store) */
    EXIT_USAGE = 2,
    EXIT_TIMEOUT = 124, /* as timeout(1) */
    EXIT_NOEXEC = 126,
    EXIT_NOTFOUND = 127,
};

/* A line longer than this is cut into pieces so one rank cannot make us buffer without bound. */
#define MAX_LINE (64 * 1024)
/* Output waiting for a slow stdout/stderr: above HIGH we stop reading the ranks' pipes (they
 * block on write, as they would without us), below LOW we read again. */
#define QUEUE_HIGH (8u << 20)
#define QUEUE_LOW  (1u << 20)
/* After the last child is gone, how long a pipe still held open by a leftover grandchild may
 * keep us waiting. */
#define DRAIN_MS 2000
/* How long we wait at exit for stdout/stderr to accept what is queued. */
#define FLUSH_MS 10000
#define PROBE_MS 50
/* A node other than 0 whose MASTER_ADDR does not resolve yet tries again this often. */
#define RESOLVE_RETRY_MS 500
#define MAX_NPROCS       4096

/* STORE_WAIT: the store does not accept connections yet. JOIN: it does; before the first
 * attempt, every node says how many ranks it runs and waits for the others (agent.c). RUN:
 * the ranks of this attempt run, or their stop is under way. RESTART_WAIT: they are gone and a
 * restart waits for every node to be there too. NODES_WAIT: they all succeeded and this node waits
 * for the others to finish (so node 0 keeps the store up while anyone may need it). */
enum phase {
    PHASE_STORE_WAIT,
    PHASE_JOIN,
    PHASE_RUN,
    PHASE_RESTART_WAIT,
    PHASE_NODES_WAIT,
    PHASE_DONE
};

struct options {
    int nprocs;             /* ranks on this node, resolved from nproc_spec */
    const char *nproc_spec; /* N, auto, cpu or gpu */
    const char *nproc_src;  /* where it came from: -n, --nproc-per-node, PET_NPROC_PER_NODE */
    int nnodes;
    int node_rank;
    const char *rdzv_endpoint; /* HOST[:PORT]: becomes master_addr/master_port */
    bool rdzv_c10d;            /* --rdzv-backend c10d: accepted, run as static */
    bool standalone;
    int max_restarts;
    bool external_store;
    bool store_given;
    const char *master_addr;
    bool master_addr_given;
    int master_port; /* 0: pick a free one */
    uint64_t grace_ms;
    uint64_t failure_grace_ms; /* after a rank fails, before SIGTERM to the others */
    double timeout_s;          /* 0: none */
    double store_timeout_s;    /* bound on waiting for the store's port */
    double join_timeout_s;     /* for every node to join: --store-timeout, else 600 */
    bool prefix;
    bool verbose;
    const char *store_bin;
    const char *run_id;
    const char *log_dir;
    const char *tee, *redirects; /* torchrun's Std specs, checked by std_spec_for */
    bool bind_core;              /* --bind-to core: rank r runs on the r-th CPU we may use */
    int argc;                    /* PROGRAM and its arguments */
    char **argv;
};

struct launcher;
struct child;

struct out_stream {
    struct child *c;
    uv_pipe_t pipe;
    int fd; /* where its lines go: 1 or 2 */
    bool open;
    bool console;  /* false under --redirects: the lines go to the log file only */
    int log_fd;    /* --tee/--redirects: the rank's stdout.log or stderr.log, else -1 */
    char *partial; /* the last line, until its newline arrives */
    size_t len, cap;
};

struct child {
    struct launcher *l;
    uv_process_t proc;
    int rank;       /* global rank; -1: the store */
    int local_rank; /* on this node */
    char name[32];
    char prefix[32];
    pid_t pid;
    bool spawned, exited;
    int64_t exit_status;
    int term_signal;
    struct out_stream out, err;
};

struct out_item {
    struct out_item *next;
    int fd;
    size_t len;
    char *data;
};

/* stdout/stderr are written by a thread so that a stalled reader of our output never stalls
 * the loop: signals, deadlines and kills keep working. */
struct writer {
    pthread_t thread;
    bool started;
    pthread_mutex_t mu;
    pthread_cond_t work, idle;
    struct out_item *head, *tail;
    size_t bytes;
    bool busy, quit;
    bool paused;       /* the loop stopped reading pipes because of `bytes` */
    bool async_closed; /* resume_async must not be sent any more */
    bool broken[3];    /* EPIPE & co: drop what goes there */
};

/* The ranks of earlier attempts: their handles may still be closing when the next attempt
 * starts, so their memory is kept to the end. */
struct old_ranks {
    struct old_ranks *next;
    struct child *ranks;
};

struct launcher;

/* The calls that go up the stack (see the top of this file). */
struct launcher_up {
    void (*settle)(struct launcher *l);  /* children.c's maybe_finish: a stream closed */
    void (*restart)(struct launcher *l); /* store.c's restart_ranks */
    void (*agent_start)(struct launcher *l);
    void (*agent_report_failure)(struct launcher *l, const char *what);
    void (*agent_close)(struct launcher *l);
};

struct launcher {
    struct options opt;
    struct launcher_up up;
    uv_loop_t loop;
    struct child *ranks; /* this attempt's */
    struct old_ranks *old;
    int restart_count;      /* the attempt: TORCHELASTIC_RESTART_COUNT */
    bool failing;           /* a rank (here or on another node) failed in this attempt */
    bool restart_wanted;    /* ... and the job restarts once the ranks are gone */
    bool no_restart;        /* a signal, --timeout or the store ended the job: no restart */
    bool agent_store;       /* TORCHELASTIC_USE_AGENT_STORE=True: c10drun's store, not rank 0's */
    bool coordinate;        /* this c10drun talks to the others through the store (agent.c) */
    bool hosts_store;       /* node 0 with an agent store: we run c10d-store */
    const char *store_host; /* its --host: C10D_STORE_BIND, else MASTER_ADDR */
    bool master_unresolved; /* another node's MASTER_ADDR did not resolve yet */
    int store_fd;           /* agent.c's connection, -1 when closed */
    int store_errors;       /* polls in a row that could not reach the store */
    bool marked;            /* this attempt's stopped/done mark is in the store */
    int join_step;          /* JOIN: how much of this node's entry is in the store */
    bool join_failed;       /* JOIN: the nodes' -n differ; leaving */
    bool watching;          /* every node joined: heartbeats are sent and watched */
    bool watch_reset;       /* restart the silence windows at the next look */
    unsigned polls;         /* agent polls so far */
    int64_t *beat_seen;     /* per node: its heartbeat counter at the last change seen */
    uint64_t *beat_at;      /* per node: uv_now of that change */
    bool agent_done;        /* agent.c has nothing left to wait for: the job may end */
    uint64_t all_done_at;   /* node 0: uv_now when every node was done, 0 before */
    uint64_t wait_since;    /* uv_now when RESTART_WAIT or NODES_WAIT began */
    int started;            /* ranks spawned */
    int live_ranks;         /* spawned and not exited */
    struct child store;
    bool have_store;
    enum phase phase;
    bool stopping;
    bool store_stopping;
    int drain_rearms;
    bool have_code;
    int exit_code;
    int signals_seen;
    uv_signal_t sigs[4];
    uv_timer_t failure_timer, agent_timer, grace_timer, store_kill_timer, deadline_timer,
        drain_timer, probe_timer, store_deadline_timer;
    uv_tcp_t probe;
    uv_getaddrinfo_t resolve_req;
    bool resolving; /* resolve_req is in flight: the job ends only after its callback */
    uv_connect_t probe_req;
    bool probe_open;
    uv_async_t resume_async;
    struct sockaddr_storage master_sa;
    char port_text[16];
    char *program_path;
    char *store_path;
    char run_id[96];
    int *cpus; /* --bind-to core: the CPU of each rank */
    char **base_env;
    size_t base_env_len;
    struct writer w;
    bool out_broken[3]; /* the loop's copy of w.broken */
    char rbuf[65536];
};

extern const int forwarded_signals[4];

#define VERBOSE(l, ...)                                                                            \
    do {                                                                                           \
        if ((l)->opt.verbose)                                                                      \
            say((l), __VA_ARGS__);                                                                 \
    } while (0)

/* util.c */
char *xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
char *xstrdup(const char *s);
const char *signal_name(int sig);
void *xmalloc(size_t n);
void *xrealloc(void *p, size_t n);
void write_all(int fd, const char *p, size_t n);

/* writer.c */
bool writer_push(struct launcher *l, int fd, char *data, size_t len);
int writer_start(struct launcher *l);
void say(struct launcher *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void writer_finish(struct launcher *l, int timeout_ms);

/* output.c */
void close_stream(struct out_stream *s);
void for_each_stream(struct launcher *l, void (*fn)(struct out_stream *));
void on_resume(uv_async_t *a);
void read_start_one(struct out_stream *s);

/* env.c */
char **rank_env(struct launcher *l, int rank);
void build_base_env(struct launcher *l);
void free_rank_env(struct launcher *l, char **env);

/* store.c */
char *find_in_path(const char *name);
char *find_store(struct launcher *l, char *looked, size_t looked_len);
int resolve_master(struct launcher *l, const char *host, int port, bool quiet);
void start_ranks(struct launcher *l);
/* The next attempt: the last one's ranks are gone. */
void restart_ranks(struct launcher *l);
void start_store(struct launcher *l);
void await_store(struct launcher *l);

/* children.c */
int spawn_child(struct launcher *l, struct child *c, char **argv, char **env, uv_exit_cb exit_cb);
void begin_stop(struct launcher *l, int sig);
void begin_failure(struct launcher *l);
void maybe_finish(struct launcher *l);
void on_deadline(uv_timer_t *t);
void on_rank_exit(uv_process_t *p, int64_t exit_status, int term_signal);
void on_signal(uv_signal_t *h, int sig);
void on_store_exit(uv_process_t *p, int64_t exit_status, int term_signal);
void set_code(struct launcher *l, int code);

/* args.c */
int parse_args(struct options *o, int argc, char **argv);
int std_spec_for(const char *spec, int local_rank);

/* agent.c: c10drun instances of one job meeting in the store */
void agent_start(struct launcher *l);
void agent_report_failure(struct launcher *l, const char *what);
void agent_close(struct launcher *l);

#endif
