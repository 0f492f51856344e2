/* Op names as torch's OpType spells them, and the element counts torch's
 * messages and flight recorder show, for every layer that prints an op. */
#include "backends/backend.h"

const char *c10d__op_kind_name(enum c10d__op_kind kind)
{
    static const char *const names[C10D_OP_KIND_COUNT] = {
        [C10D_OP_BROADCAST] = "BROADCAST",
        [C10D_OP_ALL_REDUCE] = "ALLREDUCE",
        [C10D_OP_REDUCE] = "REDUCE",
        [C10D_OP_ALL_GATHER] = "ALLGATHER",
        [C10D_OP_GATHER] = "GATHER",
        [C10D_OP_SCATTER] = "SCATTER",
        [C10D_OP_REDUCE_SCATTER] = "REDUCE_SCATTER",
        [C10D_OP_ALL_TO_ALL] = "ALLTOALL",
        [C10D_OP_BARRIER] = "BARRIER",
        [C10D_OP_SEND] = "SEND",
        [C10D_OP_RECV] = "RECV",
    };
    return (unsigned)kind < C10D_OP_KIND_COUNT ? names[kind] : "UNKNOWN";
}

size_t c10d__op_counts_sum(const size_t *counts, int size)
{
    size_t sum = 0;
    for (int i = 0; i < size; i++)
        sum += counts[i];
    return sum;
}

void c10d__op_numel(const struct c10d__op *op, int size, size_t *in, size_t *out)
{
    size_t n = op->count, s = (size_t)size;
    switch (op->kind) {
    case C10D_OP_ALL_GATHER:
    case C10D_OP_GATHER:
        *in = n, *out = n * s;
        if (op->kind == C10D_OP_ALL_GATHER && op->recv_counts != NULL)
            *out = c10d__op_counts_sum(op->recv_counts, size);
        return;
    case C10D_OP_SCATTER:
    case C10D_OP_REDUCE_SCATTER:
        *in = n * s, *out = n;
        if (op->kind == C10D_OP_REDUCE_SCATTER && op->send_counts != NULL)
            *in = c10d__op_counts_sum(op->send_counts, size);
        return;
    case C10D_OP_ALL_TO_ALL:
        *in = *out = 0;
        for (int i = 0; i < size; i++) {
            *in += op->send_counts != NULL ? op->send_counts[i] : n / s;
            *out += op->recv_counts != NULL ? op->recv_counts[i] : n / s;
        }
        if (op->sends == NULL && op->send_counts == NULL)
            *in = n;
        return;
    case C10D_OP_BARRIER:
        *in = *out = 0;
        return;
    default:
        *in = *out = n;
    }
}
