/* The recent throughput history of tensorvaultd: a ring of (time, read
 * bytes, import bytes) samples taken every TV__HISTORY_INTERVAL_MS by a
 * thread of the daemon and served by GET /v1/metrics/history, so that the
 * dashboard's chart starts with the last minutes instead of empty.
 *
 * Invariants: a sample holds the cumulative counters /metrics shows
 * (tensorvault_read_bytes_total summed over its routes plus
 * tensorvault_fastpath_delivered_bytes_total; tensorvault_imported_bytes_total),
 * so a rate is the difference of two samples over their time difference; a
 * ring keeps its newest `cap` samples and copies them out oldest first; the
 * process-wide ring has one mutex (the sampler pushes, requests copy), and at
 * most one sampler runs at a time. */
#ifndef TV_HTTP_HISTORY_H
#define TV_HTTP_HISTORY_H

#include <stddef.h>
#include <stdint.h>

#define TV__HISTORY_INTERVAL_MS 2000u
#define TV__HISTORY_SAMPLES     300u /* 10 minutes at 2 s */

typedef struct tv__jobs tv__jobs;
typedef struct tv__api_ctx tv__api_ctx;

typedef struct tv__history_sample {
    int64_t time_ms;       /* CLOCK_REALTIME, Unix milliseconds */
    uint64_t read_bytes;   /* cumulative */
    uint64_t import_bytes; /* cumulative */
} tv__history_sample;

/* A ring over caller-owned storage. */
typedef struct tv__history {
    tv__history_sample *s;
    size_t cap;  /* slots in s */
    size_t head; /* the slot the next push writes */
    size_t n;    /* samples held, <= cap */
} tv__history;

/* An empty ring over buf[cap]. Returns 0; -EINVAL (NULL h or buf, cap 0). */
int tv__history_init(tv__history *h, tv__history_sample *buf, size_t cap);
/* Appends x; a full ring drops its oldest sample. */
void tv__history_push(tv__history *h, const tv__history_sample *x);
/* Copies the newest min(n, max) samples, oldest first, into out; returns how
 * many. */
size_t tv__history_copy(const tv__history *h, tv__history_sample *out, size_t max);

/* The counters a sample holds, now (jobs NULL: no imports). */
void tv__history_now(tv__jobs *jobs, tv__history_sample *out);

typedef struct tv__history_sampler tv__history_sampler;

/* Empties the process-wide ring and starts the thread that pushes a sample
 * now and then every interval_ms (jobs: whose imported bytes; may be NULL).
 * Returns 0; -EINVAL (interval_ms 0, NULL out); -EBUSY (one runs already);
 * -ENOMEM; a pthread error (negative). */
int tv__history_start(tv__jobs *jobs, uint32_t interval_ms, tv__history_sampler **out);
/* Stops and joins the thread (the ring keeps its samples). NULL-safe. */
void tv__history_stop(tv__history_sampler *s);
/* Copies the process-wide ring, oldest first, into out[max]: *n samples and
 * the sampler's interval (*interval_ms, 0 when none runs). Returns 0;
 * -EINVAL (NULL out, n or interval_ms). */
int tv__history_snapshot(tv__history_sample *out, size_t max, size_t *n, uint32_t *interval_ms);

/* GET /v1/metrics/history: {interval_ms, samples: [{time_ms, read_bytes,
 * import_bytes}]}, oldest first. */
int tv__api_h_metrics_history(tv__api_ctx *c);

#endif
