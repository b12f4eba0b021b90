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
    ck->max_header_len =
        lim && lim->max_header_len ? lim->max_header_len : TV_ST_DEFAULT_MAX_HEADER_LEN;
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

/* __metadata__: a string-to-string object, or null (the official loader's
 * Option: no metadata). NUL in a key or value is refused: the accessors hand
 * out C strings, which would silently cut it short. */
static int parse_metadata(tv_checkpoint *ck, tv__shard *sh, json_t *meta, const char *name,
                          tv_error *err)
{
    sh->meta_seen = true;
    if (json_is_null(meta))
        return 0;
    if (!json_is_object(meta))
        return tv__seterr(err, TV_E_ST_METADATA, "shard '%s': __metadata__ is not an object", name);
    const char *key;
    size_t klen;
    json_t *val;
    sh->first_meta = ck->n_meta / 2;
    json_object_keylen_foreach(meta, key, klen, val)
    {
        if (!json_is_string(val))
            return tv__seterr(err, TV_E_ST_METADATA,
                              "shard '%s': __metadata__ value of '%s' is not a string", name, key);
        if (memchr(key, '\0', klen) ||
            memchr(json_string_value(val), '\0', json_string_length(val)))
            return tv__seterr(err, TV_E_ST_NUL,
                              "shard '%s': __metadata__ entry '%s' holds a NUL (\\u0000) in its %s",
                              name, key, memchr(key, '\0', klen) ? "key" : "value");
        uint32_t ko, vo;
        if (tv__strings_add(ck, key, klen, &ko) ||
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

/* A tensor name the store can hold: not empty, no NUL (registry names are
 * TEXT, the API hands out C strings). */
static int check_tensor_name(const char *k, size_t klen, const char *name, tv_error *err)
{
    if (klen == 0)
        return tv__seterr(err, TV_E_ST_NAME_EMPTY,
                          "shard '%s': a tensor has an empty name (the registry needs a name)",
                          name);
    if (memchr(k, '\0', klen))
        return tv__seterr(err, TV_E_ST_NUL,
                          "shard '%s': tensor name '%s' holds a NUL (\\u0000) at byte %zu", name, k,
                          strlen(k));
    return 0;
}

/* The official parser reads shape and data_offsets as unsigned integers and
 * refuses -0 (serde_json sees a float); jansson reads it as 0. The decoded
 * entry cannot tell, so the entry's text is searched: every number in a
 * valid entry is a non-negative integer, so any '-' outside strings is -0.
 * Returns 0, TV_E_ST_SHAPE or TV_E_ST_OFFSETS (by the member it sits in). */
static int check_negative_zero(const char *hdr, const tv__json_member *ent, const char *what,
                               const char *name, const char *key, tv_error *err)
{
    size_t pos;
    if (!tv__json_find_minus(hdr, ent->value_begin, ent->value_end, &pos))
        return 0;
    bool in_shape = false;
    tv__json_walk w;
    tv__json_member m;
    tv__json_walk_init(&w, hdr + ent->value_begin, ent->value_end - ent->value_begin, what);
    while (tv__json_walk_next(&w, &m, NULL) == 1) {
        if (pos < ent->value_begin + m.value_begin || pos >= ent->value_begin + m.value_end)
            continue;
        json_t *k = NULL;
        if (tv__json_load_part(hdr + ent->value_begin, m.key_begin, m.key_end, what, &k, NULL) == 0)
            in_shape = strcmp(json_string_value(k), "shape") == 0;
        json_decref(k);
        break;
    }
    return tv__seterr(err, in_shape ? TV_E_ST_SHAPE : TV_E_ST_OFFSETS,
                      "shard '%s': tensor '%s': %s holds -0 at header byte %zu", name, key,
                      in_shape ? "shape" : "data_offsets", pos);
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
        return tv__seterr(err, TV_E_ST_DTYPE, "shard '%s': tensor '%s': unknown dtype %s%s%s", name,
                          key, json_is_string(jd) ? "'" : "",
                          json_is_string(jd) ? json_string_value(jd) : "(not a string)",
                          json_is_string(jd) ? "'" : "");
    if (!json_is_array(js))
        return tv__seterr(err, TV_E_ST_SHAPE, "shard '%s': tensor '%s': shape is not a list", name,
                          key);
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
        if (!ovf)
            ovf = tv__mul_u64(n_elem, dim, &n_elem);
    }
    /* The product is checked step by step in shape order, as the official
     * loader does: [2^32, 2^32, 0] overflows before the zero is reached. */
    uint64_t n_bits;
    if (ovf || tv__mul_u64(n_elem, tv_dtype_bits(dt), &n_bits))
        return tv__seterr(err, TV_E_ST_OVERFLOW,
                          "shard '%s': tensor '%s': element count x dtype bits overflows", name,
                          key);
    uint64_t begin, end;
    if (!json_is_array(jo) || json_array_size(jo) != 2 || !get_u64(json_array_get(jo, 0), &begin) ||
        !get_u64(json_array_get(jo, 1), &end))
        return tv__seterr(
            err, TV_E_ST_OFFSETS,
            "shard '%s': tensor '%s': data_offsets is not [BEGIN, END] of non-negative integers",
            name, key);
    if (end < begin)
        return tv__seterr(err, TV_E_ST_OFFSETS, "shard '%s': tensor '%s': END %llu < BEGIN %llu",
                          name, key, (unsigned long long)end, (unsigned long long)begin);
    if (n_bits % 8 != 0)
        return tv__seterr(
            err, TV_E_ST_LENGTH,
            "shard '%s': tensor '%s': %llu elements of %s are %llu bits, not a whole number of bytes",
            name, key, (unsigned long long)n_elem, tv_dtype_name(dt), (unsigned long long)n_bits);
    if (end - begin != n_bits / 8)
        return tv__seterr(
            err, TV_E_ST_LENGTH,
            "shard '%s': tensor '%s': data_offsets span %llu bytes but shape x %s needs %llu", name,
            key, (unsigned long long)(end - begin), tv_dtype_name(dt),
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
            return tv__seterr(
                err, TV_E_ST_OVERLAP,
                "shard '%s': tensor '%s' [%llu, %llu) overlaps tensor '%s' ending at %llu", name,
                tn, (unsigned long long)ts[i].begin, (unsigned long long)ts[i].end, prev,
                (unsigned long long)expect);
        if (ts[i].begin > expect)
            return tv__seterr(
                err, TV_E_ST_HOLE,
                "shard '%s': hole of %llu bytes at data offset %llu before tensor '%s'", name,
                (unsigned long long)(ts[i].begin - expect), (unsigned long long)expect, tn);
        expect = ts[i].end;
        prev = tn;
        if (expect > data_len)
            return tv__seterr(
                err, TV_E_ST_TRUNCATED,
                "shard '%s': tensor '%s' ends at data offset %llu but the data section holds %llu bytes",
                name, tn, (unsigned long long)expect, (unsigned long long)data_len);
    }
    if (expect < data_len)
        return tv__seterr(err, TV_E_ST_TRAILING,
                          "shard '%s': %llu unindexed bytes after data offset %llu", name,
                          (unsigned long long)(data_len - expect), (unsigned long long)expect);
    return 0;
}

/* Framing checks on N before the header is touched; sets *data_len. */
static int check_framing(const tv_checkpoint *ck, uint64_t hdr_len, uint64_t file_len,
                         const char *name, uint64_t *data_len, tv_error *err)
{
    uint64_t data_off;
    if (hdr_len == 0)
        return tv__seterr(err, TV_E_ST_HEADER_EMPTY, "shard '%s': header length is 0", name);
    if (hdr_len > ck->max_header_len)
        return tv__seterr(err, TV_E_ST_HEADER_TOO_LARGE,
                          "shard '%s': header length %llu over the limit %llu", name,
                          (unsigned long long)hdr_len, (unsigned long long)ck->max_header_len);
    if (tv__add_u64(8, hdr_len, &data_off) || data_off > file_len)
        return tv__seterr(
            err, TV_E_ST_HEADER_PAST_EOF,
            "shard '%s': header of %llu bytes extends past the end of the %llu-byte file", name,
            (unsigned long long)hdr_len, (unsigned long long)file_len);
    *data_len = file_len - data_off;
    return 0;
}

/* Appends an empty shard record (tensors follow); *idx is its index. */
static int add_shard(tv_checkpoint *ck, const char *name, const char *path, uint64_t file_len,
                     uint64_t hdr_len, uint32_t *idx, tv_error *err)
{
    if (ck->n_shards >= UINT32_MAX || GROW(ck->shards, ck->cap_shards, ck->n_shards + 1))
        return tv__seterr(err, -ENOMEM, "out of memory");
    tv__shard *sh = &ck->shards[ck->n_shards];
    memset(sh, 0, sizeof(*sh));
    if (tv__strings_add(ck, name, strlen(name), &sh->name_off) ||
        tv__strings_add(ck, path ? path : name, strlen(path ? path : name), &sh->path_off))
        return tv__seterr(err, -ENOMEM, "out of memory");
    sh->file_len = file_len;
    sh->header_len = hdr_len;
    sh->first_tensor = ck->n_tensors;
    *idx = (uint32_t)ck->n_shards;
    return 0;
}

/* Decodes one value of the header. A number jansson cannot hold (above
 * INT64_MAX) is TV_E_ST_INT_RANGE naming the tensor (TV_E_ST_METADATA in
 * __metadata__, which holds only strings); NUL in a nested key is
 * TV_E_ST_NUL naming the member. */
static int load_value(const char *hdr, const tv__json_member *m, const char *what, const char *name,
                      const char *key, json_t **val, tv_error *err)
{
    int rc = tv__json_load_part(hdr, m->value_begin, m->value_end, what, val, err);
    if (rc != TV_E_ST_INT_RANGE && rc != TV_E_ST_NUL)
        return rc;
    char why[sizeof(err->msg)];
    snprintf(why, sizeof(why), "%s", err ? err->msg : "");
    bool meta = strcmp(key, "__metadata__") == 0;
    if (rc == TV_E_ST_NUL)
        return tv__seterr(err, rc, "shard '%s': %s%s%s: NUL (\\u0000) in a key (%s)", name,
                          meta ? "" : "tensor '", meta ? "__metadata__" : key, meta ? "" : "'",
                          why);
    if (meta)
        return tv__seterr(err, TV_E_ST_METADATA, "shard '%s': __metadata__: %s", name, why);
    return tv__seterr(err, rc, "shard '%s': tensor '%s': integer above INT64_MAX (%s)", name, key,
                      why);
}

/* One top-level member: decodes key and value and files it as the shard's
 * __metadata__ or as a tensor. */
static int parse_member(tv_checkpoint *ck, uint32_t shard_idx, const char *hdr,
                        const tv__json_member *m, const char *what, const char *name, tv_error *err)
{
    int rc;
    json_t *key = NULL, *val = NULL;
    tv__shard *sh = &ck->shards[shard_idx];
    if ((rc = tv__json_load_part(hdr, m->key_begin, m->key_end, what, &key, err)))
        goto out;
    const char *k = json_string_value(key);
    size_t klen = json_string_length(key);
    bool is_meta = strcmp(k, "__metadata__") == 0 && klen == strlen("__metadata__");
    if (!is_meta && (rc = check_tensor_name(k, klen, name, err)))
        goto out;
    if ((rc = load_value(hdr, m, what, name, k, &val, err)))
        goto out;
    if (is_meta) {
        if (sh->meta_seen) {
            rc = tv__seterr(err, TV_E_ST_DUPLICATE_KEY,
                            "%s byte %zu: duplicate object key '__metadata__'", what,
                            m->value_begin);
            goto out;
        }
        rc = parse_metadata(ck, sh, val, name, err);
    } else if (!(rc = parse_tensor(ck, k, val, shard_idx, name, err))) {
        rc = check_negative_zero(hdr, m, what, name, k, err);
    }
out:
    json_decref(key);
    json_decref(val);
    return rc;
}

/* The header is parsed entry by entry: json.c walks the top-level object's
 * punctuation and jansson decodes every key and value. Parsing a 120k-tensor
 * header as one tree takes ~10x its size in scattered nodes and scales
 * worse than linearly; entry by entry the working set stays in cache (and
 * each entry's few nodes are freed at once, so malloc's caches serve them).
 * Top-level duplicate keys are caught by the name index. */
static int parse_members(tv_checkpoint *ck, uint32_t shard_idx, const char *hdr, size_t len,
                         const char *what, const char *name, tv_error *err)
{
    tv__json_walk w;
    tv__json_member m;
    int rc;
    tv__json_walk_init(&w, hdr, len, what);
    while ((rc = tv__json_walk_next(&w, &m, err)) == 1)
        if ((rc = parse_member(ck, shard_idx, hdr, &m, what, name, err)))
            return rc;
    return rc;
}

/* The shard's tensors are complete: check the tiling and count it in. */
static int finish_shard(tv_checkpoint *ck, uint32_t shard_idx, uint64_t data_len, const char *name,
                        tv_error *err)
{
    int rc;
    tv__shard *sh = &ck->shards[shard_idx];
    sh->n_tensors = ck->n_tensors - sh->first_tensor;
    if ((rc = check_tiling(ck, sh, data_len, name, err)))
        return rc;
    for (size_t t = sh->first_tensor; t < ck->n_tensors; t++)
        ck->total_bytes += ck->tensors[t].end - ck->tensors[t].begin;
    ck->n_shards++;
    return 0;
}

int tv__st_parse_header(tv_checkpoint *ck, const char *hdr, uint64_t hdr_len, uint64_t file_len,
                        const char *name, const char *path, tv_error *err)
{
    int rc;
    uint64_t data_len = 0;
    uint32_t shard_idx = 0;
    if ((rc = check_framing(ck, hdr_len, file_len, name, &data_len, err)))
        return rc;
    char what[300];
    snprintf(what, sizeof(what), "shard '%s': header", name);
    if ((rc = tv__json_prescan(hdr, hdr_len, true, what, err)))
        return rc;
    if ((rc = add_shard(ck, name, path, file_len, hdr_len, &shard_idx, err)))
        return rc;
    if ((rc = parse_members(ck, shard_idx, hdr, (size_t)hdr_len, what, name, err)))
        return rc;
    return finish_shard(ck, shard_idx, data_len, name, err);
}
