/* The fleet catalog on PostgreSQL (libpq): models, generations (shards with
 * hashes, tensor metadata), aliases with their placement, and the nodes of
 * the fleet (docs/fleet.md). Each node keeps its SQLite registry as the
 * physical truth; the catalog is the logical truth the nodes reconcile with.
 *
 * Invariants:
 *   - migrations/fleet/NNNN_*.sql are applied in order, each in one
 *     transaction under pg_advisory_xact_lock(TV__CATALOG_LOCK) that also
 *     advances tv_schema.version, so nodes starting together migrate once;
 *   - a generation is published in one transaction (tensors by COPY); the
 *     same (model, number) published again with the same shard hashes is a
 *     no-op, with other hashes TV_E_CONFLICT naming both;
 *   - an alias moves by compare-and-set on its version, and the move and its
 *     NOTIFY tensorvault_catalog commit together;
 *   - no message or log line carries the password of the conninfo;
 *   - a connection found dropped (PQstatus) is reconnected once per call
 *     before the call fails.
 * A tv__catalog is one connection: use it from one thread at a time.
 *
 * Errors: -ECONNREFUSED when PostgreSQL cannot be reached (the message names
 * host and database and libpq's reason); TV_E_REGISTRY for a failed
 * statement (the message carries PostgreSQL's); TV_E_BUSY for one that gave
 * up on a lock or ran out of time (lock_timeout, statement_timeout);
 * TV_E_REGISTRY_TOO_NEW for a catalog migrated by a newer tensorvault;
 * TV_E_CONFLICT (HTTP 409). */
#ifndef TV_FLEET_CATALOG_H
#define TV_FLEET_CATALOG_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "registry/migrate.h"
#include "registry/registry.h"
#include "tensorvault/errors.h"

#define TV__CATALOG_LOCK    INT64_C(0x74767631) /* "tvv1": the migration advisory lock */
#define TV__CATALOG_CHANNEL "tensorvault_catalog"

typedef struct tv__catalog tv__catalog;

/* The catalog migrations built into this binary (migrations/fleet/NNNN_description.sql). */
extern const tv__migration tv__fleet_migrations[];
extern const size_t tv__fleet_n_migrations;

/* Writes conninfo (keyword=value or a postgresql:// URI) for logs:
 * "host=H port=P dbname=D user=U" from what it names, never the password;
 * "(unparsable conninfo)" when libpq cannot parse it. Always NUL-terminates
 * (len > 0). Pure: no connection. */
void tv__catalog_redact(const char *conninfo, char *out, size_t len);

/* Connects (connect_timeout 5 s unless conninfo sets one) and applies the
 * pending migrations. Returns 0 and *out; -ECONNREFUSED; TV_E_REGISTRY
 * (a migration failed: the message names the file);
 * TV_E_REGISTRY_TOO_NEW; TV_E_INVALID_ARG (empty or unparsable conninfo). */
int tv__catalog_open(const char *conninfo, tv__catalog **out, tv_error *err);
/* tv__catalog_open with flags: TV__CATALOG_BRIEF: a connection that serves
 * requests (an alias move of the API) and must not wait: connect_timeout 2
 * s unless conninfo sets one, lock_timeout 1 s, statement_timeout 3 s (a
 * statement over them fails with TV_E_REGISTRY naming PostgreSQL's
 * reason), and no migration: a catalog not migrated to this binary's
 * schema yet is TV_E_BUSY. Same returns otherwise. */
#define TV__CATALOG_BRIEF 1u
int tv__catalog_open_ex(const char *conninfo, unsigned flags, tv__catalog **out, tv_error *err);
/* NULL-safe. */
void tv__catalog_close(tv__catalog *cat);

/* tv_schema.version (0 before the first migration). */
int tv__catalog_version(tv__catalog *cat, int *version, tv_error *err);

/* Inserts or refreshes this node's row (url, last_seen = now(), state 'up').
 * Returns 0; TV_E_CONFLICT when a daemon at another URL reported under this
 * name in the last down_s seconds (fleet.node_down_s; 0 = 30: the row is
 * left to it); the catalog's errors. */
int tv__catalog_node_seen(tv__catalog *cat, const char *node, const char *url, unsigned down_s,
                          tv_error *err);

/* Publishes a ready generation: m as loaded by tv__reg_tensors_list (its
 * generation, shards and tensors), published_by = node (registered on the
 * way when absent). One transaction. Returns 0 and *published (may be NULL:
 * 1 = written, 0 = already there with the same shard hashes);
 * TV_E_CONFLICT when (model, number) is there with other content (the
 * message names the shard and both sha256s); TV_E_STATE (m not ready). */
int tv__catalog_publish_generation(tv__catalog *cat, const char *node, const tv__reg_manifest *m,
                                   int *published, tv_error *err);
/* tv__catalog_publish_generation with the generation's sidecar files
 * (generation_files, migrations/fleet/0003_generation_files.sql): in the
 * same transaction, also when the generation was there already (a file
 * recorded is kept: the first publisher's). */
int tv__catalog_publish_generation_ex(tv__catalog *cat, const char *node, const tv__reg_manifest *m,
                                      const tv__reg_file *files, size_t n_files, int *published,
                                      tv_error *err);

/* Moves (or creates, with expect_version 0) alias of model to generation,
 * placement NULL = every node, else a NULL-terminated list of node names.
 * Compare-and-set: the row's version must be expect_version; it becomes
 * *new_version (may be NULL). NOTIFY tensorvault_catalog with
 * {"kind":"alias","model":..,"alias":..,"generation":..,"version":..}
 * in the same transaction. Returns 0; TV_E_CONFLICT (the version moved on,
 * or the alias exists and expect_version is 0: the message names both
 * versions); TV_E_NOT_FOUND (no such generation in the catalog). */
int tv__catalog_set_alias(tv__catalog *cat, const char *model, const char *alias,
                          int64_t generation, const char *const *placement, int64_t expect_version,
                          int64_t *new_version, tv_error *err);

/* tv__catalog_set_alias with the rest of an alias row: quorum 0 = every
 * node the placement names must be ready before any switches (NULL in the
 * row); N = N ready nodes may switch once timeout_s (0 = 600) passed since
 * the move. Same returns. */
typedef struct tv__catalog_alias_move {
    const char *model, *alias;
    int64_t generation;
    const char *const *placement;
    int64_t expect_version;
    int quorum, timeout_s;
} tv__catalog_alias_move;
int tv__catalog_move_alias(tv__catalog *cat, const tv__catalog_alias_move *m, int64_t *new_version,
                           tv_error *err);

/* One statement with n text parameters (NULL = SQL NULL), retried once
 * after a reconnect like every call here; what names it in messages.
 * tv__catalog_json: the statement yields one row, one json column (NULL or
 * no row: json null) parsed into *out (json_decref it). Returns 0,
 * TV_E_CONFLICT (unique violation), TV_E_REGISTRY, -ECONNREFUSED. */
int tv__catalog_exec(tv__catalog *cat, const char *sql, int n, const char *const *params,
                     const char *what, tv_error *err);
int tv__catalog_json(tv__catalog *cat, const char *sql, int n, const char *const *params,
                     const char *what, json_t **out, tv_error *err);

/* LISTEN tensorvault_catalog on this connection (again after a reconnect). */
int tv__catalog_listen(tv__catalog *cat, tv_error *err);

/* Waits up to timeout_ms (-1 = no limit) for a notification on the listened
 * channel and copies its payload (NUL-terminated, cut to len - 1 bytes).
 * Returns 1 (payload filled), 0 (timed out), or an error (-ECONNREFUSED
 * when the connection dropped and could not be made again). */
int tv__catalog_wait(tv__catalog *cat, int timeout_ms, char *payload, size_t len, tv_error *err);

#endif
