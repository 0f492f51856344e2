/* env://'s launcher detection (api/launch_env.c): each launcher's variables
 * to rank, size, local rank and master; torchrun's winning; the Slurm
 * batch-script pitfall; half-set environments naming every missing
 * variable; malformed numbers; Slurm's host-list syntax; the PMIx fence's
 * timeout and the exchange's refusal without a server. Parsing, plus the
 * process environment for the public query, the detect fallback and the
 * PMIx guard: no other process, no PMIx loaded, no network. */
#include "api/launch_env.h"
#include "c10d.h"

#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

/* An environment: "NAME=value" pairs, NULL-terminated, into the table. */
static void env_of(const char *env[C10D_ENV_COUNT], const char *const *pairs)
{
    const struct c10d__env_var *t = c10d__env_table();
    memset(env, 0, sizeof(const char *) * C10D_ENV_COUNT);
    for (; *pairs; pairs++) {
        const char *eq = strchr(*pairs, '=');
        assert_non_null(eq);
        int found = 0;
        for (int i = 0; i < C10D_ENV_COUNT; i++)
            if (strlen(t[i].name) == (size_t)(eq - *pairs) &&
                !strncmp(t[i].name, *pairs, (size_t)(eq - *pairs))) {
                env[i] = eq + 1;
                found = 1;
            }
        if (!found)
            fail_msg("%s is not in engine/env.h", *pairs);
    }
}

static int parse(const char *const *pairs, struct c10d__launch *l)
{
    const char *env[C10D_ENV_COUNT];
    env_of(env, pairs);
    return c10d__launch_parse(env, 1, 1, l);
}

/* The call fails with C10D_EINVAL and the message holds every needle. */
static void expect_error(const char *const *pairs, const char *const *needles)
{
    struct c10d__launch l;
    assert_int_equal(parse(pairs, &l), C10D_EINVAL);
    const char *msg = c10d_last_error();
    for (; *needles; needles++)
        if (!strstr(msg, *needles))
            fail_msg("'%s' not in: %s", *needles, msg);
}

#define ENV(...) ((const char *const[]){__VA_ARGS__, NULL})

static void test_torchrun(void **state)
{
    (void)state;
    struct c10d__launch l;
    assert_int_equal(
        parse(ENV("RANK=3", "WORLD_SIZE=8", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=4",
                  "MASTER_ADDR=node1", "MASTER_PORT=29500", "TORCHELASTIC_RUN_ID=c10drun-1"),
              &l),
        0);
    assert_string_equal(l.launcher, "torchrun/c10drun");
    assert_int_equal(l.rank, 3);
    assert_int_equal(l.world_size, 8);
    assert_int_equal(l.local_rank, 1);
    assert_int_equal(l.local_world_size, 4);
    assert_string_equal(l.master_addr, "node1");
    assert_int_equal(l.master_port, 29500);
    assert_int_equal(l.master_by_pmix, 0);
    /* By hand, without LOCAL_RANK: known rank, unknown local rank. */
    assert_int_equal(
        parse(ENV("RANK=0", "WORLD_SIZE=1", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=1"), &l), 0);
    assert_string_equal(l.launcher, "RANK/WORLD_SIZE");
    assert_int_equal(l.local_rank, -1);
    assert_int_equal(l.local_world_size, -1);
}

/* torchrun (or c10drun) inside an allocation or under mpirun: its
 * variables win over the outer launcher's. */
static void test_torchrun_wins(void **state)
{
    (void)state;
    struct c10d__launch l;
    assert_int_equal(
        parse(ENV("RANK=5", "WORLD_SIZE=6", "LOCAL_RANK=2", "MASTER_ADDR=m", "MASTER_PORT=7",
                  "SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_JOB_ID=9", "OMPI_COMM_WORLD_RANK=1",
                  "OMPI_COMM_WORLD_SIZE=2", "PMI_RANK=1", "PMI_SIZE=2"),
              &l),
        0);
    assert_int_equal(l.rank, 5);
    assert_int_equal(l.world_size, 6);
    assert_int_equal(l.local_rank, 2);
    assert_string_equal(l.master_addr, "m");
    /* Open MPI started inside a Slurm batch script (no step): mpirun's. */
    assert_int_equal(
        parse(ENV("OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_SIZE=4", "SLURM_PROCID=0",
                  "SLURM_NTASKS=4", "SLURM_JOB_ID=9", "MASTER_ADDR=m", "MASTER_PORT=7"),
              &l),
        0);
    assert_string_equal(l.launcher, "Open MPI");
    assert_int_equal(l.rank, 1);
    /* MPICH's proxies run under srun: PMI's ranks, not the proxies'. */
    assert_int_equal(
        parse(ENV("PMI_RANK=3", "PMI_SIZE=4", "SLURM_PROCID=1", "SLURM_NTASKS=2", "SLURM_STEP_ID=0",
                  "SLURM_JOB_ID=9", "MASTER_ADDR=m", "MASTER_PORT=7"),
              &l),
        0);
    assert_string_equal(l.launcher, "MPICH/Hydra (PMI)");
    assert_int_equal(l.rank, 3);
}

static void test_kubeflow(void **state)
{
    (void)state;
    struct c10d__launch l;
    assert_int_equal(
        parse(ENV("RANK=2", "WORLD_SIZE=3", "MASTER_ADDR=job-master-0", "MASTER_PORT=23456",
                  "PET_NNODES=3", "PET_NODE_RANK=2", "PET_NPROC_PER_NODE=1"),
              &l),
        0);
    assert_string_equal(l.launcher, "Kubeflow PyTorchJob");
    assert_int_equal(l.rank, 2);
    assert_int_equal(l.world_size, 3);
    assert_int_equal(l.local_rank, 0);
    assert_int_equal(l.local_world_size, 1);
    assert_string_equal(l.master_addr, "job-master-0");
    assert_int_equal(l.master_port, 23456);
    expect_error(ENV("RANK=2", "PET_NNODES=3", "MASTER_PORT=1"),
                 ENV("Kubeflow PyTorchJob", "WORLD_SIZE", "MASTER_ADDR"));
}

static void test_open_mpi(void **state)
{
    (void)state;
    struct c10d__launch l;
    /* mpirun with MASTER_ADDR unset: the address comes through PMIx. */
    assert_int_equal(parse(ENV("OMPI_COMM_WORLD_RANK=2", "OMPI_COMM_WORLD_SIZE=4",
                               "OMPI_COMM_WORLD_LOCAL_RANK=2", "OMPI_COMM_WORLD_LOCAL_SIZE=4",
                               "PMIX_NAMESPACE=prterun-x-1@1", "PMIX_RANK=2"),
                           &l),
                     0);
    assert_string_equal(l.launcher, "Open MPI");
    assert_int_equal(l.rank, 2);
    assert_int_equal(l.world_size, 4);
    assert_int_equal(l.local_rank, 2);
    assert_int_equal(l.local_world_size, 4);
    assert_int_equal(l.master_by_pmix, 1);
    assert_string_equal(l.master_from, "PMIx");
    /* MASTER_ADDR and MASTER_PORT win over PMIx. */
    assert_int_equal(parse(ENV("OMPI_COMM_WORLD_RANK=2", "OMPI_COMM_WORLD_SIZE=4",
                               "PMIX_NAMESPACE=ns", "MASTER_ADDR=h", "MASTER_PORT=99"),
                           &l),
                     0);
    assert_int_equal(l.master_by_pmix, 0);
    assert_string_equal(l.master_addr, "h");
    assert_int_equal(l.master_port, 99);
    /* MASTER_ADDR alone: the port is rank 0's, through PMIx. */
    assert_int_equal(parse(ENV("OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=4",
                               "PMIX_NAMESPACE=ns", "PMIX_RANK=0", "MASTER_ADDR=h"),
                           &l),
                     0);
    assert_int_equal(l.master_by_pmix, 1);
    assert_string_equal(l.master_addr, "h");
    /* A PMIx server sets both PMIX_NAMESPACE and PMIX_RANK: with one
     * missing there is none to ask. */
    expect_error(ENV("OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=4", "PMIX_NAMESPACE=ns"),
                 ENV("MASTER_ADDR, MASTER_PORT", "PMIX_NAMESPACE or PMIX_RANK is unset"));
    expect_error(ENV("OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=4", "PMIX_RANK=0"),
                 ENV("MASTER_ADDR, MASTER_PORT", "mpirun -x MASTER_ADDR"));
    /* PMIx's rank must be the launcher's, and a number. */
    expect_error(
        ENV("OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_SIZE=4", "PMIX_NAMESPACE=ns", "PMIX_RANK=3"),
        ENV("PMIX_RANK=3 differs from the rank 1", "set MASTER_ADDR and MASTER_PORT"));
    expect_error(ENV("OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_SIZE=4", "PMIX_NAMESPACE=ns",
                     "PMIX_RANK=1x"),
                 ENV("PMIX_RANK='1x' is not a valid value"));
    /* MASTER_ADDR and MASTER_PORT given: PMIX_RANK is not looked at. */
    assert_int_equal(
        parse(ENV("OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_SIZE=4", "PMIX_NAMESPACE=ns",
                  "PMIX_RANK=junk", "MASTER_ADDR=h", "MASTER_PORT=5"),
              &l),
        0);
    assert_int_equal(l.master_by_pmix, 0);
    /* No PMIx server and no MASTER_ADDR: say how to set it. */
    expect_error(ENV("OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=4"),
                 ENV("Open MPI", "MASTER_ADDR, MASTER_PORT", "mpirun -x MASTER_ADDR"));
}

static void test_mpich(void **state)
{
    (void)state;
    struct c10d__launch l;
    assert_int_equal(parse(ENV("PMI_RANK=1", "PMI_SIZE=2", "MPI_LOCALRANKID=1", "MPI_LOCALNRANKS=2",
                               "MASTER_ADDR=a", "MASTER_PORT=2"),
                           &l),
                     0);
    assert_string_equal(l.launcher, "MPICH/Hydra (PMI)");
    assert_int_equal(l.rank, 1);
    assert_int_equal(l.world_size, 2);
    assert_int_equal(l.local_rank, 1);
    assert_int_equal(l.local_world_size, 2);
    expect_error(ENV("PMI_RANK=1", "PMI_SIZE=2"), ENV("MPICH", "MASTER_ADDR", "-genv"));
}

static void test_slurm(void **state)
{
    (void)state;
    struct c10d__launch l;
    assert_int_equal(
        parse(ENV("SLURM_PROCID=5", "SLURM_NTASKS=8", "SLURM_LOCALID=1", "SLURM_NODEID=2",
                  "SLURM_STEP_TASKS_PER_NODE=2(x3),2", "SLURM_STEP_NODELIST=gpu[007-010]",
                  "SLURM_JOB_ID=4242", "SLURM_STEP_ID=0"),
              &l),
        0);
    assert_string_equal(l.launcher, "Slurm srun");
    assert_int_equal(l.rank, 5);
    assert_int_equal(l.world_size, 8);
    assert_int_equal(l.local_rank, 1);
    assert_int_equal(l.local_world_size, 2);
    assert_string_equal(l.master_addr, "gpu007");
    assert_string_equal(l.master_from, "SLURM_STEP_NODELIST");
    int port = l.master_port;
    assert_int_equal(port, c10d__slurm_port("4242", "0"));
    assert_true(port >= C10D_SLURM_PORT_BASE && port < C10D_SLURM_PORT_BASE + C10D_SLURM_PORT_SPAN);
    /* Another step of the same job: another port (for these ids). */
    assert_int_not_equal(c10d__slurm_port("4242", "1"), port);
    /* Uneven nodes: "3,1" puts 1 task on node 1. */
    assert_int_equal(parse(ENV("SLURM_PROCID=3", "SLURM_NTASKS=4", "SLURM_LOCALID=0",
                               "SLURM_NODEID=1", "SLURM_STEP_TASKS_PER_NODE=3,1",
                               "SLURM_STEP_NODELIST=n[1-2]", "SLURM_JOB_ID=1", "SLURM_STEP_ID=0"),
                           &l),
                     0);
    assert_int_equal(l.local_world_size, 1);
    /* --ntasks-per-node, and MASTER_ADDR / MASTER_PORT winning. */
    assert_int_equal(
        parse(ENV("SLURM_PROCID=0", "SLURM_NTASKS=4", "SLURM_NTASKS_PER_NODE=2", "SLURM_JOB_ID=1",
                  "SLURM_STEP_ID=3", "MASTER_ADDR=x", "MASTER_PORT=31000"),
              &l),
        0);
    assert_int_equal(l.local_world_size, 2);
    assert_string_equal(l.master_addr, "x");
    assert_int_equal(l.master_port, 31000);
}

/* SLURM_NODEID and SLURM_STEP_ID: a malformed value is an error naming it,
 * never node 0 / step 0 (a wrong local size, another step's port). */
static void test_slurm_malformed(void **state)
{
    (void)state;
    const char *bad_nodes[] = {"-1", "1x", "", "x", "99999999999"};
    for (size_t i = 0; i < sizeof bad_nodes / sizeof bad_nodes[0]; i++) {
        char node[64], needle[96];
        snprintf(node, sizeof node, "SLURM_NODEID=%s", bad_nodes[i]);
        snprintf(needle, sizeof needle,
                 "SLURM_NODEID='%s' is not a valid value (an integer in [0, ", bad_nodes[i]);
        const char *const pairs[] = {"SLURM_PROCID=1",
                                     "SLURM_NTASKS=4",
                                     "SLURM_LOCALID=0",
                                     node,
                                     "SLURM_STEP_TASKS_PER_NODE=2(x2)",
                                     "SLURM_STEP_NODELIST=n[1-2]",
                                     "SLURM_JOB_ID=1",
                                     "SLURM_STEP_ID=0",
                                     NULL};
        if (*bad_nodes[i] == 0) {
            /* Empty is unset: the local size is then unknown, not an error. */
            struct c10d__launch l;
            assert_int_equal(parse(pairs, &l), 0);
            assert_int_equal(l.local_world_size, -1);
            continue;
        }
        expect_error(pairs, (const char *const[]){"Slurm srun", needle, NULL});
    }
    /* A node id past the tasks-per-node entries. */
    expect_error(ENV("SLURM_PROCID=1", "SLURM_NTASKS=4", "SLURM_NODEID=5",
                     "SLURM_STEP_TASKS_PER_NODE=2(x2)", "SLURM_STEP_NODELIST=n[1-2]",
                     "SLURM_JOB_ID=1", "SLURM_STEP_ID=0"),
                 ENV("SLURM_STEP_TASKS_PER_NODE='2(x2)' has no entry for SLURM_NODEID=5"));
    /* SLURM_STEP_ID: a number in [0, 2^32 - 1], nothing else. */
    const char *bad_steps[] = {"abc", "0abc", "-1", "4294967296", " 1"};
    for (size_t i = 0; i < sizeof bad_steps / sizeof bad_steps[0]; i++) {
        char step[64], needle[96];
        snprintf(step, sizeof step, "SLURM_STEP_ID=%s", bad_steps[i]);
        snprintf(needle, sizeof needle, "SLURM_STEP_ID='%s' is not a valid value", bad_steps[i]);
        expect_error((const char *const[]){"SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_JOB_ID=7",
                                           "SLURM_STEP_NODELIST=n1", step, NULL},
                     (const char *const[]){"Slurm srun", needle, "a Slurm step number", NULL});
    }
    struct c10d__launch l;
    assert_int_equal(parse(ENV("SLURM_PROCID=0", "SLURM_NTASKS=1", "SLURM_JOB_ID=7",
                               "SLURM_STEP_NODELIST=n1", "SLURM_STEP_ID=4294967289"),
                           &l),
                     0);
    assert_int_equal(l.master_port, c10d__slurm_port("7", "4294967289"));
}

/* The range in the message is the variable's own, upper bound included. */
static void test_range_message(void **state)
{
    (void)state;
    expect_error(ENV("RANK=0", "WORLD_SIZE=1", "MASTER_ADDR=a", "MASTER_PORT=70000"),
                 ENV("MASTER_PORT='70000' is not a valid value (an integer in [1, 65535])"));
    expect_error(ENV("RANK=0", "WORLD_SIZE=1", "MASTER_ADDR=a", "MASTER_PORT=0"),
                 ENV("MASTER_PORT='0' is not a valid value (an integer in [1, 65535])"));
    expect_error(ENV("RANK=-1", "WORLD_SIZE=1", "MASTER_ADDR=a", "MASTER_PORT=1"),
                 ENV("RANK='-1' is not a valid value (an integer in [0, 2147483647])"));
}

/* The caller gives rank and size and the launcher's variables cannot be
 * read: MASTER_ADDR/MASTER_PORT alone are used, with the same strict port
 * parsing as everywhere else (no atoi: "29500abc" is refused). */
static void test_detect_fallback(void **state)
{
    (void)state;
    const char *names[] = {
        "RANK",           "WORLD_SIZE",          "TORCHELASTIC_RUN_ID", "PMI_RANK",
        "PMI_SIZE",       "SLURM_PROCID",        "SLURM_JOB_ID",        "SLURM_STEP_ID",
        "PMIX_NAMESPACE", "OMPI_COMM_WORLD_SIZE"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        unsetenv(names[i]);
    /* Open MPI half set: its size is missing. */
    setenv("OMPI_COMM_WORLD_RANK", "1", 1);
    setenv("MASTER_ADDR", "h", 1);
    const char *ports[] = {"29500abc", "70000", "0", "-5", "x"};
    struct c10d__launch l;
    for (size_t i = 0; i < sizeof ports / sizeof ports[0]; i++) {
        setenv("MASTER_PORT", ports[i], 1);
        c10d__env_reload();
        assert_int_equal(c10d__launch_detect(0, 1000, &l), C10D_EINVAL);
        char needle[96];
        snprintf(needle, sizeof needle,
                 "MASTER_PORT='%s' is not a valid value (an integer in [1, 65535])", ports[i]);
        if (!strstr(c10d_last_error(), needle))
            fail_msg("'%s' not in: %s", needle, c10d_last_error());
    }
    setenv("MASTER_PORT", "29500", 1);
    c10d__env_reload();
    assert_int_equal(c10d__launch_detect(0, 1000, &l), 0);
    assert_string_equal(l.launcher, "caller");
    assert_string_equal(l.master_addr, "h");
    assert_int_equal(l.master_port, 29500);
    unsetenv("OMPI_COMM_WORLD_RANK");
    unsetenv("MASTER_ADDR");
    unsetenv("MASTER_PORT");
    c10d__env_reload();
}

/* The PMIx fence's timeout in seconds: rounded up, never 0 (no limit to
 * PMIx) nor negative, whatever timeout_ms is. */
static void test_pmix_timeout(void **state)
{
    (void)state;
    assert_int_equal(c10d__pmix_timeout_s(1), 1);
    assert_int_equal(c10d__pmix_timeout_s(0), 1);
    assert_int_equal(c10d__pmix_timeout_s(-5), 1);
    assert_int_equal(c10d__pmix_timeout_s(1000), 1);
    assert_int_equal(c10d__pmix_timeout_s(1001), 2);
    assert_int_equal(c10d__pmix_timeout_s(300000), 300);
    assert_int_equal(c10d__pmix_timeout_s((int64_t)INT_MAX * 1000), INT_MAX);
    assert_int_equal(c10d__pmix_timeout_s((int64_t)INT_MAX * 1000 + 1), INT_MAX);
    assert_int_equal(c10d__pmix_timeout_s(INT64_MAX), INT_MAX);
    assert_int_equal(c10d__pmix_timeout_s(INT64_MAX - 500), INT_MAX);
}

/* No PMIx server's variables: fail at once, before loading libpmix or
 * calling PMIx_Init (which would make this process a singleton). */
static void test_pmix_needs_server(void **state)
{
    (void)state;
    const char *uris[] = {"PMIX_SERVER_URI",   "PMIX_SERVER_URI2", "PMIX_SERVER_URI21",
                          "PMIX_SERVER_URI3",  "PMIX_SERVER_URI4", "PMIX_SERVER_URI41",
                          "PMIX_SERVER_URI51", "PMIX_NAMESPACE",   "PMIX_RANK"};
    for (size_t i = 0; i < sizeof uris / sizeof uris[0]; i++)
        unsetenv(uris[i]);
    /* A library that cannot load: reaching dlopen would say so instead. */
    setenv("C10D_PMIX_LIBRARY", "/nonexistent/libpmix.so.2", 1);
    c10d__env_reload();
    char addr[64] = "";
    int port = 0;
    assert_int_equal(c10d__pmix_exchange_master(0, addr, sizeof addr, &port, 1000), C10D_ENOTFOUND);
    assert_non_null(strstr(c10d_last_error(), "PMIX_NAMESPACE is not set"));
    assert_non_null(strstr(c10d_last_error(), "PMIx_Init is not tried"));
    setenv("PMIX_NAMESPACE", "ns", 1);
    c10d__env_reload();
    assert_int_equal(c10d__pmix_exchange_master(0, addr, sizeof addr, &port, 1000), C10D_ENOTFOUND);
    assert_non_null(strstr(c10d_last_error(), "PMIX_RANK is not set"));
    setenv("PMIX_RANK", "0", 1);
    setenv("PMIX_SERVER_URI41", "", 1); /* empty: no address */
    c10d__env_reload();
    assert_int_equal(c10d__pmix_exchange_master(0, addr, sizeof addr, &port, 1000), C10D_ENOTFOUND);
    assert_non_null(strstr(c10d_last_error(), "PMIX_SERVER_URI* is not set"));
    /* With an address, the library is loaded (and here fails to). */
    setenv("PMIX_SERVER_URI41", "ns.0;tcp4://127.0.0.1:1", 1);
    assert_int_equal(c10d__pmix_exchange_master(0, addr, sizeof addr, &port, 1000), C10D_ENOTFOUND);
    assert_non_null(strstr(c10d_last_error(), "no PMIx library could be loaded"));
    for (size_t i = 0; i < sizeof uris / sizeof uris[0]; i++)
        unsetenv(uris[i]);
    unsetenv("C10D_PMIX_LIBRARY");
    c10d__env_reload();
}

/* sbatch's script and salloc's shell: SLURM_PROCID=0 and SLURM_NTASKS=N
 * but no step. One clear error, never "rank 0 of N" waiting for others. */
static void test_slurm_without_step(void **state)
{
    (void)state;
    expect_error(
        ENV("SLURM_PROCID=0", "SLURM_NTASKS=4", "SLURM_JOB_ID=77", "SLURM_STEP_NODELIST=n1"),
        ENV("Slurm job 77", "SLURM_STEP_ID", "srun"));
    expect_error(ENV("SLURM_JOB_ID=77"), ENV("no job step", "srun"));
    /* salloc's interactive step (and the batch and extern steps) are Slurm's
     * own, not srun's. */
    expect_error(ENV("SLURM_PROCID=0", "SLURM_NTASKS=4", "SLURM_JOB_ID=77",
                     "SLURM_STEP_ID=4294967290", "SLURM_STEP_NODELIST=n1"),
                 ENV("Slurm step 4294967290", "not an srun step", "srun"));
}

static void test_half_set(void **state)
{
    (void)state;
    expect_error(ENV("RANK=0", "MASTER_PORT=5"),
                 ENV("torchrun", "WORLD_SIZE", "MASTER_ADDR", "expected, but not set"));
    expect_error(ENV("WORLD_SIZE=2"), ENV("RANK, WORLD_SIZE", "RANK", "MASTER_ADDR, MASTER_PORT"));
    expect_error(ENV("RANK=4", "WORLD_SIZE=4", "MASTER_ADDR=a", "MASTER_PORT=1"),
                 ENV("RANK=4 is not below WORLD_SIZE=4"));
    expect_error(ENV("RANK=two", "WORLD_SIZE=4", "MASTER_ADDR=a"),
                 ENV("RANK='two'", "MASTER_PORT"));
    expect_error(ENV("OMPI_COMM_WORLD_RANK=1", "MASTER_ADDR=a", "MASTER_PORT=1"),
                 ENV("Open MPI", "OMPI_COMM_WORLD_SIZE"));
    expect_error(ENV("OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_SIZE=2",
                     "OMPI_COMM_WORLD_LOCAL_RANK=3", "OMPI_COMM_WORLD_LOCAL_SIZE=2",
                     "MASTER_ADDR=a", "MASTER_PORT=1"),
                 ENV("local rank 3 is not below the local size 2"));
    /* Every Slurm variable missing at once, in one message. */
    expect_error(ENV("SLURM_STEP_ID=0"), ENV("Slurm srun", "SLURM_PROCID", "SLURM_NTASKS",
                                             "SLURM_STEP_NODELIST", "SLURM_JOB_ID"));
    expect_error(ENV("SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_STEP_ID=0", "SLURM_JOB_ID=1",
                     "SLURM_STEP_NODELIST=n[1-"),
                 ENV("SLURM_STEP_NODELIST", "without ']'"));
    /* Nothing at all: the four torchrun variables. */
    expect_error(ENV("C10D_LOG_LEVEL=WARN"),
                 ENV("no launcher detected", "RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT"));
    /* Only a malformed value: no "expected, but not set" with nothing in it. */
    {
        const char *e2[C10D_ENV_COUNT];
        struct c10d__launch l2;
        env_of(e2, ENV("MASTER_ADDR=a", "MASTER_PORT=abc"));
        assert_int_equal(c10d__launch_parse(e2, 0, 1, &l2), C10D_EINVAL);
        assert_non_null(strstr(c10d_last_error(), "MASTER_PORT='abc' is not a valid value"));
        assert_null(strstr(c10d_last_error(), "expected"));
    }
    /* The caller gives rank and size: only the master is needed. */
    const char *env[C10D_ENV_COUNT];
    env_of(env, ENV("MASTER_ADDR=a", "MASTER_PORT=3"));
    struct c10d__launch l;
    assert_int_equal(c10d__launch_parse(env, 0, 1, &l), 0);
    assert_int_equal(l.rank, -1);
    assert_string_equal(l.master_addr, "a");
}

static void expect_hosts(const char *list, const char *const *hosts)
{
    size_t n = 0;
    while (hosts[n])
        n++;
    char buf[256];
    for (size_t i = 0; i < n; i++) {
        int count = c10d__hostlist_host(list, i, buf, sizeof buf);
        if (count < 0)
            fail_msg("%s: %s", list, c10d_last_error());
        assert_int_equal(count, (int)n);
        if (strcmp(buf, hosts[i]))
            fail_msg("%s: host %zu is '%s', expected '%s'", list, i, buf, hosts[i]);
    }
}

static void test_hostlist(void **state)
{
    (void)state;
    expect_hosts("node1", ENV("node1"));
    expect_hosts("a,b,c", ENV("a", "b", "c"));
    expect_hosts("node[01-04,7]", ENV("node01", "node02", "node03", "node04", "node7"));
    expect_hosts("node[01-04,7],gpu-a[1-2]",
                 ENV("node01", "node02", "node03", "node04", "node7", "gpu-a1", "gpu-a2"));
    expect_hosts("n[8-10]", ENV("n8", "n9", "n10"));
    expect_hosts("n[098-101]", ENV("n098", "n099", "n100", "n101"));
    expect_hosts("rack[1-2]-n[01-02]", ENV("rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"));
    expect_hosts("x[3]y,z", ENV("x3y", "z"));
    expect_hosts("n[1-2].cluster.org", ENV("n1.cluster.org", "n2.cluster.org"));
    char buf[64];
    assert_int_equal(c10d__hostlist_host("node[0001-1000]", 999, buf, sizeof buf), 1000);
    assert_string_equal(buf, "node1000");
    struct {
        const char *list, *needle;
    } bad[] = {
        {"", "empty"},
        {"node[1-2", "without ']'"},
        {"node1-2]", "without '['"},
        {"n[2-1]", "goes down"},
        {"n[a-b]", "not a number"},
        {"n[]", "empty range"},
        {"n[1,]", "empty range"},
        {"n[1-]", "empty range"},
        {"a,,b", "empty host"},
        {"a,", "empty host"},
        {"n[[1]]", "nested"},
        {"[1-2]", "empty host"},
        {"n[0-99999999]", "more than"},
        /* Each group below the limit, their product above it (and above
         * 2^32: it must not wrap where long has 32 bits). */
        {"n[1-5000]-[1-5000]", "more than"},
        {"n[1-16000000]-[1-16000000]", "more than"},
        {"n[1-65536]-[1-65536]", "more than"},
        {"a[1-16000000],b[1-16000000]", "more than"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = c10d__hostlist_host(bad[i].list, 0, buf, sizeof buf);
        if (rc != C10D_EINVAL)
            fail_msg("'%s' gave %d, expected C10D_EINVAL", bad[i].list, rc);
        if (!strstr(c10d_last_error(), bad[i].needle))
            fail_msg("'%s': '%s' not in: %s", bad[i].list, bad[i].needle, c10d_last_error());
    }
    /* A host longer than the caller's buffer is an error, not a cut name. */
    assert_int_equal(c10d__hostlist_host("averyveryverylonghostname", 0, buf, 8), C10D_EINVAL);
}

/* The public query reads the process environment. */
static void test_query(void **state)
{
    (void)state;
    const char *names[] = {"RANK",
                           "WORLD_SIZE",
                           "LOCAL_RANK",
                           "LOCAL_WORLD_SIZE",
                           "MASTER_ADDR",
                           "MASTER_PORT",
                           "TORCHELASTIC_RUN_ID",
                           "OMPI_COMM_WORLD_RANK",
                           "OMPI_COMM_WORLD_SIZE",
                           "PMI_RANK",
                           "PMI_SIZE",
                           "SLURM_PROCID",
                           "SLURM_JOB_ID",
                           "SLURM_STEP_ID",
                           "PET_NNODES"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        unsetenv(names[i]);
    c10d_launch_info info = C10D_LAUNCH_INFO_INIT;
    assert_int_equal(c10d_launch_query(&info), 0);
    assert_string_equal(info.launcher, "none");
    assert_int_equal(info.rank, -1);
    setenv("OMPI_COMM_WORLD_RANK", "1", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "3", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "3", 1);
    assert_int_equal(c10d_launch_query(&info), 0);
    assert_string_equal(info.launcher, "Open MPI");
    assert_int_equal(info.rank, 1);
    assert_int_equal(info.world_size, 3);
    assert_int_equal(info.local_rank, 1);
    assert_int_equal(info.local_world_size, 3);
    unsetenv("OMPI_COMM_WORLD_SIZE");
    assert_int_equal(c10d_launch_query(&info), C10D_EINVAL);
    assert_non_null(strstr(c10d_last_error(), "OMPI_COMM_WORLD_SIZE"));
    assert_int_equal(c10d_launch_query(NULL), C10D_EINVAL);
    c10d_launch_info small = {.struct_size = sizeof(size_t)};
    assert_int_equal(c10d_launch_query(&small), C10D_EINVAL);
    unsetenv("OMPI_COMM_WORLD_RANK");
    unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");
    unsetenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    c10d_launch_info zero = {0}; /* 0: this layout */
    assert_int_equal(c10d_launch_query(&zero), 0);
    assert_string_equal(zero.launcher, "none");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_torchrun),
        cmocka_unit_test(test_torchrun_wins),
        cmocka_unit_test(test_kubeflow),
        cmocka_unit_test(test_open_mpi),
        cmocka_unit_test(test_mpich),
        cmocka_unit_test(test_slurm),
        cmocka_unit_test(test_slurm_without_step),
        cmocka_unit_test(test_slurm_malformed),
        cmocka_unit_test(test_range_message),
        cmocka_unit_test(test_detect_fallback),
        cmocka_unit_test(test_pmix_timeout),
        cmocka_unit_test(test_pmix_needs_server),
        cmocka_unit_test(test_half_set),
        cmocka_unit_test(test_hostlist),
        cmocka_unit_test(test_query),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
