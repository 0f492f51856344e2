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
 * all_gather and reduce_scatter too: a host's data crosses the network
 * once, to each other leader,
 * instead of once per rank of it (a flat ring sends every block through
 * every rank). Where every host holds an equal, contiguous range of ranks,
 * a host's blocks are one range of the buffer and the leaders run the
 * group's own all_gather / reduce_scatter over whole hosts; elsewhere the
 * leader packs its host's blocks in host order and the leaders exchange
 * them with an all_to_all of lists. all_to_all, gather and scatter stay
 * flat.
 *
 * A large all_reduce, where every host holds L ranks, runs by slices
 * instead of through one leader: a reduce_scatter within the host leaves
 * rank i of each host with slice i of its host's sum; the ranks i of all
 * hosts all_reduce that slice over tcp, L such groups at once; an
 * all_gather within the host puts the slices together. The same bytes
 * cross between the hosts, but in L streams from L ranks (their NICs where
 * ranks are bound to different ones), and the leader's work (reducing,
 * copying, the tcp stack) is split L ways. A count that L does not divide
 * leaves a remainder of under L elements: the last rank of each host sums
 * it within the host and carries it with its slice, which it adjoins. A
 * large reduce runs the same way into the root's host, whose ranks then
 * gather the slices into the root. A broadcast by slices was measured
 * slower (its leader has no reduction to split): it keeps one leader. */
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
    free(h->host_count);
    free(h->host_off);
    free(h->idx_in_host);
    free(h->slice_peers);
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
    h->host_count = calloc((size_t)h->nhosts, sizeof *h->host_count);
    h->host_off = calloc((size_t)h->nhosts, sizeof *h->host_off);
    h->idx_in_host = malloc((size_t)size * sizeof *h->idx_in_host);
    if (h->host_count == NULL || h->host_off == NULL || h->idx_in_host == NULL) {
        c10d__tcp_hier_free(h);
        return c10d__fail(C10D_ENOMEM, "tcp: out of memory");
    }
    for (int r = 0; r < size; r++)
        h->idx_in_host[r] = h->host_count[h->host_of[r]]++;
    h->max_local = h->host_count[0];
    for (int j = 0; j < h->nhosts; j++) {
        h->host_off[j] = j == 0 ? 0 : h->host_off[j - 1] + h->host_count[j - 1];
        h->max_local = h->host_count[j] > h->max_local ? h->host_count[j] : h->max_local;
    }
    int uniform = 1;
    for (int j = 0; j < h->nhosts; j++)
        uniform = uniform && h->host_count[j] == h->nlocal;
    if (uniform && h->nlocal > 1) {
        h->slice_peers = malloc((size_t)h->nhosts * sizeof *h->slice_peers);
        if (h->slice_peers == NULL) {
            c10d__tcp_hier_free(h);
            return c10d__fail(C10D_ENOMEM, "tcp: out of memory");
        }
        for (int r = 0; r < size; r++)
            if (h->idx_in_host[r] == h->local_idx)
                h->slice_peers[h->host_of[r]] = r;
    }
    return 1;
}

int c10d__tcp_hier_by_slices(const struct c10d__tcp_hier *h, const struct c10d__op *op)
{
    /* The reduce_scatter within the host: a chunk of the smallest slot
     * holds an element of every local rank's block. */
    size_t esz = c10d_dtype_size(op->dtype);
    return h->slice_peers != NULL &&
           (op->kind == C10D_OP_ALL_REDUCE || op->kind == C10D_OP_REDUCE) &&
           op->count >= (size_t)h->nlocal && op->count * esz >= C10D_TCP_HIER_SLICE_MIN &&
           (size_t)h->nlocal * esz <= C10D_SHM_SLOT_MIN;
}

int c10d__tcp_hier_supports(const struct c10d__tcp_hier *h, const struct c10d__op *op)
{
    if (op->sends != NULL || op->recvs != NULL || op->send_counts != NULL ||
        op->recv_counts != NULL)
        return 0;
    /* reduce_scatter scatters from the leader: a chunk of the smallest slot
     * must hold an element of every local rank's block. */
    if (op->kind == C10D_OP_REDUCE_SCATTER &&
        (size_t)h->max_local * c10d_dtype_size(op->dtype) > C10D_SHM_SLOT_MIN)
        return 0;
    if (op->kind == C10D_OP_ALL_GATHER || op->kind == C10D_OP_REDUCE_SCATTER)
        return op->count > 0;
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

/* ---------------------------------------- any placement: the packing */

/* Where hosts are interleaved or of different sizes, a host's blocks are not
 * one range of the buffer: the leader gathers them in host order, the
 * leaders exchange whole hosts with an all_to_all of lists, and the leader
 * unpacks (all_gather); or packs its host's sum in host order before the
 * exchange and reduces the hosts' partial sums of its own blocks after it
 * (reduce_scatter). The leader's scratch holds the exchange's lists, then
 * the data. */
struct gen_bufs {
    const void **sends;
    void **recvs;
    size_t *scounts, *rcounts;
    char *a, *b, *c;
};

static int group_size(const struct c10d__tcp_hier *h)
{
    return h->host_off[h->nhosts - 1] + h->host_count[h->nhosts - 1];
}

static size_t gen_lists_bytes(const struct c10d__tcp_hier *h)
{
    return (size_t)h->nhosts * (2 * sizeof(void *) + 2 * sizeof(size_t));
}

/* Sizes up to a few times an op's buffer: SIZE_MAX where they would not fit
 * size_t, which malloc refuses (the op then fails with C10D_ENOMEM). */
static size_t fits(unsigned __int128 bytes)
{
    return bytes > SIZE_MAX ? SIZE_MAX : (size_t)bytes;
}

static size_t gen_bytes(const struct c10d__tcp_hier *h, const struct c10d__op *op)
{
    unsigned __int128 esz = c10d_dtype_size(op->dtype), c = op->count;
    unsigned __int128 n = (unsigned)group_size(h) * c, local = (unsigned)h->nlocal * c;
    if (op->kind == C10D_OP_ALL_GATHER) /* a: the host's blocks; b: every host's */
        return fits(gen_lists_bytes(h) + (local + n) * esz);
    /* a: the host's sum, rank order; b: the same, host order; c: the hosts'
     * partial sums of this host's blocks */
    return fits(gen_lists_bytes(h) + (2 * n + (unsigned)h->nhosts * local) * esz);
}

static void gen_layout(const struct c10d__tcp_hier *h, const struct c10d__op *op, void *buf,
                       struct gen_bufs *g)
{
    size_t esz = c10d_dtype_size(op->dtype), c = op->count, n = (size_t)group_size(h) * c;
    size_t nh = (size_t)h->nhosts;
    g->sends = buf;
    g->recvs = (void **)(g->sends + nh);
    g->scounts = (size_t *)(g->recvs + nh);
    g->rcounts = g->scounts + nh;
    g->a = (char *)buf + gen_lists_bytes(h);
    g->b = g->a + (op->kind == C10D_OP_ALL_GATHER ? (size_t)h->nlocal * c : n) * esz;
    g->c = g->b + n * esz;
}

/* Where rank r's block sits when blocks are in host order. */
static size_t host_major(const struct c10d__tcp_hier *h, int r)
{
    return (size_t)(h->host_off[h->host_of[r]] + h->idx_in_host[r]);
}

/* all_gather: every host's blocks (host order) into the output (rank order). */
static int unpack_blocks(const struct c10d__tcp_hier *h, const struct c10d__tcp_hier_phase *p)
{
    size_t bytes = p->per_rank * c10d_dtype_size(p->op.dtype);
    for (int r = 0; r < group_size(h); r++)
        memcpy((char *)p->to + (size_t)r * bytes, (const char *)p->from + host_major(h, r) * bytes,
               bytes);
    return 0;
}

/* reduce_scatter: the host's sum (rank order) into host order. */
static int pack_blocks(const struct c10d__tcp_hier *h, const struct c10d__tcp_hier_phase *p)
{
    size_t bytes = p->per_rank * c10d_dtype_size(p->op.dtype);
    for (int r = 0; r < group_size(h); r++)
        memcpy((char *)p->to + host_major(h, r) * bytes, (const char *)p->from + (size_t)r * bytes,
               bytes);
    return 0;
}

/* reduce_scatter: the hosts' partial sums of this host's blocks, in host
 * order, into the first; a leader alone on its host then has its result
 * (into p->op.recv). */
static int reduce_partials(const struct c10d__tcp_hier *h, const struct c10d__tcp_hier_phase *p)
{
    size_t n = (size_t)h->nlocal * p->per_rank, bytes = n * c10d_dtype_size(p->op.dtype);
    for (int k = 1; k < h->nhosts; k++)
        C10D_CHECK(c10d__reduce(p->to, (const char *)p->from + (size_t)k * bytes, n, p->op.dtype,
                                p->op.redop));
    if (p->op.recv != NULL && bytes > 0)
        memcpy(p->op.recv, p->to, bytes);
    return 0;
}

static int needs_reduce_buf(const struct c10d__tcp_hier *h, const struct c10d__op *op, int rank)
{
    return op->kind == C10D_OP_REDUCE && rank != op->root &&
           leader_of(h, op, h->host_of[rank]) == rank;
}

size_t c10d__tcp_hier_buf_bytes(const struct c10d__tcp_hier *h, const struct c10d__op *op, int rank)
{
    size_t esz = c10d_dtype_size(op->dtype);
    if (op->kind == C10D_OP_REDUCE && c10d__tcp_hier_by_slices(h, op)) /* a slice and the rest */
        return rank == op->root ? 0 : (op->count / (size_t)h->nlocal + (size_t)h->nlocal) * esz;
    if (needs_reduce_buf(h, op, rank))
        return op->count * esz;
    if (h->local[0] != rank) /* only leaders keep anything */
        return 0;
    if (!h->blocked && (op->kind == C10D_OP_ALL_GATHER || op->kind == C10D_OP_REDUCE_SCATTER))
        return gen_bytes(h, op);
    /* The host's sum of every block, then the host's blocks reduced over
     * every host. */
    if (op->kind == C10D_OP_REDUCE_SCATTER)
        return fits((unsigned __int128)(unsigned)(h->nhosts + 1) * (unsigned)h->nlocal * op->count *
                    esz);
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
    if (h->nlocal == 1 && op->kind == C10D_OP_REDUCE_SCATTER) {
        /* No host to sum over: its own input, in host order and scaled. */
        struct gen_bufs g;
        gen_layout(h, op, buf, &g);
        struct c10d__tcp_hier_phase p = {.op = *op, .from = (void *)op->send, .to = g.b};
        p.per_rank = op->count;
        pack_blocks(h, &p);
        return op->redop == C10D_PREMUL_SUM
                   ? c10d__reduce_premul(g.b, (size_t)group_size(h) * op->count, op->dtype,
                                         op->premul_factor)
                   : 0;
    }
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

/* The leaders' exchange of whole hosts: an all_to_all of g's lists. */
static struct c10d__tcp_hier_phase *add_exchange(const struct c10d__tcp_hier *h,
                                                 const struct c10d__op *op, int rank,
                                                 const int *leaders, const struct gen_bufs *g,
                                                 struct c10d__tcp_hier_phase *ph, int *n)
{
    struct c10d__tcp_hier_phase *p = add(ph, n, op, C10D_OP_ALL_TO_ALL);
    p->op.send = p->op.recv = NULL;
    p->op.sends = g->sends;
    p->op.recvs = g->recvs;
    p->op.send_counts = g->scounts;
    p->op.recv_counts = g->rcounts;
    on_leaders(h, p, rank, leaders);
    return p;
}

/* all_gather, any placement: gather the host's blocks at the leader (host
 * order); the leaders exchange whole hosts; the leader unpacks them into the
 * output and broadcasts it. */
static int gen_all_gather(const struct c10d__tcp_hier *h, const struct c10d__op *op, int rank,
                          const int *leaders, void *buf, struct c10d__tcp_hier_phase *ph)
{
    size_t esz = c10d_dtype_size(op->dtype), c = op->count;
    int is_leader = leaders[h->host_of[rank]] == rank, n = 0, alone = h->nlocal == 1;
    struct gen_bufs g = {0};
    if (is_leader)
        gen_layout(h, op, buf, &g);
    const char *mine = op->send != NULL ? op->send : (char *)op->recv + (size_t)rank * c * esz;
    struct c10d__tcp_hier_phase *p;
    if (!alone) {
        p = add(ph, &n, op, C10D_OP_GATHER);
        p->op.send = mine;
        p->op.recv = is_leader ? g.a : NULL;
        on_shm(h, p, leaders[h->host_of[rank]]);
    }
    if (is_leader) {
        for (int k = 0; k < h->nhosts; k++) {
            g.sends[k] = alone ? mine : g.a;
            g.scounts[k] = (size_t)h->nlocal * c;
            g.recvs[k] = g.b + (size_t)h->host_off[k] * c * esz;
            g.rcounts[k] = (size_t)h->host_count[k] * c;
        }
        p = add_exchange(h, op, rank, leaders, &g, ph, &n);
        p->after = unpack_blocks;
        p->from = g.b;
        p->to = op->recv;
        p->per_rank = c;
    }
    if (!alone) {
        p = add(ph, &n, op, C10D_OP_BROADCAST);
        p->op.send = op->recv;
        p->op.count = (size_t)group_size(h) * c;
        on_shm(h, p, leaders[h->host_of[rank]]);
    }
    return n;
}

/* reduce_scatter, any placement: the host's sum at the leader, packed in
 * host order; the leaders send each host its blocks; the leader reduces the
 * hosts' partial sums of its own and scatters them. */
static int gen_reduce_scatter(const struct c10d__tcp_hier *h, const struct c10d__op *op, int rank,
                              const int *leaders, void *buf, c10d_reduce_op local_op,
                              c10d_reduce_op leaders_op, struct c10d__tcp_hier_phase *ph)
{
    size_t esz = c10d_dtype_size(op->dtype), c = op->count;
    int is_leader = leaders[h->host_of[rank]] == rank, n = 0, alone = h->nlocal == 1;
    struct gen_bufs g = {0};
    if (is_leader)
        gen_layout(h, op, buf, &g);
    struct c10d__tcp_hier_phase *p;
    if (!alone) { /* alone, c10d__tcp_hier_prepare packed its input */
        p = add(ph, &n, op, C10D_OP_REDUCE);
        p->op.redop = local_op;
        p->op.recv = is_leader ? g.a : NULL;
        p->op.count = (size_t)group_size(h) * c;
        on_shm(h, p, leaders[h->host_of[rank]]);
        if (is_leader) {
            p->after = pack_blocks;
            p->from = g.a;
            p->to = g.b;
            p->per_rank = c;
        }
    }
    if (is_leader) {
        for (int k = 0; k < h->nhosts; k++) {
            g.sends[k] = g.b + (size_t)h->host_off[k] * c * esz;
            g.scounts[k] = (size_t)h->host_count[k] * c;
            g.recvs[k] = g.c + (size_t)k * h->nlocal * c * esz;
            g.rcounts[k] = (size_t)h->nlocal * c;
        }
        p = add_exchange(h, op, rank, leaders, &g, ph, &n);
        p->op.redop = leaders_op;
        p->after = reduce_partials;
        p->from = p->to = g.c;
        p->per_rank = c;
        if (alone) { /* the result is this rank's: straight into its output */
            p->op.recv = op->recv;
            p->op.count = c;
            p->avg_after = op->redop == C10D_AVG;
            return n;
        }
    }
    p = add(ph, &n, op, C10D_OP_SCATTER);
    p->op.send = is_leader ? g.c : NULL;
    p->avg_after = op->redop == C10D_AVG;
    on_shm(h, p, leaders[h->host_of[rank]]);
    return n;
}

/* The first steps of an op by slices: slice i of the host's sum (b =
 * count / L elements) into rank i's `slice`, and the remainder's host sum
 * right after the last rank's. Returns the phases added. */
static int add_host_sums(const struct c10d__tcp_hier *h, const struct c10d__op *op, int rank,
                         char *slice, c10d_reduce_op local_op, struct c10d__tcp_hier_phase *ph)
{
    size_t esz = c10d_dtype_size(op->dtype), L = (size_t)h->nlocal, b = op->count / L;
    size_t whole = b * L, rest = op->count - whole;
    int last = h->local[h->nlocal - 1], n = 0;
    struct c10d__tcp_hier_phase *p = add(ph, &n, op, C10D_OP_REDUCE_SCATTER);
    p->op.redop = local_op;
    p->op.recv = slice;
    p->op.count = b;
    on_shm(h, p, h->local[0]);
    if (rest > 0) {
        p = add(ph, &n, op, C10D_OP_REDUCE);
        p->op.redop = local_op;
        p->op.send = (const char *)op->send + whole * esz;
        p->op.recv = rank == last ? slice + b * esz : NULL;
        p->op.count = rest;
        on_shm(h, p, last);
    }
    return n;
}

/* all_reduce by slices (the top of this file): rank i of a host takes
 * slice i of b = count / L elements; the last one also the remainder. */
static int slice_all_reduce(const struct c10d__tcp_hier *h, const struct c10d__op *op, int rank,
                            c10d_reduce_op local_op, c10d_reduce_op leaders_op,
                            struct c10d__tcp_hier_phase *ph)
{
    size_t esz = c10d_dtype_size(op->dtype), L = (size_t)h->nlocal, b = op->count / L;
    size_t whole = b * L, rest = op->count - whole;
    int last = h->local[h->nlocal - 1], is_last = rank == last;
    char *slice = (char *)op->recv + (size_t)h->local_idx * b * esz;
    char *tail = (char *)op->recv + whole * esz;
    int n = add_host_sums(h, op, rank, slice, local_op, ph);
    struct c10d__tcp_hier_phase *p = add(ph, &n, op, C10D_OP_ALL_REDUCE);
    p->op.redop = leaders_op;
    p->op.send = p->op.recv = slice;
    p->op.count = is_last ? b + rest : b;
    p->avg_after = op->redop == C10D_AVG;
    p->rank = h->host_of[rank];
    p->size = h->nhosts;
    p->ranks = h->slice_peers;
    p = add(ph, &n, op, C10D_OP_ALL_GATHER);
    p->op.send = slice;
    p->op.count = b;
    on_shm(h, p, h->local[0]);
    if (rest > 0) {
        p = add(ph, &n, op, C10D_OP_BROADCAST);
        p->op.send = p->op.recv = tail;
        p->op.count = rest;
        on_shm(h, p, last);
    }
    return n;
}

/* reduce by slices: as all_reduce's first steps, with the slices reduced
 * over tcp into the root's host only, whose ranks then gather them into
 * the root. A rank other than the root keeps its slice (and the
 * remainder, if the host's last) in buf. */
static int slice_reduce(const struct c10d__tcp_hier *h, const struct c10d__op *op, int rank,
                        void *buf, c10d_reduce_op local_op, c10d_reduce_op leaders_op,
                        struct c10d__tcp_hier_phase *ph)
{
    size_t esz = c10d_dtype_size(op->dtype), L = (size_t)h->nlocal, b = op->count / L;
    size_t whole = b * L, rest = op->count - whole;
    int last = h->local[h->nlocal - 1], is_root = rank == op->root;
    int root_host = h->host_of[op->root], at_root = h->host_of[rank] == root_host;
    char *slice = is_root ? (char *)op->recv + (size_t)h->local_idx * b * esz : buf;
    int n = add_host_sums(h, op, rank, slice, local_op, ph);
    struct c10d__tcp_hier_phase *p = add(ph, &n, op, C10D_OP_REDUCE);
    p->op.redop = leaders_op;
    p->op.send = p->op.recv = slice;
    p->op.count = rank == last ? b + rest : b;
    p->op.root = root_host;
    p->avg_after = op->redop == C10D_AVG && at_root;
    p->rank = h->host_of[rank];
    p->size = h->nhosts;
    p->ranks = h->slice_peers;
    if (!at_root)
        return n;
    p = add(ph, &n, op, C10D_OP_GATHER);
    p->op.send = slice;
    p->op.recv = is_root ? op->recv : NULL;
    p->op.count = b;
    on_shm(h, p, op->root);
    if (rest > 0) { /* the last rank's remainder into the root's output */
        p = add(ph, &n, op, C10D_OP_BROADCAST);
        p->op.send = rank == last ? slice + b * esz : NULL;
        p->op.recv = is_root ? (char *)op->recv + whole * esz : NULL;
        p->op.count = rest;
        on_shm(h, p, last);
    }
    return n;
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
        if (c10d__tcp_hier_by_slices(h, op))
            return op->kind == C10D_OP_REDUCE
                       ? slice_reduce(h, op, rank, buf, local_op, leaders_op, ph)
                       : slice_all_reduce(h, op, rank, local_op, leaders_op, ph);
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
        if (!h->blocked)
            return gen_all_gather(h, op, rank, leaders, buf, ph);
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
        if (!h->blocked)
            return gen_reduce_scatter(h, op, rank, leaders, buf, local_op, leaders_op, ph);
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
