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

static double round1(double x)
{
    return x < 0 ? 0 : (double)(int64_t)(x * 10 + 0.5) / 10;
}

/* Ages the document as read (under mu) to now: the catalog's ages were
 * taken when it was read, read_ago seconds ago (a catalog away keeps the
 * last document read, and its ages go on growing). This node's age is the
 * time since its last heartbeat the catalog took. up: seen within
 * fleet.node_down_s. */
static void age_document(tv__fleet *f, json_t *out, double now, double read_ago)
{
    json_t *nodes = json_object_get(out, "nodes"), *n, *a, *p;
    size_t i, k;
    json_array_foreach(nodes, i, n)
    {
        const char *name = json_string_value(json_object_get(n, "name"));
        double age = json_number_value(json_object_get(n, "age_s")) + read_ago;
        if (name && !strcmp(name, f->node) && f->beat_at > 0)
            age = now - f->beat_at;
        json_object_set_new(n, "age_s", json_real(round1(age)));
        json_object_set_new(n, "up", json_boolean(age < f->node_down_s));
    }
    json_array_foreach(json_object_get(out, "aliases"), i, a)
    {
        json_t *age = json_object_get(a, "age_s");
        if (json_is_number(age))
            json_object_set_new(a, "age_s", json_real(round1(json_number_value(age) + read_ago)));
        json_array_foreach(json_object_get(a, "nodes"), k, p)
        {
            const char *name = json_string_value(json_object_get(p, "node"));
            json_t *nn;
            size_t m;
            json_array_foreach(nodes, m, nn)
            {
                const char *nm = json_string_value(json_object_get(nn, "name"));
                if (name && nm && !strcmp(nm, name))
                    json_object_set(p, "up", json_object_get(nn, "up"));
            }
        }
    }
}

json_t *tv__fleet_status(tv__fleet *f)
{
    if (!f)
        return json_pack("{s:s, s:n, s:n, s:[], s:[], s:[]}", "mode", "standalone", "node",
                         "catalog", "nodes", "aliases", "generations");
    pthread_mutex_lock(&f->mu);
    double now = tv__fleet_mono_s();
    double read_ago = f->doc && f->doc_at > 0 ? now - f->doc_at : 0;
    json_t *out =
        json_pack("{s:s, s:s, s:s, s:I, s:{s:s, s:b, s:s?, s:f}}", "mode", "fleet", "node", f->node,
                  "url", f->url, "node_down_s", (json_int_t)f->node_down_s, "catalog", "where",
                  f->where, "connected", f->connected, "error",
                  f->last_error[0] ? f->last_error : NULL, "read_s_ago", round1(read_ago));
    static const char *const keys[] = {"nodes", "aliases", "generations"};
    for (size_t i = 0; out && i < 3; i++) {
        json_t *v = f->doc ? json_object_get(f->doc, keys[i]) : NULL;
        json_object_set_new(out, keys[i], v ? json_deep_copy(v) : json_array());
    }
    if (out)
        age_document(f, out, now, read_ago);
    pthread_mutex_unlock(&f->mu);
    return out;
}
