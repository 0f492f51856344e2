/* gpusim: a CPU simulation of the CUDA runtime and NCCL, a TEST DOUBLE.
 *
 * Tests point C10D_CUDART_LIBRARY and C10D_NCCL_LIBRARY at libc10d_gpusim.so
 * so that the suite written for real GPUs runs on CPU-only machines. It is
 * never installed, never linked into libc10d and never benchmarked: its
 * timing means nothing. This header is private to the three sources:
 *   gpusim_cuda.c  devices, memory, streams (one thread each), events
 *   gpusim_nccl.c  communicators: init, split, shrink, abort, errors, knobs
 *   gpusim_coll.c  collectives, P2P and groups through a shared segment
 *   gpusim_kernel.c  libraries and the one kernel libc10d launches, on the CPU */
#ifndef C10D_TEST_GPUSIM_GPUSIM_H
#define C10D_TEST_GPUSIM_GPUSIM_H

#include "gpu/gpu_decls.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define SIM_API __attribute__((visibility("default")))

/* ---------------------------------------------------------------- streams */
/* Runs fn(arg) on the stream's thread after everything queued before it.
 * cudaSuccess, or cudaErrorInvalidResourceHandle / cudaErrorMemoryAllocation. */
cudaError_t sim_stream_enqueue(cudaStream_t stream, void (*fn)(void *), void *arg);
/* 1 if the handle names a live stream (or one of the default-stream aliases). */
int sim_stream_valid(cudaStream_t stream);

/* ------------------------------------------------------- sticky errors */
/* A device fault (a kernel touched memory no allocation holds): from then
 * on, as on a GPU, the process's CUDA calls fail with `e` and NCCL's with
 * ncclUnhandledCudaError. */
void sim_fault(cudaError_t e);
/* The sticky error, or cudaSuccess. */
cudaError_t sim_sticky(void);
/* A call that needs a CUDA context on the calling thread's current device:
 * records that the process has one there (c10d_gpusim_contexts). */
void sim_mark_context(void);
/* The calling thread's current device, and the device of the allocation
 * holding p (-1: none, e.g. host memory). */
int sim_current_device(void);
int sim_dev_ptr_device(const void *p);
/* For tests (dlsym): the devices the process made a context on, a bit each. */
SIM_API unsigned long long c10d_gpusim_contexts(void);
/* For tests (dlsym): the communicators the process made (init, split, shrink). */
SIM_API unsigned long c10d_gpusim_comms_made(void);
/* For tests (dlsym): a segment's name stays in /dev/shm until every rank
 * joined or its maker released it, so a process that ends before either (a
 * rank killed, one whose init waits for a peer that never joins) leaves it
 * behind. Unlinks every name whose maker is gone; returns how many. */
SIM_API int c10d_gpusim_reap_orphans(void);
/* 1 if the device can reach [p, p + n): inside one live allocation, or host
 * memory the process maps. */
int sim_dev_range_valid(const void *p, size_t n);

/* ------------------------------------------------------ shared segment */
#define SIM_MAX_RANKS  256
#define SIM_SLOT_BYTES (1u << 20) /* per rank, for collectives */
#define SIM_CHAN_BYTES (1u << 17) /* per (sender, receiver) pair, for P2P */
#define SIM_SPLIT_RING 64         /* split posts a rank may run ahead by */
#define SIM_PREMUL_MAX 256        /* live PreMulSum ops per communicator */

struct sim_seg_hdr {
    _Atomic uint32_t ready; /* the creator has laid the segment out */
    uint32_t magic;
    int32_t nranks;
    _Atomic int32_t joined;
    _Atomic int32_t unlinked; /* the name is gone from /dev/shm */
    int32_t creator_pid;      /* c10d_gpusim_reap_orphans */
};

struct sim_split_post {
    _Atomic uint64_t seq; /* written last: color and key are valid once it matches */
    int32_t color, key;
};

struct sim_chan {
    _Atomic uint64_t head; /* bytes the sender wrote */
    _Atomic uint64_t tail; /* bytes the receiver took */
};

struct sim_premul {
    int used;
    ncclDataType_t dt;
    ncclScalarResidence_t residence;
    unsigned char value[8]; /* host-immediate: the scalar read at creation */
    const void *ptr;        /* device: read when the op runs */
};

enum sim_state { SIM_EXCHANGE, SIM_OPEN, SIM_MAP, SIM_JOIN, SIM_WAIT, SIM_READY, SIM_FAILED };

struct sim_comm {
    uint32_t magic;
    int nranks, rank;
    int device;    /* current at creation, as NCCL's cudaDev */
    int blocking;  /* config->blocking */
    char name[64]; /* "/c10dsim-<32 hex>" */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* creation (under mu until SIM_READY) */
    enum sim_state state;
    ncclResult_t init_error;
    int fd, creator; /* fd >= 0: we opened the name and may unlink it */
    double init_start;
    struct sim_comm *parent; /* SIM_EXCHANGE: the split's parent (a reference) */
    uint64_t split_seq;
    int color, key;
    /* the mapping */
    unsigned char *seg;
    size_t seg_size, off_present, off_arrive, off_posts, off_chan, off_slots, off_chandata;
    /* knobs, read from the environment at creation */
    long hang_at, async_at, abort_delay_ms, init_delay_ms;
    int init_never;
    long first_launch_delay_ms; /* the first ncclGroupEnd on it blocks this long */
    _Atomic int launched;
    /* running */
    _Atomic int aborted;
    _Atomic int refs;           /* the user's, one per queued task, a split child's */
    int pending;                /* queued tasks not finished (under mu) */
    int enqueuing;              /* ops of nonblocking groups not enqueued yet (under mu) */
    ncclResult_t enqueue_error; /* the first failure of such an enqueue (under mu) */
    uint64_t next_ticket;       /* under the global submit lock */
    _Atomic uint64_t turn;      /* the ticket allowed to run: tasks run in call order */
    uint64_t bar_seq;           /* barriers passed (by the task holding the turn) */
    uint64_t split_count;       /* splits and shrinks made from this one (under mu) */
    struct sim_premul premul[SIM_PREMUL_MAX];
};

/* gpusim_nccl.c */
/* NULL unless h is a live communicator. */
struct sim_comm *sim_comm_get(ncclComm_t h);
extern _Atomic uint64_t sim_tasks_done; /* tasks this process completed */
void sim_comm_unref(struct sim_comm *c);
/* ncclSuccess if usable for an operation, else the NCCL error (text recorded). */
ncclResult_t sim_comm_check_ready(struct sim_comm *c, const char *who);
int sim_comm_async_failed(struct sim_comm *c);
void sim_set_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Waits a little (a short spin, then ~50 us sleeps): 0, or -1 if c is aborted. */
int sim_backoff(struct sim_comm *c, unsigned *spins);

static inline struct sim_seg_hdr *sim_hdr(struct sim_comm *c)
{
    return (struct sim_seg_hdr *)c->seg;
}
static inline _Atomic uint64_t *sim_arrive(struct sim_comm *c, int r)
{
    return (_Atomic uint64_t *)(c->seg + c->off_arrive) + r;
}
static inline struct sim_chan *sim_chan(struct sim_comm *c, int from, int to)
{
    return (struct sim_chan *)(c->seg + c->off_chan) + (size_t)from * (size_t)c->nranks +
           (size_t)to;
}
static inline unsigned char *sim_chandata(struct sim_comm *c, int from, int to)
{
    return c->seg + c->off_chandata +
           ((size_t)from * (size_t)c->nranks + (size_t)to) * SIM_CHAN_BYTES;
}
static inline unsigned char *sim_slot(struct sim_comm *c, int r)
{
    return c->seg + c->off_slots + (size_t)r * SIM_SLOT_BYTES;
}

/* gpusim_coll.c: datatypes (also used for PreMulSum scalars) */
size_t sim_dtype_size(ncclDataType_t dt); /* 0 when invalid */

#endif
