/* The throughput history ring, its sampler thread and its route (see
 * history.h). The sampler sleeps on a condition variable of the monotonic
 * clock, so stopping it wakes it at once; it never holds the ring's mutex
 * while it reads the counters. */
#include "http/history.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "http/api_internal.h"
#include "http/metrics.h"
#include "jobs/jobs.h"
#include "util/internal.h"

int tv__history_init(tv__history *h, tv__history_sample *buf, size_t cap)
{
    if (!h || !buf || !cap)
        return -EINVAL;
    *h = (tv__history){.s = buf, .cap = cap};
    return 0;
}

void tv__history_push(tv__history *h, const tv__history_sample *x)
{
    h->s[h->head] = *x;
    h->head = (h->head + 1) % h->cap;
    if (h->n < h->cap)
        h->n++;
}

size_t tv__history_copy(const tv__history *h, tv__history_sample *out, size_t max)
{
    size_t k = h->n < max ? h->n : max;
    /* The oldest of the newest k sits k slots behind head. */
    size_t first = (h->head + h->cap - k) % h->cap;
    for (size_t i = 0; i < k; i++)
        out[i] = h->s[(first + i) % h->cap];
    return k;
}

void tv__history_now(tv__jobs *jobs, tv__history_sample *out)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    out->time_ms = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    out->read_bytes = tv__metrics_read_bytes_sum();
    out->import_bytes = tv__jobs_imported_bytes(jobs);
}

struct tv__history_sampler {
    pthread_t thread;
    pthread_mutex_t mu; /* stop */
    pthread_cond_t cv;
    bool stop;
    tv__jobs *jobs;
    uint32_t interval_ms;
};

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static tv__history_sample g_buf[TV__HISTORY_SAMPLES];
static tv__history g_ring = {.s = g_buf, .cap = TV__HISTORY_SAMPLES};
static uint32_t g_interval_ms; /* 0: no sampler */

static void *sampler_main(void *arg)
{
    tv__history_sampler *s = arg;
    struct timespec next;
    clock_gettime(CLOCK_MONOTONIC, &next);
    pthread_mutex_lock(&s->mu);
    while (!s->stop) {
        pthread_mutex_unlock(&s->mu);
        tv__history_sample x;
        tv__history_now(s->jobs, &x);
        pthread_mutex_lock(&g_mu);
        tv__history_push(&g_ring, &x);
        pthread_mutex_unlock(&g_mu);
        next.tv_sec += s->interval_ms / 1000;
        next.tv_nsec += (long)(s->interval_ms % 1000) * 1000000L;
        if (next.tv_nsec >= 1000000000L) {
            next.tv_sec++;
            next.tv_nsec -= 1000000000L;
        }
        pthread_mutex_lock(&s->mu);
        while (!s->stop && pthread_cond_timedwait(&s->cv, &s->mu, &next) != ETIMEDOUT)
            ;
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

int tv__history_start(tv__jobs *jobs, uint32_t interval_ms, tv__history_sampler **out)
{
    pthread_condattr_t ca;
    int rc = 0;
    if (!interval_ms || !out)
        return -EINVAL;
    *out = NULL;
    tv__history_sampler *s = calloc(1, sizeof *s);
    if (!s)
        return -ENOMEM;
    s->jobs = jobs;
    s->interval_ms = interval_ms;
    pthread_mutex_lock(&g_mu);
    if (g_interval_ms) {
        pthread_mutex_unlock(&g_mu);
        rc = -EBUSY;
        goto fail_alloc;
    }
    g_interval_ms = interval_ms;
    g_ring.head = g_ring.n = 0;
    pthread_mutex_unlock(&g_mu);
    if ((rc = -pthread_condattr_init(&ca)))
        goto fail_claim;
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    rc = -pthread_cond_init(&s->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (rc)
        goto fail_claim;
    pthread_mutex_init(&s->mu, NULL);
    if ((rc = -pthread_create(&s->thread, NULL, sampler_main, s)))
        goto fail_sync;
    *out = s;
    return 0;
fail_sync:
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
fail_claim:
    pthread_mutex_lock(&g_mu);
    g_interval_ms = 0;
    pthread_mutex_unlock(&g_mu);
fail_alloc:
    free(s);
    return rc;
}

void tv__history_stop(tv__history_sampler *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->mu);
    s->stop = true;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_lock(&g_mu);
    g_interval_ms = 0;
    pthread_mutex_unlock(&g_mu);
    free(s);
}

int tv__history_snapshot(tv__history_sample *out, size_t max, size_t *n, uint32_t *interval_ms)
{
    if (!out || !n || !interval_ms)
        return -EINVAL;
    pthread_mutex_lock(&g_mu);
    *n = tv__history_copy(&g_ring, out, max);
    *interval_ms = g_interval_ms;
    pthread_mutex_unlock(&g_mu);
    return 0;
}

int tv__api_h_metrics_history(tv__api_ctx *c)
{
    static const char *const no_fields[] = {NULL};
    tv__history_sample *v = NULL;
    json_t *arr = NULL;
    size_t n = 0;
    uint32_t interval_ms = 0;
    int rc;
    if ((rc = tv__api_query_allow(c, no_fields)))
        return rc;
    if (!(v = malloc(TV__HISTORY_SAMPLES * sizeof *v)) || !(arr = json_array())) {
        rc = tv__seterr(&c->err, -ENOMEM, "out of memory");
        goto out;
    }
    tv__history_snapshot(v, TV__HISTORY_SAMPLES, &n, &interval_ms);
    for (size_t i = 0; i < n; i++) {
        json_t *x =
            json_pack("{s:I,s:I,s:I}", "time_ms", (json_int_t)v[i].time_ms, "read_bytes",
                      (json_int_t)v[i].read_bytes, "import_bytes", (json_int_t)v[i].import_bytes);
        if (json_array_append_new(arr, x)) {
            rc = tv__seterr(&c->err, -ENOMEM, "out of memory");
            goto out;
        }
    }
    rc = tv__api_reply(
        c, 200, json_pack("{s:I,s:o}", "interval_ms", (json_int_t)interval_ms, "samples", arr));
    arr = NULL;
out:
    json_decref(arr);
    free(v);
    return rc;
}
