/* GET /v1/shards: which generation holds a file, for loaders that are given
 * the file (the Python package's drop-in safe_open, python/tensorvault/
 * _files.py). The query names the file by what a reader learns without
 * reading it whole: file_len and header_sha256 (of its 8 + N header
 * bytes), and sha256 (of the whole file, e.g. a Hugging Face cache blob's
 * name) or its fstat stamps dev, ino, mtime_ns, ctime_ns (all four); the
 * answer lists the shards of ready generations that are that file
 * (tv__reg_shards_lookup), active generations first.
 *
 * Invariants: only models the peer may read are listed ([access]: a file of
 * a model it may not read is answered like a file no generation holds, an
 * empty list); a file never matches by size and header alone (nor with
 * only some of the four stamps): those name no file, an empty list. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "http/api_internal.h"

static const char *const LOOKUP_Q[] = {"file_len", "header_sha256", "sha256",   "dev",
                                       "ino",      "mtime_ns",      "ctime_ns", NULL};

/* Query parameter name as a decimal integer in [min, max] (optional: *out
 * untouched and *set false when absent). */
static int query_int(tv__api_ctx *c, const char *name, bool negative, uint64_t max, bool *set,
                     uint64_t *mag, bool *neg)
{
    const char *s = tv__api_query(c, name);
    *set = s != NULL;
    *neg = false;
    *mag = 0;
    if (!s)
        return 0;
    const char *p = s;
    if (negative && *p == '-') {
        *neg = true;
        p++;
    }
    size_t n = strlen(p);
    bool ok = n >= 1 && n <= 20 && (n == 1 || p[0] != '0');
    uint64_t v = 0;
    for (size_t i = 0; ok && i < n; i++) {
        unsigned d = (unsigned)(p[i] - '0');
        ok = p[i] >= '0' && p[i] <= '9' && v <= (UINT64_MAX - d) / 10;
        v = v * 10 + d;
    }
    if (!ok || v > max + (*neg ? 1 : 0) || (*neg && v == 0))
        return tv__seterr(&c->err, TV_E_BAD_REQUEST, "bad %s '%.40s': an integer%s", name, s,
                          negative ? "" : " from 0");
    *mag = v;
    return 0;
}

static int query_u64(tv__api_ctx *c, const char *name, bool *set, uint64_t *out)
{
    bool neg;
    return query_int(c, name, false, UINT64_MAX, set, out, &neg);
}

static int query_i64(tv__api_ctx *c, const char *name, bool *set, int64_t *out)
{
    bool neg;
    uint64_t mag;
    int rc = query_int(c, name, true, INT64_MAX, set, &mag, &neg);
    if (!rc)
        *out = neg ? (mag == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)mag) : (int64_t)mag;
    return rc;
}

static json_t *hit_json(const tv__reg_shard_hit *h)
{
    return json_pack("{s:o,s:I,s:b,s:I,s:o,s:s}", "model", tv__api_jstr(h->model), "generation",
                     (json_int_t)h->generation, "active", h->active, "shard", (json_int_t)h->idx,
                     "name", tv__api_jstr(h->name), "sha256", h->sha256);
}

int tv__api_h_shards(tv__api_ctx *c)
{
    tv__reg_shard_query q = {0};
    bool set[5];
    int rc;
    if ((rc = tv__api_query_allow(c, LOOKUP_Q)) ||
        (rc = query_u64(c, "file_len", &set[0], &q.file_len)) ||
        (rc = query_u64(c, "dev", &set[1], &q.stamp.dev)) ||
        (rc = query_u64(c, "ino", &set[2], &q.stamp.ino)) ||
        (rc = query_i64(c, "mtime_ns", &set[3], &q.stamp.mtime_ns)) ||
        (rc = query_i64(c, "ctime_ns", &set[4], &q.stamp.ctime_ns)))
        return rc;
    q.header_sha256_hex = tv__api_query(c, "header_sha256");
    q.sha256_hex = tv__api_query(c, "sha256");
    int n_stamp = set[1] + set[2] + set[3] + set[4];
    if (!set[0] || !q.header_sha256_hex)
        return tv__seterr(&c->err, TV_E_BAD_REQUEST, "file_len and header_sha256 are required");
    if (!tv__reg_sha256_valid(q.header_sha256_hex) ||
        (q.sha256_hex && !tv__reg_sha256_valid(q.sha256_hex)))
        return tv__seterr(&c->err, TV_E_BAD_REQUEST,
                          "header_sha256 and sha256 are 64 lower-case hex digits");
    q.stamp.size = q.file_len;
    q.has_stamp = n_stamp == 4;
    /* Size and header alone, or some of the four stamps, name no file:
     * no shard is that file (an empty list, not an error). */
    if (!q.sha256_hex && !q.has_stamp)
        return tv__api_reply(c, 200, json_pack("{s:[]}", "shards"));
    tv__reg *reg;
    tv__reg_shard_hit *hits = NULL;
    size_t n = 0;
    if (q.file_len > INT64_MAX) /* no shard is that long: the registry holds int64 lengths */
        return tv__api_reply(c, 200, json_pack("{s:[]}", "shards"));
    if ((rc = tv__api_reader(c, &reg)) || (rc = tv__reg_shards_lookup(reg, &q, &hits, &n, &c->err)))
        return rc;
    json_t *arr = json_array();
    for (size_t i = 0; arr && i < n; i++) {
        if (!tv__api_can_read(c, hits[i].model))
            continue;
        if (json_array_append_new(arr, hit_json(&hits[i]))) {
            json_decref(arr);
            arr = NULL;
        }
    }
    free(hits);
    if (!arr)
        return tv__seterr(&c->err, -ENOMEM, "out of memory");
    return tv__api_reply(c, 200, json_pack("{s:o}", "shards", arr));
}
