/* Sidecar files (source.h): the name rules, the caps and the in-memory set
 * a source fills, and the dispatch of tv__src_sidecars to the source's kind.
 *
 * Invariants: a set holds only paths that passed tv__sidecar_path_valid,
 * each once; its total_len is the sum of its files' lengths and never
 * passes the total cap; a file over the per-file cap is never copied, only
 * listed as skipped. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "import/source.h"
#include "util/hex.h"
#include "util/sha256.h"

const char *const tv__sidecar_well_known[] = {
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "preprocessor_config.json",
    "chat_template.jinja",
    NULL,
};

int tv__sidecar_path_valid(const char *path, tv_error *err)
{
    if (!path || !*path)
        return tv__seterr(err, TV_E_BAD_REQUEST, "a sidecar file with an empty name");
    size_t n = strlen(path);
    if (n > TV__SIDECAR_PATH_MAX)
        return tv__seterr(err, TV_E_BAD_REQUEST, "sidecar file name '%.64s...' is over %d bytes",
                          path, TV__SIDECAR_PATH_MAX);
    if (path[0] == '/')
        return tv__seterr(err, TV_E_BAD_REQUEST, "sidecar file name '%s' is an absolute path",
                          path);
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)path[i];
        if (ch < 0x20 || ch == 0x7f)
            return tv__seterr(
                err, TV_E_BAD_REQUEST,
                "sidecar file name '%.*s' has a control character (byte 0x%02x at %zu)", (int)i,
                path, ch, i);
        if (ch == '\\')
            return tv__seterr(err, TV_E_BAD_REQUEST, "sidecar file name '%s' has a backslash",
                              path);
    }
    for (const char *c = path;;) {
        const char *e = strchr(c, '/');
        size_t l = e ? (size_t)(e - c) : strlen(c);
        if (l == 0)
            return tv__seterr(err, TV_E_BAD_REQUEST,
                              "sidecar file name '%s' has an empty component", path);
        if ((l == 1 && c[0] == '.') || (l == 2 && c[0] == '.' && c[1] == '.'))
            return tv__seterr(err, TV_E_BAD_REQUEST,
                              "sidecar file name '%s' has a '.' or '..' component", path);
        if (!e)
            break;
        c = e + 1;
    }
    return 0;
}

static bool ends_with(const char *s, const char *suf)
{
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && strcmp(s + n - m, suf) == 0;
}

bool tv__sidecar_excluded(const char *path)
{
    static const char *const weights[] = {".safetensors", ".safetensors.index.json",
                                          ".bin",         ".pt",
                                          ".pth",         ".ckpt",
                                          ".h5",          ".msgpack",
                                          ".onnx",        ".gguf"};
    if (path[0] == '.' || strstr(path, "/."))
        return true;
    for (size_t i = 0; i < sizeof(weights) / sizeof(weights[0]); i++)
        if (ends_with(path, weights[i]))
            return true;
    return false;
}

int tv__sidecars_skip(tv__sidecars *set, const char *path, const char *why)
{
    if (set->n_skipped == set->cap_skipped) {
        size_t cap = set->cap_skipped ? 2 * set->cap_skipped : 8;
        char **ns = realloc(set->skipped, cap * sizeof(*ns));
        if (!ns)
            return -ENOMEM;
        set->skipped = ns;
        set->cap_skipped = cap;
    }
    char *line;
    if (asprintf(&line, "skipped: %s (%s)", path, why) < 0)
        return -ENOMEM;
    set->skipped[set->n_skipped++] = line;
    return 0;
}

int tv__sidecars_add(tv__sidecars *set, const tv__sidecar_caps *caps, const char *path,
                     const void *data, size_t len, tv_error *err)
{
    uint64_t max = caps && caps->max_len ? caps->max_len : TV__SIDECAR_DEFAULT_MAX;
    uint64_t total = caps && caps->total_len ? caps->total_len : TV__SIDECAR_DEFAULT_TOTAL;
    int rc;
    if ((rc = tv__sidecar_path_valid(path, err)))
        return rc;
    for (size_t i = 0; i < set->n; i++)
        if (!strcmp(set->files[i].path, path))
            return tv__seterr(err, TV_E_BAD_REQUEST, "sidecar file '%s' given twice", path);
    if (len > max) {
        char why[96];
        snprintf(why, sizeof why, "%zu bytes > %llu", len, (unsigned long long)max);
        return tv__sidecars_skip(set, path, why) ? tv__seterr(err, -ENOMEM, "out of memory") : 0;
    }
    uint64_t sum;
    if (tv__add_u64(set->total_len, len, &sum) || sum > total)
        return tv__seterr(
            err, TV_E_TOO_LARGE,
            "the checkpoint's sidecar files pass import.sidecar_total_bytes (%llu bytes) at '%s' (%zu bytes, %llu before it)",
            (unsigned long long)total, path, len, (unsigned long long)set->total_len);
    if (set->n >= TV__SIDECAR_MAX_FILES)
        return tv__seterr(err, TV_E_TOO_LARGE, "more than %d sidecar files", TV__SIDECAR_MAX_FILES);
    if (set->n == set->cap) {
        size_t cap = set->cap ? 2 * set->cap : 16;
        tv__sidecar *nf = realloc(set->files, cap * sizeof(*nf));
        if (!nf)
            return tv__seterr(err, -ENOMEM, "out of memory");
        set->files = nf;
        set->cap = cap;
    }
    tv__sidecar *f = &set->files[set->n];
    memset(f, 0, sizeof(*f));
    f->path = strdup(path);
    f->data = malloc(len ? len : 1);
    if (!f->path || !f->data) {
        free(f->path);
        free(f->data);
        return tv__seterr(err, -ENOMEM, "out of memory");
    }
    if (len)
        memcpy(f->data, data, len);
    f->len = len;
    if (tv__sha256_hex(f->data, len, f->sha256)) {
        free(f->path);
        free(f->data);
        return tv__seterr(err, -ENOMEM, "out of memory");
    }
    set->total_len = sum;
    set->n++;
    return 0;
}

static int by_path(const void *a, const void *b)
{
    return strcmp(((const tv__sidecar *)a)->path, ((const tv__sidecar *)b)->path);
}

void tv__sidecars_sort(tv__sidecars *set)
{
    if (set->n > 1)
        qsort(set->files, set->n, sizeof(*set->files), by_path);
}

void tv__sidecars_clear(tv__sidecars *set)
{
    if (!set)
        return;
    for (size_t i = 0; i < set->n; i++) {
        free(set->files[i].path);
        free(set->files[i].data);
    }
    for (size_t i = 0; i < set->n_skipped; i++)
        free(set->skipped[i]);
    free(set->files);
    free(set->skipped);
    memset(set, 0, sizeof(*set));
}
