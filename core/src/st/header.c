/* One safetensors shard header: parse, validate every entry, and check that
 * the tensors tile the data section exactly.
 *
 * Invariants: on failure nothing of the shard stays in the checkpoint (the
 * caller discards the whole checkpoint); every product and sum on element
 * counts, bit counts and offsets is overflow-checked; sub-byte tensors must
 * still occupy a whole number of bytes. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "st/st_internal.h"

static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t ncap = *cap ? *cap : 16;
    while (ncap < need) {
        if (__builtin_mul_overflow(ncap, (size_t)2, &ncap))
            return -ENOMEM;
    }
    size_t bytes;
    if (__builtin_mul_overflow(ncap, elem, &bytes))
        return -ENOMEM;
    void *np = realloc(*p, bytes);
    if (!np)
        return -ENOMEM;
    *p = np;
    *cap = ncap;
    return 0;
}
#define GROW(arr, cap, need) grow((void **)&(arr), &(cap), (need), sizeof(*(arr)))

int tv__strings_add(tv_checkpoint *ck, const char *s, size_t len, uint32_t *off)
{
    size_t need;
    if (__builtin_add_overflow(ck->n_strings, len + 1, &need) || need > UINT32_MAX)
        return -ENOMEM;
    if (GROW(ck->strings, ck->cap_strings, need))
        return -ENOMEM;
    memcpy(ck->strings + ck->n_strings, s, len);
    ck->strings[ck->n_strings + len] = '\0';
    *off = (uint32_t)ck->n_strings;
    ck->n_strings = need;
    return 0;
}

tv_checkpoint *tv__checkpoint_new(const tv_st_limits *lim)
{
    tv_checkpoint *ck = calloc(1, sizeof(*ck));
    if (!ck)
        return NULL;
    ck->max_header_len = lim && lim->max_header_len ? lim->max_header_len
                                                    : TV_ST_DEFAULT_MAX_HEADER_LEN;
    ck->max_shards = lim && lim->max_shards ? lim->max_shards : TV_ST_DEFAULT_MAX_SHARDS;
    return ck;
}

/* Reads a JSON integer that must be a non-negative int64. */
static bool get_u64(const json_t *v, uint64_t *out)
{
    if (!json_is_integer(v))
        return false;
    json_int_t x = json_integer_value(v);
    if (x < 0)
        return false;
    *out = (uint64_t)x;
    return true;
}

static int parse_metadata(tv_checkpoint *ck, tv__shard *sh, json_t *meta, const char *name,
                          tv_error *err)
{
    if (!json_is_object(meta))
        return tv__seterr(err, TV_E_ST_METADATA, "shard '%s': __metadata__ is not an object",
                          name);
    const char *key;
    json_t *val;
    sh->first_meta = ck->n_meta / 2;
    json_object_foreach(meta, key, val)
    {
        if (!json_is_string(val))
            return tv__seterr(err, TV_E_ST_METADATA,
                              "shard '%s': __metadata__ value of '%s' is not a string", name, key);
        uint32_t ko, vo;
        if (tv__strings_add(ck, key, strlen(key), &ko) ||
            tv__strings_add(ck, json_string_value(val), json_string_length(val), &vo) ||
            GROW(ck->meta, ck->cap_meta, ck->n_meta + 2))
            return tv__seterr(err, -ENOMEM, "out of memory");
        ck->meta[ck->n_meta++] = ko;
        ck->meta[ck->n_meta++] = vo;
        sh->n_meta++;
    }
    sh->has_meta = true;
    return 0;
}

static int parse_tensor(tv_checkpoint *ck, const char *key, json_t *ent, uint32_t shard_idx,
                        const char *name, tv_error *err)
{
    json_t *jd = NULL, *js = NULL, *jo = NULL;
    if (json_is_object(ent) && json_object_size(ent) == 3) {
        jd = json_object_get(ent, "dtype");
        js = json_object_get(ent, "shape");
        jo = json_object_get(ent, "data_offsets");
    }
    if (!jd || !js || !jo)
        return tv__seterr(err, TV_E_ST_TENSOR_FIELDS,
                          "shard '%s': tensor '%s' must have exactly dtype, shape, data_offsets",
                          name, key);
    tv_dtype dt;
    if (!json_is_string(jd) ||
        tv_dtype_from_name(json_string_value(jd), json_string_length(jd), &dt))
        return tv__seterr(err, TV_E_ST_DTYPE, "shard '%s': tensor '%s': unknown dtype %s%s%s",
                          name, key, json_is_string(jd) ? "'" : "",
                          json_is_string(jd) ? json_string_value(jd) : "(not a string)",
                          json_is_string(jd) ? "'" : "");
    if (!json_is_array(js))
        return tv__seterr(err, TV_E_ST_SHAPE, "shard '%s': tensor '%s': shape is not a list",
                          name, key);
    size_t rank = json_array_size(js);
    if (rank > TV_ST_MAX_RANK)
        return tv__seterr(err, TV_E_ST_RANK, "shard '%s': tensor '%s': rank %zu over the limit %d",
                          name, key, rank, TV_ST_MAX_RANK);
    if (GROW(ck->dims, ck->cap_dims, ck->n_dims + rank) ||
        GROW(ck->tensors, ck->cap_tensors, ck->n_tensors + 1))
        return tv__seterr(err, -ENOMEM, "out of memory");
    uint64_t n_elem = 1;
    bool ovf = false;
    for (size_t d = 0; d < rank; d++) {
        uint64_t dim;
        if (!get_u64(json_array_get(js, d), &dim))
            return tv__seterr(err, TV_E_ST_SHAPE,
                              "shard '%s': tensor '%s': shape[%zu] is not a non-negative integer",
                              name, key, d);
        ck->dims[ck->n_dims + d] = dim;
        ovf |= tv__mul_u64(n_elem, dim, &n_elem);
    }
    /* A zero dimension makes the product 0 whatever overflowed before it. */
    for (size_t d = 0; d < rank; d++)
        if (ck->dims[ck->n_dims + d] == 0)
            ovf = false, n_elem = 0;
    uint64_t n_bits;
    if (ovf || tv__mul_u64(n_elem, tv_dtype_bits(dt), &n_bits))
        return tv__seterr(err, TV_E_ST_OVERFLOW,
                          "shard '%s': tensor '%s': element count x dtype bits overflows", name,
                          key);
    uint64_t begin, end;
    if (!json_is_array(jo) || json_array_size(jo) != 2 || !get_u64(json_array_get(jo, 0), &begin) ||
        !get_u64(json_array_get(jo, 1), &end))
        return tv__seterr(err, TV_E_ST_OFFSETS,
                          "shard '%s': tensor '%s': data_offsets is not [BEGIN, END] of "
                          "non-negative integers",
                          name, key);
    if (end < begin)
        return tv__seterr(err, TV_E_ST_OFFSETS,
                          "shard '%s': tensor '%s': END %llu < BEGIN %llu", name, key,
                          (unsigned long long)end, (unsigned long long)begin);
    if (n_bits % 8 != 0)
        return tv__seterr(err, TV_E_ST_LENGTH,
                          "shard '%s': tensor '%s': %llu elements of %s are %llu bits, not a "
                          "whole number of bytes",
                          name, key, (unsigned long long)n_elem, tv_dtype_name(dt),
                          (unsigned long long)n_bits);
    if (end - begin != n_bits / 8)
        return tv__seterr(err, TV_E_ST_LENGTH,
                          "shard '%s': tensor '%s': data_offsets span %llu bytes but shape x %s "
                          "needs %llu",
                          name, key, (unsigned long long)(end - begin), tv_dtype_name(dt),
                          (unsigned long long)(n_bits / 8));
    tv__tensor *t = &ck->tensors[ck->n_tensors];
    memset(t, 0, sizeof(*t));
    size_t klen = strlen(key);
    if (klen > UINT32_MAX || tv__strings_add(ck, key, klen, &t->name_off))
        return tv__seterr(err, -ENOMEM, "out of memory");
    t->name_len = (uint32_t)klen;
    t->dims_off = (uint32_t)ck->n_dims;
    t->rank = (uint16_t)rank;
    t->dtype = (uint8_t)dt;
    t->shard = shard_idx;
    t->begin = begin;
    t->end = end;
    t->n_elements = n_elem;
    ck->n_dims += rank;
    ck->n_tensors++;
    return 0;
}

static int cmp_range(const void *a, const void *b)
{
    const tv__tensor *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return 0;
}

/* Sorted ranges must tile [0, data_len) exactly. */
static int check_tiling(tv_checkpoint *ck, tv__shard *sh, uint64_t data_len, const char *name,
                        tv_error *err)
{
    /* A shard may hold no tensors (only __metadata__, or {}), and then
     * ck->tensors can still be NULL: no arithmetic on it, no qsort. */
    tv__tensor *ts = NULL;
    if (sh->n_tensors) {
        ts = ck->tensors + sh->first_tensor;
        qsort(ts, sh->n_tensors, sizeof(*ts), cmp_range);
    }
    uint64_t expect = 0;
    const char *prev = NULL;
    for (size_t i = 0; i < sh->n_tensors; i++) {
        const char *tn = ck->strings + ts[i].name_off;
        if (ts[i].begin < expect)
            return tv__seterr(err, TV_E_ST_OVERLAP,
                              "shard '%s': tensor '%s' [%llu, %llu) overlaps tensor '%s' ending "
                              "at %llu",
                              name, tn, (unsigned long long)ts[i].begin,
                              (unsigned long long)ts[i].end, prev, (unsigned long long)expect);
        if (ts[i].begin > expect)
            return tv__seterr(err, TV_E_ST_HOLE,
                              "shard '%s': hole of %llu bytes at data offset %llu before tensor "
                              "'%s'",
                              name, (unsigned long long)(ts[i].begin - expect),
                              (unsigned long long)expect, tn);
        expect = ts[i].end;
        prev = tn;
        if (expect > data_len)
            return tv__seterr(err, TV_E_ST_TRUNCATED,
                              "shard '%s': tensor '%s' ends at data offset %llu but the data "
                              "section holds %llu bytes",
                              name, tn, (unsigned long long)expect, (unsigned long long)data_len);
    }
    if (expect < data_len)
        return tv__seterr(err, TV_E_ST_TRAILING,
                          "shard '%s': %llu unindexed bytes after data offset %llu", name,
                          (unsigned long long)(data_len - expect), (unsigned long long)expect);
    return 0;
}

static bool is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
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

/* Loads one token or value [b, e) of the header with jansson, reporting
 * errors at their header offset. */
static int load_part(const char *hdr, size_t b, size_t e, const char *what, json_t **out,
                     tv_error *err)
{
    json_error_t je;
    *out = json_loadb(hdr + b, e - b, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &je);
    if (*out)
        return 0;
    int code = json_error_code(&je) == json_error_duplicate_key ? TV_E_ST_DUPLICATE_KEY
                                                                : TV_E_ST_JSON;
    return tv__seterr(err, code, "%s byte %zu: %s", what, b + (size_t)je.position, je.text);
}

/* The header is parsed entry by entry: this file walks the top-level object's
 * punctuation and jansson decodes every key and value. Parsing a 120k-tensor
 * header as one tree takes ~10x its size in scattered nodes and scales
 * worse than linearly; entry by entry the working set stays in cache (and
 * each entry's few nodes are freed at once, so malloc's caches serve them).
 * Top-level duplicate keys are caught by the name index. */
int tv__st_parse_header(tv_checkpoint *ck, const char *hdr, uint64_t hdr_len, uint64_t file_len,
                        const char *name, const char *path, tv_error *err)
{
    int rc;
    json_t *key = NULL, *val = NULL;
    uint64_t data_off, data_len;
    if (hdr_len == 0)
        return tv__seterr(err, TV_E_ST_HEADER_EMPTY, "shard '%s': header length is 0", name);
    if (hdr_len > ck->max_header_len)
        return tv__seterr(err, TV_E_ST_HEADER_TOO_LARGE,
                          "shard '%s': header length %llu over the limit %llu", name,
                          (unsigned long long)hdr_len, (unsigned long long)ck->max_header_len);
    if (tv__add_u64(8, hdr_len, &data_off) || data_off > file_len)
        return tv__seterr(err, TV_E_ST_HEADER_PAST_EOF,
                          "shard '%s': header of %llu bytes extends past the end of the %llu-byte "
                          "file",
                          name, (unsigned long long)hdr_len, (unsigned long long)file_len);
    data_len = file_len - data_off;
    char what[300];
    snprintf(what, sizeof(what), "shard '%s': header", name);
    if ((rc = tv__json_prescan(hdr, hdr_len, true, what, err)))
        return rc;
    if (ck->n_shards >= UINT32_MAX || GROW(ck->shards, ck->cap_shards, ck->n_shards + 1))
        return tv__seterr(err, -ENOMEM, "out of memory");
    uint32_t shard_idx = (uint32_t)ck->n_shards;
    tv__shard *sh = &ck->shards[shard_idx];
    memset(sh, 0, sizeof(*sh));
    if (tv__strings_add(ck, name, strlen(name), &sh->name_off) ||
        tv__strings_add(ck, path ? path : name, strlen(path ? path : name), &sh->path_off))
        return tv__seterr(err, -ENOMEM, "out of memory");
    sh->file_len = file_len;
    sh->header_len = hdr_len;
    sh->first_tensor = ck->n_tensors;

    size_t len = (size_t)hdr_len, i = 1;
    while (i < len && is_ws(hdr[i]))
        i++;
    bool first = true;
    for (;;) {
        if (i < len && hdr[i] == '}' && first) {
            i++;
            break;
        }
        if (i >= len || hdr[i] != '"') {
            rc = json_syntax(err, what, i, first ? "a key or '}'" : "a key");
            goto fail;
        }
        size_t ke = string_end(hdr, len, i);
        if (!ke) {
            rc = json_syntax(err, what, i, "a terminated string");
            goto fail;
        }
        if ((rc = load_part(hdr, i, ke, what, &key, err)))
            goto fail;
        i = ke;
        while (i < len && is_ws(hdr[i]))
            i++;
        if (i >= len || hdr[i] != ':') {
            rc = json_syntax(err, what, i, "':'");
            goto fail;
        }
        i++;
        while (i < len && is_ws(hdr[i]))
            i++;
        size_t ve = value_end(hdr, len, i);
        if (ve <= i) {
            rc = json_syntax(err, what, i, "a value");
            goto fail;
        }
        if ((rc = load_part(hdr, i, ve, what, &val, err)))
            goto fail;
        const char *k = json_string_value(key);
        if (strcmp(k, "__metadata__") == 0) {
            if (sh->has_meta) {
                rc = tv__seterr(err, TV_E_ST_DUPLICATE_KEY,
                                "%s byte %zu: duplicate object key '__metadata__'", what, i);
                goto fail;
            }
            rc = parse_metadata(ck, sh, val, name, err);
        } else {
            rc = parse_tensor(ck, k, val, shard_idx, name, err);
        }
        if (rc)
            goto fail;
        json_decref(key);
        json_decref(val);
        key = val = NULL;
        first = false;
        i = ve;
        while (i < len && is_ws(hdr[i]))
            i++;
        if (i < len && hdr[i] == ',') {
            i++;
            while (i < len && is_ws(hdr[i]))
                i++;
            continue;
        }
        if (i < len && hdr[i] == '}') {
            i++;
            break;
        }
        rc = json_syntax(err, what, i, "',' or '}'");
        goto fail;
    }
    while (i < len && is_ws(hdr[i]))
        i++;
    if (i != len) {
        rc = json_syntax(err, what, i, "end of header after the top-level object");
        goto fail;
    }
    sh->n_tensors = ck->n_tensors - sh->first_tensor;
    if ((rc = check_tiling(ck, sh, data_len, name, err)))
        return rc;
    for (size_t t = sh->first_tensor; t < ck->n_tensors; t++)
        ck->total_bytes += ck->tensors[t].end - ck->tensors[t].begin;
    ck->n_shards++;
    return 0;

fail:
    json_decref(key);
    json_decref(val);
    return rc;
}
