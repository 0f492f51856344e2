/* The steps of group creation that need other modules: the rendezvous and
 * the client stores (engine/store.h, api/rendezvous.c) and the backends. The
 * backend table lives here so that a build without a backend still links and
 * says which one is missing. */
#include "pg.h"

#include "engine/error.h"

#include <stdlib.h>
#include <string.h>

#ifdef C10D_HAVE_NCCL
/* The NCCL backend is optional within a CUDA build while it is being written. */
#pragma weak c10d__nccl_backend
#endif

int c10d__pg_find_backend(const char *name, const struct c10d__backend_vtable **out)
{
    *out = NULL;
    if (strcmp(name, "tcp") == 0 || strcmp(name, "gloo") == 0) {
        *out = &c10d__tcp_backend;
        return 0;
    }
    if (strcmp(name, "nccl") == 0) {
#ifdef C10D_HAVE_NCCL
        if (&c10d__nccl_backend != NULL) {
            *out = &c10d__nccl_backend;
            return 0;
        }
#endif
        return c10d__fail(C10D_EUNSUPPORTED, "backend \"nccl\" is not built into this library");
    }
    return c10d__fail(C10D_EINVAL,
                      "unknown backend \"%s\" (expected tcp, nccl or \"cpu:tcp,cuda:nccl\")", name);
}

static int device_index(const char *dev, size_t len)
{
    if (len == 3 && strncmp(dev, "cpu", 3) == 0)
        return 0;
    if (len == 4 && strncmp(dev, "cuda", 4) == 0)
        return 1;
    return -1;
}

int c10d__pg_parse_backend(const char *spec, const struct c10d__backend_vtable *out[C10D__PG_NDEV])
{
    for (int d = 0; d < C10D__PG_NDEV; d++)
        out[d] = NULL;
    if (spec == NULL || *spec == '\0')
        spec = "tcp";
    if (strchr(spec, ':') == NULL) {
        /* A single name maps every device it supports. */
        const struct c10d__backend_vtable *vt;
        C10D_CHECK(c10d__pg_find_backend(spec, &vt));
        if (strcmp(spec, "nccl") == 0)
            out[1] = vt;
        else
            out[0] = vt;
        return 0;
    }
    /* Syntax and devices first, so a malformed config says so whatever is built. */
    char names[C10D__PG_NDEV][32] = {{0}};
    int seen[C10D__PG_NDEV] = {0};
    const char *p = spec;
    while (*p != '\0') {
        const char *comma = strchr(p, ',');
        size_t len = comma != NULL ? (size_t)(comma - p) : strlen(p);
        const char *colon = memchr(p, ':', len);
        if (colon == NULL || colon == p || colon == p + len - 1)
            return c10d__fail(C10D_EINVAL,
                              "malformed backend config \"%s\": expected device:backend pairs "
                              "such as \"cpu:tcp,cuda:nccl\"",
                              spec);
        int d = device_index(p, (size_t)(colon - p));
        if (d < 0)
            return c10d__fail(C10D_EINVAL, "backend config \"%s\": unknown device \"%.*s\"", spec,
                              (int)(colon - p), p);
        if (seen[d])
            return c10d__fail(C10D_EINVAL, "backend config \"%s\": device \"%.*s\" appears twice",
                              spec, (int)(colon - p), p);
        seen[d] = 1;
        size_t nlen = len - (size_t)(colon + 1 - p);
        if (nlen >= sizeof names[d])
            return c10d__fail(C10D_EINVAL, "backend config \"%s\": backend name too long", spec);
        memcpy(names[d], colon + 1, nlen);
        p = comma != NULL ? comma + 1 : p + len;
        if (comma != NULL && *p == '\0')
            return c10d__fail(C10D_EINVAL, "malformed backend config \"%s\": trailing comma", spec);
    }
    for (int d = 0; d < C10D__PG_NDEV; d++)
        if (seen[d])
            C10D_CHECK(c10d__pg_find_backend(names[d], &out[d]));
    return 0;
}

int c10d__pg_rendezvous(const char *url, int rank, int world_size, int64_t timeout_ms,
                        c10d_store **store, int *rank_out, int *world_size_out)
{
    c10d_rendezvous_opts ro;
    memset(&ro, 0, sizeof ro);
    ro.timeout_ms = timeout_ms;
    ro.no_barrier = 1; /* ours comes after the backend connected, as torch's */
    ro.rank = world_size > 0 ? rank : -1;
    ro.world_size = world_size > 0 ? world_size : 0;
    c10d_rendezvous_result res;
    memset(&res, 0, sizeof res);
    C10D_CHECK(c10d_rendezvous(url, &ro, &res));
    *store = res.store;
    *rank_out = res.rank;
    *world_size_out = res.world_size;
    return 0;
}

int c10d__pg_store_prefix(c10d_store *base, const char *prefix, c10d_store **out)
{
    if (base == NULL) {
        *out = NULL;
        return 0;
    }
    return c10d_store_prefix(base, prefix, out);
}

void c10d__pg_store_retain(c10d_store *store)
{
    if (store != NULL)
        c10d_store_retain(store);
}

void c10d__pg_store_release(c10d_store *store)
{
    if (store != NULL)
        c10d_store_release(store);
}

int c10d__pg_store_barrier(c10d_store *store, const char *name, int world_size, int64_t timeout_ms)
{
    if (store == NULL)
        return 0;
    return c10d_store_barrier(store, name, world_size, timeout_ms);
}
