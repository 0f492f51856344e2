/* Open MPI sweep of the collectives that move data without reducing it, the
 * peer of `c10d-bench -o all_to_all|broadcast|all_gather|gather|scatter`:
 * MPI_Alltoall (size/n bytes to each rank), MPI_Bcast from rank 0 (size
 * bytes), MPI_Allgather (size/n bytes from each rank), MPI_Gather or
 * MPI_Scatter to or from rank 0 (size/n bytes per rank), blocking, out of
 * place but for broadcast. Built and run by bench/move_compare.sh:
 *   mpi_move OP MIN MAX FACTOR
 * Rank 0 prints "size time_us" per size, size being as c10d-bench's -b
 * (whole float32 elements: an all_to_all's send buffer, an all_gather's
 * output), time the slowest rank's per op. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    const char *op = argc > 1 ? argv[1] : "all_to_all";
    long min = argc > 2 ? atol(argv[2]) : 64, max = argc > 3 ? atol(argv[3]) : 1 << 20;
    int factor = argc > 4 ? atoi(argv[4]) : 4;
    int kind = !strcmp(op, "broadcast")    ? 1
               : !strcmp(op, "all_gather") ? 2
               : !strcmp(op, "gather")     ? 3
               : !strcmp(op, "scatter")    ? 4
                                           : 0;
    char *send = malloc((size_t)max), *recv = malloc((size_t)max);
    if (send == NULL || recv == NULL)
        MPI_Abort(MPI_COMM_WORLD, 1);
    /* Written, so that every page is its own: a calloc'd page never written
     * reads as the kernel's one zero page, which a single-copy read then
     * copies from cache (a 1 MiB broadcast took 42-65 us so, against 80-100
     * for the same process_vm_readv from written pages). */
    for (long i = 0; i < max; i++) {
        send[i] = (char)(i * 7 + rank);
        recv[i] = (char)(i * 13 + rank);
    }
    for (long size = min; size <= max; size *= factor) {
        int per = (int)(size / 4 / n * 4); /* whole float32 elements per rank, as c10d-bench */
        int whole = kind == 1 ? (int)(size / 4 * 4) : per * n;
        long iters = (64L << 20) / size / 4; /* c10d-bench's rule in move_compare.sh */
        iters = iters < 20 ? 20 : iters > 2000 ? 2000 : iters;
        double elapsed = 0;
        for (int timed = 0; timed < 2; timed++) {
            long it = timed ? iters : iters / 10 + 2;
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            for (long i = 0; i < it; i++) {
                if (kind == 1)
                    MPI_Bcast(recv, whole, MPI_BYTE, 0, MPI_COMM_WORLD);
                else if (kind == 2)
                    MPI_Allgather(send, per, MPI_BYTE, recv, per, MPI_BYTE, MPI_COMM_WORLD);
                else if (kind == 3)
                    MPI_Gather(send, per, MPI_BYTE, recv, per, MPI_BYTE, 0, MPI_COMM_WORLD);
                else if (kind == 4)
                    MPI_Scatter(send, per, MPI_BYTE, recv, per, MPI_BYTE, 0, MPI_COMM_WORLD);
                else
                    MPI_Alltoall(send, per, MPI_BYTE, recv, per, MPI_BYTE, MPI_COMM_WORLD);
            }
            elapsed = (MPI_Wtime() - t0) / (double)it;
        }
        double worst;
        MPI_Reduce(&elapsed, &worst, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        if (rank == 0) {
            printf("%d %.2f\n", whole, worst * 1e6);
            fflush(stdout);
        }
    }
    free(send);
    free(recv);
    MPI_Finalize();
    return 0;
}
