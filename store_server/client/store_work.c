/* Store operations as works: c10d_store_submit runs a request through the
 * callback form and completes a work with a copy of the result, so store ops
 * are waited on, tested and released as group ops are. The copy is needed
 * because a callback's result lives only as long as the callback. */
#include "store.h"

#include "engine/opts.h"
#include "engine/work.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Any unique address: tells store payloads from other producers'. */
static const char payload_kind = 's';

struct stored_result {
    c10d_store_result res;
    char *message;
    void *data;
    c10d_store_bytes *items;
    void **item_data;
};

static void stored_result_free(void *p)
{
    struct stored_result *sr = p;
    if (sr == NULL)
        return;
    for (size_t i = 0; sr->item_data != NULL && i < sr->res.count; i++)
        free(sr->item_data[i]);
    free(sr->item_data);
    free(sr->items);
    free(sr->data);
    free(sr->message);
    free(sr);
}

static void *copy_bytes(const void *src, size_t len)
{
    void *p = malloc(len ? len : 1);
    if (p != NULL && len)
        memcpy(p, src, len);
    return p;
}

/* Copies what `r` points to into `sr`. Returns 0, or C10D_ENOMEM. */
static int store_copy(struct stored_result *sr, const c10d_store_result *r)
{
    sr->res = *r;
    sr->message = strdup(r->message != NULL ? r->message : "");
    if (sr->message == NULL)
        return C10D_ENOMEM;
    sr->res.message = sr->message;
    sr->res.data.data = NULL;
    sr->res.items = NULL;
    if (r->data.data != NULL) {
        if ((sr->data = copy_bytes(r->data.data, r->data.len)) == NULL)
            return C10D_ENOMEM;
        sr->res.data.data = sr->data;
    }
    if (r->items != NULL && r->count > 0) {
        sr->items = calloc(r->count, sizeof *sr->items);
        sr->item_data = calloc(r->count, sizeof *sr->item_data);
        if (sr->items == NULL || sr->item_data == NULL)
            return C10D_ENOMEM;
        for (size_t i = 0; i < r->count; i++) {
            if ((sr->item_data[i] = copy_bytes(r->items[i].data, r->items[i].len)) == NULL)
                return C10D_ENOMEM;
            sr->items[i].data = sr->item_data[i];
            sr->items[i].len = r->items[i].len;
        }
        sr->res.items = sr->items;
    }
    return 0;
}

static void on_result(const c10d_store_result *r, void *arg)
{
    c10d_work *w = arg;
    struct stored_result *sr = c10d__work_payload(w, &payload_kind);
    if (store_copy(sr, r) != 0)
        c10d__work_complete(w, C10D_ENOMEM, "store: out of memory copying a result");
    else
        c10d__work_complete(w, r->status, "%s", r->message != NULL ? r->message : "");
    c10d_work_release(w); /* the callback's reference */
}

static const char *const op_names[] = {
    "set",        "get",       "add",       "compare_set",  "wait",      "check",
    "delete_key", "num_keys",  "append",    "multi_get",    "multi_set", "queue_push",
    "queue_pop",  "queue_len", "list_keys", "server_stats", "ping",
};

static int start(c10d_store *s, const c10d_store_request *q, c10d_work *w)
{
    switch (q->op) {
    case C10D_STORE_OP_SET:
        return c10d_store_set(s, q->key, q->value, q->len, on_result, w);
    case C10D_STORE_OP_GET:
        return c10d_store_get(s, q->key, on_result, w);
    case C10D_STORE_OP_ADD:
        return c10d_store_add(s, q->key, q->delta, on_result, w);
    case C10D_STORE_OP_COMPARE_SET:
        return c10d_store_compare_set(s, q->key, q->expected, q->expected_len, q->value, q->len,
                                      on_result, w);
    case C10D_STORE_OP_WAIT:
        return c10d_store_wait(s, q->keys, q->nkeys, q->timeout_ms, on_result, w);
    case C10D_STORE_OP_CHECK:
        return c10d_store_check(s, q->keys, q->nkeys, on_result, w);
    case C10D_STORE_OP_DELETE_KEY:
        return c10d_store_delete_key(s, q->key, on_result, w);
    case C10D_STORE_OP_NUM_KEYS:
        return c10d_store_num_keys(s, on_result, w);
    case C10D_STORE_OP_APPEND:
        return c10d_store_append(s, q->key, q->value, q->len, on_result, w);
    case C10D_STORE_OP_MULTI_GET:
        return c10d_store_multi_get(s, q->keys, q->nkeys, on_result, w);
    case C10D_STORE_OP_MULTI_SET:
        return c10d_store_multi_set(s, q->keys, q->values, q->lens, q->nkeys, on_result, w);
    case C10D_STORE_OP_QUEUE_PUSH:
        return c10d_store_queue_push(s, q->key, q->value, q->len, on_result, w);
    case C10D_STORE_OP_QUEUE_POP:
        return c10d_store_queue_pop(s, q->key, q->block, on_result, w);
    case C10D_STORE_OP_QUEUE_LEN:
        return c10d_store_queue_len(s, q->key, on_result, w);
    case C10D_STORE_OP_LIST_KEYS:
        return c10d_store_list_keys(s, on_result, w);
    case C10D_STORE_OP_SERVER_STATS:
        return c10d_store_server_stats(s, on_result, w);
    case C10D_STORE_OP_PING:
        return c10d_store_ping(s, on_result, w);
    }
    return c10d__fail(C10D_EINVAL, "store submit: unknown op %d", (int)q->op);
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
    if ((unsigned)q.op >= sizeof op_names / sizeof op_names[0])
        return c10d__fail(C10D_EINVAL, "store submit: unknown op %d", (int)q.op);
    struct stored_result *sr = calloc(1, sizeof *sr);
    if (sr == NULL)
        return c10d__fail(C10D_ENOMEM, "store submit: out of memory");
    char what[64];
    snprintf(what, sizeof what, "store %s", op_names[q.op]);
    c10d_work *w;
    int rc = c10d__work_create(&w, what, 0);
    if (rc != 0) {
        free(sr);
        return rc;
    }
    c10d__work_set_payload(w, &payload_kind, sr, stored_result_free);
    c10d_work_retain(w); /* the callback's */
    rc = start(s, &q, w);
    if (rc != 0) {
        /* Rejected: nothing calls back. Completing it takes it off the
         * engine's pending list before the last reference goes. */
        c10d__work_complete(w, rc, "%s", c10d_last_error());
        c10d_work_release(w);
        c10d_work_release(w);
        return rc;
    }
    *work = w;
    return 0;
}

const c10d_store_result *c10d_store_work_result(c10d_work *work)
{
    struct stored_result *sr = c10d__work_payload(work, &payload_kind);
    if (sr == NULL || c10d_work_test(work) != 1)
        return NULL;
    return &sr->res;
}
