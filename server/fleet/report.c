/* What this node tells the catalog, and what GET /v1/fleet shows: the
 * state of each of its generations (node_generations: pulling with its
 * progress, ready, failed), the generation each of its aliases serves
 * (node_aliases), and the fleet document as the thread last read it.
 * Invariants: a report that fails is logged at debug level and made again
 * by a later round, never retried here (the thread must not wait on a
 * catalog that is away); a report that can let a switch happen (a
 * generation ready or failed, an alias switched) is followed by a NOTIFY,
 * so every node's thread wakes at once instead of at its next poll. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fleet/fleet_internal.h"
#include "util/internal.h"

/* Wakes every node's fleet thread (LISTEN) after a report that can let a
 * switch happen: a generation ready or failed here, an alias switched. */
static void notify_report(tv__fleet *f, const char *kind, const char *model, int64_t number,
                          const char *what)
{
    json_t *j = json_pack("{s:s, s:s, s:s, s:I, s:s}", "kind", kind, "node", f->node, "model",
                          model, "generation", (json_int_t)number, "state", what);
    char *payload = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    const char *pv[] = {TV__CATALOG_CHANNEL, payload ? payload : "{}"};
    tv_error err = {0};
    if (tv__catalog_exec(f->cat, "SELECT pg_notify($1, $2)", 2, pv, "notifying a report", &err))
        tv__log(TV_LOG_DEBUG, "fleet: %s", err.msg);
    free(payload);
}

void tv__fleet_report_gen(tv__fleet *f, const char *model, int64_t number, const char *state,
                          uint64_t done, uint64_t total, double rate, const char *error)
{
    char num[24], d[24], t[24], r[40];
    snprintf(num, sizeof num, "%" PRId64, number);
    snprintf(d, sizeof d, "%" PRIu64, done);
    snprintf(t, sizeof t, "%" PRIu64, total);
    snprintf(r, sizeof r, "%.1f", rate);
    const char *pv[] = {f->node, model, num, state, d, t, r, error};
    tv_error err = {0};
    if (tv__catalog_exec(
            f->cat,
            "INSERT INTO node_generations (node, model, number, state, bytes_done, bytes_total, "
            "rate_bps, error, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, now()) "
            "ON CONFLICT (node, model, number) DO UPDATE SET state = excluded.state, "
            "bytes_done = excluded.bytes_done, bytes_total = excluded.bytes_total, "
            "rate_bps = excluded.rate_bps, error = excluded.error, updated_at = now()",
            8, pv, "reporting a generation's state", &err))
        tv__log(TV_LOG_DEBUG, "fleet: %s", err.msg);
    else if (!strcmp(state, "ready") || !strcmp(state, "failed"))
        notify_report(f, "node_generation", model, number, state);
}

void tv__fleet_report_alias(tv__fleet *f, const char *model, const char *alias, int64_t number,
                            int64_t version)
{
    char num[24], ver[24];
    snprintf(num, sizeof num, "%" PRId64, number);
    snprintf(ver, sizeof ver, "%" PRId64, version);
    const char *pv[] = {f->node, model, alias, num, ver};
    tv_error err = {0};
    if (tv__catalog_exec(f->cat,
                         "INSERT INTO node_aliases (node, model, alias, generation, version) "
                         "VALUES ($1, $2, $3, $4, $5) ON CONFLICT (node, model, alias) DO UPDATE "
                         "SET generation = excluded.generation, version = excluded.version, "
                         "switched_at = now()",
                         5, pv, "reporting an alias", &err))
        tv__log(TV_LOG_DEBUG, "fleet: %s", err.msg);
    else
        notify_report(f, "node_alias", model, number, alias);
}

void tv__fleet_set_connected(tv__fleet *f, bool up, const char *error)
{
    pthread_mutex_lock(&f->mu);
    f->connected = up;
    snprintf(f->last_error, sizeof f->last_error, "%s", error ? error : "");
    pthread_mutex_unlock(&f->mu);
}

json_t *tv__fleet_status(tv__fleet *f)
{
    if (!f)
        return json_pack("{s:s, s:n, s:n, s:[], s:[], s:[]}", "mode", "standalone", "node",
                         "catalog", "nodes", "aliases", "generations");
    pthread_mutex_lock(&f->mu);
    json_t *out = json_pack("{s:s, s:s, s:s, s:{s:s, s:b, s:s?}}", "mode", "fleet", "node", f->node,
                            "url", f->url, "catalog", "where", f->where, "connected", f->connected,
                            "error", f->last_error[0] ? f->last_error : NULL);
    static const char *const keys[] = {"nodes", "aliases", "generations"};
    for (size_t i = 0; out && i < 3; i++) {
        json_t *v = f->doc ? json_object_get(f->doc, keys[i]) : NULL;
        json_object_set_new(out, keys[i], v ? json_deep_copy(v) : json_array());
    }
    pthread_mutex_unlock(&f->mu);
    return out;
}
