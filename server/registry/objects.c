/* Objects: extents on a device that hold one shard's canonical bytes plus
 * zero padding. Insert ('writing'), commit (hash), dedup lookup, listing for
 * the allocator, verify and gc, deletion and start-up reclaim, and which
 * model, generation and shard use an object (for reports).
 *
 * Invariants: an object is deleted only when nothing live needs it (a
 * 'writing' object is never referenced by a ready generation; a committed
 * one must not be bound to an importing or ready generation nor to a leased
 * one), and its bindings go in the same transaction; every multi-statement
 * change runs in one transaction level. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "registry/reg_internal.h"

#define OBJECT_COLS "id, device_id, base_off, alloc_len, canonical_len, sha256, state, created_at"

static int read_object(sqlite3_stmt *st, void *record, tv_error *err)
{
    (void)err;
    tv__reg_object *o = record;
    memset(o, 0, sizeof *o);
    o->id = sqlite3_column_int64(st, 0);
    o->device_id = sqlite3_column_int64(st, 1);
    o->base_off = tv__reg_col_u64(st, 2);
    o->alloc_len = tv__reg_col_u64(st, 3);
    o->canonical_len = tv__reg_col_u64(st, 4);
    tv__reg_col_text(st, 5, o->sha256, sizeof o->sha256);
    const unsigned char *s = sqlite3_column_text(st, 6);
    o->state = s && !strcmp((const char *)s, "committed") ? TV__OBJ_COMMITTED : TV__OBJ_WRITING;
    o->created_at = sqlite3_column_int64(st, 7);
    return 0;
}

/* Collects every row of a query binding an optional id into a malloc'd
 * array. */
static int list_objects(tv__reg *reg, const char *sql, const int64_t *id, tv__reg_object **out,
                        size_t *n, const char *what, tv_error *err)
{
    tv__reg_vec v = {.size = sizeof(tv__reg_object)};
    int rc = id ? tv__reg_query_list(reg, &v, read_object, what, err, sql, "i", *id)
                : tv__reg_query_list(reg, &v, read_object, what, err, sql, "");
    *out = v.items;
    *n = v.n;
    return rc;
}

int tv__reg_object_get(tv__reg *reg, int64_t object_id, tv__reg_object *out, tv_error *err)
{
    if (!reg || !out)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_object_get: NULL argument");
    int rc = tv__reg_query_one(reg, read_object, out, "reading an object", err,
                               "SELECT " OBJECT_COLS " FROM objects WHERE id = ?1", "i", object_id);
    if (rc == TV_E_NOT_FOUND)
        rc = tv__seterr(err, TV_E_NOT_FOUND, "no object with id %lld", (long long)object_id);
    return rc;
}

static int device_exists(tv__reg *reg, int64_t device_id, tv_error *err)
{
    int rc = tv__reg_query_one(reg, NULL, NULL, "looking up a device", err,
                               "SELECT 1 FROM devices WHERE id = ?1", "i", device_id);
    if (rc == TV_E_NOT_FOUND)
        rc = tv__seterr(err, TV_E_NOT_FOUND, "no device with id %lld", (long long)device_id);
    return rc;
}

int tv__reg_object_insert_writing(tv__reg *reg, int64_t device_id, uint64_t base_off,
                                  uint64_t alloc_len, uint64_t canonical_len, int64_t *id,
                                  tv_error *err)
{
    if (!reg)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_object_insert_writing: NULL registry");
    if (!alloc_len || !canonical_len || canonical_len > alloc_len)
        return tv__seterr(err, TV_E_INVALID_ARG,
                          "object of %llu canonical bytes cannot use a %llu-byte extent",
                          (unsigned long long)canonical_len, (unsigned long long)alloc_len);
    int rc = tv__reg_level_begin(reg, true, err);
    if (rc)
        return rc;
    if ((rc = device_exists(reg, device_id, err)) ||
        (rc = tv__reg_exec(reg, "reserving an object extent", err,
                           "INSERT INTO objects (device_id, base_off, alloc_len, canonical_len) "
                           "VALUES (?1, ?2, ?3, ?4)",
                           "iuuu", device_id, base_off, "object base_off", alloc_len,
                           "object alloc_len", canonical_len, "object canonical_len")))
        goto done;
    if (id)
        *id = sqlite3_last_insert_rowid(reg->db);
done:
    return tv__reg_level_end(reg, rc, err);
}

int tv__reg_objects_on_device(tv__reg *reg, int64_t device_id, tv__reg_object **out, size_t *n,
                              tv_error *err)
{
    if (!reg || !out || !n)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_objects_on_device: NULL argument");
    return list_objects(reg,
                        "SELECT " OBJECT_COLS " FROM objects WHERE device_id = ?1 "
                        "ORDER BY base_off",
                        &device_id, out, n, "listing a device's objects", err);
}

int tv__reg_object_find_committed(tv__reg *reg, int64_t device_id, const char *sha256_hex,
                                  tv__reg_object *out, tv_error *err)
{
    if (!reg || !out)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_object_find_committed: NULL argument");
    if (!tv__reg_sha256_valid(sha256_hex))
        return tv__seterr(err, TV_E_INVALID_ARG, "sha256 is not 64 lower-case hex digits");
    int rc = tv__reg_query_one(reg, read_object, out, "reading an object", err,
                               "SELECT " OBJECT_COLS " FROM objects WHERE device_id = ?1 "
                               "AND sha256 = ?2 AND state = 'committed'",
                               "it", device_id, sha256_hex);
    if (rc == TV_E_NOT_FOUND)
        rc = tv__seterr(err, TV_E_NOT_FOUND,
                        "no committed object with sha256 %.16s... on device %lld", sha256_hex,
                        (long long)device_id);
    return rc;
}

int tv__reg_object_commit(tv__reg *reg, int64_t object_id, const char *sha256_hex, tv_error *err)
{
    if (!reg)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_object_commit: NULL registry");
    if (!tv__reg_sha256_valid(sha256_hex))
        return tv__seterr(err, TV_E_INVALID_ARG, "sha256 is not 64 lower-case hex digits");
    tv__reg_object o, dup;
    int rc = tv__reg_level_begin(reg, true, err);
    if (rc)
        return rc;
    if ((rc = tv__reg_object_get(reg, object_id, &o, err)))
        goto done;
    if (o.state != TV__OBJ_WRITING) {
        rc = tv__seterr(err, TV_E_STATE, "object %lld is already committed", (long long)object_id);
        goto done;
    }
    rc = tv__reg_object_find_committed(reg, o.device_id, sha256_hex, &dup, NULL);
    if (rc == 0) {
        rc = tv__seterr(err, -EEXIST, "device %lld already holds object %lld with sha256 %s",
                        (long long)o.device_id, (long long)dup.id, sha256_hex);
        goto done;
    }
    if (rc != TV_E_NOT_FOUND) {
        /* Repeat for the message: the lookup ran without err. */
        rc = tv__reg_object_find_committed(reg, o.device_id, sha256_hex, &dup, err);
        goto done;
    }
    rc = tv__reg_exec(reg, "committing an object", err,
                      "UPDATE objects SET sha256 = ?2, state = 'committed' WHERE id = ?1", "it",
                      object_id, sha256_hex);
done:
    return tv__reg_level_end(reg, rc, err);
}

int tv__reg_objects_list_committed(tv__reg *reg, int64_t device_id, tv__reg_object **out, size_t *n,
                                   tv_error *err)
{
    if (!reg || !out || !n)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_objects_list_committed: NULL argument");
    return list_objects(reg,
                        "SELECT " OBJECT_COLS " FROM objects WHERE state = 'committed' "
                        "AND (?1 = 0 OR device_id = ?1) ORDER BY device_id, base_off",
                        &device_id, out, n, "listing committed objects", err);
}

int tv__reg_objects_unreferenced(tv__reg *reg, tv__reg_object **out, size_t *n, tv_error *err)
{
    if (!reg || !out || !n)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_objects_unreferenced: NULL argument");
    return list_objects(reg,
                        "SELECT " OBJECT_COLS " FROM objects o WHERE o.state = 'committed' "
                        "AND NOT EXISTS (SELECT 1 FROM shard_objects so "
                        "  JOIN shards s ON s.id = so.shard_id "
                        "  JOIN generations g ON g.id = s.generation_id "
                        "  WHERE so.object_id = o.id AND (g.state IN ('importing', 'ready') "
                        "    OR EXISTS (SELECT 1 FROM leases l WHERE l.generation_id = g.id))) "
                        "ORDER BY o.device_id, o.base_off",
                        NULL, out, n, "listing unreferenced objects", err);
}

static int check_user(sqlite3_stmt *st, void *arg, tv_error *err)
{
    int64_t object_id = *(const int64_t *)arg;
    const char *model = (const char *)sqlite3_column_text(st, 0);
    long long number = sqlite3_column_int64(st, 1);
    const char *state = (const char *)sqlite3_column_text(st, 2);
    bool leased = sqlite3_column_int(st, 3) != 0;
    if (!strcmp(state, "importing") || !strcmp(state, "ready"))
        return tv__seterr(err, TV_E_STATE,
                          "object %lld holds a shard of %s generation %lld, which is %s",
                          (long long)object_id, model, number, state);
    if (leased)
        return tv__seterr(
            err, TV_E_LEASED,
            "object %lld holds a shard of %s generation %lld, which a reader still leases",
            (long long)object_id, model, number);
    return 0;
}

/* Fails with TV_E_STATE / TV_E_LEASED when a committed object is still
 * needed, naming the first generation that needs it. */
static int check_unneeded(tv__reg *reg, int64_t object_id, tv_error *err)
{
    return tv__reg_query_each(reg, check_user, &object_id, "checking object references", err,
                              "SELECT m.name, g.number, g.state, "
                              "  EXISTS (SELECT 1 FROM leases l WHERE l.generation_id = g.id) "
                              "FROM shard_objects so JOIN shards s ON s.id = so.shard_id "
                              "JOIN generations g ON g.id = s.generation_id "
                              "JOIN models m ON m.id = g.model_id "
                              "WHERE so.object_id = ?1 "
                              "ORDER BY g.state IN ('importing', 'ready') DESC",
                              "i", object_id);
}

int tv__reg_object_delete(tv__reg *reg, int64_t object_id, tv_error *err)
{
    if (!reg)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_object_delete: NULL registry");
    tv__reg_object o;
    int rc = tv__reg_level_begin(reg, true, err);
    if (rc)
        return rc;
    if ((rc = tv__reg_object_get(reg, object_id, &o, err)))
        goto done;
    if (o.state == TV__OBJ_COMMITTED && (rc = check_unneeded(reg, object_id, err)))
        goto done;
    if ((rc = tv__reg_exec(reg, "unbinding an object", err,
                           "DELETE FROM shard_objects WHERE object_id = ?1", "i", object_id)) ||
        (rc = tv__reg_exec(reg, "deleting an object", err, "DELETE FROM objects WHERE id = ?1", "i",
                           object_id)))
        goto done;
done:
    return tv__reg_level_end(reg, rc, err);
}

static int exec_count(tv__reg *reg, const char *sql, size_t *count, tv_error *err)
{
    int rc = tv__reg_exec(reg, "reclaiming after a restart", err, sql, "");
    if (rc)
        return rc;
    if (count)
        *count = (size_t)sqlite3_changes64(reg->db);
    return 0;
}

int tv__reg_reclaim_writing(tv__reg *reg, tv__reg_reclaim *out, tv_error *err)
{
    if (!reg)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_reclaim_writing: NULL registry");
    tv__reg_reclaim r = {0};
    int rc = tv__reg_level_begin(reg, true, err);
    if (rc)
        return rc;
    if ((rc = exec_count(reg, "UPDATE generations SET state = 'failed' WHERE state = 'importing'",
                         &r.n_generations, err)) ||
        (rc = exec_count(reg,
                         "DELETE FROM shard_objects WHERE object_id IN "
                         "(SELECT id FROM objects WHERE state = 'writing')",
                         NULL, err)) ||
        (rc = exec_count(reg, "DELETE FROM objects WHERE state = 'writing'", &r.n_objects, err)) ||
        (rc = exec_count(reg,
                         "UPDATE jobs SET state = 'failed', error_code = 'TV_E_INTERNAL', "
                         "error_errno = -1000, error = 'interrupted by a daemon restart', "
                         "finished_at = CAST(strftime('%s', 'now') AS INTEGER), "
                         "updated_at = CAST(strftime('%s', 'now') AS INTEGER) "
                         "WHERE state IN ('queued', 'running')",
                         &r.n_jobs, err)))
        goto done;
done:
    rc = tv__reg_level_end(reg, rc, err);
    if (rc == 0) {
        if (r.n_objects || r.n_generations || r.n_jobs)
            tv__log(
                tv__reg_log_level(reg, 0),
                "registry: reclaimed %zu writing objects, failed %zu importing generations and %zu unfinished jobs",
                r.n_objects, r.n_generations, r.n_jobs);
        if (out)
            *out = r;
    }
    return rc;
}

static int read_user(sqlite3_stmt *st, void *record, tv_error *err)
{
    (void)err;
    tv__reg_object_user *u = record;
    tv__reg_col_text(st, 0, u->model, sizeof u->model);
    u->generation = sqlite3_column_int64(st, 1);
    if (tv__reg_gen_state_from_text(sqlite3_column_text(st, 2), &u->state))
        u->state = TV__GEN_FAILED;
    u->active = sqlite3_column_int(st, 3) != 0;
    tv__reg_col_text(st, 4, u->shard, sizeof u->shard);
    u->shard_idx = (uint32_t)sqlite3_column_int64(st, 5);
    return 0;
}

int tv__reg_object_users(tv__reg *reg, int64_t object_id, tv__reg_object_user **out, size_t *n,
                         tv_error *err)
{
    if (!reg || !out || !n)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_object_users: NULL argument");
    *out = NULL;
    *n = 0;
    tv__reg_vec v = {.size = sizeof(tv__reg_object_user)};
    tv__reg_object o;
    /* One read transaction: the object and its bindings from one state. */
    int rc = tv__reg_level_begin(reg, false, err);
    if (rc)
        return rc;
    if ((rc = tv__reg_object_get(reg, object_id, &o, err)) == 0)
        rc = tv__reg_query_list(reg, &v, read_user, "listing an object's users", err,
                                "SELECT m.name, g.number, g.state, "
                                "  coalesce(m.active_generation = g.number, 0), s.name, s.idx "
                                "FROM shard_objects so JOIN shards s ON s.id = so.shard_id "
                                "JOIN generations g ON g.id = s.generation_id "
                                "JOIN models m ON m.id = g.model_id "
                                "WHERE so.object_id = ?1 ORDER BY m.name, g.number, s.idx",
                                "i", object_id);
    rc = tv__reg_level_end(reg, rc, err);
    if (rc) {
        free(v.items);
        return rc;
    }
    *out = v.items;
    *n = v.n;
    return 0;
}
