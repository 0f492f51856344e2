#include "env.h"

#include "log.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <pthread.h>
#include <uv.h>

static const struct c10d__env_var env_table[C10D_ENV_COUNT] = {
#define C10D_ENV_ROW(id, name, fallback, def, doc) {name, fallback, def, doc},
    C10D_ENV_VARS(C10D_ENV_ROW)
#undef C10D_ENV_ROW
};

/* Values captured at first use: getenv() is not thread-safe against setenv(),
 * so we read the environment once, under a lock. */
static char *env_values[C10D_ENV_COUNT];
static int env_from_fallback[C10D_ENV_COUNT];
static int env_loaded;
/* A plain pthread mutex, not uv_mutex_t: the fork child unlocks it on a
 * thread that did not lock it, which a debug libuv's error-checking mutex
 * would refuse (and abort). */
static pthread_mutex_t env_mutex;
static uv_once_t env_once = UV_ONCE_INIT;

/* A fork while another thread reads the environment would leave the child's
 * copy of the lock held for ever: the forking thread takes it first. */
static void env_fork_prepare(void)
{
    pthread_mutex_lock(&env_mutex);
}

static void env_fork_release(void)
{
    pthread_mutex_unlock(&env_mutex);
}

static void env_init_mutex(void)
{
    pthread_mutex_init(&env_mutex, NULL);
    pthread_atfork(env_fork_prepare, env_fork_release, env_fork_release);
}

void c10d__env_init(void)
{
    uv_once(&env_once, env_init_mutex);
}

/* Bumped on every (re)load: readers that cache a parsed value compare it. */
static atomic_uint env_generation;

static void env_load_locked(void)
{
    for (int i = 0; i < C10D_ENV_COUNT; i++) {
        free(env_values[i]);
        env_values[i] = NULL;
        env_from_fallback[i] = 0;
        const char *v = getenv(env_table[i].name);
        /* The fallbacks in order: "A, B" (torch's newer name first). */
        for (const char *f = env_table[i].fallback; (v == NULL || *v == '\0') && f != NULL;) {
            const char *end = strchr(f, ',');
            size_t len = end != NULL ? (size_t)(end - f) : strlen(f);
            char name[64];
            if (len < sizeof name) {
                memcpy(name, f, len);
                name[len] = '\0';
                v = getenv(name);
                env_from_fallback[i] = v != NULL && *v != '\0';
            }
            f = end != NULL ? end + 2 : NULL;
        }
        if (v != NULL && *v != '\0')
            env_values[i] = strdup(v);
    }
    env_loaded = 1;
    atomic_fetch_add(&env_generation, 1);
}

static const char *env_value(enum c10d__env_id id, int *from_fallback)
{
    uv_once(&env_once, env_init_mutex);
    pthread_mutex_lock(&env_mutex);
    if (!env_loaded)
        env_load_locked();
    const char *v = env_values[id];
    if (from_fallback != NULL)
        *from_fallback = env_from_fallback[id];
    pthread_mutex_unlock(&env_mutex);
    return v;
}

unsigned c10d__env_generation(void)
{
    unsigned g = atomic_load(&env_generation);
    if (g == 0) {
        env_value(0, NULL); /* the first load */
        g = atomic_load(&env_generation);
    }
    return g;
}

const struct c10d__env_var *c10d__env_table(void)
{
    return env_table;
}

void c10d__env_reload(void)
{
    uv_once(&env_once, env_init_mutex);
    pthread_mutex_lock(&env_mutex);
    env_load_locked();
    pthread_mutex_unlock(&env_mutex);
    c10d__log_reload_level();
}

const char *c10d__env_str(enum c10d__env_id id)
{
    const char *v = env_value(id, NULL);
    return v != NULL ? v : env_table[id].default_text;
}

int64_t c10d__env_int(enum c10d__env_id id)
{
    const char *v = c10d__env_str(id);
    char *end = NULL;
    errno = 0;
    long long x = strtoll(v, &end, 0);
    if (errno != 0 || end == v || *end != '\0') {
        C10D_WARN("env", "%s=\"%s\" is not an integer; using the default %s", env_table[id].name, v,
                  env_table[id].default_text);
        return strtoll(env_table[id].default_text, NULL, 0);
    }
    return x;
}

static int parse_bool(const char *v, int *out)
{
    static const char *yes[] = {"1", "true", "yes", "on", "y"};
    static const char *no[] = {"0", "false", "no", "off", "n"};
    for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++) {
        if (strcasecmp(v, yes[i]) == 0)
            return *out = 1, 0;
        if (strcasecmp(v, no[i]) == 0)
            return *out = 0, 0;
    }
    return -1;
}

int c10d__env_bool(enum c10d__env_id id)
{
    const char *v = c10d__env_str(id);
    int b = 0;
    if (parse_bool(v, &b) == 0)
        return b;
    C10D_WARN("env", "%s=\"%s\" is not a boolean; using the default %s", env_table[id].name, v,
              env_table[id].default_text);
    parse_bool(env_table[id].default_text, &b);
    return b;
}
