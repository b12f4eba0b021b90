/* The URLs of outbound requests (import sources, fleet pulls and uploads):
 * parsing, the import.origins check, the path-style URL of an S3 object,
 * and the Content-Range header of a 206. Pure functions, no libcurl
 * (tests/unit/test_url.c); the libcurl settings are httpc.h's.
 *
 * A source URL is scheme://host[:port]/path: scheme http or https (any
 * case), host a DNS name or IPv4 address ([A-Za-z0-9.-]) or a bracketed
 * IPv6 literal, port 1-65535. Refused (TV_E_BAD_REQUEST, the message says
 * why): userinfo (user:password@, so no credential ever lands in a job row
 * or a log), a query or fragment, a path without a leading '/', "." or ".."
 * segments, percent-encoded '.', '/', '\' or NUL (an origin's path
 * normalisation must not move a URL out of its origin's prefix), and bytes
 * outside RFC 3986's path characters. At most TV__URL_MAX bytes.
 *
 * An S3 source is s3://BUCKET/KEY: BUCKET 3-63 bytes of [a-z0-9.-] (starts
 * and ends with a letter or digit; no port, no credentials), KEY checked as
 * a path is above. import.origins may list s3://BUCKET/PREFIX/ prefixes:
 * an s3:// URL lies only under an s3:// prefix of its bucket. */
#ifndef TV_HTTPC_URL_H
#define TV_HTTPC_URL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tensorvault/errors.h"

#define TV__URL_MAX 2048

#define TV__S3_DEFAULT_REGION "us-east-1"

/* An S3-compatible object store (s3.* in the daemon's config, else the
 * AWS_* environment): where it is and the keys requests are signed with.
 * The strings are the caller's and outlive the requests; NULL or "" = none
 * (endpoint: https://s3.REGION.amazonaws.com; region: us-east-1). The
 * secret is never logged nor put in a message. */
typedef struct tv__s3_opts {
    const char *endpoint, *region;
    const char *access_key_id, *secret_access_key, *session_token;
} tv__s3_opts;

typedef struct tv__url {
    bool https;
    bool s3;                /* s3://BUCKET/KEY: host is the bucket, port 0 */
    char host[256];         /* lowercased; an IPv6 literal keeps its brackets */
    unsigned port;          /* as given, else 80 / 443 */
    char path[TV__URL_MAX]; /* from the first '/' */
} tv__url;

/* Parses s into *u. Returns 0 or TV_E_BAD_REQUEST. */
int tv__url_parse(const char *s, tv__url *u, tv_error *err);

/* Whether u lies under the origin prefix p: same scheme, host and port, and
 * p's path is u's path, or a prefix of it that ends in '/' or is followed
 * in u by '/'. */
bool tv__url_under(const tv__url *u, const tv__url *p);

/* The import.origins check: url parses and lies under one of the
 * comma-separated prefixes in origins (spaces around them ignored).
 * Returns 0; TV_E_BAD_REQUEST (url malformed); TV_E_OUTSIDE_ROOTS (origins
 * NULL or empty, or no prefix matches: the message names import.origins);
 * TV_E_INVALID_ARG (a prefix in origins does not parse). */
int tv__url_origins_check(const char *url, const char *origins, tv_error *err);

/* Checks that every prefix of import.origins parses. Returns 0 or
 * TV_E_INVALID_ARG naming the prefix. */
int tv__url_origins_validate(const char *origins, tv_error *err);

/* The path-style HTTP URL of the S3 object u (s3://): ENDPOINT/BUCKET/KEY,
 * ENDPOINT being endpoint (http(s)://HOST[:PORT], a trailing '/' dropped),
 * or when endpoint is NULL or "" https://s3.REGION.amazonaws.com (region
 * NULL or "": us-east-1). Returns 0; TV_E_INVALID_ARG (endpoint malformed);
 * TV_E_BAD_REQUEST (too long). */
int tv__s3_object_url(const char *endpoint, const char *region, const tv__url *u, char *out,
                      size_t out_len, tv_error *err);

/* "bytes FIRST-LAST/TOTAL" (TOTAL may not be '*' here: the importer always
 * knows the length). Returns 0, or -1 when v is anything else. */
int tv__content_range_parse(const char *v, uint64_t *first, uint64_t *last, uint64_t *total);

#endif
