/* Stores that keep their data in a store_server table on this host (hash and
 * file): requests run against the table on the loop thread; ops that must
 * wait for keys are parked and re-run whenever something changed, until
 * their deadline. The file store adds a lock, a refresh from the shared log
 * and an append of every change (the hooks). */
#ifndef C10D_STORE_SERVER_CLIENT_STORE_LOCAL_H
#define C10D_STORE_SERVER_CLIENT_STORE_LOCAL_H

#include "store.h"

struct c10d__local_store;
struct c10d__local_waiter;

struct c10d__local_hooks {
    /* Before running ops: 0 ready, 1 busy (try again later), < 0 error. */
    int (*begin)(struct c10d__local_store *ls);
    /* A request changed the table: make it durable. 0 or < 0. */
    int (*commit)(struct c10d__local_store *ls, const struct c10d__wire_request *req);
    void (*end)(struct c10d__local_store *ls);
    /* 1 if something may have changed since the last pass (cheap check). */
    int (*changed)(struct c10d__local_store *ls);
    /* Called once the store is closed on the loop (free the rest). */
    void (*destroy)(struct c10d__local_store *ls);
    uint64_t poll_ms; /* > 0: re-run parked ops every poll_ms */
};

struct c10d__local_store {
    c10d_store base;
    struct c10d__store_table *table;
    const struct c10d__local_hooks *hooks;
    struct c10d__local_waiter *head, *tail;
    size_t handles; /* open uv handles (waiter timers, poll timer) */
    uv_timer_t poll;
    int poll_open;
    int closed;
    struct c10d__shutdown_hook hook;
    int hook_registered;
    /* Keys hidden from users (the file store's cleanup counter). */
    const char *hidden_key;
    size_t hidden_len;
};

extern const struct c10d__store_vtable c10d__hash_store_vtable;
extern const struct c10d__store_vtable c10d__file_store_vtable;

/* Sets up the base store (one of the vtables above) and the table. */
int c10d__local_store_init(struct c10d__local_store *ls, const struct c10d__store_vtable *vt,
                           const struct c10d__local_hooks *hooks);

/* Runs one request against the table: 0 done (result set), 1 must wait for
 * its keys, < 0 failed (message in c10d_last_error()). *mutated: the table
 * changed. Hidden keys (ls->hidden_key) are left out of NUM_KEYS/LIST_KEYS. */
int c10d__local_store_run(struct c10d__local_store *ls, struct c10d__store_op *op, int *mutated);

/* Applies a replayed request (the file store's log) to the table. */
int c10d__local_store_apply(struct c10d__store_table *t, const struct c10d__wire_request *req);

#endif
