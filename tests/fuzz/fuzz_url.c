/* libFuzzer target: the import source URL rules and the Content-Range of a
 * 206 (server/httpc/url.c) on arbitrary bytes: a URL comes from a REST
 * body or the CLI, a Content-Range from a remote server.
 * Input: the first line is parsed as a URL and as an import.origins list,
 * the rest (cut at its first NUL) as a Content-Range value.
 * Invariants: every function returns 0 or its documented code; an accepted
 * URL has a lowercase host, a port in 1..65535 (0 for s3://), a path that
 * starts with '/' and holds no "." or ".." segment, lies under itself and
 * (holding no ',') under its own origins list; an s3:// URL gives a path-style object URL
 * that parses as http(s); an accepted Content-Range has first <= last <
 * total and prints back to the same three numbers. */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "httpc/url.h"

static void check_url(const char *s)
{
    tv__url u, again;
    tv_error err = {0};
    int rc = tv__url_parse(s, &u, &err);
    if (rc != 0 && rc != TV_E_BAD_REQUEST)
        abort();
    int vrc = tv__url_origins_validate(s, &err);
    if (vrc != 0 && vrc != TV_E_INVALID_ARG)
        abort();
    int orc = tv__url_origins_check(s, s, &err);
    if (orc != 0 && orc != TV_E_BAD_REQUEST && orc != TV_E_OUTSIDE_ROOTS && orc != TV_E_INVALID_ARG)
        abort();
    if (rc)
        return;
    if (u.path[0] != '/' || strstr(u.path, "/./") || strstr(u.path, "/../") ||
        (u.s3 ? u.port != 0 : (u.port < 1 || u.port > 65535)))
        abort();
    size_t n = strlen(u.path);
    if ((n >= 2 && !strcmp(u.path + n - 2, "/.")) || (n >= 3 && !strcmp(u.path + n - 3, "/..")))
        abort();
    for (const char *h = u.host; *h; h++)
        if (*h >= 'A' && *h <= 'Z')
            abort();
    /* a URL with a ',' is not a one-prefix origins list */
    if (!tv__url_under(&u, &u) || (orc != 0 && !strchr(s, ',')))
        abort();
    if (u.s3) {
        char obj[TV__URL_MAX + 512];
        int src = tv__s3_object_url(NULL, NULL, &u, obj, sizeof obj, &err);
        if (src == 0 && (tv__url_parse(obj, &again, &err) || again.s3 || !again.https))
            abort();
        if (src != 0 && src != TV_E_BAD_REQUEST)
            abort();
    }
}

static void check_range(const char *s)
{
    uint64_t a = 0, b = 0, t = 0, a2 = 0, b2 = 0, t2 = 0;
    int rc = tv__content_range_parse(s, &a, &b, &t);
    if (rc != 0 && rc != -1)
        abort();
    if (rc)
        return;
    if (a > b || b >= t)
        abort();
    char back[96];
    snprintf(back, sizeof back, "bytes %" PRIu64 "-%" PRIu64 "/%" PRIu64, a, b, t);
    if (tv__content_range_parse(back, &a2, &b2, &t2) || a2 != a || b2 != b || t2 != t)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nl = memchr(data, '\n', size);
    size_t n1 = nl ? (size_t)(nl - data) : size;
    char *first = malloc(n1 + 1);
    size_t n2 = nl ? size - n1 - 1 : 0;
    char *rest = malloc(n2 + 1);
    if (!first || !rest)
        abort();
    memcpy(first, data, n1);
    first[n1] = '\0';
    if (n2)
        memcpy(rest, nl + 1, n2);
    rest[n2] = '\0';
    check_url(first);
    check_range(rest);
    free(first);
    free(rest);
    return 0;
}
