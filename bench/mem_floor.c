/* The memory floor under an all_reduce on one host: N processes at once each
 * copy a buffer of S bytes into another, over and over, and the rate each of
 * them reaches is printed. Any all_reduce on this machine reads its own input
 * and writes its output at least once per rank, so with N ranks at once its
 * algorithm bandwidth (S / time; for 2 ranks, nccl-tests' busbw) cannot pass
 * this per-process rate, whatever goes through shared memory or caches in
 * between (bench/README.md compares it with the shared-memory all_reduce).
 *
 * With `cma`, each process copies the next one's buffer into its own with
 * process_vm_readv instead: the single copy through the kernel that a
 * reduction reading its peers' memory in place would rest on (Open MPI's
 * vader uses it for large messages).
 *
 * usage: mem_floor [NPROC] [MIB] [SECONDS] [copy|cma] */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    int nproc = argc > 1 ? atoi(argv[1]) : 2;
    size_t bytes = (size_t)(argc > 2 ? atoi(argv[2]) : 16) << 20;
    double seconds = argc > 3 ? atof(argv[3]) : 2.0;
    int cma = argc > 4 && strcmp(argv[4], "cma") == 0;
    if (nproc < 1 || nproc > 64 || bytes == 0 || seconds <= 0 ||
        (argc > 4 && !cma && strcmp(argv[4], "copy") != 0)) {
        fprintf(stderr, "usage: mem_floor [NPROC 1-64] [MIB] [SECONDS] [copy|cma]\n");
        return 2;
    }
    /* Each child's rate, a start line so that all copy at once, a finish
     * line (a peer's buffer must outlive the last read of it), and each
     * child's pid and buffer for `cma`. */
    double *rate = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (rate == MAP_FAILED)
        return 1;
    volatile int *go = (volatile int *)(rate + 64), *finished = go + 1;
    volatile pid_t *pids = (volatile pid_t *)(go + 2);
    char *volatile *srcs = (char *volatile *)(rate + 128);
    for (int p = 0; p < nproc; p++) {
        pid_t pid = fork();
        if (pid < 0)
            return 1;
        if (pid > 0)
            continue;
        char *src = malloc(bytes), *dst = malloc(bytes);
        if (src == NULL || dst == NULL)
            _exit(1);
        memset(src, p + 1, bytes); /* first touch by the copier: its own pages */
        memset(dst, 0, bytes);
        pids[p] = getpid();
        srcs[p] = src;
        __atomic_fetch_add(go, 1, __ATOMIC_SEQ_CST);
        while (__atomic_load_n(go, __ATOMIC_SEQ_CST) < nproc)
            ;
        double t0 = now_s(), t = t0;
        long n = 0;
        int peer = (p + 1) % nproc, failed = 0;
        do {
            if (cma) {
                struct iovec here = {dst, bytes}, there = {srcs[peer], bytes};
                failed = process_vm_readv(pids[peer], &here, 1, &there, 1, 0) != (ssize_t)bytes;
            } else {
                memcpy(dst, src, bytes);
            }
            __asm__ volatile("" : : "r"(dst) : "memory"); /* the copy is used */
            n++;
        } while (!failed && (t = now_s()) - t0 < seconds);
        if (failed)
            perror("mem_floor: process_vm_readv");
        rate[p] = (double)bytes * (double)n / (t - t0) / 1e9;
        __atomic_fetch_add(finished, 1, __ATOMIC_SEQ_CST);
        while (__atomic_load_n(finished, __ATOMIC_SEQ_CST) < nproc)
            usleep(1000);
        _exit(failed);
    }
    int bad = 0;
    for (int p = 0; p < nproc; p++) {
        int st;
        wait(&st);
        bad |= !WIFEXITED(st) || WEXITSTATUS(st) != 0;
    }
    double lo = rate[0], sum = 0;
    for (int p = 0; p < nproc; p++) {
        sum += rate[p];
        lo = rate[p] < lo ? rate[p] : lo;
    }
    printf("%d processes copying %zu MiB at once%s: %.2f GB/s each (slowest), %.2f GB/s in all\n",
           nproc, bytes >> 20, cma ? " from the next one (process_vm_readv)" : "", lo, sum);
    return bad;
}
