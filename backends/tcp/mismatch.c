/* Mismatched collectives: every collective frame carries its sender's
 * fingerprint (backends/fingerprint.h), and the receiver compares it with
 * what it runs itself for that sequence number.
 *
 * Without this, two ranks calling one collective differently may mix bytes
 * with status OK (float32 against int32 of the same size, SUM against MAX),
 * diverge silently (two roots of one broadcast), or wait for a timeout (an
 * all_reduce against a broadcast whose messages never pair up). With it the
 * first frame that disagrees fails the transport, which tells every peer why:
 * every rank fails with a message naming both ranks and what differs. It
 * costs 16 bytes per frame and a compare; no message is added.
 *
 * Frames of an op this rank has not reached yet wait in the unexpected queue
 * and are compared when the op starts (c10d__tcp_expect). Only disagreements
 * some frame carries can be seen: a rank whose part is send-only (a root)
 * may finish before the disagreeing frame arrives (its next op fails), and
 * ranks that exchange nothing for the op (two roots of a gather on three
 * ranks) cannot learn of each other without a message: C10D_DEBUG=DETAIL
 * adds that exchange (docs/tcp_backend.md, "Fingerprints"). */
#include "transport_impl.h"

_Static_assert(sizeof(struct wire) == HDR_LEN, "the frame header is sent as it is in memory");

static struct fp_slot *slot_of(struct c10d__tcp_transport *t, uint64_t seq, uint32_t member)
{
    return &t->fps[(seq * 7 + member) % FP_SLOTS];
}

int c10d__tcp_fp_check(struct c10d__tcp_transport *t, int from, const struct wire *w)
{
    uint32_t member = w->sub >> 24;
    const struct fp_slot *s = slot_of(t, w->tag, member);
    if (!s->used || s->seq != w->tag || s->member != member)
        return 0; /* not reached yet: compared by c10d__tcp_expect */
    if (s->fp.kind == w->kind && c10d__fp_equal(&s->fp, &w->fp))
        return 0;
    struct c10d__fp theirs = w->fp;
    theirs.kind = w->kind;
    char msg[ABORT_MSG_MAX];
    c10d__fp_mismatch_message(msg, sizeof msg, w->tag, member, t->cfg.rank, &s->fp, from, &theirs);
    c10d__tcp_error(t, C10D_EINVAL, "%s", msg);
    return -1;
}

void c10d__tcp_expect(struct c10d__tcp_transport *t, uint64_t seq, uint32_t member,
                      const struct c10d__fp *fp)
{
    if (t->failed)
        return;
    struct fp_slot *s = slot_of(t, seq, member);
    *s = (struct fp_slot){.seq = seq, .member = member, .used = 1, .fp = *fp};
    if (t->unexp_n == 0)
        return; /* the common case: nothing arrived ahead of the op */
    for (int r = 0; r < t->cfg.size; r++) {
        for (struct unexp *u = t->peers[r].unexp_head; u != NULL; u = u->next) {
            if ((u->w.flags & FLAG_P2P) || u->w.tag != seq || (u->w.sub >> 24) != member)
                continue;
            if (u->w.type != F_EAGER && u->w.type != F_RTS && u->w.type != F_CTS)
                continue;
            if (c10d__tcp_fp_check(t, r, &u->w) < 0)
                return;
        }
    }
}
