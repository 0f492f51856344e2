/* The test-only stream backend (stream_backend.h). */
#include "stream_backend.h"

#include "engine/error.h"
#include "engine/loop.h"
#include "engine/offload.h"
#include "engine/poller.h"
#include "engine/work.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct stream_record stream_rec = {.mutex = PTHREAD_MUTEX_INITIALIZER};

struct stream_op {
    struct c10d__poll_item item; /* first: the poller hands it back */
    struct c10d__op *op;
    atomic_int executed;
    int stuck;
    struct stream_op *next_on_stream;
};

struct stream_state {
    pthread_mutex_t mutex; /* the stream's queue and flags */
    pthread_cond_t cond;
    pthread_t thread;
    struct stream_op *head, *tail;
    int quit;
    int poisoned; /* guarded by mutex */
    struct c10d__poll_queue completions;
};

static void *stream_main(void *arg)
{
    struct stream_state *s = arg;
    pthread_mutex_lock(&s->mutex);
    for (;;) {
        while (!s->quit && s->head == NULL)
            pthread_cond_wait(&s->cond, &s->mutex);
        if (s->quit)
            break;
        struct stream_op *so = s->head;
        if (so->stuck) {
            /* A kernel that never ends: the stream is blocked behind it. */
            while (!s->quit)
                pthread_cond_wait(&s->cond, &s->mutex);
            break;
        }
        s->head = so->next_on_stream;
        if (s->head == NULL)
            s->tail = NULL;
        pthread_mutex_unlock(&s->mutex);
        struct c10d__op *op = so->op;
        if (op->kind == C10D_OP_ALL_REDUCE && op->send != op->recv)
            memcpy(op->recv, op->send, op->count * 4);
        atomic_store(&so->executed, 1);
        pthread_mutex_lock(&s->mutex);
    }
    pthread_mutex_unlock(&s->mutex);
    return NULL;
}

static int stream_check(const struct c10d__op *op)
{
    if (op->kind != C10D_OP_ALL_REDUCE && op->kind != C10D_OP_BARRIER)
        return c10d__fail(C10D_EUNSUPPORTED, "stream backend: only all_reduce and barrier");
    return 0;
}

static int stream_create(const struct c10d__backend_config *cfg, c10d__backend_done_fn done,
                         void *arg, void **state)
{
    (void)cfg;
    struct stream_state *s = calloc(1, sizeof *s);
    if (s == NULL)
        return c10d__fail(C10D_ENOMEM, "stream backend: out of memory");
    pthread_mutex_init(&s->mutex, NULL);
    pthread_cond_init(&s->cond, NULL);
    c10d__poll_queue_init(&s->completions);
    if (pthread_create(&s->thread, NULL, stream_main, s) != 0) {
        free(s);
        return c10d__fail(C10D_EIO, "stream backend: cannot start the stream thread");
    }
    *state = s;
    done(arg, 0);
    return 0;
}

/* As a device backend splits its communicator: the child is made from the
 * parent, without the store. */
static int stream_split(void *parent, const struct c10d__backend_config *cfg, int color, int key,
                        c10d__backend_done_fn done, void *arg, void **state)
{
    (void)parent;
    (void)key;
    if (color < 0) {
        *state = NULL;
        done(arg, 0);
        return 0;
    }
    pthread_mutex_lock(&stream_rec.mutex);
    stream_rec.n_split++;
    pthread_mutex_unlock(&stream_rec.mutex);
    return stream_create(cfg, done, arg, state);
}

static int op_ready(struct c10d__poll_item *item)
{
    return atomic_load(&((struct stream_op *)item)->executed);
}

static void op_done(struct c10d__poll_item *item)
{
    struct stream_op *so = (struct stream_op *)item;
    pthread_mutex_lock(&stream_rec.mutex);
    stream_rec.n_completed++;
    pthread_mutex_unlock(&stream_rec.mutex);
    c10d__work_complete(so->op->work, 0, NULL);
    free(so);
}

static int stream_submit(void *state, struct c10d__op *op)
{
    struct stream_state *s = state;
    struct stream_op *so = calloc(1, sizeof *so);
    if (so == NULL)
        return c10d__fail(C10D_ENOMEM, "stream backend: out of memory");
    so->item.ready = op_ready;
    so->item.done = op_done;
    so->op = op;
    pthread_mutex_lock(&stream_rec.mutex);
    if (stream_rec.n_enqueued < STREAM_LOG_MAX)
        stream_rec.enqueued_seq[stream_rec.n_enqueued] = op->seq;
    stream_rec.n_enqueued++;
    if (c10d__engine_own_thread())
        stream_rec.enqueued_on_engine_thread++;
    so->stuck = stream_rec.stick_next;
    stream_rec.stick_next = 0;
    pthread_mutex_unlock(&stream_rec.mutex);
    pthread_mutex_lock(&s->mutex);
    if (s->poisoned) {
        pthread_mutex_unlock(&s->mutex);
        free(so);
        return c10d__fail(C10D_EABORTED, "stream backend: the group was aborted");
    }
    if (s->tail != NULL)
        s->tail->next_on_stream = so;
    else
        s->head = so;
    s->tail = so;
    /* Pushed under the stream's lock, so the poll queue has the stream's order. */
    int rc = c10d__poll_push(&s->completions, &so->item);
    pthread_cond_signal(&s->cond);
    pthread_mutex_unlock(&s->mutex);
    return rc;
}

struct abort_call {
    int block_ms;
    c10d__backend_done_fn done;
    void *arg;
};

static void abort_blocking_part(void *arg)
{
    struct abort_call *ac = arg;
    struct timespec ts = {ac->block_ms / 1000, (long)(ac->block_ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void abort_after(void *arg)
{
    struct abort_call *ac = arg;
    ac->done(ac->arg, 0);
    free(ac);
}

/* Loop thread: fails what is queued, then (when asked to) blocks off the
 * loop as a communicator abort can. */
static void stream_abort(void *state, int status, const char *reason, c10d__backend_done_fn done,
                         void *arg)
{
    struct stream_state *s = state;
    pthread_mutex_lock(&stream_rec.mutex);
    stream_rec.n_aborts++;
    int block_ms = stream_rec.abort_block_ms;
    pthread_mutex_unlock(&stream_rec.mutex);
    pthread_mutex_lock(&s->mutex);
    s->poisoned = 1;
    struct c10d__poll_item *items = c10d__poll_cancel(&s->completions);
    s->quit = 1;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->mutex);
    pthread_join(s->thread, NULL);
    s->head = s->tail = NULL;
    while (items != NULL) {
        struct stream_op *so = (struct stream_op *)items;
        items = items->next;
        c10d__work_complete(so->op->work, status, "stream backend: %s", reason);
        free(so);
    }
    if (done == NULL)
        return;
    struct abort_call *ac = malloc(sizeof *ac);
    if (block_ms <= 0 || ac == NULL) {
        free(ac);
        done(arg, 0);
        return;
    }
    *ac = (struct abort_call){block_ms, done, arg};
    if (c10d__engine_offload(abort_blocking_part, abort_after, ac) != 0) {
        free(ac);
        done(arg, 0);
    }
}

static void stream_destroy(void *state, c10d__backend_done_fn done, void *arg)
{
    struct stream_state *s = state;
    pthread_mutex_lock(&stream_rec.mutex);
    stream_rec.n_destroys++;
    pthread_mutex_unlock(&stream_rec.mutex);
    pthread_mutex_lock(&s->mutex);
    int joined = s->quit;
    s->quit = 1;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->mutex);
    if (!joined)
        pthread_join(s->thread, NULL);
    struct c10d__poll_item *items = c10d__poll_cancel(&s->completions);
    while (items != NULL) {
        struct stream_op *so = (struct stream_op *)items;
        items = items->next;
        c10d__work_complete(so->op->work, C10D_EABORTED, "stream backend: destroyed");
        free(so);
    }
    pthread_cond_destroy(&s->cond);
    pthread_mutex_destroy(&s->mutex);
    free(s);
    if (done != NULL)
        done(arg, 0);
}

const struct c10d__backend_vtable stream_backend = {
    .name = "stream",
    .check = stream_check,
    .create = stream_create,
    .split = stream_split,
    .submit = stream_submit,
    .abort = stream_abort,
    .destroy = stream_destroy,
};
