/* Byte bodies, the shared answer of the tensor data and blob routes:
 * ETag and If-None-Match, one byte range, and the body read whole into a
 * pooled buffer, read now when small, or streamed by the transport.
 *
 * Invariants:
 *   - one RFC 9110 byte range: "bytes=a-b", "a-", "-n"; several ranges are
 *     answered 200 with the whole body; an unsatisfiable or malformed range
 *     is 416 with Content-Range: bytes * /N; another unit is ignored (200);
 *     If-None-Match (the ETag, W/ allowed, or *) is checked first: 304
 *     (its Content-Length the 200's);
 *   - whole bodies held at once by all requests stay under
 *     TV__API_WHOLE_INFLIGHT bytes (a body that would pass it is streamed),
 *     and the buffers kept for reuse under TV__API_BUF_KEEP;
 *   - a streamed body is read on the transport's thread, one piece of at
 *     most TV__API_STREAM_PIECE at a time, and a failing read ends the
 *     connection, never a short body that looks complete. */
#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "http/api_internal.h"
#include "util/internal.h"

uint64_t tv__api_whole_body_max = TV__API_WHOLE_DEFAULT;

/* A streamed body: its source and where the body starts in it. */
typedef struct bytes_stream {
    void *src;
    tv__api_bytes_read_fn read;
    void (*src_free)(void *src);
    uint64_t begin;
    char what[160];
} bytes_stream;

/* ---- whole-body buffers -------------------------------------------------- */

/* A whole body: its buffer (from the api's pool) and the in-flight bytes
 * it holds. */
typedef struct whole_body {
    tv__api *api;
    void *p;
    size_t cap;
    uint64_t len;
} whole_body;

/* A buffer of at least len bytes: a pooled one (smallest that fits, at most
 * twice len) or a new one rounded up to 2 MiB. NULL: out of memory. */
static void *buf_get(tv__api *api, size_t len, size_t *cap)
{
    void *p = NULL;
    pthread_mutex_lock(&api->pool_mu);
    size_t best = SIZE_MAX;
    for (size_t i = 0; i < api->n_bufs; i++)
        if (api->bufs[i].cap >= len && api->bufs[i].cap / 2 <= len &&
            (best == SIZE_MAX || api->bufs[i].cap < api->bufs[best].cap))
            best = i;
    if (best != SIZE_MAX) {
        p = api->bufs[best].p;
        *cap = api->bufs[best].cap;
        api->bufs_bytes -= *cap;
        api->bufs[best] = api->bufs[--api->n_bufs];
    }
    pthread_mutex_unlock(&api->pool_mu);
    if (p)
        return p;
    uint64_t c;
    if (tv__align_up_u64(len, 2u << 20, &c) || c > SIZE_MAX || posix_memalign(&p, 4096, (size_t)c))
        return NULL;
    *cap = (size_t)c;
    return p;
}

static void buf_put(tv__api *api, void *p, size_t cap)
{
    pthread_mutex_lock(&api->pool_mu);
    if (api->n_bufs < TV__API_BUF_POOL && api->bufs_bytes + cap <= TV__API_BUF_KEEP) {
        api->bufs[api->n_bufs++] = (struct tv__api_buf){p, cap};
        api->bufs_bytes += cap;
        p = NULL;
    }
    pthread_mutex_unlock(&api->pool_mu);
    free(p);
}

void tv__api_bufs_free(tv__api *api)
{
    for (size_t i = 0; i < api->n_bufs; i++)
        free(api->bufs[i].p);
    api->n_bufs = 0;
    api->bufs_bytes = 0;
}

static void release_body(void *owner)
{
    whole_body *w = owner;
    atomic_fetch_sub(&w->api->whole_inflight, w->len);
    buf_put(w->api, w->p, w->cap);
    free(w);
}

/* Reserves len bytes of the whole-body budget. false: over it (stream). */
static bool whole_reserve(tv__api *api, uint64_t len)
{
    uint64_t before = atomic_fetch_add(&api->whole_inflight, len);
    if (before + len <= TV__API_WHOLE_INFLIGHT)
        return true;
    atomic_fetch_sub(&api->whole_inflight, len);
    return false;
}

/* ---- Range and If-None-Match --------------------------------------------- */

/* Parses a decimal number; saturates at UINT64_MAX. false: not digits. */
static bool num(const char **p, uint64_t *v)
{
    const char *s = *p;
    uint64_t x = 0;
    if (*s < '0' || *s > '9')
        return false;
    for (; *s >= '0' && *s <= '9'; s++)
        x = x > (UINT64_MAX - 9) / 10 ? UINT64_MAX : x * 10 + (uint64_t)(*s - '0');
    *v = x;
    *p = s;
    return true;
}

enum range_kind { RANGE_NONE, RANGE_ONE, RANGE_BAD };

/* One range of "bytes=..." against a body of n bytes -> [*first, *first + *len). */
static enum range_kind parse_range(const char *h, uint64_t n, uint64_t *first, uint64_t *len)
{
    if (!h)
        return RANGE_NONE;
    while (*h == ' ' || *h == '\t')
        h++;
    if (strncasecmp(h, "bytes", 5))
        return RANGE_NONE; /* another unit: ignored */
    const char *p = h + 5;
    while (*p == ' ' || *p == '\t')
        p++;
    if (*p != '=')
        return RANGE_NONE;
    p++;
    if (strchr(p, ','))
        return RANGE_NONE; /* several ranges: the whole body */
    while (*p == ' ' || *p == '\t')
        p++;
    uint64_t a = 0, b = 0;
    if (*p == '-') {
        p++;
        if (!num(&p, &b))
            return RANGE_BAD;
        while (*p == ' ' || *p == '\t')
            p++;
        if (*p || b == 0 || n == 0)
            return RANGE_BAD;
        if (b > n)
            b = n;
        *first = n - b;
        *len = b;
        return RANGE_ONE;
    }
    if (!num(&p, &a) || *p != '-')
        return RANGE_BAD;
    p++;
    bool has_b = num(&p, &b);
    while (*p == ' ' || *p == '\t')
        p++;
    if (*p || a >= n || (has_b && b < a))
        return RANGE_BAD;
    uint64_t last = has_b && b < n - 1 ? b : n - 1;
    *first = a;
    *len = last - a + 1;
    return RANGE_ONE;
}

/* If-None-Match: a list of entity tags or "*"; weak comparison. */
static bool inm_matches(const char *h, const char *etag)
{
    if (!h)
        return false;
    size_t el = strlen(etag);
    const char *p = h;
    while (*p) {
        while (*p == ' ' || *p == '\t' || *p == ',')
            p++;
        if (*p == '*')
            return true;
        if (!strncmp(p, "W/", 2))
            p += 2;
        if (*p != '"')
            return false;
        const char *e = strchr(p + 1, '"');
        if (!e)
            return false;
        if ((size_t)(e + 1 - p) == el && !memcmp(p, etag, el))
            return true;
        p = e + 1;
    }
    return false;
}

/* ---- the body ------------------------------------------------------------ */

static void stream_release(void *state)
{
    bytes_stream *s = state;
    if (!s)
        return;
    if (s->src_free)
        s->src_free(s->src);
    free(s);
}

int tv__api_bytes_reply(tv__api_ctx *c, const char *etag, uint64_t n, void *src,
                        tv__api_bytes_read_fn read_fn, void (*src_free)(void *src),
                        const char *what)
{
    tv__api_resp *r = c->resp;
    int rc = 0;
    tv__api_header(r, "ETag", "%s", etag);
    tv__api_header(r, "Accept-Ranges", "bytes");
    uint64_t first = 0, len = n;
    if (inm_matches(c->req->if_none_match, etag)) {
        /* A stream of the 200's length, never read: MHD sends no body with
         * a 304 but its Content-Length, which must be the 200's (RFC 9110
         * 8.6), not 0. */
        r->status = 304;
        goto stream;
    }
    enum range_kind rk = parse_range(c->req->range, n, &first, &len);
    if (rk == RANGE_BAD) {
        tv__api_header(r, "Content-Range", "bytes */%" PRIu64, n);
        rc = tv__seterr(&c->err, TV_E_RANGE,
                        "Range '%.80s' is not satisfiable for %s of %" PRIu64 " bytes",
                        c->req->range, what, n);
        goto out;
    }
    if (rk == RANGE_ONE)
        tv__api_header(r, "Content-Range", "bytes %" PRIu64 "-%" PRIu64 "/%" PRIu64, first,
                       first + len - 1, n);
    r->status = rk == RANGE_ONE ? 206 : 200;
    r->content_type = "application/octet-stream";
    /* HEAD: the transport sends no body, so a stream (its length only)
     * reads nothing from the devices. */
    bool head = c->req->method && !strcmp(c->req->method, "HEAD");
    if (!head && len <= tv__api_whole_body_max && len > 0 && len == n &&
        whole_reserve(c->api, len)) {
        whole_body *w = malloc(sizeof *w);
        void *p = w ? buf_get(c->api, (size_t)len, &w->cap) : NULL;
        if (!p) {
            free(w);
            atomic_fetch_sub(&c->api->whole_inflight, len);
            rc = tv__seterr(&c->err, -ENOMEM, "out of memory for %" PRIu64 " bytes of %s", len,
                            what);
            goto out;
        }
        w->api = c->api;
        w->p = p;
        w->len = len;
        if ((rc = read_fn(src, 0, len, p, &c->err))) {
            release_body(w);
            goto out;
        }
        r->body = p;
        r->body_len = len;
        r->body_release = release_body;
        r->body_owner = w;
        goto out;
    }
    if (!head && len <= tv__api_whole_body_max && len < TV__API_STREAM_PIECE) {
        uint8_t *b = malloc(len ? len : 1);
        if (!b) {
            rc = tv__seterr(&c->err, -ENOMEM, "out of memory for %" PRIu64 " bytes of %s", len,
                            what);
            goto out;
        }
        if ((rc = read_fn(src, first, len, b, &c->err))) {
            free(b);
            goto out;
        }
        r->body = (char *)b;
        r->body_len = len;
        goto out;
    }
stream:;
    bytes_stream *s = malloc(sizeof *s);
    if (!s) {
        rc = tv__seterr(&c->err, -ENOMEM, "out of memory");
        goto out;
    }
    *s = (bytes_stream){.src = src, .read = read_fn, .src_free = src_free, .begin = first};
    snprintf(s->what, sizeof s->what, "%s", what);
    src = NULL; /* the stream owns it now */
    r->stream = true;
    r->stream_len = len;
    r->stream_state = s;
    r->stream_release = stream_release;
out:
    if (src && src_free)
        src_free(src);
    return rc;
}

ssize_t tv__api_stream_read(tv__api_resp *resp, uint64_t pos, void *buf, size_t max)
{
    if (!resp || !resp->stream || !resp->stream_state || !buf)
        return TV_E_INVALID_ARG;
    if (pos >= resp->stream_len || max == 0)
        return 0;
    bytes_stream *s = resp->stream_state;
    uint64_t n = resp->stream_len - pos;
    if (n > max)
        n = max;
    if (n > TV__API_STREAM_PIECE)
        n = TV__API_STREAM_PIECE;
    tv_error err = {0};
    int rc = s->read(s->src, s->begin + pos, n, buf, &err);
    if (rc) {
        tv__log(TV_LOG_WARN, "%s: streaming at %" PRIu64 ": %s", s->what, s->begin + pos, err.msg);
        return rc;
    }
    return (ssize_t)n;
}
