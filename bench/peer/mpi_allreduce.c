/* Open MPI all_reduce sweep (float32 SUM), the other peer of c10d-bench.
 * Built and run by bench/peer_compare.sh with mpicc / mpirun --mca btl tcp,self.
 * Rank 0 prints "size time_us busbw_GBps" per size (slowest rank's time). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

static long parse_size(const char *s)
{
    char *end;
    long v = strtol(s, &end, 10);
    switch (*end) {
    case 'K': case 'k': return v << 10;
    case 'M': case 'm': return v << 20;
    case 'G': case 'g': return v << 30;
    default: return v;
    }
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    long min = argc > 1 ? parse_size(argv[1]) : 4, max = argc > 2 ? parse_size(argv[2]) : 64 << 20;
    int factor = argc > 3 ? atoi(argv[3]) : 4;
    float *buf = malloc((size_t)max);
    for (long i = 0; i < max / 4; i++)
        buf[i] = 1.0f;
    for (long size = min; size <= max; size *= factor) {
        int count = (int)(size / 4 > 0 ? size / 4 : 1);
        long iters = (64L << 20) / (size > 0 ? size : 1) / 4;
        iters = iters < 20 ? 20 : iters > 1000 ? 1000 : iters;
        for (long i = 0; i < (iters / 10 > 2 ? iters / 10 : 2); i++)
            MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (long i = 0; i < iters; i++)
            MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        double elapsed = (MPI_Wtime() - t0) / (double)iters, worst;
        MPI_Reduce(&elapsed, &worst, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        if (rank == 0) {
            double us = worst * 1e6;
            printf("%ld %.2f %.3f\n", (long)count * 4, us,
                   (double)count * 4 / worst / 1e9 * 2.0 * (n - 1) / n);
            fflush(stdout);
        }
    }
    free(buf);
    MPI_Finalize();
    return 0;
}
