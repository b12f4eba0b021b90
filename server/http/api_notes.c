/* The notes routes: PATCH /v1/models/{name} and PATCH
 * /v1/models/{name}/generations/{gen} change a description and tags
 * ({"description": "...", "tags": {"k": "v", "gone": null}}: a string sets
 * a tag, null removes it, tags not named stay).
 * Invariants: the body is checked whole (types, then the limits of
 * registry/notes.h, 400 naming the field) before the writer is taken; the
 * change and its event are one transaction on the writer, and the answer
 * (the Model or the Generation) is read from the writer inside the same
 * lock, so it shows the change. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "http/api_internal.h"
#include "registry/notes.h"

static const char *const NO_FIELDS[] = {NULL};
static const char *const NOTES_FIELDS[] = {"description", "tags", NULL};

/* The body's description (NULL: absent) and tags patch (NULL: absent). */
static int notes_body(tv__api_ctx *c, json_t **body, const char **desc, const json_t **tags)
{
    int rc;
    *desc = NULL;
    *tags = NULL;
    if ((rc = tv__api_query_allow(c, NO_FIELDS)) ||
        (rc = tv__api_body(c, NOTES_FIELDS, false, body)))
        return rc;
    json_t *d = json_object_get(*body, "description"), *t = json_object_get(*body, "tags");
    if (d && !json_is_string(d))
        return tv__seterr(&c->err, TV_E_BAD_REQUEST, "description: must be a string");
    if (t && !json_is_object(t))
        return tv__seterr(&c->err, TV_E_BAD_REQUEST,
                          "tags: must be an object of KEY: \"value\" (or null to remove a tag)");
    if (!d && !t)
        return tv__seterr(&c->err, TV_E_BAD_REQUEST,
                          "the body names neither description nor tags: nothing to change");
    if (d &&
        (rc = tv__notes_check_description(json_string_value(d), json_string_length(d), &c->err)))
        return rc;
    if (t) {
        /* every key and value now; the count against the stored tags in the
         * registry's transaction */
        json_t *scratch = json_object();
        rc = scratch ? tv__notes_apply_tags(scratch, t, &c->err)
                     : tv__seterr(&c->err, -ENOMEM, "out of memory");
        json_decref(scratch);
        if (rc)
            return rc;
    }
    *desc = d ? json_string_value(d) : NULL;
    *tags = t;
    return 0;
}

int tv__api_h_model_patch(tv__api_ctx *c)
{
    json_t *body = NULL, *doc = NULL;
    const char *desc;
    const json_t *tags;
    tv__store *st;
    tv__reg_model m;
    tv__reg_alias *al = NULL;
    size_t na = 0;
    int rc;
    if ((rc = notes_body(c, &body, &desc, &tags)) || (rc = tv__api_writer_lock(c, &st)))
        goto out;
    const char *model = c->param[0];
    if (!(rc = tv__reg_notes_update(st->reg, model, 0, desc, tags, &c->err)) &&
        !(rc = tv__reg_model_get(st->reg, model, &m, &c->err)) &&
        !(rc = tv__api_settled(c, model, m.active_generation, &m.active_generation)) &&
        !(rc = tv__api_aliases(c, st->reg, model, &al, &na))) {
        doc = tv__api_model_json(&m, al, na);
        rc = tv__api_notes_put(c, st->reg, doc, model, 0);
    }
    tv__api_writer_unlock(c);
    if (!rc) {
        rc = tv__api_reply(c, 200, doc);
        doc = NULL;
    }
out:
    json_decref(doc);
    json_decref(body);
    free(al);
    return rc;
}

int tv__api_h_generation_patch(tv__api_ctx *c)
{
    json_t *body = NULL, *doc = NULL;
    const char *desc;
    const json_t *tags;
    tv__store *st;
    tv__reg_generation g;
    tv__reg_alias *al = NULL;
    size_t na = 0;
    int64_t number = 0, active = 0;
    int rc;
    if ((rc = notes_body(c, &body, &desc, &tags)) || (rc = tv__api_writer_lock(c, &st)))
        goto out;
    const char *model = c->param[0];
    if (!(rc = tv__api_gen(c, st->reg, model, c->param[1], &number)) &&
        !(rc = tv__reg_notes_update(st->reg, model, number, desc, tags, &c->err)) &&
        !(rc = tv__reg_generation_get(st->reg, model, number, &g, &c->err)) &&
        !(rc = tv__api_aliases(c, st->reg, model, &al, &na)) &&
        !(rc = tv__api_settled(c, model, g.active ? g.number : 0, &active))) {
        g.active = g.number == active;
        doc = tv__api_generation_json(&g, al, na, NULL);
        rc = tv__api_notes_put(c, st->reg, doc, model, number);
    }
    tv__api_writer_unlock(c);
    if (!rc) {
        rc = tv__api_reply(c, 200, doc);
        doc = NULL;
    }
out:
    json_decref(doc);
    json_decref(body);
    free(al);
    return rc;
}
