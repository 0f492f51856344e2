/* A test-only backend that behaves as a device backend does: `submit` runs
 * on the caller's thread and hands the op to a "stream", a thread of its own
 * that executes ops in order, and completion is seen by the engine's
 * completion poller, never by a socket. One rank; all_reduce copies send to
 * recv. It exists to prove the backend contract (test_backend_contract). */
#ifndef C10D_TEST_STREAM_BACKEND_H
#define C10D_TEST_STREAM_BACKEND_H

#include "backends/backend.h"

#include <pthread.h>
#include <stdint.h>

extern const struct c10d__backend_vtable stream_backend;

#define STREAM_LOG_MAX 4096

/* What the backend saw, for the tests to check (guarded by `mutex`). */
struct stream_record {
    pthread_mutex_t mutex;
    uint64_t enqueued_seq[STREAM_LOG_MAX]; /* in enqueue order */
    int enqueued_on_engine_thread;         /* enqueues seen on the engine's thread */
    int n_enqueued;
    int n_split; /* calls of split with a color (a child made from the parent) */
    int n_completed;
    /* Knobs, set before the op or group they affect. */
    int stick_next;     /* the next op never finishes on the stream */
    int abort_block_ms; /* abort's blocking part (offloaded) takes this long */
    int n_aborts, n_destroys;
};

extern struct stream_record stream_rec;

#endif
