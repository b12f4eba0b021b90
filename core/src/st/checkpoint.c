/* Opening a checkpoint from the filesystem: a single shard or a directory
 * holding a checkpoint (the Hugging Face index lives in index.c); and the
 * accessors.
 *
 * Invariants: only headers are read, never tensor data; a shard is a
 * regular file (FIFOs and devices are refused without blocking). */
#include <dirent.h>
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

int tv__st_read_exact(int fd, void *buf, size_t len, uint64_t off)
{
    int rc = tv__sys_pread_exact(fd, buf, len, off);
    return rc == -ENODATA ? -EIO : rc;
}

int tv__st_parse_shard_file(tv_checkpoint *ck, const char *path, const char *name, tv_error *err)
{
    int rc;
    char *hdr = NULL;
    /* O_NONBLOCK: opening a FIFO must not hang; it is refused below. It has
     * no effect on regular files. */
    int fd = tv__sys.open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC, 0);
    if (fd < 0)
        return tv__seterr(err, -errno, "shard '%s': cannot open %s: %s", name, path,
                          strerror(errno));
    struct stat st;
    if (tv__sys.fstat(fd, &st) < 0) {
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
        rc = tv__seterr(err, TV_E_FILE_SHORT,
                        "shard '%s': file is %llu bytes, shorter than the 8-byte length prefix",
                        name, (unsigned long long)file_len);
        goto fail_fd;
    }
    if ((rc = tv__st_read_exact(fd, prefix, 8, 0))) {
        tv__seterr(err, rc, "shard '%s': read: %s", name, tv_strerror(rc));
        goto fail_fd;
    }
    uint64_t n = tv__le64_get(prefix);
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
    if ((rc = tv__st_read_exact(fd, hdr, n, 8))) {
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
    tv__sys.close(fd);
    return rc;
}

int tv__st_finish(tv_checkpoint *ck, tv_error *err)
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
                                     const char *name, const tv_st_limits *lim, tv_checkpoint **out,
                                     tv_error *err)
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
        rc = tv__seterr(err, TV_E_FILE_SHORT, "shard '%s': shorter than the 8-byte length prefix",
                        name);
        goto fail;
    }
    const unsigned char *p = buf;
    uint64_t n = tv__le64_get(p);
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
    if ((rc = tv__st_finish(ck, err)))
        goto fail;
    *out = ck;
    return 0;
fail:
    tv_checkpoint_close(ck);
    return rc;
}

static bool ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

int tv__st_pick_in_dir(DIR *d, const char *dir, char *out, tv_error *err)
{
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
        return tv__seterr(
            err, TV_E_CKPT_NOT_FOUND,
            "%s: no single safetensors checkpoint (found %d index files, %d .safetensors files)",
            dir, n_idx, n_st);
    snprintf(out, NAME_MAX + 1, "%s", pick);
    return 0;
}

/* The checkpoint file of directory dir (tv__st_pick_in_dir). */
static int pick_in_dir(const char *dir, char *out, tv_error *err)
{
    DIR *d = opendir(dir);
    if (!d)
        return tv__seterr(err, -errno, "%s: %s", dir, strerror(errno));
    int rc = tv__st_pick_in_dir(d, dir, out, err);
    closedir(d);
    return rc;
}

/* Where path's checkpoint file is: the real path of its directory, its name
 * there (a link keeps its own name) and the file it resolves to. A file
 * picked inside a named directory must resolve inside it (or be a hub cache
 * link); a file named directly is the caller's choice. */
static int locate(const char *path, char *real_dir, char *name, char *file, tv_error *err)
{
    int rc;
    struct stat st;
    if (stat(path, &st) < 0)
        return tv__seterr(err, -errno, "%s: %s", path, strerror(errno));
    if (S_ISDIR(st.st_mode)) {
        if (!realpath(path, real_dir))
            return tv__seterr(err, -errno, "%s: %s", path, strerror(errno));
        if ((rc = pick_in_dir(real_dir, name, err)))
            return rc;
        return tv__st_resolve_in_dir(real_dir, name, "checkpoint file", file, err);
    }
    char dir[PATH_MAX];
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    if (strlen(base) > NAME_MAX)
        return tv__seterr(err, -ENAMETOOLONG, "%s: name too long", path);
    snprintf(name, NAME_MAX + 1, "%s", base);
    if (!slash)
        snprintf(dir, sizeof(dir), ".");
    else if (slash == path)
        snprintf(dir, sizeof(dir), "/");
    else if ((size_t)snprintf(dir, sizeof(dir), "%.*s", (int)(slash - path), path) >= sizeof(dir))
        return tv__seterr(err, -ENAMETOOLONG, "%s: path too long", path);
    if (!realpath(dir, real_dir) || !realpath(path, file))
        return tv__seterr(err, -errno, "%s: %s", path, strerror(errno));
    return 0;
}

TV_API int tv_checkpoint_open(const char *path, const tv_st_limits *lim, tv_checkpoint **out,
                              tv_error *err)
{
    int rc;
    char real_dir[PATH_MAX], name[NAME_MAX + 1], file[PATH_MAX];
    if (!path || !out)
        return tv__seterr(err, TV_E_INVALID_ARG, "NULL argument");
    *out = NULL;
    if ((rc = locate(path, real_dir, name, file, err)))
        return rc;
    tv_checkpoint *ck = tv__checkpoint_new(lim);
    if (!ck)
        return tv__seterr(err, -ENOMEM, "out of memory");
    if (ends_with(name, ".json")) {
        rc = tv__st_open_index(ck, real_dir, name, file, err);
    } else {
        rc = tv__st_parse_shard_file(ck, file, name, err);
        if (!rc)
            rc = tv__st_finish(ck, err);
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
