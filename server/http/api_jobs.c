/* The job routes: POST /v1/imports and /v1/verify (queued on the daemon's
 * pool, or run inline in local mode, which waits), the jobs list, one job,
 * cancel (the Job document is api_render.c's).
 * Invariants: with import roots, a local import source is opened when the
 * request is checked, before anything is queued, and what was opened must
 * lie under an import root by whole path components (so "/data2" is not
 * under "/data" and a symlink cannot lead out); the job reads through that
 * descriptor (import/source.h: tv__src_local), so no rename or symlink swap
 * while it waits changes what it imports, and the row records the real
 * path of what was opened; without roots (local mode) the job gets the
 * resolved path. What can be refused before queuing (name rules, missing
 * source, roots, unknown device) is refused with its own status, the rest
 * is the job's error; the cancel route never waits on a job's work. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "http/api_internal.h"
#include "import/import.h"
#include "import/source.h"
#include "httpc/url.h"
#include "util/internal.h"

/* The cancel route looks at the row this long (x 10 ms) for the end state,
 * then answers the row as it is: it never waits on the job's work. */
#define CANCEL_WAIT_POLLS 50

/* ---- helpers ---------------------------------------------------------------------- */

static int job_id(tv__api_ctx *c, int64_t *id)
{
    if (!tv__parse_pos_i64(c->param[0], id))
        return tv__seterr(&c->err, TV_E_BAD_REQUEST, "bad job id '%.60s': a number from 1",
                          c->param[0]);
    return 0;
}

/* What a peer may see of a job: an import of a model it may read, or a
 * verify job without its result (which names objects of every model);
 * the CLI's local mode and admin tokens see every job whole. Returns
 * whether j is visible (its result dropped when it must be). */
static bool job_visible(tv__api_ctx *c, tv__reg_job *j)
{
    if (tv__api_sees_all(c))
        return true;
    if (j->kind == TV__JOB_IMPORT)
        return tv__api_can_read(c, j->model);
    free(j->result_json);
    j->result_json = NULL;
    return true;
}

/* Answers status with the job row id (read from reg). */
static int job_reply(tv__api_ctx *c, tv__reg *reg, int64_t id, int status)
{
    tv__reg_job j = {0};
    int rc = tv__reg_job_get(reg, id, &j, &c->err);
    if (rc)
        return rc;
    if (!job_visible(c, &j)) {
        free(j.result_json);
        return tv__seterr(&c->err, TV_E_NOT_FOUND, "no job with id %" PRId64, id);
    }
    rc = tv__api_reply(c, status, tv__api_job_json(&j));
    free(j.result_json);
    if (!rc && status == 202)
        tv__api_header(c->resp, "Location", "/v1/jobs/%" PRId64, id);
    return rc;
}

/* An import source outside the roots: which roots there are, and how an
 * operator adds one. */
static void roots_hint(const tv__api *api, tv_error *err)
{
    char roots[256] = "", msg[sizeof err->msg];
    size_t off = 0;
    for (size_t i = 0; i < api->n_roots && off < sizeof roots; i++) {
        int w = snprintf(roots + off, sizeof roots - off, "%s%s", i ? ":" : "", api->roots[i]);
        off = w < 0 ? sizeof roots : off + (size_t)w;
    }
    snprintf(msg, sizeof msg, "%s", err->msg);
    tv__seterr(
        err, TV_E_OUTSIDE_ROOTS,
        "%s; add its directory to import.roots in the daemon's config (':'-separated; or start it with --set import.roots=DIR1:DIR2 or TENSORVAULT_IMPORT_ROOTS=DIR1:DIR2); the roots are %.200s",
        msg, roots[0] ? roots : "none");
}

int tv__api_source_check(tv__api *api, const char *source, char **real, tv__src_local **held,
                         tv_error *err)
{
    int rc;
    *real = NULL;
    if (held)
        *held = NULL;
    if (!source || !*source)
        return tv__seterr(err, TV_E_BAD_REQUEST, "field 'source' must be a non-empty path");
    if (tv__src_is_hub(source)) { /* the Hub's endpoint is the daemon's (import.hf_endpoint) */
        tv__hub_ref ref;
        if ((rc = tv__hub_parse(source, &ref, err)))
            return rc;
        if (!(*real = strdup(source)))
            return tv__seterr(err, -ENOMEM, "out of memory");
        return 0;
    }
    if (tv__src_is_url(source)) {
        tv__url u;
        if ((rc = api->roots ? tv__url_origins_check(source, api->origins, err)
                             : tv__url_parse(source, &u, err)))
            return rc;
        if (!(*real = strdup(source)))
            return tv__seterr(err, -ENOMEM, "out of memory");
        return 0;
    }
    if (!api->roots) { /* local mode: any path, opened by the job */
        if (!(*real = realpath(source, NULL)))
            return tv__src_path_error(source, errno, err);
        return 0;
    }
    tv__src_local *l = NULL;
    if ((rc = tv__src_local_open(source, (const char *const *)api->roots, api->n_roots, &l, err))) {
        if (rc == TV_E_OUTSIDE_ROOTS)
            roots_hint(api, err);
        return rc;
    }
    if (!(*real = strdup(tv__src_local_real(l)))) {
        tv__src_local_free(l);
        return tv__seterr(err, -ENOMEM, "out of memory");
    }
    if (held)
        *held = l;
    else
        tv__src_local_free(l);
    return 0;
}

/* Queues spec on the pool, or runs it inline on the writer (local mode:
 * waits for the end), then answers 202 with the job. spec->local is taken
 * over in every case. */
static int run_job(tv__api_ctx *c, const tv__job_spec *spec)
{
    int64_t id = 0;
    int rc;
    tv__reg *reg;
    if (c->api->jobs) {
        if ((rc = tv__jobs_submit(c->api->jobs, spec, &id, &c->err)) ||
            (rc = tv__api_reader(c, &reg)))
            return rc;
        return job_reply(c, reg, id, 202);
    }
    tv__store *st;
    if ((rc = tv__api_writer_lock(c, &st))) {
        tv__src_local_free(spec->local);
        return rc;
    }
    tv_error jerr = {0};
    int jrc = tv__jobs_run_inline(st, spec, c->api->watch, c->api->watch_ctx, &id, &jerr);
    /* The job's own failure is in its row; only a job that never got a row
     * is an error of this call. */
    if (!id)
        rc = jrc ? (c->err = jerr, jrc)
                 : tv__seterr(&c->err, TV_E_INTERNAL, "inline job returned no id");
    else
        rc = job_reply(c, st->reg, id, 202);
    tv__api_writer_unlock(c);
    return rc;
}

/* ---- routes ----------------------------------------------------------------------- */

int tv__api_h_imports(tv__api_ctx *c)
{
    static const char *const fields[] = {"model", "source", "activate", "alias", "strict", NULL};
    static const char *const none[] = {NULL};
    json_t *body = NULL;
    const char *model = NULL, *source = NULL, *alias = NULL;
    char *real = NULL;
    tv__src_local *held = NULL;
    bool activate = false, strict = false;
    int rc;
    if ((rc = tv__api_query_allow(c, none)) || (rc = tv__api_body(c, fields, false, &body)) ||
        (rc = tv__api_field_str(c, body, "model", true, &model)) ||
        (rc = tv__api_field_str(c, body, "source", true, &source)) ||
        (rc = tv__api_field_str(c, body, "alias", false, &alias)) ||
        (rc = tv__api_field_bool(c, body, "activate", &activate)) ||
        (rc = tv__api_field_bool(c, body, "strict", &strict)) ||
        (rc = tv__name_valid(model, "model name", &c->err)) ||
        (alias && (rc = tv__alias_name_valid(alias, &c->err))) ||
        (rc = tv__api_source_check(c->api, source, &real, &held, &c->err)))
        goto out;
    tv__job_spec spec = {.kind = TV__JOB_IMPORT,
                         .model = model,
                         .source = real,
                         .alias = alias,
                         .activate = activate,
                         .strict = strict,
                         .local = held};
    rc = run_job(c, &spec); /* takes held over */
out:
    free(real);
    json_decref(body);
    return rc;
}

int tv__api_h_verify(tv__api_ctx *c)
{
    static const char *const fields[] = {"device_id", NULL};
    static const char *const none[] = {NULL};
    json_t *body = NULL;
    int64_t device = 0;
    tv__reg *reg;
    tv__reg_device d;
    int rc;
    if ((rc = tv__api_query_allow(c, none)) || (rc = tv__api_body(c, fields, true, &body)) ||
        (rc = tv__api_field_int(c, body, "device_id", false, &device)))
        goto out;
    if (json_object_get(body, "device_id") && !json_is_null(json_object_get(body, "device_id")) &&
        ((rc = tv__api_reader(c, &reg)) || (rc = tv__reg_device_get(reg, device, &d, &c->err))))
        goto out;
    tv__job_spec spec = {.kind = TV__JOB_VERIFY, .device_id = device};
    rc = run_job(c, &spec);
out:
    json_decref(body);
    return rc;
}

int tv__api_h_jobs(tv__api_ctx *c)
{
    static const char *const q[] = {"limit", "cursor", "state", "kind", NULL};
    tv__reg *reg;
    tv__reg_job *js = NULL;
    size_t limit, n = 0, kl;
    char *after = NULL;
    int64_t before = 0;
    bool more = false;
    int state = -1, kind = -1;
    json_t *arr = NULL;
    int rc;
    if ((rc = tv__api_query_allow(c, q)) || (rc = tv__api_query_limit(c, &limit)) ||
        (rc = tv__api_cursor_get(c, 'j', &after, &kl)))
        goto out;
    const char *s = tv__api_query(c, "state"), *k = tv__api_query(c, "kind");
    tv__job_state st;
    tv__job_kind kd;
    if (s && tv__job_state_parse(s, &st)) {
        rc = tv__seterr(&c->err, TV_E_BAD_REQUEST,
                        "bad state '%.40s': queued, running, succeeded, failed or cancelled", s);
        goto out;
    }
    if (k && tv__job_kind_parse(k, &kd)) {
        rc = tv__seterr(&c->err, TV_E_BAD_REQUEST, "bad kind '%.40s': import or verify", k);
        goto out;
    }
    state = s ? (int)st : -1;
    kind = k ? (int)kd : -1;
    if (after && !tv__parse_pos_i64(after, &before)) {
        rc = tv__seterr(&c->err, TV_E_BAD_REQUEST,
                        "malformed cursor (pass next_cursor of the previous page as it is)");
        goto out;
    }
    if ((rc = tv__api_reader(c, &reg)) ||
        (rc = tv__reg_jobs_page(reg, state, kind, before, limit, &js, &n, &more, &c->err)))
        goto out;
    arr = json_array();
    for (size_t i = 0; !rc && i < n; i++)
        if (job_visible(c, &js[i]) && json_array_append_new(arr, tv__api_job_json(&js[i])))
            rc = tv__seterr(&c->err, -ENOMEM, "out of memory");
    if (!rc) {
        json_t *next = json_null();
        if (more && n) {
            char last[24];
            int ll = snprintf(last, sizeof last, "%" PRId64, js[n - 1].id);
            char *cur = tv__api_cursor_make('j', last, (size_t)ll);
            json_decref(next);
            next = cur ? tv__api_jstr(cur) : NULL;
            free(cur);
        }
        rc = tv__api_reply(c, 200, json_pack("{s:o,s:o}", "jobs", arr, "next_cursor", next));
        arr = NULL;
    }
out:
    json_decref(arr);
    tv__reg_jobs_free(js, n);
    free(after);
    return rc;
}

int tv__api_h_job(tv__api_ctx *c)
{
    static const char *const none[] = {NULL};
    tv__reg *reg;
    int64_t id = 0;
    int rc;
    if ((rc = tv__api_query_allow(c, none)) || (rc = job_id(c, &id)) ||
        (rc = tv__api_reader(c, &reg)))
        return rc;
    return job_reply(c, reg, id, 200);
}

int tv__api_h_job_cancel(tv__api_ctx *c)
{
    static const char *const none[] = {NULL};
    tv__reg *reg;
    int64_t id = 0;
    int rc;
    json_t *body = NULL;
    if ((rc = tv__api_query_allow(c, none)) || (rc = tv__api_body(c, none, true, &body)) ||
        (rc = job_id(c, &id)))
        goto out;
    if (!c->api->jobs) {
        /* Local mode runs jobs inline: nothing here is in flight. */
        tv__reg_job j = {0};
        if ((rc = tv__api_reader(c, &reg)) || (rc = tv__reg_job_get(reg, id, &j, &c->err)))
            goto out;
        free(j.result_json);
        rc = tv__seterr(
            &c->err, TV_E_STATE,
            "job %" PRId64 " is not running in this process (cancel it through tensorvaultd)", id);
        goto out;
    }
    if ((rc = tv__jobs_cancel(c->api->jobs, id, &c->err)) || (rc = tv__api_reader(c, &reg)))
        goto out;
    /* A running job stops at its next chunk or step (a local import within
     * milliseconds), a remote transfer within a second: look at the row for
     * half a second, so the answer usually shows the end state, then answer
     * it as it is (running: it reads cancelled about a second later). */
    for (int i = 0; i < CANCEL_WAIT_POLLS; i++) {
        tv__reg_job j = {0};
        if ((rc = tv__reg_job_get(reg, id, &j, &c->err)))
            goto out;
        free(j.result_json);
        if (j.state != TV__JOB_QUEUED && j.state != TV__JOB_RUNNING)
            break;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    rc = job_reply(c, reg, id, 200);
out:
    json_decref(body);
    return rc;
}
