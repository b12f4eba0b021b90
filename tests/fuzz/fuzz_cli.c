/* libFuzzer target: the CLI's value parsers (server/cli/args.c) on arbitrary
 * bytes, the input cut at its first NUL as argv would be.
 * Invariants: every parser returns 0 or its documented negative code, never
 * aborts or reads past the string; whatever one accepts prints back to text
 * that the parser reads again as the same value (generation, NAME@GEN and a
 * list exactly as given; a size and rows in canonical decimal). */
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"

static void check_gen(const char *s)
{
    int64_t g = 0;
    char back[32];
    int rc = tv__cli_parse_gen(s, &g);
    if (rc != 0 && rc != -EINVAL && rc != -ERANGE)
        abort();
    if (rc)
        return;
    snprintf(back, sizeof back, "%" PRId64, g);
    if (g < 1 || strcmp(back, s)) /* no sign, space or leading zero accepted */
        abort();
}

static void check_spec(const char *s)
{
    char name[64], back[160];
    const char *gs = NULL;
    int64_t g = -1;
    int rc = tv__cli_parse_spec(s, name, sizeof name, &g, &gs);
    const char *at = strrchr(s, '@');
    if (gs != (at ? at + 1 : NULL) && !(rc == -EINVAL && !gs))
        abort();
    if (rc != 0 && rc != -EINVAL && rc != -ERANGE)
        abort();
    if (rc)
        return;
    if (at)
        snprintf(back, sizeof back, "%s@%" PRId64, name, g);
    else
        snprintf(back, sizeof back, "%s", name);
    if (!*name || strlen(name) >= sizeof name || (at ? g < 1 : g != 0) || strcmp(back, s))
        abort();
}

static void check_uint(const char *s)
{
    uint64_t v = 0, again = 0;
    char back[32];
    int rc = tv__cli_parse_uint(s, UINT64_MAX, &v);
    if (rc != 0 && rc != -EINVAL && rc != -ERANGE)
        abort();
    if (rc)
        return;
    snprintf(back, sizeof back, "%" PRIu64, v);
    if (tv__cli_parse_uint(back, UINT64_MAX, &again) || again != v)
        abort();
    /* A bound below the value is -ERANGE, never a silent clamp. */
    if (v > 0 && tv__cli_parse_uint(s, v - 1, &again) != -ERANGE)
        abort();
}

static void check_rows(const char *s)
{
    uint64_t r0 = 0, r1 = 0, a0 = 0, a1 = 0;
    char back[48];
    int rc = tv__cli_parse_rows(s, &r0, &r1);
    if (rc != 0 && rc != -EINVAL && rc != -ERANGE && rc != -EDOM)
        abort();
    if (rc)
        return;
    snprintf(back, sizeof back, "%" PRIu64 ":%" PRIu64, r0, r1);
    if (r0 > r1 || tv__cli_parse_rows(back, &a0, &a1) || a0 != r0 || a1 != r1)
        abort();
    /* The bounds swapped are refused unless equal. */
    snprintf(back, sizeof back, "%" PRIu64 ":%" PRIu64, r1, r0);
    if ((tv__cli_parse_rows(back, &a0, &a1) == -EDOM) != (r0 != r1))
        abort();
}

static void check_size(const char *s)
{
    uint64_t v = 0, again = 0;
    char back[32];
    int rc = tv__cli_parse_size(s, &v);
    if (rc != 0 && rc != -EINVAL && rc != -ERANGE)
        abort();
    if (rc)
        return;
    snprintf(back, sizeof back, "%" PRIu64, v);
    if (tv__cli_parse_size(back, &again) || again != v)
        abort();
    /* The same size in KiB parses to the same bytes. */
    if (v % 1024 == 0) {
        snprintf(back, sizeof back, "%" PRIu64 "KiB", v / 1024);
        if (tv__cli_parse_size(back, &again) || again != v)
            abort();
    }
}

static void check_list(const char *s)
{
    char buf[64], back[64];
    const char *items[8];
    const char *why = NULL;
    size_t n = 99, off = 0;
    int rc = tv__cli_parse_list(s, buf, sizeof buf, items, 8, &n, &why);
    if (!why)
        abort();
    if (rc != 0 && rc != -EINVAL && rc != -ERANGE)
        abort();
    if (rc) {
        if (!*why) /* every refusal names its reason */
            abort();
        return;
    }
    if (n < 1 || n > 8)
        abort();
    for (size_t k = 0; k < n; k++) {
        if (!*items[k] || strchr(items[k], ',') || items[k] < buf || items[k] >= buf + sizeof buf)
            abort();
        for (size_t j = 0; j < k; j++)
            if (!strcmp(items[j], items[k]))
                abort();
        off += (size_t)snprintf(back + off, sizeof back - off, "%s%s", k ? "," : "", items[k]);
    }
    if (strcmp(back, s))
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* An exact-size copy, so that ASan sees a read past the terminator. */
    const uint8_t *nul = memchr(data, 0, size);
    size_t len = nul ? (size_t)(nul - data) : size;
    char *s = malloc(len + 1);
    if (!s)
        return 0;
    memcpy(s, data, len);
    s[len] = '\0';
    check_gen(s);
    check_spec(s);
    check_uint(s);
    check_rows(s);
    check_size(s);
    check_list(s);
    free(s);
    return 0;
}
