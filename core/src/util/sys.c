/* Default (real) system-call table and the transfer helpers; see sys.h. */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "util/sys.h"

static int real_open(const char *path, int flags, mode_t mode)
{
    return open(path, flags, mode);
}
static int real_openat(int dir_fd, const char *path, int flags, mode_t mode)
{
    return openat(dir_fd, path, flags, mode);
}
static int real_ioctl(int fd, unsigned long req, void *arg)
{
    return ioctl(fd, req, arg);
}
static int real_rename_noreplace(const char *from, const char *to)
{
    return renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_NOREPLACE);
}

#define TV__SYS_REAL                                                                               \
    {                                                                                              \
        .open = real_open, .openat = real_openat, .close = close, .pread = pread,                  \
        .pwrite = pwrite, .fsync = fsync, .fdatasync = fdatasync, .ftruncate = ftruncate,          \
        .fstat = fstat, .ioctl = real_ioctl, .flock = flock, .rename = rename,                     \
        .rename_noreplace = real_rename_noreplace, .link = link, .unlink = unlink, .mkdir = mkdir, \
        .mmap = mmap, .munmap = munmap, .lseek = lseek, .fallocate = fallocate,                    \
        .madvise = madvise, .sendmsg = sendmsg, .recvmsg = recvmsg,                                \
    }

static const tv__sys_ops g_real = TV__SYS_REAL;
tv__sys_ops tv__sys = TV__SYS_REAL;
void (*tv__sys_crash_hook)(const char *point);

void tv__sys_reset(void)
{
    tv__sys = g_real;
}

int tv__sys_open(const char *path, int flags, mode_t mode)
{
    int fd;
    while ((fd = tv__sys.open(path, flags, mode)) < 0 && errno == EINTR)
        ;
    return fd < 0 ? -errno : fd;
}

int tv__sys_openat(int dir_fd, const char *path, int flags, mode_t mode)
{
    int fd;
    while ((fd = tv__sys.openat(dir_fd, path, flags, mode)) < 0 && errno == EINTR)
        ;
    return fd < 0 ? -errno : fd;
}

/* The one transfer loop of pread_full and pwrite_upto: retries EINTR and
 * short transfers, stops at EOF (0), refuses a transfer longer than asked. */
static int xfer_loop(int fd, char *buf, size_t len, uint64_t off, bool write, size_t *done_len)
{
    size_t done = 0;
    int rc = 0;
    while (done < len) {
        ssize_t n = write ? tv__sys.pwrite(fd, buf + done, len - done, (off_t)(off + done))
                          : tv__sys.pread(fd, buf + done, len - done, (off_t)(off + done));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            rc = -errno;
            break;
        }
        if (n == 0)
            break;
        if ((size_t)n > len - done) { /* a broken (or injected) pread/pwrite */
            rc = -EIO;
            break;
        }
        done += (size_t)n;
    }
    if (done_len)
        *done_len = done;
    return rc;
}

int tv__sys_pread_full(int fd, void *buf, size_t len, uint64_t off, size_t *got_len)
{
    return xfer_loop(fd, buf, len, off, false, got_len);
}

int tv__sys_pread_exact(int fd, void *buf, size_t len, uint64_t off)
{
    size_t got = 0;
    int rc = tv__sys_pread_full(fd, buf, len, off, &got);
    if (rc == 0 && got != len)
        rc = -ENODATA;
    return rc;
}

int tv__sys_pwrite_upto(int fd, const void *buf, size_t len, uint64_t off, size_t *put_len)
{
    /* The loop only passes buf on to pwrite: it never writes through it. */
    return xfer_loop(fd, (char *)(uintptr_t)buf, len, off, true, put_len);
}

int tv__sys_pwrite_full(int fd, const void *buf, size_t len, uint64_t off)
{
    size_t put = 0;
    int rc = tv__sys_pwrite_upto(fd, buf, len, off, &put);
    if (rc == 0 && put != len)
        rc = -EIO;
    return rc;
}

int tv__sys_fsync(int fd)
{
    int rc;
    while ((rc = tv__sys.fsync(fd)) < 0 && errno == EINTR)
        ;
    return rc < 0 ? -errno : 0;
}

int tv__sys_fdatasync(int fd)
{
    int rc;
    while ((rc = tv__sys.fdatasync(fd)) < 0 && errno == EINTR)
        ;
    return rc < 0 ? -errno : 0;
}

int tv__sys_fsync_dir(const char *path)
{
    int fd = tv__sys_open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
    if (fd < 0)
        return fd;
    int rc = tv__sys_fsync(fd);
    tv__sys.close(fd);
    return rc;
}
