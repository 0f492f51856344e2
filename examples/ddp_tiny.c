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
 * Exit status 0 only if they are and the loss went down. */
#include "c10d.h"

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

int main(int argc, char **argv)
{
    int steps = argc > 1 ? atoi(argv[1]) : 300;
    if (steps <= 0) {
        fprintf(stderr, "usage: ddp_tiny [STEPS > 0]\n");
        return 2;
    }
    c10d_pg *pg;
    /* Zero options: env:// rendezvous (c10drun sets MASTER_ADDR, RANK, ...), tcp backend. */
    CHECK(c10d_pg_init(NULL, &pg));
    int rank = c10d_pg_rank(pg), world = c10d_pg_size(pg);

    static float params[NPARAM], grad[NPARAM], x[SHARD * IN], y[SHARD];
    make_shard(rank, x, y);
    /* Only rank 0's initialisation matters: the broadcast overwrites the rest. */
    rng_state = rank == 0 ? 7 : 99 + (uint64_t)rank;
    for (int i = 0; i < NPARAM; i++)
        params[i] = 0.3f * frand();
    CHECK(c10d_broadcast_sync(pg, params, params, NPARAM, C10D_FLOAT32, 0));

    float first = 0, loss = 0;
    for (int step = 0; step < steps; step++) {
        float local = forward_backward(params, x, y, grad);
        /* Gradients: the mean over every rank's shard. The loss rides along
         * in its own small all_reduce, asynchronously, while we update. */
        c10d_work *loss_work;
        loss = local;
        CHECK(c10d_all_reduce(pg, &loss, &loss, 1, C10D_FLOAT32, C10D_AVG, NULL, &loss_work));
        CHECK(c10d_all_reduce_sync(pg, grad, grad, NPARAM, C10D_FLOAT32, C10D_AVG));
        for (int i = 0; i < NPARAM; i++)
            params[i] -= LR * grad[i];
        CHECK(c10d_work_wait_release(loss_work));
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
    c10d_work *w;
    CHECK(c10d_all_gather(pg, &mine, all, 1, C10D_INT64, NULL, &w));
    CHECK(c10d_work_wait_release(w));
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
    c10d_shutdown();
    return same && improved ? 0 : 1;
}
