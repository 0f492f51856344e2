/* c10d-fr's input: the dumps named on the command line (files, directories,
 * prefixes), each parsed and given its rank. */
#include "dumps.h"

#include <dirent.h>
#include <errno.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

struct dump *dumps;
size_t ndumps;
static size_t capdumps;

void die_oom(void)
{
    fprintf(stderr, "c10d-fr: out of memory\n");
    exit(2);
}

/* The rank a dump is of: its "rank" field (ours), else the digits that end
 * the file name before an optional ".json" (PyTorch's "<prefix><rank>"). */
static int rank_of(const char *file, json_t *root)
{
    json_t *r = json_object_get(root, "rank");
    if (json_is_integer(r) && json_integer_value(r) >= 0)
        return (int)json_integer_value(r);
    size_t n = strlen(file);
    if (n > 5 && strcmp(file + n - 5, ".json") == 0)
        n -= 5;
    size_t end = n;
    while (n > 0 && file[n - 1] >= '0' && file[n - 1] <= '9')
        n--;
    if (n == end)
        return -1;
    return atoi(file + n);
}

static int load_file(const char *file)
{
    json_error_t err;
    json_t *root = json_load_file(file, 0, &err);
    if (root == NULL) {
        fprintf(stderr, "c10d-fr: %s: not a JSON flight-recorder dump: %s (line %d)%s\n", file,
                err.text, err.line,
                strstr(err.text, "invalid token") != NULL
                    ? "; PyTorch's default dumps are pickled: see docs/debugging.md"
                    : "");
        return -1;
    }
    if (!json_is_array(json_object_get(root, "entries"))) {
        fprintf(stderr, "c10d-fr: %s: no \"entries\" list: not a flight-recorder dump\n", file);
        json_decref(root);
        return -1;
    }
    int rank = rank_of(file, root);
    if (rank < 0 || rank >= MAX_RANKS) {
        fprintf(stderr,
                "c10d-fr: %s: cannot tell which rank this dump is of (no \"rank\" field and no "
                "rank number at the end of the file name)\n",
                file);
        json_decref(root);
        return -1;
    }
    for (size_t i = 0; i < ndumps; i++)
        if (dumps[i].rank == rank) {
            fprintf(stderr, "c10d-fr: %s and %s are both dumps of rank %d; using the first\n",
                    dumps[i].file, file, rank);
            json_decref(root);
            return 0;
        }
    if (ndumps == capdumps) {
        capdumps = capdumps ? 2 * capdumps : 16;
        dumps = realloc(dumps, capdumps * sizeof *dumps);
        if (dumps == NULL)
            die_oom();
    }
    dumps[ndumps].rank = rank;
    dumps[ndumps].file = strdup(file);
    dumps[ndumps].root = root;
    ndumps++;
    return 0;
}

static int is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static int is_file(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* A directory (every regular file in it but temporary ones) or a prefix
 * (every file of its directory whose name starts with it). */
static int load_many(const char *dir, const char *prefix)
{
    DIR *d = opendir(dir);
    if (d == NULL) {
        fprintf(stderr, "c10d-fr: cannot read directory %s: %s\n", dir, strerror(errno));
        return -1;
    }
    int found = 0, rc = 0;
    struct dirent *de;
    char path[4096];
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.' || strncmp(de->d_name, prefix, strlen(prefix)) != 0 ||
            strstr(de->d_name, ".tmp.") != NULL)
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        if (!is_file(path))
            continue;
        found++;
        if (load_file(path) != 0)
            rc = -1;
    }
    closedir(d);
    if (found == 0) {
        fprintf(stderr, "c10d-fr: no dump found in %s%s%s\n", dir, *prefix ? " starting with " : "",
                prefix);
        return -1;
    }
    return rc;
}

int load_arg(const char *arg)
{
    if (is_file(arg))
        return load_file(arg);
    if (is_dir(arg))
        return load_many(arg, "");
    char *a = strdup(arg), *b = strdup(arg);
    if (a == NULL || b == NULL)
        die_oom();
    int rc = load_many(dirname(a), basename(b));
    free(a);
    free(b);
    return rc;
}

void free_dumps(void)
{
    for (size_t d = 0; d < ndumps; d++) {
        free(dumps[d].file);
        json_decref(dumps[d].root);
    }
    free(dumps);
}
