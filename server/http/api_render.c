/* The schema renderers: one function per object of docs/openapi.yaml, used
 * by every route and by the CLI's printers, so that a field has one name,
 * one type and one shape everywhere; and the status table with the error
 * document, the one form of every failure.
 * Invariants: "none" is JSON null (never 0 or ""); byte quantities come
 * from uint64_t values the registry keeps at most INT64_MAX; every return
 * code has one HTTP status (tv__api_http_status). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fastpath/fastpath.h"
#include "http/api_internal.h"

#ifndef TV__BUILD_GIT /* set by server/CMakeLists.txt: git describe at configure time */
#define TV__BUILD_GIT "unknown"
#endif

/* ---- errors -------------------------------------------------------------- */

int tv__api_http_status(int code)
{
    /* The checkpoint parser's codes: TV_E_FILE_SHORT .. TV_E_ST_INT_RANGE and
     * TV_E_IDX_JSON .. TV_E_IDX_TOO_MANY_SHARDS (an invalid checkpoint). */
    if ((code <= TV_E_FILE_SHORT && code >= TV_E_ST_INT_RANGE) ||
        (code <= TV_E_IDX_JSON && code >= TV_E_IDX_TOO_MANY_SHARDS))
        return 422;
    switch (code) {
    case 0:
        return 200;
    case TV_E_BAD_REQUEST:
    case TV_E_INVALID_ARG:
    case TV_E_NAME:
        return 400;
    case TV_E_UNAUTHORIZED:
        return 401;
    case TV_E_FORBIDDEN:
    case TV_E_OUTSIDE_ROOTS:
    case TV_E_PEER_DENIED:
        return 403;
    case TV_E_NOT_FOUND:
    case TV_E_CKPT_NOT_FOUND:
    case -ENOENT:
        return 404;
    case TV_E_STATE:
    case TV_E_CONFLICT:
    case TV_E_LEASED:
    case -EEXIST:
        return 409;
    case TV_E_TOO_LARGE:
        return 413;
    case TV_E_RANGE:
        return 416;
    case TV_E_BUSY:
    case TV_E_LOCKED:
        return 503;
    case TV_E_NO_SPACE:
        return 507;
    default:
        return 500;
    }
}

json_t *tv__api_error_json(int code, const char *message)
{
    /* The message may quote request bytes that are not UTF-8. */
    return json_pack("{s:{s:s,s:o,s:i}}", "error", "code", tv_err_name(code), "message",
                     tv__api_jstr(message && *message ? message : tv_strerror(code)), "errno",
                     code);
}

/* ---- objects ------------------------------------------------------------- */

/* Length of the valid UTF-8 sequence at s (n bytes left), or 0. */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
    unsigned char c = s[0];
    size_t len;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF)
        len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        lo = c == 0xE0 ? 0xA0 : 0x80;
        hi = c == 0xED ? 0x9F : 0xBF;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        lo = c == 0xF0 ? 0x90 : 0x80;
        hi = c == 0xF4 ? 0x8F : 0xBF;
    } else
        return 0;
    if (n < len || s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < len; i++)
        if (s[i] < 0x80 || s[i] > 0xBF)
            return 0;
    return len;
}

json_t *tv__api_jstr(const char *s)
{
    if (!s)
        return json_null();
    json_t *j = json_string(s);
    if (j)
        return j;
    /* Not UTF-8 (a raw path byte, a path on disk): each bad byte becomes
     * U+FFFD, so a document can always be built. */
    size_t n = strlen(s), o = 0;
    char *buf = malloc(3 * n + 1);
    if (!buf)
        return NULL;
    for (size_t i = 0; i < n;) {
        size_t l = utf8_seq((const unsigned char *)s + i, n - i);
        if (l) {
            memcpy(buf + o, s + i, l);
            o += l;
            i += l;
        } else {
            memcpy(buf + o, "\xef\xbf\xbd", 3);
            o += 3;
            i++;
        }
    }
    j = json_stringn(buf, o);
    free(buf);
    return j;
}

static json_t *jint(uint64_t v)
{
    return json_integer((json_int_t)(v > (uint64_t)INT64_MAX ? (uint64_t)INT64_MAX : v));
}

/* Steals v; returns false on a NULL (out of memory) value. */
static bool put(json_t *o, const char *k, json_t *v)
{
    return v && o && json_object_set_new(o, k, v) == 0;
}

static json_t *done(json_t *o, bool ok)
{
    if (!ok) {
        json_decref(o);
        return NULL;
    }
    return o;
}

json_t *tv__api_device_json(const tv__reg_device *d, const tv__alloc_space *sp, const char *status,
                            const char *message)
{
    json_t *o = json_object();
    json_error_t je;
    json_t *ident = json_loads(d->identity, 0, &je);
    if (ident && !json_is_object(ident)) {
        json_decref(ident);
        ident = NULL;
    }
    bool ok =
        put(o, "id", json_integer(d->id)) && put(o, "uuid", tv__api_jstr(d->uuid)) &&
        put(o, "kind", tv__api_jstr(d->kind)) && put(o, "path", tv__api_jstr(d->path)) &&
        put(o, "lba_size", jint(d->lba_size)) && put(o, "io_align", jint(d->io_align)) &&
        put(o, "object_align", jint(d->object_align)) &&
        put(o, "size_bytes", jint(d->size_bytes)) && put(o, "region_offset", jint(d->region_off)) &&
        put(o, "region_bytes", jint(d->region_len)) && put(o, "data_offset", jint(d->data_off)) &&
        put(o, "used_bytes", jint(sp->used_len)) && put(o, "free_bytes", jint(sp->free_len)) &&
        put(o, "largest_free_bytes", jint(sp->largest_free_len)) &&
        put(o, "n_objects", jint(sp->n_used)) &&
        put(o, "identity", ident ? ident : json_object()) &&
        put(o, "status", tv__api_jstr(status)) &&
        put(o, "message", tv__api_jstr(strcmp(status, "ok") && message ? message : ""));
    return done(o, ok);
}

json_t *tv__api_model_json(const tv__reg_model *m, const tv__reg_alias *aliases, size_t n_aliases)
{
    json_t *o = json_object(), *al = json_object();
    bool ok = al != NULL;
    for (size_t i = 0; ok && i < n_aliases; i++)
        ok = put(al, aliases[i].alias, json_integer(aliases[i].generation));
    if (!ok)
        json_decref(al);
    ok = ok && put(o, "name", tv__api_jstr(m->name)) &&
         put(o, "active_generation",
             m->active_generation ? json_integer(m->active_generation) : json_null()) &&
         put(o, "aliases", al) && put(o, "n_generations", json_integer(m->n_generations)) &&
         put(o, "created_at", json_integer(m->created_at));
    return done(o, ok);
}

json_t *tv__api_shard_json(const tv__reg_shard *s)
{
    json_t *o = json_object(), *reps = json_array();
    bool ok = reps != NULL;
    for (size_t i = 0; ok && i < s->n_replicas; i++) {
        json_t *r = json_object();
        ok = put(r, "device_id", json_integer(s->replicas[i].device_id)) &&
             put(r, "object_id", json_integer(s->replicas[i].object_id)) &&
             put(r, "device_offset", jint(s->replicas[i].base_off));
        if (!ok || json_array_append_new(reps, r)) {
            json_decref(ok ? NULL : r);
            ok = false;
        }
    }
    if (!ok)
        json_decref(reps);
    ok = ok && put(o, "index", json_integer(s->idx)) && put(o, "name", tv__api_jstr(s->name)) &&
         put(o, "file_bytes", jint(s->file_len)) && put(o, "header_bytes", jint(s->header_len)) &&
         put(o, "sha256", tv__api_jstr(s->sha256)) && put(o, "replicas", reps);
    return done(o, ok);
}

json_t *tv__api_generation_json(const tv__reg_generation *g, const tv__reg_alias *aliases,
                                size_t n_aliases, const tv__reg_manifest *shards)
{
    json_t *o = json_object(), *al = json_array();
    bool ok = al != NULL;
    for (size_t i = 0; ok && i < n_aliases; i++)
        if (aliases[i].generation == g->number)
            ok = json_array_append_new(al, tv__api_jstr(aliases[i].alias)) == 0;
    if (!ok)
        json_decref(al);
    const char *state = tv__gen_state_name(g->state);
    ok = ok && put(o, "model", tv__api_jstr(g->model)) &&
         put(o, "generation", json_integer(g->number)) &&
         put(o, "state", tv__api_jstr(state ? state : "failed")) &&
         put(o, "active", json_boolean(g->active)) && put(o, "aliases", al) &&
         put(o, "n_shards", json_integer(g->n_shards)) &&
         put(o, "n_tensors", json_integer(g->n_tensors)) &&
         put(o, "total_bytes", jint(g->total_bytes)) && put(o, "source", tv__api_jstr(g->source)) &&
         put(o, "created_at", json_integer(g->created_at)) &&
         put(o, "n_files", json_integer(g->n_files));
    if (ok && shards) {
        json_t *arr = json_array();
        ok = arr != NULL;
        for (size_t i = 0; ok && i < shards->n_shards; i++)
            ok = json_array_append_new(arr, tv__api_shard_json(&shards->shards[i])) == 0;
        if (!ok)
            json_decref(arr);
        ok = ok && put(o, "shards", arr);
    }
    return done(o, ok);
}

json_t *tv__api_tensor_json(const tv__reg_tensor_row *t, json_t *shard)
{
    json_t *o = json_object(), *shape = json_array(), *offs = json_array();
    bool ok = shape && offs;
    for (uint32_t i = 0; ok && i < t->rank; i++)
        ok = json_array_append_new(shape, jint(t->shape[i])) == 0;
    ok = ok && json_array_append_new(offs, jint(t->begin_off)) == 0 &&
         json_array_append_new(offs, jint(t->end_off)) == 0;
    if (!ok) {
        json_decref(shape);
        json_decref(offs);
    }
    const char *dt = tv_dtype_name(t->dtype);
    ok = ok && put(o, "name", tv__api_jstr(t->name)) &&
         put(o, "dtype", tv__api_jstr(dt ? dt : "unknown")) && put(o, "shape", shape) &&
         put(o, "shard", tv__api_jstr(t->shard)) &&
         put(o, "shard_index", json_integer(t->shard_idx)) && put(o, "data_offsets", offs) &&
         put(o, "nbytes", jint(t->end_off - t->begin_off));
    if (ok && shard) {
        /* data_off = 8 + header_len; offsets were checked at import */
        uint64_t data = 8 + t->header_len + t->begin_off;
        ok = put(o, "file_offset", jint(data));
        json_t *reps = json_array(), *sr = json_object_get(shard, "replicas");
        ok = ok && reps != NULL;
        for (size_t i = 0; ok && i < json_array_size(sr); i++) {
            json_t *x = json_array_get(sr, i), *r = json_object();
            uint64_t base = (uint64_t)json_integer_value(json_object_get(x, "device_offset"));
            ok = put(r, "device_id", json_copy(json_object_get(x, "device_id"))) &&
                 put(r, "device_offset", jint(base + data));
            if (!ok || json_array_append_new(reps, r)) {
                json_decref(ok ? NULL : r);
                ok = false;
            }
        }
        if (!ok)
            json_decref(reps);
        ok = ok && put(o, "replicas", reps);
    }
    return done(o, ok);
}

json_t *tv__api_alias_json(const char *model, const char *alias, int64_t generation)
{
    json_t *o = json_object();
    bool ok = put(o, "model", tv__api_jstr(model)) && put(o, "alias", tv__api_jstr(alias)) &&
              put(o, "generation", json_integer(generation));
    return done(o, ok);
}

json_t *tv__api_token_json(const tv__reg_token *t)
{
    json_t *o = json_object();
    bool ok = put(o, "id", json_integer(t->id)) && put(o, "name", tv__api_jstr(t->name)) &&
              put(o, "scope",
                  tv__api_jstr(tv__scope_name(t->scope) ? tv__scope_name(t->scope) : "read")) &&
              put(o, "created_at", json_integer(t->created_at)) &&
              put(o, "revoked_at", t->revoked_at ? json_integer(t->revoked_at) : json_null());
    return done(o, ok);
}

json_t *tv__api_version_json(void)
{
    /* What this build has (not whether a GPU is present now: tv_cuda_available
     * answers that); TV__BUILD_* come from server/CMakeLists.txt. */
#ifdef TV__BUILD_HAVE_CUDA
    bool cuda = true;
#else
    bool cuda = false;
#endif
#ifdef TV__BUILD_HAVE_NVME
    bool nvme = true;
#else
    bool nvme = false;
#endif
    return json_pack("{s:s,s:s,s:s,s:s,s:{s:b,s:b,s:b}}", "name", "tensorvault", "version",
                     tv_version(), "git", TV__BUILD_GIT, "api", "v1", "features", "cuda", cuda,
                     "nvme", nvme, "io_uring", true);
}

/* "2026-12-01T13:00:00Z" (UTC) of unix seconds. */
static json_t *utc_time(int64_t t)
{
    char buf[32];
    struct tm tm;
    time_t tt = (time_t)t;
    if (!gmtime_r(&tt, &tm) || !strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm))
        return json_null();
    return json_string(buf);
}

json_t *tv__api_session_json(const tv__fp_session_info *s)
{
    json_t *o = json_object(), *hs = json_array();
    bool ok = hs != NULL;
    for (size_t i = 0; ok && i < s->n_handles; i++) {
        const tv__fp_handle_info *h = &s->handles[i];
        json_t *ho = json_object();
        ok = put(ho, "handle", jint(h->handle)) && put(ho, "model", tv__api_jstr(h->model)) &&
             put(ho, "spec", tv__api_jstr(h->spec)) &&
             put(ho, "generation", json_integer(h->generation)) &&
             put(ho, "bytes_delivered", jint(h->bytes_delivered)) &&
             put(ho, "view_bytes", jint(h->view_bytes)) &&
             put(ho, "legacy", json_boolean(h->legacy)) &&
             put(ho, "stalled", json_boolean(h->stalled));
        if (!ok || json_array_append_new(hs, ho)) {
            json_decref(ok ? NULL : ho);
            ok = false;
        }
    }
    if (!ok)
        json_decref(hs);
    ok = ok && put(o, "id", jint(s->id)) && put(o, "pid", json_integer((json_int_t)s->pid)) &&
         put(o, "uid", jint((uint64_t)s->uid)) && put(o, "gid", jint((uint64_t)s->gid)) &&
         put(o, "connected", utc_time(s->connected_unix)) &&
         put(o, "bytes_delivered", jint(s->bytes_delivered)) &&
         put(o, "requests_done", jint(s->requests_done)) &&
         put(o, "slots_held", jint(s->slots_held)) && put(o, "view_bytes", jint(s->view_bytes)) &&
         put(o, "protocol_version", jint(s->version)) && put(o, "handles", hs);
    return done(o, ok);
}

json_t *tv__api_tier_json(const tv__fp_stats *st, bool enabled)
{
    static const char *const kinds[] = {"small", "thp", "hugetlb"};
    json_t *o = json_object();
    bool ok =
        put(o, "enabled", json_boolean(enabled)) &&
        put(o, "budget_bytes", jint(st->tier_budget_bytes)) &&
        put(o, "bound_bytes", jint(st->tier_bound_bytes)) &&
        put(o, "resident_bytes", jint(st->tier_resident_bytes)) &&
        put(o, "view_bytes", jint(st->tier_view_bytes)) &&
        put(o, "generations", jint(st->tier_generations)) && put(o, "hits", jint(st->tier_hits)) &&
        put(o, "hit_bytes", jint(st->tier_hit_bytes)) && put(o, "misses", jint(st->tier_misses)) &&
        put(o, "miss_bytes", jint(st->tier_miss_bytes)) &&
        put(o, "evictions", jint(st->tier_evictions)) &&
        put(o, "evicted_bytes", jint(st->tier_evicted_bytes)) &&
        put(o, "device_read_bytes", jint(st->device_read_bytes)) &&
        put(o, "delivered_bytes", jint(st->delivered_bytes)) &&
        put(o, "shared_bytes", jint(st->shared_bytes)) && put(o, "views", jint(st->views)) &&
        put(o, "member_stalls", jint(st->member_stalls)) &&
        put(o, "pages", json_string(kinds[st->tier_pages < 3 ? st->tier_pages : 0])) &&
        put(o, "page_bytes", jint(st->tier_page_bytes));
    return done(o, ok);
}

static json_t *str_or_null(const char *s)
{
    return s && *s ? tv__api_jstr(s) : json_null();
}

static json_t *int_or_null(int64_t v)
{
    return v ? json_integer(v) : json_null();
}

json_t *tv__api_job_json(const tv__reg_job *j)
{
    const char *state = tv__job_state_name(j->state), *kind = tv__job_kind_name(j->kind);
    json_t *err = json_null(), *result = json_null(), *eta = json_null();
    if (j->error_errno || j->error_code[0])
        err = json_pack("{s:s,s:o,s:i}", "code",
                        j->error_code[0] ? j->error_code : tv_err_name(j->error_errno), "message",
                        tv__api_jstr(j->error[0] ? j->error : tv_strerror(j->error_errno)), "errno",
                        j->error_errno);
    if (j->result_json) {
        json_error_t je;
        json_t *r = json_loads(j->result_json, 0, &je);
        if (r && json_is_object(r)) {
            json_decref(result);
            result = r;
        } else {
            json_decref(r);
        }
    }
    if (j->state == TV__JOB_RUNNING && j->rate_bytes_per_s > 0 && j->bytes_total >= j->bytes_done)
        eta = json_real((double)(j->bytes_total - j->bytes_done) / j->rate_bytes_per_s);
    if (!err || !eta)
        goto fail;
    json_t *o = json_pack(
        "{s:I,s:s,s:s,s:o,s:o,s:b,s:o,s:b,s:o,s:I,s:I,s:f,s:o,s:o,s:o,s:I,s:o,s:o,s:o}", "id",
        (json_int_t)j->id, "kind", kind ? kind : "import", "state", state ? state : "failed",
        "model", str_or_null(j->model), "source", str_or_null(j->source), "activate", j->activate,
        "alias", str_or_null(j->alias), "strict", j->strict, "step", str_or_null(j->step),
        "bytes_done", (json_int_t)j->bytes_done, "bytes_total", (json_int_t)j->bytes_total,
        "rate_bytes_per_s", j->rate_bytes_per_s, "eta_seconds", eta, "error", err, "generation",
        int_or_null(j->generation), "created_at", (json_int_t)j->created_at, "started_at",
        int_or_null(j->started_at), "finished_at", int_or_null(j->finished_at), "result", result);
    return o; /* json_pack's "o" steals err, eta and result even on failure */
fail:
    json_decref(err);
    json_decref(eta);
    json_decref(result);
    return NULL;
}
