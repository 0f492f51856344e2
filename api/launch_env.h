/* This file is private. The env:// rendezvous asks it who started the
 * process: torchrun/c10drun, Kubeflow's PyTorchJob, Open MPI's mpirun,
 * MPICH/Hydra (PMI), Slurm's srun. It turns that launcher's variables into
 * a rank, a world size, a local rank and where rank 0's store is
 * (docs/launchers.md). Parsing is pure (a table of values in, a result or
 * one error out) so the tests feed it any environment; only
 * c10d__launch_resolve does I/O (the PMIx exchange). Any thread. */
#ifndef C10D_API_LAUNCH_ENV_H
#define C10D_API_LAUNCH_ENV_H

#include "engine/env.h"

#include <stddef.h>
#include <stdint.h>

/* Slurm steps without MASTER_PORT get a port in [base, base + span) from a
 * hash of the job and step ids, so two steps of one job differ. The range
 * ends below Linux's default ephemeral ports (32768-60999): a port the
 * kernel hands to outgoing connections would collide (seen in CI). */
#define C10D_SLURM_PORT_BASE 20000
#define C10D_SLURM_PORT_SPAN 12768

struct c10d__launch {
    const char *launcher;             /* "Open MPI", ...; "caller" when nothing was needed */
    const char *rank_from;            /* the variables rank and size came from */
    const char *master_from;          /* "MASTER_ADDR/MASTER_PORT", "SLURM_STEP_NODELIST", "PMIx" */
    int rank, world_size;             /* -1: not found (only when the caller gives them) */
    int local_rank, local_world_size; /* -1: the launcher does not say */
    char master_addr[256];
    int master_port;    /* 0 with master_by_pmix: rank 0 picks one */
    int master_by_pmix; /* the address still has to be exchanged (c10d__launch_resolve) */
};

/* Reads env[id] (NULL or "": unset; only the launcher ids are looked at)
 * into *out. need_rank: the caller gives no rank or world size, so they
 * must come from the environment even when no launcher is detected (a
 * detected launcher must always give both). need_master: rank 0's address
 * is wanted too. Fails with C10D_EINVAL and one message naming the
 * launcher detected and every variable missing or inconsistent. */
int c10d__launch_parse(const char *const env[C10D_ENV_COUNT], int need_rank, int need_master,
                       struct c10d__launch *out);

/* Completes a parsed launch: with master_by_pmix, rank 0 publishes its
 * address through PMIx (libpmix loaded at run time) and every rank reads
 * it, bounded by timeout_ms. Blocks; never on the loop thread. */
int c10d__launch_resolve(struct c10d__launch *launch, int64_t timeout_ms);

/* The whole env:// step: the process environment, parse, resolve, and one
 * INFO line saying where rank, size and master came from. */
int c10d__launch_detect(int need_rank, int64_t timeout_ms, struct c10d__launch *out);

/* Slurm's compressed host list ("node[01-04,7],gpu-a[1-2]"): writes host
 * `index` (counting from 0, zero padding kept) to out when index is below
 * the list's length, and returns that length (>= 1); a malformed list
 * fails with C10D_EINVAL naming what is wrong. */
int c10d__hostlist_host(const char *list, size_t index, char *out, size_t cap);

/* The port of a Slurm step without MASTER_PORT (see C10D_SLURM_PORT_BASE). */
int c10d__slurm_port(const char *job_id, const char *step_id);

/* PMIx (launch_env_pmix.c): rank 0 puts "addr port" under a key, everyone
 * fences and reads rank 0's. addr/port: rank 0's in, everyone's out. Fails
 * at once, without PMIx_Init, unless PMIX_NAMESPACE, PMIX_RANK and a
 * PMIX_SERVER_URI* variable are set. */
int c10d__pmix_exchange_master(int rank, char *addr, size_t addr_cap, int *port,
                               int64_t timeout_ms);

/* The fence's PMIX_TIMEOUT in whole seconds: timeout_ms rounded up and
 * clamped to [1, INT_MAX] (0 would mean no limit to PMIx). */
int c10d__pmix_timeout_s(int64_t timeout_ms);

#endif
