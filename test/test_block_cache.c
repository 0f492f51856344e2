/* The per-thread block caches (engine/block_cache.h): a block put back is
 * kept from malloc and is the next one taken on that thread, kinds are kept
 * apart, and a thread's blocks are held until it exits, then freed. Under a
 * sanitizer the caches are off (every block malloc'd and freed), and its
 * allocator does not answer mallinfo2: the checks that need the cache skip
 * there. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "engine/block_cache.h"

#include <malloc.h>
#include <pthread.h>
#include <string.h>

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define CACHE_ON 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define CACHE_ON 0
#endif
#endif
#ifndef CACHE_ON
#define CACHE_ON 1
#endif

static void test_put_then_take_reuses(void **state)
{
    (void)state;
    char *p = c10d__block_take(C10D__BLOCK_WORK, 512);
    assert_non_null(p);
    memset(p, 1, 512);
    c10d__block_put(C10D__BLOCK_WORK, p);
    /* Kept from malloc: glibc's own cache would hand this very chunk back. */
    char *other = malloc(512);
    assert_non_null(other);
    if (CACHE_ON)
        assert_ptr_not_equal(other, p);
    free(other);
    char *q = c10d__block_take(C10D__BLOCK_WORK, 512);
    assert_non_null(q);
    if (CACHE_ON)
        assert_ptr_equal(q, p);
    memset(q, 2, 512);
    c10d__block_put(C10D__BLOCK_WORK, q);
    c10d__block_put(C10D__BLOCK_WORK, NULL); /* nothing */
}

static void test_kinds_apart(void **state)
{
    (void)state;
    char *w = c10d__block_take(C10D__BLOCK_WORK, 512);
    assert_non_null(w);
    c10d__block_put(C10D__BLOCK_WORK, w);
    /* The op-record cache is empty: a fresh block, not the work's. */
    char *r = c10d__block_take(C10D__BLOCK_OP_RECORD, 512);
    assert_non_null(r);
    if (CACHE_ON)
        assert_ptr_not_equal(r, w);
    c10d__block_put(C10D__BLOCK_OP_RECORD, r);
    char *w2 = c10d__block_take(C10D__BLOCK_WORK, 512);
    if (CACHE_ON) {
        assert_ptr_equal(w2, w);
        assert_ptr_equal(c10d__block_take(C10D__BLOCK_OP_RECORD, 512), r);
    } else {
        c10d__block_put(C10D__BLOCK_OP_RECORD, c10d__block_take(C10D__BLOCK_OP_RECORD, 512));
    }
    c10d__block_put(C10D__BLOCK_WORK, w2);
    if (CACHE_ON)
        c10d__block_put(C10D__BLOCK_OP_RECORD, r);
}

#define EXIT_BLOCKS 4
#define EXIT_BYTES  (64 * 1024) /* below malloc's mmap threshold: counted in uordblks */

struct exiting {
    void *blocks[EXIT_BLOCKS];
    size_t in_use_after_put; /* malloc's count once the thread put them back */
};

static void *put_and_exit(void *arg)
{
    struct exiting *x = arg;
    for (int i = 0; i < EXIT_BLOCKS; i++)
        c10d__block_put(C10D__BLOCK_WORK, x->blocks[i]);
    x->in_use_after_put = mallinfo2().uordblks;
    return NULL;
}

/* Blocks malloc'd here (the main arena) and put into another thread's
 * cache: its exit hands them back to malloc. */
static void test_thread_exit_frees(void **state)
{
    (void)state;
    if (!CACHE_ON)
        skip();
    struct exiting x;
    for (int i = 0; i < EXIT_BLOCKS; i++) {
        x.blocks[i] = malloc(EXIT_BYTES);
        assert_non_null(x.blocks[i]);
        memset(x.blocks[i], 3, EXIT_BYTES);
    }
    size_t held = mallinfo2().uordblks;
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, put_and_exit, &x), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    size_t after = mallinfo2().uordblks;
    print_message("in use: %zu bytes before the thread, %zu once it put the blocks back, %zu "
                  "after it exited\n",
                  held, x.in_use_after_put, after);
    /* Held by the thread's cache while it ran (its own arena's bookkeeping
     * may add a little)... */
    assert_true(x.in_use_after_put + EXIT_BYTES > held);
    /* All but malloc's bookkeeping of the blocks came back. */
    assert_true(after + (size_t)(EXIT_BLOCKS - 1) * EXIT_BYTES <= held);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_put_then_take_reuses),
        cmocka_unit_test(test_kinds_apart),
        cmocka_unit_test(test_thread_exit_frees),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
