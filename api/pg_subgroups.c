/* Subgroups: c10d_pg_new_group (members' check through the store, or local
 * synchronization), c10d_pg_shrink, c10d_pg_split and the torch helpers built
 * on them (new_subgroups, new_subgroups_by_enumeration). Every rank of the
 * parent calls them in the same order, so group names (creation order) agree;
 * the group's start and end are process_group.c's. */
#include "pg.h"

#include "engine/env.h"
#include "engine/error.h"
#include "engine/log.h"
#include "engine/loop.h"
#include "engine/loop_call.h"
#include "engine/opts.h"
#include "store_server/client/store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

static int format_ranks(char *buf, size_t cap, const int *ranks, int n)
{
    size_t k = 0;
    for (int i = 0; i < n && k + 16 < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%d", i > 0 ? "," : "", ranks[i]);
    return (int)k;
}

static int detail_on(void)
{
    return strcasecmp(c10d__env_str(C10D_ENV_DEBUG), "DETAIL") == 0;
}

/* FNV-1a of the member list: what every rank compares with rank 0's. */
static uint64_t members_hash(const int *global, int n)
{
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < n; i++)
        for (int b = 0; b < 4; b++) {
            h ^= (uint8_t)((uint32_t)global[i] >> (8 * b));
            h *= 1099511628211ull;
        }
    return h ^ (uint64_t)n;
}

/* Every rank of the world creates every group, in the same order: group k
 * must have the same members everywhere. A rank that created its groups in
 * another order would otherwise connect to the wrong peers and hang. World
 * rank 0 publishes its list and its hash; every other rank reads the hash
 * (O(1) store bytes per rank), and the list only to name a difference, which
 * fails that rank at once (its peers then fail when it does not join). With
 * C10D_DEBUG=DETAIL every rank reads every rank's list instead (O(N^2) store
 * bytes), so all of them fail, naming the group and both lists. */
static int check_same_members(c10d_store *base, const char *name, int me, int world_size,
                              const int *global, int n, int64_t timeout)
{
    if (base == NULL || world_size < 2)
        return 0;
    char mine[1024];
    format_ranks(mine, sizeof mine, global, n);
    char prefix[C10D__PG_NAME_MAX + 16];
    snprintf(prefix, sizeof prefix, "%s/members", name);
    if (!detail_on()) {
        char hkey[C10D__PG_NAME_MAX + 24], lkey[C10D__PG_NAME_MAX + 24];
        snprintf(hkey, sizeof hkey, "%s/hash", prefix);
        snprintf(lkey, sizeof lkey, "%s/list", prefix);
        char hash[24];
        snprintf(hash, sizeof hash, "%016llx", (unsigned long long)members_hash(global, n));
        int same = 1;
        if (me == 0) {
            C10D_CHECK(c10d_store_set_sync(base, lkey, mine, strlen(mine)));
            C10D_CHECK(c10d_store_set_sync(base, hkey, hash, strlen(hash)));
        } else {
            void *theirs = NULL;
            size_t len = 0;
            C10D_CHECK(c10d__store_get_within_sync(base, hkey, timeout, &theirs, &len));
            same = len == strlen(hash) && memcmp(theirs, hash, len) == 0;
            free(theirs);
        }
        if (same) {
            /* A read receipt: whoever reads last removes the keys, so groups
             * made and destroyed all day leave nothing behind, and nobody
             * waits for anybody. */
            char skey[C10D__PG_NAME_MAX + 24];
            snprintf(skey, sizeof skey, "%s/seen", prefix);
            int64_t seen = 0;
            C10D_CHECK(c10d_store_add_sync(base, skey, 1, &seen));
            if (seen == world_size) {
                const char *gone[] = {hkey, lkey, skey};
                for (int i = 0; i < 3; i++)
                    c10d_store_delete_key_sync(base, gone[i], NULL);
            }
            return 0;
        }
        void *theirs = NULL;
        size_t len = 0;
        c10d_store_get_sync(base, lkey, &theirs, &len);
        int rc = c10d__fail(C10D_EINVAL,
                            "global rank %d creates group %s with global ranks [%s], but global "
                            "rank 0 creates it with [%.*s]: groups were created in a different "
                            "order (or with different ranks) on different ranks",
                            me, name, mine, (int)(len < 900 ? len : 900),
                            theirs != NULL ? (const char *)theirs : "?");
        free(theirs);
        return rc;
    }
    struct c10d__pg_exchanged got;
    int rc = c10d__pg_store_exchange(base, prefix, me, world_size, mine, strlen(mine), timeout,
                                     NULL, NULL, &got);
    for (int r = 0; r < world_size && rc == 0; r++) {
        if (got.lens[r] == strlen(mine) && memcmp(got.values[r], mine, got.lens[r]) == 0)
            continue;
        rc = c10d__fail(C10D_EINVAL,
                        "global rank %d creates group %s with global ranks [%s], but global "
                        "rank %d creates it with [%.*s]: groups were created in a different "
                        "order (or with different ranks) on different ranks",
                        me, name, mine, r, (int)(got.lens[r] < 900 ? got.lens[r] : 900),
                        (const char *)got.values[r]);
    }
    c10d__pg_exchanged_free(&got);
    return rc;
}

/* Creates a group of `n` members (this rank `my_rank`, -1: not a member)
 * that only its members wait for: split (from `split_from` with `color`,
 * where its backends can) and local groups. */
static int start_members_group(c10d_pg *parent, const char *what, const char *name,
                               const int *global, int n, int my_rank, const c10d_pg_opts *o,
                               const struct c10d__backend_vtable *vts[], c10d_pg *split_from,
                               int color, c10d_pg **out)
{
    int64_t timeout = o->timeout_ms > 0 ? o->timeout_ms : parent->timeout_ms;
    c10d_pg *pg;
    C10D_CHECK(c10d__pg_alloc(name, o->group_desc != NULL ? o->group_desc : parent->desc, my_rank,
                              my_rank >= 0 ? n : -1, parent->global_rank, global, timeout, &pg));
    pg->split_color = color;
    int rc = c10d__pg_set_device_opts(pg, o, parent, what);
    if (rc == 0 && my_rank < 0)
        c10d__pg_set_backend_name(pg, vts);
    if (rc == 0)
        rc = c10d__pg_start(pg, parent->base_store, vts, split_from);
    if (rc == 0 && my_rank >= 0)
        rc = c10d__pg_store_barrier(parent->base_store, name, n, timeout);
    if (rc != 0)
        return c10d__pg_creation_failed(pg, rc, what);
    *out = pg;
    return 0;
}

/* Groups made with use_local_synchronization, by member list: the members
 * name the k-th group of one list alike without asking anyone else. */
struct local_count {
    struct local_count *next;
    uint64_t hash;
    int count;
};
static struct local_count *local_counts; /* under the registry lock */

static uint64_t hash_ranks(const int *global, int n)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (int i = 0; i < n; i++)
        for (int b = 0; b < 4; b++) {
            h ^= (uint8_t)((unsigned)global[i] >> (8 * b));
            h *= 1099511628211ull;
        }
    return h;
}

static int new_local_group(c10d_pg *parent, const int *global, int n, int my_rank,
                           const c10d_pg_opts *o, const struct c10d__backend_vtable *vts[],
                           c10d_pg **out)
{
    static const char what[] = "c10d_pg_new_group";
    if (my_rank < 0) {
        /* torch: a non-member need not call; if it does, it gets a handle. */
        c10d_pg *pg;
        C10D_CHECK(c10d__pg_alloc("local:non-member", o->group_desc, -1, -1, parent->global_rank,
                                  NULL, parent->timeout_ms, &pg));
        c10d__pg_set_backend_name(pg, vts);
        *out = pg;
        return 0;
    }
    uint64_t h = hash_ranks(global, n);
    c10d__pg_registry_lock();
    struct local_count *lc = local_counts;
    while (lc != NULL && lc->hash != h)
        lc = lc->next;
    if (lc == NULL && (lc = calloc(1, sizeof *lc)) != NULL) {
        lc->hash = h;
        lc->next = local_counts;
        local_counts = lc;
    }
    int k = lc != NULL ? lc->count++ : -1;
    c10d__pg_registry_unlock();
    if (k < 0)
        return c10d__fail(C10D_ENOMEM, "%s: out of memory", what);
    char name[64];
    snprintf(name, sizeof name, "local:%016llx.%d", (unsigned long long)h, k);
    /* No split from the parent: its other ranks take no part. */
    return start_members_group(parent, what, name, global, n, my_rank, o, vts, NULL, 0, out);
}

int c10d_pg_new_group(c10d_pg *parent, const int *ranks, int nranks, const c10d_pg_opts *opts,
                      c10d_pg **out)
{
    c10d__pg_registry_once();
    if (out == NULL)
        return c10d__fail(C10D_EINVAL, "c10d_pg_new_group: out is NULL");
    *out = NULL;
    if (parent == NULL)
        return c10d__fail(C10D_EINVAL, "c10d_pg_new_group: parent is NULL");
    c10d_pg_opts o;
    C10D_CHECK(c10d__opts_read(&o, sizeof o, C10D__PG_OPTS_V1_SIZE, opts, "c10d_pg_new_group"));
    opts = &o;
    if (c10d__on_loop_thread())
        return c10d__fail(C10D_EDEADLK,
                          "c10d_pg_new_group blocks: it cannot run inside a callback");
    if (parent->rank < 0)
        return c10d__fail(C10D_EINVAL,
                          "c10d_pg_new_group: this rank is not a member of parent group %s",
                          parent->name);
    if (parent->merged)
        return c10d__fail(C10D_EUNSUPPORTED,
                          "c10d_pg_new_group: group %s was made by c10d_pg_merge_remote: its "
                          "callers share no count of groups made (use c10d_pg_split)",
                          parent->name);
    if (nranks < 0 || (ranks == NULL && nranks > 0))
        return c10d__fail(C10D_EINVAL, "c10d_pg_new_group: invalid ranks list (%p, %d entries)",
                          (const void *)ranks, nranks);
    if (opts != NULL && (opts->store != NULL || opts->init_method != NULL))
        return c10d__fail(C10D_EINVAL,
                          "c10d_pg_new_group: a subgroup uses its parent's store (no store or "
                          "init_method)");
    if (opts != NULL && opts->timeout_ms < 0)
        return c10d__fail(C10D_EINVAL, "c10d_pg_new_group: invalid timeout %lld ms",
                          (long long)opts->timeout_ms);
    int n = nranks > 0 ? nranks : parent->size;
    int *sorted = malloc((size_t)n * sizeof(int));
    int *global = malloc((size_t)n * sizeof(int));
    if (sorted == NULL || global == NULL) {
        free(sorted);
        free(global);
        return c10d__fail(C10D_ENOMEM, "c10d_pg_new_group: out of memory");
    }
    for (int i = 0; i < n; i++)
        sorted[i] = nranks > 0 ? ranks[i] : i;
    qsort(sorted, (size_t)n, sizeof(int), cmp_int);
    int rc = 0, my_rank = -1;
    for (int i = 0; i < n && rc == 0; i++) {
        if (sorted[i] < 0 || sorted[i] >= parent->size)
            rc = c10d__fail(C10D_EINVAL,
                            "c10d_pg_new_group: rank %d is out of range (parent group size %d)",
                            sorted[i], parent->size);
        else if (i > 0 && sorted[i] == sorted[i - 1])
            rc = c10d__fail(C10D_EINVAL, "c10d_pg_new_group: rank %d appears more than once",
                            sorted[i]);
        else {
            global[i] = parent->global_ranks[sorted[i]];
            if (sorted[i] == parent->rank)
                my_rank = i;
        }
    }
    const struct c10d__backend_vtable *vts[C10D__PG_NDEV];
    for (int d = 0; d < C10D__PG_NDEV; d++)
        vts[d] = parent->backends[d].vt;
    if (rc == 0 && opts != NULL && opts->backend != NULL)
        rc = c10d__backend_parse(opts->backend, vts);
    free(sorted);
    if (rc != 0) {
        free(global);
        return rc;
    }
    if (opts->use_local_synchronization) {
        rc = new_local_group(parent, global, n, my_rank, opts, vts, out);
        free(global);
        return rc;
    }
    /* From here the name is taken on every rank: failures are fatal anyway. */
    int world_size;
    int id = c10d__pg_take_group_id(&world_size);
    if (world_size <= 0)
        world_size = parent->size;
    char name[16];
    snprintf(name, sizeof name, "%d", id);
    int64_t timeout = opts != NULL && opts->timeout_ms > 0 ? opts->timeout_ms : parent->timeout_ms;
    rc = check_same_members(parent->base_store, name, parent->global_rank, world_size, global, n,
                            timeout);
    if (rc != 0) {
        free(global);
        char why[1200];
        snprintf(why, sizeof why, "%s", c10d_last_error());
        return c10d__fail(rc, "c10d_pg_new_group: %s", why);
    }
    c10d_pg *pg;
    rc = c10d__pg_alloc(name, opts != NULL ? opts->group_desc : NULL, my_rank,
                        my_rank >= 0 ? n : -1, parent->global_rank, global, timeout, &pg);
    free(global);
    if (rc != 0)
        return rc;
    rc = c10d__pg_set_device_opts(pg, opts, parent, "c10d_pg_new_group");
    if (rc != 0) {
        c10d__pg_unref(pg);
        return rc;
    }
    if (my_rank < 0) {
        /* Keep the members for rank translation, but no backend. */
        c10d__pg_set_backend_name(pg, vts);
    }
    c10d_store *base = parent->base_store;
    rc = c10d__pg_start(pg, base, vts, parent);
    /* The members met in their backends' start; the whole world meets only
     * where asked (torch's TORCH_DIST_INIT_BARRIER), or where DETAIL's
     * exchange needs it before this rank's list can go. */
    int detail = detail_on();
    if (rc == 0 && (detail || c10d__env_bool(C10D_ENV_DIST_INIT_BARRIER)))
        rc = c10d__pg_store_barrier(base, name, world_size, timeout);
    if (rc != 0)
        return c10d__pg_creation_failed(pg, rc, "c10d_pg_new_group");
    if (detail) {
        /* Every rank passed the barrier, so every rank has read every
         * member list: this rank's is no longer needed. */
        char prefix[C10D__PG_NAME_MAX + 16];
        snprintf(prefix, sizeof prefix, "%s/members", name);
        c10d__pg_store_forget(base, prefix, parent->global_rank);
    }
    if (my_rank < 0)
        C10D_INFO("pg", "group %s created; this rank is not a member", name);
    *out = pg;
    return 0;
}

/* What every call run by the parent's members checks first: out and parent
 * given, the options readable, not inside a callback (they block), this
 * rank a member of the parent. */
static int member_call(const char *what, c10d_pg *parent, const c10d_pg_opts *opts, c10d_pg_opts *o,
                       c10d_pg **out)
{
    c10d__pg_registry_once();
    if (out == NULL)
        return c10d__fail(C10D_EINVAL, "%s: out is NULL", what);
    *out = NULL;
    if (parent == NULL)
        return c10d__fail(C10D_EINVAL, "%s: parent is NULL", what);
    C10D_CHECK(c10d__opts_read(o, sizeof *o, C10D__PG_OPTS_V1_SIZE, opts, what));
    if (c10d__on_loop_thread())
        return c10d__fail(C10D_EDEADLK, "%s blocks: it cannot run inside a callback", what);
    if (parent->rank < 0)
        return c10d__fail(C10D_EINVAL, "%s: this rank is not a member of parent group %s", what,
                          parent->name);
    return 0;
}

/* C10D_SHRINK_ABORT: the parent's backends in `mask` are aborted on the loop
 * (their pending works fail with C10D_EABORTED, their buffers are let go);
 * the caller waits for that, bounded by the parent's timeout. */
struct parent_abort {
    c10d_pg *pg; /* holds a reference */
    unsigned mask;
    char why[256];
};

static void parent_abort_release(void *arg)
{
    struct parent_abort *pa = arg;
    c10d__pg_unref(pa->pg);
    free(pa);
}

static void parent_abort_on_loop(struct c10d__loop_call *call, void *arg)
{
    struct parent_abort *pa = arg;
    c10d_pg *pg = pa->pg;
    for (int d = 0; d < C10D__PG_NDEV && !pg->aborted_on_loop; d++)
        if ((pa->mask & (1u << d)) && pg->backends[d].state != NULL)
            pg->backends[d].vt->abort(pg->backends[d].state, C10D_EABORTED, pa->why, NULL, NULL);
    c10d__loop_call_done(call, 0, NULL);
}

static void abort_parent(c10d_pg *parent, unsigned mask)
{
    struct parent_abort *pa = calloc(1, sizeof *pa);
    if (pa == NULL || mask == 0) {
        free(pa);
        return; /* the parent is failed for later calls all the same */
    }
    c10d__pg_ref(parent);
    pa->pg = parent;
    pa->mask = mask;
    snprintf(pa->why, sizeof pa->why,
             "process group %s was aborted by c10d_pg_shrink (C10D_SHRINK_ABORT)", parent->name);
    int abandoned = 0;
    int rc = c10d__loop_call_run(parent_abort_on_loop, pa, parent_abort_release, parent->timeout_ms,
                                 "c10d_pg_shrink: aborting the parent timed out", &abandoned);
    if (!abandoned)
        parent_abort_release(pa);
    if (rc != 0)
        C10D_WARN("pg", "c10d_pg_shrink: aborting group %s: %s", parent->name, c10d_last_error());
}

/* Fails the parent for later calls (C10D_EREVOKED) at once; its backends are
 * aborted only once every survivor has its child (abort_parent after the
 * shrink's barrier): an abort reaches the other ranks (the tcp backend tells
 * its peers why), and a peer whose own child (an ncclCommShrink still
 * initialising from the parent) was not made yet would lose the parent under
 * it. Returns the mask of backends to abort then. */
static unsigned fail_parent(c10d_pg *parent)
{
    uv_mutex_lock(&parent->mutex);
    parent->abort_deferred = 1;
    if (parent->first_status == 0) {
        parent->first_status = C10D_EABORTED;
        free(parent->first_error);
        char why[256];
        snprintf(why, sizeof why,
                 "process group %s was aborted by c10d_pg_shrink (C10D_SHRINK_ABORT)",
                 parent->name);
        parent->first_error = strdup(why);
    }
    uv_mutex_unlock(&parent->mutex);
    unsigned mask = 0;
    for (int d = 0; d < C10D__PG_NDEV; d++)
        if (parent->backends[d].vt != NULL)
            mask |= 1u << d;
    return mask;
}

int c10d_pg_shrink(c10d_pg *parent, const int *excluded, int nexcluded, const c10d_pg_opts *opts,
                   c10d_pg **out)
{
    static const char what[] = "c10d_pg_shrink";
    c10d_pg_opts o;
    C10D_CHECK(member_call(what, parent, opts, &o, out));
    if (nexcluded <= 0 || excluded == NULL)
        return c10d__fail(C10D_EINVAL, "%s: no ranks to exclude (%p, %d entries)", what,
                          (const void *)excluded, nexcluded);
    if (o.store != NULL || o.init_method != NULL || o.backend != NULL)
        return c10d__fail(C10D_EINVAL,
                          "%s: a shrunk group keeps its parent's store and backends (no store, "
                          "init_method or backend)",
                          what);
    if (o.timeout_ms < 0)
        return c10d__fail(C10D_EINVAL, "%s: invalid timeout %lld ms", what,
                          (long long)o.timeout_ms);
    if ((o.shrink_flags & ~C10D_SHRINK_ABORT) != 0)
        return c10d__fail(
            C10D_EINVAL, "%s: unknown shrink_flags 0x%x (C10D_SHRINK_DEFAULT or C10D_SHRINK_ABORT)",
            what, (unsigned)o.shrink_flags);
    unsigned char *gone = calloc((size_t)parent->size, 1);
    int *global = malloc((size_t)parent->size * sizeof(int));
    if (gone == NULL || global == NULL) {
        free(gone);
        free(global);
        return c10d__fail(C10D_ENOMEM, "%s: out of memory", what);
    }
    int rc = 0;
    for (int i = 0; i < nexcluded && rc == 0; i++) {
        int x = excluded[i];
        if (x < 0 || x >= parent->size)
            rc = c10d__fail(C10D_EINVAL, "%s: rank %d is out of range (parent group size %d)", what,
                            x, parent->size);
        else if (gone[x])
            rc = c10d__fail(C10D_EINVAL, "%s: rank %d appears more than once", what, x);
        else if (x == parent->rank)
            rc = c10d__fail(C10D_EINVAL, "%s: rank %d excludes itself (only survivors call it)",
                            what, x);
        else
            gone[x] = 1;
    }
    int n = 0, my_rank = -1;
    for (int r = 0; r < parent->size && rc == 0; r++) {
        if (gone[r])
            continue;
        if (r == parent->rank)
            my_rank = n;
        global[n++] = parent->global_ranks[r];
    }
    free(gone);
    if (rc != 0) {
        free(global);
        return rc;
    }
    const struct c10d__backend_vtable *vts[C10D__PG_NDEV];
    for (int d = 0; d < C10D__PG_NDEV; d++)
        vts[d] = parent->backends[d].vt;
    uv_mutex_lock(&parent->mutex);
    int k = ++parent->shrink_count;
    uv_mutex_unlock(&parent->mutex);
    char name[C10D__PG_NAME_MAX + 1];
    if (snprintf(name, sizeof name, "%s/shrink%d", parent->name, k) >= (int)sizeof name)
        return c10d__fail(C10D_EINVAL,
                          "%s: the name of a group shrunk from %s would exceed %d "
                          "characters (groups nested too deep)",
                          what, parent->name, C10D__PG_NAME_MAX);
    int64_t timeout = o.timeout_ms > 0 ? o.timeout_ms : parent->timeout_ms;
    c10d_pg *pg;
    rc = c10d__pg_alloc(name, o.group_desc != NULL ? o.group_desc : parent->desc, my_rank, n,
                        parent->global_rank, global, timeout, &pg);
    free(global);
    if (rc != 0)
        return rc;
    rc = c10d__pg_set_device_opts(pg, &o, parent, what);
    c10d_store *base = parent->base_store;
    if (rc == 0) {
        pg->base_store = base;
        c10d__pg_store_retain(base);
        c10d__pg_end_at_shutdown();
        char prefix[C10D__PG_NAME_MAX + 2];
        snprintf(prefix, sizeof prefix, "%s/", name);
        rc = c10d__pg_store_prefix(base, prefix, &pg->store);
    }
    int abort = (o.shrink_flags & C10D_SHRINK_ABORT) != 0;
    unsigned abort_mask = 0;
    if (rc == 0 && abort)
        abort_mask = fail_parent(parent);
    if (rc == 0) {
        c10d__pg_set_backend_name(pg, vts);
        rc = c10d__pg_shrink_backends(pg, vts, parent, excluded, nexcluded, o.shrink_flags);
    }
    if (rc == 0)
        rc = c10d__pg_store_barrier(base, name, n, timeout);
    if (rc != 0) {
        rc = c10d__pg_creation_failed(pg, rc, what);
        abort_parent(parent, abort_mask);
        return rc;
    }
    abort_parent(parent, abort_mask);
    c10d__pg_shrunk_default(parent, pg);
    *out = pg;
    return 0;
}

/* ---------------------------------------------------------------- split */

struct split_entry {
    int color, key, parent_rank;
};

/* By color, then MPI_Comm_split's order: key, ties by parent rank. */
static int cmp_split_color(const void *a, const void *b)
{
    const struct split_entry *x = a, *y = b;
    if (x->color != y->color)
        return (x->color > y->color) - (x->color < y->color);
    if (x->key != y->key)
        return (x->key > y->key) - (x->key < y->key);
    return (x->parent_rank > y->parent_rank) - (x->parent_rank < y->parent_rank);
}

/* This rank's new group, through the parent's store, with O(1) requests
 * per rank: every parent rank publishes (color, key); the parent's rank 0
 * alone reads all of them (O(N) at one rank), orders each color MPI's way and
 * publishes each color's members (parent ranks); a rank reads its color's
 * list only (O(group size)). Ranks outside the parent take no part, so no
 * world-wide name or barrier. On return members[0..*n) are this rank's group
 * (*n = 0 without a color); free(*members). */
static int split_exchange(c10d_pg *parent, int k, int color, int key, int64_t timeout,
                          int **members, int *n)
{
    int size = parent->size;
    c10d_store *st = parent->store;
    *members = NULL;
    *n = 0;
    char prefix[32], lkey[48], skey[56];
    snprintf(prefix, sizeof prefix, "split%d", k);
    int32_t mine[2] = {color, key};
    char me_key[48];
    snprintf(me_key, sizeof me_key, "%s/%d", prefix, parent->rank);
    C10D_CHECK(c10d_store_set_sync(st, me_key, mine, sizeof mine));
    if (parent->rank == 0) {
        struct c10d__pg_exchanged got = {0};
        const char **keys = calloc((size_t)size, sizeof *keys);
        char(*names)[48] = calloc((size_t)size, sizeof *names);
        struct split_entry *all = calloc((size_t)size, sizeof *all);
        int *list = malloc((size_t)size * sizeof *list);
        int rc = keys && names && all && list ? 0 : c10d__fail(C10D_ENOMEM, "out of memory");
        for (int r = 0; r < size && rc == 0; r++) {
            snprintf(names[r], sizeof names[r], "%s/%d", prefix, r);
            keys[r] = names[r];
        }
        if (rc == 0)
            rc = c10d_store_wait_sync(st, keys, (size_t)size, timeout);
        if (rc == 0) {
            got = (struct c10d__pg_exchanged){size, calloc((size_t)size, sizeof(void *)),
                                              calloc((size_t)size, sizeof(size_t))};
            rc = got.values && got.lens
                     ? c10d_store_multi_get_sync(st, keys, (size_t)size, got.values, got.lens)
                     : c10d__fail(C10D_ENOMEM, "out of memory");
        }
        for (int r = 0; r < size && rc == 0; r++) {
            int32_t v[2];
            if (got.lens[r] != sizeof v) {
                rc = c10d__fail(C10D_EPROTO, "rank %d's color and key have %zu bytes", r,
                                got.lens[r]);
                break;
            }
            memcpy(v, got.values[r], sizeof v);
            all[r] = (struct split_entry){v[0] < 0 ? -1 : v[0], v[1], r};
            /* Read by this rank alone: gone now (asynchronous). */
            c10d__pg_store_forget(st, prefix, r);
        }
        if (rc == 0) {
            /* Colors in order, each color's members by key then parent rank. */
            qsort(all, (size_t)size, sizeof *all, cmp_split_color);
            for (int a = 0, b; a < size && rc == 0; a = b) {
                for (b = a; b < size && all[b].color == all[a].color; b++)
                    list[b - a] = all[b].parent_rank;
                if (all[a].color < 0)
                    continue;
                snprintf(lkey, sizeof lkey, "%s/c%d", prefix, all[a].color);
                rc = c10d_store_set_sync(st, lkey, list, (size_t)(b - a) * sizeof *list);
            }
        }
        c10d__pg_exchanged_free(&got);
        free(keys);
        free(names);
        free(all);
        free(list);
        if (rc != 0)
            return rc;
    }
    if (color < 0)
        return 0;
    snprintf(lkey, sizeof lkey, "%s/c%d", prefix, color);
    void *v = NULL;
    size_t len = 0;
    C10D_CHECK(c10d__store_get_within_sync(st, lkey, timeout, &v, &len));
    if (len == 0 || len % sizeof(int) != 0 || len / sizeof(int) > (size_t)size) {
        free(v);
        return c10d__fail(C10D_EPROTO, "color %d's member list has %zu bytes", color, len);
    }
    *members = v;
    *n = (int)(len / sizeof(int));
    /* A read receipt: the color's last member to read removes its list. */
    snprintf(skey, sizeof skey, "%s/seen", lkey);
    int64_t seen = 0;
    if (c10d_store_add_sync(st, skey, 1, &seen) == 0 && seen == *n) {
        c10d_store_delete_key_sync(st, lkey, NULL);
        c10d_store_delete_key_sync(st, skey, NULL);
    }
    return 0;
}

int c10d_pg_split(c10d_pg *parent, int color, int key, const c10d_pg_opts *opts, c10d_pg **out)
{
    static const char what[] = "c10d_pg_split";
    c10d_pg_opts o;
    C10D_CHECK(member_call(what, parent, opts, &o, out));
    if (parent->store == NULL)
        return c10d__fail(C10D_EUNSUPPORTED, "%s: parent group %s has no store", what,
                          parent->name);
    if (o.store != NULL || o.init_method != NULL || o.backend != NULL)
        return c10d__fail(C10D_EINVAL,
                          "%s: a split group keeps its parent's store and backends (no store, "
                          "init_method or backend)",
                          what);
    if (o.timeout_ms < 0)
        return c10d__fail(C10D_EINVAL, "%s: invalid timeout %lld ms", what,
                          (long long)o.timeout_ms);
    if (color < 0 && color != C10D_SPLIT_NO_COLOR)
        return c10d__fail(C10D_EINVAL, "%s: invalid color %d (>= 0, or C10D_SPLIT_NO_COLOR)", what,
                          color);
    uv_mutex_lock(&parent->mutex);
    int k = ++parent->split_count;
    uv_mutex_unlock(&parent->mutex);
    int64_t timeout = o.timeout_ms > 0 ? o.timeout_ms : parent->timeout_ms;
    int *members = NULL, n = 0;
    int rc = split_exchange(parent, k, color, key, timeout, &members, &n);
    if (rc != 0) {
        char why[512];
        snprintf(why, sizeof why, "%s", c10d_last_error());
        return c10d__fail(rc, "%s: group %s: exchanging colors: %s", what, parent->name, why);
    }
    int *global = malloc((size_t)(n > 0 ? n : 1) * sizeof(int));
    if (global == NULL) {
        free(members);
        return c10d__fail(C10D_ENOMEM, "%s: out of memory", what);
    }
    int my_rank = -1;
    for (int i = 0; i < n; i++) {
        global[i] = parent->global_ranks[members[i]];
        if (members[i] == parent->rank)
            my_rank = i;
    }
    free(members);
    char name[C10D__PG_NAME_MAX + 1];
    if (snprintf(name, sizeof name, "%s/split%d.%d", parent->name, k, color < 0 ? 0 : color) >=
        (int)sizeof name) {
        free(global);
        return c10d__fail(C10D_EINVAL,
                          "%s: the name of a group split from %s would exceed %d "
                          "characters (groups nested too deep)",
                          what, parent->name, C10D__PG_NAME_MAX);
    }
    const struct c10d__backend_vtable *vts[C10D__PG_NDEV];
    for (int d = 0; d < C10D__PG_NDEV; d++)
        vts[d] = parent->backends[d].vt;
    rc = start_members_group(parent, what, name, global, n, my_rank, &o, vts, parent, color, out);
    free(global);
    return rc;
}

int c10d_pg_new_subgroups(c10d_pg *parent, int group_size, const c10d_pg_opts *opts, c10d_pg **out)
{
    if (out != NULL)
        *out = NULL;
    if (parent == NULL || parent->rank < 0)
        return c10d__fail(C10D_EINVAL, "c10d_pg_new_subgroups: %s",
                          parent == NULL ? "parent is NULL" : "this rank is not a member");
    if (group_size <= 0 || parent->size % group_size != 0)
        return c10d__fail(C10D_EINVAL,
                          "c10d_pg_new_subgroups: the group size %d must divide the parent's %d",
                          group_size, parent->size);
    return c10d_pg_split(parent, parent->rank / group_size, parent->rank, opts, out);
}

int c10d_pg_new_subgroups_by_enumeration(c10d_pg *parent, const int *const *lists, const int *sizes,
                                         int nlists, const c10d_pg_opts *opts, c10d_pg **out)
{
    static const char what[] = "c10d_pg_new_subgroups_by_enumeration";
    if (out != NULL)
        *out = NULL;
    if (parent == NULL || parent->rank < 0)
        return c10d__fail(C10D_EINVAL, "%s: %s", what,
                          parent == NULL ? "parent is NULL" : "this rank is not a member");
    if (nlists <= 0 || lists == NULL || sizes == NULL)
        return c10d__fail(C10D_EINVAL, "%s: no lists", what);
    int *owner = malloc((size_t)parent->size * sizeof(int));
    if (owner == NULL)
        return c10d__fail(C10D_ENOMEM, "%s: out of memory", what);
    for (int r = 0; r < parent->size; r++)
        owner[r] = -1;
    int rc = 0;
    for (int l = 0; l < nlists && rc == 0; l++) {
        if (sizes[l] <= 0 || lists[l] == NULL) {
            rc = c10d__fail(C10D_EINVAL, "%s: list %d is empty", what, l);
            break;
        }
        for (int i = 0; i < sizes[l] && rc == 0; i++) {
            int r = lists[l][i];
            if (r < 0 || r >= parent->size)
                rc = c10d__fail(C10D_EINVAL, "%s: rank %d in list %d is out of range (size %d)",
                                what, r, l, parent->size);
            else if (owner[r] >= 0)
                rc = c10d__fail(C10D_EINVAL, "%s: rank %d is in list %d and in list %d", what, r,
                                owner[r], l);
            else
                owner[r] = l;
        }
    }
    int color = rc == 0 && owner[parent->rank] >= 0 ? owner[parent->rank] : C10D_SPLIT_NO_COLOR;
    free(owner);
    if (rc != 0)
        return rc;
    /* Ranks in ascending order within each subgroup, as torch's new_group. */
    return c10d_pg_split(parent, color, parent->rank, opts, out);
}
