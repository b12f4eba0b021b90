/* Device claims: the identity keys that recognise one device under any
 * path, and the bounded scan for data a new store region would overwrite.
 *
 * Invariants: identity never comes from a path string (fstat of the open
 * descriptor, the loop driver's backing inode, NVMe identify data); the scan
 * reads a bounded set of aligned windows (see TV__DEV_SCAN_* in dev.h) through
 * tv__dev_pread_full, so its cost does not grow with the device size and
 * every read is O_DIRECT-safe; a window is clipped to the device. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/loop.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "dev/dev.h"
#include "util/hex.h"
#include "util/sys.h"

#define LOOP_MAJOR_NUM 7u

static void add_key(tv__dev_claim *c, const char *fmt_kind, unsigned long long a,
                    unsigned long long b)
{
    if (c->n_keys < TV__DEV_CLAIM_MAX_KEYS)
        snprintf(c->keys[c->n_keys++], TV__DEV_CLAIM_KEY_LEN, "%s:%llu:%llu", fmt_kind, a, b);
}

int tv__dev_claim_keys(const tv__dev *d, tv__dev_claim *out, tv_error *err)
{
    struct stat sb;

    memset(out, 0, sizeof *out);
    if (!d)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__dev_claim_keys: NULL device");
    if (tv__sys.fstat(d->fd, &sb) != 0) {
        int rc = -errno;
        return tv__seterr(err, rc, "fstat %s: %s", d->path, strerror(-rc));
    }
    if (S_ISREG(sb.st_mode))
        add_key(out, "file", (unsigned long long)sb.st_dev, (unsigned long long)sb.st_ino);
    else
        add_key(out, "blk", major(sb.st_rdev), minor(sb.st_rdev));
    if (S_ISBLK(sb.st_mode) && major(sb.st_rdev) == LOOP_MAJOR_NUM) {
        /* The same bytes as its backing file: key it like that file. An
         * unbound loop device fails with ENXIO and has no backing key. */
        struct loop_info64 li;
        memset(&li, 0, sizeof li);
        if (tv__sys.ioctl(d->fd, LOOP_GET_STATUS64, &li) == 0)
            add_key(out, "file", (unsigned long long)li.lo_device, (unsigned long long)li.lo_inode);
    }
    if (d->kind == TV__DEV_NVME && out->n_keys < TV__DEV_CLAIM_MAX_KEYS) {
        char nguid[33], eui[17];
        tv__hex_encode(d->ident.nguid, 16, false, nguid);
        tv__hex_encode(d->ident.eui64, 8, false, eui);
        snprintf(out->keys[out->n_keys++], TV__DEV_CLAIM_KEY_LEN, "nvme:%s:%s:%u:%s:%s",
                 d->ident.serial, d->ident.model, d->ident.nsid, nguid, eui);
    }
    return 0;
}

bool tv__dev_claim_same(const tv__dev_claim *a, const tv__dev_claim *b)
{
    if (!a || !b)
        return false;
    for (size_t i = 0; i < a->n_keys; i++)
        for (size_t j = 0; j < b->n_keys; j++)
            if (a->keys[i][0] && !strcmp(a->keys[i], b->keys[j]))
                return true;
    return false;
}

/* ---- the scan ------------------------------------------------------------ */

typedef struct scan_ctx {
    tv__dev *d;
    uint64_t region_off, region_end;
    uint8_t *buf; /* TV__DEV_SCAN_WINDOW bytes, io_align aligned */
    tv__dev_scan *out;
} scan_ctx;

static void look_at_block(scan_ctx *c, const uint8_t *blk, uint64_t off, size_t len)
{
    if (!c->out->label && len >= TV__LABEL_LEN && !memcmp(blk, TV__LABEL_MAGIC, 8)) {
        tv__label l;
        c->out->label = true;
        c->out->label_off = off;
        if (tv__label_decode(blk, &l, NULL) == 0) {
            c->out->label_valid = true;
            memcpy(c->out->label_uuid, l.store_uuid, 16);
        }
    }
    if (c->out->nonzero)
        return;
    /* Only the part of the block inside the region counts as data. */
    uint64_t b = off < c->region_off ? c->region_off : off;
    uint64_t e = off + len > c->region_end ? c->region_end : off + len;
    for (uint64_t p = b; p < e; p++) {
        if (blk[p - off]) {
            c->out->nonzero = true;
            c->out->nonzero_off = p;
            return;
        }
    }
}

/* Reads [off, off + len) (aligned down/up to io_align, clipped to the
 * device) window by window and looks at every io_align block. */
static int scan_range(scan_ctx *c, uint64_t off, uint64_t len, tv_error *err)
{
    uint64_t a = c->d->io_align, end;
    if (tv__add_u64(off, len, &end) || end > c->d->size_bytes)
        end = c->d->size_bytes;
    off -= off % a;
    if (end % a && end + (a - end % a) <= c->d->size_bytes)
        end += a - end % a;
    while (off < end) {
        uint64_t n = end - off < TV__DEV_SCAN_WINDOW ? end - off : TV__DEV_SCAN_WINDOW;
        if (n % a) /* a device whose size is not a multiple of io_align */
            n -= n % a;
        if (n == 0)
            break;
        int rc = tv__dev_pread_full(c->d, c->buf, (size_t)n, off, err);
        if (rc)
            return rc;
        c->out->bytes_read += n;
        for (uint64_t p = 0; p < n; p += a)
            look_at_block(c, c->buf + p, off + p, (size_t)(n - p < a ? n - p : a));
        off += n;
    }
    return 0;
}

/* For a regular file: the first window of each data extent in the region
 * (holes read as zeros and need no look). */
static int scan_extents(scan_ctx *c, tv_error *err)
{
    off_t pos = (off_t)c->region_off;
    for (unsigned i = 0; i < TV__DEV_SCAN_EXTENTS && (uint64_t)pos < c->region_end; i++) {
        off_t data = tv__sys.lseek(c->d->fd, pos, SEEK_DATA);
        if (data < 0) {
            if (errno == ENXIO) /* no data after pos */
                return 0;
            if (errno == EINVAL) /* no SEEK_DATA here: the samples must do */
                return 0;
            int rc = -errno;
            return tv__seterr(err, rc, "lseek SEEK_DATA %s at %lld: %s", c->d->path, (long long)pos,
                              strerror(-rc));
        }
        if ((uint64_t)data >= c->region_end)
            return 0;
        int rc = scan_range(c, (uint64_t)data, TV__DEV_SCAN_WINDOW, err);
        if (rc || c->out->nonzero)
            return rc;
        off_t hole = tv__sys.lseek(c->d->fd, data, SEEK_HOLE);
        if (hole < 0 || hole <= data)
            return 0;
        pos = hole;
    }
    return 0;
}

int tv__dev_claim_scan(tv__dev *d, uint64_t region_off, uint64_t region_len, tv__dev_scan *out,
                       tv_error *err)
{
    scan_ctx c = {0};
    int rc;

    if (!d || !out)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__dev_claim_scan: NULL argument");
    memset(out, 0, sizeof *out);
    if (tv__add_u64(region_off, region_len, &c.region_end) || c.region_end > d->size_bytes ||
        region_off % d->io_align)
        return tv__seterr(err, TV_E_INVALID_ARG,
                          "scan %s: region [%" PRIu64 ", +%" PRIu64 ") is not inside the device",
                          d->path, region_off, region_len);
    c.d = d;
    c.region_off = region_off;
    c.out = out;
    if (!(c.buf = tv__dev_alloc_aligned(d, TV__DEV_SCAN_WINDOW)))
        return tv__seterr(err, -ENOMEM, "scan %s: out of memory", d->path);
    /* Labels near the start of the device (any store's region offset), the
     * region's edges, then samples spread over the rest. */
    if ((rc = scan_range(&c, 0, TV__DEV_SCAN_HEAD, err)) ||
        (rc = scan_range(&c, region_off, TV__DEV_SCAN_EDGE, err)))
        goto out;
    if (region_len > TV__DEV_SCAN_EDGE &&
        (rc = scan_range(&c, c.region_end - TV__DEV_SCAN_EDGE, TV__DEV_SCAN_EDGE, err)))
        goto out;
    if (region_len > 2 * TV__DEV_SCAN_EDGE) {
        uint64_t span = region_len - 2 * TV__DEV_SCAN_EDGE;
        for (unsigned i = 0; i < TV__DEV_SCAN_SAMPLES && !(out->label && out->nonzero); i++) {
            uint64_t at = region_off + TV__DEV_SCAN_EDGE + span / TV__DEV_SCAN_SAMPLES * i;
            if ((rc = scan_range(&c, at, TV__DEV_SCAN_WINDOW, err)))
                goto out;
        }
    }
    if (d->kind == TV__DEV_FILE && !out->nonzero)
        rc = scan_extents(&c, err);
out:
    free(c.buf);
    return rc;
}
