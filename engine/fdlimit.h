/* File-descriptor budget: every connection a store server or a data port
 * accepts costs one, and a process that runs out can accept nobody. */
#ifndef C10D_ENGINE_FDLIMIT_H
#define C10D_ENGINE_FDLIMIT_H

#include <stdint.h>

/* Raises the soft RLIMIT_NOFILE to the hard limit (as Go's runtime and most
 * servers do: the soft default of 1024 dates from select()). *soft_out (may
 * be NULL): the soft limit afterwards, UINT64_MAX for unlimited. 0, or a
 * negative status when the limit cannot even be read (*soft_out is then
 * UINT64_MAX). A refused raise is not an error: the old limit stays. */
int c10d__raise_nofile_limit(uint64_t *soft_out);

/* Descriptors this process has open now, or -1 where that cannot be known. */
int64_t c10d__open_fd_count(void);

#endif
