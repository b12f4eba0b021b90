/* HTTP peer identification (see peer.h): SO_PEERCRED on the UNIX socket,
 * NETLINK_SOCK_DIAG for loopback TCP clients, the user database for a
 * loopback user's groups (cached). */
#include "http/peer.h"

#include <arpa/inet.h>
#include <errno.h>
#include <grp.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <pthread.h>
#include <pwd.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "util/sys.h"

#define PEER_GROUPS_TTL_S 30
#define PEER_GROUPS_CACHE 32

static int diag_query(int family, const void *src, const void *dst, uint16_t sport_be,
                      uint16_t dport_be, uid_t *uid)
{
    struct {
        struct nlmsghdr nlh;
        struct inet_diag_req_v2 r;
    } req;
    memset(&req, 0, sizeof req);
    req.nlh.nlmsg_len = sizeof req;
    req.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
    req.nlh.nlmsg_flags = NLM_F_REQUEST;
    req.nlh.nlmsg_seq = 1;
    req.r.sdiag_family = (uint8_t)family;
    req.r.sdiag_protocol = IPPROTO_TCP;
    req.r.idiag_states = ~0u;
    req.r.id.idiag_sport = sport_be;
    req.r.id.idiag_dport = dport_be;
    size_t alen = family == AF_INET ? 4 : 16;
    memcpy(req.r.id.idiag_src, src, alen);
    memcpy(req.r.id.idiag_dst, dst, alen);
    req.r.id.idiag_cookie[0] = INET_DIAG_NOCOOKIE;
    req.r.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;

    int s = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
    if (s < 0)
        return -errno;
    int rc = -ENOENT;
    struct timeval tmo = {.tv_sec = 1};
    (void)setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tmo, sizeof tmo);
    struct sockaddr_nl nl = {.nl_family = AF_NETLINK};
    if (sendto(s, &req, sizeof req, 0, (struct sockaddr *)&nl, sizeof nl) < 0) {
        rc = -errno;
        goto out;
    }
    /* aligned for the netlink headers read out of it */
    union {
        struct nlmsghdr h;
        char b[8192];
    } buf;
    ssize_t n = recv(s, buf.b, sizeof buf.b, 0);
    if (n < 0) {
        rc = -errno;
        goto out;
    }
    size_t left = (size_t)n;
    for (struct nlmsghdr *h = &buf.h; NLMSG_OK(h, left); h = NLMSG_NEXT(h, left)) {
        if (h->nlmsg_type == NLMSG_ERROR) {
            const struct nlmsgerr *e = NLMSG_DATA(h);
            rc = e->error ? e->error : -ENOENT;
            break;
        }
        if (h->nlmsg_type != SOCK_DIAG_BY_FAMILY ||
            h->nlmsg_len < NLMSG_LENGTH(sizeof(struct inet_diag_msg)))
            continue;
        const struct inet_diag_msg *m = NLMSG_DATA(h);
        /* the kernel's lookup is exact; the ports are compared anyway */
        if (m->id.idiag_sport != sport_be || m->id.idiag_dport != dport_be)
            continue;
        *uid = (uid_t)m->idiag_uid;
        rc = 0;
        break;
    }
out:
    tv__sys.close(s);
    return rc;
}

int tv__http_peer_tcp_owner(const struct sockaddr *client, const struct sockaddr *server,
                            uid_t *uid)
{
    if (client->sa_family == AF_INET && server->sa_family == AF_INET) {
        const struct sockaddr_in *c = (const void *)client, *s = (const void *)server;
        return diag_query(AF_INET, &c->sin_addr, &s->sin_addr, c->sin_port, s->sin_port, uid);
    }
    if (client->sa_family != AF_INET6 || server->sa_family != AF_INET6)
        return -EAFNOSUPPORT;
    const struct sockaddr_in6 *c = (const void *)client, *s = (const void *)server;
    /* An IPv4 client of a dual-stack listener: its own socket is AF_INET. */
    if (IN6_IS_ADDR_V4MAPPED(&c->sin6_addr) && IN6_IS_ADDR_V4MAPPED(&s->sin6_addr) &&
        diag_query(AF_INET, c->sin6_addr.s6_addr + 12, s->sin6_addr.s6_addr + 12, c->sin6_port,
                   s->sin6_port, uid) == 0)
        return 0;
    return diag_query(AF_INET6, &c->sin6_addr, &s->sin6_addr, c->sin6_port, s->sin6_port, uid);
}

/* ---- a loopback user's groups ---------------------------------------------- */

static struct groups_entry {
    uid_t uid;
    time_t expires;
    size_t n;
    gid_t gids[TV__PEER_MAX_GIDS];
} g_groups[PEER_GROUPS_CACHE];
static size_t g_groups_next;
static pthread_mutex_t g_groups_mu = PTHREAD_MUTEX_INITIALIZER;

/* uid's primary group, then its supplementary groups, from the user
 * database; none when the uid has no entry. */
static size_t groups_lookup(uid_t uid, gid_t *out)
{
    struct passwd pw, *res = NULL;
    char buf[16384];
    if (getpwuid_r(uid, &pw, buf, sizeof buf, &res) || !res)
        return 0;
    gid_t all[TV__PEER_MAX_GIDS];
    int n = TV__PEER_MAX_GIDS;
    if (getgrouplist(pw.pw_name, pw.pw_gid, all, &n) < 0)
        n = TV__PEER_MAX_GIDS; /* more than fit: the first ones */
    size_t k = 0;
    out[k++] = pw.pw_gid;
    for (int i = 0; i < n && k < TV__PEER_MAX_GIDS; i++)
        if (all[i] != pw.pw_gid)
            out[k++] = all[i];
    return k;
}

static size_t groups_of(uid_t uid, gid_t *out)
{
    time_t now = time(NULL);
    pthread_mutex_lock(&g_groups_mu);
    for (size_t i = 0; i < PEER_GROUPS_CACHE; i++) {
        struct groups_entry *e = &g_groups[i];
        if (e->expires > now && e->uid == uid) {
            size_t n = e->n;
            memcpy(out, e->gids, n * sizeof *out);
            pthread_mutex_unlock(&g_groups_mu);
            return n;
        }
    }
    pthread_mutex_unlock(&g_groups_mu);
    size_t n = groups_lookup(uid, out);
    pthread_mutex_lock(&g_groups_mu);
    struct groups_entry *e = &g_groups[g_groups_next++ % PEER_GROUPS_CACHE];
    e->uid = uid;
    e->expires = now + PEER_GROUPS_TTL_S;
    e->n = n;
    memcpy(e->gids, out, n * sizeof *out);
    pthread_mutex_unlock(&g_groups_mu);
    return n;
}

/* ---- identify ----------------------------------------------------------------- */

static void unix_peer(int fd, tv__http_peer *p)
{
    struct ucred cred;
    socklen_t cl = sizeof cred;
    snprintf(p->addr, sizeof p->addr, "unix");
    p->unix_sock = true;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0)
        return;
    p->local = true;
    p->uid = cred.uid;
    p->pid = cred.pid;
    p->gids[0] = cred.gid;
    p->n_gids = 1;
    gid_t sup[TV__PEER_MAX_GIDS];
    socklen_t gl = sizeof sup;
    /* more groups than fit (ERANGE): the primary one only */
    if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, sup, &gl) == 0)
        for (size_t i = 0; i < gl / sizeof(gid_t) && p->n_gids < TV__PEER_MAX_GIDS; i++)
            if (sup[i] != cred.gid)
                p->gids[p->n_gids++] = sup[i];
}

static bool is_loopback(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)(const void *)sa)->sin_addr.s_addr) >> 24) ==
               127;
    if (sa->sa_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr;
        return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
    }
    return false;
}

void tv__http_peer_identify(int fd, bool identify_loopback, tv__http_peer *p)
{
    struct sockaddr_storage self, peer;
    socklen_t sl = sizeof self, pl = sizeof peer;
    memset(p, 0, sizeof *p);
    snprintf(p->addr, sizeof p->addr, "?");
    if (getsockname(fd, (struct sockaddr *)&self, &sl) != 0)
        return;
    if (self.ss_family == AF_UNIX) {
        unix_peer(fd, p);
        return;
    }
    if (getpeername(fd, (struct sockaddr *)&peer, &pl) != 0)
        return;
    if (peer.ss_family == AF_INET)
        inet_ntop(AF_INET, &((struct sockaddr_in *)&peer)->sin_addr, p->addr, sizeof p->addr);
    else if (peer.ss_family == AF_INET6)
        inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&peer)->sin6_addr, p->addr, sizeof p->addr);
    p->loopback = is_loopback((struct sockaddr *)&peer);
    if (!p->loopback || !identify_loopback)
        return;
    uid_t uid;
    if (tv__http_peer_tcp_owner((struct sockaddr *)&peer, (struct sockaddr *)&self, &uid) != 0)
        return;
    p->local = true;
    p->uid = uid;
    p->n_gids = groups_of(uid, p->gids);
}
