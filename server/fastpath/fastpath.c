/* The fast-path server's socket and loop: binds the UNIX SOCK_SEQPACKET
 * socket (net/unixsock.h: a stale one is replaced, a live one refused),
 * runs one thread that epolls the listening socket, every session, every
 * read group's completion eventfd and a wake eventfd (stop), and answers
 * the HTTP threads' listing and counter requests.
 *
 * Invariants:
 *   - the loop holds fp->mu while it works on a turn (never while it
 *     sleeps in epoll_wait), so tv__fp_sessions copies a consistent view;
 *   - a turn: events (accept, input, output, completions), then scheduling,
 *     the hold sweep (sessions that stall a starved group closed), read
 *     submission, batched replies sent, doomed sessions destroyed; when
 *     something came free after the scheduling (fp->again) the next
 *     epoll_wait does not sleep, else it wakes for the next deadline (a
 *     HELLO, a hold timeout) at the latest;
 *   - a connection is checked before a session is made for it: a peer the
 *     peer callback refuses gets ERROR TV_E_PEER_DENIED, one whose uid has
 *     max_sessions_per_uid sessions, or over max_sessions, gets ERROR
 *     TV_E_BUSY (fatal both), and each is closed at once, before its HELLO
 *     is read: a refused peer holds no session;
 *   - a client socket is closed only through tv__fp_hangup: shut down both
 *     ways, what the client sent drained, then closed, so a fatal ERROR
 *     sent just before stays readable by the client (a close with unread
 *     datagrams makes Linux report a reset to the client first);
 *   - accept failing for want of descriptors (EMFILE, ENFILE, ENOBUFS,
 *     ENOMEM) takes the listening socket out of epoll and retries every
 *     FP_ACCEPT_RETRY_MS: the loop never spins on a connection it cannot
 *     take, and the peer waits in the backlog. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "fastpath/fp_internal.h"
#include "net/unixsock.h"
#include "util/sys.h"

#define FP_ACCEPT_RETRY_MS 100 /* accept retried this often while it has no descriptor */

void tv__fp_session_arm(fp_session *s)
{
    uint32_t want = EPOLLIN | (s->out_head ? EPOLLOUT : 0u);
    if (want == s->ep_events)
        return;
    struct epoll_event ev = {.events = want, .data.ptr = &s->ev};
    if (epoll_ctl(s->fp->epoll_fd, EPOLL_CTL_MOD, s->fd, &ev) == 0)
        s->ep_events = want;
}

/* Datagrams of a client read and dropped at most when its socket closes:
 * after the shutdown nothing more can arrive, and what is queued is bounded
 * by the client's socket buffer; past this the close resets it anyway. */
#define FP_HANGUP_DRAIN 1024

void tv__fp_hangup(tv__fp *fp, int fd)
{
    /* No datagram can be queued to us once both directions are shut down;
     * reading out what was (a HELLO the daemon never read, RELEASEs) makes
     * the close an orderly EOF for the client, after what we sent. */
    shutdown(fd, SHUT_RDWR);
    for (int i = 0; i < FP_HANGUP_DRAIN; i++) {
        ssize_t n = tv__fp_recv(fd, fp->rbuf, sizeof fp->rbuf, NULL, 0, NULL, NULL);
        if (n <= 0 && n != TV_E_PROTOCOL) /* EOF, or nothing more: a cut datagram goes on */
            break;
    }
    tv__sys.close(fd);
}

/* Answers a connection the daemon does not take: ERROR{code, FATAL} as the
 * first message (the socket is new: the send does not wait), then hangs up
 * without reading the HELLO. */
static void refuse(tv__fp *fp, int fd, int code, const char *msg)
{
    tv_error err = {0};
    size_t len = tv__fp_encode_error(fp->sbuf, sizeof fp->sbuf, TV__FP_V1, code, TV__FP_ERROR_FATAL,
                                     0, 0, msg, strlen(msg));
    if (len)
        (void)tv__fp_send(fd, fp->sbuf, len, NULL, 0, &err);
    tv__log(TV_LOG_WARN, "fastpath: connection refused: %s", msg);
    tv__fp_hangup(fp, fd);
}

/* The listening socket in epoll (on) or out of it (accept is short of
 * descriptors: a level-triggered socket with a connection waiting would
 * wake every turn, the loop would spin). */
static void listen_arm(tv__fp *fp, bool on)
{
    struct epoll_event ev = {.events = on ? EPOLLIN : 0u, .data.ptr = &fp->listen_ev};
    if (epoll_ctl(fp->epoll_fd, EPOLL_CTL_MOD, fp->listen_fd, &ev) == 0)
        fp->accept_paused = !on;
    else
        tv__log(TV_LOG_WARN, "fastpath: epoll_ctl for the listening socket %s: %s", fp->socket_path,
                strerror(errno));
}

/* Connections accepted per loop turn: a connect storm waits in the backlog
 * (the listening socket stays readable) instead of holding the loop. */
#define FP_ACCEPT_PER_TURN 64

/* Whether peer p may have a session at all: the peer callback, else (no
 * admit callback either) the default admission's test, so that a peer
 * every OPEN would refuse holds nothing. Returns 0 or the refusal (err:
 * the message for the peer). */
static int peer_check(tv__fp *fp, const fp_peer *p, tv_error *err)
{
    if (fp->o.peer)
        return fp->o.peer(fp->o.admit_ctx, p->pid, p->uid, p->gids, p->n_gids, err);
    if (fp->o.admit) /* it decides per OPEN only */
        return 0;
    if (p->uid == fp->uid)
        return 0;
    for (size_t i = 0; i < p->n_gids; i++)
        if (p->gids[i] == fp->gid)
            return 0;
    return tv__seterr(err, TV_E_PEER_DENIED,
                      "uid %u (gid %u) may open no model on this daemon (allowed: uid:%u gid:%u)",
                      (unsigned)p->uid, (unsigned)p->gid, (unsigned)fp->uid, (unsigned)fp->gid);
}

/* Refuses the connection fd of peer p when the daemon does not take it
 * (peer_check, then the session limits, the uid's first). Returns true
 * when it was refused (fd closed). */
static bool refused(tv__fp *fp, int fd, const fp_peer *p)
{
    char msg[TV__FP_MAX_TEXT + 1];
    tv_error err = {0};
    int rc = peer_check(fp, p, &err);
    if (rc) {
        snprintf(msg, sizeof msg, "%s", err.msg[0] ? err.msg : tv_strerror(rc));
        refuse(fp, fd, rc, msg);
        return true;
    }
    uint32_t mine = 0;
    for (const fp_session *s = fp->s_head; s; s = s->next)
        mine += s->uid == p->uid;
    if (mine >= fp->o.max_sessions_per_uid) {
        snprintf(
            msg, sizeof msg,
            "uid %u has %u fast-path sessions (fastpath.max_sessions_per_uid = %u): close one or try again later",
            (unsigned)p->uid, mine, fp->o.max_sessions_per_uid);
        refuse(fp, fd, TV_E_BUSY, msg);
        return true;
    }
    if (fp->n_sessions >= fp->o.max_sessions) {
        snprintf(
            msg, sizeof msg,
            "tensorvaultd has %u fast-path sessions (fastpath.max_sessions = %u): try again later",
            fp->n_sessions, fp->o.max_sessions);
        refuse(fp, fd, TV_E_BUSY, msg);
        return true;
    }
    return false;
}

static void on_accept(tv__fp *fp)
{
    for (int turn = 0; turn < FP_ACCEPT_PER_TURN; turn++) {
        int fd = accept4(fp->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        fp_session *s = NULL;
        if (fd < 0) {
            int e = errno;
            if (e == EINTR)
                continue;
            if (e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM) {
                if (!fp->accept_warned)
                    tv__log(
                        TV_LOG_WARN,
                        "fastpath: accept on %s: %s: new connections wait (retried every %d ms)",
                        fp->socket_path, strerror(e), FP_ACCEPT_RETRY_MS);
                fp->accept_warned = true;
                if (!fp->accept_paused)
                    listen_arm(fp, false);
                return;
            }
            if (e != EAGAIN && e != EWOULDBLOCK)
                tv__log(TV_LOG_WARN, "fastpath: accept on %s: %s", fp->socket_path, strerror(e));
            if (fp->accept_paused)
                listen_arm(fp, true);
            return;
        }
        fp->accept_warned = false;
        if (fp->accept_paused)
            listen_arm(fp, true);
        fp_peer p;
        if (tv__fp_peer_read(fd, &p)) {
            tv__log(TV_LOG_WARN, "fastpath: out of memory for a connection: closed");
            tv__sys.close(fd);
            continue;
        }
        if (refused(fp, fd, &p)) {
            tv__fp_peer_free(&p);
            continue;
        }
        if (tv__fp_session_new(fp, fd, &p, &s)) {
            tv__log(TV_LOG_WARN, "fastpath: out of memory for a session: connection closed");
            tv__fp_peer_free(&p);
            tv__sys.close(fd);
            continue;
        }
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &s->ev};
        if (epoll_ctl(fp->epoll_fd, EPOLL_CTL_ADD, fd, &ev)) {
            tv__log(TV_LOG_WARN, "fastpath: epoll_ctl for a session: %s", strerror(errno));
            s->doomed = true;
        }
        s->ep_events = EPOLLIN;
        s->prev = fp->s_tail;
        if (fp->s_tail)
            fp->s_tail->next = s;
        else
            fp->s_head = s;
        fp->s_tail = s;
        fp->n_sessions++;
        atomic_fetch_add(&fp->st_sessions, 1);
        atomic_fetch_add(&fp->st_sessions_total, 1);
        tv__log(TV_LOG_INFO, "fastpath: session %" PRIu64 " connected (pid %d uid %u gid %u)",
                s->id, (int)s->pid, (unsigned)s->uid, (unsigned)s->gid);
    }
}

int64_t tv__fp_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Closes the connections that sent no HELLO within hello_timeout_ms.
 * Returns the milliseconds until the next such deadline, or -1 when no
 * connection waits for its HELLO. */
static int hello_sweep(tv__fp *fp)
{
    int64_t now = tv__fp_now_ms(), next = -1;
    for (fp_session *s = fp->s_head; s; s = s->next) {
        if (s->hello || s->doomed)
            continue;
        int64_t left = s->connected_ms + fp->o.hello_timeout_ms - now;
        if (left <= 0) {
            char why[96];
            snprintf(why, sizeof why, "no HELLO within %u ms", fp->o.hello_timeout_ms);
            tv__fp_session_drop(s, why);
        } else if (next < 0 || left < next) {
            next = left;
        }
    }
    return next < 0 ? -1 : (int)(next > 60000 ? 60000 : next);
}

/* How often the open groups' tier memfds are checked for stray pages. */
#define FP_SCRUB_MS 1000

/* Every FP_SCRUB_MS: the pages clients made the kernel allocate in holes
 * of the open generations' memfds are punched (tv__tier_scrub). Returns
 * the milliseconds until the next pass. */
static int scrub(tv__fp *fp)
{
    int64_t now = tv__fp_now_ms();
    if (now < fp->scrub_ms)
        return (int)(fp->scrub_ms - now);
    fp->scrub_ms = now + FP_SCRUB_MS;
    for (fp_group *g = fp->g_head; g; g = g->next) {
        uint64_t n = tv__tier_scrub(g->tg);
        if (n)
            tv__log(
                TV_LOG_WARN,
                "fastpath: model '%s' generation %" PRId64 ": %" PRIu64
                " bytes of pages outside the resident chunks (a client read a hole of its mapping) punched",
                g->name, g->gen, n);
    }
    return FP_SCRUB_MS;
}

/* The smaller of two waits in milliseconds (-1: none). */
static int min_wait(int a, int b)
{
    return a < 0 ? b : b < 0 ? a : a < b ? a : b;
}

/* Returns the milliseconds until the next deadline (hold timeout, share
 * wait, scrub), or -1. */
static int end_of_turn(tv__fp *fp)
{
    tv__fp_schedule(fp);
    int hold_wait = tv__fp_hold_sweep(fp); /* its sessions go below: their slots return */
    hold_wait = min_wait(hold_wait, tv__fp_share_sweep(fp));
    if (fp->g_head)
        hold_wait = min_wait(hold_wait, scrub(fp));
    tv__fp_groups_flush(fp);
    for (fp_session *s = fp->s_head; s; s = s->next) {
        if (s->doomed || !s->dirty)
            continue;
        s->dirty = false;
        tv__fp_session_flush(s);
        tv__fp_session_on_output(s);
    }
    fp_session *s = fp->s_head;
    while (s) {
        fp_session *nx = s->next;
        if (s->doomed)
            tv__fp_session_destroy(s);
        s = nx;
    }
    tv__fp_groups_reap(fp); /* after the replies: CLOSED does not wait for a teardown */
    if (fp->again)          /* a stalled member's memory, released after the scheduling */
        return 0;
    return hold_wait;
}

static void *loop_main(void *arg)
{
    tv__fp *fp = arg;
    struct epoll_event evs[64];
    int hello_wait = -1; /* ms until a connection's HELLO deadline, -1: none */
    int hold_wait = -1;  /* ms until a holder of a starved group's slots times out, -1: none */
    while (!atomic_load(&fp->stop)) {
        int wait = fp->again ? 0 : fp->accept_paused ? FP_ACCEPT_RETRY_MS : -1;
        if (hello_wait >= 0 && (wait < 0 || hello_wait < wait))
            wait = hello_wait;
        if (hold_wait >= 0 && (wait < 0 || hold_wait < wait))
            wait = hold_wait;
        int n = epoll_wait(fp->epoll_fd, evs, (int)TV_ARRAY_LEN(evs), wait);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            tv__log(TV_LOG_ERROR, "fastpath: epoll_wait: %s: the fast path stops", strerror(errno));
            break;
        }
        pthread_mutex_lock(&fp->mu);
        if (fp->accept_paused)
            on_accept(fp); /* descriptors may be back: it re-arms the socket */
        fp->evs = evs;
        fp->n_evs = n;
        for (int i = 0; i < n; i++) {
            fp_ev *e = evs[i].data.ptr;
            fp->ev_next = i + 1;
            if (!e) /* its group was freed earlier in this batch */
                continue;
            switch (e->kind) {
            case FP_EV_LISTEN:
                on_accept(fp);
                break;
            case FP_EV_WAKE: {
                eventfd_t v;
                (void)eventfd_read(fp->wake_fd, &v);
                break;
            }
            case FP_EV_GROUP:
                tv__fp_group_on_event(e->ptr);
                break;
            case FP_EV_SESSION: {
                fp_session *s = e->ptr;
                if (s->doomed)
                    break;
                if (evs[i].events & EPOLLOUT)
                    tv__fp_session_on_output(s);
                if (!s->doomed && (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)))
                    tv__fp_session_on_input(s);
                break;
            }
            default:
                break;
            }
        }
        fp->evs = NULL;
        fp->n_evs = fp->ev_next = 0;
        hello_wait = hello_sweep(fp);
        hold_wait = end_of_turn(fp);
        pthread_mutex_unlock(&fp->mu);
    }
    return NULL;
}

static void fp_free(tv__fp *fp)
{
    if (!fp)
        return;
    if (fp->listen_fd >= 0)
        tv__sys.close(fp->listen_fd);
    if (fp->wake_fd >= 0)
        tv__sys.close(fp->wake_fd);
    if (fp->epoll_fd >= 0)
        tv__sys.close(fp->epoll_fd);
    while (fp->uid_views) { /* empty once every session closed */
        fp_uid_views *v = fp->uid_views;
        fp->uid_views = v->next;
        tv__fp_refmap_free(&v->holders);
        free(v);
    }
    tv__tier_destroy(fp->tier);
    pthread_mutex_destroy(&fp->mu);
    free(fp->socket_path);
    free(fp->store_dir);
    free(fp);
}

/* The options' defaults: 0 means the default of each (fastpath.h). */
static void opts_defaults(tv__fp_opts *o)
{
    if (!o->socket_mode)
        o->socket_mode = 0660;
    if (!o->slot_len)
        o->slot_len = TV__FP_DEFAULT_SLOT_LEN;
    if (!o->credit)
        o->credit = TV__FP_DEFAULT_CREDIT;
    if (!o->group_slots)
        o->group_slots =
            o->credit * 2 > TV__FP_DEFAULT_GROUP_SLOTS ? o->credit * 2 : TV__FP_DEFAULT_GROUP_SLOTS;
    if (!o->max_sessions)
        o->max_sessions = TV__FP_DEFAULT_MAX_SESSIONS;
    if (!o->max_sessions_per_uid)
        o->max_sessions_per_uid = o->max_sessions / 4 ? o->max_sessions / 4 : 1;
    if (!o->max_groups)
        o->max_groups = TV__FP_DEFAULT_MAX_GROUPS;
    /* half the groups for one uid, a quarter for one model: one user's
     * generations, or one model's, leave room for others */
    if (!o->max_groups_per_uid)
        o->max_groups_per_uid = o->max_groups / 2 ? o->max_groups / 2 : 1;
    if (!o->max_groups_per_model)
        o->max_groups_per_model = o->max_groups / 4 ? o->max_groups / 4 : 1;
    if (!o->max_requests)
        o->max_requests = TV__FP_DEFAULT_MAX_REQUESTS;
    if (!o->max_handles)
        o->max_handles = TV__FP_DEFAULT_MAX_HANDLES;
    if (!o->hello_timeout_ms)
        o->hello_timeout_ms = 10000;
    if (!o->hold_timeout_ms)
        o->hold_timeout_ms = TV__FP_DEFAULT_HOLD_TIMEOUT_MS;
    if (!o->share_wait_ms)
        o->share_wait_ms = TV__FP_DEFAULT_SHARE_WAIT_MS;
    if (!o->cache_len) {
        long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
        o->cache_len = pages > 0 && page > 0 ? (int64_t)((uint64_t)pages / 8u * (uint64_t)page)
                                             : (int64_t)(1ull << 30);
    }
}

/* The options with their defaults in range. Returns 0 or TV_E_INVALID_ARG
 * naming the option. */
static int opts_check(const tv__fp_opts *o, tv_error *err)
{
    if (o->slot_len % 4096 || o->slot_len > (256u << 20))
        return tv__seterr(err, TV_E_INVALID_ARG,
                          "fastpath: slot_len %u is not a multiple of 4096 up to 256 MiB",
                          o->slot_len);
    if (o->engine != TV_ENGINE_AUTO && o->engine != TV_ENGINE_URING && o->engine != TV_ENGINE_PREAD)
        return tv__seterr(err, TV_E_INVALID_ARG, "fastpath: unknown read engine %d", o->engine);
    if (o->credit > 65536 || o->group_slots > 65536 || (uint64_t)o->group_slots < 2ull * o->credit)
        return tv__seterr(
            err, TV_E_INVALID_ARG,
            "fastpath: group_slots %u must be at least 2 x credit %u (both at most 65536)",
            o->group_slots, o->credit);
    if (o->max_requests > (1u << 20) || o->max_handles > 4096 || o->socket_mode > 0777)
        return tv__seterr(
            err, TV_E_INVALID_ARG,
            "fastpath: max_requests %u (at most 1048576), max_handles %u (at most 4096) or socket mode %o out of range",
            o->max_requests, o->max_handles, o->socket_mode);
    return 0;
}

/* The loop's epoll set: the listening socket and the wake eventfd. */
static int loop_setup(tv__fp *fp, tv_error *err)
{
    fp->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    fp->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (fp->epoll_fd < 0 || fp->wake_fd < 0)
        return tv__seterr(err, -errno, "fastpath: epoll or eventfd: %s", strerror(errno));
    fp->listen_ev = (fp_ev){.kind = FP_EV_LISTEN, .ptr = fp};
    fp->wake_ev = (fp_ev){.kind = FP_EV_WAKE, .ptr = fp};
    struct epoll_event le = {.events = EPOLLIN, .data.ptr = &fp->listen_ev};
    struct epoll_event we = {.events = EPOLLIN, .data.ptr = &fp->wake_ev};
    if (epoll_ctl(fp->epoll_fd, EPOLL_CTL_ADD, fp->listen_fd, &le) ||
        epoll_ctl(fp->epoll_fd, EPOLL_CTL_ADD, fp->wake_fd, &we))
        return tv__seterr(err, -errno, "fastpath: epoll_ctl: %s", strerror(errno));
    return 0;
}

int tv__fp_start(const tv__fp_opts *opts, tv__fp **out, tv_error *err)
{
    tv__fp *fp = NULL;
    bool bound = false;
    int rc = 0;
    if (out)
        *out = NULL;
    if (!opts || !out || !opts->socket_path || !opts->store_dir)
        return tv__seterr(err, TV_E_INVALID_ARG,
                          "fastpath: socket path and store directory are required");
    if (strlen(opts->socket_path) >= sizeof(((struct sockaddr_un *)0)->sun_path) ||
        !opts->socket_path[0])
        return tv__seterr(err, TV_E_INVALID_ARG,
                          "fastpath: socket path '%s' is empty or over %zu bytes",
                          opts->socket_path, sizeof(((struct sockaddr_un *)0)->sun_path) - 1);
    fp = calloc(1, sizeof(*fp));
    if (!fp)
        return tv__seterr(err, -ENOMEM, "fastpath: out of memory");
    fp->listen_fd = fp->wake_fd = fp->epoll_fd = -1;
    pthread_mutex_init(&fp->mu, NULL);
    fp->o = *opts;
    opts_defaults(&fp->o);
    if ((rc = opts_check(&fp->o, err)))
        goto fail;
    fp->socket_path = strdup(opts->socket_path);
    fp->store_dir = strdup(opts->store_dir);
    if (!fp->socket_path || !fp->store_dir) {
        rc = tv__seterr(err, -ENOMEM, "fastpath: out of memory");
        goto fail;
    }
    fp->o.socket_path = fp->socket_path;
    fp->o.store_dir = fp->store_dir;
    fp->uid = geteuid();
    fp->gid = getegid();
    /* net/unixsock.h: never reachable with the umask's mode, a stale socket
     * replaced, a live one refused (-EADDRINUSE) */
    fp->listen_fd =
        tv__unix_listen(fp->socket_path, SOCK_SEQPACKET, fp->o.socket_mode, 128, "fastpath", err);
    if (fp->listen_fd < 0) {
        rc = fp->listen_fd;
        fp->listen_fd = -1;
        goto fail;
    }
    bound = true;
    if ((rc = loop_setup(fp, err)))
        goto fail;
    if ((rc = tv__tier_create(fp->o.cache_len > 0 ? (uint64_t)fp->o.cache_len : 0, fp->o.cache_dir,
                              &fp->tier, err)))
        goto fail;
    fp->o.cache_dir = NULL; /* the caller's string: the tier kept its own copy */
    rc = pthread_create(&fp->thread, NULL, loop_main, fp);
    if (rc) {
        rc = tv__seterr(err, -rc, "fastpath: starting the loop thread: %s", strerror(rc));
        goto fail;
    }
    fp->thread_started = true;
    tv__log(
        TV_LOG_INFO,
        "fastpath: listening on %s (slot %u bytes, %u slots per model, credit %u, %u sessions at most, %u per uid; %u model generations open at most, %u per uid, %u per model; hold timeout %u ms; memory tier %" PRId64
        " bytes, share wait %u ms)",
        fp->socket_path, fp->o.slot_len, fp->o.group_slots, fp->o.credit, fp->o.max_sessions,
        fp->o.max_sessions_per_uid, fp->o.max_groups, fp->o.max_groups_per_uid,
        fp->o.max_groups_per_model, fp->o.hold_timeout_ms,
        fp->o.cache_len > 0 ? fp->o.cache_len : 0, fp->o.share_wait_ms);
    *out = fp;
    return 0;
fail:
    if (bound)
        tv__sys.unlink(fp->socket_path);
    fp_free(fp);
    return rc;
}

void tv__fp_stop(tv__fp *fp)
{
    if (!fp)
        return;
    if (fp->thread_started) {
        atomic_store(&fp->stop, true);
        (void)eventfd_write(fp->wake_fd, 1);
        pthread_join(fp->thread, NULL);
        fp->thread_started = false;
    }
    /* the loop is gone: this thread owns everything now */
    pthread_mutex_lock(&fp->mu);
    for (fp_session *s = fp->s_head; s; s = s->next)
        tv__fp_session_drop(s, "the daemon stops");
    while (fp->s_head)
        tv__fp_session_destroy(fp->s_head);
    tv__fp_groups_reap(fp);
    tv__tier_destroy(fp->tier);
    fp->tier = NULL;
    pthread_mutex_unlock(&fp->mu);
    if (fp->listen_fd >= 0) {
        tv__sys.close(fp->listen_fd);
        fp->listen_fd = -1;
        tv__sys.unlink(fp->socket_path);
    }
    tv__log(TV_LOG_INFO, "fastpath: stopped");
    fp_free(fp);
}

static int by_id(const void *a, const void *b)
{
    uint64_t x = ((const tv__fp_session_info *)a)->id, y = ((const tv__fp_session_info *)b)->id;
    return x < y ? -1 : x > y;
}

/* The list is in connection order (ids grow) whatever order the scheduler
 * keeps fp's sessions in. */
int tv__fp_sessions(tv__fp *fp, tv__fp_session_info **out, size_t *n)
{
    tv__fp_session_info *v = NULL;
    size_t count = 0, i = 0;
    int rc = 0;
    *out = NULL;
    *n = 0;
    if (!fp)
        return 0;
    pthread_mutex_lock(&fp->mu);
    for (fp_session *s = fp->s_head; s; s = s->next)
        count++;
    if (count) {
        v = calloc(count, sizeof(*v));
        if (!v) {
            rc = -ENOMEM;
            goto out;
        }
    }
    for (fp_session *s = fp->s_head; s; s = s->next, i++) {
        tv__fp_session_info *d = &v[i];
        d->id = s->id;
        d->pid = s->pid;
        d->uid = s->uid;
        d->gid = s->gid;
        d->connected_unix = s->connected_unix;
        d->requests_done = s->requests_done;
        d->slots_held = s->held;
        d->version = s->hello ? s->version : 0;
        if (!s->n_handles)
            continue;
        d->handles = calloc(s->n_handles, sizeof(*d->handles));
        if (!d->handles) {
            rc = -ENOMEM;
            tv__fp_sessions_free(v, i + 1);
            v = NULL;
            goto out;
        }
        for (uint32_t j = 0; j < fp->o.max_handles && d->n_handles < s->n_handles; j++) {
            const fp_handle *h = s->handles[j];
            tv__fp_handle_info *hi;
            if (!h)
                continue;
            hi = &d->handles[d->n_handles++];
            hi->handle = h->id;
            snprintf(hi->model, sizeof hi->model, "%s", h->g->name);
            snprintf(hi->spec, sizeof hi->spec, "%s", h->spec);
            hi->generation = h->g->gen;
            hi->bytes_delivered = h->bytes_delivered;
            hi->view_bytes = h->view_len;
            hi->legacy = h->legacy;
            hi->stalled = h->stalled;
            d->bytes_delivered += h->bytes_delivered;
            d->view_bytes += h->view_len;
        }
    }
    if (count > 1)
        qsort(v, count, sizeof(*v), by_id);
    *out = v;
    *n = count;
out:
    pthread_mutex_unlock(&fp->mu);
    return rc;
}

void tv__fp_sessions_free(tv__fp_session_info *s, size_t n)
{
    if (!s)
        return;
    for (size_t i = 0; i < n; i++)
        free(s[i].handles);
    free(s);
}

void tv__fp_get_stats(const tv__fp *fp, tv__fp_stats *out)
{
    tv__fp *f = (tv__fp *)fp; /* atomics are read only */
    memset(out, 0, sizeof(*out));
    if (!fp)
        return;
    out->sessions = atomic_load(&f->st_sessions);
    out->sessions_total = atomic_load(&f->st_sessions_total);
    out->groups = atomic_load(&f->st_groups);
    out->device_read_bytes = atomic_load(&f->st_device_read);
    out->delivered_bytes = atomic_load(&f->st_delivered);
    out->shared_bytes = atomic_load(&f->st_shared);
    out->refused_total = atomic_load(&f->st_refused);
    out->protocol_errors = atomic_load(&f->st_protocol);
    out->readahead_bytes = atomic_load(&f->st_readahead);
    out->readahead_hit_bytes = atomic_load(&f->st_readahead_hit);
    out->slots_used = atomic_load(&f->st_slots_used);
    out->tier_hits = atomic_load(&f->st_tier_hits);
    out->tier_hit_bytes = atomic_load(&f->st_tier_hit_bytes);
    out->tier_misses = atomic_load(&f->st_tier_misses);
    out->tier_miss_bytes = atomic_load(&f->st_tier_miss_bytes);
    out->views = atomic_load(&f->st_views);
    out->views_refused = atomic_load(&f->st_view_refused);
    out->member_stalls = atomic_load(&f->st_stalls);
    tv__tier_stats ts;
    tv__tier_get_stats(f->tier, &ts);
    out->tier_budget_bytes = ts.budget_len;
    out->tier_bound_bytes = ts.bound_len;
    out->tier_resident_bytes = ts.resident_len;
    out->tier_view_bytes = ts.vpinned_len;
    out->tier_generations = ts.generations;
    out->tier_evictions = ts.evictions;
    out->tier_evicted_bytes = ts.evicted_len;
    out->tier_scrubbed_bytes = ts.scrubbed_len;
    out->tier_page_bytes = ts.page_len;
    out->tier_pages = ts.pages;
}
