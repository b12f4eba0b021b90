/* Unit tests of the store directory (server/store/store.c) on file images:
 * device claim safety (another store's label, data in the region, the same
 * image under another name), what a failed init leaves behind, the lock file
 * (FIFO, symlink, directory), read-only opens that never create or migrate
 * the registry, an empty or corrupt registry, EIO on a label read (store
 * and reader), and
 * ENOSPC when creating the image, registry or lock (injected through
 * tv__sys). The syscall table is restored after each case. */
#include <errno.h>
#include <fcntl.h>
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
#include <sqlite3.h>

#include "dev/dev.h"
#include "import/import.h"
#include "store/store.h"
#include "tensorvault/tensorvault.h"
#include "registry/registry.h"
#include "util/sys.h"
#include "tv_test.h"

#define MiB (1024ull * 1024ull)

typedef struct fixture {
    char dir[128];
    char store[256], image[256], other_store[256], other_image[256];
} fixture;

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof(*f));
    assert_non_null(f);
    tv_test_tmpdir(f->dir, sizeof f->dir, "store");
    snprintf(f->store, sizeof f->store, "%s/s", f->dir);
    snprintf(f->image, sizeof f->image, "%s/s.img", f->dir);
    snprintf(f->other_store, sizeof f->other_store, "%s/o", f->dir);
    snprintf(f->other_image, sizeof f->other_image, "%s/o.img", f->dir);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    tv__sys_reset();
    tv_test_rmtree(f->dir);
    free(f);
    return 0;
}

static bool exists(const char *dir, const char *name)
{
    char p[512];
    struct stat sb;
    snprintf(p, sizeof p, "%s%s%s", dir, name ? "/" : "", name ? name : "");
    return lstat(p, &sb) == 0;
}

static int init_image(const char *store, const char *image, uint64_t size, bool force,
                      tv_error *err)
{
    tv__store_init_opts o = {.image = image, .image_size_bytes = size, .force = force};
    return tv__store_init(store, &o, NULL, err);
}

static int init_device(const char *store, const char *dev, bool force, tv_error *err)
{
    tv__store_init_opts o = {.device = dev, .force = force};
    return tv__store_init(store, &o, NULL, err);
}

static void write_at(const char *path, uint64_t off, const void *buf, size_t len)
{
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, buf, len, (off_t)off), (ssize_t)len);
    close(fd);
}

/* ---- claim safety ------------------------------------------------------ */

static void test_other_stores_image_is_refused_without_force(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    assert_int_equal(init_image(f->other_store, f->other_image, 64 * MiB, false, &err), 0);
    /* Our store takes the other store's image as a device: refused. */
    assert_int_equal(init_image(f->store, f->image, 64 * MiB, false, &err), 0);
    memset(&err, 0, sizeof err);
    assert_int_equal(init_device(f->store, f->other_image, false, &err), TV_E_DEVICE_IN_USE);
    assert_non_null(strstr(err.msg, "label of tensorvault store"));
    assert_non_null(strstr(err.msg, "--force"));
    /* And through --image on the existing file. */
    assert_int_equal(init_image(f->store, f->other_image, 64 * MiB, false, &err),
                     TV_E_DEVICE_IN_USE);
    /* A new store directory is not left behind. */
    char fresh[300];
    snprintf(fresh, sizeof fresh, "%s/fresh", f->dir);
    assert_int_equal(init_device(fresh, f->other_image, false, &err), TV_E_DEVICE_IN_USE);
    assert_false(exists(fresh, NULL));
    /* The other store still opens its device. */
    tv__store *st = NULL;
    tv__dev *d = NULL;
    assert_int_equal(tv__store_open(f->other_store, 0, &st, &err), 0);
    assert_int_equal(tv__store_device(st, 1, false, &d, &err), 0);
    tv__store_close(st);
    /* --force overwrites it. */
    assert_int_equal(init_device(f->store, f->other_image, true, &err), 0);
    assert_int_equal(tv__store_open(f->other_store, 0, &st, &err), 0);
    assert_int_equal(tv__store_device(st, 1, false, &d, &err), TV_E_DEVICE_MISMATCH);
    tv__store_close(st);
}

static void test_data_in_region_is_refused(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    static const uint64_t where[] = {1 * MiB + 4096 + 17, /* the label block's tail */
                                     5 * MiB,             /* first edge */
                                     700 * MiB + 12345,   /* middle: a data extent */
                                     1024 * MiB - 1};     /* last byte */
    for (size_t i = 0; i < TV_ARRAY_LEN(where); i++) {
        unlink(f->image);
        int fd = open(f->image, O_RDWR | O_CREAT | O_EXCL, 0600);
        assert_true(fd >= 0);
        assert_int_equal(ftruncate(fd, (off_t)(1024 * MiB)), 0);
        close(fd);
        write_at(f->image, where[i], "x", 1);
        memset(&err, 0, sizeof err);
        assert_int_equal(init_device(f->store, f->image, false, &err), TV_E_DEVICE_IN_USE);
        char want[64];
        snprintf(want, sizeof want, "non-zero data at offset %llu", (unsigned long long)where[i]);
        if (!strstr(err.msg, want))
            fail_msg("case %zu: %s", i, err.msg);
        assert_false(exists(f->store, NULL));
    }
    /* Bytes before the region (a partition table) are not the region's. */
    unlink(f->image);
    int fd = open(f->image, O_RDWR | O_CREAT | O_EXCL, 0600);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, (off_t)(64 * MiB)), 0);
    close(fd);
    write_at(f->image, 512, "GPT", 3);
    assert_int_equal(init_device(f->store, f->image, false, &err), 0);
}

static void test_scan_is_bounded(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    /* A 64 GiB sparse image with one dense 4 MiB extent of zeros in the
     * middle: the scan reads the head, the edges, the samples and one window
     * per extent, far less than the device. */
    const uint64_t size = 64ull << 30;
    int fd = open(f->image, O_RDWR | O_CREAT | O_EXCL, 0600);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, (off_t)size), 0);
    assert_int_equal(posix_fallocate(fd, (off_t)(size / 2 + 12345 * 4096ull), (off_t)(4 * MiB)), 0);
    close(fd);
    tv__dev *d = NULL;
    assert_int_equal(tv__dev_open(f->image, TV__DEV_O_RDONLY, &d, &err), 0);
    tv__dev_scan s;
    assert_int_equal(tv__dev_claim_scan(d, MiB, size - MiB, &s, &err), 0);
    assert_false(s.label);
    assert_false(s.nonzero);
    uint64_t cap = TV__DEV_SCAN_HEAD + 2 * TV__DEV_SCAN_EDGE +
                   (TV__DEV_SCAN_SAMPLES + TV__DEV_SCAN_EXTENTS) * TV__DEV_SCAN_WINDOW;
    assert_true(s.bytes_read <= cap);
    assert_true(s.bytes_read >= TV__DEV_SCAN_HEAD + 2 * TV__DEV_SCAN_EDGE);
    tv__dev_close(d);
    /* One byte in that extent is found (SEEK_DATA), though no sample or
     * edge covers it. */
    const uint64_t at = size / 2 + 12345 * 4096ull + 4096 + 7;
    write_at(f->image, at, "z", 1);
    assert_int_equal(tv__dev_open(f->image, TV__DEV_O_RDONLY, &d, &err), 0);
    assert_int_equal(tv__dev_claim_scan(d, MiB, size - MiB, &s, &err), 0);
    tv__dev_close(d);
    assert_true(s.nonzero);
    assert_int_equal(s.nonzero_off, at);
}

static void test_same_image_under_other_names(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    assert_int_equal(init_image(f->store, f->image, 64 * MiB, false, &err), 0);
    char hard[300], sym[300];
    snprintf(hard, sizeof hard, "%s/hardlink.img", f->dir);
    snprintf(sym, sizeof sym, "%s/symlink.img", f->dir);
    assert_int_equal(link(f->image, hard), 0);
    assert_int_equal(symlink(f->image, sym), 0);
    /* Refused by identity even with --force: it is this store's device. */
    memset(&err, 0, sizeof err);
    assert_int_equal(init_device(f->store, hard, true, &err), -EEXIST);
    assert_non_null(strstr(err.msg, "already device 1"));
    assert_int_equal(init_device(f->store, sym, true, &err), -EEXIST);
    /* The image moved: its old path is gone, the identity recorded in the
     * registry still recognises it. */
    char moved[300];
    snprintf(moved, sizeof moved, "%s/moved.img", f->dir);
    assert_int_equal(rename(hard, moved), 0);
    assert_int_equal(unlink(f->image), 0);
    memset(&err, 0, sizeof err);
    assert_int_equal(init_device(f->store, moved, true, &err), -EEXIST);
    assert_non_null(strstr(err.msg, "already device 1"));
}

/* A registered image deleted, then a new image created (often on the same
 * inode number): the new one is not mistaken for the old. */
static void test_new_image_on_reused_inode(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    assert_int_equal(init_image(f->store, f->image, 64 * MiB, false, &err), 0);
    struct stat old, now;
    assert_int_equal(stat(f->image, &old), 0);
    assert_int_equal(unlink(f->image), 0);
    assert_int_equal(init_image(f->store, f->other_image, 64 * MiB, false, &err), 0);
    assert_int_equal(stat(f->other_image, &now), 0);
    print_message("inode %s\n", old.st_ino == now.st_ino ? "reused" : "not reused");
}

static void test_claim_keys(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    assert_int_equal(tv__dev_create_image(f->image, 4 * MiB, &err), 0);
    char hard[300];
    snprintf(hard, sizeof hard, "%s/h.img", f->dir);
    assert_int_equal(link(f->image, hard), 0);
    assert_int_equal(tv__dev_create_image(f->other_image, 4 * MiB, &err), 0);
    tv__dev *a = NULL, *b = NULL, *c = NULL;
    assert_int_equal(tv__dev_open(f->image, TV__DEV_O_RDONLY, &a, &err), 0);
    assert_int_equal(tv__dev_open(hard, TV__DEV_O_RDONLY, &b, &err), 0);
    assert_int_equal(tv__dev_open(f->other_image, TV__DEV_O_RDONLY, &c, &err), 0);
    tv__dev_claim ka, kb, kc;
    assert_int_equal(tv__dev_claim_keys(a, &ka, &err), 0);
    assert_int_equal(tv__dev_claim_keys(b, &kb, &err), 0);
    assert_int_equal(tv__dev_claim_keys(c, &kc, &err), 0);
    assert_int_equal(ka.n_keys, 1);
    assert_true(!strncmp(ka.keys[0], "file:", 5));
    assert_true(tv__dev_claim_same(&ka, &kb));
    assert_false(tv__dev_claim_same(&ka, &kc));
    tv__dev_close(a);
    tv__dev_close(b);
    tv__dev_close(c);
}

/* ---- what init leaves ---------------------------------------------------- */

static void test_failed_init_leaves_nothing(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    char missing[300];
    snprintf(missing, sizeof missing, "%s/no-such-device", f->dir);
    assert_int_equal(init_device(f->store, missing, false, &err), -ENOENT);
    assert_false(exists(f->store, NULL));
    /* An existing directory stays, empty. */
    assert_int_equal(mkdir(f->store, 0700), 0);
    assert_int_equal(init_device(f->store, missing, false, &err), -ENOENT);
    assert_true(exists(f->store, NULL));
    assert_false(exists(f->store, "registry.db"));
    assert_false(exists(f->store, "registry.db-wal"));
    assert_false(exists(f->store, "lock"));
    /* A created image is removed too (region too small for the label). */
    tv__store_init_opts o = {.image = f->image, .image_size_bytes = 1 * MiB};
    assert_true(tv__store_init(f->store, &o, NULL, &err) != 0);
    assert_false(exists(f->image, NULL));
    assert_false(exists(f->store, "registry.db"));
    /* An image that existed before is never removed. */
    int fd = open(f->image, O_RDWR | O_CREAT, 0600);
    assert_int_equal(ftruncate(fd, (off_t)(2 * MiB)), 0);
    close(fd);
    assert_true(tv__store_init(f->store, &o, NULL, &err) != 0);
    assert_true(exists(f->image, NULL));
    /* Adding a device to an existing store that fails keeps the store. */
    assert_int_equal(init_image(f->store, f->other_image, 64 * MiB, false, &err), 0);
    assert_int_equal(init_device(f->store, missing, false, &err), -ENOENT);
    assert_true(exists(f->store, "registry.db"));
    assert_true(exists(f->store, "lock"));
}

static void test_store_dir_is_0700(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    mode_t old = umask(0);
    int rc = init_image(f->store, f->image, 64 * MiB, false, &err);
    umask(old);
    assert_int_equal(rc, 0);
    struct stat sb;
    assert_int_equal(stat(f->store, &sb), 0);
    assert_int_equal(sb.st_mode & 0777, 0700);
    assert_int_equal(stat(f->image, &sb), 0);
    assert_int_equal(sb.st_mode & 0777, 0600);
}

static void test_image_symlink_not_followed(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    char target[300];
    snprintf(target, sizeof target, "%s/target", f->dir);
    assert_int_equal(symlink(target, f->image), 0);
    assert_true(init_image(f->store, f->image, 64 * MiB, false, &err) != 0);
    assert_false(exists(target, NULL)); /* nothing created through the link */
    /* A registered image replaced by a symlink is not opened through it. */
    unlink(f->image);
    assert_int_equal(init_image(f->store, f->image, 64 * MiB, false, &err), 0);
    assert_int_equal(rename(f->image, target), 0);
    assert_int_equal(symlink(target, f->image), 0);
    tv__store *st = NULL;
    tv__dev *d = NULL;
    assert_int_equal(tv__store_open(f->store, 0, &st, &err), 0);
    assert_int_equal(tv__store_device(st, 1, false, &d, &err), -ELOOP);
    assert_non_null(strstr(err.msg, "symlink"));
    tv__store_close(st);
}

/* ---- the lock ------------------------------------------------------------ */

static void test_lock_not_regular(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    tv__store *st = NULL;
    assert_int_equal(init_image(f->store, f->image, 64 * MiB, false, &err), 0);
    char lock[300], target[300];
    snprintf(lock, sizeof lock, "%s/lock", f->store);
    snprintf(target, sizeof target, "%s/victim", f->dir);
    /* A FIFO: refused at once (the open does not block), not truncated. */
    assert_int_equal(unlink(lock), 0);
    assert_int_equal(mkfifo(lock, 0600), 0);
    memset(&err, 0, sizeof err);
    assert_int_equal(tv__store_open(f->store, TV__STORE_WRITE, &st, &err), TV_E_INVALID_ARG);
    assert_non_null(strstr(err.msg, "not a regular file"));
    assert_non_null(strstr(err.msg, lock));
    /* A symlink: never followed, the target is left alone. */
    assert_int_equal(unlink(lock), 0);
    int fd = open(target, O_RDWR | O_CREAT, 0600);
    assert_int_equal(write(fd, "keep", 4), 4);
    close(fd);
    assert_int_equal(symlink(target, lock), 0);
    assert_int_equal(tv__store_open(f->store, TV__STORE_WRITE, &st, &err), -ELOOP);
    assert_non_null(strstr(err.msg, "symlink"));
    struct stat sb;
    assert_int_equal(stat(target, &sb), 0);
    assert_int_equal(sb.st_size, 4);
    /* A directory. */
    assert_int_equal(unlink(lock), 0);
    assert_int_equal(mkdir(lock, 0700), 0);
    assert_true(tv__store_open(f->store, TV__STORE_WRITE, &st, &err) != 0);
    assert_null(st);
    /* Readers never touch the lock. */
    assert_int_equal(tv__store_open(f->store, 0, &st, &err), 0);
    tv__store_close(st);
}

/* ---- the registry --------------------------------------------------------- */

static void test_reader_never_creates_registry(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    tv__store *st = NULL;
    assert_int_equal(mkdir(f->store, 0700), 0);
    assert_int_equal(tv__store_open(f->store, 0, &st, &err), TV_E_NOT_FOUND);
    assert_int_equal(tv__store_open(f->store, TV__STORE_WRITE, &st, &err), TV_E_NOT_FOUND);
    assert_false(exists(f->store, "registry.db"));
    assert_false(exists(f->store, "lock"));
}

static void test_registry_missing_empty_corrupt(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    tv__store *st = NULL;
    char reg[300];
    snprintf(reg, sizeof reg, "%s/registry.db", f->store);
    assert_int_equal(init_image(f->store, f->image, 64 * MiB, false, &err), 0);
    /* Missing in a store directory (it has a lock). */
    assert_int_equal(unlink(reg), 0);
    for (unsigned fl = 0; fl <= TV__STORE_WRITE; fl += TV__STORE_WRITE) {
        memset(&err, 0, sizeof err);
        assert_int_equal(tv__store_open(f->store, fl, &st, &err), TV_E_REGISTRY);
        assert_non_null(strstr(err.msg, reg));
        assert_non_null(strstr(err.msg, "missing"));
    }
    assert_false(exists(reg, NULL));
    /* store init does not start a new store over it either (the directory
     * has a store's lock, or its snapshots/). */
    assert_int_equal(init_image(f->store, f->other_image, 64 * MiB, false, &err), TV_E_REGISTRY);
    char lock[300], snaps[300];
    snprintf(lock, sizeof lock, "%s/lock", f->store);
    snprintf(snaps, sizeof snaps, "%s/snapshots", f->store);
    assert_int_equal(unlink(lock), 0);
    assert_int_equal(mkdir(snaps, 0700), 0);
    assert_int_equal(init_image(f->store, f->other_image, 64 * MiB, false, &err), TV_E_REGISTRY);
    assert_false(exists(reg, NULL));
    assert_false(exists(f->other_image, NULL));
    /* Empty: an error naming the file, not a new registry. */
    int fd = open(reg, O_RDWR | O_CREAT, 0600);
    close(fd);
    for (unsigned fl = 0; fl <= TV__STORE_WRITE; fl += TV__STORE_WRITE) {
        memset(&err, 0, sizeof err);
        assert_int_equal(tv__store_open(f->store, fl, &st, &err), TV_E_REGISTRY);
        assert_non_null(strstr(err.msg, reg));
        assert_non_null(strstr(err.msg, "empty"));
    }
    struct stat sb;
    assert_int_equal(stat(reg, &sb), 0);
    assert_int_equal(sb.st_size, 0);
    /* Corrupt: not an SQLite database. */
    char junk[8192];
    memset(junk, 'J', sizeof junk);
    write_at(reg, 0, junk, sizeof junk);
    for (unsigned fl = 0; fl <= TV__STORE_WRITE; fl += TV__STORE_WRITE) {
        memset(&err, 0, sizeof err);
        assert_int_equal(tv__store_open(f->store, fl, &st, &err), TV_E_REGISTRY);
        assert_non_null(strstr(err.msg, reg));
        assert_non_null(strstr(err.msg, "corrupt or not an SQLite database"));
    }
}

static void test_reader_never_migrates(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    tv__store *st = NULL;
    char reg[300];
    snprintf(reg, sizeof reg, "%s/registry.db", f->store);
    assert_int_equal(mkdir(f->store, 0700), 0);
    /* A valid SQLite database without the schema (user_version 0). */
    sqlite3 *db = NULL;
    assert_int_equal(sqlite3_open(reg, &db), SQLITE_OK);
    assert_int_equal(sqlite3_exec(db, "CREATE TABLE x(a)", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
    struct stat before, after;
    assert_int_equal(stat(reg, &before), 0);
    memset(&err, 0, sizeof err);
    assert_int_equal(tv__store_open(f->store, 0, &st, &err), TV_E_REGISTRY);
    assert_non_null(strstr(err.msg, "no tensorvault schema"));
    assert_int_equal(stat(reg, &after), 0);
    assert_int_equal(before.st_size, after.st_size);
    assert_int_equal(before.st_mtim.tv_nsec, after.st_mtim.tv_nsec);
    /* A reader of a good store writes nothing either. */
    assert_int_equal(unlink(reg), 0);
    assert_int_equal(rmdir(f->store), 0);
    assert_int_equal(init_image(f->store, f->image, 64 * MiB, false, &err), 0);
    assert_int_equal(stat(reg, &before), 0);
    assert_int_equal(tv__store_open(f->store, 0, &st, &err), 0);
    tv__reg_device *devs = NULL;
    size_t n = 0;
    assert_int_equal(tv__reg_device_list(st->reg, &devs, &n, &err), 0);
    assert_int_equal(n, 1);
    free(devs);
    tv__store_close(st);
    assert_int_equal(stat(reg, &after), 0);
    assert_int_equal(before.st_mtim.tv_sec, after.st_mtim.tv_sec);
    assert_int_equal(before.st_mtim.tv_nsec, after.st_mtim.tv_nsec);
}

/* ---- faults ---------------------------------------------------------------- */

static uint64_t g_fail_off;
static int g_fail_errno;
static ssize_t pread_fail_at(int fd, void *buf, size_t len, off_t off)
{
    if ((uint64_t)off == g_fail_off) {
        errno = g_fail_errno;
        return -1;
    }
    return pread(fd, buf, len, off);
}

static void test_label_eio_is_io_error(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    tv__store *st = NULL;
    tv__dev *d = NULL;
    assert_int_equal(init_image(f->store, f->image, 64 * MiB, false, &err), 0);
    assert_int_equal(tv__store_open(f->store, 0, &st, &err), 0);
    g_fail_off = MiB; /* the label block */
    g_fail_errno = EIO;
    tv__sys.pread = pread_fail_at;
    memset(&err, 0, sizeof err);
    assert_int_equal(tv__store_device(st, 1, false, &d, &err), -EIO);
    assert_non_null(strstr(err.msg, "device 1"));
    assert_non_null(strstr(err.msg, f->image));
    assert_null(strstr(err.msg, "unreadable"));
    /* Once the fault is gone the device opens. */
    tv__sys_reset();
    assert_int_equal(tv__store_device(st, 1, false, &d, &err), 0);
    tv__store_close(st);
}

/* The reader (tv_model_open) keeps an EIO on the label an I/O error too. */
static void test_reader_label_eio_is_io_error(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    assert_int_equal(init_image(f->store, f->image, 64 * MiB, false, &err), 0);
    /* A one-tensor checkpoint: header {"t": U8 [8]} padded to 8 bytes. */
    char ckpt[300];
    snprintf(ckpt, sizeof ckpt, "%s/model.safetensors", f->dir);
    const char hdr[] = "{\"t\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]}}";
    size_t hl = (sizeof hdr - 1 + 7) / 8 * 8;
    uint8_t buf[256] = {0};
    for (int i = 0; i < 8; i++)
        buf[i] = (uint8_t)(hl >> (8 * i));
    memset(buf + 8, ' ', hl);
    memcpy(buf + 8, hdr, sizeof hdr - 1);
    memcpy(buf + 8 + hl, "ABCDEFGH", 8);
    int fd = open(ckpt, O_RDWR | O_CREAT | O_EXCL, 0600);
    assert_int_equal(write(fd, buf, 16 + hl), (ssize_t)(16 + hl));
    close(fd);
    tv__store *st = NULL;
    assert_int_equal(tv__store_open(f->store, TV__STORE_WRITE, &st, &err), 0);
    tv__import_opts io = {.activate = true};
    tv__import_result res;
    if (tv__import(st, "m", ckpt, &io, &res, &err))
        fail_msg("import: %s", err.msg);
    tv__store_close(st);
    tv_model *m = NULL;
    assert_int_equal(tv_model_open(f->store, "m", NULL, &m, &err), 0);
    tv_model_close(m);
    m = NULL;
    g_fail_off = MiB;
    g_fail_errno = EIO;
    tv__sys.pread = pread_fail_at;
    memset(&err, 0, sizeof err);
    assert_int_equal(tv_model_open(f->store, "m", NULL, &m, &err), -EIO);
    tv__sys_reset();
    assert_null(m);
    assert_non_null(strstr(err.msg, f->image));
    assert_null(strstr(err.msg, "unreadable"));
}

static const char *g_enospc_suffix;
static int open_enospc(const char *path, int flags, mode_t mode)
{
    size_t n = strlen(path), k = strlen(g_enospc_suffix);
    if ((flags & O_CREAT) && n >= k && !strcmp(path + n - k, g_enospc_suffix)) {
        errno = ENOSPC;
        return -1;
    }
    return open(path, flags, mode);
}
static int ftruncate_enospc(int fd, off_t len)
{
    if (len == 0) /* the lock's truncate before the pid */
        return ftruncate(fd, len);
    errno = ENOSPC;
    return -1;
}
static ssize_t pwrite_enospc(int fd, const void *buf, size_t len, off_t off)
{
    (void)fd, (void)buf, (void)len, (void)off;
    errno = ENOSPC;
    return -1;
}

static void test_enospc_says_so(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    static const char *const which[] = {"/registry.db", "/lock", "/s.img"};
    for (size_t i = 0; i < TV_ARRAY_LEN(which); i++) {
        g_enospc_suffix = which[i];
        tv__sys.open = open_enospc;
        memset(&err, 0, sizeof err);
        assert_int_equal(init_image(f->store, f->image, 64 * MiB, false, &err), -ENOSPC);
        tv__sys_reset();
        if (!strstr(err.msg, "no space left"))
            fail_msg("%s: %s", which[i], err.msg);
        assert_false(exists(f->store, NULL));
        assert_false(exists(f->image, NULL));
    }
    /* The image's ftruncate, and the pid written into the lock. */
    tv__sys.ftruncate = ftruncate_enospc;
    assert_int_equal(mkdir(f->store, 0700), 0);
    assert_int_equal(init_image(f->store, f->image, 64 * MiB, false, &err), -ENOSPC);
    assert_non_null(strstr(err.msg, "no space left"));
    assert_non_null(strstr(err.msg, f->image));
    tv__sys_reset();
    assert_false(exists(f->image, NULL));
    assert_false(exists(f->store, "registry.db"));
    tv__sys.pwrite = pwrite_enospc;
    assert_int_equal(init_image(f->store, f->image, 64 * MiB, false, &err), -ENOSPC);
    assert_non_null(strstr(err.msg, "no space left on the store's filesystem"));
    tv__sys_reset();
    assert_true(exists(f->store, NULL)); /* it existed before */
    assert_false(exists(f->store, "lock"));
    /* SQLite's "database or disk is full" is a full filesystem too. */
    assert_int_equal(init_image(f->store, f->image, 64 * MiB, false, &err), 0);
    tv__store *st = NULL;
    assert_int_equal(tv__store_open(f->store, TV__STORE_WRITE, &st, &err), 0);
    sqlite3 *db = tv__reg_sqlite(st->reg);
    assert_int_equal(sqlite3_exec(db, "PRAGMA max_page_count = 1", NULL, NULL, NULL), SQLITE_OK);
    /* Use up the free list first (migrations that drop tables leave free
     * pages behind): then a new page is needed and refused. */
    int full = SQLITE_OK;
    for (int i = 0; i < 1000 && full == SQLITE_OK; i++) {
        char sql[64];
        snprintf(sql, sizeof sql, "CREATE TABLE big%d(a)", i);
        full = sqlite3_exec(db, sql, NULL, NULL, NULL);
    }
    assert_int_equal(full, SQLITE_FULL);
    tv__reg_device row = {0};
    assert_int_equal(tv__reg_device_get(st->reg, 1, &row, &err), 0);
    snprintf(row.uuid, sizeof row.uuid, "00000000-0000-4000-8000-000000000001");
    memset(row.path, 'a', 4000); /* a row that needs a new page */
    row.path[0] = '/';
    row.path[4000] = '\0';
    memset(&err, 0, sizeof err);
    assert_int_equal(tv__reg_device_add(st->reg, &row, NULL, &err), -ENOSPC);
    assert_non_null(strstr(err.msg, "no space left on the store's filesystem"));
    tv__store_close(st);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_other_stores_image_is_refused_without_force, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_data_in_region_is_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_scan_is_bounded, setup, teardown),
        cmocka_unit_test_setup_teardown(test_same_image_under_other_names, setup, teardown),
        cmocka_unit_test_setup_teardown(test_claim_keys, setup, teardown),
        cmocka_unit_test_setup_teardown(test_new_image_on_reused_inode, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failed_init_leaves_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_store_dir_is_0700, setup, teardown),
        cmocka_unit_test_setup_teardown(test_image_symlink_not_followed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lock_not_regular, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reader_never_creates_registry, setup, teardown),
        cmocka_unit_test_setup_teardown(test_registry_missing_empty_corrupt, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reader_never_migrates, setup, teardown),
        cmocka_unit_test_setup_teardown(test_label_eio_is_io_error, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reader_label_eio_is_io_error, setup, teardown),
        cmocka_unit_test_setup_teardown(test_enospc_says_so, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
