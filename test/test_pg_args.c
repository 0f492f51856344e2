/* Process-group argument rules (docs/semantics.md, 2), numbering, poisoning,
 * coalescing, destroy/abort, on one process: a recording backend stands in
 * for a transport, so every rule is checked with its exact message and the
 * sequence numbers the backend sees prove that a rejected call consumed none.
 * The multi-rank half (real tcp backend) is in test_pg_ops / test_pg_faults. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "api/pg.h"
#include "engine/env.h"
#include "engine/loop.h"
#include "engine/work.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

/* ------------------------------------------------------ recording backend */

#define MAX_LOG 256

struct rec {
    enum c10d__op_kind kind;
    uint64_t seq;
    size_t count;
    int nlist; /* ops in the unit */
    size_t send_counts0;
};

static struct {
    uv_mutex_t mutex;
    struct rec log[MAX_LOG];
    int n;
    int hold;      /* 1: keep ops pending (timeouts, destroy, abort) */
    int fail_next; /* a status to fail the next op with */
    c10d_work *held[MAX_LOG];
    int nheld;
    int aborts, destroys;
    int abort_status;
} fake;

static int fake_check(const struct c10d__op *op)
{
    (void)op;
    return 0;
}

static int fake_create(const struct c10d__backend_config *cfg, void (*done)(void *, int), void *arg,
                       void **state)
{
    (void)cfg;
    *state = &fake;
    done(arg, 0);
    return 0;
}

/* Completes on the caller's thread: the contract allows any thread. */
static int fake_submit(void *state, struct c10d__op *op)
{
    (void)state;
    uv_mutex_lock(&fake.mutex);
    int n = 0;
    for (struct c10d__op *o = op; o != NULL; o = o->next)
        n++;
    if (fake.n < MAX_LOG)
        fake.log[fake.n++] = (struct rec){op->kind, op->seq, op->count, n,
                                          op->send_counts != NULL ? op->send_counts[0] : 0};
    int fail = fake.fail_next;
    fake.fail_next = 0;
    int hold = fake.hold;
    if (hold && fake.nheld < MAX_LOG) {
        c10d_work_retain(op->work);
        fake.held[fake.nheld++] = op->work;
    }
    uv_mutex_unlock(&fake.mutex);
    if (fail)
        c10d__work_complete(op->work, fail, "fake: peer 1 closed the connection");
    else if (!hold)
        c10d__work_complete(op->work, 0, NULL);
    return 0;
}

static void fake_abort(void *state, int status, const char *reason, c10d__backend_done_fn done,
                       void *arg)
{
    (void)state;
    uv_mutex_lock(&fake.mutex);
    fake.aborts++;
    fake.abort_status = status;
    for (int i = 0; i < fake.nheld; i++) {
        c10d__work_complete(fake.held[i], status, "fake aborted: %s", reason);
        c10d_work_release(fake.held[i]);
    }
    fake.nheld = 0;
    uv_mutex_unlock(&fake.mutex);
    if (done != NULL)
        done(arg, 0);
}

static void fake_destroy(void *state, c10d__backend_done_fn done, void *arg)
{
    (void)state;
    fake.destroys++;
    if (done != NULL)
        done(arg, 0);
}

static const struct c10d__backend_vtable fake_backend = {
    .name = "tcp",
    .check = fake_check,
    .create = fake_create,
    .submit = fake_submit,
    .abort = fake_abort,
    .destroy = fake_destroy,
};

static void fake_reset(void)
{
    uv_mutex_lock(&fake.mutex);
    fake.n = 0;
    fake.hold = 0;
    fake.fail_next = 0;
    fake.nheld = 0;
    fake.aborts = fake.destroys = 0;
    uv_mutex_unlock(&fake.mutex);
}

static struct rec last_rec(void)
{
    uv_mutex_lock(&fake.mutex);
    struct rec r = fake.n > 0 ? fake.log[fake.n - 1] : (struct rec){0};
    uv_mutex_unlock(&fake.mutex);
    return r;
}

static int log_len(void)
{
    uv_mutex_lock(&fake.mutex);
    int n = fake.n;
    uv_mutex_unlock(&fake.mutex);
    return n;
}

static c10d_pg *make_pg(int rank, int size, int64_t timeout_ms)
{
    fake_reset();
    c10d_pg *pg = NULL;
    assert_int_equal(c10d__pg_create_with_backend(&fake_backend, NULL, rank, size, timeout_ms, &pg),
                     0);
    return pg;
}

#define EXPECT_ERR(call, status, msg)                                                              \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_ != (status) || strcmp(c10d_last_error(), (msg)) != 0)                              \
            fail_msg("%s\n  got %d \"%s\"\n  want %d \"%s\"", #call, rc_, c10d_last_error(),       \
                     (int)(status), (msg));                                                        \
    } while (0)

/* A valid all_reduce after rejected calls gets the next number. */
static void expect_next_seq(c10d_pg *pg, uint64_t want)
{
    float x[4] = {1, 2, 3, 4};
    c10d_work *w = NULL;
    assert_int_equal(c10d_all_reduce(pg, x, x, 4, C10D_FLOAT32, C10D_SUM, NULL, &w), 0);
    assert_int_equal(c10d_work_wait_release(w), 0);
    struct rec r = last_rec();
    assert_int_equal(r.kind, C10D_OP_ALL_REDUCE);
    assert_int_equal(r.seq, want);
}

/* ----------------------------------------------------------------- tests */

/* Ops submitted while another thread shuts the engine down: every call that
 * returned 0 calls back exactly once, no failed call ever calls back, and the
 * group can still be destroyed promptly (ASan checks nothing leaks). */
struct race_sub {
    c10d_pg *pg;
    atomic_int ok, failed, called;
};

static void race_sub_cb(c10d_work *w, int status, void *arg)
{
    (void)w;
    (void)status;
    atomic_fetch_add(&((struct race_sub *)arg)->called, 1);
}

static void *race_submitter(void *p)
{
    struct race_sub *r = p;
    float x[4] = {1, 2, 3, 4};
    for (int i = 0; i < 20000; i++) {
        c10d_op_opts o = {0};
        o.cb = race_sub_cb;
        o.cb_arg = r;
        if (c10d_all_reduce(r->pg, x, x, 4, C10D_FLOAT32, C10D_SUM, &o, NULL) == 0)
            atomic_fetch_add(&r->ok, 1);
        else if (atomic_fetch_add(&r->failed, 1) > 50)
            break;
    }
    return NULL;
}

static void test_submit_races_shutdown(void **state)
{
    (void)state;
    for (int round = 0; round < 20; round++) {
        struct race_sub r = {.pg = make_pg(0, 1, 5000)};
        pthread_t t;
        pthread_create(&t, NULL, race_submitter, &r);
        usleep((useconds_t)(200 + 150 * round));
        assert_int_equal(c10d_shutdown(), 0);
        pthread_join(t, NULL);
        assert_int_equal(c10d_shutdown(), 0); /* the submitter may have restarted it */
        assert_int_equal(atomic_load(&r.called), atomic_load(&r.ok));
        uint64_t t0 = c10d__now_ms();
        c10d_pg_destroy(r.pg);
        assert_true(c10d__now_ms() - t0 < 4000);
    }
}

static void test_collective_rules(void **state)
{
    (void)state;
    c10d_pg *pg = make_pg(1, 4, 0);
    float buf[4096], out[4 * 1024];
    c10d_work *w = (c10d_work *)0x1;

    expect_next_seq(pg, 1);
    EXPECT_ERR(c10d_broadcast(pg, buf, buf, 16, C10D_FLOAT32, 4, NULL, &w), C10D_EINVAL,
               "tcp broadcast: invalid root rank 4 (group size 4)");
    assert_null(w);
    EXPECT_ERR(c10d_broadcast(pg, buf, buf, 16, C10D_FLOAT32, -1, NULL, NULL), C10D_EINVAL,
               "tcp broadcast: invalid root rank -1 (group size 4)");
    EXPECT_ERR(c10d_broadcast(pg, buf, NULL, 16, C10D_FLOAT32, 0, NULL, NULL), C10D_EINVAL,
               "tcp broadcast: recv buffer is NULL (expected 16 elements)");
    EXPECT_ERR(c10d_all_reduce(pg, buf, buf, 16, (c10d_dtype)42, C10D_SUM, NULL, NULL), C10D_EINVAL,
               "tcp all_reduce: invalid dtype 42");
    EXPECT_ERR(c10d_all_reduce(pg, buf, buf, 16, C10D_FLOAT32, (c10d_reduce_op)17, NULL, NULL),
               C10D_EINVAL, "tcp all_reduce: invalid reduce op 17");
    EXPECT_ERR(c10d_all_reduce(pg, buf, buf, 16, C10D_FLOAT32, C10D_BAND, NULL, NULL), C10D_EINVAL,
               "tcp all_reduce: Cannot use ReduceOp.BAND with non-integral dtype float32");
    EXPECT_ERR(c10d_all_reduce(pg, NULL, NULL, 16, C10D_FLOAT32, C10D_SUM, NULL, NULL), C10D_EINVAL,
               "tcp all_reduce: send buffer is NULL (expected 16 elements)");
    EXPECT_ERR(c10d_reduce(pg, buf, NULL, 16, C10D_INT32, C10D_MAX, 1, NULL, NULL), C10D_EINVAL,
               "tcp reduce: recv buffer is NULL (expected 16 elements)");
    EXPECT_ERR(c10d_all_reduce(pg, buf, buf, SIZE_MAX / 2, C10D_FLOAT32, C10D_SUM, NULL, NULL),
               C10D_EINVAL, "tcp all_reduce: count 9223372036854775807 is too large");
    c10d_op_opts o = {0};
    o.timeout_ms = -5;
    EXPECT_ERR(c10d_all_reduce(pg, buf, buf, 16, C10D_FLOAT32, C10D_SUM, &o, NULL), C10D_EINVAL,
               "tcp all_reduce: invalid timeout -5 ms (must be >= 0; 0 = the group's)");
    o.timeout_ms = 0;
    o.device_type = C10D_DEVICE_CUDA;
    EXPECT_ERR(c10d_all_reduce(pg, buf, buf, 16, C10D_FLOAT32, C10D_SUM, &o, NULL),
               C10D_EUNSUPPORTED,
               "tcp all_reduce: process group test has no backend for cuda buffers");
    EXPECT_ERR(c10d_gather(pg, buf, out, 16, C10D_FLOAT32, 0, NULL, NULL), C10D_EINVAL,
               "tcp gather: recv must be NULL on a non-root rank (rank 1, root 0)");
    EXPECT_ERR(c10d_gather(pg, buf, NULL, 16, C10D_FLOAT32, 1, NULL, NULL), C10D_EINVAL,
               "tcp gather: recv buffer is NULL (expected 64 elements)");
    EXPECT_ERR(c10d_scatter(pg, buf, out, 16, C10D_FLOAT32, 0, NULL, NULL), C10D_EINVAL,
               "tcp scatter: send must be NULL on a non-root rank (rank 1, root 0)");
    EXPECT_ERR(c10d_all_gather(pg, buf, NULL, 16, C10D_FLOAT32, NULL, NULL), C10D_EINVAL,
               "tcp all_gather: recv buffer is NULL (expected 64 elements)");
    void *recvs[4] = {out, out + 16, NULL, out + 48};
    EXPECT_ERR(c10d_all_gather_list(pg, buf, recvs, 16, C10D_FLOAT32, NULL, NULL), C10D_EINVAL,
               "tcp all_gather: invalid tensor at index 2 of recvs (NULL buffer for 16 elements)");
    EXPECT_ERR(c10d_all_gather_list(pg, buf, NULL, 16, C10D_FLOAT32, NULL, NULL), C10D_EINVAL,
               "tcp all_gather: recvs list is NULL (expected 4 buffers, one per rank)");
    const void *sends[4] = {buf, NULL, buf, buf};
    const void *sends4[4] = {buf, buf, buf, buf};
    EXPECT_ERR(
        c10d_reduce_scatter_list(pg, sends, out, 16, C10D_FLOAT32, C10D_SUM, NULL, NULL),
        C10D_EINVAL,
        "tcp reduce_scatter: invalid tensor at index 1 of sends (NULL buffer for 16 elements)");
    EXPECT_ERR(
        c10d_all_to_all_single(pg, buf, out, 10, NULL, NULL, C10D_FLOAT32, NULL, NULL), C10D_EINVAL,
        "tcp all_to_all: count 10 is not divisible by the group size 4 (pass split sizes for "
        "an uneven split)");
    size_t sc[4] = {1, 2, 3, 5}, rc4[4] = {4, 4, 4, 4};
    EXPECT_ERR(c10d_all_to_all_single(pg, buf, out, 10, sc, rc4, C10D_FLOAT32, NULL, NULL),
               C10D_EINVAL, "tcp all_to_all: send split sizes sum to 11 (expected count 10)");
    EXPECT_ERR(c10d_all_to_all(pg, sends, NULL, recvs, rc4, C10D_FLOAT32, NULL, NULL), C10D_EINVAL,
               "tcp all_to_all: the list form needs send_counts and recv_counts");
    /* Elements that fit a size_t but whose bytes do not: refused at the call,
     * not failed (with the group) while running. */
    size_t huge[4] = {((size_t)1 << 62) + 1, 1, 0, 0}, ten[4] = {4, 2, 2, 2};
    EXPECT_ERR(c10d_all_to_all_single(pg, buf, out, 10, ten, huge, C10D_FLOAT32, NULL, NULL),
               C10D_EINVAL,
               "tcp all_to_all: recv split sizes sum to 4611686018427387906 elements: too large");
    void *recvs4[4] = {out, out, out, out};
    EXPECT_ERR(c10d_all_to_all(pg, sends4, ten, recvs4, huge, C10D_FLOAT32, NULL, NULL),
               C10D_EINVAL,
               "tcp all_to_all: count 4611686018427387905 at index 0 of recvs is too large");
    o = (c10d_op_opts){0};
    o.premul_factor = 1.0 / 0.0;
    EXPECT_ERR(c10d_all_reduce(pg, buf, buf, 16, C10D_FLOAT32, C10D_PREMUL_SUM, &o, NULL),
               C10D_EINVAL, "tcp all_reduce: PREMUL_SUM factor must be finite (got inf)");
    EXPECT_ERR(c10d_all_reduce_sync(pg, buf, buf, 16, C10D_FLOAT32, C10D_PREMUL_SUM), C10D_EINVAL,
               "c10d_all_reduce_sync: C10D_PREMUL_SUM needs a factor (c10d_op_opts.premul_factor); "
               "use c10d_all_reduce");
    EXPECT_ERR(c10d_all_reduce(NULL, buf, buf, 16, C10D_FLOAT32, C10D_SUM, NULL, NULL), C10D_EINVAL,
               "c10d all_reduce: pg is NULL");
    /* Not one of these consumed a number. */
    expect_next_seq(pg, 2);

    /* The valid forms: empty buffers may be NULL, uneven splits, lists. */
    assert_int_equal(c10d_all_reduce(pg, NULL, NULL, 0, C10D_FLOAT32, C10D_SUM, NULL, &w), 0);
    assert_int_equal(c10d_work_wait_release(w), 0);
    size_t sc2[4] = {1, 2, 3, 4};
    assert_int_equal(c10d_all_to_all_single(pg, buf, out, 10, sc2, rc4, C10D_FLOAT32, NULL, &w), 0);
    sc2[0] = 99; /* the caller's array may change once the call returned */
    assert_int_equal(c10d_work_wait_release(w), 0);
    assert_int_equal(last_rec().send_counts0, 1);
    assert_int_equal(last_rec().seq, 4);
    c10d_pg_destroy(pg);
}

static void test_p2p_rules(void **state)
{
    (void)state;
    c10d_pg *pg = make_pg(1, 3, 0);
    int x[8] = {0};
    c10d_work *w;
    EXPECT_ERR(c10d_send(pg, x, 8, C10D_INT32, 3, 0, NULL, NULL), C10D_EINVAL,
               "tcp send: invalid peer rank 3 (group size 3)");
    EXPECT_ERR(c10d_send(pg, x, 8, C10D_INT32, 1, 0, NULL, NULL), C10D_EINVAL,
               "tcp send: Invalid destination rank: destination rank should not be the same as "
               "the rank of the current process (rank 1; c10d_batch_isend_irecv takes it)");
    EXPECT_ERR(c10d_recv(pg, x, 8, C10D_INT32, 1, 0, NULL, NULL), C10D_EINVAL,
               "tcp recv: Invalid source rank: source rank should not be the same as the rank "
               "of the current process (rank 1; c10d_batch_isend_irecv takes it)");
    EXPECT_ERR(c10d_recv(pg, x, 8, C10D_INT32, 0, -1, NULL, NULL), C10D_EINVAL,
               "tcp recv: invalid tag -1 (tags must be >= 0)");
    EXPECT_ERR(c10d_send(pg, x, 8, C10D_INT32, C10D_ANY_SOURCE, 0, NULL, NULL), C10D_EINVAL,
               "tcp send: invalid peer rank -1 (group size 3)");
    EXPECT_ERR(c10d_recv(pg, NULL, 8, C10D_INT32, 0, 0, NULL, NULL), C10D_EINVAL,
               "tcp recv: recv buffer is NULL (expected 8 elements)");
    EXPECT_ERR(c10d_send(pg, x, 8, C10D_INT32, 0, C10D__TAG_RESERVED, NULL, NULL), C10D_EINVAL,
               "tcp send: tag 2147418112 is reserved for the library (tags must be < 2147418112)");
    /* P2P and collectives count separately. */
    assert_int_equal(c10d_send(pg, x, 8, C10D_INT32, 0, 7, NULL, &w), 0);
    assert_int_equal(c10d_work_wait_release(w), 0);
    assert_int_equal(last_rec().seq, 1);
    assert_int_equal(c10d_recv(pg, x, 8, C10D_INT32, C10D_ANY_SOURCE, 7, NULL, &w), 0);
    assert_int_equal(c10d_work_wait_release(w), 0);
    assert_int_equal(last_rec().seq, 2);
    expect_next_seq(pg, 1);

    c10d_p2p_op ops[3] = {
        {C10D_P2P_SEND, x, 8, C10D_INT32, 0, 1},
        {C10D_P2P_RECV, x, 8, C10D_INT32, 2, 1},
        {C10D_P2P_RECV, x, 8, C10D_INT32, 3, 1},
    };
    EXPECT_ERR(c10d_batch_isend_irecv(pg, ops, 3, NULL, NULL), C10D_EINVAL,
               "tcp batch_isend_irecv (op 2, recv): invalid peer rank 3 (group size 3)");
    EXPECT_ERR(c10d_batch_isend_irecv(pg, ops, 0, NULL, NULL), C10D_EINVAL,
               "tcp batch_isend_irecv: empty list of ops (ops given, nops 0)");
    /* A member past the ninth is named with its whole index. */
    c10d_p2p_op many[12];
    for (int i = 0; i < 12; i++)
        many[i] = ops[0];
    many[11].tag = -1;
    EXPECT_ERR(c10d_batch_isend_irecv(pg, many, 12, NULL, NULL), C10D_EINVAL,
               "tcp batch_isend_irecv (op 11, send): invalid tag -1 (tags must be >= 0)");
    assert_int_equal(c10d_batch_isend_irecv(pg, ops, 2, NULL, &w), 0);
    assert_int_equal(c10d_work_wait_release(w), 0);
    assert_int_equal(last_rec().nlist, 2);
    assert_int_equal(last_rec().seq, 3); /* one number for the batch */
    c10d_pg_destroy(pg);
}

static void test_coalescing(void **state)
{
    (void)state;
    c10d_pg *pg = make_pg(0, 2, 0);
    float a[8], b[8];
    c10d_work *w = (c10d_work *)0x1;
    assert_int_equal(c10d_coalesce_begin(pg), 0);
    EXPECT_ERR(c10d_coalesce_begin(pg), C10D_EINVAL,
               "tcp coalesce_begin: already coalescing (nested begin)");
    assert_int_equal(c10d_all_reduce(pg, a, a, 8, C10D_FLOAT32, C10D_SUM, NULL, &w), 0);
    assert_null(w);
    assert_int_equal(c10d_all_reduce(pg, b, b, 8, C10D_FLOAT32, C10D_MAX, NULL, NULL), 0);
    EXPECT_ERR(c10d_send(pg, a, 8, C10D_FLOAT32, 1, 0, NULL, NULL), C10D_EINVAL,
               "tcp send: cannot be coalesced (between c10d_coalesce_begin and c10d_coalesce_end "
               "only collectives; use c10d_batch_isend_irecv for P2P)");
    assert_int_equal(log_len(), 0); /* nothing runs before end */
    assert_int_equal(c10d_coalesce_end(pg, NULL, &w), 0);
    assert_int_equal(c10d_work_wait_release(w), 0);
    assert_int_equal(last_rec().nlist, 2);
    assert_int_equal(last_rec().seq, 1);
    EXPECT_ERR(c10d_coalesce_end(pg, NULL, &w), C10D_EINVAL,
               "tcp coalesce_end: no c10d_coalesce_begin before it");
    /* An empty group completes and consumes nothing. */
    assert_int_equal(c10d_coalesce_begin(pg), 0);
    assert_int_equal(c10d_coalesce_end(pg, NULL, &w), 0);
    assert_int_equal(c10d_work_wait_release(w), 0);
    expect_next_seq(pg, 2);
    c10d_pg_destroy(pg);
}

struct cb_state {
    uv_mutex_t mutex;
    int calls;
    int status;
    int on_loop;
};

static void count_cb(c10d_work *w, int status, void *arg)
{
    (void)w;
    struct cb_state *s = arg;
    uv_mutex_lock(&s->mutex);
    s->calls++;
    s->status = status;
    s->on_loop = c10d_on_loop_thread();
    uv_mutex_unlock(&s->mutex);
}

static void test_callbacks_and_poison(void **state)
{
    (void)state;
    c10d_pg *pg = make_pg(0, 2, 0);
    struct cb_state cs = {0};
    uv_mutex_init(&cs.mutex);
    float a[8];
    c10d_op_opts o = {0};
    o.cb = count_cb;
    o.cb_arg = &cs;
    c10d_work *w;
    /* A rejected call never calls back. */
    assert_int_equal(c10d_broadcast(pg, a, a, 8, C10D_FLOAT32, 9, &o, &w), C10D_EINVAL);
    uv_mutex_lock(&fake.mutex);
    fake.fail_next = C10D_ECLOSED;
    uv_mutex_unlock(&fake.mutex);
    assert_int_equal(c10d_all_reduce(pg, a, a, 8, C10D_FLOAT32, C10D_SUM, &o, &w), 0);
    assert_int_equal(c10d_work_wait(w, 10000), C10D_ECLOSED);
    c10d_work_release(w);
    /* The callback runs on the loop thread, once, after the group's own. */
    for (int i = 0; i < 1000; i++) {
        uv_mutex_lock(&cs.mutex);
        int n = cs.calls;
        uv_mutex_unlock(&cs.mutex);
        if (n > 0)
            break;
        uv_sleep(5);
    }
    uv_sleep(20);
    assert_int_equal(cs.calls, 1);
    assert_int_equal(cs.status, C10D_ECLOSED);
    assert_true(cs.on_loop);
    /* Poisoned: later ops fail at once with the first error. */
    EXPECT_ERR(c10d_all_reduce(pg, a, a, 8, C10D_FLOAT32, C10D_SUM, NULL, &w), C10D_EREVOKED,
               "tcp all_reduce: process group test failed earlier: fake: peer 1 closed the "
               "connection");
    /* The cause, with its own status. */
    assert_int_equal(c10d_pg_error(pg), C10D_ECLOSED);
    assert_non_null(strstr(c10d_last_error(), "fake: peer 1 closed the connection"));
    assert_true(fake.aborts >= 1);
    c10d_pg_destroy(pg);
    uv_mutex_destroy(&cs.mutex);
}

static void test_timeout_message(void **state)
{
    (void)state;
    c10d_pg *pg = make_pg(0, 2, 0);
    uv_mutex_lock(&fake.mutex);
    fake.hold = 1;
    uv_mutex_unlock(&fake.mutex);
    float a[8];
    c10d_op_opts o = {0};
    o.timeout_ms = 100;
    c10d_work *w;
    assert_int_equal(c10d_all_reduce(pg, a, a, 8, C10D_FLOAT32, C10D_SUM, &o, &w), 0);
    assert_int_equal(c10d_work_wait(w, 20000), C10D_ETIMEDOUT);
    const char *m = c10d_work_message(w);
    /* torch's watchdog text, exactly, after the group's prefix. */
    assert_non_null(strstr(m, "[PG test (test) Rank 0] Watchdog caught collective operation "
                              "timeout: Work(SeqNum=1, OpType=ALLREDUCE, NumelIn=8, NumelOut=8, "
                              "Timeout(ms)=100) ran for "));
    assert_non_null(strstr(m, " milliseconds before timing out."));
    c10d_work_release(w);
    /* The timeout aborted the backend: its other pending ops were dropped. */
    for (int i = 0;
         i < 1000 && c10d_all_reduce(pg, a, a, 8, C10D_FLOAT32, C10D_SUM, NULL, NULL) == 0; i++)
        uv_sleep(5);
    assert_int_equal(c10d_all_reduce(pg, a, a, 8, C10D_FLOAT32, C10D_SUM, NULL, NULL),
                     C10D_EREVOKED);
    assert_int_equal(c10d_pg_error(pg), C10D_ETIMEDOUT);
    /* A timeout blames no rank: none is known to have died. */
    assert_int_equal(c10d_pg_failed_ranks(pg, NULL, 0), 0);
    int aborts = 0;
    for (int i = 0; i < 1000 && aborts == 0; i++) {
        uv_mutex_lock(&fake.mutex);
        aborts = fake.aborts;
        uv_mutex_unlock(&fake.mutex);
        if (aborts == 0)
            uv_sleep(5);
    }
    assert_true(aborts >= 1);
    c10d_pg_destroy(pg);
}

static void test_destroy_and_abort_bounded(void **state)
{
    (void)state;
    /* destroy with an op that never completes: bounded by the group timeout. */
    c10d_pg *pg = make_pg(0, 2, 300);
    uv_mutex_lock(&fake.mutex);
    fake.hold = 1;
    uv_mutex_unlock(&fake.mutex);
    float a[8];
    c10d_op_opts o = {0};
    o.timeout_ms = 60000;
    c10d_work *w;
    assert_int_equal(c10d_all_reduce(pg, a, a, 8, C10D_FLOAT32, C10D_SUM, &o, &w), 0);
    assert_int_equal(c10d_pg_destroy(pg), 0);
    assert_int_equal(c10d_work_wait(w, 10000), C10D_EABORTED);
    c10d_work_release(w);
    assert_int_equal(fake.destroys, 1);

    /* abort: immediate, pending works fail with C10D_EABORTED. */
    pg = make_pg(0, 2, 0);
    uv_mutex_lock(&fake.mutex);
    fake.hold = 1;
    uv_mutex_unlock(&fake.mutex);
    assert_int_equal(c10d_all_reduce(pg, a, a, 8, C10D_FLOAT32, C10D_SUM, &o, &w), 0);
    assert_int_equal(c10d_pg_abort(pg, "test says so"), 0);
    assert_int_equal(c10d_work_wait(w, 10000), C10D_EABORTED);
    assert_non_null(strstr(c10d_work_message(w), "test says so"));
    c10d_work_release(w);
    assert_int_equal(fake.destroys, 1);

    /* abort of an idle group, and of one coalescing. */
    pg = make_pg(0, 2, 0);
    assert_int_equal(c10d_coalesce_begin(pg), 0);
    assert_int_equal(c10d_all_reduce(pg, a, a, 8, C10D_FLOAT32, C10D_SUM, NULL, NULL), 0);
    assert_int_equal(c10d_pg_abort(pg, NULL), 0);
}

static void test_new_group(void **state)
{
    (void)state;
    c10d_pg *world = make_pg(2, 4, 0);
    c10d_pg *g = NULL;
    int bad[] = {0, 4};
    EXPECT_ERR(c10d_pg_new_group(world, bad, 2, NULL, &g), C10D_EINVAL,
               "c10d_pg_new_group: rank 4 is out of range (parent group size 4)");
    int dup[] = {1, 1};
    EXPECT_ERR(c10d_pg_new_group(world, dup, 2, NULL, &g), C10D_EINVAL,
               "c10d_pg_new_group: rank 1 appears more than once");
    int members[] = {3, 2}; /* sorted: rank 2 is group rank 0 */
    assert_int_equal(c10d_pg_new_group(world, members, 2, NULL, &g), 0);
    assert_int_equal(c10d_pg_rank(g), 0);
    assert_int_equal(c10d_pg_size(g), 2);
    assert_true(c10d_pg_is_member(g));
    c10d_pg *other = NULL;
    int others[] = {0, 1};
    assert_int_equal(c10d_pg_new_group(world, others, 2, NULL, &other), 0);
    assert_false(c10d_pg_is_member(other));
    assert_int_equal(c10d_pg_rank(other), -1);
    assert_int_equal(c10d_pg_size(other), -1);
    /* A non-member's collective is a no-op that still completes its work. */
    float a[4];
    c10d_work *w;
    int before = log_len();
    assert_int_equal(c10d_all_reduce(other, a, a, 4, C10D_FLOAT32, C10D_SUM, NULL, &w), 0);
    assert_int_equal(c10d_work_wait_release(w), 0);
    assert_int_equal(log_len(), before);
    assert_int_equal(c10d_pg_destroy(other), 0);
    assert_int_equal(c10d_pg_destroy(g), 0);
    assert_int_equal(c10d_pg_destroy(world), 0);
}

static void test_init_rules(void **state)
{
    (void)state;
    c10d_pg *pg = (c10d_pg *)0x1;
    c10d_pg_opts o = {0};
    o.store = (c10d_store *)0x1; /* never touched: the checks come first */
    o.init_method = "env://";
    EXPECT_ERR(c10d_pg_init(&o, &pg), C10D_EINVAL,
               "c10d_pg_init: both a store and an init_method (\"env://\") were given; pass one "
               "of them");
    assert_null(pg);
    o.init_method = NULL;
    EXPECT_ERR(c10d_pg_init(&o, &pg), C10D_EINVAL,
               "c10d_pg_init: world_size must be > 0 with a store (got 0)");
    o.world_size = 2;
    o.rank = 2;
    EXPECT_ERR(c10d_pg_init(&o, &pg), C10D_EINVAL,
               "c10d_pg_init: rank must be in [0, 2) with a store (got 2)");
    o.rank = 0;
    o.backend = "mpi";
    EXPECT_ERR(c10d_pg_init(&o, &pg), C10D_EINVAL,
               "unknown backend \"mpi\" (expected tcp, nccl or \"cpu:tcp,cuda:nccl\")");
    o.backend = "cpu:tcp,cpu:tcp";
    EXPECT_ERR(c10d_pg_init(&o, &pg), C10D_EINVAL,
               "backend config \"cpu:tcp,cpu:tcp\": device \"cpu\" appears twice");
    o.backend = "cpu=tcp";
    assert_int_equal(c10d_pg_init(&o, &pg), C10D_EINVAL);
    o.backend = "cpu:tcp,";
    EXPECT_ERR(c10d_pg_init(&o, &pg), C10D_EINVAL,
               "malformed backend config \"cpu:tcp,\": trailing comma");
    o.backend = "tpu:tcp";
    EXPECT_ERR(c10d_pg_init(&o, &pg), C10D_EINVAL,
               "backend config \"tpu:tcp\": unknown device \"tpu\"");
    /* A debug level torch does not know stops it from starting; so here. */
    o.backend = NULL;
    setenv("C10D_DEBUG", "banana", 1);
    c10d__env_reload();
    EXPECT_ERR(c10d_pg_init(&o, &pg), C10D_EINVAL,
               "c10d_pg_init: the value of C10D_DEBUG (or TORCH_DISTRIBUTED_DEBUG) must be OFF, "
               "INFO, or DETAIL (got 'banana')");
    unsetenv("C10D_DEBUG");
    c10d__env_reload();
}

/* Options carry their size: an older caller's shorter struct is read only as
 * far as it goes, a newer caller's unknown fields must be zero. */
/* Backend config strings as torch's BackendConfig reads them. */
static void test_backend_config_strings(void **state)
{
    (void)state;
    const struct c10d__backend_vtable *vts[C10D__DEVICE_TYPES];
    static const char *const host_only[] = {"gloo",      "GLOO",      "Tcp", "cpu:Gloo",
                                            "undefined", "UNDEFINED", ""};
    for (size_t i = 0; i < sizeof host_only / sizeof *host_only; i++) {
        assert_int_equal(c10d__backend_parse(host_only[i], vts), 0);
        assert_ptr_equal(vts[0], &c10d__tcp_backend);
        assert_null(vts[1]);
    }
    assert_int_equal(c10d__backend_parse(NULL, vts), 0);
    assert_ptr_equal(vts[0], &c10d__tcp_backend);
    assert_int_equal(c10d__backend_parse("cpu:gloo:x", vts), C10D_EINVAL);
    assert_int_equal(c10d__backend_parse("MPI", vts), C10D_EINVAL);
    assert_non_null(strstr(c10d_last_error(), "unknown backend \"mpi\""));
    assert_int_equal(c10d__backend_parse("CPU:tcp,cpu:TCP", vts), C10D_EINVAL);
    assert_non_null(strstr(c10d_last_error(), "appears twice"));
}

static void test_opts_struct_size(void **state)
{
    (void)state;
    c10d_pg *pg = make_pg(0, 1, 0);
    float x[4] = {1, 2, 3, 4};
    c10d_work *w = NULL;
    /* Knows only timeout_ms: the garbage callback after it is never read. */
    c10d_op_opts old = C10D_OP_OPTS_INIT;
    old.struct_size = offsetof(c10d_op_opts, cb);
    old.timeout_ms = 5000;
    old.cb = (c10d_work_cb)(uintptr_t)0x1;
    assert_int_equal(c10d_all_reduce(pg, x, x, 4, C10D_FLOAT32, C10D_SUM, &old, &w), 0);
    assert_int_equal(c10d_work_wait_release(w), 0);
    /* A newer header's struct: zero extra fields are fine, a set one is not. */
    struct {
        c10d_op_opts o;
        uint64_t extra;
    } newer;
    memset(&newer, 0, sizeof newer);
    newer.o.struct_size = sizeof newer;
    assert_int_equal(c10d_all_reduce(pg, x, x, 4, C10D_FLOAT32, C10D_SUM, &newer.o, &w), 0);
    assert_int_equal(c10d_work_wait_release(w), 0);
    newer.extra = 7;
    assert_int_equal(c10d_all_reduce(pg, x, x, 4, C10D_FLOAT32, C10D_SUM, &newer.o, &w),
                     C10D_EINVAL);
    assert_non_null(strstr(c10d_last_error(), "tcp all_reduce: the options set a field at byte"));
    c10d_op_opts tiny = C10D_OP_OPTS_INIT;
    tiny.struct_size = 4;
    assert_int_equal(c10d_barrier(pg, &tiny, &w), C10D_EINVAL);
    assert_non_null(strstr(c10d_last_error(), "struct_size 4 is too small"));
    /* 0 reads as the first version, which ends before premul_factor_dev: a
     * value there is never read (all_reduce's own checks included). */
    c10d_op_opts zero = C10D_OP_OPTS_INIT;
    zero.struct_size = 0;
    zero.premul_factor_dev = (const void *)(uintptr_t)0x1;
    assert_int_equal(c10d_all_reduce(pg, x, x, 4, C10D_FLOAT32, C10D_PREMUL_SUM, &zero, &w), 0);
    assert_int_equal(c10d_work_wait_release(w), 0);
    /* Set in a full-size struct with host buffers: refused in the checks' words. */
    c10d_op_opts dev = C10D_OP_OPTS_INIT;
    dev.premul_factor_dev = x;
    assert_int_equal(c10d_all_reduce(pg, x, x, 4, C10D_FLOAT32, C10D_PREMUL_SUM, &dev, &w),
                     C10D_EINVAL);
    assert_non_null(
        strstr(c10d_last_error(), "tcp all_reduce: opts.premul_factor_dev is a device pointer"));
    /* Rejected calls took no sequence number. */
    expect_next_seq(pg, 4);
    c10d_pg_destroy(pg);
}

static void test_monitored_barrier_single(void **state)
{
    (void)state;
    c10d_pg *pg = make_pg(0, 1, 0);
    c10d_work *w;
    EXPECT_ERR(c10d_monitored_barrier(pg, 0, &(c10d_op_opts){.timeout_ms = -1}, &w), C10D_EINVAL,
               "tcp monitored_barrier: invalid timeout -1 ms (must be >= 0; 0 = the group's)");
    assert_int_equal(c10d_monitored_barrier(pg, 1, &(c10d_op_opts){.timeout_ms = 1000}, &w), 0);
    assert_int_equal(c10d_work_wait_release(w), 0);
    expect_next_seq(pg, 2); /* the barrier took number 1 */
    c10d_pg_destroy(pg);
}

int main(void)
{
    uv_mutex_init(&fake.mutex);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_collective_rules),
        cmocka_unit_test(test_p2p_rules),
        cmocka_unit_test(test_coalescing),
        cmocka_unit_test(test_callbacks_and_poison),
        cmocka_unit_test(test_timeout_message),
        cmocka_unit_test(test_destroy_and_abort_bounded),
        cmocka_unit_test(test_new_group),
        cmocka_unit_test(test_submit_races_shutdown),
        cmocka_unit_test(test_init_rules),
        cmocka_unit_test(test_opts_struct_size),
        cmocka_unit_test(test_backend_config_strings),
        cmocka_unit_test(test_monitored_barrier_single),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    c10d_shutdown();
    return rc;
}
