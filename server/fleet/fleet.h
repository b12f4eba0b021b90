/* The daemon's side of fleet mode: one small thread that owns the catalog
 * connection (catalog.h) and a read-only registry connection of its own, so
 * no HTTP, fast-path or job thread ever waits on PostgreSQL. It publishes
 * this node's ready generations (publish.c), pulls the generations of the
 * aliases placed on this node as import jobs and switches those aliases
 * (pull.c, rollout.c), and reports what this node holds and serves
 * (report.c); a second thread copies generations imported here to the
 * object store (upload.c). fleet_internal.h says which file does what.
 *
 * Invariants:
 *   - the daemon serves standalone until the catalog is reached: a failed
 *     connect or migration is logged once (then at debug level) and retried
 *     every retry_s seconds, never failing the start;
 *   - every ready generation of the local registry is published once per
 *     process (idempotent in the catalog): all of them after each
 *     (re)connect, then those a kick announces; a failed publish is logged
 *     and retried, and never touches the local generation; a conflict
 *     (other content under the same number) is logged as an error and not
 *     retried;
 *   - the node's row is refreshed (last_seen) every heartbeat_s seconds;
 *   - an alias placed here switches only to a generation ready here, once
 *     every placed node holds it ready (or a quorum after the alias's
 *     timeout); a pull that failed fleet.pull_attempts times is reported
 *     failed until the alias moves again. */
#ifndef TV_FLEET_FLEET_H
#define TV_FLEET_FLEET_H

#include <jansson.h>

#include "tensorvault/errors.h"

typedef struct tv__fleet tv__fleet;
struct tv__jobs;
struct tv__s3_opts;

typedef struct tv__fleet_opts {
    const char *conninfo; /* fleet.postgres, non-empty */
    const char *node;     /* fleet.node */
    const char *url;      /* this node's HTTP URL, for the nodes row (peers pull from it) */
    const char *reg_path; /* the local registry.db */
    unsigned retry_s;     /* 0 = 3 */
    unsigned heartbeat_s; /* 0 = 10 */
    /* rollout (NULL jobs: this node publishes only, never pulls) */
    struct tv__jobs *jobs;         /* pulls run as import jobs of this pool */
    const struct tv__store *store; /* the writer store: aliases switch through a worker of it */
    const char *token;             /* fleet.token: sent to peers' blob routes; "" = none */
    const char *object_store;      /* fleet.object_store s3://BUCKET/PREFIX/; "" = none */
    const char *proxy;             /* fleet.proxy */
    const struct tv__s3_opts *s3;  /* the object store's endpoint and keys */
    unsigned pull_attempts;        /* 0 = 3: tries of one generation before it is failed */
    /* fleet.node_down_s: a node whose last heartbeat is older is down (not
     * a source, shown down, its name free for another daemon); 0 = 30.
     * Heartbeats are sent every node_down_s / 3 seconds (at least 1 s, at
     * most heartbeat_s). */
    unsigned node_down_s;
} tv__fleet_opts;

/* Starts the fleet thread (it connects in the background). Returns 0 and
 * *out; TV_E_INVALID_ARG; -ENOMEM; -errno of pthread_create. */
int tv__fleet_start(const tv__fleet_opts *o, tv__fleet **out, tv_error *err);

/* A ready generation may have appeared: publish soon. NULL-safe, never
 * blocks on PostgreSQL. */
void tv__fleet_kick(tv__fleet *f);

/* The fleet as this node last read it (GET /v1/fleet), a new reference:
 * {"mode":"fleet","node","url","catalog":{"where","connected","error"},
 *  "nodes":[...],"aliases":[...],"generations":[...]} (docs/fleet.md).
 * NULL f: {"mode":"standalone",...}. NULL only on ENOMEM. */
json_t *tv__fleet_status(tv__fleet *f);

/* Stops and joins the threads, closes the connections. NULL-safe. An
 * upload in flight hears the stop within a second, whatever the object
 * store does (s3put.h: cancel). Waits at most 5 s: a thread blocked on a
 * catalog that stopped answering (libpq calls have no timeout) is detached
 * and left, with its memory, to the process's exit, which is the only
 * caller's next step. */
void tv__fleet_stop(tv__fleet *f);

#endif
