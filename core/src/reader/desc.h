/* Tensor metadata from a snapshot record, the argument checks of the read
 * API and the tv_tensor allocation, used by the common layer of tv_model
 * (reader/model.c) for a model of either backend, so that every read
 * decodes, checks and words its errors the same way.
 *
 * Invariants: a decoded tv__tdesc holds only what tv__snap_tensor validated
 * (dtype known, rank <= TV_ST_MAX_RANK, nbytes == n_elements x dtype bits /
 * 8, no overflow); name and shape point into the snapshot image (shape: a
 * little-endian host and 8-byte aligned dims) or shape to owned_shape (freed
 * by tv__tdesc_free); every check fails without writing to a destination;
 * a tv_tensor comes only from tv__tensor_new and is freed by tv_tensor_free. */
#ifndef TV_READER_DESC_H
#define TV_READER_DESC_H

#include <stddef.h>
#include <stdint.h>

#include "snap/snapshot.h"
#include "tensorvault/tensorvault.h"

/* printf precision for a name of len bytes: at most 256 (a length over
 * INT_MAX would turn negative and print the whole string table). */
#define TV__NAME_PREC(len) ((int)((len) > 256 ? 256 : (len)))

/* One tensor record, decoded and validated. begin: the payload's offset in
 * its shard's data section. */
typedef struct tv__tdesc {
    const char *name;
    size_t name_len;
    tv_dtype dtype;
    uint32_t rank;
    uint32_t shard;
    uint64_t begin, nbytes, n_elements;
    const uint64_t *shape; /* into the snapshot image, or owned_shape */
    uint64_t *owned_shape;
} tv__tdesc;

/* Decodes tensor i of s into *d. Returns 0; the record's TV_E_SNAPSHOT or
 * TV_E_INVALID_ARG (i out of range) from tv__snap_tensor; -ENOMEM. */
int tv__tdesc_decode(const tv__snap *s, uint32_t i, tv__tdesc *d, tv_error *err);
/* Frees an owned shape (d may be NULL). */
void tv__tdesc_free(tv__tdesc *d);
/* The public view of d; d NULL (a record that failed to decode): an empty
 * tensor (name "", rank 0, 0 bytes), so a caller ignoring the code sees one. */
void tv__tdesc_public(const tv__tdesc *d, tv_tensor_desc *out);

/* Index of tensor `name` of model MODEL@gen (name NUL-terminated). Returns
 * 0; TV_E_NOT_FOUND "no tensor 'x' in MODEL@GEN"; TV_E_SNAPSHOT. */
int tv__tdesc_lookup(const tv__snap *s, const char *model, int64_t gen, const char *name,
                     uint32_t *idx, tv_error *err);
/* The tensor request j of a batch names: rq->name (as tv__tdesc_lookup),
 * else rq->index. Returns 0; TV_E_INVALID_ARG (index out of range);
 * TV_E_NOT_FOUND; TV_E_SNAPSHOT. */
int tv__tdesc_batch_index(const tv__snap *s, const char *model, int64_t gen, const tv_read_req *rq,
                          size_t j, size_t *idx, tv_error *err);
/* The answer of a batch (tv_read_batch, and a backend's own run of
 * requests): its first failure, code and message (code 0: none yet). */
typedef struct tv__batch_err {
    int code;
    tv_error err;
} tv__batch_err;

/* Keeps rc (its message e) as the batch's answer when it is the first
 * failure. Returns rc. */
static inline int tv__batch_note(tv__batch_err *b, int rc, const tv_error *e)
{
    if (rc && !b->code) {
        b->code = rc;
        b->err = *e;
    }
    return rc;
}

/* The batch's answer (0 or its first failure, whose message goes to err). */
static inline int tv__batch_answer(const tv__batch_err *b, tv_error *err)
{
    if (b->code && err)
        *err = b->err;
    return b->code;
}

/* tv_model_find: 0 or TV_E_NOT_FOUND, never a message. */
int tv__tdesc_find(const tv__snap *s, const char *name, size_t name_len, size_t *index);

/* The checks of a whole-tensor read into dest (tv_read_into): dest holds
 * nbytes. Returns 0 or TV_E_INVALID_ARG. */
int tv__tdesc_check_into(const tv__tdesc *d, const char *name, const void *dest, size_t dest_len,
                         tv_error *err);
/* The same for request j of a batch (its message names the request). */
int tv__tdesc_check_batch(const tv__tdesc *d, size_t j, const void *dest, size_t dest_len,
                          tv_error *err);
/* The checks of tv_read_range: [off, off + len) inside the tensor, and
 * (len > 0) dest holds len bytes. Returns 0 or TV_E_INVALID_ARG. */
int tv__tdesc_check_range(const tv__tdesc *d, const char *name, uint64_t off, uint64_t len,
                          const void *dest, size_t dest_len, tv_error *err);
/* The rules of tv_rows_len: *off and *len are the byte range of rows
 * [r0, r1) inside the tensor. Returns 0; TV_E_INVALID_ARG (a scalar, rows
 * outside [0, shape[0])); TV_E_ST_NOT_BYTE_ADDRESSABLE (a row is not whole
 * bytes); TV_E_OVERFLOW; TV_E_SNAPSHOT (rows end past nbytes). */
int tv__tdesc_rows(const tv__tdesc *d, const char *name, uint64_t r0, uint64_t r1, uint64_t *off,
                   uint64_t *len, tv_error *err);
/* The destination check of tv_read_rows (rows [r0, r1) of len bytes). */
int tv__tdesc_check_rows_dest(const char *name, uint64_t r0, uint64_t r1, uint64_t len,
                              const void *dest, size_t dest_len, tv_error *err);
/* The checks of tv_read_f32: a float32 conversion exists from the dtype and
 * dest holds n_elements x 4 bytes. Returns 0; TV_E_NOT_SUPPORTED;
 * TV_E_OVERFLOW; TV_E_INVALID_ARG. */
int tv__tdesc_check_f32(const tv__tdesc *d, const char *name, const void *dest, size_t dest_len,
                        tv_error *err);

/* Shard i of s as tv_model_shard returns it. Returns 0 or
 * TV_E_INVALID_ARG (i out of range, or an invalid record: then *out is an
 * empty shard). */
int tv__shard_public(const tv__snap *s, size_t i, tv_shard_desc *out);
/* The checks of a shard header read of model MODEL@gen
 * (tv_read_shard_header): shard < n_shards, its record valid, dest
 * holds 8 + header_len bytes; *len gets 8 + header_len. Returns 0;
 * TV_E_INVALID_ARG; TV_E_SNAPSHOT (the record). Nothing is written to dest. */
int tv__shard_check_header(const tv__snap *s, const char *model, int64_t gen, size_t shard,
                           const void *dest, size_t dest_len, uint64_t *len, tv_error *err);

/* A tensor (tv_get_tensor) whose bytes are an arena of arena_len bytes
 * aligned to align (a power of two, >= sizeof(void *)): *arena to fill,
 * then tv__tensor_set; freed by tv_tensor_free. Returns 0 or -ENOMEM
 * (*out NULL). */
int tv__tensor_new(uint64_t arena_len, size_t align, tv_tensor **out, void **arena, tv_error *err);
/* Sets t's view: data at arena + skip, d's nbytes, dtype and shape (copied). */
void tv__tensor_set(tv_tensor *t, uint64_t skip, const tv__tdesc *d);

#endif
