/* Manifest snapshots of a store's generations: registry rows -> tv__snap_in
 * -> one image per generation under DIR/snapshots. See snapbuild.h for the
 * invariants. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "store/snapbuild.h"
#include "snap/snapfile.h"
#include "snap/snapshot.h"
#include "util/hex.h"
#include "util/sys.h"

/* ---- registry rows -> builder input ------------------------------------- */

/* Lenient hex for identity fields (same rule as the store's label check:
 * a missing or short value leaves zeros). */
static void unhex_lenient(const char *s, uint8_t *out, size_t n)
{
    memset(out, 0, n);
    for (size_t i = 0; s && i < n && s[2 * i] && s[2 * i + 1]; i++) {
        int hi = tv__hex_digit(s[2 * i]), lo = tv__hex_digit(s[2 * i + 1]);
        if (hi < 0 || lo < 0)
            break;
        out[i] = (uint8_t)(hi << 4 | lo);
    }
}

/* A device row -> the snapshot's device record, mapping the uuid text and
 * the identity JSON the way the store maps them to label fields. */
int tv__store_device_record(const tv__reg_device *row, tv__snap_device_in *d, tv_error *err)
{
    memset(d, 0, sizeof *d);
    if (tv__uuid_parse(row->uuid, d->uuid))
        return tv__seterr(err, TV_E_REGISTRY, "device %lld: malformed uuid '%s' in registry",
                          (long long)row->id, row->uuid);
    if (!strcmp(row->kind, "file"))
        d->kind = TV__DEV_FILE;
    else if (!strcmp(row->kind, "block"))
        d->kind = TV__DEV_BLOCK;
    else if (!strcmp(row->kind, "nvme"))
        d->kind = TV__DEV_NVME;
    else
        return tv__seterr(err, TV_E_REGISTRY, "device %lld: unknown kind '%s' in registry",
                          (long long)row->id, row->kind);
    if (row->lba_size > UINT32_MAX || row->io_align > UINT32_MAX)
        return tv__seterr(err, TV_E_REGISTRY, "device %lld: lba size or io_align out of range",
                          (long long)row->id);
    d->path = row->path;
    d->lba_size = (uint32_t)row->lba_size;
    d->io_align = (uint32_t)row->io_align;
    d->object_align = row->object_align;
    d->size_bytes = row->size_bytes;
    d->region_off = row->region_off;
    d->region_len = row->region_len;
    d->data_off = row->data_off;
    json_error_t je;
    json_t *id = json_loads(row->identity, 0, &je);
    if (id) {
        const char *serial = json_string_value(json_object_get(id, "serial"));
        const char *model = json_string_value(json_object_get(id, "model"));
        /* Zero-padded, not NUL-terminated when full: as in the label. */
        if (serial)
            memcpy(d->serial, serial, strnlen(serial, sizeof d->serial));
        if (model)
            memcpy(d->model, model, strnlen(model, sizeof d->model));
        d->nsid = (uint32_t)json_integer_value(json_object_get(id, "nsid"));
        unhex_lenient(json_string_value(json_object_get(id, "nguid")), d->nguid, sizeof d->nguid);
        unhex_lenient(json_string_value(json_object_get(id, "eui64")), d->eui64, sizeof d->eui64);
        json_decref(id);
    }
    return 0;
}

typedef struct build_mem {
    tv__reg_manifest *m;
    int64_t *dev_ids;
    tv__reg_device *dev_rows;
    tv__snap_device_in *devs;
    tv__snap_shard_in *shards;
    tv__snap_replica_in *reps;
    tv__snap_tensor_in *tensors;
} build_mem;

static void build_mem_free(build_mem *b)
{
    tv__reg_manifest_free(b->m);
    free(b->dev_ids);
    free(b->dev_rows);
    free(b->devs);
    free(b->shards);
    free(b->reps);
    free(b->tensors);
    memset(b, 0, sizeof *b);
}

/* Builds generation gen (0 = active) with the given hash seed (0 = random).
 * *g receives the generation row (its model name and number name the file). */
static int build_image(tv__store *st, const char *model, int64_t gen, uint64_t seed,
                       tv__reg_generation *g, void **buf, size_t *len, tv_error *err)
{
    build_mem b = {0};
    size_t n_reps = 0, n_devs = 0;
    int rc;
    *buf = NULL;
    *len = 0;
    if ((rc = tv__reg_generation_get(st->reg, model, gen, g, err)))
        return rc;
    if (g->state != TV__GEN_READY && g->state != TV__GEN_RETIRED)
        return tv__seterr(
            err, TV_E_STATE,
            "model '%s' generation %lld is %s: only ready and retired generations have snapshots",
            g->model, (long long)g->number, tv__gen_state_name(g->state));
    if ((rc = tv__reg_tensors_list(st->reg, g->id, &b.m, err)))
        return rc;
    const tv__reg_manifest *m = b.m;
    for (size_t i = 0; i < m->n_shards; i++)
        n_reps += m->shards[i].n_replicas;
    if ((n_reps && (!(b.dev_ids = calloc(n_reps, sizeof *b.dev_ids)) ||
                    !(b.reps = calloc(n_reps, sizeof *b.reps)))) ||
        (m->n_shards && !(b.shards = calloc(m->n_shards, sizeof *b.shards))) ||
        (m->n_tensors && !(b.tensors = calloc(m->n_tensors, sizeof *b.tensors)))) {
        rc = tv__seterr(err, -ENOMEM, "snapshot: out of memory");
        goto done;
    }
    /* Devices holding a committed replica, in first-seen order. */
    for (size_t i = 0; i < m->n_shards; i++) {
        for (size_t r = 0; r < m->shards[i].n_replicas; r++) {
            const tv__reg_replica *rp = &m->shards[i].replicas[r];
            size_t k = 0;
            while (k < n_devs && b.dev_ids[k] != rp->device_id)
                k++;
            if (rp->committed && k == n_devs)
                b.dev_ids[n_devs++] = rp->device_id;
        }
    }
    if (n_devs && (!(b.dev_rows = calloc(n_devs, sizeof *b.dev_rows)) ||
                   !(b.devs = calloc(n_devs, sizeof *b.devs)))) {
        rc = tv__seterr(err, -ENOMEM, "snapshot: out of memory");
        goto done;
    }
    for (size_t k = 0; k < n_devs; k++) {
        if ((rc = tv__reg_device_get(st->reg, b.dev_ids[k], &b.dev_rows[k], err)) ||
            (rc = tv__store_device_record(&b.dev_rows[k], &b.devs[k], err)))
            goto done;
    }
    size_t used = 0;
    for (size_t i = 0; i < m->n_shards; i++) {
        const tv__reg_shard *sh = &m->shards[i];
        tv__snap_shard_in *out = &b.shards[i];
        out->name = sh->name;
        out->file_len = sh->file_len;
        out->header_len = sh->header_len;
        if (tv__hex_decode(sh->sha256, strlen(sh->sha256), out->sha256, sizeof out->sha256)) {
            rc = tv__seterr(err, TV_E_REGISTRY, "shard '%s': malformed sha256 '%s' in registry",
                            sh->name, sh->sha256);
            goto done;
        }
        out->replicas = b.reps ? b.reps + used : NULL;
        for (size_t r = 0; r < sh->n_replicas; r++) {
            const tv__reg_replica *rp = &sh->replicas[r];
            if (!rp->committed)
                continue;
            uint32_t k = 0;
            while (b.dev_ids[k] != rp->device_id)
                k++;
            b.reps[used++] = (tv__snap_replica_in){.device = k,
                                                   .object_id = rp->object_id,
                                                   .base_off = rp->base_off,
                                                   .alloc_len = rp->alloc_len};
            out->n_replicas++;
        }
        if (out->n_replicas == 0) {
            rc = tv__seterr(
                err, TV_E_STATE,
                "model '%s' generation %lld: shard '%s' has no committed object (freed by gc?)",
                g->model, (long long)g->number, sh->name);
            goto done;
        }
    }
    for (size_t i = 0; i < m->n_tensors; i++) {
        const tv__reg_tensor *t = &m->tensors[i];
        b.tensors[i] = (tv__snap_tensor_in){.name = t->name,
                                            .name_len = t->name_len,
                                            .dtype = t->dtype,
                                            .rank = t->rank,
                                            .shape = t->shape,
                                            .shard = t->shard_idx,
                                            .begin_off = t->begin_off,
                                            .end_off = t->end_off};
    }
    tv__snap_in in = {.model = g->model,
                      .generation = g->number,
                      .n_devices = n_devs,
                      .devices = b.devs,
                      .n_shards = m->n_shards,
                      .shards = b.shards,
                      .n_tensors = m->n_tensors,
                      .tensors = b.tensors,
                      .hash_seed = seed};
    rc = tv__snap_build(&in, buf, len, err);
done:
    build_mem_free(&b);
    return rc;
}

int tv__store_build_snapshot(tv__store *st, const char *model, int64_t gen, void **buf, size_t *len,
                             tv_error *err)
{
    tv__reg_generation g;
    if (!st || !model || !buf || !len || gen < 0)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__store_build_snapshot: bad argument");
    return build_image(st, model, gen, 0, &g, buf, len, err);
}

/* ---- files -------------------------------------------------------------- */

/* The file of g exists: keep it when it is valid and equal to what the
 * registry says now (rebuilt with the file's own hash seed, the image must
 * match byte for byte), else replace it unless a reader holds it. */
static int reconcile_existing(tv__store *st, const tv__reg_generation *g, const void *fresh,
                              size_t fresh_len, tv_error *err)
{
    int fd = -1, rc;
    void *old = NULL, *again = NULL;
    size_t old_len = 0, again_len = 0;
    tv__reg_generation g2;
    tv__snap s;
    tv_error e2 = {0};
    rc = tv__snapfile_open(st->dir, g->model, g->number, &fd, &old, &old_len, &e2);
    if (fd >= 0)
        tv__sys.close(fd);    /* our own shared lock would block the removal below */
    if (rc == TV_E_NOT_FOUND) /* vanished meanwhile: write it */
        return tv__snapfile_write(st->dir, g->model, g->number, fresh, fresh_len, err);
    if (rc == 0 && tv__snap_open(old, old_len, TV__SNAP_VERIFY_CHECKSUM, &s, &e2) == 0 &&
        s.hash_seed != 0 &&
        build_image(st, g->model, g->number, s.hash_seed, &g2, &again, &again_len, &e2) == 0 &&
        again_len == old_len && memcmp(again, old, old_len) == 0) {
        tv__snapfile_unmap(old, old_len);
        free(again);
        return 0;
    }
    tv__snapfile_unmap(old, old_len);
    free(again);
    tv__log(
        TV_LOG_WARN,
        "store %s: snapshot of model '%s' generation %lld is stale or corrupt (%s): replacing it unless a reader holds it",
        st->dir, g->model, (long long)g->number, e2.msg[0] ? e2.msg : "differs from the registry");
    if ((rc = tv__snapfile_remove(st->dir, g->model, g->number, err)))
        return rc;
    return tv__snapfile_write(st->dir, g->model, g->number, fresh, fresh_len, err);
}

int tv__store_write_snapshot(tv__store *st, const char *model, int64_t gen, tv_error *err)
{
    tv__reg_generation g;
    void *buf = NULL;
    size_t len = 0;
    if (!st || !model || gen < 0)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__store_write_snapshot: bad argument");
    int rc = build_image(st, model, gen, 0, &g, &buf, &len, err);
    if (rc)
        return rc;
    rc = tv__snapfile_write(st->dir, g.model, g.number, buf, len, err);
    if (rc == -EEXIST)
        rc = reconcile_existing(st, &g, buf, len, err);
    free(buf);
    return rc;
}

/* The registry's active generation of model (0: none, or no such model). */
static int registry_active(tv__store *st, const char *model, int64_t *active, tv_error *err)
{
    tv_error e2 = {0};
    int rc = tv__reg_active_generation(st->reg, model, active, &e2);
    if (rc == TV_E_NOT_FOUND) {
        *active = 0;
        return 0;
    }
    if (rc && err)
        *err = e2;
    return rc;
}

/* The pointer as it is now: *gen 0 when absent or unreadable (malformed, a
 * link, not a regular file: all rewritten from the registry). */
static int pointer_now(tv__store *st, const char *model, int64_t *gen, int64_t *from, tv_error *err)
{
    tv_error e2 = {0};
    int rc = tv__snapfile_read_pointer(st->dir, model, gen, from, &e2);
    if (rc == TV_E_NOT_FOUND || rc == TV_E_SNAPSHOT) {
        if (rc == TV_E_SNAPSHOT)
            tv__log(TV_LOG_WARN, "store %s: %s: rewriting it from the registry", st->dir, e2.msg);
        *gen = 0;
        *from = -1;
        return rc == TV_E_SNAPSHOT ? 1 : 0;
    }
    if (rc && err)
        *err = e2;
    return rc;
}

/* Writes generation gen's snapshot unless its file exists. */
static int ensure_snapshot(tv__store *st, const char *model, int64_t gen, tv_error *err)
{
    bool exists = false;
    int rc = tv__snapfile_exists(st->dir, model, gen, &exists, err);
    if (!rc && !exists)
        rc = tv__store_write_snapshot(st, model, gen, err);
    return rc;
}

/* Writes the pointer as the registry says (number 0: removes it), the
 * snapshot it names first; nothing when it already says so. */
static int pointer_from_registry(tv__store *st, const char *model, int64_t number, tv_error *err)
{
    int64_t now = 0, from = -1;
    int rc = pointer_now(st, model, &now, &from, err);
    if (rc < 0)
        return rc;
    if (rc == 0 && now == number)
        return 0; /* read and compared: nothing to write */
    if (number == 0)
        return tv__snapfile_write_pointer(st->dir, model, 0, -1, err);
    if ((rc = ensure_snapshot(st, model, number, err)))
        return rc;
    return tv__snapfile_write_pointer(st->dir, model, number, -1, err);
}

int tv__store_write_active(tv__store *st, const char *model, tv_error *err)
{
    int64_t number = 0;
    if (!st || !model)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__store_write_active: NULL argument");
    int rc = registry_active(st, model, &number, err);
    if (rc)
        return rc;
    return pointer_from_registry(st, model, number, err);
}

/* Puts the pointer back on the registry's generation (gen 0: absent; from
 * as it was) after a failed activation; appends to err's message when even
 * that fails. */
static void restore_pointer(tv__store *st, const char *model, int64_t gen, int64_t from,
                            tv_error *err)
{
    tv_error e2 = {0};
    if (tv__snapfile_write_pointer(st->dir, model, gen, gen ? from : -1, &e2) == 0)
        return;
    tv__log(TV_LOG_WARN, "store %s: model '%s': restoring the active pointer failed: %s", st->dir,
            model, e2.msg);
    if (err) {
        char msg[2 * sizeof err->msg + 64];
        snprintf(msg, sizeof msg, "%s (and restoring the active pointer failed: %s)", err->msg,
                 e2.msg);
        memcpy(err->msg, msg, sizeof err->msg - 1);
        err->msg[sizeof err->msg - 1] = '\0';
    }
}

/* Puts the pointer a failed deactivation moved aside back in place;
 * appends to err's message when even that fails (then the next writer's
 * open completes the deactivation, which readers already see). */
static void restore_deactivated(tv__store *st, const char *model, tv_error *err)
{
    tv_error e2 = {0};
    if (tv__snapfile_undo_deactivate(st->dir, model, &e2) == 0)
        return;
    tv__log(TV_LOG_WARN, "store %s: model '%s': restoring the active pointer failed: %s", st->dir,
            model, e2.msg);
    if (err) {
        char msg[2 * sizeof err->msg + 64];
        snprintf(msg, sizeof msg, "%s (and restoring the active pointer failed: %s)", err->msg,
                 e2.msg);
        memcpy(err->msg, msg, sizeof err->msg - 1);
        err->msg[sizeof err->msg - 1] = '\0';
    }
}

int tv__store_activate(tv__store *st, const char *model, int64_t gen, tv_error *err)
{
    tv__reg_generation g;
    int64_t prev = 0, old_gen = 0, old_from = -1;
    int rc;
    if (!st || !model || gen <= 0)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__store_activate: bad argument");
    if ((rc = tv__reg_generation_get(st->reg, model, gen, &g, err)))
        return rc;
    if (g.state != TV__GEN_READY)
        return tv__seterr(
            err, TV_E_STATE,
            "model '%s' generation %lld is %s: only ready generations can be activated", model,
            (long long)gen, tv__gen_state_name(g.state));
    if ((rc = registry_active(st, model, &prev, err)))
        return rc;
    if (prev == gen) /* nothing to change; the pointer must agree all the same */
        return pointer_from_registry(st, model, gen, err);
    /* 1. The snapshot exists before anything names it (harmless if we stop
     * here: a ready generation may have its file). */
    if ((rc = ensure_snapshot(st, model, gen, err)))
        return rc;
    tv__crash_point("activate.snapshot");
    /* 2. The registry change, not committed yet. The previous generation
     * and pointer are read under the write lock: another handle on this
     * store (a worker, tv__store_open_worker) may have activated meanwhile. */
    if ((rc = tv__reg_begin(st->reg, err)))
        return rc;
    if ((rc = registry_active(st, model, &prev, err)) ||
        (rc = pointer_now(st, model, &old_gen, &old_from, err)) < 0)
        goto fail_tx;
    if (prev == gen) { /* it happened meanwhile */
        tv__reg_rollback(st->reg);
        return pointer_from_registry(st, model, gen, err);
    }
    if ((rc = tv__reg_generation_activate(st->reg, model, gen, err)))
        goto fail_tx;
    /* 3. The pointer: readers switch here. It records the generation it
     * replaces so that a writer killed before step 4 is told apart from a
     * stale pointer (the next writer completes the change). */
    if ((rc = tv__snapfile_write_pointer(st->dir, model, gen, prev, err))) {
        restore_pointer(st, model, prev, old_gen == prev ? old_from : -1, err);
        goto fail_tx;
    }
    tv__crash_point("activate.pointer");
    /* 4. Commit; a failed commit undoes the transaction: undo the pointer. */
    if ((rc = tv__reg_commit(st->reg, err))) {
        restore_pointer(st, model, prev, old_gen == prev ? old_from : -1, err);
        return rc;
    }
    tv__crash_point("activate.commit");
    return 0;
fail_tx:
    tv__reg_rollback(st->reg);
    return rc;
}

int tv__store_deactivate(tv__store *st, const char *model, int64_t *was, tv_error *err)
{
    int64_t prev = 0;
    bool moved = false;
    int rc;
    if (!st || !model)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__store_deactivate: NULL argument");
    if (st->lock_fd < 0)
        return tv__seterr(err, TV_E_INVALID_ARG, "deactivate: store %s opened read-only", st->dir);
    /* 1. The registry change, not committed yet; the active generation is
     * read under the write lock (another handle may have changed it). */
    if ((rc = tv__reg_begin(st->reg, err)))
        return rc;
    if ((rc = tv__reg_generation_deactivate(st->reg, model, &prev, err)))
        goto fail_tx;
    if (prev == 0) { /* nothing active; the pointer must agree all the same */
        tv__reg_rollback(st->reg);
        if ((rc = pointer_from_registry(st, model, 0, err)))
            return rc;
        goto done;
    }
    /* 2. The pointer moves aside ("deactivated"): readers see no active
     * generation from here on, and a writer killed before step 3 leaves
     * the moved pointer naming the registry's active generation, which the
     * next writer's open tells apart from a lost pointer (it completes the
     * deactivation). */
    if ((rc = tv__snapfile_deactivate(st->dir, model, &moved, err))) {
        if (moved)
            restore_deactivated(st, model, err);
        goto fail_tx;
    }
    tv__crash_point("deactivate.pointer");
    /* 3. Commit; a failed commit undoes the transaction: undo the move. */
    if ((rc = tv__reg_commit(st->reg, err))) {
        if (moved)
            restore_deactivated(st, model, err);
        return rc;
    }
    tv__crash_point("deactivate.commit");
    /* 4. Done: the moved pointer is no longer needed. Leaving it is
     * harmless (the registry has no active generation, so the next
     * writer's open just removes it). */
    tv_error e2 = {0};
    if (moved && tv__snapfile_remove_deactivated(st->dir, model, &e2))
        tv__log(TV_LOG_WARN, "store %s: model '%s' deactivated, but: %s", st->dir, model, e2.msg);
done:
    if (was)
        *was = prev;
    return 0;
fail_tx:
    tv__reg_rollback(st->reg);
    return rc;
}

/* How the pointer files disagree with the registry after a writer was
 * killed between its pointer change and its commit. */
typedef enum { CUT_NONE, CUT_ACTIVATION, CUT_DEACTIVATION } cut_kind;

/* Whether a model's pointer files show an interrupted change:
 *   - an activation: the pointer names a ready generation p with a
 *     snapshot and records that it replaced the registry's active
 *     generation (killed between the pointer rename and the commit);
 *   - a deactivation: there is no pointer, and the moved one
 *     ("deactivated") names the registry's active generation (killed
 *     between the move and the commit).
 * Then the next writer completes the change (readers already switched);
 * any other disagreement is settled by the registry. *moved_left = a moved
 * pointer exists (readable or not). */
static int interrupted_change(tv__store *st, const char *model, const tv__reg_generation *gens,
                              size_t n_gens, int64_t *active, int64_t *p, cut_kind *cut,
                              bool *moved_left, tv_error *err)
{
    int64_t from = -1, d = 0, d_from = -1;
    bool exists = false, ready = false;
    tv_error e2 = {0};
    int rc, drc;
    *cut = CUT_NONE;
    *p = 0;
    *moved_left = false;
    if ((rc = registry_active(st, model, active, err)))
        return rc;
    if ((rc = pointer_now(st, model, p, &from, err)) < 0)
        return rc;
    if (rc > 0) /* unreadable pointer: never equal to the registry's value */
        *p = -1;
    drc = tv__snapfile_read_deactivated(st->dir, model, &d, &d_from, &e2);
    if (drc && drc != TV_E_NOT_FOUND && drc != TV_E_SNAPSHOT) {
        if (err)
            *err = e2;
        return drc;
    }
    *moved_left = drc != TV_E_NOT_FOUND;
    if (*p == 0 && drc == 0 && *active > 0 && d == *active) {
        *cut = CUT_DEACTIVATION;
        return 0;
    }
    if (*p == *active || *p <= 0 || from != *active)
        return 0;
    for (size_t j = 0; j < n_gens; j++)
        if (gens[j].number == *p && gens[j].state == TV__GEN_READY)
            ready = true;
    if (ready && (rc = tv__snapfile_exists(st->dir, model, *p, &exists, err)))
        return rc;
    if (ready && exists)
        *cut = CUT_ACTIVATION;
    return 0;
}

/* Writer-open repair of one model's pointer (gens: its generations).
 * Registry and pointer agree: nothing is written. An activation or a
 * deactivation cut between its pointer change and its commit is
 * completed in the registry (see interrupted_change). Otherwise the
 * registry wins and the pointer is rewritten. A moved pointer left behind
 * is removed once the registry is settled. */
static int sync_pointer(tv__store *st, const char *model, const tv__reg_generation *gens,
                        size_t n_gens, tv_error *err)
{
    int64_t active = 0, p = 0;
    cut_kind cut = CUT_NONE;
    bool moved_left = false;
    int rc = interrupted_change(st, model, gens, n_gens, &active, &p, &cut, &moved_left, err);
    if (rc)
        return rc;
    if (cut == CUT_ACTIVATION) {
        tv__log(TV_LOG_WARN, "store %s: model '%s': completing the activation of generation %lld",
                st->dir, model, (long long)p);
        rc = tv__reg_generation_activate(st->reg, model, p, err);
    } else if (cut == CUT_DEACTIVATION) {
        tv__log(TV_LOG_WARN,
                "store %s: model '%s': completing the deactivation (generation %lld was active)",
                st->dir, model, (long long)active);
        rc = tv__reg_generation_deactivate(st->reg, model, NULL, err);
    } else if (p != active) {
        tv__log(
            TV_LOG_WARN,
            "store %s: model '%s': active pointer says %lld, the registry %lld: rewriting the pointer",
            st->dir, model, (long long)p, (long long)active);
        rc = pointer_from_registry(st, model, active, err);
    }
    if (rc == 0 && moved_left) {
        if (cut != CUT_DEACTIVATION)
            tv__log(TV_LOG_INFO, "store %s: model '%s': removing a leftover deactivated pointer",
                    st->dir, model);
        rc = tv__snapfile_remove_deactivated(st->dir, model, err);
    }
    return rc;
}

int tv__store_settled_active(tv__store *st, const char *model, int64_t *gen, tv_error *err)
{
    tv__reg_generation *gens = NULL;
    size_t n_gens = 0;
    int64_t active = 0, p = 0;
    cut_kind cut = CUT_NONE;
    bool moved_left = false;
    int rc = tv__reg_generations_list(st->reg, model, &gens, &n_gens, err);
    if (!rc)
        rc = interrupted_change(st, model, gens, n_gens, &active, &p, &cut, &moved_left, err);
    free(gens);
    if (!rc)
        *gen = cut == CUT_ACTIVATION ? p : cut == CUT_DEACTIVATION ? 0 : active;
    return rc;
}

static void keep_first(int *first, tv_error *err, int rc, const tv_error *e)
{
    if (rc && !*first) {
        *first = rc;
        if (err)
            *err = *e;
    }
}

/* True unless the generation's file opens but its header is one this
 * build's readers refuse (an older or newer format version, bad magic,
 * lengths or section table): O(1), no checksum pass, so a writer's open
 * stays cheap. A file that does not even open (a link, FIFO, ...) counts
 * as readable here: reconcile_existing is not for those. */
static bool readable(tv__store *st, const char *model, int64_t gen)
{
    int fd = -1;
    void *buf = NULL;
    size_t len = 0;
    tv__snap s;
    bool ok = true;
    if (tv__snapfile_open(st->dir, model, gen, &fd, &buf, &len, NULL) == 0)
        ok = tv__snap_open(buf, len, 0, &s, NULL) != TV_E_SNAPSHOT;
    tv__snapfile_unmap(buf, len);
    if (fd >= 0)
        tv__sys.close(fd);
    return ok;
}

/* Writer-open repair of one model's alias pointers: the registry wins (an
 * alias move cut between its pointer and its commit, or a pointer left by
 * a removed alias, is put back to what the registry says). Reads and
 * compares first; writes only what differs. */
static int sync_aliases(tv__store *st, const char *model, tv_error *err)
{
    tv__reg_alias *al = NULL;
    tv__snapfile_alias *files = NULL;
    size_t n_al = 0, n_files = 0;
    int first = 0, rc;
    tv_error e = {0};
    if ((rc = tv__reg_aliases_list(st->reg, model, &al, &n_al, err)))
        return rc;
    for (size_t i = 0; i < n_al; i++) {
        int64_t now = 0;
        rc = tv__snapfile_read_alias(st->dir, model, al[i].alias, &now, &e);
        if (rc == 0 && now == al[i].generation)
            continue;
        if (rc && rc != TV_E_NOT_FOUND && rc != TV_E_SNAPSHOT) {
            keep_first(&first, err, rc, &e);
            continue;
        }
        tv__log(
            TV_LOG_WARN,
            "store %s: model '%s': alias pointer '%s' says %lld, the registry %lld: rewriting it",
            st->dir, model, al[i].alias, (long long)(rc ? 0 : now), (long long)al[i].generation);
        rc = ensure_snapshot(st, model, al[i].generation, &e);
        if (rc == 0)
            rc = tv__snapfile_write_alias(st->dir, model, al[i].alias, al[i].generation, &e);
        keep_first(&first, err, rc, &e);
    }
    if ((rc = tv__snapfile_list_aliases(st->dir, model, &files, &n_files, &e)))
        keep_first(&first, err, rc, &e);
    for (size_t k = 0; k < n_files; k++) {
        bool known = false;
        for (size_t i = 0; i < n_al && !known; i++)
            known = !strcmp(files[k].name, al[i].alias);
        if (known)
            continue;
        tv__log(TV_LOG_WARN,
                "store %s: model '%s': alias pointer '%s' has no registry row: removing it",
                st->dir, model, files[k].name);
        rc = tv__snapfile_write_alias(st->dir, model, files[k].name, 0, &e);
        keep_first(&first, err, rc, &e);
    }
    free(files);
    free(al);
    return first;
}

int tv__store_sync_snapshots(tv__store *st, tv_error *err)
{
    tv__reg_model *models = NULL;
    size_t n_models = 0;
    int first = 0, rc;
    if (!st)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__store_sync_snapshots: NULL argument");
    if ((rc = tv__reg_models_list(st->reg, &models, &n_models, err)))
        return rc;
    for (size_t i = 0; i < n_models; i++) {
        const char *name = models[i].name;
        tv__reg_generation *gens = NULL;
        size_t n_gens = 0, n_tmp = 0;
        tv_error e = {0};
        rc = tv__snapfile_clean_temps(st->dir, name, &n_tmp, &e);
        keep_first(&first, err, rc, &e);
        if ((rc = tv__reg_generations_list(st->reg, name, &gens, &n_gens, &e))) {
            keep_first(&first, err, rc, &e);
            continue;
        }
        for (size_t j = 0; j < n_gens; j++) {
            bool exists = true;
            /* Retired generations are never rebuilt: none can become active
             * again, and a reader that holds one holds its file. */
            if (gens[j].state != TV__GEN_READY)
                continue;
            if ((rc = tv__snapfile_exists(st->dir, name, gens[j].number, &exists, &e))) {
                keep_first(&first, err, rc, &e);
                continue;
            }
            if (exists && readable(st, name, gens[j].number))
                continue;
            /* Missing, or one this build's readers refuse (another format
             * version, a damaged header): tv__store_write_snapshot writes it,
             * or replaces it through reconcile_existing unless it is leased. */
            rc = tv__store_write_snapshot(st, name, gens[j].number, &e);
            if (rc)
                tv__log(TV_LOG_WARN, "store %s: snapshot of model '%s' generation %lld: %s",
                        st->dir, name, (long long)gens[j].number, e.msg);
            else
                tv__log(TV_LOG_INFO, "store %s: wrote %s snapshot of model '%s' generation %lld",
                        st->dir, exists ? "unreadable" : "missing", name,
                        (long long)gens[j].number);
            keep_first(&first, err, rc, &e);
        }
        rc = sync_pointer(st, name, gens, n_gens, &e);
        keep_first(&first, err, rc, &e);
        rc = sync_aliases(st, name, &e);
        keep_first(&first, err, rc, &e);
        free(gens);
    }
    free(models);
    return first;
}

int tv__store_snapshot_leased(tv__store *st, const char *model, int64_t gen, bool *leased,
                              tv_error *err)
{
    if (!st)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__store_snapshot_leased: NULL argument");
    return tv__snapfile_try_exclusive(st->dir, model, gen, leased, err);
}

int tv__store_remove_snapshot(tv__store *st, const char *model, int64_t gen, tv_error *err)
{
    if (!st)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__store_remove_snapshot: NULL argument");
    return tv__snapfile_remove(st->dir, model, gen, err);
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* Whether id is among the sorted ids. */
static const int64_t *find_id(const int64_t *ids, size_t n, int64_t id)
{
    return n ? bsearch(&id, ids, n, sizeof *ids, cmp_i64) : NULL;
}

/* Whether manifest m binds any of the objects to free (ids: their sorted
 * ids); with mark, also sets keep[k] for each such object objs[k]. */
static bool touches(const tv__reg_manifest *m, const tv__reg_object *objs, const int64_t *ids,
                    size_t n, bool *keep, bool mark)
{
    bool any = false;
    for (size_t i = 0; i < m->n_shards; i++) {
        for (size_t r = 0; r < m->shards[i].n_replicas; r++) {
            if (!find_id(ids, n, m->shards[i].replicas[r].object_id))
                continue;
            any = true;
            if (!mark)
                return true;
            for (size_t k = 0; k < n; k++)
                if (objs[k].id == m->shards[i].replicas[r].object_id)
                    keep[k] = true;
        }
    }
    return any;
}

int tv__store_gc_snapshots(tv__store *st, const tv__reg_object *objs, size_t n, bool *keep,
                           tv_error *err)
{
    tv__reg_model *models = NULL;
    size_t n_models = 0;
    int64_t *ids = NULL;
    int rc;
    if (!st || (n && (!objs || !keep)))
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__store_gc_snapshots: NULL argument");
    if (n == 0)
        return 0;
    if (!(ids = malloc(n * sizeof *ids)))
        return tv__seterr(err, -ENOMEM, "gc: out of memory");
    for (size_t k = 0; k < n; k++)
        ids[k] = objs[k].id;
    qsort(ids, n, sizeof *ids, cmp_i64);
    if ((rc = tv__reg_models_list(st->reg, &models, &n_models, err)))
        goto done;
    for (size_t i = 0; !rc && i < n_models; i++) {
        tv__reg_generation *gens = NULL;
        size_t n_gens = 0;
        if ((rc = tv__reg_generations_list(st->reg, models[i].name, &gens, &n_gens, err)))
            break;
        for (size_t j = 0; !rc && j < n_gens; j++) {
            tv__reg_manifest *m = NULL;
            if (gens[j].state != TV__GEN_RETIRED)
                continue;
            if ((rc = tv__reg_tensors_list(st->reg, gens[j].id, &m, err)))
                break;
            if (touches(m, objs, ids, n, keep, false)) {
                tv_error e2 = {0};
                rc = tv__snapfile_remove(st->dir, models[i].name, gens[j].number, &e2);
                if (rc == 0)
                    tv__crash_point("gc.snapshot_unlink");
                if (rc == TV_E_LEASED) {
                    tv__log(
                        TV_LOG_INFO,
                        "gc: model '%s' generation %lld is held by a reader: keeping its objects",
                        models[i].name, (long long)gens[j].number);
                    touches(m, objs, ids, n, keep, true);
                    rc = 0;
                } else if (rc && err) {
                    *err = e2;
                }
            }
            tv__reg_manifest_free(m);
        }
        free(gens);
    }
done:
    free(models);
    free(ids);
    return rc;
}
