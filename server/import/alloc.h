/* Extent allocator for objects on a device's data region: first fit over
 * object_align-aligned gaps, free-space accounting, and the registry-backed
 * reservation that picks and records an extent in one IMMEDIATE transaction.
 *
 * Invariants: a returned extent starts on an object_align boundary at or
 * after data_off, has length align_up(len, object_align), ends at or before
 * the region end, and overlaps no used extent; among all such extents it is
 * the lowest (first fit); every addition and alignment is overflow-checked.
 * The pure functions take the used extents as a sorted array and touch
 * neither SQLite nor the device, so they are testable on their own. */
#ifndef TV_IMPORT_ALLOC_H
#define TV_IMPORT_ALLOC_H

#include <stddef.h>
#include <stdint.h>

#include "registry/registry.h"
#include "tensorvault/errors.h"

/* A byte range [off, off + len) on a device. */
typedef struct tv__extent {
    uint64_t off;
    uint64_t len;
} tv__extent;

/* Where objects may go: [data_off, end_off), objects aligned to
 * object_align (any non-zero value; usually a power of two). data_off is
 * rounded up to object_align. */
typedef struct tv__alloc_region {
    uint64_t data_off;
    uint64_t end_off;
    uint64_t object_align;
} tv__alloc_region;

typedef struct tv__alloc_space {
    uint64_t total_len;        /* aligned capacity: aligned [data_off, end_off) */
    uint64_t used_len;         /* sum of used extent lengths */
    uint64_t free_len;         /* sum of usable (aligned) free gaps */
    uint64_t largest_free_len; /* the biggest alloc_len that would fit now */
    size_t n_used;
    size_t n_free; /* usable free gaps (>= object_align) */
} tv__alloc_space;

/* The region of a registered device: data_off .. region_off + region_len.
 * Returns 0, TV_E_OVERFLOW or TV_E_INVALID_ARG (object_align 0). */
int tv__alloc_region_of(const tv__reg_device *d, tv__alloc_region *out, tv_error *err);

/* First fit: the lowest object_align-aligned offset in the region where
 * align_up(len, object_align) bytes overlap no used extent. used[] must be
 * sorted by off, non-overlapping, non-empty and inside the region (extents
 * need not be aligned). On success *out = {offset, align_up(len)}.
 * Returns 0; TV_E_INVALID_ARG (len 0, bad region, used[] unsorted,
 * overlapping, empty or outside the region); TV_E_OVERFLOW (align_up(len)
 * or an extent end overflows); TV_E_NO_SPACE with a message giving the
 * requested and the largest free bytes. */
int tv__alloc_first_fit(const tv__alloc_region *r, const tv__extent *used, size_t n_used,
                        uint64_t len, tv__extent *out, tv_error *err);

/* Free-space accounting for the same inputs. Returns 0, TV_E_INVALID_ARG,
 * TV_E_OVERFLOW. */
int tv__alloc_space_of(const tv__alloc_region *r, const tv__extent *used, size_t n_used,
                       tv__alloc_space *out, tv_error *err);

/* Reserves an extent for canonical_len bytes on a registered device: in one
 * write transaction (a savepoint when the caller has one open) it reads the
 * device and all its objects (writing and committed), runs first fit, and
 * inserts the 'writing' object row, so two writers can never pick the same
 * extent. out receives the new row.
 * Returns 0; TV_E_NOT_FOUND (device); TV_E_NO_SPACE; the errors of
 * tv__alloc_first_fit and of the registry calls. */
int tv__alloc_reserve(tv__reg *reg, int64_t device_id, uint64_t canonical_len, tv__reg_object *out,
                      tv_error *err);

/* Free-space accounting of a registered device (for `devices` output). */
int tv__alloc_device_space(tv__reg *reg, int64_t device_id, tv__alloc_space *out, tv_error *err);

#endif
