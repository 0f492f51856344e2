/* Host-aware collectives: the host map and each op's phases (hier.h).
 *
 * Why these three ops and this shape: all_reduce, broadcast and reduce move
 * the same buffer through every rank, so one leader per host can stand for
 * its host on the network and the other ranks of the host meet it in shared
 * memory (a reduce into the leader, a broadcast out of it). Fewer ranks on
 * the network means fewer, larger messages there: on a host with L ranks,
 * 1/L of the bytes a flat ring would put on its NIC, at the cost of the
 * leader's NIC carrying the host's share alone.
 *
 * all_gather and reduce_scatter too, where every host holds an equal,
 * contiguous range of ranks: a host's blocks are then one range of the
 * buffer, so the leaders run the group's own all_gather / reduce_scatter
 * with blocks of (ranks per host) x count, and a host's data crosses the
 * network once instead of once per rank of it (a flat ring sends every
 * block to every rank). Other placements (interleaved hosts, uneven hosts)
 * would need the blocks packed and unpacked around the leaders' step: they
 * stay flat, as do all_to_all, gather and scatter. */
#include "hier.h"

#include "backends/shm/path.h"
#include "engine/error.h"
#include "engine/kernels/reduce.h"

#include <stdlib.h>
#include <string.h>

static size_t id_len(const char *note)
{
    const char *comma = strchr(note, ',');
    return comma != NULL ? (size_t)(comma - note) : strlen(note);
}

static int same_host(const char *a, const char *b)
{
    size_t la = id_len(a);
    return la == id_len(b) && memcmp(a, b, la) == 0;
}

void c10d__tcp_hier_free(struct c10d__tcp_hier *h)
{
    free(h->host_of);
    free(h->host_first);
    free(h->local);
    c10d__shm_free(h->seg);
    memset(h, 0, sizeof *h);
}

int c10d__tcp_hier_plan(struct c10d__tcp_hier *h, int rank, int size, const char *const *notes)
{
    memset(h, 0, sizeof *h);
    if (size < 3)
        return 0; /* two hosts and a host with two ranks need three */
    for (int r = 0; r < size; r++)
        if (notes[r] == NULL || id_len(notes[r]) == 0)
            return 0; /* C10D_SHM=0 there, or no host id: flat */
    h->host_of = malloc((size_t)size * sizeof *h->host_of);
    h->host_first = malloc((size_t)size * sizeof *h->host_first);
    h->local = malloc((size_t)size * sizeof *h->local);
    if (h->host_of == NULL || h->host_first == NULL || h->local == NULL) {
        c10d__tcp_hier_free(h);
        return c10d__fail(C10D_ENOMEM, "tcp: out of memory");
    }
    for (int r = 0; r < size; r++) {
        int j = 0;
        while (j < h->nhosts && !same_host(notes[r], notes[h->host_first[j]]))
            j++;
        if (j == h->nhosts)
            h->host_first[h->nhosts++] = r;
        h->host_of[r] = j;
    }
    if (h->nhosts == 1 || h->nhosts == size) {
        c10d__tcp_hier_free(h);
        return 0;
    }
    for (int r = 0; r < size; r++)
        if (h->host_of[r] == h->host_of[rank]) {
            if (r == rank)
                h->local_idx = h->nlocal;
            h->local[h->nlocal++] = r;
        }
    /* Blocked: host j is ranks [j L, (j + 1) L) for one L. */
    int per_host = size / h->nhosts;
    h->blocked = size % h->nhosts == 0;
    for (int r = 0; r < size && h->blocked; r++)
        h->blocked = h->host_of[r] == r / per_host;
    return 1;
}

int c10d__tcp_hier_supports(const struct c10d__tcp_hier *h, const struct c10d__op *op)
{
    if (op->sends != NULL || op->recvs != NULL || op->send_counts != NULL ||
        op->recv_counts != NULL)
        return 0;
    /* reduce_scatter scatters from the leader: a chunk of the smallest slot
     * must hold an element of every local rank's block. */
    if (op->kind == C10D_OP_REDUCE_SCATTER &&
        (size_t)h->nlocal * c10d_dtype_size(op->dtype) > C10D_SHM_SLOT_MIN)
        return 0;
    if (op->kind == C10D_OP_ALL_GATHER || op->kind == C10D_OP_REDUCE_SCATTER)
        return h->blocked && op->count > 0;
    /* A small reduce is quicker flat: its two phases run one after the other,
     * where the binomial tree's two steps are all there is (bench/README.md,
     * "Across hosts"). Every rank draws the same answer from the same op. */
    if (op->kind == C10D_OP_REDUCE)
        return op->count * c10d_dtype_size(op->dtype) >= C10D_TCP_HIER_REDUCE_MIN;
    return op->kind == C10D_OP_ALL_REDUCE || op->kind == C10D_OP_BROADCAST;
}

static int local_index(const struct c10d__tcp_hier *h, int grank)
{
    for (int i = 0; i < h->nlocal; i++)
        if (h->local[i] == grank)
            return i;
    return -1;
}

static int leader_of(const struct c10d__tcp_hier *h, const struct c10d__op *op, int host)
{
    int rooted = op->kind == C10D_OP_REDUCE || op->kind == C10D_OP_BROADCAST;
    return rooted && h->host_of[op->root] == host ? op->root : h->host_first[host];
}

static int needs_reduce_buf(const struct c10d__tcp_hier *h, const struct c10d__op *op, int rank)
{
    return op->kind == C10D_OP_REDUCE && rank != op->root &&
           leader_of(h, op, h->host_of[rank]) == rank;
}

size_t c10d__tcp_hier_buf_bytes(const struct c10d__tcp_hier *h, const struct c10d__op *op, int rank)
{
    size_t esz = c10d_dtype_size(op->dtype);
    if (needs_reduce_buf(h, op, rank))
        return op->count * esz;
    /* The host's sum of every block, then the host's blocks reduced over
     * every host. */
    if (op->kind == C10D_OP_REDUCE_SCATTER && h->local[0] == rank)
        return (size_t)(h->nhosts + 1) * (size_t)h->nlocal * op->count * esz;
    return 0;
}

static void *reduce_target(const struct c10d__tcp_hier *h, const struct c10d__op *op, int rank,
                           void *buf)
{
    if (op->kind == C10D_OP_ALL_REDUCE)
        return op->recv;
    return rank == op->root ? op->recv : needs_reduce_buf(h, op, rank) ? buf : NULL;
}

int c10d__tcp_hier_prepare(const struct c10d__tcp_hier *h, const struct c10d__op *op, int rank,
                           void *buf)
{
    if (h->nlocal > 1 || (op->kind != C10D_OP_ALL_REDUCE && op->kind != C10D_OP_REDUCE))
        return 0;
    void *dst = reduce_target(h, op, rank, buf);
    if (dst == NULL)
        return 0;
    size_t bytes = op->count * c10d_dtype_size(op->dtype);
    if (dst != op->send && bytes > 0)
        memcpy(dst, op->send, bytes);
    return op->redop == C10D_PREMUL_SUM
               ? c10d__reduce_premul(dst, op->count, op->dtype, op->premul_factor)
               : 0;
}

static struct c10d__tcp_hier_phase *add(struct c10d__tcp_hier_phase *ph, int *n,
                                        const struct c10d__op *op, enum c10d__op_kind kind)
{
    struct c10d__tcp_hier_phase *p = &ph[(*n)++];
    memset(p, 0, sizeof *p);
    p->op = *op;
    p->op.kind = kind;
    p->op.next = NULL;
    return p;
}

static void on_shm(const struct c10d__tcp_hier *h, struct c10d__tcp_hier_phase *p, int leader)
{
    p->on_shm = 1;
    p->op.root = local_index(h, leader);
    p->rank = h->local_idx;
    p->size = h->nlocal;
    p->ranks = h->local;
}

static void on_leaders(const struct c10d__tcp_hier *h, struct c10d__tcp_hier_phase *p, int rank,
                       const int *leaders)
{
    p->rank = h->host_of[rank];
    p->size = h->nhosts;
    p->ranks = leaders;
    if (p->op.kind == C10D_OP_REDUCE || p->op.kind == C10D_OP_BROADCAST)
        p->op.root = h->host_of[p->op.root];
}

int c10d__tcp_hier_phases(const struct c10d__tcp_hier *h, const struct c10d__op *op, int rank,
                          int *leaders, void *buf, struct c10d__tcp_hier_phase *ph)
{
    for (int j = 0; j < h->nhosts; j++)
        leaders[j] = leader_of(h, op, j);
    int leader = leaders[h->host_of[rank]];
    int is_leader = leader == rank, alone = h->nlocal == 1, n = 0;
    /* Within a host the partial results are summed (AVG divides once, at the
     * end, by the group's size; PREMUL_SUM scales each rank's own input as
     * it enters, so the leaders add plain sums). */
    c10d_reduce_op local_op = op->redop == C10D_AVG ? C10D_SUM : op->redop;
    c10d_reduce_op leaders_op =
        op->redop == C10D_AVG || op->redop == C10D_PREMUL_SUM ? C10D_SUM : op->redop;
    struct c10d__tcp_hier_phase *p;
    void *target = reduce_target(h, op, rank, buf);
    switch (op->kind) {
    case C10D_OP_ALL_REDUCE:
    case C10D_OP_REDUCE:
        if (!alone) {
            p = add(ph, &n, op, C10D_OP_REDUCE);
            p->op.redop = local_op;
            p->op.recv = target;
            on_shm(h, p, leader);
        }
        if (is_leader) {
            p = add(ph, &n, op, op->kind);
            p->op.redop = leaders_op;
            p->op.send = target;
            p->op.recv = target;
            p->avg_after =
                op->redop == C10D_AVG && (op->kind == C10D_OP_ALL_REDUCE || rank == op->root);
            on_leaders(h, p, rank, leaders);
        }
        if (op->kind == C10D_OP_ALL_REDUCE && !alone) {
            p = add(ph, &n, op, C10D_OP_BROADCAST);
            p->op.send = op->recv;
            on_shm(h, p, leader);
        }
        break;
    case C10D_OP_BROADCAST:
        if (is_leader) {
            p = add(ph, &n, op, C10D_OP_BROADCAST);
            if (rank != op->root)
                p->op.send = op->recv;
            on_leaders(h, p, rank, leaders);
        }
        if (!alone) {
            p = add(ph, &n, op, C10D_OP_BROADCAST);
            p->op.send = op->recv; /* the root's leaders' step copied it there */
            on_shm(h, p, leader);
        }
        break;
    case C10D_OP_ALL_GATHER: {
        /* Gather the host's blocks into their place at the leader; the
         * leaders all_gather whole hosts; each leader broadcasts the result. */
        size_t esz = c10d_dtype_size(op->dtype), c = op->count;
        char *host_blocks = (char *)op->recv + (size_t)h->local[0] * c * esz;
        p = add(ph, &n, op, C10D_OP_GATHER);
        p->op.send = op->send != NULL ? op->send : (char *)op->recv + (size_t)rank * c * esz;
        p->op.recv = is_leader ? host_blocks : NULL;
        on_shm(h, p, leader);
        if (is_leader) {
            p = add(ph, &n, op, C10D_OP_ALL_GATHER);
            p->op.send = host_blocks;
            p->op.count = (size_t)h->nlocal * c;
            on_leaders(h, p, rank, leaders);
        }
        p = add(ph, &n, op, C10D_OP_BROADCAST);
        p->op.send = op->recv;
        p->op.count = (size_t)h->nlocal * (size_t)h->nhosts * c;
        on_shm(h, p, leader);
        break;
    }
    case C10D_OP_REDUCE_SCATTER: {
        /* Sum every block over the host into the leader's buf; the leaders
         * reduce_scatter whole hosts into the rest of it; each leader
         * scatters its host's blocks. */
        size_t esz = c10d_dtype_size(op->dtype), c = op->count;
        size_t all = (size_t)h->nlocal * (size_t)h->nhosts * c;
        char *host_sum = buf, *host_blocks = is_leader ? (char *)buf + all * esz : NULL;
        p = add(ph, &n, op, C10D_OP_REDUCE);
        p->op.redop = local_op;
        p->op.recv = is_leader ? host_sum : NULL;
        p->op.count = all;
        on_shm(h, p, leader);
        if (is_leader) {
            p = add(ph, &n, op, C10D_OP_REDUCE_SCATTER);
            p->op.redop = leaders_op;
            p->op.send = host_sum;
            p->op.recv = host_blocks;
            p->op.count = (size_t)h->nlocal * c;
            on_leaders(h, p, rank, leaders);
        }
        p = add(ph, &n, op, C10D_OP_SCATTER);
        p->op.send = host_blocks;
        p->avg_after = op->redop == C10D_AVG;
        on_shm(h, p, leader);
        break;
    }
    default:
        return c10d__fail(C10D_EINTERNAL, "tcp: op kind %d has no host-aware form", (int)op->kind);
    }
    return n;
}
