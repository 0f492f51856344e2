/* Frames on the socket, both ways (the frame format is in transport_impl.h).
 *
 * Writing: a frame goes out as one writev of its header and the caller's
 * buffer, tried at once when nothing is queued, so a send often completes
 * inside the call that posted it; a frame for a peer not connected yet waits
 * on that peer's queue. The flow-control frames (CTS, DATA after a CTS, the
 * ACK of a P2P eager message) are here because they are plain writes: which
 * transfer they answer was decided by match.c.
 *
 * Reading: the bytes are cut into hellos (hello.c), frame headers (match.c
 * says what they mean) and bodies. While a body is being received and enough
 * of it is left, the alloc callback hands libuv the destination itself, so
 * bulk data goes from the kernel straight into the user's buffer; headers,
 * small payloads and everything between land in a per-connection staging
 * buffer first. This file is where the bytes and the time go; which transfer a
 * frame belongs to is decided in match.c. */
#include "transport_impl.h"

#include "engine/log.h"
#include "engine/loop.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#define DIRECT_MIN (16 * 1024)
#define IOV_PIECE  ((size_t)1 << 30)
#define MAX_IOV    17

/* ----------------------------------------------------------- writing */

/* A write that was queued (x->writes counted it) went out whole. */
static void xfer_written_ok(struct c10d__tcp_transport *t, struct c10d__tcp_xfer *x, int which)
{
    x->writes--;
    if (x->released || t->failed) {
        if (x->released && x->writes == 0)
            c10d__tcp_pool_push(t, x);
        return;
    }
    if (which == W_DATA && !x->await_ack)
        x->done(x);
}

static void xfer_written(uv_write_t *req, int status, int which)
{
    struct c10d__tcp_xfer *x = req->data;
    struct c10d__tcp_transport *t = ((struct conn *)req->handle->data)->t;
    x->writes--;
    if (status < 0 || x->released || t->failed) {
        struct conn *c = req->handle->data;
        if (status < 0 && status != UV_ECANCELED && c->rank >= 0)
            c10d__tcp_peer_lost(t, c->rank, status);
        if (x->released && x->writes == 0)
            c10d__tcp_pool_push(t, x);
        return;
    }
    if (which == W_DATA && !x->await_ack)
        x->done(x);
}

static void on_ctl_written(uv_write_t *req, int status)
{
    xfer_written(req, status, W_CTL);
}

static void on_data_written(uv_write_t *req, int status)
{
    xfer_written(req, status, W_DATA);
}

/* ------------------------------------------------------------ rings */

/* A frame's bytes, header then payload, as the socket would carry them. */
static size_t frame_len(const struct c10d__tcp_xfer *x, int which)
{
    return HDR_LEN + (which == W_DATA ? x->len : 0);
}

static const unsigned char *frame_hdr(const struct c10d__tcp_xfer *x, int which)
{
    return which == W_CTL ? x->ctl_hdr : x->data_hdr;
}

/* Writes what fits of x's frame from byte `off` on; returns where it got. */
static size_t ring_put_from(struct c10d__tcp_transport *t, struct peer *pe,
                            struct c10d__tcp_xfer *x, int which, size_t off)
{
    size_t before = off;
    if (off < HDR_LEN)
        off += c10d__shm_ring_put(pe->ring_out, frame_hdr(x, which) + off, HDR_LEN - off);
    while (off >= HDR_LEN && off < frame_len(x, which)) {
        size_t n = c10d__shm_ring_put(pe->ring_out, (const char *)x->buf + (off - HDR_LEN),
                                      frame_len(x, which) - off);
        if (n == 0)
            break;
        off += n;
    }
    if (off > before) {
        atomic_fetch_add_explicit(&t->ring_bytes, off - before, memory_order_relaxed);
        if (c10d__shm_ring_reader_to_wake(pe->ring_out))
            t->ring_wake(t->ring_wake_arg, pe->rank);
    }
    return off;
}

/* Writes of pe that waited for room, in order, as far as the room goes;
 * then, if some still wait, tells the reader (it wakes this rank).
 * Returns C10D__RINGS_MOVED if it wrote, with C10D__RINGS_MORE if it
 * stopped while there was room (the next turn goes on at once). */
static int ring_flush(struct c10d__tcp_transport *t, struct peer *pe)
{
    int moved = 0;
    for (int tries = 0;; tries++) {
        while (pe->rw_head != NULL && !t->failed) {
            struct ring_write *w = pe->rw_head;
            size_t off = ring_put_from(t, pe, w->x, w->which, w->off);
            moved |= off != w->off ? C10D__RINGS_MOVED : 0;
            w->off = off;
            if (off < frame_len(w->x, w->which))
                break;
            pe->rw_head = w->next;
            if (pe->rw_head == NULL)
                pe->rw_tail = NULL;
            struct c10d__tcp_xfer *x = w->x;
            int which = w->which;
            free(w);
            xfer_written_ok(t, x, which);
        }
        /* Room that appears while this rank looks is taken a few times over;
         * then the next turn goes on (the flag is up: a reader wakes it). */
        if (pe->rw_head == NULL || t->failed || !c10d__shm_ring_writer_wait(pe->ring_out))
            return moved;
        if (tries == 4)
            return moved | C10D__RINGS_MORE;
    }
}

/* The frame goes after any that wait for room; all of it now if it fits,
 * and then a send is done within this call, as after a complete
 * uv_try_write. */
static void ring_write(struct c10d__tcp_transport *t, struct peer *pe, struct c10d__tcp_xfer *x,
                       int which)
{
    size_t off = 0;
    if (pe->rw_head == NULL) {
        off = ring_put_from(t, pe, x, which, 0);
        if (off == frame_len(x, which)) {
            if (which == W_DATA && !x->await_ack)
                x->done(x);
            return;
        }
    }
    struct ring_write *w = malloc(sizeof *w);
    if (w == NULL) {
        c10d__tcp_error(t, C10D_ENOMEM, "tcp: out of memory queueing a frame for rank %d",
                        pe->rank);
        return;
    }
    *w = (struct ring_write){NULL, x, which, off};
    x->writes++;
    if (pe->rw_tail != NULL)
        pe->rw_tail->next = w;
    else
        pe->rw_head = w;
    pe->rw_tail = w;
    if (pe->rw_head == w)
        ring_flush(t, pe);
}

/* The reader opened the ring: F_RING on the socket, behind whatever the
 * socket carries already, and the ring from now on. */
static void ring_switch(struct c10d__tcp_transport *t, struct peer *pe)
{
    struct c10d__tcp_xfer *x = c10d__tcp_xfer_get(t);
    if (x == NULL)
        return; /* the socket, for now */
    c10d__tcp_wire_encode(x->ctl_hdr, F_RING, 0, 0, 0, 0, 0, NULL);
    c10d__tcp_peer_write(t, pe, x, W_CTL);
    c10d__tcp_xfer_put(t, x);
    pe->ring_on = !t->failed && pe->conn != NULL; /* else that write lost the peer */
    if (pe->ring_on)
        C10D_DEBUG("tcp", "rank %d: frames to rank %d go through their shared-memory ring",
                   t->cfg.rank, pe->rank);
}

void c10d__tcp_peer_write(struct c10d__tcp_transport *t, struct peer *pe, struct c10d__tcp_xfer *x,
                          int which)
{
    if (t->failed)
        return;
    int type = frame_hdr(x, which)[0];
    /* The wake-up and the switch itself are about the socket's stream. */
    if (pe->ring_out != NULL && type != F_WAKE && type != F_RING) {
        if (pe->lost)
            return;                         /* the transport is about to fail */
        if (pe->gone && pe->conn == NULL) { /* as on the socket, below */
            c10d__tcp_error(t, C10D_ECLOSED, "tcp: rank %d has left the group (it destroyed it)",
                            pe->rank);
            return;
        }
        if (!pe->ring_on && pe->conn != NULL && c10d__shm_ring_reader_is_open(pe->ring_out))
            ring_switch(t, pe);
        if (pe->ring_on) {
            ring_write(t, pe, x, which);
            return;
        }
    }
    if (pe->conn == NULL && pe->lost)
        return; /* the transport is about to fail */
    if (pe->conn == NULL && pe->gone) {
        c10d__tcp_error(t, C10D_ECLOSED, "tcp: rank %d has left the group (it destroyed it)",
                        pe->rank);
        return;
    }
    if (pe->conn == NULL) {
        x->out_which = which;
        x->out_next = NULL;
        if (pe->out_tail != NULL)
            pe->out_tail->out_next = x;
        else
            pe->out_head = x;
        pe->out_tail = x;
        c10d__tcp_peer_connect(t, pe->rank);
        return;
    }
    uv_buf_t b[MAX_IOV];
    unsigned n = 1;
    size_t total = HDR_LEN;
    uv_write_t *req;
    if (which == W_CTL) {
        b[0] = uv_buf_init((char *)x->ctl_hdr, HDR_LEN);
        req = &x->ctl_req;
    } else if (which == W_FIN) {
        b[0] = uv_buf_init((char *)x->data_hdr, HDR_LEN);
        req = &x->data_req;
    } else {
        b[0] = uv_buf_init((char *)x->data_hdr, HDR_LEN);
        /* uv_buf_t lengths are 32-bit: big payloads go as several pieces. */
        for (size_t off = 0; off < x->len;) {
            size_t piece = x->len - off < IOV_PIECE ? x->len - off : IOV_PIECE;
            if (n == MAX_IOV) {
                c10d__tcp_error(t, C10D_EUNSUPPORTED, "tcp: a message of %zu bytes is too large",
                                x->len);
                return;
            }
            b[n++] = uv_buf_init((char *)x->buf + off, (unsigned)piece);
            off += piece;
        }
        total += x->len;
        req = &x->data_req;
    }
    uv_stream_t *stream = (uv_stream_t *)&pe->conn->tcp;
    /* Nothing queued: write now, and if it all went out, the send is done
     * without waiting for a write callback on a later loop turn. */
    if (uv_stream_get_write_queue_size(stream) == 0) {
        int w = uv_try_write(stream, b, n);
        if (w < 0 && w != UV_EAGAIN) {
            c10d__tcp_peer_lost(t, pe->rank, w);
            return;
        }
        size_t done = w > 0 ? (size_t)w : 0;
        if (done == total) {
            if (which == W_DATA && !x->await_ack)
                x->done(x);
            return;
        }
        unsigned skip = 0;
        while (done >= b[skip].len) {
            done -= b[skip].len;
            skip++;
        }
        b[skip].base += done;
        b[skip].len -= (unsigned)done;
        memmove(b, b + skip, (n - skip) * sizeof b[0]);
        n -= skip;
    }
    req->data = x;
    x->writes++;
    int rc = uv_write(req, stream, b, n, which == W_DATA ? on_data_written : on_ctl_written);
    if (rc < 0) {
        x->writes--;
        c10d__tcp_peer_lost(t, pe->rank, rc);
    }
}

void c10d__tcp_peer_flush(struct c10d__tcp_transport *t, struct peer *pe)
{
    struct c10d__tcp_xfer *x = pe->out_head;
    pe->out_head = pe->out_tail = NULL;
    while (x != NULL && !t->failed) {
        struct c10d__tcp_xfer *next = x->out_next;
        x->out_next = NULL;
        c10d__tcp_peer_write(t, pe, x, x->out_which);
        x = next;
    }
}

/* ------------------------------------------------------ flow control */

void c10d__tcp_send_cts(struct c10d__tcp_transport *t, struct c10d__tcp_xfer *x)
{
    x->cts_sent = 1;
    c10d__tcp_wire_encode(x->ctl_hdr, F_CTS, x->kind, x->p2p ? FLAG_P2P : 0,
                          c10d__tcp_xfer_key_sub(x), x->tag, x->len, &x->fp);
    c10d__tcp_peer_write(t, &t->peers[x->source], x, W_CTL);
}

/* The CTS arrived for a send: send the payload. */
void c10d__tcp_send_data(struct c10d__tcp_transport *t, struct c10d__tcp_xfer *x, uint64_t cap)
{
    if (x->p2p ? x->len > cap : x->len != cap) {
        if (x->p2p)
            c10d__tcp_error(
                t, C10D_EINVAL,
                "tcp send (tag %llu): %zu bytes to rank %d, which posted a buffer of %llu",
                (unsigned long long)x->tag, x->len, x->peer, (unsigned long long)cap);
        else
            c10d__tcp_error(
                t, C10D_EINVAL,
                "tcp %s seq %llu: sending %zu bytes to rank %d, which posted %llu bytes "
                "(collective mismatch?)",
                c10d__op_kind_name((enum c10d__op_kind)x->kind), (unsigned long long)x->tag, x->len,
                x->peer, (unsigned long long)cap);
        return;
    }
    if (c10d__tcp_work_gone(x))
        return;
    c10d__tcp_wire_encode(x->data_hdr, F_DATA, x->kind, x->p2p ? FLAG_P2P : 0,
                          c10d__tcp_xfer_key_sub(x), x->tag, x->len, &x->fp);
    c10d__tcp_peer_write(t, &t->peers[x->peer], x, W_DATA);
}

void c10d__tcp_send_ack(struct c10d__tcp_transport *t, struct c10d__tcp_xfer *x)
{
    if (x->mb_gen != 0) { /* the message came through the mailbox: so does its answer */
        c10d__shm_mb_matched(t->peers[x->source].mb_in, x->mb_gen);
        x->mb_gen = 0;
        return;
    }
    c10d__tcp_wire_encode(x->ctl_hdr, F_ACK, x->kind, FLAG_P2P, x->peer_sub, x->tag, x->received,
                          NULL);
    c10d__tcp_peer_write(t, &t->peers[x->source], x, W_CTL);
}

/* A send read in place: its buffer was valid until the read was acknowledged. */
void c10d__tcp_send_fin(struct c10d__tcp_transport *t, struct c10d__tcp_xfer *x)
{
    c10d__tcp_wire_encode(x->data_hdr, F_FIN, x->kind, FLAG_P2P, x->peer_sub, x->tag, x->len, NULL);
    c10d__tcp_peer_write(t, &t->peers[x->peer], x, W_FIN);
}

/* ----------------------------------------------------------- reading */

static void parse(struct conn *c, const char *p, size_t n)
{
    struct c10d__tcp_transport *t = c->t;
    while (n > 0 && !t->failed && c->state != C_CLOSED) {
        if (c->state == C_HELLO) {
            if (c->parked)
                return; /* nothing may follow a hello before its answer */
            size_t k = t->up->hello_bytes(c, p, n);
            p += k;
            n -= k;
            continue;
        }
        if (!c->in_body) {
            size_t k = HDR_LEN - c->hdr_have < n ? HDR_LEN - c->hdr_have : n;
            memcpy(c->hdr + c->hdr_have, p, k);
            c->hdr_have += k;
            p += k;
            n -= k;
            if (c->hdr_have == HDR_LEN) {
                struct wire w;
                memcpy(&w, c->hdr, HDR_LEN);
                c->hdr_have = 0;
                t->up->frame(c, &w);
            }
            continue;
        }
        size_t k = c->remaining < n ? c->remaining : n;
        if (c->dst != NULL && c->body_x != NULL && c10d__tcp_work_gone(c->body_x))
            c->dst = NULL;
        if (c->dst != NULL) {
            memcpy(c->dst, p, k);
            c->dst += k;
        }
        c->remaining -= k;
        p += k;
        n -= k;
        if (c->remaining == 0)
            t->up->body_done(c);
    }
}

/* Reads pe's ring, up to `budget` bytes; returns how many. A writer waiting
 * for room is woken after each piece, so that it refills while the rest is
 * read. */
static size_t ring_read(struct c10d__tcp_transport *t, struct peer *pe, size_t budget)
{
    if (pe->ring_conn == NULL || !pe->ring_started)
        return 0;
    const char *p;
    size_t n, took = 0;
    while (!t->failed && took < budget && (n = c10d__shm_ring_peek(pe->ring_in, &p)) > 0) {
        if (n > budget - took)
            n = budget - took; /* the parser keeps its place in a frame cut here */
        parse(pe->ring_conn, p, n);
        c10d__shm_ring_take(pe->ring_in, n);
        took += n;
        if (c10d__shm_ring_writer_to_wake(pe->ring_in))
            t->ring_wake(t->ring_wake_arg, pe->rank);
    }
    return took;
}

void c10d__tcp_ring_drain(struct c10d__tcp_transport *t, struct peer *pe)
{
    ring_read(t, pe, SIZE_MAX);
}

void c10d__tcp_rings_flush(struct c10d__tcp_transport *t)
{
    for (int i = 0; i < t->nring_peers && !t->failed; i++)
        if (t->peers[t->ring_peers[i]].rw_head != NULL)
            ring_flush(t, &t->peers[t->ring_peers[i]]);
}

/* Deposits in the peers' mailboxes (mailbox.h) that receives posted here may
 * meet: matched now; before a sleep the flag goes up, then one more look,
 * and a later deposit wakes the loop. */
static int mailbox_poll(struct c10d__tcp_transport *t, struct peer *pe, int may_sleep)
{
    if (pe->mb_in == NULL || (pe->p2p_recvs.head == NULL && t->any_recvs.head == NULL))
        return 0;
    int got = t->up->mailbox(t, pe);
    if (got == 0 && may_sleep) {
        c10d__shm_mb_loop_sleeps(pe->mb_in);
        got = t->up->mailbox(t, pe);
    }
    return got > 0 ? C10D__RINGS_MOVED : 0;
}

int c10d__tcp_rings_poll(struct c10d__tcp_transport *t, int may_sleep)
{
    int moved = 0;
    for (int i = 0; i < t->nring_peers && !t->failed; i++) {
        struct peer *pe = &t->peers[t->ring_peers[i]];
        if (pe->rw_head != NULL)
            moved |= ring_flush(t, pe);
        moved |= mailbox_poll(t, pe, may_sleep);
        if (!pe->ring_started)
            continue;
        /* Before a sleep the flag goes up last, then one more look: bytes
         * written before the writer could see it are read here, the others
         * come with a wake. A turn reads a ring's worth at most, so timers
         * and sockets are served between (the loop then polls again at
         * once). */
        const char *p;
        size_t budget = C10D_SHM_RING_BYTES;
        for (int said = !may_sleep; !t->failed;) {
            if (c10d__shm_ring_peek(pe->ring_in, &p) == 0) {
                if (said || !c10d__shm_ring_reader_sleep(pe->ring_in))
                    break;
                said = 1;
            } else if (budget == 0) {
                moved |= C10D__RINGS_MORE;
                break;
            } else {
                budget -= ring_read(t, pe, budget); /* never more than budget */
                moved |= C10D__RINGS_MOVED;
            }
        }
    }
    return moved;
}

void c10d__tcp_on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)suggested;
    struct conn *c = h->data;
    if (c->in_body && c->dst != NULL && c->remaining >= DIRECT_MIN) {
        if (c->body_x != NULL && c10d__tcp_work_gone(c->body_x)) {
            c->dst = NULL;
        } else {
            size_t len = c->remaining < (size_t)INT_MAX ? c->remaining : (size_t)INT_MAX;
            *buf = uv_buf_init(c->dst, (unsigned)len);
            return;
        }
    }
    *buf = uv_buf_init(c->staging, STAGING_LEN);
}

void c10d__tcp_on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    struct conn *c = s->data;
    if (nread < 0) {
        c10d__tcp_conn_lost(c, nread);
        return;
    }
    if (nread == 0 || c->state == C_CLOSED)
        return;
    c10d__engine_busy();
    if (buf->base != c->staging) {
        c->dst += nread;
        c->remaining -= (size_t)nread;
        if (c->remaining == 0)
            c->t->up->body_done(c);
        return;
    }
    parse(c, buf->base, (size_t)nread);
}
