/* The blob routes of the fleet: GET/HEAD /v1/blobs/sha256:HEX serves the
 * canonical bytes of the committed object with that content hash (the
 * store reads them: store.h, tv__store_blob); GET /v1/blobs lists the
 * hashes this node holds. Both need a fleet or admin token (api.c
 * authorize).
 *
 * Invariants:
 *   - a blob is read through the request's reader store, kept until the
 *     body is read (a stream outlives the request), then given back;
 *   - a read the store refuses (an object freed while it was read) fails
 *     the body, so a streamed body ends the connection instead of carrying
 *     other bytes;
 *   - Range, If-None-Match, 304/206/416 and streaming are the data route's
 *     (tv__api_bytes_reply); the ETag is the strong "sha256:HEX". */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http/api_internal.h"
#include "util/internal.h"

#define DIGEST_PREFIX "sha256:"

/* The source of a blob's bytes: the request's reader store (kept while the
 * body is read) and the store's blob on it. */
typedef struct blob_src {
    tv__api *api;
    tv__api_rd *rd;
    tv__store_blob *blob;
} blob_src;

static void blob_free(void *src)
{
    blob_src *b = src;
    if (!b)
        return;
    tv__store_blob_close(b->blob);
    tv__api_reader_put(b->api, b->rd);
    free(b);
}

static int blob_read(void *src, uint64_t off, uint64_t len, uint8_t *dest, tv_error *err)
{
    blob_src *b = src;
    return tv__store_blob_read(b->blob, off, len, dest, err);
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
    tv__store_blob *blob = NULL;
    blob_src *b = NULL;
    uint64_t len = 0;
    int rc;
    if ((rc = tv__api_query_allow(c, none)) || (rc = digest_parse(c, c->param[0], hex)) ||
        (rc = tv__api_reader(c, &reg)) ||
        (rc = tv__store_blob_open(c->rd, hex, &blob, &len, &c->err)))
        goto out;
    if (!(b = calloc(1, sizeof *b))) {
        rc = tv__seterr(&c->err, -ENOMEM, "out of memory");
        goto out;
    }
    b->api = c->api;
    b->blob = blob;
    blob = NULL;
    b->rd = c->rdw; /* the body may be streamed after the request: it keeps the store */
    c->rdw = NULL;
    c->rd = NULL;
    char etag[TV__REG_SHA256_HEX_LEN + 16], what[TV__REG_SHA256_HEX_LEN + 16];
    snprintf(etag, sizeof etag, "\"" DIGEST_PREFIX "%s\"", hex);
    snprintf(what, sizeof what, "blob " DIGEST_PREFIX "%s", hex);
    rc = tv__api_bytes_reply(c, etag, len, b, blob_read, blob_free, what);
    b = NULL;
out:
    tv__store_blob_close(blob);
    blob_free(b);
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
