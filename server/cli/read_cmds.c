/* Reader subcommands: `get` (one tensor's exact bytes, rows, or float32 to
 * a file) and `bench` (load every tensor into host memory, or take a view
 * of each in the daemon's memory tier, and report bytes, seconds and GB/s;
 * through the daemon whose HTTP API is known, also what the daemon read
 * from its devices and served from its memory tier meanwhile). Both go
 * through the public library API, exactly as a loader would: one tv_model
 * (tensorvault.h), opened in-process on --store DIR, or through
 * tensorvaultd's fast path (a session of tensorvault/client.h) on the
 * socket found as cli/where.h says.
 * Invariant: both paths print the same output from the same calls; only
 * the opening (src_open) differs. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "cli/args.h"
#include "cli/cli.h"
#include "cli/client.h"
#include "store/store.h"
#include "tensorvault/client.h"
#include "tensorvault/tensorvault.h"
#include "util/internal.h"
#include "util/sys.h"

#define TV__CLI_DEFAULT_QD    ((uint64_t)TV_READ_DEFAULT_QUEUE_DEPTH)
#define TV__CLI_DEFAULT_CHUNK ((uint64_t)TV_READ_DEFAULT_CHUNK)

/* --engine, --qd, --chunk, --no-direct: bounded here so a bad value is a
 * usage error naming it, before the store is opened. */
static int read_opts(const char *cmd, const tv__cli_args *a, tv_open_opts *o)
{
    memset(o, 0, sizeof(*o));
    const char *e = tv__cli_get(a, "--engine");
    uint64_t qd = 0, chunk = 0;
    int u;
    if (e && !strcmp(e, "uring"))
        o->engine = TV_ENGINE_URING;
    else if (e && !strcmp(e, "pread"))
        o->engine = TV_ENGINE_PREAD;
    else if (e && strcmp(e, "auto"))
        return tv__cli_usage(cmd, "bad --engine '%s': auto, uring or pread", e);
    if ((u = tv__cli_opt_uint(cmd, a, "--qd", 1, TV__CLI_MAX_QD, &qd)) ||
        (u = tv__cli_opt_size(cmd, a, "--chunk", TV__CLI_MIN_CHUNK, TV__CLI_MAX_CHUNK, &chunk)))
        return u;
    /* Staging memory is one chunk per read in flight. */
    uint64_t staging;
    if (tv__mul_u64(qd ? qd : TV__CLI_DEFAULT_QD, chunk ? chunk : TV__CLI_DEFAULT_CHUNK,
                    &staging) ||
        staging > TV__CLI_MAX_STAGING)
        return tv__cli_usage(cmd, "--qd x --chunk = %llu x %llu bytes, over the staging cap %llu",
                             (unsigned long long)(qd ? qd : TV__CLI_DEFAULT_QD),
                             (unsigned long long)(chunk ? chunk : TV__CLI_DEFAULT_CHUNK),
                             (unsigned long long)TV__CLI_MAX_STAGING);
    o->queue_depth = (uint32_t)qd;
    o->chunk_len = (size_t)chunk;
    o->no_direct = tv__cli_flag(a, "--no-direct");
    return 0;
}

static int write_all(int fd, const void *buf, size_t len)
{
    size_t done = 0;
    while (done < len) {
        /* raw-syscall-ok: the -o output may be a pipe or a tty (no pwrite) */
        ssize_t n = write(fd, (const char *)buf + done, len - done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return n < 0 ? -errno : -EIO;
        done += (size_t)n;
    }
    return 0;
}

/* path "-" is standard output. */
static int write_file(const char *path, const void *buf, size_t len, tv_error *err)
{
    int rc;
    if (!strcmp(path, "-")) {
        if ((rc = write_all(STDOUT_FILENO, buf, len)))
            return tv__cli_err(err, rc, "standard output");
        return 0;
    }
    int fd = tv__sys.open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return tv__cli_err(err, -errno, path);
    if ((rc = write_all(fd, buf, len))) {
        tv__sys.close(fd);
        return tv__cli_err(err, rc, path);
    }
    if (tv__sys.close(fd) < 0)
        return tv__cli_err(err, -errno, path);
    return 0;
}

/* Where get and bench read from: a tv_model opened in-process, or in a
 * fast-path session c (fp) on the socket found in where. */
typedef struct src {
    bool fp;
    tv_client *c;
    tv_model *m;
    tv__cli_where where;
} src;

#define SOCKET_HINT                                                                                \
    "set TENSORVAULT_SOCKET (or --socket PATH) to the daemon's fast-path socket, or read a store in this process with --store DIR (or TENSORVAULT_STORE)"

/* --store and the fast-path flags exclude one another: a usage error. */
static int src_usage(const char *cmd, const tv__cli_args *a)
{
    if (tv__cli_get(a, "--store") && (tv__cli_get(a, "--fastpath") || tv__cli_get(a, "--socket")))
        return tv__cli_usage(
            cmd,
            "--store DIR reads in this process; --socket and --fastpath read through the daemon: give one of them");
    if (tv__cli_get(a, "--fastpath") && tv__cli_get(a, "--socket"))
        return tv__cli_usage(cmd,
                             "--fastpath SOCKET and --socket PATH name the same thing: give one");
    return 0;
}

/* The first of: --store DIR (in-process); --socket PATH or --fastpath
 * [SOCKET] (the daemon); $TENSORVAULT_SOCKET; $TENSORVAULT_STORE; the
 * installed socket; ./var's socket (cli/where.h). */
static int src_open(src *s, const tv__cli_args *a, const char *spec, const tv_open_opts *oo,
                    tv_error *err)
{
    int rc;
    memset(s, 0, sizeof(*s));
    const char *store = tv__cli_get(a, "--store");
    const char *fp = tv__cli_get(a, "--fastpath"), *sock = tv__cli_get(a, "--socket");
    const char *env_sock = getenv("TENSORVAULT_SOCKET"), *env_store = getenv("TENSORVAULT_STORE");
    if (!store && !fp && !sock && !(env_sock && *env_sock) && env_store && *env_store)
        store = env_store;
    if (store) {
        if ((rc = tv__store_check_dir(store, err)))
            return rc;
        return tv_model_open(store, spec, oo, &s->m, err);
    }
    const char *flag = sock ? sock : fp && *fp ? fp : NULL;
    tv__cli_find_socket(flag, sock ? "--socket" : "--fastpath", &tv__cli_socket_defaults,
                        &s->where);
    if (!s->where.found) {
        tv__seterr(err, TV_E_NO_DAEMON, "no tensorvaultd fast-path socket was found");
        return tv__cli_where_fail(err, &s->where, SOCKET_HINT);
    }
    s->fp = true;
    rc = tv_client_connect(s->where.value, NULL, &s->c, err);
    if (rc == TV_E_NO_DAEMON)
        return tv__cli_where_fail(err, &s->where, SOCKET_HINT);
    if (rc)
        return rc;
    return tv_model_open_daemon(s->c, spec, oo, &s->m, err);
}

static void src_close(src *s)
{
    tv_model_close(s->m);
    tv_client_close(s->c);
    memset(s, 0, sizeof(*s));
}

static int find(const tv_model *m, const char *name, size_t *idx)
{
    return tv_model_find(m, name, strlen(name), idx);
}

/* Bytes `get` writes, checked before anything is allocated: rows [r0, r1)
 * of dim 0, n_elements float32s, or the tensor's bytes. */
static int output_len(const tv_tensor_desc *d, const char *tensor, bool rows, uint64_t r0,
                      uint64_t r1, bool f32, size_t *len, tv_error *err)
{
    uint64_t n = d->nbytes;
    if (rows) {
        if (d->rank == 0)
            return tv__seterr(err, TV_E_INVALID_ARG, "tensor '%s' is a scalar: no rows", tensor);
        uint64_t dim0 = d->shape[0];
        if (r1 > dim0)
            return tv__seterr(
                err, TV_E_INVALID_ARG, "tensor '%s': rows [%llu, %llu) outside [0, %llu)", tensor,
                (unsigned long long)r0, (unsigned long long)r1, (unsigned long long)dim0);
        if (tv__mul_u64(r1 - r0, dim0 ? d->nbytes / dim0 : 0, &n))
            return tv__seterr(err, TV_E_OVERFLOW, "tensor '%s': rows [%llu, %llu) overflow", tensor,
                              (unsigned long long)r0, (unsigned long long)r1);
    } else if (f32 && tv__mul_u64(d->n_elements, 4, &n)) {
        return tv__seterr(err, TV_E_OVERFLOW, "tensor '%s': float32 size overflows", tensor);
    }
    if (n > SIZE_MAX)
        return tv__seterr(err, TV_E_OVERFLOW, "tensor '%s': %llu bytes do not fit in memory",
                          tensor, (unsigned long long)n);
    *len = (size_t)n;
    return 0;
}

const tv__cli_cmd tv__cli_cmd_get = {
    .name = "get",
    .run = tv__cli_get_tensor,
    .positionals = "NAME[@GEN|@ALIAS] TENSOR",
    .min_pos = 2,
    .max_pos = 2,
    .flags = TV__CLI_SPEC,
    .opts = {{"-o", "FILE|-", "-o FILE|-", "where the bytes go; - is standard output"},
             {"--output", "FILE", "", "the same as -o"},
             {"--rows", "R0:R1", "[--rows R0:R1 | --f32]", "only rows [R0, R1) of dimension 0"},
             {"--f32", NULL, "", "the tensor's values converted to float32"},
             {"--engine", "auto|uring|pread", NULL,
              "in-process reads: io_uring, a pread pool, or the best there is"},
             {"--qd", "N", NULL, "in-process reads in flight, 1..4096 (default 32)"},
             {"--chunk", "SIZE", NULL, "bytes per device read, 4K..1G (default 1M)"},
             {"--no-direct", NULL, NULL, "buffered reads, for filesystems without O_DIRECT"},
             {"--store", "DIR", NULL,
              "read the store in DIR in this process, not through tensorvaultd"},
             {"--socket", "PATH", NULL, "the daemon's fast-path socket (default: see below)"},
             {"--fastpath", "[SOCKET]", NULL,
              "through the daemon's fast path (SOCKET: as --socket)"},
             {"--json", NULL, NULL,
              "print what was written (model, generation, tensor, bytes) as JSON"}},
    .about = "Write the exact bytes of one tensor (as the official safetensors loader reads\n"
             "them), some of its rows, or its values as float32, to a file. Through the\n"
             "daemon's fast path when one is found (no store needed), else from --store DIR.",
    .example = "tensorvault get llama model.embed_tokens.weight -o emb.bin\n"
               "tensorvault get llama@2 experts.w1 --rows 8:16 -o rows.bin\n"
               "tensorvault get --store /srv/tv llama model.norm.weight --f32 -o - | xxd | head",
};

int tv__cli_get_tensor(const tv__cli_ctx *c)
{
    const tv__cli_args *a = &c->a;
    bool json = c->json;
    const char *outp = tv__cli_get(a, "-o") ? tv__cli_get(a, "-o") : tv__cli_get(a, "--output");
    const char *rows = tv__cli_get(a, "--rows");
    bool f32 = tv__cli_flag(a, "--f32");
    uint64_t r0 = 0, r1 = 0;
    int u;
    if (!outp)
        return tv__cli_usage("get", "-o FILE is required (- for standard output)");
    if (tv__cli_get(a, "-o") && tv__cli_get(a, "--output"))
        return tv__cli_usage("get", "-o and --output given together");
    if (!strcmp(outp, "-") && json)
        return tv__cli_usage("get", "-o - and --json both write to standard output");
    if (rows && f32)
        return tv__cli_usage("get", "--rows and --f32 cannot be combined");
    if (rows && (u = tv__cli_parse_rows(rows, &r0, &r1)))
        return tv__cli_usage("get", "bad --rows '%s': %s", rows,
                             u == -ERANGE ? "a bound overflows 64 bits"
                             : u == -EDOM ? "R0 is above R1"
                                          : "R0:R1 is two decimal numbers (digits only)");
    tv_open_opts oo;
    if ((u = read_opts("get", a, &oo)) || (u = src_usage("get", a)))
        return u;
    tv_error err = {0};
    src m;
    size_t idx, len = 0;
    tv_tensor_desc d;
    void *buf = NULL;
    int rc = src_open(&m, a, a->pos[0], &oo, &err);
    if (rc)
        goto out;
    if (find(m.m, a->pos[1], &idx)) {
        rc = tv__seterr(&err, TV_E_NOT_FOUND, "no tensor '%s' in %s@%" PRId64, a->pos[1],
                        tv_model_name(m.m), tv_model_generation(m.m));
        goto out;
    }
    tv_model_tensor(m.m, idx, &d);
    if ((rc = output_len(&d, a->pos[1], rows != NULL, r0, r1, f32, &len, &err)))
        goto out;
    if (!(buf = malloc(len ? len : 1))) {
        rc = tv__seterr(&err, -ENOMEM, "tensor '%s': out of memory for %zu bytes", a->pos[1], len);
        goto out;
    }
    if (rows)
        rc = tv_read_rows(m.m, a->pos[1], r0, r1, buf, len, &err);
    else if (f32)
        rc = tv_read_f32(m.m, a->pos[1], buf, len, &err);
    else
        rc = tv_read_into(m.m, a->pos[1], buf, len, &err);
    if (!rc)
        rc = write_file(outp, buf, len, &err);
out:
    if (rc)
        tv__cli_fail("get", json, rc, err.msg);
    else if (json) {
        json_t *o = json_pack("{s:s,s:I,s:s,s:s,s:I}", "model", tv_model_name(m.m), "generation",
                              (json_int_t)tv_model_generation(m.m), "tensor", a->pos[1], "output",
                              outp, "bytes", (json_int_t)len);
        json_dumpf(o, stdout, JSON_INDENT(2));
        fputc('\n', stdout);
        json_decref(o);
    }
    free(buf);
    src_close(&m);
    return rc ? TV__EXIT_FAIL : TV__EXIT_OK;
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
static int latency(src *m, const char *name, unsigned long count, bool json)
{
    tv_error err = {0};
    size_t idx;
    tv_tensor_desc d;
    if (find(m->m, name, &idx)) {
        tv__seterr(&err, TV_E_NOT_FOUND, "no tensor '%s' in %s@%" PRId64, name, tv_model_name(m->m),
                   tv_model_generation(m->m));
        tv__cli_fail("bench", json, err.code, err.msg);
        return TV__EXIT_FAIL;
    }
    tv_model_tensor(m->m, idx, &d);
    void *buf = malloc(d.nbytes ? d.nbytes : 1);
    double *t = malloc(sizeof(double) * count);
    if (!buf || !t) {
        free(buf);
        free(t);
        tv__cli_fail("bench", json, -ENOMEM, "out of memory");
        return TV__EXIT_FAIL;
    }
    int rc = 0;
    for (unsigned long i = 0; i < 10 && !rc; i++)
        rc = tv_read_into(m->m, name, buf, d.nbytes, &err);
    for (unsigned long i = 0; i < count && !rc; i++) {
        double t0 = now();
        rc = tv_read_into(m->m, name, buf, d.nbytes, &err);
        t[i] = (now() - t0) * 1e6;
    }
    if (rc) {
        tv__cli_fail("bench", json, rc, err.msg);
    } else {
        qsort(t, count, sizeof(double), cmp_double);
        double p50 = t[count / 2], p99 = t[(size_t)((double)count * 0.99)], mx = t[count - 1];
        if (json) {
            json_t *o =
                json_pack("{s:s,s:I,s:I,s:f,s:f,s:f,s:s}", "tensor", name, "bytes",
                          (json_int_t)d.nbytes, "count", (json_int_t)count, "p50_us", p50, "p99_us",
                          p99, "max_us", mx, "path", m->fp ? "fastpath" : "in-process");
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
    return rc ? TV__EXIT_FAIL : TV__EXIT_OK;
}

const tv__cli_cmd tv__cli_cmd_bench = {
    .name = "bench",
    .run = tv__cli_bench,
    .positionals = "NAME[@GEN|@ALIAS]",
    .min_pos = 1,
    .max_pos = 1,
    .flags = TV__CLI_SPEC,
    .opts = {{"--latency", "TENSOR", "[--latency TENSOR [--count N]]",
              "time N reads of TENSOR: p50, p99, max"},
             {"--count", "N", "", "reads for --latency, 1..10000000 (default 2000)"},
             {"--fresh", NULL, NULL,
              "into newly malloc'ed buffers (as a loader's), not a pre-faulted arena"},
             {"--copy-threads", "N", NULL,
              "threads copying into the destinations, 1..64 (default min(4, CPUs))"},
             {"--engine", "auto|uring|pread", NULL,
              "in-process reads: io_uring, a pread pool, or the best there is"},
             {"--qd", "N", NULL, "in-process reads in flight, 1..4096 (default 32)"},
             {"--chunk", "SIZE", NULL, "bytes per device read, 4K..1G (default 1M)"},
             {"--no-direct", NULL, NULL, "buffered reads, for filesystems without O_DIRECT"},
             {"--store", "DIR", NULL,
              "read the store in DIR in this process, not through tensorvaultd"},
             {"--socket", "PATH", NULL, "the daemon's fast-path socket (default: see below)"},
             {"--fastpath", "[SOCKET]", NULL,
              "through the daemon's fast path (SOCKET: as --socket)"},
             {"--views", NULL, NULL,
              "take a view of each tensor in the daemon's memory tier instead of copies"},
             {"--url", "URL", NULL,
              "the daemon's HTTP API, to report its device reads and tier hits"},
             {"--token-file", "FILE", NULL, "the API token for --url"},
             {"--json", NULL, NULL, "print the figures as JSON"}},
    .about = "Load every tensor of a generation into host memory (or views of them) and\n"
             "print bytes, seconds, GB/s and CPU seconds per GB; through the daemon, also what\n"
             "it read from its devices and served from its memory tier meanwhile. Reads go\n"
             "through the daemon's fast path when one is found, else --store DIR.",
    .example = "tensorvault bench llama\n"
               "tensorvault bench --store /srv/tv llama --fresh\n"
               "tensorvault bench llama --latency model.norm.weight --count 2000",
};

/* What the daemon's memory tier reports (GET /v1/status, its "tier"). */
typedef struct tier_figs {
    bool ok;
    uint64_t device_read, hit_bytes, miss_bytes;
} tier_figs;

/* The daemon's tier figures, when bench reads through the daemon and its
 * HTTP API is known: --url or $TENSORVAULT_URL, else the HTTP socket beside
 * the fast-path socket used (the daemon's defaults put both in one
 * directory). Nothing is asked of the default TCP address, which may be
 * another daemon's. */
static tier_figs daemon_tier(const tv__cli_ctx *c, const src *m)
{
    tier_figs t = {0};
    tv__cli_client cl;
    tv_error err = {0};
    json_t *doc = NULL;
    char beside[TV__CLI_WHERE_MAX];
    struct stat sb;
    const char *env = getenv("TENSORVAULT_URL");
    bool url = tv__cli_get(&c->a, "--url") || (env && *env);
    if (!m->fp)
        return t;
    snprintf(beside, sizeof beside, "%s", m->where.value);
    char *slash = strrchr(beside, '/');
    snprintf(slash ? slash + 1 : beside, sizeof beside - (size_t)(slash ? slash + 1 - beside : 0),
             "http.sock");
    if (!url && (stat(beside, &sb) != 0 || !S_ISSOCK(sb.st_mode)))
        return t;
    tv__cli_ctx rc = *c; /* remote only: --store is not the daemon's */
    for (size_t i = 0; i < rc.a.n_opts; i++) {
        if (!strcmp(rc.a.opts[i].name, "--store"))
            rc.a.values[i] = NULL;
        if (!url && !strcmp(rc.a.opts[i].name, "--url"))
            rc.a.values[i] = beside;
    }
    if (tv__cli_client_open(&rc, false, &cl, &err) == 0 && !cl.local &&
        tv__cli_call(&cl, "GET", "/v1/status", NULL, NULL, &doc, NULL, &err) == 0) {
        json_t *tier = json_object_get(doc, "tier");
        t.ok = json_is_object(tier);
        t.device_read = (uint64_t)json_integer_value(json_object_get(tier, "device_read_bytes"));
        t.hit_bytes = (uint64_t)json_integer_value(json_object_get(tier, "hit_bytes"));
        t.miss_bytes = (uint64_t)json_integer_value(json_object_get(tier, "miss_bytes"));
    }
    json_decref(doc);
    tv__cli_client_close(&cl);
    return t;
}

/* A view of every tensor of m (one batch), then each released: the
 * seconds the views took. */
static int bench_views(tv_model *m, size_t n, double *secs, tv_error *err)
{
    tv_view_req *v = calloc(n ? n : 1, sizeof(*v));
    if (!v)
        return tv__seterr(err, -ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++)
        v[i].index = i;
    double t0 = now();
    int rc = tv_tensor_view_batch(m, v, n, err);
    *secs = now() - t0;
    for (size_t i = 0; i < n; i++)
        tv_view_release(v[i].view);
    free(v);
    return rc;
}

/* What one bench run measured. */
typedef struct bench_res {
    size_t n;
    uint64_t total;
    double open_secs, secs, cpu, rss_mib, extra_mib;
    bool fresh, views;
    tier_figs t0, t1; /* the daemon's tier before and after (t0.ok && t1.ok: both known) */
} bench_res;

static void bench_print(const src *m, const bench_res *r, bool json)
{
    double cpu_per_gb = r->total ? r->cpu / ((double)r->total / 1e9) : 0.0;
    double gbs = r->secs > 0 ? (double)r->total / r->secs / 1e9 : 0.0;
    bool daemon = r->t0.ok && r->t1.ok;
    uint64_t dev = daemon ? r->t1.device_read - r->t0.device_read : 0;
    uint64_t hit = daemon ? r->t1.hit_bytes - r->t0.hit_bytes : 0;
    uint64_t miss = daemon ? r->t1.miss_bytes - r->t0.miss_bytes : 0;
    if (json) {
        json_t *o =
            json_pack("{s:s,s:I,s:I,s:I,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:b,s:b,s:s}", "model",
                      tv_model_name(m->m), "generation", (json_int_t)tv_model_generation(m->m),
                      "tensors", (json_int_t)r->n, "bytes", (json_int_t)r->total, "open_seconds",
                      r->open_secs, "seconds", r->secs, "gb_per_s", gbs, "peak_rss_mib", r->rss_mib,
                      "rss_beyond_buffers_mib", r->extra_mib, "cpu_seconds", r->cpu,
                      "cpu_seconds_per_gb", cpu_per_gb, "fresh", r->fresh, "views", r->views,
                      "path", m->fp ? "fastpath" : "in-process");
        if (daemon)
            json_object_set_new(o, "daemon",
                                json_pack("{s:I,s:I,s:I}", "device_read_bytes", (json_int_t)dev,
                                          "tier_hit_bytes", (json_int_t)hit, "tier_miss_bytes",
                                          (json_int_t)miss));
        json_dumpf(o, stdout, JSON_INDENT(2));
        fputc('\n', stdout);
        json_decref(o);
        return;
    }
    if (r->views)
        printf("%s@%" PRId64 ": views of %zu tensors (%" PRIu64
               " bytes) in %.4f s after an open of %.4f s\n",
               tv_model_name(m->m), tv_model_generation(m->m), r->n, r->total, r->secs,
               r->open_secs);
    else
        printf(
            "%s@%" PRId64 ": %zu tensors, %" PRIu64
            " bytes in %.3f s: %.2f GB/s, %.3f CPU-s/GB (%s destinations; peak RSS %.1f MiB, %.1f MiB beyond the destination buffers; open %.4f s)\n",
            tv_model_name(m->m), tv_model_generation(m->m), r->n, r->total, r->secs, gbs,
            cpu_per_gb, r->fresh ? "fresh" : "pre-faulted", r->rss_mib, r->extra_mib, r->open_secs);
    if (daemon)
        printf("daemon: %" PRIu64 " bytes read from devices (%.3f x the bytes loaded), %" PRIu64
               " bytes served from the memory tier, %" PRIu64
               " after a device read (every session of the daemon meanwhile)\n",
               dev, r->total ? (double)dev / (double)r->total : 0.0, hit, miss);
}

/* The destinations of a copying bench: one pre-faulted arena, or (fresh)
 * a malloc per tensor never touched before the load, as a real caller's
 * buffers (numpy.empty, torch.empty) are. Returns 0 or -ENOMEM (nothing
 * left allocated). */
static int bench_dests(tv_read_req *reqs, size_t n, uint64_t arena_len, bool fresh, uint8_t **arena)
{
    *arena = NULL;
    if (!fresh) {
        if (posix_memalign((void **)arena, 4096, arena_len ? arena_len : 4096))
            return -ENOMEM;
        memset(*arena, 0, arena_len);
    }
    uint64_t at = 0;
    for (size_t i = 0; i < n; i++) {
        if (fresh) {
            if (!(reqs[i].dest = malloc(reqs[i].dest_len ? reqs[i].dest_len : 1))) {
                for (size_t j = 0; j < i; j++)
                    free(reqs[j].dest);
                return -ENOMEM;
            }
            continue;
        }
        reqs[i].dest = *arena + at;
        uint64_t padded = 0; /* cannot fail: arena_len summed the same values */
        (void)tv__align_up_u64(reqs[i].dest_len, 64, &padded);
        at += padded;
    }
    return 0;
}

/* Loads every tensor of m (copies into destinations, or views with
 * r->views), timing it into r. Returns 0 or the error (err). */
static int bench_load(src *m, bench_res *r, tv_error *err)
{
    size_t n = r->n;
    uint64_t arena_len = 0;
    tv_read_req *reqs = calloc(n ? n : 1, sizeof(*reqs));
    bool ovf = false;
    for (size_t i = 0; reqs && i < n; i++) {
        tv_tensor_desc d;
        uint64_t padded;
        tv_model_tensor(m->m, i, &d);
        reqs[i].index = i;
        reqs[i].dest_len = (size_t)d.nbytes;
        ovf |= tv__add_u64(r->total, d.nbytes, &r->total) ||
               tv__align_up_u64(d.nbytes, 64, &padded) ||
               tv__add_u64(arena_len, padded, &arena_len) || arena_len > SIZE_MAX;
    }
    if (!reqs || ovf) {
        free(reqs);
        return tv__seterr(err, reqs ? TV_E_OVERFLOW : -ENOMEM,
                          "the destination buffers overflow the address space");
    }
    uint8_t *arena = NULL;
    if (!r->views && bench_dests(reqs, n, arena_len, r->fresh, &arena)) {
        free(reqs);
        return tv__seterr(err, -ENOMEM, "out of memory for the destination buffers");
    }
    struct rusage ru0, ru;
    getrusage(RUSAGE_SELF, &ru0);
    double t0 = now();
    int rc = r->views ? bench_views(m->m, n, &r->secs, err) : tv_read_batch(m->m, reqs, n, err);
    if (!r->views)
        r->secs = now() - t0;
    getrusage(RUSAGE_SELF, &ru);
    /* user + system CPU of every thread of the process during the load */
    r->cpu = (double)(ru.ru_utime.tv_sec - ru0.ru_utime.tv_sec) +
             (double)(ru.ru_stime.tv_sec - ru0.ru_stime.tv_sec) +
             (double)(ru.ru_utime.tv_usec - ru0.ru_utime.tv_usec) * 1e-6 +
             (double)(ru.ru_stime.tv_usec - ru0.ru_stime.tv_usec) * 1e-6;
    r->rss_mib = (double)ru.ru_maxrss / 1024.0;
    r->extra_mib = r->rss_mib - (double)(r->views   ? 0
                                         : r->fresh ? r->total
                                                    : arena_len) /
                                    1048576.0;
    for (size_t i = 0; r->fresh && !r->views && i < n; i++)
        free(reqs[i].dest);
    free(arena);
    free(reqs);
    return rc;
}

int tv__cli_bench(const tv__cli_ctx *c)
{
    const tv__cli_args *a = &c->a;
    bool json = c->json;
    uint64_t count = 2000, copy_threads = 0;
    bench_res r = {.fresh = tv__cli_flag(a, "--fresh"), .views = tv__cli_flag(a, "--views")};
    if (tv__cli_get(a, "--count") && !tv__cli_get(a, "--latency"))
        return tv__cli_usage("bench", "--count needs --latency TENSOR");
    if (r.views && tv__cli_get(a, "--store"))
        return tv__cli_usage("bench",
                             "--views takes views of the daemon's memory tier: not with --store");
    tv_open_opts oo;
    int u;
    if ((u = read_opts("bench", a, &oo)) || (u = src_usage("bench", a)) ||
        (u = tv__cli_opt_uint("bench", a, "--count", 1, TV__CLI_MAX_COUNT, &count)) ||
        (u = tv__cli_opt_uint("bench", a, "--copy-threads", 1, TV_READ_MAX_COPY_THREADS,
                              &copy_threads)))
        return u;
    oo.copy_threads = (uint32_t)copy_threads;
    tv_error err = {0};
    src ms, *m = &ms;
    double t0 = now();
    int rc = src_open(m, a, a->pos[0], &oo, &err);
    r.open_secs = now() - t0;
    if (!rc && r.views && !m->fp)
        rc = tv__seterr(
            &err, TV_E_INVALID_ARG,
            "--views takes views of the daemon's memory tier, and this reads the store %s in this process ($TENSORVAULT_STORE)",
            getenv("TENSORVAULT_STORE"));
    if (rc) {
        tv__cli_fail("bench", json, rc, err.msg);
        src_close(m);
        return TV__EXIT_FAIL;
    }
    if (tv__cli_get(a, "--latency")) {
        rc = latency(m, tv__cli_get(a, "--latency"), (unsigned long)count, json);
        src_close(m);
        return rc;
    }
    r.n = tv_model_n_tensors(m->m);
    r.t0 = daemon_tier(c, m);
    rc = bench_load(m, &r, &err);
    if (rc) {
        tv__cli_fail("bench", json, rc, err.msg);
    } else {
        if (r.t0.ok)
            r.t1 = daemon_tier(c, m);
        bench_print(m, &r, json);
    }
    src_close(m);
    return rc ? TV__EXIT_FAIL : TV__EXIT_OK;
}
