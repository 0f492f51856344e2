/* The client stores behind one interface (docs/store_client.md).
 *
 * Every store operation is a c10d_work from birth. A request is checked on
 * the caller's thread, copied into a c10d__store_op (the payload of its work)
 * and posted to the loop thread, where the store's vtable `submit` runs. The
 * store finishes the op exactly once with c10d__store_op_finish(), on the loop
 * thread: that fills in the op's result and completes the work, whose
 * callbacks and waiters then read the result in place. The op lives as long
 * as its work. Requests use the codec's layout (struct c10d__wire_request),
 * so the TCP store encodes them as they are and the other stores run them
 * against the server's table.
 */
#ifndef C10D_STORE_SERVER_CLIENT_STORE_H
#define C10D_STORE_SERVER_CLIENT_STORE_H

#include "c10d.h"
#include "engine/error.h"
#include "engine/loop.h"
#include "store_server/wire/codec.h"

#include <stdatomic.h>
#include <sys/socket.h>

struct c10d__store_op;

/* Where a network store is reached from (c10d__store_route). */
struct c10d__store_route {
    struct sockaddr_storage local; /* this end of the connection (getsockname) */
    char host[256];                /* the server's host as it was given (MASTER_ADDR) */
};

struct c10d__store_vtable {
    const char *kind;
    /* Loop thread. Owns `op` from here on: finish it exactly once. */
    void (*submit)(c10d_store *s, struct c10d__store_op *op);
    /* Loop thread, once, when the last user reference is gone: fail pending
     * ops with C10D_ECLOSED, close handles, then c10d__store_unref(s) for the
     * users' reference once nothing of the store is left on the loop. */
    void (*close)(c10d_store *s);
    /* Any thread: frees the implementation's part (the last reference). */
    void (*destroy)(c10d_store *s);
    /* Optional (NULL: not reached over a network). Loop thread. See
     * c10d__store_route. */
    int (*route)(c10d_store *s, struct c10d__store_route *out);
    /* Optional; any thread but the loop's. The same store over connections of
     * its own (c10d_store_clone); NULL: the store itself serves (in-process
     * stores block no one). */
    int (*clone)(c10d_store *s, c10d_store **out);
    /* Optional: the store this one forwards to (a prefix store's base). */
    c10d_store *(*inner)(c10d_store *s);
};

struct c10d_store {
    const struct c10d__store_vtable *vt;
    atomic_int users; /* c10d_store_retain/release */
    atomic_int refs;  /* memory: 1 for all users, 1 per op in flight, ... */
    atomic_llong timeout_ms;
    int dialect; /* TCP: the dialect spoken (c10d_store_dialect) */
    /* TCP: whether the server answers BARRIER (c10d__store_has_barrier):
     * 0 not known yet, 1 yes, -1 no. */
    atomic_int barrier_cmd;
    struct c10d__task close_task;
};

/* The op: a request in the codec's layout plus what the stores need. */
struct c10d__store_op {
    struct c10d__wire_request req; /* req.args points into `blob` */
    struct c10d__wire_str *args;
    int block;            /* QUEUE_POP: wait for an item */
    int raw_keys;         /* TCP: send keys as they are (torch's "init/") */
    int phase;            /* the stores' progress through a composite op */
    int64_t timeout_ms;   /* > 0 */
    uint64_t deadline_ms; /* c10d__now_ms() clock; set when submitted */
    c10d_work *work;      /* its future; the op is its payload and dies with it */
    c10d_store *store;    /* holds a reference until the op finished */
    struct c10d__task task;
    struct c10d__store_op *next; /* for the stores' queues */
    void *priv;                  /* the store's */
    int finished;
    char *list_prefix; /* LIST_KEYS through prefix stores: keep and strip these */
    /* The result, read through c10d_store_work_result(work). */
    c10d_store_result res;
    void *res_data;
    c10d_store_bytes *res_items;
    char *res_message;
};

/* Store objects. init sets users = refs = 1 and the default timeout. */
void c10d__store_init(c10d_store *s, const struct c10d__store_vtable *vt);
void c10d__store_ref(c10d_store *s);
void c10d__store_unref(c10d_store *s);

/* Loop thread. The route to the server of `s` (through prefix stores): the
 * local address of its last connection that completed a handshake, which is
 * the address this host reaches the store from, and the host it was asked
 * for. 0, or C10D_ENOTFOUND (no c10d_last_error) for a store that is not
 * reached over TCP or has not connected yet. */
int c10d__store_route(c10d_store *s, struct c10d__store_route *out);

/* The store at the bottom of a chain of prefix stores. */
c10d_store *c10d__store_root(c10d_store *s);
/* Not on the loop thread; may block one round trip the first time. 1 when
 * `s` reaches a TCP server in the current dialect that runs BARRIER (found
 * once per connection's store with a BARRIER of one participant, which a
 * server without it answers by closing the connection), else 0. */
int c10d__store_has_barrier(c10d_store *s);

/* Builds an op and its work (op->work, one reference: the caller's until
 * submitted) into *out. args: the codec layout for `cmd`; every string is
 * copied. Returns 0, or C10D_ENOMEM / C10D_EABORTED (shutting down). */
int c10d__store_op_new(struct c10d__store_op **out, int cmd, const struct c10d__wire_str *args,
                       size_t nargs, int64_t i64);
/* Drops an op that was never submitted (and its work). */
void c10d__store_op_discard(struct c10d__store_op *op);
/* Posts op to `s` (takes a reference on s). *work (if not NULL) gets a
 * reference to the op's work; the op's own reference is the loop's from now
 * on. On failure the op is dropped, *work stays NULL and nothing calls back. */
int c10d__store_op_submit(c10d_store *s, struct c10d__store_op *op, c10d_work **work);
/* Submits op and waits for its work (never on the loop thread), bounded by
 * its deadline plus a margin should the loop never answer. timeout_ms > 0
 * sets the op's deadline (else the store's timeout). Takes op on every path.
 * Returns the op's status, with c10d_last_error() set on failure; *value (if
 * not NULL) gets the result's value on success. */
int c10d__store_op_run_sync(c10d_store *s, struct c10d__store_op *op, int64_t timeout_ms,
                            int64_t *value);
/* c10d_store_get_sync with its own deadline: the GET waits up to timeout_ms
 * (<= 0: the store's) for the key to appear, so a WAIT before it would only
 * cost a round trip. */
int c10d__store_get_within_sync(c10d_store *s, const char *key, int64_t timeout_ms, void **value,
                                size_t *len);
/* c10d_store_get_sync of a short text value (a count, a generation): the
 * value's first cap - 1 bytes into text, NUL-terminated; *len (if not NULL)
 * gets the value's whole length. */
int c10d__store_get_text_sync(c10d_store *s, const char *key, char *text, size_t cap, size_t *len);
/* The library's own asynchronous store calls (group layer, backends): submits
 * `req` and calls cb on the loop thread once it finished, with the result in
 * c10d_store_work_result(work) during the call. cb may be NULL (fire and
 * forget). Returns 0, or the submit error (cb is never called). */
int c10d__store_call(c10d_store *s, const c10d_store_request *req, c10d_work_cb cb, void *arg);
/* The op behind a store work (NULL for another kind of work). */
struct c10d__store_op *c10d__store_op_of(c10d_work *work);

/* Hands `op` to `s` right now (loop thread): how a prefix store forwards to
 * its base (the op's reference moves from the old store to s). */
void c10d__store_op_forward(c10d_store *s, struct c10d__store_op *op);

/* Prefix stores: LIST_KEYS keeps only keys under `prefix` (prepended to
 * what outer prefixes asked for) and strips it. */
int c10d__store_op_add_list_prefix(struct c10d__store_op *op, const char *prefix, size_t plen);

/* Result setters (copy their input; data is NUL-terminated past its length,
 * so a text value can be handed out as a C string). set_items: MULTI_GET's
 * values and LIST_KEYS's keys, each with `strip` leading bytes removed (the
 * TCP store's "/") and filtered by op->list_prefix if set. */
int c10d__store_op_set_data(struct c10d__store_op *op, const void *data, size_t len);
int c10d__store_op_set_items(struct c10d__store_op *op, const struct c10d__wire_str *items,
                             size_t n, size_t strip);
/* The result of `op` from its parsed reply, the same for every store: the
 * value of an integer, CHECK's readiness, the string(s) of a value, list or
 * popped item. A store handles what only it knows first (an empty GET, an
 * empty pop of a blocking QUEUE_POP, PING's round trip). */
int c10d__store_op_take_reply(struct c10d__store_op *op, const struct c10d__wire_reply *r);
/* Finishes the op: status 0 or negative with a printf message. Completes its
 * work (whose callbacks run next on the loop) and drops the op's references
 * on the store and on the work. Loop thread. */
void c10d__store_op_finish(struct c10d__store_op *op, int status, const char *fmt, ...)
    C10D_PRINTF(3, 4);
/* Finishes every op of a singly linked list (ops' `next`). */
void c10d__store_op_fail_list(struct c10d__store_op *list, int status, const char *fmt, ...)
    C10D_PRINTF(3, 4);

/* Rewrites every key argument of op to prefix + key (prefix stores, the TCP
 * store's "/"). */
int c10d__store_op_prefix_keys(struct c10d__store_op *op, const char *prefix, size_t plen);

/* The keys op waits for before running (GET, MULTI_GET, blocking QUEUE_POP,
 * WAIT); 0 keys if it does not wait. */
size_t c10d__store_op_wait_keys(const struct c10d__store_op *op,
                                const struct c10d__wire_str **keys);

/* Milliseconds left before op's deadline (0 when past). */
int64_t c10d__store_op_remaining_ms(const struct c10d__store_op *op);

#endif
