/* The job's shared secret (docs/security.md): C10D_STORE_TOKEN, else the first
 * line of the file C10D_STORE_TOKEN_FILE names. Store clients present it after
 * VALIDATE; store servers and data ports check it. */
#ifndef C10D_ENGINE_TOKEN_H
#define C10D_ENGINE_TOKEN_H

#include <stddef.h>
#include <stdint.h>

/* Longest secret accepted, in bytes: it travels in handshakes of fixed size. */
#define C10D_TOKEN_MAX 256

/* The configured secret, *data of *len bytes (len 0: none configured). Read from the
 * environment at first use (c10d__env_reload() re-reads it). 0, or a negative
 * status with c10d_last_error() naming the file or the problem (unreadable
 * file, empty secret, longer than C10D_TOKEN_MAX). */
int c10d__token_get(const uint8_t **data, size_t *len);

/* Reads a secret from a file (first line, trailing CR/LF stripped) into
 * out[C10D_TOKEN_MAX]: the length, or a negative status naming the file. */
int c10d__token_read_file(const char *path, uint8_t *out);

/* 1 if equal. Time depends only on the lengths, never on where the bytes
 * differ, so a prober learns nothing from how fast a wrong guess fails. */
int c10d__token_equal(const uint8_t *a, size_t alen, const uint8_t *b, size_t blen);

#endif
