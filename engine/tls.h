/* Thread-local variables read on every op. In a shared library the default
 * (general-dynamic) model reaches one through a call to __tls_get_addr,
 * about 20 instructions; the initial-exec model is one load relative to the
 * thread pointer. Initial-exec variables of a library loaded with dlopen
 * come out of the static TLS surplus glibc keeps for that (hundreds of
 * bytes), so only small, hot variables take it: never a buffer. */
#ifndef C10D_ENGINE_TLS_H
#define C10D_ENGINE_TLS_H

#if defined(__GNUC__) || defined(__clang__)
#define C10D__TLS_HOT __attribute__((tls_model("initial-exec")))
#else
#define C10D__TLS_HOT
#endif

#endif
