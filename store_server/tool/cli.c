/* c10d-store as a client (like redis-cli), built on the library's TCP store:
 * works against our server and PyTorch's, either dialect. */
#include "cli.h"

#include "c10d.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct cli {
    const char *cmd;
    const char *host;
    int port;
    int64_t timeout_ms;
    int dialect;
    const char *prefix;
    int block;
    c10d_store *store;
};

struct verb {
    const char *name;
    int min_args, max_args; /* positional arguments; -1: any number */
    const char *args;
    int (*run)(struct cli *c, int argc, char **argv);
};

static int fail(struct cli *c, int rc)
{
    fprintf(stderr, "c10d-store %s: %s (%s)\n", c->cmd, c10d_last_error(), c10d_status_name(rc));
    return 1;
}

static int parse_i64(const char *text, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno || end == text || *end)
        return -1;
    *out = v;
    return 0;
}

static void print_bytes(const void *data, size_t len)
{
    fwrite(data, 1, len, stdout);
    putchar('\n');
}

static int do_ping(struct cli *c, int argc, char **argv)
{
    (void)argc, (void)argv;
    int64_t rtt = 0;
    int rc = c10d_store_ping_sync(c->store, &rtt);
    if (rc < 0)
        return fail(c, rc);
    printf("pong from %s:%d in %" PRId64 " us (%s dialect)\n", c->host, c->port, rtt,
           c10d_store_dialect_of(c->store) == C10D_DIALECT_LEGACY ? "1.13" : "current");
    return 0;
}

static int do_set(struct cli *c, int argc, char **argv)
{
    (void)argc;
    int rc = c10d_store_set_sync(c->store, argv[0], argv[1], strlen(argv[1]));
    return rc < 0 ? fail(c, rc) : 0;
}

static int do_get(struct cli *c, int argc, char **argv)
{
    (void)argc;
    void *v;
    size_t len;
    int rc = c10d_store_get_sync(c->store, argv[0], &v, &len);
    if (rc < 0)
        return fail(c, rc);
    print_bytes(v, len);
    free(v);
    return 0;
}

static int do_add(struct cli *c, int argc, char **argv)
{
    int64_t delta = 1, v;
    if (argc > 1 && parse_i64(argv[1], &delta) < 0) {
        fprintf(stderr, "c10d-store add: delta '%s' is not an integer\n", argv[1]);
        return 2;
    }
    int rc = c10d_store_add_sync(c->store, argv[0], delta, &v);
    if (rc < 0)
        return fail(c, rc);
    printf("%" PRId64 "\n", v);
    return 0;
}

static int do_wait(struct cli *c, int argc, char **argv)
{
    int rc = c10d_store_wait_sync(c->store, (const char *const *)argv, (size_t)argc, c->timeout_ms);
    if (rc < 0)
        return fail(c, rc);
    printf("ready\n");
    return 0;
}

static int do_check(struct cli *c, int argc, char **argv)
{
    int ready = 0;
    int rc = c10d_store_check_sync(c->store, (const char *const *)argv, (size_t)argc, &ready);
    if (rc < 0)
        return fail(c, rc);
    printf("%s\n", ready ? "ready" : "not ready");
    return 0;
}

static int do_delete(struct cli *c, int argc, char **argv)
{
    (void)argc;
    int deleted = 0;
    int rc = c10d_store_delete_key_sync(c->store, argv[0], &deleted);
    if (rc < 0)
        return fail(c, rc);
    printf("%d\n", deleted);
    return 0;
}

static int do_num_keys(struct cli *c, int argc, char **argv)
{
    (void)argc, (void)argv;
    int64_t n;
    int rc = c10d_store_num_keys_sync(c->store, &n);
    if (rc < 0)
        return fail(c, rc);
    printf("%" PRId64 "\n", n);
    return 0;
}

static int do_keys(struct cli *c, int argc, char **argv)
{
    (void)argc, (void)argv;
    char **keys;
    size_t n;
    int rc = c10d_store_list_keys_sync(c->store, &keys, &n);
    if (rc < 0)
        return fail(c, rc);
    for (size_t i = 0; i < n; i++) {
        printf("%s\n", keys[i]);
        free(keys[i]);
    }
    free(keys);
    return 0;
}

static int do_compare_set(struct cli *c, int argc, char **argv)
{
    (void)argc;
    void *v;
    size_t len;
    int rc = c10d_store_compare_set_sync(c->store, argv[0], argv[1], strlen(argv[1]), argv[2],
                                         strlen(argv[2]), &v, &len);
    if (rc < 0)
        return fail(c, rc);
    print_bytes(v, len);
    free(v);
    return 0;
}

static int do_queue_push(struct cli *c, int argc, char **argv)
{
    (void)argc;
    int rc = c10d_store_queue_push_sync(c->store, argv[0], argv[1], strlen(argv[1]));
    return rc < 0 ? fail(c, rc) : 0;
}

static int do_queue_pop(struct cli *c, int argc, char **argv)
{
    (void)argc;
    void *v;
    size_t len;
    int rc = c10d_store_queue_pop_sync(c->store, argv[0], c->block, &v, &len);
    if (rc < 0)
        return fail(c, rc);
    print_bytes(v, len);
    free(v);
    return 0;
}

static int do_queue_len(struct cli *c, int argc, char **argv)
{
    (void)argc;
    int64_t n;
    int rc = c10d_store_queue_len_sync(c->store, argv[0], &n);
    if (rc < 0)
        return fail(c, rc);
    printf("%" PRId64 "\n", n);
    return 0;
}

static int do_barrier(struct cli *c, int argc, char **argv)
{
    (void)argc;
    int64_t n;
    if (parse_i64(argv[1], &n) < 0 || n <= 0 || n > INT32_MAX) {
        fprintf(stderr, "c10d-store barrier: world size '%s' is not a positive integer\n", argv[1]);
        return 2;
    }
    int rc = c10d_store_barrier(c->store, argv[0], (int)n, c->timeout_ms);
    if (rc < 0)
        return fail(c, rc);
    printf("barrier %s: all %" PRId64 " arrived\n", argv[0], n);
    return 0;
}

/* c10d-store answers its own STATS request with the server's JSON stats.
 * PyTorch's servers have no such request (they drop the connection on it),
 * so for them, or in the legacy dialect, report what a client can see. */
static int do_stats(struct cli *c, int argc, char **argv)
{
    (void)argc, (void)argv;
    char *json = NULL;
    if (c10d_store_dialect_of(c->store) != C10D_DIALECT_LEGACY &&
        c10d_store_server_stats_sync(c->store, &json) == 0) {
        printf("%s\n", json);
        free(json);
        return 0;
    }
    int64_t rtt = 0, n = 0;
    int rc = c10d_store_ping_sync(c->store, &rtt);
    if (rc == 0)
        rc = c10d_store_num_keys_sync(c->store, &n);
    if (rc < 0)
        return fail(c, rc);
    printf("{\"host\": \"%s\", \"port\": %d, \"dialect\": \"%s\", \"keys\": %" PRId64
           ", \"ping_us\": %" PRId64 "}\n",
           c->host, c->port,
           c10d_store_dialect_of(c->store) == C10D_DIALECT_LEGACY ? "legacy" : "current", n, rtt);
    return 0;
}

static const struct verb verbs[] = {
    {"ping", 0, 0, "", do_ping},
    {"set", 2, 2, "KEY VALUE", do_set},
    {"get", 1, 1, "KEY", do_get},
    {"add", 1, 2, "KEY [DELTA=1]", do_add},
    {"wait", 1, -1, "KEY...", do_wait},
    {"check", 1, -1, "KEY...", do_check},
    {"delete", 1, 1, "KEY", do_delete},
    {"num-keys", 0, 0, "", do_num_keys},
    {"keys", 0, 0, "", do_keys},
    {"compare-set", 3, 3, "KEY EXPECTED DESIRED", do_compare_set},
    {"queue-push", 2, 2, "KEY VALUE", do_queue_push},
    {"queue-pop", 1, 1, "KEY [--block]", do_queue_pop},
    {"queue-len", 1, 1, "KEY", do_queue_len},
    {"barrier", 2, 2, "NAME WORLD_SIZE", do_barrier},
    {"stats", 0, 0, "", do_stats},
};

static void usage(FILE *f, const struct verb *v)
{
    fprintf(f,
            "usage: c10d-store %s [options] %s\n"
            "  --host H            server address (default 127.0.0.1)\n"
            "  --port P            server port (default 29500)\n"
            "  --timeout-ms T      deadline of the connect and of the command (default 30000)\n"
            "  --dialect D         auto | current | legacy (PyTorch 1.13) (default auto)\n"
            "  --prefix P          run under PrefixStore(P), e.g. default_pg\n"
            "  --block             queue-pop: wait for an item\n"
            "Keys are sent as PyTorch's client sends them (\"/\" + key).\n",
            v->name, v->args);
}

int c10d__store_cli_run(int argc, char **argv)
{
    const struct verb *v = NULL;
    for (size_t i = 0; i < sizeof verbs / sizeof verbs[0]; i++)
        if (!strcmp(argv[0], verbs[i].name))
            v = &verbs[i];
    if (!v) {
        fprintf(stderr, "c10d-store: unknown client command '%s'\n", argv[0]);
        return 2;
    }
    struct cli c = {.cmd = v->name, .host = "127.0.0.1", .port = 29500, .timeout_ms = 30000};
    enum { O_HOST = 1000, O_PORT, O_TIMEOUT, O_DIALECT, O_PREFIX, O_BLOCK, O_HELP };
    static const struct option longopts[] = {
        {"host", required_argument, NULL, O_HOST},
        {"port", required_argument, NULL, O_PORT},
        {"timeout-ms", required_argument, NULL, O_TIMEOUT},
        {"dialect", required_argument, NULL, O_DIALECT},
        {"prefix", required_argument, NULL, O_PREFIX},
        {"block", no_argument, NULL, O_BLOCK},
        {"help", no_argument, NULL, O_HELP},
        {NULL, 0, NULL, 0},
    };
    int opt;
    int64_t n;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (opt) {
        case O_HOST:
            c.host = optarg;
            break;
        case O_PORT:
            if (parse_i64(optarg, &n) < 0 || n <= 0 || n > 65535) {
                fprintf(stderr, "c10d-store %s: bad port '%s'\n", v->name, optarg);
                return 2;
            }
            c.port = (int)n;
            break;
        case O_TIMEOUT:
            if (parse_i64(optarg, &n) < 0 || n <= 0) {
                fprintf(stderr, "c10d-store %s: bad timeout '%s'\n", v->name, optarg);
                return 2;
            }
            c.timeout_ms = n;
            break;
        case O_DIALECT:
            if (!strcmp(optarg, "auto"))
                c.dialect = C10D_DIALECT_AUTO;
            else if (!strcmp(optarg, "current"))
                c.dialect = C10D_DIALECT_CURRENT;
            else if (!strcmp(optarg, "legacy"))
                c.dialect = C10D_DIALECT_LEGACY;
            else {
                fprintf(stderr, "c10d-store %s: dialect must be auto, current or legacy\n",
                        v->name);
                return 2;
            }
            break;
        case O_PREFIX:
            c.prefix = optarg;
            break;
        case O_BLOCK:
            c.block = 1;
            break;
        case O_HELP:
            usage(stdout, v);
            return 0;
        default:
            usage(stderr, v);
            return 2;
        }
    }
    int nargs = argc - optind;
    if (nargs < v->min_args || (v->max_args >= 0 && nargs > v->max_args)) {
        usage(stderr, v);
        return 2;
    }
    c10d_store_tcp_opts o = {.timeout_ms = c.timeout_ms, .dialect = c.dialect};
    int rc = c10d_store_tcp_connect(c.host, c.port, &o, &c.store);
    if (rc < 0)
        return fail(&c, rc);
    if (c.prefix) {
        c10d_store *p;
        rc = c10d_store_prefix(c.store, c.prefix, &p);
        c10d_store_release(c.store);
        if (rc < 0)
            return fail(&c, rc);
        c.store = p;
    }
    int status = v->run(&c, nargs, argv + optind);
    c10d_store_release(c.store);
    c10d_shutdown();
    return status;
}
