/* The registry routes: health, version, status, devices, models,
 * generations (activate, retire, rollback), aliases, tensor metadata, gc
 * and tokens.
 * Invariants: reads use the request's pooled reader store; every mutation
 * runs on the writer store under its mutex and renders its answer from the
 * writer's registry inside the same lock, so the answer shows the change;
 * list cursors encode the last key of the page (tv__api_cursor_make). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fastpath/fastpath.h"
#include "http/api_internal.h"
#include "store/snapbuild.h"
#include "util/internal.h"

static const char *const NO_FIELDS[] = {NULL};
static const char *const PAGE_Q[] = {"limit", "cursor", NULL};

static int path_id(tv__api_ctx *c, size_t i, const char *what, int64_t *id)
{
    if (!tv__parse_pos_i64(c->param[i], id))
        return tv__seterr(&c->err, TV_E_BAD_REQUEST, "bad %s '%.60s': a number from 1", what,
                          c->param[i]);
    return 0;
}

/* A request that takes no body: nothing, or an empty JSON object. */
static int no_body(tv__api_ctx *c)
{
    json_t *o = NULL;
    int rc = tv__api_body(c, NO_FIELDS, true, &o);
    json_decref(o);
    return rc;
}

static json_t *cursor_json(bool more, char kind, const char *key, size_t key_len)
{
    if (!more)
        return json_null();
    char *s = tv__api_cursor_make(kind, key, key_len);
    json_t *j = s ? tv__api_jstr(s) : NULL;
    free(s);
    return j;
}

/* The active generation as readers open it (tv__store_settled_active: an
 * activation interrupted after its pointer rename counts as done), or the
 * registry's when no reader store is held. With a writer the registry is
 * already settled (the writer's open completed any interrupted activation
 * and every later one goes through this process), so no pointer file is
 * read per request. */
static int settled(tv__api_ctx *c, const char *model, int64_t registry_active, int64_t *active)
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
    return tv__reg_generation_get(reg, model, number, g, &c->err);
}

int tv__api_gen(tv__api_ctx *c, tv__reg *reg, const char *model, const char *spec, int64_t *number)
{
    int64_t a = 0;
    if (!strcmp(spec, "active") && c->rd && !settled(c, model, 0, &a) && a) {
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

/* ---- health, version, status, openapi ------------------------------------- */

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
    return tv__api_reply(
        c, 200,
        json_pack("{s:s,s:o,s:I,s:I,s:I,s:{s:I,s:I},s:b,s:o}", "version", tv_version(), "store",
                  tv__api_jstr(c->api->store_dir), "uptime_seconds",
                  (json_int_t)(ts.tv_sec - c->api->started_at), "n_models", (json_int_t)readable,
                  "n_devices", (json_int_t)nd, "jobs", "queued", (json_int_t)queued, "running",
                  (json_int_t)running, "anonymous_reads", anon, "peer", peer_json(c)));
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

/* ---- devices ---------------------------------------------------------------- */

/* One device: its space from the registry and its status from opening it
 * through a fresh reader store (so a device that went missing since is
 * reported, not a cached handle). */
static json_t *device_doc(tv__store *st, const tv__reg_device *d, tv_error *err, int *rc)
{
    tv__alloc_space sp;
    if ((*rc = tv__alloc_device_space(st->reg, d->id, &sp, err)))
        return NULL;
    tv_error de = {0};
    const char *status = tv__store_device_status(st, d->id, &de);
    json_t *j = tv__api_device_json(d, &sp, status, de.msg);
    if (!j)
        *rc = tv__seterr(err, -ENOMEM, "out of memory");
    return j;
}

static int devices(tv__api_ctx *c, bool one)
{
    int64_t id = 0;
    int rc = 0;
    tv__store *st = NULL;
    tv__reg_device *d = NULL;
    size_t n = 0;
    json_t *arr = NULL;
    if ((rc = tv__api_query_allow(c, NO_FIELDS)) || (one && (rc = path_id(c, 0, "device id", &id))))
        goto out;
    if ((rc = tv__store_open(c->api->store_dir, 0, &st, &c->err)))
        goto out;
    if (one) {
        tv__reg_device row;
        if ((rc = tv__reg_device_get(st->reg, id, &row, &c->err)))
            goto out;
        json_t *j = device_doc(st, &row, &c->err, &rc);
        if (!rc)
            rc = tv__api_reply(c, 200, j);
        goto out;
    }
    if ((rc = tv__reg_device_list(st->reg, &d, &n, &c->err)))
        goto out;
    arr = json_array();
    for (size_t i = 0; !rc && i < n; i++) {
        json_t *j = device_doc(st, &d[i], &c->err, &rc);
        if (!rc && json_array_append_new(arr, j))
            rc = tv__seterr(&c->err, -ENOMEM, "out of memory");
    }
    if (!rc) {
        rc = tv__api_reply(c, 200, json_pack("{s:o}", "devices", arr));
        arr = NULL;
    }
out:
    json_decref(arr);
    free(d);
    tv__store_close(st);
    return rc;
}

int tv__api_h_devices(tv__api_ctx *c)
{
    return devices(c, false);
}

int tv__api_h_device(tv__api_ctx *c)
{
    return devices(c, true);
}

/* The extents map: the label extent [region_off, data_off), then every
 * object and the free gaps between them up to the region's end. The
 * registry has checked that objects lie in the data region without
 * overlapping, so no extent is negative. */
static int extent_append(json_t *arr, json_t *e, tv_error *err)
{
    if (!e || json_array_append_new(arr, e))
        return tv__seterr(err, -ENOMEM, "out of memory");
    return 0;
}

static json_t *plain_extent(uint64_t off, uint64_t bytes, const char *kind)
{
    return json_pack("{s:I,s:I,s:s}", "offset", (json_int_t)off, "bytes", (json_int_t)bytes, "kind",
                     kind);
}

/* An object extent; users of models the peer may not read are left out,
 * and so is the hash of an object none of whose users it may read. */
static json_t *object_extent(tv__api_ctx *c, const tv__reg_device_objects *m, size_t i)
{
    const tv__reg_object *o = &m->objects[i];
    json_t *users = json_array();
    size_t hidden = 0;
    for (size_t u = m->first_user[i]; users && u < m->first_user[i + 1]; u++) {
        const tv__reg_object_user *w = &m->users[u];
        const char *state = tv__gen_state_name(w->state);
        if (!tv__api_can_read(c, w->model)) {
            hidden++;
            continue;
        }
        if (json_array_append_new(
                users, json_pack("{s:o,s:I,s:o,s:s}", "model", tv__api_jstr(w->model), "generation",
                                 (json_int_t)w->generation, "shard", tv__api_jstr(w->shard),
                                 "state", state ? state : "failed"))) {
            json_decref(users);
            users = NULL;
        }
    }
    if (!users)
        return NULL;
    bool committed = o->state == TV__OBJ_COMMITTED;
    bool show_hash = committed && !(hidden && json_array_size(users) == 0);
    return json_pack("{s:I,s:I,s:s,s:I,s:s,s:I,s:o,s:o}", "offset", (json_int_t)o->base_off,
                     "bytes", (json_int_t)o->alloc_len, "kind", "object", "object_id",
                     (json_int_t)o->id, "state", committed ? "committed" : "writing",
                     "canonical_bytes", (json_int_t)o->canonical_len, "sha256",
                     show_hash ? tv__api_jstr(o->sha256) : json_null(), "users", users);
}

int tv__api_h_device_extents(tv__api_ctx *c)
{
    int64_t id = 0;
    tv__reg *reg;
    tv__reg_device_objects m = {0};
    json_t *arr = NULL;
    int rc;
    if ((rc = tv__api_query_allow(c, NO_FIELDS)) || (rc = path_id(c, 0, "device id", &id)) ||
        (rc = tv__api_reader(c, &reg)) || (rc = tv__reg_device_objects_get(reg, id, &m, &c->err)))
        goto out;
    const tv__reg_device *d = &m.device;
    uint64_t end = d->region_off + d->region_len, pos = d->data_off;
    if (!(arr = json_array())) {
        rc = tv__seterr(&c->err, -ENOMEM, "out of memory");
        goto out;
    }
    rc = extent_append(arr, plain_extent(d->region_off, d->data_off - d->region_off, "label"),
                       &c->err);
    for (size_t i = 0; !rc && i < m.n_objects; i++) {
        const tv__reg_object *o = &m.objects[i];
        if (o->base_off > pos &&
            (rc = extent_append(arr, plain_extent(pos, o->base_off - pos, "free"), &c->err)))
            break;
        rc = extent_append(arr, object_extent(c, &m, i), &c->err);
        pos = o->base_off + o->alloc_len;
    }
    if (!rc && end > pos)
        rc = extent_append(arr, plain_extent(pos, end - pos, "free"), &c->err);
    if (rc)
        goto out;
    rc = tv__api_reply(c, 200,
                       json_pack("{s:I,s:I,s:I,s:I,s:I,s:o}", "device_id", (json_int_t)d->id,
                                 "region_offset", (json_int_t)d->region_off, "region_bytes",
                                 (json_int_t)d->region_len, "data_offset", (json_int_t)d->data_off,
                                 "object_align", (json_int_t)d->object_align, "extents", arr));
    arr = NULL;
out:
    json_decref(arr);
    tv__reg_device_objects_free(&m);
    return rc;
}

/* ---- models ----------------------------------------------------------------- */

static json_t *model_doc(tv__api_ctx *c, tv__reg *reg, const tv__reg_model *m, int *rc)
{
    tv__reg_alias *al = NULL;
    size_t na = 0;
    tv__reg_model ms = *m;
    if ((*rc = settled(c, m->name, m->active_generation, &ms.active_generation)) ||
        (*rc = tv__api_aliases(c, reg, m->name, &al, &na)))
        return NULL;
    json_t *j = tv__api_model_json(&ms, al, na);
    free(al);
    if (!j)
        *rc = tv__seterr(&c->err, -ENOMEM, "out of memory");
    return j;
}

int tv__api_h_models(tv__api_ctx *c)
{
    tv__reg *reg;
    size_t limit, n = 0, kl;
    char *after = NULL;
    tv__reg_model *ms = NULL;
    bool more = false;
    json_t *arr = NULL;
    int rc;
    if ((rc = tv__api_query_allow(c, PAGE_Q)) || (rc = tv__api_query_limit(c, &limit)) ||
        (rc = tv__api_cursor_get(c, 'm', &after, &kl)) || (rc = tv__api_reader(c, &reg)) ||
        (rc = tv__reg_models_page(reg, after ? after : "", limit, &ms, &n, &more, &c->err)))
        goto out;
    arr = json_array();
    for (size_t i = 0; !rc && i < n; i++) {
        if (!tv__api_can_read(c, ms[i].name))
            continue; /* a page may come out short: the cursor still moves on */
        json_t *j = model_doc(c, reg, &ms[i], &rc);
        if (!rc && json_array_append_new(arr, j))
            rc = tv__seterr(&c->err, -ENOMEM, "out of memory");
    }
    if (!rc) {
        const char *last = n ? ms[n - 1].name : "";
        rc = tv__api_reply(c, 200,
                           json_pack("{s:o,s:o}", "models", arr, "next_cursor",
                                     cursor_json(more && n, 'm', last, strlen(last))));
        arr = NULL;
    }
out:
    json_decref(arr);
    free(ms);
    free(after);
    return rc;
}

int tv__api_h_model(tv__api_ctx *c)
{
    tv__reg *reg;
    tv__reg_model m;
    int rc;
    if ((rc = tv__api_query_allow(c, NO_FIELDS)) || (rc = tv__api_reader(c, &reg)) ||
        (rc = tv__reg_model_get(reg, c->param[0], &m, &c->err)))
        return rc;
    json_t *j = model_doc(c, reg, &m, &rc);
    return rc ? rc : tv__api_reply(c, 200, j);
}

int tv__api_h_model_delete(tv__api_ctx *c)
{
    tv__store *st;
    size_t n_retired = 0;
    uint64_t freed = 0;
    int rc;
    if ((rc = tv__api_query_allow(c, NO_FIELDS)) || (rc = no_body(c)) ||
        (rc = tv__api_writer_lock(c, &st)))
        return rc;
    tv__api_models_release(c->api, c->param[0]);
    rc = tv__store_model_delete(st, c->param[0], &n_retired, &freed, &c->err);
    tv__api_shards_forget(c->api);
    tv__api_writer_unlock(c);
    if (rc)
        return rc;
    return tv__api_reply(c, 200,
                         json_pack("{s:o,s:I,s:I}", "model", tv__api_jstr(c->param[0]),
                                   "n_generations_retired", (json_int_t)n_retired, "freed_bytes",
                                   (json_int_t)freed));
}

/* ---- generations ------------------------------------------------------------ */

/* The Generation document of model's generation number (with shards when
 * detail), read from reg. */
static int generation_reply(tv__api_ctx *c, tv__reg *reg, const char *model, int64_t number,
                            bool detail)
{
    tv__reg_generation g;
    json_t *shards = NULL, *doc = NULL;
    tv__reg_alias *al = NULL;
    size_t na = 0;
    int rc;
    int64_t active;
    if ((rc = tv__reg_generation_get(reg, model, number, &g, &c->err)) ||
        (detail && (rc = tv__api_shards(c, reg, &g, &shards))) ||
        (rc = tv__api_aliases(c, reg, model, &al, &na)) ||
        (rc = settled(c, model, g.active ? g.number : 0, &active)))
        goto out;
    g.active = g.number == active;
    doc = tv__api_generation_json(&g, al, na, NULL);
    if (doc && shards) {
        int bad = json_object_set_new(doc, "shards", shards); /* steals shards */
        shards = NULL;
        if (bad) {
            json_decref(doc);
            doc = NULL;
        }
    }
    rc = tv__api_reply(c, 200, doc);
out:
    json_decref(shards);
    free(al);
    return rc;
}

int tv__api_h_generations(tv__api_ctx *c)
{
    tv__reg *reg;
    size_t limit, n = 0, kl, na = 0;
    char *after = NULL;
    int64_t after_n = 0;
    tv__reg_generation *gs = NULL;
    tv__reg_alias *al = NULL;
    tv__reg_model m;
    bool more = false;
    json_t *arr = NULL;
    int rc;
    if ((rc = tv__api_query_allow(c, PAGE_Q)) || (rc = tv__api_query_limit(c, &limit)) ||
        (rc = tv__api_cursor_get(c, 'g', &after, &kl)))
        goto out;
    if (after && !tv__parse_pos_i64(after, &after_n)) {
        rc = tv__seterr(&c->err, TV_E_BAD_REQUEST,
                        "malformed cursor (pass next_cursor of the previous page as it is)");
        goto out;
    }
    if ((rc = tv__api_reader(c, &reg)) || (rc = tv__reg_model_get(reg, c->param[0], &m, &c->err)) ||
        (rc =
             tv__reg_generations_page(reg, c->param[0], after_n, limit, &gs, &n, &more, &c->err)) ||
        (rc = tv__api_aliases(c, reg, c->param[0], &al, &na)) ||
        (rc = settled(c, c->param[0], m.active_generation, &m.active_generation)))
        goto out;
    for (size_t i = 0; i < n; i++)
        gs[i].active = gs[i].number == m.active_generation;
    arr = json_array();
    for (size_t i = 0; !rc && i < n; i++)
        if (json_array_append_new(arr, tv__api_generation_json(&gs[i], al, na, NULL)))
            rc = tv__seterr(&c->err, -ENOMEM, "out of memory");
    if (!rc) {
        char last[24];
        int ll = snprintf(last, sizeof last, "%" PRId64, n ? gs[n - 1].number : 0);
        rc = tv__api_reply(c, 200,
                           json_pack("{s:s,s:o,s:o}", "model", c->param[0], "generations", arr,
                                     "next_cursor", cursor_json(more && n, 'g', last, (size_t)ll)));
        arr = NULL;
    }
out:
    json_decref(arr);
    free(gs);
    free(al);
    free(after);
    return rc;
}

int tv__api_h_generation(tv__api_ctx *c)
{
    tv__reg *reg;
    int64_t number;
    int rc;
    if ((rc = tv__api_query_allow(c, NO_FIELDS)) || (rc = tv__api_reader(c, &reg)) ||
        (rc = tv__api_gen(c, reg, c->param[0], c->param[1], &number)))
        return rc;
    return generation_reply(c, reg, c->param[0], number, true);
}

/* Runs op on the writer for model's generation spec, then answers with the
 * generation (list form). */
enum gen_op { OP_ACTIVATE, OP_RETIRE };

static int gen_change(tv__api_ctx *c, const char *spec, enum gen_op op)
{
    tv__store *st;
    int64_t number = 0;
    int rc;
    if ((rc = tv__api_query_allow(c, NO_FIELDS)) || (rc = no_body(c)) ||
        (rc = tv__api_writer_lock(c, &st)))
        return rc;
    const char *model = c->param[0];
    if (!(rc = tv__api_gen(c, st->reg, model, spec, &number)))
        rc = op == OP_ACTIVATE ? tv__store_activate(st, model, number, &c->err)
                               : tv__reg_generation_retire(st->reg, model, number, &c->err);
    if (!rc)
        rc = generation_reply(c, st->reg, model, number, false);
    tv__api_writer_unlock(c);
    return rc;
}

int tv__api_h_activate(tv__api_ctx *c)
{
    return gen_change(c, c->param[1], OP_ACTIVATE);
}

int tv__api_h_retire(tv__api_ctx *c)
{
    return gen_change(c, c->param[1], OP_RETIRE);
}

int tv__api_h_rollback(tv__api_ctx *c)
{
    tv__store *st;
    tv__reg_generation *gs = NULL;
    size_t n = 0;
    int64_t active = 0, target = 0;
    int rc;
    if ((rc = tv__api_query_allow(c, NO_FIELDS)) || (rc = no_body(c)) ||
        (rc = tv__api_writer_lock(c, &st)))
        return rc;
    const char *model = c->param[0];
    if ((rc = tv__reg_generations_list(st->reg, model, &gs, &n, &c->err)))
        goto out;
    for (size_t i = 0; i < n; i++)
        if (gs[i].active)
            active = gs[i].number;
    for (size_t i = 0; i < n; i++)
        if (gs[i].state == TV__GEN_READY && gs[i].number < active && gs[i].number > target)
            target = gs[i].number;
    if (!active || !target) {
        rc = tv__seterr(
            &c->err, TV_E_CONFLICT,
            active ? "model '%s' has no ready generation below its active generation %" PRId64
                     " to roll back to"
                   : "model '%s' has no active generation to roll back from",
            model, active);
        goto out;
    }
    if (!(rc = tv__store_activate(st, model, target, &c->err)))
        rc = generation_reply(c, st->reg, model, target, false);
out:
    tv__api_writer_unlock(c);
    free(gs);
    return rc;
}

/* POST /v1/models/{name}/deactivate: the model keeps its generations but
 * has no active one (readers of NAME get TV_E_NOT_FOUND, NAME@GEN and
 * aliases still open), so that it can be deleted. A model with no active
 * generation is a no-op. Answers the Model. */
int tv__api_h_deactivate(tv__api_ctx *c)
{
    tv__store *st;
    tv__reg_model m;
    int64_t was = 0;
    int rc;
    if ((rc = tv__api_query_allow(c, NO_FIELDS)) || (rc = no_body(c)) ||
        (rc = tv__api_writer_lock(c, &st)))
        return rc;
    const char *model = c->param[0];
    json_t *j = NULL;
    if (!(rc = tv__store_deactivate(st, model, &was, &c->err)) &&
        !(rc = tv__reg_model_get(st->reg, model, &m, &c->err)))
        j = model_doc(c, st->reg, &m, &rc);
    tv__api_writer_unlock(c);
    if (!rc && was)
        tv__log(TV_LOG_INFO, "model '%s': deactivated (was generation %" PRId64 ")", model, was);
    return rc ? (json_decref(j), rc) : tv__api_reply(c, 200, j);
}

/* ---- aliases ---------------------------------------------------------------- */

int tv__api_h_aliases(tv__api_ctx *c)
{
    tv__reg *reg;
    tv__reg_model m;
    tv__reg_alias *al = NULL;
    size_t n = 0;
    int rc;
    if ((rc = tv__api_query_allow(c, NO_FIELDS)) || (rc = tv__api_reader(c, &reg)) ||
        (rc = tv__reg_model_get(reg, c->param[0], &m, &c->err)) ||
        (rc = tv__api_aliases(c, reg, c->param[0], &al, &n)))
        goto out;
    json_t *arr = json_array();
    for (size_t i = 0; !rc && i < n; i++)
        if (json_array_append_new(arr, tv__api_alias_json(m.name, al[i].alias, al[i].generation)))
            rc = tv__seterr(&c->err, -ENOMEM, "out of memory");
    if (rc)
        json_decref(arr);
    else
        rc = tv__api_reply(c, 200, json_pack("{s:s,s:o}", "model", m.name, "aliases", arr));
out:
    free(al);
    return rc;
}

int tv__api_h_alias_put(tv__api_ctx *c)
{
    static const char *const fields[] = {"generation", NULL};
    tv__store *st;
    json_t *body = NULL;
    int64_t number = 0;
    const char *model = c->param[0], *alias = c->param[1];
    int rc;
    if ((rc = tv__api_query_allow(c, NO_FIELDS)) || (rc = tv__api_body(c, fields, false, &body)) ||
        (rc = tv__api_field_int(c, body, "generation", true, &number)))
        goto out;
    if (number < 1) {
        rc = tv__seterr(&c->err, TV_E_BAD_REQUEST,
                        "field 'generation' must be a generation number from 1");
        goto out;
    }
    bool active = !strcmp(alias, "active");
    if (!active && (rc = tv__alias_name_valid(alias, &c->err)))
        goto out;
    if ((rc = tv__api_writer_lock(c, &st)))
        goto out;
    rc = active ? tv__store_activate(st, model, number, &c->err)
                : tv__store_alias_set(st, model, alias, number, &c->err);
    tv__api_writer_unlock(c);
    if (!rc)
        rc = tv__api_reply(c, 200, tv__api_alias_json(model, alias, number));
out:
    json_decref(body);
    return rc;
}

int tv__api_h_alias_delete(tv__api_ctx *c)
{
    tv__store *st;
    int64_t number = 0;
    const char *model = c->param[0], *alias = c->param[1];
    int rc;
    if ((rc = tv__api_query_allow(c, NO_FIELDS)) || (rc = no_body(c)))
        return rc;
    if (!strcmp(alias, "active"))
        return tv__seterr(
            &c->err, TV_E_BAD_REQUEST,
            "the 'active' alias of '%s' cannot be removed: activate another generation instead",
            model);
    if ((rc = tv__api_writer_lock(c, &st)))
        return rc;
    rc = tv__store_alias_remove(st, model, alias, &number, &c->err);
    tv__api_writer_unlock(c);
    return rc ? rc : tv__api_reply(c, 200, tv__api_alias_json(model, alias, number));
}

/* ---- tensors ---------------------------------------------------------------- */

/* order=size's cursor key: "NBYTES:NAME" (NBYTES canonical decimal). */
static int size_cursor_parse(tv__api_ctx *c, char *key, uint64_t *nbytes, const char **name)
{
    char *colon = key ? strchr(key, ':') : NULL;
    int64_t v = 0;
    if (!colon || !colon[1])
        goto bad;
    *colon = '\0';
    bool ok = !strcmp(key, "0") || tv__parse_pos_i64(key, &v);
    *colon = ':';
    if (!ok)
        goto bad;
    *nbytes = (uint64_t)v;
    *name = colon + 1;
    return 0;
bad:
    return tv__seterr(&c->err, TV_E_BAD_REQUEST,
                      "malformed cursor (pass next_cursor of the previous page as it is)");
}

int tv__api_h_tensors(tv__api_ctx *c)
{
    static const char *const q[] = {"limit", "cursor", "prefix", "order", NULL};
    static const char kinds[] = {
        [TV__REG_TENSORS_FILE] = 'f', [TV__REG_TENSORS_NAME] = 'n', [TV__REG_TENSORS_SIZE] = 's'};
    tv__reg *reg;
    tv__reg_generation g;
    tv__reg_tensor_row *rows = NULL;
    size_t limit, n = 0, kl = 0;
    char *after = NULL, *key = NULL;
    const char *after_name = NULL;
    int64_t after_id = 0;
    uint64_t after_nbytes = 0;
    bool more = false;
    tv__reg_tensor_order ord = TV__REG_TENSORS_FILE;
    json_t *arr = NULL;
    int rc;
    if ((rc = tv__api_query_allow(c, q)) || (rc = tv__api_query_limit(c, &limit)))
        goto out;
    const char *order = tv__api_query(c, "order");
    if (order && strcmp(order, "file") && strcmp(order, "name") && strcmp(order, "size")) {
        rc = tv__seterr(&c->err, TV_E_BAD_REQUEST, "bad order '%.40s': file, name or size", order);
        goto out;
    }
    if (order && !strcmp(order, "name"))
        ord = TV__REG_TENSORS_NAME;
    else if (order && !strcmp(order, "size"))
        ord = TV__REG_TENSORS_SIZE;
    if ((rc = tv__api_cursor_get(c, kinds[ord], &after, &kl)))
        goto out;
    if (after && ord == TV__REG_TENSORS_FILE && !tv__parse_pos_i64(after, &after_id)) {
        rc = tv__seterr(&c->err, TV_E_BAD_REQUEST,
                        "malformed cursor (pass next_cursor of the previous page as it is)");
        goto out;
    }
    if (ord == TV__REG_TENSORS_NAME)
        after_name = after ? after : "";
    if (after && ord == TV__REG_TENSORS_SIZE &&
        (rc = size_cursor_parse(c, after, &after_nbytes, &after_name)))
        goto out;
    const char *prefix = tv__api_query(c, "prefix");
    if ((rc = tv__api_reader(c, &reg)) ||
        (rc = tv__api_gen_row(c, reg, c->param[0], c->param[1], &g)) ||
        (rc = tv__reg_tensors_page(reg, g.id, prefix, ord, after_id, after_nbytes, after_name,
                                   limit, &rows, &n, &more, &c->err)))
        goto out;
    arr = json_array();
    for (size_t i = 0; !rc && i < n; i++)
        if (json_array_append_new(arr, tv__api_tensor_json(&rows[i], NULL)))
            rc = tv__seterr(&c->err, -ENOMEM, "out of memory");
    if (!rc) {
        json_t *next;
        if (ord == TV__REG_TENSORS_NAME) {
            next = cursor_json(more && n, 'n', n ? rows[n - 1].name : "",
                               n ? strlen(rows[n - 1].name) : 0);
        } else if (ord == TV__REG_TENSORS_SIZE) {
            size_t klen = 0;
            int ll = 0;
            if (more && n) {
                const tv__reg_tensor_row *t = &rows[n - 1];
                if (__builtin_add_overflow(strlen(t->name), (size_t)24, &klen) ||
                    !(key = malloc(klen)))
                    rc = tv__seterr(&c->err, -ENOMEM, "out of memory");
                else
                    ll = snprintf(key, klen, "%" PRIu64 ":%s", t->end_off - t->begin_off, t->name);
            }
            next = cursor_json(more && n && !rc, 's', key ? key : "", (size_t)ll);
        } else {
            char last[24];
            int ll = snprintf(last, sizeof last, "%" PRId64, n ? rows[n - 1].row_id : 0);
            next = cursor_json(more && n, 'f', last, (size_t)ll);
        }
        if (rc) {
            json_decref(next);
        } else {
            rc =
                tv__api_reply(c, 200,
                              json_pack("{s:s,s:I,s:o,s:o}", "model", g.model, "generation",
                                        (json_int_t)g.number, "tensors", arr, "next_cursor", next));
            arr = NULL;
        }
    }
out:
    json_decref(arr);
    tv__reg_tensor_rows_free(rows, n);
    free(after);
    free(key);
    return rc;
}

int tv__api_h_tensor(tv__api_ctx *c)
{
    tv__reg *reg;
    tv__reg_generation g;
    json_t *doc = NULL;
    int rc;
    if ((rc = tv__api_query_allow(c, NO_FIELDS)) || (rc = tv__api_reader(c, &reg)) ||
        (rc = tv__api_gen_row(c, reg, c->param[0], c->param[1], &g)) ||
        (rc = tv__api_tensor_doc(c, reg, &g, c->param[2], &doc)))
        return rc;
    return tv__api_reply(c, 200, doc);
}

/* ---- gc and tokens ---------------------------------------------------------- */

int tv__api_h_gc(tv__api_ctx *c)
{
    tv__store *st;
    size_t n = 0;
    uint64_t bytes = 0;
    int rc;
    if ((rc = tv__api_query_allow(c, NO_FIELDS)) || (rc = no_body(c)) ||
        (rc = tv__api_writer_lock(c, &st)))
        return rc;
    tv__api_models_release(c->api, NULL);
    rc = tv__store_gc(st, &n, &bytes, &c->err);
    tv__api_shards_forget(c->api);
    tv__api_writer_unlock(c);
    return rc ? rc
              : tv__api_reply(c, 200,
                              json_pack("{s:I,s:I}", "n_objects_freed", (json_int_t)n,
                                        "freed_bytes", (json_int_t)bytes));
}

int tv__api_h_tokens(tv__api_ctx *c)
{
    tv__reg *reg;
    tv__reg_token *ts = NULL;
    size_t n = 0;
    int rc;
    if ((rc = tv__api_query_allow(c, NO_FIELDS)) || (rc = tv__api_reader(c, &reg)) ||
        (rc = tv__reg_tokens_list(reg, &ts, &n, &c->err)))
        goto out;
    json_t *arr = json_array();
    for (size_t i = 0; !rc && i < n; i++)
        if (json_array_append_new(arr, tv__api_token_json(&ts[i])))
            rc = tv__seterr(&c->err, -ENOMEM, "out of memory");
    if (rc)
        json_decref(arr);
    else
        rc = tv__api_reply(c, 200, json_pack("{s:o}", "tokens", arr));
out:
    free(ts);
    return rc;
}

int tv__api_h_token_create(tv__api_ctx *c)
{
    static const char *const fields[] = {"name", "scope", NULL};
    tv__store *st;
    json_t *body = NULL, *doc = NULL;
    const char *name = NULL, *scope_s = NULL;
    char secret[69];
    tv__reg_token t;
    int rc;
    if ((rc = tv__api_query_allow(c, NO_FIELDS)) || (rc = tv__api_body(c, fields, false, &body)) ||
        (rc = tv__api_field_str(c, body, "name", true, &name)) ||
        (rc = tv__api_field_str(c, body, "scope", true, &scope_s)))
        goto out;
    tv__scope scope = TV__SCOPE_NONE;
    if (tv__scope_parse(scope_s, &scope)) {
        rc = tv__seterr(&c->err, TV_E_BAD_REQUEST,
                        "field 'scope' must be \"admin\", \"read\" or \"fleet\"");
        goto out;
    }
    if ((rc = tv__api_writer_lock(c, &st)))
        goto out;
    rc = tv__reg_token_create(st->reg, name, scope, secret, &t, &c->err);
    tv__api_writer_unlock(c);
    if (rc)
        goto out;
    doc = tv__api_token_json(&t);
    if (doc && json_object_set_new(doc, "token", tv__api_jstr(secret))) {
        json_decref(doc);
        doc = NULL;
    }
    rc = tv__api_reply(c, 201, doc);
out:
    memset(secret, 0, sizeof secret);
    json_decref(body);
    return rc;
}

int tv__api_h_token_revoke(tv__api_ctx *c)
{
    tv__store *st;
    tv__reg_token t;
    int64_t id = 0;
    int rc;
    if ((rc = tv__api_query_allow(c, NO_FIELDS)) || (rc = no_body(c)) ||
        (rc = path_id(c, 0, "token id", &id)) || (rc = tv__api_writer_lock(c, &st)))
        return rc;
    rc = tv__reg_token_revoke(st->reg, id, &t, &c->err);
    tv__api_writer_unlock(c);
    return rc ? rc : tv__api_reply(c, 200, tv__api_token_json(&t));
}

/* Sessions show pids, uids and models: a peer sees its own (same uid), a
 * read token those whose every open model it may read, admin all. */
static bool session_visible(tv__api_ctx *c, const tv__fp_session_info *s)
{
    if (tv__api_sees_all(c))
        return true;
    if (!c->has_token)
        return c->req->peer && c->req->peer->local && c->req->peer->uid == s->uid;
    for (size_t h = 0; h < s->n_handles; h++)
        if (!tv__api_can_read(c, s->handles[h].model))
            return false;
    return s->n_handles > 0;
}

/* GET /v1/sessions: the fast path's live sessions (none when it is off),
 * those the peer may see. */
int tv__api_h_sessions(tv__api_ctx *c)
{
    static const char *const q[] = {NULL};
    tv__fp_session_info *ss = NULL;
    size_t n = 0;
    json_t *arr = NULL;
    int rc;
    if ((rc = tv__api_query_allow(c, q)))
        return rc;
    if (c->api->fp && (rc = tv__fp_sessions(c->api->fp, &ss, &n)))
        return tv__seterr(&c->err, rc, "fast-path sessions: %s", strerror(-rc));
    if (!(arr = json_array()))
        rc = tv__seterr(&c->err, -ENOMEM, "out of memory");
    for (size_t i = 0; !rc && i < n; i++)
        if (session_visible(c, &ss[i]) && json_array_append_new(arr, tv__api_session_json(&ss[i])))
            rc = tv__seterr(&c->err, -ENOMEM, "out of memory");
    tv__fp_sessions_free(ss, n);
    if (rc) {
        json_decref(arr);
        return rc;
    }
    return tv__api_reply(c, 200, json_pack("{s:o}", "sessions", arr));
}
