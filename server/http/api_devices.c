/* The device routes: GET /v1/devices, /v1/devices/{id} (each with its
 * space and its status now) and /v1/devices/{id}/extents (the map of its
 * region).
 * Invariants: a device's status comes from opening it through a fresh
 * reader store (tv__store_device_status), so a device that went missing
 * since is reported, not a cached handle; an extent map shows the users of
 * an object only for models the peer may read. */
#include <errno.h>
#include <stdlib.h>

#include "http/api_internal.h"
#include "util/internal.h"

static const char *const NO_FIELDS[] = {NULL};

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
    if ((rc = tv__api_query_allow(c, NO_FIELDS)) ||
        (one && (rc = tv__api_path_id(c, 0, "device id", &id))))
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
    if ((rc = tv__api_query_allow(c, NO_FIELDS)) ||
        (rc = tv__api_path_id(c, 0, "device id", &id)) || (rc = tv__api_reader(c, &reg)) ||
        (rc = tv__reg_device_objects_get(reg, id, &m, &c->err)))
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
