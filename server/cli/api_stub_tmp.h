/* TEMPORARY (delete when server/http/api.h, daemon/jobs.h and the registry's
 * job rows are on main): the API9.md declarations the CLI codes against.
 * Each part is declared only while the real header is absent. */
#ifndef TV_CLI_API_STUB_TMP_H
#define TV_CLI_API_STUB_TMP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <jansson.h>

#include "registry/registry.h"
#include "store/store.h"

/* The registry's job row (tv__reg_job) exists already; API9's fields
 * (step, rate_bytes_per_s, ...) arrive with the registry helper's change. */
#ifdef TV__JOB_STEP_MAX
#define TV__CLI_JOB_HAS_STEP 1
#endif
#ifndef TV__ALIAS_MAX
#define TV__ALIAS_MAX 64
#endif

#if !__has_include("daemon/jobs.h")
typedef struct tv__jobs tv__jobs;
typedef void (*tv__job_watch_fn)(void *ctx, const tv__reg_job *now);
#endif

#if !__has_include("http/api.h")
#define TV__ANON_LOOPBACK 0
#define TV__ANON_ALWAYS   1
#define TV__ANON_NEVER    2
typedef struct tv__api tv__api;
typedef struct tv__api_opts {
    const char *store_dir;
    bool writer;
    tv__jobs *jobs;
    tv__job_watch_fn watch;
    void *watch_ctx;
    const char *const *import_roots;
    size_t n_import_roots;
    int anonymous_reads;
    size_t max_body_bytes;
    const char *openapi_yaml;
    size_t openapi_len;
} tv__api_opts;
int tv__api_open(const tv__api_opts *o, tv__store *writer, tv__api **out, tv_error *err);
void tv__api_close(tv__api *api);
typedef struct tv__api_req {
    const char *method;
    const char *path;
    const char *query;
    const char *body;
    size_t body_len;
    const char *authorization, *range, *if_none_match, *content_type;
    bool trusted;
    bool peer_loopback;
} tv__api_req;
typedef struct tv__api_resp {
    int status;
    const char *route;
    char *body;
    size_t body_len;
    const char *content_type;
    char headers[512];
    json_t *json;
    bool stream;
    uint64_t stream_len;
    void *stream_state;
} tv__api_resp;
int tv__api_handle(tv__api *api, const tv__api_req *req, tv__api_resp *resp);
ssize_t tv__api_stream_read(tv__api_resp *resp, uint64_t pos, void *buf, size_t max);
void tv__api_resp_free(tv__api_resp *resp);
json_t *tv__api_error_json(int code, const char *message);
#define TV__CLI_API_STUBBED 1
#endif

#endif
