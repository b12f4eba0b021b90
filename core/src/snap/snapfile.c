/* Snapshot files in a store directory: escaping, atomic writes, the active
 * pointer, and the shared-flock reader lease. See snapfile.h for the
 * invariants; every open, write, flush, rename, link, unlink, mkdir, fstat,
 * flock, mmap and munmap goes through tv__sys. */
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
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "snap/snapfile.h"
#include "util/hex.h"
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
            tv__hex_encode(&c, 1, true, out + o); /* its NUL is overwritten next */
            o += 2;
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
        tv__hex_encode(sum, sizeof sum, false, out + o);
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
    if (lstat(p, &sb) == 0) { /* a link, FIFO or directory there is no snapshot */
        *exists = S_ISREG(sb.st_mode);
        return 0;
    }
    if (errno == ENOENT) {
        *exists = false;
        return 0;
    }
    return tv__seterr(err, -errno, "%s: %s", p, strerror(errno));
}

/* ---- safe opening ------------------------------------------------------- */

/* path must be a real directory, not a symbolic link (O_NOFOLLOW |
 * O_DIRECTORY): a link planted in place of DIR/snapshots or a model
 * directory would send reads and writes elsewhere. -ENOENT passes through
 * (absent is the caller's business). */
static int check_dir(const char *path, tv_error *err)
{
    int fd = tv__sys_open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC, 0);
    if (fd == -ENOENT)
        return fd;
    if (fd == -ELOOP || fd == -ENOTDIR)
        return tv__seterr(err, TV_E_SNAPSHOT, "%s is a symbolic link or not a directory (refused)",
                          path);
    if (fd < 0)
        return tv__seterr(err, fd, "open %s: %s", path, strerror(-fd));
    tv__sys.close(fd);
    return 0;
}

/* Both directories above a model's files: DIR/snapshots and the model's. */
static int check_dirs(const char *dir, const char *model, tv_error *err)
{
    char top[TV__SNAPFILE_PATH_MAX], md[TV__SNAPFILE_PATH_MAX];
    int rc;
    if ((rc = fmt_path(top, sizeof top, err, "%s/%s", dir, TV__SNAPFILE_DIR)) ||
        (rc = tv__snapfile_model_dir(dir, model, md, sizeof md, err)) || (rc = check_dir(top, err)))
        return rc;
    return check_dir(md, err);
}

/* Opens a snapshot file or pointer for reading without following a symbolic
 * link (O_NOFOLLOW), without blocking on a FIFO (O_NONBLOCK) and only when
 * it is a regular file (fstat). Returns the fd; -ENOENT (absent, or a
 * directory above it is absent); TV_E_SNAPSHOT (a symbolic link, FIFO,
 * directory, device or socket in its place, or in place of a directory);
 * -errno. */
static int open_regular(const char *dir, const char *model, const char *path, tv_error *err)
{
    struct stat sb;
    int rc = check_dirs(dir, model, err);
    if (rc)
        return rc;
    int fd = tv__sys_open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0);
    if (fd == -ENOENT)
        return fd;
    if (fd == -ELOOP)
        return tv__seterr(err, TV_E_SNAPSHOT, "%s is a symbolic link (refused)", path);
    if (fd < 0)
        return tv__seterr(err, fd, "open %s: %s", path, strerror(-fd));
    if (tv__sys.fstat(fd, &sb) < 0) {
        rc = tv__seterr(err, -errno, "fstat %s: %s", path, strerror(errno));
        tv__sys.close(fd);
        return rc;
    }
    if (!S_ISREG(sb.st_mode)) {
        tv__sys.close(fd);
        return tv__seterr(err, TV_E_SNAPSHOT, "%s is not a regular file (%s; refused)", path,
                          S_ISDIR(sb.st_mode)    ? "a directory"
                          : S_ISFIFO(sb.st_mode) ? "a FIFO"
                          : S_ISSOCK(sb.st_mode) ? "a socket"
                                                 : "a device");
    }
    return fd;
}

/* ---- durable file operations ------------------------------------------- */

static int fsync_dir(const char *path, tv_error *err)
{
    int rc = tv__sys_fsync_dir(path);
    if (rc)
        return tv__seterr(err, rc, "fsync %s: %s", path, strerror(-rc));
    return 0;
}

/* mkdir path (mode 0755); when it was created, fsync its parent so the new
 * entry survives a crash; when it exists it must be a real directory. */
static int make_dir(const char *path, const char *parent, tv_error *err)
{
    if (tv__sys.mkdir(path, 0755) == 0)
        return fsync_dir(parent, err);
    if (errno == EEXIST)
        return check_dir(path, err);
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
        fd = tv__sys_open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
        if (fd < 0 && (fd != -EEXIST || tries > 100))
            return tv__seterr(err, fd, "create %s: %s", tmp, strerror(-fd));
    }
    if ((rc = tv__sys_pwrite_full(fd, buf, len, 0))) {
        rc = tv__seterr(err, rc, "write %s: %s", tmp, strerror(-rc));
        goto fail;
    }
    if ((rc = tv__sys_fdatasync(fd))) {
        rc = tv__seterr(err, rc, "fdatasync %s: %s", tmp, strerror(-rc));
        goto fail;
    }
    if (tv__sys.close(fd) < 0) {
        fd = -1;
        rc = tv__seterr(err, -errno, "close %s: %s", tmp, strerror(errno));
        goto fail;
    }
    return 0;
fail:
    if (fd >= 0)
        tv__sys.close(fd);
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

/* ---- the active pointer ------------------------------------------------- */

/* Decimal digits, no sign, no leading zero unless zero_ok and the number is
 * exactly "0"; *v <= INT64_MAX. Returns the bytes used, 0 when malformed. */
static size_t parse_number(const char *s, size_t n, bool zero_ok, int64_t *v)
{
    size_t i = 0;
    int64_t x = 0;
    while (i < n && s[i] >= '0' && s[i] <= '9') {
        if (x > (INT64_MAX - (s[i] - '0')) / 10)
            return 0;
        x = x * 10 + (s[i] - '0');
        i++;
    }
    if (i == 0 || (s[0] == '0' && (i > 1 || !zero_ok)))
        return 0;
    *v = x;
    return i;
}

int tv__snapfile_parse_active(const void *buf, size_t len, int64_t *gen, int64_t *from,
                              tv_error *err)
{
    static const char kw[] = "from ";
    const char *s = buf;
    int64_t g = 0, f = -1;
    size_t i, k;
    if ((!buf && len) || !gen || !from)
        return tv__seterr(err, TV_E_INVALID_ARG, "active pointer: NULL argument");
    if (len > TV__SNAPFILE_POINTER_MAX)
        goto bad;
    if (!(i = parse_number(s, len, false, &g)))
        goto bad;
    if (i < len && s[i] == '\n')
        i++;
    if (i < len) {
        if (s[i - 1] != '\n' || len - i < sizeof kw - 1 || memcmp(s + i, kw, sizeof kw - 1))
            goto bad;
        i += sizeof kw - 1;
        if (!(k = parse_number(s + i, len - i, true, &f)))
            goto bad;
        i += k;
        if (i >= len || s[i] != '\n' || i + 1 != len)
            goto bad;
    }
    *gen = g;
    *from = f;
    return 0;
bad:
    return tv__seterr(err, TV_E_SNAPSHOT,
                      "not an active pointer (\"<gen>\\n\" or \"<gen>\\nfrom <gen>\\n\")");
}

/* Writes (gen > 0) or removes (gen 0) the pointer file p of the model. */
static int write_pointer_at(const char *dir, const char *model, const char *p, int64_t gen,
                            int64_t from, tv_error *err)
{
    char md[TV__SNAPFILE_PATH_MAX], tmp[TV__SNAPFILE_PATH_MAX];
    char text[TV__SNAPFILE_POINTER_MAX + 1];
    int rc, n;
    if (gen == 0) {
        if ((rc = tv__snapfile_model_dir(dir, model, md, sizeof md, err)))
            return rc;
        if ((rc = check_dirs(dir, model, err)) == -ENOENT)
            return 0; /* no directory: no pointer */
        if (rc)
            return rc;
        if (tv__sys.unlink(p) < 0) {
            if (errno == ENOENT)
                return 0;
            return tv__seterr(err, -errno, "unlink %s: %s", p, strerror(errno));
        }
        return fsync_dir(md, err);
    }
    if ((rc = ensure_model_dir(dir, model, md, sizeof md, err)))
        return rc;
    if (from >= 0)
        n = snprintf(text, sizeof text, "%" PRId64 "\nfrom %" PRId64 "\n", gen, from);
    else
        n = snprintf(text, sizeof text, "%" PRId64 "\n", gen);
    if ((rc = write_temp(md, "pointer", text, (size_t)n, tmp, sizeof tmp, err)))
        return rc;
    /* rename(2) replaces the entry itself, never what a link there names. */
    if (tv__sys.rename(tmp, p) < 0) {
        rc = tv__seterr(err, -errno, "rename %s -> %s: %s", tmp, p, strerror(errno));
        tv__sys.unlink(tmp);
        return rc;
    }
    return fsync_dir(md, err);
}

int tv__snapfile_write_pointer(const char *dir, const char *model, int64_t gen, int64_t from,
                               tv_error *err)
{
    char p[TV__SNAPFILE_PATH_MAX];
    int rc;
    if (gen < 0 || (gen == 0 && from >= 0))
        return tv__seterr(err, TV_E_INVALID_ARG, "snapshot file: active generation %lld from %lld",
                          (long long)gen, (long long)from);
    if ((rc = tv__snapfile_active_path(dir, model, p, sizeof p, err)))
        return rc;
    return write_pointer_at(dir, model, p, gen, from, err);
}

int tv__snapfile_write_active(const char *dir, const char *model, int64_t gen, tv_error *err)
{
    if (gen < 0)
        return tv__seterr(err, TV_E_INVALID_ARG, "snapshot file: active generation %lld",
                          (long long)gen);
    return tv__snapfile_write_pointer(dir, model, gen, -1, err);
}

/* Reads pointer file p of the model; absent is -ENOENT (no message). */
static int read_pointer_at(const char *dir, const char *model, const char *p, int64_t *gen,
                           int64_t *from, tv_error *err)
{
    char text[TV__SNAPFILE_POINTER_MAX + 1];
    size_t n = 0;
    int rc;
    int fd = open_regular(dir, model, p, err);
    if (fd < 0)
        return fd;
    rc = tv__sys_pread_full(fd, text, sizeof text, 0, &n);
    tv__sys.close(fd);
    if (rc)
        return tv__seterr(err, rc, "read %s: %s", p, strerror(-rc));
    tv_error e2 = {0};
    if ((rc = tv__snapfile_parse_active(text, n, gen, from, &e2)))
        return tv__seterr(err, rc, "%s: %s", p, e2.msg);
    return 0;
}

int tv__snapfile_read_pointer(const char *dir, const char *model, int64_t *gen, int64_t *from,
                              tv_error *err)
{
    char p[TV__SNAPFILE_PATH_MAX];
    int rc;
    if (!gen || !from)
        return tv__seterr(err, TV_E_INVALID_ARG, "snapshot file: NULL argument");
    if ((rc = tv__snapfile_active_path(dir, model, p, sizeof p, err)))
        return rc;
    rc = read_pointer_at(dir, model, p, gen, from, err);
    if (rc != -ENOENT)
        return rc;
    /* No directory: no generation of it was ever published here. */
    if (check_dirs(dir, model, NULL) == -ENOENT)
        return tv__seterr(err, TV_E_NOT_FOUND, "model '%s' does not exist", model);
    return tv__seterr(err, TV_E_NOT_FOUND, "model '%s' has no active generation", model);
}

/* ---- the moved pointer of a deactivation --------------------------------- */

/* DIR/snapshots/<escaped>/active and .../deactivated; md gets the model's
 * directory. */
static int deactivated_paths(const char *dir, const char *model, char *md, char *active,
                             char *moved, tv_error *err)
{
    int rc;
    if ((rc = tv__snapfile_model_dir(dir, model, md, TV__SNAPFILE_PATH_MAX, err)) ||
        (rc = fmt_path(active, TV__SNAPFILE_PATH_MAX, err, "%s/%s", md, TV__SNAPFILE_ACTIVE)))
        return rc;
    return fmt_path(moved, TV__SNAPFILE_PATH_MAX, err, "%s/%s", md, TV__SNAPFILE_DEACTIVATED);
}

/* Renames from to to inside md (replacing to) and fsyncs md; *moved says
 * whether the rename happened. A missing from is -ENOENT (no message). */
static int move_pointer(const char *dir, const char *model, const char *md, const char *from,
                        const char *to, bool *moved, tv_error *err)
{
    int rc;
    *moved = false;
    if ((rc = check_dirs(dir, model, err)))
        return rc; /* -ENOENT: no directory, no pointer */
    /* rename(2) moves the entry itself, never what a link there names. */
    if (tv__sys.rename(from, to) < 0) {
        if (errno == ENOENT)
            return -ENOENT;
        return tv__seterr(err, -errno, "rename %s -> %s: %s", from, to, strerror(errno));
    }
    *moved = true;
    return fsync_dir(md, err);
}

int tv__snapfile_deactivate(const char *dir, const char *model, bool *moved, tv_error *err)
{
    char md[TV__SNAPFILE_PATH_MAX], a[TV__SNAPFILE_PATH_MAX], d[TV__SNAPFILE_PATH_MAX];
    bool done = false;
    int rc;
    if (!moved)
        return tv__seterr(err, TV_E_INVALID_ARG, "snapshot file: NULL argument");
    *moved = false;
    if ((rc = deactivated_paths(dir, model, md, a, d, err)))
        return rc;
    rc = move_pointer(dir, model, md, a, d, &done, err);
    *moved = done;
    return rc == -ENOENT ? 0 : rc;
}

int tv__snapfile_undo_deactivate(const char *dir, const char *model, tv_error *err)
{
    char md[TV__SNAPFILE_PATH_MAX], a[TV__SNAPFILE_PATH_MAX], d[TV__SNAPFILE_PATH_MAX];
    bool done = false;
    int rc;
    if ((rc = deactivated_paths(dir, model, md, a, d, err)))
        return rc;
    rc = move_pointer(dir, model, md, d, a, &done, err);
    if (rc == -ENOENT)
        return tv__seterr(err, TV_E_NOT_FOUND, "%s: no deactivated pointer to put back", d);
    return rc;
}

int tv__snapfile_read_deactivated(const char *dir, const char *model, int64_t *gen, int64_t *from,
                                  tv_error *err)
{
    char md[TV__SNAPFILE_PATH_MAX], a[TV__SNAPFILE_PATH_MAX], d[TV__SNAPFILE_PATH_MAX];
    int rc;
    if (!gen || !from)
        return tv__seterr(err, TV_E_INVALID_ARG, "snapshot file: NULL argument");
    if ((rc = deactivated_paths(dir, model, md, a, d, err)))
        return rc;
    rc = read_pointer_at(dir, model, d, gen, from, err);
    if (rc == -ENOENT)
        return tv__seterr(err, TV_E_NOT_FOUND, "model '%s' has no deactivated pointer", model);
    return rc;
}

int tv__snapfile_remove_deactivated(const char *dir, const char *model, tv_error *err)
{
    char md[TV__SNAPFILE_PATH_MAX], a[TV__SNAPFILE_PATH_MAX], d[TV__SNAPFILE_PATH_MAX];
    int rc;
    if ((rc = deactivated_paths(dir, model, md, a, d, err)))
        return rc;
    return write_pointer_at(dir, model, d, 0, -1, err);
}

/* ---- alias pointers ----------------------------------------------------- */

bool tv__snapfile_alias_valid(const char *alias)
{
    if (!alias || !((alias[0] >= 'a' && alias[0] <= 'z') || (alias[0] >= 'A' && alias[0] <= 'Z')))
        return false;
    size_t len = strnlen(alias, TV__SNAPFILE_ALIAS_MAX + 1);
    if (len > TV__SNAPFILE_ALIAS_MAX || !strcmp(alias, TV__SNAPFILE_ACTIVE))
        return false;
    for (size_t i = 1; i < len; i++) {
        char c = alias[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-'))
            return false;
    }
    return true;
}

int tv__snapfile_alias_path(const char *dir, const char *model, const char *alias, char *out,
                            size_t out_len, tv_error *err)
{
    char md[TV__SNAPFILE_PATH_MAX];
    if (!tv__snapfile_alias_valid(alias))
        return tv__seterr(err, TV_E_NAME, "'%.64s' is not an alias name", alias ? alias : "(null)");
    int rc = tv__snapfile_model_dir(dir, model, md, sizeof md, err);
    if (rc)
        return rc;
    return fmt_path(out, out_len, err, "%s/%s%s", md, TV__SNAPFILE_ALIAS_PREFIX, alias);
}

int tv__snapfile_write_alias(const char *dir, const char *model, const char *alias, int64_t gen,
                             tv_error *err)
{
    char p[TV__SNAPFILE_PATH_MAX];
    int rc;
    if (gen < 0)
        return tv__seterr(err, TV_E_INVALID_ARG, "alias pointer: generation %lld", (long long)gen);
    if ((rc = tv__snapfile_alias_path(dir, model, alias, p, sizeof p, err)))
        return rc;
    return write_pointer_at(dir, model, p, gen, -1, err);
}

int tv__snapfile_read_alias(const char *dir, const char *model, const char *alias, int64_t *gen,
                            tv_error *err)
{
    char p[TV__SNAPFILE_PATH_MAX];
    int64_t from = -1;
    int rc;
    if (!gen)
        return tv__seterr(err, TV_E_INVALID_ARG, "alias pointer: NULL argument");
    if ((rc = tv__snapfile_alias_path(dir, model, alias, p, sizeof p, err)))
        return rc;
    rc = read_pointer_at(dir, model, p, gen, &from, err);
    if (rc == -ENOENT)
        return tv__seterr(err, TV_E_NOT_FOUND, "model '%s' has no alias '%s'", model, alias);
    if (rc == 0 && from >= 0)
        return tv__seterr(err, TV_E_SNAPSHOT, "%s: an alias pointer has no \"from\" line", p);
    return rc;
}

int tv__snapfile_list_aliases(const char *dir, const char *model, tv__snapfile_alias **out,
                              size_t *n, tv_error *err)
{
    char md[TV__SNAPFILE_PATH_MAX];
    int rc;
    if (!out || !n)
        return tv__seterr(err, TV_E_INVALID_ARG, "alias pointers: NULL argument");
    *out = NULL;
    *n = 0;
    if ((rc = tv__snapfile_model_dir(dir, model, md, sizeof md, err)))
        return rc;
    if ((rc = check_dirs(dir, model, err)) == -ENOENT)
        return 0;
    if (rc)
        return rc;
    DIR *d = opendir(md);
    if (!d)
        return errno == ENOENT ? 0 : tv__seterr(err, -errno, "opendir %s: %s", md, strerror(errno));
    size_t plen = strlen(TV__SNAPFILE_ALIAS_PREFIX), cap = 0;
    tv__snapfile_alias *v = NULL;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, TV__SNAPFILE_ALIAS_PREFIX, plen) != 0 ||
            !tv__snapfile_alias_valid(e->d_name + plen))
            continue;
        if (*n == cap) {
            size_t nc = cap ? cap * 2 : 8;
            tv__snapfile_alias *nv = realloc(v, nc * sizeof *nv);
            if (!nv) {
                rc = tv__seterr(err, -ENOMEM, "alias pointers: out of memory");
                break;
            }
            v = nv;
            cap = nc;
        }
        snprintf(v[*n].name, sizeof v[*n].name, "%s", e->d_name + plen);
        (*n)++;
    }
    closedir(d);
    if (rc) {
        free(v);
        *n = 0;
        return rc;
    }
    *out = v;
    return 0;
}

int tv__snapfile_remove_model(const char *dir, const char *model, tv_error *err)
{
    char md[TV__SNAPFILE_PATH_MAX], p[TV__SNAPFILE_PATH_MAX], top[TV__SNAPFILE_PATH_MAX];
    int rc;
    if ((rc = tv__snapfile_model_dir(dir, model, md, sizeof md, err)) ||
        (rc = fmt_path(top, sizeof top, err, "%s/%s", dir, TV__SNAPFILE_DIR)))
        return rc;
    if ((rc = check_dirs(dir, model, err)) == -ENOENT)
        return 0;
    if (rc)
        return rc;
    DIR *d = opendir(md);
    if (!d)
        return errno == ENOENT ? 0 : tv__seterr(err, -errno, "opendir %s: %s", md, strerror(errno));
    size_t tlen = strlen(TV__SNAPFILE_TMP_PREFIX), alen = strlen(TV__SNAPFILE_ALIAS_PREFIX);
    size_t elen = strlen(TV__SNAPFILE_EXT);
    struct dirent *e;
    while (!rc && (e = readdir(d))) {
        const char *nm = e->d_name;
        size_t len = strlen(nm);
        int64_t gen = 0;
        if (len > elen && !strcmp(nm + len - elen, TV__SNAPFILE_EXT) &&
            parse_number(nm, len - elen, false, &gen) == len - elen) {
            rc = tv__snapfile_remove(dir, model, gen, err); /* TV_E_LEASED when held */
            continue;
        }
        if (strncmp(nm, TV__SNAPFILE_TMP_PREFIX, tlen) &&
            strncmp(nm, TV__SNAPFILE_ALIAS_PREFIX, alen) && strcmp(nm, TV__SNAPFILE_ACTIVE) &&
            strcmp(nm, TV__SNAPFILE_DEACTIVATED))
            continue; /* anything else stays: rmdir below then says so */
        if ((rc = fmt_path(p, sizeof p, err, "%s/%s", md, nm)))
            break;
        if (tv__sys.unlink(p) < 0 && errno != ENOENT)
            rc = tv__seterr(err, -errno, "unlink %s: %s", p, strerror(errno));
    }
    closedir(d);
    if (rc)
        return rc;
    if (rmdir(md) < 0 && errno != ENOENT)
        return tv__seterr(err, -errno, "rmdir %s: %s", md, strerror(errno));
    return fsync_dir(top, err);
}

int tv__snapfile_read_active(const char *dir, const char *model, int64_t *gen, tv_error *err)
{
    int64_t from;
    if (!gen)
        return tv__seterr(err, TV_E_INVALID_ARG, "snapshot file: NULL argument");
    return tv__snapfile_read_pointer(dir, model, gen, &from, err);
}

/* ---- readers and gc ----------------------------------------------------- */

static int flock_retry(int fd, int op)
{
    int rc;
    while ((rc = tv__sys.flock(fd, op)) < 0 && errno == EINTR)
        ;
    return rc;
}

/* True when fd is still the file named by path (not unlinked by gc nor
 * replaced); *a is then fd's fstat (map_whole's size). */
static bool still_linked(int fd, const char *path, struct stat *a)
{
    struct stat b;
    if (tv__sys.fstat(fd, a) < 0 || a->st_nlink == 0 || lstat(path, &b) < 0)
        return false;
    return a->st_dev == b.st_dev && a->st_ino == b.st_ino;
}

/* Maps the whole file read-only (MAP_SHARED of a PROT_READ mapping: no
 * copy, pages come from the page cache). Safe against SIGBUS because a
 * snapshot file is immutable: it appears whole by rename of a fsynced
 * temporary file, is never truncated, rewritten or replaced in place
 * (tv__snapfile_write refuses an existing generation), and is only ever
 * unlinked, by tv__snapfile_remove under the exclusive flock that our
 * shared lease excludes. An unlinked file keeps its pages while mapped, so
 * even a caller that closes the lease fd early (the store's repair) reads a
 * stable image. sb is fd's fstat (from still_linked); open_regular has
 * already refused anything but a regular file on this fd. */
static int map_whole(int fd, const char *path, const struct stat *sb, void **buf, size_t *len,
                     tv_error *err)
{
    if (sb->st_size <= 0)
        return tv__seterr(err, TV_E_SNAPSHOT, "%s is empty", path);
    if ((uint64_t)sb->st_size > TV__SNAPFILE_MAX_LEN)
        return tv__seterr(err, TV_E_SNAPSHOT, "%s: %lld bytes, over the %llu-byte limit", path,
                          (long long)sb->st_size, (unsigned long long)TV__SNAPFILE_MAX_LEN);
    size_t n = (size_t)sb->st_size;
    void *p = tv__sys.mmap(NULL, n, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return tv__seterr(err, -errno, "mmap %s: %s", path, strerror(errno));
    *buf = p;
    *len = n;
    return 0;
}

void tv__snapfile_unmap(void *buf, size_t len)
{
    if (buf)
        tv__sys.munmap(buf, len);
}

int tv__snapfile_open_gen(const char *dir, const char *model, int64_t gen, int64_t *opened,
                          int *fd_out, void **buf, size_t *len, tv_error *err)
{
    char p[TV__SNAPFILE_PATH_MAX];
    int rc;
    if (!fd_out || !buf || !len || gen < 0)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__snapfile_open: bad argument");
    *fd_out = -1;
    *buf = NULL;
    *len = 0;
    if (opened)
        *opened = 0;
    for (int attempt = 0; attempt < OPEN_ATTEMPTS; attempt++) {
        int64_t g = gen;
        if (gen == 0 && (rc = tv__snapfile_read_active(dir, model, &g, err)))
            return rc;
        if ((rc = tv__snapfile_path(dir, model, g, p, sizeof p, err)))
            return rc;
        int fd = open_regular(dir, model, p, err);
        if (fd == -ENOENT) {
            int64_t now;
            if (gen == 0 && tv__snapfile_read_active(dir, model, &now, NULL) == 0 && now != g)
                continue; /* activation and gc raced with us: follow the pointer */
            return tv__seterr(err, TV_E_NOT_FOUND,
                              "model '%s' generation %lld has no snapshot (%s)", model,
                              (long long)g, p);
        }
        if (fd < 0)
            return fd;
        if (flock_retry(fd, LOCK_SH) < 0) {
            rc = tv__seterr(err, -errno, "flock %s: %s", p, strerror(errno));
            tv__sys.close(fd);
            return rc;
        }
        struct stat sb;
        if (!still_linked(fd, p, &sb)) {
            tv__sys.close(fd); /* gc removed it between our open and our lock */
            continue;
        }
        if ((rc = map_whole(fd, p, &sb, buf, len, err))) {
            tv__sys.close(fd);
            return rc;
        }
        *fd_out = fd;
        if (opened)
            *opened = g;
        return 0;
    }
    return tv__seterr(err, TV_E_NOT_FOUND, "model '%s': snapshot kept disappearing while opening",
                      model);
}

int tv__snapfile_open_alias(const char *dir, const char *model, const char *alias, int64_t *opened,
                            int *fd_out, void **buf, size_t *len, tv_error *err)
{
    int rc = TV_E_NOT_FOUND;
    if (!fd_out || !buf || !len)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__snapfile_open_alias: bad argument");
    *fd_out = -1;
    *buf = NULL;
    *len = 0;
    if (opened)
        *opened = 0;
    for (int attempt = 0; attempt < OPEN_ATTEMPTS; attempt++) {
        int64_t g = 0, now = 0;
        if ((rc = tv__snapfile_read_alias(dir, model, alias, &g, err)))
            return rc;
        rc = tv__snapfile_open_gen(dir, model, g, opened, fd_out, buf, len, err);
        if (rc != TV_E_NOT_FOUND)
            return rc;
        /* The alias moved and gc removed the old file meanwhile: follow it. */
        if (tv__snapfile_read_alias(dir, model, alias, &now, NULL) != 0 || now == g)
            return rc;
    }
    return rc;
}

int tv__snapfile_open(const char *dir, const char *model, int64_t gen, int *fd_out, void **buf,
                      size_t *len, tv_error *err)
{
    return tv__snapfile_open_gen(dir, model, gen, NULL, fd_out, buf, len, err);
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
    int fd = open_regular(dir, model, p, err);
    if (fd == -ENOENT || fd == TV_E_SNAPSHOT) {
        *leased = false; /* nothing a reader could have opened */
        return 0;
    }
    if (fd < 0)
        return fd;
    if (flock_retry(fd, LOCK_EX | LOCK_NB) < 0) {
        int e = errno;
        tv__sys.close(fd);
        if (e != EWOULDBLOCK)
            return tv__seterr(err, -e, "flock %s: %s", p, strerror(e));
        *leased = true;
        return 0;
    }
    tv__sys.close(fd); /* releases the lock */
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
        tv_error e2 = {0};
        int fd = open_regular(dir, model, p, &e2);
        if (fd == -ENOENT)
            return 0;
        if (fd == TV_E_SNAPSHOT && check_dirs(dir, model, NULL) == 0) {
            /* A link, FIFO or socket in a generation's place: no reader can
             * hold it; remove the entry itself (a directory stays: refused). */
            if (tv__sys.unlink(p) < 0)
                return tv__seterr(err, TV_E_SNAPSHOT, "%s", e2.msg);
            return fsync_dir(md, err);
        }
        if (fd < 0) {
            if (err)
                *err = e2;
            return fd;
        }
        if (flock_retry(fd, LOCK_EX | LOCK_NB) < 0) {
            int e = errno;
            tv__sys.close(fd);
            if (e == EWOULDBLOCK)
                return tv__seterr(err, TV_E_LEASED,
                                  "model '%s' generation %lld: snapshot is held by a reader", model,
                                  (long long)gen);
            return tv__seterr(err, -e, "flock %s: %s", p, strerror(e));
        }
        struct stat sb;
        if (!still_linked(fd, p, &sb)) {
            tv__sys.close(fd);
            continue;
        }
        /* Unlink while holding the lock: a reader that opened the file
         * before this point sees link count 0 once it gets its lock. */
        if (tv__sys.unlink(p) < 0) {
            rc = tv__seterr(err, -errno, "unlink %s: %s", p, strerror(errno));
            tv__sys.close(fd);
            return rc;
        }
        tv__sys.close(fd);
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
    if ((rc = check_dirs(dir, model, err)) == -ENOENT)
        return 0;
    if (rc)
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
