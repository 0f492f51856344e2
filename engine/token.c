#include "token.h"

#include "env.h"
#include "error.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <uv.h>

static uv_mutex_t token_mutex;
static uv_once_t token_once = UV_ONCE_INIT;

static void token_init_mutex(void)
{
    uv_mutex_init(&token_mutex);
}

int c10d__token_read_file(const char *path, uint8_t *out)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return c10d__fail(C10D_EINVAL, "cannot read the token file '%s': %s", path,
                          strerror(errno));
    uint8_t buf[C10D_TOKEN_MAX + 2];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    size_t len = 0;
    while (len < n && buf[len] != '\n' && buf[len] != '\r')
        len++;
    if (len > C10D_TOKEN_MAX)
        return c10d__fail(C10D_EINVAL, "token file '%s': the secret is longer than %d bytes", path,
                          C10D_TOKEN_MAX);
    if (len == 0)
        return c10d__fail(C10D_EINVAL, "token file '%s' holds an empty secret", path);
    memcpy(out, buf, len);
    return (int)len;
}

int c10d__token_get(const uint8_t **data, size_t *len)
{
    /* Kept per process: the environment's text is what env.c captured. */
    static uint8_t secret[C10D_TOKEN_MAX];
    static size_t secret_len;
    static char source[1024];
    uv_once(&token_once, token_init_mutex);
    uv_mutex_lock(&token_mutex);
    const char *inline_token = c10d__env_str(C10D_ENV_STORE_TOKEN);
    const char *file = c10d__env_str(C10D_ENV_STORE_TOKEN_FILE);
    int rc = 0;
    char want[1024];
    snprintf(want, sizeof want, "%c%s", *inline_token ? 't' : 'f',
             *inline_token ? inline_token : file);
    if (strcmp(want, source) != 0) {
        secret_len = 0;
        source[0] = 0;
        if (*inline_token) {
            size_t n = strlen(inline_token);
            if (n > C10D_TOKEN_MAX) {
                rc = c10d__fail(C10D_EINVAL, "C10D_STORE_TOKEN is longer than %d bytes",
                                C10D_TOKEN_MAX);
            } else {
                memcpy(secret, inline_token, n);
                secret_len = n;
            }
        } else if (*file) {
            int n = c10d__token_read_file(file, secret);
            if (n < 0)
                rc = n;
            else
                secret_len = (size_t)n;
        }
        if (rc == 0)
            snprintf(source, sizeof source, "%s", want);
    }
    *data = secret;
    *len = rc == 0 ? secret_len : 0;
    uv_mutex_unlock(&token_mutex);
    return rc;
}

int c10d__token_equal(const uint8_t *a, size_t alen, const uint8_t *b, size_t blen)
{
    /* Compare over the longer length so that the time says nothing about
     * the content; the length itself is not secret-bearing enough to hide. */
    size_t n = alen > blen ? alen : blen;
    uint8_t diff = (uint8_t)(alen != blen);
    for (size_t i = 0; i < n; i++) {
        uint8_t x = i < alen ? a[i] : 0;
        uint8_t y = i < blen ? b[i] : 0;
        diff |= (uint8_t)(x ^ y);
    }
    return diff == 0;
}
