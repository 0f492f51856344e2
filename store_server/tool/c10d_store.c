/* c10d-store: the TCPStore server as a process, and (later) a client CLI.
 *
 *   c10d-store serve --host H --port P [--world-size N] [limits...]
 *
 * Subcommands live in one dispatch table; the client ones (ping, set, get,
 * ...) plug in there, built on the library's TCP store client. */
#include "cli.h"
#include "store_server/server/server.h"

#include "engine/log.h"
#include "engine/token.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

/* ----------------------------------------------------------------- serve */

struct serve_state {
    uv_loop_t loop;
    struct c10d__store_server *server;
    uv_signal_t sigterm, sigint, sigusr1;
    uv_timer_t stats_timer;
    uint64_t stats_interval_ms;
};

/* Stats lines print whatever the log threshold: that is what they are for. */
static void log_stats(struct serve_state *st)
{
    char *json = c10d__store_server_stats_json(st->server);
    if (json) {
        c10d__log(C10D_LOG_INFO, "store", "stats %s", json);
        free(json);
    }
}

static void on_stats_timer(uv_timer_t *t)
{
    log_stats(t->data);
}

static void on_stopped(void *arg)
{
    struct serve_state *st = arg;
    st->server = NULL;
    uv_close((uv_handle_t *)&st->sigterm, NULL);
    uv_close((uv_handle_t *)&st->sigint, NULL);
    uv_close((uv_handle_t *)&st->sigusr1, NULL);
    uv_close((uv_handle_t *)&st->stats_timer, NULL);
}

static void on_signal(uv_signal_t *h, int signum)
{
    struct serve_state *st = h->data;
    if (signum == SIGUSR1) {
        log_stats(st);
        return;
    }
    if (!st->server)
        return;
    c10d__log(C10D_LOG_INFO, "store", "signal %d: shutting down", signum);
    log_stats(st);
    c10d__store_server_stop(st->server, on_stopped, st);
}

/* "64K", "8M", "1G", "1048576". */
static int parse_size(const char *text, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno || end == text || text[0] == '-')
        return -1;
    unsigned shift = 0;
    switch (*end) {
    case 'k':
    case 'K':
        shift = 10, end++;
        break;
    case 'm':
    case 'M':
        shift = 20, end++;
        break;
    case 'g':
    case 'G':
        shift = 30, end++;
        break;
    }
    if (*end == 'i' || *end == 'B')
        end++;
    if (*end == 'B')
        end++;
    if (*end || (shift && v > (UINT64_MAX >> shift)))
        return -1;
    *out = (uint64_t)v << shift;
    return 0;
}

static int write_port_file(const char *path, int port)
{
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)uv_os_getpid());
    FILE *f = fopen(tmp, "w");
    if (!f)
        return -1;
    fprintf(f, "%d\n", port);
    if (fclose(f) != 0 || rename(tmp, path) != 0) {
        remove(tmp);
        return -1;
    }
    return 0;
}

static void serve_usage(FILE *f)
{
    fprintf(f, "usage: c10d-store serve [--host H] [--port P] [options]\n"
               "  --host H                  address to listen on, and only that one (default: "
               "every address, IPv6 and IPv4)\n"
               "  --port P                  port (default 29500; 0 picks a free one)\n"
               "  --port-file F             write the port number to F once listening\n"
               "  --world-size N            log when N workers registered (init/ reaches N)\n"
               "  --max-key-bytes S         one key (default 64K)\n"
               "  --max-value-bytes S       one value (default 256M)\n"
               "  --max-keys-per-request N  CHECK/WAIT/MULTI_* keys (default 131072)\n"
               "  --max-request-bytes S     one request (default 1G)\n"
               "  --max-memory S            keys, values, request and reply buffers (default 4G)\n"
               "  --max-reply-bytes S       one reply; a request whose reply is larger is refused "
               "by closing its connection (default: max value + 1M)\n"
               "  --max-connections N       open connections (default 65536)\n"
               "  --max-pending-write S     unread replies before reads pause (default 8M; "
               "closed at 4x)\n"
               "  --max-queued-replies S    unsent replies, all connections together, before "
               "every connection pauses (default 256M)\n"
               "  --slow-reader-timeout-ms T  while paused so, close clients whose replies have "
               "not moved for T; T/4 for a client over its share of the queued replies "
               "(default 10000)\n"
               "  --validate-timeout-ms T   first request must complete within T (default 30000)\n"
               "  --request-timeout-ms T    close a connection that sends no byte for T in the "
               "middle of a request (default 30000)\n"
               "  --silent-timeout-ms T     close connections silent for T (default 0: never)\n"
               "  --stats-interval-s T      log JSON stats every T seconds (default 60; 0: off)\n"
               "  --token-file F            clients must present the secret on F's first line\n"
               "                            (default: C10D_STORE_TOKEN or C10D_STORE_TOKEN_FILE;\n"
               "                            none: no token)\n"
               "SIGUSR1 logs stats; SIGTERM/SIGINT stop cleanly. Sizes take K/M/G suffixes.\n");
}

static int cmd_serve(int argc, char **argv)
{
    enum {
        O_HOST = 1000,
        O_PORT,
        O_PORT_FILE,
        O_WORLD,
        O_KEY,
        O_VALUE,
        O_KEYS,
        O_REQ,
        O_MEM,
        O_CONN,
        O_PENDING,
        O_QUEUED,
        O_SLOW,
        O_VALIDATE,
        O_SILENT,
        O_REPLY,
        O_REQ_TIMEOUT,
        O_STATS,
        O_TOKEN_FILE,
        O_HELP
    };
    static const struct option longopts[] = {
        {"host", required_argument, NULL, O_HOST},
        {"port", required_argument, NULL, O_PORT},
        {"port-file", required_argument, NULL, O_PORT_FILE},
        {"world-size", required_argument, NULL, O_WORLD},
        {"max-key-bytes", required_argument, NULL, O_KEY},
        {"max-value-bytes", required_argument, NULL, O_VALUE},
        {"max-keys-per-request", required_argument, NULL, O_KEYS},
        {"max-request-bytes", required_argument, NULL, O_REQ},
        {"max-memory", required_argument, NULL, O_MEM},
        {"max-connections", required_argument, NULL, O_CONN},
        {"max-pending-write", required_argument, NULL, O_PENDING},
        {"max-queued-replies", required_argument, NULL, O_QUEUED},
        {"slow-reader-timeout-ms", required_argument, NULL, O_SLOW},
        {"validate-timeout-ms", required_argument, NULL, O_VALIDATE},
        {"silent-timeout-ms", required_argument, NULL, O_SILENT},
        {"max-reply-bytes", required_argument, NULL, O_REPLY},
        {"request-timeout-ms", required_argument, NULL, O_REQ_TIMEOUT},
        {"stats-interval-s", required_argument, NULL, O_STATS},
        {"token-file", required_argument, NULL, O_TOKEN_FILE},
        {"help", no_argument, NULL, O_HELP},
        {NULL, 0, NULL, 0},
    };
    struct c10d__store_server_opts opts = {.port = 29500};
    const char *port_file = NULL, *token_file = NULL;
    uint64_t stats_s = 60, v;
    int opt;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        if (opt == O_HELP) {
            serve_usage(stdout);
            return 0;
        }
        if (opt == O_HOST) {
            opts.host = optarg;
            continue;
        }
        if (opt == O_PORT_FILE) {
            port_file = optarg;
            continue;
        }
        if (opt == O_TOKEN_FILE) {
            token_file = optarg;
            continue;
        }
        if (opt == '?' || parse_size(optarg, &v) < 0) {
            if (opt != '?')
                fprintf(stderr, "c10d-store serve: bad value '%s'\n", optarg);
            serve_usage(stderr);
            return 2;
        }
        switch (opt) {
        case O_PORT:
            if (v > 65535) {
                fprintf(stderr, "c10d-store serve: bad port '%s'\n", optarg);
                return 2;
            }
            opts.port = (int)v;
            break;
        case O_WORLD:
            opts.world_size = v > INT32_MAX ? INT32_MAX : (int)v;
            break;
        case O_KEY:
            opts.limits.max_key_bytes = v;
            break;
        case O_VALUE:
            opts.limits.max_value_bytes = v;
            break;
        case O_KEYS:
            opts.limits.max_keys_per_request = v;
            break;
        case O_REQ:
            opts.limits.max_request_bytes = v;
            break;
        case O_MEM:
            opts.limits.max_memory_bytes = v;
            break;
        case O_CONN:
            opts.limits.max_connections = v;
            break;
        case O_PENDING:
            opts.limits.max_pending_write_bytes = v;
            break;
        case O_QUEUED:
            opts.limits.max_queued_reply_bytes = v;
            break;
        case O_SLOW:
            opts.limits.slow_reader_timeout_ms = v;
            break;
        case O_VALIDATE:
            opts.limits.validate_timeout_ms = v;
            break;
        case O_SILENT:
            opts.limits.silent_timeout_ms = v;
            break;
        case O_REPLY:
            opts.limits.max_reply_bytes = v;
            break;
        case O_REQ_TIMEOUT:
            opts.limits.request_timeout_ms = v;
            break;
        case O_STATS:
            stats_s = v;
            break;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "c10d-store serve: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }

    /* --token-file, else the job's C10D_STORE_TOKEN[_FILE], so that a store
     * started next to the ranks (c10drun --store external) checks what they
     * present. */
    static uint8_t token[C10D_TOKEN_MAX];
    if (token_file) {
        int n = c10d__token_read_file(token_file, token);
        if (n < 0) {
            fprintf(stderr, "c10d-store serve: %s\n", c10d_last_error());
            return 2;
        }
        opts.token = token;
        opts.token_len = (size_t)n;
    } else if (c10d__token_get(&opts.token, &opts.token_len) < 0) {
        fprintf(stderr, "c10d-store serve: %s\n", c10d_last_error());
        return 2;
    }

    struct serve_state st = {0};
    uv_loop_init(&st.loop);
    int rc = c10d__store_server_start(&st.loop, &opts, &st.server);
    if (rc < 0) {
        fprintf(stderr, "c10d-store serve: %s\n", c10d_last_error());
        uv_run(&st.loop, UV_RUN_DEFAULT);
        uv_loop_close(&st.loop);
        return 1;
    }
    int port = c10d__store_server_port(st.server);
    printf("c10d-store listening on port %d\n", port);
    fflush(stdout);
    if (port_file && write_port_file(port_file, port) < 0)
        fprintf(stderr, "c10d-store serve: cannot write %s: %s\n", port_file, strerror(errno));
    uv_signal_t *sigs[] = {&st.sigterm, &st.sigint, &st.sigusr1};
    int signums[] = {SIGTERM, SIGINT, SIGUSR1};
    for (int i = 0; i < 3; i++) {
        uv_signal_init(&st.loop, sigs[i]);
        sigs[i]->data = &st;
        uv_signal_start(sigs[i], on_signal, signums[i]);
    }
    uv_timer_init(&st.loop, &st.stats_timer);
    st.stats_timer.data = &st;
    if (stats_s > 0) {
        uv_timer_start(&st.stats_timer, on_stats_timer, stats_s * 1000, stats_s * 1000);
        uv_unref((uv_handle_t *)&st.stats_timer);
    }
    uv_run(&st.loop, UV_RUN_DEFAULT);
    if (uv_loop_close(&st.loop) != 0)
        C10D_WARN("store", "loop closed with handles still open");
    return 0;
}

/* ------------------------------------------------------------- dispatch */

struct subcommand {
    const char *name;
    int (*run)(int argc, char **argv); /* argv[0] is the subcommand */
    const char *help;
};

/* Client subcommands (ping set get add wait check delete num-keys keys
 * compare-set queue-push queue-pop queue-len barrier stats) go here. */
static const struct subcommand subcommands[] = {
    {"serve", cmd_serve, "run a store server (both PyTorch TCPStore dialects)"},
    /* client subcommands: c10d_store_client.c */
    {"ping", c10d__store_cli_run, "check that a server answers; round trip"},
    {"set", c10d__store_cli_run, "KEY VALUE"},
    {"get", c10d__store_cli_run, "KEY (waits for it up to the timeout)"},
    {"add", c10d__store_cli_run, "KEY [DELTA]: add to a counter, print the new value"},
    {"wait", c10d__store_cli_run, "KEY...: wait until every key exists"},
    {"check", c10d__store_cli_run, "KEY...: whether every key exists"},
    {"delete", c10d__store_cli_run, "KEY"},
    {"num-keys", c10d__store_cli_run, "number of keys"},
    {"keys", c10d__store_cli_run, "list keys (servers with LIST_KEYS)"},
    {"compare-set", c10d__store_cli_run, "KEY EXPECTED DESIRED"},
    {"queue-push", c10d__store_cli_run, "KEY VALUE"},
    {"queue-pop", c10d__store_cli_run, "KEY [--block]"},
    {"queue-len", c10d__store_cli_run, "KEY"},
    {"barrier", c10d__store_cli_run, "NAME WORLD_SIZE: torch's store-based barrier"},
    {"stats", c10d__store_cli_run, "what a client sees: dialect, keys, round trip (JSON)"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: c10d-store <command> [options]\ncommands:\n");
    for (size_t i = 0; i < sizeof subcommands / sizeof subcommands[0]; i++)
        fprintf(f, "  %-12s %s\n", subcommands[i].name, subcommands[i].help);
    fprintf(f, "'c10d-store <command> --help' shows a command's options.\n");
}

int main(int argc, char **argv)
{
    /* A peer that closes with replies unread must cost its connection
     * (EPIPE), never the process: the server and the client commands alike. */
    signal(SIGPIPE, SIG_IGN);
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof subcommands / sizeof subcommands[0]; i++)
        if (!strcmp(argv[1], subcommands[i].name))
            return subcommands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "c10d-store: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
