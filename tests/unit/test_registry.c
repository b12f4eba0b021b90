/* Unit tests of the registry (server/registry): migrations, pragmas,
 * devices, objects (reserve, commit, dedup, reclaim, gc), generations
 * (numbering, state rules, activation, deactivation and rollback), leases,
 * jobs, aliases, model get/delete, pages of models, generations and
 * tensors, API tokens, explicit transactions, a 120k-tensor bulk insert
 * and concurrent reservations from two connections. Each test gets a fresh
 * database in its own temporary directory. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <sqlite3.h>

#include "import/alloc.h"
#include "registry/migrate.h"
#include "registry/reg_internal.h"
#include "registry/notes.h"
#include "registry/registry.h"
#include "tv_test.h"

#define MiB (1024ull * 1024ull)
#define OA  65536ull /* object_align of the test device */

typedef struct fixture {
    char dir[96];
    char path[128];
    tv__reg *reg;
    int64_t dev;
} fixture;

static void fill_device(tv__reg_device *d, const char *uuid, uint64_t size)
{
    memset(d, 0, sizeof *d);
    snprintf(d->uuid, sizeof d->uuid, "%s", uuid);
    snprintf(d->kind, sizeof d->kind, "file");
    snprintf(d->path, sizeof d->path, "/var/lib/tensorvault/store.img");
    snprintf(d->identity, sizeof d->identity, "{\"serial\":\"\",\"model\":\"\",\"nsid\":0}");
    d->lba_size = 512;
    d->io_align = 4096;
    d->object_align = OA;
    d->size_bytes = size;
    d->region_off = 4096;
    d->region_len = size - 4096;
    d->data_off = OA;
}

/* An import job spec for model from source. */
static tv__reg_job *import_spec(const char *model, const char *source, uint64_t total)
{
    static tv__reg_job j;
    memset(&j, 0, sizeof j);
    j.kind = TV__JOB_IMPORT;
    snprintf(j.model, sizeof j.model, "%s", model);
    snprintf(j.source, sizeof j.source, "%s", source);
    j.bytes_total = total;
    return &j;
}

static const char *UUID1 = "0f8fad5b-d9cb-469f-a165-70867728950e";
static const char *UUID2 = "7c9e6679-7425-40de-944b-e07fc1f90ae7";

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    assert_non_null(f);
    tv_test_tmpdir(f->dir, sizeof f->dir, "registry");
    snprintf(f->path, sizeof f->path, "%s/registry.db", f->dir);
    tv_error err = {0};
    int rc = tv__reg_open(f->path, &f->reg, &err);
    if (rc)
        fprintf(stderr, "open: %s\n", err.msg);
    assert_int_equal(rc, 0);
    tv__reg_device d;
    fill_device(&d, UUID1, 256 * MiB);
    assert_int_equal(tv__reg_device_add(f->reg, &d, &f->dev, &err), 0);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    tv__reg_close(f->reg);
    tv_test_rmtree(f->dir);
    free(f);
    return 0;
}

static void sha_of(uint64_t k, char out[65])
{
    snprintf(out, 65, "%064llx", (unsigned long long)k);
}

static int64_t query_int(sqlite3 *db, const char *sql)
{
    sqlite3_stmt *st = NULL;
    assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    int64_t v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return v;
}

/* Builds a complete generation of one shard (file_len bytes) stored in a
 * committed object with hash sha_of(k) (reused when already on the device),
 * with tensors "a" and "b", and makes it ready. */
static int64_t make_ready(fixture *f, const char *model, uint64_t k, int64_t *object_id)
{
    tv_error err = {0};
    tv__reg_generation g;
    const uint64_t file_len = 1000, header_len = 100;
    char sha[65], hsha[65];
    sha_of(k, sha);
    sha_of(k + 1000000, hsha);
    assert_int_equal(tv__reg_begin(f->reg, &err), 0);
    assert_int_equal(tv__reg_generation_create(f->reg, model, "/imports/m", 892, &g, &err), 0);
    tv__reg_object o;
    if (tv__reg_object_find_committed(f->reg, f->dev, sha, &o, NULL) != 0) {
        assert_int_equal(tv__alloc_reserve(f->reg, f->dev, file_len, &o, &err), 0);
        assert_int_equal(tv__reg_object_commit(f->reg, o.id, sha, &err), 0);
    }
    tv__reg_shard_in in = {.idx = 0,
                           .name = "model.safetensors",
                           .file_len = file_len,
                           .header_len = header_len,
                           .sha256_hex = sha,
                           .header_sha256_hex = hsha};
    int64_t shard;
    assert_int_equal(tv__reg_shard_add(f->reg, g.id, &in, &shard, &err), 0);
    assert_int_equal(tv__reg_shard_bind(f->reg, shard, o.id, &err), 0);
    uint64_t shape_a[2] = {10, 10}, shape_b[1] = {123};
    tv_tensor_info t[2] = {
        {.name = "a",
         .name_len = 1,
         .dtype = TV_DTYPE_F32,
         .rank = 2,
         .shape = shape_a,
         .shard = 0,
         .begin_off = 0,
         .end_off = 400},
        {.name = "b",
         .name_len = 1,
         .dtype = TV_DTYPE_F32,
         .rank = 1,
         .shape = shape_b,
         .shard = 0,
         .begin_off = 400,
         .end_off = 892},
    };
    assert_int_equal(tv__reg_tensors_insert(f->reg, g.id, t, 2, &err), 0);
    int rc = tv__reg_generation_set_state(f->reg, g.id, TV__GEN_READY, &err);
    if (rc)
        fprintf(stderr, "ready: %s\n", err.msg);
    assert_int_equal(rc, 0);
    assert_int_equal(tv__reg_commit(f->reg, &err), 0);
    if (object_id)
        *object_id = o.id;
    return g.number;
}

/* ---- migrations and pragmas --------------------------------------------- */

static void test_migrations_fresh(void **state)
{
    fixture *f = *state;
    int v = -1;
    assert_int_equal(tv__reg_schema_version(f->reg, &v, NULL), 0);
    assert_true(tv__reg_schema_latest() >= 1);
    assert_int_equal(v, tv__reg_schema_latest());
    sqlite3 *db = tv__reg_sqlite(f->reg);
    static const char *const tables[] = {"devices", "objects",       "models",  "generations",
                                         "shards",  "shard_objects", "tensors", "jobs",
                                         "leases",  "api_tokens",    "aliases"};
    for (size_t i = 0; i < sizeof tables / sizeof tables[0]; i++) {
        char sql[160];
        snprintf(sql, sizeof sql,
                 "SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND "
                 "name = '%s'",
                 tables[i]);
        assert_int_equal(query_int(db, sql), 1);
    }
    assert_int_equal(query_int(db, "SELECT count(*) FROM sqlite_schema WHERE name = "
                                   "'objects_device_sha256'"),
                     1);
}

static void test_reopen_is_noop(void **state)
{
    fixture *f = *state;
    tv__reg_close(f->reg);
    f->reg = NULL;
    tv_error err = {0};
    assert_int_equal(tv__reg_open(f->path, &f->reg, &err), 0);
    size_t applied = 99;
    assert_int_equal(
        tv__migrate(tv__reg_sqlite(f->reg), tv__migrations, tv__n_migrations, &applied, &err), 0);
    assert_int_equal(applied, 0);
    tv__reg_device d;
    assert_int_equal(tv__reg_device_get(f->reg, f->dev, &d, &err), 0); /* data kept */
    assert_string_equal(d.uuid, UUID1);
}

static void test_newer_version_refused(void **state)
{
    fixture *f = *state;
    tv__reg_close(f->reg);
    f->reg = NULL;
    sqlite3 *db = NULL;
    assert_int_equal(sqlite3_open(f->path, &db), SQLITE_OK);
    char sql[64];
    snprintf(sql, sizeof sql, "PRAGMA user_version = %d", tv__reg_schema_latest() + 1);
    assert_int_equal(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
    tv_error err = {0};
    tv__reg *reg = (tv__reg *)&err; /* must be reset to NULL */
    assert_int_equal(tv__reg_open(f->path, &reg, &err), TV_E_REGISTRY_TOO_NEW);
    assert_null(reg);
    assert_int_equal(err.code, TV_E_REGISTRY_TOO_NEW);
    assert_non_null(strstr(err.msg, "newer"));
    assert_string_equal(tv_err_name(TV_E_REGISTRY_TOO_NEW), "TV_E_REGISTRY_TOO_NEW");
}

static void test_failed_migration_is_atomic(void **state)
{
    fixture *f = *state;
    char path[160];
    snprintf(path, sizeof path, "%s/raw.db", f->dir);
    sqlite3 *db = NULL;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    const tv__migration list[] = {
        {1, "0001_a.sql", "CREATE TABLE a (x INTEGER);"},
        {2, "0002_b.sql", "CREATE TABLE b (x INTEGER); INSERT INTO a VALUES (1); CREATE TABLE ("},
    };
    tv_error err = {0};
    size_t applied = 0;
    assert_int_equal(tv__migrate(db, list, 2, &applied, &err), TV_E_REGISTRY);
    assert_int_equal(applied, 1);
    assert_non_null(strstr(err.msg, "0002_b.sql"));
    int v = -1;
    assert_int_equal(tv__migrate_version(db, &v, NULL), 0);
    assert_int_equal(v, 1);
    assert_int_equal(query_int(db, "SELECT count(*) FROM sqlite_schema WHERE name = 'b'"), 0);
    assert_int_equal(query_int(db, "SELECT count(*) FROM a"), 0);
    /* A malformed list (numbers not 1..n) is an internal error. */
    const tv__migration bad[] = {{2, "0002_x.sql", "SELECT 1;"}};
    assert_int_equal(tv__migrate(db, bad, 1, NULL, NULL), TV_E_INTERNAL);
    /* And a database ahead of the list is refused untouched. */
    assert_int_equal(tv__migrate(db, list, 0, NULL, &err), TV_E_REGISTRY_TOO_NEW);
    sqlite3_close(db);
    unlink(path);
}

/* A new database NAME in the fixture's dir with the first n_applied
 * migrations applied (an older store), foreign keys on; its path in path. */
static sqlite3 *db_at_version(fixture *f, const char *name, size_t n_applied, char *path,
                              size_t path_len)
{
    snprintf(path, path_len, "%s/%s", f->dir, name);
    sqlite3 *db = NULL;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    assert_int_equal(sqlite3_exec(db, "PRAGMA foreign_keys = ON", NULL, NULL, NULL), SQLITE_OK);
    tv_error err = {0};
    assert_true(tv__n_migrations > n_applied);
    assert_int_equal(tv__migrate(db, tv__migrations, n_applied, NULL, &err), 0);
    return db;
}

/* 0002 rebuilds import_jobs as jobs, copying the rows, and gives existing
 * tokens the admin scope. */
static void test_migration_0002_keeps_rows(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    char path[160];
    sqlite3 *db = db_at_version(f, "old.db", 1, path, sizeof path);
    assert_int_equal(
        sqlite3_exec(
            db,
            "INSERT INTO import_jobs (model, source, state, bytes_total, bytes_done, "
            "generation, finished_at) VALUES ('a', '/s/a', 'succeeded', 10, 10, 2, 5);"
            "INSERT INTO import_jobs (model, source, state, error, finished_at) "
            "VALUES ('b', '/s/b', 'failed', 'disk full', 6);"
            "INSERT INTO import_jobs (model, source) VALUES ('c', '/s/c');"
            "INSERT INTO api_tokens (name, sha256) VALUES ('old', '0000000000000000000000000000000000000000000000000000000000000001');"
            /* 0003: total_bytes was the tensor data bytes (7); it becomes the
             * shard files' 100 + 50; a generation without shards keeps its 9 */
            "INSERT INTO models (name, last_generation) VALUES ('m', 2);"
            "INSERT INTO generations (model_id, number, source, total_bytes) VALUES (1, 1, '/s', 7);"
            "INSERT INTO generations (model_id, number, source, total_bytes) VALUES (1, 2, '/s', 9);"
            "INSERT INTO shards (generation_id, idx, name, file_len, header_len, sha256, header_sha256) VALUES (1, 0, 'a', 100, 10, '0000000000000000000000000000000000000000000000000000000000000001', '0000000000000000000000000000000000000000000000000000000000000002');"
            "INSERT INTO shards (generation_id, idx, name, file_len, header_len, sha256, header_sha256) VALUES (1, 1, 'b', 50, 10, '0000000000000000000000000000000000000000000000000000000000000003', '0000000000000000000000000000000000000000000000000000000000000004');",
            NULL, NULL, NULL),
        SQLITE_OK);
    size_t applied = 0;
    assert_int_equal(tv__migrate(db, tv__migrations, tv__n_migrations, &applied, &err), 0);
    assert_int_equal(applied, tv__n_migrations - 1);
    assert_int_equal(query_int(db, "SELECT count(*) FROM sqlite_schema WHERE name = "
                                   "'import_jobs'"),
                     0);
    assert_int_equal(query_int(db, "SELECT count(*) FROM jobs WHERE kind = 'import'"), 3);
    assert_int_equal(query_int(db, "SELECT generation FROM jobs WHERE model = 'a' AND "
                                   "state = 'succeeded' AND finished_at = 5 AND bytes_done = 10"),
                     2);
    assert_int_equal(query_int(db, "SELECT error_errno FROM jobs WHERE model = 'b' AND "
                                   "error = 'disk full' AND error_code = 'TV_E_INTERNAL'"),
                     TV_E_INTERNAL);
    assert_int_equal(query_int(db, "SELECT count(*) FROM jobs WHERE model = 'c' AND "
                                   "state = 'queued' AND started_at IS NULL"),
                     1);
    assert_int_equal(query_int(db, "SELECT count(*) FROM api_tokens WHERE scope = 'admin' "
                                   "AND revoked_at IS NULL"),
                     1);
    assert_int_equal(query_int(db, "SELECT total_bytes FROM generations WHERE number = 1"), 150);
    assert_int_equal(query_int(db, "SELECT total_bytes FROM generations WHERE number = 2"), 9);
    assert_int_equal(query_int(db, "SELECT count(*) FROM pragma_foreign_key_check"), 0);
    sqlite3_close(db);
    unlink(path);
}

static void test_pragmas_in_effect(void **state)
{
    fixture *f = *state;
    sqlite3 *db = tv__reg_sqlite(f->reg);
    sqlite3_stmt *st = NULL;
    assert_int_equal(sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &st, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    assert_string_equal((const char *)sqlite3_column_text(st, 0), "wal");
    sqlite3_finalize(st);
    assert_int_equal(query_int(db, "PRAGMA foreign_keys"), 1);
    assert_int_equal(query_int(db, "PRAGMA synchronous"), 2);
    assert_int_equal(query_int(db, "PRAGMA busy_timeout"), TV__REG_BUSY_TIMEOUT_MS);
    int on = -1;
    assert_int_equal(sqlite3_db_config(db, SQLITE_DBCONFIG_DEFENSIVE, -1, &on), SQLITE_OK);
    assert_int_equal(on, 1);
    /* Defensive mode: writable_schema cannot be used to corrupt the file. */
    assert_int_equal(sqlite3_exec(db, "PRAGMA writable_schema = ON", NULL, NULL, NULL), SQLITE_OK);
    assert_int_not_equal(sqlite3_exec(db,
                                      "UPDATE sqlite_schema SET sql = 'x' WHERE name = "
                                      "'devices'",
                                      NULL, NULL, NULL),
                         SQLITE_OK);
    struct stat sb;
    assert_int_equal(stat(f->path, &sb), 0);
    assert_int_equal(sb.st_mode & 0777, 0600);
    /* Foreign keys are enforced. */
    assert_int_not_equal(sqlite3_exec(db,
                                      "INSERT INTO generations (model_id, number, source) "
                                      "VALUES (999, 1, 'x')",
                                      NULL, NULL, NULL),
                         SQLITE_OK);
}

static void test_open_bad_arguments(void **state)
{
    (void)state;
    tv__reg *reg = NULL;
    assert_int_equal(tv__reg_open(":memory:", &reg, NULL), TV_E_INVALID_ARG);
    assert_int_equal(tv__reg_open("", &reg, NULL), TV_E_INVALID_ARG);
    assert_int_equal(tv__reg_open(NULL, &reg, NULL), TV_E_INVALID_ARG);
    assert_int_equal(tv__reg_open("/nonexistent-dir/x/registry.db", &reg, NULL), -ENOENT);
    assert_null(reg);
    tv__reg_close(NULL);
    assert_int_equal(tv__reg_rollback(NULL), TV_E_INVALID_ARG);
}

/* ---- devices ------------------------------------------------------------- */

static void test_devices(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    tv__reg_device d, got;
    fill_device(&d, UUID1, 256 * MiB);
    assert_int_equal(tv__reg_device_add(f->reg, &d, NULL, &err), -EEXIST);
    fill_device(&d, UUID2, 512 * MiB);
    snprintf(d.kind, sizeof d.kind, "nvme");
    int64_t id2 = 0;
    assert_int_equal(tv__reg_device_add(f->reg, &d, &id2, &err), 0);
    assert_int_equal(tv__reg_device_get(f->reg, id2, &got, &err), 0);
    assert_string_equal(got.uuid, UUID2);
    assert_string_equal(got.kind, "nvme");
    assert_int_equal(got.size_bytes, 512 * MiB);
    assert_int_equal(got.data_off, OA);
    assert_non_null(strstr(got.identity, "serial"));
    assert_int_equal(tv__reg_device_get_by_uuid(f->reg, UUID2, &got, &err), 0);
    assert_int_equal(got.id, id2);
    assert_int_equal(tv__reg_device_get(f->reg, 9999, &got, &err), TV_E_NOT_FOUND);
    tv__reg_device *all = NULL;
    size_t n = 0;
    assert_int_equal(tv__reg_device_list(f->reg, &all, &n, &err), 0);
    assert_int_equal(n, 2);
    assert_int_equal(all[0].id, f->dev);
    assert_int_equal(all[1].id, id2);
    free(all);

    /* Validation. */
    const char *other = "11111111-2222-4333-8444-555555555555";
    fill_device(&d, "0F8FAD5B-D9CB-469F-A165-70867728950E", 256 * MiB); /* upper case */
    assert_int_equal(tv__reg_device_add(f->reg, &d, NULL, &err), TV_E_INVALID_ARG);
    fill_device(&d, other, 256 * MiB);
    d.data_off = OA + 4096; /* not object_align aligned */
    assert_int_equal(tv__reg_device_add(f->reg, &d, NULL, &err), TV_E_INVALID_ARG);
    fill_device(&d, other, 256 * MiB);
    d.region_off = 0; /* the region never starts at byte 0 */
    assert_int_equal(tv__reg_device_add(f->reg, &d, NULL, &err), TV_E_INVALID_ARG);
    fill_device(&d, other, 256 * MiB);
    d.region_len = 256 * MiB; /* past the end */
    assert_int_equal(tv__reg_device_add(f->reg, &d, NULL, &err), TV_E_INVALID_ARG);
    fill_device(&d, other, 256 * MiB);
    d.region_len = UINT64_MAX;
    assert_int_equal(tv__reg_device_add(f->reg, &d, NULL, &err), TV_E_OVERFLOW);
    fill_device(&d, other, 256 * MiB);
    d.io_align = 2048;
    assert_int_equal(tv__reg_device_add(f->reg, &d, NULL, &err), TV_E_INVALID_ARG);
    fill_device(&d, other, 256 * MiB);
    snprintf(d.kind, sizeof d.kind, "tape");
    assert_int_equal(tv__reg_device_add(f->reg, &d, NULL, &err), TV_E_INVALID_ARG);
    fill_device(&d, other, 256 * MiB);
    snprintf(d.identity, sizeof d.identity, "[1,2]");
    assert_int_equal(tv__reg_device_add(f->reg, &d, NULL, &err), TV_E_INVALID_ARG);
    fill_device(&d, other, 256 * MiB);
    d.identity[0] = '\0'; /* stored as {} */
    assert_int_equal(tv__reg_device_add(f->reg, &d, &id2, &err), 0);
    assert_int_equal(tv__reg_device_get(f->reg, id2, &got, &err), 0);
    assert_string_equal(got.identity, "{}");
}

/* ---- objects ------------------------------------------------------------- */

static void test_object_reserve_commit_dedup(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    tv__reg_object a, b, c, got;
    assert_int_equal(tv__alloc_reserve(f->reg, f->dev, 1, &a, &err), 0);
    assert_int_equal(a.state, TV__OBJ_WRITING);
    assert_int_equal(a.base_off, OA); /* data_off */
    assert_int_equal(a.alloc_len, OA);
    assert_int_equal(a.canonical_len, 1);
    assert_string_equal(a.sha256, "");
    assert_int_equal(tv__alloc_reserve(f->reg, f->dev, 3 * OA + 1, &b, &err), 0);
    assert_int_equal(b.base_off, 2 * OA);
    assert_int_equal(b.alloc_len, 4 * OA);
    assert_int_equal(tv__alloc_reserve(f->reg, f->dev, OA, &c, &err), 0);
    assert_int_equal(c.base_off, 6 * OA);

    char sha[65], sha2[65];
    sha_of(7, sha);
    sha_of(8, sha2);
    assert_int_equal(tv__reg_object_find_committed(f->reg, f->dev, sha, &got, &err),
                     TV_E_NOT_FOUND);
    assert_int_equal(tv__reg_object_commit(f->reg, b.id, sha, &err), 0);
    assert_int_equal(tv__reg_object_find_committed(f->reg, f->dev, sha, &got, &err), 0);
    assert_int_equal(got.id, b.id);
    assert_int_equal(got.state, TV__OBJ_COMMITTED);
    assert_string_equal(got.sha256, sha);
    /* committing twice, or a duplicate of a committed hash, is refused */
    assert_int_equal(tv__reg_object_commit(f->reg, b.id, sha2, &err), TV_E_STATE);
    assert_int_equal(tv__reg_object_commit(f->reg, a.id, sha, &err), -EEXIST);
    assert_int_equal(tv__reg_object_commit(f->reg, a.id, "ABC", &err), TV_E_INVALID_ARG);
    assert_int_equal(tv__reg_object_commit(f->reg, 9999, sha2, &err), TV_E_NOT_FOUND);
    /* the same hash on another device is a different object */
    tv__reg_device d2;
    int64_t dev2;
    fill_device(&d2, UUID2, 64 * MiB);
    assert_int_equal(tv__reg_device_add(f->reg, &d2, &dev2, &err), 0);
    tv__reg_object other;
    assert_int_equal(tv__alloc_reserve(f->reg, dev2, 100, &other, &err), 0);
    assert_int_equal(tv__reg_object_commit(f->reg, other.id, sha, &err), 0);

    tv__reg_object *list = NULL;
    size_t n = 0;
    assert_int_equal(tv__reg_objects_list_committed(f->reg, f->dev, &list, &n, &err), 0);
    assert_int_equal(n, 1);
    free(list);
    assert_int_equal(tv__reg_objects_list_committed(f->reg, 0, &list, &n, &err), 0);
    assert_int_equal(n, 2);
    free(list);
    assert_int_equal(tv__reg_objects_on_device(f->reg, f->dev, &list, &n, &err), 0);
    assert_int_equal(n, 3);
    assert_true(list[0].base_off < list[1].base_off && list[1].base_off < list[2].base_off);
    free(list);

    /* Freeing a writing object makes its extent the lowest gap again. */
    assert_int_equal(tv__reg_object_delete(f->reg, a.id, &err), 0);
    assert_int_equal(tv__reg_object_get(f->reg, a.id, &got, &err), TV_E_NOT_FOUND);
    tv__reg_object again;
    assert_int_equal(tv__alloc_reserve(f->reg, f->dev, 10, &again, &err), 0);
    assert_int_equal(again.base_off, OA);

    tv__alloc_space sp;
    assert_int_equal(tv__alloc_device_space(f->reg, f->dev, &sp, &err), 0);
    assert_int_equal(sp.used_len, 6 * OA);
    assert_int_equal(sp.total_len, 256 * MiB - OA);
    assert_int_equal(sp.free_len, sp.total_len - sp.used_len);
    assert_int_equal(tv__alloc_reserve(f->reg, f->dev, 256 * MiB, &got, &err), TV_E_NO_SPACE);
    assert_non_null(strstr(err.msg, UUID1));
    assert_int_equal(tv__alloc_reserve(f->reg, 4242, 10, &got, &err), TV_E_NOT_FOUND);
}

static void test_schema_refuses_bad_extents(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    int64_t id;
    assert_int_equal(tv__reg_object_insert_writing(f->reg, f->dev, 4 * OA, OA, 10, &id, &err), 0);
    /* overlapping, misaligned, before data_off, past the region end */
    assert_int_equal(tv__reg_object_insert_writing(f->reg, f->dev, 3 * OA, 2 * OA, 10, NULL, &err),
                     TV_E_REGISTRY);
    assert_non_null(strstr(err.msg, "overlaps"));
    assert_int_equal(tv__reg_object_insert_writing(f->reg, f->dev, 4 * OA, OA, 10, NULL, &err),
                     TV_E_REGISTRY);
    assert_int_equal(
        tv__reg_object_insert_writing(f->reg, f->dev, 8 * OA + 4096, OA, 10, NULL, &err),
        TV_E_REGISTRY);
    assert_non_null(strstr(err.msg, "aligned"));
    assert_int_equal(tv__reg_object_insert_writing(f->reg, f->dev, 0, OA, 10, NULL, &err),
                     TV_E_REGISTRY);
    assert_int_equal(tv__reg_object_insert_writing(f->reg, f->dev, 256 * MiB, OA, 10, NULL, &err),
                     TV_E_REGISTRY);
    assert_non_null(strstr(err.msg, "outside"));
    assert_int_equal(tv__reg_object_insert_writing(f->reg, f->dev, 9 * OA, OA, 2 * OA, NULL, &err),
                     TV_E_INVALID_ARG);
    assert_int_equal(tv__reg_object_insert_writing(f->reg, 777, 9 * OA, OA, 1, NULL, &err),
                     TV_E_NOT_FOUND);
    assert_int_equal(
        tv__reg_object_insert_writing(f->reg, f->dev, UINT64_MAX - OA + 1, OA, 1, NULL, &err),
        TV_E_OVERFLOW);
    /* Committed objects are immutable even to raw SQL. */
    char sha[65];
    sha_of(1, sha);
    assert_int_equal(tv__reg_object_commit(f->reg, id, sha, &err), 0);
    assert_int_not_equal(sqlite3_exec(tv__reg_sqlite(f->reg),
                                      "UPDATE objects SET state = 'writing', sha256 = NULL", NULL,
                                      NULL, NULL),
                         SQLITE_OK);
    assert_int_not_equal(
        sqlite3_exec(tv__reg_sqlite(f->reg), "UPDATE objects SET base_off = 0", NULL, NULL, NULL),
        SQLITE_OK);
}

static void test_reclaim_writing(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    int64_t committed_obj;
    make_ready(f, "llama", 1, &committed_obj);
    assert_int_equal(tv__reg_generation_activate(f->reg, "llama", 1, &err), 0);
    /* A crashed import: a writing object bound to an importing generation
     * and a running job. */
    tv__reg_generation g;
    tv__reg_object w, w2;
    int64_t shard, job;
    char sha[65];
    sha_of(2, sha);
    assert_int_equal(tv__reg_generation_create(f->reg, "llama", "/imports/x", 0, &g, &err), 0);
    assert_int_equal(tv__alloc_reserve(f->reg, f->dev, 1000, &w, &err), 0);
    assert_int_equal(tv__alloc_reserve(f->reg, f->dev, 5000, &w2, &err), 0);
    tv__reg_shard_in in = {.idx = 0,
                           .name = "s",
                           .file_len = 1000,
                           .header_len = 10,
                           .sha256_hex = sha,
                           .header_sha256_hex = sha};
    assert_int_equal(tv__reg_shard_add(f->reg, g.id, &in, &shard, &err), 0);
    assert_int_equal(tv__reg_shard_bind(f->reg, shard, w.id, &err), 0);
    /* a writing binding keeps the generation from becoming ready */
    assert_int_equal(tv__reg_generation_set_state(f->reg, g.id, TV__GEN_READY, &err), TV_E_STATE);
    assert_non_null(strstr(err.msg, "being written"));
    assert_int_equal(
        tv__reg_job_create(f->reg, import_spec("llama", "/imports/x", 100), &job, &err), 0);
    assert_int_equal(tv__reg_job_progress(f->reg, job, "write", 10, 100, 0, g.number, &err), 0);

    tv__reg_reclaim r;
    assert_int_equal(tv__reg_reclaim_writing(f->reg, &r, &err), 0);
    assert_int_equal(r.n_objects, 2);
    assert_int_equal(r.n_generations, 1);
    assert_int_equal(r.n_jobs, 1);
    tv__reg_object got;
    assert_int_equal(tv__reg_object_get(f->reg, w.id, &got, &err), TV_E_NOT_FOUND);
    assert_int_equal(tv__reg_object_get(f->reg, w2.id, &got, &err), TV_E_NOT_FOUND);
    assert_int_equal(tv__reg_object_get(f->reg, committed_obj, &got, &err), 0);
    assert_int_equal(tv__reg_generation_get_by_id(f->reg, g.id, &g, &err), 0);
    assert_int_equal(g.state, TV__GEN_FAILED);
    tv__reg_job j;
    assert_int_equal(tv__reg_job_get(f->reg, job, &j, &err), 0);
    assert_int_equal(j.state, TV__JOB_FAILED);
    assert_true(j.finished_at > 0);
    assert_non_null(strstr(j.error, "interrupted by a daemon restart"));
    assert_string_equal(j.error_code, "TV_E_INTERNAL");
    assert_int_equal(j.error_errno, TV_E_INTERNAL);
    free(j.result_json);
    /* the event log says so, in the same transaction */
    tv__reg_event_row *ev = NULL;
    size_t n_ev = 0;
    bool more = false;
    assert_int_equal(
        tv__reg_events_page(f->reg, "llama", 0, 1, NULL, NULL, &ev, &n_ev, &more, &err), 0);
    assert_int_equal(n_ev, 1);
    assert_string_equal(ev[0].action, "import.failed");
    assert_string_equal(ev[0].actor, "daemon");
    assert_int_equal(ev[0].generation, g.number);
    assert_non_null(strstr(ev[0].after, "interrupted by a daemon restart"));
    tv__reg_events_free(ev, n_ev);
    /* the previously active generation is intact */
    int64_t active;
    assert_int_equal(tv__reg_active_generation(f->reg, "llama", &active, &err), 0);
    assert_int_equal(active, 1);
    tv__reg_manifest *m = NULL;
    assert_int_equal(tv__reg_generation_get(f->reg, "llama", 1, &g, &err), 0);
    assert_int_equal(tv__reg_tensors_list(f->reg, g.id, &m, &err), 0);
    assert_int_equal(m->n_tensors, 2);
    assert_int_equal(m->shards[0].replicas[0].object_id, committed_obj);
    tv__reg_manifest_free(m);
    /* idempotent */
    assert_int_equal(tv__reg_reclaim_writing(f->reg, &r, &err), 0);
    assert_int_equal(r.n_objects + r.n_generations + r.n_jobs, 0);
}

/* Resume records (0005_job_resume): the reclaim keeps the writing objects a
 * record names (and the record), deletes the rest, drops records unused for
 * a day; take moves the newest finished record of model + source to a job. */
static void test_reclaim_keeps_resume_records(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    tv__reg_object kept, lost, old;
    int64_t job, stale, next, other, from;
    char rec[256], *json = NULL;
    assert_int_equal(tv__alloc_reserve(f->reg, f->dev, 1000, &kept, &err), 0);
    assert_int_equal(tv__alloc_reserve(f->reg, f->dev, 2000, &lost, &err), 0);
    assert_int_equal(tv__alloc_reserve(f->reg, f->dev, 3000, &old, &err), 0);
    const char *url = "http://origin/m/model.safetensors";
    assert_int_equal(tv__reg_job_create(f->reg, import_spec("m", url, 100), &job, &err), 0);
    assert_int_equal(tv__reg_job_progress(f->reg, job, "write", 10, 100, 0, 0, &err), 0);
    snprintf(rec, sizeof rec, "{\"objects\":[{\"object\":%lld,\"done\":65536}]}",
             (long long)kept.id);
    assert_int_equal(tv__reg_job_set_resume(f->reg, job, rec, &err), 0);
    assert_int_equal(tv__reg_job_set_resume(f->reg, job, "[1]", &err), TV_E_INVALID_ARG);
    /* a record of a job that failed two days ago */
    assert_int_equal(tv__reg_job_create(f->reg, import_spec("m", url, 100), &stale, &err), 0);
    assert_int_equal(tv__reg_job_finish(f->reg, stale, TV__JOB_FAILED, -EIO, "x", 0, NULL, &err),
                     0);
    snprintf(rec, sizeof rec, "{\"objects\":[{\"object\":%lld,\"done\":0}]}", (long long)old.id);
    assert_int_equal(tv__reg_job_set_resume(f->reg, stale, rec, &err), 0);
    sqlite3 *db = tv__reg_sqlite(f->reg);
    char sql[160];
    snprintf(sql, sizeof sql,
             "UPDATE jobs SET finished_at = CAST(strftime('%%s', 'now') AS INTEGER) - 172800 "
             "WHERE id = %lld",
             (long long)stale);
    assert_int_equal(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);

    tv__reg_reclaim r;
    assert_int_equal(tv__reg_reclaim_writing(f->reg, &r, &err), 0);
    assert_int_equal(r.n_objects, 2);
    assert_int_equal(r.n_kept, 1);
    assert_int_equal(r.n_expired, 1);
    assert_int_equal(r.n_jobs, 1);
    tv__reg_object got;
    assert_int_equal(tv__reg_object_get(f->reg, kept.id, &got, &err), 0);
    assert_int_equal(got.state, TV__OBJ_WRITING);
    assert_int_equal(tv__reg_object_get(f->reg, lost.id, &got, &err), TV_E_NOT_FOUND);
    assert_int_equal(tv__reg_object_get(f->reg, old.id, &got, &err), TV_E_NOT_FOUND);
    assert_int_equal(query_int(db, "SELECT count(*) FROM jobs WHERE resume IS NOT NULL"), 1);

    /* another model or source finds nothing; the same takes it over once */
    assert_int_equal(tv__reg_job_create(f->reg, import_spec("m", url, 100), &next, &err), 0);
    assert_int_equal(tv__reg_job_create(f->reg, import_spec("n", url, 100), &other, &err), 0);
    assert_int_equal(tv__reg_job_take_resume(f->reg, other, "n", url, &json, &from, &err), 0);
    assert_null(json);
    assert_int_equal(from, 0);
    assert_int_equal(tv__reg_job_take_resume(f->reg, next, "m", "http://x/", &json, &from, &err),
                     0);
    assert_null(json);
    assert_int_equal(tv__reg_job_take_resume(f->reg, next, "m", url, &json, &from, &err), 0);
    assert_non_null(json);
    assert_int_equal(from, job);
    assert_non_null(strstr(json, "65536"));
    free(json);
    json = NULL;
    snprintf(sql, sizeof sql, "SELECT count(*) FROM jobs WHERE resume IS NOT NULL AND id = %lld",
             (long long)next);
    assert_int_equal(query_int(db, sql), 1);
    assert_int_equal(query_int(db, "SELECT count(*) FROM jobs WHERE resume IS NOT NULL"), 1);
    /* a job that is not finished is never taken from */
    assert_int_equal(tv__reg_job_take_resume(f->reg, other, "m", url, &json, &from, &err), 0);
    assert_null(json);
    /* the record moved with the object: a second reclaim keeps it still */
    assert_int_equal(tv__reg_reclaim_writing(f->reg, &r, &err), 0);
    assert_int_equal(r.n_kept, 1);
    assert_int_equal(r.n_objects, 0);
    assert_int_equal(tv__reg_job_set_resume(f->reg, next, NULL, &err), 0);
    assert_int_equal(tv__reg_reclaim_writing(f->reg, &r, &err), 0);
    assert_int_equal(r.n_kept, 0);
    assert_int_equal(r.n_objects, 1);
}

/* ---- generations --------------------------------------------------------- */

static void test_generation_numbering(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    tv__reg_generation g;
    for (int64_t i = 1; i <= 3; i++) {
        assert_int_equal(tv__reg_generation_create(f->reg, "llama", "/src", 10, &g, &err), 0);
        assert_int_equal(g.number, i);
        assert_int_equal(g.state, TV__GEN_IMPORTING);
        assert_string_equal(g.model, "llama");
        assert_false(g.active);
    }
    assert_int_equal(tv__reg_generation_create(f->reg, "qwen", "/src", 10, &g, &err), 0);
    assert_int_equal(g.number, 1);
    /* a failed create (inside a rolled-back transaction) does not burn a number */
    assert_int_equal(tv__reg_begin(f->reg, &err), 0);
    assert_int_equal(tv__reg_generation_create(f->reg, "qwen", "/src", 10, &g, &err), 0);
    assert_int_equal(g.number, 2);
    assert_int_equal(tv__reg_rollback(f->reg), 0);
    assert_int_equal(tv__reg_generation_create(f->reg, "qwen", "/src", 10, &g, &err), 0);
    assert_int_equal(g.number, 2);

    tv__reg_model *models = NULL;
    size_t n = 0;
    assert_int_equal(tv__reg_models_list(f->reg, &models, &n, &err), 0);
    assert_int_equal(n, 2);
    assert_string_equal(models[0].name, "llama");
    assert_int_equal(models[0].n_generations, 3);
    assert_int_equal(models[0].active_generation, 0);
    assert_string_equal(models[1].name, "qwen");
    assert_int_equal(models[1].n_generations, 2);
    free(models);
    tv__reg_generation *gens = NULL;
    assert_int_equal(tv__reg_generations_list(f->reg, "llama", &gens, &n, &err), 0);
    assert_int_equal(n, 3);
    assert_int_equal(gens[0].number, 1);
    assert_int_equal(gens[2].number, 3);
    free(gens);
    assert_int_equal(tv__reg_generations_list(f->reg, "nope", &gens, &n, &err), TV_E_NOT_FOUND);
    /* name validation */
    assert_int_equal(tv__reg_generation_create(f->reg, "", "/src", 0, &g, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv__reg_generation_create(f->reg, "a\nb", "/src", 0, &g, &err),
                     TV_E_INVALID_ARG);
    char longname[300];
    memset(longname, 'x', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    assert_int_equal(tv__reg_generation_create(f->reg, longname, "/src", 0, &g, &err),
                     TV_E_INVALID_ARG);
}

static void test_generation_state_rules(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    tv__reg_generation g;
    assert_int_equal(tv__reg_generation_create(f->reg, "llama", "/src", 10, &g, &err), 0);
    /* activating a non-ready generation */
    assert_int_equal(tv__reg_generation_activate(f->reg, "llama", 1, &err), TV_E_STATE);
    assert_non_null(strstr(err.msg, "importing"));
    /* ready without shards */
    assert_int_equal(tv__reg_generation_set_state(f->reg, g.id, TV__GEN_READY, &err), TV_E_STATE);
    assert_non_null(strstr(err.msg, "no shards"));
    /* retiring an importing generation */
    assert_int_equal(tv__reg_generation_retire(f->reg, "llama", 1, &err), TV_E_STATE);
    assert_int_equal(tv__reg_generation_set_state(f->reg, g.id, TV__GEN_FAILED, &err), 0);
    assert_int_equal(tv__reg_generation_set_state(f->reg, g.id, TV__GEN_READY, &err), TV_E_STATE);
    assert_int_equal(tv__reg_generation_set_state(f->reg, g.id, TV__GEN_IMPORTING, &err),
                     TV_E_STATE);
    assert_int_equal(tv__reg_generation_activate(f->reg, "llama", 1, &err), TV_E_STATE);
    assert_int_equal(tv__reg_generation_retire(f->reg, "llama", 1, &err), 0);
    assert_int_equal(tv__reg_generation_retire(f->reg, "llama", 1, &err), 0); /* no-op */
    assert_int_equal(tv__reg_generation_set_state(f->reg, g.id, TV__GEN_READY, &err), TV_E_STATE);
    /* shards can no longer be added */
    char sha[65];
    sha_of(3, sha);
    tv__reg_shard_in in = {.idx = 0,
                           .name = "s",
                           .file_len = 100,
                           .header_len = 10,
                           .sha256_hex = sha,
                           .header_sha256_hex = sha};
    assert_int_equal(tv__reg_shard_add(f->reg, g.id, &in, NULL, &err), TV_E_STATE);

    assert_int_equal(tv__reg_generation_activate(f->reg, "llama", 7, &err), TV_E_NOT_FOUND);
    assert_int_equal(tv__reg_generation_activate(f->reg, "nope", 1, &err), TV_E_NOT_FOUND);
    assert_non_null(strstr(err.msg, "no model"));
    assert_int_equal(tv__reg_generation_set_state(f->reg, 12345, TV__GEN_READY, &err),
                     TV_E_NOT_FOUND);
}

static void test_activate_rollback_retire(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    int64_t obj1, obj2;
    assert_int_equal(make_ready(f, "llama", 1, &obj1), 1);
    assert_int_equal(make_ready(f, "llama", 2, &obj2), 2);
    int64_t active = 0;
    assert_int_equal(tv__reg_active_generation(f->reg, "llama", &active, &err), TV_E_NOT_FOUND);
    assert_non_null(strstr(err.msg, "no active"));
    assert_int_equal(tv__reg_generation_activate(f->reg, "llama", 1, &err), 0);
    assert_int_equal(tv__reg_active_generation(f->reg, "llama", &active, &err), 0);
    assert_int_equal(active, 1);

    /* A reader on a second connection sees the switch only at commit. */
    tv__reg *reader = NULL;
    assert_int_equal(tv__reg_open(f->path, &reader, &err), 0);
    assert_int_equal(tv__reg_begin(f->reg, &err), 0);
    assert_int_equal(tv__reg_generation_activate(f->reg, "llama", 2, &err), 0);
    assert_int_equal(tv__reg_active_generation(reader, "llama", &active, &err), 0);
    assert_int_equal(active, 1);
    assert_int_equal(tv__reg_commit(f->reg, &err), 0);
    assert_int_equal(tv__reg_active_generation(reader, "llama", &active, &err), 0);
    assert_int_equal(active, 2);
    tv__reg_generation g;
    assert_int_equal(tv__reg_generation_get(reader, "llama", 0, &g, &err), 0);
    assert_int_equal(g.number, 2);
    assert_true(g.active);
    assert_int_equal(g.n_shards, 1);
    assert_int_equal(g.n_tensors, 2);
    tv__reg_close(reader);

    /* A rolled-back activation changes nothing. */
    assert_int_equal(tv__reg_begin(f->reg, &err), 0);
    assert_int_equal(tv__reg_generation_activate(f->reg, "llama", 1, &err), 0);
    assert_int_equal(tv__reg_rollback(f->reg), 0);
    assert_int_equal(tv__reg_active_generation(f->reg, "llama", &active, &err), 0);
    assert_int_equal(active, 2);

    /* Rollback = activate the older ready generation. */
    assert_int_equal(tv__reg_generation_activate(f->reg, "llama", 1, &err), 0);
    assert_int_equal(tv__reg_generation_activate(f->reg, "llama", 1, &err), 0); /* no-op */
    assert_int_equal(tv__reg_active_generation(f->reg, "llama", &active, &err), 0);
    assert_int_equal(active, 1);
    /* the active generation cannot be retired or failed */
    assert_int_equal(tv__reg_generation_retire(f->reg, "llama", 1, &err), TV_E_STATE);
    assert_non_null(strstr(err.msg, "active"));
    assert_int_equal(tv__reg_generation_retire(f->reg, "llama", 2, &err), 0);
    assert_int_equal(tv__reg_generation_activate(f->reg, "llama", 2, &err), TV_E_STATE);
    /* the schema backstop refuses a non-ready active generation too */
    assert_int_not_equal(sqlite3_exec(tv__reg_sqlite(f->reg),
                                      "UPDATE models SET active_generation = 2", NULL, NULL, NULL),
                         SQLITE_OK);
    assert_int_not_equal(sqlite3_exec(tv__reg_sqlite(f->reg),
                                      "UPDATE generations SET state = 'retired' WHERE number = 1",
                                      NULL, NULL, NULL),
                         SQLITE_OK);
    tv__reg_model *models = NULL;
    size_t n;
    assert_int_equal(tv__reg_models_list(f->reg, &models, &n, &err), 0);
    assert_int_equal(n, 1);
    assert_int_equal(models[0].active_generation, 1);
    assert_int_equal(models[0].n_generations, 2);
    free(models);
}

static void test_shards_bind_rules(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    tv__reg_generation g;
    tv__reg_object o, small, o2;
    char sha[65], other[65];
    sha_of(10, sha);
    sha_of(11, other);
    assert_int_equal(tv__reg_generation_create(f->reg, "m", "/src", 0, &g, &err), 0);
    tv__reg_shard_in in = {.idx = 0,
                           .name = "a.safetensors",
                           .file_len = 5000,
                           .header_len = 100,
                           .sha256_hex = sha,
                           .header_sha256_hex = sha};
    int64_t s0, s1;
    assert_int_equal(tv__reg_shard_add(f->reg, g.id, &in, &s0, &err), 0);
    assert_int_equal(tv__reg_shard_add(f->reg, g.id, &in, NULL, &err), -EEXIST);
    in.idx = 2; /* leaves a hole at idx 1 */
    in.name = "c.safetensors";
    assert_int_equal(tv__reg_shard_add(f->reg, g.id, &in, &s1, &err), 0);
    in.header_len = 4993; /* 8 + N > file_len */
    in.name = "d";
    in.idx = 3;
    assert_int_equal(tv__reg_shard_add(f->reg, g.id, &in, NULL, &err), TV_E_INVALID_ARG);

    assert_int_equal(tv__alloc_reserve(f->reg, f->dev, 5000, &o, &err), 0);
    assert_int_equal(tv__alloc_reserve(f->reg, f->dev, 4000, &small, &err), 0);
    assert_int_equal(tv__reg_shard_bind(f->reg, s0, small.id, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv__alloc_reserve(f->reg, f->dev, 5000, &o2, &err), 0);
    assert_int_equal(tv__reg_object_commit(f->reg, o2.id, other, &err), 0);
    assert_int_equal(tv__reg_shard_bind(f->reg, s0, o2.id, &err), TV_E_HASH_MISMATCH);
    assert_int_equal(tv__reg_object_commit(f->reg, o.id, sha, &err), 0);
    assert_int_equal(tv__reg_shard_bind(f->reg, s0, o.id, &err), 0);
    assert_int_equal(tv__reg_shard_bind(f->reg, s0, o.id, &err), -EEXIST);
    assert_int_equal(tv__reg_shard_bind(f->reg, 999, o.id, &err), TV_E_NOT_FOUND);
    assert_int_equal(tv__reg_shard_bind(f->reg, s0, 999, &err), TV_E_NOT_FOUND);
    assert_int_equal(tv__reg_shard_bind(f->reg, s1, o.id, &err), 0); /* same content */
    /* idx 0, 2: out of sequence */
    assert_int_equal(tv__reg_generation_set_state(f->reg, g.id, TV__GEN_READY, &err), TV_E_STATE);
    assert_non_null(strstr(err.msg, "sequence"));

    /* A second replica on another device. */
    tv__reg_device d2;
    int64_t dev2;
    fill_device(&d2, UUID2, 64 * MiB);
    assert_int_equal(tv__reg_device_add(f->reg, &d2, &dev2, &err), 0);
    tv__reg_generation g2;
    tv__reg_object r2;
    assert_int_equal(tv__reg_generation_create(f->reg, "m", "/src", 0, &g2, &err), 0);
    in = (tv__reg_shard_in){.idx = 0,
                            .name = "a.safetensors",
                            .file_len = 5000,
                            .header_len = 100,
                            .sha256_hex = sha,
                            .header_sha256_hex = sha};
    assert_int_equal(tv__reg_shard_add(f->reg, g2.id, &in, &s0, &err), 0);
    assert_int_equal(tv__reg_shard_bind(f->reg, s0, o.id, &err), 0);
    assert_int_equal(tv__alloc_reserve(f->reg, dev2, 5000, &r2, &err), 0);
    assert_int_equal(tv__reg_object_commit(f->reg, r2.id, sha, &err), 0);
    assert_int_equal(tv__reg_shard_bind(f->reg, s0, r2.id, &err), 0);
    /* The schema ties a tensor's shard to the tensor's generation. */
    char sql[200];
    snprintf(sql, sizeof sql,
             "INSERT INTO tensors (generation_id, shard_id, name, dtype, shape, "
             "begin_off, end_off) VALUES (%lld, %lld, 'x', 0, '[1]', 0, 1)",
             (long long)g2.id, (long long)s1);
    assert_int_not_equal(sqlite3_exec(tv__reg_sqlite(f->reg), sql, NULL, NULL, NULL), SQLITE_OK);
    assert_int_equal(tv__reg_generation_set_state(f->reg, g2.id, TV__GEN_READY, &err), 0);
    tv__reg_manifest *m = NULL;
    assert_int_equal(tv__reg_tensors_list(f->reg, g2.id, &m, &err), 0);
    assert_int_equal(m->n_shards, 1);
    assert_int_equal(m->shards[0].n_replicas, 2);
    assert_int_equal(m->shards[0].replicas[0].device_id, f->dev);
    assert_int_equal(m->shards[0].replicas[0].base_off, o.base_off);
    assert_int_equal(m->shards[0].replicas[1].device_id, dev2);
    assert_int_equal(m->shards[0].replicas[1].base_off, r2.base_off);
    assert_true(m->shards[0].replicas[1].committed);
    assert_int_equal(m->shards[0].data_off, 108);
    assert_string_equal(m->shards[0].name, "a.safetensors");
    assert_int_equal(m->n_tensors, 0);
    tv__reg_manifest_free(m);
    tv__reg_manifest_free(NULL);
}

/* ---- explicit transactions ----------------------------------------------- */

static void test_explicit_transactions(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    assert_int_equal(tv__reg_commit(f->reg, &err), TV_E_STATE);
    assert_int_equal(tv__reg_rollback(f->reg), TV_E_STATE);
    assert_int_equal(tv__reg_tx_depth(f->reg), 0);

    /* A failed call inside a transaction leaves the transaction usable and
     * undoes only its own changes. */
    tv__reg_generation g;
    char sha[65];
    sha_of(5, sha);
    assert_int_equal(tv__reg_begin(f->reg, &err), 0);
    assert_int_equal(tv__reg_tx_depth(f->reg), 1);
    assert_int_equal(tv__reg_generation_create(f->reg, "m", "/src", 0, &g, &err), 0);
    tv__reg_shard_in in = {.idx = 0,
                           .name = "s",
                           .file_len = 100,
                           .header_len = 10,
                           .sha256_hex = sha,
                           .header_sha256_hex = sha};
    assert_int_equal(tv__reg_shard_add(f->reg, g.id, &in, NULL, &err), 0);
    assert_int_equal(tv__reg_shard_add(f->reg, g.id, &in, NULL, &err), -EEXIST);
    assert_int_equal(tv__reg_tx_depth(f->reg), 1);
    /* nesting */
    assert_int_equal(tv__reg_begin(f->reg, &err), 0);
    assert_int_equal(tv__reg_job_create(f->reg, import_spec("m", "/src", 0), NULL, &err), 0);
    assert_int_equal(tv__reg_rollback(f->reg), 0);
    assert_int_equal(tv__reg_commit(f->reg, &err), 0);
    assert_int_equal(tv__reg_tx_depth(f->reg), 0);
    assert_int_equal(tv__reg_generation_get(f->reg, "m", 1, &g, &err), 0);
    assert_int_equal(g.n_shards, 1);
    tv__reg_job *jobs = NULL;
    size_t n = 9;
    bool more = true;
    assert_int_equal(tv__reg_jobs_page(f->reg, -1, -1, 0, 10, &jobs, &n, &more, &err), 0);
    assert_int_equal(n, 0);
    assert_false(more);
    assert_null(jobs);
}

/* ---- leases and gc ------------------------------------------------------- */

static bool listed(const tv__reg_object *list, size_t n, int64_t id)
{
    for (size_t i = 0; i < n; i++)
        if (list[i].id == id)
            return true;
    return false;
}

static void test_leases_protect_objects_from_gc(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    int64_t obj1, obj2, obj3;
    make_ready(f, "llama", 1, &obj1);
    make_ready(f, "llama", 2, &obj2);
    make_ready(f, "llama", 2, &obj3); /* generation 3: same content, dedup */
    assert_int_equal(obj3, obj2);
    assert_int_equal(tv__reg_generation_activate(f->reg, "llama", 1, &err), 0);

    tv__reg_lease l1, l0;
    assert_int_equal(tv__reg_lease_acquire(f->reg, "llama", 0, "fastpath:1", 42, &l0, &err), 0);
    assert_int_equal(l0.number, 1); /* the active one */
    assert_string_equal(l0.model, "llama");
    assert_int_equal(tv__reg_lease_acquire(f->reg, "llama", 1, "fastpath:2", 43, &l1, &err), 0);
    assert_int_equal(tv__reg_generation_activate(f->reg, "llama", 2, &err), 0);
    assert_int_equal(tv__reg_generation_retire(f->reg, "llama", 1, &err), 0); /* leases allow it */
    assert_int_equal(tv__reg_lease_acquire(f->reg, "llama", 1, "late", 1, NULL, &err), TV_E_STATE);
    assert_int_equal(tv__reg_lease_acquire(f->reg, "llama", 9, "late", 1, NULL, &err),
                     TV_E_NOT_FOUND);
    assert_int_equal(tv__reg_lease_acquire(f->reg, "llama", 2, "", 1, NULL, &err),
                     TV_E_INVALID_ARG);

    tv__reg_object *gc = NULL;
    size_t n = 0;
    assert_int_equal(tv__reg_objects_unreferenced(f->reg, &gc, &n, &err), 0);
    assert_false(listed(gc, n, obj1)); /* leased */
    assert_false(listed(gc, n, obj2)); /* active */
    free(gc);
    assert_int_equal(tv__reg_object_delete(f->reg, obj1, &err), TV_E_LEASED);
    assert_int_equal(tv__reg_object_delete(f->reg, obj2, &err), TV_E_STATE);

    tv__reg_lease *leases = NULL;
    assert_int_equal(tv__reg_leases_list(f->reg, &leases, &n, &err), 0);
    assert_int_equal(n, 2);
    assert_int_equal(leases[0].pid, 42);
    assert_string_equal(leases[1].owner, "fastpath:2");
    free(leases);

    assert_int_equal(tv__reg_lease_release(f->reg, l0.id, &err), 0);
    assert_int_equal(tv__reg_lease_release(f->reg, l0.id, &err), TV_E_NOT_FOUND);
    assert_int_equal(tv__reg_objects_unreferenced(f->reg, &gc, &n, &err), 0);
    assert_false(listed(gc, n, obj1)); /* still one lease */
    free(gc);
    size_t released = 0;
    assert_int_equal(tv__reg_lease_release_owner(f->reg, "fastpath:2", &released, &err), 0);
    assert_int_equal(released, 1);
    assert_int_equal(tv__reg_objects_unreferenced(f->reg, &gc, &n, &err), 0);
    assert_int_equal(n, 1);
    assert_int_equal(gc[0].id, obj1);
    free(gc);

    /* Generation 2 retired: its object is still needed by generation 3. */
    assert_int_equal(tv__reg_generation_activate(f->reg, "llama", 3, &err), 0);
    assert_int_equal(tv__reg_generation_retire(f->reg, "llama", 2, &err), 0);
    assert_int_equal(tv__reg_objects_unreferenced(f->reg, &gc, &n, &err), 0);
    assert_false(listed(gc, n, obj2));
    free(gc);

    assert_int_equal(tv__reg_object_delete(f->reg, obj1, &err), 0);
    assert_int_equal(tv__reg_objects_unreferenced(f->reg, &gc, &n, &err), 0);
    assert_int_equal(n, 0);
    free(gc);
    /* the retired generation's manifest lost its replica */
    tv__reg_generation g1;
    tv__reg_manifest *m = NULL;
    assert_int_equal(tv__reg_generation_get(f->reg, "llama", 1, &g1, &err), 0);
    assert_int_equal(tv__reg_tensors_list(f->reg, g1.id, &m, &err), 0);
    assert_int_equal(m->shards[0].n_replicas, 0);
    tv__reg_manifest_free(m);
}

/* ---- tensors ------------------------------------------------------------- */

#define N_BULK   120000u
#define N_SHARDS 4u

static void test_bulk_120k_tensors(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    const uint64_t per_shard = N_BULK / N_SHARDS, tensor_len = 8, header_len = 4096;
    const uint64_t file_len = 8 + header_len + per_shard * tensor_len;
    tv_tensor_info *t = calloc(N_BULK, sizeof *t);
    char *names = malloc((size_t)N_BULK * 32);
    uint64_t *shapes = malloc((size_t)N_BULK * 2 * sizeof *shapes);
    assert_non_null(t);
    assert_non_null(names);
    assert_non_null(shapes);
    for (uint32_t i = 0; i < N_BULK; i++) {
        char *name = names + (size_t)i * 32;
        int len = snprintf(name, 32, "model.layers.%u.weight", i);
        shapes[2 * i] = 1;
        shapes[2 * i + 1] = 2;
        t[i] = (tv_tensor_info){.name = name,
                                .name_len = (size_t)len,
                                .dtype = TV_DTYPE_F32,
                                .rank = 2,
                                .shape = &shapes[2 * i],
                                .shard = i / per_shard,
                                .begin_off = (i % per_shard) * tensor_len,
                                .end_off = (i % per_shard + 1) * tensor_len};
    }
    t[7].rank = 0; /* a scalar */

    tv__reg_generation g;
    tv__reg_object objs[N_SHARDS];
    assert_int_equal(tv__reg_begin(f->reg, &err), 0);
    assert_int_equal(
        tv__reg_generation_create(f->reg, "big", "/src", N_BULK * tensor_len, &g, &err), 0);
    for (uint32_t s = 0; s < N_SHARDS; s++) {
        char sha[65], name[64];
        sha_of(100 + s, sha);
        snprintf(name, sizeof name, "model-%05u-of-%05u.safetensors", s + 1, N_SHARDS);
        tv__reg_shard_in in = {.idx = s,
                               .name = name,
                               .file_len = file_len,
                               .header_len = header_len,
                               .sha256_hex = sha,
                               .header_sha256_hex = sha};
        int64_t shard;
        assert_int_equal(tv__reg_shard_add(f->reg, g.id, &in, &shard, &err), 0);
        assert_int_equal(tv__alloc_reserve(f->reg, f->dev, file_len, &objs[s], &err), 0);
        assert_int_equal(tv__reg_object_commit(f->reg, objs[s].id, sha, &err), 0);
        assert_int_equal(tv__reg_shard_bind(f->reg, shard, objs[s].id, &err), 0);
    }
    /* all or nothing: a duplicate name at the very end rolls the batch back */
    const char *keep = t[N_BULK - 1].name;
    t[N_BULK - 1].name = t[0].name;
    t[N_BULK - 1].name_len = t[0].name_len;
    assert_int_equal(tv__reg_tensors_insert(f->reg, g.id, t, N_BULK, &err), -EEXIST);
    assert_non_null(strstr(err.msg, "model.layers.0.weight"));
    t[N_BULK - 1].name = keep;
    t[N_BULK - 1].name_len = strlen(keep);
    assert_int_equal(tv__reg_generation_get_by_id(f->reg, g.id, &g, &err), 0);
    assert_int_equal(g.n_tensors, 0);
    /* bad rows are named */
    t[5].end_off = per_shard * tensor_len + 1;
    assert_int_equal(tv__reg_tensors_insert(f->reg, g.id, t, 10, &err), TV_E_INVALID_ARG);
    assert_non_null(strstr(err.msg, "model.layers.5.weight"));
    t[5].end_off = 6 * tensor_len;
    t[6].shard = 99;
    assert_int_equal(tv__reg_tensors_insert(f->reg, g.id, t, 10, &err), TV_E_NOT_FOUND);
    t[6].shard = 0;
    t[3].rank = TV_ST_MAX_RANK + 1;
    assert_int_equal(tv__reg_tensors_insert(f->reg, g.id, t, 10, &err), TV_E_INVALID_ARG);
    t[3].rank = 2;
    t[3].dtype = TV_DTYPE_COUNT;
    assert_int_equal(tv__reg_tensors_insert(f->reg, g.id, t, 10, &err), TV_E_INVALID_ARG);
    t[3].dtype = TV_DTYPE_F32;
    uint64_t huge[2] = {UINT64_MAX, 1};
    t[4].shape = huge;
    assert_int_equal(tv__reg_tensors_insert(f->reg, g.id, t, 10, &err), TV_E_OVERFLOW);
    t[4].shape = &shapes[8];

    assert_int_equal(tv__reg_tensors_insert(f->reg, g.id, t, N_BULK, &err), 0);
    assert_int_equal(tv__reg_generation_set_state(f->reg, g.id, TV__GEN_READY, &err), 0);
    assert_int_equal(tv__reg_generation_activate(f->reg, "big", g.number, &err), 0);
    assert_int_equal(tv__reg_commit(f->reg, &err), 0);

    tv__reg_manifest *m = NULL;
    assert_int_equal(tv__reg_tensors_list(f->reg, g.id, &m, &err), 0);
    assert_int_equal(m->n_tensors, N_BULK);
    assert_int_equal(m->n_shards, N_SHARDS);
    assert_int_equal(m->generation.n_tensors, N_BULK);
    assert_true(m->generation.active);
    for (uint32_t i = 0; i < N_BULK; i += 997) {
        const tv__reg_tensor *x = &m->tensors[i];
        assert_string_equal(x->name, t[i].name);
        assert_int_equal(x->name_len, t[i].name_len);
        assert_int_equal(x->shard_idx, t[i].shard);
        assert_int_equal(x->begin_off, t[i].begin_off);
        assert_int_equal(x->end_off, t[i].end_off);
        assert_int_equal(x->dtype, TV_DTYPE_F32);
        assert_int_equal(x->rank, 2);
        assert_int_equal(x->shape[1], 2);
        const tv__reg_shard *s = &m->shards[x->shard_idx];
        assert_int_equal(s->n_replicas, 1);
        assert_int_equal(s->replicas[0].base_off, objs[x->shard_idx].base_off);
        assert_true(s->replicas[0].base_off + s->data_off + x->end_off <=
                    s->replicas[0].base_off + s->replicas[0].alloc_len);
    }
    assert_int_equal(m->tensors[7].rank, 0);
    for (size_t i = 1; i < m->n_tensors; i++) /* file order */
        assert_true(m->tensors[i - 1].shard_idx < m->tensors[i].shard_idx ||
                    (m->tensors[i - 1].shard_idx == m->tensors[i].shard_idx &&
                     m->tensors[i - 1].end_off <= m->tensors[i].begin_off));
    tv__reg_manifest_free(m);
    /* tensors cannot be added after publish */
    assert_int_equal(tv__reg_tensors_insert(f->reg, g.id, t, 1, &err), TV_E_STATE);
    free(t);
    free(names);
    free(shapes);
}

/* ---- import jobs --------------------------------------------------------- */

static void test_import_jobs(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    int64_t a, b, c;
    tv__reg_job j;
    assert_int_equal(
        tv__reg_job_create(f->reg, import_spec("llama", "/imports/llama", 0), &a, &err), 0);
    tv__reg_job *spec = import_spec("qwen", "/imports/qwen", 500);
    spec->activate = true;
    spec->strict = true;
    snprintf(spec->alias, sizeof spec->alias, "prod");
    assert_int_equal(tv__reg_job_create(f->reg, spec, &b, &err), 0);
    tv__reg_job v = {.kind = TV__JOB_VERIFY, .device_id = f->dev};
    assert_int_equal(tv__reg_job_create(f->reg, &v, &c, &err), 0);
    /* an import needs a model and a source; bad aliases are refused */
    assert_int_equal(tv__reg_job_create(f->reg, import_spec("", "/x", 0), NULL, &err),
                     TV_E_INVALID_ARG);
    spec = import_spec("m", "/x", 0);
    snprintf(spec->alias, sizeof spec->alias, "9bad");
    assert_int_equal(tv__reg_job_create(f->reg, spec, NULL, &err), TV_E_NAME);

    assert_int_equal(tv__reg_job_get(f->reg, b, &j, &err), 0);
    assert_int_equal(j.kind, TV__JOB_IMPORT);
    assert_int_equal(j.state, TV__JOB_QUEUED);
    assert_true(j.activate);
    assert_true(j.strict);
    assert_string_equal(j.alias, "prod");
    assert_string_equal(j.step, "");
    assert_int_equal(j.bytes_total, 500);
    assert_int_equal(j.started_at, 0);
    assert_null(j.result_json);
    assert_int_equal(tv__reg_job_get(f->reg, c, &j, &err), 0);
    assert_int_equal(j.kind, TV__JOB_VERIFY);
    assert_int_equal(j.device_id, f->dev);
    assert_string_equal(j.model, "");

    assert_int_equal(tv__reg_job_get(f->reg, a, &j, &err), 0);
    assert_int_equal(j.state, TV__JOB_QUEUED);
    assert_int_equal(j.finished_at, 0);
    assert_int_equal(tv__reg_job_progress(f->reg, a, "resolve", 50, 100, 12.5, 0, &err), 0);
    assert_int_equal(tv__reg_job_progress(f->reg, a, NULL, 150, 100, 0, 0, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv__reg_job_progress(f->reg, a, NULL, 1, 100, -1.0, 0, &err),
                     TV_E_INVALID_ARG);
    assert_int_equal(tv__reg_job_progress(f->reg, a, "a-step-name-too-long", 1, 100, 0, 0, &err),
                     TV_E_INVALID_ARG);
    assert_int_equal(tv__reg_job_get(f->reg, a, &j, &err), 0);
    assert_int_equal(j.state, TV__JOB_RUNNING);
    assert_string_equal(j.step, "resolve");
    assert_true(j.started_at > 0);
    assert_true(j.rate_bytes_per_s > 12.4 && j.rate_bytes_per_s < 12.6);
    assert_int_equal(j.bytes_done, 50);
    assert_int_equal(j.bytes_total, 100);
    /* step NULL keeps the step */
    assert_int_equal(tv__reg_job_progress(f->reg, a, NULL, 100, 100, 0, 3, &err), 0);
    assert_int_equal(tv__reg_job_get(f->reg, a, &j, &err), 0);
    assert_string_equal(j.step, "resolve");
    /* succeeded needs code 0, failed a code; the result must be an object */
    assert_int_equal(
        tv__reg_job_finish(f->reg, a, TV__JOB_SUCCEEDED, TV_E_NO_SPACE, NULL, 0, NULL, &err),
        TV_E_INVALID_ARG);
    assert_int_equal(tv__reg_job_finish(f->reg, a, TV__JOB_FAILED, 0, NULL, 0, NULL, &err),
                     TV_E_INVALID_ARG);
    assert_int_equal(tv__reg_job_finish(f->reg, a, TV__JOB_RUNNING, 0, NULL, 0, NULL, &err),
                     TV_E_INVALID_ARG);
    assert_int_equal(tv__reg_job_finish(f->reg, a, TV__JOB_SUCCEEDED, 0, NULL, 0, "[1]", &err),
                     TV_E_INVALID_ARG);
    assert_int_equal(tv__reg_job_finish(f->reg, a, TV__JOB_SUCCEEDED, 0, NULL, 0,
                                        "{\"model\":\"llama\",\"generation\":3}", &err),
                     0);
    assert_int_equal(tv__reg_job_get(f->reg, a, &j, &err), 0);
    assert_int_equal(j.state, TV__JOB_SUCCEEDED);
    assert_int_equal(j.generation, 3);
    assert_string_equal(j.error, "");
    assert_string_equal(j.error_code, "");
    assert_int_equal(j.error_errno, 0);
    assert_true(j.finished_at > 0);
    assert_non_null(j.result_json);
    assert_non_null(strstr(j.result_json, "\"generation\":3"));
    free(j.result_json);
    assert_int_equal(tv__reg_job_finish(f->reg, a, TV__JOB_SUCCEEDED, 0, NULL, 0, NULL, &err),
                     TV_E_STATE);
    assert_int_equal(tv__reg_job_progress(f->reg, a, NULL, 1, 100, 0, 0, &err), TV_E_STATE);
    assert_int_equal(
        tv__reg_job_finish(f->reg, b, TV__JOB_FAILED, TV_E_NO_SPACE, NULL, 0, NULL, &err), 0);
    assert_int_equal(tv__reg_job_get(f->reg, b, &j, &err), 0);
    assert_int_equal(j.state, TV__JOB_FAILED);
    assert_string_equal(j.error, tv_strerror(TV_E_NO_SPACE));
    assert_string_equal(j.error_code, "TV_E_NO_SPACE");
    assert_int_equal(j.error_errno, TV_E_NO_SPACE);
    /* queued -> cancelled directly */
    assert_int_equal(tv__reg_job_finish(f->reg, c, TV__JOB_CANCELLED, 0, NULL, 0, NULL, &err), 0);
    assert_int_equal(tv__reg_job_get(f->reg, c, &j, &err), 0);
    assert_int_equal(j.state, TV__JOB_CANCELLED);
    assert_true(j.finished_at > 0);
    assert_int_equal(tv__reg_job_finish(f->reg, c, TV__JOB_CANCELLED, 0, NULL, 0, NULL, &err),
                     TV_E_STATE);
    assert_int_equal(tv__reg_job_get(f->reg, 999, &j, &err), TV_E_NOT_FOUND);

    /* pages: newest first, filters, before_id cursor */
    tv__reg_job *list = NULL;
    size_t n = 0;
    bool more = false;
    assert_int_equal(tv__reg_jobs_page(f->reg, -1, -1, 0, 100, &list, &n, &more, &err), 0);
    assert_int_equal(n, 3);
    assert_false(more);
    assert_int_equal(list[0].id, c); /* newest first */
    assert_int_equal(list[2].id, a);
    assert_non_null(list[2].result_json);
    tv__reg_jobs_free(list, n);
    assert_int_equal(tv__reg_jobs_page(f->reg, -1, -1, 0, 2, &list, &n, &more, &err), 0);
    assert_int_equal(n, 2);
    assert_true(more);
    int64_t last = list[1].id;
    assert_int_equal(last, b);
    tv__reg_jobs_free(list, n);
    assert_int_equal(tv__reg_jobs_page(f->reg, -1, -1, last, 2, &list, &n, &more, &err), 0);
    assert_int_equal(n, 1);
    assert_false(more);
    assert_int_equal(list[0].id, a);
    tv__reg_jobs_free(list, n);
    assert_int_equal(tv__reg_jobs_page(f->reg, TV__JOB_FAILED, -1, 0, 10, &list, &n, &more, &err),
                     0);
    assert_int_equal(n, 1);
    assert_int_equal(list[0].id, b);
    tv__reg_jobs_free(list, n);
    assert_int_equal(tv__reg_jobs_page(f->reg, -1, TV__JOB_VERIFY, 0, 10, &list, &n, &more, &err),
                     0);
    assert_int_equal(n, 1);
    assert_int_equal(list[0].id, c);
    tv__reg_jobs_free(list, n);
    assert_int_equal(tv__reg_jobs_page(f->reg, 17, -1, 0, 10, &list, &n, &more, &err),
                     TV_E_INVALID_ARG);
    assert_int_equal(tv__reg_jobs_page(f->reg, -1, -1, 0, 0, &list, &n, &more, &err),
                     TV_E_INVALID_ARG);
    tv__reg_jobs_free(NULL, 0);

    assert_string_equal(tv__job_state_name(TV__JOB_RUNNING), "running");
    assert_string_equal(tv__job_state_name(TV__JOB_CANCELLED), "cancelled");
    assert_string_equal(tv__job_kind_name(TV__JOB_VERIFY), "verify");
    tv__job_state js;
    tv__job_kind jk;
    assert_int_equal(tv__job_state_parse("cancelled", &js), 0);
    assert_int_equal(js, TV__JOB_CANCELLED);
    assert_int_equal(tv__job_kind_parse("import", &jk), 0);
    assert_int_equal(jk, TV__JOB_IMPORT);
    assert_int_equal(tv__job_kind_parse("x", &jk), TV_E_INVALID_ARG);
    tv__gen_state gs;
    assert_int_equal(tv__gen_state_parse("retired", &gs), 0);
    assert_int_equal(gs, TV__GEN_RETIRED);
    assert_int_equal(tv__gen_state_parse("bogus", &gs), TV_E_INVALID_ARG);
}

/* ---- aliases, model get/delete, pages, tensors, tokens ------------------- */

static void test_aliases(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    int64_t obj;
    assert_int_equal(make_ready(f, "llama", 1, &obj), 1);
    assert_int_equal(make_ready(f, "llama", 2, &obj), 2);
    assert_int_equal(make_ready(f, "llama", 3, &obj), 3);
    /* the rule */
    assert_int_equal(tv__alias_name_valid("prod", &err), 0);
    assert_int_equal(tv__alias_name_valid("Canary-2.b_x", &err), 0);
    assert_int_equal(tv__alias_name_valid("active", &err), TV_E_NAME);
    assert_int_equal(tv__alias_name_valid("", &err), TV_E_NAME);
    assert_int_equal(tv__alias_name_valid("3", &err), TV_E_NAME);
    assert_int_equal(tv__alias_name_valid("_x", &err), TV_E_NAME);
    assert_int_equal(tv__alias_name_valid("a b", &err), TV_E_NAME);
    assert_int_equal(tv__alias_name_valid("a/b", &err), TV_E_NAME);
    assert_int_equal(tv__alias_name_valid("a@b", &err), TV_E_NAME);
    char long_alias[80];
    memset(long_alias, 'a', 64);
    long_alias[64] = '\0';
    assert_int_equal(tv__alias_name_valid(long_alias, &err), 0);
    long_alias[64] = 'a';
    long_alias[65] = '\0';
    assert_int_equal(tv__alias_name_valid(long_alias, &err), TV_E_NAME);

    assert_int_equal(tv__reg_alias_set(f->reg, "llama", "prod", 1, &err), 0);
    assert_int_equal(tv__reg_alias_set(f->reg, "llama", "canary", 2, &err), 0);
    int64_t num = 0;
    assert_int_equal(tv__reg_alias_get(f->reg, "llama", "prod", &num, &err), 0);
    assert_int_equal(num, 1);
    /* move */
    assert_int_equal(tv__reg_alias_set(f->reg, "llama", "prod", 3, &err), 0);
    assert_int_equal(tv__reg_alias_get(f->reg, "llama", "prod", &num, &err), 0);
    assert_int_equal(num, 3);
    /* errors */
    assert_int_equal(tv__reg_alias_set(f->reg, "llama", "prod", 9, &err), TV_E_NOT_FOUND);
    assert_int_equal(tv__reg_alias_set(f->reg, "nope", "prod", 1, &err), TV_E_NOT_FOUND);
    assert_int_equal(tv__reg_alias_set(f->reg, "llama", "bad name", 1, &err), TV_E_NAME);
    assert_int_equal(tv__reg_alias_get(f->reg, "llama", "missing", &num, &err), TV_E_NOT_FOUND);
    assert_non_null(strstr(err.msg, "missing"));
    assert_int_equal(tv__reg_alias_get(f->reg, "nope", "prod", &num, &err), TV_E_NOT_FOUND);
    /* "active" is the active generation: set activates, get reads it */
    assert_int_equal(tv__reg_alias_get(f->reg, "llama", "active", &num, &err), TV_E_NOT_FOUND);
    assert_int_equal(tv__reg_alias_set(f->reg, "llama", "active", 2, &err), 0);
    assert_int_equal(tv__reg_alias_get(f->reg, "llama", "active", &num, &err), 0);
    assert_int_equal(num, 2);
    assert_int_equal(tv__reg_alias_remove(f->reg, "llama", "active", NULL, &err), TV_E_NAME);

    /* list: by name, "active" not included */
    tv__reg_alias *list = NULL;
    size_t n = 0;
    assert_int_equal(tv__reg_aliases_list(f->reg, "llama", &list, &n, &err), 0);
    assert_int_equal(n, 2);
    assert_string_equal(list[0].alias, "canary");
    assert_int_equal(list[0].generation, 2);
    assert_string_equal(list[1].alias, "prod");
    assert_string_equal(list[1].model, "llama");
    assert_int_equal(list[1].generation, 3);
    assert_true(list[1].updated_at > 0);
    free(list);
    assert_int_equal(tv__reg_aliases_list(f->reg, "nope", &list, &n, &err), TV_E_NOT_FOUND);

    /* resolve */
    assert_int_equal(tv__reg_resolve_gen(f->reg, "llama", "1", &num, &err), 0);
    assert_int_equal(num, 1);
    assert_int_equal(tv__reg_resolve_gen(f->reg, "llama", "prod", &num, &err), 0);
    assert_int_equal(num, 3);
    assert_int_equal(tv__reg_resolve_gen(f->reg, "llama", "active", &num, &err), 0);
    assert_int_equal(num, 2);
    assert_int_equal(tv__reg_resolve_gen(f->reg, "llama", "7", &num, &err), TV_E_NOT_FOUND);
    assert_int_equal(tv__reg_resolve_gen(f->reg, "llama", "01", &num, &err), TV_E_NAME);
    assert_int_equal(tv__reg_resolve_gen(f->reg, "llama", "0", &num, &err), TV_E_NAME);
    assert_int_equal(tv__reg_resolve_gen(f->reg, "llama", "3x", &num, &err), TV_E_NAME);
    assert_int_equal(tv__reg_resolve_gen(f->reg, "llama", "99999999999999999999", &num, &err),
                     TV_E_NAME);
    assert_int_equal(tv__reg_resolve_gen(f->reg, "llama", "nope", &num, &err), TV_E_NOT_FOUND);
    assert_int_equal(tv__reg_resolve_gen(f->reg, "llama", "", &num, &err), TV_E_NAME);

    /* an aliased generation cannot be retired; the message names the alias */
    assert_int_equal(tv__reg_generation_retire(f->reg, "llama", 3, &err), TV_E_STATE);
    assert_non_null(strstr(err.msg, "'prod'"));
    /* the schema refuses it too */
    sqlite3 *db = tv__reg_sqlite(f->reg);
    assert_int_not_equal(sqlite3_exec(db,
                                      "UPDATE generations SET state = 'retired' WHERE number = 3",
                                      NULL, NULL, NULL),
                         SQLITE_OK);
    assert_int_not_equal(sqlite3_exec(db,
                                      "INSERT INTO aliases (model_id, name, generation) "
                                      "SELECT id, 'x', 9 FROM models WHERE name = 'llama'",
                                      NULL, NULL, NULL),
                         SQLITE_OK);
    /* retired generations cannot be aliased */
    assert_int_equal(tv__reg_generation_retire(f->reg, "llama", 1, &err), 0);
    assert_int_equal(tv__reg_alias_set(f->reg, "llama", "old", 1, &err), TV_E_STATE);
    assert_int_not_equal(
        sqlite3_exec(db, "UPDATE aliases SET generation = 1 WHERE name = 'prod'", NULL, NULL, NULL),
        SQLITE_OK);

    /* remove */
    assert_int_equal(tv__reg_alias_remove(f->reg, "llama", "prod", &num, &err), 0);
    assert_int_equal(num, 3);
    assert_int_equal(tv__reg_alias_remove(f->reg, "llama", "prod", &num, &err), TV_E_NOT_FOUND);
    assert_int_equal(tv__reg_generation_retire(f->reg, "llama", 3, &err), 0);
    assert_int_equal(tv__reg_tx_depth(f->reg), 0);
}

/* Deactivation clears models.active_generation: unknown model, no-op,
 * inside a rolled-back transaction, and a model delete afterwards. */
static void test_deactivate(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    assert_int_equal(make_ready(f, "llama", 1, NULL), 1);
    assert_int_equal(make_ready(f, "llama", 2, NULL), 2);
    int64_t was = -1, active = 0;
    assert_int_equal(tv__reg_generation_deactivate(f->reg, "nope", &was, &err), TV_E_NOT_FOUND);
    assert_non_null(strstr(err.msg, "'nope'"));
    assert_int_equal(was, -1);
    assert_int_equal(tv__reg_generation_deactivate(NULL, "llama", &was, &err), TV_E_INVALID_ARG);
    /* nothing active: a no-op */
    assert_int_equal(tv__reg_generation_deactivate(f->reg, "llama", &was, &err), 0);
    assert_int_equal(was, 0);
    assert_int_equal(tv__reg_generation_activate(f->reg, "llama", 2, &err), 0);
    /* rolled back: still active */
    assert_int_equal(tv__reg_begin(f->reg, &err), 0);
    assert_int_equal(tv__reg_generation_deactivate(f->reg, "llama", &was, &err), 0);
    assert_int_equal(was, 2);
    assert_int_equal(tv__reg_active_generation(f->reg, "llama", &active, &err), TV_E_NOT_FOUND);
    assert_int_equal(tv__reg_rollback(f->reg), 0);
    assert_int_equal(tv__reg_active_generation(f->reg, "llama", &active, &err), 0);
    assert_int_equal(active, 2);
    /* done: no active generation, the generation stays ready */
    was = -1;
    assert_int_equal(tv__reg_generation_deactivate(f->reg, "llama", &was, &err), 0);
    assert_int_equal(was, 2);
    assert_int_equal(tv__reg_active_generation(f->reg, "llama", &active, &err), TV_E_NOT_FOUND);
    assert_non_null(strstr(err.msg, "no active generation"));
    tv__reg_generation g;
    assert_int_equal(tv__reg_generation_get(f->reg, "llama", 2, &g, &err), 0);
    assert_int_equal(g.state, TV__GEN_READY);
    assert_false(g.active);
    assert_int_equal(tv__reg_generation_get(f->reg, "llama", 0, &g, &err), TV_E_NOT_FOUND);
    tv__reg_model m;
    assert_int_equal(tv__reg_model_get(f->reg, "llama", &m, &err), 0);
    assert_int_equal(m.active_generation, 0);
    assert_int_equal(query_int(tv__reg_sqlite(f->reg),
                               "SELECT count(*) FROM models WHERE active_generation IS NULL"),
                     1);
    assert_int_equal(tv__reg_generation_deactivate(f->reg, "llama", NULL, &err), 0); /* again */
    /* every generation can be retired now, and the model deleted */
    assert_int_equal(tv__reg_generation_retire(f->reg, "llama", 2, &err), 0);
    assert_int_equal(tv__reg_generation_activate(f->reg, "llama", 1, &err), 0);
    assert_int_equal(tv__reg_model_delete(f->reg, "llama", NULL, &err), TV_E_STATE);
    assert_int_equal(tv__reg_generation_deactivate(f->reg, "llama", &was, &err), 0);
    assert_int_equal(was, 1);
    size_t n_retired = 0;
    assert_int_equal(tv__reg_model_delete(f->reg, "llama", &n_retired, &err), 0);
    assert_int_equal(n_retired, 2);
    assert_int_equal(tv__reg_model_get(f->reg, "llama", &m, &err), TV_E_NOT_FOUND);
    assert_int_equal(tv__reg_tx_depth(f->reg), 0);
}

static void test_model_get_delete(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    int64_t obj1, obj2;
    assert_int_equal(make_ready(f, "llama", 1, &obj1), 1);
    assert_int_equal(make_ready(f, "llama", 2, &obj2), 2);
    assert_int_equal(make_ready(f, "qwen", 1, NULL), 1);
    tv__reg_model m;
    assert_int_equal(tv__reg_model_get(f->reg, "llama", &m, &err), 0);
    assert_string_equal(m.name, "llama");
    assert_int_equal(m.n_generations, 2);
    assert_int_equal(m.active_generation, 0);
    assert_int_equal(tv__reg_model_get(f->reg, "nope", &m, &err), TV_E_NOT_FOUND);
    assert_non_null(strstr(err.msg, "'nope'"));

    /* active: refused */
    assert_int_equal(tv__reg_generation_activate(f->reg, "qwen", 1, &err), 0);
    assert_int_equal(tv__reg_model_delete(f->reg, "qwen", NULL, &err), TV_E_STATE);
    assert_non_null(strstr(err.msg, "active"));
    /* aliased: refused, names the alias */
    assert_int_equal(tv__reg_alias_set(f->reg, "llama", "prod", 2, &err), 0);
    assert_int_equal(tv__reg_model_delete(f->reg, "llama", NULL, &err), TV_E_STATE);
    assert_non_null(strstr(err.msg, "'prod'"));
    assert_int_equal(tv__reg_alias_remove(f->reg, "llama", "prod", NULL, &err), 0);
    /* leased: refused */
    tv__reg_lease l;
    assert_int_equal(tv__reg_lease_acquire(f->reg, "llama", 1, "test", 1, &l, &err), 0);
    assert_int_equal(tv__reg_model_delete(f->reg, "llama", NULL, &err), TV_E_LEASED);
    assert_int_equal(tv__reg_lease_release(f->reg, l.id, &err), 0);
    /* importing: refused */
    tv__reg_generation g;
    assert_int_equal(tv__reg_generation_create(f->reg, "llama", "/x", 0, &g, &err), 0);
    assert_int_equal(tv__reg_model_delete(f->reg, "llama", NULL, &err), TV_E_STATE);
    assert_non_null(strstr(err.msg, "importing"));
    assert_int_equal(tv__reg_generation_set_state(f->reg, g.id, TV__GEN_FAILED, &err), 0);
    assert_int_equal(tv__reg_model_get(f->reg, "llama", &m, &err), 0);
    assert_int_equal(m.n_generations, 3);

    size_t n_retired = 0;
    assert_int_equal(tv__reg_model_delete(f->reg, "llama", &n_retired, &err), 0);
    assert_int_equal(n_retired, 3);
    assert_int_equal(tv__reg_model_get(f->reg, "llama", &m, &err), TV_E_NOT_FOUND);
    assert_int_equal(tv__reg_model_delete(f->reg, "llama", NULL, &err), TV_E_NOT_FOUND);
    sqlite3 *db = tv__reg_sqlite(f->reg);
    assert_int_equal(query_int(db, "SELECT count(*) FROM generations g JOIN models m ON "
                                   "m.id = g.model_id WHERE m.name = 'llama'"),
                     0);
    assert_int_equal(query_int(db, "SELECT count(*) FROM tensors"), 2); /* qwen's */
    /* the objects became garbage for gc (obj1 is shared with qwen: dedup) */
    tv__reg_object *garbage = NULL;
    size_t n = 0;
    assert_int_equal(tv__reg_objects_unreferenced(f->reg, &garbage, &n, &err), 0);
    assert_int_equal(n, 1);
    assert_int_equal(garbage[0].id, obj2);
    free(garbage);
    /* numbers are never reused: a new llama starts over as a new model */
    assert_int_equal(make_ready(f, "llama", 5, NULL), 1);
    assert_int_equal(tv__reg_tx_depth(f->reg), 0);
}

static void test_model_and_generation_pages(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    const char *names[] = {"delta", "alpha", "charlie", "bravo", "echo"};
    for (size_t i = 0; i < 5; i++)
        make_ready(f, names[i], 1, NULL);
    make_ready(f, "alpha", 2, NULL);
    make_ready(f, "alpha", 3, NULL);
    tv__reg_model *ms = NULL;
    size_t n = 0;
    bool more = false;
    char after[TV__REG_NAME_MAX + 1] = "";
    const char *seen[8];
    size_t n_seen = 0;
    do {
        assert_int_equal(tv__reg_models_page(f->reg, after, 2, &ms, &n, &more, &err), 0);
        assert_true(n >= 1 && n <= 2);
        for (size_t i = 0; i < n; i++)
            seen[n_seen++] = strcmp(ms[i].name, "alpha") == 0     ? "alpha"
                             : strcmp(ms[i].name, "bravo") == 0   ? "bravo"
                             : strcmp(ms[i].name, "charlie") == 0 ? "charlie"
                             : strcmp(ms[i].name, "delta") == 0   ? "delta"
                                                                  : "echo";
        snprintf(after, sizeof after, "%s", ms[n - 1].name);
        free(ms);
    } while (more);
    assert_int_equal(n_seen, 5);
    assert_string_equal(seen[0], "alpha");
    assert_string_equal(seen[4], "echo");
    assert_int_equal(tv__reg_models_page(f->reg, "echo", 2, &ms, &n, &more, &err), 0);
    assert_int_equal(n, 0);
    assert_false(more);
    assert_int_equal(tv__reg_models_page(f->reg, "", 0, &ms, &n, &more, &err), TV_E_INVALID_ARG);

    tv__reg_generation *gs = NULL;
    assert_int_equal(tv__reg_generations_page(f->reg, "alpha", 0, 2, &gs, &n, &more, &err), 0);
    assert_int_equal(n, 2);
    assert_true(more);
    assert_int_equal(gs[0].number, 1);
    assert_int_equal(gs[1].number, 2);
    assert_int_equal(gs[1].n_tensors, 2);
    free(gs);
    assert_int_equal(tv__reg_generations_page(f->reg, "alpha", 2, 2, &gs, &n, &more, &err), 0);
    assert_int_equal(n, 1);
    assert_false(more);
    assert_int_equal(gs[0].number, 3);
    free(gs);
    assert_int_equal(tv__reg_generations_page(f->reg, "nope", 0, 2, &gs, &n, &more, &err),
                     TV_E_NOT_FOUND);
}

/* A ready generation of model with the tensors names[i] of sizes[i] bytes
 * (NULL: 8 bytes each; name order differs from file order) in two shards. */
static int64_t make_sized_tensors(fixture *f, const char *model, const char *const *names,
                                  const uint64_t *sizes, size_t n)
{
    tv_error err = {0};
    tv__reg_generation g;
    char sha[2][65], hsha[65];
    sha_of(77, sha[0]);
    sha_of(78, sha[1]);
    sha_of(79, hsha);
    assert_int_equal(tv__reg_begin(f->reg, &err), 0);
    assert_int_equal(tv__reg_generation_create(f->reg, model, "/imports/t", 0, &g, &err), 0);
    tv_tensor_info *t = calloc(n, sizeof *t);
    uint64_t shape[1] = {2};
    assert_non_null(t);
    for (uint32_t s = 0; s < 2; s++) {
        tv__reg_object o;
        if (tv__reg_object_find_committed(f->reg, f->dev, sha[s], &o, NULL) != 0) {
            assert_int_equal(tv__alloc_reserve(f->reg, f->dev, 1000, &o, &err), 0);
            assert_int_equal(tv__reg_object_commit(f->reg, o.id, sha[s], &err), 0);
        }
        char sname[32];
        snprintf(sname, sizeof sname, "model-%u.safetensors", s);
        tv__reg_shard_in in = {.idx = s,
                               .name = sname,
                               .file_len = 1000,
                               .header_len = 100 + s,
                               .sha256_hex = sha[s],
                               .header_sha256_hex = hsha};
        int64_t shard;
        assert_int_equal(tv__reg_shard_add(f->reg, g.id, &in, &shard, &err), 0);
        assert_int_equal(tv__reg_shard_bind(f->reg, shard, o.id, &err), 0);
    }
    uint64_t at[2] = {0, 0};
    for (size_t i = 0; i < n; i++) {
        /* first half in shard 0, the rest in shard 1, file order = i */
        uint32_t s = i < n / 2 ? 0 : 1;
        uint64_t len = sizes ? sizes[i] : 8;
        t[i] = (tv_tensor_info){.name = names[i],
                                .name_len = strlen(names[i]),
                                .dtype = TV_DTYPE_F32,
                                .rank = 1,
                                .shape = shape,
                                .shard = s,
                                .begin_off = at[s],
                                .end_off = at[s] + len};
        at[s] += len;
    }
    assert_int_equal(tv__reg_tensors_insert(f->reg, g.id, t, n, &err), 0);
    assert_int_equal(tv__reg_generation_set_state(f->reg, g.id, TV__GEN_READY, &err), 0);
    assert_int_equal(tv__reg_commit(f->reg, &err), 0);
    free(t);
    return g.id;
}

static int64_t make_tensors(fixture *f, const char *model, const char *const *names, size_t n)
{
    return make_sized_tensors(f, model, names, NULL, n);
}

static void test_tensor_pages(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    static const char *const names[] = {"model.layers.1.w", "model.layers.0.w",  "lm_head",
                                        "model.embed",      "model.layers.10.w", "model.norm",
                                        "model.layers.2.w"};
    const size_t N = sizeof names / sizeof names[0];
    int64_t gid = make_tensors(f, "t", names, N);
    tv__reg_tensor_row *rows = NULL;
    size_t n = 0;
    bool more = false;
    /* file order, pages of 2: exactly the insertion order */
    size_t seen = 0;
    int64_t after = 0;
    do {
        assert_int_equal(tv__reg_tensors_page(f->reg, gid, NULL, TV__REG_TENSORS_FILE, after, 0,
                                              NULL, 2, &rows, &n, &more, &err),
                         0);
        for (size_t i = 0; i < n; i++, seen++) {
            assert_string_equal(rows[i].name, names[seen]);
            assert_int_equal(rows[i].shard_idx, seen < N / 2 ? 0 : 1);
            assert_int_equal(rows[i].end_off - rows[i].begin_off, 8);
            assert_int_equal(rows[i].header_len, seen < N / 2 ? 100 : 101);
            assert_string_equal(rows[i].shard,
                                seen < N / 2 ? "model-0.safetensors" : "model-1.safetensors");
            assert_int_equal(rows[i].rank, 1);
            assert_int_equal(rows[i].shape[0], 2);
            assert_int_equal(rows[i].dtype, TV_DTYPE_F32);
        }
        after = rows[n - 1].row_id;
        tv__reg_tensor_rows_free(rows, n);
    } while (more);
    assert_int_equal(seen, N);
    /* by name */
    assert_int_equal(tv__reg_tensors_page(f->reg, gid, "", TV__REG_TENSORS_NAME, 0, 0, "", 3, &rows,
                                          &n, &more, &err),
                     0);
    assert_int_equal(n, 3);
    assert_true(more);
    assert_string_equal(rows[0].name, "lm_head");
    assert_string_equal(rows[1].name, "model.embed");
    assert_string_equal(rows[2].name, "model.layers.0.w");
    tv__reg_tensor_rows_free(rows, n);
    assert_int_equal(tv__reg_tensors_page(f->reg, gid, NULL, TV__REG_TENSORS_NAME, 0, 0,
                                          "model.layers.0.w", 100, &rows, &n, &more, &err),
                     0);
    assert_int_equal(n, 4);
    assert_false(more);
    assert_string_equal(rows[0].name, "model.layers.1.w");
    assert_string_equal(rows[1].name, "model.layers.10.w");
    tv__reg_tensor_rows_free(rows, n);
    /* prefix, both orders */
    assert_int_equal(tv__reg_tensors_page(f->reg, gid, "model.layers.1", TV__REG_TENSORS_NAME, 0, 0,
                                          NULL, 100, &rows, &n, &more, &err),
                     0);
    assert_int_equal(n, 2);
    assert_string_equal(rows[0].name, "model.layers.1.w");
    assert_string_equal(rows[1].name, "model.layers.10.w");
    tv__reg_tensor_rows_free(rows, n);
    assert_int_equal(tv__reg_tensors_page(f->reg, gid, "model.layers.", TV__REG_TENSORS_FILE, 0, 0,
                                          NULL, 100, &rows, &n, &more, &err),
                     0);
    assert_int_equal(n, 4);
    assert_string_equal(rows[0].name, "model.layers.1.w");
    assert_string_equal(rows[3].name, "model.layers.2.w");
    tv__reg_tensor_rows_free(rows, n);
    /* "%" and "_" are literal in prefixes */
    assert_int_equal(tv__reg_tensors_page(f->reg, gid, "lm%", TV__REG_TENSORS_NAME, 0, 0, NULL, 100,
                                          &rows, &n, &more, &err),
                     0);
    assert_int_equal(n, 0);
    assert_null(rows);
    assert_int_equal(tv__reg_tensors_page(f->reg, gid, "zzz", TV__REG_TENSORS_FILE, 0, 0, NULL, 100,
                                          &rows, &n, &more, &err),
                     0);
    assert_int_equal(n, 0);
    /* a substring anywhere in the name, case-sensitive, in every order and
     * with a prefix too; "%" literal */
    assert_int_equal(tv__reg_tensors_search(f->reg, gid, NULL, "layers.1", TV__REG_TENSORS_FILE, 0,
                                            0, NULL, 100, &rows, &n, &more, &err),
                     0);
    assert_int_equal(n, 2);
    assert_string_equal(rows[0].name, "model.layers.1.w");
    assert_string_equal(rows[1].name, "model.layers.10.w");
    tv__reg_tensor_rows_free(rows, n);
    assert_int_equal(tv__reg_tensors_search(f->reg, gid, "", ".w", TV__REG_TENSORS_NAME, 0, 0, NULL,
                                            2, &rows, &n, &more, &err),
                     0);
    assert_int_equal(n, 2);
    assert_true(more);
    assert_string_equal(rows[0].name, "model.layers.0.w");
    assert_string_equal(rows[1].name, "model.layers.1.w");
    tv__reg_tensor_rows_free(rows, n);
    assert_int_equal(tv__reg_tensors_search(f->reg, gid, NULL, ".w", TV__REG_TENSORS_NAME, 0, 0,
                                            "model.layers.1.w", 100, &rows, &n, &more, &err),
                     0);
    assert_int_equal(n, 2);
    assert_false(more);
    assert_string_equal(rows[0].name, "model.layers.10.w");
    assert_string_equal(rows[1].name, "model.layers.2.w");
    tv__reg_tensor_rows_free(rows, n);
    assert_int_equal(tv__reg_tensors_search(f->reg, gid, NULL, "norm", TV__REG_TENSORS_SIZE, 0, 0,
                                            NULL, 100, &rows, &n, &more, &err),
                     0);
    assert_int_equal(n, 1);
    assert_string_equal(rows[0].name, "model.norm");
    tv__reg_tensor_rows_free(rows, n);
    assert_int_equal(tv__reg_tensors_search(f->reg, gid, "lm", "head", TV__REG_TENSORS_FILE, 0, 0,
                                            NULL, 100, &rows, &n, &more, &err),
                     0);
    assert_int_equal(n, 1);
    assert_string_equal(rows[0].name, "lm_head");
    tv__reg_tensor_rows_free(rows, n);
    const char *const none[] = {"NORM", "%", "model.x", "lm_head.", NULL};
    for (size_t i = 0; none[i]; i++) {
        assert_int_equal(tv__reg_tensors_search(f->reg, gid, NULL, none[i], TV__REG_TENSORS_FILE, 0,
                                                0, NULL, 100, &rows, &n, &more, &err),
                         0);
        assert_int_equal(n, 0);
    }
    /* bad cursor, unknown generation */
    assert_int_equal(tv__reg_tensors_page(f->reg, gid, NULL, TV__REG_TENSORS_FILE, 999999, 0, NULL,
                                          2, &rows, &n, &more, &err),
                     TV_E_INVALID_ARG);
    assert_int_equal(tv__reg_tensors_page(f->reg, 999, NULL, TV__REG_TENSORS_FILE, 0, 0, NULL, 2,
                                          &rows, &n, &more, &err),
                     TV_E_NOT_FOUND);

    tv__reg_tensor_row row;
    assert_int_equal(tv__reg_tensor_get(f->reg, gid, "model.norm", &row, &err), 0);
    assert_string_equal(row.name, "model.norm");
    assert_int_equal(row.shard_idx, 1);
    assert_int_equal(row.begin_off, 8 * (5 - N / 2));
    assert_int_equal(row.header_len, 101);
    free(row.name);
    assert_int_equal(tv__reg_tensor_get(f->reg, gid, "nope", &row, &err), TV_E_NOT_FOUND);
    assert_null(row.name);
    assert_non_null(strstr(err.msg, "'nope'"));
    assert_int_equal(tv__reg_tensor_get(f->reg, 999, "lm_head", &row, &err), TV_E_NOT_FOUND);
    /* shards and replicas without the tensors */
    tv__reg_manifest *sm = NULL;
    assert_int_equal(tv__reg_shards_list(f->reg, gid, &sm, &err), 0);
    assert_int_equal(sm->n_shards, 2);
    assert_int_equal(sm->n_tensors, 0);
    assert_null(sm->tensors);
    assert_string_equal(sm->shards[1].name, "model-1.safetensors");
    assert_int_equal(sm->shards[1].header_len, 101);
    assert_int_equal(sm->shards[1].n_replicas, 1);
    assert_int_equal(sm->shards[1].replicas[0].device_id, f->dev);
    assert_true(sm->shards[1].replicas[0].committed);
    assert_int_equal(sm->generation.n_tensors, (int64_t)N);
    tv__reg_manifest_free(sm);
    assert_int_equal(tv__reg_shards_list(f->reg, 999, &sm, &err), TV_E_NOT_FOUND);
    assert_null(sm);
    assert_int_equal(tv__reg_tx_depth(f->reg), 0);
}

/* Expects the names of a size-ordered page. */
static void expect_names(const tv__reg_tensor_row *rows, size_t n, const char *const *want,
                         size_t n_want)
{
    assert_int_equal(n, n_want);
    for (size_t i = 0; i < n; i++)
        assert_string_equal(rows[i].name, want[i]);
}

static void test_tensor_pages_by_size(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    static const char *const names[] = {"m.a", "m.b", "n.c", "m.d", "n.e", "m.f", "m.g"};
    static const uint64_t sizes[] = {16, 8, 16, 0, 32, 8, 16};
    /* nbytes descending, ties by name (bytes) */
    static const char *const all[] = {"n.e", "m.a", "m.g", "n.c", "m.b", "m.f", "m.d"};
    static const char *const m_only[] = {"m.a", "m.g", "m.b", "m.f", "m.d"};
    const size_t N = sizeof names / sizeof names[0];
    int64_t gid = make_sized_tensors(f, "sz", names, sizes, N);
    tv__reg_tensor_row *rows = NULL;
    size_t n = 0, seen = 0;
    bool more = false;
    /* pages of 2, the cursor being the last row's (nbytes, name) */
    uint64_t after_nbytes = 0;
    char after[16] = "";
    do {
        assert_int_equal(tv__reg_tensors_page(f->reg, gid, NULL, TV__REG_TENSORS_SIZE, 0,
                                              after_nbytes, after, 2, &rows, &n, &more, &err),
                         0);
        assert_true(n >= 1 && n <= 2);
        for (size_t i = 0; i < n; i++, seen++) {
            assert_string_equal(rows[i].name, all[seen]);
            assert_int_equal(rows[i].end_off - rows[i].begin_off, seen == 0   ? 32
                                                                  : seen <= 3 ? 16
                                                                  : seen <= 5 ? 8
                                                                              : 0);
        }
        after_nbytes = rows[n - 1].end_off - rows[n - 1].begin_off;
        snprintf(after, sizeof after, "%s", rows[n - 1].name);
        tv__reg_tensor_rows_free(rows, n);
    } while (more);
    assert_int_equal(seen, N);
    /* one page holding everything: more is false */
    assert_int_equal(tv__reg_tensors_page(f->reg, gid, "", TV__REG_TENSORS_SIZE, 0, 0, NULL, 7,
                                          &rows, &n, &more, &err),
                     0);
    expect_names(rows, n, all, N);
    assert_false(more);
    tv__reg_tensor_rows_free(rows, n);
    /* prefix, then prefix after a cursor */
    assert_int_equal(tv__reg_tensors_page(f->reg, gid, "m.", TV__REG_TENSORS_SIZE, 0, 0, "", 100,
                                          &rows, &n, &more, &err),
                     0);
    expect_names(rows, n, m_only, 5);
    tv__reg_tensor_rows_free(rows, n);
    assert_int_equal(tv__reg_tensors_page(f->reg, gid, "m.", TV__REG_TENSORS_SIZE, 0, 16, "m.g",
                                          100, &rows, &n, &more, &err),
                     0);
    expect_names(rows, n, m_only + 2, 3);
    tv__reg_tensor_rows_free(rows, n);
    /* a key that names no row still starts the page right after it */
    assert_int_equal(tv__reg_tensors_page(f->reg, gid, NULL, TV__REG_TENSORS_SIZE, 0, 16, "m.b",
                                          100, &rows, &n, &more, &err),
                     0);
    expect_names(rows, n, all + 2, 5);
    tv__reg_tensor_rows_free(rows, n);
    /* past the end, no match */
    assert_int_equal(tv__reg_tensors_page(f->reg, gid, NULL, TV__REG_TENSORS_SIZE, 0, 0, "m.d", 100,
                                          &rows, &n, &more, &err),
                     0);
    assert_int_equal(n, 0);
    assert_false(more);
    assert_int_equal(tv__reg_tensors_page(f->reg, gid, "zz", TV__REG_TENSORS_SIZE, 0, 0, NULL, 1,
                                          &rows, &n, &more, &err),
                     0);
    assert_int_equal(n, 0);
    /* bad order, size over INT64_MAX, unknown generation */
    assert_int_equal(tv__reg_tensors_page(f->reg, gid, NULL, (tv__reg_tensor_order)7, 0, 0, NULL, 2,
                                          &rows, &n, &more, &err),
                     TV_E_INVALID_ARG);
    assert_int_equal(tv__reg_tensors_page(f->reg, gid, NULL, TV__REG_TENSORS_SIZE, 0, UINT64_MAX,
                                          "m.a", 2, &rows, &n, &more, &err),
                     TV_E_OVERFLOW);
    assert_null(rows);
    assert_int_equal(tv__reg_tensors_page(f->reg, 999, NULL, TV__REG_TENSORS_SIZE, 0, 0, NULL, 2,
                                          &rows, &n, &more, &err),
                     TV_E_NOT_FOUND);
}

static void test_tokens(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    char admin[TV__TOKEN_SECRET_LEN + 1], reader[TV__TOKEN_SECRET_LEN + 1];
    tv__reg_token t;
    assert_int_equal(tv__reg_token_create(f->reg, "ci", TV__SCOPE_ADMIN, admin, &t, &err), 0);
    assert_int_equal(strlen(admin), 68);
    assert_memory_equal(admin, "tvk_", 4);
    assert_string_equal(t.name, "ci");
    assert_int_equal(t.scope, TV__SCOPE_ADMIN);
    assert_int_equal(t.revoked_at, 0);
    assert_true(t.created_at > 0);
    int64_t admin_id = t.id;
    assert_int_equal(tv__reg_token_create(f->reg, "dash", TV__SCOPE_READ, reader, NULL, &err), 0);
    assert_string_not_equal(admin, reader);
    assert_int_equal(tv__reg_token_create(f->reg, "x", TV__SCOPE_NONE, reader, NULL, &err),
                     TV_E_INVALID_ARG);
    assert_int_equal(tv__reg_token_create(f->reg, "", TV__SCOPE_READ, reader, NULL, &err),
                     TV_E_INVALID_ARG);
    /* the secret is not stored, only its hash */
    sqlite3 *db = tv__reg_sqlite(f->reg);
    char sql[256];
    snprintf(sql, sizeof sql, "SELECT count(*) FROM api_tokens WHERE sha256 = '%s'", admin + 4);
    assert_int_equal(query_int(db, sql), 0);

    tv__scope scope = TV__SCOPE_NONE;
    tv__reg_token hit;
    assert_int_equal(tv__reg_token_check(f->reg, admin, &scope, &hit, &err), 0);
    assert_int_equal(scope, TV__SCOPE_ADMIN);
    assert_int_equal(hit.id, admin_id);
    assert_int_equal(hit.scope, TV__SCOPE_ADMIN);
    assert_string_equal(hit.name, "ci");
    assert_int_equal(tv__reg_token_check(f->reg, reader, &scope, NULL, &err), 0);
    assert_int_equal(scope, TV__SCOPE_READ);
    /* unknown, malformed */
    char wrong[TV__TOKEN_SECRET_LEN + 1];
    memcpy(wrong, admin, sizeof wrong);
    wrong[10] = wrong[10] == '0' ? '1' : '0';
    assert_int_equal(tv__reg_token_check(f->reg, wrong, &scope, NULL, &err), TV_E_UNAUTHORIZED);
    assert_int_equal(scope, TV__SCOPE_NONE);
    assert_int_equal(tv__reg_token_check(f->reg, "tvk_abc", &scope, NULL, &err), TV_E_UNAUTHORIZED);
    assert_int_equal(tv__reg_token_check(f->reg, "", &scope, NULL, &err), TV_E_UNAUTHORIZED);
    wrong[10] = 'G';
    assert_int_equal(tv__reg_token_check(f->reg, wrong, &scope, NULL, &err), TV_E_UNAUTHORIZED);

    tv__reg_token *list = NULL;
    size_t n = 0;
    assert_int_equal(tv__reg_tokens_list(f->reg, &list, &n, &err), 0);
    assert_int_equal(n, 2);
    assert_string_equal(list[0].name, "ci");
    assert_string_equal(list[1].name, "dash");
    assert_int_equal(list[1].scope, TV__SCOPE_READ);
    free(list);

    /* revoke: 401 afterwards, twice is a no-op */
    assert_int_equal(tv__reg_token_revoke(f->reg, admin_id, &t, &err), 0);
    assert_true(t.revoked_at > 0);
    int64_t first = t.revoked_at;
    assert_int_equal(tv__reg_token_check(f->reg, admin, &scope, NULL, &err), TV_E_UNAUTHORIZED);
    assert_non_null(strstr(err.msg, "revoked"));
    assert_int_equal(tv__reg_token_revoke(f->reg, admin_id, &t, &err), 0);
    assert_int_equal(t.revoked_at, first);
    assert_int_equal(tv__reg_token_revoke(f->reg, 999, &t, &err), TV_E_NOT_FOUND);
    assert_string_equal(tv__scope_name(TV__SCOPE_READ), "read");
    assert_null(tv__scope_name(TV__SCOPE_NONE));
    assert_int_equal(tv__scope_parse("admin", &scope), 0);
    assert_int_equal(scope, TV__SCOPE_ADMIN);
    assert_int_equal(tv__scope_parse("root", &scope), TV_E_INVALID_ARG);
    /* fleet: a scope of its own, stored and read back as such */
    assert_string_equal(tv__scope_name(TV__SCOPE_FLEET), "fleet");
    assert_int_equal(tv__scope_parse("fleet", &scope), 0);
    assert_int_equal(scope, TV__SCOPE_FLEET);
    assert_null(tv__scope_name((tv__scope)4));
    char peer[TV__TOKEN_SECRET_LEN + 1];
    assert_int_equal(tv__reg_token_create(f->reg, "peer", TV__SCOPE_FLEET, peer, &t, &err), 0);
    assert_int_equal(t.scope, TV__SCOPE_FLEET);
    assert_int_equal(tv__reg_token_check(f->reg, peer, &scope, &hit, &err), 0);
    assert_int_equal(scope, TV__SCOPE_FLEET);
    assert_int_equal(hit.id, t.id);
    assert_string_equal(hit.name, "peer");
    assert_int_equal(tv__reg_tokens_list(f->reg, &list, &n, &err), 0);
    assert_int_equal(n, 3);
    assert_int_equal(list[2].scope, TV__SCOPE_FLEET);
    free(list);
    assert_int_equal(tv__reg_token_create(f->reg, "x", (tv__scope)4, peer, NULL, &err),
                     TV_E_INVALID_ARG);
    /* the schema refuses any other scope */
    assert_int_not_equal(sqlite3_exec(db,
                                      "UPDATE api_tokens SET scope = 'root' WHERE name = 'peer'",
                                      NULL, NULL, NULL),
                         SQLITE_OK);
}

/* 0004 rebuilds api_tokens with the fleet scope: a version-3 database keeps
 * every token (id, name, hash, times, scope, revocation) and the table's
 * shape; the new CHECK takes 'fleet' and refuses others. */
static void test_migration_0004_keeps_tokens(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    char path[160];
    sqlite3 *db = db_at_version(f, "v3.db", 3, path, sizeof path);
    assert_int_not_equal(
        sqlite3_exec(db,
                     "INSERT INTO api_tokens (name, sha256, scope) VALUES ('f', "
                     "'00000000000000000000000000000000000000000000000000000000000000ff', 'fleet')",
                     NULL, NULL, NULL),
        SQLITE_OK);
    assert_int_equal(
        sqlite3_exec(
            db,
            "INSERT INTO api_tokens (id, name, sha256, created_at, scope) VALUES (7, 'ops', '0000000000000000000000000000000000000000000000000000000000000007', 100, 'admin');"
            "INSERT INTO api_tokens (id, name, sha256, created_at, scope, revoked_at) VALUES (9, 'dash', '0000000000000000000000000000000000000000000000000000000000000009', 200, 'read', 300);",
            NULL, NULL, NULL),
        SQLITE_OK);
    size_t applied = 0;
    assert_int_equal(tv__migrate(db, tv__migrations, tv__n_migrations, &applied, &err), 0);
    assert_int_equal(applied, tv__n_migrations - 3);
    assert_int_equal(query_int(db, "SELECT count(*) FROM api_tokens"), 2);
    assert_int_equal(
        query_int(db,
                  "SELECT count(*) FROM api_tokens WHERE id = 7 AND name = 'ops' "
                  "AND sha256 = '0000000000000000000000000000000000000000000000000000000000000007' "
                  "AND created_at = 100 AND scope = 'admin' AND revoked_at IS NULL"),
        1);
    assert_int_equal(query_int(db, "SELECT count(*) FROM api_tokens WHERE id = 9 AND name = 'dash' "
                                   "AND created_at = 200 AND scope = 'read' AND revoked_at = 300"),
                     1);
    /* same columns in the same order, STRICT, the hash still UNIQUE */
    assert_int_equal(query_int(db, "SELECT count(*) FROM pragma_table_info('api_tokens') WHERE "
                                   "(cid, name) IN (VALUES (0, 'id'), (1, 'name'), (2, 'sha256'), "
                                   "(3, 'created_at'), (4, 'scope'), (5, 'revoked_at'))"),
                     6);
    assert_int_equal(query_int(db, "SELECT count(*) FROM pragma_table_info('api_tokens')"), 6);
    assert_int_equal(
        query_int(db, "SELECT strict FROM pragma_table_list WHERE name = 'api_tokens'"), 1);
    assert_int_equal(
        query_int(db, "SELECT count(*) FROM sqlite_schema WHERE name = 'api_tokens_new'"), 0);
    assert_int_not_equal(
        sqlite3_exec(db,
                     "INSERT INTO api_tokens (name, sha256) VALUES ('dup', "
                     "'0000000000000000000000000000000000000000000000000000000000000007')",
                     NULL, NULL, NULL),
        SQLITE_OK);
    assert_int_equal(
        sqlite3_exec(db,
                     "INSERT INTO api_tokens (name, sha256, scope) VALUES ('f', "
                     "'00000000000000000000000000000000000000000000000000000000000000ff', 'fleet')",
                     NULL, NULL, NULL),
        SQLITE_OK);
    assert_int_not_equal(
        sqlite3_exec(db,
                     "INSERT INTO api_tokens (name, sha256, scope) VALUES ('r', "
                     "'00000000000000000000000000000000000000000000000000000000000000ee', 'root')",
                     NULL, NULL, NULL),
        SQLITE_OK);
    /* a new token without a scope is still admin, as before */
    assert_int_equal(
        sqlite3_exec(db,
                     "INSERT INTO api_tokens (name, sha256) VALUES ('d', "
                     "'00000000000000000000000000000000000000000000000000000000000000dd')",
                     NULL, NULL, NULL),
        SQLITE_OK);
    assert_int_equal(
        query_int(db, "SELECT count(*) FROM api_tokens WHERE name = 'd' AND scope = 'admin'"), 1);
    assert_int_equal(query_int(db, "SELECT count(*) FROM pragma_foreign_key_check"), 0);
    assert_int_equal(
        query_int(db, "SELECT count(*) FROM pragma_integrity_check WHERE integrity_check = 'ok'"),
        1);
    sqlite3_close(db);
    unlink(path);
}

/* ---- two writers --------------------------------------------------------- */

#define PER_THREAD 40

typedef struct worker {
    const char *path;
    int64_t dev;
    tv__reg_object got[PER_THREAD];
    int rc;
} worker;

static void *reserve_many(void *arg)
{
    worker *w = arg;
    tv__reg *reg = NULL;
    tv_error err = {0};
    w->rc = tv__reg_open(w->path, &reg, &err);
    for (int i = 0; i < PER_THREAD && w->rc == 0; i++)
        w->rc = tv__alloc_reserve(reg, w->dev, 1 + (uint64_t)i * 20000, &w->got[i], &err);
    if (w->rc)
        fprintf(stderr, "worker: %s\n", err.msg);
    tv__reg_close(reg);
    return NULL;
}

static void test_concurrent_reservations_never_overlap(void **state)
{
    fixture *f = *state;
    worker w[2] = {{.path = f->path, .dev = f->dev}, {.path = f->path, .dev = f->dev}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&th[i], NULL, reserve_many, &w[i]), 0);
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_join(th[i], NULL), 0);
    assert_int_equal(w[0].rc, 0);
    assert_int_equal(w[1].rc, 0);
    tv__reg_object *all = NULL;
    size_t n = 0;
    assert_int_equal(tv__reg_objects_on_device(f->reg, f->dev, &all, &n, NULL), 0);
    assert_int_equal(n, 2 * PER_THREAD);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(all[i].base_off % OA, 0);
        if (i)
            assert_true(all[i - 1].base_off + all[i - 1].alloc_len <= all[i].base_off);
    }
    free(all);
}

/* tv__reg_object_users: every model, generation and
 * shard that binds an object, in order; none for an unbound one; an
 * unknown id is TV_E_NOT_FOUND. */
static void test_object_users(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    int64_t obj1, obj2, obj3;
    assert_int_equal(make_ready(f, "zeta", 1, &obj1), 1);
    assert_int_equal(make_ready(f, "alpha", 1, &obj2), 1); /* the same object (dedup) */
    assert_int_equal(make_ready(f, "alpha", 2, &obj3), 2);
    assert_int_equal(obj1, obj2);
    assert_int_equal(tv__reg_generation_activate(f->reg, "alpha", 2, &err), 0);
    tv__reg_object_user *u = NULL;
    size_t n = 99;
    assert_int_equal(tv__reg_object_users(f->reg, obj1, &u, &n, &err), 0);
    assert_int_equal(n, 2);
    assert_string_equal(u[0].model, "alpha");
    assert_int_equal(u[0].generation, 1);
    assert_false(u[0].active);
    assert_int_equal(u[0].state, TV__GEN_READY);
    assert_string_equal(u[0].shard, "model.safetensors");
    assert_int_equal(u[0].shard_idx, 0);
    assert_string_equal(u[1].model, "zeta");
    assert_int_equal(u[1].generation, 1);
    assert_false(u[1].active); /* make_ready does not activate */
    free(u);
    assert_int_equal(tv__reg_object_users(f->reg, obj3, &u, &n, &err), 0);
    assert_int_equal(n, 1);
    assert_string_equal(u[0].model, "alpha");
    assert_int_equal(u[0].generation, 2);
    assert_true(u[0].active);
    free(u);
    /* A committed object nothing binds. */
    tv__reg_object lone;
    char sha[65];
    sha_of(77, sha);
    assert_int_equal(tv__alloc_reserve(f->reg, f->dev, 1000, &lone, &err), 0);
    assert_int_equal(tv__reg_object_commit(f->reg, lone.id, sha, &err), 0);
    assert_int_equal(tv__reg_object_users(f->reg, lone.id, &u, &n, &err), 0);
    assert_int_equal(n, 0);
    assert_null(u);
    assert_int_equal(tv__reg_object_users(f->reg, 987654, &u, &n, &err), TV_E_NOT_FOUND);
    assert_int_equal(tv__reg_object_users(f->reg, obj1, NULL, &n, &err), TV_E_INVALID_ARG);
}

/* A device's objects by base_off with their users (the extents map), and
 * the corruption checks on stored extents. */
/* An object row on f's device inserted behind the schema's checks (the
 * caller dropped objects_extent_insert): a corrupt extent for the tests. */
static void insert_raw_object(fixture *f, int id, uint64_t base_off, uint64_t alloc_len)
{
    char sql[256];
    snprintf(sql, sizeof sql,
             "INSERT INTO objects (id, device_id, base_off, alloc_len, canonical_len) "
             "VALUES (%d, %lld, %llu, %llu, 1000)",
             id, (long long)f->dev, (unsigned long long)base_off, (unsigned long long)alloc_len);
    assert_int_equal(sqlite3_exec(f->reg->db, sql, NULL, NULL, NULL), SQLITE_OK);
}

static void test_device_objects(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    int64_t obj1, obj2, obj3;
    assert_int_equal(make_ready(f, "zeta", 1, &obj1), 1);
    assert_int_equal(make_ready(f, "alpha", 1, &obj2), 1); /* dedup: obj1 */
    assert_int_equal(make_ready(f, "alpha", 2, &obj3), 2);
    assert_int_equal(obj1, obj2);
    tv__reg_object gone, lone, wr;
    char sha[65];
    sha_of(77, sha);
    assert_int_equal(tv__alloc_reserve(f->reg, f->dev, 1000, &gone, &err), 0);
    assert_int_equal(tv__alloc_reserve(f->reg, f->dev, 3 * OA, &lone, &err), 0);
    assert_int_equal(tv__reg_object_commit(f->reg, lone.id, sha, &err), 0);
    assert_int_equal(tv__alloc_reserve(f->reg, f->dev, 1000, &wr, &err), 0); /* stays writing */
    assert_int_equal(tv__reg_object_delete(f->reg, gone.id, &err), 0);       /* a hole */

    tv__reg_device_objects m;
    int rc = tv__reg_device_objects_get(f->reg, f->dev, &m, &err);
    if (rc)
        fprintf(stderr, "device objects: %s\n", err.msg);
    assert_int_equal(rc, 0);
    assert_int_equal(m.device.id, f->dev);
    assert_int_equal(m.device.data_off, OA);
    assert_int_equal(m.n_objects, 4);
    assert_int_equal(m.objects[0].id, obj1);
    assert_int_equal(m.objects[1].id, obj3);
    assert_int_equal(m.objects[2].id, lone.id);
    assert_int_equal(m.objects[3].id, wr.id);
    for (size_t i = 1; i < m.n_objects; i++)
        assert_true(m.objects[i].base_off >=
                    m.objects[i - 1].base_off + m.objects[i - 1].alloc_len);
    /* The hole the deleted object left. */
    assert_true(m.objects[2].base_off > m.objects[1].base_off + m.objects[1].alloc_len);
    assert_int_equal(m.objects[2].alloc_len, 3 * OA);
    assert_int_equal(m.objects[2].state, TV__OBJ_COMMITTED);
    assert_int_equal(m.objects[3].state, TV__OBJ_WRITING);
    assert_int_equal(m.n_users, 3);
    assert_int_equal(m.first_user[0], 0);
    assert_int_equal(m.first_user[1], 2);
    assert_int_equal(m.first_user[2], 3);
    assert_int_equal(m.first_user[3], 3);
    assert_int_equal(m.first_user[4], 3);
    assert_string_equal(m.users[0].model, "alpha"); /* by model name */
    assert_int_equal(m.users[0].generation, 1);
    assert_int_equal(m.users[0].object_id, obj1);
    assert_string_equal(m.users[1].model, "zeta");
    assert_string_equal(m.users[1].shard, "model.safetensors");
    assert_int_equal(m.users[1].state, TV__GEN_READY);
    assert_string_equal(m.users[2].model, "alpha");
    assert_int_equal(m.users[2].generation, 2);
    assert_int_equal(m.users[2].object_id, obj3);
    tv__reg_device_objects_free(&m);
    assert_null(m.objects);
    tv__reg_device_objects_free(NULL);

    /* A device without objects; an unknown one; NULL arguments. */
    tv__reg_device d2;
    int64_t dev2;
    fill_device(&d2, UUID2, 256 * MiB);
    d2.path[0] = 'x';
    assert_int_equal(tv__reg_device_add(f->reg, &d2, &dev2, &err), 0);
    assert_int_equal(tv__reg_device_objects_get(f->reg, dev2, &m, &err), 0);
    assert_int_equal(m.n_objects, 0);
    assert_int_equal(m.n_users, 0);
    assert_int_equal(m.first_user[0], 0);
    tv__reg_device_objects_free(&m);
    assert_int_equal(tv__reg_device_objects_get(f->reg, 987654, &m, &err), TV_E_NOT_FOUND);
    assert_non_null(strstr(err.msg, "987654"));
    assert_null(m.objects);
    assert_int_equal(tv__reg_device_objects_get(f->reg, f->dev, NULL, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv__reg_tx_depth(f->reg), 0);

    /* Stored extents the schema's trigger would refuse: an overlap and an
     * object past the region's end are reported, naming object and device. */
    assert_int_equal(
        sqlite3_exec(f->reg->db, "DROP TRIGGER objects_extent_insert", NULL, NULL, NULL),
        SQLITE_OK);
    insert_raw_object(f, 900, lone.base_off + OA, OA);
    assert_int_equal(tv__reg_device_objects_get(f->reg, f->dev, &m, &err), TV_E_REGISTRY);
    assert_non_null(strstr(err.msg, "object 900"));
    assert_non_null(strstr(err.msg, "overlaps"));
    assert_non_null(strstr(err.msg, "device 1"));
    assert_null(m.objects);
    assert_int_equal(
        sqlite3_exec(f->reg->db, "DELETE FROM objects WHERE id = 900", NULL, NULL, NULL),
        SQLITE_OK);
    insert_raw_object(f, 901, 256 * MiB - OA, 2 * OA);
    assert_int_equal(tv__reg_device_objects_get(f->reg, f->dev, &m, &err), TV_E_REGISTRY);
    assert_non_null(strstr(err.msg, "object 901"));
    assert_non_null(strstr(err.msg, "outside the data region"));
    assert_int_equal(tv__reg_tx_depth(f->reg), 0);
}

/* The allocator on stored extents the schema's trigger would refuse: the
 * free-space accounting (GET /v1/devices/{id}) and a reservation (an
 * import) answer TV_E_REGISTRY naming the objects and the device, like the
 * extents map, never the allocator's TV_E_INVALID_ARG; the reservation
 * inserts nothing and leaves no transaction open. */
static void test_alloc_on_corrupt_registry(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    tv__reg_object a, got;
    tv__alloc_space sp;
    assert_int_equal(tv__alloc_reserve(f->reg, f->dev, 2 * OA, &a, &err), 0);
    assert_int_equal(
        sqlite3_exec(f->reg->db, "DROP TRIGGER objects_extent_insert", NULL, NULL, NULL),
        SQLITE_OK);
    insert_raw_object(f, 910, a.base_off + OA, OA);
    char want[160];
    snprintf(want, sizeof want, "overlaps object %lld", (long long)a.id);

    memset(&err, 0, sizeof err);
    assert_int_equal(tv__alloc_device_space(f->reg, f->dev, &sp, &err), TV_E_REGISTRY);
    assert_non_null(strstr(err.msg, "registry corrupt: object 910"));
    assert_non_null(strstr(err.msg, want));
    assert_non_null(strstr(err.msg, "device 1"));
    memset(&err, 0, sizeof err);
    assert_int_equal(tv__alloc_reserve(f->reg, f->dev, 1000, &got, &err), TV_E_REGISTRY);
    assert_non_null(strstr(err.msg, "object 910"));
    assert_non_null(strstr(err.msg, want));
    assert_int_equal(tv__reg_tx_depth(f->reg), 0);
    assert_int_equal(query_int(f->reg->db, "SELECT count(*) FROM objects"), 2);

    /* Past the region's end. */
    assert_int_equal(
        sqlite3_exec(f->reg->db, "DELETE FROM objects WHERE id = 910", NULL, NULL, NULL),
        SQLITE_OK);
    insert_raw_object(f, 911, 256 * MiB - OA, 2 * OA);
    assert_int_equal(tv__alloc_device_space(f->reg, f->dev, &sp, &err), TV_E_REGISTRY);
    assert_non_null(strstr(err.msg, "object 911"));
    assert_non_null(strstr(err.msg, "outside the data region"));
    assert_int_equal(tv__alloc_reserve(f->reg, f->dev, 1000, &got, &err), TV_E_REGISTRY);
    assert_non_null(strstr(err.msg, "object 911"));
    assert_int_equal(tv__reg_tx_depth(f->reg), 0);

    /* Repaired, both work again. */
    assert_int_equal(
        sqlite3_exec(f->reg->db, "DELETE FROM objects WHERE id = 911", NULL, NULL, NULL),
        SQLITE_OK);
    assert_int_equal(tv__alloc_device_space(f->reg, f->dev, &sp, &err), 0);
    assert_int_equal(sp.n_used, 1);
    assert_int_equal(tv__alloc_reserve(f->reg, f->dev, 1000, &got, &err), 0);
    assert_int_equal(got.base_off, a.base_off + a.alloc_len);
}

/* ---- the query helpers every registry query is built on --------------------- */

static int read_id_uuid(sqlite3_stmt *st, void *record, tv_error *err)
{
    (void)err;
    tv__reg_device *d = record;
    d->id = sqlite3_column_int64(st, 0);
    tv__reg_col_text(st, 1, d->uuid, sizeof d->uuid);
    return 0;
}

static int fail_second(sqlite3_stmt *st, void *record, tv_error *err)
{
    (void)record;
    return sqlite3_column_int64(st, 0) == 2 ? tv__seterr(err, TV_E_STATE, "row reader failed") : 0;
}

static void test_query_helpers(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    tv__reg_device d, second;
    fill_device(&second, UUID2, 256 * MiB);
    second.path[0] = 'x';
    assert_int_equal(tv__reg_device_add(f->reg, &second, NULL, &err), 0);
    /* One row; no row is TV_E_NOT_FOUND with a message naming what. */
    assert_int_equal(tv__reg_query_one(f->reg, read_id_uuid, &d, "reading a device", &err,
                                       "SELECT id, uuid FROM devices WHERE uuid = ?1", "t", UUID2),
                     0);
    assert_string_equal(d.uuid, UUID2);
    assert_int_equal(tv__reg_query_one(f->reg, NULL, NULL, "probing", &err,
                                       "SELECT 1 FROM devices WHERE id = ?1", "i", (int64_t)99),
                     TV_E_NOT_FOUND);
    assert_non_null(strstr(err.msg, "probing"));
    /* Every row, in order, into a vector. */
    tv__reg_vec v = {.size = sizeof(tv__reg_device)};
    assert_int_equal(tv__reg_query_list(f->reg, &v, read_id_uuid, "listing", &err,
                                        "SELECT id, uuid FROM devices WHERE id >= ?1 ORDER BY id",
                                        "u", (uint64_t)0, "min id"),
                     0);
    assert_int_equal(v.n, 2);
    assert_string_equal(((tv__reg_device *)v.items)[1].uuid, UUID2);
    free(v.items);
    /* A reader's error stops the query; the vector is freed and empty. */
    v = (tv__reg_vec){.size = sizeof(tv__reg_device)};
    assert_int_equal(tv__reg_query_list(f->reg, &v, fail_second, "listing", &err,
                                        "SELECT id FROM devices ORDER BY id", ""),
                     TV_E_STATE);
    assert_null(v.items);
    assert_int_equal(v.n, 0);
    assert_string_equal(err.msg, "row reader failed");
    /* Binding refuses a u64 over INT64_MAX, naming it, and a bad type. */
    assert_int_equal(tv__reg_exec(f->reg, "updating", &err,
                                  "UPDATE devices SET data_off = ?2 WHERE id = ?1", "iu", f->dev,
                                  (uint64_t)INT64_MAX + 1, "data_off"),
                     TV_E_OVERFLOW);
    assert_non_null(strstr(err.msg, "data_off"));
    assert_int_equal(
        tv__reg_exec(f->reg, "updating", &err, "DELETE FROM devices WHERE id = ?1", "x", f->dev),
        TV_E_INTERNAL);
    /* A UNIQUE violation is -EEXIST; nothing changed. */
    assert_int_equal(tv__reg_exec(f->reg, "renaming", &err,
                                  "UPDATE devices SET uuid = ?2 WHERE id = ?1", "it", f->dev,
                                  UUID2),
                     -EEXIST);
    assert_int_equal(tv__reg_device_get(f->reg, f->dev, &d, &err), 0);
    assert_string_equal(d.uuid, UUID1);
    /* Each: every row through the callback, the first error stops it. */
    assert_int_equal(tv__reg_query_each(f->reg, fail_second, NULL, "each", &err,
                                        "SELECT id FROM devices WHERE id = ?1", "i", f->dev),
                     0);
    assert_int_equal(tv__reg_query_each(f->reg, fail_second, NULL, "each", &err,
                                        "SELECT id FROM devices ORDER BY id", ""),
                     TV_E_STATE);
    /* SQL errors are TV_E_REGISTRY. */
    assert_int_equal(tv__reg_query_each(f->reg, fail_second, NULL, "each", &err,
                                        "SELECT nosuchcolumn FROM devices", ""),
                     TV_E_REGISTRY);
    assert_int_equal(tv__reg_tx_depth(f->reg), 0);
}

/* shard_files and tv__reg_shards_lookup (0006_shard_files): a file matches
 * a shard of a ready generation by size and header hash plus its whole-file
 * hash or the stamps recorded when it was imported, never by size and
 * header alone; the active generation comes first. */
static void test_shard_files_lookup(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    char sha7[65], sha8[65], hdr[65], other[65];
    sha_of(7, sha7);
    sha_of(8, sha8);
    sha_of(1000007, hdr); /* make_ready's header hash for k = 7 */
    sha_of(99, other);
    assert_int_equal(make_ready(f, "m", 7, NULL), 1);
    tv__reg_shard_hit *hits = NULL;
    size_t n = 0;
    tv__reg_shard_query q = {.file_len = 1000, .header_sha256_hex = hdr, .sha256_hex = sha7};
    assert_int_equal(tv__reg_shards_lookup(f->reg, &q, &hits, &n, &err), 0);
    assert_int_equal(n, 1);
    assert_string_equal(hits[0].model, "m");
    assert_true(hits[0].generation == 1 && !hits[0].active && hits[0].idx == 0);
    assert_string_equal(hits[0].name, "model.safetensors");
    assert_string_equal(hits[0].sha256, sha7);
    free(hits);
    /* the same size and header, other bytes: nothing */
    q.sha256_hex = other;
    assert_int_equal(tv__reg_shards_lookup(f->reg, &q, &hits, &n, &err), 0);
    assert_true(n == 0 && hits == NULL);
    q.sha256_hex = sha7;
    q.file_len = 999;
    assert_int_equal(tv__reg_shards_lookup(f->reg, &q, &hits, &n, &err), 0);
    assert_int_equal(n, 0);
    q.file_len = 1000;
    /* size and header alone name no file; malformed hashes */
    q.sha256_hex = NULL;
    assert_int_equal(tv__reg_shards_lookup(f->reg, &q, &hits, &n, &err), TV_E_INVALID_ARG);
    q.sha256_hex = "ABC";
    assert_int_equal(tv__reg_shards_lookup(f->reg, &q, &hits, &n, &err), TV_E_INVALID_ARG);

    /* "m2": the same architecture (size, header) with other weights, its
     * file's stamps recorded while importing */
    tv__reg_generation g;
    tv__reg_object o;
    int64_t shard;
    tv__reg_file_stamp st = {.dev = UINT64_MAX - 1,
                             .ino = 42,
                             .size = 1000,
                             .mtime_ns = 1700000000123456789,
                             .ctime_ns = 1700000000223456789};
    assert_int_equal(tv__reg_begin(f->reg, &err), 0);
    assert_int_equal(tv__reg_generation_create(f->reg, "m2", "/imports/m2", 892, &g, &err), 0);
    assert_int_equal(tv__alloc_reserve(f->reg, f->dev, 1000, &o, &err), 0);
    assert_int_equal(tv__reg_object_commit(f->reg, o.id, sha8, &err), 0);
    tv__reg_shard_in in = {.idx = 0,
                           .name = "model.safetensors",
                           .file_len = 1000,
                           .header_len = 100,
                           .sha256_hex = sha8,
                           .header_sha256_hex = hdr};
    assert_int_equal(tv__reg_shard_add(f->reg, g.id, &in, &shard, &err), 0);
    assert_int_equal(tv__reg_shard_bind(f->reg, shard, o.id, &err), 0);
    tv__reg_file_stamp bad = st;
    bad.size = 1001;
    assert_int_equal(tv__reg_shard_file_add(f->reg, shard, &bad, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv__reg_shard_file_add(f->reg, shard, &st, &err), 0);
    assert_int_equal(tv__reg_shard_file_add(f->reg, shard, &st, &err), -EEXIST);
    assert_int_equal(tv__reg_generation_set_state(f->reg, g.id, TV__GEN_READY, &err), 0);
    assert_int_equal(tv__reg_commit(f->reg, &err), 0);
    /* recorded only while importing */
    assert_int_equal(tv__reg_shard_file_add(f->reg, shard, &st, &err), TV_E_STATE);
    q.sha256_hex = NULL;
    q.has_stamp = true;
    q.stamp = st;
    assert_int_equal(tv__reg_shards_lookup(f->reg, &q, &hits, &n, &err), 0);
    assert_int_equal(n, 1);
    assert_string_equal(hits[0].model, "m2");
    assert_string_equal(hits[0].sha256, sha8);
    free(hits);
    for (int k = 0; k < 4; k++) { /* any stamp that differs: nothing */
        q.stamp = st;
        if (k == 0)
            q.stamp.dev--;
        else if (k == 1)
            q.stamp.ino++;
        else if (k == 2)
            q.stamp.mtime_ns++;
        else
            q.stamp.ctime_ns++;
        assert_int_equal(tv__reg_shards_lookup(f->reg, &q, &hits, &n, &err), 0);
        assert_int_equal(n, 0);
    }
    /* the stamps or the hash: m's file by its hash, m2's by its stamps */
    q.stamp = st;
    q.sha256_hex = sha7;
    assert_int_equal(tv__reg_shards_lookup(f->reg, &q, &hits, &n, &err), 0);
    assert_int_equal(n, 2);
    free(hits);

    /* the same file in two generations of "m3" and in "m": active first,
     * then the newest */
    q.has_stamp = false;
    assert_int_equal(make_ready(f, "m3", 7, NULL), 1);
    assert_int_equal(make_ready(f, "m3", 7, NULL), 2);
    assert_int_equal(tv__reg_generation_activate(f->reg, "m3", 1, &err), 0);
    assert_int_equal(tv__reg_shards_lookup(f->reg, &q, &hits, &n, &err), 0);
    assert_int_equal(n, 3);
    assert_true(!strcmp(hits[0].model, "m3") && hits[0].generation == 1 && hits[0].active);
    assert_true(!strcmp(hits[1].model, "m3") && hits[1].generation == 2 && !hits[1].active);
    assert_true(!strcmp(hits[2].model, "m") && hits[2].generation == 1);
    free(hits);
    /* a generation no longer ready is not a match */
    assert_int_equal(tv__reg_generation_retire(f->reg, "m3", 2, &err), 0);
    assert_int_equal(tv__reg_shards_lookup(f->reg, &q, &hits, &n, &err), 0);
    assert_int_equal(n, 2);
    free(hits);
}

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_migrations_fresh),
        T(test_reopen_is_noop),
        T(test_newer_version_refused),
        T(test_failed_migration_is_atomic),
        T(test_migration_0002_keeps_rows),
        T(test_migration_0004_keeps_tokens),
        T(test_pragmas_in_effect),
        cmocka_unit_test(test_open_bad_arguments),
        T(test_devices),
        T(test_object_reserve_commit_dedup),
        T(test_schema_refuses_bad_extents),
        T(test_reclaim_writing),
        T(test_reclaim_keeps_resume_records),
        T(test_generation_numbering),
        T(test_generation_state_rules),
        T(test_activate_rollback_retire),
        T(test_shards_bind_rules),
        T(test_explicit_transactions),
        T(test_leases_protect_objects_from_gc),
        T(test_bulk_120k_tensors),
        T(test_import_jobs),
        T(test_aliases),
        T(test_deactivate),
        T(test_model_get_delete),
        T(test_model_and_generation_pages),
        T(test_tensor_pages),
        T(test_tensor_pages_by_size),
        T(test_tokens),
        T(test_concurrent_reservations_never_overlap),
        T(test_object_users),
        T(test_device_objects),
        T(test_alloc_on_corrupt_registry),
        T(test_query_helpers),
        T(test_shard_files_lookup),
    };
#undef T
    const char *filter = getenv("TV_TEST_FILTER"); /* e.g. "*bulk*" */
    if (filter)
        cmocka_set_test_filter(filter);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
