/* The service layer behind every route of the REST API (docs/openapi.yaml),
 * free of any transport: the daemon (server/http/mhd.c) turns HTTP requests into
 * tv__api_req and tv__api_resp back into HTTP; the CLI's local mode calls
 * tv__api_handle in-process. The JSON produced here is the one schema the
 * API and `tensorvault --json` share (docs/openapi.yaml).
 *
 * Invariants:
 *   - tv__api_handle always fills resp (status, route template, body or
 *     stream) and never aborts on bad input: every failure is an error
 *     document {"error":{code,message,errno}} with the status of
 *     tv__api_http_status;
 *   - reads never take the writer mutex: they use read-only store handles
 *     from a pool (one per concurrent request: SQLite WAL lets them run
 *     beside the writer); every mutation runs on the one writer store behind
 *     a mutex;
 *   - a tv_model handle of the data route is used by one thread at a time
 *     (a pool keyed by model and generation); its snapshot lease is dropped
 *     (idle handles closed) before gc and model delete, so the pool never
 *     keeps a retired generation's objects from being freed;
 *   - a local import source is opened when the request is checked, before
 *     anything is queued, and what was opened must lie under an import root
 *     (its real path, whole path components); the job reads through that
 *     descriptor, never the path again (import/source.h: tv__src_local).
 * Thread safety: tv__api_handle and tv__api_stream_read may be called
 * concurrently from any number of threads on one tv__api. */
#ifndef TV_HTTP_API_H
#define TV_HTTP_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <jansson.h>

#include "jobs/jobs.h"
#include "http/peer.h"
#include "registry/registry.h"
#include "store/store.h"

typedef struct tv__fp tv__fp;
typedef struct tv__fp_access tv__fp_access;
struct tv__fp_session_info;
struct tv__fp_stats;

/* Tokenless reads (config http.anonymous_reads): who may call a read route
 * without a token (what each may read is [access], fastpath/access.h). */
#define TV__ANON_LOOPBACK                                                                          \
    0                     /* local peers: the UNIX socket, and loopback TCP clients identified by  \
                             uid (the default); anyone else needs a token */
#define TV__ANON_ALWAYS 1 /* also unidentified peers, as "anonymous" */
#define TV__ANON_NEVER  2 /* TCP needs a token; the UNIX socket still identifies its peers */

#define TV__API_MAX_BODY_DEFAULT (64u * 1024u) /* request body bytes when max_body_bytes is 0 */
#define TV__API_LIMIT_DEFAULT    100           /* ?limit= default */
#define TV__API_LIMIT_MAX        1000          /* ?limit= maximum */

typedef struct tv__api tv__api;

typedef struct tv__api_opts {
    const char *store_dir;
    bool writer;    /* open the store as writer (when no writer store is passed) */
    tv__jobs *jobs; /* daemon: the pool; NULL = run jobs inline (CLI local mode) */
    tv__job_watch_fn watch;
    void *watch_ctx; /* inline jobs' progress */
    const char *const *import_roots;
    size_t n_import_roots; /* import_roots NULL = any path (local mode) */
    /* import.origins: ','-separated URL prefixes an http(s):// source must
     * lie under (NULL or "" = none), checked when import_roots is set. */
    const char *import_origins;
    int anonymous_reads;   /* TV__ANON_LOOPBACK | TV__ANON_ALWAYS | TV__ANON_NEVER */
    size_t max_body_bytes; /* 0 = TV__API_MAX_BODY_DEFAULT */
    const char *openapi_yaml;
    size_t openapi_len;
    tv__fp *fp; /* the daemon's fast path (GET /v1/sessions); NULL = off (an empty list) */
    const char *fleet_token;    /* fleet.token: a bearer with scope fleet; NULL/"" = none */
    const char *fleet_conninfo; /* fleet.postgres; NULL/"" = standalone (fleet routes 409) */
    /* [access]: which peer may read which model, on every route (must
     * outlive the api); NULL = every peer that may read at all reads every
     * model (the CLI's local mode, tests). */
    const tv__fp_access *access;
} tv__api_opts;

/* Opens the service on o->store_dir. writer: the daemon's writer store (the
 * api uses it for mutations and never closes it); NULL with o->writer opens
 * one (closed by tv__api_close); NULL without o->writer makes a read-only
 * api (mutations answer 409, TV_E_STATE). The import roots are resolved
 * with realpath now (a root that does not exist is an error naming it).
 * Returns 0 and *out; TV_E_INVALID_ARG (NULL store_dir, bad
 * anonymous_reads); the errors of tv__store_open and realpath (-errno);
 * -ENOMEM. */
int tv__api_open(const tv__api_opts *o, tv__store *writer, tv__api **out, tv_error *err);
/* NULL-safe. Call when no request is in flight. */
void tv__api_close(tv__api *api);

/* The fleet thread GET /v1/fleet reads (NULL: standalone); it must outlive
 * the requests (stop HTTP first). */
struct tv__fleet;
void tv__api_set_fleet(tv__api *api, struct tv__fleet *fleet);

typedef struct tv__api_req {
    const char *method;
    const char *path;  /* raw, still percent-encoded */
    const char *query; /* raw, after '?', or NULL */
    const char *body;
    size_t body_len;
    const char *authorization, *range, *if_none_match, *content_type; /* header values or NULL */
    bool trusted; /* local mode: admin without a token */
    /* who sent it (http/peer.h), NULL for nobody known: without a token, a
     * local peer reads what [access] allows it, any other peer is
     * anonymous */
    const tv__http_peer *peer;
    /* the transport can park the request (resp->later); otherwise
     * tv__api_handle waits for a later answer itself */
    bool async;
} tv__api_req;

typedef struct tv__api_later tv__api_later;

typedef struct tv__api_resp {
    int status;        /* 0 while later is set */
    const char *route; /* template for metrics: "GET /v1/models/{name}"; "unmatched" for none */
    char *body;        /* malloc'd (or NULL), body_len bytes; or, when body_release is
                          set, memory that body_release(body_owner) gives back */
    size_t body_len;
    void (*body_release)(void *owner); /* NULL: body is free()'d */
    void *body_owner;
    const char *content_type; /* static string, or NULL for no body */
    char headers[512];        /* extra "Name: value\r\n" lines (ETag, Content-Range, Location,
                                 Allow, WWW-Authenticate, Retry-After, Accept-Ranges) */
    json_t *json;             /* the JSON document when content_type is application/json
                                 (owned; body holds its compact dump) */
    /* streamed bytes (tensor data, blobs; body NULL): */
    bool stream;
    uint64_t stream_len;
    void *stream_state;
    void (*stream_release)(void *state); /* frees stream_state (NULL: free()) */
    /* An answer another thread gives later (a fleet alias move waits on
     * PostgreSQL there, never here): only for a request with async set;
     * the transport parks the request, watches the later and takes the
     * answer once woken (tv__api_later_*). */
    tv__api_later *later;
} tv__api_resp;

/* Handles one request. Always fills resp (free with tv__api_resp_free) and
 * returns resp->status. */
int tv__api_handle(tv__api *api, const tv__api_req *req, tv__api_resp *resp);
/* For a streamed body: copies up to max bytes at pos (relative to the
 * body, < stream_len) into buf. Returns the bytes copied (> 0 while pos <
 * stream_len, 0 at the end) or a negative code. */
ssize_t tv__api_stream_read(tv__api_resp *resp, uint64_t pos, void *buf, size_t max);
/* NULL-safe, safe twice; gives up a later answer not taken. */
void tv__api_resp_free(tv__api_resp *resp);

/* The transport's side of a later answer (resp->later):
 * tv__api_later_watch: wake(ctx) is called once, from whichever thread
 * answers (at once when the answer is in already); tv__api_later_expire:
 * answers 503 TV_E_BUSY when now_ms is past its deadline (or force, e.g.
 * at stop) and the answer is not in; tv__api_later_take: moves the answer
 * into resp (after wake; resp->later NULL again); tv__api_later_wait: the
 * same for a caller that cannot park (blocks until the answer or the
 * deadline). */
void tv__api_later_watch(tv__api_later *l, void (*wake)(void *ctx), void *ctx);
int64_t tv__api_later_deadline(const tv__api_later *l);
void tv__api_later_expire(tv__api_later *l, int64_t now_ms, bool force);
void tv__api_later_take(tv__api_resp *resp);
void tv__api_later_wait(tv__api_resp *resp);

/* The HTTP status for a return code (docs/openapi.yaml: 400 for a bad
 * request, 404 not found, 409 a state conflict, 503 busy, ...). */
int tv__api_http_status(int code);

/* The schema renderers (the objects of docs/openapi.yaml, api_render.c),
 * also used by the CLI printers.
 * Each returns a new reference, NULL only on -ENOMEM. */
json_t *tv__api_error_json(int code, const char *message);
/* A JSON string of s; bytes that are not UTF-8 become U+FFFD. NULL s is null. */
json_t *tv__api_jstr(const char *s);
json_t *tv__api_model_json(const tv__reg_model *m, const tv__reg_alias *aliases, size_t n_aliases);
/* aliases: those pointing at g (sorted); shards NULL = the list form. */
json_t *tv__api_generation_json(const tv__reg_generation *g, const tv__reg_alias *aliases,
                                size_t n_aliases, const tv__reg_manifest *shards);
json_t *tv__api_shard_json(const tv__reg_shard *s);
json_t *tv__api_alias_json(const char *model, const char *alias, int64_t generation);
json_t *tv__api_token_json(const tv__reg_token *t);
json_t *tv__api_version_json(void);
json_t *tv__api_job_json(const tv__reg_job *j);
/* A fast-path session (tv__fp_sessions) with its open handles. */
json_t *tv__api_session_json(const struct tv__fp_session_info *s);
/* The fast path's memory tier and sharing figures (enabled: the fast path
 * runs). */
json_t *tv__api_tier_json(const struct tv__fp_stats *st, bool enabled);

#endif
