/* The read engine's planner and completion logic (see engine.h); the
 * backends that move the bytes are uring.c and pread.c.
 *
 * A batch runs in rounds. Round 1 validates every request, cuts it into
 * segments (span positions [p0, p1) on one replica; a request's span is its
 * payload, or its envelope in envelope mode) and assigns the segments of
 * multi-replica requests to replicas window by window (chunk_len-aligned
 * windows of the first replica's offsets) in proportion to each device's
 * bandwidth estimate, so adjacent tensors stay together and coalesce. Each
 * round sorts its segments by (device, envelope begin): a segment is read
 * straight into its destination when that is exact (aligned offset, length
 * and destination, host sink, no shared block with a neighbour), else it is
 * staged: overlapping or touching envelopes form extents, cut into runs of
 * at most chunk_len, each read into the staging slot of its op and copied
 * out slice by slice. Failed portions go to the next round on the next
 * untried replica; a portion that no replica can deliver fails its request.
 *
 * Invariants: every device read is an aligned range inside its device (the
 * envelope was validated with checked arithmetic before any I/O); each
 * payload byte of a segment lies in exactly one run of its round, so a
 * request's `remaining` reaches 0 exactly when every byte arrived and no
 * byte is written twice per round; a request whose result left PENDING is
 * never changed back to success; memory is O(requests + segments) small
 * records plus the staging ring, never proportional to the bytes. */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "io/io_internal.h"
#include "tensorvault/tensorvault.h"

tv__io_fault_fn tv__io_fault = NULL;

#define PENDING  1   /* internal result of a request still in flight */
#define BW_SEED  1e9 /* bytes/s before any sample: only ratios matter */
#define BW_ALPHA 0.25

uint64_t tv__io_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int tv__io_envelope(uint64_t off, uint64_t len, uint32_t io_align, uint64_t *io_begin,
                    uint64_t *io_end, uint64_t *payload_skip)
{
    uint64_t end, ie, ib;
    if (io_align == 0 || (io_align & (io_align - 1)))
        return TV_E_INVALID_ARG;
    if (tv__add_u64(off, len, &end) || tv__align_up_u64(end, io_align, &ie))
        return TV_E_OVERFLOW;
    ib = tv__align_down_u64(off, io_align);
    if (io_begin)
        *io_begin = ib;
    if (io_end)
        *io_end = ie;
    if (payload_skip)
        *payload_skip = off - ib;
    return 0;
}

int tv__io_step_common(int64_t res, uint64_t len, uint64_t *done, uint32_t *n_again, int *result)
{
    uint64_t want = len - *done;
    if (res == -EINTR || res == -EAGAIN) {
        if (++*n_again <= TV__IO_MAX_AGAIN)
            return TV__IO_STEP_AGAIN;
        *result = (int)res;
        return TV__IO_STEP_DONE;
    }
    if (res < 0) {
        *result = res < INT_MIN ? TV_E_INTERNAL : (int)res;
        return TV__IO_STEP_DONE;
    }
    if ((uint64_t)res > want) {
        *result = TV_E_INTERNAL;
        return TV__IO_STEP_DONE;
    }
    if ((uint64_t)res == want) {
        *done = len;
        *result = 0;
        return TV__IO_STEP_DONE;
    }
    return TV__IO_STEP_SHORT;
}

void tv__io_fault_apply(uint32_t dev, uint64_t off, uint64_t len, int64_t *res)
{
    if (tv__io_fault)
        tv__io_fault(dev, off, (size_t)len, res);
}

int tv__io_uring_choice(int want, int init_rc, const char *who, unsigned entries,
                        uint32_t n_threads, tv_error *err)
{
    int rc = init_rc;
    if (rc == 0)
        return TV_ENGINE_URING;
    if (want != TV_ENGINE_URING) {
        tv__log(TV_LOG_INFO, "%sio_uring unavailable (%s): using %u pread workers", who,
                strerror(-rc), n_threads);
        return TV_ENGINE_PREAD;
    }
    if (rc == -ENOSYS || rc == -EPERM || rc == -EACCES || rc == -EOPNOTSUPP)
        return tv__seterr(err, TV_E_NOT_SUPPORTED, "%sio_uring unavailable: %s", who,
                          strerror(-rc));
    return tv__seterr(err, rc, "%sio_uring_queue_init(%u): %s", who, entries, strerror(-rc));
}

int tv__io_op_step(tv__io_op *op, int64_t res)
{
    int s = tv__io_step_common(res, op->len, &op->done, &op->n_again, &op->result);
    if (s != TV__IO_STEP_SHORT)
        return s;
    /* Short: the rest is asked once more; a second short read is final. */
    if (++op->n_short >= 2) {
        op->result = TV_E_SHORT_IO;
        return 0;
    }
    op->done += (uint64_t)res;
    if (op->o_direct)
        op->done = tv__align_down_u64(op->done, op->align);
    return 1;
}

/* ------------------------------------------------------------------------ */
/* Engine lifetime                                                          */
/* ------------------------------------------------------------------------ */

static bool is_pow2(uint64_t v)
{
    return v && !(v & (v - 1));
}

int tv__io_create(const tv__io_dev *devs, size_t n_devs, const tv__io_opts *opts, tv__io **out,
                  tv_error *err)
{
    tv__io_opts o = {0};
    tv__io *io = NULL;
    uint32_t max_align = 0;
    uint64_t chunk, total;
    int rc;

    if (!out)
        return tv__seterr(err, TV_E_INVALID_ARG, "io engine: NULL out");
    *out = NULL;
    if (opts)
        o = *opts;
    if (!devs || n_devs == 0 || n_devs > UINT32_MAX)
        return tv__seterr(err, TV_E_INVALID_ARG, "io engine: %zu devices", devs ? n_devs : 0);
    for (size_t i = 0; i < n_devs; i++) {
        if (devs[i].excluded)
            continue;
        if (devs[i].fd < 0 || devs[i].io_align < 512 || devs[i].io_align > TV__IO_MAX_CHUNK ||
            !is_pow2(devs[i].io_align) || devs[i].size_bytes > INT64_MAX)
            return tv__seterr(err, TV_E_INVALID_ARG,
                              "io engine: device %zu: fd %d, io_align %u, size %llu", i, devs[i].fd,
                              devs[i].io_align, (unsigned long long)devs[i].size_bytes);
        if (devs[i].io_align > max_align)
            max_align = devs[i].io_align;
    }
    if (!max_align)
        return tv__seterr(err, TV_E_INVALID_ARG, "io engine: all %zu devices are excluded", n_devs);
    if (o.engine != TV_ENGINE_AUTO && o.engine != TV_ENGINE_URING && o.engine != TV_ENGINE_PREAD)
        return tv__seterr(err, TV_E_INVALID_ARG, "io engine: unknown engine %d", o.engine);
    if (!o.queue_depth)
        o.queue_depth = TV__IO_DEFAULT_QD;
    if (o.queue_depth > TV__IO_MAX_QD)
        return tv__seterr(err, TV_E_INVALID_ARG, "io engine: queue depth %u over %u", o.queue_depth,
                          TV__IO_MAX_QD);
    if (!o.chunk_len) {
        /* The default shrinks for deep queues so that the staging fits. */
        chunk = TV__IO_MAX_STAGING / o.queue_depth;
        if (chunk > TV__IO_DEFAULT_CHUNK)
            chunk = TV__IO_DEFAULT_CHUNK;
        chunk = tv__align_down_u64(chunk, max_align);
        if (!chunk)
            chunk = max_align;
    } else if (o.chunk_len > TV__IO_MAX_CHUNK || tv__align_up_u64(o.chunk_len, max_align, &chunk) ||
               chunk > TV__IO_MAX_CHUNK) {
        return tv__seterr(err, TV_E_INVALID_ARG,
                          "io engine: chunk of %zu bytes over %u (rounded up to %u)", o.chunk_len,
                          TV__IO_MAX_CHUNK, max_align);
    }
    if (tv__mul_u64(chunk, o.queue_depth, &total) || total > TV__IO_MAX_STAGING)
        return tv__seterr(err, TV_E_INVALID_ARG,
                          "io engine: staging: queue depth %u x chunk %llu over %llu bytes",
                          o.queue_depth, (unsigned long long)chunk,
                          (unsigned long long)TV__IO_MAX_STAGING);
    if (!o.n_threads)
        o.n_threads = o.queue_depth < 16 ? o.queue_depth : 16;
    if (o.n_threads > o.queue_depth)
        o.n_threads = o.queue_depth;
    if (!o.timeout_ms)
        o.timeout_ms = 30000;
    if (o.copy_threads > TV__IO_MAX_COPY_THREADS)
        return tv__seterr(err, TV_E_INVALID_ARG, "io engine: %u copy threads over %u",
                          o.copy_threads, TV__IO_MAX_COPY_THREADS);
    if (!o.copy_threads)
        o.copy_threads = tv__io_copy_default_threads();

    io = calloc(1, sizeof(*io));
    if (!io)
        return tv__seterr(err, -ENOMEM, "out of memory");
    io->n_devs = (uint32_t)n_devs;
    io->qd = o.queue_depth;
    io->chunk_len = chunk;
    io->max_align = max_align;
    io->timeout_ms = o.timeout_ms;
    io->n_threads = o.n_threads;
    io->cp_want = o.copy_threads;
    io->fixed = o.fixed_buffers;
    io->devs = calloc(n_devs, sizeof(*io->devs));
    io->bw = calloc(n_devs, sizeof(*io->bw));
    io->n_bw = calloc(n_devs, sizeof(*io->n_bw));
    io->ops = calloc(io->qd, sizeof(*io->ops));
    if (!io->devs || !io->bw || !io->n_bw || !io->ops) {
        rc = tv__seterr(err, -ENOMEM, "out of memory");
        goto fail;
    }
    memcpy(io->devs, devs, n_devs * sizeof(*devs));
    for (size_t i = 0; i < n_devs; i++)
        io->bw[i] = BW_SEED;

    if (o.engine != TV_ENGINE_PREAD) {
        rc = tv__io_uring_choice(o.engine, tv__io_uring_init(io), "", io->qd, io->n_threads, err);
        if (rc < 0)
            goto fail;
        io->engine = rc;
    }
    if (io->engine != TV_ENGINE_URING) {
        io->engine = TV_ENGINE_PREAD;
        if ((rc = tv__io_pread_init(io))) {
            rc = tv__seterr(err, rc, "io engine: starting %u pread workers: %s", io->n_threads,
                            strerror(-rc));
            goto fail;
        }
    }
    *out = io;
    return 0;
fail:
    tv__io_destroy(io);
    return rc;
}

void tv__io_destroy(tv__io *io)
{
    if (!io)
        return;
    tv__io_pread_fini(io);
    tv__io_uring_fini(io);
    tv__io_copy_fini(io);
    free(io->own_staging);
    free(io->ops);
    free(io->bw);
    free(io->n_bw);
    free(io->devs);
    free(io);
}

int tv__io_engine(const tv__io *io)
{
    return io ? io->engine : TV_E_INVALID_ARG;
}

uint64_t tv__io_chunk_len(const tv__io *io)
{
    return io ? io->chunk_len : 0;
}

/* ------------------------------------------------------------------------ */
/* Batch state                                                              */
/* ------------------------------------------------------------------------ */

typedef struct rq {
    uint64_t span;      /* bytes delivered: len, or the envelope in envelope mode */
    uint64_t skip;      /* envelope mode: payload_skip (span position 0 = off - skip) */
    uint64_t remaining; /* span bytes not yet delivered */
    uint8_t ok_mask;    /* replicas usable for this request */
} rq;

typedef struct seg {
    uint64_t eb, ee; /* envelope on the device */
    uint64_t db;     /* device offset of span position p0 */
    uint64_t p0, p1; /* span positions */
    uint32_t req;
    uint32_t dev;
    uint8_t rep;   /* source index */
    uint8_t tried; /* sources tried, this one included */
    uint8_t direct;
} seg;

typedef struct segv {
    seg *v;
    size_t n, cap;
} segv;

typedef struct batch {
    tv__io *io;
    tv__io_req *reqs;
    size_t n;
    const tv__io_sink *sink; /* NULL: host */
    rq *rq;
    uint64_t *assigned; /* bytes planned per device */
    bool *dead;         /* device timed out in this batch */
    uint32_t *free_ops;
    uint32_t n_free, n_inflight;
    seg *st, *dir; /* this round: staged and direct segments, sorted */
    size_t n_st, n_dir;
    segv retry;
    /* run cursor */
    size_t ci, clo, cdi;
    uint64_t cpos, cend, cdpos;
    uint32_t cdev;
    bool copen;
    void *sink_staging;
    bool staging_ready;
    int fatal;
    size_t ferr_idx; /* lowest failed request so far (n = none) */
    tv_error ferr;
} batch;

static void set_fail(batch *b, size_t i, int code, const char *fmt, ...) TV_PRINTF(4, 5);

static void set_fail(batch *b, size_t i, int code, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    if (b->reqs[i].result != PENDING && b->reqs[i].result != 0)
        return; /* the first cause wins */
    b->reqs[i].result = code;
    if (i >= b->ferr_idx)
        return;
    b->ferr_idx = i;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    tv__seterr(&b->ferr, code, "request %zu: %s: %s", i, msg, tv_strerror(code));
}

static int segv_push(segv *sv, const seg *s)
{
    if (sv->n == sv->cap) {
        size_t cap = sv->cap ? sv->cap * 2 : 256;
        seg *v = realloc(sv->v, cap * sizeof(*v));
        if (!v)
            return -ENOMEM;
        sv->v = v;
        sv->cap = cap;
    }
    sv->v[sv->n++] = *s;
    return 0;
}

/* Fills the device fields of a segment of request k on source rep. */
static void seg_place(const batch *b, seg *s)
{
    const tv__io_req *r = &b->reqs[s->req];
    const tv__io_dev *d = &b->io->devs[r->src[s->rep].dev];
    s->dev = r->src[s->rep].dev;
    s->db = r->src[s->rep].off - b->rq[s->req].skip + s->p0;
    /* Validation guaranteed [eb, ee) inside the device: no overflow. */
    s->eb = tv__align_down_u64(s->db, d->io_align);
    tv__align_up_u64(s->db + (s->p1 - s->p0), d->io_align, &s->ee);
    s->direct = 0;
}

/* Appends a segment, merging it into the previous one when it continues it. */
static int add_seg(batch *b, segv *sv, uint32_t k, uint8_t rep, uint64_t p0, uint64_t p1,
                   uint8_t tried)
{
    if (sv->n) {
        seg *l = &sv->v[sv->n - 1];
        if (l->req == k && l->rep == rep && l->p1 == p0 && l->tried == tried) {
            l->p1 = p1;
            seg_place(b, l);
            return 0;
        }
    }
    seg s = {.req = k, .rep = rep, .p0 = p0, .p1 = p1, .tried = tried};
    seg_place(b, &s);
    return segv_push(sv, &s);
}

/* ------------------------------------------------------------------------ */
/* Validation and replica assignment                                        */
/* ------------------------------------------------------------------------ */

static void validate(batch *b, size_t i)
{
    tv__io_req *r = &b->reqs[i];
    rq *q = &b->rq[i];
    const tv__io *io = b->io;
    uint64_t ib0 = 0, ie0 = 0, skip0 = 0;

    r->result = PENDING;
    if (r->n_src == 0 || r->n_src > TV__IO_MAX_REPLICAS) {
        set_fail(b, i, TV_E_INVALID_ARG, "%u sources (1 to %d)", r->n_src, TV__IO_MAX_REPLICAS);
        return;
    }
    if (r->len && !r->dest) {
        set_fail(b, i, TV_E_INVALID_ARG, "NULL destination for %llu bytes",
                 (unsigned long long)r->len);
        return;
    }
    if (r->envelope_into_dest && !r->payload_skip) {
        set_fail(b, i, TV_E_INVALID_ARG, "envelope mode without payload_skip");
        return;
    }
    uint8_t usable = 0;
    for (uint32_t s = 0; s < r->n_src; s++) {
        uint64_t ib, ie, sk;
        uint32_t dv = r->src[s].dev;
        if (dv >= io->n_devs) {
            set_fail(b, i, TV_E_INVALID_ARG, "source %u: no device %u (%u devices)", s, dv,
                     io->n_devs);
            return;
        }
        if (io->devs[dv].excluded)
            continue; /* never read, whatever its offsets */
        if (tv__io_envelope(r->src[s].off, r->len, io->devs[dv].io_align, &ib, &ie, &sk)) {
            set_fail(b, i, TV_E_INVALID_ARG,
                     "source %u: device %u offset %llu + length %llu overflows", s, dv,
                     (unsigned long long)r->src[s].off, (unsigned long long)r->len);
            return;
        }
        if (ie > io->devs[dv].size_bytes) {
            set_fail(
                b, i, TV_E_INVALID_ARG,
                "source %u: device %u: envelope [%llu, %llu) of offset %llu length %llu passes the device end %llu",
                s, dv, (unsigned long long)ib, (unsigned long long)ie,
                (unsigned long long)r->src[s].off, (unsigned long long)r->len,
                (unsigned long long)io->devs[dv].size_bytes);
            return;
        }
        if (s == 0) {
            ib0 = ib;
            ie0 = ie;
            skip0 = sk;
        }
        usable |= (uint8_t)(1u << s);
    }
    if (!usable) {
        set_fail(b, i, TV_E_NO_REPLICA, "all %u sources are on excluded devices", r->n_src);
        return;
    }
    q->skip = 0;
    q->span = r->len;
    q->ok_mask = usable;
    if (r->envelope_into_dest) {
        uint32_t a0;
        if (!(usable & 1u)) {
            set_fail(b, i, TV_E_INVALID_ARG, "envelope mode: source 0 is on excluded device %u",
                     r->src[0].dev);
            return;
        }
        a0 = io->devs[r->src[0].dev].io_align;
        *r->payload_skip = skip0;
        if (r->len && !b->sink && ((uintptr_t)r->dest % a0)) {
            set_fail(b, i, TV_E_INVALID_ARG, "envelope arena %p not aligned to %u", r->dest, a0);
            return;
        }
        q->skip = skip0;
        q->span = ie0 - ib0;
        q->ok_mask = 1;
        for (uint32_t s = 1; s < r->n_src; s++) {
            const tv__io_dev *d = &io->devs[r->src[s].dev];
            uint64_t base, end;
            if (!(usable & (1u << s)) || r->src[s].off < skip0)
                continue;
            base = r->src[s].off - skip0;
            if (base % d->io_align || q->span % d->io_align || tv__add_u64(base, q->span, &end) ||
                end > d->size_bytes)
                continue;
            q->ok_mask |= (uint8_t)(1u << s);
        }
    }
    if (r->len == 0) {
        q->span = 0;
        r->result = 0;
    }
    q->remaining = q->span;
}

typedef struct order_key {
    uint64_t off;
    uint32_t dev;
    uint32_t idx;
} order_key;

static int cmp_order(const void *pa, const void *pb)
{
    const order_key *a = pa, *b = pb;
    if (a->dev != b->dev)
        return a->dev < b->dev ? -1 : 1;
    if (a->off != b->off)
        return a->off < b->off ? -1 : 1;
    return a->idx < b->idx ? -1 : a->idx > b->idx;
}

static bool same_set(const batch *b, uint32_t x, uint32_t y)
{
    const tv__io_req *a = &b->reqs[x], *c = &b->reqs[y];
    if (a->n_src != c->n_src || b->rq[x].ok_mask != b->rq[y].ok_mask)
        return false;
    for (uint32_t s = 0; s < a->n_src; s++)
        if (a->src[s].dev != c->src[s].dev)
            return false;
    return true;
}

/* The usable source whose device would finish its planned bytes first.
 * A device never measured counts as fast as the best measured one (so a
 * replica that was never chosen gets measured), and no estimate counts
 * below 1/16 of the best (so one slow sample cannot starve a replica
 * forever: it keeps a share and gets measured again). */
static uint8_t choose(const batch *b, uint32_t k, uint8_t mask)
{
    const tv__io_req *r = &b->reqs[k];
    const tv__io *io = b->io;
    double best = 0, top = 0;
    int pick = -1;
    for (uint32_t s = 0; s < r->n_src; s++)
        if ((mask & (1u << s)) && io->n_bw[r->src[s].dev] && io->bw[r->src[s].dev] > top)
            top = io->bw[r->src[s].dev];
    if (top <= 0)
        top = BW_SEED;
    for (uint32_t s = 0; s < r->n_src; s++) {
        if (!(mask & (1u << s)))
            continue;
        uint32_t d = r->src[s].dev;
        double bw = io->n_bw[d] ? io->bw[d] : top;
        if (bw < top / 16)
            bw = top / 16;
        double cost = ((double)b->assigned[d] + (double)io->chunk_len) / bw;
        if (pick < 0 || cost < best) {
            best = cost;
            pick = (int)s;
        }
    }
    return (uint8_t)pick;
}

static int plan_first_round(batch *b, segv *out)
{
    size_t m = 0;
    order_key *ord;
    uint64_t chunk = b->io->chunk_len;
    bool have = false;
    uint64_t cur_w = 0;
    uint32_t cur_k = 0;
    uint8_t cur_rep = 0;
    int rc = 0;

    for (size_t i = 0; i < b->n; i++)
        if (b->reqs[i].result == PENDING)
            m++;
    ord = malloc((m ? m : 1) * sizeof(*ord));
    if (!ord)
        return -ENOMEM;
    m = 0;
    for (size_t i = 0; i < b->n; i++)
        if (b->reqs[i].result == PENDING)
            ord[m++] = (order_key){.off = b->reqs[i].src[0].off - b->rq[i].skip,
                                   .dev = b->reqs[i].src[0].dev,
                                   .idx = (uint32_t)i};
    qsort(ord, m, sizeof(*ord), cmp_order);

    for (size_t j = 0; j < m && !rc; j++) {
        uint32_t k = ord[j].idx;
        const rq *q = &b->rq[k];
        uint8_t mask = q->ok_mask;
        if (!(mask & (mask - 1))) { /* one usable source */
            uint8_t rep = (uint8_t)__builtin_ctz(mask);
            rc = add_seg(b, out, k, rep, 0, q->span, mask);
            b->assigned[b->reqs[k].src[rep].dev] += q->span;
            continue;
        }
        uint64_t base0 = ord[j].off;
        for (uint64_t p = 0; p < q->span && !rc;) {
            uint64_t into = (base0 + p) % chunk, w = (base0 + p) / chunk;
            uint64_t q1 = q->span - p > chunk - into ? p + (chunk - into) : q->span;
            if (!have || w != cur_w || !same_set(b, cur_k, k)) {
                cur_rep = choose(b, k, mask);
                cur_w = w;
                have = true;
            }
            cur_k = k;
            rc = add_seg(b, out, k, cur_rep, p, q1, (uint8_t)(1u << cur_rep));
            b->assigned[b->reqs[k].src[cur_rep].dev] += q1 - p;
            p = q1;
        }
    }
    free(ord);
    return rc;
}

/* Moves the retry portions to the next untried source of each. */
static void place_retries(batch *b, segv *sv)
{
    size_t w = 0;
    for (size_t i = 0; i < sv->n; i++) {
        seg s = sv->v[i];
        tv__io_req *r = &b->reqs[s.req];
        uint8_t left = b->rq[s.req].ok_mask & (uint8_t)~s.tried;
        if (r->result != PENDING || !left)
            continue;
        uint8_t rep = s.rep;
        do
            rep = (uint8_t)((rep + 1) % r->n_src);
        while (!(left & (1u << rep)));
        s.rep = rep;
        s.tried |= (uint8_t)(1u << rep);
        seg_place(b, &s);
        sv->v[w++] = s;
    }
    sv->n = w;
}

/* ------------------------------------------------------------------------ */
/* Round planning: sort, direct or staged                                   */
/* ------------------------------------------------------------------------ */

static int cmp_seg(const void *pa, const void *pb)
{
    const seg *a = pa, *b = pb;
    if (a->direct != b->direct)
        return a->direct < b->direct ? -1 : 1;
    if (a->dev != b->dev)
        return a->dev < b->dev ? -1 : 1;
    if (a->eb != b->eb)
        return a->eb < b->eb ? -1 : 1;
    if (a->db != b->db)
        return a->db < b->db ? -1 : 1;
    return a->req < b->req ? -1 : a->req > b->req;
}

static void plan_round(batch *b, segv *sv)
{
    seg *v = sv->v;
    size_t n = sv->n, n_dir = 0;
    uint64_t maxend = 0;
    for (size_t k = 0; k < n; k++)
        v[k].direct = 0;
    qsort(v, n, sizeof(*v), cmp_seg);
    for (size_t k = 0; k < n; k++) {
        seg *s = &v[k];
        const tv__io_req *r = &b->reqs[s->req];
        uint64_t a = b->io->devs[s->dev].io_align, len = s->p1 - s->p0;
        bool has_prev = k > 0 && v[k - 1].dev == s->dev;
        bool has_next = k + 1 < n && v[k + 1].dev == s->dev;
        if (!has_prev)
            maxend = 0;
        bool ovl = (has_prev && maxend > s->eb) || (has_next && v[k + 1].eb < s->ee);
        bool touch = (has_prev && maxend == s->eb) || (has_next && v[k + 1].eb == s->ee);
        bool exact =
            !b->sink && s->db % a == 0 && len % a == 0 && ((uintptr_t)r->dest + s->p0) % a == 0;
        if (s->ee > maxend)
            maxend = s->ee;
        if (exact && (r->envelope_into_dest || (!ovl && (!touch || len >= b->io->chunk_len / 4)))) {
            s->direct = 1;
            n_dir++;
        }
    }
    if (n_dir)
        qsort(v, n, sizeof(*v), cmp_seg);
    b->st = v;
    b->n_st = n - n_dir;
    b->dir = v + b->n_st;
    b->n_dir = n_dir;
    b->ci = b->clo = b->cdi = 0;
    b->cdpos = 0;
    b->copen = false;
}

/* ------------------------------------------------------------------------ */
/* Execution                                                                */
/* ------------------------------------------------------------------------ */

static void op_init(batch *b, tv__io_op *op, uint32_t dev, uint64_t off, uint64_t len)
{
    const tv__io_dev *d = &b->io->devs[dev];
    op->dev = dev;
    op->fd = d->fd;
    op->align = d->io_align;
    op->o_direct = d->direct;
    op->off = off;
    op->len = len;
    op->done = 0;
    op->n_short = 0;
    op->n_again = 0;
    op->result = 0;
    op->timed_out = false;
    op->inflight = false;
    op->elapsed_ns = 0;
}

static bool next_run(batch *b, uint32_t oi)
{
    tv__io *io = b->io;
    tv__io_op *op = &io->ops[oi];
    uint64_t chunk = io->chunk_len, limit, run_e;

    if (!b->copen) {
        bool have_st = b->ci < b->n_st, have_dir = b->cdi < b->n_dir;
        if (!have_st && !have_dir)
            return false;
        if (have_dir &&
            (!have_st || b->dir[b->cdi].dev < b->st[b->ci].dev ||
             (b->dir[b->cdi].dev == b->st[b->ci].dev && b->dir[b->cdi].eb < b->st[b->ci].eb))) {
            const seg *s = &b->dir[b->cdi];
            uint64_t pos = s->eb + b->cdpos, len = s->ee - pos < chunk ? s->ee - pos : chunk;
            op_init(b, op, s->dev, pos, len);
            op->buf = (uint8_t *)b->reqs[s->req].dest + s->p0 + b->cdpos;
            op->fixed = false;
            op->to_dest = true;
            op->seg_lo = b->cdi;
            b->cdpos += len;
            if (pos + len == s->ee) {
                b->cdi++;
                b->cdpos = 0;
            }
            return true;
        }
        const seg *s = &b->st[b->ci];
        b->copen = true;
        b->cdev = s->dev;
        b->cpos = s->eb;
        b->cend = s->ee;
        b->clo = b->ci++;
    }
    if (tv__add_u64(b->cpos, chunk, &limit))
        limit = UINT64_MAX;
    while (b->ci < b->n_st && b->st[b->ci].dev == b->cdev && b->st[b->ci].eb <= b->cend &&
           b->st[b->ci].eb < limit) {
        if (b->st[b->ci].ee > b->cend)
            b->cend = b->st[b->ci].ee;
        b->ci++;
    }
    run_e = b->cend < limit ? b->cend : limit;
    while (b->clo < b->ci && b->st[b->clo].ee <= b->cpos)
        b->clo++;
    op_init(b, op, b->cdev, b->cpos, run_e - b->cpos);
    op->buf = io->staging + (size_t)oi * io->chunk_len;
    op->fixed = io->reg_base && io->reg_base == io->staging;
    op->slot = oi;
    op->to_dest = false;
    op->seg_lo = b->clo;
    op->seg_hi = b->ci;
    b->cpos = run_e;
    if (b->cpos >= b->cend)
        b->copen = false;
    return true;
}

/* A portion [pb, pe) of segment s could not be read from its source. */
static void fail_portion(batch *b, const seg *s, uint64_t pb, uint64_t pe, int code,
                         const tv__io_op *op)
{
    tv__io_req *r = &b->reqs[s->req];
    if (r->result != PENDING)
        return;
    if (b->rq[s->req].ok_mask & (uint8_t)~s->tried) {
        segv *rv = &b->retry;
        if (rv->n) {
            seg *l = &rv->v[rv->n - 1];
            if (l->req == s->req && l->rep == s->rep && l->tried == s->tried && l->p1 == pb) {
                l->p1 = pe;
                return;
            }
        }
        seg t = *s;
        t.p0 = pb;
        t.p1 = pe;
        if (segv_push(rv, &t) == 0)
            return;
        code = -ENOMEM;
    }
    set_fail(b, s->req, code, "read of device %u at offset %llu (%llu bytes)%s failed", op->dev,
             (unsigned long long)op->off, (unsigned long long)op->len,
             r->n_src > 1 ? ", the last of its replicas," : "");
}

static void complete(batch *b, uint32_t oi)
{
    tv__io *io = b->io;
    tv__io_op *op = &io->ops[oi];
    int code = op->timed_out ? TV_E_TIMEOUT : op->result;
    uint64_t run_b = op->off, run_e = op->off + op->len;

    op->inflight = false;
    b->n_inflight--;
    b->free_ops[b->n_free++] = oi;

    if (op->to_dest) {
        const seg *s = &b->dir[op->seg_lo];
        uint64_t pb = s->p0 + (run_b - s->db);
        if (code)
            fail_portion(b, s, pb, pb + op->len, code, op);
        else
            b->rq[s->req].remaining -= op->len;
    } else {
        for (size_t k = op->seg_lo; k < op->seg_hi; k++) {
            const seg *s = &b->st[k];
            uint64_t de = s->db + (s->p1 - s->p0);
            uint64_t ob = s->db > run_b ? s->db : run_b, oe = de < run_e ? de : run_e;
            tv__io_req *r = &b->reqs[s->req];
            if (ob >= oe || r->result != PENDING)
                continue;
            uint64_t dest_off = s->p0 + (ob - s->db);
            if (code) {
                fail_portion(b, s, dest_off, dest_off + (oe - ob), code, op);
                continue;
            }
            const uint8_t *src = op->buf + (ob - run_b);
            if (b->sink && b->sink->copy) {
                int rc = b->sink->copy(b->sink->ctx, r->dest, dest_off, src, (size_t)(oe - ob), oi);
                if (rc) {
                    set_fail(b, s->req, rc, "copy of %llu bytes at +%llu to the destination",
                             (unsigned long long)(oe - ob), (unsigned long long)dest_off);
                    if (!b->fatal)
                        b->fatal = rc;
                    continue;
                }
            } else {
                tv__io_copy_add(io, (uint8_t *)r->dest + dest_off, src, (size_t)(oe - ob));
            }
            b->rq[s->req].remaining -= oe - ob;
        }
        /* Every byte of this op is in place before its slot is reused. */
        tv__io_copy_flush(io);
    }
    if (!code && op->elapsed_ns) {
        double sample = (double)op->len * 1e9 / (double)op->elapsed_ns;
        io->bw[op->dev] =
            io->n_bw[op->dev] ? io->bw[op->dev] * (1 - BW_ALPHA) + sample * BW_ALPHA : sample;
        io->n_bw[op->dev]++;
    }
}

static void on_timeout(batch *b)
{
    tv__io *io = b->io;
    for (uint32_t i = 0; i < io->qd; i++) {
        tv__io_op *op = &io->ops[i];
        if (!op->inflight)
            continue;
        if (!op->timed_out) {
            op->timed_out = true;
            b->dead[op->dev] = true;
            tv__log(TV_LOG_WARN,
                    "device %u: read at offset %llu (%llu bytes) got no completion in %u ms",
                    op->dev, (unsigned long long)op->off, (unsigned long long)op->len,
                    io->timeout_ms);
        }
        if (io->engine == TV_ENGINE_URING)
            tv__io_uring_cancel(io, i);
    }
}

/* Gives the engine its own staging of total bytes: 4 KiB pages for a batch
 * that stages less than the ring (only the slots it uses are faulted in),
 * else transparent huge pages, replacing a small-batch ring (nothing is in
 * flight between batches; the old ring goes first, so two never coexist).
 * Huge pages make each read's buffer physically contiguous, one segment
 * for the device instead of one per 4 KiB page (engine.h). The advice is
 * only advice: where THP is off the ring has 4 KiB pages and the kernel
 * still merges the pages that happen to be contiguous. */
static int own_staging(tv__io *io, size_t total, bool big)
{
    void *p = NULL;
    size_t al = io->max_align > 4096 ? io->max_align : 4096;
    bool huge = big && total >= TV__IO_HUGE_PAGE;
    if (io->own_staging && (io->own_huge || !huge))
        return 0;
    if (huge && al < TV__IO_HUGE_PAGE)
        al = TV__IO_HUGE_PAGE;
    if (io->own_staging) {
        if (io->reg_base == io->own_staging)
            tv__io_uring_unregister(io);
        free(io->own_staging);
        io->own_staging = NULL;
        io->own_refused = false;
    }
    if (posix_memalign(&p, al, total))
        return -ENOMEM;
    if (huge)
        (void)madvise(p, total, MADV_HUGEPAGE);
    io->own_staging = p;
    io->own_huge = huge;
    return 0;
}

/* Points io->staging at this batch's staging: the sink's when it provides
 * one, else the engine's own (own_staging). With fixed_buffers, io_uring
 * registers it once a batch stages at least the whole ring. */
static int ensure_staging(batch *b)
{
    tv__io *io = b->io;
    size_t total = (size_t)io->qd * io->chunk_len;
    uint64_t staged = 0;
    int rc;
    if (b->staging_ready)
        return 0;
    for (size_t k = 0; k < b->n_st && staged < total; k++)
        staged += b->st[k].ee - b->st[k].eb;
    if (b->sink && b->sink->alloc_staging) {
        b->sink_staging = b->sink->alloc_staging(b->sink->ctx, total, io->max_align);
        if (b->sink_staging && ((uintptr_t)b->sink_staging % io->max_align)) {
            tv__log(TV_LOG_WARN, "sink staging %p not aligned to %u: not used", b->sink_staging,
                    io->max_align);
            if (b->sink->free_staging)
                b->sink->free_staging(b->sink->ctx, b->sink_staging);
            b->sink_staging = NULL;
        }
    }
    if (!b->sink_staging && (rc = own_staging(io, total, staged >= total)))
        return rc;
    io->staging = b->sink_staging ? b->sink_staging : io->own_staging;
    b->staging_ready = true;
    if (io->engine != TV_ENGINE_URING || !io->fixed || io->reg_base == io->staging ||
        (io->staging == io->own_staging && io->own_refused))
        return 0;
    /* Registering pins (and so faults in) the whole ring, milliseconds for
     * the default 32 MiB: a batch that stages less than the ring holds (a
     * first small tensor, a latency probe) reads into the unregistered ring,
     * touching only the pages it uses. Own staging, once registered, stays. */
    if (staged < total && io->staging == io->own_staging)
        return 0;
    if ((rc = tv__io_uring_register(io))) {
        tv__log(TV_LOG_INFO, "io_uring_register_buffers (%u x %llu bytes): %s; plain reads", io->qd,
                (unsigned long long)io->chunk_len, strerror(-rc));
        if (io->staging == io->own_staging)
            io->own_refused = true;
    }
    return 0;
}

/* Gives the sink's staging back (unregistered first); own staging stays. */
static void release_staging(batch *b)
{
    tv__io *io = b->io;
    if (b->sink_staging) {
        if (io->engine == TV_ENGINE_URING && io->reg_base == b->sink_staging)
            tv__io_uring_unregister(io);
        if (b->sink->free_staging)
            b->sink->free_staging(b->sink->ctx, b->sink_staging);
        b->sink_staging = NULL;
    }
    io->staging = NULL;
}

static void exec_round(batch *b)
{
    tv__io *io = b->io;
    int rc;

    if (b->n_st && !b->fatal && (rc = ensure_staging(b))) {
        b->fatal = rc;
        return;
    }
    for (;;) {
        while (!b->fatal && b->n_free) {
            uint32_t oi = b->free_ops[b->n_free - 1];
            if (!next_run(b, oi))
                break;
            tv__io_op *op = &io->ops[oi];
            b->n_free--;
            op->inflight = true;
            b->n_inflight++;
            if (b->dead[op->dev]) {
                op->result = TV_E_TIMEOUT;
                complete(b, oi);
                continue;
            }
            if (!op->to_dest && b->sink && b->sink->wait_slot &&
                (rc = b->sink->wait_slot(b->sink->ctx, oi))) {
                b->fatal = rc;
                op->result = rc;
                complete(b, oi);
                break;
            }
            rc = io->engine == TV_ENGINE_URING ? tv__io_uring_submit(io, oi)
                                               : tv__io_pread_submit(io, oi);
            if (rc) {
                op->result = rc;
                complete(b, oi);
            }
        }
        if (io->engine == TV_ENGINE_URING && (rc = tv__io_uring_flush(io)))
            goto ring_failed;
        if (!b->n_inflight)
            return;
        uint32_t oi = 0;
        rc =
            io->engine == TV_ENGINE_URING ? tv__io_uring_reap(io, &oi) : tv__io_pread_reap(io, &oi);
        if (rc == 0)
            complete(b, oi);
        else if (rc == TV_E_TIMEOUT)
            on_timeout(b);
        else
            goto ring_failed;
    }
ring_failed:
    /* The ring cannot tell which reads are still running: nothing of this
     * engine is reused (its staging stays allocated until destroy). */
    tv__log(TV_LOG_ERROR, "io_uring failed with %d reads in flight: %s", b->n_inflight,
            strerror(-rc));
    io->broken = true;
    b->fatal = rc;
    for (uint32_t i = 0; i < io->qd; i++)
        if (io->ops[i].inflight) {
            io->ops[i].result = rc;
            complete(b, i);
        }
}

int tv__io_run(tv__io *io, tv__io_req *reqs, size_t n, const tv__io_sink *sink, tv_error *err)
{
    batch b = {0};
    segv cur = {0};
    int rc = 0;

    if (!io || (!reqs && n) || n > UINT32_MAX)
        return tv__seterr(err, TV_E_INVALID_ARG, "io run: NULL engine or requests, or %zu requests",
                          n);
    if (io->broken) {
        for (size_t i = 0; i < n; i++)
            reqs[i].result = TV_E_INTERNAL;
        return tv__seterr(err, TV_E_INTERNAL, "io engine unusable after an io_uring failure");
    }
    b.io = io;
    b.reqs = reqs;
    b.n = n;
    b.sink = sink;
    b.ferr_idx = n;
    b.rq = calloc(n ? n : 1, sizeof(*b.rq));
    b.assigned = calloc(io->n_devs, sizeof(*b.assigned));
    b.dead = calloc(io->n_devs, sizeof(*b.dead));
    b.free_ops = calloc(io->qd, sizeof(*b.free_ops));
    if (!b.rq || !b.assigned || !b.dead || !b.free_ops) {
        rc = -ENOMEM;
        goto nomem;
    }
    for (uint32_t i = 0; i < io->qd; i++)
        b.free_ops[i] = io->qd - 1 - i;
    b.n_free = io->qd;

    for (size_t i = 0; i < n; i++)
        validate(&b, i);
    if ((rc = plan_first_round(&b, &cur)))
        goto nomem;

    while (cur.n && !b.fatal) {
        plan_round(&b, &cur);
        exec_round(&b);
        free(cur.v);
        cur = b.retry;
        b.retry = (segv){0};
        place_retries(&b, &cur);
    }
    free(cur.v);
    free(b.retry.v);
    if (b.staging_ready)
        release_staging(&b);

    for (size_t i = 0; i < n; i++) {
        if (reqs[i].result != PENDING)
            continue;
        if (b.rq[i].remaining == 0)
            reqs[i].result = 0;
        else
            set_fail(&b, i, b.fatal ? b.fatal : TV_E_INTERNAL, "%llu of %llu bytes not delivered",
                     (unsigned long long)b.rq[i].remaining, (unsigned long long)b.rq[i].span);
    }
    if (sink && sink->finish && (rc = sink->finish(sink->ctx)))
        for (size_t i = 0; i < n; i++)
            if (reqs[i].result == 0 && reqs[i].len)
                set_fail(&b, i, rc, "destination did not complete");
    rc = 0;
    if (b.ferr_idx < n) {
        rc = b.ferr.code;
        if (err)
            *err = b.ferr;
    }
    goto out;
nomem:
    free(cur.v);
    for (size_t i = 0; i < n; i++)
        reqs[i].result = -ENOMEM;
    if (sink && sink->finish)
        sink->finish(sink->ctx);
    rc = tv__seterr(err, -ENOMEM, "io run: out of memory planning %zu requests", n);
out:
    free(b.rq);
    free(b.assigned);
    free(b.dead);
    free(b.free_ops);
    return rc;
}
