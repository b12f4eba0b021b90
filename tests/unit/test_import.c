/* Unit tests of the importer (server/import/import.c) on a file image: a
 * clean sharded import, then a failure at every step of the import injected
 * through the tv__sys table (device pwrite EIO / ENOSPC / short write,
 * fdatasync EIO / ENOSPC, source pread EIO, a source truncated, grown or
 * rewritten after validation, on the write and on the dedup path; data
 * bytes rewritten in place, truncated and restored, the path renamed over,
 * a writer's open seen through the read lease; a full region, a refused
 * publish, a corrupted strict read-back), deduplication, the model name
 * rule, step progress and cancel at every step, a local source opened
 * once (outside the roots refused; renamed away and replaced: its own
 * bytes; a shard swapped for a link out of the roots refused), and the
 * source read path:
 * O_DIRECT for a source not in the page cache (the default here: every
 * checkpoint is written, synced and evicted), buffered for a cached one, and
 * the fallback when O_DIRECT is refused.
 *
 * Invariant checked after every failure: the expected code comes back, no
 * generation is published (or the previously active one is unchanged), no
 * 'writing' reservation is left, and a clean import afterwards succeeds.
 * Every test gets its own store and checkpoints in a fresh temporary
 * directory; the syscall table is restored after each case. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include <sqlite3.h>

#include "dev/dev.h"
#include "import/import.h"
#include "import/source.h"
#include "tv_test_store.h"
#include "store/store.h"
#include "registry/registry.h"
#include "util/sys.h"

#define KiB   1024ull
#define MiB   (1024ull * 1024ull)
#define CHUNK (64 * KiB) /* import chunk: shard 1 of the sharded checkpoint spans 4 */
#define OA    (64 * KiB) /* object_align of a file image */
#define MODEL "m"

typedef struct fixture {
    tv_test_store s;    /* created per test by open_store */
    char sharded[512];  /* model.safetensors.index.json of a 2-shard checkpoint */
    char sharded2[512]; /* same shard 2 as sharded, different shard 1 */
    char single[512];   /* one-file checkpoint, 3 chunks */
    char shard1[512], shard2[512];
    uint64_t shard1_len, shard2_len, single_len;
} fixture;

/* ---- checkpoint writer ---------------------------------------------------- */

typedef tv_test_tensor tdesc;

/* tv_test_write_shard, then out of the page cache, as a checkpoint on disk
 * usually is: the importer reads it with O_DIRECT (tmpfs keeps it: buffered
 * there). Returns the file length. */
static uint64_t write_shard(const char *path, const tdesc *t, size_t n, unsigned seed)
{
    uint64_t file_len = tv_test_write_shard(path, t, n, seed);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    assert_true(fd >= 0);
    assert_int_equal(fsync(fd), 0);
    (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
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
    snprintf(d, sizeof d, "%s/%s", f->s.dir, sub);
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
static char g_src[1024];   /* source file the pread hooks tamper with */
static off_t g_new_len;    /* truncate / extend target */
static int g_wfd = -1;     /* writable fd on g_src, see open_writer */

static void hooks_reset(void)
{
    tv__sys_reset();
    tv__sys_crash_hook = NULL;
    if (g_wfd >= 0)
        close(g_wfd);
    g_wfd = -1;
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

/* A writable fd on the source, opened before the import: it stands for a
 * writer that already had the file open, and it keeps the importer from
 * taking a read lease (the kernel refuses one on a file open for writing),
 * so these cases exercise the stamp checks alone. */
static void open_writer(const char *path)
{
    if (path != g_src)
        snprintf(g_src, sizeof g_src, "%s", path);
    g_wfd = open(path, O_RDWR | O_CLOEXEC);
    assert_true(g_wfd >= 0);
}

/* The importer's first read of a source: a chunk from offset 0 (the header
 * validation reads 8 bytes at 0, then the header at 8; this test's snapshot
 * and pointer files are read whole from 0, and are under 4 KiB). */
static bool first_import_read(int fd, size_t len, off_t off)
{
    return fd != g_dev_fd && fd != g_wfd && off == 0 && len >= 4096 &&
           atomic_fetch_add(&g_calls, 1) == 0;
}

/* Sleeps past a coarse timestamp tick, so that even a filesystem without
 * fine-grained timestamps gives the next change a new ctime. */
static void next_tick(void)
{
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, NULL);
}

/* First source read: resize the file behind the importer's back. */
static ssize_t pread_resize_source(int fd, void *buf, size_t len, off_t off)
{
    if (first_import_read(fd, len, off))
        assert_int_equal(ftruncate(g_wfd, g_new_len), 0);
    return pread(fd, buf, len, off);
}

/* First source read: rewrite data bytes in place (same size, same header):
 * the last 4 KiB of the file, which the importer reads last. */
static ssize_t pread_rewrite_data(int fd, void *buf, size_t len, off_t off)
{
    if (first_import_read(fd, len, off)) {
        uint8_t junk[4096];
        struct stat sb;
        assert_int_equal(fstat(g_wfd, &sb), 0);
        memset(junk, 0xa5, sizeof junk);
        next_tick();
        assert_int_equal(pwrite(g_wfd, junk, sizeof junk, sb.st_size - (off_t)sizeof junk),
                         (ssize_t)sizeof junk);
    }
    return pread(fd, buf, len, off);
}

/* First source read: truncate the file to half, then write the lost bytes
 * back: size and content are as validated, only the stamps moved. */
static ssize_t pread_truncate_restore(int fd, void *buf, size_t len, off_t off)
{
    if (first_import_read(fd, len, off)) {
        struct stat sb;
        assert_int_equal(fstat(g_wfd, &sb), 0);
        size_t half = (size_t)sb.st_size / 2, rest = (size_t)sb.st_size - half;
        uint8_t *copy = malloc(rest);
        assert_non_null(copy);
        assert_int_equal(pread(g_wfd, copy, rest, (off_t)half), (ssize_t)rest);
        next_tick();
        assert_int_equal(ftruncate(g_wfd, (off_t)half), 0);
        assert_int_equal(pwrite(g_wfd, copy, rest, (off_t)half), (ssize_t)rest);
        free(copy);
    }
    return pread(fd, buf, len, off);
}

/* First source read: rename another file over the source path (the
 * importer's fd keeps reading the old inode). */
static ssize_t pread_rename_over(int fd, void *buf, size_t len, off_t off)
{
    if (first_import_read(fd, len, off)) {
        char tmp[1100];
        snprintf(tmp, sizeof tmp, "%s.new", g_src);
        int in = open(g_src, O_RDONLY | O_CLOEXEC), out;
        assert_true(in >= 0);
        out = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        assert_true(out >= 0);
        uint8_t b[65536];
        ssize_t n;
        off_t o = 0;
        while ((n = pread(in, b, sizeof b, o)) > 0) {
            b[n - 1] ^= 0xff;
            assert_int_equal(pwrite(out, b, (size_t)n, o), n);
            o += n;
        }
        close(in);
        close(out);
        assert_int_equal(rename(tmp, g_src), 0);
    }
    return pread(fd, buf, len, off);
}

/* First source read: another opener asks for write access. With the
 * importer's read lease in force the open fails with EWOULDBLOCK (and
 * breaks the lease); without a lease it succeeds and writes one byte. */
static int g_writer_open_errno; /* 0: the writer's open succeeded */

static ssize_t pread_writer_opens(int fd, void *buf, size_t len, off_t off)
{
    if (first_import_read(fd, len, off)) {
        int w = open(g_src, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
        g_writer_open_errno = w < 0 ? errno : 0;
        if (w >= 0) { /* a data byte: the header compare cannot see it */
            struct stat sb;
            assert_int_equal(fstat(w, &sb), 0);
            next_tick();
            assert_int_equal(pwrite(w, "x", 1, sb.st_size - 1), 1);
            close(w);
        }
    }
    return pread(fd, buf, len, off);
}

/* Crash hook at "reserve" (after the dedup probe, before the write pass
 * opens the shards): rewrite data bytes of g_src in place. */
static void crash_rewrite_at_reserve(const char *point)
{
    if (strcmp(point, "reserve") != 0)
        return;
    atomic_fetch_add(&g_calls, 1);
    int w = open(g_src, O_WRONLY | O_CLOEXEC);
    assert_true(w >= 0);
    next_tick();
    struct stat sb;
    assert_int_equal(fstat(w, &sb), 0);
    assert_int_equal(pwrite(w, "zzzz", 4, sb.st_size - 4), 4);
    close(w);
}

/* First source read: rewrite the quoted tensor name g_old as g_new (same
 * length, so the header keeps its length and stays valid). */
static const char *g_old, *g_new;

static ssize_t pread_rewrite_header(int fd, void *buf, size_t len, off_t off)
{
    if (first_import_read(fd, len, off)) {
        char hdr[512], quoted[64];
        int wfd = g_wfd;
        ssize_t n = pread(wfd, hdr, sizeof hdr, 0);
        assert_true(n > 16);
        int ql = snprintf(quoted, sizeof quoted, "\"%s\"", g_old);
        char *name = memmem(hdr + 8, (size_t)n - 8, quoted, (size_t)ql);
        assert_non_null(name);
        assert_int_equal(strlen(g_new), strlen(g_old));
        memcpy(name + 1, g_new, strlen(g_new));
        assert_int_equal(pwrite(wfd, name, (size_t)ql, name - hdr), ql);
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

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    assert_non_null(f);
    tv_test_store_dir(&f->s, "import");
    make_sharded(f, "ck2", 3, f->sharded2, sizeof f->sharded2);
    make_sharded(f, "ck", 1, f->sharded, sizeof f->sharded);
    char d[256];
    snprintf(d, sizeof d, "%s/single", f->s.dir);
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
    tv_test_store_teardown(&f->s);
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
    tv_test_store_create(&f->s, &(tv_test_store_opts){.region_len = region_len});
    tv__dev *d;
    assert_int_equal(tv__store_device(f->s.st, f->s.dev[0], true, &d, &err), 0);
    g_dev_fd = d->fd;
}

static int import(fixture *f, const char *src, bool strict, tv__import_result *res, tv_error *err)
{
    tv__import_opts o = {.activate = true, .strict = strict, .chunk_len = CHUNK};
    return tv__import(f->s.st, MODEL, src, &o, res, err);
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
    assert_int_equal(tv__reg_models_list(f->s.st->reg, &models, &n, &err), 0);
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
    assert_int_equal(tv__reg_objects_on_device(f->s.st->reg, f->s.dev[0], &objs, &n, &err), 0);
    assert_int_equal(n, n_objects);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(objs[i].state, TV__OBJ_COMMITTED);
        assert_int_equal(tv__verify_object(f->s.st, &objs[i], &err), 0);
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
    assert_int_equal(tv__reg_active_generation(f->s.st->reg, MODEL, &active, &err), 0);
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
    assert_int_equal(tv__reg_generation_get(f->s.st->reg, MODEL, 0, &g, &err), 0);
    assert_int_equal(tv__reg_tensors_list(f->s.st->reg, g.id, &m, &err), 0);
    assert_int_equal(m->n_shards, 2);
    assert_int_equal(m->n_tensors, 3);
    tv__dev *d;
    assert_int_equal(tv__store_device(f->s.st, f->s.dev[0], false, &d, &err), 0);
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
    open_writer(f->single);
    g_new_len = (off_t)(f->single_len / 2); /* inside the second chunk */
    tv__sys.pread = pread_resize_source;
    expect_failure(f, f->single, false, TV_E_SOURCE_CHANGED);
}

static void test_source_grown(void **state)
{
    fixture *f = *state;
    open_store(f, 0);
    open_writer(f->single);
    g_new_len = (off_t)(f->single_len + 4096); /* all validated bytes still readable */
    tv__sys.pread = pread_resize_source;
    expect_failure(f, f->single, false, TV_E_SOURCE_CHANGED);
}

static void test_source_header_rewritten(void **state)
{
    fixture *f = *state;
    open_store(f, 0);
    open_writer(f->single);
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
    snprintf(d, sizeof d, "%s/lookalike", f->s.dir);
    assert_int_equal(mkdir(d, 0700), 0);
    snprintf(g_src, sizeof g_src, "%s/model.safetensors", d);
    static const tdesc LOOKALIKE[] = {{"head.q", "BF16", 5000, 2}};
    assert_int_equal(write_shard(g_src, LOOKALIKE, 1, 2), f->shard2_len);
    open_writer(g_src);

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

/* An import that must fail with TV_E_SOURCE_CHANGED, with a message that
 * names the shard and says what happened; then nothing leaked and a clean
 * import still works. */
static void expect_source_changed(fixture *f, const char *src, const char *shard, const char *what,
                                  int64_t active_gen, size_t n_objects)
{
    tv_error err = {0};
    tv__import_result r = {.generation = -1};
    int rc = import(f, src, false, &r, &err);
    int calls = atomic_load(&g_calls);
    hooks_reset();
    assert_true(calls >= 1); /* the change was made */
    if (rc != TV_E_SOURCE_CHANGED)
        fail_msg("import returned %s (%s), expected TV_E_SOURCE_CHANGED", tv_err_name(rc), err.msg);
    if (!strstr(err.msg, shard) || !strstr(err.msg, what))
        fail_msg("message '%s' does not name shard '%s' and '%s'", err.msg, shard, what);
    assert_int_equal(r.generation, -1);
    assert_unchanged(f, active_gen, n_objects);
    assert_clean_import(f, f->sharded2, active_gen + 1);
}

#define SHARD1_NAME "model-00001-of-00002.safetensors"

/* Data bytes rewritten in place mid-import (same size, same header) must
 * not be published as a mixture of old and new bytes with a matching
 * hash. */
static void test_source_data_rewritten(void **state)
{
    fixture *f = *state;
    open_store(f, 0);
    open_writer(f->shard1);
    tv__sys.pread = pread_rewrite_data;
    expect_source_changed(f, f->sharded, SHARD1_NAME, "changed during import: mtime", 0, 0);
}

static void test_source_truncate_restored(void **state)
{
    fixture *f = *state;
    open_store(f, 0);
    open_writer(f->single);
    tv__sys.pread = pread_truncate_restore;
    expect_source_changed(f, f->single, "model.safetensors", "changed during import", 0, 0);
}

static void test_source_renamed_over(void **state)
{
    fixture *f = *state;
    open_store(f, 0);
    snprintf(g_src, sizeof g_src, "%s", f->single);
    tv__sys.pread = pread_rename_over;
    expect_source_changed(f, f->single, "model.safetensors", "was replaced during import", 0, 0);
}

/* With the read lease, a writer's open is seen even before it writes. */
static void test_source_writer_opens(void **state)
{
    fixture *f = *state;
    open_store(f, 0);
    snprintf(g_src, sizeof g_src, "%s", f->single);
    g_writer_open_errno = -1;
    tv__sys.pread = pread_writer_opens;
    tv_error err = {0};
    int rc = import(f, f->single, false, NULL, &err);
    hooks_reset();
    assert_int_equal(rc, TV_E_SOURCE_CHANGED);
    if (g_writer_open_errno == EWOULDBLOCK) {
        if (!strstr(err.msg, "opened for writing"))
            fail_msg("lease break not reported: %s", err.msg);
    } else {
        /* No lease on this filesystem: the byte written moved the stamps. */
        assert_int_equal(g_writer_open_errno, 0);
        print_message("no read lease here (%s); stamps caught the write\n", err.msg);
        assert_non_null(strstr(err.msg, "changed during import"));
    }
    assert_unchanged(f, 0, 0);
    assert_clean_import(f, f->sharded, 1);
}

/* Changed between validation and the first read of the write pass. */
static void test_source_changed_after_validation(void **state)
{
    fixture *f = *state;
    open_store(f, 0);
    snprintf(g_src, sizeof g_src, "%s", f->single);
    tv__sys_crash_hook = crash_rewrite_at_reserve;
    expect_source_changed(f, f->single, "model.safetensors", "changed since it was validated", 0,
                          0);
}

/* The dedup probe hashes a shard before anything is written (shard 1 of
 * ck2 has the length of a committed object): a rewrite during that pass is
 * caught as well. */
static void test_dedup_source_data_rewritten(void **state)
{
    fixture *f = *state;
    open_store(f, 0);
    assert_clean_import(f, f->sharded, 1);
    char p[600];
    snprintf(p, sizeof p, "%s/ck2/" SHARD1_NAME, f->s.dir);
    open_writer(p);
    tv__sys.pread = pread_rewrite_data;
    expect_source_changed(f, f->sharded2, SHARD1_NAME, "changed during import", 1, 2);
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
    assert_int_equal(tv__reg_generation_get(f->s.st->reg, MODEL, 0, &g, &err), 0);
    assert_int_equal(g.number, 1);
    assert_int_equal(g.state, TV__GEN_READY);
    assert_int_equal(tv__reg_tensors_list(f->s.st->reg, g.id, &m, &err), 0);
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

/* The registry refuses the generation at publish (a temporary trigger
 * makes its INSERT fail), after every byte was written: the reservations
 * of the written objects are still released. */
static void test_publish_failure(void **state)
{
    fixture *f = *state;
    open_store(f, 0);
    sqlite3 *db = tv__reg_sqlite(f->s.st->reg);
    assert_int_equal(sqlite3_exec(db,
                                  "CREATE TEMP TRIGGER tv_test_refuse BEFORE INSERT ON "
                                  "main.generations BEGIN SELECT RAISE(ABORT, 'refused by the "
                                  "test'); END",
                                  NULL, NULL, NULL),
                     SQLITE_OK);
    tv__import_opts o = {.activate = true, .chunk_len = CHUNK};
    tv_error err = {0};
    tv__import_result r = {0};
    int rc = tv__import(f->s.st, MODEL, f->sharded, &o, &r, &err);
    assert_int_equal(sqlite3_exec(db, "DROP TRIGGER temp.tv_test_refuse", NULL, NULL, NULL),
                     SQLITE_OK);
    if (rc != TV_E_REGISTRY)
        fail_msg("import returned %s (%s), expected TV_E_REGISTRY", tv_err_name(rc), err.msg);
    assert_unchanged(f, 0, 0);
    assert_clean_import(f, f->sharded, 1);
}

/* The name rule: one table of names a registry user
 * expects to work and of names that would collide with NAME@GEN /
 * NAME@ALIAS, paths, options or terminals. */
static void test_name_rule(void **state)
{
    (void)state;
    char longest[TV__NAME_MAX + 1], too_long[TV__NAME_MAX + 2];
    memset(longest, 'a', TV__NAME_MAX);
    longest[TV__NAME_MAX] = '\0';
    memset(too_long, 'a', TV__NAME_MAX + 1);
    too_long[TV__NAME_MAX + 1] = '\0';
    const char *good[] = {
        "llama",
        "m",
        "gpt2",
        "Llama-3-8B",
        "meta-llama/Llama-3-8B",
        "Qwen/Qwen2.5-7B-Instruct",
        "mistralai/Mixtral-8x7B-v0.1",
        "org/team/model",
        "a.b_c-d",
        "model-",
        "v1.0",
        "_private",
        "0",
        longest,
    };
    const char *bad[] = {
        "",     "x@1",    "x@prod", "@x",           "x@",     "a b",  " a",
        "a ",   "a\tb",   "a\nb",   "a\001b",       "a\177b", "-rf",  ".hidden",
        ".",    "..",     "a..b",   "a/../b",       "a/./b",  "/abs", "trailing/",
        "a//b", "org/-x", "org/.x", "na\xc3\xafve", "a\\b",   "a:b",  "a*b",
        "a?b",  "a;b",    "a$b",    "a%b",          "a~b",    "a'b",  "a\"b",
        "a#b",  "a+b",    "a,b",    "a=b",          too_long,
    };
    tv_error err;
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        memset(&err, 0, sizeof err);
        int rc = tv__name_valid(good[i], "model name", &err);
        if (rc)
            fail_msg("'%s' refused: %s", good[i], err.msg);
    }
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memset(&err, 0, sizeof err);
        int rc = tv__name_valid(bad[i], "model name", &err);
        if (rc != TV_E_NAME)
            fail_msg("bad name #%zu '%s' returned %s", i, bad[i], tv_err_name(rc));
        assert_non_null(strstr(err.msg, "model name"));
    }
    assert_int_equal(tv__name_valid(NULL, "alias name", &err), TV_E_NAME);
    assert_non_null(strstr(err.msg, "alias name is empty"));
}

/* A bad model name is refused before anything is read or written. */
static void test_import_bad_name(void **state)
{
    fixture *f = *state;
    open_store(f, 0);
    tv__sys.pwrite = pwrite_fail_nth; /* counts device writes; never fails */
    tv_error err = {0};
    int rc = tv__import(f->s.st, "llama@1", f->sharded, NULL, NULL, &err);
    int writes = atomic_load(&g_calls);
    hooks_reset();
    assert_int_equal(rc, TV_E_NAME);
    assert_int_equal(writes, 0);
    assert_non_null(strstr(err.msg, "'llama@1'"));
    assert_unchanged(f, 0, 0);
    assert_clean_import(f, f->sharded, 1);
}

/* A chunk_len whose round-up to the buffer alignment overflows is refused
 * before anything is read or written (it used to wrap to 0 and loop). */
static void test_import_chunk_overflow(void **state)
{
    fixture *f = *state;
    open_store(f, 0);
    tv__sys.pwrite = pwrite_fail_nth; /* counts device writes; never fails */
    tv__import_opts o = {.activate = true, .chunk_len = SIZE_MAX - 10};
    tv_error err = {0};
    int rc = tv__import(f->s.st, MODEL, f->sharded, &o, NULL, &err);
    int writes = atomic_load(&g_calls);
    hooks_reset();
    assert_int_equal(rc, TV_E_INVALID_ARG);
    assert_int_equal(writes, 0);
    assert_non_null(strstr(err.msg, "chunk_len"));
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

/* ---- progress and cancel -------------------------------------------------- */

static const char *const STEPS[] = {"resolve", "dedup",  "reserve", "write",
                                    "flush",   "verify", "publish"};
#define N_STEPS (sizeof STEPS / sizeof STEPS[0])

typedef struct step_call {
    int step; /* index in STEPS */
    size_t shard;
    uint64_t done, total;
} step_call;

typedef struct step_log {
    step_call calls[4096];
    size_t n;
    int cur; /* the step of the last call, -1 before any */
    uint64_t cur_done, cur_total;
    uint64_t old_done[4096], old_total; /* the write-only progress callback */
    size_t n_old;
    int cancel_step;     /* cancel once this step reported (-1: never) */
    bool cancel_mid;     /* ... and only once it is under way (0 < done < total) */
    int polls_at_cancel; /* cancel polls answered true */
} step_log;

static int step_index(const char *step)
{
    for (size_t i = 0; i < N_STEPS; i++)
        if (strcmp(step, STEPS[i]) == 0)
            return (int)i;
    fail_msg("unknown step '%s'", step);
    return -1;
}

static void on_step(void *ctx, const char *step, size_t shard, uint64_t done, uint64_t total)
{
    step_log *l = ctx;
    assert_true(l->n < sizeof l->calls / sizeof l->calls[0]);
    l->calls[l->n++] = (step_call){step_index(step), shard, done, total};
    l->cur = step_index(step);
    l->cur_done = done;
    l->cur_total = total;
}

static void on_old_progress(void *ctx, uint64_t done, uint64_t total)
{
    step_log *l = ctx;
    assert_true(l->n_old < sizeof l->old_done / sizeof l->old_done[0]);
    l->old_done[l->n_old++] = done;
    l->old_total = total;
}

static bool on_cancel(void *ctx)
{
    step_log *l = ctx;
    if (l->cancel_step < 0 || l->cur != l->cancel_step)
        return false;
    if (l->cancel_mid && !(l->cur_done > 0 && l->cur_done < l->cur_total))
        return false;
    l->polls_at_cancel++;
    return true;
}

static int import_logged(fixture *f, const char *src, step_log *l, tv__import_result *r,
                         tv_error *err)
{
    tv__import_opts o = {.activate = true,
                         .strict = true,
                         .chunk_len = CHUNK,
                         .on_step = on_step,
                         .step_ctx = l,
                         .cancelled = on_cancel,
                         .cancel_ctx = l,
                         .progress = on_old_progress,
                         .progress_ctx = l};
    l->n = 0;
    l->n_old = 0;
    l->cur = -1;
    return tv__import(f->s.st, MODEL, src, &o, r, err);
}

/* Every step reported, in order, each as one run of calls with a fixed
 * total and a done that never decreases and ends at the total; the shard
 * index is a shard or TV__IMPORT_NO_SHARD. Returns each step's total. */
static void check_steps(const step_log *l, size_t n_shards, uint64_t totals[N_STEPS])
{
    size_t i = 0;
    for (size_t s = 0; s < N_STEPS; s++) {
        if (i >= l->n || l->calls[i].step != (int)s)
            fail_msg("step %s not reported (call %zu)", STEPS[s], i);
        uint64_t total = l->calls[i].total, done = 0;
        for (; i < l->n && l->calls[i].step == (int)s; i++) {
            const step_call *c = &l->calls[i];
            assert_int_equal(c->total, total);
            if (c->done < done || c->done > total)
                fail_msg("step %s: done %llu after %llu (total %llu)", STEPS[s],
                         (unsigned long long)c->done, (unsigned long long)done,
                         (unsigned long long)total);
            done = c->done;
            assert_true(c->shard == TV__IMPORT_NO_SHARD || c->shard < n_shards);
        }
        if (done != total)
            fail_msg("step %s ended at %llu of %llu", STEPS[s], (unsigned long long)done,
                     (unsigned long long)total);
        totals[s] = total;
    }
    assert_int_equal(i, l->n); /* nothing after publish, no step twice */
}

static void test_progress_every_step(void **state)
{
    fixture *f = *state;
    open_store(f, 0);
    static step_log l;
    memset(&l, 0, sizeof l);
    l.cancel_step = -1;
    tv_error err = {0};
    tv__import_result r;
    int rc = import_logged(f, f->sharded, &l, &r, &err);
    if (rc)
        fail_msg("import: %s", err.msg);
    uint64_t t[N_STEPS];
    check_steps(&l, 2, t);
    uint64_t canon = f->shard1_len + f->shard2_len;
    uint64_t written = alloc_of(f->shard1_len) + alloc_of(f->shard2_len);
    assert_int_equal(t[0], canon);   /* resolve */
    assert_int_equal(t[1], 0);       /* dedup: nothing committed yet */
    assert_int_equal(t[2], canon);   /* reserve */
    assert_int_equal(t[3], written); /* write */
    assert_int_equal(r.bytes_written, written);
    assert_int_equal(t[4], written); /* flush */
    assert_int_equal(t[5], written); /* verify (strict: read back chunk by chunk) */
    assert_int_equal(t[6], canon);   /* publish */
    /* The write step names both shards, in order; the chunks are reported. */
    size_t last_shard = 0, n_write = 0;
    for (size_t i = 0; i < l.n; i++) {
        if (l.calls[i].step != 3 || l.calls[i].shard == TV__IMPORT_NO_SHARD)
            continue;
        assert_true(l.calls[i].shard >= last_shard);
        last_shard = l.calls[i].shard;
        n_write++;
    }
    assert_int_equal(last_shard, 1);
    assert_true(n_write >= 5); /* shard 1 spans 4 chunks, shard 2 one */
    /* The write-only callback: monotonic, ending at what was written. */
    assert_true(l.n_old >= 2);
    for (size_t i = 1; i < l.n_old; i++)
        assert_true(l.old_done[i] >= l.old_done[i - 1]);
    assert_int_equal(l.old_done[l.n_old - 1], written);
    assert_int_equal(l.old_total, written);

    /* A second checkpoint of the same shard lengths: both are dedup
     * candidates (hashed), shard 2 is bound, only shard 1 is written. */
    rc = import_logged(f, f->sharded2, &l, &r, &err);
    if (rc)
        fail_msg("second import: %s", err.msg);
    check_steps(&l, 2, t);
    assert_int_equal(t[1], canon);
    assert_int_equal(t[2], f->shard1_len);
    assert_int_equal(t[3], alloc_of(f->shard1_len));
    assert_int_equal(r.bytes_deduped, f->shard2_len);
    assert_unchanged(f, 2, 3);
}

/* Cancels at every step (as it begins, and for the chunked steps once under
 * way): -ECANCELED naming the step, no generation, no 'writing' object (so
 * no extent held), the previously active generation untouched; then the
 * same import succeeds. Run on an empty store and again with a generation
 * whose objects are dedup candidates. */
static void cancel_everywhere(fixture *f, const char *src, int64_t active, size_t n_objects)
{
    static step_log l;
    for (int mid = 0; mid < 2; mid++) {
        for (size_t s = 0; s < N_STEPS; s++) {
            bool chunked = s == 1 || s == 3 || s == 5; /* dedup, write, verify */
            if (mid && !chunked)
                continue;
            if (mid && s == 1 && active == 0)
                continue; /* no dedup candidate on an empty store */
            memset(&l, 0, sizeof l);
            l.cancel_step = (int)s;
            l.cancel_mid = mid;
            tv_error err = {0};
            tv__import_result r = {.generation = -1};
            int rc = import_logged(f, src, &l, &r, &err);
            if (rc != -ECANCELED)
                fail_msg("cancel at %s%s: import returned %s (%s)", STEPS[s],
                         mid ? " (under way)" : "", tv_err_name(rc), err.msg);
            assert_int_equal(l.polls_at_cancel, 1); /* it stopped at the first yes */
            assert_non_null(strstr(err.msg, STEPS[s]));
            assert_int_equal(r.generation, -1);
            assert_int_equal(l.cur, (int)s); /* no later step began */
            assert_unchanged(f, active, n_objects);
        }
    }
}

static void test_cancel_every_step(void **state)
{
    fixture *f = *state;
    open_store(f, 0);
    cancel_everywhere(f, f->sharded, 0, 0);
    assert_clean_import(f, f->sharded, 1);
    assert_unchanged(f, 1, 2);
    cancel_everywhere(f, f->sharded2, 1, 2);
    assert_clean_import(f, f->sharded2, 2);
    assert_unchanged(f, 2, 3);
}

/* ---- local sources opened once (src_local.c) ------------------------------ */

static int import_held(fixture *f, const tv__src_local *l, tv__import_result *r, tv_error *err)
{
    tv__import_opts o = {.activate = true, .strict = true, .chunk_len = CHUNK, .local = l};
    return tv__import(f->s.st, MODEL, tv__src_local_real(l), &o, r, err);
}

/* A source opened with roots: outside them it does not open; a file named
 * and then renamed away and replaced still imports its own bytes; a shard
 * of an index replaced by a link out of the roots after the open is
 * TV_E_OUTSIDE_ROOTS, with nothing reserved. */
static void test_held_source(void **state)
{
    fixture *f = *state;
    open_store(f, 0);
    char root[256], moved[600], link_to[600];
    snprintf(root, sizeof root, "%s/single", f->s.dir);
    const char *roots[] = {root};
    tv__src_local *l = NULL;
    tv_error err = {0};
    tv__import_result r;
    assert_int_equal(tv__src_local_open(f->sharded, roots, 1, &l, &err), TV_E_OUTSIDE_ROOTS);
    assert_null(l);
    assert_non_null(strstr(err.msg, "outside the import roots"));
    /* the file named, renamed away and replaced: its own bytes */
    assert_int_equal(tv__src_local_open(f->single, roots, 1, &l, &err), 0);
    assert_string_equal(tv__src_local_real(l), f->single);
    snprintf(moved, sizeof moved, "%s.old", f->single);
    assert_int_equal(rename(f->single, moved), 0);
    write_shard(f->single, SHARD2, 1, 5);
    int rc = import_held(f, l, &r, &err);
    if (rc)
        fail_msg("held import: %s", err.msg);
    assert_int_equal(r.bytes_total, f->single_len);
    assert_int_equal(r.n_tensors, 2);
    tv__src_local_free(l);
    /* a shard of an index swapped for a link out of the roots */
    snprintf(root, sizeof root, "%s/ck", f->s.dir);
    assert_int_equal(tv__src_local_open(f->sharded, roots, 1, &l, &err), 0);
    snprintf(link_to, sizeof link_to, "%s/ck2/model-00001-of-00002.safetensors", f->s.dir);
    assert_int_equal(unlink(f->shard1), 0);
    assert_int_equal(symlink(link_to, f->shard1), 0);
    assert_int_equal(import_held(f, l, &r, &err), TV_E_OUTSIDE_ROOTS);
    assert_non_null(strstr(err.msg, "ck2/model-00001-of-00002.safetensors"));
    tv__src_local_free(l);
    assert_unchanged(f, 1, 1);
}

/* ---- the source read path -------------------------------------------------- */

static atomic_int g_direct_reads, g_buffered_reads;

static ssize_t pread_note_mode(int fd, void *buf, size_t len, off_t off)
{
    if (fd != g_dev_fd && len >= 4096) {
        int fl = fcntl(fd, F_GETFL);
        atomic_fetch_add(fl != -1 && (fl & O_DIRECT) ? &g_direct_reads : &g_buffered_reads, 1);
    }
    return pread(fd, buf, len, off);
}

/* The first O_DIRECT source read is refused with EINVAL (an alignment the
 * filesystem does not take): the importer reads that shard buffered from
 * then on. Only the refused shard's reads are counted (its file, by device
 * and inode): the other shard is read O_DIRECT or buffered depending on
 * what the page cache holds of it, which the test does not fix. */
static atomic_bool g_ref_set;
static dev_t g_ref_dev;
static ino_t g_ref_ino;
static off_t g_ref_off;
static atomic_llong g_ref_buffered_bytes;
static atomic_int g_ref_direct_after;

static bool is_refused_file(int fd)
{
    struct stat sb;
    return atomic_load(&g_ref_set) && fstat(fd, &sb) == 0 && sb.st_dev == g_ref_dev &&
           sb.st_ino == g_ref_ino;
}

static ssize_t pread_refuse_direct(int fd, void *buf, size_t len, off_t off)
{
    int fl = fcntl(fd, F_GETFL);
    bool direct = fl != -1 && (fl & O_DIRECT);
    if (fd == g_dev_fd)
        return pread_note_mode(fd, buf, len, off);
    if (direct && atomic_fetch_add(&g_calls, 1) == 0) {
        struct stat sb;
        if (fstat(fd, &sb) == 0) {
            g_ref_dev = sb.st_dev;
            g_ref_ino = sb.st_ino;
            g_ref_off = off;
            atomic_store(&g_ref_set, true);
        }
        errno = EINVAL;
        return -1;
    }
    bool refused_file = is_refused_file(fd);
    if (refused_file && direct)
        atomic_fetch_add(&g_ref_direct_after, 1);
    ssize_t n = pread_note_mode(fd, buf, len, off);
    if (refused_file && !direct && n > 0)
        atomic_fetch_add(&g_ref_buffered_bytes, (long long)n);
    return n;
}

/* Whether files in the test directory take O_DIRECT (tmpfs before 6.6:
 * no); then a source out of the page cache must be read with it. */
static bool dir_takes_direct(const fixture *f)
{
    int fd = open(f->single, O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (fd >= 0)
        close(fd);
    return fd >= 0;
}

/* Whether any page of path is in the page cache. */
static bool any_resident(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    assert_true(fd >= 0);
    struct stat sb;
    assert_int_equal(fstat(fd, &sb), 0);
    size_t len = (size_t)sb.st_size, pg = (size_t)sysconf(_SC_PAGESIZE), n = (len + pg - 1) / pg;
    unsigned char *vec = malloc(n);
    void *map = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
    assert_non_null(vec);
    assert_true(map != MAP_FAILED);
    assert_int_equal(mincore(map, len, vec), 0);
    bool any = false;
    for (size_t i = 0; i < n; i++)
        any |= vec[i] & 1;
    munmap(map, len);
    free(vec);
    close(fd);
    return any;
}

static void import_counting(fixture *f, const char *src, int64_t gen)
{
    atomic_store(&g_direct_reads, 0);
    atomic_store(&g_buffered_reads, 0);
    tv_error err = {0};
    tv__import_result r;
    int rc = import(f, src, true, &r, &err);
    if (rc)
        fail_msg("import of %s: %s", src, err.msg);
    assert_int_equal(r.generation, gen);
}

/* Written, synced and evicted: read with O_DIRECT (every chunk, the odd
 * tail rounded up and cut at EOF) where the filesystem takes it; the bytes
 * on the device are the source's (test_clean_sharded compares them). */
static void test_source_cold_direct(void **state)
{
    fixture *f = *state;
    open_store(f, 0);
    /* tmpfs neither evicts nor (before 6.6) takes O_DIRECT: buffered there,
     * and that is right too. */
    bool cold = dir_takes_direct(f) && !any_resident(f->single);
    tv__sys.pread = pread_note_mode;
    import_counting(f, f->single, 1);
    hooks_reset();
    if (cold) {
        assert_true(atomic_load(&g_direct_reads) >= 3); /* 3 chunks */
        assert_int_equal(atomic_load(&g_buffered_reads), 0);
    } else {
        print_message("%s stays in the page cache here: read buffered\n", f->single);
        assert_true(atomic_load(&g_buffered_reads) >= 3);
    }
    assert_true(f->single_len % 4096 != 0);
    assert_unchanged(f, 1, 1);
}

/* In the page cache (just read): buffered, no O_DIRECT read. */
static void test_source_cached_buffered(void **state)
{
    fixture *f = *state;
    open_store(f, 0);
    uint8_t b[65536];
    int fd = open(f->single, O_RDONLY | O_CLOEXEC);
    assert_true(fd >= 0);
    while (read(fd, b, sizeof b) > 0)
        ;
    close(fd);
    tv__sys.pread = pread_note_mode;
    import_counting(f, f->single, 1);
    hooks_reset();
    assert_int_equal(atomic_load(&g_direct_reads), 0);
    assert_true(atomic_load(&g_buffered_reads) >= 3);
    assert_unchanged(f, 1, 1);
}

/* O_DIRECT refused at the first read: the import falls back to buffered
 * reads and succeeds with the right bytes (the strict read-back and
 * tv__verify_object re-hash them). */
static void test_source_direct_refused(void **state)
{
    fixture *f = *state;
    open_store(f, 0);
    if (!dir_takes_direct(f)) {
        print_message("O_DIRECT not taken in %s: nothing to refuse\n", f->s.dir);
        skip();
    }
    atomic_store(&g_ref_set, false);
    atomic_store(&g_ref_buffered_bytes, 0);
    atomic_store(&g_ref_direct_after, 0);
    tv__sys.pread = pread_refuse_direct;
    import_counting(f, f->sharded, 1);
    int refused = atomic_load(&g_calls);
    hooks_reset();
    assert_true(refused >= 1);
    assert_true(atomic_load(&g_ref_set));
    /* the refused shard: no O_DIRECT read after the refusal, and every byte
     * from the refused read's offset to its end read buffered */
    struct stat sb, sb2;
    assert_int_equal(stat(f->shard1, &sb), 0);
    assert_int_equal(stat(f->shard2, &sb2), 0);
    if (sb.st_dev != g_ref_dev || sb.st_ino != g_ref_ino)
        sb = sb2;
    assert_true(sb.st_dev == g_ref_dev && sb.st_ino == g_ref_ino);
    assert_int_equal(atomic_load(&g_ref_direct_after), 0);
    assert_true(g_ref_off < sb.st_size);
    assert_true(atomic_load(&g_ref_buffered_bytes) >= (long long)(sb.st_size - g_ref_off));
    assert_unchanged(f, 1, 2);
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
        cmocka_unit_test_setup_teardown(test_source_data_rewritten, setup, teardown),
        cmocka_unit_test_setup_teardown(test_source_truncate_restored, setup, teardown),
        cmocka_unit_test_setup_teardown(test_source_renamed_over, setup, teardown),
        cmocka_unit_test_setup_teardown(test_source_writer_opens, setup, teardown),
        cmocka_unit_test_setup_teardown(test_source_changed_after_validation, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dedup_source_data_rewritten, setup, teardown),
        cmocka_unit_test_setup_teardown(test_region_full, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failure_keeps_active_generation, setup, teardown),
        cmocka_unit_test_setup_teardown(test_publish_failure, setup, teardown),
        cmocka_unit_test_setup_teardown(test_name_rule, NULL, NULL),
        cmocka_unit_test_setup_teardown(test_held_source, setup, teardown),
        cmocka_unit_test_setup_teardown(test_import_bad_name, setup, teardown),
        cmocka_unit_test_setup_teardown(test_import_chunk_overflow, setup, teardown),
        cmocka_unit_test_setup_teardown(test_strict_corrupt_readback, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dedup_second_import, setup, teardown),
        cmocka_unit_test_setup_teardown(test_progress_every_step, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cancel_every_step, setup, teardown),
        cmocka_unit_test_setup_teardown(test_source_cold_direct, setup, teardown),
        cmocka_unit_test_setup_teardown(test_source_cached_buffered, setup, teardown),
        cmocka_unit_test_setup_teardown(test_source_direct_refused, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
