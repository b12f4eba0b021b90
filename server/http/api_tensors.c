/* The tensor routes of a generation: the list (by file order, name or
 * size, with a prefix and a substring), one tensor's document (file offset, replicas), and
 * its bytes (GET/HEAD .../tensors/{tensor}/data).
 * Invariants: documents of ready generations come from the cache
 * (api_cache.c); bytes are read only from a ready or retired generation,
 * through the handle pool (api_handles.c), and answered as a byte body
 * (api_bytes.c: ETag, Range, streaming) whose ETag names the shard's hash
 * and the tensor's offsets. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http/api_internal.h"
#include "util/internal.h"

static const char *const NO_FIELDS[] = {NULL};

/* order=size's cursor key: "NBYTES:NAME" (NBYTES canonical decimal). */
static int size_cursor_parse(tv__api_ctx *c, char *key, uint64_t *nbytes, const char **name)
{
    char *colon = key ? strchr(key, ':') : NULL;
    int64_t v = 0;
    if (!colon || !colon[1])
        goto bad;
    *colon = '\0';
    bool ok = !strcmp(key, "0") || tv__parse_pos_i64(key, &v);
    *colon = ':';
    if (!ok)
        goto bad;
    *nbytes = (uint64_t)v;
    *name = colon + 1;
    return 0;
bad:
    return tv__seterr(&c->err, TV_E_BAD_REQUEST,
                      "malformed cursor (pass next_cursor of the previous page as it is)");
}

int tv__api_h_tensors(tv__api_ctx *c)
{
    static const char *const q[] = {"limit", "cursor", "prefix", "contains", "order", NULL};
    static const char kinds[] = {
        [TV__REG_TENSORS_FILE] = 'f', [TV__REG_TENSORS_NAME] = 'n', [TV__REG_TENSORS_SIZE] = 's'};
    tv__reg *reg;
    tv__reg_generation g;
    tv__reg_tensor_row *rows = NULL;
    size_t limit, n = 0, kl = 0;
    char *after = NULL, *key = NULL;
    const char *after_name = NULL;
    int64_t after_id = 0;
    uint64_t after_nbytes = 0;
    bool more = false;
    tv__reg_tensor_order ord = TV__REG_TENSORS_FILE;
    json_t *arr = NULL;
    int rc;
    if ((rc = tv__api_query_allow(c, q)) || (rc = tv__api_query_limit(c, &limit)))
        goto out;
    const char *order = tv__api_query(c, "order");
    if (order && strcmp(order, "file") && strcmp(order, "name") && strcmp(order, "size")) {
        rc = tv__seterr(&c->err, TV_E_BAD_REQUEST, "bad order '%.40s': file, name or size", order);
        goto out;
    }
    if (order && !strcmp(order, "name"))
        ord = TV__REG_TENSORS_NAME;
    else if (order && !strcmp(order, "size"))
        ord = TV__REG_TENSORS_SIZE;
    /* A cursor continues the listing it was made for: its kind is its
     * order, whatever order says (as prefix, which it does not record
     * either, is the request's). */
    const char *cur = tv__api_query(c, "cursor");
    for (size_t k = 0; cur && k < sizeof kinds; k++)
        if (cur[0] == kinds[k])
            ord = (tv__reg_tensor_order)k;
    if ((rc = tv__api_cursor_get(c, kinds[ord], &after, &kl)))
        goto out;
    if (after && ord == TV__REG_TENSORS_FILE && !tv__parse_pos_i64(after, &after_id)) {
        rc = tv__seterr(&c->err, TV_E_BAD_REQUEST,
                        "malformed cursor (pass next_cursor of the previous page as it is)");
        goto out;
    }
    if (ord == TV__REG_TENSORS_NAME)
        after_name = after ? after : "";
    if (after && ord == TV__REG_TENSORS_SIZE &&
        (rc = size_cursor_parse(c, after, &after_nbytes, &after_name)))
        goto out;
    const char *prefix = tv__api_query(c, "prefix");
    const char *contains = tv__api_query(c, "contains");
    if ((rc = tv__api_reader(c, &reg)) ||
        (rc = tv__api_gen_row(c, reg, c->param[0], c->param[1], &g)) ||
        (rc = tv__reg_tensors_search(reg, g.id, prefix, contains, ord, after_id, after_nbytes,
                                     after_name, limit, &rows, &n, &more, &c->err)))
        goto out;
    arr = json_array();
    for (size_t i = 0; !rc && i < n; i++)
        if (json_array_append_new(arr, tv__api_tensor_json(&rows[i], NULL)))
            rc = tv__seterr(&c->err, -ENOMEM, "out of memory");
    if (!rc) {
        json_t *next;
        if (ord == TV__REG_TENSORS_NAME) {
            next = tv__api_cursor_json(more && n, 'n', n ? rows[n - 1].name : "",
                                       n ? strlen(rows[n - 1].name) : 0);
        } else if (ord == TV__REG_TENSORS_SIZE) {
            size_t klen = 0;
            int ll = 0;
            if (more && n) {
                const tv__reg_tensor_row *t = &rows[n - 1];
                if (__builtin_add_overflow(strlen(t->name), (size_t)24, &klen) ||
                    !(key = malloc(klen)))
                    rc = tv__seterr(&c->err, -ENOMEM, "out of memory");
                else
                    ll = snprintf(key, klen, "%" PRIu64 ":%s", t->end_off - t->begin_off, t->name);
            }
            next = tv__api_cursor_json(more && n && !rc, 's', key ? key : "", (size_t)ll);
        } else {
            char last[24];
            int ll = snprintf(last, sizeof last, "%" PRId64, n ? rows[n - 1].row_id : 0);
            next = tv__api_cursor_json(more && n, 'f', last, (size_t)ll);
        }
        if (rc) {
            json_decref(next);
        } else {
            rc =
                tv__api_reply(c, 200,
                              json_pack("{s:s,s:I,s:o,s:o}", "model", g.model, "generation",
                                        (json_int_t)g.number, "tensors", arr, "next_cursor", next));
            arr = NULL;
        }
    }
out:
    json_decref(arr);
    tv__reg_tensor_rows_free(rows, n);
    free(after);
    free(key);
    return rc;
}

int tv__api_h_tensor(tv__api_ctx *c)
{
    tv__reg *reg;
    tv__reg_generation g;
    json_t *doc = NULL;
    int rc;
    if ((rc = tv__api_query_allow(c, NO_FIELDS)) || (rc = tv__api_reader(c, &reg)) ||
        (rc = tv__api_gen_row(c, reg, c->param[0], c->param[1], &g)) ||
        (rc = tv__api_tensor_doc(c, reg, &g, c->param[2], &doc)))
        return rc;
    return tv__api_reply(c, 200, doc);
}

/* The source of a tensor's bytes (a body's src): a pooled handle on
 * (model, generation) reads them. */
typedef struct data_src {
    tv__api *api;
    int64_t generation;
    char *model, *name;
    char mem[]; /* model NUL name NUL */
} data_src;

static int data_read(void *src, uint64_t off, uint64_t len, uint8_t *dest, tv_error *err)
{
    data_src *d = src;
    return tv__api_model_read(d->api, d->model, d->generation, d->name, off, len, dest, err);
}

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
