/* Test tool: reads every tensor of a model with one of the public read
 * functions (tensorvault.h) and writes each to OUTDIR/<index>.bin. The model
 * is opened in-process from a store directory (tv_model_open) or, with
 * --fastpath, through tensorvaultd's fast path (tv_model_open_daemon): the
 * reads are the same calls either way. The differential tests compare the
 * files with the official safetensors loader and across the two openings.
 *   tv_dump STORE NAME[@GEN] MODE OUTDIR [ENGINE]
 *   tv_dump --fastpath SOCKET NAME[@GEN] MODE OUTDIR
 *   MODE: into (or host: tv_read_into) | batch (tv_read_batch, every tensor
 *   at once, by name and by index alternately) | rows (tv_rows_len and
 *   tv_read_rows: rows [0, r/2) then [r/2, r), concatenated; a scalar or a
 *   sub-byte dtype as a whole read) | f32 (tv_read_f32; tensors without a
 *   float32 conversion are skipped: no file, no entry) | get
 *   (tv_get_tensor) | headers (tv_read_shard_header: every shard's first
 *   8 + header_len bytes to OUTDIR/<shard>.bin)
 *   ENGINE: auto | uring | pread (the store's read engine)
 * Output: one JSON line per tensor on stdout {"name","dtype","shape",
 * "index","file"} and the same list in OUTDIR/index.json; for headers one
 * line per shard {"shard","name","file_len","header_len","file"}.
 * Guard bytes: every destination sits at an odd offset between 4 KiB of
 * 0xA5 on each side; a changed guard byte fails the tool (exit 1) naming
 * the tensor or shard. Exit status 0, 1 (an error, named on stderr), 2
 * (usage). */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "tensorvault/client.h"
#include "tensorvault/tensorvault.h"

#define PROG       "tv_dump"
#define GUARD      4096
#define GUARD_BYTE 0xA5

/* A buffer of GUARD + 1 + len + GUARD bytes of GUARD_BYTE (NULL when out
 * of memory); the destination is dest_of(buf), deliberately unaligned. */
static uint8_t *guarded_alloc(size_t len)
{
    uint8_t *b = malloc(len + 2 * GUARD + 1);
    if (b)
        memset(b, GUARD_BYTE, len + 2 * GUARD + 1);
    return b;
}

static uint8_t *dest_of(uint8_t *buf)
{
    return buf + GUARD + 1;
}

static int check_side(const uint8_t *p, size_t n, const char *what, const char *side)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != GUARD_BYTE) {
            fprintf(stderr, PROG ": guard byte %zu %s %s changed to 0x%02x\n", i, side, what, p[i]);
            return 1;
        }
    return 0;
}

/* 1 (and a message naming what) when a guard byte of buf changed. */
static int check_guards(uint8_t *buf, size_t len, const char *what)
{
    return check_side(buf, GUARD + 1, what, "before") ||
           check_side(dest_of(buf) + len, GUARD, what, "after");
}

/* Writes [p, p + len) to OUTDIR/<i>.bin, its path into path. 0 or 1. */
static int write_bin(const char *outdir, size_t i, const void *p, size_t len, char *path,
                     size_t path_len)
{
    snprintf(path, path_len, "%s/%zu.bin", outdir, i);
    FILE *f = fopen(path, "wb");
    bool ok = f && fwrite(p, 1, len, f) == len;
    if (f && fclose(f))
        ok = false;
    if (!ok)
        fprintf(stderr, PROG ": write %s failed\n", path);
    return ok ? 0 : 1;
}

static void print_line(json_t *o)
{
    char *line = json_dumps(o, JSON_COMPACT);
    printf("%s\n", line);
    free(line);
}

/* Every shard's header, each into a guarded buffer. */
static int dump_headers(tv_model *m, const char *outdir)
{
    for (size_t i = 0; i < tv_model_n_shards(m); i++) {
        tv_shard_desc sd;
        tv_error err = {0};
        char path[4096], what[64];
        if (tv_model_shard(m, i, &sd)) {
            fprintf(stderr, PROG ": shard %zu: no descriptor\n", i);
            return 1;
        }
        size_t len = (size_t)(8 + sd.header_len);
        uint8_t *buf = guarded_alloc(len);
        if (!buf) {
            fprintf(stderr, PROG ": out of memory\n");
            return 1;
        }
        snprintf(what, sizeof(what), "shard %zu header", i);
        int rc = tv_read_shard_header(m, i, dest_of(buf), len, &err), bad = 0;
        if (rc) {
            fprintf(stderr, PROG ": headers: %s: %s: %s\n", what, tv_err_name(rc), err.msg);
            bad = 1;
        }
        if (!bad)
            bad = check_guards(buf, len, what);
        if (!bad)
            bad = write_bin(outdir, i, dest_of(buf), len, path, sizeof(path));
        if (!bad) {
            json_t *o = json_pack("{s:I,s:s%,s:I,s:I,s:s}", "shard", (json_int_t)i, "name", sd.name,
                                  sd.name_len, "file_len", (json_int_t)sd.file_len, "header_len",
                                  (json_int_t)sd.header_len, "file", path);
            print_line(o);
            json_decref(o);
        }
        free(buf);
        if (bad)
            return 1;
    }
    return 0;
}

/* Rows [0, h) and [h, r) of tensor d read separately into dst. */
static int read_rows(tv_model *m, const tv_tensor_desc *d, uint8_t *dst, size_t len, tv_error *err)
{
    uint64_t r = d->rank ? d->shape[0] : 0, h = r / 2, l0 = 0, l1 = 0;
    if (d->rank == 0 || tv_dtype_bits(d->dtype) % 8)
        return tv_read_into(m, d->name, dst, len, err);
    int rc = tv_rows_len(m, d->name, 0, h, &l0, err);
    if (!rc)
        rc = tv_rows_len(m, d->name, h, r, &l1, err);
    if (!rc && l0 + l1 != len) {
        snprintf(err->msg, sizeof(err->msg), "rows give %" PRIu64 " + %" PRIu64 " bytes, not %zu",
                 l0, l1, len);
        rc = TV_E_INTERNAL;
    }
    if (!rc)
        rc = tv_read_rows(m, d->name, 0, h, dst, (size_t)l0, err);
    if (!rc)
        rc = tv_read_rows(m, d->name, h, r, dst + l0, (size_t)l1, err);
    return rc;
}

/* get mode: tensor d with tv_get_tensor, which must describe d (bytes,
 * dtype, rank, shape); its bytes are copied to dst. */
static int get_tensor(tv_model *m, const tv_tensor_desc *d, void *dst, size_t len, tv_error *err)
{
    tv_tensor *t = NULL;
    int rc = tv_get_tensor(m, d->name, &t, err);
    if (rc)
        return rc;
    if (t->nbytes != d->nbytes || t->dtype != d->dtype || t->rank != d->rank ||
        memcmp(t->shape, d->shape, sizeof(uint64_t) * d->rank)) {
        snprintf(err->msg, sizeof(err->msg), "the tv_tensor does not match its descriptor");
        rc = TV_E_INTERNAL;
    } else {
        memcpy(dst, t->data, len);
    }
    tv_tensor_free(t);
    return rc;
}

/* Reads tensor i (d) in mode into bufs[i] (reqs[i]: the batch's result);
 * *skip: no conversion in f32 mode. */
static int read_tensor(tv_model *m, const char *mode, size_t i, const tv_tensor_desc *d,
                       uint8_t *dst, size_t len, const tv_read_req *reqs, bool *skip, tv_error *err)
{
    int rc;
    *skip = false;
    if (!strcmp(mode, "into") || !strcmp(mode, "host"))
        return tv_read_into(m, d->name, dst, len, err);
    if (!strcmp(mode, "rows"))
        return read_rows(m, d, dst, len, err);
    if (!strcmp(mode, "get"))
        return get_tensor(m, d, dst, len, err);
    if (!strcmp(mode, "f32")) {
        rc = tv_read_f32(m, d->name, dst, len, err);
        *skip = rc == TV_E_NOT_SUPPORTED;
        return *skip ? 0 : rc;
    }
    return reqs[i].result; /* batch */
}

static int dump_tensors(tv_model *m, const char *mode, const char *outdir)
{
    bool f32 = !strcmp(mode, "f32");
    size_t n = tv_model_n_tensors(m);
    uint8_t **bufs = calloc(n ? n : 1, sizeof(*bufs));
    size_t *lens = calloc(n ? n : 1, sizeof(*lens));
    tv_read_req *reqs = calloc(n ? n : 1, sizeof(*reqs));
    json_t *idx = json_array();
    tv_error err = {0};
    int rc, bad = !bufs || !lens || !reqs;
    for (size_t i = 0; i < n && !bad; i++) {
        tv_tensor_desc d;
        tv_model_tensor(m, i, &d);
        lens[i] = (size_t)(f32 ? d.n_elements * 4 : d.nbytes);
        bad = !(bufs[i] = guarded_alloc(lens[i]));
        /* by name and by index, alternately */
        reqs[i] = (tv_read_req){.name = i % 2 ? NULL : d.name,
                                .index = i,
                                .dest = bad ? NULL : dest_of(bufs[i]),
                                .dest_len = lens[i]};
    }
    if (bad)
        fprintf(stderr, PROG ": out of memory\n");
    if (!bad && !strcmp(mode, "batch") && (rc = tv_read_batch(m, reqs, n, &err))) {
        fprintf(stderr, PROG ": batch: %s: %s\n", tv_err_name(rc), err.msg);
        bad = 1;
    }
    for (size_t i = 0; i < n && !bad; i++) {
        tv_tensor_desc d;
        bool skip;
        char path[4096];
        tv_model_tensor(m, i, &d);
        uint8_t *dst = dest_of(bufs[i]);
        if ((rc = read_tensor(m, mode, i, &d, dst, lens[i], reqs, &skip, &err))) {
            fprintf(stderr, PROG ": %s '%s': %s: %s\n", mode, d.name, tv_err_name(rc), err.msg);
            bad = 1;
            break;
        }
        if ((bad = check_guards(bufs[i], lens[i], d.name)))
            break;
        if (skip)
            continue;
        if ((bad = write_bin(outdir, i, dst, lens[i], path, sizeof(path))))
            break;
        json_t *o = json_pack("{s:s%,s:s,s:o,s:I,s:s}", "name", d.name, d.name_len, "dtype",
                              tv_dtype_name(d.dtype), "shape", json_array(), "index", (json_int_t)i,
                              "file", path);
        json_t *shape = json_object_get(o, "shape");
        for (uint32_t k = 0; k < d.rank; k++)
            json_array_append_new(shape, json_integer((json_int_t)d.shape[k]));
        print_line(o);
        json_array_append_new(idx, o);
    }
    if (!bad) {
        char path[4096];
        snprintf(path, sizeof(path), "%s/index.json", outdir);
        if (json_dump_file(idx, path, JSON_INDENT(1))) {
            fprintf(stderr, PROG ": write %s failed\n", path);
            bad = 1;
        }
    }
    json_decref(idx);
    for (size_t i = 0; bufs && i < n; i++)
        free(bufs[i]);
    free(bufs);
    free(lens);
    free(reqs);
    return bad;
}

static const char *const MODES[] = {"into", "host", "batch", "rows", "f32", "get", "headers"};

int main(int argc, char **argv)
{
    bool fp = argc > 1 && !strcmp(argv[1], "--fastpath");
    char **a = argv + (fp ? 2 : 1);
    int na = argc - (fp ? 2 : 1);
    bool mode_ok = false;
    if (na >= 4)
        for (size_t i = 0; i < sizeof(MODES) / sizeof(MODES[0]); i++)
            mode_ok |= !strcmp(a[2], MODES[i]);
    if (na < 4 || na > (fp ? 4 : 5) || !mode_ok) {
        fprintf(stderr, "usage: tv_dump STORE NAME[@GEN] MODE OUTDIR [auto|uring|pread]\n"
                        "       tv_dump --fastpath SOCKET NAME[@GEN] MODE OUTDIR\n"
                        "MODE: into|host|batch|rows|f32|get|headers\n");
        return 2;
    }
    const char *where = a[0], *spec = a[1], *mode = a[2], *outdir = a[3];
    tv_open_opts o = {0};
    if (na > 4 && !strcmp(a[4], "uring"))
        o.engine = TV_ENGINE_URING;
    else if (na > 4 && !strcmp(a[4], "pread"))
        o.engine = TV_ENGINE_PREAD;
    o.chunk_len = 256 << 10; /* small chunks: big tensors span several */
    tv_client *c = NULL;
    tv_model *m = NULL;
    tv_error err = {0};
    int rc = fp ? tv_client_connect(where, NULL, &c, &err) : 0;
    if (!rc)
        rc = fp ? tv_model_open_daemon(c, spec, &o, &m, &err)
                : tv_model_open(where, spec, &o, &m, &err);
    if (rc) {
        fprintf(stderr, PROG ": open %s %s: %s: %s\n", where, spec, tv_err_name(rc), err.msg);
        tv_client_close(c);
        return 1;
    }
    int bad = !strcmp(mode, "headers") ? dump_headers(m, outdir) : dump_tensors(m, mode, outdir);
    tv_model_close(m);
    tv_client_close(c);
    return bad;
}
