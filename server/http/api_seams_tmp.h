/* TEMPORARY (issue 9): the API9.md seams of the reg and daemon helpers that
 * are not on main yet, declared exactly as API9.md says so that the api
 * builds before they land. Each block disappears by itself once the real
 * header is there (registry.h defines TV__ALIAS_MAX; daemon/jobs.h exists);
 * delete this file and server/http/api_stub_tmp.c when both are merged. */
#ifndef TV_HTTP_API_SEAMS_TMP_H
#define TV_HTTP_API_SEAMS_TMP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "registry/registry.h"
#include "store/store.h"

#ifndef TV__ALIAS_MAX
#define TV__API_SEAMS_TMP_REG 1
int tv__alias_name_valid(const char *alias, tv_error *err);
typedef struct tv__reg_alias {
    char model[TV__REG_NAME_MAX + 1];
    char alias[64 + 1]; /* TV__ALIAS_MAX + 1: not defined here, so other helpers' stubs see only the
                           real one */
    int64_t generation;
    int64_t updated_at;
} tv__reg_alias;
int tv__reg_alias_set(tv__reg *, const char *model, const char *alias, int64_t number, tv_error *);
int tv__reg_alias_remove(tv__reg *, const char *model, const char *alias, int64_t *number,
                         tv_error *);
int tv__reg_alias_get(tv__reg *, const char *model, const char *alias, int64_t *number, tv_error *);
int tv__reg_aliases_list(tv__reg *, const char *model, tv__reg_alias **out, size_t *n, tv_error *);
int tv__reg_resolve_gen(tv__reg *, const char *model, const char *gen_spec, int64_t *number,
                        tv_error *);
int tv__reg_model_delete(tv__reg *, const char *model, size_t *n_retired, tv_error *);
int tv__reg_model_get(tv__reg *, const char *model, tv__reg_model *out, tv_error *);
int tv__reg_models_page(tv__reg *, const char *after_name, size_t limit, tv__reg_model **out,
                        size_t *n, bool *more, tv_error *);
int tv__reg_generations_page(tv__reg *, const char *model, int64_t after_number, size_t limit,
                             tv__reg_generation **out, size_t *n, bool *more, tv_error *);
typedef struct tv__reg_tensor_row {
    int64_t row_id;
    char *name;
    tv_dtype dtype;
    uint32_t rank;
    uint64_t shape[TV_ST_MAX_RANK];
    uint32_t shard_idx;
    char shard[TV__REG_NAME_MAX + 1];
    uint64_t begin_off, end_off, header_len;
} tv__reg_tensor_row;
int tv__reg_tensors_page(tv__reg *, int64_t generation_id, const char *prefix, bool by_name,
                         int64_t after_row_id, const char *after_name, size_t limit,
                         tv__reg_tensor_row **out, size_t *n, bool *more, tv_error *);
void tv__reg_tensor_rows_free(tv__reg_tensor_row *rows, size_t n);
int tv__reg_tensor_get(tv__reg *, int64_t generation_id, const char *name, tv__reg_tensor_row *out,
                       tv_error *);
typedef enum { TV__SCOPE_NONE = 0, TV__SCOPE_READ = 1, TV__SCOPE_ADMIN = 2 } tv__scope;
typedef struct tv__reg_token {
    int64_t id;
    char name[TV__REG_NAME_MAX + 1];
    tv__scope scope;
    int64_t created_at, revoked_at;
} tv__reg_token;
int tv__reg_token_create(tv__reg *, const char *name, tv__scope scope, char secret_out[69],
                         tv__reg_token *out, tv_error *);
int tv__reg_token_check(tv__reg *, const char *secret, tv__scope *scope, int64_t *token_id,
                        tv_error *);
int tv__reg_tokens_list(tv__reg *, tv__reg_token **out, size_t *n, tv_error *);
int tv__reg_token_revoke(tv__reg *, int64_t id, tv__reg_token *out, tv_error *);
int tv__store_alias_set(tv__store *st, const char *model, const char *alias, int64_t number,
                        tv_error *err);
int tv__store_alias_remove(tv__store *st, const char *model, const char *alias, int64_t *number,
                           tv_error *err);
int tv__store_model_delete(tv__store *st, const char *model, size_t *n_retired,
                           uint64_t *freed_bytes, tv_error *err);
int tv__store_gc(tv__store *st, size_t *n_freed, uint64_t *freed_bytes, tv_error *err);
#endif

#if !__has_include("daemon/jobs.h")
#define TV__API_SEAMS_TMP_JOBS 1
typedef struct tv__jobs tv__jobs;
typedef void (*tv__job_watch_fn)(void *ctx, const tv__reg_job *now);
void tv__jobs_counts(tv__jobs *j, size_t *queued, size_t *running);
#endif

#endif
