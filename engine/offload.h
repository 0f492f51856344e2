/* Blocking work off the loop: a call that may block for long (a communicator
 * abort, a driver call) runs on a worker thread of its own, so neither the
 * loop nor libuv's shared thread pool waits for it; `after` then runs on the
 * loop thread. A worker that never returns costs one parked thread and
 * nothing else: whoever waits for `after` bounds that wait with a loop timer. */
#ifndef C10D_ENGINE_OFFLOAD_H
#define C10D_ENGINE_OFFLOAD_H

/* Any thread. Returns 0 (work runs, then after(arg) on the loop thread unless
 * the engine was shut down meanwhile) or a negative status (nothing runs). */
int c10d__engine_offload(void (*work)(void *arg), void (*after)(void *arg), void *arg);

#endif
