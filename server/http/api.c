/* The api's frame: open and close, the router (raw path split on '/', each
 * segment percent-decoded, so an encoded '/' never splits; the query
 * decoded the same way), authorisation, and the dispatch that turns a
 * handler's result or error into the response. The routes live in one file
 * per resource (api_models.c, api_generations.c, ...), the helpers they
 * share in api_common.c (api_internal.h says which file is which and the
 * order they call one another in).
 *
 * Invariants: every request leaves with a filled response and every pooled
 * handle it took returned; a decoded segment or query value never holds a
 * NUL (a %00 is refused), so it is a C string; authorisation runs before
 * any parameter is parsed or the registry is read for the route. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <openssl/crypto.h>
#include <time.h>

#include "fleet/mover.h"
#include "http/api_internal.h"
#include "http/history.h"
#include "registry/notes.h"
#include "util/hex.h"
#include "util/internal.h"

static int64_t mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec;
}

/* ---- responses ------------------------------------------------------------ */

/* The error document for code (status), replacing whatever the handler had
 * put in the response. */
static void reply_error(tv__api_ctx *c, int status, int code, const char *msg)
{
    tv__api_resp *r = c->resp;
    free(r->body);
    r->body = NULL;
    r->body_len = 0;
    r->stream = false;
    json_decref(r->json);
    r->json = tv__api_error_json(code, msg);
    r->status = status;
    r->content_type = "application/json";
    /* Headers a handler set for a success (ETag, ...) do not describe an
     * error; 405's Allow and 416's Content-Range do. */
    if (status != 405 && status != 416)
        r->headers[0] = '\0';
    if (status == 401)
        tv__api_header(r, "WWW-Authenticate", "Bearer");
    else if (status == 503)
        tv__api_header(r, "Retry-After", "1");
}

/* ---- open / close ----------------------------------------------------------- */

int tv__api_open(const tv__api_opts *o, tv__store *writer, tv__api **out, tv_error *err)
{
    int rc = 0;
    tv__api *api = NULL;
    if (!o || !o->store_dir || !out ||
        (o->anonymous_reads != TV__ANON_LOOPBACK && o->anonymous_reads != TV__ANON_ALWAYS &&
         o->anonymous_reads != TV__ANON_NEVER)) {
        rc = tv__seterr(
            err, TV_E_INVALID_ARG,
            "api open: NULL options, store_dir or out, or anonymous_reads not loopback, always or never");
        goto fail;
    }
    *out = NULL;
    if (!(api = calloc(1, sizeof *api))) {
        rc = tv__seterr(err, -ENOMEM, "api open: out of memory");
        goto fail;
    }
    pthread_mutex_init(&api->writer_mu, NULL);
    pthread_mutex_init(&api->pool_mu, NULL);
    pthread_mutex_init(&api->cache_mu, NULL);
    if (!(api->store_dir = strdup(o->store_dir))) {
        rc = tv__seterr(err, -ENOMEM, "api open: out of memory");
        goto fail;
    }
    api->jobs = o->jobs;
    api->fp = o->fp;
    api->watch = o->watch;
    api->watch_ctx = o->watch_ctx;
    api->anonymous_reads = o->anonymous_reads;
    api->access = o->access;
    api->max_body_bytes = o->max_body_bytes ? o->max_body_bytes : TV__API_MAX_BODY_DEFAULT;
    api->openapi_yaml = o->openapi_yaml;
    api->openapi_len = o->openapi_len;
    api->started_at = mono_s();
    if (o->import_roots) {
        api->roots = calloc(o->n_import_roots ? o->n_import_roots : 1, sizeof *api->roots);
        if (!api->roots) {
            rc = tv__seterr(err, -ENOMEM, "api open: out of memory");
            goto fail;
        }
        for (size_t i = 0; i < o->n_import_roots; i++) {
            char *r = realpath(o->import_roots[i], NULL);
            if (!r) {
                rc = tv__seterr(err, -errno, "import root '%s': %s", o->import_roots[i],
                                strerror(errno));
                goto fail;
            }
            api->roots[api->n_roots++] = r;
        }
        if ((o->fleet_token && o->fleet_token[0] && !(api->fleet_token = strdup(o->fleet_token))) ||
            (o->fleet_conninfo && o->fleet_conninfo[0] &&
             !(api->fleet_conninfo = strdup(o->fleet_conninfo))) ||
            !(api->origins = strdup(o->import_origins ? o->import_origins : ""))) {
            rc = tv__seterr(err, -ENOMEM, "api open: out of memory");
            goto fail;
        }
    }
    if (api->fleet_conninfo && (rc = tv__mover_start(api->fleet_conninfo, &api->mover, err)))
        goto fail;
    if (writer) {
        api->writer = writer;
    } else if (o->writer) {
        if ((rc = tv__store_open(o->store_dir, TV__STORE_WRITE, &api->writer, err)))
            goto fail;
        api->own_writer = true;
    } else {
        /* A read-only api still checks the store now, as a writer would. */
        tv__api_rd *probe = calloc(1, sizeof *probe);
        if (!probe) {
            rc = tv__seterr(err, -ENOMEM, "api open: out of memory");
            goto fail;
        }
        if ((rc = tv__store_open(o->store_dir, 0, &probe->st, err))) {
            free(probe);
            goto fail;
        }
        api->readers[api->n_readers++] = probe;
    }
    *out = api;
    return 0;
fail:
    tv__api_close(api);
    return rc;
}

void tv__api_close(tv__api *api)
{
    if (!api)
        return;
    tv__mover_stop(api->mover);
    tv__api_models_close(api);
    tv__api_shards_forget(api);
    for (size_t i = 0; i < api->n_readers; i++)
        tv__api_reader_free(api->readers[i]);
    if (api->own_writer)
        tv__store_close(api->writer);
    for (size_t i = 0; i < api->n_roots; i++)
        free(api->roots[i]);
    free(api->roots);
    free(api->origins);
    free(api->fleet_token);
    free(api->fleet_conninfo);
    pthread_mutex_destroy(&api->writer_mu);
    tv__api_bufs_free(api);
    pthread_mutex_destroy(&api->pool_mu);
    pthread_mutex_destroy(&api->cache_mu);
    free(api->store_dir);
    free(api);
}

/* Gives the request's reader store back to the pool. */
static void reader_release(tv__api_ctx *c)
{
    tv__api_reader_put(c->api, c->rdw);
    c->rdw = NULL;
    c->rd = NULL;
}

/* ---- percent-decoding ----------------------------------------------------- */

/* Decodes s[0, len) into a new NUL-terminated string; plus: '+' is a space
 * (query strings). TV_E_BAD_REQUEST for a malformed escape or %00. */
static int pct_decode(tv__api_ctx *c, const char *s, size_t len, bool plus, char **out,
                      size_t *out_len)
{
    char *d = malloc(len + 1);
    size_t n = 0;
    if (!d)
        return tv__seterr(&c->err, -ENOMEM, "out of memory decoding the request");
    for (size_t i = 0; i < len; i++) {
        char ch = s[i];
        if (ch == '%') {
            int hi = i + 2 < len ? tv__hex_digit(s[i + 1]) : -1;
            int lo = hi >= 0 ? tv__hex_digit(s[i + 2]) : -1;
            if (hi < 0 || lo < 0) {
                free(d);
                return tv__seterr(&c->err, TV_E_BAD_REQUEST, "malformed percent-escape in '%.*s'",
                                  (int)(len > 200 ? 200 : len), s);
            }
            ch = (char)(hi << 4 | lo);
            if (ch == '\0') {
                free(d);
                return tv__seterr(&c->err, TV_E_BAD_REQUEST, "%%00 (NUL) in '%.*s'",
                                  (int)(len > 200 ? 200 : len), s);
            }
            i += 2;
        } else if (plus && ch == '+') {
            ch = ' ';
        }
        d[n++] = ch;
    }
    d[n] = '\0';
    *out = d;
    if (out_len)
        *out_len = n;
    return 0;
}

/* ---- router ----------------------------------------------------------------- */

typedef struct route {
    const char *method;
    const char *path;
    tv__scope scope;
    tv__api_handler fn;
    const char *tmpl;
} route;

#define R(m, p, s, f)                                                                              \
    {                                                                                              \
        m, p, s, f, m " " p                                                                        \
    }
#define NONE_  TV__SCOPE_NONE
#define READ_  TV__SCOPE_READ
#define ADMIN_ TV__SCOPE_ADMIN
#define FLEET_ TV__SCOPE_FLEET /* fleet or admin, never anonymous */
static const route ROUTES[] = {
    R("GET", "/healthz", NONE_, tv__api_h_healthz),
    R("GET", "/readyz", NONE_, tv__api_h_readyz),
    R("GET", "/v1/version", READ_, tv__api_h_version),
    R("GET", "/v1/status", READ_, tv__api_h_status),
    R("GET", "/v1/metrics/history", READ_, tv__api_h_metrics_history),
    R("GET", "/v1/openapi.yaml", NONE_, tv__api_h_openapi),
    R("GET", "/v1/devices", READ_, tv__api_h_devices),
    R("GET", "/v1/devices/{id}", READ_, tv__api_h_device),
    R("GET", "/v1/devices/{id}/extents", READ_, tv__api_h_device_extents),
    R("GET", "/v1/models", READ_, tv__api_h_models),
    R("GET", "/v1/models/{name}", READ_, tv__api_h_model),
    R("DELETE", "/v1/models/{name}", ADMIN_, tv__api_h_model_delete),
    R("GET", "/v1/models/{name}/generations", READ_, tv__api_h_generations),
    R("GET", "/v1/models/{name}/generations/{gen}", READ_, tv__api_h_generation),
    R("POST", "/v1/models/{name}/generations/{gen}/activate", ADMIN_, tv__api_h_activate),
    R("POST", "/v1/models/{name}/generations/{gen}/retire", ADMIN_, tv__api_h_retire),
    R("POST", "/v1/models/{name}/rollback", ADMIN_, tv__api_h_rollback),
    R("POST", "/v1/models/{name}/deactivate", ADMIN_, tv__api_h_deactivate),
    R("GET", "/v1/models/{name}/aliases", READ_, tv__api_h_aliases),
    R("PUT", "/v1/models/{name}/aliases/{alias}", ADMIN_, tv__api_h_alias_put),
    R("DELETE", "/v1/models/{name}/aliases/{alias}", ADMIN_, tv__api_h_alias_delete),
    R("GET", "/v1/models/{name}/generations/{gen}/tensors", READ_, tv__api_h_tensors),
    R("GET", "/v1/models/{name}/generations/{gen}/tensors/{tensor}", READ_, tv__api_h_tensor),
    R("GET", "/v1/models/{name}/generations/{gen}/tensors/{tensor}/data", READ_, tv__api_h_data),
    R("POST", "/v1/imports", ADMIN_, tv__api_h_imports),
    R("POST", "/v1/verify", ADMIN_, tv__api_h_verify),
    R("POST", "/v1/gc", ADMIN_, tv__api_h_gc),
    R("GET", "/v1/jobs", READ_, tv__api_h_jobs),
    R("GET", "/v1/jobs/{id}", READ_, tv__api_h_job),
    R("POST", "/v1/jobs/{id}/cancel", ADMIN_, tv__api_h_job_cancel),
    R("GET", "/v1/sessions", READ_, tv__api_h_sessions),
    R("GET", "/v1/shards", READ_, tv__api_h_shards),
    R("GET", "/v1/tokens", ADMIN_, tv__api_h_tokens),
    R("POST", "/v1/tokens", ADMIN_, tv__api_h_token_create),
    R("DELETE", "/v1/tokens/{id}", ADMIN_, tv__api_h_token_revoke),
    R("GET", "/v1/fleet", READ_, tv__api_h_fleet),
    R("PUT", "/v1/fleet/aliases/{name}/{alias}", ADMIN_, tv__api_h_fleet_alias_put),
    R("GET", "/v1/blobs", FLEET_, tv__api_h_blobs),
    R("GET", "/v1/blobs/{digest}", FLEET_, tv__api_h_blob),
    R("PATCH", "/v1/models/{name}", ADMIN_, tv__api_h_model_patch),
    R("PATCH", "/v1/models/{name}/generations/{gen}", ADMIN_, tv__api_h_generation_patch),
    R("GET", "/v1/models/{name}/diff", READ_, tv__api_h_diff),
    R("GET", "/v1/events", READ_, tv__api_h_events),
    R("GET", "/v1/models/{name}/generations/{gen}/files", READ_, tv__api_h_files),
    R("GET", "/v1/models/{name}/generations/{gen}/files/{path...}", READ_, tv__api_h_file),
};
#undef R

#define MAX_SEGS    12
#define MODEL_ROUTE "/v1/models/{name}" /* the routes of one model begin so */

typedef struct segs {
    const char *s[MAX_SEGS];
    size_t len[MAX_SEGS];
    size_t n;
} segs;

/* Splits "/a/b/c" into its raw segments. false: not absolute or too many. */
static bool split(const char *path, segs *out)
{
    out->n = 0;
    if (!path || path[0] != '/')
        return false;
    const char *p = path + 1;
    for (;;) {
        const char *e = strchr(p, '/');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        if (out->n == MAX_SEGS)
            return false;
        out->s[out->n] = p;
        out->len[out->n++] = l;
        if (!e)
            return true;
        p = e + 1;
    }
}

/* A last parameter "{name...}" takes every segment left (one or more): a
 * file path, bound with its '/'s. */
static bool is_rest(const segs *pt, size_t i)
{
    return i + 1 == pt->n && pt->len[i] > 5 && !memcmp(pt->s[i] + pt->len[i] - 4, "...}", 4);
}

/* Whether the raw segments match pattern (literals compared raw: route
 * literals are plain ASCII, and an encoded literal is another path). */
static bool match(const char *pattern, const segs *sg)
{
    segs pt;
    if (!split(pattern, &pt) || pt.n > sg->n || (pt.n < sg->n && !is_rest(&pt, pt.n - 1)))
        return false;
    for (size_t i = pt.n; i < sg->n; i++)
        if (sg->len[i] == 0)
            return false;
    for (size_t i = 0; i < pt.n; i++) {
        if (pt.s[i][0] == '{') {
            if (sg->len[i] == 0)
                return false;
        } else if (pt.len[i] != sg->len[i] || memcmp(pt.s[i], sg->s[i], pt.len[i])) {
            return false;
        }
    }
    return true;
}

static int bind_params(tv__api_ctx *c, const char *pattern, const segs *sg)
{
    segs pt;
    split(pattern, &pt);
    for (size_t i = 0; i < pt.n; i++) {
        if (pt.s[i][0] != '{')
            continue;
        /* the rest: its raw segments with their '/'s, decoded as one */
        size_t len = is_rest(&pt, i) ? (size_t)(sg->s[sg->n - 1] + sg->len[sg->n - 1] - sg->s[i])
                                     : sg->len[i];
        int rc =
            pct_decode(c, sg->s[i], len, false, &c->param[c->n_params], &c->param_len[c->n_params]);
        if (rc)
            return rc;
        c->n_params++;
    }
    return 0;
}

/* ---- authorisation ---------------------------------------------------------- */

/* fleet_ok: the fleet token may call this route too (a generation's
 * sidecar file, which peers pull beside its blobs: fleet/pull.c). */
static int authorize(tv__api_ctx *c, tv__scope need, bool fleet_ok)
{
    const tv__api_req *q = c->req;
    if (q->trusted) {
        c->scope = TV__SCOPE_ADMIN;
        return 0;
    }
    if (need == TV__SCOPE_NONE)
        return 0;
    const char *a = q->authorization;
    if (a && *a) {
        while (*a == ' ' || *a == '\t')
            a++;
        if (strncasecmp(a, "Bearer", 6) || (a[6] != ' ' && a[6] != '\t'))
            return tv__seterr(&c->err, TV_E_UNAUTHORIZED, "Authorization is not 'Bearer <token>'");
        a += 6;
        while (*a == ' ' || *a == '\t')
            a++;
        size_t l = strlen(a);
        while (l && (a[l - 1] == ' ' || a[l - 1] == '\t'))
            l--;
        char tok[128];
        if (l == 0 || l >= sizeof tok)
            return tv__seterr(&c->err, TV_E_UNAUTHORIZED, "invalid API token");
        memcpy(tok, a, l);
        tok[l] = '\0';
        /* fleet.token: the fleet's shared peer token (config, not the
         * registry), good for the blob routes only */
        if (c->api->fleet_token && l == strlen(c->api->fleet_token) &&
            CRYPTO_memcmp(tok, c->api->fleet_token, l) == 0) {
            c->scope = TV__SCOPE_FLEET;
            if (need == TV__SCOPE_FLEET || fleet_ok)
                return 0;
            return tv__seterr(
                &c->err, TV_E_FORBIDDEN,
                "the fleet token (fleet.token) may call only the blob routes (/v1/blobs)");
        }
        tv__reg *reg;
        int rc = tv__api_reader(c, &reg);
        if (rc)
            return rc;
        tv__scope got = TV__SCOPE_NONE;
        rc = tv__reg_token_check(reg, tok, &got, &c->token, &c->err);
        if (rc)
            return rc == TV_E_NOT_FOUND
                       ? tv__seterr(&c->err, TV_E_UNAUTHORIZED, "invalid API token")
                       : rc;
        int64_t id = c->token.id;
        c->scope = got;
        c->has_token = true;
        if (need == TV__SCOPE_FLEET) {
            if (got != TV__SCOPE_FLEET && got != TV__SCOPE_ADMIN)
                return tv__seterr(&c->err, TV_E_FORBIDDEN,
                                  "token %" PRId64
                                  " has scope %s; the blob routes need a fleet or admin token",
                                  id, tv__scope_name(got) ? tv__scope_name(got) : "none");
            return 0;
        }
        if (got == TV__SCOPE_FLEET && fleet_ok)
            return 0;
        if (got == TV__SCOPE_FLEET)
            return tv__seterr(&c->err, TV_E_FORBIDDEN,
                              "token %" PRId64
                              " has scope fleet: it may call only the blob routes (/v1/blobs)",
                              id);
        if (got < need)
            return tv__seterr(&c->err, TV_E_FORBIDDEN,
                              "token %" PRId64 " has scope read; this call needs an admin token",
                              id);
        return 0;
    }
    /* No token: a local peer (the UNIX socket, or a loopback client whose
     * uid the kernel named) reads as that user; anyone else is anonymous. */
    bool local = q->peer && q->peer->local;
    if (need == TV__SCOPE_READ && (local || c->api->anonymous_reads == TV__ANON_ALWAYS)) {
        c->scope = TV__SCOPE_READ;
        return 0;
    }
    if (need == TV__SCOPE_READ && q->peer && q->peer->loopback &&
        c->api->anonymous_reads == TV__ANON_LOOPBACK)
        return tv__seterr(
            &c->err, TV_E_UNAUTHORIZED,
            "this call needs a token (Authorization: Bearer <token>): the local user of this connection could not be identified");
    return tv__seterr(
        &c->err, TV_E_UNAUTHORIZED,
        need == TV__SCOPE_ADMIN ? "this call needs an admin token (Authorization: Bearer <token>)"
        : need == TV__SCOPE_FLEET
            ? "the blob routes need a fleet or admin token (Authorization: Bearer <token>), from any address"
            : "this call needs a token (Authorization: Bearer <token>): tokenless reads are allowed to local users only (http.anonymous_reads)");
}

/* The actor the request's changes are recorded for (registry/notes.h):
 * set on this thread for the request's duration, cleared when it ends. */
static void actor_begin(const tv__api_ctx *c)
{
    char who[TV__ACTOR_MAX];
    const tv__api_req *q = c->req;
    if (q->trusted)
        snprintf(who, sizeof who, "cli");
    else if (c->has_token)
        snprintf(who, sizeof who, "%s", c->token.name);
    else if (q->peer && q->peer->local)
        snprintf(who, sizeof who, "local uid %u", (unsigned)q->peer->uid);
    else
        snprintf(who, sizeof who, "anonymous");
    tv__reg_actor_set(who);
}

/* ---- query parsing ---------------------------------------------------------- */

static int parse_query(tv__api_ctx *c)
{
    const char *q = c->req->query;
    if (!q)
        return 0;
    while (*q) {
        const char *e = strchr(q, '&');
        size_t l = e ? (size_t)(e - q) : strlen(q);
        if (l) {
            const char *eq = memchr(q, '=', l);
            size_t kl = eq ? (size_t)(eq - q) : l;
            if (c->n_query == TV__API_MAX_QUERY)
                return tv__seterr(&c->err, TV_E_BAD_REQUEST, "more than %d query parameters",
                                  TV__API_MAX_QUERY);
            size_t i = c->n_query;
            int rc = pct_decode(c, q, kl, true, &c->qk[i], NULL);
            if (rc)
                return rc;
            rc = eq ? pct_decode(c, eq + 1, l - kl - 1, true, &c->qv[i], &c->qv_len[i])
                    : pct_decode(c, "", 0, true, &c->qv[i], &c->qv_len[i]);
            if (rc) {
                free(c->qk[i]);
                c->qk[i] = NULL;
                return rc;
            }
            c->n_query++;
            for (size_t j = 0; j < i; j++)
                if (!strcmp(c->qk[j], c->qk[i]))
                    return tv__seterr(&c->err, TV_E_BAD_REQUEST, "query parameter '%s' given twice",
                                      c->qk[i]);
        }
        if (!e)
            break;
        q = e + 1;
    }
    return 0;
}

/* ---- dispatch --------------------------------------------------------------- */

int tv__api_handle(tv__api *api, const tv__api_req *req, tv__api_resp *resp)
{
    memset(resp, 0, sizeof *resp);
    resp->route = "unmatched";
    tv__api_ctx c = {.api = api, .req = req, .resp = resp};
    int rc = 0;
    segs sg;
    const route *hit = NULL;
    char allow[96] = "";
    if (!api || !req || !req->method || !split(req->path, &sg)) {
        rc = tv__seterr(&c.err, TV_E_NOT_FOUND, "no route for '%.200s'",
                        req && req->path ? req->path : "");
        goto done;
    }
    for (size_t i = 0; i < TV_ARRAY_LEN(ROUTES); i++) {
        if (!match(ROUTES[i].path, &sg))
            continue;
        /* HEAD is GET without the body (the transport drops it). */
        if (!strcmp(ROUTES[i].method, req->method) ||
            (!strcmp(req->method, "HEAD") && !strcmp(ROUTES[i].method, "GET"))) {
            hit = &ROUTES[i];
            break;
        }
        size_t al = strlen(allow);
        snprintf(allow + al, sizeof allow - al, "%s%s", al ? ", " : "", ROUTES[i].method);
    }
    if (!hit && *allow) {
        tv__api_header(resp, "Allow", "%s", allow);
        rc = tv__seterr(&c.err, TV_E_BAD_REQUEST,
                        "method %.16s is not allowed on '%.200s' (allowed: %s)", req->method,
                        req->path, allow);
        reply_error(&c, 405, rc, c.err.msg);
        goto out;
    }
    if (!hit) {
        rc = tv__seterr(&c.err, TV_E_NOT_FOUND, "no route for '%.200s'", req->path);
        goto done;
    }
    resp->route = hit->tmpl;
    if ((rc = authorize(&c, hit->scope, hit->fn == tv__api_h_file)) ||
        (rc = bind_params(&c, hit->path, &sg)) || (rc = parse_query(&c)))
        goto done;
    actor_begin(&c);
    /* Every route under a model shows its metadata or bytes: [access]
     * decides before the registry is read, so a refused peer learns nothing
     * of the model, not even whether it exists. */
    if (hit->scope == TV__SCOPE_READ && c.scope != TV__SCOPE_FLEET &&
        !strncmp(hit->path, MODEL_ROUTE, strlen(MODEL_ROUTE)) &&
        (rc = tv__api_may_read(&c, c.param[0])))
        goto done;
    rc = hit->fn(&c);
    if (!rc && resp->later && !req->async)
        tv__api_later_wait(resp);
done:
    if (rc) {
        if (!c.err.msg[0])
            tv__seterr(&c.err, rc, "%s", tv_strerror(rc));
        reply_error(&c, tv__api_http_status(rc), rc, c.err.msg);
    }
out:
    tv__reg_actor_set(NULL);
    reader_release(&c);
    for (size_t i = 0; i < c.n_params; i++)
        free(c.param[i]);
    for (size_t i = 0; i < c.n_query; i++) {
        free(c.qk[i]);
        free(c.qv[i]);
    }
    return resp->status;
}
