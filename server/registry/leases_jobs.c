/* Reader leases on generations and the job records (import and verify).
 *
 * Invariants: a lease is taken only on a ready generation, resolving "the
 * active generation" in the same transaction as the insert; while a lease
 * row exists gc keeps the generation's objects (objects.c checks leases);
 * a job only moves queued -> running -> succeeded | failed | cancelled (or
 * straight from queued to a final state), finished_at is set exactly when
 * final, started_at on the first progress report. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "registry/notes.h"
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
/* Jobs                                                                     */
/* ------------------------------------------------------------------------ */

static const char *const g_job_states[] = {"queued", "running", "succeeded", "failed", "cancelled"};
static const char *const g_job_kinds[] = {"import", "verify"};

const char *tv__job_state_name(tv__job_state s)
{
    return (unsigned)s < TV_ARRAY_LEN(g_job_states) ? g_job_states[s] : NULL;
}

const char *tv__job_kind_name(tv__job_kind k)
{
    return (unsigned)k < TV_ARRAY_LEN(g_job_kinds) ? g_job_kinds[k] : NULL;
}

int tv__job_state_parse(const char *s, tv__job_state *out)
{
    int v = 0;
    int rc = tv__reg_parse_name(s, g_job_states, TV_ARRAY_LEN(g_job_states), &v);
    if (rc == 0)
        *out = (tv__job_state)v;
    return rc;
}

int tv__job_kind_parse(const char *s, tv__job_kind *out)
{
    int v = 0;
    int rc = tv__reg_parse_name(s, g_job_kinds, TV_ARRAY_LEN(g_job_kinds), &v);
    if (rc == 0)
        *out = (tv__job_kind)v;
    return rc;
}

static bool job_final(tv__job_state s)
{
    return s == TV__JOB_SUCCEEDED || s == TV__JOB_FAILED || s == TV__JOB_CANCELLED;
}

#define JOB_COLS                                                                                   \
    "id, kind, state, ifnull(model, ''), ifnull(source, ''), activate, ifnull(alias, ''), "        \
    "strict, ifnull(device_id, 0), ifnull(step, ''), bytes_done, bytes_total, rate, "              \
    "ifnull(error_code, ''), error_errno, ifnull(error, ''), ifnull(generation, 0), "              \
    "created_at, ifnull(started_at, 0), ifnull(finished_at, 0), updated_at, result "

static int read_job(sqlite3_stmt *st, void *record, tv_error *err)
{
    tv__reg_job *j = record;
    memset(j, 0, sizeof *j);
    j->id = sqlite3_column_int64(st, 0);
    if (tv__job_kind_parse((const char *)sqlite3_column_text(st, 1), &j->kind))
        j->kind = TV__JOB_IMPORT; /* impossible under the CHECK constraint */
    if (tv__job_state_parse((const char *)sqlite3_column_text(st, 2), &j->state))
        j->state = TV__JOB_FAILED;
    tv__reg_col_text(st, 3, j->model, sizeof j->model);
    tv__reg_col_text(st, 4, j->source, sizeof j->source);
    j->activate = sqlite3_column_int(st, 5) != 0;
    tv__reg_col_text(st, 6, j->alias, sizeof j->alias);
    j->strict = sqlite3_column_int(st, 7) != 0;
    j->device_id = sqlite3_column_int64(st, 8);
    tv__reg_col_text(st, 9, j->step, sizeof j->step);
    j->bytes_done = tv__reg_col_u64(st, 10);
    j->bytes_total = tv__reg_col_u64(st, 11);
    j->rate_bytes_per_s = sqlite3_column_double(st, 12);
    tv__reg_col_text(st, 13, j->error_code, sizeof j->error_code);
    j->error_errno = sqlite3_column_int(st, 14);
    tv__reg_col_text(st, 15, j->error, sizeof j->error);
    j->generation = sqlite3_column_int64(st, 16);
    j->created_at = sqlite3_column_int64(st, 17);
    j->started_at = sqlite3_column_int64(st, 18);
    j->finished_at = sqlite3_column_int64(st, 19);
    j->updated_at = sqlite3_column_int64(st, 20);
    const unsigned char *res = sqlite3_column_text(st, 21);
    if (res && !(j->result_json = strdup((const char *)res)))
        return tv__seterr(err, -ENOMEM, "reading job %lld: out of memory", (long long)j->id);
    return 0;
}

void tv__reg_jobs_free(tv__reg_job *jobs, size_t n)
{
    if (!jobs)
        return;
    for (size_t i = 0; i < n; i++)
        free(jobs[i].result_json);
    free(jobs);
}

/* Appends one job per row (tv__reg_query_each; v->items owns each row's
 * result_json, so a failure frees them with tv__reg_jobs_free). */
static int collect_job(sqlite3_stmt *st, void *arg, tv_error *err)
{
    tv__reg_job *j = tv__reg_vec_push(arg);
    if (!j)
        return tv__seterr(err, -ENOMEM, "listing jobs: out of memory");
    return read_job(st, j, err);
}

int tv__reg_job_create(tv__reg *reg, const tv__reg_job *spec, int64_t *id, tv_error *err)
{
    if (!reg || !spec)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_job_create: NULL argument");
    if (!tv__job_kind_name(spec->kind))
        return tv__seterr(err, TV_E_INVALID_ARG, "job kind %d out of range", (int)spec->kind);
    int rc;
    bool import = spec->kind == TV__JOB_IMPORT;
    if (import && ((rc = tv__reg_check_name(spec->model, "model name", err)) ||
                   (rc = tv__reg_check_path(spec->source, "import source", err))))
        return rc;
    if (spec->alias[0] && (rc = tv__alias_name_valid(spec->alias, err)))
        return rc;
    if (spec->device_id < 0)
        return tv__seterr(err, TV_E_INVALID_ARG, "job device id %lld is negative",
                          (long long)spec->device_id);
    if ((rc = tv__reg_level_begin(reg, true, err)))
        return rc;
    rc = tv__reg_exec(reg, "creating a job", err,
                      "INSERT INTO jobs (kind, model, source, activate, alias, strict, device_id, "
                      "bytes_total, actor) VALUES (?1, nullif(?2, ''), nullif(?3, ''), ?4, "
                      "nullif(?5, ''), ?6, nullif(?7, 0), ?8, ?9)",
                      "tttitiiut", tv__job_kind_name(spec->kind), spec->model, spec->source,
                      (int64_t)spec->activate, spec->alias, (int64_t)spec->strict, spec->device_id,
                      spec->bytes_total, "bytes_total", tv__reg_actor());
    int64_t job = rc == 0 ? sqlite3_last_insert_rowid(reg->db) : 0;
    if (rc == 0)
        rc = tv__reg_event(reg, import ? "import.queued" : "verify.queued",
                           import ? spec->model : NULL, 0, NULL,
                           import ? json_pack("{s:I,s:s,s:b,s:s?}", "job", (json_int_t)job,
                                              "source", spec->source, "activate", spec->activate,
                                              "alias", spec->alias[0] ? spec->alias : NULL)
                                  : json_pack("{s:I,s:I}", "job", (json_int_t)job, "device_id",
                                              (json_int_t)spec->device_id),
                           err);
    rc = tv__reg_level_end(reg, rc, err);
    if (rc == 0 && id)
        *id = job;
    return rc;
}

int tv__reg_job_get(tv__reg *reg, int64_t id, tv__reg_job *out, tv_error *err)
{
    if (!reg || !out)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_job_get: NULL argument");
    int rc = tv__reg_query_one(reg, read_job, out, "reading a job", err,
                               "SELECT " JOB_COLS "FROM jobs WHERE id = ?1", "i", id);
    if (rc == TV_E_NOT_FOUND)
        rc = tv__seterr(err, TV_E_NOT_FOUND, "no job with id %lld", (long long)id);
    return rc;
}

/* Fails with TV_E_STATE when the job already finished. */
static int require_unfinished(tv__reg *reg, int64_t id, tv_error *err)
{
    tv__reg_job j;
    int rc = tv__reg_job_get(reg, id, &j, err);
    if (rc)
        return rc;
    free(j.result_json);
    if (job_final(j.state))
        return tv__seterr(err, TV_E_STATE, "job %lld already %s", (long long)id,
                          tv__job_state_name(j.state));
    return 0;
}

int tv__reg_job_progress(tv__reg *reg, int64_t id, const char *step, uint64_t done, uint64_t total,
                         double rate, int64_t generation, tv_error *err)
{
    if (!reg)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_job_progress: NULL registry");
    if (done > total || generation < 0 || !(rate >= 0))
        return tv__seterr(err, TV_E_INVALID_ARG,
                          "job %lld: %llu of %llu bytes done, rate %g, generation %lld",
                          (long long)id, (unsigned long long)done, (unsigned long long)total, rate,
                          (long long)generation);
    if (step && strlen(step) >= TV__JOB_STEP_MAX)
        return tv__seterr(err, TV_E_INVALID_ARG, "job %lld: step name '%.32s' is too long",
                          (long long)id, step);
    int rc = tv__reg_level_begin(reg, true, err);
    if (rc)
        return rc;
    if ((rc = require_unfinished(reg, id, err)))
        goto done;
    sqlite3_stmt *st = NULL;
    rc = tv__reg_stmt(reg, &st, err,
                      "UPDATE jobs SET state = 'running', step = coalesce(?2, step), "
                      "bytes_done = ?3, bytes_total = ?4, rate = ?5, "
                      "generation = CASE WHEN ?6 = 0 THEN generation ELSE ?6 END, "
                      "started_at = coalesce(started_at, CAST(strftime('%s', 'now') AS INTEGER)), "
                      "updated_at = CAST(strftime('%s', 'now') AS INTEGER) WHERE id = ?1",
                      "ituu", id, step, done, "bytes_done", total, "bytes_total");
    if (rc == 0 && sqlite3_bind_double(st, 5, rate) != SQLITE_OK)
        rc = tv__sqlerr(reg->db, err, SQLITE_ERROR, "binding a rate");
    if (rc == 0)
        rc = tv__reg_bind_i64(reg, st, 6, generation, err);
    if (rc == 0)
        rc = tv__reg_step_done(reg, st, "recording job progress", err);
    sqlite3_finalize(st);
done:
    return tv__reg_level_end(reg, rc, err);
}

/* Checks result_json is a JSON object (the schema's CHECK is the backstop). */
static int check_result(const char *json, int64_t id, tv_error *err)
{
    json_error_t jerr;
    json_t *v = json_loads(json, JSON_REJECT_DUPLICATES, &jerr);
    bool ok = v && json_is_object(v);
    json_decref(v);
    return ok ? 0
              : tv__seterr(err, TV_E_INVALID_ARG, "job %lld: the result is not a JSON object",
                           (long long)id);
}

/* The event of a job that failed or was cancelled (a succeeded import's is
 * its generation's "publish"). */
static int job_finish_event(tv__reg *reg, int64_t id, tv__job_state final, const char *error,
                            tv_error *err)
{
    tv__reg_job j;
    int rc = tv__reg_job_get(reg, id, &j, err);
    if (rc)
        return rc;
    free(j.result_json);
    bool import = j.kind == TV__JOB_IMPORT;
    const char *action = final == TV__JOB_CANCELLED ? "job.cancelled"
                         : import                   ? "import.failed"
                                                    : "verify.failed";
    return tv__reg_event(reg, action, import ? j.model : NULL, j.generation,
                         json_pack("{s:I}", "job", (json_int_t)id),
                         json_pack("{s:I,s:s,s:s?}", "job", (json_int_t)id, "state",
                                   tv__job_state_name(final), "error", error),
                         err);
}

int tv__reg_job_finish(tv__reg *reg, int64_t id, tv__job_state final, int code, const char *message,
                       int64_t generation, const char *result_json, tv_error *err)
{
    if (!reg)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_job_finish: NULL registry");
    if (!job_final(final) || (final == TV__JOB_SUCCEEDED && code != 0) ||
        (final == TV__JOB_FAILED && code == 0))
        return tv__seterr(err, TV_E_INVALID_ARG, "job %lld: cannot finish as %s with code %d",
                          (long long)id,
                          tv__job_state_name(final) ? tv__job_state_name(final) : "?", code);
    if (generation < 0)
        return tv__seterr(err, TV_E_INVALID_ARG, "generation %lld is negative",
                          (long long)generation);
    int rc;
    if (result_json && (rc = check_result(result_json, id, err)))
        return rc;
    char text[TV__REG_ERROR_MAX];
    if (code)
        snprintf(text, sizeof text, "%s", message && *message ? message : tv_strerror(code));
    if ((rc = tv__reg_level_begin(reg, true, err)))
        return rc;
    if ((rc = require_unfinished(reg, id, err)))
        goto done;
    rc = tv__reg_exec(reg, "finishing a job", err,
                      "UPDATE jobs SET state = ?2, error_code = ?3, error_errno = ?4, error = ?5, "
                      "generation = CASE WHEN ?6 = 0 THEN generation ELSE ?6 END, result = ?7, "
                      "finished_at = CAST(strftime('%s', 'now') AS INTEGER), "
                      "updated_at = CAST(strftime('%s', 'now') AS INTEGER) WHERE id = ?1",
                      "ittitit", id, tv__job_state_name(final), code ? tv_err_name(code) : NULL,
                      (int64_t)code, code ? text : NULL, generation, result_json);
    if (rc == 0 && final != TV__JOB_SUCCEEDED)
        rc = job_finish_event(reg, id, final, code ? text : NULL, err);
done:
    return tv__reg_level_end(reg, rc, err);
}

/* ---- resume records (migrations/0005_job_resume.sql) ---------------------- */

int tv__reg_job_set_resume(tv__reg *reg, int64_t id, const char *json, tv_error *err)
{
    if (!reg)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_job_set_resume: NULL registry");
    int rc;
    if (json && (rc = check_result(json, id, err)))
        return rc;
    return tv__reg_exec(reg, "recording an import's resume record", err,
                        "UPDATE jobs SET resume = ?2 WHERE id = ?1", "it", id, json);
}

typedef struct resume_row {
    int64_t id;
    char *json;
} resume_row;

static int read_resume_row(sqlite3_stmt *st, void *record, tv_error *err)
{
    resume_row *r = record;
    r->id = sqlite3_column_int64(st, 0);
    const unsigned char *t = sqlite3_column_text(st, 1);
    if (t && !(r->json = strdup((const char *)t)))
        return tv__seterr(err, -ENOMEM, "reading a resume record: out of memory");
    return 0;
}

int tv__reg_job_take_resume(tv__reg *reg, int64_t id, const char *model, const char *source,
                            char **json, int64_t *from, tv_error *err)
{
    if (!reg || !model || !source || !json)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_job_take_resume: NULL argument");
    *json = NULL;
    if (from)
        *from = 0;
    resume_row r = {0};
    int rc = tv__reg_level_begin(reg, true, err);
    if (rc)
        return rc;
    rc = tv__reg_query_one(reg, read_resume_row, &r, "looking for a resume record", err,
                           "SELECT id, resume FROM jobs WHERE resume IS NOT NULL AND id <> ?1 "
                           "AND kind = 'import' AND state IN ('failed', 'cancelled') "
                           "AND model = ?2 AND source = ?3 ORDER BY id DESC LIMIT 1",
                           "itt", id, model, source);
    if (rc == TV_E_NOT_FOUND) {
        rc = 0;
        goto done;
    }
    if (rc || !r.json)
        goto done;
    if ((rc = tv__reg_exec(reg, "taking a resume record over", err,
                           "UPDATE jobs SET resume = ?2 WHERE id = ?1", "it", id, r.json)) ||
        (rc = tv__reg_exec(reg, "taking a resume record over", err,
                           "UPDATE jobs SET resume = NULL WHERE id = ?1", "i", r.id)))
        goto done;
done:
    rc = tv__reg_level_end(reg, rc, err);
    if (rc == 0 && r.json) {
        *json = r.json;
        r.json = NULL;
        if (from)
            *from = r.id;
    }
    free(r.json);
    return rc;
}

int tv__reg_jobs_page(tv__reg *reg, int state, int kind, int64_t before_id, size_t limit,
                      tv__reg_job **out, size_t *n, bool *more, tv_error *err)
{
    if (!reg || !out || !n || !more)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_jobs_page: NULL argument");
    *out = NULL;
    *n = 0;
    *more = false;
    if (limit == 0 || limit > 100000)
        return tv__seterr(err, TV_E_INVALID_ARG, "job page limit %zu out of range", limit);
    if ((state != -1 && !tv__job_state_name((tv__job_state)state)) ||
        (kind != -1 && !tv__job_kind_name((tv__job_kind)kind)) || before_id < 0)
        return tv__seterr(err, TV_E_INVALID_ARG, "job filter state %d, kind %d, before %lld", state,
                          kind, (long long)before_id);
    tv__reg_vec v = {.size = sizeof(tv__reg_job)};
    int rc = tv__reg_query_each(
        reg, collect_job, &v, "listing jobs", err,
        "SELECT " JOB_COLS "FROM jobs WHERE (?1 IS NULL OR state = ?1) "
        "AND (?2 IS NULL OR kind = ?2) AND (?3 = 0 OR id < ?3) ORDER BY id DESC LIMIT ?4",
        "ttii", state == -1 ? NULL : tv__job_state_name((tv__job_state)state),
        kind == -1 ? NULL : tv__job_kind_name((tv__job_kind)kind), before_id, (int64_t)limit + 1);
    if (rc) {
        tv__reg_jobs_free(v.items, v.n); /* the rows read so far own result_json */
        return rc;
    }
    if (v.n > limit) {
        free(((tv__reg_job *)v.items)[limit].result_json);
        v.n = limit;
        *more = true;
    }
    *out = v.items;
    *n = v.n;
    return 0;
}
