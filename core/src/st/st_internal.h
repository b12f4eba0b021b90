/* Internals of the safetensors layer shared by its files: the checkpoint's
 * in-memory layout, the JSON pre-scan and the name hash index.
 *
 * Invariants: all strings live in one arena addressed by offsets (so growth
 * never invalidates a tensor record); tensors of a shard are contiguous and,
 * once a shard is validated, sorted by (begin, end); the name index is built
 * once, after every shard is parsed, and is read-only afterwards. */
#ifndef TV_ST_INTERNAL_H
#define TV_ST_INTERNAL_H

#include <jansson.h>

#include "tensorvault/checkpoint.h"
#include "util/internal.h"

typedef struct tv__tensor {
    uint32_t name_off; /* into strings */
    uint32_t name_len;
    uint32_t dims_off; /* into dims */
    uint16_t rank;
    uint8_t dtype;
    uint8_t pad_;
    uint32_t shard;
    uint32_t pad2_;
    uint64_t begin;
    uint64_t end;
    uint64_t n_elements;
} tv__tensor;

typedef struct tv__shard {
    uint32_t name_off; /* into strings */
    uint32_t path_off;
    uint64_t file_len;
    uint64_t header_len;
    size_t first_tensor;
    size_t n_tensors;
    size_t first_meta; /* into meta */
    size_t n_meta;
    bool has_meta;
    /* fstat of the file when its header was read (0 for in-memory shards) */
    uint64_t dev_id, inode;
    int64_t mtime_ns, ctime_ns;
} tv__shard;

/* Open-addressing hash table mapping a name to a tensor index. */
typedef struct tv__nameidx {
    uint64_t seed;
    uint32_t mask;    /* capacity - 1; capacity is a power of two */
    uint32_t *hashes; /* low 32 bits of the hash, for cheap rejects */
    uint32_t *slots;  /* tensor index + 1; 0 = empty */
} tv__nameidx;

struct tv_checkpoint {
    tv__shard *shards;
    size_t n_shards, cap_shards;
    tv__tensor *tensors;
    size_t n_tensors, cap_tensors;
    uint64_t *dims;
    size_t n_dims, cap_dims;
    uint32_t *meta; /* pairs of string offsets: key, value */
    size_t n_meta, cap_meta;
    char *strings;
    size_t n_strings, cap_strings;
    tv__nameidx idx;
    char *index_path;
    bool has_total_size;
    uint64_t total_size;
    uint64_t total_bytes;
    uint64_t max_header_len;
    uint32_t max_shards;
};

/* Byte-wise checks that jansson does not name precisely: the first byte,
 * UTF-8 validity and nesting depth (checked before parsing so a deeply
 * nested document never reaches a recursive parser). what = "header" or
 * "index" for messages; codes are TV_E_ST_HEADER_START (only when
 * require_brace), TV_E_ST_UTF8, TV_E_ST_TOO_DEEP. */
int tv__json_prescan(const char *buf, size_t len, bool require_brace, const char *what,
                     tv_error *err);
/* Parses with JSON_REJECT_DUPLICATES; maps jansson errors to json_code or
 * TV_E_ST_DUPLICATE_KEY. */
int tv__json_load(const char *buf, size_t len, size_t flags, int json_code, const char *what,
                  json_t **out, tv_error *err);

uint64_t tv__hash_bytes(const void *p, size_t n, uint64_t seed);

/* Builds the index over ck->tensors. Returns 0, -ENOMEM, or
 * TV_E_IDX_DUPLICATE_TENSOR (err names both shards). */
int tv__nameidx_build(tv_checkpoint *ck, tv_error *err);
void tv__nameidx_free(tv__nameidx *ix);

/* Parses and validates one shard header (hdr, hdr_len bytes, the N of the
 * prefix) for a file of file_len bytes, appending its tensors to ck as
 * shard ck->n_shards. */
int tv__st_parse_header(tv_checkpoint *ck, const char *hdr, uint64_t hdr_len, uint64_t file_len,
                        const char *name, const char *path, tv_error *err);

/* Appends len bytes plus a NUL to the arena; returns the offset in *off. */
int tv__strings_add(tv_checkpoint *ck, const char *s, size_t len, uint32_t *off);
tv_checkpoint *tv__checkpoint_new(const tv_st_limits *lim);

#endif
