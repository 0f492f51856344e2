/* Settings that change the wire must match on every rank: one set on a
 * single rank fails c10d_pg_init on every rank at once (well before the
 * group's timeout), naming the variable and both values; local tuning and a
 * variable set to its default on one rank only do not. */
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
#include <unistd.h>

struct setting_case {
    const char *name;
    const char *value;    /* set on the last rank only */
    const char *expected; /* in every rank's message; NULL: init must succeed */
};

static int settings_main(int rank, int n, void *arg)
{
    const struct setting_case *c = arg;
    if (rank == n - 1)
        setenv(c->name, c->value, 1);
    c10d_pg_opts po = {0};
    po.timeout_ms = 120000; /* the harness's 40 s alarm fires long before */
    c10d_pg *pg = NULL;
    int rc = c10d_pg_init(&po, &pg);
    if (c->expected == NULL) {
        MP_CHECK(rc == 0, "init with %s=%s on rank 1: %s", c->name, c->value, c10d_last_error());
        float v = 1.0f;
        MP_CHECK(c10d_all_reduce_sync(pg, &v, &v, 1, C10D_FLOAT32, C10D_SUM) == 0 && v == 2.0f,
                 "all_reduce: %s", c10d_last_error());
        c10d_pg_destroy(pg);
        c10d_shutdown();
        return 0;
    }
    const char *why = c10d_last_error();
    fprintf(stderr, "rank %d: %s\n", rank, why);
    MP_CHECK(rc == C10D_EINVAL, "init should fail with EINVAL, got %s (%s)", c10d_status_name(rc),
             why);
    MP_CHECK(strstr(why, c->name) != NULL, "message does not name %s: %s", c->name, why);
    MP_CHECK(strstr(why, c->expected) != NULL, "message lacks '%s': %s", c->expected, why);
    MP_CHECK(c10d_is_initialized() == 0, "a failed init left a default group");
    c10d_shutdown();
    return 0;
}

static void run_case(const struct setting_case *c, int nranks)
{
    struct mp_opts o = {0};
    o.nranks = nranks;
    o.timeout_s = 40;
    struct mp_result res;
    mp_run(&o, settings_main, (void *)c, &res);
    assert_false(res.timed_out);
    for (int r = 0; r < nranks; r++)
        assert_int_equal(res.codes[r], 0);
}

static const struct setting_case mismatches[] = {
    {"C10D_DEBUG", "DETAIL", "is not DETAIL on rank 0 but DETAIL on rank 1"},
    {"TORCH_DISTRIBUTED_DEBUG", "DETAIL", "C10D_DEBUG (or TORCH_DISTRIBUTED_DEBUG) is not DETAIL"},
    {"C10D_TCP_LAZY_INIT", "1", "is auto on rank 0 but 1 on rank 1"},
    {"C10D_TCP_EAGER_MAX", "1024", "is 65536 on rank 0 but 1024 on rank 1"},
    {"C10D_TCP_RD_MAX", "65536", "is 32768 on rank 0 but 65536 on rank 1"},
    {"C10D_TCP_RING_MIN", "2097152", "is 1048576 on rank 0 but 2097152 on rank 1"},
    {"C10D_TCP_SEGMENT", "262144", "is 524288 on rank 0 but 262144 on rank 1"},
    {"C10D_TCP_CUDA_SEGMENT", "0", "is 4194304 on rank 0 but 0 on rank 1"},
    {"C10D_NCCL_RANKS_PER_ROOT", "64", "is 128 on rank 0 but 64 on rank 1"},
};

static void test_each_wire_setting_must_match(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof mismatches / sizeof mismatches[0]; i++) {
        fprintf(stderr, "-- %s=%s on rank 1 only\n", mismatches[i].name, mismatches[i].value);
        run_case(&mismatches[i], 2);
    }
}

/* A default group made again in one job meets rank 0's store, still up,
 * holding the first check's keys: the second check must not pass on them. */
static int reinit_main(int rank, int n, void *arg)
{
    (void)arg;
    c10d_pg_opts po = {0};
    po.timeout_ms = 120000;
    c10d_pg *pg = NULL;
    MP_CHECK(c10d_pg_init(&po, &pg) == 0, "first init: %s", c10d_last_error());
    MP_CHECK(c10d_pg_destroy(pg) == 0, "destroy: %s", c10d_last_error());
    if (rank == n - 1)
        setenv("C10D_TCP_RD_MAX", "1024", 1);
    else
        usleep(300000); /* the differing rank writes its verdict last */
    int rc = c10d_pg_init(&po, &pg);
    const char *why = c10d_last_error();
    fprintf(stderr, "rank %d: second init: %s\n", rank, why);
    MP_CHECK(rc == C10D_EINVAL, "second init should fail, got %s (%s)", c10d_status_name(rc), why);
    MP_CHECK(strstr(why, "C10D_TCP_RD_MAX is 32768 on rank 0 but 1024 on rank") != NULL, "%s", why);
    c10d_shutdown();
    return 0;
}

static void test_second_init_checks_again(void **state)
{
    (void)state;
    struct mp_opts o = {0};
    o.nranks = 2;
    o.timeout_s = 40;
    struct mp_result res;
    mp_run(&o, reinit_main, NULL, &res);
    assert_false(res.timed_out);
    assert_int_equal(res.codes[0], 0);
    assert_int_equal(res.codes[1], 0);
}

/* Rank 1 agrees with rank 0 and still fails, with rank 2's difference. */
static void test_agreeing_ranks_fail_too(void **state)
{
    (void)state;
    static const struct setting_case c = {"C10D_TCP_RING_MIN", "4096",
                                          "is 1048576 on rank 0 but 4096 on rank 2"};
    run_case(&c, 3);
}

/* The default spelled out on one rank is no difference; local tuning may differ. */
static void test_defaults_and_local_settings_pass(void **state)
{
    (void)state;
    static const struct setting_case ok[] = {
        {"C10D_TCP_RD_MAX", "32768", NULL},
        {"C10D_DEBUG", "INFO", NULL},
        {"C10D_TCP_SOCKET_BUFFER", "0", NULL},
        {"C10D_LOOP_SPIN_US", "0", NULL},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        fprintf(stderr, "-- %s=%s on rank 1 only\n", ok[i].name, ok[i].value);
        run_case(&ok[i], 2);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_each_wire_setting_must_match),
        cmocka_unit_test(test_agreeing_ranks_fail_too),
        cmocka_unit_test(test_second_init_checks_again),
        cmocka_unit_test(test_defaults_and_local_settings_pass),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
