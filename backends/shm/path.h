/* Choosing the shared-memory path for a group at its creation: the note each
 * rank's tcp handshake carries to every peer, and the decision every rank
 * draws from the same notes once it met them all, so that all choose alike
 * without another round.
 *
 * A rank's note is "<host id>" (rank 0's: "<host id>,<segment>"), or empty
 * when C10D_SHM=0 or it has no host id. The group uses shared memory when
 * every rank's note names the same host id; otherwise (another host, another
 * container's pid namespace, another user, C10D_SHM=0 anywhere) it stays on
 * tcp. The notes travel in the handshake, not the store, because a store
 * that outlived an earlier job may still hold that job's values; a peer's
 * handshake is as current as the peer. Loop thread. */
#ifndef C10D_BACKENDS_SHM_PATH_H
#define C10D_BACKENDS_SHM_PATH_H

#include "segment.h"

#include <stddef.h>

#define C10D_SHM_NOTE_MAX (C10D_SHM_HOST_ID_MAX + C10D_SHM_REF_MAX + 2)

/* The smallest slot C10D_SHM_SLOT_BYTES gives (smaller values: the default). */
#define C10D_SHM_SLOT_MIN 4096

/* The slot size segments are made with (C10D_SHM_SLOT_BYTES). */
size_t c10d__shm_slot_bytes(void);
/* Whether this process offers the path at all (C10D_SHM). */
int c10d__shm_wanted(int size);
/* This rank's note into `note` (cap >= C10D_SHM_NOTE_MAX); rank 0 makes the
 * segment into *seg (NULL if it cannot: its note is then empty and the
 * group stays on tcp). 0, or C10D_ENOMEM. */
int c10d__shm_note(int rank, int nranks, char *note, size_t cap, struct c10d__shm_seg **seg);
/* From every rank's note: 1 with *seg set (rank 0 passes its own in) if the
 * group runs on shared memory, 0 if not (rank 0's segment is freed), < 0 if
 * this rank cannot map a segment its peers will use (the group cannot run
 * consistently: its creation fails, naming why). */
int c10d__shm_decide(int rank, int nranks, const char *const *notes, struct c10d__shm_seg **seg);

#endif
