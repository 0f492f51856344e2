/* Object collectives over byte strings (torch's all_gather_object,
 * gather_object, broadcast_object_list, scatter_object_list,
 * send/recv_object_list): each is a short sequence of ordinary ops of the
 * group, sizes first so that every rank may pass a different length, then
 * the payloads padded to the largest one. They block the caller, as torch's
 * do; every step is bounded by the op timeout.
 *
 * Sizes are int64, as torch's size tensors; a size a peer sends is checked
 * before anything is allocated from it. */
#include "pg.h"

#include "gpu/gpu_api.h"
#include "engine/error.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Far beyond any real object, and small enough that n * max cannot overflow. */
#define OBJECT_MAX ((int64_t)1 << 40)

void c10d_bytes_free(c10d_bytes *items, int n)
{
    if (items == NULL)
        return;
    for (int i = 0; i < n; i++) {
        free(items[i].data);
        items[i].data = NULL;
        items[i].len = 0;
    }
}

/* The caller's timeout only: a callback would run once per internal op. */
static c10d_op_opts step_opts(const c10d_op_opts *user)
{
    c10d_op_opts o = C10D_OP_OPTS_INIT;
    if (user != NULL && user->struct_size >= offsetof(c10d_op_opts, timeout_ms) + sizeof(int64_t))
        o.timeout_ms = user->timeout_ms;
    return o;
}

static int enter(c10d_pg *pg, const char *what)
{
    if (pg == NULL)
        return c10d__fail(C10D_EINVAL, "%s: pg is NULL", what);
    if (c10d_on_loop_thread())
        return c10d__fail(C10D_EDEADLK, "%s blocks: it cannot run inside a callback", what);
    return 0;
}

/* What a root whose own arguments were rejected announces instead of a
 * size, so that the other ranks fail at once instead of at the timeout. */
#define REFUSED ((int64_t)-1)

static int check_size(const char *what, int64_t size, int from)
{
    if (size == REFUSED)
        return c10d__fail(C10D_EINVAL, "%s: rank %d rejected its own arguments (see its error)",
                          what, from);
    if (size < 0 || size > OBJECT_MAX)
        return c10d__fail(C10D_EPROTO, "%s: rank %d announced an object of %lld bytes", what, from,
                          (long long)size);
    return 0;
}

/* One step, waited for. A group without a host backend (nccl alone, or
 * "cuda:tcp" alone) moves the bytes through memory of the group's device (the
 * one it is bound to, else the calling thread's current one), as torch's
 * object collectives move their tensors to the group's device; the caller's
 * thread gets its own device back. `send` and `recv` may be the same buffer
 * (in place). */
static int step(c10d_pg *pg, const c10d_op_opts *o, enum c10d__op_kind kind, const void *send,
                size_t send_bytes, void *recv, size_t recv_bytes, size_t count, c10d_dtype dt,
                int root)
{
    c10d_work *w = NULL;
    int on_device =
        pg->backends[C10D_DEVICE_CPU].vt == NULL && pg->backends[C10D_DEVICE_CUDA].vt != NULL;
    c10d_op_opts dopts = *o;
    const void *s = send;
    void *r = recv;
    const struct c10d__cudart_api *cu = NULL;
    void *dsend = NULL, *drecv = NULL;
    int prev = -1;
    if (on_device) {
        int dev = pg->device_index;
        C10D_CHECK(c10d__cuda_load(&cu));
        if (dev < 0)
            C10D__CUDA_CHECK(cu, cu->cudaGetDevice(&dev), "object collective: cudaGetDevice");
        prev = c10d__gpu_switch_device(cu, dev);
        dopts.device_type = C10D_DEVICE_CUDA;
        dopts.device_index = dev;
        dopts.stream = NULL;
        int rc = 0;
        if (send != NULL && cu->cudaMalloc(&dsend, send_bytes > 0 ? send_bytes : 1) != cudaSuccess)
            rc = c10d__fail(C10D_ENOMEM, "object collective: no device memory for %zu bytes",
                            send_bytes);
        if (rc == 0 && send != NULL && send_bytes > 0 &&
            cu->cudaMemcpy(dsend, send, send_bytes, cudaMemcpyHostToDevice) != cudaSuccess)
            rc = c10d__fail(C10D_EIO, "object collective: copying to the device failed");
        if (rc == 0 && recv != NULL && recv == send)
            drecv = dsend;
        else if (rc == 0 && recv != NULL &&
                 cu->cudaMalloc(&drecv, recv_bytes > 0 ? recv_bytes : 1) != cudaSuccess)
            rc = c10d__fail(C10D_ENOMEM, "object collective: no device memory for %zu bytes",
                            recv_bytes);
        if (rc != 0) {
            if (drecv != dsend)
                cu->cudaFree(drecv);
            cu->cudaFree(dsend);
            c10d__gpu_restore_device(cu, prev);
            return rc;
        }
        s = dsend;
        r = drecv;
    }
    int rc;
    switch (kind) {
    case C10D_OP_ALL_GATHER:
        rc = c10d_all_gather(pg, s, r, count, dt, &dopts, &w);
        break;
    case C10D_OP_GATHER:
        rc = c10d_gather(pg, s, r, count, dt, root, &dopts, &w);
        break;
    case C10D_OP_BROADCAST:
        rc = c10d_broadcast(pg, s, r, count, dt, root, &dopts, &w);
        break;
    case C10D_OP_SCATTER:
        rc = c10d_scatter(pg, s, r, count, dt, root, &dopts, &w);
        break;
    case C10D_OP_SEND:
        rc = c10d_send(pg, s, count, dt, root, 0, &dopts, &w);
        break;
    case C10D_OP_RECV:
        rc = c10d_recv(pg, r, count, dt, root, 0, &dopts, &w);
        break;
    default:
        rc = c10d__fail(C10D_EINTERNAL, "object collective: op kind %d", (int)kind);
    }
    if (rc == 0)
        rc = c10d_work_wait_release(w);
    if (on_device) {
        if (rc == 0 && recv != NULL && recv_bytes > 0 &&
            cu->cudaMemcpy(recv, drecv, recv_bytes, cudaMemcpyDeviceToHost) != cudaSuccess)
            rc = c10d__fail(C10D_EIO, "object collective: copying from the device failed");
        if (drecv != dsend)
            cu->cudaFree(drecv);
        cu->cudaFree(dsend);
        c10d__gpu_restore_device(cu, prev);
    }
    return rc;
}

/* dst->data = a malloc'd copy of len bytes (never NULL on success). */
static int copy_out(const char *what, c10d_bytes *dst, const void *src, size_t len)
{
    dst->data = malloc(len > 0 ? len : 1);
    if (dst->data == NULL)
        return c10d__fail(C10D_ENOMEM, "%s: out of memory (%zu bytes)", what, len);
    if (len > 0)
        memcpy(dst->data, src, len);
    dst->len = len;
    return 0;
}

/* Every rank's length, and the largest. */
static int gather_sizes(c10d_pg *pg, const char *what, size_t len, const c10d_op_opts *o,
                        int64_t *sizes, int64_t *max)
{
    int64_t mine = (int64_t)len;
    if (len > (size_t)OBJECT_MAX)
        return c10d__fail(C10D_EINVAL, "%s: an object of %zu bytes is too large", what, len);
    C10D_CHECK(step(pg, o, C10D_OP_ALL_GATHER, &mine, sizeof mine, sizes,
                    (size_t)c10d_pg_size(pg) * sizeof *sizes, 1, C10D_INT64, -1));
    *max = 0;
    for (int r = 0; r < c10d_pg_size(pg); r++) {
        C10D_CHECK(check_size(what, sizes[r], r));
        if (sizes[r] > *max)
            *max = sizes[r];
    }
    return 0;
}

static int gather_common(c10d_pg *pg, const char *what, const void *obj, size_t len,
                         c10d_bytes *out, int root, const c10d_op_opts *user)
{
    C10D_CHECK(enter(pg, what));
    if (!c10d_pg_is_member(pg))
        return 0; /* as torch: a non-member's call does nothing */
    int n = c10d_pg_size(pg), me = c10d_pg_rank(pg);
    int all = root < 0;
    if (!all && root >= n)
        return c10d__fail(C10D_EINVAL, "%s: root %d is out of range (size %d)", what, root, n);
    if ((all || me == root) && out == NULL)
        return c10d__fail(C10D_EINVAL, "%s: out is NULL", what);
    if (len > 0 && obj == NULL)
        return c10d__fail(C10D_EINVAL, "%s: obj is NULL with %zu bytes", what, len);
    c10d_op_opts o = step_opts(user);
    int64_t *sizes = calloc((size_t)n, sizeof *sizes);
    if (sizes == NULL)
        return c10d__fail(C10D_ENOMEM, "%s: out of memory", what);
    int64_t max = 0;
    int rc = gather_sizes(pg, what, len, &o, sizes, &max);
    char *pad = NULL, *buf = NULL;
    if (rc == 0 && max > 0) {
        pad = calloc(1, (size_t)max);
        buf = all || me == root ? malloc((size_t)max * (size_t)n) : NULL;
        if (pad == NULL || ((all || me == root) && buf == NULL))
            rc = c10d__fail(C10D_ENOMEM, "%s: out of memory (%d x %lld bytes)", what, n,
                            (long long)max);
    }
    if (rc == 0 && max > 0) {
        if (len > 0)
            memcpy(pad, obj, len);
        size_t got = buf != NULL ? (size_t)max * (size_t)n : 0;
        rc = step(pg, &o, all ? C10D_OP_ALL_GATHER : C10D_OP_GATHER, pad, (size_t)max, buf, got,
                  (size_t)max, C10D_UINT8, root);
    }
    for (int r = 0; rc == 0 && (all || me == root) && r < n; r++) {
        rc = copy_out(what, &out[r], buf + (size_t)r * (size_t)max, (size_t)sizes[r]);
        if (rc != 0)
            c10d_bytes_free(out, r); /* only those filled: the rest are the caller's */
    }
    free(buf);
    free(pad);
    free(sizes);
    return rc;
}

int c10d_all_gather_object(c10d_pg *pg, const void *obj, size_t len, c10d_bytes *out,
                           const c10d_op_opts *opts)
{
    return gather_common(pg, "c10d_all_gather_object", obj, len, out, -1, opts);
}

int c10d_gather_object(c10d_pg *pg, const void *obj, size_t len, c10d_bytes *out, int root,
                       const c10d_op_opts *opts)
{
    if (root < 0)
        return c10d__fail(C10D_EINVAL, "c10d_gather_object: root %d is out of range", root);
    return gather_common(pg, "c10d_gather_object", obj, len, out, root, opts);
}

/* Sizes of objs as int64 (sender side); checks each fits. */
static int sizes_of(const char *what, const c10d_bytes *objs, int n, int64_t *sizes, size_t *total)
{
    *total = 0;
    for (int i = 0; i < n; i++) {
        if (objs[i].len > (size_t)OBJECT_MAX || (objs[i].len > 0 && objs[i].data == NULL))
            return c10d__fail(C10D_EINVAL, "%s: object %d (%zu bytes) is invalid", what, i,
                              objs[i].len);
        sizes[i] = (int64_t)objs[i].len;
        *total += objs[i].len;
    }
    return 0;
}

/* Receiver side: the announced sizes, checked, and their sum. */
static int total_of(const char *what, const int64_t *sizes, int n, int from, size_t *total)
{
    *total = 0;
    for (int i = 0; i < n; i++) {
        C10D_CHECK(check_size(what, sizes[i], from));
        *total += (size_t)sizes[i];
    }
    return 0;
}

/* Splits a concatenation into objs (malloc'd copies). */
static int split_out(const char *what, c10d_bytes *objs, int n, const int64_t *sizes,
                     const char *cat)
{
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        int rc = copy_out(what, &objs[i], cat + off, (size_t)sizes[i]);
        if (rc != 0) {
            c10d_bytes_free(objs, i);
            return rc;
        }
        off += (size_t)sizes[i];
    }
    return 0;
}

static char *concat(const c10d_bytes *objs, int n, size_t total)
{
    char *cat = malloc(total > 0 ? total : 1);
    if (cat == NULL)
        return NULL;
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        if (objs[i].len > 0)
            memcpy(cat + off, objs[i].data, objs[i].len);
        off += objs[i].len;
    }
    return cat;
}

int c10d_broadcast_object_list(c10d_pg *pg, c10d_bytes *objs, int n, int root,
                               const c10d_op_opts *opts)
{
    static const char what[] = "c10d_broadcast_object_list";
    C10D_CHECK(enter(pg, what));
    if (!c10d_pg_is_member(pg))
        return 0;
    if (n <= 0 || objs == NULL)
        return c10d__fail(C10D_EINVAL, "%s: empty object list (%p, %d)", what, (void *)objs, n);
    if (root < 0 || root >= c10d_pg_size(pg))
        return c10d__fail(C10D_EINVAL, "%s: root %d is out of range (size %d)", what, root,
                          c10d_pg_size(pg));
    int me = c10d_pg_rank(pg);
    c10d_op_opts o = step_opts(opts);
    int64_t *sizes = calloc((size_t)n, sizeof *sizes);
    if (sizes == NULL)
        return c10d__fail(C10D_ENOMEM, "%s: out of memory", what);
    size_t total = 0;
    int rc = me == root ? sizes_of(what, objs, n, sizes, &total) : 0;
    if (rc != 0) {
        /* Tell the others, then fail with the reason. */
        char why[512];
        snprintf(why, sizeof why, "%s", c10d_last_error());
        sizes[0] = REFUSED;
        step(pg, &o, C10D_OP_BROADCAST, sizes, (size_t)n * sizeof *sizes, sizes,
             (size_t)n * sizeof *sizes, (size_t)n, C10D_INT64, root);
        free(sizes);
        return c10d__fail(rc, "%s", why);
    }
    rc = step(pg, &o, C10D_OP_BROADCAST, sizes, (size_t)n * sizeof *sizes, sizes,
              (size_t)n * sizeof *sizes, (size_t)n, C10D_INT64, root);
    if (rc == 0 && me != root)
        rc = total_of(what, sizes, n, root, &total);
    char *cat = NULL;
    if (rc == 0) {
        cat = me == root ? concat(objs, n, total) : malloc(total > 0 ? total : 1);
        if (cat == NULL)
            rc = c10d__fail(C10D_ENOMEM, "%s: out of memory (%zu bytes)", what, total);
    }
    if (rc == 0 && total > 0)
        rc = step(pg, &o, C10D_OP_BROADCAST, cat, total, cat, total, total, C10D_UINT8, root);
    if (rc == 0 && me != root)
        rc = split_out(what, objs, n, sizes, cat);
    free(cat);
    free(sizes);
    return rc;
}

int c10d_scatter_object_list(c10d_pg *pg, const c10d_bytes *in, c10d_bytes *out, int root,
                             const c10d_op_opts *opts)
{
    static const char what[] = "c10d_scatter_object_list";
    C10D_CHECK(enter(pg, what));
    if (!c10d_pg_is_member(pg))
        return 0;
    int n = c10d_pg_size(pg), me = c10d_pg_rank(pg);
    if (root < 0 || root >= n)
        return c10d__fail(C10D_EINVAL, "%s: root %d is out of range (size %d)", what, root, n);
    if (out == NULL || (me == root && in == NULL))
        return c10d__fail(C10D_EINVAL, "%s: %s is NULL", what, out == NULL ? "out" : "in");
    c10d_op_opts o = step_opts(opts);
    int64_t *sizes = calloc((size_t)n, sizeof *sizes);
    if (sizes == NULL)
        return c10d__fail(C10D_ENOMEM, "%s: out of memory", what);
    size_t total = 0;
    int64_t max = 0, mine = 0;
    int rc = me == root ? sizes_of(what, in, n, sizes, &total) : 0;
    for (int r = 0; r < n && me == root; r++)
        if (sizes[r] > max)
            max = sizes[r];
    if (rc != 0) {
        char why[512];
        snprintf(why, sizeof why, "%s", c10d_last_error());
        max = REFUSED;
        step(pg, &o, C10D_OP_BROADCAST, &max, sizeof max, &max, sizeof max, 1, C10D_INT64, root);
        free(sizes);
        return c10d__fail(rc, "%s", why);
    }
    /* The largest size first: every rank needs it to post its receive. */
    rc = step(pg, &o, C10D_OP_BROADCAST, &max, sizeof max, &max, sizeof max, 1, C10D_INT64, root);
    if (rc == 0)
        rc = check_size(what, max, root);
    char *padded = NULL, *mine_buf = NULL;
    if (rc == 0) {
        padded = me == root ? calloc((size_t)n, max > 0 ? (size_t)max : 1) : NULL;
        mine_buf = malloc(max > 0 ? (size_t)max : 1);
        if ((me == root && padded == NULL) || mine_buf == NULL)
            rc = c10d__fail(C10D_ENOMEM, "%s: out of memory", what);
    }
    if (rc == 0 && me == root)
        for (int r = 0; r < n; r++)
            if (in[r].len > 0)
                memcpy(padded + (size_t)r * (size_t)max, in[r].data, in[r].len);
    if (rc == 0 && max > 0)
        rc = step(pg, &o, C10D_OP_SCATTER, padded, padded != NULL ? (size_t)max * (size_t)n : 0,
                  mine_buf, (size_t)max, (size_t)max, C10D_UINT8, root);
    if (rc == 0)
        rc = step(pg, &o, C10D_OP_SCATTER, me == root ? sizes : NULL, (size_t)n * sizeof *sizes,
                  &mine, sizeof mine, 1, C10D_INT64, root);
    if (rc == 0 && (mine < 0 || mine > max))
        rc = c10d__fail(C10D_EPROTO, "%s: root %d sent a size of %lld (largest %lld)", what, root,
                        (long long)mine, (long long)max);
    if (rc == 0)
        rc = copy_out(what, out, mine_buf, (size_t)mine);
    free(mine_buf);
    free(padded);
    free(sizes);
    return rc;
}

int c10d_send_object_list(c10d_pg *pg, const c10d_bytes *objs, int n, int dst,
                          const c10d_op_opts *opts)
{
    static const char what[] = "c10d_send_object_list";
    C10D_CHECK(enter(pg, what));
    if (!c10d_pg_is_member(pg))
        return 0;
    if (n <= 0 || objs == NULL)
        return c10d__fail(C10D_EINVAL, "%s: empty object list (%p, %d)", what, (void *)objs, n);
    c10d_op_opts o = step_opts(opts);
    int64_t *sizes = calloc((size_t)n, sizeof *sizes);
    if (sizes == NULL)
        return c10d__fail(C10D_ENOMEM, "%s: out of memory", what);
    size_t total = 0;
    int rc = sizes_of(what, objs, n, sizes, &total);
    if (rc == 0)
        rc = step(pg, &o, C10D_OP_SEND, sizes, (size_t)n * sizeof *sizes, NULL, 0, (size_t)n,
                  C10D_INT64, dst);
    char *cat = NULL;
    if (rc == 0 && total > 0) {
        cat = concat(objs, n, total);
        rc = cat == NULL ? c10d__fail(C10D_ENOMEM, "%s: out of memory", what)
                         : step(pg, &o, C10D_OP_SEND, cat, total, NULL, 0, total, C10D_UINT8, dst);
    }
    free(cat);
    free(sizes);
    return rc;
}

int c10d_recv_object_list(c10d_pg *pg, c10d_bytes *objs, int n, int src, const c10d_op_opts *opts)
{
    static const char what[] = "c10d_recv_object_list";
    C10D_CHECK(enter(pg, what));
    if (!c10d_pg_is_member(pg))
        return 0;
    if (n <= 0 || objs == NULL)
        return c10d__fail(C10D_EINVAL, "%s: empty object list (%p, %d)", what, (void *)objs, n);
    if (src < 0)
        return c10d__fail(C10D_EINVAL, "%s: src %d: a source rank is needed", what, src);
    c10d_op_opts o = step_opts(opts);
    int64_t *sizes = calloc((size_t)n, sizeof *sizes);
    if (sizes == NULL)
        return c10d__fail(C10D_ENOMEM, "%s: out of memory", what);
    int rc = step(pg, &o, C10D_OP_RECV, NULL, 0, sizes, (size_t)n * sizeof *sizes, (size_t)n,
                  C10D_INT64, src);
    size_t total = 0;
    if (rc == 0)
        rc = total_of(what, sizes, n, src, &total);
    char *cat = NULL;
    if (rc == 0) {
        cat = malloc(total > 0 ? total : 1);
        if (cat == NULL)
            rc = c10d__fail(C10D_ENOMEM, "%s: out of memory (%zu bytes)", what, total);
    }
    if (rc == 0 && total > 0)
        rc = step(pg, &o, C10D_OP_RECV, NULL, 0, cat, total, total, C10D_UINT8, src);
    if (rc == 0)
        rc = split_out(what, objs, n, sizes, cat);
    free(cat);
    free(sizes);
    return rc;
}
