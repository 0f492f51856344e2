/* c10d-fr: reads the flight-recorder dumps of every rank of a job and says
 * where it hung (docs/debugging.md). It reads libc10d's dumps and PyTorch's
 * JSON ones (the fields both share), and links only jansson, so it runs
 * wherever the dumps were copied to.
 *
 * Per group it works on the collective entries, keyed by collective_seq_id:
 * the last op each rank completed, the first op each rank has not completed
 * (where it waits), the ranks whose dumps stop before that op (they never
 * entered it), and every sequence number at which the ranks' entries differ
 * in op, sizes, dtypes or root. The culprit line names the earliest of: a
 * mismatch, ranks that never entered an op the others wait in, a rank that
 * entered it more than half its timeout after the first, an op every rank
 * entered but none completed. */
#include "dumps.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------- entries */

struct ent {
    int rank;
    int64_t seq;
    const char *op; /* after "<backend>:" */
    const char *state;
    json_t *j;
};

static const char *op_of(json_t *e)
{
    const char *p = json_string_value(json_object_get(e, "profiling_name"));
    if (p == NULL)
        return "?";
    const char *c = strchr(p, ':');
    return c != NULL ? c + 1 : p;
}

static int is_p2p_entry(json_t *e)
{
    json_t *p = json_object_get(e, "is_p2p");
    if (json_is_boolean(p))
        return json_is_true(p);
    const char *op = op_of(e);
    return strcmp(op, "send") == 0 || strcmp(op, "recv") == 0;
}

static const char *group_of(json_t *e, const char **desc)
{
    json_t *pg = json_object_get(e, "process_group");
    const char *name = json_string_value(json_array_get(pg, 0));
    if (desc != NULL)
        *desc = json_string_value(json_array_get(pg, 1));
    if (name == NULL) {
        static char buf[32];
        json_t *id = json_object_get(e, "pg_id");
        snprintf(buf, sizeof buf, "%lld", (long long)json_integer_value(id));
        return buf;
    }
    return name;
}

static int completed(const struct ent *e)
{
    return e->state != NULL && strcmp(e->state, "completed") == 0;
}

/* ----------------------------------------------------------------- report */

struct rankset {
    int n;
    int r[MAX_RANKS];
};

static void rs_add(struct rankset *s, int r)
{
    for (int i = 0; i < s->n; i++)
        if (s->r[i] == r)
            return;
    if (s->n < MAX_RANKS)
        s->r[s->n++] = r;
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

static void rs_sort(struct rankset *s)
{
    qsort(s->r, (size_t)s->n, sizeof(int), cmp_int);
}

static void rs_print(FILE *f, const struct rankset *s)
{
    fprintf(f, "%s ", s->n == 1 ? "rank" : "ranks");
    for (int i = 0; i < s->n; i++)
        fprintf(f, "%s%d", i ? ", " : "", s->r[i]);
}

static json_t *rs_json(const struct rankset *s)
{
    json_t *a = json_array();
    for (int i = 0; i < s->n; i++)
        json_array_append_new(a, json_integer(s->r[i]));
    return a;
}

static char *rs_text(const struct rankset *s)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (f == NULL)
        die_oom();
    rs_print(f, s);
    fclose(f);
    return buf;
}

/* The culprit so far: the one at the lowest sequence number wins. */
struct culprit {
    int set;
    int64_t seq;
    char *text;
    char *group;
    const char *kind;
    struct rankset ranks;
};

static struct culprit culprit;

static int priority(const char *kind)
{
    return strcmp(kind, "mismatch") == 0 ? 0 : strcmp(kind, "never_entered") == 0 ? 1 : 2;
}

/* A mismatch explains a hang better than a missing rank, which explains it
 * better than an op nobody completed; among equals the earliest wins. */
static void propose(const char *kind, const char *group, int64_t seq, const struct rankset *ranks,
                    char *text)
{
    if (culprit.set && (priority(culprit.kind) < priority(kind) ||
                        (priority(culprit.kind) == priority(kind) && culprit.seq <= seq))) {
        free(text);
        return;
    }
    free(culprit.text);
    free(culprit.group);
    culprit.set = 1;
    culprit.seq = seq;
    culprit.text = text;
    culprit.group = strdup(group);
    culprit.kind = kind;
    culprit.ranks = *ranks;
}

static char *fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));
static char *fmt(const char *f, ...)
{
    va_list ap;
    va_start(ap, f);
    char *s = NULL;
    if (vasprintf(&s, f, ap) < 0)
        die_oom();
    va_end(ap);
    return s;
}

/* Members of a group: pg_config's "ranks" ("[0, 1, 2]") of any dump, else
 * every rank that has entries of it. */
static void members(const char *group, struct rankset *out, const struct ent *ents, size_t n)
{
    out->n = 0;
    for (size_t d = 0; d < ndumps && out->n == 0; d++) {
        json_t *c = json_object_get(json_object_get(dumps[d].root, "pg_config"), group);
        const char *r = json_string_value(json_object_get(c, "ranks"));
        for (const char *p = r; p != NULL && *p; p++) {
            if (*p >= '0' && *p <= '9') {
                char *end;
                long v = strtol(p, &end, 10);
                rs_add(out, (int)v);
                p = end - 1;
            }
        }
    }
    if (out->n == 0)
        for (size_t i = 0; i < n; i++)
            rs_add(out, ents[i].rank);
    rs_sort(out);
}

static int have_dump(int rank)
{
    for (size_t d = 0; d < ndumps; d++)
        if (dumps[d].rank == rank)
            return 1;
    return 0;
}

static const char *state_of(json_t *e)
{
    const char *s = json_string_value(json_object_get(e, "state"));
    return s != NULL ? s : "?";
}

/* A field's text for comparing and printing ("" when the dump lacks it). */
static char *field_text(json_t *e, const char *field)
{
    if (strcmp(field, "op") == 0)
        return strdup(op_of(e));
    json_t *v = json_object_get(e, field);
    if (v == NULL || (strcmp(field, "root") == 0 && json_integer_value(v) < 0))
        return strdup("");
    char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    return s != NULL ? s : strdup("");
}

static int cmp_ent_seq(const void *a, const void *b)
{
    const struct ent *x = *(const struct ent *const *)a, *y = *(const struct ent *const *)b;
    return (x->seq > y->seq) - (x->seq < y->seq);
}

static const char *const compared[] = {"op",           "input_sizes",   "input_dtypes",
                                       "output_sizes", "output_dtypes", "root"};

/* One group's report; ents are its collective entries, any order. */

/* The ranks that entered collective `seq` more than half its timeout after
 * the first one did (time_created_ns: wall clock, comparable across the
 * hosts of a job); *late_s the latest gap, *timeout_ms the op's timeout. */
static void late_entrants(const struct ent *ents, size_t n, int64_t seq, struct rankset *late,
                          double *late_s, json_int_t *timeout_ms)
{
    json_int_t first = 0;
    int have = 0;
    for (size_t i = 0; i < n; i++) {
        if (ents[i].seq != seq)
            continue;
        json_t *t = json_object_get(ents[i].j, "time_created_ns");
        if (!json_is_integer(t))
            return; /* a dump without times cannot tell */
        if (!have || json_integer_value(t) < first)
            first = json_integer_value(t);
        have = 1;
        json_int_t to = json_integer_value(json_object_get(ents[i].j, "timeout_ms"));
        if (to > *timeout_ms)
            *timeout_ms = to;
    }
    if (!have || *timeout_ms <= 0)
        return;
    for (size_t i = 0; i < n; i++) {
        if (ents[i].seq != seq)
            continue;
        double gap =
            (double)(json_integer_value(json_object_get(ents[i].j, "time_created_ns")) - first) /
            1e9;
        if (gap * 1000.0 > (double)*timeout_ms / 2) {
            rs_add(late, ents[i].rank);
            if (gap > *late_s)
                *late_s = gap;
        }
    }
}

static void report_group(const char *group, const char *desc, struct ent *ents, size_t n,
                         json_t *jgroups, int as_json)
{
    struct rankset mem;
    members(group, &mem, ents, n);
    json_t *jg = json_object();
    json_object_set_new(jg, "name", json_string(group));
    json_object_set_new(jg, "desc", json_string(desc != NULL ? desc : ""));
    json_object_set_new(jg, "ranks", rs_json(&mem));
    json_t *jranks = json_array();
    if (!as_json) {
        printf("group %s (%s), ", group, desc != NULL ? desc : "?");
        rs_print(stdout, &mem);
        printf(":\n");
    }
    /* Per rank: the last completed and the first pending entry. */
    int64_t *maxseq = calloc((size_t)mem.n, sizeof(int64_t));
    int64_t *pending = calloc((size_t)mem.n, sizeof(int64_t));
    if (maxseq == NULL || pending == NULL)
        die_oom();
    int64_t stuck_seq = -1; /* lowest pending sequence number over the ranks */
    for (int m = 0; m < mem.n; m++) {
        int r = mem.r[m];
        const struct ent *last = NULL, *first_pending = NULL;
        maxseq[m] = 0;
        for (size_t i = 0; i < n; i++) {
            if (ents[i].rank != r)
                continue;
            if (ents[i].seq > maxseq[m])
                maxseq[m] = ents[i].seq;
            if (completed(&ents[i])) {
                if (last == NULL || ents[i].seq > last->seq)
                    last = &ents[i];
            } else if (first_pending == NULL || ents[i].seq < first_pending->seq) {
                first_pending = &ents[i];
            }
        }
        pending[m] = first_pending != NULL ? first_pending->seq : -1;
        if (first_pending != NULL && (stuck_seq < 0 || first_pending->seq < stuck_seq))
            stuck_seq = first_pending->seq;
        json_t *jr = json_object();
        json_object_set_new(jr, "rank", json_integer(r));
        json_object_set_new(jr, "dump", json_boolean(have_dump(r)));
        json_object_set_new(
            jr, "last_completed",
            last ? json_pack("{s:s, s:I}", "op", last->op, "seq", (json_int_t)last->seq)
                 : json_null());
        json_object_set_new(jr, "pending",
                            first_pending ? json_pack("{s:s, s:I, s:s}", "op", first_pending->op,
                                                      "seq", (json_int_t)first_pending->seq,
                                                      "state", first_pending->state)
                                          : json_null());
        json_array_append_new(jranks, jr);
        if (!as_json) {
            printf("  rank %d: ", r);
            if (!have_dump(r)) {
                printf("no dump\n");
                continue;
            }
            if (last != NULL)
                printf("last completed %s (SeqNum=%lld)", last->op, (long long)last->seq);
            else
                printf("completed nothing recorded");
            if (first_pending != NULL)
                printf(
                    "; stuck in %s (SeqNum=%lld, %s, timeout %lld ms)\n", first_pending->op,
                    (long long)first_pending->seq, first_pending->state,
                    (long long)json_integer_value(json_object_get(first_pending->j, "timeout_ms")));
            else
                printf("; nothing pending\n");
        }
    }
    json_object_set_new(jg, "per_rank", jranks);

    /* Mismatches: at each sequence number, entries that differ between ranks. */
    json_t *jmis = json_array();
    /* By sequence number, so each number's entries are one run: the cost is
     * the sort's, whatever the numbers (a corrupt one included). */
    const struct ent **by = malloc((n > 0 ? n : 1) * sizeof *by);
    if (by == NULL)
        die_oom();
    for (size_t i = 0; i < n; i++)
        by[i] = &ents[i];
    qsort(by, n, sizeof *by, cmp_ent_seq);
    for (size_t run = 0, next; run < n; run = next) {
        int64_t s = by[run]->seq;
        for (next = run; next < n && by[next]->seq == s; next++)
            ;
        const struct ent *at[64];
        int nat = 0;
        for (size_t i = run; i < next && nat < 64; i++)
            at[nat++] = by[i];
        if (nat < 2 || s < 1)
            continue;
        /* all_to_all's split sizes, and so a coalesced block's sums, differ
         * between ranks in correct programs. */
        int sizes_vary = 0;
        for (int k = 0; k < nat; k++)
            if (strstr(at[k]->op, "to_all") != NULL || strstr(at[k]->op, "coalesced") != NULL)
                sizes_vary = 1;
        for (size_t f = 0; f < sizeof compared / sizeof compared[0]; f++) {
            if (sizes_vary && strstr(compared[f], "_sizes") != NULL)
                continue;
            /* Distinct values and who has each. */
            char *vals[64];
            struct rankset who[64];
            int nv = 0;
            for (int k = 0; k < nat; k++) {
                char *t = field_text(at[k]->j, compared[f]);
                int v;
                for (v = 0; v < nv; v++)
                    if (strcmp(vals[v], t) == 0)
                        break;
                if (v == nv) {
                    vals[nv] = t;
                    who[nv].n = 0;
                    nv++;
                } else {
                    free(t);
                }
                rs_add(&who[v], at[k]->rank);
            }
            if (nv > 1) {
                json_t *jm = json_object();
                json_object_set_new(jm, "seq", json_integer(s));
                json_object_set_new(jm, "field", json_string(compared[f]));
                json_t *jv = json_array();
                int minority = 0;
                for (int v = 0; v < nv; v++) {
                    rs_sort(&who[v]);
                    json_array_append_new(
                        jv, json_pack("{s:s, s:o}", "value", vals[v], "ranks", rs_json(&who[v])));
                    if (who[v].n < who[minority].n)
                        minority = v;
                }
                json_object_set_new(jm, "values", jv);
                json_array_append_new(jmis, jm);
                if (!as_json) {
                    printf("  mismatch at SeqNum=%lld (%s): %s differs:", (long long)s, at[0]->op,
                           compared[f]);
                    for (int v = 0; v < nv; v++) {
                        printf("%s %s on ", v ? ";" : "", *vals[v] ? vals[v] : "(none)");
                        rs_print(stdout, &who[v]);
                    }
                    printf("\n");
                }
                const struct ent *odd = NULL;
                for (int k = 0; k < nat; k++)
                    if (at[k]->rank == who[minority].r[0])
                        odd = at[k];
                char *rt = rs_text(&who[minority]);
                propose("mismatch", group, s, &who[minority],
                        fmt("%s called %s (SeqNum=%lld) in group %s with %s %s, other ranks with "
                            "%s",
                            rt, odd != NULL ? odd->op : "?", (long long)s, group, compared[f],
                            vals[minority], vals[minority == 0 ? 1 : 0]));
                free(rt);
            }
            for (int v = 0; v < nv; v++)
                free(vals[v]);
        }
    }
    free(by);
    json_object_set_new(jg, "mismatches", jmis);

    /* The op the group is stuck in, and who never entered it. */
    if (stuck_seq > 0) {
        struct rankset entered = {0}, missing = {0}, waiting = {0};
        const char *op = "?";
        for (int m = 0; m < mem.n; m++) {
            int r = mem.r[m];
            int has = 0;
            for (size_t i = 0; i < n; i++)
                if (ents[i].rank == r && ents[i].seq == stuck_seq) {
                    has = 1;
                    op = ents[i].op;
                    if (!completed(&ents[i]))
                        rs_add(&waiting, r);
                }
            if (has)
                rs_add(&entered, r);
            else if (have_dump(r) && maxseq[m] < stuck_seq)
                rs_add(&missing, r);
        }
        json_object_set_new(jg, "stuck",
                            json_pack("{s:I, s:s, s:o, s:o, s:o}", "seq", (json_int_t)stuck_seq,
                                      "op", op, "entered", rs_json(&entered), "waiting",
                                      rs_json(&waiting), "never_entered", rs_json(&missing)));
        if (!as_json) {
            printf("  SeqNum=%lld %s: entered by ", (long long)stuck_seq, op);
            rs_print(stdout, &entered);
            if (missing.n > 0) {
                printf("; never entered by ");
                rs_print(stdout, &missing);
            }
            printf("\n");
        }
        /* Every rank entered: one that entered past half the op's timeout
         * after the first came late (the others had given up or were about
         * to), which is not being stuck inside it. */
        struct rankset late = {0};
        double late_s = 0;
        json_int_t timeout_ms = 0;
        if (missing.n == 0)
            late_entrants(ents, n, stuck_seq, &late, &late_s, &timeout_ms);
        char *rt = missing.n > 0 ? rs_text(&missing)
                   : late.n > 0  ? rs_text(&late)
                                 : rs_text(&waiting);
        if (missing.n > 0)
            propose("never_entered", group, stuck_seq, &missing,
                    fmt("%s never entered %s (SeqNum=%lld) in group %s", rt, op,
                        (long long)stuck_seq, group));
        else if (late.n > 0)
            propose("late_entrant", group, stuck_seq, &late,
                    fmt("%s entered %s (SeqNum=%lld) in group %s %.1f s after the first rank "
                        "(its timeout: %lld ms): late, not stuck inside it",
                        rt, op, (long long)stuck_seq, group, late_s, (long long)timeout_ms));
        else
            propose("stuck", group, stuck_seq, &waiting,
                    fmt("every rank entered %s (SeqNum=%lld) in group %s and %s did not complete "
                        "it (a peer stuck inside it, or the network)",
                        op, (long long)stuck_seq, group, rt));
        free(rt);
    } else {
        json_object_set_new(jg, "stuck", json_null());
    }
    struct rankset nodump = {0};
    for (int m = 0; m < mem.n; m++)
        if (!have_dump(mem.r[m]))
            rs_add(&nodump, mem.r[m]);
    json_object_set_new(jg, "no_dump", rs_json(&nodump));
    json_array_append_new(jgroups, jg);
    free(maxseq);
    free(pending);
}

/* P2P entries not completed, for the text report. */
static void report_p2p(json_t *jout, int as_json)
{
    json_t *a = json_array();
    for (size_t d = 0; d < ndumps; d++) {
        json_t *es = json_object_get(dumps[d].root, "entries");
        size_t i;
        json_t *e;
        json_array_foreach(es, i, e)
        {
            if (!is_p2p_entry(e) || strcmp(state_of(e), "completed") == 0)
                continue;
            json_int_t seq = json_integer_value(json_object_get(e, "p2p_seq_id"));
            json_t *peer = json_object_get(e, "peer");
            json_array_append_new(a, json_pack("{s:i, s:s, s:s, s:I, s:O?}", "rank", dumps[d].rank,
                                               "group", group_of(e, NULL), "op", op_of(e),
                                               "p2p_seq", seq, "peer", peer));
            if (!as_json) {
                printf("p2p: rank %d: %s (p2p SeqNum=%lld", dumps[d].rank, op_of(e),
                       (long long)seq);
                if (json_is_integer(peer) && json_integer_value(peer) >= 0)
                    printf(", peer %lld", (long long)json_integer_value(peer));
                printf(") in group %s not completed (%s)\n", group_of(e, NULL), state_of(e));
            }
        }
    }
    json_object_set_new(jout, "p2p_pending", a);
}

static int cmp_dump(const void *a, const void *b)
{
    return cmp_int(&((const struct dump *)a)->rank, &((const struct dump *)b)->rank);
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: c10d-fr [--json] DUMP...\n"
            "  DUMP: a dump file, a directory of dumps, or a file prefix (/tmp/c10d_trace_rank_)\n"
            "  Reads the flight-recorder dumps of every rank (libc10d's, or PyTorch's JSON\n"
            "  dumps) and prints, per process group, the last op each rank completed, the op\n"
            "  it is stuck in, the ranks that never entered it, ops that differ between ranks,\n"
            "  and a last line naming the likely culprit. --json: the same as one JSON object.\n"
            "  Exit status: 0 nothing wrong found, 1 a culprit named, 2 bad input.\n");
}

int main(int argc, char **argv)
{
    int as_json = 0, nargs = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) {
            as_json = 1;
        } else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            usage(stdout);
            return 0;
        } else if (argv[i][0] == '-' && argv[i][1] != '\0') {
            fprintf(stderr, "c10d-fr: unknown option %s\n", argv[i]);
            usage(stderr);
            return 2;
        } else {
            nargs++;
            if (load_arg(argv[i]) != 0) {
                free_dumps();
                return 2;
            }
        }
    }
    if (nargs == 0) {
        usage(stderr);
        return 2;
    }
    qsort(dumps, ndumps, sizeof *dumps, cmp_dump);
    json_t *out = json_object();
    json_t *jd = json_array();
    struct rankset all = {0};
    for (size_t d = 0; d < ndumps; d++) {
        rs_add(&all, dumps[d].rank);
        json_array_append_new(
            jd,
            json_pack("{s:i, s:s, s:s?, s:s?}", "rank", dumps[d].rank, "file", dumps[d].file,
                      "version", json_string_value(json_object_get(dumps[d].root, "version")),
                      "reason", json_string_value(json_object_get(dumps[d].root, "dump_reason"))));
    }
    json_object_set_new(out, "dumps", jd);
    if (!as_json) {
        printf("c10d-fr: %zu dumps, ", ndumps);
        rs_print(stdout, &all);
        printf("\n");
    }
    /* Collective entries of every dump, then one report per group (in the
     * order groups first appear). */
    size_t total = 0;
    for (size_t d = 0; d < ndumps; d++)
        total += json_array_size(json_object_get(dumps[d].root, "entries"));
    struct ent *ents = calloc(total + 1, sizeof *ents);
    const char **gnames = calloc(total + 1, sizeof *gnames);
    const char **gdescs = calloc(total + 1, sizeof *gdescs);
    if (ents == NULL || gnames == NULL || gdescs == NULL)
        die_oom();
    size_t ne = 0, ng = 0;
    for (size_t d = 0; d < ndumps; d++) {
        json_t *es = json_object_get(dumps[d].root, "entries");
        size_t i;
        json_t *e;
        json_array_foreach(es, i, e)
        {
            if (is_p2p_entry(e))
                continue;
            const char *desc;
            const char *g = group_of(e, &desc);
            size_t k;
            for (k = 0; k < ng; k++)
                if (strcmp(gnames[k], g) == 0)
                    break;
            if (k == ng) {
                gnames[ng] = strdup(g);
                gdescs[ng] = desc;
                ng++;
            }
            ents[ne].rank = dumps[d].rank;
            ents[ne].seq = json_integer_value(json_object_get(e, "collective_seq_id"));
            ents[ne].op = op_of(e);
            ents[ne].state = state_of(e);
            ents[ne].j = e;
            ne++;
        }
    }
    json_t *jgroups = json_array();
    struct ent *sub = calloc(ne + 1, sizeof *sub);
    if (sub == NULL)
        die_oom();
    for (size_t k = 0; k < ng; k++) {
        size_t ns = 0;
        for (size_t i = 0; i < ne; i++)
            if (strcmp(group_of(ents[i].j, NULL), gnames[k]) == 0)
                sub[ns++] = ents[i];
        report_group(gnames[k], gdescs[k], sub, ns, jgroups, as_json);
    }
    json_object_set_new(out, "groups", jgroups);
    report_p2p(out, as_json);
    if (culprit.set) {
        json_object_set_new(out, "culprit",
                            json_pack("{s:s, s:s, s:s, s:I, s:o}", "text", culprit.text, "kind",
                                      culprit.kind, "group", culprit.group, "seq",
                                      (json_int_t)culprit.seq, "ranks", rs_json(&culprit.ranks)));
    } else {
        json_object_set_new(out, "culprit", json_null());
    }
    if (as_json) {
        json_dumpf(out, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        printf("\n");
    } else if (culprit.set) {
        printf("likely culprit: %s\n", culprit.text);
    } else {
        printf("no culprit: every rank completed every recorded collective, and the ranks' "
               "entries agree\n");
    }
    int rc = culprit.set ? 1 : 0;
    /* Freed so that leak checkers (the sanitizer builds run this tool) stay quiet. */
    json_decref(out);
    for (size_t k = 0; k < ng; k++)
        free((char *)gnames[k]);
    free(gnames);
    free(gdescs);
    free(ents);
    free(sub);
    free_dumps();
    free(culprit.text);
    free(culprit.group);
    return rc;
}
