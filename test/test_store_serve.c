/* c10d_store_tcp_serve: a store server any program starts in-process, on a
 * free port, served until stopped or until c10d_shutdown; and
 * c10d_store_clone through it. Real sockets. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "c10d.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

static int connect_to(int port, int64_t timeout_ms, c10d_store **out)
{
    c10d_store_tcp_opts o = C10D_STORE_TCP_OPTS_INIT;
    o.timeout_ms = timeout_ms;
    return c10d_store_tcp_connect("127.0.0.1", port, &o, out);
}

static void test_serve_and_stop(void **state)
{
    (void)state;
    c10d_store_server *srv = NULL;
    int port = 0;
    assert_int_equal(c10d_store_tcp_serve("127.0.0.1", 0, &srv, &port), 0);
    assert_non_null(srv);
    assert_true(port > 0 && port < 65536);

    c10d_store *a = NULL, *b = NULL;
    assert_int_equal(connect_to(port, 5000, &a), 0);
    assert_int_equal(connect_to(port, 5000, &b), 0);
    assert_int_equal(c10d_store_set_sync(a, "k", "v1", 2), 0);
    const char *keys[] = {"k"};
    assert_int_equal(c10d_store_wait_sync(b, keys, 1, 5000), 0);
    int64_t n = -1;
    assert_int_equal(c10d_store_add_sync(b, "count", 5, &n), 0);
    assert_int_equal(n, 5);

    /* The port is taken: a second server there fails, naming why. */
    c10d_store_server *again = NULL;
    assert_true(c10d_store_tcp_serve("127.0.0.1", port, &again, NULL) < 0);
    assert_null(again);
    assert_non_null(strstr(c10d_last_error(), "in use"));

    c10d_store_release(a);
    c10d_store_release(b);
    assert_int_equal(c10d_store_server_stop(srv), 0);
    /* Gone: a client cannot connect within its deadline. */
    c10d_store *late = NULL;
    assert_true(connect_to(port, 300, &late) < 0);
    assert_null(late);
}

struct waiter {
    c10d_store *store;
    int rc;
};

static void wait_for_x(void *p)
{
    struct waiter *w = p;
    const char *keys[] = {"x"};
    w->rc = c10d_store_wait_sync(w->store, keys, 1, 10000);
}

/* A clone is the same store over a connection of its own: a thread blocked in
 * a WAIT on it leaves the original free (one request at a time per
 * connection). A prefix store's clone keeps its prefix; an in-process store
 * is its own clone. */
static void test_clone(void **state)
{
    (void)state;
    c10d_store_server *srv = NULL;
    int port = 0;
    assert_int_equal(c10d_store_tcp_serve("127.0.0.1", 0, &srv, &port), 0);
    c10d_store *a = NULL, *c = NULL;
    assert_int_equal(connect_to(port, 5000, &a), 0);
    assert_int_equal(c10d_store_clone(a, &c), 0);
    assert_true(c != a);
    struct waiter w = {c, -1};
    uv_thread_t th;
    assert_int_equal(uv_thread_create(&th, wait_for_x, &w), 0);
    usleep(100 * 1000); /* the WAIT is on the clone's wire */
    assert_int_equal(c10d_store_set_sync(a, "x", "1", 1), 0);
    uv_thread_join(&th);
    assert_int_equal(w.rc, 0);

    c10d_store *pa = NULL, *pc = NULL;
    assert_int_equal(c10d_store_prefix(a, "grp", &pa), 0);
    assert_int_equal(c10d_store_set_timeout(pa, 1234), 0);
    assert_int_equal(c10d_store_clone(pa, &pc), 0);
    assert_int_equal(c10d_store_timeout(pc), 1234);
    assert_int_equal(c10d_store_set_sync(pc, "k", "v", 1), 0);
    const char *keys[] = {"grp/k"};
    int ready = 0;
    assert_int_equal(c10d_store_check_sync(a, keys, 1, &ready), 0);
    assert_int_equal(ready, 1);

    c10d_store *h = NULL, *hc = NULL;
    assert_int_equal(c10d_store_hash_create(&h), 0);
    assert_int_equal(c10d_store_clone(h, &hc), 0);
    assert_ptr_equal(h, hc);
    c10d_store_release(hc);
    c10d_store_release(h);
    assert_int_equal(c10d_store_clone(NULL, &hc), C10D_EINVAL);

    c10d_store_release(pc);
    c10d_store_release(pa);
    c10d_store_release(c);
    c10d_store_release(a);
    assert_int_equal(c10d_store_server_stop(srv), 0);
}

static void test_shutdown_stops_it(void **state)
{
    (void)state;
    c10d_store_server *srv = NULL;
    int port = 0;
    assert_int_equal(c10d_store_tcp_serve(NULL, 0, &srv, &port), 0);
    c10d_store *a = NULL;
    assert_int_equal(connect_to(port, 5000, &a), 0);
    c10d_store_release(a);
    assert_int_equal(c10d_shutdown(), 0);
    /* The engine took the server with it; stop only frees the handle. */
    assert_int_equal(c10d_store_server_stop(srv), 0);
    c10d_store *late = NULL;
    assert_true(connect_to(port, 300, &late) < 0);
}

static void test_bad_arguments(void **state)
{
    (void)state;
    c10d_store_server *srv = (c10d_store_server *)0x1;
    assert_int_equal(c10d_store_tcp_serve(NULL, 70000, &srv, NULL), C10D_EINVAL);
    assert_null(srv);
    assert_non_null(strstr(c10d_last_error(), "70000"));
    assert_int_equal(c10d_store_tcp_serve(NULL, 0, NULL, NULL), C10D_EINVAL);
    assert_int_equal(c10d_store_server_stop(NULL), 0);
}

static int teardown(void **state)
{
    (void)state;
    c10d_shutdown();
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_serve_and_stop, teardown),
        cmocka_unit_test_teardown(test_clone, teardown),
        cmocka_unit_test_teardown(test_shutdown_stops_it, teardown),
        cmocka_unit_test_teardown(test_bad_arguments, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
