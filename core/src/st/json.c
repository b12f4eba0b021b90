/* JSON front door for untrusted headers and index files: a byte pre-scan
 * (first byte, UTF-8, nesting depth) followed by jansson with duplicate-key
 * rejection. Invariant: nothing deeper than TV_ST_MAX_DEPTH and nothing that
 * is not valid UTF-8 ever reaches jansson. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "st/st_internal.h"

/* jansson allocates every node separately, and freeing a 120k-tensor tree
 * costs more than parsing it. While this thread parses a header, jansson's
 * allocations come from a bump arena released in one go. The hooks are
 * process-wide (json_set_alloc_funcs) but fall through to malloc/free for
 * every other thread and for this thread outside a parse, so other jansson
 * users in the process are unaffected. */
typedef struct arena_chunk {
    struct arena_chunk *next;
    size_t used, cap;
    max_align_t data[];
} arena_chunk;

typedef struct tv__arena {
    arena_chunk *head;
    size_t next_cap;
} tv__arena;

static _Thread_local tv__arena *tl_arena;

static void *arena_alloc(tv__arena *a, size_t n)
{
    n = (n + sizeof(max_align_t) - 1) & ~(sizeof(max_align_t) - 1);
    arena_chunk *c = a->head;
    if (!c || c->cap - c->used < n) {
        size_t cap = a->next_cap;
        while (cap < n)
            cap *= 2;
        c = malloc(sizeof(*c) + cap);
        if (!c)
            return NULL;
        c->next = a->head;
        c->used = 0;
        c->cap = cap;
        a->head = c;
        if (a->next_cap < ((size_t)64 << 20))
            a->next_cap *= 2;
    }
    void *p = (char *)c->data + c->used;
    c->used += n;
    return p;
}

static bool arena_owns(const tv__arena *a, const void *p)
{
    for (const arena_chunk *c = a->head; c; c = c->next)
        if ((const char *)p >= (const char *)c->data && (const char *)p < (const char *)c->data + c->cap)
            return true;
    return false;
}

static void *hook_malloc(size_t n)
{
    return tl_arena ? arena_alloc(tl_arena, n) : malloc(n);
}

static void hook_free(void *p)
{
    if (p && !(tl_arena && arena_owns(tl_arena, p)))
        free(p);
}

static void install_hooks(void)
{
    json_set_alloc_funcs(hook_malloc, hook_free);
}

void *tv__json_arena_begin(size_t hint)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, install_hooks);
    tv__arena *a = calloc(1, sizeof(*a));
    if (!a)
        return NULL;
    a->next_cap = hint < 65536 ? 65536 : hint;
    tl_arena = a;
    return a;
}

void tv__json_arena_reset(void *arena)
{
    tv__arena *a = arena;
    if (!a || !a->head)
        return;
    /* Keep the newest (largest) chunk, drop the rest. */
    arena_chunk *keep = a->head;
    for (arena_chunk *c = keep->next, *n; c; c = n) {
        n = c->next;
        free(c);
    }
    keep->next = NULL;
    keep->used = 0;
}

void tv__json_arena_end(void *arena)
{
    tv__arena *a = arena;
    if (!a)
        return;
    if (tl_arena == a)
        tl_arena = NULL;
    for (arena_chunk *c = a->head, *n; c; c = n) {
        n = c->next;
        free(c);
    }
    free(a);
}

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
