/* Content-addressed blobs (issue 13): GET/HEAD /v1/blobs/sha256:HEX serves
 * the canonical bytes of the committed object with that hash, read from the
 * raw device through the read engine; GET /v1/blobs lists the hashes this
 * node holds. Both need a fleet or admin token (api.c authorize).
 *
 * Invariants:
 *   - only committed objects are served ('writing' ones never), and only
 *     their canonical bytes [0, canonical_len), never the zero padding;
 *   - every replica on a device whose status is ok (tv__store_device: label,
 *     geometry and identity checked) is a source of the engine's request, in
 *     device order: the first is read, the others take over on an error;
 *   - bytes count only when every object read is still committed with the
 *     same hash and extent after the read (gc may free an object meanwhile
 *     and an import reuse its extent): otherwise the read fails, so a
 *     streamed body ends the connection instead of carrying other bytes;
 *   - Range, If-None-Match, 304/206/416 and streaming are the data route's
 *     (tv__api_bytes_reply); the ETag is the strong "sha256:HEX". */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http/api_internal.h"
#include "io/engine.h"
#include "util/internal.h"

#define DIGEST_PREFIX "sha256:"

/* The source of a blob's bytes: the request's reader store (kept while the
 * body is read) and an engine over the devices of its replicas. */
typedef struct blob_src {
    tv__api *api;
    tv__store *st;
    tv__io *io;
    uint64_t len; /* canonical bytes */
    size_t n;     /* replicas: engine device i reads obj[i] */
    tv__reg_object obj[TV__IO_MAX_REPLICAS];
    char sha256[TV__REG_SHA256_HEX_LEN + 1];
} blob_src;

static void blob_free(void *src)
{
    blob_src *b = src;
    if (!b)
        return;
    tv__io_destroy(b->io);
    tv__api_reader_put(b->api, b->st);
    free(b);
}

static int blob_read(void *src, uint64_t off, uint64_t len, uint8_t *dest, tv_error *err)
{
    blob_src *b = src;
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

/* "sha256:" + exactly 64 lower-case hex digits -> hex. TV_E_BAD_REQUEST
 * naming what is wrong. */
static int digest_parse(tv__api_ctx *c, const char *s, char hex[TV__REG_SHA256_HEX_LEN + 1])
{
    size_t pl = strlen(DIGEST_PREFIX);
    if (strncmp(s, DIGEST_PREFIX, pl))
        return tv__seterr(
            &c->err, TV_E_BAD_REQUEST,
            "blob digest '%.80s' does not start with 'sha256:' (expected sha256:<64 lower-case hex digits>)",
            s);
    const char *h = s + pl;
    size_t n = strlen(h);
    if (n != TV__REG_SHA256_HEX_LEN)
        return tv__seterr(&c->err, TV_E_BAD_REQUEST,
                          "blob digest '%.80s' has %zu hex digits after 'sha256:', expected 64", s,
                          n);
    for (size_t i = 0; i < n; i++)
        if (!((h[i] >= '0' && h[i] <= '9') || (h[i] >= 'a' && h[i] <= 'f')))
            return tv__seterr(
                &c->err, TV_E_BAD_REQUEST,
                "blob digest '%.80s': character %zu after 'sha256:' is not a lower-case hex digit",
                s, i + 1);
    memcpy(hex, h, n + 1);
    return 0;
}

int tv__api_h_blob(tv__api_ctx *c)
{
    static const char *const none[] = {NULL};
    char hex[TV__REG_SHA256_HEX_LEN + 1];
    tv__reg *reg;
    tv__reg_object *objs = NULL;
    size_t n = 0;
    blob_src *b = NULL;
    int rc;
    if ((rc = tv__api_query_allow(c, none)) || (rc = digest_parse(c, c->param[0], hex)) ||
        (rc = tv__api_reader(c, &reg)) ||
        (rc = tv__reg_objects_by_sha256(reg, hex, &objs, &n, &c->err)))
        goto out;
    if (n == 0) {
        rc = tv__seterr(&c->err, TV_E_NOT_FOUND, "no committed object holds blob sha256:%s here",
                        hex);
        goto out;
    }
    if (!(b = calloc(1, sizeof *b))) {
        rc = tv__seterr(&c->err, -ENOMEM, "out of memory");
        goto out;
    }
    b->api = c->api;
    memcpy(b->sha256, hex, sizeof hex);
    tv__io_dev iod[TV__IO_MAX_REPLICAS];
    int first_rc = 0;
    tv_error first = {0};
    for (size_t i = 0; i < n && b->n < TV__IO_MAX_REPLICAS; i++) {
        tv__dev *d;
        tv_error e = {0};
        int drc = tv__store_device(c->rd, objs[i].device_id, false, &d, &e);
        if (drc == 0 && b->n && objs[i].canonical_len != b->obj[0].canonical_len)
            drc = tv__seterr(&e, TV_E_REGISTRY,
                             "object %" PRId64 " of blob sha256:%s has %" PRIu64
                             " bytes, object %" PRId64 " %" PRIu64,
                             objs[i].id, hex, objs[i].canonical_len, b->obj[0].id,
                             b->obj[0].canonical_len);
        if (drc) {
            tv__log(TV_LOG_WARN, "blob sha256:%s: skipping object %" PRId64 ": %s", hex, objs[i].id,
                    e.msg);
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
    if (b->n == 0) {
        rc = tv__seterr(&c->err, first_rc, "blob sha256:%s: no device holding it can be read: %s",
                        hex, first.msg);
        goto out;
    }
    b->len = b->obj[0].canonical_len;
    /* copy_threads 1: the copies run inline (no workers per request). */
    tv__io_opts o = {.queue_depth = 16, .chunk_len = 1u << 20, .copy_threads = 1};
    if ((rc = tv__io_create(iod, b->n, &o, &b->io, &c->err)))
        goto out;
    b->st = c->rd; /* the body may be streamed after the request: it keeps the store */
    c->rd = NULL;
    char etag[TV__REG_SHA256_HEX_LEN + 16], what[TV__REG_SHA256_HEX_LEN + 16];
    snprintf(etag, sizeof etag, "\"" DIGEST_PREFIX "%s\"", hex);
    snprintf(what, sizeof what, "blob " DIGEST_PREFIX "%s", hex);
    rc = tv__api_bytes_reply(c, etag, b->len, b, blob_read, blob_free, what);
    b = NULL;
out:
    blob_free(b);
    free(objs);
    return rc;
}

int tv__api_h_blobs(tv__api_ctx *c)
{
    static const char *const allowed[] = {"limit", "cursor", NULL};
    tv__reg *reg;
    size_t limit, n = 0, kl;
    char *after = NULL;
    tv__reg_blob *bl = NULL;
    bool more = false;
    json_t *arr = NULL, *next = NULL;
    int rc;
    if ((rc = tv__api_query_allow(c, allowed)) || (rc = tv__api_query_limit(c, &limit)) ||
        (rc = tv__api_cursor_get(c, 'b', &after, &kl)) || (rc = tv__api_reader(c, &reg)) ||
        (rc = tv__reg_blobs_page(reg, after, limit, &bl, &n, &more, &c->err)))
        goto out;
    if (!(arr = json_array())) {
        rc = tv__seterr(&c->err, -ENOMEM, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        char digest[TV__REG_SHA256_HEX_LEN + 16];
        snprintf(digest, sizeof digest, DIGEST_PREFIX "%s", bl[i].sha256);
        if (json_array_append_new(arr, json_pack("{s:s,s:I,s:I}", "digest", digest, "bytes",
                                                 (json_int_t)bl[i].bytes, "n_replicas",
                                                 (json_int_t)bl[i].n_replicas))) {
            rc = tv__seterr(&c->err, -ENOMEM, "out of memory");
            goto out;
        }
    }
    if (more && n) {
        char *cur = tv__api_cursor_make('b', bl[n - 1].sha256, strlen(bl[n - 1].sha256));
        next = cur ? json_string(cur) : NULL;
        free(cur);
    } else {
        next = json_null();
    }
    if (!next) {
        rc = tv__seterr(&c->err, -ENOMEM, "out of memory");
        goto out;
    }
    rc = tv__api_reply(c, 200, json_pack("{s:o,s:o}", "blobs", arr, "next_cursor", next));
    arr = NULL;
out:
    json_decref(arr);
    free(bl);
    free(after);
    return rc;
}
