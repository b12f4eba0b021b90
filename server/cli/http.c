/* tensorvaultd client over libcurl; see http.h. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <curl/curl.h>

#include "cli/http.h"
#include "httpc/httpc.h"
#include "util/internal.h"

#define TV__CLI_HTTP_MAX_BODY ((size_t)256 << 20)

typedef struct sink {
    char *buf;
    size_t len, cap;
    bool too_large;
} sink;

static size_t on_data(char *p, size_t size, size_t nmemb, void *ctx)
{
    sink *s = ctx;
    uint64_t n64;
    if (tv__mul_u64(size, nmemb, &n64) || n64 > SIZE_MAX)
        return 0;
    size_t n = (size_t)n64;
    if (n > TV__CLI_HTTP_MAX_BODY - s->len) {
        s->too_large = true;
        return 0;
    }
    if (s->len + n + 1 > s->cap) {
        size_t cap = s->cap ? s->cap : 4096;
        while (cap < s->len + n + 1)
            cap *= 2;
        char *nb = realloc(s->buf, cap);
        if (!nb)
            return 0;
        s->buf = nb;
        s->cap = cap;
    }
    memcpy(s->buf + s->len, p, n);
    s->len += n;
    s->buf[s->len] = '\0';
    return n;
}

int tv__cli_pct_encode(const char *s, char *out, size_t out_len)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        bool unreserved = (*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z') ||
                          (*p >= '0' && *p <= '9') || *p == '-' || *p == '.' || *p == '_' ||
                          *p == '~';
        size_t need = unreserved ? 1 : 3;
        if (out_len - o <= need)
            return -ERANGE;
        if (unreserved) {
            out[o++] = (char)*p;
        } else {
            out[o++] = '%';
            out[o++] = hex[*p >> 4];
            out[o++] = hex[*p & 15];
        }
    }
    if (o >= out_len)
        return -ERANGE;
    out[o] = '\0';
    return 0;
}

int tv__cli_http(const tv__cli_http_req *req, tv__cli_http_resp *resp, tv_error *err)
{
    int rc = 0;
    sink s = {0};
    char *url = NULL, *auth = NULL;
    struct curl_slist *hdrs = NULL;
    CURL *h = NULL;
    memset(resp, 0, sizeof(*resp));
    size_t bl = strlen(req->base_url);
    while (bl && req->base_url[bl - 1] == '/')
        bl--;
    size_t ul = bl + strlen(req->path) + (req->query ? strlen(req->query) + 1 : 0) + 1;
    if (!(url = malloc(ul))) {
        rc = tv__seterr(err, -ENOMEM, "out of memory");
        goto out;
    }
    snprintf(url, ul, "%.*s%s%s%s", (int)bl, req->base_url, req->path, req->query ? "?" : "",
             req->query ? req->query : "");
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK || !(h = curl_easy_init())) {
        rc = tv__seterr(err, TV_E_INTERNAL, "%s: libcurl does not initialise", url);
        goto out;
    }
    if (req->token && *req->token) {
        size_t al = strlen(req->token) + 32;
        if (!(auth = malloc(al))) {
            rc = tv__seterr(err, -ENOMEM, "out of memory");
            goto out;
        }
        snprintf(auth, al, "Authorization: Bearer %s", req->token);
        hdrs = curl_slist_append(hdrs, auth);
    }
    if (req->body)
        hdrs = curl_slist_append(hdrs, "Content-Type: application/json");
    hdrs = curl_slist_append(hdrs, "Expect:");
    curl_easy_setopt(h, CURLOPT_URL, url);
    if (req->unix_path)
        curl_easy_setopt(h, CURLOPT_UNIX_SOCKET_PATH, req->unix_path);
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, req->method);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, 3000L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, req->timeout_ms > 0 ? req->timeout_ms : 60000L);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &s);
    curl_easy_setopt(h, CURLOPT_USERAGENT, "tensorvault-cli");
    /* http(s) only (no file:// or other schemes from a URL typo), no
     * redirects (the token would follow them), no signals: what every
     * request of tensorvault sets; and loopback never through a proxy from
     * the environment. */
    tv__http_defaults(h);
    curl_easy_setopt(h, CURLOPT_NOPROXY, "localhost,127.0.0.1,::1");
    if (req->body) {
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, req->body);
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)req->body_len);
    } else if (!strcmp(req->method, "HEAD")) {
        curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
    }
    /* A GET whose connection broke before an answer (a daemon under load
     * dropping it) is sent again, twice at most: it changes nothing. */
    bool idempotent = !strcmp(req->method, "GET") || !strcmp(req->method, "HEAD");
    CURLcode cc = curl_easy_perform(h);
    for (int retry = 0;
         idempotent && retry < 2 &&
         (cc == CURLE_GOT_NOTHING || cc == CURLE_RECV_ERROR || cc == CURLE_SEND_ERROR);
         retry++) {
        struct timespec ts = {0, (retry + 1) * 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
        s.len = 0;
        cc = curl_easy_perform(h);
    }
    if ((cc == CURLE_COULDNT_CONNECT || cc == CURLE_COULDNT_RESOLVE_HOST) && req->unix_path) {
        rc = tv__seterr(err, TV_E_NO_DAEMON, "no tensorvaultd answers on the socket %s (%s)",
                        req->unix_path, curl_easy_strerror(cc));
        goto out;
    }
    if (cc == CURLE_COULDNT_CONNECT || cc == CURLE_COULDNT_RESOLVE_HOST) {
        rc = tv__seterr(err, TV_E_NO_DAEMON, "no tensorvaultd answers at %.*s (%s)", (int)bl,
                        req->base_url, curl_easy_strerror(cc));
        goto out;
    }
    if (cc == CURLE_OPERATION_TIMEDOUT) {
        rc = tv__seterr(err, TV_E_TIMEOUT, "%s %s: no answer in time", req->method, url);
        goto out;
    }
    if (cc == CURLE_WRITE_ERROR && s.too_large) {
        rc = tv__seterr(err, TV_E_TOO_LARGE, "%s %s: the answer is larger than %zu bytes",
                        req->method, url, TV__CLI_HTTP_MAX_BODY);
        goto out;
    }
    if (cc != CURLE_OK) {
        rc = tv__seterr(err, TV_E_INTERNAL, "%s %s: %s", req->method, url, curl_easy_strerror(cc));
        goto out;
    }
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &resp->status);
    if (!s.buf && !(s.buf = calloc(1, 1))) {
        rc = tv__seterr(err, -ENOMEM, "out of memory");
        goto out;
    }
    resp->body = s.buf;
    resp->body_len = s.len;
    s.buf = NULL;
out:
    free(s.buf);
    curl_slist_free_all(hdrs);
    if (h)
        curl_easy_cleanup(h);
    free(auth);
    free(url);
    return rc;
}
