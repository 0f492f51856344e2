/* The store's key-value table: byte-string values, counters as decimal text,
 * FIFO queues, waiters (WAIT, BARRIER) and 1.13 watchers, with memory
 * accounting against one budget. Single-threaded: the server's loop owns it.
 *
 * Keys and queues live in two namespaces that share an entry: SET k and
 * QUEUE_PUSH k do not see each other, except that CHECK/WAIT count a key as
 * present if it has a value or a non-empty queue (as PyTorch's server does).
 *
 * Waiters belong to clients (one per connection): a client has at most one
 * pending wait, registered on each missing key. A change that makes a key
 * present (SET, ADD, APPEND, MULTI_SET, a storing COMPARE_SET, BARRIER's last
 * arrival) counts down every waiter of that key; QUEUE_PUSH counts down
 * waiters in FIFO order until one of them fires (as PyTorch's server does);
 * that client owes the queue a pop: if its next request is not QUEUE_POP of
 * that key (it gave up: a CANCEL_WAIT raced the wake) or it leaves, the wake
 * passes to the next waiter while items remain, so no waiter sleeps beside
 * a non-empty queue. DELETE_KEY wakes nobody.
 * A waiter whose count reaches zero is unregistered, then the table calls
 * cbs.wake(client). Callbacks must not call back into the table.
 *
 * Returned value pointers point into the table and are valid until the next
 * call that mutates it.
 */
#ifndef C10D_STORE_SERVER_TABLE_TABLE_H
#define C10D_STORE_SERVER_TABLE_TABLE_H

#include "store_server/wire/codec.h"

#include <stddef.h>
#include <stdint.h>

struct c10d__store_table;
struct c10d__store_wait;
struct c10d__store_watch;

/* A table user (a connection). Zero-initialise; owned by the caller, who must
 * call c10d__store_table_client_gone() before freeing it. */
struct c10d__store_client {
    struct c10d__store_wait *wait; /* the pending WAIT/BARRIER, if any */
    void *owed_wake; /* the queue whose QUEUE_PUSH woke this client, until its next request */
    struct c10d__store_watch *watches; /* 1.13 WATCH_KEY registrations */
    void *data;                        /* the owner's */
};

struct c10d__store_table_cbs {
    /* The client's pending wait fired (reply STOP_WAITING). */
    void (*wake)(struct c10d__store_client *client);
    /* A watched key changed (1.13): push `event`, key, old, new. */
    void (*watch)(struct c10d__store_client *client, int event, struct c10d__wire_str key,
                  struct c10d__wire_str old_value, struct c10d__wire_str new_value);
};

/* max_memory: budget in bytes for keys, values, queue items, waits and what the
 * server charges with c10d__store_table_charge (0: unlimited). */
int c10d__store_table_create(const struct c10d__store_table_cbs *cbs, size_t max_memory,
                             struct c10d__store_table **out);
/* Frees everything; clients must have been released (or are simply forgotten:
 * their `wait`/`watches` pointers then dangle). */
void c10d__store_table_free(struct c10d__store_table *t);

/* Operations. Errors: C10D_ENOMEM (the memory budget or malloc), C10D_EINVAL
 * (ADD/BARRIER on a value that is not a decimal integer, or overflow). A
 * failed operation leaves the table unchanged. */
int c10d__store_table_set(struct c10d__store_table *t, struct c10d__wire_str key,
                          struct c10d__wire_str value);
/* 1 and *value if the key has a value, 0 if not. */
int c10d__store_table_get(struct c10d__store_table *t, struct c10d__wire_str key,
                          struct c10d__wire_str *value);
int c10d__store_table_add(struct c10d__store_table *t, struct c10d__wire_str key, int64_t delta,
                          int64_t *result);
/* COMPARE_SET per docs/store_protocol.md; *reply is what to send back. */
int c10d__store_table_compare_set(struct c10d__store_table *t, struct c10d__wire_str key,
                                  struct c10d__wire_str expected, struct c10d__wire_str desired,
                                  struct c10d__wire_str *reply);
int c10d__store_table_append(struct c10d__store_table *t, struct c10d__wire_str key,
                             struct c10d__wire_str value);
/* Deletes the key's value and its queue (1.13 watchers see DELETED only when
 * a value went). 1 if either existed, 0 if neither. */
int c10d__store_table_delete(struct c10d__store_table *t, struct c10d__wire_str key);
/* 1 if every key has a value or a non-empty queue. */
int c10d__store_table_check(struct c10d__store_table *t, const struct c10d__wire_str *keys,
                            size_t n);
/* 1: all present, answer now (nothing registered). 0: registered as
 * client->wait; cbs.wake fires later. <0: error. A previous pending wait of
 * the client is dropped first. */
int c10d__store_table_wait(struct c10d__store_table *t, struct c10d__store_client *client,
                           const struct c10d__wire_str *keys, size_t n);
/* Drops the client's pending wait, if any. 1 if there was one. */
int c10d__store_table_cancel_wait(struct c10d__store_table *t, struct c10d__store_client *client);
/* Increments the counter at `key` (decimal text, like ADD 1). If it reaches
 * world_size, every waiter of the key fires and this returns 1 (answer now);
 * else the client waits on the key (0). */
int c10d__store_table_barrier(struct c10d__store_table *t, struct c10d__store_client *client,
                              struct c10d__wire_str key, int64_t world_size);
int c10d__store_table_queue_push(struct c10d__store_table *t, struct c10d__wire_str key,
                                 struct c10d__wire_str value);
/* *len_before: the queue's length before the pop. If it was > 0, *value is the
 * popped item, valid until the next call on the table. */
int c10d__store_table_queue_pop(struct c10d__store_table *t, struct c10d__wire_str key,
                                int64_t *len_before, struct c10d__wire_str *value);
/* The size of the item QUEUE_POP would return next (0 if the queue is empty);
 * changes nothing. */
size_t c10d__store_table_queue_front_len(struct c10d__store_table *t, struct c10d__wire_str key);
int64_t c10d__store_table_queue_len(struct c10d__store_table *t, struct c10d__wire_str key);
/* 1.13 WATCH_KEY: future changes of key call cbs.watch(client, ...). */
int c10d__store_table_watch(struct c10d__store_table *t, struct c10d__store_client *client,
                            struct c10d__wire_str key);
/* Before each request of `client` (cmd, and its first argument): settles a
 * wake the client owes a queue (see the top of this file). */
void c10d__store_table_client_request(struct c10d__store_table *t,
                                      struct c10d__store_client *client, int cmd,
                                      struct c10d__wire_str first_arg);
/* Drops the client's wait, watches and owed wake. */
void c10d__store_table_client_gone(struct c10d__store_table *t, struct c10d__store_client *client);

/* Number of keys with a value (GETNUMKEYS). */
size_t c10d__store_table_num_keys(const struct c10d__store_table *t);
/* Calls fn for every key with a value, in no particular order; stops early
 * when fn returns non-zero and returns that value. */
int c10d__store_table_foreach_key(struct c10d__store_table *t,
                                  int (*fn)(void *arg, struct c10d__wire_str key), void *arg);

/* Memory accounting shared with the server (connection buffers). charge
 * returns 0 or C10D_ENOMEM (nothing charged); release gives bytes back. */
int c10d__store_table_charge(struct c10d__store_table *t, size_t bytes);
void c10d__store_table_release(struct c10d__store_table *t, size_t bytes);

struct c10d__store_table_stats {
    size_t keys;   /* with a value */
    size_t queues; /* non-empty queues */
    size_t queue_items;
    size_t value_bytes; /* key + value + queue item bytes */
    size_t memory;      /* everything charged, server buffers included */
    size_t memory_limit;
    size_t waiters;  /* pending waits */
    size_t watchers; /* watch registrations */
};
void c10d__store_table_get_stats(const struct c10d__store_table *t,
                                 struct c10d__store_table_stats *st);

#endif
