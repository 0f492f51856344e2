/* The tcp backend's transport: one TCP connection per peer pair on the engine
 * loop, framed messages addressed by (peer, tag, sub), received straight into
 * the posted buffer and sent from the caller's buffer (docs/tcp_backend.md).
 *
 * Everything here runs on the engine's loop thread. Transfers never fail one
 * by one: any failure (a peer gone, a size mismatch, a timeout) is fatal for
 * the whole transport, reported once through on_error, after which nothing
 * completes and every posted transfer is simply dropped. */
#ifndef C10D_BACKENDS_TCP_TRANSPORT_H
#define C10D_BACKENDS_TCP_TRANSPORT_H

#include "backends/fingerprint.h"
#include "c10d.h"

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

struct c10d__tcp_transport;
struct c10d__shm_ring;
struct c10d__shm_mailbox;

/* One send or receive. Obtain with c10d__tcp_xfer_get, fill the public part,
 * post; `done` runs once it completed (possibly inside the posting call when
 * the data was already there), then the owner gives it back with
 * c10d__tcp_xfer_put. */
struct c10d__tcp_xfer {
    int peer;           /* group rank; C10D_ANY_SOURCE for a P2P receive */
    uint8_t kind;       /* the op kind (c10d__op_kind), checked against the sender's */
    uint8_t p2p;        /* 1: user send/recv matched by (peer, tag) in order */
    uint32_t sub;       /* collectives: which message of the op */
    uint64_t tag;       /* collectives: the op's sequence number; P2P: the user tag */
    struct c10d__fp fp; /* collectives: carried in the frames, checked by the peer */
    void *buf;          /* send: the bytes; receive: where they go */
    size_t len;         /* send: length; receive: capacity */
    c10d_work *work;    /* once complete (timed out), the buffer is no longer touched */
    void (*done)(struct c10d__tcp_xfer *x);
    void *ctx;
    /* Set on completion of a receive. */
    size_t received;
    int source;
    /* Transport's. */
    struct c10d__tcp_xfer *next, *prev;
    struct c10d__tcp_xfer *all_next, *out_next;
    int list; /* which list it is on */
    int state;
    int writes;   /* uv_write requests in flight */
    int released; /* given back while writes were in flight */
    int cts_sent;
    int await_ack;     /* P2P eager send: done when the receiver matched it */
    int cma;           /* P2P send offered for the receiver to read in place */
    int ack_needed;    /* P2P eager receive: acknowledge once the data is in */
    int out_which;     /* the write waiting for the connection */
    uint32_t peer_sub; /* P2P: the sender's message id */
    uint64_t order;    /* P2P receives: posting order */
    uint64_t mb_gen;   /* P2P receive matched to a mailbox message: its gen (0: none) */
    uv_write_t ctl_req, data_req;
    unsigned char ctl_hdr[40], data_hdr[40]; /* HDR_LEN */
};

struct c10d__tcp_transport_config {
    int rank;
    int size;
    uint32_t group_id;  /* both ends of a connection must agree (hash of the group name) */
    int lazy;           /* connect to a peer on first use */
    size_t eager_max;   /* collective messages up to this go without clear-to-send */
    int socket_buffer;  /* SO_SNDBUF/SO_RCVBUF, 0: OS default */
    int64_t timeout_ms; /* bounds connection setup */
    /* The local address of the store's connection and the store's host
     * (struct c10d__backend_config); NULL: unknown. Read only while the
     * transport is created. */
    const struct sockaddr *store_local_addr;
    const char *store_host;
    /* Called once, on the first fatal error; the transport is closed right after. */
    void (*on_error)(void *arg, int status, const char *message);
    void *arg;
    /* A text (up to C10D_TCP_NOTE_MAX bytes) this rank's handshake carries
     * to every peer, and each peer's to it, so that what it says is as
     * current as the peer itself (a store may still hold an earlier job's
     * values); NULL: none. Copied. */
    const char *hello_note;
    /* The interface to listen on (iface.c, step 1); NULL: the environment's
     * C10D_SOCKET_IFNAME, if it names one, else the route to the store. Read
     * only while the transport is created. rails.c sets it, one per rail. */
    const char *ifname;
    /* Rank 0: the job id to publish; 0 draws one. The rails of rank 0 share
     * one, so that its published record carries a single job id. */
    uint64_t job_id;
};

#define C10D_TCP_NOTE_MAX 256

/* Binds a listening socket on the chosen address (iface.c: C10D_SOCKET_IFNAME
 * or GLOO_SOCKET_IFNAME, else the local end of the route to the store, else
 * the hostname's address, else loopback). */
int c10d__tcp_transport_new(const struct c10d__tcp_transport_config *cfg,
                            struct c10d__tcp_transport **out);

/* A frame that only wakes rank r's loop (a peer sleeping on something no
 * socket announces: shared memory, where that peer's doorbell cannot be
 * used, docs/shm.md). Loop thread. */
void c10d__tcp_transport_ring(struct c10d__tcp_transport *t, int r);

/* Rank r runs on this host, in this pid namespace and as this user (the
 * shared-memory decision, docs/shm.md): a large P2P send to it offers its
 * buffer for the receiver to copy straight from this process's memory
 * (process_vm_readv, docs/shm.md "P2P"). Loop thread. */
void c10d__tcp_transport_set_local(struct c10d__tcp_transport *t, int r);
/* Whether this rank reads such offers in place (C10D_P2P_IN_PLACE; on by
 * default): off, it asks for the bytes through the socket as from any rank. */
void c10d__tcp_transport_read_in_place(struct c10d__tcp_transport *t, int on);
/* Bytes of P2P messages this rank read in place so far (any thread). */
uint64_t c10d__tcp_transport_bytes_in_place(const struct c10d__tcp_transport *t);

/* Rank r shares a segment with this rank (docs/shm.md, "P2P"): every frame
 * it sends through `in` is read from there (polled before every turn of the
 * loop), and with `out` every frame to it but the wake-up, the goodbye and
 * the abort (which stay on the socket, the liveness signal) goes through
 * `out` instead of the socket; NULL: the socket. wake(arg, r) wakes rank
 * r's loop (its doorbell) once a ring says it sleeps or waits for room.
 * Loop thread, after the handshakes and before any op; at most one
 * transport may use a given ring. */
void c10d__tcp_transport_set_ring(struct c10d__tcp_transport *t, int r, struct c10d__shm_ring *out,
                                  struct c10d__shm_ring *in, void (*wake)(void *arg, int r),
                                  void *arg);
/* P2P in the caller's lane (p2p_lane.h): fn(arg, r) runs on the loop each
 * time a P2P message from rank r finds no posted receive (it waits in r's
 * unexpected queue); c10d__tcp_transport_p2p_waiting counts the messages
 * from r waiting so (any thread). Loop thread, before any op. */
void c10d__tcp_transport_on_p2p_unexpected(struct c10d__tcp_transport *t,
                                           void (*fn)(void *arg, int r), void *arg);
unsigned c10d__tcp_transport_p2p_waiting(struct c10d__tcp_transport *t, int r);
/* Rank r deposits P2P messages for this rank in `in` (p2p_lane.h): the loop
 * matches one there, in order with r's frames, before a later frame of r's
 * and before a receive posted here could match a later one, and while
 * receives are posted here, on every turn (a depositor wakes it when it sleeps
 * with receives posted: the mailbox's loop_waits). Loop thread, after
 * c10d__tcp_transport_set_ring for r. */
void c10d__tcp_transport_set_mailbox(struct c10d__tcp_transport *t, int r,
                                     struct c10d__shm_mailbox *in);
/* Bytes this rank wrote to rings so far (any thread). */
uint64_t c10d__tcp_transport_ring_bytes(const struct c10d__tcp_transport *t);

/* The note rank r's handshake carried ("" before it met this rank, or if it
 * had none). */
const char *c10d__tcp_transport_peer_note(const struct c10d__tcp_transport *t, int r);

/* "host:port" others reach this rank at. */
const char *c10d__tcp_transport_address(const struct c10d__tcp_transport *t);

/* Starts connecting given every rank's address (addrs[rank]); ready(arg, 0)
 * once every peer is connected (at once when lazy), or ready(arg, status)
 * with c10d_last_error set on failure or when cfg->timeout_ms passed. */
int c10d__tcp_transport_connect(struct c10d__tcp_transport *t, const char *const *addrs,
                                void (*ready)(void *arg, int status), void *arg);

struct c10d__tcp_xfer *c10d__tcp_xfer_get(struct c10d__tcp_transport *t);
void c10d__tcp_xfer_put(struct c10d__tcp_transport *t, struct c10d__tcp_xfer *x);

/* Declares that this rank now runs collective `seq` (member `member` of a
 * coalesced list) as `fp`: frames of that op that already arrived are
 * compared at once, later ones as they come (mismatch.c). A mismatch fails
 * the transport (on_error) before this returns. */
void c10d__tcp_expect(struct c10d__tcp_transport *t, uint64_t seq, uint32_t member,
                      const struct c10d__fp *fp);

void c10d__tcp_send(struct c10d__tcp_transport *t, struct c10d__tcp_xfer *x);
void c10d__tcp_recv(struct c10d__tcp_transport *t, struct c10d__tcp_xfer *x);

/* Fails the transport: tells every connected peer why (status and message
 * travel in an abort frame so they fail the same way), closes every socket.
 * on_error is not called. Idempotent. */
void c10d__tcp_transport_fail(struct c10d__tcp_transport *t, int status, const char *message);

/* 1 once failed or closed. */
int c10d__tcp_transport_failed(const struct c10d__tcp_transport *t);
/* The ranks whose connection was lost, the first one first, then the others
 * in rank order: up to cap into out; returns how many there are. */
int c10d__tcp_transport_lost_ranks(const struct c10d__tcp_transport *t, int *out, int cap);
/* 1 if it connects to a peer on first use (C10D_TCP_LAZY_INIT). */
int c10d__tcp_transport_lazy(const struct c10d__tcp_transport *t);

/* Closes (failing if needed) and frees once every handle is closed. The
 * transport must not be used afterwards. */
void c10d__tcp_transport_free(struct c10d__tcp_transport *t);

/* While this rank connects, a peer whose address refuses (or whose listener
 * is not that peer) may have published a new one since it was read: a store
 * that outlives a job can hand out an earlier job's address. `reread(arg,
 * rank)` is called at most every few hundred ms per peer while attempts to
 * it fail; the owner looks the address up again and hands it over with
 * c10d__tcp_transport_update_addr. NULL stops it. Loop thread. */
void c10d__tcp_transport_on_connect_failed(struct c10d__tcp_transport *t,
                                           void (*reread)(void *arg, int rank), void *arg);
/* Replaces rank's address with `published` (as the peer published it; rank
 * 0's carries the job id, which is taken too): 1 if it changed, 0 if it is
 * the same, < 0 if it is not an address (the old one stays). The next
 * attempt uses it. Loop thread. */
int c10d__tcp_transport_update_addr(struct c10d__tcp_transport *t, int rank, const char *published);

#endif
