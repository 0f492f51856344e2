/* Which sanitizer a test is built under (GCC says so with __SANITIZE_*__,
 * Clang with __has_feature): UNDER_TSAN and UNDER_ASAN are 1 or 0. */
#ifndef C10D_TEST_SANITIZERS_H
#define C10D_TEST_SANITIZERS_H

#if defined(__SANITIZE_THREAD__)
#define UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define UNDER_TSAN 1
#endif
#endif
#ifndef UNDER_TSAN
#define UNDER_TSAN 0
#endif

#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif
#ifndef UNDER_ASAN
#define UNDER_ASAN 0
#endif

#endif
