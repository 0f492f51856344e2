/* What the P2P lane tests (test_p2p_lane, test_p2p_lane_batch) share: byte
 * patterns that name their sender and message, a group on shared memory, a
 * callback counter and the multi-process run with the lane's spin limit. */
#ifndef C10D_TEST_P2P_LANE_UTIL_H
#define C10D_TEST_P2P_LANE_UTIL_H

#include "c10d.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

/* Successful completions count_cb saw. */
extern atomic_int lane_callbacks;
void count_cb(c10d_work *w, int status, void *arg);

/* Message k from rank `from`: n bytes of its own pattern; good checks one. */
void fill(unsigned char *b, size_t n, int from, int k);
int good(const unsigned char *b, size_t n, int from, int k);

double now_s(void);

/* The world group on shared memory (C10D_SHM=1), this timeout; NULL on
 * failure (printed). */
c10d_pg *lane_init(int64_t timeout_ms);

/* mp_run of fn on nranks ranks (120 s bound, the others killed on the first
 * failure), with C10D_SHM_LANE_SPIN_US=spin_us unless NULL; cmocka asserts
 * that every rank passed. */
void lane_run(int (*fn)(int, int, void *), void *arg, int nranks, const char *spin_us);

#endif
