/* Test tool: reads every tensor of a stored generation through one of the
 * public read APIs and writes each to OUTDIR/<index>.bin, plus
 * OUTDIR/index.json (name, dtype, shape, file). The differential tests
 * compare these files with the official safetensors loader.
 *   tv_dump STORE NAME[@GEN] MODE OUTDIR [ENGINE]
 *   MODE: into | get | batch | f32 ; ENGINE: auto | uring | pread
 * Guard bytes: every destination is surrounded by 4 KiB of 0xA5 on each
 * side, placed at an odd offset; any change to them fails the tool. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "dump_common.h"
#include "tensorvault/tensorvault.h"

#define GUARD 4096

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: tv_dump STORE NAME[@GEN] into|get|batch|f32 OUTDIR [ENGINE]\n");
        return 2;
    }
    const char *mode = argv[3], *outdir = argv[4];
    tv_open_opts o = {0};
    if (argc > 5 && !strcmp(argv[5], "uring"))
        o.engine = TV_ENGINE_URING;
    else if (argc > 5 && !strcmp(argv[5], "pread"))
        o.engine = TV_ENGINE_PREAD;
    o.chunk_len = 256 << 10; /* small chunks: big tensors span several */
    tv_model *m;
    tv_error err = {0};
    int rc = tv_model_open(argv[1], argv[2], &o, &m, &err);
    if (rc) {
        fprintf(stderr, "tv_dump: open: %s: %s\n", tv_err_name(rc), err.msg);
        return 1;
    }
    size_t n = tv_model_n_tensors(m);
    json_t *idx = json_array();
    uint8_t **bufs = calloc(n ? n : 1, sizeof(*bufs));
    size_t *lens = calloc(n ? n : 1, sizeof(*lens));
    tv_read_req *reqs = calloc(n ? n : 1, sizeof(*reqs));
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        tv_tensor_desc d;
        tv_model_tensor(m, i, &d);
        lens[i] = (size_t)(strcmp(mode, "f32") ? d.nbytes : d.n_elements * 4);
        bufs[i] = dump_guarded_alloc(lens[i], GUARD);
        if (!bufs[i]) {
            fprintf(stderr, "tv_dump: out of memory\n");
            bad = 1;
            break;
        }
        reqs[i].name = d.name;
        reqs[i].dest = dump_dest(bufs[i], GUARD);
        reqs[i].dest_len = lens[i];
    }
    if (!bad && !strcmp(mode, "batch")) {
        rc = tv_read_batch(m, reqs, n, &err);
        if (rc) {
            fprintf(stderr, "tv_dump: batch: %s: %s\n", tv_err_name(rc), err.msg);
            bad = 1;
        }
    }
    for (size_t i = 0; i < n && !bad; i++) {
        tv_tensor_desc d;
        tv_model_tensor(m, i, &d);
        uint8_t *dst = dump_dest(bufs[i], GUARD);
        if (!strcmp(mode, "into")) {
            rc = tv_read_into(m, d.name, dst, lens[i], &err);
        } else if (!strcmp(mode, "f32")) {
            rc = tv_read_f32(m, d.name, dst, lens[i], &err);
            if (rc == TV_E_NOT_SUPPORTED)
                continue;
        } else if (!strcmp(mode, "get")) {
            tv_tensor *t = NULL;
            rc = tv_get_tensor(m, d.name, &t, &err);
            rc = dump_take_tensor(rc, t, &d, dst, lens[i]); /* frees t */
        } else {
            rc = reqs[i].result;
        }
        if ((bad = dump_failed("tv_dump", mode, &d, rc, &err, bufs[i], lens[i], GUARD)))
            break;
        char path[4096];
        if ((bad = dump_write("tv_dump", outdir, i, dst, lens[i], path, sizeof(path))))
            break;
        json_array_append_new(idx, json_pack("{s:s%,s:s,s:o,s:I}", "name", d.name, d.name_len,
                                             "dtype", tv_dtype_name(d.dtype), "shape",
                                             dump_shape_json(&d), "index", (json_int_t)i));
    }
    if (!bad) {
        char path[4096];
        snprintf(path, sizeof(path), "%s/index.json", outdir);
        json_dump_file(idx, path, JSON_INDENT(1));
    }
    json_decref(idx);
    for (size_t i = 0; i < n; i++)
        free(bufs[i]);
    free(bufs);
    free(lens);
    free(reqs);
    tv_model_close(m);
    return bad;
}
