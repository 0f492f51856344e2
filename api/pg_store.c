/* The store steps of group creation: the rendezvous, the group's prefixed
 * stores and the store-based barrier, through the public store calls. */
#include "pg.h"

#include "engine/error.h"

#include <stdlib.h>
#include <string.h>

int c10d__pg_rendezvous(const char *url, int rank, int world_size, int64_t timeout_ms,
                        c10d_store **store, int *rank_out, int *world_size_out)
{
    c10d_rendezvous_opts ro;
    memset(&ro, 0, sizeof ro);
    ro.timeout_ms = timeout_ms;
    ro.no_barrier = 1; /* ours comes after the backend connected, as torch's */
    ro.rank = world_size > 0 ? rank : -1;
    ro.world_size = world_size > 0 ? world_size : 0;
    c10d_rendezvous_result res;
    memset(&res, 0, sizeof res);
    C10D_CHECK(c10d_rendezvous(url, &ro, &res));
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
