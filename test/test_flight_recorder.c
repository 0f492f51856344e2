/* The flight recorder and c10d-fr (docs/debugging.md): the ring (wrap-around,
 * off, record ids), a dump on request, a real hang (3 ranks on tcp, rank 1
 * skips an all_reduce, the others time out) where every rank must dump, the
 * skipping one through the store signal, and the real c10d-fr binary must
 * name rank 1 and the op; and c10d-fr flagging a dtype mismatch in crafted
 * PyTorch-style dumps. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "c10d.h"
#include "engine/flight_recorder.h"
#include "mp_harness.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[256];

static int setup_dir(void **s)
{
    (void)s;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/c10d_fr_test_XXXXXX");
    return mkdtemp(tmpdir) != NULL ? 0 : -1;
}

static int remove_dir(void **s)
{
    (void)s;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static int file_exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0;
}

/* Runs the c10d-fr binary; returns its exit status, output in *out. */
static int run_fr(const char *args, char **out)
{
    const char *exe = getenv("C10D_FR_EXE");
    if (exe == NULL)
        exe = "c10d-fr";
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s %s 2>&1", exe, args);
    FILE *p = popen(cmd, "r");
    if (p == NULL)
        return -1;
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    size_t k;
    while (buf != NULL && (k = fread(buf + len, 1, cap - 1 - len, p)) > 0)
        len += k;
    if (buf != NULL)
        buf[len] = '\0';
    int st = pclose(p);
    *out = buf;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* ------------------------------------------------------------- the ring */

static struct c10d__fr_op op_of(uint64_t seq)
{
    struct c10d__fr_op o = {
        .pg_name = "0",
        .pg_desc = "default_pg",
        .backend = "tcp",
        .op = "all_reduce",
        .coll_seq = seq,
        .op_id = seq,
        .in_numel = 4,
        .out_numel = 4,
        .in_tensors = 1,
        .out_tensors = 1,
        .dtype = C10D_FLOAT32,
        .root = -1,
        .peer = -1,
        .timeout_ms = 1000,
    };
    return o;
}

static void test_ring(void **s)
{
    (void)s;
    setenv("C10D_TRACE_BUFFER_SIZE", "4", 1);
    c10d__fr_reset();
    assert_int_equal(c10d__fr_capacity(), 4);
    uint64_t rid[6];
    for (int i = 0; i < 6; i++) {
        struct c10d__fr_op o = op_of((uint64_t)i + 1);
        rid[i] = c10d__fr_record(&o);
        assert_int_equal(rid[i], (uint64_t)i + 1); /* record id + 1 */
    }
    assert_int_equal(c10d__fr_next_id(), 6);
    /* Records 0 and 1 were overwritten: marking them must not touch 4 and 5. */
    c10d__fr_completed(rid[0], 0);
    c10d__fr_started(rid[1]);
    c10d__fr_started(rid[4]);
    c10d__fr_completed(rid[5], 0);
    c10d__fr_completed(rid[3], C10D_ETIMEDOUT);
    int ranks[2] = {0, 1};
    c10d__fr_register_pg("0", "default_pg", ranks, 2, 0);
    char path[512];
    snprintf(path, sizeof path, "%s/ring.json", tmpdir);
    assert_int_equal(c10d_flight_recorder_dump(path), 0);
    json_error_t err;
    json_t *root = json_load_file(path, 0, &err);
    assert_non_null(root);
    assert_string_equal(json_string_value(json_object_get(root, "version")), "2.4");
    assert_non_null(json_object_get(root, "nccl_comm_state"));
    assert_string_equal(json_string_value(json_object_get(
                            json_object_get(json_object_get(root, "pg_config"), "0"), "ranks")),
                        "[0, 1]");
    json_t *es = json_object_get(root, "entries");
    assert_int_equal(json_array_size(es), 4);
    static const char *states[4] = {"scheduled", "scheduled", "started", "completed"};
    for (size_t i = 0; i < 4; i++) {
        json_t *e = json_array_get(es, i);
        assert_int_equal(json_integer_value(json_object_get(e, "record_id")), (json_int_t)i + 2);
        assert_int_equal(json_integer_value(json_object_get(e, "collective_seq_id")),
                         (json_int_t)i + 3);
        assert_string_equal(json_string_value(json_object_get(e, "state")), states[i]);
        assert_string_equal(json_string_value(json_object_get(e, "profiling_name")),
                            "tcp:all_reduce");
        assert_string_equal(
            json_string_value(json_array_get(json_object_get(e, "input_dtypes"), 0)), "Float");
    }
    /* The timed-out one: retired, not completed, no completion time. */
    json_t *e3 = json_array_get(es, 1);
    assert_true(json_is_true(json_object_get(e3, "retired")));
    assert_true(json_is_null(json_object_get(e3, "time_discovered_completed_ns")));
    assert_true(json_is_false(json_object_get(json_array_get(es, 2), "retired")));
    assert_true(json_is_number(json_object_get(json_array_get(es, 3), "duration_ms")));
    json_decref(root);

    /* In memory, only the ops not completed (3 of the 4), then after a
     * reset nothing until a new op. */
    char *text = NULL;
    assert_int_equal(c10d_flight_recorder_dump_json(1, &text), 0);
    root = json_loads(text, 0, &err);
    free(text);
    assert_non_null(root);
    assert_int_equal(json_array_size(json_object_get(root, "entries")), 3);
    json_decref(root);
    assert_int_equal(c10d_flight_recorder_reset(), 0);
    assert_int_equal(c10d_flight_recorder_dump_json(0, &text), 0);
    root = json_loads(text, 0, &err);
    free(text);
    assert_int_equal(json_array_size(json_object_get(root, "entries")), 0);
    assert_non_null(json_object_get(json_object_get(root, "pg_config"), "0")); /* groups stay */
    json_decref(root);
    struct c10d__fr_op later = op_of(7);
    c10d__fr_record(&later);
    assert_int_equal(c10d_flight_recorder_dump_json(0, &text), 0);
    root = json_loads(text, 0, &err);
    free(text);
    assert_int_equal(json_array_size(json_object_get(root, "entries")), 1);
    json_decref(root);
    assert_int_equal(c10d_flight_recorder_dump_json(0, NULL), C10D_EINVAL);

    /* Off: nothing recorded, the public dump says why. */
    setenv("C10D_TRACE_BUFFER_SIZE", "0", 1);
    c10d__fr_reset();
    assert_int_equal(c10d__fr_capacity(), 0);
    struct c10d__fr_op o = op_of(1);
    assert_int_equal(c10d__fr_record(&o), 0);
    assert_int_equal(c10d_flight_recorder_dump(path), C10D_EUNSUPPORTED);
    assert_non_null(strstr(c10d_last_error(), "C10D_TRACE_BUFFER_SIZE=0"));
    char *none = (char *)0x1;
    assert_int_equal(c10d_flight_recorder_dump_json(0, &none), C10D_EUNSUPPORTED);
    assert_null(none);

    /* No rank yet: a dump without a path cannot be named. */
    unsetenv("C10D_TRACE_BUFFER_SIZE");
    c10d__fr_reset();
    assert_int_equal(c10d__fr_capacity(), 2000);
    assert_int_equal(c10d_flight_recorder_dump(NULL), C10D_EINVAL);
    assert_non_null(strstr(c10d_last_error(), "no rank yet"));
}

/* --------------------------------------------------------- dump on request */

static c10d_pg *init_pg(int64_t timeout_ms, const char *prefix)
{
    setenv("C10D_TRACE_FILE_PREFIX", prefix, 1);
    setenv("C10D_TRACE_SIGNAL_CHECK_MS", "200", 1);
    unsetenv("C10D_TRACE_BUFFER_SIZE");
    c10d__fr_reset(); /* forked: forget the parent's ring, read the environment */
    c10d_pg_opts po = C10D_PG_OPTS_INIT;
    po.timeout_ms = timeout_ms;
    c10d_pg *pg = NULL;
    if (c10d_pg_init(&po, &pg) != 0) {
        fprintf(stderr, "init: %s\n", c10d_last_error());
        _exit(3);
    }
    return pg;
}

static int request_main(int rank, int n, void *arg)
{
    (void)n;
    (void)arg;
    char prefix[300];
    snprintf(prefix, sizeof prefix, "%s/req_", tmpdir);
    c10d_pg *pg = init_pg(20000, prefix);
    float x[4] = {1, 2, 3, 4};
    MP_CHECK(c10d_all_reduce_sync(pg, x, x, 4, C10D_FLOAT32, C10D_SUM) == 0, "all_reduce: %s",
             c10d_last_error());
    int64_t y = rank;
    MP_CHECK(c10d_broadcast_sync(pg, &y, &y, 1, C10D_INT64, 1) == 0, "broadcast: %s",
             c10d_last_error());
    MP_CHECK(c10d_flight_recorder_dump(NULL) == 0, "dump: %s", c10d_last_error());
    char path[400];
    snprintf(path, sizeof path, "%s%d.json", prefix, rank);
    json_error_t err;
    json_t *root = json_load_file(path, 0, &err);
    MP_CHECK(root != NULL, "%s: %s", path, err.text);
    json_t *es = json_object_get(root, "entries");
    MP_CHECK(json_array_size(es) == 2, "%zu entries", json_array_size(es));
    json_t *a = json_array_get(es, 0), *b = json_array_get(es, 1);
    MP_CHECK(strcmp(json_string_value(json_object_get(a, "profiling_name")), "tcp:all_reduce") == 0,
             "name");
    MP_CHECK(strcmp(json_string_value(json_object_get(a, "state")), "completed") == 0, "state");
    MP_CHECK(json_integer_value(json_object_get(a, "collective_seq_id")) == 1, "seq");
    MP_CHECK(json_integer_value(
                 json_array_get(json_array_get(json_object_get(a, "input_sizes"), 0), 0)) == 4,
             "sizes");
    MP_CHECK(strcmp(json_string_value(json_object_get(b, "profiling_name")), "tcp:broadcast") ==
                     0 &&
                 json_integer_value(json_object_get(b, "root")) == 1 &&
                 strcmp(json_string_value(json_array_get(json_object_get(b, "input_dtypes"), 0)),
                        "Long") == 0,
             "broadcast entry");
    MP_CHECK(json_integer_value(json_object_get(root, "rank")) == rank, "rank");
    json_t *cfg = json_object_get(json_object_get(root, "pg_config"), "0");
    MP_CHECK(cfg != NULL && strcmp(json_string_value(json_object_get(cfg, "ranks")), "[0, 1]") == 0,
             "pg_config");
    json_decref(root);
    c10d_pg_destroy(pg);
    c10d_shutdown();
    return 0;
}

static void test_dump_on_request(void **s)
{
    (void)s;
    struct mp_opts o = {0};
    o.nranks = 2;
    o.timeout_s = 30;
    o.kill_on_failure = 1;
    struct mp_result res;
    mp_run(&o, request_main, NULL, &res);
    assert_false(res.timed_out);
    assert_int_equal(res.codes[0], 0);
    assert_int_equal(res.codes[1], 0);
    char *out = NULL;
    char args[400];
    snprintf(args, sizeof args, "%s/req_", tmpdir);
    int rc = run_fr(args, &out);
    assert_non_null(out);
    fprintf(stderr, "%s", out);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(out, "no culprit"));
    free(out);
}

/* ------------------------------------------------------------ a real hang */

#define HANG_RANKS 3

static int all_dumps_exist(const char *prefix, int n)
{
    for (int r = 0; r < n; r++) {
        char p[400];
        snprintf(p, sizeof p, "%s%d.json", prefix, r);
        if (!file_exists(p))
            return 0;
    }
    return 1;
}

static int hang_main(int rank, int n, void *arg)
{
    (void)arg;
    char prefix[300];
    snprintf(prefix, sizeof prefix, "%s/hang_", tmpdir);
    c10d_pg *pg = init_pg(20000, prefix);
    float x[16] = {0};
    for (int i = 0; i < 2; i++)
        MP_CHECK(c10d_all_reduce_sync(pg, x, x, 16, C10D_FLOAT32, C10D_SUM) == 0,
                 "all_reduce %d: %s", i, c10d_last_error());
    if (rank != 1) {
        c10d_op_opts oo = C10D_OP_OPTS_INIT;
        oo.timeout_ms = 2000;
        c10d_work *w = NULL;
        MP_CHECK(c10d_all_reduce(pg, x, x, 16, C10D_FLOAT32, C10D_SUM, &oo, &w) == 0, "post: %s",
                 c10d_last_error());
        int rc = c10d_work_wait_release(w);
        MP_CHECK(rc == C10D_ETIMEDOUT, "third all_reduce: %s: %s", c10d_status_name(rc),
                 c10d_last_error());
    }
    /* Rank 1 skipped it and waits, idle: only the store signal makes it dump.
     * Every rank stays (rank 0 hosts the store) until all dumps are there. */
    for (int i = 0; i < 150 && !all_dumps_exist(prefix, n); i++)
        usleep(100000);
    MP_CHECK(all_dumps_exist(prefix, n), "not every rank dumped within 15 s");
    c10d_pg_abort(pg, "test over");
    c10d_shutdown();
    return 0;
}

static const char *reason_of(json_t *root)
{
    const char *r = json_string_value(json_object_get(root, "dump_reason"));
    return r != NULL ? r : "";
}

static void test_hang_every_rank_dumps(void **s)
{
    (void)s;
    struct mp_opts o = {0};
    o.nranks = HANG_RANKS;
    o.timeout_s = 40;
    o.kill_on_failure = 1;
    struct mp_result res;
    mp_run(&o, hang_main, NULL, &res);
    assert_false(res.timed_out);
    for (int r = 0; r < HANG_RANKS; r++)
        assert_int_equal(res.codes[r], 0);
    /* Ranks 0 and 2 dumped for their own timeout, rank 1 on the signal. */
    for (int r = 0; r < HANG_RANKS; r++) {
        char p[400];
        snprintf(p, sizeof p, "%s/hang_%d.json", tmpdir, r);
        json_error_t err;
        json_t *root = json_load_file(p, 0, &err);
        assert_non_null(root);
        fprintf(stderr, "rank %d dumped: %s\n", r, reason_of(root));
        if (r == 1)
            assert_non_null(strstr(reason_of(root), "another rank asked"));
        else
            assert_non_null(strstr(reason_of(root), "C10D_ETIMEDOUT"));
        json_decref(root);
    }
    char args[400], *out = NULL;
    snprintf(args, sizeof args, "%s/hang_", tmpdir);
    int rc = run_fr(args, &out);
    assert_non_null(out);
    fprintf(stderr, "%s", out);
    assert_int_equal(rc, 1);
    assert_non_null(
        strstr(out, "likely culprit: rank 1 never entered all_reduce (SeqNum=3) in group 0"));
    free(out);
    snprintf(args, sizeof args, "--json %s/hang_", tmpdir);
    rc = run_fr(args, &out);
    assert_int_equal(rc, 1);
    json_error_t err;
    json_t *j = json_loads(out, 0, &err);
    assert_non_null(j);
    json_t *c = json_object_get(j, "culprit");
    assert_string_equal(json_string_value(json_object_get(c, "kind")), "never_entered");
    assert_int_equal(json_integer_value(json_object_get(c, "seq")), 3);
    assert_int_equal(json_array_size(json_object_get(c, "ranks")), 1);
    assert_int_equal(json_integer_value(json_array_get(json_object_get(c, "ranks"), 0)), 1);
    json_decref(j);
    free(out);
}

/* -------------------------------------------------------------- mismatch */

/* A PyTorch-style dump (no "rank" field: the file name says it; no "root")
 * of two all_reduces, the first completed: the second with dtype2 and
 * state2, `created_ns` its time_created_ns (0: no times in the dump). */
static void write_torch_dump(const char *path, const char *dtype2, const char *state2,
                             int timeout_ms, json_int_t created_ns)
{
    json_t *es = json_array();
    for (int seq = 1; seq <= 2; seq++) {
        json_t *t = NULL;
        if (created_ns != 0)
            t = json_integer(seq == 2 ? created_ns : created_ns - 1000000);
        json_array_append_new(
            es, json_pack("{s:i, s:i, s:[s,s], s:i, s:i, s:i, s:s, s:[[i]], s:[s], s:[[i]], "
                          "s:[s], s:s, s:b, s:b, s:i, s:o*, s:[]}",
                          "record_id", seq - 1, "pg_id", 0, "process_group", "0", "default_pg",
                          "collective_seq_id", seq, "p2p_seq_id", 0, "op_id", seq, "profiling_name",
                          "nccl:all_reduce", "input_sizes", 1024, "input_dtypes",
                          seq == 2 ? dtype2 : "Float", "output_sizes", 1024, "output_dtypes",
                          seq == 2 ? dtype2 : "Float", "state", seq == 2 ? state2 : "completed",
                          "is_p2p", 0, "retired", seq == 1, "timeout_ms", timeout_ms,
                          "time_created_ns", t, "frames"));
    }
    json_t *root = json_pack("{s:s, s:o, s:{s:{s:s, s:s, s:s}}, s:{}, s:{}}", "version", "2.4",
                             "entries", es, "pg_config", "0", "name", "0", "desc", "default_pg",
                             "ranks", "[0, 1, 2]", "pg_status", "nccl_comm_state");
    assert_non_null(root);
    assert_int_equal(json_dump_file(root, path, JSON_INDENT(1)), 0);
    json_decref(root);
}

/* Every rank entered, one far later than the others: c10d-fr names it late,
 * rather than blaming a peer stuck inside the op or the network. */
static void test_late_entrant(void **s)
{
    (void)s;
    char p[400];
    for (int r = 0; r < 3; r++) {
        snprintf(p, sizeof p, "%s/late_rank_%d", tmpdir, r);
        /* Rank 2 enters all_reduce 2 three seconds after the others (timeout 2 s). */
        write_torch_dump(p, "Float", "started", 2000,
                         (json_int_t)1000002000000LL + (r == 2 ? 3000000000LL : r * 1000LL));
    }
    char args[400], *out = NULL;
    snprintf(args, sizeof args, "%s/late_rank_", tmpdir);
    int rc = run_fr(args, &out);
    assert_non_null(out);
    fprintf(stderr, "%s", out);
    assert_int_equal(rc, 1);
    assert_non_null(strstr(out, "rank 2 entered all_reduce (SeqNum=2) in group 0 3.0 s after the "
                                "first rank (its timeout: 2000 ms): late, not stuck inside it"));
    assert_null(strstr(out, "stuck inside it, or the network"));
    free(out);
}

static void test_mismatch(void **s)
{
    (void)s;
    char p[400];
    for (int r = 0; r < 3; r++) {
        snprintf(p, sizeof p, "%s/torch_rank_%d", tmpdir, r);
        write_torch_dump(p, r == 1 ? "Long" : "Float", r == 1 ? "completed" : "started", 600000, 0);
    }
    char args[400], *out = NULL;
    snprintf(args, sizeof args, "%s/torch_rank_", tmpdir);
    int rc = run_fr(args, &out);
    assert_non_null(out);
    fprintf(stderr, "%s", out);
    assert_int_equal(rc, 1);
    assert_non_null(strstr(out, "mismatch at SeqNum=2 (all_reduce): input_dtypes differs"));
    assert_non_null(strstr(out, "likely culprit: rank 1 called all_reduce (SeqNum=2) in group 0 "
                                "with input_dtypes [\"Long\"]"));
    free(out);
    /* Not a dump: a clear error, exit 2. */
    snprintf(p, sizeof p, "%s/garbage_0", tmpdir);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs("\x80\x02}q\x00(X", f); /* what a pickled dump starts like */
    fclose(f);
    rc = run_fr(p, &out);
    fprintf(stderr, "%s", out);
    assert_int_equal(rc, 2);
    assert_non_null(strstr(out, "not a JSON flight-recorder dump"));
    free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ring),
        cmocka_unit_test(test_mismatch),
        cmocka_unit_test(test_late_entrant),
        cmocka_unit_test(test_dump_on_request),
        cmocka_unit_test(test_hang_every_rank_dumps),
    };
    return cmocka_run_group_tests(tests, setup_dir, remove_dir);
}
