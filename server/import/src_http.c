/* Import sources on an HTTP(S) origin (source.h; httpc/url.h, httpc/httpc.h).
 *
 * A URL names a checkpoint three ways: ending in ".safetensors" (one
 * shard), in ".index.json" (a Hugging Face index; its shards are fetched
 * from the same directory URL, names percent-escaped), or in '/' (a
 * directory: model.safetensors.index.json, else model.safetensors).
 *
 * Validation (import step 1) HEADs every file for its length and
 * validators (ETag, else Last-Modified) and reads the index and each
 * shard's 8-byte prefix and header with Range GETs; nothing is reserved or
 * written before all of them parsed. Every later read is a Range GET
 * checked three ways: status 206 with a Content-Range exactly the range
 * asked and the validated length (a 200 only for a read of the whole file);
 * a body of exactly that length; and the validated ETag (or Last-Modified)
 * on the response (a strong ETag is also sent as If-Match, so an origin
 * that checks it answers 412). A file whose validator or length changed,
 * or that is gone (404, 410, 412), is TV_E_SOURCE_CHANGED: the importer
 * never mixes bytes of two versions of a file.
 *
 * Each read (one chunk of the pipeline, straight into its aligned buffer)
 * is split into Range requests of at most opts.range bytes, run up to
 * GROUP_MAX at once on a curl multi handle; the importer's two reader
 * threads read two chunks at once. Every request has its own pooled
 * connection, kept alive between requests. A request that fails with a
 * connection error, a timeout, a 5xx, 408 or 429, or a short body is tried
 * again, opts.retries times, after 100 ms, 200 ms, 400 ms, ... (at most
 * 6.4 s; the failed requests of a group together); any other status fails
 * at once with a message naming the URL and the status. Transfers time out when no
 * byte arrived for opts.timeout_s seconds (CURLOPT_LOW_SPEED_*: slow but
 * moving transfers live), connections after as long. Every transfer hears
 * opts.cancel within a second, a stalled one too (tv__http_setup's progress
 * callback, the multi loop's polls, the backoff's steps): it then ends with
 * TV_E_CANCELLED and is not tried again.
 *
 * Redirects are not followed (a 3xx fails, naming its Location): the
 * origin check of import.origins is made on the URL given, and a redirect
 * could leave it. Only http and https are spoken; no content encoding is
 * asked for (bytes are hashed as served).
 *
 * An s3://BUCKET/KEY source is the same reader on the path-style URL
 * ENDPOINT/BUCKET/KEY (tv__s3_object_url), every request signed with AWS
 * Signature V4 by libcurl (CURLOPT_AWS_SIGV4 "aws:amz:REGION:s3", the key
 * pair as user and password), with x-amz-content-sha256: UNSIGNED-PAYLOAD
 * and, with a session token, x-amz-security-token. Without a key pair the
 * requests go unsigned (a public bucket). Virtual-host addressing and
 * ListObjects are not used. */
#include <curl/curl.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "import/source.h"
#include "httpc/httpc.h"
#include "httpc/url.h"
#include "util/hex.h"
#include "util/sha256.h"

#define POOL_MAX 32 /* idle handles kept: 2 readers x GROUP_MAX, and more */

typedef struct http_file {
    char *name; /* as the checkpoint names it */
    char *url;
    bool s3;             /* signed: an s3:// file (of an s3:// source, or of a pull) */
    char *auth_hdr;      /* "Authorization: Bearer ..." (a pull's peer), or NULL */
    const uint8_t *data; /* a pull's in-memory file (no requests), or NULL */
    size_t pull_idx;     /* its index in the pull's files; SIZE_MAX otherwise */
    uint64_t len;
    char etag[256];    /* "" = the origin sent none */
    char lastmod[128]; /* compared when there is no ETag */
} http_file;

struct tv__src_http {
    tv__src_http_opts o;
    bool s3;
    char sigv4[128];   /* "aws:amz:REGION:s3" */
    char s3_what[400]; /* "bucket 'B' key 'K'" for messages */
    char *s3_token_hdr;
    char *base;             /* the URL up to its last '/' included */
    const char *first_name; /* the file the URL named */
    char *first_url;
    http_file *files;
    size_t n_files, cap_files;
    pthread_mutex_t mu;
    CURL *pool[POOL_MAX]; /* idle handles (their connections stay open) */
    size_t n_pool;
    const tv__src_pull *pull; /* a fleet pull: every file's URL comes from it */
};

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc = CURLE_FAILED_INIT;

static void curl_init(void)
{
    curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

/* ---- handles ---- */

static CURL *handle_get(tv__src_http *h)
{
    CURL *c = NULL;
    pthread_mutex_lock(&h->mu);
    if (h->n_pool)
        c = h->pool[--h->n_pool];
    pthread_mutex_unlock(&h->mu);
    if (c)
        curl_easy_reset(c);
    else
        c = curl_easy_init();
    return c;
}

static void handle_put(tv__src_http *h, CURL *c)
{
    if (!c)
        return;
    pthread_mutex_lock(&h->mu);
    if (h->n_pool < POOL_MAX) {
        h->pool[h->n_pool++] = c;
        c = NULL;
    }
    pthread_mutex_unlock(&h->mu);
    if (c)
        curl_easy_cleanup(c);
}

/* ---- one request ---- */

typedef struct resp {
    uint8_t *buf; /* GET: the body lands here */
    size_t cap, got;
    bool overflow;
    char etag[256], lastmod[128], crange[128], location[512];
} resp;

static size_t on_body(char *p, size_t sz, size_t n, void *arg)
{
    resp *r = arg;
    size_t len = sz * n;
    if (!r->buf || len > r->cap - r->got) {
        r->overflow = true;
        return 0; /* aborts the transfer: CURLE_WRITE_ERROR */
    }
    memcpy(r->buf + r->got, p, len);
    r->got += len;
    return len;
}

static size_t on_header(char *p, size_t sz, size_t n, void *arg)
{
    resp *r = arg;
    size_t len = sz * n;
    /* A new status line (a 100 Continue before the answer) starts over. */
    if (len >= 5 && strncmp(p, "HTTP/", 5) == 0)
        r->etag[0] = r->lastmod[0] = r->crange[0] = r->location[0] = '\0';
    tv__http_header_value(p, len, "ETag", r->etag, sizeof(r->etag));
    tv__http_header_value(p, len, "Last-Modified", r->lastmod, sizeof(r->lastmod));
    tv__http_header_value(p, len, "Content-Range", r->crange, sizeof(r->crange));
    tv__http_header_value(p, len, "Location", r->location, sizeof(r->location));
    return len;
}

/* What one try came to: 0 (done), or rc with err set and *retry saying
 * whether another try may do better. */
typedef struct attempt {
    bool retry;
    long status;
} attempt;

static bool retryable_status(long st)
{
    return st >= 500 || st == 429 || st == 408;
}

static void set_common(tv__src_http *h, CURL *c, const http_file *f, resp *r, char *errbuf)
{
    tv__http_setup(c, f->url, (long)h->o.timeout_s, "tensorvault-import", h->o.proxy, on_header,
                   on_body, r, errbuf, &h->o.cancel);
    if (f->s3)
        tv__http_sigv4(c, h->sigv4, h->o.s3.access_key_id, h->o.s3.secret_access_key);
}

/* The headers every request of f carries: S3's, a peer's bearer (NULL
 * when none; *nomem tells an allocation failure apart). */
static struct curl_slist *s3_headers(const tv__src_http *h, const http_file *f, bool *nomem)
{
    *nomem = false;
    if (f->auth_hdr) {
        struct curl_slist *l = curl_slist_append(NULL, f->auth_hdr);
        *nomem = !l;
        return l;
    }
    if (!f->s3)
        return NULL;
    struct curl_slist *l = curl_slist_append(NULL, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
    *nomem = !l;
    if (l && h->s3_token_hdr) {
        struct curl_slist *m = curl_slist_append(l, h->s3_token_hdr);
        if (!m) {
            curl_slist_free_all(l);
            *nomem = true;
            return NULL;
        }
        l = m;
    }
    return l;
}

/* The validator check of a response against what validation saw. */
static int same_file(const http_file *f, const resp *r, tv_error *err)
{
    if (f->etag[0] && strcmp(f->etag, r->etag) != 0)
        return tv__seterr(err, TV_E_SOURCE_CHANGED,
                          "'%s' (%s) changed during import: ETag %s (was %s)", f->name, f->url,
                          r->etag[0] ? r->etag : "(none)", f->etag);
    if (!f->etag[0] && f->lastmod[0] && strcmp(f->lastmod, r->lastmod) != 0)
        return tv__seterr(err, TV_E_SOURCE_CHANGED,
                          "'%s' (%s) changed during import: Last-Modified %s (was %s)", f->name,
                          f->url, r->lastmod[0] ? r->lastmod : "(none)", f->lastmod);
    return 0;
}

/* A status that is neither success nor worth another try. */
static int status_error(const tv__src_http *h, const http_file *f, const char *what, long st,
                        const resp *r, tv_error *err)
{
    if (f->auth_hdr && (st == 401 || st == 403))
        return tv__seterr(err, TV_E_FORBIDDEN,
                          "%s %s: the peer answered %ld: it does not take this node's fleet.token",
                          what, f->url, st);
    if (f->s3 && (st == 401 || st == 403))
        return tv__seterr(
            err, TV_E_FORBIDDEN,
            "%s %s: the object store answered %ld: access to %s is refused (check s3.access_key_id / s3.secret_access_key, their region and the bucket's policy)",
            what, f->url, st, h->pull ? f->url : h->s3_what);
    if (st >= 300 && st < 400)
        return tv__seterr(
            err, -EPROTO,
            "%s %s: the origin answered %ld (a redirect to '%.300s'); redirects are not followed",
            what, f->url, st, r->location[0] ? r->location : "?");
    if (st == 404 || st == 410 || st == 412)
        return tv__seterr(err, TV_E_SOURCE_CHANGED,
                          "%s %s: the origin answered %ld: '%s' changed or went away during import",
                          what, f->url, st, f->name);
    return tv__seterr(err, -EIO, "%s %s: the origin answered %ld", what, f->url, st);
}

/* HEAD: length and validators into f. */
static int head_once(tv__src_http *h, http_file *f, attempt *a, tv_error *err)
{
    char errbuf[CURL_ERROR_SIZE];
    resp r = {0};
    int rc = 0;
    CURL *c = handle_get(h);
    if (!c)
        return tv__seterr(err, -ENOMEM, "libcurl: no handle");
    set_common(h, c, f, &r, errbuf);
    curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
    bool nomem;
    struct curl_slist *hdrs = s3_headers(h, f, &nomem);
    if (nomem) {
        handle_put(h, c);
        return tv__seterr(err, -ENOMEM, "out of memory");
    }
    if (hdrs)
        curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdrs);
    CURLcode cc = curl_easy_perform(c);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &a->status);
    curl_off_t cl = -1;
    curl_easy_getinfo(c, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &cl);
    if (tv__http_was_cancelled(cc, &h->o.cancel)) {
        rc = tv__seterr(err, TV_E_CANCELLED, "HEAD %s: cancelled", f->url);
    } else if (cc != CURLE_OK) {
        a->retry = true;
        rc = tv__seterr(err, -EIO, "HEAD %s: %s", f->url,
                        errbuf[0] ? errbuf : curl_easy_strerror(cc));
    } else if (a->status != 200) {
        a->retry = retryable_status(a->status);
        rc = a->retry ? tv__seterr(err, -EIO, "HEAD %s: the origin answered %ld", f->url, a->status)
             : a->status == 404 ? tv__seterr(err, TV_E_CKPT_NOT_FOUND,
                                             "HEAD %s: the origin answered 404 (not found)", f->url)
                                : status_error(h, f, "HEAD", a->status, &r, err);
    } else if (cl < 0) {
        rc = tv__seterr(err, -EPROTO, "HEAD %s: the origin sent no Content-Length", f->url);
    } else {
        f->len = (uint64_t)cl;
        snprintf(f->etag, sizeof(f->etag), "%s", r.etag);
        snprintf(f->lastmod, sizeof(f->lastmod), "%s", r.lastmod);
    }
    handle_put(h, c);
    curl_slist_free_all(hdrs);
    return rc;
}

/* One Range GET of [off, off + len) into buf: get_begin sets up a handle,
 * curl runs it (alone, or with others on a multi handle), get_end judges
 * the answer and returns the handle to the pool. Lives at one address
 * from get_begin to get_end (curl holds pointers into it). */
typedef struct get_req {
    const http_file *f;
    uint8_t *buf;
    size_t len;
    uint64_t off;
    CURL *c;
    struct curl_slist *hdrs;
    CURLcode cc;
    resp r;
    attempt a;
    bool pending;
    int rc;
    tv_error err;
    char errbuf[CURL_ERROR_SIZE], range[64], im[300];
} get_req;

static void get_release(tv__src_http *h, get_req *q);

static int get_begin(tv__src_http *h, get_req *q, tv_error *err)
{
    memset(&q->r, 0, sizeof(q->r));
    q->r.buf = q->buf;
    q->r.cap = q->len;
    q->a = (attempt){0};
    q->hdrs = NULL;
    q->cc = CURLE_RECV_ERROR; /* until curl says how it ended */
    if (!(q->c = handle_get(h)))
        return tv__seterr(err, -ENOMEM, "libcurl: no handle");
    set_common(h, q->c, q->f, &q->r, q->errbuf);
    snprintf(q->range, sizeof(q->range), "%llu-%llu", (unsigned long long)q->off,
             (unsigned long long)(q->off + q->len - 1));
    curl_easy_setopt(q->c, CURLOPT_RANGE, q->range);
    bool nomem;
    q->hdrs = s3_headers(h, q->f, &nomem);
    if (nomem)
        goto nomem;
    if (q->f->etag[0] == '"') { /* a strong ETag: an origin that checks it answers 412 */
        snprintf(q->im, sizeof(q->im), "If-Match: %s", q->f->etag);
        struct curl_slist *l = curl_slist_append(q->hdrs, q->im);
        if (!l)
            goto nomem;
        q->hdrs = l;
    }
    if (q->hdrs)
        curl_easy_setopt(q->c, CURLOPT_HTTPHEADER, q->hdrs);
    return 0;
nomem:
    get_release(h, q);
    return tv__seterr(err, -ENOMEM, "out of memory");
}

static void get_release(tv__src_http *h, get_req *q)
{
    curl_slist_free_all(q->hdrs);
    q->hdrs = NULL;
    handle_put(h, q->c);
    q->c = NULL;
}

static int get_end(tv__src_http *h, get_req *q, tv_error *err)
{
    const http_file *f = q->f;
    const resp *r = &q->r;
    const char *range = q->range;
    attempt *a = &q->a;
    size_t len = q->len;
    uint64_t off = q->off, first, last, total;
    int rc = 0;
    CURLcode cc = q->cc;
    curl_easy_getinfo(q->c, CURLINFO_RESPONSE_CODE, &a->status);
    if (tv__http_was_cancelled(cc, &h->o.cancel)) {
        rc =
            tv__seterr(err, TV_E_CANCELLED, "GET %s bytes %s: cancelled (%zu of %zu bytes arrived)",
                       f->url, range, r->got, len);
    } else if (cc != CURLE_OK && r->overflow) {
        rc = tv__seterr(err, -EPROTO,
                        "GET %s bytes %s: the origin sent more than the %zu bytes asked", f->url,
                        range, len);
    } else if (cc != CURLE_OK) {
        a->retry = true;
        rc = tv__seterr(err, -EIO, "GET %s bytes %s: %s (%zu of %zu bytes arrived)", f->url, range,
                        q->errbuf[0] ? q->errbuf : curl_easy_strerror(cc), r->got, len);
    } else if (a->status != 206 && a->status != 200) {
        a->retry = retryable_status(a->status);
        rc = a->retry ? tv__seterr(err, -EIO, "GET %s bytes %s: the origin answered %ld", f->url,
                                   range, a->status)
                      : status_error(h, f, "GET", a->status, r, err);
    } else if ((rc = same_file(f, r, err))) {
        ;
    } else if (a->status == 200 && (off != 0 || len != f->len)) {
        rc = tv__seterr(
            err, -EPROTO,
            "GET %s bytes %s: the origin answered 200 (the whole file) to a Range request; it must answer 206",
            f->url, range);
    } else if (a->status == 206 && tv__content_range_parse(r->crange, &first, &last, &total)) {
        rc = tv__seterr(err, -EPROTO,
                        "GET %s bytes %s: 206 with Content-Range '%s', not bytes A-B/LENGTH",
                        f->url, range, r->crange);
    } else if (a->status == 206 && total != f->len) {
        rc = tv__seterr(
            err, TV_E_SOURCE_CHANGED,
            "'%s' (%s) changed during import: Content-Range '%s' says %llu bytes (was %llu)",
            f->name, f->url, r->crange, (unsigned long long)total, (unsigned long long)f->len);
    } else if (a->status == 206 && (first != off || last != off + len - 1)) {
        rc = tv__seterr(err, -EPROTO, "GET %s bytes %s: the origin answered Content-Range '%s'",
                        f->url, range, r->crange);
    } else if (r->got != len) {
        a->retry = true;
        rc = tv__seterr(err, -EIO, "GET %s bytes %s: a short body (%zu of %zu bytes)", f->url,
                        range, r->got, len);
    }
    get_release(h, q);
    return rc;
}

static int get_once(tv__src_http *h, const http_file *f, uint8_t *buf, size_t len, uint64_t off,
                    attempt *a, tv_error *err)
{
    get_req q = {.f = f, .buf = buf, .len = len, .off = off};
    int rc = get_begin(h, &q, err);
    if (rc)
        return rc;
    q.cc = curl_easy_perform(q.c);
    rc = get_end(h, &q, err);
    *a = q.a;
    return rc;
}

/* A HEAD (buf NULL) or a Range GET, tried again as the options allow. */
static int request(tv__src_http *h, http_file *f, uint8_t *buf, size_t len, uint64_t off,
                   tv_error *err)
{
    int rc = 0;
    for (unsigned i = 0;; i++) {
        attempt a = {0};
        rc = buf ? get_once(h, f, buf, len, off, &a, err) : head_once(h, f, &a, err);
        if (!rc || !a.retry)
            return rc;
        if (i >= h->o.retries)
            break;
        tv__log(TV_LOG_WARN, "import: %s; trying again (%u of %u)", err ? err->msg : f->url, i + 1,
                h->o.retries);
        if (tv__http_backoff(i, &h->o.cancel))
            return tv__seterr(err, TV_E_CANCELLED, "%s %s: cancelled before try %u",
                              buf ? "GET" : "HEAD", f->url, i + 2);
    }
    if (err && h->o.retries) {
        char msg[sizeof(err->msg)];
        snprintf(msg, sizeof(msg), "%s", err->msg);
        tv__seterr(err, rc, "%s (after %u tries)", msg, h->o.retries + 1);
    }
    return rc;
}

/* ---- files ---- */

/* base + name with every byte outside [A-Za-z0-9._~/-] percent-escaped. */
static char *url_of(const char *base, const char *name)
{
    size_t bl = strlen(base), nl = strlen(name);
    char *u = malloc(bl + 3 * nl + 1);
    if (!u)
        return NULL;
    memcpy(u, base, bl);
    char *o = u + bl;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
        if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
            strchr("._~/-", *p))
            *o++ = (char)*p;
        else
            o += sprintf(o, "%%%02X", *p);
    }
    *o = '\0';
    return u;
}

static http_file *file_find(tv__src_http *h, const char *name)
{
    for (size_t i = 0; i < h->n_files; i++)
        if (strcmp(h->files[i].name, name) == 0)
            return &h->files[i];
    return NULL;
}

/* A pull's file (f: the next free slot of h->files): its URL (an s3://
 * one made path-style and signed), bearer or in-memory bytes, HEADed and
 * its length checked against the catalog's. */
static int pull_file_get(tv__src_http *h, const char *name, http_file *f, http_file **out,
                         tv_error *err)
{
    int rc;
    size_t idx = tv__src_pull_find(h->pull, name);
    if (idx == SIZE_MAX)
        return tv__seterr(err, TV_E_CKPT_NOT_FOUND, "'%s' is not a file of this pull", name);
    const tv__src_pull_file *pf = &h->pull->files[idx];
    f->pull_idx = idx;
    if (!(f->name = strdup(name)))
        return tv__seterr(err, -ENOMEM, "out of memory");
    if (!pf->url) {
        f->data = pf->data;
        f->len = pf->data_len;
        if (!(f->url = strdup("(in memory)"))) {
            free(f->name);
            return tv__seterr(err, -ENOMEM, "out of memory");
        }
        h->n_files++;
        *out = f;
        return 0;
    }
    char s3_url[TV__URL_MAX + 1];
    const char *url = pf->url;
    tv__url u;
    if ((rc = tv__url_parse(pf->url, &u, err)))
        goto fail;
    if (u.s3) {
        if ((rc = tv__s3_object_url(h->o.s3.endpoint, h->o.s3.region, &u, s3_url, sizeof(s3_url),
                                    err)))
            goto fail;
        url = s3_url;
        f->s3 = true;
    }
    if (!(f->url = strdup(url)) ||
        (pf->bearer && asprintf(&f->auth_hdr, "Authorization: Bearer %s", pf->bearer) < 0)) {
        f->auth_hdr = NULL;
        rc = tv__seterr(err, -ENOMEM, "out of memory");
        goto fail;
    }
    if ((rc = request(h, f, NULL, 0, 0, err)))
        goto fail;
    if (f->len != pf->len) {
        rc = tv__seterr(err, TV_E_SOURCE_CHANGED, "'%s' at %s is %llu bytes; the catalog says %llu",
                        name, f->url, (unsigned long long)f->len, (unsigned long long)pf->len);
        goto fail;
    }
    h->n_files++;
    *out = f;
    return 0;
fail:
    if (rc != -ENOMEM)
        tv__src_pull_bad(h->pull, idx, rc);
    free(f->name);
    free(f->url);
    free(f->auth_hdr);
    return rc;
}

/* The file named name, HEADed when first seen (validation only: later
 * lookups find it). */
static int file_get(tv__src_http *h, const char *name, http_file **out, tv_error *err)
{
    int rc;
    if ((*out = file_find(h, name)))
        return 0;
    if (h->n_files == h->cap_files) {
        size_t cap = h->cap_files ? 2 * h->cap_files : 8;
        http_file *nf = realloc(h->files, cap * sizeof(*nf));
        if (!nf)
            return tv__seterr(err, -ENOMEM, "out of memory");
        h->files = nf;
        h->cap_files = cap;
    }
    http_file *f = &h->files[h->n_files];
    memset(f, 0, sizeof(*f));
    f->pull_idx = SIZE_MAX;
    if (h->pull)
        return pull_file_get(h, name, f, out, err);
    f->s3 = h->s3;
    f->name = strdup(name);
    f->url = strcmp(name, h->first_name) == 0 ? strdup(h->first_url) : url_of(h->base, name);
    if (!f->name || !f->url) {
        free(f->name);
        free(f->url);
        return tv__seterr(err, -ENOMEM, "out of memory");
    }
    if ((rc = request(h, f, NULL, 0, 0, err))) {
        free(f->name);
        free(f->url);
        return rc;
    }
    h->n_files++;
    *out = f;
    return 0;
}

static int io_stat(void *ctx, const char *name, uint64_t *len, char *path, size_t path_len,
                   tv_error *err)
{
    http_file *f;
    int rc = file_get(ctx, name, &f, err);
    if (rc)
        return rc;
    *len = f->len;
    snprintf(path, path_len, "%s", f->url);
    return 0;
}

/* Runs the n requests of q at once on one multi handle, each tried again
 * (all those that failed, together, after the backoff) as the options
 * allow. Returns 0 when every one succeeded; else the first failure that
 * no retry mends (or the last retryable one's, after the last round). */
static int get_group(tv__src_http *h, get_req *q, size_t n, tv_error *err)
{
    int rc = 0;
    CURLM *m = curl_multi_init();
    if (!m)
        return tv__seterr(err, -ENOMEM, "libcurl: no multi handle");
    for (size_t i = 0; i < n; i++)
        q[i].pending = true;
    for (unsigned round = 0;; round++) {
        size_t started = 0;
        for (size_t i = 0; i < n && !rc; i++) {
            if (!q[i].pending)
                continue;
            if (!(rc = get_begin(h, &q[i], err)) && curl_multi_add_handle(m, q[i].c) != CURLM_OK) {
                get_release(h, &q[i]);
                rc = tv__seterr(err, -ENOMEM, "libcurl: cannot add a transfer");
            }
            started += !rc;
        }
        int running = 1;
        while (!rc && running) {
            CURLMcode mc = curl_multi_perform(m, &running);
            if (mc == CURLM_OK && running)
                mc = curl_multi_poll(m, NULL, 0, TV__HTTP_POLL_MS, NULL);
            if (mc != CURLM_OK)
                rc = tv__seterr(err, -EIO, "libcurl: %s", curl_multi_strerror(mc));
            else if (running && tv__http_cancelled(&h->o.cancel))
                rc = tv__seterr(err, TV_E_CANCELLED, "GET %s: cancelled", q[0].f->url);
        }
        CURLMsg *msg;
        int left;
        while ((msg = curl_multi_info_read(m, &left)))
            for (size_t i = 0; msg->msg == CURLMSG_DONE && i < n; i++)
                if (q[i].pending && q[i].c == msg->easy_handle)
                    q[i].cc = msg->data.result;
        /* Judge every transfer of this round (each frees its handle). */
        int fatal = 0, retry_rc = 0;
        tv_error retry_err = {0};
        for (size_t i = 0; i < n && started; i++) {
            if (!q[i].pending || !q[i].c)
                continue;
            curl_multi_remove_handle(m, q[i].c);
            q[i].err = (tv_error){0};
            q[i].rc = get_end(h, &q[i], &q[i].err);
            if (!q[i].rc) {
                q[i].pending = false;
            } else if (!q[i].a.retry && !fatal) {
                fatal = q[i].rc;
                if (err)
                    *err = q[i].err;
            } else if (q[i].a.retry && !retry_rc) {
                retry_rc = q[i].rc;
                retry_err = q[i].err;
            }
        }
        if (rc || (rc = fatal) || !(rc = retry_rc))
            break;
        if (err)
            *err = retry_err;
        if (round >= h->o.retries) {
            if (h->o.retries)
                tv__seterr(err, rc, "%s (after %u tries)", retry_err.msg, h->o.retries + 1);
            break;
        }
        tv__log(TV_LOG_WARN, "import: %s; trying again (%u of %u)", retry_err.msg, round + 1,
                h->o.retries);
        if (tv__http_backoff(round, &h->o.cancel)) {
            rc = tv__seterr(err, TV_E_CANCELLED, "GET %s: cancelled before try %u", q[0].f->url,
                            round + 2);
            break;
        }
        rc = 0;
    }
    curl_multi_cleanup(m);
    return rc;
}

#define GROUP_MAX 8 /* Range requests of one read in flight at once */

/* Reads [off, off + len) of f in requests of at most o.range bytes, up to
 * GROUP_MAX of them at once. */
static int read_file(tv__src_http *h, http_file *f, uint8_t *buf, size_t len, uint64_t off,
                     tv_error *err)
{
    uint64_t end;
    get_req q[GROUP_MAX];
    if (tv__add_u64(off, len, &end) || end > f->len)
        return tv__seterr(err, TV_E_INTERNAL, "read of %zu bytes at %llu past the %llu-byte %s",
                          len, (unsigned long long)off, (unsigned long long)f->len, f->url);
    if (len <= h->o.range) /* one request: no multi handle */
        return request(h, f, buf, len, off, err);
    for (size_t done = 0; done < len;) {
        size_t n = 0;
        for (; n < GROUP_MAX && done < len; n++) {
            size_t l = len - done < h->o.range ? len - done : (size_t)h->o.range;
            q[n] = (get_req){.f = f, .buf = buf + done, .len = l, .off = off + done};
            done += l;
        }
        int rc = get_group(h, q, n, err);
        if (rc)
            return rc;
    }
    return 0;
}

/* A pull's file failed for good: its source is reported bad. */
static int judged(tv__src_http *h, const http_file *f, int rc)
{
    if (rc && h->pull && f->pull_idx != SIZE_MAX && rc != -ENOMEM && rc != TV_E_INTERNAL)
        tv__src_pull_bad(h->pull, f->pull_idx, rc);
    return rc;
}

static int file_read(tv__src_http *h, http_file *f, uint8_t *buf, size_t len, uint64_t off,
                     tv_error *err)
{
    if (f->data) {
        uint64_t end;
        if (tv__add_u64(off, len, &end) || end > f->len)
            return tv__seterr(err, TV_E_INTERNAL, "read past the end of in-memory '%s'", f->name);
        memcpy(buf, f->data + off, len);
        return 0;
    }
    return judged(h, f, read_file(h, f, buf, len, off, err));
}

static int io_read(void *ctx, const char *name, void *buf, size_t len, uint64_t off, tv_error *err)
{
    http_file *f;
    int rc = file_get(ctx, name, &f, err);
    return rc ? rc : len ? file_read(ctx, f, buf, len, off, err) : 0;
}

int tv__src_http_read(tv__src_http *h, size_t idx, const tv_shard_info *si, uint8_t *buf,
                      size_t len, uint64_t off, tv_error *err)
{
    (void)idx;
    http_file *f = file_find(h, si->name);
    if (!f)
        return tv__seterr(err, TV_E_INTERNAL, "shard '%s' was not validated", si->name);
    if (f->len != si->file_len)
        return tv__seterr(err, TV_E_INTERNAL, "shard '%s': lengths disagree", si->name);
    return file_read(h, f, buf, len, off, err);
}

const char *tv__src_http_validator(tv__src_http *h, const char *name)
{
    http_file *f = h ? file_find(h, name) : NULL;
    if (!f)
        return NULL;
    return f->etag[0] ? f->etag : f->lastmod[0] ? f->lastmod : NULL;
}

void tv__src_http_free(tv__src_http *h)
{
    if (!h)
        return;
    for (size_t i = 0; i < h->n_pool; i++)
        curl_easy_cleanup(h->pool[i]);
    for (size_t i = 0; i < h->n_files; i++) {
        free(h->files[i].name);
        free(h->files[i].url);
        free(h->files[i].auth_hdr);
    }
    free(h->files);
    free(h->base);
    free(h->first_url);
    free(h->s3_token_hdr);
    pthread_mutex_destroy(&h->mu);
    free(h);
}

static bool ends_with(const char *s, const char *suf)
{
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && strcmp(s + n - m, suf) == 0;
}

/* A reader with its options (defaults filled in) and no files yet. */
static int http_new(const tv__src_http_opts *ho, tv__src_http **out, tv_error *err)
{
    pthread_once(&curl_once, curl_init);
    if (curl_init_rc != CURLE_OK)
        return tv__seterr(err, TV_E_INTERNAL, "libcurl does not initialise");
    tv__src_http *h = calloc(1, sizeof(*h));
    if (!h)
        return tv__seterr(err, -ENOMEM, "out of memory");
    pthread_mutex_init(&h->mu, NULL);
    if (ho)
        h->o = *ho;
    else
        h->o.retries = TV__SRC_HTTP_DEFAULT_RETRIES;
    if (!h->o.timeout_s)
        h->o.timeout_s = TV__SRC_HTTP_DEFAULT_TIMEOUT;
    if (!h->o.range)
        h->o.range = TV__SRC_HTTP_DEFAULT_RANGE;
    *out = h;
    return 0;
}

int tv__src_http_open_pull(const tv__src_pull *p, const tv__src_http_opts *ho, tv__src_http **out,
                           tv_checkpoint **ck, tv_error *err)
{
    int rc;
    *out = NULL;
    *ck = NULL;
    if (!p || !p->first || !p->files || !p->n_files)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__src_http_open_pull: an empty pull");
    tv__src_http *h;
    if ((rc = http_new(ho, &h, err)))
        return rc;
    h->pull = p;
    const char *region = h->o.s3.region && *h->o.s3.region ? h->o.s3.region : TV__S3_DEFAULT_REGION;
    snprintf(h->sigv4, sizeof(h->sigv4), "aws:amz:%.64s:s3", region);
    if (h->o.s3.session_token && *h->o.s3.session_token &&
        asprintf(&h->s3_token_hdr, "x-amz-security-token: %s", h->o.s3.session_token) < 0) {
        h->s3_token_hdr = NULL;
        rc = tv__seterr(err, -ENOMEM, "out of memory");
        goto fail;
    }
    h->first_name = p->first;
    const tv_checkpoint_io io = {.ctx = h, .stat = io_stat, .read = io_read};
    if ((rc = tv_checkpoint_open_io(&io, p->first, p->first_is_index, NULL, ck, err)))
        goto fail;
    *out = h;
    return 0;
fail:
    tv__src_http_free(h);
    return rc;
}

int tv__src_http_open(const char *src, const tv__src_http_opts *ho, tv__src_http **out,
                      tv_checkpoint **ck, tv_error *err)
{
    tv__url u;
    int rc;
    char s3_url[TV__URL_MAX + 1];
    const char *url = src;
    *out = NULL;
    *ck = NULL;
    if ((rc = tv__url_parse(src, &u, err)))
        return rc;
    if (u.s3) {
        const tv__s3_opts *so = ho ? &ho->s3 : &(tv__s3_opts){0};
        if ((rc = tv__s3_object_url(so->endpoint, so->region, &u, s3_url, sizeof(s3_url), err)))
            return rc;
        url = s3_url;
        if ((rc = tv__url_parse(url, &u, err)))
            return rc;
    }
    tv__src_http *h;
    if ((rc = http_new(ho, &h, err)))
        return rc;
    if (url != src) {
        const char *region =
            h->o.s3.region && *h->o.s3.region ? h->o.s3.region : TV__S3_DEFAULT_REGION;
        const char *bk = src + 5, *key = strchr(bk, '/');
        h->s3 = true;
        snprintf(h->sigv4, sizeof(h->sigv4), "aws:amz:%.64s:s3", region);
        snprintf(h->s3_what, sizeof(h->s3_what), "bucket '%.*s' key '%.300s'", (int)(key - bk), bk,
                 key + 1);
        if (h->o.s3.session_token && *h->o.s3.session_token &&
            asprintf(&h->s3_token_hdr, "x-amz-security-token: %s", h->o.s3.session_token) < 0) {
            h->s3_token_hdr = NULL;
            rc = tv__seterr(err, -ENOMEM, "out of memory");
            goto fail;
        }
    }
    const char *slash = strrchr(url, '/'); /* the path has one: tv__url_parse */
    size_t bl = (size_t)(slash - url) + 1;
    if (!(h->base = strndup(url, bl))) {
        rc = tv__seterr(err, -ENOMEM, "out of memory");
        goto fail;
    }
    const tv_checkpoint_io io = {.ctx = h, .stat = io_stat, .read = io_read};
    if (slash[1] == '\0') {
        static const char *const names[] = {"model.safetensors.index.json", "model.safetensors"};
        for (size_t i = 0; i < 2; i++) {
            free(h->first_url);
            h->first_name = names[i];
            if (!(h->first_url = url_of(h->base, names[i]))) {
                rc = tv__seterr(err, -ENOMEM, "out of memory");
                goto fail;
            }
            rc = tv_checkpoint_open_io(&io, names[i], i == 0, NULL, ck, err);
            if (rc != TV_E_CKPT_NOT_FOUND || file_find(h, names[i]))
                break;
        }
        if (rc == TV_E_CKPT_NOT_FOUND && !file_find(h, "model.safetensors"))
            tv__seterr(
                err, rc,
                "%s holds neither model.safetensors.index.json nor model.safetensors (both answered 404)",
                url);
    } else if (ends_with(u.path, ".safetensors") || ends_with(u.path, ".index.json")) {
        if (!(h->first_url = strdup(url))) {
            rc = tv__seterr(err, -ENOMEM, "out of memory");
            goto fail;
        }
        h->first_name = strrchr(h->first_url, '/') + 1;
        rc = tv_checkpoint_open_io(&io, h->first_name, ends_with(u.path, ".index.json"), NULL, ck,
                                   err);
    } else {
        rc = tv__seterr(
            err, TV_E_BAD_REQUEST,
            "source URL '%.300s' must end in .safetensors, .index.json or '/' (a directory)", url);
    }
    if (rc)
        goto fail;
    *out = h;
    return 0;
fail:
    tv__src_http_free(h);
    return rc;
}

/* ---- sidecar files ---- */

/* File f whole into a new buffer, checked against want_sha (NULL: none). */
static int sidecar_fetch(tv__src_http *h, http_file *f, const char *want_sha, uint8_t **out,
                         tv_error *err)
{
    int rc;
    uint8_t *buf = malloc(f->len ? (size_t)f->len : 1);
    if (!buf)
        return tv__seterr(err, -ENOMEM, "out of memory");
    if (f->len && (rc = file_read(h, f, buf, (size_t)f->len, 0, err))) {
        free(buf);
        return rc;
    }
    if (want_sha) {
        tv__sha256 sh;
        uint8_t dig[32];
        char hex[65];
        if (tv__sha256_init(&sh)) {
            free(buf);
            return tv__seterr(err, -ENOMEM, "out of memory");
        }
        tv__sha256_update(&sh, buf, (size_t)f->len);
        tv__sha256_final(&sh, dig);
        tv__hex_encode(dig, 32, false, hex);
        if (strcasecmp(hex, want_sha) != 0) {
            free(buf);
            return judged(h, f,
                          tv__seterr(err, TV_E_HASH_MISMATCH,
                                     "sidecar file '%s' (%s) hashed to %s, not %s", f->name, f->url,
                                     hex, want_sha));
        }
    }
    *out = buf;
    return 0;
}

/* A pull: every file with sidecar set, in memory or fetched whole. */
static int pull_sidecars(tv__src_http *h, const tv__sidecar_caps *caps, tv__sidecars *set,
                         tv_error *err)
{
    uint64_t max = caps && caps->max_len ? caps->max_len : TV__SIDECAR_DEFAULT_MAX;
    int rc = 0;
    for (size_t i = 0; !rc && i < h->pull->n_files; i++) {
        const tv__src_pull_file *pf = &h->pull->files[i];
        if (!pf->sidecar)
            continue;
        if ((rc = tv__sidecar_path_valid(pf->name, err)))
            break;
        uint64_t len = pf->url ? pf->len : pf->data_len;
        if (len > max) { /* listed as skipped, never fetched */
            static const uint8_t none = 0;
            rc = tv__sidecars_add(set, caps, pf->name, &none, (size_t)len, err);
            continue;
        }
        http_file *f;
        uint8_t *buf = NULL;
        if ((rc = file_get(h, pf->name, &f, err)) ||
            (rc = sidecar_fetch(h, f, pf->sha256, &buf, err)))
            break;
        rc = tv__sidecars_add(set, caps, pf->name, buf, (size_t)f->len, err);
        free(buf);
    }
    return rc;
}

int tv__src_http_sidecars(tv__src_http *h, const tv__sidecar_caps *caps, tv__sidecars *set,
                          tv_error *err)
{
    uint64_t max = caps && caps->max_len ? caps->max_len : TV__SIDECAR_DEFAULT_MAX;
    int rc = 0;
    if (h->pull)
        rc = pull_sidecars(h, caps, set, err);
    for (size_t i = 0; !h->pull && !rc && tv__sidecar_well_known[i]; i++) {
        const char *name = tv__sidecar_well_known[i];
        http_file *f;
        uint8_t *buf = NULL;
        tv_error e2 = {0};
        rc = file_get(h, name, &f, &e2);
        /* 404: the origin has none. An object store answers a missing key
         * 403 to a caller that may not list the bucket: none either. */
        if (rc == TV_E_CKPT_NOT_FOUND || (h->s3 && rc == TV_E_FORBIDDEN)) {
            rc = 0;
            continue;
        }
        if (rc) {
            if (err)
                *err = e2;
            break;
        }
        if (f->len > max) {
            static const uint8_t none = 0;
            rc = tv__sidecars_add(set, caps, name, &none, (size_t)f->len, err);
            continue;
        }
        if ((rc = sidecar_fetch(h, f, NULL, &buf, err)))
            break;
        rc = tv__sidecars_add(set, caps, name, buf, (size_t)f->len, err);
        free(buf);
    }
    if (!rc)
        tv__sidecars_sort(set);
    return rc;
}
