/* The read API of tensorvault.h over a tv_model of either backend
 * (reader/model.h): the common layer. Lookups, descriptors, every argument
 * check, the rows and range arithmetic, the float32 conversion, the
 * tv_get_tensor arena, batch validation and results and the CUDA
 * destination checks are done here, once; the backend's operations only
 * move checked requests' bytes (the store: from its devices; the daemon:
 * from tensorvaultd's arena).
 *
 * Invariants: every check of a call comes before its first read, so a
 * refused call writes nothing; a backend's error reaches the caller as the
 * backend returned it (code and message); a batch answers its lowest
 * failed request (a check, then what the backend reported), and every
 * request gets its own result; the record table is decoded on first use
 * under the plan lock (double-checked with acquire/release), so metadata
 * calls are safe from several threads. */
#include "reader/model.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "dev/dev.h"
#include "util/internal.h"

_Static_assert(TV_READ_MAX_QUEUE_DEPTH == TV__IO_MAX_QD, "queue depth limits agree");
_Static_assert(TV_READ_MAX_CHUNK == TV__IO_MAX_CHUNK, "chunk limits agree");
_Static_assert(TV_READ_MAX_STAGING == TV__IO_MAX_STAGING, "staging limits agree");
_Static_assert(TV_READ_DEFAULT_QUEUE_DEPTH == TV__IO_DEFAULT_QD, "default queue depths agree");
_Static_assert(TV_READ_DEFAULT_CHUNK == TV__IO_DEFAULT_CHUNK, "default chunks agree");
_Static_assert(TV_READ_MAX_COPY_THREADS == TV__IO_MAX_COPY_THREADS, "copy thread limits agree");
_Static_assert(TV_READ_DEFAULT_COPY_THREADS == TV__IO_DEFAULT_COPY_THREADS,
               "default copy threads agree");

/* ---- the handle ------------------------------------------------------------ */

/* The option checks that need no device: engine, queue depth and chunk
 * bounds, and the staging cap with chunk_len rounded up to 4096 (every
 * io_align is a multiple of it); the store checks the cap again with its
 * devices' io_align. */
int tv__model_check_opts(const tv_open_opts *o, tv_error *err)
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

int tv__model_init(tv_model *m, tv_error *err)
{
    const char *nm;
    size_t nl;
    int rc;
    if ((rc = tv__snap_model(&m->snap, &nm, &nl, err)))
        return rc;
    if (!(m->name = strndup(nm, nl)))
        return tv__seterr(err, -ENOMEM, "out of memory");
    if (!(m->t = calloc(m->snap.n_tensors ? m->snap.n_tensors : 1, sizeof(*m->t))))
        return tv__seterr(err, -ENOMEM, "out of memory");
    if ((rc = pthread_mutex_init(&m->plan_mu, NULL)))
        return tv__seterr(err, -rc, "plan lock: %s", strerror(rc));
    m->plan_mu_ok = true;
    return 0;
}

TV_API void tv_model_close(tv_model *m)
{
    if (!m)
        return;
    m->ops->close(m);
    for (uint32_t i = 0; m->any_owned_shape && i < m->snap.n_tensors; i++)
        tv__tdesc_free(&m->t[i].d);
    free(m->t);
    if (m->plan_mu_ok)
        pthread_mutex_destroy(&m->plan_mu);
    free(m->name);
    free(m);
}

int tv__model_tensor(const tv_model *m, size_t i, const tv__tdesc **out, tv_error *err)
{
    int rc = 0;
    if (i >= m->snap.n_tensors)
        return tv__seterr(err, TV_E_INVALID_ARG, "tensor index %zu out of range (%u tensors)", i,
                          m->snap.n_tensors);
    /* The handle owns its records: decoding one is not a visible change. */
    tv__tplan *p = (tv__tplan *)&m->t[i];
    if (!atomic_load_explicit(&p->ready, memory_order_acquire)) {
        pthread_mutex_t *mu = (pthread_mutex_t *)&m->plan_mu;
        pthread_mutex_lock(mu);
        if (!atomic_load_explicit(&p->ready, memory_order_relaxed) &&
            (rc = tv__tdesc_decode(&m->snap, (uint32_t)i, &p->d, err)) == 0) {
            if (p->d.owned_shape)
                ((tv_model *)m)->any_owned_shape = true;
            atomic_store_explicit(&p->ready, true, memory_order_release);
        }
        pthread_mutex_unlock(mu);
    }
    *out = rc ? NULL : &p->d;
    return rc;
}

/* ---- metadata ---------------------------------------------------------------- */

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
    return m && m->ops->n_devices ? m->ops->n_devices(m, false) : 0;
}

TV_API size_t tv_model_n_excluded_devices(const tv_model *m)
{
    return m && m->ops->n_devices ? m->ops->n_devices(m, true) : 0;
}

TV_API int tv_model_device(const tv_model *m, size_t i, tv_device_status *out)
{
    if (!m || !out || !m->ops->device)
        return TV_E_INVALID_ARG;
    return m->ops->device(m, i, out);
}

TV_API size_t tv_model_n_tensors(const tv_model *m)
{
    return m ? m->snap.n_tensors : 0;
}

TV_API int tv_model_tensor(const tv_model *m, size_t i, tv_tensor_desc *out)
{
    const tv__tdesc *t = NULL;
    if (!m || !out || i >= m->snap.n_tensors)
        return TV_E_INVALID_ARG;
    int rc = tv__model_tensor(m, i, &t, NULL);
    tv__tdesc_public(t, out);
    return rc;
}

TV_API int tv_model_find(const tv_model *m, const char *name, size_t name_len, size_t *index)
{
    if (!m || !name)
        return TV_E_NOT_FOUND;
    return tv__tdesc_find(&m->snap, name, name_len, index);
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

/* ---- reads --------------------------------------------------------------------- */

/* Tensor `name` (NUL-terminated) of m: its index and record. */
static int lookup(const tv_model *m, const char *name, uint32_t *idx, const tv__tdesc **t,
                  tv_error *err)
{
    /* Set on every path: the compiler cannot see that tv__seterr never
     * returns 0, and a Release build (-Werror=maybe-uninitialized) fails. */
    *idx = 0;
    *t = NULL;
    if (!m || !name)
        return tv__seterr(err, TV_E_INVALID_ARG, "NULL argument");
    int rc = tv__tdesc_lookup(&m->snap, m->name, m->snap.generation, name, idx, err);
    return rc ? rc : tv__model_tensor(m, *idx, t, err);
}

/* Bytes [off, off + len) of tensor i (record t) into host memory dest. */
static int read_one(tv_model *m, uint32_t i, const tv__tdesc *t, uint64_t off, uint64_t len,
                    void *dest, tv_error *err)
{
    tv__mreq r = {.index = i, .t = t, .off = off, .len = len, .dest = dest};
    return m->ops->read_one(m, &r, err);
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
    tv__mreq r = {
        .index = (uint32_t)shard, .flags = TV__MREQ_SHARD_HEADER, .len = len, .dest = dest};
    return m->ops->read_one(m, &r, err);
}

TV_API int tv_read_into(tv_model *m, const char *name, void *dest, size_t dest_len, tv_error *err)
{
    uint32_t i;
    const tv__tdesc *t;
    int rc = lookup(m, name, &i, &t, err);
    if (rc || (rc = tv__tdesc_check_into(t, name, dest, dest_len, err)))
        return rc;
    return read_one(m, i, t, 0, t->nbytes, dest, err);
}

/* Requests reqs[0, n) through sink (NULL: host memory): each checked, the
 * checked ones read together by the backend. */
static int batch(tv_model *m, tv_read_req *reqs, size_t n, const tv__io_sink *sink, tv_error *err)
{
    tv__batch_err first = {0};
    tv_error e = {0};
    if (!m || (!reqs && n))
        return tv__seterr(err, TV_E_INVALID_ARG, "NULL argument");
    tv__mreq *r = calloc(n ? n : 1, sizeof(*r));
    size_t *map = calloc(n ? n : 1, sizeof(*map));
    if (!r || !map) {
        free(r);
        free(map);
        return tv__seterr(err, -ENOMEM, "out of memory");
    }
    size_t k = 0;
    for (size_t j = 0; j < n; j++) {
        size_t i = 0;
        const tv__tdesc *t = NULL;
        int rc = tv__tdesc_batch_index(&m->snap, m->name, m->snap.generation, &reqs[j], j, &i, &e);
        if (!rc)
            rc = tv__model_tensor(m, i, &t, &e);
        if (!rc && !(rc = tv__tdesc_check_batch(t, j, reqs[j].dest, reqs[j].dest_len, &e))) {
            r[k] = (tv__mreq){.index = (uint32_t)i, .t = t, .len = t->nbytes, .dest = reqs[j].dest};
            if (m->ops->check)
                rc = m->ops->check(m, &r[k], &e);
        }
        if ((reqs[j].result = tv__batch_note(&first, rc, &e)) == 0)
            map[k++] = j;
    }
    if (k)
        tv__batch_note(&first, m->ops->read(m, r, k, sink, &e), &e);
    for (size_t q = 0; q < k; q++)
        reqs[map[q]].result = r[q].result;
    for (size_t j = 0; j < n && !first.code; j++)
        if (reqs[j].result) {
            tv__seterr(&e, reqs[j].result, "request %zu failed: %s", j,
                       tv_strerror(reqs[j].result));
            tv__batch_note(&first, reqs[j].result, &e);
        }
    free(r);
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
    uint32_t i;
    const tv__tdesc *t;
    int rc = lookup(m, name, &i, &t, err);
    if (rc || (rc = tv__tdesc_check_range(t, name, off, len, dest, dest_len, err)) || len == 0)
        return rc;
    return read_one(m, i, t, off, len, dest, err);
}

TV_API int tv_rows_len(const tv_model *m, const char *name, uint64_t r0, uint64_t r1, uint64_t *len,
                       tv_error *err)
{
    uint32_t i;
    const tv__tdesc *t;
    uint64_t off;
    if (!len)
        return tv__seterr(err, TV_E_INVALID_ARG, "NULL argument");
    *len = 0;
    int rc = lookup(m, name, &i, &t, err);
    return rc ? rc : tv__tdesc_rows(t, name, r0, r1, &off, len, err);
}

TV_API int tv_read_rows(tv_model *m, const char *name, uint64_t r0, uint64_t r1, void *dest,
                        size_t dest_len, tv_error *err)
{
    uint32_t i;
    const tv__tdesc *t;
    uint64_t off, len;
    int rc = lookup(m, name, &i, &t, err);
    if (rc || (rc = tv__tdesc_rows(t, name, r0, r1, &off, &len, err)) || r0 == r1)
        return rc;
    if ((rc = tv__tdesc_check_rows_dest(name, r0, r1, len, dest, dest_len, err)))
        return rc;
    return read_one(m, i, t, off, len, dest, err);
}

TV_API int tv_read_f32(tv_model *m, const char *name, void *dest, size_t dest_len, tv_error *err)
{
    uint32_t i;
    const tv__tdesc *t;
    int rc = lookup(m, name, &i, &t, err);
    if (rc || (rc = tv__tdesc_check_f32(t, name, dest, dest_len, err)))
        return rc;
    if (t->dtype == TV_DTYPE_F32)
        return read_one(m, i, t, 0, t->nbytes, dest, err);
    if (t->nbytes > SIZE_MAX)
        return tv__seterr(err, TV_E_OVERFLOW, "tensor '%s': %llu bytes do not fit in memory", name,
                          (unsigned long long)t->nbytes);
    void *raw = malloc(t->nbytes ? (size_t)t->nbytes : 1);
    if (!raw)
        return tv__seterr(err, -ENOMEM, "out of memory");
    rc = read_one(m, i, t, 0, t->nbytes, raw, err);
    if (!rc && (rc = tv_convert_f32(t->dtype, raw, (size_t)t->n_elements, dest)))
        tv__seterr(err, rc, "tensor '%s': float32 conversion: %s", name, tv_strerror(rc));
    free(raw);
    return rc;
}

TV_API int tv_get_tensor(tv_model *m, const char *name, tv_tensor **out, tv_error *err)
{
    uint32_t i;
    const tv__tdesc *t;
    int rc;
    if (!out)
        return tv__seterr(err, TV_E_INVALID_ARG, "NULL argument");
    *out = NULL;
    if ((rc = lookup(m, name, &i, &t, err)))
        return rc;
    uint64_t a = m->arena_align, arena_len = t->nbytes ? t->nbytes : a;
    /* With the envelope read into the arena: headroom for it on either
     * side of the payload. */
    if (m->arena_envelope ? tv__add_u64(t->nbytes, 2 * a, &arena_len) ||
                                tv__align_up_u64(arena_len, a, &arena_len)
                          : t->nbytes > SIZE_MAX - a)
        return tv__seterr(err, TV_E_OVERFLOW, "tensor '%s' too large", name);
    tv_tensor *tt;
    void *arena;
    if ((rc = tv__tensor_new(arena_len, a, &tt, &arena, err)))
        return rc;
    tv__mreq r = {.index = i, .flags = TV__MREQ_ENVELOPE, .t = t, .len = t->nbytes, .dest = arena};
    if ((rc = m->ops->read_one(m, &r, err)))
        goto fail;
    if (r.skip > arena_len || t->nbytes > arena_len - r.skip) {
        rc = tv__seterr(err, TV_E_INTERNAL, "tensor '%s': envelope larger than the arena", name);
        goto fail;
    }
    tv__tensor_set(tt, r.skip, t);
    *out = tt;
    return 0;
fail:
    tv_tensor_free(tt);
    return rc;
}

/* ---- CUDA destinations ---------------------------------------------------------- */

TV_API bool tv_cuda_available(void)
{
    return tv__cuda_available();
}

static int cuda_batch(tv_model *m, tv_read_req *reqs, size_t n, void *stream, tv_error *err)
{
    tv__cuda_sink *cs = NULL;
    tv__io_sink sink;
    int rc;
    if (!m || (!reqs && n))
        return tv__seterr(err, TV_E_INVALID_ARG, "NULL argument");
    if ((rc = m->ops->cuda_sink(m, stream, &cs, err)))
        goto fail_all;
    for (size_t j = 0; j < n; j++)
        if (reqs[j].dest && (rc = tv__cuda_check_dest(reqs[j].dest, reqs[j].dest_len, err))) {
            tv__cuda_sink_destroy(cs);
            goto fail_all;
        }
    tv__cuda_sink_bind(cs, &sink);
    rc = batch(m, reqs, n, &sink, err);
    tv__cuda_sink_destroy(cs);
    return rc;
fail_all:
    /* Nothing ran: every request carries the reason. */
    for (size_t j = 0; j < n; j++)
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
