/* The event log and the per-thread actor (registry/notes.h).
 *
 * Invariants: an event is written in the caller's transaction level (or a
 * level of its own), so it commits or rolls back with the change it
 * records; pages are keyset pages on the event id, newest first, so rows
 * written meanwhile never repeat or shift a page already read. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "registry/notes.h"
#include "registry/reg_internal.h"

static _Thread_local char thread_actor[TV__ACTOR_MAX];

void tv__reg_actor_set(const char *actor)
{
    snprintf(thread_actor, sizeof thread_actor, "%s", actor ? actor : "");
}

const char *tv__reg_actor(void)
{
    return thread_actor[0] ? thread_actor : "daemon";
}

static int read_actor(sqlite3_stmt *st, void *record, tv_error *err)
{
    (void)err;
    tv__reg_col_text(st, 0, record, TV__ACTOR_MAX);
    return 0;
}

int tv__reg_actor_from_job(tv__reg *reg, int64_t id, tv_error *err)
{
    char actor[TV__ACTOR_MAX] = "";
    if (!reg)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_actor_from_job: NULL registry");
    int rc = tv__reg_query_one(reg, read_actor, actor, "reading a job's requester", err,
                               "SELECT ifnull(actor, '') FROM jobs WHERE id = ?1", "i", id);
    if (rc == TV_E_NOT_FOUND)
        return tv__seterr(err, TV_E_NOT_FOUND, "no job with id %lld", (long long)id);
    if (rc == 0)
        tv__reg_actor_set(actor);
    return rc;
}

int tv__reg_event(tv__reg *reg, const char *action, const char *model, int64_t generation,
                  json_t *before, json_t *after, tv_error *err)
{
    char *b = NULL, *a = NULL;
    int rc = 0;
    if (!reg || !action || !*action) {
        rc = tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_event: NULL registry or action");
        goto out;
    }
    if ((before && !(b = json_dumps(before, JSON_COMPACT | JSON_SORT_KEYS))) ||
        (after && !(a = json_dumps(after, JSON_COMPACT | JSON_SORT_KEYS)))) {
        rc = tv__seterr(err, -ENOMEM, "writing an event: out of memory");
        goto out;
    }
    rc = tv__reg_exec(reg, "writing an event", err,
                      "INSERT INTO events (actor, action, model, generation, before, after) "
                      "VALUES (?1, ?2, ?3, nullif(?4, 0), ?5, ?6)",
                      "tttitt", tv__reg_actor(), action, model, generation, b, a);
out:
    free(b);
    free(a);
    json_decref(before);
    json_decref(after);
    return rc;
}

typedef struct page_ctx {
    tv__reg_vec v;
    size_t limit;
    bool more;
    int64_t scanned_last; /* id of the last row read */
    tv__reg_event_visible_fn visible;
    void *vctx;
} page_ctx;

static char *col_dup(sqlite3_stmt *st, int col)
{
    const unsigned char *s = sqlite3_column_text(st, col);
    return s ? strdup((const char *)s) : NULL;
}

static int read_event(sqlite3_stmt *st, void *arg, tv_error *err)
{
    page_ctx *p = arg;
    const unsigned char *model = sqlite3_column_text(st, 4);
    p->scanned_last = sqlite3_column_int64(st, 0);
    if (p->visible && !p->visible(p->vctx, (const char *)model))
        return 0;
    if (p->v.n == p->limit) {
        p->more = true;
        return 1; /* stop: one more visible row exists */
    }
    tv__reg_event_row *e = tv__reg_vec_push(&p->v);
    if (!e)
        return tv__seterr(err, -ENOMEM, "listing events: out of memory");
    e->id = sqlite3_column_int64(st, 0);
    e->time = sqlite3_column_int64(st, 1);
    tv__reg_col_text(st, 2, e->actor, sizeof e->actor);
    tv__reg_col_text(st, 3, e->action, sizeof e->action);
    tv__reg_col_text(st, 4, e->model, sizeof e->model);
    e->generation = sqlite3_column_int64(st, 5);
    e->before = col_dup(st, 6);
    e->after = col_dup(st, 7);
    if ((sqlite3_column_type(st, 6) != SQLITE_NULL && !e->before) ||
        (sqlite3_column_type(st, 7) != SQLITE_NULL && !e->after))
        return tv__seterr(err, -ENOMEM, "listing events: out of memory");
    return 0;
}

int tv__reg_events_page(tv__reg *reg, const char *model, int64_t before_id, size_t limit,
                        tv__reg_event_visible_fn visible, void *ctx, tv__reg_event_row **out,
                        size_t *n, bool *more, tv_error *err)
{
    if (!reg || !out || !n || !more || limit == 0 || before_id < 0)
        return tv__seterr(err, TV_E_INVALID_ARG,
                          "tv__reg_events_page: NULL argument, limit 0 or a negative cursor");
    *out = NULL;
    *n = 0;
    *more = false;
    page_ctx p = {
        .v = {.size = sizeof(tv__reg_event_row)}, .limit = limit, .visible = visible, .vctx = ctx};
    int rc = tv__reg_query_each(
        reg, read_event, &p, "listing events", err,
        "SELECT id, time, actor, action, model, ifnull(generation, 0), before, after FROM events "
        "WHERE (?1 = 0 OR id < ?1) AND (?2 IS NULL OR model = ?2) ORDER BY id DESC",
        "it", before_id, model);
    if (rc == 1)
        rc = 0;
    if (rc) {
        tv__reg_events_free(p.v.items, p.v.n);
        return rc;
    }
    *out = p.v.items;
    *n = p.v.n;
    *more = p.more;
    return 0;
}

void tv__reg_events_free(tv__reg_event_row *rows, size_t n)
{
    for (size_t i = 0; rows && i < n; i++) {
        free(rows[i].before);
        free(rows[i].after);
    }
    free(rows);
}
