/* The one door to the OS: an overridable system-call table (SQLite's
 * aSyscall[] idea) plus the "transfer everything" helpers built on it.
 * Every open, openat, pread, pwrite, fsync, fdatasync, ftruncate, fstat, ioctl,
 * flock, rename, link, unlink, mkdir, mmap, munmap, lseek, fallocate and madvise on a
 * device, shard, snapshot, store file or the fast path's memory tier goes through tv__sys, so tests
 * can fail, shorten or crash any of them without real hardware; so do sendmsg and recvmsg on the
 * fast-path socket (wire/wire.c), so tests can fail a send or a receive.
 *
 * Invariants: production code never calls these syscalls directly on those
 * files (scripts/check-syscalls enforces it); tests restore the table with
 * tv__sys_reset after each case; tv__crash_point is a no-op unless a test
 * build installed tv__sys_crash_hook (the shipped binaries never do). */
#ifndef TV_UTIL_SYS_H
#define TV_UTIL_SYS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

struct msghdr; /* <sys/socket.h> */

typedef struct tv__sys_ops {
    int (*open)(const char *path, int flags, mode_t mode);
    /* openat(2): path relative to the directory open as dir_fd (an import
     * source held open, server/import/src_local.c). */
    int (*openat)(int dir_fd, const char *path, int flags, mode_t mode);
    int (*close)(int fd);
    ssize_t (*pread)(int fd, void *buf, size_t len, off_t off);
    ssize_t (*pwrite)(int fd, const void *buf, size_t len, off_t off);
    int (*fsync)(int fd);
    int (*fdatasync)(int fd);
    int (*ftruncate)(int fd, off_t len);
    int (*fstat)(int fd, struct stat *sb);
    int (*ioctl)(int fd, unsigned long req, void *arg);
    int (*flock)(int fd, int op);
    int (*rename)(const char *from, const char *to);
    /* rename that fails with EEXIST instead of replacing (renameat2
     * RENAME_NOREPLACE; EINVAL/ENOSYS/ENOTSUP where unsupported). */
    int (*rename_noreplace)(const char *from, const char *to);
    int (*link)(const char *from, const char *to);
    int (*unlink)(const char *path);
    int (*mkdir)(const char *path, mode_t mode);
    /* mmap(2) of a file (snapshot files only: a device is never mapped);
     * MAP_FAILED with errno on failure. */
    void *(*mmap)(void *addr, size_t len, int prot, int flags, int fd, off_t off);
    int (*munmap)(void *addr, size_t len);
    off_t (*lseek)(int fd, off_t off, int whence); /* SEEK_DATA/SEEK_HOLE scans */
    /* fallocate(2): the fast path's memory tier punches the holes of the
     * chunks it evicts (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE). */
    int (*fallocate)(int fd, int mode, off_t off, off_t len);
    /* madvise(2) of a mapping (the tier's MADV_HUGEPAGE, the fast-path
     * client's MADV_POPULATE_READ of the chunks it copies). */
    int (*madvise)(void *addr, size_t len, int advice);
    /* The fast-path socket (wire/wire.c: one datagram, SCM_RIGHTS). */
    ssize_t (*sendmsg)(int sock, const struct msghdr *msg, int flags);
    ssize_t (*recvmsg)(int sock, struct msghdr *msg, int flags);
} tv__sys_ops;

extern tv__sys_ops tv__sys;

/* Restores the real system calls. */
void tv__sys_reset(void);

/* Test-build crash hook: called by tv__crash_point at every named crash
 * point (after a step's durable effect, before the next one). NULL in the
 * shipped binaries; tests/tools/tensorvault_crashtest.c installs one that
 * kill -9s at the point named by TV_TEST_CRASH_AT.
 *
 * Crash points (name: where, what is durable when it fires):
 *   reserve             import: extents reserved ('writing' objects committed)
 *   write               import: about half of the shard bytes written
 *   flush               import: every byte written and fdatasync'ed
 *   publish             import: publish transaction built, not yet committed
 *   import.commit       import: generation published (registry committed);
 *                       with --activate the activate.* points follow
 *   activate.snapshot   activate: the target's snapshot file exists
 *   activate.pointer    activate: active pointer renamed (readers switched),
 *                       registry transaction open, not committed
 *   activate.commit     activate: registry's active generation committed
 *   retire.commit       retire: generation state 'retired' committed
 *   gc.snapshot_unlink  gc: one retired generation's snapshot file unlinked
 *   gc.commit           gc: one object's row deleted (its extent is free)
 */
extern void (*tv__sys_crash_hook)(const char *point);
static inline void tv__crash_point(const char *point)
{
    if (tv__sys_crash_hook)
        tv__sys_crash_hook(point);
}

/* ---- transfer-everything helpers (EINTR retried; return 0 or -errno) ---- */

/* open(2) through the table; returns fd >= 0 or -errno. */
int tv__sys_open(const char *path, int flags, mode_t mode);
/* openat(2) through the table; returns fd >= 0 or -errno. */
int tv__sys_openat(int dir_fd, const char *path, int flags, mode_t mode);
/* Reads up to len bytes at off, stopping only at EOF; *got_len (may be NULL)
 * receives the count. Returns 0 (check *got_len for a short file) or -errno. */
int tv__sys_pread_full(int fd, void *buf, size_t len, uint64_t off, size_t *got_len);
/* Reads exactly len bytes at off; EOF before len is -ENODATA. */
int tv__sys_pread_exact(int fd, void *buf, size_t len, uint64_t off);
/* Writes up to len bytes at off, stopping only at a write that accepts 0
 * bytes; *put_len (may be NULL) receives the count, also on error.
 * Returns 0 (check *put_len for a full device) or -errno. */
int tv__sys_pwrite_upto(int fd, const void *buf, size_t len, uint64_t off, size_t *put_len);
/* Writes all len bytes at off; a zero-byte write is -EIO. */
int tv__sys_pwrite_full(int fd, const void *buf, size_t len, uint64_t off);
int tv__sys_fsync(int fd);
int tv__sys_fdatasync(int fd);
/* fsyncs a directory (after creating, renaming or unlinking an entry). */
int tv__sys_fsync_dir(const char *path);

#endif
