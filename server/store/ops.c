/* Store operations of the service layer: alias pointers moved with the
 * registry (the tv__store_activate protocol), gc, model delete, and worker
 * handles on a writer store.
 *
 * Invariants: an alias's pointer file changes inside the open registry
 * transaction and the commit follows at once, so a failure at any step
 * rolls the registry back and puts the old pointer back (an error changes
 * neither); a writer killed between the pointer and the commit leaves a
 * pointer that disagrees with the registry, and the next writer's open
 * rewrites it from the registry (tv__store_sync_snapshots); gc removes a
 * retired generation's snapshot before freeing its objects and keeps the
 * objects of one a reader holds; a model is deleted only when no reader
 * holds any of its snapshots, its snapshots go before its rows, and its
 * directory after the commit; a worker handle shares the writer's lock (a
 * duplicate of its descriptor: the lock lasts until both are closed). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "snap/snapfile.h"
#include "store/snapbuild.h"
#include "store/store.h"
#include "util/sys.h"

/* ------------------------------------------------------------------------ */
/* Aliases                                                                  */
/* ------------------------------------------------------------------------ */

/* The generation the registry's alias names now (0: none). */
static int registry_alias(tv__store *st, const char *model, const char *alias, int64_t *gen,
                          tv_error *err)
{
    tv_error e2 = {0};
    int rc = tv__reg_alias_get(st->reg, model, alias, gen, &e2);
    if (rc == TV_E_NOT_FOUND) {
        *gen = 0;
        return 0;
    }
    if (rc && err)
        *err = e2;
    return rc;
}

/* Puts the alias pointer back on gen (0: absent) after a failed change;
 * appends to err's message when even that fails. */
static void restore_alias(tv__store *st, const char *model, const char *alias, int64_t gen,
                          tv_error *err)
{
    tv_error e2 = {0};
    if (tv__snapfile_write_alias(st->dir, model, alias, gen, &e2) == 0)
        return;
    tv__log(TV_LOG_WARN, "store %s: model '%s': restoring alias pointer '%s' failed: %s", st->dir,
            model, alias, e2.msg);
    if (err) {
        char msg[2 * sizeof err->msg + 64];
        snprintf(msg, sizeof msg, "%s (and restoring the alias pointer failed: %s)", err->msg,
                 e2.msg);
        memcpy(err->msg, msg, sizeof err->msg - 1);
        err->msg[sizeof err->msg - 1] = '\0';
    }
}

int tv__store_alias_set(tv__store *st, const char *model, const char *alias, int64_t number,
                        tv_error *err)
{
    tv__reg_generation g;
    int64_t prev = 0;
    bool exists = false;
    int rc;
    if (!st || !model || !alias || number <= 0)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__store_alias_set: bad argument");
    if (!strcmp(alias, "active"))
        return tv__store_activate(st, model, number, err);
    if ((rc = tv__alias_name_valid(alias, err)) ||
        (rc = tv__reg_generation_get(st->reg, model, number, &g, err)))
        return rc;
    if (g.state != TV__GEN_READY)
        return tv__seterr(err, TV_E_STATE,
                          "model '%s' generation %lld is %s: only ready generations can be aliased",
                          model, (long long)number, tv__gen_state_name(g.state));
    /* 1. The snapshot exists before the pointer names it. */
    if ((rc = tv__snapfile_exists(st->dir, model, number, &exists, err)) ||
        (!exists && (rc = tv__store_write_snapshot(st, model, number, err))))
        return rc;
    tv__crash_point("alias.snapshot");
    /* 2. The registry change, not committed yet; the previous value is
     * read under the write lock (another handle may have moved it). */
    if ((rc = tv__reg_begin(st->reg, err)))
        return rc;
    if ((rc = registry_alias(st, model, alias, &prev, err)) ||
        (rc = tv__reg_alias_set(st->reg, model, alias, number, err)))
        goto fail_tx;
    /* 3. The pointer: readers opening NAME@ALIAS switch here. */
    if ((rc = tv__snapfile_write_alias(st->dir, model, alias, number, err))) {
        restore_alias(st, model, alias, prev, err);
        goto fail_tx;
    }
    tv__crash_point("alias.pointer");
    /* 4. Commit; a failed commit undoes the transaction: undo the pointer. */
    if ((rc = tv__reg_commit(st->reg, err))) {
        restore_alias(st, model, alias, prev, err);
        return rc;
    }
    tv__crash_point("alias.commit");
    return 0;
fail_tx:
    tv__reg_rollback(st->reg);
    return rc;
}

int tv__store_alias_remove(tv__store *st, const char *model, const char *alias, int64_t *number,
                           tv_error *err)
{
    int64_t prev = 0;
    int rc;
    if (!st || !model || !alias)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__store_alias_remove: NULL argument");
    if ((rc = tv__alias_name_valid(alias, err)))
        return rc;
    if ((rc = tv__reg_begin(st->reg, err)))
        return rc;
    if ((rc = tv__reg_alias_remove(st->reg, model, alias, &prev, err)))
        goto fail_tx;
    if ((rc = tv__snapfile_write_alias(st->dir, model, alias, 0, err))) {
        restore_alias(st, model, alias, prev, err);
        goto fail_tx;
    }
    tv__crash_point("alias.pointer");
    if ((rc = tv__reg_commit(st->reg, err))) {
        restore_alias(st, model, alias, prev, err);
        return rc;
    }
    tv__crash_point("alias.commit");
    if (number)
        *number = prev;
    return 0;
fail_tx:
    tv__reg_rollback(st->reg);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* gc                                                                       */
/* ------------------------------------------------------------------------ */

int tv__store_gc(tv__store *st, size_t *n_freed, uint64_t *freed_bytes, tv_error *err)
{
    tv__reg_object *o = NULL;
    size_t n = 0, freed = 0;
    uint64_t bytes = 0;
    bool *keep = NULL;
    if (!st)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__store_gc: NULL store");
    if (st->lock_fd < 0)
        return tv__seterr(err, TV_E_INVALID_ARG, "gc: store %s opened read-only", st->dir);
    int rc = tv__reg_objects_unreferenced(st->reg, &o, &n, err);
    if (!rc && !(keep = calloc(n ? n : 1, sizeof(*keep))))
        rc = tv__seterr(err, -ENOMEM, "out of memory");
    /* Snapshots go first, under their lock: a generation a reader holds
     * keeps its objects (keep[i]); the others can no longer be opened. */
    if (!rc)
        rc = tv__store_gc_snapshots(st, o, n, keep, err);
    for (size_t i = 0; !rc && i < n; i++) {
        if (keep[i])
            continue;
        tv_error e2;
        int drc = tv__reg_object_delete(st->reg, o[i].id, &e2);
        if (drc == 0) {
            tv__crash_point("gc.commit");
            freed++;
            bytes += o[i].alloc_len; /* <= the device size: no overflow */
        } else if (drc != TV_E_LEASED && drc != TV_E_STATE) {
            rc = drc;
            if (err)
                *err = e2;
        }
    }
    free(o);
    free(keep);
    /* Sidecar files (registry rows, no device space): those of retired and
     * failed generations, then every content no generation names. */
    size_t n_side = 0;
    uint64_t side_bytes = 0;
    if (rc == 0 && (rc = tv__reg_sidecars_gc(st->reg, &n_side, &side_bytes, err)) == 0 && n_side)
        tv__log(TV_LOG_INFO, "store %s: gc dropped %zu sidecar files, %llu bytes", st->dir, n_side,
                (unsigned long long)side_bytes);
    if (rc == 0) {
        if (freed)
            tv__log(TV_LOG_INFO, "store %s: gc freed %zu objects, %llu bytes", st->dir, freed,
                    (unsigned long long)bytes);
        if (n_freed)
            *n_freed = freed;
        if (freed_bytes)
            *freed_bytes = bytes;
    }
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Model delete                                                             */
/* ------------------------------------------------------------------------ */

int tv__store_model_delete(tv__store *st, const char *model, size_t *n_retired,
                           uint64_t *freed_bytes, tv_error *err)
{
    tv__reg_generation *gens = NULL;
    size_t n_gens = 0, retired = 0;
    int rc;
    if (!st || !model)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__store_model_delete: NULL argument");
    if (st->lock_fd < 0)
        return tv__seterr(err, TV_E_INVALID_ARG, "model delete: store %s opened read-only",
                          st->dir);
    if ((rc = tv__reg_generations_list(st->reg, model, &gens, &n_gens, err)))
        return rc;
    /* A reader holding any snapshot keeps the model (its objects stay). */
    for (size_t i = 0; i < n_gens; i++) {
        bool leased = false;
        if ((rc = tv__store_snapshot_leased(st, model, gens[i].number, &leased, err)))
            goto done;
        if (leased) {
            rc = tv__seterr(err, TV_E_LEASED,
                            "model '%s' generation %lld is held by a reader: not deleted", model,
                            (long long)gens[i].number);
            goto done;
        }
    }
    if ((rc = tv__reg_begin(st->reg, err)))
        goto done;
    /* The rules first (active, aliased, importing, leased rows), then the
     * snapshot files so no reader can open the model, then the commit. */
    if ((rc = tv__reg_model_delete(st->reg, model, &retired, err)))
        goto fail_tx;
    for (size_t i = 0; i < n_gens; i++)
        if ((rc = tv__store_remove_snapshot(st, model, gens[i].number, err)))
            goto fail_tx;
    tv__crash_point("model_delete.snapshots");
    if ((rc = tv__reg_commit(st->reg, err)))
        goto done;
    tv__crash_point("model_delete.commit");
    tv_error e2 = {0};
    if (tv__snapfile_remove_model(st->dir, model, &e2))
        tv__log(TV_LOG_WARN, "store %s: deleted model '%s': %s", st->dir, model, e2.msg);
    if ((rc = tv__store_gc(st, NULL, freed_bytes, err)))
        goto done;
    if (n_retired)
        *n_retired = retired;
    goto done;
fail_tx:
    tv__reg_rollback(st->reg);
done:
    free(gens);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Worker handles                                                           */
/* ------------------------------------------------------------------------ */

int tv__store_open_worker(const tv__store *writer, tv__store **out, tv_error *err)
{
    char p[4096];
    int rc;
    if (!writer || !out)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__store_open_worker: NULL argument");
    *out = NULL;
    if (writer->lock_fd < 0)
        return tv__seterr(err, TV_E_INVALID_ARG,
                          "store %s: worker handles need a writer store (opened read-only)",
                          writer->dir);
    if ((size_t)snprintf(p, sizeof p, "%s/registry.db", writer->dir) >= sizeof p)
        return tv__seterr(err, -ENAMETOOLONG, "%s/registry.db: path too long", writer->dir);
    tv__store *st = calloc(1, sizeof(*st));
    if (!st)
        return tv__seterr(err, -ENOMEM, "out of memory");
    st->lock_fd = -1;
    if (!(st->dir = strdup(writer->dir))) {
        rc = tv__seterr(err, -ENOMEM, "out of memory");
        goto fail;
    }
    /* The same open file description: the flock is the writer's, and it
     * lasts until every duplicate is closed. */
    if ((st->lock_fd = fcntl(writer->lock_fd, F_DUPFD_CLOEXEC, 0)) < 0) {
        rc = tv__seterr(err, -errno, "store %s: duplicating the lock: %s", writer->dir,
                        strerror(errno));
        goto fail;
    }
    if ((rc = tv__reg_open_ex(p, 0, &st->reg, err)))
        goto fail;
    *out = st;
    return 0;
fail:
    tv__store_close(st);
    return rc;
}
