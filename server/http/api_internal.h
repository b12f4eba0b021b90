/* Internals shared by the api's files. They call one another one way
 * (scripts/check, the rooms rule), bottom first:
 *   api_render.c   the schema renderers, the status table, the error document
 *   api_later.c    answers given later by another thread
 *   api_common.c   what every route shares: reply and headers, the pooled
 *                  reader store and the writer lock, access, query, cursors,
 *                  body fields, path ids, generation specs
 *   api_cache.c    Shard and single-tensor documents of ready generations
 *   api_bytes.c    byte bodies: ETag, Range, whole or streamed
 *   api_handles.c  the data route's pool of open tv_model handles
 *   api_<resource>.c  the routes, one file per resource (system, devices,
 *                  models, generations, aliases, tensors, jobs, tokens,
 *                  sessions, shards, blobs, fleet, files): each calls only the files above,
 *                  never another route's file
 *   api.c          open and close, the router, authorisation, the dispatch
 * Invariant: a handler either returns 0 with the response document set
 * (tv__api_reply) or returns an error code with c->err filled; the
 * dispatcher renders errors, so no handler builds an error document. */
#ifndef TV_HTTP_API_INTERNAL_H
#define TV_HTTP_API_INTERNAL_H

#include <stdatomic.h>
#include <pthread.h>

#include "http/api.h"
#include "import/alloc.h"
#include "tensorvault/tensorvault.h"

#define TV__API_MAX_PARAMS    4
#define TV__API_MAX_QUERY     16
#define TV__API_READER_POOL   32
#define TV__API_MODEL_POOL    16
#define TV__API_SHARD_CACHE   16
#define TV__API_TENSOR_CACHE  16384 /* single-tensor documents */
#define TV__API_CURSOR_MAX    8192  /* characters of an incoming cursor */
#define TV__API_STREAM_PIECE  (8ull << 20)
#define TV__API_WHOLE_DEFAULT (256ull << 20)
/* Bytes of whole-tensor bodies held at once by all requests; a tensor that
 * would pass it is streamed instead (bounded memory however many clients). */
#define TV__API_WHOLE_INFLIGHT (1ull << 30)
#define TV__API_BUF_POOL       16           /* whole-body buffers kept for reuse */
#define TV__API_BUF_KEEP       (512u << 20) /* bytes of them at most */

/* Generation rows kept per pooled reader (api_cache.c). */
#define TV__API_GEN_CACHE 8

/* A pooled reader store and the generation rows read through it, kept
 * while its connection's data version (tv__reg_data_version) stays the
 * same: no commit by any connection since they were read, so they are
 * what the registry would answer now (api_cache.c). */
typedef struct tv__api_rd {
    tv__store *st;
    int64_t version; /* the data version gen[] was read under (n_gen > 0) */
    size_t n_gen;
    uint64_t clock;
    struct tv__api_gen_entry {
        int64_t number; /* as asked: 0 = the active one */
        uint64_t last_use;
        tv__reg_generation g;
    } gen[TV__API_GEN_CACHE];
} tv__api_rd;

typedef struct tv__api_model_slot {
    char *model;
    int64_t generation;
    tv_model *m;
    bool busy;
    uint64_t last_use;
} tv__api_model_slot;

struct tv__api {
    char *store_dir;
    tv__jobs *jobs;
    tv__job_watch_fn watch;
    void *watch_ctx;
    char **roots;  /* realpath'd import roots; NULL = any */
    char *origins; /* import.origins (with roots; NULL = any URL) */
    size_t n_roots;
    int anonymous_reads;
    const tv__fp_access *access; /* NULL: no per-model rules */
    size_t max_body_bytes;
    const char *openapi_yaml;
    size_t openapi_len;
    int64_t started_at;              /* CLOCK_MONOTONIC seconds */
    tv__fp *fp;                      /* the fast path (its sessions listing), or NULL */
    char *fleet_token;               /* fleet.token (scope fleet), or NULL */
    char *fleet_conninfo;            /* fleet.postgres; NULL = standalone */
    struct tv__mover *mover;         /* the alias-move thread (fleet.postgres set), else NULL */
    struct tv__fleet *_Atomic fleet; /* GET /v1/fleet; set once the thread runs */

    tv__store *writer; /* NULL: read-only api */
    bool own_writer;
    pthread_mutex_t writer_mu;

    pthread_mutex_t pool_mu; /* readers[] and models[] */
    tv__api_rd *readers[TV__API_READER_POOL];
    size_t n_readers;
    tv__api_model_slot models[TV__API_MODEL_POOL];
    uint64_t model_clock;

    pthread_mutex_t cache_mu; /* shard_cache[] (api_cache.c) */
    struct {
        int64_t generation_id;
        json_t *shards; /* [Shard] */
        uint64_t last_use;
    } shard_cache[TV__API_SHARD_CACHE];
    json_t *tensor_cache; /* "<generation id>:<tensor name>" -> Tensor (detail form) */
    uint64_t cache_clock, cache_epoch;
    _Atomic uint64_t whole_inflight; /* bytes of whole bodies not yet sent */
    /* Whole-body buffers kept for reuse (already faulted in: a device read
     * into fresh pages is bound by the kernel's page faults), under pool_mu. */
    struct tv__api_buf {
        void *p;
        size_t cap;
    } bufs[TV__API_BUF_POOL];
    size_t n_bufs, bufs_bytes;
};

/* Tensors up to this many bytes are answered whole in resp->body, larger
 * ones streamed (a test hook: tests lower it to exercise streaming). */
extern uint64_t tv__api_whole_body_max;

/* Frees the pooled whole-body buffers (tv__api_close). */
void tv__api_bufs_free(tv__api *api);

typedef struct tv__api_ctx {
    tv__api *api;
    const tv__api_req *req;
    tv__api_resp *resp;
    char *param[TV__API_MAX_PARAMS]; /* decoded path parameters, NUL-terminated */
    size_t param_len[TV__API_MAX_PARAMS];
    size_t n_params;
    char *qk[TV__API_MAX_QUERY], *qv[TV__API_MAX_QUERY]; /* decoded query */
    size_t qv_len[TV__API_MAX_QUERY];
    size_t n_query;
    tv__store *rd;   /* reader store, taken on first use (rdw->st) */
    tv__api_rd *rdw; /* its pool entry */
    tv__scope scope;
    bool has_token; /* token: the bearer token the request carries */
    tv__reg_token token;
    tv_error err;
} tv__api_ctx;

/* Whether the request's peer may read model ([access]: admin tokens and
 * the CLI's local mode always may). Returns 0 or TV_E_PEER_DENIED (c->err
 * names the peer, the model and the rules). */
int tv__api_may_read(tv__api_ctx *c, const char *model);
/* The same as a yes/no, c->err untouched (filtering a listing). */
bool tv__api_can_read(tv__api_ctx *c, const char *model);
/* Whether the request may see what every peer does (sessions of other
 * users, every job): the CLI's local mode and admin tokens. */
bool tv__api_sees_all(const tv__api_ctx *c);

typedef int (*tv__api_handler)(tv__api_ctx *c);

/* Sets the response document (steals doc; NULL is -ENOMEM). Returns 0 or
 * -ENOMEM (c->err filled). */
int tv__api_reply(tv__api_ctx *c, int status, json_t *doc);
/* Appends "name: value\r\n" to resp->headers (dropped when full). */
void tv__api_header(tv__api_resp *r, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The reader store for this request (a pooled read-only handle). */
int tv__api_reader(tv__api_ctx *c, tv__reg **reg);
/* Gives a reader store back to the pool (closed and freed when the pool is
 * full or it was left inside a transaction). NULL-safe. A handler that
 * keeps the request's reader past the request (a stream) takes c->rdw,
 * sets c->rdw and c->rd NULL and puts it back here when done. */
void tv__api_reader_put(tv__api *api, tv__api_rd *rd);
/* Closes a reader store and frees its entry (NULL-safe). */
void tv__api_reader_free(tv__api_rd *rd);
/* The writer store under its mutex; TV_E_STATE for a read-only api. Every
 * successful tv__api_writer_lock needs one tv__api_writer_unlock. */
int tv__api_writer_lock(tv__api_ctx *c, tv__store **st);
void tv__api_writer_unlock(tv__api_ctx *c);

/* Query: TV_E_BAD_REQUEST for a parameter not in allowed (NULL-terminated). */
int tv__api_query_allow(tv__api_ctx *c, const char *const *allowed);
const char *tv__api_query(const tv__api_ctx *c, const char *name); /* NULL when absent */
int tv__api_query_limit(tv__api_ctx *c, size_t *limit);
/* Cursors are the hex of the key text, with a one-letter kind prefix. */
char *tv__api_cursor_make(char kind, const char *key, size_t key_len);
/* Decodes the query's cursor of kind: *key NULL when absent or empty (malloc'd,
 * NUL-terminated otherwise). TV_E_BAD_REQUEST when malformed. */
int tv__api_cursor_get(tv__api_ctx *c, char kind, char **key, size_t *key_len);
/* Parses the body as a JSON object with only the allowed fields
 * (NULL-terminated); an absent body is {} when empty_ok. *obj owned by the
 * caller. TV_E_TOO_LARGE, TV_E_BAD_REQUEST. */
int tv__api_body(tv__api_ctx *c, const char *const *allowed, bool empty_ok, json_t **obj);
/* Typed body fields: absent leaves *out as is; wrong type (null included:
 * no request field is nullable) is TV_E_BAD_REQUEST naming the field. An
 * integer may be written as a number without a fraction (3.0), as JSON
 * Schema's integer allows, within int64. */
int tv__api_field_str(tv__api_ctx *c, json_t *o, const char *name, bool required, const char **out);
int tv__api_field_bool(tv__api_ctx *c, json_t *o, const char *name, bool *out);
int tv__api_field_int(tv__api_ctx *c, json_t *o, const char *name, bool required, int64_t *out);

/* A request that takes no body: nothing, or an empty JSON object. */
int tv__api_no_body(tv__api_ctx *c);
/* Path parameter i as an id from 1; TV_E_BAD_REQUEST naming what (a
 * "device id", a "token id"). */
int tv__api_path_id(tv__api_ctx *c, size_t i, const char *what, int64_t *id);
/* next_cursor of a page: the cursor of key (tv__api_cursor_make) when more
 * follow, else null. NULL on -ENOMEM. */
json_t *tv__api_cursor_json(bool more, char kind, const char *key, size_t key_len);

/* The active generation of model as readers open it (tv__store_settled_active:
 * an activation interrupted after its pointer rename counts as done), or
 * registry_active when no reader store is held or the api has a writer
 * (whose registry is settled: its open completed any interrupted
 * activation and every later one goes through this process). */
int tv__api_settled(tv__api_ctx *c, const char *model, int64_t registry_active, int64_t *active);
/* A generation spec from a path ("3", "prod", "active") -> number. */
int tv__api_gen(tv__api_ctx *c, tv__reg *reg, const char *model, const char *spec, int64_t *number);
/* The generation row of a spec ("3", "prod", "active"): the row of a
 * number or of the active generation is kept with the request's reader
 * (tv__api_rd) and answered from there while the registry is unchanged. */
int tv__api_gen_row(tv__api_ctx *c, tv__reg *reg, const char *model, const char *spec,
                    tv__reg_generation *g);
/* Aliases of model (sorted), and the subset pointing at generation. */
int tv__api_aliases(tv__api_ctx *c, tv__reg *reg, const char *model, tv__reg_alias **out,
                    size_t *n);

/* Reads [off, off + len) of tensor name of (model, gen) into dest through
 * the handle pool (api_handles.c). TV_E_NOT_FOUND (no such tensor);
 * TV_E_RANGE (past its end); tv_model_open's and the read's errors. */
int tv__api_model_read(tv__api *api, const char *model, int64_t gen, const char *name, uint64_t off,
                       uint64_t len, uint8_t *dest, tv_error *err);

/* Reads [off, off + len) of a byte body's source into dest: 0 or an error
 * with err filled. */
typedef int (*tv__api_bytes_read_fn)(void *src, uint64_t off, uint64_t len, uint8_t *dest,
                                     tv_error *err);
/* Answers n bytes read by read_fn(src, ...) (api_bytes.c; the tensor data
 * and blob routes): ETag etag (quoted) and Accept-Ranges; If-None-Match that
 * matches -> 304; one satisfiable Range -> 206 with Content-Range;
 * unsatisfiable or malformed -> TV_E_RANGE (416, Content-Range: bytes * /n);
 * several ranges or another unit -> 200 whole. The body is read now (whole
 * into a pooled buffer under the in-flight budget, or a small range) or
 * streamed (always for HEAD: nothing is read): then read_fn runs on the transport's thread after
 * the handler returned, one call at a time, and a failing read ends the connection (never a short
 * body that looks complete). src is owned from the call on: src_free(src) (may be NULL) once
 * nothing reads it, whatever happens. what names the bytes in messages ("tensor 'x'"). */
int tv__api_bytes_reply(tv__api_ctx *c, const char *etag, uint64_t n, void *src,
                        tv__api_bytes_read_fn read_fn, void (*src_free)(void *src),
                        const char *what);

/* The renderers of api_render.c not in api.h. */
/* status: tv__store_device_status's word; message: why, when not "ok". */
json_t *tv__api_device_json(const tv__reg_device *d, const tv__alloc_space *sp, const char *status,
                            const char *message);
/* shard: the tensor's Shard object for the single-tensor form (file_offset,
 * replicas), NULL for the list form. */
json_t *tv__api_tensor_json(const tv__reg_tensor_row *t, json_t *shard);

/* The [Shard] array of generation g (a deep copy: the caller owns it),
 * from the cache when g is ready. */
int tv__api_shards(tv__api_ctx *c, tv__reg *reg, const tv__reg_generation *g, json_t **out);
/* The single-tensor document (file_offset, replicas) of name in g (a deep
 * copy), from the cache when g is ready. TV_E_NOT_FOUND. */
int tv__api_tensor_doc(tv__api_ctx *c, tv__reg *reg, const tv__reg_generation *g, const char *name,
                       json_t **out);
/* Drops every cached entry (after rows were deleted: model delete, gc). */
void tv__api_shards_forget(tv__api *api);

/* A later answer (api_later.c): the handler makes one (resp->later; the
 * deadline answers 503 with if_queued when the worker never claimed it,
 * if_running when it did not finish), hands it to its worker and returns
 * 0; when the hand-over fails it calls tv__api_later_discard and returns
 * the error. The worker calls tv__api_later_claim when the work's turn
 * comes (false: given up, do nothing and never touch it again), then
 * tv__api_later_finish once: status and doc (stolen) for a success, or an
 * error code (status from the table) and message. NULL on -ENOMEM. */
tv__api_later *tv__api_later_new(tv__api_ctx *c, int64_t timeout_ms, const char *if_queued,
                                 const char *if_running);
void tv__api_later_discard(tv__api_ctx *c);
bool tv__api_later_claim(tv__api_later *l);
void tv__api_later_finish(tv__api_later *l, int status, json_t *doc, int code, const char *msg);
/* Gives the transport's reference up without an answer (NULL-safe). */
void tv__api_later_abandon(tv__api_later *l);

/* Handlers. */
int tv__api_h_healthz(tv__api_ctx *c);
int tv__api_h_readyz(tv__api_ctx *c);
int tv__api_h_version(tv__api_ctx *c);
int tv__api_h_status(tv__api_ctx *c);
int tv__api_h_openapi(tv__api_ctx *c);
int tv__api_h_devices(tv__api_ctx *c);
int tv__api_h_device(tv__api_ctx *c);
int tv__api_h_device_extents(tv__api_ctx *c);
int tv__api_h_models(tv__api_ctx *c);
int tv__api_h_model(tv__api_ctx *c);
int tv__api_h_model_delete(tv__api_ctx *c);
int tv__api_h_generations(tv__api_ctx *c);
int tv__api_h_generation(tv__api_ctx *c);
int tv__api_h_activate(tv__api_ctx *c);
int tv__api_h_retire(tv__api_ctx *c);
int tv__api_h_rollback(tv__api_ctx *c);
int tv__api_h_deactivate(tv__api_ctx *c);
int tv__api_h_aliases(tv__api_ctx *c);
int tv__api_h_alias_put(tv__api_ctx *c);
int tv__api_h_alias_delete(tv__api_ctx *c);
int tv__api_h_tensors(tv__api_ctx *c);
int tv__api_h_tensor(tv__api_ctx *c);
int tv__api_h_data(tv__api_ctx *c);
int tv__api_h_gc(tv__api_ctx *c);
int tv__api_h_tokens(tv__api_ctx *c);
int tv__api_h_token_create(tv__api_ctx *c);
int tv__api_h_token_revoke(tv__api_ctx *c);
int tv__api_h_imports(tv__api_ctx *c);
int tv__api_h_verify(tv__api_ctx *c);
int tv__api_h_jobs(tv__api_ctx *c);
int tv__api_h_job(tv__api_ctx *c);
int tv__api_h_job_cancel(tv__api_ctx *c);
int tv__api_h_sessions(tv__api_ctx *c);
int tv__api_h_shards(tv__api_ctx *c);
int tv__api_h_blobs(tv__api_ctx *c);
int tv__api_h_fleet(tv__api_ctx *c);
int tv__api_h_fleet_alias_put(tv__api_ctx *c);
int tv__api_h_blob(tv__api_ctx *c);
int tv__api_h_files(tv__api_ctx *c);
int tv__api_h_file(tv__api_ctx *c);

/* With import roots, a local source is opened now (import/source.h:
 * tv__src_local_open), and must be, as opened, under an import root:
 * *held (NULL: closed at once) is what the job reads through, *real the
 * real path of what was opened. Without roots (local mode) *real is
 * realpath(source) and *held NULL: the job opens it by path. Errors:
 * -ENOENT, TV_E_FORBIDDEN, TV_E_OUTSIDE_ROOTS, TV_E_BAD_REQUEST. An
 * http(s):// or s3:// source is kept as given when it parses (httpc/url.h:
 * userinfo, a query, dot segments are 400) and lies under a prefix of
 * import.origins (else 403 TV_E_OUTSIDE_ROOTS; any URL when the api has no
 * roots). *real is malloc'd. */
struct tv__src_local;
int tv__api_source_check(tv__api *api, const char *source, char **real, struct tv__src_local **held,
                         tv_error *err);

/* The data route's model pool (api_handles.c); closes every handle. */
void tv__api_models_close(tv__api *api);
/* Closes the idle pooled handles of model (NULL = every model): each holds
 * a reader lease on its generation's snapshot, which would keep gc from
 * freeing a retired generation. Handles in use stay (their reads hold the
 * lease legitimately). */
void tv__api_models_release(tv__api *api, const char *model);

#endif
