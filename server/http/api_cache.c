/* The Shard objects and single-tensor documents of ready generations,
 * rendered once and cached, so the generation, tensor and data routes need
 * one or two indexed queries per request instead of loading a manifest
 * (120,000 tensor rows for a large model).
 * Invariants: only a ready generation is cached, and a ready generation's
 * shards, bindings and objects never change (objects are freed only once
 * no importing or ready generation binds them); rows are deleted only by
 * model delete and gc, which call tv__api_shards_forget, and an entry
 * loaded before a forget is never inserted after it (the epoch), so a
 * reused generation id never meets a stale entry. Callers get a deep copy. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http/api_internal.h"
#include "util/internal.h"

static json_t *render(const tv__reg_manifest *mf)
{
    json_t *arr = json_array();
    for (size_t i = 0; arr && i < mf->n_shards; i++)
        if (json_array_append_new(arr, tv__api_shard_json(&mf->shards[i]))) {
            json_decref(arr);
            arr = NULL;
        }
    return arr;
}

int tv__api_shards(tv__api_ctx *c, tv__reg *reg, const tv__reg_generation *g, json_t **out)
{
    tv__api *api = c->api;
    bool ready = g->state == TV__GEN_READY;
    *out = NULL;
    uint64_t epoch = 0;
    if (ready) {
        pthread_mutex_lock(&api->cache_mu);
        for (size_t i = 0; i < TV__API_SHARD_CACHE; i++)
            if (api->shard_cache[i].shards && api->shard_cache[i].generation_id == g->id) {
                api->shard_cache[i].last_use = ++api->cache_clock;
                *out = json_deep_copy(api->shard_cache[i].shards);
                break;
            }
        epoch = api->cache_epoch;
        pthread_mutex_unlock(&api->cache_mu);
        if (*out)
            return 0;
    }
    tv__reg_manifest *mf = NULL;
    int rc = tv__reg_shards_list(reg, g->id, &mf, &c->err);
    if (rc)
        return rc;
    json_t *arr = render(mf);
    tv__reg_manifest_free(mf);
    if (!arr || !(*out = json_deep_copy(arr))) {
        json_decref(arr);
        return tv__seterr(&c->err, -ENOMEM, "out of memory");
    }
    if (!ready) {
        json_decref(arr);
        return 0;
    }
    pthread_mutex_lock(&api->cache_mu);
    if (epoch == api->cache_epoch) {
        size_t pick = 0;
        for (size_t i = 1; i < TV__API_SHARD_CACHE; i++)
            if (api->shard_cache[i].last_use < api->shard_cache[pick].last_use)
                pick = i;
        json_t *old = api->shard_cache[pick].shards;
        api->shard_cache[pick].shards = arr;
        api->shard_cache[pick].generation_id = g->id;
        api->shard_cache[pick].last_use = ++api->cache_clock;
        arr = old;
    }
    pthread_mutex_unlock(&api->cache_mu);
    json_decref(arr);
    return 0;
}

int tv__api_tensor_doc(tv__api_ctx *c, tv__reg *reg, const tv__reg_generation *g, const char *name,
                       json_t **out)
{
    tv__api *api = c->api;
    bool ready = g->state == TV__GEN_READY;
    char *key = NULL;
    uint64_t epoch = 0;
    *out = NULL;
    if (ready) {
        size_t kl = strlen(name) + 24;
        if (!(key = malloc(kl)))
            return tv__seterr(&c->err, -ENOMEM, "out of memory");
        snprintf(key, kl, "%" PRId64 ":%s", g->id, name);
        pthread_mutex_lock(&api->cache_mu);
        json_t *hit = api->tensor_cache ? json_object_get(api->tensor_cache, key) : NULL;
        if (hit)
            *out = json_deep_copy(hit);
        epoch = api->cache_epoch;
        pthread_mutex_unlock(&api->cache_mu);
        if (*out) {
            free(key);
            return 0;
        }
    }
    tv__reg_tensor_row row = {0};
    json_t *shards = NULL, *doc = NULL;
    int rc;
    if ((rc = tv__reg_tensor_get(reg, g->id, name, &row, &c->err)) ||
        (rc = tv__api_shards(c, reg, g, &shards)))
        goto out;
    json_t *shard = json_array_get(shards, row.shard_idx);
    if (!shard) {
        rc = tv__seterr(&c->err, TV_E_REGISTRY, "tensor '%s' names shard %u of %zu", row.name,
                        row.shard_idx, json_array_size(shards));
        goto out;
    }
    if (!(doc = tv__api_tensor_json(&row, shard)) || !(*out = json_deep_copy(doc))) {
        rc = tv__seterr(&c->err, -ENOMEM, "out of memory");
        goto out;
    }
    if (ready) {
        pthread_mutex_lock(&api->cache_mu);
        if (epoch == api->cache_epoch) {
            /* Bounded: a full cache starts over (hot tensors come back). */
            if (api->tensor_cache && json_object_size(api->tensor_cache) >= TV__API_TENSOR_CACHE)
                json_object_clear(api->tensor_cache);
            if (!api->tensor_cache)
                api->tensor_cache = json_object();
            if (api->tensor_cache) {
                json_object_set_new(api->tensor_cache, key, doc); /* steals doc, even on failure */
                doc = NULL;
            }
        }
        pthread_mutex_unlock(&api->cache_mu);
    }
out:
    json_decref(doc);
    json_decref(shards);
    free(row.name);
    free(key);
    return rc;
}

void tv__api_shards_forget(tv__api *api)
{
    pthread_mutex_lock(&api->cache_mu);
    api->cache_epoch++;
    json_decref(api->tensor_cache);
    api->tensor_cache = NULL;
    for (size_t i = 0; i < TV__API_SHARD_CACHE; i++) {
        json_decref(api->shard_cache[i].shards);
        api->shard_cache[i].shards = NULL;
        api->shard_cache[i].generation_id = 0;
        api->shard_cache[i].last_use = 0;
    }
    pthread_mutex_unlock(&api->cache_mu);
}
