/* Listening UNIX sockets of the daemon (the fast path's SOCK_SEQPACKET
 * socket, HTTP's SOCK_STREAM socket): one way to create them safely.
 *
 * Invariants: the socket is bound under a temporary name beside the final
 * path, given its mode, then renamed into place without replacing anything
 * (renameat2 RENAME_NOREPLACE), so it is never reachable with the umask's
 * mode nor at a path swapped for a link between bind and chmod; missing
 * parent directories are created 0750; a socket file nobody answers on is
 * replaced (a crash left it), one that answers is refused; a path with no
 * room for the temporary suffix is bound in place (its directory is then
 * the protection). */
#ifndef TV_NET_UNIXSOCK_H
#define TV_NET_UNIXSOCK_H

#include "tensorvault/errors.h"

/* Creates, binds and listens (backlog) on a UNIX socket of type
 * (SOCK_STREAM or SOCK_SEQPACKET) at path with mode; what names it in
 * messages ("fastpath", "http"). Returns the non-blocking, close-on-exec
 * listening descriptor; TV_E_INVALID_ARG for an empty path or one over 107
 * bytes; -EADDRINUSE when another process answers there; -EEXIST when the
 * path is not a socket; -errno (the message names the path and the step). */
int tv__unix_listen(const char *path, int type, unsigned mode, int backlog, const char *what,
                    tv_error *err);

#endif
