/* The read engine's asynchronous door, for an event loop (the fast-path
 * server): submit single aligned device reads into one registered region,
 * learn of completions through an eventfd, reap them without blocking.
 *
 * Invariants:
 *   - every read is [off, off + len) of a device fd into [buf, buf + len) of
 *     the region given at create; off, len and buf must be multiples of the
 *     read's io_align (the caller plans envelopes; tv__io_envelope): checked,
 *     TV_E_INVALID_ARG, nothing submitted;
 *   - io_uring when available, else a pread worker pool; identical
 *     results. Reads are plain IORING_OP_READ by default: the kernel cuts
 *     a read into one segment per physically contiguous piece of its
 *     buffer and merges neighbouring pages, while a registered buffer of
 *     4 KiB pages stays one segment per page, so a 1 MiB read into it
 *     passes a virtio disk's 254-segment limit and is split (measured on
 *     the fast path: 1107 splits and 2.6 x the device requests for a 1 GiB
 *     load, 0.84 of the plain reads' rate; bench/README.md);
 *   - with fixed_buffers, io_uring fixed buffers (IORING_OP_READ_FIXED),
 *     registered lazily: create registers a sparse buffer table of one
 *     entry per piece (the region cut in piece_len pieces, the last one
 *     shorter) and pins nothing; the first read into a piece registers
 *     (pins) that piece alone, at flush. A read inside one registered piece
 *     is READ_FIXED; a read spanning two pieces, or into a piece whose
 *     registration was refused (RLIMIT_MEMLOCK), or with no table (refused,
 *     kernel < 5.19) is a plain IORING_OP_READ (refusals logged once per
 *     process). A refused piece is not tried again; after a few refusals
 *     the aio stops registering;
 *   - a completion is reported once per submitted read, with result 0 only
 *     when all len bytes arrived: a short read is resubmitted for the rest
 *     (inside aio) and fails with TV_E_SHORT_IO when a resubmission returns
 *     0 bytes; errors are -errno. tv__io_fault (engine.h) sees every
 *     completed device read with the `dev` tag given at submit;
 *   - a read in flight longer than timeout_ms is cancelled and completes
 *     with TV_E_TIMEOUT (io_uring; the pread pool cannot interrupt a read
 *     and reports it when it returns);
 *   - tv__aio_destroy waits for every read in flight (cancels, then reaps),
 *     so no byte lands in the region after it returns.
 * One thread drives an aio (submit, flush, reap); the pread workers are
 * internal. */
#ifndef TV_IO_AIO_H
#define TV_IO_AIO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/internal.h"

typedef struct tv__aio tv__aio;

typedef struct tv__aio_opts {
    int engine;           /* TV_ENGINE_AUTO / URING / PREAD (tensorvault.h) */
    uint32_t queue_depth; /* reads in flight at most: 1..4096 (0 = 64) */
    void *region;         /* the memory reads land in (registered), region_len bytes, */
    size_t region_len;    /*   4096-aligned address and length, at most 1 GiB x 16 */
    uint32_t timeout_ms;  /* 0 = 30000 */
    uint32_t n_threads;   /* pread pool: 0 = min(queue_depth, 8) */
    size_t piece_len;     /* io_uring fixed-buffer piece: a multiple of 4096 up to 1 GiB
                             (0 = 1 MiB), raised to its smallest multiple that cuts the
                             region in at most 16384 pieces; the fast path passes its
                             slot_len, so that a slot lies inside one piece; checked
                             whether or not fixed_buffers is set */
    bool fixed_buffers;   /* io_uring: register the region's pieces as fixed buffers (pays
                             where pinning per read costs more than splitting: huge-page
                             regions, many small reads); off: plain reads, no table */
} tv__aio_opts;

/* What the fixed-buffer registration did so far (for tests and logs). */
typedef struct tv__aio_stats {
    size_t piece_len;       /* as chosen at create (0 for the pread pool) */
    uint32_t n_pieces;      /* entries of the sparse table (0: none, plain reads: the default) */
    uint32_t n_registered;  /* pieces registered (pinned) so far */
    uint32_t n_refused;     /* piece registrations refused (those pieces read plain) */
    uint64_t n_fixed_reads; /* read SQEs sent as READ_FIXED (resubmissions included) */
    uint64_t n_plain_reads; /* read SQEs sent as plain READ */
} tv__aio_stats;

typedef struct tv__aio_done {
    uint64_t tag; /* as given to tv__aio_submit */
    int result;   /* 0: every byte arrived; TV_E_SHORT_IO, TV_E_TIMEOUT, -errno */
} tv__aio_done;

/* Returns 0 and *out; TV_E_INVALID_ARG (bad opts: the message names them);
 * TV_E_NOT_SUPPORTED (URING asked for and unavailable); -ENOMEM; -errno. */
int tv__aio_create(const tv__aio_opts *opts, tv__aio **out, tv_error *err);
/* Waits for every read in flight, then frees. NULL-safe. */
void tv__aio_destroy(tv__aio *a);
/* TV_ENGINE_URING or TV_ENGINE_PREAD. */
int tv__aio_engine(const tv__aio *a);
/* An eventfd (EFD_NONBLOCK) that becomes readable when completions wait;
 * tv__aio_reap drains it. Owned by the aio. */
int tv__aio_event_fd(const tv__aio *a);
/* Reads in flight plus queued (the caller keeps it <= queue_depth). */
uint32_t tv__aio_in_flight(const tv__aio *a);

/* Queues one read of len bytes at device offset off of fd into buf (inside
 * the region), io_align the device's (power of two >= 512). dev is the tag
 * tv__io_fault sees; tag comes back in the completion. Nothing is sent to
 * the kernel before tv__aio_flush. Returns 0; TV_E_INVALID_ARG (alignment,
 * buf outside the region, len 0 or over 1 GiB); TV_E_BUSY (queue_depth
 * reads already in flight or queued). */
int tv__aio_submit(tv__aio *a, int fd, uint32_t io_align, uint32_t dev, uint64_t off, void *buf,
                   size_t len, uint64_t tag, tv_error *err);
/* Submits what is queued. Returns 0 or -errno (the queued reads then
 * complete with that error at the next reap). */
int tv__aio_flush(tv__aio *a, tv_error *err);
/* Up to max completions, without blocking. Returns how many (0 when none). */
size_t tv__aio_reap(tv__aio *a, tv__aio_done *out, size_t max);
/* Fills *out (zeros for NULL a); called from the thread that drives the aio. */
void tv__aio_get_stats(const tv__aio *a, tv__aio_stats *out);
/* Test hook: true makes tv__aio_create behave as on a kernel without sparse
 * buffer tables (< 5.19), which registers the whole region at create. */
extern bool tv__aio_test_no_sparse;

#endif
