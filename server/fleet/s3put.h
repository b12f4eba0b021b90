/* Copies bytes from an HTTP(S) source to an S3-compatible object store
 * (in fleet mode, publishing a generation uploads its shards). The
 * source is a Range-capable URL (in fleet mode the node's own blob route,
 * GET /v1/blobs/sha256:HEX with a fleet token); the store is spoken to
 * path-style (tv__s3_object_url), every request signed with SigV4 by
 * libcurl. Nothing here touches the store's devices. See s3put.c. */
#ifndef TV_FLEET_S3PUT_H
#define TV_FLEET_S3PUT_H

#include <stdbool.h>
#include <stdint.h>

#include "httpc/httpc.h"
#include "httpc/url.h"
#include "tensorvault/errors.h"

#define TV__S3PUT_DEFAULT_PART     (64ull << 20) /* bytes per part */
#define TV__S3PUT_MIN_PART         (5ull << 20)  /* S3's minimum part size */
#define TV__S3PUT_MAX_PARTS        10000         /* S3's limit */
#define TV__S3PUT_DEFAULT_RETRIES  4
#define TV__S3PUT_DEFAULT_TIMEOUT  60 /* seconds */
#define TV__S3PUT_DEFAULT_PARALLEL 4
#define TV__S3PUT_MAX_PARALLEL     64

typedef struct tv__s3put_opts {
    tv__s3_opts s3;     /* httpc/url.h: endpoint, region, keys, token */
    const char *proxy;  /* CURLOPT_PROXY; NULL/"" = libcurl's default */
    uint64_t part_len;  /* multipart part size; 0 = 64 MiB; >= 5 MiB (S3's minimum) */
    unsigned retries;   /* per request after the first try (0 = 4), backoff 100 ms doubling */
    unsigned timeout_s; /* 0 = 60: connect, and no byte for this long */
    unsigned parallel;  /* parts in flight at once (0 = 4; at most 64) */
    /* Ends every request within a second once it says stop (the daemon
     * stopping): the call then returns TV_E_CANCELLED. */
    tv__http_cancel cancel;
} tv__s3put_opts;

/* HEAD s3_url (s3://BUCKET/KEY): *exists and *len. 404 -> exists false, 0.
 * Returns 0; TV_E_INVALID_ARG / TV_E_BAD_REQUEST (a malformed URL or
 * endpoint); TV_E_FORBIDDEN (401/403: names endpoint, bucket and key, never
 * the secret); TV_E_CANCELLED (o->cancel said stop); -ECONNREFUSED /
 * -ETIMEDOUT / -EIO naming the URL. */
int tv__s3_head(const tv__s3put_opts *o, const char *s3_url, bool *exists, uint64_t *len,
                tv_error *err);

/* Copies len bytes of src_url (GET with Range, Authorization: Bearer
 * src_bearer when non-NULL) to s3_url. len <= part_len: one PUT; else
 * CreateMultipartUpload, UploadPart (parallel, each retried), Complete
 * (the XML with every ETag); any failure sends AbortMultipartUpload so no
 * parts are left. The bytes are hashed on the way: when sha256 (64 hex) is
 * given and the source's bytes differ, nothing is completed and the result
 * is TV_E_HASH_MISMATCH. A PUT carries x-amz-content-sha256 of its part
 * and Content-Length. At most parallel x part_len bytes are buffered.
 * Returns 0; TV_E_INVALID_ARG (bad options, URLs or digest); TV_E_FORBIDDEN
 * (401/403 from the store: names endpoint, bucket and key, never the
 * secret; or from the source); TV_E_HASH_MISMATCH; TV_E_SOURCE_CHANGED
 * (the source's length or ETag moved, or it went away); TV_E_CANCELLED
 * (o->cancel said stop: nothing completed; a multipart upload is aborted,
 * the abort given a second); -ECONNREFUSED / -ETIMEDOUT / -EIO / -EPROTO
 * with a message naming the URL and status. */
int tv__s3_copy_from_url(const tv__s3put_opts *o, const char *src_url, const char *src_bearer,
                         uint64_t len, const char *sha256, const char *s3_url, tv_error *err);

#endif
