/* The store steps of a group's life: the rendezvous, the group's prefixed
 * stores and the store-based barrier at creation, the key sweep at its end,
 * all through the public store calls. */
#include "pg.h"

#include "api/attempt.h"
#include "engine/error.h"
#include "engine/loop.h"
#include "store_server/client/store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int c10d__pg_rendezvous(const char *url, int rank, int world_size, int64_t timeout_ms,
                        c10d_store **store, int *rank_out, int *world_size_out,
                        int *store_outlives_job)
{
    c10d_rendezvous_opts ro;
    memset(&ro, 0, sizeof ro);
    ro.timeout_ms = timeout_ms;
    ro.no_barrier = 1; /* ours comes after the backend connected, as torch's */
    ro.rank = world_size > 0 ? rank : -1;
    ro.world_size = world_size > 0 ? world_size : 0;
    c10d_rendezvous_result res;
    memset(&res, 0, sizeof res);
    C10D_CHECK(c10d__rendezvous(url, &ro, &res, store_outlives_job));
    *store = res.store;
    *rank_out = res.rank;
    *world_size_out = res.world_size;
    return 0;
}

int c10d__pg_store_prefix(c10d_store *base, const char *prefix, c10d_store **out)
{
    if (base == NULL) {
        *out = NULL;
        return 0;
    }
    return c10d_store_prefix(base, prefix, out);
}

void c10d__pg_store_retain(c10d_store *store)
{
    if (store != NULL)
        c10d_store_retain(store);
}

void c10d__pg_store_release(c10d_store *store)
{
    if (store != NULL)
        c10d_store_release(store);
}

int c10d__pg_store_barrier(c10d_store *store, const char *name, int world_size, int64_t timeout_ms)
{
    if (store == NULL)
        return 0;
    return c10d_store_barrier(store, name, world_size, timeout_ms);
}

/* The group's store keys (each rank's published address) are garbage once
 * every rank destroyed it: each rank counts itself out, and the last one
 * deletes them, so a long job that creates and destroys
 * many groups does not grow the store. The requests go out asynchronously;
 * destroy then waits a moment for their answers (c10d__pg_sweep_flush), since
 * a program commonly exits right after it and would otherwise take them
 * along. A rank that aborts (or never gets here) leaves them: on a store
 * that outlives the job, the next job's rank 0 deletes them (attempt.c).
 * PyTorch keeps them; nothing reads them after creation. The creation
 * barrier's keys are not the group's: non-members take part in it too, and
 * the barrier deletes them itself once all have passed. */
struct c10d__pg_sweep_flush {
    uv_mutex_t mu;
    uv_cond_t answered;
    int pending; /* requests not answered yet */
    int refs;    /* the waiter's, and one per pending request */
};

static struct c10d__pg_sweep_flush *flush_new(void)
{
    struct c10d__pg_sweep_flush *f = calloc(1, sizeof *f);
    if (f == NULL)
        return NULL;
    if (uv_mutex_init(&f->mu) != 0) {
        free(f);
        return NULL;
    }
    if (uv_cond_init(&f->answered) != 0) {
        uv_mutex_destroy(&f->mu);
        free(f);
        return NULL;
    }
    f->refs = 1;
    return f;
}

static void flush_unref_locked(struct c10d__pg_sweep_flush *f)
{
    int last = --f->refs == 0;
    uv_mutex_unlock(&f->mu);
    if (last) {
        uv_cond_destroy(&f->answered);
        uv_mutex_destroy(&f->mu);
        free(f);
    }
}

static void flush_add(struct c10d__pg_sweep_flush *f)
{
    uv_mutex_lock(&f->mu);
    f->pending++;
    f->refs++;
    uv_mutex_unlock(&f->mu);
}

static void flush_done(struct c10d__pg_sweep_flush *f)
{
    uv_mutex_lock(&f->mu);
    if (--f->pending == 0)
        uv_cond_broadcast(&f->answered);
    flush_unref_locked(f);
}

void c10d__pg_sweep_flush(struct c10d__pg_sweep_flush *f, int64_t ms)
{
    if (f == NULL)
        return;
    uint64_t deadline = c10d__now_ns() + (uint64_t)(ms > 0 ? ms : 0) * 1000000u;
    uv_mutex_lock(&f->mu);
    while (f->pending > 0) {
        uint64_t now = c10d__now_ns();
        if (now >= deadline)
            break;
        uv_cond_timedwait(&f->answered, &f->mu, deadline - now);
    }
    flush_unref_locked(f);
}

struct key_sweep {
    c10d_store *group;
    c10d_store *dev[C10D__PG_NDEV];
    const char *fmt[C10D__PG_NDEV];
    int size;
    struct c10d__pg_sweep_flush *flush;
};

struct sweep_delete_req {
    c10d_store *store;
    struct c10d__pg_sweep_flush *flush;
};

static void sweep_deleted(c10d_work *w, int status, void *arg)
{
    (void)w;
    (void)status;
    struct sweep_delete_req *d = arg;
    c10d_store_release(d->store);
    flush_done(d->flush);
    free(d);
}

static void sweep_delete(c10d_store *s, const char *key, struct c10d__pg_sweep_flush *flush)
{
    struct sweep_delete_req *d = malloc(sizeof *d);
    if (d == NULL)
        return;
    d->store = s;
    d->flush = flush;
    c10d_store_retain(s);
    flush_add(flush);
    c10d_store_request q = {.struct_size = sizeof q, .op = C10D_STORE_OP_DELETE_KEY, .key = key};
    if (c10d__store_call(s, &q, sweep_deleted, d) != 0) {
        c10d_store_release(s);
        flush_done(flush);
        free(d);
    }
}

static void on_counted_out(c10d_work *w, int status, void *arg)
{
    struct key_sweep *k = arg;
    const c10d_store_result *res = w != NULL ? c10d_store_work_result(w) : NULL;
    if (status == 0 && res != NULL && res->value == k->size) {
        char key[600];
        sweep_delete(k->group, "destroyed_ranks", k->flush);
        for (int d = 0; d < C10D__PG_NDEV; d++)
            for (int r = 0; k->dev[d] != NULL && r < k->size; r++) {
                snprintf(key, sizeof key, k->fmt[d], r);
                sweep_delete(k->dev[d], key, k->flush);
            }
    }
    c10d_store_release(k->group);
    for (int d = 0; d < C10D__PG_NDEV; d++)
        if (k->dev[d] != NULL)
            c10d_store_release(k->dev[d]);
    flush_done(k->flush);
    free(k);
}

struct c10d__pg_sweep_flush *c10d__pg_sweep_keys(c10d_pg *pg)
{
    if (pg->rank < 0 || pg->store == NULL)
        return NULL;
    struct key_sweep *k = calloc(1, sizeof *k);
    struct c10d__pg_sweep_flush *flush = flush_new();
    if (k == NULL || flush == NULL) {
        free(k);
        c10d__pg_sweep_flush(flush, 0);
        return NULL;
    }
    k->group = pg->store;
    k->size = pg->size;
    k->flush = flush;
    flush_add(flush); /* the count below */
    c10d_store_retain(k->group);
    for (int d = 0; d < C10D__PG_NDEV; d++) {
        const struct c10d__pg_backend *b = &pg->backends[d];
        if (b->vt != NULL && b->vt->published_key_fmt != NULL && b->store != NULL) {
            k->dev[d] = b->store;
            k->fmt[d] = b->vt->published_key_fmt;
            c10d_store_retain(b->store);
        }
    }
    c10d_store_request q = {
        .struct_size = sizeof q, .op = C10D_STORE_OP_ADD, .key = "destroyed_ranks", .delta = 1};
    if (c10d__store_call(pg->store, &q, on_counted_out, k) != 0)
        on_counted_out(NULL, C10D_EABORTED, k);
    return flush;
}

/* ------------------------------------------------------------- exchange */

void c10d__pg_exchanged_free(struct c10d__pg_exchanged *x)
{
    for (int r = 0; x->values != NULL && r < x->n; r++)
        free(x->values[r]);
    free(x->values);
    free(x->lens);
    *x = (struct c10d__pg_exchanged){0};
}

/* How long each slice of a wait that may give up lasts. */
#define GIVE_UP_SLICE_MS 200

int c10d__pg_store_exchange(c10d_store *s, const char *prefix, int me, int n, const void *mine,
                            size_t len, int64_t timeout_ms, int (*give_up)(void *arg), void *arg,
                            struct c10d__pg_exchanged *out)
{
    *out = (struct c10d__pg_exchanged){n, calloc((size_t)n, sizeof(void *)),
                                       calloc((size_t)n, sizeof(size_t))};
    char(*names)[C10D__PG_NAME_MAX + 40] = calloc((size_t)n, sizeof *names);
    const char **keys = calloc((size_t)n, sizeof *keys);
    int rc = 0;
    if (names == NULL || keys == NULL || out->values == NULL || out->lens == NULL)
        rc = c10d__fail(C10D_ENOMEM, "out of memory");
    for (int r = 0; r < n && rc == 0; r++) {
        snprintf(names[r], sizeof names[r], "%s/%d", prefix, r);
        keys[r] = names[r];
    }
    if (rc == 0)
        rc = c10d_store_set_sync(s, keys[me], mine, len);
    if (rc == 0 && give_up == NULL)
        rc = c10d_store_wait_sync(s, keys, (size_t)n, timeout_ms);
    for (uint64_t end = c10d__now_ms() + (uint64_t)timeout_ms; rc == 0 && give_up != NULL;) {
        uint64_t now = c10d__now_ms();
        int64_t slice = now >= end ? 1 : (int64_t)(end - now);
        rc = c10d_store_wait_sync(s, keys, (size_t)n,
                                  slice < GIVE_UP_SLICE_MS ? slice : GIVE_UP_SLICE_MS);
        if (rc != C10D_ETIMEDOUT || c10d__now_ms() >= end)
            break;
        rc = give_up(arg);
    }
    if (rc == 0)
        rc = c10d_store_multi_get_sync(s, keys, (size_t)n, out->values, out->lens);
    if (rc != 0)
        c10d__pg_exchanged_free(out);
    free(keys);
    free(names);
    return rc;
}

void c10d__pg_store_forget(c10d_store *s, const char *prefix, int me)
{
    char key[C10D__PG_NAME_MAX + 40];
    snprintf(key, sizeof key, "%s/%d", prefix, me);
    c10d_store_request q = {.struct_size = sizeof q, .op = C10D_STORE_OP_DELETE_KEY, .key = key};
    c10d__store_call(s, &q, NULL, NULL);
}
