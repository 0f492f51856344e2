/* Open MPI P2P sweep, the peer of `c10d-bench -o sendrecv`: every rank sends
 * `size` bytes to the next rank and receives as many from the previous one
 * (MPI_Sendrecv, blocking). Built and run by bench/p2p_compare.sh. Rank 0
 * prints "size time_us GBps" per size (slowest rank's time per exchange;
 * GB/s is size / time, each rank's send rate). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    long min = argc > 1 ? atol(argv[1]) : 4, max = argc > 2 ? atol(argv[2]) : 16 << 20;
    int factor = argc > 3 ? atoi(argv[3]) : 16;
    char *out = malloc((size_t)max), *in = malloc((size_t)max);
    for (long i = 0; i < max; i++)
        out[i] = (char)i;
    int next = (rank + 1) % n, prev = (rank + n - 1) % n;
    for (long size = min; size <= max; size *= factor) {
        long iters = (64L << 20) / size / 4;
        iters = iters < 5 ? 5 : iters > 2000 ? 2000 : iters;
        for (long i = 0; i < (iters / 10 > 2 ? iters / 10 : 2); i++)
            MPI_Sendrecv(out, (int)size, MPI_BYTE, next, 0, in, (int)size, MPI_BYTE, prev, 0,
                         MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (long i = 0; i < iters; i++)
            MPI_Sendrecv(out, (int)size, MPI_BYTE, next, 0, in, (int)size, MPI_BYTE, prev, 0,
                         MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        double elapsed = (MPI_Wtime() - t0) / (double)iters, worst;
        MPI_Reduce(&elapsed, &worst, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        if (rank == 0) {
            printf("%ld %.2f %.3f\n", size, worst * 1e6, (double)size / worst / 1e9);
            fflush(stdout);
        }
    }
    free(out);
    free(in);
    MPI_Finalize();
    return 0;
}
