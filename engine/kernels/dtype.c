/* dtype and reduce-op tables, and which pairs the host backend accepts
 * (docs/semantics.md, 3). */
#include "c10d.h"
#include "engine/error.h"
#include "engine/kernels/reduce.h"

#include <stdatomic.h>
#include <stddef.h>
#include <string.h>
#include <strings.h>

static const struct {
    const char *name;
    size_t size;
    int floating; /* reduced in floating point: AVG and PREMUL_SUM allowed */
    int complex;  /* pairs of reals: SUM, AVG and PREMUL_SUM only */
} dtype_table[C10D_DTYPE_COUNT] = {
    [C10D_FLOAT32] = {"float32", 4, 1},
    [C10D_FLOAT64] = {"float64", 8, 1},
    [C10D_FLOAT16] = {"float16", 2, 1},
    [C10D_BFLOAT16] = {"bfloat16", 2, 1},
    [C10D_INT8] = {"int8", 1, 0},
    [C10D_UINT8] = {"uint8", 1, 0},
    [C10D_INT32] = {"int32", 4, 0},
    [C10D_INT64] = {"int64", 8, 0},
    [C10D_BOOL] = {"bool", 1, 0},
    [C10D_FLOAT8_E4M3] = {"float8_e4m3fn", 1, 1},
    [C10D_FLOAT8_E5M2] = {"float8_e5m2", 1, 1},
    [C10D_INT16] = {"int16", 2, 0},
    [C10D_UINT16] = {"uint16", 2, 0},
    [C10D_UINT32] = {"uint32", 4, 0},
    [C10D_UINT64] = {"uint64", 8, 0},
    [C10D_COMPLEX64] = {"complex64", 8, 1, 1},
    [C10D_COMPLEX128] = {"complex128", 16, 1, 1},
};

/* Other spellings people pass in from Python configs and command lines. */
static const struct {
    const char *name;
    c10d_dtype dtype;
} dtype_aliases[] = {
    {"float", C10D_FLOAT32},
    {"fp32", C10D_FLOAT32},
    {"f32", C10D_FLOAT32},
    {"double", C10D_FLOAT64},
    {"fp64", C10D_FLOAT64},
    {"f64", C10D_FLOAT64},
    {"half", C10D_FLOAT16},
    {"fp16", C10D_FLOAT16},
    {"f16", C10D_FLOAT16},
    {"bf16", C10D_BFLOAT16},
    {"int", C10D_INT32},
    {"long", C10D_INT64},
    {"short", C10D_INT16},
    {"cfloat", C10D_COMPLEX64},
    {"cdouble", C10D_COMPLEX128},
    {"float8_e4m3", C10D_FLOAT8_E4M3},
    {"fp8_e4m3", C10D_FLOAT8_E4M3},
    {"e4m3", C10D_FLOAT8_E4M3},
    {"fp8_e5m2", C10D_FLOAT8_E5M2},
    {"e5m2", C10D_FLOAT8_E5M2},
};

static const char *const op_names[C10D_REDUCE_OP_COUNT] = {
    [C10D_SUM] = "SUM", [C10D_AVG] = "AVG",   [C10D_PRODUCT] = "PRODUCT",
    [C10D_MIN] = "MIN", [C10D_MAX] = "MAX",   [C10D_BAND] = "BAND",
    [C10D_BOR] = "BOR", [C10D_BXOR] = "BXOR", [C10D_PREMUL_SUM] = "PREMUL_SUM",
};

static int dtype_valid(c10d_dtype dtype)
{
    /* The enum may be unsigned or signed depending on the compiler: compare as int. */
    return (int)dtype >= 0 && (int)dtype < C10D_DTYPE_COUNT;
}

static int op_valid(c10d_reduce_op op)
{
    return (int)op >= 0 && (int)op < C10D_REDUCE_OP_COUNT;
}

size_t c10d_dtype_size(c10d_dtype dtype)
{
    return dtype_valid(dtype) ? dtype_table[dtype].size : 0;
}

c10d_dtype c10d__dtype_real(c10d_dtype dtype, size_t *per)
{
    int cplx = dtype == C10D_COMPLEX64 || dtype == C10D_COMPLEX128;
    if (per != NULL)
        *per = cplx ? 2 : 1;
    if (!cplx)
        return dtype;
    return dtype == C10D_COMPLEX64 ? C10D_FLOAT32 : C10D_FLOAT64;
}

const char *c10d_dtype_name(c10d_dtype dtype)
{
    return dtype_valid(dtype) ? dtype_table[dtype].name : NULL;
}

int c10d_dtype_from_name(const char *name, c10d_dtype *out)
{
    if (name == NULL || out == NULL)
        return c10d__fail(C10D_EINVAL, "c10d_dtype_from_name: NULL argument");
    const char *n = name;
    /* str(torch.float32) is "torch.float32": accept it verbatim. */
    if (strncmp(n, "torch.", 6) == 0)
        n += 6;
    for (int i = 0; i < C10D_DTYPE_COUNT; i++) {
        if (strcasecmp(n, dtype_table[i].name) == 0) {
            *out = (c10d_dtype)i;
            return 0;
        }
    }
    for (size_t i = 0; i < sizeof dtype_aliases / sizeof dtype_aliases[0]; i++) {
        if (strcasecmp(n, dtype_aliases[i].name) == 0) {
            *out = dtype_aliases[i].dtype;
            return 0;
        }
    }
    return c10d__fail(C10D_EINVAL, "unknown dtype '%s'", name);
}

const char *c10d_reduce_op_name(c10d_reduce_op op)
{
    return op_valid(op) ? op_names[op] : NULL;
}

int c10d_reduce_op_from_name(const char *name, c10d_reduce_op *out)
{
    if (name == NULL || out == NULL)
        return c10d__fail(C10D_EINVAL, "c10d_reduce_op_from_name: NULL argument");
    const char *n = name;
    /* str(dist.ReduceOp.SUM) is "ReduceOp.SUM" (older torch: "RedOpType.SUM"). */
    if (strncasecmp(n, "ReduceOp.", 9) == 0)
        n += 9;
    else if (strncasecmp(n, "RedOpType.", 10) == 0)
        n += 10;
    for (int i = 0; i < C10D_REDUCE_OP_COUNT; i++) {
        if (strcasecmp(n, op_names[i]) == 0) {
            *out = (c10d_reduce_op)i;
            return 0;
        }
    }
    if (strcasecmp(n, "PROD") == 0 || strcasecmp(n, "MUL") == 0) {
        *out = C10D_PRODUCT;
        return 0;
    }
    if (strcasecmp(n, "MEAN") == 0) {
        *out = C10D_AVG;
        return 0;
    }
    return c10d__fail(C10D_EINVAL, "unknown reduce op '%s'", name);
}

/* Pairs found valid, kept (the answer never changes): the check made on
 * every all_reduce, by the group and by its backend, is then one load. An
 * invalid pair takes the whole check each time, for its message. */
static _Atomic unsigned char pair_valid[C10D_DTYPE_COUNT][C10D_REDUCE_OP_COUNT];

static int reduce_op_check(c10d_reduce_op op, c10d_dtype dtype);

/* The whole check, keeping a valid answer; out of line, so that an answer
 * from the table needs no stack frame. */
static int check_and_keep(c10d_reduce_op op, c10d_dtype dtype) __attribute__((noinline));

static int check_and_keep(c10d_reduce_op op, c10d_dtype dtype)
{
    int rc = reduce_op_check(op, dtype);
    if (rc == 0)
        atomic_store_explicit(&pair_valid[dtype][op], 1, memory_order_relaxed);
    return rc;
}

int c10d_reduce_op_check(c10d_reduce_op op, c10d_dtype dtype)
{
    if (op_valid(op) && dtype_valid(dtype) &&
        atomic_load_explicit(&pair_valid[dtype][op], memory_order_relaxed))
        return 0;
    return check_and_keep(op, dtype);
}

static int reduce_op_check(c10d_reduce_op op, c10d_dtype dtype)
{
    if (!op_valid(op))
        return c10d__fail(C10D_EINVAL, "invalid reduce op %d", (int)op);
    if (!dtype_valid(dtype))
        return c10d__fail(C10D_EINVAL, "invalid dtype %d", (int)dtype);
    int floating = dtype_table[dtype].floating;
    /* torch refuses these on complex tensors before any backend sees them. */
    if (dtype_table[dtype].complex && op != C10D_SUM && op != C10D_AVG && op != C10D_PREMUL_SUM)
        return c10d__fail(C10D_EINVAL,
                          "Cannot use ReduceOp.%s with complex dtype %s (complex values reduce "
                          "as pairs of reals: SUM, AVG and PREMUL_SUM only)",
                          op_names[op], dtype_table[dtype].name);
    switch (op) {
    case C10D_SUM:
    case C10D_PRODUCT:
    case C10D_MIN:
    case C10D_MAX:
        return 0;
    case C10D_AVG:
    case C10D_PREMUL_SUM:
        /* An integer average would have to pick a rounding torch does not
         * define for the host backend (gloo crashes); refuse it plainly. */
        if (!floating)
            return c10d__fail(C10D_EINVAL,
                              "Cannot use ReduceOp.%s with non-floating dtype %s (the host "
                              "backend supports it for floating dtypes only)",
                              op_names[op], dtype_table[dtype].name);
        return 0;
    case C10D_BAND:
    case C10D_BOR:
    case C10D_BXOR:
        if (floating)
            return c10d__fail(C10D_EINVAL, "Cannot use ReduceOp.%s with non-integral dtype %s",
                              op_names[op], dtype_table[dtype].name);
        return 0;
    case C10D_REDUCE_OP_COUNT:
        break;
    }
    return c10d__fail(C10D_EINVAL, "invalid reduce op %d", (int)op);
}
