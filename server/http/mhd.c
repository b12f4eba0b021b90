/* libmicrohttpd transport for tv__api (see mhd.h). One conn_ctx per
 * connection (the peer, its cap key, its request deadline), created by the
 * connection-notify callback and kept in the daemon's connection list for
 * the watchdog; one req_ctx per request, created by the URI-log callback
 * (which also keeps the raw request target, query included), filled while
 * the body arrives, turned into a tv__api_req on the last call, and freed
 * by the request-completed callback, which also feeds the request metrics
 * and starts the connection's next deadline. */
#include "http/mhd.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "http/api.h"
#include "http/hosts.h"
#include "http/metrics.h"
#include "http/peer.h"
#include "http/static.h"
#include "net/unixsock.h"
#include "registry/registry.h"
#include "util/internal.h"
#include "util/sys.h"

#define STREAM_BLOCK       (256u << 10)
#define WATCHDOG_MS        250
#define CUT_LOG_INTERVAL_S 10 /* connections cut are logged at most this often (a summary) */

typedef struct listener listener;
typedef struct conn_ctx conn_ctx;

struct tv__http {
    listener *tcp, *unx;
    tv__api *api;
    tv__jobs *jobs;
    size_t max_body, max_header;
    unsigned header_timeout_ms, per_ip, per_uid;
    bool identify_loopback;
    uint16_t port;
    tv__http_hosts *hosts; /* the names it answers to */
    char *registry_path;
    char *socket_path;            /* unlinked at stop */
    pthread_mutex_t metrics_lock; /* guards metrics_reg */
    tv__reg *metrics_reg;
    /* Set by tv__http_quiesce: new connections are closed as they are
     * accepted. (Not MHD_quiesce_daemon: with a thread pool and epoll it
     * races with a worker taking the listening socket out of its epoll set at
     * its connection limit, and libmicrohttpd 0.9.75 then aborts: "Failed to
     * remove listen FD from epoll set".) */
    atomic_bool quiesced;
    /* the live connections (conns_mu): the watchdog's list, and the caps'
     * counts; an entry leaves it before libmicrohttpd closes its socket, so
     * a shutdown() under conns_mu never hits a reused descriptor */
    pthread_mutex_t conns_mu;
    pthread_cond_t wd_cond;
    conn_ctx *conns;
    bool wd_stop, wd_started;
    bool stopping; /* tv__http_stop began: nothing parks any more (conns_mu) */
    pthread_t wd;
    uint64_t n_cut_deadline, n_cut_cap; /* since the last summary line */
    time_t cut_logged;
};

struct listener {
    tv__http *h;
    struct MHD_Daemon *d;
    bool unix_sock;
};

struct conn_ctx {
    int fd;
    tv__http_peer peer;
    char key[80];                /* the cap it counts against: "uid N" or "address A" */
    _Atomic int64_t deadline_ms; /* CLOCK_MONOTONIC; 0 while a request is being served */
    bool cut;                    /* shut down (conns_mu) */
    tv__api_later *later;        /* the parked request's later answer (conns_mu) */
    conn_ctx *prev, *next;
};

typedef struct req_ctx {
    uint64_t t0_ns;
    char *target; /* raw request target: path[?query] */
    bool seen;    /* first access-handler call done */
    bool too_large;
    char *body;
    size_t body_len, body_cap;
    const char *route;
    int status;
    tv__api_resp *parked; /* a request waiting for its later answer (suspended) */
} req_ctx;

typedef struct stream_ctx {
    tv__api_resp *resp;
    const char *route;
} stream_ctx;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int64_t now_ms(void)
{
    return (int64_t)(now_ns() / 1000000u);
}

/* The connection's conn_ctx (NULL when it could not be allocated). */
static conn_ctx *conn_of(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

static void mhd_logger(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char line[512];
    vsnprintf(line, sizeof(line), fmt, ap);
    size_t n = strlen(line);
    while (n && (line[n - 1] == '\n' || line[n - 1] == '\r'))
        line[--n] = '\0';
    tv__log(TV_LOG_WARN, "http: %s", line);
}

/* Keeps the URL exactly as sent: the api decodes path segments itself. */
static size_t keep_raw(void *cls, struct MHD_Connection *c, char *s)
{
    (void)cls, (void)c;
    return strlen(s);
}

static void *uri_log(void *cls, const char *uri, struct MHD_Connection *c)
{
    (void)cls, (void)c;
    req_ctx *r = calloc(1, sizeof(*r));
    if (!r)
        return NULL;
    r->t0_ns = now_ns();
    r->target = strdup(uri ? uri : "/");
    r->route = "other";
    return r;
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls,
                      enum MHD_RequestTerminationCode toe)
{
    listener *l = cls;
    (void)toe;
    /* the next request of a kept-alive connection has the same time */
    conn_ctx *cc = conn_of(c);
    if (cc)
        atomic_store(&cc->deadline_ms, now_ms() + l->h->header_timeout_ms);
    req_ctx *r = *con_cls;
    if (!r)
        return;
    if (r->parked) { /* never resumed: closed at stop */
        if (cc) {
            pthread_mutex_lock(&l->h->conns_mu);
            cc->later = NULL;
            pthread_mutex_unlock(&l->h->conns_mu);
        }
        tv__api_resp_free(r->parked);
        free(r->parked);
    }
    if (r->status)
        tv__metrics_request(r->route, r->status, now_ns() - r->t0_ns);
    free(r->target);
    free(r->body);
    free(r);
    *con_cls = NULL;
}

/* The byte-body routes (tensor data, blobs): their bytes count in
 * tensorvault_read_bytes_total whether sent whole or streamed. */
static bool is_bytes_route(const char *route)
{
    size_t n = route ? strlen(route) : 0;
    return (n >= 5 && strcmp(route + n - 5, "/data") == 0) ||
           (route && strcmp(route, "GET /v1/blobs/{digest}") == 0);
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    stream_ctx *s = cls;
    if (pos >= s->resp->stream_len)
        return MHD_CONTENT_READER_END_OF_STREAM;
    ssize_t n = tv__api_stream_read(s->resp, pos, buf, max);
    if (n < 0) {
        tv__log(TV_LOG_WARN, "http: %s: tensor stream failed at byte %" PRIu64 ": %s", s->route,
                pos, tv_strerror((int)n));
        return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    if (n == 0)
        return MHD_CONTENT_READER_END_OF_STREAM;
    tv__metrics_read_bytes(s->route, (uint64_t)n);
    return n;
}

static void stream_free(void *cls)
{
    stream_ctx *s = cls;
    tv__api_resp_free(s->resp);
    free(s->resp);
    free(s);
}

/* "Name: value\r\n" lines into the response. */
static void add_headers(struct MHD_Response *mr, const char *lines)
{
    char buf[sizeof(((tv__api_resp *)0)->headers) + 1];
    snprintf(buf, sizeof(buf), "%s", lines);
    for (char *save = NULL, *l = strtok_r(buf, "\r\n", &save); l;
         l = strtok_r(NULL, "\r\n", &save)) {
        char *colon = strchr(l, ':');
        if (!colon || colon == l)
            continue;
        *colon = '\0';
        const char *v = colon + 1;
        while (*v == ' ' || *v == '\t')
            v++;
        MHD_add_response_header(mr, l, v);
    }
}

/* An error document of the transport itself (413 before the api sees the
 * request, 500 when out of memory). */
static enum MHD_Result queue_error(struct MHD_Connection *c, req_ctx *r, int status, int code,
                                   const char *message, bool close_conn)
{
    json_t *o = json_pack("{s:{s:s,s:s,s:i}}", "error", "code", tv_err_name(code), "message",
                          message, "errno", code);
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    struct MHD_Response *mr =
        s ? MHD_create_response_from_buffer(strlen(s), s, MHD_RESPMEM_MUST_FREE)
          : MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (!mr) {
        free(s);
        return MHD_NO;
    }
    MHD_add_response_header(mr, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    if (close_conn)
        MHD_add_response_header(mr, MHD_HTTP_HEADER_CONNECTION, "close");
    if (r)
        r->status = status;
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, mr);
    MHD_destroy_response(mr);
    return ret;
}

/* A code for a status, for the transport's own fallback documents. */
static int code_for_status(int status)
{
    switch (status) {
    case 400:
        return TV_E_BAD_REQUEST;
    case 401:
        return TV_E_UNAUTHORIZED;
    case 403:
        return TV_E_FORBIDDEN;
    case 404:
        return TV_E_NOT_FOUND;
    case 409:
        return TV_E_CONFLICT;
    case 413:
        return TV_E_TOO_LARGE;
    case 416:
        return TV_E_RANGE;
    case 503:
        return TV_E_BUSY;
    default:
        return TV_E_INTERNAL;
    }
}

static enum MHD_Result sum_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                  const char *value)
{
    (void)kind;
    size_t *sum = cls;
    *sum += strlen(key) + (value ? strlen(value) : 0) + 4;
    return MHD_YES;
}

/* Turns the api's response into an MHD response and queues it. Takes resp
 * (heap) over. */
static enum MHD_Result queue_api_resp(struct MHD_Connection *c, req_ctx *r, tv__api_resp *resp)
{
    struct MHD_Response *mr = NULL;
    r->status = resp->status;
    r->route = resp->route ? resp->route : "other";
    if (resp->stream) {
        stream_ctx *s = malloc(sizeof(*s));
        if (s) {
            s->resp = resp;
            s->route = r->route;
            mr = MHD_create_response_from_callback(resp->stream_len, STREAM_BLOCK, stream_read, s,
                                                   stream_free);
            if (!mr)
                free(s);
        }
        if (!mr) {
            tv__api_resp_free(resp);
            free(resp);
            return queue_error(c, r, 500, -ENOMEM, "out of memory", true);
        }
    } else {
        char *body = resp->body;
        size_t len = resp->body_len;
        if (!body && resp->json) {
            body = json_dumps(resp->json, JSON_COMPACT);
            len = body ? strlen(body) : 0;
        } else if (!resp->body_release) {
            resp->body = NULL; /* MHD frees it */
        }
        if (!body && resp->status >= 400) {
            /* Never an empty error: the api could not render its document
             * (e.g. a message that jansson refuses). */
            int status = resp->status;
            tv__api_resp_free(resp);
            free(resp);
            return queue_error(c, r, status, code_for_status(status),
                               "the error document could not be rendered", false);
        }
        if (body && resp->body_release) {
            /* zero copy: MHD sends from the reader's arena and releases it */
            mr = MHD_create_response_from_buffer_with_free_callback_cls(
                len, body, (MHD_ContentReaderFreeCallback)resp->body_release, resp->body_owner);
            if (mr) {
                resp->body = NULL;
                resp->body_release = NULL;
                resp->body_owner = NULL;
            }
            body = NULL; /* on failure tv__api_resp_free releases it */
        } else if (body)
            mr = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
        else
            mr = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
        if (!mr)
            free(body);
        else if (is_bytes_route(r->route) && (resp->status == 200 || resp->status == 206))
            tv__metrics_read_bytes(r->route, len);
    }
    if (!mr) {
        tv__api_resp_free(resp);
        free(resp);
        return queue_error(c, r, 500, -ENOMEM, "out of memory", true);
    }
    if (resp->content_type && resp->status != 304 && resp->status != 204)
        MHD_add_response_header(mr, MHD_HTTP_HEADER_CONTENT_TYPE, resp->content_type);
    add_headers(mr, resp->headers);
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)resp->status, mr);
    MHD_destroy_response(mr);
    if (!resp->stream) {
        tv__api_resp_free(resp);
        free(resp);
    }
    return ret;
}

/* GET /metrics: the api decides the auth (an R route: the same answer as
 * GET /v1/status for these credentials), then the text is rendered here. */
static enum MHD_Result serve_metrics(tv__http *h, struct MHD_Connection *c, req_ctx *r,
                                     const tv__api_req *req)
{
    tv__api_req probe = *req;
    probe.path = "/v1/status";
    probe.query = NULL;
    tv__api_resp *resp = calloc(1, sizeof(*resp));
    if (!resp)
        return queue_error(c, r, 500, -ENOMEM, "out of memory", true);
    tv__api_handle(h->api, &probe, resp);
    if (resp->status != 200) {
        resp->route = "GET /metrics";
        return queue_api_resp(c, r, resp);
    }
    tv__api_resp_free(resp);
    free(resp);
    char *text = NULL;
    size_t len = 0;
    pthread_mutex_lock(&h->metrics_lock);
    if (!h->metrics_reg) {
        tv_error e = {0};
        if (tv__reg_open_ex(h->registry_path, TV__REG_READONLY, &h->metrics_reg, &e))
            tv__log(TV_LOG_WARN, "metrics: registry: %s", e.msg);
    }
    int rc = tv__metrics_render(h->metrics_reg, h->jobs, &text, &len);
    pthread_mutex_unlock(&h->metrics_lock);
    r->route = "GET /metrics";
    if (rc)
        return queue_error(c, r, 500, rc, "cannot render metrics", false);
    struct MHD_Response *mr = MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
    if (!mr) {
        free(text);
        return queue_error(c, r, 500, -ENOMEM, "out of memory", true);
    }
    MHD_add_response_header(mr, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; version=0.0.4");
    r->status = 200;
    enum MHD_Result ret = MHD_queue_response(c, 200, mr);
    MHD_destroy_response(mr);
    return ret;
}

/* GET|HEAD of a dashboard file (http/static.h): no auth (the page's API
 * calls follow the API's read policy); 304 when If-None-Match matches. */
static enum MHD_Result serve_static(struct MHD_Connection *c, req_ctx *r, const tv__static_file *f)
{
    const char *inm = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "If-None-Match");
    int status = tv__static_not_modified(f, inm) ? 304 : 200;
    /* The file is a 304's response too: MHD sends no body with a 304 but
     * its Content-Length, which must be the 200's (RFC 9110 8.6), not 0. */
    struct MHD_Response *mr =
        MHD_create_response_from_buffer(f->len, (void *)f->data, MHD_RESPMEM_PERSISTENT);
    if (!mr)
        return queue_error(c, r, 500, -ENOMEM, "out of memory", true);
    MHD_add_response_header(mr, MHD_HTTP_HEADER_CONTENT_TYPE, f->content_type);
    MHD_add_response_header(mr, MHD_HTTP_HEADER_ETAG, f->etag);
    for (size_t i = 0; i < tv__static_nheaders; i++)
        MHD_add_response_header(mr, tv__static_headers[i][0], tv__static_headers[i][1]);
    r->route = strcmp(f->name, "index.html") ? "GET /ui/{name}" : "GET /";
    r->status = status;
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, mr);
    MHD_destroy_response(mr);
    return ret;
}

/* ---- parked requests ------------------------------------------------------------- */

static void resume_conn(void *ctx)
{
    MHD_resume_connection(ctx);
}

/* The answer comes later (tv__api_later): the connection is suspended (no
 * thread waits) until the answer's wake resumes it; the watchdog answers
 * 503 at the deadline, and tv__http_stop at once (a suspended connection
 * must be resumed before libmicrohttpd stops). */
static enum MHD_Result park(tv__http *h, struct MHD_Connection *c, conn_ctx *cc, req_ctx *r,
                            tv__api_resp *resp)
{
    tv__api_later *l = resp->later;
    r->parked = resp;
    MHD_suspend_connection(c);
    pthread_mutex_lock(&h->conns_mu);
    cc->later = l;
    bool stopping = h->stopping;
    pthread_mutex_unlock(&h->conns_mu);
    tv__api_later_watch(l, resume_conn, c);
    if (stopping)
        tv__api_later_expire(l, 0, true);
    return MHD_YES;
}

/* 421 for a Host that names someone else, 400 for none on HTTP/1.1, 403
 * for a state-changing request from a page of another origin; NULL when
 * the request may go on (the UNIX socket is not reachable from a page). */
static const char *misdirected(const tv__http *h, struct MHD_Connection *c, const char *method,
                               const char *version, int *status)
{
    const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host");
    if (!host) {
        *status = 400;
        return strcmp(version, "HTTP/1.0") ? "the request has no Host header" : NULL;
    }
    if (!tv__http_host_allowed(h->hosts, host, strlen(host), h->port)) {
        *status = 421;
        return "the Host of the request is not a name of this daemon (http.allowed_hosts)";
    }
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    if (origin && strcmp(method, "GET") && strcmp(method, "HEAD")) {
        const char *auth = strstr(origin, "://");
        if (!auth || strcmp(origin, "null") == 0 ||
            !tv__http_host_allowed(h->hosts, auth + 3, strcspn(auth + 3, "/"), h->port)) {
            *status = 403;
            return "a request from a page of another origin (Origin) may not change anything here";
        }
    }
    return NULL;
}

/* The paths this transport serves itself, GET (and HEAD) only: the
 * dashboard ("/", "/ui/NAME") and /metrics. */
static bool own_page(const char *target)
{
    return !strcmp(target, "/") || !strcmp(target, "/metrics") ||
           (!strncmp(target, "/ui/", 4) && target[4]);
}

/* Another method on one of those paths: 405 with Allow, as the API's
 * routes answer. */
static enum MHD_Result queue_405(struct MHD_Connection *c, req_ctx *r, const char *method)
{
    char msg[160];
    snprintf(msg, sizeof msg, "method %.16s is not allowed on '%.100s' (allowed: GET)", method,
             r->target);
    json_t *o = json_pack("{s:{s:s,s:s,s:i}}", "error", "code", tv_err_name(TV_E_BAD_REQUEST),
                          "message", msg, "errno", TV_E_BAD_REQUEST);
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    struct MHD_Response *mr =
        s ? MHD_create_response_from_buffer(strlen(s), s, MHD_RESPMEM_MUST_FREE) : NULL;
    if (!mr) {
        free(s);
        return MHD_NO;
    }
    MHD_add_response_header(mr, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    MHD_add_response_header(mr, MHD_HTTP_HEADER_ALLOW, "GET");
    r->status = 405;
    r->route = "unmatched"; /* as the API's own 405s */
    enum MHD_Result ret = MHD_queue_response(c, 405, mr);
    MHD_destroy_response(mr);
    return ret;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls)
{
    (void)url;
    listener *l = cls;
    tv__http *h = l->h;
    req_ctx *r = *con_cls;
    conn_ctx *cc = conn_of(c);
    if (!r || !r->target)
        return queue_error(c, NULL, 500, -ENOMEM, "out of memory", true);
    if (r->parked) { /* resumed: the later answer is in */
        tv__api_resp *resp = r->parked;
        r->parked = NULL;
        if (cc) {
            pthread_mutex_lock(&h->conns_mu);
            cc->later = NULL;
            pthread_mutex_unlock(&h->conns_mu);
        }
        tv__api_later_take(resp);
        return queue_api_resp(c, r, resp);
    }
    if (!r->seen) {
        r->seen = true;
        int status = 0;
        const char *why = l->unix_sock ? NULL : misdirected(h, c, method, version, &status);
        if (why)
            return queue_error(c, r, status, status == 403 ? TV_E_FORBIDDEN : TV_E_BAD_REQUEST, why,
                               true);
        size_t hsum = 0;
        MHD_get_connection_values(c, MHD_HEADER_KIND, sum_header, &hsum);
        if (hsum > h->max_header) {
            char msg[128];
            snprintf(msg, sizeof(msg), "request headers are %zu bytes, at most %zu", hsum,
                     h->max_header);
            return queue_error(c, r, 413, TV_E_TOO_LARGE, msg, true);
        }
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl) {
            char *end;
            errno = 0;
            unsigned long long n = strtoull(cl, &end, 10);
            if (!errno && !*end && n > h->max_body) {
                char msg[128];
                snprintf(msg, sizeof(msg), "request body is %llu bytes, at most %zu", n,
                         h->max_body);
                return queue_error(c, r, 413, TV_E_TOO_LARGE, msg, true);
            }
        }
        return MHD_YES;
    }
    if (*upload_data_size) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        if (r->too_large || n > h->max_body - r->body_len) {
            r->too_large = true;
            return MHD_YES;
        }
        if (r->body_len + n + 1 > r->body_cap) {
            size_t cap = r->body_cap ? r->body_cap : 4096;
            while (cap < r->body_len + n + 1)
                cap *= 2;
            char *nb = realloc(r->body, cap);
            if (!nb)
                return MHD_NO;
            r->body = nb;
            r->body_cap = cap;
        }
        memcpy(r->body + r->body_len, upload_data, n);
        r->body_len += n;
        r->body[r->body_len] = '\0';
        return MHD_YES;
    }
    if (cc) /* the request is whole: no deadline while it is served */
        atomic_store(&cc->deadline_ms, 0);
    if (r->too_large) {
        char msg[128];
        snprintf(msg, sizeof(msg), "request body over %zu bytes", h->max_body);
        return queue_error(c, r, 413, TV_E_TOO_LARGE, msg, true);
    }
    char *q = strchr(r->target, '?');
    if (q)
        *q++ = '\0';
    tv__api_req req = {
        .method = method,
        .path = r->target,
        .query = q,
        .body = r->body,
        .body_len = r->body_len,
        .authorization = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization"),
        .range = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Range"),
        .if_none_match = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "If-None-Match"),
        .content_type = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type"),
        .trusted = false,
        .peer = cc ? &cc->peer : NULL,
        .async = cc != NULL, /* the watchdog keeps a parked request's deadline */
    };
    bool get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    if (get) {
        const tv__static_file *f = tv__static_find(r->target);
        if (f)
            return serve_static(c, r, f);
    }
    if (strcmp(r->target, "/metrics") == 0 && get)
        return serve_metrics(h, c, r, &req);
    if (!get && own_page(r->target))
        return queue_405(c, r, method);
    tv__api_resp *resp = calloc(1, sizeof(*resp));
    if (!resp)
        return queue_error(c, r, 500, -ENOMEM, "out of memory", true);
    tv__api_handle(h->api, &req, resp);
    if (resp->later)
        return park(h, c, cc, r, resp);
    return queue_api_resp(c, r, resp);
}

/* HOST:PORT -> a socket address (numeric or resolved host). */
static int parse_listen(const char *listen, struct sockaddr_storage *ss, tv_error *err)
{
    char host[256];
    const char *colon = strrchr(listen, ':');
    if (!colon || colon == listen || (size_t)(colon - listen) >= sizeof(host))
        return tv__seterr(err, TV_E_INVALID_ARG, "listen address '%s' is not HOST:PORT", listen);
    size_t hl = (size_t)(colon - listen);
    memcpy(host, listen, hl);
    host[hl] = '\0';
    if (host[0] == '[' && hl >= 2 && host[hl - 1] == ']') {
        memmove(host, host + 1, hl - 2);
        host[hl - 2] = '\0';
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    int g = getaddrinfo(host, colon + 1, &hints, &ai);
    if (g || !ai)
        return tv__seterr(err, TV_E_INVALID_ARG, "listen address '%s' does not resolve: %s", listen,
                          gai_strerror(g));
    memset(ss, 0, sizeof(*ss));
    memcpy(ss, ai->ai_addr, ai->ai_addrlen < sizeof(*ss) ? ai->ai_addrlen : sizeof(*ss));
    freeaddrinfo(ai);
    return 0;
}

/* MHD's accept policy: once quiesced, every new connection is refused
 * (closed at once); requests in flight finish. */
static enum MHD_Result accept_policy(void *cls, const struct sockaddr *addr, socklen_t addrlen)
{
    (void)addr;
    (void)addrlen;
    return atomic_load(&((listener *)cls)->h->quiesced) ? MHD_NO : MHD_YES;
}

/* ---- connections: caps and deadlines ----------------------------------------- */

/* Logs what was cut since the last summary, at most every CUT_LOG_INTERVAL_S
 * (under conns_mu): a flood is one line, not one per connection. */
static void cut_log(tv__http *h, const char *example)
{
    time_t now = time(NULL);
    if (now - h->cut_logged < CUT_LOG_INTERVAL_S)
        return;
    h->cut_logged = now;
    tv__log(
        TV_LOG_WARN,
        "http: closed %" PRIu64
        " connections over their peer's cap (http.per_uid_connections, http.per_ip_connections) and %" PRIu64
        " that sent no whole request within http.header_timeout_s; latest: %s",
        h->n_cut_cap, h->n_cut_deadline, example);
    h->n_cut_cap = h->n_cut_deadline = 0;
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
    listener *l = cls;
    tv__http *h = l->h;
    if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        conn_ctx *cc = *socket_context;
        if (!cc)
            return;
        pthread_mutex_lock(&h->conns_mu);
        if (cc->prev)
            cc->prev->next = cc->next;
        else
            h->conns = cc->next;
        if (cc->next)
            cc->next->prev = cc->prev;
        pthread_mutex_unlock(&h->conns_mu);
        free(cc);
        *socket_context = NULL;
        return;
    }
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    conn_ctx *cc = ci ? calloc(1, sizeof *cc) : NULL;
    *socket_context = cc;
    if (!cc)
        return;
    cc->fd = ci->connect_fd;
    tv__http_peer_identify(cc->fd, h->identify_loopback, &cc->peer);
    unsigned cap;
    if (cc->peer.local) {
        snprintf(cc->key, sizeof cc->key, "uid %u", (unsigned)cc->peer.uid);
        cap = h->per_uid;
    } else {
        snprintf(cc->key, sizeof cc->key, "address %s", cc->peer.addr);
        cap = h->per_ip;
    }
    atomic_store(&cc->deadline_ms, now_ms() + h->header_timeout_ms);
    pthread_mutex_lock(&h->conns_mu);
    unsigned n = 0;
    for (conn_ctx *o = h->conns; o; o = o->next)
        n += !o->cut && !strcmp(o->key, cc->key);
    cc->next = h->conns;
    if (h->conns)
        h->conns->prev = cc;
    h->conns = cc;
    if (n >= cap) {
        /* libmicrohttpd reads end-of-file and closes it */
        cc->cut = true;
        shutdown(cc->fd, SHUT_RDWR);
        h->n_cut_cap++;
        char ex[160];
        snprintf(ex, sizeof ex, "%s already had %u connections", cc->key, n);
        cut_log(h, ex);
    }
    pthread_mutex_unlock(&h->conns_mu);
}

/* Every WATCHDOG_MS: connections past their request deadline are shut
 * down (libmicrohttpd then sees end-of-file and closes them). */
static void *watchdog_main(void *arg)
{
    tv__http *h = arg;
    pthread_mutex_lock(&h->conns_mu);
    while (!h->wd_stop) {
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_nsec += WATCHDOG_MS * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&h->wd_cond, &h->conns_mu, &until);
        int64_t now = now_ms();
        for (conn_ctx *cc = h->conns; cc && !h->wd_stop; cc = cc->next) {
            if (cc->later)
                tv__api_later_expire(cc->later, now, false);
            int64_t dl = atomic_load(&cc->deadline_ms);
            if (cc->cut || dl == 0 || dl > now)
                continue;
            cc->cut = true;
            shutdown(cc->fd, SHUT_RDWR);
            h->n_cut_deadline++;
            char ex[160];
            snprintf(ex, sizeof ex, "%s sent no whole request in %u ms", cc->key,
                     h->header_timeout_ms);
            cut_log(h, ex);
        }
    }
    pthread_mutex_unlock(&h->conns_mu);
    return NULL;
}

/* ---- start / stop --------------------------------------------------------------- */

static int start_listener(tv__http *h, const tv__http_opts *o, bool unix_sock, int fd,
                          const struct sockaddr_storage *ss, unsigned threads, listener **out,
                          tv_error *err)
{
    listener *l = calloc(1, sizeof *l);
    if (!l)
        return tv__seterr(err, -ENOMEM, "out of memory");
    l->h = h;
    l->unix_sock = unix_sock;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_USE_ITC |
                     MHD_USE_ERROR_LOG | MHD_ALLOW_SUSPEND_RESUME;
    if (!unix_sock && ss->ss_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    unsigned limit = o->max_connections ? o->max_connections : 4096u;
    errno = 0;
    l->d = MHD_start_daemon(
        flags, 0, accept_policy, l, on_request, l, MHD_OPTION_EXTERNAL_LOGGER, mhd_logger, NULL,
        unix_sock ? MHD_OPTION_LISTEN_SOCKET : MHD_OPTION_SOCK_ADDR,
        unix_sock ? (void *)(intptr_t)fd : (void *)ss, MHD_OPTION_THREAD_POOL_SIZE, threads,
        MHD_OPTION_CONNECTION_TIMEOUT, o->connection_timeout_s ? o->connection_timeout_s : 30u,
        MHD_OPTION_CONNECTION_LIMIT, limit, MHD_OPTION_PER_IP_CONNECTION_LIMIT, 0u,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, o->memory_limit ? o->memory_limit : (size_t)(64u << 10),
        MHD_OPTION_UNESCAPE_CALLBACK, keep_raw, NULL, MHD_OPTION_URI_LOG_CALLBACK, uri_log, NULL,
        MHD_OPTION_NOTIFY_COMPLETED, completed, l, MHD_OPTION_NOTIFY_CONNECTION, on_connection, l,
        MHD_OPTION_END);
    if (!l->d) {
        int e = errno ? errno : EADDRINUSE;
        free(l);
        return tv__seterr(err, -e, "cannot listen on %s: %s",
                          unix_sock ? o->socket_path : o->listen, strerror(e));
    }
    *out = l;
    return 0;
}

static void stop_listener(listener *l)
{
    if (!l)
        return;
    if (l->d)
        MHD_stop_daemon(l->d);
    free(l);
}

int tv__http_start(const tv__http_opts *o, tv__api *api, tv__jobs *jobs, tv__http **out,
                   uint16_t *port, tv_error *err)
{
    int rc, ufd = -1;
    if (!o || !o->listen || !api || !out || !o->store_dir)
        return tv__seterr(err, TV_E_INVALID_ARG, "NULL argument");
    *out = NULL;
    struct sockaddr_storage ss;
    if ((rc = parse_listen(o->listen, &ss, err)))
        return rc;
    tv__http *h = calloc(1, sizeof(*h));
    if (!h)
        return tv__seterr(err, -ENOMEM, "out of memory");
    h->api = api;
    h->jobs = jobs;
    h->max_body = o->max_body_bytes ? o->max_body_bytes : (64u << 10);
    h->max_header = o->max_header_bytes ? o->max_header_bytes : (8u << 10);
    h->header_timeout_ms = 1000u * (o->header_timeout_s ? o->header_timeout_s : 10u);
    h->per_ip = o->per_ip_connections ? o->per_ip_connections : 256u;
    h->per_uid = o->per_uid_connections ? o->per_uid_connections : 256u;
    h->identify_loopback = o->identify_loopback;
    pthread_mutex_init(&h->metrics_lock, NULL);
    pthread_mutex_init(&h->conns_mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&h->wd_cond, &ca);
    pthread_condattr_destroy(&ca);
    if ((rc = tv__http_hosts_make(o->allowed_hosts, o->listen, o->extra_hosts, &h->hosts, err)))
        goto fail;
    size_t plen = strlen(o->store_dir) + sizeof("/registry.db");
    if (!(h->registry_path = malloc(plen))) {
        rc = tv__seterr(err, -ENOMEM, "out of memory");
        goto fail;
    }
    snprintf(h->registry_path, plen, "%s/registry.db", o->store_dir);
    if ((rc = pthread_create(&h->wd, NULL, watchdog_main, h))) {
        rc = tv__seterr(err, -rc, "http: starting the watchdog thread: %s", strerror(rc));
        goto fail;
    }
    h->wd_started = true;
    unsigned threads = o->threads;
    if (!threads) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 0 ? (unsigned)n : 1;
    }
    if ((rc = start_listener(h, o, false, -1, &ss, threads, &h->tcp, err)))
        goto fail;
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->tcp->d, MHD_DAEMON_INFO_BIND_PORT);
    h->port = di ? di->port : 0;
    if (o->socket_path && o->socket_path[0]) {
        ufd = tv__unix_listen(o->socket_path, SOCK_STREAM, o->socket_mode ? o->socket_mode : 0660,
                              128, "http", err);
        if (ufd < 0) {
            rc = ufd;
            goto fail;
        }
        if (!(h->socket_path = strdup(o->socket_path))) {
            tv__sys.close(ufd);
            tv__sys.unlink(o->socket_path);
            rc = tv__seterr(err, -ENOMEM, "out of memory");
            goto fail;
        }
        /* libmicrohttpd owns (and closes) the descriptor from here on */
        if ((rc = start_listener(h, o, true, ufd, NULL, threads > 2 ? 2 : threads, &h->unx, err))) {
            tv__sys.close(ufd);
            goto fail;
        }
    }
    if (port)
        *port = h->port;
    *out = h;
    return 0;
fail:
    tv__http_stop(h);
    return rc;
}

void tv__http_quiesce(tv__http *h)
{
    if (h)
        atomic_store(&h->quiesced, true);
}

void tv__http_stop(tv__http *h)
{
    if (!h)
        return;
    /* parked requests are answered (503) and resumed before libmicrohttpd stops */
    pthread_mutex_lock(&h->conns_mu);
    h->stopping = true;
    for (conn_ctx *cc = h->conns; cc; cc = cc->next)
        if (cc->later)
            tv__api_later_expire(cc->later, 0, true);
    pthread_mutex_unlock(&h->conns_mu);
    stop_listener(h->unx);
    stop_listener(h->tcp);
    if (h->socket_path)
        (void)tv__sys.unlink(h->socket_path);
    if (h->wd_started) {
        pthread_mutex_lock(&h->conns_mu);
        h->wd_stop = true;
        pthread_cond_signal(&h->wd_cond);
        pthread_mutex_unlock(&h->conns_mu);
        pthread_join(h->wd, NULL);
    }
    tv__reg_close(h->metrics_reg);
    pthread_cond_destroy(&h->wd_cond);
    pthread_mutex_destroy(&h->conns_mu);
    pthread_mutex_destroy(&h->metrics_lock);
    tv__http_hosts_free(h->hosts);
    free(h->socket_path);
    free(h->registry_path);
    free(h);
}
