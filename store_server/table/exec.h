/* Runs one store request against a table and writes its reply in the wire
 * format: the one executor of the store's commands, used by the server's
 * sessions and by the client stores that keep a table of their own (hash,
 * file; the file store also replays its log through it). What a command does
 * lives here once; what a host adds around it (the server's MULTI_GET cache
 * and STATS, the local stores' parked waits) lives with the host.
 *
 * Loop thread of the table's owner, like the table. */
#ifndef C10D_STORE_SERVER_TABLE_EXEC_H
#define C10D_STORE_SERVER_TABLE_EXEC_H

#include "store_server/table/table.h"
#include "store_server/wire/codec.h"

#include <stddef.h>
#include <stdint.h>

/* What running a request found beyond its reply bytes. */
struct c10d__store_exec_result {
    /* ADD: the new value; DELETE_KEY: keys deleted; QUEUE_POP: the queue's
     * length before the pop (0: nothing popped); GET: 1 if the key was there
     * (a missing key is answered with an empty value, as PyTorch's server
     * does); WAIT and BARRIER: 1 if answered now, 0 if the client now waits
     * (cbs.wake answers later). */
    int64_t value;
};

/* What c10d__store_exec_reply_bound found on the way (GET's value), so that
 * running the request right after needs no second lookup. Valid until the
 * table changes. */
struct c10d__store_exec_plan {
    int looked_up;
    int present;
    struct c10d__wire_str value;
};

/* Runs `r` and appends its reply (nothing for commands without one, or for a
 * WAIT/BARRIER that now waits) to `out`. `client` parks waits and owns
 * watches; it may be NULL for every command but WAIT, BARRIER, WATCH_KEY and
 * CANCEL_WAIT. STATS is the host's: refused here with C10D_EUNSUPPORTED.
 * Errors: C10D_EINVAL (ADD/BARRIER on a value that is not a decimal integer,
 * or overflow), C10D_ENOMEM (the table's budget, or `out` could not grow; the
 * reply may then be partly written), C10D_EUNSUPPORTED. A failed command
 * leaves the table as it was. */
int c10d__store_exec(struct c10d__store_table *t, struct c10d__store_client *client,
                     const struct c10d__wire_request *r, const struct c10d__store_exec_plan *plan,
                     struct c10d__wire_buf *out, struct c10d__store_exec_result *res);

/* The size of the reply c10d__store_exec would write for `r` now (an upper
 * bound for COMPARE_SET; 0 for STATS, the host's), so a host can refuse or
 * defer a reply over its budget before the command changes anything. `plan`
 * (may be NULL) keeps what the lookup found for c10d__store_exec. Inline for
 * the replies whose size the command table fixes (every request asks). */
size_t c10d__store_exec_reply_lookup(struct c10d__store_table *t,
                                     const struct c10d__wire_request *r,
                                     struct c10d__store_exec_plan *plan);
/* By command: the reply's size when the table cannot change it, else -1. */
extern const signed char c10d__store_exec_fixed_reply[C10D_STORE_CMD_COUNT];

static inline size_t c10d__store_exec_reply_bound(struct c10d__store_table *t,
                                                  const struct c10d__wire_request *r,
                                                  struct c10d__store_exec_plan *plan)
{
    int fixed = c10d__store_exec_fixed_reply[r->cmd];
    return fixed >= 0 ? (size_t)fixed : c10d__store_exec_reply_lookup(t, r, plan);
}

#endif
