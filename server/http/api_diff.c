/* The diff route: GET /v1/models/{name}/diff?from=A&to=B[&to_model=OTHER]
 * compares two generations (of one model, or of two): tensors added,
 * removed, changed in dtype or shape, changed in content, the unchanged
 * count (registry/notes.h, tv__diff_tensors_json, says how content is
 * compared), and the generations' sidecar files added, removed and changed
 * (tv__reg_files_diff).
 * Invariants: the peer may read both models ([access]; the router checked
 * the first); a generation's tensors never change once it is ready, so two
 * reads compare what each generation holds. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "http/api_internal.h"
#include "registry/notes.h"

static const char *const DIFF_Q[] = {"from", "to", "to_model", NULL};

static json_t *side_json(const char *model, int64_t number)
{
    return json_pack("{s:s,s:I}", "model", model, "generation", (json_int_t)number);
}

int tv__api_h_diff(tv__api_ctx *c)
{
    tv__reg *reg;
    tv__reg_generation ga, gb;
    tv__reg_diff_tensor *ta = NULL, *tb = NULL;
    size_t na = 0, nb = 0;
    int64_t from = 0, to = 0;
    json_t *doc = NULL, *files = NULL;
    int rc;
    if ((rc = tv__api_query_allow(c, DIFF_Q)))
        return rc;
    const char *model = c->param[0], *fs = tv__api_query(c, "from"), *ts = tv__api_query(c, "to"),
               *other = tv__api_query(c, "to_model");
    if (!fs || !*fs || !ts || !*ts)
        return tv__seterr(&c->err, TV_E_BAD_REQUEST,
                          "from and to: both are needed (a generation number, an alias or active)");
    if (!other || !*other)
        other = model;
    else if ((rc = tv__api_may_read(c, other)))
        return rc;
    if ((rc = tv__api_reader(c, &reg)))
        return rc;
    if ((rc = tv__api_gen(c, reg, model, fs, &from)) ||
        (rc = tv__api_gen(c, reg, other, ts, &to)) ||
        (rc = tv__reg_generation_get(reg, model, from, &ga, &c->err)) ||
        (rc = tv__reg_generation_get(reg, other, to, &gb, &c->err)) ||
        (rc = tv__reg_diff_tensors(reg, ga.id, &ta, &na, &c->err)) ||
        (rc = tv__reg_diff_tensors(reg, gb.id, &tb, &nb, &c->err)))
        goto out;
    if ((rc = tv__reg_files_diff(reg, ga.id, gb.id, &files, &c->err)))
        goto out;
    if (!(doc = tv__diff_tensors_json(ta, na, tb, nb))) {
        rc = tv__seterr(&c->err, -ENOMEM, "out of memory");
        goto out;
    }
    int bad = json_object_set_new(doc, "files", files); /* steals files, also on failure */
    files = NULL;
    if (bad || json_object_set_new(doc, "from", side_json(model, from)) ||
        json_object_set_new(doc, "to", side_json(other, to))) {
        rc = tv__seterr(&c->err, -ENOMEM, "out of memory");
        goto out;
    }
    rc = tv__api_reply(c, 200, doc);
    doc = NULL;
out:
    json_decref(files);
    json_decref(doc);
    tv__reg_diff_tensors_free(ta, na);
    tv__reg_diff_tensors_free(tb, nb);
    return rc;
}
