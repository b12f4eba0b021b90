/* Unit tests of the service layer (server/http/api*.c) driven in-process
 * through tv__api_handle on a store built here: model "acme/tiny" with two
 * generations (the second active) whose tensor names hold '/', '%', a space
 * and non-ASCII bytes, and model "zeta" for pagination.
 *
 * Invariants checked: every route answers the shapes of docs/openapi.yaml (field names
 * and JSON types); errors are {"error":{code,message,errno}} with the
 * status of the table (400/401/403/404/405/409/413/416); path segments are
 * percent-decoded after the split (so %2F stays inside a name) and %00 or a
 * malformed escape is refused; pagination with limit=1 walks every item
 * once and a malformed cursor is 400; tensor bytes equal the source at
 * unaligned ranges, a-, -n, multi-range (whole body), streamed bodies; 416
 * carries Content-Range: bytes * /N; If-None-Match answers 304; anonymous
 * reads follow the peer; admin routes need a token. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "jobs/jobs.h"
#include "fastpath/fastpath.h"
#include "http/api.h"
#include "http/api_internal.h"
#include "http/mhd.h"
#include "import/import.h"
#include "store/store.h"
#include "tv_test_store.h"
#include "io/engine.h"
#include "util/sha256.h"

#define MiB   (1024ull * 1024ull)
#define MODEL "acme/tiny"

/* The checkpoint of both generations (seeds 1 and 2), in file order. */
static const tv_test_tensor TENSORS[] = {
    {"model.embed/weight", "F32", 1000, 4},
    {"odd 100%", "U8", 13, 1},
    {"na\xc3\xafve", "F32", 100, 4},
    {"big", "U8", 300001, 1},
};
#define N_TENSORS (sizeof TENSORS / sizeof TENSORS[0])

typedef struct fx {
    tv_test_store s; /* one 16 MiB image, the writer open */
    char ck[2][256], ckz[256];
    tv__api *api;
} fx;

static fx *g;

static uint64_t tensor_begin(size_t i)
{
    uint64_t off = 0;
    for (size_t k = 0; k < i; k++)
        off += TENSORS[k].n_elems * TENSORS[k].elem_len;
    return off;
}

static int setup(void **state)
{
    (void)state;
    fx *f = calloc(1, sizeof *f);
    assert_non_null(f);
    tv_test_store_setup(&f->s, "api", NULL);
    for (int i = 0; i < 2; i++) {
        tv_test_path(f->ck[i], sizeof f->ck[i], "%s/ck%d.safetensors", f->s.dir, i + 1);
        tv_test_write_shard(f->ck[i], TENSORS, N_TENSORS, (unsigned)i + 1);
    }
    tv_test_path(f->ckz, sizeof f->ckz, "%s/z.safetensors", f->s.dir);
    tv_test_write_shard(f->ckz, TENSORS, 1, 3);
    tv_test_store_import(&f->s, MODEL, f->ck[0], NULL);
    tv_test_store_import(&f->s, MODEL, f->ck[1], NULL);
    tv_test_store_import(&f->s, "zeta", f->ckz, NULL);
    tv_error err = {0};
    tv__api_opts ao = {.store_dir = f->s.store, .anonymous_reads = TV__ANON_LOOPBACK};
    if (tv__api_open(&ao, f->s.st, &f->api, &err))
        fail_msg("api open: %s", err.msg);
    g = f;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    tv__api_close(g->api);
    tv_test_store_teardown(&g->s);
    free(g);
    g = NULL;
    return 0;
}

/* ---- request helpers ---------------------------------------------------------- */

/* Peers as the transport identifies them: a local user (the UNIX socket or
 * a loopback client the kernel named), a loopback client not identified,
 * and a remote one. */
static const tv__http_peer LOCAL = {
    .local = true, .loopback = true, .uid = 4242, .n_gids = 1, .gids = {4242}, .addr = "127.0.0.1"};
static const tv__http_peer UNKNOWN_LOOPBACK = {.loopback = true, .addr = "127.0.0.1"};
static const tv__http_peer REMOTE = {.addr = "192.0.2.7"};

typedef struct rq {
    const char *body, *auth, *range, *inm, *ctype;
    bool untrusted, remote;
} rq;

/* target is "PATH[?QUERY]". */
static int call(tv__api_resp *r, const char *method, const char *target, const rq *x)
{
    static const rq none = {0};
    if (!x)
        x = &none;
    char path[1024];
    snprintf(path, sizeof path, "%s", target);
    char *q = strchr(path, '?');
    if (q)
        *q++ = '\0';
    tv__api_req req = {.method = method,
                       .path = path,
                       .query = q,
                       .body = x->body,
                       .body_len = x->body ? strlen(x->body) : 0,
                       .authorization = x->auth,
                       .range = x->range,
                       .if_none_match = x->inm,
                       .content_type = x->ctype,
                       .trusted = !x->untrusted,
                       .peer = x->remote ? &REMOTE : &LOCAL};
    int st = tv__api_handle(g->api, &req, r);
    assert_int_equal(st, r->status);
    assert_non_null(r->route);
    return st;
}

/* The error document's code, checking its shape. */
static const char *err_code(const tv__api_resp *r)
{
    assert_non_null(r->json);
    json_t *e = json_object_get(r->json, "error");
    assert_true(json_is_object(e));
    assert_true(json_is_string(json_object_get(e, "code")));
    assert_true(json_is_string(json_object_get(e, "message")));
    assert_true(json_is_integer(json_object_get(e, "errno")));
    assert_true(strlen(json_string_value(json_object_get(e, "message"))) > 0);
    assert_string_equal(tv_err_name((int)json_integer_value(json_object_get(e, "errno"))),
                        json_string_value(json_object_get(e, "code")));
    return json_string_value(json_object_get(e, "code"));
}

static void expect_error(const char *method, const char *target, const rq *x, int status,
                         const char *code)
{
    tv__api_resp r;
    int st = call(&r, method, target, x);
    if (st != status)
        fail_msg("%s %s: status %d, want %d (%s)", method, target, st, status,
                 r.json ? json_dumps(r.json, JSON_COMPACT) : "");
    assert_string_equal(err_code(&r), code);
    tv__api_resp_free(&r);
}

static void expect_field(json_t *o, const char *k, json_type t)
{
    json_t *v = json_object_get(o, k);
    if (!v)
        fail_msg("field '%s' missing", k);
    if (json_typeof(v) != t && !(t == JSON_TRUE && json_is_boolean(v)))
        fail_msg("field '%s' has type %d, want %d", k, json_typeof(v), t);
}

static json_t *ok_json(tv__api_resp *r, const char *method, const char *target, const rq *x)
{
    int st = call(r, method, target, x);
    if (st != 200 && st != 201)
        fail_msg("%s %s: status %d: %s", method, target, st,
                 r->json ? json_dumps(r->json, JSON_COMPACT) : "");
    assert_string_equal(r->content_type, "application/json");
    return r->json;
}

/* ---- frame: router, status table, errors ---------------------------------------- */

static void test_status_table(void **state)
{
    (void)state;
    assert_int_equal(tv__api_http_status(TV_E_BAD_REQUEST), 400);
    assert_int_equal(tv__api_http_status(TV_E_INVALID_ARG), 400);
    assert_int_equal(tv__api_http_status(TV_E_NAME), 400);
    assert_int_equal(tv__api_http_status(TV_E_UNAUTHORIZED), 401);
    assert_int_equal(tv__api_http_status(TV_E_FORBIDDEN), 403);
    assert_int_equal(tv__api_http_status(TV_E_OUTSIDE_ROOTS), 403);
    assert_int_equal(tv__api_http_status(TV_E_NOT_FOUND), 404);
    assert_int_equal(tv__api_http_status(TV_E_CKPT_NOT_FOUND), 404);
    assert_int_equal(tv__api_http_status(-ENOENT), 404);
    assert_int_equal(tv__api_http_status(TV_E_STATE), 409);
    assert_int_equal(tv__api_http_status(TV_E_CONFLICT), 409);
    assert_int_equal(tv__api_http_status(TV_E_LEASED), 409);
    assert_int_equal(tv__api_http_status(-EEXIST), 409);
    assert_int_equal(tv__api_http_status(TV_E_TOO_LARGE), 413);
    assert_int_equal(tv__api_http_status(TV_E_RANGE), 416);
    assert_int_equal(tv__api_http_status(TV_E_FILE_SHORT), 422);
    assert_int_equal(tv__api_http_status(TV_E_ST_HEADER_EMPTY), 422);
    assert_int_equal(tv__api_http_status(TV_E_ST_INT_RANGE), 422);
    assert_int_equal(tv__api_http_status(TV_E_IDX_JSON), 422);
    assert_int_equal(tv__api_http_status(TV_E_IDX_TOO_MANY_SHARDS), 422);
    assert_int_equal(tv__api_http_status(TV_E_CKPT_NOT_FOUND - 1), 500);
    assert_int_equal(tv__api_http_status(TV_E_BUSY), 503);
    assert_int_equal(tv__api_http_status(TV_E_LOCKED), 503);
    assert_int_equal(tv__api_http_status(TV_E_NO_SPACE), 507);
    assert_int_equal(tv__api_http_status(TV_E_REGISTRY), 500);
    assert_int_equal(tv__api_http_status(-EIO), 500);
    json_t *j = tv__api_jstr("a\xff\xc3\xaf"
                             "b\xed\xa0\x80");
    assert_string_equal(json_string_value(j), "a\xef\xbf\xbd\xc3\xaf"
                                              "b\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");
    json_decref(j);
    j = tv__api_error_json(TV_E_BAD_REQUEST, "bad '\xff'");
    assert_non_null(j);
    json_decref(j);
    json_t *e = tv__api_error_json(TV_E_NOT_FOUND, "model 'x' not found");
    char *s = json_dumps(e, JSON_COMPACT | JSON_SORT_KEYS);
    assert_string_equal(
        s,
        "{\"error\":{\"code\":\"TV_E_NOT_FOUND\",\"errno\":-1004,\"message\":\"model 'x' not found\"}}");
    free(s);
    json_decref(e);
}

static void test_router(void **state)
{
    (void)state;
    tv__api_resp r;
    json_t *j = ok_json(&r, "GET", "/healthz", NULL);
    assert_string_equal(json_string_value(json_object_get(j, "status")), "ok");
    assert_string_equal(r.route, "GET /healthz");
    tv__api_resp_free(&r);
    j = ok_json(&r, "GET", "/readyz", NULL);
    assert_string_equal(json_string_value(json_object_get(j, "status")), "ready");
    tv__api_resp_free(&r);
    j = ok_json(&r, "GET", "/v1/version", NULL);
    assert_string_equal(json_string_value(json_object_get(j, "name")), "tensorvault");
    assert_string_equal(json_string_value(json_object_get(j, "api")), "v1");
    expect_field(j, "version", JSON_STRING);
    expect_field(j, "git", JSON_STRING);
    json_t *feat = json_object_get(j, "features");
    expect_field(feat, "cuda", JSON_TRUE);
    expect_field(feat, "nvme", JSON_TRUE);
    expect_field(feat, "io_uring", JSON_TRUE);
    tv__api_resp_free(&r);
    j = ok_json(&r, "GET", "/v1/status", NULL);
    expect_field(j, "version", JSON_STRING);
    assert_string_equal(json_string_value(json_object_get(j, "store")), g->s.store);
    expect_field(j, "uptime_seconds", JSON_INTEGER);
    assert_int_equal(json_integer_value(json_object_get(j, "n_models")), 2);
    assert_int_equal(json_integer_value(json_object_get(j, "n_devices")), 1);
    expect_field(json_object_get(j, "jobs"), "queued", JSON_INTEGER);
    expect_field(json_object_get(j, "jobs"), "running", JSON_INTEGER);
    expect_field(j, "anonymous_reads", JSON_TRUE);
    tv__api_resp_free(&r);

    expect_error("GET", "/nope", NULL, 404, "TV_E_NOT_FOUND");
    expect_error("GET", "/v1/models/", NULL, 404, "TV_E_NOT_FOUND");
    expect_error("GET", "v1/models", NULL, 404, "TV_E_NOT_FOUND");
    expect_error("GET", "/v1/models/acme%2Ftiny/nothing", NULL, 404, "TV_E_NOT_FOUND");
    /* 405 with Allow for a known path */
    assert_int_equal(call(&r, "DELETE", "/v1/devices", NULL), 405);
    assert_string_equal(err_code(&r), "TV_E_BAD_REQUEST");
    assert_non_null(strstr(r.headers, "Allow: GET\r\n"));
    tv__api_resp_free(&r);
    assert_int_equal(call(&r, "HEAD", "/v1/models/acme%2Ftiny", NULL), 200);
    assert_string_equal(r.route, "GET /v1/models/{name}");
    tv__api_resp_free(&r);
    assert_int_equal(call(&r, "POST", "/v1/models/x", NULL), 405);
    assert_non_null(strstr(r.headers, "Allow: GET, DELETE, PATCH\r\n"));
    tv__api_resp_free(&r);
    /* malformed escapes and NUL */
    expect_error("GET", "/v1/models/a%2", NULL, 400, "TV_E_BAD_REQUEST");
    expect_error("GET", "/v1/models/a%zz", NULL, 400, "TV_E_BAD_REQUEST");
    expect_error("GET", "/v1/models/a%00b", NULL, 400, "TV_E_BAD_REQUEST");
    expect_error("GET", "/v1/models?limit=%0", NULL, 400, "TV_E_BAD_REQUEST");
    /* query: unknown parameter, duplicate, bad limit */
    expect_error("GET", "/v1/models?bogus=1", NULL, 400, "TV_E_BAD_REQUEST");
    expect_error("GET", "/v1/models?limit=1&limit=2", NULL, 400, "TV_E_BAD_REQUEST");
    expect_error("GET", "/v1/models?limit=0", NULL, 400, "TV_E_BAD_REQUEST");
    expect_error("GET", "/v1/models?limit=1001", NULL, 400, "TV_E_BAD_REQUEST");
    expect_error("GET", "/v1/models?limit=01", NULL, 400, "TV_E_BAD_REQUEST");
    expect_error("GET", "/v1/models?limit=x", NULL, 400, "TV_E_BAD_REQUEST");
    expect_error("GET", "/v1/models?cursor=zz", NULL, 400, "TV_E_BAD_REQUEST");
    expect_error("GET", "/v1/models?cursor=m6", NULL, 400, "TV_E_BAD_REQUEST");
    expect_error("GET", "/v1/models?cursor=m00", NULL, 400, "TV_E_BAD_REQUEST");
    /* the openapi document is not embedded in this api */
    expect_error("GET", "/v1/openapi.yaml", NULL, 404, "TV_E_NOT_FOUND");
}

/* ---- devices ---------------------------------------------------------------------- */

static void check_device(json_t *d)
{
    static const char *const ints[] = {"id",           "lba_size",           "io_align",
                                       "object_align", "size_bytes",         "region_offset",
                                       "region_bytes", "data_offset",        "used_bytes",
                                       "free_bytes",   "largest_free_bytes", "n_objects"};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        expect_field(d, ints[i], JSON_INTEGER);
    expect_field(d, "uuid", JSON_STRING);
    expect_field(d, "path", JSON_STRING);
    expect_field(d, "identity", JSON_OBJECT);
    assert_string_equal(json_string_value(json_object_get(d, "kind")), "file");
    assert_string_equal(json_string_value(json_object_get(d, "status")), "ok");
    assert_string_equal(json_string_value(json_object_get(d, "message")), "");
    assert_int_equal(json_integer_value(json_object_get(d, "size_bytes")), 16 * MiB);
    assert_true(json_integer_value(json_object_get(d, "used_bytes")) > 0);
    assert_int_equal(json_integer_value(json_object_get(d, "n_objects")), 3);
}

static void test_devices(void **state)
{
    (void)state;
    tv__api_resp r;
    json_t *j = ok_json(&r, "GET", "/v1/devices", NULL);
    json_t *arr = json_object_get(j, "devices");
    assert_int_equal(json_array_size(arr), 1);
    check_device(json_array_get(arr, 0));
    tv__api_resp_free(&r);
    j = ok_json(&r, "GET", "/v1/devices/1", NULL);
    check_device(j);
    assert_string_equal(r.route, "GET /v1/devices/{id}");
    tv__api_resp_free(&r);
    expect_error("GET", "/v1/devices/2", NULL, 404, "TV_E_NOT_FOUND");
    expect_error("GET", "/v1/devices/abc", NULL, 400, "TV_E_BAD_REQUEST");
    expect_error("GET", "/v1/devices/01", NULL, 400, "TV_E_BAD_REQUEST");
}

/* The extents map tiles the region: label, then objects and free gaps. */
static void test_device_extents(void **state)
{
    (void)state;
    tv__api_resp r;
    json_t *j = ok_json(&r, "GET", "/v1/devices/1/extents", NULL);
    assert_string_equal(r.route, "GET /v1/devices/{id}/extents");
    assert_int_equal(json_integer_value(json_object_get(j, "device_id")), 1);
    json_int_t pos = json_integer_value(json_object_get(j, "region_offset"));
    json_int_t end = pos + json_integer_value(json_object_get(j, "region_bytes"));
    json_t *ex = json_object_get(j, "extents"), *e;
    size_t i, n_objects = 0;
    assert_true(json_array_size(ex) >= 2);
    assert_string_equal(json_string_value(json_object_get(json_array_get(ex, 0), "kind")), "label");
    json_array_foreach(ex, i, e)
    {
        assert_int_equal(json_integer_value(json_object_get(e, "offset")), pos);
        json_int_t bytes = json_integer_value(json_object_get(e, "bytes"));
        assert_true(bytes > 0);
        pos += bytes;
        if (!strcmp(json_string_value(json_object_get(e, "kind")), "object")) {
            n_objects++;
            expect_field(e, "object_id", JSON_INTEGER);
            expect_field(e, "sha256", JSON_STRING);
            expect_field(e, "users", JSON_ARRAY);
            assert_string_equal(json_string_value(json_object_get(e, "state")), "committed");
        }
    }
    assert_int_equal(pos, end);
    assert_int_equal(n_objects, 3);
    tv__api_resp_free(&r);
    expect_error("GET", "/v1/devices/2/extents", NULL, 404, "TV_E_NOT_FOUND");
    expect_error("GET", "/v1/devices/x/extents", NULL, 400, "TV_E_BAD_REQUEST");
    expect_error("GET", "/v1/devices/1/extents?x=1", NULL, 400, "TV_E_BAD_REQUEST");
}

/* ---- models and generations --------------------------------------------------------- */

static void check_model(json_t *m)
{
    expect_field(m, "name", JSON_STRING);
    expect_field(m, "active_generation", JSON_INTEGER);
    expect_field(m, "aliases", JSON_OBJECT);
    expect_field(m, "n_generations", JSON_INTEGER);
    expect_field(m, "created_at", JSON_INTEGER);
}

static void test_models(void **state)
{
    (void)state;
    tv__api_resp r;
    json_t *j = ok_json(&r, "GET", "/v1/models", NULL);
    json_t *arr = json_object_get(j, "models");
    assert_int_equal(json_array_size(arr), 2);
    assert_true(json_is_null(json_object_get(j, "next_cursor")));
    check_model(json_array_get(arr, 0));
    assert_string_equal(json_string_value(json_object_get(json_array_get(arr, 0), "name")), MODEL);
    tv__api_resp_free(&r);
    /* limit=1 walks both, once each, in name order */
    char target[256] = "/v1/models?limit=1";
    const char *want[] = {MODEL, "zeta"};
    for (int i = 0; i < 2; i++) {
        j = ok_json(&r, "GET", target, NULL);
        arr = json_object_get(j, "models");
        assert_int_equal(json_array_size(arr), 1);
        assert_string_equal(json_string_value(json_object_get(json_array_get(arr, 0), "name")),
                            want[i]);
        json_t *next = json_object_get(j, "next_cursor");
        if (i == 0) {
            assert_true(json_is_string(next));
            snprintf(target, sizeof target, "/v1/models?limit=1&cursor=%s",
                     json_string_value(next));
        } else {
            assert_true(json_is_null(next));
        }
        tv__api_resp_free(&r);
    }
    /* one model, its name percent-encoded */
    j = ok_json(&r, "GET", "/v1/models/acme%2Ftiny", NULL);
    check_model(j);
    assert_string_equal(json_string_value(json_object_get(j, "name")), MODEL);
    assert_int_equal(json_integer_value(json_object_get(j, "active_generation")), 2);
    assert_int_equal(json_integer_value(json_object_get(j, "n_generations")), 2);
    assert_string_equal(r.route, "GET /v1/models/{name}");
    tv__api_resp_free(&r);
    expect_error("GET", "/v1/models/acme/tiny", NULL, 404, "TV_E_NOT_FOUND");
    expect_error("GET", "/v1/models/nobody", NULL, 404, "TV_E_NOT_FOUND");
}

static void check_generation(json_t *x, int64_t number, bool active)
{
    assert_string_equal(json_string_value(json_object_get(x, "model")), MODEL);
    assert_int_equal(json_integer_value(json_object_get(x, "generation")), number);
    assert_string_equal(json_string_value(json_object_get(x, "state")), "ready");
    assert_true(json_is_boolean(json_object_get(x, "active")));
    assert_int_equal(json_is_true(json_object_get(x, "active")), active);
    expect_field(x, "aliases", JSON_ARRAY);
    assert_int_equal(json_integer_value(json_object_get(x, "n_shards")), 1);
    assert_int_equal(json_integer_value(json_object_get(x, "n_tensors")), N_TENSORS);
    /* canonical checkpoint bytes: the shard file, as ImportResult counts */
    struct stat sb;
    assert_int_equal(stat(g->ck[0], &sb), 0);
    assert_int_equal(json_integer_value(json_object_get(x, "total_bytes")), sb.st_size);
    expect_field(x, "source", JSON_STRING);
    expect_field(x, "created_at", JSON_INTEGER);
}

static void test_generations(void **state)
{
    (void)state;
    tv__api_resp r;
    json_t *j = ok_json(&r, "GET", "/v1/models/acme%2Ftiny/generations", NULL);
    assert_string_equal(json_string_value(json_object_get(j, "model")), MODEL);
    json_t *arr = json_object_get(j, "generations");
    assert_int_equal(json_array_size(arr), 2);
    check_generation(json_array_get(arr, 0), 1, false);
    check_generation(json_array_get(arr, 1), 2, true);
    assert_null(json_object_get(json_array_get(arr, 0), "shards"));
    assert_true(json_is_null(json_object_get(j, "next_cursor")));
    tv__api_resp_free(&r);
    /* limit=1 walk */
    char target[256] = "/v1/models/acme%2Ftiny/generations?limit=1";
    for (int64_t i = 1; i <= 2; i++) {
        j = ok_json(&r, "GET", target, NULL);
        arr = json_object_get(j, "generations");
        assert_int_equal(json_array_size(arr), 1);
        check_generation(json_array_get(arr, 0), i, i == 2);
        json_t *next = json_object_get(j, "next_cursor");
        assert_int_equal(json_is_string(next), i == 1);
        if (i == 1)
            snprintf(target, sizeof target, "/v1/models/acme%%2Ftiny/generations?limit=1&cursor=%s",
                     json_string_value(next));
        tv__api_resp_free(&r);
    }
    expect_error("GET", "/v1/models/acme%2Ftiny/generations?cursor=m31", NULL, 400,
                 "TV_E_BAD_REQUEST");
    expect_error("GET", "/v1/models/acme%2Ftiny/generations?cursor=g7a", NULL, 400,
                 "TV_E_BAD_REQUEST");
    expect_error("GET", "/v1/models/nobody/generations", NULL, 404, "TV_E_NOT_FOUND");
    /* one generation, with its shards; by number and as "active" */
    const char *specs[] = {"2", "active"};
    for (int i = 0; i < 2; i++) {
        snprintf(target, sizeof target, "/v1/models/acme%%2Ftiny/generations/%s", specs[i]);
        j = ok_json(&r, "GET", target, NULL);
        check_generation(j, 2, true);
        json_t *sh = json_object_get(j, "shards");
        assert_int_equal(json_array_size(sh), 1);
        json_t *s0 = json_array_get(sh, 0);
        assert_int_equal(json_integer_value(json_object_get(s0, "index")), 0);
        assert_string_equal(json_string_value(json_object_get(s0, "name")), "ck2.safetensors");
        expect_field(s0, "file_bytes", JSON_INTEGER);
        expect_field(s0, "header_bytes", JSON_INTEGER);
        assert_int_equal(strlen(json_string_value(json_object_get(s0, "sha256"))), 64);
        json_t *rep = json_array_get(json_object_get(s0, "replicas"), 0);
        assert_int_equal(json_integer_value(json_object_get(rep, "device_id")), 1);
        expect_field(rep, "object_id", JSON_INTEGER);
        expect_field(rep, "device_offset", JSON_INTEGER);
        tv__api_resp_free(&r);
    }
    expect_error("GET", "/v1/models/acme%2Ftiny/generations/3", NULL, 404, "TV_E_NOT_FOUND");
    expect_error("GET", "/v1/models/acme%2Ftiny/generations/01", NULL, 400, "TV_E_BAD_REQUEST");
    expect_error("GET", "/v1/models/acme%2Ftiny/generations/1x", NULL, 400, "TV_E_BAD_REQUEST");
    expect_error("GET", "/v1/models/acme%2Ftiny/generations/prod", NULL, 404, "TV_E_NOT_FOUND");
}

/* ---- tensors ------------------------------------------------------------------------ */

static void check_tensor(json_t *t, size_t i, bool detail)
{
    assert_string_equal(json_string_value(json_object_get(t, "name")), TENSORS[i].name);
    assert_string_equal(json_string_value(json_object_get(t, "dtype")), TENSORS[i].dtype);
    json_t *shape = json_object_get(t, "shape");
    assert_int_equal(json_array_size(shape), 1);
    assert_int_equal(json_integer_value(json_array_get(shape, 0)), TENSORS[i].n_elems);
    expect_field(t, "shard", JSON_STRING);
    assert_int_equal(json_integer_value(json_object_get(t, "shard_index")), 0);
    json_t *offs = json_object_get(t, "data_offsets");
    uint64_t b = tensor_begin(i), n = TENSORS[i].n_elems * TENSORS[i].elem_len;
    assert_int_equal(json_integer_value(json_array_get(offs, 0)), b);
    assert_int_equal(json_integer_value(json_array_get(offs, 1)), b + n);
    assert_int_equal(json_integer_value(json_object_get(t, "nbytes")), n);
    if (!detail) {
        assert_null(json_object_get(t, "file_offset"));
        assert_null(json_object_get(t, "replicas"));
        return;
    }
    expect_field(t, "file_offset", JSON_INTEGER);
    assert_true((uint64_t)json_integer_value(json_object_get(t, "file_offset")) > 8 + b);
    json_t *rep = json_array_get(json_object_get(t, "replicas"), 0);
    assert_int_equal(json_integer_value(json_object_get(rep, "device_id")), 1);
    expect_field(rep, "device_offset", JSON_INTEGER);
}

static void test_tensors(void **state)
{
    (void)state;
    tv__api_resp r;
    json_t *j = ok_json(&r, "GET", "/v1/models/acme%2Ftiny/generations/1/tensors", NULL);
    assert_string_equal(json_string_value(json_object_get(j, "model")), MODEL);
    assert_int_equal(json_integer_value(json_object_get(j, "generation")), 1);
    json_t *arr = json_object_get(j, "tensors");
    assert_int_equal(json_array_size(arr), N_TENSORS);
    for (size_t i = 0; i < N_TENSORS; i++)
        check_tensor(json_array_get(arr, i), i, false);
    assert_true(json_is_null(json_object_get(j, "next_cursor")));
    tv__api_resp_free(&r);
    /* limit=1 walks in file order, by name and by size */
    const char *orders[] = {"file", "name", "size"};
    const size_t by_name[] = {3, 0, 2, 1}; /* "big" "model..." "na\xc3\xafve" "odd 100%" */
    const size_t by_size[] = {3, 0, 2, 1}; /* 300001, 4000, 400, 13 bytes */
    for (int o = 0; o < 3; o++) {
        char target[512];
        snprintf(target, sizeof target,
                 "/v1/models/acme%%2Ftiny/generations/2/tensors?limit=1&order=%s", orders[o]);
        for (size_t i = 0; i < N_TENSORS; i++) {
            j = ok_json(&r, "GET", target, NULL);
            arr = json_object_get(j, "tensors");
            assert_int_equal(json_array_size(arr), 1);
            check_tensor(json_array_get(arr, 0), o == 2 ? by_size[i] : o ? by_name[i] : i, false);
            json_t *next = json_object_get(j, "next_cursor");
            assert_int_equal(json_is_string(next), i + 1 < N_TENSORS);
            if (i + 1 < N_TENSORS)
                snprintf(target, sizeof target,
                         "/v1/models/acme%%2Ftiny/generations/2/tensors?limit=1&order=%s&cursor=%s",
                         orders[o], json_string_value(next));
            tv__api_resp_free(&r);
        }
    }
    /* prefix (percent-encoded, '+' is a space) */
    j = ok_json(&r, "GET", "/v1/models/acme%2Ftiny/generations/2/tensors?prefix=odd+1", NULL);
    arr = json_object_get(j, "tensors");
    assert_int_equal(json_array_size(arr), 1);
    check_tensor(json_array_get(arr, 0), 1, false);
    tv__api_resp_free(&r);
    j = ok_json(&r, "GET", "/v1/models/acme%2Ftiny/generations/2/tensors?prefix=model.embed%2F",
                NULL);
    assert_int_equal(json_array_size(json_object_get(j, "tensors")), 1);
    tv__api_resp_free(&r);
    j = ok_json(&r, "GET", "/v1/models/acme%2Ftiny/generations/2/tensors?prefix=zzz", NULL);
    assert_int_equal(json_array_size(json_object_get(j, "tensors")), 0);
    tv__api_resp_free(&r);
    expect_error("GET", "/v1/models/acme%2Ftiny/generations/2/tensors?order=bogus", NULL, 400,
                 "TV_E_BAD_REQUEST");
    /* a cursor continues the order it was made for, whatever order says:
     * the file-order cursor of the first page gives the same next page in
     * file order under order=name and order=size */
    j = ok_json(&r, "GET", "/v1/models/acme%2Ftiny/generations/2/tensors?limit=1", NULL);
    char target[512], cur[256];
    snprintf(cur, sizeof cur, "%s", json_string_value(json_object_get(j, "next_cursor")));
    tv__api_resp_free(&r);
    snprintf(target, sizeof target,
             "/v1/models/acme%%2Ftiny/generations/2/tensors?limit=1&cursor=%s", cur);
    j = ok_json(&r, "GET", target, NULL);
    char *want = json_dumps(j, JSON_COMPACT);
    tv__api_resp_free(&r);
    static const char *const other[] = {"name", "size"};
    for (size_t i = 0; i < 2; i++) {
        snprintf(target, sizeof target,
                 "/v1/models/acme%%2Ftiny/generations/2/tensors?limit=1&order=%s&cursor=%s",
                 other[i], cur);
        j = ok_json(&r, "GET", target, NULL);
        char *got = json_dumps(j, JSON_COMPACT);
        assert_string_equal(got, want);
        free(got);
        tv__api_resp_free(&r);
    }
    free(want);
    /* a cursor of a kind no order makes is malformed */
    expect_error("GET", "/v1/models/acme%2Ftiny/generations/2/tensors?cursor=m31", NULL, 400,
                 "TV_E_BAD_REQUEST");
    /* size cursors: "s" + hex("NBYTES:NAME"), canonical NBYTES, a name */
    const char *bad_size[] = {"s616263", "s30313a78", "s353a", "s3a78", "s2d313a78"};
    for (size_t i = 0; i < sizeof bad_size / sizeof bad_size[0]; i++) {
        snprintf(target, sizeof target,
                 "/v1/models/acme%%2Ftiny/generations/2/tensors?order=size&cursor=%s", bad_size[i]);
        expect_error("GET", target, NULL, 400, "TV_E_BAD_REQUEST");
    }
    /* "4000:model.embed/weight" -> the two smaller ones */
    j = ok_json(
        &r, "GET",
        "/v1/models/acme%2Ftiny/generations/2/tensors?order=size&cursor=s343030303a6d6f64656c2e656d6265642f776569676874",
        NULL);
    arr = json_object_get(j, "tensors");
    assert_int_equal(json_array_size(arr), 2);
    check_tensor(json_array_get(arr, 0), 2, false);
    check_tensor(json_array_get(arr, 1), 1, false);
    tv__api_resp_free(&r);

    /* one tensor per encoded name */
    const char *enc[] = {"model.embed%2Fweight", "odd%20100%25", "na%C3%AFve", "big"};
    for (size_t i = 0; i < N_TENSORS; i++) {
        snprintf(target, sizeof target, "/v1/models/acme%%2Ftiny/generations/active/tensors/%s",
                 enc[i]);
        j = ok_json(&r, "GET", target, NULL);
        check_tensor(j, i, true);
        assert_string_equal(r.route, "GET /v1/models/{name}/generations/{gen}/tensors/{tensor}");
        tv__api_resp_free(&r);
    }
    expect_error("GET", "/v1/models/acme%2Ftiny/generations/2/tensors/model.embed/weight", NULL,
                 404, "TV_E_NOT_FOUND");
    expect_error("GET", "/v1/models/acme%2Ftiny/generations/2/tensors/nope", NULL, 404,
                 "TV_E_NOT_FOUND");
}

/* ---- tensor bytes ------------------------------------------------------------------- */

static void expect_bytes(const tv__api_resp *r, size_t t, unsigned seed, uint64_t off, uint64_t len)
{
    uint64_t b = tensor_begin(t);
    uint8_t *got = (uint8_t *)r->body;
    uint8_t *streamed = NULL;
    if (r->stream) {
        assert_null(r->body);
        assert_int_equal(r->stream_len, len);
        streamed = malloc(len ? len : 1);
        uint64_t pos = 0;
        while (pos < len) {
            ssize_t n = tv__api_stream_read((tv__api_resp *)r, pos, streamed + pos, 100000);
            assert_true(n > 0 && n <= 100000);
            pos += (uint64_t)n;
        }
        assert_int_equal(tv__api_stream_read((tv__api_resp *)r, len, streamed, 16), 0);
        got = streamed;
    } else {
        assert_int_equal(r->body_len, len);
    }
    for (uint64_t i = 0; i < len; i++)
        if (got[i] != tv_test_shard_byte(b + off + i, seed))
            fail_msg("tensor %zu byte %" PRIu64 ": %u", t, off + i, got[i]);
    free(streamed);
}

static int data(tv__api_resp *r, size_t t, const char *gen, const rq *x)
{
    const char *enc[] = {"model.embed%2Fweight", "odd%20100%25", "na%C3%AFve", "big"};
    char target[512];
    snprintf(target, sizeof target, "/v1/models/acme%%2Ftiny/generations/%s/tensors/%s/data", gen,
             enc[t]);
    return call(r, "GET", target, x);
}

static void test_data(void **state)
{
    (void)state;
    tv__api_resp r;
    for (size_t t = 0; t < N_TENSORS; t++) {
        uint64_t n = TENSORS[t].n_elems * TENSORS[t].elem_len;
        assert_int_equal(data(&r, t, "1", NULL), 200);
        assert_string_equal(r.content_type, "application/octet-stream");
        assert_non_null(strstr(r.headers, "Accept-Ranges: bytes\r\n"));
        assert_non_null(strstr(r.headers, "ETag: \""));
        expect_bytes(&r, t, 1, 0, n);
        tv__api_resp_free(&r);
        assert_int_equal(data(&r, t, "active", NULL), 200);
        expect_bytes(&r, t, 2, 0, n);
        tv__api_resp_free(&r);
    }
    /* ranges on the F32 tensor of 4000 bytes */
    struct {
        const char *h;
        int status;
        uint64_t off, len;
    } cases[] = {
        {"bytes=0-0", 206, 0, 1},
        {"bytes=3-10", 206, 3, 8},
        {"bytes=4001-4001", 416, 0, 0},
        {"bytes=3999-5000", 206, 3999, 1},
        {"bytes=1001-", 206, 1001, 2999},
        {"bytes=-7", 206, 3993, 7},
        {"bytes=-9999", 206, 0, 4000},
        {"bytes=4000-", 416, 0, 0},
        {"bytes=-0", 416, 0, 0},
        {"bytes=9-3", 416, 0, 0},
        {"bytes=x-3", 416, 0, 0},
        {"bytes=1-2,5-6", 200, 0, 4000},
        {"items=1-2", 200, 0, 4000},
        {"bytes = 5-6", 206, 5, 2},
        {"bytes=99999999999999999999999-", 416, 0, 0},
        {"bytes=5-99999999999999999999999", 206, 5, 3995},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        rq x = {.range = cases[i].h};
        int st = data(&r, 0, "1", &x);
        if (st != cases[i].status)
            fail_msg("Range '%s': %d, want %d", cases[i].h, st, cases[i].status);
        if (st == 416) {
            assert_string_equal(err_code(&r), "TV_E_RANGE");
            assert_non_null(strstr(r.headers, "Content-Range: bytes */4000\r\n"));
        } else {
            expect_bytes(&r, 0, 1, cases[i].off, cases[i].len);
            char cr[96];
            snprintf(cr, sizeof cr, "Content-Range: bytes %" PRIu64 "-%" PRIu64 "/4000\r\n",
                     cases[i].off, cases[i].off + cases[i].len - 1);
            assert_int_equal(strstr(r.headers, cr) != NULL, st == 206);
        }
        tv__api_resp_free(&r);
    }
    /* unaligned range in the odd-length U8 tensor and the one after it */
    rq x = {.range = "bytes=5-11"};
    assert_int_equal(data(&r, 1, "2", &x), 206);
    expect_bytes(&r, 1, 2, 5, 7);
    tv__api_resp_free(&r);
    x.range = "bytes=1-397";
    assert_int_equal(data(&r, 2, "2", &x), 206);
    expect_bytes(&r, 2, 2, 1, 397);
    tv__api_resp_free(&r);
    /* ETag and If-None-Match */
    assert_int_equal(data(&r, 0, "1", NULL), 200);
    char etag[160];
    const char *e = strstr(r.headers, "ETag: ");
    assert_non_null(e);
    snprintf(etag, sizeof etag, "%.*s", (int)strcspn(e + 6, "\r"), e + 6);
    tv__api_resp_free(&r);
    assert_int_equal(strlen(etag), 2 + 64 + strlen(":0-4000"));
    assert_non_null(strstr(etag, ":0-4000\""));
    x = (rq){.inm = etag};
    assert_int_equal(data(&r, 0, "1", &x), 304);
    assert_null(r.body);
    assert_null(r.json);
    /* the 200's length (the transport's Content-Length), never read */
    assert_true(r.stream);
    assert_int_equal(r.stream_len, 4000);
    tv__api_resp_free(&r);
    char list[256];
    snprintf(list, sizeof list, "\"other\", W/%s", etag);
    x = (rq){.inm = list};
    assert_int_equal(data(&r, 0, "1", &x), 304);
    tv__api_resp_free(&r);
    x = (rq){.inm = "\"other\""};
    assert_int_equal(data(&r, 0, "1", &x), 200);
    tv__api_resp_free(&r);
    x = (rq){.inm = "*"};
    assert_int_equal(data(&r, 0, "2", &x), 304);
    tv__api_resp_free(&r);
    /* generation 2's ETag differs (other shard hash) */
    assert_int_equal(data(&r, 0, "2", NULL), 200);
    assert_null(strstr(r.headers, etag));
    tv__api_resp_free(&r);

    /* streamed bodies: a low threshold sends everything through
     * tv__api_stream_read in 100000-byte pieces */
    uint64_t saved = tv__api_whole_body_max;
    tv__api_whole_body_max = 1000;
    assert_int_equal(data(&r, 3, "1", NULL), 200);
    assert_true(r.stream);
    expect_bytes(&r, 3, 1, 0, 300001);
    tv__api_resp_free(&r);
    x = (rq){.range = "bytes=12345-212345"};
    assert_int_equal(data(&r, 3, "2", &x), 206);
    expect_bytes(&r, 3, 2, 12345, 200001);
    tv__api_resp_free(&r);
    tv__api_whole_body_max = saved;

    expect_error("GET", "/v1/models/acme%2Ftiny/generations/3/tensors/big/data", NULL, 404,
                 "TV_E_NOT_FOUND");
    expect_error("GET", "/v1/models/acme%2Ftiny/generations/1/tensors/nope/data", NULL, 404,
                 "TV_E_NOT_FOUND");
}

/* ---- mutations ---------------------------------------------------------------------- */

static int64_t active_gen(void)
{
    tv__api_resp r;
    json_t *j = ok_json(&r, "GET", "/v1/models/acme%2Ftiny", NULL);
    int64_t a = json_integer_value(json_object_get(j, "active_generation"));
    tv__api_resp_free(&r);
    return a;
}

/* The generation a route under .../generations/active reads: the tensor
 * routes take its row through the reader pool's cache, which must follow
 * every change the writer commits (asked twice, so the second answer comes
 * from the cache). */
static int64_t active_route_gen(void)
{
    int64_t n = 0;
    for (int i = 0; i < 2; i++) {
        tv__api_resp r;
        json_t *j =
            ok_json(&r, "GET", "/v1/models/acme%2Ftiny/generations/active/tensors?limit=1", NULL);
        int64_t k = json_integer_value(json_object_get(j, "generation"));
        assert_true(i == 0 || k == n);
        n = k;
        tv__api_resp_free(&r);
    }
    return n;
}

static void test_generation_changes(void **state)
{
    (void)state;
    tv__api_resp r;
    json_t *j = ok_json(&r, "POST", "/v1/models/acme%2Ftiny/generations/1/activate", NULL);
    check_generation(j, 1, true);
    tv__api_resp_free(&r);
    assert_int_equal(active_gen(), 1);
    assert_int_equal(active_route_gen(), 1);
    expect_error("POST", "/v1/models/acme%2Ftiny/rollback", NULL, 409, "TV_E_CONFLICT");
    j = ok_json(&r, "POST", "/v1/models/acme%2Ftiny/generations/2/activate", &(rq){.body = "{}"});
    check_generation(j, 2, true);
    tv__api_resp_free(&r);
    assert_int_equal(active_route_gen(), 2);
    j = ok_json(&r, "POST", "/v1/models/acme%2Ftiny/rollback", NULL);
    check_generation(j, 1, true);
    tv__api_resp_free(&r);
    assert_int_equal(active_gen(), 1);
    assert_int_equal(active_route_gen(), 1);
    /* "active" as an alias PUT activates; removing it is refused */
    j = ok_json(&r, "PUT", "/v1/models/acme%2Ftiny/aliases/active",
                &(rq){.body = "{\"generation\":2}"});
    assert_string_equal(json_string_value(json_object_get(j, "model")), MODEL);
    assert_string_equal(json_string_value(json_object_get(j, "alias")), "active");
    assert_int_equal(json_integer_value(json_object_get(j, "generation")), 2);
    tv__api_resp_free(&r);
    assert_int_equal(active_gen(), 2);
    assert_int_equal(active_route_gen(), 2);
    expect_error("DELETE", "/v1/models/acme%2Ftiny/aliases/active", NULL, 400, "TV_E_BAD_REQUEST");
    expect_error("PUT", "/v1/models/acme%2Ftiny/aliases/9bad", &(rq){.body = "{\"generation\":1}"},
                 400, "TV_E_NAME");
    expect_error("PUT", "/v1/models/acme%2Ftiny/aliases/prod", &(rq){.body = "{\"generation\":0}"},
                 400, "TV_E_BAD_REQUEST");
    expect_error("PUT", "/v1/models/acme%2Ftiny/aliases/prod",
                 &(rq){.body = "{\"generation\":\"1\"}"}, 400, "TV_E_BAD_REQUEST");
    expect_error("PUT", "/v1/models/acme%2Ftiny/aliases/prod", &(rq){.body = "{}"}, 400,
                 "TV_E_BAD_REQUEST");
    j = ok_json(&r, "GET", "/v1/models/acme%2Ftiny/aliases", NULL);
    assert_string_equal(json_string_value(json_object_get(j, "model")), MODEL);
    expect_field(j, "aliases", JSON_ARRAY);
    tv__api_resp_free(&r);
    /* retire: the active one is a conflict, the other works, then cannot be activated */
    expect_error("POST", "/v1/models/acme%2Ftiny/generations/2/retire", NULL, 409, "TV_E_STATE");
    j = ok_json(&r, "POST", "/v1/models/acme%2Ftiny/generations/1/retire", NULL);
    assert_string_equal(json_string_value(json_object_get(j, "state")), "retired");
    assert_false(json_is_true(json_object_get(j, "active")));
    tv__api_resp_free(&r);
    expect_error("POST", "/v1/models/acme%2Ftiny/generations/1/activate", NULL, 409, "TV_E_STATE");
    expect_error("POST", "/v1/models/acme%2Ftiny/generations/9/activate", NULL, 404,
                 "TV_E_NOT_FOUND");
    expect_error("POST", "/v1/models/acme%2Ftiny/generations/2/activate",
                 &(rq){.body = "{\"x\":1}"}, 400, "TV_E_BAD_REQUEST");
    /* the retired generation's bytes are still served (its snapshot is kept) */
    tv__api_resp rr;
    assert_int_equal(data(&rr, 1, "1", NULL), 200);
    expect_bytes(&rr, 1, 1, 0, 13);
    tv__api_resp_free(&rr);
    /* gc frees its object although the data route just read it (the pooled
     * handle's lease is dropped first); then the bytes are gone */
    j = ok_json(&r, "POST", "/v1/gc", NULL);
    assert_int_equal(json_integer_value(json_object_get(j, "n_objects_freed")), 1);
    assert_true(json_integer_value(json_object_get(j, "freed_bytes")) > 0);
    tv__api_resp_free(&r);
    int st = data(&rr, 1, "1", NULL);
    assert_true(st == 404 || st == 409);
    tv__api_resp_free(&rr);
    j = ok_json(&r, "GET", "/v1/models/acme%2Ftiny/generations/1", NULL);
    assert_string_equal(json_string_value(json_object_get(j, "state")), "retired");
    tv__api_resp_free(&r);
}

/* ---- bodies ------------------------------------------------------------------------- */

static void test_bodies(void **state)
{
    (void)state;
    const char *t = "/v1/tokens";
    expect_error("POST", t, &(rq){.body = "not json"}, 400, "TV_E_BAD_REQUEST");
    expect_error("POST", t, &(rq){.body = "[1,2]"}, 400, "TV_E_BAD_REQUEST");
    expect_error("POST", t, &(rq){.body = "\"x\""}, 400, "TV_E_BAD_REQUEST");
    expect_error("POST", t, NULL, 400, "TV_E_BAD_REQUEST");
    expect_error("POST", t, &(rq){.body = "{\"name\":\"a\",\"scope\":\"read\",\"x\":1}"}, 400,
                 "TV_E_BAD_REQUEST");
    expect_error("POST", t, &(rq){.body = "{\"name\":1,\"scope\":\"read\"}"}, 400,
                 "TV_E_BAD_REQUEST");
    expect_error("POST", t, &(rq){.body = "{\"name\":\"a\",\"scope\":\"root\"}"}, 400,
                 "TV_E_BAD_REQUEST");
    expect_error("POST", t, &(rq){.body = "{\"name\":\"a\",\"name\":\"b\",\"scope\":\"read\"}"},
                 400, "TV_E_BAD_REQUEST");
    expect_error("POST", t,
                 &(rq){.body = "{\"name\":\"a\",\"scope\":\"read\"}", .ctype = "text/plain"}, 400,
                 "TV_E_BAD_REQUEST");
    size_t big = TV__API_MAX_BODY_DEFAULT + 1;
    char *b = malloc(big + 1);
    assert_non_null(b);
    memset(b, ' ', big);
    b[0] = '{';
    b[big - 1] = '}';
    b[big] = '\0';
    expect_error("POST", t, &(rq){.body = b}, 413, "TV_E_TOO_LARGE");
    free(b);
    /* the error text names the field */
    tv__api_resp r;
    call(&r, "POST", t, &(rq){.body = "{\"name\":true,\"scope\":\"read\"}"});
    assert_non_null(strstr(
        json_string_value(json_object_get(json_object_get(r.json, "error"), "message")), "'name'"));
    tv__api_resp_free(&r);
}

/* ---- authorisation ------------------------------------------------------------------ */

static void test_auth(void **state)
{
    (void)state;
    tv__api_resp r;
    /* anonymous reads from loopback (the default), not from elsewhere */
    json_t *j = ok_json(&r, "GET", "/v1/models", &(rq){.untrusted = true});
    assert_int_equal(json_array_size(json_object_get(j, "models")), 2);
    tv__api_resp_free(&r);
    assert_int_equal(call(&r, "GET", "/v1/models", &(rq){.untrusted = true, .remote = true}), 401);
    assert_string_equal(err_code(&r), "TV_E_UNAUTHORIZED");
    assert_non_null(strstr(r.headers, "WWW-Authenticate: Bearer\r\n"));
    tv__api_resp_free(&r);
    /* health needs nothing, from anywhere */
    assert_int_equal(call(&r, "GET", "/healthz", &(rq){.untrusted = true, .remote = true}), 200);
    tv__api_resp_free(&r);
    /* admin routes need a token even from loopback */
    const char *admin[][2] = {{"POST", "/v1/gc"},
                              {"GET", "/v1/tokens"},
                              {"POST", "/v1/models/acme%2Ftiny/rollback"},
                              {"DELETE", "/v1/models/zeta"},
                              {"POST", "/v1/imports"}};
    for (size_t i = 0; i < sizeof admin / sizeof admin[0]; i++) {
        expect_error(admin[i][0], admin[i][1], &(rq){.untrusted = true}, 401, "TV_E_UNAUTHORIZED");
        expect_error(
            admin[i][0], admin[i][1],
            &(rq){
                .untrusted = true,
                .auth =
                    "Bearer tvk_0000000000000000000000000000000000000000000000000000000000000000"},
            401, "TV_E_UNAUTHORIZED");
        expect_error(admin[i][0], admin[i][1], &(rq){.untrusted = true, .auth = "Basic eDp5"}, 401,
                     "TV_E_UNAUTHORIZED");
    }
    /* an invalid token is refused on a read route too, even where anonymous
     * reads are allowed */
    expect_error("GET", "/v1/models", &(rq){.untrusted = true, .auth = "Bearer nope"}, 401,
                 "TV_E_UNAUTHORIZED");
    expect_error("GET", "/v1/models", &(rq){.untrusted = true, .auth = "Bearer"}, 401,
                 "TV_E_UNAUTHORIZED");
}

/* Test hook of the read engine: EIO for every device read at or past
 * g_fault_from (UINT64_MAX: off). */
static _Atomic uint64_t g_fault_from = UINT64_MAX;
static void eio_from(uint32_t dev, uint64_t off, size_t len, int64_t *res)
{
    (void)dev;
    if (off + len > g_fault_from)
        *res = -EIO;
}

/* ---- content-addressed blobs ------------------------------------------------------- */

/* The checkpoint file whose bytes have sha256 hex (one of ck[0], ck[1], ckz). */
static uint8_t *blob_file(const char *hex, size_t *len)
{
    const char *files[] = {g->ck[0], g->ck[1], g->ckz};
    for (size_t i = 0; i < 3; i++) {
        uint8_t *b = tv_test_read_file(files[i], len);
        assert_non_null(b);
        tv__sha256 h;
        uint8_t d[32];
        char x[65];
        assert_int_equal(tv__sha256_init(&h), 0);
        tv__sha256_update(&h, b, *len);
        tv__sha256_final(&h, d);
        tv__sha256_free(&h);
        tv__reg_sha256_hex(d, x);
        if (!strcmp(x, hex))
            return b;
        free(b);
    }
    fail_msg("no checkpoint file has sha256 %s", hex);
    return NULL;
}

static void test_blobs(void **state)
{
    (void)state;
    tv_error err = {0};
    tv__reg_object *objs = NULL;
    size_t n = 0;
    assert_int_equal(tv__reg_objects_list_committed(g->s.st->reg, 0, &objs, &n, &err), 0);
    assert_int_equal(n, 3);
    char tok[3][TV__TOKEN_SECRET_LEN + 1], auth[3][256];
    const tv__scope scopes[3] = {TV__SCOPE_READ, TV__SCOPE_FLEET, TV__SCOPE_ADMIN};
    for (int i = 0; i < 3; i++) {
        tv__reg_token t;
        assert_int_equal(tv__reg_token_create(g->s.st->reg, "t", scopes[i], tok[i], &t, &err), 0);
        assert_int_equal(t.scope, scopes[i]);
        snprintf(auth[i], sizeof auth[i], "Bearer %s", tok[i]);
    }
    const char *hex = objs[0].sha256;
    char path[160], etag[TV__REG_SHA256_HEX_LEN + 32];
    snprintf(path, sizeof path, "/v1/blobs/sha256:%s", hex);
    snprintf(etag, sizeof etag, "ETag: \"sha256:%s\"\r\n", hex);
    size_t flen = 0;
    uint8_t *file = blob_file(hex, &flen);
    assert_int_equal(flen, objs[0].canonical_len);
    tv__api_resp r;

    /* the auth matrix: none / read / fleet / admin, loopback and remote */
    const char *targets[] = {path, "/v1/blobs"};
    for (int remote = 0; remote < 2; remote++)
        for (size_t k = 0; k < 2; k++) {
            expect_error("GET", targets[k], &(rq){.untrusted = true, .remote = remote}, 401,
                         "TV_E_UNAUTHORIZED");
            expect_error("GET", targets[k],
                         &(rq){.untrusted = true, .remote = remote, .auth = auth[0]}, 403,
                         "TV_E_FORBIDDEN");
            for (int i = 1; i < 3; i++) {
                assert_int_equal(call(&r, "GET", targets[k],
                                      &(rq){.untrusted = true, .remote = remote, .auth = auth[i]}),
                                 200);
                tv__api_resp_free(&r);
            }
        }
    /* a fleet token may call nothing else, from anywhere */
    rq fl = {.untrusted = true, .auth = auth[1]};
    expect_error("GET", "/v1/models", &fl, 403, "TV_E_FORBIDDEN");
    expect_error("GET", "/v1/status", &fl, 403, "TV_E_FORBIDDEN");
    expect_error("POST", "/v1/gc", &fl, 403, "TV_E_FORBIDDEN");
    expect_error("GET", "/v1/tokens", &fl, 403, "TV_E_FORBIDDEN");
    assert_int_equal(call(&r, "GET", "/v1/models", &fl), 403);
    assert_non_null(
        strstr(json_string_value(json_object_get(json_object_get(r.json, "error"), "message")),
               "only the blob routes"));
    tv__api_resp_free(&r);
    /* trusted (local mode) is admin */
    assert_int_equal(call(&r, "GET", path, NULL), 200);
    tv__api_resp_free(&r);

    /* the whole blob: route, headers, bytes */
    rq a = {.untrusted = true, .remote = true, .auth = auth[1]};
    assert_int_equal(call(&r, "GET", path, &a), 200);
    assert_string_equal(r.route, "GET /v1/blobs/{digest}");
    assert_string_equal(r.content_type, "application/octet-stream");
    assert_non_null(strstr(r.headers, etag));
    assert_non_null(strstr(r.headers, "Accept-Ranges: bytes\r\n"));
    assert_int_equal(r.body_len, flen);
    assert_memory_equal(r.body, file, flen);
    tv__api_resp_free(&r);
    /* HEAD: the same headers, the length as a stream nothing reads */
    assert_int_equal(call(&r, "HEAD", path, &a), 200);
    assert_string_equal(r.route, "GET /v1/blobs/{digest}");
    assert_non_null(strstr(r.headers, etag));
    assert_null(r.body);
    assert_true(r.stream);
    assert_int_equal(r.stream_len, flen);
    tv__api_resp_free(&r);
    /* ranges: first byte, last, a span crossing 4096, suffix, open end */
    struct {
        const char *h;
        uint64_t off, len;
    } rg[] = {{"bytes=0-0", 0, 1},
              {"bytes=-1", flen - 1, 1},
              {"bytes=4090-4101", 4090, 12},
              {"bytes=-100", flen - 100, 100},
              {"bytes=5000-", 5000, flen - 5000},
              {"bytes=10-999999999", 10, flen - 10}};
    for (size_t i = 0; i < sizeof rg / sizeof rg[0]; i++) {
        a.range = rg[i].h;
        assert_int_equal(call(&r, "GET", path, &a), 206);
        char cr[96];
        snprintf(cr, sizeof cr, "Content-Range: bytes %" PRIu64 "-%" PRIu64 "/%zu\r\n", rg[i].off,
                 rg[i].off + rg[i].len - 1, flen);
        assert_non_null(strstr(r.headers, cr));
        assert_int_equal(r.body_len, rg[i].len);
        assert_memory_equal(r.body, file + rg[i].off, rg[i].len);
        tv__api_resp_free(&r);
    }
    a.range = "bytes=999999999-";
    assert_int_equal(call(&r, "GET", path, &a), 416);
    char cr[64];
    snprintf(cr, sizeof cr, "Content-Range: bytes */%zu\r\n", flen);
    assert_non_null(strstr(r.headers, cr));
    assert_string_equal(err_code(&r), "TV_E_RANGE");
    tv__api_resp_free(&r);
    a.range = "bytes=0-1,5-6";
    assert_int_equal(call(&r, "GET", path, &a), 200);
    assert_int_equal(r.body_len, flen);
    tv__api_resp_free(&r);
    a.range = NULL;
    char inm[80];
    snprintf(inm, sizeof inm, "\"sha256:%s\"", hex);
    a.inm = inm;
    assert_int_equal(call(&r, "GET", path, &a), 304);
    assert_true(r.stream);
    assert_int_equal(r.stream_len, flen);
    tv__api_resp_free(&r);
    a.inm = NULL;
    /* streamed (the whole-body limit lowered): same bytes, piece by piece */
    uint64_t saved = tv__api_whole_body_max;
    tv__api_whole_body_max = 1000;
    assert_int_equal(call(&r, "GET", path, &a), 200);
    assert_true(r.stream);
    assert_int_equal(r.stream_len, flen);
    uint8_t *got = malloc(flen);
    assert_non_null(got);
    for (uint64_t pos = 0; pos < flen;) {
        ssize_t k = tv__api_stream_read(&r, pos, got + pos, 3000);
        assert_true(k > 0);
        pos += (uint64_t)k;
    }
    assert_memory_equal(got, file, flen);
    assert_int_equal(tv__api_stream_read(&r, flen, got, 10), 0);
    tv__api_resp_free(&r);
    /* a device read error mid-stream fails that read (the transport then
     * ends the connection: never a short body that looks complete); on a
     * body read whole, the request fails before any header is sent */
    assert_int_equal(call(&r, "GET", path, &a), 200);
    assert_true(r.stream);
    g_fault_from = objs[0].base_off + 4096;
    tv__io_fault = eio_from;
    assert_true(tv__api_stream_read(&r, 0, got, 4096) == 4096);
    assert_true(tv__api_stream_read(&r, 4096, got, 4096) < 0);
    tv__api_resp_free(&r);
    tv__api_whole_body_max = saved;
    assert_int_equal(call(&r, "GET", path, &a), 500);
    assert_false(r.stream);
    tv__api_resp_free(&r);
    tv__io_fault = NULL;
    g_fault_from = UINT64_MAX;
    free(got);

    /* bad digests, unknown blob, query */
    const char *bad[] = {
        "/v1/blobs/abc",
        "/v1/blobs/sha512:00",
        "/v1/blobs/sha256:",
        "/v1/blobs/SHA256:0000000000000000000000000000000000000000000000000000000000000000",
        "/v1/blobs/sha256:000000000000000000000000000000000000000000000000000000000000000",
        "/v1/blobs/sha256:00000000000000000000000000000000000000000000000000000000000000000",
        "/v1/blobs/sha256:000000000000000000000000000000000000000000000000000000000000000A",
        "/v1/blobs/sha256:000000000000000000000000000000000000000000000000000000000000000g"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        expect_error("GET", bad[i], &a, 400, "TV_E_BAD_REQUEST");
    expect_error(
        "GET", "/v1/blobs/sha256:0000000000000000000000000000000000000000000000000000000000000000",
        &a, 404, "TV_E_NOT_FOUND");
    expect_error(
        "HEAD", "/v1/blobs/sha256:0000000000000000000000000000000000000000000000000000000000000000",
        &a, 404, "TV_E_NOT_FOUND");
    char q[200];
    snprintf(q, sizeof q, "%s?x=1", path);
    expect_error("GET", q, &a, 400, "TV_E_BAD_REQUEST");
    expect_error("POST", path, &a, 405, "TV_E_BAD_REQUEST");

    /* the listing: pages of one cover every blob once, in hash order */
    char target[300] = "/v1/blobs?limit=1";
    char seen[3][65];
    size_t n_seen = 0;
    for (;;) {
        json_t *j = ok_json(&r, "GET", target, &a);
        assert_string_equal(r.route, "GET /v1/blobs");
        json_t *bl = json_object_get(j, "blobs");
        assert_true(json_array_size(bl) <= 1);
        if (json_array_size(bl)) {
            json_t *b = json_array_get(bl, 0);
            assert_int_equal(json_object_size(b), 3);
            const char *dg = json_string_value(json_object_get(b, "digest"));
            assert_non_null(dg);
            assert_memory_equal(dg, "sha256:", 7);
            assert_true(n_seen < 3);
            snprintf(seen[n_seen], sizeof seen[n_seen], "%s", dg + 7);
            if (n_seen)
                assert_true(strcmp(seen[n_seen - 1], seen[n_seen]) < 0);
            size_t bl_len = 0;
            free(blob_file(seen[n_seen], &bl_len));
            assert_int_equal(json_integer_value(json_object_get(b, "bytes")), bl_len);
            assert_int_equal(json_integer_value(json_object_get(b, "n_replicas")), 1);
            n_seen++;
        }
        json_t *nc = json_object_get(j, "next_cursor");
        if (json_is_null(nc)) {
            tv__api_resp_free(&r);
            break;
        }
        snprintf(target, sizeof target, "/v1/blobs?limit=1&cursor=%s", json_string_value(nc));
        tv__api_resp_free(&r);
    }
    assert_int_equal(n_seen, 3);
    expect_error("GET", "/v1/blobs?cursor=m00", &a, 400, "TV_E_BAD_REQUEST");
    expect_error("GET", "/v1/blobs?limit=0", &a, 400, "TV_E_BAD_REQUEST");
    expect_error("GET", "/v1/blobs?model=x", &a, 400, "TV_E_BAD_REQUEST");
    /* REST token creation takes the fleet scope */
    json_t *j =
        ok_json(&r, "POST", "/v1/tokens", &(rq){.body = "{\"name\":\"peer\",\"scope\":\"fleet\"}"});
    assert_string_equal(json_string_value(json_object_get(j, "scope")), "fleet");
    tv__api_resp_free(&r);
    expect_error("POST", "/v1/tokens", &(rq){.body = "{\"name\":\"p\",\"scope\":\"root\"}"}, 400,
                 "TV_E_BAD_REQUEST");
    free(file);
    free(objs);
}

/* ---- fast-path sessions ------------------------------------------------------------ */

/* No fast path in this api (fp NULL, as with fastpath.enabled = false): an
 * empty list, a read route (auth as any GET), no query parameters. */
static void test_sessions_without_fastpath(void **state)
{
    (void)state;
    tv__api_resp r;
    json_t *j = ok_json(&r, "GET", "/v1/sessions", NULL);
    assert_string_equal(r.route, "GET /v1/sessions");
    assert_true(json_is_array(json_object_get(j, "sessions")));
    assert_int_equal(json_array_size(json_object_get(j, "sessions")), 0);
    /* and the memory tier's figures: off, zeros */
    json_t *tier = json_object_get(j, "tier");
    assert_true(json_is_false(json_object_get(tier, "enabled")));
    assert_int_equal(json_integer_value(json_object_get(tier, "resident_bytes")), 0);
    assert_int_equal(json_object_size(j), 2);
    tv__api_resp_free(&r);
    j = ok_json(&r, "GET", "/v1/sessions", &(rq){.untrusted = true});
    assert_int_equal(json_array_size(json_object_get(j, "sessions")), 0);
    tv__api_resp_free(&r);
    expect_error("GET", "/v1/sessions", &(rq){.untrusted = true, .remote = true}, 401,
                 "TV_E_UNAUTHORIZED");
    expect_error("GET", "/v1/sessions?limit=3", NULL, 400, "TV_E_BAD_REQUEST");
    assert_int_equal(call(&r, "POST", "/v1/sessions", NULL), 405);
    tv__api_resp_free(&r);
}

/* The Session renderer on a listing as tv__fp_sessions gives it. */
static void test_session_json(void **state)
{
    (void)state;
    tv__fp_handle_info h[2] = {
        {.handle = 1,
         .model = "demo",
         .spec = "demo@prod",
         .generation = 2,
         .bytes_delivered = 123,
         .view_bytes = 65536,
         .stalled = true},
        {.handle = 3, .model = "acme/tiny", .spec = "acme/tiny", .generation = 7}};
    tv__fp_session_info s = {.id = 3,
                             .pid = 1234,
                             .uid = 1000,
                             .gid = 1001,
                             .connected_unix = 1796130000, /* 2026-12-01T13:00:00Z */
                             .bytes_delivered = 123,
                             .requests_done = 9,
                             .slots_held = 2,
                             .view_bytes = 65536,
                             .version = 3,
                             .n_handles = 2,
                             .handles = h};
    json_t *j = tv__api_session_json(&s);
    assert_non_null(j);
    char *text = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
    assert_string_equal(
        text, "{\"bytes_delivered\":123,\"connected\":\"2026-12-01T13:00:00Z\",\"gid\":1001,"
              "\"handles\":[{\"bytes_delivered\":123,\"generation\":2,\"handle\":1,\"legacy\":"
              "false,\"model\":\"demo\",\"spec\":\"demo@prod\",\"stalled\":true,\"view_bytes\":"
              "65536},{\"bytes_delivered\":0,\"generation\":7,\"handle\":3,\"legacy\":false,"
              "\"model\":\"acme/tiny\",\"spec\":\"acme/tiny\",\"stalled\":false,\"view_bytes\":0}],"
              "\"id\":3,\"pid\":1234,\"protocol_version\":3,\"requests_done\":9,\"slots_held\":2,"
              "\"uid\":1000,\"view_bytes\":65536}");
    free(text);
    json_decref(j);
    s.n_handles = 0;
    s.handles = NULL;
    j = tv__api_session_json(&s);
    assert_int_equal(json_array_size(json_object_get(j, "handles")), 0);
    json_decref(j);
}

/* ---- jobs (inline: local mode) --------------------------------------------------- */

static void check_job(json_t *j, const char *kind, const char *state)
{
    static const char *const ints[] = {"id", "bytes_done", "bytes_total", "created_at"};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        expect_field(j, ints[i], JSON_INTEGER);
    assert_string_equal(json_string_value(json_object_get(j, "kind")), kind);
    assert_string_equal(json_string_value(json_object_get(j, "state")), state);
    expect_field(j, "activate", JSON_TRUE);
    expect_field(j, "strict", JSON_TRUE);
    assert_true(json_is_number(json_object_get(j, "rate_bytes_per_s")));
    static const char *const nullable[] = {"model",       "source", "alias",      "step",
                                           "eta_seconds", "error",  "generation", "started_at",
                                           "finished_at", "result"};
    for (size_t i = 0; i < sizeof nullable / sizeof nullable[0]; i++)
        if (!json_object_get(j, nullable[i]))
            fail_msg("job field '%s' missing", nullable[i]);
    assert_int_equal(json_is_null(json_object_get(j, "error")), strcmp(state, "failed") != 0);
    if (!strcmp(state, "succeeded") || !strcmp(state, "failed")) {
        expect_field(j, "finished_at", JSON_INTEGER);
        assert_true(json_is_null(json_object_get(j, "eta_seconds")));
    }
    if (!strcmp(state, "failed")) {
        json_t *e = json_object_get(j, "error");
        expect_field(e, "code", JSON_STRING);
        expect_field(e, "message", JSON_STRING);
        expect_field(e, "errno", JSON_INTEGER);
    }
}

static json_t *post_job(tv__api_resp *r, const char *target, const char *body)
{
    int st = call(r, "POST", target, &(rq){.body = body});
    if (st != 202)
        fail_msg("POST %s %s: %d %s", target, body, st, json_dumps(r->json, JSON_COMPACT));
    assert_non_null(strstr(r->headers, "Location: /v1/jobs/"));
    return r->json;
}

/* Jobs run inline (local mode): the answer is the finished job. */
static void test_jobs_inline(void **state)
{
    (void)state;
    tv__api_resp r;
    char body[1024];
    /* an import without activation */
    snprintf(body, sizeof body, "{\"model\":\"jobm\",\"source\":\"%s\",\"strict\":true}", g->ckz);
    json_t *j = post_job(&r, "/v1/imports", body);
    check_job(j, "import", "succeeded");
    assert_string_equal(json_string_value(json_object_get(j, "model")), "jobm");
    assert_true(json_is_true(json_object_get(j, "strict")));
    assert_false(json_is_true(json_object_get(j, "activate")));
    assert_int_equal(json_integer_value(json_object_get(j, "generation")), 1);
    json_t *res = json_object_get(j, "result");
    assert_string_equal(json_string_value(json_object_get(res, "model")), "jobm");
    assert_int_equal(json_integer_value(json_object_get(res, "generation")), 1);
    assert_int_equal(json_integer_value(json_object_get(res, "n_tensors")), 1);
    int64_t import_id = json_integer_value(json_object_get(j, "id"));
    char loc[64];
    snprintf(loc, sizeof loc, "Location: /v1/jobs/%" PRId64 "\r\n", import_id);
    assert_non_null(strstr(r.headers, loc));
    tv__api_resp_free(&r);
    /* with an alias, activated */
    snprintf(body, sizeof body,
             "{\"model\":\"jobm\",\"source\":\"%s\",\"alias\":\"canary\",\"activate\":true}",
             g->ckz);
    j = post_job(&r, "/v1/imports", body);
    check_job(j, "import", "succeeded");
    assert_string_equal(json_string_value(json_object_get(j, "alias")), "canary");
    tv__api_resp_free(&r);
    j = ok_json(&r, "GET", "/v1/models/jobm", NULL);
    assert_int_equal(json_integer_value(json_object_get(j, "active_generation")), 2);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "aliases"), "canary")),
                     2);
    tv__api_resp_free(&r);
    /* an invalid checkpoint is the job's failure (a 422-class code in the row) */
    char bad[300];
    snprintf(bad, sizeof bad, "%s/bad.safetensors", g->s.dir);
    tv_test_write_text(bad, "xyz");
    snprintf(body, sizeof body, "{\"model\":\"jobm\",\"source\":\"%s\"}", bad);
    j = post_job(&r, "/v1/imports", body);
    check_job(j, "import", "failed");
    assert_int_equal(tv__api_http_status((int)json_integer_value(
                         json_object_get(json_object_get(j, "error"), "errno"))),
                     422);
    tv__api_resp_free(&r);
    /* verify every device, then one */
    j = post_job(&r, "/v1/verify", NULL);
    check_job(j, "verify", "succeeded");
    res = json_object_get(j, "result");
    assert_int_equal(json_integer_value(json_object_get(res, "n_failed")), 0);
    assert_true(json_integer_value(json_object_get(res, "n_objects")) >= 3);
    tv__api_resp_free(&r);
    j = post_job(&r, "/v1/verify", "{\"device_id\":1}");
    check_job(j, "verify", "succeeded");
    tv__api_resp_free(&r);
    /* the list: newest first, filters, limit=1 walk */
    j = ok_json(&r, "GET", "/v1/jobs", NULL);
    json_t *arr = json_object_get(j, "jobs");
    assert_int_equal(json_array_size(arr), 5);
    assert_true(json_is_null(json_object_get(j, "next_cursor")));
    int64_t prev = INT64_MAX;
    for (size_t i = 0; i < 5; i++) {
        int64_t id = json_integer_value(json_object_get(json_array_get(arr, i), "id"));
        assert_true(id < prev);
        prev = id;
    }
    tv__api_resp_free(&r);
    j = ok_json(&r, "GET", "/v1/jobs?kind=verify", NULL);
    assert_int_equal(json_array_size(json_object_get(j, "jobs")), 2);
    tv__api_resp_free(&r);
    j = ok_json(&r, "GET", "/v1/jobs?state=failed&kind=import", NULL);
    assert_int_equal(json_array_size(json_object_get(j, "jobs")), 1);
    tv__api_resp_free(&r);
    char target[256] = "/v1/jobs?limit=2";
    size_t seen = 0;
    for (;;) {
        j = ok_json(&r, "GET", target, NULL);
        seen += json_array_size(json_object_get(j, "jobs"));
        json_t *next = json_object_get(j, "next_cursor");
        if (json_is_null(next)) {
            tv__api_resp_free(&r);
            break;
        }
        snprintf(target, sizeof target, "/v1/jobs?limit=2&cursor=%s", json_string_value(next));
        tv__api_resp_free(&r);
        assert_true(seen < 10);
    }
    assert_int_equal(seen, 5);
    /* one job; cancel has nothing to cancel in local mode */
    snprintf(target, sizeof target, "/v1/jobs/%" PRId64, import_id);
    j = ok_json(&r, "GET", target, NULL);
    check_job(j, "import", "succeeded");
    tv__api_resp_free(&r);
    snprintf(target, sizeof target, "/v1/jobs/%" PRId64 "/cancel", import_id);
    expect_error("POST", target, NULL, 409, "TV_E_STATE");
}

/* Jobs on the daemon's pool: 202 while queued or running, then the row
 * finishes; cancel of a finished job is a conflict. The status counters
 * move with the row: counters read first, then the row, never show the row
 * behind them (running 1 -> the row is not queued; nothing queued or
 * running -> the row is final), and once the row reads final the counters
 * say nothing is running. */
static void test_jobs_pool(void **state)
{
    (void)state;
    tv__jobs *jobs = NULL;
    tv_error err = {0};
    if (tv__jobs_start(g->s.st, 1, 4, &jobs, &err))
        fail_msg("jobs start: %s", err.msg);
    tv__api_opts o = {.store_dir = g->s.store, .anonymous_reads = TV__ANON_LOOPBACK, .jobs = jobs};
    tv__api *api = NULL;
    assert_int_equal(tv__api_open(&o, g->s.st, &api, &err), 0);
    tv__api *saved = g->api;
    g->api = api;
    tv__api_resp r;
    char body[1024], target[64];
    snprintf(body, sizeof body, "{\"model\":\"pooled\",\"source\":\"%s\",\"activate\":true}",
             g->ckz);
    json_t *j = post_job(&r, "/v1/imports", body);
    const char *st = json_string_value(json_object_get(j, "state"));
    assert_true(!strcmp(st, "queued") || !strcmp(st, "running") || !strcmp(st, "succeeded"));
    int64_t id = json_integer_value(json_object_get(j, "id"));
    tv__api_resp_free(&r);
    snprintf(target, sizeof target, "/v1/jobs/%" PRId64, id);
    for (int i = 0;; i++) {
        j = ok_json(&r, "GET", "/v1/status", NULL);
        json_int_t nq = json_integer_value(json_object_get(json_object_get(j, "jobs"), "queued"));
        json_int_t nr = json_integer_value(json_object_get(json_object_get(j, "jobs"), "running"));
        tv__api_resp_free(&r);
        assert_true(nq >= 0 && nr >= 0 && nq + nr <= 1);
        j = ok_json(&r, "GET", target, NULL);
        st = json_string_value(json_object_get(j, "state"));
        if (nr == 1 && !strcmp(st, "queued"))
            fail_msg("status says running 1 but job %" PRId64 " is still queued", id);
        if (nq == 0 && nr == 0 && strcmp(st, "succeeded"))
            fail_msg("status says no job queued or running but job %" PRId64 " is %s", id, st);
        if (!strcmp(st, "succeeded")) {
            check_job(j, "import", "succeeded");
            tv__api_resp_free(&r);
            break;
        }
        assert_true(!strcmp(st, "queued") || !strcmp(st, "running"));
        tv__api_resp_free(&r);
        assert_true(i < 2000);
        usleep(5000);
    }
    j = ok_json(&r, "GET", "/v1/status", NULL);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "jobs"), "queued")), 0);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "jobs"), "running")), 0);
    tv__api_resp_free(&r);
    snprintf(target, sizeof target, "/v1/jobs/%" PRId64 "/cancel", id);
    expect_error("POST", target, NULL, 409, "TV_E_STATE");
    expect_error("POST", "/v1/jobs/999/cancel", NULL, 404, "TV_E_NOT_FOUND");
    j = ok_json(&r, "GET", "/v1/models/pooled", NULL);
    assert_int_equal(json_integer_value(json_object_get(j, "active_generation")), 1);
    tv__api_resp_free(&r);
    g->api = saved;
    tv__api_close(api);
    tv__jobs_stop(jobs);
}

static void test_jobs_refused(void **state)
{
    (void)state;
    tv__api_resp r;
    char body[1024];
    /* refused before queuing */
    snprintf(body, sizeof body, "{\"model\":\"bad name!\",\"source\":\"%s\"}", g->ckz);
    expect_error("POST", "/v1/imports", &(rq){.body = body}, 400, "TV_E_NAME");
    snprintf(body, sizeof body, "{\"model\":\"m\",\"source\":\"%s\",\"alias\":\"9x\"}", g->ckz);
    expect_error("POST", "/v1/imports", &(rq){.body = body}, 400, "TV_E_NAME");
    snprintf(body, sizeof body, "{\"model\":\"m\",\"source\":\"%s\",\"activate\":1}", g->ckz);
    expect_error("POST", "/v1/imports", &(rq){.body = body}, 400, "TV_E_BAD_REQUEST");
    snprintf(body, sizeof body, "{\"model\":\"m\",\"source\":\"%s\",\"bogus\":1}", g->ckz);
    expect_error("POST", "/v1/imports", &(rq){.body = body}, 400, "TV_E_BAD_REQUEST");
    snprintf(body, sizeof body, "{\"model\":\"m\",\"source\":\"%s/missing\"}", g->s.dir);
    expect_error("POST", "/v1/imports", &(rq){.body = body}, 404, "ENOENT");
    expect_error("POST", "/v1/imports", &(rq){.body = "{\"model\":\"m\"}"}, 400,
                 "TV_E_BAD_REQUEST");
    char *longp = malloc(6000);
    assert_non_null(longp);
    memset(longp, 'a', 5000);
    const char *head = "{\"model\":\"m\",\"source\":\"/";
    memcpy(longp, head, strlen(head));
    memcpy(longp + 5000, "\"}", 3);
    expect_error("POST", "/v1/imports", &(rq){.body = longp}, 400, "TV_E_BAD_REQUEST");
    free(longp);
    char loop[300];
    snprintf(loop, sizeof loop, "%s/loop", g->s.dir);
    assert_int_equal(symlink(loop, loop), 0);
    snprintf(body, sizeof body, "{\"model\":\"m\",\"source\":\"%s\"}", loop);
    expect_error("POST", "/v1/imports", &(rq){.body = body}, 400, "TV_E_BAD_REQUEST");
    expect_error("POST", "/v1/imports", &(rq){.body = "{\"model\":\"m\",\"source\":\"\"}"}, 400,
                 "TV_E_BAD_REQUEST");
    expect_error("POST", "/v1/verify", &(rq){.body = "{\"device_id\":9}"}, 404, "TV_E_NOT_FOUND");
    expect_error("POST", "/v1/verify", &(rq){.body = "{\"device_id\":\"1\"}"}, 400,
                 "TV_E_BAD_REQUEST");
    /* no job yet */
    json_t *j = ok_json(&r, "GET", "/v1/jobs", NULL);
    assert_int_equal(json_array_size(json_object_get(j, "jobs")), 0);
    assert_true(json_is_null(json_object_get(j, "next_cursor")));
    tv__api_resp_free(&r);
    j = ok_json(&r, "GET", "/v1/jobs?state=cancelled&kind=verify&limit=3", NULL);
    assert_int_equal(json_array_size(json_object_get(j, "jobs")), 0);
    tv__api_resp_free(&r);
    expect_error("GET", "/v1/jobs?state=done", NULL, 400, "TV_E_BAD_REQUEST");
    expect_error("GET", "/v1/jobs?kind=x", NULL, 400, "TV_E_BAD_REQUEST");
    expect_error("GET", "/v1/jobs?cursor=j", NULL, 400, "TV_E_BAD_REQUEST");
    expect_error("GET", "/v1/jobs?cursor=jzz", NULL, 400, "TV_E_BAD_REQUEST");
    expect_error("GET", "/v1/jobs/999", NULL, 404, "TV_E_NOT_FOUND");
    expect_error("GET", "/v1/jobs/x", NULL, 400, "TV_E_BAD_REQUEST");
    expect_error("POST", "/v1/jobs/999/cancel", NULL, 404, "TV_E_NOT_FOUND");
    /* a model without an active generation can be deleted; with one, not */
    tv_error err = {0};
    tv__import_opts io = {.activate = false};
    if (tv__import(g->s.st, "jobm", g->ckz, &io, NULL, &err))
        fail_msg("import: %s", err.msg);
    expect_error("DELETE", "/v1/models/zeta", NULL, 409, "TV_E_STATE");
    j = ok_json(&r, "GET", "/v1/models/jobm/generations/1/tensors/model.embed%2Fweight", NULL);
    assert_string_equal(json_string_value(json_object_get(j, "shard")), "z.safetensors");
    tv__api_resp_free(&r); /* now cached */
    j = ok_json(&r, "DELETE", "/v1/models/jobm", NULL);
    assert_string_equal(json_string_value(json_object_get(j, "model")), "jobm");
    assert_int_equal(json_integer_value(json_object_get(j, "n_generations_retired")), 1);
    expect_field(j, "freed_bytes", JSON_INTEGER);
    tv__api_resp_free(&r);
    expect_error("GET", "/v1/models/jobm", NULL, 404, "TV_E_NOT_FOUND");
    expect_error("DELETE", "/v1/models/jobm", NULL, 404, "TV_E_NOT_FOUND");
    /* the same name again, another checkpoint (and maybe the same row ids):
     * the cached documents were dropped with the model */
    if (tv__import(g->s.st, "jobm", g->ck[0], &io, NULL, &err))
        fail_msg("import: %s", err.msg);
    j = ok_json(&r, "GET", "/v1/models/jobm/generations/1/tensors/model.embed%2Fweight", NULL);
    assert_string_equal(json_string_value(json_object_get(j, "shard")), "ck1.safetensors");
    tv__api_resp_free(&r);
    j = ok_json(&r, "GET", "/v1/models/jobm/generations/1", NULL);
    assert_string_equal(
        json_string_value(json_object_get(json_array_get(json_object_get(j, "shards"), 0), "name")),
        "ck1.safetensors");
    tv__api_resp_free(&r);
    j = ok_json(&r, "DELETE", "/v1/models/jobm", NULL);
    tv__api_resp_free(&r);
    j = ok_json(&r, "POST", "/v1/gc", NULL);
    expect_field(j, "n_objects_freed", JSON_INTEGER);
    expect_field(j, "freed_bytes", JSON_INTEGER);
    tv__api_resp_free(&r);
}

/* Import roots: whole components, real paths (symlinks, ".." and prefix
 * siblings cannot escape). */
static void test_import_roots(void **state)
{
    (void)state;
    char root[300], sib[300], link[400], dotdot[400], inside[400];
    snprintf(root, sizeof root, "%s/root", g->s.dir);
    snprintf(sib, sizeof sib, "%s/root2", g->s.dir);
    assert_int_equal(mkdir(root, 0700), 0);
    assert_int_equal(mkdir(sib, 0700), 0);
    snprintf(inside, sizeof inside, "%s/ok.safetensors", root);
    tv_test_write_shard(inside, TENSORS, 1, 5);
    char sibf[400];
    snprintf(sibf, sizeof sibf, "%s/x.safetensors", sib);
    tv_test_write_shard(sibf, TENSORS, 1, 6);
    snprintf(link, sizeof link, "%s/escape.safetensors", root);
    assert_int_equal(symlink(g->ckz, link), 0);
    snprintf(dotdot, sizeof dotdot, "%s/../z.safetensors", root);
    tv__api *api = NULL;
    tv_error err = {0};
    const char *roots[] = {root};
    tv__api_opts o = {.store_dir = g->s.store,
                      .anonymous_reads = TV__ANON_LOOPBACK,
                      .import_roots = roots,
                      .n_import_roots = 1};
    assert_int_equal(tv__api_open(&o, g->s.st, &api, &err), 0);
    tv__api *saved = g->api;
    g->api = api;
    const char *out[] = {link, dotdot, sibf, g->ckz, "/"};
    char body[1024];
    for (size_t i = 0; i < sizeof out / sizeof out[0]; i++) {
        snprintf(body, sizeof body, "{\"model\":\"rooted\",\"source\":\"%s\"}", out[i]);
        expect_error("POST", "/v1/imports", &(rq){.body = body}, 403, "TV_E_OUTSIDE_ROOTS");
    }
    snprintf(body, sizeof body, "{\"model\":\"rooted\",\"source\":\"%s\",\"activate\":true}",
             inside);
    tv__api_resp r;
    json_t *j = post_job(&r, "/v1/imports", body);
    check_job(j, "import", "succeeded");
    assert_true(json_is_true(json_object_get(j, "activate")));
    tv__api_resp_free(&r);
    snprintf(body, sizeof body, "{\"model\":\"rooted\",\"source\":\"%s\"}", root);
    j = post_job(&r, "/v1/imports", body); /* the root itself: two checkpoints, the job fails */
    check_job(j, "import", "failed");
    tv__api_resp_free(&r);
    char *real = NULL;
    assert_int_equal(tv__api_source_check(api, inside, &real, NULL, &err), 0);
    assert_non_null(strstr(real, "/root/ok.safetensors"));
    free(real);
    assert_int_equal(tv__api_source_check(api, root, &real, NULL, &err), 0);
    free(real);
    assert_int_equal(tv__api_source_check(api, sib, &real, NULL, &err), TV_E_OUTSIDE_ROOTS);
    assert_null(real);
    g->api = saved;
    tv__api_close(api);
}

/* ---- aliases (store seams) --------------------------------------------------------- */

static void test_aliases(void **state)
{
    (void)state;
    tv__api_resp r;
    json_t *j = ok_json(&r, "PUT", "/v1/models/acme%2Ftiny/aliases/prod",
                        &(rq){.body = "{\"generation\":1}"});
    assert_string_equal(json_string_value(json_object_get(j, "alias")), "prod");
    assert_int_equal(json_integer_value(json_object_get(j, "generation")), 1);
    tv__api_resp_free(&r);
    j = ok_json(&r, "GET", "/v1/models/acme%2Ftiny", NULL);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "aliases"), "prod")), 1);
    assert_int_equal(json_object_size(json_object_get(j, "aliases")), 1);
    tv__api_resp_free(&r);
    j = ok_json(&r, "GET", "/v1/models/acme%2Ftiny/generations/prod", NULL);
    check_generation(j, 1, false);
    assert_string_equal(json_string_value(json_array_get(json_object_get(j, "aliases"), 0)),
                        "prod");
    tv__api_resp_free(&r);
    j = ok_json(&r, "GET", "/v1/models/acme%2Ftiny/aliases", NULL);
    json_t *arr = json_object_get(j, "aliases");
    assert_int_equal(json_array_size(arr), 1);
    assert_string_equal(json_string_value(json_object_get(json_array_get(arr, 0), "alias")),
                        "prod");
    assert_string_equal(json_string_value(json_object_get(json_array_get(arr, 0), "model")), MODEL);
    tv__api_resp_free(&r);
    /* bytes through the alias are generation 1's */
    assert_int_equal(data(&r, 1, "prod", NULL), 200);
    expect_bytes(&r, 1, 1, 0, 13);
    tv__api_resp_free(&r);
    /* an aliased generation cannot be retired; move the alias, then it can */
    expect_error("POST", "/v1/models/acme%2Ftiny/generations/1/retire", NULL, 409, "TV_E_STATE");
    j = ok_json(&r, "PUT", "/v1/models/acme%2Ftiny/aliases/prod",
                &(rq){.body = "{\"generation\":2}"});
    tv__api_resp_free(&r);
    expect_error("PUT", "/v1/models/acme%2Ftiny/aliases/prod", &(rq){.body = "{\"generation\":7}"},
                 404, "TV_E_NOT_FOUND");
    j = ok_json(&r, "DELETE", "/v1/models/acme%2Ftiny/aliases/prod", NULL);
    assert_int_equal(json_integer_value(json_object_get(j, "generation")), 2);
    tv__api_resp_free(&r);
    expect_error("DELETE", "/v1/models/acme%2Ftiny/aliases/prod", NULL, 404, "TV_E_NOT_FOUND");
    expect_error("GET", "/v1/models/acme%2Ftiny/generations/prod", NULL, 404, "TV_E_NOT_FOUND");
    expect_error("GET", "/v1/models/nobody/aliases", NULL, 404, "TV_E_NOT_FOUND");
    j = ok_json(&r, "POST", "/v1/models/acme%2Ftiny/generations/1/retire", NULL);
    tv__api_resp_free(&r);
}

/* ---- tokens ------------------------------------------------------------------------ */

static void test_tokens(void **state)
{
    (void)state;
    tv__api_resp r;
    char adm[80], rd[80], hdr[100];
    int64_t rd_id;
    json_t *j =
        ok_json(&r, "POST", "/v1/tokens", &(rq){.body = "{\"name\":\"ops\",\"scope\":\"admin\"}"});
    assert_int_equal(r.status, 201);
    assert_string_equal(json_string_value(json_object_get(j, "scope")), "admin");
    assert_string_equal(json_string_value(json_object_get(j, "name")), "ops");
    expect_field(j, "id", JSON_INTEGER);
    expect_field(j, "created_at", JSON_INTEGER);
    assert_true(json_is_null(json_object_get(j, "revoked_at")));
    const char *tok = json_string_value(json_object_get(j, "token"));
    assert_int_equal(strlen(tok), 68);
    assert_memory_equal(tok, "tvk_", 4);
    snprintf(adm, sizeof adm, "Bearer %s", tok);
    tv__api_resp_free(&r);
    j = ok_json(&r, "POST", "/v1/tokens", &(rq){.body = "{\"name\":\"dash\",\"scope\":\"read\"}"});
    snprintf(rd, sizeof rd, "Bearer %s", json_string_value(json_object_get(j, "token")));
    rd_id = json_integer_value(json_object_get(j, "id"));
    tv__api_resp_free(&r);
    /* the matrix, from a remote peer (no anonymous reads) */
    rq a = {.untrusted = true, .remote = true, .auth = adm};
    rq x = {.untrusted = true, .remote = true, .auth = rd};
    j = ok_json(&r, "GET", "/v1/models", &x);
    tv__api_resp_free(&r);
    j = ok_json(&r, "GET", "/v1/models", &a);
    tv__api_resp_free(&r);
    expect_error("POST", "/v1/gc", &x, 403, "TV_E_FORBIDDEN");
    expect_error("GET", "/v1/tokens", &x, 403, "TV_E_FORBIDDEN");
    expect_error("POST", "/v1/models/acme%2Ftiny/generations/2/activate", &x, 403,
                 "TV_E_FORBIDDEN");
    j = ok_json(&r, "POST", "/v1/gc", &a);
    tv__api_resp_free(&r);
    j = ok_json(&r, "GET", "/v1/tokens", &a);
    json_t *arr = json_object_get(j, "tokens");
    assert_int_equal(json_array_size(arr), 2);
    assert_null(json_object_get(json_array_get(arr, 0), "token")); /* never listed */
    tv__api_resp_free(&r);
    /* "bearer" in any case, surrounding blanks */
    snprintf(hdr, sizeof hdr, "  bearer   %s  ", rd + 7);
    j = ok_json(&r, "GET", "/v1/models", &(rq){.untrusted = true, .remote = true, .auth = hdr});
    tv__api_resp_free(&r);
    /* revoke the read token: 401 afterwards, revoked_at set; twice is fine */
    char target[64];
    snprintf(target, sizeof target, "/v1/tokens/%" PRId64, rd_id);
    j = ok_json(&r, "DELETE", target, &a);
    expect_field(j, "revoked_at", JSON_INTEGER);
    tv__api_resp_free(&r);
    j = ok_json(&r, "DELETE", target, &a);
    tv__api_resp_free(&r);
    expect_error("GET", "/v1/models", &x, 401, "TV_E_UNAUTHORIZED");
    expect_error("GET", "/v1/models", &(rq){.untrusted = true, .auth = rd}, 401,
                 "TV_E_UNAUTHORIZED");
    expect_error("DELETE", "/v1/tokens/999", &a, 404, "TV_E_NOT_FOUND");
    expect_error("DELETE", "/v1/tokens/x", &a, 400, "TV_E_BAD_REQUEST");
}

/* ---- concurrency --------------------------------------------------------------------- */

static void *hammer(void *arg)
{
    (void)arg;
    for (int i = 0; i < 40; i++) {
        tv__api_resp r;
        tv__api_req q = {.method = "GET",
                         .path = "/v1/models/acme%2Ftiny/generations/1/tensors/na%C3%AFve/data",
                         .range = "bytes=3-77",
                         .peer = &LOCAL};
        if (tv__api_handle(g->api, &q, &r) != 206 || r.body_len != 75)
            return (void *)1;
        for (uint64_t k = 0; k < 75; k++)
            if ((uint8_t)r.body[k] != tv_test_shard_byte(tensor_begin(2) + 3 + k, 1))
                return (void *)2;
        tv__api_resp_free(&r);
        q = (tv__api_req){.method = "GET",
                          .path = i % 2 ? "/v1/models/acme%2Ftiny/generations/2/tensors/big"
                                        : "/v1/models",
                          .peer = &LOCAL};
        if (tv__api_handle(g->api, &q, &r) != 200 || !r.json)
            return (void *)3;
        tv__api_resp_free(&r);
    }
    return NULL;
}

static void test_concurrent(void **state)
{
    (void)state;
    pthread_t th[6];
    for (int i = 0; i < 6; i++)
        assert_int_equal(pthread_create(&th[i], NULL, hammer, NULL), 0);
    for (int i = 0; i < 6; i++) {
        void *res;
        assert_int_equal(pthread_join(th[i], &res), 0);
        assert_null(res);
    }
}

/* ---- hostile input ---------------------------------------------------------------------- */

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static unsigned rnd(unsigned n)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (unsigned)(g_rng % n);
}

static void rnd_text(char *out, size_t cap, const char *const *words, size_t n_words)
{
    static const char alpha[] = "%/?&=+-._~aZ09 \t\"{}[]:,\\\xc3\xaf\xff";
    size_t len = 0, parts = rnd(8);
    for (size_t i = 0; i < parts && len + 80 < cap; i++) {
        if (rnd(2)) {
            len += (size_t)snprintf(out + len, cap - len, "%s", words[rnd((unsigned)n_words)]);
        } else {
            for (unsigned k = rnd(6); k > 0; k--)
                out[len++] = alpha[rnd(sizeof alpha - 1)];
            out[len] = '\0';
        }
    }
    out[len] = '\0';
}

/* Random paths, queries, bodies and headers on every route: never a 5xx,
 * always a well-formed answer (errors as error documents). */
static void test_garbage(void **state)
{
    (void)state;
    static const char *const words[] = {"/v1",
                                        "/models",
                                        "/acme%2Ftiny",
                                        "/zeta",
                                        "/generations",
                                        "/1",
                                        "/2",
                                        "/active",
                                        "/prod",
                                        "/tensors",
                                        "/big",
                                        "/odd%20100%25",
                                        "/data",
                                        "/aliases",
                                        "/devices",
                                        "/jobs",
                                        "/tokens",
                                        "/activate",
                                        "/retire",
                                        "/rollback",
                                        "/cancel",
                                        "/imports",
                                        "/verify",
                                        "/gc",
                                        "%",
                                        "%2",
                                        "%00",
                                        "%zz",
                                        "//",
                                        "limit=",
                                        "cursor=",
                                        "prefix=",
                                        "order=",
                                        "state=",
                                        "kind=",
                                        "&",
                                        "=",
                                        "1001",
                                        "0",
                                        "-1",
                                        "99999999999999999999999",
                                        "m6",
                                        "f31",
                                        "n61",
                                        "{",
                                        "}",
                                        "\"generation\":",
                                        "\"name\":",
                                        "\"scope\":",
                                        "\"model\":",
                                        "\"source\":",
                                        "\"read\"",
                                        "null",
                                        "true",
                                        "1",
                                        "[]",
                                        "\"x\"",
                                        ","};
    static const char *const methods[] = {"GET", "POST", "PUT", "DELETE", "HEAD", "PATCH", ""};
    static const char *const ranges[] = {NULL,
                                         "bytes=",
                                         "bytes=-",
                                         "bytes=1-",
                                         "bytes=--1",
                                         "bytes=1-2-3",
                                         "bytes=0-0,",
                                         "bytes=18446744073709551615-",
                                         "bytes=-18446744073709551616"};
    char root[300];
    snprintf(root, sizeof root, "%s/emptyroot", g->s.dir);
    assert_int_equal(mkdir(root, 0700), 0);
    const char *roots[] = {root};
    tv__api_opts o = {.store_dir = g->s.store,
                      .anonymous_reads = TV__ANON_LOOPBACK,
                      .import_roots = roots,
                      .n_import_roots = 1};
    tv__api *api = NULL;
    tv_error err = {0};
    assert_int_equal(tv__api_open(&o, g->s.st, &api, &err), 0);
    char path[512], query[256], body[512];
    for (int i = 0; i < 4000; i++) {
        rnd_text(path, sizeof path, words, sizeof words / sizeof words[0]);
        rnd_text(query, sizeof query, words, sizeof words / sizeof words[0]);
        rnd_text(body, sizeof body, words, sizeof words / sizeof words[0]);
        tv__api_req q = {.method = methods[rnd(7)],
                         .path = path,
                         .query = rnd(2) ? query : NULL,
                         .body = rnd(2) ? body : NULL,
                         .range = ranges[rnd(9)],
                         .if_none_match = rnd(4) ? NULL : body,
                         .authorization = rnd(4) ? NULL : query,
                         .content_type = rnd(4) ? NULL : "application/json; charset=utf-8",
                         .trusted = rnd(3) != 0,
                         .peer = rnd(2) ? &LOCAL : &REMOTE};
        q.body_len = q.body ? strlen(q.body) : 0;
        tv__api_resp r;
        int st = tv__api_handle(api, &q, &r);
        if (st < 200 || st >= 500)
            fail_msg("%s %s ? %s body %s: %d %s", q.method, path, q.query ? q.query : "",
                     q.body ? q.body : "", st, r.json ? json_dumps(r.json, JSON_COMPACT) : "");
        assert_non_null(r.route);
        if (st >= 400)
            err_code(&r);
        else if (r.stream)
            assert_int_equal(tv__api_stream_read(&r, 0, body, sizeof body) > 0, r.stream_len > 0);
        else if (st != 304)
            assert_true(r.json || r.body || r.body_len == 0);
        tv__api_resp_free(&r);
    }
    tv__api_close(api);
}

static void test_open_args(void **state)
{
    (void)state;
    tv__api *api = NULL;
    tv_error err = {0};
    tv__api_opts o = {.store_dir = g->s.store, .anonymous_reads = 7};
    assert_int_equal(tv__api_open(&o, NULL, &api, &err), TV_E_INVALID_ARG);
    assert_null(api);
    o.anonymous_reads = TV__ANON_NEVER;
    const char *roots[] = {"/nonexistent/root"};
    o.import_roots = roots;
    o.n_import_roots = 1;
    assert_int_equal(tv__api_open(&o, NULL, &api, &err), -ENOENT);
    assert_non_null(strstr(err.msg, "/nonexistent/root"));
    o.import_roots = NULL;
    char nostore[300];
    snprintf(nostore, sizeof nostore, "%s/none", g->s.dir);
    o.store_dir = nostore;
    assert_int_equal(tv__api_open(&o, NULL, &api, &err), TV_E_NOT_FOUND);
    /* a read-only api: reads work, mutations are a conflict; never
     * anonymous */
    o.store_dir = g->s.store;
    assert_int_equal(tv__api_open(&o, NULL, &api, &err), 0);
    tv__api_req q = {.method = "GET", .path = "/v1/models", .trusted = true};
    tv__api_resp r;
    assert_int_equal(tv__api_handle(api, &q, &r), 200);
    tv__api_resp_free(&r);
    q.method = "POST";
    q.path = "/v1/models/zeta/rollback";
    assert_int_equal(tv__api_handle(api, &q, &r), 409);
    tv__api_resp_free(&r);
    q = (tv__api_req){.method = "GET", .path = "/v1/models", .peer = &UNKNOWN_LOOPBACK};
    assert_int_equal(tv__api_handle(api, &q, &r), 401);
    tv__api_resp_free(&r);
    tv__api_resp_free(&r); /* twice is safe */
    tv__api_close(api);
    tv__api_close(NULL);
}

/* Sends req on a new connection to 127.0.0.1:port: the bytes of the reply
 * (0 when the server closed the connection unanswered). */
static size_t http_raw(uint16_t port, const char *req, char *buf, size_t cap)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    struct timeval tv = {.tv_sec = 10};
    size_t got = 0;
    assert_true(fd >= 0);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv), 0);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    (void)send(fd, req, strlen(req), MSG_NOSIGNAL); /* may fail once refused */
    for (;;) {
        ssize_t n = recv(fd, buf + got, cap - 1 - got, 0);
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    buf[got] = '\0';
    close(fd); /* raw-syscall-ok: a test socket */
    return got;
}

static size_t http_get_healthz(uint16_t port, char *buf, size_t cap)
{
    return http_raw(port, "GET /healthz HTTP/1.0\r\nHost: localhost\r\n\r\n", buf, cap);
}

/* tv__http_quiesce: connections accepted afterwards are closed unanswered,
 * the server keeps running until tv__http_stop. */
static void test_http_quiesce(void **state)
{
    (void)state;
    tv__http_opts o = {.listen = "127.0.0.1:0", .threads = 2, .store_dir = g->s.store};
    tv__http *h = NULL;
    uint16_t port = 0;
    char buf[4096];
    tv_error err = {0};
    assert_int_equal(tv__http_start(&o, g->api, NULL, &h, &port, &err), 0);
    assert_true(port > 0);
    assert_true(http_get_healthz(port, buf, sizeof buf) > 0);
    assert_non_null(strstr(buf, " 200 "));
    tv__http_quiesce(h);
    tv__http_quiesce(h); /* twice is fine */
    assert_int_equal(http_get_healthz(port, buf, sizeof buf), 0);
    tv__http_stop(h);
}

/* The status line's code of the reply to req. */
static int http_status(uint16_t port, const char *req)
{
    char buf[4096];
    assert_true(http_raw(port, req, buf, sizeof buf) > 12);
    return atoi(buf + 9);
}

/* DNS rebinding: a Host that is not one of the daemon's names is 421, none
 * on HTTP/1.1 400; a state-changing request from another origin is 403. */
static void test_http_hosts(void **state)
{
    (void)state;
    tv__http_opts o = {.listen = "127.0.0.1:0",
                       .threads = 1,
                       .store_dir = g->s.store,
                       .extra_hosts = "node-a.example:9000"};
    tv__http *h = NULL;
    uint16_t port = 0;
    tv_error err = {0};
    char req[512];
    assert_int_equal(tv__http_start(&o, g->api, NULL, &h, &port, &err), 0);
    static const struct {
        const char *host; /* %u: the port */
        int status;
    } cases[] = {
        {"localhost:%u", 200},      {"LocalHost:%u", 200},      {"127.0.0.1:%u", 200},
        {"[::1]:%u", 200},          {"localhost", 200},         {"node-a.example:9000", 200},
        {"evil.example:%u", 421},   {"localhost:1%u", 421},     {"127.0.0.2:%u", 421},
        {"localhost.evil:%u", 421}, {"node-a.example:%u", 421}, {"localhost:%u/x", 421},
        {"user@localhost:%u", 421}, {"[::1:%u", 421},           {"localhost:0%u", 421},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char host[128];
        snprintf(host, sizeof host, cases[i].host, (unsigned)port);
        snprintf(req, sizeof req, "GET /healthz HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n",
                 host);
        int st = http_status(port, req);
        if (st != cases[i].status)
            fail_msg("Host: %s -> %d, want %d", host, st, cases[i].status);
    }
    assert_int_equal(http_status(port, "GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n"), 400);
    assert_int_equal(http_status(port, "GET /healthz HTTP/1.0\r\n\r\n"), 200);
    /* the dashboard's files too */
    snprintf(req, sizeof req,
             "GET / HTTP/1.1\r\nHost: evil.example:%u\r\nConnection: close\r\n\r\n",
             (unsigned)port);
    assert_int_equal(http_status(port, req), 421);
    /* Origin: a page of another site may not change anything; reads pass */
    snprintf(
        req, sizeof req,
        "POST /v1/gc HTTP/1.1\r\nHost: localhost:%u\r\nOrigin: http://evil.example\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        (unsigned)port);
    assert_int_equal(http_status(port, req), 403);
    snprintf(
        req, sizeof req,
        "POST /v1/gc HTTP/1.1\r\nHost: localhost:%u\r\nOrigin: http://localhost:%u\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        (unsigned)port, (unsigned)port);
    assert_int_equal(http_status(port, req), 401); /* same origin: on to the api (no token) */
    snprintf(
        req, sizeof req,
        "GET /healthz HTTP/1.1\r\nHost: localhost:%u\r\nOrigin: http://evil.example\r\nConnection: close\r\n\r\n",
        (unsigned)port);
    assert_int_equal(http_status(port, req), 200);
    tv__http_stop(h);

    /* allowed_hosts replaces the list; "*" allows any; a malformed entry is refused */
    tv__http_opts o2 = o;
    o2.allowed_hosts = "models.example";
    assert_int_equal(tv__http_start(&o2, g->api, NULL, &h, &port, &err), 0);
    snprintf(req, sizeof req,
             "GET /healthz HTTP/1.1\r\nHost: localhost:%u\r\nConnection: close\r\n\r\n",
             (unsigned)port);
    assert_int_equal(http_status(port, req), 421);
    assert_int_equal(
        http_status(port,
                    "GET /healthz HTTP/1.1\r\nHost: models.example\r\nConnection: close\r\n\r\n"),
        200);
    tv__http_stop(h);
    o2.allowed_hosts = "a.example, *";
    assert_int_equal(tv__http_start(&o2, g->api, NULL, &h, &port, &err), 0);
    assert_int_equal(
        http_status(port, "GET /healthz HTTP/1.1\r\nHost: anything\r\nConnection: close\r\n\r\n"),
        200);
    tv__http_stop(h);
    o2.allowed_hosts = "a.example:99999";
    assert_int_equal(tv__http_start(&o2, g->api, NULL, &h, &port, &err), TV_E_INVALID_ARG);
    assert_non_null(strstr(err.msg, "http.allowed_hosts"));
    /* a wildcard listen address: any IP literal with the port */
    tv__http_opts o3 = {.listen = "0.0.0.0:0", .threads = 1, .store_dir = g->s.store};
    assert_int_equal(tv__http_start(&o3, g->api, NULL, &h, &port, &err), 0);
    snprintf(req, sizeof req,
             "GET /healthz HTTP/1.1\r\nHost: 10.1.2.3:%u\r\nConnection: close\r\n\r\n",
             (unsigned)port);
    assert_int_equal(http_status(port, req), 200);
    snprintf(req, sizeof req,
             "GET /healthz HTTP/1.1\r\nHost: rebound.example:%u\r\nConnection: close\r\n\r\n",
             (unsigned)port);
    assert_int_equal(http_status(port, req), 421);
    tv__http_stop(h);
}

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_status_table),
        T(test_router),
        T(test_devices),
        T(test_device_extents),
        T(test_models),
        T(test_generations),
        T(test_tensors),
        T(test_data),
        T(test_generation_changes),
        T(test_bodies),
        T(test_auth),
        T(test_blobs),
        T(test_jobs_refused),
        T(test_jobs_inline),
        T(test_jobs_pool),
        T(test_import_roots),
        T(test_aliases),
        T(test_tokens),
        T(test_concurrent),
        T(test_garbage),
        T(test_open_args),
        T(test_sessions_without_fastpath),
        T(test_http_quiesce),
        T(test_http_hosts),
        cmocka_unit_test(test_session_json),
    };
    /* TV_TEST_FILTER=test_jobs_pool runs only the tests matching it (a
     * race hunted in a loop). */
    const char *only = getenv("TV_TEST_FILTER");
    if (only && *only)
        cmocka_set_test_filter(only);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
