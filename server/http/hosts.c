/* The names the daemon answers to (see hosts.h). */
#include "http/hosts.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/internal.h"

typedef struct host_rule {
    char name[256]; /* lower case; an IPv6 address in brackets */
    int port;       /* -1: none given */
} host_rule;

struct tv__http_hosts {
    host_rule v[TV__HTTP_MAX_HOSTS];
    size_t n_hosts;
    bool any_host;       /* "*" */
    bool any_ip_literal; /* the default list of a wildcard listen address */
};

/* Splits "name[:port]" (a bracketed IPv6 name keeps its brackets) of len
 * bytes into a lower-case name and *port (-1: none). false when malformed. */
static bool split_host(const char *s, size_t len, char name[256], int *port)
{
    size_t nl = len;
    *port = -1;
    if (len == 0)
        return false;
    if (s[0] == '[') {
        const char *close = memchr(s, ']', len);
        if (!close)
            return false;
        nl = (size_t)(close - s) + 1;
    } else {
        const char *colon = memchr(s, ':', len);
        if (colon)
            nl = (size_t)(colon - s);
    }
    if (nl == 0 || nl >= 256)
        return false;
    if (nl < len) {
        if (s[nl] != ':' || nl + 1 == len || len - nl - 1 > 5 || s[nl + 1] == '0')
            return false;
        int p = 0;
        for (size_t i = nl + 1; i < len; i++) {
            if (!isdigit((unsigned char)s[i]))
                return false;
            p = p * 10 + (s[i] - '0');
        }
        if (p > 65535)
            return false;
        *port = p;
    }
    for (size_t i = 0; i < nl; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch <= ' ' || ch >= 0x7f || ch == '/' || ch == '@')
            return false;
        name[i] = (char)tolower(ch);
    }
    name[nl] = '\0';
    return true;
}

/* Whether name is an IPv4 or a bracketed IPv6 literal. */
static bool ip_literal(const char *name)
{
    unsigned char a[16];
    char v6[64];
    size_t n = strlen(name);
    if (inet_pton(AF_INET, name, a) == 1)
        return true;
    if (n < 3 || name[0] != '[' || name[n - 1] != ']' || n - 2 >= sizeof v6)
        return false;
    memcpy(v6, name + 1, n - 2);
    v6[n - 2] = '\0';
    return inet_pton(AF_INET6, v6, a) == 1;
}

bool tv__http_host_allowed(const tv__http_hosts *h, const char *host, size_t len, uint16_t port_now)
{
    char name[256];
    int port;
    if (h->any_host)
        return true;
    if (!split_host(host, len, name, &port))
        return false;
    if (h->any_ip_literal && ip_literal(name) && (port < 0 || port == port_now))
        return true;
    for (size_t i = 0; i < h->n_hosts; i++) {
        const host_rule *r = &h->v[i];
        if (strcmp(r->name, name))
            continue;
        if (r->port >= 0 ? port == r->port : (port < 0 || port == port_now))
            return true;
    }
    return false;
}

static int add_host(tv__http_hosts *h, const char *s, size_t len, tv_error *err)
{
    if (len == 1 && s[0] == '*') {
        h->any_host = true;
        return 0;
    }
    if (h->n_hosts == TV__HTTP_MAX_HOSTS)
        return tv__seterr(err, TV_E_INVALID_ARG, "http.allowed_hosts: more than %d names",
                          TV__HTTP_MAX_HOSTS);
    host_rule *r = &h->v[h->n_hosts];
    if (!split_host(s, len, r->name, &r->port))
        return tv__seterr(err, TV_E_INVALID_ARG,
                          "http.allowed_hosts: '%.*s' is not NAME, NAME:PORT, [IPV6][:PORT] or *",
                          (int)(len > 200 ? 200 : len), s);
    h->n_hosts++;
    return 0;
}

static int add_hosts(tv__http_hosts *h, const char *list, tv_error *err)
{
    for (const char *p = list; p && *p;) {
        while (*p == ',' || *p == ' ' || *p == '\t')
            p++;
        size_t n = strcspn(p, ", \t");
        int rc = n ? add_host(h, p, n, err) : 0;
        if (rc)
            return rc;
        p += n;
    }
    return 0;
}

int tv__http_hosts_make(const char *allowed, const char *listen, const char *extra,
                        tv__http_hosts **out, tv_error *err)
{
    tv__http_hosts *h = calloc(1, sizeof *h);
    int rc;
    *out = NULL;
    if (!h)
        return tv__seterr(err, -ENOMEM, "out of memory");
    if (allowed && allowed[0]) {
        rc = add_hosts(h, allowed, err);
    } else {
        rc = add_hosts(h, "localhost,127.0.0.1,[::1]", err);
        const char *colon = listen ? strrchr(listen, ':') : NULL;
        size_t hl = colon ? (size_t)(colon - listen) : 0;
        char host[256];
        snprintf(host, sizeof host, "%.*s", (int)(hl < sizeof host ? hl : 0), listen ? listen : "");
        if (!strcmp(host, "0.0.0.0") || !strcmp(host, "[::]") || !strcmp(host, "*") || !host[0])
            h->any_ip_literal = true;
        else if (!rc)
            rc = add_host(h, host, strlen(host), err);
        if (!rc && extra)
            rc = add_hosts(h, extra, err);
    }
    if (rc) {
        free(h);
        return rc;
    }
    *out = h;
    return 0;
}

void tv__http_hosts_free(tv__http_hosts *h)
{
    free(h);
}
