/* The tcp backend's own entry points beyond the vtable: connection setup
 * split in two so the address exchange can go through the store (the
 * vtable's create) or anything else (tests, benches). Loop thread only. */
#ifndef C10D_BACKENDS_TCP_TCP_BACKEND_H
#define C10D_BACKENDS_TCP_TCP_BACKEND_H

#include "backends/backend.h"

#include <stddef.h>
#include <stdint.h>

/* Creates the state and listens; `*address` ("host:port", owned by the
 * state) is what the other ranks need to reach this one. */
int c10d__tcp_open(const struct c10d__backend_config *cfg, void **state, const char **address);

/* Connects given every rank's address; done(arg, status) runs exactly once,
 * never inside this call. */
int c10d__tcp_connect(void *state, const char *const *addrs, void (*done)(void *arg, int status),
                      void *arg);

/* Bytes of P2P messages this rank copied straight from a sender's memory
 * (docs/shm.md, "P2P"), over every rail. Any thread. */
uint64_t c10d__tcp_bytes_in_place(void *state);
/* Bytes this rank wrote to its peers through the segment's rings instead of
 * the sockets (docs/shm.md, "P2P"). Any thread. */
uint64_t c10d__tcp_ring_bytes(void *state);

#endif
