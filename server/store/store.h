/* A store directory: the registry (registry.db), a writer lock file (lock)
 * and the devices it names. Opening a device through the store validates its
 * label, geometry and identity against the registry before any I/O; what
 * the HTTP routes read or report of a device goes through here too (a
 * device's status, a content-addressed blob's bytes: blob.c).
 *
 * Invariants: at most one writer per store directory (flock on DIR/lock,
 * taken without waiting: a second writer gets TV_E_LOCKED naming the holder's
 * pid); a writer reclaims 'writing' reservations of crashed imports when it
 * opens; a device whose label, size, LBA size or identity differs from its
 * registry row is never read or written (TV_E_DEVICE_MISMATCH). */
#ifndef TV_STORE_STORE_H
#define TV_STORE_STORE_H

#include <stdbool.h>
#include <stdint.h>

#include "dev/dev.h"
#include "registry/registry.h"

#define TV__STORE_WRITE 0x1u /* take the writer lock and reclaim reservations */

typedef struct tv__store_dev {
    int64_t id;
    tv__dev *dev; /* opened lazily by tv__store_device */
    bool writable;
} tv__store_dev;

typedef struct tv__store {
    char *dir;
    tv__reg *reg;
    int lock_fd; /* -1 for readers */
    tv__reg_reclaim reclaimed;
    size_t n_devs;
    tv__store_dev *devs;
} tv__store;

typedef struct tv__store_init_opts {
    const char *image; /* create a sparse file image of image_size_bytes bytes (or use
                          the existing file of that size), or */
    uint64_t image_size_bytes;
    const char *device;      /* use an existing block device or image */
    uint64_t region_off;     /* 0 = 1 MiB (rounded up to io_align); else a multiple of io_align */
    uint64_t region_len;     /* 0 = the rest of the device */
    bool force;              /* overwrite another store's label or data in the region */
    tv__reg_device *row_out; /* optional: receives the registered device row */
} tv__store_init_opts;

/* Initialises a store in dir (created 0700 if missing; an existing one that
 * others can reach is used with a warning) or, when dir already holds one,
 * adds the device to it: creates the image if asked (never following a
 * symlink), checks the claim, writes a fresh label (new store UUID per
 * device), registers the device with its identity (tv__dev_claim_keys).
 * The claim: a device that is already one of this store's, by identity
 * under any path or by the label it carries, is -EEXIST even with force;
 * one holding any store's label or non-zero bytes in the region
 * (tv__dev_claim_scan's bounded scan) is TV_E_DEVICE_IN_USE unless
 * o->force. On failure nothing this call created is left (directory,
 * registry, lock, image); nothing that existed before is removed.
 * Returns 0 and *device_id (may be NULL); -EEXIST when the device is
 * already registered or an existing image has another size;
 * TV_E_DEVICE_IN_USE; TV_E_REGISTRY for a store directory whose registry is
 * missing, empty or corrupt; -ENOSPC/-EDQUOT saying the store's filesystem
 * is full; the errors of tv__dev_open, tv__dev_claim_scan,
 * tv__label_init/write, tv__reg_open_ex and tv__reg_device_add;
 * TV_E_LOCKED. */
int tv__store_init(const char *dir, const tv__store_init_opts *o, int64_t *device_id,
                   tv_error *err);

/* Opens an existing store. flags: 0 (reader: the registry is opened
 * read-only, never created or migrated, and a read-only mount works) or
 * TV__STORE_WRITE (takes DIR/lock: opened with O_NOFOLLOW | O_NONBLOCK, a
 * lock that is not a regular file is refused, never truncated).
 * Returns 0 and *out; the errors of tv__store_check_dir (run first: dir
 * is not a store, TV_E_NOT_FOUND); TV_E_REGISTRY
 * naming the file when the registry of a store directory is missing,
 * empty, corrupt or (for readers) of an older schema; TV_E_LOCKED;
 * TV_E_INVALID_ARG for a lock that is not a regular file; -ELOOP for a
 * symlinked lock; the errors of tv__reg_open_ex and tv__reg_reclaim_writing. */
int tv__store_open(const char *dir, unsigned flags, tv__store **out, tv_error *err);

/* Whether dir is a store, without opening anything: TV_E_NOT_FOUND ("DIR is
 * not a tensorvault store": missing, not a directory, no registry.db and no
 * trace of a store); TV_E_REGISTRY (a store directory, with a lock or
 * snapshots/, whose registry.db is missing or not a regular file). */
int tv__store_check_dir(const char *dir, tv_error *err);

/* NULL-safe: closes devices, the registry and releases the lock. */
void tv__store_close(tv__store *st);

/* Opens (once) and validates device id (an image never through a symlink).
 * write requires a writer store. Returns 0 and *out (owned by the store);
 * TV_E_NOT_FOUND; TV_E_DEVICE_MISMATCH for a label, geometry or identity
 * that differs (or a label block past the end of the device); a -errno such
 * as -EIO when reading the label fails (an I/O error, not a mismatch: the
 * message names the device id and path); the errors of tv__dev_open. */
int tv__store_device(tv__store *st, int64_t id, bool write, tv__dev **out, tv_error *err);

/* What device id is now, opening it through tv__store_device (a fresh
 * store sees a device that went missing since): "ok" when it opens and
 * validates, "missing" (-ENOENT), "mismatch" (TV_E_DEVICE_MISMATCH: label,
 * geometry or identity), "error" for anything else; err says why whenever
 * it is not "ok". */
const char *tv__store_device_status(tv__store *st, int64_t id, tv_error *err);

/* Resolves a device given by id, path or uuid. Returns 0 or TV_E_NOT_FOUND. */
int tv__store_find_device(tv__store *st, const char *spec, int64_t *id, tv_error *err);

/* ---- content-addressed blobs (blob.c); any store ------------------------ */

/* The canonical bytes of the committed object(s) holding one SHA-256: every
 * replica on a device that validates is a source, the first read, the
 * others taking over on an error; a read counts only when every object
 * read is still committed, unmoved, afterwards (gc may free one meanwhile).
 * A blob reads through its store (which must outlive it) from one thread
 * at a time. */
typedef struct tv__store_blob tv__store_blob;

/* Opens blob sha256 (64 lower-case hex digits) on st. Returns 0, *out and
 * *len (canonical bytes); TV_E_NOT_FOUND ("no committed object holds blob
 * sha256:HEX here"); when no replica's device validates (each is logged),
 * the first one's error; TV_E_INVALID_ARG (a malformed hash); -ENOMEM; the
 * registry's and the read engine's errors. */
int tv__store_blob_open(tv__store *st, const char *sha256, tv__store_blob **out, uint64_t *len,
                        tv_error *err);
/* Reads [off, off + len) of the blob into dest. Returns 0; TV_E_RANGE (past
 * the end); TV_E_STATE (an object was freed or moved while it was read:
 * the bytes must not be used); the read engine's and registry's errors. */
int tv__store_blob_read(tv__store_blob *b, uint64_t off, uint64_t len, uint8_t *dest,
                        tv_error *err);
/* NULL-safe. */
void tv__store_blob_close(tv__store_blob *b);

/* ---- service operations (ops.c); writer stores (or worker handles) only -- */

/* A second handle on a writer store held by this process, for one import
 * worker thread: its own registry connection and device fds, and a
 * duplicate of the writer's lock descriptor (no lock of its own: the flock
 * is the writer's, so closing the worker leaves it, and it lasts until the
 * writer and every worker are closed). No reclaim, no repair. Close with
 * tv__store_close; use from one thread at a time.
 * Returns 0 and *out; TV_E_INVALID_ARG (not a writer store); the errors of
 * tv__reg_open_ex; -errno. */
int tv__store_open_worker(const tv__store *writer, tv__store **out, tv_error *err);

/* Points alias at ready generation number of model, registry and pointer
 * file DIR/snapshots/<escaped>/alias.<alias> together, exactly the
 * tv__store_activate protocol: (1) the generation's snapshot is written if
 * missing; (2) BEGIN IMMEDIATE, tv__reg_alias_set; (3) the pointer renamed
 * into place; (4) COMMIT. A failure at (2)-(4) rolls the registry back and
 * puts the old pointer back (absent when the alias was new): an error
 * changes neither. Crash points "alias.snapshot", "alias.pointer" (between
 * the pointer and the commit: the next writer's open rewrites the pointer
 * from the registry), "alias.commit". alias "active" = tv__store_activate.
 * Returns 0; TV_E_NAME; TV_E_NOT_FOUND; TV_E_STATE (not ready); the errors
 * of the snapshot and pointer writes and the registry. */
int tv__store_alias_set(tv__store *st, const char *model, const char *alias, int64_t number,
                        tv_error *err);

/* Removes an alias, registry row and pointer file together (the same
 * protocol; crash points "alias.pointer", "alias.commit"). *number (may be
 * NULL) = the generation it named. Returns 0; TV_E_NAME ("active" or a
 * name breaking the rule); TV_E_NOT_FOUND; the pointer and registry errors. */
int tv__store_alias_remove(tv__store *st, const char *model, const char *alias, int64_t *number,
                           tv_error *err);

/* Frees every unreferenced object (tv__reg_objects_unreferenced): first the
 * snapshots of retired generations binding them are removed under their
 * exclusive lock (a generation a reader holds keeps its objects), then each
 * object row is deleted (crash points "gc.snapshot_unlink", "gc.commit").
 * Objects that became referenced or leased meanwhile are skipped.
 * *n_freed and *freed_bytes (alloc_len sums; both may be NULL).
 * Returns 0; TV_E_INVALID_ARG (reader store); the registry's and
 * tv__snapfile_remove's errors. */
int tv__store_gc(tv__store *st, size_t *n_freed, uint64_t *freed_bytes, tv_error *err);

/* Deletes a model: refused (nothing changed) while a generation is active,
 * aliased or importing (TV_E_STATE), leased in the registry or its
 * snapshot held by a reader (TV_E_LEASED). Otherwise removes every
 * generation's snapshot and, in the same registry transaction,
 * tv__reg_model_delete; after the commit removes the model's snapshot
 * directory and runs tv__store_gc. *n_retired = generations removed,
 * *freed_bytes = what gc freed (either may be NULL). Crash points
 * "model_delete.snapshots" (before the commit: the next writer's open
 * rewrites the snapshots of ready generations), "model_delete.commit".
 * Returns 0; TV_E_NOT_FOUND; TV_E_STATE; TV_E_LEASED; the errors of the
 * registry, tv__snapfile_remove and tv__store_gc (after the commit: the
 * model is gone, and a later gc frees its objects). */
int tv__store_model_delete(tv__store *st, const char *model, size_t *n_retired,
                           uint64_t *freed_bytes, tv_error *err);

#endif
