/* The key/value table: hashing, values with a memory budget, counters kept as
 * integers, waits, queues and watches. Over 800 lines because waits, queues
 * and watches all hang off the same entries and must be updated together on
 * every write; split apart, each would reach into the others' lists. */
#include "table.h"

#include "engine/error.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

/* Bookkeeping cost charged per allocation on top of its size (malloc header,
 * rounding): keeps the budget honest for millions of tiny keys. */
#define ALLOC_OVERHEAD 16

struct entry;

/* One key of a pending wait: an element of that key's waiter list. */
struct link {
    struct link *prev, *next;
    struct entry *e;
    struct c10d__store_wait *w;
};

struct c10d__store_wait {
    struct c10d__store_client *client;
    /* BARRIER: fires only once the key's counter reached this (> 0); another
     * write to the key (a PyTorch rank's ADD, a reader's ADD 0) leaves it
     * parked. 0: any write fires it (WAIT). */
    int64_t until;
    size_t missing; /* links still registered */
    size_t nlinks;
    size_t mem;
    struct link links[];
};

struct c10d__store_watch {
    struct c10d__store_watch *next_in_client;
    struct c10d__store_watch *prev, *next; /* in the entry's list */
    struct entry *e;
    struct c10d__store_client *client;
};

struct qitem {
    struct qitem *next;
    size_t len;
    uint8_t data[];
};

struct entry {
    struct entry *next; /* hash chain */
    uint64_t hash;
    uint8_t *val;
    size_t vlen, vcap;
    int has_val;
    /* The value as ADD last wrote it: the next ADD needs no parse. Only a
     * value this table formatted itself is cached, so stoll's leniency
     * (" 7x" is 7) never meets the cache. */
    int ival_ok;
    int64_t ival;
    struct qitem *qhead, *qtail;
    size_t qlen;
    struct link *wfirst, *wlast;
    struct c10d__store_watch *watchers;
    int owed; /* clients a QUEUE_PUSH woke that have not popped yet */
    size_t klen;
    uint8_t key[];
};

struct c10d__store_table {
    struct c10d__store_table_cbs cbs;
    struct entry **buckets;
    size_t nbuckets; /* power of two */
    size_t nentries;
    uint64_t seed;
    size_t keys;
    size_t queues, queue_items;
    size_t value_bytes;
    size_t memory, memory_limit;
    size_t waiters, watchers;
    struct qitem *popped; /* the last popped item, freed on the next call */
};

/* ------------------------------------------------------------- accounting */

int c10d__store_table_charge(struct c10d__store_table *t, size_t bytes)
{
    if (t->memory_limit && (bytes > t->memory_limit || t->memory > t->memory_limit - bytes))
        return C10D_ENOMEM;
    t->memory += bytes;
    return 0;
}

void c10d__store_table_release(struct c10d__store_table *t, size_t bytes)
{
    t->memory = bytes > t->memory ? 0 : t->memory - bytes;
}

static void drop_popped(struct c10d__store_table *t)
{
    if (t->popped) {
        c10d__store_table_release(t, sizeof *t->popped + t->popped->len + ALLOC_OVERHEAD);
        free(t->popped);
        t->popped = NULL;
    }
}

/* ------------------------------------------------------------------ hash */

/* Seeded per table so that a client cannot precompute colliding keys. */
static uint64_t mix(uint64_t h)
{
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    h ^= h >> 33;
    return h;
}

static uint64_t hash_key(uint64_t seed, const uint8_t *d, size_t n)
{
    uint64_t h = seed ^ (n * 0x9E3779B97F4A7C15ULL);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, d + i, 8);
        h = mix(h ^ w) + 0x9E3779B97F4A7C15ULL;
    }
    /* The 0-7 bytes left, without a memcpy call of variable size (a GET
     * spent as much in it as in the rest of the hash): two overlapping loads
     * or three single bytes still determine every byte, given their count,
     * which is mixed in too. */
    size_t r = n - i;
    uint64_t w = 0;
    if (r >= 4) {
        uint32_t lo, hi;
        memcpy(&lo, d + i, 4);
        memcpy(&hi, d + i + r - 4, 4);
        w = lo | (uint64_t)hi << 32;
    } else if (r) {
        w = d[i] | (uint64_t)d[i + r / 2] << 8 | (uint64_t)d[i + r - 1] << 16;
    }
    return mix(h ^ w ^ ((uint64_t)r << 56));
}

static struct entry **slot(struct c10d__store_table *t, struct c10d__wire_str key, uint64_t h)
{
    struct entry **pp = &t->buckets[h & (t->nbuckets - 1)];
    while (*pp) {
        struct entry *e = *pp;
        if (e->hash == h && e->klen == key.len &&
            (key.len == 0 || !memcmp(e->key, key.data, key.len)))
            return pp;
        pp = &e->next;
    }
    return pp;
}

static struct entry *find(struct c10d__store_table *t, struct c10d__wire_str key)
{
    return *slot(t, key, hash_key(t->seed, key.data, key.len));
}

static void grow(struct c10d__store_table *t)
{
    size_t n = t->nbuckets * 2;
    struct entry **b = calloc(n, sizeof *b);
    if (!b)
        return; /* keep the longer chains; still correct */
    for (size_t i = 0; i < t->nbuckets; i++) {
        struct entry *e = t->buckets[i];
        while (e) {
            struct entry *next = e->next;
            struct entry **head = &b[e->hash & (n - 1)];
            e->next = *head;
            *head = e;
            e = next;
        }
    }
    c10d__store_table_release(t, t->nbuckets * sizeof *b);
    t->memory += n * sizeof *b; /* the index is never refused */
    free(t->buckets);
    t->buckets = b;
    t->nbuckets = n;
}

static size_t entry_mem(size_t klen)
{
    return sizeof(struct entry) + klen + ALLOC_OVERHEAD;
}

/* Creates the entry for `key` at *pp, the empty slot slot() returned for
 * hash h. */
static int create_at(struct c10d__store_table *t, struct entry **pp, struct c10d__wire_str key,
                     uint64_t h, struct entry **out)
{
    if (c10d__store_table_charge(t, entry_mem(key.len)) < 0)
        return C10D_ENOMEM;
    struct entry *e = calloc(1, sizeof *e + key.len);
    if (!e) {
        c10d__store_table_release(t, entry_mem(key.len));
        return C10D_ENOMEM;
    }
    e->hash = h;
    e->klen = key.len;
    if (key.len)
        memcpy(e->key, key.data, key.len);
    *pp = e;
    t->nentries++;
    if (t->nentries > t->nbuckets)
        grow(t);
    *out = e;
    return 0;
}

static int get_or_create(struct c10d__store_table *t, struct c10d__wire_str key, struct entry **out)
{
    uint64_t h = hash_key(t->seed, key.data, key.len);
    struct entry **pp = slot(t, key, h);
    if (*pp) {
        *out = *pp;
        return 0;
    }
    return create_at(t, pp, key, h, out);
}

/* Frees the entry once nothing refers to it. */
static void maybe_gc(struct c10d__store_table *t, struct entry *e)
{
    if (e->has_val || e->qlen || e->wfirst || e->watchers || e->owed)
        return;
    struct entry **pp = &t->buckets[e->hash & (t->nbuckets - 1)];
    while (*pp != e)
        pp = &(*pp)->next;
    *pp = e->next;
    t->nentries--;
    c10d__store_table_release(t, entry_mem(e->klen) + (e->vcap ? e->vcap + ALLOC_OVERHEAD : 0));
    free(e->val);
    free(e);
}

static struct c10d__wire_str key_of(const struct entry *e)
{
    return (struct c10d__wire_str){e->key, e->klen};
}

static struct c10d__wire_str val_of(const struct entry *e)
{
    return (struct c10d__wire_str){e->val, e->vlen};
}

/* ----------------------------------------------------------------- waits */

static void unlink_link(struct link *l)
{
    struct entry *e = l->e;
    if (l->prev)
        l->prev->next = l->next;
    else
        e->wfirst = l->next;
    if (l->next)
        l->next->prev = l->prev;
    else
        e->wlast = l->prev;
    l->prev = l->next = NULL;
    l->e = NULL;
}

static void free_wait(struct c10d__store_table *t, struct c10d__store_wait *w)
{
    if (w->client && w->client->wait == w)
        w->client->wait = NULL;
    c10d__store_table_release(t, w->mem);
    t->waiters--;
    free(w);
}

/* Counts down the waiter of link l (already unlinked); at zero its wait is
 * over: returns its client, whom the caller wakes (cbs.wake). */
static struct c10d__store_client *count_down(struct c10d__store_table *t, struct link *l)
{
    struct c10d__store_wait *w = l->w;
    if (--w->missing > 0)
        return NULL;
    struct c10d__store_client *c = w->client;
    free_wait(t, w);
    return c;
}

static void wake(struct c10d__store_table *t, struct c10d__store_client *c)
{
    if (c != NULL && t->cbs.wake)
        t->cbs.wake(c);
}

static int barrier_unmet(const struct link *l, const struct entry *e)
{
    return l->w->until > 0 && !(e->has_val && e->ival_ok && e->ival >= l->w->until);
}

/* Puts l last in e's line of waiters. */
static void link_append(struct entry *e, struct link *l)
{
    l->next = NULL;
    l->prev = e->wlast;
    if (e->wlast)
        e->wlast->next = l;
    else
        e->wfirst = l;
    e->wlast = l;
}

static void wake_all(struct c10d__store_table *t, struct entry *e)
{
    struct link *l = e->wfirst;
    e->wfirst = e->wlast = NULL;
    while (l) {
        struct link *next = l->next;
        if (barrier_unmet(l, e)) { /* back in line, in the same order */
            link_append(e, l);
        } else {
            l->prev = l->next = NULL;
            l->e = NULL;
            wake(t, count_down(t, l));
        }
        l = next;
    }
}

static void settle_owed(struct c10d__store_table *t, struct c10d__store_client *c, int popped);

/* QUEUE_PUSH: wakes the first waiter that fires, which then owes the queue
 * a pop (c10d__store_table_client_request settles it). */
static void wake_one(struct c10d__store_table *t, struct entry *e)
{
    while (e->wfirst) {
        struct link *l = e->wfirst;
        unlink_link(l);
        struct c10d__store_client *c = count_down(t, l);
        if (c == NULL)
            continue;
        if (c->owed_wake != NULL)
            settle_owed(t, c, 0);
        c->owed_wake = e;
        e->owed++;
        wake(t, c);
        return;
    }
}

/* The client's owed wake ends: with its pop, or handed to the next waiter
 * while items remain (it left, or asked for something else). */
static void settle_owed(struct c10d__store_table *t, struct c10d__store_client *c, int popped)
{
    struct entry *e = c->owed_wake;
    c->owed_wake = NULL;
    e->owed--;
    if (!popped && e->qlen > 0)
        wake_one(t, e);
    maybe_gc(t, e);
}

void c10d__store_table_client_request(struct c10d__store_table *t,
                                      struct c10d__store_client *client, int cmd,
                                      struct c10d__wire_str first_arg)
{
    struct entry *e = client->owed_wake;
    if (e == NULL)
        return;
    int popped = cmd == C10D_STORE_QUEUE_POP && first_arg.len == e->klen &&
                 memcmp(first_arg.data, e->key, e->klen) == 0;
    settle_owed(t, client, popped);
}

int c10d__store_table_cancel_wait(struct c10d__store_table *t, struct c10d__store_client *client)
{
    struct c10d__store_wait *w = client->wait;
    if (!w)
        return 0;
    /* The still-registered links have l->e set. */
    for (size_t i = 0; i < w->nlinks; i++) {
        struct link *l = &w->links[i];
        if (l->e) {
            struct entry *e = l->e;
            unlink_link(l);
            maybe_gc(t, e);
        }
    }
    free_wait(t, w);
    return 1;
}

static int present(const struct entry *e)
{
    return e && (e->has_val || e->qlen > 0);
}

int c10d__store_table_check(struct c10d__store_table *t, const struct c10d__wire_str *keys,
                            size_t n)
{
    drop_popped(t);
    for (size_t i = 0; i < n; i++)
        if (!present(find(t, keys[i])))
            return 0;
    return 1;
}

static int register_wait(struct c10d__store_table *t, struct c10d__store_client *client,
                         struct entry **entries, size_t n)
{
    size_t mem = sizeof(struct c10d__store_wait) + n * sizeof(struct link) + ALLOC_OVERHEAD;
    if (c10d__store_table_charge(t, mem) < 0)
        return C10D_ENOMEM;
    struct c10d__store_wait *w = calloc(1, mem - ALLOC_OVERHEAD);
    if (!w) {
        c10d__store_table_release(t, mem);
        return C10D_ENOMEM;
    }
    w->client = client;
    w->mem = mem;
    w->missing = n;
    w->nlinks = n;
    for (size_t i = 0; i < n; i++) {
        struct link *l = &w->links[i];
        struct entry *e = entries[i];
        l->w = w;
        l->e = e;
        link_append(e, l);
    }
    client->wait = w;
    t->waiters++;
    return 0;
}

int c10d__store_table_wait(struct c10d__store_table *t, struct c10d__store_client *client,
                           const struct c10d__wire_str *keys, size_t n)
{
    drop_popped(t);
    c10d__store_table_cancel_wait(t, client);
    size_t missing = 0;
    for (size_t i = 0; i < n; i++)
        if (!present(find(t, keys[i])))
            missing++;
    if (missing == 0)
        return 1;
    struct entry **entries = malloc(missing * sizeof *entries);
    if (!entries)
        return C10D_ENOMEM;
    size_t m = 0;
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        struct entry *e = find(t, keys[i]);
        if (present(e))
            continue;
        rc = get_or_create(t, keys[i], &e);
        if (rc == 0)
            entries[m++] = e;
    }
    if (rc == 0)
        rc = register_wait(t, client, entries, m);
    if (rc < 0)
        for (size_t i = 0; i < m; i++)
            maybe_gc(t, entries[i]);
    free(entries);
    return rc;
}

/* ---------------------------------------------------------------- values */

static void notify_watchers(struct c10d__store_table *t, struct entry *e, int event,
                            struct c10d__wire_str old_value)
{
    struct c10d__wire_str new_value = {NULL, 0};
    if (event != C10D_STORE_KEY_DELETED)
        new_value = val_of(e);
    for (struct c10d__store_watch *w = e->watchers; w; w = w->next)
        if (t->cbs.watch)
            t->cbs.watch(w->client, event, key_of(e), old_value, new_value);
}

/* Replaces e's value with the concatenation of a and b (a may be e's own
 * value: APPEND), then, if `wake`, wakes the key's waiters; watchers hear of
 * every change. */
static int store_value(struct c10d__store_table *t, struct entry *e, struct c10d__wire_str a,
                       struct c10d__wire_str b, int wake)
{
    size_t len = a.len + b.len;
    if (len < a.len)
        return C10D_ENOMEM;
    int created = !e->has_val;
    int appending = a.len && a.data == e->val;
    uint8_t *old = e->val;
    size_t old_len = e->vlen, old_cap = e->vcap;
    uint8_t *nv = old;
    /* Watchers need the old value after the change: never overwrite in place. */
    if (len > old_cap || e->watchers || !old) {
        size_t cap = len ? len : 1;
        if (appending && cap < old_cap + old_cap / 2)
            cap = old_cap + old_cap / 2; /* repeated APPEND stays linear */
        if (c10d__store_table_charge(t, cap + ALLOC_OVERHEAD) < 0)
            return C10D_ENOMEM;
        nv = malloc(cap);
        if (!nv) {
            c10d__store_table_release(t, cap + ALLOC_OVERHEAD);
            return C10D_ENOMEM;
        }
        if (a.len)
            memcpy(nv, a.data, a.len);
        e->vcap = cap;
    } else if (a.len && !appending) {
        memmove(nv, a.data, a.len);
    }
    if (b.len)
        memcpy(nv + a.len, b.data, b.len);
    e->val = nv;
    e->vlen = len;
    e->has_val = 1;
    e->ival_ok = 0;
    if (created)
        t->keys++;
    t->value_bytes = t->value_bytes - (created ? 0 : old_len) + len + (created ? e->klen : 0);
    if (e->watchers)
        notify_watchers(t, e, created ? C10D_STORE_KEY_CREATED : C10D_STORE_KEY_UPDATED,
                        (struct c10d__wire_str){old, created ? 0 : old_len});
    if (nv != old && old) {
        c10d__store_table_release(t, old_cap + ALLOC_OVERHEAD);
        free(old);
    }
    if (wake)
        wake_all(t, e);
    return 0;
}

int c10d__store_table_set(struct c10d__store_table *t, struct c10d__wire_str key,
                          struct c10d__wire_str value)
{
    drop_popped(t);
    struct entry *e;
    C10D_CHECK(get_or_create(t, key, &e));
    int rc = store_value(t, e, value, (struct c10d__wire_str){NULL, 0}, 1);
    maybe_gc(t, e);
    return rc;
}

int c10d__store_table_get(struct c10d__store_table *t, struct c10d__wire_str key,
                          struct c10d__wire_str *value)
{
    drop_popped(t);
    struct entry *e = find(t, key);
    if (!e || !e->has_val) {
        *value = (struct c10d__wire_str){NULL, 0};
        return 0;
    }
    *value = val_of(e);
    return 1;
}

/* The counter at e (missing: 0). */
static int counter_of(struct entry *e, int64_t *v)
{
    *v = 0;
    if (!e || !e->has_val)
        return 0;
    if (e->ival_ok) {
        *v = e->ival;
        return 0;
    }
    return c10d__wire_parse_i64(e->val, e->vlen, v);
}

static const char digit_pairs[] = "00010203040506070809101112131415161718192021222324"
                                  "25262728293031323334353637383940414243444546474849"
                                  "50515253545556575859606162636465666768697071727374"
                                  "75767778798081828384858687888990919293949596979899";

/* The length of v in decimal, sign included. */
static size_t i64_len(int64_t v)
{
    uint64_t m = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
    size_t n = 1;
    for (uint64_t p = 10; n < 20 && m >= p; p *= 10)
        n++;
    return n + (v < 0);
}

/* Writes v in decimal as "%" PRId64 prints it, in exactly len = i64_len(v)
 * bytes, two digits per division (snprintf was a third of an ADD's
 * instructions). */
static void put_i64(int64_t v, size_t len, uint8_t *out)
{
    uint64_t m = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
    uint8_t *p = out + len;
    while (m >= 100) {
        unsigned d = (unsigned)(m % 100) * 2;
        m /= 100;
        *--p = (uint8_t)digit_pairs[d + 1];
        *--p = (uint8_t)digit_pairs[d];
    }
    if (m >= 10) {
        *--p = (uint8_t)digit_pairs[m * 2 + 1];
        *--p = (uint8_t)digit_pairs[m * 2];
    } else {
        *--p = (uint8_t)('0' + m);
    }
    if (v < 0)
        *--p = '-';
}

static int store_counter(struct c10d__store_table *t, struct entry *e, int64_t v, int wake)
{
    size_t n = i64_len(v);
    if (e->has_val && e->val && !e->watchers && n <= e->vcap) {
        /* A counter rewritten (every ADD but a key's first): what
         * store_value() does for a value that fits, minus the copy. */
        put_i64(v, n, e->val);
        t->value_bytes = t->value_bytes - e->vlen + n;
        e->vlen = n;
        e->ival = v;
        e->ival_ok = 1;
        if (wake)
            wake_all(t, e);
        return 0;
    }
    uint8_t text[24];
    put_i64(v, n, text);
    int rc =
        store_value(t, e, (struct c10d__wire_str){text, n}, (struct c10d__wire_str){NULL, 0}, 0);
    if (rc == 0) {
        e->ival = v;
        e->ival_ok = 1;
        /* After the count is known: parked BARRIERs compare against it. */
        if (wake)
            wake_all(t, e);
    }
    return rc;
}

/* The entry of `key` (created if missing) and its counter plus delta, with
 * one hash and one chain walk. */
static int counter_entry(struct c10d__store_table *t, struct c10d__wire_str key, int64_t delta,
                         struct entry **out, int64_t *v)
{
    uint64_t h = hash_key(t->seed, key.data, key.len);
    struct entry **pp = slot(t, key, h);
    if (counter_of(*pp, v) < 0 || __builtin_add_overflow(*v, delta, v))
        return C10D_EINVAL;
    if (*pp) {
        *out = *pp;
        return 0;
    }
    return create_at(t, pp, key, h, out);
}

int c10d__store_table_add(struct c10d__store_table *t, struct c10d__wire_str key, int64_t delta,
                          int64_t *result)
{
    drop_popped(t);
    int64_t v;
    struct entry *e;
    C10D_CHECK(counter_entry(t, key, delta, &e, &v));
    int rc = store_counter(t, e, v, 1);
    maybe_gc(t, e);
    if (rc == 0)
        *result = v;
    return rc;
}

static int str_eq(struct c10d__wire_str a, struct c10d__wire_str b)
{
    return a.len == b.len && (a.len == 0 || !memcmp(a.data, b.data, a.len));
}

int c10d__store_table_compare_set(struct c10d__store_table *t, struct c10d__wire_str key,
                                  struct c10d__wire_str expected, struct c10d__wire_str desired,
                                  struct c10d__wire_str *reply)
{
    drop_popped(t);
    struct entry *e = find(t, key);
    int has = e && e->has_val;
    if ((!has && expected.len == 0) || (has && str_eq(val_of(e), expected))) {
        C10D_CHECK(get_or_create(t, key, &e));
        int rc = store_value(t, e, desired, (struct c10d__wire_str){NULL, 0}, 1);
        maybe_gc(t, e);
        if (rc < 0)
            return rc;
        *reply = val_of(e);
        return 0;
    }
    *reply = has ? val_of(e) : expected;
    return 0;
}

int c10d__store_table_append(struct c10d__store_table *t, struct c10d__wire_str key,
                             struct c10d__wire_str value)
{
    drop_popped(t);
    struct entry *e;
    C10D_CHECK(get_or_create(t, key, &e));
    struct c10d__wire_str cur = e->has_val ? val_of(e) : (struct c10d__wire_str){NULL, 0};
    int rc = store_value(t, e, cur, value, 1);
    maybe_gc(t, e);
    return rc;
}

int c10d__store_table_delete(struct c10d__store_table *t, struct c10d__wire_str key)
{
    drop_popped(t);
    struct entry *e = find(t, key);
    if (!e || (!e->has_val && !e->qlen))
        return 0;
    /* A queue of that name goes too: CHECK and WAIT count a non-empty queue
     * as the key being present, so leaving its items would make a deleted
     * key still satisfy them. */
    if (e->qlen) {
        for (struct qitem *q = e->qhead; q;) {
            struct qitem *qn = q->next;
            t->value_bytes -= q->len;
            c10d__store_table_release(t, sizeof *q + q->len + ALLOC_OVERHEAD);
            free(q);
            q = qn;
        }
        t->queue_items -= e->qlen;
        t->queues--;
        e->qhead = e->qtail = NULL;
        e->qlen = 0;
    }
    if (!e->has_val) {
        maybe_gc(t, e);
        return 1;
    }
    struct c10d__wire_str old = val_of(e);
    e->has_val = 0;
    e->ival_ok = 0;
    t->keys--;
    t->value_bytes -= e->vlen + e->klen;
    if (e->watchers)
        notify_watchers(t, e, C10D_STORE_KEY_DELETED, old);
    if (e->vcap)
        c10d__store_table_release(t, e->vcap + ALLOC_OVERHEAD);
    free(e->val);
    e->val = NULL;
    e->vlen = e->vcap = 0;
    maybe_gc(t, e);
    return 1;
}

int c10d__store_table_barrier(struct c10d__store_table *t, struct c10d__store_client *client,
                              struct c10d__wire_str key, int64_t world_size)
{
    drop_popped(t);
    c10d__store_table_cancel_wait(t, client);
    int64_t v;
    struct entry *e;
    C10D_CHECK(counter_entry(t, key, 1, &e, &v));
    if (v >= world_size) {
        int rc = store_counter(t, e, v, 1); /* the last arrival wakes all */
        maybe_gc(t, e);
        return rc < 0 ? rc : 1;
    }
    int rc = register_wait(t, client, &e, 1);
    if (rc == 0) {
        client->wait->until = world_size;
        rc = store_counter(t, e, v, 0);
        if (rc < 0)
            c10d__store_table_cancel_wait(t, client);
    }
    maybe_gc(t, e);
    return rc;
}

/* ---------------------------------------------------------------- queues */

int c10d__store_table_queue_push(struct c10d__store_table *t, struct c10d__wire_str key,
                                 struct c10d__wire_str value)
{
    drop_popped(t);
    struct entry *e;
    C10D_CHECK(get_or_create(t, key, &e));
    size_t mem = sizeof(struct qitem) + value.len + ALLOC_OVERHEAD;
    if (value.len > SIZE_MAX - mem || c10d__store_table_charge(t, mem) < 0) {
        maybe_gc(t, e);
        return C10D_ENOMEM;
    }
    struct qitem *q = malloc(sizeof *q + value.len);
    if (!q) {
        c10d__store_table_release(t, mem);
        maybe_gc(t, e);
        return C10D_ENOMEM;
    }
    q->next = NULL;
    q->len = value.len;
    if (value.len)
        memcpy(q->data, value.data, value.len);
    if (e->qtail)
        e->qtail->next = q;
    else
        e->qhead = q;
    e->qtail = q;
    if (e->qlen++ == 0)
        t->queues++;
    t->queue_items++;
    t->value_bytes += value.len;
    wake_one(t, e);
    return 0;
}

int c10d__store_table_queue_pop(struct c10d__store_table *t, struct c10d__wire_str key,
                                int64_t *len_before, struct c10d__wire_str *value)
{
    drop_popped(t);
    struct entry *e = find(t, key);
    *len_before = e ? (int64_t)e->qlen : 0;
    *value = (struct c10d__wire_str){NULL, 0};
    if (!e || !e->qlen)
        return 0;
    struct qitem *q = e->qhead;
    e->qhead = q->next;
    if (!e->qhead)
        e->qtail = NULL;
    if (--e->qlen == 0)
        t->queues--;
    t->queue_items--;
    t->value_bytes -= q->len;
    t->popped = q;
    *value = (struct c10d__wire_str){q->data, q->len};
    maybe_gc(t, e);
    return 0;
}

size_t c10d__store_table_queue_front_len(struct c10d__store_table *t, struct c10d__wire_str key)
{
    struct entry *e = find(t, key);
    return e && e->qhead ? e->qhead->len : 0;
}

int64_t c10d__store_table_queue_len(struct c10d__store_table *t, struct c10d__wire_str key)
{
    drop_popped(t);
    struct entry *e = find(t, key);
    return e ? (int64_t)e->qlen : 0;
}

/* --------------------------------------------------------------- watches */

int c10d__store_table_watch(struct c10d__store_table *t, struct c10d__store_client *client,
                            struct c10d__wire_str key)
{
    drop_popped(t);
    struct entry *e;
    C10D_CHECK(get_or_create(t, key, &e));
    size_t mem = sizeof(struct c10d__store_watch) + ALLOC_OVERHEAD;
    if (c10d__store_table_charge(t, mem) < 0) {
        maybe_gc(t, e);
        return C10D_ENOMEM;
    }
    struct c10d__store_watch *w = calloc(1, sizeof *w);
    if (!w) {
        c10d__store_table_release(t, mem);
        maybe_gc(t, e);
        return C10D_ENOMEM;
    }
    w->e = e;
    w->client = client;
    w->next = e->watchers;
    if (e->watchers)
        e->watchers->prev = w;
    e->watchers = w;
    w->next_in_client = client->watches;
    client->watches = w;
    t->watchers++;
    return 0;
}

void c10d__store_table_client_gone(struct c10d__store_table *t, struct c10d__store_client *client)
{
    c10d__store_table_cancel_wait(t, client);
    if (client->owed_wake != NULL)
        settle_owed(t, client, 0);
    struct c10d__store_watch *w = client->watches;
    client->watches = NULL;
    while (w) {
        struct c10d__store_watch *next = w->next_in_client;
        struct entry *e = w->e;
        if (w->prev)
            w->prev->next = w->next;
        else
            e->watchers = w->next;
        if (w->next)
            w->next->prev = w->prev;
        free(w);
        c10d__store_table_release(t, sizeof *w + ALLOC_OVERHEAD);
        t->watchers--;
        maybe_gc(t, e);
        w = next;
    }
}

/* ------------------------------------------------------------- the table */

int c10d__store_table_create(const struct c10d__store_table_cbs *cbs, size_t max_memory,
                             struct c10d__store_table **out)
{
    struct c10d__store_table *t = calloc(1, sizeof *t);
    if (!t)
        return c10d__fail(C10D_ENOMEM, "store table: out of memory");
    if (cbs)
        t->cbs = *cbs;
    t->nbuckets = 64;
    t->buckets = calloc(t->nbuckets, sizeof *t->buckets);
    if (!t->buckets) {
        free(t);
        return c10d__fail(C10D_ENOMEM, "store table: out of memory");
    }
    t->memory_limit = max_memory;
    t->memory = sizeof *t + t->nbuckets * sizeof *t->buckets;
    uint64_t seed;
    if (getrandom(&seed, sizeof seed, GRND_NONBLOCK) != (ssize_t)sizeof seed)
        seed = (uint64_t)time(NULL) ^ (uint64_t)(uintptr_t)t;
    t->seed = seed;
    *out = t;
    return 0;
}

void c10d__store_table_free(struct c10d__store_table *t)
{
    if (!t)
        return;
    drop_popped(t);
    for (size_t i = 0; i < t->nbuckets; i++) {
        struct entry *e = t->buckets[i];
        while (e) {
            struct entry *next = e->next;
            /* Waits and watches are owned by clients; detach them. */
            for (struct link *l = e->wfirst; l;) {
                struct link *ln = l->next;
                struct c10d__store_wait *w = l->w;
                unlink_link(l);
                if (--w->missing == 0) {
                    if (w->client && w->client->wait == w)
                        w->client->wait = NULL;
                    free(w);
                }
                l = ln;
            }
            for (struct c10d__store_watch *w = e->watchers; w;) {
                struct c10d__store_watch *wn = w->next;
                /* The client's list still names it: clear it wholesale. */
                if (w->client)
                    w->client->watches = NULL;
                free(w);
                w = wn;
            }
            for (struct qitem *q = e->qhead; q;) {
                struct qitem *qn = q->next;
                free(q);
                q = qn;
            }
            free(e->val);
            free(e);
            e = next;
        }
    }
    free(t->buckets);
    free(t);
}

size_t c10d__store_table_num_keys(const struct c10d__store_table *t)
{
    return t->keys;
}

int c10d__store_table_foreach_key(struct c10d__store_table *t,
                                  int (*fn)(void *arg, struct c10d__wire_str key), void *arg)
{
    drop_popped(t);
    for (size_t i = 0; i < t->nbuckets; i++)
        for (struct entry *e = t->buckets[i]; e; e = e->next)
            if (e->has_val) {
                int rc = fn(arg, key_of(e));
                if (rc)
                    return rc;
            }
    return 0;
}

void c10d__store_table_get_stats(const struct c10d__store_table *t,
                                 struct c10d__store_table_stats *st)
{
    st->keys = t->keys;
    st->queues = t->queues;
    st->queue_items = t->queue_items;
    st->value_bytes = t->value_bytes;
    st->memory = t->memory;
    st->memory_limit = t->memory_limit;
    st->waiters = t->waiters;
    st->watchers = t->watchers;
}
