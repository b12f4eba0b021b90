/* Unit tests of snapshot files built from the registry
 * (server/import/snapbuild.c): a store on two file images, a generated
 * two-shard checkpoint (rank 0 and zero-size tensors included) imported
 * with one replica per device, then every snapshot field is checked
 * against the registry manifest and device rows, and the bytes each record
 * points at are read back from both images and compared with the source
 * files. Also: an existing valid file is kept, a corrupt one replaced
 * (unless a reader holds it), gc's lease check and removal, crash repair
 * (tv__store_sync_snapshots) and the active pointer. */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "dev/dev.h"
#include "import/import.h"
#include "import/snapbuild.h"
#include "import/store.h"
#include "registry/registry.h"
#include "store/snapfile.h"
#include "store/snapshot.h"

#define MiB   (1024ull * 1024ull)
#define MODEL "org/tiny-model"

typedef struct fixture {
    char dir[128];
    char store[256];
    char image[2][256];
    char ck_a[512]; /* index of the two-shard checkpoint */
    char ck_b[512]; /* a single-file checkpoint with other bytes */
    tv__store *st;
    int64_t dev[2];
} fixture;

/* ---- checkpoint writer ------------------------------------------------------ */

typedef struct tdesc {
    const char *name;
    const char *dtype;
    const char *shape; /* JSON list */
    uint64_t nbytes;
} tdesc;

static uint64_t write_shard(const char *path, const tdesc *t, size_t n, unsigned seed)
{
    char hdr[4096];
    size_t hl = 0;
    uint64_t off = 0;
    hl += (size_t)snprintf(hdr + hl, sizeof hdr - hl, "{");
    for (size_t i = 0; i < n; i++) {
        hl += (size_t)snprintf(
            hdr + hl, sizeof hdr - hl,
            "%s\"%s\":{\"dtype\":\"%s\",\"shape\":%s,\"data_offsets\":[%llu,%llu]}", i ? "," : "",
            t[i].name, t[i].dtype, t[i].shape, (unsigned long long)off,
            (unsigned long long)(off + t[i].nbytes));
        off += t[i].nbytes;
    }
    hl += (size_t)snprintf(hdr + hl, sizeof hdr - hl, "}");
    while (hl % 8)
        hdr[hl++] = ' ';
    assert_true(hl < sizeof hdr);
    uint64_t file_len = 8 + hl + off;
    uint8_t *buf = malloc(file_len);
    assert_non_null(buf);
    for (int i = 0; i < 8; i++)
        buf[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(buf + 8, hdr, hl);
    for (uint64_t i = 0; i < off; i++)
        buf[8 + hl + i] = (uint8_t)(i * 131u + seed * 7u + 1);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, buf, file_len), (ssize_t)file_len);
    close(fd);
    free(buf);
    return file_len;
}

static void write_text(const char *path, const char *text)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
}

static const tdesc SHARD1[] = {
    {"layers.0.w", "F32", "[10,20]", 800},
    {"layers.0.b", "U8", "[13]", 13},
    {"scalar", "I64", "[]", 8},
    {"empty", "F16", "[0,4]", 0},
};
static const tdesc SHARD2[] = {{"head.w", "BF16", "[5,7]", 70}};
static const tdesc SINGLE[] = {{"emb", "U8", "[100]", 100}, {"emb.scale", "F32", "[]", 4}};

static const char INDEX[] = "{\"metadata\":{\"total_size\":891},\"weight_map\":{"
                            "\"layers.0.w\":\"model-00001-of-00002.safetensors\","
                            "\"layers.0.b\":\"model-00001-of-00002.safetensors\","
                            "\"scalar\":\"model-00001-of-00002.safetensors\","
                            "\"empty\":\"model-00001-of-00002.safetensors\","
                            "\"head.w\":\"model-00002-of-00002.safetensors\"}}";

static int rm_entry(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
    (void)sb, (void)type, (void)ftw;
    remove(path);
    return 0;
}

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    assert_non_null(f);
    const char *tmp = getenv("TMPDIR");
    snprintf(f->dir, sizeof f->dir, "%s/tv-test-snapbuild-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    assert_non_null(mkdtemp(f->dir));
    snprintf(f->store, sizeof f->store, "%s/store", f->dir);
    char d[256], p[384];
    snprintf(d, sizeof d, "%s/ck", f->dir);
    assert_int_equal(mkdir(d, 0700), 0);
    snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", d);
    write_shard(p, SHARD1, TV_ARRAY_LEN(SHARD1), 1);
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", d);
    write_shard(p, SHARD2, TV_ARRAY_LEN(SHARD2), 2);
    snprintf(f->ck_a, sizeof f->ck_a, "%s/model.safetensors.index.json", d);
    write_text(f->ck_a, INDEX);
    snprintf(f->ck_b, sizeof f->ck_b, "%s/single.safetensors", f->dir);
    write_shard(f->ck_b, SINGLE, TV_ARRAY_LEN(SINGLE), 5);

    tv_error err = {0};
    for (int i = 0; i < 2; i++) {
        snprintf(f->image[i], sizeof f->image[i], "%s/image%d", f->dir, i);
        tv__store_init_opts o = {.image = f->image[i], .image_size = 16 * MiB};
        if (tv__store_init(f->store, &o, &f->dev[i], &err))
            fail_msg("store init: %s", err.msg);
    }
    if (tv__store_open(f->store, TV__STORE_WRITE, &f->st, &err))
        fail_msg("store open: %s", err.msg);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    tv__store_close(f->st);
    nftw(f->dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    free(f);
    return 0;
}

static int64_t import(fixture *f, const char *src)
{
    tv__import_opts o = {.activate = true, .strict = true, .devices = f->dev, .n_devices = 2};
    tv__import_result res;
    tv_error err = {0};
    if (tv__import(f->st, MODEL, src, &o, &res, &err))
        fail_msg("import %s: %s", src, err.msg);
    return res.generation;
}

static void write_snapshot(fixture *f, int64_t gen)
{
    tv_error err = {0};
    if (tv__store_write_snapshot(f->st, MODEL, gen, &err))
        fail_msg("write snapshot %lld: %s", (long long)gen, err.msg);
    if (tv__store_write_active(f->st, MODEL, &err))
        fail_msg("write active: %s", err.msg);
}

static bool snap_exists(fixture *f, const char *model, int64_t gen)
{
    bool ex = false;
    assert_int_equal(tv__snapfile_exists(f->store, model, gen, &ex, NULL), 0);
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
    assert_int_equal(tv__snapfile_read_active(f->store, MODEL, &active, &err), 0);
    assert_int_equal(active, 1);
    int fd = -1;
    void *buf = NULL;
    size_t len = 0;
    assert_int_equal(tv__snapfile_open(f->store, MODEL, 0, &fd, &buf, &len, &err), 0);
    tv__snap s;
    if (tv__snap_open(buf, len, TV__SNAP_VERIFY_CHECKSUM, &s, &err))
        fail_msg("snap open: %s", err.msg);

    tv__reg_generation g;
    tv__reg_manifest *m = NULL;
    assert_int_equal(tv__reg_generation_get(f->st->reg, MODEL, 1, &g, &err), 0);
    assert_int_equal(tv__reg_tensors_list(f->st->reg, g.id, &m, &err), 0);

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
            assert_int_equal(tv__reg_device_get(f->st->reg, mr->device_id, &row, &err), 0);
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
        snprintf(src, sizeof src, "%s/ck/%.*s", f->dir, (int)sh.name_len, sh.name);
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
    assert_int_equal(tv__store_build_snapshot(f->st, MODEL, 1, &b2, &l2, &err), 0);
    assert_int_equal(l2, len);
    free(b2);

    tv__reg_manifest_free(m);
    free(buf);
    close(fd);
}

/* The file's bytes (a rebuild draws a new hash seed, so equal bytes mean the
 * file was kept). */
static void *file_bytes(fixture *f, int64_t gen, size_t *len)
{
    int fd = -1;
    void *buf = NULL;
    tv_error err = {0};
    if (tv__snapfile_open(f->store, MODEL, gen, &fd, &buf, len, &err))
        fail_msg("open: %s", err.msg);
    close(fd);
    return buf;
}

static void corrupt(fixture *f, int64_t gen)
{
    char p[TV__SNAPFILE_PATH_MAX];
    assert_int_equal(tv__snapfile_path(f->store, MODEL, gen, p, sizeof p, NULL), 0);
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
    assert_int_equal(tv__store_write_snapshot(f->st, MODEL, 1, &err), 0);
    void *b = file_bytes(f, 1, &lb);
    assert_int_equal(la, lb);
    assert_memory_equal(a, b, la);
    free(b);

    /* Corrupt: replaced by a valid one (with a new hash seed). */
    corrupt(f, 1);
    assert_int_equal(tv__store_write_snapshot(f->st, MODEL, 1, &err), 0);
    b = file_bytes(f, 1, &lb);
    assert_int_equal(la, lb);
    assert_memory_not_equal(a, b, la);
    free(a);
    free(b);
    int fd;
    void *buf;
    size_t len;
    tv__snap s;
    assert_int_equal(tv__snapfile_open(f->store, MODEL, 1, &fd, &buf, &len, &err), 0);
    assert_int_equal(tv__snap_open(buf, len, TV__SNAP_VERIFY_CHECKSUM, &s, &err), 0);
    free(buf);

    /* Corrupt while a reader holds it: left alone, TV_E_LEASED. */
    corrupt(f, 1);
    assert_int_equal(tv__store_write_snapshot(f->st, MODEL, 1, &err), TV_E_LEASED);
    close(fd);
    assert_int_equal(tv__store_write_snapshot(f->st, MODEL, 1, &err), 0);

    /* Generations without snapshots. */
    void *img = NULL;
    assert_int_equal(tv__store_build_snapshot(f->st, "no-such-model", 0, &img, &len, &err),
                     TV_E_NOT_FOUND);
    assert_int_equal(tv__store_build_snapshot(f->st, MODEL, 9, &img, &len, &err), TV_E_NOT_FOUND);
    tv__reg_generation g;
    assert_int_equal(tv__reg_generation_create(f->st->reg, "other", "/nowhere", 0, &g, &err), 0);
    assert_int_equal(tv__store_build_snapshot(f->st, "other", g.number, &img, &len, &err),
                     TV_E_STATE);
    assert_int_equal(tv__store_write_snapshot(f->st, "other", g.number, &err), TV_E_STATE);
    assert_false(snap_exists(f, "other", g.number));
    /* No active generation: no pointer (and none for an unknown model). */
    assert_int_equal(tv__store_write_active(f->st, "other", &err), 0);
    int64_t active;
    assert_int_equal(tv__snapfile_read_active(f->store, "other", &active, &err), TV_E_NOT_FOUND);
    assert_int_equal(tv__store_write_active(f->st, "ghost", &err), 0);
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
    assert_int_equal(tv__snapfile_read_active(f->store, MODEL, &active, &err), 0);
    assert_int_equal(active, 2);

    /* Rollback: the pointer follows the registry. */
    assert_int_equal(tv__reg_generation_activate(f->st->reg, MODEL, 1, &err), 0);
    assert_int_equal(tv__store_write_active(f->st, MODEL, &err), 0);
    assert_int_equal(tv__snapfile_read_active(f->store, MODEL, &active, &err), 0);
    assert_int_equal(active, 1);
    assert_int_equal(tv__reg_generation_activate(f->st->reg, MODEL, 2, &err), 0);
    assert_int_equal(tv__store_write_active(f->st, MODEL, &err), 0);
    assert_int_equal(tv__reg_generation_retire(f->st->reg, MODEL, 1, &err), 0);

    /* gc: a reader of generation 1 keeps its snapshot. */
    int fd;
    void *buf;
    size_t len;
    assert_int_equal(tv__snapfile_open(f->store, MODEL, 1, &fd, &buf, &len, &err), 0);
    free(buf);
    assert_int_equal(tv__store_snapshot_leased(f->st, MODEL, 1, &leased, &err), 0);
    assert_true(leased);
    assert_int_equal(tv__store_remove_snapshot(f->st, MODEL, 1, &err), TV_E_LEASED);
    assert_true(snap_exists(f, MODEL, 1));
    close(fd);
    assert_int_equal(tv__store_snapshot_leased(f->st, MODEL, 1, &leased, &err), 0);
    assert_false(leased);
    assert_int_equal(tv__store_snapshot_leased(f->st, MODEL, 2, &leased, &err), 0);
    assert_false(leased);

    /* Crash repair: missing files and pointer come back, temporaries go. */
    char p[TV__SNAPFILE_PATH_MAX], md[TV__SNAPFILE_PATH_MAX], tmp[TV__SNAPFILE_PATH_MAX + 32];
    assert_int_equal(tv__snapfile_path(f->store, MODEL, 2, p, sizeof p, &err), 0);
    assert_int_equal(unlink(p), 0);
    assert_int_equal(tv__snapfile_write_active(f->store, MODEL, 0, &err), 0);
    assert_int_equal(tv__snapfile_model_dir(f->store, MODEL, md, sizeof md, &err), 0);
    snprintf(tmp, sizeof tmp, "%s/.tmp-2-999-0", md);
    write_text(tmp, "partial");
    if (tv__store_sync_snapshots(f->st, &err))
        fail_msg("sync: %s", err.msg);
    assert_true(snap_exists(f, MODEL, 2));
    assert_true(snap_exists(f, MODEL, 1)); /* retired: kept as it was (never rebuilt) */
    assert_false(access(tmp, F_OK) == 0);
    assert_int_equal(tv__snapfile_read_active(f->store, MODEL, &active, &err), 0);
    assert_int_equal(active, 2);

    /* gc proper: a reader of generation 1 keeps all its objects... */
    tv__reg_object *objs = NULL;
    size_t n = 0;
    bool keep[8] = {false};
    assert_int_equal(tv__reg_objects_unreferenced(f->st->reg, &objs, &n, &err), 0);
    assert_int_equal(n, 4); /* 2 shards x 2 replicas of generation 1 */
    assert_int_equal(tv__snapfile_open(f->store, MODEL, 1, &fd, &buf, &len, &err), 0);
    free(buf);
    assert_int_equal(tv__store_gc_snapshots(f->st, objs, n, keep, &err), 0);
    for (size_t i = 0; i < n; i++)
        assert_true(keep[i]);
    assert_true(snap_exists(f, MODEL, 1));
    close(fd);
    /* ...and once it is gone the snapshot goes first, then the objects;
     * sync no longer brings generation 1 back. */
    memset(keep, 0, sizeof keep);
    assert_int_equal(tv__store_gc_snapshots(f->st, objs, n, keep, &err), 0);
    for (size_t i = 0; i < n; i++)
        assert_false(keep[i]);
    assert_false(snap_exists(f, MODEL, 1));
    assert_true(snap_exists(f, MODEL, 2));
    for (size_t i = 0; i < n; i++)
        assert_int_equal(tv__reg_object_delete(f->st->reg, objs[i].id, &err), 0);
    free(objs);
    assert_int_equal(tv__store_gc_snapshots(f->st, NULL, 0, NULL, &err), 0);
    if (tv__store_sync_snapshots(f->st, &err))
        fail_msg("sync: %s", err.msg);
    assert_false(snap_exists(f, MODEL, 1));
    assert_int_equal(tv__store_write_snapshot(f->st, MODEL, 1, &err), TV_E_STATE);
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
    assert_int_equal(tv__reg_generation_retire(f->st->reg, MODEL, 1, &err), 0);
    tv__reg_object *objs = NULL;
    size_t n = 9;
    assert_int_equal(tv__reg_objects_unreferenced(f->st->reg, &objs, &n, &err), 0);
    assert_int_equal(n, 0);
    assert_int_equal(tv__store_gc_snapshots(f->st, objs, n, NULL, &err), 0);
    assert_true(snap_exists(f, MODEL, 1));
    free(objs);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_matches_registry, setup, teardown),
        cmocka_unit_test_setup_teardown(test_existing_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_active_gc_sync, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gc_shared_objects, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
