/* Failure news between the ranks of a group, through the group's store.
 *
 * A rank whose group fails for a reason of its own (a timeout, an async
 * error, a launch that failed, an abort) writes the reason under one key of
 * the group's store, first writer wins. While a rank has ops or an init in
 * flight, its loop looks at that key every C10D_NCCL_PEER_CHECK_MS; once it
 * finds it, it fails its own group with the writer's status and words, which
 * aborts its communicators. So a rank never sits in a collective whose peer
 * is gone until its own timeout, and its error names the rank that failed
 * first. A healthy group costs nothing here when idle and one store CHECK
 * per interval while busy. A plain destroy writes nothing: its peers' last
 * ops may still be finishing, and they did not fail. */
#include "nccl_impl.h"

#include "engine/env.h"
#include "engine/log.h"
#include "engine/loop.h"
#include "store_server/client/store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char key_name[] = "nccl/error";

static void publish_done(c10d_work *w, int status, void *arg)
{
    (void)status;
    const c10d_store_result *r = c10d_store_work_result(w);
    struct nccl_state *s = arg;
    if (r->status != 0)
        C10D_WARN("nccl", "[PG %s Rank %d] could not tell the other ranks of the failure: %s",
                  s->name, s->rank, r->message);
    s->publishing = 0;
    if (s->after_publish != NULL) {
        void (*then)(void *) = s->after_publish;
        s->after_publish = NULL;
        then(s->after_publish_arg);
    }
    atomic_fetch_sub(&s->pending_calls, 1);
    s->up->maybe_free(s);
}

void c10d__nccl_peer_error_publish(struct nccl_state *s)
{
    uv_mutex_lock(&s->mutex);
    int publish = s->publish_pending;
    s->publish_pending = 0;
    uv_mutex_unlock(&s->mutex);
    if (!publish)
        return;
    /* "<status> <rank> <words>": enough for a peer to fail the same way. */
    char value[640];
    int n = snprintf(value, sizeof value, "%d %d %s", s->first_status, s->rank, s->first_error);
    if (n < 0)
        return;
    size_t len = (size_t)n < sizeof value ? (size_t)n : sizeof value - 1;
    atomic_fetch_add(&s->pending_calls, 1);
    s->publishing = 1;
    c10d_store_request q = {.struct_size = sizeof q,
                            .op = C10D_STORE_OP_COMPARE_SET,
                            .key = key_name,
                            .expected = "",
                            .value = value,
                            .len = len};
    if (c10d__store_call(s->store, &q, publish_done, s) != 0) {
        s->publishing = 0;
        atomic_fetch_sub(&s->pending_calls, 1);
        C10D_WARN("nccl", "[PG %s Rank %d] could not tell the other ranks of the failure: %s",
                  s->name, s->rank, c10d_last_error());
    }
}

static void got_error(c10d_work *w, int op_status, void *arg)
{
    (void)op_status;
    const c10d_store_result *r = c10d_store_work_result(w);
    struct nccl_state *s = arg;
    atomic_fetch_sub(&s->pending_calls, 1);
    if (r->status == 0 && !s->closing && !atomic_load(&s->poisoned)) {
        char text[640];
        size_t len = r->data.len < sizeof text - 1 ? r->data.len : sizeof text - 1;
        memcpy(text, r->data.data, len);
        text[len] = '\0';
        int status = 0, rank = -1, off = 0;
        if (sscanf(text, "%d %d %n", &status, &rank, &off) < 2 || status >= 0)
            status = C10D_EABORTED, off = 0;
        C10D_WARN("nccl", "[PG %s Rank %d] rank %d failed the group: %s", s->name, s->rank, rank,
                  text + off);
        char why[800];
        snprintf(why, sizeof why, "[PG %s Rank %d] rank %d failed: %s", s->name, s->rank, rank,
                 text + off);
        s->up->peer_failed(s, status, why);
    }
    s->peer_check_busy = 0;
    s->up->maybe_free(s);
}

static void checked(c10d_work *w, int status, void *arg)
{
    (void)status;
    const c10d_store_result *r = c10d_store_work_result(w);
    struct nccl_state *s = arg;
    if (r->status == 0 && r->value == 1 && !s->closing) {
        c10d_store_request q = {.struct_size = sizeof q, .op = C10D_STORE_OP_GET, .key = key_name};
        if (c10d__store_call(s->store, &q, got_error, s) == 0)
            return; /* the GET's callback ends this check */
    }
    atomic_fetch_sub(&s->pending_calls, 1);
    s->peer_check_busy = 0;
    s->up->maybe_free(s);
}

void c10d__nccl_peer_error_poll(struct nccl_state *s)
{
    int64_t every = c10d__env_int(C10D_ENV_NCCL_PEER_CHECK_MS);
    if (every <= 0 || s->peer_check_busy || s->closing || atomic_load(&s->poisoned))
        return;
    uint64_t now = c10d__now_ms();
    if (s->peer_checked_ms == 0)
        s->peer_checked_ms = now; /* the first look comes one interval in */
    if (now - s->peer_checked_ms < (uint64_t)every)
        return;
    s->peer_checked_ms = now;
    const char *keys[1] = {key_name};
    s->peer_check_busy = 1;
    atomic_fetch_add(&s->pending_calls, 1);
    c10d_store_request q = {
        .struct_size = sizeof q, .op = C10D_STORE_OP_CHECK, .keys = keys, .nkeys = 1};
    if (c10d__store_call(s->store, &q, checked, s) != 0) {
        atomic_fetch_sub(&s->pending_calls, 1);
        s->peer_check_busy = 0;
    }
}
