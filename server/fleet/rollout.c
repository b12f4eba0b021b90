/* The rollout: each round reads the fleet document (nodes, aliases with
 * every placed node's state, generations with their holders) in one
 * statement, keeps it for GET /v1/fleet, and acts on the aliases placed on
 * this node: a generation missing here is pulled (pull.c); one ready here
 * and in the catalog is switched to once every placed node holds it ready,
 * or a quorum of them after the alias's timeout.
 * Invariants: an alias switches through a worker handle of the daemon's
 * writer store (tv__store_alias_set: registry and pointer file together),
 * never before the generation is ready here; the switch is then reported,
 * so the catalog shows what each node serves. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fleet/fleet_internal.h"
#include "util/internal.h"

/* Everything GET /v1/fleet shows and the rollout decides on, in one
 * statement: nodes, aliases with every placed node's state, generations
 * with the nodes holding them. $1: fleet.node_down_s. */
static const char FLEET_SQL[] =
    "SELECT json_build_object("
    "'nodes', (SELECT coalesce(json_agg(json_build_object('name', n.name, 'url', n.url, "
    "'state', n.state, 'last_seen', n.last_seen, "
    "'age_s', round(extract(epoch FROM now() - n.last_seen)::numeric, 1), "
    "'up', n.last_seen > now() - make_interval(secs => $1::int)) ORDER BY n.name), "
    "'[]'::json) FROM nodes n), "
    "'aliases', (SELECT coalesce(json_agg(json_build_object('model', a.model, 'alias', a.alias, "
    "'generation', a.generation, 'version', a.version, 'placement', a.placement, "
    "'quorum', a.quorum, 'timeout_s', a.timeout_s, 'updated_at', a.updated_at, "
    "'age_s', round(extract(epoch FROM now() - a.updated_at)::numeric, 1), "
    "'nodes', (SELECT coalesce(json_agg(json_build_object('node', p.name, "
    "'state', coalesce(ng.state, 'missing'), 'bytes_done', coalesce(ng.bytes_done, 0), "
    "'bytes_total', coalesce(ng.bytes_total, 0), 'rate_bps', coalesce(ng.rate_bps, 0), "
    "'error', ng.error, 'serving', na.generation, "
    "'up', coalesce(nn.last_seen > now() - make_interval(secs => $1::int), false)) "
    "ORDER BY p.name), "
    "'[]'::json) FROM (SELECT name FROM nodes WHERE a.placement IS NULL "
    "UNION SELECT unnest(a.placement)) p(name) "
    "LEFT JOIN nodes nn ON nn.name = p.name "
    "LEFT JOIN node_generations ng ON ng.node = p.name AND ng.model = a.model "
    "AND ng.number = a.generation "
    "LEFT JOIN node_aliases na ON na.node = p.name AND na.model = a.model AND na.alias = a.alias)"
    ") ORDER BY a.model, a.alias), '[]'::json) FROM aliases a), "
    "'generations', (SELECT coalesce(json_agg(json_build_object('model', g.model, "
    "'number', g.number, 'total_bytes', g.total_bytes, 'n_shards', g.n_shards, "
    "'n_tensors', g.n_tensors, 'source', g.source, 'published_by', g.published_by, "
    "'created_at', g.created_at, 'holders', (SELECT coalesce(json_agg(ng.node ORDER BY ng.node), "
    "'[]'::json) FROM node_generations ng WHERE ng.model = g.model AND ng.number = g.number "
    "AND ng.state = 'ready')) ORDER BY g.model, g.number), '[]'::json) FROM generations g))";

/* The local state of one alias placed here: pull what is missing, switch
 * when the placement is ready (or a quorum after the timeout). */
static void rollout_alias(tv__fleet *f, json_t *a, bool *busy)
{
    const char *model = json_string_value(json_object_get(a, "model"));
    const char *alias = json_string_value(json_object_get(a, "alias"));
    int64_t gen = json_integer_value(json_object_get(a, "generation"));
    int64_t version = json_integer_value(json_object_get(a, "version"));
    json_t *nodes = json_object_get(a, "nodes"), *me = NULL, *n;
    size_t i, n_ready = 0, n_nodes = json_array_size(nodes);
    if (!model || !alias || gen <= 0)
        return;
    json_array_foreach(nodes, i, n)
    {
        const char *name = json_string_value(json_object_get(n, "node"));
        if (name && !strcmp(name, f->node))
            me = n;
        n_ready += !strcmp(json_string_value(json_object_get(n, "state")) ?: "", "ready");
    }
    if (!me)
        return; /* not placed here */
    tv_error err = {0};
    tv__reg_generation g;
    bool have =
        tv__reg_generation_get(f->reg, model, gen, &g, &err) == 0 && g.state == TV__GEN_READY;
    if (!have) {
        if (!f->jobs)
            return;
        pull *p = tv__fleet_pull_find(f, model, gen, true);
        if (!p)
            return;
        if (p->failed && p->alias_version != version && !p->job) {
            p->failed = false; /* the alias moved again: try afresh */
            p->attempts = 0;
        }
        p->alias_version = version;
        if (p->job)
            tv__fleet_pull_poll(f, p);
        if (!p->job && !p->failed && (!have)) {
            tv__reg_generation g2;
            if (tv__reg_generation_get(f->reg, model, gen, &g2, &err) == 0 &&
                g2.state == TV__GEN_READY)
                return; /* just finished */
            if (tv__fleet_pull_start(f, p, &err))
                tv__log(TV_LOG_WARN, "fleet: cannot pull model '%s' generation %" PRId64 ": %s",
                        model, gen, err.msg);
            else if (p->failed) {
                tv__log(TV_LOG_WARN, "fleet: pull of model '%s' generation %" PRId64 " failed: %s",
                        model, gen, p->error);
                tv__fleet_report_gen(f, model, gen, "failed", 0, 0, 0, p->error);
            }
        }
        *busy = true;
        return;
    }
    if (strcmp(json_string_value(json_object_get(me, "state")) ?: "", "ready"))
        return; /* ready here, not yet in the catalog: the publish pass reports it */
    int64_t cur = 0;
    bool same = tv__reg_alias_get(f->reg, model, alias, &cur, &err) == 0 && cur == gen;
    if (!same) {
        json_int_t quorum = json_integer_value(json_object_get(a, "quorum"));
        double age = json_number_value(json_object_get(a, "age_s"));
        double timeout = json_number_value(json_object_get(a, "timeout_s"));
        bool all = n_ready == n_nodes;
        bool enough = quorum > 0 && n_ready >= (size_t)quorum && age >= timeout;
        if (!all && !enough) {
            *busy = true;
            return;
        }
        if (!f->st && f->writer && tv__store_open_worker(f->writer, &f->st, &err)) {
            tv__log(TV_LOG_WARN, "fleet: cannot open the store to switch aliases: %s", err.msg);
            return;
        }
        if (!f->st || tv__store_alias_set(f->st, model, alias, gen, &err)) {
            tv__log(TV_LOG_WARN,
                    "fleet: cannot switch alias '%s' of model '%s' to generation %" PRId64 ": %s",
                    alias, model, gen, err.msg);
            return;
        }
        tv__log(TV_LOG_INFO,
                "fleet: alias '%s' of model '%s' now at generation %" PRId64
                " (%zu of %zu nodes ready%s)",
                alias, model, gen, n_ready, n_nodes, all ? "" : ", quorum after the timeout");
    }
    json_t *serving = json_object_get(me, "serving");
    if (!json_is_integer(serving) || json_integer_value(serving) != gen)
        tv__fleet_report_alias(f, model, alias, gen, version);
}

/* Reads the fleet document, keeps it for GET /v1/fleet and acts on the
 * aliases. Returns whether a rollout is under way here (poll faster). */
bool tv__fleet_rollout_round(tv__fleet *f)
{
    json_t *doc = NULL;
    tv_error err = {0};
    if (!f->reg)
        return false; /* the publish pass opens it, and says why it cannot */
    const char *pv[] = {f->node_down_param};
    if (tv__catalog_json(f->cat, FLEET_SQL, 1, pv, "reading the fleet", &doc, &err)) {
        tv__log(f->quiet ? TV_LOG_DEBUG : TV_LOG_WARN, "fleet: %s", err.msg);
        tv__fleet_set_connected(f, false, err.msg);
        return false;
    }
    bool busy = false;
    json_t *a;
    size_t i;
    json_array_foreach(json_object_get(doc, "aliases"), i, a) rollout_alias(f, a, &busy);
    pthread_mutex_lock(&f->mu);
    json_decref(f->doc);
    f->doc = doc;
    f->doc_at = tv__fleet_mono_s();
    f->connected = true;
    f->last_error[0] = '\0';
    pthread_mutex_unlock(&f->mu);
    return busy;
}
