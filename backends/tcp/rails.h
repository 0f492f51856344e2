/* The tcp backend's rails: one transport per interface that
 * C10D_SOCKET_IFNAME (GLOO_SOCKET_IFNAME) lists, each with its own listening
 * socket and its own connection to every peer, the way ProcessGroupGloo makes
 * one gloo context per device. A collective runs whole on the rail of its
 * sequence number, a P2P message on the rail of its tag, both modulo the
 * number of rails (docs/tcp_backend.md, "Several interfaces").
 *
 * With no list (no variable, or one interface) there is one rail, and it is
 * exactly the transport as it was: the same connections, the same published
 * record, the same store keys. Loop thread only. */
#ifndef C10D_BACKENDS_TCP_RAILS_H
#define C10D_BACKENDS_TCP_RAILS_H

#include "transport.h"

#include <stdint.h>

#define C10D_TCP_RAILS_MAX 16

struct c10d__tcp_rails;

/* Parses the interface list and creates one transport per entry from `cfg`
 * (cfg->on_error is every rail's). Fails naming the entry that cannot be
 * listened on. */
int c10d__tcp_rails_new(const struct c10d__tcp_transport_config *cfg, struct c10d__tcp_rails **out);

int c10d__tcp_rails_count(const struct c10d__tcp_rails *r);
/* Every rail, rail 0 first (c10d__tcp_rails_count of them). */
struct c10d__tcp_transport *const *c10d__tcp_rails_all(const struct c10d__tcp_rails *r);

/* The rail that carries what `key` names: a collective's sequence number, a
 * P2P message's tag (as uint32_t, the same on both ends). */
struct c10d__tcp_transport *c10d__tcp_rails_pick(const struct c10d__tcp_rails *r, uint64_t key);

/* The record this rank publishes: one rail, the transport's own
 * ("host:port", rank 0's with "#<job id>"); several, their addresses joined
 * by commas, then rank 0's job id once ("h0:p0,h1:p1#<job id>"). */
const char *c10d__tcp_rails_address(const struct c10d__tcp_rails *r);

/* As c10d__tcp_transport_connect, every rail from its part of each record;
 * ready once every rail is. A record whose number of addresses differs from
 * this rank's number of rails is an error naming both ranks. */
int c10d__tcp_rails_connect(struct c10d__tcp_rails *r, const char *const *addrs,
                            void (*ready)(void *arg, int status), void *arg);

/* As c10d__tcp_transport_on_connect_failed: rails asking for the same peer
 * within a few hundred ms ask once (one store read per peer). */
void c10d__tcp_rails_on_connect_failed(struct c10d__tcp_rails *r,
                                       void (*reread)(void *arg, int rank), void *arg);

/* As c10d__tcp_transport_update_addr, each rail its part. A record with the
 * wrong number of addresses fails the rails (cfg->on_error) naming both
 * ranks, and returns < 0. */
int c10d__tcp_rails_update_addr(struct c10d__tcp_rails *r, int rank, const char *published);

/* Every rail: failed (peers told why), lost ranks merged (first loss first),
 * freed. */
void c10d__tcp_rails_fail(struct c10d__tcp_rails *r, int status, const char *message);
int c10d__tcp_rails_lost_ranks(const struct c10d__tcp_rails *r, int *out, int cap);
void c10d__tcp_rails_free(struct c10d__tcp_rails *r);

#endif
