/* The overridable system-call table. Every pread, pwrite, fdatasync and ioctl
 * on a device or shard goes through tv__sys so tests can inject EIO, ENOSPC
 * and short transfers without touching real hardware.
 *
 * Invariant: production code never calls these syscalls directly on store
 * data paths; tests restore the table (tv__sys_reset) after each case. */
#ifndef TV_UTIL_SYS_H
#define TV_UTIL_SYS_H

#include <sys/types.h>

typedef struct tv__sys_ops {
    ssize_t (*pread)(int fd, void *buf, size_t len, off_t off);
    ssize_t (*pwrite)(int fd, const void *buf, size_t len, off_t off);
    int (*fdatasync)(int fd);
    int (*ioctl)(int fd, unsigned long req, void *arg);
} tv__sys_ops;

extern tv__sys_ops tv__sys;

/* Restores the real system calls. */
void tv__sys_reset(void);

#endif
