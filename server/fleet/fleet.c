/* The fleet thread of tensorvaultd (fleet.h). */
#include "fleet/fleet.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "jobs/jobs.h"
#include "fleet/catalog.h"
#include "fleet/s3put.h"
#include "import/source.h"
#include "registry/registry.h"
#include "store/store.h"
#include "util/internal.h"

/* How long a stop waits for the thread: a libpq call on a catalog that
 * stopped answering (a hung server, a lost network) has no timeout. */
#define FLEET_STOP_WAIT_S 5

typedef struct done_key {
    char model[TV__REG_NAME_MAX + 1];
    int64_t number;
} done_key;

/* A generation this node pulls for an alias placed on it. */
typedef struct pull {
    char model[TV__REG_NAME_MAX + 1];
    int64_t number;
    int64_t job;       /* the running import job; 0 = none */
    unsigned attempts; /* jobs that failed */
    bool failed;       /* given up: reported failed until the alias moves again */
    int64_t alias_version;
    char error[TV__REG_ERROR_MAX];
    char **urls; /* this attempt's URL of each pull file (NULL: in memory) */
    size_t n_urls;
    char **excluded;  /* sources that served bad bytes or failed for good */
    int *excluded_rc; /* why each was excluded (the importer's code) */
    size_t n_excluded;
    struct tv__fleet *f;
} pull;

struct tv__fleet {
    unsigned seed; /* rand_r: which peer a pull tries first (fleet thread) */
    char *conninfo, *node, *url, *reg_path;
    char *token, *object_store, *proxy;
    tv__s3_opts s3;
    char *s3_strings[5];
    tv__jobs *jobs;
    const tv__store *writer; /* the daemon's writer store: a worker handle of it switches aliases */
    tv__store *st;
    unsigned pull_attempts;
    pull **pulls;
    size_t n_pulls;
    json_t *doc;                                   /* the last fleet document read (under mu) */
    bool connected;                                /* under mu */
    char last_error[sizeof(((tv_error *)0)->msg)]; /* under mu */
    char where[320];
    unsigned retry_s, heartbeat_s;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cond;
    bool stopping, kicked;
    bool quiet; /* the catalog is away: said once, then debug lines until it is back */
    /* uploads to fleet.object_store, by a thread of their own (under mu) */
    struct upload *uploads;
    pthread_t up_thread;
    bool up_started;
    /* the thread's own */
    tv__catalog *cat;
    tv__reg *reg;
    done_key *done;
    size_t n_done, cap_done;
};

static bool is_done(const tv__fleet *f, const char *model, int64_t number)
{
    for (size_t i = 0; i < f->n_done; i++)
        if (f->done[i].number == number && strcmp(f->done[i].model, model) == 0)
            return true;
    return false;
}

static void mark_done(tv__fleet *f, const char *model, int64_t number)
{
    if (f->n_done == f->cap_done) {
        size_t cap = f->cap_done ? f->cap_done * 2 : 16;
        done_key *d = realloc(f->done, cap * sizeof(*d));
        if (!d)
            return; /* published again next time: idempotent */
        f->done = d;
        f->cap_done = cap;
    }
    snprintf(f->done[f->n_done].model, sizeof f->done[0].model, "%s", model);
    f->done[f->n_done++].number = number;
}

static bool stopping(tv__fleet *f)
{
    pthread_mutex_lock(&f->mu);
    bool s = f->stopping;
    pthread_mutex_unlock(&f->mu);
    return s;
}

/* The uploads' cancel (s3put.h): the daemon is stopping. */
static bool stop_asked(void *f)
{
    return stopping(f);
}

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- reports ------------------------------------------------------------ */

/* Wakes every node's fleet thread (LISTEN) after a report that can let a
 * switch happen: a generation ready or failed here, an alias switched. */
static void notify_report(tv__fleet *f, const char *kind, const char *model, int64_t number,
                          const char *what)
{
    json_t *j = json_pack("{s:s, s:s, s:s, s:I, s:s}", "kind", kind, "node", f->node, "model",
                          model, "generation", (json_int_t)number, "state", what);
    char *payload = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    const char *pv[] = {TV__CATALOG_CHANNEL, payload ? payload : "{}"};
    tv_error err = {0};
    if (tv__catalog_exec(f->cat, "SELECT pg_notify($1, $2)", 2, pv, "notifying a report", &err))
        tv__log(TV_LOG_DEBUG, "fleet: %s", err.msg);
    free(payload);
}

static void report_gen(tv__fleet *f, const char *model, int64_t number, const char *state,
                       uint64_t done, uint64_t total, double rate, const char *error)
{
    char num[24], d[24], t[24], r[40];
    snprintf(num, sizeof num, "%" PRId64, number);
    snprintf(d, sizeof d, "%" PRIu64, done);
    snprintf(t, sizeof t, "%" PRIu64, total);
    snprintf(r, sizeof r, "%.1f", rate);
    const char *pv[] = {f->node, model, num, state, d, t, r, error};
    tv_error err = {0};
    if (tv__catalog_exec(
            f->cat,
            "INSERT INTO node_generations (node, model, number, state, bytes_done, bytes_total, "
            "rate_bps, error, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, now()) "
            "ON CONFLICT (node, model, number) DO UPDATE SET state = excluded.state, "
            "bytes_done = excluded.bytes_done, bytes_total = excluded.bytes_total, "
            "rate_bps = excluded.rate_bps, error = excluded.error, updated_at = now()",
            8, pv, "reporting a generation's state", &err))
        tv__log(TV_LOG_DEBUG, "fleet: %s", err.msg);
    else if (!strcmp(state, "ready") || !strcmp(state, "failed"))
        notify_report(f, "node_generation", model, number, state);
}

static void report_alias(tv__fleet *f, const char *model, const char *alias, int64_t number,
                         int64_t version)
{
    char num[24], ver[24];
    snprintf(num, sizeof num, "%" PRId64, number);
    snprintf(ver, sizeof ver, "%" PRId64, version);
    const char *pv[] = {f->node, model, alias, num, ver};
    tv_error err = {0};
    if (tv__catalog_exec(f->cat,
                         "INSERT INTO node_aliases (node, model, alias, generation, version) "
                         "VALUES ($1, $2, $3, $4, $5) ON CONFLICT (node, model, alias) DO UPDATE "
                         "SET generation = excluded.generation, version = excluded.version, "
                         "switched_at = now()",
                         5, pv, "reporting an alias", &err))
        tv__log(TV_LOG_DEBUG, "fleet: %s", err.msg);
    else
        notify_report(f, "node_alias", model, number, alias);
}

/* ---- the fleet document ------------------------------------------------- */

/* Everything GET /v1/fleet shows and the rollout decides on, in one
 * statement: nodes, aliases with every placed node's state, generations
 * with the nodes holding them. */
static const char FLEET_SQL[] =
    "SELECT json_build_object("
    "'nodes', (SELECT coalesce(json_agg(json_build_object('name', n.name, 'url', n.url, "
    "'state', n.state, 'last_seen', n.last_seen, "
    "'age_s', round(extract(epoch FROM now() - n.last_seen)::numeric, 1)) ORDER BY n.name), "
    "'[]'::json) FROM nodes n), "
    "'aliases', (SELECT coalesce(json_agg(json_build_object('model', a.model, 'alias', a.alias, "
    "'generation', a.generation, 'version', a.version, 'placement', a.placement, "
    "'quorum', a.quorum, 'timeout_s', a.timeout_s, 'updated_at', a.updated_at, "
    "'age_s', round(extract(epoch FROM now() - a.updated_at)::numeric, 1), "
    "'nodes', (SELECT coalesce(json_agg(json_build_object('node', p.name, "
    "'state', coalesce(ng.state, 'missing'), 'bytes_done', coalesce(ng.bytes_done, 0), "
    "'bytes_total', coalesce(ng.bytes_total, 0), 'rate_bps', coalesce(ng.rate_bps, 0), "
    "'error', ng.error, 'serving', na.generation, "
    "'up', coalesce(nn.last_seen > now() - interval '30 seconds', false)) ORDER BY p.name), "
    "'[]'::json) FROM (SELECT name FROM nodes WHERE a.placement IS NULL "
    "UNION SELECT unnest(a.placement)) p(name) "
    "LEFT JOIN nodes nn ON nn.name = p.name "
    "LEFT JOIN node_generations ng ON ng.node = p.name AND ng.model = a.model "
    "AND ng.number = a.generation "
    "LEFT JOIN node_aliases na ON na.node = p.name AND na.model = a.model AND na.alias = a.alias)"
    ") ORDER BY a.model, a.alias), '[]'::json) FROM aliases a), "
    "'generations', (SELECT coalesce(json_agg(json_build_object('model', g.model, "
    "'number', g.number, 'total_bytes', g.total_bytes, 'n_shards', g.n_shards, "
    "'n_tensors', g.n_tensors, 'source', g.source, 'published_by', g.published_by, "
    "'created_at', g.created_at, 'holders', (SELECT coalesce(json_agg(ng.node ORDER BY ng.node), "
    "'[]'::json) FROM node_generations ng WHERE ng.model = g.model AND ng.number = g.number "
    "AND ng.state = 'ready')) ORDER BY g.model, g.number), '[]'::json) FROM generations g))";

/* What a pull needs: the shards with their sources (peers that are up and
 * hold the blob, the object store's copy) and, for several shards, the
 * index's weight map. $1 model, $2 number, $3 this node. */
static const char PULL_SQL[] =
    "SELECT json_build_object('source', g.source, 'total_bytes', g.total_bytes, "
    "'shards', (SELECT coalesce(json_agg(json_build_object('idx', s.idx, 'name', s.name, "
    "'sha256', s.sha256, 'bytes', s.file_bytes, "
    "'peers', (SELECT coalesce(json_agg(DISTINCT n.url), '[]'::json) FROM shards s2 "
    "JOIN node_generations ng ON ng.model = s2.model AND ng.number = s2.number "
    "AND ng.state = 'ready' JOIN nodes n ON n.name = ng.node WHERE s2.sha256 = s.sha256 "
    "AND n.name <> $3 AND n.url <> '' AND n.last_seen > now() - interval '30 seconds'), "
    "'blob', (SELECT b.url FROM blobs b WHERE b.sha256 = s.sha256)) ORDER BY s.idx), "
    "'[]'::json) FROM shards s WHERE s.model = g.model AND s.number = g.number), "
    "'weight_map', CASE WHEN g.n_shards > 1 THEN (SELECT json_object_agg(t.name, s.name) "
    "FROM tensors t JOIN shards s ON s.model = t.model AND s.number = t.number "
    "AND s.idx = t.shard WHERE t.model = g.model AND t.number = g.number) END) "
    "FROM generations g WHERE g.model = $1 AND g.number = $2";

static void set_connected(tv__fleet *f, bool up, const char *error)
{
    pthread_mutex_lock(&f->mu);
    f->connected = up;
    snprintf(f->last_error, sizeof f->last_error, "%s", error ? error : "");
    pthread_mutex_unlock(&f->mu);
}

/* ---- pulls -------------------------------------------------------------- */

static pull *pull_find(tv__fleet *f, const char *model, int64_t number, bool create)
{
    for (size_t i = 0; i < f->n_pulls; i++)
        if (f->pulls[i]->number == number && !strcmp(f->pulls[i]->model, model))
            return f->pulls[i];
    if (!create)
        return NULL;
    pull **v = realloc(f->pulls, (f->n_pulls + 1) * sizeof(*v));
    pull *p = calloc(1, sizeof(*p));
    if (!v || !p) {
        free(p);
        if (v)
            f->pulls = v;
        return NULL;
    }
    f->pulls = v;
    snprintf(p->model, sizeof p->model, "%s", model);
    p->number = number;
    p->f = f;
    f->pulls[f->n_pulls++] = p;
    return p;
}

static void strv_free(char **v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(v[i]);
    free(v);
}

static void pull_free(pull *p)
{
    if (!p)
        return;
    strv_free(p->urls, p->n_urls);
    strv_free(p->excluded, p->n_excluded);
    free(p->excluded_rc);
    free(p);
}

static bool pull_excluded(tv__fleet *f, pull *p, const char *url)
{
    pthread_mutex_lock(&f->mu);
    bool x = false;
    for (size_t i = 0; i < p->n_excluded && !x; i++)
        x = !strcmp(p->excluded[i], url);
    pthread_mutex_unlock(&f->mu);
    return x;
}

/* The importer's word that a source served bad bytes or failed for good
 * (an import thread): that source is not tried again for this pull. */
static void on_bad_file(void *ctx, size_t file_idx, int rc)
{
    pull *p = ctx;
    tv__fleet *f = p->f;
    pthread_mutex_lock(&f->mu);
    const char *url = file_idx < p->n_urls ? p->urls[file_idx] : NULL;
    for (size_t i = 0; url && i < p->n_excluded; i++)
        if (!strcmp(p->excluded[i], url))
            url = NULL; /* another range of the same file: said already */
    if (url) {
        char **v = realloc(p->excluded, (p->n_excluded + 1) * sizeof(*v));
        int *why = realloc(p->excluded_rc, (p->n_excluded + 1) * sizeof(*why));
        if (v)
            p->excluded = v;
        if (why)
            p->excluded_rc = why;
        if (v && why && (v[p->n_excluded] = strdup(url)))
            why[p->n_excluded++] = rc;
        tv__log(TV_LOG_WARN,
                "fleet: dropping %s as a source of model '%s' generation %" PRId64 " (%s)", url,
                p->model, p->number, tv_err_name(rc));
    }
    pthread_mutex_unlock(&f->mu);
}

/* Forgets the sources excluded because their transfers failed: from the
 * puller's side a peer that stopped answering and this node's own link
 * lost look the same, so once a shard has no source left they are tried
 * again (each failed attempt still counts against fleet.pull_attempts).
 * Sources that served bad bytes stay excluded. Returns how many were
 * forgotten. */
static size_t pull_forgive(tv__fleet *f, pull *p)
{
    size_t kept = 0, n = 0;
    pthread_mutex_lock(&f->mu);
    for (size_t i = 0; i < p->n_excluded; i++) {
        int rc = p->excluded_rc[i];
        if (rc == TV_E_HASH_MISMATCH || rc == TV_E_SOURCE_CHANGED) {
            p->excluded[kept] = p->excluded[i];
            p->excluded_rc[kept++] = rc;
        } else {
            free(p->excluded[i]);
            n++;
        }
    }
    p->n_excluded = kept;
    pthread_mutex_unlock(&f->mu);
    return n;
}

/* The URL of a shard next to a generation's http(s):// or s3:// source; NULL otherwise. */
static char *source_url(const char *source, const char *name)
{
    if (!tv__src_is_url(source))
        return NULL;
    const char *slash = strrchr(source, '/');
    char *u = NULL;
    if (asprintf(&u, "%.*s%s", (int)(slash - source + 1), source, name) < 0)
        return NULL;
    return u;
}

/* The first source of one shard that is not excluded: peers (from a
 * random one on), the object store, the generation's own origin. */
static char *pick_source(tv__fleet *f, pull *p, const char *source, json_t *shard, bool *peer)
{
    const char *sha = json_string_value(json_object_get(shard, "sha256"));
    const char *name = json_string_value(json_object_get(shard, "name"));
    json_t *peers = json_object_get(shard, "peers");
    size_t n = json_array_size(peers);
    size_t start = n ? (size_t)rand_r(&f->seed) % n : 0;
    for (size_t k = 0; k < n; k++) {
        const char *base = json_string_value(json_array_get(peers, (start + k) % n));
        char *u = NULL;
        if (!base || asprintf(&u, "%s/v1/blobs/sha256:%s", base, sha) < 0)
            continue;
        if (!pull_excluded(f, p, u)) {
            *peer = true;
            return u;
        }
        free(u);
    }
    *peer = false;
    const char *blob = json_string_value(json_object_get(shard, "blob"));
    if (blob && !pull_excluded(f, p, blob))
        return strdup(blob);
    char *u = source ? source_url(source, name) : NULL;
    if (u && !pull_excluded(f, p, u))
        return u;
    free(u);
    return NULL;
}

/* Starts one import job for p from the catalog's description. Returns 0
 * (p->job set, or p->failed with the reason when no source is left). */
static int pull_start(tv__fleet *f, pull *p, tv_error *err)
{
    char num[24];
    snprintf(num, sizeof num, "%" PRId64, p->number);
    const char *pv[] = {p->model, num, f->node};
    json_t *d = NULL;
    int rc = tv__catalog_json(f->cat, PULL_SQL, 3, pv, "reading a generation to pull", &d, err);
    if (rc)
        return rc;
    json_t *shards = json_object_get(d, "shards");
    size_t n_sh = json_array_size(shards);
    const char *source = json_string_value(json_object_get(d, "source"));
    json_t *wm = json_object_get(d, "weight_map");
    bool index = n_sh > 1;
    size_t n_files = n_sh + (index ? 1 : 0);
    tv__src_pull_file *files = calloc(n_files ? n_files : 1, sizeof(*files));
    char **urls = calloc(n_files ? n_files : 1, sizeof(*urls));
    char *index_text = NULL;
    if (!d || !json_is_object(d) || n_sh == 0) {
        rc = tv__seterr(err, TV_E_NOT_FOUND,
                        "model '%s' generation %" PRId64 " has no shards in the catalog", p->model,
                        p->number);
        goto out;
    }
    if (!files || !urls) {
        rc = tv__seterr(err, -ENOMEM, "fleet: out of memory");
        goto out;
    }
    size_t fi = 0;
    if (index) {
        json_t *doc = json_pack("{s:{}, s:o}", "metadata", "weight_map",
                                wm ? json_incref(wm) : json_object());
        index_text = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
        json_decref(doc);
        if (!index_text) {
            rc = tv__seterr(err, -ENOMEM, "fleet: out of memory");
            goto out;
        }
        files[fi].name = "model.safetensors.index.json";
        files[fi].data = index_text;
        files[fi].data_len = strlen(index_text);
        fi++;
    }
    size_t n_peer = 0;
    for (size_t i = 0; i < n_sh; i++, fi++) {
        json_t *sh = json_array_get(shards, i);
        bool peer = false;
        urls[fi] = pick_source(f, p, source, sh, &peer);
        if (!urls[fi] && pull_forgive(f, p)) {
            tv__log(TV_LOG_INFO,
                    "fleet: no source of shard '%s' of model '%s' generation %" PRId64
                    " left but ones that failed to transfer; trying them again",
                    json_string_value(json_object_get(sh, "name")), p->model, p->number);
            urls[fi] = pick_source(f, p, source, sh, &peer);
        }
        if (!urls[fi]) {
            p->failed = true;
            snprintf(
                p->error, sizeof p->error,
                "no source left for shard '%s' (sha256 %.12s...): no peer holds it, and neither the object store nor the origin served it",
                json_string_value(json_object_get(sh, "name")),
                json_string_value(json_object_get(sh, "sha256")));
            rc = 0;
            goto out;
        }
        n_peer += peer;
        files[fi].name = json_string_value(json_object_get(sh, "name"));
        files[fi].url = urls[fi];
        files[fi].bearer = peer && f->token[0] ? f->token : NULL;
        files[fi].sha256 = json_string_value(json_object_get(sh, "sha256"));
        files[fi].len = (uint64_t)json_integer_value(json_object_get(sh, "bytes"));
    }
    tv__src_pull pl = {.first = files[0].name,
                       .first_is_index = index,
                       .files = files,
                       .n_files = n_files,
                       .source = source && source[0] ? source : "fleet",
                       .on_bad_file = on_bad_file,
                       .bad_ctx = p};
    tv__job_spec spec = {.kind = TV__JOB_IMPORT,
                         .model = p->model,
                         .source = pl.source,
                         .pull = &pl,
                         .generation = p->number};
    pthread_mutex_lock(&f->mu);
    strv_free(p->urls, p->n_urls);
    p->urls = urls;
    p->n_urls = n_files;
    urls = NULL;
    pthread_mutex_unlock(&f->mu);
    int64_t id = 0;
    if ((rc = tv__jobs_submit(f->jobs, &spec, &id, err)))
        goto out;
    p->job = id;
    tv__log(TV_LOG_INFO,
            "fleet: pulling model '%s' generation %" PRId64
            " (%zu shards, %zu from peers): job %" PRId64,
            p->model, p->number, n_sh, n_peer, id);
    report_gen(f, p->model, p->number, "pulling", 0,
               (uint64_t)json_integer_value(json_object_get(d, "total_bytes")), 0, NULL);
out:
    if (urls)
        strv_free(urls, n_files);
    free(files);
    free(index_text);
    json_decref(d);
    return rc;
}

/* Follows p's job: progress to the catalog, a retry after a failure, the
 * failure reported after the last attempt. */
static void pull_poll(tv__fleet *f, pull *p)
{
    tv__reg_job j;
    tv_error err = {0};
    if (tv__reg_job_get(f->reg, p->job, &j, &err)) {
        p->job = 0;
        return;
    }
    free(j.result_json);
    if (j.state == TV__JOB_QUEUED || j.state == TV__JOB_RUNNING) {
        report_gen(f, p->model, p->number, "pulling", j.bytes_done, j.bytes_total,
                   j.rate_bytes_per_s, NULL);
        return;
    }
    p->job = 0;
    if (j.state == TV__JOB_SUCCEEDED)
        return; /* ready: the publish pass reports it */
    p->attempts++;
    snprintf(p->error, sizeof p->error, "%s: %.400s", j.error_code[0] ? j.error_code : "cancelled",
             j.error);
    tv__log(TV_LOG_WARN,
            "fleet: pull of model '%s' generation %" PRId64 " failed (attempt %u of %u): %s",
            p->model, p->number, p->attempts, f->pull_attempts, p->error);
    if (p->attempts >= f->pull_attempts) {
        p->failed = true;
        report_gen(f, p->model, p->number, "failed", j.bytes_done, j.bytes_total, 0, p->error);
    }
}

/* The local state of one alias placed here: pull what is missing, switch
 * when the placement is ready (or a quorum after the timeout). */
static void rollout_alias(tv__fleet *f, json_t *a, bool *busy)
{
    const char *model = json_string_value(json_object_get(a, "model"));
    const char *alias = json_string_value(json_object_get(a, "alias"));
    int64_t gen = json_integer_value(json_object_get(a, "generation"));
    int64_t version = json_integer_value(json_object_get(a, "version"));
    json_t *nodes = json_object_get(a, "nodes"), *me = NULL, *n;
    size_t i, n_ready = 0, n_nodes = json_array_size(nodes);
    if (!model || !alias || gen <= 0)
        return;
    json_array_foreach(nodes, i, n)
    {
        const char *name = json_string_value(json_object_get(n, "node"));
        if (name && !strcmp(name, f->node))
            me = n;
        n_ready += !strcmp(json_string_value(json_object_get(n, "state")) ?: "", "ready");
    }
    if (!me)
        return; /* not placed here */
    tv_error err = {0};
    tv__reg_generation g;
    bool have =
        tv__reg_generation_get(f->reg, model, gen, &g, &err) == 0 && g.state == TV__GEN_READY;
    if (!have) {
        if (!f->jobs)
            return;
        pull *p = pull_find(f, model, gen, true);
        if (!p)
            return;
        if (p->failed && p->alias_version != version && !p->job) {
            p->failed = false; /* the alias moved again: try afresh */
            p->attempts = 0;
        }
        p->alias_version = version;
        if (p->job)
            pull_poll(f, p);
        if (!p->job && !p->failed && (!have)) {
            tv__reg_generation g2;
            if (tv__reg_generation_get(f->reg, model, gen, &g2, &err) == 0 &&
                g2.state == TV__GEN_READY)
                return; /* just finished */
            if (pull_start(f, p, &err))
                tv__log(TV_LOG_WARN, "fleet: cannot pull model '%s' generation %" PRId64 ": %s",
                        model, gen, err.msg);
            else if (p->failed) {
                tv__log(TV_LOG_WARN, "fleet: pull of model '%s' generation %" PRId64 " failed: %s",
                        model, gen, p->error);
                report_gen(f, model, gen, "failed", 0, 0, 0, p->error);
            }
        }
        *busy = true;
        return;
    }
    if (strcmp(json_string_value(json_object_get(me, "state")) ?: "", "ready"))
        return; /* ready here, not yet in the catalog: the publish pass reports it */
    int64_t cur = 0;
    bool same = tv__reg_alias_get(f->reg, model, alias, &cur, &err) == 0 && cur == gen;
    if (!same) {
        json_int_t quorum = json_integer_value(json_object_get(a, "quorum"));
        double age = json_number_value(json_object_get(a, "age_s"));
        double timeout = json_number_value(json_object_get(a, "timeout_s"));
        bool all = n_ready == n_nodes;
        bool enough = quorum > 0 && n_ready >= (size_t)quorum && age >= timeout;
        if (!all && !enough) {
            *busy = true;
            return;
        }
        if (!f->st && f->writer && tv__store_open_worker(f->writer, &f->st, &err)) {
            tv__log(TV_LOG_WARN, "fleet: cannot open the store to switch aliases: %s", err.msg);
            return;
        }
        if (!f->st || tv__store_alias_set(f->st, model, alias, gen, &err)) {
            tv__log(TV_LOG_WARN,
                    "fleet: cannot switch alias '%s' of model '%s' to generation %" PRId64 ": %s",
                    alias, model, gen, err.msg);
            return;
        }
        tv__log(TV_LOG_INFO,
                "fleet: alias '%s' of model '%s' now at generation %" PRId64
                " (%zu of %zu nodes ready%s)",
                alias, model, gen, n_ready, n_nodes, all ? "" : ", quorum after the timeout");
    }
    json_t *serving = json_object_get(me, "serving");
    if (!json_is_integer(serving) || json_integer_value(serving) != gen)
        report_alias(f, model, alias, gen, version);
}

/* Reads the fleet document, keeps it for GET /v1/fleet and acts on the
 * aliases. Returns whether a rollout is under way here (poll faster). */
static bool rollout_round(tv__fleet *f)
{
    json_t *doc = NULL;
    tv_error err = {0};
    if (!f->reg)
        return false; /* the publish pass opens it, and says why it cannot */
    if (tv__catalog_json(f->cat, FLEET_SQL, 0, NULL, "reading the fleet", &doc, &err)) {
        tv__log(f->quiet ? TV_LOG_DEBUG : TV_LOG_WARN, "fleet: %s", err.msg);
        set_connected(f, false, err.msg);
        return false;
    }
    bool busy = false;
    json_t *a;
    size_t i;
    json_array_foreach(json_object_get(doc, "aliases"), i, a) rollout_alias(f, a, &busy);
    pthread_mutex_lock(&f->mu);
    json_decref(f->doc);
    f->doc = doc;
    f->connected = true;
    f->last_error[0] = '\0';
    pthread_mutex_unlock(&f->mu);
    return busy;
}

json_t *tv__fleet_status(tv__fleet *f)
{
    if (!f)
        return json_pack("{s:s, s:n, s:n, s:[], s:[], s:[]}", "mode", "standalone", "node",
                         "catalog", "nodes", "aliases", "generations");
    pthread_mutex_lock(&f->mu);
    json_t *out = json_pack("{s:s, s:s, s:s, s:{s:s, s:b, s:s?}}", "mode", "fleet", "node", f->node,
                            "url", f->url, "catalog", "where", f->where, "connected", f->connected,
                            "error", f->last_error[0] ? f->last_error : NULL);
    static const char *const keys[] = {"nodes", "aliases", "generations"};
    for (size_t i = 0; out && i < 3; i++) {
        json_t *v = f->doc ? json_object_get(f->doc, keys[i]) : NULL;
        json_object_set_new(out, keys[i], v ? json_deep_copy(v) : json_array());
    }
    pthread_mutex_unlock(&f->mu);
    return out;
}

/* Copies the shards of a generation imported from a local path to the
 * object store (content-addressed: PREFIX + "sha256/" + HEX), reading them
 * from this node's own blob route, and records them in the catalog's blobs
 * table. A blob already recorded, or already in the bucket with its length,
 * is not copied again. Failures are logged; the next pass retries. */
/* One generation's shards to copy to the object store. */
typedef struct upload {
    char model[TV__REG_NAME_MAX + 1];
    int64_t number;
    size_t n_shards;
    struct up_shard {
        char name[TV__REG_NAME_MAX + 1];
        char sha256[65];
        uint64_t file_len;
    } * shards;
    double next_try; /* mono_s() */
    struct upload *next;
} upload;

static void upload_free(upload *u)
{
    if (u)
        free(u->shards);
    free(u);
}

static int upload_generation(tv__fleet *f, tv__catalog *cat, const upload *u)
{
    int rc = 0;
    for (size_t i = 0; i < u->n_shards && !rc && !stopping(f); i++) {
        const struct up_shard *sh = &u->shards[i];
        const char *pv[] = {sh->sha256};
        json_t *have = NULL;
        tv_error err = {0};
        if ((rc = tv__catalog_json(cat, "SELECT to_json(url) FROM blobs WHERE sha256 = $1", 1, pv,
                                   "reading the blobs", &have, &err))) {
            tv__log(TV_LOG_WARN, "fleet: %s", err.msg);
            break;
        }
        bool recorded = json_is_string(have);
        json_decref(have);
        if (recorded)
            continue;
        char *dst = NULL, *src = NULL;
        if (asprintf(&dst, "%ssha256/%s", f->object_store, sh->sha256) < 0 ||
            asprintf(&src, "%s/v1/blobs/sha256:%s", f->url, sh->sha256) < 0) {
            free(dst);
            return -ENOMEM;
        }
        tv__s3put_opts so = {.proxy = f->proxy, .cancel = {.cancelled = stop_asked, .ctx = f}};
        so.s3 = f->s3;
        bool exists = false;
        uint64_t len = 0;
        double t0 = mono_s();
        rc = tv__s3_head(&so, dst, &exists, &len, &err);
        if (rc == 0 && !(exists && len == sh->file_len))
            rc = tv__s3_copy_from_url(&so, src, f->token[0] ? f->token : NULL, sh->file_len,
                                      sh->sha256, dst, &err);
        if (rc == 0) {
            char bytes[24];
            snprintf(bytes, sizeof bytes, "%" PRIu64, sh->file_len);
            const char *iv[] = {sh->sha256, bytes, dst, f->node};
            rc = tv__catalog_exec(cat,
                                  "INSERT INTO blobs (sha256, bytes, url, uploaded_by) VALUES "
                                  "($1, $2, $3, $4) ON CONFLICT (sha256) DO NOTHING",
                                  4, iv, "recording a blob", &err);
        }
        if (rc)
            tv__log(
                TV_LOG_WARN,
                "fleet: uploading shard '%s' of model '%s' to %s failed (retrying every %u s): %s",
                sh->name, u->model, dst, f->retry_s, err.msg);
        else
            tv__log(TV_LOG_INFO,
                    "fleet: shard '%s' (%" PRIu64 " bytes) in the object store as %s%s (%.1f s)",
                    sh->name, sh->file_len, dst, exists ? ", already there" : "", mono_s() - t0);
        free(dst);
        free(src);
    }
    return rc;
}

/* Queues m's shards for the uploader (once per generation). Returns 0 or -ENOMEM. */
static int upload_queue(tv__fleet *f, const tv__reg_manifest *m)
{
    upload *u = calloc(1, sizeof(*u));
    if (!u || !(u->shards = calloc(m->n_shards ? m->n_shards : 1, sizeof(*u->shards)))) {
        free(u);
        return -ENOMEM;
    }
    snprintf(u->model, sizeof u->model, "%s", m->generation.model);
    u->number = m->generation.number;
    u->n_shards = m->n_shards;
    for (size_t i = 0; i < m->n_shards; i++) {
        snprintf(u->shards[i].name, sizeof u->shards[i].name, "%s", m->shards[i].name);
        snprintf(u->shards[i].sha256, sizeof u->shards[i].sha256, "%s", m->shards[i].sha256);
        u->shards[i].file_len = m->shards[i].file_len;
    }
    pthread_mutex_lock(&f->mu);
    upload **tail = &f->uploads;
    bool dup = false;
    for (; *tail; tail = &(*tail)->next)
        dup |= (*tail)->number == u->number && strcmp((*tail)->model, u->model) == 0;
    if (!dup)
        *tail = u;
    pthread_cond_broadcast(&f->cond);
    pthread_mutex_unlock(&f->mu);
    if (dup)
        upload_free(u);
    return 0;
}

/* The uploader: copies queued generations to the object store with a
 * catalog connection of its own, so that a long copy never holds up the
 * fleet thread's rounds (switches, pulls, reports); a failed one is tried
 * again every retry_s seconds. What is queued when the daemon stops is
 * queued again by the next start's publish pass (recorded blobs are
 * skipped). */
static void *uploader_main(void *p)
{
    tv__fleet *f = p;
    tv__catalog *cat = NULL;
    pthread_mutex_lock(&f->mu);
    while (!f->stopping) {
        upload *u = f->uploads;
        double now = mono_s();
        if (!u || u->next_try > now) {
            struct timespec until;
            clock_gettime(CLOCK_MONOTONIC, &until);
            until.tv_sec += 1;
            pthread_cond_timedwait(&f->cond, &f->mu, &until);
            continue;
        }
        f->uploads = u->next;
        u->next = NULL;
        pthread_mutex_unlock(&f->mu);
        tv_error err = {0};
        int rc = cat ? 0 : tv__catalog_open(f->conninfo, &cat, &err);
        if (rc)
            tv__log(TV_LOG_DEBUG, "fleet: uploader: %s", err.msg);
        else
            rc = upload_generation(f, cat, u);
        pthread_mutex_lock(&f->mu);
        if (rc) {
            upload **tail = &f->uploads;
            while (*tail)
                tail = &(*tail)->next;
            u->next_try = mono_s() + f->retry_s;
            *tail = u;
        } else {
            upload_free(u);
        }
    }
    pthread_mutex_unlock(&f->mu);
    tv__catalog_close(cat);
    return NULL;
}

/* Publishes every ready generation not yet published by this process.
 * Returns 0, or the first error that is worth a retry. */
static int publish_pending(tv__fleet *f)
{
    tv_error err = {0};
    int rc, retry = 0;
    if (!f->reg && (rc = tv__reg_open_ex(f->reg_path, 0, &f->reg, &err))) {
        tv__log(TV_LOG_WARN, "fleet: cannot open the local registry: %s", err.msg);
        return rc;
    }
    tv__reg_model *models = NULL;
    size_t n_models = 0;
    if ((rc = tv__reg_models_list(f->reg, &models, &n_models, &err))) {
        tv__log(TV_LOG_WARN, "fleet: cannot list local models: %s", err.msg);
        return rc;
    }
    for (size_t i = 0; i < n_models && !retry && !stopping(f); i++) {
        tv__reg_generation *gens = NULL;
        size_t n_gens = 0;
        if ((rc = tv__reg_generations_list(f->reg, models[i].name, &gens, &n_gens, &err))) {
            if (rc != TV_E_NOT_FOUND) /* a model removed meanwhile */
                retry = rc;
            continue;
        }
        for (size_t k = 0; k < n_gens && !retry && !stopping(f); k++) {
            const tv__reg_generation *g = &gens[k];
            if (g->state != TV__GEN_READY || is_done(f, g->model, g->number))
                continue;
            tv__reg_manifest *m = NULL;
            int published = 0;
            rc = tv__reg_tensors_list(f->reg, g->id, &m, &err);
            if (rc == 0)
                rc = tv__catalog_publish_generation(f->cat, f->node, m, &published, &err);
            /* Ready, a source for peers, once it is in the catalog; the
             * object store's copy follows (a failed upload is retried, and
             * reports ready again). */
            if (rc == 0)
                report_gen(f, g->model, g->number, "ready", g->total_bytes, g->total_bytes, 0,
                           NULL);
            /* The object store gets what only this node could serve: a
             * generation imported from a local path (not a pull). */
            if (rc == 0 && f->object_store[0] && !tv__src_is_url(g->source) &&
                !pull_find(f, g->model, g->number, false) && upload_queue(f, m))
                rc = -EAGAIN;
            tv__reg_manifest_free(m);
            if (rc == -EAGAIN) {
                retry = rc;
                continue;
            }
            if (rc == 0) {
                mark_done(f, g->model, g->number);
                if (published)
                    tv__log(TV_LOG_INFO,
                            "fleet: published model '%s' generation %" PRId64 " to the catalog",
                            g->model, g->number);
            } else if (rc == TV_E_CONFLICT) {
                mark_done(f, g->model, g->number);
                tv__log(TV_LOG_ERROR, "fleet: not published: %s", err.msg);
            } else if (rc == TV_E_STATE || rc == TV_E_NOT_FOUND) {
                continue; /* retired or gone meanwhile: the next scan decides */
            } else {
                tv__log(f->quiet ? TV_LOG_DEBUG : TV_LOG_WARN,
                        "fleet: publishing model '%s' generation %" PRId64
                        " failed (retrying every %u s): %s",
                        g->model, g->number, f->retry_s, err.msg);
                f->quiet = true;
                retry = rc;
            }
        }
        free(gens);
    }
    free(models);
    return retry;
}

/* Waits until a kick, stop, or seconds pass. Returns true when stopping;
 * *kicked tells whether a kick came. */
static bool wait_for(tv__fleet *f, unsigned seconds, bool *kicked)
{
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += seconds;
    pthread_mutex_lock(&f->mu);
    while (!f->stopping && !f->kicked)
        if (pthread_cond_timedwait(&f->cond, &f->mu, &until) == ETIMEDOUT)
            break;
    bool stop = f->stopping;
    *kicked = f->kicked;
    f->kicked = false;
    pthread_mutex_unlock(&f->mu);
    return stop;
}

/* Waits up to seconds for a kick, a stop or a catalog notification (the
 * connection's socket, in slices so kicks are seen). Returns true when
 * stopping; *woken: something happened before the time ran out. */
static bool wait_listen(tv__fleet *f, double seconds, bool *woken)
{
    double until = mono_s() + seconds;
    *woken = false;
    for (;;) {
        pthread_mutex_lock(&f->mu);
        bool stop = f->stopping, k = f->kicked;
        f->kicked = false;
        pthread_mutex_unlock(&f->mu);
        if (stop)
            return true;
        if (k) {
            *woken = true;
            return false;
        }
        double left = until - mono_s();
        if (left <= 0)
            return false;
        char payload[512];
        tv_error err = {0};
        int r = tv__catalog_wait(f->cat, left < 0.25 ? (int)(left * 1000) + 1 : 250, payload,
                                 sizeof payload, &err);
        if (r == 1) {
            tv__log(TV_LOG_DEBUG, "fleet: notified: %s", payload);
            /* several notifications in a burst: one round for all */
            while (tv__catalog_wait(f->cat, 0, payload, sizeof payload, &err) == 1)
                ;
            *woken = true;
            return false;
        }
        if (r < 0) {
            /* dropped: the heartbeat notices; sleep the slice instead */
            bool kicked;
            return wait_for(f, (unsigned)(left < 1 ? 1 : left), &kicked) ||
                   ((*woken = kicked), false);
        }
    }
}

static void *fleet_main(void *p)
{
    tv__fleet *f = p;
    bool warned = false, pending = true, kicked = false, busy = false;
    double last_beat = 0;
    for (;;) {
        tv_error err = {0};
        if (!f->cat) {
            if (tv__catalog_open(f->conninfo, &f->cat, &err)) {
                tv__log(
                    warned ? TV_LOG_DEBUG : TV_LOG_WARN,
                    "fleet: catalog not reachable (%s); serving standalone, retrying every %u s",
                    err.msg, f->retry_s);
                set_connected(f, false, err.msg);
                warned = true;
                if (wait_for(f, f->retry_s, &kicked))
                    break;
                continue;
            }
            int version = 0;
            tv__catalog_version(f->cat, &version, NULL);
            if (tv__catalog_listen(f->cat, &err))
                tv__log(TV_LOG_WARN, "fleet: %s", err.msg);
            tv__log(TV_LOG_INFO, "fleet: catalog %s (schema version %d), node '%s'", f->where,
                    version, f->node);
            warned = false;
            pending = true;
            last_beat = 0;
        }
        if (mono_s() - last_beat >= f->heartbeat_s) {
            if (tv__catalog_node_seen(f->cat, f->node, f->url, &err)) {
                tv__log(f->quiet ? TV_LOG_DEBUG : TV_LOG_WARN, "fleet: %s", err.msg);
                set_connected(f, false, err.msg);
                f->quiet = true;
                pending = true; /* publish everything again once it is back */
            } else {
                if (f->quiet)
                    tv__log(TV_LOG_INFO, "fleet: catalog %s reachable again", f->where);
                f->quiet = false;
                last_beat = mono_s();
            }
        }
        if ((pending || kicked) && !stopping(f))
            pending = publish_pending(f) != 0;
        if (!f->quiet && !stopping(f))
            busy = rollout_round(f);
        /* A rollout under way is followed every second (progress, the
         * moment to switch); otherwise notifications and kicks wake us. */
        double wait = busy ? 1 : pending ? f->retry_s : f->heartbeat_s;
        if (f->quiet) {
            if (wait_for(f, f->retry_s, &kicked))
                break;
        } else if (wait_listen(f, wait, &kicked)) {
            break;
        }
    }
    return NULL;
}

void tv__fleet_kick(tv__fleet *f)
{
    if (!f)
        return;
    pthread_mutex_lock(&f->mu);
    f->kicked = true;
    pthread_cond_broadcast(&f->cond); /* the uploader waits on it too */
    pthread_mutex_unlock(&f->mu);
}

static void fleet_free(tv__fleet *f)
{
    while (f->uploads) {
        upload *u = f->uploads;
        f->uploads = u->next;
        upload_free(u);
    }
    tv__catalog_close(f->cat);
    tv__reg_close(f->reg);
    tv__store_close(f->st);
    free(f->done);
    for (size_t i = 0; i < f->n_pulls; i++)
        pull_free(f->pulls[i]);
    free(f->pulls);
    json_decref(f->doc);
    free(f->token);
    free(f->object_store);
    free(f->proxy);
    for (size_t i = 0; i < 5; i++)
        free(f->s3_strings[i]);
    free(f->conninfo);
    free(f->node);
    free(f->url);
    free(f->reg_path);
    pthread_cond_destroy(&f->cond);
    pthread_mutex_destroy(&f->mu);
    free(f);
}

int tv__fleet_start(const tv__fleet_opts *o, tv__fleet **out, tv_error *err)
{
    if (!o || !out || !o->conninfo || !o->conninfo[0] || !o->node || !o->node[0] || !o->reg_path)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__fleet_start: missing option");
    *out = NULL;
    tv__fleet *f = calloc(1, sizeof(*f));
    if (!f)
        return tv__seterr(err, -ENOMEM, "fleet: out of memory");
    pthread_mutex_init(&f->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&f->cond, &ca);
    pthread_condattr_destroy(&ca);
    f->conninfo = strdup(o->conninfo);
    /* Nodes that start together must not all try the same peer first. */
    f->seed = (unsigned)time(NULL) ^ ((unsigned)getpid() << 16);
    for (const char *c = o->node; *c; c++)
        f->seed = f->seed * 31u + (unsigned char)*c;
    f->node = strdup(o->node);
    f->url = strdup(o->url ? o->url : "");
    f->reg_path = strdup(o->reg_path);
    f->token = strdup(o->token ? o->token : "");
    f->object_store = strdup(o->object_store ? o->object_store : "");
    f->proxy = strdup(o->proxy ? o->proxy : "");
    f->jobs = o->jobs;
    f->writer = o->store;
    f->pull_attempts = o->pull_attempts ? o->pull_attempts : 3;
    if (o->s3) {
        const char *in[5] = {o->s3->endpoint, o->s3->region, o->s3->access_key_id,
                             o->s3->secret_access_key, o->s3->session_token};
        for (size_t i = 0; i < 5; i++)
            f->s3_strings[i] = strdup(in[i] ? in[i] : "");
        f->s3 = (tv__s3_opts){f->s3_strings[0], f->s3_strings[1], f->s3_strings[2],
                              f->s3_strings[3], f->s3_strings[4]};
    }
    f->retry_s = o->retry_s ? o->retry_s : 3;
    f->heartbeat_s = o->heartbeat_s ? o->heartbeat_s : 10;
    tv__catalog_redact(o->conninfo, f->where, sizeof f->where);
    if (!f->conninfo || !f->node || !f->url || !f->reg_path || !f->token || !f->object_store ||
        !f->proxy) {
        fleet_free(f);
        return tv__seterr(err, -ENOMEM, "fleet: out of memory");
    }
    int e = f->object_store[0] ? pthread_create(&f->up_thread, NULL, uploader_main, f) : 0;
    if (e) {
        fleet_free(f);
        return tv__seterr(err, -e, "fleet: cannot start its uploader thread: %s", strerror(e));
    }
    f->up_started = f->object_store[0] != '\0';
    if ((e = pthread_create(&f->thread, NULL, fleet_main, f))) {
        pthread_mutex_lock(&f->mu);
        f->stopping = true;
        pthread_cond_broadcast(&f->cond);
        pthread_mutex_unlock(&f->mu);
        if (f->up_started)
            pthread_join(f->up_thread, NULL);
        fleet_free(f);
        return tv__seterr(err, -e, "fleet: cannot start its thread: %s", strerror(e));
    }
    tv__log(TV_LOG_INFO, "fleet: node '%s', catalog %s (connecting in the background)", f->node,
            f->where);
    *out = f;
    return 0;
}

void tv__fleet_stop(tv__fleet *f)
{
    if (!f)
        return;
    pthread_mutex_lock(&f->mu);
    f->stopping = true;
    pthread_cond_broadcast(&f->cond);
    pthread_mutex_unlock(&f->mu);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += FLEET_STOP_WAIT_S;
    bool fleet_gone = pthread_timedjoin_np(f->thread, NULL, &until) != ETIMEDOUT;
    bool up_gone = !f->up_started || pthread_timedjoin_np(f->up_thread, NULL, &until) != ETIMEDOUT;
    if (!fleet_gone || !up_gone) {
        /* Blocked in libpq or an upload: the thread still uses f, left to the exit. */
        tv__log(
            TV_LOG_WARN,
            "fleet: catalog %s or the object store did not answer within %d s; stopping without waiting for it",
            f->where, FLEET_STOP_WAIT_S);
        if (!fleet_gone)
            pthread_detach(f->thread);
        if (!up_gone)
            pthread_detach(f->up_thread);
        return;
    }
    fleet_free(f);
}
