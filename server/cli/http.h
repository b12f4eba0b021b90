/* The CLI's HTTP client (libcurl easy API) to a tensorvaultd, and the
 * percent-encoding of path segments.
 * Invariants: one request per call, bounded by explicit timeouts; a refused
 * or unreachable connection (TCP or the daemon's HTTP UNIX socket) is
 * TV_E_NO_DAEMON naming the URL or socket (nothing was sent, so the caller
 * may fall back to local mode); any HTTP status is a success of the
 * transport (the caller reads the error document). */
#ifndef TV_CLI_HTTP_H
#define TV_CLI_HTTP_H

#include <stdbool.h>
#include <stddef.h>

#include "tensorvault/errors.h"

typedef struct tv__cli_http_req {
    const char *base_url;  /* "http://127.0.0.1:8470" (a trailing '/' is dropped) */
    const char *unix_path; /* the daemon's HTTP UNIX socket, or NULL (base_url then
                              only gives the Host: "http://localhost") */
    const char *token;     /* bearer secret, or NULL */
    const char *method;    /* "GET", "POST", "PUT", "DELETE" */
    const char *path;      /* already encoded: "/v1/models/a%2Fb" */
    const char *query;     /* already encoded, without '?', or NULL */
    const char *body;      /* JSON text, or NULL */
    size_t body_len;
    long timeout_ms; /* whole request; 0 = 60 s */
} tv__cli_http_req;

typedef struct tv__cli_http_resp {
    long status;
    char *body; /* malloc'd, NUL-terminated (body_len excludes the NUL) */
    size_t body_len;
} tv__cli_http_resp;

/* Sends req and fills resp (free resp->body). Returns 0, TV_E_NO_DAEMON
 * (connection refused, host unresolvable or unreachable), TV_E_TIMEOUT,
 * TV_E_TOO_LARGE (answer above 256 MiB), -ENOMEM, or TV_E_INTERNAL for
 * another curl failure (message has curl's text). */
int tv__cli_http(const tv__cli_http_req *req, tv__cli_http_resp *resp, tv_error *err);

/* Percent-encodes s (every byte outside ALPHA DIGIT - . _ ~, so '/' is
 * %2F) into out (out_len bytes, NUL included). Returns 0 or -ERANGE when it
 * does not fit. */
int tv__cli_pct_encode(const char *s, char *out, size_t out_len);

#endif
