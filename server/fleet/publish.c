/* Publishing: every ready generation of the local registry goes to the
 * catalog once per process (the catalog's publish is idempotent), all of
 * them after each (re)connect, then those a kick announces; a generation
 * imported here from a local path is queued for the uploader too.
 * Invariants: a failed publish is logged and retried, and never touches
 * the local generation; a conflict (other content under the same number)
 * is logged as an error and not retried; a generation retired or gone
 * meanwhile is left to the next scan. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fleet/fleet_internal.h"
#include "import/source.h"
#include "util/internal.h"

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

/* Publishes every ready generation not yet published by this process.
 * Returns 0, or the first error that is worth a retry. */
int tv__fleet_publish_pending(tv__fleet *f)
{
    tv_error err = {0};
    int rc, retry = 0;
    if (!f->reg && (rc = tv__reg_open_ex(f->reg_path, 0, &f->reg, &err))) {
        tv__log(TV_LOG_WARN, "fleet: cannot open the local registry: %s", err.msg);
        return rc;
    }
    tv__reg_model *models = NULL;
    size_t n_models = 0;
    if ((rc = tv__reg_models_list(f->reg, &models, &n_models, &err))) {
        tv__log(TV_LOG_WARN, "fleet: cannot list local models: %s", err.msg);
        return rc;
    }
    for (size_t i = 0; i < n_models && !retry && !tv__fleet_stopping(f); i++) {
        tv__reg_generation *gens = NULL;
        size_t n_gens = 0;
        if ((rc = tv__reg_generations_list(f->reg, models[i].name, &gens, &n_gens, &err))) {
            if (rc != TV_E_NOT_FOUND) /* a model removed meanwhile */
                retry = rc;
            continue;
        }
        for (size_t k = 0; k < n_gens && !retry && !tv__fleet_stopping(f); k++) {
            const tv__reg_generation *g = &gens[k];
            if (g->state != TV__GEN_READY || is_done(f, g->model, g->number))
                continue;
            tv__reg_manifest *m = NULL;
            tv__reg_file *files = NULL;
            size_t n_files = 0;
            int published = 0;
            rc = tv__reg_tensors_list(f->reg, g->id, &m, &err);
            if (rc == 0)
                rc = tv__reg_generation_files_list(f->reg, g->id, &files, &n_files, &err);
            if (rc == 0)
                rc = tv__catalog_publish_generation_ex(f->cat, f->node, m, files, n_files,
                                                       &published, &err);
            free(files);
            /* Ready, a source for peers, once it is in the catalog; the
             * object store's copy follows (a failed upload is retried, and
             * reports ready again). */
            if (rc == 0)
                tv__fleet_report_gen(f, g->model, g->number, "ready", g->total_bytes,
                                     g->total_bytes, 0, NULL);
            /* The object store gets what only this node could serve: a
             * generation imported from a local path (not a pull: its
             * source is "fleet:MODEL@N from ...", pull.c). */
            if (rc == 0 && f->object_store[0] && !tv__src_is_url(g->source) &&
                strncmp(g->source, "fleet:", 6) != 0 &&
                !tv__fleet_pull_find(f, g->model, g->number, false) && tv__fleet_upload_queue(f, m))
                rc = -EAGAIN;
            tv__reg_manifest_free(m);
            if (rc == -EAGAIN) {
                retry = rc;
                continue;
            }
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
