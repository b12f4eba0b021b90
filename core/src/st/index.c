/* The Hugging Face sharded layout: model.safetensors.index.json names the
 * shard of every tensor (weight_map); the shards sit beside it.
 *
 * Invariants: shard paths named by an index are checked lexically (not
 * absolute, no "..", backslash or NUL) and then by real path (they must
 * resolve inside the index's directory, so a symlink cannot escape); after a
 * successful open every tensor is in exactly one shard and listed in the
 * index under that shard. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "st/st_internal.h"

/* Lexical shard-name rules of the index. */
static int check_shard_name(const char *s, size_t len, tv_error *err)
{
    const char *why = NULL;
    if (len == 0)
        why = "is empty";
    else if (s[0] == '/')
        why = "is absolute";
    else if (memchr(s, '\0', len))
        why = "contains NUL";
    else if (memchr(s, '\\', len))
        why = "contains a backslash";
    else if (strstr(s, ".."))
        why = "contains '..'";
    if (why)
        return tv__seterr(err, TV_E_IDX_SHARD_NAME, "index: shard name '%.*s' %s", (int)len, s,
                          why);
    return 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Validates the index document; fills a sorted, de-duplicated array of shard
 * names (pointers into root) when shards_out is non-NULL. */
static int validate_index(json_t *root, uint32_t max_shards, const char ***shards_out,
                          size_t *n_shards, size_t *n_tensors, tv_error *err)
{
    json_t *wm = json_is_object(root) ? json_object_get(root, "weight_map") : NULL;
    if (!json_is_object(wm))
        return tv__seterr(err, TV_E_IDX_WEIGHT_MAP,
                          "index: weight_map is missing or not an "
                          "object");
    size_t n = json_object_size(wm);
    const char **names = malloc(sizeof(*names) * (n ? n : 1));
    if (!names)
        return tv__seterr(err, -ENOMEM, "out of memory");
    size_t k = 0;
    const char *key;
    size_t klen;
    json_t *val;
    int rc = 0;
    json_object_keylen_foreach(wm, key, klen, val)
    {
        if (memchr(key, '\0', klen)) {
            rc = tv__seterr(err, TV_E_IDX_WEIGHT_MAP, "index: weight_map key contains NUL");
            goto fail;
        }
        if (!json_is_string(val)) {
            rc = tv__seterr(err, TV_E_IDX_WEIGHT_MAP,
                            "index: weight_map value for tensor '%s' is not a string", key);
            goto fail;
        }
        if ((rc = check_shard_name(json_string_value(val), json_string_length(val), err)))
            goto fail;
        names[k++] = json_string_value(val);
    }
    qsort(names, k, sizeof(*names), cmp_str);
    size_t u = 0;
    for (size_t i = 0; i < k; i++)
        if (u == 0 || strcmp(names[u - 1], names[i]) != 0)
            names[u++] = names[i];
    if (u > max_shards) {
        rc = tv__seterr(err, TV_E_IDX_TOO_MANY_SHARDS, "index: %zu shards, over the limit %u", u,
                        max_shards);
        goto fail;
    }
    if (n_shards)
        *n_shards = u;
    if (n_tensors)
        *n_tensors = n;
    if (shards_out) {
        *shards_out = names;
        return 0;
    }
fail:
    free(names);
    return rc;
}

static int load_index_json(const char *buf, size_t len, json_t **root, tv_error *err)
{
    int rc = tv__json_prescan(buf, len, false, "index", err);
    if (rc)
        return rc == TV_E_ST_HEADER_START ? TV_E_IDX_JSON : rc;
    return tv__json_load(buf, len, JSON_ALLOW_NUL, TV_E_IDX_JSON, "index", root, err);
}

TV_API int tv_index_validate_buffer(const void *buf, size_t len, const tv_st_limits *lim,
                                    size_t *n_shards, size_t *n_tensors, tv_error *err)
{
    json_t *root = NULL;
    if (!buf && len)
        return tv__seterr(err, TV_E_INVALID_ARG, "NULL buffer");
    int rc = load_index_json(buf, len, &root, err);
    if (rc)
        return rc;
    uint32_t max = lim && lim->max_shards ? lim->max_shards : TV_ST_DEFAULT_MAX_SHARDS;
    rc = validate_index(root, max, NULL, n_shards, n_tensors, err);
    json_decref(root);
    return rc;
}

static int read_small_file(const char *path, uint64_t max, char **out, size_t *len, tv_error *err)
{
    int rc = 0;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return tv__seterr(err, -errno, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) < 0) {
        rc = tv__seterr(err, -errno, "stat %s: %s", path, strerror(errno));
        goto out;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = tv__seterr(err, -EINVAL, "%s is not a regular file", path);
        goto out;
    }
    if ((uint64_t)st.st_size > max) {
        rc = tv__seterr(err, TV_E_ST_HEADER_TOO_LARGE, "%s is %lld bytes, over the limit %llu",
                        path, (long long)st.st_size, (unsigned long long)max);
        goto out;
    }
    *len = (size_t)st.st_size;
    *out = malloc(*len ? *len : 1);
    if (!*out) {
        rc = tv__seterr(err, -ENOMEM, "out of memory");
        goto out;
    }
    if ((rc = tv__st_read_exact(fd, *out, *len, 0))) {
        free(*out);
        *out = NULL;
        tv__seterr(err, rc, "read %s: %s", path, tv_strerror(rc));
    }
out:
    close(fd);
    return rc;
}

/* metadata.total_size, when it is a non-negative number: reported, never
 * enforced (producers disagree on it). */
static void read_total_size(tv_checkpoint *ck, json_t *root)
{
    json_t *meta = json_object_get(root, "metadata");
    json_t *ts = json_is_object(meta) ? json_object_get(meta, "total_size") : NULL;
    if (json_is_integer(ts) && json_integer_value(ts) >= 0) {
        ck->has_total_size = true;
        ck->total_size = (uint64_t)json_integer_value(ts);
    } else if (json_is_real(ts) && json_real_value(ts) >= 0 && json_real_value(ts) < 1.8e19) {
        ck->has_total_size = true;
        ck->total_size = (uint64_t)json_real_value(ts);
    }
}

/* Reads, parses and validates the index file; ck->index_path becomes its
 * real path. */
static int load_index_file(tv_checkpoint *ck, const char *index_path, json_t **root,
                           const char ***shards, size_t *n_shards, tv_error *err)
{
    int rc;
    char *buf = NULL;
    size_t len = 0;
    char real[PATH_MAX];
    if (!realpath(index_path, real))
        return tv__seterr(err, -errno, "index %s: %s", index_path, strerror(errno));
    if (!(ck->index_path = strdup(real)))
        return tv__seterr(err, -ENOMEM, "out of memory");
    if ((rc = read_small_file(ck->index_path, ck->max_header_len, &buf, &len, err)))
        return rc;
    if ((rc = load_index_json(buf, len, root, err)))
        goto out;
    rc = validate_index(*root, ck->max_shards, shards, n_shards, NULL, err);
out:
    free(buf);
    return rc;
}

/* Real path of the directory holding the index (ck->index_path). */
static int index_real_dir(const tv_checkpoint *ck, char *real_dir, tv_error *err)
{
    int rc = 0;
    char *dir = strdup(ck->index_path);
    if (!dir)
        return tv__seterr(err, -ENOMEM, "out of memory");
    char *slash = strrchr(dir, '/');
    if (slash == dir)
        slash[1] = '\0';
    else if (slash)
        *slash = '\0';
    if (!realpath(dir, real_dir))
        rc = tv__seterr(err, -errno, "index directory %s: %s", dir, strerror(errno));
    free(dir);
    return rc;
}

/* Resolves shard name inside real_dir; the result must stay inside it. */
static int resolve_shard(const char *real_dir, const char *name, char *real_shard, tv_error *err)
{
    char shard_path[PATH_MAX];
    size_t dlen = strlen(real_dir);
    if ((size_t)snprintf(shard_path, sizeof(shard_path), "%s/%s", real_dir, name) >=
        sizeof(shard_path))
        return tv__seterr(err, -ENAMETOOLONG, "shard '%s': path too long", name);
    if (!realpath(shard_path, real_shard))
        return tv__seterr(err, -errno, "shard '%s': %s", name, strerror(errno));
    bool inside = strncmp(real_shard, real_dir, dlen) == 0 &&
                  (real_shard[dlen] == '/' || (dlen == 1 && real_dir[0] == '/'));
    if (!inside)
        return tv__seterr(err, TV_E_IDX_SHARD_ESCAPE,
                          "shard '%s' resolves to %s, outside the index directory %s", name,
                          real_shard, real_dir);
    return 0;
}

static int parse_index_shards(tv_checkpoint *ck, const char **shards, size_t n_shards,
                              tv_error *err)
{
    int rc;
    char real_dir[PATH_MAX], real_shard[PATH_MAX];
    if ((rc = index_real_dir(ck, real_dir, err)))
        return rc;
    for (size_t i = 0; i < n_shards; i++) {
        if ((rc = resolve_shard(real_dir, shards[i], real_shard, err)))
            return rc;
        if ((rc = tv__st_parse_shard_file(ck, real_shard, shards[i], err)))
            return rc;
    }
    return 0;
}

/* Every listed tensor is in the shard it is listed under, and every tensor
 * found is listed. */
static int cross_check(const tv_checkpoint *ck, json_t *root, tv_error *err)
{
    json_t *wm = json_object_get(root, "weight_map");
    const char *key;
    json_t *val;
    json_object_foreach(wm, key, val)
    {
        size_t idx;
        const char *want = json_string_value(val);
        if (tv_checkpoint_find(ck, key, strlen(key), &idx) != 0)
            return tv__seterr(err, TV_E_IDX_MISSING_TENSOR,
                              "tensor '%s' is listed in the index under shard '%s' but is "
                              "missing from it",
                              key, want);
        const char *have = ck->strings + ck->shards[ck->tensors[idx].shard].name_off;
        if (strcmp(have, want) != 0)
            return tv__seterr(err, TV_E_IDX_MISSING_TENSOR,
                              "tensor '%s' is listed in the index under shard '%s' but is "
                              "missing from it (found in shard '%s')",
                              key, want, have);
    }
    if (json_object_size(wm) == ck->n_tensors)
        return 0;
    for (size_t i = 0; i < ck->n_tensors; i++) {
        const char *tn = ck->strings + ck->tensors[i].name_off;
        if (!json_object_get(wm, tn))
            return tv__seterr(err, TV_E_IDX_UNLISTED_TENSOR,
                              "tensor '%s' in shard '%s' is not listed in the index", tn,
                              ck->strings + ck->shards[ck->tensors[i].shard].name_off);
    }
    return tv__seterr(err, TV_E_INTERNAL, "index and shards disagree on the tensor count");
}

int tv__st_open_index(tv_checkpoint *ck, const char *index_path, tv_error *err)
{
    int rc;
    json_t *root = NULL;
    const char **shards = NULL;
    size_t n_shards = 0;
    if ((rc = load_index_file(ck, index_path, &root, &shards, &n_shards, err)))
        goto out;
    read_total_size(ck, root);
    if ((rc = parse_index_shards(ck, shards, n_shards, err)))
        goto out;
    if ((rc = tv__st_finish(ck, err)))
        goto out;
    rc = cross_check(ck, root, err);
out:
    free(shards);
    json_decref(root);
    return rc;
}
