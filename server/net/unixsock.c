/* Listening UNIX sockets (see unixsock.h). */
#include "net/unixsock.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "util/internal.h"
#include "util/sys.h"

/* mkdir -p of the socket's directory (new ones 0750). */
static int make_parent(const char *path, const char *what, tv_error *err)
{
    char dir[sizeof(((struct sockaddr_un *)0)->sun_path)];
    char *slash;
    snprintf(dir, sizeof dir, "%s", path);
    slash = strrchr(dir, '/');
    if (!slash || slash == dir)
        return 0;
    *slash = '\0';
    for (char *p = dir + 1;; p++) {
        bool last = *p == '\0';
        if (*p != '/' && !last)
            continue;
        *p = '\0';
        if (tv__sys.mkdir(dir, 0750) && errno != EEXIST)
            return tv__seterr(err, -errno, "%s: creating directory %s for the socket: %s", what,
                              dir, strerror(errno));
        if (last)
            break;
        *p = '/';
    }
    return 0;
}

/* A socket file already at path: -EADDRINUSE when someone answers on it,
 * else unlinked (stale). */
static int clear_stale(const char *path, int type, const struct sockaddr_un *sa, const char *what,
                       tv_error *err)
{
    struct stat sb;
    int c, rc = 0;
    if (lstat(path, &sb)) {
        if (errno == ENOENT)
            return 0;
        return tv__seterr(err, -errno, "%s: socket %s: %s", what, path, strerror(errno));
    }
    if (!S_ISSOCK(sb.st_mode))
        return tv__seterr(err, -EEXIST, "%s: %s exists and is not a socket", what, path);
    c = socket(AF_UNIX, type | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (c < 0)
        return tv__seterr(err, -errno, "%s: socket(): %s", what, strerror(errno));
    if (connect(c, (const struct sockaddr *)sa, sizeof(*sa)) == 0 || errno == EAGAIN ||
        errno == EINPROGRESS) {
        rc = tv__seterr(err, -EADDRINUSE, "%s: another tensorvaultd answers on %s", what, path);
    } else if (errno == ECONNREFUSED || errno == ENOENT) {
        if (tv__sys.unlink(path) && errno != ENOENT)
            rc = tv__seterr(err, -errno, "%s: removing the stale socket %s: %s", what, path,
                            strerror(errno));
        else
            tv__log(TV_LOG_INFO, "%s: removed the stale socket %s", what, path);
    } else {
        rc = tv__seterr(err, -errno, "%s: probing the socket %s: %s", what, path, strerror(errno));
    }
    tv__sys.close(c);
    return rc;
}

int tv__unix_listen(const char *path, int type, unsigned mode, int backlog, const char *what,
                    tv_error *err)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    bool bound = false;
    int fd = -1, rc;
    if (!path || !path[0] || strlen(path) >= sizeof sa.sun_path)
        return tv__seterr(err, TV_E_INVALID_ARG, "%s: socket path '%s' is empty or over %zu bytes",
                          what, path ? path : "", sizeof sa.sun_path - 1);
    memcpy(sa.sun_path, path, strlen(path));
    if ((rc = make_parent(path, what, err)) || (rc = clear_stale(path, type, &sa, what, err)))
        return rc;
    fd = socket(AF_UNIX, type | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return tv__seterr(err, -errno, "%s: socket(): %s", what, strerror(errno));
    struct sockaddr_un tmp = sa;
    int tl = snprintf(tmp.sun_path, sizeof tmp.sun_path, "%s.%ld.tmp", path, (long)getpid());
    bool via_tmp = tl > 0 && (size_t)tl < sizeof tmp.sun_path;
    if (!via_tmp)
        tmp = sa;
    (void)tv__sys.unlink(tmp.sun_path); /* a temporary left by a crash of this pid */
    if (bind(fd, (struct sockaddr *)&tmp, sizeof tmp)) {
        rc = tv__seterr(err, errno == EADDRINUSE ? -EADDRINUSE : -errno, "%s: bind %s: %s", what,
                        tmp.sun_path, strerror(errno));
        goto fail;
    }
    bound = !via_tmp;
    if (chmod(tmp.sun_path, mode)) {
        rc = tv__seterr(err, -errno, "%s: chmod %o %s: %s", what, mode, tmp.sun_path,
                        strerror(errno));
        if (via_tmp)
            (void)tv__sys.unlink(tmp.sun_path);
        goto fail;
    }
    if (via_tmp) {
        if (tv__sys.rename_noreplace(tmp.sun_path, path)) {
            int e = errno;
            (void)tv__sys.unlink(tmp.sun_path);
            rc = tv__seterr(err, e == EEXIST ? -EADDRINUSE : -e, "%s: rename %s to %s: %s", what,
                            tmp.sun_path, path,
                            e == EEXIST ? "another socket appeared there" : strerror(e));
            goto fail;
        }
        bound = true;
    }
    if (listen(fd, backlog)) {
        rc = tv__seterr(err, -errno, "%s: listen on %s: %s", what, path, strerror(errno));
        goto fail;
    }
    return fd;
fail:
    if (bound)
        (void)tv__sys.unlink(path);
    tv__sys.close(fd);
    return rc;
}
