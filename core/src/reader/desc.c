/* Tensor metadata and read-argument checks of the read API, for a model of
 * either backend (desc.h). */
#include "reader/desc.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "util/internal.h"

int tv__tdesc_decode(const tv__snap *s, uint32_t i, tv__tdesc *d, tv_error *err)
{
    tv__snap_tensor_info st;
    int rc;
    if ((rc = tv__snap_tensor(s, i, &st, err)))
        return rc;
    *d = (tv__tdesc){.name = st.name,
                     .name_len = st.name_len,
                     .dtype = st.dtype,
                     .rank = st.rank,
                     .shard = st.shard,
                     .begin = st.begin_off,
                     .nbytes = st.nbytes,
                     .n_elements = st.n_elements};
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if ((uintptr_t)st.shape_le % _Alignof(uint64_t) == 0) {
        d->shape = (const uint64_t *)(const void *)st.shape_le;
        return 0;
    }
#endif
    uint64_t *own = calloc(st.rank ? st.rank : 1, sizeof(*own));
    if (!own)
        return tv__seterr(err, -ENOMEM, "out of memory");
    for (uint32_t k = 0; k < st.rank; k++)
        own[k] = tv__snap_dim(&st, k);
    d->owned_shape = own;
    d->shape = own;
    return 0;
}

void tv__tdesc_free(tv__tdesc *d)
{
    if (!d)
        return;
    free(d->owned_shape);
    d->owned_shape = NULL;
}

void tv__tdesc_public(const tv__tdesc *d, tv_tensor_desc *out)
{
    if (!d) {
        *out = (tv_tensor_desc){.name = ""};
        return;
    }
    *out = (tv_tensor_desc){.name = d->name,
                            .name_len = d->name_len,
                            .dtype = d->dtype,
                            .rank = d->rank,
                            .shape = d->shape,
                            .nbytes = d->nbytes,
                            .n_elements = d->n_elements,
                            .shard = d->shard};
}

int tv__tdesc_lookup(const tv__snap *s, const char *model, int64_t gen, const char *name,
                     uint32_t *idx, tv_error *err)
{
    int rc = tv__snap_find(s, name, strlen(name), idx, err);
    if (rc == TV_E_NOT_FOUND)
        return tv__seterr(err, TV_E_NOT_FOUND, "no tensor '%s' in %s@%lld", name, model,
                          (long long)gen);
    return rc;
}

int tv__tdesc_batch_index(const tv__snap *s, const char *model, int64_t gen, const tv_read_req *rq,
                          size_t j, size_t *idx, tv_error *err)
{
    uint32_t i;
    int rc;
    *idx = rq->index;
    if (!rq->name) {
        if (rq->index >= s->n_tensors)
            return tv__seterr(err, TV_E_INVALID_ARG, "request %zu: tensor index %zu out of range",
                              j, rq->index);
        return 0;
    }
    if ((rc = tv__tdesc_lookup(s, model, gen, rq->name, &i, err)) == 0)
        *idx = i;
    return rc;
}

int tv__tdesc_find(const tv__snap *s, const char *name, size_t name_len, size_t *index)
{
    uint32_t i;
    int rc = tv__snap_find(s, name, name_len, &i, NULL);
    if (rc == 0 && index)
        *index = i;
    return rc == 0 ? 0 : TV_E_NOT_FOUND;
}

int tv__tdesc_check_into(const tv__tdesc *d, const char *name, const void *dest, size_t dest_len,
                         tv_error *err)
{
    if ((!dest && d->nbytes) || dest_len < d->nbytes)
        return tv__seterr(err, TV_E_INVALID_ARG,
                          "tensor '%s' needs %llu bytes; destination %p has %zu", name,
                          (unsigned long long)d->nbytes, dest, dest_len);
    return 0;
}

int tv__tdesc_check_batch(const tv__tdesc *d, size_t j, const void *dest, size_t dest_len,
                          tv_error *err)
{
    if ((!dest && d->nbytes) || dest_len < d->nbytes)
        return tv__seterr(err, TV_E_INVALID_ARG,
                          "request %zu (tensor '%.*s'): needs %llu bytes, destination has %zu", j,
                          TV__NAME_PREC(d->name_len), d->name, (unsigned long long)d->nbytes,
                          dest_len);
    return 0;
}

int tv__tdesc_check_range(const tv__tdesc *d, const char *name, uint64_t off, uint64_t len,
                          const void *dest, size_t dest_len, tv_error *err)
{
    uint64_t end;
    if (tv__add_u64(off, len, &end) || end > d->nbytes)
        return tv__seterr(
            err, TV_E_INVALID_ARG, "tensor '%s': bytes [%llu, +%llu) outside its %llu bytes", name,
            (unsigned long long)off, (unsigned long long)len, (unsigned long long)d->nbytes);
    if (len && (!dest || dest_len < len))
        return tv__seterr(err, TV_E_INVALID_ARG,
                          "tensor '%s': %llu bytes at %llu need %llu bytes; destination has %zu",
                          name, (unsigned long long)len, (unsigned long long)off,
                          (unsigned long long)len, dest_len);
    return 0;
}

int tv__tdesc_rows(const tv__tdesc *d, const char *name, uint64_t r0, uint64_t r1, uint64_t *off,
                   uint64_t *len, tv_error *err)
{
    *off = *len = 0;
    if (d->rank == 0)
        return tv__seterr(err, TV_E_INVALID_ARG, "tensor '%s' is a scalar: no rows", name);
    uint64_t rows = d->shape[0];
    if (r0 > r1 || r1 > rows)
        return tv__seterr(err, TV_E_INVALID_ARG, "tensor '%s': rows [%llu, %llu) outside [0, %llu)",
                          name, (unsigned long long)r0, (unsigned long long)r1,
                          (unsigned long long)rows);
    /* Bits per row: elements of one row x dtype bits; rows of a sub-byte
     * dtype are addressable only when they are whole bytes. */
    uint64_t row_elems = 1, row_bits, a, end;
    for (uint32_t k = 1; k < d->rank; k++)
        if (tv__mul_u64(row_elems, d->shape[k], &row_elems))
            return tv__seterr(err, TV_E_OVERFLOW, "tensor '%s': row size overflows", name);
    if (tv__mul_u64(row_elems, tv_dtype_bits(d->dtype), &row_bits))
        return tv__seterr(err, TV_E_OVERFLOW, "tensor '%s': row size overflows", name);
    if (row_bits % 8 && r0 != r1)
        return tv__seterr(err, TV_E_ST_NOT_BYTE_ADDRESSABLE,
                          "tensor '%s': a row of %s is %llu bits, not whole bytes", name,
                          tv_dtype_name(d->dtype), (unsigned long long)row_bits);
    uint64_t row_len = row_bits / 8;
    if (tv__mul_u64(r0, row_len, &a) || tv__mul_u64(r1, row_len, &end))
        return tv__seterr(
            err, TV_E_OVERFLOW, "tensor '%s': rows [%llu, %llu) x %llu bytes a row overflows", name,
            (unsigned long long)r0, (unsigned long long)r1, (unsigned long long)row_len);
    if (end > d->nbytes)
        return tv__seterr(err, TV_E_SNAPSHOT,
                          "tensor '%s': rows end at byte %llu, past its %llu bytes", name,
                          (unsigned long long)end, (unsigned long long)d->nbytes);
    *off = a;
    *len = end - a;
    return 0;
}

int tv__tdesc_check_rows_dest(const char *name, uint64_t r0, uint64_t r1, uint64_t len,
                              const void *dest, size_t dest_len, tv_error *err)
{
    if (!dest || dest_len < len)
        return tv__seterr(err, TV_E_INVALID_ARG,
                          "tensor '%s' rows [%llu, %llu) need %llu bytes; destination has %zu",
                          name, (unsigned long long)r0, (unsigned long long)r1,
                          (unsigned long long)len, dest_len);
    return 0;
}

int tv__tdesc_check_f32(const tv__tdesc *d, const char *name, const void *dest, size_t dest_len,
                        tv_error *err)
{
    float probe = 0;
    uint64_t need;
    if (tv_convert_f32(d->dtype, &probe, 0, &probe) != 0)
        return tv__seterr(err, TV_E_NOT_SUPPORTED, "tensor '%s': no float32 conversion from %s",
                          name, tv_dtype_name(d->dtype));
    if (tv__mul_u64(d->n_elements, 4, &need))
        return tv__seterr(err, TV_E_OVERFLOW, "tensor '%s': %llu elements as float32 overflow",
                          name, (unsigned long long)d->n_elements);
    if (!dest || dest_len < need)
        return tv__seterr(err, TV_E_INVALID_ARG,
                          "tensor '%s' as float32 needs %llu bytes; destination has %zu", name,
                          (unsigned long long)need, dest_len);
    return 0;
}

int tv__shard_public(const tv__snap *s, size_t i, tv_shard_desc *out)
{
    tv__snap_shard_info sh;
    if (!out)
        return TV_E_INVALID_ARG;
    *out = (tv_shard_desc){.name = ""};
    if (!s || i >= s->n_shards || tv__snap_shard(s, (uint32_t)i, &sh, NULL))
        return TV_E_INVALID_ARG;
    *out = (tv_shard_desc){.name = sh.name,
                           .name_len = sh.name_len,
                           .file_len = sh.file_len,
                           .header_len = sh.header_len};
    return 0;
}

int tv__shard_check_header(const tv__snap *s, const char *model, int64_t gen, size_t shard,
                           const void *dest, size_t dest_len, uint64_t *len, tv_error *err)
{
    tv__snap_shard_info sh;
    int rc;
    *len = 0;
    if (shard >= s->n_shards)
        return tv__seterr(err, TV_E_INVALID_ARG, "%s@%lld: shard %zu out of range (%u shards)",
                          model, (long long)gen, shard, s->n_shards);
    if ((rc = tv__snap_shard(s, (uint32_t)shard, &sh, err)))
        return rc;
    if (!dest || dest_len < sh.data_off)
        return tv__seterr(
            err, TV_E_INVALID_ARG,
            "%s@%lld: shard %zu (%.*s): its header needs %llu bytes; destination %p has %zu", model,
            (long long)gen, shard, TV__NAME_PREC(sh.name_len), sh.name,
            (unsigned long long)sh.data_off, dest, dest_len);
    *len = sh.data_off;
    return 0;
}

/* The one layout of a tv_tensor: tv_tensor_free frees arena, then this. */
struct tv_tensor_impl {
    tv_tensor pub;
    void *arena;
    uint64_t shape[TV_ST_MAX_RANK];
};

int tv__tensor_new(uint64_t arena_len, size_t align, tv_tensor **out, void **arena, tv_error *err)
{
    *out = NULL;
    *arena = NULL;
    if (arena_len > SIZE_MAX)
        return tv__seterr(err, -ENOMEM, "out of memory for a %llu-byte tensor",
                          (unsigned long long)arena_len);
    struct tv_tensor_impl *t = calloc(1, sizeof(*t));
    if (!t)
        return tv__seterr(err, -ENOMEM, "out of memory");
    if (posix_memalign(&t->arena, align, (size_t)arena_len)) {
        free(t);
        return tv__seterr(err, -ENOMEM, "out of memory for a %llu-byte tensor",
                          (unsigned long long)arena_len);
    }
    *out = &t->pub;
    *arena = t->arena;
    return 0;
}

void tv__tensor_set(tv_tensor *pub, uint64_t skip, const tv__tdesc *d)
{
    struct tv_tensor_impl *t = (struct tv_tensor_impl *)pub;
    memcpy(t->shape, d->shape, sizeof(uint64_t) * d->rank);
    t->pub.data = (const uint8_t *)t->arena + skip;
    t->pub.nbytes = d->nbytes;
    t->pub.dtype = d->dtype;
    t->pub.rank = d->rank;
    t->pub.shape = t->shape;
}

TV_API void tv_tensor_free(tv_tensor *pub)
{
    if (!pub)
        return;
    struct tv_tensor_impl *t = (struct tv_tensor_impl *)pub;
    free(t->arena);
    free(t);
}
