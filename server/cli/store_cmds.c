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
    .opts = {{"--store", "DIR", NULL, "the store directory (created 0700), or $TENSORVAULT_STORE"},
             {"--image", "FILE", "(--image FILE --size SIZE | --device PATH)",
              "a sparse file image as the device"},
             {"--size", "SIZE", "", "the image's size"},
             {"--device", "PATH", "",
              "a block device or NVMe namespace (its data is refused unless --force)"},
             {"--region-offset", "SIZE", NULL,
              "where the store's region starts (default 1M; never at 0)"},
             {"--region-size", "SIZE", NULL,
              "the region's length (default: to the end of the device)"},
             {"--force", NULL, NULL, "claim a device that holds data or another store's label"},
             {"--json", NULL, NULL, "print the new device's row as JSON"}},
    .about = "Create a store in DIR on a file image or a block device, or add a device to an\n"
             "existing store: a label, a reserved region, and the registry (SQLite).",
    .example = "tensorvault store init --store /srv/tv --image /srv/tv.img --size 64G\n"
               "tensorvault store init --store /srv/tv --device /dev/nvme1n1",
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
        emit_json(json_pack("{s:s,s:I,s:s,s:s,s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:I}", "store", dir, "id",
                            (json_int_t)id, "uuid", row.uuid, "path", row.path, "kind", row.kind,
                            "lba_size", (json_int_t)row.lba_size, "io_align",
                            (json_int_t)row.io_align, "object_align", (json_int_t)row.object_align,
                            "size_bytes", (json_int_t)row.size_bytes, "region_offset",
                            (json_int_t)row.region_off, "region_bytes", (json_int_t)row.region_len,
                            "data_offset", (json_int_t)row.data_off));
    else
        printf("store %s: device %" PRId64 " %s (%s, lba %" PRIu64 ", io_align %" PRIu64
               ", region %" PRIu64 "+%" PRIu64 ") uuid %s\n",
               dir, id, row.path, row.kind, row.lba_size, row.io_align, row.region_off,
               row.region_len, row.uuid);
    return TV__EXIT_OK;
}

/* ---- import -------------------------------------------------------------- */

/* A sidecar file the import did not store, into the result. */
static void on_skipped(void *ctx, const char *line)
{
    json_array_append_new(ctx, json_string(line));
}

static void on_progress(void *ctx, uint64_t done, uint64_t total)
{
    tv__cli_progress_draw(ctx, done, total, -1, -1, NULL);
}

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
    const char *alias = tv__cli_get(a, "--alias");
    if (alias && (rc = tv__alias_name_valid(alias, &err)))
        return tv__cli_failed(c, rc, &err);
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
    tv__cli_progress pr;
    tv__cli_progress_start(&pr, json);
    o.progress = on_progress;
    o.progress_ctx = &pr;
    tv__import_result r = {0};
    json_t *skipped = json_array();
    o.on_skipped = skipped ? on_skipped : NULL;
    o.skipped_ctx = skipped;
    rc = tv__import(st, a->pos[0], a->pos[1], &o, &r, &err);
    tv__cli_progress_end(&pr);
    /* The alias moves like `alias set` (the generation is ready now). */
    if (!rc && alias && (rc = tv__store_alias_set(st, a->pos[0], alias, r.generation, &err))) {
        tv_error e2 = err;
        tv__seterr(&err, rc, "generation %lld of '%s' was imported, but alias '%s' was not set: %s",
                   (long long)r.generation, a->pos[0], alias, e2.msg);
    }
    tv__store_close(st);
    if (rc) {
        json_decref(skipped);
        return tv__cli_failed(c, rc, &err);
    }
    json_t *aliases = json_array();
    if (alias)
        json_array_append_new(aliases, json_string(alias));
    json_t *doc =
        json_pack("{s:s,s:I,s:b,s:o,s:I,s:I,s:I,s:I,s:I,s:I,s:f,s:I,s:o}", "model", a->pos[0],
                  "generation", (json_int_t)r.generation, "active", o.activate, "aliases", aliases,
                  "n_shards", (json_int_t)r.n_shards, "n_tensors", (json_int_t)r.n_tensors,
                  "total_bytes", (json_int_t)r.bytes_total, "written_bytes",
                  (json_int_t)r.bytes_written, "deduplicated_bytes", (json_int_t)r.bytes_deduped,
                  "resumed_bytes", (json_int_t)r.bytes_resumed, "seconds", r.seconds, "n_files",
                  (json_int_t)r.n_files, "skipped", skipped);
    tv__cli_print(stdout, json, TV__DOC_IMPORT, doc);
    json_decref(doc);
    return TV__EXIT_OK;
}

/* ---- verify, local: read-only, no job row (a verify job is a writer) ----- */

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

int tv__cli_verify_local(const tv__cli_ctx *c, const char *dir, int64_t device_id)
{
    bool json = c->json;
    tv_error err = {0};
    tv__store *st;
    tv__reg_object *o = NULL;
    size_t n = 0, bad = 0;
    uint64_t bytes = 0;
    int rc = open_store(dir, 0, &st, &err);
    if (!rc)
        rc = tv__reg_objects_list_committed(st->reg, device_id, &o, &n, &err);
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
