/* Opening a checkpoint from the filesystem: a single shard, a Hugging Face
 * index with its shards, or a directory holding either; and the accessors.
 *
 * Invariants: only headers are read, never tensor data; shard paths named by
 * an index are checked lexically (not absolute, no "..", backslash or NUL)
 * and then by real path (they must resolve inside the index's directory, so
 * a symlink cannot escape); after a successful open every tensor is in
 * exactly one shard and listed in the index under that shard. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "st/st_internal.h"

/* Reads exactly len bytes at off; a short file is -EIO here (callers check
 * sizes first so this only fires when the file shrinks underneath us). */
static int read_exact(int fd, void *buf, size_t len, uint64_t off)
{
    size_t done = 0;
    while (done < len) {
        ssize_t n = pread(fd, (char *)buf + done, len - done, (off_t)(off + done));
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (n == 0)
            return -EIO;
        done += (size_t)n;
    }
    return 0;
}

static int parse_shard_file(tv_checkpoint *ck, const char *path, const char *name, tv_error *err)
{
    int rc;
    char *hdr = NULL;
    /* O_NONBLOCK: opening a FIFO must not hang; it is refused below. It has
     * no effect on regular files. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return tv__seterr(err, -errno, "shard '%s': cannot open %s: %s", name, path,
                          strerror(errno));
    struct stat st;
    if (fstat(fd, &st) < 0) {
        rc = tv__seterr(err, -errno, "shard '%s': stat: %s", name, strerror(errno));
        goto fail_fd;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = tv__seterr(err, -EINVAL, "shard '%s': %s is not a regular file", name, path);
        goto fail_fd;
    }
    uint64_t file_len = (uint64_t)st.st_size;
    unsigned char prefix[8];
    if (file_len < 8) {
        rc = tv__seterr(err, TV_E_FILE_SHORT, "shard '%s': file is %llu bytes, shorter than the "
                        "8-byte length prefix", name, (unsigned long long)file_len);
        goto fail_fd;
    }
    if ((rc = read_exact(fd, prefix, 8, 0))) {
        tv__seterr(err, rc, "shard '%s': read: %s", name, tv_strerror(rc));
        goto fail_fd;
    }
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = (n << 8) | prefix[i];
    /* Size checks happen before allocating so a hostile N cannot make us
     * allocate gigabytes. */
    if (n == 0 || n > ck->max_header_len || n > file_len - 8) {
        rc = tv__st_parse_header(ck, NULL, n, file_len, name, path, err);
        goto fail_fd;
    }
    hdr = malloc(n);
    if (!hdr) {
        rc = tv__seterr(err, -ENOMEM, "shard '%s': out of memory for a %llu-byte header", name,
                        (unsigned long long)n);
        goto fail_fd;
    }
    if ((rc = read_exact(fd, hdr, n, 8))) {
        tv__seterr(err, rc, "shard '%s': read header: %s", name, tv_strerror(rc));
        goto fail_hdr;
    }
    rc = tv__st_parse_header(ck, hdr, n, file_len, name, path, err);
    if (rc == 0) { /* the importer compares these with its own fstat */
        tv__shard *sh = &ck->shards[ck->n_shards - 1];
        sh->dev_id = (uint64_t)st.st_dev;
        sh->inode = (uint64_t)st.st_ino;
        sh->mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
        sh->ctime_ns = (int64_t)st.st_ctim.tv_sec * 1000000000 + st.st_ctim.tv_nsec;
    }
fail_hdr:
    free(hdr);
fail_fd:
    close(fd);
    return rc;
}

static int finish(tv_checkpoint *ck, tv_error *err)
{
    return tv__nameidx_build(ck, err);
}

TV_API void tv_checkpoint_close(tv_checkpoint *ck)
{
    if (!ck)
        return;
    tv__nameidx_free(&ck->idx);
    free(ck->shards);
    free(ck->tensors);
    free(ck->dims);
    free(ck->meta);
    free(ck->strings);
    free(ck->index_path);
    free(ck);
}

TV_API int tv_checkpoint_parse_shard(const void *buf, size_t buf_len, uint64_t file_len,
                                     const char *name, const tv_st_limits *lim,
                                     tv_checkpoint **out, tv_error *err)
{
    int rc;
    if (!out || (!buf && buf_len))
        return tv__seterr(err, TV_E_INVALID_ARG, "NULL argument");
    *out = NULL;
    if (!name)
        name = "(memory)";
    tv_checkpoint *ck = tv__checkpoint_new(lim);
    if (!ck)
        return tv__seterr(err, -ENOMEM, "out of memory");
    if (buf_len < 8 || file_len < 8) {
        rc = tv__seterr(err, TV_E_FILE_SHORT,
                        "shard '%s': shorter than the 8-byte length prefix", name);
        goto fail;
    }
    const unsigned char *p = buf;
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = (n << 8) | p[i];
    /* Lengths of 0, over the limit or past EOF are the header parser's to
     * report (it rejects them before touching the header); only a plausible
     * N that the caller's buffer does not hold is a bad argument. */
    if (n && n <= ck->max_header_len && n <= file_len - 8 && n > buf_len - 8) {
        rc = tv__seterr(err, TV_E_INVALID_ARG,
                        "shard '%s': buffer of %zu bytes does not hold the %llu-byte header", name,
                        buf_len, (unsigned long long)n);
        goto fail;
    }
    if ((rc = tv__st_parse_header(ck, (const char *)p + 8, n, file_len, name, NULL, err)))
        goto fail;
    if ((rc = finish(ck, err)))
        goto fail;
    *out = ck;
    return 0;
fail:
    tv_checkpoint_close(ck);
    return rc;
}

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
        return tv__seterr(err, TV_E_IDX_WEIGHT_MAP, "index: weight_map is missing or not an "
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

static int read_small_file(const char *path, uint64_t max, char **out, size_t *len,
                           tv_error *err)
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
    if ((rc = read_exact(fd, *out, *len, 0))) {
        free(*out);
        *out = NULL;
        tv__seterr(err, rc, "read %s: %s", path, tv_strerror(rc));
    }
out:
    close(fd);
    return rc;
}

static int open_index(tv_checkpoint *ck, const char *index_path, tv_error *err)
{
    int rc;
    char *buf = NULL, *dir = NULL;
    size_t len = 0;
    json_t *root = NULL;
    const char **shards = NULL;
    size_t n_shards = 0;
    char real_dir[PATH_MAX], shard_path[PATH_MAX], real_shard[PATH_MAX];

    if (!realpath(index_path, real_shard))
        return tv__seterr(err, -errno, "index %s: %s", index_path, strerror(errno));
    if (!(ck->index_path = strdup(real_shard)))
        return tv__seterr(err, -ENOMEM, "out of memory");
    if ((rc = read_small_file(ck->index_path, ck->max_header_len, &buf, &len, err)))
        return rc;
    if ((rc = load_index_json(buf, len, &root, err)))
        goto out;
    if ((rc = validate_index(root, ck->max_shards, &shards, &n_shards, NULL, err)))
        goto out;
    json_t *meta = json_object_get(root, "metadata");
    json_t *ts = json_is_object(meta) ? json_object_get(meta, "total_size") : NULL;
    if (json_is_integer(ts) && json_integer_value(ts) >= 0) {
        ck->has_total_size = true;
        ck->total_size = (uint64_t)json_integer_value(ts);
    } else if (json_is_real(ts) && json_real_value(ts) >= 0 && json_real_value(ts) < 1.8e19) {
        ck->has_total_size = true;
        ck->total_size = (uint64_t)json_real_value(ts);
    }
    if (!(dir = strdup(ck->index_path))) {
        rc = tv__seterr(err, -ENOMEM, "out of memory");
        goto out;
    }
    char *slash = strrchr(dir, '/');
    if (slash == dir)
        slash[1] = '\0';
    else if (slash)
        *slash = '\0';
    if (!realpath(dir, real_dir)) {
        rc = tv__seterr(err, -errno, "index directory %s: %s", dir, strerror(errno));
        goto out;
    }
    size_t dlen = strlen(real_dir);
    for (size_t i = 0; i < n_shards; i++) {
        if ((size_t)snprintf(shard_path, sizeof(shard_path), "%s/%s", real_dir, shards[i]) >=
            sizeof(shard_path)) {
            rc = tv__seterr(err, -ENAMETOOLONG, "shard '%s': path too long", shards[i]);
            goto out;
        }
        if (!realpath(shard_path, real_shard)) {
            rc = tv__seterr(err, -errno, "shard '%s': %s", shards[i], strerror(errno));
            goto out;
        }
        bool inside = strncmp(real_shard, real_dir, dlen) == 0 &&
                      (real_shard[dlen] == '/' || (dlen == 1 && real_dir[0] == '/'));
        if (!inside) {
            rc = tv__seterr(err, TV_E_IDX_SHARD_ESCAPE,
                            "shard '%s' resolves to %s, outside the index directory %s", shards[i],
                            real_shard, real_dir);
            goto out;
        }
        if ((rc = parse_shard_file(ck, real_shard, shards[i], err)))
            goto out;
    }
    if ((rc = finish(ck, err)))
        goto out;
    /* Cross-check: every listed tensor is in the shard it is listed under,
     * and every tensor found is listed. */
    json_t *wm = json_object_get(root, "weight_map");
    const char *key;
    json_t *val;
    json_object_foreach(wm, key, val)
    {
        size_t idx;
        const char *want = json_string_value(val);
        if (tv_checkpoint_find(ck, key, strlen(key), &idx) != 0) {
            rc = tv__seterr(err, TV_E_IDX_MISSING_TENSOR,
                            "tensor '%s' is listed in the index under shard '%s' but is missing "
                            "from it",
                            key, want);
            goto out;
        }
        const char *have = ck->strings + ck->shards[ck->tensors[idx].shard].name_off;
        if (strcmp(have, want) != 0) {
            rc = tv__seterr(err, TV_E_IDX_MISSING_TENSOR,
                            "tensor '%s' is listed in the index under shard '%s' but is missing "
                            "from it (found in shard '%s')",
                            key, want, have);
            goto out;
        }
    }
    if (json_object_size(wm) != ck->n_tensors) {
        for (size_t i = 0; i < ck->n_tensors; i++) {
            const char *tn = ck->strings + ck->tensors[i].name_off;
            if (!json_object_get(wm, tn)) {
                rc = tv__seterr(err, TV_E_IDX_UNLISTED_TENSOR,
                                "tensor '%s' in shard '%s' is not listed in the index", tn,
                                ck->strings + ck->shards[ck->tensors[i].shard].name_off);
                goto out;
            }
        }
        rc = tv__seterr(err, TV_E_INTERNAL, "index and shards disagree on the tensor count");
    }
out:
    free(shards);
    json_decref(root);
    free(buf);
    free(dir);
    return rc;
}

static bool ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

/* Picks the checkpoint file inside a directory: model.safetensors.index.json,
 * else the only *.safetensors.index.json, else model.safetensors, else the
 * only *.safetensors. */
static int pick_in_dir(const char *dir, char *out, size_t out_len, tv_error *err)
{
    DIR *d = opendir(dir);
    if (!d)
        return tv__seterr(err, -errno, "%s: %s", dir, strerror(errno));
    char idx[NAME_MAX + 1] = "", st[NAME_MAX + 1] = "";
    int n_idx = 0, n_st = 0;
    bool model_idx = false, model_st = false;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (ends_with(e->d_name, ".safetensors.index.json")) {
            n_idx++;
            if (strcmp(e->d_name, "model.safetensors.index.json") == 0)
                model_idx = true;
            snprintf(idx, sizeof(idx), "%s", e->d_name);
        } else if (ends_with(e->d_name, ".safetensors")) {
            n_st++;
            if (strcmp(e->d_name, "model.safetensors") == 0)
                model_st = true;
            snprintf(st, sizeof(st), "%s", e->d_name);
        }
    }
    closedir(d);
    const char *pick = NULL;
    if (model_idx)
        pick = "model.safetensors.index.json";
    else if (n_idx == 1)
        pick = idx;
    else if (n_idx == 0 && model_st)
        pick = "model.safetensors";
    else if (n_idx == 0 && n_st == 1)
        pick = st;
    if (!pick)
        return tv__seterr(err, TV_E_CKPT_NOT_FOUND,
                          "%s: no single safetensors checkpoint (found %d index files, %d "
                          ".safetensors files)",
                          dir, n_idx, n_st);
    if ((size_t)snprintf(out, out_len, "%s/%s", dir, pick) >= out_len)
        return tv__seterr(err, -ENAMETOOLONG, "%s: path too long", dir);
    return 0;
}

TV_API int tv_checkpoint_open(const char *path, const tv_st_limits *lim, tv_checkpoint **out,
                              tv_error *err)
{
    int rc;
    char picked[PATH_MAX];
    if (!path || !out)
        return tv__seterr(err, TV_E_INVALID_ARG, "NULL argument");
    *out = NULL;
    struct stat st;
    if (stat(path, &st) < 0)
        return tv__seterr(err, -errno, "%s: %s", path, strerror(errno));
    if (S_ISDIR(st.st_mode)) {
        if ((rc = pick_in_dir(path, picked, sizeof(picked), err)))
            return rc;
        path = picked;
    }
    tv_checkpoint *ck = tv__checkpoint_new(lim);
    if (!ck)
        return tv__seterr(err, -ENOMEM, "out of memory");
    if (ends_with(path, ".json")) {
        rc = open_index(ck, path, err);
    } else {
        char real[PATH_MAX];
        if (!realpath(path, real)) {
            rc = tv__seterr(err, -errno, "%s: %s", path, strerror(errno));
        } else {
            const char *base = strrchr(real, '/');
            rc = parse_shard_file(ck, real, base ? base + 1 : real, err);
            if (!rc)
                rc = finish(ck, err);
        }
    }
    if (rc) {
        tv_checkpoint_close(ck);
        return rc;
    }
    *out = ck;
    return 0;
}

TV_API size_t tv_checkpoint_n_tensors(const tv_checkpoint *ck)
{
    return ck ? ck->n_tensors : 0;
}

TV_API size_t tv_checkpoint_n_shards(const tv_checkpoint *ck)
{
    return ck ? ck->n_shards : 0;
}

TV_API uint64_t tv_checkpoint_total_bytes(const tv_checkpoint *ck)
{
    return ck ? ck->total_bytes : 0;
}

TV_API bool tv_checkpoint_index_total_size(const tv_checkpoint *ck, uint64_t *out)
{
    if (!ck || !ck->has_total_size)
        return false;
    if (out)
        *out = ck->total_size;
    return true;
}

TV_API const char *tv_checkpoint_index_path(const tv_checkpoint *ck)
{
    return ck ? ck->index_path : NULL;
}

TV_API int tv_checkpoint_tensor(const tv_checkpoint *ck, size_t i, tv_tensor_info *out)
{
    if (!ck || !out || i >= ck->n_tensors)
        return TV_E_INVALID_ARG;
    const tv__tensor *t = &ck->tensors[i];
    const tv__shard *sh = &ck->shards[t->shard];
    out->name = ck->strings + t->name_off;
    out->name_len = t->name_len;
    out->dtype = (tv_dtype)t->dtype;
    out->rank = t->rank;
    out->shape = ck->dims ? ck->dims + t->dims_off : NULL;
    out->shard = t->shard;
    out->begin_off = t->begin;
    out->end_off = t->end;
    out->file_off = 8 + sh->header_len + t->begin;
    out->nbytes = t->end - t->begin;
    out->n_elements = t->n_elements;
    return 0;
}

TV_API int tv_checkpoint_shard(const tv_checkpoint *ck, size_t i, tv_shard_info *out)
{
    if (!ck || !out || i >= ck->n_shards)
        return TV_E_INVALID_ARG;
    const tv__shard *sh = &ck->shards[i];
    out->name = ck->strings + sh->name_off;
    out->path = ck->strings + sh->path_off;
    out->file_len = sh->file_len;
    out->header_len = sh->header_len;
    out->data_off = 8 + sh->header_len;
    out->data_len = sh->file_len - out->data_off;
    out->n_tensors = sh->n_tensors;
    out->n_metadata = sh->n_meta;
    out->has_metadata = sh->has_meta;
    out->dev_id = sh->dev_id;
    out->inode = sh->inode;
    out->mtime_ns = sh->mtime_ns;
    out->ctime_ns = sh->ctime_ns;
    return 0;
}

TV_API int tv_checkpoint_shard_metadata(const tv_checkpoint *ck, size_t i, size_t j,
                                        const char **key, const char **value)
{
    if (!ck || i >= ck->n_shards || j >= ck->shards[i].n_meta)
        return TV_E_INVALID_ARG;
    size_t m = (ck->shards[i].first_meta + j) * 2;
    if (key)
        *key = ck->strings + ck->meta[m];
    if (value)
        *value = ck->strings + ck->meta[m + 1];
    return 0;
}
