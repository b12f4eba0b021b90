/* JSON front door for untrusted headers and index files: a byte pre-scan
 * (first byte, UTF-8, nesting depth) followed by jansson with duplicate-key
 * rejection. Invariant: nothing deeper than TV_ST_MAX_DEPTH and nothing that
 * is not valid UTF-8 ever reaches jansson. */
#include <string.h>

#include "st/st_internal.h"

/* Length of the valid UTF-8 sequence at p (1..4), or 0 if invalid. */
static size_t utf8_seq(const unsigned char *p, size_t left)
{
    unsigned c = p[0];
    if (c < 0x80)
        return 1;
    size_t n;
    unsigned min;
    unsigned cp;
    if (c >= 0xC2 && c <= 0xDF) {
        n = 2, min = 0x80, cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
        n = 3, min = 0x800, cp = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4, min = 0x10000, cp = c & 0x07;
    } else {
        return 0;
    }
    if (left < n)
        return 0;
    for (size_t i = 1; i < n; i++) {
        if ((p[i] & 0xC0) != 0x80)
            return 0;
        cp = (cp << 6) | (p[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return n;
}

int tv__json_prescan(const char *buf, size_t len, bool require_brace, const char *what,
                     tv_error *err)
{
    const unsigned char *p = (const unsigned char *)buf;
    if (require_brace && (len == 0 || p[0] != '{'))
        return tv__seterr(err, TV_E_ST_HEADER_START,
                          "%s does not start with '{' (first byte 0x%02x)", what,
                          len ? p[0] : 0);
    bool in_str = false;
    unsigned depth = 0;
    for (size_t i = 0; i < len;) {
        size_t n = utf8_seq(p + i, len - i);
        if (n == 0)
            return tv__seterr(err, TV_E_ST_UTF8, "%s byte %zu: invalid UTF-8 (0x%02x)", what, i,
                              p[i]);
        if (n == 1) {
            unsigned char c = p[i];
            if (in_str) {
                if (c == '\\') {
                    if (i + 1 < len && p[i + 1] < 0x80) {
                        i += 2;
                        continue;
                    }
                } else if (c == '"') {
                    in_str = false;
                }
            } else if (c == '"') {
                in_str = true;
            } else if (c == '{' || c == '[') {
                if (++depth > TV_ST_MAX_DEPTH)
                    return tv__seterr(err, TV_E_ST_TOO_DEEP,
                                      "%s byte %zu: JSON nesting deeper than %d", what, i,
                                      TV_ST_MAX_DEPTH);
            } else if ((c == '}' || c == ']') && depth > 0) {
                depth--;
            }
        }
        i += n;
    }
    return 0;
}

int tv__json_load(const char *buf, size_t len, size_t flags, int json_code, const char *what,
                  json_t **out, tv_error *err)
{
    json_error_t je;
    json_t *root = json_loadb(buf, len, flags | JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        int code = json_error_code(&je) == json_error_duplicate_key ? TV_E_ST_DUPLICATE_KEY
                                                                    : json_code;
        return tv__seterr(err, code, "%s byte %d (line %d, column %d): %s", what, je.position,
                          je.line, je.column, je.text);
    }
    *out = root;
    return 0;
}
