/* Process-wide Prometheus metrics of tensorvaultd (text format 0.0.4, base
 * units, _total counters).
 *
 * Invariants: the feeders are lock-free on the hot path (atomic counters in
 * fixed slots; a new route label takes a mutex once); labels are route
 * templates ("GET /v1/models/{name}"), never raw paths, so the series count
 * stays bounded (at most TV__METRICS_MAX_SERIES; later ones count under
 * route="other"). Gauges (jobs, devices, generations) are read from the
 * registry when rendered; the fast path's counters from its atomics, the
 * bytes imports wrote from the job pool's (tv__jobs_imported_bytes). */
#ifndef TV_HTTP_METRICS_H
#define TV_HTTP_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "registry/registry.h"

#define TV__METRICS_MAX_SERIES 256

typedef struct tv__jobs tv__jobs;
typedef struct tv__fp tv__fp;

/* One HTTP request answered: route template (NULL = "other"), status, and
 * nanoseconds from its first byte to the last byte of the response. The data
 * routes (templates ending in "/data") also feed
 * tensorvault_read_duration_seconds. */
void tv__metrics_request(const char *route, int status, uint64_t ns);
/* Tensor bytes sent by a read route. */
void tv__metrics_read_bytes(const char *route, uint64_t n);
/* The fast path whose counters (tv__fp_get_stats) /metrics shows as
 * tensorvault_fastpath_*; NULL (the default, and before tv__fp_stop) shows
 * zeros. Any thread. */
void tv__metrics_set_fastpath(const tv__fp *fp);

/* Renders every metric; reg (a read connection used by this thread only)
 * gives devices, generations and jobs by state, jobs (may be NULL: zeros)
 * the live queue and the bytes its imports wrote. Returns 0 and *text (malloc'd, NUL-terminated)
 * and *len; -ENOMEM; the registry's errors (the gauges that need it are then left out, the counters
 * still rendered: a scrape never fails because of the registry). */
int tv__metrics_render(tv__reg *reg, tv__jobs *jobs, char **text, size_t *len);

/* Tensor bytes sent by the read routes plus the fast path's delivered bytes,
 * summed (the throughput history's read counter, http/history.h). */
uint64_t tv__metrics_read_bytes_sum(void);

/* Zeroes every counter (tests only). */
void tv__metrics_reset(void);

#endif
