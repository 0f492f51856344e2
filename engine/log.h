/* Logging to stderr: one write per line with time, pid, rank and component. */
#ifndef C10D_ENGINE_LOG_H
#define C10D_ENGINE_LOG_H

#include "error.h"

enum c10d__log_level {
    C10D_LOG_TRACE = 0,
    C10D_LOG_DEBUG,
    C10D_LOG_INFO,
    C10D_LOG_WARN,
    C10D_LOG_ERROR,
    C10D_LOG_OFF,
};

/* The threshold from C10D_LOG_LEVEL / TORCH_CPP_LOG_LEVEL (default WARN). */
int c10d__log_level(void);
void c10d__log_set_level(int level);
/* Reads C10D_LOG_LEVEL / TORCH_CPP_LOG_LEVEL again (env reload). */
void c10d__log_reload_level(void);
/* Once a rank is known every line carries it. -1 clears it. */
void c10d__log_set_rank(int rank);
void c10d__log(int level, const char *component, const char *fmt, ...) C10D_PRINTF(3, 4);

#define C10D_LOG(level, component, ...)                                                            \
    do {                                                                                           \
        if ((level) >= c10d__log_level())                                                          \
            c10d__log((level), (component), __VA_ARGS__);                                          \
    } while (0)

#define C10D_TRACE(component, ...) C10D_LOG(C10D_LOG_TRACE, component, __VA_ARGS__)
#define C10D_DEBUG(component, ...) C10D_LOG(C10D_LOG_DEBUG, component, __VA_ARGS__)
#define C10D_INFO(component, ...)  C10D_LOG(C10D_LOG_INFO, component, __VA_ARGS__)
#define C10D_WARN(component, ...)  C10D_LOG(C10D_LOG_WARN, component, __VA_ARGS__)
#define C10D_ERROR(component, ...) C10D_LOG(C10D_LOG_ERROR, component, __VA_ARGS__)

#endif
