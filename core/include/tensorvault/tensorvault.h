/* libtensorvault's reader API: open one generation of a model in a store and
 * read its tensors into host or GPU memory with aligned O_DIRECT reads.
 *
 * Invariants kept for every call below:
 *   - a read writes only [dest, dest + nbytes) of the caller's buffer (never
 *     its neighbours, whatever the alignment of dest or of the tensor);
 *   - a tensor is reported ready only when every one of its bytes arrived;
 *     short reads, EIO and timeouts are errors and never publish partial
 *     data as success;
 *   - the generation is fixed for the handle's lifetime (a shared flock on
 *     its snapshot file is the lease: gc never frees leased objects);
 *   - every device is validated (label, size, LBA size, identity) against
 *     the snapshot at open, before the first read; a device that is missing,
 *     resized or relabelled (label overwritten, or another store's) is
 *     excluded: closed at once, never read, logged as a warning and
 *     reported by tv_model_device. Reads use the other replicas; only the
 *     tensors of a shard with no valid replica fail (TV_E_NO_REPLICA), and
 *     the open itself fails only when no shard has a valid replica;
 *   - every size from the options is bounded before anything is opened or
 *     allocated (limits below), and every size and offset from the snapshot
 *     is checked arithmetic.
 * Handles are opaque; destructors accept NULL. A tv_model may be used from
 * several threads only with external locking. */
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

enum tv_engine {
    TV_ENGINE_AUTO = 0,  /* io_uring, else the pread thread pool */
    TV_ENGINE_URING = 1, /* io_uring with registered buffers; TV_E_NOT_SUPPORTED if absent */
    TV_ENGINE_PREAD = 2, /* pread worker threads: identical results */
};

/* Limits of the read options (TV_E_INVALID_ARG beyond them, naming the
 * values). The staging memory of a handle is queue_depth x chunk_len
 * (chunk_len after rounding up to the devices' io alignment): at most
 * TV_READ_MAX_STAGING bytes, pinned (io_uring registered buffers, CUDA). */
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
 * Returns 0 and *out; TV_E_INVALID_ARG (NULL argument, bad spec, unknown
 * engine, queue_depth, chunk_len or staging over the limits above: the
 * message names the values); TV_E_NOT_FOUND (no such model, generation or
 * alias, or no active one); when no shard has a valid replica, the first excluded
 * device's reason (TV_E_DEVICE_MISMATCH, -ENOENT, -EIO, ...; the message
 * names every device and its reason); TV_E_NOT_SUPPORTED (engine asked for
 * is unavailable); the snapshot's validation errors (TV_E_SNAPSHOT);
 * -errno from open; -ENOMEM. */
int tv_model_open(const char *store_dir, const char *spec, const tv_open_opts *opts, tv_model **out,
                  tv_error *err);

/* Opens from a snapshot image held in memory (copied; the caller keeps buf).
 * Same returns as tv_model_open. */
int tv_model_open_snapshot(const void *buf, size_t len, const tv_open_opts *opts, tv_model **out,
                           tv_error *err);

void tv_model_close(tv_model *m);

/* The generation number and model name of the open handle. */
int64_t tv_model_generation(const tv_model *m);
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

/* Number of devices of the generation, and of those excluded (0 for NULL). */
size_t tv_model_n_devices(const tv_model *m);
size_t tv_model_n_excluded_devices(const tv_model *m);
/* i-th device. Returns 0 or TV_E_INVALID_ARG. */
int tv_model_device(const tv_model *m, size_t i, tv_device_status *out);

size_t tv_model_n_tensors(const tv_model *m);
/* i-th tensor in file order. Its snapshot record is decoded and validated
 * on first use (opening does no per-tensor work). Returns 0;
 * TV_E_INVALID_ARG (NULL, i out of range); TV_E_SNAPSHOT (an invalid record:
 * possible only for a snapshot whose checksum was forged) or -ENOMEM, then
 * *out is an empty tensor (name "", rank 0, 0 bytes). */
int tv_model_tensor(const tv_model *m, size_t i, tv_tensor_desc *out);
/* O(1), never allocates. Returns 0 or TV_E_NOT_FOUND. */
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
 * TV_E_NO_REPLICA (every device holding the shard is excluded: the message
 * names the shard and each replica's device and reason; nothing is read);
 * TV_E_SHORT_IO, -EIO, ... from the device (after retrying other replicas);
 * TV_E_SNAPSHOT (the shard's record is invalid: a forged checksum). */
int tv_read_shard_header(tv_model *m, size_t shard, void *dest, size_t dest_len, tv_error *err);

/* Reads tensor `name` into dest (dest_len >= its nbytes; only nbytes are
 * written). Returns 0; TV_E_NOT_FOUND; TV_E_INVALID_ARG (dest NULL, or
 * dest_len too small: nothing written); TV_E_ST_NOT_BYTE_ADDRESSABLE never
 * (whole tensors of any dtype are bytes); TV_E_NO_REPLICA (every device
 * holding the tensor's shard is excluded: the message names the shard and
 * each replica's device and reason; nothing is read); TV_E_SHORT_IO, -EIO,
 * ... from the device (after retrying other replicas). Every read function
 * below returns TV_E_NO_REPLICA the same way. */
int tv_read_into(tv_model *m, const char *name, void *dest, size_t dest_len, tv_error *err);

typedef struct tv_read_req {
    const char *name; /* or NULL to use index */
    size_t index;
    void *dest;
    size_t dest_len;
    int result; /* out: 0 or the error of this tensor */
} tv_read_req;

/* Reads many tensors at once: adjacent tensors are coalesced into large
 * sequential reads. Each request gets its own result. Returns 0 when all
 * succeeded, else the first failing request's error (err describes it). */
int tv_read_batch(tv_model *m, tv_read_req *reqs, size_t n, tv_error *err);

/* Bytes [off, off + len) of tensor `name`'s data into dest (dest_len >=
 * len; only len bytes are written): only the alignment envelope of those
 * bytes is read from the device, at any (unaligned) off. len 0 reads
 * nothing and succeeds (dest may be NULL). Every check comes before any
 * read. Returns 0; TV_E_NOT_FOUND; TV_E_INVALID_ARG (off + len past the
 * tensor's nbytes or overflowing, dest NULL or too small: nothing written);
 * device errors as tv_read_into. */
int tv_read_range(tv_model *m, const char *name, uint64_t off, uint64_t len, void *dest,
                  size_t dest_len, tv_error *err);

/* Rows [r0, r1) of dimension 0 of a tensor of rank >= 1: reads only those
 * rows' bytes (plus the alignment envelope) into dest. Every check comes
 * before any allocation or read.
 * Returns 0; TV_E_INVALID_ARG (rank 0, r0 > r1, r1 > shape[0], dest too
 * small); TV_E_OVERFLOW (the row range's byte length overflows);
 * TV_E_ST_NOT_BYTE_ADDRESSABLE (a row of a sub-byte dtype that is not a
 * whole number of bytes); device errors. */
int tv_read_rows(tv_model *m, const char *name, uint64_t r0, uint64_t r1, void *dest,
                 size_t dest_len, tv_error *err);

/* The byte length of rows [r0, r1) of tensor name, with exactly the checks
 * of tv_read_rows (so a caller can size its buffer before allocating it).
 * Returns 0 and *len; the argument errors of tv_read_rows; TV_E_NOT_FOUND. */
int tv_rows_len(const tv_model *m, const char *name, uint64_t r0, uint64_t r1, uint64_t *len,
                tv_error *err);

/* Reads a tensor converted to float32 (n_elements little-endian floats
 * into dest, which need not be 4-byte aligned).
 * Supported source dtypes: F32 (copy), BF16, F16, F8_E4M3, F8_E5M2, F8_E8M0.
 * Conversion is exact (every source value is representable in float32).
 * Returns 0; TV_E_NOT_SUPPORTED for other dtypes; as tv_read_into. */
int tv_read_f32(tv_model *m, const char *name, void *dest, size_t dest_len, tv_error *err);

/* A tensor in an aligned arena owned by the library (zero copy: the device
 * read lands in the arena and data points at the payload inside it). */
typedef struct tv_tensor {
    const void *data;
    uint64_t nbytes;
    tv_dtype dtype;
    uint32_t rank;
    const uint64_t *shape; /* valid until tv_tensor_free */
} tv_tensor;

/* Returns 0 and *out (free with tv_tensor_free); errors as tv_read_into. */
int tv_get_tensor(tv_model *m, const char *name, tv_tensor **out, tv_error *err);
void tv_tensor_free(tv_tensor *t);

/* Reads a tensor into CUDA device memory through a pinned staging ring with
 * cudaMemcpyAsync on stream (a cudaStream_t, NULL = the default stream);
 * device reads overlap the copies. Returns when the bytes are on the GPU.
 * Returns 0; TV_E_NOT_SUPPORTED when built without CUDA or no GPU is
 * present; TV_E_INVALID_ARG; device errors; -EIO for CUDA failures (the
 * message names the CUDA error). */
int tv_read_into_cuda(tv_model *m, const char *name, void *dev_ptr, size_t dev_len, void *stream,
                      tv_error *err);
/* Batch form for CUDA destinations (dest pointers are device pointers). */
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
