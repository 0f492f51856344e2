/* The command line: usage and option parsing into struct options. */
#include "c10drun.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: c10drun -n N [options] PROGRAM [ARGS...]\n"
            "\n"
            "Starts N local ranks of PROGRAM with torchrun's environment (RANK, LOCAL_RANK,\n"
            "WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...), prefixes their output with the rank,\n"
            "forwards SIGINT/SIGTERM/SIGHUP/SIGQUIT, and stops every rank when one fails.\n"
            "\n"
            "options:\n"
            "  -n, --nproc-per-node N   number of ranks (1..%d)\n"
            "  --store embedded|external\n"
            "                           embedded (default): rank 0 hosts the store;\n"
            "                           external: start `c10d-store serve` and make every rank a\n"
            "                           client (TORCHELASTIC_USE_AGENT_STORE=True)\n"
            "  --store-bin PATH         the c10d-store executable (default: next to c10drun,\n"
            "                           then ../store_server/, then PATH)\n"
            "  --store-timeout S        how long the external store may take to accept\n"
            "                           connections (default 30)\n"
            "  --master-addr A          MASTER_ADDR (default 127.0.0.1)\n"
            "  --master-port P          MASTER_PORT (default: a free port)\n"
            "  --grace-ms MS            after SIGTERM, wait this long before SIGKILL (default "
            "5000)\n"
            "  --timeout S              stop everything after S seconds, exit 124\n"
            "  --run-id ID              TORCHELASTIC_RUN_ID (default: c10drun-<pid>-<time>)\n"
            "  --no-prefix              ranks write straight to our stdout/stderr\n"
            "  --bind-to core|none      core: pin rank r (all its threads) to the r-th CPU\n"
            "                           c10drun may use, as mpirun does for 2 ranks; needs\n"
            "                           N <= CPUs (default none, as torchrun)\n"
            "  -v, --verbose            say what c10drun does\n"
            "  -h, --help               this text\n"
            "  --version                print the version\n"
            "\n"
            "exit status: 0 when every rank exits 0; else the first failing rank's status,\n"
            "128+N if it was killed by signal N or if c10drun received signal N, 124 on\n"
            "--timeout, 1 when c10drun itself failed, 2 on a usage error, 127 when PROGRAM\n"
            "is not found.\n",
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

enum {
    OPT_STORE = 256,
    OPT_STORE_BIN,
    OPT_STORE_TIMEOUT,
    OPT_MASTER_ADDR,
    OPT_MASTER_PORT,
    OPT_GRACE,
    OPT_TIMEOUT,
    OPT_RUN_ID,
    OPT_NO_PREFIX,
    OPT_BIND_TO,
    OPT_VERSION,
};

int parse_args(struct options *o, int argc, char **argv)
{
    static const struct option longs[] = {
        {"nproc-per-node", required_argument, NULL, 'n'},
        {"nproc_per_node", required_argument, NULL, 'n'},
        {"store", required_argument, NULL, OPT_STORE},
        {"store-bin", required_argument, NULL, OPT_STORE_BIN},
        {"store-timeout", required_argument, NULL, OPT_STORE_TIMEOUT},
        {"master-addr", required_argument, NULL, OPT_MASTER_ADDR},
        {"master_addr", required_argument, NULL, OPT_MASTER_ADDR},
        {"master-port", required_argument, NULL, OPT_MASTER_PORT},
        {"master_port", required_argument, NULL, OPT_MASTER_PORT},
        {"grace-ms", required_argument, NULL, OPT_GRACE},
        {"timeout", required_argument, NULL, OPT_TIMEOUT},
        {"run-id", required_argument, NULL, OPT_RUN_ID},
        {"no-prefix", no_argument, NULL, OPT_NO_PREFIX},
        {"bind-to", required_argument, NULL, OPT_BIND_TO},
        {"verbose", no_argument, NULL, 'v'},
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, OPT_VERSION},
        {NULL, 0, NULL, 0},
    };
    o->nprocs = 0;
    o->master_addr = "127.0.0.1";
    o->grace_ms = 5000;
    o->store_timeout_s = 30;
    o->prefix = true;
    long v;
    int ch;
    /* '+': options end at PROGRAM, so PROGRAM's own options are left alone. */
    while ((ch = getopt_long(argc, argv, "+n:vh", longs, NULL)) != -1) {
        switch (ch) {
        case 'n':
            if (!parse_long(optarg, 1, MAX_NPROCS, &v)) {
                fprintf(stderr, "c10drun: -n wants a number of ranks in 1..%d, got '%s'\n",
                        MAX_NPROCS, optarg);
                return EXIT_USAGE;
            }
            o->nprocs = (int)v;
            break;
        case OPT_STORE:
            if (!parse_pair("--store", optarg, "embedded", "external", &o->external_store))
                return EXIT_USAGE;
            break;
        case OPT_STORE_BIN:
            o->store_bin = optarg;
            break;
        case OPT_STORE_TIMEOUT:
            if (!parse_double(optarg, &o->store_timeout_s) || o->store_timeout_s <= 0) {
                fprintf(stderr, "c10drun: --store-timeout wants seconds > 0, got '%s'\n", optarg);
                return EXIT_USAGE;
            }
            break;
        case OPT_MASTER_ADDR:
            o->master_addr = optarg;
            break;
        case OPT_MASTER_PORT:
            if (!parse_long(optarg, 1, 65535, &v)) {
                fprintf(stderr, "c10drun: --master-port wants 1..65535, got '%s'\n", optarg);
                return EXIT_USAGE;
            }
            o->master_port = (int)v;
            break;
        case OPT_GRACE:
            if (!parse_long(optarg, 0, 86400000L, &v)) {
                fprintf(stderr, "c10drun: --grace-ms wants milliseconds >= 0, got '%s'\n", optarg);
                return EXIT_USAGE;
            }
            o->grace_ms = (uint64_t)v;
            break;
        case OPT_TIMEOUT:
            if (!parse_double(optarg, &o->timeout_s) || o->timeout_s <= 0) {
                fprintf(stderr, "c10drun: --timeout wants seconds > 0, got '%s'\n", optarg);
                return EXIT_USAGE;
            }
            break;
        case OPT_RUN_ID:
            o->run_id = optarg;
            break;
        case OPT_NO_PREFIX:
            o->prefix = false;
            break;
        case OPT_BIND_TO:
            if (!parse_pair("--bind-to", optarg, "none", "core", &o->bind_core))
                return EXIT_USAGE;
            break;
        case 'v':
            o->verbose = true;
            break;
        case 'h':
            usage(stdout);
            exit(0);
        case OPT_VERSION:
            printf("c10drun %s\n", C10DRUN_VERSION);
            exit(0);
        default:
            usage(stderr);
            return EXIT_USAGE;
        }
    }
    if (optind >= argc) {
        fprintf(stderr, "c10drun: no PROGRAM given\n");
        usage(stderr);
        return EXIT_USAGE;
    }
    if (o->nprocs == 0) {
        fprintf(stderr, "c10drun: -n N is required\n");
        return EXIT_USAGE;
    }
    o->argc = argc - optind;
    o->argv = argv + optind;
    return 0;
}

/* --bind-to core: rank r gets the r-th CPU of our own affinity mask, so c10drun
 * under taskset or in a cpuset binds within it. More ranks than CPUs is refused:
 * two ranks pinned to one CPU is worse than letting the scheduler place them. */
