/* The model routes: the list, one model, its deletion, and deactivation.
 * Invariants: a model's active generation is the one readers open
 * (tv__api_settled); a listing shows only models the peer may read (a page
 * may come out short, its cursor still moves on); delete and deactivate
 * run on the writer under its mutex and answer from the writer's
 * registry, so the answer shows the change. */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "http/api_internal.h"
#include "registry/notes.h"
#include "store/snapbuild.h"
#include "util/internal.h"

static const char *const NO_FIELDS[] = {NULL};
static const char *const MODELS_Q[] = {"limit", "cursor", "tag", NULL};

/* ?tag=KEY=VALUE: the key, checked, and the value (the first '=' splits). */
static int tag_filter(tv__api_ctx *c, char *key, size_t cap, const char **value)
{
    const char *t = tv__api_query(c, "tag");
    *value = NULL;
    if (!t)
        return 0;
    const char *eq = strchr(t, '=');
    if (!eq || (size_t)(eq - t) >= cap)
        return tv__seterr(&c->err, TV_E_BAD_REQUEST,
                          "tag: '%.100s' is not KEY=VALUE (a key of 1..64 bytes)", t);
    memcpy(key, t, (size_t)(eq - t));
    key[eq - t] = '\0';
    int rc = tv__notes_check_tag_key(key, &c->err);
    if (rc)
        return tv__seterr(&c->err, TV_E_BAD_REQUEST, "%s", c->err.msg);
    *value = eq + 1;
    return 0;
}

static json_t *model_doc(tv__api_ctx *c, tv__reg *reg, const tv__reg_model *m, int *rc)
{
    tv__reg_alias *al = NULL;
    size_t na = 0;
    tv__reg_model ms = *m;
    if ((*rc = tv__api_settled(c, m->name, m->active_generation, &ms.active_generation)) ||
        (*rc = tv__api_aliases(c, reg, m->name, &al, &na)))
        return NULL;
    json_t *j = tv__api_model_json(&ms, al, na);
    free(al);
    if ((*rc = tv__api_notes_put(c, reg, j, m->name, 0))) {
        json_decref(j);
        return NULL;
    }
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
    char tag_key[TV__NOTES_TAG_KEY_MAX + 1];
    const char *tag_value = NULL;
    if ((rc = tv__api_query_allow(c, MODELS_Q)) || (rc = tv__api_query_limit(c, &limit)) ||
        (rc = tag_filter(c, tag_key, sizeof tag_key, &tag_value)) ||
        (rc = tv__api_cursor_get(c, 'm', &after, &kl)) || (rc = tv__api_reader(c, &reg)) ||
        (rc = tv__reg_models_page(reg, after ? after : "", limit, &ms, &n, &more, &c->err)))
        goto out;
    arr = json_array();
    for (size_t i = 0; !rc && i < n; i++) {
        if (!tv__api_can_read(c, ms[i].name))
            continue; /* a page may come out short: the cursor still moves on */
        bool has = true;
        if (tag_value &&
            (rc = tv__reg_notes_has_tag(reg, ms[i].name, 0, tag_key, tag_value, &has, &c->err)))
            break;
        if (!has)
            continue; /* the same */
        json_t *j = model_doc(c, reg, &ms[i], &rc);
        if (!rc && json_array_append_new(arr, j))
            rc = tv__seterr(&c->err, -ENOMEM, "out of memory");
    }
    if (!rc) {
        const char *last = n ? ms[n - 1].name : "";
        rc = tv__api_reply(c, 200,
                           json_pack("{s:o,s:o}", "models", arr, "next_cursor",
                                     tv__api_cursor_json(more && n, 'm', last, strlen(last))));
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
    if ((rc = tv__api_query_allow(c, NO_FIELDS)) || (rc = tv__api_no_body(c)) ||
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
    if ((rc = tv__api_query_allow(c, NO_FIELDS)) || (rc = tv__api_no_body(c)) ||
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
