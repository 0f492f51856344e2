/* The backend registry: which backends this build has, and the backend
 * config strings ("tcp", "nccl", "cpu:tcp,cuda:nccl") that pick them. A
 * backend that is not compiled in is named as missing, never linked weakly. */
#include "backends/backend.h"

#include "engine/error.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

int c10d__backend_find(const char *name, const struct c10d__backend_vtable **out)
{
    *out = NULL;
    if (strcmp(name, "tcp") == 0 || strcmp(name, "gloo") == 0) {
        *out = &c10d__tcp_backend;
        return 0;
    }
    if (strcmp(name, "nccl") == 0) {
        *out = &c10d__nccl_backend;
        return 0;
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

int c10d__backend_parse(const char *user_spec,
                        const struct c10d__backend_vtable *out[C10D__DEVICE_TYPES])
{
    for (int d = 0; d < C10D__DEVICE_TYPES; d++)
        out[d] = NULL;
    /* As torch's BackendConfig: case does not matter ("GLOO", "cpu:Gloo"),
     * and "undefined" is the default. Unlike torch's default, which adds
     * cuda:nccl whenever NCCL is compiled in, ours stays host-only: the nccl
     * backend loads its libraries when a group is created, and a host-only
     * job must not need them; ask for "cpu:tcp,cuda:nccl" by name. */
    char spec[128];
    if (user_spec != NULL && strlen(user_spec) >= sizeof spec)
        return c10d__fail(C10D_EINVAL, "backend config \"%.60s...\" is too long", user_spec);
    size_t n = 0;
    for (const char *p = user_spec != NULL ? user_spec : ""; *p != '\0'; p++)
        spec[n++] = (char)tolower((unsigned char)*p);
    spec[n] = '\0';
    if (n == 0 || strcmp(spec, "undefined") == 0)
        snprintf(spec, sizeof spec, "tcp");
    if (strchr(spec, ':') == NULL) {
        /* A single name maps every device it supports. */
        const struct c10d__backend_vtable *vt;
        C10D_CHECK(c10d__backend_find(spec, &vt));
        if (strcmp(spec, "nccl") == 0)
            out[1] = vt;
        else
            out[0] = vt;
        return 0;
    }
    /* Syntax and devices first, so a malformed config says so whatever is built. */
    char names[C10D__DEVICE_TYPES][32] = {{0}};
    int seen[C10D__DEVICE_TYPES] = {0};
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
    for (int d = 0; d < C10D__DEVICE_TYPES; d++)
        if (seen[d])
            C10D_CHECK(c10d__backend_find(names[d], &out[d]));
    /* tcp takes CUDA buffers through pinned host staging. */
    if (out[1] == &c10d__tcp_backend)
        out[1] = &c10d__tcp_cuda_backend;
    return 0;
}
