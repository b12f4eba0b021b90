/* The manifest snapshot: a compact, versioned, little-endian binary image of
 * one generation (devices, shards with their replicas, tensors, a string
 * table and an open-addressing name index), built by the server from the
 * registry and read by every reader without SQLite. Format: docs/formats.md.
 *
 * Invariants:
 *   - opening validates the header (magic, version, lengths, checksum,
 *     section bounds, alignment, overlap and counts) in O(size of the header
 *     + one checksum pass); every record, string and index slot is validated
 *     again when followed, so a crafted snapshot with a valid checksum cannot
 *     make a reader read outside the image, loop forever or hand out a
 *     tensor outside its shard or a shard outside its replicas' extents;
 *   - lookups never allocate; tv__snap_find probes at most n_index slots;
 *   - a string ref (off, len) is valid only when off + len < strings_len and
 *     the byte at off + len is NUL;
 *   - the image is decoded field by field (never a cast of a host struct),
 *     so the buffer needs no particular alignment;
 *   - the builder emits tensors in file order (shard, begin, end, name),
 *     sizes the index at a power of two >= 2 x n_tensors (at least 16) and is
 *     deterministic for a given input and hash seed. */
#ifndef TV_SNAP_SNAPSHOT_H
#define TV_SNAP_SNAPSHOT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dev/dev.h"
#include "tensorvault/checkpoint.h"
#include "util/internal.h"

#define TV__SNAP_MAGIC   "TVSNAP01"
#define TV__SNAP_VERSION 2u /* 2: XXH3-128 checksum (1: SHA-256) */

/* Fixed sizes (unchanged since version 1; docs/formats.md); asserted in snapshot.c. */
#define TV__SNAP_HEADER_LEN   256u
#define TV__SNAP_DEVICE_LEN   168u
#define TV__SNAP_SHARD_LEN    64u
#define TV__SNAP_REPLICA_LEN  32u
#define TV__SNAP_TENSOR_LEN   40u
#define TV__SNAP_SLOT_LEN     8u
#define TV__SNAP_CHECKSUM_OFF 24u /* 32-byte checksum field inside the header */

/* ---- builder input (plain structs; the server fills them from SQL) ---- */

typedef struct tv__snap_device_in {
    uint8_t uuid[16];
    const char *path;
    uint32_t kind; /* tv__dev_kind */
    uint32_t lba_size;
    uint32_t io_align;
    uint64_t object_align;
    uint64_t size_bytes;
    uint64_t region_off;
    uint64_t region_len;
    uint64_t data_off;
    char serial[20]; /* NVMe identity, zero-padded; zero otherwise */
    char model[40];
    uint32_t nsid;
    uint8_t nguid[16];
    uint8_t eui64[8];
} tv__snap_device_in;

typedef struct tv__snap_replica_in {
    uint32_t device; /* index into devices */
    int64_t object_id;
    uint64_t base_off; /* object's first byte on the device */
    uint64_t alloc_len;
} tv__snap_replica_in;

typedef struct tv__snap_shard_in {
    const char *name;
    uint64_t file_len;
    uint64_t header_len; /* data section starts at 8 + header_len inside the object */
    uint8_t sha256[32];
    uint32_t n_replicas;
    const tv__snap_replica_in *replicas;
} tv__snap_shard_in;

typedef struct tv__snap_tensor_in {
    const char *name;
    size_t name_len;
    tv_dtype dtype;
    uint32_t rank;
    const uint64_t *shape;
    uint32_t shard;
    uint64_t begin_off; /* relative to the shard's data section */
    uint64_t end_off;
} tv__snap_tensor_in;

typedef struct tv__snap_in {
    const char *model;
    int64_t generation; /* > 0 */
    size_t n_devices;
    const tv__snap_device_in *devices;
    size_t n_shards;
    const tv__snap_shard_in *shards;
    size_t n_tensors;
    const tv__snap_tensor_in *tensors; /* any order; the builder sorts */
    uint64_t hash_seed;                /* 0 = draw a random one (getrandom) */
} tv__snap_in;

/* Builds the image (malloc'd; free with free()), checksum included.
 * Validates the input with the same rules the reader applies: device
 * geometry (lba size, alignments, region, data_off), every replica on an
 * existing device, object_align aligned, inside the device's data region
 * and at least file_len long; every shard with >= 1 replica and its data
 * section inside the file; every tensor with a known dtype, rank <=
 * TV_ST_MAX_RANK, begin <= end inside its shard's data section and
 * end - begin == elements x dtype bits / 8; unique tensor names.
 * Returns 0; TV_E_INVALID_ARG (the message names the record);
 * TV_E_OVERFLOW (counts or sizes beyond the format's 32-bit fields or
 * size_t); -ENOMEM. */
int tv__snap_build(const tv__snap_in *in, void **out, size_t *out_len, tv_error *err);

/* The checksum field's 32 bytes for an image of len >= TV__SNAP_HEADER_LEN
 * bytes: XXH3-128 of the image with the field read as zeros (canonical,
 * big-endian) followed by 16 zero bytes. Returns 0 or TV_E_INVALID_ARG
 * (NULL or too short). */
int tv__snap_checksum(const void *buf, size_t len, uint8_t out[32]);
/* Recomputes and stores the checksum field in place (tests, fuzz seeds).
 * Returns as tv__snap_checksum. */
int tv__snap_seal(void *buf, size_t len);

/* ---- reader: a validated view over an image (no copy, no allocation) ---- */

typedef struct tv__snap {
    const uint8_t *base;
    size_t len;
    /* decoded header fields (host order) */
    int64_t generation;
    uint32_t n_devices, n_shards, n_replicas, n_tensors, n_index;
    uint64_t devices_off, shards_off, replicas_off, tensors_off, dims_off, strings_off, index_off;
    uint64_t n_dims, strings_len;
    uint64_t hash_seed;
    uint32_t model_off, model_len;
} tv__snap;

/* Decoded, validated records. Strings point into the image; each is
 * followed by a NUL byte inside the string table (checked when decoded), so
 * it may be used as a C string, but names may hold embedded NULs: the _len
 * is authoritative. */
typedef struct tv__snap_device_info {
    uint8_t uuid[16];
    const char *path;
    size_t path_len;
    uint32_t kind, lba_size, io_align;
    uint64_t object_align, size_bytes, region_off, region_len, data_off;
    char serial[20];
    char model[40];
    uint32_t nsid;
    uint8_t nguid[16];
    uint8_t eui64[8];
} tv__snap_device_info;

typedef struct tv__snap_replica_info {
    uint32_t device;
    int64_t object_id;
    uint64_t base_off, alloc_len;
} tv__snap_replica_info;

typedef struct tv__snap_shard_info {
    const char *name;
    size_t name_len;
    uint64_t file_len, header_len, data_off; /* data_off = 8 + header_len */
    uint8_t sha256[32];
    uint32_t first_replica, n_replicas;
} tv__snap_shard_info;

typedef struct tv__snap_tensor_info {
    const char *name;
    size_t name_len;
    tv_dtype dtype;
    uint32_t rank;
    const uint8_t *shape_le; /* rank little-endian u64 values inside the image */
    uint32_t shard;
    uint64_t begin_off, end_off;
    uint64_t nbytes;     /* end_off - begin_off */
    uint64_t n_elements; /* product of the dims (1 for rank 0) */
} tv__snap_tensor_info;

#define TV__SNAP_VERIFY_CHECKSUM 0x1u

/* Validates the header and section table of an image: len >= header,
 * magic, version, header_len, total_len == len, reserved bytes zero,
 * generation > 0, (flags & TV__SNAP_VERIFY_CHECKSUM) the checksum, every
 * section 8-byte aligned, after the header, inside the image and not
 * overlapping another, counts x record sizes without overflow, the string
 * table <= 4 GiB, n_index a power of two > n_tensors, the model name inside
 * the string table. The view points into buf (no copy): keep buf alive.
 * Returns 0; TV_E_INVALID_ARG (NULL buf or out); TV_E_SNAPSHOT naming the
 * bad field. */
int tv__snap_open(const void *buf, size_t len, unsigned flags, tv__snap *out, tv_error *err);

/* Records by index; each validates what it decodes and what it points to:
 *   device:  path inside the string table; kind known; lba size a power of
 *            two in [512, 65536]; io_align a power of two, multiple of the
 *            lba size and 4096; object_align a multiple of io_align and
 *            64 KiB; 0 < region_off, io_align aligned, region inside the
 *            device; data_off object_align aligned inside the region;
 *   replica: device index in range (and that device valid); base_off and
 *            alloc_len object_align aligned, alloc_len > 0, the extent
 *            inside [data_off, region end) of its device;
 *   shard:   name inside the string table; 8 + header_len <= file_len;
 *            n_replicas >= 1 and [first, first + n) inside the replicas;
 *            every replica valid with file_len <= alloc_len;
 *   tensor:  name inside the string table; dtype known; rank <=
 *            TV_ST_MAX_RANK; [first_dim, first_dim + rank) inside the dims
 *            array; shard index in range (its own fields valid; its replicas
 *            are checked by tv__snap_shard); begin <= end <= file_len -
 *            data_off; end - begin == elements x dtype bits / 8 without
 *            overflow.
 * Return 0, TV_E_INVALID_ARG (NULL, or index out of range) or
 * TV_E_SNAPSHOT. */
int tv__snap_device(const tv__snap *s, uint32_t i, tv__snap_device_info *out, tv_error *err);
int tv__snap_shard(const tv__snap *s, uint32_t i, tv__snap_shard_info *out, tv_error *err);
int tv__snap_replica(const tv__snap *s, uint32_t i, tv__snap_replica_info *out, tv_error *err);
int tv__snap_tensor(const tv__snap *s, uint32_t i, tv__snap_tensor_info *out, tv_error *err);
/* Decodes dimension d of a tensor (0 when d >= rank). */
uint64_t tv__snap_dim(const tv__snap_tensor_info *t, uint32_t d);
/* The model name. Returns 0, TV_E_INVALID_ARG or TV_E_SNAPSHOT. */
int tv__snap_model(const tv__snap *s, const char **name, size_t *len, tv_error *err);

/* The label-relevant fields of a device record (builder input or decoded
 * record) as the shared device record that tv__label_expected maps to the
 * label the device must carry. */
void tv__snap_device_record(const tv__snap_device_info *d, tv__dev_record *out);
void tv__snap_device_in_record(const tv__snap_device_in *d, tv__dev_record *out);

/* Name lookup through the index (seeded tv__hash_bytes; the full name is
 * compared). Never allocates; probes at most n_index slots. Returns 0 and
 * *index (may be NULL), TV_E_NOT_FOUND, TV_E_INVALID_ARG (NULL s, or NULL
 * name with len > 0), or TV_E_SNAPSHOT when the index is malformed (a slot
 * naming a tensor out of range, a tensor whose name ref is bad, or a probe
 * that meets no empty slot). */
int tv__snap_find(const tv__snap *s, const char *name, size_t len, uint32_t *index, tv_error *err);

#endif
