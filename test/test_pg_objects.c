/* Object collectives with strings of 0 bytes, 1 byte and 1 MiB mixed across
 * ranks: every rank gets every byte, in rank order; real processes, tcp. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "c10d.h"
#include "mp_harness.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static size_t len_of(int who)
{
    static const size_t lens[] = {0, 1, (size_t)1 << 20};
    return lens[who % 3];
}

static unsigned char byte_of(int who, size_t i)
{
    return (unsigned char)(who * 31 + i * 7);
}

/* A malloc'd string of len_of(who) bytes. */
static c10d_bytes make(int who)
{
    c10d_bytes b = {malloc(len_of(who) + 1), len_of(who)};
    for (size_t i = 0; i < b.len; i++)
        ((unsigned char *)b.data)[i] = byte_of(who, i);
    return b;
}

static int same(const c10d_bytes *b, int who)
{
    if (b->len != len_of(who) || b->data == NULL)
        return 0;
    for (size_t i = 0; i < b->len; i++)
        if (((unsigned char *)b->data)[i] != byte_of(who, i))
            return 0;
    return 1;
}

static int objects_main(int rank, int n, void *arg)
{
    (void)arg;
    c10d_pg_opts po = {0};
    po.timeout_ms = 60000;
    c10d_pg *pg = NULL;
    MP_CHECK(c10d_pg_init(&po, &pg) == 0, "init: %s", c10d_last_error());
    c10d_bytes mine = make(rank);
    c10d_bytes all[8];

    MP_CHECK(c10d_all_gather_object(pg, mine.data, mine.len, all, NULL) == 0,
             "all_gather_object: %s", c10d_last_error());
    for (int r = 0; r < n; r++)
        MP_CHECK(same(&all[r], r), "all_gather_object: rank %d's object (%zu bytes)", r,
                 all[r].len);
    c10d_bytes_free(all, n);

    memset(all, 0, sizeof all);
    MP_CHECK(c10d_gather_object(pg, mine.data, mine.len, rank == 2 ? all : NULL, 2, NULL) == 0,
             "gather_object: %s", c10d_last_error());
    for (int r = 0; r < n && rank == 2; r++)
        MP_CHECK(same(&all[r], r), "gather_object: rank %d's object", r);
    c10d_bytes_free(all, rank == 2 ? n : 0);

    c10d_bytes list[3];
    for (int i = 0; i < 3; i++)
        list[i] = rank == 1 ? make(i + 3) : (c10d_bytes){NULL, 0};
    MP_CHECK(c10d_broadcast_object_list(pg, list, 3, 1, NULL) == 0, "broadcast_object_list: %s",
             c10d_last_error());
    for (int i = 0; i < 3; i++)
        MP_CHECK(same(&list[i], i + 3), "broadcast_object_list: object %d (%zu bytes)", i,
                 list[i].len);
    c10d_bytes_free(list, 3);

    c10d_bytes in[8], out = {NULL, 0};
    for (int r = 0; r < n; r++)
        in[r] = make(r + 6);
    MP_CHECK(c10d_scatter_object_list(pg, rank == 0 ? in : NULL, &out, 0, NULL) == 0,
             "scatter_object_list: %s", c10d_last_error());
    MP_CHECK(same(&out, rank + 6), "scatter_object_list: %zu bytes", out.len);
    c10d_bytes_free(&out, 1);
    c10d_bytes_free(in, n);

    if (rank == 0) {
        c10d_bytes send[3] = {make(2), make(0), make(1)};
        MP_CHECK(c10d_send_object_list(pg, send, 3, 2, NULL) == 0, "send_object_list: %s",
                 c10d_last_error());
        c10d_bytes_free(send, 3);
    } else if (rank == 2) {
        c10d_bytes got[3];
        MP_CHECK(c10d_recv_object_list(pg, got, 3, 0, NULL) == 0, "recv_object_list: %s",
                 c10d_last_error());
        MP_CHECK(same(&got[0], 2) && same(&got[1], 0) && same(&got[2], 1),
                 "recv_object_list: %zu, %zu, %zu bytes", got[0].len, got[1].len, got[2].len);
        c10d_bytes_free(got, 3);
    }
    /* The root's own bad argument: it fails, and tells the others, who fail
     * at once instead of at the timeout. */
    c10d_bytes bad[1] = {{NULL, 5}};
    int rc = c10d_broadcast_object_list(pg, bad, 1, 1, NULL);
    MP_CHECK(rc == C10D_EINVAL, "a bad root object list: %s", c10d_status_name(rc));
    if (rank != 1)
        MP_CHECK(strstr(c10d_last_error(), "rank 1 rejected its own arguments") != NULL,
                 "message: %s", c10d_last_error());
    /* A bad argument fails that call only. */
    MP_CHECK(c10d_broadcast_object_list(pg, list, 3, 7, NULL) == C10D_EINVAL, "root 7 accepted");
    MP_CHECK(c10d_barrier_sync(pg) == 0, "barrier after the bad call: %s", c10d_last_error());
    c10d_bytes_free(&mine, 1);
    c10d_pg_destroy(pg);
    c10d_shutdown();
    return 0;
}

static void test_object_collectives_mixed_sizes(void **state)
{
    (void)state;
    struct mp_opts o = {0};
    o.nranks = 3;
    o.timeout_s = 60;
    o.kill_on_failure = 1;
    struct mp_result res;
    mp_run(&o, objects_main, NULL, &res);
    assert_false(res.timed_out);
    for (int r = 0; r < 3; r++)
        assert_int_equal(res.codes[r], 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_object_collectives_mixed_sizes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
