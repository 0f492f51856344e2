/* The handshake. Before a connection carries a single frame, each side shows
 * that it belongs to the same job and group (token, job id, group id, size)
 * and names its rank. An inbound connection that fails this is a stranger,
 * dropped before it can touch the group. Kept on its own because it is the
 * transport's admission check (docs/security.md): what a connection may do
 * before it is a peer is decided here and nowhere else. */
#include "transport_impl.h"

#include "engine/log.h"
#include "engine/loop.h"

#include <stdio.h>
#include <string.h>

#define HELLO_MAGIC    0x43313044u /* "C10D" */
#define HELLO_VERSION  3
#define HELLO_ACCEPTED 1u

/* The hello, both ways (host byte order, as every frame):
 *   u32 magic, u16 version, u16 flags (answer: HELLO_ACCEPTED), u32 group id,
 *   u32 rank (the sender's), u32 world size, u32 token length, u64 job id,
 *   u32 note length, then the token and the note (cfg.hello_note). */
size_t c10d__tcp_hello_encode(const struct c10d__tcp_transport *t, unsigned char *out,
                              uint16_t flags)
{
    uint32_t magic = HELLO_MAGIC, gid = t->cfg.group_id, rank = (uint32_t)t->cfg.rank;
    uint32_t size = (uint32_t)t->cfg.size, tlen = (uint32_t)t->token_len;
    uint32_t nlen = (uint32_t)t->note_len;
    uint16_t version = HELLO_VERSION;
    memcpy(out, &magic, 4);
    memcpy(out + 4, &version, 2);
    memcpy(out + 6, &flags, 2);
    memcpy(out + 8, &gid, 4);
    memcpy(out + 12, &rank, 4);
    memcpy(out + 16, &size, 4);
    memcpy(out + 20, &tlen, 4);
    memcpy(out + 24, &t->job_id, 8);
    memcpy(out + 32, &nlen, 4);
    memcpy(out + HELLO_FIXED, t->token, t->token_len);
    memcpy(out + HELLO_FIXED + t->token_len, t->note, t->note_len);
    return HELLO_FIXED + t->token_len + t->note_len;
}

struct hello {
    uint32_t magic, group_id, rank, size, token_len, note_len;
    uint16_t version, flags;
    uint64_t job_id;
    const unsigned char *token, *note;
};

static void hello_decode(const unsigned char *in, struct hello *h)
{
    memcpy(&h->magic, in, 4);
    memcpy(&h->version, in + 4, 2);
    memcpy(&h->flags, in + 6, 2);
    memcpy(&h->group_id, in + 8, 4);
    memcpy(&h->rank, in + 12, 4);
    memcpy(&h->size, in + 16, 4);
    memcpy(&h->token_len, in + 20, 4);
    memcpy(&h->job_id, in + 24, 8);
    memcpy(&h->note_len, in + 32, 4);
    h->token = in + HELLO_FIXED;
    h->note = h->token + h->token_len;
}

/* A peer admitted: what its hello says beyond who it is. */
static void keep_note(struct c10d__tcp_transport *t, int r, const struct hello *h)
{
    memcpy(t->peers[r].note, h->note, h->note_len);
    t->peers[r].note[h->note_len] = '\0';
}

/* What is wrong with a hello for this transport (NULL: nothing). The token
 * is compared first and in constant time. */
static const char *hello_problem(const struct c10d__tcp_transport *t, const struct hello *h,
                                 char *buf, size_t size)
{
    if (!c10d__token_equal(h->token, h->token_len, t->token, t->token_len))
        return t->token_len ? "wrong or missing token"
                            : "it presents a token and this job has none";
    if (h->job_id != t->job_id) {
        snprintf(buf, size, "it belongs to another job (job id %016llx, this job's %016llx)",
                 (unsigned long long)h->job_id, (unsigned long long)t->job_id);
        return buf;
    }
    if (h->group_id != t->cfg.group_id || (int)h->size != t->cfg.size) {
        snprintf(buf, size, "it is for another group (id %08x of %u ranks; this group: %08x of %d)",
                 h->group_id, h->size, t->cfg.group_id, t->cfg.size);
        return buf;
    }
    return NULL;
}

static void check_ready(struct c10d__tcp_transport *t)
{
    if (t->ready_called || t->ready == NULL || t->nmet < t->cfg.size - 1)
        return;
    t->ready_called = 1;
    if (t->deadline_open)
        uv_timer_stop(&t->deadline);
    t->ready(t->ready_arg, 0);
}

static void hello_done(struct conn *c)
{
    struct c10d__tcp_transport *t = c->t;
    struct peer *pe = &t->peers[c->rank];
    c->state = C_READY;
    pe->connect_fail_since = 0;
    if (pe->connecting == c)
        pe->connecting = NULL;
    pe->conn = c;
    t->nready++;
    if (!pe->met) {
        pe->met = 1;
        t->nmet++;
    }
    C10D_DEBUG("tcp", "rank %d: connected to rank %d", t->cfg.rank, c->rank);
    c10d__tcp_peer_flush(t, pe);
    check_ready(t);
}

/* Inbound: a complete hello. Nothing here can fail the group: the
 * connection only joins it once the answer is out. */
void c10d__tcp_accept_hello(struct conn *c)
{
    struct c10d__tcp_transport *t = c->t;
    if (!t->job_known) {
        /* A peer read our address before we read rank 0's: answer once we
         * know the job id (c10d__tcp_transport_connect). */
        c->parked = 1;
        return;
    }
    c->parked = 0;
    struct hello h;
    hello_decode(c->hello_in, &h);
    char buf[160];
    const char *problem = hello_problem(t, &h, buf, sizeof buf);
    if (problem != NULL) {
        c10d__tcp_drop_stranger(c, "%s", problem);
        return;
    }
    int r = (int)h.rank;
    if (r < 0 || r >= t->cfg.size || r == t->cfg.rank) {
        c10d__tcp_drop_stranger(c, "it claims rank %d of %d", r, t->cfg.size);
        return;
    }
    struct peer *pe = &t->peers[r];
    /* Both sides connecting at once (lazy): the lower rank's connection wins.
     * A rank already connected keeps its connection. */
    int accept = pe->conn == NULL && !pe->lost && !(pe->connecting != NULL && t->cfg.rank < r);
    size_t n = c10d__tcp_hello_encode(t, c->hello_out, accept ? HELLO_ACCEPTED : 0);
    uv_buf_t b = uv_buf_init((char *)c->hello_out, (unsigned)n);
    if (uv_try_write((uv_stream_t *)&c->tcp, &b, 1) != (int)n) {
        /* The other end is gone already (or never meant it): not a peer of
         * ours until the hello is answered. */
        C10D_DEBUG("tcp", "rank %d: cannot answer a handshake claiming rank %d; closing it",
                   t->cfg.rank, r);
        c10d__tcp_conn_close(c);
        return;
    }
    if (!accept) {
        c10d__tcp_conn_close(c);
        return;
    }
    c->rank = r;
    keep_note(t, r, &h);
    hello_done(c);
}

/* Outbound: the answer of the rank we connected to. */
static void answer_hello(struct conn *c)
{
    struct c10d__tcp_transport *t = c->t;
    struct hello h;
    hello_decode(c->hello_in, &h);
    char buf[160];
    const char *problem = hello_problem(t, &h, buf, sizeof buf);
    if (problem == NULL && (int)h.rank != c->rank) {
        snprintf(buf, sizeof buf, "it answers as rank %u", h.rank);
        problem = buf;
    }
    int rank = c->rank;
    if (problem != NULL) {
        /* Whoever listens on that address now is not the peer we want (a
         * reused port, another job): keep trying until the deadline. */
        char why[200];
        snprintf(why, sizeof why, "the handshake failed: %s", problem);
        c10d__tcp_conn_close(c);
        c10d__tcp_connect_failed(t, rank, why);
        return;
    }
    if (!(h.flags & HELLO_ACCEPTED)) {
        /* A refusal means the peer keeps its own connection to us. */
        c10d__tcp_conn_close(c);
        return;
    }
    keep_note(t, rank, &h);
    hello_done(c);
}

/* Bytes of a hello: the fixed part first, whose token length (bounded) says
 * how much more. Garbage is dropped as soon as the fixed part shows it. */
size_t c10d__tcp_hello_bytes(struct conn *c, const char *p, size_t n)
{
    struct c10d__tcp_transport *t = c->t;
    size_t want = HELLO_FIXED;
    if (c->hello_have >= HELLO_FIXED) {
        uint32_t tlen, nlen;
        memcpy(&tlen, c->hello_in + 20, 4);
        memcpy(&nlen, c->hello_in + 32, 4);
        want += tlen + nlen;
    }
    size_t k = want - c->hello_have < n ? want - c->hello_have : n;
    memcpy(c->hello_in + c->hello_have, p, k);
    c->hello_have += k;
    if (c->hello_have == HELLO_FIXED) {
        struct hello h;
        hello_decode(c->hello_in, &h);
        if (h.magic != HELLO_MAGIC || h.version != HELLO_VERSION || h.token_len > C10D_TOKEN_MAX ||
            h.note_len > C10D_TCP_NOTE_MAX) {
            if (c->initiator) {
                int rank = c->rank;
                c10d__tcp_conn_close(c);
                c10d__tcp_connect_failed(t, rank, "the peer's answer is not a libc10d handshake");
            } else {
                c10d__tcp_drop_stranger(c, "not a libc10d handshake of version %d", HELLO_VERSION);
            }
            return k;
        }
        want += h.token_len + h.note_len;
    }
    if (c->hello_have == want) {
        if (c->initiator)
            answer_hello(c);
        else
            c10d__tcp_accept_hello(c);
    }
    return k;
}
