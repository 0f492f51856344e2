/* The environment table, log-level parsing, and status codes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "c10d.h"
#include "api/torch_env.h"
#include "engine/env.h"
#include "engine/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    size_t got = fread(buf, 1, (size_t)n, f);
    buf[got] = '\0';
    fclose(f);
    return buf;
}

/* Every variable the library reads is documented in the README's table. */
static void test_readme_lists_every_variable(void **state)
{
    (void)state;
    const char *path = getenv("C10D_README");
    assert_non_null(path);
    char *readme = read_file(path);
    assert_non_null(readme);
    const struct c10d__env_var *t = c10d__env_table();
    for (int i = 0; i < C10D_ENV_COUNT; i++) {
        char cell[128];
        snprintf(cell, sizeof cell, "| `%s`", t[i].name);
        if (strstr(readme, cell) == NULL)
            fail_msg("README.md has no table row for %s", t[i].name);
        for (const char *f = t[i].fallback; f != NULL;) {
            const char *end = strchr(f, ',');
            char name[64];
            snprintf(name, sizeof name, "%.*s", end != NULL ? (int)(end - f) : (int)strlen(f), f);
            if (strstr(readme, name) == NULL)
                fail_msg("README.md does not mention the fallback %s", name);
            f = end != NULL ? end + 2 : NULL;
        }
    }
    free(readme);
}

static int level_for(const char *ours, const char *torch)
{
    if (ours)
        setenv("C10D_LOG_LEVEL", ours, 1);
    else
        unsetenv("C10D_LOG_LEVEL");
    if (torch)
        setenv("TORCH_CPP_LOG_LEVEL", torch, 1);
    else
        unsetenv("TORCH_CPP_LOG_LEVEL");
    c10d__env_reload();
    return c10d__log_level();
}

static void test_log_levels(void **state)
{
    (void)state;
    assert_int_equal(level_for(NULL, NULL), C10D_LOG_WARN);
    assert_int_equal(level_for("debug", NULL), C10D_LOG_DEBUG);
    assert_int_equal(level_for("TRACE", "ERROR"), C10D_LOG_TRACE); /* ours wins */
    assert_int_equal(level_for(NULL, "ERROR"), C10D_LOG_ERROR);
    assert_int_equal(level_for(NULL, "0"), C10D_LOG_INFO); /* torch's numbering */
    assert_int_equal(level_for(NULL, "WARNING"), C10D_LOG_WARN);
    assert_int_equal(level_for("4", NULL), C10D_LOG_ERROR);   /* our numbering */
    assert_int_equal(level_for("loud", NULL), C10D_LOG_WARN); /* bad value: default, warned */
    assert_int_equal(level_for("OFF", NULL), C10D_LOG_OFF);
    level_for(NULL, NULL);
}

static void test_int_parsing(void **state)
{
    (void)state;
    setenv("C10D_ENGINE_BATCH", "0x10", 1);
    c10d__env_reload();
    assert_int_equal(c10d__env_int(C10D_ENV_ENGINE_BATCH), 16);
    setenv("C10D_ENGINE_BATCH", "12abc", 1);
    c10d__env_reload();
    assert_int_equal(c10d__env_int(C10D_ENV_ENGINE_BATCH), 64); /* the default */
    unsetenv("C10D_ENGINE_BATCH");
    c10d__env_reload();
}

/* Own name first, then each fallback in order (torch's newer name, then its
 * older one). */
static void test_fallbacks_in_order(void **state)
{
    (void)state;
    setenv("TORCH_NCCL_TRACE_BUFFER_SIZE", "9", 1);
    c10d__env_reload();
    assert_int_equal(c10d__env_int(C10D_ENV_TRACE_BUFFER_SIZE), 9);
    setenv("TORCH_FR_BUFFER_SIZE", "7", 1);
    c10d__env_reload();
    assert_int_equal(c10d__env_int(C10D_ENV_TRACE_BUFFER_SIZE), 7);
    setenv("C10D_TRACE_BUFFER_SIZE", "5", 1);
    c10d__env_reload();
    assert_int_equal(c10d__env_int(C10D_ENV_TRACE_BUFFER_SIZE), 5);
    unsetenv("C10D_TRACE_BUFFER_SIZE");
    unsetenv("TORCH_FR_BUFFER_SIZE");
    unsetenv("TORCH_NCCL_TRACE_BUFFER_SIZE");
    setenv("TORCH_FR_DUMP_TEMP_FILE", "/x/fr_", 1);
    c10d__env_reload();
    assert_string_equal(c10d__env_str(C10D_ENV_TRACE_FILE_PREFIX), "/x/fr_");
    unsetenv("TORCH_FR_DUMP_TEMP_FILE");
    c10d__env_reload();
    assert_int_equal(c10d__env_int(C10D_ENV_TRACE_BUFFER_SIZE), 2000);
}

/* torch's variables that do nothing here are named, not silently dropped. */
static void test_ignored_torch_variables(void **state)
{
    (void)state;
    const char *names[8];
    unsetenv("TORCH_NCCL_HIGH_PRIORITY");
    size_t before = c10d__torch_env_ignored(names, 8);
    setenv("TORCH_NCCL_HIGH_PRIORITY", "1", 1);
    size_t n = c10d__torch_env_ignored(names, 8);
    assert_int_equal(n, before + 1);
    int found = 0;
    for (size_t i = 0; i < n && i < 8; i++)
        found |= strcmp(names[i], "TORCH_NCCL_HIGH_PRIORITY") == 0;
    assert_true(found);
    unsetenv("TORCH_NCCL_HIGH_PRIORITY");
}

static void test_status_codes(void **state)
{
    (void)state;
    const int codes[] = {C10D_OK,        C10D_EINVAL,    C10D_ETIMEDOUT, C10D_ECANCELED,
                         C10D_ECLOSED,   C10D_EABORTED,  C10D_ESTORE,    C10D_EUNSUPPORTED,
                         C10D_ENOMEM,    C10D_EIO,       C10D_EPROTO,    C10D_EDEADLK,
                         C10D_ENOTFOUND, C10D_EINTERNAL, C10D_EREVOKED};
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
        assert_string_not_equal(c10d_strerror(codes[i]), "unknown status");
        for (size_t j = 0; j < i; j++)
            assert_string_not_equal(c10d_status_name(codes[i]), c10d_status_name(codes[j]));
    }
    assert_string_equal(c10d_strerror(-999), "unknown status");
    assert_string_equal(c10d_status_name(C10D_ETIMEDOUT), "C10D_ETIMEDOUT");
    assert_non_null(strstr(c10d_build_info(), c10d_version()));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_readme_lists_every_variable),
        cmocka_unit_test(test_log_levels),
        cmocka_unit_test(test_int_parsing),
        cmocka_unit_test(test_fallbacks_in_order),
        cmocka_unit_test(test_ignored_torch_variables),
        cmocka_unit_test(test_status_codes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
