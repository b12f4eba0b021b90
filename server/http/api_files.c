/* The sidecar file routes of a generation (registry/files.c): the list
 * (path, size, sha256) and one file's bytes, byte for byte as imported.
 * Invariants: {gen} is a number, an alias or "active" (tv__api_gen_row),
 * as on the other generation routes, and [access] was checked by the
 * router before anything is read; a file's ETag is its SHA-256, so it
 * never changes (the files of a generation are immutable). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http/api_internal.h"
#include "util/internal.h"

static const char *const NO_FIELDS[] = {NULL};

int tv__api_h_files(tv__api_ctx *c)
{
    tv__reg *reg;
    tv__reg_generation g;
    tv__reg_file *fs = NULL;
    size_t n = 0;
    int rc;
    if ((rc = tv__api_query_allow(c, NO_FIELDS)) || (rc = tv__api_reader(c, &reg)) ||
        (rc = tv__api_gen_row(c, reg, c->param[0], c->param[1], &g)) ||
        (rc = tv__reg_generation_files_list(reg, g.id, &fs, &n, &c->err)))
        goto out;
    json_t *arr = json_array();
    for (size_t i = 0; arr && i < n; i++)
        if (json_array_append_new(arr, json_pack("{s:s,s:I,s:s}", "path", fs[i].path, "size",
                                                 (json_int_t)fs[i].len, "sha256", fs[i].sha256))) {
            json_decref(arr);
            arr = NULL;
        }
    if (!arr) {
        rc = tv__seterr(&c->err, -ENOMEM, "out of memory");
        goto out;
    }
    rc = tv__api_reply(c, 200,
                       json_pack("{s:s,s:I,s:o}", "model", c->param[0], "generation",
                                 (json_int_t)g.number, "files", arr));
out:
    free(fs);
    return rc;
}

static const char *content_type(const char *path)
{
    size_t n = strlen(path);
    if (n >= 5 && !strcmp(path + n - 5, ".json"))
        return "application/json";
    return "text/plain; charset=utf-8";
}

typedef struct file_src {
    void *data;
} file_src;

static int file_read(void *src, uint64_t off, uint64_t len, uint8_t *dest, tv_error *err)
{
    (void)err;
    memcpy(dest, (const uint8_t *)((file_src *)src)->data + off, (size_t)len);
    return 0;
}

static void file_free(void *src)
{
    if (src)
        free(((file_src *)src)->data);
    free(src);
}

int tv__api_h_file(tv__api_ctx *c)
{
    tv__reg *reg;
    tv__reg_generation g;
    tv__reg_file meta;
    void *data = NULL;
    const char *path = c->param[2];
    int rc;
    if ((rc = tv__api_query_allow(c, NO_FIELDS)) || (rc = tv__api_reader(c, &reg)) ||
        (rc = tv__api_gen_row(c, reg, c->param[0], c->param[1], &g)))
        return rc;
    if ((rc = tv__reg_generation_file_read(reg, g.id, path, &meta, &data, &c->err))) {
        if (rc == TV_E_NOT_FOUND)
            tv__seterr(&c->err, rc, "generation %" PRId64 " of '%s' has no file '%.600s'", g.number,
                       c->param[0], path);
        return rc;
    }
    file_src *s = malloc(sizeof(*s));
    if (!s) {
        free(data);
        return tv__seterr(&c->err, -ENOMEM, "out of memory");
    }
    s->data = data;
    char etag[TV__REG_SHA256_HEX_LEN + 3], what[TV__REG_FILE_PATH_MAX + 16];
    snprintf(etag, sizeof etag, "\"%s\"", meta.sha256);
    snprintf(what, sizeof what, "file '%s'", meta.path);
    rc = tv__api_bytes_reply(c, etag, meta.len, s, file_read, file_free, what);
    if (!rc && c->resp->content_type)
        c->resp->content_type = content_type(meta.path);
    return rc;
}
