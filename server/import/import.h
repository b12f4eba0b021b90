/* The importer: a validated safetensors checkpoint becomes immutable,
 * verified objects on the store's devices and, last, a published generation.
 *
 * Invariants (the import, in this order; docs/architecture.md):
 *   1. every shard header and the index are validated before any byte is
 *      written;
 *   2. extents are reserved as 'writing' rows (non-overlapping, aligned);
 *   3. the canonical bytes plus zero padding are written with O_DIRECT in
 *      large aligned chunks, hashed (SHA-256) on the way; reading (O_DIRECT
 *      for a source not in the page cache), hashing and writing overlap
 *      (reader, hasher and writer threads);
 *   4. each device is flushed (fdatasync);
 *   5. bounds are verified and, in strict mode, every object is read back
 *      and re-hashed;
 *   6. one transaction commits the objects, the generation, its shards,
 *      bindings and tensors, and optionally activates it.
 * Any failure before 6, or a cancel (tv__import_opts.cancelled, polled
 * between chunks and steps, and at least once a second by every transfer
 * of a remote source), deletes the reservations; nothing is published
 * and the previously active generation is untouched. A shard whose SHA-256 is
 * already committed on a device is bound to that object, not written again. */
#ifndef TV_IMPORT_IMPORT_H
#define TV_IMPORT_IMPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "store/store.h"

#define TV__IMPORT_DEFAULT_CHUNK (8u << 20)
/* A remote source's chunk: with import.http_range's 8 MiB, the two reader
 * threads keep 4 Range requests in flight (bench/fleet.sh). */
#define TV__IMPORT_REMOTE_CHUNK (16u << 20)
#define TV__IMPORT_MAX_DEVICES  16

/* Bytes of the write step so far (done) of all it writes (total). */
typedef void (*tv__import_progress_fn)(void *ctx, uint64_t done, uint64_t total);

/* The steps of an import, in order, as tv__import_step_fn names them:
 *   "resolve"  checkpoint validated, target devices checked (total: the
 *              checkpoint's canonical bytes);
 *   "dedup"    shards whose length matches a committed object hashed
 *              (total: their bytes; 0 when there is no candidate);
 *   "reserve"  extents reserved (total: canonical bytes of the new objects);
 *   "write"    new objects written, shard by shard (total: their extents,
 *              padding and replicas included: tv__import_result.bytes_written);
 *   "flush"    every device written is flushed (total: as "write");
 *   "verify"   bounds checked, strict read-back (total: as "write");
 *   "publish"  generation committed, then activated (total: the canonical
 *              bytes).
 * Within a step done never decreases and the step's last call has done ==
 * total; shard is the shard being worked on, or TV__IMPORT_NO_SHARD. */
#define TV__IMPORT_NO_SHARD SIZE_MAX
typedef void (*tv__import_step_fn)(void *ctx, const char *step, size_t shard, uint64_t done,
                                   uint64_t total);
/* Polled between steps and between chunks, and by every transfer of a
 * remote source at least once a second; true cancels the import. */
typedef bool (*tv__import_cancel_fn)(void *ctx);

typedef struct tv__import_opts {
    bool activate;
    bool strict;            /* read every object back and re-hash */
    const int64_t *devices; /* replicas: one copy per device; NULL = first device */
    size_t n_devices;
    size_t chunk_len; /* 0 = TV__IMPORT_DEFAULT_CHUNK (a remote source: TV__IMPORT_REMOTE_CHUNK) */
    tv__import_progress_fn progress;
    void *progress_ctx;
    tv__import_step_fn on_step; /* every step's progress; may be NULL */
    void *step_ctx;
    tv__import_cancel_fn cancelled; /* may be NULL */
    void *cancel_ctx;
    const struct tv__src_http_opts *http; /* an http(s):// source: NULL = defaults */
    /* A fleet pull (import/source.h): when set, src is ignored (may be
     * NULL); every shard's SHA-256 must equal the pull's (else
     * TV_E_HASH_MISMATCH before anything is published, and the pull's
     * on_bad_file hears of it). */
    const struct tv__src_pull *pull;
    /* A local source opened once, when the daemon checked the request
     * (import/source.h: tv__src_local): when set, src is only what the job
     * row says; every file is read through it. */
    const struct tv__src_local *local;
    /* 0: the model's next number; N > 0: publish as generation N
     * (TV_E_CONFLICT when the model has it already). */
    int64_t generation;
    /* Resume, for a remote source (http(s)://, s3:// or a pull; ignored for
     * a local path). resume: the record an interrupted import of the same
     * model and source left (migrations/0005_job_resume.sql), or NULL; its
     * reservations that still match (shard name and length, device, the
     * pull's SHA-256, generation) are written on from where they were
     * flushed, after re-hashing what the device holds; the others are
     * deleted. resume_save (NULL: no resume) hears this import's record
     * after the reservations and after a flush every few seconds of
     * writing, and NULL once nothing is to be kept: published, or failed
     * for a reason a retry does not cure. A failure a retry may cure (a
     * network or I/O error, -EIO, -EPROTO, -ETIMEDOUT, ...) keeps the
     * reservations the last record names. */
    const char *resume;
    void (*resume_save)(void *ctx, const char *json);
    void *resume_ctx;
    /* The sidecar files' caps (import.sidecar_max_bytes and
     * import.sidecar_total_bytes; zeros: the defaults, import/source.h). */
    uint64_t sidecar_max_len;
    uint64_t sidecar_total_len;
    /* Hears every sidecar file not stored ("skipped: NAME (why)", also
     * logged), before the import publishes; may be NULL. */
    void (*on_skipped)(void *ctx, const char *line);
    void *skipped_ctx;
} tv__import_opts;

typedef struct tv__import_result {
    int64_t generation;
    size_t n_shards;
    size_t n_tensors;
    uint64_t bytes_total;   /* canonical bytes of the checkpoint */
    uint64_t bytes_written; /* bytes written to devices (padding and replicas included) */
    uint64_t bytes_deduped; /* canonical bytes bound to already committed objects */
    uint64_t
        bytes_resumed; /* canonical bytes an interrupted import had written (not fetched again) */
    double seconds;
    size_t n_files;   /* sidecar files stored with the generation */
    size_t n_skipped; /* sidecar files not stored (tv__import_opts.on_skipped heard them) */
} tv__import_result;

/* The name rule for models and aliases, one function for every place that
 * creates one (import today, the daemon and aliases later). A name is
 * 1..TV__NAME_MAX bytes of [A-Za-z0-9._-] in one or more components
 * separated by '/' (so Hugging Face repo ids like "meta-llama/Llama-3-8B"
 * work as they are); no component is empty or starts with '-' or '.', and
 * ".." appears nowhere. Everything else is refused: '@' (the NAME@GEN and
 * NAME@ALIAS syntax), whitespace, control characters, non-ASCII bytes and
 * every other punctuation. what names the kind in the message ("model name").
 * Returns 0 or TV_E_NAME (the message quotes the name and the byte at fault). */
#define TV__NAME_MAX 128 /* bytes; NAME_RULE in import.c says it too */
int tv__name_valid(const char *name, const char *what, tv_error *err);

/* Imports src (a .safetensors file, an index, or a directory; or an
 * http(s):// URL of one, see import/src_http.c) as a new
 * generation of model. st must be a writer store.
 * Returns 0 and *res (may be NULL); TV_E_NAME (model breaks the name rule,
 * checked before anything is read or written); the checkpoint errors (TV_E_ST_*,
 * TV_E_IDX_*, ...); TV_E_NO_SPACE; TV_E_SOURCE_CHANGED (a shard was replaced,
 * resized, written or opened for writing after validation; see import.c for
 * what the checks can and cannot see); TV_E_HASH_MISMATCH (strict read-back);
 * TV_E_DEVICE_MISMATCH; -ECANCELED (o->cancelled said so before publish:
 * reservations released, nothing published), or TV_E_CANCELLED (the same,
 * heard by a transfer of a remote source, which it cut short); -EIO,
 * -ENOSPC and other -errno from the devices; the registry's errors. */
int tv__import(tv__store *st, const char *model, const char *src, const tv__import_opts *o,
               tv__import_result *res, tv_error *err);

/* Re-hashes one committed object and compares with its registry hash.
 * Returns 0; TV_E_HASH_MISMATCH; the device errors. */
int tv__verify_object(tv__store *st, const tv__reg_object *obj, tv_error *err);

#endif
