/* Multi-process test harness: forks N ranks that rendezvous through env://
 * on a free port, bounds each with alarm(), collects their exit codes and
 * kills every one it started when the run fails or overruns, so a test never
 * leaves a process behind. Rank bodies run in the forked child: they must
 * not use cmocka's asserts (those would unwind into the parent's copy), only
 * return an exit code (MP_CHECK helps). */
#ifndef C10D_TEST_MP_HARNESS_H
#define C10D_TEST_MP_HARNESS_H

#include <stdio.h>
#include <sys/types.h>

#define MP_MAX_RANKS 16

/* Returns the rank's exit code (0 = pass). */
typedef int (*mp_rank_fn)(int rank, int nranks, void *arg);

struct mp_opts {
    int nranks;
    int timeout_s; /* per-rank alarm and the whole run's deadline (+5 s) */
    /* 1: the first rank to fail gets the others killed at once. */
    int kill_on_failure;
    /* > 0: once this many ranks have exited, kill the rest (a stopped rank). */
    int kill_after_exits;
    /* Non-NULL: ranks are clients of this external store (TORCHELASTIC_USE_AGENT_STORE=True). */
    int external_store_port;
};

struct mp_result {
    int codes[MP_MAX_RANKS]; /* exit status, or 128 + signal */
    int timed_out;           /* the run hit its deadline */
    pid_t pids[MP_MAX_RANKS];
};

/* A free TCP port on 127.0.0.1 (bind port 0, read it, close). */
int mp_free_port(void);

/* Runs fn on every rank; 0 if every rank exited 0. */
int mp_run(const struct mp_opts *o, mp_rank_fn fn, void *arg, struct mp_result *res);

/* Starts `c10d-store serve` on a free port (exe from $C10D_STORE_EXE); returns
 * its pid and port, or -1 (then the test should skip). */
pid_t mp_start_store(int *port);
void mp_kill(pid_t pid);

#define MP_CHECK(cond, ...)                                                                        \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "[rank check] %s:%d: %s: ", __FILE__, __LINE__, #cond);                \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            fflush(stderr);                                                                        \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

#endif
