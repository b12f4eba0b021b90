/* The fast-path client (tensorvault/client.h): one session over tensorvaultd's
 * UNIX socket (SOCK_SEQPACKET), models opened in it (the sealed snapshot
 * memfd answers metadata; the shared staging arena carries the bytes), and
 * reads whose chunks are copied from the arena to the caller's destinations.
 *
 * Invariants:
 *   - the daemon is not trusted: every message is decoded by the wire codec
 *     and every CHUNK entry is checked (known outstanding request, its
 *     handle, slot < n_slots, slot_off + len <= slot_len, dest_off + len <=
 *     the request's len, no byte delivered twice) before one byte is copied,
 *     so nothing outside [dest, dest + len) is ever written; DONE 0 completes
 *     a request only when every byte of it arrived;
 *   - anything unexpected from the daemon (or a failed send or receive)
 *     closes the session: TV_E_PROTOCOL, TV_E_DISCONNECTED at EOF,
 *     TV_E_TIMEOUT when no reply came within timeout_ms; a dead session
 *     answers every later call with TV_E_DISCONNECTED;
 *   - a fatal ERROR the daemon sent before closing is reported with its own
 *     code and text even when the connection failed first (a reset, EPIPE
 *     on a send): a daemon over its limits refuses a connection with an
 *     ERROR and closes it without reading the HELLO, so TV_E_BUSY or
 *     TV_E_PEER_DENIED reach the caller, not TV_E_DISCONNECTED;
 *   - every slot reference a CHUNK entry lends is released as soon as the
 *     copies of its message are done (CUDA: after a stream sync), and a read
 *     returns only when all of them went back (or the session is closed);
 *   - the snapshot received is validated (seals, size, checksum, model name,
 *     generation) before a tensor record in it is followed; records are
 *     decoded and validated on first use;
 *   - every descriptor received is closed once mapped (or refused). */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "client/client_internal.h"
#include "wire/wire.h"
#include "reader/desc.h"
#include "snap/snapshot.h"
#include "tensorvault/client.h"
#include "util/internal.h"
#include "util/sys.h"
#include "xfer/xfer.h"

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif

#define DEFAULT_TIMEOUT_MS 60000u
#define SNAP_SEALS         (F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)
#define ARENA_SEALS        (F_SEAL_FUTURE_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)
#define NAME_PREC          TV__NAME_PREC
#define TEXT_PREC(m)       ((int)((m)->text_len > 400 ? 400 : (m)->text_len))

/* ---- delivered spans ------------------------------------------------------ */

void tv__fpc_spans_init(tv__fpc_spans *s)
{
    memset(s, 0, sizeof(*s));
}

void tv__fpc_spans_free(tv__fpc_spans *s)
{
    if (s && s->v && s->v != s->inl)
        free(s->v);
    if (s)
        tv__fpc_spans_init(s);
}

int tv__fpc_spans_add(tv__fpc_spans *s, uint64_t a, uint64_t len, uint64_t limit)
{
    uint64_t b;
    if (len == 0)
        return TV_E_PROTOCOL;
    if (tv__add_u64(a, len, &b) || b > limit)
        return TV_E_OVERFLOW;
    if (!s->v) {
        s->v = s->inl;
        s->cap = TV_ARRAY_LEN(s->inl);
    }
    uint32_t lo = 0, hi = s->n;
    while (lo < hi) { /* lo: the first span starting at or after a */
        uint32_t mid = lo + (hi - lo) / 2;
        if (s->v[mid].a < a)
            lo = mid + 1;
        else
            hi = mid;
    }
    if ((lo > 0 && s->v[lo - 1].b > a) || (lo < s->n && s->v[lo].a < b))
        return TV_E_PROTOCOL;
    bool join_prev = lo > 0 && s->v[lo - 1].b == a, join_next = lo < s->n && s->v[lo].a == b;
    if (join_prev && join_next) {
        s->v[lo - 1].b = s->v[lo].b;
        memmove(&s->v[lo], &s->v[lo + 1], (size_t)(s->n - lo - 1) * sizeof(*s->v));
        s->n--;
    } else if (join_prev) {
        s->v[lo - 1].b = b;
    } else if (join_next) {
        s->v[lo].a = a;
    } else {
        if (s->n == s->cap) {
            if (s->cap > UINT32_MAX / 4)
                return -ENOMEM;
            uint32_t cap = s->cap * 4;
            tv__fpc_span *v =
                s->v == s->inl ? malloc(cap * sizeof(*v)) : realloc(s->v, cap * sizeof(*v));
            if (!v)
                return -ENOMEM;
            if (s->v == s->inl)
                memcpy(v, s->inl, sizeof(s->inl));
            s->v = v;
            s->cap = cap;
        }
        memmove(&s->v[lo + 1], &s->v[lo], (size_t)(s->n - lo) * sizeof(*s->v));
        s->v[lo] = (tv__fpc_span){a, b};
        s->n++;
    }
    s->delivered += len;
    return 0;
}

/* ---- the session: failing, sending, receiving ------------------------------ */

/* Closes the session for good: err gets code and the message, and every
 * later call answers TV_E_DISCONNECTED naming it. Returns code. */
static int session_fail(tv_client *c, tv_error *err, int code, const char *fmt, ...)
    TV_PRINTF(4, 5);
static int session_fail(tv_client *c, tv_error *err, int code, const char *fmt, ...)
{
    char msg[sizeof(err->msg)];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (c->sock >= 0) {
        shutdown(c->sock, SHUT_RDWR);
        tv__sys.close(c->sock);
        c->sock = -1;
        c->dead_code = code;
        memcpy(c->dead_msg, msg, sizeof(c->dead_msg));
        tv__log(TV_LOG_DEBUG, "fast-path session %llu on %s closed: %s: %s",
                (unsigned long long)c->session_id, c->path, tv_err_name(code), msg);
    }
    return tv__seterr(err, code, "%s", msg);
}

static int dead_err(const tv_client *c, tv_error *err)
{
    return tv__seterr(err, TV_E_DISCONNECTED, "fast-path session on %s is closed (%s: %s)", c->path,
                      tv_err_name(c->dead_code), c->dead_msg);
}

static void close_fds(int *fds, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (fds[i] >= 0) {
            tv__sys.close(fds[i]);
            fds[i] = -1;
        }
}

/* Waits until the socket is ready for events (POLLIN / POLLOUT); *revents
 * (may be NULL) gets what it is ready for. TV_E_TIMEOUT closes the session. */
static int wait_sock(tv_client *c, short events, short *revents, tv_error *err)
{
    struct pollfd p = {.fd = c->sock, .events = events};
    for (;;) {
        int n = poll(&p, 1, (int)c->timeout_ms);
        if (n > 0) {
            if (revents)
                *revents = p.revents;
            return 0;
        }
        if (n == 0)
            return session_fail(c, err, TV_E_TIMEOUT,
                                "no reply from tensorvaultd on %s within %u ms", c->path,
                                c->timeout_ms);
        if (errno != EINTR)
            return session_fail(c, err, -errno, "poll on %s: %s", c->path, strerror(errno));
    }
}

/* A fatal ERROR closes the session with the daemon's code and text. */
static int fatal_error(tv_client *c, const tv__fp_msg *m, tv_error *err)
{
    int code = m->u.error.code < 0 ? m->u.error.code : TV_E_PROTOCOL;
    if (!c->version) /* before HELLO_OK: the daemon refused the connection */
        return session_fail(c, err, code, "tensorvaultd on %s refused the session: %.*s", c->path,
                            TEXT_PREC(m), m->text ? m->text : "");
    return session_fail(c, err, code, "tensorvaultd on %s closed the session: %.*s", c->path,
                        TEXT_PREC(m), m->text ? m->text : "");
}

/* Datagrams looked through for a fatal ERROR once a send failed: what the
 * daemon queued before it closed (replies of the last turn, then ERROR). */
#define QUEUED_SCAN 64

/* The daemon closed the connection under a send (EPIPE; ECONNRESET when it
 * closed with a message of ours unread): the fatal ERROR it sent before
 * closing may still wait in the socket. Returns that ERROR's code (the
 * session closed with its text), or 0 when none is queued. Never waits:
 * the socket is non-blocking. */
static int queued_fatal(tv_client *c, tv_error *err)
{
    for (int i = 0; i < QUEUED_SCAN; i++) {
        tv_error e = {0};
        tv__fp_msg m;
        ssize_t n = tv__fp_recv(c->sock, c->rbuf, sizeof(c->rbuf), NULL, 0, NULL, &e);
        if (n == -ECONNRESET)
            continue; /* reported once, before the datagrams queued behind it */
        if (n <= 0 || tv__fp_decode(c->rbuf, (size_t)n, c->version, &m, &e))
            return 0;
        if (m.type == TV__FP_ERROR && (m.u.error.flags & TV__FP_ERROR_FATAL))
            return fatal_error(c, &m, err);
    }
    return 0;
}

static int send_failed(tv_client *c, int rc, const tv_error *e, tv_error *err)
{
    if (rc == -EPIPE || rc == -ECONNRESET) {
        int q = queued_fatal(c, err);
        if (q)
            return q;
        return session_fail(c, err, TV_E_DISCONNECTED, "tensorvaultd on %s closed the session",
                            c->path);
    }
    return session_fail(c, err, rc, "send to tensorvaultd on %s: %s", c->path,
                        e->msg[0] ? e->msg : tv_strerror(rc));
}

/* One message, waiting (poll, timeout) while the socket is full. */
static int send_wait(tv_client *c, const void *buf, size_t len, tv_error *err)
{
    for (;;) {
        tv_error e = {0};
        int rc = tv__fp_send(c->sock, buf, len, NULL, 0, &e);
        if (rc == 0)
            return 0;
        if (rc != -EAGAIN)
            return send_failed(c, rc, &e, err);
        if ((rc = wait_sock(c, POLLOUT, NULL, err)))
            return rc;
    }
}

/* Receives and decodes one message into c->rbuf / *m, keeping up to max_fds
 * descriptors (*n_fds; the caller closes them). wait: block (poll with the
 * timeout) until one arrives; else return 1 when none is there. */
static int recv_msg(tv_client *c, tv__fp_msg *m, int *fds, size_t max_fds, size_t *n_fds, bool wait,
                    tv_error *err)
{
    size_t nf = 0;
    bool reset = false;
    if (n_fds)
        *n_fds = 0;
    for (;;) {
        tv_error e = {0};
        ssize_t n = tv__fp_recv(c->sock, c->rbuf, sizeof(c->rbuf), fds, max_fds, &nf, &e);
        if (n > 0) {
            if (n_fds)
                *n_fds = nf;
            int rc = tv__fp_decode(c->rbuf, (size_t)n, c->version, m, &e);
            if (rc) {
                close_fds(fds, nf);
                if (n_fds)
                    *n_fds = 0;
                return session_fail(c, err, rc == TV_E_VERSION ? TV_E_VERSION : TV_E_PROTOCOL,
                                    "tensorvaultd on %s sent a bad message: %s", c->path, e.msg);
            }
            return 0;
        }
        if (n == 0)
            return session_fail(c, err, TV_E_DISCONNECTED, "tensorvaultd on %s closed the session",
                                c->path);
        if (n == -ECONNRESET && !reset) {
            /* The daemon closed with a message of ours unread: Linux says
             * so once, before the datagrams still queued here (the fatal
             * ERROR it sent before closing): read on. */
            reset = true;
            continue;
        }
        if (n == -ECONNRESET)
            return session_fail(c, err, TV_E_DISCONNECTED, "tensorvaultd on %s reset the session",
                                c->path);
        if (n != -EAGAIN)
            return session_fail(c, err, (int)n, "receive from tensorvaultd on %s: %s", c->path,
                                e.msg[0] ? e.msg : tv_strerror((int)n));
        if (!wait)
            return 1;
        int rc = wait_sock(c, POLLIN, NULL, err);
        if (rc)
            return rc;
    }
}

static int unexpected(tv_client *c, const tv__fp_msg *m, const char *when, tv_error *err)
{
    if (m->type == TV__FP_ERROR && (m->u.error.flags & TV__FP_ERROR_FATAL))
        return fatal_error(c, m, err);
    return session_fail(c, err, TV_E_PROTOCOL, "tensorvaultd on %s sent %s %s", c->path,
                        tv__fp_type_name(m->type), when);
}

/* ---- connect and close ------------------------------------------------------ */

TV_API int tv_client_connect(const char *socket_path, const tv_client_opts *opts, tv_client **out,
                             tv_error *err)
{
    int rc;
    struct sockaddr_un sa;
    if (!out)
        return tv__seterr(err, TV_E_INVALID_ARG, "NULL argument");
    *out = NULL;
    const char *path = socket_path;
    if (!path) {
        const char *env = getenv("TENSORVAULT_SOCKET");
        path = env && *env ? env : TV_CLIENT_DEFAULT_SOCKET;
    }
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    if (!*path || strlen(path) >= sizeof(sa.sun_path))
        return tv__seterr(err, TV_E_INVALID_ARG,
                          "fast-path socket path '%.200s' is empty or longer than %zu bytes", path,
                          sizeof(sa.sun_path) - 1);
    tv_client *c = calloc(1, sizeof(*c));
    if (!c)
        return tv__seterr(err, -ENOMEM, "out of memory");
    memcpy(sa.sun_path, path, strlen(path));
    snprintf(c->path, sizeof(c->path), "%s", path);
    c->timeout_ms = opts && opts->timeout_ms ? opts->timeout_ms : DEFAULT_TIMEOUT_MS;
    if (c->timeout_ms > INT32_MAX)
        c->timeout_ms = INT32_MAX;
    c->cuda_register = opts && opts->cuda_register;
    c->next_req_id = 1;
    c->sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (c->sock < 0) {
        rc = tv__seterr(err, -errno, "fast-path socket: %s", strerror(errno));
        goto fail;
    }
    while (connect(c->sock, (const struct sockaddr *)&sa, sizeof(sa)) < 0) {
        int e = errno;
        if (e == EINTR)
            continue;
        if (e == ENOENT || e == ECONNREFUSED)
            rc = tv__seterr(err, TV_E_NO_DAEMON, "no tensorvaultd listening on socket %s (%s)",
                            path, strerror(e));
        else
            rc = tv__seterr(err, -e, "cannot connect to tensorvaultd socket %s: %s", path,
                            strerror(e));
        goto fail;
    }
    int fl = fcntl(c->sock, F_GETFL);
    if (fl < 0 || fcntl(c->sock, F_SETFL, fl | O_NONBLOCK) < 0) {
        rc = tv__seterr(err, -errno, "socket %s: O_NONBLOCK: %s", path, strerror(errno));
        goto fail;
    }
    uint16_t vmax = tv__fpc_max_version;
    if (vmax < TV__FP_VERSION_MIN || vmax > TV__FP_VERSION_MAX)
        vmax = TV__FP_VERSION_MAX;
    size_t len = tv__fp_encode_hello(c->sbuf, sizeof(c->sbuf), TV__FP_VERSION_MIN, vmax);
    if ((rc = send_wait(c, c->sbuf, len, err)))
        goto fail;
    tv__fp_msg m;
    if ((rc = recv_msg(c, &m, NULL, 0, NULL, true, err)))
        goto fail;
    if (m.type == TV__FP_ERROR) {
        int code = m.u.error.code < 0 ? m.u.error.code : TV_E_PROTOCOL;
        rc = session_fail(c, err, code, "tensorvaultd on %s refused the session: %.*s", path,
                          TEXT_PREC(&m), m.text ? m.text : "");
        goto fail;
    }
    if (m.type != TV__FP_HELLO_OK) {
        rc = unexpected(c, &m, "instead of HELLO_OK", err);
        goto fail;
    }
    const tv__fp_hello_ok *h = &m.u.hello_ok;
    if (h->version < TV__FP_VERSION_MIN || h->version > vmax) {
        rc = session_fail(
            c, err, TV_E_VERSION,
            "tensorvaultd on %s chose protocol version %u; this library offered %u..%u", path,
            h->version, TV__FP_VERSION_MIN, vmax);
        goto fail;
    }
    if (h->max_msg_len < TV__FP_MAX_MSG || h->max_requests == 0 || h->max_handles == 0) {
        rc = session_fail(
            c, err, TV_E_PROTOCOL,
            "tensorvaultd on %s: HELLO_OK with max_msg_len %u, max_requests %u, max_handles %u",
            path, h->max_msg_len, h->max_requests, h->max_handles);
        goto fail;
    }
    c->version = h->version;
    c->max_requests = h->max_requests;
    c->max_handles = h->max_handles;
    c->session_id = h->session_id;
    *out = c;
    return 0;
fail:
    tv_client_close(c);
    return rc;
}

static void model_free(tv_client_model *m);

TV_API void tv_client_close(tv_client *c)
{
    if (!c)
        return;
    /* The daemon drops every handle of a session that closes: no CLOSE needed. */
    while (c->models) {
        tv_client_model *m = c->models;
        c->models = m->next;
        model_free(m);
    }
    if (c->sock >= 0)
        tv__sys.close(c->sock);
    free(c);
}

TV_API uint64_t tv_client_session_id(const tv_client *c)
{
    return c ? c->session_id : 0;
}

/* ---- open and close a model ------------------------------------------------ */

/* CLOSE handle, then waits for its CLOSED (no read is outstanding: every
 * read call completes before it returns). */
static int close_handle(tv_client *c, uint32_t handle, tv_error *err)
{
    int rc;
    size_t len = tv__fp_encode_close(c->sbuf, sizeof(c->sbuf), c->version, TV__FP_CLOSE, handle);
    if ((rc = send_wait(c, c->sbuf, len, err)))
        return rc;
    tv__fp_msg m;
    if ((rc = recv_msg(c, &m, NULL, 0, NULL, true, err)))
        return rc;
    if (m.type != TV__FP_CLOSED || m.u.close.handle != handle)
        return unexpected(c, &m, "instead of CLOSED", err);
    return 0;
}

static void model_free(tv_client_model *m)
{
    if (!m)
        return;
    if (m->pinned)
        tv__cuda_unpin((void *)m->arena);
    if (m->arena)
        tv__sys.munmap((void *)m->arena, m->arena_len);
    if (m->snap_map)
        tv__sys.munmap(m->snap_map, m->snap_len);
    for (uint32_t i = 0; m->t && i < m->snap.n_tensors; i++)
        tv__tdesc_free(&m->t[i].d);
    free(m->t);
    free(m->name);
    free(m);
}

TV_API void tv_client_model_close(tv_client_model *m)
{
    if (!m)
        return;
    tv_client *c = m->c;
    if (c) {
        for (tv_client_model **p = &c->models; *p; p = &(*p)->next)
            if (*p == m) {
                *p = m->next;
                break;
            }
        if (c->n_handles)
            c->n_handles--;
        if (c->sock >= 0) {
            tv_error e = {0};
            if (close_handle(c, m->handle, &e))
                tv__log(TV_LOG_WARN, "fast-path model %s@%lld: close: %s", m->name,
                        (long long)m->generation, e.msg);
        }
    }
    model_free(m);
}

/* Checks a received memfd: a regular file of exactly len bytes carrying
 * every seal of want. */
static int check_memfd(tv_client *c, int fd, uint64_t len, int want, const char *what,
                       const char *spec, tv_error *err)
{
    struct stat st;
    if (tv__sys.fstat(fd, &st) < 0)
        return session_fail(c, err, TV_E_PROTOCOL, "open '%s': %s descriptor: fstat: %s", spec,
                            what, strerror(errno));
    if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size != len)
        return session_fail(c, err, TV_E_PROTOCOL,
                            "open '%s': %s descriptor is not a memfd of %llu bytes (%lld bytes)",
                            spec, what, (unsigned long long)len, (long long)st.st_size);
    int seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0 || (seals & want) != want)
        return session_fail(c, err, TV_E_PROTOCOL,
                            "open '%s': %s memfd is not sealed (seals 0x%x, need 0x%x)", spec, what,
                            seals < 0 ? 0 : (unsigned)seals, (unsigned)want);
    return 0;
}

/* Validates the snapshot image against the spec and OPENED: checksum,
 * model name, generation. */
static int check_snapshot(tv_client_model *m, const char *spec, size_t name_len, int64_t want_gen,
                          tv_error *err)
{
    tv_error e = {0};
    const char *nm;
    size_t nl;
    int rc = tv__snap_open(m->snap_map, m->snap_len, TV__SNAP_VERIFY_CHECKSUM, &m->snap, &e);
    if (!rc)
        rc = tv__snap_model(&m->snap, &nm, &nl, &e);
    if (rc)
        return tv__seterr(err, TV_E_SNAPSHOT, "open '%s': the snapshot from tensorvaultd: %s", spec,
                          e.msg);
    if (nl != name_len || memcmp(nm, spec, nl))
        return tv__seterr(err, TV_E_SNAPSHOT,
                          "open '%s': tensorvaultd sent the snapshot of model '%.*s'", spec,
                          NAME_PREC(nl), nm);
    if (m->snap.generation != m->generation || (want_gen && m->snap.generation != want_gen))
        return tv__seterr(
            err, TV_E_SNAPSHOT,
            "open '%s': tensorvaultd sent generation %lld's snapshot for generation %lld", spec,
            (long long)m->snap.generation, (long long)(want_gen ? want_gen : m->generation));
    if (!(m->name = strndup(nm, nl)) ||
        !(m->t = calloc(m->snap.n_tensors ? m->snap.n_tensors : 1, sizeof(*m->t))))
        return tv__seterr(err, -ENOMEM, "out of memory");
    return 0;
}

TV_API int tv_client_open(tv_client *c, const char *spec, tv_client_model **out, tv_error *err)
{
    int rc, fds[TV__FP_N_FDS_OPENED] = {-1, -1};
    size_t n_fds = 0;
    tv_client_model *m = NULL;
    if (!c || !spec || !out)
        return tv__seterr(err, TV_E_INVALID_ARG, "NULL argument");
    *out = NULL;
    if (c->sock < 0)
        return dead_err(c, err);
    size_t sl = strlen(spec);
    const char *at = strrchr(spec, '@');
    size_t nl = at ? (size_t)(at - spec) : sl;
    int64_t want_gen = 0;
    if (nl == 0 || sl > TV__FP_MAX_SPEC || (at && !at[1]))
        return tv__seterr(
            err, TV_E_INVALID_ARG,
            "bad model spec '%.300s' (NAME, NAME@GEN or NAME@ALIAS, at most %u bytes)", spec,
            TV__FP_MAX_SPEC);
    if (at && at[1] >= '0' && at[1] <= '9' && !tv__parse_pos_i64(at + 1, &want_gen))
        return tv__seterr(err, TV_E_INVALID_ARG, "bad generation in '%s'", spec);
    uint32_t open_id = ++c->next_open_id ? c->next_open_id : ++c->next_open_id;
    size_t len = tv__fp_encode_open(c->sbuf, sizeof(c->sbuf), c->version, open_id, spec, sl);
    if (!len)
        return tv__seterr(err, TV_E_INVALID_ARG, "bad model spec '%.300s'", spec);
    if ((rc = send_wait(c, c->sbuf, len, err)))
        return rc;
    tv__fp_msg msg;
    if ((rc = recv_msg(c, &msg, fds, TV__FP_N_FDS_OPENED, &n_fds, true, err)))
        return rc;
    if (msg.type == TV__FP_ERROR && !(msg.u.error.flags & TV__FP_ERROR_FATAL)) {
        close_fds(fds, n_fds);
        if (msg.u.error.open_id != open_id || msg.u.error.req_id || msg.u.error.code >= 0)
            return session_fail(c, err, TV_E_PROTOCOL,
                                "tensorvaultd on %s: ERROR for open %u code %d answering open %u",
                                c->path, msg.u.error.open_id, msg.u.error.code, open_id);
        return tv__seterr(err, msg.u.error.code, "open '%.300s' through %s: %.*s", spec, c->path,
                          TEXT_PREC(&msg), msg.text ? msg.text : "");
    }
    if (msg.type != TV__FP_OPENED) {
        close_fds(fds, n_fds);
        return unexpected(c, &msg, "instead of OPENED", err);
    }
    const tv__fp_opened o = msg.u.opened;
    uint64_t slots_len = 0;
    bool handle_used = false;
    for (tv_client_model *p = c->models; p; p = p->next)
        handle_used |= p->handle == o.handle;
    if (o.open_id != open_id || n_fds != TV__FP_N_FDS_OPENED || o.handle == 0 || handle_used ||
        o.slot_len == 0 || o.slot_len % 4096 || o.n_slots == 0 || o.credit == 0 ||
        tv__mul_u64(o.slot_len, o.n_slots, &slots_len) || slots_len > o.arena_len ||
        o.snap_len < TV__SNAP_HEADER_LEN || o.snap_len > SIZE_MAX || o.arena_len > SIZE_MAX ||
        o.generation <= 0) {
        rc = session_fail(
            c, err, TV_E_PROTOCOL,
            "open '%s': bad OPENED from tensorvaultd on %s (open %u, %zu fds, handle %u%s, generation %lld, snapshot %llu bytes, arena %llu bytes, %u slots of %u bytes, credit %u)",
            spec, c->path, o.open_id, n_fds, o.handle, handle_used ? " already open" : "",
            (long long)o.generation, (unsigned long long)o.snap_len,
            (unsigned long long)o.arena_len, o.n_slots, o.slot_len, o.credit);
        goto fail;
    }
    if ((rc = check_memfd(c, fds[0], o.snap_len, SNAP_SEALS, "snapshot", spec, err)) ||
        (rc = check_memfd(c, fds[1], o.arena_len, ARENA_SEALS, "arena", spec, err)))
        goto fail;
    if (!(m = calloc(1, sizeof(*m)))) {
        rc = tv__seterr(err, -ENOMEM, "out of memory");
        goto fail_close_handle;
    }
    m->handle = o.handle;
    m->generation = o.generation;
    m->slot_len = o.slot_len;
    m->n_slots = o.n_slots;
    m->credit = o.credit;
    m->snap_len = (size_t)o.snap_len;
    m->arena_len = (size_t)o.arena_len;
    void *p = tv__sys.mmap(NULL, m->snap_len, PROT_READ, MAP_SHARED, fds[0], 0);
    if (p == MAP_FAILED) {
        rc = tv__seterr(err, -errno, "open '%s': mmap of the snapshot: %s", spec, strerror(errno));
        goto fail_close_handle;
    }
    m->snap_map = p;
    p = tv__sys.mmap(NULL, m->arena_len, PROT_READ, MAP_SHARED, fds[1], 0);
    if (p == MAP_FAILED) {
        rc = tv__seterr(err, -errno, "open '%s': mmap of the staging arena: %s", spec,
                        strerror(errno));
        goto fail_close_handle;
    }
    m->arena = p;
    close_fds(fds, n_fds);
    if ((rc = check_snapshot(m, spec, nl, want_gen, err)))
        goto fail_close_handle;
    if (c->cuda_register && tv__cuda_available()) {
        tv_error pe = {0};
        if (tv__cuda_pin_readonly((void *)m->arena, m->arena_len, &pe) == 0)
            m->pinned = true;
        else
            tv__log(TV_LOG_INFO, "fast-path %s: arena not pinned (%s): pageable GPU copies", spec,
                    pe.msg);
    }
    m->c = c;
    m->next = c->models;
    c->models = m;
    c->n_handles++;
    *out = m;
    return 0;
fail_close_handle:
    /* The daemon opened the handle: give it back, the session stays. */
    if (c->sock >= 0) {
        tv_error ce = {0};
        close_handle(c, o.handle, &ce);
    }
fail:
    close_fds(fds, n_fds);
    model_free(m);
    return rc;
}

TV_API int64_t tv_client_model_generation(const tv_client_model *m)
{
    return m ? m->generation : 0;
}

TV_API const char *tv_client_model_name(const tv_client_model *m)
{
    return m ? m->name : NULL;
}

TV_API size_t tv_client_n_tensors(const tv_client_model *m)
{
    return m ? m->snap.n_tensors : 0;
}

/* ---- metadata from the snapshot -------------------------------------------- */

/* Tensor i's record, decoded and validated on first use. */
static int ensure_tensor(const tv_client_model *cm, size_t i, tv_error *err)
{
    tv_client_model *m = (tv_client_model *)cm; /* decoding is not a visible change */
    if (i >= m->snap.n_tensors)
        return tv__seterr(err, TV_E_INVALID_ARG, "tensor index %zu out of range (%u tensors)", i,
                          m->snap.n_tensors);
    tv__fpc_tensor *p = &m->t[i];
    if (p->ready)
        return 0;
    int rc = tv__tdesc_decode(&m->snap, (uint32_t)i, &p->d, err);
    if (rc == 0)
        p->ready = true;
    return rc;
}

TV_API int tv_client_tensor(const tv_client_model *m, size_t i, tv_tensor_desc *out)
{
    if (!m || !out || i >= m->snap.n_tensors)
        return TV_E_INVALID_ARG;
    int rc = ensure_tensor(m, i, NULL);
    tv__tdesc_public(rc ? NULL : &m->t[i].d, out);
    return rc;
}

TV_API int tv_client_find(const tv_client_model *m, const char *name, size_t name_len,
                          size_t *index)
{
    if (!m || !name)
        return TV_E_NOT_FOUND;
    return tv__tdesc_find(&m->snap, name, name_len, index);
}

static int lookup(const tv_client_model *m, const char *name, size_t *idx, tv_error *err)
{
    uint32_t i;
    *idx = 0;
    if (!m || !name)
        return tv__seterr(err, TV_E_INVALID_ARG, "NULL argument");
    int rc = tv__tdesc_lookup(&m->snap, m->name, m->generation, name, &i, err);
    if (rc == 0 && (rc = ensure_tensor(m, i, err)) == 0)
        *idx = i;
    return rc;
}

uint16_t tv__fpc_max_version = TV__FP_VERSION_MAX;

/* ---- reads ---------------------------------------------------------------- */

enum { REQ_PENDING = 0, REQ_SENT, REQ_DONE };

/* One read of [off, off + len) of a tensor into dest (host memory, or a
 * device pointer for a sink). */
typedef struct creq {
    uint64_t off, len;
    uint8_t *dest;
    uint32_t tensor; /* a shard index with TV__FP_READ_SHARD_HEADER */
    uint32_t flags;  /* READ entry flags: 0 or TV__FP_READ_SHARD_HEADER */
    uint8_t state;
    int result;
    tv__fpc_spans sp;
} creq;

/* The state of one run of requests. */
typedef struct run {
    tv_client_model *m;
    tv_client *c;
    creq *r;
    size_t n, next, n_done, outstanding;
    uint64_t base; /* req_id of r[0] */
    const tv__io_sink *sink;
    uint32_t n_rel;
    size_t fail_at; /* lowest failed request with a message, or SIZE_MAX */
    tv_error fail_err;
    int xfer_rc;
    uint32_t *rel; /* the session's scratch */
} run;

/* Records request i's failure (code, message) when it is the lowest so far. */
static void req_failed(run *s, size_t i, int code, const char *fmt, ...) TV_PRINTF(4, 5);
static void req_failed(run *s, size_t i, int code, const char *fmt, ...)
{
    if (!s->r[i].result)
        s->r[i].result = code;
    if (i >= s->fail_at)
        return;
    char msg[sizeof(s->fail_err.msg)];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    tv__seterr(&s->fail_err, code, "%s", msg);
    s->fail_at = i;
}

/* What request q reads, for messages: *kind "tensor" and its name, or
 * "shard header" and the shard's file name. */
static const char *tname(const run *s, const creq *q, const char **kind, int *len)
{
    if (q->flags & TV__FP_READ_SHARD_HEADER) {
        tv_shard_desc sd;
        tv__shard_public(&s->m->snap, q->tensor, &sd);
        *kind = "shard header";
        *len = NAME_PREC(sd.name_len);
        return sd.name;
    }
    const tv__tdesc *t = &s->m->t[q->tensor].d;
    *kind = "tensor";
    *len = NAME_PREC(t->name_len);
    return t->name;
}

/* The request an entry names, if it is outstanding. */
static int find_req(run *s, uint64_t req_id, uint32_t handle, const char *what, creq **out,
                    tv_error *err)
{
    uint64_t i = req_id - s->base;
    if (req_id < s->base || i >= s->n || s->r[i].state != REQ_SENT)
        return session_fail(s->c, err, TV_E_PROTOCOL,
                            "tensorvaultd on %s sent %s for request %llu, which is not outstanding",
                            s->c->path, what, (unsigned long long)req_id);
    if (handle != s->m->handle)
        return session_fail(s->c, err, TV_E_PROTOCOL,
                            "tensorvaultd on %s sent %s of handle %u for request %llu of handle %u",
                            s->c->path, what, handle, (unsigned long long)req_id, s->m->handle);
    *out = &s->r[i];
    return 0;
}

/* Sends the pending RELEASE; wait: block while the socket is full, else
 * -EAGAIN leaves it pending. */
static int flush_release(run *s, bool wait, tv_error *err)
{
    tv_client *c = s->c;
    if (!s->n_rel)
        return 0;
    size_t len =
        tv__fp_encode_release(c->sbuf, sizeof(c->sbuf), c->version, s->m->handle, s->rel, s->n_rel);
    if (!len)
        return session_fail(c, err, TV_E_INTERNAL, "RELEASE of %u slots does not encode", s->n_rel);
    int rc;
    if (wait) {
        rc = send_wait(c, c->sbuf, len, err);
    } else {
        tv_error e = {0};
        rc = tv__fp_send(c->sock, c->sbuf, len, NULL, 0, &e);
        if (rc && rc != -EAGAIN)
            rc = send_failed(c, rc, &e, err);
    }
    if (rc == 0)
        s->n_rel = 0;
    return rc;
}

/* Sends the next READ (as many requests as the session's window and one
 * message allow). Returns 0, -EAGAIN (socket full: nothing sent) or an error. */
static int send_reads(run *s, tv_error *err)
{
    tv_client *c = s->c;
    size_t n = 0, j = s->next;
    size_t room = c->max_requests > s->outstanding ? c->max_requests - s->outstanding : 0;
    if (room > TV__FP_MAX_READS)
        room = TV__FP_MAX_READS;
    tv__fp_read_ent *e = c->ents;
    for (; j < s->n && n < room; j++) {
        creq *q = &s->r[j];
        if (q->state != REQ_PENDING)
            continue;
        e[n++] = (tv__fp_read_ent){.req_id = s->base + j,
                                   .tensor = q->tensor,
                                   .flags = q->flags,
                                   .off = q->off,
                                   .len = q->len};
    }
    int rc = 0;
    if (n) {
        size_t len =
            tv__fp_encode_read(c->sbuf, sizeof(c->sbuf), c->version, s->m->handle, e, (uint32_t)n);
        tv_error se = {0};
        if (!len)
            rc = session_fail(c, err, TV_E_INTERNAL, "READ of %zu requests does not encode", n);
        else if ((rc = tv__fp_send(c->sock, c->sbuf, len, NULL, 0, &se)) && rc != -EAGAIN)
            rc = send_failed(c, rc, &se, err);
        if (rc == 0) {
            for (size_t k = 0; k < n; k++)
                s->r[e[k].req_id - s->base].state = REQ_SENT;
            s->outstanding += n;
            s->next = j;
        }
    } else {
        s->next = j;
    }
    return rc;
}

static int on_chunk(run *s, const tv__fp_msg *msg, tv_error *err)
{
    tv_client *c = s->c;
    tv_client_model *m = s->m;
    int rc;
    if (s->n_rel + msg->u.list.n > TV__FP_MAX_RELEASE && (rc = flush_release(s, true, err)))
        return rc;
    for (uint32_t i = 0; i < msg->u.list.n; i++) {
        tv__fp_chunk_ent e;
        tv_error de = {0};
        creq *q = NULL;
        if ((rc = tv__fp_chunk_entry(msg, i, &e, &de)))
            return session_fail(c, err, TV_E_PROTOCOL, "tensorvaultd on %s: CHUNK entry %u: %s",
                                c->path, i, de.msg);
        if ((rc = find_req(s, e.req_id, e.handle, "CHUNK", &q, err)))
            return rc;
        int nl;
        const char *kind;
        const char *nm = tname(s, q, &kind, &nl);
        if (e.slot >= m->n_slots || (uint64_t)e.slot_off + e.len > m->slot_len)
            return session_fail(
                c, err, TV_E_PROTOCOL,
                "tensorvaultd on %s: CHUNK for %s '%.*s': slot %u [%u, +%u) outside %u slots of %u bytes",
                c->path, kind, nl, nm, e.slot, e.slot_off, e.len, m->n_slots, m->slot_len);
        rc = tv__fpc_spans_add(&q->sp, e.dest_off, e.len, q->len);
        if (rc == TV_E_OVERFLOW)
            return session_fail(
                c, err, TV_E_PROTOCOL,
                "tensorvaultd on %s: CHUNK for %s '%.*s': bytes [%llu, +%u) past the request's %llu",
                c->path, kind, nl, nm, (unsigned long long)e.dest_off, e.len,
                (unsigned long long)q->len);
        if (rc == TV_E_PROTOCOL)
            return session_fail(
                c, err, TV_E_PROTOCOL,
                "tensorvaultd on %s: CHUNK for %s '%.*s': bytes [%llu, +%u) delivered twice",
                c->path, kind, nl, nm, (unsigned long long)e.dest_off, e.len);
        if (rc)
            return session_fail(c, err, rc, "out of memory");
        const uint8_t *src = m->arena + (size_t)e.slot * m->slot_len + e.slot_off;
        if (!s->sink) {
            memcpy(q->dest + e.dest_off, src, e.len);
        } else if ((rc =
                        s->sink->copy(s->sink->ctx, q->dest, e.dest_off, src, e.len, UINT32_MAX))) {
            req_failed(s, (size_t)(q - s->r), rc, "%s '%.*s': copy to the GPU failed: %s", kind, nl,
                       nm, tv_strerror(rc));
        }
        s->rel[s->n_rel++] = e.slot;
    }
    /* The copies out of these slots are done before they go back. */
    if (s->sink && s->sink->finish && (rc = s->sink->finish(s->sink->ctx)) && !s->xfer_rc)
        s->xfer_rc = rc;
    rc = flush_release(s, false, err);
    return rc == -EAGAIN ? 0 : rc;
}

static int on_done(run *s, const tv__fp_msg *msg, tv_error *err)
{
    tv_client *c = s->c;
    for (uint32_t i = 0; i < msg->u.list.n; i++) {
        tv__fp_done_ent e;
        tv_error de = {0};
        creq *q = NULL;
        int rc;
        if ((rc = tv__fp_done_entry(msg, i, &e, &de)))
            return session_fail(c, err, TV_E_PROTOCOL, "tensorvaultd on %s: DONE entry %u: %s",
                                c->path, i, de.msg);
        if ((rc = find_req(s, e.req_id, e.handle, "DONE", &q, err)))
            return rc;
        int nl;
        const char *kind;
        const char *nm = tname(s, q, &kind, &nl);
        size_t idx = (size_t)(q - s->r);
        if (e.result > 0)
            return session_fail(c, err, TV_E_PROTOCOL,
                                "tensorvaultd on %s: DONE for %s '%.*s' with result %d", c->path,
                                kind, nl, nm, e.result);
        if (e.result == 0 && q->sp.delivered != q->len)
            return session_fail(
                c, err, TV_E_PROTOCOL,
                "tensorvaultd on %s: DONE for %s '%.*s' after %llu of its %llu bytes", c->path,
                kind, nl, nm, (unsigned long long)q->sp.delivered, (unsigned long long)q->len);
        if (e.result) {
            q->result = e.result;
            if (idx == s->fail_at)
                s->fail_err.code = e.result; /* its ERROR came first, with the text */
            else
                req_failed(s, idx, e.result, "%s '%.*s': %s", kind, nl, nm, tv_strerror(e.result));
        }
        q->state = REQ_DONE;
        s->outstanding--;
        s->n_done++;
    }
    return 0;
}

static int on_error(run *s, const tv__fp_msg *msg, tv_error *err)
{
    tv_client *c = s->c;
    const tv__fp_error *e = &msg->u.error;
    creq *q = NULL;
    int rc;
    if (e->flags & TV__FP_ERROR_FATAL)
        return fatal_error(c, msg, err);
    if (e->open_id || e->code >= 0)
        return session_fail(c, err, TV_E_PROTOCOL,
                            "tensorvaultd on %s: ERROR code %d for open %u during a read", c->path,
                            e->code, e->open_id);
    if ((rc = find_req(s, e->req_id, s->m->handle, "ERROR", &q, err)))
        return rc;
    int nl;
    const char *kind;
    const char *nm = tname(s, q, &kind, &nl);
    size_t idx = (size_t)(q - s->r);
    /* The text names the tensor (the daemon's rule); else it is prefixed. */
    if (msg->text_len >= (size_t)nl && memmem(msg->text, msg->text_len, nm, (size_t)nl))
        req_failed(s, idx, e->code, "%.*s", TEXT_PREC(msg), msg->text);
    else
        req_failed(s, idx, e->code, "%s '%.*s': %.*s", kind, nl, nm, TEXT_PREC(msg),
                   msg->text ? msg->text : "");
    return 0;
}

/* Runs n checked requests of m through the daemon (sink NULL: host
 * memcpy). Returns 0 when every one succeeded; else the lowest failed
 * request's code with err naming it, or the session's error (then every
 * request that had not completed carries it). */
static int run_reqs(tv_client_model *m, creq *r, size_t n, const tv__io_sink *sink, tv_error *err)
{
    tv_client *c = m->c;
    int rc = 0;
    run st, *s = &st;
    if (!c || c->sock < 0) {
        rc = c ? dead_err(c, err)
               : tv__seterr(err, TV_E_DISCONNECTED, "the fast-path session of %s is closed",
                            m->name);
        goto fail_all;
    }
    st = (run){.m = m, .c = c, .r = r, .n = n, .base = c->next_req_id, .sink = sink};
    s->fail_at = SIZE_MAX;
    s->rel = c->rel;
    c->next_req_id += n;
    for (size_t i = 0; i < n; i++)
        if (r[i].len == 0) { /* nothing to ask for */
            r[i].state = REQ_DONE;
            s->n_done++;
        }
    for (;;) {
        bool want_out = false;
        if (s->n_rel && (rc = flush_release(s, false, err))) {
            if (rc != -EAGAIN)
                goto fail_all;
            want_out = true;
        }
        while (!want_out && s->next < n && s->outstanding < c->max_requests) {
            if ((rc = send_reads(s, err)) == -EAGAIN)
                want_out = true;
            else if (rc)
                goto fail_all;
        }
        if (s->n_done == n && !s->n_rel)
            break;
        tv__fp_msg msg;
        rc = recv_msg(c, &msg, NULL, 0, NULL, false, err);
        if (rc == 1) {
            if ((rc = wait_sock(c, want_out ? POLLIN | POLLOUT : POLLIN, NULL, err)))
                goto fail_all;
            continue;
        }
        if (rc)
            goto fail_all;
        if (msg.type == TV__FP_CHUNK)
            rc = on_chunk(s, &msg, err);
        else if (msg.type == TV__FP_DONE)
            rc = on_done(s, &msg, err);
        else if (msg.type == TV__FP_ERROR)
            rc = on_error(s, &msg, err);
        else
            rc = unexpected(c, &msg, "during a read", err);
        if (rc)
            goto fail_all;
    }
    if (s->xfer_rc) {
        rc = tv__seterr(err, s->xfer_rc, "copy from the fast-path arena to the GPU failed: %s",
                        tv_strerror(s->xfer_rc));
        for (size_t i = 0; i < n; i++)
            if (!r[i].result && r[i].len)
                r[i].result = s->xfer_rc;
    } else if (s->fail_at != SIZE_MAX) {
        rc = s->fail_err.code;
        if (err)
            *err = s->fail_err;
    }
    return rc;
fail_all:
    /* The session failed: what had not completed never will. */
    for (size_t i = 0; i < n; i++)
        if (r[i].state != REQ_DONE && !r[i].result)
            r[i].result = rc;
    return rc;
}

static void free_reqs(creq *r, size_t n)
{
    for (size_t i = 0; r && i < n; i++)
        tv__fpc_spans_free(&r[i].sp);
}

/* One request of tensor i, [off, off + len), into dest. */
static int read_one(tv_client_model *m, size_t i, uint64_t off, uint64_t len, void *dest,
                    tv_error *err)
{
    creq r = {.off = off, .len = len, .dest = dest, .tensor = (uint32_t)i};
    tv__fpc_spans_init(&r.sp);
    int rc = run_reqs(m, &r, 1, NULL, err);
    free_reqs(&r, 1);
    return rc;
}

TV_API size_t tv_client_n_shards(const tv_client_model *m)
{
    return m ? m->snap.n_shards : 0;
}

TV_API int tv_client_shard(const tv_client_model *m, size_t i, tv_shard_desc *out)
{
    if (!out)
        return TV_E_INVALID_ARG;
    if (!m) {
        *out = (tv_shard_desc){.name = ""};
        return TV_E_INVALID_ARG;
    }
    return tv__shard_public(&m->snap, i, out);
}

TV_API int tv_client_read_shard_header(tv_client_model *m, size_t shard, void *dest,
                                       size_t dest_len, tv_error *err)
{
    uint64_t len;
    int rc;
    if (!m)
        return tv__seterr(err, TV_E_INVALID_ARG, "NULL argument");
    rc = tv__shard_check_header(&m->snap, m->name, m->generation, shard, dest, dest_len, &len, err);
    if (rc)
        return rc;
    if (m->c && m->c->sock >= 0 && m->c->version < TV__FP_V2)
        return tv__seterr(
            err, TV_E_NOT_SUPPORTED,
            "%s@%lld: tensorvaultd on %s speaks fast-path protocol version %u; shard headers need version 2",
            m->name, (long long)m->generation, m->c->path, m->c->version);
    creq r = {.off = 0,
              .len = len,
              .dest = dest,
              .tensor = (uint32_t)shard,
              .flags = TV__FP_READ_SHARD_HEADER};
    tv__fpc_spans_init(&r.sp);
    rc = run_reqs(m, &r, 1, NULL, err);
    free_reqs(&r, 1);
    return rc;
}

TV_API int tv_client_read_into(tv_client_model *m, const char *name, void *dest, size_t dest_len,
                               tv_error *err)
{
    size_t i;
    int rc = lookup(m, name, &i, err);
    if (rc)
        return rc;
    if ((rc = tv__tdesc_check_into(&m->t[i].d, name, dest, dest_len, err)))
        return rc;
    return read_one(m, i, 0, m->t[i].d.nbytes, dest, err);
}

static int batch(tv_client_model *m, tv_read_req *reqs, size_t n, const tv__io_sink *sink,
                 tv_error *err)
{
    tv__batch_err first = {0};
    if (!m || (!reqs && n))
        return tv__seterr(err, TV_E_INVALID_ARG, "NULL argument");
    creq *r = calloc(n ? n : 1, sizeof(*r));
    size_t *map = calloc(n ? n : 1, sizeof(*map));
    if (!r || !map) {
        free(r);
        free(map);
        return tv__seterr(err, -ENOMEM, "out of memory");
    }
    size_t k = 0;
    for (size_t j = 0; j < n; j++) {
        size_t i;
        tv_error e = {0};
        int rr = tv__tdesc_batch_index(&m->snap, m->name, m->generation, &reqs[j], j, &i, &e);
        if (!rr)
            rr = ensure_tensor(m, i, &e);
        if (!rr) {
            const tv__tdesc *p = &m->t[i].d;
            if (!(rr = tv__tdesc_check_batch(p, j, reqs[j].dest, reqs[j].dest_len, &e)))
                r[k] = (creq){.len = p->nbytes, .dest = reqs[j].dest, .tensor = (uint32_t)i};
        }
        if ((reqs[j].result = tv__batch_note(&first, rr, &e)) == 0)
            map[k++] = j;
    }
    tv_error e = {0};
    tv__batch_note(&first, k ? run_reqs(m, r, k, sink, &e) : 0, &e);
    for (size_t q = 0; q < k; q++)
        reqs[map[q]].result = r[q].result;
    free_reqs(r, k);
    free(r);
    free(map);
    return tv__batch_answer(&first, err);
}

TV_API int tv_client_read_batch(tv_client_model *m, tv_read_req *reqs, size_t n, tv_error *err)
{
    return batch(m, reqs, n, NULL, err);
}

TV_API int tv_client_read_range(tv_client_model *m, const char *name, uint64_t off, uint64_t len,
                                void *dest, size_t dest_len, tv_error *err)
{
    size_t i;
    int rc = lookup(m, name, &i, err);
    if (rc)
        return rc;
    if ((rc = tv__tdesc_check_range(&m->t[i].d, name, off, len, dest, dest_len, err)) || len == 0)
        return rc;
    return read_one(m, i, off, len, dest, err);
}

TV_API int tv_client_rows_len(const tv_client_model *m, const char *name, uint64_t r0, uint64_t r1,
                              uint64_t *len, tv_error *err)
{
    size_t i;
    uint64_t off;
    if (!len)
        return tv__seterr(err, TV_E_INVALID_ARG, "NULL argument");
    *len = 0;
    int rc = lookup(m, name, &i, err);
    return rc ? rc : tv__tdesc_rows(&m->t[i].d, name, r0, r1, &off, len, err);
}

TV_API int tv_client_read_rows(tv_client_model *m, const char *name, uint64_t r0, uint64_t r1,
                               void *dest, size_t dest_len, tv_error *err)
{
    size_t i;
    uint64_t off, len;
    int rc = lookup(m, name, &i, err);
    if (rc || (rc = tv__tdesc_rows(&m->t[i].d, name, r0, r1, &off, &len, err)) || r0 == r1)
        return rc;
    if ((rc = tv__tdesc_check_rows_dest(name, r0, r1, len, dest, dest_len, err)))
        return rc;
    return read_one(m, i, off, len, dest, err);
}

TV_API int tv_client_read_f32(tv_client_model *m, const char *name, void *dest, size_t dest_len,
                              tv_error *err)
{
    size_t i;
    int rc = lookup(m, name, &i, err);
    if (rc)
        return rc;
    const tv__tdesc *p = &m->t[i].d;
    if ((rc = tv__tdesc_check_f32(p, name, dest, dest_len, err)))
        return rc;
    if (p->dtype == TV_DTYPE_F32)
        return read_one(m, i, 0, p->nbytes, dest, err);
    if (p->nbytes > SIZE_MAX)
        return tv__seterr(err, TV_E_OVERFLOW, "tensor '%s': %llu bytes do not fit in memory", name,
                          (unsigned long long)p->nbytes);
    void *raw = malloc(p->nbytes ? (size_t)p->nbytes : 1);
    if (!raw)
        return tv__seterr(err, -ENOMEM, "out of memory");
    rc = read_one(m, i, 0, p->nbytes, raw, err);
    if (!rc && (rc = tv_convert_f32(p->dtype, raw, (size_t)p->n_elements, dest)))
        tv__seterr(err, rc, "tensor '%s': float32 conversion: %s", name, tv_strerror(rc));
    free(raw);
    return rc;
}

TV_API int tv_client_get_tensor(tv_client_model *m, const char *name, tv_tensor **out,
                                tv_error *err)
{
    size_t i;
    int rc;
    if (!out)
        return tv__seterr(err, TV_E_INVALID_ARG, "NULL argument");
    *out = NULL;
    if ((rc = lookup(m, name, &i, err)))
        return rc;
    const tv__tdesc *p = &m->t[i].d;
    if (p->nbytes > SIZE_MAX - 64)
        return tv__seterr(err, TV_E_OVERFLOW, "tensor '%s' too large", name);
    tv_tensor *t;
    void *arena;
    if ((rc = tv__tensor_new(p->nbytes ? p->nbytes : 64, 64, &t, &arena, err)))
        return rc;
    if ((rc = read_one(m, i, 0, p->nbytes, arena, err))) {
        tv_tensor_free(t);
        return rc;
    }
    tv__tensor_set(t, 0, p);
    *out = t;
    return 0;
}

/* ---- CUDA destinations ------------------------------------------------------ */

TV_API int tv_client_read_batch_cuda(tv_client_model *m, tv_read_req *reqs, size_t n, void *stream,
                                     tv_error *err)
{
    tv__cuda_sink *cs = NULL;
    tv__io_sink sink;
    int rc;
    if (!m || (!reqs && n))
        return tv__seterr(err, TV_E_INVALID_ARG, "NULL argument");
    if ((rc = tv__cuda_sink_create(stream, 1, &cs, err)))
        goto fail_all;
    for (size_t j = 0; j < n; j++)
        if (reqs[j].dest && (rc = tv__cuda_check_dest(reqs[j].dest, reqs[j].dest_len, err))) {
            tv__cuda_sink_destroy(cs);
            goto fail_all;
        }
    tv__cuda_sink_bind(cs, &sink);
    rc = batch(m, reqs, n, &sink, err);
    tv__cuda_sink_destroy(cs);
    return rc;
fail_all:
    for (size_t j = 0; reqs && j < n; j++)
        reqs[j].result = rc;
    return rc;
}

TV_API int tv_client_read_into_cuda(tv_client_model *m, const char *name, void *dev_ptr,
                                    size_t dev_len, void *stream, tv_error *err)
{
    tv_read_req r = {.name = name, .dest = dev_ptr, .dest_len = dev_len};
    return tv_client_read_batch_cuda(m, &r, 1, stream, err);
}
