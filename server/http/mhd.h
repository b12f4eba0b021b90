/* The HTTP transport of tensorvaultd: libmicrohttpd (0.9.75) in front of
 * tv__api (http/api.h), plus /metrics (http/metrics.h), on a TCP address
 * and optionally a UNIX socket.
 *
 * Invariants:
 *   - the path reaches the api raw (an unescape callback that changes
 *     nothing, the request line taken from the URI-log callback): the api
 *     splits on '/' and decodes each segment itself, so %2F never splits;
 *   - a request body is never buffered past max_body_bytes (a Content-Length
 *     over it is answered 413 before the body is read; a chunked body over it
 *     is discarded and answered 413) and the request headers never past
 *     max_header_bytes (413);
 *   - every connection's peer is identified once, when it is accepted
 *     (http/peer.h), and the api sees it with every request;
 *   - a TCP request whose Host is not one of the daemon's names
 *     (allowed_hosts) is answered 421 before routing, one without Host on
 *     HTTP/1.1 400 (DNS rebinding); a non-GET request whose Origin is not
 *     one of them is 403 (a page of another site);
 *   - one peer cannot take every connection: a local user (by uid) and an
 *     unidentified address each hold at most their cap, further
 *     connections are closed at once; and a request must arrive whole
 *     within header_timeout_s of the connection's start or the previous
 *     response's end (a deadline, not an idle timeout: a client trickling
 *     a byte a second is cut off), checked by a watchdog thread every
 *     250 ms;
 *   - MHD runs its own thread pools with an explicit idle timeout and
 *     per-connection memory limit;
 *   - streamed tensor bodies are pulled with tv__api_stream_read, so a large
 *     tensor never sits whole in memory. */
#ifndef TV_HTTP_MHD_H
#define TV_HTTP_MHD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tensorvault/errors.h"

typedef struct tv__api tv__api;
typedef struct tv__jobs tv__jobs;
typedef struct tv__http tv__http;

typedef struct tv__http_opts {
    const char *listen;            /* "HOST:PORT" or "[V6]:PORT"; port 0 = any free port */
    unsigned threads;              /* 0 = online CPUs */
    unsigned connection_timeout_s; /* idle */
    unsigned header_timeout_s;     /* a whole request must arrive within it; 0 = 10 */
    unsigned per_ip_connections;   /* per unidentified peer address; 0 = 256 */
    unsigned per_uid_connections;  /* per local user (UNIX socket, identified loopback); 0 = 256 */
    unsigned max_connections;      /* over both listeners; 0 = 4096 */
    size_t memory_limit;           /* bytes per connection */
    size_t max_body_bytes;
    size_t max_header_bytes;
    const char *store_dir;     /* /metrics reads the registry here (read-only) */
    const char *socket_path;   /* a UNIX socket serving the same API; NULL or "" = none */
    unsigned socket_mode;      /* its mode; 0 = 0660 */
    bool identify_loopback;    /* learn loopback TCP peers' uid (http.anonymous_reads != never) */
    const char *allowed_hosts; /* ','-separated host[:port]; NULL or "" = the default list */
    const char *extra_hosts;   /* names added to the default list (fleet.url's host) */
} tv__http_opts;

/* Binds and starts serving api (and jobs for /metrics, may be NULL).
 * Returns 0, *out and *port (the bound port; may be NULL); TV_E_INVALID_ARG
 * for an address that does not resolve or a malformed allowed_hosts entry;
 * -EADDRINUSE and other -errno when a socket cannot be bound (the message
 * names the address). */
int tv__http_start(const tv__http_opts *o, tv__api *api, tv__jobs *jobs, tv__http **out,
                   uint16_t *port, tv_error *err);

/* Stops accepting new connections (requests in flight finish). */
void tv__http_quiesce(tv__http *h);

/* Stops the server, waiting for its threads. NULL-safe. */
void tv__http_stop(tv__http *h);

#endif
