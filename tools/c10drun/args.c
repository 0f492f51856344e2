/* The command line: one table of options, their PET_* environment defaults (torchrun's
 * rule: --foo-bar's default is PET_FOO_BAR; the command line wins), parsing into struct
 * options, the checks that need every option at once, and the nearest known option for a
 * mistyped one. */
#include "c10drun.h"

#include <ctype.h>
#include <dirent.h>

static void usage(FILE *f)
{
    fprintf(f,
            "usage: c10drun -n N [options] PROGRAM [ARGS...]\n"
            "\n"
            "Starts N local ranks of PROGRAM with torchrun's environment (RANK, LOCAL_RANK,\n"
            "WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...), prefixes their output with the rank,\n"
            "forwards SIGINT/SIGTERM/SIGHUP/SIGQUIT, and stops every rank when one fails.\n"
            "With --nnodes K, one c10drun per node makes a job of K x N ranks.\n"
            "Every option --foo-bar takes its default from PET_FOO_BAR (as torchrun).\n"
            "\n"
            "ranks on this node:\n"
            "  -n, --nproc-per-node N|auto|cpu|gpu\n"
            "                           ranks on this node (1..%d); gpu: one per NVIDIA GPU,\n"
            "                           cpu: one per CPU, auto: gpu if any, else cpu\n"
            "  --bind-to core|none      core: pin rank r (all its threads) to the r-th CPU\n"
            "                           c10drun may use; needs N <= CPUs (default none)\n"
            "\n"
            "nodes and the store:\n"
            "  --nnodes K               nodes in the job (default 1); K:K is accepted, MIN:MAX\n"
            "                           (elastic membership) is not supported\n"
            "  --node-rank R            this node's rank, 0..K-1 (GROUP_RANK); needed when K > 1\n"
            "  --rdzv-endpoint H[:P]    where node 0's c10drun hosts the store (port default\n"
            "                           29400); sets MASTER_ADDR/MASTER_PORT\n"
            "  --rdzv-backend static|c10d\n"
            "                           both accepted, run alike: node ranks are given\n"
            "                           (--node-rank), never assigned\n"
            "  --rdzv-id ID, --run-id ID\n"
            "                           TORCHELASTIC_RUN_ID, the same on every node (default:\n"
            "                           c10drun-<pid>-<time> on one node, 'none' on several)\n"
            "  --standalone             one node, a free port on 127.0.0.1 (as torchrun)\n"
            "  --master-addr A          MASTER_ADDR (default 127.0.0.1)\n"
            "  --master-port P          MASTER_PORT (default: a free port on one node, 29500\n"
            "                           on several)\n"
            "  --store embedded|external\n"
            "                           embedded (default on one node): rank 0 hosts the store;\n"
            "                           external (always on several nodes): c10drun starts\n"
            "                           `c10d-store serve` (node 0) and the ranks are clients\n"
            "                           (TORCHELASTIC_USE_AGENT_STORE=True)\n"
            "  --store-bin PATH         the c10d-store executable (default: next to c10drun,\n"
            "                           then ../store_server/, then PATH)\n"
            "  --store-timeout S        how long the store may take to accept connections\n"
            "                           (default 30 on node 0, 600 on the others)\n"
            "\n"
            "failures:\n"
            "  --max-restarts M         restart the ranks of every node up to M times after a\n"
            "                           failure (TORCHELASTIC_RESTART_COUNT; default 0)\n"
            "  --failure-grace-ms MS    after a rank fails, the others have this long to exit\n"
            "                           by themselves (and report it) before SIGTERM (default "
            "3000)\n"
            "  --grace-ms MS            after SIGTERM, wait this long before SIGKILL (default "
            "5000)\n"
            "  --timeout S              stop everything after S seconds, exit 124\n"
            "\n"
            "output:\n"
            "  --log-dir DIR            files DIR/<run id>/attempt_<n>/<local rank>/std{out,err}"
            ".log\n"
            "  --tee SPEC               copy output to those files too: 0 none, 1 stdout,\n"
            "                           2 stderr, 3 both, or per local rank: 0:3,1:1\n"
            "  --redirects SPEC         the same, but the output goes only to the files\n"
            "  --no-prefix              ranks write straight to our stdout/stderr\n"
            "  -v, --verbose            say what c10drun does\n"
            "  -h, --help               this text\n"
            "  --version                print the version\n"
            "\n"
            "exit status: 0 when every rank exits 0; else the first failing rank's status,\n"
            "128+N if it was killed by signal N or if c10drun received signal N, 124 on\n"
            "--timeout, 1 when c10drun itself or another node failed, 2 on a usage error,\n"
            "127 when PROGRAM is not found.\n",
            MAX_NPROCS);
}

static bool parse_double(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= 0) || v > 1e9)
        return false;
    *out = v;
    return true;
}

static bool parse_long(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

/* An option with two values: `off` gives false, `on` true; else a usage message. */
static bool parse_pair(const char *opt, const char *s, const char *off, const char *on, bool *out)
{
    if (strcmp(s, off) == 0 || strcmp(s, on) == 0) {
        *out = strcmp(s, on) == 0;
        return true;
    }
    fprintf(stderr, "c10drun: %s wants %s or %s, got '%s'\n", opt, off, on, s);
    return false;
}

/* --tee/--redirects: "0".."3", or "LOCAL_RANK:0..3" items separated by commas (ranks not
 * named get 0), as torchrun. Returns the streams for `local_rank`, or -1 if malformed. */
int std_spec_for(const char *spec, int local_rank)
{
    if (!spec || !*spec)
        return 0;
    if (spec[0] >= '0' && spec[0] <= '3' && spec[1] == '\0')
        return spec[0] - '0';
    int found = 0;
    const char *p = spec;
    for (;;) {
        char *end;
        errno = 0;
        long r = strtol(p, &end, 10);
        if (errno || end == p || *end != ':' || r < 0 || end[1] < '0' || end[1] > '3')
            return -1;
        if (r == local_rank)
            found = end[1] - '0';
        p = end + 2;
        if (*p == '\0')
            return found;
        if (*p != ',')
            return -1;
        p++;
    }
}

/* NVIDIA GPUs this process may use, without CUDA: the driver's /proc entries (else
 * `nvidia-smi -L`), cut to CUDA_VISIBLE_DEVICES when it is set, as torch.cuda counts. */
static int count_gpus(void)
{
    int n = 0;
    DIR *d = opendir("/proc/driver/nvidia/gpus");
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)))
            if (e->d_name[0] != '.')
                n++;
        closedir(d);
    } else {
        FILE *p = popen("nvidia-smi -L 2>/dev/null", "r");
        if (p) {
            char line[512];
            while (fgets(line, sizeof line, p))
                if (strncmp(line, "GPU ", 4) == 0)
                    n++;
            pclose(p);
        }
    }
    const char *visible = getenv("CUDA_VISIBLE_DEVICES");
    if (visible && n > 0) {
        int listed = 0;
        for (const char *s = visible; *s; s++)
            if (!isspace((unsigned char)*s) && (s == visible || s[-1] == ','))
                listed++;
        if (listed < n)
            n = listed;
    }
    return n;
}

static int resolve_nprocs(const char *src, const char *spec, int *out)
{
    long v;
    int n;
    if (strcmp(spec, "gpu") == 0) {
        n = count_gpus();
        if (n == 0) {
            fprintf(stderr,
                    "c10drun: %s gpu: no NVIDIA GPU found (/proc/driver/nvidia/gpus, "
                    "nvidia-smi -L, CUDA_VISIBLE_DEVICES)\n",
                    src);
            return EXIT_USAGE;
        }
    } else if (strcmp(spec, "cpu") == 0 || strcmp(spec, "auto") == 0) {
        n = strcmp(spec, "auto") == 0 ? count_gpus() : 0;
        if (n == 0)
            n = (int)sysconf(_SC_NPROCESSORS_ONLN);
    } else if (parse_long(spec, 1, MAX_NPROCS, &v)) {
        n = (int)v;
    } else {
        fprintf(stderr,
                "c10drun: %s wants a number of ranks in 1..%d, auto, cpu or gpu, got '%s'\n", src,
                MAX_NPROCS, spec);
        return EXIT_USAGE;
    }
    if (n < 1)
        n = 1;
    *out = n > MAX_NPROCS ? MAX_NPROCS : n;
    return 0;
}

/* ------------------------------------------------------------------ the option table */

enum opt_id {
    OPT_NPROC = 'n',
    OPT_VERBOSE = 'v',
    OPT_HELP = 'h',
    OPT_STORE = 256,
    OPT_STORE_BIN,
    OPT_STORE_TIMEOUT,
    OPT_MASTER_ADDR,
    OPT_MASTER_PORT,
    OPT_GRACE,
    OPT_FAILURE_GRACE,
    OPT_TIMEOUT,
    OPT_RUN_ID,
    OPT_NO_PREFIX,
    OPT_BIND_TO,
    OPT_NNODES,
    OPT_NODE_RANK,
    OPT_RDZV_ENDPOINT,
    OPT_RDZV_BACKEND,
    OPT_STANDALONE,
    OPT_MAX_RESTARTS,
    OPT_LOG_DIR,
    OPT_TEE,
    OPT_REDIRECTS,
    OPT_VERSION,
};

struct opt_def {
    const char *name; /* the canonical spelling; PET_<NAME> with '-' as '_' is its default */
    int has_arg;
    int id;
    const char *alias; /* torchrun's underscore spelling, or another name; not suggested */
};

static const struct opt_def opt_defs[] = {
    {"nproc-per-node", required_argument, OPT_NPROC, "nproc_per_node"},
    {"nnodes", required_argument, OPT_NNODES, NULL},
    {"node-rank", required_argument, OPT_NODE_RANK, "node_rank"},
    {"rdzv-endpoint", required_argument, OPT_RDZV_ENDPOINT, "rdzv_endpoint"},
    {"rdzv-backend", required_argument, OPT_RDZV_BACKEND, "rdzv_backend"},
    {"rdzv-id", required_argument, OPT_RUN_ID, "rdzv_id"},
    {"run-id", required_argument, OPT_RUN_ID, NULL},
    {"standalone", no_argument, OPT_STANDALONE, NULL},
    {"max-restarts", required_argument, OPT_MAX_RESTARTS, "max_restarts"},
    {"master-addr", required_argument, OPT_MASTER_ADDR, "master_addr"},
    {"master-port", required_argument, OPT_MASTER_PORT, "master_port"},
    {"store", required_argument, OPT_STORE, NULL},
    {"store-bin", required_argument, OPT_STORE_BIN, NULL},
    {"store-timeout", required_argument, OPT_STORE_TIMEOUT, NULL},
    {"grace-ms", required_argument, OPT_GRACE, NULL},
    {"failure-grace-ms", required_argument, OPT_FAILURE_GRACE, NULL},
    {"timeout", required_argument, OPT_TIMEOUT, NULL},
    {"log-dir", required_argument, OPT_LOG_DIR, "log_dir"},
    {"tee", required_argument, OPT_TEE, NULL},
    {"redirects", required_argument, OPT_REDIRECTS, NULL},
    {"no-prefix", no_argument, OPT_NO_PREFIX, NULL},
    {"bind-to", required_argument, OPT_BIND_TO, NULL},
    {"verbose", no_argument, OPT_VERBOSE, NULL},
    {"help", no_argument, OPT_HELP, NULL},
    {"version", no_argument, OPT_VERSION, NULL},
};
#define N_OPT_DEFS (sizeof opt_defs / sizeof opt_defs[0])

/* Levenshtein distance, two rows; option names are short. */
static size_t edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 64 || lb > 64)
        return (size_t)-1;
    size_t prev[65], cur[65];
    for (size_t j = 0; j <= lb; j++)
        prev[j] = j;
    for (size_t i = 1; i <= la; i++) {
        cur[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t sub = prev[j - 1] + (a[i - 1] != b[j - 1]);
            size_t del = prev[j] + 1, ins = cur[j - 1] + 1;
            cur[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
        }
        memcpy(prev, cur, (lb + 1) * sizeof *prev);
    }
    return prev[lb];
}

/* "unknown option --nnodez; did you mean --nnodes?" when one is near enough to be a typo. */
static void unknown_option(const char *arg)
{
    char name[80];
    const char *s = arg;
    while (*s == '-')
        s++;
    snprintf(name, sizeof name, "%.*s", (int)strcspn(s, "="), s);
    for (char *p = name; *p; p++)
        if (*p == '_')
            *p = '-';
    const char *best = NULL;
    size_t best_d = (size_t)-1;
    for (size_t i = 0; i < N_OPT_DEFS; i++) {
        size_t d = edit_distance(name, opt_defs[i].name);
        if (d < best_d) {
            best_d = d;
            best = opt_defs[i].name;
        }
    }
    size_t limit = strlen(name) / 3 > 2 ? strlen(name) / 3 : 2;
    if (best && best_d <= limit)
        fprintf(stderr, "c10drun: unknown option %.*s; did you mean --%s?\n",
                (int)strcspn(arg, "="), arg, best);
    else
        fprintf(stderr, "c10drun: unknown option %.*s (c10drun --help lists them)\n",
                (int)strcspn(arg, "="), arg);
}

/* Applies one option; `src` names where it came from ("--nnodes" or "PET_NNODES") for the
 * messages. Returns 0 or an exit status. */
static int apply_option(struct options *o, int id, const char *src, const char *val)
{
    long v;
    switch (id) {
    case OPT_NPROC: {
        /* `src` is the caller's buffer; the value is resolved once every option is known. */
        static char nproc_src[64];
        snprintf(nproc_src, sizeof nproc_src, "%s", src);
        o->nproc_spec = val;
        o->nproc_src = nproc_src;
        break;
    }
    case OPT_NNODES: {
        /* MIN:MAX with MIN == MAX is a fixed size, which is what we support. */
        const char *colon = strchr(val, ':');
        long lo, hi;
        char first[32];
        snprintf(first, sizeof first, "%.*s", colon ? (int)(colon - val) : (int)strlen(val), val);
        if (!parse_long(first, 1, 65536, &lo) || (colon && !parse_long(colon + 1, 1, 65536, &hi))) {
            fprintf(stderr, "c10drun: %s wants a number of nodes N (or N:N), got '%s'\n", src, val);
            return EXIT_USAGE;
        }
        if (colon && hi != lo) {
            fprintf(stderr,
                    "c10drun: %s %s: elastic membership (MIN:MAX nodes) is not supported; "
                    "c10drun runs a fixed number of nodes: give --nnodes N\n",
                    src, val);
            return EXIT_USAGE;
        }
        o->nnodes = (int)lo;
        break;
    }
    case OPT_NODE_RANK:
        if (!parse_long(val, 0, 65535, &v)) {
            fprintf(stderr, "c10drun: %s wants a node rank >= 0, got '%s'\n", src, val);
            return EXIT_USAGE;
        }
        o->node_rank = (int)v;
        break;
    case OPT_RDZV_ENDPOINT:
        o->rdzv_endpoint = val;
        break;
    case OPT_RDZV_BACKEND:
        if (!parse_pair(src, val, "static", "c10d", &o->rdzv_c10d))
            return EXIT_USAGE;
        break;
    case OPT_STANDALONE:
        o->standalone = true;
        break;
    case OPT_MAX_RESTARTS:
        if (!parse_long(val, 0, 1000000, &v)) {
            fprintf(stderr, "c10drun: %s wants a count >= 0, got '%s'\n", src, val);
            return EXIT_USAGE;
        }
        o->max_restarts = (int)v;
        break;
    case OPT_STORE:
        if (!parse_pair(src, val, "embedded", "external", &o->external_store))
            return EXIT_USAGE;
        o->store_given = true;
        break;
    case OPT_STORE_BIN:
        o->store_bin = val;
        break;
    case OPT_STORE_TIMEOUT:
        if (!parse_double(val, &o->store_timeout_s) || o->store_timeout_s <= 0) {
            fprintf(stderr, "c10drun: %s wants seconds > 0, got '%s'\n", src, val);
            return EXIT_USAGE;
        }
        break;
    case OPT_MASTER_ADDR:
        o->master_addr = val;
        o->master_addr_given = true;
        break;
    case OPT_MASTER_PORT:
        if (!parse_long(val, 1, 65535, &v)) {
            fprintf(stderr, "c10drun: %s wants 1..65535, got '%s'\n", src, val);
            return EXIT_USAGE;
        }
        o->master_port = (int)v;
        break;
    case OPT_GRACE:
    case OPT_FAILURE_GRACE:
        if (!parse_long(val, 0, 86400000L, &v)) {
            fprintf(stderr, "c10drun: %s wants milliseconds >= 0, got '%s'\n", src, val);
            return EXIT_USAGE;
        }
        *(id == OPT_GRACE ? &o->grace_ms : &o->failure_grace_ms) = (uint64_t)v;
        break;
    case OPT_TIMEOUT:
        if (!parse_double(val, &o->timeout_s) || o->timeout_s <= 0) {
            fprintf(stderr, "c10drun: %s wants seconds > 0, got '%s'\n", src, val);
            return EXIT_USAGE;
        }
        break;
    case OPT_RUN_ID:
        o->run_id = val;
        break;
    case OPT_LOG_DIR:
        o->log_dir = val;
        break;
    case OPT_TEE:
    case OPT_REDIRECTS:
        if (std_spec_for(val, 0) < 0) {
            fprintf(stderr,
                    "c10drun: %s wants 0 (none), 1 (stdout), 2 (stderr), 3 (both) or per local "
                    "rank like 0:3,1:1, got '%s'\n",
                    src, val);
            return EXIT_USAGE;
        }
        *(id == OPT_TEE ? &o->tee : &o->redirects) = val;
        break;
    case OPT_NO_PREFIX:
        o->prefix = false;
        break;
    case OPT_BIND_TO:
        if (!parse_pair(src, val, "none", "core", &o->bind_core))
            return EXIT_USAGE;
        break;
    case OPT_VERBOSE:
        o->verbose = true;
        break;
    case OPT_HELP:
        usage(stdout);
        exit(0);
    case OPT_VERSION:
        printf("c10drun %s\n", C10DRUN_VERSION);
        exit(0);
    }
    return 0;
}

/* torchrun's rule: PET_<OPTION> is the option's default. Flags take 1/true/yes. */
static int apply_pet_env(struct options *o)
{
    static char names[N_OPT_DEFS][48];
    for (size_t i = 0; i < N_OPT_DEFS; i++) {
        const struct opt_def *d = &opt_defs[i];
        if (d->id == OPT_HELP || d->id == OPT_VERSION)
            continue;
        char *n = names[i];
        int k = snprintf(n, sizeof names[i], "PET_");
        for (const char *s = d->name; *s && k < (int)sizeof names[i] - 1; s++)
            n[k++] = *s == '-' ? '_' : (char)toupper((unsigned char)*s);
        n[k] = '\0';
        const char *val = getenv(n);
        if (!val)
            continue;
        if (d->has_arg == no_argument) {
            if (strcmp(val, "1") != 0 && strcasecmp(val, "true") != 0 &&
                strcasecmp(val, "yes") != 0)
                continue;
        } else if (!*val) {
            continue;
        }
        int rc = apply_option(o, d->id, n, val);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* Splits HOST[:PORT] ([v6]:port too) of --rdzv-endpoint into the master address and port. */
static int split_endpoint(struct options *o, char *buf, size_t n)
{
    const char *ep = o->rdzv_endpoint;
    const char *port = NULL;
    if (ep[0] == '[') {
        const char *close = strchr(ep, ']');
        if (!close || (close[1] && close[1] != ':'))
            goto bad;
        snprintf(buf, n, "%.*s", (int)(close - ep - 1), ep + 1);
        port = close[1] ? close + 2 : NULL;
    } else {
        const char *colon = strrchr(ep, ':');
        if (colon && strchr(ep, ':') != colon)
            colon = NULL; /* a bare IPv6 address */
        snprintf(buf, n, "%.*s", colon ? (int)(colon - ep) : (int)strlen(ep), ep);
        port = colon ? colon + 1 : NULL;
    }
    if (!buf[0])
        goto bad;
    long v = 29400; /* torchrun's rendezvous port */
    if (port && !parse_long(port, 1, 65535, &v))
        goto bad;
    o->master_addr = buf;
    o->master_port = (int)v;
    return 0;
bad:
    fprintf(stderr, "c10drun: --rdzv-endpoint wants HOST[:PORT], got '%s'\n", ep);
    return EXIT_USAGE;
}

/* The rules that involve several options. */
static int check_options(struct options *o)
{
    static char endpoint_host[256];
    if (o->standalone) {
        /* As torchrun: one node, a fresh store on a free local port, whatever else was said. */
        if (o->nnodes > 1 || o->rdzv_endpoint)
            fprintf(stderr, "c10drun: --standalone: ignoring --nnodes/--rdzv-endpoint (one node, "
                            "a free port on 127.0.0.1)\n");
        o->nnodes = 1;
        o->node_rank = 0;
        o->rdzv_endpoint = NULL;
        o->master_addr = "127.0.0.1";
        o->master_port = 0;
    }
    if (o->rdzv_endpoint) {
        int rc = split_endpoint(o, endpoint_host, sizeof endpoint_host);
        if (rc != 0)
            return rc;
        o->master_addr_given = true;
    }
    if (o->nnodes > 1) {
        if (o->node_rank < 0) {
            fprintf(stderr,
                    "c10drun: --nnodes %d needs --node-rank R (or PET_NODE_RANK) on every node: "
                    "c10drun assigns no node ranks, whatever the --rdzv-backend\n",
                    o->nnodes);
            return EXIT_USAGE;
        }
        if (!o->master_addr_given) {
            fprintf(stderr,
                    "c10drun: --nnodes %d needs --rdzv-endpoint HOST:PORT (or --master-addr): "
                    "node 0's address, where its c10drun hosts the store\n",
                    o->nnodes);
            return EXIT_USAGE;
        }
        if (o->store_given && !o->external_store) {
            fprintf(stderr,
                    "c10drun: --store embedded works on one node only: with --nnodes %d "
                    "node 0's c10drun hosts the store\n",
                    o->nnodes);
            return EXIT_USAGE;
        }
        o->external_store = true;
        if (o->master_port == 0)
            o->master_port = 29500; /* torchrun's --master-port default */
        if (!o->run_id)
            o->run_id = "none"; /* torchrun's --rdzv-id default; every node must agree */
    }
    if (o->node_rank < 0)
        o->node_rank = 0;
    if (o->node_rank >= o->nnodes) {
        fprintf(stderr, "c10drun: --node-rank %d is out of range for --nnodes %d\n", o->node_rank,
                o->nnodes);
        return EXIT_USAGE;
    }
    if ((o->tee || o->redirects) && !o->log_dir) {
        fprintf(stderr, "c10drun: --tee/--redirects need --log-dir DIR\n");
        return EXIT_USAGE;
    }
    /* Joining waits for the other nodes, which may be started up to 10 minutes later. */
    o->join_timeout_s = o->store_timeout_s != 0 ? o->store_timeout_s : 600;
    if (o->store_timeout_s == 0)
        o->store_timeout_s = o->node_rank == 0 ? 30 : 600;
    if (!o->nproc_spec) {
        fprintf(stderr, "c10drun: -n N is required\n");
        return EXIT_USAGE;
    }
    return resolve_nprocs(o->nproc_src, o->nproc_spec, &o->nprocs);
}

int parse_args(struct options *o, int argc, char **argv)
{
    struct option longs[2 * N_OPT_DEFS + 1];
    size_t k = 0;
    for (size_t i = 0; i < N_OPT_DEFS; i++) {
        longs[k++] = (struct option){opt_defs[i].name, opt_defs[i].has_arg, NULL, opt_defs[i].id};
        if (opt_defs[i].alias)
            longs[k++] =
                (struct option){opt_defs[i].alias, opt_defs[i].has_arg, NULL, opt_defs[i].id};
    }
    longs[k] = (struct option){NULL, 0, NULL, 0};

    memset(o, 0, sizeof *o);
    o->nnodes = 1;
    o->node_rank = -1;
    o->master_addr = "127.0.0.1";
    o->grace_ms = 5000;
    o->failure_grace_ms = 3000;
    o->prefix = true;
    int rc = apply_pet_env(o);
    if (rc != 0)
        return rc;

    /* getopt's own messages off: ours name the nearest option. */
    opterr = 0;
    int ch, li = -1;
    /* '+': options end at PROGRAM, so PROGRAM's own options are left alone. ':': a missing
     * argument is told apart from an unknown option. */
    while ((ch = getopt_long(argc, argv, "+:n:vh", longs, &li)) != -1) {
        const char *arg = argv[optind - 1];
        if (ch == '?') {
            if (optopt && optopt < 256)
                fprintf(stderr, "c10drun: unknown option -%c (c10drun --help lists them)\n",
                        optopt);
            else
                unknown_option(arg);
            return EXIT_USAGE;
        }
        if (ch == ':') {
            fprintf(stderr, "c10drun: option %s wants a value\n", arg);
            return EXIT_USAGE;
        }
        char src[64];
        if (li >= 0)
            snprintf(src, sizeof src, "--%s", longs[li].name);
        else
            snprintf(src, sizeof src, "-%c", ch);
        li = -1;
        rc = apply_option(o, ch, src, optarg);
        if (rc != 0)
            return rc;
    }
    if (optind >= argc) {
        fprintf(stderr, "c10drun: no PROGRAM given\n");
        usage(stderr);
        return EXIT_USAGE;
    }
    rc = check_options(o);
    if (rc != 0)
        return rc;
    o->argc = argc - optind;
    o->argv = argv + optind;
    return 0;
}
