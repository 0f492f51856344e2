/* A collective's fingerprint: what ranks calling "the same" collective must
 * agree on (kind, dtype, reduce op, root, count), and the message that names
 * two ranks that do not, in the words torch's ProcessGroupWrapper uses. The
 * tcp backend carries it in every frame; the group layer exchanges it
 * explicitly under C10D_DEBUG=DETAIL for backends whose wire cannot. */
#ifndef C10D_BACKENDS_FINGERPRINT_H
#define C10D_BACKENDS_FINGERPRINT_H

#include <stddef.h>
#include <stdint.h>

struct c10d__op;

/* A field that does not apply to the op kind holds its "none" value on every
 * rank, so equal calls always compare equal. Sent as it is in memory. */
#define C10D_FP_NONE 0xff
struct c10d__fp {
    uint8_t kind;
    uint8_t dtype; /* C10D_FP_NONE: barrier */
    uint8_t redop; /* reductions only */
    uint8_t pad;
    int32_t root;   /* rooted ops only, else -1 */
    uint64_t count; /* elements per rank block (uneven forms: in all); UINT64_MAX: not compared */
};

/* `size`: the group's, for the uneven forms' counts. */
void c10d__fp_of(const struct c10d__op *op, int size, struct c10d__fp *fp);
/* Inline: every rank's stamp is compared on every op of the shared segment. */
static inline int c10d__fp_equal(const struct c10d__fp *a, const struct c10d__fp *b)
{
    return a->kind == b->kind && a->dtype == b->dtype && a->redop == b->redop &&
           a->root == b->root && a->count == b->count;
}
/* "Detected mismatch between collectives on ranks. Rank <mine> is running
 * collective: ..., but Rank <theirs> is running collective: .... Collectives
 * differ in the following aspects: ..."; `member` > 0 names the member of a
 * coalesced list. */
void c10d__fp_mismatch_message(char *buf, size_t cap, uint64_t seq, uint32_t member, int my_rank,
                               const struct c10d__fp *mine, int their_rank,
                               const struct c10d__fp *theirs);

#endif
