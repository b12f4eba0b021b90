/* The token routes (admin only): the list, a new token (its secret is in
 * that answer only, never stored: the registry keeps its hash) and revoke.
 * Invariants: the secret is wiped from the stack once answered; a token's
 * name is printable ASCII, so its length in bytes is its length in
 * characters (what the schema's maxLength counts). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "http/api_internal.h"
#include "util/internal.h"

static const char *const NO_FIELDS[] = {NULL};

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

/* A token's name: 1 to 255 printable ASCII characters (bytes and
 * characters are then one; docs/openapi.yaml TokenCreateRequest says the
 * same as a pattern). */
static int name_rule(tv__api_ctx *c, const char *name)
{
    size_t n = strlen(name);
    if (n < 1 || n > TV__REG_NAME_MAX)
        return tv__seterr(&c->err, TV_E_BAD_REQUEST,
                          "field 'name' must be 1 to %d printable ASCII characters",
                          TV__REG_NAME_MAX);
    for (size_t i = 0; i < n; i++)
        if (name[i] < 0x20 || name[i] > 0x7e)
            return tv__seterr(
                &c->err, TV_E_BAD_REQUEST,
                "field 'name' has byte 0x%02x at %zu: a token's name is printable ASCII (space to '~')",
                (unsigned char)name[i], i);
    return 0;
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
    if ((rc = name_rule(c, name)))
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
    if ((rc = tv__api_query_allow(c, NO_FIELDS)) || (rc = tv__api_no_body(c)) ||
        (rc = tv__api_path_id(c, 0, "token id", &id)) || (rc = tv__api_writer_lock(c, &st)))
        return rc;
    rc = tv__reg_token_revoke(st->reg, id, &t, &c->err);
    tv__api_writer_unlock(c);
    return rc ? rc : tv__api_reply(c, 200, tv__api_token_json(&t));
}
