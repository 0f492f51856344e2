/* FileStore: processes on one host share an append-only log of the requests
 * that changed the store, encoded with the TCPStore codec (current dialect).
 * Each process replays the log into its own table, so ADD, COMPARE_SET and
 * queue pops give every process the same answers. Every op runs under an
 * exclusive flock(): refresh (replay what others appended), run, append.
 * The lock is only ever tried (LOCK_NB): while another process holds it, ops
 * park and retry, bounded by their deadlines. Waits poll the file's size.
 *
 * As torch's FileStore, with world_size > 0 the last of world_size users to
 * release the store removes the file (a hidden counter in the log). */
#include "store_local.h"

#include "engine/log.h"
#include "store_server/table/table.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define POLL_MS 10
/* Contains a NUL, which keys from the API cannot: no user can touch it. */
#define CLEANUP_KEY "\0c10d/cleanup"
#define CLEANUP_LEN (sizeof CLEANUP_KEY - 1)

struct file_store {
    struct c10d__local_store ls;
    int fd;
    uint64_t pos; /* log bytes replayed into the table */
    uint64_t size;
    int resync; /* the table may differ from the log: replay from 0 */
    int world_size;
    char path[];
};

static int reset_table(struct file_store *fs)
{
    struct c10d__store_table *t;
    C10D_CHECK(c10d__store_table_create(NULL, 0, &t));
    c10d__store_table_free(fs->ls.table);
    fs->ls.table = t;
    fs->pos = 0;
    fs->resync = 0;
    return 0;
}

/* Replays [pos, EOF). A trailing partial record (a writer died mid-write)
 * is left unread; the next writer truncates it. */
static int refresh(struct file_store *fs)
{
    struct stat st;
    if (fstat(fs->fd, &st) < 0)
        return c10d__fail(C10D_EIO, "file store %s: fstat: %s", fs->path, strerror(errno));
    if (fs->resync || (uint64_t)st.st_size < fs->pos)
        C10D_CHECK(reset_table(fs));
    fs->size = (uint64_t)st.st_size;
    if (fs->size == fs->pos)
        return 0;
    size_t len = (size_t)(fs->size - fs->pos);
    uint8_t *buf = malloc(len);
    if (!buf)
        return c10d__fail(C10D_ENOMEM, "file store %s: out of memory for %zu bytes of log",
                          fs->path, len);
    size_t got = 0;
    while (got < len) {
        ssize_t n = pread(fs->fd, buf + got, len - got, (off_t)(fs->pos + got));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            free(buf);
            return c10d__fail(C10D_EIO, "file store %s: read: %s", fs->path,
                              n < 0 ? strerror(errno) : "unexpected end of file");
        }
        got += (size_t)n;
    }
    struct c10d__wire_parser p;
    struct c10d__wire_codec_limits lim = {0};
    c10d__wire_parser_init(&p, &lim);
    p.dialect = C10D_STORE_DIALECT_CURRENT;
    size_t off = 0;
    int rc = 0;
    while (off < len) {
        struct c10d__wire_request req;
        size_t used = 0;
        rc = c10d__wire_parse_request(&p, buf + off, len - off, &req, &used);
        if (rc == C10D_STORE_PARSE_MORE) {
            rc = 0;
            break;
        }
        if (rc < 0) {
            rc = c10d__fail(C10D_EPROTO, "file store %s: corrupt log at byte %llu: %s", fs->path,
                            (unsigned long long)(fs->pos + off), p.error);
            break;
        }
        /* A failing record failed for its writer too, who did not log it;
         * so this cannot happen short of a corrupt file. */
        if (c10d__local_store_apply(fs->ls.table, &req) < 0)
            C10D_WARN("store", "file store %s: record at byte %llu: %s", fs->path,
                      (unsigned long long)(fs->pos + off), c10d_last_error());
        off += used;
        rc = 0;
    }
    c10d__wire_parser_free(&p);
    free(buf);
    fs->pos += off;
    return rc;
}

static int file_begin(struct c10d__local_store *ls)
{
    struct file_store *fs = (struct file_store *)ls;
    if (flock(fs->fd, LOCK_EX | LOCK_NB) < 0) {
        if (errno == EWOULDBLOCK || errno == EINTR)
            return 1;
        return c10d__fail(C10D_EIO, "file store %s: flock: %s", fs->path, strerror(errno));
    }
    int rc = refresh(fs);
    if (rc < 0)
        flock(fs->fd, LOCK_UN);
    return rc;
}

static int file_commit(struct c10d__local_store *ls, const struct c10d__wire_request *req)
{
    struct file_store *fs = (struct file_store *)ls;
    struct c10d__wire_buf b = {0};
    int rc = c10d__wire_encode_request(&b, C10D_STORE_DIALECT_CURRENT, req);
    if (rc == 0 && fs->size > fs->pos && ftruncate(fs->fd, (off_t)fs->pos) < 0)
        rc = c10d__fail(C10D_EIO, "file store %s: truncate a partial record: %s", fs->path,
                        strerror(errno));
    size_t done = 0;
    while (rc == 0 && done < b.len) {
        ssize_t n = pwrite(fs->fd, b.data + done, b.len - done, (off_t)(fs->pos + done));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            rc = c10d__fail(C10D_EIO, "file store %s: write: %s", fs->path, strerror(errno));
        else
            done += (size_t)n;
    }
    c10d__wire_buf_free(&b);
    if (rc < 0) {
        /* Our table already holds the change: rebuild it from the log. */
        fs->resync = 1;
        return rc;
    }
    fs->pos += done;
    fs->size = fs->pos;
    return 0;
}

static void file_end(struct c10d__local_store *ls)
{
    struct file_store *fs = (struct file_store *)ls;
    flock(fs->fd, LOCK_UN);
}

static int file_changed(struct c10d__local_store *ls)
{
    struct file_store *fs = (struct file_store *)ls;
    struct stat st;
    return fstat(fs->fd, &st) < 0 || (uint64_t)st.st_size != fs->pos;
}

/* The last of world_size users removes the file. May run on any thread, so
 * it locks with a bounded retry rather than through the loop. */
static void cleanup(struct file_store *fs)
{
    int locked = 0;
    for (int i = 0; i < 5000 && !locked; i++) {
        locked = flock(fs->fd, LOCK_EX | LOCK_NB) == 0;
        if (!locked)
            usleep(1000);
    }
    if (!locked) {
        C10D_WARN("store", "file store %s: could not lock it to count users; leaving it", fs->path);
        return;
    }
    struct c10d__wire_str key = {(const uint8_t *)CLEANUP_KEY, CLEANUP_LEN};
    struct c10d__wire_request req = {.cmd = C10D_STORE_ADD, .i64 = 1, .nargs = 1, .args = &key};
    int64_t done = 0;
    if (refresh(fs) == 0 && c10d__store_table_add(fs->ls.table, key, 1, &done) == 0 &&
        file_commit(&fs->ls, &req) == 0 && done >= fs->world_size)
        unlink(fs->path);
    flock(fs->fd, LOCK_UN);
}

static void file_destroy(struct c10d__local_store *ls)
{
    struct file_store *fs = (struct file_store *)ls;
    if (fs->world_size > 0)
        cleanup(fs);
    close(fs->fd);
}

static const struct c10d__local_hooks file_hooks = {
    .begin = file_begin,
    .commit = file_commit,
    .end = file_end,
    .changed = file_changed,
    .destroy = file_destroy,
    .poll_ms = POLL_MS,
};

int c10d_store_file_open(const char *path, int world_size, c10d_store **out)
{
    if (!path || !*path || !out)
        return c10d__fail(C10D_EINVAL, "store file_open: %s",
                          !out ? "out is NULL" : "path is empty or NULL");
    if (world_size < 0)
        return c10d__fail(C10D_EINVAL, "store file_open: world_size must be >= 0 (got %d)",
                          world_size);
    size_t n = strlen(path);
    struct file_store *fs = calloc(1, sizeof *fs + n + 1);
    if (!fs)
        return c10d__fail(C10D_ENOMEM, "store file_open: out of memory");
    memcpy(fs->path, path, n + 1);
    fs->world_size = world_size;
    fs->fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fs->fd < 0) {
        int err = errno;
        free(fs);
        return c10d__fail(C10D_EIO, "store file_open: cannot open %s: %s", path, strerror(err));
    }
    int rc = c10d__local_store_init(&fs->ls, &c10d__file_store_vtable, &file_hooks);
    if (rc < 0) {
        close(fs->fd);
        free(fs);
        return rc;
    }
    fs->ls.hidden_key = CLEANUP_KEY;
    fs->ls.hidden_len = CLEANUP_LEN;
    *out = &fs->ls.base;
    return 0;
}
