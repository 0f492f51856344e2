/* Open MPI P2P sweep, the peer of `c10d-bench -o sendrecv`: every rank sends
 * `size` bytes to the next rank and receives as many from the previous one
 * (MPI_Sendrecv, blocking). With a 4th argument "pingpong", the peer of
 * `c10d-bench -o pingpong` instead: ranks 2k and 2k+1 trade a message with
 * blocking MPI_Send and MPI_Recv, the even rank first (a round trip per
 * iteration, as osu_latency). Built and run by bench/p2p_compare.sh. Rank 0
 * prints "size time_us GBps" per size (slowest rank's time per exchange;
 * GB/s is size / time, each rank's send rate). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int pingpong;

static void exchange(char *out, char *in, int size, int rank, int n)
{
    int next = (rank + 1) % n, prev = (rank + n - 1) % n, peer = rank ^ 1;
    if (!pingpong) {
        MPI_Sendrecv(out, size, MPI_BYTE, next, 0, in, size, MPI_BYTE, prev, 0, MPI_COMM_WORLD,
                     MPI_STATUS_IGNORE);
    } else if (rank % 2 == 0) {
        MPI_Send(out, size, MPI_BYTE, peer, 0, MPI_COMM_WORLD);
        MPI_Recv(in, size, MPI_BYTE, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else {
        MPI_Recv(in, size, MPI_BYTE, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        MPI_Send(out, size, MPI_BYTE, peer, 0, MPI_COMM_WORLD);
    }
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    long min = argc > 1 ? atol(argv[1]) : 4, max = argc > 2 ? atol(argv[2]) : 16 << 20;
    int factor = argc > 3 ? atoi(argv[3]) : 16;
    pingpong = argc > 4 && strcmp(argv[4], "pingpong") == 0;
    if (pingpong && n % 2 != 0) {
        if (rank == 0)
            fprintf(stderr, "mpi_sendrecv: pingpong needs an even number of ranks\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    char *out = malloc((size_t)max), *in = malloc((size_t)max);
    for (long i = 0; i < max; i++)
        out[i] = (char)i;
    for (long size = min; size <= max; size *= factor) {
        long iters = (64L << 20) / size / 4;
        iters = iters < 5 ? 5 : iters > 2000 ? 2000 : iters;
        for (long i = 0; i < (iters / 10 > 2 ? iters / 10 : 2); i++)
            exchange(out, in, (int)size, rank, n);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (long i = 0; i < iters; i++)
            exchange(out, in, (int)size, rank, n);
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
