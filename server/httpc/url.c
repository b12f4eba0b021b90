/* The URLs of outbound requests; see url.h. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "httpc/url.h"
#include "util/internal.h"

static bool path_char(unsigned char c)
{
    return isalnum(c) || strchr("-._~!$&'()*+,;=:@/%", c) != NULL;
}

static int bad(tv_error *err, const char *s, const char *why)
{
    return tv__seterr(err, TV_E_BAD_REQUEST, "source URL '%.300s' is refused: %s", s, why);
}

/* The path of s from its first '/' (path) into u->path. */
static int parse_path(const char *s, const char *path, tv__url *u, tv_error *err)
{
    if (*path != '/')
        return bad(err, s,
                   *path ? "a query or fragment is not accepted" : "no path after the host");
    for (const char *q = path; *q; q++) {
        unsigned char c = (unsigned char)*q;
        if (c == '?' || c == '#')
            return bad(err, s, "a query or fragment is not accepted");
        if (!path_char(c))
            return bad(err, s,
                       "the path has a byte outside RFC 3986's path characters (escape it as %XX)");
        if (c == '%') {
            if (!isxdigit((unsigned char)q[1]) || !isxdigit((unsigned char)q[2]))
                return bad(err, s, "a '%' not followed by two hex digits");
            unsigned v = (unsigned)strtoul((char[]){q[1], q[2], 0}, NULL, 16);
            if (v == '.' || v == '/' || v == '\\' || v == 0)
                return bad(err, s, "a percent-encoded '.', '/', '\\' or NUL in the path");
        }
        if (c == '/' && q[1] == '.' &&
            (q[2] == '/' || q[2] == '\0' || (q[2] == '.' && (q[3] == '/' || q[3] == '\0'))))
            return bad(err, s, "a '.' or '..' segment in the path");
    }
    memcpy(u->path, path, strlen(path) + 1);
    return 0;
}

int tv__url_parse(const char *s, tv__url *u, tv_error *err)
{
    memset(u, 0, sizeof(*u));
    if (!s)
        return tv__seterr(err, TV_E_BAD_REQUEST, "no source URL");
    size_t n = strnlen(s, TV__URL_MAX + 1);
    if (n > TV__URL_MAX)
        return tv__seterr(err, TV_E_BAD_REQUEST, "source URL '%.64s...' is longer than %d bytes", s,
                          TV__URL_MAX);
    const char *p;
    if (strncasecmp(s, "http://", 7) == 0) {
        p = s + 7;
    } else if (strncasecmp(s, "https://", 8) == 0) {
        u->https = true;
        p = s + 8;
    } else if (strncasecmp(s, "s3://", 5) == 0) {
        u->s3 = true;
        p = s + 5;
    } else {
        return bad(err, s, "the scheme must be http://, https:// or s3://");
    }
    size_t auth = strcspn(p, "/?#");
    const char *at = memchr(p, '@', auth);
    if (at) /* the message must not repeat the credentials */
        return tv__seterr(
            err, TV_E_BAD_REQUEST,
            "source URL '%.*s://(credentials)@%.300s' is refused: credentials (user:password@) are not accepted in a URL",
            u->https ? 5
            : u->s3  ? 2
                     : 4,
            s, at + 1);
    if (u->s3) { /* s3://BUCKET/KEY: S3's bucket naming rules */
        if (auth < 3 || auth > 63)
            return bad(err, s, "an S3 bucket name has 3 to 63 characters");
        for (size_t i = 0; i < auth; i++)
            if (!islower((unsigned char)p[i]) && !isdigit((unsigned char)p[i]) && p[i] != '.' &&
                p[i] != '-')
                return bad(err, s, "an S3 bucket name has only [a-z0-9.-]");
        if (!isalnum((unsigned char)p[0]) || !isalnum((unsigned char)p[auth - 1]))
            return bad(err, s, "an S3 bucket name starts and ends with a letter or digit");
        memcpy(u->host, p, auth);
        return parse_path(s, p + auth, u, err);
    }
    const char *port = NULL;
    size_t hl;
    if (p[0] == '[') {
        const char *rb = memchr(p, ']', auth);
        if (!rb || rb == p + 1)
            return bad(err, s, "an IPv6 host needs its closing ']'");
        for (const char *q = p + 1; q < rb; q++)
            if (!isxdigit((unsigned char)*q) && *q != ':' && *q != '.')
                return bad(err, s, "the IPv6 host has a character outside [0-9a-fA-F:.]");
        hl = (size_t)(rb - p) + 1;
        if (hl < auth && p[hl] != ':')
            return bad(err, s, "garbage after the IPv6 host");
        port = hl < auth ? p + hl + 1 : NULL;
    } else {
        const char *colon = memchr(p, ':', auth);
        hl = colon ? (size_t)(colon - p) : auth;
        port = colon ? colon + 1 : NULL;
        for (size_t i = 0; i < hl; i++)
            if (!isalnum((unsigned char)p[i]) && p[i] != '.' && p[i] != '-')
                return bad(err, s, "the host has a character outside [A-Za-z0-9.-]");
    }
    if (hl == 0)
        return bad(err, s, "no host");
    if (hl >= sizeof(u->host))
        return bad(err, s, "the host is longer than 255 bytes");
    for (size_t i = 0; i < hl; i++)
        u->host[i] = (char)tolower((unsigned char)p[i]);
    u->port = u->https ? 443 : 80;
    if (port) {
        const char *end = p + auth;
        unsigned long v = 0;
        if (port == end)
            return bad(err, s, "an empty port");
        for (const char *q = port; q < end; q++) {
            if (!isdigit((unsigned char)*q) || (v = v * 10 + (unsigned long)(*q - '0')) > 65535)
                return bad(err, s, "the port must be a number 1-65535");
        }
        if (v == 0)
            return bad(err, s, "the port must be a number 1-65535");
        u->port = (unsigned)v;
    }
    return parse_path(s, p + auth, u, err);
}

bool tv__url_under(const tv__url *u, const tv__url *p)
{
    if (u->https != p->https || u->s3 != p->s3 || u->port != p->port ||
        strcmp(u->host, p->host) != 0)
        return false;
    size_t n = strlen(p->path);
    if (strncmp(u->path, p->path, n) != 0)
        return false;
    return p->path[n - 1] == '/' || u->path[n] == '\0' || u->path[n] == '/';
}

int tv__url_origins_check(const char *url, const char *origins, tv_error *err)
{
    tv__url u, p;
    int rc;
    if ((rc = tv__url_parse(url, &u, err)))
        return rc;
    const char *o = origins ? origins : "";
    bool any = false;
    while (*o) {
        o += strspn(o, " \t,");
        size_t len = strcspn(o, ",");
        while (len && (o[len - 1] == ' ' || o[len - 1] == '\t'))
            len--;
        if (len == 0)
            break;
        char one[TV__URL_MAX + 1];
        if (len > TV__URL_MAX)
            return tv__seterr(err, TV_E_INVALID_ARG,
                              "import.origins: a prefix is longer than %d bytes", TV__URL_MAX);
        memcpy(one, o, len);
        one[len] = '\0';
        tv_error e = {0};
        if (tv__url_parse(one, &p, &e))
            return tv__seterr(err, TV_E_INVALID_ARG, "import.origins: %s", e.msg);
        any = true;
        if (tv__url_under(&u, &p))
            return 0;
        o += strcspn(o, ",");
    }
    if (!any)
        return tv__seterr(
            err, TV_E_OUTSIDE_ROOTS,
            "import source '%.300s' is a URL and import.origins is empty: remote imports are off (list the allowed URL or s3://BUCKET/PREFIX/ prefixes in import.origins)",
            url);
    return tv__seterr(err, TV_E_OUTSIDE_ROOTS,
                      "import source '%.300s' is not under any prefix of import.origins", url);
}

int tv__url_origins_validate(const char *origins, tv_error *err)
{
    int rc = tv__url_origins_check("http://0.invalid/", origins, err);
    return rc == TV_E_INVALID_ARG ? rc : 0;
}

int tv__s3_object_url(const char *endpoint, const char *region, const tv__url *u, char *out,
                      size_t out_len, tv_error *err)
{
    char ep[TV__URL_MAX + 1];
    tv__url e;
    int n;
    if (!u->s3)
        return tv__seterr(err, TV_E_INTERNAL, "not an s3:// URL");
    if (endpoint && *endpoint)
        n = snprintf(ep, sizeof(ep), "%s", endpoint);
    else
        n = snprintf(ep, sizeof(ep), "https://s3.%s.amazonaws.com",
                     region && *region ? region : TV__S3_DEFAULT_REGION);
    if (n < 0 || (size_t)n >= sizeof(ep))
        return tv__seterr(err, TV_E_INVALID_ARG, "s3.endpoint is longer than %d bytes",
                          TV__URL_MAX);
    while (n > 0 && ep[n - 1] == '/')
        ep[--n] = '\0';
    char probe[TV__URL_MAX + 2];
    snprintf(probe, sizeof(probe), "%s/", ep);
    tv_error pe = {0};
    if (tv__url_parse(probe, &e, &pe) || e.s3 || strcmp(e.path, "/") != 0)
        return tv__seterr(
            err, TV_E_INVALID_ARG,
            "s3.endpoint '%.300s' must be http(s)://HOST[:PORT] (no path, no credentials)", ep);
    n = snprintf(out, out_len, "%s/%s%s", ep, u->host, u->path);
    if (n < 0 || (size_t)n >= out_len || (size_t)n > TV__URL_MAX)
        return tv__seterr(err, TV_E_BAD_REQUEST, "the URL of s3://%s%.300s is too long", u->host,
                          u->path);
    return 0;
}

static bool get_u64(const char **p, uint64_t *v)
{
    const char *q = *p;
    uint64_t x = 0;
    if (!isdigit((unsigned char)*q))
        return false;
    for (; isdigit((unsigned char)*q); q++) {
        uint64_t d = (uint64_t)(*q - '0');
        if (x > (UINT64_MAX - d) / 10)
            return false;
        x = x * 10 + d;
    }
    *v = x;
    *p = q;
    return true;
}

int tv__content_range_parse(const char *v, uint64_t *first, uint64_t *last, uint64_t *total)
{
    if (!v)
        return -1;
    while (*v == ' ' || *v == '\t')
        v++;
    if (strncasecmp(v, "bytes ", 6) != 0)
        return -1;
    v += 6;
    while (*v == ' ')
        v++;
    if (!get_u64(&v, first) || *v++ != '-' || !get_u64(&v, last) || *v++ != '/' ||
        !get_u64(&v, total))
        return -1;
    while (*v == ' ' || *v == '\t' || *v == '\r' || *v == '\n')
        v++;
    if (*v || *first > *last || *last >= *total)
        return -1;
    return 0;
}
