/* The Hugging Face sharded layout: model.safetensors.index.json names the
 * shard of every tensor (weight_map); the shards sit beside it. Also where a
 * file named inside a checkpoint directory may resolve to.
 *
 * Invariants: shard paths named by an index are checked lexically (not
 * absolute, no "..", backslash or NUL) and then by real path: they resolve
 * inside the index's directory, or, in a Hugging Face hub cache snapshot
 * (models--ORG--NAME/snapshots/REV/), the entry is itself a symlink to a
 * regular file directly in models--ORG--NAME/blobs/ (a blobs directory that
 * is a symlink elsewhere, a link to a directory or outside the repository's
 * blobs is refused); a shard keeps the name the index gives it (the link
 * name), never the blob's. After a successful open every tensor is in
 * exactly one shard and listed in the index under that shard. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "st/dirrules.h"
#include "st/st_internal.h"
#include "util/endian.h"
#include "util/sys.h"

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
                          "index: weight_map is missing or not an object");
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
        /* The shard parser's name rules, so an index cannot name what no
         * shard may hold. */
        if (klen == 0) {
            rc = tv__seterr(err, TV_E_ST_NAME_EMPTY, "index: weight_map has an empty tensor name");
            goto fail;
        }
        if (memchr(key, '\0', klen)) {
            rc = tv__seterr(err, TV_E_ST_NUL,
                            "index: weight_map tensor name '%s' holds a NUL (\\u0000) at byte %zu",
                            key, strlen(key));
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

/* Integers above INT64_MAX (a huge metadata.total_size, which is never
 * enforced) are legal JSON that jansson cannot hold as integers: such a
 * document is read again with every integer as a real, so it is accepted
 * and the number is only not reported. */
static int load_index_json(const char *buf, size_t len, json_t **root, tv_error *err)
{
    int rc = tv__json_prescan(buf, len, false, "index", err);
    if (rc)
        return rc == TV_E_ST_HEADER_START ? TV_E_IDX_JSON : rc;
    json_error_t je;
    *root = json_loadb(buf, len, JSON_ALLOW_NUL | JSON_REJECT_DUPLICATES, &je);
    if (!*root && json_error_code(&je) == json_error_numeric_overflow)
        return tv__json_load(buf, len, JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL, TV_E_IDX_JSON,
                             "index", root, err);
    if (!*root)
        return tv__json_load(buf, len, JSON_ALLOW_NUL, TV_E_IDX_JSON, "index", root, err);
    return 0;
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
    int fd = tv__sys_open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC, 0);
    if (fd < 0)
        return tv__seterr(err, fd, "cannot open %s: %s", path, strerror(-fd));
    struct stat st;
    if (tv__sys.fstat(fd, &st) < 0) {
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
    tv__sys.close(fd);
    return rc;
}

/* metadata.total_size is reported, never enforced (producers disagree on
 * it): only a number in [0, INT64_MAX] is reported; anything else (absent,
 * negative, huge, not a number) is accepted and not reported. */
static void read_total_size(tv_checkpoint *ck, json_t *root)
{
    json_t *meta = json_object_get(root, "metadata");
    json_t *ts = json_is_object(meta) ? json_object_get(meta, "total_size") : NULL;
    if (json_is_integer(ts) && json_integer_value(ts) >= 0) {
        ck->has_total_size = true;
        ck->total_size = (uint64_t)json_integer_value(ts);
    } else if (json_is_real(ts) && json_real_value(ts) >= 0 &&
               json_real_value(ts) < 9223372036854775808.0) {
        ck->has_total_size = true;
        ck->total_size = (uint64_t)json_real_value(ts);
    }
}

/* Reads, parses and validates the index file (file: its resolved path);
 * ck->index_path becomes dir/name, the path it was named by. */
static int load_index_file(tv_checkpoint *ck, const char *dir, const char *name, const char *file,
                           json_t **root, const char ***shards, size_t *n_shards, tv_error *err)
{
    int rc;
    char *buf = NULL;
    size_t len = 0;
    size_t n = strlen(dir) + 1 + strlen(name) + 1;
    if (!(ck->index_path = malloc(n)))
        return tv__seterr(err, -ENOMEM, "out of memory");
    snprintf(ck->index_path, n, "%s/%s", strcmp(dir, "/") == 0 ? "" : dir, name);
    if ((rc = read_small_file(file, ck->max_header_len, &buf, &len, err)))
        return rc;
    if ((rc = load_index_json(buf, len, root, err)))
        goto out;
    rc = validate_index(*root, ck->max_shards, shards, n_shards, NULL, err);
out:
    free(buf);
    return rc;
}

/* ---- where a named file may resolve to ---- */

static bool path_inside(const char *path, const char *dir)
{
    size_t dlen = strlen(dir);
    return strncmp(path, dir, dlen) == 0 && (path[dlen] == '/' || strcmp(dir, "/") == 0);
}

/* If real_dir lies in a Hugging Face hub cache snapshot,
 * <repo>/snapshots/<rev>[/...] with <repo> named models--ORG--NAME, writes
 * <repo>/blobs to blobs and returns true. */
static bool hub_blobs_dir(const char *real_dir, char *blobs, size_t blobs_len)
{
    static const char snap[] = "/snapshots/";
    for (const char *p = strstr(real_dir, snap); p; p = strstr(p + 1, snap)) {
        const char *repo = p;
        while (repo > real_dir && repo[-1] != '/')
            repo--;
        size_t repo_len = (size_t)(p - repo);
        if (repo_len > strlen("models--") && strncmp(repo, "models--", 8) == 0 &&
            p[sizeof(snap) - 1] != '\0' && p[sizeof(snap) - 1] != '/')
            return (size_t)snprintf(blobs, blobs_len, "%.*s/blobs", (int)(p - real_dir), real_dir) <
                   blobs_len;
    }
    return false;
}

/* Why the hub cache's own indirection does not excuse an entry that left
 * real_dir (to real), or NULL when it does (dirrules.h). */
static const char *hub_link_refusal(const char *real_dir, const char *real, bool is_link,
                                    const char *real_parent, bool is_reg)
{
    char blobs[PATH_MAX];
    if (!hub_blobs_dir(real_dir, blobs, sizeof(blobs)))
        return "not in a Hugging Face cache snapshot";
    if (!is_link)
        return "not itself a link into the cache's blobs";
    if (!real_parent || (strcmp(real_parent, real_dir) != 0 && !path_inside(real_parent, real_dir)))
        return "its directory leaves the snapshot";
    size_t blen = strlen(blobs);
    if (strncmp(real, blobs, blen) != 0 || real[blen] != '/' || strchr(real + blen + 1, '/'))
        return "the link leaves the repository's blobs directory";
    if (!is_reg)
        return "the blob is not a regular file";
    return NULL;
}

int tv__st_check_entry(const char *real_dir, const char *name, const char *what, const char *real,
                       bool is_link, const char *real_parent, bool is_reg, tv_error *err)
{
    if (path_inside(real, real_dir))
        return 0;
    const char *why = hub_link_refusal(real_dir, real, is_link, real_parent, is_reg);
    if (why)
        return tv__seterr(err, TV_E_IDX_SHARD_ESCAPE,
                          "%s '%s' resolves to %s, outside the directory %s (%s)", what, name, real,
                          real_dir, why);
    return 0;
}

int tv__st_resolve_in_dir(const char *real_dir, const char *name, const char *what, char *real,
                          tv_error *err)
{
    char path[PATH_MAX], parent[PATH_MAX], real_parent[PATH_MAX];
    struct stat st;
    if ((size_t)snprintf(path, sizeof(path), "%s/%s", strcmp(real_dir, "/") == 0 ? "" : real_dir,
                         name) >= sizeof(path))
        return tv__seterr(err, -ENAMETOOLONG, "%s '%s': path too long", what, name);
    if (!realpath(path, real))
        return tv__seterr(err, -errno, "%s '%s': %s", what, name, strerror(errno));
    if (path_inside(real, real_dir))
        return 0;
    bool is_link = lstat(path, &st) == 0 && S_ISLNK(st.st_mode);
    snprintf(parent, sizeof(parent), "%s", path);
    *strrchr(parent, '/') = '\0';
    bool parent_ok = realpath(parent, real_parent) != NULL;
    bool is_reg = stat(real, &st) == 0 && S_ISREG(st.st_mode);
    return tv__st_check_entry(real_dir, name, what, real, is_link, parent_ok ? real_parent : NULL,
                              is_reg, err);
}

static int parse_index_shards(tv_checkpoint *ck, const char *real_dir, const char **shards,
                              size_t n_shards, tv_error *err)
{
    int rc;
    char real_shard[PATH_MAX];
    for (size_t i = 0; i < n_shards; i++) {
        if ((rc = tv__st_resolve_in_dir(real_dir, shards[i], "shard", real_shard, err)))
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
            return tv__seterr(
                err, TV_E_IDX_MISSING_TENSOR,
                "tensor '%s' is listed in the index under shard '%s' but is missing from it", key,
                want);
        const char *have = ck->strings + ck->shards[ck->tensors[idx].shard].name_off;
        if (strcmp(have, want) != 0)
            return tv__seterr(
                err, TV_E_IDX_MISSING_TENSOR,
                "tensor '%s' is listed in the index under shard '%s' but is missing from it (found in shard '%s')",
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

int tv__st_open_index(tv_checkpoint *ck, const char *real_dir, const char *name, const char *file,
                      tv_error *err)
{
    int rc;
    json_t *root = NULL;
    const char **shards = NULL;
    size_t n_shards = 0;
    if ((rc = load_index_file(ck, real_dir, name, file, &root, &shards, &n_shards, err)))
        goto out;
    read_total_size(ck, root);
    if ((rc = parse_index_shards(ck, real_dir, shards, n_shards, err)))
        goto out;
    if ((rc = tv__st_finish(ck, err)))
        goto out;
    rc = cross_check(ck, root, err);
out:
    free(shards);
    json_decref(root);
    return rc;
}

/* ---- a checkpoint read through caller callbacks (tv_checkpoint_open_io) ---- */

#define IO_PATH_MAX 4096

/* One shard through io: its length, the 8-byte prefix, then the header. */
static int parse_shard_io(tv_checkpoint *ck, const tv_checkpoint_io *io, const char *name,
                          tv_error *err)
{
    char path[IO_PATH_MAX];
    uint64_t file_len = 0;
    unsigned char prefix[8];
    char *hdr = NULL;
    int rc;
    path[0] = '\0';
    if ((rc = io->stat(io->ctx, name, &file_len, path, sizeof(path), err)))
        return rc;
    if (file_len < 8)
        return tv__seterr(err, TV_E_FILE_SHORT,
                          "shard '%s': file is %llu bytes, shorter than the 8-byte length prefix",
                          name, (unsigned long long)file_len);
    if ((rc = io->read(io->ctx, name, prefix, 8, 0, err)))
        return rc;
    uint64_t n = tv__le64_get(prefix);
    if (n == 0 || n > ck->max_header_len || n > file_len - 8)
        return tv__st_parse_header(ck, NULL, n, file_len, name, path[0] ? path : NULL, err);
    if (!(hdr = malloc((size_t)n)))
        return tv__seterr(err, -ENOMEM, "shard '%s': out of memory for a %llu-byte header", name,
                          (unsigned long long)n);
    if (!(rc = io->read(io->ctx, name, hdr, (size_t)n, 8, err)))
        rc = tv__st_parse_header(ck, hdr, n, file_len, name, path[0] ? path : NULL, err);
    free(hdr);
    return rc;
}

static int open_index_io(tv_checkpoint *ck, const tv_checkpoint_io *io, const char *name,
                         tv_error *err)
{
    char path[IO_PATH_MAX];
    uint64_t len = 0;
    char *buf = NULL;
    json_t *root = NULL;
    const char **shards = NULL;
    size_t n_shards = 0;
    int rc;
    path[0] = '\0';
    if ((rc = io->stat(io->ctx, name, &len, path, sizeof(path), err)))
        return rc;
    if (len > ck->max_header_len)
        return tv__seterr(err, TV_E_ST_HEADER_TOO_LARGE,
                          "index %s is %llu bytes, over the limit %llu", path[0] ? path : name,
                          (unsigned long long)len, (unsigned long long)ck->max_header_len);
    if (!(ck->index_path = strdup(path[0] ? path : name)) ||
        !(buf = malloc(len ? (size_t)len : 1))) {
        rc = tv__seterr(err, -ENOMEM, "out of memory");
        goto out;
    }
    if ((rc = io->read(io->ctx, name, buf, (size_t)len, 0, err)) ||
        (rc = load_index_json(buf, (size_t)len, &root, err)) ||
        (rc = validate_index(root, ck->max_shards, &shards, &n_shards, NULL, err)))
        goto out;
    read_total_size(ck, root);
    for (size_t i = 0; i < n_shards && !rc; i++)
        rc = parse_shard_io(ck, io, shards[i], err);
    if (!rc && !(rc = tv__st_finish(ck, err)))
        rc = cross_check(ck, root, err);
out:
    free(shards);
    free(buf);
    json_decref(root);
    return rc;
}

TV_API int tv_checkpoint_open_io(const tv_checkpoint_io *io, const char *name, bool is_index,
                                 const tv_st_limits *lim, tv_checkpoint **out, tv_error *err)
{
    int rc;
    if (!out)
        return tv__seterr(err, TV_E_INVALID_ARG, "NULL argument");
    *out = NULL;
    if (!io || !io->stat || !io->read || !name)
        return tv__seterr(err, TV_E_INVALID_ARG, "NULL argument");
    tv_checkpoint *ck = tv__checkpoint_new(lim);
    if (!ck)
        return tv__seterr(err, -ENOMEM, "out of memory");
    if (is_index)
        rc = open_index_io(ck, io, name, err);
    else if (!(rc = parse_shard_io(ck, io, name, err)))
        rc = tv__st_finish(ck, err);
    if (rc) {
        tv_checkpoint_close(ck);
        return rc;
    }
    *out = ck;
    return 0;
}
