/* Asynchronous single reads for an event loop (io/aio.h): io_uring with a
 * linked timeout per read (plain reads, or with fixed_buffers the region
 * registered lazily as fixed buffers: a sparse table of pieces, each pinned
 * by the first read into it), or a pread worker pool with the same results;
 * completions are announced on an eventfd and handed out by tv__aio_reap.
 *
 * Invariants:
 *   - an op is in exactly one state: free, queued (submitted, not flushed),
 *     busy (in the kernel or with a worker), done (waiting for reap);
 *     n_used counts every op that is not free, so at most queue_depth ops
 *     exist and the done ring (queue_depth indexes) never overflows;
 *   - io_uring: a busy op has exactly one read SQE outstanding, tagged with
 *     its index, linked to a timeout tagged UD_TIMEOUT (never reported);
 *     the ring has 2 x queue_depth SQ entries, so a read and its timeout
 *     always fit; the kernel reads the timeout's timespec (in the op) at
 *     submission; a read CQE of a busy op is the only thing that advances
 *     it, and a short read's rest is re-sent from reap (the loop thread);
 *   - io_uring pieces (fixed_buffers only; else no table, n_pieces 0, every
 *     op's piece -1 and every read plain): piece p is [p x piece_len, (p + 1) x piece_len) of
 *     the region, clipped to its end; its state is UNREG (table entry
 *     empty), REG (entry p holds exactly that range) or REFUSED (never
 *     tried again); states change only in the loop thread (flush), before
 *     any SQE that uses the entry is prepared, and a REG entry is never
 *     updated again until destroy unregisters the table after the last
 *     read's CQE;
 *   - an SQE the kernel never consumed (io_uring_enter failing) is turned
 *     into a NOP before its op completes with the error, so no read can
 *     land later in memory the caller took back;
 *   - pread: a worker owns an op from pop to push; destroy lets running
 *     reads finish and drops unstarted ones, then joins every worker;
 *   - the eventfd is readable whenever the done ring is not empty after a
 *     reap or flush returned (reap re-signals what it did not hand out). */
#include <errno.h>
#include <limits.h>
#include <liburing.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/uio.h>
#include <time.h>

#include "io/aio.h"
#include "io/engine.h"
#include "io/io_internal.h"
#include "tensorvault/tensorvault.h"
#include "util/sys.h"

#define AIO_MAX_QD          4096u
#define AIO_DEFAULT_QD      64u
#define AIO_MAX_THREADS     64u
#define AIO_DEFAULT_THREADS 8u
#define AIO_BUF_MAX         (1ull << 30) /* one read, one piece */
#define AIO_MAX_BUFS        16u          /* the region: at most 16 x AIO_BUF_MAX */
#define AIO_MAX_STALL       4u           /* short reads that advanced no aligned block */
#define AIO_DEFAULT_PIECE   (1u << 20)
#define AIO_MAX_PIECES      16384u /* the kernel's IORING_MAX_REG_BUFFERS */
#define AIO_MAX_REFUSALS    4u     /* refused piece registrations before the aio stops trying */

#define UD_TIMEOUT (1ull << 63)
#define UD_CANCEL  (1ull << 62)
#define UD_IGNORE  (1ull << 61)
#define UD_FLAGS   (UD_TIMEOUT | UD_CANCEL | UD_IGNORE)

enum { OP_FREE = 0, OP_QUEUED, OP_BUSY, OP_DONE };
enum { PIECE_UNREG = 0, PIECE_REG, PIECE_REFUSED };

typedef struct aio_op {
    int fd;
    uint32_t align;
    uint32_t dev;
    uint8_t *buf;
    uint64_t off, len, done;
    uint64_t tag;
    int32_t piece; /* the one piece holding [buf, buf + len), or -1 (spans two, or no table) */
    uint32_t n_again, n_stall;
    uint64_t t_start_ns;
    struct __kernel_timespec ts; /* linked timeout: read by the kernel at submission */
    int result;
    int state;
} aio_op;

struct tv__aio {
    int engine;
    uint32_t qd;
    uint8_t *region;
    size_t region_len;
    uint64_t timeout_ns;
    uint32_t n_threads;
    int efd;
    aio_op *ops;
    uint32_t *free_ids, n_free; /* stack of free op indexes */
    uint32_t *queued, n_queued; /* submitted, not flushed, in order */
    uint32_t n_used;            /* ops not free */
    /* done ring: pushed by the workers (pread) or the loop (io_uring) */
    pthread_mutex_t mu;
    bool mu_ok;
    uint32_t *dq, dq_head, dq_n;

    /* io_uring */
    struct io_uring ring;
    bool ring_ok;
    bool efd_registered;
    size_t piece_len;
    uint32_t n_pieces; /* entries of the sparse table (0: no table, plain reads) */
    uint8_t *piece_st; /* PIECE_* per piece */
    bool reg_stopped;  /* AIO_MAX_REFUSALS reached: no more registrations */
    uint32_t n_reg, n_refused;
    uint64_t n_fixed, n_plain;
    uint32_t n_busy; /* reads in the kernel */
    bool closing;

    /* pread pool */
    pthread_t *threads;
    uint32_t n_started;
    pthread_cond_t work_cv;
    bool cv_ok;
    bool stop;
    uint32_t *wq, wq_head, wq_n;
};

static atomic_bool g_told_no_table;
static atomic_bool g_told_refused;

#define now_ns tv__io_now_ns

static bool is_pow2(uint64_t v)
{
    return v && !(v & (v - 1));
}

/* Advances op after a read of [off + done, off + len) returned res (bytes
 * or -errno, after the fault hook). Returns 1 when the rest must be read
 * again, 0 when the op is finished with op->result set. Every read of an
 * aio is aligned, so the rest restarts at the aligned-down position (an
 * O_DIRECT fd needs it; a buffered one reads a few bytes twice). */
static int step(aio_op *op, int64_t res)
{
    uint64_t done;
    int s = tv__io_step_common(res, op->len, &op->done, &op->n_again, &op->result);
    if (s != TV__IO_STEP_SHORT)
        return s;
    if (res == 0) {
        op->result = TV_E_SHORT_IO; /* end of the device, or a read that gives nothing */
        return 0;
    }
    done = tv__align_down_u64(op->done + (uint64_t)res, op->align);
    if (done == op->done && ++op->n_stall > AIO_MAX_STALL) {
        op->result = TV_E_SHORT_IO;
        return 0;
    }
    op->done = done;
    return 1;
}

/* ---- done ring -------------------------------------------------------- */

static void push_done(tv__aio *a, uint32_t i)
{
    pthread_mutex_lock(&a->mu);
    a->ops[i].state = OP_DONE;
    a->dq[(a->dq_head + a->dq_n) % a->qd] = i;
    a->dq_n++;
    pthread_mutex_unlock(&a->mu);
}

static void signal_efd(tv__aio *a)
{
    eventfd_write(a->efd, 1);
}

/* ---- io_uring ----------------------------------------------------------- */

static void finish_busy(tv__aio *a, uint32_t i)
{
    a->n_busy--;
    push_done(a, i);
}

/* Every SQE the kernel has not consumed becomes a NOP (nothing will read
 * into its buffer); the reads among them fail with rc. */
static void neutralize(tv__aio *a, int rc)
{
    struct io_uring_sq *sq = &a->ring.sq;
    unsigned head = io_uring_smp_load_acquire(sq->khead);
    for (unsigned p = head; p != sq->sqe_tail; p++) {
        struct io_uring_sqe *sqe = &sq->sqes[sq->array[p & sq->ring_mask]];
        uint64_t ud = sqe->user_data;
        io_uring_prep_nop(sqe);
        io_uring_sqe_set_data64(sqe, UD_IGNORE);
        if (!(ud & UD_FLAGS) && ud < a->qd && a->ops[ud].state == OP_BUSY) {
            a->ops[ud].result = rc;
            finish_busy(a, (uint32_t)ud);
        }
    }
}

static void on_read(tv__aio *a, uint32_t i, int64_t res);

/* Handles every CQE waiting (read completions; timeouts, cancels and NOPs
 * are only counted by the kernel). */
static void collect(tv__aio *a)
{
    struct io_uring_cqe *cqe;
    while (io_uring_peek_cqe(&a->ring, &cqe) == 0) {
        uint64_t ud = io_uring_cqe_get_data64(cqe);
        int64_t res = cqe->res;
        io_uring_cqe_seen(&a->ring, cqe);
        if (ud & UD_FLAGS)
            continue;
        if (ud >= a->qd || a->ops[ud].state != OP_BUSY)
            continue; /* cannot happen: one read SQE per busy op */
        on_read(a, (uint32_t)ud, res);
    }
}

/* Sends every prepared SQE. Transient refusals (a full completion queue,
 * no memory for requests, a signal) are retried after handling the CQEs
 * waiting; a lasting failure neutralizes what the kernel did not take.
 * Returns 0 or -errno. */
static int ring_submit(tv__aio *a)
{
    unsigned spins = 0;
    int rc = 0;
    for (;;) {
        rc = io_uring_submit(&a->ring);
        if (rc >= 0 && io_uring_sq_ready(&a->ring) == 0)
            return 0;
        if ((rc >= 0 || rc == -EINTR || rc == -EAGAIN || rc == -EBUSY) && ++spins < 1000) {
            collect(a);
            continue;
        }
        if (rc >= 0)
            rc = -EIO;
        break;
    }
    tv__log(TV_LOG_ERROR, "aio: io_uring_submit: %s: the %u entries not sent fail", strerror(-rc),
            io_uring_sq_ready(&a->ring));
    neutralize(a, rc);
    return rc;
}

/* Prepares the read of op i's rest and its linked timeout (the time left
 * until the op's deadline, at least 1 ms). */
static int prep_read(tv__aio *a, uint32_t i)
{
    aio_op *op = &a->ops[i];
    struct io_uring_sqe *sqe, *tsqe;
    int rc;
    if (io_uring_sq_space_left(&a->ring) < 2 && (rc = ring_submit(a)))
        return rc;
    sqe = io_uring_get_sqe(&a->ring);
    tsqe = sqe ? io_uring_get_sqe(&a->ring) : NULL;
    if (!tsqe)
        return -EBUSY; /* cannot happen: 2 x queue_depth entries */
    uint8_t *buf = op->buf + op->done;
    unsigned n = (unsigned)(op->len - op->done);
    uint64_t off = op->off + op->done;
    if (op->piece >= 0 && a->piece_st[op->piece] == PIECE_REG) {
        io_uring_prep_read_fixed(sqe, op->fd, buf, n, off, op->piece);
        a->n_fixed++;
    } else {
        io_uring_prep_read(sqe, op->fd, buf, n, off);
        a->n_plain++;
    }
    sqe->flags |= IOSQE_IO_LINK;
    io_uring_sqe_set_data64(sqe, i);
    uint64_t spent = now_ns() - op->t_start_ns;
    uint64_t left = spent < a->timeout_ns ? a->timeout_ns - spent : 0;
    if (left < 1000000ull)
        left = 1000000ull;
    op->ts.tv_sec = (long long)(left / 1000000000ull);
    op->ts.tv_nsec = (long long)(left % 1000000000ull);
    io_uring_prep_link_timeout(tsqe, &op->ts, 0);
    io_uring_sqe_set_data64(tsqe, UD_TIMEOUT | i);
    return 0;
}

static void on_read(tv__aio *a, uint32_t i, int64_t res)
{
    aio_op *op = &a->ops[i];
    bool late = now_ns() - op->t_start_ns >= a->timeout_ns;
    tv__io_fault_apply(op->dev, op->off + op->done, op->len - op->done, &res);
    if (res == -ECANCELED && !a->closing) {
        op->result = TV_E_TIMEOUT; /* only the linked timeout cancels a read */
    } else if (step(op, res)) {
        int rc;
        if (a->closing) {
            op->result = -ECANCELED;
        } else if (late) {
            op->result = TV_E_TIMEOUT;
        } else if ((rc = prep_read(a, i)) == 0) {
            ring_submit(a); /* on failure the op was failed there */
            return;
        } else {
            op->result = rc;
        }
    }
    finish_busy(a, i);
}

/* Registers piece p (pins its pages) the first time a read targets it; a
 * refusal leaves the piece to plain reads. */
static void register_piece(tv__aio *a, uint32_t p)
{
    if (a->piece_st[p] != PIECE_UNREG || a->reg_stopped)
        return;
    size_t at = (size_t)p * a->piece_len; /* checked: p < n_pieces, at < region_len */
    size_t l = a->region_len - at < a->piece_len ? a->region_len - at : a->piece_len;
    struct iovec iov = {.iov_base = a->region + at, .iov_len = l};
    int rc = io_uring_register_buffers_update_tag(&a->ring, p, &iov, NULL, 1);
    if (rc == 1) {
        a->piece_st[p] = PIECE_REG;
        a->n_reg++;
        return;
    }
    if (rc >= 0)
        rc = -EIO;
    a->piece_st[p] = PIECE_REFUSED;
    if (++a->n_refused >= AIO_MAX_REFUSALS)
        a->reg_stopped = true;
    if (!atomic_exchange(&g_told_refused, true))
        tv__log(
            TV_LOG_INFO,
            "aio: registering fixed buffer %u (%zu bytes at region offset %zu): %s; plain reads into it",
            p, l, at, strerror(-rc));
}

static int uring_flush(tv__aio *a)
{
    int rc = 0;
    uint64_t t = now_ns();
    for (uint32_t k = 0; k < a->n_queued; k++) {
        uint32_t i = a->queued[k];
        aio_op *op = &a->ops[i];
        if (op->piece >= 0)
            register_piece(a, (uint32_t)op->piece);
        op->state = OP_BUSY;
        op->t_start_ns = t;
        a->n_busy++;
        if ((rc = prep_read(a, i))) {
            op->result = rc;
            finish_busy(a, i);
        }
    }
    a->n_queued = 0;
    int src = ring_submit(a);
    return src ? src : rc;
}

static int uring_init(tv__aio *a)
{
    int rc = tv__io_ring_init(2 * a->qd, &a->ring, 4 * a->qd);
    if (rc < 0)
        return rc;
    a->ring_ok = true;
    return 0;
}

bool tv__aio_test_no_sparse = false;

/* Registers an empty (sparse) fixed-buffer table of one entry per piece:
 * nothing is pinned. Where the kernel has no sparse tables (< 5.19) every
 * piece is registered at once instead (the same indexes; what the region
 * costs is then paid here), and only if that is refused too are the reads
 * plain. Returns 0 or -ENOMEM. */
static int uring_table(tv__aio *a, uint32_t n_pieces)
{
    if (!(a->piece_st = calloc(n_pieces, 1)))
        return -ENOMEM;
    int rc =
        tv__aio_test_no_sparse ? -EINVAL : io_uring_register_buffers_sparse(&a->ring, n_pieces);
    if (rc == 0) {
        a->n_pieces = n_pieces;
        return 0;
    }
    struct iovec *iov = calloc(n_pieces, sizeof(*iov));
    if (!iov)
        return -ENOMEM;
    for (uint32_t p = 0; p < n_pieces; p++) {
        size_t at = (size_t)p * a->piece_len; /* checked: p < n_pieces, at < region_len */
        iov[p].iov_base = a->region + at;
        iov[p].iov_len = a->region_len - at < a->piece_len ? a->region_len - at : a->piece_len;
    }
    int rc2 = io_uring_register_buffers(&a->ring, iov, n_pieces);
    free(iov);
    if (rc2 == 0) {
        a->n_pieces = n_pieces;
        memset(a->piece_st, PIECE_REG, n_pieces);
        a->n_reg = n_pieces;
        return 0;
    }
    if (!atomic_exchange(&g_told_no_table, true))
        tv__log(
            TV_LOG_INFO,
            "aio: io_uring_register_buffers_sparse (%u pieces of %zu bytes): %s; the whole region: %s; plain reads",
            n_pieces, a->piece_len, strerror(-rc), strerror(-rc2));
    return 0;
}

/* Cancels every busy read and waits until each one's CQE arrived. */
static void uring_fini(tv__aio *a)
{
    if (!a->ring_ok)
        return;
    a->closing = true;
    for (uint32_t i = 0; i < a->qd; i++) {
        if (a->ops[i].state != OP_BUSY)
            continue;
        struct io_uring_sqe *sqe = io_uring_get_sqe(&a->ring);
        if (!sqe) {
            ring_submit(a);
            sqe = io_uring_get_sqe(&a->ring);
        }
        if (!sqe)
            break; /* then the reads are simply waited for */
        io_uring_prep_cancel64(sqe, i, 0);
        io_uring_sqe_set_data64(sqe, UD_CANCEL | i);
    }
    ring_submit(a);
    while (a->n_busy) {
        struct io_uring_cqe *cqe = NULL;
        int rc = io_uring_wait_cqe(&a->ring, &cqe);
        if (rc == -EINTR || rc == -EAGAIN)
            continue;
        if (rc < 0) {
            tv__log(TV_LOG_ERROR, "aio: waiting for %u reads in flight: %s", a->n_busy,
                    strerror(-rc));
            break;
        }
        collect(a);
    }
    if (a->n_pieces)
        io_uring_unregister_buffers(&a->ring);
    if (a->efd_registered)
        io_uring_unregister_eventfd(&a->ring);
    io_uring_queue_exit(&a->ring);
    a->ring_ok = false;
}

/* ---- pread pool --------------------------------------------------------- */

static void pread_op(tv__aio *a, aio_op *op)
{
    uint64_t t0 = now_ns();
    for (;;) {
        if (!step(op, tv__io_pread_faulted(op->fd, op->dev, op->buf + op->done, op->off + op->done,
                                           op->len - op->done)))
            break;
        if (now_ns() - t0 >= a->timeout_ns)
            break;
    }
    /* A pread cannot be interrupted: one that outlived the timeout is
     * reported as the timeout when it returns. */
    if (now_ns() - t0 >= a->timeout_ns)
        op->result = TV_E_TIMEOUT;
}

static void *worker(void *arg)
{
    tv__aio *a = arg;
    pthread_mutex_lock(&a->mu);
    for (;;) {
        while (!a->stop && a->wq_n == 0)
            pthread_cond_wait(&a->work_cv, &a->mu);
        if (a->stop)
            break; /* destroy: reads not started are dropped */
        uint32_t i = a->wq[a->wq_head];
        a->wq_head = (a->wq_head + 1) % a->qd;
        a->wq_n--;
        pthread_mutex_unlock(&a->mu);

        pread_op(a, &a->ops[i]);

        pthread_mutex_lock(&a->mu);
        a->ops[i].state = OP_DONE;
        a->dq[(a->dq_head + a->dq_n) % a->qd] = i;
        a->dq_n++;
        signal_efd(a);
    }
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

static int pread_init(tv__aio *a)
{
    int rc;
    a->wq = calloc(a->qd, sizeof(*a->wq));
    a->threads = calloc(a->n_threads, sizeof(*a->threads));
    if (!a->wq || !a->threads)
        return -ENOMEM;
    if ((rc = pthread_cond_init(&a->work_cv, NULL)))
        return -rc;
    a->cv_ok = true;
    for (uint32_t t = 0; t < a->n_threads; t++) {
        if ((rc = pthread_create(&a->threads[t], NULL, worker, a)))
            return -rc; /* fini joins the ones started */
        a->n_started++;
    }
    return 0;
}

static void pread_fini(tv__aio *a)
{
    if (a->cv_ok) {
        pthread_mutex_lock(&a->mu);
        a->stop = true;
        pthread_cond_broadcast(&a->work_cv);
        pthread_mutex_unlock(&a->mu);
        for (uint32_t t = 0; t < a->n_started; t++)
            pthread_join(a->threads[t], NULL);
        a->n_started = 0;
        pthread_cond_destroy(&a->work_cv);
        a->cv_ok = false;
    }
    free(a->threads);
    free(a->wq);
    a->threads = NULL;
    a->wq = NULL;
}

static int pread_flush(tv__aio *a)
{
    pthread_mutex_lock(&a->mu);
    for (uint32_t k = 0; k < a->n_queued; k++) {
        uint32_t i = a->queued[k];
        a->ops[i].state = OP_BUSY;
        a->wq[(a->wq_head + a->wq_n) % a->qd] = i;
        a->wq_n++;
    }
    if (a->n_queued)
        pthread_cond_broadcast(&a->work_cv);
    pthread_mutex_unlock(&a->mu);
    a->n_queued = 0;
    return 0;
}

/* ---- the interface ------------------------------------------------------ */

int tv__aio_create(const tv__aio_opts *opts, tv__aio **out, tv_error *err)
{
    tv__aio *a = NULL;
    tv__aio_opts o;
    int rc;
    if (!out)
        return tv__seterr(err, TV_E_INVALID_ARG, "aio: NULL out");
    *out = NULL;
    if (!opts)
        return tv__seterr(err, TV_E_INVALID_ARG, "aio: NULL options");
    o = *opts;
    if (o.engine != TV_ENGINE_AUTO && o.engine != TV_ENGINE_URING && o.engine != TV_ENGINE_PREAD)
        return tv__seterr(err, TV_E_INVALID_ARG, "aio: unknown engine %d", o.engine);
    if (!o.queue_depth)
        o.queue_depth = AIO_DEFAULT_QD;
    if (o.queue_depth > AIO_MAX_QD)
        return tv__seterr(err, TV_E_INVALID_ARG, "aio: queue depth %u over %u", o.queue_depth,
                          AIO_MAX_QD);
    if (!o.region || !o.region_len || ((uintptr_t)o.region & 4095u) || (o.region_len & 4095u) ||
        o.region_len > AIO_MAX_BUFS * AIO_BUF_MAX)
        return tv__seterr(
            err, TV_E_INVALID_ARG,
            "aio: region %p of %zu bytes (4096-aligned address and length, at most 16 GiB)",
            o.region, o.region_len);
    if (!o.n_threads)
        o.n_threads = o.queue_depth < AIO_DEFAULT_THREADS ? o.queue_depth : AIO_DEFAULT_THREADS;
    if (o.n_threads > AIO_MAX_THREADS)
        return tv__seterr(err, TV_E_INVALID_ARG, "aio: %u pread threads over %u", o.n_threads,
                          AIO_MAX_THREADS);
    if (o.n_threads > o.queue_depth)
        o.n_threads = o.queue_depth;
    if (!o.timeout_ms)
        o.timeout_ms = 30000;
    if (!o.piece_len)
        o.piece_len = AIO_DEFAULT_PIECE;
    if (o.piece_len % 4096u || o.piece_len > AIO_BUF_MAX)
        return tv__seterr(err, TV_E_INVALID_ARG,
                          "aio: piece_len %zu (a multiple of 4096 up to 1 GiB)", o.piece_len);
    /* piece_len <= 1 GiB and region_len <= 16 GiB: no overflow below */
    uint64_t n_pieces = o.region_len / o.piece_len + (o.region_len % o.piece_len != 0);
    if (n_pieces > AIO_MAX_PIECES) {
        /* the smallest multiple of piece_len that fits the table (a caller's
         * slot of piece_len bytes stays inside one piece); under 2 MiB here */
        uint64_t k = n_pieces / AIO_MAX_PIECES + (n_pieces % AIO_MAX_PIECES != 0);
        o.piece_len *= (size_t)k;
        n_pieces = o.region_len / o.piece_len + (o.region_len % o.piece_len != 0);
    }

    if (!(a = calloc(1, sizeof(*a))))
        return tv__seterr(err, -ENOMEM, "out of memory");
    a->efd = -1;
    a->qd = o.queue_depth;
    a->region = o.region;
    a->region_len = o.region_len;
    a->timeout_ns = (uint64_t)o.timeout_ms * 1000000ull;
    a->n_threads = o.n_threads;
    a->piece_len = o.piece_len;
    a->ops = calloc(a->qd, sizeof(*a->ops));
    a->free_ids = calloc(a->qd, sizeof(*a->free_ids));
    a->queued = calloc(a->qd, sizeof(*a->queued));
    a->dq = calloc(a->qd, sizeof(*a->dq));
    if (!a->ops || !a->free_ids || !a->queued || !a->dq) {
        rc = tv__seterr(err, -ENOMEM, "out of memory");
        goto fail;
    }
    for (uint32_t i = 0; i < a->qd; i++)
        a->free_ids[i] = a->qd - 1 - i;
    a->n_free = a->qd;
    if ((rc = pthread_mutex_init(&a->mu, NULL))) {
        rc = tv__seterr(err, -rc, "aio: pthread_mutex_init: %s", strerror(rc));
        goto fail;
    }
    a->mu_ok = true;
    if ((a->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0) {
        rc = tv__seterr(err, -errno, "aio: eventfd: %s", strerror(errno));
        goto fail;
    }

    if (o.engine != TV_ENGINE_PREAD) {
        rc = tv__io_uring_choice(o.engine, uring_init(a), "aio: ", 2 * a->qd, a->n_threads, err);
        if (rc < 0)
            goto fail;
        a->engine = rc;
    }
    if (a->engine == TV_ENGINE_URING) {
        if ((rc = io_uring_register_eventfd(&a->ring, a->efd))) {
            rc = tv__seterr(err, rc, "aio: io_uring_register_eventfd: %s", strerror(-rc));
            goto fail;
        }
        a->efd_registered = true;
        if (o.fixed_buffers && (rc = uring_table(a, (uint32_t)n_pieces))) {
            rc = tv__seterr(err, rc, "out of memory");
            goto fail;
        }
    } else {
        a->engine = TV_ENGINE_PREAD;
        if ((rc = pread_init(a))) {
            rc = tv__seterr(err, rc, "aio: starting %u pread workers: %s", a->n_threads,
                            strerror(-rc));
            goto fail;
        }
    }
    *out = a;
    return 0;
fail:
    tv__aio_destroy(a);
    return rc;
}

void tv__aio_destroy(tv__aio *a)
{
    if (!a)
        return;
    uring_fini(a);
    pread_fini(a);
    if (a->efd >= 0)
        tv__sys.close(a->efd);
    if (a->mu_ok)
        pthread_mutex_destroy(&a->mu);
    free(a->ops);
    free(a->free_ids);
    free(a->queued);
    free(a->dq);
    free(a->piece_st);
    free(a);
}

int tv__aio_engine(const tv__aio *a)
{
    return a ? a->engine : TV_E_INVALID_ARG;
}

int tv__aio_event_fd(const tv__aio *a)
{
    return a ? a->efd : -1;
}

uint32_t tv__aio_in_flight(const tv__aio *a)
{
    return a ? a->n_used : 0;
}

int tv__aio_submit(tv__aio *a, int fd, uint32_t io_align, uint32_t dev, uint64_t off, void *buf,
                   size_t len, uint64_t tag, tv_error *err)
{
    uint64_t end, boff;
    uint8_t *b = buf;
    if (!a)
        return tv__seterr(err, TV_E_INVALID_ARG, "aio: NULL aio");
    if (fd < 0 || io_align < 512 || io_align > AIO_BUF_MAX || !is_pow2(io_align))
        return tv__seterr(err, TV_E_INVALID_ARG, "aio: read on device %u: fd %d, io_align %u", dev,
                          fd, io_align);
    if (len == 0 || len > AIO_BUF_MAX || tv__add_u64(off, len, &end) || end > INT64_MAX)
        return tv__seterr(
            err, TV_E_INVALID_ARG,
            "aio: read on device %u: %zu bytes at offset %llu (1 byte to 1 GiB, inside 2^63)", dev,
            len, (unsigned long long)off);
    boff = (uint64_t)((uintptr_t)b - (uintptr_t)a->region); /* huge when b is below */
    if (!b || (uintptr_t)b < (uintptr_t)a->region || boff > a->region_len ||
        len > a->region_len - boff)
        return tv__seterr(
            err, TV_E_INVALID_ARG,
            "aio: read on device %u: buffer %p of %zu bytes outside the region %p of %zu bytes",
            dev, buf, len, (void *)a->region, a->region_len);
    if ((off | len | (uint64_t)(uintptr_t)b) & (io_align - 1))
        return tv__seterr(
            err, TV_E_INVALID_ARG,
            "aio: read on device %u: offset %llu, length %zu or buffer %p not aligned to %u", dev,
            (unsigned long long)off, len, buf, io_align);
    if (a->n_used >= a->qd || !a->n_free)
        return tv__seterr(err, TV_E_BUSY, "aio: %u reads in flight or queued (queue depth %u)",
                          a->n_used, a->qd);
    uint32_t i = a->free_ids[--a->n_free];
    aio_op *op = &a->ops[i];
    *op = (aio_op){.fd = fd,
                   .align = io_align,
                   .dev = dev,
                   .buf = b,
                   .off = off,
                   .len = len,
                   .tag = tag,
                   .piece = -1,
                   .state = OP_QUEUED};
    /* checked: boff + len <= region_len (above), so the last byte's piece is exact */
    if (a->n_pieces && boff / a->piece_len == (boff + len - 1) / a->piece_len)
        op->piece = (int32_t)(boff / a->piece_len);
    a->queued[a->n_queued++] = i;
    a->n_used++;
    return 0;
}

int tv__aio_flush(tv__aio *a, tv_error *err)
{
    int rc;
    if (!a)
        return tv__seterr(err, TV_E_INVALID_ARG, "aio: NULL aio");
    if (!a->n_queued)
        return 0;
    rc = a->engine == TV_ENGINE_URING ? uring_flush(a) : pread_flush(a);
    pthread_mutex_lock(&a->mu);
    bool pending = a->dq_n > 0;
    pthread_mutex_unlock(&a->mu);
    if (pending)
        signal_efd(a);
    if (rc)
        return tv__seterr(err, rc, "aio: submitting reads: %s", strerror(-rc));
    return 0;
}

size_t tv__aio_reap(tv__aio *a, tv__aio_done *out, size_t max)
{
    eventfd_t v;
    size_t k = 0;
    bool more;
    if (!a || !out || !max)
        return 0;
    eventfd_read(a->efd, &v); /* drains it; EAGAIN when nothing was signalled */
    if (a->engine == TV_ENGINE_URING)
        collect(a);
    pthread_mutex_lock(&a->mu);
    while (k < max && a->dq_n) {
        uint32_t i = a->dq[a->dq_head];
        a->dq_head = (a->dq_head + 1) % a->qd;
        a->dq_n--;
        out[k].tag = a->ops[i].tag;
        out[k].result = a->ops[i].result;
        a->ops[i].state = OP_FREE;
        a->free_ids[a->n_free++] = i;
        a->n_used--;
        k++;
    }
    more = a->dq_n > 0;
    pthread_mutex_unlock(&a->mu);
    if (more)
        signal_efd(a);
    return k;
}

void tv__aio_get_stats(const tv__aio *a, tv__aio_stats *out)
{
    if (!out)
        return;
    *out = (tv__aio_stats){0};
    if (!a)
        return;
    out->piece_len = a->engine == TV_ENGINE_URING ? a->piece_len : 0;
    out->n_pieces = a->n_pieces;
    out->n_registered = a->n_reg;
    out->n_refused = a->n_refused;
    out->n_fixed_reads = a->n_fixed;
    out->n_plain_reads = a->n_plain;
}
