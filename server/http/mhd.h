/* The HTTP transport of tensorvaultd: libmicrohttpd (0.9.75) in front of
 * tv__api (http/api.h), plus /metrics (http/metrics.h).
 *
 * Invariants:
 *   - the path reaches the api raw (an unescape callback that changes
 *     nothing, the request line taken from the URI-log callback): the api
 *     splits on '/' and decodes each segment itself, so %2F never splits;
 *   - a request body is never buffered past max_body_bytes (a Content-Length
 *     over it is answered 413 before the body is read; a chunked body over it
 *     is discarded and answered 413) and the request headers never past
 *     max_header_bytes (413);
 *   - MHD runs its own thread pool with an explicit connection timeout,
 *     per-IP connection limit and per-connection memory limit;
 *   - streamed tensor bodies are pulled with tv__api_stream_read, so a large
 *     tensor never sits whole in memory. */
#ifndef TV_HTTP_MHD_H
#define TV_HTTP_MHD_H

#include <stddef.h>
#include <stdint.h>

#include "tensorvault/errors.h"

typedef struct tv__api tv__api;
typedef struct tv__jobs tv__jobs;
typedef struct tv__http tv__http;

typedef struct tv__http_opts {
    const char *listen; /* "HOST:PORT" or "[V6]:PORT"; port 0 = any free port */
    unsigned threads;   /* 0 = online CPUs */
    unsigned connection_timeout_s;
    unsigned per_ip_connections;
    size_t memory_limit; /* bytes per connection */
    size_t max_body_bytes;
    size_t max_header_bytes;
    const char *store_dir; /* /metrics reads the registry here (read-only) */
} tv__http_opts;

/* Binds and starts serving api (and jobs for /metrics, may be NULL).
 * Returns 0, *out and *port (the bound port; may be NULL); TV_E_INVALID_ARG
 * for an address that does not resolve; -EADDRINUSE and other -errno when
 * the socket cannot be bound (the message names the address). */
int tv__http_start(const tv__http_opts *o, tv__api *api, tv__jobs *jobs, tv__http **out,
                   uint16_t *port, tv_error *err);

/* Stops accepting new connections (requests in flight finish). */
void tv__http_quiesce(tv__http *h);

/* Stops the server, waiting for its threads. NULL-safe. */
void tv__http_stop(tv__http *h);

#endif
