/* Snapshot files in a store directory: escaping, atomic writes, the active
 * pointer, and the shared-flock reader lease. See snapfile.h for the
 * invariants; every data write and flush goes through tv__sys. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "store/snapfile.h"
#include "util/sha256.h"
#include "util/sys.h"

#define HASHED_PREFIX_MAX 128
#define OPEN_ATTEMPTS     8

static atomic_uint g_tmp_counter;

/* ---- names and paths ---------------------------------------------------- */

static bool needs_escape(unsigned char c, size_t pos)
{
    return c == '/' || c == '%' || c < 0x20 || c == 0x7f || (pos == 0 && c == '.');
}

int tv__snapfile_escape(const char *model, char *out, size_t out_len, tv_error *err)
{
    static const char hex[] = "0123456789ABCDEF";
    if (!model || !model[0] || !out)
        return tv__seterr(err, TV_E_INVALID_ARG, "snapshot file: NULL or empty model name");
    size_t n = strlen(model), o = 0;
    size_t full = 0;
    for (size_t i = 0; i < n; i++)
        full += needs_escape((unsigned char)model[i], i) ? 3 : 1;
    bool hashed = full > TV__SNAPFILE_ESCAPED_MAX;
    size_t limit = hashed ? HASHED_PREFIX_MAX : full;
    size_t need = (hashed ? HASHED_PREFIX_MAX + 2 + 64 : full) + 1;
    if (out_len < need)
        return tv__seterr(err, -ENAMETOOLONG, "snapshot file: escaped model name needs %zu bytes",
                          need);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)model[i];
        size_t w = needs_escape(c, i) ? 3 : 1;
        if (o + w > limit)
            break; /* hashed form: never split a %XX triple */
        if (w == 3) {
            out[o++] = '%';
            out[o++] = hex[c >> 4];
            out[o++] = hex[c & 15];
        } else {
            out[o++] = (char)c;
        }
    }
    if (hashed) {
        uint8_t sum[32];
        tv__sha256 h;
        if (tv__sha256_init(&h))
            return tv__seterr(err, -ENOMEM, "out of memory");
        tv__sha256_update(&h, model, n);
        tv__sha256_final(&h, sum);
        out[o++] = '%';
        out[o++] = '~';
        tv__hex(sum, sizeof sum, out + o);
        o += 64;
    }
    out[o] = '\0';
    return 0;
}

static int fmt_path(char *out, size_t out_len, tv_error *err, const char *fmt, ...) TV_PRINTF(4, 5);
static int fmt_path(char *out, size_t out_len, tv_error *err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(out, out_len, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= out_len)
        return tv__seterr(err, -ENAMETOOLONG, "snapshot file: path too long");
    return 0;
}

int tv__snapfile_model_dir(const char *dir, const char *model, char *out, size_t out_len,
                           tv_error *err)
{
    char esc[TV__SNAPFILE_ESCAPED_MAX + 1];
    if (!dir || !out)
        return tv__seterr(err, TV_E_INVALID_ARG, "snapshot file: NULL argument");
    int rc = tv__snapfile_escape(model, esc, sizeof esc, err);
    if (rc)
        return rc;
    return fmt_path(out, out_len, err, "%s/%s/%s", dir, TV__SNAPFILE_DIR, esc);
}

int tv__snapfile_path(const char *dir, const char *model, int64_t gen, char *out, size_t out_len,
                      tv_error *err)
{
    char md[TV__SNAPFILE_PATH_MAX];
    if (gen <= 0)
        return tv__seterr(err, TV_E_INVALID_ARG, "snapshot file: generation %lld is not positive",
                          (long long)gen);
    int rc = tv__snapfile_model_dir(dir, model, md, sizeof md, err);
    if (rc)
        return rc;
    return fmt_path(out, out_len, err, "%s/%" PRId64 "%s", md, gen, TV__SNAPFILE_EXT);
}

int tv__snapfile_active_path(const char *dir, const char *model, char *out, size_t out_len,
                             tv_error *err)
{
    char md[TV__SNAPFILE_PATH_MAX];
    int rc = tv__snapfile_model_dir(dir, model, md, sizeof md, err);
    if (rc)
        return rc;
    return fmt_path(out, out_len, err, "%s/%s", md, TV__SNAPFILE_ACTIVE);
}

int tv__snapfile_exists(const char *dir, const char *model, int64_t gen, bool *exists,
                        tv_error *err)
{
    char p[TV__SNAPFILE_PATH_MAX];
    struct stat sb;
    if (!exists)
        return tv__seterr(err, TV_E_INVALID_ARG, "snapshot file: NULL argument");
    int rc = tv__snapfile_path(dir, model, gen, p, sizeof p, err);
    if (rc)
        return rc;
    if (stat(p, &sb) == 0) {
        *exists = true;
        return 0;
    }
    if (errno == ENOENT) {
        *exists = false;
        return 0;
    }
    return tv__seterr(err, -errno, "%s: %s", p, strerror(errno));
}

/* ---- durable file operations ------------------------------------------- */

static int fsync_dir(const char *path, tv_error *err)
{
    int fd = tv__sys.open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
    if (fd < 0)
        return tv__seterr(err, -errno, "open %s: %s", path, strerror(errno));
    int rc = 0;
    if (tv__sys.fsync(fd) < 0)
        rc = tv__seterr(err, -errno, "fsync %s: %s", path, strerror(errno));
    tv__sys.close(fd);
    return rc;
}

/* mkdir path (mode 0755); when it was created, fsync its parent so the new
 * entry survives a crash. */
static int make_dir(const char *path, const char *parent, tv_error *err)
{
    if (tv__sys.mkdir(path, 0755) == 0)
        return fsync_dir(parent, err);
    if (errno == EEXIST)
        return 0;
    return tv__seterr(err, -errno, "mkdir %s: %s", path, strerror(errno));
}

static int ensure_model_dir(const char *dir, const char *model, char *md, size_t md_len,
                            tv_error *err)
{
    char top[TV__SNAPFILE_PATH_MAX];
    int rc;
    if ((rc = tv__snapfile_model_dir(dir, model, md, md_len, err)) ||
        (rc = fmt_path(top, sizeof top, err, "%s/%s", dir, TV__SNAPFILE_DIR)) ||
        (rc = make_dir(top, dir, err)) || (rc = make_dir(md, top, err)))
        return rc;
    return 0;
}

static int write_all(int fd, const void *buf, size_t len, const char *path, tv_error *err)
{
    const uint8_t *p = buf;
    size_t done = 0;
    while (done < len) {
        ssize_t n = tv__sys.pwrite(fd, p + done, len - done, (off_t)done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return tv__seterr(err, -errno, "write %s: %s", path, strerror(errno));
        if (n == 0)
            return tv__seterr(err, -EIO, "write %s: no progress at byte %zu", path, done);
        done += (size_t)n;
    }
    return 0;
}

/* Writes buf to a new temporary file in md and flushes it; *tmp gets its
 * path. */
static int write_temp(const char *md, const char *tag, const void *buf, size_t len, char *tmp,
                      size_t tmp_len, tv_error *err)
{
    int fd = -1, rc;
    for (int tries = 0; fd < 0; tries++) {
        unsigned c = atomic_fetch_add(&g_tmp_counter, 1);
        if ((rc = fmt_path(tmp, tmp_len, err, "%s/%s%s-%ld-%u", md, TV__SNAPFILE_TMP_PREFIX, tag,
                           (long)getpid(), c)))
            return rc;
        fd = tv__sys.open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd < 0 && (errno != EEXIST || tries > 100))
            return tv__seterr(err, -errno, "create %s: %s", tmp, strerror(errno));
    }
    if ((rc = write_all(fd, buf, len, tmp, err)))
        goto fail;
    while ((rc = tv__sys.fdatasync(fd)) < 0 && errno == EINTR)
        ;
    if (rc < 0) {
        rc = tv__seterr(err, -errno, "fdatasync %s: %s", tmp, strerror(errno));
        goto fail;
    }
    if (close(fd) < 0) {
        fd = -1;
        rc = tv__seterr(err, -errno, "close %s: %s", tmp, strerror(errno));
        goto fail;
    }
    return 0;
fail:
    if (fd >= 0)
        close(fd);
    tv__sys.unlink(tmp);
    return rc;
}

/* rename(2) that never replaces: RENAME_NOREPLACE, or link + unlink where
 * the filesystem lacks it. */
static int rename_noreplace(const char *from, const char *to)
{
    if (tv__sys.rename_noreplace(from, to) == 0)
        return 0;
    if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP)
        return -errno;
    if (tv__sys.link(from, to) < 0)
        return -errno;
    tv__sys.unlink(from);
    return 0;
}

int tv__snapfile_write(const char *dir, const char *model, int64_t gen, const void *buf, size_t len,
                       tv_error *err)
{
    char md[TV__SNAPFILE_PATH_MAX], p[TV__SNAPFILE_PATH_MAX], tmp[TV__SNAPFILE_PATH_MAX];
    char tag[32];
    int rc;
    if (!buf || len == 0)
        return tv__seterr(err, TV_E_INVALID_ARG, "snapshot file: empty image");
    if ((rc = tv__snapfile_path(dir, model, gen, p, sizeof p, err)) ||
        (rc = ensure_model_dir(dir, model, md, sizeof md, err)))
        return rc;
    snprintf(tag, sizeof tag, "%" PRId64, gen);
    if ((rc = write_temp(md, tag, buf, len, tmp, sizeof tmp, err)))
        return rc;
    if ((rc = rename_noreplace(tmp, p))) {
        tv__sys.unlink(tmp);
        if (rc == -EEXIST)
            return tv__seterr(err, rc, "%s already exists (snapshots are immutable)", p);
        return tv__seterr(err, rc, "rename %s -> %s: %s", tmp, p, strerror(-rc));
    }
    return fsync_dir(md, err);
}

int tv__snapfile_write_active(const char *dir, const char *model, int64_t gen, tv_error *err)
{
    char md[TV__SNAPFILE_PATH_MAX], p[TV__SNAPFILE_PATH_MAX], tmp[TV__SNAPFILE_PATH_MAX];
    char text[32];
    int rc;
    if (gen < 0)
        return tv__seterr(err, TV_E_INVALID_ARG, "snapshot file: active generation %lld",
                          (long long)gen);
    if ((rc = tv__snapfile_active_path(dir, model, p, sizeof p, err)))
        return rc;
    if (gen == 0) {
        if (tv__sys.unlink(p) < 0) {
            if (errno == ENOENT)
                return 0;
            return tv__seterr(err, -errno, "unlink %s: %s", p, strerror(errno));
        }
        if ((rc = tv__snapfile_model_dir(dir, model, md, sizeof md, err)))
            return rc;
        return fsync_dir(md, err);
    }
    if ((rc = ensure_model_dir(dir, model, md, sizeof md, err)))
        return rc;
    int n = snprintf(text, sizeof text, "%" PRId64 "\n", gen);
    if ((rc = write_temp(md, "active", text, (size_t)n, tmp, sizeof tmp, err)))
        return rc;
    if (tv__sys.rename(tmp, p) < 0) {
        rc = tv__seterr(err, -errno, "rename %s -> %s: %s", tmp, p, strerror(errno));
        tv__sys.unlink(tmp);
        return rc;
    }
    return fsync_dir(md, err);
}

int tv__snapfile_read_active(const char *dir, const char *model, int64_t *gen, tv_error *err)
{
    char p[TV__SNAPFILE_PATH_MAX], text[32];
    int rc;
    if (!gen)
        return tv__seterr(err, TV_E_INVALID_ARG, "snapshot file: NULL argument");
    if ((rc = tv__snapfile_active_path(dir, model, p, sizeof p, err)))
        return rc;
    int fd = open(p, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT)
            return tv__seterr(err, TV_E_NOT_FOUND, "model '%s' has no active generation", model);
        return tv__seterr(err, -errno, "open %s: %s", p, strerror(errno));
    }
    ssize_t n;
    while ((n = read(fd, text, sizeof text - 1)) < 0 && errno == EINTR)
        ;
    int e = errno;
    close(fd);
    if (n < 0)
        return tv__seterr(err, -e, "read %s: %s", p, strerror(e));
    text[n] = '\0';
    int64_t v = 0;
    ssize_t i = 0;
    for (; i < n && text[i] >= '0' && text[i] <= '9'; i++) {
        if (v > (INT64_MAX - (text[i] - '0')) / 10) {
            v = -1;
            break;
        }
        v = v * 10 + (text[i] - '0');
    }
    if (i < n && text[i] == '\n')
        i++;
    if (v <= 0 || i != n || text[0] == '0')
        return tv__seterr(err, TV_E_SNAPSHOT, "%s: not a generation number", p);
    *gen = v;
    return 0;
}

/* ---- readers and gc ----------------------------------------------------- */

static int flock_retry(int fd, int op)
{
    int rc;
    while ((rc = flock(fd, op)) < 0 && errno == EINTR)
        ;
    return rc;
}

/* True when fd is still the file named by path (not unlinked by gc nor
 * replaced). */
static bool still_linked(int fd, const char *path)
{
    struct stat a, b;
    if (fstat(fd, &a) < 0 || a.st_nlink == 0 || stat(path, &b) < 0)
        return false;
    return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

static int read_whole(int fd, const char *path, void **buf, size_t *len, tv_error *err)
{
    struct stat sb;
    if (fstat(fd, &sb) < 0)
        return tv__seterr(err, -errno, "fstat %s: %s", path, strerror(errno));
    if (!S_ISREG(sb.st_mode))
        return tv__seterr(err, TV_E_SNAPSHOT, "%s is not a regular file", path);
    if (sb.st_size < 0 || (uint64_t)sb.st_size > TV__SNAPFILE_MAX_LEN)
        return tv__seterr(err, TV_E_SNAPSHOT, "%s: %lld bytes, over the %llu-byte limit", path,
                          (long long)sb.st_size, (unsigned long long)TV__SNAPFILE_MAX_LEN);
    size_t n = (size_t)sb.st_size, done = 0;
    uint8_t *p = malloc(n ? n : 1);
    if (!p)
        return tv__seterr(err, -ENOMEM, "out of memory (%zu bytes)", n);
    while (done < n) {
        ssize_t r = tv__sys.pread(fd, p + done, n - done, (off_t)done);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            int e = errno;
            free(p);
            return tv__seterr(err, -e, "read %s: %s", path, strerror(e));
        }
        if (r == 0) {
            free(p);
            return tv__seterr(err, TV_E_SNAPSHOT, "%s: truncated at %zu of %zu bytes", path, done,
                              n);
        }
        done += (size_t)r;
    }
    *buf = p;
    *len = n;
    return 0;
}

int tv__snapfile_open(const char *dir, const char *model, int64_t gen, int *fd_out, void **buf,
                      size_t *len, tv_error *err)
{
    char p[TV__SNAPFILE_PATH_MAX];
    int rc;
    if (!fd_out || !buf || !len || gen < 0)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__snapfile_open: bad argument");
    *fd_out = -1;
    *buf = NULL;
    *len = 0;
    for (int attempt = 0; attempt < OPEN_ATTEMPTS; attempt++) {
        int64_t g = gen;
        if (gen == 0 && (rc = tv__snapfile_read_active(dir, model, &g, err)))
            return rc;
        if ((rc = tv__snapfile_path(dir, model, g, p, sizeof p, err)))
            return rc;
        int fd = open(p, O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            if (errno != ENOENT)
                return tv__seterr(err, -errno, "open %s: %s", p, strerror(errno));
            int64_t now;
            if (gen == 0 && tv__snapfile_read_active(dir, model, &now, NULL) == 0 && now != g)
                continue; /* activation and gc raced with us: follow the pointer */
            return tv__seterr(err, TV_E_NOT_FOUND,
                              "model '%s' generation %lld has no snapshot "
                              "(%s)",
                              model, (long long)g, p);
        }
        if (flock_retry(fd, LOCK_SH) < 0) {
            rc = tv__seterr(err, -errno, "flock %s: %s", p, strerror(errno));
            close(fd);
            return rc;
        }
        if (!still_linked(fd, p)) {
            close(fd); /* gc removed it between our open and our lock */
            continue;
        }
        if ((rc = read_whole(fd, p, buf, len, err))) {
            close(fd);
            return rc;
        }
        *fd_out = fd;
        return 0;
    }
    return tv__seterr(err, TV_E_NOT_FOUND, "model '%s': snapshot kept disappearing while opening",
                      model);
}

int tv__snapfile_try_exclusive(const char *dir, const char *model, int64_t gen, bool *leased,
                               tv_error *err)
{
    char p[TV__SNAPFILE_PATH_MAX];
    int rc;
    if (!leased)
        return tv__seterr(err, TV_E_INVALID_ARG, "snapshot file: NULL argument");
    if ((rc = tv__snapfile_path(dir, model, gen, p, sizeof p, err)))
        return rc;
    int fd = open(p, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno != ENOENT)
            return tv__seterr(err, -errno, "open %s: %s", p, strerror(errno));
        *leased = false;
        return 0;
    }
    if (flock_retry(fd, LOCK_EX | LOCK_NB) < 0) {
        int e = errno;
        close(fd);
        if (e != EWOULDBLOCK)
            return tv__seterr(err, -e, "flock %s: %s", p, strerror(e));
        *leased = true;
        return 0;
    }
    close(fd); /* releases the lock */
    *leased = false;
    return 0;
}

int tv__snapfile_remove(const char *dir, const char *model, int64_t gen, tv_error *err)
{
    char md[TV__SNAPFILE_PATH_MAX], p[TV__SNAPFILE_PATH_MAX];
    int rc;
    if ((rc = tv__snapfile_path(dir, model, gen, p, sizeof p, err)) ||
        (rc = tv__snapfile_model_dir(dir, model, md, sizeof md, err)))
        return rc;
    for (int attempt = 0; attempt < OPEN_ATTEMPTS; attempt++) {
        int fd = open(p, O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            if (errno == ENOENT)
                return 0;
            return tv__seterr(err, -errno, "open %s: %s", p, strerror(errno));
        }
        if (flock_retry(fd, LOCK_EX | LOCK_NB) < 0) {
            int e = errno;
            close(fd);
            if (e == EWOULDBLOCK)
                return tv__seterr(err, TV_E_LEASED,
                                  "model '%s' generation %lld: snapshot is "
                                  "held by a reader",
                                  model, (long long)gen);
            return tv__seterr(err, -e, "flock %s: %s", p, strerror(e));
        }
        if (!still_linked(fd, p)) {
            close(fd);
            continue;
        }
        /* Unlink while holding the lock: a reader that opened the file
         * before this point sees link count 0 once it gets its lock. */
        if (tv__sys.unlink(p) < 0) {
            rc = tv__seterr(err, -errno, "unlink %s: %s", p, strerror(errno));
            close(fd);
            return rc;
        }
        close(fd);
        return fsync_dir(md, err);
    }
    return tv__seterr(err, -EAGAIN, "%s kept changing while removing it", p);
}

int tv__snapfile_clean_temps(const char *dir, const char *model, size_t *n, tv_error *err)
{
    char md[TV__SNAPFILE_PATH_MAX], p[TV__SNAPFILE_PATH_MAX];
    size_t count = 0;
    int rc;
    if (n)
        *n = 0;
    if ((rc = tv__snapfile_model_dir(dir, model, md, sizeof md, err)))
        return rc;
    DIR *d = opendir(md);
    if (!d) {
        if (errno == ENOENT)
            return 0;
        return tv__seterr(err, -errno, "opendir %s: %s", md, strerror(errno));
    }
    struct dirent *e;
    size_t plen = strlen(TV__SNAPFILE_TMP_PREFIX);
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, TV__SNAPFILE_TMP_PREFIX, plen) != 0)
            continue;
        if (fmt_path(p, sizeof p, NULL, "%s/%s", md, e->d_name) == 0 && tv__sys.unlink(p) == 0)
            count++;
    }
    closedir(d);
    if (count && (rc = fsync_dir(md, err)))
        return rc;
    if (n)
        *n = count;
    return 0;
}
