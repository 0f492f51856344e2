/* The store-based barrier of init_process_group (torch's
 * _store_based_barrier): every caller adds itself to one counter key, the
 * last arrival sets "<key>:last_worker", everyone waits for that key, with a
 * progress line every 30 s naming how many ranks arrived. A client-side
 * helper on the blocking store calls, usable on any store.
 *
 * Then every caller that got through counts itself out on "<key>:left", and
 * the one that completes that count deletes the three keys: only then has
 * every participant read them. Nobody else can: a new_group's barrier runs on
 * every rank of the world, members or not, so its members destroying the
 * group know nothing of the others (they deleted "last_worker" under a
 * non-member's WAIT once). A PyTorch rank in the barrier never counts out,
 * so with one the keys stay, as torch leaves them. */
#include "store.h"

#include "engine/log.h"
#include "engine/loop.h"

#include <inttypes.h>
#include <stdio.h>

/* A missing rank (WORLD_SIZE above the ranks started) must show long before
 * the 30-minute default timeout: a warning this often names the count. */
#define BARRIER_LOG_MS 30000

int c10d_store_barrier(c10d_store *store, const char *name, int world_size, int64_t timeout_ms)
{
    if (!store || !name)
        return c10d__fail(C10D_EINVAL, "store barrier: %s is NULL", !store ? "store" : "name");
    if (world_size <= 0)
        return c10d__fail(C10D_EINVAL, "store barrier: world_size must be > 0 (got %d)",
                          world_size);
    if (timeout_ms <= 0)
        timeout_ms = c10d_store_timeout(store);
    char key[512], last[600], left[600];
    snprintf(key, sizeof key, "store_based_barrier_key:%s", name);
    snprintf(last, sizeof last, "%s:last_worker", key);
    snprintf(left, sizeof left, "%s:left", key);
    int64_t joined = 0;
    C10D_CHECK(c10d_store_add_sync(store, key, 1, NULL));
    C10D_CHECK(c10d_store_add_sync(store, key, 0, &joined));
    if (joined == world_size)
        C10D_CHECK(c10d_store_set_sync(store, last, "1", 1));
    /* 30 s + 1 s per thousand ranks between progress lines */
    int64_t interval = BARRIER_LOG_MS + world_size;
    uint64_t start = c10d__now_ms();
    const char *keys[] = {last};
    for (;;) {
        int64_t spent = (int64_t)(c10d__now_ms() - start);
        int64_t slice = timeout_ms - spent < interval ? timeout_ms - spent : interval;
        int rc = slice > 0 ? c10d_store_wait_sync(store, keys, 1, slice) : C10D_ETIMEDOUT;
        if (rc == 0)
            break;
        if (rc != C10D_ETIMEDOUT)
            return rc;
        char err[300];
        snprintf(err, sizeof err, "%s", c10d_last_error());
        c10d_store_add_sync(store, key, 0, &joined);
        spent = (int64_t)(c10d__now_ms() - start);
        if (spent >= timeout_ms)
            return c10d__fail(C10D_ETIMEDOUT,
                              "Timed out initializing process group in store based barrier, for "
                              "key: %s (world_size=%d, num_workers_joined=%" PRId64
                              ", timeout=%" PRId64 " ms error=%s)",
                              key, world_size, joined, timeout_ms, err);
        if (joined > world_size) /* the last arrival never saw its own count */
            C10D_WARN("rendezvous",
                      "%" PRId64 " ranks arrived in the store based barrier (key %s) of %d: "
                      "another job uses this store (the same MASTER_ADDR and MASTER_PORT)?",
                      joined, key, world_size);
        else
            C10D_WARN("rendezvous",
                      "waiting for %" PRId64 " more ranks: %" PRId64
                      " of %d arrived after %.0f s in the store based barrier (key %s, timeout "
                      "%" PRId64 " ms); is WORLD_SIZE the number of ranks started?",
                      world_size - joined, joined, world_size, (double)spent / 1000, key,
                      timeout_ms);
    }
    C10D_DEBUG("rendezvous", "completed store based barrier for key %s with %d nodes", key,
               world_size);
    /* The barrier is passed: a failing clean-up only leaves keys behind. */
    int64_t out = 0;
    if (c10d_store_add_sync(store, left, 1, &out) == 0 && out == world_size) {
        const char *gone[] = {key, last, left};
        for (int i = 0; i < 3; i++)
            c10d_store_delete_key_sync(store, gone[i], NULL);
    }
    return 0;
}
