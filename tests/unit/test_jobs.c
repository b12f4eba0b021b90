/* Unit tests of the job pool (server/jobs/jobs.c) on a temp store: an
 * import job to its ImportResult, a full queue (TV_E_BUSY), cancel of a
 * queued, a running (mid-write: nothing published, free space back) and a
 * finished job, two imports running at once, stop with work in flight
 * (every job cancelled), verify jobs (VerifyResult), and the inline runner
 * of the CLI's local mode with its watch callback.
 * A gate over tv__sys.pwrite holds imports in their write step. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <jansson.h>
#include <pthread.h>
#include <time.h>

#include "jobs/jobs.h"
#include "import/import.h"
#include "store/store.h"
#include "tv_test_store.h"

#define MiB (1024u * 1024u)

typedef struct fixture {
    tv_test_store s; /* one 64 MiB image, the writer open */
    char ckpt[600];
    char ckpt2[600];
    tv__reg *reg; /* the test's own connection */
} fixture;

/* ---- the pwrite gate ------------------------------------------------------ */

static pthread_mutex_t g_gate_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_gate_cond = PTHREAD_COND_INITIALIZER;
static bool g_gate_closed;
static int g_gate_waiting;
static int g_gate_fds[64]; /* descriptors seen waiting at the gate */
static int g_gate_n_fds;
static ssize_t (*g_real_pwrite)(int, const void *, size_t, off_t);

static ssize_t gated_pwrite(int fd, const void *buf, size_t len, off_t off)
{
    pthread_mutex_lock(&g_gate_lock);
    g_gate_waiting++;
    bool seen = false;
    for (int i = 0; i < g_gate_n_fds; i++)
        seen |= g_gate_fds[i] == fd;
    if (!seen && g_gate_n_fds < 64)
        g_gate_fds[g_gate_n_fds++] = fd;
    pthread_cond_broadcast(&g_gate_cond);
    while (g_gate_closed)
        pthread_cond_wait(&g_gate_cond, &g_gate_lock);
    g_gate_waiting--;
    pthread_mutex_unlock(&g_gate_lock);
    return g_real_pwrite(fd, buf, len, off);
}

static void gate_close(void)
{
    pthread_mutex_lock(&g_gate_lock);
    g_gate_closed = true;
    g_gate_waiting = 0;
    g_gate_n_fds = 0;
    pthread_mutex_unlock(&g_gate_lock);
    g_real_pwrite = tv__sys.pwrite;
    tv__sys.pwrite = gated_pwrite;
}

static void gate_open(void)
{
    pthread_mutex_lock(&g_gate_lock);
    g_gate_closed = false;
    pthread_cond_broadcast(&g_gate_cond);
    pthread_mutex_unlock(&g_gate_lock);
}

static void *open_gate_later(void *p)
{
    (void)p;
    struct timespec ts = {0, 100 * 1000 * 1000};
    nanosleep(&ts, NULL);
    gate_open();
    return NULL;
}

/* Waits until writers on n distinct descriptors (each worker store opens
 * the device itself) wait at the closed gate, or fails after 20 s. */
static void gate_wait_for(int n)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 20;
    pthread_mutex_lock(&g_gate_lock);
    while (g_gate_n_fds < n)
        if (pthread_cond_timedwait(&g_gate_cond, &g_gate_lock, &ts)) {
            pthread_mutex_unlock(&g_gate_lock);
            fail_msg("only %d of %d descriptors reached the gate", g_gate_n_fds, n);
        }
    pthread_mutex_unlock(&g_gate_lock);
}

/* ---- fixture ------------------------------------------------------------- */

static void write_ckpt(const char *path, unsigned seed)
{
    tv_test_tensor t[] = {{"a.weight", "U8", 3 * MiB, 1}, {"b/bias", "U8", 4096, 1}};
    tv_test_write_shard(path, t, 2, seed);
}

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof(*f));
    tv_error err = {0};
    tv_test_store_dir(&f->s, "jobs");
    tv_test_path(f->ckpt, sizeof(f->ckpt), "%s/a.safetensors", f->s.dir);
    tv_test_path(f->ckpt2, sizeof(f->ckpt2), "%s/b.safetensors", f->s.dir);
    write_ckpt(f->ckpt, 1);
    write_ckpt(f->ckpt2, 2);
    tv_test_store_create(&f->s, &(tv_test_store_opts){.image_size = 64 * MiB});
    char reg[700];
    tv_test_path(reg, sizeof(reg), "%s/registry.db", f->s.store);
    if (tv__reg_open_ex(reg, 0, &f->reg, &err))
        fail_msg("registry: %s", err.msg);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    gate_open();
    tv__sys_reset();
    tv__reg_close(f->reg);
    tv_test_store_teardown(&f->s);
    free(f);
    return 0;
}

static bool finished(tv__job_state s)
{
    return s == TV__JOB_SUCCEEDED || s == TV__JOB_FAILED || s == TV__JOB_CANCELLED;
}

/* Polls the job row until it is finished (20 s at most); out's result_json
 * is the caller's. */
static void wait_job(fixture *f, int64_t id, tv__reg_job *out)
{
    for (int i = 0; i < 2000; i++) {
        tv_error err = {0};
        if (tv__reg_job_get(f->reg, id, out, &err))
            fail_msg("job %lld: %s", (long long)id, err.msg);
        if (finished(out->state))
            return;
        free(out->result_json);
        out->result_json = NULL;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    fail_msg("job %lld did not finish", (long long)id);
}

static uint64_t used_bytes(fixture *f)
{
    tv__reg_object *o = NULL;
    size_t n = 0;
    uint64_t sum = 0;
    assert_int_equal(tv__reg_objects_on_device(f->reg, 1, &o, &n, NULL), 0);
    for (size_t i = 0; i < n; i++)
        sum += o[i].alloc_len;
    free(o);
    return sum;
}

static size_t ready_generations(fixture *f, const char *model)
{
    tv__reg_generation *g = NULL;
    size_t n = 0, ready = 0;
    if (tv__reg_generations_list(f->reg, model, &g, &n, NULL))
        return 0;
    for (size_t i = 0; i < n; i++)
        ready += g[i].state == TV__GEN_READY;
    free(g);
    return ready;
}

static tv__job_spec import_spec(const char *model, const char *src)
{
    return (tv__job_spec){.kind = TV__JOB_IMPORT, .model = model, .source = src};
}

/* ---- tests --------------------------------------------------------------- */

static void test_import_job_result(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    tv__jobs *j = NULL;
    assert_int_equal(tv__jobs_start(f->s.st, 2, 4, &j, &err), 0);
    tv__job_spec s = import_spec("org/model", f->ckpt);
    s.activate = true;
    s.alias = "prod";
    int64_t id = 0;
    assert_int_equal(tv__jobs_submit(j, &s, &id, &err), 0);
    assert_true(id > 0);
    tv__reg_job row;
    wait_job(f, id, &row);
    assert_int_equal(row.state, TV__JOB_SUCCEEDED);
    assert_int_equal(row.kind, TV__JOB_IMPORT);
    assert_int_equal(row.generation, 1);
    assert_string_equal(row.model, "org/model");
    assert_true(row.started_at > 0 && row.finished_at >= row.started_at);
    assert_true(row.bytes_total > 0 && row.bytes_done == row.bytes_total);
    assert_true(row.rate_bytes_per_s > 0); /* the whole job's rate */
    assert_non_null(row.result_json);
    json_t *r = json_loads(row.result_json, 0, NULL);
    assert_non_null(r);
    assert_string_equal(json_string_value(json_object_get(r, "model")), "org/model");
    assert_int_equal(json_integer_value(json_object_get(r, "generation")), 1);
    assert_true(json_is_true(json_object_get(r, "active")));
    assert_string_equal(json_string_value(json_array_get(json_object_get(r, "aliases"), 0)),
                        "prod");
    assert_int_equal(json_integer_value(json_object_get(r, "n_shards")), 1);
    assert_int_equal(json_integer_value(json_object_get(r, "n_tensors")), 2);
    assert_true(json_integer_value(json_object_get(r, "total_bytes")) > 3 * MiB);
    assert_true(json_integer_value(json_object_get(r, "written_bytes")) >=
                json_integer_value(json_object_get(r, "total_bytes")));
    assert_int_equal(json_integer_value(json_object_get(r, "deduplicated_bytes")), 0);
    assert_true(json_is_number(json_object_get(r, "seconds")));
    json_decref(r);
    free(row.result_json);
    int64_t gen = 0;
    assert_int_equal(tv__reg_alias_get(f->reg, "org/model", "prod", &gen, &err), 0);
    assert_int_equal(gen, 1);
    assert_int_equal(tv__reg_active_generation(f->reg, "org/model", &gen, &err), 0);
    assert_int_equal(gen, 1);
    /* A bad checkpoint fails the job with the parser's code. */
    char bad[700];
    tv_test_path(bad, sizeof(bad), "%s/bad.safetensors", f->s.dir);
    tv_test_write_text(bad, "not a checkpoint at all");
    s = import_spec("m2", bad);
    assert_int_equal(tv__jobs_submit(j, &s, &id, &err), 0);
    wait_job(f, id, &row);
    assert_int_equal(row.state, TV__JOB_FAILED);
    assert_true(row.error_errno != 0);
    assert_string_equal(row.error_code, tv_err_name(row.error_errno));
    assert_true(strlen(row.error) > 0);
    free(row.result_json);
    /* Names are checked before anything is queued. */
    s = import_spec("bad name!", f->ckpt);
    assert_int_equal(tv__jobs_submit(j, &s, &id, &err), TV_E_NAME);
    s = import_spec("m3", f->ckpt);
    s.alias = "active";
    assert_int_equal(tv__jobs_submit(j, &s, &id, &err), TV_E_NAME);
    tv__jobs_stop(j);
}

static void test_queue_full_busy(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    tv__jobs *j = NULL;
    assert_int_equal(tv__jobs_start(f->s.st, 1, 1, &j, &err), 0);
    gate_close();
    tv__job_spec s = import_spec("m", f->ckpt);
    int64_t a = 0, b = 0, c = 0;
    assert_int_equal(tv__jobs_submit(j, &s, &a, &err), 0);
    gate_wait_for(1); /* a is running, held in its write step */
    assert_int_equal(tv__jobs_submit(j, &s, &b, &err), 0);
    size_t q = 9, r = 9;
    tv__jobs_counts(j, &q, &r);
    assert_int_equal(q, 1);
    assert_int_equal(r, 1);
    memset(&err, 0, sizeof(err));
    assert_int_equal(tv__jobs_submit(j, &s, &c, &err), TV_E_BUSY);
    assert_non_null(strstr(err.msg, "queue is full"));
    gate_open();
    tv__reg_job row;
    wait_job(f, a, &row);
    assert_int_equal(row.state, TV__JOB_SUCCEEDED);
    free(row.result_json);
    wait_job(f, b, &row);
    assert_int_equal(row.state, TV__JOB_SUCCEEDED);
    free(row.result_json);
    /* The two imports of the same checkpoint: generations 1 and 2 (the
     * second deduplicated onto the first's object). */
    assert_int_equal(ready_generations(f, "m"), 2);
    tv__jobs_stop(j);
}

static void test_cancel_running_queued_finished(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    tv__jobs *j = NULL;
    uint64_t before = used_bytes(f);
    assert_int_equal(tv__jobs_start(f->s.st, 1, 4, &j, &err), 0);
    gate_close();
    tv__job_spec s = import_spec("m", f->ckpt);
    int64_t a = 0, b = 0;
    assert_int_equal(tv__jobs_submit(j, &s, &a, &err), 0);
    gate_wait_for(1); /* mid-write: its extent is reserved */
    assert_true(used_bytes(f) > before);
    assert_int_equal(tv__jobs_submit(j, &s, &b, &err), 0);
    /* Queued: cancelled at once. */
    assert_int_equal(tv__jobs_cancel(j, b, &err), 0);
    tv__reg_job row;
    assert_int_equal(tv__reg_job_get(f->reg, b, &row, &err), 0);
    assert_int_equal(row.state, TV__JOB_CANCELLED);
    free(row.result_json);
    /* Running: the cancel returns at once, the row still running (the
     * importer looks once the gate opens, 100 ms later); then the worker
     * finishes the row cancelled. */
    pthread_t opener;
    assert_int_equal(pthread_create(&opener, NULL, open_gate_later, NULL), 0);
    assert_int_equal(tv__jobs_cancel(j, a, &err), 0);
    assert_int_equal(tv__reg_job_get(f->reg, a, &row, &err), 0);
    assert_int_equal(row.state, TV__JOB_RUNNING);
    free(row.result_json);
    pthread_join(opener, NULL);
    wait_job(f, a, &row);
    assert_int_equal(row.state, TV__JOB_CANCELLED);
    assert_null(row.result_json);
    /* Nothing published, free space back to what it was. */
    assert_int_equal(ready_generations(f, "m"), 0);
    assert_int_equal(used_bytes(f), before);
    /* Finished and unknown jobs. */
    assert_int_equal(tv__jobs_cancel(j, a, &err), TV_E_STATE);
    assert_int_equal(tv__jobs_cancel(j, 999999, &err), TV_E_NOT_FOUND);
    tv__jobs_stop(j);
}

static void test_two_imports_at_once(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    tv__jobs *j = NULL;
    assert_int_equal(tv__jobs_start(f->s.st, 2, 4, &j, &err), 0);
    gate_close();
    tv__job_spec s1 = import_spec("one", f->ckpt);
    tv__job_spec s2 = import_spec("two", f->ckpt2);
    int64_t a = 0, b = 0;
    assert_int_equal(tv__jobs_submit(j, &s1, &a, &err), 0);
    assert_int_equal(tv__jobs_submit(j, &s2, &b, &err), 0);
    gate_wait_for(2); /* both write at the same time */
    size_t q = 9, r = 9;
    tv__jobs_counts(j, &q, &r);
    assert_int_equal(q, 0);
    assert_int_equal(r, 2);
    gate_open();
    tv__reg_job row;
    wait_job(f, a, &row);
    assert_int_equal(row.state, TV__JOB_SUCCEEDED);
    free(row.result_json);
    wait_job(f, b, &row);
    assert_int_equal(row.state, TV__JOB_SUCCEEDED);
    free(row.result_json);
    assert_int_equal(ready_generations(f, "one"), 1);
    assert_int_equal(ready_generations(f, "two"), 1);
    tv__jobs_stop(j);
}

static void *stop_thread(void *p)
{
    tv__jobs_stop(p);
    return NULL;
}

static void test_stop_cancels_everything(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    tv__jobs *j = NULL;
    uint64_t before = used_bytes(f);
    assert_int_equal(tv__jobs_start(f->s.st, 1, 4, &j, &err), 0);
    gate_close();
    tv__job_spec s = import_spec("m", f->ckpt);
    int64_t a = 0, b = 0;
    assert_int_equal(tv__jobs_submit(j, &s, &a, &err), 0);
    gate_wait_for(1);
    assert_int_equal(tv__jobs_submit(j, &s, &b, &err), 0);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, stop_thread, j), 0);
    struct timespec ts = {0, 50 * 1000 * 1000};
    nanosleep(&ts, NULL);
    gate_open();
    pthread_join(t, NULL);
    tv__reg_job row;
    assert_int_equal(tv__reg_job_get(f->reg, a, &row, &err), 0);
    assert_int_equal(row.state, TV__JOB_CANCELLED);
    free(row.result_json);
    assert_int_equal(tv__reg_job_get(f->reg, b, &row, &err), 0);
    assert_int_equal(row.state, TV__JOB_CANCELLED);
    free(row.result_json);
    assert_int_equal(used_bytes(f), before);
    assert_int_equal(ready_generations(f, "m"), 0);
    tv__jobs_stop(NULL);
}

static void test_verify_job(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    tv__import_opts io = {0};
    if (tv__import(f->s.st, "v", f->ckpt, &io, NULL, &err))
        fail_msg("import: %s", err.msg);
    tv__jobs *j = NULL;
    assert_int_equal(tv__jobs_start(f->s.st, 1, 4, &j, &err), 0);
    tv__job_spec s = {.kind = TV__JOB_VERIFY};
    int64_t id = 0;
    assert_int_equal(tv__jobs_submit(j, &s, &id, &err), 0);
    tv__reg_job row;
    wait_job(f, id, &row);
    assert_int_equal(row.state, TV__JOB_SUCCEEDED);
    assert_string_equal(row.step, "verify");
    json_t *r = json_loads(row.result_json, 0, NULL);
    assert_non_null(r);
    assert_int_equal(json_integer_value(json_object_get(r, "n_objects")), 1);
    assert_int_equal(json_integer_value(json_object_get(r, "n_failed")), 0);
    json_t *o = json_array_get(json_object_get(r, "objects"), 0);
    assert_string_equal(json_string_value(json_object_get(o, "status")), "ok");
    assert_int_equal(json_integer_value(json_object_get(o, "device_id")), 1);
    assert_int_equal(json_integer_value(json_object_get(r, "verified_bytes")),
                     json_integer_value(json_object_get(o, "canonical_bytes")));
    json_t *u = json_array_get(json_object_get(o, "used_by"), 0);
    assert_string_equal(json_string_value(json_object_get(u, "model")), "v");
    assert_int_equal(json_integer_value(json_object_get(u, "shard_index")), 0);
    json_decref(r);
    free(row.result_json);
    s.device_id = 42;
    assert_int_equal(tv__jobs_submit(j, &s, &id, &err), TV_E_NOT_FOUND);
    tv__jobs_stop(j);
}

typedef struct watch_log {
    int calls;
    bool saw_running, saw_final;
    uint64_t last_done;
    bool monotonic;
} watch_log;

static void watch(void *ctx, const tv__reg_job *now)
{
    watch_log *w = ctx;
    w->calls++;
    if (now->state == TV__JOB_RUNNING)
        w->saw_running = true;
    if (now->state == TV__JOB_SUCCEEDED)
        w->saw_final = true;
}

static void test_run_inline(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    watch_log w = {0};
    tv__job_spec s = import_spec("inline", f->ckpt);
    s.activate = true;
    int64_t id = 0;
    assert_int_equal(tv__jobs_run_inline(f->s.st, &s, watch, &w, &id, &err), 0);
    assert_true(id > 0);
    assert_true(w.calls >= 2);
    assert_true(w.saw_running);
    assert_true(w.saw_final);
    tv__reg_job row;
    assert_int_equal(tv__reg_job_get(f->reg, id, &row, &err), 0);
    assert_int_equal(row.state, TV__JOB_SUCCEEDED);
    assert_non_null(strstr(row.result_json, "\"model\":\"inline\""));
    free(row.result_json);
    /* A failing job returns its code and records it. */
    s = import_spec("inline", "/nonexistent/ckpt");
    int rc = tv__jobs_run_inline(f->s.st, &s, NULL, NULL, &id, &err);
    assert_true(rc != 0);
    assert_int_equal(tv__reg_job_get(f->reg, id, &row, &err), 0);
    assert_int_equal(row.state, TV__JOB_FAILED);
    assert_int_equal(row.error_errno, rc);
    free(row.result_json);
    /* A reader store is refused. */
    tv__store *ro = NULL;
    assert_int_equal(tv__store_open(f->s.store, 0, &ro, &err), 0);
    assert_int_equal(tv__jobs_run_inline(ro, &s, NULL, NULL, &id, &err), TV_E_INVALID_ARG);
    tv__jobs *j = NULL;
    assert_int_equal(tv__jobs_start(ro, 1, 1, &j, &err), TV_E_INVALID_ARG);
    assert_null(j);
    tv__store_close(ro);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_import_job_result, setup, teardown),
        cmocka_unit_test_setup_teardown(test_queue_full_busy, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cancel_running_queued_finished, setup, teardown),
        cmocka_unit_test_setup_teardown(test_two_imports_at_once, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stop_cancels_everything, setup, teardown),
        cmocka_unit_test_setup_teardown(test_verify_job, setup, teardown),
        cmocka_unit_test_setup_teardown(test_run_inline, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
