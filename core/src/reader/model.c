/* tv_model: one opened generation (snapshot + validated devices + read
 * engine) and the public read API of tensorvault.h on top of it.
 *
 * Invariants: the options are bounded before anything is opened; a model
 * handle holds its snapshot file's shared flock for its whole life (the
 * reader lease); every device is opened read-only and its size and label
 * checked against the snapshot's device record before the engine is
 * created; a device that fails is excluded: closed at once, marked
 * excluded in the engine and left out of every request, so no read is ever
 * issued to it; every tensor record is validated once at open (so reads
 * follow only checked offsets) and requests are built from those checked
 * values, with the valid replicas only. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dev/dev.h"
#include "io/engine.h"
#include "reader/desc.h"
#include "reader/serve.h"
#include "snap/snapfile.h"
#include "snap/snapshot.h"
#include "util/sys.h"
#include "tensorvault/tensorvault.h"
#include "xfer/xfer.h"

/* A tensor's record (desc.h), decoded and validated on first use (not at
 * open, so opening a generation costs the same for 100 or 120,000
 * tensors): `ready` is set (release) after the fields are written, under
 * the model's plan lock; readers check it (acquire) first, so concurrent
 * metadata calls on one handle are safe. */
typedef struct tensor_plan {
    tv__tdesc d;
    _Atomic bool ready;
} tensor_plan;

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

#define NAME_PREC TV__NAME_PREC

/* One device of the snapshot as validated at open. */
typedef struct dev_state {
    char *path;
    int reason; /* 0: usable; else why it is excluded */
    char why[sizeof(((tv_error *)0)->msg)];
} dev_state;

_Static_assert(TV_READ_MAX_QUEUE_DEPTH == TV__IO_MAX_QD, "queue depth limits agree");
_Static_assert(TV_READ_MAX_CHUNK == TV__IO_MAX_CHUNK, "chunk limits agree");
_Static_assert(TV_READ_MAX_STAGING == TV__IO_MAX_STAGING, "staging limits agree");
_Static_assert(TV_READ_DEFAULT_QUEUE_DEPTH == TV__IO_DEFAULT_QD, "default queue depths agree");
_Static_assert(TV_READ_DEFAULT_CHUNK == TV__IO_DEFAULT_CHUNK, "default chunks agree");
_Static_assert(TV_READ_MAX_COPY_THREADS == TV__IO_MAX_COPY_THREADS, "copy thread limits agree");
_Static_assert(TV_READ_DEFAULT_COPY_THREADS == TV__IO_DEFAULT_COPY_THREADS,
               "default copy threads agree");

struct tv_model {
    uint8_t *snap_buf; /* malloc'd copy, or the mapped file when snap_mapped */
    size_t snap_len;
    bool snap_mapped;
    tv__snap snap;
    int lease_fd;
    char *name;
    tv__dev **devs; /* NULL for an excluded device */
    dev_state *dst;
    size_t n_devs, n_excluded;
    tv__io *io;
    tensor_plan *t; /* n_tensors, each decoded on first use (ensure_plan) */
    pthread_mutex_t plan_mu;
    bool plan_mu_ok;
    bool any_owned_shape; /* some plan has an owned_shape to free */
    shard_plan *sh;
    uint32_t max_io_align;
    uint32_t queue_depth;
    size_t chunk_len;
    void *pinned; /* CUDA staging (cudaHostAlloc), allocated on first use */
    size_t pinned_len;
};

TV_API void tv_model_close(tv_model *m)
{
    if (!m)
        return;
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
    for (uint32_t i = 0; m->any_owned_shape && i < m->snap.n_tensors; i++)
        tv__tdesc_free(&m->t[i].d);
    free(m->t);
    if (m->plan_mu_ok)
        pthread_mutex_destroy(&m->plan_mu);
    free(m->sh);
    free(m->name);
    if (m->snap_mapped)
        tv__snapfile_unmap(m->snap_buf, m->snap_len);
    else
        free(m->snap_buf);
    if (m->lease_fd >= 0)
        tv__sys.close(m->lease_fd);
    free(m);
}

/* The option checks that need no device: engine, queue depth and chunk
 * bounds, and the staging cap with chunk_len rounded up to 4096 (every
 * io_align is a multiple of it); open_devices checks the cap again with the
 * devices' io_align. Runs before anything is opened or allocated. */
static int check_opts(const tv_open_opts *o, tv_error *err)
{
    uint64_t chunk, total;
    uint32_t qd = o->queue_depth ? o->queue_depth : TV_READ_DEFAULT_QUEUE_DEPTH;
    if (o->engine != TV_ENGINE_AUTO && o->engine != TV_ENGINE_URING && o->engine != TV_ENGINE_PREAD)
        return tv__seterr(err, TV_E_INVALID_ARG, "read options: unknown engine %d", o->engine);
    if (qd > TV_READ_MAX_QUEUE_DEPTH)
        return tv__seterr(err, TV_E_INVALID_ARG,
                          "read options: queue depth %u is over the maximum %u", qd,
                          TV_READ_MAX_QUEUE_DEPTH);
    if (o->copy_threads > TV_READ_MAX_COPY_THREADS)
        return tv__seterr(err, TV_E_INVALID_ARG,
                          "read options: copy_threads %u is over the maximum %u", o->copy_threads,
                          TV_READ_MAX_COPY_THREADS);
    if (o->chunk_len == 0)
        return 0; /* the default fits any queue depth (the engine lowers it) */
    if ((uint64_t)o->chunk_len > TV_READ_MAX_CHUNK ||
        tv__align_up_u64(o->chunk_len, TV__DEV_MIN_ALIGN, &chunk) || chunk > TV_READ_MAX_CHUNK)
        return tv__seterr(err, TV_E_INVALID_ARG,
                          "read options: chunk_len %zu is over the maximum %llu bytes",
                          o->chunk_len, (unsigned long long)TV_READ_MAX_CHUNK);
    if (tv__mul_u64(chunk, qd, &total) || total > TV_READ_MAX_STAGING)
        return tv__seterr(err, TV_E_INVALID_ARG,
                          "read options: staging: queue depth %u x chunk_len %llu over %llu bytes",
                          qd, (unsigned long long)chunk, (unsigned long long)TV_READ_MAX_STAGING);
    return 0;
}

/* Marks device i excluded for reason code with message msg (copied first:
 * msg may be the caller's error buffer) and closes it. */
static void exclude(tv_model *m, uint32_t i, int code, const char *msg)
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
    tv__log(TV_LOG_WARN, "model %s@%lld: device excluded, never read: %s: %s", m->name,
            (long long)m->snap.generation, tv_err_name(code), why);
}

/* Opens device i of the snapshot and validates it: size first (no read
 * for a resized image), then label and identity. Returns 0 (usable or
 * excluded) or an error that fails the whole open (-ENOMEM, a malformed
 * snapshot record). */
static int open_device(tv_model *m, uint32_t i, const tv_open_opts *o, tv_error *err)
{
    tv__snap_device_info sd;
    tv__label on_disk, want;
    tv_error e = {0};
    int rc;
    if ((rc = tv__snap_device(&m->snap, i, &sd, err)))
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
static void replica_reasons(const tv_model *m, const shard_plan *sp, char *out, size_t len)
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

static int open_devices(tv_model *m, const tv_open_opts *o, tv_error *err)
{
    int rc = 0;
    size_t nd = m->snap.n_devices;
    uint32_t n_readable = 0, first_bad = UINT32_MAX;
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
    for (uint32_t s = 0; s < m->snap.n_shards; s++) {
        shard_plan *sp = &m->sh[s];
        sp->n_ok = 0;
        for (uint32_t r = 0; r < sp->n_rep; r++)
            if (sp->dev[r] >= nd) {
                rc = tv__seterr(err, TV_E_SNAPSHOT, "shard %u: replica on device %u of %zu", s,
                                sp->dev[r], nd);
                goto out;
            } else if (!m->dst[sp->dev[r]].reason) {
                sp->n_ok++;
            }
        if (sp->n_ok)
            n_readable++;
    }
    if (first_bad != UINT32_MAX && n_readable == 0 && m->snap.n_shards) {
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
        rc = tv__seterr(err, m->dst[first_bad].reason, "%s@%lld: no shard has a valid replica: %s",
                        m->name, (long long)m->snap.generation, why);
        goto out;
    }
    for (uint32_t s = 0; s < m->snap.n_shards; s++) {
        const shard_plan *sp = &m->sh[s];
        char why[400];
        if (sp->n_ok)
            continue;
        replica_reasons(m, sp, why, sizeof(why));
        tv__log(TV_LOG_WARN, "model %s@%lld: shard %u (%.*s) has no valid replica: %s", m->name,
                (long long)m->snap.generation, s, NAME_PREC(sp->name_len), sp->name, why);
    }
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

/* Validates every shard and replica once and builds their plans; tensor
 * records are decoded on first use (ensure_plan). The plan array is
 * zeroed memory: a large one is untouched (no page faults) until used. */
static int build_plans(tv_model *m, tv_error *err)
{
    int rc;
    uint32_t n = m->snap.n_tensors;
    m->t = calloc(n ? n : 1, sizeof(*m->t));
    m->sh = calloc(m->snap.n_shards ? m->snap.n_shards : 1, sizeof(*m->sh));
    if (!m->t || !m->sh)
        return tv__seterr(err, -ENOMEM, "out of memory");
    if ((rc = pthread_mutex_init(&m->plan_mu, NULL)))
        return tv__seterr(err, -rc, "plan lock: %s", strerror(rc));
    m->plan_mu_ok = true;
    for (uint32_t s = 0; s < m->snap.n_shards; s++) {
        tv__snap_shard_info sh;
        if ((rc = tv__snap_shard(&m->snap, s, &sh, err)))
            return rc;
        if (sh.n_replicas == 0 || sh.n_replicas > TV__IO_MAX_REPLICAS)
            return tv__seterr(err, TV_E_SNAPSHOT, "shard %u: %u replicas", s, sh.n_replicas);
        for (uint32_t r = 0; r < sh.n_replicas; r++) {
            tv__snap_replica_info rp;
            if ((rc = tv__snap_replica(&m->snap, sh.first_replica + r, &rp, err)))
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

/* The plan of tensor i, decoded on first use. Returns 0,
 * TV_E_INVALID_ARG (i out of range) or the record's TV_E_SNAPSHOT. */
static int ensure_plan(const tv_model *m, size_t i, tv_error *err)
{
    int rc = 0;
    if (i >= m->snap.n_tensors)
        return tv__seterr(err, TV_E_INVALID_ARG, "tensor index %zu out of range (%u tensors)", i,
                          m->snap.n_tensors);
    /* The handle owns its plans: decoding one is not a visible change. */
    tensor_plan *p = (tensor_plan *)&m->t[i];
    if (atomic_load_explicit(&p->ready, memory_order_acquire))
        return 0;
    pthread_mutex_t *mu = (pthread_mutex_t *)&m->plan_mu;
    pthread_mutex_lock(mu);
    if (!atomic_load_explicit(&p->ready, memory_order_relaxed) &&
        (rc = tv__tdesc_decode(&m->snap, (uint32_t)i, &p->d, err)) == 0) {
        if (p->d.owned_shape)
            ((tv_model *)m)->any_owned_shape = true;
        atomic_store_explicit(&p->ready, true, memory_order_release);
    }
    pthread_mutex_unlock(mu);
    return rc;
}

static int finish_open(tv_model *m, const tv_open_opts *opts, tv_error *err)
{
    int rc;
    tv_open_opts dflt = {0};
    if (!opts)
        opts = &dflt;
    if ((rc = tv__snap_open(m->snap_buf, m->snap_len, TV__SNAP_VERIFY_CHECKSUM, &m->snap, err)))
        return rc;
    const char *nm;
    size_t nl;
    if ((rc = tv__snap_model(&m->snap, &nm, &nl, err)))
        return rc;
    if (!(m->name = strndup(nm, nl)))
        return tv__seterr(err, -ENOMEM, "out of memory");
    if ((rc = build_plans(m, err)))
        return rc;
    return open_devices(m, opts, err);
}

TV_API int tv_model_open_snapshot(const void *buf, size_t len, const tv_open_opts *opts,
                                  tv_model **out, tv_error *err)
{
    int rc;
    if (!buf || !out)
        return tv__seterr(err, TV_E_INVALID_ARG, "NULL argument");
    *out = NULL;
    if (opts && (rc = check_opts(opts, err)))
        return rc;
    tv_model *m = calloc(1, sizeof(*m));
    if (!m)
        return tv__seterr(err, -ENOMEM, "out of memory");
    m->lease_fd = -1;
    if (!(m->snap_buf = malloc(len ? len : 1))) {
        free(m);
        return tv__seterr(err, -ENOMEM, "out of memory");
    }
    memcpy(m->snap_buf, buf, len);
    m->snap_len = len;
    if ((rc = finish_open(m, opts, err))) {
        tv_model_close(m);
        return rc;
    }
    *out = m;
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

TV_API int tv_model_open(const char *store_dir, const char *spec, const tv_open_opts *opts,
                         tv_model **out, tv_error *err)
{
    int rc;
    if (!store_dir || !spec || !out)
        return tv__seterr(err, TV_E_INVALID_ARG, "NULL argument");
    *out = NULL;
    if (opts && (rc = check_opts(opts, err)))
        return rc;
    char name[512];
    int64_t gen = 0;
    const char *at = strrchr(spec, '@'), *alias = NULL;
    size_t nl = at ? (size_t)(at - spec) : strlen(spec);
    if (nl == 0 || nl >= sizeof(name))
        return tv__seterr(err, TV_E_INVALID_ARG,
                          "bad model spec '%s' (NAME, NAME@GEN or NAME@ALIAS)", spec);
    memcpy(name, spec, nl);
    name[nl] = '\0';
    /* gen 0: tv__snapfile_open resolves the active pointer and retries if
     * an activation or gc races with it. "NAME@active" is "NAME"; any other
     * word is an alias (alias names never start with a digit). */
    if (at && !strcmp(at + 1, "active")) {
        at = NULL;
    } else if (at && !(at[1] >= '0' && at[1] <= '9')) {
        alias = at + 1;
        if (!tv__snapfile_alias_valid(alias))
            return tv__seterr(
                err, TV_E_INVALID_ARG,
                "bad alias in '%s' (an alias is [A-Za-z][A-Za-z0-9._-]*, at most 64 bytes)", spec);
        at = NULL;
    }
    if (at) {
        /* Digits only, no leading zero (the CLI's rule): strtoll alone
         * would take " 1", "+1", "01" and saturate. */
        char *end = NULL;
        long long g = 0;
        errno = 0;
        if (at[1] >= '1' && at[1] <= '9')
            g = strtoll(at + 1, &end, 10);
        if (!end || *end || errno || g <= 0)
            return tv__seterr(err, TV_E_INVALID_ARG, "bad generation in '%s'", spec);
        gen = g;
    }
    tv_model *m = calloc(1, sizeof(*m));
    if (!m)
        return tv__seterr(err, -ENOMEM, "out of memory");
    m->lease_fd = -1;
    void *buf = NULL;
    size_t len = 0;
    int64_t opened = 0;
    if (alias)
        rc =
            tv__snapfile_open_alias(store_dir, name, alias, &opened, &m->lease_fd, &buf, &len, err);
    else
        rc = tv__snapfile_open_gen(store_dir, name, gen, &opened, &m->lease_fd, &buf, &len, err);
    if (rc) {
        tv_model_close(m);
        return rc;
    }
    m->snap_buf = buf; /* mapped read-only: never written */
    m->snap_len = len;
    m->snap_mapped = true;
    if ((rc = check_identity(store_dir, name, opened, buf, len, err))) {
        tv_model_close(m);
        return rc;
    }
    if ((rc = finish_open(m, opts, err))) {
        tv_model_close(m);
        return rc;
    }
    *out = m;
    return 0;
}

TV_API int64_t tv_model_generation(const tv_model *m)
{
    return m ? m->snap.generation : 0;
}

TV_API const char *tv_model_name(const tv_model *m)
{
    return m ? m->name : NULL;
}

TV_API size_t tv_model_n_devices(const tv_model *m)
{
    return m ? m->n_devs : 0;
}

TV_API size_t tv_model_n_excluded_devices(const tv_model *m)
{
    return m ? m->n_excluded : 0;
}

TV_API int tv_model_device(const tv_model *m, size_t i, tv_device_status *out)
{
    if (!m || !out || i >= m->n_devs)
        return TV_E_INVALID_ARG;
    const dev_state *ds = &m->dst[i];
    out->path = ds->path ? ds->path : "";
    out->excluded = ds->reason != 0;
    out->reason = ds->reason;
    out->message = ds->reason ? ds->why : "";
    return 0;
}

TV_API size_t tv_model_n_tensors(const tv_model *m)
{
    return m ? m->snap.n_tensors : 0;
}

TV_API int tv_model_tensor(const tv_model *m, size_t i, tv_tensor_desc *out)
{
    if (!m || !out || i >= m->snap.n_tensors)
        return TV_E_INVALID_ARG;
    int rc = ensure_plan(m, i, NULL);
    tv__tdesc_public(rc ? NULL : &m->t[i].d, out);
    return rc;
}

TV_API int tv_model_find(const tv_model *m, const char *name, size_t name_len, size_t *index)
{
    if (!m || !name)
        return TV_E_NOT_FOUND;
    return tv__tdesc_find(&m->snap, name, name_len, index);
}

static int lookup(const tv_model *m, const char *name, size_t *idx, tv_error *err)
{
    /* Set on every path: the compiler cannot see that tv__seterr never
     * returns 0, and a Release build (-Werror=maybe-uninitialized) fails. */
    *idx = 0;
    if (!m || !name)
        return tv__seterr(err, TV_E_INVALID_ARG, "NULL argument");
    uint32_t i;
    int rc = tv__tdesc_lookup(&m->snap, m->name, m->snap.generation, name, &i, err);
    if (rc == 0 && (rc = ensure_plan(m, i, err)) == 0)
        *idx = i;
    return rc;
}

/* Fills req with the replicas of tensor i for the byte range
 * [begin + rel_off, begin + rel_off + len) of the tensor. */
static int fill_req(tv_model *m, size_t i, uint64_t rel_off, uint64_t len, void *dest,
                    tv__io_req *req, tv_error *err)
{
    const tv__tdesc *p = &m->t[i].d;
    const shard_plan *sp = &m->sh[p->shard];
    memset(req, 0, sizeof(*req));
    req->len = len;
    req->dest = dest;
    if (!sp->n_ok) {
        char why[400];
        replica_reasons(m, sp, why, sizeof(why));
        return tv__seterr(
            err, TV_E_NO_REPLICA, "tensor '%.*s': shard %u (%.*s) has no valid replica: %s",
            NAME_PREC(p->name_len), p->name, p->shard, NAME_PREC(sp->name_len), sp->name, why);
    }
    for (uint32_t r = 0; r < sp->n_rep; r++) {
        uint64_t off;
        if (m->dst[sp->dev[r]].reason)
            continue; /* excluded: never part of a plan */
        if (tv__add_u64(sp->payload_base[r], p->begin, &off) || tv__add_u64(off, rel_off, &off))
            return tv__seterr(err, TV_E_OVERFLOW, "tensor '%.*s': offset overflows",
                              NAME_PREC(p->name_len), p->name);
        req->src[req->n_src++] = (tv__io_src){.dev = sp->dev[r], .off = off};
    }
    return 0;
}

/* Runs one request; an error whose message lacks `needle` gets `label: `
 * in front (copied first: never built from its own buffer). */
static int run_labeled(tv_model *m, tv__io_req *req, const tv__io_sink *sink, const char *needle,
                       const char *label, tv_error *err)
{
    int rc = tv__io_run(m->io, req, 1, sink, err);
    if (rc == 0 && req->result)
        rc = req->result;
    if (rc && err && !strstr(err->msg, needle)) {
        char msg[sizeof(err->msg) + 400];
        snprintf(msg, sizeof(msg), "%.300s: %s", label, err->msg);
        memcpy(err->msg, msg, sizeof(err->msg) - 1);
        err->msg[sizeof(err->msg) - 1] = '\0';
    }
    return rc;
}

static int run_one(tv_model *m, tv__io_req *req, const tv__io_sink *sink, const char *name,
                   tv_error *err)
{
    char label[300];
    snprintf(label, sizeof(label), "tensor '%.256s'", name);
    return run_labeled(m, req, sink, name, label, err);
}

TV_API size_t tv_model_n_shards(const tv_model *m)
{
    return m ? m->snap.n_shards : 0;
}

TV_API int tv_model_shard(const tv_model *m, size_t i, tv_shard_desc *out)
{
    if (!out)
        return TV_E_INVALID_ARG;
    if (!m) {
        *out = (tv_shard_desc){.name = ""};
        return TV_E_INVALID_ARG;
    }
    return tv__shard_public(&m->snap, i, out);
}

TV_API int tv_read_shard_header(tv_model *m, size_t shard, void *dest, size_t dest_len,
                                tv_error *err)
{
    uint64_t len;
    int rc;
    if (!m)
        return tv__seterr(err, TV_E_INVALID_ARG, "NULL argument");
    rc = tv__shard_check_header(&m->snap, m->name, m->snap.generation, shard, dest, dest_len, &len,
                                err);
    if (rc)
        return rc;
    const shard_plan *sp = &m->sh[shard];
    char label[400];
    snprintf(label, sizeof(label), "%s@%lld: shard %zu (%.*s) header", m->name,
             (long long)m->snap.generation, shard, NAME_PREC(sp->name_len), sp->name);
    if (!sp->n_ok) {
        char why[400];
        replica_reasons(m, sp, why, sizeof(why));
        return tv__seterr(err, TV_E_NO_REPLICA, "%s: shard %zu (%.*s) has no valid replica: %s",
                          m->name, shard, NAME_PREC(sp->name_len), sp->name, why);
    }
    tv__io_req req;
    memset(&req, 0, sizeof(req));
    req.len = len;
    req.dest = dest;
    for (uint32_t r = 0; r < sp->n_rep; r++)
        if (!m->dst[sp->dev[r]].reason)
            req.src[req.n_src++] = (tv__io_src){.dev = sp->dev[r], .off = sp->obj_base[r]};
    return run_labeled(m, &req, NULL, "header", label, err);
}

TV_API int tv_read_into(tv_model *m, const char *name, void *dest, size_t dest_len, tv_error *err)
{
    size_t i;
    int rc = lookup(m, name, &i, err);
    if (rc)
        return rc;
    if ((rc = tv__tdesc_check_into(&m->t[i].d, name, dest, dest_len, err)))
        return rc;
    tv__io_req req;
    if ((rc = fill_req(m, i, 0, m->t[i].d.nbytes, dest, &req, err)))
        return rc;
    return run_one(m, &req, NULL, name, err);
}

static int batch(tv_model *m, tv_read_req *reqs, size_t n, const tv__io_sink *sink, tv_error *err)
{
    tv__batch_err first = {0};
    if (!m || (!reqs && n))
        return tv__seterr(err, TV_E_INVALID_ARG, "NULL argument");
    tv__io_req *io = calloc(n ? n : 1, sizeof(*io));
    size_t *map = calloc(n ? n : 1, sizeof(*map));
    if (!io || !map) {
        free(io);
        free(map);
        return tv__seterr(err, -ENOMEM, "out of memory");
    }
    size_t k = 0;
    for (size_t j = 0; j < n; j++) {
        size_t i;
        tv_error e = {0};
        int r = tv__tdesc_batch_index(&m->snap, m->name, m->snap.generation, &reqs[j], j, &i, &e);
        if (!r)
            r = ensure_plan(m, i, &e);
        if (!r) {
            const tv__tdesc *p = &m->t[i].d;
            if (!(r = tv__tdesc_check_batch(p, j, reqs[j].dest, reqs[j].dest_len, &e)))
                r = fill_req(m, i, 0, p->nbytes, reqs[j].dest, &io[k], &e);
        }
        if ((reqs[j].result = tv__batch_note(&first, r, &e)) == 0)
            map[k++] = j;
    }
    tv_error e = {0};
    tv__batch_note(&first, tv__io_run(m->io, io, k, sink, &e), &e);
    for (size_t q = 0; q < k; q++)
        reqs[map[q]].result = io[q].result;
    for (size_t j = 0; j < n && !first.code; j++)
        if (reqs[j].result) {
            tv__seterr(&e, reqs[j].result, "request %zu failed: %s", j,
                       tv_strerror(reqs[j].result));
            tv__batch_note(&first, reqs[j].result, &e);
        }
    free(io);
    free(map);
    return tv__batch_answer(&first, err);
}

TV_API int tv_read_batch(tv_model *m, tv_read_req *reqs, size_t n, tv_error *err)
{
    return batch(m, reqs, n, NULL, err);
}

TV_API int tv_read_range(tv_model *m, const char *name, uint64_t off, uint64_t len, void *dest,
                         size_t dest_len, tv_error *err)
{
    size_t i;
    int rc = lookup(m, name, &i, err);
    if (rc)
        return rc;
    if ((rc = tv__tdesc_check_range(&m->t[i].d, name, off, len, dest, dest_len, err)) || len == 0)
        return rc;
    tv__io_req req;
    if ((rc = fill_req(m, i, off, len, dest, &req, err)))
        return rc;
    return run_one(m, &req, NULL, name, err);
}

TV_API int tv_rows_len(const tv_model *m, const char *name, uint64_t r0, uint64_t r1, uint64_t *len,
                       tv_error *err)
{
    size_t i;
    uint64_t off;
    if (!len)
        return tv__seterr(err, TV_E_INVALID_ARG, "NULL argument");
    *len = 0;
    int rc = lookup(m, name, &i, err);
    return rc ? rc : tv__tdesc_rows(&m->t[i].d, name, r0, r1, &off, len, err);
}

TV_API int tv_read_rows(tv_model *m, const char *name, uint64_t r0, uint64_t r1, void *dest,
                        size_t dest_len, tv_error *err)
{
    size_t i;
    uint64_t off, len;
    int rc = lookup(m, name, &i, err);
    if (rc || (rc = tv__tdesc_rows(&m->t[i].d, name, r0, r1, &off, &len, err)) || r0 == r1)
        return rc;
    if ((rc = tv__tdesc_check_rows_dest(name, r0, r1, len, dest, dest_len, err)))
        return rc;
    tv__io_req req;
    if ((rc = fill_req(m, i, off, len, dest, &req, err)))
        return rc;
    return run_one(m, &req, NULL, name, err);
}

TV_API int tv_read_f32(tv_model *m, const char *name, void *dest, size_t dest_len, tv_error *err)
{
    size_t i;
    int rc = lookup(m, name, &i, err);
    if (rc)
        return rc;
    const tv__tdesc *p = &m->t[i].d;
    uint64_t nbytes = p->nbytes;
    if ((rc = tv__tdesc_check_f32(p, name, dest, dest_len, err)))
        return rc;
    if (p->dtype == TV_DTYPE_F32)
        return tv_read_into(m, name, dest, dest_len, err);
    void *raw = malloc(nbytes ? nbytes : 1);
    if (!raw)
        return tv__seterr(err, -ENOMEM, "out of memory");
    rc = tv_read_into(m, name, raw, nbytes, err);
    if (!rc)
        rc = tv_convert_f32(p->dtype, raw, p->n_elements, dest);
    free(raw);
    return rc;
}

TV_API int tv_get_tensor(tv_model *m, const char *name, tv_tensor **out, tv_error *err)
{
    size_t i;
    int rc;
    if (!out)
        return tv__seterr(err, TV_E_INVALID_ARG, "NULL argument");
    *out = NULL;
    if ((rc = lookup(m, name, &i, err)))
        return rc;
    const tv__tdesc *p = &m->t[i].d;
    uint64_t nbytes = p->nbytes, arena_len;
    uint32_t a = m->max_io_align ? m->max_io_align : 4096;
    /* Headroom for the envelope on either side of the payload. */
    if (tv__add_u64(nbytes, 2ull * a, &arena_len) || tv__align_up_u64(arena_len, a, &arena_len))
        return tv__seterr(err, TV_E_OVERFLOW, "tensor '%s' too large", name);
    tv_tensor *t;
    void *arena;
    if ((rc = tv__tensor_new(arena_len, a, &t, &arena, err)))
        return rc;
    uint64_t skip = 0;
    tv__io_req req;
    if ((rc = fill_req(m, i, 0, nbytes, arena, &req, err)))
        goto fail;
    req.envelope_into_dest = true;
    req.payload_skip = &skip;
    if ((rc = run_one(m, &req, NULL, name, err)))
        goto fail;
    if (skip + nbytes > arena_len) {
        rc = tv__seterr(err, TV_E_INTERNAL, "tensor '%s': envelope larger than the arena", name);
        goto fail;
    }
    tv__tensor_set(t, skip, p);
    *out = t;
    return 0;
fail:
    tv_tensor_free(t);
    return rc;
}

TV_API bool tv_cuda_available(void)
{
    return tv__cuda_available();
}

static int cuda_batch(tv_model *m, tv_read_req *reqs, size_t n, void *stream, tv_error *err)
{
    tv__cuda_sink *cs = NULL;
    if (!m)
        return tv__seterr(err, TV_E_INVALID_ARG, "NULL model");
    /* One fence per staging slot: the engine's slots are < queue_depth. */
    int rc = tv__cuda_sink_create(stream, m->queue_depth, &cs, err);
    if (rc)
        goto fail_all;
    if (!m->pinned) {
        size_t len = (size_t)m->queue_depth * m->chunk_len;
        tv_error pe = {0};
        if (tv__cuda_host_alloc(len, &m->pinned, &pe) == 0)
            m->pinned_len = len;
        else
            tv__log(TV_LOG_WARN, "pinned staging unavailable (%s): pageable copies", pe.msg);
    }
    tv__cuda_sink_set_staging(cs, m->pinned, m->pinned_len);
    for (size_t j = 0; j < n; j++)
        if (reqs[j].dest && (rc = tv__cuda_check_dest(reqs[j].dest, reqs[j].dest_len, err))) {
            tv__cuda_sink_destroy(cs);
            goto fail_all;
        }
    tv__io_sink sink;
    tv__cuda_sink_bind(cs, &sink);
    rc = batch(m, reqs, n, &sink, err);
    tv__cuda_sink_destroy(cs);
    return rc;
fail_all:
    /* Nothing ran: every request carries the reason. */
    for (size_t j = 0; reqs && j < n; j++)
        reqs[j].result = rc;
    return rc;
}

TV_API int tv_read_batch_cuda(tv_model *m, tv_read_req *reqs, size_t n, void *stream, tv_error *err)
{
    return cuda_batch(m, reqs, n, stream, err);
}

TV_API int tv_read_into_cuda(tv_model *m, const char *name, void *dev_ptr, size_t dev_len,
                             void *stream, tv_error *err)
{
    tv_read_req r = {.name = name, .dest = dev_ptr, .dest_len = dev_len};
    return cuda_batch(m, &r, 1, stream, err);
}

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

int tv__model_dev_info(const tv_model *m, uint32_t i, tv__model_dev *out)
{
    if (!m || !out || i >= m->n_devs)
        return TV_E_INVALID_ARG;
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
