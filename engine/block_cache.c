/* Per-thread caches of freed blocks (block_cache.h). */
#include "block_cache.h"
#include "tls.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#if defined(__SANITIZE_ADDRESS__)
#define BLOCK_CACHE_OFF 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define BLOCK_CACHE_OFF 1
#endif
#endif

#ifndef BLOCK_CACHE_OFF

/* Blocks kept per kind and thread: enough for an op in flight while the
 * next is made, and its work held by the caller. */
#define DEPTH 4

struct thread_cache {
    void *blocks[C10D__BLOCK_KINDS][DEPTH];
    unsigned char n[C10D__BLOCK_KINDS];
    unsigned char registered; /* 1: its exit frees the blocks; 2: keeps none */
};

static _Thread_local C10D__TLS_HOT struct thread_cache cache;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;
static pthread_key_t exit_key;
static int key_made;

static void free_at_exit(void *arg)
{
    struct thread_cache *c = arg;
    for (int k = 0; k < C10D__BLOCK_KINDS; k++) {
        while (c->n[k] > 0)
            free(c->blocks[k][--c->n[k]]);
    }
    /* A block put back by a later destructor of this thread is freed at
     * once. */
    c->registered = 2;
}

static void make_key(void)
{
    key_made = pthread_key_create(&exit_key, free_at_exit) == 0;
}

void *c10d__block_take(enum c10d__block_kind kind, size_t size)
{
    if (cache.n[kind] > 0)
        return cache.blocks[kind][--cache.n[kind]];
    return malloc(size);
}

void c10d__block_put(enum c10d__block_kind kind, void *block)
{
    if (block == NULL)
        return;
    if (cache.registered == 0) {
        pthread_once(&key_once, make_key);
        cache.registered = key_made && pthread_setspecific(exit_key, &cache) == 0 ? 1 : 2;
    }
    if (cache.registered == 1 && cache.n[kind] < DEPTH) {
        cache.blocks[kind][cache.n[kind]++] = block;
        return;
    }
    free(block);
}

#else

void *c10d__block_take(enum c10d__block_kind kind, size_t size)
{
    (void)kind;
    return malloc(size);
}

void c10d__block_put(enum c10d__block_kind kind, void *block)
{
    (void)kind;
    free(block);
}

#endif

void *c10d__block_take_fit(enum c10d__block_kind kind, size_t block_size, size_t size, int *cached)
{
    *cached = size <= block_size;
    return *cached ? c10d__block_take(kind, block_size) : malloc(size);
}

void c10d__block_give(enum c10d__block_kind kind, void *block, int cached)
{
    if (cached)
        c10d__block_put(kind, block);
    else
        free(block);
}

void *c10d__block_take_zeroed(enum c10d__block_kind kind, size_t size)
{
    void *block = c10d__block_take(kind, size);
    if (block != NULL)
        memset(block, 0, size);
    return block;
}
