/* The store label: 512 bytes at the first aligned block of a device region
 * that bind the region to one store and record the geometry and identity of
 * the device it was written on.
 *
 * Invariants: the layout is tv__label's field map (offsets asserted below);
 * integers are little-endian and strings zero-padded on disk whatever the
 * host; the SHA-256 covers bytes [0, 480); the label block is io_align bytes,
 * zero after the label, at region_off > 0; region arithmetic is checked.
 * Any disagreement between a label, the registry and the device as opened
 * now is TV_E_DEVICE_MISMATCH naming the field and both values. */
#include <errno.h>
#include <inttypes.h>
#include <openssl/evp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "dev/dev.h"
#include "util/endian.h"
#include "util/hex.h"

#define LABEL_SUM_OFF 480u

_Static_assert(sizeof(tv__label) == TV__LABEL_LEN, "label size");
_Static_assert(offsetof(tv__label, magic) == 0, "label magic");
_Static_assert(offsetof(tv__label, version) == 8, "label version");
_Static_assert(offsetof(tv__label, label_len) == 12, "label label_len");
_Static_assert(offsetof(tv__label, store_uuid) == 16, "label store_uuid");
_Static_assert(offsetof(tv__label, lba_size) == 32, "label lba_size");
_Static_assert(offsetof(tv__label, io_align) == 36, "label io_align");
_Static_assert(offsetof(tv__label, region_off) == 40, "label region_off");
_Static_assert(offsetof(tv__label, region_len) == 48, "label region_len");
_Static_assert(offsetof(tv__label, object_align) == 56, "label object_align");
_Static_assert(offsetof(tv__label, size_bytes) == 64, "label size_bytes");
_Static_assert(offsetof(tv__label, dev_kind) == 72, "label dev_kind");
_Static_assert(offsetof(tv__label, serial) == 76, "label serial");
_Static_assert(offsetof(tv__label, model) == 96, "label model");
_Static_assert(offsetof(tv__label, nsid) == 136, "label nsid");
_Static_assert(offsetof(tv__label, nguid) == 140, "label nguid");
_Static_assert(offsetof(tv__label, eui64) == 156, "label eui64");
_Static_assert(offsetof(tv__label, reserved) == 164, "label reserved");
_Static_assert(offsetof(tv__label, sha256) == LABEL_SUM_OFF, "label sha256");
_Static_assert(sizeof(((tv__label *)0)->serial) == 20, "label serial width");
_Static_assert(sizeof(((tv__label *)0)->model) == 40, "label model width");

#define PUT32(buf, field, v) tv__le32_put((buf) + offsetof(tv__label, field), (v))
#define PUT64(buf, field, v) tv__le64_put((buf) + offsetof(tv__label, field), (v))
#define GET32(buf, field)    tv__le32_get((buf) + offsetof(tv__label, field))
#define GET64(buf, field)    tv__le64_get((buf) + offsetof(tv__label, field))
#define PUTB(buf, l, field)  memcpy((buf) + offsetof(tv__label, field), (l)->field, sizeof(l)->field)
#define GETB(buf, l, field)  memcpy((l)->field, (buf) + offsetof(tv__label, field), sizeof(l)->field)

static void label_sum(const uint8_t *buf, uint8_t out[32])
{
    unsigned int n = 32;
    if (EVP_Digest(buf, LABEL_SUM_OFF, out, &n, EVP_sha256(), NULL) != 1)
        memset(out, 0, 32); /* cannot match a real digest of a valid label */
}

/* The 8-4-4-4-12 groups of a uuid's text form, in bytes. */
static const uint8_t uuid_groups[5] = {4, 2, 2, 2, 6};

void tv__uuid_format(const uint8_t uuid[16], char out[37])
{
    size_t i = 0, o = 0;
    for (size_t g = 0; g < 5; g++) {
        if (g)
            out[o++] = '-';
        tv__hex_encode(uuid + i, uuid_groups[g], false, out + o);
        i += uuid_groups[g];
        o += 2u * uuid_groups[g];
    }
}

int tv__uuid_parse(const char *text, uint8_t uuid[16])
{
    uint8_t u[16];
    size_t i = 0, o = 0;
    if (!text || strlen(text) != 36)
        return -EINVAL;
    for (size_t g = 0; g < 5; g++) {
        if (g && text[o++] != '-')
            return -EINVAL;
        if (tv__hex_decode(text + o, 2u * uuid_groups[g], u + i, uuid_groups[g]))
            return -EINVAL;
        i += uuid_groups[g];
        o += 2u * uuid_groups[g];
    }
    memcpy(uuid, u, sizeof u);
    return 0;
}

int tv__uuid_random(uint8_t uuid[16], tv_error *err)
{
    size_t got = 0;

    while (got < 16) {
        ssize_t n = getrandom(uuid + got, 16 - got, 0);
        if (n < 0) {
            int rc = -errno;
            if (rc == -EINTR)
                continue;
            return tv__seterr(err, rc, "getrandom: %s", strerror(-rc));
        }
        got += (size_t)n;
    }
    uuid[6] = (uint8_t)((uuid[6] & 0x0f) | 0x40); /* version 4 */
    uuid[8] = (uint8_t)((uuid[8] & 0x3f) | 0x80); /* RFC 4122 variant */
    return 0;
}

/* Stores a string in a fixed-width label field: zero-padded, not
 * NUL-terminated when it fills the field. */
static void put_field(char *field, size_t width, const char *s)
{
    size_t n = strnlen(s, width);
    memset(field, 0, width);
    memcpy(field, s, n);
}

/* First data byte of a region: after the io_align-sized label block, rounded
 * up to object_align. Returns true on overflow. */
static bool data_off(uint64_t region_off, uint64_t io_align, uint64_t object_align, uint64_t *out)
{
    uint64_t after;
    return tv__add_u64(region_off, io_align, &after) || tv__align_up_u64(after, object_align, out);
}

uint64_t tv__region_data_off(const tv__label *l)
{
    uint64_t off;
    if (!l || l->io_align == 0 || l->object_align == 0 ||
        data_off(l->region_off, l->io_align, l->object_align, &off))
        return 0;
    return off;
}

int tv__region_validate(const tv__dev *d, uint64_t region_off, uint64_t region_len, tv_error *err)
{
    uint64_t end, first, need;

    if (!d)
        return tv__seterr(err, TV_E_INVALID_ARG, "region: NULL device");
    if (region_off == 0)
        return tv__seterr(err, TV_E_INVALID_ARG,
                          "region of %s starts at offset 0: LBA 0 is never used", d->path);
    if (region_off % d->io_align)
        return tv__seterr(err, TV_E_INVALID_ARG,
                          "region offset %" PRIu64 " of %s is not a multiple of io_align %u",
                          region_off, d->path, d->io_align);
    if (tv__add_u64(region_off, region_len, &end))
        return tv__seterr(err, TV_E_OVERFLOW, "region %" PRIu64 " + %" PRIu64 " overflows",
                          region_off, region_len);
    if (end > d->size_bytes)
        return tv__seterr(err, TV_E_INVALID_ARG,
                          "region [%" PRIu64 ", %" PRIu64 ") reaches past the end of %s (%" PRIu64
                          " bytes)",
                          region_off, end, d->path, d->size_bytes);
    if (data_off(region_off, d->io_align, d->object_align, &first) ||
        tv__add_u64(first, d->object_align, &need))
        return tv__seterr(err, TV_E_OVERFLOW, "region at %" PRIu64 " of %s: data offset overflows",
                          region_off, d->path);
    if (need > end)
        return tv__seterr(err, TV_E_INVALID_ARG,
                          "region [%" PRIu64 ", %" PRIu64
                          ") of %s is too small: the label and one %" PRIu64
                          "-byte object need it to reach %" PRIu64,
                          region_off, end, d->path, d->object_align, need);
    return 0;
}

void tv__label_expected(const tv__dev_record *rec, tv__label *out)
{
    memset(out, 0, sizeof *out);
    memcpy(out->magic, TV__LABEL_MAGIC, sizeof out->magic);
    out->version = TV__LABEL_VERSION;
    out->label_len = TV__LABEL_LEN;
    memcpy(out->store_uuid, rec->store_uuid, sizeof out->store_uuid);
    out->lba_size = rec->lba_size;
    out->io_align = rec->io_align;
    out->region_off = rec->region_off;
    out->region_len = rec->region_len;
    out->object_align = rec->object_align;
    out->size_bytes = rec->size_bytes;
    out->dev_kind = rec->kind;
    memcpy(out->serial, rec->serial, sizeof out->serial);
    memcpy(out->model, rec->model, sizeof out->model);
    out->nsid = rec->nsid;
    memcpy(out->nguid, rec->nguid, sizeof out->nguid);
    memcpy(out->eui64, rec->eui64, sizeof out->eui64);
}

int tv__label_init(tv__label *l, const tv__dev *d, const uint8_t uuid[16], uint64_t region_off,
                   uint64_t region_len, tv_error *err)
{
    int rc;

    if (!l || !d || !uuid)
        return tv__seterr(err, TV_E_INVALID_ARG, "label init: NULL argument");
    rc = tv__region_validate(d, region_off, region_len, err);
    if (rc)
        return rc;
    memset(l, 0, sizeof *l);
    memcpy(l->magic, TV__LABEL_MAGIC, sizeof l->magic);
    l->version = TV__LABEL_VERSION;
    l->label_len = TV__LABEL_LEN;
    memcpy(l->store_uuid, uuid, sizeof l->store_uuid);
    l->lba_size = d->lba_size;
    l->io_align = d->io_align;
    l->region_off = region_off;
    l->region_len = region_len;
    l->object_align = d->object_align;
    l->size_bytes = d->size_bytes;
    l->dev_kind = (uint32_t)d->kind;
    if (d->kind == TV__DEV_NVME) {
        put_field(l->serial, sizeof l->serial, d->ident.serial);
        put_field(l->model, sizeof l->model, d->ident.model);
        l->nsid = d->ident.nsid;
        memcpy(l->nguid, d->ident.nguid, sizeof l->nguid);
        memcpy(l->eui64, d->ident.eui64, sizeof l->eui64);
    }
    return 0;
}

void tv__label_encode(const tv__label *l, uint8_t out[TV__LABEL_LEN])
{
    memset(out, 0, TV__LABEL_LEN);
    memcpy(out, TV__LABEL_MAGIC, 8);
    PUT32(out, version, l->version);
    PUT32(out, label_len, l->label_len);
    PUTB(out, l, store_uuid);
    PUT32(out, lba_size, l->lba_size);
    PUT32(out, io_align, l->io_align);
    PUT64(out, region_off, l->region_off);
    PUT64(out, region_len, l->region_len);
    PUT64(out, object_align, l->object_align);
    PUT64(out, size_bytes, l->size_bytes);
    PUT32(out, dev_kind, l->dev_kind);
    PUTB(out, l, serial);
    PUTB(out, l, model);
    PUT32(out, nsid, l->nsid);
    PUTB(out, l, nguid);
    PUTB(out, l, eui64);
    PUTB(out, l, reserved);
    label_sum(out, out + LABEL_SUM_OFF);
}

int tv__label_decode(const uint8_t in[TV__LABEL_LEN], tv__label *out, tv_error *err)
{
    tv__label l;
    uint8_t sum[32];

    if (!in || !out)
        return tv__seterr(err, TV_E_INVALID_ARG, "label decode: NULL argument");
    if (memcmp(in, TV__LABEL_MAGIC, 8) != 0)
        return tv__seterr(err, TV_E_DEVICE_MISMATCH, "no store label: bad magic (expected \"%s\")",
                          TV__LABEL_MAGIC);
    memset(&l, 0, sizeof l);
    memcpy(l.magic, in, 8);
    l.version = GET32(in, version);
    l.label_len = GET32(in, label_len);
    if (l.version != TV__LABEL_VERSION)
        return tv__seterr(err, TV_E_DEVICE_MISMATCH,
                          "store label: unsupported format version %u (this build reads %u)",
                          l.version, TV__LABEL_VERSION);
    if (l.label_len != TV__LABEL_LEN)
        return tv__seterr(err, TV_E_DEVICE_MISMATCH, "store label: label_len %u, expected %u",
                          l.label_len, TV__LABEL_LEN);
    label_sum(in, sum);
    if (memcmp(sum, in + LABEL_SUM_OFF, sizeof sum) != 0)
        return tv__seterr(err, TV_E_DEVICE_MISMATCH,
                          "store label: bad checksum (label corrupted or torn)");
    GETB(in, &l, store_uuid);
    l.lba_size = GET32(in, lba_size);
    l.io_align = GET32(in, io_align);
    l.region_off = GET64(in, region_off);
    l.region_len = GET64(in, region_len);
    l.object_align = GET64(in, object_align);
    l.size_bytes = GET64(in, size_bytes);
    l.dev_kind = GET32(in, dev_kind);
    GETB(in, &l, serial);
    GETB(in, &l, model);
    l.nsid = GET32(in, nsid);
    GETB(in, &l, nguid);
    GETB(in, &l, eui64);
    GETB(in, &l, reserved);
    GETB(in, &l, sha256);
    *out = l;
    return 0;
}

int tv__label_write(tv__dev *d, const tv__label *l, tv_error *err)
{
    uint8_t *block;
    int rc;

    if (!d || !l)
        return tv__seterr(err, TV_E_INVALID_ARG, "label write: NULL argument");
    rc = tv__region_validate(d, l->region_off, l->region_len, err);
    if (rc)
        return rc;
    block = tv__dev_alloc_aligned(d, d->io_align);
    if (!block)
        return tv__seterr(err, -ENOMEM, "label write %s: out of memory", d->path);
    tv__label_encode(l, block);
    rc = tv__dev_pwrite_full(d, block, d->io_align, l->region_off, err);
    if (rc)
        goto out;
    rc = tv__dev_flush(d, err);
out:
    free(block);
    return rc;
}

int tv__label_read(tv__dev *d, uint64_t region_off, tv__label *out, tv_error *err)
{
    uint8_t *block;
    uint64_t end;
    int rc;

    if (!d || !out)
        return tv__seterr(err, TV_E_INVALID_ARG, "label read: NULL argument");
    if (region_off == 0 || region_off % d->io_align || tv__add_u64(region_off, d->io_align, &end) ||
        end > d->size_bytes)
        return tv__seterr(err, TV_E_INVALID_ARG,
                          "label read %s: region offset %" PRIu64
                          " is 0, not a multiple of %u or past the end (%" PRIu64 " bytes)",
                          d->path, region_off, d->io_align, d->size_bytes);
    block = tv__dev_alloc_aligned(d, d->io_align);
    if (!block)
        return tv__seterr(err, -ENOMEM, "label read %s: out of memory", d->path);
    rc = tv__dev_pread_full(d, block, d->io_align, region_off, err);
    if (rc)
        goto out;
    rc = tv__label_decode(block, out, err);
    if (rc) {
        /* Prefix the device and offset to the decoder's reason. */
        if (err) {
            char reason[sizeof err->msg];
            snprintf(reason, sizeof reason, "%s", err->msg);
            tv__seterr(err, rc, "%s at offset %" PRIu64 ": %s", d->path, region_off, reason);
        }
        goto out;
    }
    if (out->region_off != region_off)
        rc = tv__seterr(err, TV_E_DEVICE_MISMATCH,
                        "%s: label at offset %" PRIu64 " records region offset %" PRIu64, d->path,
                        region_off, out->region_off);
out:
    free(block);
    return rc;
}

/* Field comparisons for tv__label_check; each returns non-zero after
 * filling err. `who` says what the label is compared with. */
static int cmp_u64(tv_error *err, const char *path, const char *field, const char *who,
                   uint64_t have, uint64_t want)
{
    if (have == want)
        return 0;
    return tv__seterr(err, TV_E_DEVICE_MISMATCH,
                      "device %s: %s: label has %" PRIu64 ", %s %" PRIu64, path, field, have, who,
                      want);
}

static int cmp_str(tv_error *err, const char *path, const char *field, const char *who,
                   const char *have, const char *want, size_t width)
{
    if (strncmp(have, want, width) == 0)
        return 0;
    return tv__seterr(err, TV_E_DEVICE_MISMATCH, "device %s: %s: label has \"%.*s\", %s \"%.*s\"",
                      path, field, (int)width, have, who, (int)width, want);
}

static int cmp_bytes(tv_error *err, const char *path, const char *field, const char *who,
                     const uint8_t *have, const uint8_t *want, size_t n)
{
    char h[33], w[33];
    if (memcmp(have, want, n) == 0)
        return 0;
    tv__hex_encode(have, n, false, h);
    tv__hex_encode(want, n, false, w);
    return tv__seterr(err, TV_E_DEVICE_MISMATCH, "device %s: %s: label has %s, %s %s", path, field,
                      h, who, w);
}

static int cmp_kind(tv_error *err, const char *path, const char *who, uint32_t have, uint32_t want)
{
    if (have == want)
        return 0;
    return tv__seterr(err, TV_E_DEVICE_MISMATCH, "device %s: kind: label has %s, %s %s", path,
                      tv__dev_kind_name((int)have), who, tv__dev_kind_name((int)want));
}

static int check_expected(const tv__label *l, const tv__label *e, const char *p, tv_error *err)
{
    const char *w = "expected";

    if (memcmp(l->store_uuid, e->store_uuid, 16) != 0) {
        char h[37], x[37];
        tv__uuid_format(l->store_uuid, h);
        tv__uuid_format(e->store_uuid, x);
        return tv__seterr(err, TV_E_DEVICE_MISMATCH,
                          "device %s: store uuid: label has %s, expected %s", p, h, x);
    }
    return cmp_u64(err, p, "lba size", w, l->lba_size, e->lba_size) ||
                   cmp_u64(err, p, "io_align", w, l->io_align, e->io_align) ||
                   cmp_u64(err, p, "object_align", w, l->object_align, e->object_align) ||
                   cmp_u64(err, p, "region offset", w, l->region_off, e->region_off) ||
                   cmp_u64(err, p, "region length", w, l->region_len, e->region_len) ||
                   cmp_u64(err, p, "device size", w, l->size_bytes, e->size_bytes) ||
                   cmp_kind(err, p, w, l->dev_kind, e->dev_kind) ||
                   cmp_str(err, p, "nvme serial", w, l->serial, e->serial, sizeof l->serial) ||
                   cmp_str(err, p, "nvme model", w, l->model, e->model, sizeof l->model) ||
                   cmp_u64(err, p, "nvme nsid", w, l->nsid, e->nsid) ||
                   cmp_bytes(err, p, "nvme nguid", w, l->nguid, e->nguid, 16) ||
                   cmp_bytes(err, p, "nvme eui64", w, l->eui64, e->eui64, 8)
               ? TV_E_DEVICE_MISMATCH
               : 0;
}

static int check_device(const tv__label *l, const tv__dev *d, tv_error *err)
{
    const char *w = "device has", *p = d->path;
    tv__label now;

    if (cmp_u64(err, p, "lba size", w, l->lba_size, d->lba_size) ||
        cmp_u64(err, p, "io_align", w, l->io_align, d->io_align) ||
        cmp_u64(err, p, "object_align", w, l->object_align, d->object_align) ||
        cmp_u64(err, p, "device size (resized?)", w, l->size_bytes, d->size_bytes) ||
        cmp_kind(err, p, w, l->dev_kind, (uint32_t)d->kind))
        return TV_E_DEVICE_MISMATCH;
    if (d->kind != TV__DEV_NVME)
        return 0;
    memset(&now, 0, sizeof now);
    put_field(now.serial, sizeof now.serial, d->ident.serial);
    put_field(now.model, sizeof now.model, d->ident.model);
    return cmp_str(err, p, "nvme serial", w, l->serial, now.serial, sizeof l->serial) ||
                   cmp_str(err, p, "nvme model", w, l->model, now.model, sizeof l->model) ||
                   cmp_u64(err, p, "nvme nsid", w, l->nsid, d->ident.nsid) ||
                   cmp_bytes(err, p, "nvme nguid", w, l->nguid, d->ident.nguid, 16) ||
                   cmp_bytes(err, p, "nvme eui64", w, l->eui64, d->ident.eui64, 8)
               ? TV_E_DEVICE_MISMATCH
               : 0;
}

int tv__label_check(const tv__label *on_disk, const tv__label *expected, const tv__dev *d,
                    tv_error *err)
{
    int rc;

    if (!on_disk || !d)
        return tv__seterr(err, TV_E_INVALID_ARG, "label check: NULL argument");
    if (expected) {
        rc = check_expected(on_disk, expected, d->path, err);
        if (rc)
            return rc;
    }
    rc = check_device(on_disk, d, err);
    if (rc)
        return rc;
    /* A label that matches everything but describes an impossible region
     * (written by another build, or by hand) must not be trusted either. */
    tv_error why = {0};
    if (tv__region_validate(d, on_disk->region_off, on_disk->region_len, &why))
        return tv__seterr(err, TV_E_DEVICE_MISMATCH, "device %s: label region invalid: %s", d->path,
                          why.msg);
    return 0;
}
