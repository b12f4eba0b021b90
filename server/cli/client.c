/* Mode selection, token discovery and the request/answer call of the CLI;
 * see client.h. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/client.h"
#include "util/internal.h"

double tv__cli_mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int tv__cli_seg(const char *s, char *out, size_t out_len, tv_error *err)
{
    if (tv__cli_pct_encode(s, out, out_len))
        return tv__seterr(err, TV_E_INVALID_ARG, "name '%.64s...' is too long for a request", s);
    return 0;
}

int tv__cli_query_add(char *q, size_t len, const char *key, const char *value, tv_error *err)
{
    char enc[1024];
    if (!value)
        return 0;
    if (tv__cli_seg(value, enc, sizeof enc, err))
        return TV_E_INVALID_ARG;
    size_t off = strlen(q);
    int w = snprintf(q + off, len - off, "%s%s=%s", off ? "&" : "", key, enc);
    if (w < 0 || (size_t)w >= len - off)
        return tv__seterr(err, TV_E_INVALID_ARG, "query too long at '%s'", key);
    return 0;
}

int tv__cli_request(const tv__cli_ctx *c, bool writer, const char *method, const char *path,
                    const char *query, json_t *body, json_t **doc)
{
    tv_error err = {0};
    tv__cli_client cl;
    *doc = NULL;
    int rc = tv__cli_client_open(c, writer, &cl, &err);
    if (!rc)
        rc = tv__cli_call(&cl, method, path, query, body, doc, NULL, &err);
    tv__cli_client_close(&cl);
    json_decref(body);
    if (rc) {
        json_decref(*doc);
        *doc = NULL;
        return tv__cli_failed(c, rc, &err);
    }
    return 0;
}

int tv__cli_client_open(const tv__cli_ctx *c, bool writer, tv__cli_client *cl, tv_error *err)
{
    int rc;
    memset(cl, 0, sizeof(*cl));
    cl->writer = writer;
    const char *store = tv__cli_get(&c->a, "--store");
    const char *url = tv__cli_get(&c->a, "--url");
    const char *env_url = getenv("TENSORVAULT_URL");
    if (store) {
        cl->local = true;
        cl->store = store;
        return 0;
    }
    cl->url_given = url != NULL;
    cl->store = getenv("TENSORVAULT_STORE");
    if (cl->store && !*cl->store)
        cl->store = NULL;
    /* An explicit store in the environment comes before the daemons at the
     * default places (but after an explicit daemon URL, which falls back to
     * it when nobody answers). */
    if (!url && !(env_url && *env_url) && cl->store) {
        cl->local = true;
        return 0;
    }
    if ((rc = tv__cli_find_http(url, &tv__cli_http_defaults, &cl->http, err)))
        return rc;
    if (cl->http.is_unix)
        snprintf(cl->url, sizeof cl->url, "http://localhost");
    else
        snprintf(cl->url, sizeof cl->url, "%s", cl->http.value);
    return tv__cli_find_token(tv__cli_get(&c->a, "--token-file"), &tv__cli_token_defaults,
                              &cl->token, cl->secret, sizeof cl->secret, err);
}

void tv__cli_client_close(tv__cli_client *cl)
{
    if (!cl)
        return;
    tv__api_close(cl->api);
    cl->api = NULL;
}

int tv__cli_doc_error(const json_t *doc, int status, tv_error *err)
{
    json_t *e = json_object_get(doc, "error");
    json_t *en = json_object_get(e, "errno");
    const char *msg = json_string_value(json_object_get(e, "message"));
    int code = json_is_integer(en) ? (int)json_integer_value(en) : 0;
    if (code >= 0)
        code = TV_E_INTERNAL;
    if (!e)
        return tv__seterr(err, code, "the answer has status %d and no error object", status);
    return tv__seterr(err, code, "%s", msg && *msg ? msg : tv_strerror(code));
}

/* Local imports run inline: their job row drives the bar. */
static void on_watch(void *ctx, const tv__reg_job *now)
{
    tv__cli_progress *p = ctx;
    tv__cli_progress_draw(p, now->bytes_done, now->bytes_total,
                          now->rate_bytes_per_s > 0 ? now->rate_bytes_per_s : -1, -1, now->step);
}

static int local_open(tv__cli_client *cl, tv_error *err)
{
    tv__api_opts o = {0};
    o.store_dir = cl->store;
    o.writer = cl->writer;
    o.jobs = NULL;
    o.watch = cl->progress ? on_watch : NULL;
    o.watch_ctx = cl->progress;
    o.anonymous_reads = TV__ANON_ALWAYS;
    o.max_body_bytes = 64 << 10;
    return tv__api_open(&o, NULL, &cl->api, err);
}

static int local_call(tv__cli_client *cl, const char *method, const char *path, const char *query,
                      const char *body, size_t body_len, json_t **doc, int *status, tv_error *err)
{
    int rc;
    if (!cl->api && (rc = local_open(cl, err)))
        return rc;
    tv__api_req rq = {0};
    tv__api_resp rs;
    memset(&rs, 0, sizeof(rs));
    rq.method = method;
    rq.path = path;
    rq.query = query;
    rq.body = body;
    rq.body_len = body_len;
    rq.content_type = body ? "application/json" : NULL;
    rq.trusted = true;
    tv__api_handle(cl->api, &rq, &rs);
    *status = rs.status;
    if (rs.json) {
        *doc = json_incref(rs.json);
    } else if (rs.body) {
        json_error_t je;
        *doc = json_loadb(rs.body, rs.body_len, 0, &je);
    }
    tv__api_resp_free(&rs);
    return 0;
}

static int remote_call(tv__cli_client *cl, const char *method, const char *path, const char *query,
                       const char *body, size_t body_len, json_t **doc, int *status, tv_error *err)
{
    tv__cli_http_req rq = {0};
    tv__cli_http_resp rs;
    rq.base_url = cl->url;
    rq.unix_path = cl->http.is_unix ? cl->http.value : NULL;
    rq.token = cl->secret;
    rq.method = method;
    rq.path = path;
    rq.query = query;
    rq.body = body;
    rq.body_len = body_len;
    int rc = tv__cli_http(&rq, &rs, err);
    if (rc)
        return rc;
    *status = (int)rs.status;
    json_error_t je;
    *doc = rs.body_len ? json_loadb(rs.body, rs.body_len, 0, &je) : NULL;
    free(rs.body);
    return 0;
}

/* A 401: which token was sent (or that none was found, and where it was
 * looked for). */
static void unauthorized(const tv__cli_client *cl, tv_error *err)
{
    char msg[sizeof err->msg];
    snprintf(msg, sizeof msg, "%s", err->msg);
    if (cl->token.found && !strcmp(cl->token.from, cl->token.value))
        tv__seterr(err, err->code, "%s (the token sent came from %s)", msg, cl->token.from);
    else if (cl->token.found)
        tv__seterr(err, err->code, "%s (the token sent came from %s: %s)", msg, cl->token.from,
                   cl->token.value);
    else
        tv__cli_where_fail(
            err, &cl->token,
            "no token was found to send: set TENSORVAULT_TOKEN_FILE (or --token-file FILE) to the daemon's admin.token (in its store directory)");
}

int tv__cli_call(tv__cli_client *cl, const char *method, const char *path, const char *query,
                 json_t *body, json_t **doc, int *status, tv_error *err)
{
    int rc = 0, st = 0;
    char *text = NULL;
    *doc = NULL;
    if (body && !(text = json_dumps(body, JSON_COMPACT))) {
        rc = tv__seterr(err, -ENOMEM, "out of memory");
        goto out;
    }
    size_t tl = text ? strlen(text) : 0;
    if (!cl->local) {
        rc = remote_call(cl, method, path, query, text, tl, doc, &st, err);
        /* Connection refused: nothing was sent, so a store named by
         * $TENSORVAULT_STORE may serve the command instead. */
        if (rc == TV_E_NO_DAEMON && cl->n_sent == 0 && !cl->url_given && cl->store) {
            cl->local = true;
            rc = 0;
        }
    }
    if (cl->local && !rc && !st)
        rc = local_call(cl, method, path, query, text, tl, doc, &st, err);
    if (rc)
        goto out;
    cl->n_sent++;
    if (st < 200 || st > 299) {
        rc = tv__cli_doc_error(*doc, st, err);
        if (rc == TV_E_UNAUTHORIZED && !cl->local)
            unauthorized(cl, err);
        goto out;
    }
out:
    if (rc == TV_E_NO_DAEMON && !cl->local)
        tv__cli_where_fail(
            err, &cl->http,
            "set TENSORVAULT_URL (or --url) to the daemon's http://HOST:PORT or HTTP socket, start it (systemctl start tensorvaultd; ./scripts/run in a source tree), or use --store DIR");
    if (status)
        *status = st;
    free(text);
    return rc;
}

/* ---- byte answers (sidecar files) ---- */

static int local_bytes(tv__cli_client *cl, const char *path, char **body, size_t *len, int *status,
                       json_t **doc, tv_error *err)
{
    int rc;
    if (!cl->api && (rc = local_open(cl, err)))
        return rc;
    tv__api_req rq = {.method = "GET", .path = path, .trusted = true};
    tv__api_resp rs;
    memset(&rs, 0, sizeof(rs));
    tv__api_handle(cl->api, &rq, &rs);
    *status = rs.status;
    rc = 0;
    if (rs.json) {
        *doc = json_incref(rs.json);
    } else {
        size_t n = rs.stream ? (size_t)rs.stream_len : rs.body_len;
        if (!(*body = malloc(n + 1))) {
            rc = tv__seterr(err, -ENOMEM, "out of memory");
        } else if (rs.stream) {
            for (size_t off = 0; !rc && off < n;) {
                ssize_t got = tv__api_stream_read(&rs, off, *body + off, n - off);
                if (got <= 0)
                    rc = tv__seterr(err, got < 0 ? (int)got : -EIO, "reading %s: %s", path,
                                    tv_strerror(got < 0 ? (int)got : -EIO));
                else
                    off += (size_t)got;
            }
        } else if (n) {
            memcpy(*body, rs.body, n);
        }
        *len = n;
    }
    tv__api_resp_free(&rs);
    return rc;
}

int tv__cli_call_bytes(tv__cli_client *cl, const char *path, char **body, size_t *body_len,
                       tv_error *err)
{
    int rc = 0, st = 0;
    json_t *doc = NULL;
    *body = NULL;
    *body_len = 0;
    if (!cl->local) {
        tv__cli_http_req rq = {.base_url = cl->url,
                               .unix_path = cl->http.is_unix ? cl->http.value : NULL,
                               .token = cl->secret,
                               .method = "GET",
                               .path = path};
        tv__cli_http_resp rs = {0};
        rc = tv__cli_http(&rq, &rs, err);
        if (rc == TV_E_NO_DAEMON && cl->n_sent == 0 && !cl->url_given && cl->store) {
            cl->local = true;
            rc = 0;
        } else if (!rc) {
            st = (int)rs.status;
            if (st >= 200 && st <= 299) {
                *body = rs.body;
                *body_len = rs.body_len;
                rs.body = NULL;
            } else {
                json_error_t je;
                doc = rs.body_len ? json_loadb(rs.body, rs.body_len, 0, &je) : NULL;
            }
            free(rs.body);
        }
    }
    if (cl->local && !rc && !st)
        rc = local_bytes(cl, path, body, body_len, &st, &doc, err);
    if (!rc) {
        cl->n_sent++;
        if (st < 200 || st > 299) {
            rc = tv__cli_doc_error(doc, st, err);
            if (rc == TV_E_UNAUTHORIZED && !cl->local)
                unauthorized(cl, err);
        }
    }
    if (rc) {
        free(*body);
        *body = NULL;
        *body_len = 0;
    }
    json_decref(doc);
    return rc;
}
