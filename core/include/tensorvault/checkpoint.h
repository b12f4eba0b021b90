/* Safetensors checkpoints on a filesystem: parse and validate one shard or a
 * Hugging Face sharded index, and look tensors up by name (the primary
 * mapping: tensor name -> shard + [file_begin, file_end) + dtype + shape).
 *
 * Invariants kept by a successfully opened tv_checkpoint:
 *   - every shard's header is valid JSON (UTF-8, no duplicate keys, nesting
 *     within TV_ST_MAX_DEPTH), every tensor entry has exactly dtype, shape
 *     and data_offsets, and its byte length equals elements x bits / 8;
 *   - per shard, the tensors' [BEGIN, END) ranges tile the data section
 *     exactly (no overlap, no hole, no trailing bytes, nothing past EOF);
 *   - for an index, every tensor is in exactly one shard and listed under it;
 *   - tensors are iterated in file order (shard index, then offset) and
 *     names are unique across the checkpoint, non-empty and free of NUL
 *     (as are __metadata__ keys and values); every dimension is at most
 *     INT64_MAX;
 *   - file_off + nbytes never overflows and lies inside the shard file. */
#ifndef TENSORVAULT_CHECKPOINT_H
#define TENSORVAULT_CHECKPOINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tensorvault/errors.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Every dtype the safetensors format defines. Values are stored in the
 * registry and the snapshot: append-only, never renumbered. */
typedef enum tv_dtype {
    TV_DTYPE_BOOL = 0,
    TV_DTYPE_U8 = 1,
    TV_DTYPE_I8 = 2,
    TV_DTYPE_F8_E5M2 = 3,
    TV_DTYPE_F8_E4M3 = 4,
    TV_DTYPE_F8_E8M0 = 5,
    TV_DTYPE_F8_E4M3FNUZ = 6,
    TV_DTYPE_F8_E5M2FNUZ = 7,
    TV_DTYPE_I16 = 8,
    TV_DTYPE_U16 = 9,
    TV_DTYPE_F16 = 10,
    TV_DTYPE_BF16 = 11,
    TV_DTYPE_I32 = 12,
    TV_DTYPE_U32 = 13,
    TV_DTYPE_F32 = 14,
    TV_DTYPE_C64 = 15,
    TV_DTYPE_F64 = 16,
    TV_DTYPE_I64 = 17,
    TV_DTYPE_U64 = 18,
    TV_DTYPE_F4 = 19,
    TV_DTYPE_F6_E2M3 = 20,
    TV_DTYPE_F6_E3M2 = 21,
    TV_DTYPE_COUNT = 22
} tv_dtype;

/* Name as written in safetensors headers ("BF16"), or NULL if out of range. */
const char *tv_dtype_name(tv_dtype dt);
/* Parses a dtype name of len bytes. Returns 0, or TV_E_ST_DTYPE. */
int tv_dtype_from_name(const char *s, size_t len, tv_dtype *out);
/* Bits per element (1 byte = 8; F4 = 4; F6_* = 6); 0 if out of range. */
unsigned tv_dtype_bits(tv_dtype dt);
/* False for the sub-byte dtypes (F4, F6_*), which cannot be read per element. */
bool tv_dtype_byte_addressable(tv_dtype dt);

/* Documented limits. */
#define TV_ST_DEFAULT_MAX_HEADER_LEN 100000000ull /* the official loader's limit */
#define TV_ST_MAX_DEPTH              8            /* JSON nesting; valid headers need 3 */
#define TV_ST_MAX_RANK               16           /* dimensions per tensor */
#define TV_ST_DEFAULT_MAX_SHARDS     4096         /* shards per index */

typedef struct tv_st_limits {
    uint64_t max_header_len; /* 0 = TV_ST_DEFAULT_MAX_HEADER_LEN */
    uint32_t max_shards;     /* 0 = TV_ST_DEFAULT_MAX_SHARDS */
} tv_st_limits;

typedef struct tv_checkpoint tv_checkpoint;

typedef struct tv_tensor_info {
    const char *name; /* NUL-terminated, valid while the checkpoint is open */
    size_t name_len;
    tv_dtype dtype;
    uint32_t rank;
    const uint64_t *shape; /* rank entries */
    uint32_t shard;        /* index into the checkpoint's shards */
    uint64_t begin_off;    /* BEGIN, relative to the shard's data section */
    uint64_t end_off;      /* END */
    uint64_t file_off;     /* absolute offset in the shard file: data_off + BEGIN */
    uint64_t nbytes;       /* END - BEGIN */
    uint64_t n_elements;
} tv_tensor_info;

typedef struct tv_shard_info {
    const char *name; /* file name as listed in the index (or the base name of
                         the path it was named by: a link keeps its own name) */
    const char *path; /* resolved absolute path (for a hub cache link: the blob) */
    uint64_t file_len;
    uint64_t header_len; /* N of the 8-byte prefix */
    uint64_t data_off;   /* 8 + N */
    uint64_t data_len;   /* file_len - data_off */
    size_t n_tensors;
    size_t n_metadata; /* __metadata__ entries (0 when absent) */
    bool has_metadata;
    /* Identity and change stamps from the fstat taken when the header was
     * validated (all 0 for a shard parsed from memory): the importer refuses
     * a file that is no longer this one. */
    uint64_t dev_id, inode;
    int64_t mtime_ns, ctime_ns;
} tv_shard_info;

/* Opens path: a .safetensors file, a model.safetensors.index.json (or any
 * *.index.json), or a directory holding one (the index wins over a lone
 * model.safetensors). Reads only headers, never tensor data. Files named by
 * an index, or picked in a named directory, must resolve inside that
 * directory, or be a Hugging Face hub cache snapshot's links
 * (models--ORG--NAME/snapshots/REV/NAME -> ../../blobs/HASH): else
 * TV_E_IDX_SHARD_ESCAPE.
 * lim may be NULL (defaults). On failure *out is NULL and err names the
 * problem (tensor, offset or path).
 * Returns 0; a negative errno (open/read failure); or TV_E_FILE_SHORT,
 * TV_E_ST_* (any shard), TV_E_IDX_*, TV_E_CKPT_NOT_FOUND, TV_E_OVERFLOW. */
int tv_checkpoint_open(const char *path, const tv_st_limits *lim, tv_checkpoint **out,
                       tv_error *err);

/* Parses one shard held in memory (the whole file image: prefix, header and
 * data, or at least the prefix and header when file_len says how long the
 * file is). Used by fuzzers and by callers that already read the header.
 * buf_len must cover 8 + N; file_len is the shard's full length.
 * Returns as tv_checkpoint_open. */
int tv_checkpoint_parse_shard(const void *buf, size_t buf_len, uint64_t file_len, const char *name,
                              const tv_st_limits *lim, tv_checkpoint **out, tv_error *err);

/* Validates an index JSON document held in memory without touching the
 * filesystem: weight_map shape and shard-name rules, shard count limit.
 * On success *n_shards and *n_tensors (either may be NULL) are set.
 * Returns 0, TV_E_IDX_JSON, TV_E_ST_DUPLICATE_KEY, TV_E_ST_TOO_DEEP,
 * TV_E_IDX_WEIGHT_MAP, TV_E_IDX_SHARD_NAME, TV_E_IDX_TOO_MANY_SHARDS,
 * TV_E_ST_NAME_EMPTY or TV_E_ST_NUL (a tensor name no shard may hold). */
int tv_index_validate_buffer(const void *buf, size_t len, const tv_st_limits *lim, size_t *n_shards,
                             size_t *n_tensors, tv_error *err);

/* Where tv_checkpoint_open_io reads files: a checkpoint that is not on a
 * local filesystem (an HTTP origin). Names are as the checkpoint names them
 * (the index's own name, the shard names it lists). stat sets *len to the
 * file's length and writes what tv_shard_info.path (and the index path)
 * should say into path (path_len bytes, e.g. a URL); read fills buf with
 * exactly len bytes at off. Both return 0 or a negative code with err set. */
typedef struct tv_checkpoint_io {
    void *ctx;
    int (*stat)(void *ctx, const char *name, uint64_t *len, char *path, size_t path_len,
                tv_error *err);
    int (*read)(void *ctx, const char *name, void *buf, size_t len, uint64_t off, tv_error *err);
} tv_checkpoint_io;

/* Opens the checkpoint named name through io: an index (is_index; its
 * shards are read by the names it lists, which follow the index's
 * shard-name rules) or one .safetensors shard. Reads only headers, with
 * the validation of tv_checkpoint_open; shard stamps (dev_id ... ctime_ns)
 * are 0. The index is at most lim->max_header_len bytes.
 * Returns as tv_checkpoint_open, plus the io callbacks' codes. */
int tv_checkpoint_open_io(const tv_checkpoint_io *io, const char *name, bool is_index,
                          const tv_st_limits *lim, tv_checkpoint **out, tv_error *err);

/* Safe on NULL and idempotent when the caller NULLs its pointer. */
void tv_checkpoint_close(tv_checkpoint *ck);

size_t tv_checkpoint_n_tensors(const tv_checkpoint *ck);
size_t tv_checkpoint_n_shards(const tv_checkpoint *ck);
/* Sum of nbytes over all tensors. */
uint64_t tv_checkpoint_total_bytes(const tv_checkpoint *ck);
/* The index's metadata.total_size if present (it differs between producers:
 * reported, never validated). Returns true and sets *out when it is a number
 * in [0, INT64_MAX]; any other value is accepted and not reported. */
bool tv_checkpoint_index_total_size(const tv_checkpoint *ck, uint64_t *out);
/* Path of the index file, or NULL for a single shard. */
const char *tv_checkpoint_index_path(const tv_checkpoint *ck);

/* i-th tensor in file order (shard, then offset). Returns 0 or TV_E_INVALID_ARG. */
int tv_checkpoint_tensor(const tv_checkpoint *ck, size_t i, tv_tensor_info *out);
/* O(1) lookup by name (name_len bytes, need not be NUL-terminated); sets
 * *index to the tensor's position in file order. Never allocates.
 * Returns 0 or TV_E_NOT_FOUND. */
int tv_checkpoint_find(const tv_checkpoint *ck, const char *name, size_t name_len, size_t *index);

/* Returns 0 or TV_E_INVALID_ARG. */
int tv_checkpoint_shard(const tv_checkpoint *ck, size_t i, tv_shard_info *out);
/* j-th __metadata__ pair of shard i (in header order). Returns 0 or TV_E_INVALID_ARG. */
int tv_checkpoint_shard_metadata(const tv_checkpoint *ck, size_t i, size_t j, const char **key,
                                 const char **value);

#ifdef __cplusplus
}
#endif
#endif
