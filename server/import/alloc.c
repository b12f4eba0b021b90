/* Extent allocator: first fit over the aligned gaps between a device's
 * objects, free-space accounting, and the atomic registry reservation.
 *
 * Invariants: gaps are walked from the aligned data_off upwards; a gap's
 * usable length is align_down(gap_end - aligned_start, object_align), so an
 * extent that fits is aligned at both ends and never crosses a used extent
 * or the region end; an aligned cursor that would pass UINT64_MAX saturates
 * (nothing can be placed after it) instead of wrapping. */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "import/alloc.h"
#include "util/internal.h"

/* Checks the region and the used extents; on success the extents are
 * sorted, non-empty, non-overlapping, inside [data_off, end_off), and their
 * ends do not overflow. */
static int validate(const tv__alloc_region *r, const tv__extent *used, size_t n_used, tv_error *err)
{
    if (!r || (!used && n_used))
        return tv__seterr(err, TV_E_INVALID_ARG, "allocator: NULL argument");
    if (r->object_align == 0)
        return tv__seterr(err, TV_E_INVALID_ARG, "allocator: object_align is 0");
    if (r->end_off < r->data_off)
        return tv__seterr(err, TV_E_INVALID_ARG, "allocator: region end %llu before data_off %llu",
                          (unsigned long long)r->end_off, (unsigned long long)r->data_off);
    uint64_t prev_end = r->data_off;
    for (size_t i = 0; i < n_used; i++) {
        uint64_t end;
        if (used[i].len == 0)
            return tv__seterr(err, TV_E_INVALID_ARG, "allocator: used extent %zu at %llu is empty",
                              i, (unsigned long long)used[i].off);
        if (tv__add_u64(used[i].off, used[i].len, &end))
            return tv__seterr(err, TV_E_OVERFLOW,
                              "allocator: used extent %zu at %llu + %llu overflows", i,
                              (unsigned long long)used[i].off, (unsigned long long)used[i].len);
        if (used[i].off < prev_end)
            return tv__seterr(
                err, TV_E_INVALID_ARG,
                "allocator: used extent %zu at %llu is unsorted, overlaps the previous one or precedes data_off %llu",
                i, (unsigned long long)used[i].off, (unsigned long long)r->data_off);
        if (end > r->end_off)
            return tv__seterr(err, TV_E_INVALID_ARG,
                              "allocator: used extent %zu [%llu, %llu) passes the region end %llu",
                              i, (unsigned long long)used[i].off, (unsigned long long)end,
                              (unsigned long long)r->end_off);
        prev_end = end;
    }
    return 0;
}

/* Walks the usable free gaps in ascending order. Call validate first. */
typedef struct gap_iter {
    const tv__alloc_region *r;
    const tv__extent *used;
    size_t n_used;
    size_t i;        /* next used extent; n_used = the final gap to end_off */
    uint64_t cursor; /* aligned start of the current gap (saturates at UINT64_MAX) */
    bool done;
} gap_iter;

static uint64_t align_up_sat(uint64_t v, uint64_t align)
{
    uint64_t r;
    return tv__align_up_u64(v, align, &r) ? UINT64_MAX : r;
}

static void gap_init(gap_iter *it, const tv__alloc_region *r, const tv__extent *used, size_t n_used)
{
    memset(it, 0, sizeof *it);
    it->r = r;
    it->used = used;
    it->n_used = n_used;
    it->cursor = align_up_sat(r->data_off, r->object_align);
}

/* Next gap with at least object_align usable bytes: *off is aligned, *len a
 * multiple of object_align. Returns false when there are no more. */
static bool gap_next(gap_iter *it, uint64_t *off, uint64_t *len)
{
    const uint64_t align = it->r->object_align;
    while (!it->done) {
        uint64_t start = it->cursor, gap_end;
        if (it->i == it->n_used) {
            gap_end = it->r->end_off;
            it->done = true;
        } else {
            const tv__extent *e = &it->used[it->i++];
            gap_end = e->off;
            uint64_t next = align_up_sat(e->off + e->len, align); /* validated: no overflow */
            if (next > it->cursor)
                it->cursor = next;
        }
        if (gap_end > start) {
            uint64_t usable = tv__align_down_u64(gap_end - start, align);
            if (usable) {
                *off = start;
                *len = usable;
                return true;
            }
        }
    }
    return false;
}

int tv__alloc_region_of(const tv__reg_device *d, tv__alloc_region *out, tv_error *err)
{
    if (!d || !out)
        return tv__seterr(err, TV_E_INVALID_ARG, "allocator: NULL argument");
    if (d->object_align == 0)
        return tv__seterr(err, TV_E_INVALID_ARG, "device %s: object_align is 0", d->uuid);
    uint64_t end;
    if (tv__add_u64(d->region_off, d->region_len, &end))
        return tv__seterr(err, TV_E_OVERFLOW, "device %s: region_off + region_len overflows",
                          d->uuid);
    out->data_off = d->data_off;
    out->end_off = end;
    out->object_align = d->object_align;
    return 0;
}

int tv__alloc_first_fit(const tv__alloc_region *r, const tv__extent *used, size_t n_used,
                        uint64_t len, tv__extent *out, tv_error *err)
{
    int rc = validate(r, used, n_used, err);
    if (rc)
        return rc;
    if (!out)
        return tv__seterr(err, TV_E_INVALID_ARG, "allocator: NULL out");
    if (len == 0)
        return tv__seterr(err, TV_E_INVALID_ARG, "allocator: cannot allocate 0 bytes");
    uint64_t need;
    if (tv__align_up_u64(len, r->object_align, &need))
        return tv__seterr(err, TV_E_OVERFLOW,
                          "allocator: %llu bytes rounded up to object_align %llu overflows",
                          (unsigned long long)len, (unsigned long long)r->object_align);
    gap_iter it;
    uint64_t off, gap_len, largest = 0;
    gap_init(&it, r, used, n_used);
    while (gap_next(&it, &off, &gap_len)) {
        if (gap_len >= need) {
            out->off = off;
            out->len = need;
            return 0;
        }
        if (gap_len > largest)
            largest = gap_len;
    }
    return tv__seterr(
        err, TV_E_NO_SPACE,
        "no free extent for %llu bytes (%llu with object_align %llu padding); the largest free extent is %llu bytes",
        (unsigned long long)len, (unsigned long long)need, (unsigned long long)r->object_align,
        (unsigned long long)largest);
}

int tv__alloc_space_of(const tv__alloc_region *r, const tv__extent *used, size_t n_used,
                       tv__alloc_space *out, tv_error *err)
{
    int rc = validate(r, used, n_used, err);
    if (rc)
        return rc;
    if (!out)
        return tv__seterr(err, TV_E_INVALID_ARG, "allocator: NULL out");
    memset(out, 0, sizeof *out);
    uint64_t start = align_up_sat(r->data_off, r->object_align);
    if (r->end_off > start)
        out->total_len = tv__align_down_u64(r->end_off - start, r->object_align);
    for (size_t i = 0; i < n_used; i++)
        out->used_len += used[i].len; /* disjoint ranges below 2^64: no overflow */
    out->n_used = n_used;
    gap_iter it;
    uint64_t off, gap_len;
    gap_init(&it, r, used, n_used);
    while (gap_next(&it, &off, &gap_len)) {
        out->free_len += gap_len;
        out->n_free++;
        if (gap_len > out->largest_free_len)
            out->largest_free_len = gap_len;
    }
    return 0;
}

/* Loads a device's region and its used extents (all objects, by base_off).
 * Stored extents that break the region or overlap are TV_E_REGISTRY (a
 * corrupt registry), checked here before validate() could call them an
 * invalid argument. */
static int load_device(tv__reg *reg, int64_t device_id, tv__reg_device *dev,
                       tv__alloc_region *region, tv__extent **extents, size_t *n, tv_error *err)
{
    tv__reg_object *objs = NULL;
    size_t n_objs = 0;
    int rc;
    *extents = NULL;
    *n = 0;
    if ((rc = tv__reg_device_get(reg, device_id, dev, err)) ||
        (rc = tv__alloc_region_of(dev, region, err)) ||
        (rc = tv__reg_objects_on_device(reg, device_id, &objs, &n_objs, err)))
        return rc;
    if ((rc = tv__reg_device_extents_check(dev, objs, n_objs, err))) {
        free(objs);
        return rc;
    }
    if (n_objs) {
        *extents = calloc(n_objs, sizeof **extents);
        if (!*extents) {
            free(objs);
            return tv__seterr(err, -ENOMEM, "allocator: out of memory for %zu extents", n_objs);
        }
        for (size_t i = 0; i < n_objs; i++) {
            (*extents)[i].off = objs[i].base_off;
            (*extents)[i].len = objs[i].alloc_len;
        }
    }
    *n = n_objs;
    free(objs);
    return 0;
}

int tv__alloc_reserve(tv__reg *reg, int64_t device_id, uint64_t canonical_len, tv__reg_object *out,
                      tv_error *err)
{
    if (!reg || !out)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__alloc_reserve: NULL argument");
    if (canonical_len == 0)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__alloc_reserve: cannot reserve 0 bytes");
    tv__reg_device dev;
    tv__alloc_region region;
    tv__extent *used = NULL, got;
    size_t n_used = 0;
    int64_t id = 0;
    tv_error inner = {0};
    /* The write lock is taken before reading the extents, so the picked
     * extent is still free when the row goes in. */
    int rc = tv__reg_begin(reg, err);
    if (rc)
        return rc;
    if ((rc = load_device(reg, device_id, &dev, &region, &used, &n_used, err)))
        goto fail;
    if ((rc = tv__alloc_first_fit(&region, used, n_used, canonical_len, &got, &inner))) {
        tv__seterr(err, rc, "device %s (%s): %s", dev.uuid, dev.path, inner.msg);
        goto fail;
    }
    if ((rc = tv__reg_object_insert_writing(reg, device_id, got.off, got.len, canonical_len, &id,
                                            err)) ||
        (rc = tv__reg_object_get(reg, id, out, err)))
        goto fail;
    free(used);
    return tv__reg_commit(reg, err);

fail:
    free(used);
    tv__reg_rollback(reg);
    return rc;
}

int tv__alloc_device_space(tv__reg *reg, int64_t device_id, tv__alloc_space *out, tv_error *err)
{
    if (!reg || !out)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__alloc_device_space: NULL argument");
    tv__reg_device dev;
    tv__alloc_region region;
    tv__extent *used = NULL;
    size_t n_used = 0;
    int rc = load_device(reg, device_id, &dev, &region, &used, &n_used, err);
    if (rc == 0)
        rc = tv__alloc_space_of(&region, used, n_used, out, err);
    free(used);
    return rc;
}
