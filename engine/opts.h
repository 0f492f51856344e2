/* Reading a caller's options struct across library versions.
 *
 * Every public options struct starts with `size_t struct_size`, which the
 * caller's C10D_*_OPTS_INIT sets to the struct's size in the header it was
 * built against. The library reads exactly that many bytes: fields a newer
 * header appended are zero (their default) for an older caller, and a newer
 * caller's fields this library does not know are accepted only while they are
 * zero (asking for something this build cannot do must fail, not be ignored).
 * struct_size 0 means the first published layout (the one of version 0.1), so
 * `= {0}` keeps working. */
#ifndef C10D_ENGINE_OPTS_H
#define C10D_ENGINE_OPTS_H

#include <stddef.h>

/* Copies `src` (may be NULL: all defaults) into `dst`, a struct of this
 * library's layout of `dst_size` bytes, and sets dst's struct_size to
 * dst_size. `v1_size` is the size of the 0.1 layout (what struct_size 0
 * means). Fails with C10D_EINVAL, the message prefixed by "`what`: " (none
 * when what is NULL), on a size too small to hold struct_size or on non-zero
 * unknown fields. */
int c10d__opts_read(void *dst, size_t dst_size, size_t v1_size, const void *src, const char *what);

#endif
