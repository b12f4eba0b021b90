/* What the dump tools (tv_dump.c: the in-process reader, fp_dump.c: the
 * fast-path client) share: guarded destinations, the guard check, writing
 * OUTDIR/<index>.bin, a tensor's shape as JSON and the get-mode comparison
 * of a tv_tensor with its descriptor. Header-only: each tool source is its
 * own executable.
 *
 * A guarded destination of len bytes sits at an odd offset (deliberately
 * unaligned) between `guard` bytes of 0xA5 before and after it. */
#ifndef TV_TESTS_TOOLS_DUMP_COMMON_H
#define TV_TESTS_TOOLS_DUMP_COMMON_H

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "tensorvault/tensorvault.h"

#define DUMP_GUARD_BYTE 0xA5

/* A buffer of guard + 1 + len + guard bytes of 0xA5 (NULL when out of
 * memory); the destination is dump_dest(buf, guard). */
static inline uint8_t *dump_guarded_alloc(size_t len, size_t guard)
{
    uint8_t *b = malloc(len + 2 * guard + 1);
    if (b)
        memset(b, DUMP_GUARD_BYTE, len + 2 * guard + 1);
    return b;
}

static inline uint8_t *dump_dest(uint8_t *buf, size_t guard)
{
    return buf + guard + 1;
}

static inline int dump_check_side(const char *prog, const uint8_t *p, size_t n, const char *name,
                                  const char *side)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != DUMP_GUARD_BYTE) {
            fprintf(stderr, "%s: guard byte %zu %s tensor '%s' changed to 0x%02x\n", prog, i, side,
                    name, p[i]);
            return 1;
        }
    return 0;
}

/* 1 (and a message naming the tensor) when a guard byte of buf changed. */
static inline int dump_check_guards(const char *prog, uint8_t *buf, size_t len, size_t guard,
                                    const char *name)
{
    return dump_check_side(prog, buf, guard + 1, name, "before") ||
           dump_check_side(prog, dump_dest(buf, guard) + len, guard, name, "after");
}

/* Writes [p, p + len) to OUTDIR/<i>.bin, its path into path. 0 or 1 (a
 * message said why). */
static inline int dump_write(const char *prog, const char *outdir, size_t i, const void *p,
                             size_t len, char *path, size_t path_len)
{
    snprintf(path, path_len, "%s/%zu.bin", outdir, i);
    FILE *f = fopen(path, "wb");
    bool ok = f && fwrite(p, 1, len, f) == len;
    if (f && fclose(f))
        ok = false;
    if (!ok)
        fprintf(stderr, "%s: write %s failed\n", prog, path);
    return ok ? 0 : 1;
}

/* The shape of d as a JSON array (a new reference). */
static inline json_t *dump_shape_json(const tv_tensor_desc *d)
{
    json_t *shape = json_array();
    for (uint32_t k = 0; k < d->rank; k++)
        json_array_append_new(shape, json_integer((json_int_t)d->shape[k]));
    return shape;
}

/* get mode: rc and t are what tv_get_tensor (tv_client_get_tensor) gave;
 * t must describe d (bytes, dtype, rank, shape), then its bytes are copied
 * to dst; t is freed. Returns rc, TV_E_INTERNAL or 0. */
static inline int dump_take_tensor(int rc, tv_tensor *t, const tv_tensor_desc *d, void *dst,
                                   size_t len)
{
    if (rc)
        return rc;
    if (t->nbytes != d->nbytes || t->dtype != d->dtype || t->rank != d->rank ||
        memcmp(t->shape, d->shape, sizeof(uint64_t) * d->rank))
        rc = TV_E_INTERNAL;
    else
        memcpy(dst, t->data, len);
    tv_tensor_free(t);
    return rc;
}

/* 1 (and a message naming tensor d) when its read in this mode failed
 * (rc, err) or changed a guard byte of buf. */
static inline int dump_failed(const char *prog, const char *mode, const tv_tensor_desc *d, int rc,
                              const tv_error *err, uint8_t *buf, size_t len, size_t guard)
{
    if (rc) {
        fprintf(stderr, "%s: %s '%s': %s: %s\n", prog, mode, d->name, tv_err_name(rc), err->msg);
        return 1;
    }
    return dump_check_guards(prog, buf, len, guard, d->name);
}

#endif
