/* Unit tests of snapshot files built from the registry
 * (server/store/snapbuild.c): a store on two file images, a generated
 * two-shard checkpoint (rank 0 and zero-size tensors included) imported
 * with one replica per device, then every snapshot field is checked
 * against the registry manifest and device rows, and the bytes each record
 * points at are read back from both images and compared with the source
 * files. Also: an existing valid file is kept, a corrupt one replaced
 * (unless a reader holds it), gc's lease check and removal, crash repair
 * (tv__store_sync_snapshots) and the active pointer. Registry and pointer
 * agree after activate and import --activate under a failure of every
 * write, sync and rename (tv__sys), after a writer killed at each crash
 * point (forked child, _exit), and after a stale or garbage pointer; a
 * writer open with 50 models and 10 retired generations writes nothing.
 * Aliases (tv__store_alias_set/remove) under the same faults and crash
 * points, repair of alias pointers, tv__store_gc, tv__store_model_delete
 * and worker handles (tv__store_open_worker). Deactivation
 * (tv__store_deactivate): what readers open after it, a failure of every
 * write, sync, rename and unlink, the crash points and their repair, and
 * model delete afterwards. */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "dev/dev.h"
#include "import/import.h"
#include "store/snapbuild.h"
#include "store/store.h"
#include "registry/registry.h"
#include "snap/snapfile.h"
#include "snap/snapshot.h"
#include "tensorvault/tensorvault.h"
#include "util/endian.h"
#include "util/sha256.h"
#include "util/sys.h"
#include "tv_test_store.h"

#define MiB   (1024ull * 1024ull)
#define MODEL "org/tiny-model"

typedef struct fixture {
    tv_test_store s; /* two 16 MiB images, the writer open */
    char ck_a[512];  /* index of the two-shard checkpoint */
    char ck_b[512];  /* a single-file checkpoint with other bytes */
} fixture;

/* ---- checkpoints (tv_test_write_shard) ---------------------------------------- */

static const tv_test_tensor_nd SHARD1[] = {
    {"layers.0.w", "F32", "[10,20]", 800},
    {"layers.0.b", "U8", "[13]", 13},
    {"scalar", "I64", "[]", 8},
    {"empty", "F16", "[0,4]", 0},
};
static const tv_test_tensor_nd SHARD2[] = {{"head.w", "BF16", "[5,7]", 70}};
static const tv_test_tensor_nd SINGLE[] = {{"emb", "U8", "[100]", 100},
                                           {"emb.scale", "F32", "[]", 4}};

static const char INDEX[] = "{\"metadata\":{\"total_size\":891},\"weight_map\":{"
                            "\"layers.0.w\":\"model-00001-of-00002.safetensors\","
                            "\"layers.0.b\":\"model-00001-of-00002.safetensors\","
                            "\"scalar\":\"model-00001-of-00002.safetensors\","
                            "\"empty\":\"model-00001-of-00002.safetensors\","
                            "\"head.w\":\"model-00002-of-00002.safetensors\"}}";

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    assert_non_null(f);
    tv_test_store_dir(&f->s, "snapbuild");
    char d[256], p[384];
    snprintf(d, sizeof d, "%s/ck", f->s.dir);
    assert_int_equal(mkdir(d, 0700), 0);
    snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", d);
    tv_test_write_shard_nd(p, SHARD1, TV_ARRAY_LEN(SHARD1), 1);
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", d);
    tv_test_write_shard_nd(p, SHARD2, TV_ARRAY_LEN(SHARD2), 2);
    snprintf(f->ck_a, sizeof f->ck_a, "%s/model.safetensors.index.json", d);
    tv_test_write_text(f->ck_a, INDEX);
    snprintf(f->ck_b, sizeof f->ck_b, "%s/single.safetensors", f->s.dir);
    tv_test_write_shard_nd(f->ck_b, SINGLE, TV_ARRAY_LEN(SINGLE), 5);

    tv_test_store_create(&f->s, &(tv_test_store_opts){.n_images = 2});
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    tv__sys_reset();
    tv__sys_crash_hook = NULL;
    tv_test_store_teardown(&f->s);
    free(f);
    return 0;
}

static int64_t import(fixture *f, const char *src)
{
    tv__import_opts o = {.activate = true, .strict = true, .devices = f->s.dev, .n_devices = 2};
    tv__import_result res;
    tv_error err = {0};
    if (tv__import(f->s.st, MODEL, src, &o, &res, &err))
        fail_msg("import %s: %s", src, err.msg);
    return res.generation;
}

static void write_snapshot(fixture *f, int64_t gen)
{
    tv_error err = {0};
    if (tv__store_write_snapshot(f->s.st, MODEL, gen, &err))
        fail_msg("write snapshot %lld: %s", (long long)gen, err.msg);
    if (tv__store_write_active(f->s.st, MODEL, &err))
        fail_msg("write active: %s", err.msg);
}

static bool snap_exists(fixture *f, const char *model, int64_t gen)
{
    bool ex = false;
    assert_int_equal(tv__snapfile_exists(f->s.store, model, gen, &ex, NULL), 0);
    return ex;
}

/* Reads len bytes at off from a file. */
static void pread_file(const char *path, void *buf, size_t len, uint64_t off)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    assert_true(fd >= 0);
    assert_int_equal(pread(fd, buf, len, (off_t)off), (ssize_t)len);
    close(fd);
}

/* ---- tests --------------------------------------------------------------------- */

static void test_matches_registry(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    int64_t gen = import(f, f->ck_a);
    assert_int_equal(gen, 1);
    write_snapshot(f, 0);

    int64_t active = 0;
    assert_int_equal(tv__snapfile_read_active(f->s.store, MODEL, &active, &err), 0);
    assert_int_equal(active, 1);
    int fd = -1;
    void *buf = NULL;
    size_t len = 0;
    assert_int_equal(tv__snapfile_open(f->s.store, MODEL, 0, &fd, &buf, &len, &err), 0);
    tv__snap s;
    if (tv__snap_open(buf, len, TV__SNAP_VERIFY_CHECKSUM, &s, &err))
        fail_msg("snap open: %s", err.msg);

    tv__reg_generation g;
    tv__reg_manifest *m = NULL;
    assert_int_equal(tv__reg_generation_get(f->s.st->reg, MODEL, 1, &g, &err), 0);
    assert_int_equal(tv__reg_tensors_list(f->s.st->reg, g.id, &m, &err), 0);

    const char *name;
    size_t name_len;
    assert_int_equal(tv__snap_model(&s, &name, &name_len, &err), 0);
    assert_int_equal(name_len, strlen(MODEL));
    assert_memory_equal(name, MODEL, name_len);
    assert_int_equal(s.generation, 1);
    assert_int_equal(s.n_shards, m->n_shards);
    assert_int_equal(s.n_shards, 2);
    assert_int_equal(s.n_tensors, m->n_tensors);
    assert_int_equal(s.n_tensors, 5);
    assert_int_equal(s.n_devices, 2);
    assert_int_equal(s.n_replicas, 4);

    /* Shards, replicas and the devices they name. */
    for (uint32_t i = 0; i < s.n_shards; i++) {
        const tv__reg_shard *ms = &m->shards[i];
        tv__snap_shard_info sh;
        char hex[65];
        assert_int_equal(tv__snap_shard(&s, i, &sh, &err), 0);
        assert_int_equal(sh.name_len, strlen(ms->name));
        assert_memory_equal(sh.name, ms->name, sh.name_len);
        assert_int_equal(sh.file_len, ms->file_len);
        assert_int_equal(sh.header_len, ms->header_len);
        assert_int_equal(sh.data_off, ms->data_off);
        tv__reg_sha256_hex(sh.sha256, hex);
        assert_string_equal(hex, ms->sha256);
        assert_int_equal(sh.n_replicas, ms->n_replicas);
        assert_int_equal(sh.n_replicas, 2);
        for (uint32_t r = 0; r < sh.n_replicas; r++) {
            const tv__reg_replica *mr = &ms->replicas[r];
            tv__snap_replica_info rp;
            tv__snap_device_info d;
            tv__reg_device row;
            char uuid[37], kind[8];
            assert_int_equal(tv__snap_replica(&s, sh.first_replica + r, &rp, &err), 0);
            assert_int_equal(rp.object_id, mr->object_id);
            assert_int_equal(rp.base_off, mr->base_off);
            assert_int_equal(rp.alloc_len, mr->alloc_len);
            assert_int_equal(tv__snap_device(&s, rp.device, &d, &err), 0);
            assert_int_equal(tv__reg_device_get(f->s.st->reg, mr->device_id, &row, &err), 0);
            tv__uuid_format(d.uuid, uuid);
            assert_string_equal(uuid, row.uuid);
            assert_int_equal(d.path_len, strlen(row.path));
            assert_string_equal(d.path, row.path);
            snprintf(kind, sizeof kind, "%s", tv__dev_kind_name((int)d.kind));
            assert_string_equal(kind, row.kind);
            assert_int_equal(d.lba_size, row.lba_size);
            assert_int_equal(d.io_align, row.io_align);
            assert_int_equal(d.object_align, row.object_align);
            assert_int_equal(d.size_bytes, row.size_bytes);
            assert_int_equal(d.region_off, row.region_off);
            assert_int_equal(d.region_len, row.region_len);
            assert_int_equal(d.data_off, row.data_off);
            static const uint8_t zero[40];
            assert_memory_equal(d.serial, zero, 20); /* file images have no NVMe identity */
            assert_memory_equal(d.model, zero, 40);
            assert_int_equal(d.nsid, 0);
        }
    }

    /* Tensors: same file order as the registry, every field, and the bytes
     * behind them on both replicas equal the source file's. */
    for (uint32_t i = 0; i < s.n_tensors; i++) {
        const tv__reg_tensor *mt = &m->tensors[i];
        tv__snap_tensor_info t;
        uint32_t idx = UINT32_MAX;
        assert_int_equal(tv__snap_find(&s, mt->name, mt->name_len, &idx, &err), 0);
        assert_int_equal(idx, i);
        assert_int_equal(tv__snap_tensor(&s, idx, &t, &err), 0);
        assert_int_equal(t.name_len, mt->name_len);
        assert_memory_equal(t.name, mt->name, t.name_len);
        assert_int_equal(t.dtype, mt->dtype);
        assert_int_equal(t.rank, mt->rank);
        for (uint32_t d = 0; d < t.rank; d++)
            assert_int_equal(tv__snap_dim(&t, d), mt->shape[d]);
        assert_int_equal(t.shard, mt->shard_idx);
        assert_int_equal(t.begin_off, mt->begin_off);
        assert_int_equal(t.end_off, mt->end_off);

        tv__snap_shard_info sh;
        assert_int_equal(tv__snap_shard(&s, t.shard, &sh, &err), 0);
        char src[512];
        snprintf(src, sizeof src, "%s/ck/%.*s", f->s.dir, (int)sh.name_len, sh.name);
        uint8_t want[1024], got[1024];
        assert_true(t.nbytes <= sizeof want);
        if (t.nbytes)
            pread_file(src, want, t.nbytes, sh.data_off + t.begin_off);
        for (uint32_t r = 0; r < sh.n_replicas; r++) {
            tv__snap_replica_info rp;
            tv__snap_device_info d;
            assert_int_equal(tv__snap_replica(&s, sh.first_replica + r, &rp, &err), 0);
            assert_int_equal(tv__snap_device(&s, rp.device, &d, &err), 0);
            if (t.nbytes) {
                pread_file(d.path, got, t.nbytes, rp.base_off + sh.data_off + t.begin_off);
                assert_memory_equal(got, want, t.nbytes);
            }
        }
    }
    uint32_t idx;
    assert_int_equal(tv__snap_find(&s, "scalar", 6, &idx, &err), 0);
    tv__snap_tensor_info t;
    assert_int_equal(tv__snap_tensor(&s, idx, &t, &err), 0);
    assert_int_equal(t.rank, 0);
    assert_int_equal(t.nbytes, 8);
    assert_int_equal(tv__snap_find(&s, "empty", 5, &idx, &err), 0);
    assert_int_equal(tv__snap_tensor(&s, idx, &t, &err), 0);
    assert_int_equal(t.nbytes, 0);

    /* The in-memory build gives the same manifest. */
    void *b2 = NULL;
    size_t l2 = 0;
    assert_int_equal(tv__store_build_snapshot(f->s.st, MODEL, 1, &b2, &l2, &err), 0);
    assert_int_equal(l2, len);
    free(b2);

    tv__reg_manifest_free(m);
    tv__snapfile_unmap(buf, len);
    close(fd);
}

/* The file's bytes (a rebuild draws a new hash seed, so equal bytes mean the
 * file was kept). */
static void *file_bytes(fixture *f, int64_t gen, size_t *len)
{
    int fd = -1;
    void *buf = NULL;
    tv_error err = {0};
    if (tv__snapfile_open(f->s.store, MODEL, gen, &fd, &buf, len, &err))
        fail_msg("open: %s", err.msg);
    close(fd);
    void *copy = malloc(*len); /* a copy: corrupt() rewrites the file in place */
    assert_non_null(copy);
    memcpy(copy, buf, *len);
    tv__snapfile_unmap(buf, *len);
    return copy;
}

static void corrupt(fixture *f, int64_t gen)
{
    char p[TV__SNAPFILE_PATH_MAX];
    assert_int_equal(tv__snapfile_path(f->s.store, MODEL, gen, p, sizeof p, NULL), 0);
    int fd = open(p, O_WRONLY | O_CLOEXEC);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, "garbage", 7, 300), 7);
    close(fd);
}

static void test_existing_file(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    size_t la, lb;
    import(f, f->ck_a);
    write_snapshot(f, 1);
    void *a = file_bytes(f, 1, &la);
    /* Valid and equal: kept as is. */
    assert_int_equal(tv__store_write_snapshot(f->s.st, MODEL, 1, &err), 0);
    void *b = file_bytes(f, 1, &lb);
    assert_int_equal(la, lb);
    assert_memory_equal(a, b, la);
    free(b);

    /* Corrupt: replaced by a valid one (with a new hash seed). */
    corrupt(f, 1);
    assert_int_equal(tv__store_write_snapshot(f->s.st, MODEL, 1, &err), 0);
    b = file_bytes(f, 1, &lb);
    assert_int_equal(la, lb);
    assert_memory_not_equal(a, b, la);
    free(a);
    free(b);
    int fd;
    void *buf;
    size_t len;
    tv__snap s;
    assert_int_equal(tv__snapfile_open(f->s.store, MODEL, 1, &fd, &buf, &len, &err), 0);
    assert_int_equal(tv__snap_open(buf, len, TV__SNAP_VERIFY_CHECKSUM, &s, &err), 0);
    tv__snapfile_unmap(buf, len);

    /* Corrupt while a reader holds it: left alone, TV_E_LEASED. */
    corrupt(f, 1);
    assert_int_equal(tv__store_write_snapshot(f->s.st, MODEL, 1, &err), TV_E_LEASED);
    close(fd);
    assert_int_equal(tv__store_write_snapshot(f->s.st, MODEL, 1, &err), 0);

    /* Generations without snapshots. */
    void *img = NULL;
    assert_int_equal(tv__store_build_snapshot(f->s.st, "no-such-model", 0, &img, &len, &err),
                     TV_E_NOT_FOUND);
    assert_int_equal(tv__store_build_snapshot(f->s.st, MODEL, 9, &img, &len, &err), TV_E_NOT_FOUND);
    tv__reg_generation g;
    assert_int_equal(tv__reg_generation_create(f->s.st->reg, "other", "/nowhere", 0, &g, &err), 0);
    assert_int_equal(tv__store_build_snapshot(f->s.st, "other", g.number, &img, &len, &err),
                     TV_E_STATE);
    assert_int_equal(tv__store_write_snapshot(f->s.st, "other", g.number, &err), TV_E_STATE);
    assert_false(snap_exists(f, "other", g.number));
    /* No active generation: no pointer (and none for an unknown model). */
    assert_int_equal(tv__store_write_active(f->s.st, "other", &err), 0);
    int64_t active;
    assert_int_equal(tv__snapfile_read_active(f->s.store, "other", &active, &err), TV_E_NOT_FOUND);
    assert_int_equal(tv__store_write_active(f->s.st, "ghost", &err), 0);
}

/* A snapshot file of another format version (version 1: SHA-256 checksum)
 * is refused by readers and rebuilt by the next writer's open
 * (tv__store_sync_snapshots -> reconcile_existing). */
static void test_old_version_rebuilt(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    size_t la, lb;
    char p[TV__SNAPFILE_PATH_MAX];
    import(f, f->ck_a);
    write_snapshot(f, 1);
    uint8_t *a = file_bytes(f, 1, &la);
    assert_int_equal(tv__le32_get(a + 8), TV__SNAP_VERSION);
    /* The same image as version 1 wrote it: version 1, the SHA-256 of the
     * image with the 32-byte field zeroed. */
    tv__le32_put(a + 8, 1);
    memset(a + TV__SNAP_CHECKSUM_OFF, 0, 32);
    uint8_t sum[32];
    tv__sha256 h;
    assert_int_equal(tv__sha256_init(&h), 0);
    tv__sha256_update(&h, a, la);
    tv__sha256_final(&h, sum);
    memcpy(a + TV__SNAP_CHECKSUM_OFF, sum, 32);
    assert_int_equal(tv__snapfile_path(f->s.store, MODEL, 1, p, sizeof p, &err), 0);
    assert_int_equal(unlink(p), 0);
    assert_int_equal(tv__snapfile_write(f->s.store, MODEL, 1, a, la, &err), 0);

    /* Readers refuse it with the version error. */
    int fd = -1;
    void *buf = NULL;
    size_t len = 0;
    tv__snap s;
    assert_int_equal(tv__snapfile_open(f->s.store, MODEL, 0, &fd, &buf, &len, &err), 0);
    assert_int_equal(tv__snap_open(buf, len, TV__SNAP_VERIFY_CHECKSUM, &s, &err), TV_E_SNAPSHOT);
    assert_non_null(strstr(err.msg, "version 1"));
    tv__snapfile_unmap(buf, len);
    close(fd);

    /* The writer's repair rebuilds it in the current version. */
    assert_int_equal(tv__store_sync_snapshots(f->s.st, &err), 0);
    uint8_t *b = file_bytes(f, 1, &lb);
    assert_int_equal(lb, la);
    assert_int_equal(tv__le32_get(b + 8), TV__SNAP_VERSION);
    assert_int_equal(tv__snap_open(b, lb, TV__SNAP_VERIFY_CHECKSUM, &s, &err), 0);
    assert_int_equal(s.generation, 1);
    free(b);
    /* Readable files are left alone: a second sync keeps the bytes. */
    b = file_bytes(f, 1, &lb);
    assert_int_equal(tv__store_sync_snapshots(f->s.st, &err), 0);
    uint8_t *c = file_bytes(f, 1, &la);
    assert_int_equal(la, lb);
    assert_memory_equal(b, c, lb);
    free(a);
    free(b);
    free(c);
}

static void test_active_gc_sync(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    int64_t active = 0;
    bool leased = true;
    assert_int_equal(import(f, f->ck_a), 1);
    write_snapshot(f, 1);
    assert_int_equal(import(f, f->ck_b), 2);
    write_snapshot(f, 2);
    assert_int_equal(tv__snapfile_read_active(f->s.store, MODEL, &active, &err), 0);
    assert_int_equal(active, 2);

    /* Rollback: the pointer follows the registry. */
    assert_int_equal(tv__reg_generation_activate(f->s.st->reg, MODEL, 1, &err), 0);
    assert_int_equal(tv__store_write_active(f->s.st, MODEL, &err), 0);
    assert_int_equal(tv__snapfile_read_active(f->s.store, MODEL, &active, &err), 0);
    assert_int_equal(active, 1);
    assert_int_equal(tv__reg_generation_activate(f->s.st->reg, MODEL, 2, &err), 0);
    assert_int_equal(tv__store_write_active(f->s.st, MODEL, &err), 0);
    assert_int_equal(tv__reg_generation_retire(f->s.st->reg, MODEL, 1, &err), 0);

    /* gc: a reader of generation 1 keeps its snapshot. */
    int fd;
    void *buf;
    size_t len;
    assert_int_equal(tv__snapfile_open(f->s.store, MODEL, 1, &fd, &buf, &len, &err), 0);
    tv__snapfile_unmap(buf, len);
    assert_int_equal(tv__store_snapshot_leased(f->s.st, MODEL, 1, &leased, &err), 0);
    assert_true(leased);
    assert_int_equal(tv__store_remove_snapshot(f->s.st, MODEL, 1, &err), TV_E_LEASED);
    assert_true(snap_exists(f, MODEL, 1));
    close(fd);
    assert_int_equal(tv__store_snapshot_leased(f->s.st, MODEL, 1, &leased, &err), 0);
    assert_false(leased);
    assert_int_equal(tv__store_snapshot_leased(f->s.st, MODEL, 2, &leased, &err), 0);
    assert_false(leased);

    /* Crash repair: missing files and pointer come back, temporaries go. */
    char p[TV__SNAPFILE_PATH_MAX], md[TV__SNAPFILE_PATH_MAX], tmp[TV__SNAPFILE_PATH_MAX + 32];
    assert_int_equal(tv__snapfile_path(f->s.store, MODEL, 2, p, sizeof p, &err), 0);
    assert_int_equal(unlink(p), 0);
    assert_int_equal(tv__snapfile_write_active(f->s.store, MODEL, 0, &err), 0);
    assert_int_equal(tv__snapfile_model_dir(f->s.store, MODEL, md, sizeof md, &err), 0);
    snprintf(tmp, sizeof tmp, "%s/.tmp-2-999-0", md);
    tv_test_write_text(tmp, "partial");
    if (tv__store_sync_snapshots(f->s.st, &err))
        fail_msg("sync: %s", err.msg);
    assert_true(snap_exists(f, MODEL, 2));
    assert_true(snap_exists(f, MODEL, 1)); /* retired: kept as it was (never rebuilt) */
    assert_false(access(tmp, F_OK) == 0);
    assert_int_equal(tv__snapfile_read_active(f->s.store, MODEL, &active, &err), 0);
    assert_int_equal(active, 2);

    /* gc proper: a reader of generation 1 keeps all its objects... */
    tv__reg_object *objs = NULL;
    size_t n = 0;
    bool keep[8] = {false};
    assert_int_equal(tv__reg_objects_unreferenced(f->s.st->reg, &objs, &n, &err), 0);
    assert_int_equal(n, 4); /* 2 shards x 2 replicas of generation 1 */
    assert_int_equal(tv__snapfile_open(f->s.store, MODEL, 1, &fd, &buf, &len, &err), 0);
    tv__snapfile_unmap(buf, len);
    assert_int_equal(tv__store_gc_snapshots(f->s.st, objs, n, keep, &err), 0);
    for (size_t i = 0; i < n; i++)
        assert_true(keep[i]);
    assert_true(snap_exists(f, MODEL, 1));
    close(fd);
    /* ...and once it is gone the snapshot goes first, then the objects;
     * sync no longer brings generation 1 back. */
    memset(keep, 0, sizeof keep);
    assert_int_equal(tv__store_gc_snapshots(f->s.st, objs, n, keep, &err), 0);
    for (size_t i = 0; i < n; i++)
        assert_false(keep[i]);
    assert_false(snap_exists(f, MODEL, 1));
    assert_true(snap_exists(f, MODEL, 2));
    for (size_t i = 0; i < n; i++)
        assert_int_equal(tv__reg_object_delete(f->s.st->reg, objs[i].id, &err), 0);
    free(objs);
    assert_int_equal(tv__store_gc_snapshots(f->s.st, NULL, 0, NULL, &err), 0);
    if (tv__store_sync_snapshots(f->s.st, &err))
        fail_msg("sync: %s", err.msg);
    assert_false(snap_exists(f, MODEL, 1));
    assert_int_equal(tv__store_write_snapshot(f->s.st, MODEL, 1, &err), TV_E_STATE);
    assert_true(snap_exists(f, MODEL, 2));
}

/* A retired generation whose objects are all shared with a live one has
 * nothing to free: gc leaves its snapshot alone. */
static void test_gc_shared_objects(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    assert_int_equal(import(f, f->ck_a), 1);
    write_snapshot(f, 1);
    assert_int_equal(import(f, f->ck_a), 2); /* deduplicated: the same objects */
    write_snapshot(f, 2);
    assert_int_equal(tv__reg_generation_retire(f->s.st->reg, MODEL, 1, &err), 0);
    tv__reg_object *objs = NULL;
    size_t n = 9;
    assert_int_equal(tv__reg_objects_unreferenced(f->s.st->reg, &objs, &n, &err), 0);
    assert_int_equal(n, 0);
    assert_int_equal(tv__store_gc_snapshots(f->s.st, objs, n, NULL, &err), 0);
    assert_true(snap_exists(f, MODEL, 1));
    free(objs);
}

/* ---- registry and pointer agree, and what a write costs ---------------------- */

/* Injected failure of the k-th call (1-based) among pwrite, fdatasync,
 * fsync, rename and rename_noreplace; counts every call. */
static int g_fail_at, g_calls;
static int g_n_pwrite, g_n_sync, g_n_rename;

static bool fault_now(void)
{
    return ++g_calls == g_fail_at;
}

static ssize_t f_pwrite(int fd, const void *b, size_t n, off_t off)
{
    g_n_pwrite++;
    if (fault_now())
        return errno = EIO, -1;
    return pwrite(fd, b, n, off);
}

static int f_fsync(int fd)
{
    g_n_sync++;
    if (fault_now())
        return errno = EIO, -1;
    return fsync(fd);
}

static int f_fdatasync(int fd)
{
    g_n_sync++;
    if (fault_now())
        return errno = EIO, -1;
    return fdatasync(fd);
}

static int f_rename(const char *a, const char *b)
{
    g_n_rename++;
    if (fault_now())
        return errno = EIO, -1;
    return rename(a, b);
}

static int f_rename_noreplace(const char *a, const char *b)
{
    g_n_rename++;
    if (fault_now())
        return errno = EIO, -1;
    return renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_NOREPLACE);
}

static void faults_on(int fail_at)
{
    g_fail_at = fail_at;
    g_calls = g_n_pwrite = g_n_sync = g_n_rename = 0;
    tv__sys.pwrite = f_pwrite;
    tv__sys.fsync = f_fsync;
    tv__sys.fdatasync = f_fdatasync;
    tv__sys.rename = f_rename;
    tv__sys.rename_noreplace = f_rename_noreplace;
}

/* The registry's active generation (0: none) and the pointer's (0: none)
 * are the same; returns it. */
static int64_t agreed_active(fixture *f, const char *model)
{
    tv_error err = {0};
    int64_t reg = 0, ptr = 0;
    int rc = tv__reg_active_generation(f->s.st->reg, model, &reg, &err);
    if (rc == TV_E_NOT_FOUND)
        reg = 0;
    else if (rc)
        fail_msg("registry: %s", err.msg);
    rc = tv__snapfile_read_active(f->s.store, model, &ptr, &err);
    if (rc == TV_E_NOT_FOUND)
        ptr = 0;
    else if (rc)
        fail_msg("pointer: %s", err.msg);
    if (reg != ptr)
        fail_msg("model '%s': registry says generation %lld, the active pointer %lld", model,
                 (long long)reg, (long long)ptr);
    return reg;
}

/* Every failing pwrite/fdatasync/fsync/rename during activate (the
 * target's snapshot missing, so its write is exercised too) leaves the
 * registry and the pointer on the old generation; the first run with no
 * failure left activates. */
static void test_activate_faults(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    char p[TV__SNAPFILE_PATH_MAX];
    assert_int_equal(import(f, f->ck_a), 1);
    assert_int_equal(import(f, f->ck_b), 2);
    assert_int_equal(agreed_active(f, MODEL), 2);
    int k, n_failed = 0;
    for (k = 1; k < 100; k++) {
        int64_t before = agreed_active(f, MODEL), target = before == 1 ? 2 : 1;
        assert_int_equal(tv__snapfile_path(f->s.store, MODEL, target, p, sizeof p, &err), 0);
        assert_true(unlink(p) == 0 || errno == ENOENT); /* absent after a failed write */
        faults_on(k);
        int rc = tv__store_activate(f->s.st, MODEL, target, &err);
        int calls = g_calls;
        tv__sys_reset();
        int64_t now = agreed_active(f, MODEL);
        if (rc) {
            n_failed++;
            assert_int_equal(now, before); /* an error changes neither */
            assert_non_null(strstr(err.msg, "Input/output error"));
        } else {
            assert_int_equal(now, target);
        }
        /* a reader opens what both say */
        int fd;
        void *buf;
        size_t len;
        int64_t opened = 0;
        assert_int_equal(
            tv__snapfile_open_gen(f->s.store, MODEL, 0, &opened, &fd, &buf, &len, &err), 0);
        assert_int_equal(opened, now);
        tv__snapfile_unmap(buf, len);
        close(fd);
        if (calls < k) {
            assert_int_equal(rc, 0);
            break; /* no call left to fail */
        }
    }
    assert_true(k < 100);
    assert_true(n_failed >= 6); /* snapshot: pwrite, fdatasync, rename, fsync; pointer: the same */
    /* Activating the active generation writes nothing. */
    int64_t cur = agreed_active(f, MODEL);
    faults_on(0);
    assert_int_equal(tv__store_activate(f->s.st, MODEL, cur, &err), 0);
    assert_int_equal(g_calls, 0);
    tv__sys_reset();
    /* Retire under every fault: registry only, the pointer stays agreed. */
    faults_on(1);
    if (tv__reg_generation_retire(f->s.st->reg, MODEL, cur == 1 ? 2 : 1, &err))
        fail_msg("retire: %s", err.msg);
    tv__sys_reset();
    assert_int_equal(agreed_active(f, MODEL), cur);
}

/* import --activate under every failing write or sync: on an error the
 * registry's and the pointer's active generation are the old one; on
 * success the new one. */
static void test_import_faults(void **state)
{
    fixture *f = *state;
    assert_int_equal(import(f, f->ck_a), 1);
    int k;
    for (k = 1; k < 400; k++) {
        int64_t before = agreed_active(f, MODEL);
        tv__import_opts o = {.activate = true, .devices = f->s.dev, .n_devices = 2};
        tv__import_result res = {0};
        tv_error err = {0};
        faults_on(k);
        int rc = tv__import(f->s.st, MODEL, f->ck_b, &o, &res, &err);
        int calls = g_calls;
        tv__sys_reset();
        int64_t now = agreed_active(f, MODEL);
        if (rc)
            assert_int_equal(now, before);
        else
            assert_int_equal(now, res.generation);
        if (calls < k) {
            assert_int_equal(rc, 0);
            break;
        }
    }
    assert_true(k < 400);
}

/* A writer killed (SIGKILL-like: _exit in a child, no cleanup) at each
 * crash point of activate: the next writer's open reconciles in the
 * documented direction, and what readers saw before the repair is what
 * they see after it (no flip back). */
static const char *g_crash_at;

static void crash_hook(const char *point)
{
    if (g_crash_at && strcmp(point, g_crash_at) == 0)
        _exit(42);
}

static void crash_child(fixture *f, const char *point, int64_t target, bool via_import)
{
    tv__store_close(f->s.st);
    f->s.st = NULL;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        tv__store *st;
        tv_error err = {0};
        if (tv__store_open(f->s.store, TV__STORE_WRITE, &st, &err))
            _exit(3);
        g_crash_at = point;
        tv__sys_crash_hook = crash_hook;
        int rc;
        if (via_import) {
            tv__import_opts o = {.activate = true, .devices = f->s.dev, .n_devices = 2};
            rc = tv__import(st, MODEL, f->ck_b, &o, NULL, &err);
        } else {
            rc = tv__store_activate(st, MODEL, target, &err);
        }
        _exit(rc ? 4 : 5);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 42);
}

static void test_activate_crash_points(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    assert_int_equal(import(f, f->ck_a), 1);
    assert_int_equal(import(f, f->ck_b), 2);
    static const struct {
        const char *point;
        bool lands; /* the activation survives the crash */
    } cases[] = {
        {"activate.snapshot", false}, {"activate.pointer", true}, {"activate.commit", true}};
    for (size_t i = 0; i < TV_ARRAY_LEN(cases); i++) {
        int64_t before = agreed_active(f, MODEL), target = before == 1 ? 2 : 1;
        crash_child(f, cases[i].point, target, false);
        /* Before any writer runs: a reader opens what the pointer says. */
        int fd;
        void *buf;
        size_t len;
        int64_t seen = 0;
        assert_int_equal(tv__snapfile_open_gen(f->s.store, MODEL, 0, &seen, &fd, &buf, &len, &err),
                         0);
        tv__snapfile_unmap(buf, len);
        close(fd);
        if (tv__store_open(f->s.store, TV__STORE_WRITE, &f->s.st, &err))
            fail_msg("reopen: %s", err.msg);
        int64_t now = agreed_active(f, MODEL);
        if (now != (cases[i].lands ? target : before))
            fail_msg("crash at %s: active %lld, want %lld", cases[i].point, (long long)now,
                     (long long)(cases[i].lands ? target : before));
        assert_int_equal(now, seen);
    }
    /* import --activate killed between its pointer and its commit */
    int64_t before = agreed_active(f, MODEL);
    crash_child(f, "activate.pointer", 0, true);
    if (tv__store_open(f->s.store, TV__STORE_WRITE, &f->s.st, &err))
        fail_msg("reopen: %s", err.msg);
    int64_t now = agreed_active(f, MODEL);
    assert_true(now > before && now > 2);
}

/* A pointer that disagrees with the registry without recording the
 * registry's generation as the one it replaced is rewritten from the
 * registry (the registry is the source of truth). */
static void test_stale_pointer_repaired(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    assert_int_equal(import(f, f->ck_a), 1);
    assert_int_equal(import(f, f->ck_b), 2);
    assert_int_equal(tv__snapfile_write_pointer(f->s.store, MODEL, 1, -1, &err), 0);
    assert_int_equal(tv__store_sync_snapshots(f->s.st, &err), 0);
    assert_int_equal(agreed_active(f, MODEL), 2);
    assert_int_equal(tv__snapfile_write_pointer(f->s.store, MODEL, 1, 7, &err), 0);
    assert_int_equal(tv__store_sync_snapshots(f->s.st, &err), 0);
    assert_int_equal(agreed_active(f, MODEL), 2);
    /* garbage, or a FIFO in the pointer's place */
    char p[TV__SNAPFILE_PATH_MAX];
    assert_int_equal(tv__snapfile_active_path(f->s.store, MODEL, p, sizeof p, &err), 0);
    tv_test_write_text(p, "junk");
    assert_int_equal(tv__store_sync_snapshots(f->s.st, &err), 0);
    assert_int_equal(agreed_active(f, MODEL), 2);
    assert_int_equal(unlink(p), 0);
    assert_int_equal(mkfifo(p, 0600), 0);
    assert_int_equal(tv__store_sync_snapshots(f->s.st, &err), 0);
    assert_int_equal(agreed_active(f, MODEL), 2);
    /* a FIFO, then a symbolic link, in place of the active snapshot: the
     * entry is replaced by the real file */
    assert_int_equal(tv__snapfile_path(f->s.store, MODEL, 2, p, sizeof p, &err), 0);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(unlink(p), 0);
        if (i == 0)
            assert_int_equal(mkfifo(p, 0600), 0);
        else
            assert_int_equal(symlink("1.tvsnap", p), 0);
        assert_false(snap_exists(f, MODEL, 2));
        if (tv__store_sync_snapshots(f->s.st, &err))
            fail_msg("sync: %s", err.msg);
        assert_true(snap_exists(f, MODEL, 2));
        int fd;
        void *buf;
        size_t len;
        tv__snap sn;
        assert_int_equal(tv__snapfile_open(f->s.store, MODEL, 0, &fd, &buf, &len, &err), 0);
        assert_int_equal(tv__snap_open(buf, len, TV__SNAP_VERIFY_CHECKSUM, &sn, &err), 0);
        assert_int_equal(sn.generation, 2);
        tv__snapfile_unmap(buf, len);
        close(fd);
    }
}

/* Writer commands cost what they change: with 50 other models and 10
 * retired generations whose snapshots are gone, a writer open performs no
 * write, sync or rename at all, and activating one model O(1); retired
 * generations are never rebuilt. */
static void test_writer_cost(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    enum { N_OTHER = 50, N_RETIRED = 10 };
    tv__import_opts o = {.activate = true, .devices = f->s.dev, .n_devices = 2};
    for (int i = 0; i < N_OTHER; i++) {
        char name[32];
        snprintf(name, sizeof name, "other-%02d", i);
        if (tv__import(f->s.st, name, f->ck_b, &o, NULL, &err))
            fail_msg("import %s: %s", name, err.msg);
    }
    for (int i = 0; i < N_RETIRED + 2; i++) /* 1..10 retired, 11 ready, 12 active */
        import(f, f->ck_a);
    for (int64_t g = 1; g <= N_RETIRED; g++) {
        assert_int_equal(tv__reg_generation_retire(f->s.st->reg, MODEL, g, &err), 0);
        assert_int_equal(tv__store_remove_snapshot(f->s.st, MODEL, g, &err), 0);
    }
    tv__store_close(f->s.st);
    f->s.st = NULL;

    struct timespec t0, t1;
    faults_on(0);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (tv__store_open(f->s.store, TV__STORE_WRITE, &f->s.st, &err))
        fail_msg("open: %s", err.msg);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    int open_writes = g_n_pwrite + g_n_sync + g_n_rename;
    printf("# writer open, %d models + %d retired generations: %d writes/syncs/renames, %.1f ms\n",
           N_OTHER + 1, N_RETIRED, open_writes,
           (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6);
    assert_int_equal(open_writes, 1); /* the writer lock's pid: nothing else, whatever the count */
    assert_int_equal(g_n_sync + g_n_rename, 0);
    for (int64_t g = 1; g <= N_RETIRED; g++)
        assert_false(snap_exists(f, MODEL, g)); /* never rebuilt */

    /* activate one model: one pointer (write, fdatasync, rename, dir fsync) */
    int64_t cur = agreed_active(f, MODEL);
    faults_on(0);
    assert_int_equal(cur, N_RETIRED + 2);
    assert_int_equal(tv__store_activate(f->s.st, MODEL, cur - 1, &err), 0);
    printf("# activate: %d pwrite, %d syncs, %d renames\n", g_n_pwrite, g_n_sync, g_n_rename);
    assert_true(g_n_pwrite == 1 && g_n_sync == 2 && g_n_rename == 1);

    /* gc of one model's retired generations: no pointer is touched */
    tv__reg_object *objs = NULL;
    size_t n = 0;
    bool keep[64] = {false};
    faults_on(0);
    assert_int_equal(tv__reg_objects_unreferenced(f->s.st->reg, &objs, &n, &err), 0);
    assert_true(n <= 64);
    assert_int_equal(tv__store_gc_snapshots(f->s.st, objs, n, keep, &err), 0);
    free(objs);
    printf("# gc snapshots: %d pwrite, %d syncs, %d renames\n", g_n_pwrite, g_n_sync, g_n_rename);
    assert_int_equal(g_n_pwrite + g_n_rename, 0);
    tv__sys_reset();
    for (int i = 0; i < N_OTHER; i++) {
        char name[32];
        snprintf(name, sizeof name, "other-%02d", i);
        assert_int_equal(agreed_active(f, name), 1);
    }
}

/* ---- aliases, gc, model delete, worker handles (ops.c) ------------------------- */

/* The registry's alias (0: none) and the pointer file's (0: none) agree;
 * returns it. */
static int64_t agreed_alias(fixture *f, const char *model, const char *alias)
{
    tv_error err = {0};
    int64_t reg = 0, ptr = 0;
    int rc = tv__reg_alias_get(f->s.st->reg, model, alias, &reg, &err);
    if (rc == TV_E_NOT_FOUND)
        reg = 0;
    else if (rc)
        fail_msg("registry: %s", err.msg);
    rc = tv__snapfile_read_alias(f->s.store, model, alias, &ptr, &err);
    if (rc == TV_E_NOT_FOUND)
        ptr = 0;
    else if (rc)
        fail_msg("pointer: %s", err.msg);
    if (reg != ptr)
        fail_msg("model '%s': registry says alias '%s' = %lld, the pointer %lld", model, alias,
                 (long long)reg, (long long)ptr);
    return reg;
}

/* Set, move and remove an alias under a failure of every write, sync and
 * rename: an error changes neither the row nor the pointer. */
static void test_alias_faults(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    char p[TV__SNAPFILE_PATH_MAX];
    assert_int_equal(import(f, f->ck_a), 1);
    assert_int_equal(import(f, f->ck_b), 2);
    int k, n_failed = 0, n_moves = 0;
    for (k = 1; k < 400 && n_moves < 4; k++) {
        int64_t before = agreed_alias(f, MODEL, "prod");
        /* none -> 1 -> 2 -> removed -> 1 ... */
        int64_t target = before == 0 ? 1 : before == 1 ? 2 : 0;
        if (target == 1) { /* its snapshot missing: its write is exercised too */
            assert_int_equal(tv__snapfile_path(f->s.store, MODEL, 1, p, sizeof p, &err), 0);
            assert_true(unlink(p) == 0 || errno == ENOENT);
        }
        faults_on(k);
        int64_t removed = -1;
        int rc = target ? tv__store_alias_set(f->s.st, MODEL, "prod", target, &err)
                        : tv__store_alias_remove(f->s.st, MODEL, "prod", &removed, &err);
        int calls = g_calls;
        tv__sys_reset();
        int64_t now = agreed_alias(f, MODEL, "prod");
        if (rc) {
            n_failed++;
            assert_int_equal(now, before);
            assert_non_null(strstr(err.msg, "Input/output error"));
        } else {
            assert_int_equal(now, target);
            if (!target)
                assert_int_equal(removed, before);
        }
        assert_int_equal(agreed_active(f, MODEL), 2);
        if (calls < k) { /* no call left to fail: this change is done, next one */
            assert_int_equal(rc, 0);
            n_moves++;
            k = 0;
        }
    }
    assert_int_equal(n_moves, 4);
    assert_true(n_failed >= 10);
    /* errors */
    assert_int_equal(tv__store_alias_set(f->s.st, MODEL, "prod", 9, &err), TV_E_NOT_FOUND);
    assert_int_equal(tv__store_alias_set(f->s.st, MODEL, "9x", 1, &err), TV_E_NAME);
    assert_int_equal(tv__store_alias_remove(f->s.st, MODEL, "active", NULL, &err), TV_E_NAME);
    assert_int_equal(tv__store_alias_remove(f->s.st, MODEL, "nope", NULL, &err), TV_E_NOT_FOUND);
    /* "active" activates */
    assert_int_equal(tv__store_alias_set(f->s.st, MODEL, "active", 1, &err), 0);
    assert_int_equal(agreed_active(f, MODEL), 1);
    /* an aliased generation cannot be retired */
    assert_int_equal(agreed_alias(f, MODEL, "prod"), 1);
    assert_int_equal(tv__store_alias_set(f->s.st, MODEL, "canary", 2, &err), 0);
    assert_int_equal(tv__reg_generation_retire(f->s.st->reg, MODEL, 2, &err), TV_E_STATE);
    assert_non_null(strstr(err.msg, "'canary'"));
}

/* A writer killed at each alias crash point: the next writer's open puts
 * the pointer on what the registry says. */
static void alias_crash_child(fixture *f, const char *point, int64_t target)
{
    tv__store_close(f->s.st);
    f->s.st = NULL;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        tv__store *st;
        tv_error err = {0};
        if (tv__store_open(f->s.store, TV__STORE_WRITE, &st, &err))
            _exit(3);
        g_crash_at = point;
        tv__sys_crash_hook = crash_hook;
        int rc = target ? tv__store_alias_set(st, MODEL, "prod", target, &err)
                        : tv__store_alias_remove(st, MODEL, "prod", NULL, &err);
        _exit(rc ? 4 : 5);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 42);
    tv_error err = {0};
    if (tv__store_open(f->s.store, TV__STORE_WRITE, &f->s.st, &err))
        fail_msg("reopen: %s", err.msg);
}

static void test_alias_crash_points(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    assert_int_equal(import(f, f->ck_a), 1);
    assert_int_equal(import(f, f->ck_b), 2);
    assert_int_equal(tv__store_alias_set(f->s.st, MODEL, "prod", 1, &err), 0);
    static const struct {
        const char *point;
        int64_t target; /* 0: remove */
        int64_t after;  /* what registry and pointer say after the repair */
    } cases[] = {
        {"alias.snapshot", 2, 1}, {"alias.pointer", 2, 1}, {"alias.commit", 2, 2},
        {"alias.pointer", 0, 2},  {"alias.commit", 0, 0},  {"alias.commit", 1, 1},
    };
    for (size_t i = 0; i < TV_ARRAY_LEN(cases); i++) {
        alias_crash_child(f, cases[i].point, cases[i].target);
        int64_t now = agreed_alias(f, MODEL, "prod");
        if (now != cases[i].after)
            fail_msg("crash at %s (target %lld): alias %lld, want %lld", cases[i].point,
                     (long long)cases[i].target, (long long)now, (long long)cases[i].after);
    }
    /* an orphan pointer (no row) is removed, a garbage one rewritten */
    assert_int_equal(tv__snapfile_write_alias(f->s.store, MODEL, "ghost", 1, &err), 0);
    char p[TV__SNAPFILE_PATH_MAX];
    assert_int_equal(tv__snapfile_alias_path(f->s.store, MODEL, "prod", p, sizeof p, &err), 0);
    tv_test_write_text(p, "junk");
    assert_int_equal(tv__store_sync_snapshots(f->s.st, &err), 0);
    int64_t g = 0;
    assert_int_equal(tv__snapfile_read_alias(f->s.store, MODEL, "ghost", &g, &err), TV_E_NOT_FOUND);
    assert_int_equal(agreed_alias(f, MODEL, "prod"), 1);
    assert_int_equal(agreed_active(f, MODEL), 2);
}

/* ---- deactivation (tv__store_deactivate) --------------------------------------- */

static int f_unlink(const char *path)
{
    if (fault_now())
        return errno = EIO, -1;
    return unlink(path);
}

/* faults_on, and unlink fails in turn too. */
static void faults_on_all(int fail_at)
{
    faults_on(fail_at);
    tv__sys.unlink = f_unlink;
}

/* Whether the pointer a deactivation moved aside is there. */
static bool moved_pointer_exists(fixture *f, const char *model)
{
    char md[TV__SNAPFILE_PATH_MAX], p[TV__SNAPFILE_PATH_MAX + 32];
    struct stat sb;
    assert_int_equal(tv__snapfile_model_dir(f->s.store, model, md, sizeof md, NULL), 0);
    snprintf(p, sizeof p, "%s/%s", md, TV__SNAPFILE_DEACTIVATED);
    return lstat(p, &sb) == 0;
}

static int open_spec(fixture *f, const char *spec, tv_model **m, tv_error *err)
{
    tv_open_opts o = {.engine = TV_ENGINE_PREAD, .no_direct = true};
    return tv_model_open(f->s.store, spec, &o, m, err);
}

/* What the active generation is once settled, as a read-only store says. */
static int64_t settled_active(fixture *f, const char *model)
{
    tv__store *rd = NULL;
    tv_error err = {0};
    int64_t g = -1;
    if (tv__store_open(f->s.store, 0, &rd, &err) || tv__store_settled_active(rd, model, &g, &err))
        fail_msg("settled active: %s", err.msg);
    tv__store_close(rd);
    return g;
}

/* Deactivation: NAME no longer opens, NAME@GEN does, a reader opened
 * before keeps its generation; no active generation is a no-op writing
 * nothing; unknown model, reader store; the model can be deleted after. */
static void test_deactivate(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    assert_int_equal(import(f, f->ck_a), 1);
    assert_int_equal(import(f, f->ck_b), 2);
    assert_int_equal(tv__store_model_delete(f->s.st, MODEL, NULL, NULL, &err), TV_E_STATE);
    tv_model *before = NULL, *m = NULL;
    if (open_spec(f, MODEL, &before, &err))
        fail_msg("open %s: %s", MODEL, err.msg);
    assert_int_equal(tv_model_generation(before), 2);

    int64_t was = -1;
    if (tv__store_deactivate(f->s.st, MODEL, &was, &err))
        fail_msg("deactivate: %s", err.msg);
    assert_int_equal(was, 2);
    assert_int_equal(agreed_active(f, MODEL), 0);
    assert_false(moved_pointer_exists(f, MODEL));
    assert_int_equal(settled_active(f, MODEL), 0);
    tv__reg_generation g;
    assert_int_equal(tv__reg_generation_get(f->s.st->reg, MODEL, 2, &g, &err), 0);
    assert_int_equal(g.state, TV__GEN_READY);
    assert_false(g.active);
    /* readers: NAME is not found, NAME@GEN opens, the old reader reads on */
    assert_int_equal(open_spec(f, MODEL, &m, &err), TV_E_NOT_FOUND);
    assert_null(m);
    assert_non_null(strstr(err.msg, "no active generation"));
    if (open_spec(f, MODEL "@2", &m, &err))
        fail_msg("open %s@2: %s", MODEL, err.msg);
    uint8_t a[100], b[100];
    memset(a, 1, sizeof a);
    memset(b, 2, sizeof b);
    if (tv_read_into(before, "emb", a, sizeof a, &err) || tv_read_into(m, "emb", b, sizeof b, &err))
        fail_msg("read: %s", err.msg);
    assert_memory_equal(a, b, sizeof a);
    assert_int_equal(tv_model_generation(before), 2);
    tv_model_close(m);
    m = NULL;

    /* no active generation: a no-op that writes nothing */
    was = -1;
    faults_on_all(0);
    assert_int_equal(tv__store_deactivate(f->s.st, MODEL, &was, &err), 0);
    assert_int_equal(g_calls, 0);
    tv__sys_reset();
    assert_int_equal(was, 0);
    /* ... and removes a stray pointer (the registry is the source of truth) */
    assert_int_equal(tv__snapfile_write_pointer(f->s.store, MODEL, 1, -1, &err), 0);
    assert_int_equal(tv__store_deactivate(f->s.st, MODEL, NULL, &err), 0);
    assert_int_equal(agreed_active(f, MODEL), 0);
    /* errors */
    assert_int_equal(tv__store_deactivate(f->s.st, "nope", &was, &err), TV_E_NOT_FOUND);
    assert_non_null(strstr(err.msg, "'nope'"));
    assert_int_equal(tv__store_deactivate(f->s.st, NULL, &was, &err), TV_E_INVALID_ARG);
    tv__store *rd = NULL;
    assert_int_equal(tv__store_open(f->s.store, 0, &rd, &err), 0);
    assert_int_equal(tv__store_deactivate(rd, MODEL, &was, &err), TV_E_INVALID_ARG);
    tv__store_close(rd);
    assert_int_equal(tv__reg_tx_depth(f->s.st->reg), 0);

    /* activation works again afterwards */
    assert_int_equal(tv__store_activate(f->s.st, MODEL, 1, &err), 0);
    assert_int_equal(agreed_active(f, MODEL), 1);
    assert_int_equal(tv__store_deactivate(f->s.st, MODEL, &was, &err), 0);
    assert_int_equal(was, 1);

    /* model delete: refused while the old reader holds generation 2, then
     * done, a leftover moved pointer included */
    assert_int_equal(tv__store_model_delete(f->s.st, MODEL, NULL, NULL, &err), TV_E_LEASED);
    tv_model_close(before);
    char md[TV__SNAPFILE_PATH_MAX], d[TV__SNAPFILE_PATH_MAX + 32];
    assert_int_equal(tv__snapfile_model_dir(f->s.store, MODEL, md, sizeof md, &err), 0);
    snprintf(d, sizeof d, "%s/%s", md, TV__SNAPFILE_DEACTIVATED);
    tv_test_write_text(d, "1\n");
    size_t n_ret = 0;
    uint64_t freed = 0;
    if (tv__store_model_delete(f->s.st, MODEL, &n_ret, &freed, &err))
        fail_msg("model delete: %s", err.msg);
    assert_int_equal(n_ret, 2);
    assert_true(freed > 0);
    tv__reg_model rm;
    assert_int_equal(tv__reg_model_get(f->s.st->reg, MODEL, &rm, &err), TV_E_NOT_FOUND);
    assert_int_equal(open_spec(f, MODEL "@2", &m, &err), TV_E_NOT_FOUND);
    struct stat sb;
    assert_int_equal(lstat(md, &sb), -1); /* the directory went, moved pointer and all */
    assert_int_equal(errno, ENOENT);
}

/* Deactivating under a failure of every write, sync, rename and unlink in
 * turn: an error changes neither the registry nor the pointer (its bytes,
 * "from" line included); a success leaves none active, and a moved
 * pointer a failed clean-up left behind is removed by the next repair. */
static void test_deactivate_faults(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    assert_int_equal(import(f, f->ck_a), 1);
    assert_int_equal(import(f, f->ck_b), 2);
    int k, n_failed = 0, n_moves = 0, n_left = 0;
    for (k = 1; k < 100 && n_moves < 2; k++) {
        int64_t before = agreed_active(f, MODEL), from_before = -9, g = 0, from = -9;
        assert_true(before > 0);
        assert_int_equal(tv__snapfile_read_pointer(f->s.store, MODEL, &g, &from_before, &err), 0);
        faults_on_all(k);
        int64_t was = -1;
        int rc = tv__store_deactivate(f->s.st, MODEL, &was, &err);
        int calls = g_calls;
        tv__sys_reset();
        int64_t now = agreed_active(f, MODEL);
        if (rc) {
            n_failed++;
            assert_int_equal(now, before); /* an error changes neither */
            assert_non_null(strstr(err.msg, "Input/output error"));
            assert_int_equal(tv__snapfile_read_pointer(f->s.store, MODEL, &g, &from, &err), 0);
            assert_int_equal(from, from_before);
            assert_false(moved_pointer_exists(f, MODEL));
            int fd;
            void *buf;
            size_t len;
            int64_t opened = 0;
            assert_int_equal(
                tv__snapfile_open_gen(f->s.store, MODEL, 0, &opened, &fd, &buf, &len, &err), 0);
            assert_int_equal(opened, before);
            tv__snapfile_unmap(buf, len);
            close(fd);
        } else {
            assert_int_equal(now, 0);
            assert_int_equal(was, before);
            if (moved_pointer_exists(f, MODEL)) { /* its unlink or fsync failed: logged */
                n_left++;
                assert_int_equal(tv__store_sync_snapshots(f->s.st, &err), 0);
                assert_false(moved_pointer_exists(f, MODEL));
                assert_int_equal(agreed_active(f, MODEL), 0);
            }
            /* back to an active generation for the next run */
            assert_int_equal(tv__store_activate(f->s.st, MODEL, before == 1 ? 2 : 1, &err), 0);
        }
        if (calls < k) { /* no call left to fail: this deactivation is done */
            assert_int_equal(rc, 0);
            assert_false(moved_pointer_exists(f, MODEL));
            n_moves++;
            k = 0;
        }
    }
    assert_int_equal(n_moves, 2);
    assert_true(n_failed >= 4); /* the rename and the fsync after it, twice */
    assert_true(n_left >= 2);   /* the clean-up's unlink, twice */
}

/* A writer killed at each crash point of deactivate: what readers saw
 * before the repair (no active generation) is what the registry says after
 * it; the moved pointer is gone. Also the repair of lost, stray and
 * leftover pointers around deactivation. */
static void deactivate_crash_child(fixture *f, const char *point)
{
    tv__store_close(f->s.st);
    f->s.st = NULL;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        tv__store *st;
        tv_error err = {0};
        if (tv__store_open(f->s.store, TV__STORE_WRITE, &st, &err))
            _exit(3);
        g_crash_at = point;
        tv__sys_crash_hook = crash_hook;
        int rc = tv__store_deactivate(st, MODEL, NULL, &err);
        _exit(rc ? 4 : 5);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 42);
}

static void test_deactivate_crash_points(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    assert_int_equal(import(f, f->ck_a), 1);
    assert_int_equal(import(f, f->ck_b), 2);
    static const char *const points[] = {"deactivate.pointer", "deactivate.commit"};
    for (size_t i = 0; i < TV_ARRAY_LEN(points); i++) {
        int64_t before = agreed_active(f, MODEL);
        assert_true(before > 0);
        deactivate_crash_child(f, points[i]);
        /* Before any writer runs: readers see none already, and read-only
         * commands report what the next writer settles. */
        tv_model *m = NULL;
        assert_int_equal(open_spec(f, MODEL, &m, &err), TV_E_NOT_FOUND);
        assert_int_equal(settled_active(f, MODEL), 0);
        if (tv__store_open(f->s.store, TV__STORE_WRITE, &f->s.st, &err))
            fail_msg("reopen: %s", err.msg);
        if (agreed_active(f, MODEL) != 0)
            fail_msg("crash at %s: still active", points[i]);
        assert_false(moved_pointer_exists(f, MODEL));
        assert_int_equal(tv__store_activate(f->s.st, MODEL, before == 1 ? 2 : 1, &err), 0);
    }
    int64_t cur = agreed_active(f, MODEL);
    char p[TV__SNAPFILE_PATH_MAX], d[TV__SNAPFILE_PATH_MAX + 32];
    assert_int_equal(tv__snapfile_active_path(f->s.store, MODEL, p, sizeof p, &err), 0);
    assert_int_equal(tv__snapfile_model_dir(f->s.store, MODEL, d, sizeof d, &err), 0);
    strcat(d, "/" TV__SNAPFILE_DEACTIVATED);
    /* a lost pointer (no moved one): the registry wins, the pointer is back */
    assert_int_equal(unlink(p), 0);
    assert_int_equal(settled_active(f, MODEL), cur);
    assert_int_equal(tv__store_sync_snapshots(f->s.st, &err), 0);
    assert_int_equal(agreed_active(f, MODEL), cur);
    /* a leftover moved pointer next to the pointer: removed, nothing else */
    tv_test_write_text(d, cur == 1 ? "1\n" : "2\n");
    assert_int_equal(settled_active(f, MODEL), cur);
    assert_int_equal(tv__store_sync_snapshots(f->s.st, &err), 0);
    assert_false(moved_pointer_exists(f, MODEL));
    assert_int_equal(agreed_active(f, MODEL), cur);
    /* no pointer, and a moved one naming another generation (or garbage):
     * not an interrupted deactivation; the registry wins */
    static const char *const junk[] = {"junk", NULL};
    for (int i = 0; i < 2; i++) {
        assert_int_equal(unlink(p), 0);
        tv_test_write_text(d, junk[i] ? junk[i] : cur == 1 ? "2\nfrom 1\n" : "1\nfrom 2\n");
        assert_int_equal(settled_active(f, MODEL), cur);
        assert_int_equal(tv__store_sync_snapshots(f->s.st, &err), 0);
        assert_false(moved_pointer_exists(f, MODEL));
        assert_int_equal(agreed_active(f, MODEL), cur);
    }
    /* the same as the crash leaves it, made by hand: completed */
    assert_int_equal(rename(p, d), 0);
    assert_int_equal(settled_active(f, MODEL), 0);
    assert_int_equal(tv__store_sync_snapshots(f->s.st, &err), 0);
    assert_false(moved_pointer_exists(f, MODEL));
    assert_int_equal(agreed_active(f, MODEL), 0);
    /* and then the model can be deleted */
    if (tv__store_model_delete(f->s.st, MODEL, NULL, NULL, &err))
        fail_msg("model delete: %s", err.msg);
}

static void test_store_gc(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    assert_int_equal(import(f, f->ck_a), 1);
    assert_int_equal(import(f, f->ck_b), 2);
    size_t n = 9;
    uint64_t bytes = 9;
    assert_int_equal(tv__store_gc(f->s.st, &n, &bytes, &err), 0);
    assert_int_equal(n, 0);
    assert_int_equal(bytes, 0);
    assert_int_equal(tv__reg_generation_retire(f->s.st->reg, MODEL, 1, &err), 0);
    /* a reader of generation 1 keeps its objects */
    int fd;
    void *buf;
    size_t len;
    assert_int_equal(tv__snapfile_open(f->s.store, MODEL, 1, &fd, &buf, &len, &err), 0);
    tv__snapfile_unmap(buf, len);
    assert_int_equal(tv__store_gc(f->s.st, &n, &bytes, &err), 0);
    assert_int_equal(n, 0);
    assert_true(snap_exists(f, MODEL, 1));
    close(fd);
    assert_int_equal(tv__store_gc(f->s.st, &n, &bytes, &err), 0);
    assert_int_equal(n, 4); /* 2 shards x 2 replicas */
    assert_true(bytes >= 4 * 65536);
    assert_false(snap_exists(f, MODEL, 1));
    /* a reader store cannot gc */
    tv__store *rd = NULL;
    assert_int_equal(tv__store_open(f->s.store, 0, &rd, &err), 0);
    assert_int_equal(tv__store_gc(rd, &n, &bytes, &err), TV_E_INVALID_ARG);
    tv__store_close(rd);
}

static void test_store_model_delete(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    tv__import_opts o = {.activate = false, .devices = f->s.dev, .n_devices = 2};
    tv__import_result res;
    assert_int_equal(tv__import(f->s.st, "doomed", f->ck_a, &o, &res, &err), 0);
    assert_int_equal(tv__import(f->s.st, "doomed", f->ck_b, &o, &res, &err), 0);
    assert_int_equal(import(f, f->ck_b), 1); /* MODEL shares ck_b's objects (dedup) */
    assert_int_equal(tv__store_write_snapshot(f->s.st, "doomed", 1, &err), 0);
    assert_int_equal(tv__store_alias_set(f->s.st, "doomed", "prod", 2, &err), 0);
    size_t n_ret = 0;
    uint64_t freed = 0;
    /* aliased: refused, nothing changed */
    assert_int_equal(tv__store_model_delete(f->s.st, "doomed", &n_ret, &freed, &err), TV_E_STATE);
    assert_true(snap_exists(f, "doomed", 1));
    assert_int_equal(tv__store_alias_remove(f->s.st, "doomed", "prod", NULL, &err), 0);
    /* a reader holds a snapshot: refused, nothing changed */
    int fd;
    void *buf;
    size_t len;
    assert_int_equal(tv__snapfile_open(f->s.store, "doomed", 1, &fd, &buf, &len, &err), 0);
    tv__snapfile_unmap(buf, len);
    assert_int_equal(tv__store_model_delete(f->s.st, "doomed", &n_ret, &freed, &err), TV_E_LEASED);
    assert_true(snap_exists(f, "doomed", 1));
    close(fd);
    assert_int_equal(tv__store_model_delete(f->s.st, "doomed", &n_ret, &freed, &err), 0);
    assert_int_equal(n_ret, 2);
    assert_true(freed >= 4 * 65536); /* ck_a's two shards on two devices; ck_b's stay */
    tv__reg_model m;
    assert_int_equal(tv__reg_model_get(f->s.st->reg, "doomed", &m, &err), TV_E_NOT_FOUND);
    char md[TV__SNAPFILE_PATH_MAX];
    struct stat sb;
    assert_int_equal(tv__snapfile_model_dir(f->s.store, "doomed", md, sizeof md, &err), 0);
    assert_int_equal(lstat(md, &sb), -1);
    assert_int_equal(errno, ENOENT);
    assert_int_equal(tv__store_model_delete(f->s.st, "doomed", NULL, NULL, &err), TV_E_NOT_FOUND);
    /* the other model is intact; the active one cannot be deleted */
    assert_int_equal(agreed_active(f, MODEL), 1);
    assert_int_equal(tv__store_model_delete(f->s.st, MODEL, NULL, NULL, &err), TV_E_STATE);
    int64_t opened = 0;
    assert_int_equal(tv__snapfile_open_gen(f->s.store, MODEL, 0, &opened, &fd, &buf, &len, &err),
                     0);
    tv__snapfile_unmap(buf, len);
    close(fd);
    assert_int_equal(opened, 1);
    /* the name can be used again, from generation 1 */
    assert_int_equal(tv__import(f->s.st, "doomed", f->ck_a, &o, &res, &err), 0);
    assert_int_equal(res.generation, 1);
}

static void test_store_worker(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    tv__store *w1 = NULL, *w2 = NULL, *rd = NULL;
    assert_int_equal(tv__store_open_worker(f->s.st, &w1, &err), 0);
    assert_int_equal(tv__store_open_worker(f->s.st, &w2, &err), 0);
    assert_ptr_not_equal(w1->reg, f->s.st->reg);
    /* a worker imports and activates like the writer */
    tv__import_opts o = {.activate = true, .devices = f->s.dev, .n_devices = 2};
    tv__import_result res;
    if (tv__import(w1, MODEL, f->ck_a, &o, &res, &err))
        fail_msg("import through a worker: %s", err.msg);
    assert_int_equal(res.generation, 1);
    if (tv__import(w2, "other", f->ck_b, &o, &res, &err))
        fail_msg("import through a worker: %s", err.msg);
    assert_int_equal(agreed_active(f, MODEL), 1);
    assert_int_equal(agreed_active(f, "other"), 1);
    /* closing a worker leaves the writer's lock */
    tv__store_close(w1);
    tv__store *second = NULL;
    assert_int_equal(tv__store_open(f->s.store, TV__STORE_WRITE, &second, &err), TV_E_LOCKED);
    assert_null(second);
    assert_int_equal(tv__store_alias_set(w2, MODEL, "prod", 1, &err), 0);
    assert_int_equal(agreed_alias(f, MODEL, "prod"), 1);
    tv__store_close(w2);
    assert_int_equal(tv__store_open(f->s.store, TV__STORE_WRITE, &second, &err), TV_E_LOCKED);
    /* a reader store has no workers */
    assert_int_equal(tv__store_open(f->s.store, 0, &rd, &err), 0);
    assert_int_equal(tv__store_open_worker(rd, &w1, &err), TV_E_INVALID_ARG);
    assert_null(w1);
    tv__store_close(rd);
    /* once the writer closes, the lock is free */
    tv__store_close(f->s.st);
    f->s.st = NULL;
    assert_int_equal(tv__store_open(f->s.store, TV__STORE_WRITE, &f->s.st, &err), 0);
}

/* Two workers moving the active generation and an alias at the same time:
 * every call succeeds or fails cleanly, and registry and pointers agree
 * afterwards. */
typedef struct worker_arg {
    tv__store *st;
    int64_t first;
    int n_errors;
} worker_arg;

static void *worker_loop(void *p)
{
    worker_arg *a = p;
    for (int i = 0; i < 20; i++) {
        tv_error err = {0};
        int64_t g = (a->first + i) % 2 + 1;
        if (tv__store_activate(a->st, MODEL, g, &err) ||
            tv__store_alias_set(a->st, MODEL, "prod", 3 - g, &err))
            a->n_errors++;
    }
    return NULL;
}

static void test_workers_concurrent(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    assert_int_equal(import(f, f->ck_a), 1);
    assert_int_equal(import(f, f->ck_b), 2);
    worker_arg a[2] = {{NULL, 0, 0}, {NULL, 1, 0}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(tv__store_open_worker(f->s.st, &a[i].st, &err), 0);
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&th[i], NULL, worker_loop, &a[i]), 0);
    for (int i = 0; i < 2; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(a[i].n_errors, 0);
        tv__store_close(a[i].st);
    }
    int64_t act = agreed_active(f, MODEL), prod = agreed_alias(f, MODEL, "prod");
    assert_true(act == 1 || act == 2);
    assert_true(prod == 1 || prod == 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_matches_registry, setup, teardown),
        cmocka_unit_test_setup_teardown(test_existing_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_old_version_rebuilt, setup, teardown),
        cmocka_unit_test_setup_teardown(test_active_gc_sync, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gc_shared_objects, setup, teardown),
        cmocka_unit_test_setup_teardown(test_activate_faults, setup, teardown),
        cmocka_unit_test_setup_teardown(test_import_faults, setup, teardown),
        cmocka_unit_test_setup_teardown(test_activate_crash_points, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stale_pointer_repaired, setup, teardown),
        cmocka_unit_test_setup_teardown(test_writer_cost, setup, teardown),
        cmocka_unit_test_setup_teardown(test_alias_faults, setup, teardown),
        cmocka_unit_test_setup_teardown(test_alias_crash_points, setup, teardown),
        cmocka_unit_test_setup_teardown(test_deactivate, setup, teardown),
        cmocka_unit_test_setup_teardown(test_deactivate_faults, setup, teardown),
        cmocka_unit_test_setup_teardown(test_deactivate_crash_points, setup, teardown),
        cmocka_unit_test_setup_teardown(test_store_gc, setup, teardown),
        cmocka_unit_test_setup_teardown(test_store_model_delete, setup, teardown),
        cmocka_unit_test_setup_teardown(test_store_worker, setup, teardown),
        cmocka_unit_test_setup_teardown(test_workers_concurrent, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
