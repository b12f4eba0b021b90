/* The helpers every route shares: the response (document, headers, free),
 * the request's pooled reader store and the writer lock, what the peer may
 * read, the query (allowed parameters, limit, cursors), the JSON body and
 * its typed fields, path ids, and generation specs ("3", an alias,
 * "active").
 *
 * Invariants: a handler takes at most one reader store per request
 * (c->rd), given back by the dispatcher or, when a body outlives the
 * request, by whoever keeps it; a generation row kept with a reader was
 * read through that reader's connection under the data version it carries,
 * and is answered only while the connection still reports that version; the writer store is only
 * ever used under its mutex; a cursor is the hex of the last key of a page behind a one-letter
 * kind, and a malformed one is 400, never a wrong page. */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "fastpath/access.h"
#include "http/api_internal.h"
#include "registry/notes.h"
#include "store/snapbuild.h"
#include "util/hex.h"
#include "util/internal.h"

/* ---- responses ----------------------------------------------------------- */

void tv__api_header(tv__api_resp *r, const char *name, const char *fmt, ...)
{
    size_t used = strlen(r->headers);
    char value[384];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(value, sizeof value, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof value)
        return;
    int m = snprintf(r->headers + used, sizeof r->headers - used, "%s: %s\r\n", name, value);
    if (m < 0 || (size_t)m >= sizeof r->headers - used)
        r->headers[used] = '\0'; /* never a partial line */
}

int tv__api_reply(tv__api_ctx *c, int status, json_t *doc)
{
    if (!doc)
        return tv__seterr(&c->err, -ENOMEM, "out of memory building the response");
    json_decref(c->resp->json);
    c->resp->json = doc;
    c->resp->status = status;
    c->resp->content_type = "application/json";
    return 0;
}

void tv__api_resp_free(tv__api_resp *resp)
{
    if (!resp)
        return;
    tv__api_later_abandon(resp->later);
    resp->later = NULL;
    if (resp->body_release)
        resp->body_release(resp->body_owner);
    else
        free(resp->body);
    resp->body = NULL;
    resp->body_len = 0;
    resp->body_release = NULL;
    resp->body_owner = NULL;
    json_decref(resp->json);
    resp->json = NULL;
    if (resp->stream_release)
        resp->stream_release(resp->stream_state);
    else
        free(resp->stream_state);
    resp->stream_state = NULL;
    resp->stream_release = NULL;
    resp->stream = false;
}

/* ---- store handles ------------------------------------------------------- */

int tv__api_reader(tv__api_ctx *c, tv__reg **reg)
{
    tv__api *api = c->api;
    if (!c->rdw) {
        pthread_mutex_lock(&api->pool_mu);
        if (api->n_readers)
            c->rdw = api->readers[--api->n_readers];
        pthread_mutex_unlock(&api->pool_mu);
    }
    if (!c->rdw) {
        tv__api_rd *rd = calloc(1, sizeof *rd);
        if (!rd)
            return tv__seterr(&c->err, -ENOMEM, "out of memory");
        int rc = tv__store_open(api->store_dir, 0, &rd->st, &c->err);
        if (rc) {
            free(rd);
            return rc;
        }
        c->rdw = rd;
    }
    c->rd = c->rdw->st;
    *reg = c->rd->reg;
    return 0;
}

void tv__api_reader_free(tv__api_rd *rd)
{
    if (!rd)
        return;
    tv__store_close(rd->st);
    free(rd);
}

void tv__api_reader_put(tv__api *api, tv__api_rd *rd)
{
    if (!rd)
        return;
    /* A reader left inside a transaction by a failed call is not reused. */
    if (tv__reg_tx_depth(rd->st->reg) == 0) {
        pthread_mutex_lock(&api->pool_mu);
        if (api->n_readers < TV__API_READER_POOL) {
            api->readers[api->n_readers++] = rd;
            rd = NULL;
        }
        pthread_mutex_unlock(&api->pool_mu);
    }
    tv__api_reader_free(rd);
}

/* The generation row of (model, number), number 0 the active one: from the
 * reader's entries when its connection's data version is the one they were
 * read under (no commit since: the registry would answer the same), else
 * from the registry, kept for the next request on this reader. A failing
 * data version read only skips the cache. */
static int gen_cached(tv__api_ctx *c, tv__reg *reg, const char *model, int64_t number,
                      tv__reg_generation *g)
{
    tv__api_rd *rd = c->rdw;
    int64_t v = 0;
    tv_error e = {0};
    int rc;
    if (!rd || rd->st->reg != reg || tv__reg_data_version(reg, &v, &e))
        return tv__reg_generation_get(reg, model, number, g, &c->err);
    if (rd->n_gen && v != rd->version)
        rd->n_gen = 0;
    rd->version = v;
    for (size_t i = 0; i < rd->n_gen; i++) {
        struct tv__api_gen_entry *x = &rd->gen[i];
        if (x->number == number && !strcmp(x->g.model, model)) {
            x->last_use = ++rd->clock;
            *g = x->g;
            return 0;
        }
    }
    if ((rc = tv__reg_generation_get(reg, model, number, g, &c->err)))
        return rc;
    size_t pick = rd->n_gen;
    if (pick == TV__API_GEN_CACHE) {
        pick = 0;
        for (size_t i = 1; i < TV__API_GEN_CACHE; i++)
            if (rd->gen[i].last_use < rd->gen[pick].last_use)
                pick = i;
    } else {
        rd->n_gen++;
    }
    rd->gen[pick].number = number;
    rd->gen[pick].last_use = ++rd->clock;
    rd->gen[pick].g = *g;
    return 0;
}

int tv__api_writer_lock(tv__api_ctx *c, tv__store **st)
{
    if (!c->api->writer)
        return tv__seterr(
            &c->err, TV_E_STATE,
            "store %s is open read-only here: this call needs the writer (run it against tensorvaultd, or as a writer command)",
            c->api->store_dir);
    pthread_mutex_lock(&c->api->writer_mu);
    *st = c->api->writer;
    return 0;
}

void tv__api_writer_unlock(tv__api_ctx *c)
{
    pthread_mutex_unlock(&c->api->writer_mu);
}

/* ---- access -------------------------------------------------------------- */

bool tv__api_sees_all(const tv__api_ctx *c)
{
    return c->req->trusted || c->scope == TV__SCOPE_ADMIN;
}

int tv__api_may_read(tv__api_ctx *c, const char *model)
{
    const tv__api_req *q = c->req;
    if (tv__api_sees_all(c))
        return 0;
    if (c->scope != TV__SCOPE_READ)
        return tv__seterr(&c->err, TV_E_FORBIDDEN, "this token may not read model '%.256s'", model);
    if (!c->api->access)
        return 0;
    tv__access_peer p = {0};
    if (c->has_token) {
        p.token = c->token.name;
    } else if (q->peer && q->peer->local) {
        p.local = true;
        p.uid = q->peer->uid;
        p.gids = q->peer->gids;
        p.n_gids = q->peer->n_gids;
    }
    return tv__access_check_peer(c->api->access, model, &p, &c->err);
}

bool tv__api_can_read(tv__api_ctx *c, const char *model)
{
    tv_error keep = c->err;
    bool ok = tv__api_may_read(c, model) == 0;
    c->err = keep;
    return ok;
}

/* ---- query --------------------------------------------------------------- */

int tv__api_query_allow(tv__api_ctx *c, const char *const *allowed)
{
    for (size_t i = 0; i < c->n_query; i++) {
        bool ok = false;
        for (size_t j = 0; allowed && allowed[j]; j++)
            ok = ok || !strcmp(allowed[j], c->qk[i]);
        if (!ok)
            return tv__seterr(&c->err, TV_E_BAD_REQUEST, "unknown query parameter '%.100s'",
                              c->qk[i]);
    }
    return 0;
}

const char *tv__api_query(const tv__api_ctx *c, const char *name)
{
    for (size_t i = 0; i < c->n_query; i++)
        if (!strcmp(c->qk[i], name))
            return c->qv[i];
    return NULL;
}

int tv__api_query_limit(tv__api_ctx *c, size_t *limit)
{
    const char *s = tv__api_query(c, "limit");
    *limit = TV__API_LIMIT_DEFAULT;
    if (!s)
        return 0;
    size_t v = 0, n = strlen(s);
    bool ok = n >= 1 && n <= 4 && s[0] != '0';
    for (size_t i = 0; ok && i < n; i++) {
        ok = s[i] >= '0' && s[i] <= '9';
        v = v * 10 + (size_t)(s[i] - '0');
    }
    if (!ok || v < 1 || v > TV__API_LIMIT_MAX)
        return tv__seterr(&c->err, TV_E_BAD_REQUEST, "bad limit '%.40s': an integer from 1 to %d",
                          s, TV__API_LIMIT_MAX);
    *limit = v;
    return 0;
}

char *tv__api_cursor_make(char kind, const char *key, size_t key_len)
{
    char *s = malloc(2 * key_len + 2);
    if (!s)
        return NULL;
    s[0] = kind;
    tv__hex_encode((const uint8_t *)key, key_len, false, s + 1);
    return s;
}

int tv__api_cursor_get(tv__api_ctx *c, char kind, char **key, size_t *key_len)
{
    const char *s = tv__api_query(c, "cursor");
    *key = NULL;
    *key_len = 0;
    if (!s || !*s) /* "cursor=": from the start, as a client that has no cursor yet sends it */
        return 0;
    size_t n = strlen(s);
    if (n < 3 || n > TV__API_CURSOR_MAX || s[0] != kind || (n - 1) % 2)
        goto bad;
    size_t kl = (n - 1) / 2;
    char *k = malloc(kl + 1);
    if (!k)
        return tv__seterr(&c->err, -ENOMEM, "out of memory");
    if (tv__hex_decode(s + 1, n - 1, (uint8_t *)k, kl) || memchr(k, '\0', kl)) {
        free(k);
        goto bad;
    }
    k[kl] = '\0';
    *key = k;
    *key_len = kl;
    return 0;
bad:
    return tv__seterr(&c->err, TV_E_BAD_REQUEST,
                      "malformed cursor '%.60s' (pass next_cursor of the previous page as it is)",
                      s);
}

/* ---- body and path ------------------------------------------------------- */

int tv__api_body(tv__api_ctx *c, const char *const *allowed, bool empty_ok, json_t **obj)
{
    const tv__api_req *q = c->req;
    *obj = NULL;
    const char *ct = q->content_type;
    if (ct && *ct) {
        size_t l = strcspn(ct, ";");
        while (l && (ct[l - 1] == ' ' || ct[l - 1] == '\t'))
            l--;
        while (l && (*ct == ' ' || *ct == '\t'))
            ct++, l--;
        if (l != strlen("application/json") || strncasecmp(ct, "application/json", l))
            return tv__seterr(&c->err, TV_E_BAD_REQUEST,
                              "Content-Type '%.80s' is not application/json", q->content_type);
    }
    if (q->body_len > c->api->max_body_bytes)
        return tv__seterr(&c->err, TV_E_TOO_LARGE,
                          "request body of %zu bytes is over the limit of %zu bytes", q->body_len,
                          c->api->max_body_bytes);
    if (!q->body || q->body_len == 0) {
        if (!empty_ok)
            return tv__seterr(&c->err, TV_E_BAD_REQUEST, "this call needs a JSON object body");
        *obj = json_object();
        return *obj ? 0 : tv__seterr(&c->err, -ENOMEM, "out of memory");
    }
    json_error_t je;
    json_t *o = json_loadb(q->body, q->body_len, JSON_REJECT_DUPLICATES, &je);
    if (!o)
        return tv__seterr(&c->err, TV_E_BAD_REQUEST,
                          "body is not valid JSON: %s (line %d, column %d)", je.text, je.line,
                          je.column);
    if (!json_is_object(o)) {
        json_decref(o);
        return tv__seterr(&c->err, TV_E_BAD_REQUEST, "body must be a JSON object");
    }
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v)
    {
        bool ok = false;
        for (size_t j = 0; allowed && allowed[j]; j++)
            ok = ok || !strcmp(allowed[j], k);
        if (!ok) {
            int rc = tv__seterr(&c->err, TV_E_BAD_REQUEST, "unknown field '%.100s' in the body", k);
            json_decref(o);
            return rc;
        }
    }
    *obj = o;
    return 0;
}

/* An absent field: an error when required. A present null is a wrong
 * type (docs/openapi.yaml declares no nullable request field but
 * placement, which its route reads itself). */
static int absent(tv__api_ctx *c, json_t *v, const char *name, bool required, const char *type)
{
    if (v && json_is_null(v))
        return tv__seterr(&c->err, TV_E_BAD_REQUEST, "field '%s' must be %s, not null", name, type);
    if (required)
        return tv__seterr(&c->err, TV_E_BAD_REQUEST, "field '%s' is required", name);
    return 0;
}

int tv__api_field_str(tv__api_ctx *c, json_t *o, const char *name, bool required, const char **out)
{
    json_t *v = json_object_get(o, name);
    if (!v || json_is_null(v))
        return absent(c, v, name, required, "a string");
    if (!json_is_string(v))
        return tv__seterr(&c->err, TV_E_BAD_REQUEST, "field '%s' must be a string", name);
    *out = json_string_value(v);
    return 0;
}

int tv__api_field_bool(tv__api_ctx *c, json_t *o, const char *name, bool *out)
{
    json_t *v = json_object_get(o, name);
    if (!v || json_is_null(v))
        return absent(c, v, name, false, "a boolean");
    if (!json_is_boolean(v))
        return tv__seterr(&c->err, TV_E_BAD_REQUEST, "field '%s' must be a boolean", name);
    *out = json_is_true(v);
    return 0;
}

int tv__api_field_int(tv__api_ctx *c, json_t *o, const char *name, bool required, int64_t *out)
{
    json_t *v = json_object_get(o, name);
    if (!v || json_is_null(v))
        return absent(c, v, name, required, "an integer");
    if (json_is_integer(v)) {
        *out = (int64_t)json_integer_value(v);
        return 0;
    }
    /* JSON Schema's integer is a number without a fraction: 3.0 is 3. The
     * bounds are the doubles -2^63 (exact) and 2^63 (exact, excluded). */
    double d = json_is_real(v) ? json_real_value(v) : 0.5; /* 0.5: not a number at all */
    if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0) || (double)(int64_t)d != d)
        return tv__seterr(&c->err, TV_E_BAD_REQUEST, "field '%s' must be an integer", name);
    *out = (int64_t)d;
    return 0;
}

int tv__api_no_body(tv__api_ctx *c)
{
    static const char *const none[] = {NULL};
    json_t *o = NULL;
    int rc = tv__api_body(c, none, true, &o);
    json_decref(o);
    return rc;
}

int tv__api_path_id(tv__api_ctx *c, size_t i, const char *what, int64_t *id)
{
    if (!tv__parse_pos_i64(c->param[i], id))
        return tv__seterr(&c->err, TV_E_BAD_REQUEST, "bad %s '%.60s': a number from 1", what,
                          c->param[i]);
    return 0;
}

json_t *tv__api_cursor_json(bool more, char kind, const char *key, size_t key_len)
{
    if (!more)
        return json_null();
    char *s = tv__api_cursor_make(kind, key, key_len);
    json_t *j = s ? tv__api_jstr(s) : NULL;
    free(s);
    return j;
}

/* ---- generation specs ---------------------------------------------------- */

/* The active generation as readers open it (tv__store_settled_active: an
 * activation interrupted after its pointer rename counts as done), or the
 * registry's when no reader store is held. With a writer the registry is
 * already settled (the writer's open completed any interrupted activation
 * and every later one goes through this process), so no pointer file is
 * read per request. */
int tv__api_settled(tv__api_ctx *c, const char *model, int64_t registry_active, int64_t *active)
{
    *active = registry_active;
    return c->rd && !c->api->writer ? tv__store_settled_active(c->rd, model, active, &c->err) : 0;
}

int tv__api_gen_row(tv__api_ctx *c, tv__reg *reg, const char *model, const char *spec,
                    tv__reg_generation *g)
{
    int64_t number = 0; /* 0: the registry's active one, in the same query */
    int rc;
    if ((strcmp(spec, "active") || !c->api->writer) &&
        (rc = tv__api_gen(c, reg, model, spec, &number)))
        return rc;
    return gen_cached(c, reg, model, number, g);
}

int tv__api_gen(tv__api_ctx *c, tv__reg *reg, const char *model, const char *spec, int64_t *number)
{
    int64_t a = 0;
    if (!strcmp(spec, "active") && c->rd && !tv__api_settled(c, model, 0, &a) && a) {
        *number = a;
        return 0;
    }
    if (spec[0] >= '0' && spec[0] <= '9') {
        if (!tv__parse_pos_i64(spec, number))
            return tv__seterr(
                &c->err, TV_E_BAD_REQUEST,
                "bad generation '%.60s': a number from 1 (digits, no leading zero), an alias or 'active'",
                spec);
        return 0;
    }
    return tv__reg_resolve_gen(reg, model, spec, number, &c->err);
}

int tv__api_aliases(tv__api_ctx *c, tv__reg *reg, const char *model, tv__reg_alias **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    return tv__reg_aliases_list(reg, model, out, n, &c->err);
}

/* ---- notes (description and tags) ----------------------------------------- */

int tv__api_notes_put(tv__api_ctx *c, tv__reg *reg, json_t *doc, const char *model, int64_t number)
{
    char *desc = NULL;
    json_t *tags = NULL;
    if (!doc)
        return tv__seterr(&c->err, -ENOMEM, "out of memory");
    int rc = tv__reg_notes_get(reg, model, number, &desc, &tags, &c->err);
    if (rc)
        return rc;
    if (json_object_set_new(doc, "description", json_string(desc)) ||
        json_object_set_new(doc, "tags", tags))
        rc = tv__seterr(&c->err, -ENOMEM, "out of memory");
    free(desc);
    return rc;
}
