/* Reader leases on generations and the import job records.
 *
 * Invariants: a lease is taken only on a ready generation, resolving "the
 * active generation" in the same transaction as the insert; while a lease
 * row exists gc keeps the generation's objects (objects.c checks leases);
 * a job only moves queued -> running -> succeeded | failed (or straight
 * from queued to a final state), finished_at is set exactly when final. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "registry/reg_internal.h"

/* ------------------------------------------------------------------------ */
/* Leases                                                                   */
/* ------------------------------------------------------------------------ */

#define LEASE_SELECT                                                                               \
    "SELECT l.id, l.generation_id, m.name, g.number, l.owner, l.pid, l.created_at "                \
    "FROM leases l JOIN generations g ON g.id = l.generation_id "                                  \
    "JOIN models m ON m.id = g.model_id "

static void read_lease(sqlite3_stmt *st, void *record)
{
    tv__reg_lease *l = record;
    memset(l, 0, sizeof *l);
    l->id = sqlite3_column_int64(st, 0);
    l->generation_id = sqlite3_column_int64(st, 1);
    tv__reg_col_text(st, 2, l->model, sizeof l->model);
    l->number = sqlite3_column_int64(st, 3);
    tv__reg_col_text(st, 4, l->owner, sizeof l->owner);
    l->pid = sqlite3_column_int64(st, 5);
    l->created_at = sqlite3_column_int64(st, 6);
}

int tv__reg_lease_acquire(tv__reg *reg, const char *model, int64_t number, const char *owner,
                          int64_t pid, tv__reg_lease *out, tv_error *err)
{
    if (!reg || !model)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_lease_acquire: NULL argument");
    int rc;
    if ((rc = tv__reg_check_name(owner, "lease owner", err)))
        return rc;
    if (pid < 0)
        return tv__seterr(err, TV_E_INVALID_ARG, "lease pid %lld is negative", (long long)pid);
    tv__reg_generation g;
    sqlite3_stmt *st = NULL;
    if ((rc = tv__reg_level_begin(reg, true, err)))
        return rc;
    if ((rc = tv__reg_generation_get(reg, model, number, &g, err)))
        goto done;
    if (g.state != TV__GEN_READY) {
        rc = tv__seterr(err, TV_E_STATE,
                        "model '%s' generation %lld is %s: only ready generations can be opened",
                        model, (long long)g.number, tv__gen_state_name(g.state));
        goto done;
    }
    if ((rc = tv__reg_prepare(reg,
                              "INSERT INTO leases (generation_id, owner, pid) VALUES (?1, ?2, ?3)",
                              &st, err)) ||
        (rc = tv__reg_bind_i64(reg, st, 1, g.id, err)) ||
        (rc = tv__reg_bind_text(reg, st, 2, owner, err)) ||
        (rc = tv__reg_bind_i64(reg, st, 3, pid, err)) ||
        (rc = tv__reg_step_done(reg, st, "taking a lease", err)))
        goto done;
    int64_t id = sqlite3_last_insert_rowid(reg->db);
    sqlite3_finalize(st);
    st = NULL;
    if (out) {
        if ((rc = tv__reg_prepare(reg, LEASE_SELECT "WHERE l.id = ?1", &st, err)) ||
            (rc = tv__reg_bind_i64(reg, st, 1, id, err)))
            goto done;
        rc = sqlite3_step(st);
        if (rc != SQLITE_ROW) {
            rc = tv__sqlerr(reg->db, err, rc, "reading a lease");
            goto done;
        }
        read_lease(st, out);
        rc = 0;
    }
done:
    sqlite3_finalize(st);
    return tv__reg_level_end(reg, rc, err);
}

int tv__reg_lease_release(tv__reg *reg, int64_t lease_id, tv_error *err)
{
    if (!reg)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_lease_release: NULL registry");
    sqlite3_stmt *st = NULL;
    int rc = tv__reg_prepare(reg, "DELETE FROM leases WHERE id = ?1", &st, err);
    if (rc)
        return rc;
    if ((rc = tv__reg_bind_i64(reg, st, 1, lease_id, err)) == 0 &&
        (rc = tv__reg_step_done(reg, st, "releasing a lease", err)) == 0 &&
        sqlite3_changes64(reg->db) == 0)
        rc = tv__seterr(err, TV_E_NOT_FOUND, "no lease with id %lld", (long long)lease_id);
    sqlite3_finalize(st);
    return rc;
}

int tv__reg_lease_release_owner(tv__reg *reg, const char *owner, size_t *n, tv_error *err)
{
    if (!reg || !owner)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_lease_release_owner: NULL argument");
    sqlite3_stmt *st = NULL;
    int rc = tv__reg_prepare(reg, "DELETE FROM leases WHERE owner = ?1", &st, err);
    if (rc)
        return rc;
    if ((rc = tv__reg_bind_text(reg, st, 1, owner, err)) == 0 &&
        (rc = tv__reg_step_done(reg, st, "releasing leases", err)) == 0 && n)
        *n = (size_t)sqlite3_changes64(reg->db);
    sqlite3_finalize(st);
    return rc;
}

int tv__reg_leases_list(tv__reg *reg, tv__reg_lease **out, size_t *n, tv_error *err)
{
    if (!reg || !out || !n)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_leases_list: NULL argument");
    *out = NULL;
    *n = 0;
    sqlite3_stmt *st = NULL;
    tv__reg_vec v = {.size = sizeof(tv__reg_lease)};
    int rc = tv__reg_prepare(reg, LEASE_SELECT "ORDER BY l.id", &st, err);
    if (rc)
        return rc;
    if ((rc = tv__reg_collect(reg, st, &v, read_lease, "listing leases", err)))
        goto fail;
    sqlite3_finalize(st);
    *out = v.items;
    *n = v.n;
    return 0;
fail:
    sqlite3_finalize(st);
    free(v.items);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Import jobs                                                              */
/* ------------------------------------------------------------------------ */

static const char *const g_job_states[] = {"queued", "running", "succeeded", "failed"};

const char *tv__job_state_name(tv__job_state s)
{
    return (unsigned)s < TV_ARRAY_LEN(g_job_states) ? g_job_states[s] : NULL;
}

static tv__job_state job_state_from_text(const unsigned char *s)
{
    for (size_t i = 0; s && i < TV_ARRAY_LEN(g_job_states); i++)
        if (!strcmp((const char *)s, g_job_states[i]))
            return (tv__job_state)i;
    return TV__JOB_FAILED; /* impossible under the CHECK constraint */
}

#define JOB_COLS                                                                                   \
    "id, model, source, state, bytes_total, bytes_done, ifnull(error, ''), "                       \
    "ifnull(generation, 0), created_at, ifnull(finished_at, 0)"

static void read_job(sqlite3_stmt *st, void *record)
{
    tv__reg_job *j = record;
    memset(j, 0, sizeof *j);
    j->id = sqlite3_column_int64(st, 0);
    tv__reg_col_text(st, 1, j->model, sizeof j->model);
    tv__reg_col_text(st, 2, j->source, sizeof j->source);
    j->state = job_state_from_text(sqlite3_column_text(st, 3));
    j->bytes_total = tv__reg_col_u64(st, 4);
    j->bytes_done = tv__reg_col_u64(st, 5);
    tv__reg_col_text(st, 6, j->error, sizeof j->error);
    j->generation = sqlite3_column_int64(st, 7);
    j->created_at = sqlite3_column_int64(st, 8);
    j->finished_at = sqlite3_column_int64(st, 9);
}

int tv__reg_job_create(tv__reg *reg, const char *model, const char *source, uint64_t bytes_total,
                       int64_t *id, tv_error *err)
{
    if (!reg)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_job_create: NULL registry");
    int rc;
    if ((rc = tv__reg_check_name(model, "model name", err)) ||
        (rc = tv__reg_check_path(source, "import source", err)))
        return rc;
    sqlite3_stmt *st = NULL;
    if ((rc = tv__reg_prepare(reg,
                              "INSERT INTO import_jobs (model, source, bytes_total) "
                              "VALUES (?1, ?2, ?3)",
                              &st, err)))
        return rc;
    if ((rc = tv__reg_bind_text(reg, st, 1, model, err)) == 0 &&
        (rc = tv__reg_bind_text(reg, st, 2, source, err)) == 0 &&
        (rc = tv__reg_bind_u64(reg, st, 3, bytes_total, "bytes_total", err)) == 0 &&
        (rc = tv__reg_step_done(reg, st, "creating an import job", err)) == 0 && id)
        *id = sqlite3_last_insert_rowid(reg->db);
    sqlite3_finalize(st);
    return rc;
}

int tv__reg_job_get(tv__reg *reg, int64_t id, tv__reg_job *out, tv_error *err)
{
    if (!reg || !out)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_job_get: NULL argument");
    sqlite3_stmt *st = NULL;
    int rc = tv__reg_prepare(reg, "SELECT " JOB_COLS " FROM import_jobs WHERE id = ?1", &st, err);
    if (rc)
        return rc;
    if ((rc = tv__reg_bind_i64(reg, st, 1, id, err)))
        goto done;
    rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        read_job(st, out);
        rc = 0;
    } else if (rc == SQLITE_DONE) {
        rc = tv__seterr(err, TV_E_NOT_FOUND, "no import job with id %lld", (long long)id);
    } else {
        rc = tv__sqlerr(reg->db, err, rc, "reading an import job");
    }
done:
    sqlite3_finalize(st);
    return rc;
}

/* Loads the job and fails with TV_E_STATE when it already finished. */
static int require_unfinished(tv__reg *reg, int64_t id, tv__reg_job *j, tv_error *err)
{
    int rc = tv__reg_job_get(reg, id, j, err);
    if (rc)
        return rc;
    if (j->state == TV__JOB_SUCCEEDED || j->state == TV__JOB_FAILED)
        return tv__seterr(err, TV_E_STATE, "import job %lld already %s", (long long)id,
                          tv__job_state_name(j->state));
    return 0;
}

int tv__reg_job_progress(tv__reg *reg, int64_t id, uint64_t bytes_done, uint64_t bytes_total,
                         int64_t generation, tv_error *err)
{
    if (!reg)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_job_progress: NULL registry");
    if (bytes_done > bytes_total || generation < 0)
        return tv__seterr(err, TV_E_INVALID_ARG,
                          "import job %lld: %llu of %llu bytes done, generation %lld",
                          (long long)id, (unsigned long long)bytes_done,
                          (unsigned long long)bytes_total, (long long)generation);
    tv__reg_job j;
    sqlite3_stmt *st = NULL;
    int rc = tv__reg_level_begin(reg, true, err);
    if (rc)
        return rc;
    if ((rc = require_unfinished(reg, id, &j, err)))
        goto done;
    if ((rc = tv__reg_prepare(reg,
                              "UPDATE import_jobs SET state = 'running', bytes_done = ?2, "
                              "bytes_total = ?3, "
                              "generation = CASE WHEN ?4 = 0 THEN generation ELSE ?4 END "
                              "WHERE id = ?1",
                              &st, err)) ||
        (rc = tv__reg_bind_i64(reg, st, 1, id, err)) ||
        (rc = tv__reg_bind_u64(reg, st, 2, bytes_done, "bytes_done", err)) ||
        (rc = tv__reg_bind_u64(reg, st, 3, bytes_total, "bytes_total", err)) ||
        (rc = tv__reg_bind_i64(reg, st, 4, generation, err)) ||
        (rc = tv__reg_step_done(reg, st, "recording import progress", err)))
        goto done;
done:
    sqlite3_finalize(st);
    return tv__reg_level_end(reg, rc, err);
}

int tv__reg_job_finish(tv__reg *reg, int64_t id, int code, const char *message, int64_t generation,
                       tv_error *err)
{
    if (!reg)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_job_finish: NULL registry");
    if (generation < 0)
        return tv__seterr(err, TV_E_INVALID_ARG, "generation %lld is negative",
                          (long long)generation);
    char text[TV__REG_ERROR_MAX];
    if (code)
        snprintf(text, sizeof text, "%s", message && *message ? message : tv_strerror(code));
    tv__reg_job j;
    sqlite3_stmt *st = NULL;
    int rc = tv__reg_level_begin(reg, true, err);
    if (rc)
        return rc;
    if ((rc = require_unfinished(reg, id, &j, err)))
        goto done;
    if ((rc = tv__reg_prepare(reg,
                              "UPDATE import_jobs SET state = ?2, error = ?3, "
                              "finished_at = CAST(strftime('%s', 'now') AS INTEGER), "
                              "generation = CASE WHEN ?4 = 0 THEN generation ELSE ?4 END "
                              "WHERE id = ?1",
                              &st, err)) ||
        (rc = tv__reg_bind_i64(reg, st, 1, id, err)) ||
        (rc = tv__reg_bind_text(reg, st, 2, code ? "failed" : "succeeded", err)) ||
        (rc = tv__reg_bind_text(reg, st, 3, code ? text : NULL, err)) ||
        (rc = tv__reg_bind_i64(reg, st, 4, generation, err)) ||
        (rc = tv__reg_step_done(reg, st, "finishing an import job", err)))
        goto done;
done:
    sqlite3_finalize(st);
    return tv__reg_level_end(reg, rc, err);
}

int tv__reg_jobs_list(tv__reg *reg, size_t limit, tv__reg_job **out, size_t *n, tv_error *err)
{
    if (!reg || !out || !n)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_jobs_list: NULL argument");
    *out = NULL;
    *n = 0;
    sqlite3_stmt *st = NULL;
    tv__reg_vec v = {.size = sizeof(tv__reg_job)};
    int rc = tv__reg_prepare(reg, "SELECT " JOB_COLS " FROM import_jobs ORDER BY id DESC LIMIT ?1",
                             &st, err);
    if (rc)
        return rc;
    if ((rc = tv__reg_bind_i64(reg, st, 1, limit == 0 || limit > INT64_MAX ? -1 : (int64_t)limit,
                               err)))
        goto fail;
    if ((rc = tv__reg_collect(reg, st, &v, read_job, "listing import jobs", err)))
        goto fail;
    sqlite3_finalize(st);
    *out = v.items;
    *n = v.n;
    return 0;
fail:
    sqlite3_finalize(st);
    free(v.items);
    return rc;
}
