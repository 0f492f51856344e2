/* Host-aware collectives: a group whose ranks sit on several hosts, some
 * with more than one, runs all_reduce, broadcast, reduce, all_gather and
 * reduce_scatter in phases:
 * shared memory among the ranks of each host, tcp among one leader per host
 * (a large all_reduce or reduce: among the ranks of each slice; docs/shm.md,
 * "Across hosts"). Here: the host map drawn from every rank's
 * handshake note, and the phases one rank runs for one op. The backend runs
 * them (tcp_backend.c) and makes the per-host segment at creation.
 *
 * Loop thread. */
#ifndef C10D_BACKENDS_TCP_HIER_H
#define C10D_BACKENDS_TCP_HIER_H

#include "backends/backend.h"
#include "backends/shm/segment.h"

#include <stddef.h>

struct c10d__tcp_hier {
    int nhosts;
    int *host_of;    /* group rank -> host (hosts numbered by their lowest rank) */
    int *host_first; /* host -> its lowest group rank: the default leader */
    int *local;      /* this host's group ranks, ascending */
    int nlocal, local_idx;
    /* Every host holds the same number of ranks, in one contiguous range of
     * group ranks (launchers' block placement): a host's blocks of an
     * all_gather or reduce_scatter are one range, the same size everywhere,
     * and need no packing around the leaders' step. */
    int blocked;
    /* Any placement: host j's ranks in host-major order start at
     * host_off[j] (host_count[j] of them); rank r is number idx_in_host[r]
     * of its host. */
    int *host_count, *host_off, *idx_in_host;
    int max_local;             /* the most ranks on a host */
    struct c10d__shm_seg *seg; /* this host's; NULL while nlocal == 1 */
    /* Where every host holds the same number of ranks, more than one: host
     * j -> its rank of this rank's index there, the ranks that carry this
     * rank's slice of a large all_reduce or reduce between the hosts. NULL
     * elsewhere. */
    int *slice_peers;
};

/* One step of a host-aware op: an op on the host's segment, or an op among
 * the leaders, or a slice's ranks, over tcp (`ranks`: their group ranks,
 * one per host, `rank`: this rank's index among them). */
struct c10d__tcp_hier_phase {
    int on_shm;
    struct c10d__op op; /* what this step runs: the op's buffers, its root among the step's ranks */
    int rank, size;
    const int *ranks;
    int avg_after; /* AVG: divide the result by the group's size once this step is done */
    /* A local step once this one is done (packing blocks around the leaders'
     * step of all_gather / reduce_scatter): 0 or < 0. */
    int (*after)(const struct c10d__tcp_hier *h, const struct c10d__tcp_hier_phase *p);
    void *from, *to; /* after's buffers */
    size_t per_rank; /* after's: elements of one rank's block */
};

#define C10D_TCP_HIER_MAX_PHASES 5

/* From every rank's note (path.h's: "<host id>" or "<host id>,<segment>"):
 * 1 if the group spans hosts and some host has several ranks (the map is
 * set), 0 if not (every rank on one host, one rank per host, or a rank
 * without a host id: C10D_SHM=0 or C10D_SHM_HIER=0 there), C10D_ENOMEM.
 * Every rank draws the same answer from the same notes. */
int c10d__tcp_hier_plan(struct c10d__tcp_hier *h, int rank, int size, const char *const *notes);
void c10d__tcp_hier_free(struct c10d__tcp_hier *h);

/* A reduce runs in phases from this many bytes; below, flat. */
#define C10D_TCP_HIER_REDUCE_MIN (8 * 1024)

/* An all_reduce or reduce of this many bytes or more, where every host holds
 * the same number of ranks, runs by slices: every rank of a host carries its
 * slice between the hosts, not the host's leader alone (hier.c). */
#define C10D_TCP_HIER_SLICE_MIN (256 * 1024)

/* Whether `op` runs by slices (every rank draws the same answer). */
int c10d__tcp_hier_by_slices(const struct c10d__tcp_hier *h, const struct c10d__op *op);

/* Whether `op` runs in phases (its kind, form, size, and for all_gather and
 * reduce_scatter the placement). */
int c10d__tcp_hier_supports(const struct c10d__tcp_hier *h, const struct c10d__op *op);

/* The phases this rank runs for `op` into ph (C10D_TCP_HIER_MAX_PHASES at
 * most; 0: nothing left to do after `prepare`). leaders: room for nhosts
 * ints, filled with the op's leaders (the root's host is led by the root).
 * buf: the leader's scratch (buf_bytes; NULL where that is 0). Before the first phase, a leader
 * alone on its host must run `prepare` (copy and premultiply its input into
 * the buffer the leaders' step reads): c10d__tcp_hier_prepare. */
int c10d__tcp_hier_phases(const struct c10d__tcp_hier *h, const struct c10d__op *op, int rank,
                          int *leaders, void *buf, struct c10d__tcp_hier_phase *ph);
/* The scratch this rank needs for `op`: a reduce's partial result at a
 * leader that is not the root; a reduce_scatter's host sum and its host's
 * blocks at a leader. 0 if none. */
size_t c10d__tcp_hier_buf_bytes(const struct c10d__tcp_hier *h, const struct c10d__op *op,
                                int rank);
/* A leader alone on its host: its input, premultiplied for PREMUL_SUM, into
 * the buffer the leaders' step reduces in place. 0 or < 0. */
int c10d__tcp_hier_prepare(const struct c10d__tcp_hier *h, const struct c10d__op *op, int rank,
                           void *buf);

#endif
