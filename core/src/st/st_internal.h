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
    bool has_meta;  /* __metadata__ is an object */
    bool meta_seen; /* __metadata__ present (an object or null) */
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

/* Walks the members of one JSON object text (buf[0] == '{', already
 * pre-scanned) without building a tree: each member is a key token and a
 * value text, for tv__json_load_part to decode. Syntax errors are
 * TV_E_ST_JSON with the byte offset in buf. */
typedef struct tv__json_walk {
    const char *buf;
    size_t len;
    size_t i; /* next byte to look at */
    bool first;
    bool done;
    const char *what; /* message prefix */
} tv__json_walk;

typedef struct tv__json_member {
    size_t key_begin, key_end;     /* the key's string token, quotes included */
    size_t value_begin, value_end; /* the value, whitespace excluded */
} tv__json_member;

void tv__json_walk_init(tv__json_walk *w, const char *buf, size_t len, const char *what);
/* Returns 1 and fills *m for the next member; 0 after the closing '}' when
 * only whitespace follows it; or TV_E_ST_JSON. */
int tv__json_walk_next(tv__json_walk *w, tv__json_member *m, tv_error *err);
/* Decodes buf[b, e) (one token or value) with jansson, duplicate keys
 * rejected, \u0000 kept (callers decide; strings have lengths); errors
 * (TV_E_ST_JSON, TV_E_ST_DUPLICATE_KEY, TV_E_ST_INT_RANGE for a number
 * jansson cannot hold) name the byte offset in buf. */
int tv__json_load_part(const char *buf, size_t b, size_t e, const char *what, json_t **out,
                       tv_error *err);

/* True, with *pos, if buf[b, e) holds a '-' outside strings. */
bool tv__json_find_minus(const char *buf, size_t b, size_t e, size_t *pos);

/* Builds the index over ck->tensors. Returns 0, -ENOMEM, or
 * TV_E_IDX_DUPLICATE_TENSOR (err names both shards). */
int tv__nameidx_build(tv_checkpoint *ck, tv_error *err);
void tv__nameidx_free(tv__nameidx *ix);

/* Parses and validates one shard header (hdr, hdr_len bytes, the N of the
 * prefix) for a file of file_len bytes, appending its tensors to ck as
 * shard ck->n_shards. */
int tv__st_parse_header(tv_checkpoint *ck, const char *hdr, uint64_t hdr_len, uint64_t file_len,
                        const char *name, const char *path, tv_error *err);

/* Reads exactly len bytes at off; a short file is -EIO here (callers check
 * sizes first so this only fires when the file shrinks underneath us). */
int tv__st_read_exact(int fd, void *buf, size_t len, uint64_t off);
/* Opens the shard file at path (a regular file) and parses its header as
 * shard name. */
int tv__st_parse_shard_file(tv_checkpoint *ck, const char *path, const char *name, tv_error *err);
/* All shards are parsed: builds the name index. */
int tv__st_finish(tv_checkpoint *ck, tv_error *err);
/* Opens a Hugging Face index and every shard it names (index.c): the index
 * is entry name of directory real_dir (a real path), read from file (where
 * that entry resolves); shards resolve with tv__st_resolve_in_dir. */
int tv__st_open_index(tv_checkpoint *ck, const char *real_dir, const char *name, const char *file,
                      tv_error *err);
/* Resolves entry name (may hold '/') of directory real_dir into real
 * (PATH_MAX bytes): it must stay inside real_dir, or be a Hugging Face hub
 * cache link into its repository's blobs/ (see index.c). what names the
 * entry in messages ("shard"). Returns 0, -errno, -ENAMETOOLONG or
 * TV_E_IDX_SHARD_ESCAPE. */
int tv__st_resolve_in_dir(const char *real_dir, const char *name, const char *what, char *real,
                          tv_error *err);

/* Appends len bytes plus a NUL to the arena; returns the offset in *off. */
int tv__strings_add(tv_checkpoint *ck, const char *s, size_t len, uint32_t *off);
tv_checkpoint *tv__checkpoint_new(const tv_st_limits *lim);

#endif
