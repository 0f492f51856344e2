/* The TCP store's requests: the queue of ops not yet on the wire, how each
 * op becomes one or more requests (GET, MULTI_GET and a blocking QUEUE_POP are
 * WAIT then the command, as PyTorch's client does), what each reply means,
 * and what an op past its deadline costs. The connection they travel on is
 * store_tcp_conn.c's; here it is only ready or not.
 *
 * One request awaits a reply at a time and replies come in order, so the
 * reply read is always the answer to ts->inflight; requests without a reply
 * (SET, APPEND, ...) are written back to back.
 *
 * Deadlines: an op past its deadline fails with C10D_ETIMEDOUT. If it was on
 * the wire:
 *  - a WAIT in the current dialect is cancelled with CANCEL_WAIT; the
 *    connection stays in sync by reading the one or two bytes that follow
 *    (a STOP_WAITING that raced the cancel, then WAIT_CANCELED);
 *  - anything else (and every legacy WAIT: 1.13 has no CANCEL_WAIT) taints
 *    the connection: it is closed, and later ops use a new one, so a late
 *    reply can never be read as the answer to a later request.
 */
#include "store_tcp_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Phases of an op on the wire. */
enum { PH_MAIN = 0, PH_WAIT, PH_CHECK_EMPTY };

#define KEYF    "'%.*s'"
#define KEYA(s) (int)((s).len > 200 ? 200 : (s).len), (const char *)(s).data

/* ------------------------------------------------------------ the queue */

void c10d__store_tcp_enqueue(struct tcp_store *ts, struct c10d__store_op *op)
{
    op->next = NULL;
    if (ts->tail)
        ts->tail->next = op;
    else
        ts->head = op;
    ts->tail = op;
}

static struct c10d__store_op *dequeue(struct tcp_store *ts)
{
    struct c10d__store_op *op = ts->head;
    if (op) {
        ts->head = op->next;
        if (!ts->head)
            ts->tail = NULL;
        op->next = NULL;
    }
    return op;
}

/* --------------------------------------------------------- finishing ops */

static void timeout_message(struct tcp_store *ts, struct c10d__store_op *op, char *buf, size_t len)
{
    if (ts->state != ST_READY && ts->attempts > 0) {
        if (ts->last_error[0]) {
            snprintf(buf, len,
                     "store tcp %s %s: could not connect within %lld ms: %s after %d attempts",
                     ts->name, c10d__store_tcp_op_name(op), (long long)op->timeout_ms,
                     ts->last_error, ts->attempts);
        } else {
            snprintf(buf, len,
                     "store tcp %s %s: could not connect within %lld ms (%d attempts, the last "
                     "one still in progress)",
                     ts->name, c10d__store_tcp_op_name(op), (long long)op->timeout_ms,
                     ts->attempts);
        }
        return;
    }
    const struct c10d__wire_str *keys;
    size_t n = c10d__store_op_wait_keys(op, &keys);
    if (n && (op->req.cmd == C10D_STORE_WAIT || op->phase == PH_WAIT))
        snprintf(buf, len, "store tcp %s %s: timed out after %lld ms waiting for key " KEYF "%s",
                 ts->name, c10d__store_tcp_op_name(op), (long long)op->timeout_ms, KEYA(keys[0]),
                 n > 1 ? " (and others)" : "");
    else
        snprintf(buf, len, "store tcp %s %s: no reply within %lld ms", ts->name,
                 c10d__store_tcp_op_name(op), (long long)op->timeout_ms);
}

void c10d__store_tcp_fail_queue(struct tcp_store *ts, int status, const char *why)
{
    struct c10d__store_op *list = ts->head;
    ts->head = ts->tail = NULL;
    c10d__store_op_fail_list(list, status, "store tcp %s: %s", ts->name, why);
}

void c10d__store_tcp_expire_ops(struct tcp_store *ts, uint64_t now)
{
    char msg[1024];
    /* queued ops (not on the wire: nothing to undo) */
    for (struct c10d__store_op **pp = &ts->head; *pp;) {
        struct c10d__store_op *op = *pp;
        if (now < op->deadline_ms) {
            pp = &op->next;
            continue;
        }
        *pp = op->next;
        if (ts->tail == op) {
            ts->tail = NULL;
            for (struct c10d__store_op *q = ts->head; q; q = q->next)
                ts->tail = q;
        }
        timeout_message(ts, op, msg, sizeof msg);
        c10d__store_op_finish(op, C10D_ETIMEDOUT, "%s", msg);
    }
    struct c10d__store_op *op = ts->inflight;
    if (op && now >= op->deadline_ms) {
        ts->inflight = NULL;
        timeout_message(ts, op, msg, sizeof msg);
        int can_cancel = op->phase == PH_WAIT || op->req.cmd == C10D_STORE_WAIT;
        if (can_cancel && ts->dialect == C10D_STORE_DIALECT_CURRENT && ts->state == ST_READY) {
            c10d__store_tcp_send_cancel(ts, now);
            c10d__store_op_finish(op, C10D_ETIMEDOUT, "%s", msg);
            if (!ts->cancelling)
                c10d__store_tcp_drop_conn(ts, C10D_ECLOSED, "connection dropped after a timeout");
        } else {
            c10d__store_op_finish(op, C10D_ETIMEDOUT, "%s", msg);
            /* A late reply would answer the next request: start afresh. */
            if (ts->state == ST_READY || ts->state == ST_HANDSHAKE)
                c10d__store_tcp_drop_conn(
                    ts, C10D_ECLOSED,
                    "connection dropped after a timeout (a late reply must not answer "
                    "a later request)");
        }
    }
}

/* --------------------------------------------------------------- sending */

/* Puts the current phase of op on the wire. */
static void send_phase(struct tcp_store *ts, struct c10d__store_op *op)
{
    struct c10d__wire_request req = op->req;
    if (op->phase == PH_WAIT) {
        const struct c10d__wire_str *keys;
        req.cmd = C10D_STORE_WAIT;
        req.nargs = c10d__store_op_wait_keys(op, &keys);
        req.args = keys;
    } else if (op->phase == PH_CHECK_EMPTY) {
        req.cmd = C10D_STORE_CHECK;
        req.nargs = 1;
    } else if (req.cmd == C10D_STORE_PING && ts->dialect == C10D_STORE_DIALECT_LEGACY) {
        req.cmd = C10D_STORE_CHECK; /* 1.13 has no PING: a CHECK of no keys is as cheap */
        req.nargs = 0;
    } else if (req.cmd == C10D_STORE_PING) {
        req.u32 = ts->nonce;
    }
    struct c10d__wire_buf b = {0};
    int rc = c10d__wire_encode_request(&b, ts->dialect, &req);
    if (rc < 0) {
        c10d__wire_buf_free(&b);
        c10d__store_op_finish(op, rc, "store tcp %s %s: %s", ts->name, c10d__store_tcp_op_name(op),
                              c10d_last_error());
        return;
    }
    int shape = c10d__wire_reply_shape(req.cmd);
    if (shape == C10D_STORE_REPLY_NONE) {
        c10d__store_tcp_send_bytes(ts, &b, op);
        return;
    }
    ts->inflight = op;
    ts->sent_ns = c10d__now_ns();
    c10d__wire_reply_expect(&ts->rp, req.cmd, req.cmd == C10D_STORE_MULTI_GET ? req.nargs : 0);
    c10d__store_tcp_send_bytes(ts, &b, NULL);
}

static int waits_first(const struct c10d__store_op *op)
{
    const struct c10d__wire_str *keys;
    return op->req.cmd != C10D_STORE_WAIT && c10d__store_op_wait_keys(op, &keys) > 0;
}

void c10d__store_tcp_pump(struct tcp_store *ts)
{
    while (ts->state == ST_READY && !ts->inflight && !ts->cancelling && ts->head) {
        struct c10d__store_op *op = dequeue(ts);
        if (op->req.cmd == C10D_STORE_VALIDATE) { /* the constructor's "connect" */
            c10d__store_op_finish(op, 0, NULL);
            continue;
        }
        if (c10d__wire_cmd_to_wire(ts->dialect, op->req.cmd) < 0 &&
            !(op->req.cmd == C10D_STORE_PING)) {
            c10d__store_op_finish(op, C10D_EUNSUPPORTED,
                                  "store tcp %s %s: not supported by a PyTorch 1.13 server "
                                  "(legacy dialect)",
                                  ts->name, c10d__store_tcp_op_name(op));
            continue;
        }
        op->phase = waits_first(op) ? PH_WAIT : PH_MAIN;
        send_phase(ts, op);
    }
}

/* --------------------------------------------------------------- replies */

void c10d__store_tcp_handle_reply(struct tcp_store *ts, const struct c10d__wire_reply *r)
{
    struct c10d__store_op *op = ts->inflight;
    ts->inflight = NULL;
    int rc = 0;
    if (op->phase == PH_WAIT) {
        op->phase = PH_MAIN;
        send_phase(ts, op);
        return;
    }
    if (op->phase == PH_CHECK_EMPTY) {
        if (r->u8 == C10D_STORE_READY)
            rc = c10d__store_op_set_data(op, "", 0);
        else
            rc = c10d__fail(C10D_ENOTFOUND, "store tcp %s get: key " KEYF " not found", ts->name,
                            KEYA(op->req.args[0]));
        goto done;
    }
    if (op->req.cmd == C10D_STORE_GET && r->vals[0].len == 0) {
        /* Our server answers a missing key (deleted after the wait) with an
         * empty value: tell the two apart. */
        op->phase = PH_CHECK_EMPTY;
        send_phase(ts, op);
        return;
    }
    if (op->req.cmd == C10D_STORE_QUEUE_POP && r->i64 <= 0) {
        if (op->block) {
            op->phase = PH_WAIT; /* another popper won: wait again */
            send_phase(ts, op);
            return;
        }
        rc = c10d__fail(C10D_ENOTFOUND, "store tcp %s queue_pop: queue " KEYF " is empty", ts->name,
                        KEYA(op->req.args[0]));
        goto done;
    }
    rc = c10d__store_op_take_reply(op, r);
    if (op->req.cmd == C10D_STORE_PING) {
        if (ts->dialect == C10D_STORE_DIALECT_CURRENT && r->u32 != ts->nonce)
            rc = c10d__fail(C10D_EPROTO, "store tcp %s ping: answered %u, sent %u", ts->name,
                            (unsigned)r->u32, (unsigned)ts->nonce);
        op->res.value = (int64_t)((c10d__now_ns() - ts->sent_ns) / 1000);
    }
done:
    if (rc < 0)
        c10d__store_op_finish(op, rc, "%s", c10d_last_error());
    else
        c10d__store_op_finish(op, 0, NULL);
}

const struct tcp_store_requests c10d__store_tcp_requests = {
    c10d__store_tcp_enqueue, c10d__store_tcp_fail_queue,   c10d__store_tcp_expire_ops,
    c10d__store_tcp_pump,    c10d__store_tcp_handle_reply,
};
