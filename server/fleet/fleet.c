/* The fleet thread of tensorvaultd (fleet.h). */
#include "fleet/fleet.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fleet/catalog.h"
#include "registry/registry.h"
#include "util/internal.h"

/* How long a stop waits for the thread: a libpq call on a catalog that
 * stopped answering (a hung server, a lost network) has no timeout. */
#define FLEET_STOP_WAIT_S 5

typedef struct done_key {
    char model[TV__REG_NAME_MAX + 1];
    int64_t number;
} done_key;

struct tv__fleet {
    char *conninfo, *node, *url, *reg_path;
    char where[320];
    unsigned retry_s, heartbeat_s;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cond;
    bool stopping, kicked;
    bool quiet; /* the catalog is away: said once, then debug lines until it is back */
    /* the thread's own */
    tv__catalog *cat;
    tv__reg *reg;
    done_key *done;
    size_t n_done, cap_done;
};

static bool is_done(const tv__fleet *f, const char *model, int64_t number)
{
    for (size_t i = 0; i < f->n_done; i++)
        if (f->done[i].number == number && strcmp(f->done[i].model, model) == 0)
            return true;
    return false;
}

static void mark_done(tv__fleet *f, const char *model, int64_t number)
{
    if (f->n_done == f->cap_done) {
        size_t cap = f->cap_done ? f->cap_done * 2 : 16;
        done_key *d = realloc(f->done, cap * sizeof(*d));
        if (!d)
            return; /* published again next time: idempotent */
        f->done = d;
        f->cap_done = cap;
    }
    snprintf(f->done[f->n_done].model, sizeof f->done[0].model, "%s", model);
    f->done[f->n_done++].number = number;
}

static bool stopping(tv__fleet *f)
{
    pthread_mutex_lock(&f->mu);
    bool s = f->stopping;
    pthread_mutex_unlock(&f->mu);
    return s;
}

/* Publishes every ready generation not yet published by this process.
 * Returns 0, or the first error that is worth a retry. */
static int publish_pending(tv__fleet *f)
{
    tv_error err = {0};
    int rc, retry = 0;
    if (!f->reg && (rc = tv__reg_open_ex(f->reg_path, TV__REG_READONLY, &f->reg, &err))) {
        tv__log(TV_LOG_WARN, "fleet: cannot open the local registry: %s", err.msg);
        return rc;
    }
    tv__reg_model *models = NULL;
    size_t n_models = 0;
    if ((rc = tv__reg_models_list(f->reg, &models, &n_models, &err))) {
        tv__log(TV_LOG_WARN, "fleet: cannot list local models: %s", err.msg);
        return rc;
    }
    for (size_t i = 0; i < n_models && !retry && !stopping(f); i++) {
        tv__reg_generation *gens = NULL;
        size_t n_gens = 0;
        if ((rc = tv__reg_generations_list(f->reg, models[i].name, &gens, &n_gens, &err))) {
            if (rc != TV_E_NOT_FOUND) /* a model removed meanwhile */
                retry = rc;
            continue;
        }
        for (size_t k = 0; k < n_gens && !retry && !stopping(f); k++) {
            const tv__reg_generation *g = &gens[k];
            if (g->state != TV__GEN_READY || is_done(f, g->model, g->number))
                continue;
            tv__reg_manifest *m = NULL;
            int published = 0;
            rc = tv__reg_tensors_list(f->reg, g->id, &m, &err);
            if (rc == 0)
                rc = tv__catalog_publish_generation(f->cat, f->node, m, &published, &err);
            tv__reg_manifest_free(m);
            if (rc == 0) {
                mark_done(f, g->model, g->number);
                if (published)
                    tv__log(TV_LOG_INFO,
                            "fleet: published model '%s' generation %" PRId64 " to the catalog",
                            g->model, g->number);
            } else if (rc == TV_E_CONFLICT) {
                mark_done(f, g->model, g->number);
                tv__log(TV_LOG_ERROR, "fleet: not published: %s", err.msg);
            } else if (rc == TV_E_STATE || rc == TV_E_NOT_FOUND) {
                continue; /* retired or gone meanwhile: the next scan decides */
            } else {
                tv__log(f->quiet ? TV_LOG_DEBUG : TV_LOG_WARN,
                        "fleet: publishing model '%s' generation %" PRId64
                        " failed (retrying every %u s): %s",
                        g->model, g->number, f->retry_s, err.msg);
                f->quiet = true;
                retry = rc;
            }
        }
        free(gens);
    }
    free(models);
    return retry;
}

/* Waits until a kick, stop, or seconds pass. Returns true when stopping;
 * *kicked tells whether a kick came. */
static bool wait_for(tv__fleet *f, unsigned seconds, bool *kicked)
{
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += seconds;
    pthread_mutex_lock(&f->mu);
    while (!f->stopping && !f->kicked)
        if (pthread_cond_timedwait(&f->cond, &f->mu, &until) == ETIMEDOUT)
            break;
    bool stop = f->stopping;
    *kicked = f->kicked;
    f->kicked = false;
    pthread_mutex_unlock(&f->mu);
    return stop;
}

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void *fleet_main(void *p)
{
    tv__fleet *f = p;
    bool warned = false, pending = true, kicked = false;
    double last_beat = 0;
    for (;;) {
        tv_error err = {0};
        if (!f->cat) {
            if (tv__catalog_open(f->conninfo, &f->cat, &err)) {
                tv__log(
                    warned ? TV_LOG_DEBUG : TV_LOG_WARN,
                    "fleet: catalog not reachable (%s); serving standalone, retrying every %u s",
                    err.msg, f->retry_s);
                warned = true;
                if (wait_for(f, f->retry_s, &kicked))
                    break;
                continue;
            }
            int version = 0;
            tv__catalog_version(f->cat, &version, NULL);
            tv__log(TV_LOG_INFO, "fleet: catalog %s (schema version %d), node '%s'", f->where,
                    version, f->node);
            warned = false;
            pending = true;
            last_beat = 0;
        }
        if (mono_s() - last_beat >= f->heartbeat_s) {
            if (tv__catalog_node_seen(f->cat, f->node, f->url, &err)) {
                tv__log(f->quiet ? TV_LOG_DEBUG : TV_LOG_WARN, "fleet: %s", err.msg);
                f->quiet = true;
                pending = true; /* publish everything again once it is back */
            } else {
                if (f->quiet)
                    tv__log(TV_LOG_INFO, "fleet: catalog %s reachable again", f->where);
                f->quiet = false;
                last_beat = mono_s();
            }
        }
        if ((pending || kicked) && !stopping(f))
            pending = publish_pending(f) != 0;
        unsigned wait = pending ? f->retry_s : f->heartbeat_s;
        if (wait_for(f, wait, &kicked))
            break;
    }
    return NULL;
}

void tv__fleet_kick(tv__fleet *f)
{
    if (!f)
        return;
    pthread_mutex_lock(&f->mu);
    f->kicked = true;
    pthread_cond_signal(&f->cond);
    pthread_mutex_unlock(&f->mu);
}

static void fleet_free(tv__fleet *f)
{
    tv__catalog_close(f->cat);
    tv__reg_close(f->reg);
    free(f->done);
    free(f->conninfo);
    free(f->node);
    free(f->url);
    free(f->reg_path);
    pthread_cond_destroy(&f->cond);
    pthread_mutex_destroy(&f->mu);
    free(f);
}

int tv__fleet_start(const tv__fleet_opts *o, tv__fleet **out, tv_error *err)
{
    if (!o || !out || !o->conninfo || !o->conninfo[0] || !o->node || !o->node[0] || !o->reg_path)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__fleet_start: missing option");
    *out = NULL;
    tv__fleet *f = calloc(1, sizeof(*f));
    if (!f)
        return tv__seterr(err, -ENOMEM, "fleet: out of memory");
    pthread_mutex_init(&f->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&f->cond, &ca);
    pthread_condattr_destroy(&ca);
    f->conninfo = strdup(o->conninfo);
    f->node = strdup(o->node);
    f->url = strdup(o->url ? o->url : "");
    f->reg_path = strdup(o->reg_path);
    f->retry_s = o->retry_s ? o->retry_s : 3;
    f->heartbeat_s = o->heartbeat_s ? o->heartbeat_s : 10;
    tv__catalog_redact(o->conninfo, f->where, sizeof f->where);
    if (!f->conninfo || !f->node || !f->url || !f->reg_path) {
        fleet_free(f);
        return tv__seterr(err, -ENOMEM, "fleet: out of memory");
    }
    int e = pthread_create(&f->thread, NULL, fleet_main, f);
    if (e) {
        fleet_free(f);
        return tv__seterr(err, -e, "fleet: cannot start its thread: %s", strerror(e));
    }
    tv__log(TV_LOG_INFO, "fleet: node '%s', catalog %s (connecting in the background)", f->node,
            f->where);
    *out = f;
    return 0;
}

void tv__fleet_stop(tv__fleet *f)
{
    if (!f)
        return;
    pthread_mutex_lock(&f->mu);
    f->stopping = true;
    pthread_cond_signal(&f->cond);
    pthread_mutex_unlock(&f->mu);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += FLEET_STOP_WAIT_S;
    if (pthread_timedjoin_np(f->thread, NULL, &until) == ETIMEDOUT) {
        /* Blocked in libpq: the thread still uses f, left to the exit. */
        tv__log(TV_LOG_WARN,
                "fleet: catalog %s did not answer within %d s; stopping without waiting for it",
                f->where, FLEET_STOP_WAIT_S);
        pthread_detach(f->thread);
        return;
    }
    fleet_free(f);
}
