/* Listening to this rank's doorbell (segment.h, c10d__shm_wake_sleepers):
 * the engine loop polls the pipe's read end; a byte there means a peer
 * published something on the segment while this rank's loop slept. The
 * callback empties the pipe and marks the loop busy
 * (c10d__engine_busy), and the completion poller's next turn runs the
 * segment's ops. Loop thread only. */
#ifndef C10D_BACKENDS_SHM_BELL_H
#define C10D_BACKENDS_SHM_BELL_H

#include "segment.h"

struct c10d__shm_bell;

/* Starts polling seg's doorbell, before any op runs on seg; NULL where the
 * segment has none, or where polling cannot start (the doorbell is then
 * withdrawn: the peers ring this rank over tcp). The watcher polls its own
 * copy of the descriptor: seg may be freed before or after it closes. */
struct c10d__shm_bell *c10d__shm_bell_listen(struct c10d__shm_seg *seg);
/* Stops and frees it (once its handle has closed); NULL is fine. */
void c10d__shm_bell_close(struct c10d__shm_bell *b);

#endif
