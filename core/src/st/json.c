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
                          "%s does not start with '{' (first byte 0x%02x)", what, len ? p[0] : 0);
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
        enum json_error_code jc = json_error_code(&je);
        int code = jc == json_error_duplicate_key      ? TV_E_ST_DUPLICATE_KEY
                   : jc == json_error_null_byte_in_key ? TV_E_ST_NUL
                                                       : json_code;
        return tv__seterr(err, code, "%s byte %d (line %d, column %d): %s", what, je.position,
                          je.line, je.column, je.text);
    }
    *out = root;
    return 0;
}

/* ---- the object walker: members of one object without building a tree ---- */

static bool is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static size_t skip_ws(const char *buf, size_t len, size_t i)
{
    while (i < len && is_ws(buf[i]))
        i++;
    return i;
}

/* End (one past) of the JSON string token starting at buf[i] == '"'. The
 * pre-scan already proved the header is valid UTF-8; jansson validates the
 * escapes when it decodes the token. Returns 0 if unterminated. */
static size_t string_end(const char *buf, size_t len, size_t i)
{
    for (i++; i < len; i++) {
        if (buf[i] == '\\')
            i++;
        else if (buf[i] == '"')
            return i + 1;
    }
    return 0;
}

/* End (one past) of the JSON value starting at buf[i]: the first ',' or '}'
 * at nesting depth 0 outside strings (trailing whitespace excluded). */
static size_t value_end(const char *buf, size_t len, size_t i)
{
    int depth = 0;
    size_t last = i;
    for (; i < len; i++) {
        char c = buf[i];
        if (c == '"') {
            size_t e = string_end(buf, len, i);
            if (!e)
                return len;
            i = e - 1;
            last = e;
            continue;
        }
        if (c == '{' || c == '[')
            depth++;
        else if (c == '}' || c == ']') {
            if (depth == 0)
                return last;
            depth--;
        } else if (c == ',' && depth == 0) {
            return last;
        }
        if (!is_ws(c))
            last = i + 1;
    }
    return last;
}

static int json_syntax(tv_error *err, const char *what, size_t pos, const char *expect)
{
    return tv__seterr(err, TV_E_ST_JSON, "%s byte %zu: %s expected", what, pos, expect);
}

int tv__json_load_part(const char *buf, size_t b, size_t e, const char *what, json_t **out,
                       tv_error *err)
{
    json_error_t je;
    *out =
        json_loadb(buf + b, e - b, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &je);
    if (*out)
        return 0;
    enum json_error_code jc = json_error_code(&je);
    int code = jc == json_error_duplicate_key      ? TV_E_ST_DUPLICATE_KEY
               : jc == json_error_numeric_overflow ? TV_E_ST_INT_RANGE
               : jc == json_error_null_byte_in_key ? TV_E_ST_NUL
                                                   : TV_E_ST_JSON;
    return tv__seterr(err, code, "%s byte %zu: %s", what, b + (size_t)je.position, je.text);
}

void tv__json_walk_init(tv__json_walk *w, const char *buf, size_t len, const char *what)
{
    w->buf = buf;
    w->len = len;
    w->i = skip_ws(buf, len, 1);
    w->first = true;
    w->done = false;
    w->what = what;
}

/* After a member (or at the start): ',' then the next key, or the closing
 * '}' and nothing but whitespace to the end. Returns 1 when a key follows,
 * 0 at the end, or TV_E_ST_JSON. */
static int walk_separator(tv__json_walk *w, tv_error *err)
{
    const char *buf = w->buf;
    size_t len = w->len;
    if (w->first) {
        if (w->i < len && buf[w->i] == '}') {
            w->i++;
            goto closed;
        }
        return 1;
    }
    w->i = skip_ws(buf, len, w->i);
    if (w->i < len && buf[w->i] == ',') {
        w->i = skip_ws(buf, len, w->i + 1);
        return 1;
    }
    if (w->i < len && buf[w->i] == '}') {
        w->i++;
        goto closed;
    }
    return json_syntax(err, w->what, w->i, "',' or '}'");
closed:
    w->i = skip_ws(buf, len, w->i);
    if (w->i != len)
        return json_syntax(err, w->what, w->i, "end of header after the top-level object");
    w->done = true;
    return 0;
}

int tv__json_walk_next(tv__json_walk *w, tv__json_member *m, tv_error *err)
{
    const char *buf = w->buf;
    size_t len = w->len;
    if (w->done)
        return 0;
    int rc = walk_separator(w, err);
    if (rc <= 0)
        return rc;
    size_t i = w->i;
    if (i >= len || buf[i] != '"')
        return json_syntax(err, w->what, i, w->first ? "a key or '}'" : "a key");
    size_t ke = string_end(buf, len, i);
    if (!ke)
        return json_syntax(err, w->what, i, "a terminated string");
    m->key_begin = i;
    m->key_end = ke;
    i = skip_ws(buf, len, ke);
    if (i >= len || buf[i] != ':')
        return json_syntax(err, w->what, i, "':'");
    i = skip_ws(buf, len, i + 1);
    size_t ve = value_end(buf, len, i);
    if (ve <= i)
        return json_syntax(err, w->what, i, "a value");
    m->value_begin = i;
    m->value_end = ve;
    w->i = ve;
    w->first = false;
    return 1;
}

bool tv__json_find_minus(const char *buf, size_t b, size_t e, size_t *pos)
{
    if (!memchr(buf + b, '-', e - b))
        return false;
    for (size_t i = b; i < e; i++) {
        if (buf[i] == '"') {
            size_t se = string_end(buf, e, i);
            if (!se)
                return false;
            i = se - 1;
        } else if (buf[i] == '-') {
            *pos = i;
            return true;
        }
    }
    return false;
}
