/* Ops that travel as one: a batch of point-to-point ops
 * (c10d_batch_isend_irecv, one work, one P2P number) and coalesced
 * collectives (c10d_coalesce_begin / _end). Both end in pg_ops.c's
 * submission path. */
#include "pg.h"

#include "engine/error.h"
#include "engine/work.h"

#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------- batches and coalescing */

/* "<opname> (op <i>, send|recv)", what the checks call a member, made by
 * hand: snprintf per member was a quarter of a small batch's instructions.
 * `buf` holds 64 bytes; opname is a literal well short of that. */
static void member_name(char *buf, const char *opname, int i, int send)
{
    char digits[12];
    int nd = 0;
    unsigned v = (unsigned)i;
    do
        digits[nd++] = (char)('0' + v % 10);
    while ((v /= 10) != 0);
    size_t at = strlen(opname);
    memcpy(buf, opname, at);
    memcpy(buf + at, " (op ", 5);
    at += 5;
    while (nd > 0)
        buf[at++] = digits[--nd];
    memcpy(buf + at, send ? ", send)" : ", recv)", 8);
}

int c10d_batch_isend_irecv(c10d_pg *pg, const c10d_p2p_op *ops, int nops,
                           const c10d_op_opts *user_opts, c10d_work **work)
{
    const char *opname = "batch_isend_irecv";
    if (work != NULL)
        *work = NULL;
    if (pg == NULL)
        return c10d__fail(C10D_EINVAL, "c10d %s: pg is NULL", opname);
    c10d_op_opts opts_copy;
    C10D_CHECK(c10d__pg_read_op_opts(pg, opname, user_opts, &opts_copy));
    const c10d_op_opts *opts = &opts_copy;
    if (pg->rank < 0)
        return c10d__pg_noop(pg, opname, opts, work);
    if (ops == NULL || nops <= 0)
        return c10d__fail(C10D_EINVAL, "%s %s: empty list of ops (%s, nops %d)", pg->backend_name,
                          opname, ops == NULL ? "ops is NULL" : "ops given", nops);
    int dev = c10d__pg_device(pg, opname, opts);
    if (dev < 0)
        return dev;
    const struct c10d__backend_vtable *vt = pg->backends[dev].vt;
    struct c10d__pg_op *head = NULL, *tail = NULL;
    for (int i = 0; i < nops; i++) {
        char name[64];
        const c10d_p2p_op *p = &ops[i];
        if (p->kind != C10D_P2P_SEND && p->kind != C10D_P2P_RECV) {
            c10d__pg_op_free(head);
            return c10d__fail(C10D_EINVAL, "%s %s: op %d has an invalid kind %d", pg->backend_name,
                              opname, i, (int)p->kind);
        }
        member_name(name, opname, i, p->kind == C10D_P2P_SEND);
        struct c10d__op op = c10d__pg_op_init(
            p->kind == C10D_P2P_SEND ? C10D_OP_SEND : C10D_OP_RECV, p->count, p->dtype);
        op.send = p->buf;
        op.recv = p->buf;
        op.peer = p->peer;
        op.tag = p->tag;
        if (opts != NULL) {
            op.device_type = opts->device_type;
            op.device_index = opts->device_index;
            op.stream = opts->stream;
        }
        int rc = 0;
        if (op.kind == C10D_OP_RECV && op.peer == C10D_ANY_SOURCE)
            rc = c10d__fail(C10D_EINVAL, "%s %s: a batched recv needs a peer (not any source)",
                            pg->backend_name, name);
        if (rc == 0)
            rc = c10d__pg_check_op(pg, name, &op, 1); /* a batch member: self is a peer */
        size_t per;
        if (rc == 0)
            rc = c10d__pg_complex_as_reals(pg, name, &op, &per);
        if (rc == 0 && vt->check != NULL)
            rc = vt->check(&op);
        struct c10d__pg_op *po = rc == 0 ? c10d__pg_op_new(pg, dev, 0) : NULL;
        if (po == NULL) {
            c10d__pg_op_free(head);
            return rc != 0 ? rc : C10D_ENOMEM;
        }
        po->op = op;
        if (tail != NULL)
            tail->next_in_list = po;
        else
            head = po;
        tail = po;
    }
    uv_mutex_lock(&pg->mutex);
    int rc = c10d__pg_usable_locked(pg, opname);
    if (rc == 0 && pg->coalescing)
        rc = c10d__fail(C10D_EINVAL, "%s %s: not allowed between coalesce_begin and coalesce_end",
                        pg->backend_name, opname);
    if (rc == 0) {
        uint64_t seq = ++pg->p2p_seq;
        size_t n = 0;
        for (struct c10d__pg_op *po = head; po != NULL; po = po->next_in_list)
            n += po->op.count;
        int handed;
        rc = c10d__pg_post_locked(pg, head, "BATCH_P2P", seq, n, n, opts, work, &handed);
        if (rc != 0)
            pg->p2p_seq--;
        if (rc != 0 && !handed) {
            uv_mutex_unlock(&pg->mutex);
            c10d__pg_op_free(head);
            return rc;
        }
        uv_mutex_unlock(&pg->mutex);
        return rc;
    }
    uv_mutex_unlock(&pg->mutex);
    c10d__pg_op_free(head);
    return rc;
}

int c10d_coalesce_begin(c10d_pg *pg)
{
    if (pg == NULL)
        return c10d__fail(C10D_EINVAL, "c10d coalesce_begin: pg is NULL");
    if (pg->rank < 0)
        return 0;
    uv_mutex_lock(&pg->mutex);
    int rc = c10d__pg_usable_locked(pg, "coalesce_begin");
    if (rc == 0 && pg->coalescing)
        rc = c10d__fail(C10D_EINVAL, "%s coalesce_begin: already coalescing (nested begin)",
                        pg->backend_name);
    if (rc == 0)
        pg->coalescing = 1;
    uv_mutex_unlock(&pg->mutex);
    return rc;
}

int c10d_coalesce_end(c10d_pg *pg, const c10d_op_opts *user_opts, c10d_work **work)
{
    const char *opname = "coalesce_end";
    if (work != NULL)
        *work = NULL;
    if (pg == NULL)
        return c10d__fail(C10D_EINVAL, "c10d %s: pg is NULL", opname);
    c10d_op_opts opts_copy;
    C10D_CHECK(c10d__pg_read_op_opts(pg, opname, user_opts, &opts_copy));
    const c10d_op_opts *opts = &opts_copy;
    if (pg->rank < 0)
        return c10d__pg_noop(pg, opname, opts, work);
    uv_mutex_lock(&pg->mutex);
    if (!pg->coalescing) {
        uv_mutex_unlock(&pg->mutex);
        return c10d__fail(C10D_EINVAL, "%s %s: no c10d_coalesce_begin before it", pg->backend_name,
                          opname);
    }
    struct c10d__pg_op *head = pg->coal_head;
    pg->coalescing = 0;
    pg->coal_head = pg->coal_tail = NULL;
    pg->coal_n = 0;
    int rc = c10d__pg_usable_locked(pg, opname);
    if (rc != 0 || head == NULL) {
        uv_mutex_unlock(&pg->mutex);
        c10d__pg_op_free(head);
        if (rc != 0)
            return rc;
        /* Nothing was issued: complete at once, consuming no number. */
        c10d_work *w;
        C10D_CHECK(c10d__work_create(&w, "empty coalesced group", 0));
        c10d__work_complete(w, 0, NULL);
        if (opts != NULL && opts->cb != NULL &&
            (rc = c10d_work_on_complete(w, opts->cb, opts->cb_arg)) != 0) {
            c10d_work_release(w);
            return rc;
        }
        if (work != NULL)
            *work = w;
        else
            c10d_work_release(w);
        return 0;
    }
    uint64_t seq = ++pg->coll_seq;
    size_t tin = 0, tout = 0;
    for (struct c10d__pg_op *po = head; po != NULL; po = po->next_in_list) {
        size_t in, out;
        c10d__op_numel(&po->op, pg->size, &in, &out);
        tin += in, tout += out;
    }
    int handed;
    rc = c10d__pg_post_locked(pg, head, "COALESCED", seq, tin, tout, opts, work, &handed);
    if (rc != 0)
        pg->coll_seq--;
    if (rc != 0 && !handed) {
        uv_mutex_unlock(&pg->mutex);
        c10d__pg_op_free(head);
        return rc;
    }
    uv_mutex_unlock(&pg->mutex);
    return rc;
}
