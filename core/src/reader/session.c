/* The fast-path session (tensorvault/client.h): one connection to
 * tensorvaultd over its UNIX socket (SOCK_SEQPACKET), the protocol version
 * negotiated at connect, and the primitives the daemon backend of tv_model
 * (reader/daemon.c) reads with: sending, receiving and the rule that any
 * failure closes the session for good (reader/daemon.h).
 *
 * Invariants:
 *   - the daemon is not trusted: every message is decoded by the wire codec
 *     (wire/wire.h) before anything in it is used;
 *   - anything unexpected from the daemon (or a failed send or receive)
 *     closes the session: TV_E_PROTOCOL, TV_E_DISCONNECTED at EOF,
 *     TV_E_TIMEOUT when no reply came within timeout_ms; a dead session
 *     answers every later call with TV_E_DISCONNECTED;
 *   - a fatal ERROR the daemon sent before closing is reported with its own
 *     code and text even when the connection failed first (a reset, EPIPE
 *     on a send): a daemon over its limits refuses a connection with an
 *     ERROR and closes it without reading the HELLO, so TV_E_BUSY or
 *     TV_E_PEER_DENIED reach the caller, not TV_E_DISCONNECTED;
 *   - every descriptor received and not asked for is closed at once;
 *   - tv_client_close never frees a model: the models of the session are
 *     detached and stay valid until tv_model_close. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "reader/daemon.h"
#include "tensorvault/client.h"
#include "util/internal.h"
#include "util/sys.h"

#define DEFAULT_TIMEOUT_MS 60000u

uint16_t tv__fpc_max_version = TV__FP_VERSION_MAX;

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

int tv__fpc_fail(tv_client *c, tv_error *err, int code, const char *fmt, ...)
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

int tv__fpc_dead(const tv_client *c, tv_error *err)
{
    return tv__seterr(err, TV_E_DISCONNECTED, "fast-path session on %s is closed (%s: %s)", c->path,
                      tv_err_name(c->dead_code), c->dead_msg);
}

void tv__fpc_close_fds(int *fds, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (fds[i] >= 0) {
            tv__sys.close(fds[i]);
            fds[i] = -1;
        }
}

int tv__fpc_wait(tv_client *c, short events, tv_error *err)
{
    struct pollfd p = {.fd = c->sock, .events = events};
    for (;;) {
        int n = poll(&p, 1, (int)c->timeout_ms);
        if (n > 0)
            return 0;
        if (n == 0)
            return tv__fpc_fail(c, err, TV_E_TIMEOUT,
                                "no reply from tensorvaultd on %s within %u ms", c->path,
                                c->timeout_ms);
        if (errno != EINTR)
            return tv__fpc_fail(c, err, -errno, "poll on %s: %s", c->path, strerror(errno));
    }
}

int tv__fpc_fatal(tv_client *c, const tv__fp_msg *m, tv_error *err)
{
    int code = m->u.error.code < 0 ? m->u.error.code : TV_E_PROTOCOL;
    if (!c->version) /* before HELLO_OK: the daemon refused the connection */
        return tv__fpc_fail(c, err, code, "tensorvaultd on %s refused the session: %.*s", c->path,
                            TV__FPC_TEXT_PREC(m), m->text ? m->text : "");
    return tv__fpc_fail(c, err, code, "tensorvaultd on %s closed the session: %.*s", c->path,
                        TV__FPC_TEXT_PREC(m), m->text ? m->text : "");
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
            return tv__fpc_fatal(c, &m, err);
    }
    return 0;
}

static int send_failed(tv_client *c, int rc, const tv_error *e, tv_error *err)
{
    if (rc == -EPIPE || rc == -ECONNRESET) {
        int q = queued_fatal(c, err);
        if (q)
            return q;
        return tv__fpc_fail(c, err, TV_E_DISCONNECTED, "tensorvaultd on %s closed the session",
                            c->path);
    }
    return tv__fpc_fail(c, err, rc, "send to tensorvaultd on %s: %s", c->path,
                        e->msg[0] ? e->msg : tv_strerror(rc));
}

int tv__fpc_send(tv_client *c, const void *buf, size_t len, bool wait, tv_error *err)
{
    for (;;) {
        tv_error e = {0};
        int rc = tv__fp_send(c->sock, buf, len, NULL, 0, &e);
        if (rc == 0 || (rc == -EAGAIN && !wait))
            return rc;
        if (rc != -EAGAIN)
            return send_failed(c, rc, &e, err);
        if ((rc = tv__fpc_wait(c, POLLOUT, err)))
            return rc;
    }
}

int tv__fpc_recv(tv_client *c, tv__fp_msg *m, int *fds, size_t max_fds, size_t *n_fds, bool wait,
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
                tv__fpc_close_fds(fds, nf);
                if (n_fds)
                    *n_fds = 0;
                return tv__fpc_fail(c, err, rc == TV_E_VERSION ? TV_E_VERSION : TV_E_PROTOCOL,
                                    "tensorvaultd on %s sent a bad message: %s", c->path, e.msg);
            }
            return 0;
        }
        if (n == 0)
            return tv__fpc_fail(c, err, TV_E_DISCONNECTED, "tensorvaultd on %s closed the session",
                                c->path);
        if (n == -ECONNRESET && !reset) {
            /* The daemon closed with a message of ours unread: Linux says
             * so once, before the datagrams still queued here (the fatal
             * ERROR it sent before closing): read on. */
            reset = true;
            continue;
        }
        if (n == -ECONNRESET)
            return tv__fpc_fail(c, err, TV_E_DISCONNECTED, "tensorvaultd on %s reset the session",
                                c->path);
        if (n != -EAGAIN)
            return tv__fpc_fail(c, err, (int)n, "receive from tensorvaultd on %s: %s", c->path,
                                e.msg[0] ? e.msg : tv_strerror((int)n));
        if (!wait)
            return 1;
        int rc = tv__fpc_wait(c, POLLIN, err);
        if (rc)
            return rc;
    }
}

int tv__fpc_unexpected(tv_client *c, const tv__fp_msg *m, const char *when, tv_error *err)
{
    if (m->type == TV__FP_ERROR && (m->u.error.flags & TV__FP_ERROR_FATAL))
        return tv__fpc_fatal(c, m, err);
    return tv__fpc_fail(c, err, TV_E_PROTOCOL, "tensorvaultd on %s sent %s %s", c->path,
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
    if ((rc = tv__fpc_send(c, c->sbuf, len, true, err)))
        goto fail;
    tv__fp_msg m;
    if ((rc = tv__fpc_recv(c, &m, NULL, 0, NULL, true, err)))
        goto fail;
    if (m.type == TV__FP_ERROR) {
        int code = m.u.error.code < 0 ? m.u.error.code : TV_E_PROTOCOL;
        rc = tv__fpc_fail(c, err, code, "tensorvaultd on %s refused the session: %.*s", path,
                          TV__FPC_TEXT_PREC(&m), m.text ? m.text : "");
        goto fail;
    }
    if (m.type != TV__FP_HELLO_OK) {
        rc = tv__fpc_unexpected(c, &m, "instead of HELLO_OK", err);
        goto fail;
    }
    const tv__fp_hello_ok *h = &m.u.hello_ok;
    if (h->version < TV__FP_VERSION_MIN || h->version > vmax) {
        rc = tv__fpc_fail(
            c, err, TV_E_VERSION,
            "tensorvaultd on %s chose protocol version %u; this library offered %u..%u", path,
            h->version, TV__FP_VERSION_MIN, vmax);
        goto fail;
    }
    if (h->max_msg_len < TV__FP_MAX_MSG || h->max_requests == 0 || h->max_handles == 0) {
        rc = tv__fpc_fail(
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

TV_API void tv_client_close(tv_client *c)
{
    if (!c)
        return;
    /* The daemon drops every handle of a session that closes (its leases
     * with them): no CLOSE needed. The models stay the caller's. */
    tv__fpc_detach_models(c);
    if (c->sock >= 0)
        tv__sys.close(c->sock);
    free(c);
}

TV_API uint64_t tv_client_session_id(const tv_client *c)
{
    return c ? c->session_id : 0;
}
