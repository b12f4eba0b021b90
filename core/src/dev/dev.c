/* Device open, geometry, kind detection and full-length positioned I/O.
 *
 * Invariants: all device syscalls on the data path (pread, pwrite,
 * fdatasync, ioctl) go through tv__sys; a transfer either moves every byte
 * or returns an error (short transfers are looped, EINTR retried, a 0-byte
 * transfer is TV_E_SHORT_IO); with O_DIRECT the buffer, length and offset
 * are io_align-aligned or the call is refused before any syscall; no I/O
 * reaches past size_bytes. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/fs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "dev/dev.h"
#include "util/sys.h"

const char *tv__dev_kind_name(int kind)
{
    switch (kind) {
    case TV__DEV_FILE:
        return "file";
    case TV__DEV_BLOCK:
        return "block";
    case TV__DEV_NVME:
        return "nvme";
    default:
        return "unknown";
    }
}

int tv__dev_compute_align(uint32_t lba_size, uint32_t *io_align, uint64_t *object_align,
                          tv_error *err)
{
    uint64_t io = 0, obj = 0;

    if (lba_size < TV__DEV_MIN_LBA || lba_size > TV__DEV_MAX_LBA || (lba_size & (lba_size - 1)))
        return tv__seterr(err, TV_E_INVALID_ARG,
                          "logical block size %u is not a power of two in [%u, %u]", lba_size,
                          TV__DEV_MIN_LBA, TV__DEV_MAX_LBA);
    if (tv__lcm_u64(lba_size, TV__DEV_MIN_ALIGN, &io) || io > UINT32_MAX)
        return tv__seterr(err, TV_E_OVERFLOW, "io alignment for lba size %u overflows", lba_size);
    if (tv__lcm_u64(TV__DEV_OBJECT_ALIGN_MIN, io, &obj))
        return tv__seterr(err, TV_E_OVERFLOW, "object alignment for io alignment %llu overflows",
                          (unsigned long long)io);
    *io_align = (uint32_t)io;
    *object_align = obj;
    return 0;
}

bool tv__dev_is_nvme_name(const char *name)
{
    /* nvme<ctrl>n<ns> or the multipath-hidden nvme<subsys>c<ctrl>n<ns>. */
    const char *p = name;
    if (!p || strncmp(p, "nvme", 4) != 0)
        return false;
    p += 4;
    if (*p < '0' || *p > '9')
        return false;
    while (*p >= '0' && *p <= '9')
        p++;
    if (*p == 'c') {
        p++;
        if (*p < '0' || *p > '9')
            return false;
        while (*p >= '0' && *p <= '9')
            p++;
    }
    if (*p != 'n')
        return false;
    p++;
    if (*p < '0' || *p > '9')
        return false;
    while (*p >= '0' && *p <= '9')
        p++;
    return *p == '\0';
}

/* " (the filesystem is full)" for the errors that mean it, else "". */
static const char *full_hint(int neg_errno)
{
    if (neg_errno == -ENOSPC)
        return " (no space left on the filesystem holding it)";
    if (neg_errno == -EDQUOT)
        return " (disk quota exceeded on the filesystem holding it)";
    return "";
}

/* The directory part of path, for the fsync after creating an entry. */
static void dir_of(const char *path, char *out, size_t cap)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(out, cap, ".");
    else if (slash == path)
        snprintf(out, cap, "/");
    else
        snprintf(out, cap, "%.*s", (int)(slash - path), path);
}

int tv__dev_create_image(const char *path, uint64_t size_bytes, tv_error *err)
{
    int fd, rc = 0;
    char dir[PATH_MAX];

    if (!path || !*path)
        return tv__seterr(err, TV_E_INVALID_ARG, "image path is empty");
    if (size_bytes == 0 || size_bytes % TV__DEV_MIN_ALIGN || size_bytes > (uint64_t)INT64_MAX)
        return tv__seterr(err, TV_E_INVALID_ARG,
                          "image size %llu is 0, not a multiple of %u or too large",
                          (unsigned long long)size_bytes, TV__DEV_MIN_ALIGN);
    fd = tv__sys_open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
    if (fd < 0)
        return tv__seterr(err, fd, "create image %s: %s%s", path, strerror(-fd), full_hint(fd));
    if (tv__sys.ftruncate(fd, (off_t)size_bytes) != 0) {
        rc = -errno;
        tv__seterr(err, rc, "ftruncate image %s to %llu bytes: %s%s", path,
                   (unsigned long long)size_bytes, strerror(-rc), full_hint(rc));
        goto fail_unlink;
    }
    if ((rc = tv__sys_fsync(fd)) != 0) {
        tv__seterr(err, rc, "fsync image %s: %s%s", path, strerror(-rc), full_hint(rc));
        goto fail_unlink;
    }
    dir_of(path, dir, sizeof dir);
    if ((rc = tv__sys_fsync_dir(dir)) != 0) {
        tv__seterr(err, rc, "fsync directory %s after creating image %s: %s%s", dir, path,
                   strerror(-rc), full_hint(rc));
        goto fail_unlink;
    }
    tv__sys.close(fd);
    return 0;

fail_unlink:
    tv__sys.close(fd);
    tv__sys.unlink(path);
    return rc;
}

/* Opens with O_DIRECT when asked, falling back to buffered I/O on
 * filesystems that refuse it (EINVAL, e.g. tmpfs before Linux 6.6).
 * O_NONBLOCK keeps a FIFO planted at path from blocking the open; the
 * caller checks the type and clears it. */
static int open_fd(const char *path, int oflags, bool want_direct, bool *direct)
{
    int fd;

    *direct = false;
    oflags |= O_NONBLOCK;
    if (want_direct) {
        fd = tv__sys_open(path, oflags | O_DIRECT, 0);
        if (fd >= 0) {
            *direct = true;
            return fd;
        }
        if (fd != -EINVAL)
            return fd;
    }
    return tv__sys_open(path, oflags, 0);
}

static int block_geometry(tv__dev *d, tv_error *err)
{
    int ssz = 0;
    uint64_t size = 0;

    if (tv__sys.ioctl(d->fd, BLKSSZGET, &ssz) != 0) {
        int rc = -errno;
        return tv__seterr(err, rc, "ioctl BLKSSZGET on %s: %s", d->path, strerror(-rc));
    }
    if (tv__sys.ioctl(d->fd, BLKGETSIZE64, &size) != 0) {
        int rc = -errno;
        return tv__seterr(err, rc, "ioctl BLKGETSIZE64 on %s: %s", d->path, strerror(-rc));
    }
    if (ssz <= 0)
        return tv__seterr(err, TV_E_INVALID_ARG, "%s reports logical block size %d", d->path, ssz);
    d->lba_size = (uint32_t)ssz;
    d->size_bytes = size;
    return 0;
}

/* The kernel's name of the block device (sysfs), to recognise a whole NVMe
 * namespace whatever path (symlink, by-id) was given. */
static bool sysfs_is_nvme(const struct stat *st)
{
    char link[64], target[PATH_MAX];
    ssize_t n;
    const char *base;

    snprintf(link, sizeof link, "/sys/dev/block/%u:%u", major(st->st_rdev), minor(st->st_rdev));
    n = readlink(link, target, sizeof target - 1);
    if (n <= 0)
        return false;
    target[n] = '\0';
    base = strrchr(target, '/');
    return tv__dev_is_nvme_name(base ? base + 1 : target);
}

static void nvme_detect(tv__dev *d, const struct stat *st)
{
    tv_error nerr = {0};
    int rc;

    if (!sysfs_is_nvme(st))
        return;
    rc = tv__nvme_identify(d->fd, &d->ident, &nerr);
    if (rc == TV_E_NOT_SUPPORTED) {
        tv__log(TV_LOG_INFO, "%s: NVMe namespace treated as a plain block device (%s)", d->path,
                nerr.msg);
        memset(&d->ident, 0, sizeof d->ident);
        return;
    }
    if (rc != 0) {
        tv__log(TV_LOG_WARN, "%s: NVMe identify failed, treating as a plain block device: %s",
                d->path, nerr.msg);
        memset(&d->ident, 0, sizeof d->ident);
        return;
    }
    if (d->ident.lba_size != d->lba_size)
        tv__log(TV_LOG_WARN, "%s: NVMe LBA format says %u bytes, kernel says %u; using %u", d->path,
                d->ident.lba_size, d->lba_size, d->lba_size);
    d->kind = TV__DEV_NVME;
}

int tv__dev_open(const char *path, unsigned flags, tv__dev **out, tv_error *err)
{
    tv__dev *d = NULL;
    struct stat st;
    int rc, fd;
    bool direct = false;

    if (out)
        *out = NULL;
    if (!path || !*path || !out)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__dev_open: NULL or empty argument");
    if (flags & ~(TV__DEV_O_RDWR | TV__DEV_O_NODIRECT | TV__DEV_O_NOFOLLOW))
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__dev_open %s: unknown flags 0x%x", path,
                          flags);

    fd = open_fd(path,
                 ((flags & TV__DEV_O_RDWR) ? O_RDWR : O_RDONLY) | O_CLOEXEC |
                     ((flags & TV__DEV_O_NOFOLLOW) ? O_NOFOLLOW : 0),
                 !(flags & TV__DEV_O_NODIRECT), &direct);
    if (fd == -ELOOP && (flags & TV__DEV_O_NOFOLLOW))
        return tv__seterr(err, fd, "open device %s: is a symlink (not followed)", path);
    if (fd < 0)
        return tv__seterr(err, fd, "open device %s: %s", path, strerror(-fd));

    d = calloc(1, sizeof *d);
    if (!d) {
        rc = tv__seterr(err, -ENOMEM, "open device %s: out of memory", path);
        goto fail_fd;
    }
    d->fd = fd;
    d->direct = direct;
    d->writable = (flags & TV__DEV_O_RDWR) != 0;
    d->path = strdup(path);
    if (!d->path) {
        rc = tv__seterr(err, -ENOMEM, "open device %s: out of memory", path);
        goto fail_dev;
    }
    if (tv__sys.fstat(fd, &st) != 0) {
        rc = -errno;
        tv__seterr(err, rc, "fstat %s: %s", path, strerror(-rc));
        goto fail_dev;
    }
    if (S_ISREG(st.st_mode)) {
        d->kind = TV__DEV_FILE;
        d->lba_size = TV__DEV_MIN_LBA;
        d->size_bytes = (uint64_t)st.st_size;
    } else if (S_ISBLK(st.st_mode)) {
        d->kind = TV__DEV_BLOCK;
        rc = block_geometry(d, err);
        if (rc)
            goto fail_dev;
    } else {
        rc = tv__seterr(err, TV_E_INVALID_ARG, "%s is neither a regular file nor a block device",
                        path);
        goto fail_dev;
    }
    /* The type is known (no FIFO): blocking I/O from here on. */
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0) {
        rc = -errno;
        tv__seterr(err, rc, "fcntl %s: %s", path, strerror(-rc));
        goto fail_dev;
    }
    if (d->size_bytes == 0) {
        rc = tv__seterr(err, TV_E_INVALID_ARG, "device %s is empty (0 bytes)", path);
        goto fail_dev;
    }
    rc = tv__dev_compute_align(d->lba_size, &d->io_align, &d->object_align, err);
    if (rc)
        goto fail_dev;
    if (d->kind == TV__DEV_BLOCK)
        nvme_detect(d, &st);
    if (!direct && !(flags & TV__DEV_O_NODIRECT))
        tv__log(TV_LOG_INFO, "%s: O_DIRECT not supported here, using buffered I/O", path);
    *out = d;
    return 0;

fail_dev:
    free(d->path);
    free(d);
fail_fd:
    tv__sys.close(fd);
    return rc;
}

void tv__dev_close(tv__dev *d)
{
    if (!d)
        return;
    if (d->fd >= 0)
        tv__sys.close(d->fd);
    free(d->path);
    free(d);
}

void *tv__dev_alloc_aligned(const tv__dev *d, size_t len)
{
    uint64_t rounded;
    void *p;

    if (!d || d->io_align == 0)
        return NULL;
    if (tv__align_up_u64(len ? len : 1, d->io_align, &rounded) || rounded > SIZE_MAX)
        return NULL;
    p = aligned_alloc(d->io_align, (size_t)rounded);
    if (p)
        memset(p, 0, (size_t)rounded);
    return p;
}

/* Shared argument checks of the transfer functions. */
static int check_io(const tv__dev *d, const char *op, const void *buf, size_t len, uint64_t off,
                    tv_error *err)
{
    uint64_t end;

    if (!d)
        return tv__seterr(err, TV_E_INVALID_ARG, "%s: NULL device", op);
    if (!buf && len)
        return tv__seterr(err, TV_E_INVALID_ARG, "%s %s: NULL buffer", op, d->path);
    if (tv__add_u64(off, len, &end))
        return tv__seterr(err, TV_E_OVERFLOW, "%s %s: offset %llu + length %zu overflows", op,
                          d->path, (unsigned long long)off, len);
    if (end > d->size_bytes)
        return tv__seterr(err, TV_E_INVALID_ARG,
                          "%s %s: [%llu, %llu) reaches past the end of the device (%llu bytes)", op,
                          d->path, (unsigned long long)off, (unsigned long long)end,
                          (unsigned long long)d->size_bytes);
    if (d->direct && (off % d->io_align || len % d->io_align || (uintptr_t)buf % d->io_align))
        return tv__seterr(
            err, TV_E_INVALID_ARG,
            "%s %s: O_DIRECT needs buffer %p, offset %llu and length %zu aligned to %u bytes", op,
            d->path, buf, (unsigned long long)off, len, d->io_align);
    return 0;
}

int tv__dev_pread_full(tv__dev *d, void *buf, size_t len, uint64_t off, tv_error *err)
{
    size_t done = 0;
    int rc = check_io(d, "read", buf, len, off, err);

    if (rc)
        return rc;
    rc = tv__sys_pread_full(d->fd, buf, len, off, &done);
    if (rc)
        return tv__seterr(err, rc, "read %s: offset %llu length %zu (at +%zu): %s", d->path,
                          (unsigned long long)off, len, done, strerror(-rc));
    if (done < len)
        return tv__seterr(err, TV_E_SHORT_IO,
                          "read %s: offset %llu length %zu: end of data after %zu bytes", d->path,
                          (unsigned long long)off, len, done);
    return 0;
}

int tv__dev_pwrite_full(tv__dev *d, const void *buf, size_t len, uint64_t off, tv_error *err)
{
    size_t done = 0;
    int rc = check_io(d, "write", buf, len, off, err);

    if (rc)
        return rc;
    if (!d->writable)
        return tv__seterr(err, -EBADF, "write %s: device opened read-only", d->path);
    rc = tv__sys_pwrite_upto(d->fd, buf, len, off, &done);
    if (rc)
        return tv__seterr(err, rc, "write %s: offset %llu length %zu (at +%zu): %s", d->path,
                          (unsigned long long)off, len, done, strerror(-rc));
    if (done < len)
        return tv__seterr(err, TV_E_SHORT_IO,
                          "write %s: offset %llu length %zu: device accepted 0 bytes after %zu",
                          d->path, (unsigned long long)off, len, done);
    return 0;
}

int tv__dev_flush(tv__dev *d, tv_error *err)
{
    int rc;

    if (!d)
        return tv__seterr(err, TV_E_INVALID_ARG, "flush: NULL device");
    /* Only EINTR is retried (tv__sys_fdatasync): after a real writeback
     * error the dirty pages may be gone, so a second fdatasync could falsely
     * report success. */
    rc = tv__sys_fdatasync(d->fd);
    if (rc)
        return tv__seterr(err, rc, "fdatasync %s: %s", d->path, strerror(-rc));
    return 0;
}
