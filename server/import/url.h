/* http(s):// URLs of import sources: parsing, the import.origins check, and
 * the Content-Range header of a 206. Pure functions (tests/unit/test_url.c).
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
#ifndef TV_IMPORT_URL_H
#define TV_IMPORT_URL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tensorvault/errors.h"

#define TV__URL_MAX 2048

#define TV__S3_DEFAULT_REGION "us-east-1"

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

/* Copies the value of header line p (len bytes, as libcurl's header
 * callback gets it) into out when its name is name (case-insensitive);
 * trims spaces and CRLF. Leaves out as it is otherwise. */
void tv__http_header_value(const char *p, size_t len, const char *name, char *out, size_t out_len);

/* What stops the transfers of one job or one thread: cancelled(ctx)
 * returns true once they must end (a cancelled import, a stopping
 * daemon). It is polled at least once a second by every transfer (the
 * progress callback tv__http_setup installs, every curl_multi loop, the
 * backoff between tries), which then ends with TV_E_CANCELLED, never with
 * a network error and never tried again. cancelled NULL: never. */
typedef struct tv__http_cancel {
    bool (*cancelled)(void *ctx);
    void *ctx;
} tv__http_cancel;

/* Whether c says stop (false for NULL c or a NULL callback). */
bool tv__http_cancelled(const tv__http_cancel *c);

/* How often at least a curl_multi loop polls its cancel (ms). */
#define TV__HTTP_POLL_MS 1000

/* Sleeps before try attempt_no + 1 of a request: 100 ms doubling, at most
 * 6.4 s (the importer's and the uploader's retries), in steps of at most
 * 100 ms, each after a look at cancel. Returns true (at once) when cancel
 * says stop: the caller makes no further try. */
bool tv__http_backoff(unsigned attempt_no, const tv__http_cancel *cancel);

/* What every libcurl request of tensorvault (the importer's, the
 * uploader's) is set to: url; http and https only; no redirects (an origin
 * check made on url must hold for every byte); no signals; connect timeout
 * and "no byte for timeout_s" (a slow transfer that moves lives); agent;
 * the header and body callbacks with their ctx; errbuf (cleared,
 * CURL_ERROR_SIZE bytes); proxy (NULL or "": libcurl's default); the one
 * progress callback of tensorvault, which aborts the transfer
 * (CURLE_ABORTED_BY_CALLBACK) once cancel says stop: libcurl calls it about
 * once a second even while no byte moves (cancel must outlive the
 * transfer; NULL: none). c is a CURL * (void here: this header does not
 * need curl.h). */
typedef size_t (*tv__http_cb)(char *p, size_t sz, size_t n, void *ctx);
void tv__http_setup(void *c, const char *url, long timeout_s, const char *agent, const char *proxy,
                    tv__http_cb on_header, tv__http_cb on_body, void *ctx, char *errbuf,
                    const tv__http_cancel *cancel);
/* Whether a transfer that ended with CURLcode cc (an int here) was cut
 * short by cancel: aborted by the progress callback, or any failure once
 * cancel says stop. */
bool tv__http_was_cancelled(int cc, const tv__http_cancel *cancel);
/* Signs c's requests with AWS Signature V4 (sigv4: "aws:amz:REGION:s3")
 * with the key pair; no-op without an access key id. */
void tv__http_sigv4(void *c, const char *sigv4, const char *key_id, const char *secret);

#endif
