/* Benchmark: safetensors header validation + name indexing for 1k, 10k, 60k
 * and 120k tensors, and median name-lookup time. Prints ratios measured in
 * the same run so a noisy machine still gives comparable figures:
 *   x2_time = time(N) / time(N/2 row above) for the 60k -> 120k doubling;
 *   per_tensor = (time per tensor at N) / (time per tensor at 1k).
 * Linear parsing: x2_time <= 2.2. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tensorvault/checkpoint.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* A MoE-like header: 61 layers x experts x 3 projections, BF16. */
static char *make_header(size_t n, size_t *len, uint64_t *data_len)
{
    size_t cap = n * 160 + 64, o = 0;
    char *h = malloc(cap);
    uint64_t off = 0;
    o += (size_t)snprintf(h + o, cap - o, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (size_t i = 0; i < n; i++) {
        uint64_t rows = 256 + (i % 7) * 64, cols = 128;
        uint64_t nb = rows * cols * 2;
        o += (size_t)snprintf(
            h + o, cap - o,
            ",\"model.layers.%zu.mlp.experts.%zu.%s_proj.weight\":{\"dtype\":\"BF16\",\"shape\":[%" PRIu64
            ",%" PRIu64 "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}",
            i / 768, (i / 3) % 256, (const char *[]){"gate", "up", "down"}[i % 3], rows, cols, off,
            off + nb);
        off += nb;
    }
    o += (size_t)snprintf(h + o, cap - o, "}");
    char *buf = malloc(8 + o);
    for (int b = 0; b < 8; b++)
        buf[b] = (char)(((uint64_t)o >> (8 * b)) & 0xff);
    memcpy(buf + 8, h, o);
    free(h);
    *len = o;
    *data_len = off;
    return buf;
}

int main(int argc, char **argv)
{
    static const size_t sizes[] = {1000, 10000, 60000, 120000};
    enum { N_SIZES = 4 };
    bool json = argc > 1 && strcmp(argv[1], "--json") == 0;
    double per_tensor[N_SIZES] = {0}, med_t[N_SIZES] = {0};
    if (!json)
        printf("%-8s %10s %12s %10s %14s %11s %9s\n", "tensors", "header_MB", "parse_ms", "MB/s",
               "lookup_ns_p50", "per_tensor", "x2_time");
    for (int s = 0; s < N_SIZES; s++) {
        size_t n = sizes[s], hlen;
        uint64_t data_len;
        char *buf = make_header(n, &hlen, &data_len);
        int reps = n >= 100000 ? 5 : 9;
        double t[9];
        tv_checkpoint *ck = NULL;
        for (int r = 0; r < reps; r++) {
            tv_error err;
            tv_checkpoint_close(ck);
            double t0 = now();
            if (tv_checkpoint_parse_shard(buf, 8 + hlen, 8 + hlen + data_len, "bench", NULL, &ck,
                                          &err)) {
                fprintf(stderr, "parse failed: %s\n", err.msg);
                return 1;
            }
            t[r] = now() - t0;
        }
        qsort(t, (size_t)reps, sizeof(double), cmp_d);
        double med = t[reps / 2];
        /* Lookups: a shuffled sequence of every name, batches of 100k. */
        size_t nl = 100000;
        const char **names = malloc(sizeof(*names) * nl);
        size_t *lens = malloc(sizeof(*lens) * nl);
        uint64_t x = 88172645463325252ull;
        for (size_t i = 0; i < nl; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            tv_tensor_info ti;
            tv_checkpoint_tensor(ck, x % n, &ti);
            names[i] = ti.name;
            lens[i] = ti.name_len;
        }
        double lt[7];
        size_t sink = 0;
        for (int r = 0; r < 7; r++) {
            double t0 = now();
            for (size_t i = 0; i < nl; i++) {
                size_t idx;
                if (tv_checkpoint_find(ck, names[i], lens[i], &idx) == 0)
                    sink += idx;
            }
            lt[r] = (now() - t0) / (double)nl * 1e9;
        }
        qsort(lt, 7, sizeof(double), cmp_d);
        per_tensor[s] = med / (double)n;
        med_t[s] = med;
        double rel = per_tensor[s] / per_tensor[0];
        double x2 = (s > 0 && sizes[s] == 2 * sizes[s - 1]) ? med / med_t[s - 1] : 0.0;
        if (json)
            printf(
                "{\"tensors\":%zu,\"header_bytes\":%zu,\"parse_s\":%.6f,\"mb_s\":%.1f,\"lookup_ns_p50\":%.1f,\"per_tensor\":%.3f,\"x2_time\":%.3f}\n",
                n, hlen, med, (double)hlen / med / 1e6, lt[3], rel, x2);
        else {
            char x2s[16] = "-";
            if (x2 > 0)
                snprintf(x2s, sizeof(x2s), "%.3f", x2);
            printf("%-8zu %10.2f %12.2f %10.1f %14.1f %11.3f %9s\n", n, (double)hlen / 1e6,
                   med * 1e3, (double)hlen / med / 1e6, lt[3], rel, x2s);
        }
        if (sink == 42)
            printf(" ");
        tv_checkpoint_close(ck);
        free(names);
        free(lens);
        free(buf);
    }
    if (!json)
        printf(
            "per_tensor: time per tensor relative to 1k; x2_time: time(120k) / time(60k), linear parsing <= 2.2\n");
    return 0;
}
