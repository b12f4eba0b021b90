/* Default (real) system-call table; see sys.h. */
#include <sys/ioctl.h>
#include <unistd.h>

#include "util/sys.h"

static int real_ioctl(int fd, unsigned long req, void *arg)
{
    return ioctl(fd, req, arg);
}

static const tv__sys_ops g_real = {
    .pread = pread,
    .pwrite = pwrite,
    .fdatasync = fdatasync,
    .ioctl = real_ioctl,
};

tv__sys_ops tv__sys = {
    .pread = pread,
    .pwrite = pwrite,
    .fdatasync = fdatasync,
    .ioctl = real_ioctl,
};

void tv__sys_reset(void)
{
    tv__sys = g_real;
}
