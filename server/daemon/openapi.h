/* docs/openapi.yaml, embedded at build time (server/daemon/embed_file.cmake)
 * so GET /v1/openapi.yaml needs no source tree: tv__openapi_yaml holds the
 * bytes plus a NUL, tv__openapi_yaml_len the bytes without it. */
#ifndef TV_DAEMON_OPENAPI_H
#define TV_DAEMON_OPENAPI_H

#include <stddef.h>

extern const char tv__openapi_yaml[];
extern const size_t tv__openapi_yaml_len;

#endif
