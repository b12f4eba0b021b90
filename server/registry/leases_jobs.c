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

static int read_lease(sqlite3_stmt *st, void *record, tv_error *err)
{
    (void)err;
    tv__reg_lease *l = record;
    memset(l, 0, sizeof *l);
    l->id = sqlite3_column_int64(st, 0);
    l->generation_id = sqlite3_column_int64(st, 1);
    tv__reg_col_text(st, 2, l->model, sizeof l->model);
    l->number = sqlite3_column_int64(st, 3);
    tv__reg_col_text(st, 4, l->owner, sizeof l->owner);
    l->pid = sqlite3_column_int64(st, 5);
    l->created_at = sqlite3_column_int64(st, 6);
    return 0;
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
    if ((rc = tv__reg_exec(reg, "taking a lease", err,
                           "INSERT INTO leases (generation_id, owner, pid) VALUES (?1, ?2, ?3)",
                           "iti", g.id, owner, pid)))
        goto done;
    int64_t id = sqlite3_last_insert_rowid(reg->db);
    if (out && (rc = tv__reg_query_one(reg, read_lease, out, "reading a lease", err,
                                       LEASE_SELECT "WHERE l.id = ?1", "i", id)) == TV_E_NOT_FOUND)
        rc = tv__seterr(err, TV_E_REGISTRY, "lease %lld vanished after its insert", (long long)id);
done:
    return tv__reg_level_end(reg, rc, err);
}

int tv__reg_lease_release(tv__reg *reg, int64_t lease_id, tv_error *err)
{
    if (!reg)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_lease_release: NULL registry");
    int rc = tv__reg_exec(reg, "releasing a lease", err, "DELETE FROM leases WHERE id = ?1", "i",
                          lease_id);
    if (rc == 0 && sqlite3_changes64(reg->db) == 0)
        rc = tv__seterr(err, TV_E_NOT_FOUND, "no lease with id %lld", (long long)lease_id);
    return rc;
}

int tv__reg_lease_release_owner(tv__reg *reg, const char *owner, size_t *n, tv_error *err)
{
    if (!reg || !owner)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_lease_release_owner: NULL argument");
    int rc = tv__reg_exec(reg, "releasing leases", err, "DELETE FROM leases WHERE owner = ?1", "t",
                          owner);
    if (rc == 0 && n)
        *n = (size_t)sqlite3_changes64(reg->db);
    return rc;
}

int tv__reg_leases_list(tv__reg *reg, tv__reg_lease **out, size_t *n, tv_error *err)
{
    if (!reg || !out || !n)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_leases_list: NULL argument");
    tv__reg_vec v = {.size = sizeof(tv__reg_lease)};
    int rc = tv__reg_query_list(reg, &v, read_lease, "listing leases", err,
                                LEASE_SELECT "ORDER BY l.id", "");
    *out = v.items;
    *n = v.n;
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

static int read_job(sqlite3_stmt *st, void *record, tv_error *err)
{
    (void)err;
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
    return 0;
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
    if ((rc = tv__reg_exec(reg, "creating an import job", err,
                           "INSERT INTO import_jobs (model, source, bytes_total) "
                           "VALUES (?1, ?2, ?3)",
                           "ttu", model, source, bytes_total, "bytes_total")) == 0 &&
        id)
        *id = sqlite3_last_insert_rowid(reg->db);
    return rc;
}

int tv__reg_job_get(tv__reg *reg, int64_t id, tv__reg_job *out, tv_error *err)
{
    if (!reg || !out)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_job_get: NULL argument");
    int rc = tv__reg_query_one(reg, read_job, out, "reading an import job", err,
                               "SELECT " JOB_COLS " FROM import_jobs WHERE id = ?1", "i", id);
    if (rc == TV_E_NOT_FOUND)
        rc = tv__seterr(err, TV_E_NOT_FOUND, "no import job with id %lld", (long long)id);
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
    int rc = tv__reg_level_begin(reg, true, err);
    if (rc)
        return rc;
    if ((rc = require_unfinished(reg, id, &j, err)))
        goto done;
    rc = tv__reg_exec(reg, "recording import progress", err,
                      "UPDATE import_jobs SET state = 'running', bytes_done = ?2, "
                      "bytes_total = ?3, "
                      "generation = CASE WHEN ?4 = 0 THEN generation ELSE ?4 END "
                      "WHERE id = ?1",
                      "iuui", id, bytes_done, "bytes_done", bytes_total, "bytes_total", generation);
done:
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
    int rc = tv__reg_level_begin(reg, true, err);
    if (rc)
        return rc;
    if ((rc = require_unfinished(reg, id, &j, err)))
        goto done;
    rc = tv__reg_exec(reg, "finishing an import job", err,
                      "UPDATE import_jobs SET state = ?2, error = ?3, "
                      "finished_at = CAST(strftime('%s', 'now') AS INTEGER), "
                      "generation = CASE WHEN ?4 = 0 THEN generation ELSE ?4 END "
                      "WHERE id = ?1",
                      "itti", id, code ? "failed" : "succeeded", code ? text : NULL, generation);
done:
    return tv__reg_level_end(reg, rc, err);
}

int tv__reg_jobs_list(tv__reg *reg, size_t limit, tv__reg_job **out, size_t *n, tv_error *err)
{
    if (!reg || !out || !n)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_jobs_list: NULL argument");
    tv__reg_vec v = {.size = sizeof(tv__reg_job)};
    int64_t lim = limit == 0 || limit > INT64_MAX ? -1 : (int64_t)limit;
    int rc = tv__reg_query_list(reg, &v, read_job, "listing import jobs", err,
                                "SELECT " JOB_COLS " FROM import_jobs ORDER BY id DESC LIMIT ?1",
                                "i", lim);
    *out = v.items;
    *n = v.n;
    return rc;
}
