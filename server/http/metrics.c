/* Prometheus metrics of tensorvaultd (see metrics.h). Counters live in fixed
 * slot tables: a slot is claimed once under a mutex (its label copied, then
 * the table length published with release order) and afterwards only its
 * atomic counter changes, so feeders never block one another. */
#include "http/metrics.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jobs/jobs.h"
#include "fastpath/fastpath.h"
#include "tensorvault/version.h"
#include "util/internal.h"

#define ROUTE_MAX 112

typedef struct series {
    char route[ROUTE_MAX];
    int status; /* -1 for the read-bytes table */
    _Atomic uint64_t value;
} series;

typedef struct table {
    pthread_mutex_t lock;
    _Atomic size_t n;
    series s[TV__METRICS_MAX_SERIES];
} table;

static table g_requests = {.lock = PTHREAD_MUTEX_INITIALIZER};
static table g_read_bytes = {.lock = PTHREAD_MUTEX_INITIALIZER};
static _Atomic(const tv__fp *) g_fp; /* the daemon's fast path, or NULL */

/* Read latency histogram (seconds). */
static const double g_bounds[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                  0.1,    0.25,  0.5,    1,     2.5,  5,     10};
#define N_BOUNDS (sizeof(g_bounds) / sizeof(g_bounds[0]))
static _Atomic uint64_t g_hist[N_BOUNDS + 1]; /* last = +Inf only */
static _Atomic uint64_t g_hist_sum_ns;
static _Atomic uint64_t g_hist_count;

static series *find(table *t, const char *route, int status)
{
    if (!route)
        route = "other";
    size_t n = atomic_load_explicit(&t->n, memory_order_acquire);
    for (size_t i = 0; i < n; i++)
        if (t->s[i].status == status && strcmp(t->s[i].route, route) == 0)
            return &t->s[i];
    series *out = NULL;
    pthread_mutex_lock(&t->lock);
    n = atomic_load_explicit(&t->n, memory_order_relaxed);
    for (size_t i = 0; i < n && !out; i++)
        if (t->s[i].status == status && strcmp(t->s[i].route, route) == 0)
            out = &t->s[i];
    if (!out && n < TV__METRICS_MAX_SERIES - 1) {
        out = &t->s[n];
        snprintf(out->route, sizeof(out->route), "%s", route);
        out->status = status;
        atomic_store_explicit(&t->n, n + 1, memory_order_release);
    }
    if (!out) { /* full: one overflow slot, claimed once */
        for (size_t i = 0; i < n && !out; i++)
            if (t->s[i].status == status && strcmp(t->s[i].route, "other") == 0)
                out = &t->s[i];
        if (!out && n < TV__METRICS_MAX_SERIES) {
            out = &t->s[n];
            snprintf(out->route, sizeof(out->route), "other");
            out->status = status;
            atomic_store_explicit(&t->n, n + 1, memory_order_release);
        }
    }
    pthread_mutex_unlock(&t->lock);
    return out;
}

static bool is_data_route(const char *route)
{
    size_t n = route ? strlen(route) : 0;
    return n >= 5 && strcmp(route + n - 5, "/data") == 0;
}

void tv__metrics_request(const char *route, int status, uint64_t ns)
{
    series *s = find(&g_requests, route, status);
    if (s)
        atomic_fetch_add_explicit(&s->value, 1, memory_order_relaxed);
    if (!is_data_route(route))
        return;
    double sec = (double)ns / 1e9;
    size_t b = 0;
    while (b < N_BOUNDS && sec > g_bounds[b])
        b++;
    atomic_fetch_add_explicit(&g_hist[b], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&g_hist_sum_ns, ns, memory_order_relaxed);
    atomic_fetch_add_explicit(&g_hist_count, 1, memory_order_relaxed);
}

void tv__metrics_read_bytes(const char *route, uint64_t n)
{
    series *s = find(&g_read_bytes, route, -1);
    if (s)
        atomic_fetch_add_explicit(&s->value, n, memory_order_relaxed);
}

uint64_t tv__metrics_read_bytes_sum(void)
{
    tv__fp_stats st;
    uint64_t sum = 0;
    size_t n = atomic_load_explicit(&g_read_bytes.n, memory_order_acquire);
    for (size_t i = 0; i < n; i++)
        sum += atomic_load(&g_read_bytes.s[i].value);
    tv__fp_get_stats(atomic_load(&g_fp), &st);
    return sum + st.delivered_bytes;
}

void tv__metrics_reset(void)
{
    table *ts[] = {&g_requests, &g_read_bytes};
    for (size_t t = 0; t < 2; t++) {
        pthread_mutex_lock(&ts[t]->lock);
        atomic_store(&ts[t]->n, 0);
        memset(ts[t]->s, 0, sizeof(ts[t]->s));
        pthread_mutex_unlock(&ts[t]->lock);
    }
    for (size_t b = 0; b <= N_BOUNDS; b++)
        atomic_store(&g_hist[b], 0);
    atomic_store(&g_hist_sum_ns, 0);
    atomic_store(&g_hist_count, 0);
}

/* Prometheus label value: backslash, double quote and newline escaped. */
static void put_label(FILE *f, const char *v)
{
    for (; *v; v++) {
        if (*v == '\\' || *v == '"')
            fputc('\\', f), fputc(*v, f);
        else if (*v == '\n')
            fputs("\\n", f);
        else
            fputc(*v, f);
    }
}

static void render_jobs(FILE *f, tv__reg *reg, tv__jobs *jobs)
{
    static const char *const names[] = {"queued", "running", "succeeded", "failed", "cancelled"};
    uint64_t counts[5] = {0};
    bool have = tv__jobs_count_states(reg, counts) == 0;
    if (jobs) { /* the live pool is the truth for the unfinished states */
        size_t q = 0, r = 0;
        tv__jobs_counts(jobs, &q, &r);
        counts[0] = q, counts[1] = r;
        have = true;
    }
    if (!have)
        return;
    fputs("# HELP tensorvault_import_jobs Jobs (import and verify) by state.\n"
          "# TYPE tensorvault_import_jobs gauge\n",
          f);
    for (size_t i = 0; i < 5; i++)
        fprintf(f, "tensorvault_import_jobs{state=\"%s\"} %" PRIu64 "\n", names[i], counts[i]);
}

static void render_devices(FILE *f, tv__reg *reg)
{
    tv__reg_device *devs = NULL;
    size_t n = 0;
    if (!reg || tv__reg_device_list(reg, &devs, &n, NULL) != 0)
        return;
    uint64_t *used = calloc(n ? n : 1, sizeof(*used));
    if (!used)
        goto out;
    for (size_t i = 0; i < n; i++) {
        tv__reg_object *objs = NULL;
        size_t no = 0;
        if (tv__reg_objects_on_device(reg, devs[i].id, &objs, &no, NULL) == 0)
            for (size_t j = 0; j < no; j++)
                if (tv__add_u64(used[i], objs[j].alloc_len, &used[i]))
                    used[i] = UINT64_MAX;
        free(objs);
    }
    fputs("# HELP tensorvault_device_capacity_bytes Bytes of each device's data region.\n"
          "# TYPE tensorvault_device_capacity_bytes gauge\n",
          f);
    for (size_t i = 0; i < n; i++) {
        uint64_t end = devs[i].region_off + devs[i].region_len; /* checked by the registry */
        uint64_t cap = end > devs[i].data_off ? end - devs[i].data_off : 0;
        fprintf(f, "tensorvault_device_capacity_bytes{device=\"%" PRId64 "\",path=\"", devs[i].id);
        put_label(f, devs[i].path);
        fprintf(f, "\"} %" PRIu64 "\n", cap);
    }
    fputs(
        "# HELP tensorvault_device_used_bytes Bytes of each device held by objects (writing or committed).\n"
        "# TYPE tensorvault_device_used_bytes gauge\n",
        f);
    for (size_t i = 0; i < n; i++) {
        fprintf(f, "tensorvault_device_used_bytes{device=\"%" PRId64 "\",path=\"", devs[i].id);
        put_label(f, devs[i].path);
        fprintf(f, "\"} %" PRIu64 "\n", used[i]);
    }
out:
    free(used);
    free(devs);
}

static void render_generations(FILE *f, tv__reg *reg)
{
    uint64_t counts[4] = {0};
    tv__reg_model *models = NULL;
    size_t n = 0;
    if (!reg || tv__reg_models_list(reg, &models, &n, NULL) != 0)
        return;
    for (size_t i = 0; i < n; i++) {
        tv__reg_generation *gens = NULL;
        size_t ng = 0;
        if (tv__reg_generations_list(reg, models[i].name, &gens, &ng, NULL) == 0)
            for (size_t j = 0; j < ng; j++)
                if ((unsigned)gens[j].state < 4)
                    counts[gens[j].state]++;
        free(gens);
    }
    free(models);
    fputs("# HELP tensorvault_generations Generations by state.\n"
          "# TYPE tensorvault_generations gauge\n",
          f);
    for (int s = 0; s < 4; s++)
        fprintf(f, "tensorvault_generations{state=\"%s\"} %" PRIu64 "\n",
                tv__gen_state_name((tv__gen_state)s), counts[s]);
}

void tv__metrics_set_fastpath(const tv__fp *fp)
{
    atomic_store(&g_fp, fp);
}

/* The fast path's counters (zeros when it is off: the series stay). */
static void render_fastpath(FILE *f)
{
    tv__fp_stats st;
    tv__fp_get_stats(atomic_load(&g_fp), &st);
    static const struct {
        const char *name, *type, *help;
        size_t off;
    } m[] = {
        {"tensorvault_fastpath_sessions", "gauge", "Fast-path sessions connected now.",
         offsetof(tv__fp_stats, sessions)},
        {"tensorvault_fastpath_sessions_total", "counter", "Fast-path sessions accepted.",
         offsetof(tv__fp_stats, sessions_total)},
        {"tensorvault_fastpath_groups", "gauge",
         "Model generations open on the fast path (read groups).", offsetof(tv__fp_stats, groups)},
        {"tensorvault_fastpath_device_read_bytes_total", "counter",
         "Bytes the fast path read from devices into its staging arenas.",
         offsetof(tv__fp_stats, device_read_bytes)},
        {"tensorvault_fastpath_delivered_bytes_total", "counter",
         "Bytes the fast path delivered to sessions (summed over sessions).",
         offsetof(tv__fp_stats, delivered_bytes)},
        {"tensorvault_fastpath_shared_bytes_total", "counter",
         "Delivered bytes that came from a chunk another session caused to be read.",
         offsetof(tv__fp_stats, shared_bytes)},
        {"tensorvault_fastpath_readahead_bytes_total", "counter",
         "Bytes the fast path read ahead of sequential readers (in device_read_bytes too).",
         offsetof(tv__fp_stats, readahead_bytes)},
        {"tensorvault_fastpath_readahead_hit_bytes_total", "counter",
         "Read-ahead bytes a request then used.", offsetof(tv__fp_stats, readahead_hit_bytes)},
        {"tensorvault_fastpath_refused_total", "counter",
         "Fast-path OPENs refused (access rules, retired generations).",
         offsetof(tv__fp_stats, refused_total)},
        {"tensorvault_fastpath_protocol_errors_total", "counter",
         "Fast-path sessions closed for a protocol violation.",
         offsetof(tv__fp_stats, protocol_errors)},
        {"tensorvault_fastpath_views_total", "counter",
         "Fast-path view requests (read-only views of the memory tier).",
         offsetof(tv__fp_stats, views)},
        {"tensorvault_fastpath_views_refused_total", "counter",
         "Fast-path view requests refused (the views' budget, cache.bytes).",
         offsetof(tv__fp_stats, views_refused)},
        {"tensorvault_fastpath_member_stalls_total", "counter",
         "Read-group members left behind (no chunk taken for fastpath.share_wait_ms while the memory kept for them was needed).",
         offsetof(tv__fp_stats, member_stalls)},
        {"tensorvault_tier_hits_total", "counter",
         "Chunks a fast-path request found resident in the memory tier (no device read, no wait).",
         offsetof(tv__fp_stats, tier_hits)},
        {"tensorvault_tier_hit_bytes_total", "counter",
         "Bytes delivered from chunks found resident in the memory tier.",
         offsetof(tv__fp_stats, tier_hit_bytes)},
        {"tensorvault_tier_misses_total", "counter",
         "Chunks a fast-path request had to wait a device read for.",
         offsetof(tv__fp_stats, tier_misses)},
        {"tensorvault_tier_miss_bytes_total", "counter",
         "Bytes delivered from chunks a request waited a device read for.",
         offsetof(tv__fp_stats, tier_miss_bytes)},
        {"tensorvault_tier_budget_bytes", "gauge",
         "The memory tier's budget (cache.bytes; 0: no tier).",
         offsetof(tv__fp_stats, tier_budget_bytes)},
        {"tensorvault_tier_bound_bytes", "gauge",
         "The most bytes the tier keeps resident now: the budget plus the open groups' staging.",
         offsetof(tv__fp_stats, tier_bound_bytes)},
        {"tensorvault_tier_resident_bytes", "gauge",
         "Bytes resident (or being read) in the memory tier, every generation.",
         offsetof(tv__fp_stats, tier_resident_bytes)},
        {"tensorvault_tier_view_bytes", "gauge", "Bytes of the memory tier pinned by views.",
         offsetof(tv__fp_stats, tier_view_bytes)},
        {"tensorvault_tier_generations", "gauge",
         "Model generations with memory in the tier (open or kept after their last handle).",
         offsetof(tv__fp_stats, tier_generations)},
        {"tensorvault_tier_evictions_total", "counter",
         "Chunks evicted from the memory tier (their holes punched).",
         offsetof(tv__fp_stats, tier_evictions)},
        {"tensorvault_tier_evicted_bytes_total", "counter", "Bytes evicted from the memory tier.",
         offsetof(tv__fp_stats, tier_evicted_bytes)},
        {"tensorvault_tier_scrubbed_bytes_total", "counter",
         "Stray pages punched from the tier (a client touched a hole of its mapping).",
         offsetof(tv__fp_stats, tier_scrubbed_bytes)},
    };
    for (size_t i = 0; i < TV_ARRAY_LEN(m); i++) {
        uint64_t v;
        memcpy(&v, (const char *)&st + m[i].off, sizeof v);
        fprintf(f, "# HELP %s %s\n# TYPE %s %s\n%s %" PRIu64 "\n", m[i].name, m[i].help, m[i].name,
                m[i].type, m[i].name, v);
    }
    static const char *const kinds[] = {"small", "thp", "hugetlb"};
    fprintf(
        f,
        "# HELP tensorvault_tier_page_bytes The memory tier's page size, by kind (small, thp, hugetlb).\n"
        "# TYPE tensorvault_tier_page_bytes gauge\n"
        "tensorvault_tier_page_bytes{kind=\"%s\"} %" PRIu64 "\n",
        kinds[st.tier_pages < 3 ? st.tier_pages : 0], st.tier_page_bytes);
}

int tv__metrics_render(tv__reg *reg, tv__jobs *jobs, char **text, size_t *len)
{
    char *buf = NULL;
    size_t blen = 0;
    FILE *f = open_memstream(&buf, &blen);
    if (!f)
        return -ENOMEM;
    fprintf(f,
            "# HELP tensorvault_build_info Build of this tensorvaultd.\n"
            "# TYPE tensorvault_build_info gauge\n"
            "tensorvault_build_info{version=\"%s\"} 1\n",
            TV_VERSION_STRING);
    fprintf(f,
            "# HELP tensorvault_imported_bytes_total Bytes written to devices by imports.\n"
            "# TYPE tensorvault_imported_bytes_total counter\n"
            "tensorvault_imported_bytes_total %" PRIu64 "\n",
            tv__jobs_imported_bytes(jobs));

    fputs("# HELP tensorvault_read_bytes_total Tensor and blob bytes sent, by route.\n"
          "# TYPE tensorvault_read_bytes_total counter\n",
          f);
    size_t n = atomic_load_explicit(&g_read_bytes.n, memory_order_acquire);
    for (size_t i = 0; i < n; i++) {
        fputs("tensorvault_read_bytes_total{route=\"", f);
        put_label(f, g_read_bytes.s[i].route);
        fprintf(f, "\"} %" PRIu64 "\n", atomic_load(&g_read_bytes.s[i].value));
    }

    fputs("# HELP tensorvault_read_duration_seconds Latency of the tensor data route.\n"
          "# TYPE tensorvault_read_duration_seconds histogram\n",
          f);
    uint64_t cum = 0;
    for (size_t b = 0; b < N_BOUNDS; b++) {
        cum += atomic_load(&g_hist[b]);
        fprintf(f, "tensorvault_read_duration_seconds_bucket{le=\"%g\"} %" PRIu64 "\n", g_bounds[b],
                cum);
    }
    uint64_t count = atomic_load(&g_hist_count);
    fprintf(f,
            "tensorvault_read_duration_seconds_bucket{le=\"+Inf\"} %" PRIu64 "\n"
            "tensorvault_read_duration_seconds_sum %.9f\n"
            "tensorvault_read_duration_seconds_count %" PRIu64 "\n",
            count, (double)atomic_load(&g_hist_sum_ns) / 1e9, count);

    fputs("# HELP tensorvault_http_requests_total HTTP requests answered, by route and status.\n"
          "# TYPE tensorvault_http_requests_total counter\n",
          f);
    n = atomic_load_explicit(&g_requests.n, memory_order_acquire);
    for (size_t i = 0; i < n; i++) {
        fputs("tensorvault_http_requests_total{route=\"", f);
        put_label(f, g_requests.s[i].route);
        fprintf(f, "\",status=\"%d\"} %" PRIu64 "\n", g_requests.s[i].status,
                atomic_load(&g_requests.s[i].value));
    }
    render_jobs(f, reg, jobs);
    render_devices(f, reg);
    render_generations(f, reg);
    render_fastpath(f);
    if (fclose(f) != 0 || !buf) {
        free(buf);
        return -ENOMEM;
    }
    *text = buf;
    *len = blen;
    return 0;
}
