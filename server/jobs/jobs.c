/* The job pool (see jobs.h). One mutex guards the queue, the running set and
 * the pool's own registry connection (job rows created and cancelled from
 * API threads); each worker thread writes its jobs' progress through its own
 * worker store handle, so a slow import never holds the pool's lock.
 *
 * Invariants: a job node is in exactly one of the queue or a worker's
 * running slot from submit until its row is finished, so a cancel that finds
 * no node is looking at a finished (or foreign) row; a queued node's cancel
 * finishes its row under the lock, a running node's sets its flag and the
 * worker finishes the row. A row's state changes (queued -> running ->
 * final) are written under the lock together with the counters
 * (n_queued, n_running), so the counters never lag a row a client has
 * already seen (GET /v1/status and /metrics against GET /v1/jobs/{id});
 * the work between them runs unlocked. The pool counts the bytes its
 * imports write (an atomic, read by /metrics through
 * tv__jobs_imported_bytes): nothing here knows of HTTP. */
#include "jobs/jobs.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "import/import.h"
#include "import/source.h"
#include "registry/notes.h"
#include "util/internal.h"

#define PROGRESS_MIN_S 0.25 /* at most every 250 ms */

typedef struct job_node {
    int64_t id;
    tv__job_kind kind;
    char model[TV__REG_NAME_MAX + 1];
    char source[TV__REG_PATH_MAX];
    char alias[TV__ALIAS_MAX + 1];
    bool has_alias, activate, strict;
    int64_t device_id;
    tv__src_pull *pull;   /* a fleet pull (own copy), or NULL */
    tv__src_local *local; /* a local source held open (taken over), or NULL */
    int64_t generation;   /* import as this number; 0 = the next */
    atomic_bool cancel;
    struct job_node *next;
} job_node;

static void node_free(job_node *n)
{
    if (n) {
        tv__src_pull_free(n->pull);
        tv__src_local_free(n->local);
    }
    free(n);
}

struct tv__jobs {
    tv__store *st; /* the writer, owned by the caller */
    tv__reg *reg;  /* the pool's connection: submit and cancel, under lock */
    pthread_mutex_t lock;
    pthread_cond_t cond; /* work queued, or stopping */
    job_node *head, *tail;
    size_t n_queued, n_running, queue_len;
    bool stopping;
    unsigned n_workers, n_started;
    pthread_t *threads;
    tv__store **wst;              /* one worker store per thread */
    job_node **running;           /* slot per worker, NULL when idle */
    bool default_strict;          /* import.strict */
    tv__src_http_opts http;       /* import.http_* */
    tv__sidecar_caps side_caps;   /* import.sidecar_* */
    void (*on_import)(void *ctx); /* an import succeeded (fleet: publish) */
    void *on_import_ctx;
    _Atomic uint64_t imported_bytes; /* written by this pool's imports */
};

typedef struct worker_arg {
    tv__jobs *j;
    unsigned idx;
} worker_arg;

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- running one job ----------------------------------------------------- */

typedef struct run_ctx {
    tv__reg *reg;
    int64_t id;
    const atomic_bool *cancel;
    const tv__src_http_opts *http;     /* NULL: defaults (inline jobs) */
    const tv__sidecar_caps *side_caps; /* NULL: defaults (inline jobs) */
    tv__job_watch_fn watch;
    void *watch_ctx;
    double last_write; /* 0 = never */
    char last_step[TV__JOB_STEP_MAX];
    uint64_t last_done;
    const char *step;
    uint64_t done, total;
    double step_start;
    _Atomic uint64_t *imported; /* the pool's count (NULL: inline jobs count nothing) */
    uint64_t write_seen;        /* bytes of the write step already counted */
    bool step_moved;            /* the step's first bytes were recorded */
    /* The rate shown: bytes over the last window of >= RATE_WINDOW_S in
     * this step (a step's first report counts bytes handed to the pipeline
     * before they moved), or, once whole is set, the job's total over its
     * time. */
    double win_t0, rate;
    uint64_t win_done0;
    bool whole;
} run_ctx;

#define RATE_WINDOW_S 1.0

static void watch_row(run_ctx *r)
{
    if (!r->watch)
        return;
    tv__reg_job row;
    if (tv__reg_job_get(r->reg, r->id, &row, NULL) == 0) {
        r->watch(r->watch_ctx, &row);
        free(row.result_json);
    }
}

static void write_progress(run_ctx *r, bool force)
{
    double now = mono_s();
    bool moved = r->done != r->last_done || strcmp(r->step, r->last_step) != 0;
    if (!force && r->last_write != 0 && (now - r->last_write < PROGRESS_MIN_S || !moved))
        return;
    double dt = now - r->step_start, rate;
    if (r->whole) {
        rate = dt > 0 && r->done ? (double)r->done / dt : 0;
    } else {
        if (r->win_t0 == 0 || r->win_t0 < r->step_start) {
            r->win_t0 = r->step_start;
            r->win_done0 = 0;
            r->rate = 0;
        }
        double wdt = now - r->win_t0;
        if (wdt >= RATE_WINDOW_S && r->done >= r->win_done0) {
            r->rate = (double)(r->done - r->win_done0) / wdt;
            r->win_t0 = now;
            r->win_done0 = r->done;
        }
        rate = r->rate;
    }
    tv_error e = {0};
    if (tv__reg_job_progress(r->reg, r->id, r->step, r->done, r->total, rate, 0, &e))
        tv__log(TV_LOG_DEBUG, "job %" PRId64 ": progress not recorded: %s", r->id, e.msg);
    r->last_write = now;
    r->last_done = r->done;
    snprintf(r->last_step, sizeof(r->last_step), "%s", r->step);
    watch_row(r);
}

static void on_step(void *ctx, const char *step, size_t shard, uint64_t done, uint64_t total)
{
    (void)shard;
    run_ctx *r = ctx;
    /* A new step, and its first bytes, are written at once (a fast import
     * still shows every step with bytes moving); in between at most every
     * PROGRESS_MIN_S. */
    bool force = false;
    if (strcmp(step, r->step) != 0) {
        r->step = step;
        r->step_start = mono_s();
        r->step_moved = false;
        force = true;
    }
    if (done > 0 && !r->step_moved) {
        r->step_moved = true;
        force = true;
    }
    if (strcmp(step, "write") == 0 && done > r->write_seen) {
        if (r->imported)
            atomic_fetch_add_explicit(r->imported, done - r->write_seen, memory_order_relaxed);
        r->write_seen = done;
    }
    r->done = done;
    r->total = total;
    write_progress(r, force);
}

static bool is_cancelled(void *ctx)
{
    run_ctx *r = ctx;
    return r->cancel && atomic_load(r->cancel);
}

/* skipped: the sidecar files not stored (borrowed). */
static char *import_result_json(const job_node *n, const tv__import_result *res, json_t *skipped,
                                double seconds)
{
    json_t *aliases = json_array();
    if (n->has_alias)
        json_array_append_new(aliases, json_string(n->alias));
    json_t *o = json_pack(
        "{s:s,s:I,s:b,s:o,s:I,s:I,s:I,s:I,s:I,s:I,s:f,s:I,s:o}", "model", n->model, "generation",
        (json_int_t)res->generation, "active", n->activate, "aliases", aliases, "n_shards",
        (json_int_t)res->n_shards, "n_tensors", (json_int_t)res->n_tensors, "total_bytes",
        (json_int_t)res->bytes_total, "written_bytes", (json_int_t)res->bytes_written,
        "deduplicated_bytes", (json_int_t)res->bytes_deduped, "resumed_bytes",
        (json_int_t)res->bytes_resumed, "seconds", seconds, "n_files", (json_int_t)res->n_files,
        "skipped", json_incref(skipped));
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return s;
}

/* The importer's resume record, into this job's row. */
static void save_resume(void *ctx, const char *json)
{
    run_ctx *r = ctx;
    tv_error e = {0};
    if (tv__reg_job_set_resume(r->reg, r->id, json, &e))
        tv__log(TV_LOG_WARN, "job %" PRId64 ": resume record not kept: %s", r->id, e.msg);
}

static int run_import_done(tv__store *st, const job_node *n, const tv__import_result *rp,
                           json_t *skipped, int64_t *gen, char **result, double seconds,
                           tv_error *err);

/* A sidecar file the import did not store, into its result. */
static void on_skipped(void *ctx, const char *line)
{
    json_array_append_new(ctx, json_string(line));
}

/* The bytes a resume record (import.c, resume_save) says were flushed:
 * the sum of its objects' "done" (0 for a record that does not parse). */
static uint64_t resume_flushed(const char *record)
{
    json_t *doc = json_loads(record, 0, NULL), *o;
    uint64_t sum = 0;
    size_t i;
    json_array_foreach(json_object_get(doc, "objects"), i, o)
    {
        json_int_t d = json_integer_value(json_object_get(o, "done"));
        sum += d > 0 ? (uint64_t)d : 0;
    }
    json_decref(doc);
    return sum;
}

static int run_import(tv__store *st, const job_node *n, run_ctx *r, int64_t *gen, char **result,
                      tv_error *err)
{
    tv__import_opts o = {0};
    o.activate = n->activate;
    o.strict = n->strict;
    o.on_step = on_step;
    o.step_ctx = r;
    o.cancelled = is_cancelled;
    o.cancel_ctx = r;
    o.http = r->http;
    o.pull = n->pull;
    o.local = n->local;
    /* hf://: the Hub's listing, resolved here (the worker may wait on it),
     * becomes a pull (import/source.h). */
    tv__src_pull *hub = NULL;
    if (!n->pull && tv__src_is_hub(n->source)) {
        tv__src_http_opts ho = {.retries = TV__SRC_HTTP_DEFAULT_RETRIES};
        if (r->http)
            ho = *r->http;
        ho.cancel = (tv__http_cancel){.cancelled = is_cancelled, .ctx = r};
        int hrc = tv__src_hub_resolve(n->source, &ho, &hub, err);
        if (hrc)
            return hrc;
        o.pull = hub;
    }
    o.generation = n->generation;
    if (r->side_caps) {
        o.sidecar_max_len = r->side_caps->max_len;
        o.sidecar_total_len = r->side_caps->total_len;
    }
    /* A remote import takes over what an interrupted one of the same model
     * and source left (import.h: resume). */
    char *resume = NULL;
    int64_t from = 0;
    if (o.pull || tv__src_is_url(n->source)) {
        tv_error e = {0};
        if (tv__reg_job_take_resume(st->reg, n->id, n->model, n->source, &resume, &from, &e))
            tv__log(TV_LOG_WARN, "job %" PRId64 ": not resuming: %s", n->id, e.msg);
        else if (resume)
            tv__log(TV_LOG_INFO,
                    "job %" PRId64 ": taking up job %" PRId64 "'s record: %" PRIu64
                    " bytes it flushed are checked and kept",
                    n->id, from, resume_flushed(resume));
        o.resume = resume;
        o.resume_save = save_resume;
        o.resume_ctx = r;
    }
    tv__import_result res = {0};
    double t0 = mono_s();
    json_t *skipped = json_array();
    o.on_skipped = skipped ? on_skipped : NULL;
    o.skipped_ctx = skipped;
    int rc = tv__import(st, n->model, n->source, &o, &res, err);
    free(resume);
    tv__src_pull_free(hub);
    if (!rc)
        rc = run_import_done(st, n, &res, skipped, gen, result, mono_s() - t0, err);
    json_decref(skipped);
    return rc;
}

/* After the import: the alias, then the result document. */
static int run_import_done(tv__store *st, const job_node *n, const tv__import_result *rp,
                           json_t *skipped, int64_t *gen, char **result, double seconds,
                           tv_error *err)
{
    int rc;
    tv__import_result res = *rp;
    *gen = res.generation;
    if (n->has_alias && (rc = tv__store_alias_set(st, n->model, n->alias, res.generation, err))) {
        char msg[sizeof(err->msg)];
        snprintf(msg, sizeof(msg), "%s", err->msg);
        return tv__seterr(err, rc,
                          "model '%s' generation %" PRId64
                          " was imported but alias '%s' was not set: %s",
                          n->model, res.generation, n->alias, msg);
    }
    if (!(*result = import_result_json(n, &res, skipped, seconds)))
        return tv__seterr(err, -ENOMEM, "out of memory rendering the import result");
    return 0;
}

static json_t *users_json(tv__reg *reg, int64_t object_id)
{
    tv__reg_object_user *u = NULL;
    size_t n = 0;
    json_t *arr = json_array();
    if (tv__reg_object_users(reg, object_id, &u, &n, NULL) == 0)
        for (size_t k = 0; k < n; k++)
            json_array_append_new(arr, json_pack("{s:s,s:I,s:s,s:b,s:s,s:I}", "model", u[k].model,
                                                 "generation", (json_int_t)u[k].generation, "state",
                                                 tv__gen_state_name(u[k].state), "active",
                                                 u[k].active, "shard", u[k].shard, "shard_index",
                                                 (json_int_t)u[k].shard_idx));
    free(u);
    return arr;
}

static int run_verify(tv__store *st, const job_node *n, run_ctx *r, char **result, tv_error *err)
{
    tv__reg_object *objs = NULL;
    size_t n_objs = 0, n_failed = 0;
    uint64_t total = 0, done = 0;
    int rc = tv__reg_objects_list_committed(st->reg, n->device_id, &objs, &n_objs, err);
    if (rc)
        return rc;
    for (size_t i = 0; i < n_objs; i++)
        if (tv__add_u64(total, objs[i].canonical_len, &total))
            total = UINT64_MAX;
    json_t *arr = json_array();
    int first_rc = 0;
    r->step = "verify";
    r->step_start = mono_s();
    r->total = total;
    r->done = 0;
    write_progress(r, true);
    for (size_t i = 0; i < n_objs; i++) {
        if (is_cancelled(r)) {
            rc =
                tv__seterr(err, -ECANCELED, "verify cancelled after %zu of %zu objects", i, n_objs);
            goto out;
        }
        tv_error e2 = {0};
        int vrc = tv__verify_object(st, &objs[i], &e2);
        if (vrc) {
            n_failed++;
            if (!first_rc)
                first_rc = vrc;
            tv__log(TV_LOG_WARN, "verify: object %" PRId64 " on device %" PRId64 ": %s: %s",
                    objs[i].id, objs[i].device_id, tv_err_name(vrc), e2.msg);
        }
        json_array_append_new(
            arr,
            json_pack("{s:I,s:I,s:I,s:I,s:s,s:s,s:s,s:o}", "object_id", (json_int_t)objs[i].id,
                      "device_id", (json_int_t)objs[i].device_id, "device_offset",
                      (json_int_t)objs[i].base_off, "canonical_bytes",
                      (json_int_t)objs[i].canonical_len, "sha256", objs[i].sha256, "status",
                      !vrc                        ? "ok"
                      : vrc == TV_E_HASH_MISMATCH ? "mismatch"
                                                  : "error",
                      "message", vrc ? e2.msg : "", "used_by", users_json(st->reg, objs[i].id)));
        if (!tv__add_u64(done, objs[i].canonical_len, &done) && done <= total)
            r->done = done;
        write_progress(r, false);
    }
    json_t *o = json_pack("{s:I,s:I,s:I,s:O}", "n_objects", (json_int_t)n_objs, "n_failed",
                          (json_int_t)n_failed, "verified_bytes", (json_int_t)done, "objects", arr);
    *result = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!*result)
        rc = tv__seterr(err, -ENOMEM, "out of memory rendering the verify result");
    else if (n_failed)
        rc = tv__seterr(err, first_rc, "verify: %zu of %zu objects failed (see the job result)",
                        n_failed, n_objs);
out:
    json_decref(arr);
    free(objs);
    return rc;
}

/* One job from its queued row to its final row, in three steps, so that
 * the pool can move its counters in the same critical section as the row's
 * state changes (job_begin: queued -> running; job_end: running -> final):
 * a client that sees the row running or finished, then asks for the
 * counters (tv__jobs_counts), sees them moved, and the other way round. */
typedef struct job_run {
    run_ctx r;
    double t0;
    int64_t gen;
    char *result;
    tv__job_state final;
    int code, rc;
} job_run;

/* The row queued -> running. */
static void job_begin(tv__store *st, const job_node *n, const atomic_bool *cancel,
                      tv__job_watch_fn watch, void *watch_ctx, job_run *jr)
{
    memset(jr, 0, sizeof(*jr));
    jr->t0 = mono_s();
    jr->r = (run_ctx){.reg = st->reg,
                      .id = n->id,
                      .cancel = cancel,
                      .watch = watch,
                      .watch_ctx = watch_ctx,
                      .step = n->kind == TV__JOB_VERIFY ? "verify" : "resolve",
                      .step_start = mono_s()};
    write_progress(&jr->r, true);
}

/* The work, and the final state it ends in (the row is still running). */
static void job_work(tv__store *st, const job_node *n, job_run *jr, tv_error *err)
{
    run_ctx *r = &jr->r;
    tv__log(TV_LOG_INFO, "job %" PRId64 ": %s %s%s%s started", n->id, tv__job_kind_name(n->kind),
            n->kind == TV__JOB_IMPORT ? n->model : "",
            n->kind == TV__JOB_IMPORT ? " from " : "objects",
            n->kind == TV__JOB_IMPORT ? n->source : "");
    int rc = n->kind == TV__JOB_IMPORT ? run_import(st, n, r, &jr->gen, &jr->result, err)
                                       : run_verify(st, n, r, &jr->result, err);
    jr->rc = rc;
    jr->code = rc;
    if (rc == 0) {
        jr->final = TV__JOB_SUCCEEDED;
        r->done = r->total;
        r->step_start = jr->t0; /* the final rate: the whole job's */
        r->whole = true;
        write_progress(r, true);
    } else if (rc == -ECANCELED || rc == TV_E_CANCELLED ||
               (r->cancel && atomic_load(r->cancel) && jr->gen == 0)) {
        jr->final = TV__JOB_CANCELLED;
        jr->code = 0;
    } else {
        jr->final = TV__JOB_FAILED;
    }
}

/* The row running -> final. Returns the job's result code (0 =
 * succeeded, -ECANCELED). */
static int job_end(tv__store *st, const job_node *n, job_run *jr, const tv_error *err)
{
    tv_error fe = {0};
    const char *msg = jr->code ? err->msg : NULL;
    if (tv__reg_job_finish(st->reg, n->id, jr->final, jr->code, msg, jr->gen, jr->result, &fe))
        tv__log(TV_LOG_ERROR, "job %" PRId64 ": final state not recorded: %s", n->id, fe.msg);
    tv__log(jr->final == TV__JOB_FAILED ? TV_LOG_WARN : TV_LOG_INFO, "job %" PRId64 ": %s%s%s",
            n->id, tv__job_state_name(jr->final), jr->code ? ": " : "", jr->code ? err->msg : "");
    watch_row(&jr->r);
    free(jr->result);
    jr->result = NULL;
    return jr->final == TV__JOB_CANCELLED ? -ECANCELED : jr->rc;
}

/* Runs a job whose row exists (queued) to its final row (no pool: no
 * counters). Returns the job's result code (0 = succeeded). */
static int run_job(tv__store *st, const job_node *n, tv__job_watch_fn watch, void *watch_ctx,
                   tv_error *err)
{
    job_run jr;
    job_begin(st, n, NULL, watch, watch_ctx, &jr);
    job_work(st, n, &jr, err);
    return job_end(st, n, &jr, err);
}

/* ---- the pool ------------------------------------------------------------ */

static void *worker_main(void *p)
{
    worker_arg *a = p;
    tv__jobs *j = a->j;
    unsigned w = a->idx;
    free(a);
    pthread_mutex_lock(&j->lock);
    for (;;) {
        while (!j->head && !j->stopping)
            pthread_cond_wait(&j->cond, &j->lock);
        if (j->stopping)
            break;
        job_node *n = j->head;
        j->head = n->next;
        if (!j->head)
            j->tail = NULL;
        /* The row's state and the counters move together, under the
         * lock (tv__jobs_counts takes it): running, then finished. */
        job_run jr;
        tv_error err = {0};
        job_begin(j->wst[w], n, &n->cancel, NULL, NULL, &jr);
        jr.r.http = &j->http;
        jr.r.side_caps = &j->side_caps;
        jr.r.imported = &j->imported_bytes;
        j->n_queued--;
        j->running[w] = n;
        j->n_running++;
        pthread_mutex_unlock(&j->lock);
        /* The events the job writes name who asked for it. */
        tv__reg_actor_from_job(j->wst[w]->reg, n->id, NULL);
        job_work(j->wst[w], n, &jr, &err);
        pthread_mutex_lock(&j->lock);
        bool imported = n->kind == TV__JOB_IMPORT && jr.final == TV__JOB_SUCCEEDED;
        job_end(j->wst[w], n, &jr, &err);
        tv__reg_actor_set(NULL);
        if (imported && j->on_import)
            j->on_import(j->on_import_ctx); /* must not block (tv__fleet_kick) */
        j->running[w] = NULL;
        j->n_running--;
        node_free(n);
    }
    pthread_mutex_unlock(&j->lock);
    return NULL;
}

void tv__jobs_set_on_import(tv__jobs *j, void (*fn)(void *ctx), void *ctx)
{
    if (!j)
        return;
    pthread_mutex_lock(&j->lock);
    j->on_import = fn;
    j->on_import_ctx = ctx;
    pthread_mutex_unlock(&j->lock);
}

void tv__jobs_set_strict_default(tv__jobs *j, bool strict)
{
    if (j)
        j->default_strict = strict;
}

void tv__jobs_set_http(tv__jobs *j, const tv__src_http_opts *o)
{
    if (j && o)
        j->http = *o;
}

void tv__jobs_set_sidecar_caps(tv__jobs *j, uint64_t max_len, uint64_t total_len)
{
    if (j)
        j->side_caps = (tv__sidecar_caps){.max_len = max_len, .total_len = total_len};
}

int tv__jobs_start(tv__store *st, unsigned n_workers, size_t queue_len, tv__jobs **out,
                   tv_error *err)
{
    int rc = 0;
    if (!st || !out || st->lock_fd < 0)
        return tv__seterr(err, TV_E_INVALID_ARG, "job pool needs a writer store");
    *out = NULL;
    if (!n_workers)
        n_workers = TV__JOBS_DEFAULT_WORKERS;
    if (!queue_len)
        queue_len = TV__JOBS_DEFAULT_QUEUE;
    tv__jobs *j = calloc(1, sizeof(*j));
    if (!j)
        return tv__seterr(err, -ENOMEM, "out of memory");
    pthread_mutex_init(&j->lock, NULL);
    pthread_cond_init(&j->cond, NULL);
    j->st = st;
    j->http.retries = TV__SRC_HTTP_DEFAULT_RETRIES;
    j->queue_len = queue_len;
    j->n_workers = n_workers;
    j->threads = calloc(n_workers, sizeof(*j->threads));
    j->wst = calloc(n_workers, sizeof(*j->wst));
    j->running = calloc(n_workers, sizeof(*j->running));
    if (!j->threads || !j->wst || !j->running) {
        rc = tv__seterr(err, -ENOMEM, "out of memory");
        goto fail;
    }
    char path[TV__REG_PATH_MAX];
    int np = snprintf(path, sizeof(path), "%s/registry.db", st->dir);
    if (np < 0 || (size_t)np >= sizeof(path)) {
        rc = tv__seterr(err, -ENAMETOOLONG, "store path %s is too long", st->dir);
        goto fail;
    }
    if ((rc = tv__reg_open_ex(path, 0, &j->reg, err)))
        goto fail;
    for (unsigned i = 0; i < n_workers; i++)
        if ((rc = tv__store_open_worker(st, &j->wst[i], err)))
            goto fail;
    for (unsigned i = 0; i < n_workers; i++) {
        worker_arg *a = malloc(sizeof(*a));
        if (!a) {
            rc = tv__seterr(err, -ENOMEM, "out of memory");
            goto fail;
        }
        a->j = j;
        a->idx = i;
        int e = pthread_create(&j->threads[i], NULL, worker_main, a);
        if (e) {
            free(a);
            rc = tv__seterr(err, -e, "cannot start import worker %u: %s", i, strerror(e));
            goto fail;
        }
        j->n_started++;
    }
    *out = j;
    return 0;
fail:
    tv__jobs_stop(j);
    return rc;
}

/* A job node and its registry row from spec, checked: an import needs a
 * model (the name rule), a source and an optional alias (the alias rule);
 * a verify job a device id >= 0 (0 = every device). Returns 0 and *out
 * (free with free()); TV_E_INVALID_ARG; TV_E_NAME; -ENOMEM. */
static int node_from_spec(const tv__job_spec *spec, bool strict, job_node **out, tv__reg_job *row,
                          tv_error *err)
{
    int rc;
    *out = NULL;
    job_node *n = calloc(1, sizeof(*n));
    if (!n) {
        tv__src_local_free(spec->local);
        return tv__seterr(err, -ENOMEM, "out of memory");
    }
    n->local = spec->local; /* taken over: node_free closes it */
    n->kind = spec->kind;
    n->activate = spec->activate;
    n->strict = strict;
    n->device_id = spec->device_id;
    if (spec->kind == TV__JOB_IMPORT) {
        if (!spec->model || !spec->source) {
            rc = tv__seterr(err, TV_E_INVALID_ARG, "an import job needs a model and a source");
            goto fail;
        }
        if ((rc = tv__name_valid(spec->model, "model name", err)) ||
            (spec->alias && *spec->alias && (rc = tv__alias_name_valid(spec->alias, err))))
            goto fail;
        if (strlen(spec->source) >= sizeof(n->source) || strlen(spec->model) >= sizeof(n->model)) {
            rc = tv__seterr(err, TV_E_INVALID_ARG,
                            "import source or model name too long (at most %zu and %zu bytes)",
                            sizeof(n->source) - 1, sizeof(n->model) - 1);
            goto fail;
        }
        snprintf(n->model, sizeof(n->model), "%s", spec->model);
        snprintf(n->source, sizeof(n->source), "%s", spec->source);
        if (spec->generation < 0) {
            rc = tv__seterr(err, TV_E_INVALID_ARG, "generation %" PRId64 " is negative",
                            spec->generation);
            goto fail;
        }
        n->generation = spec->generation;
        if (spec->pull && (rc = tv__src_pull_dup(spec->pull, &n->pull, err)))
            goto fail;
        if (spec->alias && *spec->alias) {
            snprintf(n->alias, sizeof(n->alias), "%s", spec->alias);
            n->has_alias = true;
        }
    } else if (spec->kind != TV__JOB_VERIFY || spec->device_id < 0) {
        rc = tv__seterr(err, TV_E_INVALID_ARG, "unknown job kind %d or device id %" PRId64,
                        (int)spec->kind, spec->device_id);
        goto fail;
    }
    memset(row, 0, sizeof(*row));
    row->kind = n->kind;
    snprintf(row->model, sizeof(row->model), "%s", n->model);
    snprintf(row->source, sizeof(row->source), "%s", n->source);
    snprintf(row->alias, sizeof(row->alias), "%s", n->alias);
    row->activate = n->activate;
    row->strict = n->strict;
    row->device_id = n->device_id;
    *out = n;
    return 0;
fail:
    node_free(n);
    return rc;
}

int tv__jobs_submit(tv__jobs *j, const tv__job_spec *spec, int64_t *id, tv_error *err)
{
    int rc;
    if (!j || !spec) {
        if (spec)
            tv__src_local_free(spec->local);
        return tv__seterr(err, TV_E_INVALID_ARG, "NULL argument");
    }
    tv__reg_job row;
    job_node *n = NULL;
    if ((rc = node_from_spec(spec, spec->strict || j->default_strict, &n, &row, err)))
        return rc;
    pthread_mutex_lock(&j->lock);
    if (j->stopping) {
        rc = tv__seterr(err, TV_E_STATE, "the job pool is stopping");
    } else if (j->n_queued >= j->queue_len) {
        rc = tv__seterr(err, TV_E_BUSY, "job queue is full (%zu queued, %zu running); retry later",
                        j->n_queued, j->n_running);
    } else if (n->kind == TV__JOB_VERIFY && n->device_id > 0) {
        tv__reg_device d;
        rc = tv__reg_device_get(j->reg, n->device_id, &d, err);
    } else {
        rc = 0;
    }
    if (!rc)
        rc = tv__reg_job_create(j->reg, &row, &n->id, err);
    if (!rc) {
        if (j->tail)
            j->tail->next = n;
        else
            j->head = n;
        j->tail = n;
        j->n_queued++;
        if (id)
            *id = n->id;
        pthread_cond_signal(&j->cond);
    }
    pthread_mutex_unlock(&j->lock);
    if (rc)
        goto fail;
    return 0;
fail:
    node_free(n);
    return rc;
}

int tv__jobs_cancel(tv__jobs *j, int64_t id, tv_error *err)
{
    int rc = 0;
    if (!j)
        return tv__seterr(err, TV_E_INVALID_ARG, "NULL job pool");
    pthread_mutex_lock(&j->lock);
    job_node *prev = NULL, *n = j->head;
    while (n && n->id != id)
        prev = n, n = n->next;
    if (n) { /* queued: never started */
        if (prev)
            prev->next = n->next;
        else
            j->head = n->next;
        if (j->tail == n)
            j->tail = prev;
        j->n_queued--;
        rc = tv__reg_job_finish(j->reg, id, TV__JOB_CANCELLED, 0, NULL, 0, NULL, err);
        node_free(n);
        goto out;
    }
    for (unsigned w = 0; w < j->n_workers; w++) {
        if (j->running[w] && j->running[w]->id == id) {
            /* Its worker hears it between chunks, or its transfer within a
             * second, and finishes the row: no API thread waits on that. */
            atomic_store(&j->running[w]->cancel, true);
            goto out;
        }
    }
    tv__reg_job row;
    if ((rc = tv__reg_job_get(j->reg, id, &row, err)))
        goto out;
    free(row.result_json);
    if (row.state == TV__JOB_QUEUED || row.state == TV__JOB_RUNNING)
        rc = tv__reg_job_finish(j->reg, id, TV__JOB_CANCELLED, 0, NULL, 0, NULL, err); /* orphan */
    else
        rc = tv__seterr(err, TV_E_STATE, "job %" PRId64 " already %s", id,
                        tv__job_state_name(row.state));
out:
    pthread_mutex_unlock(&j->lock);
    return rc;
}

int tv__jobs_run_inline(tv__store *st, const tv__job_spec *spec, tv__job_watch_fn watch, void *ctx,
                        int64_t *id, tv_error *err)
{
    int rc;
    if (!st || !spec || st->lock_fd < 0) {
        if (spec)
            tv__src_local_free(spec->local);
        return tv__seterr(err, TV_E_INVALID_ARG, "a job needs a writer store");
    }
    tv__reg_job row;
    job_node *n = NULL;
    if ((rc = node_from_spec(spec, spec->strict, &n, &row, err)))
        return rc;
    if (n->kind == TV__JOB_VERIFY && n->device_id > 0) {
        tv__reg_device d;
        if ((rc = tv__reg_device_get(st->reg, n->device_id, &d, err)))
            goto out;
    }
    if ((rc = tv__reg_job_create(st->reg, &row, &n->id, err)))
        goto out;
    if (id)
        *id = n->id;
    tv_error local = {0};
    rc = run_job(st, n, watch, ctx, err ? err : &local);
out:
    node_free(n);
    return rc;
}

uint64_t tv__jobs_imported_bytes(tv__jobs *j)
{
    return j ? atomic_load_explicit(&j->imported_bytes, memory_order_relaxed) : 0;
}

void tv__jobs_counts(tv__jobs *j, size_t *queued, size_t *running)
{
    size_t q = 0, r = 0;
    if (j) {
        pthread_mutex_lock(&j->lock);
        q = j->n_queued;
        r = j->n_running;
        pthread_mutex_unlock(&j->lock);
    }
    if (queued)
        *queued = q;
    if (running)
        *running = r;
}

int tv__jobs_count_states(tv__reg *reg, uint64_t counts[5])
{
    int rc = 0;
    memset(counts, 0, 5 * sizeof(counts[0]));
    if (!reg)
        return TV_E_INVALID_ARG;
    int64_t before = 0;
    for (;;) {
        tv__reg_job *jobs = NULL;
        size_t n = 0;
        bool more = false;
        if ((rc = tv__reg_jobs_page(reg, -1, -1, before, 1000, &jobs, &n, &more, NULL)))
            break;
        for (size_t i = 0; i < n; i++) {
            if ((unsigned)jobs[i].state < 5)
                counts[jobs[i].state]++;
            before = jobs[i].id;
        }
        tv__reg_jobs_free(jobs, n);
        if (!more || n == 0)
            break;
    }
    return rc;
}

void tv__jobs_stop(tv__jobs *j)
{
    if (!j)
        return;
    pthread_mutex_lock(&j->lock);
    j->stopping = true;
    while (j->head) {
        job_node *n = j->head;
        j->head = n->next;
        tv_error e = {0};
        if (j->reg && tv__reg_job_finish(j->reg, n->id, TV__JOB_CANCELLED, 0, NULL, 0, NULL, &e))
            tv__log(TV_LOG_WARN, "job %" PRId64 ": not marked cancelled: %s", n->id, e.msg);
        node_free(n);
    }
    j->tail = NULL;
    j->n_queued = 0;
    for (unsigned w = 0; w < j->n_workers && j->running; w++)
        if (j->running[w])
            atomic_store(&j->running[w]->cancel, true);
    pthread_cond_broadcast(&j->cond);
    pthread_mutex_unlock(&j->lock);
    for (unsigned i = 0; i < j->n_started; i++)
        pthread_join(j->threads[i], NULL);
    for (unsigned i = 0; i < j->n_workers && j->wst; i++)
        tv__store_close(j->wst[i]);
    tv__reg_close(j->reg);
    free(j->threads);
    free(j->wst);
    free(j->running);
    pthread_cond_destroy(&j->cond);
    pthread_mutex_destroy(&j->lock);
    free(j);
}
