/* Rank 0's address through PMIx, for launchers that run a PMIx server but
 * do not set MASTER_ADDR (Open MPI 4's mpirun; srun --mpi=pmix). libpmix is
 * loaded at run time, so the library builds and runs without it; the few
 * types and calls used are declared here with the layout of the PMIx
 * standard's ABI (v3 and later: pmix_info_t is 552 bytes on LP64).
 *
 * Rank 0 puts "host port" under one key, every process commits and joins a
 * fence that collects the data (bounded by the rendezvous timeout), then
 * reads rank 0's value. PMIx is finalized at once: Open MPI treats a
 * process that initialised PMIx and exits without finalizing as failed.
 *
 * Time: the fence carries PMIX_TIMEOUT (the rendezvous timeout). PMIx_Init
 * takes no timeout: PMIX_TIMEOUT is not an attribute of PMIx_Init, and its
 * connection to the server is bounded only by PMIx's own settings
 * (PMIX_MCA_ptl_base_handshake_wait_time and the connect retries), which
 * are PMIx's defaults unless the user sets them. What is bounded here: no
 * PMIx_Init at all unless the launcher's PMIx server gave this process
 * PMIX_NAMESPACE, PMIX_RANK and a PMIX_SERVER_URI* address; without them
 * PMIx_Init does not fail but makes the process a singleton whose fence
 * joins nobody. Blocking; the caller's thread. */
#include "api/launch_env.h"

#include "c10d.h"
#include "engine/env.h"
#include "engine/error.h"
#include "engine/log.h"

#include <dlfcn.h>
#include <limits.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define MASTER_KEY "c10d.master"

/* PMIx's constants and structs, as in its pmix_common.h. */
#define PMIX_SUCCESS    0
#define PMIX_BOOL       1
#define PMIX_STRING     3
#define PMIX_INT        6
#define PMIX_GLOBAL     3
#define PMIX_MAX_NSLEN  255
#define PMIX_MAX_KEYLEN 511

typedef struct {
    char nspace[PMIX_MAX_NSLEN + 1];
    uint32_t rank;
} pmix_proc;

typedef struct {
    uint16_t type;
    union {
        bool flag;
        int integer;
        char *string;
        uint64_t bytes[3]; /* the largest member (pmix_envar_t) */
    } data;
} pmix_value;

typedef struct {
    char key[PMIX_MAX_KEYLEN + 1];
    uint32_t flags;
    pmix_value value;
} pmix_info;

_Static_assert(sizeof(pmix_proc) == 260, "pmix_proc_t layout");
_Static_assert(sizeof(pmix_value) == 32, "pmix_value_t layout");
_Static_assert(sizeof(pmix_info) == 552, "pmix_info_t layout");

struct pmix_api {
    int (*init)(pmix_proc *proc, pmix_info *info, size_t ninfo);
    int (*finalize)(const pmix_info *info, size_t ninfo);
    int (*put)(uint8_t scope, const char *key, pmix_value *value);
    int (*commit)(void);
    int (*fence)(const pmix_proc *procs, size_t nprocs, const pmix_info *info, size_t ninfo);
    int (*get)(const pmix_proc *proc, const char *key, const pmix_info *info, size_t ninfo,
               pmix_value **value);
    const char *(*error_string)(int status);
};

static const char *const default_libraries[] = {"libpmix.so.2", "libpmix.so", NULL};

/* Loaded once and kept: PMIx's plugins and threads outlive a dlclose. */
static int load(struct pmix_api *api)
{
    static void *lib; /* under the caller's rendezvous; a race loads it twice, harmlessly */
    const char *configured = c10d__env_str(C10D_ENV_PMIX_LIBRARY);
    char tried[512] = "";
    if (lib == NULL) {
        const char *one[] = {configured, NULL};
        const char *const *names = configured && *configured ? one : default_libraries;
        for (int i = 0; lib == NULL && names[i]; i++) {
            /* GLOBAL: PMIx's own plugins resolve their symbols in it. */
            lib = dlopen(names[i], RTLD_NOW | RTLD_GLOBAL);
            if (lib == NULL) {
                size_t n = strlen(tried);
                snprintf(tried + n, sizeof tried - n, "%s%s", n ? "; " : "", dlerror());
            }
        }
    }
    if (lib == NULL)
        return c10d__fail(C10D_ENOTFOUND,
                          "rendezvous env://: MASTER_ADDR is unset and rank 0's address would "
                          "come from PMIx, but no PMIx library could be loaded (%s): set "
                          "MASTER_ADDR and MASTER_PORT (e.g. mpirun -x MASTER_ADDR=$(hostname) -x "
                          "MASTER_PORT=29500), or C10D_PMIX_LIBRARY to libpmix's path",
                          tried);
    void *fns[] = {dlsym(lib, "PMIx_Init"),        dlsym(lib, "PMIx_Finalize"),
                   dlsym(lib, "PMIx_Put"),         dlsym(lib, "PMIx_Commit"),
                   dlsym(lib, "PMIx_Fence"),       dlsym(lib, "PMIx_Get"),
                   dlsym(lib, "PMIx_Error_string")};
    _Static_assert(sizeof *api == sizeof fns, "one symbol per entry of pmix_api");
    for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++)
        if (fns[i] == NULL)
            return c10d__fail(C10D_ENOTFOUND,
                              "rendezvous env://: the PMIx library lacks a PMIx call (%zu): set "
                              "MASTER_ADDR and MASTER_PORT",
                              i);
    /* dlsym returns data pointers; POSIX guarantees they convert to functions. */
    memcpy(api, fns, sizeof *api);
    return 0;
}

/* A port nobody listens on now, for rank 0's store. */
static int free_port(void)
{
    int fd = socket(AF_INET6, SOCK_STREAM, 0);
    int v6 = fd >= 0;
    if (fd < 0)
        fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_storage ss;
    socklen_t len;
    memset(&ss, 0, sizeof ss);
    if (v6) {
        ((struct sockaddr_in6 *)&ss)->sin6_family = AF_INET6;
        len = sizeof(struct sockaddr_in6);
    } else {
        ((struct sockaddr_in *)&ss)->sin_family = AF_INET;
        len = sizeof(struct sockaddr_in);
    }
    int port = -1;
    if (bind(fd, (struct sockaddr *)&ss, len) == 0 &&
        getsockname(fd, (struct sockaddr *)&ss, &len) == 0)
        port = ntohs(v6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                        : ((struct sockaddr_in *)&ss)->sin_port);
    close(fd);
    return port;
}

static int pmix_fail(const struct pmix_api *api, int status, const char *step)
{
    return c10d__fail(C10D_EINVAL,
                      "rendezvous env://: MASTER_ADDR is unset and the PMIx exchange of rank 0's "
                      "address failed at %s: %s (%d); set MASTER_ADDR and MASTER_PORT",
                      step, api->error_string ? api->error_string(status) : "?", status);
}

int c10d__pmix_timeout_s(int64_t timeout_ms)
{
    /* Whole seconds, rounded up; never 0 (PMIx: no limit) nor negative. */
    if (timeout_ms <= 1000)
        return 1;
    int64_t s = timeout_ms / 1000 + (timeout_ms % 1000 != 0);
    return s > INT_MAX ? INT_MAX : (int)s;
}

/* The PMIx server's variables, as a server sets them for its clients:
 * NULL when all are there, else the first one missing. */
static const char *missing_server_var(void)
{
    /* Read as every variable is (engine/env.h); the URI's name varies with
     * the protocol version, so it is looked for in the environment, which
     * PMIx_Init reads the same way. */
    const char *ns = c10d__env_str(C10D_ENV_PMIX_NAMESPACE);
    const char *rank = c10d__env_str(C10D_ENV_PMIX_RANK);
    if (ns == NULL || *ns == 0)
        return "PMIX_NAMESPACE";
    if (rank == NULL || *rank == 0)
        return "PMIX_RANK";
    /* PMIX_SERVER_URI, PMIX_SERVER_URI2, ..21, ..3, ..4, ..41, ..51. */
    static const char uri[] = "PMIX_SERVER_URI";
    for (char **e = environ; e && *e; e++) {
        const char *eq = strchr(*e, '=');
        if (eq && eq[1] && !strncmp(*e, uri, sizeof uri - 1))
            return NULL;
    }
    return "PMIX_SERVER_URI*";
}

int c10d__pmix_exchange_master(int rank, char *addr, size_t addr_cap, int *port, int64_t timeout_ms)
{
    struct pmix_api api;
    memset(&api, 0, sizeof api);
    const char *missing = missing_server_var();
    if (missing)
        return c10d__fail(C10D_ENOTFOUND,
                          "rendezvous env://: MASTER_ADDR is unset and rank 0's address would "
                          "come from PMIx, but there is no PMIx server to ask (%s is not set; "
                          "PMIx_Init is not tried): set MASTER_ADDR and MASTER_PORT",
                          missing);
    C10D_CHECK(load(&api));
    pmix_proc me;
    memset(&me, 0, sizeof me);
    int st = api.init(&me, NULL, 0);
    if (st != PMIX_SUCCESS)
        return pmix_fail(&api, st, "PMIx_Init (is the PMIx server of the launcher reachable?)");
    int rc = 0;
    if ((int)me.rank != rank) {
        rc = c10d__fail(C10D_EINVAL,
                        "rendezvous env://: PMIx rank %u differs from rank %d: set MASTER_ADDR and "
                        "MASTER_PORT",
                        me.rank, rank);
        goto out;
    }
    char text[300];
    if (rank == 0) {
        if (*addr == 0 && gethostname(addr, addr_cap) != 0) {
            rc = c10d__fail(C10D_EINVAL, "rendezvous env://: gethostname failed");
            goto out;
        }
        addr[addr_cap - 1] = 0;
        if (*port == 0)
            *port = free_port();
        if (*port <= 0) {
            rc = c10d__fail(C10D_EINVAL, "rendezvous env://: no free port for rank 0's store");
            goto out;
        }
        snprintf(text, sizeof text, "%s %d", addr, *port);
        pmix_value v = {.type = PMIX_STRING, .data.string = text};
        st = api.put(PMIX_GLOBAL, MASTER_KEY, &v);
        if (st != PMIX_SUCCESS) {
            rc = pmix_fail(&api, st, "PMIx_Put");
            goto out;
        }
    }
    st = api.commit();
    if (st != PMIX_SUCCESS) {
        rc = pmix_fail(&api, st, "PMIx_Commit");
        goto out;
    }
    pmix_info fence_info[2];
    memset(fence_info, 0, sizeof fence_info);
    snprintf(fence_info[0].key, sizeof fence_info[0].key, "pmix.collect");
    fence_info[0].value.type = PMIX_BOOL;
    fence_info[0].value.data.flag = true;
    snprintf(fence_info[1].key, sizeof fence_info[1].key, "pmix.timeout");
    fence_info[1].value.type = PMIX_INT;
    fence_info[1].value.data.integer = c10d__pmix_timeout_s(timeout_ms);
    st = api.fence(NULL, 0, fence_info, 2);
    if (st != PMIX_SUCCESS) {
        rc = pmix_fail(&api, st, "PMIx_Fence (did every rank start?)");
        goto out;
    }
    if (rank != 0) {
        pmix_proc root = me;
        root.rank = 0;
        pmix_value *got = NULL;
        st = api.get(&root, MASTER_KEY, NULL, 0, &got);
        if (st != PMIX_SUCCESS || got == NULL || got->type != PMIX_STRING ||
            got->data.string == NULL) {
            rc = pmix_fail(&api, st != PMIX_SUCCESS ? st : -1, "PMIx_Get of rank 0's address");
            goto out;
        }
        char host[256];
        int p = 0;
        if (sscanf(got->data.string, "%255s %d", host, &p) != 2 || p < 1 || p > 65535) {
            rc = c10d__fail(C10D_EINVAL, "rendezvous env://: PMIx gave '%s' for rank 0's address",
                            got->data.string);
        } else {
            snprintf(addr, addr_cap, "%s", host);
            *port = p;
        }
        /* What PMIX_VALUE_RELEASE does: the value and its string are malloc'd. */
        free(got->data.string);
        free(got);
    }
out:
    api.finalize(NULL, 0);
    return rc;
}
