/* The process-group object: allocation, references, op records, and the
 * registry of live groups (what c10d_shutdown ends and what a forked child
 * marks as inherited). The group layer's other files build on this one; of
 * them it calls only pg_store.c (releasing the group's stores). */
#include "pg.h"

#include "engine/block_cache.h"
#include "engine/error.h"
#include "engine/loop.h"
#include "engine/work.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define ENDED_BY_FORK                                                                              \
    "was inherited from the parent process across fork(); a child creates its own groups"

static uv_once_t registry_once = UV_ONCE_INIT;
static uv_mutex_t registry_mutex;
static c10d_pg *groups; /* live groups, newest first */

/* A forked child keeps copies of the parent's groups, whose backends and
 * stores live on the parent's loop: they are marked ended. */
static void registry_fork_prepare(void)
{
    uv_mutex_lock(&registry_mutex);
}

static void registry_fork_parent(void)
{
    uv_mutex_unlock(&registry_mutex);
}

static void registry_fork_child(void)
{
    /* Taken by the forking thread in prepare, the child's only thread. */
    uv_mutex_unlock(&registry_mutex);
    for (c10d_pg *g = groups; g != NULL; g = g->next_group) {
        uv_mutex_init(&g->mutex);
        uv_cond_init(&g->idle_cond);
        g->inherited = 1;
        g->ended_by = ENDED_BY_FORK;
        g->state = C10D_PG_CLOSED;
        atomic_store(&g->pending, 0);
    }
}

static void registry_init(void)
{
    uv_mutex_init(&registry_mutex);
    /* The outermost lock: held while a group's is taken (its end at
     * c10d_shutdown), and a group's while an op is posted, its work made and
     * recorded. At a fork it must be taken before all of theirs, and
     * prepare handlers run in the reverse order of registration: theirs
     * are registered first (each once; a no-op if it was already). */
    c10d__engine_init();
    c10d__work_init();
    c10d__fr_init();
    c10d__pg_fr_init();
    pthread_atfork(registry_fork_prepare, registry_fork_parent, registry_fork_child);
}

void c10d__pg_registry_lock(void)
{
    uv_once(&registry_once, registry_init);
    uv_mutex_lock(&registry_mutex);
}

void c10d__pg_registry_unlock(void)
{
    uv_mutex_unlock(&registry_mutex);
}

c10d_pg *c10d__pg_registry_head(void)
{
    return groups;
}

static void registry_add(c10d_pg *pg)
{
    c10d__pg_registry_lock();
    pg->next_group = groups;
    groups = pg;
    c10d__pg_registry_unlock();
}

static void registry_remove(c10d_pg *pg)
{
    c10d__pg_registry_lock();
    for (c10d_pg **p = &groups; *p != NULL; p = &(*p)->next_group)
        if (*p == pg) {
            *p = pg->next_group;
            break;
        }
    c10d__pg_registry_unlock();
}

/* Records whose copied arrays fit this many bytes (those of groups up to 8
 * ranks) come from the thread's cache of blocks, all of one size. */
#define OP_BLOCK_EXTRA 256

struct c10d__pg_op *c10d__pg_op_new(c10d_pg *pg, int dev, size_t extra_bytes)
{
    int cached;
    /* Zeroed by assignment: a memset right after the allocation would be
     * turned into calloc by the compiler, which skips every cache. */
    struct c10d__pg_op *po = c10d__block_take_fit(
        C10D__BLOCK_OP_RECORD, sizeof *po + OP_BLOCK_EXTRA, sizeof *po + extra_bytes, &cached);
    if (po == NULL) {
        c10d__fail(C10D_ENOMEM, "%s: out of memory", pg->backend_name);
        return NULL;
    }
    *po = (struct c10d__pg_op){.pg = pg, .dev = dev, .storage = po + 1, .cached = cached};
    memset(po + 1, 0, extra_bytes);
    return po;
}

void c10d__pg_op_free(struct c10d__pg_op *po)
{
    while (po != NULL) {
        struct c10d__pg_op *next = po->next_in_list;
        c10d__block_give(C10D__BLOCK_OP_RECORD, po, po->cached);
        po = next;
    }
}

void c10d__pg_ref(c10d_pg *pg)
{
    atomic_fetch_add(&pg->refs, 1);
}

static void pg_free(c10d_pg *pg)
{
    registry_remove(pg);
    c10d__pg_fr_forget(pg);
    if (!pg->inherited) {
        for (int d = 0; d < C10D__PG_NDEV; d++)
            c10d__pg_store_release(pg->backends[d].store);
        c10d__pg_store_release(pg->store);
        c10d__pg_store_release(pg->base_store);
    }
    c10d__pg_op_free(pg->coal_head);
    free(pg->what_prefix);
    free(pg->global_ranks);
    free(pg->name);
    free(pg->desc);
    free((char *)pg->nccl_opts.net_name);
    free((char *)pg->nccl_opts.comm_name);
    free(pg->first_error);
    uv_cond_destroy(&pg->idle_cond);
    uv_mutex_destroy(&pg->mutex);
    free(pg);
}

void c10d__pg_unref(c10d_pg *pg)
{
    if (atomic_fetch_sub(&pg->refs, 1) == 1)
        pg_free(pg);
}

int c10d__pg_alloc(const char *name, const char *desc, int rank, int size, int global_rank,
                   const int *global_ranks, int64_t timeout_ms, c10d_pg **out)
{
    c10d_pg *pg = calloc(1, sizeof *pg);
    if (pg == NULL)
        return c10d__fail(C10D_ENOMEM, "process group: out of memory");
    uv_mutex_init(&pg->mutex);
    uv_cond_init(&pg->idle_cond);
    atomic_init(&pg->refs, 1);
    pg->rank = rank;
    pg->size = size;
    pg->global_rank = global_rank;
    pg->timeout_ms = timeout_ms;
    pg->device_index = -1;
    pg->nccl_opts.struct_size = sizeof pg->nccl_opts;
    pg->name = strdup(name);
    pg->desc = strdup(desc != NULL ? desc : "undefined");
    /* Interned only for a recorder that records: with it off, no group
     * leaves its names behind. */
    if (c10d__fr_enabled())
        pg->fr_names = c10d__fr_names_intern(name, desc != NULL ? desc : "undefined");
    int n = size > 0 ? size : 0;
    pg->global_ranks = calloc((size_t)n + 1, sizeof(int));
    if (pg->name == NULL || pg->desc == NULL || pg->global_ranks == NULL) {
        pg_free(pg);
        return c10d__fail(C10D_ENOMEM, "process group: out of memory");
    }
    for (int i = 0; i < n; i++)
        pg->global_ranks[i] = global_ranks != NULL ? global_ranks[i] : i;
    strcpy(pg->backend_name_buf, "c10d");
    pg->backend_name = pg->backend_name_buf;
    registry_add(pg);
    *out = pg;
    return 0;
}
