/* The manifest snapshot: the builder (registry rows -> one immutable image)
 * and the validating, allocation-free reader. Layout: docs/formats.md.
 *
 * Invariants: the structs below are field maps only (offsets asserted); the
 * image is encoded and decoded field by field in little-endian order, so
 * neither host byte order nor buffer alignment matters; the builder and the
 * reader share one set of rules for devices, replicas, shards and tensors
 * (the *_problem functions), so anything the builder emits the reader
 * accepts and anything the reader accepts is safe to follow; every size and
 * offset computation is checked for overflow. */
#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "dev/dev.h" /* device kinds and alignments */
#include "snap/snapshot.h"
#include "util/endian.h"
#include "util/hash.h" /* the index hash is part of the format */

#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack: no allocation */
#include <xxhash.h>

/* ---- field maps ----------------------------------------------------------- */

typedef struct snap_header {
    char magic[8];
    uint32_t version;
    uint32_t header_len;
    uint64_t total_len;
    uint8_t checksum[32];
    int64_t generation;
    uint32_t n_devices;
    uint32_t n_shards;
    uint32_t n_replicas;
    uint32_t n_tensors;
    uint32_t n_index;
    uint32_t flags;
    uint64_t n_dims;
    uint64_t strings_len;
    uint64_t devices_off;
    uint64_t shards_off;
    uint64_t replicas_off;
    uint64_t tensors_off;
    uint64_t dims_off;
    uint64_t strings_off;
    uint64_t index_off;
    uint64_t hash_seed;
    uint32_t model_off;
    uint32_t model_len;
    uint8_t reserved[80];
} snap_header;

_Static_assert(sizeof(snap_header) == TV__SNAP_HEADER_LEN, "snapshot header size");
_Static_assert(offsetof(snap_header, version) == 8, "header version");
_Static_assert(offsetof(snap_header, header_len) == 12, "header header_len");
_Static_assert(offsetof(snap_header, total_len) == 16, "header total_len");
_Static_assert(offsetof(snap_header, checksum) == TV__SNAP_CHECKSUM_OFF, "header checksum");
_Static_assert(offsetof(snap_header, generation) == 56, "header generation");
_Static_assert(offsetof(snap_header, n_devices) == 64, "header n_devices");
_Static_assert(offsetof(snap_header, n_shards) == 68, "header n_shards");
_Static_assert(offsetof(snap_header, n_replicas) == 72, "header n_replicas");
_Static_assert(offsetof(snap_header, n_tensors) == 76, "header n_tensors");
_Static_assert(offsetof(snap_header, n_index) == 80, "header n_index");
_Static_assert(offsetof(snap_header, flags) == 84, "header flags");
_Static_assert(offsetof(snap_header, n_dims) == 88, "header n_dims");
_Static_assert(offsetof(snap_header, strings_len) == 96, "header strings_len");
_Static_assert(offsetof(snap_header, devices_off) == 104, "header devices_off");
_Static_assert(offsetof(snap_header, shards_off) == 112, "header shards_off");
_Static_assert(offsetof(snap_header, replicas_off) == 120, "header replicas_off");
_Static_assert(offsetof(snap_header, tensors_off) == 128, "header tensors_off");
_Static_assert(offsetof(snap_header, dims_off) == 136, "header dims_off");
_Static_assert(offsetof(snap_header, strings_off) == 144, "header strings_off");
_Static_assert(offsetof(snap_header, index_off) == 152, "header index_off");
_Static_assert(offsetof(snap_header, hash_seed) == 160, "header hash_seed");
_Static_assert(offsetof(snap_header, model_off) == 168, "header model_off");
_Static_assert(offsetof(snap_header, model_len) == 172, "header model_len");
_Static_assert(offsetof(snap_header, reserved) == 176, "header reserved");

typedef struct snap_device_rec {
    uint8_t uuid[16];
    uint32_t path_off;
    uint32_t path_len;
    uint32_t kind;
    uint32_t lba_size;
    uint32_t io_align;
    uint32_t nsid;
    uint64_t object_align;
    uint64_t size_bytes;
    uint64_t region_off;
    uint64_t region_len;
    uint64_t data_off;
    char serial[20];
    char model[40];
    uint8_t nguid[16];
    uint8_t eui64[8];
    uint32_t reserved;
} snap_device_rec;

_Static_assert(sizeof(snap_device_rec) == TV__SNAP_DEVICE_LEN, "device record size");
_Static_assert(offsetof(snap_device_rec, path_off) == 16, "device path_off");
_Static_assert(offsetof(snap_device_rec, path_len) == 20, "device path_len");
_Static_assert(offsetof(snap_device_rec, kind) == 24, "device kind");
_Static_assert(offsetof(snap_device_rec, lba_size) == 28, "device lba_size");
_Static_assert(offsetof(snap_device_rec, io_align) == 32, "device io_align");
_Static_assert(offsetof(snap_device_rec, nsid) == 36, "device nsid");
_Static_assert(offsetof(snap_device_rec, object_align) == 40, "device object_align");
_Static_assert(offsetof(snap_device_rec, size_bytes) == 48, "device size_bytes");
_Static_assert(offsetof(snap_device_rec, region_off) == 56, "device region_off");
_Static_assert(offsetof(snap_device_rec, region_len) == 64, "device region_len");
_Static_assert(offsetof(snap_device_rec, data_off) == 72, "device data_off");
_Static_assert(offsetof(snap_device_rec, serial) == 80, "device serial");
_Static_assert(offsetof(snap_device_rec, model) == 100, "device model");
_Static_assert(offsetof(snap_device_rec, nguid) == 140, "device nguid");
_Static_assert(offsetof(snap_device_rec, eui64) == 156, "device eui64");
_Static_assert(offsetof(snap_device_rec, reserved) == 164, "device reserved");

typedef struct snap_shard_rec {
    uint32_t name_off;
    uint32_t name_len;
    uint64_t file_len;
    uint64_t header_len;
    uint8_t sha256[32];
    uint32_t first_replica;
    uint32_t n_replicas;
} snap_shard_rec;

_Static_assert(sizeof(snap_shard_rec) == TV__SNAP_SHARD_LEN, "shard record size");
_Static_assert(offsetof(snap_shard_rec, file_len) == 8, "shard file_len");
_Static_assert(offsetof(snap_shard_rec, header_len) == 16, "shard header_len");
_Static_assert(offsetof(snap_shard_rec, sha256) == 24, "shard sha256");
_Static_assert(offsetof(snap_shard_rec, first_replica) == 56, "shard first_replica");
_Static_assert(offsetof(snap_shard_rec, n_replicas) == 60, "shard n_replicas");

typedef struct snap_replica_rec {
    uint32_t device;
    uint32_t reserved;
    int64_t object_id;
    uint64_t base_off;
    uint64_t alloc_len;
} snap_replica_rec;

_Static_assert(sizeof(snap_replica_rec) == TV__SNAP_REPLICA_LEN, "replica record size");
_Static_assert(offsetof(snap_replica_rec, reserved) == 4, "replica reserved");
_Static_assert(offsetof(snap_replica_rec, object_id) == 8, "replica object_id");
_Static_assert(offsetof(snap_replica_rec, base_off) == 16, "replica base_off");
_Static_assert(offsetof(snap_replica_rec, alloc_len) == 24, "replica alloc_len");

typedef struct snap_tensor_rec {
    uint32_t name_off;
    uint32_t name_len;
    uint32_t dtype;
    uint32_t rank;
    uint32_t first_dim;
    uint32_t shard;
    uint64_t begin_off;
    uint64_t end_off;
} snap_tensor_rec;

_Static_assert(sizeof(snap_tensor_rec) == TV__SNAP_TENSOR_LEN, "tensor record size");
_Static_assert(offsetof(snap_tensor_rec, dtype) == 8, "tensor dtype");
_Static_assert(offsetof(snap_tensor_rec, rank) == 12, "tensor rank");
_Static_assert(offsetof(snap_tensor_rec, first_dim) == 16, "tensor first_dim");
_Static_assert(offsetof(snap_tensor_rec, shard) == 20, "tensor shard");
_Static_assert(offsetof(snap_tensor_rec, begin_off) == 24, "tensor begin_off");
_Static_assert(offsetof(snap_tensor_rec, end_off) == 32, "tensor end_off");

typedef struct snap_slot {
    uint32_t hash_hi; /* bits 32..63 of the name's hash */
    uint32_t tensor;  /* tensor index + 1; 0 = empty */
} snap_slot;

_Static_assert(sizeof(snap_slot) == TV__SNAP_SLOT_LEN, "index slot size");
_Static_assert(offsetof(snap_slot, tensor) == 4, "slot tensor");

#define GET32(p, T, f)     tv__le32_get((p) + offsetof(T, f))
#define GET64(p, T, f)     tv__le64_get((p) + offsetof(T, f))
#define PUT32(p, T, f, v)  tv__le32_put((p) + offsetof(T, f), (uint32_t)(v))
#define PUT64(p, T, f, v)  tv__le64_put((p) + offsetof(T, f), (uint64_t)(v))
#define GETB(p, T, f, dst) memcpy((dst), (p) + offsetof(T, f), sizeof(((T *)0)->f))
#define PUTB(p, T, f, src) memcpy((p) + offsetof(T, f), (src), sizeof(((T *)0)->f))

#define MIN_INDEX  16u
#define NAME_SHOWN 200 /* bytes of a name quoted in a message */

/* ---- shared rules ------------------------------------------------------- */

static bool is_pow2_u64(uint64_t v)
{
    return v && !(v & (v - 1));
}

/* NULL when the device's geometry is consistent, else what is wrong. The
 * reader relies on these to plan aligned reads inside the data region. */
static const char *device_problem(const tv__snap_device_info *d)
{
    uint64_t region_end;
    if (d->kind != TV__DEV_FILE && d->kind != TV__DEV_BLOCK && d->kind != TV__DEV_NVME)
        return "unknown device kind";
    if (!is_pow2_u64(d->lba_size) || d->lba_size < TV__DEV_MIN_LBA || d->lba_size > TV__DEV_MAX_LBA)
        return "lba size is not a power of two in [512, 65536]";
    if (!is_pow2_u64(d->io_align) || d->io_align % d->lba_size || d->io_align % TV__DEV_MIN_ALIGN)
        return "io_align is not a power of two multiple of the lba size and 4096";
    if (d->object_align == 0 || d->object_align % d->io_align ||
        d->object_align % TV__DEV_OBJECT_ALIGN_MIN)
        return "object_align is not a multiple of io_align and 64 KiB";
    if (d->region_off == 0 || d->region_off % d->io_align)
        return "region offset is 0 or not io_align aligned";
    if (tv__add_u64(d->region_off, d->region_len, &region_end) || region_end > d->size_bytes)
        return "region extends past the device";
    if (d->data_off <= d->region_off || d->data_off > region_end || d->data_off % d->object_align)
        return "data offset is not object_align aligned inside the region";
    return NULL;
}

static const char *replica_problem(const tv__snap_device_info *d, uint64_t base_off,
                                   uint64_t alloc_len)
{
    uint64_t end, region_end = d->region_off + d->region_len; /* checked by device_problem */
    if (alloc_len == 0 || alloc_len % d->object_align || base_off % d->object_align)
        return "extent is empty or not object_align aligned";
    if (base_off < d->data_off || tv__add_u64(base_off, alloc_len, &end) || end > region_end)
        return "extent lies outside the device's data region";
    return NULL;
}

static const char *shard_problem(uint64_t file_len, uint64_t header_len)
{
    uint64_t data_off;
    if (tv__add_u64(header_len, 8, &data_off) || data_off > file_len)
        return "header extends past the end of the file";
    return NULL;
}

/* Checks a tensor against its shard's data section [0, data_len) and its
 * dtype; sets *n_elements. */
static const char *tensor_problem(uint32_t dtype, uint32_t rank, const uint64_t *dims,
                                  uint64_t begin, uint64_t end, uint64_t data_len,
                                  uint64_t *n_elements)
{
    uint64_t n = 1, bits;
    if (dtype >= TV_DTYPE_COUNT)
        return "unknown dtype";
    if (rank > TV_ST_MAX_RANK)
        return "rank over the limit";
    if (end < begin)
        return "end before begin";
    if (end > data_len)
        return "data range extends past its shard's data section";
    for (uint32_t d = 0; d < rank; d++)
        if (tv__mul_u64(n, dims[d], &n))
            return "element count overflows";
    if (tv__mul_u64(n, tv_dtype_bits((tv_dtype)dtype), &bits) || bits % 8 ||
        end - begin != bits / 8)
        return "byte length does not match shape x dtype";
    *n_elements = n;
    return NULL;
}

static int name_shown(size_t len)
{
    return len > NAME_SHOWN ? NAME_SHOWN : (int)len;
}

/* ---- checksum ----------------------------------------------------------- */

/* XXH3-128 (xxHash 0.8, seed 0) of the image with the 32-byte checksum
 * field read as zeros, in xxHash's canonical (big-endian) byte order in the
 * field's first 16 bytes; its last 16 bytes are zero. Corruption detection,
 * not authentication (docs/formats.md): many GB/s, so opening stays cheap. */
int tv__snap_checksum(const void *buf, size_t len, uint8_t out[32])
{
    static const uint8_t zero[32];
    const uint8_t *p = buf;
    XXH3_state_t st;
    XXH128_canonical_t c;
    if (!buf || len < TV__SNAP_HEADER_LEN)
        return TV_E_INVALID_ARG;
    if (XXH3_128bits_reset(&st) != XXH_OK ||
        XXH3_128bits_update(&st, p, TV__SNAP_CHECKSUM_OFF) != XXH_OK ||
        XXH3_128bits_update(&st, zero, sizeof zero) != XXH_OK ||
        XXH3_128bits_update(&st, p + TV__SNAP_CHECKSUM_OFF + 32,
                            len - TV__SNAP_CHECKSUM_OFF - 32) != XXH_OK)
        return TV_E_INVALID_ARG;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(&st));
    _Static_assert(sizeof c.digest == 16, "XXH128 canonical form");
    memcpy(out, c.digest, 16);
    memset(out + 16, 0, 16);
    return 0;
}

int tv__snap_seal(void *buf, size_t len)
{
    uint8_t sum[32];
    int rc = tv__snap_checksum(buf, len, sum);
    if (rc == 0)
        memcpy((uint8_t *)buf + TV__SNAP_CHECKSUM_OFF, sum, sizeof sum);
    return rc;
}

/* ---- builder ------------------------------------------------------------ */

static void device_from_in(const tv__snap_device_in *in, tv__snap_device_info *d)
{
    memset(d, 0, sizeof *d);
    memcpy(d->uuid, in->uuid, sizeof d->uuid);
    d->path = in->path;
    d->path_len = in->path ? strlen(in->path) : 0;
    d->kind = in->kind;
    d->lba_size = in->lba_size;
    d->io_align = in->io_align;
    d->object_align = in->object_align;
    d->size_bytes = in->size_bytes;
    d->region_off = in->region_off;
    d->region_len = in->region_len;
    d->data_off = in->data_off;
}

static int cmp_tensor_in(const void *a, const void *b)
{
    const tv__snap_tensor_in *x = *(const tv__snap_tensor_in *const *)a;
    const tv__snap_tensor_in *y = *(const tv__snap_tensor_in *const *)b;
    if (x->shard != y->shard)
        return x->shard < y->shard ? -1 : 1;
    if (x->begin_off != y->begin_off)
        return x->begin_off < y->begin_off ? -1 : 1;
    if (x->end_off != y->end_off)
        return x->end_off < y->end_off ? -1 : 1;
    size_t n = x->name_len < y->name_len ? x->name_len : y->name_len;
    int c = n ? memcmp(x->name, y->name, n) : 0;
    if (c)
        return c;
    return x->name_len < y->name_len ? -1 : x->name_len > y->name_len;
}

/* Appends s (len bytes) and a NUL to the string table; returns its offset. */
static uint32_t put_string(uint8_t *strings, uint64_t *used, const char *s, size_t len)
{
    uint32_t off = (uint32_t)*used;
    if (len)
        memcpy(strings + off, s, len);
    strings[off + len] = 0;
    *used += len + 1;
    return off;
}

static uint64_t draw_seed(void)
{
    uint64_t seed = 0;
    if (getrandom(&seed, sizeof seed, GRND_NONBLOCK) != (ssize_t)sizeof seed) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        seed = ((uint64_t)ts.tv_sec * 1000000007ull) ^ (uint64_t)ts.tv_nsec ^
               ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)&seed;
    }
    return seed ? seed : 0x5851F42D4C957F2Dull; /* 0 means "draw one" to the builder */
}

/* Validates the input and computes the string table and dims lengths. */
static int build_check(const tv__snap_in *in, tv__snap_device_info *devs, uint64_t *strings_len,
                       uint64_t *n_dims, uint64_t *n_replicas, tv_error *err)
{
    uint64_t sl = 0, nd = 0, nr = 0;
    size_t model_len = strlen(in->model);
    if (model_len == 0 || model_len >= UINT32_MAX)
        return tv__seterr(err, TV_E_INVALID_ARG, "snapshot: model name is empty or too long");
    if (in->generation <= 0)
        return tv__seterr(err, TV_E_INVALID_ARG, "snapshot: generation %lld is not positive",
                          (long long)in->generation);
    if ((in->n_devices && !in->devices) || (in->n_shards && !in->shards) ||
        (in->n_tensors && !in->tensors))
        return tv__seterr(err, TV_E_INVALID_ARG, "snapshot: NULL record array");
    if (in->n_devices > UINT32_MAX || in->n_shards > UINT32_MAX || in->n_tensors > UINT32_MAX / 4)
        return tv__seterr(err, TV_E_OVERFLOW,
                          "snapshot: too many records (%zu devices, %zu shards, %zu tensors)",
                          in->n_devices, in->n_shards, in->n_tensors);
    sl = model_len + 1;
    for (size_t i = 0; i < in->n_devices; i++) {
        const char *why;
        if (!in->devices[i].path || !in->devices[i].path[0])
            return tv__seterr(err, TV_E_INVALID_ARG, "snapshot: device %zu has no path", i);
        device_from_in(&in->devices[i], &devs[i]);
        if ((why = device_problem(&devs[i])))
            return tv__seterr(err, TV_E_INVALID_ARG, "snapshot: device %zu (%s): %s", i,
                              in->devices[i].path, why);
        if (tv__add_u64(sl, devs[i].path_len + 1, &sl))
            return tv__seterr(err, TV_E_OVERFLOW, "snapshot: string table overflows");
    }
    for (size_t i = 0; i < in->n_shards; i++) {
        const tv__snap_shard_in *sh = &in->shards[i];
        const char *why;
        if (!sh->name)
            return tv__seterr(err, TV_E_INVALID_ARG, "snapshot: shard %zu has no name", i);
        if ((why = shard_problem(sh->file_len, sh->header_len)))
            return tv__seterr(err, TV_E_INVALID_ARG, "snapshot: shard %zu (%s): %s", i, sh->name,
                              why);
        if (sh->n_replicas == 0 || !sh->replicas)
            return tv__seterr(err, TV_E_INVALID_ARG, "snapshot: shard %zu (%s) has no replica", i,
                              sh->name);
        for (uint32_t r = 0; r < sh->n_replicas; r++) {
            const tv__snap_replica_in *rp = &sh->replicas[r];
            if (rp->device >= in->n_devices)
                return tv__seterr(err, TV_E_INVALID_ARG,
                                  "snapshot: shard %zu (%s) replica %u: device %u out of range", i,
                                  sh->name, r, rp->device);
            if ((why = replica_problem(&devs[rp->device], rp->base_off, rp->alloc_len)))
                return tv__seterr(err, TV_E_INVALID_ARG,
                                  "snapshot: shard %zu (%s) replica %u (object %lld): %s", i,
                                  sh->name, r, (long long)rp->object_id, why);
            if (rp->alloc_len < sh->file_len)
                return tv__seterr(
                    err, TV_E_INVALID_ARG,
                    "snapshot: shard %zu (%s) replica %u: object of %llu bytes is shorter than the file (%llu)",
                    i, sh->name, r, (unsigned long long)rp->alloc_len,
                    (unsigned long long)sh->file_len);
        }
        if (tv__add_u64(nr, sh->n_replicas, &nr) || tv__add_u64(sl, strlen(sh->name) + 1, &sl))
            return tv__seterr(err, TV_E_OVERFLOW, "snapshot: too many replicas or strings");
    }
    if (nr > UINT32_MAX)
        return tv__seterr(err, TV_E_OVERFLOW, "snapshot: too many replicas (%llu)",
                          (unsigned long long)nr);
    for (size_t i = 0; i < in->n_tensors; i++) {
        const tv__snap_tensor_in *t = &in->tensors[i];
        uint64_t n_el;
        const char *why;
        if (!t->name)
            return tv__seterr(err, TV_E_INVALID_ARG, "snapshot: tensor %zu has no name", i);
        if (t->shard >= in->n_shards)
            return tv__seterr(err, TV_E_INVALID_ARG,
                              "snapshot: tensor '%.*s': shard %u out of range",
                              name_shown(t->name_len), t->name, t->shard);
        if (t->rank && !t->shape)
            return tv__seterr(err, TV_E_INVALID_ARG, "snapshot: tensor '%.*s' has no shape",
                              name_shown(t->name_len), t->name);
        const tv__snap_shard_in *sh = &in->shards[t->shard];
        if ((why = tensor_problem((uint32_t)t->dtype, t->rank, t->shape, t->begin_off, t->end_off,
                                  sh->file_len - 8 - sh->header_len, &n_el)))
            return tv__seterr(err, TV_E_INVALID_ARG, "snapshot: tensor '%.*s' (shard %s): %s",
                              name_shown(t->name_len), t->name, sh->name, why);
        if (t->name_len >= UINT32_MAX || tv__add_u64(nd, t->rank, &nd) ||
            tv__add_u64(sl, (uint64_t)t->name_len + 1, &sl))
            return tv__seterr(err, TV_E_OVERFLOW, "snapshot: names or dims overflow");
    }
    if (sl > UINT32_MAX || nd > UINT32_MAX)
        return tv__seterr(
            err, TV_E_OVERFLOW,
            "snapshot: string table (%llu bytes) or dims (%llu) over the format's 32-bit limit",
            (unsigned long long)sl, (unsigned long long)nd);
    *strings_len = sl;
    *n_dims = nd;
    *n_replicas = nr;
    return 0;
}

/* What the builder works on: the input, its validated devices, the tensors
 * in file order and the image being filled with its section offsets. */
typedef struct snap_builder {
    const tv__snap_in *in;
    tv__snap_device_info *devs;       /* from build_check */
    const tv__snap_tensor_in **order; /* in->tensors in file order */
    uint64_t strings_len, n_dims, n_replicas;
    uint32_t n_index;
    uint64_t devices_off, shards_off, replicas_off, tensors_off, dims_off, strings_off, index_off;
    uint64_t total_len;
    uint8_t *img;
    uint64_t strings_used; /* bytes of the string table written so far */
    uint64_t seed;
} snap_builder;

/* Step 2: sizes the index and lays the sections out in order; every record
 * size is a multiple of 8, so only the string table needs padding. */
static int build_layout(snap_builder *b, tv_error *err)
{
    const tv__snap_in *in = b->in;
    uint64_t off = TV__SNAP_HEADER_LEN, pad_strings;

    b->n_index = MIN_INDEX;
    while (b->n_index < 2 * in->n_tensors) /* n_tensors <= UINT32_MAX / 4 */
        b->n_index *= 2;
    b->devices_off = off;
    off += (uint64_t)in->n_devices * TV__SNAP_DEVICE_LEN;
    b->shards_off = off;
    off += (uint64_t)in->n_shards * TV__SNAP_SHARD_LEN;
    b->replicas_off = off;
    off += b->n_replicas * TV__SNAP_REPLICA_LEN;
    b->tensors_off = off;
    off += (uint64_t)in->n_tensors * TV__SNAP_TENSOR_LEN;
    b->dims_off = off;
    off += b->n_dims * 8;
    b->strings_off = off;
    if (tv__align_up_u64(b->strings_len, 8, &pad_strings) || tv__add_u64(off, pad_strings, &off))
        return tv__seterr(err, TV_E_OVERFLOW, "snapshot: image size overflows");
    b->index_off = off;
    if (tv__add_u64(off, (uint64_t)b->n_index * TV__SNAP_SLOT_LEN, &b->total_len) ||
        b->total_len > SIZE_MAX)
        return tv__seterr(err, TV_E_OVERFLOW, "snapshot: image size overflows");
    return 0;
}

/* Step 3: the tensors in file order, and the zeroed image. */
static int build_alloc(snap_builder *b, tv_error *err)
{
    const tv__snap_in *in = b->in;

    if (in->n_tensors && !(b->order = malloc(in->n_tensors * sizeof *b->order)))
        return tv__seterr(err, -ENOMEM, "snapshot: out of memory");
    if (!(b->img = calloc(1, (size_t)b->total_len)))
        return tv__seterr(err, -ENOMEM, "snapshot: out of memory (%llu bytes)",
                          (unsigned long long)b->total_len);
    for (size_t i = 0; i < in->n_tensors; i++)
        b->order[i] = &in->tensors[i];
    if (in->n_tensors > 1)
        qsort(b->order, in->n_tensors, sizeof *b->order, cmp_tensor_in);
    return 0;
}

/* Appends s to the image's string table; returns its offset there. */
static uint32_t build_string(snap_builder *b, const char *s, size_t len)
{
    return put_string(b->img + b->strings_off, &b->strings_used, s, len);
}

/* Step 4: the header (checksum left zero) and the model name, the first
 * string of the table. */
static void build_header(snap_builder *b)
{
    const tv__snap_in *in = b->in;
    uint8_t *h = b->img;
    size_t model_len = strlen(in->model);

    memcpy(h, TV__SNAP_MAGIC, 8);
    PUT32(h, snap_header, version, TV__SNAP_VERSION);
    PUT32(h, snap_header, header_len, TV__SNAP_HEADER_LEN);
    PUT64(h, snap_header, total_len, b->total_len);
    PUT64(h, snap_header, generation, (uint64_t)in->generation);
    PUT32(h, snap_header, n_devices, in->n_devices);
    PUT32(h, snap_header, n_shards, in->n_shards);
    PUT32(h, snap_header, n_replicas, b->n_replicas);
    PUT32(h, snap_header, n_tensors, in->n_tensors);
    PUT32(h, snap_header, n_index, b->n_index);
    PUT64(h, snap_header, n_dims, b->n_dims);
    PUT64(h, snap_header, strings_len, b->strings_len);
    PUT64(h, snap_header, devices_off, b->devices_off);
    PUT64(h, snap_header, shards_off, b->shards_off);
    PUT64(h, snap_header, replicas_off, b->replicas_off);
    PUT64(h, snap_header, tensors_off, b->tensors_off);
    PUT64(h, snap_header, dims_off, b->dims_off);
    PUT64(h, snap_header, strings_off, b->strings_off);
    PUT64(h, snap_header, index_off, b->index_off);
    PUT64(h, snap_header, hash_seed, b->seed);
    PUT32(h, snap_header, model_off, build_string(b, in->model, model_len));
    PUT32(h, snap_header, model_len, model_len);
}

/* Step 5: the device records and their paths. */
static void build_devices(snap_builder *b)
{
    for (size_t i = 0; i < b->in->n_devices; i++) {
        const tv__snap_device_in *d = &b->in->devices[i];
        uint8_t *p = b->img + b->devices_off + i * TV__SNAP_DEVICE_LEN;
        PUTB(p, snap_device_rec, uuid, d->uuid);
        PUT32(p, snap_device_rec, path_off, build_string(b, d->path, b->devs[i].path_len));
        PUT32(p, snap_device_rec, path_len, b->devs[i].path_len);
        PUT32(p, snap_device_rec, kind, d->kind);
        PUT32(p, snap_device_rec, lba_size, d->lba_size);
        PUT32(p, snap_device_rec, io_align, d->io_align);
        PUT32(p, snap_device_rec, nsid, d->nsid);
        PUT64(p, snap_device_rec, object_align, d->object_align);
        PUT64(p, snap_device_rec, size_bytes, d->size_bytes);
        PUT64(p, snap_device_rec, region_off, d->region_off);
        PUT64(p, snap_device_rec, region_len, d->region_len);
        PUT64(p, snap_device_rec, data_off, d->data_off);
        PUTB(p, snap_device_rec, serial, d->serial);
        PUTB(p, snap_device_rec, model, d->model);
        PUTB(p, snap_device_rec, nguid, d->nguid);
        PUTB(p, snap_device_rec, eui64, d->eui64);
    }
}

/* Step 6: the shard records, their names and their replicas (in shard
 * order, so each shard's replicas are one run). */
static void build_shards(snap_builder *b)
{
    uint32_t rep = 0;
    for (size_t i = 0; i < b->in->n_shards; i++) {
        const tv__snap_shard_in *sh = &b->in->shards[i];
        uint8_t *p = b->img + b->shards_off + i * TV__SNAP_SHARD_LEN;
        size_t nl = strlen(sh->name);
        PUT32(p, snap_shard_rec, name_off, build_string(b, sh->name, nl));
        PUT32(p, snap_shard_rec, name_len, nl);
        PUT64(p, snap_shard_rec, file_len, sh->file_len);
        PUT64(p, snap_shard_rec, header_len, sh->header_len);
        PUTB(p, snap_shard_rec, sha256, sh->sha256);
        PUT32(p, snap_shard_rec, first_replica, rep);
        PUT32(p, snap_shard_rec, n_replicas, sh->n_replicas);
        for (uint32_t r = 0; r < sh->n_replicas; r++, rep++) {
            const tv__snap_replica_in *rp = &sh->replicas[r];
            uint8_t *q = b->img + b->replicas_off + (uint64_t)rep * TV__SNAP_REPLICA_LEN;
            PUT32(q, snap_replica_rec, device, rp->device);
            PUT64(q, snap_replica_rec, object_id, (uint64_t)rp->object_id);
            PUT64(q, snap_replica_rec, base_off, rp->base_off);
            PUT64(q, snap_replica_rec, alloc_len, rp->alloc_len);
        }
    }
}

/* Places tensor i (of b->order) in the name index: linear probing from its
 * hash to the first empty slot. Returns 0, or TV_E_INVALID_ARG when a
 * tensor of the same name is already there. */
static int build_index_insert(snap_builder *b, size_t i, tv_error *err)
{
    const tv__snap_tensor_in *t = b->order[i];
    uint8_t *index = b->img + b->index_off;
    uint32_t mask = b->n_index - 1;
    uint64_t hv = tv__hash_bytes(t->name, t->name_len, b->seed);

    for (uint32_t pos = (uint32_t)hv & mask;; pos = (pos + 1) & mask) {
        uint8_t *slot = index + (uint64_t)pos * TV__SNAP_SLOT_LEN;
        uint32_t other = GET32(slot, snap_slot, tensor);
        if (other == 0) {
            PUT32(slot, snap_slot, hash_hi, hv >> 32);
            PUT32(slot, snap_slot, tensor, i + 1);
            return 0;
        }
        const tv__snap_tensor_in *o = b->order[other - 1];
        if (GET32(slot, snap_slot, hash_hi) == (uint32_t)(hv >> 32) && o->name_len == t->name_len &&
            memcmp(o->name, t->name, t->name_len) == 0)
            return tv__seterr(err, TV_E_INVALID_ARG, "snapshot: tensor '%.*s' appears twice",
                              name_shown(t->name_len), t->name);
    }
}

/* Step 7: the tensor records in file order, their names and dims, and the
 * name index (which finds duplicate names). */
static int build_tensors(snap_builder *b, tv_error *err)
{
    uint64_t dim = 0;
    int rc;

    for (size_t i = 0; i < b->in->n_tensors; i++) {
        const tv__snap_tensor_in *t = b->order[i];
        uint8_t *p = b->img + b->tensors_off + i * TV__SNAP_TENSOR_LEN;
        PUT32(p, snap_tensor_rec, name_off, build_string(b, t->name, t->name_len));
        PUT32(p, snap_tensor_rec, name_len, t->name_len);
        PUT32(p, snap_tensor_rec, dtype, t->dtype);
        PUT32(p, snap_tensor_rec, rank, t->rank);
        PUT32(p, snap_tensor_rec, first_dim, dim);
        PUT32(p, snap_tensor_rec, shard, t->shard);
        PUT64(p, snap_tensor_rec, begin_off, t->begin_off);
        PUT64(p, snap_tensor_rec, end_off, t->end_off);
        for (uint32_t d = 0; d < t->rank; d++, dim++)
            tv__le64_put(b->img + b->dims_off + dim * 8, t->shape[d]);
        if ((rc = build_index_insert(b, i, err)))
            return rc;
    }
    return 0;
}

/* Validate (1), lay out (2), allocate and order (3), write the header (4),
 * devices (5), shards and replicas (6), tensors, dims and index (7), then
 * seal the checksum (8). The string table fills in that order. */
int tv__snap_build(const tv__snap_in *in, void **out, size_t *out_len, tv_error *err)
{
    snap_builder b = {.in = in};
    int rc;

    if (out)
        *out = NULL;
    if (out_len)
        *out_len = 0;
    if (!in || !in->model || !out || !out_len)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__snap_build: NULL argument");
    if (in->n_devices && !(b.devs = calloc(in->n_devices, sizeof *b.devs))) {
        rc = tv__seterr(err, -ENOMEM, "snapshot: out of memory");
        goto fail;
    }
    if ((rc = build_check(in, b.devs, &b.strings_len, &b.n_dims, &b.n_replicas, err)) ||
        (rc = build_layout(&b, err)) || (rc = build_alloc(&b, err)))
        goto fail;
    b.seed = in->hash_seed ? in->hash_seed : draw_seed();
    build_header(&b);
    build_devices(&b);
    build_shards(&b);
    if ((rc = build_tensors(&b, err)))
        goto fail;
    if ((rc = tv__snap_seal(b.img, (size_t)b.total_len))) {
        rc = tv__seterr(err, rc, "snapshot: checksum failed");
        goto fail;
    }
    free(b.order);
    free(b.devs);
    *out = b.img;
    *out_len = (size_t)b.total_len;
    return 0;
fail:
    free(b.img);
    free(b.order);
    free(b.devs);
    return rc;
}

/* ---- reader ------------------------------------------------------------- */

/* Resolves a string ref: inside the table and followed by a NUL. */
static bool string_ref(const tv__snap *s, uint32_t off, uint32_t len, const char **out)
{
    uint64_t end = (uint64_t)off + len;
    if (end >= s->strings_len || s->base[s->strings_off + end] != 0)
        return false;
    *out = (const char *)s->base + s->strings_off + off;
    return true;
}

static bool all_zero(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i])
            return false;
    return true;
}

typedef struct section {
    const char *name;
    uint64_t off;
    uint64_t count;
    uint64_t rec_len;
    uint64_t len; /* computed */
} section;

int tv__snap_open(const void *buf, size_t len, unsigned flags, tv__snap *out, tv_error *err)
{
    const uint8_t *p = buf;
    if (!buf || !out)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__snap_open: NULL argument");
    memset(out, 0, sizeof *out);
    if (len < TV__SNAP_HEADER_LEN)
        return tv__seterr(err, TV_E_SNAPSHOT,
                          "snapshot: %zu bytes, shorter than the %u-byte header", len,
                          TV__SNAP_HEADER_LEN);
    if (memcmp(p, TV__SNAP_MAGIC, 8) != 0)
        return tv__seterr(err, TV_E_SNAPSHOT, "snapshot: bad magic (not a tensorvault snapshot)");
    uint32_t version = GET32(p, snap_header, version);
    if (version != TV__SNAP_VERSION)
        return tv__seterr(err, TV_E_SNAPSHOT, "snapshot: version %u, this build reads %u", version,
                          TV__SNAP_VERSION);
    uint32_t header_len = GET32(p, snap_header, header_len);
    if (header_len != TV__SNAP_HEADER_LEN)
        return tv__seterr(err, TV_E_SNAPSHOT, "snapshot: header_len %u, expected %u", header_len,
                          TV__SNAP_HEADER_LEN);
    uint64_t total_len = GET64(p, snap_header, total_len);
    if (total_len != len)
        return tv__seterr(err, TV_E_SNAPSHOT,
                          "snapshot: total_len %llu but the image has %zu bytes",
                          (unsigned long long)total_len, len);
    if (flags & TV__SNAP_VERIFY_CHECKSUM) {
        uint8_t sum[32];
        int rc = tv__snap_checksum(p, len, sum);
        if (rc)
            return tv__seterr(err, rc, "snapshot: cannot compute the checksum");
        if (memcmp(sum, p + TV__SNAP_CHECKSUM_OFF, sizeof sum) != 0)
            return tv__seterr(err, TV_E_SNAPSHOT, "snapshot: checksum mismatch");
    }
    if (GET32(p, snap_header, flags) != 0 ||
        !all_zero(p + offsetof(snap_header, reserved), sizeof(((snap_header *)0)->reserved)))
        return tv__seterr(err, TV_E_SNAPSHOT, "snapshot: reserved header bytes are not zero");
    int64_t generation = (int64_t)GET64(p, snap_header, generation);
    if (generation <= 0)
        return tv__seterr(err, TV_E_SNAPSHOT, "snapshot: generation %lld is not positive",
                          (long long)generation);

    tv__snap s = {.base = p, .len = len, .generation = generation};
    s.n_devices = GET32(p, snap_header, n_devices);
    s.n_shards = GET32(p, snap_header, n_shards);
    s.n_replicas = GET32(p, snap_header, n_replicas);
    s.n_tensors = GET32(p, snap_header, n_tensors);
    s.n_index = GET32(p, snap_header, n_index);
    s.n_dims = GET64(p, snap_header, n_dims);
    s.strings_len = GET64(p, snap_header, strings_len);
    s.devices_off = GET64(p, snap_header, devices_off);
    s.shards_off = GET64(p, snap_header, shards_off);
    s.replicas_off = GET64(p, snap_header, replicas_off);
    s.tensors_off = GET64(p, snap_header, tensors_off);
    s.dims_off = GET64(p, snap_header, dims_off);
    s.strings_off = GET64(p, snap_header, strings_off);
    s.index_off = GET64(p, snap_header, index_off);
    s.hash_seed = GET64(p, snap_header, hash_seed);
    s.model_off = GET32(p, snap_header, model_off);
    s.model_len = GET32(p, snap_header, model_len);

    if (!is_pow2_u64(s.n_index) || s.n_index <= s.n_tensors)
        return tv__seterr(
            err, TV_E_SNAPSHOT,
            "snapshot: index of %u slots for %u tensors (must be a power of two above the tensor count)",
            s.n_index, s.n_tensors);
    if (s.strings_len > UINT32_MAX)
        return tv__seterr(err, TV_E_SNAPSHOT, "snapshot: string table of %llu bytes over 4 GiB",
                          (unsigned long long)s.strings_len);

    section sec[] = {
        {"devices", s.devices_off, s.n_devices, TV__SNAP_DEVICE_LEN, 0},
        {"shards", s.shards_off, s.n_shards, TV__SNAP_SHARD_LEN, 0},
        {"replicas", s.replicas_off, s.n_replicas, TV__SNAP_REPLICA_LEN, 0},
        {"tensors", s.tensors_off, s.n_tensors, TV__SNAP_TENSOR_LEN, 0},
        {"dims", s.dims_off, s.n_dims, 8, 0},
        {"strings", s.strings_off, s.strings_len, 1, 0},
        {"index", s.index_off, s.n_index, TV__SNAP_SLOT_LEN, 0},
    };
    for (size_t i = 0; i < TV_ARRAY_LEN(sec); i++) {
        uint64_t end;
        if (tv__mul_u64(sec[i].count, sec[i].rec_len, &sec[i].len))
            return tv__seterr(err, TV_E_SNAPSHOT, "snapshot: %s: count %llu overflows", sec[i].name,
                              (unsigned long long)sec[i].count);
        if (sec[i].off % 8)
            return tv__seterr(err, TV_E_SNAPSHOT, "snapshot: %s: offset %llu is not 8-byte aligned",
                              sec[i].name, (unsigned long long)sec[i].off);
        if (sec[i].off < TV__SNAP_HEADER_LEN || tv__add_u64(sec[i].off, sec[i].len, &end) ||
            end > len)
            return tv__seterr(err, TV_E_SNAPSHOT,
                              "snapshot: %s: [%llu, +%llu) lies outside the image body [%u, %zu)",
                              sec[i].name, (unsigned long long)sec[i].off,
                              (unsigned long long)sec[i].len, TV__SNAP_HEADER_LEN, len);
    }
    for (size_t i = 0; i < TV_ARRAY_LEN(sec); i++) {
        for (size_t j = i + 1; j < TV_ARRAY_LEN(sec); j++) {
            if (!sec[i].len || !sec[j].len)
                continue;
            if (sec[i].off < sec[j].off + sec[j].len && sec[j].off < sec[i].off + sec[i].len)
                return tv__seterr(err, TV_E_SNAPSHOT, "snapshot: sections %s and %s overlap",
                                  sec[i].name, sec[j].name);
        }
    }
    const char *model;
    if (s.model_len == 0 || !string_ref(&s, s.model_off, s.model_len, &model))
        return tv__seterr(err, TV_E_SNAPSHOT,
                          "snapshot: model name ref (%u, %u) is empty or outside the string table",
                          s.model_off, s.model_len);
    *out = s;
    return 0;
}

int tv__snap_model(const tv__snap *s, const char **name, size_t *len, tv_error *err)
{
    const char *m;
    if (!s || !s->base || !name || !len)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__snap_model: NULL argument");
    if (s->model_len == 0 || !string_ref(s, s->model_off, s->model_len, &m))
        return tv__seterr(err, TV_E_SNAPSHOT, "snapshot: model name ref is bad");
    *name = m;
    *len = s->model_len;
    return 0;
}

/* One copy per record type of the fields a label carries (see dev.h). */
#define DEV_RECORD_FROM(d, out)                                                                    \
    do {                                                                                           \
        memcpy((out)->store_uuid, (d)->uuid, sizeof(out)->store_uuid);                             \
        (out)->kind = (d)->kind;                                                                   \
        (out)->lba_size = (d)->lba_size;                                                           \
        (out)->io_align = (d)->io_align;                                                           \
        (out)->object_align = (d)->object_align;                                                   \
        (out)->size_bytes = (d)->size_bytes;                                                       \
        (out)->region_off = (d)->region_off;                                                       \
        (out)->region_len = (d)->region_len;                                                       \
        memcpy((out)->serial, (d)->serial, sizeof(out)->serial);                                   \
        memcpy((out)->model, (d)->model, sizeof(out)->model);                                      \
        (out)->nsid = (d)->nsid;                                                                   \
        memcpy((out)->nguid, (d)->nguid, sizeof(out)->nguid);                                      \
        memcpy((out)->eui64, (d)->eui64, sizeof(out)->eui64);                                      \
    } while (0)

void tv__snap_device_record(const tv__snap_device_info *d, tv__dev_record *out)
{
    DEV_RECORD_FROM(d, out);
}

void tv__snap_device_in_record(const tv__snap_device_in *d, tv__dev_record *out)
{
    DEV_RECORD_FROM(d, out);
}

int tv__snap_device(const tv__snap *s, uint32_t i, tv__snap_device_info *out, tv_error *err)
{
    if (!s || !s->base || !out)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__snap_device: NULL argument");
    if (i >= s->n_devices)
        return tv__seterr(err, TV_E_INVALID_ARG, "snapshot: device %u out of range (%u)", i,
                          s->n_devices);
    const uint8_t *p = s->base + s->devices_off + (uint64_t)i * TV__SNAP_DEVICE_LEN;
    tv__snap_device_info d;
    memset(&d, 0, sizeof d);
    uint32_t path_off = GET32(p, snap_device_rec, path_off);
    uint32_t path_len = GET32(p, snap_device_rec, path_len);
    if (GET32(p, snap_device_rec, reserved) != 0)
        return tv__seterr(err, TV_E_SNAPSHOT, "snapshot: device %u: reserved bytes not zero", i);
    if (path_len == 0 || !string_ref(s, path_off, path_len, &d.path))
        return tv__seterr(
            err, TV_E_SNAPSHOT,
            "snapshot: device %u: path ref (%u, %u) is empty or outside the string table", i,
            path_off, path_len);
    d.path_len = path_len;
    GETB(p, snap_device_rec, uuid, d.uuid);
    d.kind = GET32(p, snap_device_rec, kind);
    d.lba_size = GET32(p, snap_device_rec, lba_size);
    d.io_align = GET32(p, snap_device_rec, io_align);
    d.nsid = GET32(p, snap_device_rec, nsid);
    d.object_align = GET64(p, snap_device_rec, object_align);
    d.size_bytes = GET64(p, snap_device_rec, size_bytes);
    d.region_off = GET64(p, snap_device_rec, region_off);
    d.region_len = GET64(p, snap_device_rec, region_len);
    d.data_off = GET64(p, snap_device_rec, data_off);
    GETB(p, snap_device_rec, serial, d.serial);
    GETB(p, snap_device_rec, model, d.model);
    GETB(p, snap_device_rec, nguid, d.nguid);
    GETB(p, snap_device_rec, eui64, d.eui64);
    const char *why = device_problem(&d);
    if (why)
        return tv__seterr(err, TV_E_SNAPSHOT, "snapshot: device %u (%.*s): %s", i,
                          name_shown(d.path_len), d.path, why);
    *out = d;
    return 0;
}

int tv__snap_replica(const tv__snap *s, uint32_t i, tv__snap_replica_info *out, tv_error *err)
{
    if (!s || !s->base || !out)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__snap_replica: NULL argument");
    if (i >= s->n_replicas)
        return tv__seterr(err, TV_E_INVALID_ARG, "snapshot: replica %u out of range (%u)", i,
                          s->n_replicas);
    const uint8_t *p = s->base + s->replicas_off + (uint64_t)i * TV__SNAP_REPLICA_LEN;
    tv__snap_replica_info r = {
        .device = GET32(p, snap_replica_rec, device),
        .object_id = (int64_t)GET64(p, snap_replica_rec, object_id),
        .base_off = GET64(p, snap_replica_rec, base_off),
        .alloc_len = GET64(p, snap_replica_rec, alloc_len),
    };
    if (GET32(p, snap_replica_rec, reserved) != 0)
        return tv__seterr(err, TV_E_SNAPSHOT, "snapshot: replica %u: reserved bytes not zero", i);
    if (r.device >= s->n_devices)
        return tv__seterr(err, TV_E_SNAPSHOT, "snapshot: replica %u: device %u out of range (%u)",
                          i, r.device, s->n_devices);
    tv__snap_device_info d;
    int rc = tv__snap_device(s, r.device, &d, err);
    if (rc)
        return rc;
    const char *why = replica_problem(&d, r.base_off, r.alloc_len);
    if (why)
        return tv__seterr(err, TV_E_SNAPSHOT, "snapshot: replica %u (object %lld on device %u): %s",
                          i, (long long)r.object_id, r.device, why);
    *out = r;
    return 0;
}

/* A shard's own fields, without walking its replicas. */
static int shard_fields(const tv__snap *s, uint32_t i, tv__snap_shard_info *out, tv_error *err)
{
    const uint8_t *p = s->base + s->shards_off + (uint64_t)i * TV__SNAP_SHARD_LEN;
    tv__snap_shard_info sh;
    memset(&sh, 0, sizeof sh);
    uint32_t name_off = GET32(p, snap_shard_rec, name_off);
    uint32_t name_len = GET32(p, snap_shard_rec, name_len);
    if (!string_ref(s, name_off, name_len, &sh.name))
        return tv__seterr(err, TV_E_SNAPSHOT,
                          "snapshot: shard %u: name ref (%u, %u) outside the string table", i,
                          name_off, name_len);
    sh.name_len = name_len;
    sh.file_len = GET64(p, snap_shard_rec, file_len);
    sh.header_len = GET64(p, snap_shard_rec, header_len);
    GETB(p, snap_shard_rec, sha256, sh.sha256);
    sh.first_replica = GET32(p, snap_shard_rec, first_replica);
    sh.n_replicas = GET32(p, snap_shard_rec, n_replicas);
    const char *why = shard_problem(sh.file_len, sh.header_len);
    if (why)
        return tv__seterr(err, TV_E_SNAPSHOT, "snapshot: shard %u (%.*s): %s", i,
                          name_shown(sh.name_len), sh.name, why);
    sh.data_off = sh.header_len + 8;
    if (sh.n_replicas == 0 || (uint64_t)sh.first_replica + sh.n_replicas > s->n_replicas)
        return tv__seterr(
            err, TV_E_SNAPSHOT,
            "snapshot: shard %u (%.*s): replicas [%u, +%u) empty or out of range (%u)", i,
            name_shown(sh.name_len), sh.name, sh.first_replica, sh.n_replicas, s->n_replicas);
    *out = sh;
    return 0;
}

int tv__snap_shard(const tv__snap *s, uint32_t i, tv__snap_shard_info *out, tv_error *err)
{
    if (!s || !s->base || !out)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__snap_shard: NULL argument");
    if (i >= s->n_shards)
        return tv__seterr(err, TV_E_INVALID_ARG, "snapshot: shard %u out of range (%u)", i,
                          s->n_shards);
    tv__snap_shard_info sh;
    int rc = shard_fields(s, i, &sh, err);
    if (rc)
        return rc;
    for (uint32_t r = 0; r < sh.n_replicas; r++) {
        tv__snap_replica_info rep = {0};
        if ((rc = tv__snap_replica(s, sh.first_replica + r, &rep, err)))
            return rc;
        if (rep.alloc_len < sh.file_len)
            return tv__seterr(
                err, TV_E_SNAPSHOT,
                "snapshot: shard %u (%.*s): file of %llu bytes longer than replica %u (%llu bytes)",
                i, name_shown(sh.name_len), sh.name, (unsigned long long)sh.file_len,
                sh.first_replica + r, (unsigned long long)rep.alloc_len);
    }
    *out = sh;
    return 0;
}

int tv__snap_tensor(const tv__snap *s, uint32_t i, tv__snap_tensor_info *out, tv_error *err)
{
    if (!s || !s->base || !out)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__snap_tensor: NULL argument");
    if (i >= s->n_tensors)
        return tv__seterr(err, TV_E_INVALID_ARG, "snapshot: tensor %u out of range (%u)", i,
                          s->n_tensors);
    const uint8_t *p = s->base + s->tensors_off + (uint64_t)i * TV__SNAP_TENSOR_LEN;
    tv__snap_tensor_info t;
    memset(&t, 0, sizeof t);
    uint32_t name_off = GET32(p, snap_tensor_rec, name_off);
    uint32_t name_len = GET32(p, snap_tensor_rec, name_len);
    if (!string_ref(s, name_off, name_len, &t.name))
        return tv__seterr(err, TV_E_SNAPSHOT,
                          "snapshot: tensor %u: name ref (%u, %u) outside the string table", i,
                          name_off, name_len);
    t.name_len = name_len;
    uint32_t dtype = GET32(p, snap_tensor_rec, dtype);
    uint32_t first_dim = GET32(p, snap_tensor_rec, first_dim);
    t.rank = GET32(p, snap_tensor_rec, rank);
    t.shard = GET32(p, snap_tensor_rec, shard);
    t.begin_off = GET64(p, snap_tensor_rec, begin_off);
    t.end_off = GET64(p, snap_tensor_rec, end_off);
    if (t.rank > TV_ST_MAX_RANK || (uint64_t)first_dim + t.rank > s->n_dims)
        return tv__seterr(
            err, TV_E_SNAPSHOT,
            "snapshot: tensor '%.*s': rank %u or dims [%u, +%u) outside the dims array (%llu)",
            name_shown(t.name_len), t.name, t.rank, first_dim, t.rank,
            (unsigned long long)s->n_dims);
    if (t.shard >= s->n_shards)
        return tv__seterr(err, TV_E_SNAPSHOT, "snapshot: tensor '%.*s': shard %u out of range (%u)",
                          name_shown(t.name_len), t.name, t.shard, s->n_shards);
    tv__snap_shard_info sh;
    int rc = shard_fields(s, t.shard, &sh, err);
    if (rc)
        return rc;
    uint64_t dims[TV_ST_MAX_RANK];
    t.shape_le = s->base + s->dims_off + (uint64_t)first_dim * 8;
    for (uint32_t d = 0; d < t.rank; d++)
        dims[d] = tv__le64_get(t.shape_le + (size_t)d * 8);
    const char *why = tensor_problem(dtype, t.rank, dims, t.begin_off, t.end_off,
                                     sh.file_len - sh.data_off, &t.n_elements);
    if (why)
        return tv__seterr(err, TV_E_SNAPSHOT, "snapshot: tensor '%.*s' (shard %u): %s",
                          name_shown(t.name_len), t.name, t.shard, why);
    t.dtype = (tv_dtype)dtype;
    t.nbytes = t.end_off - t.begin_off;
    *out = t;
    return 0;
}

uint64_t tv__snap_dim(const tv__snap_tensor_info *t, uint32_t d)
{
    if (!t || d >= t->rank || !t->shape_le)
        return 0;
    return tv__le64_get(t->shape_le + (size_t)d * 8);
}

int tv__snap_find(const tv__snap *s, const char *name, size_t len, uint32_t *index, tv_error *err)
{
    if (!s || !s->base || (!name && len))
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__snap_find: NULL argument");
    if (!name)
        name = "";
    uint64_t h = tv__hash_bytes(name, len, s->hash_seed);
    uint32_t mask = s->n_index - 1, hi = (uint32_t)(h >> 32);
    const uint8_t *slots = s->base + s->index_off;
    uint32_t pos = (uint32_t)h & mask;
    /* At most n_index probes: a crafted index without an empty slot ends. */
    for (uint32_t probe = 0; probe < s->n_index; probe++, pos = (pos + 1) & mask) {
        const uint8_t *slot = slots + (uint64_t)pos * TV__SNAP_SLOT_LEN;
        uint32_t t1 = GET32(slot, snap_slot, tensor);
        if (t1 == 0)
            return tv__seterr(err, TV_E_NOT_FOUND, "no tensor '%.*s' in the snapshot",
                              name_shown(len), name);
        if (t1 > s->n_tensors)
            return tv__seterr(err, TV_E_SNAPSHOT, "snapshot: index slot %u names tensor %u of %u",
                              pos, t1 - 1, s->n_tensors);
        if (GET32(slot, snap_slot, hash_hi) != hi)
            continue;
        const uint8_t *rec = s->base + s->tensors_off + (uint64_t)(t1 - 1) * TV__SNAP_TENSOR_LEN;
        uint32_t name_off = GET32(rec, snap_tensor_rec, name_off);
        uint32_t name_len = GET32(rec, snap_tensor_rec, name_len);
        const char *tn;
        if (!string_ref(s, name_off, name_len, &tn))
            return tv__seterr(err, TV_E_SNAPSHOT,
                              "snapshot: tensor %u: name ref (%u, %u) outside the string table",
                              t1 - 1, name_off, name_len);
        if (name_len == len && memcmp(tn, name, len) == 0) {
            if (index)
                *index = t1 - 1;
            return 0;
        }
    }
    return tv__seterr(err, TV_E_SNAPSHOT, "snapshot: index probe for '%.*s' met no empty slot",
                      name_shown(len), name);
}
