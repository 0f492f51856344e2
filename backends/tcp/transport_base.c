/* The tcp transport's ground floor, which every other part of it may call:
 * reporting an error (the façade above decides what failing means), the
 * transfer pool, and the count of open handles whose last close frees the
 * transport's memory. */
#include "transport_impl.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ errors */

void c10d__tcp_error(struct c10d__tcp_transport *t, int status, const char *fmt, ...)
{
    if (t->failed)
        return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    t->up->fail(t, status, msg);
}

/* -------------------------------------------------------------- pool */

struct c10d__tcp_xfer *c10d__tcp_xfer_get(struct c10d__tcp_transport *t)
{
    struct c10d__tcp_xfer *x = t->pool;
    if (x != NULL) {
        t->pool = x->next;
    } else {
        x = malloc(sizeof *x);
        if (x == NULL)
            return NULL;
        x->all_next = t->all_xfers;
        t->all_xfers = x;
    }
    struct c10d__tcp_xfer *keep = x->all_next;
    memset(x, 0, sizeof *x);
    x->all_next = keep;
    x->source = -1;
    return x;
}

void c10d__tcp_pool_push(struct c10d__tcp_transport *t, struct c10d__tcp_xfer *x)
{
    x->next = t->pool;
    t->pool = x;
}

void c10d__tcp_xfer_put(struct c10d__tcp_transport *t, struct c10d__tcp_xfer *x)
{
    if (x->writes > 0)
        x->released = 1;
    else
        c10d__tcp_pool_push(t, x);
}

/* ----------------------------------------------------------- memory */

void c10d__tcp_handle_closed(struct c10d__tcp_transport *t)
{
    t->handles--;
    if (t->freeing && t->handles == 0)
        c10d__tcp_free_memory(t);
}

void c10d__tcp_free_memory(struct c10d__tcp_transport *t)
{
    for (struct c10d__tcp_xfer *x = t->all_xfers; x != NULL;) {
        struct c10d__tcp_xfer *next = x->all_next;
        free(x);
        x = next;
    }
    for (int r = 0; r < t->cfg.size; r++) {
        for (struct unexp *u = t->peers[r].unexp_head; u != NULL;) {
            struct unexp *next = u->next;
            free(u->data);
            free(u);
            u = next;
        }
        if (t->addrs != NULL)
            free(t->addrs[r]);
        for (struct ring_write *w = t->peers[r].rw_head; w != NULL;) {
            struct ring_write *next = w->next;
            free(w);
            w = next;
        }
        free(t->peers[r].ring_conn);
    }
    for (struct unexp *u = t->unexp_pool; u != NULL;) {
        struct unexp *next = u->next;
        free(u->data);
        free(u);
        u = next;
    }
    free(t->addrs);
    free(t->ring_peers);
    free(t->peers);
    free(t);
}
