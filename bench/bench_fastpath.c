/* Fast-path load and latency client for bench/fastpath_bench.py (a
 * tv_model opened in a session of tensorvault/client.h), for what
 * `tensorvault bench --fastpath` cannot measure:
 *   - load: every tensor of SPEC in file order, read with
 *     tv_read_batch in batches that fit one pre-faulted window
 *     (--window MiB, default 256, raised to the largest tensor), reused
 *     from batch to batch, so eight clients of a multi-GiB model fit in
 *     memory. Connect, open and pre-fault happen first; then, with
 *     --start-at T (CLOCK_REALTIME seconds), the client sleeps until T so
 *     that N processes start loading together. Prints
 *       {"bytes", "seconds", "start", "end", "late", "tensors", "batches"}
 *     with start/end in CLOCK_REALTIME seconds (comparable across
 *     processes) and late = how far past T setup finished (0 when on time);
 *   - --cold SUFFIX ROUNDS: latency of every tensor whose name ends with
 *     SUFFIX, one tv_read_into each, ROUNDS times, each round in a
 *     newly opened model (a new read group when nothing else has SPEC
 *     open, so its slots hold nothing yet: every read goes to the device).
 *     Prints {"count", "bytes", "p50_us", "p99_us", "max_us"}.
 * Exit status 0, or 1 with the error on stderr.
 *
 * usage: bench_fastpath SOCKET SPEC [--window MiB] [--start-at T]
 *        bench_fastpath SOCKET SPEC --cold SUFFIX ROUNDS */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tensorvault/client.h"

static double clock_s(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int fail(const char *what, int rc, const tv_error *err)
{
    fprintf(stderr, "bench_fastpath: %s: %s (%s)\n", what, err && err->msg[0] ? err->msg : "",
            tv_err_name(rc));
    return 1;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int cold(tv_client *c, const char *spec, const char *suffix, unsigned long rounds)
{
    size_t cap = 0, n = 0, slen = strlen(suffix);
    double *us = NULL;
    uint64_t bytes = 0;
    void *buf = NULL;
    size_t buf_len = 0;
    int rc = 0;
    tv_error err = {0};
    for (unsigned long r = 0; r < rounds && !rc; r++) {
        tv_model *m = NULL;
        if ((rc = tv_model_open_daemon(c, spec, NULL, &m, &err)))
            return fail("open", rc, &err);
        for (size_t i = 0; i < tv_model_n_tensors(m) && !rc; i++) {
            tv_tensor_desc d;
            if ((rc = tv_model_tensor(m, i, &d)))
                break;
            if (d.name_len < slen || memcmp(d.name + d.name_len - slen, suffix, slen))
                continue;
            if (d.nbytes > buf_len) {
                free(buf);
                buf_len = (size_t)d.nbytes;
                if (!(buf = malloc(buf_len))) {
                    rc = -ENOMEM;
                    break;
                }
                memset(buf, 1, buf_len);
            }
            if (n == cap) {
                cap = cap ? 2 * cap : 256;
                double *grown = realloc(us, cap * sizeof(*us));
                if (!grown) {
                    rc = -ENOMEM;
                    break;
                }
                us = grown;
            }
            double t0 = clock_s(CLOCK_MONOTONIC);
            rc = tv_read_into(m, d.name, buf, (size_t)d.nbytes, &err);
            us[n++] = (clock_s(CLOCK_MONOTONIC) - t0) * 1e6;
            bytes = d.nbytes;
        }
        tv_model_close(m);
    }
    if (rc || !n) {
        free(us);
        free(buf);
        return rc ? fail("cold read", rc, &err) : fail("no tensor ends with that suffix", 0, NULL);
    }
    qsort(us, n, sizeof(*us), cmp_double);
    size_t i99 = (size_t)(0.99 * (double)n);
    printf("{\"count\": %zu, \"bytes\": %" PRIu64
           ", \"p50_us\": %.3f, \"p99_us\": %.3f, \"max_us\": %.3f}\n",
           n, bytes, us[n / 2], us[i99 < n ? i99 : n - 1], us[n - 1]);
    free(us);
    free(buf);
    return 0;
}

static int load(tv_client *c, const char *spec, uint64_t window, double start_at)
{
    tv_model *m = NULL;
    tv_error err = {0};
    int rc = tv_model_open_daemon(c, spec, NULL, &m, &err);
    if (rc)
        return fail("open", rc, &err);
    size_t n = tv_model_n_tensors(m);
    tv_read_req *reqs = calloc(n ? n : 1, sizeof(*reqs));
    uint64_t total = 0;
    for (size_t i = 0; reqs && i < n; i++) {
        tv_tensor_desc d;
        tv_model_tensor(m, i, &d);
        reqs[i].index = i;
        reqs[i].dest_len = (size_t)d.nbytes;
        total += d.nbytes;
        if (d.nbytes + 64 > window)
            window = d.nbytes + 64;
    }
    uint8_t *win = NULL;
    if (!reqs || posix_memalign((void **)&win, 4096, (size_t)window)) {
        free(reqs);
        tv_model_close(m);
        return fail("out of memory", -ENOMEM, NULL);
    }
    memset(win, 0, (size_t)window); /* pre-faulted: the timing is the load */
    double late = 0;
    if (start_at > 0) {
        double t = clock_s(CLOCK_REALTIME);
        if (t < start_at) {
            struct timespec ts = {(time_t)start_at,
                                  (long)((start_at - (double)(time_t)start_at) * 1e9)};
            while (clock_nanosleep(CLOCK_REALTIME, TIMER_ABSTIME, &ts, NULL) == EINTR)
                ;
        } else {
            late = t - start_at;
        }
    }
    double start = clock_s(CLOCK_REALTIME), t0 = clock_s(CLOCK_MONOTONIC);
    size_t batches = 0;
    for (size_t i = 0; i < n && !rc;) {
        uint64_t at = 0;
        size_t j = i;
        for (; j < n && at + reqs[j].dest_len <= window; j++) {
            reqs[j].dest = win + at;
            at += (reqs[j].dest_len + 63) / 64 * 64; /* checked: <= window + 63 */
        }
        rc = tv_read_batch(m, reqs + i, j - i, &err);
        batches++;
        i = j;
    }
    double secs = clock_s(CLOCK_MONOTONIC) - t0, end = clock_s(CLOCK_REALTIME);
    free(win);
    free(reqs);
    tv_model_close(m);
    if (rc)
        return fail("read", rc, &err);
    printf(
        "{\"bytes\": %" PRIu64
        ", \"seconds\": %.6f, \"start\": %.6f, \"end\": %.6f, \"late\": %.6f, \"tensors\": %zu, \"batches\": %zu}\n",
        total, secs, start, end, late, n, batches);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: bench_fastpath SOCKET SPEC [--window MiB] [--start-at T]\n"
                        "       bench_fastpath SOCKET SPEC --cold SUFFIX ROUNDS\n");
        return 2;
    }
    uint64_t window = 256ull << 20;
    double start_at = 0;
    const char *suffix = NULL;
    unsigned long rounds = 0;
    for (int i = 3; i < argc; i++) {
        if (!strcmp(argv[i], "--window") && i + 1 < argc)
            window = strtoull(argv[++i], NULL, 10) << 20;
        else if (!strcmp(argv[i], "--start-at") && i + 1 < argc)
            start_at = strtod(argv[++i], NULL);
        else if (!strcmp(argv[i], "--cold") && i + 2 < argc) {
            suffix = argv[++i];
            rounds = strtoul(argv[++i], NULL, 10);
        } else {
            fprintf(stderr, "bench_fastpath: unknown argument '%s'\n", argv[i]);
            return 2;
        }
    }
    tv_client *c = NULL;
    tv_error err = {0};
    int rc = tv_client_connect(argv[1], NULL, &c, &err);
    if (rc)
        return fail("connect", rc, &err);
    int status = suffix ? cold(c, argv[2], suffix, rounds) : load(c, argv[2], window, start_at);
    tv_client_close(c);
    return status;
}
