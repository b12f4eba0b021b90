/* TEMPORARY (issue 9): weak stand-ins for the daemon helper's job pool
 * (API9.md, see api_seams_tmp.h) until server/daemon/jobs.h is on main: the
 * file compiles to nothing once it is; delete it then. */
#include "http/api_seams_tmp.h"

#ifdef TV__API_SEAMS_TMP_JOBS
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/internal.h"

#define WEAK __attribute__((weak))
#endif

#ifdef TV__API_SEAMS_TMP_JOBS
WEAK void tv__jobs_counts(tv__jobs *j, size_t *queued, size_t *running)
{
    (void)j;
    *queued = 0;
    *running = 0;
}

WEAK int tv__jobs_submit(tv__jobs *j, const tv__job_spec *spec, int64_t *id, tv_error *err)
{
    (void)j, (void)spec, (void)id;
    return tv__seterr(err, TV_E_NOT_SUPPORTED, "the job pool is not in this build yet");
}

WEAK int tv__jobs_cancel(tv__jobs *j, int64_t id, tv_error *err)
{
    (void)j;
    return tv__seterr(err, TV_E_NOT_SUPPORTED, "job %lld: the job pool is not in this build yet",
                      (long long)id);
}

WEAK int tv__jobs_run_inline(tv__store *st, const tv__job_spec *spec, tv__job_watch_fn watch,
                             void *ctx, int64_t *id, tv_error *err)
{
    (void)st, (void)spec, (void)watch, (void)ctx, (void)id;
    return tv__seterr(err, TV_E_NOT_SUPPORTED, "inline jobs are not in this build yet");
}
#endif
