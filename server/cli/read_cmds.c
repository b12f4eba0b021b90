/* Reader subcommands: `get` (one tensor's exact bytes, rows, or float32 to
 * a file) and `bench` (load every tensor into host memory and report
 * bytes, seconds and GB/s). Both go through the public library API
 * (tensorvault.h), exactly as an in-process loader would. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "cli/args.h"
#include "cli/cli.h"
#include "tensorvault/tensorvault.h"
#include "util/internal.h"
#include "util/sys.h"

#define READ_OPTS                                                                                  \
    {"--store", true, NULL}, {"--json", false, NULL}, {"--engine", true, NULL},                    \
        {"--qd", true, NULL}, {"--chunk", true, NULL}, {"--no-direct", false, NULL}

static int read_opts(const char *cmd, const tv_cli_args *a, tv_open_opts *o)
{
    memset(o, 0, sizeof(*o));
    const char *e = tv_cli_get(a, "--engine"), *qd = tv_cli_get(a, "--qd"),
               *ch = tv_cli_get(a, "--chunk");
    if (e && !strcmp(e, "uring"))
        o->engine = TV_ENGINE_URING;
    else if (e && !strcmp(e, "pread"))
        o->engine = TV_ENGINE_PREAD;
    else if (e && strcmp(e, "auto")) {
        fprintf(stderr, "tensorvault: %s: --engine is auto, uring or pread\n", cmd);
        return TV_EXIT_USAGE;
    }
    if (qd) {
        char *end;
        unsigned long v = strtoul(qd, &end, 10);
        if (*end || v == 0 || v > 4096) {
            fprintf(stderr, "tensorvault: %s: bad --qd\n", cmd);
            return TV_EXIT_USAGE;
        }
        o->queue_depth = (uint32_t)v;
    }
    uint64_t c = 0;
    if (ch && tv_cli_parse_size(ch, &c)) {
        fprintf(stderr, "tensorvault: %s: bad --chunk\n", cmd);
        return TV_EXIT_USAGE;
    }
    o->chunk_len = (size_t)c;
    o->no_direct = tv_cli_flag(a, "--no-direct");
    return 0;
}

static int write_file(const char *path, const void *buf, size_t len, tv_error *err)
{
    int fd = tv__sys.open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return tv__cli_err(err, -errno, path);
    size_t done = 0;
    while (done < len) {
        /* raw-syscall-ok: the -o output may be a pipe or a tty (no pwrite) */
        ssize_t n = write(fd, (const char *)buf + done, len - done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            int e = n < 0 ? -errno : -EIO;
            tv__sys.close(fd);
            return tv__cli_err(err, e, path);
        }
        done += (size_t)n;
    }
    if (tv__sys.close(fd) < 0)
        return tv__cli_err(err, -errno, path);
    return 0;
}

int tv_cli_get_tensor(int argc, char **argv)
{
    tv_cli_opt opts[] = {READ_OPTS, {"-o", true, NULL}, {"--output", true, NULL},
                         {"--rows", true, NULL}, {"--f32", false, NULL}};
    tv_cli_args a = {opts, TV_ARRAY_LEN(opts), {0}, 0};
    int u;
    if ((u = tv_cli_parse("get", argc, argv, &a)))
        return u;
    bool json = tv_cli_flag(&a, "--json");
    const char *dir = tv_cli_get(&a, "--store") ? tv_cli_get(&a, "--store")
                                                 : getenv("TENSORVAULT_STORE");
    const char *outp = tv_cli_get(&a, "-o") ? tv_cli_get(&a, "-o") : tv_cli_get(&a, "--output");
    const char *rows = tv_cli_get(&a, "--rows");
    bool f32 = tv_cli_flag(&a, "--f32");
    unsigned long long r0 = 0, r1 = 0;
    if (!dir || !outp || a.n_pos != 2 || (rows && (sscanf(rows, "%llu:%llu", &r0, &r1) != 2)) ||
        (rows && f32)) {
        fprintf(stderr, "usage: tensorvault get --store DIR NAME[@GEN] TENSOR -o FILE "
                        "[--rows R0:R1 | --f32] [--engine auto|uring|pread] [--json]\n");
        return TV_EXIT_USAGE;
    }
    tv_open_opts oo;
    if ((u = read_opts("get", &a, &oo)))
        return u;
    tv_error err = {0};
    tv_model *m = NULL;
    int rc = tv_model_open(dir, a.pos[0], &oo, &m, &err);
    if (rc) {
        tv_cli_fail("get", json, rc, err.msg);
        return TV_EXIT_FAIL;
    }
    size_t idx;
    tv_tensor_desc d;
    void *buf = NULL;
    size_t len = 0;
    if (tv_model_find(m, a.pos[1], strlen(a.pos[1]), &idx)) {
        rc = tv__cli_err(&err, TV_E_NOT_FOUND, a.pos[1]);
        snprintf(err.msg, sizeof(err.msg), "no tensor '%s' in %s@%" PRId64, a.pos[1],
                 tv_model_name(m), tv_model_generation(m));
        goto out;
    }
    tv_model_tensor(m, idx, &d);
    if (rows) {
        uint64_t row_len = d.rank && d.shape[0] ? d.nbytes / d.shape[0] : 0;
        len = (size_t)((r1 > r0 ? r1 - r0 : 0) * row_len);
    } else {
        len = (size_t)(f32 ? d.n_elements * 4 : d.nbytes);
    }
    if (!(buf = malloc(len ? len : 1))) {
        rc = tv__cli_err(&err, -ENOMEM, "out of memory");
        goto out;
    }
    if (rows)
        rc = tv_read_rows(m, a.pos[1], r0, r1, buf, len, &err);
    else if (f32)
        rc = tv_read_f32(m, a.pos[1], buf, len, &err);
    else
        rc = tv_read_into(m, a.pos[1], buf, len, &err);
    if (!rc)
        rc = write_file(outp, buf, len, &err);
out:
    if (rc)
        tv_cli_fail("get", json, rc, err.msg);
    else if (json) {
        json_t *o = json_pack("{s:s,s:I,s:s,s:s,s:I}", "model", tv_model_name(m), "generation",
                              (json_int_t)tv_model_generation(m), "tensor", a.pos[1], "output",
                              outp, "bytes", (json_int_t)len);
        json_dumpf(o, stdout, JSON_INDENT(2));
        fputc('\n', stdout);
        json_decref(o);
    }
    free(buf);
    tv_model_close(m);
    return rc ? TV_EXIT_FAIL : TV_EXIT_OK;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Latency mode: `count` reads of one tensor with tv_read_into, each timed;
 * prints p50 / p99 / max in microseconds. */
static int latency(tv_model *m, const char *name, unsigned long count, bool json)
{
    tv_error err = {0};
    size_t idx;
    tv_tensor_desc d;
    if (count == 0 || count > 10000000) {
        fprintf(stderr, "tensorvault: bench: bad --count\n");
        return TV_EXIT_USAGE;
    }
    if (tv_model_find(m, name, strlen(name), &idx)) {
        tv_cli_fail("bench", json, TV_E_NOT_FOUND, "no such tensor");
        return TV_EXIT_FAIL;
    }
    tv_model_tensor(m, idx, &d);
    void *buf = malloc(d.nbytes ? d.nbytes : 1);
    double *t = malloc(sizeof(double) * count);
    if (!buf || !t) {
        free(buf);
        free(t);
        tv_cli_fail("bench", json, -ENOMEM, "out of memory");
        return TV_EXIT_FAIL;
    }
    int rc = 0;
    for (unsigned long i = 0; i < 10 && !rc; i++)
        rc = tv_read_into(m, name, buf, d.nbytes, &err);
    for (unsigned long i = 0; i < count && !rc; i++) {
        double t0 = now();
        rc = tv_read_into(m, name, buf, d.nbytes, &err);
        t[i] = (now() - t0) * 1e6;
    }
    if (rc) {
        tv_cli_fail("bench", json, rc, err.msg);
    } else {
        qsort(t, count, sizeof(double), cmp_double);
        double p50 = t[count / 2], p99 = t[(size_t)((double)count * 0.99)], mx = t[count - 1];
        if (json) {
            json_t *o = json_pack("{s:s,s:I,s:I,s:f,s:f,s:f}", "tensor", name, "bytes",
                                  (json_int_t)d.nbytes, "count", (json_int_t)count, "p50_us", p50,
                                  "p99_us", p99, "max_us", mx);
            json_dumpf(o, stdout, JSON_INDENT(2));
            fputc('\n', stdout);
            json_decref(o);
        } else {
            printf("%s (%" PRIu64 " bytes): %lu reads, p50 %.1f us, p99 %.1f us, max %.1f us\n",
                   name, d.nbytes, count, p50, p99, mx);
        }
    }
    free(buf);
    free(t);
    return rc ? TV_EXIT_FAIL : TV_EXIT_OK;
}

int tv_cli_bench(int argc, char **argv)
{
    tv_cli_opt opts[] = {READ_OPTS, {"--latency", true, NULL}, {"--count", true, NULL}};
    tv_cli_args a = {opts, TV_ARRAY_LEN(opts), {0}, 0};
    int u;
    if ((u = tv_cli_parse("bench", argc, argv, &a)))
        return u;
    bool json = tv_cli_flag(&a, "--json");
    const char *dir = tv_cli_get(&a, "--store") ? tv_cli_get(&a, "--store")
                                                 : getenv("TENSORVAULT_STORE");
    if (!dir || a.n_pos != 1) {
        fprintf(stderr, "usage: tensorvault bench --store DIR NAME[@GEN] [--engine "
                        "auto|uring|pread] [--qd N] [--chunk SIZE] [--json]\n");
        return TV_EXIT_USAGE;
    }
    tv_open_opts oo;
    if ((u = read_opts("bench", &a, &oo)))
        return u;
    tv_error err = {0};
    tv_model *m = NULL;
    int rc = tv_model_open(dir, a.pos[0], &oo, &m, &err);
    if (rc) {
        tv_cli_fail("bench", json, rc, err.msg);
        return TV_EXIT_FAIL;
    }
    if (tv_cli_get(&a, "--latency")) {
        const char *cnt = tv_cli_get(&a, "--count");
        rc = latency(m, tv_cli_get(&a, "--latency"), cnt ? strtoul(cnt, NULL, 10) : 2000, json);
        tv_model_close(m);
        return rc;
    }
    size_t n = tv_model_n_tensors(m);
    uint64_t total = 0, arena_len = 0;
    tv_read_req *reqs = calloc(n ? n : 1, sizeof(*reqs));
    for (size_t i = 0; reqs && i < n; i++) {
        tv_tensor_desc d;
        tv_model_tensor(m, i, &d);
        reqs[i].index = i;
        reqs[i].dest_len = (size_t)d.nbytes;
        total += d.nbytes;
        arena_len += (d.nbytes + 63) & ~63ull;
    }
    /* Destinations are one pre-faulted arena so the timing is the load, not
     * page faults; its size is subtracted from the reported peak RSS. */
    uint8_t *arena = NULL;
    if (!reqs || posix_memalign((void **)&arena, 4096, arena_len ? arena_len : 4096)) {
        free(reqs);
        tv_model_close(m);
        tv_cli_fail("bench", json, -ENOMEM, "out of memory for the destination buffers");
        return TV_EXIT_FAIL;
    }
    memset(arena, 0, arena_len);
    uint64_t at = 0;
    for (size_t i = 0; i < n; i++) {
        reqs[i].dest = arena + at;
        at += (reqs[i].dest_len + 63) & ~(size_t)63;
    }
    double t0 = now();
    rc = tv_read_batch(m, reqs, n, &err);
    double secs = now() - t0;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double rss_mib = (double)ru.ru_maxrss / 1024.0;
    double extra_mib = rss_mib - (double)arena_len / 1048576.0;
    if (rc)
        tv_cli_fail("bench", json, rc, err.msg);
    else if (json) {
        json_t *o = json_pack("{s:s,s:I,s:I,s:I,s:f,s:f,s:f,s:f}", "model", tv_model_name(m),
                              "generation", (json_int_t)tv_model_generation(m), "tensors",
                              (json_int_t)n, "bytes", (json_int_t)total, "seconds", secs,
                              "gb_per_s", secs > 0 ? (double)total / secs / 1e9 : 0.0,
                              "peak_rss_mib", rss_mib, "rss_beyond_buffers_mib", extra_mib);
        json_dumpf(o, stdout, JSON_INDENT(2));
        fputc('\n', stdout);
        json_decref(o);
    } else {
        printf("%s@%" PRId64 ": %zu tensors, %" PRIu64 " bytes in %.3f s: %.2f GB/s (peak RSS "
               "%.1f MiB, %.1f MiB beyond the destination buffers)\n",
               tv_model_name(m), tv_model_generation(m), n, total, secs,
               secs > 0 ? (double)total / secs / 1e9 : 0.0, rss_mib, extra_mib);
    }
    free(arena);
    free(reqs);
    tv_model_close(m);
    return rc ? TV_EXIT_FAIL : TV_EXIT_OK;
}
