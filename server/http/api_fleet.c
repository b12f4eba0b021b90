/* Fleet routes (issue 13, docs/fleet.md): GET /v1/fleet shows the fleet as
 * the fleet thread last read it (never waits on PostgreSQL); PUT
 * /v1/fleet/aliases/{name}/{alias} moves a fleet alias in the catalog
 * (compare-and-set on its version: the loser of two moves gets 409).
 *
 * Invariants:
 *   - a standalone node (no fleet.postgres) answers GET with mode
 *     "standalone" and refuses PUT with 409 (TV_E_STATE), naming the key;
 *   - an alias move connects to the catalog for this request only (connect
 *     timeout 5 s): HTTP threads never share the fleet thread's connection;
 *   - nothing local changes here: every node (this one too) switches when
 *     its fleet thread sees the placement ready. */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fleet/catalog.h"
#include "fleet/fleet.h"
#include "http/api_internal.h"
#include "import/import.h"
#include "util/internal.h"

#define PLACEMENT_MAX 256

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
    tv__catalog *cat = NULL;
    int64_t number = 0, expect = 0, quorum = 0, timeout = 0, now = 0;
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
    if (!c->api->fleet_conninfo) {
        rc = tv__seterr(
            &c->err, TV_E_STATE,
            "this node is standalone (fleet.postgres is not set): fleet aliases live in the fleet catalog");
        goto out;
    }
    if ((rc = tv__catalog_open(c->api->fleet_conninfo, &cat, &c->err))) {
        if (rc == -ECONNREFUSED)
            rc = tv__seterr(&c->err, TV_E_BUSY, "%s (the alias did not move; try again)",
                            c->err.msg);
        goto out;
    }
    tv__catalog_alias_move m = {.model = model,
                                .alias = alias,
                                .generation = number,
                                .placement = place[0] ? place : NULL,
                                .expect_version = expect,
                                .quorum = (int)quorum,
                                .timeout_s = (int)timeout};
    if ((rc = tv__catalog_move_alias(cat, &m, &now, &c->err))) {
        if (rc == -ECONNREFUSED)
            rc = tv__seterr(&c->err, TV_E_BUSY, "%s (try again)", c->err.msg);
        goto out;
    }
    tv__log(TV_LOG_INFO, "fleet: alias '%s' of model '%s' moved to generation %lld (version %lld)",
            alias, model, (long long)number, (long long)now);
    rc = tv__api_reply(c, 200,
                       json_pack("{s:s, s:s, s:I, s:I, s:O}", "model", model, "alias", alias,
                                 "generation", (json_int_t)number, "version", (json_int_t)now,
                                 "placement", pl && json_is_array(pl) ? pl : json_null()));
out:
    tv__catalog_close(cat);
    json_decref(body);
    return rc;
}
