/* The registry: SQLite store of devices, objects, models, generations,
 * shards, tensors, leases and import jobs (DESIGN sections 1, 3 and 7).
 *
 * Threads: a tv__reg handle is one SQLite connection. Use it from one thread
 * at a time and open one handle per thread (WAL lets readers run beside the
 * single writer; writers queue on a 5 s busy timeout).
 *
 * Invariants:
 *   - every state change is one transaction: a function called outside
 *     tv__reg_begin/tv__reg_commit runs in its own BEGIN IMMEDIATE
 *     transaction; called inside one, it runs in a savepoint, so a failed
 *     call leaves the caller's transaction exactly as it was;
 *   - objects are object_align aligned, lie inside their device's data
 *     region and never overlap (checked here and by schema triggers);
 *   - a committed object is immutable, and (device, sha256) is unique among
 *     committed objects: identical shards are stored once per device;
 *   - generation states move importing -> ready | failed and
 *     ready | failed -> retired; a model's active generation is always
 *     ready; shards, bindings and tensors are added only while importing;
 *   - a ready generation has every shard bound to at least one committed
 *     object of the shard's length and hash, and no 'writing' binding;
 *   - byte quantities are uint64_t here and at most INT64_MAX in SQLite;
 *     larger values are refused with TV_E_OVERFLOW.
 *
 * Returns: 0, a negative errno or a TV_E_* code; functions taking tv_error
 * fill it on failure. Codes every function may return besides the ones it
 * lists: TV_E_INVALID_ARG (NULL or malformed argument, the message says
 * which), TV_E_REGISTRY (SQLite failure; the message carries
 * sqlite3_errmsg), TV_E_LOCKED (another writer held the database past the
 * busy timeout), -ENOMEM. Lists are returned as malloc'd arrays of the
 * fixed-size structs below (free with free(); *n = 0 and *out = NULL when
 * empty) unless a dedicated free function is named. */
#ifndef TV_REGISTRY_REGISTRY_H
#define TV_REGISTRY_REGISTRY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tensorvault/checkpoint.h"
#include "tensorvault/errors.h"

struct sqlite3;

#define TV__REG_BUSY_TIMEOUT_MS 5000
#define TV__REG_NAME_MAX        255  /* model, shard, lease owner names: bytes, NUL excluded */
#define TV__REG_PATH_MAX        4096 /* device paths, import sources: bytes, NUL included */
#define TV__REG_UUID_LEN        36   /* canonical lower-case UUID text (tv__uuid_format) */
#define TV__REG_SHA256_HEX_LEN  64   /* lower-case hex */
#define TV__REG_IDENTITY_MAX    1024 /* device identity JSON: bytes, NUL included */
#define TV__REG_ERROR_MAX       512  /* import job error text: bytes, NUL included */

typedef struct tv__reg tv__reg;

/* ------------------------------------------------------------------------ */
/* Open, close, transactions                                                */
/* ------------------------------------------------------------------------ */

/* Opens (creating with mode 0600 if absent) the registry at path: WAL,
 * synchronous=FULL, foreign_keys=ON, busy_timeout 5 s, defensive mode, then
 * applies pending migrations. path must name a file (WAL needs one).
 * Returns 0 and *out (close with tv__reg_close); TV_E_REGISTRY_TOO_NEW when
 * the database was written by a newer tensorvault; TV_E_NOT_SUPPORTED when
 * the linked SQLite is older than 3.37 (STRICT tables); -errno when the file
 * cannot be created; the errors of tv__migrate. On failure *out is NULL. */
int tv__reg_open(const char *path, tv__reg **out, tv_error *err);

/* Flags of tv__reg_open_ex. */
#define TV__REG_CREATE   0x1u /* create the file when absent and migrate it */
#define TV__REG_READONLY 0x2u /* read only: never writes, creates or migrates */

/* tv__reg_open with flags (tv__reg_open is TV__REG_CREATE). Without
 * TV__REG_CREATE the file must exist and hold a tensorvault registry: a
 * missing file is -ENOENT, an empty one, one that is not an SQLite database
 * or is corrupt, or one with no schema (user_version 0) is TV_E_REGISTRY,
 * each naming the file. TV__REG_READONLY opens with SQLite mode=ro (and,
 * when the directory is on a read-only filesystem so the -shm file cannot
 * be made and no non-empty -wal is left to read, immutable=1), applies no
 * pragma that writes and refuses a schema older than this binary's
 * (TV_E_REGISTRY: a writer command migrates it) instead of migrating. A full filesystem while
 * creating is -ENOSPC saying so. */
int tv__reg_open_ex(const char *path, unsigned flags, tv__reg **out, tv_error *err);

/* Rolls back an open explicit transaction, then closes. NULL-safe. */
void tv__reg_close(tv__reg *reg);

/* The underlying connection, for diagnostics and tests only. */
struct sqlite3 *tv__reg_sqlite(tv__reg *reg);

/* Schema version (PRAGMA user_version) and the newest this binary knows. */
int tv__reg_schema_version(tv__reg *reg, int *version, tv_error *err);
int tv__reg_schema_latest(void);

/* Explicit transactions. The outermost tv__reg_begin is BEGIN IMMEDIATE (the
 * write lock is taken at once, so two writers never interleave a
 * read-then-write); nested calls are savepoints. Every tv__reg_begin needs
 * exactly one tv__reg_commit or tv__reg_rollback.
 * tv__reg_commit returns 0, TV_E_STATE when no transaction is open, or
 * TV_E_REGISTRY (the transaction is then rolled back). */
int tv__reg_begin(tv__reg *reg, tv_error *err);
int tv__reg_commit(tv__reg *reg, tv_error *err);
/* Rolls back the innermost level. Returns 0 or TV_E_STATE when none is open.
 * Safe after SQLite already rolled back on its own. */
int tv__reg_rollback(tv__reg *reg);
/* Depth of explicit transactions (0 = none). */
int tv__reg_tx_depth(const tv__reg *reg);

/* ------------------------------------------------------------------------ */
/* Devices                                                                  */
/* ------------------------------------------------------------------------ */

typedef struct tv__reg_device {
    int64_t id;
    char uuid[TV__REG_UUID_LEN + 1]; /* store UUID from the label */
    char kind[8];                    /* "file", "block" or "nvme" */
    char path[TV__REG_PATH_MAX];
    char identity[TV__REG_IDENTITY_MAX]; /* JSON object: serial, model, nsid, nguid, eui64 */
    uint64_t lba_size;
    uint64_t io_align;     /* multiple of lba_size and 4096 */
    uint64_t object_align; /* multiple of io_align and 64 KiB */
    uint64_t size_bytes;
    uint64_t region_off; /* > 0, io_align aligned; the label block sits here */
    uint64_t region_len;
    uint64_t data_off;  /* first object byte: object_align aligned, inside the region */
    int64_t created_at; /* unix seconds */
} tv__reg_device;

/* Adds a device (in->id and in->created_at are ignored; an empty identity
 * is stored as "{}"). Checks the geometry: lba_size a power of two >= 512,
 * the alignment rules above, region_off + region_len <= size_bytes,
 * region_off < data_off <= region end.
 * Returns 0 and *id (may be NULL); TV_E_INVALID_ARG for bad geometry, a
 * malformed uuid, kind, or identity that is not a JSON object;
 * TV_E_OVERFLOW; -EEXIST when the uuid is already registered. */
int tv__reg_device_add(tv__reg *reg, const tv__reg_device *in, int64_t *id, tv_error *err);

/* Returns 0, TV_E_NOT_FOUND. */
int tv__reg_device_get(tv__reg *reg, int64_t id, tv__reg_device *out, tv_error *err);
int tv__reg_device_get_by_uuid(tv__reg *reg, const char *uuid, tv__reg_device *out, tv_error *err);

/* All devices by id. */
int tv__reg_device_list(tv__reg *reg, tv__reg_device **out, size_t *n, tv_error *err);

/* ------------------------------------------------------------------------ */
/* Objects                                                                  */
/* ------------------------------------------------------------------------ */

typedef enum tv__obj_state { TV__OBJ_WRITING = 0, TV__OBJ_COMMITTED = 1 } tv__obj_state;

typedef struct tv__reg_object {
    int64_t id;
    int64_t device_id;
    uint64_t base_off;                       /* bytes from the device start */
    uint64_t alloc_len;                      /* canonical_len padded to object_align */
    uint64_t canonical_len;                  /* the shard file's exact length */
    char sha256[TV__REG_SHA256_HEX_LEN + 1]; /* "" while writing */
    tv__obj_state state;
    int64_t created_at;
} tv__reg_object;

/* Reserving an extent is tv__alloc_reserve (import/alloc.h): it picks the
 * extent with the allocator and calls tv__reg_object_insert_writing inside
 * one IMMEDIATE transaction. */

/* Inserts a 'writing' object at [base_off, base_off + alloc_len). The schema
 * refuses a misaligned, out-of-region or overlapping extent (TV_E_REGISTRY).
 * Returns 0 and *id (may be NULL); TV_E_NOT_FOUND for an unknown device;
 * TV_E_INVALID_ARG for zero lengths or canonical_len > alloc_len. */
int tv__reg_object_insert_writing(tv__reg *reg, int64_t device_id, uint64_t base_off,
                                  uint64_t alloc_len, uint64_t canonical_len, int64_t *id,
                                  tv_error *err);

/* Every object on a device (writing and committed), by base_off: the
 * allocator's view of used extents. */
int tv__reg_objects_on_device(tv__reg *reg, int64_t device_id, tv__reg_object **out, size_t *n,
                              tv_error *err);

/* writing -> committed with its content hash (64 lower-case hex digits).
 * Returns 0; TV_E_NOT_FOUND; TV_E_STATE when already committed; -EEXIST
 * when a committed object with that hash is already on the device (use
 * tv__reg_object_find_committed first and delete the duplicate). */
int tv__reg_object_commit(tv__reg *reg, int64_t object_id, const char *sha256_hex, tv_error *err);

/* Returns 0, TV_E_NOT_FOUND. */
int tv__reg_object_get(tv__reg *reg, int64_t object_id, tv__reg_object *out, tv_error *err);

/* Dedup lookup: the committed object with this hash on the device.
 * Returns 0, TV_E_NOT_FOUND. */
int tv__reg_object_find_committed(tv__reg *reg, int64_t device_id, const char *sha256_hex,
                                  tv__reg_object *out, tv_error *err);

/* Committed objects (for verify), by device then base_off; device_id 0 = all
 * devices. */
int tv__reg_objects_list_committed(tv__reg *reg, int64_t device_id, tv__reg_object **out, size_t *n,
                                   tv_error *err);

/* Deletes an object row and its bindings, freeing its extent. A 'writing'
 * object is always deletable. A committed one only when no importing or
 * ready generation binds it and no lease covers a generation that binds it.
 * Returns 0; TV_E_NOT_FOUND; TV_E_STATE (bound to a live generation);
 * TV_E_LEASED (bound to a leased generation). */
int tv__reg_object_delete(tv__reg *reg, int64_t object_id, tv_error *err);

typedef struct tv__reg_reclaim {
    size_t n_objects;     /* 'writing' objects deleted */
    size_t n_generations; /* 'importing' generations marked failed */
    size_t n_jobs;        /* queued or running jobs marked failed */
} tv__reg_reclaim;

/* Start-up recovery after a crash, in one transaction: deletes every
 * 'writing' object (and its bindings), marks every 'importing' generation
 * failed and every queued or running import job failed ("interrupted").
 * Call only while no import runs (the daemon holds the store lock).
 * out may be NULL. Returns 0. */
int tv__reg_reclaim_writing(tv__reg *reg, tv__reg_reclaim *out, tv_error *err);

/* Garbage: committed objects bound to no importing or ready generation and
 * to no generation that holds a lease (objects of retired and failed
 * generations, or of none). By device then base_off. The caller frees them
 * with tv__reg_object_delete, which re-checks under the write lock. */
int tv__reg_objects_unreferenced(tv__reg *reg, tv__reg_object **out, size_t *n, tv_error *err);

/* ------------------------------------------------------------------------ */
/* Models, generations, shards, tensors                                     */
/* ------------------------------------------------------------------------ */

typedef enum tv__gen_state {
    TV__GEN_IMPORTING = 0,
    TV__GEN_READY = 1,
    TV__GEN_FAILED = 2,
    TV__GEN_RETIRED = 3,
} tv__gen_state;

/* "importing", "ready", "failed", "retired"; NULL when out of range. */
const char *tv__gen_state_name(tv__gen_state s);
/* Returns 0 or TV_E_INVALID_ARG. */
int tv__gen_state_parse(const char *s, tv__gen_state *out);

typedef struct tv__reg_model {
    int64_t id;
    char name[TV__REG_NAME_MAX + 1];
    int64_t active_generation; /* number; 0 = none */
    int64_t n_generations;
    int64_t created_at;
} tv__reg_model;

typedef struct tv__reg_generation {
    int64_t id;
    int64_t model_id;
    char model[TV__REG_NAME_MAX + 1];
    int64_t number; /* 1, 2, ... per model; never reused */
    tv__gen_state state;
    bool active;
    char source[TV__REG_PATH_MAX];
    uint64_t total_bytes;
    int64_t n_shards;
    int64_t n_tensors;
    int64_t created_at;
} tv__reg_generation;

/* Creates the model if it does not exist and a new 'importing' generation
 * numbered one above the highest it ever had. model: 1..255 bytes, no
 * control characters; source: 1..4095 bytes. out may be NULL.
 * Returns 0 and *out. */
int tv__reg_generation_create(tv__reg *reg, const char *model, const char *source,
                              uint64_t total_bytes, tv__reg_generation *out, tv_error *err);

/* number 0 means the active generation. Returns 0; TV_E_NOT_FOUND (no such
 * model, generation, or no active generation). */
int tv__reg_generation_get(tv__reg *reg, const char *model, int64_t number, tv__reg_generation *out,
                           tv_error *err);
int tv__reg_generation_get_by_id(tv__reg *reg, int64_t generation_id, tv__reg_generation *out,
                                 tv_error *err);

/* Active generation number of a model. Returns 0; TV_E_NOT_FOUND for an
 * unknown model or one with no active generation (the message says which). */
int tv__reg_active_generation(tv__reg *reg, const char *model, int64_t *number, tv_error *err);

typedef struct tv__reg_shard_in {
    uint32_t idx;                  /* position in the checkpoint (0-based) */
    const char *name;              /* file name as listed in the index */
    uint64_t file_len;             /* = canonical_len of its objects */
    uint64_t header_len;           /* N of the 8-byte prefix */
    const char *sha256_hex;        /* of the whole file */
    const char *header_sha256_hex; /* of the 8 + N header bytes */
} tv__reg_shard_in;

/* Adds a shard to an importing generation. Returns 0 and *shard_id (may be
 * NULL); TV_E_NOT_FOUND (generation); TV_E_STATE (not importing); -EEXIST
 * (idx or name already present); TV_E_INVALID_ARG (header past file_len,
 * malformed hashes). */
int tv__reg_shard_add(tv__reg *reg, int64_t generation_id, const tv__reg_shard_in *in,
                      int64_t *shard_id, tv_error *err);

/* Binds a shard to an object (one per device; several objects = replicas).
 * The object's canonical_len must equal the shard's file_len and, once
 * committed, its hash must equal the shard's.
 * Returns 0; TV_E_NOT_FOUND (shard or object); TV_E_STATE (generation not
 * importing); TV_E_INVALID_ARG (length mismatch); TV_E_HASH_MISMATCH;
 * -EEXIST (the shard already has an object on that device). */
int tv__reg_shard_bind(tv__reg *reg, int64_t shard_id, int64_t object_id, tv_error *err);

/* Bulk insert of a generation's tensors with one prepared statement (run it
 * inside the publish transaction; 120k tensors take well under a second).
 * t[i].shard is the shard idx given to tv__reg_shard_add; begin_off/end_off
 * are relative to that shard's data section (safetensors BEGIN/END) and must
 * lie inside it; rank <= TV_ST_MAX_RANK; dtype < TV_DTYPE_COUNT.
 * Atomic: either every tensor is inserted or none.
 * Returns 0; TV_E_NOT_FOUND (generation, or a shard idx with no shard row);
 * TV_E_STATE (not importing); TV_E_INVALID_ARG (the message names the
 * tensor); TV_E_OVERFLOW (a dimension or offset over INT64_MAX); -EEXIST
 * (duplicate name). */
int tv__reg_tensors_insert(tv__reg *reg, int64_t generation_id, const tv_tensor_info *t, size_t n,
                           tv_error *err);

/* Sets a generation's state along the allowed transitions. To 'ready' it
 * also checks that the generation has at least one shard and that every
 * shard is bound only to committed objects, at least one.
 * Returns 0; TV_E_NOT_FOUND; TV_E_STATE (illegal transition, the active
 * generation leaving 'ready', or a shard not fully committed). */
int tv__reg_generation_set_state(tv__reg *reg, int64_t generation_id, tv__gen_state state,
                                 tv_error *err);

/* Makes a ready generation the model's active one (one UPDATE: readers see
 * the old or the new one, never neither). Rollback = activating an older
 * ready generation. Activating the active one is a no-op.
 * Returns 0; TV_E_NOT_FOUND; TV_E_STATE (not ready). */
int tv__reg_generation_activate(tv__reg *reg, const char *model, int64_t number, tv_error *err);

/* ready | failed -> retired. Retiring a retired generation is a no-op.
 * Returns 0; TV_E_NOT_FOUND; TV_E_STATE (the active generation, or one still
 * importing). Live leases do not block retiring; they keep the objects. */
int tv__reg_generation_retire(tv__reg *reg, const char *model, int64_t number, tv_error *err);

/* Models by name with their active generation and generation count. */
int tv__reg_models_list(tv__reg *reg, tv__reg_model **out, size_t *n, tv_error *err);

/* Generations of a model by number. Returns also TV_E_NOT_FOUND (model). */
int tv__reg_generations_list(tv__reg *reg, const char *model, tv__reg_generation **out, size_t *n,
                             tv_error *err);

/* One replica of a shard: the object holding its bytes on one device. */
typedef struct tv__reg_replica {
    int64_t device_id;
    int64_t object_id;
    uint64_t base_off; /* physical = base_off + data_off + begin_off */
    uint64_t alloc_len;
    bool committed;
} tv__reg_replica;

typedef struct tv__reg_shard {
    int64_t id;
    uint32_t idx;
    const char *name;
    uint64_t file_len;
    uint64_t header_len;
    uint64_t data_off; /* 8 + header_len: where BEGIN offsets count from */
    char sha256[TV__REG_SHA256_HEX_LEN + 1];
    char header_sha256[TV__REG_SHA256_HEX_LEN + 1];
    size_t n_replicas;
    const tv__reg_replica *replicas; /* by device id */
} tv__reg_shard;

typedef struct tv__reg_tensor {
    const char *name;
    size_t name_len;
    tv_dtype dtype;
    uint32_t rank;
    uint64_t shape[TV_ST_MAX_RANK];
    uint32_t shard_idx; /* index into the listing's shards[] (= shard idx) */
    uint64_t begin_off; /* relative to the shard's data section */
    uint64_t end_off;
} tv__reg_tensor;

/* A generation's manifest: its shards (by idx, each with its replicas) and
 * its tensors (in file order: shard idx, then begin_off). For tensor t the
 * bytes on replica r of shards[t.shard_idx] are
 * [r.base_off + data_off + begin_off, r.base_off + data_off + end_off). */
typedef struct tv__reg_manifest {
    tv__reg_generation generation;
    size_t n_shards;
    tv__reg_shard *shards;
    size_t n_tensors;
    tv__reg_tensor *tensors;
    void *mem_; /* owned storage */
} tv__reg_manifest;

/* Loads the manifest of a generation in one read transaction.
 * Returns 0 and *out (free with tv__reg_manifest_free); TV_E_NOT_FOUND;
 * TV_E_REGISTRY when stored rows are inconsistent (shard idx not 0..n-1, a
 * malformed shape). */
int tv__reg_tensors_list(tv__reg *reg, int64_t generation_id, tv__reg_manifest **out,
                         tv_error *err);
/* NULL-safe. */
void tv__reg_manifest_free(tv__reg_manifest *m);

/* ------------------------------------------------------------------------ */
/* Leases                                                                   */
/* ------------------------------------------------------------------------ */

typedef struct tv__reg_lease {
    int64_t id;
    int64_t generation_id;
    char model[TV__REG_NAME_MAX + 1];
    int64_t number;
    char owner[TV__REG_NAME_MAX + 1];
    int64_t pid;
    int64_t created_at;
} tv__reg_lease;

/* Leases a ready generation of model (number 0 = the active one, resolved in
 * the same transaction so an activation cannot slip in between). While the
 * lease lives, gc never frees the generation's objects, even once retired.
 * owner: 1..255 bytes (e.g. "fastpath:conn17"); pid >= 0. out may be NULL.
 * Returns 0 and *out; TV_E_NOT_FOUND; TV_E_STATE (generation not ready). */
int tv__reg_lease_acquire(tv__reg *reg, const char *model, int64_t number, const char *owner,
                          int64_t pid, tv__reg_lease *out, tv_error *err);

/* Returns 0, TV_E_NOT_FOUND. */
int tv__reg_lease_release(tv__reg *reg, int64_t lease_id, tv_error *err);

/* Releases every lease of an owner (a dead daemon's or client's), for
 * start-up. *n (may be NULL) receives the count. Returns 0. */
int tv__reg_lease_release_owner(tv__reg *reg, const char *owner, size_t *n, tv_error *err);

/* All leases by id. */
int tv__reg_leases_list(tv__reg *reg, tv__reg_lease **out, size_t *n, tv_error *err);

/* ------------------------------------------------------------------------ */
/* Import jobs                                                              */
/* ------------------------------------------------------------------------ */

typedef enum tv__job_state {
    TV__JOB_QUEUED = 0,
    TV__JOB_RUNNING = 1,
    TV__JOB_SUCCEEDED = 2,
    TV__JOB_FAILED = 3,
} tv__job_state;

/* "queued", "running", "succeeded", "failed"; NULL when out of range. */
const char *tv__job_state_name(tv__job_state s);

typedef struct tv__reg_job {
    int64_t id;
    char model[TV__REG_NAME_MAX + 1];
    char source[TV__REG_PATH_MAX];
    tv__job_state state;
    uint64_t bytes_total;
    uint64_t bytes_done;
    char error[TV__REG_ERROR_MAX]; /* "" unless failed */
    int64_t generation;            /* number; 0 = none yet */
    int64_t created_at;
    int64_t finished_at; /* 0 while queued or running */
} tv__reg_job;

/* Creates a queued job. Returns 0 and *id (may be NULL). */
int tv__reg_job_create(tv__reg *reg, const char *model, const char *source, uint64_t bytes_total,
                       int64_t *id, tv_error *err);

/* Records progress (queued -> running on the first call); generation 0
 * leaves the stored number unchanged. bytes_done may not exceed bytes_total.
 * Returns 0; TV_E_NOT_FOUND; TV_E_STATE (already finished). */
int tv__reg_job_progress(tv__reg *reg, int64_t id, uint64_t bytes_done, uint64_t bytes_total,
                         int64_t generation, tv_error *err);

/* Finishes a queued or running job: succeeded when code == 0, else failed
 * with message (or tv_strerror(code) when message is NULL or empty,
 * truncated to TV__REG_ERROR_MAX - 1 bytes). generation 0 leaves it as is.
 * Returns 0; TV_E_NOT_FOUND; TV_E_STATE (already finished). */
int tv__reg_job_finish(tv__reg *reg, int64_t id, int code, const char *message, int64_t generation,
                       tv_error *err);

/* Returns 0, TV_E_NOT_FOUND. */
int tv__reg_job_get(tv__reg *reg, int64_t id, tv__reg_job *out, tv_error *err);

/* Jobs, newest first, at most limit (0 = all). */
int tv__reg_jobs_list(tv__reg *reg, size_t limit, tv__reg_job **out, size_t *n, tv_error *err);

/* ------------------------------------------------------------------------ */
/* Who uses an object (for verify and other reports)                         */
/* ------------------------------------------------------------------------ */

typedef struct tv__reg_object_user {
    char model[TV__REG_NAME_MAX + 1];
    int64_t generation; /* number */
    tv__gen_state state;
    bool active;                      /* the model's active generation */
    char shard[TV__REG_NAME_MAX + 1]; /* shard file name, as in the index */
    uint32_t shard_idx;
} tv__reg_object_user;

/* Every (model, generation, shard) bound to an object, by model name, then
 * generation number, then shard idx (several when the object is shared by
 * deduplication). Returns 0 (*n = 0 when nothing binds it);
 * TV_E_NOT_FOUND when there is no such object. */
int tv__reg_object_users(tv__reg *reg, int64_t object_id, tv__reg_object_user **out, size_t *n,
                         tv_error *err);

/* ------------------------------------------------------------------------ */
/* Helpers                                                                  */
/* ------------------------------------------------------------------------ */

/* Formats a 32-byte digest as 64 lower-case hex digits plus NUL. */
void tv__reg_sha256_hex(const uint8_t digest[32], char out[TV__REG_SHA256_HEX_LEN + 1]);

/* True for exactly 64 lower-case hex digits. */
bool tv__reg_sha256_valid(const char *hex);

#endif
