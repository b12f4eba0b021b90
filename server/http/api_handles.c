/* The tensor data route's pool of open tv_model handles, keyed by model and
 * generation, and its release before gc and model delete.
 *
 * Invariants:
 *   - a pooled tv_model is used by one thread at a time (slot.busy, under
 *     pool_mu); when every slot is busy the request opens a handle of its
 *     own and closes it after;
 *   - a slot is keyed by (model, generation number) and never changes
 *     generation: a generation's bytes never change, so a handle stays valid
 *     (its snapshot lease keeps the objects even once retired);
 *   - only the envelope of the asked bytes is read (tv_read_range), so a
 *     streamed piece of a large tensor costs about its own bytes. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http/api_internal.h"
#include "util/internal.h"

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

int tv__api_model_read(tv__api *api, const char *model, int64_t gen, const char *name, uint64_t off,
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
