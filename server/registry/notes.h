/* Descriptions and tags on models and generations, the event log, and the
 * actor events are written for (migrations/0008_registry_notes.sql).
 *
 * The actor: a per-thread name (who asked for the changes this thread
 * makes now). The HTTP layer sets it for the duration of a request (a
 * token's name, "local uid N", "cli" for the in-process CLI), a job worker
 * for the duration of a job (the requester recorded with the job), and it
 * reaches every registry connection the thread uses: a request's changes
 * go through the writer's connection and the job queue's, and a job's
 * later through the worker's, with no parameter threaded through the
 * store, jobs and import interfaces. Unset, it is "daemon".
 *
 * Invariants: every state change listed in docs/api.md ("Events") writes
 * exactly one event row in the same transaction as the change, so a change
 * that rolls back leaves no event and a committed one always has its
 * event; notes are checked here against the limits before anything is
 * written (a refused update changes nothing). */
#ifndef TV_REGISTRY_NOTES_H
#define TV_REGISTRY_NOTES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "registry/registry.h"

#define TV__NOTES_DESCRIPTION_MAX 4096 /* bytes of UTF-8 */
#define TV__NOTES_TAG_KEY_MAX     64   /* bytes, [A-Za-z0-9._/-] */
#define TV__NOTES_TAG_VALUE_MAX   1024 /* bytes of UTF-8 */
#define TV__NOTES_TAGS_MAX        64   /* tags per model or generation */
#define TV__ACTOR_MAX             300  /* bytes of an actor's name, NUL included */

/* Sets this thread's actor (NULL or "": unset, events say "daemon");
 * longer names are cut to TV__ACTOR_MAX - 1 bytes. */
void tv__reg_actor_set(const char *actor);
/* This thread's actor ("daemon" when unset). */
const char *tv__reg_actor(void);
/* Sets this thread's actor to the one recorded with job id (jobs.actor;
 * unset when none). Returns 0; TV_E_NOT_FOUND. */
int tv__reg_actor_from_job(tv__reg *reg, int64_t id, tv_error *err);

/* Writes one event (actor = this thread's) in the caller's transaction
 * level or, outside one, in its own. model NULL: a change of no model
 * (tokens, gc); generation 0: none. before and after (JSON objects or
 * NULL) are stolen. Returns 0 or the registry's errors. */
int tv__reg_event(tv__reg *reg, const char *action, const char *model, int64_t generation,
                  json_t *before, json_t *after, tv_error *err);

/* One event row; before and after are malloc'd JSON texts or NULL. */
typedef struct tv__reg_event_row {
    int64_t id;
    int64_t time;
    char actor[TV__ACTOR_MAX];
    char action[48];
    char model[TV__REG_NAME_MAX + 1]; /* "" = none */
    int64_t generation;               /* 0 = none */
    char *before, *after;
} tv__reg_event_row;

/* Whether a reader may see events of model (NULL: an event of no model). */
typedef bool (*tv__reg_event_visible_fn)(void *ctx, const char *model);

/* Events newest first with id below before_id (0 = from the newest), of
 * model only (NULL = every model), that visible (NULL = all) lets through,
 * at most limit (>= 1); *more says whether visible ones follow (the cursor
 * of the next page is the last row's id). Free with tv__reg_events_free. */
int tv__reg_events_page(tv__reg *reg, const char *model, int64_t before_id, size_t limit,
                        tv__reg_event_visible_fn visible, void *ctx, tv__reg_event_row **out,
                        size_t *n, bool *more, tv_error *err);
/* NULL-safe. */
void tv__reg_events_free(tv__reg_event_row *rows, size_t n);

/* The limits, without the registry (also for the API's and CLI's own
 * checks): a description of at most TV__NOTES_DESCRIPTION_MAX bytes of
 * valid UTF-8 with no NUL (len bytes); a tag key of 1..64 bytes of
 * [A-Za-z0-9._/-]; a tag value of at most 1024 bytes of valid UTF-8.
 * Return 0 or TV_E_INVALID_ARG naming the field ("description",
 * "tags.KEY", "tag key 'K'"). */
int tv__notes_check_description(const char *s, size_t len, tv_error *err);
int tv__notes_check_tag_key(const char *key, tv_error *err);
int tv__notes_check_tag_value(const char *key, const char *value, size_t len, tv_error *err);
/* Applies patch (an object: KEY -> string sets, KEY -> null removes) to
 * tags (an object, changed in place), checking every key and value and the
 * resulting count (TV__NOTES_TAGS_MAX). On failure tags may be partly
 * changed (callers pass a copy). Returns 0 or TV_E_INVALID_ARG. */
int tv__notes_apply_tags(json_t *tags, const json_t *patch, tv_error *err);

/* The description and tags of model (number 0) or of its generation
 * number: *description malloc'd, *tags a new reference (either may be
 * NULL: not wanted). Returns 0; TV_E_NOT_FOUND. */
int tv__reg_notes_get(tv__reg *reg, const char *model, int64_t number, char **description,
                      json_t **tags, tv_error *err);

/* Changes the notes of model (number 0) or of its generation number in one
 * transaction, with one "notes" event (before and after: the fields that
 * changed): description NULL keeps it; tags_patch NULL keeps the tags.
 * Returns 0; TV_E_NOT_FOUND; TV_E_INVALID_ARG (a limit, naming the
 * field). */
int tv__reg_notes_update(tv__reg *reg, const char *model, int64_t number, const char *description,
                         const json_t *tags_patch, tv_error *err);

/* Whether model (number 0) or its generation has tag key with value. */
int tv__reg_notes_has_tag(tv__reg *reg, const char *model, int64_t number, const char *key,
                          const char *value, bool *has, tv_error *err);

/* One tensor as a diff compares it: dtype and shape, its bytes' XXH3-128
 * ("" when it was imported without one) and its shard's SHA-256. */
typedef struct tv__reg_diff_tensor {
    char *name; /* malloc'd */
    tv_dtype dtype;
    char shape[256]; /* the stored JSON array text */
    uint64_t nbytes;
    char xxh3[33];
    char shard_sha256[TV__REG_SHA256_HEX_LEN + 1];
} tv__reg_diff_tensor;

/* Every tensor of a generation by name (bytes). Free with
 * tv__reg_diff_tensors_free. Returns 0; TV_E_NOT_FOUND (generation). */
int tv__reg_diff_tensors(tv__reg *reg, int64_t generation_id, tv__reg_diff_tensor **out, size_t *n,
                         tv_error *err);
void tv__reg_diff_tensors_free(tv__reg_diff_tensor *t, size_t n);

/* The tensors part of a diff from a to b (each by name in byte order, as
 * tv__reg_diff_tensors lists them): {"added": [T], "removed": [T],
 * "changed": [{"name", "from": T, "to": T}] (dtype or shape),
 * "content_changed": [{"name", "basis", "note"}], "unchanged": N,
 * "basis": B}, T = {"name", "dtype", "shape"}. Content is compared by the
 * tensors' XXH3-128 when both have one (basis "xxh3", note "content
 * differs"), else by their shards' SHA-256 (basis "shard_sha256": the same
 * shard is unchanged, another is "content may differ (shard hash
 * differs)"); B is "xxh3", "shard_sha256" or "mixed" (which was used; "xxh3"
 * when nothing was compared). NULL on -ENOMEM. */
json_t *tv__diff_tensors_json(const tv__reg_diff_tensor *a, size_t na, const tv__reg_diff_tensor *b,
                              size_t nb);

/* The sidecar files part of a diff (the generations' small files, table
 * generation_files, migrations/0007_sidecar_files.sql): {"added": [path],
 * "removed": [path], "changed": [path]} by path (changed: another
 * SHA-256). Returns 0 and *out (a new reference); the registry's errors. */
int tv__reg_files_diff(tv__reg *reg, int64_t from_id, int64_t to_id, json_t **out, tv_error *err);

#endif
