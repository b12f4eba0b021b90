/* libtensorvault's reader API: one handle, tv_model, for one generation of
 * a model, and one set of read functions for it, whichever way it was
 * opened:
 *   - in-process from a store directory (tv_model_open; or a snapshot
 *     image, tv_model_open_snapshot): the process opens the store's devices
 *     read-only and reads them with aligned O_DIRECT reads;
 *   - through a co-located tensorvaultd's fast path (tv_model_open_daemon,
 *     in a session of tensorvault/client.h): the daemon reads, the bytes
 *     arrive in shared memory; no device permission is needed.
 * A loader written against these functions reads a model opened either way;
 * the two differ only in how the model is opened and in the errors a
 * session adds (below).
 *
 * C API and ABI (docs/c-api.md):
 *   - stable: the functions, types, struct layouts, constants and error
 *     codes of the headers in tensorvault/. The shared library (SONAME
 *     libtensorvault.so.1) exports exactly the tv_ functions declared
 *     there, nothing else. Within one SONAME functions, error codes and
 *     constants are only added; a removed function, a changed signature or
 *     a changed struct layout bumps the SONAME. Option structs
 *     (tv_open_opts, tv_client_opts) are zero-initialized by the caller: 0
 *     is every field's default.
 *   - handles (tv_model, tv_client, tv_tensor) are opaque, made and freed
 *     only by the library; every destructor accepts NULL.
 *   - errors: every function returning int returns 0 or a negative code:
 *     -errno (-ENOMEM, -EIO, ...) or TV_E_* (tensorvault/errors.h; append-
 *     only, never renumbered; tv_err_name and tv_strerror name them). A
 *     function taking a tv_error * fills it (code and a message naming the
 *     tensor, shard, device or path) on failure, when it is not NULL, and
 *     leaves it untouched on success.
 *   - tv_version() is the library's release (TV_VERSION_STRING the
 *     header's); the SONAME changes only with the ABI.
 *
 * Errors every read function below may return beyond its own (its
 * "read errors"):
 *   a model opened from a store: TV_E_NO_REPLICA (every device holding the
 *     shard is excluded: the message names the shard and each replica's
 *     device and reason; nothing is read); TV_E_SHORT_IO, TV_E_TIMEOUT,
 *     -EIO, -ENXIO and other -errno from a device (after every valid
 *     replica failed); -ENOMEM;
 *   a model opened through the daemon: what the daemon reports for the
 *     request (the errors above, as it read them, or TV_E_CANCELLED);
 *     TV_E_DISCONNECTED (the session is closed or died: reconnect with
 *     tv_client_connect and open again), TV_E_PROTOCOL (the daemon sent
 *     something the protocol does not allow: the session is closed),
 *     TV_E_TIMEOUT (no reply within the session's timeout: the session is
 *     closed), the code of a fatal ERROR the daemon closed the session with
 *     (TV_E_BUSY, ...); -errno of the socket; -ENOMEM.
 *
 * Invariants kept for every call below, both ways:
 *   - a read writes only [dest, dest + nbytes) of the caller's buffer (never
 *     its neighbours, whatever the alignment of dest or of the tensor); every
 *     argument check comes before the first byte is read, so a refused call
 *     writes nothing;
 *   - a tensor is reported ready only when every one of its bytes arrived;
 *     short reads, EIO and timeouts are errors and never publish partial
 *     data as success; no byte is written into a destination after the call
 *     returned;
 *   - the generation is fixed for the handle's lifetime and leased (gc
 *     never frees leased objects): a model of tv_model_open holds a shared
 *     flock on its snapshot file, a daemon model the daemon's lease (a
 *     model of tv_model_open_snapshot holds none);
 *   - (store) every device is validated (label, size, LBA size, identity)
 *     against the snapshot at open, before the first read; a device that is
 *     missing, resized or relabelled (label overwritten, or another
 *     store's) is excluded: closed at once, never read, logged as a warning
 *     and reported by tv_model_device. Reads use the other replicas; only
 *     the tensors of a shard with no valid replica fail (TV_E_NO_REPLICA),
 *     and the open itself fails only when no shard has a valid replica;
 *   - every size from the options is bounded before anything is opened or
 *     allocated (limits below), and every size and offset from the snapshot
 *     is checked arithmetic; a snapshot received from the daemon is
 *     validated (seals, checksum, model, generation) like a stored one.
 * Metadata calls (tv_model_n_*, tv_model_tensor, tv_model_find,
 * tv_model_shard) are answered from the snapshot in memory, never a read or
 * a round trip, and may be called from several threads; reads on one
 * tv_model (and on the models of one tv_client) need external locking. */
#ifndef TENSORVAULT_TENSORVAULT_H
#define TENSORVAULT_TENSORVAULT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tensorvault/checkpoint.h"
#include "tensorvault/errors.h"
#include "tensorvault/version.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tv_model tv_model;
/* A fast-path session with tensorvaultd (tensorvault/client.h). */
typedef struct tv_client tv_client;

enum tv_engine {
    TV_ENGINE_AUTO = 0,  /* io_uring, else the pread thread pool */
    TV_ENGINE_URING = 1, /* io_uring; TV_E_NOT_SUPPORTED if absent */
    TV_ENGINE_PREAD = 2, /* pread worker threads: identical results */
};

/* Limits of the read options (TV_E_INVALID_ARG beyond them, naming the
 * values). The staging memory of a handle is queue_depth x chunk_len
 * (chunk_len after rounding up to the devices' io alignment): at most
 * TV_READ_MAX_STAGING bytes, on transparent huge pages once a batch fills
 * it (pinned host memory for CUDA reads). */
#define TV_READ_MAX_QUEUE_DEPTH      4096u        /* io_uring ring entries per handle */
#define TV_READ_MAX_CHUNK            (1ull << 30) /* io_uring's limit for one registered buffer */
#define TV_READ_MAX_STAGING          (1ull << 30) /* queue_depth x chunk_len: 1 GiB */
#define TV_READ_DEFAULT_QUEUE_DEPTH  32u
#define TV_READ_DEFAULT_CHUNK        (1ull << 20)
#define TV_READ_MAX_COPY_THREADS     64u
#define TV_READ_DEFAULT_COPY_THREADS 4u /* capped at the online CPUs */

typedef struct tv_open_opts {
    int engine;            /* enum tv_engine */
    uint32_t queue_depth;  /* in-flight reads; 0 = TV_READ_DEFAULT_QUEUE_DEPTH; at most
                              TV_READ_MAX_QUEUE_DEPTH */
    size_t chunk_len;      /* bytes per device read, rounded up to the io alignment (a multiple
                              of 4096); at most TV_READ_MAX_CHUNK; 0 = TV_READ_DEFAULT_CHUNK,
                              lowered for deep queues so that the staging fits */
    uint32_t n_threads;    /* pread engine workers; 0 = queue_depth capped at 16; more than
                              queue_depth is capped at queue_depth */
    bool no_direct;        /* buffered reads (tests on tmpfs); default O_DIRECT */
    uint32_t copy_threads; /* threads copying staged bytes into host destinations (the
                              calling thread included), so that memcpy and the page faults
                              of fresh destinations keep up with fast devices: 0 =
                              TV_READ_DEFAULT_COPY_THREADS capped at the online CPUs; 1 =
                              the calling thread only; at most TV_READ_MAX_COPY_THREADS.
                              Workers start on the first large copy (not at open) */
} tv_open_opts;

typedef struct tv_tensor_desc {
    const char *name; /* valid while the model is open */
    size_t name_len;
    tv_dtype dtype;
    uint32_t rank;
    const uint64_t *shape;
    uint64_t nbytes;
    uint64_t n_elements;
    uint32_t shard;
} tv_tensor_desc;

/* Opens model spec of the store in store_dir, read-only: "NAME" or
 * "NAME@active" (the active generation), "NAME@GEN" (GEN: digits, no
 * leading zero) or "NAME@ALIAS" (the generation the alias names now; an
 * alias is [A-Za-z][A-Za-z0-9._-]*, at most 64 bytes). The model keeps the
 * generation it opened for its lifetime, whatever the alias or the active
 * generation does later. opts may be NULL; they are checked first,
 * before any file is opened or memory allocated.
 * Devices that fail validation are excluded (see the invariants above): the
 * open succeeds while at least one shard has a valid replica.
 * Returns 0 and *out (close with tv_model_close); TV_E_INVALID_ARG (NULL
 * argument, bad spec, unknown engine, queue_depth, chunk_len, copy_threads
 * or staging over the limits above: the message names the values);
 * TV_E_NOT_FOUND (no such model, generation or alias, or no active one);
 * when no shard has a valid replica, the first excluded device's reason
 * (TV_E_DEVICE_MISMATCH, -ENOENT, -EIO, ...; the message names every
 * device and its reason); TV_E_NOT_SUPPORTED (engine asked for is
 * unavailable); the snapshot's validation errors (TV_E_SNAPSHOT;
 * TV_E_SNAPSHOT_IDENTITY: the file holds another model or generation);
 * -errno from open; -ENOMEM. */
int tv_model_open(const char *store_dir, const char *spec, const tv_open_opts *opts, tv_model **out,
                  tv_error *err);

/* Opens from a snapshot image held in memory (copied; the caller keeps buf),
 * as a store model: its devices are opened by the paths the snapshot
 * records. No lease is held (nothing stops gc from freeing the objects).
 * Same returns as tv_model_open (TV_E_INVALID_ARG for a NULL buf or out;
 * no TV_E_NOT_FOUND). */
int tv_model_open_snapshot(const void *buf, size_t len, const tv_open_opts *opts, tv_model **out,
                           tv_error *err);

/* Opens spec ("NAME", "NAME@GEN", "NAME@ALIAS", as tv_model_open; at most
 * 512 bytes) through tensorvaultd's fast path, in session (tv_client_connect).
 * The daemon holds the lease on the generation until the model is closed
 * (or the session ends). opts may be NULL: they are checked as
 * tv_model_open checks them, and otherwise unused (the daemon does the
 * device reads with its own settings). The model belongs to the caller,
 * not to the session: tv_client_close leaves it open but detached (its
 * reads fail with TV_E_DISCONNECTED, its metadata stays), and it is freed
 * by tv_model_close only.
 * Returns 0 and *out; TV_E_INVALID_ARG (NULL argument, bad spec or options);
 * TV_E_NOT_FOUND (no such model, generation or alias, or a retired
 * generation); TV_E_PEER_DENIED (this uid and groups may not open the
 * model); TV_E_BUSY (the session's handle limit, or the daemon's group
 * limit); the daemon's other open errors (TV_E_NO_REPLICA, -EIO, ...: its
 * message); TV_E_SNAPSHOT (the snapshot received fails validation, or is
 * another model's or generation's); TV_E_DISCONNECTED (the session is
 * closed); TV_E_PROTOCOL, TV_E_TIMEOUT, a fatal ERROR's code (the session
 * is closed then); -errno (mmap, the socket); -ENOMEM. */
int tv_model_open_daemon(tv_client *session, const char *spec, const tv_open_opts *opts,
                         tv_model **out, tv_error *err);

/* Closes the model: a store model's devices, lease and buffers, a daemon
 * model's handle (the daemon's CLOSE releases its lease; with the session
 * closed or dead nothing is sent) and mappings. Every tv_tensor_desc,
 * tv_shard_desc and name it handed out dies with it. NULL-safe. */
void tv_model_close(tv_model *m);

/* The generation number of the open handle (0 for NULL). */
int64_t tv_model_generation(const tv_model *m);
/* The model's name, as its snapshot records it; valid while the model is
 * open (NULL for NULL). */
const char *tv_model_name(const tv_model *m);

/* The devices of the open generation, as validated at open. */
typedef struct tv_device_status {
    const char *path;    /* as recorded in the store; valid while the model is open */
    bool excluded;       /* never read by this handle */
    int reason;          /* 0, or why it was excluded: TV_E_DEVICE_MISMATCH (label overwritten
                            or of another store, resized, other geometry or identity),
                            -ENOENT (missing), -EACCES, -EIO (label unreadable), ... */
    const char *message; /* "" or the reason in words, naming the device */
} tv_device_status;

/* Number of devices this process opened for the model, and of those
 * excluded (0 for NULL; 0 for a daemon model: the daemon holds the
 * devices). */
size_t tv_model_n_devices(const tv_model *m);
size_t tv_model_n_excluded_devices(const tv_model *m);
/* i-th device. Returns 0 or TV_E_INVALID_ARG (NULL, i out of range: always
 * for a daemon model). */
int tv_model_device(const tv_model *m, size_t i, tv_device_status *out);

/* Number of tensors of the generation (0 for NULL). */
size_t tv_model_n_tensors(const tv_model *m);
/* i-th tensor in file order. Its snapshot record is decoded and validated
 * on first use (opening does no per-tensor work). Returns 0;
 * TV_E_INVALID_ARG (NULL, i out of range); TV_E_SNAPSHOT (an invalid record:
 * possible only for a snapshot whose checksum was forged) or -ENOMEM, then
 * *out is an empty tensor (name "", rank 0, 0 bytes). */
int tv_model_tensor(const tv_model *m, size_t i, tv_tensor_desc *out);
/* The index of tensor name (name_len bytes, no NUL needed) in *index (when
 * index is not NULL). O(1), never allocates. Returns 0 or TV_E_NOT_FOUND
 * (also for a NULL model or name). */
int tv_model_find(const tv_model *m, const char *name, size_t name_len, size_t *index);

/* One shard (safetensors file) of the generation, in the order of
 * tv_tensor_desc.shard. Its object on the device is the file byte for byte,
 * so its first 8 + header_len bytes are the file's little-endian u64 header
 * length and JSON header (with "__metadata__", if the file had one). */
typedef struct tv_shard_desc {
    const char *name; /* the shard's file name as imported, valid while the model is open */
    size_t name_len;
    uint64_t file_len;   /* bytes of the shard file */
    uint64_t header_len; /* the JSON header's bytes; the header read returns 8 + header_len */
} tv_shard_desc;

/* Number of shards of the generation (0 for NULL). */
size_t tv_model_n_shards(const tv_model *m);
/* i-th shard. Returns 0; TV_E_INVALID_ARG (NULL, i out of range; then *out,
 * when not NULL, is an empty shard: name "", 0 bytes). */
int tv_model_shard(const tv_model *m, size_t i, tv_shard_desc *out);
/* Reads the first 8 + header_len bytes of shard `shard`'s file (the
 * little-endian u64 length and the JSON header, byte for byte as imported)
 * into dest (dest_len >= 8 + header_len; only those bytes are written).
 * Every check comes before any read. Returns 0; TV_E_INVALID_ARG (NULL
 * model, shard out of range, dest NULL or too small: nothing written);
 * TV_E_SNAPSHOT (the shard's record is invalid: a forged checksum);
 * TV_E_NOT_SUPPORTED (a daemon model whose daemon speaks fast-path
 * protocol version 1: nothing is sent or written); the read errors. */
int tv_read_shard_header(tv_model *m, size_t shard, void *dest, size_t dest_len, tv_error *err);

/* Reads tensor `name` (NUL-terminated) into dest (dest_len >= its nbytes;
 * only nbytes are written). Returns 0; TV_E_NOT_FOUND (no such tensor: the
 * message names it and the model); TV_E_INVALID_ARG (NULL model or name,
 * dest NULL with nbytes > 0, or dest_len too small: nothing written);
 * TV_E_SNAPSHOT (the tensor's record is invalid: a forged checksum);
 * TV_E_ST_NOT_BYTE_ADDRESSABLE never (whole tensors of any dtype are
 * bytes); the read errors. */
int tv_read_into(tv_model *m, const char *name, void *dest, size_t dest_len, tv_error *err);

typedef struct tv_read_req {
    const char *name; /* or NULL to use index */
    size_t index;
    void *dest;
    size_t dest_len;
    int result; /* out: 0 or the error of this tensor */
} tv_read_req;

/* Reads the n tensors of reqs at once, each whole into its dest: a store
 * model coalesces adjacent tensors into large sequential reads; a daemon
 * model sends them as few READ messages and completes them as the chunks
 * arrive, in any order. Each request is checked first (its own result:
 * TV_E_NOT_FOUND, TV_E_INVALID_ARG for an index out of range or a
 * destination too small, TV_E_SNAPSHOT, TV_E_NO_REPLICA), then the others
 * are read, each getting its own result. Returns 0 when all succeeded,
 * else the lowest failed request's error (err describes it, naming the
 * request); TV_E_INVALID_ARG (NULL model, or NULL reqs with n > 0: no
 * result is set); -ENOMEM; the read errors (for a daemon model a session
 * error is the result of every request not completed). */
int tv_read_batch(tv_model *m, tv_read_req *reqs, size_t n, tv_error *err);

/* Bytes [off, off + len) of tensor `name`'s data into dest (dest_len >=
 * len; only len bytes are written): only the alignment envelope of those
 * bytes is read from the device, at any (unaligned) off. len 0 reads
 * nothing and succeeds (dest may be NULL). Every check comes before any
 * read. Returns 0; TV_E_NOT_FOUND; TV_E_INVALID_ARG (NULL model or name,
 * off + len past the tensor's nbytes or overflowing, dest NULL or too
 * small: nothing written); TV_E_SNAPSHOT; the read errors. */
int tv_read_range(tv_model *m, const char *name, uint64_t off, uint64_t len, void *dest,
                  size_t dest_len, tv_error *err);

/* Rows [r0, r1) of dimension 0 of a tensor of rank >= 1: reads only those
 * rows' bytes (plus the alignment envelope) into dest. Every check comes
 * before any allocation or read.
 * r0 == r1 reads nothing and succeeds (dest may be NULL).
 * Returns 0; TV_E_NOT_FOUND; TV_E_INVALID_ARG (NULL model or name, rank 0,
 * r0 > r1, r1 > shape[0], dest NULL or too small); TV_E_OVERFLOW (the row
 * range's byte length overflows); TV_E_ST_NOT_BYTE_ADDRESSABLE (a row of a
 * sub-byte dtype that is not a whole number of bytes); TV_E_SNAPSHOT; the
 * read errors. */
int tv_read_rows(tv_model *m, const char *name, uint64_t r0, uint64_t r1, void *dest,
                 size_t dest_len, tv_error *err);

/* The byte length of rows [r0, r1) of tensor name, with exactly the checks
 * of tv_read_rows (so a caller can size its buffer before allocating it);
 * reads nothing. Returns 0 and *len (0 on failure); TV_E_INVALID_ARG (NULL
 * len, and the argument errors of tv_read_rows); TV_E_NOT_FOUND;
 * TV_E_OVERFLOW; TV_E_ST_NOT_BYTE_ADDRESSABLE; TV_E_SNAPSHOT. */
int tv_rows_len(const tv_model *m, const char *name, uint64_t r0, uint64_t r1, uint64_t *len,
                tv_error *err);

/* Reads a tensor converted to float32 (n_elements little-endian floats
 * into dest, which need not be 4-byte aligned).
 * Supported source dtypes: F32 (copy), BF16, F16, F8_E4M3, F8_E5M2, F8_E8M0.
 * Conversion is exact (every source value is representable in float32).
 * Returns 0; TV_E_NOT_SUPPORTED for other dtypes; TV_E_INVALID_ARG (dest
 * NULL or shorter than n_elements x 4 bytes); TV_E_OVERFLOW (n_elements x 4
 * overflows, or the tensor does not fit in memory); -ENOMEM (the raw bytes
 * are read into a buffer of their own, then converted); the errors of
 * tv_read_into. */
int tv_read_f32(tv_model *m, const char *name, void *dest, size_t dest_len, tv_error *err);

/* A tensor in an aligned arena owned by the library (a store model: zero
 * copy, the device read lands in the arena and data points at the payload
 * inside it; a daemon model: the payload is copied to the arena's start). */
typedef struct tv_tensor {
    const void *data;
    uint64_t nbytes;
    tv_dtype dtype;
    uint32_t rank;
    const uint64_t *shape; /* valid until tv_tensor_free */
} tv_tensor;

/* Reads tensor `name` into a new tv_tensor. Returns 0 and *out (free with
 * tv_tensor_free; it outlives the model); TV_E_INVALID_ARG (NULL out, model
 * or name); TV_E_OVERFLOW (the tensor is too large for an arena);
 * TV_E_NOT_FOUND; TV_E_SNAPSHOT; -ENOMEM; the read errors. *out is NULL on
 * failure. */
int tv_get_tensor(tv_model *m, const char *name, tv_tensor **out, tv_error *err);
/* Frees a tensor of tv_get_tensor. NULL-safe. */
void tv_tensor_free(tv_tensor *t);

/* Read-only views: a tensor's bytes where they already are, in the memory
 * tier of the tensorvaultd that serves the model (docs/fastpath.md 8.12),
 * no copy. The daemon pins the tensor's chunks (never evicted nor
 * rewritten) until the view is released, so the bytes stay valid and
 * contiguous for the view's life; a tensor already in the tier is a view
 * in one round trip, whatever its size. The memory is mapped read-only:
 * writing through a view's data faults.
 *
 * Only a model opened through the daemon (tv_model_open_daemon) whose
 * daemon speaks fast-path protocol version 3 lends views; a model opened
 * from a store, or through an older daemon, answers TV_E_NOT_SUPPORTED
 * (nothing is read: use tv_read_into or tv_get_tensor, which copy). The
 * daemon refuses a view (TV_E_BUSY: its message names the budget) when
 * pinning it would take the bytes pinned by views past its tier's budget
 * (cache.bytes) or the uid's share of it; it grants none when it keeps no
 * tier (cache.bytes = 0).
 *
 * A view talks to the model's session when it is released: the rule of
 * the model's reads applies (one thread at a time per session). Release
 * every view before tv_client_close; a model may be closed before its
 * views: its handle at the daemon then stays open (the pins with it) until
 * the last view is released. A view that outlives its session (the session
 * closed, the daemon restarted) stays mapped, but its bytes are pinned no
 * more: the daemon may evict them (the view then reads zeros, never other
 * bytes). */
typedef struct tv_view tv_view;

/* A view of tensor `name` (NUL-terminated). Returns 0 and *out (release
 * with tv_view_release); TV_E_INVALID_ARG (NULL model, name or out);
 * TV_E_NOT_SUPPORTED (not a daemon model, or its daemon speaks a version
 * before 3); TV_E_NOT_FOUND; TV_E_SNAPSHOT; TV_E_BUSY (the daemon's view
 * budget); -ENOMEM; the read errors. *out is NULL on failure. */
int tv_tensor_view(tv_model *m, const char *name, tv_view **out, tv_error *err);

typedef struct tv_view_req {
    const char *name; /* or NULL to use index */
    size_t index;
    tv_view *view; /* out: the view (tv_view_release), NULL when result is not 0 */
    int result;    /* out: 0 or the error of this tensor */
} tv_view_req;

/* Views of the n tensors of reqs at once (as few READ messages as the
 * session allows, one round trip when the tensors are resident): each
 * request is checked first, then the others are viewed, each getting its
 * own result and view. Returns 0 when all succeeded, else the lowest failed
 * request's error (err describes it); TV_E_INVALID_ARG (NULL reqs with n >
 * 0: no result is set); TV_E_NOT_SUPPORTED (every request carries it); the
 * errors of tv_tensor_view. */
int tv_tensor_view_batch(tv_model *m, tv_view_req *reqs, size_t n, tv_error *err);
/* The view's first byte (read-only; valid until tv_view_release; NULL for
 * NULL) and its length in bytes (the tensor's nbytes; 0 for NULL). */
const void *tv_view_data(const tv_view *v);
uint64_t tv_view_nbytes(const tv_view *v);
/* The view's bytes in a private, writable, copy-on-write mapping of the
 * tier's pages (MAP_PRIVATE): reading shares the daemon's memory (no copy);
 * the first write to a page copies that page for this process alone, so
 * neither the daemon, other processes nor a later view ever see it. For
 * frameworks whose tensors must be writable (torch). The same address
 * every call; valid, like tv_view_data, until tv_view_release, which
 * unmaps it (and its private copies). The pins are the view's: a view
 * that outlives its session reads zeros where the daemon evicted. Returns
 * 0 and *data (tv_view_data for a 0-byte view); TV_E_INVALID_ARG (NULL
 * v or data); TV_E_NOT_SUPPORTED (this handle kept no descriptor of the
 * tier); -errno of mmap (e.g. -ENOMEM where the tier is on hugetlb pages
 * and none is free for a private copy). */
int tv_view_map(tv_view *v, void **data, tv_error *err);
/* Gives the view's pins back to the daemon (when its session lives) and
 * frees it (and unmaps tv_view_map's mapping); with the model closed and
 * this its last view, closes the model's handle at the daemon too.
 * NULL-safe. */
void tv_view_release(tv_view *v);

/* Reads a tensor into CUDA device memory with cudaMemcpyAsync on stream (a
 * cudaStream_t, NULL = the default stream): a store model through a pinned
 * staging ring (device reads overlap the copies), a daemon model straight
 * from the shared arena (pinned when the session asked, cuda_register).
 * Returns when the bytes are on the GPU. Returns 0; TV_E_NOT_SUPPORTED
 * when built without CUDA or no GPU is present (nothing read or written);
 * TV_E_INVALID_ARG (NULL model, dev_ptr not device memory of dev_len
 * bytes, dev_len too small); the errors of tv_read_into; -EIO for CUDA
 * failures (the message names the CUDA error). */
int tv_read_into_cuda(tv_model *m, const char *name, void *dev_ptr, size_t dev_len, void *stream,
                      tv_error *err);
/* tv_read_batch for CUDA destinations (dest pointers are device pointers),
 * copied on stream. Returns as tv_read_batch; when the CUDA checks fail
 * (TV_E_NOT_SUPPORTED, TV_E_INVALID_ARG for a destination that is not
 * device memory, -EIO) nothing is read and every request carries that code. */
int tv_read_batch_cuda(tv_model *m, tv_read_req *reqs, size_t n, void *stream, tv_error *err);
/* True when this build has CUDA and a GPU is usable. */
bool tv_cuda_available(void);

/* Float32 conversion of raw elements (exposed for tests and the Python
 * package). Returns 0; TV_E_NOT_SUPPORTED; TV_E_INVALID_ARG (NULL src or
 * dst with n_elements > 0); TV_E_OVERFLOW (n_elements x 4 overflows). */
int tv_convert_f32(tv_dtype src_dtype, const void *src, size_t n_elements, void *dst);

#ifdef __cplusplus
}
#endif
#endif
