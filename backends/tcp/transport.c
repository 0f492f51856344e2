/* The tcp transport (docs/tcp_backend.md has the protocol): the façade, the
 * public entry points of transport.h, failing and freeing.
 *
 * The transport's parts are floors; each calls the ones below it by name and
 * reports to the ones above through struct c10d__tcp_up, installed here
 * (top first; the state they share is in transport_impl.h):
 *   transport.c       this façade: creating, connecting, failing, freeing
 *   match.c           posting sends and receives, matching them with what
 *                     arrives; the eager / clear-to-send protocol is there
 *   mismatch.c        what each collective frame says about its op, compared
 *                     with what this rank runs (mismatched calls fail at once)
 *   hello.c           the handshake that admits a connection to the group
 *   wire.c            frames on the socket: writes, flow control, reading
 *   conn.c            connecting, retrying, accepting, losing a peer,
 *                     dropping strangers, deadlines
 *   iface.c           which interface and address to listen on
 *   transport_base.c  errors, the transfer pool, handles and memory */
#include "transport_impl.h"

#include "engine/log.h"
#include "engine/loop.h"
#include "engine/token.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

/* ------------------------------------------------------------ public */

static void fail_and_report(struct c10d__tcp_transport *t, int status, const char *msg)
{
    C10D_DEBUG("tcp", "rank %d: transport failed: %s", t->cfg.rank, msg);
    c10d__tcp_transport_fail(t, status, msg);
    if (t->cfg.on_error != NULL)
        t->cfg.on_error(t->cfg.arg, status, msg);
}

static const struct c10d__tcp_up floors = {
    .fail = fail_and_report,
    .alloc = c10d__tcp_on_alloc,
    .read = c10d__tcp_on_read,
    .hello_encode = c10d__tcp_hello_encode,
    .hello_bytes = c10d__tcp_hello_bytes,
    .frame = c10d__tcp_handle_frame,
    .body_done = c10d__tcp_body_done,
    .mailbox = c10d__tcp_mailbox_drain,
};

int c10d__tcp_transport_new(const struct c10d__tcp_transport_config *cfg,
                            struct c10d__tcp_transport **out)
{
    *out = NULL;
    struct c10d__tcp_transport *t = calloc(1, sizeof *t);
    if (t == NULL || (t->peers = calloc((size_t)cfg->size, sizeof *t->peers)) == NULL) {
        free(t);
        return c10d__fail(C10D_ENOMEM, "tcp: out of memory");
    }
    t->cfg = *cfg;
    t->cfg.hello_note = NULL;
    if (cfg->hello_note != NULL) {
        t->note_len = strlen(cfg->hello_note);
        if (t->note_len > C10D_TCP_NOTE_MAX)
            t->note_len = C10D_TCP_NOTE_MAX;
        memcpy(t->note, cfg->hello_note, t->note_len);
    }
    t->up = &floors;
    t->loop = c10d__engine_loop();
    t->told_lost = -1;
    for (int r = 0; r < cfg->size; r++)
        t->peers[r].rank = r;
    uv_timer_init(t->loop, &t->grace);
    t->grace.data = t;
    t->grace_open = 1;
    t->handles++;
    uv_timer_init(t->loop, &t->pending);
    t->pending.data = t;
    t->pending_open = 1;
    t->handles++;
    uv_timer_start(&t->pending, c10d__tcp_on_pending_tick, PENDING_TICK_MS, PENDING_TICK_MS);
    const uint8_t *token;
    int rc = c10d__token_get(&token, &t->token_len);
    if (rc < 0) {
        c10d__tcp_transport_free(t);
        return rc;
    }
    memcpy(t->token, token, t->token_len);
    if (cfg->rank == 0 && cfg->job_id != 0) {
        t->job_id = cfg->job_id;
        t->job_known = 1;
    } else if (cfg->rank == 0) {
        if (getrandom(&t->job_id, sizeof t->job_id, 0) != (ssize_t)sizeof t->job_id)
            t->job_id = uv_hrtime() ^ ((uint64_t)getpid() << 32);
        t->job_known = 1;
    }
    rc = c10d__tcp_start_listening(t, c10d__tcp_on_connection);
    if (rc < 0) {
        c10d__tcp_transport_free(t);
        return rc;
    }
    rc = c10d__tcp_format_address(t);
    if (rc < 0) {
        c10d__tcp_transport_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

void c10d__tcp_transport_ring(struct c10d__tcp_transport *t, int r)
{
    /* A peer with no connection is gone or going: nothing to wake. */
    if (t->failed || r < 0 || r >= t->cfg.size || r == t->cfg.rank || t->peers[r].conn == NULL)
        return;
    struct c10d__tcp_xfer *x = c10d__tcp_xfer_get(t);
    if (x == NULL)
        return; /* the peer's poll timer still looks within 2 ms */
    c10d__tcp_wire_encode(x->ctl_hdr, F_WAKE, 0, 0, 0, 0, 0, NULL);
    c10d__tcp_peer_write(t, &t->peers[r], x, W_CTL);
    c10d__tcp_xfer_put(t, x);
}

static void on_ring_more(uv_idle_t *h)
{
    (void)h; /* being active is the point: the loop's next turn does not block */
}

static void on_ring_poll(uv_prepare_t *h)
{
    struct c10d__tcp_transport *t = h->data;
    int got = t->failed ? 0 : c10d__tcp_rings_poll(t, c10d__engine_will_sleep());
    if (got != 0)
        c10d__engine_busy();
    if (t->ring_poll_open) {
        if (got & C10D__RINGS_MORE)
            uv_idle_start(&t->ring_more, on_ring_more);
        else
            uv_idle_stop(&t->ring_more);
    }
}

void c10d__tcp_transport_set_ring(struct c10d__tcp_transport *t, int r, struct c10d__shm_ring *out,
                                  struct c10d__shm_ring *in, void (*wake)(void *arg, int r),
                                  void *arg)
{
    if (t->failed || r < 0 || r >= t->cfg.size || r == t->cfg.rank || in == NULL)
        return;
    struct peer *pe = &t->peers[r];
    if (pe->ring_conn == NULL) {
        if (t->ring_peers == NULL &&
            (t->ring_peers = malloc((size_t)t->cfg.size * sizeof *t->ring_peers)) == NULL)
            return; /* its frames keep coming through the socket */
        if ((pe->ring_conn = calloc(1, sizeof *pe->ring_conn)) == NULL)
            return;
        t->ring_peers[t->nring_peers++] = r;
        pe->ring_conn->t = t;
        pe->ring_conn->rank = r;
        pe->ring_conn->state = C_READY;
    }
    pe->ring_in = in;
    pe->ring_out = out;
    c10d__shm_ring_open_reader(in);
    t->ring_wake = wake;
    t->ring_wake_arg = arg;
    if (!t->ring_poll_open) {
        uv_prepare_init(t->loop, &t->ring_poll);
        uv_idle_init(t->loop, &t->ring_more);
        t->ring_poll.data = t->ring_more.data = t;
        t->ring_poll_open = 1;
        t->handles += 2;
        uv_prepare_start(&t->ring_poll, on_ring_poll);
    }
}

void c10d__tcp_transport_on_p2p_unexpected(struct c10d__tcp_transport *t,
                                           void (*fn)(void *arg, int r), void *arg)
{
    t->p2p_unexpected = fn;
    t->p2p_unexpected_arg = arg;
}

unsigned c10d__tcp_transport_p2p_waiting(struct c10d__tcp_transport *t, int r)
{
    return atomic_load(&t->peers[r].p2p_waiting);
}

void c10d__tcp_transport_set_mailbox(struct c10d__tcp_transport *t, int r,
                                     struct c10d__shm_mailbox *in)
{
    if (r < 0 || r >= t->cfg.size || r == t->cfg.rank || t->peers[r].ring_conn == NULL ||
        in == NULL)
        return;
    t->peers[r].mb_in = in;
    atomic_store_explicit(&in->reader, 1, memory_order_release); /* r may deposit from now on */
}

uint64_t c10d__tcp_transport_ring_bytes(const struct c10d__tcp_transport *t)
{
    return atomic_load_explicit(&((struct c10d__tcp_transport *)t)->ring_bytes,
                                memory_order_relaxed);
}

void c10d__tcp_transport_set_local(struct c10d__tcp_transport *t, int r)
{
    if (r >= 0 && r < t->cfg.size && r != t->cfg.rank)
        t->peers[r].local = 1;
}

void c10d__tcp_transport_read_in_place(struct c10d__tcp_transport *t, int on)
{
    t->cma_off = !on;
}

uint64_t c10d__tcp_transport_bytes_in_place(const struct c10d__tcp_transport *t)
{
    return atomic_load_explicit(&t->cma_bytes, memory_order_relaxed);
}

const char *c10d__tcp_transport_peer_note(const struct c10d__tcp_transport *t, int r)
{
    return r >= 0 && r < t->cfg.size ? t->peers[r].note : "";
}

const char *c10d__tcp_transport_address(const struct c10d__tcp_transport *t)
{
    return t->published;
}

/* What rank r published: "host:port", and on rank 0's a "#<job id>" after
 * it, which every other rank takes. *addr: a copy of the address part. */
static int parse_published(const struct c10d__tcp_transport *t, int r, const char *a, char **addr,
                           uint64_t *job_id)
{
    struct sockaddr_storage ss;
    size_t len = strcspn(a, "#");
    char *copy = strndup(a, len);
    if (copy == NULL)
        return c10d__fail(C10D_ENOMEM, "tcp: out of memory");
    if (c10d__tcp_parse_addr(copy, &ss) != 0) {
        free(copy);
        return c10d__fail(C10D_EINVAL, "tcp: rank %d's address '%s' is not host:port", r, a);
    }
    if (r == 0 && t->cfg.rank != 0) {
        char *end = NULL;
        unsigned long long id = a[len] == '#' ? strtoull(a + len + 1, &end, 16) : 0;
        if (a[len] != '#' || end == a + len + 1 || *end != '\0') {
            free(copy);
            return c10d__fail(C10D_EINVAL,
                              "tcp: rank 0's address '%s' carries no job id (a rank of an "
                              "older libc10d, or the store entry was overwritten)",
                              a);
        }
        *job_id = id;
    }
    *addr = copy;
    return 0;
}

int c10d__tcp_transport_connect(struct c10d__tcp_transport *t, const char *const *addrs,
                                void (*ready)(void *arg, int status), void *arg)
{
    if (t->failed)
        return c10d__fail(C10D_EABORTED, "tcp: the transport was closed");
    t->addrs = calloc((size_t)t->cfg.size, sizeof *t->addrs);
    if (t->addrs == NULL)
        return c10d__fail(C10D_ENOMEM, "tcp: out of memory");
    for (int r = 0; r < t->cfg.size; r++) {
        uint64_t id = 0;
        /* Lazy: only rank 0's is known yet; the others are read on first use. */
        if (addrs[r] == NULL && t->cfg.lazy && r != 0)
            continue;
        C10D_CHECK(
            parse_published(t, r, addrs[r] != NULL ? addrs[r] : "(null)", &t->addrs[r], &id));
        if (r == 0 && t->cfg.rank != 0) {
            t->job_id = id;
            t->job_known = 1;
        }
    }
    /* Hellos that arrived before the job id was known are answered now. */
    for (struct conn *c = t->conns, *next; c != NULL; c = next) {
        next = c->all_next;
        if (c->parked && c->state == C_HELLO)
            c10d__tcp_accept_hello(c);
    }
    t->ready = ready;
    t->ready_arg = arg;
    uv_timer_init(t->loop, &t->deadline);
    t->handles++;
    t->deadline_open = 1;
    t->deadline.data = t;
    if (t->cfg.lazy) {
        /* Ready at once, but never inside this call. */
        uv_timer_start(&t->deadline, c10d__tcp_on_deadline, 0, 0);
        return 0;
    }
    uint64_t timeout = t->cfg.timeout_ms > 0 ? (uint64_t)t->cfg.timeout_ms : 30u * 60 * 1000;
    uv_timer_start(&t->deadline, c10d__tcp_on_deadline, timeout, 0);
    /* The higher rank of each pair connects, so no two connections race. */
    for (int r = 0; r < t->cfg.rank; r++)
        c10d__tcp_peer_connect(t, r);
    /* Peers may all have connected before we were asked (they only need our
     * listening socket): then we are ready now, reported on a later turn. */
    if (t->nmet >= t->cfg.size - 1)
        uv_timer_start(&t->deadline, c10d__tcp_on_deadline, 0, 0);
    return 0;
}

int c10d__tcp_transport_lazy(const struct c10d__tcp_transport *t)
{
    return t->cfg.lazy;
}

int c10d__tcp_transport_failed(const struct c10d__tcp_transport *t)
{
    return t->failed;
}

int c10d__tcp_transport_lost_ranks(const struct c10d__tcp_transport *t, int *out, int cap)
{
    int n = 0;
    if (t->peers[t->first_lost].lost && n++ < cap)
        out[0] = t->first_lost;
    for (int r = 0; r < t->cfg.size; r++)
        if (t->peers[r].lost && r != t->first_lost && n++ < cap)
            out[n - 1] = r;
    if (t->told_lost >= 0 && !t->peers[t->told_lost].lost && n++ < cap)
        out[n - 1] = t->told_lost;
    return n;
}

/* ----------------------------------------------------------- closing */

static void on_handle_closed(uv_handle_t *h)
{
    c10d__tcp_handle_closed(h->data);
}

/* Connection setup ends with the transport: its waiter hears why. */
static void ready_fail(struct c10d__tcp_transport *t, int status, const char *message)
{
    if (t->ready_called || t->ready == NULL)
        return;
    t->ready_called = 1;
    c10d__fail(status, "%s", message);
    t->ready(t->ready_arg, status);
}

/* Best effort: a last frame to every ready peer with nothing queued, so a peer
 * still waiting on us learns at once why we are going. */
static void tell_idle_peers(struct c10d__tcp_transport *t, uv_buf_t *bufs, unsigned nbufs)
{
    for (struct conn *c = t->conns; c != NULL; c = c->all_next)
        if (c->state == C_READY && uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp) == 0 &&
            (c->rank < 0 || t->peers[c->rank].rw_head == NULL))
            uv_try_write((uv_stream_t *)&c->tcp, bufs, nbufs);
}

/* Closes every connection, the listener and the timers. */
static void close_all_handles(struct c10d__tcp_transport *t)
{
    for (struct conn *c = t->conns; c != NULL; c = c->all_next)
        c10d__tcp_conn_close(c);
    if (t->listening) {
        t->listening = 0;
        uv_close((uv_handle_t *)&t->listener, on_handle_closed);
    }
    if (t->deadline_open) {
        t->deadline_open = 0;
        uv_close((uv_handle_t *)&t->deadline, on_handle_closed);
    }
    if (t->grace_open) {
        t->grace_open = 0;
        uv_close((uv_handle_t *)&t->grace, on_handle_closed);
    }
    if (t->pending_open) {
        t->pending_open = 0;
        uv_close((uv_handle_t *)&t->pending, on_handle_closed);
    }
    if (t->ring_poll_open) {
        t->ring_poll_open = 0;
        uv_close((uv_handle_t *)&t->ring_poll, on_handle_closed);
        uv_close((uv_handle_t *)&t->ring_more, on_handle_closed);
    }
}

void c10d__tcp_transport_fail(struct c10d__tcp_transport *t, int status, const char *message)
{
    if (t->failed)
        return;
    t->failed = 1;
    size_t mlen = strlen(message);
    if (mlen > ABORT_MSG_MAX)
        mlen = ABORT_MSG_MAX;
    /* The abort names the rank this one knows died (its number + 1, 0: none),
     * so that ranks that hear of the loss only from us can name it too. */
    int lost = -1;
    c10d__tcp_transport_lost_ranks(t, &lost, 1);
    unsigned char hdr[HDR_LEN];
    c10d__tcp_wire_encode(hdr, F_ABORT, 0, 0, (uint32_t)(lost + 1), (uint64_t)(int64_t)status, mlen,
                          NULL);
    uv_buf_t b[2] = {uv_buf_init((char *)hdr, HDR_LEN),
                     uv_buf_init((char *)message, (unsigned)mlen)};
    tell_idle_peers(t, b, 2);
    close_all_handles(t);
    ready_fail(t, status, message);
}

/* A clean goodbye: peers that still run ops among themselves carry on. */
static void transport_close_quietly(struct c10d__tcp_transport *t)
{
    c10d__tcp_rings_flush(t); /* a peer with frames still waiting gets no goodbye */
    unsigned char hdr[HDR_LEN];
    c10d__tcp_wire_encode(hdr, F_BYE, 0, 0, 0, 0, 0, NULL);
    uv_buf_t b = uv_buf_init((char *)hdr, HDR_LEN);
    tell_idle_peers(t, &b, 1);
    t->failed = 1;
    close_all_handles(t);
    ready_fail(t, C10D_EABORTED, "tcp: the group was closed during connection setup");
}

void c10d__tcp_transport_free(struct c10d__tcp_transport *t)
{
    if (!t->failed)
        transport_close_quietly(t);
    t->freeing = 1;
    if (t->handles == 0)
        c10d__tcp_free_memory(t);
}

void c10d__tcp_transport_on_connect_failed(struct c10d__tcp_transport *t,
                                           void (*reread)(void *arg, int rank), void *arg)
{
    t->reread = reread;
    t->reread_arg = arg;
}

int c10d__tcp_transport_update_addr(struct c10d__tcp_transport *t, int rank, const char *published)
{
    if (t->addrs == NULL || rank < 0 || rank >= t->cfg.size || rank == t->cfg.rank)
        return c10d__fail(C10D_EINVAL, "tcp: no address of rank %d to update", rank);
    char *addr = NULL;
    uint64_t id = t->job_id;
    C10D_CHECK(parse_published(t, rank, published, &addr, &id));
    if (t->addrs[rank] != NULL && strcmp(addr, t->addrs[rank]) == 0 && id == t->job_id) {
        free(addr);
        return 0;
    }
    if (t->addrs[rank] != NULL)
        C10D_INFO("tcp", "rank %d: rank %d published a new address: %s (was %s)", t->cfg.rank, rank,
                  addr, t->addrs[rank]);
    free(t->addrs[rank]);
    t->addrs[rank] = addr;
    /* Rank 0's job id comes with its address: hellos of the job it names
     * are the ones to take now. */
    t->job_id = id;
    return 1;
}
