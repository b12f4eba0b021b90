/* The tensor-bytes route (GET .../tensors/{tensor}/data) and its pool of
 * open tv_model handles.
 *
 * Invariants:
 *   - a pooled tv_model is used by one thread at a time (slot.busy, under
 *     pool_mu); when every slot is busy the request opens a handle of its
 *     own and closes it after;
 *   - a slot is keyed by (model, generation number) and never changes
 *     generation: a generation's bytes never change, so a handle stays valid
 *     (its snapshot lease keeps the objects even once retired);
 *   - one RFC 9110 byte range: "bytes=a-b", "a-", "-n"; several ranges are
 *     answered 200 with the whole body; an unsatisfiable or malformed range
 *     is 416 with Content-Range: bytes * /N; another unit is ignored (200);
 *     If-None-Match (the ETag, W/ allowed, or *) is checked first: 304
 *     (its Content-Length the 200's);
 *   - only the envelope of the asked bytes is read (tv_read_range), so a
 *     streamed piece of a large tensor costs about its own bytes. */
#include <errno.h>
#include <stdatomic.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "http/api_internal.h"
#include "util/internal.h"

/* The source of a tensor's bytes (a body's src): a pooled handle on
 * (model, generation) reads them. */
typedef struct data_src {
    tv__api *api;
    int64_t generation;
    char *model, *name;
    char mem[]; /* model NUL name NUL */
} data_src;

/* A streamed body: its source and where the body starts in it. */
typedef struct bytes_stream {
    void *src;
    tv__api_bytes_read_fn read;
    void (*src_free)(void *src);
    uint64_t begin;
    char what[160];
} bytes_stream;

/* ---- the model pool ----------------------------------------------------------- */

void tv__api_models_close(tv__api *api)
{
    for (size_t i = 0; i < TV__API_MODEL_POOL; i++) {
        tv_model_close(api->models[i].m);
        free(api->models[i].model);
        api->models[i] = (tv__api_model_slot){0};
    }
}

void tv__api_models_release(tv__api *api, const char *model)
{
    tv_model *drop[TV__API_MODEL_POOL];
    char *names[TV__API_MODEL_POOL];
    size_t n = 0;
    pthread_mutex_lock(&api->pool_mu);
    for (size_t i = 0; i < TV__API_MODEL_POOL; i++) {
        tv__api_model_slot *s = &api->models[i];
        if (s->busy || !s->model || (model && strcmp(s->model, model)))
            continue;
        drop[n] = s->m;
        names[n++] = s->model;
        s->m = NULL;
        s->model = NULL;
        s->generation = 0;
    }
    pthread_mutex_unlock(&api->pool_mu);
    for (size_t i = 0; i < n; i++) {
        tv_model_close(drop[i]);
        free(names[i]);
    }
}

static int model_open(tv__api *api, const char *model, int64_t gen, tv_model **m, tv_error *err)
{
    char spec[TV__REG_NAME_MAX + 32];
    int n = snprintf(spec, sizeof spec, "%s@%" PRId64, model, gen);
    if (n < 0 || (size_t)n >= sizeof spec)
        return tv__seterr(err, TV_E_INVALID_ARG, "model name '%.60s...' too long", model);
    /* 16 x 1 MiB of staging per handle (16 pooled handles: 256 MiB at most)
     * and the default copy threads: one large tensor alone reads at depth. */
    tv_open_opts o = {.queue_depth = 16, .chunk_len = 1u << 20, .copy_threads = 0};
    return tv_model_open(api->store_dir, spec, &o, m, err);
}

/* A handle on (model, gen): *slot is its pool index, or -1 for a private
 * handle (every slot busy). */
static int model_get(tv__api *api, const char *model, int64_t gen, tv_model **m, int *slot,
                     tv_error *err)
{
    int rc = 0, pick = -1;
    *m = NULL;
    *slot = -1;
    pthread_mutex_lock(&api->pool_mu);
    uint64_t oldest = UINT64_MAX;
    int empty = -1, lru = -1;
    for (int i = 0; i < TV__API_MODEL_POOL; i++) {
        tv__api_model_slot *s = &api->models[i];
        if (s->busy)
            continue;
        if (s->model && s->generation == gen && !strcmp(s->model, model)) {
            pick = i;
            break;
        }
        if (!s->model && empty < 0)
            empty = i;
        if (s->model && s->last_use < oldest) {
            oldest = s->last_use;
            lru = i;
        }
    }
    tv_model *evicted = NULL;
    char *evicted_name = NULL;
    if (pick < 0 && (empty >= 0 || lru >= 0)) {
        pick = empty >= 0 ? empty : lru;
        tv__api_model_slot *s = &api->models[pick];
        evicted = s->m;
        evicted_name = s->model;
        s->m = NULL;
        s->model = NULL;
    }
    if (pick >= 0) {
        api->models[pick].busy = true;
        api->models[pick].last_use = ++api->model_clock;
        *m = api->models[pick].m;
    }
    pthread_mutex_unlock(&api->pool_mu);
    tv_model_close(evicted);
    free(evicted_name);
    *slot = pick;
    if (*m)
        return 0;
    if ((rc = model_open(api, model, gen, m, err))) {
        if (pick >= 0) {
            pthread_mutex_lock(&api->pool_mu);
            api->models[pick].busy = false;
            pthread_mutex_unlock(&api->pool_mu);
        }
        *slot = -1;
        return rc;
    }
    if (pick >= 0) {
        char *dup = strdup(model);
        pthread_mutex_lock(&api->pool_mu);
        api->models[pick].m = dup ? *m : NULL;
        api->models[pick].model = dup;
        api->models[pick].generation = gen;
        if (!dup) {
            api->models[pick].busy = false;
            *slot = -1; /* keep it private: closed by model_put */
        }
        pthread_mutex_unlock(&api->pool_mu);
    }
    return 0;
}

static void model_put(tv__api *api, tv_model *m, int slot)
{
    if (slot < 0) {
        tv_model_close(m);
        return;
    }
    pthread_mutex_lock(&api->pool_mu);
    api->models[slot].busy = false;
    pthread_mutex_unlock(&api->pool_mu);
}

/* ---- reading a byte range ------------------------------------------------------- */

/* Bytes [off, off + len) of tensor d (off + len <= nbytes) into dest: only
 * the alignment envelope of those bytes is read. */
static int read_range(tv_model *m, const tv_tensor_desc *d, uint64_t off, uint64_t len,
                      uint8_t *dest, tv_error *err)
{
    if (len == 0)
        return 0;
    if (off == 0 && len == d->nbytes)
        return tv_read_into(m, d->name, dest, len, err);
    return tv_read_range(m, d->name, off, len, dest, len, err);
}

/* Reads [off, off + len) of tensor name of (model, gen) through the pool. */
static int pooled_read(tv__api *api, const char *model, int64_t gen, const char *name, uint64_t off,
                       uint64_t len, uint8_t *dest, tv_error *err)
{
    tv_model *m;
    int slot, rc;
    size_t idx;
    tv_tensor_desc d;
    if ((rc = model_get(api, model, gen, &m, &slot, err)))
        return rc;
    if (tv_model_find(m, name, strlen(name), &idx) || tv_model_tensor(m, idx, &d))
        rc = tv__seterr(err, TV_E_NOT_FOUND, "tensor '%s' not found in %s@%" PRId64, name, model,
                        gen);
    else if (off > d.nbytes || len > d.nbytes - off)
        rc = tv__seterr(err, TV_E_RANGE,
                        "bytes %" PRIu64 "+%" PRIu64 " past the end of tensor '%s' (%" PRIu64
                        " bytes)",
                        off, len, name, d.nbytes);
    else
        rc = read_range(m, &d, off, len, dest, err);
    model_put(api, m, slot);
    return rc;
}

/* A whole body: its buffer (from the api's pool) and the in-flight bytes
 * it holds. */
typedef struct whole_body {
    tv__api *api;
    void *p;
    size_t cap;
    uint64_t len;
} whole_body;

/* A buffer of at least len bytes: a pooled one (smallest that fits, at most
 * twice len) or a new one rounded up to 2 MiB. NULL: out of memory. */
static void *buf_get(tv__api *api, size_t len, size_t *cap)
{
    void *p = NULL;
    pthread_mutex_lock(&api->pool_mu);
    size_t best = SIZE_MAX;
    for (size_t i = 0; i < api->n_bufs; i++)
        if (api->bufs[i].cap >= len && api->bufs[i].cap / 2 <= len &&
            (best == SIZE_MAX || api->bufs[i].cap < api->bufs[best].cap))
            best = i;
    if (best != SIZE_MAX) {
        p = api->bufs[best].p;
        *cap = api->bufs[best].cap;
        api->bufs_bytes -= *cap;
        api->bufs[best] = api->bufs[--api->n_bufs];
    }
    pthread_mutex_unlock(&api->pool_mu);
    if (p)
        return p;
    uint64_t c;
    if (tv__align_up_u64(len, 2u << 20, &c) || c > SIZE_MAX || posix_memalign(&p, 4096, (size_t)c))
        return NULL;
    *cap = (size_t)c;
    return p;
}

static void buf_put(tv__api *api, void *p, size_t cap)
{
    pthread_mutex_lock(&api->pool_mu);
    if (api->n_bufs < TV__API_BUF_POOL && api->bufs_bytes + cap <= TV__API_BUF_KEEP) {
        api->bufs[api->n_bufs++] = (struct tv__api_buf){p, cap};
        api->bufs_bytes += cap;
        p = NULL;
    }
    pthread_mutex_unlock(&api->pool_mu);
    free(p);
}

void tv__api_bufs_free(tv__api *api)
{
    for (size_t i = 0; i < api->n_bufs; i++)
        free(api->bufs[i].p);
    api->n_bufs = 0;
    api->bufs_bytes = 0;
}

static void release_body(void *owner)
{
    whole_body *w = owner;
    atomic_fetch_sub(&w->api->whole_inflight, w->len);
    buf_put(w->api, w->p, w->cap);
    free(w);
}

/* Reserves len bytes of the whole-body budget. false: over it (stream). */
static bool whole_reserve(tv__api *api, uint64_t len)
{
    uint64_t before = atomic_fetch_add(&api->whole_inflight, len);
    if (before + len <= TV__API_WHOLE_INFLIGHT)
        return true;
    atomic_fetch_sub(&api->whole_inflight, len);
    return false;
}

/* ---- Range and If-None-Match ----------------------------------------------------- */

/* Parses a decimal number; saturates at UINT64_MAX. false: not digits. */
static bool num(const char **p, uint64_t *v)
{
    const char *s = *p;
    uint64_t x = 0;
    if (*s < '0' || *s > '9')
        return false;
    for (; *s >= '0' && *s <= '9'; s++)
        x = x > (UINT64_MAX - 9) / 10 ? UINT64_MAX : x * 10 + (uint64_t)(*s - '0');
    *v = x;
    *p = s;
    return true;
}

enum range_kind { RANGE_NONE, RANGE_ONE, RANGE_BAD };

/* One range of "bytes=..." against a body of n bytes -> [*first, *first + *len). */
static enum range_kind parse_range(const char *h, uint64_t n, uint64_t *first, uint64_t *len)
{
    if (!h)
        return RANGE_NONE;
    while (*h == ' ' || *h == '\t')
        h++;
    if (strncasecmp(h, "bytes", 5))
        return RANGE_NONE; /* another unit: ignored */
    const char *p = h + 5;
    while (*p == ' ' || *p == '\t')
        p++;
    if (*p != '=')
        return RANGE_NONE;
    p++;
    if (strchr(p, ','))
        return RANGE_NONE; /* several ranges: the whole body */
    while (*p == ' ' || *p == '\t')
        p++;
    uint64_t a = 0, b = 0;
    if (*p == '-') {
        p++;
        if (!num(&p, &b))
            return RANGE_BAD;
        while (*p == ' ' || *p == '\t')
            p++;
        if (*p || b == 0 || n == 0)
            return RANGE_BAD;
        if (b > n)
            b = n;
        *first = n - b;
        *len = b;
        return RANGE_ONE;
    }
    if (!num(&p, &a) || *p != '-')
        return RANGE_BAD;
    p++;
    bool has_b = num(&p, &b);
    while (*p == ' ' || *p == '\t')
        p++;
    if (*p || a >= n || (has_b && b < a))
        return RANGE_BAD;
    uint64_t last = has_b && b < n - 1 ? b : n - 1;
    *first = a;
    *len = last - a + 1;
    return RANGE_ONE;
}

/* If-None-Match: a list of entity tags or "*"; weak comparison. */
static bool inm_matches(const char *h, const char *etag)
{
    if (!h)
        return false;
    size_t el = strlen(etag);
    const char *p = h;
    while (*p) {
        while (*p == ' ' || *p == '\t' || *p == ',')
            p++;
        if (*p == '*')
            return true;
        if (!strncmp(p, "W/", 2))
            p += 2;
        if (*p != '"')
            return false;
        const char *e = strchr(p + 1, '"');
        if (!e)
            return false;
        if ((size_t)(e + 1 - p) == el && !memcmp(p, etag, el))
            return true;
        p = e + 1;
    }
    return false;
}

/* ---- byte bodies: the shared answer of the data and blob routes ---------------- */

static int data_read(void *src, uint64_t off, uint64_t len, uint8_t *dest, tv_error *err)
{
    data_src *d = src;
    return pooled_read(d->api, d->model, d->generation, d->name, off, len, dest, err);
}

static void stream_release(void *state)
{
    bytes_stream *s = state;
    if (!s)
        return;
    if (s->src_free)
        s->src_free(s->src);
    free(s);
}

int tv__api_bytes_reply(tv__api_ctx *c, const char *etag, uint64_t n, void *src,
                        tv__api_bytes_read_fn read_fn, void (*src_free)(void *src),
                        const char *what)
{
    tv__api_resp *r = c->resp;
    int rc = 0;
    tv__api_header(r, "ETag", "%s", etag);
    tv__api_header(r, "Accept-Ranges", "bytes");
    uint64_t first = 0, len = n;
    if (inm_matches(c->req->if_none_match, etag)) {
        /* A stream of the 200's length, never read: MHD sends no body with
         * a 304 but its Content-Length, which must be the 200's (RFC 9110
         * 8.6), not 0. */
        r->status = 304;
        goto stream;
    }
    enum range_kind rk = parse_range(c->req->range, n, &first, &len);
    if (rk == RANGE_BAD) {
        tv__api_header(r, "Content-Range", "bytes */%" PRIu64, n);
        rc = tv__seterr(&c->err, TV_E_RANGE,
                        "Range '%.80s' is not satisfiable for %s of %" PRIu64 " bytes",
                        c->req->range, what, n);
        goto out;
    }
    if (rk == RANGE_ONE)
        tv__api_header(r, "Content-Range", "bytes %" PRIu64 "-%" PRIu64 "/%" PRIu64, first,
                       first + len - 1, n);
    r->status = rk == RANGE_ONE ? 206 : 200;
    r->content_type = "application/octet-stream";
    /* HEAD: the transport sends no body, so a stream (its length only)
     * reads nothing from the devices. */
    bool head = c->req->method && !strcmp(c->req->method, "HEAD");
    if (!head && len <= tv__api_whole_body_max && len > 0 && len == n &&
        whole_reserve(c->api, len)) {
        whole_body *w = malloc(sizeof *w);
        void *p = w ? buf_get(c->api, (size_t)len, &w->cap) : NULL;
        if (!p) {
            free(w);
            atomic_fetch_sub(&c->api->whole_inflight, len);
            rc = tv__seterr(&c->err, -ENOMEM, "out of memory for %" PRIu64 " bytes of %s", len,
                            what);
            goto out;
        }
        w->api = c->api;
        w->p = p;
        w->len = len;
        if ((rc = read_fn(src, 0, len, p, &c->err))) {
            release_body(w);
            goto out;
        }
        r->body = p;
        r->body_len = len;
        r->body_release = release_body;
        r->body_owner = w;
        goto out;
    }
    if (!head && len <= tv__api_whole_body_max && len < TV__API_STREAM_PIECE) {
        uint8_t *b = malloc(len ? len : 1);
        if (!b) {
            rc = tv__seterr(&c->err, -ENOMEM, "out of memory for %" PRIu64 " bytes of %s", len,
                            what);
            goto out;
        }
        if ((rc = read_fn(src, first, len, b, &c->err))) {
            free(b);
            goto out;
        }
        r->body = (char *)b;
        r->body_len = len;
        goto out;
    }
stream:;
    bytes_stream *s = malloc(sizeof *s);
    if (!s) {
        rc = tv__seterr(&c->err, -ENOMEM, "out of memory");
        goto out;
    }
    *s = (bytes_stream){.src = src, .read = read_fn, .src_free = src_free, .begin = first};
    snprintf(s->what, sizeof s->what, "%s", what);
    src = NULL; /* the stream owns it now */
    r->stream = true;
    r->stream_len = len;
    r->stream_state = s;
    r->stream_release = stream_release;
out:
    if (src && src_free)
        src_free(src);
    return rc;
}

/* ---- the route -------------------------------------------------------------------- */

int tv__api_h_data(tv__api_ctx *c)
{
    static const char *const none[] = {NULL};
    tv__reg *reg;
    tv__reg_generation g;
    tv__reg_tensor_row row = {0};
    json_t *shards = NULL;
    const char *model = c->param[0], *name = c->param[2];
    int rc;
    if ((rc = tv__api_query_allow(c, none)) || (rc = tv__api_reader(c, &reg)) ||
        (rc = tv__api_gen_row(c, reg, model, c->param[1], &g)) ||
        (rc = tv__reg_tensor_get(reg, g.id, name, &row, &c->err)))
        goto out;
    if (g.state != TV__GEN_READY && g.state != TV__GEN_RETIRED) {
        rc = tv__seterr(&c->err, TV_E_STATE,
                        "generation %" PRId64 " of '%s' is %s: it has no bytes to read", g.number,
                        model, tv__gen_state_name(g.state));
        goto out;
    }
    if ((rc = tv__api_shards(c, reg, &g, &shards)))
        goto out;
    const char *sha =
        json_string_value(json_object_get(json_array_get(shards, row.shard_idx), "sha256"));
    if (!sha) {
        rc = tv__seterr(&c->err, TV_E_REGISTRY, "tensor '%s' names shard %u of %zu", name,
                        row.shard_idx, json_array_size(shards));
        goto out;
    }
    char etag[TV__REG_SHA256_HEX_LEN + 48];
    snprintf(etag, sizeof etag, "\"%s:%" PRIu64 "-%" PRIu64 "\"", sha, row.begin_off, row.end_off);
    size_t ml = strlen(model), nl = strlen(name);
    data_src *d = malloc(sizeof *d + ml + nl + 2);
    if (!d) {
        rc = tv__seterr(&c->err, -ENOMEM, "out of memory");
        goto out;
    }
    d->api = c->api;
    d->generation = g.number;
    d->model = d->mem;
    memcpy(d->model, model, ml + 1);
    d->name = d->mem + ml + 1;
    memcpy(d->name, name, nl + 1);
    char what[TV__REG_NAME_MAX + 64];
    snprintf(what, sizeof what, "tensor '%.*s'", TV__REG_NAME_MAX, name);
    rc = tv__api_bytes_reply(c, etag, row.end_off - row.begin_off, d, data_read, free, what);
out:
    free(row.name);
    json_decref(shards);
    return rc;
}

ssize_t tv__api_stream_read(tv__api_resp *resp, uint64_t pos, void *buf, size_t max)
{
    if (!resp || !resp->stream || !resp->stream_state || !buf)
        return TV_E_INVALID_ARG;
    if (pos >= resp->stream_len || max == 0)
        return 0;
    bytes_stream *s = resp->stream_state;
    uint64_t n = resp->stream_len - pos;
    if (n > max)
        n = max;
    if (n > TV__API_STREAM_PIECE)
        n = TV__API_STREAM_PIECE;
    tv_error err = {0};
    int rc = s->read(s->src, s->begin + pos, n, buf, &err);
    if (rc) {
        tv__log(TV_LOG_WARN, "%s: streaming at %" PRIu64 ": %s", s->what, s->begin + pos, err.msg);
        return rc;
    }
    return (ssize_t)n;
}
