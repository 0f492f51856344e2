/* gpusim, the CUDA runtime part: a TEST DOUBLE, never installed, never
 * benchmarked (see gpusim.h and README.md).
 *
 * Device memory is host memory. A stream is an ordered executor: a FIFO of
 * tasks and one thread, started at the first task (never in a constructor:
 * the process may fork before using us). Stream 0, cudaStreamLegacy and
 * cudaStreamPerThread are one process-wide default stream. An event counts
 * its records; a record enqueues a marker, and the event is complete once
 * the marker of its latest record has run. */
#include "gpusim.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define STREAM_MAGIC 0x5157524du
#define EVENT_MAGIC  0x45564e54u

struct sim_task {
    void (*fn)(void *);
    void *arg;
    struct sim_task *next;
};

struct sim_stream {
    uint32_t magic;
    int device, priority;
    unsigned flags;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct sim_task *head, *tail;
    uint64_t enqueued, done;
    int started, destroying;
    _Atomic int refs; /* the user's (or the process's, for the default) and the thread's */
    struct sim_stream *next_all;
};

struct sim_event {
    uint32_t magic;
    unsigned flags;
    uint64_t recorded, completed; /* under ev_mu */
    uint64_t completed_ns;        /* under ev_mu: when the last record completed */
    int refs;                     /* under ev_mu: the user's and one per queued marker/wait */
};

/* All streams (for cudaDeviceSynchronize) and the default stream. */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static struct sim_stream *g_streams, *g_default;
/* Every event's state, and one condition for every wait on an event. */
static pthread_mutex_t ev_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ev_cv = PTHREAD_COND_INITIALIZER;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static _Thread_local int t_device;
static _Thread_local cudaError_t t_last_error;
static _Thread_local enum cudaStreamCaptureMode t_capture_mode = cudaStreamCaptureModeGlobal;

/* The devices this process has a context on: a thread's first call that
 * needs one makes it on the thread's current device, as CUDA does (and
 * cudaSetDevice makes one since CUDA 12). c10d_gpusim_contexts() tells. */
static _Atomic unsigned long long g_contexts;

void sim_mark_context(void)
{
    atomic_fetch_or(&g_contexts, 1ull << t_device);
}

SIM_API unsigned long long c10d_gpusim_contexts(void)
{
    return atomic_load(&g_contexts);
}

static cudaError_t ret(cudaError_t e)
{
    if (e != cudaSuccess)
        t_last_error = e;
    return e;
}

/* ------------------------------------------------------- sticky errors */
static _Atomic int g_sticky; /* a cudaError_t; 0 until a fault */

void sim_fault(cudaError_t e)
{
    int none = 0;
    atomic_compare_exchange_strong(&g_sticky, &none, (int)e);
}

cudaError_t sim_sticky(void)
{
    return (cudaError_t)atomic_load(&g_sticky);
}

/* Every API call that touches the device fails once a fault happened. */
#define STICKY_RETURN()                                                                            \
    do {                                                                                           \
        cudaError_t sticky_ = sim_sticky();                                                        \
        if (sticky_ != cudaSuccess)                                                                \
            return ret(sticky_);                                                                   \
    } while (0)

/* Live device allocations, so a kernel's access can be checked. */
struct sim_alloc {
    char *base;
    size_t size;
    int device; /* current at cudaMalloc */
    struct sim_alloc *next;
};
static pthread_mutex_t alloc_mu = PTHREAD_MUTEX_INITIALIZER;
static struct sim_alloc *allocs;

int sim_current_device(void)
{
    return t_device;
}

int sim_dev_ptr_device(const void *p)
{
    const char *c = p;
    int dev = -1;
    pthread_mutex_lock(&alloc_mu);
    for (struct sim_alloc *a = allocs; a != NULL && dev < 0; a = a->next)
        if (c >= a->base && (size_t)(c - a->base) < a->size)
            dev = a->device;
    pthread_mutex_unlock(&alloc_mu);
    return dev;
}

int sim_dev_range_valid(const void *p, size_t n)
{
    const char *c = p;
    int ok = 0;
    pthread_mutex_lock(&alloc_mu);
    for (struct sim_alloc *a = allocs; a != NULL && !ok; a = a->next)
        ok = c >= a->base && n <= a->size && (size_t)(c - a->base) <= a->size - n;
    pthread_mutex_unlock(&alloc_mu);
    if (ok || n == 0)
        return ok || n == 0;
    /* Host memory the process maps is reachable too (as with HMM, and as this
     * simulation's own tests use it); an address nothing maps is not. */
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), lo = (uintptr_t)c & ~(page - 1);
    uintptr_t hi = (uintptr_t)c + n;
    return hi > (uintptr_t)c && msync((void *)lo, hi - lo, MS_ASYNC) == 0;
}

/* A child forked after we ran has none of our threads: start afresh (the
 * parent's streams are leaked, their handles are invalid in the child). */
static void after_fork_child(void)
{
    pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
    g_mu = m;
    ev_mu = m;
    ev_cv = cv;
    g_streams = NULL;
    g_default = NULL;
}

static void once_init(void)
{
    pthread_atfork(NULL, NULL, after_fork_child);
}

/* ------------------------------------------------------------- devices */
static int device_count(void)
{
    const char *s = getenv("C10D_SIM_DEVICES");
    if (s == NULL || *s == 0)
        return 1;
    long n = strtol(s, NULL, 10);
    return n < 0 ? 0 : n > 64 ? 64 : (int)n;
}

SIM_API cudaError_t cudaGetDeviceCount(int *count)
{
    if (count == NULL)
        return ret(cudaErrorInvalidValue);
#ifdef C10D_SIM_OLD_NCCL
    /* C10D_SIM_OLD_DRIVER=1: this copy plays a runtime newer than the driver. */
    const char *old = getenv("C10D_SIM_OLD_DRIVER");
    if (old != NULL && strcmp(old, "1") == 0) {
        *count = 0;
        return ret(cudaErrorInsufficientDriver);
    }
#endif
    *count = device_count();
    return *count == 0 ? ret(cudaErrorNoDevice) : cudaSuccess;
}

SIM_API cudaError_t cudaSetDevice(int device)
{
    int n = device_count();
    if (n == 0)
        return ret(cudaErrorNoDevice);
    if (device < 0 || device >= n)
        return ret(cudaErrorInvalidDevice);
    t_device = device;
    sim_mark_context();
    return cudaSuccess;
}

SIM_API cudaError_t cudaGetDevice(int *device)
{
    if (device == NULL)
        return ret(cudaErrorInvalidValue);
    if (device_count() == 0)
        return ret(cudaErrorNoDevice);
    *device = t_device;
    return cudaSuccess;
}

SIM_API cudaError_t cudaRuntimeGetVersion(int *runtimeVersion)
{
    if (runtimeVersion == NULL)
        return ret(cudaErrorInvalidValue);
    *runtimeVersion = 13000;
    return cudaSuccess;
}

SIM_API cudaError_t cudaDriverGetVersion(int *driverVersion)
{
    if (driverVersion == NULL)
        return ret(cudaErrorInvalidValue);
    *driverVersion = 13000;
    return cudaSuccess;
}

SIM_API const char *cudaGetErrorString(cudaError_t error)
{
    switch (error) {
    case cudaSuccess:
        return "no error";
    case cudaErrorInvalidValue:
        return "invalid argument";
    case cudaErrorMemoryAllocation:
        return "out of memory";
    case cudaErrorInvalidDevice:
        return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle:
        return "invalid resource handle";
    case cudaErrorNotReady:
        return "device not ready";
    case cudaErrorInvalidMemcpyDirection:
        return "invalid copy direction for memcpy";
    case cudaErrorNoDevice:
        return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevicePointer:
        return "invalid device pointer";
    case cudaErrorIllegalAddress:
        return "an illegal memory access was encountered";
    case cudaErrorNotSupported:
        return "operation not supported";
    case cudaErrorInsufficientDriver:
        return "CUDA driver version is insufficient for CUDA runtime version";
    default:
        return "unrecognized error code";
    }
}

SIM_API cudaError_t cudaGetLastError(void)
{
    if (sim_sticky() != cudaSuccess)
        return sim_sticky(); /* a fault is not cleared by reading it */
    cudaError_t e = t_last_error;
    t_last_error = cudaSuccess;
    return e;
}

SIM_API cudaError_t cudaDeviceGetStreamPriorityRange(int *leastPriority, int *greatestPriority)
{
    if (leastPriority != NULL)
        *leastPriority = 0;
    if (greatestPriority != NULL)
        *greatestPriority = -5;
    return cudaSuccess;
}

/* ------------------------------------------------------------- streams */
static void stream_unref(struct sim_stream *s)
{
    if (atomic_fetch_sub(&s->refs, 1) != 1)
        return;
    s->magic = 0;
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}

/* Under g_mu. */
static struct sim_stream *stream_new_locked(unsigned flags, int priority)
{
    struct sim_stream *s = calloc(1, sizeof *s);
    if (s == NULL)
        return NULL;
    s->magic = STREAM_MAGIC;
    s->device = t_device;
    s->flags = flags;
    s->priority = priority;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    atomic_init(&s->refs, 1);
    s->next_all = g_streams;
    g_streams = s;
    return s;
}

/* Under g_mu: off the device's list. */
static void unlink_locked(struct sim_stream *s)
{
    for (struct sim_stream **pp = &g_streams; *pp != NULL; pp = &(*pp)->next_all)
        if (*pp == s) {
            *pp = s->next_all;
            break;
        }
}

static void *stream_main(void *p)
{
    struct sim_stream *s = p;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (s->head == NULL && !s->destroying)
            pthread_cond_wait(&s->cv, &s->mu);
        struct sim_task *t = s->head;
        if (t == NULL)
            break; /* destroyed and drained */
        s->head = t->next;
        if (s->head == NULL)
            s->tail = NULL;
        pthread_mutex_unlock(&s->mu);
        t->fn(t->arg);
        free(t);
        pthread_mutex_lock(&s->mu);
        s->done++;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    /* Destroyed and drained: off the device's list (cudaStreamDestroy left
     * it there for the device's synchronisations while work was queued). */
    pthread_mutex_lock(&g_mu);
    unlink_locked(s);
    pthread_mutex_unlock(&g_mu);
    stream_unref(s);
    return NULL;
}

static int is_default(cudaStream_t h)
{
    return h == NULL || h == cudaStreamLegacy || h == cudaStreamPerThread;
}

/* NULL for an invalid handle. The default stream is made on first use. */
static struct sim_stream *stream_get(cudaStream_t h)
{
    pthread_once(&g_once, once_init);
    if (is_default(h)) {
        pthread_mutex_lock(&g_mu);
        if (g_default == NULL)
            g_default = stream_new_locked(0, 0);
        struct sim_stream *s = g_default;
        pthread_mutex_unlock(&g_mu);
        return s;
    }
    struct sim_stream *s = (struct sim_stream *)h;
    return s->magic == STREAM_MAGIC ? s : NULL;
}

int sim_stream_valid(cudaStream_t stream)
{
    return stream_get(stream) != NULL;
}

cudaError_t sim_stream_enqueue(cudaStream_t h, void (*fn)(void *), void *arg)
{
    struct sim_stream *s = stream_get(h);
    if (s == NULL)
        return cudaErrorInvalidResourceHandle;
    struct sim_task *t = malloc(sizeof *t);
    if (t == NULL)
        return cudaErrorMemoryAllocation;
    t->fn = fn;
    t->arg = arg;
    t->next = NULL;
    pthread_mutex_lock(&s->mu);
    if (!s->started) {
        /* The thread takes no signals: they stay with the process's own threads. */
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        pthread_t tid;
        atomic_fetch_add(&s->refs, 1);
        int rc = pthread_create(&tid, NULL, stream_main, s);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (rc != 0) {
            atomic_fetch_sub(&s->refs, 1);
            pthread_mutex_unlock(&s->mu);
            free(t);
            return cudaErrorMemoryAllocation;
        }
        pthread_detach(tid);
        s->started = 1;
    }
    if (s->tail != NULL)
        s->tail->next = t;
    else
        s->head = t;
    s->tail = t;
    s->enqueued++;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return cudaSuccess;
}

static void stream_drain(struct sim_stream *s)
{
    pthread_mutex_lock(&s->mu);
    uint64_t target = s->enqueued;
    while (s->done < target)
        pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

SIM_API cudaError_t cudaStreamCreateWithPriority(cudaStream_t *pStream, unsigned int flags,
                                                 int priority)
{
    sim_mark_context();
    if (pStream == NULL || (flags & ~(unsigned)cudaStreamNonBlocking) != 0)
        return ret(cudaErrorInvalidValue);
    pthread_once(&g_once, once_init);
    /* Out-of-range priorities are clamped, as CUDA does. */
    priority = priority > 0 ? 0 : priority < -5 ? -5 : priority;
    pthread_mutex_lock(&g_mu);
    struct sim_stream *s = stream_new_locked(flags, priority);
    pthread_mutex_unlock(&g_mu);
    if (s == NULL)
        return ret(cudaErrorMemoryAllocation);
    *pStream = (cudaStream_t)s;
    return cudaSuccess;
}

/* Returns at once; the queued work still runs, then the stream is freed. */
SIM_API cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
    sim_mark_context();
    struct sim_stream *s = is_default(stream) ? NULL : stream_get(stream);
    if (s == NULL)
        return ret(cudaErrorInvalidResourceHandle);
    /* A stream with a thread stays on the device's list until that thread
     * ran what was queued: the device's synchronisations (cudaFree's among
     * them) wait for a destroyed stream's work too, as CUDA's do. */
    pthread_mutex_lock(&g_mu);
    pthread_mutex_lock(&s->mu);
    if (!s->started)
        unlink_locked(s);
    s->destroying = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_mutex_unlock(&g_mu);
    stream_unref(s);
    return cudaSuccess;
}

SIM_API cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    sim_mark_context();
    STICKY_RETURN();
    struct sim_stream *s = stream_get(stream);
    if (s == NULL)
        return ret(cudaErrorInvalidResourceHandle);
    stream_drain(s);
    return cudaSuccess;
}

/* Waits for every stream's queued work, destroyed streams' included. */
static cudaError_t drain_device(void)
{
    pthread_once(&g_once, once_init);
    pthread_mutex_lock(&g_mu);
    size_t n = 0;
    for (struct sim_stream *s = g_streams; s != NULL; s = s->next_all)
        n++;
    struct sim_stream **all = malloc((n ? n : 1) * sizeof *all);
    if (all == NULL) {
        pthread_mutex_unlock(&g_mu);
        return cudaErrorMemoryAllocation;
    }
    n = 0;
    for (struct sim_stream *s = g_streams; s != NULL; s = s->next_all) {
        atomic_fetch_add(&s->refs, 1);
        all[n++] = s;
    }
    pthread_mutex_unlock(&g_mu);
    for (size_t i = 0; i < n; i++) {
        stream_drain(all[i]);
        stream_unref(all[i]);
    }
    free(all);
    return cudaSuccess;
}

SIM_API cudaError_t cudaDeviceSynchronize(void)
{
    sim_mark_context();
    STICKY_RETURN();
    return ret(drain_device());
}

SIM_API cudaError_t cudaStreamIsCapturing(cudaStream_t stream,
                                          enum cudaStreamCaptureStatus *pCaptureStatus)
{
    if (pCaptureStatus == NULL)
        return ret(cudaErrorInvalidValue);
    if (stream_get(stream) == NULL)
        return ret(cudaErrorInvalidResourceHandle);
    *pCaptureStatus = cudaStreamCaptureStatusNone;
    return cudaSuccess;
}

SIM_API cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *mode)
{
    if (mode == NULL)
        return ret(cudaErrorInvalidValue);
    enum cudaStreamCaptureMode old = t_capture_mode;
    t_capture_mode = *mode;
    *mode = old;
    return cudaSuccess;
}

SIM_API cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void *userData)
{
    sim_mark_context();
    STICKY_RETURN();
    if (fn == NULL)
        return ret(cudaErrorInvalidValue);
    return ret(sim_stream_enqueue(stream, fn, userData));
}

/* -------------------------------------------------------------- events */
static struct sim_event *event_get(cudaEvent_t h)
{
    struct sim_event *e = (struct sim_event *)h;
    return e != NULL && e->magic == EVENT_MAGIC ? e : NULL;
}

static void event_unref_locked(struct sim_event *e)
{
    if (--e->refs == 0) {
        e->magic = 0;
        free(e);
    }
}

SIM_API cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags)
{
    sim_mark_context();
    if (event == NULL || (flags & ~7u) != 0)
        return ret(cudaErrorInvalidValue);
    if ((flags & cudaEventInterprocess) && !(flags & cudaEventDisableTiming))
        return ret(cudaErrorInvalidValue);
    struct sim_event *e = calloc(1, sizeof *e);
    if (e == NULL)
        return ret(cudaErrorMemoryAllocation);
    e->magic = EVENT_MAGIC;
    e->flags = flags;
    e->refs = 1;
    *event = (cudaEvent_t)e;
    return cudaSuccess;
}

/* Pending markers keep the memory; the handle is dead at once. */
SIM_API cudaError_t cudaEventDestroy(cudaEvent_t event)
{
    sim_mark_context();
    pthread_mutex_lock(&ev_mu);
    struct sim_event *e = event_get(event);
    if (e == NULL) {
        pthread_mutex_unlock(&ev_mu);
        return ret(cudaErrorInvalidResourceHandle);
    }
    e->magic = EVENT_MAGIC ^ 1u; /* no longer usable, maybe not yet freed */
    event_unref_locked(e);
    pthread_mutex_unlock(&ev_mu);
    return cudaSuccess;
}

struct ev_mark {
    struct sim_event *e;
    uint64_t ticket;
};

static void marker_run(void *p)
{
    struct ev_mark *m = p;
    pthread_mutex_lock(&ev_mu);
    if (m->e->completed < m->ticket) {
        m->e->completed = m->ticket;
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        m->e->completed_ns = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
    }
    pthread_cond_broadcast(&ev_cv);
    event_unref_locked(m->e);
    pthread_mutex_unlock(&ev_mu);
    free(m);
}

static void waiter_run(void *p)
{
    struct ev_mark *m = p;
    pthread_mutex_lock(&ev_mu);
    while (m->e->completed < m->ticket)
        pthread_cond_wait(&ev_cv, &ev_mu);
    event_unref_locked(m->e);
    pthread_mutex_unlock(&ev_mu);
    free(m);
}

SIM_API cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    sim_mark_context();
    STICKY_RETURN();
    struct ev_mark *m = malloc(sizeof *m);
    if (m == NULL)
        return ret(cudaErrorMemoryAllocation);
    pthread_mutex_lock(&ev_mu);
    struct sim_event *e = event_get(event);
    if (e == NULL || !sim_stream_valid(stream)) {
        pthread_mutex_unlock(&ev_mu);
        free(m);
        return ret(cudaErrorInvalidResourceHandle);
    }
    m->e = e;
    m->ticket = ++e->recorded;
    e->refs++;
    /* Enqueued under ev_mu: two records of one event reach their streams in order. */
    cudaError_t rc = sim_stream_enqueue(stream, marker_run, m);
    if (rc != cudaSuccess) {
        e->recorded--;
        e->refs--;
        free(m);
    }
    pthread_mutex_unlock(&ev_mu);
    return ret(rc);
}

SIM_API cudaError_t cudaEventQuery(cudaEvent_t event)
{
    sim_mark_context();
    STICKY_RETURN();
    pthread_mutex_lock(&ev_mu);
    struct sim_event *e = event_get(event);
    cudaError_t rc = e == NULL                     ? cudaErrorInvalidResourceHandle
                     : e->completed >= e->recorded ? cudaSuccess
                                                   : cudaErrorNotReady;
    pthread_mutex_unlock(&ev_mu);
    /* cudaErrorNotReady is not an error: it does not stick. */
    return rc == cudaErrorNotReady ? rc : ret(rc);
}

/* As CUDA's: both events recorded and done, neither made without timing. */
SIM_API cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end)
{
    sim_mark_context();
    STICKY_RETURN();
    if (ms == NULL)
        return ret(cudaErrorInvalidValue);
    pthread_mutex_lock(&ev_mu);
    struct sim_event *a = event_get(start), *b = event_get(end);
    cudaError_t rc = cudaSuccess;
    if (a == NULL || b == NULL || (a->flags & cudaEventDisableTiming) ||
        (b->flags & cudaEventDisableTiming) || a->recorded == 0 || b->recorded == 0)
        rc = cudaErrorInvalidResourceHandle;
    else if (a->completed < a->recorded || b->completed < b->recorded)
        rc = cudaErrorNotReady;
    else
        *ms = (float)((double)((int64_t)(b->completed_ns - a->completed_ns)) / 1e6);
    pthread_mutex_unlock(&ev_mu);
    return rc == cudaErrorNotReady ? rc : ret(rc);
}

SIM_API cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
    sim_mark_context();
    STICKY_RETURN();
    pthread_mutex_lock(&ev_mu);
    struct sim_event *e = event_get(event);
    if (e == NULL) {
        pthread_mutex_unlock(&ev_mu);
        return ret(cudaErrorInvalidResourceHandle);
    }
    uint64_t target = e->recorded;
    e->refs++;
    while (e->completed < target)
        pthread_cond_wait(&ev_cv, &ev_mu);
    event_unref_locked(e);
    pthread_mutex_unlock(&ev_mu);
    return cudaSuccess;
}

SIM_API cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags)
{
    sim_mark_context();
    STICKY_RETURN();
    if ((flags & ~(unsigned)cudaEventWaitExternal) != 0)
        return ret(cudaErrorInvalidValue);
    struct ev_mark *m = malloc(sizeof *m);
    if (m == NULL)
        return ret(cudaErrorMemoryAllocation);
    pthread_mutex_lock(&ev_mu);
    struct sim_event *e = event_get(event);
    cudaError_t rc = cudaSuccess;
    if (e == NULL || !sim_stream_valid(stream)) {
        rc = cudaErrorInvalidResourceHandle;
    } else if (e->completed < e->recorded) {
        m->e = e;
        m->ticket = e->recorded;
        e->refs++;
        rc = sim_stream_enqueue(stream, waiter_run, m);
        if (rc == cudaSuccess)
            m = NULL;
        else
            e->refs--;
    }
    pthread_mutex_unlock(&ev_mu);
    free(m);
    return ret(rc);
}

/* -------------------------------------------------------------- memory */
SIM_API cudaError_t cudaMalloc(void **devPtr, size_t size)
{
    sim_mark_context();
    STICKY_RETURN();
    if (devPtr == NULL)
        return ret(cudaErrorInvalidValue);
    *devPtr = NULL;
    if (size == 0)
        return cudaSuccess;
    size_t rounded = (size + 255) & ~(size_t)255;
    struct sim_alloc *a = malloc(sizeof *a);
    if (a == NULL || rounded < size || posix_memalign(devPtr, 256, rounded) != 0) {
        free(a);
        *devPtr = NULL;
        return ret(cudaErrorMemoryAllocation);
    }
    a->base = *devPtr;
    a->size = size;
    a->device = t_device;
    pthread_mutex_lock(&alloc_mu);
    a->next = allocs;
    allocs = a;
    pthread_mutex_unlock(&alloc_mu);
    return cudaSuccess;
}

/* cudaFree and cudaFreeHost wait for the device first, as CUDA's do. */
SIM_API cudaError_t cudaFree(void *devPtr)
{
    sim_mark_context();
    if (devPtr == NULL)
        return cudaSuccess;
    drain_device(); /* a fault does not free memory a kernel still uses */
    struct sim_alloc *gone = NULL;
    pthread_mutex_lock(&alloc_mu);
    for (struct sim_alloc **pp = &allocs; *pp != NULL; pp = &(*pp)->next)
        if ((*pp)->base == devPtr) {
            gone = *pp;
            *pp = gone->next;
            break;
        }
    pthread_mutex_unlock(&alloc_mu);
    if (gone == NULL)
        return ret(cudaErrorInvalidValue);
    free(gone);
    free(devPtr);
    /* After a fault the memory is released, but the call reports the fault. */
    return ret(sim_sticky());
}

SIM_API cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags)
{
    sim_mark_context();
    STICKY_RETURN();
    (void)flags;
    return cudaMalloc(pHost, size);
}

SIM_API cudaError_t cudaFreeHost(void *ptr)
{
    sim_mark_context();
    return cudaFree(ptr);
}

static int bad_copy(const void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
    if ((int)kind < (int)cudaMemcpyHostToHost || (int)kind > (int)cudaMemcpyDefault)
        return cudaErrorInvalidMemcpyDirection;
    return count > 0 && (dst == NULL || src == NULL) ? cudaErrorInvalidValue : cudaSuccess;
}

SIM_API cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
    sim_mark_context();
    STICKY_RETURN();
    cudaError_t rc = (cudaError_t)bad_copy(dst, src, count, kind);
    if (rc != cudaSuccess)
        return ret(rc);
    struct sim_stream *s = stream_get(NULL);
    if (s == NULL)
        return ret(cudaErrorMemoryAllocation);
    stream_drain(s);
    if (count > 0)
        memmove(dst, src, count);
    return cudaSuccess;
}

struct mem_op {
    void *dst;
    const void *src; /* NULL: memset to value */
    int value;
    size_t count;
};

static void mem_run(void *p)
{
    struct mem_op *m = p;
    if (m->count > 0) {
        if (m->src != NULL)
            memmove(m->dst, m->src, m->count);
        else
            memset(m->dst, m->value, m->count);
    }
    free(m);
}

static cudaError_t mem_enqueue(void *dst, const void *src, int value, size_t count,
                               cudaStream_t stream)
{
    struct mem_op *m = malloc(sizeof *m);
    if (m == NULL)
        return ret(cudaErrorMemoryAllocation);
    *m = (struct mem_op){dst, src, value, count};
    cudaError_t rc = sim_stream_enqueue(stream, mem_run, m);
    if (rc != cudaSuccess)
        free(m);
    return ret(rc);
}

SIM_API cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count,
                                    enum cudaMemcpyKind kind, cudaStream_t stream)
{
    sim_mark_context();
    STICKY_RETURN();
    cudaError_t rc = (cudaError_t)bad_copy(dst, src, count, kind);
    if (rc != cudaSuccess)
        return ret(rc);
    return mem_enqueue(dst, src == NULL ? dst : src, 0, count, stream);
}

SIM_API cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream)
{
    sim_mark_context();
    STICKY_RETURN();
    if (count > 0 && devPtr == NULL)
        return ret(cudaErrorInvalidValue);
    return mem_enqueue(devPtr, NULL, value, count, stream);
}
