/* The floor under a small all_reduce on one host: two processes, each bound
 * to its own CPU, exchange one value per round through two cache lines of a
 * shared page (each writes its value and the round's number into its line,
 * then waits for the peer's number and adds the peer's value). That is the
 * least any shared-memory all_reduce of 4 bytes between two ranks moves:
 * one line each way. Printed: the time per round (median of 21 batches).
 *
 * `contract` adds, per round, the least of what a c10d op must keep by its
 * own terms beside the exchange: a work allocated and freed (a future with a
 * status, callbacks and a deadline: about 900 bytes), a flight-recorder
 * entry written under a mutex with two wall-clock reads (created, completed),
 * and a sequence number; nothing else (no checks, no callbacks, no name).
 *
 * usage: small_op_floor [ROUNDS] [bare|contract] */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define BATCHES 21

struct line {
    _Atomic uint64_t round;
    float value;
    char pad[64 - sizeof(uint64_t) - sizeof(float)];
};

struct shared {
    struct line line[2];
    _Atomic int ready;
    double per_round_ns[BATCHES];
};

struct entry {
    uint64_t id, t_created, t_completed;
    char names[128];
    int state;
};

static struct entry ring[1024];
static pthread_mutex_t ring_mutex = PTHREAD_MUTEX_INITIALIZER;
static uint64_t seq;

static uint64_t ns(clockid_t c)
{
    struct timespec ts;
    clock_gettime(c, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void bind_to(int cpu)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    sched_setaffinity(0, sizeof set, &set); /* best effort: one CPU is fine too */
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static float exchange(struct shared *sh, int me, uint64_t r, float v)
{
    struct line *mine = &sh->line[me], *peer = &sh->line[1 - me];
    mine->value = v;
    atomic_store_explicit(&mine->round, r, memory_order_release);
    while (atomic_load_explicit(&peer->round, memory_order_acquire) < r)
        __builtin_ia32_pause();
    return v + peer->value;
}

/* What the contract costs per op, beside the exchange. */
static float contract_op(struct shared *sh, int me, uint64_t r, float v)
{
    char *work = malloc(900);
    if (work == NULL)
        abort();
    memset(work, 0, 64);
    uint64_t s = ++seq;
    pthread_mutex_lock(&ring_mutex);
    struct entry *e = &ring[s % 1024];
    e->id = s;
    e->t_created = ns(CLOCK_REALTIME);
    e->state = 1;
    pthread_mutex_unlock(&ring_mutex);
    float out = exchange(sh, me, r, v);
    uint64_t done = ns(CLOCK_REALTIME);
    pthread_mutex_lock(&ring_mutex);
    if (e->id == s) {
        e->t_completed = done;
        e->state = 2;
    }
    pthread_mutex_unlock(&ring_mutex);
    atomic_thread_fence(memory_order_seq_cst); /* the work's settled flag */
    free(work);
    return out;
}

static void run(struct shared *sh, int me, long rounds, int contract)
{
    bind_to(me);
    atomic_fetch_add(&sh->ready, 1);
    while (atomic_load(&sh->ready) < 2)
        ;
    uint64_t r = 0;
    float acc = 0;
    for (int b = 0; b < BATCHES; b++) {
        uint64_t t0 = ns(CLOCK_MONOTONIC);
        for (long i = 0; i < rounds; i++) {
            r++;
            acc = contract ? contract_op(sh, me, r, 1.0f) : exchange(sh, me, r, 1.0f);
        }
        if (me == 0)
            sh->per_round_ns[b] = (double)(ns(CLOCK_MONOTONIC) - t0) / (double)rounds;
    }
    if (acc != 2.0f)
        _exit(3);
}

int main(int argc, char **argv)
{
    long rounds = argc > 1 ? atol(argv[1]) : 100000;
    int contract = argc > 2 && strcmp(argv[2], "contract") == 0;
    if (rounds <= 0 || (argc > 2 && !contract && strcmp(argv[2], "bare") != 0)) {
        fprintf(stderr, "usage: small_op_floor [ROUNDS] [bare|contract]\n");
        return 2;
    }
    struct shared *sh =
        mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED)
        return 1;
    pid_t pid = fork();
    if (pid < 0)
        return 1;
    if (pid == 0) {
        run(sh, 1, rounds, contract);
        _exit(0);
    }
    run(sh, 0, rounds, contract);
    int st;
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
        return 1;
    qsort(sh->per_round_ns, BATCHES, sizeof(double), cmp);
    printf("%s: %.0f ns per 4 B exchange between 2 processes (median of %d batches of %ld; "
           "min %.0f, max %.0f)\n",
           contract ? "contract" : "bare", sh->per_round_ns[BATCHES / 2], BATCHES, rounds,
           sh->per_round_ns[0], sh->per_round_ns[BATCHES - 1]);
    return 0;
}
