/* GET /v1/sessions: the fast path's live sessions with their open handles,
 * and the memory tier's figures (aggregates: no model named).
 * Invariant: sessions show pids, uids and models, so a peer sees only its
 * own (same uid), a read token those whose every open model it may read,
 * admin all. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "fastpath/fastpath.h"
#include "http/api_internal.h"
#include "util/internal.h"

/* Sessions show pids, uids and models: a peer sees its own (same uid), a
 * read token those whose every open model it may read, admin all. */
static bool session_visible(tv__api_ctx *c, const tv__fp_session_info *s)
{
    if (tv__api_sees_all(c))
        return true;
    if (!c->has_token)
        return c->req->peer && c->req->peer->local && c->req->peer->uid == s->uid;
    for (size_t h = 0; h < s->n_handles; h++)
        if (!tv__api_can_read(c, s->handles[h].model))
            return false;
    return s->n_handles > 0;
}

/* GET /v1/sessions: the fast path's live sessions (none when it is off),
 * those the peer may see. */
int tv__api_h_sessions(tv__api_ctx *c)
{
    static const char *const q[] = {NULL};
    tv__fp_session_info *ss = NULL;
    size_t n = 0;
    json_t *arr = NULL;
    int rc;
    if ((rc = tv__api_query_allow(c, q)))
        return rc;
    if (c->api->fp && (rc = tv__fp_sessions(c->api->fp, &ss, &n)))
        return tv__seterr(&c->err, rc, "fast-path sessions: %s", strerror(-rc));
    if (!(arr = json_array()))
        rc = tv__seterr(&c->err, -ENOMEM, "out of memory");
    for (size_t i = 0; !rc && i < n; i++)
        if (session_visible(c, &ss[i]) && json_array_append_new(arr, tv__api_session_json(&ss[i])))
            rc = tv__seterr(&c->err, -ENOMEM, "out of memory");
    tv__fp_sessions_free(ss, n);
    if (rc) {
        json_decref(arr);
        return rc;
    }
    tv__fp_stats st;
    tv__fp_get_stats(c->api->fp, &st);
    return tv__api_reply(c, 200,
                         json_pack("{s:o,s:o}", "sessions", arr, "tier",
                                   tv__api_tier_json(&st, c->api->fp != NULL)));
}
