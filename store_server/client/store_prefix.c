/* PrefixStore: "<prefix>/<key>" in a base store. Ops are rewritten on the
 * loop thread and handed to the base; results come back unchanged, except
 * LIST_KEYS, which keeps only this prefix's keys and strips the prefix. */
#include "store.h"

#include <stdlib.h>
#include <string.h>

struct prefix_store {
    c10d_store base;
    c10d_store *inner;
    size_t plen;
    char prefix[]; /* "<prefix>/" */
};

static void prefix_submit(c10d_store *s, struct c10d__store_op *op)
{
    struct prefix_store *ps = (struct prefix_store *)s;
    int rc = c10d__store_op_prefix_keys(op, ps->prefix, ps->plen);
    if (rc == 0 && op->req.cmd == C10D_STORE_LIST_KEYS)
        rc = c10d__store_op_add_list_prefix(op, ps->prefix, ps->plen);
    if (rc < 0) {
        c10d__store_op_finish(op, rc, "%s", c10d_last_error());
        return;
    }
    /* The base's timeout is the user's choice on this store: keep the op's. */
    c10d__store_op_forward(ps->inner, op);
}

static void prefix_close(c10d_store *s)
{
    c10d__store_unref(s);
}

static void prefix_destroy(c10d_store *s)
{
    struct prefix_store *ps = (struct prefix_store *)s;
    c10d_store_release(ps->inner);
    free(ps);
}

static int prefix_route(c10d_store *s, struct c10d__store_route *out)
{
    return c10d__store_route(((struct prefix_store *)s)->inner, out);
}

/* The base cloned, under the same prefix. */
static int prefix_clone(c10d_store *s, c10d_store **out)
{
    struct prefix_store *ps = (struct prefix_store *)s;
    c10d_store *inner = NULL;
    C10D_CHECK(c10d_store_clone(ps->inner, &inner));
    char *prefix = strndup(ps->prefix, ps->plen - 1); /* without its '/' */
    int rc = prefix != NULL ? c10d_store_prefix(inner, prefix, out)
                            : c10d__fail(C10D_ENOMEM, "store clone: out of memory");
    free(prefix);
    c10d_store_release(inner);
    return rc;
}

static c10d_store *prefix_inner(c10d_store *s)
{
    return ((struct prefix_store *)s)->inner;
}

static const struct c10d__store_vtable prefix_vtable = {
    .kind = "prefix",
    .submit = prefix_submit,
    .close = prefix_close,
    .destroy = prefix_destroy,
    .route = prefix_route,
    .clone = prefix_clone,
    .inner = prefix_inner,
};

int c10d_store_prefix(c10d_store *base, const char *prefix, c10d_store **out)
{
    if (!base || !prefix || !out)
        return c10d__fail(C10D_EINVAL, "store prefix: %s is NULL",
                          !base     ? "base"
                          : !prefix ? "prefix"
                                    : "out");
    size_t n = strlen(prefix);
    struct prefix_store *ps = calloc(1, sizeof *ps + n + 2);
    if (!ps)
        return c10d__fail(C10D_ENOMEM, "store prefix: out of memory");
    c10d__store_init(&ps->base, &prefix_vtable);
    atomic_store(&ps->base.timeout_ms, c10d_store_timeout(base));
    ps->base.dialect = base->dialect;
    memcpy(ps->prefix, prefix, n);
    ps->prefix[n] = '/';
    ps->plen = n + 1;
    c10d_store_retain(base);
    ps->inner = base;
    *out = &ps->base;
    return 0;
}
