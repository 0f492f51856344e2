/* Collectives with a size per rank (torch's uneven all_gather), written as
 * the list form of all_to_all, which every backend runs (tcp directly, nccl
 * as grouped send/recv): each rank sends the same block to every rank. */
#include "pg.h"

#include "engine/error.h"

#include <stdint.h>
#include <stdlib.h>

int c10d_all_gather_v(c10d_pg *pg, const void *send, void *recv, const size_t *counts,
                      c10d_dtype dtype, const c10d_op_opts *opts, c10d_work **work)
{
    if (work != NULL)
        *work = NULL;
    if (pg == NULL)
        return c10d__fail(C10D_EINVAL, "c10d all_gather_v: pg is NULL");
    int n = pg->size, me = pg->rank;
    if (me < 0) /* not a member: the all_to_all says so, and does nothing */
        return c10d_all_to_all(pg, NULL, NULL, NULL, NULL, dtype, opts, work);
    if (counts == NULL)
        return c10d__fail(C10D_EINVAL,
                          "%s all_gather_v: counts is NULL (expected %d, one per rank)",
                          pg->backend_name, n);
    size_t esz = c10d_dtype_size(dtype);
    if (esz == 0)
        return c10d__fail(C10D_EINVAL, "%s all_gather_v: invalid dtype %d", pg->backend_name,
                          (int)dtype);
    const void **sends = malloc((size_t)n * sizeof *sends);
    void **recvs = malloc((size_t)n * sizeof *recvs);
    size_t *send_counts = malloc((size_t)n * sizeof *send_counts);
    if (sends == NULL || recvs == NULL || send_counts == NULL) {
        free(sends), free(recvs), free(send_counts);
        return c10d__fail(C10D_ENOMEM, "%s all_gather_v: out of memory", pg->backend_name);
    }
    size_t off = 0;
    int rc = 0;
    for (int r = 0; r < n; r++) {
        sends[r] = send;
        send_counts[r] = counts[me];
        recvs[r] = recv != NULL ? (char *)recv + off * esz : NULL;
        if (counts[r] > (SIZE_MAX / esz) - off) {
            rc = c10d__fail(C10D_EINVAL, "%s all_gather_v: counts overflow at index %d",
                            pg->backend_name, r);
            break;
        }
        off += counts[r];
    }
    /* The call copies the lists: they are ours to free at once. */
    if (rc == 0)
        rc = c10d_all_to_all(pg, (const void *const *)sends, send_counts, (void *const *)recvs,
                             counts, dtype, opts, work);
    free(sends), free(recvs), free(send_counts);
    return rc;
}
