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
 *     the snapshot before the first read; a mismatch refuses the open.
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

typedef struct tv_open_opts {
    int engine;           /* enum tv_engine */
    uint32_t queue_depth; /* in-flight reads; 0 = 32 */
    size_t chunk_len;     /* bytes per device read; 0 = 1 MiB (rounded to io_align) */
    uint32_t n_threads;   /* pread engine workers; 0 = queue_depth capped at 16 */
    bool no_direct;       /* buffered reads (tests on tmpfs); default O_DIRECT */
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

/* Opens model spec ("NAME" = the active generation, or "NAME@GEN") of the
 * store in store_dir, read-only. opts may be NULL.
 * Returns 0 and *out; TV_E_NOT_FOUND (no such model or generation, or no
 * active one); TV_E_DEVICE_MISMATCH; TV_E_NOT_SUPPORTED (engine asked for
 * is unavailable); the snapshot's validation errors (TV_E_SNAPSHOT);
 * -errno from open. */
int tv_model_open(const char *store_dir, const char *spec, const tv_open_opts *opts,
                  tv_model **out, tv_error *err);

/* Opens from a snapshot image held in memory (copied; the caller keeps buf).
 * Same returns as tv_model_open. */
int tv_model_open_snapshot(const void *buf, size_t len, const tv_open_opts *opts, tv_model **out,
                           tv_error *err);

void tv_model_close(tv_model *m);

/* The generation number and model name of the open handle. */
int64_t tv_model_generation(const tv_model *m);
const char *tv_model_name(const tv_model *m);

size_t tv_model_n_tensors(const tv_model *m);
/* i-th tensor in file order. Returns 0 or TV_E_INVALID_ARG. */
int tv_model_tensor(const tv_model *m, size_t i, tv_tensor_desc *out);
/* O(1), never allocates. Returns 0 or TV_E_NOT_FOUND. */
int tv_model_find(const tv_model *m, const char *name, size_t name_len, size_t *index);

/* Reads tensor `name` into dest (dest_len >= its nbytes; only nbytes are
 * written). Returns 0; TV_E_NOT_FOUND; TV_E_INVALID_ARG (dest NULL, or
 * dest_len too small: nothing written); TV_E_ST_NOT_BYTE_ADDRESSABLE never
 * (whole tensors of any dtype are bytes); TV_E_SHORT_IO, -EIO, ... from the
 * device (after retrying other replicas). */
int tv_read_into(tv_model *m, const char *name, void *dest, size_t dest_len, tv_error *err);

typedef struct tv_read_req {
    const char *name;   /* or NULL to use index */
    size_t index;
    void *dest;
    size_t dest_len;
    int result;         /* out: 0 or the error of this tensor */
} tv_read_req;

/* Reads many tensors at once: adjacent tensors are coalesced into large
 * sequential reads. Each request gets its own result. Returns 0 when all
 * succeeded, else the first failing request's error (err describes it). */
int tv_read_batch(tv_model *m, tv_read_req *reqs, size_t n, tv_error *err);

/* Rows [r0, r1) of dimension 0 of a tensor of rank >= 1: reads only those
 * rows' bytes (plus the alignment envelope) into dest.
 * Returns 0; TV_E_INVALID_ARG (rank 0, r0 > r1, r1 > shape[0], dest too
 * small); TV_E_ST_NOT_BYTE_ADDRESSABLE (a row of a sub-byte dtype that is
 * not a whole number of bytes); device errors. */
int tv_read_rows(tv_model *m, const char *name, uint64_t r0, uint64_t r1, void *dest,
                 size_t dest_len, tv_error *err);

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
int tv_read_into_cuda(tv_model *m, const char *name, void *dev_ptr, size_t dev_len,
                      void *stream, tv_error *err);
/* Batch form for CUDA destinations (dest pointers are device pointers). */
int tv_read_batch_cuda(tv_model *m, tv_read_req *reqs, size_t n, void *stream, tv_error *err);
/* True when this build has CUDA and a GPU is usable. */
bool tv_cuda_available(void);

/* Float32 conversion of raw elements (exposed for tests and the Python
 * package). Returns 0 or TV_E_NOT_SUPPORTED. */
int tv_convert_f32(tv_dtype src_dtype, const void *src, size_t n_elements, void *dst);

#ifdef __cplusplus
}
#endif
#endif
