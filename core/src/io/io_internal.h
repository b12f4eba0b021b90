/* Internals shared by the read engine's files: engine.c (validation,
 * planning, coalescing, completion), uring.c (io_uring backend) and pread.c
 * (pread worker pool); aio.c (the event loop's async reads) uses the
 * helpers that are not about struct tv__io (the read steps, the fault hook,
 * the engine choice). A backend only moves reads: it takes an op (one
 * aligned device range into one buffer), performs it with retries of short
 * reads through tv__io_op_step, calls the fault hook after every device
 * read, and hands the finished op back to the thread running tv__io_run.
 *
 * Invariants: op i always stages into slot i (io->staging + i * chunk_len),
 * so at most queue_depth reads are in flight and wait_slot(i) fences the
 * reuse of op i; an op belongs to a backend from submit until reap returns
 * it, and nobody else touches it meanwhile; every offset, length and buffer
 * of an op on an O_DIRECT device is io_align-aligned, also after a short
 * read (the remainder restarts at the aligned-down position). */
#ifndef TV_IO_INTERNAL_H
#define TV_IO_INTERNAL_H

#include <liburing.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "io/engine.h"

/* The staging ring's alignment when it is advised onto transparent huge
 * pages (the PMD size of x86-64 and 4 KiB-page arm64). */
#define TV__IO_HUGE_PAGE (2u << 20)

/* -EAGAIN / -EINTR completions re-issued at most this many times per op. */
#define TV__IO_MAX_AGAIN 64u

/* One copy of staged bytes into a host destination. */
typedef struct tv__io_piece {
    uint8_t *dst;
    const uint8_t *src;
    size_t n;
} tv__io_piece;

typedef struct tv__io_op {
    /* the read: [off, off + len) of device dev into buf */
    uint32_t dev;
    int fd;
    uint32_t align;
    bool o_direct; /* keep remainders aligned */
    uint8_t *buf;
    uint64_t off;
    uint64_t len;
    bool fixed; /* buf lies in registered buffer `slot` */
    uint32_t slot;
    /* progress, advanced by tv__io_op_step */
    uint64_t done;
    uint32_t n_short;
    uint32_t n_again;
    int result; /* final: 0 or an error */
    /* bookkeeping of the submitting thread */
    bool inflight;
    bool timed_out;
    uint64_t t_start_ns;
    uint64_t elapsed_ns;
    bool to_dest;          /* direct read into a request's destination */
    size_t seg_lo, seg_hi; /* staged: candidate segments; direct: seg_lo */
} tv__io_op;

struct tv__io {
    int engine; /* TV_ENGINE_URING or TV_ENGINE_PREAD */
    tv__io_dev *devs;
    uint32_t n_devs;
    uint32_t qd;
    uint64_t chunk_len;
    uint32_t max_align;
    uint32_t timeout_ms;
    uint32_t n_threads;
    double *bw;           /* per device: EWMA of bytes/s over completed reads */
    uint64_t *n_bw;       /* per device: samples taken (0: bw is only the seed) */
    tv__io_op *ops;       /* qd */
    uint8_t *own_staging; /* qd x chunk_len, allocated on first need */
    bool own_huge;        /* own_staging is 2 MiB-aligned and advised MADV_HUGEPAGE */
    bool fixed;           /* opts.fixed_buffers */
    uint8_t *staging;     /* this batch's staging (own or the sink's) */
    bool broken;          /* the ring failed in a way that left reads unaccounted */

    /* io_uring */
    struct io_uring ring;
    bool ring_ok;
    uint8_t *reg_base; /* staging registered as qd fixed buffers, or NULL */
    bool own_refused;  /* registering own_staging was refused: not retried */
    uint32_t n_unsubmitted;

    /* pread pool */
    pthread_t *threads;
    uint32_t n_started;
    pthread_mutex_t mu;
    pthread_cond_t work_cv, done_cv;
    bool sync_ok;
    bool stop;
    uint32_t *wq, wq_head, wq_n; /* submitted op indexes (ring of qd) */
    uint32_t *dq, dq_head, dq_n; /* finished op indexes (ring of qd) */

    /* copy-out pool (copy.c) */
    uint32_t cp_want; /* copy threads, the caller's included (1: inline) */
    bool cp_ready, cp_failed, cp_sync, cp_stop;
    pthread_t *cp_threads;
    uint32_t cp_started;
    pthread_mutex_t cp_mu;
    pthread_cond_t cp_work, cp_done;
    struct tv__io_piece *cp_v; /* cp_cap pieces */
    size_t cp_cap, cp_pend;    /* pieces collected for the next flush */
    size_t cp_n, cp_next, cp_fin;
};

/* What a read step decides (tv__io_step_common). */
enum { TV__IO_STEP_DONE = 0, TV__IO_STEP_AGAIN = 1, TV__IO_STEP_SHORT = 2 };

/* The part of a read step every backend shares: after a read of
 * [*done, len) of an op returned res (bytes or -errno, after the fault
 * hook): -EINTR / -EAGAIN: TV__IO_STEP_AGAIN while *n_again (counted up)
 * <= TV__IO_MAX_AGAIN, else final; another -errno (TV_E_INTERNAL below
 * INT_MIN), or more bytes than asked (TV_E_INTERNAL): final; all of it:
 * *done = len, *result 0. Final: TV__IO_STEP_DONE with *result set.
 * TV__IO_STEP_SHORT: 0 <= res < len - *done, nothing changed (the caller's
 * short-read policy decides). */
int tv__io_step_common(int64_t res, uint64_t len, uint64_t *done, uint32_t *n_again, int *result);

/* Lets the fault hook (engine.h), when one is set, see and change the
 * result res of a device read of [off, off + len) of device dev. */
void tv__io_fault_apply(uint32_t dev, uint64_t off, uint64_t len, int64_t *res);

/* One tv__sys.pread of [off, off + len) of fd into buf, through the fault
 * hook. Returns bytes or -errno. */
int64_t tv__io_pread_faulted(int fd, uint32_t dev, uint8_t *buf, uint64_t off, uint64_t len);

/* The backend after io_uring's init returned init_rc (0 or -errno) for an
 * engine that asked for want (TV_ENGINE_AUTO, _URING; never _PREAD): who
 * prefixes the messages ("" or "aio: "), entries is the ring size asked,
 * n_threads the pread workers of the fallback (logged). Returns
 * TV_ENGINE_URING, TV_ENGINE_PREAD (AUTO without io_uring), or the error
 * for _URING: TV_E_NOT_SUPPORTED (io_uring unavailable), else init_rc. */
int tv__io_uring_choice(int want, int init_rc, const char *who, unsigned entries,
                        uint32_t n_threads, tv_error *err);

/* Advances op after a device read of [off + done, off + len) returned res
 * (bytes or -errno, after the fault hook). Returns 1 when the op must be
 * read again from op->done (a first short read, EAGAIN, EINTR), 0 when it is
 * finished with op->result set (0, -errno, TV_E_SHORT_IO, TV_E_INTERNAL). */
int tv__io_op_step(tv__io_op *op, int64_t res);

/* Monotonic clock in nanoseconds. */
uint64_t tv__io_now_ns(void);

/* io_uring_queue_init_params for entries SQ entries (and cq_entries CQ
 * entries, 0 = the kernel's default) with IORING_SETUP_COOP_TASKRUN, or
 * without it where the kernel refuses it. Returns 0 or -errno. */
int tv__io_ring_init(unsigned entries, struct io_uring *ring, unsigned cq_entries);

/* io_uring backend (uring.c). init returns 0 or -errno. register returns 0
 * or -errno (then plain reads are used). reap returns 0 and the index of a
 * finished op, TV_E_TIMEOUT when nothing finished within timeout_ms, or
 * -errno when the ring failed. */
int tv__io_uring_init(tv__io *io);
void tv__io_uring_fini(tv__io *io);
int tv__io_uring_register(tv__io *io);
void tv__io_uring_unregister(tv__io *io);
int tv__io_uring_submit(tv__io *io, uint32_t op);
int tv__io_uring_flush(tv__io *io);
int tv__io_uring_reap(tv__io *io, uint32_t *op);
void tv__io_uring_cancel(tv__io *io, uint32_t op);

/* pread worker pool (pread.c): same contracts; cancel is impossible (a
 * pread cannot be interrupted), so timed-out ops are simply waited for. */
int tv__io_pread_init(tv__io *io);
void tv__io_pread_fini(tv__io *io);
int tv__io_pread_submit(tv__io *io, uint32_t op);
int tv__io_pread_reap(tv__io *io, uint32_t *op);

/* Copy-out pool (copy.c). copy_add copies [src, src + n) to dst: inline
 * when it is short or the pool is off or cannot start, else it is cut into
 * pieces kept for copy_flush, which copies every piece kept (on the workers
 * and the calling thread) and returns when all are done. Called only from
 * the thread running tv__io_run. fini joins the workers (NULL-safe fields). */
void tv__io_copy_add(tv__io *io, void *dst, const void *src, size_t n);
void tv__io_copy_flush(tv__io *io);
void tv__io_copy_fini(tv__io *io);
/* min(online CPUs, TV__IO_DEFAULT_COPY_THREADS). */
uint32_t tv__io_copy_default_threads(void);

#endif
