/* Fleet routes (docs/fleet.md): GET /v1/fleet shows the fleet as the
 * fleet thread last read it (never waits on PostgreSQL); PUT
 * /v1/fleet/aliases/{name}/{alias} moves a fleet alias in the catalog
 * (compare-and-set on its version: the loser of two moves gets 409).
 *
 * Invariants:
 *   - a standalone node (no fleet.postgres) answers GET with mode
 *     "standalone" and refuses PUT with 409 (TV_E_STATE), naming the key;
 *   - an alias move runs on the fleet's alias-move thread (fleet/mover.h)
 *     with its own brief catalog connection: the request is answered
 *     later (tv__api_later), so no HTTP thread waits on PostgreSQL, and a
 *     move the catalog does not settle within MOVE_TIMEOUT_MS is answered
 *     503 (saying whether it may still have happened);
 *   - nothing local changes here: every node (this one too) switches when
 *     its fleet thread sees the placement ready. */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fleet/catalog.h"
#include "fleet/fleet.h"
#include "fleet/mover.h"
#include "http/api_internal.h"
#include "import/import.h"
#include "util/internal.h"

#define PLACEMENT_MAX   256
#define MOVE_TIMEOUT_MS 5000

/* The alias-move thread's callbacks; ctx is the later answer. */
typedef struct move_ctx {
    tv__api_later *later;
    char model[256], alias[256];
    json_t *placement; /* the body's (a reference) or null */
    int64_t generation;
} move_ctx;

static bool move_claim(void *ctx)
{
    move_ctx *m = ctx;
    if (tv__api_later_claim(m->later))
        return true;
    json_decref(m->placement);
    free(m);
    return false;
}

static void move_done(void *ctx, int rc, int64_t version, const tv_error *err)
{
    move_ctx *m = ctx;
    if (rc) {
        tv__api_later_finish(m->later, 0, NULL, rc, err->msg[0] ? err->msg : tv_strerror(rc));
    } else {
        tv__log(TV_LOG_INFO,
                "fleet: alias '%s' of model '%s' moved to generation %lld (version %lld)", m->alias,
                m->model, (long long)m->generation, (long long)version);
        json_t *doc = json_pack("{s:s, s:s, s:I, s:I, s:O}", "model", m->model, "alias", m->alias,
                                "generation", (json_int_t)m->generation, "version",
                                (json_int_t)version, "placement", m->placement);
        tv__api_later_finish(m->later, doc ? 200 : 0, doc, doc ? 0 : -ENOMEM, "out of memory");
    }
    json_decref(m->placement);
    free(m);
}

void tv__api_set_fleet(tv__api *api, struct tv__fleet *fleet)
{
    if (api)
        atomic_store(&api->fleet, fleet);
}

int tv__api_h_fleet(tv__api_ctx *c)
{
    static const char *const NONE[] = {NULL};
    int rc;
    if ((rc = tv__api_query_allow(c, NONE)))
        return rc;
    json_t *doc = tv__fleet_status(atomic_load(&c->api->fleet));
    if (!doc)
        return tv__seterr(&c->err, -ENOMEM, "out of memory");
    /* the aliases and generations of models the peer may not read are left out */
    static const char *const per_model[] = {"aliases", "generations"};
    for (size_t k = 0; k < TV_ARRAY_LEN(per_model) && !tv__api_sees_all(c); k++) {
        json_t *arr = json_object_get(doc, per_model[k]);
        for (size_t i = json_array_size(arr); i-- > 0;) {
            const char *m = json_string_value(json_object_get(json_array_get(arr, i), "model"));
            if (!m || !tv__api_can_read(c, m))
                json_array_remove(arr, i);
        }
    }
    if (!atomic_load(&c->api->fleet) && c->api->fleet_conninfo)
        json_object_set_new(doc, "mode", json_string("starting"));
    return tv__api_reply(c, 200, doc);
}

int tv__api_h_fleet_alias_put(tv__api_ctx *c)
{
    static const char *const NONE[] = {NULL};
    static const char *const fields[] = {"generation", "expect_version", "placement",
                                         "quorum",     "timeout_s",      NULL};
    const char *model = c->param[0], *alias = c->param[1];
    const char *place[PLACEMENT_MAX + 1] = {0};
    json_t *body = NULL;
    int64_t number = 0, expect = 0, quorum = 0, timeout = 0;
    int rc;
    if ((rc = tv__api_query_allow(c, NONE)) || (rc = tv__api_body(c, fields, false, &body)) ||
        (rc = tv__api_field_int(c, body, "generation", true, &number)) ||
        (rc = tv__api_field_int(c, body, "expect_version", true, &expect)) ||
        (rc = tv__api_field_int(c, body, "quorum", false, &quorum)) ||
        (rc = tv__api_field_int(c, body, "timeout_s", false, &timeout)))
        goto out;
    if (number < 1 || expect < 0 || quorum < 0 || quorum > 4096 || timeout < 0 || timeout > 86400) {
        rc = tv__seterr(
            &c->err, TV_E_BAD_REQUEST,
            "generation must be from 1, expect_version from 0 (0: a new alias), quorum 0..4096 (0: every placed node) and timeout_s 0..86400 (0: 600)");
        goto out;
    }
    if ((rc = tv__name_valid(model, "model name", &c->err)) ||
        (strcmp(alias, "active") && (rc = tv__alias_name_valid(alias, &c->err))))
        goto out;
    json_t *pl = json_object_get(body, "placement");
    if (pl && !json_is_null(pl)) {
        size_t i;
        json_t *v;
        if (!json_is_array(pl) || json_array_size(pl) == 0 || json_array_size(pl) > PLACEMENT_MAX) {
            rc = tv__seterr(
                &c->err, TV_E_BAD_REQUEST,
                "field 'placement' must be null (every node) or a list of 1 to %d node names",
                PLACEMENT_MAX);
            goto out;
        }
        json_array_foreach(pl, i, v)
        {
            const char *n = json_string_value(v);
            if (!n || !n[0] || strlen(n) > 255) {
                rc = tv__seterr(&c->err, TV_E_BAD_REQUEST,
                                "placement[%zu] must be a node name (1 to 255 bytes)", i);
                goto out;
            }
            place[i] = n;
        }
    }
    if (!c->api->fleet_conninfo || !c->api->mover) {
        rc = tv__seterr(
            &c->err, TV_E_STATE,
            "this node is standalone (fleet.postgres is not set): fleet aliases live in the fleet catalog");
        goto out;
    }
    move_ctx *m = calloc(1, sizeof *m);
    if (!m ||
        !tv__api_later_new(
            c, MOVE_TIMEOUT_MS,
            "the fleet catalog did not take the alias move within 5 s: the alias did not move (try again)",
            "the fleet catalog did not answer the alias move within 5 s: the alias may have moved (GET /v1/fleet shows it)")) {
        free(m);
        rc = tv__seterr(&c->err, -ENOMEM, "out of memory");
        goto out;
    }
    snprintf(m->model, sizeof m->model, "%s", model);
    snprintf(m->alias, sizeof m->alias, "%s", alias);
    m->generation = number;
    m->later = c->resp->later;
    /* a copy: the body is freed on this thread while the mover renders */
    m->placement = pl && json_is_array(pl) ? json_deep_copy(pl) : json_null();
    tv__mover_req req = {.move = {.model = model,
                                  .alias = alias,
                                  .generation = number,
                                  .placement = place[0] ? place : NULL,
                                  .expect_version = expect,
                                  .quorum = (int)quorum,
                                  .timeout_s = (int)timeout},
                         .claim = move_claim,
                         .done = move_done,
                         .ctx = m};
    if ((rc = tv__mover_submit(c->api->mover, &req, &c->err))) {
        tv__api_later_discard(c);
        json_decref(m->placement);
        free(m);
    }
out:
    json_decref(body);
    return rc;
}
