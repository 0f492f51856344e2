/* c10d_pg_merge_remote (torch's ProcessGroup.merge_remote_group): processes
 * from groups that share nothing but a store they all reach form one new
 * group. Every caller takes the next merged rank from a counter in that
 * store (arrival order, as torch), publishes the size it asked for and
 * checks the others' before any backend starts, so a size mismatch or a
 * missing caller fails every caller within the timeout instead of hanging a
 * backend's connect. The new group's keys live under "merged/" in the store;
 * the counter and the sizes stay (one merge per store, as torch). */
#include "pg.h"

#include "engine/error.h"
#include "engine/log.h"
#include "engine/loop.h"
#include "engine/opts.h"
#include "store_server/client/store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MERGE_TCP_DEFAULT_TIMEOUT_MS (30 * 60 * 1000) /* torch's default for the call */
#define RANK_KEY                     "mergeGroupRank" /* torch's key */
#define SIZE_PREFIX                  "mergeGroupSize/"
#define GROUP_PREFIX                 "merged/"
#define POLL_MS                      20

static const char what[] = "c10d_pg_merge_remote";

/* The size merged rank r asked for: 1 and *asked set, 0 when it has not
 * published it yet, or an error. */
static int read_size(c10d_store *st, int r, int *asked)
{
    char key[48];
    snprintf(key, sizeof key, SIZE_PREFIX "%d", r);
    const char *keys[] = {key};
    int ready = 0;
    C10D_CHECK(c10d_store_check_sync(st, keys, 1, &ready));
    if (!ready)
        return 0;
    size_t len = 0;
    char buf[24];
    C10D_CHECK(c10d__store_get_text_sync(st, key, buf, sizeof buf, &len));
    char *end = NULL;
    long n = strtol(buf, &end, 10);
    if (len == 0 || end == NULL || *end != '\0' || n <= 0 || n > 1 << 30)
        return c10d__fail(C10D_EPROTO, "merged rank %d published a malformed size '%s' under %s", r,
                          buf, key);
    *asked = (int)n;
    return 1;
}

/* Takes this caller's merged rank and waits, bounded by timeout_ms, until
 * the first `size` callers have published the same size. */
static int agree(c10d_store *st, int size, int64_t timeout_ms, int *rank_out)
{
    int64_t ticket = 0;
    C10D_CHECK(c10d_store_add_sync(st, RANK_KEY, 1, &ticket));
    int rank = (int)(ticket - 1);
    char key[48], mine[24];
    snprintf(key, sizeof key, SIZE_PREFIX "%d", rank);
    snprintf(mine, sizeof mine, "%d", size);
    /* Published even by a caller that will fail: the others name it. */
    C10D_CHECK(c10d_store_set_sync(st, key, mine, strlen(mine)));
    uint64_t deadline = c10d__now_ns() + (uint64_t)timeout_ms * 1000000u;
    int checked = 0;
    for (;;) {
        /* The first callers' sizes, in order, as far as they are there. */
        int limit = size < rank ? size : rank;
        while (checked < size) {
            int asked = 0;
            int got = read_size(st, checked, &asked);
            if (got < 0)
                return got;
            if (got == 0)
                break;
            if (asked != size)
                return c10d__fail(C10D_EINVAL,
                                  "size mismatch: this caller (merged rank %d) asks for a group "
                                  "of %d, merged rank %d asked for %d",
                                  rank, size, checked, asked);
            checked++;
        }
        if (rank >= size && checked >= limit)
            return c10d__fail(C10D_EINVAL,
                              "this caller arrived as number %d for a group of %d: more callers "
                              "than the size (every caller of a merge through this store must "
                              "ask for the same size; use a fresh store for another merge)",
                              rank + 1, size);
        if (checked == size) {
            *rank_out = rank;
            return 0;
        }
        if (c10d__now_ns() >= deadline) {
            int64_t arrived = 0;
            c10d_store_add_sync(st, RANK_KEY, 0, &arrived);
            return c10d__fail(C10D_ETIMEDOUT,
                              "only %lld of %d ranks arrived in the store within %lld ms (this "
                              "caller is merged rank %d)",
                              (long long)arrived, size, (long long)timeout_ms, rank);
        }
        uv_sleep(POLL_MS);
    }
}

static int check_args(c10d_pg *parent, c10d_store *store, int size, const c10d_pg_opts *o)
{
    if (store == NULL)
        return c10d__fail(C10D_EINVAL, "%s: store is NULL", what);
    if (size <= 0)
        return c10d__fail(C10D_EINVAL, "%s: invalid size %d", what, size);
    if (o->store != NULL || o->init_method != NULL || o->backend != NULL)
        return c10d__fail(C10D_EINVAL,
                          "%s: the merged group keeps its parent's backends and uses the store "
                          "argument (no store, init_method or backend in opts)",
                          what);
    if (o->timeout_ms < 0)
        return c10d__fail(C10D_EINVAL, "%s: invalid timeout %lld ms", what,
                          (long long)o->timeout_ms);
    if (o->group_name != NULL &&
        (o->group_name[0] == '\0' || strlen(o->group_name) > C10D__PG_NAME_MAX))
        return c10d__fail(C10D_EINVAL, "%s: group_name must have 1 to %d characters", what,
                          C10D__PG_NAME_MAX);
    if (o->group_name == NULL && strlen(parent->name) + 6 > C10D__PG_NAME_MAX)
        return c10d__fail(C10D_EINVAL,
                          "%s: the default name \"%s:merge\" would exceed %d "
                          "characters: pass a group_name",
                          what, parent->name, C10D__PG_NAME_MAX);
    return 0;
}

int c10d_pg_merge_remote(c10d_pg *parent, c10d_store *store, int size, const c10d_pg_opts *opts,
                         c10d_pg **out)
{
    c10d__pg_registry_once();
    if (out == NULL)
        return c10d__fail(C10D_EINVAL, "%s: out is NULL", what);
    *out = NULL;
    if (parent == NULL)
        return c10d__fail(C10D_EINVAL, "%s: parent is NULL", what);
    c10d_pg_opts o;
    C10D_CHECK(c10d__opts_read(&o, sizeof o, C10D__PG_OPTS_V1_SIZE, opts, what));
    if (c10d__on_loop_thread())
        return c10d__fail(C10D_EDEADLK, "%s blocks: it cannot run inside a callback", what);
    if (parent->rank < 0)
        return c10d__fail(C10D_EINVAL, "%s: this rank is not a member of parent group %s", what,
                          parent->name);
    C10D_CHECK(check_args(parent, store, size, &o));
    int64_t timeout = o.timeout_ms > 0 ? o.timeout_ms : MERGE_TCP_DEFAULT_TIMEOUT_MS;
    int rank = -1;
    int rc = agree(store, size, timeout, &rank);
    if (rc != 0) {
        char why[512];
        snprintf(why, sizeof why, "%s", c10d_last_error());
        return c10d__fail(rc, "%s: group %s: %s", what, parent->name, why);
    }
    char name[C10D__PG_NAME_MAX + 1], desc[C10D__PG_NAME_MAX + 16];
    snprintf(name, sizeof name, "%s", o.group_name != NULL ? o.group_name : parent->name);
    if (o.group_name == NULL)
        snprintf(name + strlen(name), sizeof name - strlen(name), ":merge");
    if (o.group_desc != NULL)
        snprintf(desc, sizeof desc, "%s", o.group_desc);
    else
        snprintf(desc, sizeof desc, "%.*s:merge", C10D__PG_NAME_MAX,
                 parent->desc != NULL ? parent->desc : "");
    c10d_pg *pg;
    /* Its own numbering: no default group spans the callers. */
    C10D_CHECK(c10d__pg_alloc(name, desc, rank, size, rank, NULL, timeout, &pg));
    pg->merged = 1;
    pg->wire_name = "merged"; /* the callers' names may differ (torch's do) */
    const struct c10d__backend_vtable *vts[C10D__PG_NDEV];
    for (int d = 0; d < C10D__PG_NDEV; d++)
        vts[d] = parent->backends[d].vt;
    rc = c10d__pg_set_device_opts(pg, &o, parent, what);
    if (rc == 0) {
        pg->base_store = store;
        c10d__pg_store_retain(store);
        c10d__pg_end_at_shutdown();
        rc = c10d__pg_store_prefix(store, GROUP_PREFIX, &pg->store);
    }
    /* The callers come from different jobs: a differing wire setting (tcp
     * thresholds, lazy connections, DETAIL) would hang the backends. */
    c10d_store *settings = NULL;
    if (rc == 0)
        rc = c10d__pg_store_prefix(pg->store, "c10d_settings/", &settings);
    if (rc == 0)
        rc = c10d__pg_settings_check_in(settings, rank, size, timeout);
    c10d__pg_store_release(settings);
    if (rc == 0) {
        c10d__pg_set_backend_name(pg, vts);
        rc = c10d__pg_create_backends(pg, vts, NULL);
    }
    if (rc != 0)
        return c10d__pg_creation_failed(pg, rc, what);
    C10D_INFO("pg", "group %s merged through a store: rank %d of %d, backend %s", name, rank, size,
              pg->backend_name);
    *out = pg;
    return 0;
}
