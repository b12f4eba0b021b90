/* The read engine: executes batches of payload reads on O_DIRECT devices
 * with io_uring (a staging ring on huge pages, configurable queue depth and
 * chunk size) or, identically, with a pool of pread worker threads.
 *
 * Invariants:
 *   - every device read is an outward-aligned envelope: io_begin =
 *     align_down(off, io_align), io_end = align_up(off + len, io_align),
 *     checked arithmetic, and it never reaches past the device size;
 *   - a request's destination receives exactly [dest, dest + len) and
 *     nothing else: staged reads are copied out slice by slice; a direct
 *     read into dest happens only for host destinations when the envelope
 *     equals the payload (offset, length and dest all io_align-aligned)
 *     and shares no block with another request's envelope (touching is
 *     allowed for pieces of at least chunk_len / 4), or in envelope mode;
 *   - adjacent or overlapping envelopes on one device are coalesced into
 *     runs of at most chunk_len, so a whole-model batch is a sequential
 *     scan; a payload longer than chunk_len is split;
 *   - a request is complete (result 0) only when every byte arrived; a short
 *     read is retried for the rest, then fails with TV_E_SHORT_IO; an error
 *     on one replica is retried on the next replica of that request;
 *   - large requests with several replicas are split across replicas in
 *     proportion to each device's measured bandwidth (EWMA of completed
 *     reads, seeded equal);
 *   - the engine never mmaps a device; memory is the staging ring
 *     (queue_depth x chunk_len, at most TV__IO_MAX_STAGING, checked at
 *     create; replaced at most once, by its huge-page form, the old one
 *     freed first) plus a small fixed record per request and per chunk-sized
 *     piece, whatever the batch size, and the copy-out pool's piece list
 *     (at most 2 x chunk_len / 64 KiB + 2 records);
 *   - staged bytes bound for host memory are copied by copy_threads threads
 *     (io/copy.c), fork-join per read: a read's copies are all done before
 *     its staging slot is reused or its request counts them as delivered;
 *   - an excluded device is never read: its sources are dropped from every
 *     request before planning, so neither a split nor a retry reaches it;
 *   - when tv__io_run returns, no read is in flight: nothing writes into
 *     staging or into a destination afterwards (timed-out reads are
 *     cancelled and reaped first; a pread stuck in the kernel is waited
 *     for). The one exception is an io_uring failure that loses track of
 *     its reads (io_uring_enter itself failing): the engine then marks
 *     itself unusable and refuses every later batch with TV_E_INTERNAL.
 * An engine runs one batch at a time: tv__io_run must not be called
 * concurrently on one engine (use one engine per thread, or a lock). */
#ifndef TV_IO_ENGINE_H
#define TV_IO_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/internal.h"

#define TV__IO_MAX_REPLICAS         8
#define TV__IO_DEFAULT_QD           32
#define TV__IO_DEFAULT_CHUNK        (1u << 20)
#define TV__IO_MAX_QD               4096u        /* = TV_READ_MAX_QUEUE_DEPTH (tensorvault.h) */
#define TV__IO_MAX_CHUNK            (1u << 30)   /* io_uring's limit for one registered buffer */
#define TV__IO_MAX_STAGING          (1ull << 30) /* queue_depth x chunk_len: = TV_READ_MAX_STAGING */
#define TV__IO_MAX_COPY_THREADS     64u          /* = TV_READ_MAX_COPY_THREADS (tensorvault.h) */
#define TV__IO_DEFAULT_COPY_THREADS 4u           /* capped at the online CPUs */

typedef struct tv__io tv__io;

typedef struct tv__io_dev {
    int fd;              /* opened O_RDONLY (| O_DIRECT when direct) */
    uint32_t io_align;   /* power of two, >= 512 */
    uint64_t size_bytes; /* at most INT64_MAX; reads never pass it */
    bool direct;
    /* Failed validation (missing, resized, another store's label): never
     * read. The other fields are ignored (fd may be -1); a source on it is
     * dropped from its request's replicas before planning. */
    bool excluded;
} tv__io_dev;

/* Where a request's bytes go. NULL sink = host memcpy into dest. A custom
 * sink (the CUDA destination) may copy asynchronously: the engine calls
 * wait_slot before it overwrites staging slot `slot` (slot < queue_depth),
 * and finish once after the batch, whatever happened (a failing finish fails
 * every non-empty request that had succeeded). With a custom sink every byte
 * goes through copy (dest is opaque: never read into directly), called only
 * from the thread running tv__io_run; dest_off is the byte offset inside
 * the request's destination. copy, wait_slot and finish return 0 or an
 * error that aborts the batch (requests not yet complete fail with it).
 * Staging memory is allocated by the engine; alloc_staging, when set, lets
 * the sink provide it for one batch (pinned host memory for CUDA): len is
 * queue_depth x chunk_len, align the largest io_align; NULL falls back to
 * the engine's staging; free_staging (if set) releases it after the batch.
 * Members left NULL are skipped (copy NULL = memcpy). */
typedef struct tv__io_sink {
    void *ctx;
    int (*copy)(void *ctx, void *dest, uint64_t dest_off, const void *src, size_t n, uint32_t slot);
    int (*wait_slot)(void *ctx, uint32_t slot);
    int (*finish)(void *ctx);
    void *(*alloc_staging)(void *ctx, size_t len, size_t align);
    void (*free_staging)(void *ctx, void *p);
} tv__io_sink;

typedef struct tv__io_src {
    uint32_t dev; /* index into the engine's devices */
    uint64_t off; /* absolute device byte offset of the payload's first byte */
} tv__io_src;

typedef struct tv__io_req {
    uint32_t n_src; /* replicas holding the same bytes, >= 1 */
    tv__io_src src[TV__IO_MAX_REPLICAS];
    uint64_t len; /* payload bytes (0 is valid: completes at once) */
    void *dest;   /* len bytes (host) or a sink's destination */
    /* Zero-copy envelope mode: dest is an arena of at least the envelope
     * length of src[0] (tv__io_envelope with that device's io_align),
     * aligned to that io_align when the sink is the host; the whole envelope
     * is read into it (directly, for the host) and *payload_skip tells where
     * the payload starts (set even when len is 0). Another replica is used
     * (split or retry) only when the same envelope is aligned on its device
     * and fits in it; others are ignored for this request. */
    bool envelope_into_dest;
    uint64_t *payload_skip;
    /* out */
    int result; /* 0 (every byte arrived) or an error code */
} tv__io_req;

typedef struct tv__io_opts {
    int engine;            /* TV_ENGINE_AUTO / URING / PREAD (tensorvault.h) */
    uint32_t queue_depth;  /* 0 = TV__IO_DEFAULT_QD; at most TV__IO_MAX_QD */
    size_t chunk_len;      /* 0 = TV__IO_DEFAULT_CHUNK, lowered (to a multiple of the max
                              io_align) so that the staging fits TV__IO_MAX_STAGING; else
                              rounded up to the max io_align (checked); at most
                              TV__IO_MAX_CHUNK, and queue_depth x chunk_len at most
                              TV__IO_MAX_STAGING */
    uint32_t n_threads;    /* pread engine; 0 = min(queue_depth, 16); capped at queue_depth */
    uint32_t timeout_ms;   /* 0 = 30000: when no read completes for this long, every read
                              in flight fails with TV_E_TIMEOUT (io_uring cancels them; a
                              pread cannot be interrupted and is waited for) and the
                              device is not read again in this batch */
    uint32_t copy_threads; /* threads copying staged bytes into host destinations, the one
                              running tv__io_run included: 0 = min(online CPUs,
                              TV__IO_DEFAULT_COPY_THREADS); 1 = inline; at most
                              TV__IO_MAX_COPY_THREADS. Workers start on the first copy of
                              at least 128 KiB; sinks with their own copy never use them */
    bool fixed_buffers;    /* io_uring: register the staging ring as fixed buffers and read
                              into it with READ_FIXED (off by default: see below) */
} tv__io_opts;

/* Creates an engine over n_devs devices (copied; the fds stay the caller's);
 * excluded devices keep their index but are never read (at least one device
 * must not be excluded).
 * AUTO uses io_uring when io_uring_queue_init works, else the pread pool
 * (logged). Staging is allocated on the first batch that needs it: with
 * 4 KiB pages for a batch that stages less than the whole ring (a first
 * small read faults in only what it uses), on transparent huge pages
 * (2 MiB-aligned, MADV_HUGEPAGE) from the first batch that stages at least
 * the whole ring (the small staging is replaced then). Why: a device read
 * is cut into one segment per physically contiguous piece of its buffer;
 * a 1 MiB read into 4 KiB pages scattered in memory has 256 segments, more
 * than a virtio disk takes in one request (254 here), so every read was
 * split in two and the disk served more, smaller requests (measured: 1023
 * splits for 1024 reads of a 1 GiB load, 0.6-0.8 of the rate of reads into
 * huge pages; bench/README.md). Reads are plain IORING_OP_READ, for which
 * the kernel merges contiguous pages into one segment; with fixed_buffers
 * the ring is registered by the first batch that stages at least the whole
 * ring and read with READ_FIXED (registered 4 KiB pages are never merged,
 * so this only pays where pinning per read costs more than splitting);
 * when registration is refused (RLIMIT_MEMLOCK) plain reads are used, with
 * identical results.
 * Returns 0 and *out; TV_E_NOT_SUPPORTED (TV_ENGINE_URING asked and
 * io_uring unavailable: ENOSYS, EPERM, EACCES, EOPNOTSUPP); TV_E_INVALID_ARG
 * (NULL out, no devices or every device excluded, a negative fd, an
 * io_align that is not a power of two in [512, 1 GiB], a size over
 * INT64_MAX, an unknown engine, queue_depth or chunk_len over the limits,
 * staging over TV__IO_MAX_STAGING: the message names the values); -ENOMEM;
 * -errno from io_uring setup or pthread_create. */
int tv__io_create(const tv__io_dev *devs, size_t n_devs, const tv__io_opts *opts, tv__io **out,
                  tv_error *err);
/* Joins the pread workers, closes the ring, frees staging. NULL-safe. */
void tv__io_destroy(tv__io *io);

/* Which engine runs: TV_ENGINE_URING or TV_ENGINE_PREAD (TV_E_INVALID_ARG
 * for NULL). */
int tv__io_engine(const tv__io *io);
/* The chunk length in use (after defaults and rounding); 0 for NULL. */
uint64_t tv__io_chunk_len(const tv__io *io);

/* Executes n requests (blocking), with sink (NULL = host memcpy). Each
 * request's result is set. Returns 0 when all succeeded, else the first
 * failed request's code (lowest index), with err naming the request index,
 * device, offset and cause. Validation errors (n_src 0 or over the maximum,
 * an unknown device, a source whose envelope passes its device's end,
 * overflow, a NULL dest with len > 0, envelope mode without payload_skip or
 * with a host arena not aligned to io_align or with src[0] on an excluded
 * device) fail that request with TV_E_INVALID_ARG before any I/O for it;
 * sources on excluded devices are dropped, and a request left with none
 * fails with TV_E_NO_REPLICA; the others still run. Read
 * failures: -errno from the device (EIO, ENXIO, ...), TV_E_SHORT_IO (a read
 * short twice), TV_E_TIMEOUT, each only after every usable replica failed;
 * errors of the sink. Returns TV_E_INVALID_ARG for a NULL io, NULL reqs with
 * n > 0 or n over UINT32_MAX; -ENOMEM (then no request ran and every result
 * is -ENOMEM). */
int tv__io_run(tv__io *io, tv__io_req *reqs, size_t n, const tv__io_sink *sink, tv_error *err);

/* Test hook: when set, called after every completed device read with the
 * device index, offset, length and a pointer to the result (bytes read or
 * -errno), which it may change to inject EIO, short reads, or a vanished
 * device. A retried remainder is a read of its own. Called from the thread
 * running tv__io_run (io_uring) or from the pread workers concurrently: it
 * must be thread-safe. Process-wide; NULL in production. */
typedef void (*tv__io_fault_fn)(uint32_t dev, uint64_t off, size_t len, int64_t *res);
extern tv__io_fault_fn tv__io_fault;

/* Computes the envelope of [off, off + len) for io_align (a power of two):
 * io_begin = align_down(off), io_end = align_up(off + len), payload_skip =
 * off - io_begin (len 0 gives the aligned block around off, or an empty
 * envelope at an aligned off). Output pointers may be NULL.
 * Returns 0; TV_E_OVERFLOW; TV_E_INVALID_ARG for an io_align that is 0 or
 * not a power of two. */
int tv__io_envelope(uint64_t off, uint64_t len, uint32_t io_align, uint64_t *io_begin,
                    uint64_t *io_end, uint64_t *payload_skip);

#endif
