/* TEMPORARY (issue 9): weak stand-ins for the reg and daemon seams of
 * API9.md that are not on main yet (see api_seams_tmp.h), built from what
 * the registry has today so the api's read routes work and can be tested.
 * The file compiles to nothing once registry.h / daemon/jobs.h carry the
 * real seams; delete it then. */
#include "http/api_seams_tmp.h"

#if defined(TV__API_SEAMS_TMP_REG) || defined(TV__API_SEAMS_TMP_JOBS)
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/internal.h"

#define WEAK __attribute__((weak))
#endif

#ifdef TV__API_SEAMS_TMP_REG
WEAK int tv__alias_name_valid(const char *alias, tv_error *err)
{
    size_t n = alias ? strlen(alias) : 0;
    bool ok = n >= 1 && n <= 64 &&
              ((alias[0] >= 'A' && alias[0] <= 'Z') || (alias[0] >= 'a' && alias[0] <= 'z')) &&
              strcmp(alias, "active");
    for (size_t i = 1; ok && i < n; i++) {
        char ch = alias[i];
        ok = (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') ||
             ch == '.' || ch == '_' || ch == '-';
    }
    return ok ? 0 : tv__seterr(err, TV_E_NAME, "bad alias name '%.80s'", alias ? alias : "");
}

WEAK int tv__reg_alias_set(tv__reg *r, const char *model, const char *alias, int64_t number,
                           tv_error *err)
{
    (void)r, (void)alias, (void)number;
    return tv__seterr(err, TV_E_NOT_SUPPORTED, "aliases of '%s': not in this build yet", model);
}

WEAK int tv__reg_alias_remove(tv__reg *r, const char *model, const char *alias, int64_t *number,
                              tv_error *err)
{
    (void)r, (void)number;
    return tv__seterr(err, TV_E_NOT_FOUND, "alias '%s' of model '%s' not found", alias, model);
}

WEAK int tv__reg_alias_get(tv__reg *r, const char *model, const char *alias, int64_t *number,
                           tv_error *err)
{
    if (!strcmp(alias, "active"))
        return tv__reg_active_generation(r, model, number, err);
    return tv__seterr(err, TV_E_NOT_FOUND, "alias '%s' of model '%s' not found", alias, model);
}

WEAK int tv__reg_aliases_list(tv__reg *r, const char *model, tv__reg_alias **out, size_t *n,
                              tv_error *err)
{
    (void)r, (void)model, (void)err;
    *out = NULL;
    *n = 0;
    return 0;
}

WEAK int tv__reg_resolve_gen(tv__reg *r, const char *model, const char *spec, int64_t *number,
                             tv_error *err)
{
    return tv__reg_alias_get(r, model, spec, number, err);
}

WEAK int tv__reg_model_delete(tv__reg *r, const char *model, size_t *n_retired, tv_error *err)
{
    (void)r, (void)n_retired;
    return tv__seterr(err, TV_E_NOT_SUPPORTED, "deleting model '%s': not in this build yet", model);
}

WEAK int tv__reg_model_get(tv__reg *r, const char *model, tv__reg_model *out, tv_error *err)
{
    tv__reg_model *ms = NULL;
    size_t n = 0;
    int rc = tv__reg_models_list(r, &ms, &n, err);
    for (size_t i = 0; !rc && i < n; i++)
        if (!strcmp(ms[i].name, model)) {
            *out = ms[i];
            free(ms);
            return 0;
        }
    free(ms);
    return rc ? rc : tv__seterr(err, TV_E_NOT_FOUND, "model '%s' not found", model);
}

WEAK int tv__reg_models_page(tv__reg *r, const char *after, size_t limit, tv__reg_model **out,
                             size_t *n, bool *more, tv_error *err)
{
    tv__reg_model *ms = NULL;
    size_t k = 0, j = 0;
    int rc = tv__reg_models_list(r, &ms, &k, err);
    *out = NULL;
    *n = 0;
    *more = false;
    if (rc)
        return rc;
    for (size_t i = 0; i < k; i++)
        if (strcmp(ms[i].name, after) > 0) {
            if (j == limit) {
                *more = true;
                break;
            }
            ms[j++] = ms[i];
        }
    *out = ms;
    *n = j;
    return 0;
}

WEAK int tv__reg_generations_page(tv__reg *r, const char *model, int64_t after, size_t limit,
                                  tv__reg_generation **out, size_t *n, bool *more, tv_error *err)
{
    tv__reg_generation *gs = NULL;
    size_t k = 0, j = 0;
    int rc = tv__reg_generations_list(r, model, &gs, &k, err);
    *out = NULL;
    *n = 0;
    *more = false;
    if (rc)
        return rc;
    for (size_t i = 0; i < k; i++)
        if (gs[i].number > after) {
            if (j == limit) {
                *more = true;
                break;
            }
            gs[j++] = gs[i];
        }
    *out = gs;
    *n = j;
    return 0;
}

WEAK void tv__reg_tensor_rows_free(tv__reg_tensor_row *rows, size_t n)
{
    for (size_t i = 0; rows && i < n; i++)
        free(rows[i].name);
    free(rows);
}

static void row_from(const tv__reg_manifest *mf, size_t i, tv__reg_tensor_row *o)
{
    const tv__reg_tensor *t = &mf->tensors[i];
    const tv__reg_shard *s = &mf->shards[t->shard_idx];
    memset(o, 0, sizeof *o);
    o->row_id = (int64_t)i + 1;
    o->name = strdup(t->name);
    o->dtype = t->dtype;
    o->rank = t->rank;
    memcpy(o->shape, t->shape, sizeof o->shape);
    o->shard_idx = t->shard_idx;
    snprintf(o->shard, sizeof o->shard, "%s", s->name);
    o->begin_off = t->begin_off;
    o->end_off = t->end_off;
    o->header_len = s->header_len;
}

static const tv__reg_manifest *g_sort_mf;
static int by_name_cmp(const void *a, const void *b)
{
    return strcmp(g_sort_mf->tensors[*(const size_t *)a].name,
                  g_sort_mf->tensors[*(const size_t *)b].name);
}

WEAK int tv__reg_tensors_page(tv__reg *r, int64_t gid, const char *prefix, bool by_name,
                              int64_t after_id, const char *after_name, size_t limit,
                              tv__reg_tensor_row **out, size_t *n, bool *more, tv_error *err)
{
    tv__reg_manifest *mf = NULL;
    int rc = tv__reg_tensors_list(r, gid, &mf, err);
    *out = NULL;
    *n = 0;
    *more = false;
    if (rc)
        return rc;
    size_t *ix = calloc(mf->n_tensors + 1, sizeof *ix);
    tv__reg_tensor_row *rows = calloc(limit + 1, sizeof *rows);
    size_t j = 0;
    for (size_t i = 0; ix && i < mf->n_tensors; i++)
        ix[i] = i;
    if (ix && by_name) {
        g_sort_mf = mf; /* stub only: not thread-safe */
        qsort(ix, mf->n_tensors, sizeof *ix, by_name_cmp);
    }
    for (size_t k = 0; ix && rows && k < mf->n_tensors; k++) {
        size_t i = ix[k];
        const char *nm = mf->tensors[i].name;
        if (prefix && strncmp(nm, prefix, strlen(prefix)))
            continue;
        if (by_name ? (after_name && strcmp(nm, after_name) <= 0) : (int64_t)i + 1 <= after_id)
            continue;
        if (j == limit) {
            *more = true;
            break;
        }
        row_from(mf, i, &rows[j++]);
    }
    free(ix);
    tv__reg_manifest_free(mf);
    *out = rows;
    *n = j;
    return rows ? 0 : -ENOMEM;
}

WEAK int tv__reg_tensor_get(tv__reg *r, int64_t gid, const char *name, tv__reg_tensor_row *out,
                            tv_error *err)
{
    tv__reg_manifest *mf = NULL;
    int rc = tv__reg_tensors_list(r, gid, &mf, err);
    if (rc)
        return rc;
    for (size_t i = 0; i < mf->n_tensors; i++)
        if (!strcmp(mf->tensors[i].name, name)) {
            row_from(mf, i, out);
            tv__reg_manifest_free(mf);
            return 0;
        }
    tv__reg_manifest_free(mf);
    return tv__seterr(err, TV_E_NOT_FOUND, "tensor '%s' not found", name);
}

WEAK int tv__reg_token_create(tv__reg *r, const char *name, tv__scope scope, char secret_out[69],
                              tv__reg_token *out, tv_error *err)
{
    (void)r, (void)scope, (void)secret_out, (void)out;
    return tv__seterr(err, TV_E_NOT_SUPPORTED, "token '%s': not in this build yet", name);
}

WEAK int tv__reg_token_check(tv__reg *r, const char *secret, tv__scope *scope, int64_t *id,
                             tv_error *err)
{
    (void)r, (void)secret, (void)scope, (void)id;
    return tv__seterr(err, TV_E_UNAUTHORIZED, "invalid API token");
}

WEAK int tv__reg_tokens_list(tv__reg *r, tv__reg_token **out, size_t *n, tv_error *err)
{
    (void)r, (void)err;
    *out = NULL;
    *n = 0;
    return 0;
}

WEAK int tv__reg_token_revoke(tv__reg *r, int64_t id, tv__reg_token *out, tv_error *err)
{
    (void)r, (void)out;
    return tv__seterr(err, TV_E_NOT_FOUND, "token %lld not found", (long long)id);
}

WEAK int tv__store_alias_set(tv__store *st, const char *model, const char *alias, int64_t number,
                             tv_error *err)
{
    return tv__reg_alias_set(st->reg, model, alias, number, err);
}

WEAK int tv__store_alias_remove(tv__store *st, const char *model, const char *alias,
                                int64_t *number, tv_error *err)
{
    return tv__reg_alias_remove(st->reg, model, alias, number, err);
}

WEAK int tv__store_model_delete(tv__store *st, const char *model, size_t *n_retired,
                                uint64_t *freed_bytes, tv_error *err)
{
    (void)freed_bytes;
    return tv__reg_model_delete(st->reg, model, n_retired, err);
}

WEAK int tv__store_gc(tv__store *st, size_t *n_freed, uint64_t *freed_bytes, tv_error *err)
{
    (void)st;
    *n_freed = 0;
    *freed_bytes = 0;
    return tv__seterr(err, TV_E_NOT_SUPPORTED, "gc through the api: not in this build yet");
}
#endif

#ifdef TV__API_SEAMS_TMP_JOBS
WEAK void tv__jobs_counts(tv__jobs *j, size_t *queued, size_t *running)
{
    (void)j;
    *queued = 0;
    *running = 0;
}
#endif
