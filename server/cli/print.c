/* The one printer of the CLI: --json prints the API's document as it is;
 * otherwise a text rendering of it (tables for lists, "key: value" lines
 * for one object). Both local and remote mode print through here, so the
 * two agree byte for byte. A missing field prints "-", never crashes. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/client.h"
#include "util/internal.h"

static const char *S(const json_t *o, const char *k)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "-";
}

/* An integer field as text ("-" for null or absent). */
static const char *I(const json_t *o, const char *k, char *buf, size_t len)
{
    json_t *v = json_object_get(o, k);
    if (json_is_integer(v))
        snprintf(buf, len, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
    else if (json_is_real(v))
        snprintf(buf, len, "%.1f", json_real_value(v));
    else if (json_is_true(v))
        snprintf(buf, len, "yes");
    else if (json_is_false(v))
        snprintf(buf, len, "no");
    else
        snprintf(buf, len, "-");
    return buf;
}

static json_int_t N(const json_t *o, const char *k)
{
    return json_integer_value(json_object_get(o, k));
}

const char *tv__cli_fmt_bytes(uint64_t n, char *buf, size_t len)
{
    static const char *const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    if (n < 1024) {
        snprintf(buf, len, "%" PRIu64 " B", n);
        return buf;
    }
    size_t u = 0;
    double v = (double)n / 1024.0;
    /* 1023.96 KiB would print as "1024.0 KiB": that is 1.0 MiB */
    while (u + 1 < TV_ARRAY_LEN(units) && v >= 1023.95) {
        v /= 1024.0;
        u++;
    }
    snprintf(buf, len, "%.1f %s", v, units[u]);
    return buf;
}

const char *tv__cli_fmt_time(int64_t unix_s, char *buf, size_t len)
{
    time_t t = (time_t)unix_s;
    struct tm tm;
    if ((int64_t)t != unix_s || !localtime_r(&t, &tm) ||
        !strftime(buf, len, "%Y-%m-%d %H:%M:%S", &tm))
        snprintf(buf, len, "-");
    return buf;
}

const char *tv__cli_fmt_duration(double secs, char *buf, size_t len)
{
    if (!(secs >= 0) || secs > 1e12) { /* NaN, negative, absurd */
        snprintf(buf, len, "-");
        return buf;
    }
    if (secs < 60) {
        snprintf(buf, len, "%.1f s", secs);
        return buf;
    }
    uint64_t s = (uint64_t)(secs + 0.5);
    if (s < 3600)
        snprintf(buf, len, "%" PRIu64 "m%02" PRIu64 "s", s / 60, s % 60);
    else if (s < 86400)
        snprintf(buf, len, "%" PRIu64 "h%02" PRIu64 "m", s / 3600, s / 60 % 60);
    else
        snprintf(buf, len, "%" PRIu64 "d%02" PRIu64 "h", s / 86400, s / 3600 % 24);
    return buf;
}

/* A byte-count field in IEC units ("-" for null or absent). */
static const char *B(const json_t *o, const char *k, char *buf, size_t len)
{
    json_t *v = json_object_get(o, k);
    if (json_is_integer(v) && json_integer_value(v) >= 0)
        return tv__cli_fmt_bytes((uint64_t)json_integer_value(v), buf, len);
    snprintf(buf, len, "-");
    return buf;
}

/* A unix-seconds field as local time ("-" for null or absent). */
static const char *T(const json_t *o, const char *k, char *buf, size_t len)
{
    json_t *v = json_object_get(o, k);
    if (json_is_integer(v))
        return tv__cli_fmt_time((int64_t)json_integer_value(v), buf, len);
    snprintf(buf, len, "-");
    return buf;
}

/* How long a job ran: started_at to finished_at, or to now while it runs. */
static const char *job_duration(const json_t *j, char *buf, size_t len)
{
    json_t *st = json_object_get(j, "started_at"), *fi = json_object_get(j, "finished_at");
    if (!json_is_integer(st)) {
        snprintf(buf, len, "-");
        return buf;
    }
    double end = json_is_integer(fi) ? (double)json_integer_value(fi) : (double)time(NULL);
    return tv__cli_fmt_duration(end - (double)json_integer_value(st), buf, len);
}

/* [a,b,c] of integers, or a,b of strings (sep), into buf. */
static const char *list(const json_t *a, const char *open, const char *sep, const char *close,
                        char *buf, size_t len)
{
    size_t off = 0;
    size_t i;
    json_t *v;
    buf[0] = '\0';
#define PUT(...)                                                                                   \
    do {                                                                                           \
        int w_ = snprintf(buf + off, len - off, __VA_ARGS__);                                      \
        off = w_ < 0 || (size_t)w_ >= len - off ? len - 1 : off + (size_t)w_;                      \
    } while (0)
    PUT("%s", open);
    json_array_foreach(a, i, v)
    {
        if (json_is_integer(v))
            PUT("%s%" JSON_INTEGER_FORMAT, i ? sep : "", json_integer_value(v));
        else
            PUT("%s%s", i ? sep : "", json_string_value(v) ? json_string_value(v) : "?");
    }
    PUT("%s", close);
    if (!json_array_size(a) && !*open)
        snprintf(buf, len, "-");
    return buf;
}

/* Model.aliases is an object alias -> generation: "prod=3,canary=4". */
static const char *alias_map(const json_t *o, char *buf, size_t len)
{
    size_t off = 0;
    const char *k;
    json_t *v;
    bool first = true;
    buf[0] = '\0';
    json_object_foreach((json_t *)o, k, v)
    {
        PUT("%s%s=%" JSON_INTEGER_FORMAT, first ? "" : ",", k, json_integer_value(v));
        first = false;
    }
    if (first)
        snprintf(buf, len, "-");
    return buf;
}

/* "k=v,k2=v2" of a Tags object ("-" when none). */
static const char *tags_text(const json_t *tags, char *buf, size_t len)
{
    const char *k;
    json_t *v;
    size_t off = 0;
    buf[0] = '\0';
    json_object_foreach((json_t *)tags, k, v)
    {
        int w = snprintf(buf + off, len - off, "%s%s=%s", off ? "," : "", k, json_string_value(v));
        if (w < 0 || (size_t)w >= len - off)
            break;
        off += (size_t)w;
    }
    if (!off)
        snprintf(buf, len, "-");
    return buf;
}

/* Whether any object of arr has tags (the TAGS column is shown then). */
static bool any_tags(const json_t *arr)
{
    size_t i;
    json_t *o;
    json_array_foreach(arr, i, o) if (json_object_size(json_object_get(o, "tags"))) return true;
    return false;
}

static void models_table(FILE *f, const json_t *arr)
{
    char a[32], g[32], al[512], tg[1024];
    size_t i;
    json_t *m;
    bool tags = any_tags(arr);
    /* TAGS only when some model has tags: a column after ALIASES */
    fprintf(f, tags ? "%-40s %8s %12s  %-16s TAGS\n" : "%-40s %8s %12s  %s\n", "MODEL", "ACTIVE",
            "GENERATIONS", "ALIASES");
    json_array_foreach(arr, i, m)
    {
        const char *am = alias_map(json_object_get(m, "aliases"), al, sizeof al);
        if (tags)
            fprintf(f, "%-40s %8s %12s  %-16s %s\n", S(m, "name"),
                    I(m, "active_generation", a, sizeof a), I(m, "n_generations", g, sizeof g), am,
                    tags_text(json_object_get(m, "tags"), tg, sizeof tg));
        else
            fprintf(f, "%-40s %8s %12s  %s\n", S(m, "name"), I(m, "active_generation", a, sizeof a),
                    I(m, "n_generations", g, sizeof g), am);
    }
}

static void gens_table(FILE *f, const json_t *arr)
{
    char n[32], sh[32], t[32], b[32], ca[32], al[512];
    size_t i;
    json_t *g;
    char tg[1024];
    bool tags = any_tags(arr);
    fprintf(f, "%4s %-9s %6s %7s %9s %11s  %-19s  %-16s %s%s\n", "GEN", "STATE", "ACTIVE", "SHARDS",
            "TENSORS", "SIZE", "CREATED", "ALIASES", "SOURCE", tags ? "  TAGS" : "");
    json_array_foreach(arr, i, g) fprintf(
        f, "%4s %-9s %6s %7s %9s %11s  %-19s  %-16s %s%s%s\n", I(g, "generation", n, sizeof n),
        S(g, "state"), json_is_true(json_object_get(g, "active")) ? "*" : "",
        I(g, "n_shards", sh, sizeof sh), I(g, "n_tensors", t, sizeof t),
        B(g, "total_bytes", b, sizeof b), T(g, "created_at", ca, sizeof ca),
        list(json_object_get(g, "aliases"), "", ",", "", al, sizeof al), S(g, "source"),
        tags ? "  " : "", tags ? tags_text(json_object_get(g, "tags"), tg, sizeof tg) : "");
}

static void replicas_line(FILE *f, const json_t *reps)
{
    size_t i;
    json_t *r;
    json_array_foreach(reps, i, r)
    {
        char d[32], o[32], b[32];
        fprintf(f, "  replica: device %s offset %s", I(r, "device_id", d, sizeof d),
                I(r, "device_offset", o, sizeof o));
        if (json_object_get(r, "object_id"))
            fprintf(f, " (object %s)", I(r, "object_id", b, sizeof b));
        fputc('\n', f);
    }
}

static void generation_one(FILE *f, const json_t *g)
{
    char b[64], al[512];
    fprintf(f, "model:       %s\n", S(g, "model"));
    fprintf(f, "generation:  %s\n", I(g, "generation", b, sizeof b));
    fprintf(f, "state:       %s%s\n", S(g, "state"),
            json_is_true(json_object_get(g, "active")) ? " (active)" : "");
    fprintf(f, "aliases:     %s\n",
            list(json_object_get(g, "aliases"), "", ",", "", al, sizeof al));
    fprintf(f, "shards:      %s\n", I(g, "n_shards", b, sizeof b));
    fprintf(f, "tensors:     %s\n", I(g, "n_tensors", b, sizeof b));
    fprintf(f, "size:        %s (%s bytes)\n", B(g, "total_bytes", al, sizeof al),
            I(g, "total_bytes", b, sizeof b));
    fprintf(f, "source:      %s\n", S(g, "source"));
    if (json_is_string(json_object_get(g, "source_repo")))
        fprintf(f, "hub repo:    %s\nhub commit:  %s\n", S(g, "source_repo"),
                S(g, "source_commit"));
    fprintf(f, "created:     %s\n", T(g, "created_at", b, sizeof b));
    const char *desc = json_string_value(json_object_get(g, "description"));
    if (desc && *desc)
        fprintf(f, "description: %s\n", desc);
    if (json_object_size(json_object_get(g, "tags"))) {
        char tg[1024];
        fprintf(f, "tags:        %s\n", tags_text(json_object_get(g, "tags"), tg, sizeof tg));
    }
    size_t i;
    json_t *s;
    json_array_foreach(json_object_get(g, "shards"), i, s)
    {
        char x[32], y[32];
        fprintf(f, "shard %s: %s  %s  sha256 %s\n", I(s, "index", x, sizeof x), S(s, "name"),
                B(s, "file_bytes", y, sizeof y), S(s, "sha256"));
        replicas_line(f, json_object_get(s, "replicas"));
    }
}

/* The shard by its file name (the index is in --json and `tensor`). */
static void tensors_table(FILE *f, const json_t *arr, bool header)
{
    char shp[128], nb[32];
    size_t i;
    json_t *t;
    if (header)
        fprintf(f, "%-48s %-6s %-18s %11s  %s\n", "TENSOR", "DTYPE", "SHAPE", "SIZE", "SHARD");
    json_array_foreach(arr, i, t)
        fprintf(f, "%-48s %-6s %-18s %11s  %s\n", S(t, "name"), S(t, "dtype"),
                list(json_object_get(t, "shape"), "[", ",", "]", shp, sizeof shp),
                B(t, "nbytes", nb, sizeof nb), S(t, "shard"));
}

static void tensor_one(FILE *f, const json_t *t)
{
    char b[128];
    fprintf(f, "name:         %s\n", S(t, "name"));
    fprintf(f, "dtype:        %s\n", S(t, "dtype"));
    fprintf(f, "shape:        %s\n", list(json_object_get(t, "shape"), "[", ",", "]", b, sizeof b));
    fprintf(f, "shard:        %s (index %s)\n", S(t, "shard"),
            I(t, "shard_index", (char[32]){0}, 32));
    fprintf(f, "data_offsets: %s\n",
            list(json_object_get(t, "data_offsets"), "[", ",", "]", b, sizeof b));
    fprintf(f, "nbytes:       %s (%s)\n", I(t, "nbytes", b, sizeof b),
            B(t, "nbytes", (char[32]){0}, 32));
    fprintf(f, "file_offset:  %s\n", I(t, "file_offset", b, sizeof b));
    replicas_line(f, json_object_get(t, "replicas"));
}

static void devices_table(FILE *f, const json_t *arr, bool header)
{
    char id[32], lba[32], rg[32], u[32], fr[32];
    size_t i;
    json_t *d;
    if (header)
        fprintf(f, "%3s %-6s %-36s %6s %11s %11s %11s  %s\n", "ID", "KIND", "PATH", "LBA", "REGION",
                "USED", "FREE", "STATUS");
    json_array_foreach(arr, i, d)
    {
        const char *msg = S(d, "message");
        bool has_msg = strcmp(msg, "-") && *msg;
        fprintf(f, "%3s %-6s %-36s %6s %11s %11s %11s  %s%s%s\n", I(d, "id", id, sizeof id),
                S(d, "kind"), S(d, "path"), I(d, "lba_size", lba, sizeof lba),
                B(d, "region_bytes", rg, sizeof rg), B(d, "used_bytes", u, sizeof u),
                B(d, "free_bytes", fr, sizeof fr), S(d, "status"), has_msg ? ": " : "",
                has_msg ? msg : "");
    }
}

/* Each job with its start (local time) and how long it ran or runs. */
static void jobs_table(FILE *f, const json_t *arr)
{
    char id[32], d[32], t[32], g[32], st[32], du[32];
    size_t i;
    json_t *j;
    fprintf(f, "%6s %-6s %-9s %-32s %-8s %11s %11s %4s  %-19s %9s\n", "ID", "KIND", "STATE",
            "MODEL", "STEP", "DONE", "TOTAL", "GEN", "STARTED", "DURATION");
    json_array_foreach(arr, i, j) fprintf(
        f, "%6s %-6s %-9s %-32s %-8s %11s %11s %4s  %-19s %9s\n", I(j, "id", id, sizeof id),
        S(j, "kind"), S(j, "state"), S(j, "model"), S(j, "step"), B(j, "bytes_done", d, sizeof d),
        B(j, "bytes_total", t, sizeof t), I(j, "generation", g, sizeof g),
        T(j, "started_at", st, sizeof st), job_duration(j, du, sizeof du));
}

/* One line per open handle; a session without handles shows "-". */
static void sessions_table(FILE *f, const json_t *arr)
{
    char id[32], pid[32], uid[32], gen[32], dl[32];
    size_t i, k;
    json_t *s, *h;
    fprintf(f, "%6s %8s %8s %-32s %4s %11s\n", "ID", "PID", "UID", "MODEL", "GEN", "DELIVERED");
    json_array_foreach(arr, i, s)
    {
        I(s, "id", id, sizeof id);
        I(s, "pid", pid, sizeof pid);
        I(s, "uid", uid, sizeof uid);
        const json_t *hs = json_object_get(s, "handles");
        if (json_array_size(hs) == 0)
            fprintf(f, "%6s %8s %8s %-32s %4s %11s\n", id, pid, uid, "-", "-",
                    B(s, "bytes_delivered", dl, sizeof dl));
        json_array_foreach(hs, k, h)
            fprintf(f, "%6s %8s %8s %-32s %4s %11s\n", id, pid, uid, S(h, "model"),
                    I(h, "generation", gen, sizeof gen), B(h, "bytes_delivered", dl, sizeof dl));
    }
}

/* GET /v1/fleet: the catalog line, the nodes, per alias its placed nodes. */
static void fleet_doc(FILE *f, const json_t *doc)
{
    char a[32], b[32], d[32];
    size_t i, k;
    json_t *n, *al, *p;
    const json_t *cat = json_object_get(doc, "catalog");
    fprintf(f, "mode:    %s\n", S(doc, "mode"));
    if (strcmp(S(doc, "mode"), "fleet")) {
        if (!strcmp(S(doc, "mode"), "standalone"))
            fputs("(standalone: set fleet.postgres to join a fleet)\n", f);
        return;
    }
    fprintf(f, "node:    %s (%s)\n", S(doc, "node"), S(doc, "url"));
    if (json_is_object(cat))
        fprintf(f, "catalog: %s, %s%s%s\n", S(cat, "where"),
                json_is_true(json_object_get(cat, "connected")) ? "connected" : "not connected",
                json_is_string(json_object_get(cat, "error")) ? ": " : "",
                json_is_string(json_object_get(cat, "error")) ? S(cat, "error") : "");
    fprintf(f, "\n%-24s %-40s %-8s %-5s %8s\n", "NODE", "URL", "STATE", "UP", "AGE_S");
    json_array_foreach(json_object_get(doc, "nodes"), i, n)
    {
        double age = json_number_value(json_object_get(n, "age_s"));
        const json_t *up = json_object_get(n, "up"); /* seen within fleet.node_down_s */
        fprintf(f, "%-24s %-40s %-8s %-5s %8.1f\n", S(n, "name"), S(n, "url"), S(n, "state"),
                (json_is_boolean(up) ? json_is_true(up) : age < 30) ? "up" : "down", age);
    }
    json_array_foreach(json_object_get(doc, "aliases"), i, al)
    {
        char pl[512];
        const json_t *plj = json_object_get(al, "placement");
        fprintf(f, "\n%s@%s -> generation %s (version %s, placement %s, quorum %s, timeout %s s)\n",
                S(al, "model"), S(al, "alias"), I(al, "generation", a, sizeof a),
                I(al, "version", b, sizeof b),
                json_is_array(plj) ? list(plj, "", ",", "", pl, sizeof pl) : "every node",
                I(al, "quorum", d, sizeof d), I(al, "timeout_s", (char[32]){0}, 32));
        fprintf(f, "  %-24s %-8s %11s %11s %6s %9s %8s %-4s %s\n", "NODE", "STATE", "DONE", "TOTAL",
                "%", "MIB/S", "SERVING", "UP", "ERROR");
        json_array_foreach(json_object_get(al, "nodes"), k, p)
        {
            json_int_t done = N(p, "bytes_done"), total = N(p, "bytes_total");
            double pct = total > 0 ? 100.0 * (double)done / (double)total : 0.0;
            fprintf(
                f, "  %-24s %-8s %11s %11s %5.1f%% %9.1f %8s %-4s %s\n", S(p, "node"),
                S(p, "state"), B(p, "bytes_done", a, sizeof a), B(p, "bytes_total", b, sizeof b),
                pct, json_number_value(json_object_get(p, "rate_bps")) / 1048576.0,
                I(p, "serving", d, sizeof d), json_is_true(json_object_get(p, "up")) ? "yes" : "no",
                json_is_string(json_object_get(p, "error")) ? S(p, "error") : "-");
        }
    }
    if (json_array_size(json_object_get(doc, "generations")))
        fprintf(f, "\n%-32s %6s %11s %s\n", "MODEL", "GEN", "SIZE", "HOLDERS");
    json_array_foreach(json_object_get(doc, "generations"), i, n)
    {
        char h[512];
        fprintf(f, "%-32s %6s %11s %s\n", S(n, "model"), I(n, "number", a, sizeof a),
                B(n, "total_bytes", b, sizeof b),
                list(json_object_get(n, "holders"), "", ",", "", h, sizeof h));
    }
}

static void job_one(FILE *f, const json_t *j)
{
    char b[64];
    fprintf(f, "job:        %s (%s)\n", I(j, "id", b, sizeof b), S(j, "kind"));
    fprintf(f, "state:      %s\n", S(j, "state"));
    fprintf(f, "model:      %s\n", S(j, "model"));
    fprintf(f, "source:     %s\n", S(j, "source"));
    fprintf(f, "step:       %s\n", S(j, "step"));
    fprintf(f, "done:       %s of %s\n", B(j, "bytes_done", b, sizeof b),
            B(j, "bytes_total", (char[32]){0}, 32));
    fprintf(f, "generation: %s\n", I(j, "generation", b, sizeof b));
    fprintf(f, "created:    %s\n", T(j, "created_at", b, sizeof b));
    fprintf(f, "started:    %s\n", T(j, "started_at", b, sizeof b));
    fprintf(f, "finished:   %s\n", T(j, "finished_at", b, sizeof b));
    fprintf(f, "duration:   %s\n", job_duration(j, b, sizeof b));
    json_t *e = json_object_get(j, "error");
    if (json_is_object(e))
        fprintf(f, "error:      %s: %s\n", S(e, "code"), S(e, "message"));
}

static void import_line(FILE *f, const json_t *r)
{
    json_int_t written = N(r, "written_bytes");
    double secs = json_number_value(json_object_get(r, "seconds"));
    char al[512], tb[32], wb[32], db[32], rb[32], rate[32], du[32];
    const json_t *aliases = json_object_get(r, "aliases");
    tv__cli_fmt_bytes(secs > 0 && written > 0 ? (uint64_t)((double)written / secs) : 0, rate,
                      sizeof rate);
    fprintf(
        f,
        "imported %s generation %" JSON_INTEGER_FORMAT "%s%s%s: %" JSON_INTEGER_FORMAT
        " shards, %" JSON_INTEGER_FORMAT
        " tensors, %s; %s written, %s deduplicated%s%s%s in %s (%s/s)\n",
        S(r, "model"), N(r, "generation"),
        json_is_true(json_object_get(r, "active")) ? " (active)" : "",
        json_array_size(aliases) ? " alias " : "",
        json_array_size(aliases) ? list(aliases, "", ",", "", al, sizeof al) : "", N(r, "n_shards"),
        N(r, "n_tensors"), B(r, "total_bytes", tb, sizeof tb), B(r, "written_bytes", wb, sizeof wb),
        B(r, "deduplicated_bytes", db, sizeof db), N(r, "resumed_bytes") ? ", " : "",
        N(r, "resumed_bytes") ? B(r, "resumed_bytes", rb, sizeof rb) : "",
        N(r, "resumed_bytes") ? " resumed" : "", tv__cli_fmt_duration(secs, du, sizeof du), rate);
}

static void tokens_table(FILE *f, const json_t *arr)
{
    char id[32], c[32], r[32];
    size_t i;
    json_t *t;
    fprintf(f, "%4s %-32s %-6s %-19s  %s\n", "ID", "NAME", "SCOPE", "CREATED", "REVOKED");
    json_array_foreach(arr, i, t)
        fprintf(f, "%4s %-32s %-6s %-19s  %s\n", I(t, "id", id, sizeof id), S(t, "name"),
                S(t, "scope"), T(t, "created_at", c, sizeof c), T(t, "revoked_at", r, sizeof r));
}

/* The memory tier's lines of `tensorvault status` (a daemon that reports
 * none prints none). */
static void tier_lines(FILE *f, const json_t *t)
{
    char a[32], b[32], c[32], d[32];
    if (!json_is_object(t))
        return;
    if (!json_is_true(json_object_get(t, "enabled"))) {
        fprintf(f, "memory tier:     off (the fast path is not running)\n");
        return;
    }
    uint64_t hits = (uint64_t)json_integer_value(json_object_get(t, "hits"));
    uint64_t misses = (uint64_t)json_integer_value(json_object_get(t, "misses"));
    fprintf(f, "memory tier:     %s of %s resident (budget %s), %s generations, %s pages\n",
            B(t, "resident_bytes", a, sizeof a), B(t, "bound_bytes", b, sizeof b),
            B(t, "budget_bytes", c, sizeof c), I(t, "generations", d, sizeof d), S(t, "pages"));
    fprintf(f, "tier hits:       %s of %" PRIu64 " chunks (%.1f%%), %s; %s read from devices\n",
            I(t, "hits", a, sizeof a), hits + misses,
            hits + misses ? 100.0 * (double)hits / (double)(hits + misses) : 0.0,
            B(t, "hit_bytes", b, sizeof b), B(t, "device_read_bytes", c, sizeof c));
    fprintf(f, "tier evictions:  %s (%s); views pin %s\n", I(t, "evictions", a, sizeof a),
            B(t, "evicted_bytes", b, sizeof b), B(t, "view_bytes", c, sizeof c));
}

void tv__cli_print(FILE *f, bool json, tv__cli_doc kind, const json_t *doc)
{
    char b[64], c[64];
    if (json) {
        json_dumpf(doc, f, JSON_INDENT(2) | JSON_ENSURE_ASCII);
        fputc('\n', f);
        return;
    }
    switch (kind) {
    case TV__DOC_MODELS:
        models_table(f, json_object_get(doc, "models"));
        break;
    case TV__DOC_MODEL: {
        json_t *a = json_array();
        json_array_append(a, (json_t *)doc);
        models_table(f, a);
        json_decref(a);
        break;
    }
    case TV__DOC_GENERATIONS:
        gens_table(f, json_object_get(doc, "generations"));
        break;
    case TV__DOC_GENERATION:
        generation_one(f, doc);
        break;
    case TV__DOC_TENSORS:
        tensors_table(f, json_object_get(doc, "tensors"), true);
        break;
    case TV__DOC_TENSOR:
        tensor_one(f, doc);
        break;
    case TV__DOC_DEVICES:
        devices_table(f, json_object_get(doc, "devices"), true);
        break;
    case TV__DOC_DEVICE: {
        json_t *a = json_array();
        json_array_append(a, (json_t *)doc);
        devices_table(f, a, true);
        json_decref(a);
        break;
    }
    case TV__DOC_ALIASES: {
        size_t i;
        json_t *a;
        fprintf(f, "%-24s %10s\n", "ALIAS", "GENERATION");
        json_array_foreach(json_object_get(doc, "aliases"), i, a)
            fprintf(f, "%-24s %10s\n", S(a, "alias"), I(a, "generation", b, sizeof b));
        break;
    }
    case TV__DOC_ALIAS:
        fprintf(f, "%s@%s -> generation %s\n", S(doc, "model"), S(doc, "alias"),
                I(doc, "generation", b, sizeof b));
        break;
    case TV__DOC_ALIAS_REMOVED:
        fprintf(f, "removed alias %s of %s (was generation %s)\n", S(doc, "alias"), S(doc, "model"),
                I(doc, "generation", b, sizeof b));
        break;
    case TV__DOC_JOBS:
        jobs_table(f, json_object_get(doc, "jobs"));
        break;
    case TV__DOC_SESSIONS:
        sessions_table(f, json_object_get(doc, "sessions"));
        break;
    case TV__DOC_FLEET:
        fleet_doc(f, doc);
        break;
    case TV__DOC_FLEET_ALIAS: {
        char pl[512];
        const json_t *plj = json_object_get(doc, "placement");
        fprintf(f, "fleet alias %s@%s -> generation %s (version %s, placement %s)\n",
                S(doc, "model"), S(doc, "alias"), I(doc, "generation", b, sizeof b),
                I(doc, "version", c, sizeof c),
                json_is_array(plj) ? list(plj, "", ",", "", pl, sizeof pl) : "every node");
        break;
    }
    case TV__DOC_JOB:
    case TV__DOC_CANCELLED:
        job_one(f, doc);
        break;
    case TV__DOC_IMPORT:
        import_line(f, doc);
        break;
    case TV__DOC_VERIFY:
        fprintf(f, "verify: %s objects, %s, %s failed\n", I(doc, "n_objects", b, sizeof b),
                B(doc, "verified_bytes", c, sizeof c), I(doc, "n_failed", (char[32]){0}, 32));
        break;
    case TV__DOC_GC:
        fprintf(f, "gc: freed %s objects, %s\n", I(doc, "n_objects_freed", b, sizeof b),
                B(doc, "freed_bytes", c, sizeof c));
        break;
    case TV__DOC_DELETED:
        fprintf(f, "deleted model %s: %s generations retired, %s freed\n", S(doc, "model"),
                I(doc, "n_generations_retired", b, sizeof b), B(doc, "freed_bytes", c, sizeof c));
        break;
    case TV__DOC_DEACTIVATED:
        fprintf(f, "model %s has no active generation\n", S(doc, "name"));
        break;
    case TV__DOC_ACTIVATED:
        fprintf(f, "activated generation %s of %s\n", I(doc, "generation", b, sizeof b),
                S(doc, "model"));
        break;
    case TV__DOC_RETIRED:
        fprintf(f, "retired generation %s of %s\n", I(doc, "generation", b, sizeof b),
                S(doc, "model"));
        break;
    case TV__DOC_TOKENS:
        tokens_table(f, json_object_get(doc, "tokens"));
        break;
    case TV__DOC_TOKEN:
        if (json_is_string(json_object_get(doc, "token"))) {
            fprintf(f, "token %s (id %s, scope %s); the secret is shown once:\n%s\n",
                    S(doc, "name"), I(doc, "id", b, sizeof b), S(doc, "scope"), S(doc, "token"));
        } else {
            json_t *a = json_array();
            json_array_append(a, (json_t *)doc);
            tokens_table(f, a);
            json_decref(a);
        }
        break;
    case TV__DOC_TOKEN_REVOKED:
        fprintf(f, "revoked token %s (%s)\n", I(doc, "id", b, sizeof b), S(doc, "name"));
        break;
    case TV__DOC_VERSION: {
        json_t *ft = json_object_get(doc, "features");
        fprintf(f, "%s %s (git %s, api %s; cuda %s, nvme %s, io_uring %s)\n", S(doc, "name"),
                S(doc, "version"), S(doc, "git"), S(doc, "api"), I(ft, "cuda", b, sizeof b),
                I(ft, "nvme", c, sizeof c), I(ft, "io_uring", (char[32]){0}, 32));
        break;
    }
    case TV__DOC_STATUS: {
        json_t *j = json_object_get(doc, "jobs");
        fprintf(f, "version:         %s\n", S(doc, "version"));
        fprintf(f, "store:           %s\n", S(doc, "store"));
        fprintf(f, "uptime:          %s\n",
                tv__cli_fmt_duration(json_number_value(json_object_get(doc, "uptime_seconds")), b,
                                     sizeof b));
        fprintf(f, "models:          %s\n", I(doc, "n_models", b, sizeof b));
        fprintf(f, "devices:         %s\n", I(doc, "n_devices", b, sizeof b));
        fprintf(f, "jobs:            %s queued, %s running\n", I(j, "queued", b, sizeof b),
                I(j, "running", c, sizeof c));
        fprintf(f, "anonymous_reads: %s\n", I(doc, "anonymous_reads", b, sizeof b));
        tier_lines(f, json_object_get(doc, "tier"));
        break;
    }
    }
}

void tv__cli_print_activated(FILE *f, const json_t *doc, int64_t was)
{
    char b[32];
    fprintf(f, "activated generation %s of %s", I(doc, "generation", b, sizeof b), S(doc, "model"));
    if (was > 0)
        fprintf(f, " (was %" PRId64 ")\n", was);
    else
        fprintf(f, was == 0 ? " (was none)\n" : "\n");
}

const char *tv__cli_progress_format(char *buf, size_t len, uint64_t done, uint64_t total,
                                    double rate, double eta, const char *step)
{
    double pct = total ? 100.0 * (double)done / (double)total : 0.0;
    if (pct > 100.0)
        pct = 100.0;
    int fill = (int)(pct / 100.0 * 30);
    char bar[31];
    for (int i = 0; i < 30; i++)
        bar[i] = i < fill ? '#' : '.';
    bar[30] = '\0';
    char e[32];
    if (eta < 0)
        snprintf(e, sizeof e, "ETA    -");
    else if (eta < 3600)
        snprintf(e, sizeof e, "ETA %2d:%02d", (int)eta / 60, (int)eta % 60);
    else
        snprintf(e, sizeof e, "ETA %dh%02d", (int)(eta / 3600), ((int)eta % 3600) / 60);
    snprintf(buf, len, "[%s] %5.1f%% %8.1f / %.1f MiB %8.1f MB/s  %s%s%s", bar, pct,
             (double)done / 1048576.0, (double)total / 1048576.0, rate > 0 ? rate / 1e6 : 0.0, e,
             step && *step ? "  " : "", step && *step ? step : "");
    return buf;
}

void tv__cli_progress_start(tv__cli_progress *p, bool json)
{
    memset(p, 0, sizeof(*p));
    p->on = !json && isatty(2);
    p->t0 = p->last = p->last_t = tv__cli_mono();
}

void tv__cli_progress_draw(tv__cli_progress *p, uint64_t done, uint64_t total, double rate,
                           double eta, const char *step)
{
    double t = tv__cli_mono();
    if (!p || !p->on || (p->drawn && t - p->last < 0.1 && done < total))
        return;
    p->last = t;
    if (rate < 0) {
        double el = t - p->t0;
        rate = el > 0 ? (double)done / el : 0;
    }
    if (eta < 0 && rate > 0 && total >= done)
        eta = (double)(total - done) / rate;
    char line[256];
    fprintf(stderr, "\r%s\033[K",
            tv__cli_progress_format(line, sizeof line, done, total, rate, eta, step));
    fflush(stderr);
    p->drawn = true;
}

void tv__cli_progress_end(tv__cli_progress *p)
{
    if (p && p->on && p->drawn) {
        fputc('\n', stderr);
        fflush(stderr);
        p->drawn = false;
    }
}

void tv__cli_progress_job(tv__cli_progress *p, const json_t *job)
{
    /* The job's own rate and ETA when it knows them, else the bar's clock. */
    json_t *eta = json_object_get(job, "eta_seconds");
    double rate = json_number_value(json_object_get(job, "rate_bytes_per_s"));
    tv__cli_progress_draw(p, (uint64_t)N(job, "bytes_done"), (uint64_t)N(job, "bytes_total"),
                          rate > 0 ? rate : -1, json_is_number(eta) ? json_number_value(eta) : -1,
                          json_string_value(json_object_get(job, "step")));
}
