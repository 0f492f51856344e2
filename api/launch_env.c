/* Who started this process, read from the launcher's own variables
 * (docs/launchers.md): the env:// rendezvous and c10d_launch_query.
 *
 * Order: torchrun's variables (RANK, WORLD_SIZE) win, so a launcher inside
 * another (torchrun under srun, mpirun in an sbatch script) is the inner
 * one; then Open MPI (OMPI_COMM_WORLD_*), MPICH/Hydra (PMI_*), Slurm
 * (SLURM_*). A launcher counts as detected as soon as one of its variables
 * is set, so a half-set environment fails naming what is missing instead of
 * falling through to the next launcher. Rank 0's address: MASTER_ADDR;
 * else, when Slurm is the launcher, the first node of the step; else, when
 * Open MPI or PMI is and a PMIx server is there, a PMIx exchange.
 * No state; any thread. */
#include "api/launch_env.h"

#include "c10d.h"
#include "engine/error.h"
#include "engine/log.h"

#include <errno.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_HOSTS (1u << 24) /* a host list longer than this is a typo */
/* Slurm's own steps (interactive 0xfffffffa, batch, extern, pending) have
 * ids from here up; srun's steps count from 0. */
#define SLURM_FIRST_SPECIAL_STEP 0xfffffffaul

/* ------------------------------------------------------------ host lists */

/* One bracket group's ranges, "01-04,7", between `s` and `e`: the number of
 * values, or -1. */
static long ranges_count(const char *s, const char *e, const char *list)
{
    long total = 0;
    if (s == e)
        return c10d__fail(C10D_EINVAL, "host list '%s': empty range in '[...]'", list), -1;
    while (s < e) {
        const char *comma = memchr(s, ',', (size_t)(e - s));
        const char *re = comma ? comma : e;
        const char *dash = memchr(s, '-', (size_t)(re - s));
        const char *lo_e = dash ? dash : re;
        unsigned long lo, hi;
        char *end;
        if (lo_e == s || (dash && dash + 1 == re))
            return c10d__fail(C10D_EINVAL, "host list '%s': empty range in '[...]'", list), -1;
        for (const char *p = s; p < re; p++)
            if ((*p < '0' || *p > '9') && p != dash)
                return c10d__fail(C10D_EINVAL, "host list '%s': '%.*s' is not a number or range",
                                  list, (int)(re - s), s),
                       -1;
        if (lo_e - s > 9 || (dash && re - dash - 1 > 9))
            return c10d__fail(C10D_EINVAL, "host list '%s': '%.*s' has too many digits", list,
                              (int)(re - s), s),
                   -1;
        lo = strtoul(s, &end, 10);
        hi = dash ? strtoul(dash + 1, &end, 10) : lo;
        if (hi < lo)
            return c10d__fail(C10D_EINVAL, "host list '%s': range '%.*s' goes down", list,
                              (int)(re - s), s),
                   -1;
        total += (long)(hi - lo + 1);
        if (total > (long)MAX_HOSTS)
            return c10d__fail(C10D_EINVAL, "host list '%s': more than %u hosts", list, MAX_HOSTS),
                   -1;
        s = comma ? comma + 1 : e;
        if (comma && s == e)
            return c10d__fail(C10D_EINVAL, "host list '%s': empty range in '[...]'", list), -1;
    }
    return total;
}

/* Writes the k-th value of the ranges between s and e, with the low
 * bound's width (Slurm keeps "01-04" as 01, 02, 03, 04). */
static int ranges_value(const char *s, const char *e, long k, char *out, size_t cap)
{
    while (s < e) {
        const char *comma = memchr(s, ',', (size_t)(e - s));
        const char *re = comma ? comma : e;
        const char *dash = memchr(s, '-', (size_t)(re - s));
        int width = (int)((dash ? dash : re) - s);
        unsigned long lo = strtoul(s, NULL, 10);
        unsigned long hi = dash ? strtoul(dash + 1, NULL, 10) : lo;
        if (k <= (long)(hi - lo))
            return snprintf(out, cap, "%0*lu", width, lo + (unsigned long)k);
        k -= (long)(hi - lo + 1);
        s = comma ? comma + 1 : e;
    }
    return -1; /* not reached: k was below the count */
}

/* One host expression, "rack[1-2]-node[01-04]": prefix and bracket groups,
 * expanded with the last group varying fastest. Returns its host count and,
 * when k is below it, writes host k. */
static long expr_host(const char *s, const char *e, const char *list, long k, char *out, size_t cap,
                      int *written)
{
    /* 64 bits: two groups of up to MAX_HOSTS each multiply past a 32-bit long. */
    int64_t count = 1;
    for (const char *p = s; p < e; p++) {
        if (*p == ']')
            return c10d__fail(C10D_EINVAL, "host list '%s': ']' without '['", list), -1;
        if (*p != '[')
            continue;
        const char *close = memchr(p, ']', (size_t)(e - p));
        if (close == NULL)
            return c10d__fail(C10D_EINVAL, "host list '%s': '[' without ']'", list), -1;
        if (memchr(p + 1, '[', (size_t)(close - p - 1)))
            return c10d__fail(C10D_EINVAL, "host list '%s': nested '['", list), -1;
        long n = ranges_count(p + 1, close, list);
        if (n < 0)
            return -1;
        count *= (int64_t)n;
        if (count > (int64_t)MAX_HOSTS)
            return c10d__fail(C10D_EINVAL, "host list '%s': more than %u hosts", list, MAX_HOSTS),
                   -1;
        p = close;
    }
    if (k < 0 || k >= count)
        return (long)count;
    /* Host k: digits of k in the mixed radix of the groups, last fastest. */
    char buf[512];
    size_t used = 0;
    long rest = k, stride = (long)count;
    for (const char *p = s; p < e; p++) {
        int n;
        if (*p == '[') {
            const char *close = memchr(p, ']', (size_t)(e - p));
            long values = ranges_count(p + 1, close, list);
            stride /= values;
            n = ranges_value(p + 1, close, rest / stride, buf + used, sizeof buf - used);
            rest %= stride;
            p = close;
        } else {
            n = used + 1 < sizeof buf ? (buf[used] = *p, buf[used + 1] = 0, 1) : -1;
        }
        if (n < 0 || used + (size_t)n >= sizeof buf)
            return c10d__fail(C10D_EINVAL, "host list '%s': host name too long", list), -1;
        used += (size_t)n;
    }
    buf[used] = 0;
    if ((size_t)snprintf(out, cap, "%s", buf) >= cap)
        return c10d__fail(C10D_EINVAL, "host list '%s': host name too long", list), -1;
    *written = 1;
    return (long)count;
}

int c10d__hostlist_host(const char *list, size_t index, char *out, size_t cap)
{
    if (list == NULL || *list == 0)
        return c10d__fail(C10D_EINVAL, "host list is empty");
    long total = 0;
    int written = 0;
    const char *s = list;
    for (;;) {
        /* The expression ends at the first comma outside brackets. */
        const char *e = s;
        int depth = 0;
        while (*e && (*e != ',' || depth > 0)) {
            depth += *e == '[' ? 1 : *e == ']' ? -1 : 0;
            e++;
        }
        if (e == s || *s == '[')
            return c10d__fail(C10D_EINVAL, "host list '%s': empty host name", list);
        long k = written ? -1 : (long)index - total;
        long n = expr_host(s, e, list, k, out, cap, &written);
        if (n < 0)
            return (int)n == -1 ? C10D_EINVAL : (int)n;
        total += n;
        if (total > (long)MAX_HOSTS)
            return c10d__fail(C10D_EINVAL, "host list '%s': more than %u hosts", list, MAX_HOSTS);
        if (*e == 0)
            break;
        s = e + 1;
        if (*s == 0)
            return c10d__fail(C10D_EINVAL, "host list '%s': empty host name", list);
    }
    return (int)total;
}

/* ---------------------------------------------------------------- Slurm */

int c10d__slurm_port(const char *job_id, const char *step_id)
{
    uint32_t h = 2166136261u; /* FNV-1a of "<job>.<step>" */
    for (const char *p = job_id; *p; p++)
        h = (h ^ (uint8_t)*p) * 16777619u;
    h = (h ^ (uint8_t)'.') * 16777619u;
    for (const char *p = step_id; *p; p++)
        h = (h ^ (uint8_t)*p) * 16777619u;
    return C10D_SLURM_PORT_BASE + (int)(h % C10D_SLURM_PORT_SPAN);
}

/* SLURM_STEP_TASKS_PER_NODE ("2(x3),1"): the tasks on node `node`, or -1. */
static long tasks_on_node(const char *spec, long node)
{
    const char *p = spec;
    while (*p) {
        char *end;
        long tasks = strtol(p, &end, 10), reps = 1;
        if (end == p || tasks <= 0)
            return -1;
        p = end;
        if (strncmp(p, "(x", 2) == 0) {
            reps = strtol(p + 2, &end, 10);
            if (end == p + 2 || *end != ')' || reps <= 0)
                return -1;
            p = end + 1;
        }
        if (node < reps)
            return tasks;
        node -= reps;
        if (*p == ',')
            p++;
        else if (*p)
            return -1;
    }
    return -1;
}

/* -------------------------------------------------------------- parsing */

/* What is wrong, gathered so that one message names all of it. */
struct problems {
    char missing[512]; /* "A, B" */
    char bad[768];     /* "; X='y' is not ..." */
};

static void add_missing(struct problems *p, const char *name)
{
    size_t n = strlen(p->missing);
    snprintf(p->missing + n, sizeof p->missing - n, "%s%s", n ? ", " : "", name);
}

static void C10D_PRINTF(2, 3) add_bad(struct problems *p, const char *fmt, ...)
{
    size_t n = strlen(p->bad);
    if (n + 2 >= sizeof p->bad)
        return;
    if (n)
        p->bad[n++] = ';', p->bad[n++] = ' ', p->bad[n] = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->bad + n, sizeof p->bad - n, fmt, ap);
    va_end(ap);
}

/* The one message: who was detected, what is missing, what is wrong. */
static int fail_with(const struct problems *p, const char *who, const char *hint)
{
    return c10d__fail(C10D_EINVAL, "rendezvous env://: %s: %s%s%s%s%s%s", who,
                      p->missing[0] ? "environment variable " : "", p->missing,
                      p->missing[0] ? " expected, but not set" : "",
                      p->missing[0] && p->bad[0] ? "; " : "", p->bad, hint);
}

static const char *val(const char *const env[C10D_ENV_COUNT], enum c10d__env_id id)
{
    const char *v = env[id];
    return v != NULL && *v != 0 ? v : NULL;
}

static const char *name_of(enum c10d__env_id id)
{
    return c10d__env_table()[id].name;
}

/* v as a whole decimal integer in [lo, hi] (digits only, a '-' first
 * only when lo < 0; no spaces, no trailing text, no overflow): 0 and
 * *out, or -1. */
static int strict_int(const char *v, int64_t lo, int64_t hi, int64_t *out)
{
    if (!((*v >= '0' && *v <= '9') || (*v == '-' && lo < 0)))
        return -1;
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi)
        return -1;
    *out = (int64_t)x;
    return 0;
}

/* An integer variable in [lo, hi]: *out, or -1 when unset (listed as
 * missing when `required`) or malformed (listed as bad). */
static void int_var(const char *const env[C10D_ENV_COUNT], enum c10d__env_id id, long lo, long hi,
                    int required, struct problems *p, int *out)
{
    const char *v = val(env, id);
    *out = -1;
    if (v == NULL) {
        if (required)
            add_missing(p, name_of(id));
        return;
    }
    int64_t x;
    if (strict_int(v, lo, hi, &x) < 0) {
        add_bad(p, "%s='%s' is not a valid value (an integer in [%ld, %ld])", name_of(id), v, lo,
                hi);
        return;
    }
    *out = (int)x;
}

enum launcher_kind { L_NONE, L_TORCHRUN, L_OMPI, L_PMI, L_SLURM };

/* Rank, size, local rank and local size of one launcher, and what it says
 * when MASTER_ADDR is missing. */
struct launcher_vars {
    const char *name;
    const char *rank_from;
    enum c10d__env_id rank, size, local_rank, local_size;
    const char *no_master_hint;
};

static const struct launcher_vars launchers[] = {
    [L_TORCHRUN] = {"torchrun/c10drun", "RANK, WORLD_SIZE", C10D_ENV_RANK, C10D_ENV_WORLD_SIZE,
                    C10D_ENV_LOCAL_RANK, C10D_ENV_LOCAL_WORLD_SIZE,
                    "torchrun and c10drun set them; set by hand, every rank needs the same "
                    "MASTER_ADDR and MASTER_PORT"},
    [L_OMPI] =
        {"Open MPI", "OMPI_COMM_WORLD_*", C10D_ENV_OMPI_RANK, C10D_ENV_OMPI_SIZE,
         C10D_ENV_OMPI_LOCAL_RANK, C10D_ENV_OMPI_LOCAL_SIZE,
         "no PMIx server to ask (PMIX_NAMESPACE or PMIX_RANK is unset): pass them, e.g. mpirun -x "
         "MASTER_ADDR=$(hostname) -x MASTER_PORT=29500"},
    [L_PMI] = {"MPICH/Hydra (PMI)", "PMI_RANK, PMI_SIZE", C10D_ENV_PMI_RANK, C10D_ENV_PMI_SIZE,
               C10D_ENV_MPI_LOCALRANKID, C10D_ENV_MPI_LOCALNRANKS,
               "PMI cannot exchange them: pass them, e.g. mpiexec -genv MASTER_ADDR $(hostname) "
               "-genv MASTER_PORT 29500"},
    [L_SLURM] = {"Slurm srun", "SLURM_PROCID, SLURM_NTASKS", C10D_ENV_SLURM_PROCID,
                 C10D_ENV_SLURM_NTASKS, C10D_ENV_SLURM_LOCALID, C10D_ENV_COUNT, NULL},
};

static enum launcher_kind detect(const char *const env[C10D_ENV_COUNT])
{
    if (val(env, C10D_ENV_RANK) || val(env, C10D_ENV_WORLD_SIZE))
        return L_TORCHRUN;
    if (val(env, C10D_ENV_OMPI_RANK) || val(env, C10D_ENV_OMPI_SIZE))
        return L_OMPI;
    if (val(env, C10D_ENV_PMI_RANK) || val(env, C10D_ENV_PMI_SIZE))
        return L_PMI;
    if (val(env, C10D_ENV_SLURM_PROCID) || val(env, C10D_ENV_SLURM_STEP_ID) ||
        val(env, C10D_ENV_SLURM_JOB_ID))
        return L_SLURM;
    return L_NONE;
}

/* The local size Slurm gives: this node's entry of the step's tasks per
 * node, else --ntasks-per-node's. */
static int slurm_local_size(const char *const env[C10D_ENV_COUNT], struct problems *p)
{
    const char *spec = val(env, C10D_ENV_SLURM_STEP_TASKS_PER_NODE);
    const char *node = val(env, C10D_ENV_SLURM_NODEID);
    int n;
    if (spec && node) {
        int node_id;
        int_var(env, C10D_ENV_SLURM_NODEID, 0, INT32_MAX, 0, p, &node_id);
        if (node_id < 0)
            return -1; /* listed as bad */
        long tasks = tasks_on_node(spec, node_id);
        if (tasks > 0 && tasks <= INT32_MAX)
            return (int)tasks;
        add_bad(p, "SLURM_STEP_TASKS_PER_NODE='%s' has no entry for SLURM_NODEID=%d", spec,
                node_id);
        return -1;
    }
    int_var(env, C10D_ENV_SLURM_NTASKS_PER_NODE, 1, INT32_MAX, 0, p, &n);
    return n;
}

/* Where rank 0's store is; adds what is missing to p. */
static void parse_master(const char *const env[C10D_ENV_COUNT], enum launcher_kind kind, int rank,
                         struct problems *p, struct c10d__launch *out)
{
    const char *addr = val(env, C10D_ENV_MASTER_ADDR);
    int port;
    int_var(env, C10D_ENV_MASTER_PORT, 1, 65535, 0, p, &port);
    int port_bad = port < 0 && val(env, C10D_ENV_MASTER_PORT) != NULL;
    /* A PMIx server gives each client both PMIX_NAMESPACE and PMIX_RANK;
     * with one missing there is no server to ask (PMIx_Init would make this
     * process a singleton of its own). */
    int pmix = (kind == L_OMPI || kind == L_PMI) && val(env, C10D_ENV_PMIX_NAMESPACE) &&
               val(env, C10D_ENV_PMIX_RANK);
    if (pmix && (!addr || port <= 0)) {
        /* Only when PMIx would be asked: its rank must be the launcher's. */
        int pmix_rank;
        int_var(env, C10D_ENV_PMIX_RANK, 0, INT32_MAX, 0, p, &pmix_rank);
        if (pmix_rank >= 0 && rank >= 0 && pmix_rank != rank)
            add_bad(p,
                    "PMIX_RANK=%d differs from the rank %d, so PMIx cannot give rank 0's "
                    "address: set MASTER_ADDR and MASTER_PORT",
                    pmix_rank, rank);
    }
    out->master_from = "MASTER_ADDR/MASTER_PORT";
    if (addr)
        snprintf(out->master_addr, sizeof out->master_addr, "%s", addr);
    out->master_port = port > 0 ? port : 0;
    if (kind == L_SLURM) {
        const char *nodes = val(env, C10D_ENV_SLURM_STEP_NODELIST);
        const char *job = val(env, C10D_ENV_SLURM_JOB_ID);
        const char *step = val(env, C10D_ENV_SLURM_STEP_ID);
        if (!addr) {
            out->master_from = "SLURM_STEP_NODELIST";
            if (!nodes) {
                add_missing(p, "SLURM_STEP_NODELIST (or MASTER_ADDR)");
            } else if (c10d__hostlist_host(nodes, 0, out->master_addr, sizeof out->master_addr) <
                       0) {
                add_bad(p, "SLURM_STEP_NODELIST: %s", c10d_last_error());
            }
        }
        if (port <= 0 && !port_bad) {
            if (!job)
                add_missing(p, "SLURM_JOB_ID (or MASTER_PORT)");
            else if (step)
                out->master_port = c10d__slurm_port(job, step);
        }
        return;
    }
    if (!addr && pmix) {
        out->master_from = "PMIx";
        out->master_by_pmix = 1;
        return;
    }
    if (!addr)
        add_missing(p, "MASTER_ADDR");
    if (port <= 0 && !port_bad) {
        if (addr && pmix) {
            out->master_from = "MASTER_ADDR, port from PMIx";
            out->master_by_pmix = 1;
        } else {
            add_missing(p, "MASTER_PORT");
        }
    }
}

int c10d__launch_parse(const char *const env[C10D_ENV_COUNT], int need_rank, int need_master,
                       struct c10d__launch *out)
{
    memset(out, 0, sizeof *out);
    out->rank = out->world_size = out->local_rank = out->local_world_size = -1;
    enum launcher_kind kind = detect(env);
    struct problems p = {{0}, {0}};
    if (kind == L_NONE) {
        out->launcher = "none";
        out->rank_from = "the caller";
        if (need_rank) {
            add_missing(&p, "RANK");
            add_missing(&p, "WORLD_SIZE");
        }
        if (need_master)
            parse_master(env, kind, -1, &p, out);
        if (p.missing[0] || p.bad[0])
            return fail_with(&p,
                             "no launcher detected (no torchrun, Open MPI, MPICH or Slurm "
                             "variables)",
                             " (docs/launchers.md)");
        return 0;
    }
    const struct launcher_vars *l = &launchers[kind];
    out->launcher = l->name;
    out->rank_from = l->rank_from;
    if (kind == L_TORCHRUN && !val(env, C10D_ENV_TORCHELASTIC_RUN_ID)) {
        int kubeflow = val(env, C10D_ENV_PET_NNODES) || val(env, C10D_ENV_PET_NODE_RANK) ||
                       val(env, C10D_ENV_PET_NPROC_PER_NODE);
        out->launcher =
            kubeflow && !val(env, C10D_ENV_LOCAL_RANK) ? "Kubeflow PyTorchJob" : "RANK/WORLD_SIZE";
    }
    const char *step = val(env, C10D_ENV_SLURM_STEP_ID);
    int64_t step_id = -1;
    if (kind == L_SLURM && step && strict_int(step, 0, UINT32_MAX, &step_id) < 0)
        add_bad(&p,
                "SLURM_STEP_ID='%s' is not a valid value (a Slurm step number: an integer in "
                "[0, 4294967295])",
                step);
    if (kind == L_SLURM && step_id >= (int64_t)SLURM_FIRST_SPECIAL_STEP)
        return c10d__fail(C10D_EINVAL,
                          "rendezvous env://: Slurm step %s is the job's batch, interactive or "
                          "external step, not an srun step: SLURM_PROCID/SLURM_NTASKS describe "
                          "the allocation, not this process; start it with srun",
                          step);
    if (kind == L_SLURM && !step) {
        /* sbatch's script (and salloc's shell) have SLURM_PROCID=0 and
         * SLURM_NTASKS=N for the whole allocation: taken for rank 0 of N,
         * this process would wait for N-1 ranks nobody starts. */
        const char *job = val(env, C10D_ENV_SLURM_JOB_ID);
        return c10d__fail(C10D_EINVAL,
                          "rendezvous env://: Slurm job %s but no job step (SLURM_STEP_ID is not "
                          "set): this process runs in the batch script or salloc shell itself, "
                          "where SLURM_PROCID/SLURM_NTASKS describe the allocation, not this "
                          "process; start it with srun (e.g. srun -n N %s) or under another "
                          "launcher",
                          job ? job : "(SLURM_JOB_ID unset)", "PROGRAM");
    }
    int rank, size;
    int_var(env, l->rank, 0, INT32_MAX, 1, &p, &rank);
    int_var(env, l->size, 1, INT32_MAX, 1, &p, &size);
    int local_rank, local_size = -1;
    int_var(env, l->local_rank, 0, INT32_MAX, 0, &p, &local_rank);
    if (kind == L_SLURM)
        local_size = slurm_local_size(env, &p);
    else
        int_var(env, l->local_size, 1, INT32_MAX, 0, &p, &local_size);
    if (!strcmp(out->launcher, "Kubeflow PyTorchJob")) {
        /* One process per pod; more per pod is torchrun's or c10drun's job
         * inside the pod, which sets LOCAL_RANK. */
        local_rank = 0;
        local_size = 1;
        const char *per_pod = val(env, C10D_ENV_PET_NPROC_PER_NODE);
        if (per_pod && strcmp(per_pod, "1") && strcmp(per_pod, "auto"))
            C10D_WARN("rendezvous",
                      "Kubeflow PyTorchJob asks for PET_NPROC_PER_NODE=%s processes per pod, but "
                      "this process was not started by torchrun or c10drun (LOCAL_RANK is unset): "
                      "it runs as the pod's only rank",
                      per_pod);
    }
    if (rank >= 0 && size > 0 && rank >= size)
        add_bad(&p, "%s=%d is not below %s=%d", name_of(l->rank), rank, name_of(l->size), size);
    if (local_rank >= 0 && local_size > 0 && local_rank >= local_size)
        add_bad(&p, "local rank %d is not below the local size %d", local_rank, local_size);
    if (local_size > 0 && size > 0 && local_size > size)
        add_bad(&p, "local size %d is above the world size %d", local_size, size);
    if (need_master)
        parse_master(env, kind, rank, &p, out);
    if (p.missing[0] || p.bad[0]) {
        char who[128], hint[300] = "";
        snprintf(who, sizeof who, "%s detected (%s)", out->launcher, l->rank_from);
        if (l->no_master_hint && strstr(p.missing, "MASTER_"))
            snprintf(hint, sizeof hint, " (%s)", l->no_master_hint);
        return fail_with(&p, who, hint);
    }
    out->rank = rank;
    out->world_size = size;
    out->local_rank = local_rank;
    out->local_world_size = local_size;
    return 0;
}

/* ------------------------------------------------------------- the steps */

int c10d__launch_resolve(struct c10d__launch *launch, int64_t timeout_ms)
{
    if (!launch->master_by_pmix)
        return 0;
    C10D_CHECK(c10d__pmix_exchange_master(launch->rank, launch->master_addr,
                                          sizeof launch->master_addr, &launch->master_port,
                                          timeout_ms));
    launch->master_by_pmix = 0;
    return 0;
}

static void read_environment(const char *env[C10D_ENV_COUNT])
{
    const struct c10d__env_var *table = c10d__env_table();
    for (int i = 0; i < C10D_ENV_COUNT; i++) {
        const char *v = c10d__env_str((enum c10d__env_id)i);
        /* Unset reads as the default text; every launcher variable's is "". */
        env[i] = v != NULL && *v != 0 && strcmp(v, table[i].default_text) ? v : NULL;
    }
}

int c10d__launch_detect(int need_rank, int64_t timeout_ms, struct c10d__launch *out)
{
    const char *env[C10D_ENV_COUNT];
    read_environment(env);
    int rc = c10d__launch_parse(env, need_rank, 1, out);
    if (rc < 0 && !need_rank && val(env, C10D_ENV_MASTER_ADDR) && val(env, C10D_ENV_MASTER_PORT)) {
        /* The caller gives rank and size: a launcher we cannot read is no
         * reason to fail while MASTER_ADDR and MASTER_PORT are there. */
        C10D_DEBUG("rendezvous", "launcher variables ignored: %s", c10d_last_error());
        int64_t port;
        if (strict_int(val(env, C10D_ENV_MASTER_PORT), 1, 65535, &port) < 0)
            return c10d__fail(C10D_EINVAL,
                              "rendezvous env://: MASTER_PORT='%s' is not a valid value (an "
                              "integer in [1, 65535])",
                              val(env, C10D_ENV_MASTER_PORT));
        memset(out, 0, sizeof *out);
        out->launcher = "caller";
        out->rank_from = "the caller";
        out->master_from = "MASTER_ADDR/MASTER_PORT";
        out->rank = out->world_size = out->local_rank = out->local_world_size = -1;
        snprintf(out->master_addr, sizeof out->master_addr, "%s", val(env, C10D_ENV_MASTER_ADDR));
        out->master_port = (int)port;
        rc = 0;
    }
    C10D_CHECK(rc);
    C10D_CHECK(c10d__launch_resolve(out, timeout_ms));
    if (need_rank)
        C10D_INFO("rendezvous", "rank %d/%d from %s (%s), local rank %d/%d, master %s:%d from %s",
                  out->rank, out->world_size, out->launcher, out->rank_from, out->local_rank,
                  out->local_world_size, out->master_addr, out->master_port, out->master_from);
    else
        C10D_INFO("rendezvous", "rank and size from the caller, master %s:%d from %s",
                  out->master_addr, out->master_port, out->master_from);
    return 0;
}

/* ------------------------------------------------------------ public */

int c10d_launch_query(c10d_launch_info *info)
{
    if (info == NULL)
        return c10d__fail(C10D_EINVAL, "c10d_launch_query: info is NULL");
    /* 0: this, the first layout (as `= {0}` means for every options struct). */
    size_t size = info->struct_size ? info->struct_size : sizeof *info;
    if (size < offsetof(c10d_launch_info, launcher) + sizeof info->launcher)
        return c10d__fail(C10D_EINVAL,
                          "c10d_launch_query: struct_size %zu is too small (use "
                          "C10D_LAUNCH_INFO_INIT)",
                          size);
    c10d__env_reload();
    const char *env[C10D_ENV_COUNT];
    read_environment(env);
    struct c10d__launch l;
    C10D_CHECK(c10d__launch_parse(env, 0, 0, &l));
    c10d_launch_info mine = {.struct_size = size < sizeof mine ? size : sizeof mine,
                             .rank = l.rank,
                             .world_size = l.world_size,
                             .local_rank = l.local_rank,
                             .local_world_size = l.local_world_size,
                             .launcher = l.launcher};
    memcpy(info, &mine, mine.struct_size);
    return 0;
}
