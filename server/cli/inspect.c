/* `tensorvault inspect PATH [--json]`: every tensor of a checkpoint with
 * name, dtype, shape, shard, absolute file offset and byte length, plus a
 * shard summary. Invariant: an invalid checkpoint prints one line naming the
 * error and exits 1; nothing is printed to stdout in text mode then. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli/args.h"
#include "cli/cli.h"
#include "tensorvault/checkpoint.h"
#include "util/internal.h"

static json_t *shape_json(const tv_tensor_info *t)
{
    json_t *a = json_array();
    for (uint32_t d = 0; d < t->rank; d++)
        json_array_append_new(a, json_integer((json_int_t)t->shape[d]));
    return a;
}

static int print_json(const tv_checkpoint *ck)
{
    json_t *root = json_object();
    json_t *shards = json_array();
    json_t *tensors = json_array();
    const char *ip = tv_checkpoint_index_path(ck);
    uint64_t ts;
    json_object_set_new(root, "format", json_string("safetensors"));
    json_object_set_new(root, "index", ip ? json_string(ip) : json_null());
    json_object_set_new(root, "total_size",
                        tv_checkpoint_index_total_size(ck, &ts) ? json_integer((json_int_t)ts)
                                                                : json_null());
    json_object_set_new(root, "total_bytes",
                        json_integer((json_int_t)tv_checkpoint_total_bytes(ck)));
    json_object_set_new(root, "n_tensors", json_integer((json_int_t)tv_checkpoint_n_tensors(ck)));
    for (size_t i = 0; i < tv_checkpoint_n_shards(ck); i++) {
        tv_shard_info s;
        tv_checkpoint_shard(ck, i, &s);
        json_t *meta = json_null();
        if (s.has_metadata) {
            meta = json_object();
            for (size_t j = 0; j < s.n_metadata; j++) {
                const char *k, *v;
                tv_checkpoint_shard_metadata(ck, i, j, &k, &v);
                json_object_set_new(meta, k, json_string(v));
            }
        }
        json_array_append_new(shards,
                              json_pack("{s:s,s:s,s:I,s:I,s:I,s:I,s:I,s:o}", "name", s.name, "path",
                                        s.path, "file_size", (json_int_t)s.file_len, "header_len",
                                        (json_int_t)s.header_len, "data_offset",
                                        (json_int_t)s.data_off, "data_len", (json_int_t)s.data_len,
                                        "n_tensors", (json_int_t)s.n_tensors, "metadata", meta));
    }
    for (size_t i = 0; i < tv_checkpoint_n_tensors(ck); i++) {
        tv_tensor_info t;
        tv_shard_info s;
        tv_checkpoint_tensor(ck, i, &t);
        tv_checkpoint_shard(ck, t.shard, &s);
        json_array_append_new(
            tensors, json_pack("{s:s%,s:s,s:o,s:s,s:I,s:I,s:I,s:b}", "name", t.name, t.name_len,
                               "dtype", tv_dtype_name(t.dtype), "shape", shape_json(&t), "shard",
                               s.name, "shard_index", (json_int_t)t.shard, "offset",
                               (json_int_t)t.file_off, "length", (json_int_t)t.nbytes,
                               "byte_addressable", tv_dtype_byte_addressable(t.dtype)));
    }
    json_object_set_new(root, "shards", shards);
    json_object_set_new(root, "tensors", tensors);
    int rc = json_dumpf(root, stdout, JSON_INDENT(1) | JSON_ENSURE_ASCII);
    fputc('\n', stdout);
    json_decref(root);
    return rc == 0 ? TV__EXIT_OK : TV__EXIT_FAIL;
}

static void print_shape(const tv_tensor_info *t, char *buf, size_t len)
{
    size_t o = (size_t)snprintf(buf, len, "[");
    for (uint32_t d = 0; d < t->rank && o < len; d++)
        o += (size_t)snprintf(buf + o, len - o, "%s%" PRIu64, d ? ", " : "", t->shape[d]);
    if (o < len)
        snprintf(buf + o, len - o, "]");
}

static void print_text(const tv_checkpoint *ck)
{
    size_t n = tv_checkpoint_n_tensors(ck);
    size_t w = 4;
    for (size_t i = 0; i < n; i++) {
        tv_tensor_info t;
        tv_checkpoint_tensor(ck, i, &t);
        if (t.name_len > w)
            w = t.name_len;
    }
    if (w > 60)
        w = 60;
    printf("%-*s  %-11s  %-20s  %5s  %14s  %14s\n", (int)w, "NAME", "DTYPE", "SHAPE", "SHARD",
           "OFFSET", "LENGTH");
    for (size_t i = 0; i < n; i++) {
        tv_tensor_info t;
        char shape[256];
        tv_checkpoint_tensor(ck, i, &t);
        print_shape(&t, shape, sizeof(shape));
        printf("%-*s  %-11s  %-20s  %5u  %14" PRIu64 "  %14" PRIu64 "\n", (int)w, t.name,
               tv_dtype_name(t.dtype), shape, t.shard, t.file_off, t.nbytes);
    }
    printf("\n%-5s  %-40s  %8s  %12s  %16s\n", "SHARD", "FILE", "TENSORS", "HEADER", "DATA BYTES");
    for (size_t i = 0; i < tv_checkpoint_n_shards(ck); i++) {
        tv_shard_info s;
        tv_checkpoint_shard(ck, i, &s);
        printf("%5zu  %-40s  %8zu  %12" PRIu64 "  %16" PRIu64 "\n", i, s.name, s.n_tensors,
               s.header_len, s.data_len);
    }
    uint64_t ts;
    printf("\n%zu tensors, %zu shards, %" PRIu64 " data bytes", n, tv_checkpoint_n_shards(ck),
           tv_checkpoint_total_bytes(ck));
    if (tv_checkpoint_index_total_size(ck, &ts))
        printf(" (index total_size %" PRIu64 "%s)", ts,
               ts == tv_checkpoint_total_bytes(ck) ? "" : ", differs");
    printf("\n");
}

const tv__cli_cmd tv__cli_cmd_inspect = {
    .name = "inspect",
    .run = tv__cli_inspect,
    .positionals = "PATH",
    .min_pos = 1,
    .max_pos = 1,
    .flags = 0,
    .opts = {{"--json", NULL, NULL,
              "one document: tensors[], shards[] with __metadata__, total_size"}},
    .about = "Validate a safetensors checkpoint and list every tensor (name, dtype, shape,\n"
             "shard, absolute file offset, length) in file order, then the shards. PATH is a\n"
             ".safetensors file, an index file, or a directory holding one (a Hugging Face\n"
             "cache snapshot works as it is). No store or daemon is needed; an invalid\n"
             "checkpoint exits 1 naming the rule it breaks.",
    .example = "tensorvault inspect ~/.cache/huggingface/hub/models--gpt2/snapshots/*/",
};

int tv__cli_inspect(const tv__cli_ctx *c)
{
    const char *path = c->a.pos[0];
    tv_checkpoint *ck = NULL;
    tv_error err = {0};
    int rc = tv_checkpoint_open(path, NULL, &ck, &err);
    if (rc) {
        tv__cli_fail("inspect", c->json, rc, err.msg);
        return TV__EXIT_FAIL;
    }
    int ret = TV__EXIT_OK;
    if (c->json)
        ret = print_json(ck);
    else
        print_text(ck);
    tv_checkpoint_close(ck);
    return ret;
}
