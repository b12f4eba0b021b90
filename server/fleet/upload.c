/* The uploader: a thread of its own copies the generations imported on
 * this node from a local path (what only this node could serve) to
 * fleet.object_store, content-addressed (PREFIX + "sha256/" + HEX), reading
 * them from this node's own blob route, and records each blob in the
 * catalog's blobs table.
 * Invariants: a blob already recorded, or already in the bucket with its
 * length, is not copied again; a failed generation is tried again every
 * retry_s seconds; every transfer hears the daemon's stop within a second
 * (s3put.h: cancel); what is queued when the daemon stops is queued again
 * by the next start's publish pass. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fleet/fleet_internal.h"
#include "fleet/s3put.h"
#include "util/internal.h"

/* The uploads' cancel (s3put.h): the daemon is stopping. */
static bool stop_asked(void *f)
{
    return tv__fleet_stopping(f);
}

/* One generation's shards to copy to the object store. */
typedef struct upload {
    char model[TV__REG_NAME_MAX + 1];
    int64_t number;
    size_t n_shards;
    struct up_shard {
        char name[TV__REG_NAME_MAX + 1];
        char sha256[65];
        uint64_t file_len;
    } * shards;
    double next_try; /* tv__fleet_mono_s() */
    struct upload *next;
} upload;

static void upload_free(upload *u)
{
    if (u)
        free(u->shards);
    free(u);
}

/* Copies the shards of a generation imported from a local path to the
 * object store (content-addressed: PREFIX + "sha256/" + HEX), reading them
 * from this node's own blob route, and records them in the catalog's blobs
 * table. A blob already recorded, or already in the bucket with its length,
 * is not copied again. Failures are logged; the next pass retries. */
static int upload_generation(tv__fleet *f, tv__catalog *cat, const upload *u)
{
    int rc = 0;
    for (size_t i = 0; i < u->n_shards && !rc && !tv__fleet_stopping(f); i++) {
        const struct up_shard *sh = &u->shards[i];
        const char *pv[] = {sh->sha256};
        json_t *have = NULL;
        tv_error err = {0};
        if ((rc = tv__catalog_json(cat, "SELECT to_json(url) FROM blobs WHERE sha256 = $1", 1, pv,
                                   "reading the blobs", &have, &err))) {
            tv__log(TV_LOG_WARN, "fleet: %s", err.msg);
            break;
        }
        bool recorded = json_is_string(have);
        json_decref(have);
        if (recorded)
            continue;
        char *dst = NULL, *src = NULL;
        if (asprintf(&dst, "%ssha256/%s", f->object_store, sh->sha256) < 0 ||
            asprintf(&src, "%s/v1/blobs/sha256:%s", f->url, sh->sha256) < 0) {
            free(dst);
            return -ENOMEM;
        }
        tv__s3put_opts so = {.proxy = f->proxy, .cancel = {.cancelled = stop_asked, .ctx = f}};
        so.s3 = f->s3;
        bool exists = false;
        uint64_t len = 0;
        double t0 = tv__fleet_mono_s();
        rc = tv__s3_head(&so, dst, &exists, &len, &err);
        if (rc == 0 && !(exists && len == sh->file_len))
            rc = tv__s3_copy_from_url(&so, src, f->token[0] ? f->token : NULL, sh->file_len,
                                      sh->sha256, dst, &err);
        if (rc == 0) {
            char bytes[24];
            snprintf(bytes, sizeof bytes, "%" PRIu64, sh->file_len);
            const char *iv[] = {sh->sha256, bytes, dst, f->node};
            rc = tv__catalog_exec(cat,
                                  "INSERT INTO blobs (sha256, bytes, url, uploaded_by) VALUES "
                                  "($1, $2, $3, $4) ON CONFLICT (sha256) DO NOTHING",
                                  4, iv, "recording a blob", &err);
        }
        if (rc)
            tv__log(
                TV_LOG_WARN,
                "fleet: uploading shard '%s' of model '%s' to %s failed (retrying every %u s): %s",
                sh->name, u->model, dst, f->retry_s, err.msg);
        else
            tv__log(TV_LOG_INFO,
                    "fleet: shard '%s' (%" PRIu64 " bytes) in the object store as %s%s (%.1f s)",
                    sh->name, sh->file_len, dst, exists ? ", already there" : "",
                    tv__fleet_mono_s() - t0);
        free(dst);
        free(src);
    }
    return rc;
}

/* Queues m's shards for the uploader (once per generation). Returns 0 or -ENOMEM. */
int tv__fleet_upload_queue(tv__fleet *f, const tv__reg_manifest *m)
{
    upload *u = calloc(1, sizeof(*u));
    if (!u || !(u->shards = calloc(m->n_shards ? m->n_shards : 1, sizeof(*u->shards)))) {
        free(u);
        return -ENOMEM;
    }
    snprintf(u->model, sizeof u->model, "%s", m->generation.model);
    u->number = m->generation.number;
    u->n_shards = m->n_shards;
    for (size_t i = 0; i < m->n_shards; i++) {
        snprintf(u->shards[i].name, sizeof u->shards[i].name, "%s", m->shards[i].name);
        snprintf(u->shards[i].sha256, sizeof u->shards[i].sha256, "%s", m->shards[i].sha256);
        u->shards[i].file_len = m->shards[i].file_len;
    }
    pthread_mutex_lock(&f->mu);
    upload **tail = &f->uploads;
    bool dup = false;
    for (; *tail; tail = &(*tail)->next)
        dup |= (*tail)->number == u->number && strcmp((*tail)->model, u->model) == 0;
    if (!dup)
        *tail = u;
    pthread_cond_broadcast(&f->cond);
    pthread_mutex_unlock(&f->mu);
    if (dup)
        upload_free(u);
    return 0;
}

/* The uploader: copies queued generations to the object store with a
 * catalog connection of its own, so that a long copy never holds up the
 * fleet thread's rounds (switches, pulls, reports); a failed one is tried
 * again every retry_s seconds. What is queued when the daemon stops is
 * queued again by the next start's publish pass (recorded blobs are
 * skipped). */
void *tv__fleet_uploader_main(void *p)
{
    tv__fleet *f = p;
    tv__catalog *cat = NULL;
    pthread_mutex_lock(&f->mu);
    while (!f->stopping) {
        upload *u = f->uploads;
        double now = tv__fleet_mono_s();
        if (!u || u->next_try > now) {
            struct timespec until;
            clock_gettime(CLOCK_MONOTONIC, &until);
            until.tv_sec += 1;
            pthread_cond_timedwait(&f->cond, &f->mu, &until);
            continue;
        }
        f->uploads = u->next;
        u->next = NULL;
        pthread_mutex_unlock(&f->mu);
        tv_error err = {0};
        int rc = cat ? 0 : tv__catalog_open(f->conninfo, &cat, &err);
        if (rc)
            tv__log(TV_LOG_DEBUG, "fleet: uploader: %s", err.msg);
        else
            rc = upload_generation(f, cat, u);
        pthread_mutex_lock(&f->mu);
        if (rc) {
            upload **tail = &f->uploads;
            while (*tail)
                tail = &(*tail)->next;
            u->next_try = tv__fleet_mono_s() + f->retry_s;
            *tail = u;
        } else {
            upload_free(u);
        }
    }
    pthread_mutex_unlock(&f->mu);
    tv__catalog_close(cat);
    return NULL;
}

void tv__fleet_uploads_free(tv__fleet *f)
{
    while (f->uploads) {
        upload *u = f->uploads;
        f->uploads = u->next;
        upload_free(u);
    }
}
