/* Test tool: reads every tensor of a model through tensorvaultd's fast path
 * (the C client, tensorvault/client.h) with one of its read calls and writes
 * each to OUTDIR/<index>.bin; prints one JSON line per tensor
 * {"name","dtype","shape","file"}. The differential tests compare the files
 * with the in-process reader and the official safetensors loader.
 *   fp_dump SOCKET SPEC OUTDIR MODE
 *   MODE: host (tv_client_read_into) | batch (tv_client_read_batch, every
 *   tensor at once) | rows (rows [0, r/2) then [r/2, r), concatenated; a
 *   scalar or a sub-byte dtype as a whole read) | f32 (tv_client_read_f32;
 *   tensors without a float32 conversion are skipped: no file) | get
 *   (tv_client_get_tensor) | headers (tv_client_read_shard_header: every
 *   shard's first 8 + header_len bytes to OUTDIR/<shard>.bin, one JSON line
 *   per shard {"shard","name","file_len","header_len","file"}; protocol
 *   version 2)
 * Guard bytes: every destination sits at an odd offset between 64 bytes of
 * 0xA5 on each side; a changed guard byte fails the tool (exit 1) naming
 * the tensor. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "dump_common.h"
#include "tensorvault/client.h"

#define GUARD 64

/* Every shard's header through the daemon, each into a guarded buffer. */
static int dump_headers(tv_client_model *m, const char *outdir)
{
    for (size_t i = 0; i < tv_client_n_shards(m); i++) {
        tv_shard_desc sd;
        tv_error err = {0};
        if (tv_client_shard(m, i, &sd)) {
            fprintf(stderr, "fp_dump: shard %zu: no descriptor\n", i);
            return 1;
        }
        size_t len = (size_t)(8 + sd.header_len);
        uint8_t *buf = dump_guarded_alloc(len, GUARD);
        if (!buf) {
            fprintf(stderr, "fp_dump: out of memory\n");
            return 1;
        }
        uint8_t *dst = dump_dest(buf, GUARD);
        int rc = tv_client_read_shard_header(m, i, dst, len, &err);
        char path[4096], what[64];
        snprintf(what, sizeof(what), "shard %zu header", i);
        int bad = 0;
        if (rc) {
            fprintf(stderr, "fp_dump: headers: %s: %s: %s\n", what, tv_err_name(rc), err.msg);
            bad = 1;
        }
        if (!bad)
            bad = dump_check_guards("fp_dump", buf, len, GUARD, what);
        if (!bad)
            bad = dump_write("fp_dump", outdir, i, dst, len, path, sizeof(path));
        if (!bad) {
            json_t *o = json_pack("{s:I,s:s%,s:I,s:I,s:s}", "shard", (json_int_t)i, "name", sd.name,
                                  sd.name_len, "file_len", (json_int_t)sd.file_len, "header_len",
                                  (json_int_t)sd.header_len, "file", path);
            char *line = json_dumps(o, JSON_COMPACT);
            printf("%s\n", line);
            free(line);
            json_decref(o);
        }
        free(buf);
        if (bad)
            return 1;
    }
    return 0;
}

/* Rows [0, h) and [h, r) of tensor d read separately into dst. */
static int read_rows(tv_client_model *m, const tv_tensor_desc *d, uint8_t *dst, size_t len,
                     tv_error *err)
{
    uint64_t r = d->rank ? d->shape[0] : 0, h = r / 2, l0 = 0, l1 = 0;
    if (d->rank == 0 || tv_dtype_bits(d->dtype) % 8)
        return tv_client_read_into(m, d->name, dst, len, err);
    int rc = tv_client_rows_len(m, d->name, 0, h, &l0, err);
    if (!rc)
        rc = tv_client_rows_len(m, d->name, h, r, &l1, err);
    if (!rc && l0 + l1 != len) {
        snprintf(err->msg, sizeof(err->msg), "rows give %" PRIu64 " + %" PRIu64 " bytes, not %zu",
                 l0, l1, len);
        rc = TV_E_INTERNAL;
    }
    if (!rc)
        rc = tv_client_read_rows(m, d->name, 0, h, dst, (size_t)l0, err);
    if (!rc)
        rc = tv_client_read_rows(m, d->name, h, r, dst + l0, (size_t)l1, err);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: fp_dump SOCKET SPEC OUTDIR host|batch|rows|f32|get|headers\n");
        return 2;
    }
    const char *sock = argv[1], *spec = argv[2], *outdir = argv[3], *mode = argv[4];
    bool f32 = !strcmp(mode, "f32");
    if (strcmp(mode, "host") && strcmp(mode, "batch") && strcmp(mode, "rows") && !f32 &&
        strcmp(mode, "get") && strcmp(mode, "headers")) {
        fprintf(stderr, "fp_dump: unknown mode '%s'\n", mode);
        return 2;
    }
    tv_client *c = NULL;
    tv_client_model *m = NULL;
    tv_error err = {0};
    int rc = tv_client_connect(sock, NULL, &c, &err);
    if (!rc)
        rc = tv_client_open(c, spec, &m, &err);
    if (rc) {
        fprintf(stderr, "fp_dump: %s %s: %s: %s\n", sock, spec, tv_err_name(rc), err.msg);
        tv_client_close(c);
        return 1;
    }
    if (!strcmp(mode, "headers")) {
        int bad = dump_headers(m, outdir);
        tv_client_model_close(m);
        tv_client_close(c);
        return bad;
    }
    size_t n = tv_client_n_tensors(m);
    uint8_t **bufs = calloc(n ? n : 1, sizeof(*bufs));
    size_t *lens = calloc(n ? n : 1, sizeof(*lens));
    tv_read_req *reqs = calloc(n ? n : 1, sizeof(*reqs));
    int bad = !bufs || !lens || !reqs;
    for (size_t i = 0; i < n && !bad; i++) {
        tv_tensor_desc d;
        tv_client_tensor(m, i, &d);
        lens[i] = (size_t)(f32 ? d.n_elements * 4 : d.nbytes);
        bufs[i] = dump_guarded_alloc(lens[i], GUARD);
        bad = !bufs[i];
        reqs[i].index = i;
        reqs[i].dest = bad ? NULL : dump_dest(bufs[i], GUARD);
        reqs[i].dest_len = lens[i];
    }
    if (!bad && !strcmp(mode, "batch") && (rc = tv_client_read_batch(m, reqs, n, &err))) {
        fprintf(stderr, "fp_dump: batch: %s: %s\n", tv_err_name(rc), err.msg);
        bad = 1;
    }
    for (size_t i = 0; i < n && !bad; i++) {
        tv_tensor_desc d;
        tv_client_tensor(m, i, &d);
        uint8_t *dst = dump_dest(bufs[i], GUARD);
        bool skip = false;
        if (!strcmp(mode, "host")) {
            rc = tv_client_read_into(m, d.name, dst, lens[i], &err);
        } else if (!strcmp(mode, "rows")) {
            rc = read_rows(m, &d, dst, lens[i], &err);
        } else if (f32) {
            rc = tv_client_read_f32(m, d.name, dst, lens[i], &err);
            skip = rc == TV_E_NOT_SUPPORTED;
            rc = skip ? 0 : rc;
        } else if (!strcmp(mode, "get")) {
            tv_tensor *t = NULL;
            rc = tv_client_get_tensor(m, d.name, &t, &err);
            rc = dump_take_tensor(rc, t, &d, dst, lens[i]); /* frees t */
        } else {
            rc = reqs[i].result;
        }
        if ((bad = dump_failed("fp_dump", mode, &d, rc, &err, bufs[i], lens[i], GUARD)))
            break;
        if (skip)
            continue;
        char path[4096];
        if ((bad = dump_write("fp_dump", outdir, i, dst, lens[i], path, sizeof(path))))
            break;
        json_t *o = json_pack("{s:s%,s:s,s:o,s:s}", "name", d.name, d.name_len, "dtype",
                              tv_dtype_name(d.dtype), "shape", dump_shape_json(&d), "file", path);
        char *line = json_dumps(o, JSON_COMPACT);
        printf("%s\n", line);
        free(line);
        json_decref(o);
    }
    for (size_t i = 0; bufs && i < n; i++)
        free(bufs[i]);
    free(bufs);
    free(lens);
    free(reqs);
    tv_client_model_close(m);
    tv_client_close(c);
    return bad;
}
