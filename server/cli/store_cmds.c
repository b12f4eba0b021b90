/* The store subcommands of the tensorvault CLI that stay local: store init
 * and the direct importer (import --replicas/--chunk); and, until the
 * in-process api is on main (TEMPORARY), the local implementations of
 * models, generations, tensors, devices, activate, retire, gc, verify.
 * Every command takes --json.
 * Invariant: commands that change the store take the writer lock; readers
 * never do, so listing works while an import runs. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "cli/args.h"
#include "cli/cli.h"
#include "cli/client.h"
#include "import/alloc.h"
#include "import/import.h"
#include "store/snapbuild.h"
#include "store/store.h"
#include "util/sys.h"

static void emit_json(json_t *o)
{
    json_dumpf(o, stdout, JSON_INDENT(2) | JSON_ENSURE_ASCII);
    fputc('\n', stdout);
    json_decref(o);
}

/* Every command but store init. tv__store_open refuses a path that is not a
 * store (tv__store_check_dir) before the registry or the lock is touched. */
static int open_store(const char *dir, unsigned flags, tv__store **st, tv_error *err)
{
    return tv__store_open(dir, flags, st, err);
}

/* ---- store init ---------------------------------------------------------- */

const tv__cli_cmd tv__cli_cmd_store = {
    .name = "store init",
    .run = tv__cli_store,
    .positionals = "",
    .min_pos = 0,
    .max_pos = 0,
    .flags = TV__CLI_STORE,
    .opts = {{"--store", "DIR", NULL},
             {"--image", "FILE", "(--image FILE --size SIZE | --device PATH)"},
             {"--size", "SIZE", ""},
             {"--device", "PATH", ""},
             {"--region-offset", "SIZE", NULL},
             {"--region-size", "SIZE", NULL},
             {"--force", NULL, NULL},
             {"--json", NULL, NULL}},
};

int tv__cli_store(const tv__cli_ctx *c)
{
    const tv__cli_args *a = &c->a;
    const char *dir = c->store;
    tv__store_init_opts o = {0};
    o.image = tv__cli_get(a, "--image");
    o.device = tv__cli_get(a, "--device");
    o.force = tv__cli_flag(a, "--force");
    const char *size = tv__cli_get(a, "--size");
    if (!o.image == !o.device || (o.image && !size) || (o.device && size))
        return tv__cli_usage("store init", "need --image FILE --size SIZE, or --device PATH");
    /* Explicit zeros are refused: 0 is not "the default" here (the region
     * never starts at byte 0; a region of 0 bytes holds nothing). */
    int u;
    if ((u = tv__cli_opt_size("store init", a, "--size", 1, UINT64_MAX, &o.image_size_bytes)) ||
        (u = tv__cli_opt_size("store init", a, "--region-offset", 1, UINT64_MAX, &o.region_off)) ||
        (u = tv__cli_opt_size("store init", a, "--region-size", 1, UINT64_MAX, &o.region_len)))
        return u;
    tv_error err = {0};
    int64_t id;
    /* The summary comes from init itself: a store that was made is never
     * reported as a failure by a later read. */
    tv__reg_device row;
    o.row_out = &row;
    int rc = tv__store_init(dir, &o, &id, &err);
    if (rc)
        return tv__cli_failed(c, rc, &err);
    if (c->json)
        emit_json(json_pack("{s:s,s:I,s:s,s:s,s:s,s:I,s:I,s:I,s:I,s:I,s:I}", "store", dir,
                            "device_id", (json_int_t)id, "uuid", row.uuid, "path", row.path, "kind",
                            row.kind, "lba_size", (json_int_t)row.lba_size, "io_align",
                            (json_int_t)row.io_align, "object_align", (json_int_t)row.object_align,
                            "region_offset", (json_int_t)row.region_off, "region_size",
                            (json_int_t)row.region_len, "data_offset", (json_int_t)row.data_off));
    else
        printf("store %s: device %" PRId64 " %s (%s, lba %" PRIu64 ", io_align %" PRIu64
               ", region %" PRIu64 "+%" PRIu64 ") uuid %s\n",
               dir, id, row.path, row.kind, row.lba_size, row.io_align, row.region_off,
               row.region_len, row.uuid);
    return TV__EXIT_OK;
}

/* ---- import -------------------------------------------------------------- */

typedef struct progress {
    double t0, last;
    bool tty;
} progress;

static double mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void on_progress(void *ctx, uint64_t done, uint64_t total)
{
    progress *p = ctx;
    double t = mono();
    if (!p->tty || (t - p->last < 0.1 && done < total))
        return;
    p->last = t;
    double el = t - p->t0, rate = el > 0 ? (double)done / el : 0;
    double pct = total ? 100.0 * (double)done / (double)total : 100.0;
    int bar = (int)(pct / 100.0 * 30);
    char b[31];
    for (int i = 0; i < 30; i++)
        b[i] = i < bar ? '#' : '.';
    b[30] = '\0';
    double eta = rate > 0 ? (double)(total - done) / rate : 0;
    fprintf(stderr, "\r[%s] %5.1f%% %8.1f / %.1f MiB  %7.1f MB/s  ETA %4.0fs", b, pct,
            (double)done / 1048576.0, (double)total / 1048576.0, rate / 1e6, eta);
    if (done >= total)
        fputc('\n', stderr);
    fflush(stderr);
}

const tv__cli_cmd tv__cli_legacy_import = {
    .name = "import",
    .run = tv__cli_import_local,
    .positionals = "NAME SRC",
    .min_pos = 2,
    .max_pos = 2,
    .flags = TV__CLI_STORE,
    .opts = {{"--store", "DIR", NULL},
             {"--activate", NULL, NULL},
             {"--strict", NULL, NULL},
             {"--replicas", "DEV,...", NULL},
             {"--chunk", "SIZE", NULL},
             {"--json", NULL, NULL}},
};

int tv__cli_import_local(const tv__cli_ctx *c)
{
    const tv__cli_args *a = &c->a;
    bool json = c->json;
    tv_error err = {0};
    /* The name rule first: a bad name touches neither the store nor the
     * source. */
    int rc = tv__name_valid(a->pos[0], "model name", &err);
    if (rc)
        return tv__cli_failed(c, rc, &err);
    tv__import_opts o = {0};
    o.activate = tv__cli_flag(a, "--activate");
    o.strict = tv__cli_flag(a, "--strict");
    uint64_t chunk = 0;
    int u;
    /* The importer holds TV__CLI_IMPORT_BUFS chunks: the staging cap bounds them. */
    if ((u = tv__cli_opt_size("import", a, "--chunk", TV__CLI_MIN_CHUNK,
                              TV__CLI_MAX_STAGING / TV__CLI_IMPORT_BUFS, &chunk)))
        return u;
    o.chunk_len = (size_t)chunk;
    /* --replicas: distinct, non-empty names, checked before the store opens. */
    const char *rep = tv__cli_get(a, "--replicas"), *names[TV__IMPORT_MAX_DEVICES], *why;
    char rep_buf[4096];
    size_t n_names = 0;
    if (rep && tv__cli_parse_list(rep, rep_buf, sizeof(rep_buf), names, TV_ARRAY_LEN(names),
                                  &n_names, &why))
        return tv__cli_usage(
            "import",
            "bad --replicas '%s': %s (DEV,... names up to %d distinct devices by id, path or UUID)",
            rep, why, TV__IMPORT_MAX_DEVICES);
    tv__store *st;
    rc = open_store(c->store ? c->store : tv__cli_get(a, "--store"), TV__STORE_WRITE, &st, &err);
    if (rc)
        return tv__cli_failed(c, rc, &err);
    int64_t devs[TV__IMPORT_MAX_DEVICES];
    if (rep) {
        for (size_t i = 0; i < n_names && !rc; i++)
            rc = tv__store_find_device(st, names[i], &devs[o.n_devices++], &err);
        o.devices = devs;
        if (rc) {
            tv__store_close(st);
            return tv__cli_failed(c, rc, &err);
        }
    }
    progress pr = {mono(), 0, isatty(2) && !json};
    o.progress = on_progress;
    o.progress_ctx = &pr;
    tv__import_result r;
    rc = tv__import(st, a->pos[0], a->pos[1], &o, &r, &err);
    tv__store_close(st);
    if (rc)
        return tv__cli_failed(c, rc, &err);
    json_t *aliases = json_array();
    json_t *doc =
        json_pack("{s:s,s:I,s:b,s:o,s:I,s:I,s:I,s:I,s:I,s:f}", "model", a->pos[0], "generation",
                  (json_int_t)r.generation, "active", o.activate, "aliases", aliases, "n_shards",
                  (json_int_t)r.n_shards, "n_tensors", (json_int_t)r.n_tensors, "total_bytes",
                  (json_int_t)r.bytes_total, "written_bytes", (json_int_t)r.bytes_written,
                  "deduplicated_bytes", (json_int_t)r.bytes_deduped, "seconds", r.seconds);
    tv__cli_print(stdout, json, TV__DOC_IMPORT, doc);
    json_decref(doc);
    return TV__EXIT_OK;
}

/* ---- listings ------------------------------------------------------------ */

const tv__cli_cmd tv__cli_legacy_models = {
    .name = "models",
    .run = tv__cli_models_legacy,
    .positionals = "",
    .min_pos = 0,
    .max_pos = 0,
    .flags = TV__CLI_STORE,
    .opts = {{"--store", "DIR", NULL}, {"--json", NULL, NULL}},
};

int tv__cli_models_legacy(const tv__cli_ctx *c)
{
    bool json = c->json;
    tv_error err = {0};
    tv__store *st;
    tv__reg_model *m = NULL;
    size_t n = 0;
    int rc = open_store(c->store, 0, &st, &err);
    if (!rc)
        rc = tv__reg_models_list(st->reg, &m, &n, &err);
    for (size_t i = 0; !rc && i < n; i++)
        rc = tv__store_settled_active(st, m[i].name, &m[i].active_generation, &err);
    tv__store_close(st);
    if (rc)
        return tv__cli_failed(c, rc, &err);
    json_t *arr = json_array();
    if (!json)
        printf("%-40s %8s %12s\n", "MODEL", "ACTIVE", "GENERATIONS");
    for (size_t i = 0; i < n; i++) {
        if (json)
            json_array_append_new(arr, json_pack("{s:s,s:o,s:I}", "name", m[i].name, "active",
                                                 m[i].active_generation
                                                     ? json_integer(m[i].active_generation)
                                                     : json_null(),
                                                 "generations", (json_int_t)m[i].n_generations));
        else {
            char act[24] = "-";
            if (m[i].active_generation)
                snprintf(act, sizeof(act), "%" PRId64, m[i].active_generation);
            printf("%-40s %8s %12" PRId64 "\n", m[i].name, act, m[i].n_generations);
        }
    }
    free(m);
    if (json)
        emit_json(json_pack("{s:o}", "models", arr));
    else
        json_decref(arr);
    return TV__EXIT_OK;
}

const tv__cli_cmd tv__cli_legacy_generations = {
    .name = "generations",
    .run = tv__cli_generations_legacy,
    .positionals = "NAME",
    .min_pos = 1,
    .max_pos = 1,
    .flags = TV__CLI_STORE,
    .opts = {{"--store", "DIR", NULL}, {"--json", NULL, NULL}},
};

int tv__cli_generations_legacy(const tv__cli_ctx *c)
{
    bool json = c->json;
    const char *model = c->a.pos[0];
    tv_error err = {0};
    tv__store *st;
    tv__reg_generation *g = NULL;
    size_t n = 0;
    int64_t active = 0;
    int rc = open_store(c->store, 0, &st, &err);
    if (!rc)
        rc = tv__reg_generations_list(st->reg, model, &g, &n, &err);
    if (!rc)
        rc = tv__store_settled_active(st, model, &active, &err);
    for (size_t i = 0; !rc && i < n; i++)
        g[i].active = g[i].number == active;
    tv__store_close(st);
    if (rc)
        return tv__cli_failed(c, rc, &err);
    json_t *arr = json_array();
    if (!json)
        printf("%4s %-9s %6s %7s %9s %14s  %s\n", "GEN", "STATE", "ACTIVE", "SHARDS", "TENSORS",
               "BYTES", "SOURCE");
    for (size_t i = 0; i < n; i++) {
        if (json)
            json_array_append_new(
                arr,
                json_pack("{s:I,s:s,s:b,s:I,s:I,s:I,s:s,s:I}", "generation",
                          (json_int_t)g[i].number, "state", tv__gen_state_name(g[i].state),
                          "active", g[i].active, "shards", (json_int_t)g[i].n_shards, "tensors",
                          (json_int_t)g[i].n_tensors, "bytes", (json_int_t)g[i].total_bytes,
                          "source", g[i].source, "created_at", (json_int_t)g[i].created_at));
        else
            printf("%4" PRId64 " %-9s %6s %7" PRId64 " %9" PRId64 " %14" PRIu64 "  %s\n",
                   g[i].number, tv__gen_state_name(g[i].state), g[i].active ? "*" : "",
                   g[i].n_shards, g[i].n_tensors, g[i].total_bytes, g[i].source);
    }
    free(g);
    if (json)
        emit_json(json_pack("{s:s,s:o}", "model", model, "generations", arr));
    else
        json_decref(arr);
    return TV__EXIT_OK;
}

const tv__cli_cmd tv__cli_legacy_tensors = {
    .name = "tensors",
    .run = tv__cli_tensors_legacy,
    .positionals = "NAME[@GEN]",
    .min_pos = 1,
    .max_pos = 1,
    .flags = TV__CLI_STORE | TV__CLI_SPEC,
    .spec_len = TV__REG_NAME_MAX + 1, /* a longer NAME is a usage error here */
    .opts = {{"--store", "DIR", NULL}, {"--json", NULL, NULL}},
};

int tv__cli_tensors_legacy(const tv__cli_ctx *c)
{
    bool json = c->json;
    const char *name = c->model;
    int64_t gen = c->gen;
    tv_error err = {0};
    tv__store *st;
    tv__reg_generation g;
    tv__reg_manifest *m = NULL;
    tv__reg_device *devs = NULL;
    size_t n_devs = 0;
    int rc = open_store(c->store, 0, &st, &err);
    if (!rc && gen == 0) /* the active generation, as readers open it */
        rc = tv__store_settled_active(st, name, &gen, &err);
    if (!rc)
        rc = tv__reg_generation_get(st->reg, name, gen, &g, &err);
    if (!rc)
        rc = tv__reg_tensors_list(st->reg, g.id, &m, &err);
    if (!rc)
        rc = tv__reg_device_list(st->reg, &devs, &n_devs, &err);
    tv__store_close(st);
    if (rc) {
        free(devs);
        tv__reg_manifest_free(m);
        return tv__cli_failed(c, rc, &err);
    }
    json_t *arr = json_array();
    if (!json)
        printf("%-48s %-11s %-18s %5s %14s %12s %16s\n", "TENSOR", "DTYPE", "SHAPE", "SHARD",
               "FILE_OFFSET", "LENGTH", "DEVICE_OFFSET");
    for (size_t i = 0; i < m->n_tensors; i++) {
        const tv__reg_tensor *t = &m->tensors[i];
        const tv__reg_shard *sh = &m->shards[t->shard_idx];
        json_t *shape = json_array();
        char shp[128];
        size_t o = (size_t)snprintf(shp, sizeof(shp), "[");
        for (uint32_t d = 0; d < t->rank; d++) {
            json_array_append_new(shape, json_integer((json_int_t)t->shape[d]));
            if (o < sizeof(shp))
                o += (size_t)snprintf(shp + o, sizeof(shp) - o, "%s%" PRIu64, d ? "," : "",
                                      t->shape[d]);
        }
        if (o < sizeof(shp))
            snprintf(shp + o, sizeof(shp) - o, "]");
        uint64_t file_off = sh->data_off + t->begin_off;
        json_t *reps = json_array();
        for (size_t r = 0; r < sh->n_replicas; r++) {
            const tv__reg_replica *rp = &sh->replicas[r];
            const char *path = "";
            for (size_t k = 0; k < n_devs; k++)
                if (devs[k].id == rp->device_id)
                    path = devs[k].path;
            json_array_append_new(
                reps, json_pack("{s:I,s:s,s:I,s:I}", "device_id", (json_int_t)rp->device_id,
                                "device", path, "object_offset", (json_int_t)rp->base_off,
                                "device_offset", (json_int_t)(rp->base_off + file_off)));
        }
        if (json) {
            json_array_append_new(
                arr,
                json_pack("{s:s%,s:s,s:o,s:s,s:I,s:I,s:I,s:I,s:o}", "name", t->name, t->name_len,
                          "dtype", tv_dtype_name(t->dtype), "shape", shape, "shard", sh->name,
                          "shard_index", (json_int_t)t->shard_idx, "file_offset",
                          (json_int_t)file_off, "begin", (json_int_t)t->begin_off, "length",
                          (json_int_t)(t->end_off - t->begin_off), "replicas", reps));
        } else {
            printf("%-48s %-11s %-18s %5u %14" PRIu64 " %12" PRIu64 " %16" PRIu64 "\n", t->name,
                   tv_dtype_name(t->dtype), shp, t->shard_idx, file_off, t->end_off - t->begin_off,
                   sh->n_replicas ? sh->replicas[0].base_off + file_off : 0);
            json_decref(shape);
            json_decref(reps);
        }
    }
    if (json)
        emit_json(json_pack("{s:s,s:I,s:s,s:o}", "model", name, "generation",
                            (json_int_t)m->generation.number, "state",
                            tv__gen_state_name(m->generation.state), "tensors", arr));
    else
        json_decref(arr);
    free(devs);
    tv__reg_manifest_free(m);
    return TV__EXIT_OK;
}

const tv__cli_cmd tv__cli_legacy_devices = {
    .name = "devices",
    .run = tv__cli_devices_legacy,
    .positionals = "",
    .min_pos = 0,
    .max_pos = 0,
    .flags = TV__CLI_STORE,
    .opts = {{"--store", "DIR", NULL}, {"--json", NULL, NULL}},
};

int tv__cli_devices_legacy(const tv__cli_ctx *c)
{
    bool json = c->json;
    tv_error err = {0};
    tv__store *st;
    tv__reg_device *d = NULL;
    size_t n = 0;
    int rc = open_store(c->store, 0, &st, &err);
    if (!rc)
        rc = tv__reg_device_list(st->reg, &d, &n, &err);
    if (rc) {
        tv__store_close(st);
        return tv__cli_failed(c, rc, &err);
    }
    json_t *arr = json_array();
    if (!json)
        printf("%3s %-6s %-36s %6s %14s %14s %14s  %s\n", "ID", "KIND", "PATH", "LBA", "REGION",
               "USED", "FREE", "STATUS");
    int worst = TV__EXIT_OK;
    for (size_t i = 0; i < n; i++) {
        tv__alloc_space sp;
        if ((rc = tv__alloc_device_space(st->reg, d[i].id, &sp, &err))) {
            json_decref(arr);
            free(d);
            tv__store_close(st);
            return tv__cli_failed(c, rc, &err);
        }
        tv__dev *dev;
        tv_error de = {0};
        int drc = tv__store_device(st, d[i].id, false, &dev, &de);
        const char *status = drc ? tv_err_name(drc) : "ok";
        if (drc)
            worst = TV__EXIT_FAIL;
        if (json) {
            json_error_t je;
            json_t *ident = json_loads(d[i].identity, 0, &je);
            json_array_append_new(
                arr,
                json_pack("{s:I,s:s,s:s,s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,"
                          "s:o,s:s,s:s}",
                          "id", (json_int_t)d[i].id, "uuid", d[i].uuid, "kind", d[i].kind, "path",
                          d[i].path, "lba_size", (json_int_t)d[i].lba_size, "io_align",
                          (json_int_t)d[i].io_align, "object_align", (json_int_t)d[i].object_align,
                          "size", (json_int_t)d[i].size_bytes, "region_offset",
                          (json_int_t)d[i].region_off, "region_size", (json_int_t)d[i].region_len,
                          "data_offset", (json_int_t)d[i].data_off, "used", (json_int_t)sp.used_len,
                          "free", (json_int_t)sp.free_len, "largest_free",
                          (json_int_t)sp.largest_free_len, "objects", (json_int_t)sp.n_used,
                          "identity", ident ? ident : json_object(), "status", status, "message",
                          drc ? de.msg : ""));
        } else {
            printf("%3" PRId64 " %-6s %-36s %6" PRIu64 " %14" PRIu64 " %14" PRIu64 " %14" PRIu64
                   "  %s%s%s\n",
                   d[i].id, d[i].kind, d[i].path, d[i].lba_size, d[i].region_len, sp.used_len,
                   sp.free_len, status, drc ? ": " : "", drc ? de.msg : "");
        }
    }
    tv__store_close(st);
    free(d);
    if (json)
        emit_json(json_pack("{s:o}", "devices", arr));
    else
        json_decref(arr);
    return worst;
}

const tv__cli_cmd tv__cli_legacy_activate = {
    .name = "activate",
    .run = tv__cli_activate_legacy,
    .positionals = "NAME GEN",
    .min_pos = 2,
    .max_pos = 2,
    .flags = TV__CLI_STORE | TV__CLI_GEN,
    .opts = {{"--store", "DIR", NULL}, {"--json", NULL, NULL}},
};

const tv__cli_cmd tv__cli_legacy_retire = {
    .name = "retire",
    .run = tv__cli_retire_legacy,
    .positionals = "NAME GEN",
    .min_pos = 2,
    .max_pos = 2,
    .flags = TV__CLI_STORE | TV__CLI_GEN,
    .opts = {{"--store", "DIR", NULL}, {"--json", NULL, NULL}},
};

static int gen_change(const tv__cli_ctx *c, bool activate)
{
    const char *model = c->a.pos[0];
    int64_t gen = c->gen;
    tv_error err = {0};
    tv__store *st;
    int rc = open_store(c->store, TV__STORE_WRITE, &st, &err);
    /* Activation changes registry and pointer together (an error changes
     * neither); retiring never touches the pointer (the active generation
     * cannot be retired). */
    if (!rc)
        rc = activate ? tv__store_activate(st, model, gen, &err)
                      : tv__reg_generation_retire(st->reg, model, gen, &err);
    tv__store_close(st);
    if (rc)
        return tv__cli_failed(c, rc, &err);
    if (c->json)
        emit_json(json_pack("{s:s,s:I,s:s}", "model", model, "generation", (json_int_t)gen, "state",
                            activate ? "active" : "retired"));
    else
        printf("%s generation %" PRId64 " of %s\n", activate ? "activated" : "retired", gen, model);
    return TV__EXIT_OK;
}

int tv__cli_activate_legacy(const tv__cli_ctx *c)
{
    return gen_change(c, true);
}

int tv__cli_retire_legacy(const tv__cli_ctx *c)
{
    return gen_change(c, false);
}

const tv__cli_cmd tv__cli_legacy_gc = {
    .name = "gc",
    .run = tv__cli_gc_legacy,
    .positionals = "",
    .min_pos = 0,
    .max_pos = 0,
    .flags = TV__CLI_STORE,
    .opts = {{"--store", "DIR", NULL}, {"--json", NULL, NULL}},
};

int tv__cli_gc_legacy(const tv__cli_ctx *c)
{
    tv_error err = {0};
    tv__store *st;
    tv__reg_object *o = NULL;
    size_t n = 0, freed = 0;
    uint64_t bytes = 0;
    bool *keep = NULL;
    int rc = open_store(c->store, TV__STORE_WRITE, &st, &err);
    if (!rc)
        rc = tv__reg_objects_unreferenced(st->reg, &o, &n, &err);
    if (!rc && !(keep = calloc(n ? n : 1, sizeof(*keep))))
        rc = tv__seterr(&err, -ENOMEM, "out of memory");
    /* Snapshots go first, under their lock: a generation a reader holds
     * keeps its objects (keep[i]); the others can no longer be opened. */
    if (!rc)
        rc = tv__store_gc_snapshots(st, o, n, keep, &err);
    for (size_t i = 0; !rc && i < n; i++) {
        if (keep[i])
            continue;
        tv_error e2;
        int drc = tv__reg_object_delete(st->reg, o[i].id, &e2);
        if (drc == 0) {
            tv__crash_point("gc.commit");
            freed++;
            bytes += o[i].alloc_len;
        } else if (drc != TV_E_LEASED && drc != TV_E_STATE) {
            rc = drc;
            err = e2;
        }
    }
    free(o);
    free(keep);
    tv__store_close(st);
    if (rc)
        return tv__cli_failed(c, rc, &err);
    json_t *doc = json_pack("{s:I,s:I}", "n_objects_freed", (json_int_t)freed, "freed_bytes",
                            (json_int_t)bytes);
    tv__cli_print(stdout, c->json, TV__DOC_GC, doc);
    json_decref(doc);
    return TV__EXIT_OK;
}

/* "model 'm' generation 1 (active) shard 'x.safetensors'; ..." for every
 * user of an object, into buf ("no generation" when nothing binds it). */
static void describe_users(const tv__reg_object_user *u, size_t n, char *buf, size_t len)
{
    size_t off = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < n && off < len; i++) {
        int w = snprintf(buf + off, len - off, "%smodel '%s' generation %lld%s shard '%s'",
                         i ? "; " : "", u[i].model, (long long)u[i].generation,
                         u[i].active ? " (active)" : "", u[i].shard);
        off = w < 0 ? len : off + (size_t)w;
    }
    if (n == 0)
        snprintf(buf, len, "no generation");
    if (off >= len && len > 4)
        memcpy(buf + len - 4, "...", 4);
}

const tv__cli_cmd tv__cli_legacy_verify = {
    .name = "verify",
    .run = tv__cli_verify_legacy,
    .positionals = "",
    .min_pos = 0,
    .max_pos = 0,
    .flags = TV__CLI_STORE,
    .opts = {{"--store", "DIR", NULL}, {"--json", NULL, NULL}},
};

int tv__cli_verify_legacy(const tv__cli_ctx *c)
{
    bool json = c->json;
    tv_error err = {0};
    tv__store *st;
    tv__reg_object *o = NULL;
    size_t n = 0, bad = 0;
    uint64_t bytes = 0;
    int rc = open_store(c->store, 0, &st, &err);
    if (!rc)
        rc = tv__reg_objects_list_committed(st->reg, 0, &o, &n, &err);
    if (rc) {
        tv__store_close(st);
        return tv__cli_failed(c, rc, &err);
    }
    json_t *arr = json_array();
    for (size_t i = 0; i < n; i++) {
        tv_error e2 = {0};
        int vrc = tv__verify_object(st, &o[i], &e2);
        bytes += o[i].canonical_len;
        /* Who uses the object: a failure names models, generations and
         * shards, not only ids. A failed lookup is reported, never fatal. */
        tv__reg_object_user *users = NULL;
        size_t n_users = 0;
        tv_error ue = {0};
        int urc = tv__reg_object_users(st->reg, o[i].id, &users, &n_users, &ue);
        json_t *used_by = json_array();
        for (size_t k = 0; k < n_users; k++)
            json_array_append_new(used_by,
                                  json_pack("{s:s,s:I,s:s,s:b,s:s,s:I}", "model", users[k].model,
                                            "generation", (json_int_t)users[k].generation, "state",
                                            tv__gen_state_name(users[k].state), "active",
                                            users[k].active, "shard", users[k].shard, "shard_index",
                                            (json_int_t)users[k].shard_idx));
        if (vrc) {
            bad++;
            char who[1024];
            if (urc)
                snprintf(who, sizeof who, "users unknown: %s", ue.msg);
            else
                describe_users(users, n_users, who, sizeof who);
            /* stderr in both modes: --json adds used_by to the result. */
            fprintf(stderr, "tensorvault: verify: %s (object %lld on device %lld): %s: %s\n", who,
                    (long long)o[i].id, (long long)o[i].device_id, tv_err_name(vrc), e2.msg);
        }
        free(users);
        json_array_append_new(
            arr, json_pack("{s:I,s:I,s:I,s:I,s:s,s:s,s:s,s:o}", "object_id", (json_int_t)o[i].id,
                           "device_id", (json_int_t)o[i].device_id, "device_offset",
                           (json_int_t)o[i].base_off, "canonical_bytes",
                           (json_int_t)o[i].canonical_len, "sha256", o[i].sha256, "status",
                           !vrc                        ? "ok"
                           : vrc == TV_E_HASH_MISMATCH ? "mismatch"
                                                       : "error",
                           "message", vrc ? e2.msg : "", "used_by", used_by));
    }
    tv__store_close(st);
    free(o);
    json_t *doc = json_pack("{s:I,s:I,s:I,s:o}", "n_objects", (json_int_t)n, "n_failed",
                            (json_int_t)bad, "verified_bytes", (json_int_t)bytes, "objects", arr);
    tv__cli_print(stdout, json, TV__DOC_VERIFY, doc);
    json_decref(doc);
    return bad ? TV__EXIT_FAIL : TV__EXIT_OK;
}
