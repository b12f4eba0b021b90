/* The event log's route: GET /v1/events?limit=N&before=ID&model=NAME,
 * newest first; "next" is the id to pass as before for the next page
 * (null on the last).
 * Invariants: a reader sees the events of the models it may read
 * ([access]) and events of no model (tokens, gc) only when it sees
 * everything (admin tokens, the CLI's local mode); a page left short by
 * that filter is never the last while visible events follow. */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "http/api_internal.h"
#include "registry/notes.h"
#include "util/internal.h"

static const char *const EVENTS_Q[] = {"limit", "before", "model", NULL};

static bool visible(void *ctx, const char *model)
{
    tv__api_ctx *c = ctx;
    return model ? tv__api_can_read(c, model) : tv__api_sees_all(c);
}

static json_t *json_text(const char *s)
{
    json_t *v = s ? json_loads(s, 0, NULL) : NULL;
    return v ? v : json_null();
}

static json_t *event_json(const tv__reg_event_row *e)
{
    return json_pack("{s:I,s:I,s:s,s:s,s:o,s:o,s:o,s:o}", "id", (json_int_t)e->id, "time",
                     (json_int_t)e->time, "actor", e->actor, "action", e->action, "model",
                     e->model[0] ? tv__api_jstr(e->model) : json_null(), "generation",
                     e->generation ? json_integer(e->generation) : json_null(), "before",
                     json_text(e->before), "after", json_text(e->after));
}

int tv__api_h_events(tv__api_ctx *c)
{
    tv__reg *reg;
    size_t limit, n = 0;
    int64_t before = 0;
    tv__reg_event_row *rows = NULL;
    bool more = false;
    json_t *arr = NULL;
    int rc;
    if ((rc = tv__api_query_allow(c, EVENTS_Q)) || (rc = tv__api_query_limit(c, &limit)))
        return rc;
    const char *b = tv__api_query(c, "before"), *model = tv__api_query(c, "model");
    if (b && !tv__parse_pos_i64(b, &before))
        return tv__seterr(&c->err, TV_E_BAD_REQUEST,
                          "before: '%.40s' is not an event id (pass next of the previous page)", b);
    if (model && (!*model || (rc = tv__api_may_read(c, model))))
        return rc ? rc : tv__seterr(&c->err, TV_E_BAD_REQUEST, "model: empty");
    if ((rc = tv__api_reader(c, &reg)) ||
        (rc =
             tv__reg_events_page(reg, model, before, limit, visible, c, &rows, &n, &more, &c->err)))
        goto out;
    arr = json_array();
    for (size_t i = 0; !rc && arr && i < n; i++)
        if (json_array_append_new(arr, event_json(&rows[i])))
            rc = tv__seterr(&c->err, -ENOMEM, "out of memory");
    if (!rc) {
        rc = tv__api_reply(c, 200,
                           json_pack("{s:o,s:o}", "events", arr, "next",
                                     more && n ? json_integer(rows[n - 1].id) : json_null()));
        arr = NULL;
    }
out:
    json_decref(arr);
    tv__reg_events_free(rows, n);
    return rc;
}
