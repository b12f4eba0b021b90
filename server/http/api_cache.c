/* The Shard objects of ready generations, rendered once and cached, so the
 * generation, tensor and data routes need one indexed query per request
 * instead of loading a whole manifest (120,000 tensor rows for a large
 * model).
 * Invariants: only a ready generation is cached, and a ready generation's
 * shards, bindings and objects never change (objects are freed only once
 * no importing or ready generation binds them); rows are deleted only by
 * model delete and gc, which call tv__api_shards_forget, and an entry
 * loaded before a forget is never inserted after it (the epoch), so a
 * reused generation id never meets a stale entry. Callers get a deep copy. */
#include <errno.h>
#include <stdlib.h>

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

void tv__api_shards_forget(tv__api *api)
{
    pthread_mutex_lock(&api->cache_mu);
    api->cache_epoch++;
    for (size_t i = 0; i < TV__API_SHARD_CACHE; i++) {
        json_decref(api->shard_cache[i].shards);
        api->shard_cache[i].shards = NULL;
        api->shard_cache[i].generation_id = 0;
        api->shard_cache[i].last_use = 0;
    }
    pthread_mutex_unlock(&api->cache_mu);
}
