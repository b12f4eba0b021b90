/* The libcurl settings every outbound request shares; see httpc.h. */
#include "httpc/httpc.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <curl/curl.h>

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
