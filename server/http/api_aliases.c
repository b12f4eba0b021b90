/* The alias routes of one model: the list, PUT (an alias at a generation;
 * "active" activates it) and DELETE ("active" is refused: activate another
 * generation instead).
 * Invariant: registry row and pointer file change together on the writer
 * (tv__store_alias_set / _remove), under its mutex. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "http/api_internal.h"
#include "store/snapbuild.h"
#include "util/internal.h"

static const char *const NO_FIELDS[] = {NULL};

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
    if ((rc = tv__api_query_allow(c, NO_FIELDS)) || (rc = tv__api_no_body(c)))
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
