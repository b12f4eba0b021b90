/* The routes of the daemon and its store as a whole: health and readiness,
 * version, status (with who the request was taken for, and the fast path's
 * memory tier), the OpenAPI document, and gc.
 * Invariants: health answers without touching the registry; readiness and
 * status read it through the request's pooled reader; gc runs on the
 * writer under its mutex, after the data route's idle handles and the
 * shard cache let go of what it may free. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fastpath/fastpath.h"
#include "http/api_internal.h"
#include "registry/notes.h"
#include "util/internal.h"

static const char *const NO_FIELDS[] = {NULL};

int tv__api_h_healthz(tv__api_ctx *c)
{
    return tv__api_reply(c, 200, json_pack("{s:s}", "status", "ok"));
}

int tv__api_h_readyz(tv__api_ctx *c)
{
    tv__reg *reg;
    int rc = tv__api_reader(c, &reg);
    if (!rc)
        rc = tv__reg_schema_version(reg, &(int){0}, &c->err);
    if (rc) {
        char why[sizeof c->err.msg];
        snprintf(why, sizeof why, "%s", c->err.msg);
        return tv__seterr(&c->err, TV_E_BUSY, "not ready: %s", why);
    }
    return tv__api_reply(c, 200, json_pack("{s:s}", "status", "ready"));
}

int tv__api_h_version(tv__api_ctx *c)
{
    return tv__api_reply(c, 200, tv__api_version_json());
}

/* Who the daemon took this request for (Status.peer). */
static json_t *peer_json(const tv__api_ctx *c)
{
    const tv__api_req *q = c->req;
    const char *kind = q->trusted                  ? "in-process"
                       : c->has_token              ? "token"
                       : q->peer && q->peer->local ? "local"
                                                   : "anonymous";
    const char *scope = tv__scope_name(c->scope);
    bool uid = !c->has_token && !q->trusted && q->peer && q->peer->local;
    return json_pack("{s:s,s:o,s:o,s:o,s:s}", "kind", kind, "uid",
                     uid ? json_integer((json_int_t)q->peer->uid) : json_null(), "token",
                     c->has_token ? tv__api_jstr(c->token.name) : json_null(), "transport",
                     !q->peer             ? json_null()
                     : q->peer->unix_sock ? json_string("unix")
                                          : json_string("tcp"),
                     "scope", scope ? scope : "none");
}

int tv__api_h_status(tv__api_ctx *c)
{
    tv__reg *reg;
    tv__reg_model *ms = NULL;
    tv__reg_device *ds = NULL;
    size_t nm = 0, nd = 0, queued = 0, running = 0, readable = 0;
    int rc = tv__api_reader(c, &reg);
    if (!rc)
        rc = tv__reg_models_list(reg, &ms, &nm, &c->err);
    if (!rc)
        rc = tv__reg_device_list(reg, &ds, &nd, &c->err);
    for (size_t i = 0; !rc && i < nm; i++)
        readable += tv__api_can_read(c, ms[i].name);
    free(ms);
    free(ds);
    if (rc)
        return rc;
    if (c->api->jobs)
        tv__jobs_counts(c->api->jobs, &queued, &running);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    bool anon = c->api->anonymous_reads == TV__ANON_ALWAYS || (c->req->peer && c->req->peer->local);
    tv__fp_stats st;
    tv__fp_get_stats(c->api->fp, &st);
    return tv__api_reply(
        c, 200,
        json_pack("{s:s,s:o,s:I,s:I,s:I,s:{s:I,s:I},s:b,s:o,s:o}", "version", tv_version(), "store",
                  tv__api_jstr(c->api->store_dir), "uptime_seconds",
                  (json_int_t)(ts.tv_sec - c->api->started_at), "n_models", (json_int_t)readable,
                  "n_devices", (json_int_t)nd, "jobs", "queued", (json_int_t)queued, "running",
                  (json_int_t)running, "anonymous_reads", anon, "peer", peer_json(c), "tier",
                  tv__api_tier_json(&st, c->api->fp != NULL)));
}

int tv__api_h_openapi(tv__api_ctx *c)
{
    if (!c->api->openapi_yaml)
        return tv__seterr(&c->err, TV_E_NOT_FOUND, "no OpenAPI document is embedded in this build");
    char *b = malloc(c->api->openapi_len ? c->api->openapi_len : 1);
    if (!b)
        return tv__seterr(&c->err, -ENOMEM, "out of memory");
    memcpy(b, c->api->openapi_yaml, c->api->openapi_len);
    c->resp->body = b;
    c->resp->body_len = c->api->openapi_len;
    c->resp->content_type = "application/yaml";
    c->resp->status = 200;
    return 0;
}

int tv__api_h_gc(tv__api_ctx *c)
{
    tv__store *st;
    size_t n = 0;
    uint64_t bytes = 0;
    int rc;
    if ((rc = tv__api_query_allow(c, NO_FIELDS)) || (rc = tv__api_no_body(c)) ||
        (rc = tv__api_writer_lock(c, &st)))
        return rc;
    tv__api_models_release(c->api, NULL);
    rc = tv__store_gc(st, &n, &bytes, &c->err);
    /* gc is one transaction per object (a crash keeps what it freed): its
     * event, with the totals, follows them. */
    if (!rc)
        rc = tv__reg_event(st->reg, "gc", NULL, 0, NULL,
                           json_pack("{s:I,s:I}", "n_objects_freed", (json_int_t)n, "freed_bytes",
                                     (json_int_t)bytes),
                           &c->err);
    tv__api_shards_forget(c->api);
    tv__api_writer_unlock(c);
    return rc ? rc
              : tv__api_reply(c, 200,
                              json_pack("{s:I,s:I}", "n_objects_freed", (json_int_t)n,
                                        "freed_bytes", (json_int_t)bytes));
}
