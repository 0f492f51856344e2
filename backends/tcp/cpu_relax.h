/* A spinning waiter's pause between looks (the caller's lanes, lane.c and
 * p2p_lane.c): it lets the sibling hyperthread run and saves power. */
#ifndef C10D_BACKENDS_TCP_CPU_RELAX_H
#define C10D_BACKENDS_TCP_CPU_RELAX_H

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

#endif
