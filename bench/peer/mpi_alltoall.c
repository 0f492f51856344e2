/* Open MPI all_to_all sweep, the peer of `c10d-bench -o all_to_all`: every
 * rank sends size/n bytes to each rank (MPI_Alltoall, blocking, out of
 * place). Built and run by bench/a2a_compare.sh. Rank 0 prints
 * "size time_us" per size, size being each rank's whole send buffer (as
 * c10d-bench's -b), time the slowest rank's per op. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    long min = argc > 1 ? atol(argv[1]) : 64, max = argc > 2 ? atol(argv[2]) : 1 << 20;
    int factor = argc > 3 ? atoi(argv[3]) : 4;
    char *send = calloc((size_t)max, 1), *recv = calloc((size_t)max, 1);
    for (long size = min; size <= max; size *= factor) {
        int per = (int)(size / 4 / n * 4); /* whole float32 elements, as c10d-bench */
        long iters = (64L << 20) / size / 4; /* c10d-bench's rule in a2a_compare.sh */
        iters = iters < 20 ? 20 : iters > 2000 ? 2000 : iters;
        for (long i = 0; i < iters / 10 + 2; i++)
            MPI_Alltoall(send, per, MPI_BYTE, recv, per, MPI_BYTE, MPI_COMM_WORLD);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (long i = 0; i < iters; i++)
            MPI_Alltoall(send, per, MPI_BYTE, recv, per, MPI_BYTE, MPI_COMM_WORLD);
        double elapsed = (MPI_Wtime() - t0) / (double)iters, worst;
        MPI_Reduce(&elapsed, &worst, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        if (rank == 0) {
            printf("%ld %.2f\n", (long)per * n, worst * 1e6);
            fflush(stdout);
        }
    }
    free(send);
    free(recv);
    MPI_Finalize();
    return 0;
}
