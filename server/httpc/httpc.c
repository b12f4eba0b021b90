/* The libcurl settings every outbound request shares; see httpc.h. */
#include "httpc/httpc.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <arpa/inet.h>
#include <curl/curl.h>

#include "util/internal.h"

void tv__http_header_value(const char *p, size_t len, const char *name, char *out, size_t out_len)
{
    size_t nl = strlen(name);
    if (len <= nl || strncasecmp(p, name, nl) != 0 || p[nl] != ':')
        return;
    p += nl + 1;
    len -= nl + 1;
    while (len && (*p == ' ' || *p == '\t'))
        p++, len--;
    while (len && (p[len - 1] == '\r' || p[len - 1] == '\n' || p[len - 1] == ' '))
        len--;
    snprintf(out, out_len, "%.*s", (int)len, p);
}

void tv__http_defaults(void *c)
{
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
}

bool tv__http_cancelled(const tv__http_cancel *c)
{
    return c && c->cancelled && c->cancelled(c->ctx);
}

bool tv__http_backoff(unsigned attempt_no, const tv__http_cancel *cancel)
{
    uint64_t ms = 100ull << (attempt_no < 6 ? attempt_no : 6); /* 100 ms .. 6.4 s */
    for (uint64_t slept = 0; slept < ms; slept += 100) {
        if (tv__http_cancelled(cancel))
            return true;
        struct timespec ts = {.tv_sec = 0, .tv_nsec = 100 * 1000000L};
        while (nanosleep(&ts, &ts) == -1 && errno == EINTR)
            ;
    }
    return tv__http_cancelled(cancel);
}

/* libcurl's progress callback: called while the transfer runs, about once
 * a second when nothing moves; non-zero aborts it. */
static int on_progress(void *ctx, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
                       curl_off_t ulnow)
{
    (void)dltotal, (void)dlnow, (void)ultotal, (void)ulnow;
    return tv__http_cancelled(ctx) ? 1 : 0;
}

void tv__http_setup(void *c, const char *url, long timeout_s, const char *agent, const char *proxy,
                    tv__http_cb on_header, tv__http_cb on_body, void *ctx, char *errbuf,
                    const tv__http_cancel *cancel)
{
    curl_easy_setopt(c, CURLOPT_URL, url);
    tv__http_defaults(c);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, timeout_s);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, timeout_s);
    curl_easy_setopt(c, CURLOPT_USERAGENT, agent);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, ctx);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, ctx);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
    errbuf[0] = '\0';
    if (proxy && *proxy)
        curl_easy_setopt(c, CURLOPT_PROXY, proxy);
    if (cancel && cancel->cancelled) {
        curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress);
        curl_easy_setopt(c, CURLOPT_XFERINFODATA, (void *)cancel);
        curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
    }
}

bool tv__http_was_cancelled(int cc, const tv__http_cancel *cancel)
{
    return cc == CURLE_ABORTED_BY_CALLBACK || (cc != CURLE_OK && tv__http_cancelled(cancel));
}

void tv__http_sigv4(void *c, const char *sigv4, const char *key_id, const char *secret)
{
    if (!key_id || !*key_id)
        return;
    curl_easy_setopt(c, CURLOPT_AWS_SIGV4, sigv4);
    curl_easy_setopt(c, CURLOPT_USERNAME, key_id);
    curl_easy_setopt(c, CURLOPT_PASSWORD, secret ? secret : "");
}

/* ---- redirects ---- */

/* The parts of an absolute http(s) URL libcurl's parser sees. */
typedef struct url_parts {
    char scheme[8], host[256], port[8];
    bool creds;
} url_parts;

static int url_split(const char *url, url_parts *p)
{
    CURLU *u = curl_url();
    char *scheme = NULL, *host = NULL, *port = NULL, *user = NULL, *pw = NULL;
    int rc = -1;
    memset(p, 0, sizeof(*p));
    if (!u || curl_url_set(u, CURLUPART_URL, url, 0) != CURLUE_OK ||
        curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) != CURLUE_OK ||
        curl_url_get(u, CURLUPART_HOST, &host, 0) != CURLUE_OK ||
        curl_url_get(u, CURLUPART_PORT, &port, CURLU_DEFAULT_PORT) != CURLUE_OK)
        goto out;
    p->creds = curl_url_get(u, CURLUPART_USER, &user, 0) == CURLUE_OK ||
               curl_url_get(u, CURLUPART_PASSWORD, &pw, 0) == CURLUE_OK;
    if ((strcasecmp(scheme, "http") && strcasecmp(scheme, "https")) ||
        strlen(host) >= sizeof(p->host) || strlen(port) >= sizeof(p->port))
        goto out;
    snprintf(p->scheme, sizeof(p->scheme), "%s", scheme);
    snprintf(p->host, sizeof(p->host), "%s", host);
    snprintf(p->port, sizeof(p->port), "%s", port);
    for (char *c = p->scheme; *c; c++)
        *c = (char)(*c >= 'A' && *c <= 'Z' ? *c - 'A' + 'a' : *c);
    for (char *c = p->host; *c; c++)
        *c = (char)(*c >= 'A' && *c <= 'Z' ? *c - 'A' + 'a' : *c);
    rc = 0;
out:
    curl_free(scheme);
    curl_free(host);
    curl_free(port);
    curl_free(user);
    curl_free(pw);
    curl_url_cleanup(u);
    return rc;
}

int tv__http_origin(const char *url, char *out, size_t out_len)
{
    url_parts p;
    if (!url || url_split(url, &p))
        return -1;
    int n = snprintf(out, out_len, "%s://%s:%s", p.scheme, p.host, p.port);
    return n < 0 || (size_t)n >= out_len ? -1 : 0;
}

int tv__http_redirect_check(const tv__http_redirects *p, const char *first, const char *to,
                            tv_error *err)
{
    url_parts a, b;
    if (!to || url_split(to, &b))
        return tv__seterr(err, TV_E_FORBIDDEN,
                          "a redirect to '%.300s' is refused: not an absolute http(s) URL",
                          to ? to : "(none)");
    if (b.creds)
        return tv__seterr(err, TV_E_FORBIDDEN,
                          "a redirect to %s://%s is refused: the URL carries credentials", b.scheme,
                          b.host);
    bool same = first && !url_split(first, &a) && !strcmp(a.scheme, b.scheme) &&
                !strcmp(a.host, b.host) && !strcmp(a.port, b.port);
    if (!same && strcmp(b.scheme, "https") && !(p && p->allow_http))
        return tv__seterr(
            err, TV_E_FORBIDDEN,
            "a redirect to '%.300s' is refused: only https:// redirects are followed (import.hf_redirect_http allows http://)",
            to);
    return 0;
}

bool tv__http_addr_private(const char *ip)
{
    unsigned char a[16];
    if (!ip)
        return true;
    if (inet_pton(AF_INET6, ip, a) == 1) {
        static const unsigned char mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
        static const unsigned char zero[16] = {0};
        static const unsigned char one[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
        if (!memcmp(a, mapped, 12)) {
            char v4[INET_ADDRSTRLEN];
            return !inet_ntop(AF_INET, a + 12, v4, sizeof(v4)) || tv__http_addr_private(v4);
        }
        return !memcmp(a, zero, 16) || !memcmp(a, one, 16) || (a[0] & 0xfe) == 0xfc ||
               (a[0] == 0xfe && (a[1] & 0xc0) == 0x80) || a[0] == 0xff;
    }
    if (inet_pton(AF_INET, ip, a) != 1)
        return true;
    return a[0] == 0 || a[0] == 10 || a[0] == 127 || (a[0] == 100 && (a[1] & 0xc0) == 64) ||
           (a[0] == 169 && a[1] == 254) || (a[0] == 172 && (a[1] & 0xf0) == 16) ||
           (a[0] == 192 && a[1] == 168) || a[0] >= 224;
}

static int on_prereq(void *ctx, char *primary_ip, char *local_ip, int primary_port, int local_port)
{
    tv__http_refusal *r = ctx;
    (void)local_ip, (void)primary_port, (void)local_port;
    if (!tv__http_addr_private(primary_ip))
        return CURL_PREREQFUNC_OK;
    r->refused = true;
    snprintf(r->ip, sizeof(r->ip), "%s", primary_ip ? primary_ip : "?");
    return CURL_PREREQFUNC_ABORT;
}

void tv__http_refuse_private(void *c, tv__http_refusal *r)
{
    r->refused = false;
    r->ip[0] = '\0';
    curl_easy_setopt(c, CURLOPT_PREREQFUNCTION, on_prereq);
    curl_easy_setopt(c, CURLOPT_PREREQDATA, r);
}
