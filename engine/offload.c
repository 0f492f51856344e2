/* Worker threads for blocking calls (offload.h). */
#include "offload.h"

#include "error.h"
#include "log.h"
#include "loop.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct offload {
    void (*work)(void *arg);
    void (*after)(void *arg);
    void *arg;
};

static void *offload_main(void *p)
{
    struct offload o = *(struct offload *)p;
    free(p);
    o.work(o.arg);
    if (c10d__engine_call(o.after, o.arg) != 0)
        C10D_WARN("engine", "a blocking call finished after shutdown; its completion is dropped");
    return NULL;
}

int c10d__engine_offload(void (*work)(void *arg), void (*after)(void *arg), void *arg)
{
    struct offload *o = malloc(sizeof *o);
    if (o == NULL)
        return c10d__fail(C10D_ENOMEM, "engine: out of memory");
    *o = (struct offload){work, after, arg};
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t t;
    int rc = pthread_create(&t, &attr, offload_main, o);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        free(o);
        return c10d__fail(C10D_EIO, "engine: cannot start a worker thread: %s", strerror(rc));
    }
    return 0;
}
