/* libFuzzer target: the Host and Origin matching of the HTTP transport
 * (server/http/hosts.c) on arbitrary bytes: a Host header comes from any
 * client, a web page's name through the user's browser.
 * Input: the first line is an http.allowed_hosts list, the rest the value
 * to match (NUL bytes included: the matcher takes a length).
 * Invariants: building a list returns 0 or TV_E_INVALID_ARG; matching never
 * reads past the value; with the default list of a daemon on
 * 127.0.0.1:8470, a value that matches is exactly localhost, 127.0.0.1 or
 * [::1] (any case), bare or with the port 8470 — nothing else, so no
 * other name reaches the API. */
#include <ctype.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "http/hosts.h"

static bool default_form(const char *v, size_t n)
{
    static const char *const names[] = {"localhost", "127.0.0.1", "[::1]"};
    for (size_t i = 0; i < 3; i++) {
        size_t l = strlen(names[i]);
        if (n < l)
            continue;
        bool same = true;
        for (size_t k = 0; k < l; k++)
            same = same && tolower((unsigned char)v[k]) == names[i][k];
        if (same && (n == l || (n == l + 5 && !memcmp(v + l, ":8470", 5))))
            return true;
    }
    return false;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nl = memchr(data, '\n', size);
    size_t first = nl ? (size_t)(nl - data) : size;
    char *allowed = malloc(first + 1);
    /* the value in a buffer of its exact size: ASan sees any overread */
    size_t vlen = nl ? size - first - 1 : 0;
    char *value = malloc(vlen ? vlen : 1);
    if (!allowed || !value)
        abort();
    memcpy(allowed, data, first);
    allowed[first] = '\0';
    if (vlen)
        memcpy(value, nl + 1, vlen);
    tv_error err = {0};
    tv__http_hosts *h = NULL;
    int rc = tv__http_hosts_make(strlen(allowed) == first ? allowed : "", "127.0.0.1:8470",
                                 "node-a.example:9000", &h, &err);
    if (rc != 0 && rc != TV_E_INVALID_ARG)
        abort();
    if (!rc) {
        (void)tv__http_host_allowed(h, value, vlen, 8470);
        tv__http_hosts_free(h);
    }
    if (tv__http_hosts_make(NULL, "127.0.0.1:8470", NULL, &h, &err))
        abort();
    if (tv__http_host_allowed(h, value, vlen, 8470) && !default_form(value, vlen))
        abort();
    tv__http_hosts_free(h);
    free(allowed);
    free(value);
    return 0;
}
