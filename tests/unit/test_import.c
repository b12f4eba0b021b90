/* Unit tests of the importer (server/import/import.c) on a file image: a
 * clean sharded import, then every failure of DESIGN section 3 injected
 * through the tv__sys table (device pwrite EIO / ENOSPC / short write,
 * fdatasync EIO / ENOSPC, source pread EIO, a source truncated, grown or
 * rewritten after validation, on the write and on the dedup path, a full
 * region, a refused publish, a corrupted strict read-back) and
 * deduplication.
 *
 * Invariant checked after every failure: the expected code comes back, no
 * generation is published (or the previously active one is unchanged), no
 * 'writing' reservation is left, and a clean import afterwards succeeds.
 * Every test gets its own store and checkpoints in a fresh temporary
 * directory; the syscall table is restored after each case. */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
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
#include "import/store.h"
#include "registry/registry.h"
#include "util/sys.h"

#define KiB   1024ull
#define MiB   (1024ull * 1024ull)
#define CHUNK (64 * KiB) /* import chunk: shard 1 of the sharded checkpoint spans 4 */
#define OA    (64 * KiB) /* object_align of a file image */
#define MODEL "m"

typedef struct fixture {
    char dir[128];
    char store[512];
    char image[512];
    char sharded[512];  /* model.safetensors.index.json of a 2-shard checkpoint */
    char sharded2[512]; /* same shard 2 as sharded, different shard 1 */
    char single[512];   /* one-file checkpoint, 3 chunks */
    char shard1[512], shard2[512];
    uint64_t shard1_len, shard2_len, single_len;
    tv__store *st;
    int64_t dev;
} fixture;

/* ---- checkpoint writer ---------------------------------------------------- */

typedef struct tdesc {
    const char *name;
    const char *dtype;
    uint64_t n_elems;
    unsigned elem_len;
} tdesc;

/* Writes a safetensors file: 8-byte LE header length, JSON header padded
 * with spaces to a multiple of 8, then the tensors back to back filled with
 * a pattern that depends on seed. Returns the file length. */
static uint64_t write_shard(const char *path, const tdesc *t, size_t n, unsigned seed)
{
    char hdr[4096];
    size_t hl = 0;
    uint64_t off = 0;
    hl += (size_t)snprintf(hdr + hl, sizeof hdr - hl, "{");
    for (size_t i = 0; i < n; i++) {
        uint64_t len = t[i].n_elems * t[i].elem_len;
        hl +=
            (size_t)snprintf(hdr + hl, sizeof hdr - hl,
                             "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[%llu],"
                             "\"data_offsets\":[%llu,%llu]}",
                             i ? "," : "", t[i].name, t[i].dtype, (unsigned long long)t[i].n_elems,
                             (unsigned long long)off, (unsigned long long)(off + len));
        off += len;
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
        buf[8 + hl + i] = (uint8_t)(i * 131u + seed * 7u + (i >> 12));
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
    {"layers.0.w", "F32", 50000, 4}, /* 200000 bytes: 4 chunks of 64 KiB */
    {"layers.0.b", "U8", 13, 1},     /* odd length: unaligned end */
};
static const tdesc SHARD2[] = {{"head.w", "BF16", 5000, 2}};
static const tdesc SINGLE[] = {{"emb.x", "U8", 150000, 1}, {"emb.y", "I64", 3, 8}};

static const char INDEX_FMT[] = "{\"metadata\":{\"total_size\":%llu},\"weight_map\":{"
                                "\"layers.0.w\":\"model-00001-of-00002.safetensors\","
                                "\"layers.0.b\":\"model-00001-of-00002.safetensors\","
                                "\"head.w\":\"model-00002-of-00002.safetensors\"}}";

static void make_sharded(fixture *f, const char *sub, unsigned seed1, char *index_out,
                         size_t index_len)
{
    char d[256], p[384], idx[512];
    snprintf(d, sizeof d, "%s/%s", f->dir, sub);
    assert_int_equal(mkdir(d, 0700), 0);
    snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", d);
    f->shard1_len = write_shard(p, SHARD1, 2, seed1);
    if (seed1 == 1)
        snprintf(f->shard1, sizeof f->shard1, "%s", p);
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", d);
    f->shard2_len = write_shard(p, SHARD2, 1, 2);
    if (seed1 == 1)
        snprintf(f->shard2, sizeof f->shard2, "%s", p);
    snprintf(idx, sizeof idx, INDEX_FMT, (unsigned long long)(200013 + 10000));
    snprintf(index_out, index_len, "%s/model.safetensors.index.json", d);
    write_text(index_out, idx);
}

/* ---- fault injection ------------------------------------------------------- */

static int g_dev_fd = -1;  /* the store device: everything else is a source */
static atomic_int g_calls; /* hooked calls so far */
static int g_fail_at;      /* 1-based call that fails */
static int g_errno;        /* errno it fails with */
static char g_src[512];    /* source file the pread hooks tamper with */
static off_t g_new_len;    /* truncate / extend target */

static void hooks_reset(void)
{
    tv__sys_reset();
    atomic_store(&g_calls, 0);
    g_fail_at = 0;
    g_errno = 0;
}

static ssize_t pwrite_fail_nth(int fd, const void *buf, size_t len, off_t off)
{
    /* Only device writes count: snapshot files are written after publish. */
    if (fd != g_dev_fd)
        return pwrite(fd, buf, len, off);
    if (atomic_fetch_add(&g_calls, 1) + 1 == g_fail_at) {
        errno = g_errno;
        return -1;
    }
    return pwrite(fd, buf, len, off);
}

/* The device takes half of the first write, then fails: the device layer
 * loops over the short write and must report the EIO. */
static ssize_t pwrite_short_then_eio(int fd, const void *buf, size_t len, off_t off)
{
    if (atomic_fetch_add(&g_calls, 1) == 0 && len >= 8192) {
        size_t half = len / 2 / 4096 * 4096;
        return pwrite(fd, buf, half, off);
    }
    errno = EIO;
    return -1;
}

static int fdatasync_fail(int fd)
{
    (void)fd;
    atomic_fetch_add(&g_calls, 1);
    errno = g_errno;
    return -1;
}

static ssize_t pread_source_eio(int fd, void *buf, size_t len, off_t off)
{
    if (fd != g_dev_fd) {
        atomic_fetch_add(&g_calls, 1);
        errno = EIO;
        return -1;
    }
    return pread(fd, buf, len, off);
}

/* First source read: resize the file behind the importer's back. */
static ssize_t pread_resize_source(int fd, void *buf, size_t len, off_t off)
{
    if (fd != g_dev_fd && atomic_fetch_add(&g_calls, 1) == 0)
        assert_int_equal(truncate(g_src, g_new_len), 0);
    return pread(fd, buf, len, off);
}

/* First source read: rewrite the quoted tensor name g_old as g_new (same
 * length, so the header keeps its length and stays valid). */
static const char *g_old, *g_new;

static ssize_t pread_rewrite_header(int fd, void *buf, size_t len, off_t off)
{
    /* len > 4096: skip the checkpoint parser's header reads (validation). */
    if (fd != g_dev_fd && len > 4096 && atomic_fetch_add(&g_calls, 1) == 0) {
        char hdr[512], quoted[64];
        int wfd = open(g_src, O_RDWR | O_CLOEXEC);
        assert_true(wfd >= 0);
        ssize_t n = pread(wfd, hdr, sizeof hdr, 0);
        assert_true(n > 16);
        int ql = snprintf(quoted, sizeof quoted, "\"%s\"", g_old);
        char *name = memmem(hdr + 8, (size_t)n - 8, quoted, (size_t)ql);
        assert_non_null(name);
        assert_int_equal(strlen(g_new), strlen(g_old));
        memcpy(name + 1, g_new, strlen(g_new));
        assert_int_equal(pwrite(wfd, name, (size_t)ql, name - hdr), ql);
        close(wfd);
    }
    return pread(fd, buf, len, off);
}

/* Device reads (the strict read-back): flip one payload bit of the first. */
static ssize_t pread_flip_device(int fd, void *buf, size_t len, off_t off)
{
    ssize_t n = pread(fd, buf, len, off);
    if (fd == g_dev_fd && n > 100 && atomic_fetch_add(&g_calls, 1) == 0)
        ((uint8_t *)buf)[100] ^= 0x10;
    return n;
}

/* ---- fixture ----------------------------------------------------------------- */

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
    snprintf(f->dir, sizeof f->dir, "%s/tv-test-import-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    assert_non_null(mkdtemp(f->dir));
    snprintf(f->store, sizeof f->store, "%s/store", f->dir);
    snprintf(f->image, sizeof f->image, "%s/image", f->dir);
    make_sharded(f, "ck2", 3, f->sharded2, sizeof f->sharded2);
    make_sharded(f, "ck", 1, f->sharded, sizeof f->sharded);
    char d[256];
    snprintf(d, sizeof d, "%s/single", f->dir);
    assert_int_equal(mkdir(d, 0700), 0);
    snprintf(f->single, sizeof f->single, "%s/model.safetensors", d);
    f->single_len = write_shard(f->single, SINGLE, 2, 9);
    hooks_reset();
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    hooks_reset();
    g_dev_fd = -1;
    tv__store_close(f->st);
    nftw(f->dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    free(f);
    return 0;
}

/* Creates the store on a 16 MiB image with a region of region_len bytes
 * (0 = the rest of the image) and opens it as the writer. The device is
 * opened (label read) here, so during an import every pread on another fd
 * is a source read. */
static void open_store(fixture *f, uint64_t region_len)
{
    tv_error err = {0};
    tv__store_init_opts o = {.image = f->image, .image_size = 16 * MiB, .region_len = region_len};
    int rc = tv__store_init(f->store, &o, &f->dev, &err);
    if (rc)
        fail_msg("store init: %s", err.msg);
    rc = tv__store_open(f->store, TV__STORE_WRITE, &f->st, &err);
    if (rc)
        fail_msg("store open: %s", err.msg);
    tv__dev *d;
    assert_int_equal(tv__store_device(f->st, f->dev, true, &d, &err), 0);
    g_dev_fd = d->fd;
}

static int import(fixture *f, const char *src, bool strict, tv__import_result *res, tv_error *err)
{
    tv__import_opts o = {.activate = true, .strict = strict, .chunk_len = CHUNK};
    return tv__import(f->st, MODEL, src, &o, res, err);
}

static uint64_t alloc_of(uint64_t len)
{
    return (len + OA - 1) / OA * OA;
}

/* After a failed import: the model's active generation is still active_gen
 * (0: no model at all), and the device holds exactly n_objects rows, all
 * committed (no reservation left behind). */
static void assert_unchanged(fixture *f, int64_t active_gen, size_t n_objects)
{
    tv_error err = {0};
    tv__reg_model *models = NULL;
    size_t n = 99;
    assert_int_equal(tv__reg_models_list(f->st->reg, &models, &n, &err), 0);
    if (active_gen == 0) {
        assert_int_equal(n, 0);
    } else {
        assert_int_equal(n, 1);
        assert_string_equal(models[0].name, MODEL);
        assert_int_equal(models[0].active_generation, active_gen);
        assert_int_equal(models[0].n_generations, active_gen);
    }
    free(models);
    tv__reg_object *objs = NULL;
    assert_int_equal(tv__reg_objects_on_device(f->st->reg, f->dev, &objs, &n, &err), 0);
    assert_int_equal(n, n_objects);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(objs[i].state, TV__OBJ_COMMITTED);
        assert_int_equal(tv__verify_object(f->st, &objs[i], &err), 0);
    }
    free(objs);
}

/* Restores the syscalls and imports src cleanly as generation want_gen. */
static void assert_clean_import(fixture *f, const char *src, int64_t want_gen)
{
    hooks_reset();
    tv_error err = {0};
    tv__import_result r;
    int rc = import(f, src, true, &r, &err);
    if (rc)
        fail_msg("clean import of %s: %s (%s)", src, err.msg, tv_err_name(rc));
    assert_int_equal(r.generation, want_gen);
    int64_t active = 0;
    assert_int_equal(tv__reg_active_generation(f->st->reg, MODEL, &active, &err), 0);
    assert_int_equal(active, want_gen);
}

/* Runs an import that must fail with want, then checks nothing leaked and
 * that the same store still takes a clean import. */
static void expect_failure(fixture *f, const char *src, bool strict, int want)
{
    tv_error err = {0};
    tv__import_result r = {.generation = -1};
    int rc = import(f, src, strict, &r, &err);
    int calls = atomic_load(&g_calls);
    hooks_reset();
    assert_true(calls >= (g_fail_at > 1 ? g_fail_at : 1)); /* the fault was injected */
    if (rc != want)
        fail_msg("import returned %s (%s), expected %s", tv_err_name(rc), err.msg,
                 tv_err_name(want));
    assert_int_equal(r.generation, -1); /* *res untouched on failure */
    assert_unchanged(f, 0, 0);
    assert_clean_import(f, f->sharded, 1);
}

/* ---- tests ------------------------------------------------------------------- */

static void test_clean_sharded(void **state)
{
    fixture *f = *state;
    open_store(f, 0);
    tv_error err = {0};
    tv__import_result r;
    int rc = import(f, f->sharded, true, &r, &err);
    if (rc)
        fail_msg("import: %s", err.msg);
    assert_int_equal(r.generation, 1);
    assert_int_equal(r.n_shards, 2);
    assert_int_equal(r.n_tensors, 3);
    assert_int_equal(r.bytes_total, f->shard1_len + f->shard2_len);
    assert_int_equal(r.bytes_written, alloc_of(f->shard1_len) + alloc_of(f->shard2_len));
    assert_int_equal(r.bytes_deduped, 0);
    assert_true(f->shard1_len > 3 * CHUNK);
    assert_unchanged(f, 1, 2);

    /* Byte-for-byte: each shard at its object's base, zero padding after. */
    tv__reg_generation g;
    tv__reg_manifest *m = NULL;
    assert_int_equal(tv__reg_generation_get(f->st->reg, MODEL, 0, &g, &err), 0);
    assert_int_equal(tv__reg_tensors_list(f->st->reg, g.id, &m, &err), 0);
    assert_int_equal(m->n_shards, 2);
    assert_int_equal(m->n_tensors, 3);
    tv__dev *d;
    assert_int_equal(tv__store_device(f->st, f->dev, false, &d, &err), 0);
    const char *paths[2] = {f->shard1, f->shard2};
    for (size_t s = 0; s < 2; s++) {
        const tv__reg_shard *sh = &m->shards[s];
        assert_int_equal(sh->n_replicas, 1);
        assert_true(sh->replicas[0].committed);
        uint64_t alloc = sh->replicas[0].alloc_len;
        assert_int_equal(alloc, alloc_of(sh->file_len));
        uint8_t *dev_bytes = tv__dev_alloc_aligned(d, alloc);
        uint8_t *src_bytes = malloc(sh->file_len);
        assert_non_null(dev_bytes);
        assert_non_null(src_bytes);
        assert_int_equal(tv__dev_pread_full(d, dev_bytes, alloc, sh->replicas[0].base_off, &err),
                         0);
        int fd = open(paths[s], O_RDONLY | O_CLOEXEC);
        assert_true(fd >= 0);
        assert_int_equal(pread(fd, src_bytes, sh->file_len, 0), (ssize_t)sh->file_len);
        close(fd);
        assert_memory_equal(dev_bytes, src_bytes, sh->file_len);
        for (uint64_t i = sh->file_len; i < alloc; i++)
            assert_int_equal(dev_bytes[i], 0);
        free(dev_bytes);
        free(src_bytes);
    }
    tv__reg_manifest_free(m);
}

static void test_pwrite_eio_first(void **state)
{
    fixture *f = *state;
    open_store(f, 0);
    tv__sys.pwrite = pwrite_fail_nth;
    g_fail_at = 1;
    g_errno = EIO;
    expect_failure(f, f->sharded, false, -EIO);
}

static void test_pwrite_eio_later_chunk(void **state)
{
    fixture *f = *state;
    open_store(f, 0);
    tv__sys.pwrite = pwrite_fail_nth;
    g_fail_at = 3; /* the third chunk of shard 1 */
    g_errno = EIO;
    expect_failure(f, f->sharded, false, -EIO);
}

static void test_pwrite_eio_last_chunk(void **state)
{
    fixture *f = *state;
    open_store(f, 0);
    tv__sys.pwrite = pwrite_fail_nth;
    g_fail_at = 5; /* shard 2's only chunk: seen only when the writer drains */
    g_errno = EIO;
    expect_failure(f, f->sharded, false, -EIO);
}

static void test_pwrite_enospc(void **state)
{
    fixture *f = *state;
    open_store(f, 0);
    tv__sys.pwrite = pwrite_fail_nth;
    g_fail_at = 2;
    g_errno = ENOSPC;
    expect_failure(f, f->sharded, false, -ENOSPC);
}

static void test_pwrite_short_then_eio(void **state)
{
    fixture *f = *state;
    open_store(f, 0);
    tv__sys.pwrite = pwrite_short_then_eio;
    expect_failure(f, f->sharded, false, -EIO);
}

static void test_fdatasync_eio(void **state)
{
    fixture *f = *state;
    open_store(f, 0);
    tv__sys.fdatasync = fdatasync_fail;
    g_errno = EIO;
    expect_failure(f, f->sharded, false, -EIO);
}

static void test_fdatasync_enospc(void **state)
{
    fixture *f = *state;
    open_store(f, 0);
    tv__sys.fdatasync = fdatasync_fail;
    g_errno = ENOSPC;
    expect_failure(f, f->sharded, false, -ENOSPC);
}

static void test_source_pread_eio(void **state)
{
    fixture *f = *state;
    open_store(f, 0);
    tv__sys.pread = pread_source_eio;
    expect_failure(f, f->sharded, false, -EIO);
}

static void test_source_truncated(void **state)
{
    fixture *f = *state;
    open_store(f, 0);
    snprintf(g_src, sizeof g_src, "%s", f->single);
    g_new_len = (off_t)(f->single_len / 2); /* inside the second chunk */
    tv__sys.pread = pread_resize_source;
    expect_failure(f, f->single, false, TV_E_SOURCE_CHANGED);
}

static void test_source_grown(void **state)
{
    fixture *f = *state;
    open_store(f, 0);
    snprintf(g_src, sizeof g_src, "%s", f->single);
    g_new_len = (off_t)(f->single_len + 4096); /* all validated bytes still readable */
    tv__sys.pread = pread_resize_source;
    expect_failure(f, f->single, false, TV_E_SOURCE_CHANGED);
}

static void test_source_header_rewritten(void **state)
{
    fixture *f = *state;
    open_store(f, 0);
    snprintf(g_src, sizeof g_src, "%s", f->single);
    g_old = "emb.x";
    g_new = "emb.q";
    tv__sys.pread = pread_rewrite_header;
    expect_failure(f, f->single, false, TV_E_SOURCE_CHANGED);
}

/* The dedup path: a shard validated with tensor "head.q" is rewritten,
 * before it is hashed, into a byte copy of a committed shard (tensor
 * "head.w"). Binding it to that object would publish tensors that the
 * object's own header does not describe. */
static void test_dedup_source_header_rewritten(void **state)
{
    fixture *f = *state;
    open_store(f, 0);
    assert_clean_import(f, f->sharded, 1);
    char d[256];
    snprintf(d, sizeof d, "%s/lookalike", f->dir);
    assert_int_equal(mkdir(d, 0700), 0);
    snprintf(g_src, sizeof g_src, "%s/model.safetensors", d);
    static const tdesc LOOKALIKE[] = {{"head.q", "BF16", 5000, 2}};
    assert_int_equal(write_shard(g_src, LOOKALIKE, 1, 2), f->shard2_len);

    g_old = "head.q";
    g_new = "head.w";
    tv__sys.pread = pread_rewrite_header;
    tv_error err = {0};
    int rc = import(f, g_src, false, NULL, &err);
    assert_true(atomic_load(&g_calls) >= 1);
    hooks_reset();
    if (rc != TV_E_SOURCE_CHANGED)
        fail_msg("import returned %s (%s), expected TV_E_SOURCE_CHANGED", tv_err_name(rc), err.msg);
    assert_unchanged(f, 1, 2);
    assert_clean_import(f, f->sharded2, 2);
}

/* The region holds shard 1 exactly: shard 1 is reserved, shard 2 does not
 * fit, and shard 1's reservation must be released. */
static void test_region_full(void **state)
{
    fixture *f = *state;
    /* region = label block's object_align + shard 1's extent */
    open_store(f, OA + alloc_of(f->shard1_len));
    tv_error err = {0};
    int rc = import(f, f->sharded, false, NULL, &err);
    if (rc != TV_E_NO_SPACE)
        fail_msg("import returned %s (%s), expected TV_E_NO_SPACE", tv_err_name(rc), err.msg);
    assert_unchanged(f, 0, 0);
    /* The one-file checkpoint fits. */
    assert_true(alloc_of(f->single_len) <= alloc_of(f->shard1_len));
    assert_clean_import(f, f->single, 1);
    assert_unchanged(f, 1, 1);
}

/* A failing import (sharing shard 2 with the active generation) leaves that
 * generation active and its objects committed and intact. */
static void test_failure_keeps_active_generation(void **state)
{
    fixture *f = *state;
    open_store(f, 0);
    assert_clean_import(f, f->sharded, 1);
    assert_unchanged(f, 1, 2);

    tv__sys.pwrite = pwrite_fail_nth;
    g_fail_at = 2;
    g_errno = EIO;
    tv_error err = {0};
    tv__import_result r;
    int rc = import(f, f->sharded2, false, &r, &err);
    hooks_reset();
    assert_int_equal(rc, -EIO);
    assert_unchanged(f, 1, 2);

    /* Reading is untouched too: the manifest of generation 1 is whole. */
    tv__reg_generation g;
    tv__reg_manifest *m = NULL;
    assert_int_equal(tv__reg_generation_get(f->st->reg, MODEL, 0, &g, &err), 0);
    assert_int_equal(g.number, 1);
    assert_int_equal(g.state, TV__GEN_READY);
    assert_int_equal(tv__reg_tensors_list(f->st->reg, g.id, &m, &err), 0);
    assert_int_equal(m->n_shards, 2);
    tv__reg_manifest_free(m);

    /* The same import succeeds now; shard 2 is deduplicated. */
    rc = import(f, f->sharded2, false, &r, &err);
    if (rc)
        fail_msg("retry: %s", err.msg);
    assert_int_equal(r.generation, 2);
    assert_int_equal(r.bytes_deduped, f->shard2_len);
    assert_int_equal(r.bytes_written, alloc_of(f->shard1_len));
    assert_unchanged(f, 2, 3);
}

/* The registry refuses the generation at publish (a model name with a
 * control character), after every byte was written: the reservations of
 * the written objects are still released. */
static void test_publish_failure(void **state)
{
    fixture *f = *state;
    open_store(f, 0);
    tv__import_opts o = {.activate = true, .chunk_len = CHUNK};
    tv_error err = {0};
    int rc = tv__import(f->st, "bad\001name", f->sharded, &o, NULL, &err);
    if (rc != TV_E_INVALID_ARG)
        fail_msg("import returned %s (%s), expected TV_E_INVALID_ARG", tv_err_name(rc), err.msg);
    assert_unchanged(f, 0, 0);
    assert_clean_import(f, f->sharded, 1);
}

static void test_strict_corrupt_readback(void **state)
{
    fixture *f = *state;
    open_store(f, 0);
    tv__sys.pread = pread_flip_device;
    expect_failure(f, f->sharded, true, TV_E_HASH_MISMATCH);
}

/* The same checkpoint again: every shard is bound to the committed objects
 * (hashed from the source, never written). */
static void test_dedup_second_import(void **state)
{
    fixture *f = *state;
    open_store(f, 0);
    assert_clean_import(f, f->sharded, 1);
    tv__sys.pwrite = pwrite_fail_nth; /* counts writes; never fails */
    tv_error err = {0};
    tv__import_result r;
    int rc = import(f, f->sharded, true, &r, &err);
    if (rc)
        fail_msg("second import: %s", err.msg);
    assert_int_equal(atomic_load(&g_calls), 0);
    assert_int_equal(r.generation, 2);
    assert_int_equal(r.bytes_written, 0);
    assert_int_equal(r.bytes_total, f->shard1_len + f->shard2_len);
    assert_int_equal(r.bytes_deduped, r.bytes_total);
    hooks_reset();
    assert_unchanged(f, 2, 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_clean_sharded, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pwrite_eio_first, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pwrite_eio_later_chunk, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pwrite_eio_last_chunk, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pwrite_enospc, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pwrite_short_then_eio, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fdatasync_eio, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fdatasync_enospc, setup, teardown),
        cmocka_unit_test_setup_teardown(test_source_pread_eio, setup, teardown),
        cmocka_unit_test_setup_teardown(test_source_truncated, setup, teardown),
        cmocka_unit_test_setup_teardown(test_source_grown, setup, teardown),
        cmocka_unit_test_setup_teardown(test_source_header_rewritten, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dedup_source_header_rewritten, setup, teardown),
        cmocka_unit_test_setup_teardown(test_region_full, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failure_keeps_active_generation, setup, teardown),
        cmocka_unit_test_setup_teardown(test_publish_failure, setup, teardown),
        cmocka_unit_test_setup_teardown(test_strict_corrupt_readback, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dedup_second_import, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
