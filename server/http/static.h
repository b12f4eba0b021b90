/* The dashboard's static files (web/ and Debian's Chart.js), embedded into
 * tensorvaultd at build time by server/http/embed_static.cmake, and the
 * lookups the transport (http/mhd.c) serves them with.
 *
 * Routes: GET|HEAD / -> index.html; /ui/NAME -> web/NAME (NAME:
 * [A-Za-z0-9._-]+, no "..": anything else is no dashboard file and the api
 * answers its usual 404); /ui/vendor/chart.min.js -> Chart.js (a one-line
 * stub when libjs-chart.js was absent at configure time).
 * Invariants: the table is read-only and built at compile time (no runtime
 * file access); every response carries TV__STATIC_HEADERS and the file's
 * ETag (a quoted prefix of the SHA-256 of its bytes). */
#ifndef TV_HTTP_STATIC_H
#define TV_HTTP_STATIC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct tv__static_file {
    const char *name; /* "index.html", "vendor/chart.min.js" */
    const uint8_t *data;
    size_t len;
    const char *content_type;
    const char *etag; /* quoted: "\"<hex>\"" */
} tv__static_file;

/* Generated (tv_static_files.c), sorted by name. */
extern const tv__static_file tv__static_files[];
extern const size_t tv__static_nfiles;

/* Headers of every dashboard response (name/value pairs). */
#define TV__STATIC_CSP                                                                             \
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "              \
    "connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'self'; "                   \
    "frame-ancestors 'none'"
extern const char *const tv__static_headers[][2];
extern const size_t tv__static_nheaders;

/* Whether NAME is a valid /ui/ file name: [A-Za-z0-9._-]+, no "..". */
bool tv__static_name_ok(const char *name);
/* The embedded file of a request path ("/", "/ui/NAME",
 * "/ui/vendor/chart.min.js"; no query), or NULL when PATH names none. */
const tv__static_file *tv__static_find(const char *path);
/* Whether an If-None-Match value (a list of entity tags, W/ prefixes, or
 * "*"; NULL = absent) matches F's ETag: the answer is then 304. */
bool tv__static_not_modified(const tv__static_file *f, const char *if_none_match);

#endif
