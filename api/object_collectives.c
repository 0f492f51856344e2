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

/* Takes the work's address, not its value: the call that fills it is the
 * other argument, and argument order is unspecified. */
static int finish(int rc, c10d_work **w)
{
    return rc != 0 ? rc : c10d_work_wait_release(*w);
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
    c10d_work *w = NULL;
    C10D_CHECK(finish(c10d_all_gather(pg, &mine, sizes, 1, C10D_INT64, o, &w), &w));
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
        c10d_work *w = NULL;
        rc = all ? c10d_all_gather(pg, pad, buf, (size_t)max, C10D_UINT8, &o, &w)
                 : c10d_gather(pg, pad, buf, (size_t)max, C10D_UINT8, root, &o, &w);
        rc = finish(rc, &w);
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
    c10d_work *w = NULL;
    if (rc != 0) {
        /* Tell the others, then fail with the reason. */
        char why[512];
        snprintf(why, sizeof why, "%s", c10d_last_error());
        sizes[0] = REFUSED;
        if (c10d_broadcast(pg, sizes, sizes, (size_t)n, C10D_INT64, root, &o, &w) == 0)
            c10d_work_wait_release(w);
        free(sizes);
        return c10d__fail(rc, "%s", why);
    }
    rc = finish(c10d_broadcast(pg, sizes, sizes, (size_t)n, C10D_INT64, root, &o, &w), &w);
    if (rc == 0 && me != root)
        rc = total_of(what, sizes, n, root, &total);
    char *cat = NULL;
    if (rc == 0) {
        cat = me == root ? concat(objs, n, total) : malloc(total > 0 ? total : 1);
        if (cat == NULL)
            rc = c10d__fail(C10D_ENOMEM, "%s: out of memory (%zu bytes)", what, total);
    }
    if (rc == 0 && total > 0)
        rc = finish(c10d_broadcast(pg, cat, cat, total, C10D_UINT8, root, &o, &w), &w);
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
    c10d_work *w = NULL;
    if (rc != 0) {
        char why[512];
        snprintf(why, sizeof why, "%s", c10d_last_error());
        max = REFUSED;
        if (c10d_broadcast(pg, &max, &max, 1, C10D_INT64, root, &o, &w) == 0)
            c10d_work_wait_release(w);
        free(sizes);
        return c10d__fail(rc, "%s", why);
    }
    /* The largest size first: every rank needs it to post its receive. */
    rc = finish(c10d_broadcast(pg, &max, &max, 1, C10D_INT64, root, &o, &w), &w);
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
        rc = finish(c10d_scatter(pg, padded, mine_buf, (size_t)max, C10D_UINT8, root, &o, &w), &w);
    if (rc == 0)
        rc = finish(c10d_scatter(pg, me == root ? sizes : NULL, &mine, 1, C10D_INT64, root, &o, &w),
                    &w);
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
    c10d_work *w = NULL;
    if (rc == 0)
        rc = finish(c10d_send(pg, sizes, (size_t)n, C10D_INT64, dst, 0, &o, &w), &w);
    char *cat = NULL;
    if (rc == 0 && total > 0) {
        cat = concat(objs, n, total);
        rc = cat == NULL ? c10d__fail(C10D_ENOMEM, "%s: out of memory", what)
                         : finish(c10d_send(pg, cat, total, C10D_UINT8, dst, 0, &o, &w), &w);
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
    c10d_work *w = NULL;
    int rc = finish(c10d_recv(pg, sizes, (size_t)n, C10D_INT64, src, 0, &o, &w), &w);
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
        rc = finish(c10d_recv(pg, cat, total, C10D_UINT8, src, 0, &o, &w), &w);
    if (rc == 0)
        rc = split_out(what, objs, n, sizes, cat);
    free(cat);
    free(sizes);
    return rc;
}
