/* Host reduction kernel throughput against memcpy on the same machine.
 *
 *   bench_reduce [--sizes KiB,KiB,...] [--time SECONDS] [--isa auto|generic|avx2]
 *
 * "buf GB/s" is buffer bytes per second (what a caller sees: n*size/t);
 * "traffic GB/s" counts every stream (memcpy: read + write = 2x, reduce:
 * read dst + read src + write dst = 3x). The %memcpy column compares buffer
 * rates, so 66% is what a perfectly bandwidth-bound reduce would reach. */
#include "c10d.h"
#include "engine/kernels/half.h"
#include "engine/kernels/reduce.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double min_time = 0.25;

/* Seconds per call: best of rounds, each round repeating the call enough
 * to make timer noise negligible. */
static double time_reduce(void *d, const void *s, size_t n, c10d_dtype dt, c10d_reduce_op op)
{
    double best = 1e30, start = now();
    int reps = 1;
    while (now() - start < min_time) {
        double t0 = now();
        for (int r = 0; r < reps; r++)
            if (c10d__reduce(d, s, n, dt, op) != 0) {
                fprintf(stderr, "reduce failed: %s\n", c10d_last_error());
                exit(1);
            }
        double t = (now() - t0) / reps;
        if (t < best)
            best = t;
        if (now() - t0 < 0.01)
            reps *= 2;
    }
    return best;
}

static double time_memcpy(void *d, const void *s, size_t bytes)
{
    double best = 1e30, start = now();
    int reps = 1;
    while (now() - start < min_time) {
        double t0 = now();
        for (int r = 0; r < reps; r++) {
            memcpy(d, s, bytes);
            __asm__ volatile("" ::"r"(d) : "memory"); /* keep every copy */
        }
        double t = (now() - t0) / reps;
        if (t < best)
            best = t;
        if (now() - t0 < 0.01)
            reps *= 2;
    }
    return best;
}

/* Values that stay finite under repeated SUM/PRODUCT so the timing does
 * not drift into NaN/inf or denormal slow paths. */
static void fill(unsigned char *p, size_t n, c10d_dtype dt, int src)
{
    size_t es = c10d_dtype_size(dt);
    for (size_t i = 0; i < n; i++) {
        float v = src ? 0.0f : 1.0f + (float)(i % 7) * 0.125f;
        uint64_t bits = 0;
        switch (dt) {
        case C10D_FLOAT32:
            memcpy(&bits, &v, 4);
            break;
        case C10D_FLOAT64: {
            double d = v;
            memcpy(&bits, &d, 8);
            break;
        }
        case C10D_FLOAT16:
            bits = c10d__float_to_half(v);
            break;
        case C10D_BFLOAT16:
            bits = c10d__float_to_bf16(v);
            break;
        case C10D_FLOAT8_E4M3:
            bits = c10d__float_to_e4m3(v);
            break;
        case C10D_FLOAT8_E5M2:
            bits = c10d__float_to_e5m2(v);
            break;
        default:
            bits = src ? 1 : i % 7;
        }
        memcpy(p + i * es, &bits, es);
    }
}

struct bench_case {
    c10d_dtype dt;
    c10d_reduce_op op;
};

static const struct bench_case cases[] = {
    {C10D_FLOAT32, C10D_SUM},  {C10D_FLOAT32, C10D_MAX},     {C10D_FLOAT32, C10D_PRODUCT},
    {C10D_FLOAT64, C10D_SUM},  {C10D_FLOAT16, C10D_SUM},     {C10D_BFLOAT16, C10D_SUM},
    {C10D_BFLOAT16, C10D_MIN}, {C10D_INT8, C10D_SUM},        {C10D_UINT8, C10D_MAX},
    {C10D_INT32, C10D_SUM},    {C10D_INT32, C10D_BXOR},      {C10D_INT64, C10D_SUM},
    {C10D_BOOL, C10D_BOR},     {C10D_FLOAT8_E4M3, C10D_SUM}, {C10D_FLOAT8_E5M2, C10D_SUM},
    {C10D_INT16, C10D_SUM},    {C10D_UINT16, C10D_MAX},      {C10D_UINT32, C10D_MIN},
    {C10D_UINT64, C10D_SUM},   {C10D_COMPLEX64, C10D_SUM},   {C10D_COMPLEX128, C10D_SUM},
};

int main(int argc, char **argv)
{
    size_t sizes_kib[8] = {256, 65536};
    int nsizes = 2;
    const char *isa_name = "auto";
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--time") == 0 && i + 1 < argc) {
            min_time = atof(argv[++i]);
        } else if (strcmp(argv[i], "--isa") == 0 && i + 1 < argc) {
            isa_name = argv[++i];
        } else if (strcmp(argv[i], "--sizes") == 0 && i + 1 < argc) {
            nsizes = 0;
            for (char *tok = strtok(argv[++i], ","); tok && nsizes < 8; tok = strtok(NULL, ","))
                sizes_kib[nsizes++] = strtoull(tok, NULL, 10);
        } else {
            fprintf(stderr, "usage: %s [--sizes KiB,...] [--time S] [--isa auto|generic|avx2]\n",
                    argv[0]);
            return 2;
        }
    }
    int want = strcmp(isa_name, "generic") == 0 ? C10D_ISA_GENERIC
               : strcmp(isa_name, "avx2") == 0  ? C10D_ISA_AVX2
                                                : C10D_ISA_AUTO;
    int isa = c10d__reduce_set_isa(want);
    printf("kernels: %s\n", isa == C10D_ISA_AVX2 ? "avx2" : "generic (baseline x86-64)");

    for (int si = 0; si < nsizes; si++) {
        size_t bytes = sizes_kib[si] * 1024;
        unsigned char *d = aligned_alloc(64, bytes), *s = aligned_alloc(64, bytes);
        if (!d || !s) {
            fprintf(stderr, "out of memory\n");
            return 1;
        }
        memset(d, 0, bytes);
        memset(s, 1, bytes);
        double tm = time_memcpy(d, s, bytes);
        double mbuf = (double)bytes / tm / 1e9;
        printf("\n%zu KiB buffers\n", sizes_kib[si]);
        printf("%-14s %-8s %10s %13s %9s\n", "dtype", "op", "buf GB/s", "traffic GB/s", "%memcpy");
        printf("%-14s %-8s %10.2f %13.2f %8.0f%%\n", "(memcpy)", "", mbuf, 2 * mbuf, 100.0);
        for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
            c10d_dtype dt = cases[ci].dt;
            size_t n = bytes / c10d_dtype_size(dt);
            fill(d, n, dt, 0);
            fill(s, n, dt, 1);
            double t = time_reduce(d, s, n, dt, cases[ci].op);
            double g = (double)bytes / t / 1e9;
            printf("%-14s %-8s %10.2f %13.2f %8.0f%%\n", c10d_dtype_name(dt),
                   c10d_reduce_op_name(cases[ci].op), g, 3 * g, 100 * g / mbuf);
        }
        free(d);
        free(s);
    }
    return 0;
}
