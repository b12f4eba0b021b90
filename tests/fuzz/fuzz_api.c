/* libFuzzer target: the REST API's request handling (server/http/api*.c:
 * router, per-segment percent-decoding, query and cursor parsing, JSON
 * bodies, Range and If-None-Match, auth) on arbitrary requests against a
 * small store with one model, in-process through tv__api_handle.
 * Input: lines "METHOD\nPATH\nQUERY\nRANGE\nIF-NONE-MATCH\nAUTHORIZATION\n"
 * then the body (the rest); a missing line is an absent header. The caller
 * is an untrusted loopback peer (anonymous reads allowed, mutations need a
 * token it cannot know), so the store is never changed. An AUTHORIZATION
 * line "Bearer FLEET" is replaced by a real fleet token, which reaches the
 * blob routes (Range, ETag, digests) and cannot change anything either.
 * Invariants: every request gets a status in 200..599; a 4xx/5xx answer is
 * an error document {"error":{"code": string, "message": string, "errno":
 * integer}}; no 5xx for any input; a streamed body reads back exactly its
 * length; nothing aborts, leaks or reads out of bounds (ASan + UBSan). */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "http/api.h"
#include "import/import.h"
#include "store/store.h"

static tv__api *g_api;
static tv__store *g_st;
static char g_fleet_auth[16 + TV__TOKEN_SECRET_LEN + 1];

/* One safetensors file with three small tensors (names with '/', '%' and a
 * space: the decoding paths). */
static int write_checkpoint(const char *path)
{
    static const char hdr[] = "{\"a/b c%\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":"
                              "[0,24]},\"w.0\":{\"dtype\":\"U8\",\"shape\":[5],\"data_offsets\":"
                              "[24,29]},\"z\":{\"dtype\":\"BF16\",\"shape\":[],\"data_offsets\":"
                              "[29,31]}}";
    size_t hl = sizeof hdr - 1, padded = (hl + 7) & ~(size_t)7; /* checked: a constant */
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    uint8_t len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    fwrite(len8, 1, 8, f);
    fwrite(hdr, 1, hl, f);
    for (size_t i = hl; i < padded; i++)
        fputc(' ', f);
    for (int i = 0; i < 31; i++)
        fputc(i * 37 + 1, f);
    return fclose(f);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    char dir[] = "/tmp/tv-fuzz-api-XXXXXX", store[96], image[96], ck[96];
    tv_error err = {0};
    if (!mkdtemp(dir))
        abort();
    snprintf(store, sizeof store, "%s/store", dir);
    snprintf(image, sizeof image, "%s/image", dir);
    snprintf(ck, sizeof ck, "%s/m.safetensors", dir);
    tv__store_init_opts o = {.image = image, .image_size_bytes = 16u << 20};
    tv__import_opts io = {.activate = true};
    if (write_checkpoint(ck) || tv__store_init(store, &o, NULL, &err) ||
        tv__store_open(store, TV__STORE_WRITE, &g_st, &err) ||
        tv__import(g_st, "org/m", ck, &io, NULL, &err) ||
        tv__import(g_st, "org/m", ck, &io, NULL, &err)) {
        fprintf(stderr, "fuzz_api: setup: %s\n", err.msg);
        abort();
    }
    char secret[TV__TOKEN_SECRET_LEN + 1];
    tv__reg_token t;
    if (tv__reg_token_create(g_st->reg, "fuzz-fleet", TV__SCOPE_FLEET, secret, &t, &err)) {
        fprintf(stderr, "fuzz_api: fleet token: %s\n", err.msg);
        abort();
    }
    snprintf(g_fleet_auth, sizeof g_fleet_auth, "Bearer %s", secret);
    tv__api_opts ao = {.store_dir = store, .anonymous_reads = TV__ANON_LOOPBACK};
    if (tv__api_open(&ao, g_st, &g_api, &err)) {
        fprintf(stderr, "fuzz_api: api open: %s\n", err.msg);
        abort();
    }
    return 0;
}

/* The next '\n'-terminated line of [*p, end) as a NUL-terminated copy, or
 * NULL when the input ended first. */
static char *line(const uint8_t **p, const uint8_t *end)
{
    const uint8_t *nl = memchr(*p, '\n', (size_t)(end - *p));
    if (!nl)
        return NULL;
    size_t n = (size_t)(nl - *p);
    char *s = malloc(n + 1);
    if (!s)
        abort();
    memcpy(s, *p, n);
    s[n] = '\0';
    *p = nl + 1;
    return s;
}

static void check_error_doc(const tv__api_resp *r)
{
    json_t *e = json_object_get(r->json, "error");
    if (!json_is_string(json_object_get(e, "code")) ||
        !json_is_string(json_object_get(e, "message")) ||
        !json_is_integer(json_object_get(e, "errno")))
        abort();
}

/* A local user, as the transport identifies a loopback client. */
static const tv__http_peer g_local = {.local = true, .loopback = true, .addr = "127.0.0.1"};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *p = data, *end = data + size;
    char *f[6] = {0};
    for (int i = 0; i < 6; i++)
        f[i] = line(&p, end);
    tv__api_req q = {
        .method = f[0] && *f[0] ? f[0] : "GET",
        .path = f[1] ? f[1] : "/",
        .query = f[2] && *f[2] ? f[2] : NULL,
        .range = f[3] && *f[3] ? f[3] : NULL,
        .if_none_match = f[4] && *f[4] ? f[4] : NULL,
        .authorization = !f[5] || !*f[5]                 ? NULL
                         : !strcmp(f[5], "Bearer FLEET") ? g_fleet_auth
                                                         : f[5],
        .body = (const char *)p,
        .body_len = (size_t)(end - p),
        .peer = &g_local,
    };
    tv__api_resp r;
    tv__api_handle(g_api, &q, &r);
    if (r.status < 200 || r.status > 599 || r.status >= 500)
        abort();
    if (r.status >= 400)
        check_error_doc(&r);
    if (r.stream) {
        uint8_t buf[4096];
        uint64_t pos = 0;
        while (pos < r.stream_len) {
            ssize_t n = tv__api_stream_read(&r, pos, buf, sizeof buf);
            if (n <= 0)
                abort();
            pos += (uint64_t)n;
        }
        if (pos != r.stream_len)
            abort();
    }
    tv__api_resp_free(&r);
    for (int i = 0; i < 6; i++)
        free(f[i]);
    return 0;
}
