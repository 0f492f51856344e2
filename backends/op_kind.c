/* Op names as torch's OpType spells them, for messages and the flight
 * recorder. Backends and the group layer all print through this one table. */
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
