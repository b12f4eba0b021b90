/* Which file a shard is: the local file each shard was imported from
 * (shard_files, migrations/0006_shard_files.sql) and the lookup of a file
 * among the shards of ready generations (GET /v1/shards; the Python
 * package's store lookup runs the same query, python/tensorvault/_files.py).
 *
 * Invariant: a file matches a shard only with the same size, the same
 * SHA-256 of its 8 + N header bytes, and either the same SHA-256 of all its
 * bytes or the identity and change stamps recorded when that shard was
 * imported from it: never by size and header alone, which two checkpoints
 * of one architecture share. Device and inode numbers are stored as their
 * unsigned 64-bit values cast to signed (SQLite integers). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "registry/reg_internal.h"

int tv__reg_shard_file_add(tv__reg *reg, int64_t shard_id, const tv__reg_file_stamp *f,
                           tv_error *err)
{
    if (!reg || !f)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_shard_file_add: NULL argument");
    int rc;
    if ((rc = tv__reg_level_begin(reg, true, err)))
        return rc;
    int64_t len = 0;
    rc = tv__reg_query_one(reg, tv__reg_read_i64, &len, "recording a shard's file", err,
                           "SELECT s.file_len FROM shards s JOIN generations g "
                           "ON g.id = s.generation_id AND g.state = 'importing' WHERE s.id = ?1",
                           "i", shard_id);
    if (rc == TV_E_NOT_FOUND) {
        rc = tv__seterr(err, TV_E_STATE, "shard %lld is not in an importing generation",
                        (long long)shard_id);
        goto done;
    }
    if (rc)
        goto done;
    if (f->size != (uint64_t)len) {
        rc =
            tv__seterr(err, TV_E_INVALID_ARG, "shard %lld: its file has %llu bytes, the shard %lld",
                       (long long)shard_id, (unsigned long long)f->size, (long long)len);
        goto done;
    }
    rc = tv__reg_exec(reg, "recording a shard's file", err,
                      "INSERT INTO shard_files (shard_id, dev, ino, size, mtime_ns, ctime_ns) "
                      "VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                      "iiiuii", shard_id, (int64_t)f->dev, (int64_t)f->ino, f->size, "file size",
                      f->mtime_ns, f->ctime_ns);
    if (rc == -EEXIST)
        tv__seterr(err, rc, "shard %lld: its file is recorded already", (long long)shard_id);
done:
    return tv__reg_level_end(reg, rc, err);
}

static int read_hit(sqlite3_stmt *st, void *record, tv_error *err)
{
    (void)err;
    tv__reg_shard_hit *h = record;
    tv__reg_col_text(st, 0, h->model, sizeof h->model);
    h->generation = sqlite3_column_int64(st, 1);
    h->active = sqlite3_column_int(st, 2) != 0;
    h->idx = (uint32_t)tv__reg_col_u64(st, 3);
    tv__reg_col_text(st, 4, h->name, sizeof h->name);
    tv__reg_col_text(st, 5, h->sha256, sizeof h->sha256);
    return 0;
}

/* The lookup's SQL: the shards of ready generations with the file's header
 * hash (?1) and size (?2) whose whole-file hash is ?3, or (BY_STAMP) whose
 * recorded file has the stamps ?4.. . At most 64 rows: one file in as many
 * generations. */
#define LOOKUP_SELECT                                                                              \
    "SELECT m.name, g.number, m.active_generation IS g.number, s.idx, s.name, s.sha256 "           \
    "FROM shards s JOIN generations g ON g.id = s.generation_id AND g.state = 'ready' "            \
    "JOIN models m ON m.id = g.model_id WHERE s.header_sha256 = ?1 AND s.file_len = ?2 "
#define LOOKUP_ORDER "ORDER BY m.active_generation IS g.number DESC, g.number DESC, m.name LIMIT 64"
#define BY_STAMP                                                                                   \
    "EXISTS (SELECT 1 FROM shard_files f WHERE f.shard_id = s.id AND f.dev = ?4 AND f.ino = ?5 "   \
    "AND f.size = ?2 AND f.mtime_ns = ?6 AND f.ctime_ns = ?7)"

int tv__reg_shards_lookup(tv__reg *reg, const tv__reg_shard_query *q, tv__reg_shard_hit **out,
                          size_t *n, tv_error *err)
{
    if (!reg || !q || !out || !n)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_shards_lookup: NULL argument");
    *out = NULL;
    *n = 0;
    if (!q->header_sha256_hex || !tv__reg_sha256_valid(q->header_sha256_hex) ||
        (q->sha256_hex && !tv__reg_sha256_valid(q->sha256_hex)))
        return tv__seterr(err, TV_E_INVALID_ARG,
                          "shard lookup: hashes must be 64 lower-case hex digits");
    if (!q->sha256_hex && !q->has_stamp)
        return tv__seterr(
            err, TV_E_INVALID_ARG,
            "shard lookup: a file's size and header name no shard alone: give its sha256 or its stamps");
    const tv__reg_file_stamp *f = &q->stamp;
    const char *what = "looking a file up among the shards";
    tv__reg_vec v = {.size = sizeof(tv__reg_shard_hit)};
    int rc;
    if (q->has_stamp)
        rc = tv__reg_query_list(reg, &v, read_hit, what, err,
                                LOOKUP_SELECT "AND (s.sha256 = ?3 OR " BY_STAMP ") " LOOKUP_ORDER,
                                "tutiiii", q->header_sha256_hex, q->file_len, "file size",
                                q->sha256_hex, (int64_t)f->dev, (int64_t)f->ino, f->mtime_ns,
                                f->ctime_ns);
    else
        rc = tv__reg_query_list(reg, &v, read_hit, what, err,
                                LOOKUP_SELECT "AND s.sha256 = ?3 " LOOKUP_ORDER, "tut",
                                q->header_sha256_hex, q->file_len, "file size", q->sha256_hex);
    if (rc)
        return rc;
    *out = v.items;
    *n = v.n;
    return 0;
}
