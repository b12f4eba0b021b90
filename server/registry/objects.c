/* Objects: extents on a device that hold one shard's canonical bytes plus
 * zero padding. Insert ('writing'), commit (hash), dedup lookup, listing for
 * the allocator, verify and gc, deletion and start-up reclaim, and which
 * model, generation and shard use an object (for reports), and a device's
 * objects with their users (the extents map).
 *
 * Invariants: an object is deleted only when nothing live needs it (a
 * 'writing' object is never referenced by a ready generation; a committed
 * one must not be bound to an importing or ready generation nor to a leased
 * one), and its bindings go in the same transaction; every multi-statement
 * change runs in one transaction level. */
#include <errno.h>
#include <stdint.h>
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

static bool sha256_hex_ok(const char *s)
{
    if (!s || strnlen(s, TV__REG_SHA256_HEX_LEN + 1) != TV__REG_SHA256_HEX_LEN)
        return false;
    for (size_t i = 0; i < TV__REG_SHA256_HEX_LEN; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return false;
    return true;
}

int tv__reg_objects_by_sha256(tv__reg *reg, const char *sha256_hex, tv__reg_object **out, size_t *n,
                              tv_error *err)
{
    if (!reg || !out || !n)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_objects_by_sha256: NULL argument");
    *out = NULL;
    *n = 0;
    if (!sha256_hex_ok(sha256_hex))
        return tv__seterr(err, TV_E_INVALID_ARG,
                          "blob hash '%.80s' is not 64 lower-case hex digits",
                          sha256_hex ? sha256_hex : "");
    tv__reg_vec v = {.size = sizeof(tv__reg_object)};
    int rc = tv__reg_query_list(reg, &v, read_object, "listing the objects of a blob", err,
                                "SELECT " OBJECT_COLS " FROM objects WHERE state = 'committed' "
                                "AND sha256 = ?1 ORDER BY device_id, id",
                                "t", sha256_hex);
    *out = v.items;
    *n = v.n;
    return rc;
}

static int read_blob(sqlite3_stmt *st, void *record, tv_error *err)
{
    (void)err;
    tv__reg_blob *b = record;
    tv__reg_col_text(st, 0, b->sha256, sizeof b->sha256);
    b->bytes = tv__reg_col_u64(st, 1);
    int64_t k = sqlite3_column_int64(st, 2);
    b->n_replicas = k < 0 ? 0 : k > UINT32_MAX ? UINT32_MAX : (uint32_t)k;
    return 0;
}

int tv__reg_blobs_page(tv__reg *reg, const char *after, size_t limit, tv__reg_blob **out, size_t *n,
                       bool *more, tv_error *err)
{
    if (!reg || !out || !n || !more || limit == 0 || limit > INT32_MAX)
        return tv__seterr(err, TV_E_INVALID_ARG,
                          "tv__reg_blobs_page: NULL argument or limit %zu out of range", limit);
    *out = NULL;
    *n = 0;
    *more = false;
    tv__reg_vec v = {.size = sizeof(tv__reg_blob)};
    /* One row more than asked tells whether another page follows. */
    int rc = tv__reg_query_list(reg, &v, read_blob, "listing blobs", err,
                                "SELECT sha256, min(canonical_len), count(*) FROM objects "
                                "WHERE state = 'committed' AND (?1 IS NULL OR sha256 > ?1) "
                                "GROUP BY sha256 ORDER BY sha256 LIMIT ?2",
                                "ti", after, (int64_t)limit + 1);
    if (rc)
        return rc;
    if (v.n > limit) {
        v.n = limit;
        *more = true;
    }
    *out = v.items;
    *n = v.n;
    return 0;
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

/* 'writing' objects a job's resume record names are kept (reclaim). */
#define RESUME_KEPT                                                                                \
    "AND id NOT IN (SELECT json_extract(e.value, '$.object') FROM jobs, "                          \
    "json_each(jobs.resume, '$.objects') AS e WHERE jobs.resume IS NOT NULL)"
#define TV__STR_(x) #x
#define TV__STR(x)  TV__STR_(x)

static int read_count(sqlite3_stmt *st, void *record, tv_error *err)
{
    (void)err;
    *(size_t *)record = (size_t)sqlite3_column_int64(st, 0);
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
    if ((rc = exec_count(reg,
                         "UPDATE jobs SET resume = NULL WHERE resume IS NOT NULL "
                         "AND state IN ('succeeded', 'failed', 'cancelled') "
                         "AND coalesce(finished_at, updated_at) < "
                         "CAST(strftime('%s', 'now') AS INTEGER) - " TV__STR(TV__RESUME_KEEP_S),
                         &r.n_expired, err)) ||
        (rc = exec_count(reg, "UPDATE generations SET state = 'failed' WHERE state = 'importing'",
                         &r.n_generations, err)) ||
        (rc = exec_count(reg,
                         "DELETE FROM shard_objects WHERE object_id IN "
                         "(SELECT id FROM objects WHERE state = 'writing')",
                         NULL, err)) ||
        (rc = exec_count(reg, "DELETE FROM objects WHERE state = 'writing' " RESUME_KEPT,
                         &r.n_objects, err)) ||
        (rc = tv__reg_query_one(reg, read_count, &r.n_kept, "counting kept reservations", err,
                                "SELECT count(*) FROM objects WHERE state = 'writing'", "")) ||
        (rc = exec_count(reg,
                         "INSERT INTO events (actor, action, model, generation, before, after) "
                         "SELECT 'daemon', CASE kind WHEN 'import' THEN 'import.failed' "
                         "ELSE 'verify.failed' END, CASE kind WHEN 'import' THEN model END, "
                         "generation, json_object('job', id), json_object('job', id, 'state', "
                         "'failed', 'error', 'interrupted by a daemon restart') "
                         "FROM jobs WHERE state IN ('queued', 'running')",
                         NULL, err)) ||
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
        if (r.n_kept || r.n_expired)
            tv__log(
                tv__reg_log_level(reg, 0),
                "registry: kept %zu reservations for interrupted imports to resume, dropped %zu resume records unused for a day",
                r.n_kept, r.n_expired);
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
    u->object_id = sqlite3_column_int64(st, 6);
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
                                "  coalesce(m.active_generation = g.number, 0), s.name, s.idx, "
                                "  so.object_id "
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

void tv__reg_device_objects_free(tv__reg_device_objects *m)
{
    if (!m)
        return;
    free(m->objects);
    free(m->users);
    free(m->first_user);
    memset(m, 0, sizeof *m);
}

int tv__reg_device_extents_check(const tv__reg_device *d, const tv__reg_object *objs, size_t n,
                                 tv_error *err)
{
    if (!d || (!objs && n))
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_device_extents_check: NULL argument");
    uint64_t end;
    if (tv__add_u64(d->region_off, d->region_len, &end) || d->data_off < d->region_off ||
        d->data_off > end)
        return tv__seterr(
            err, TV_E_REGISTRY,
            "registry corrupt: device %lld has data offset %llu outside its region [%llu, +%llu)",
            (long long)d->id, (unsigned long long)d->data_off, (unsigned long long)d->region_off,
            (unsigned long long)d->region_len);
    uint64_t prev_end = d->data_off;
    int64_t prev_id = 0;
    for (size_t i = 0; i < n; i++) {
        const tv__reg_object *o = &objs[i];
        if (o->base_off < d->data_off || o->base_off > end || o->alloc_len > end - o->base_off)
            return tv__seterr(
                err, TV_E_REGISTRY,
                "registry corrupt: object %lld at [%llu, +%llu) on device %lld lies outside the data region [%llu, %llu)",
                (long long)o->id, (unsigned long long)o->base_off, (unsigned long long)o->alloc_len,
                (long long)d->id, (unsigned long long)d->data_off, (unsigned long long)end);
        if (o->base_off < prev_end)
            return tv__seterr(
                err, TV_E_REGISTRY,
                "registry corrupt: object %lld at %llu on device %lld overlaps object %lld, which ends at %llu",
                (long long)o->id, (unsigned long long)o->base_off, (long long)d->id,
                (long long)prev_id, (unsigned long long)prev_end);
        prev_end = o->base_off + o->alloc_len;
        prev_id = o->id;
    }
    return 0;
}

/* Checks objects[] against the device's data region and each other, and
 * splits users[] (in the same object order) by object into first_user. */
static int index_extents(tv__reg_device_objects *m, tv_error *err)
{
    int rc = tv__reg_device_extents_check(&m->device, m->objects, m->n_objects, err);
    if (rc)
        return rc;
    size_t u = 0;
    for (size_t i = 0; i < m->n_objects; i++) {
        const tv__reg_object *o = &m->objects[i];
        m->first_user[i] = u;
        while (u < m->n_users && m->users[u].object_id == o->id)
            u++;
    }
    m->first_user[m->n_objects] = u;
    if (u != m->n_users)
        return tv__seterr(
            err, TV_E_REGISTRY,
            "registry corrupt: a binding of object %lld on device %lld is out of order",
            (long long)m->users[u].object_id, (long long)m->device.id);
    return 0;
}

int tv__reg_device_objects_get(tv__reg *reg, int64_t device_id, tv__reg_device_objects *out,
                               tv_error *err)
{
    if (!reg || !out)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_device_objects_get: NULL argument");
    memset(out, 0, sizeof *out);
    tv__reg_vec v = {.size = sizeof(tv__reg_object_user)};
    /* One read transaction: the device, its objects and their bindings
     * from one state. */
    int rc = tv__reg_level_begin(reg, false, err);
    if (rc)
        return rc;
    if ((rc = tv__reg_device_get(reg, device_id, &out->device, err)) ||
        (rc = tv__reg_objects_on_device(reg, device_id, &out->objects, &out->n_objects, err)) ||
        (rc = tv__reg_query_list(reg, &v, read_user, "listing a device's object users", err,
                                 "SELECT m.name, g.number, g.state, "
                                 "  coalesce(m.active_generation = g.number, 0), s.name, s.idx, "
                                 "  so.object_id "
                                 "FROM objects o JOIN shard_objects so ON so.object_id = o.id "
                                 "JOIN shards s ON s.id = so.shard_id "
                                 "JOIN generations g ON g.id = s.generation_id "
                                 "JOIN models m ON m.id = g.model_id "
                                 "WHERE o.device_id = ?1 "
                                 "ORDER BY o.base_off, m.name, g.number, s.name, s.idx",
                                 "i", device_id)))
        goto done;
    out->users = v.items;
    out->n_users = v.n;
    v.items = NULL;
    if (!(out->first_user = calloc(out->n_objects + 1, sizeof *out->first_user))) {
        rc = tv__seterr(err, -ENOMEM, "out of memory listing the objects of device %lld",
                        (long long)device_id);
        goto done;
    }
    rc = index_extents(out, err);
done:
    rc = tv__reg_level_end(reg, rc, err);
    if (rc) {
        free(v.items);
        tv__reg_device_objects_free(out);
    }
    return rc;
}
