/* HashStore: the table in this process. All ops run on the loop thread, so
 * any thread may set and wait; there is nothing to lock. */
#include "store_local.h"

#include <stdlib.h>

int c10d_store_hash_create(c10d_store **out)
{
    if (!out)
        return c10d__fail(C10D_EINVAL, "store hash_create: out is NULL");
    struct c10d__local_store *ls = calloc(1, sizeof *ls);
    if (!ls)
        return c10d__fail(C10D_ENOMEM, "store hash_create: out of memory");
    int rc = c10d__local_store_init(ls, &c10d__hash_store_vtable, NULL);
    if (rc < 0) {
        free(ls);
        return rc;
    }
    *out = &ls->base;
    return 0;
}
