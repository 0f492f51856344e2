/* The environment each rank gets: ours minus what we manage, plus torchrun's
 * variables for its rank. */
#include "c10drun.h"

/* ------------------------------------------------------------------ environment */

static const char *const managed_vars[] = {
    "RANK",
    "LOCAL_RANK",
    "GROUP_RANK",
    "ROLE_RANK",
    "ROLE_NAME",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "ROLE_WORLD_SIZE",
    "GROUP_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_USE_AGENT_STORE",
    NULL,
};

static bool is_managed(const char *entry)
{
    for (const char *const *v = managed_vars; *v; v++) {
        size_t n = strlen(*v);
        if (strncmp(entry, *v, n) == 0 && entry[n] == '=')
            return true;
    }
    return false;
}

extern char **environ;

void build_base_env(struct launcher *l)
{
    size_t n = 0;
    while (environ[n])
        n++;
    l->base_env = xmalloc((n + 1) * sizeof *l->base_env);
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (!is_managed(environ[i]))
            l->base_env[k++] = environ[i];
    l->base_env[k] = NULL;
    l->base_env_len = k;
}

#define RANK_VARS 17

/* The environment of one rank; the strings after the base entries are owned by it. */
char **rank_env(struct launcher *l, int local_rank)
{
    char **env = xmalloc((l->base_env_len + RANK_VARS + 1) * sizeof *env);
    memcpy(env, l->base_env, l->base_env_len * sizeof *env);
    char **e = env + l->base_env_len;
    int n = l->opt.nprocs;
    /* Every node runs the same number of ranks (static rendezvous), so ranks are
     * node-major, as torchrun numbers them. */
    int world = l->opt.nnodes * n;
    int rank = l->opt.node_rank * n + local_rank;
    *e++ = xasprintf("RANK=%d", rank);
    *e++ = xasprintf("LOCAL_RANK=%d", local_rank);
    *e++ = xasprintf("GROUP_RANK=%d", l->opt.node_rank);
    *e++ = xasprintf("ROLE_RANK=%d", rank);
    *e++ = xasprintf("ROLE_NAME=default");
    *e++ = xasprintf("WORLD_SIZE=%d", world);
    *e++ = xasprintf("LOCAL_WORLD_SIZE=%d", n);
    *e++ = xasprintf("ROLE_WORLD_SIZE=%d", world);
    *e++ = xasprintf("GROUP_WORLD_SIZE=%d", l->opt.nnodes);
    *e++ = xasprintf("MASTER_ADDR=%s", l->opt.master_addr);
    *e++ = xasprintf("MASTER_PORT=%s", l->port_text);
    *e++ = xasprintf("TORCHELASTIC_RUN_ID=%s", l->run_id);
    *e++ = xasprintf("TORCHELASTIC_RESTART_COUNT=%d", l->restart_count);
    *e++ = xasprintf("TORCHELASTIC_MAX_RESTARTS=%d", l->opt.max_restarts);
    *e++ = xasprintf("TORCHELASTIC_USE_AGENT_STORE=%s", l->agent_store ? "True" : "False");
    /* As torchrun: N ranks each spawning one thread per core would oversubscribe the host. */
    if (n > 1 && !getenv("OMP_NUM_THREADS"))
        *e++ = xasprintf("OMP_NUM_THREADS=1");
    *e = NULL;
    return env;
}

void free_rank_env(struct launcher *l, char **env)
{
    for (char **e = env + l->base_env_len; *e; e++)
        free(*e);
    free(env);
}
