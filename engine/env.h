/* Every environment variable libc10d reads, declared in this one list and
 * parsed in env.c. README.md's environment table must name each of them
 * (test_env checks it). To add one: a line here, a row in the README. */
#ifndef C10D_ENGINE_ENV_H
#define C10D_ENGINE_ENV_H

#include <stdint.h>

/* X(id, name, fallback name or NULL, default text, description) */
#define C10D_ENV_VARS(X)                                                                           \
    X(LOG_LEVEL, "C10D_LOG_LEVEL", "TORCH_CPP_LOG_LEVEL", "WARN",                                  \
      "log threshold: TRACE, DEBUG, INFO, WARN, ERROR, OFF (torch's INFO/WARNING/ERROR/FATAL "     \
      "and 0-3 accepted for the fallback)")                                                        \
    X(ENGINE_BATCH, "C10D_ENGINE_BATCH", NULL, "64",                                               \
      "most posted tasks the loop thread runs per wake-up before it polls sockets and timers "     \
      "again")

enum c10d__env_id {
#define C10D_ENV_ENUM(id, name, fallback, def, doc) C10D_ENV_##id,
    C10D_ENV_VARS(C10D_ENV_ENUM)
#undef C10D_ENV_ENUM
        C10D_ENV_COUNT
};

struct c10d__env_var {
    const char *name;
    const char *fallback;
    const char *default_text;
    const char *doc;
};

/* The declaration table, for tools and tests. */
const struct c10d__env_var *c10d__env_table(void);

/* The variable's text: its own value, else its fallback's, else the default.
 * Read once per process (after the first call, changes to the environment
 * are not seen until c10d__env_reload()). */
const char *c10d__env_str(enum c10d__env_id id);
/* As an integer; a malformed value logs a warning and yields the default. */
int64_t c10d__env_int(enum c10d__env_id id);
/* 1/0 for 1/0, true/false, yes/no, on/off (any case). */
int c10d__env_bool(enum c10d__env_id id);
/* The parsed log level (a c10d__log_level). */
int c10d__env_log_level(void);

/* Re-reads the environment (tests, and after the user changed it on purpose). */
void c10d__env_reload(void);

#endif
