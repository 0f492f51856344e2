/* This file is private. Where one rendezvous keeps its keys in a store that
 * may outlive the job (docs/semantics.md, 1: attempt namespaces). */
#ifndef C10D_API_ATTEMPT_H
#define C10D_API_ATTEMPT_H

#include "c10d.h"

#include <stdint.h>

/* The store a rendezvous hands out ("default_pg/"-prefixed) over `base`.
 * shared == 0 (a store this job's rank 0 just started): "default_pg", as
 * torch. shared == 1 (an agent or external store, which may hold keys of
 * earlier jobs and attempts): "<attempt namespace>/gen_<g>/default_pg",
 * where the namespace comes from the launcher's job id and restart count
 * and g is a generation rank 0 takes and hands to every other rank, so no
 * rank ever reads a key an earlier job wrote; rank 0 then deletes what
 * earlier generations and attempts left. Blocks on store round trips,
 * bounded by timeout_ms; never on the loop thread. */
int c10d__attempt_store(c10d_store *base, int rank, int world_size, int shared, int64_t timeout_ms,
                        c10d_store **out);

/* rendezvous.c: c10d_rendezvous, also saying whether the store may outlive
 * the job (an agent or external store) rather than die with its rank 0. */
int c10d__rendezvous(const char *url, const c10d_rendezvous_opts *opts, c10d_rendezvous_result *out,
                     int *store_outlives_job);

/* rendezvous.c: an op of a group of this process failed, so its peers may be
 * gone or stuck: a store this process hosts stops at c10d_shutdown without
 * waiting for their connections to close. Any thread. */
void c10d__hosted_store_skip_linger(void);

#endif
