/* The store-based barrier of init_process_group (torch's
 * _store_based_barrier): every caller adds itself to one counter key, the
 * last arrival sets "<key>:last_worker", everyone waits for that key, with a
 * progress line every 30 s naming how many ranks arrived. A client-side
 * helper on the blocking store calls, usable on any store.
 *
 * On a TCP store in the current dialect whose server runs BARRIER (ours;
 * PyTorch's newest), one BARRIER request on the counter key does the adding
 * and the waiting: the server counts the arrival and answers every caller
 * once the count reaches world_size (two round trips fewer per rank). It
 * waits for the first progress interval only; past it the caller, already
 * counted, goes on as above (WAIT for "last_worker"), and every caller that
 * got through a BARRIER sets "last_worker" before counting out, so callers
 * of either kind (a PyTorch rank that ADDs) get through.
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
#include <string.h>

/* A missing rank (WORLD_SIZE above the ranks started) must show long before
 * the 30-minute default timeout: a warning this often names the count. */
#define BARRIER_LOG_MS 30000
/* The probe's counter; deleted again at once. */
#define PROBE_KEY "c10d_barrier_probe"

/* One BARRIER request: 0 passed, else its status (c10d_last_error set). */
static int barrier_request(c10d_store *s, const char *key, int64_t n, int64_t timeout_ms)
{
    struct c10d__wire_str k = {(const uint8_t *)key, strlen(key)};
    struct c10d__store_op *op;
    C10D_CHECK(c10d__store_op_new(&op, C10D_STORE_BARRIER, &k, 1, n));
    return c10d__store_op_run_sync(s, op, timeout_ms, NULL);
}

int c10d__store_has_barrier(c10d_store *s)
{
    c10d_store *root = c10d__store_root(s);
    if (root == NULL || strcmp(c10d_store_kind(root), "tcp") != 0 ||
        c10d_store_dialect_of(root) != C10D_DIALECT_CURRENT)
        return 0;
    int known = atomic_load(&root->barrier_cmd);
    if (known != 0)
        return known > 0;
    /* One participant: answered at once by a server that has BARRIER. A
     * server without it closes the connection (the next op reconnects). */
    int64_t t = c10d_store_timeout(root) < 5000 ? c10d_store_timeout(root) : 5000;
    int rc = barrier_request(root, PROBE_KEY, 1, t);
    if (rc == 0)
        c10d_store_delete_key_sync(root, PROBE_KEY, NULL);
    else
        C10D_DEBUG("store", "store barrier: the server does not run BARRIER (%s); using ADD + WAIT",
                   c10d_last_error());
    atomic_store(&root->barrier_cmd, rc == 0 ? 1 : -1);
    return rc == 0;
}

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
    /* 30 s + 1 s per thousand ranks between progress lines */
    int64_t interval = BARRIER_LOG_MS + world_size;
    uint64_t start = c10d__now_ms();
    int passed = 0;
    if (c10d__store_has_barrier(store)) {
        int rc =
            barrier_request(store, key, world_size, timeout_ms < interval ? timeout_ms : interval);
        if (rc != 0 && rc != C10D_ETIMEDOUT)
            return rc;
        passed = rc == 0;
        if (!passed) { /* counted: wait for "last_worker" as below */
            C10D_CHECK(c10d_store_add_sync(store, key, 0, &joined));
            C10D_WARN("rendezvous",
                      "waiting for %" PRId64 " more ranks: %" PRId64
                      " of %d arrived after %.0f s in the store based barrier (key %s, timeout "
                      "%" PRId64 " ms); is WORLD_SIZE the number of ranks started?",
                      world_size - joined, joined, world_size,
                      (double)(c10d__now_ms() - start) / 1000, key, timeout_ms);
        }
    } else {
        C10D_CHECK(c10d_store_add_sync(store, key, 1, NULL));
        C10D_CHECK(c10d_store_add_sync(store, key, 0, &joined));
    }
    if (passed || joined == world_size)
        C10D_CHECK(c10d_store_set_sync(store, last, "1", 1));
    const char *keys[] = {last};
    while (!passed) {
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
