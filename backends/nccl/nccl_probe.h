/* What the NCCL backend was built against and what is loaded at run time. */
#ifndef C10D_BACKENDS_NCCL_PROBE_H
#define C10D_BACKENDS_NCCL_PROBE_H

#include <stddef.h>

/* Writes "nccl <compiled> (runtime <loaded>)" into buf. */
void c10d__nccl_describe(char *buf, size_t len);

#endif
