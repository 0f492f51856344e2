/* ddp_tiny: data-parallel training of a small MLP in plain C, the way
 * torch's DistributedDataParallel does it, with libc10d doing the talking:
 *
 *   c10drun -n 4 build/examples/ddp_tiny [STEPS]
 *
 * Every rank holds a replica of the model and its own shard of a synthetic
 * regression problem. Rank 0's initial weights are broadcast to all; each
 * step every rank computes gradients on its shard, all_reduce(AVG) makes them
 * the global mean, and every rank applies the same SGD step. At the end the
 * ranks all_gather a checksum of their weights: they must be bit-identical.
 * Exit status 0 only if they are and the loss went down.
 *
 *   c10drun -n 4 build/examples/ddp_tiny --device cuda [STEPS]
 *
 * runs the collectives on one GPU per rank (its local rank, from whichever
 * launcher started it: c10d_launch_query) through the nccl
 * backend. Plain C has no kernels, so the model is still computed on the
 * host: each step copies the gradients to the device, all-reduces them there
 * and copies them back, the way DDP all-reduces a gradient bucket in place.
 * The CUDA runtime is loaded at run time, the same file libc10d loads
 * (C10D_CUDART_LIBRARY, else libcudart.so.13 or .12), so the example links
 * nothing but libc10d and runs on machines without CUDA. */
#include "c10d.h"

#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define IN     16
#define HIDDEN 32
#define SHARD  256 /* samples per rank */
#define LR     0.05f

/* Parameters, flat so that one all_reduce moves all gradients. */
#define W1     0
#define B1     (W1 + IN * HIDDEN)
#define W2     (B1 + HIDDEN)
#define B2     (W2 + HIDDEN)
#define NPARAM (B2 + 1)

static uint64_t rng_state;

static float frand(void) /* xorshift64*: deterministic per seed, in [-1, 1) */
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (float)((rng_state * 0x2545F4914F6CDD1DULL) >> 40) / (float)(1 << 23) - 1.0f;
}

static void make_shard(int rank, float *x, float *y)
{
    /* The teacher is the same on every rank; the samples are the rank's own. */
    float teacher[IN];
    rng_state = 42;
    for (int j = 0; j < IN; j++)
        teacher[j] = frand();
    rng_state = 1000 + (uint64_t)rank * 7919;
    for (int s = 0; s < SHARD; s++) {
        float dot = 0;
        for (int j = 0; j < IN; j++) {
            x[s * IN + j] = frand();
            dot += teacher[j] * x[s * IN + j];
        }
        y[s] = sinf(dot);
    }
}

/* Mean squared error on the shard; accumulates d(loss)/d(param) into grad. */
static float forward_backward(const float *p, const float *x, const float *y, float *grad)
{
    memset(grad, 0, NPARAM * sizeof *grad);
    float loss = 0, h[HIDDEN];
    for (int s = 0; s < SHARD; s++) {
        const float *xs = x + s * IN;
        float out = p[B2];
        for (int k = 0; k < HIDDEN; k++) {
            float a = p[B1 + k];
            for (int j = 0; j < IN; j++)
                a += p[W1 + k * IN + j] * xs[j];
            h[k] = tanhf(a);
            out += p[W2 + k] * h[k];
        }
        float err = out - y[s];
        loss += err * err;
        float dout = 2 * err / SHARD;
        grad[B2] += dout;
        for (int k = 0; k < HIDDEN; k++) {
            grad[W2 + k] += dout * h[k];
            float da = dout * p[W2 + k] * (1 - h[k] * h[k]);
            grad[B1 + k] += da;
            for (int j = 0; j < IN; j++)
                grad[W1 + k * IN + j] += da * xs[j];
        }
    }
    return loss / SHARD;
}

static uint64_t checksum(const float *p, size_t n)
{
    uint64_t h = 1469598103934665603ULL; /* FNV-1a over the bytes */
    const unsigned char *b = (const unsigned char *)p;
    for (size_t i = 0; i < n * sizeof *p; i++)
        h = (h ^ b[i]) * 1099511628211ULL;
    return h;
}

#define CHECK(call)                                                                                \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_ != 0) {                                                                            \
            fprintf(stderr, "ddp_tiny: %s failed: %s: %s\n", #call, c10d_status_name(rc_),         \
                    c10d_last_error());                                                            \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* ---------------------------------------------------------------- --device cuda */

/* The few CUDA runtime entries used here, with CUDA's ABI: cudaError_t and
 * cudaMemcpyKind are C enums (int), 0 is cudaSuccess. */
static struct {
    int (*get_device_count)(int *count);
    int (*set_device)(int device);
    int (*alloc)(void **ptr, size_t bytes);
    int (*release)(void *ptr);
    int (*copy)(void *dst, const void *src, size_t bytes, int kind);
    const char *(*error_string)(int error);
} cuda;
enum { HOST_TO_DEVICE = 1, DEVICE_TO_HOST = 2 };

static int on_gpu;            /* --device cuda */
static c10d_op_opts gpu_opts; /* every collective's buffers: this rank's device */

static void cuda_check(int err, const char *what)
{
    if (err != 0) {
        fprintf(stderr, "ddp_tiny: %s failed: %s\n", what, cuda.error_string(err));
        exit(1);
    }
}

static void *cuda_sym(void *lib, const char *name)
{
    void *sym = dlsym(lib, name);
    if (sym == NULL) {
        fprintf(stderr, "ddp_tiny: the CUDA runtime has no %s\n", name);
        exit(1);
    }
    return sym;
}

/* Loads the CUDA runtime and makes this rank's GPU current: the local rank
 * the launcher gives (LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID...:
 * c10d_launch_query), else the rank modulo the devices visible. Before the
 * group is created, so its communicator is made on that device. */
static int cuda_open(void)
{
    const char *configured = getenv("C10D_CUDART_LIBRARY");
    const char *names[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so", NULL};
    if (configured != NULL && *configured != '\0')
        names[0] = configured, names[1] = NULL;
    void *lib = NULL;
    for (int i = 0; lib == NULL && names[i] != NULL; i++)
        lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        fprintf(stderr,
                "ddp_tiny: --device cuda: the CUDA runtime could not be loaded (%s); set "
                "C10D_CUDART_LIBRARY to libcudart.so's path\n",
                dlerror());
        exit(1);
    }
    /* dlsym returns data pointers; POSIX guarantees they convert to functions. */
    void *fns[] = {cuda_sym(lib, "cudaGetDeviceCount"), cuda_sym(lib, "cudaSetDevice"),
                   cuda_sym(lib, "cudaMalloc"),         cuda_sym(lib, "cudaFree"),
                   cuda_sym(lib, "cudaMemcpy"),         cuda_sym(lib, "cudaGetErrorString")};
    _Static_assert(sizeof cuda == sizeof fns, "one symbol per entry of `cuda`");
    memcpy(&cuda, fns, sizeof cuda);
    int n = 0;
    cuda_check(cuda.get_device_count(&n), "cudaGetDeviceCount");
    c10d_launch_info launch = C10D_LAUNCH_INFO_INIT;
    if (c10d_launch_query(&launch) < 0) {
        fprintf(stderr, "ddp_tiny: %s\n", c10d_last_error());
        exit(1);
    }
    int dev = launch.local_rank >= 0      ? launch.local_rank
              : launch.rank >= 0 && n > 0 ? launch.rank % n
                                          : 0;
    if (n <= 0 || dev < 0 || dev >= n) {
        fprintf(stderr,
                "ddp_tiny: --device cuda: no CUDA device %d (%d visible; one GPU per rank)\n", dev,
                n);
        exit(1);
    }
    cuda_check(cuda.set_device(dev), "cudaSetDevice");
    return dev;
}

static void *gpu_alloc(size_t bytes)
{
    void *p = NULL;
    cuda_check(cuda.alloc(&p, bytes), "cudaMalloc");
    return p;
}

/* The buffer a collective sees for host data: the host array itself, or its
 * copy on the device (cudaMemcpy is ordered on the default stream, the stream
 * the collectives are issued after). */
static void *stage(void *dev, const void *host, size_t bytes)
{
    if (!on_gpu)
        return (void *)host;
    cuda_check(cuda.copy(dev, host, bytes, HOST_TO_DEVICE), "cudaMemcpy to the device");
    return dev;
}

/* Back to the host once the collective's work completed. */
static void unstage(void *host, const void *buf, size_t bytes)
{
    if (buf != host)
        cuda_check(cuda.copy(host, buf, bytes, DEVICE_TO_HOST), "cudaMemcpy to the host");
}

int main(int argc, char **argv)
{
    int steps = 300, bad = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--device") == 0 && i + 1 < argc) {
            const char *dev = argv[++i];
            on_gpu = strcmp(dev, "cuda") == 0;
            bad |= !on_gpu && strcmp(dev, "cpu") != 0;
        } else {
            steps = atoi(argv[i]);
            bad |= steps <= 0;
        }
    }
    if (bad) {
        fprintf(stderr, "usage: ddp_tiny [--device cpu|cuda] [STEPS > 0]\n");
        return 2;
    }
    c10d_pg *pg;
    if (!on_gpu) {
        /* Zero options: env:// rendezvous (c10drun sets MASTER_ADDR, RANK, ...), tcp backend. */
        CHECK(c10d_pg_init(NULL, &pg));
    } else {
        /* Bound to the device: the communicator is made now, not in the first step. */
        c10d_pg_opts po = C10D_PG_OPTS_INIT;
        po.backend = "nccl";
        po.bind_device = 1;
        po.device_index = cuda_open();
        gpu_opts = (c10d_op_opts)C10D_OP_OPTS_INIT;
        gpu_opts.device_type = C10D_DEVICE_CUDA;
        gpu_opts.device_index = po.device_index;
        CHECK(c10d_pg_init(&po, &pg));
    }
    const c10d_op_opts *opts = on_gpu ? &gpu_opts : NULL;
    int rank = c10d_pg_rank(pg), world = c10d_pg_size(pg);

    static float params[NPARAM], grad[NPARAM], x[SHARD * IN], y[SHARD];
    float *dev_params = NULL, *dev_grad = NULL, *dev_loss = NULL;
    int64_t *dev_sums = NULL;
    if (on_gpu) {
        dev_params = gpu_alloc(sizeof params);
        dev_grad = gpu_alloc(sizeof grad);
        dev_loss = gpu_alloc(sizeof(float));
        dev_sums = gpu_alloc(((size_t)world + 1) * sizeof *dev_sums);
    }
    make_shard(rank, x, y);
    /* Only rank 0's initialisation matters: the broadcast overwrites the rest. */
    rng_state = rank == 0 ? 7 : 99 + (uint64_t)rank;
    for (int i = 0; i < NPARAM; i++)
        params[i] = 0.3f * frand();
    float *p = stage(dev_params, params, sizeof params);
    c10d_work *w;
    CHECK(c10d_broadcast(pg, p, p, NPARAM, C10D_FLOAT32, 0, opts, &w));
    CHECK(c10d_work_wait_release(w));
    unstage(params, p, sizeof params);

    float first = 0, loss = 0;
    for (int step = 0; step < steps; step++) {
        float local = forward_backward(params, x, y, grad);
        /* Gradients: the mean over every rank's shard. The loss rides along
         * in its own small all_reduce, asynchronously, while we update. */
        c10d_work *loss_work, *grad_work;
        loss = local;
        float *l = stage(dev_loss, &loss, sizeof loss), *g = stage(dev_grad, grad, sizeof grad);
        CHECK(c10d_all_reduce(pg, l, l, 1, C10D_FLOAT32, C10D_AVG, opts, &loss_work));
        CHECK(c10d_all_reduce(pg, g, g, NPARAM, C10D_FLOAT32, C10D_AVG, opts, &grad_work));
        CHECK(c10d_work_wait_release(grad_work));
        unstage(grad, g, sizeof grad);
        for (int i = 0; i < NPARAM; i++)
            params[i] -= LR * grad[i];
        CHECK(c10d_work_wait_release(loss_work));
        unstage(&loss, l, sizeof loss);
        if (step == 0)
            first = loss;
        if (rank == 0 && (step % 50 == 0 || step == steps - 1))
            printf("step %4d  loss %.6f\n", step, loss);
    }

    /* Proof: every replica holds the same bytes. */
    int64_t mine = (int64_t)checksum(params, NPARAM);
    int64_t *all = calloc((size_t)world, sizeof *all);
    if (all == NULL)
        return 1;
    int64_t *m = stage(dev_sums + world, &mine, sizeof mine), *a = on_gpu ? dev_sums : all;
    CHECK(c10d_all_gather(pg, m, a, 1, C10D_INT64, opts, &w));
    CHECK(c10d_work_wait_release(w));
    unstage(all, a, (size_t)world * sizeof *all);
    int same = 1;
    for (int r = 0; r < world; r++)
        same &= all[r] == all[0];
    int improved = loss < 0.5f * first;
    if (rank == 0) {
        printf("loss %.6f -> %.6f over %d steps on %d ranks (%d samples)\n", first, loss, steps,
               world, world * SHARD);
        if (same)
            printf("weights identical on all %d ranks: checksum %016llx\n", world,
                   (unsigned long long)all[0]);
        else
            for (int r = 0; r < world; r++)
                printf("rank %d checksum %016llx%s\n", r, (unsigned long long)all[r],
                       all[r] != all[0] ? "  MISMATCH" : "");
        if (!improved)
            printf("loss did not halve: training failed\n");
    }
    free(all);
    CHECK(c10d_pg_destroy(pg));
    if (on_gpu) {
        cuda.release(dev_params);
        cuda.release(dev_grad);
        cuda.release(dev_loss);
        cuda.release(dev_sums);
    }
    c10d_shutdown();
    return same && improved ? 0 : 1;
}
