/* TEMPORARY (issue 9): the API9.md seams of the daemon helper's job pool
 * (server/daemon/jobs.h) that are not on main yet, declared exactly as
 * API9.md says so that the api builds before they land. The block
 * disappears by itself once daemon/jobs.h exists; delete this file and
 * server/http/api_stub_tmp.c then. */
#ifndef TV_HTTP_API_SEAMS_TMP_H
#define TV_HTTP_API_SEAMS_TMP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "registry/registry.h"
#include "store/store.h"

#if !__has_include("daemon/jobs.h")
#define TV__API_SEAMS_TMP_JOBS 1
typedef struct tv__jobs tv__jobs;
typedef void (*tv__job_watch_fn)(void *ctx, const tv__reg_job *now);
void tv__jobs_counts(tv__jobs *j, size_t *queued, size_t *running);
typedef struct tv__job_spec {
    tv__job_kind kind;
    const char *model, *source, *alias;
    bool activate, strict;
    int64_t device_id;
} tv__job_spec;
int tv__jobs_submit(tv__jobs *j, const tv__job_spec *spec, int64_t *id, tv_error *err);
int tv__jobs_cancel(tv__jobs *j, int64_t id, tv_error *err);
int tv__jobs_run_inline(tv__store *st, const tv__job_spec *spec, tv__job_watch_fn watch, void *ctx,
                        int64_t *id, tv_error *err);
#endif

#endif
