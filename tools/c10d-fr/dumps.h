/* c10d-fr's input (dumps.c): every dump loaded, in load order until main
 * sorts them by rank. */
#ifndef C10D_TOOLS_C10D_FR_DUMPS_H
#define C10D_TOOLS_C10D_FR_DUMPS_H

#include <jansson.h>
#include <stddef.h>

/* Ranks above this are refused (a corrupt dump, not a job). */
#define MAX_RANKS 4096

struct dump {
    int rank;
    char *file;
    json_t *root;
};

extern struct dump *dumps;
extern size_t ndumps;

/* Prints "out of memory" and exits 2. */
void die_oom(void);
/* A dump file, a directory of dumps or a file prefix: 0, or -1 with the
 * reason printed. */
int load_arg(const char *arg);
void free_dumps(void);

#endif
