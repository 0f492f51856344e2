/* Options structs that carry their own size (see opts.h for the rule). */
#include "opts.h"

#include "error.h"

#include <string.h>

int c10d__opts_read(void *dst, size_t dst_size, size_t v1_size, const void *src, const char *what)
{
    memset(dst, 0, dst_size);
    if (src != NULL) {
        size_t n;
        memcpy(&n, src, sizeof n);
        if (n == 0)
            n = v1_size;
        if (n < sizeof n)
            return c10d__fail(C10D_EINVAL,
                              "%s%soptions struct_size %zu is too small (use the header's "
                              "*_OPTS_INIT)",
                              what ? what : "", what ? ": " : "", n);
        if (n > dst_size) {
            const unsigned char *tail = (const unsigned char *)src + dst_size;
            for (size_t i = 0; i < n - dst_size; i++)
                if (tail[i] != 0)
                    return c10d__fail(C10D_EINVAL,
                                      "%s%sthe options set a field at byte %zu that this "
                                      "library (%zu-byte options) does not know: built against "
                                      "a newer c10d.h?",
                                      what ? what : "", what ? ": " : "", dst_size + i, dst_size);
            n = dst_size;
        }
        memcpy(dst, src, n);
    }
    memcpy(dst, &dst_size, sizeof dst_size);
    return 0;
}
