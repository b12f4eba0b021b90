/* Content-addressed blobs of a store: the canonical bytes of the committed
 * object with a given SHA-256, read from the raw devices by the read engine
 * (the fleet's blob route, GET /v1/blobs/sha256:HEX, serves them).
 *
 * Invariants:
 *   - only committed objects are read ('writing' ones never), and only
 *     their canonical bytes [0, canonical_len), never the zero padding;
 *   - every replica on a device whose status is ok (tv__store_device: label,
 *     geometry and identity checked) is a source of the engine's request, in
 *     device order: the first is read, the others take over on an error;
 *   - bytes count only when every object read is still committed with the
 *     same hash and extent after the read (gc may free an object meanwhile
 *     and an import reuse its extent): otherwise the read fails, so a reader
 *     never gets other bytes than the blob's. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/engine.h"
#include "store/store.h"
#include "util/internal.h"

struct tv__store_blob {
    tv__store *st; /* the caller's: it outlives the blob */
    tv__io *io;    /* an engine over the devices of the replicas */
    uint64_t len;  /* canonical bytes */
    size_t n;      /* replicas: engine device i reads obj[i] */
    tv__reg_object obj[TV__IO_MAX_REPLICAS];
    char sha256[TV__REG_SHA256_HEX_LEN + 1];
};

void tv__store_blob_close(tv__store_blob *b)
{
    if (!b)
        return;
    tv__io_destroy(b->io);
    free(b);
}

/* The replicas of b among objs whose device opens and validates, into
 * b->obj[] and iod[]. Returns 0, or when none can be read the first
 * device's error (the others logged and skipped). */
static int blob_replicas(tv__store_blob *b, const tv__reg_object *objs, size_t n,
                         tv__io_dev iod[TV__IO_MAX_REPLICAS], tv_error *err)
{
    int first_rc = 0;
    tv_error first = {0};
    for (size_t i = 0; i < n && b->n < TV__IO_MAX_REPLICAS; i++) {
        tv__dev *d;
        tv_error e = {0};
        int drc = tv__store_device(b->st, objs[i].device_id, false, &d, &e);
        if (drc == 0 && b->n && objs[i].canonical_len != b->obj[0].canonical_len)
            drc = tv__seterr(&e, TV_E_REGISTRY,
                             "object %" PRId64 " of blob sha256:%s has %" PRIu64
                             " bytes, object %" PRId64 " %" PRIu64,
                             objs[i].id, b->sha256, objs[i].canonical_len, b->obj[0].id,
                             b->obj[0].canonical_len);
        if (drc) {
            tv__log(TV_LOG_WARN, "blob sha256:%s: skipping object %" PRId64 ": %s", b->sha256,
                    objs[i].id, e.msg);
            if (!first_rc) {
                first_rc = drc;
                first = e;
            }
            continue;
        }
        iod[b->n] = (tv__io_dev){
            .fd = d->fd, .io_align = d->io_align, .size_bytes = d->size_bytes, .direct = d->direct};
        b->obj[b->n++] = objs[i];
    }
    if (b->n == 0)
        return tv__seterr(err, first_rc, "blob sha256:%s: no device holding it can be read: %s",
                          b->sha256, first.msg);
    return 0;
}

int tv__store_blob_open(tv__store *st, const char *sha256, tv__store_blob **out, uint64_t *len,
                        tv_error *err)
{
    tv__reg_object *objs = NULL;
    size_t n = 0;
    tv__store_blob *b = NULL;
    int rc;
    *out = NULL;
    if ((rc = tv__reg_objects_by_sha256(st->reg, sha256, &objs, &n, err)))
        goto out;
    if (n == 0) {
        rc = tv__seterr(err, TV_E_NOT_FOUND, "no committed object holds blob sha256:%s here",
                        sha256);
        goto out;
    }
    if (!(b = calloc(1, sizeof *b))) {
        rc = tv__seterr(err, -ENOMEM, "out of memory");
        goto out;
    }
    b->st = st;
    snprintf(b->sha256, sizeof b->sha256, "%s", sha256);
    tv__io_dev iod[TV__IO_MAX_REPLICAS];
    if ((rc = blob_replicas(b, objs, n, iod, err)))
        goto out;
    b->len = b->obj[0].canonical_len;
    /* copy_threads 1: the copies run inline (no workers per reader). */
    tv__io_opts o = {.queue_depth = 16, .chunk_len = 1u << 20, .copy_threads = 1};
    if ((rc = tv__io_create(iod, b->n, &o, &b->io, err)))
        goto out;
    *len = b->len;
    *out = b;
    b = NULL;
out:
    tv__store_blob_close(b);
    free(objs);
    return rc;
}

int tv__store_blob_read(tv__store_blob *b, uint64_t off, uint64_t len, uint8_t *dest, tv_error *err)
{
    if (off > b->len || len > b->len - off)
        return tv__seterr(err, TV_E_RANGE,
                          "bytes %" PRIu64 "+%" PRIu64 " past the end of blob sha256:%s (%" PRIu64
                          " bytes)",
                          off, len, b->sha256, b->len);
    if (len == 0)
        return 0;
    tv__io_req q = {.n_src = (uint32_t)b->n, .len = len, .dest = dest};
    for (size_t i = 0; i < b->n; i++)
        q.src[i] = (tv__io_src){.dev = (uint32_t)i, .off = b->obj[i].base_off + off};
    int rc = tv__io_run(b->io, &q, 1, NULL, err);
    if (rc)
        return rc;
    for (size_t i = 0; i < b->n; i++) {
        tv__reg_object now;
        tv_error e = {0};
        const tv__reg_object *o = &b->obj[i];
        rc = tv__reg_object_get(b->st->reg, o->id, &now, &e);
        if (rc && rc != TV_E_NOT_FOUND) {
            *err = e;
            return rc;
        }
        if (rc || now.state != TV__OBJ_COMMITTED || now.device_id != o->device_id ||
            now.base_off != o->base_off || now.canonical_len != o->canonical_len ||
            strcmp(now.sha256, o->sha256))
            return tv__seterr(err, TV_E_STATE,
                              "blob sha256:%s: object %" PRId64 " on device %" PRId64
                              " was freed while it was read",
                              b->sha256, o->id, o->device_id);
    }
    return 0;
}
