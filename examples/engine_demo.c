/* The engine demo (README command 1 until the process groups land): worker
 * threads complete futures, callbacks run on the loop thread, one future
 * misses its deadline and fails with C10D_ETIMEDOUT. Uses only the public API. */
#include <c10d.h>

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <pthread.h>
#include <unistd.h>

#define NWORKS 8

static atomic_int callbacks_run;

static void on_done(c10d_work *work, int status, void *arg)
{
    (void)work;
    int id = (int)(intptr_t)arg;
    printf("  callback: work %d finished: %s%s%s (on loop thread: %s)\n", id,
           c10d_status_name(status), status ? " - " : "", status ? c10d_work_message(work) : "",
           c10d_on_loop_thread() ? "yes" : "no");
    atomic_fetch_add(&callbacks_run, 1);
}

static void *complete_later(void *arg)
{
    c10d_work *w = arg;
    usleep(20000);
    c10d_work_complete(w, C10D_OK, NULL);
    c10d_work_release(w);
    return NULL;
}

int main(void)
{
    printf("%s\n", c10d_build_info());
    c10d_work *works[NWORKS];
    pthread_t threads[NWORKS];
    for (int i = 0; i < NWORKS; i++) {
        char what[64];
        snprintf(what, sizeof what, "demo work %d", i);
        /* The last one is never completed by a thread: its 200 ms deadline fires. */
        if (c10d_work_create(what, i == NWORKS - 1 ? 200 : 5000, &works[i]) != 0) {
            fprintf(stderr, "c10d_work_create: %s\n", c10d_last_error());
            return 1;
        }
        c10d_work_on_complete(works[i], on_done, (void *)(intptr_t)i);
        if (i < NWORKS - 1) {
            c10d_work_retain(works[i]);
            pthread_create(&threads[i], NULL, complete_later, works[i]);
        }
    }
    int failures = 0;
    for (int i = 0; i < NWORKS; i++) {
        int rc = c10d_work_wait(works[i], 10000);
        if (rc != (i == NWORKS - 1 ? C10D_ETIMEDOUT : C10D_OK))
            failures++;
        if (i < NWORKS - 1)
            pthread_join(threads[i], NULL);
        c10d_work_release(works[i]);
    }
    c10d_shutdown();
    printf("engine demo: %d callbacks ran, %s\n", atomic_load(&callbacks_run),
           failures == 0 ? "all as expected" : "UNEXPECTED RESULTS");
    return failures == 0 && atomic_load(&callbacks_run) == NWORKS ? 0 : 1;
}
