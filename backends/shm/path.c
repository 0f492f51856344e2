/* The shared-memory path's choice at group creation (path.h). */
#include "path.h"

#include "engine/env.h"
#include "engine/error.h"
#include "engine/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int c10d__shm_wanted(int size)
{
    return size > 1 && c10d__env_bool(C10D_ENV_SHM);
}

size_t c10d__shm_slot_bytes(void)
{
    int64_t slot = c10d__env_int(C10D_ENV_SHM_SLOT_BYTES);
    return slot >= C10D_SHM_SLOT_MIN ? (size_t)slot & ~(size_t)63 : 256u << 10;
}

int c10d__shm_note(int rank, int nranks, char *note, size_t cap, struct c10d__shm_seg **seg)
{
    char id[C10D_SHM_HOST_ID_MAX], ref[C10D_SHM_REF_MAX] = "";
    *seg = NULL;
    note[0] = '\0';
    c10d__shm_host_id(id, sizeof id);
    if (id[0] == '\0')
        return 0;
    if (rank == 0) {
        if (c10d__shm_create(nranks, c10d__shm_slot_bytes(), seg, ref, sizeof ref) < 0) {
            C10D_INFO("shm", "no shared segment for this group (%s): tcp only", c10d_last_error());
            return 0;
        }
        snprintf(note, cap, "%s,%s", id, ref);
    } else {
        snprintf(note, cap, "%s", id);
    }
    return 0;
}

int c10d__shm_decide(int rank, int nranks, const char *const *notes, struct c10d__shm_seg **seg)
{
    const char *ref = strchr(notes[0], ',');
    size_t idlen = ref != NULL ? (size_t)(ref - notes[0]) : 0;
    int same = ref != NULL && idlen > 0;
    for (int r = 1; same && r < nranks; r++)
        same = strlen(notes[r]) == idlen && memcmp(notes[r], notes[0], idlen) == 0;
    if (!same) {
        c10d__shm_free(*seg);
        *seg = NULL;
        return 0;
    }
    if (rank != 0)
        C10D_CHECK(c10d__shm_attach(ref + 1, nranks, rank, seg));
    return 1;
}
