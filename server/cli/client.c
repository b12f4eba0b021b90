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

/* The first line of path, without surrounding white space, into tok.
 * missing_ok: a missing file leaves tok empty. */
static int read_token(const char *path, bool missing_ok, char *tok, size_t len, tv_error *err)
{
    int rc = 0;
    tok[0] = '\0';
    FILE *f = fopen(path, "re");
    if (!f) {
        if (missing_ok && errno == ENOENT)
            return 0;
        return tv__seterr(err, -errno, "token file '%s': %s", path, strerror(errno));
    }
    char line[TV__CLI_TOKEN_MAX + 2];
    if (!fgets(line, sizeof(line), f)) {
        rc = tv__seterr(err, TV_E_INVALID_ARG, "token file '%s' is empty", path);
        goto out;
    }
    size_t n = strcspn(line, "\r\n");
    if (n > TV__CLI_TOKEN_MAX || n >= len) {
        rc = tv__seterr(err, TV_E_INVALID_ARG, "token file '%s': the token is longer than %d bytes",
                        path, TV__CLI_TOKEN_MAX);
        goto out;
    }
    line[n] = '\0';
    char *p = line;
    while (*p == ' ' || *p == '\t')
        p++;
    n = strlen(p);
    while (n && (p[n - 1] == ' ' || p[n - 1] == '\t'))
        p[--n] = '\0';
    memcpy(tok, p, n + 1);
out:
    fclose(f);
    return rc;
}

int tv__cli_client_open(const tv__cli_ctx *c, bool writer, tv__cli_client *cl, tv_error *err)
{
    memset(cl, 0, sizeof(*cl));
    cl->writer = writer;
    const char *store = tv__cli_get(&c->a, "--store");
    const char *url = tv__cli_get(&c->a, "--url");
    if (store) {
        cl->local = true;
        cl->store = store;
        return 0;
    }
    cl->url_given = url != NULL;
    if (!url)
        url = getenv("TENSORVAULT_URL");
    if (!url || !*url)
        url = TV__CLI_DEFAULT_URL;
    if (strlen(url) >= sizeof(cl->url))
        return tv__seterr(err, TV_E_INVALID_ARG, "URL '%.64s...' is too long", url);
    if (strncmp(url, "http://", 7) && strncmp(url, "https://", 8))
        return tv__seterr(err, TV_E_INVALID_ARG, "URL '%s' is not http:// or https://", url);
    memcpy(cl->url, url, strlen(url) + 1);
    cl->store = getenv("TENSORVAULT_STORE");
    if (cl->store && !*cl->store)
        cl->store = NULL;
    const char *tf = tv__cli_get(&c->a, "--token-file");
    if (tf)
        return read_token(tf, false, cl->token, sizeof(cl->token), err);
    const char *env = getenv("TENSORVAULT_TOKEN");
    if (env && *env) {
        if (strlen(env) > TV__CLI_TOKEN_MAX)
            return tv__seterr(err, TV_E_INVALID_ARG, "$TENSORVAULT_TOKEN is longer than %d bytes",
                              TV__CLI_TOKEN_MAX);
        memcpy(cl->token, env, strlen(env) + 1);
        return 0;
    }
    return read_token(TV__CLI_TOKEN_FILE, true, cl->token, sizeof(cl->token), err);
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
    rq.token = cl->token;
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
        goto out;
    }
out:
    if (status)
        *status = st;
    free(text);
    return rc;
}
