/* The importer's sources (source.h): local files here, with the checks
 * that a shard does not change under the importer, and the dispatch
 * between them (by path, or through a source held open: src_local.c) and
 * HTTP(S) origins (src_http.c).
 *
 * A source not in the page cache is read with O_DIRECT (chunk-sized reads,
 * split by the kernel into many requests in flight: the disk sees depth
 * without read-ahead's small windows, and the page cache is not filled with
 * bytes read once); a mostly cached one, a filesystem that refuses
 * O_DIRECT, or a read it refuses, is read buffered with sequential
 * read-ahead advised. Every read goes through tv__sys (so the fault tests
 * see it). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "import/source.h"
#include "util/sys.h"

#define SRC_DIO_ALIGN 4096 /* O_DIRECT source reads: length rounded up to this */

/* ---- source immutability ----------------------------------------------------
 *
 * A shard must not change while it is imported, or the published object is
 * a mixture of old and new bytes with a hash that matches it. The importer
 * compares the file's identity and change stamps (st_dev, st_ino, size,
 * mtime and ctime in nanoseconds) from three fstat calls: the one taken when
 * the header was validated (core/src/st, tv_shard_info; for a source held
 * open, src_local.c's), one on the fd it reads from, before the first read,
 * and one after the last read; and after the last read it checks that the
 * path still names the inode it read (a source held open reads the inode
 * it validated, never a path: renames do not matter to it).
 * Where the kernel allows it, it also holds a read lease (F_SETLEASE
 * F_RDLCK) while reading: any open for writing or truncate by another
 * process breaks it, which F_GETLEASE reports (checked after every chunk, so
 * the writer, whose open waits for the lease, is held up one chunk at most).
 * A lease needs the importer to own the file (or CAP_LEASE), a local
 * filesystem, and no writable fd open on the file; otherwise the stamps
 * alone decide. Any difference is TV_E_SOURCE_CHANGED and nothing is
 * published.
 *
 * Detected: the path renamed over or deleted and recreated (other inode);
 * a size change, even when restored (truncate and rewrite); any write,
 * truncate, chmod, chown or link through any fd, since each sets ctime to
 * the current time and no system call can set ctime back; with a lease,
 * an open for writing even before it writes.
 * Not detected (without a lease): a write whose new ctime equals the stamp,
 * which happens when file timestamps come from the coarse clock (one tick,
 * 1-10 ms) and the write lands in the same tick as the change the stamp
 * recorded; filesystems with multigrain timestamps (Linux 6.13+: ext4, xfs,
 * btrfs, tmpfs) give the first change after a stat a fresh fine-grained
 * ctime, which closes that hole there. Also not detected: stores through a
 * shared writable mapping into pages already dirty (they touch no stamp),
 * writes on a filesystem that does not maintain ctime or caches attributes
 * (some FUSE and network filesystems), and writes to the block device under
 * the filesystem. STATX_CHANGE_COOKIE (the inode's i_version) would close
 * these, but Linux does not report it to user space. */

void tv__src_stamp_of(const struct stat *sb, tv__src_stamp *s)
{
    s->dev_id = (uint64_t)sb->st_dev;
    s->inode = (uint64_t)sb->st_ino;
    s->size = (uint64_t)sb->st_size;
    s->mtime_ns = (int64_t)sb->st_mtim.tv_sec * 1000000000 + sb->st_mtim.tv_nsec;
    s->ctime_ns = (int64_t)sb->st_ctim.tv_sec * 1000000000 + sb->st_ctim.tv_nsec;
}

/* fstat on fd into s; -errno with a message naming the shard. */
static int fd_stamp(int fd, const tv_shard_info *si, struct stat *sb, tv__src_stamp *s,
                    tv_error *err)
{
    if (tv__sys.fstat(fd, sb) < 0)
        return tv__seterr(err, -errno, "shard '%s': fstat %s: %s", si->name, si->path,
                          strerror(errno));
    tv__src_stamp_of(sb, s);
    return 0;
}

static void stamp_of_info(const tv_shard_info *si, tv__src_stamp *s)
{
    s->dev_id = si->dev_id;
    s->inode = si->inode;
    s->size = si->file_len;
    s->mtime_ns = si->mtime_ns;
    s->ctime_ns = si->ctime_ns;
}

static void appendf(char *buf, size_t len, size_t *o, const char *fmt, ...) TV_PRINTF(4, 5);
static void appendf(char *buf, size_t len, size_t *o, const char *fmt, ...)
{
    if (*o >= len)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + *o, len - *o, fmt, ap);
    va_end(ap);
    *o = n < 0 ? *o : (size_t)n >= len - *o ? len : *o + (size_t)n;
}

static void append_time(char *buf, size_t len, size_t *o, const char *what, int64_t have,
                        int64_t want)
{
    appendf(buf, len, o, "%s%s %lld.%09lld (was %lld.%09lld)", *o ? ", " : "", what,
            (long long)(have / 1000000000), (long long)(have % 1000000000),
            (long long)(want / 1000000000), (long long)(want % 1000000000));
}

/* Describes what differs between want and have into what (empty when
 * nothing does). Returns true when something differs. */
static bool stamp_diff(const tv__src_stamp *want, const tv__src_stamp *have, char *what, size_t len)
{
    size_t o = 0;
    what[0] = '\0';
    if (want->dev_id != have->dev_id || want->inode != have->inode)
        appendf(what, len, &o,
                "another file (inode %llu on device %llu, was inode %llu on device %llu)",
                (unsigned long long)have->inode, (unsigned long long)have->dev_id,
                (unsigned long long)want->inode, (unsigned long long)want->dev_id);
    if (want->size != have->size)
        appendf(what, len, &o, "%ssize %llu (was %llu)", o ? ", " : "",
                (unsigned long long)have->size, (unsigned long long)want->size);
    if (want->mtime_ns != have->mtime_ns)
        append_time(what, len, &o, "mtime", have->mtime_ns, want->mtime_ns);
    if (want->ctime_ns != have->ctime_ns)
        append_time(what, len, &o, "ctime", have->ctime_ns, want->ctime_ns);
    return o != 0;
}

/* Takes a read lease, quietly: refused (not the owner, no CAP_LEASE, a
 * writable fd open somewhere, a filesystem without leases) means stamps
 * only. The break signal goes to no one (F_SETOWN 0 once the lease is set;
 * SIGURG, ignored by default, in the instant before): the importer polls
 * F_GETLEASE instead, so a lease break never kills or interrupts the
 * process. */
static bool take_lease(int fd)
{
    if (fcntl(fd, F_SETSIG, SIGURG) < 0)
        return false;
    if (fcntl(fd, F_SETLEASE, F_RDLCK) < 0) {
        (void)fcntl(fd, F_SETSIG, 0);
        return false;
    }
    (void)fcntl(fd, F_SETOWN, 0);
    return true;
}

/* A lease is broken (or being broken) once another process opened the file
 * for writing or truncated it. */
static int check_lease(const tv__src_shard *sf, const tv_shard_info *si, tv_error *err)
{
    if (sf->leased && fcntl(sf->fd, F_GETLEASE) != F_RDLCK)
        return tv__seterr(
            err, TV_E_SOURCE_CHANGED,
            "shard '%s' (%s) was opened for writing or truncated by another process during import",
            si->name, si->path);
    return 0;
}

void tv__src_file_close(tv__src_shard *sf)
{
    if (sf->fd >= 0)
        tv__sys.close(sf->fd); /* releases the lease */
    sf->fd = -1;
    sf->leased = false;
    sf->direct = false;
}

/* True when at least half of the shard's pages are in the page cache (a
 * checkpoint just downloaded or read): reading those from memory beats
 * O_DIRECT. mincore over a mapping that is never touched costs no I/O; any
 * failure says "not cached". */
static bool mostly_cached(int fd, uint64_t file_len)
{
    long pg = sysconf(_SC_PAGESIZE);
    if (pg <= 0 || file_len == 0 || file_len > (uint64_t)SIZE_MAX / 2)
        return false;
    size_t len = (size_t)file_len, n_pages = len / (size_t)pg + 1, resident = 0;
    bool cached = false;
    unsigned char *vec = malloc(n_pages);
    void *map = vec ? tv__sys.mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
    if (map != MAP_FAILED) {
        if (mincore(map, len, vec) == 0) {
            size_t used = (len + (size_t)pg - 1) / (size_t)pg; /* checked: len <= SIZE_MAX / 2 */
            for (size_t i = 0; i < used; i++)
                resident += vec[i] & 1;
            cached = resident * 2 >= used;
        }
        tv__sys.munmap(map, len);
    }
    free(vec);
    return cached;
}

/* Takes fd (closed on failure) as shard si's descriptor and checks that it
 * is still the file whose header was validated (want: its stamps then). */
static int file_setup(int fd, const tv_shard_info *si, const tv__src_stamp *want, tv__src_shard *sf,
                      tv_error *err)
{
    struct stat sb;
    char what[512];
    int rc;
    sf->fd = fd;
    /* Lease first, stamps second: a writer that came and went before the
     * lease left its mark in the stamps. */
    sf->leased = take_lease(fd);
    if ((rc = fd_stamp(fd, si, &sb, &sf->st, err)))
        goto fail;
    if (!S_ISREG(sb.st_mode) || stamp_diff(want, &sf->st, what, sizeof(what))) {
        rc = tv__seterr(err, TV_E_SOURCE_CHANGED,
                        "shard '%s' (%s) changed since it was validated: %s", si->name, si->path,
                        S_ISREG(sb.st_mode) ? what : "not a regular file");
        goto fail;
    }
    /* Not cached: O_DIRECT, where the filesystem takes it (EINVAL: not). */
    int fl = mostly_cached(fd, sf->st.size) ? -1 : fcntl(fd, F_GETFL);
    sf->direct = fl != -1 && fcntl(fd, F_SETFL, fl | O_DIRECT) == 0;
    /* Twice the read-ahead: the next chunk arrives while this one is hashed. */
    if (!sf->direct)
        (void)posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    return 0;
fail:
    tv__src_file_close(sf);
    return rc;
}

/* Opens a shard by its path for reading and checks that it is still the
 * file whose header was validated. */
int tv__src_file_open(const tv_shard_info *si, tv__src_shard *sf, tv_error *err)
{
    tv__src_stamp want;
    sf->fd = -1;
    sf->held = false;
    sf->leased = false;
    sf->direct = false;
    int fd = tv__sys_open(si->path, O_RDONLY | O_NONBLOCK | O_CLOEXEC, 0);
    if (fd < 0)
        return tv__seterr(err, fd, "shard '%s': cannot open %s: %s", si->name, si->path,
                          strerror(-fd));
    stamp_of_info(si, &want);
    return file_setup(fd, si, &want, sf, err);
}

int tv__src_file_open_fd(int fd, const tv_shard_info *si, const tv__src_stamp *want,
                         tv__src_shard *sf, tv_error *err)
{
    sf->held = true;
    sf->leased = false;
    sf->direct = false;
    return file_setup(fd, si, want, sf, err);
}

/* The path still names the inode read (a rename over it also moves the old
 * inode's ctime: the replacement is the better report). */
static int same_path(const tv__src_shard *sf, tv_error *err)
{
    const tv_shard_info *si = sf->si;
    struct stat sb;
    tv__src_stamp now;
    char what[512];
    int pfd = tv__sys_open(si->path, O_RDONLY | O_NONBLOCK | O_CLOEXEC, 0);
    if (pfd < 0)
        return tv__seterr(err, TV_E_SOURCE_CHANGED,
                          "shard '%s' (%s) was removed or renamed during import: %s", si->name,
                          si->path, strerror(-pfd));
    int rc = fd_stamp(pfd, si, &sb, &now, err);
    tv__sys.close(pfd);
    if (rc)
        return rc;
    if (now.dev_id != sf->st.dev_id || now.inode != sf->st.inode) {
        stamp_diff(&sf->st, &now, what, sizeof(what));
        return tv__seterr(err, TV_E_SOURCE_CHANGED,
                          "shard '%s' (%s) was replaced during import: the path now names %s",
                          si->name, si->path, what);
    }
    return 0;
}

/* After the last read: the lease still held, the path still naming the
 * inode read (not for a shard of a source held open: it was never read by
 * its path, what its name says now does not matter), and the fd's stamps
 * unchanged. */
int tv__src_file_check(const tv__src_shard *sf, tv_error *err)
{
    const tv_shard_info *si = sf->si;
    struct stat sb;
    tv__src_stamp now;
    char what[512];
    int rc;
    if ((rc = check_lease(sf, si, err)) || (!sf->held && (rc = same_path(sf, err))))
        return rc;
    if ((rc = fd_stamp(sf->fd, si, &sb, &now, err)))
        return rc;
    if (stamp_diff(&sf->st, &now, what, sizeof(what)))
        return tv__seterr(err, TV_E_SOURCE_CHANGED, "shard '%s' (%s) changed during import: %s",
                          si->name, si->path, what);
    return 0;
}

/* Reads len bytes at off into buf (cap bytes, aligned for O_DIRECT), then
 * checks the lease. An O_DIRECT fd reads len rounded up to SRC_DIO_ALIGN
 * (the tail past EOF comes back short); a read it refuses (EINVAL: an
 * alignment this filesystem does not take) turns the fd buffered for good. */
int tv__src_file_read(tv__src_shard *sf, uint8_t *buf, size_t len, size_t cap, uint64_t off,
                      tv_error *err)
{
    const tv_shard_info *si = sf->si;
    const char *name = si->name;
    size_t done = 0, want = len;
    uint64_t up;
    bool direct = sf->direct;
    if (direct && !tv__align_up_u64(len, SRC_DIO_ALIGN, &up) && up <= cap)
        want = (size_t)up;
    int rc = tv__sys_pread_full(sf->fd, buf, want, off, &done);
    if (direct && rc == -EINVAL && done == 0) {
        int fl = fcntl(sf->fd, F_GETFL);
        if (fl == -1 || fcntl(sf->fd, F_SETFL, fl & ~O_DIRECT) == -1)
            return tv__seterr(err, -errno, "shard '%s': cannot leave O_DIRECT: %s", name,
                              strerror(errno));
        sf->direct = false;
        rc = tv__sys_pread_full(sf->fd, buf, len, off, &done);
    }
    if (rc)
        return tv__seterr(err, rc, "shard '%s': read at %llu: %s", name,
                          (unsigned long long)(off + done), strerror(-rc));
    if (done < len)
        return tv__seterr(err, TV_E_SOURCE_CHANGED,
                          "shard '%s' is shorter than when it was validated (EOF at %llu)", name,
                          (unsigned long long)(off + done));
    return check_lease(sf, si, err);
}

/* ---- dispatch ---------------------------------------------------------------- */

struct tv__src {
    tv__src_http *http;         /* an origin; NULL: local */
    tv__src_local_files *held;  /* a local source held open; NULL: a local path */
    const tv__src_local *local; /* that source (its sidecar files) */
    char *path;                 /* a local path: as named (its sidecar files) */
};

bool tv__src_is_url(const char *src)
{
    return src && (strncasecmp(src, "http://", 7) == 0 || strncasecmp(src, "https://", 8) == 0 ||
                   strncasecmp(src, "s3://", 5) == 0);
}

int tv__src_open(const char *src, const tv__src_http_opts *ho, tv__src **out, tv_checkpoint **ck,
                 char *real, size_t real_len, tv_error *err)
{
    int rc;
    *out = NULL;
    *ck = NULL;
    tv__src *s = calloc(1, sizeof(*s));
    if (!s)
        return tv__seterr(err, -ENOMEM, "out of memory");
    if (tv__src_is_url(src)) {
        if ((rc = tv__src_http_open(src, ho, &s->http, ck, err)))
            goto fail;
        snprintf(real, real_len, "%s", src);
    } else {
        char rp[PATH_MAX];
        if ((rc = tv_checkpoint_open(src, NULL, ck, err)))
            goto fail;
        if (!(s->path = strdup(src))) {
            rc = tv__seterr(err, -ENOMEM, "out of memory");
            goto fail;
        }
        snprintf(real, real_len, "%s", realpath(src, rp) ? rp : src);
    }
    *out = s;
    return 0;
fail:
    tv__src_free(s);
    return rc;
}

int tv__src_open_local(const tv__src_local *l, tv__src **out, tv_checkpoint **ck, char *real,
                       size_t real_len, tv_error *err)
{
    int rc;
    *out = NULL;
    *ck = NULL;
    tv__src *s = calloc(1, sizeof(*s));
    if (!s)
        return tv__seterr(err, -ENOMEM, "out of memory");
    if ((rc = tv__src_local_validate(l, &s->held, ck, err))) {
        tv__src_free(s);
        return rc;
    }
    snprintf(real, real_len, "%s", tv__src_local_real(l));
    s->local = l;
    *out = s;
    return 0;
}

int tv__src_open_pull(const tv__src_pull *p, const tv__src_http_opts *ho, tv__src **out,
                      tv_checkpoint **ck, char *real, size_t real_len, tv_error *err)
{
    int rc;
    *out = NULL;
    *ck = NULL;
    tv__src *s = calloc(1, sizeof(*s));
    if (!s)
        return tv__seterr(err, -ENOMEM, "out of memory");
    if ((rc = tv__src_http_open_pull(p, ho, &s->http, ck, err))) {
        tv__src_free(s);
        return rc;
    }
    snprintf(real, real_len, "%s", p->source && p->source[0] ? p->source : "fleet pull");
    *out = s;
    return 0;
}

void tv__src_free(tv__src *s)
{
    if (!s)
        return;
    tv__src_http_free(s->http);
    tv__src_local_files_free(s->held);
    free(s->path);
    free(s);
}

int tv__src_shard_open(tv__src *s, size_t idx, const tv_shard_info *si, tv__src_shard *sh,
                       tv_error *err)
{
    memset(sh, 0, sizeof(*sh));
    sh->fd = -1;
    sh->src = s;
    sh->si = si;
    sh->idx = idx;
    if (s->http)
        return 0; /* every read is checked against the validators */
    if (s->held) {
        int fd, rc;
        tv__src_stamp want;
        if ((rc = tv__src_local_reopen(s->held, si, &fd, &want, err)))
            return rc;
        return tv__src_file_open_fd(fd, si, &want, sh, err);
    }
    return tv__src_file_open(si, sh, err);
}

int tv__src_shard_read(tv__src_shard *sh, uint8_t *buf, size_t len, size_t cap, uint64_t off,
                       tv_error *err)
{
    if (sh->src->http)
        return tv__src_http_read(sh->src->http, sh->idx, sh->si, buf, len, off, err);
    return tv__src_file_read(sh, buf, len, cap, off, err);
}

const char *tv__src_validator(tv__src *s, const tv_shard_info *si)
{
    return s && s->http ? tv__src_http_validator(s->http, si->name) : NULL;
}

int tv__src_shard_check(tv__src_shard *sh, tv_error *err)
{
    if (sh->src->http)
        return 0; /* each response carried the validated ETag / Last-Modified */
    return tv__src_file_check(sh, err);
}

void tv__src_shard_willneed(tv__src_shard *sh, uint64_t off, size_t len)
{
    if (!sh->src->http && !sh->direct && sh->fd >= 0)
        (void)posix_fadvise(sh->fd, (off_t)off, (off_t)len, POSIX_FADV_WILLNEED);
}

void tv__src_shard_close(tv__src_shard *sh)
{
    if (sh->src && !sh->src->http)
        tv__src_file_close(sh);
    sh->fd = -1;
}

/* ---- sidecar files ---- */

int tv__src_sidecars(tv__src *s, const tv__sidecar_caps *caps, tv__sidecars *set, tv_error *err)
{
    if (s->http)
        return tv__src_http_sidecars(s->http, caps, set, err);
    if (s->local)
        return tv__src_local_sidecars(s->local, caps, set, err);
    /* A local path (the CLI's local mode): the same walk over what the
     * path names now, without import roots. */
    tv__src_local *l;
    int rc = tv__src_local_open(s->path, NULL, 0, &l, err);
    if (rc)
        return rc;
    rc = tv__src_local_sidecars(l, caps, set, err);
    tv__src_local_free(l);
    return rc;
}
