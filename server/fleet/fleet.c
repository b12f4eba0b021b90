/* The fleet thread of tensorvaultd (fleet.h): its loop (connect, heartbeat,
 * publish, rollout, wait for a kick, a notification or the next round),
 * start, kick and stop. What each round does is the other files'
 * (fleet_internal.h). */
#include "fleet/fleet.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fleet/fleet_internal.h"
#include "util/internal.h"

/* How long a stop waits for the thread: a libpq call on a catalog that
 * stopped answering (a hung server, a lost network) has no timeout. */
#define FLEET_STOP_WAIT_S 5

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

/* Waits up to seconds for a kick, a stop or a catalog notification (the
 * connection's socket, in slices so kicks are seen). Returns true when
 * stopping; *woken: something happened before the time ran out. */
static bool wait_listen(tv__fleet *f, double seconds, bool *woken)
{
    double until = tv__fleet_mono_s() + seconds;
    *woken = false;
    for (;;) {
        pthread_mutex_lock(&f->mu);
        bool stop = f->stopping, k = f->kicked;
        f->kicked = false;
        pthread_mutex_unlock(&f->mu);
        if (stop)
            return true;
        if (k) {
            *woken = true;
            return false;
        }
        double left = until - tv__fleet_mono_s();
        if (left <= 0)
            return false;
        char payload[512];
        tv_error err = {0};
        int r = tv__catalog_wait(f->cat, left < 0.25 ? (int)(left * 1000) + 1 : 250, payload,
                                 sizeof payload, &err);
        if (r == 1) {
            tv__log(TV_LOG_DEBUG, "fleet: notified: %s", payload);
            /* several notifications in a burst: one round for all */
            while (tv__catalog_wait(f->cat, 0, payload, sizeof payload, &err) == 1)
                ;
            *woken = true;
            return false;
        }
        if (r < 0) {
            /* dropped: the heartbeat notices; sleep the slice instead */
            bool kicked;
            return wait_for(f, (unsigned)(left < 1 ? 1 : left), &kicked) ||
                   ((*woken = kicked), false);
        }
    }
}

static void *fleet_main(void *p)
{
    tv__fleet *f = p;
    bool warned = false, pending = true, kicked = false, busy = false;
    double last_beat = 0;
    for (;;) {
        tv_error err = {0};
        if (!f->cat) {
            if (tv__catalog_open(f->conninfo, &f->cat, &err)) {
                tv__log(
                    warned ? TV_LOG_DEBUG : TV_LOG_WARN,
                    "fleet: catalog not reachable (%s); serving standalone, retrying every %u s",
                    err.msg, f->retry_s);
                tv__fleet_set_connected(f, false, err.msg);
                warned = true;
                if (wait_for(f, f->retry_s, &kicked))
                    break;
                continue;
            }
            int version = 0;
            tv__catalog_version(f->cat, &version, NULL);
            if (tv__catalog_listen(f->cat, &err))
                tv__log(TV_LOG_WARN, "fleet: %s", err.msg);
            tv__log(TV_LOG_INFO, "fleet: catalog %s (schema version %d), node '%s'", f->where,
                    version, f->node);
            warned = false;
            pending = true;
            last_beat = 0;
        }
        if (tv__fleet_mono_s() - last_beat >= f->heartbeat_s) {
            if (tv__catalog_node_seen(f->cat, f->node, f->url, f->node_down_s, &err)) {
                tv__log(f->quiet ? TV_LOG_DEBUG : TV_LOG_WARN, "fleet: %s", err.msg);
                tv__fleet_set_connected(f, false, err.msg);
                f->quiet = true;
                pending = true; /* publish everything again once it is back */
            } else {
                if (f->quiet)
                    tv__log(TV_LOG_INFO, "fleet: catalog %s reachable again", f->where);
                f->quiet = false;
                last_beat = tv__fleet_mono_s();
                pthread_mutex_lock(&f->mu);
                f->beat_at = last_beat;
                pthread_mutex_unlock(&f->mu);
            }
        }
        if ((pending || kicked) && !tv__fleet_stopping(f))
            pending = tv__fleet_publish_pending(f) != 0;
        if (!f->quiet && !tv__fleet_stopping(f))
            busy = tv__fleet_rollout_round(f);
        /* A rollout under way is followed every second (progress, the
         * moment to switch); otherwise notifications and kicks wake us. */
        double wait = busy ? 1 : pending ? f->retry_s : f->heartbeat_s;
        if (f->quiet) {
            if (wait_for(f, f->retry_s, &kicked))
                break;
        } else if (wait_listen(f, wait, &kicked)) {
            break;
        }
    }
    return NULL;
}

void tv__fleet_kick(tv__fleet *f)
{
    if (!f)
        return;
    pthread_mutex_lock(&f->mu);
    f->kicked = true;
    pthread_cond_broadcast(&f->cond); /* the uploader waits on it too */
    pthread_mutex_unlock(&f->mu);
}

static void fleet_free(tv__fleet *f)
{
    tv__fleet_uploads_free(f);
    tv__catalog_close(f->cat);
    tv__reg_close(f->reg);
    tv__store_close(f->st);
    free(f->done);
    for (size_t i = 0; i < f->n_pulls; i++)
        tv__fleet_pull_free(f->pulls[i]);
    free(f->pulls);
    json_decref(f->doc);
    free(f->token);
    free(f->object_store);
    free(f->proxy);
    for (size_t i = 0; i < 5; i++)
        free(f->s3_strings[i]);
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
    /* Nodes that start together must not all try the same peer first. */
    f->seed = (unsigned)time(NULL) ^ ((unsigned)getpid() << 16);
    for (const char *c = o->node; *c; c++)
        f->seed = f->seed * 31u + (unsigned char)*c;
    f->node = strdup(o->node);
    f->url = strdup(o->url ? o->url : "");
    f->reg_path = strdup(o->reg_path);
    f->token = strdup(o->token ? o->token : "");
    f->object_store = strdup(o->object_store ? o->object_store : "");
    f->proxy = strdup(o->proxy ? o->proxy : "");
    f->jobs = o->jobs;
    f->writer = o->store;
    f->pull_attempts = o->pull_attempts ? o->pull_attempts : 3;
    if (o->s3) {
        const char *in[5] = {o->s3->endpoint, o->s3->region, o->s3->access_key_id,
                             o->s3->secret_access_key, o->s3->session_token};
        for (size_t i = 0; i < 5; i++)
            f->s3_strings[i] = strdup(in[i] ? in[i] : "");
        f->s3 = (tv__s3_opts){f->s3_strings[0], f->s3_strings[1], f->s3_strings[2],
                              f->s3_strings[3], f->s3_strings[4]};
    }
    f->retry_s = o->retry_s ? o->retry_s : 3;
    f->heartbeat_s = o->heartbeat_s ? o->heartbeat_s : 10;
    f->node_down_s = o->node_down_s ? o->node_down_s : 30;
    /* Three heartbeats per node_down_s: one lost or late does not make
     * this node look down. */
    if (f->heartbeat_s > f->node_down_s / 3)
        f->heartbeat_s = f->node_down_s / 3 ? f->node_down_s / 3 : 1;
    snprintf(f->node_down_param, sizeof f->node_down_param, "%u", f->node_down_s);
    tv__catalog_redact(o->conninfo, f->where, sizeof f->where);
    if (!f->conninfo || !f->node || !f->url || !f->reg_path || !f->token || !f->object_store ||
        !f->proxy) {
        fleet_free(f);
        return tv__seterr(err, -ENOMEM, "fleet: out of memory");
    }
    int e =
        f->object_store[0] ? pthread_create(&f->up_thread, NULL, tv__fleet_uploader_main, f) : 0;
    if (e) {
        fleet_free(f);
        return tv__seterr(err, -e, "fleet: cannot start its uploader thread: %s", strerror(e));
    }
    f->up_started = f->object_store[0] != '\0';
    if ((e = pthread_create(&f->thread, NULL, fleet_main, f))) {
        pthread_mutex_lock(&f->mu);
        f->stopping = true;
        pthread_cond_broadcast(&f->cond);
        pthread_mutex_unlock(&f->mu);
        if (f->up_started)
            pthread_join(f->up_thread, NULL);
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
    pthread_cond_broadcast(&f->cond);
    pthread_mutex_unlock(&f->mu);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += FLEET_STOP_WAIT_S;
    bool fleet_gone = pthread_timedjoin_np(f->thread, NULL, &until) != ETIMEDOUT;
    bool up_gone = !f->up_started || pthread_timedjoin_np(f->up_thread, NULL, &until) != ETIMEDOUT;
    if (!fleet_gone || !up_gone) {
        /* Blocked in libpq or an upload: the thread still uses f, left to the exit. */
        tv__log(
            TV_LOG_WARN,
            "fleet: catalog %s or the object store did not answer within %d s; stopping without waiting for it",
            f->where, FLEET_STOP_WAIT_S);
        if (!fleet_gone)
            pthread_detach(f->thread);
        if (!up_gone)
            pthread_detach(f->up_thread);
        return;
    }
    fleet_free(f);
}
