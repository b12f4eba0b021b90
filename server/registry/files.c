/* Sidecar files of generations (migrations/0007_sidecar_files.sql): the
 * small non-weight files an import stores with the generation, their bytes
 * in SQLite (sidecar_blobs, one row per content), named per generation
 * (generation_files).
 *
 * Invariants: a blob's bytes hash to its key (checked before the insert);
 * a file row is added only while its generation is importing (a trigger),
 * in the caller's publish transaction, and never changed; gc drops a blob
 * only once no row names it. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "registry/reg_internal.h"
#include "util/hex.h"
#include "util/sha256.h"

static int check_hash(const tv__reg_file_in *f, tv_error *err)
{
    char hex[TV__REG_SHA256_HEX_LEN + 1];
    if (tv__sha256_hex(f->data, f->len, hex))
        return tv__seterr(err, -ENOMEM, "out of memory");
    if (strcmp(hex, f->sha256) != 0)
        return tv__seterr(err, TV_E_HASH_MISMATCH, "sidecar file '%s' hashes to %s, not %s",
                          f->path, hex, f->sha256);
    return 0;
}

static int add_blob(tv__reg *reg, const tv__reg_file_in *f, tv_error *err)
{
    sqlite3_stmt *st = NULL;
    int rc = tv__reg_prepare(reg,
                             "INSERT INTO sidecar_blobs (sha256, data) VALUES (?1, ?2) "
                             "ON CONFLICT (sha256) DO NOTHING",
                             &st, err);
    if (rc)
        return rc;
    if ((rc = tv__reg_bind_text(reg, st, 1, f->sha256, err)) == 0) {
        int src = sqlite3_bind_blob64(st, 2, f->len ? f->data : "", (sqlite3_uint64)f->len,
                                      SQLITE_STATIC);
        rc = src == SQLITE_OK ? tv__reg_step_done(reg, st, "storing a sidecar file", err)
                              : tv__sqlerr(tv__reg_sqlite(reg), err, src, "storing a sidecar file");
    }
    sqlite3_finalize(st);
    return rc;
}

int tv__reg_generation_files_add(tv__reg *reg, int64_t generation_id, const tv__reg_file_in *f,
                                 size_t n, tv_error *err)
{
    if (!reg || (n && !f))
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_generation_files_add: NULL argument");
    int rc = tv__reg_level_begin(reg, true, err);
    if (rc)
        return rc;
    rc = tv__reg_query_one(reg, NULL, NULL, "adding sidecar files", err,
                           "SELECT 1 FROM generations WHERE id = ?1 AND state = 'importing'", "i",
                           generation_id);
    if (rc == TV_E_NOT_FOUND)
        rc = tv__seterr(err, TV_E_STATE, "generation %lld is not importing",
                        (long long)generation_id);
    for (size_t i = 0; !rc && i < n; i++) {
        if (!f[i].path || !f[i].sha256 || (f[i].len && !f[i].data) ||
            !tv__reg_sha256_valid(f[i].sha256) || strlen(f[i].path) == 0 ||
            strlen(f[i].path) > TV__REG_FILE_PATH_MAX) {
            rc = tv__seterr(err, TV_E_INVALID_ARG, "sidecar file %zu: a malformed row", i);
            break;
        }
        if ((rc = check_hash(&f[i], err)) || (rc = add_blob(reg, &f[i], err)))
            break;
        rc = tv__reg_exec(reg, "adding a sidecar file", err,
                          "INSERT INTO generation_files (generation_id, path, len, sha256) "
                          "VALUES (?1, ?2, ?3, ?4)",
                          "itut", generation_id, f[i].path, (uint64_t)f[i].len, "file length",
                          f[i].sha256);
        if (rc == -EEXIST)
            tv__seterr(err, rc, "sidecar file '%s' given twice", f[i].path);
    }
    return tv__reg_level_end(reg, rc, err);
}

static int read_file_row(sqlite3_stmt *st, void *record, tv_error *err)
{
    (void)err;
    tv__reg_file *r = record;
    tv__reg_col_text(st, 0, r->path, sizeof r->path);
    r->len = tv__reg_col_u64(st, 1);
    tv__reg_col_text(st, 2, r->sha256, sizeof r->sha256);
    return 0;
}

int tv__reg_generation_files_list(tv__reg *reg, int64_t generation_id, tv__reg_file **out,
                                  size_t *n, tv_error *err)
{
    if (!reg || !out || !n)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_generation_files_list: NULL argument");
    *out = NULL;
    *n = 0;
    tv__reg_vec v = {.size = sizeof(tv__reg_file)};
    int rc = tv__reg_query_list(reg, &v, read_file_row, "listing sidecar files", err,
                                "SELECT path, len, sha256 FROM generation_files "
                                "WHERE generation_id = ?1 ORDER BY path",
                                "i", generation_id);
    if (rc)
        return rc;
    *out = v.items;
    *n = v.n;
    return 0;
}

typedef struct file_read {
    tv__reg_file *meta;
    void *data;
} file_read;

static int read_file_data(sqlite3_stmt *st, void *record, tv_error *err)
{
    file_read *r = record;
    read_file_row(st, r->meta, err);
    const void *b = sqlite3_column_blob(st, 3);
    int bl = sqlite3_column_bytes(st, 3);
    if (bl < 0 || (uint64_t)bl != r->meta->len)
        return tv__seterr(err, TV_E_REGISTRY, "sidecar file '%s': %d bytes stored, %llu recorded",
                          r->meta->path, bl, (unsigned long long)r->meta->len);
    if (!(r->data = malloc(bl ? (size_t)bl : 1)))
        return tv__seterr(err, -ENOMEM, "out of memory");
    if (bl)
        memcpy(r->data, b, (size_t)bl);
    return 0;
}

int tv__reg_generation_file_read(tv__reg *reg, int64_t generation_id, const char *path,
                                 tv__reg_file *meta, void **data, tv_error *err)
{
    if (!reg || !path || !meta || !data)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_generation_file_read: NULL argument");
    *data = NULL;
    file_read r = {.meta = meta};
    int rc = tv__reg_query_one(reg, read_file_data, &r, "reading a sidecar file", err,
                               "SELECT f.path, f.len, f.sha256, b.data FROM generation_files f "
                               "JOIN sidecar_blobs b ON b.sha256 = f.sha256 "
                               "WHERE f.generation_id = ?1 AND f.path = ?2",
                               "it", generation_id, path);
    if (rc == TV_E_NOT_FOUND)
        return tv__seterr(err, rc, "no file '%s' in this generation", path);
    if (rc) {
        free(r.data);
        return rc;
    }
    *data = r.data;
    return 0;
}

static int read_u64_pair(sqlite3_stmt *st, void *record, tv_error *err)
{
    (void)err;
    uint64_t *p = record;
    p[0] = tv__reg_col_u64(st, 0);
    p[1] = tv__reg_col_u64(st, 1);
    return 0;
}

int tv__reg_sidecars_gc(tv__reg *reg, size_t *n_blobs, uint64_t *bytes, tv_error *err)
{
    if (!reg)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_sidecars_gc: NULL argument");
    uint64_t gone[2] = {0, 0};
    int rc = tv__reg_level_begin(reg, true, err);
    if (rc)
        return rc;
    rc = tv__reg_exec(reg, "dropping the sidecar files of retired generations", err,
                      "DELETE FROM generation_files WHERE generation_id IN "
                      "(SELECT g.id FROM generations g WHERE g.state IN ('retired', 'failed') "
                      " AND NOT EXISTS (SELECT 1 FROM leases l WHERE l.generation_id = g.id))",
                      "");
    if (!rc)
        rc = tv__reg_query_one(
            reg, read_u64_pair, gone, "counting unreferenced sidecar blobs", err,
            "SELECT count(*), coalesce(sum(length(data)), 0) FROM sidecar_blobs b "
            "WHERE NOT EXISTS (SELECT 1 FROM generation_files f "
            "WHERE f.sha256 = b.sha256)",
            "");
    if (!rc)
        rc =
            tv__reg_exec(reg, "dropping unreferenced sidecar blobs", err,
                         "DELETE FROM sidecar_blobs WHERE NOT EXISTS "
                         "(SELECT 1 FROM generation_files f WHERE f.sha256 = sidecar_blobs.sha256)",
                         "");
    rc = tv__reg_level_end(reg, rc, err);
    if (!rc) {
        if (n_blobs)
            *n_blobs = (size_t)gone[0];
        if (bytes)
            *bytes = gone[1];
    }
    return rc;
}
