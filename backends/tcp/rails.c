/* The rails (rails.h): one tcp transport per listed interface, and the one
 * record per rank that publishes all of their addresses.
 *
 * Each rail is a complete transport: its own listener, connections, hellos,
 * matching and failure. Nothing crosses rails: a collective's frames (matched
 * by (seq, member, sub)) all travel on the rail of its sequence number, a P2P
 * message's on the rail of its tag, so the matching and ordering rules of one
 * transport hold unchanged on each. What the rails share is the group's fate:
 * a rail that fails reports through the backend's on_error, which fails them
 * all (c10d__tcp_rails_fail). */
#include "rails.h"

#include "engine/env.h"
#include "engine/error.h"
#include "engine/log.h"
#include "engine/loop.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Rails asking for the same peer's record within this long ask once (each
 * transport asks at most this often itself: conn.c's REREAD_MS). */
#define ASK_GAP_MS 200

struct c10d__tcp_rails {
    int n;
    int rank, size;
    struct c10d__tcp_transport *t[C10D_TCP_RAILS_MAX];
    char *names; /* the interface list as given ("" when none) */
    char *published;
    void (*on_error)(void *arg, int status, const char *message);
    void *error_arg;
    void (*ready)(void *arg, int status);
    void *ready_arg;
    int nready, ready_called;
    void (*reread)(void *arg, int rank);
    void *reread_arg;
    uint64_t *asked_ms; /* per rank: when its record was last asked for */
};

/* Splits the list in place into at most C10D_TCP_RAILS_MAX names; an empty
 * entry ("eth0,,eth1", a trailing comma) is an error. */
static int split_names(char *list, char **names, int *n)
{
    *n = 0;
    for (char *p = list;;) {
        char *comma = strchr(p, ',');
        if (comma != NULL)
            *comma = '\0';
        if (*p == '\0' || *n == C10D_TCP_RAILS_MAX)
            return -1;
        names[(*n)++] = p;
        if (comma == NULL)
            return 0;
        p = comma + 1;
    }
}

/* How many addresses a published record holds: its commas + 1 (the job id
 * after '#' holds none). */
static int record_count(const char *rec)
{
    int n = 1;
    for (const char *p = rec; *p != '\0' && *p != '#'; p++)
        n += *p == ',';
    return n;
}

/* Part k of a record, as that rail's transport parses it: the k-th address,
 * then the record's "#<job id>" if it has one. */
static char *record_part(const char *rec, int k)
{
    const char *p = rec;
    for (int i = 0; i < k; i++)
        p = strchr(p, ',') + 1; /* record_count said there are enough */
    size_t len = strcspn(p, ",#");
    const char *job = strchr(rec, '#');
    size_t jlen = job != NULL ? strlen(job) : 0;
    char *out = malloc(len + jlen + 1);
    if (out == NULL)
        return NULL;
    memcpy(out, p, len);
    memcpy(out + len, job != NULL ? job : "", jlen + 1);
    return out;
}

static int count_error(const struct c10d__tcp_rails *r, int rank, const char *rec)
{
    return c10d__fail(C10D_EINVAL,
                      "tcp: rank %d published %d address(es) ('%s') but rank %d listens on %d "
                      "(C10D_SOCKET_IFNAME/GLOO_SOCKET_IFNAME '%s'): every rank must list the "
                      "same number of interfaces (or the store holds an earlier job's record)",
                      rank, record_count(rec), rec, r->rank, r->n,
                      *r->names != '\0' ? r->names : "unset");
}

static void rails_reread(void *arg, int rank)
{
    struct c10d__tcp_rails *r = arg;
    uint64_t now = c10d__now_ms();
    if (r->reread == NULL || rank < 0 || rank >= r->size)
        return;
    if (r->asked_ms[rank] != 0 && now - r->asked_ms[rank] < ASK_GAP_MS)
        return;
    r->asked_ms[rank] = now;
    r->reread(r->reread_arg, rank);
}

static int publish(struct c10d__tcp_rails *r)
{
    if (r->n == 1) {
        r->published = strdup(c10d__tcp_transport_address(r->t[0]));
        return r->published != NULL ? 0 : c10d__fail(C10D_ENOMEM, "tcp: out of memory");
    }
    size_t cap = 64;
    for (int k = 0; k < r->n; k++)
        cap += strlen(c10d__tcp_transport_address(r->t[k])) + 1;
    if ((r->published = malloc(cap)) == NULL)
        return c10d__fail(C10D_ENOMEM, "tcp: out of memory");
    size_t len = 0;
    for (int k = 0; k < r->n; k++) {
        const char *a = c10d__tcp_transport_address(r->t[k]);
        size_t alen = strcspn(a, "#");
        if (k > 0)
            r->published[len++] = ',';
        memcpy(r->published + len, a, alen);
        len += alen;
    }
    const char *job = strchr(c10d__tcp_transport_address(r->t[0]), '#');
    snprintf(r->published + len, cap - len, "%s", job != NULL ? job : "");
    return 0;
}

int c10d__tcp_rails_new(const struct c10d__tcp_transport_config *cfg, struct c10d__tcp_rails **out)
{
    *out = NULL;
    const char *env = c10d__env_str(C10D_ENV_SOCKET_IFNAME);
    struct c10d__tcp_rails *r = calloc(1, sizeof *r);
    char *list = strdup(env != NULL ? env : "");
    if (r == NULL || list == NULL || (r->names = strdup(list)) == NULL ||
        (r->asked_ms = calloc((size_t)cfg->size, sizeof *r->asked_ms)) == NULL) {
        free(list);
        c10d__tcp_rails_free(r);
        return c10d__fail(C10D_ENOMEM, "tcp: out of memory");
    }
    r->rank = cfg->rank;
    r->size = cfg->size;
    r->on_error = cfg->on_error;
    r->error_arg = cfg->arg;
    char *names[C10D_TCP_RAILS_MAX] = {NULL};
    r->n = 1;
    if (*list != '\0' && split_names(list, names, &r->n) < 0) {
        free(list);
        c10d__tcp_rails_free(r);
        return c10d__fail(C10D_EINVAL,
                          "tcp: C10D_SOCKET_IFNAME/GLOO_SOCKET_IFNAME '%s' is not a list of at "
                          "most %d interface names separated by commas",
                          env, C10D_TCP_RAILS_MAX);
    }
    int rc = 0;
    for (int k = 0; k < r->n && rc == 0; k++) {
        struct c10d__tcp_transport_config tc = *cfg;
        tc.ifname = names[k]; /* NULL without a list: the transport's own rules */
        /* Rail 0 is the transport as it always was; the others differ in
         * their group id so that a connection can never land on another
         * rail's listener, and share rail 0's job id. */
        tc.group_id = cfg->group_id ^ (uint32_t)k * 0x9e3779b9u;
        if (k > 0) {
            tc.hello_note = NULL; /* the note (shm's host id) travels on rail 0 */
            const char *job = strchr(c10d__tcp_transport_address(r->t[0]), '#');
            tc.job_id = job != NULL ? strtoull(job + 1, NULL, 16) : 0;
        }
        rc = c10d__tcp_transport_new(&tc, &r->t[k]);
        if (rc == 0)
            c10d__tcp_transport_on_connect_failed(r->t[k], rails_reread, r);
    }
    free(list);
    if (rc == 0)
        rc = publish(r);
    if (rc < 0) {
        c10d__tcp_rails_free(r);
        return rc;
    }
    if (r->n > 1)
        C10D_INFO("tcp", "rank %d: %d rails over interfaces %s, published as %s", r->rank, r->n,
                  r->names, r->published);
    *out = r;
    return 0;
}

int c10d__tcp_rails_count(const struct c10d__tcp_rails *r)
{
    return r->n;
}

struct c10d__tcp_transport *const *c10d__tcp_rails_all(const struct c10d__tcp_rails *r)
{
    return r->t;
}

struct c10d__tcp_transport *c10d__tcp_rails_pick(const struct c10d__tcp_rails *r, uint64_t key)
{
    return r->t[r->n == 1 ? 0 : key % (uint64_t)r->n];
}

const char *c10d__tcp_rails_address(const struct c10d__tcp_rails *r)
{
    return r->published;
}

static void on_rail_ready(void *arg, int status)
{
    struct c10d__tcp_rails *r = arg;
    if (r->ready_called)
        return;
    if (status == 0 && ++r->nready < r->n)
        return;
    r->ready_called = 1;
    r->ready(r->ready_arg, status);
}

int c10d__tcp_rails_connect(struct c10d__tcp_rails *r, const char *const *addrs,
                            void (*ready)(void *arg, int status), void *arg)
{
    for (int p = 0; p < r->size; p++)
        if (addrs[p] != NULL && record_count(addrs[p]) != r->n)
            return count_error(r, p, addrs[p]);
    r->ready = ready;
    r->ready_arg = arg;
    if (r->n == 1)
        return c10d__tcp_transport_connect(r->t[0], addrs, on_rail_ready, r);
    const char **part = calloc((size_t)r->size, sizeof *part);
    if (part == NULL)
        return c10d__fail(C10D_ENOMEM, "tcp: out of memory");
    int rc = 0;
    for (int k = 0; k < r->n && rc == 0; k++) {
        for (int p = 0; p < r->size && rc == 0; p++) {
            free((char *)part[p]);
            part[p] = addrs[p] != NULL ? record_part(addrs[p], k) : NULL;
            if (addrs[p] != NULL && part[p] == NULL)
                rc = c10d__fail(C10D_ENOMEM, "tcp: out of memory");
        }
        if (rc == 0)
            rc = c10d__tcp_transport_connect(r->t[k], part, on_rail_ready, r);
    }
    for (int p = 0; p < r->size; p++)
        free((char *)part[p]);
    free(part);
    if (rc < 0)
        r->ready_called = 1; /* the caller hears it from the return value */
    return rc;
}

void c10d__tcp_rails_on_connect_failed(struct c10d__tcp_rails *r,
                                       void (*reread)(void *arg, int rank), void *arg)
{
    r->reread = reread;
    r->reread_arg = arg;
}

int c10d__tcp_rails_update_addr(struct c10d__tcp_rails *r, int rank, const char *published)
{
    if (record_count(published) != r->n) {
        int rc = count_error(r, rank, published);
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", c10d_last_error());
        c10d__tcp_rails_fail(r, rc, msg);
        if (r->on_error != NULL)
            r->on_error(r->error_arg, rc, msg);
        return c10d__fail(rc, "%s", msg);
    }
    if (r->n == 1)
        return c10d__tcp_transport_update_addr(r->t[0], rank, published);
    int changed = 0;
    for (int k = 0; k < r->n; k++) {
        char *part = record_part(published, k);
        if (part == NULL)
            return c10d__fail(C10D_ENOMEM, "tcp: out of memory");
        int rc = c10d__tcp_transport_update_addr(r->t[k], rank, part);
        free(part);
        if (rc < 0)
            return rc;
        changed |= rc;
    }
    return changed;
}

void c10d__tcp_rails_fail(struct c10d__tcp_rails *r, int status, const char *message)
{
    for (int k = 0; k < r->n; k++)
        if (r->t[k] != NULL)
            c10d__tcp_transport_fail(r->t[k], status, message);
}

int c10d__tcp_rails_lost_ranks(const struct c10d__tcp_rails *r, int *out, int cap)
{
    if (r->n == 1)
        return r->t[0] != NULL ? c10d__tcp_transport_lost_ranks(r->t[0], out, cap) : 0;
    int *lost = malloc((size_t)r->size * sizeof *lost);
    int n = 0;
    for (int k = 0; k < r->n && lost != NULL; k++) {
        int m = r->t[k] != NULL ? c10d__tcp_transport_lost_ranks(r->t[k], lost, r->size) : 0;
        for (int i = 0; i < m && i < r->size; i++) {
            int seen = 0;
            for (int j = 0; j < n && j < cap; j++)
                seen |= out[j] == lost[i];
            if (!seen && n++ < cap)
                out[n - 1] = lost[i];
        }
    }
    free(lost);
    return n;
}

void c10d__tcp_rails_free(struct c10d__tcp_rails *r)
{
    if (r == NULL)
        return;
    for (int k = 0; k < r->n; k++) {
        struct c10d__tcp_transport *t = r->t[k];
        if (t != NULL) {
            c10d__tcp_transport_on_connect_failed(t, NULL, NULL);
            c10d__tcp_transport_free(t); /* may report to on_rail_ready: r lives on */
            r->t[k] = NULL;
        }
    }
    free(r->published);
    free(r->names);
    free(r->asked_ms);
    free(r);
}
