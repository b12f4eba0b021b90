/* Local import sources opened once (source.h: tv__src_local): the daemon
 * opens a source when it checks the request, before the job is queued, and
 * the job reads through what was opened; then, per import, the files of its
 * checkpoint opened through it (tv__src_local_files).
 *
 * How (open, then verify what was opened): the source is opened with O_PATH
 * (nothing is read, opening a device or a FIFO has no effect), and what was
 * opened is checked: its real path, read from /proc/self/fd/N, must lie
 * under an import root. That is the meaning the realpath check it replaces
 * had (absolute symlinks inside the roots, links from one root into
 * another and a Hugging Face cache's ../../blobs links keep working), now
 * made on the object itself, so no swap of a name between the check and
 * the use changes it. openat2(RESOLVE_BENEATH) from a root was the other
 * way: it refuses absolute links and links between roots, and needs Linux
 * 5.6 and a seccomp policy that lets openat2 through. A file is read
 * through a new description of its inode (/proc/self/fd/N opened again:
 * its own flags and lease). /proc must be mounted.
 *
 * Invariants: the file (or directory) named is the one that lay under an
 * import root when the request was checked; every other file (the one
 * picked in a directory, an index's shards) is opened relative to the
 * directory held (openat), and refused unless what was opened lies under an
 * import root then (TV_E_OUTSIDE_ROOTS) and follows tv_checkpoint_open's
 * rules for a directory's files (st/dirrules.h: TV_E_IDX_SHARD_ESCAPE);
 * each file is opened once per import and kept open until the import ends,
 * so a shard is read from the inode that was validated, whatever happens to
 * its name since. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "import/source.h"
#include "st/dirrules.h"
#include "util/sys.h"

struct tv__src_local {
    int dir_fd;              /* O_PATH: the directory named, or the one the file named is in */
    int file_fd;             /* O_PATH: the file named; -1: a directory was named */
    char name[NAME_MAX + 1]; /* the file's own name as named (a link keeps its own) */
    char real[PATH_MAX];     /* the real path of what was named, when it was opened */
    char **roots;            /* copies; NULL: no check */
    size_t n_roots;
};

typedef struct local_file {
    char *name;          /* as the checkpoint names it */
    int fd;              /* O_RDONLY, kept open until the import ends */
    char real[PATH_MAX]; /* what was opened */
    tv__src_stamp st;    /* its fstat when it was opened */
} local_file;

struct tv__src_local_files {
    const tv__src_local *l;
    char real_dir[PATH_MAX];   /* the directory held, where it is now */
    char picked[NAME_MAX + 1]; /* a directory's checkpoint file ("" for a file named) */
    local_file *files;
    size_t n, cap;
};

bool tv__path_under(const char *real, const char *root)
{
    size_t n = strlen(root);
    if (n == 1 && root[0] == '/')
        return real[0] == '/';
    return !strncmp(real, root, n) && (real[n] == '\0' || real[n] == '/');
}

/* The real path of what fd is open on, into out (PATH_MAX bytes). Returns
 * 0, -errno, or -EINVAL for something that has no path (a pipe, a socket). */
static int fd_real(int fd, char *out)
{
    char link[64];
    snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, out, PATH_MAX);
    if (n < 0)
        return -errno;
    if (n >= PATH_MAX)
        return -ENAMETOOLONG;
    out[n] = '\0';
    return out[0] == '/' ? 0 : -EINVAL;
}

/* A new descriptor with flags on what fd is open on (the same inode). */
static int reopen(int fd, int flags)
{
    char link[64];
    snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
    return tv__sys_open(link, flags, 0);
}

static bool same_inode(int a, int b)
{
    struct stat sa, sb;
    return tv__sys.fstat(a, &sa) == 0 && tv__sys.fstat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
           sa.st_ino == sb.st_ino;
}

int tv__src_path_error(const char *path, int e, tv_error *err)
{
    /* What a caller can get wrong is a 4xx: missing (404), unreadable
     * (403), a malformed path (400); the rest is the server's. */
    int code = (e == ENOENT || e == ENOTDIR)                      ? -ENOENT
               : (e == EACCES || e == EPERM)                      ? TV_E_FORBIDDEN
               : (e == ENAMETOOLONG || e == ELOOP || e == EINVAL) ? TV_E_BAD_REQUEST
                                                                  : -e;
    return tv__seterr(err, code, "import source '%s': %s", path, strerror(e));
}

static bool under_roots(const tv__src_local *l, const char *real)
{
    bool ok = l->roots == NULL;
    for (size_t i = 0; !ok && i < l->n_roots; i++)
        ok = tv__path_under(real, l->roots[i]);
    return ok;
}

/* The file named: its directory as named, then the name in it, which must
 * still be what fd (path, opened first) is. */
static int open_named_file(tv__src_local *l, const char *path, int fd, tv_error *err)
{
    char dir[PATH_MAX];
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    if (strlen(base) > NAME_MAX)
        return tv__src_path_error(path, ENAMETOOLONG, err);
    snprintf(l->name, sizeof(l->name), "%s", base);
    if (!slash)
        snprintf(dir, sizeof(dir), ".");
    else if (slash == path)
        snprintf(dir, sizeof(dir), "/");
    else if ((size_t)snprintf(dir, sizeof(dir), "%.*s", (int)(slash - path), path) >= sizeof(dir))
        return tv__src_path_error(path, ENAMETOOLONG, err);
    if ((l->dir_fd = tv__sys_open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC, 0)) < 0)
        return tv__src_path_error(path, -l->dir_fd, err);
    if ((l->file_fd = tv__sys_openat(l->dir_fd, base, O_PATH | O_CLOEXEC, 0)) < 0)
        return tv__src_path_error(path, -l->file_fd, err);
    if (!same_inode(fd, l->file_fd))
        return tv__seterr(err, TV_E_SOURCE_CHANGED,
                          "import source '%s' was replaced while it was being opened", path);
    return 0;
}

int tv__src_local_open(const char *path, const char *const *roots, size_t n_roots,
                       tv__src_local **out, tv_error *err)
{
    int rc, fd = -1;
    struct stat sb;
    *out = NULL;
    if (!path || !*path)
        return tv__seterr(err, TV_E_BAD_REQUEST, "an empty import source path");
    tv__src_local *l = calloc(1, sizeof(*l));
    if (!l)
        return tv__seterr(err, -ENOMEM, "out of memory");
    l->dir_fd = l->file_fd = -1;
    if ((fd = tv__sys_open(path, O_PATH | O_CLOEXEC, 0)) < 0) {
        rc = tv__src_path_error(path, -fd, err);
        goto fail;
    }
    if (tv__sys.fstat(fd, &sb) < 0) {
        rc = tv__src_path_error(path, errno, err);
        goto fail;
    }
    if (S_ISDIR(sb.st_mode)) {
        l->dir_fd = fd;
        fd = -1;
    } else if ((rc = open_named_file(l, path, fd, err))) {
        goto fail;
    }
    if ((rc = fd_real(l->file_fd >= 0 ? l->file_fd : l->dir_fd, l->real))) {
        rc = tv__seterr(err, rc,
                        "import source '%s': cannot tell what was opened (/proc/self/fd): %s", path,
                        strerror(-rc));
        goto fail;
    }
    if (roots) {
        if (!(l->roots = calloc(n_roots ? n_roots : 1, sizeof(*l->roots)))) {
            rc = tv__seterr(err, -ENOMEM, "out of memory");
            goto fail;
        }
        for (; l->n_roots < n_roots; l->n_roots++)
            if (!(l->roots[l->n_roots] = strdup(roots[l->n_roots]))) {
                rc = tv__seterr(err, -ENOMEM, "out of memory");
                goto fail;
            }
        if (!under_roots(l, l->real)) {
            rc = tv__seterr(err, TV_E_OUTSIDE_ROOTS,
                            "import source '%s' resolves to '%s', outside the import roots", path,
                            l->real);
            goto fail;
        }
    }
    if (fd >= 0)
        tv__sys.close(fd);
    *out = l;
    return 0;
fail:
    if (fd >= 0)
        tv__sys.close(fd);
    tv__src_local_free(l);
    return rc;
}

const char *tv__src_local_real(const tv__src_local *l)
{
    return l->real;
}

void tv__src_local_free(tv__src_local *l)
{
    if (!l)
        return;
    if (l->dir_fd >= 0)
        tv__sys.close(l->dir_fd);
    if (l->file_fd >= 0)
        tv__sys.close(l->file_fd);
    for (size_t i = 0; i < l->n_roots; i++)
        free(l->roots[i]);
    free(l->roots);
    free(l);
}

/* ---- one import's files ---- */

/* The directory rules for entry name of the directory held, which opened
 * as f (sb: its fstat). */
static int entry_rule(tv__src_local_files *fs, const char *name, const char *what,
                      const local_file *f, const struct stat *sb, tv_error *err)
{
    const tv__src_local *l = fs->l;
    struct stat lsb;
    char parent[PATH_MAX], real_parent[PATH_MAX];
    bool is_link = fstatat(l->dir_fd, name, &lsb, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(lsb.st_mode);
    const char *rp = fs->real_dir, *slash = strrchr(name, '/');
    if (slash) { /* the entry's own directory, resolved */
        snprintf(parent, sizeof(parent), "%.*s", (int)(slash - name), name);
        int pfd = tv__sys_openat(l->dir_fd, parent, O_PATH | O_DIRECTORY | O_CLOEXEC, 0);
        rp = pfd >= 0 && fd_real(pfd, real_parent) == 0 ? real_parent : NULL;
        if (pfd >= 0)
            tv__sys.close(pfd);
    }
    return tv__st_check_entry(fs->real_dir, name, what, f->real, is_link, rp, S_ISREG(sb->st_mode),
                              err);
}

/* The file named name, opened (through the source) when first asked for. */
static int file_get(tv__src_local_files *fs, const char *name, local_file **out, tv_error *err)
{
    const tv__src_local *l = fs->l;
    const int flags = O_RDONLY | O_NONBLOCK | O_CLOEXEC; /* a FIFO must not hang: refused below */
    struct stat sb;
    int rc;
    for (size_t i = 0; i < fs->n; i++)
        if (strcmp(fs->files[i].name, name) == 0) {
            *out = &fs->files[i];
            return 0;
        }
    if (fs->n == fs->cap) {
        size_t cap = fs->cap ? 2 * fs->cap : 8;
        local_file *nf = realloc(fs->files, cap * sizeof(*nf));
        if (!nf)
            return tv__seterr(err, -ENOMEM, "out of memory");
        fs->files = nf;
        fs->cap = cap;
    }
    local_file *f = &fs->files[fs->n];
    memset(f, 0, sizeof(*f));
    bool named = l->file_fd >= 0 && strcmp(name, l->name) == 0;
    const char *what = strcmp(name, fs->picked) == 0 ? "checkpoint file" : "shard";
    if (named) {
        if ((f->fd = reopen(l->file_fd, flags)) < 0)
            return tv__seterr(err, f->fd, "import source %s: cannot open what was opened: %s",
                              l->real, strerror(-f->fd));
        snprintf(f->real, sizeof(f->real), "%s", l->real);
    } else {
        if ((f->fd = tv__sys_openat(l->dir_fd, name, flags, 0)) < 0)
            return tv__seterr(err, f->fd, "%s '%s': %s", what, name, strerror(-f->fd));
        if ((rc = fd_real(f->fd, f->real))) {
            rc = tv__seterr(err, rc, "%s '%s': cannot tell what was opened (/proc/self/fd): %s",
                            what, name, strerror(-rc));
            goto fail;
        }
    }
    if (tv__sys.fstat(f->fd, &sb) < 0) {
        rc = tv__seterr(err, -errno, "%s '%s': fstat %s: %s", what, name, f->real, strerror(errno));
        goto fail;
    }
    if (!named && !under_roots(l, f->real)) {
        rc = tv__seterr(err, TV_E_OUTSIDE_ROOTS,
                        "%s '%s' of import source '%s' resolves to '%s', outside the import roots",
                        what, name, l->real, f->real);
        goto fail;
    }
    if (!named && (rc = entry_rule(fs, name, what, f, &sb, err)))
        goto fail;
    if (!S_ISREG(sb.st_mode)) {
        rc = tv__seterr(err, -EINVAL, "%s '%s': %s is not a regular file", what, name, f->real);
        goto fail;
    }
    tv__src_stamp_of(&sb, &f->st);
    if (!(f->name = strdup(name))) {
        rc = tv__seterr(err, -ENOMEM, "out of memory");
        goto fail;
    }
    fs->n++;
    *out = f;
    return 0;
fail:
    tv__sys.close(f->fd);
    return rc;
}

static int io_stat(void *ctx, const char *name, uint64_t *len, char *path, size_t path_len,
                   tv_error *err)
{
    local_file *f;
    int rc = file_get(ctx, name, &f, err);
    if (rc)
        return rc;
    *len = f->st.size;
    snprintf(path, path_len, "%s", f->real);
    return 0;
}

static int io_read(void *ctx, const char *name, void *buf, size_t len, uint64_t off, tv_error *err)
{
    local_file *f;
    int rc = file_get(ctx, name, &f, err);
    if (rc)
        return rc;
    /* A file shorter than its fstat said a moment ago: it shrank (-EIO, as
     * tv_checkpoint_open says it). */
    if ((rc = tv__sys_pread_exact(f->fd, buf, len, off)) == -ENODATA)
        rc = -EIO;
    if (rc)
        return tv__seterr(err, rc, "'%s' (%s): read at %llu: %s", name, f->real,
                          (unsigned long long)off, tv_strerror(rc));
    return 0;
}

static bool ends_with(const char *s, const char *suf)
{
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && strcmp(s + n - m, suf) == 0;
}

/* A directory named: its checkpoint file, picked as tv_checkpoint_open does. */
static int pick(tv__src_local_files *fs, tv_error *err)
{
    int fd = tv__sys_openat(fs->l->dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
    if (fd < 0)
        return tv__seterr(err, fd, "%s: %s", fs->real_dir, strerror(-fd));
    DIR *d = fdopendir(fd);
    if (!d) {
        int e = errno;
        tv__sys.close(fd);
        return tv__seterr(err, -e, "%s: %s", fs->real_dir, strerror(e));
    }
    int rc = tv__st_pick_in_dir(d, fs->real_dir, fs->picked, err);
    closedir(d);
    return rc;
}

int tv__src_local_validate(const tv__src_local *l, tv__src_local_files **out, tv_checkpoint **ck,
                           tv_error *err)
{
    int rc;
    *out = NULL;
    *ck = NULL;
    tv__src_local_files *fs = calloc(1, sizeof(*fs));
    if (!fs)
        return tv__seterr(err, -ENOMEM, "out of memory");
    fs->l = l;
    if ((rc = fd_real(l->dir_fd, fs->real_dir))) {
        rc = tv__seterr(err, rc, "import source %s: cannot tell where its directory is now: %s",
                        l->real, strerror(-rc));
        goto fail;
    }
    if (l->file_fd < 0 && (rc = pick(fs, err)))
        goto fail;
    const char *first = l->file_fd >= 0 ? l->name : fs->picked;
    const tv_checkpoint_io io = {.ctx = fs, .stat = io_stat, .read = io_read};
    if ((rc = tv_checkpoint_open_io(&io, first, ends_with(first, ".json"), NULL, ck, err)))
        goto fail;
    *out = fs;
    return 0;
fail:
    tv__src_local_files_free(fs);
    return rc;
}

int tv__src_local_reopen(tv__src_local_files *fs, const tv_shard_info *si, int *fd,
                         tv__src_stamp *want, tv_error *err)
{
    for (size_t i = 0; i < fs->n; i++) {
        const local_file *f = &fs->files[i];
        if (strcmp(f->name, si->name) != 0)
            continue;
        if ((*fd = reopen(f->fd, O_RDONLY | O_NONBLOCK | O_CLOEXEC)) < 0)
            return tv__seterr(err, *fd, "shard '%s': cannot open %s again: %s", si->name, f->real,
                              strerror(-*fd));
        *want = f->st;
        return 0;
    }
    return tv__seterr(err, TV_E_INTERNAL, "shard '%s' was not validated", si->name);
}

void tv__src_local_files_free(tv__src_local_files *fs)
{
    if (!fs)
        return;
    for (size_t i = 0; i < fs->n; i++) {
        tv__sys.close(fs->files[i].fd);
        free(fs->files[i].name);
    }
    free(fs->files);
    free(fs);
}

/* ---- sidecar files ---- */

/* One directory's walk: dfd (O_RDONLY, its own) listed, its regular files
 * kept, its subdirectories walked (opened with O_NOFOLLOW: a link to a
 * directory is not followed). prefix: the directory's path relative to
 * the checkpoint directory ("" at the top). */
typedef struct walk {
    const tv__src_local *l;
    char real_dir[PATH_MAX];
    const tv__sidecar_caps *caps;
    tv__sidecars *set;
} walk;

static int skip(walk *w, const char *rel, const char *why, tv_error *err)
{
    if (tv__sidecars_skip(w->set, rel, why))
        return tv__seterr(err, -ENOMEM, "out of memory");
    tv__log(TV_LOG_INFO, "import source %s: sidecar file %s", w->l->real,
            w->set->skipped[w->set->n_skipped - 1]);
    return 0;
}

/* Entry name of directory dfd (rel: its path from the top): a regular file
 * (or a link the directory rules allow to one), read whole when under the
 * per-file cap. */
static int walk_file(walk *w, int dfd, const char *name, const char *rel, bool is_link,
                     tv_error *err)
{
    const tv__src_local *l = w->l;
    uint64_t max = w->caps && w->caps->max_len ? w->caps->max_len : TV__SIDECAR_DEFAULT_MAX;
    char real[PATH_MAX], real_parent[PATH_MAX], why[PATH_MAX + 64];
    struct stat sb;
    uint8_t *buf = NULL;
    int rc = 0;
    /* O_NOFOLLOW for what was no link when listed: a swap to one fails. */
    int flags = O_RDONLY | O_NONBLOCK | O_CLOEXEC | (is_link ? 0 : O_NOFOLLOW);
    int fd = tv__sys_openat(dfd, name, flags, 0);
    if (fd < 0)
        return skip(w, rel, strerror(-fd), err);
    if (tv__sys.fstat(fd, &sb) < 0 || fd_real(fd, real) || fd_real(dfd, real_parent)) {
        rc = skip(w, rel, "cannot tell what was opened", err);
        goto out;
    }
    if (!under_roots(l, real)) {
        snprintf(why, sizeof why, "resolves to %s, outside the import roots", real);
        rc = skip(w, rel, why, err);
        goto out;
    }
    tv_error e2 = {0};
    if (tv__st_check_entry(w->real_dir, rel, "sidecar file", real, is_link, real_parent,
                           S_ISREG(sb.st_mode), &e2)) {
        snprintf(why, sizeof why, "resolves to %s, outside the checkpoint directory", real);
        rc = skip(w, rel, why, err);
        goto out;
    }
    if (!S_ISREG(sb.st_mode)) {
        rc = skip(w, rel, "not a regular file", err);
        goto out;
    }
    if ((uint64_t)sb.st_size > max) {
        snprintf(why, sizeof why, "%llu bytes > %llu", (unsigned long long)sb.st_size,
                 (unsigned long long)max);
        rc = skip(w, rel, why, err);
        goto out;
    }
    size_t len = (size_t)sb.st_size;
    if (!(buf = malloc(len ? len : 1))) {
        rc = tv__seterr(err, -ENOMEM, "out of memory");
        goto out;
    }
    if ((rc = tv__sys_pread_exact(fd, buf, len, 0))) {
        rc = tv__seterr(err, rc == -ENODATA ? TV_E_SOURCE_CHANGED : rc,
                        "sidecar file '%s' (%s): read: %s", rel, real, tv_strerror(rc));
        goto out;
    }
    rc = tv__sidecars_add(w->set, w->caps, rel, buf, len, err);
out:
    free(buf);
    tv__sys.close(fd);
    return rc;
}

static int walk_dir(walk *w, int dfd, const char *prefix, int depth, tv_error *err)
{
    int rc = 0, dup_fd = tv__sys_openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
    if (dup_fd < 0)
        return tv__seterr(err, dup_fd, "%s/%s: %s", w->real_dir, prefix, strerror(-dup_fd));
    DIR *d = fdopendir(dup_fd);
    if (!d) {
        int e = errno;
        tv__sys.close(dup_fd);
        return tv__seterr(err, -e, "%s/%s: %s", w->real_dir, prefix, strerror(e));
    }
    struct dirent *de;
    char rel[PATH_MAX];
    while (!rc && (de = readdir(d))) {
        const char *name = de->d_name;
        if (!strcmp(name, ".") || !strcmp(name, ".."))
            continue;
        if ((size_t)snprintf(rel, sizeof rel, "%s%s%s", prefix, *prefix ? "/" : "", name) >=
            sizeof rel)
            continue;
        if (tv__sidecar_excluded(rel))
            continue;
        tv_error e2 = {0};
        if (tv__sidecar_path_valid(rel, &e2)) {
            rc = skip(w, rel, "a name the path rule refuses", err);
            continue;
        }
        struct stat lsb;
        if (fstatat(dfd, name, &lsb, AT_SYMLINK_NOFOLLOW) < 0)
            continue; /* gone since it was listed */
        if (S_ISDIR(lsb.st_mode)) {
            if (depth >= TV__SIDECAR_MAX_DEPTH) {
                rc = skip(w, rel, "a directory too deep", err);
                continue;
            }
            int sub = tv__sys_openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC, 0);
            if (sub < 0) {
                rc = skip(w, rel, strerror(-sub), err);
                continue;
            }
            /* A store's directory (its admin token, its registry) is never
             * a model's file. */
            struct stat rsb;
            if (fstatat(sub, "registry.db", &rsb, AT_SYMLINK_NOFOLLOW) == 0)
                rc = skip(w, rel, "a directory holding a tensorvault store", err);
            else
                rc = walk_dir(w, sub, rel, depth + 1, err);
            tv__sys.close(sub);
        } else if (S_ISREG(lsb.st_mode) || S_ISLNK(lsb.st_mode)) {
            rc = walk_file(w, dfd, name, rel, S_ISLNK(lsb.st_mode), err);
        } else {
            rc = skip(w, rel, "not a regular file", err);
        }
    }
    closedir(d);
    return rc;
}

int tv__src_local_sidecars(const tv__src_local *l, const tv__sidecar_caps *caps, tv__sidecars *set,
                           tv_error *err)
{
    walk w = {.l = l, .caps = caps, .set = set};
    int rc;
    if ((rc = fd_real(l->dir_fd, w.real_dir)))
        return tv__seterr(err, rc, "import source %s: cannot tell where its directory is now: %s",
                          l->real, strerror(-rc));
    int dfd = tv__sys_openat(l->dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
    if (dfd < 0)
        return tv__seterr(err, dfd, "%s: %s", w.real_dir, strerror(-dfd));
    rc = walk_dir(&w, dfd, "", 0, err);
    tv__sys.close(dfd);
    if (!rc)
        tv__sidecars_sort(set);
    return rc;
}
