/* libFuzzer target over the server's request handling: the session layer
 * (parser, dialect detection, dispatch, table, waiters, watches, limits) of
 * three connections sharing one table, without sockets.
 *
 * Input: a sequence of chunks, each [u8 control][u8 length][length bytes].
 * control % 4 picks the connection (3: drop connection 0 and open a fresh
 * one, as a disconnect); the bytes are fed to that connection as one read.
 * A connection the server would close (malformed, over a limit) is freed and
 * replaced, as the server does. Build: test/fuzz/build.sh. */
#include "store_server/server/session.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define NSESS 3

static size_t out_bytes;

static void discard(struct c10d__store_session *s)
{
    out_bytes += s->out.len;
    s->out.len = 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* Small limits so that the fuzzer reaches every limit path. */
    struct c10d__wire_codec_limits lim = {.max_key_bytes = 256,
                                          .max_value_bytes = 4096,
                                          .max_keys = 64,
                                          .max_request_bytes = 64 * 1024};
    struct c10d__store_ctx ctx;
    if (c10d__store_ctx_init(&ctx, &lim, 1 << 20, discard) < 0)
        return 0;
    struct c10d__store_session s[NSESS];
    for (int i = 0; i < NSESS; i++)
        c10d__store_session_init(&s[i], &ctx, "fuzz");
    size_t pos = 0;
    while (pos + 2 <= size) {
        unsigned which = data[pos] % 4;
        size_t len = data[pos + 1];
        pos += 2;
        if (len > size - pos)
            len = size - pos;
        if (which == 3) {
            c10d__store_session_free(&s[0]);
            c10d__store_session_init(&s[0], &ctx, "fuzz");
            which = 0;
        }
        if (c10d__store_session_feed(&s[which], data + pos, len) < 0) {
            c10d__store_session_free(&s[which]);
            c10d__store_session_init(&s[which], &ctx, "fuzz");
        }
        pos += len;
    }
    for (int i = 0; i < NSESS; i++)
        c10d__store_session_free(&s[i]);
    c10d__store_ctx_free(&ctx);
    return 0;
}
