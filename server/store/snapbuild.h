/* Manifest snapshots of a store's generations: built from the registry,
 * written as files under DIR/snapshots (core/src/snap/snapfile.h) so that
 * readers open a generation without SQLite, and kept in step with the
 * registry by the writer.
 *
 * Invariants:
 *   - only ready and retired generations whose shards all still have a
 *     committed object get a snapshot; a generation's file is written once
 *     and never changes (a file that exists is kept when it is valid and
 *     equal to what the registry says, and replaced only when stale or
 *     corrupt and no reader holds it);
 *   - the active pointer is written only after the active generation's
 *     snapshot exists, so it never names a missing file;
 *   - a snapshot file a reader holds (shared flock) is never removed;
 *   - registry and pointer agree after every command. The registry is the
 *     source of truth; an activation changes the pointer (the moment
 *     readers switch) inside the open SQL transaction and commits right
 *     after, so a failure at any step rolls both back and reports an error
 *     with nothing changed. A writer killed between the pointer and the
 *     commit leaves a pointer that records the generation it replaced
 *     ("from"), equal to the registry's active one: the next writer's open
 *     completes that activation in the registry (what readers already see)
 *     before anything else. A deactivation moves the pointer aside
 *     (renamed to "deactivated": readers see none) inside the open
 *     transaction and commits right after; a writer killed in between
 *     leaves no pointer and a moved one naming the registry's active
 *     generation: the next writer's open completes the deactivation. Any
 *     other disagreement is repaired by rewriting the pointer from the
 *     registry, and a leftover moved pointer is removed;
 *   - writer commands write only what they change: the repair at open reads
 *     and compares, and writes a pointer or snapshot only where it differs
 *     or is missing; retired generations are never rebuilt.
 * Call the writing functions only on a writer store (TV__STORE_WRITE). */
#ifndef TV_STORE_SNAPBUILD_H
#define TV_STORE_SNAPBUILD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "store/store.h"
#include "snap/snapshot.h"

/* Builds the snapshot image of generation gen of model (0 = the active one)
 * from the registry (tv__reg_generation_get, tv__reg_tensors_list,
 * tv__reg_device_get for every device holding a committed replica).
 * *buf is malloc'd (free with free()).
 * Returns 0; TV_E_NOT_FOUND (model, generation, or no active one);
 * TV_E_STATE (the generation is importing or failed, or a shard has no
 * committed object left, e.g. freed by gc); TV_E_REGISTRY (a device row or
 * shard hash that cannot be mapped); the errors of tv__snap_build
 * (TV_E_INVALID_ARG naming the record, TV_E_OVERFLOW); -ENOMEM; the
 * registry's errors. */
/* A device row as a snapshot device record: the uuid text and the identity
 * JSON decoded the way the label stores them (zero-padded strings; missing
 * identity fields stay zero). The single mapping from registry to on-device
 * identity, used for snapshots and for the label check at open.
 * d->path points into row. Returns 0 or TV_E_REGISTRY (malformed row). */
int tv__store_device_record(const tv__reg_device *row, tv__snap_device_in *d, tv_error *err);

int tv__store_build_snapshot(tv__store *st, const char *model, int64_t gen, void **buf, size_t *len,
                             tv_error *err);

/* Builds and writes DIR/snapshots/<model>/<gen>.tvsnap (gen 0 = the active
 * generation). When the file already exists and is valid and identical to
 * the registry's manifest, nothing is written; when it is stale or corrupt
 * it is replaced unless a reader holds it.
 * Returns 0; TV_E_LEASED (a stale file is held by a reader); the errors of
 * tv__store_build_snapshot and tv__snapfile_write. */
int tv__store_write_snapshot(tv__store *st, const char *model, int64_t gen, tv_error *err);

/* Makes DIR/snapshots/<model>/active match the registry: writes the active
 * generation's snapshot if it is missing, then the pointer; removes the
 * pointer when the model has no active generation (or does not exist).
 * Reads and compares first: nothing is written when they agree.
 * Returns 0 or the errors of tv__store_write_snapshot,
 * tv__snapfile_write_pointer and the registry. */
int tv__store_write_active(tv__store *st, const char *model, tv_error *err);

/* Activates ready generation gen of model, registry and pointer together:
 * (1) writes the generation's snapshot if missing; (2) in one registry
 * transaction sets the active generation; (3) before committing, points
 * the pointer at gen recording the previous active generation ("from");
 * (4) commits. A failure at (2)-(4) rolls the registry back and puts the
 * old pointer back: an error changes neither (only when restoring the
 * pointer fails too, which the message says, does the next writer's open
 * complete the activation). Crash points: "activate-snapshot",
 * "activate-pointer" (between the pointer and the commit),
 * "activate-commit". Activating the active generation only checks the
 * pointer. Returns 0; TV_E_INVALID_ARG; TV_E_NOT_FOUND; TV_E_STATE (not
 * ready); the errors of the snapshot and pointer writes and the registry. */
int tv__store_activate(tv__store *st, const char *model, int64_t gen, tv_error *err);

/* Clears the model's active generation, registry and pointer together, the
 * tv__store_activate protocol: (1) in one registry transaction (BEGIN
 * IMMEDIATE) tv__reg_generation_deactivate; (2) before committing, the
 * active pointer is renamed to DIR/snapshots/<escaped>/deactivated
 * (tv__snapfile_deactivate: from here on readers opening NAME get
 * TV_E_NOT_FOUND, NAME@GEN and readers already open are unaffected);
 * (3) commits; (4) removes the moved pointer (a failure there is only
 * logged: the next writer's open removes it). A failure at (1)-(3) rolls
 * the registry back and renames the pointer back: an error changes neither
 * (only when putting the pointer back fails too, which the message says,
 * does the next writer's open complete the deactivation). Crash points
 * "deactivate.pointer" (between the move and the commit: the next
 * writer's open completes it), "deactivate.commit". No active generation
 * is a no-op (*was = 0) that only checks the pointer (a stray one is
 * removed). *was (may be NULL) = the generation that was active.
 * Returns 0; TV_E_INVALID_ARG (NULL argument, reader store);
 * TV_E_NOT_FOUND (no such model); the errors of the pointer move and the
 * registry. */
int tv__store_deactivate(tv__store *st, const char *model, int64_t *was, tv_error *err);

/* The active generation of model as the next writer settles it (what
 * read-only commands report, so that they agree with what readers open):
 * the registry's, unless the pointer files show an interrupted activation
 * or deactivation (a writer killed after the pointer rename, before its
 * commit), which the next writer completes. Returns 0 and *gen (0 = none); the errors of the
 * registry and of the pointer read. */
int tv__store_settled_active(tv__store *st, const char *model, int64_t *gen, tv_error *err);

/* Crash repair, for writer open: for every model, removes leftover
 * temporary files, writes the snapshot of every ready generation whose
 * file is missing (retired ones are never rebuilt) and reconciles the
 * active pointer with the registry (see the invariants: an interrupted
 * activation or deactivation is completed, any other difference rewrites
 * the pointer; a leftover "deactivated" pointer is removed), and
 * every alias pointer (the registry wins; pointers of aliases without a
 * row are removed).
 * Costs O(models + generations) reads and no write or sync where nothing
 * differs. Keeps going after a failure and returns the first error (0 when
 * all went well). */
int tv__store_sync_snapshots(tv__store *st, tv_error *err);

/* *leased = true when a reader holds the generation's snapshot (shared
 * flock); false when none does or there is no file. Returns 0 or the errors
 * of tv__snapfile_try_exclusive. */
int tv__store_snapshot_leased(tv__store *st, const char *model, int64_t gen, bool *leased,
                              tv_error *err);

/* Removes the generation's snapshot file under the exclusive lock so that no
 * reader can open the generation afterwards (call before freeing its
 * objects). A missing file is success. Returns 0; TV_E_LEASED (a reader
 * holds it: nothing removed, keep the objects); the errors of
 * tv__snapfile_remove. */
int tv__store_remove_snapshot(tv__store *st, const char *model, int64_t gen, tv_error *err);

/* For gc, before it frees objects: objs are the objects it is about to free
 * (tv__reg_objects_unreferenced). For every retired generation that binds
 * one of them, removes the generation's snapshot under the exclusive lock,
 * so no reader can open it afterwards; when a reader holds that snapshot,
 * sets keep[i] = true for each of objs bound to that generation instead
 * (those objects must not be freed). keep has n entries, set by the caller
 * (normally all false). Retired generations with nothing to free keep their
 * snapshots. On failure the caller must free nothing.
 * Returns 0 or the registry's and tv__snapfile_remove's errors. */
int tv__store_gc_snapshots(tv__store *st, const tv__reg_object *objs, size_t n, bool *keep,
                           tv_error *err);

#endif
