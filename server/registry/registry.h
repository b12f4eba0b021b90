/* The registry: SQLite store of devices, objects, models, generations,
 * shards, tensors, leases and import jobs (docs/architecture.md: the
 * mappings it records, the store, the one connection per thread).
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

/* The connection's data version (PRAGMA data_version, from a statement
 * prepared once per connection): a value that changes whenever another
 * connection, in this process or another, commits a change to the
 * registry (never for this connection's own writes), so a reader can keep
 * rows it read while the value stays the same. Outside a transaction each
 * call is its own read transaction. Returns 0 and *version; TV_E_INVALID_ARG
 * for NULL; TV_E_REGISTRY or TV_E_LOCKED from SQLite. */
int tv__reg_data_version(tv__reg *reg, int64_t *version, tv_error *err);

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

/* Content-addressed blobs (fleet mode): the committed objects holding
 * sha256_hex (64 lower-case hex digits), by device id then object id (one
 * per device: the replicas). Returns 0 (*n may be 0: no such blob);
 * TV_E_INVALID_ARG for a malformed hash. */
int tv__reg_objects_by_sha256(tv__reg *reg, const char *sha256_hex, tv__reg_object **out, size_t *n,
                              tv_error *err);

/* One distinct committed content hash: its canonical length and how many
 * committed objects (devices) hold it. */
typedef struct tv__reg_blob {
    char sha256[TV__REG_SHA256_HEX_LEN + 1];
    uint64_t bytes;
    uint32_t n_replicas;
} tv__reg_blob;

/* The distinct committed hashes after `after` (NULL: from the first) in
 * ascending order, at most limit (>= 1) of them; *more says whether others
 * follow. Returns 0; TV_E_INVALID_ARG (limit 0, NULL arguments). */
int tv__reg_blobs_page(tv__reg *reg, const char *after, size_t limit, tv__reg_blob **out, size_t *n,
                       bool *more, tv_error *err);

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
    size_t n_kept;        /* 'writing' objects kept for a job's resume record */
    size_t n_expired;     /* resume records dropped (unused for TV__RESUME_KEEP_S) */
} tv__reg_reclaim;

#define TV__RESUME_KEEP_S 86400 /* a resume record unused this long is dropped at start-up */

/* Start-up recovery after a crash, in one transaction: drops resume records
 * of jobs finished more than TV__RESUME_KEEP_S ago, deletes every 'writing'
 * object (and its bindings) that no job's resume record names, marks every
 * 'importing' generation failed and every queued or running job failed
 * ("interrupted by a daemon restart", TV_E_INTERNAL; its resume record is
 * kept, so the next import of the same model and source resumes).
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
    uint64_t total_bytes; /* canonical bytes: every shard file, headers included */
    int64_t n_shards;
    int64_t n_tensors;
    int64_t created_at;
    int64_t n_files; /* sidecar files (files.c) */
} tv__reg_generation;

/* Creates the model if it does not exist and a new 'importing' generation
 * numbered one above the highest it ever had. model: 1..255 bytes, no
 * control characters; source: 1..4095 bytes. out may be NULL.
 * Returns 0 and *out. */
int tv__reg_generation_create(tv__reg *reg, const char *model, const char *source,
                              uint64_t total_bytes, tv__reg_generation *out, tv_error *err);
/* tv__reg_generation_create with the number given (a fleet pull keeps the
 * catalog's): number 0 = the next one; N > 0 = exactly N, the model's next
 * number afterwards max(last, N) + 1. Returns TV_E_CONFLICT when the model
 * has a generation N already, else as tv__reg_generation_create. */
int tv__reg_generation_create_as(tv__reg *reg, const char *model, const char *source,
                                 uint64_t total_bytes, int64_t number, tv__reg_generation *out,
                                 tv_error *err);

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

/* The local file a shard was imported from: its fstat identity and change
 * stamps (migrations/0006_shard_files.sql says when they are recorded). */
typedef struct tv__reg_file_stamp {
    uint64_t dev, ino, size;
    int64_t mtime_ns, ctime_ns;
} tv__reg_file_stamp;

/* Records the file shard_id (of an importing generation) was read from.
 * Returns 0; TV_E_NOT_FOUND (shard); TV_E_STATE (generation not
 * importing); TV_E_INVALID_ARG (size differs from the shard's file_len);
 * -EEXIST (already recorded). */
int tv__reg_shard_file_add(tv__reg *reg, int64_t shard_id, const tv__reg_file_stamp *f,
                           tv_error *err);

/* A file to find among the shards of ready generations: its size and the
 * SHA-256 of its 8 + N header bytes, and at least one identity: the SHA-256
 * of the whole file (sha256_hex, e.g. a Hugging Face cache blob's name) or
 * its fstat stamps (has_stamp). */
typedef struct tv__reg_shard_query {
    uint64_t file_len;
    const char *header_sha256_hex;
    const char *sha256_hex; /* NULL: not known */
    bool has_stamp;
    tv__reg_file_stamp stamp;
} tv__reg_shard_query;

typedef struct tv__reg_shard_hit {
    char model[TV__REG_NAME_MAX + 1];
    int64_t generation;
    bool active;  /* the model's active generation */
    uint32_t idx; /* the shard's position in its generation */
    char name[TV__REG_PATH_MAX];
    char sha256[TV__REG_SHA256_HEX_LEN + 1];
} tv__reg_shard_hit;

/* The shards of ready generations that are that file: same size and header
 * hash, and the same whole-file hash or the stamps recorded at its import;
 * active generations first, then the newest, then by model name. *out is
 * malloc'd (NULL when none). Returns 0; TV_E_INVALID_ARG (no identity, a
 * malformed hash). */
int tv__reg_shards_lookup(tv__reg *reg, const tv__reg_shard_query *q, tv__reg_shard_hit **out,
                          size_t *n, tv_error *err);

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

/* Clears the model's active generation (models.active_generation = NULL,
 * one UPDATE) so that it has none; the generation stays ready. *was (may
 * be NULL) = the generation that was active, 0 when there was none (then
 * nothing changes). Returns 0; TV_E_NOT_FOUND (no such model);
 * TV_E_INVALID_ARG. */
int tv__reg_generation_deactivate(tv__reg *reg, const char *model, int64_t *was, tv_error *err);

/* ready | failed -> retired. Retiring a retired generation is a no-op.
 * Returns 0; TV_E_NOT_FOUND; TV_E_STATE (the active generation, an aliased
 * one (the message names the alias), or one still importing). Live leases do not block retiring;
 * they keep the objects. */
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
/* The same without the tensors (n_tensors 0, tensors NULL): a generation's
 * shards and their replicas, cheap for a generation of 100k tensors (the
 * REST generation and tensor routes). Same returns. */
int tv__reg_shards_list(tv__reg *reg, int64_t generation_id, tv__reg_manifest **out, tv_error *err);
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
/* Models: one row, delete, pages                                           */
/* ------------------------------------------------------------------------ */

/* One model with its active generation and generation count.
 * Returns 0; TV_E_NOT_FOUND. */
int tv__reg_model_get(tv__reg *reg, const char *model, tv__reg_model *out, tv_error *err);

/* Deletes a model: refuses while a generation is active or aliased
 * (TV_E_STATE, the message says which), while one is importing (TV_E_STATE)
 * or leased (TV_E_LEASED). Otherwise, in one transaction, retires every
 * generation and deletes its rows (shards, bindings, tensors), then the
 * model row; the objects become garbage for the caller's gc. *n_retired
 * (may be NULL) = the generations removed, retired before or by this call.
 * Returns 0; TV_E_NOT_FOUND. */
int tv__reg_model_delete(tv__reg *reg, const char *model, size_t *n_retired, tv_error *err);

/* Pages: after_name / after_number = the last row of the previous page
 * ("" / 0 for the first page); at most limit (>= 1) rows; *more says
 * whether rows follow. Models by name; generations by number (the model
 * must exist: TV_E_NOT_FOUND). Free *out with free(). */
int tv__reg_models_page(tv__reg *reg, const char *after_name, size_t limit, tv__reg_model **out,
                        size_t *n, bool *more, tv_error *err);
int tv__reg_generations_page(tv__reg *reg, const char *model, int64_t after_number, size_t limit,
                             tv__reg_generation **out, size_t *n, bool *more, tv_error *err);

/* One tensor of a generation, as stored (for the REST tensor routes). The
 * bytes lie at file offset 8 + header_len + begin_off of shard shard_idx. */
typedef struct tv__reg_tensor_row {
    int64_t row_id;
    char *name; /* malloc'd */
    tv_dtype dtype;
    uint32_t rank;
    uint64_t shape[TV_ST_MAX_RANK];
    uint32_t shard_idx;
    char shard[TV__REG_NAME_MAX + 1]; /* shard file name */
    uint64_t begin_off, end_off;      /* safetensors BEGIN, END */
    uint64_t header_len;              /* of the shard */
} tv__reg_tensor_row;

/* The orders of a tensor listing (GET .../tensors?order=). */
typedef enum tv__reg_tensor_order {
    TV__REG_TENSORS_FILE = 0, /* shard idx, begin_off, row id */
    TV__REG_TENSORS_NAME = 1, /* name (bytes) */
    TV__REG_TENSORS_SIZE = 2, /* nbytes (end_off - begin_off) descending, then name (bytes) */
} tv__reg_tensor_order;

/* A page of a generation's tensors whose names start with prefix (NULL or
 * "" = all), in order. The cursor is the last row of the previous page:
 * FILE: after_row_id (0 = first page); NAME: after_name (NULL or "" =
 * first page); SIZE: after_nbytes and after_name (after_name NULL or "" =
 * first page; names are never empty). limit >= 1. Free with
 * tv__reg_tensor_rows_free. Returns 0; TV_E_NOT_FOUND (generation);
 * TV_E_INVALID_ARG (bad order, negative after_row_id, or after_row_id
 * names no tensor of the generation: a stale or forged cursor);
 * TV_E_OVERFLOW (after_nbytes over INT64_MAX). */
int tv__reg_tensors_page(tv__reg *reg, int64_t generation_id, const char *prefix,
                         tv__reg_tensor_order order, int64_t after_row_id, uint64_t after_nbytes,
                         const char *after_name, size_t limit, tv__reg_tensor_row **out, size_t *n,
                         bool *more, tv_error *err);
/* The same, of the tensors whose names also hold the bytes of contains
 * anywhere (NULL or "" = no such condition; case-sensitive). */
int tv__reg_tensors_search(tv__reg *reg, int64_t generation_id, const char *prefix,
                           const char *contains, tv__reg_tensor_order order, int64_t after_row_id,
                           uint64_t after_nbytes, const char *after_name, size_t limit,
                           tv__reg_tensor_row **out, size_t *n, bool *more, tv_error *err);
/* NULL-safe. */
void tv__reg_tensor_rows_free(tv__reg_tensor_row *rows, size_t n);

/* One tensor by name. out->name is malloc'd (free it). Returns 0;
 * TV_E_NOT_FOUND (generation or tensor). */
int tv__reg_tensor_get(tv__reg *reg, int64_t generation_id, const char *name,
                       tv__reg_tensor_row *out, tv_error *err);

/* ------------------------------------------------------------------------ */
/* Aliases                                                                  */
/* ------------------------------------------------------------------------ */

#define TV__ALIAS_MAX 64 /* bytes, NUL excluded */

/* The alias rule: [A-Za-z][A-Za-z0-9._-]{0,63}, and not "active" (the
 * implicit alias of the active generation). Digits-only strings cannot be
 * aliases (they start with a digit), so "NAME@3" is always a generation.
 * Returns 0 or TV_E_NAME (the message quotes the alias). */
int tv__alias_name_valid(const char *alias, tv_error *err);

typedef struct tv__reg_alias {
    char model[TV__REG_NAME_MAX + 1];
    char alias[TV__ALIAS_MAX + 1];
    int64_t generation; /* number */
    int64_t updated_at;
} tv__reg_alias;

/* Points alias at a ready generation of model (creates or moves it, one
 * statement). alias "active" activates the generation instead.
 * Returns 0; TV_E_NAME; TV_E_NOT_FOUND (model, generation); TV_E_STATE (the
 * generation is not ready). */
int tv__reg_alias_set(tv__reg *reg, const char *model, const char *alias, int64_t number,
                      tv_error *err);

/* Removes an alias; *number (may be NULL) = the generation it named.
 * Returns 0; TV_E_NOT_FOUND (model or alias); TV_E_NAME ("active" or a
 * name breaking the rule). */
int tv__reg_alias_remove(tv__reg *reg, const char *model, const char *alias, int64_t *number,
                         tv_error *err);

/* The generation an alias names ("active" works too: the active one).
 * Returns 0; TV_E_NOT_FOUND (model, alias, no active generation); TV_E_NAME. */
int tv__reg_alias_get(tv__reg *reg, const char *model, const char *alias, int64_t *number,
                      tv_error *err);

/* A model's aliases by name ("active" not included). Returns 0 (*n may be
 * 0); TV_E_NOT_FOUND (model). */
int tv__reg_aliases_list(tv__reg *reg, const char *model, tv__reg_alias **out, size_t *n,
                         tv_error *err);

/* Generation spec -> number: "3" (digits, no leading zero; the generation
 * must exist), "active", or an alias name.
 * Returns 0; TV_E_NOT_FOUND; TV_E_NAME (neither a number nor a valid alias). */
int tv__reg_resolve_gen(tv__reg *reg, const char *model, const char *gen_spec, int64_t *number,
                        tv_error *err);

/* ------------------------------------------------------------------------ */
/* Jobs (import and verify)                                                 */
/* ------------------------------------------------------------------------ */

typedef enum tv__job_state {
    TV__JOB_QUEUED = 0,
    TV__JOB_RUNNING = 1,
    TV__JOB_SUCCEEDED = 2,
    TV__JOB_FAILED = 3,
    TV__JOB_CANCELLED = 4,
} tv__job_state;

typedef enum tv__job_kind {
    TV__JOB_IMPORT = 0,
    TV__JOB_VERIFY = 1,
} tv__job_kind;

/* "queued", "running", "succeeded", "failed", "cancelled"; NULL when out of
 * range. */
const char *tv__job_state_name(tv__job_state s);
/* "import", "verify"; NULL when out of range. */
const char *tv__job_kind_name(tv__job_kind k);
/* Returns 0 or TV_E_INVALID_ARG. */
int tv__job_state_parse(const char *s, tv__job_state *out);
int tv__job_kind_parse(const char *s, tv__job_kind *out);

#define TV__JOB_STEP_MAX 16

/* A job row. Strings are "" and numbers 0 for "none" (JSON null). */
typedef struct tv__reg_job {
    int64_t id;
    tv__job_kind kind;
    tv__job_state state;
    char model[TV__REG_NAME_MAX + 1];
    char source[TV__REG_PATH_MAX];
    bool activate;
    char alias[TV__ALIAS_MAX + 1];
    bool strict;
    int64_t device_id; /* verify: 0 = every device */
    char step[TV__JOB_STEP_MAX];
    uint64_t bytes_done, bytes_total;
    double rate_bytes_per_s;
    char error_code[48]; /* tv_err_name of the failure; "" when none */
    int error_errno;     /* the TV_E_* / -errno code; 0 when none */
    char error[TV__REG_ERROR_MAX];
    int64_t generation; /* number */
    int64_t created_at, started_at, finished_at, updated_at;
    char *result_json; /* malloc'd or NULL (tv__reg_job_get, tv__reg_jobs_page) */
} tv__reg_job;

/* Creates a queued job from spec's kind, model, source, activate, alias,
 * strict, device_id and bytes_total (the rest is ignored). An import needs
 * model and source. Returns 0 and *id (may be NULL). */
int tv__reg_job_create(tv__reg *reg, const tv__reg_job *spec, int64_t *id, tv_error *err);

/* Records progress (queued -> running on the first call, setting
 * started_at); step NULL keeps the stored one; generation 0 leaves the
 * stored number unchanged; done may not exceed total; rate >= 0.
 * Returns 0; TV_E_NOT_FOUND; TV_E_STATE (already finished). */
int tv__reg_job_progress(tv__reg *reg, int64_t id, const char *step, uint64_t done, uint64_t total,
                         double rate, int64_t generation, tv_error *err);

/* Finishes a queued or running job as final (succeeded, failed or
 * cancelled). code != 0 records the error: error_code = tv_err_name(code),
 * error_errno = code, error = message (tv_strerror(code) when NULL or "",
 * truncated to TV__REG_ERROR_MAX - 1 bytes); succeeded needs code 0, failed
 * a code. generation 0 leaves it as is; result_json (may be NULL) must be a
 * JSON object. Returns 0; TV_E_NOT_FOUND; TV_E_STATE (already finished);
 * TV_E_INVALID_ARG. */
int tv__reg_job_finish(tv__reg *reg, int64_t id, tv__job_state final, int code, const char *message,
                       int64_t generation, const char *result_json, tv_error *err);

/* Returns 0, TV_E_NOT_FOUND. Free out->result_json. */
int tv__reg_job_get(tv__reg *reg, int64_t id, tv__reg_job *out, tv_error *err);

/* Resume records of remote imports (migrations/0005_job_resume.sql: what a
 * job reserved and how far each reservation is written and flushed).
 * set: records json (a JSON object) as job id's record, or clears it (NULL).
 * Returns 0; TV_E_INVALID_ARG (not a JSON object). */
int tv__reg_job_set_resume(tv__reg *reg, int64_t id, const char *json, tv_error *err);
/* In one transaction, moves the record of the newest failed or cancelled
 * import job of model from source to job id. Returns 0 with *json
 * (malloc'd) and *from (may be NULL: the job it came from), or *json NULL
 * and *from 0 when there is none. */
int tv__reg_job_take_resume(tv__reg *reg, int64_t id, const char *model, const char *source,
                            char **json, int64_t *from, tv_error *err);

/* Jobs newest first, optionally one state and/or kind (-1 = any), with id
 * below before_id (0 = from the newest); at most limit (>= 1). Free with
 * tv__reg_jobs_free. */
int tv__reg_jobs_page(tv__reg *reg, int state, int kind, int64_t before_id, size_t limit,
                      tv__reg_job **out, size_t *n, bool *more, tv_error *err);
/* NULL-safe; frees each result_json and the array. */
void tv__reg_jobs_free(tv__reg_job *jobs, size_t n);

/* ------------------------------------------------------------------------ */
/* API tokens                                                               */
/* ------------------------------------------------------------------------ */

typedef enum tv__scope {
    TV__SCOPE_NONE = 0,
    TV__SCOPE_READ = 1,
    TV__SCOPE_ADMIN = 2,
    /* A peer's token: only the blob routes (GET/HEAD /v1/blobs...), which
     * need fleet or admin. Not above admin: scopes are not an order. */
    TV__SCOPE_FLEET = 3,
} tv__scope;

#define TV__TOKEN_SECRET_LEN 68 /* "tvk_" + 64 hex digits, NUL excluded */

/* "read", "admin", "fleet"; NULL otherwise. */
const char *tv__scope_name(tv__scope s);
/* Returns 0 or TV_E_INVALID_ARG. */
int tv__scope_parse(const char *s, tv__scope *out);

typedef struct tv__reg_token {
    int64_t id;
    char name[TV__REG_NAME_MAX + 1];
    tv__scope scope;
    int64_t created_at;
    int64_t revoked_at; /* 0 = live */
} tv__reg_token;

/* Creates a token: 32 random bytes (getrandom), secret_out = "tvk_" + 64
 * hex digits (shown once; only its SHA-256 is stored). scope READ, ADMIN or FLEET.
 * out may be NULL. Returns 0; -errno when no randomness is available. */
int tv__reg_token_create(tv__reg *reg, const char *name, tv__scope scope,
                         char secret_out[TV__TOKEN_SECRET_LEN + 1], tv__reg_token *out,
                         tv_error *err);

/* Looks a presented secret up by its SHA-256 (compared in constant time).
 * Returns 0, *scope and *tok (the token's row; may be NULL); TV_E_UNAUTHORIZED
 * for a malformed, unknown or revoked secret. */
int tv__reg_token_check(tv__reg *reg, const char *secret, tv__scope *scope, tv__reg_token *tok,
                        tv_error *err);

/* Every token by id (revoked ones too). */
int tv__reg_tokens_list(tv__reg *reg, tv__reg_token **out, size_t *n, tv_error *err);

/* Revokes a token (revoking twice is a no-op and keeps the first time).
 * out may be NULL. Returns 0; TV_E_NOT_FOUND. */
int tv__reg_token_revoke(tv__reg *reg, int64_t id, tv__reg_token *out, tv_error *err);

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
    int64_t object_id; /* the object this binding names */
} tv__reg_object_user;

/* Every (model, generation, shard) bound to an object, by model name, then
 * generation number, then shard idx (several when the object is shared by
 * deduplication). Returns 0 (*n = 0 when nothing binds it);
 * TV_E_NOT_FOUND when there is no such object. */
int tv__reg_object_users(tv__reg *reg, int64_t object_id, tv__reg_object_user **out, size_t *n,
                         tv_error *err);

/* A device's objects in base_off order with their users, from one read
 * transaction (the extents map of GET /v1/devices/{id}/extents). */
typedef struct tv__reg_device_objects {
    tv__reg_device device;
    tv__reg_object *objects; /* by base_off */
    size_t n_objects;
    /* By object (in objects order), then model name, generation number and
     * shard file name: objects[i]'s users are users[first_user[i] ..
     * first_user[i + 1]) (first_user has n_objects + 1 entries). */
    tv__reg_object_user *users;
    size_t n_users;
    size_t *first_user;
} tv__reg_device_objects;

/* Fills *out (free with tv__reg_device_objects_free; zeroed on failure).
 * Checks the stored extents: every object lies in [data_off, region_off +
 * region_len) and starts at or after its predecessor's end.
 * Returns 0; TV_E_NOT_FOUND (device); TV_E_REGISTRY when an object breaks
 * that (the message names the object and the device). */
int tv__reg_device_objects_get(tv__reg *reg, int64_t device_id, tv__reg_device_objects *out,
                               tv_error *err);
/* NULL-safe; leaves *m zeroed. */
void tv__reg_device_objects_free(tv__reg_device_objects *m);

/* The check tv__reg_device_objects_get makes, for objs[] (n objects of
 * device d by base_off, as tv__reg_objects_on_device lists them): d's data
 * offset lies in its region, every object in [data_off, region_off +
 * region_len), each at or after its predecessor's end. The allocator runs
 * it on what it loads, so stored extents the schema's trigger would have
 * refused are a registry error, not a bad argument.
 * Returns 0; TV_E_REGISTRY naming the object(s) and the device. */
int tv__reg_device_extents_check(const tv__reg_device *d, const tv__reg_object *objs, size_t n,
                                 tv_error *err);

/* ------------------------------------------------------------------------ */
/* Helpers                                                                  */
/* ------------------------------------------------------------------------ */

/* Formats a 32-byte digest as 64 lower-case hex digits plus NUL. */
void tv__reg_sha256_hex(const uint8_t digest[32], char out[TV__REG_SHA256_HEX_LEN + 1]);

/* True for exactly 64 lower-case hex digits. */
bool tv__reg_sha256_valid(const char *hex);

/* ------------------------------------------------------------------------ */
/* Sidecar files (files.c, migrations/0007_sidecar_files.sql)               */
/* ------------------------------------------------------------------------ */

#define TV__REG_FILE_PATH_MAX 512 /* bytes of a sidecar file's path, NUL excluded */

typedef struct tv__reg_file_in {
    const char *path; /* relative, '/'-separated (import/source.h: tv__sidecar_path_valid) */
    const void *data; /* len bytes */
    size_t len;
    const char *sha256; /* 64 lower-case hex digits: SHA-256 of data (checked) */
} tv__reg_file_in;

typedef struct tv__reg_file {
    char path[TV__REG_FILE_PATH_MAX + 1];
    uint64_t len;
    char sha256[TV__REG_SHA256_HEX_LEN + 1];
} tv__reg_file;

/* Adds n files to an importing generation: each content stored once
 * (sidecar_blobs, by its hash: a content already there is not written
 * again), each path once. Returns 0; TV_E_STATE (the generation is not
 * importing); -EEXIST (a path twice); TV_E_HASH_MISMATCH (a sha256 that is
 * not data's). */
int tv__reg_generation_files_add(tv__reg *reg, int64_t generation_id, const tv__reg_file_in *f,
                                 size_t n, tv_error *err);
/* The files of a generation, by path (none: *n = 0). */
int tv__reg_generation_files_list(tv__reg *reg, int64_t generation_id, tv__reg_file **out,
                                  size_t *n, tv_error *err);
/* One file: its row into *meta and its bytes into *data (malloc'd; free()).
 * TV_E_NOT_FOUND when the generation has no file at path. */
int tv__reg_generation_file_read(tv__reg *reg, int64_t generation_id, const char *path,
                                 tv__reg_file *meta, void **data, tv_error *err);
/* gc of sidecar files: drops the file rows of retired and failed
 * generations no lease holds, then every blob no row names. *n_blobs and
 * *bytes (may be NULL): what was dropped. */
int tv__reg_sidecars_gc(tv__reg *reg, size_t *n_blobs, uint64_t *bytes, tv_error *err);

#endif
