/* The public store request: c10d_store_submit checks a c10d_store_request on
 * the caller's thread and turns it into an op (and its work) by one table
 * that says which command each public op is and what arguments it carries. */
#include "store.h"

#include "engine/opts.h"
#include "engine/work.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* What a request's fields become in the codec's argument layout. */
enum arg_shape {
    ARGS_NONE,      /* NUM_KEYS, LIST_KEYS, STATS, PING */
    ARGS_KEY,       /* key */
    ARGS_KEY_VALUE, /* key, value */
    ARGS_KEY_CAS,   /* key, expected, desired (value) */
    ARGS_KEYS,      /* keys[0..nkeys) */
    ARGS_PAIRS,     /* key0, value0, key1, value1, ... */
};

static const struct public_op {
    const char *name;
    int cmd;
    enum arg_shape shape;
} public_ops[] = {
    [C10D_STORE_OP_SET] = {"set", C10D_STORE_SET, ARGS_KEY_VALUE},
    [C10D_STORE_OP_GET] = {"get", C10D_STORE_GET, ARGS_KEY},
    [C10D_STORE_OP_ADD] = {"add", C10D_STORE_ADD, ARGS_KEY},
    [C10D_STORE_OP_COMPARE_SET] = {"compare_set", C10D_STORE_COMPARE_SET, ARGS_KEY_CAS},
    [C10D_STORE_OP_WAIT] = {"wait", C10D_STORE_WAIT, ARGS_KEYS},
    [C10D_STORE_OP_CHECK] = {"check", C10D_STORE_CHECK, ARGS_KEYS},
    [C10D_STORE_OP_DELETE_KEY] = {"delete_key", C10D_STORE_DELETE_KEY, ARGS_KEY},
    [C10D_STORE_OP_NUM_KEYS] = {"num_keys", C10D_STORE_GETNUMKEYS, ARGS_NONE},
    [C10D_STORE_OP_APPEND] = {"append", C10D_STORE_APPEND, ARGS_KEY_VALUE},
    [C10D_STORE_OP_MULTI_GET] = {"multi_get", C10D_STORE_MULTI_GET, ARGS_KEYS},
    [C10D_STORE_OP_MULTI_SET] = {"multi_set", C10D_STORE_MULTI_SET, ARGS_PAIRS},
    [C10D_STORE_OP_QUEUE_PUSH] = {"queue_push", C10D_STORE_QUEUE_PUSH, ARGS_KEY_VALUE},
    [C10D_STORE_OP_QUEUE_POP] = {"queue_pop", C10D_STORE_QUEUE_POP, ARGS_KEY},
    [C10D_STORE_OP_QUEUE_LEN] = {"queue_len", C10D_STORE_QUEUE_LEN, ARGS_KEY},
    [C10D_STORE_OP_LIST_KEYS] = {"list_keys", C10D_STORE_LIST_KEYS, ARGS_NONE},
    [C10D_STORE_OP_SERVER_STATS] = {"server_stats", C10D_STORE_STATS, ARGS_NONE},
    [C10D_STORE_OP_PING] = {"ping", C10D_STORE_PING, ARGS_NONE},
};

_Static_assert(sizeof public_ops / sizeof public_ops[0] == C10D_STORE_OP_PING + 1,
               "a public store op without a row");

static struct c10d__wire_str str_of(const void *data, size_t len)
{
    struct c10d__wire_str s = {data, len};
    return s;
}

static int check_value(const void *value, size_t len, const char *what, const char *name)
{
    if (!value && len)
        return c10d__fail(C10D_EINVAL, "store %s: %s is NULL but its length is %zu", what, name,
                          len);
    return 0;
}

/* Fills args (room for 2 * nkeys + 3) from q as `op` lays them out; *nargs. */
static int build_args(const c10d_store_request *q, const struct public_op *op,
                      struct c10d__wire_str *args, size_t *nargs)
{
    const char *what = op->name;
    *nargs = 0;
    if (op->shape == ARGS_NONE)
        return 0;
    if (op->shape == ARGS_KEYS || op->shape == ARGS_PAIRS) {
        if (q->nkeys && !q->keys)
            return c10d__fail(C10D_EINVAL, "store %s: keys is NULL but nkeys is %zu", what,
                              q->nkeys);
        if (op->shape == ARGS_PAIRS && q->nkeys && (!q->values || !q->lens))
            return c10d__fail(C10D_EINVAL, "store %s: values and lens must not be NULL", what);
        for (size_t i = 0; i < q->nkeys; i++) {
            if (!q->keys[i])
                return c10d__fail(C10D_EINVAL, "store %s: key at index %zu is NULL", what, i);
            args[(*nargs)++] = str_of(q->keys[i], strlen(q->keys[i]));
            if (op->shape == ARGS_PAIRS) {
                if (!q->values[i] && q->lens[i])
                    return c10d__fail(C10D_EINVAL, "store %s: value at index %zu is NULL", what, i);
                args[(*nargs)++] = str_of(q->values[i], q->lens[i]);
            }
        }
        return 0;
    }
    if (!q->key)
        return c10d__fail(C10D_EINVAL, "store %s: key is NULL", what);
    args[(*nargs)++] = str_of(q->key, strlen(q->key));
    if (op->shape == ARGS_KEY_CAS) {
        C10D_CHECK(check_value(q->expected, q->expected_len, what, "expected"));
        args[(*nargs)++] = str_of(q->expected, q->expected_len);
    }
    if (op->shape == ARGS_KEY_VALUE || op->shape == ARGS_KEY_CAS) {
        C10D_CHECK(
            check_value(q->value, q->len, what, op->shape == ARGS_KEY_CAS ? "desired" : "value"));
        args[(*nargs)++] = str_of(q->value, q->len);
    }
    return 0;
}

int c10d_store_submit(c10d_store *s, const c10d_store_request *req, c10d_work **work)
{
    if (work == NULL)
        return c10d__fail(C10D_EINVAL, "store submit: work is NULL");
    *work = NULL;
    if (req == NULL)
        return c10d__fail(C10D_EINVAL, "store submit: req is NULL");
    c10d_store_request q;
    /* The 0.1 layout ends with block. */
    C10D_CHECK(c10d__opts_read(&q, sizeof q, offsetof(c10d_store_request, block) + sizeof(int), req,
                               "store submit"));
    if ((unsigned)q.op >= sizeof public_ops / sizeof public_ops[0])
        return c10d__fail(C10D_EINVAL, "store submit: unknown op %d", (int)q.op);
    const struct public_op *op = &public_ops[q.op];
    if (!s)
        return c10d__fail(C10D_EINVAL, "store %s: store is NULL", op->name);
    if (atomic_load(&s->users) <= 0)
        return c10d__fail(C10D_EINVAL, "store %s: store was released", op->name);
    size_t room = (op->shape == ARGS_KEYS || op->shape == ARGS_PAIRS) ? 2 * q.nkeys + 1 : 3;
    struct c10d__wire_str *args = malloc(room * sizeof *args);
    if (!args)
        return c10d__fail(C10D_ENOMEM, "store %s: out of memory", op->name);
    size_t nargs;
    int rc = build_args(&q, op, args, &nargs);
    struct c10d__store_op *o = NULL;
    if (rc == 0)
        rc = c10d__store_op_new(&o, op->cmd, args, nargs, q.op == C10D_STORE_OP_ADD ? q.delta : 0);
    free(args);
    if (rc != 0)
        return rc;
    o->block = q.op == C10D_STORE_OP_QUEUE_POP && q.block != 0;
    if (q.timeout_ms > 0)
        o->timeout_ms = q.timeout_ms;
    return c10d__store_op_submit(s, o, work);
}

const c10d_store_result *c10d_store_work_result(c10d_work *work)
{
    struct c10d__store_op *op = c10d__store_op_of(work);
    if (op == NULL || c10d_work_test(work) != 1)
        return NULL;
    return &op->res;
}

int c10d__store_call(c10d_store *s, const c10d_store_request *req, c10d_work_cb cb, void *arg)
{
    c10d_work *w;
    C10D_CHECK(c10d_store_submit(s, req, &w));
    int rc = cb != NULL ? c10d__work_on_complete(w, cb, arg) : 0;
    c10d_work_release(w);
    return rc;
}
