/* Pulling a generation onto this node for an alias placed here: its
 * shards' sources from the catalog (peers that are up and hold the blob,
 * from a random one on; the object store's copy; the generation's own
 * origin), one import job of the daemon's pool reading them (a fleet pull,
 * import/source.h), its progress reported, and retries.
 * Invariants: a source that served bad bytes (a hash mismatch, a changed
 * source) is never tried again for this pull; one whose transfer failed is
 * tried again only once a shard has no other source left (a peer that
 * stopped answering and this node's own link lost look the same); after
 * fleet.pull_attempts failed jobs the pull is failed and reported, until
 * the alias moves again. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fleet/fleet_internal.h"
#include "import/source.h"
#include "util/internal.h"

/* What a pull needs: the shards with their sources (peers that are up and
 * hold the blob, by name and URL; the object store's copy), the sidecar
 * files with the peers that hold the generation ready (their files
 * routes) and, for several shards, the index's weight map. $1 model, $2
 * number, $3 this node, $4 fleet.node_down_s. */
static const char PULL_SQL[] =
    "SELECT json_build_object('source', g.source, 'total_bytes', g.total_bytes, "
    "'shards', (SELECT coalesce(json_agg(json_build_object('idx', s.idx, 'name', s.name, "
    "'sha256', s.sha256, 'bytes', s.file_bytes, "
    "'peers', (SELECT coalesce(jsonb_agg(DISTINCT jsonb_build_object('name', n.name, "
    "'url', n.url)), '[]'::jsonb) FROM shards s2 "
    "JOIN node_generations ng ON ng.model = s2.model AND ng.number = s2.number "
    "AND ng.state = 'ready' JOIN nodes n ON n.name = ng.node WHERE s2.sha256 = s.sha256 "
    "AND n.name <> $3 AND n.url <> '' "
    "AND n.last_seen > now() - make_interval(secs => $4::int)), "
    "'blob', (SELECT b.url FROM blobs b WHERE b.sha256 = s.sha256)) ORDER BY s.idx), "
    "'[]'::json) FROM shards s WHERE s.model = g.model AND s.number = g.number), "
    "'files', (SELECT coalesce(json_agg(json_build_object('path', gf.path, 'len', gf.len, "
    "'sha256', gf.sha256) ORDER BY gf.path), '[]'::json) FROM generation_files gf "
    "WHERE gf.model = g.model AND gf.number = g.number), "
    "'holders', (SELECT coalesce(jsonb_agg(jsonb_build_object('name', n.name, 'url', n.url)), "
    "'[]'::jsonb) FROM node_generations ng JOIN nodes n ON n.name = ng.node "
    "WHERE ng.model = g.model AND ng.number = g.number AND ng.state = 'ready' "
    "AND n.name <> $3 AND n.url <> '' AND n.last_seen > now() - make_interval(secs => $4::int)), "
    "'weight_map', CASE WHEN g.n_shards > 1 THEN (SELECT json_object_agg(t.name, s.name) "
    "FROM tensors t JOIN shards s ON s.model = t.model AND s.number = t.number "
    "AND s.idx = t.shard WHERE t.model = g.model AND t.number = g.number) END) "
    "FROM generations g WHERE g.model = $1 AND g.number = $2";

pull *tv__fleet_pull_find(tv__fleet *f, const char *model, int64_t number, bool create)
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

void tv__fleet_pull_free(pull *p)
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
 * random one on), the object store, the generation's own origin. *from
 * receives what to call it in the generation's source (a peer's node name,
 * "object-store", the origin's URL). */
static char *pick_source(tv__fleet *f, pull *p, const char *source, json_t *shard, bool *peer,
                         const char **from)
{
    const char *sha = json_string_value(json_object_get(shard, "sha256"));
    const char *name = json_string_value(json_object_get(shard, "name"));
    json_t *peers = json_object_get(shard, "peers");
    size_t n = json_array_size(peers);
    size_t start = n ? (size_t)rand_r(&f->seed) % n : 0;
    for (size_t k = 0; k < n; k++) {
        json_t *pe = json_array_get(peers, (start + k) % n);
        const char *base = json_string_value(json_object_get(pe, "url"));
        char *u = NULL;
        if (!base || asprintf(&u, "%s/v1/blobs/sha256:%s", base, sha) < 0)
            continue;
        if (!pull_excluded(f, p, u)) {
            *peer = true;
            *from = json_string_value(json_object_get(pe, "name"));
            return u;
        }
        free(u);
    }
    *peer = false;
    const char *blob = json_string_value(json_object_get(shard, "blob"));
    if (blob && !pull_excluded(f, p, blob)) {
        *from = "object-store";
        return strdup(blob);
    }
    char *u = source ? source_url(source, name) : NULL;
    if (u && !pull_excluded(f, p, u)) {
        *from = source;
        return u;
    }
    free(u);
    return NULL;
}

/* Appends s to b percent-encoded: every byte but [A-Za-z0-9._~-] (and '/'
 * when keep_slash) as %XX. false: out of room. */
static bool url_escape(char *b, size_t cap, const char *s, bool keep_slash)
{
    size_t l = strlen(b);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        bool plain = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
                     (*p >= '0' && *p <= '9') || strchr("._~-", *p) || (keep_slash && *p == '/');
        if (l + 4 > cap)
            return false;
        l += (size_t)snprintf(b + l, cap - l, plain ? "%c" : "%%%02X", *p);
    }
    return true;
}

/* Path components a peer's files route takes as they are: the router's 12
 * segments less /v1/models/{name}/generations/{gen}/files. A pull's URL
 * may not hold a percent-encoded '/' (httpc/url.h), so a deeper file, or
 * any file of a model whose name holds a '/', cannot be asked for. */
#define FILES_ROUTE_MAX_PARTS 6

static bool file_addressable(const pull *p, const char *path)
{
    size_t parts = 1;
    for (const char *c = path; *c; c++)
        parts += *c == '/';
    return !strchr(p->model, '/') && parts <= FILES_ROUTE_MAX_PARTS;
}

/* The URL of sidecar file path of model generation number on a peer that
 * holds the generation ready, not excluded (from a random one on); *from
 * its node name. NULL: none. */
static char *pick_file_source(tv__fleet *f, pull *p, json_t *holders, const char *path,
                              const char **from)
{
    size_t n = json_array_size(holders);
    size_t start = n ? (size_t)rand_r(&f->seed) % n : 0;
    for (size_t k = 0; k < n; k++) {
        json_t *h = json_array_get(holders, (start + k) % n);
        const char *base = json_string_value(json_object_get(h, "url"));
        char u[TV__URL_MAX + 1];
        if (!base || snprintf(u, sizeof u, "%s/v1/models/", base) >= (int)sizeof u ||
            !url_escape(u, sizeof u, p->model, false) ||
            snprintf(u + strlen(u), sizeof u - strlen(u), "/generations/%" PRId64 "/files/",
                     p->number) >= (int)(sizeof u - strlen(u)) ||
            !url_escape(u, sizeof u, path, true) || pull_excluded(f, p, u))
            continue;
        *from = json_string_value(json_object_get(h, "name"));
        return strdup(u);
    }
    return NULL;
}

/* Appends what to a ", "-separated list in buf unless it is there. */
static void list_add(char *buf, size_t cap, const char *what)
{
    if (!what || !what[0])
        return;
    size_t wl = strlen(what);
    for (const char *h = strstr(buf, what); h; h = strstr(h + 1, what))
        if ((h == buf || (h >= buf + 2 && h[-2] == ',')) && (h[wl] == '\0' || h[wl] == ','))
            return;
    size_t l = strlen(buf);
    snprintf(buf + l, cap - l, "%s%s", l ? ", " : "", what);
}

/* Starts one import job for p from the catalog's description. Returns 0
 * (p->job set, or p->failed with the reason when no source is left). */
int tv__fleet_pull_start(tv__fleet *f, pull *p, tv_error *err)
{
    char num[24];
    snprintf(num, sizeof num, "%" PRId64, p->number);
    const char *pv[] = {p->model, num, f->node, f->node_down_param};
    json_t *d = NULL;
    int rc = tv__catalog_json(f->cat, PULL_SQL, 4, pv, "reading a generation to pull", &d, err);
    if (rc)
        return rc;
    json_t *shards = json_object_get(d, "shards");
    size_t n_sh = json_array_size(shards);
    const char *source = json_string_value(json_object_get(d, "source"));
    json_t *wm = json_object_get(d, "weight_map");
    json_t *side = json_object_get(d, "files"), *holders = json_object_get(d, "holders");
    bool index = n_sh > 1;
    /* The sidecar files come from the files route of a peer holding the
     * generation: with none up, or a file no URL can name, the pull goes
     * on without them (said). */
    json_t *side_ok = json_array();
    size_t n_side = 0;
    for (size_t i = 0; json_array_size(holders) && side_ok && i < json_array_size(side); i++) {
        json_t *sf = json_array_get(side, i);
        const char *path = json_string_value(json_object_get(sf, "path"));
        if (path && file_addressable(p, path))
            n_side += !json_array_append(side_ok, sf);
        else
            tv__log(
                TV_LOG_WARN,
                "fleet: model '%s' generation %" PRId64
                ": sidecar file '%s' is not pulled (more than %d path components, or a model name with '/': a peer's files route cannot be asked for it)",
                p->model, p->number, path ? path : "?", FILES_ROUTE_MAX_PARTS);
    }
    if (json_array_size(side) && !json_array_size(holders))
        tv__log(TV_LOG_WARN,
                "fleet: model '%s' generation %" PRId64
                ": no peer holding it is up, so its %zu sidecar files are not pulled",
                p->model, p->number, json_array_size(side));
    size_t n_files = n_sh + (index ? 1 : 0) + n_side;
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
    char used[512] = ""; /* where the shards come from: peers' names, object-store, the origin */
    for (size_t i = 0; i < n_sh; i++, fi++) {
        json_t *sh = json_array_get(shards, i);
        bool peer = false;
        const char *from = NULL;
        urls[fi] = pick_source(f, p, source, sh, &peer, &from);
        if (!urls[fi] && pull_forgive(f, p)) {
            tv__log(TV_LOG_INFO,
                    "fleet: no source of shard '%s' of model '%s' generation %" PRId64
                    " left but ones that failed to transfer; trying them again",
                    json_string_value(json_object_get(sh, "name")), p->model, p->number);
            urls[fi] = pick_source(f, p, source, sh, &peer, &from);
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
        list_add(used, sizeof used, from);
        files[fi].name = json_string_value(json_object_get(sh, "name"));
        files[fi].url = urls[fi];
        files[fi].bearer = peer && f->token[0] ? f->token : NULL;
        files[fi].sha256 = json_string_value(json_object_get(sh, "sha256"));
        files[fi].len = (uint64_t)json_integer_value(json_object_get(sh, "bytes"));
    }
    for (size_t i = 0; i < n_side; i++, fi++) {
        json_t *sf = json_array_get(side_ok, i);
        const char *path = json_string_value(json_object_get(sf, "path")), *from = NULL;
        if (path && !(urls[fi] = pick_file_source(f, p, holders, path, &from)) &&
            pull_forgive(f, p))
            urls[fi] = pick_file_source(f, p, holders, path, &from);
        if (!urls[fi]) {
            p->failed = true;
            snprintf(
                p->error, sizeof p->error,
                "no source left for sidecar file '%s': every peer holding the generation failed to serve it",
                path ? path : "?");
            rc = 0;
            goto out;
        }
        list_add(used, sizeof used, from);
        files[fi].name = path;
        files[fi].url = urls[fi];
        files[fi].bearer = f->token[0] ? f->token : NULL;
        files[fi].sha256 = json_string_value(json_object_get(sf, "sha256"));
        files[fi].len = (uint64_t)json_integer_value(json_object_get(sf, "len"));
        files[fi].sidecar = true;
    }
    /* The job names what it pulls (the same on every attempt: a new
     * attempt takes over what an interrupted one wrote by model and
     * source); the generation where its bytes came from. Never the
     * publisher's own source, a path on another machine. */
    char job_src[TV__REG_NAME_MAX + 48], gen_src[sizeof job_src + sizeof used + 8];
    snprintf(job_src, sizeof job_src, "fleet:%s@%" PRId64, p->model, p->number);
    snprintf(gen_src, sizeof gen_src, "%s from %s", job_src, used[0] ? used : "memory");
    tv__src_pull pl = {.first = files[0].name,
                       .first_is_index = index,
                       .files = files,
                       .n_files = n_files,
                       .source = gen_src,
                       .on_bad_file = on_bad_file,
                       .bad_ctx = p};
    tv__job_spec spec = {.kind = TV__JOB_IMPORT,
                         .model = p->model,
                         .source = job_src,
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
    p->total = (uint64_t)json_integer_value(json_object_get(d, "total_bytes"));
    p->n_rate = 0;
    tv__log(TV_LOG_INFO,
            "fleet: pulling model '%s' generation %" PRId64
            " (%zu shards, %zu from peers): job %" PRId64 ", from %s",
            p->model, p->number, n_sh, n_peer, id, used);
    tv__fleet_report_gen(f, p->model, p->number, "pulling", 0, p->total, 0, NULL);
out:
    json_decref(side_ok);
    if (urls)
        strv_free(urls, n_files);
    free(files);
    free(index_text);
    json_decref(d);
    return rc;
}

/* How far job j got, in the generation's canonical bytes (the unit of a
 * ready generation's total): the write step's share of p->total (the step
 * counts extents with their padding, and what an interrupted attempt wrote
 * and this one resumed), nothing before it, all of it after. */
static uint64_t model_bytes_done(const pull *p, const tv__reg_job *j)
{
    static const char *const after[] = {"flush", "verify", "publish"};
    if (j->state == TV__JOB_SUCCEEDED)
        return p->total;
    if (!strcmp(j->step, "write") && j->bytes_total > 0) {
        double share = (double)j->bytes_done / (double)j->bytes_total;
        return (uint64_t)((share < 1 ? share : 1) * (double)p->total);
    }
    for (size_t i = 0; i < sizeof after / sizeof after[0]; i++)
        if (!strcmp(j->step, after[i]))
            return p->total;
    return 0;
}

/* The pull's current rate: bytes over the last PULL_RATE_SAMPLES polls
 * (about a second apart), so a chunk arriving every few seconds still
 * shows as a steady rate; 0 until two polls of the write step. */
static double pull_rate(pull *p, uint64_t done)
{
    double now = tv__fleet_mono_s();
    /* Measured from the write step's first report on: it comes with what
     * an interrupted attempt wrote and the first chunks handed to the
     * pipeline at once. A new attempt starts again. */
    if (p->n_rate && (done < p->rate_done[p->n_rate - 1] || !p->rate_done[p->n_rate - 1]))
        p->n_rate = 0;
    if (p->n_rate == PULL_RATE_SAMPLES) {
        memmove(p->rate_t, p->rate_t + 1, (PULL_RATE_SAMPLES - 1) * sizeof(p->rate_t[0]));
        memmove(p->rate_done, p->rate_done + 1, (PULL_RATE_SAMPLES - 1) * sizeof(p->rate_done[0]));
        p->n_rate--;
    }
    p->rate_t[p->n_rate] = now;
    p->rate_done[p->n_rate++] = done;
    double dt = now - p->rate_t[0];
    return dt > 0.5 ? (double)(done - p->rate_done[0]) / dt : 0;
}

/* Follows p's job: progress to the catalog, a retry after a failure, the
 * failure reported after the last attempt. */
void tv__fleet_pull_poll(tv__fleet *f, pull *p)
{
    tv__reg_job j;
    tv_error err = {0};
    if (tv__reg_job_get(f->reg, p->job, &j, &err)) {
        p->job = 0;
        return;
    }
    free(j.result_json);
    uint64_t done = model_bytes_done(p, &j);
    if (j.state == TV__JOB_QUEUED || j.state == TV__JOB_RUNNING) {
        tv__fleet_report_gen(f, p->model, p->number, "pulling", done, p->total, pull_rate(p, done),
                             NULL);
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
        tv__fleet_report_gen(f, p->model, p->number, "failed", done, p->total, 0, p->error);
    }
}
