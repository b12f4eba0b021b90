/* The job pool of tensorvaultd: imports and verifies run in a few worker
 * threads over one writer store, each worker with its own store handle
 * (tv__store_open_worker: own registry connection and device fds), so that
 * several imports write their own extents at once while the registry
 * serialises the metadata transactions.
 *
 * Invariants:
 *   - every job is a row (tv__reg_job_*) before it is queued; its progress
 *     (step, the step's bytes done / total, rate) is written when a step
 *     begins and when its first bytes move, in between at most every 250 ms
 *     and at least every second while bytes move, and the row ends succeeded,
 *     failed (error code, errno, message) or cancelled;
 *   - the queue holds at most queue_len queued jobs (TV_E_BUSY beyond);
 *   - a cancel is a flag polled by the importer between chunks and steps
 *     and by every transfer of a remote source at least once a second (a
 *     stalled one too): the import then publishes nothing and releases its
 *     reservations; nobody waits for it (tv__jobs_cancel returns at once);
 *     tv__jobs_stop cancels every queued and running job and joins, which
 *     for a remote import takes about a second whatever the far end does;
 *   - a job left running by a crash is failed at the next start by
 *     tv__reg_reclaim_writing (tv__store_open as writer).
 * Results (tv__reg_job.result_json): ImportResult and VerifyResult of
 * docs/openapi.yaml, the same documents local-mode `tensorvault
 * import/verify --json` print (tv__jobs_run_inline). */
#ifndef TV_JOBS_JOBS_H
#define TV_JOBS_JOBS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "registry/registry.h"
#include "store/store.h"

#define TV__JOBS_DEFAULT_WORKERS 2
#define TV__JOBS_DEFAULT_QUEUE   16

typedef struct tv__jobs tv__jobs;

typedef struct tv__job_spec {
    tv__job_kind kind;
    const char *model, *source, *alias; /* import: model and source; alias may be NULL */
    bool activate, strict;
    int64_t device_id; /* verify: 0 = every device */
    /* import: a fleet pull (import/source.h; copied, the caller may free its
     * own at once; its on_bad_file is called from the worker) read instead
     * of source (still the row's source), and the generation number to
     * publish as (0 = the next). */
    const struct tv__src_pull *pull;
    int64_t generation;
    /* import: a local source opened when the request was checked
     * (import/source.h), read instead of opening source by its path (still
     * the row's source). tv__jobs_submit and tv__jobs_run_inline take it
     * over whatever they return: it is closed when the job ends, is
     * cancelled or is refused, so queued jobs hold at most queue_len of them. */
    struct tv__src_local *local;
} tv__job_spec;

/* Starts n_workers (0 = TV__JOBS_DEFAULT_WORKERS) threads over writer store
 * st, which must outlive the pool; queue_len 0 = TV__JOBS_DEFAULT_QUEUE.
 * Returns 0 and *out; TV_E_INVALID_ARG (st not a writer); the errors of
 * tv__store_open_worker; -errno from pthread_create. */
int tv__jobs_start(tv__store *st, unsigned n_workers, size_t queue_len, tv__jobs **out,
                   tv_error *err);

/* Records a queued job and hands it to a worker. Returns 0 and *id (may be
 * NULL); TV_E_BUSY when queue_len jobs are already queued (no row is left);
 * TV_E_NAME (model, alias); TV_E_INVALID_ARG (missing model or source);
 * TV_E_STATE when the pool is stopping; the registry's errors. */
int tv__jobs_submit(tv__jobs *j, const tv__job_spec *spec, int64_t *id, tv_error *err);

/* Cancels a queued job at once (row cancelled) or asks a running one to
 * stop and returns without waiting: its worker finishes the row soon after
 * (within about a second: cancelled, or succeeded when the import had
 * already published). Returns 0; TV_E_NOT_FOUND; TV_E_STATE (already
 * finished). */
int tv__jobs_cancel(tv__jobs *j, int64_t id, tv_error *err);

/* Progress callback of tv__jobs_run_inline: the job row as just written. */
typedef void (*tv__job_watch_fn)(void *ctx, const tv__reg_job *now);

/* Runs one job in the calling thread on writer store st (CLI local mode):
 * the same row, progress and result JSON as a pooled job; watch (may be
 * NULL) sees every progress write and the final row. Returns the job's own
 * result: 0 when it succeeded, else its error code (the job row says the
 * same); *id (may be NULL) gets the job id whenever a row was created. */
int tv__jobs_run_inline(tv__store *st, const tv__job_spec *spec, tv__job_watch_fn watch, void *ctx,
                        int64_t *id, tv_error *err);

/* fn(ctx) is called by the worker after each import that succeeded (the
 * generation is ready in the registry), under the pool's lock: it must not
 * block (the fleet thread's kick). fn NULL = none. */
void tv__jobs_set_on_import(tv__jobs *j, void (*fn)(void *ctx), void *ctx);

/* Imports run strict (read back and re-hash) even when the spec does not
 * ask for it (config import.strict). */
void tv__jobs_set_strict_default(tv__jobs *j, bool strict);
/* import.http_*: how imports from an http(s):// source talk to the origin
 * (copied; before the first job). */
struct tv__src_http_opts;
void tv__jobs_set_http(tv__jobs *j, const struct tv__src_http_opts *o);
/* import.sidecar_max_bytes and import.sidecar_total_bytes (0: the
 * defaults, import/source.h); before the first job. */
void tv__jobs_set_sidecar_caps(tv__jobs *j, uint64_t max_len, uint64_t total_len);

/* Queued jobs waiting and jobs running now (zeros for NULL). They move in
 * one step with the rows' states: after a job's row reads running
 * (finished), a later call counts it running (no longer). */
void tv__jobs_counts(tv__jobs *j, size_t *queued, size_t *running);

/* Bytes written to devices by the imports this pool ran, since it started
 * (0 for NULL): tensorvault_imported_bytes_total of /metrics. Any thread. */
uint64_t tv__jobs_imported_bytes(tv__jobs *j);

/* Jobs by state from the registry: counts[tv__job_state] for the five
 * states. Returns 0 or the registry's errors (counts then undefined). */
int tv__jobs_count_states(tv__reg *reg, uint64_t counts[5]);

/* Cancels running and queued jobs (rows cancelled), joins the workers and
 * frees the pool. NULL-safe. */
void tv__jobs_stop(tv__jobs *j);

#endif
