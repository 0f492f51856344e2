/* The store's one executor: a request in, the table changed and the wire
 * reply written. Adding a command is a row in store_server/wire/commands.h
 * plus a case in each switch below (docs/store.md). */
#include "exec.h"

#include "engine/error.h"

static size_t add_sat(size_t a, size_t b)
{
    return a > SIZE_MAX - b ? SIZE_MAX : a + b;
}

static int put_key(void *arg, struct c10d__wire_str key)
{
    return c10d__wire_put_str(arg, key.data, key.len);
}

static int count_key(void *arg, struct c10d__wire_str key)
{
    size_t *n = arg;
    *n = add_sat(*n, add_sat(8, key.len));
    return 0;
}

static int put_u8_if(int rc, struct c10d__wire_buf *out, uint8_t v)
{
    return rc < 0 ? rc : c10d__wire_put_u8(out, v);
}

int c10d__store_exec(struct c10d__store_table *t, struct c10d__store_client *client,
                     const struct c10d__wire_request *r, const struct c10d__store_exec_plan *plan,
                     struct c10d__wire_buf *out, struct c10d__store_exec_result *res)
{
    const struct c10d__wire_str *a = r->args;
    struct c10d__wire_str v = {NULL, 0};
    int64_t n;
    int rc = 0;
    res->value = 0;
    switch (r->cmd) {
    case C10D_STORE_VALIDATE:
        return 0;
    case C10D_STORE_PING:
        return c10d__wire_put_u32(out, r->u32);
    case C10D_STORE_SET:
        return c10d__store_table_set(t, a[0], a[1]);
    case C10D_STORE_COMPARE_SET:
        rc = c10d__store_table_compare_set(t, a[0], a[1], a[2], &v);
        return rc < 0 ? rc : c10d__wire_put_str(out, v.data, v.len);
    case C10D_STORE_GET:
        if (plan && plan->looked_up) {
            res->value = plan->present;
            v = plan->value;
        } else {
            res->value = c10d__store_table_get(t, a[0], &v);
        }
        return c10d__wire_put_str(out, v.data, v.len);
    case C10D_STORE_ADD:
        rc = c10d__store_table_add(t, a[0], r->i64, &res->value);
        return rc < 0 ? rc : c10d__wire_put_i64(out, res->value);
    case C10D_STORE_CHECK:
        return c10d__wire_put_u8(
            out, c10d__store_table_check(t, a, r->nargs) ? C10D_STORE_READY : C10D_STORE_NOT_READY);
    case C10D_STORE_WAIT:
        if (!client)
            return C10D_EUNSUPPORTED;
        rc = c10d__store_table_wait(t, client, a, r->nargs);
        res->value = rc == 1;
        return rc == 1 ? c10d__wire_put_u8(out, C10D_STORE_STOP_WAITING) : rc;
    case C10D_STORE_GETNUMKEYS:
        return c10d__wire_put_i64(out, (int64_t)c10d__store_table_num_keys(t));
    case C10D_STORE_DELETE_KEY:
        res->value = c10d__store_table_delete(t, a[0]);
        return c10d__wire_put_i64(out, res->value);
    case C10D_STORE_APPEND:
        return c10d__store_table_append(t, a[0], a[1]);
    case C10D_STORE_MULTI_GET:
        for (size_t i = 0; i < r->nargs && rc == 0; i++) {
            c10d__store_table_get(t, a[i], &v);
            rc = c10d__wire_put_str(out, v.data, v.len);
        }
        return rc;
    case C10D_STORE_MULTI_SET:
        for (size_t i = 0; i + 1 < r->nargs && rc == 0; i += 2)
            rc = c10d__store_table_set(t, a[i], a[i + 1]);
        return rc;
    case C10D_STORE_CANCEL_WAIT:
        if (!client)
            return C10D_EUNSUPPORTED;
        c10d__store_table_cancel_wait(t, client);
        return c10d__wire_put_u8(out, C10D_STORE_WAIT_CANCELED);
    case C10D_STORE_QUEUE_PUSH:
        return c10d__store_table_queue_push(t, a[0], a[1]);
    case C10D_STORE_QUEUE_POP:
        rc = c10d__store_table_queue_pop(t, a[0], &n, &v);
        res->value = rc < 0 ? 0 : n;
        if (rc == 0)
            rc = c10d__wire_put_i64(out, n);
        if (rc == 0 && n > 0)
            rc = c10d__wire_put_str(out, v.data, v.len);
        return rc;
    case C10D_STORE_QUEUE_LEN:
        return c10d__wire_put_i64(out, c10d__store_table_queue_len(t, a[0]));
    case C10D_STORE_LIST_KEYS:
        rc = c10d__wire_put_i64(out, (int64_t)c10d__store_table_num_keys(t));
        return rc < 0 ? rc : c10d__store_table_foreach_key(t, put_key, out);
    case C10D_STORE_BARRIER:
        if (!client)
            return C10D_EUNSUPPORTED;
        rc = c10d__store_table_barrier(t, client, a[0], r->i64);
        res->value = rc == 1;
        return rc == 1 ? c10d__wire_put_u8(out, C10D_STORE_STOP_WAITING) : rc;
    case C10D_STORE_WATCH_KEY:
        if (!client)
            return C10D_EUNSUPPORTED;
        rc = c10d__store_table_watch(t, client, a[0]);
        return put_u8_if(rc, out, C10D_STORE_KEY_CALLBACK_REGISTERED);
    case C10D_STORE_AUTH:
        /* A host with a token checks it before the request runs; without
         * one any token is welcome, so a client configured with one works. */
        return c10d__wire_put_u8(out, C10D_STORE_AUTH_OK);
    default: /* STATS: what to report is the host's */
        return C10D_EUNSUPPORTED;
    }
}

#define FIXED_NONE 0
#define FIXED_U8   1
#define FIXED_U32  4
#define FIXED_I64  8
#define FIXED_STR  -1
#define FIXED_NSTR -1
#define FIXED_LIST -1
#define FIXED_QPOP -1
#define FIXED_REPLY(name, cur, leg, u32, counted, per_item, nstr, i64, values, reply, ro, waits)   \
    [C10D_STORE_##name] = FIXED_##reply,
const signed char c10d__store_exec_fixed_reply[C10D_STORE_CMD_COUNT] = {
    C10D__STORE_COMMANDS(FIXED_REPLY)};

size_t c10d__store_exec_reply_lookup(struct c10d__store_table *t,
                                     const struct c10d__wire_request *r,
                                     struct c10d__store_exec_plan *plan)
{
    const struct c10d__wire_str *a = r->args;
    struct c10d__wire_str v;
    switch (r->cmd) {
    case C10D_STORE_GET: {
        int present = c10d__store_table_get(t, a[0], &v);
        if (plan)
            *plan = (struct c10d__store_exec_plan){1, present, v};
        return add_sat(8, v.len);
    }
    case C10D_STORE_COMPARE_SET: {
        size_t m = a[1].len > a[2].len ? a[1].len : a[2].len;
        if (c10d__store_table_get(t, a[0], &v) && v.len > m)
            m = v.len;
        return add_sat(8, m);
    }
    case C10D_STORE_MULTI_GET: {
        size_t n = 0;
        for (size_t i = 0; i < r->nargs; i++)
            n = add_sat(n, add_sat(8, c10d__store_table_get(t, a[i], &v) ? v.len : 0));
        return n;
    }
    case C10D_STORE_QUEUE_POP:
        return add_sat(16, c10d__store_table_queue_front_len(t, a[0]));
    case C10D_STORE_LIST_KEYS: {
        size_t n = 8;
        c10d__store_table_foreach_key(t, count_key, &n);
        return n;
    }
    default: /* the fixed sizes; STATS: the host's */
        return c10d__store_exec_fixed_reply[r->cmd] > 0
                   ? (size_t)c10d__store_exec_fixed_reply[r->cmd]
                   : 0;
    }
}
