/* The store backend of tv_model (reader/model.h): one generation of a model
 * opened in-process from a store directory (tv_model_open) or a snapshot
 * image (tv_model_open_snapshot), its devices validated and read with the
 * engine (io/engine.h); and what the fast-path server needs of such a
 * model (reader/serve.h).
 *
 * Invariants: the options are bounded before anything is opened; a model
 * opened from a store holds its snapshot file's shared flock for its whole
 * life (the reader lease); every device is opened read-only and its size
 * and label checked against the snapshot's device record before the engine
 * is created; a device that fails is excluded: closed at once, marked
 * excluded in the engine and left out of every request, so no read is ever
 * issued to it; every shard and replica record is validated once at open
 * (tensor records on first use, by the common layer), so reads follow only
 * checked offsets, and requests are built from those checked values with
 * the valid replicas only. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dev/dev.h"
#include "io/engine.h"
#include "reader/model.h"
#include "reader/serve.h"
#include "snap/snapfile.h"
#include "snap/snapshot.h"
#include "util/sys.h"
#include "xfer/xfer.h"

#define NAME_PREC TV__NAME_PREC

/* A shard's replicas, decoded and validated once at open: reads only add
 * offsets. payload_base = object base_off + the shard's data_off; dev is the
 * snapshot's (and the engine's) device index. n_ok: replicas on devices
 * that passed validation (0: the shard cannot be read). */
typedef struct shard_plan {
    const char *name; /* inside the snapshot */
    size_t name_len;
    uint32_t n_rep, n_ok;
    uint32_t dev[TV__IO_MAX_REPLICAS];
    uint64_t payload_base[TV__IO_MAX_REPLICAS];
    uint64_t obj_base[TV__IO_MAX_REPLICAS]; /* the object's base_off (its header's start) */
} shard_plan;

/* One device of the snapshot as validated at open. */
typedef struct dev_state {
    char *path;
    int reason; /* 0: usable; else why it is excluded */
    char why[sizeof(((tv_error *)0)->msg)];
} dev_state;

typedef struct store_model {
    tv_model m;        /* first: a tv_model * is a store_model * (ops == &store_ops) */
    uint8_t *snap_buf; /* malloc'd copy, or the mapped file when snap_mapped */
    size_t snap_len;
    bool snap_mapped;
    int lease_fd;
    tv__dev **devs; /* NULL for an excluded device */
    dev_state *dst;
    size_t n_devs, n_excluded;
    tv__io *io;
    shard_plan *sh;
    uint32_t max_io_align;
    uint32_t queue_depth;
    size_t chunk_len;
    void *pinned; /* CUDA staging (cudaHostAlloc), allocated on first use */
    size_t pinned_len;
} store_model;

static const tv__model_ops store_ops;

static store_model *store_of(const tv_model *m)
{
    return (store_model *)m;
}

static void store_close(tv_model *bm)
{
    store_model *m = store_of(bm);
    tv__io_destroy(m->io);
    tv__cuda_host_free(m->pinned);
    for (size_t i = 0; i < m->n_devs; i++) {
        if (m->devs)
            tv__dev_close(m->devs[i]);
        if (m->dst)
            free(m->dst[i].path);
    }
    free(m->devs);
    free(m->dst);
    free(m->sh);
    if (m->snap_mapped)
        tv__snapfile_unmap(m->snap_buf, m->snap_len);
    else
        free(m->snap_buf);
    if (m->lease_fd >= 0)
        tv__sys.close(m->lease_fd);
}

/* ---- open: devices ------------------------------------------------------------ */

/* Marks device i excluded for reason code with message msg (copied first:
 * msg may be the caller's error buffer) and closes it. */
static void exclude(store_model *m, uint32_t i, int code, const char *msg)
{
    dev_state *ds = &m->dst[i];
    char why[sizeof(ds->why)];
    if (!msg || !*msg)
        msg = tv_strerror(code);
    if (strstr(msg, ds->path))
        snprintf(why, sizeof(why), "%s", msg);
    else
        snprintf(why, sizeof(why), "device %s: %s", ds->path, msg);
    memcpy(ds->why, why, sizeof(why));
    ds->reason = code;
    tv__dev_close(m->devs[i]);
    m->devs[i] = NULL;
    m->n_excluded++;
    tv__log(TV_LOG_WARN, "model %s@%lld: device excluded, never read: %s: %s", m->m.name,
            (long long)m->m.snap.generation, tv_err_name(code), why);
}

/* Opens device i of the snapshot and validates it: size first (no read
 * for a resized image), then label and identity. Returns 0 (usable or
 * excluded) or an error that fails the whole open (-ENOMEM, a malformed
 * snapshot record). */
static int open_device(store_model *m, uint32_t i, const tv_open_opts *o, tv_error *err)
{
    tv__snap_device_info sd;
    tv__label on_disk, want;
    tv_error e = {0};
    int rc;
    if ((rc = tv__snap_device(&m->m.snap, i, &sd, err)))
        return rc;
    if (!(m->dst[i].path = strndup(sd.path, sd.path_len)))
        return tv__seterr(err, -ENOMEM, "out of memory");
    /* An image is recorded by its real path: a symlink there now was
     * planted, and is not followed. */
    unsigned flags = TV__DEV_O_RDONLY | (o->no_direct ? TV__DEV_O_NODIRECT : 0) |
                     (sd.kind == TV__DEV_FILE ? TV__DEV_O_NOFOLLOW : 0);
    rc = tv__dev_open(m->dst[i].path, flags, &m->devs[i], &e);
    if (rc == -ENOMEM)
        return tv__seterr(err, rc, "device %s: out of memory", m->dst[i].path);
    if (rc == TV_E_INVALID_ARG || rc == TV_E_OVERFLOW)
        rc = TV_E_DEVICE_MISMATCH; /* not a file or block device any more, or odd geometry */
    if (rc) {
        exclude(m, i, rc, e.msg);
        return 0;
    }
    tv__dev *d = m->devs[i];
    if (d->size_bytes != sd.size_bytes) {
        tv__seterr(&e, TV_E_DEVICE_MISMATCH,
                   "device %s: size %llu bytes, the store recorded %llu (resized?)", m->dst[i].path,
                   (unsigned long long)d->size_bytes, (unsigned long long)sd.size_bytes);
        exclude(m, i, TV_E_DEVICE_MISMATCH, e.msg);
        return 0;
    }
    tv__dev_record rec;
    tv__snap_device_record(&sd, &rec);
    tv__label_expected(&rec, &want);
    if ((rc = tv__label_read(d, sd.region_off, &on_disk, &e)) == 0)
        rc = tv__label_check(&on_disk, &want, d, &e);
    if (rc == -ENOMEM)
        return tv__seterr(err, rc, "device %s: out of memory", m->dst[i].path);
    if (rc == TV_E_INVALID_ARG || rc == TV_E_OVERFLOW)
        rc = TV_E_DEVICE_MISMATCH; /* a region that does not fit the device as it is now */
    if (rc) {
        exclude(m, i, rc, e.msg);
        return 0;
    }
    return 0;
}

/* "reason naming device A; reason naming device B": every replica of a
 * shard, valid ones as "PATH: valid". */
static void replica_reasons(const store_model *m, const shard_plan *sp, char *out, size_t len)
{
    size_t at = 0;
    out[0] = '\0';
    for (uint32_t r = 0; r < sp->n_rep && at + 1 < len; r++) {
        const dev_state *ds = &m->dst[sp->dev[r]];
        int n = snprintf(out + at, len - at, "%s%s%s", r ? "; " : "",
                         ds->reason ? ds->why : ds->path, ds->reason ? "" : ": valid");
        if (n < 0)
            break;
        at += (size_t)n;
    }
}

/* Counts each shard's valid replicas; fails the open (with the first
 * excluded device's reason, naming every one) when no shard has one, and
 * warns about each shard left without one. */
static int check_shards(store_model *m, uint32_t first_bad, tv_error *err)
{
    size_t nd = m->n_devs;
    uint32_t n_readable = 0;
    for (uint32_t s = 0; s < m->m.snap.n_shards; s++) {
        shard_plan *sp = &m->sh[s];
        sp->n_ok = 0;
        for (uint32_t r = 0; r < sp->n_rep; r++)
            if (sp->dev[r] >= nd)
                return tv__seterr(err, TV_E_SNAPSHOT, "shard %u: replica on device %u of %zu", s,
                                  sp->dev[r], nd);
            else if (!m->dst[sp->dev[r]].reason)
                sp->n_ok++;
        if (sp->n_ok)
            n_readable++;
    }
    if (first_bad != UINT32_MAX && n_readable == 0 && m->m.snap.n_shards) {
        char why[sizeof(err->msg)];
        size_t at = 0;
        why[0] = '\0';
        for (uint32_t i = 0; i < nd && at + 1 < sizeof(why); i++) {
            if (!m->dst[i].reason)
                continue;
            /* each reason shortened so that several devices fit */
            int n = snprintf(why + at, sizeof(why) - at, "%s%.200s", at ? "; " : "", m->dst[i].why);
            if (n < 0)
                break;
            at += (size_t)n;
        }
        return tv__seterr(err, m->dst[first_bad].reason,
                          "%s@%lld: no shard has a valid replica: %s", m->m.name,
                          (long long)m->m.snap.generation, why);
    }
    for (uint32_t s = 0; s < m->m.snap.n_shards; s++) {
        const shard_plan *sp = &m->sh[s];
        char why[400];
        if (sp->n_ok)
            continue;
        replica_reasons(m, sp, why, sizeof(why));
        tv__log(TV_LOG_WARN, "model %s@%lld: shard %u (%.*s) has no valid replica: %s", m->m.name,
                (long long)m->m.snap.generation, s, NAME_PREC(sp->name_len), sp->name, why);
    }
    return 0;
}

static int open_devices(store_model *m, const tv_open_opts *o, tv_error *err)
{
    int rc = 0;
    size_t nd = m->m.snap.n_devices;
    uint32_t first_bad = UINT32_MAX;
    m->devs = calloc(nd ? nd : 1, sizeof(*m->devs));
    m->dst = calloc(nd ? nd : 1, sizeof(*m->dst));
    tv__io_dev *iod = calloc(nd ? nd : 1, sizeof(*iod));
    if (!m->devs || !m->dst || !iod) {
        free(iod);
        return tv__seterr(err, -ENOMEM, "out of memory");
    }
    m->n_devs = nd;
    for (uint32_t i = 0; i < nd; i++) {
        if ((rc = open_device(m, i, o, err)))
            goto out;
        if (!m->devs[i]) {
            iod[i] = (tv__io_dev){.fd = -1, .excluded = true};
            if (first_bad == UINT32_MAX)
                first_bad = i;
            continue;
        }
        iod[i] = (tv__io_dev){.fd = m->devs[i]->fd,
                              .io_align = m->devs[i]->io_align,
                              .size_bytes = m->devs[i]->size_bytes,
                              .direct = m->devs[i]->direct};
        if (m->devs[i]->io_align > m->max_io_align)
            m->max_io_align = m->devs[i]->io_align;
    }
    if ((rc = check_shards(m, first_bad, err)))
        goto out;
    m->queue_depth = o->queue_depth ? o->queue_depth : TV__IO_DEFAULT_QD;
    tv__io_opts io = {.engine = o->engine,
                      .queue_depth = o->queue_depth,
                      .chunk_len = o->chunk_len,
                      .n_threads = o->n_threads,
                      .copy_threads = o->copy_threads};
    if ((rc = tv__io_create(iod, nd, &io, &m->io, err)))
        goto out;
    m->chunk_len = tv__io_chunk_len(m->io);
out:
    free(iod);
    return rc;
}

/* Validates every shard and replica once and builds their plans. */
static int build_plans(store_model *m, tv_error *err)
{
    int rc;
    const tv__snap *snap = &m->m.snap;
    if (!(m->sh = calloc(snap->n_shards ? snap->n_shards : 1, sizeof(*m->sh))))
        return tv__seterr(err, -ENOMEM, "out of memory");
    for (uint32_t s = 0; s < snap->n_shards; s++) {
        tv__snap_shard_info sh;
        if ((rc = tv__snap_shard(snap, s, &sh, err)))
            return rc;
        if (sh.n_replicas == 0 || sh.n_replicas > TV__IO_MAX_REPLICAS)
            return tv__seterr(err, TV_E_SNAPSHOT, "shard %u: %u replicas", s, sh.n_replicas);
        for (uint32_t r = 0; r < sh.n_replicas; r++) {
            tv__snap_replica_info rp;
            if ((rc = tv__snap_replica(snap, sh.first_replica + r, &rp, err)))
                return rc;
            if (tv__add_u64(rp.base_off, sh.data_off, &m->sh[s].payload_base[r]))
                return tv__seterr(err, TV_E_SNAPSHOT, "shard %u: replica offset overflows", s);
            m->sh[s].obj_base[r] = rp.base_off;
            m->sh[s].dev[r] = rp.device;
        }
        m->sh[s].n_rep = sh.n_replicas;
        m->sh[s].name = sh.name;
        m->sh[s].name_len = sh.name_len;
    }
    return 0;
}

static int finish_open(store_model *m, const tv_open_opts *opts, tv_error *err)
{
    int rc;
    tv_open_opts dflt = {0};
    if (!opts)
        opts = &dflt;
    if ((rc = tv__snap_open(m->snap_buf, m->snap_len, TV__SNAP_VERIFY_CHECKSUM, &m->m.snap, err)))
        return rc;
    if ((rc = tv__model_init(&m->m, err)) || (rc = build_plans(m, err)) ||
        (rc = open_devices(m, opts, err)))
        return rc;
    /* tv_get_tensor reads the aligned envelope straight into its arena. */
    m->m.arena_align = m->max_io_align ? m->max_io_align : TV__DEV_MIN_ALIGN;
    m->m.arena_envelope = true;
    return 0;
}

static store_model *store_new(tv_error *err)
{
    store_model *m = calloc(1, sizeof(*m));
    if (!m) {
        tv__seterr(err, -ENOMEM, "out of memory");
        return NULL;
    }
    m->m.ops = &store_ops;
    m->lease_fd = -1;
    return m;
}

TV_API int tv_model_open_snapshot(const void *buf, size_t len, const tv_open_opts *opts,
                                  tv_model **out, tv_error *err)
{
    int rc;
    if (!buf || !out)
        return tv__seterr(err, TV_E_INVALID_ARG, "NULL argument");
    *out = NULL;
    if (opts && (rc = tv__model_check_opts(opts, err)))
        return rc;
    store_model *m = store_new(err);
    if (!m)
        return -ENOMEM;
    if (!(m->snap_buf = malloc(len ? len : 1))) {
        free(m);
        return tv__seterr(err, -ENOMEM, "out of memory");
    }
    memcpy(m->snap_buf, buf, len);
    m->snap_len = len;
    if ((rc = finish_open(m, opts, err))) {
        tv_model_close(&m->m);
        return rc;
    }
    *out = &m->m;
    return 0;
}

/* The snapshot a store reader opened must be the one it asked for: its
 * header names the model and generation, so a file copied or renamed to
 * another model's or generation's path is refused before anything in it is
 * followed. A header that does not even open is left to finish_open. */
static int check_identity(const char *store_dir, const char *name, int64_t gen, const void *buf,
                          size_t len, tv_error *err)
{
    tv__snap s;
    const char *nm;
    size_t nl;
    char path[TV__SNAPFILE_PATH_MAX];
    if (tv__snap_open(buf, len, 0, &s, NULL) || tv__snap_model(&s, &nm, &nl, NULL))
        return 0;
    if (s.generation == gen && nl == strlen(name) && memcmp(nm, name, nl) == 0)
        return 0;
    if (tv__snapfile_path(store_dir, name, gen, path, sizeof path, NULL))
        snprintf(path, sizeof path, "(path too long)");
    return tv__seterr(err, TV_E_SNAPSHOT_IDENTITY,
                      "%s holds model '%.*s' generation %lld, not model '%s' generation %lld", path,
                      nl > 256 ? 256 : (int)nl, nm, (long long)s.generation, name, (long long)gen);
}

/* spec as NAME (into name, name_cap bytes), the generation (0: the active
 * one) and the alias (NULL: none; inside spec). */
static int parse_spec(const char *spec, char *name, size_t name_cap, int64_t *gen,
                      const char **alias, tv_error *err)
{
    const char *at = strrchr(spec, '@');
    size_t nl = at ? (size_t)(at - spec) : strlen(spec);
    *gen = 0;
    *alias = NULL;
    if (nl == 0 || nl >= name_cap)
        return tv__seterr(err, TV_E_INVALID_ARG,
                          "bad model spec '%s' (NAME, NAME@GEN or NAME@ALIAS)", spec);
    memcpy(name, spec, nl);
    name[nl] = '\0';
    /* gen 0: tv__snapfile_open resolves the active pointer and retries if
     * an activation or gc races with it. "NAME@active" is "NAME"; any other
     * word is an alias (alias names never start with a digit). */
    if (!at || !strcmp(at + 1, "active"))
        return 0;
    if (!(at[1] >= '0' && at[1] <= '9')) {
        if (!tv__snapfile_alias_valid(at + 1))
            return tv__seterr(
                err, TV_E_INVALID_ARG,
                "bad alias in '%s' (an alias is [A-Za-z][A-Za-z0-9._-]*, at most 64 bytes)", spec);
        *alias = at + 1;
        return 0;
    }
    /* Digits only, no leading zero (the CLI's rule): strtoll alone would
     * take " 1", "+1", "01" and saturate. */
    char *end = NULL;
    long long g = 0;
    errno = 0;
    if (at[1] >= '1' && at[1] <= '9')
        g = strtoll(at + 1, &end, 10);
    if (!end || *end || errno || g <= 0)
        return tv__seterr(err, TV_E_INVALID_ARG, "bad generation in '%s'", spec);
    *gen = g;
    return 0;
}

/* rc, the failure to open a model's snapshot in store_dir; when store_dir
 * is no store at all (no such directory, not a directory, or neither
 * registry.db nor snapshots/ in it), err says that instead and rc is
 * TV_E_NOT_FOUND, so that a mistyped store is not reported as a missing
 * model. */
static int not_a_store(const char *store_dir, int rc, tv_error *err)
{
    char p[4096];
    struct stat sb;
    if (rc != TV_E_NOT_FOUND && rc != TV_E_SNAPSHOT) /* SNAPSHOT: e.g. a file, not a directory */
        return rc;
    if (stat(store_dir, &sb) < 0)
        return tv__seterr(err, TV_E_NOT_FOUND, "%s is not a tensorvault store (%s)", store_dir,
                          errno == ENOENT ? "no such directory" : strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return tv__seterr(err, TV_E_NOT_FOUND, "%s is not a tensorvault store (not a directory)",
                          store_dir);
    if (rc != TV_E_NOT_FOUND)
        return rc;
    if (snprintf(p, sizeof p, "%s/registry.db", store_dir) >= (int)sizeof p || stat(p, &sb) == 0)
        return rc;
    if (snprintf(p, sizeof p, "%s/snapshots", store_dir) >= (int)sizeof p || stat(p, &sb) == 0)
        return rc;
    return tv__seterr(
        err, TV_E_NOT_FOUND,
        "%s is not a tensorvault store (no registry.db; run 'tensorvault store init')", store_dir);
}

TV_API int tv_model_open(const char *store_dir, const char *spec, const tv_open_opts *opts,
                         tv_model **out, tv_error *err)
{
    int rc;
    char name[512];
    int64_t gen = 0, opened = 0;
    const char *alias = NULL;
    void *buf = NULL;
    size_t len = 0;
    if (!store_dir || !spec || !out)
        return tv__seterr(err, TV_E_INVALID_ARG, "NULL argument");
    *out = NULL;
    if ((opts && (rc = tv__model_check_opts(opts, err))) ||
        (rc = parse_spec(spec, name, sizeof name, &gen, &alias, err)))
        return rc;
    store_model *m = store_new(err);
    if (!m)
        return -ENOMEM;
    if (alias)
        rc =
            tv__snapfile_open_alias(store_dir, name, alias, &opened, &m->lease_fd, &buf, &len, err);
    else
        rc = tv__snapfile_open_gen(store_dir, name, gen, &opened, &m->lease_fd, &buf, &len, err);
    if (rc) {
        rc = not_a_store(store_dir, rc, err);
        goto fail;
    }
    m->snap_buf = buf; /* mapped read-only: never written */
    m->snap_len = len;
    m->snap_mapped = true;
    if ((rc = check_identity(store_dir, name, opened, buf, len, err)) ||
        (rc = finish_open(m, opts, err)))
        goto fail;
    *out = &m->m;
    return 0;
fail:
    tv_model_close(&m->m);
    return rc;
}

/* ---- reads ------------------------------------------------------------------------ */

/* TV_E_NO_REPLICA when no valid device holds r's shard (nothing is read). */
static int store_check(const tv_model *bm, const tv__mreq *r, tv_error *err)
{
    const store_model *m = store_of(bm);
    bool header = r->flags & TV__MREQ_SHARD_HEADER;
    uint32_t s = header ? r->index : r->t->shard;
    const shard_plan *sp = &m->sh[s];
    char why[400];
    if (sp->n_ok)
        return 0;
    replica_reasons(m, sp, why, sizeof(why));
    if (header)
        return tv__seterr(err, TV_E_NO_REPLICA, "%s: shard %u (%.*s) has no valid replica: %s",
                          m->m.name, s, NAME_PREC(sp->name_len), sp->name, why);
    return tv__seterr(
        err, TV_E_NO_REPLICA, "tensor '%.*s': shard %u (%.*s) has no valid replica: %s",
        NAME_PREC(r->t->name_len), r->t->name, s, NAME_PREC(sp->name_len), sp->name, why);
}

/* The engine request of r: its bytes on every valid replica (a header from
 * the object's start, a tensor's from its payload). skip receives where
 * the payload starts for an envelope read. */
static int fill(const store_model *m, tv__mreq *r, tv__io_req *req, tv_error *err)
{
    bool header = r->flags & TV__MREQ_SHARD_HEADER;
    int rc = store_check(&m->m, r, err);
    if (rc)
        return rc;
    const shard_plan *sp = &m->sh[header ? r->index : r->t->shard];
    memset(req, 0, sizeof(*req));
    req->len = r->len;
    req->dest = r->dest;
    if (r->flags & TV__MREQ_ENVELOPE) {
        req->envelope_into_dest = true;
        req->payload_skip = &r->skip;
    }
    for (uint32_t k = 0; k < sp->n_rep; k++) {
        uint64_t off;
        if (m->dst[sp->dev[k]].reason)
            continue; /* excluded: never part of a plan */
        if (header)
            off = sp->obj_base[k] + r->off; /* inside the header: checked by the common layer */
        else if (tv__add_u64(sp->payload_base[k], r->t->begin, &off) ||
                 tv__add_u64(off, r->off, &off))
            return tv__seterr(err, TV_E_OVERFLOW, "tensor '%.*s': offset overflows",
                              NAME_PREC(r->t->name_len), r->t->name);
        req->src[req->n_src++] = (tv__io_src){.dev = sp->dev[k], .off = off};
    }
    return 0;
}

/* One request; an error whose message does not name what it reads gets
 * that in front ("tensor 'NAME': ", "MODEL@GEN: shard S (FILE) header: "). */
static int store_read_one(tv_model *bm, tv__mreq *r, tv_error *err)
{
    store_model *m = store_of(bm);
    bool header = r->flags & TV__MREQ_SHARD_HEADER;
    char label[400], needle[300];
    tv__io_req req;
    int rc = fill(m, r, &req, err);
    if (rc)
        return rc;
    if (header) {
        const shard_plan *sp = &m->sh[r->index];
        snprintf(label, sizeof(label), "%s@%lld: shard %u (%.*s) header", m->m.name,
                 (long long)m->m.snap.generation, r->index, NAME_PREC(sp->name_len), sp->name);
        snprintf(needle, sizeof(needle), "header");
    } else {
        snprintf(needle, sizeof(needle), "%.*s", NAME_PREC(r->t->name_len), r->t->name);
        snprintf(label, sizeof(label), "tensor '%s'", needle);
    }
    rc = tv__io_run(m->io, &req, 1, NULL, err);
    if (rc == 0 && req.result)
        rc = req.result;
    r->result = rc;
    if (rc && err && !strstr(err->msg, needle)) {
        char msg[sizeof(err->msg) + sizeof(label)];
        snprintf(msg, sizeof(msg), "%.300s: %s", label, err->msg);
        memcpy(err->msg, msg, sizeof(err->msg) - 1);
        err->msg[sizeof(err->msg) - 1] = '\0';
    }
    return rc;
}

/* n requests in one engine run: adjacent ones are coalesced there. */
static int store_read(tv_model *bm, tv__mreq *r, size_t n, const tv__io_sink *sink, tv_error *err)
{
    store_model *m = store_of(bm);
    tv__io_req *io = calloc(n, sizeof(*io));
    size_t *map = calloc(n, sizeof(*map));
    tv__batch_err first = {0};
    tv_error e = {0};
    size_t k = 0;
    if (!io || !map) {
        free(io);
        free(map);
        return tv__seterr(err, -ENOMEM, "out of memory");
    }
    for (size_t j = 0; j < n; j++)
        if ((r[j].result = tv__batch_note(&first, fill(m, &r[j], &io[k], &e), &e)) == 0)
            map[k++] = j;
    int rc = tv__io_run(m->io, io, k, sink, err);
    for (size_t q = 0; q < k; q++)
        r[map[q]].result = io[q].result;
    free(io);
    free(map);
    return rc ? rc : tv__batch_answer(&first, err);
}

/* One fence per staging slot (the engine's slots are < queue_depth), and
 * the pinned staging ring, allocated on the first CUDA read. */
static int store_cuda_sink(tv_model *bm, void *stream, tv__cuda_sink **out, tv_error *err)
{
    store_model *m = store_of(bm);
    int rc = tv__cuda_sink_create(stream, m->queue_depth, out, err);
    if (rc)
        return rc;
    if (!m->pinned) {
        size_t len = (size_t)m->queue_depth * m->chunk_len;
        tv_error pe = {0};
        if (tv__cuda_host_alloc(len, &m->pinned, &pe) == 0)
            m->pinned_len = len;
        else
            tv__log(TV_LOG_WARN, "pinned staging unavailable (%s): pageable copies", pe.msg);
    }
    tv__cuda_sink_set_staging(*out, m->pinned, m->pinned_len);
    return 0;
}

static size_t store_n_devices(const tv_model *bm, bool excluded)
{
    const store_model *m = store_of(bm);
    return excluded ? m->n_excluded : m->n_devs;
}

static int store_device(const tv_model *bm, size_t i, tv_device_status *out)
{
    const store_model *m = store_of(bm);
    if (i >= m->n_devs)
        return TV_E_INVALID_ARG;
    const dev_state *ds = &m->dst[i];
    out->path = ds->path ? ds->path : "";
    out->excluded = ds->reason != 0;
    out->reason = ds->reason;
    out->message = ds->reason ? ds->why : "";
    return 0;
}

static const tv__model_ops store_ops = {
    .check = store_check,
    .read_one = store_read_one,
    .read = store_read,
    .cuda_sink = store_cuda_sink,
    .n_devices = store_n_devices,
    .device = store_device,
    .close = store_close,
};

/* ---- serve.h: what the fast-path server needs of an open model ---------- */

const tv__snap *tv__model_snap(const tv_model *m)
{
    return m ? &m->snap : NULL;
}

int tv__model_snap_image(const tv_model *m, const void **buf, size_t *len)
{
    if (!m || !buf || !len)
        return TV_E_INVALID_ARG;
    /* the view tv__snap_open validated: exactly the bytes the checksum covers */
    *buf = m->snap.base;
    *len = m->snap.len;
    return 0;
}

int tv__model_dev_info(const tv_model *bm, uint32_t i, tv__model_dev *out)
{
    if (!bm || !out || bm->ops != &store_ops || i >= store_of(bm)->n_devs)
        return TV_E_INVALID_ARG;
    const store_model *m = store_of(bm);
    const tv__dev *d = m->devs[i];
    if (!d || m->dst[i].reason) {
        *out = (tv__model_dev){.fd = -1,
                               .reason = m->dst[i].reason ? m->dst[i].reason : TV_E_INTERNAL};
        return 0;
    }
    *out = (tv__model_dev){.fd = d->fd,
                           .io_align = d->io_align,
                           .size_bytes = d->size_bytes,
                           .direct = d->direct,
                           .reason = 0};
    return 0;
}
