/* An op's name, torch's "[PG 0 (default_pg) Rank 1] Work(SeqNum=.., OpType=..,
 * NumelIn=.., NumelOut=.., Timeout(ms)=..)": the group's part made once, the
 * rest only when someone reads it (c10d__work_create_named). */
#include "pg.h"

#include <stdio.h>
#include <string.h>

/* Appends what fits of `str` at *at (len: the buffer's size), keeping it
 * terminated. */
static void put_str(char *buf, size_t len, size_t *at, const char *str)
{
    size_t n = strlen(str), room = len - 1 - *at; /* *at < len always */
    if (n > room)
        n = room;
    memcpy(buf + *at, str, n); /* a byte loop here was half of describe's time */
    *at += n;
    buf[*at] = '\0';
}

static void put_u64(char *buf, size_t len, size_t *at, unsigned long long v)
{
    char digits[24];
    int n = 0;
    do
        digits[n++] = (char)('0' + v % 10);
    while ((v /= 10) != 0);
    while (n > 0 && *at + 1 < len)
        buf[(*at)++] = digits[--n];
    buf[*at] = '\0';
}

/* By hand: printf's machinery was a tenth of a small op's time when every
 * op's name was made. */
void c10d__pg_make_op_name(const void *args, char *buf, size_t len)
{
    struct c10d__pg_op_name copy; /* args may sit at any alignment */
    memcpy(&copy, args, sizeof copy);
    const struct c10d__pg_op_name *n = &copy;
    size_t at = 0;
    buf[0] = '\0';
    put_u64(buf, len, &at, (unsigned long long)n->seq);
    put_str(buf, len, &at, ", OpType=");
    put_str(buf, len, &at, n->optype);
    put_str(buf, len, &at, ", NumelIn=");
    put_u64(buf, len, &at, (unsigned long long)n->in);
    put_str(buf, len, &at, ", NumelOut=");
    put_u64(buf, len, &at, (unsigned long long)n->out);
    put_str(buf, len, &at, ", Timeout(ms)=");
    int64_t timeout_ms = n->timeout_ms;
    if (timeout_ms < 0) {
        put_str(buf, len, &at, "-");
        timeout_ms = -timeout_ms;
    }
    put_u64(buf, len, &at, (unsigned long long)timeout_ms);
    put_str(buf, len, &at, ")");
}

const char *c10d__pg_op_name_prefix(c10d_pg *pg, size_t *len)
{
    if (pg->what_prefix == NULL && asprintf(&pg->what_prefix, "[PG %s (%s) Rank %d] Work(SeqNum=",
                                            pg->name, pg->desc, pg->rank) < 0)
        pg->what_prefix = NULL;
    if (pg->what_prefix == NULL) {
        *len = strlen("[PG] Work(SeqNum=");
        return "[PG] Work(SeqNum=";
    }
    if (pg->what_prefix_len == 0)
        pg->what_prefix_len = strlen(pg->what_prefix);
    *len = pg->what_prefix_len;
    return pg->what_prefix;
}
