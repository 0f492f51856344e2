/* The tcp transport's private header: the state its parts share (frames,
 * peers, connections, the transport itself) and the functions one part calls
 * in another. The transport is split by concern so that each part reads on its
 * own (transport.c lists them); only those files include this one, everything
 * else goes through transport.h. */
#ifndef C10D_BACKENDS_TCP_TRANSPORT_IMPL_H
#define C10D_BACKENDS_TCP_TRANSPORT_IMPL_H

#include "backends/backend.h"
#include "backends/shm/mailbox.h"
#include "backends/shm/ring.h"
#include "transport.h"

#include "engine/error.h"
#include "engine/token.h"

#include <netinet/in.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>

#define HDR_LEN     40
#define HELLO_FIXED 36
#define HELLO_MAX   (HELLO_FIXED + C10D_TOKEN_MAX + C10D_TCP_NOTE_MAX)
/* An inbound connection that has not completed its hello by then is closed:
 * a stranger (or a half-open socket) costs one descriptor for this long at
 * most, and never more than PENDING_MAX of them at once. */
#define PENDING_HELLO_MS 10000
#define PENDING_MAX      64
#define PENDING_TICK_MS  1000
#define STAGING_LEN      (256 * 1024)
#define ABORT_MSG_MAX    1000

enum frame_type { F_EAGER = 1, F_RTS, F_CTS, F_DATA, F_ABORT, F_BYE, F_ACK, F_WAKE, F_FIN, F_RING };
/* FLAG_CMA: a P2P RTS whose sender offers its buffer in place; its fp
 * carries the sender's pid (root) and the buffer's address (count). The
 * receiver reads it and acknowledges (F_ACK); the sender, if its send is
 * still live (its buffer was valid throughout the read), answers F_FIN, on
 * which the receive completes. */
enum { FLAG_P2P = 1, FLAG_CMA = 2 };
enum xlist_id { L_NONE, L_RECVS, L_P2P_RECVS, L_ANY_RECVS, L_SENDS };
/* W_FIN: a header alone, in the data slot (the control slot carried the
 * RTS, whose write may not have called back yet). */
enum { W_CTL, W_DATA, W_FIN };
enum conn_state { C_CONNECTING, C_HELLO, C_READY, C_CLOSED };

/* A frame's header, sent as it is in memory (host byte order, as the hello),
 * then `len` bytes of payload; docs/tcp_backend.md has what each type means. */
struct wire {
    uint8_t type, kind, flags, pad;
    uint32_t sub;
    uint64_t tag;
    uint64_t len;
    struct c10d__fp fp; /* collective frames; zero in the others */
};

/* The fingerprints of the collectives this rank ran last, by (seq, member):
 * a frame of a finished op can still arrive (a broadcast both ranks think
 * they are the root of completes on both before either hears the other). */
#define FP_SLOTS 64
struct fp_slot {
    uint64_t seq;
    uint32_t member;
    int used;
    struct c10d__fp fp;
};

struct xlist {
    struct c10d__tcp_xfer *head, *tail;
};

/* A message that arrived before its transfer was posted: eager data (kept),
 * an RTS or a CTS (just the header). */
struct unexp {
    struct unexp *next;
    struct wire w;
    uint64_t order;
    char *data;
    size_t cap;
    int complete;
    struct c10d__tcp_xfer *claimed;
    uint64_t mb_gen; /* from the peer's mailbox: acknowledged there (0: a frame) */
};

struct conn;

/* A frame of a ring peer that did not fit its ring yet: its bytes from
 * `off` on go when the reader has made room (wire.c). */
struct ring_write {
    struct ring_write *next;
    struct c10d__tcp_xfer *x;
    int which;
    size_t off;
};

struct peer {
    int rank;
    struct conn *conn;       /* ready connection */
    struct conn *connecting; /* our own attempt in progress (lazy/eager) */
    int met;                 /* a handshake with it completed once */
    struct xlist recvs;      /* posted, matched: waiting for data */
    struct xlist p2p_recvs;  /* P2P receives not matched to an RTS yet */
    struct xlist sends;      /* waiting for CTS */
    struct unexp *unexp_head, *unexp_tail;
    struct c10d__tcp_xfer *out_head, *out_tail; /* writes waiting for the connection */
    uint32_t next_send_id;
    uint64_t retry_at;
    uint64_t connect_fail_since; /* first failed attempt of the current streak (0: none) */
    uint64_t connect_warned_at;
    uint64_t reread_at; /* when its address was last asked for again (c10d__tcp_connect_failed) */
    char connect_error[96]; /* why the last attempt failed */
    int gone;               /* said goodbye (destroyed its group cleanly) */
    int lost;               /* its connection broke: the transport fails after the grace period */
    size_t eager_out;       /* P2P eager bytes sent, not yet acknowledged */
    int local;              /* same host, pid namespace and user (c10d__tcp_transport_set_local) */
    int offer_refused;      /* it answered an offer with CTS: offer only what cannot go eager */
    char note[C10D_TCP_NOTE_MAX + 1]; /* what its handshake carried */
    /* A rank sharing a segment with this one (c10d__tcp_transport_set_ring):
     * frames to it go through ring_out (when set), frames from it come
     * from ring_in too, parsed by ring_conn, which keeps its own place in
     * that stream as a socket's connection does in its own. */
    struct c10d__shm_ring *ring_out, *ring_in;
    struct conn *ring_conn;
    struct ring_write *rw_head, *rw_tail;
    /* The switch, once per direction: the writer, once the reader opened
     * the ring, says F_RING on the socket and writes to the ring from then
     * on (ring_on); the reader reads the ring only once that F_RING came
     * (ring_started), after every frame the socket carried before it. */
    int ring_on, ring_started;
    struct c10d__shm_mailbox *mb_in; /* its P2P deposits (c10d__tcp_transport_set_mailbox) */
    /* P2P messages from it in unexp_head (read by a caller's lane). */
    _Atomic unsigned p2p_waiting;
};

struct conn {
    uv_tcp_t tcp;
    uv_connect_t connect_req;
    uv_write_t hello_req;
    unsigned char hello_out[HELLO_MAX];
    unsigned char hello_in[HELLO_MAX];
    size_t hello_have;
    uint64_t accepted_ms;             /* inbound: when accepted (pending-hello deadline) */
    char peer[INET6_ADDRSTRLEN + 16]; /* inbound: who connected, for log lines */
    int parked;                       /* inbound hello complete, waiting for the job id */
    struct c10d__tcp_transport *t;
    struct conn *all_next, *all_prev;
    int rank; /* -1 until the handshake named it */
    int initiator;
    int bye; /* the peer said goodbye: its EOF is no failure by itself */
    enum conn_state state;
    /* reading */
    unsigned char hdr[HDR_LEN];
    size_t hdr_have;
    int in_body;
    struct wire body_w;
    char *dst; /* NULL: discard */
    size_t remaining;
    struct c10d__tcp_xfer *body_x;
    struct unexp *body_u;
    char abort_msg[ABORT_MSG_MAX + 1];
    char *staging;
};

/* The parts are floors (transport.c lists them): a part calls the parts
 * below it by name and reports to the ones above through these, which the
 * façade (transport.c) installs when it creates the transport. */
struct c10d__tcp_up {
    /* any part -> the façade: fail the transport (c10d__tcp_error) */
    void (*fail)(struct c10d__tcp_transport *t, int status, const char *msg);
    /* conn -> wire: the read callbacks of a connection it starts reading */
    uv_alloc_cb alloc;
    uv_read_cb read;
    /* conn -> hello: the hello this rank sends when it connected */
    size_t (*hello_encode)(const struct c10d__tcp_transport *t, unsigned char *out, uint16_t flags);
    /* wire -> hello: bytes of a handshake in progress; returns those used */
    size_t (*hello_bytes)(struct conn *c, const char *p, size_t n);
    /* wire -> match: a frame's header arrived; the body it asked for is in */
    void (*frame)(struct conn *c, const struct wire *w);
    void (*body_done)(struct conn *c);
    /* wire -> match: a peer's deposit, while receives are posted
     * (c10d__tcp_mailbox_drain) */
    int (*mailbox)(struct c10d__tcp_transport *t, struct peer *pe);
};

struct c10d__tcp_transport {
    struct c10d__tcp_transport_config cfg;
    const struct c10d__tcp_up *up;
    uv_loop_t *loop;
    uv_tcp_t listener;
    uv_timer_t deadline;
    uv_timer_t grace;
    uv_timer_t pending; /* closes inbound connections stuck before their hello */
    int listening, deadline_open, grace_open, grace_armed, pending_open;
    /* The job's identity: rank 0 draws it, the others learn it from rank 0's
     * published address; hellos of any other job are dropped. */
    uint64_t job_id;
    int job_known;
    char published[INET6_ADDRSTRLEN + 40]; /* address, and the job id on rank 0 */
    uint8_t token[C10D_TOKEN_MAX];
    size_t token_len;
    char note[C10D_TCP_NOTE_MAX + 1]; /* cfg.hello_note's copy */
    size_t note_len;
    uint64_t stranger_log_ms, strangers_unlogged;
    int first_lost; /* the first peer whose connection broke */
    int cma_off;    /* reads from a peer's memory refused, or turned off: ask for the bytes */
    _Atomic uint64_t cma_bytes; /* P2P bytes read in place (read from any thread) */
    int told_lost;              /* the lost rank a peer's abort frame named; -1: none */
    int handles;                /* open uv handles; freed once 0 after free was asked */
    int freeing;
    int failed;
    char address[INET6_ADDRSTRLEN + 16];
    struct sockaddr_storage bind_addr;
    struct peer *peers;
    char **addrs;
    struct conn *conns; /* every connection, for closing */
    struct xlist any_recvs;
    struct c10d__tcp_xfer *pool, *all_xfers;
    struct unexp *unexp_pool;
    size_t unexp_n; /* unexpected messages queued, over every peer */
    struct fp_slot fps[FP_SLOTS];
    uint64_t next_order;
    void (*ready)(void *arg, int status);
    void *ready_arg;
    /* Asked to look up a peer's address again after connecting to it failed
     * (c10d__tcp_transport_on_connect_failed); NULL: nobody can. */
    void (*reread)(void *arg, int rank);
    void *reread_arg;
    int nready; /* peers with a ready connection now */
    /* Peers met once: what creation waits for. A peer that met us and then
     * left (it destroyed the group first: nothing waits for a slower rank)
     * does not hold creation up; its loss fails the group's first op that
     * needs it, as in gloo. */
    int nmet;
    int ready_called;
    /* Rings (docs/shm.md, "P2P"): polled before the loop's every turn. */
    uv_prepare_t ring_poll;
    uv_idle_t ring_more; /* active while a ring has bytes left: no sleep */
    int ring_poll_open;
    /* The peers with rings, polled on every turn: a host's few ranks in a
     * group that may span many hosts. */
    int *ring_peers, nring_peers;
    void (*ring_wake)(void *arg, int rank);
    void *ring_wake_arg;
    _Atomic uint64_t ring_bytes; /* written to rings (read from any thread) */
    /* c10d__tcp_transport_on_p2p_unexpected */
    void (*p2p_unexpected)(void *arg, int rank);
    void *p2p_unexpected_arg;
};

/* Helpers small and hot enough that every part gets its own inlined copy. */

static inline void c10d__tcp_wire_encode(unsigned char *out, int type, int kind, int flags,
                                         uint32_t sub, uint64_t tag, uint64_t len,
                                         const struct c10d__fp *fp)
{
    struct wire w = {(uint8_t)type, (uint8_t)kind, (uint8_t)flags, 0, sub, tag, len, {0}};
    if (fp != NULL)
        w.fp = *fp;
    memcpy(out, &w, HDR_LEN);
}

static inline uint32_t c10d__tcp_xfer_key_sub(const struct c10d__tcp_xfer *x)
{
    return x->p2p ? x->peer_sub : x->sub;
}

static inline int c10d__tcp_work_gone(const struct c10d__tcp_xfer *x)
{
    return x->work != NULL && c10d_work_test(x->work);
}

/* transport_base.c: the first error fails the transport and says why (later
 * ones are dropped); a transfer given back while its writes were in flight
 * is recycled once the last one completes; every handle's close ends in
 * handle_closed, which frees the transport's memory after the last one once
 * c10d__tcp_transport_free was asked. */
void c10d__tcp_error(struct c10d__tcp_transport *t, int status, const char *fmt, ...)
    C10D_PRINTF(3, 4);
void c10d__tcp_pool_push(struct c10d__tcp_transport *t, struct c10d__tcp_xfer *x);
void c10d__tcp_handle_closed(struct c10d__tcp_transport *t);
void c10d__tcp_free_memory(struct c10d__tcp_transport *t);

/* wire.c: writing frames and reading the stream. */
void c10d__tcp_peer_write(struct c10d__tcp_transport *t, struct peer *pe, struct c10d__tcp_xfer *x,
                          int which);
void c10d__tcp_peer_flush(struct c10d__tcp_transport *t, struct peer *pe);
void c10d__tcp_send_cts(struct c10d__tcp_transport *t, struct c10d__tcp_xfer *x);
void c10d__tcp_send_data(struct c10d__tcp_transport *t, struct c10d__tcp_xfer *x, uint64_t cap);
void c10d__tcp_send_ack(struct c10d__tcp_transport *t, struct c10d__tcp_xfer *x);
/* Matches (or queues as unexpected) a P2P message pe deposited in its
 * mailbox: 1 if there was one, 0 if not, -1 if the transport failed. */
int c10d__tcp_mailbox_drain(struct c10d__tcp_transport *t, struct peer *pe);
void c10d__tcp_send_fin(struct c10d__tcp_transport *t, struct c10d__tcp_xfer *x);
/* The rings: writes waiting for room go out, and every ring peer's bytes
 * are read; with may_sleep (the loop's turn ends in epoll) each reader says
 * so first and reads once more. Returns C10D__RINGS_MOVED if anything moved,
 * with C10D__RINGS_MORE if bytes are left for the next turn (which must not
 * sleep). */
enum { C10D__RINGS_MOVED = 1, C10D__RINGS_MORE = 2 };
int c10d__tcp_rings_poll(struct c10d__tcp_transport *t, int may_sleep);
/* What rank pe sent through its ring so far is read (before a goodbye on
 * its socket, which may overtake it, is taken as its last word). */
void c10d__tcp_ring_drain(struct c10d__tcp_transport *t, struct peer *pe);
/* Writes what waits for room, as far as the rings allow, without waiting
 * (before a goodbye). */
void c10d__tcp_rings_flush(struct c10d__tcp_transport *t);
void c10d__tcp_on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf);
void c10d__tcp_on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);

/* match.c: what an arriving frame means, and where its body goes. */
void c10d__tcp_handle_frame(struct conn *c, const struct wire *w);
void c10d__tcp_body_done(struct conn *c);

/* mismatch.c: 0, or -1 when the collective frame `w` from rank `from`
 * disagrees with what this rank runs for that op (the transport has failed,
 * naming both ranks and what differs). */
int c10d__tcp_fp_check(struct c10d__tcp_transport *t, int from, const struct wire *w);

/* hello.c: the handshake. */
size_t c10d__tcp_hello_encode(const struct c10d__tcp_transport *t, unsigned char *out,
                              uint16_t flags);
size_t c10d__tcp_hello_bytes(struct conn *c, const char *p, size_t n);
void c10d__tcp_accept_hello(struct conn *c);

/* conn.c: connections and the timers that bound them. */
void c10d__tcp_conn_close(struct conn *c);
void c10d__tcp_conn_lost(struct conn *c, ssize_t err);
void c10d__tcp_peer_lost(struct c10d__tcp_transport *t, int rank, int err);
void c10d__tcp_peer_connect(struct c10d__tcp_transport *t, int rank);
void c10d__tcp_connect_failed(struct c10d__tcp_transport *t, int rank, const char *why);
int c10d__tcp_parse_addr(const char *text, struct sockaddr_storage *ss);
void c10d__tcp_on_connection(uv_stream_t *server, int status);
void c10d__tcp_on_pending_tick(uv_timer_t *tm);
void c10d__tcp_on_deadline(uv_timer_t *tm);
/* A connection that never became one of the group's: closed without failing
 * anything, logged at most once a second. */
void c10d__tcp_drop_stranger(struct conn *c, const char *fmt, ...) C10D_PRINTF(2, 3);

/* iface.c: the listening socket and the address published for it. */
int c10d__tcp_start_listening(struct c10d__tcp_transport *t, uv_connection_cb on_connection);
int c10d__tcp_format_address(struct c10d__tcp_transport *t);

#endif
