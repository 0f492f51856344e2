/* Collective fingerprints (fingerprint.h): built from an op, compared, and
 * described for the message that names two disagreeing ranks. */
#include "fingerprint.h"

#include "backends/backend.h"

#include "engine/error.h"

#include "c10d.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void c10d__fp_of(const struct c10d__op *op, int size, struct c10d__fp *fp)
{
    memset(fp, 0, sizeof *fp);
    int reducing = op->kind == C10D_OP_ALL_REDUCE || op->kind == C10D_OP_REDUCE ||
                   op->kind == C10D_OP_REDUCE_SCATTER;
    int rooted = op->kind == C10D_OP_BROADCAST || op->kind == C10D_OP_REDUCE ||
                 op->kind == C10D_OP_GATHER || op->kind == C10D_OP_SCATTER;
    fp->kind = (uint8_t)op->kind;
    fp->dtype = op->kind == C10D_OP_BARRIER ? C10D_FP_NONE : (uint8_t)op->dtype;
    fp->redop = reducing ? (uint8_t)op->redop : C10D_FP_NONE;
    fp->root = rooted ? op->root : -1;
    /* all_to_all's split sizes legitimately differ between ranks (and an
     * even split may be given either way); each message's size is still
     * checked against its receive. */
    if (op->kind == C10D_OP_BARRIER)
        fp->count = 0;
    else if (op->kind == C10D_OP_ALL_TO_ALL)
        fp->count = UINT64_MAX;
    /* The uneven forms: each rank's block differs, the total must not. */
    else if (op->kind == C10D_OP_ALL_GATHER && op->recv_counts != NULL)
        fp->count = c10d__op_counts_sum(op->recv_counts, size);
    else if (op->kind == C10D_OP_REDUCE_SCATTER && op->send_counts != NULL)
        fp->count = c10d__op_counts_sum(op->send_counts, size);
    else
        fp->count = op->count;
}

static const char *kind_name(uint8_t kind)
{
    return c10d__op_kind_name((enum c10d__op_kind)kind);
}

static const char *or_none(const char *s)
{
    return s != NULL ? s : "none";
}

/* Appends to buf without ever overrunning it (a long message is cut). */
static size_t put(char *buf, size_t cap, size_t n, const char *fmt, ...) C10D_PRINTF(4, 5);
static size_t put(char *buf, size_t cap, size_t n, const char *fmt, ...)
{
    if (n >= cap)
        return n;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(buf + n, cap - n, fmt, ap);
    va_end(ap);
    return k < 0 ? n : n + (size_t)k;
}

static size_t describe(char *buf, size_t cap, size_t n, uint64_t seq, uint32_t member,
                       const struct c10d__fp *fp)
{
    n = put(buf, cap, n, "CollectiveFingerPrint(SequenceNumber=%llu, OpType=%s",
            (unsigned long long)seq, kind_name(fp->kind));
    if (fp->dtype != C10D_FP_NONE) {
        if (fp->count != UINT64_MAX)
            n = put(buf, cap, n, ", TensorShape=[%llu]", (unsigned long long)fp->count);
        n = put(buf, cap, n, ", TensorDtypes=%s, TensorDeviceTypes=cpu",
                or_none(c10d_dtype_name((c10d_dtype)fp->dtype)));
    }
    if (fp->redop != C10D_FP_NONE)
        n = put(buf, cap, n, ", ReduceOp=%s",
                or_none(c10d_reduce_op_name((c10d_reduce_op)fp->redop)));
    if (fp->root >= 0)
        n = put(buf, cap, n, ", Root=%d", (int)fp->root);
    if (member > 0)
        n = put(buf, cap, n, ", CoalescedIndex=%u", (unsigned)member);
    return put(buf, cap, n, ")");
}

void c10d__fp_mismatch_message(char *buf, size_t cap, uint64_t seq, uint32_t member, int my_rank,
                               const struct c10d__fp *mine, int their_rank,
                               const struct c10d__fp *theirs)
{
    size_t n = put(buf, cap, 0,
                   "Detected mismatch between collectives on ranks. Rank %d is running "
                   "collective: ",
                   my_rank);
    n = describe(buf, cap, n, seq, member, mine);
    n = put(buf, cap, n, ", but Rank %d is running collective: ", their_rank);
    n = describe(buf, cap, n, seq, member, theirs);
    n = put(buf, cap, n, ". Collectives differ in the following aspects: ");
    /* Different kinds differ in every other field too; only the kind says why. */
    if (mine->kind != theirs->kind) {
        put(buf, cap, n, "  Op type: %s vs %s", kind_name(mine->kind), kind_name(theirs->kind));
        return;
    }
    if (mine->count != theirs->count)
        n = put(buf, cap, n, "  Tensor shapes: [%llu] vs [%llu]", (unsigned long long)mine->count,
                (unsigned long long)theirs->count);
    if (mine->dtype != theirs->dtype)
        n = put(buf, cap, n, "  Tensor dtypes: %s vs %s",
                or_none(c10d_dtype_name((c10d_dtype)mine->dtype)),
                or_none(c10d_dtype_name((c10d_dtype)theirs->dtype)));
    if (mine->redop != theirs->redop)
        n = put(buf, cap, n, "  Reduce op: %s vs %s",
                or_none(c10d_reduce_op_name((c10d_reduce_op)mine->redop)),
                or_none(c10d_reduce_op_name((c10d_reduce_op)theirs->redop)));
    if (mine->root != theirs->root)
        put(buf, cap, n, "  Root: %d vs %d", (int)mine->root, (int)theirs->root);
}
