/* Uploads to an S3-compatible object store from an HTTP(S) source
 * (s3put.h).
 *
 * One copy is a series of transfers run on one curl multi handle (whose
 * connection cache keeps the source's and the store's connections alive):
 *   len <= part_len: the source is read whole (one Range GET) into one
 *     buffer, hashed, checked against sha256, then PUT once;
 *   else: CreateMultipartUpload (POST ?uploads=), then batches of
 *     `parallel` parts: their Range GETs at once, the bytes hashed in
 *     order, their UploadParts (PUT ?partNumber=N&uploadId=ID) at once;
 *     after the last part the whole hash is checked, and only then
 *     CompleteMultipartUpload (POST ?uploadId=ID, the XML of every ETag).
 *     Any failure after Create sends AbortMultipartUpload (DELETE
 *     ?uploadId=ID), so no parts are left behind.
 * So at most parallel x part_len bytes are buffered, and a source whose
 * bytes are not the expected ones never becomes an object.
 *
 * Every request is tried again, opts.retries times after 100 ms, 200 ms,
 * 400 ms ... (at most 6.4 s), on a connection error, a timeout, a 5xx, 408
 * or 429, or a short body (the failed requests of a batch together); any
 * other status fails at once naming the URL and the status. Redirects are
 * not followed. Every request hears opts.cancel within a second, a stalled
 * one too (httpc/httpc.h: tv__http_cancel), and ends with TV_E_CANCELLED.
 *
 * Source reads are checked as the importer's (src_http.c): 206 with a
 * Content-Range of exactly the range asked and total len (a 200 only for a
 * read of the whole source), a body of exactly that length, and the ETag
 * the first answer carried on every later one (a strong ETag is also sent
 * as If-Match). Another length or ETag, 404, 410 or 412 is
 * TV_E_SOURCE_CHANGED.
 *
 * Store requests are path-style (tv__s3_object_url), signed by libcurl
 * (CURLOPT_AWS_SIGV4 "aws:amz:REGION:s3"; unsigned without a key pair),
 * with x-amz-content-sha256 (the SHA-256 of the body: libcurl 7.88 does not
 * add it), x-amz-security-token with a session token, and bodies sent as
 * uploads (CURLOPT_UPLOAD, Content-Length from CURLOPT_INFILESIZE_LARGE).
 * libcurl 7.88 signs the query string as given, so queries are written in
 * SigV4's canonical form (names sorted, values percent-encoded, "uploads=").
 * The secret is never logged nor put in a message. */
#include "fleet/s3put.h"

#include <curl/curl.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "httpc/httpc.h"
#include "httpc/url.h"
#include "util/hex.h"
#include "util/internal.h"
#include "util/sha256.h"

#define BODY_MAX  (64u << 10) /* bytes of a store's answer kept (XML) */
#define ETAG_MAX  256
#define UPLOAD_ID 1024

typedef struct ctx {
    tv__s3put_opts o; /* defaults filled in */
    char sigv4[128];
    char what[900]; /* "endpoint 'E' bucket 'B' key 'K'" */
    char obj_url[TV__URL_MAX + 1];
    char *token_hdr;
    bool sign;
    /* the source */
    const char *src_url;
    char *bearer_hdr;
    uint64_t len;
    char src_etag[ETAG_MAX]; /* from the first answer; "" = none yet or none sent */
    bool src_seen;
    /* multipart */
    char upload_id_q[3 * UPLOAD_ID + 1]; /* percent-encoded */
    CURLM *m;
} ctx;

/* One request, tried as often as the options allow. */
typedef struct xfer {
    /* set by the caller */
    bool src;           /* a Range GET of the source, else a store request */
    const char *method; /* store: HEAD, PUT, POST or DELETE */
    char url[TV__URL_MAX + 3 * UPLOAD_ID + 64];
    uint8_t *buf; /* GET: receives len bytes; PUT/POST: the body */
    size_t len;
    uint64_t off;         /* GET: where in the source */
    char payload_sha[65]; /* store: x-amz-content-sha256 */
    bool ok404;           /* HEAD: 404 is an answer */
    /* per try */
    CURL *c;
    struct curl_slist *hdrs;
    size_t pos;
    bool overflow;
    char *body; /* a store's answer, NUL-terminated */
    size_t body_len;
    char etag[ETAG_MAX], crange[128], im[ETAG_MAX + 16];
    CURLcode cc;
    long status;
    curl_off_t clen; /* the answer's Content-Length, -1 = none */
    bool pending, retry;
    int rc;
    tv_error err;
    char errbuf[CURL_ERROR_SIZE], range[64];
} xfer;

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc = CURLE_FAILED_INIT;

static void curl_init(void)
{
    curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

/* ---- callbacks ---- */

static size_t on_body(char *p, size_t sz, size_t n, void *arg)
{
    xfer *x = arg;
    size_t len = sz * n;
    if (x->src) {
        if (len > x->len - x->pos) {
            x->overflow = true;
            return 0; /* CURLE_WRITE_ERROR */
        }
        memcpy(x->buf + x->pos, p, len);
        x->pos += len;
        return len;
    }
    size_t keep = len < BODY_MAX - x->body_len ? len : BODY_MAX - x->body_len;
    if (keep) {
        char *nb = realloc(x->body, x->body_len + keep + 1);
        if (!nb)
            return 0;
        memcpy(nb + x->body_len, p, keep);
        x->body = nb;
        x->body_len += keep;
        nb[x->body_len] = '\0';
    }
    return len;
}

static size_t on_read(char *p, size_t sz, size_t n, void *arg)
{
    xfer *x = arg;
    size_t want = sz * n, left = x->len - x->pos;
    if (want > left)
        want = left;
    if (want)
        memcpy(p, x->buf + x->pos, want);
    x->pos += want;
    return want;
}

static int on_seek(void *arg, curl_off_t off, int origin)
{
    xfer *x = arg;
    if (origin != SEEK_SET || off < 0 || (uint64_t)off > x->len)
        return CURL_SEEKFUNC_CANTSEEK;
    x->pos = (size_t)off;
    return CURL_SEEKFUNC_OK;
}

static size_t on_header(char *p, size_t sz, size_t n, void *arg)
{
    xfer *x = arg;
    size_t len = sz * n;
    if (len >= 5 && strncmp(p, "HTTP/", 5) == 0) /* a 100 Continue before the answer */
        x->etag[0] = x->crange[0] = '\0';
    tv__http_header_value(p, len, "ETag", x->etag, sizeof(x->etag));
    tv__http_header_value(p, len, "Content-Range", x->crange, sizeof(x->crange));
    return len;
}

/* ---- one try ---- */

static int add_hdr(struct curl_slist **l, const char *h)
{
    struct curl_slist *n = curl_slist_append(*l, h);
    if (!n)
        return -1;
    *l = n;
    return 0;
}

static void x_release(xfer *x)
{
    curl_slist_free_all(x->hdrs);
    x->hdrs = NULL;
    if (x->c)
        curl_easy_cleanup(x->c);
    x->c = NULL;
}

static int x_begin(ctx *k, xfer *x, tv_error *err)
{
    char h[128];
    long t = (long)k->o.timeout_s;
    x->pos = 0;
    x->overflow = false;
    free(x->body);
    x->body = NULL;
    x->body_len = 0;
    x->etag[0] = x->crange[0] = '\0';
    x->cc = CURLE_RECV_ERROR;
    x->status = 0;
    x->retry = false;
    x->hdrs = NULL;
    if (!(x->c = curl_easy_init()))
        return tv__seterr(err, -ENOMEM, "libcurl: no handle");
    CURL *c = x->c;
    tv__http_setup(c, x->url, t, "tensorvault-fleet", k->o.proxy, on_header, on_body, x, x->errbuf,
                   &k->o.cancel);
    if (x->src) {
        snprintf(x->range, sizeof(x->range), "%llu-%llu", (unsigned long long)x->off,
                 (unsigned long long)(x->off + x->len - 1));
        curl_easy_setopt(c, CURLOPT_RANGE, x->range);
        if (k->bearer_hdr && add_hdr(&x->hdrs, k->bearer_hdr))
            goto nomem;
        if (k->src_etag[0] == '"') { /* strong: an origin that checks it answers 412 */
            snprintf(x->im, sizeof(x->im), "If-Match: %s", k->src_etag);
            if (add_hdr(&x->hdrs, x->im))
                goto nomem;
        }
    } else {
        if (k->sign)
            tv__http_sigv4(c, k->sigv4, k->o.s3.access_key_id, k->o.s3.secret_access_key);
        snprintf(h, sizeof(h), "x-amz-content-sha256: %s", x->payload_sha);
        if (add_hdr(&x->hdrs, h) || (k->token_hdr && add_hdr(&x->hdrs, k->token_hdr)))
            goto nomem;
        if (strcmp(x->method, "HEAD") == 0) {
            curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
        } else if (strcmp(x->method, "DELETE") == 0) {
            curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, "DELETE");
        } else {
            curl_easy_setopt(c, CURLOPT_UPLOAD, 1L);
            curl_easy_setopt(c, CURLOPT_READFUNCTION, on_read);
            curl_easy_setopt(c, CURLOPT_READDATA, x);
            curl_easy_setopt(c, CURLOPT_SEEKFUNCTION, on_seek);
            curl_easy_setopt(c, CURLOPT_SEEKDATA, x);
            curl_easy_setopt(c, CURLOPT_INFILESIZE_LARGE, (curl_off_t)x->len);
            if (strcmp(x->method, "PUT") != 0)
                curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, x->method);
            if (strcmp(x->method, "POST") == 0 &&
                add_hdr(&x->hdrs, "Content-Type: application/xml"))
                goto nomem;
        }
    }
    if (x->hdrs)
        curl_easy_setopt(c, CURLOPT_HTTPHEADER, x->hdrs);
    return 0;
nomem:
    x_release(x);
    return tv__seterr(err, -ENOMEM, "out of memory");
}

static bool retryable_status(long st)
{
    return st >= 500 || st == 429 || st == 408;
}

static int curl_code(CURLcode cc)
{
    switch (cc) {
    case CURLE_COULDNT_CONNECT:
        return -ECONNREFUSED;
    case CURLE_OPERATION_TIMEDOUT:
        return -ETIMEDOUT;
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
        return -EHOSTUNREACH;
    default:
        return -EIO;
    }
}

/* The text of <tag>...</tag> in body into out ("" when absent). */
static void xml_text(const char *body, const char *tag, char *out, size_t out_len)
{
    char open[64], close[64];
    out[0] = '\0';
    if (!body)
        return;
    snprintf(open, sizeof(open), "<%s>", tag);
    snprintf(close, sizeof(close), "</%s>", tag);
    const char *a = strstr(body, open);
    const char *b = a ? strstr(a, close) : NULL;
    if (!a || !b)
        return;
    a += strlen(open);
    snprintf(out, out_len, "%.*s", (int)(b - a), a);
}

static int judge_src(ctx *k, xfer *x, tv_error *err)
{
    uint64_t first, last, total;
    long st = x->status;
    if (st != 206 && st != 200) {
        x->retry = retryable_status(st);
        if (x->retry)
            return tv__seterr(err, -EIO, "GET %s bytes %s: the source answered %ld", x->url,
                              x->range, st);
        if (st == 401 || st == 403)
            return tv__seterr(err, TV_E_FORBIDDEN,
                              "GET %s bytes %s: the source answered %ld (check the source's token)",
                              x->url, x->range, st);
        if (st == 404 || st == 410 || st == 412)
            return tv__seterr(err, TV_E_SOURCE_CHANGED,
                              "GET %s bytes %s: the source answered %ld: it changed or went away",
                              x->url, x->range, st);
        return tv__seterr(err, -EIO, "GET %s bytes %s: the source answered %ld", x->url, x->range,
                          st);
    }
    if (k->src_seen && strcmp(k->src_etag, x->etag) != 0)
        return tv__seterr(err, TV_E_SOURCE_CHANGED,
                          "GET %s bytes %s: the source changed during the upload: ETag %s (was %s)",
                          x->url, x->range, x->etag[0] ? x->etag : "(none)",
                          k->src_etag[0] ? k->src_etag : "(none)");
    if (st == 200 && (x->off != 0 || x->len != k->len))
        return tv__seterr(
            err, -EPROTO,
            "GET %s bytes %s: the source answered 200 (the whole file) to a Range request; it must answer 206",
            x->url, x->range);
    if (st == 206 && tv__content_range_parse(x->crange, &first, &last, &total))
        return tv__seterr(err, -EPROTO,
                          "GET %s bytes %s: 206 with Content-Range '%s', not bytes A-B/LENGTH",
                          x->url, x->range, x->crange);
    if (st == 206 && total != k->len)
        return tv__seterr(
            err, TV_E_SOURCE_CHANGED,
            "GET %s bytes %s: the source is %llu bytes long, not %llu (Content-Range '%s')", x->url,
            x->range, (unsigned long long)total, (unsigned long long)k->len, x->crange);
    if (st == 206 && (first != x->off || last != x->off + x->len - 1))
        return tv__seterr(err, -EPROTO, "GET %s bytes %s: the source answered Content-Range '%s'",
                          x->url, x->range, x->crange);
    if (x->pos != x->len) {
        x->retry = true;
        return tv__seterr(err, -EIO, "GET %s bytes %s: a short body (%zu of %zu bytes)", x->url,
                          x->range, x->pos, x->len);
    }
    if (!k->src_seen) {
        k->src_seen = true;
        snprintf(k->src_etag, sizeof(k->src_etag), "%s", x->etag);
    }
    return 0;
}

static int judge_store(ctx *k, xfer *x, tv_error *err)
{
    char code[128];
    long st = x->status;
    xml_text(x->body, "Code", code, sizeof(code));
    if (st == 404 && x->ok404)
        return 0;
    if (st == 401 || st == 403)
        return tv__seterr(
            err, TV_E_FORBIDDEN,
            "%s %s: the object store answered %ld%s%s: access to %s is refused (check s3.access_key_id / s3.secret_access_key, their region and the bucket's policy)",
            x->method, x->url, st, code[0] ? " " : "", code, k->what);
    if (st / 100 != 2) {
        x->retry = retryable_status(st);
        return tv__seterr(err, -EIO, "%s %s: the object store answered %ld%s%s", x->method, x->url,
                          st, code[0] ? " " : "", code);
    }
    /* CompleteMultipartUpload may answer 200 and an error in the body. */
    if (x->body && strstr(x->body, "<Error>")) {
        x->retry = true;
        return tv__seterr(err, -EIO, "%s %s: the object store answered %ld with the error %s",
                          x->method, x->url, st, code[0] ? code : "(no code)");
    }
    return 0;
}

static int x_end(ctx *k, xfer *x, tv_error *err)
{
    int rc;
    curl_easy_getinfo(x->c, CURLINFO_RESPONSE_CODE, &x->status);
    x->clen = -1;
    curl_easy_getinfo(x->c, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &x->clen);
    const char *m = x->src ? "GET" : x->method;
    if (tv__http_was_cancelled(x->cc, &k->o.cancel)) {
        rc = tv__seterr(err, TV_E_CANCELLED, "%s %s: cancelled", m, x->url);
    } else if (x->cc != CURLE_OK && x->overflow) {
        rc = tv__seterr(err, -EPROTO,
                        "GET %s bytes %s: the source sent more than the %zu bytes asked", x->url,
                        x->range, x->len);
    } else if (x->cc != CURLE_OK) {
        x->retry = true;
        rc = tv__seterr(err, curl_code(x->cc), "%s %s: %s", m, x->url,
                        x->errbuf[0] ? x->errbuf : curl_easy_strerror(x->cc));
    } else {
        rc = x->src ? judge_src(k, x, err) : judge_store(k, x, err);
    }
    x_release(x);
    return rc;
}

/* Runs the n transfers of x at once on k's multi handle, each tried again
 * (all those that failed, together, after the backoff) as the options
 * allow. Returns 0 when every one succeeded; else the first failure no
 * retry mends (or a retryable one's, after the last round). */
static int run(ctx *k, xfer *x, size_t n, tv_error *err)
{
    int rc = 0;
    for (size_t i = 0; i < n; i++)
        x[i].pending = true;
    for (unsigned round = 0;; round++) {
        size_t started = 0;
        for (size_t i = 0; i < n && !rc; i++) {
            if (!x[i].pending)
                continue;
            if (!(rc = x_begin(k, &x[i], err)) && curl_multi_add_handle(k->m, x[i].c) != CURLM_OK) {
                x_release(&x[i]);
                rc = tv__seterr(err, -ENOMEM, "libcurl: cannot add a transfer");
            }
            started += !rc;
        }
        int running = 1;
        while (!rc && running) {
            CURLMcode mc = curl_multi_perform(k->m, &running);
            if (mc == CURLM_OK && running)
                mc = curl_multi_poll(k->m, NULL, 0, TV__HTTP_POLL_MS, NULL);
            if (mc != CURLM_OK)
                rc = tv__seterr(err, -EIO, "libcurl: %s", curl_multi_strerror(mc));
            else if (running && tv__http_cancelled(&k->o.cancel))
                rc = tv__seterr(err, TV_E_CANCELLED, "%s %s: cancelled",
                                x[0].src ? "GET" : x[0].method, x[0].url);
        }
        CURLMsg *msg;
        int left;
        while ((msg = curl_multi_info_read(k->m, &left)))
            for (size_t i = 0; msg->msg == CURLMSG_DONE && i < n; i++)
                if (x[i].pending && x[i].c == msg->easy_handle)
                    x[i].cc = msg->data.result;
        int fatal = 0, retry_rc = 0;
        tv_error retry_err = {0};
        for (size_t i = 0; i < n && started; i++) {
            if (!x[i].pending || !x[i].c)
                continue;
            curl_multi_remove_handle(k->m, x[i].c);
            x[i].err = (tv_error){0};
            x[i].rc = x_end(k, &x[i], &x[i].err);
            if (!x[i].rc) {
                x[i].pending = false;
            } else if (!x[i].retry && !fatal) {
                fatal = x[i].rc;
                if (err)
                    *err = x[i].err;
            } else if (x[i].retry && !retry_rc) {
                retry_rc = x[i].rc;
                retry_err = x[i].err;
            }
        }
        for (size_t i = 0; i < n && rc; i++) /* a setup failure: drop what was started */
            if (x[i].c) {
                curl_multi_remove_handle(k->m, x[i].c);
                x_release(&x[i]);
            }
        if (rc || (rc = fatal) || !(rc = retry_rc))
            break;
        if (err)
            *err = retry_err;
        if (round >= k->o.retries) {
            tv__seterr(err, rc, "%s (after %u tries)", retry_err.msg, k->o.retries + 1);
            break;
        }
        tv__log(TV_LOG_WARN, "s3 upload: %s; trying again (%u of %u)", retry_err.msg, round + 1,
                k->o.retries);
        if (tv__http_backoff(round, &k->o.cancel)) {
            rc = tv__seterr(err, TV_E_CANCELLED, "s3 upload: cancelled before try %u of %s",
                            round + 2, k->what);
            break;
        }
        rc = 0;
    }
    return rc;
}

static void x_free(xfer *x, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        x_release(&x[i]);
        free(x[i].body);
        x[i].body = NULL;
    }
}

/* ---- setup ---- */

static void sha_hex(const void *p, size_t len, char out[65])
{
    tv__sha256 h;
    uint8_t d[32];
    if (tv__sha256_init(&h)) {
        snprintf(out, 65, "UNSIGNED-PAYLOAD");
        return;
    }
    tv__sha256_update(&h, p, len);
    tv__sha256_final(&h, d);
    tv__hex_encode(d, 32, false, out);
}

/* Percent-encodes s as SigV4 canonical query values are (every byte outside
 * A-Za-z0-9-_.~ as %XX). */
static void query_escape(const char *s, char *out, size_t out_len)
{
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p && o + 4 <= out_len; p++) {
        if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
            strchr("-_.~", *p))
            out[o++] = (char)*p;
        else
            o += (size_t)snprintf(out + o, out_len - o, "%%%02X", *p);
    }
    out[o] = '\0';
}

static void ctx_free(ctx *k)
{
    if (k->m)
        curl_multi_cleanup(k->m);
    free(k->token_hdr);
    free(k->bearer_hdr);
}

static int ctx_init(ctx *k, const tv__s3put_opts *o, const char *s3_url, tv_error *err)
{
    tv__url u;
    int rc;
    memset(k, 0, sizeof(*k));
    if (!o || !s3_url)
        return tv__seterr(err, TV_E_INVALID_ARG, "s3 upload: no options or no s3:// URL");
    k->o = *o;
    if (!k->o.part_len)
        k->o.part_len = TV__S3PUT_DEFAULT_PART;
    if (!k->o.retries)
        k->o.retries = TV__S3PUT_DEFAULT_RETRIES;
    if (!k->o.timeout_s)
        k->o.timeout_s = TV__S3PUT_DEFAULT_TIMEOUT;
    if (!k->o.parallel)
        k->o.parallel = TV__S3PUT_DEFAULT_PARALLEL;
    if (k->o.part_len < TV__S3PUT_MIN_PART || k->o.part_len > SIZE_MAX / TV__S3PUT_MAX_PARALLEL)
        return tv__seterr(
            err, TV_E_INVALID_ARG,
            "s3 upload: part size %llu bytes is below S3's minimum of %llu (5 MiB) or too large",
            (unsigned long long)k->o.part_len, (unsigned long long)TV__S3PUT_MIN_PART);
    if (k->o.parallel > TV__S3PUT_MAX_PARALLEL)
        return tv__seterr(err, TV_E_INVALID_ARG, "s3 upload: %u parts in flight (at most %u)",
                          k->o.parallel, TV__S3PUT_MAX_PARALLEL);
    if ((rc = tv__url_parse(s3_url, &u, err)))
        return rc;
    if (!u.s3)
        return tv__seterr(err, TV_E_INVALID_ARG,
                          "s3 upload: '%.300s' is not an s3://BUCKET/KEY URL", s3_url);
    if (strlen(u.path) < 2)
        return tv__seterr(err, TV_E_INVALID_ARG, "s3 upload: '%.300s' names no key", s3_url);
    const char *ep = k->o.s3.endpoint, *region = k->o.s3.region;
    if (!region || !*region)
        region = TV__S3_DEFAULT_REGION;
    if ((rc = tv__s3_object_url(ep, region, &u, k->obj_url, sizeof(k->obj_url), err)))
        return rc;
    snprintf(k->sigv4, sizeof(k->sigv4), "aws:amz:%.64s:s3", region);
    if (ep && *ep)
        snprintf(k->what, sizeof(k->what), "endpoint '%.200s' bucket '%s' key '%.300s'", ep, u.host,
                 u.path + 1);
    else
        snprintf(k->what, sizeof(k->what),
                 "endpoint 'https://s3.%.64s.amazonaws.com' bucket '%s' key '%.300s'", region,
                 u.host, u.path + 1);
    k->sign = k->o.s3.access_key_id && *k->o.s3.access_key_id;
    if (k->o.s3.session_token && *k->o.s3.session_token &&
        asprintf(&k->token_hdr, "x-amz-security-token: %s", k->o.s3.session_token) < 0) {
        k->token_hdr = NULL;
        return tv__seterr(err, -ENOMEM, "out of memory");
    }
    pthread_once(&curl_once, curl_init);
    if (curl_init_rc != CURLE_OK)
        return tv__seterr(err, TV_E_INTERNAL, "libcurl does not initialise");
    if (!(k->m = curl_multi_init()))
        return tv__seterr(err, -ENOMEM, "libcurl: no multi handle");
    return 0;
}

/* A store request with no body (or body[0, len)) on the object URL plus
 * query (canonical form, "" for none). */
static void store_req(ctx *k, xfer *x, const char *method, const char *query, uint8_t *body,
                      size_t len)
{
    memset(x, 0, sizeof(*x));
    x->method = method;
    snprintf(x->url, sizeof(x->url), "%s%s", k->obj_url, query);
    x->buf = body;
    x->len = len;
    sha_hex(body ? (const void *)body : "", len, x->payload_sha);
}

int tv__s3_head(const tv__s3put_opts *o, const char *s3_url, bool *exists, uint64_t *len,
                tv_error *err)
{
    ctx k;
    xfer x;
    int rc;
    *exists = false;
    *len = 0;
    if ((rc = ctx_init(&k, o, s3_url, err)))
        goto fail_ctx;
    store_req(&k, &x, "HEAD", "", NULL, 0);
    x.ok404 = true;
    if ((rc = run(&k, &x, 1, err)))
        goto fail_x;
    if (x.status == 200 && x.clen < 0) {
        rc = tv__seterr(err, -EPROTO, "HEAD %s: the object store sent no Content-Length", x.url);
    } else if (x.status == 200) {
        *exists = true;
        *len = (uint64_t)x.clen;
    }
fail_x:
    x_free(&x, 1);
fail_ctx:
    ctx_free(&k);
    return rc;
}

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The cancel of the abort after a cancelled copy: its deadline passed. */
static bool past(void *deadline)
{
    return mono_s() > *(const double *)deadline;
}

#define ABORT_AFTER_CANCEL_S 1.0

/* AbortMultipartUpload: after a failure, so that no parts are left. Its own
 * failure is logged (the copy's error stays the one reported). After a
 * cancel it is one try of at most ABORT_AFTER_CANCEL_S, so that a stop
 * stays bounded (parts it could not delete are the bucket's lifecycle
 * rule's to expire). */
static void abort_upload(ctx *k, bool cancelled)
{
    xfer x;
    tv_error e = {0};
    char q[sizeof(k->upload_id_q) + 16];
    double deadline = mono_s() + ABORT_AFTER_CANCEL_S;
    if (cancelled) {
        k->o.cancel = (tv__http_cancel){.cancelled = past, .ctx = &deadline};
        k->o.retries = 0;
    }
    snprintf(q, sizeof(q), "?uploadId=%s", k->upload_id_q);
    store_req(k, &x, "DELETE", q, NULL, 0);
    if (run(k, &x, 1, &e))
        tv__log(TV_LOG_WARN, "s3 upload: AbortMultipartUpload of %s failed: %s", k->what, e.msg);
    x_free(&x, 1);
}

static void src_req(ctx *k, xfer *x, uint8_t *buf, size_t len, uint64_t off)
{
    memset(x, 0, sizeof(*x));
    x->src = true;
    snprintf(x->url, sizeof(x->url), "%s", k->src_url);
    x->buf = buf;
    x->len = len;
    x->off = off;
}

/* The CompleteMultipartUpload body for n parts. */
static char *complete_xml(char (*etags)[ETAG_MAX], uint64_t n)
{
    size_t cap = 128 + (size_t)n * (64 + 5 * ETAG_MAX), o = 0;
    char *s = malloc(cap);
    if (!s)
        return NULL;
    o += (size_t)snprintf(
        s + o, cap - o,
        "<CompleteMultipartUpload xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">");
    for (uint64_t i = 0; i < n; i++) {
        o += (size_t)snprintf(s + o, cap - o, "<Part><PartNumber>%llu</PartNumber><ETag>",
                              (unsigned long long)i + 1);
        for (const char *p = etags[i]; *p; p++)
            o += (size_t)snprintf(s + o, cap - o, "%s",
                                  *p == '&'   ? "&amp;"
                                  : *p == '<' ? "&lt;"
                                  : *p == '>' ? "&gt;"
                                              : (char[2]){*p, '\0'});
        o += (size_t)snprintf(s + o, cap - o, "</ETag></Part>");
    }
    snprintf(s + o, cap - o, "</CompleteMultipartUpload>");
    return s;
}

/* One copy (tv__s3_copy_from_url): its requests' context, the buffers and
 * transfers of a batch of parts, the parts' ETags and the hash of the
 * source's bytes so far. */
typedef struct copy {
    ctx k;
    const char *src_url;
    uint64_t len, part, nparts;
    size_t nbuf; /* buffers and transfers: parts in flight at once */
    uint8_t **bufs;
    xfer *xs;
    char (*etags)[ETAG_MAX];
    tv__sha256 whole;
    bool created; /* a multipart upload exists: complete it, or abort it */
} copy;

/* The options, URLs and digest checked (want: the digest, *check: one was
 * given), the parts counted, the buffers allocated. */
static int copy_prepare(copy *cp, const tv__s3put_opts *o, const char *src_url,
                        const char *src_bearer, const char *sha256, const char *s3_url,
                        uint8_t want[32], bool *check, tv_error *err)
{
    ctx *k = &cp->k;
    tv__url su;
    int rc;
    if ((rc = ctx_init(k, o, s3_url, err)))
        return rc;
    if (sha256 && *sha256) {
        if (strlen(sha256) != 64 || tv__hex_decode(sha256, 64, want, 32))
            return tv__seterr(err, TV_E_INVALID_ARG,
                              "s3 upload: '%.80s' is not a SHA-256 (64 hex digits)", sha256);
        *check = true;
    }
    if (!src_url || (rc = tv__url_parse(src_url, &su, err)) || su.s3) {
        if (!rc)
            rc = tv__seterr(err, TV_E_INVALID_ARG,
                            "s3 upload: the source must be an http(s) URL, not '%.300s'",
                            src_url ? src_url : "(null)");
        return rc;
    }
    k->src_url = src_url;
    k->len = cp->len;
    if (src_bearer && *src_bearer &&
        asprintf(&k->bearer_hdr, "Authorization: Bearer %s", src_bearer) < 0) {
        k->bearer_hdr = NULL;
        return tv__seterr(err, -ENOMEM, "out of memory");
    }
    uint64_t len = cp->len, part = cp->part = k->o.part_len;
    cp->nparts = len <= part ? 1 : len / part + (len % part != 0);
    if (cp->nparts > TV__S3PUT_MAX_PARTS)
        return tv__seterr(
            err, TV_E_INVALID_ARG,
            "s3 upload: %llu bytes in parts of %llu make %llu parts (S3 allows %u): raise the part size",
            (unsigned long long)len, (unsigned long long)part, (unsigned long long)cp->nparts,
            TV__S3PUT_MAX_PARTS);
    cp->nbuf = cp->nparts < k->o.parallel ? (size_t)cp->nparts : k->o.parallel;
    size_t blen = (size_t)(len < part ? len : part);
    if (!(cp->bufs = calloc(cp->nbuf, sizeof(*cp->bufs))) ||
        !(cp->xs = calloc(cp->nbuf, sizeof(*cp->xs))))
        return tv__seterr(err, -ENOMEM, "out of memory");
    for (size_t i = 0; i < cp->nbuf; i++)
        if (!(cp->bufs[i] = malloc(blen ? blen : 1)))
            return tv__seterr(err, -ENOMEM, "out of memory (%zu parts of %zu bytes)", cp->nbuf,
                              blen);
    if (tv__sha256_init(&cp->whole))
        return tv__seterr(err, -ENOMEM, "out of memory");
    return 0;
}

/* Bytes of part i (the last one may be short). */
static size_t part_len(const copy *cp, uint64_t i)
{
    uint64_t off = i * cp->part;
    return (size_t)(cp->len - off < cp->part ? cp->len - off : cp->part);
}

/* Parts [first, first + nb): their Range GETs at once, the bytes hashed in
 * order, their UploadParts at once, their ETags kept. */
static int copy_batch(copy *cp, uint64_t first, size_t nb, tv_error *err)
{
    ctx *k = &cp->k;
    char q[sizeof(k->upload_id_q) + 64];
    int rc;
    x_free(cp->xs, cp->nbuf);
    for (size_t i = 0; i < nb; i++)
        src_req(k, &cp->xs[i], cp->bufs[i], part_len(cp, first + i), (first + i) * cp->part);
    if ((rc = run(k, cp->xs, nb, err)))
        return rc;
    for (size_t i = 0; i < nb; i++)
        tv__sha256_update(&cp->whole, cp->bufs[i], cp->xs[i].len);
    x_free(cp->xs, nb);
    for (size_t i = 0; i < nb; i++) {
        snprintf(q, sizeof(q), "?partNumber=%llu&uploadId=%s", (unsigned long long)(first + i + 1),
                 k->upload_id_q);
        store_req(k, &cp->xs[i], "PUT", q, cp->bufs[i], part_len(cp, first + i));
    }
    if ((rc = run(k, cp->xs, nb, err)))
        return rc;
    for (size_t i = 0; i < nb; i++) {
        if (!cp->xs[i].etag[0])
            return tv__seterr(err, -EPROTO, "PUT %s: UploadPart answered no ETag", cp->xs[i].url);
        snprintf(cp->etags[first + i], ETAG_MAX, "%s", cp->xs[i].etag);
    }
    return 0;
}

/* CreateMultipartUpload, then every part in batches of nbuf. */
static int copy_multipart(copy *cp, tv_error *err)
{
    ctx *k = &cp->k;
    char id[UPLOAD_ID];
    int rc;
    store_req(k, &cp->xs[0], "POST", "?uploads=", NULL, 0);
    if ((rc = run(k, &cp->xs[0], 1, err)))
        return rc;
    xml_text(cp->xs[0].body, "UploadId", id, sizeof(id));
    if (!id[0])
        return tv__seterr(err, -EPROTO, "POST %s: CreateMultipartUpload answered no UploadId",
                          cp->xs[0].url);
    query_escape(id, k->upload_id_q, sizeof(k->upload_id_q));
    cp->created = true;
    if (!(cp->etags = calloc((size_t)cp->nparts, sizeof(*cp->etags))))
        return tv__seterr(err, -ENOMEM, "out of memory");
    for (uint64_t first = 0; first < cp->nparts;) {
        size_t nb = cp->nparts - first < cp->nbuf ? (size_t)(cp->nparts - first) : cp->nbuf;
        if ((rc = copy_batch(cp, first, nb, err)))
            return rc;
        first += nb;
    }
    return 0;
}

/* The whole hash checked against want (when check), then the one PUT or
 * CompleteMultipartUpload: nothing becomes an object before. */
static int copy_finish(copy *cp, const char *sha256, const uint8_t want[32], bool check,
                       tv_error *err)
{
    ctx *k = &cp->k;
    uint8_t got[32];
    char got_hex[65], q[sizeof(k->upload_id_q) + 64];
    char *xml = NULL;
    int rc;
    tv__sha256_final(&cp->whole, got);
    tv__hex_encode(got, 32, false, got_hex);
    if (check && memcmp(got, want, 32) != 0)
        return tv__seterr(
            err, TV_E_HASH_MISMATCH,
            "GET %s: its %llu bytes hash to sha256:%s, not the expected sha256:%.64s; nothing was uploaded to %s",
            cp->src_url, (unsigned long long)cp->len, got_hex, sha256, k->what);
    x_free(cp->xs, cp->nbuf);
    if (cp->len <= cp->part) {
        store_req(k, &cp->xs[0], "PUT", "", cp->bufs[0], (size_t)cp->len);
    } else {
        if (!(xml = complete_xml(cp->etags, cp->nparts)))
            return tv__seterr(err, -ENOMEM, "out of memory");
        snprintf(q, sizeof(q), "?uploadId=%s", k->upload_id_q);
        store_req(k, &cp->xs[0], "POST", q, (uint8_t *)xml, strlen(xml));
    }
    if (!(rc = run(k, &cp->xs[0], 1, err)))
        cp->created = false; /* completed */
    free(xml);
    return rc;
}

int tv__s3_copy_from_url(const tv__s3put_opts *o, const char *src_url, const char *src_bearer,
                         uint64_t len, const char *sha256, const char *s3_url, tv_error *err)
{
    copy cp = {.src_url = src_url, .len = len};
    uint8_t want[32];
    bool check = false;
    int rc;
    if ((rc = copy_prepare(&cp, o, src_url, src_bearer, sha256, s3_url, want, &check, err)))
        goto out;
    if (len <= cp.part) { /* one PUT */
        if (len) {
            src_req(&cp.k, &cp.xs[0], cp.bufs[0], (size_t)len, 0);
            if ((rc = run(&cp.k, &cp.xs[0], 1, err)))
                goto out;
            tv__sha256_update(&cp.whole, cp.bufs[0], (size_t)len);
        }
    } else if ((rc = copy_multipart(&cp, err))) {
        goto out;
    }
    rc = copy_finish(&cp, sha256, want, check, err);
out:
    if (rc && cp.created)
        abort_upload(&cp.k, rc == TV_E_CANCELLED);
    tv__sha256_free(&cp.whole);
    if (cp.xs)
        x_free(cp.xs, cp.nbuf);
    free(cp.xs);
    for (size_t i = 0; cp.bufs && i < cp.nbuf; i++)
        free(cp.bufs[i]);
    free(cp.bufs);
    free(cp.etags);
    ctx_free(&cp.k);
    return rc;
}
