/* PyTorch environment variables that libc10d recognises and ignores
 * (torch_env.c). */
#ifndef C10D_API_TORCH_ENV_H
#define C10D_API_TORCH_ENV_H

#include <stddef.h>

/* How many of them are set; the first `cap` names go to `names`. */
size_t c10d__torch_env_ignored(const char **names, size_t cap);
/* Once per process: a warning for each one set, with what happens instead. */
void c10d__torch_env_warn_once(void);

#endif
