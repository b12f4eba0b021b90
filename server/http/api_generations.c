/* The generation routes: the list, one generation (with its shards),
 * activate, retire and rollback.
 * Invariants: a generation spec is a number, an alias or "active"
 * (tv__api_gen); a change runs on the writer under its mutex and the
 * answer is read from the writer's registry inside the same lock, so it
 * shows the change. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http/api_internal.h"
#include "registry/notes.h"
#include "store/snapbuild.h"
#include "util/internal.h"

static const char *const NO_FIELDS[] = {NULL};
static const char *const PAGE_Q[] = {"limit", "cursor", NULL};

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
        (rc = tv__api_settled(c, model, g.active ? g.number : 0, &active)))
        goto out;
    g.active = g.number == active;
    doc = tv__api_generation_json(&g, al, na, NULL);
    if ((rc = tv__api_notes_put(c, reg, doc, model, g.number))) {
        json_decref(doc);
        goto out;
    }
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
        (rc = tv__api_settled(c, c->param[0], m.active_generation, &m.active_generation)))
        goto out;
    for (size_t i = 0; i < n; i++)
        gs[i].active = gs[i].number == m.active_generation;
    arr = json_array();
    for (size_t i = 0; !rc && i < n; i++) {
        json_t *g = tv__api_generation_json(&gs[i], al, na, NULL);
        if ((rc = tv__api_notes_put(c, reg, g, c->param[0], gs[i].number)))
            json_decref(g);
        else if (json_array_append_new(arr, g))
            rc = tv__seterr(&c->err, -ENOMEM, "out of memory");
    }
    if (!rc) {
        char last[24];
        int ll = snprintf(last, sizeof last, "%" PRId64, n ? gs[n - 1].number : 0);
        rc = tv__api_reply(c, 200,
                           json_pack("{s:s,s:o,s:o}", "model", c->param[0], "generations", arr,
                                     "next_cursor",
                                     tv__api_cursor_json(more && n, 'g', last, (size_t)ll)));
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
    if ((rc = tv__api_query_allow(c, NO_FIELDS)) || (rc = tv__api_no_body(c)) ||
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
    if ((rc = tv__api_query_allow(c, NO_FIELDS)) || (rc = tv__api_no_body(c)) ||
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
