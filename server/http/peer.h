/* Who is on the other end of an HTTP connection, learned once when it is
 * accepted, so the access rules (fastpath/access.h) apply to HTTP as they
 * do to the fast path:
 *   - over the daemon's UNIX socket (http.socket): the peer's uid, gid and
 *     supplementary groups (SO_PEERCRED, SO_PEERGROUPS);
 *   - over TCP from a loopback address: the uid that owns the client's
 *     socket, from the kernel's socket table (NETLINK_SOCK_DIAG, an exact
 *     lookup of the connection's 4-tuple: what identd answers), and that
 *     user's groups from the user database;
 *   - otherwise nobody: the request is anonymous unless it carries a token.
 *
 * Invariants: a lookup never trusts anything the client sends (addresses
 * come from getsockname/getpeername of the accepted socket); a lookup that
 * fails leaves the peer unidentified (anonymous), never another user; group
 * lists of loopback users are cached per uid for PEER_GROUPS_TTL_S seconds,
 * so NSS is asked at most that often per user. */
#ifndef TV_HTTP_PEER_H
#define TV_HTTP_PEER_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/types.h>

#define TV__PEER_MAX_GIDS 64 /* groups kept per peer (the rest are not matched) */

typedef struct tv__http_peer {
    bool local;     /* uid and gids are known */
    bool unix_sock; /* came over the UNIX socket */
    bool loopback;  /* a TCP peer on 127.0.0.0/8 or ::1 */
    uid_t uid;
    pid_t pid; /* UNIX socket only (0 otherwise) */
    size_t n_gids;
    gid_t gids[TV__PEER_MAX_GIDS]; /* primary first */
    char addr[64];                 /* TCP: the client's address as text; UNIX: "unix" */
} tv__http_peer;

/* Fills p for the accepted socket fd (TCP or UNIX). identify_loopback:
 * look a loopback TCP client's uid up (http.anonymous_reads != never).
 * Never fails: what cannot be learned stays unknown. */
void tv__http_peer_identify(int fd, bool identify_loopback, tv__http_peer *p);

/* The uid owning the TCP socket whose local end is client and remote end
 * is server (both AF_INET or AF_INET6), from the kernel's socket table.
 * Returns 0 and *uid; -ENOENT when no such socket; -errno. */
int tv__http_peer_tcp_owner(const struct sockaddr *client, const struct sockaddr *server,
                            uid_t *uid);

#endif
