/* Unit tests of snapshot files in a store directory
 * (core/src/snap/snapfile.c): model-name escaping (HF names with '/',
 * "../x", control bytes, the hashed form of long names), atomic immutable
 * writes, the active pointer, alias pointers (rule, read/write, list,
 * open through one, model directory removal), the shared-flock reader
 * lease against gc's exclusive try (flock locks belong to open file descriptions, so a second
 * open() in this process conflicts like another process would), removal
 * under the lock (including a reader that opened just before the unlink),
 * injected write and flush failures, leftover temporary files, the pointer
 * parser, and safe opening (a symbolic link, FIFO or directory in place of
 * a file, a linked model or snapshots directory). */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <signal.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "snap/snapfile.h"
#include "snap/snapshot.h"
#include "util/sys.h"
#include "tv_test.h"

static char g_dir[256];

static int setup(void **state)
{
    (void)state;
    tv_test_tmpdir(g_dir, sizeof g_dir, "snapfile");
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    tv_test_fault_reset();
    tv_test_rmtree(g_dir);
    return 0;
}

static void expect_escape(const char *model, const char *want)
{
    char out[TV__SNAPFILE_ESCAPED_MAX + 1];
    tv_error err = {0};
    assert_int_equal(tv__snapfile_escape(model, out, sizeof out, &err), 0);
    assert_string_equal(out, want);
}

static bool exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

static void test_escape(void **state)
{
    (void)state;
    expect_escape("org/name", "org%2Fname");
    expect_escape("../x", "%2E.%2Fx");
    expect_escape(".", "%2E");
    expect_escape("..", "%2E.");
    expect_escape("a.b", "a.b");
    expect_escape("100%", "100%25");
    expect_escape("a\nb\x7f", "a%0Ab%7F");
    expect_escape("meta-llama/Llama-3.1-8B", "meta-llama%2FLlama-3.1-8B");
    expect_escape("caf\xc3\xa9", "caf\xc3\xa9"); /* UTF-8 kept */
    /* Distinct names stay distinct: "%2F" literally vs "/". */
    expect_escape("a%2Fb", "a%252Fb");

    /* Long names: hashed form, bounded, distinct, never splitting %XX. */
    char a[256], b[256], oa[TV__SNAPFILE_ESCAPED_MAX + 1], ob[TV__SNAPFILE_ESCAPED_MAX + 1];
    memset(a, '/', 255);
    a[255] = '\0';
    memcpy(b, a, sizeof b);
    b[254] = 'x';
    assert_int_equal(tv__snapfile_escape(a, oa, sizeof oa, NULL), 0);
    assert_int_equal(tv__snapfile_escape(b, ob, sizeof ob, NULL), 0);
    assert_true(strlen(oa) <= TV__SNAPFILE_ESCAPED_MAX);
    assert_non_null(strstr(oa, "%~"));
    assert_string_not_equal(oa, ob);
    assert_int_equal((strstr(oa, "%~") - oa) % 3, 0);
    char c[300];
    memset(c, 'q', 299);
    c[299] = '\0';
    assert_int_equal(tv__snapfile_escape(c, oa, sizeof oa, NULL), 0);
    assert_int_equal(strlen(oa), 128 + 2 + 64);
    /* Exactly at the limit: plain. */
    memset(c, 'q', TV__SNAPFILE_ESCAPED_MAX);
    c[TV__SNAPFILE_ESCAPED_MAX] = '\0';
    assert_int_equal(tv__snapfile_escape(c, oa, sizeof oa, NULL), 0);
    assert_string_equal(oa, c);

    tv_error err = {0};
    assert_int_equal(tv__snapfile_escape("", oa, sizeof oa, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv__snapfile_escape(NULL, oa, sizeof oa, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv__snapfile_escape("org/name", oa, 10, &err), -ENAMETOOLONG);
}

static void test_paths(void **state)
{
    (void)state;
    char p[TV__SNAPFILE_PATH_MAX], want[TV__SNAPFILE_PATH_MAX];
    tv_error err = {0};
    assert_int_equal(tv__snapfile_path(g_dir, "org/name", 3, p, sizeof p, &err), 0);
    snprintf(want, sizeof want, "%s/snapshots/org%%2Fname/3.tvsnap", g_dir);
    assert_string_equal(p, want);
    assert_int_equal(tv__snapfile_active_path(g_dir, "org/name", p, sizeof p, &err), 0);
    snprintf(want, sizeof want, "%s/snapshots/org%%2Fname/active", g_dir);
    assert_string_equal(p, want);
    assert_int_equal(tv__snapfile_model_dir(g_dir, "../x", p, sizeof p, &err), 0);
    snprintf(want, sizeof want, "%s/snapshots/%%2E.%%2Fx", g_dir);
    assert_string_equal(p, want);
    assert_int_equal(tv__snapfile_path(g_dir, "m", 0, p, sizeof p, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv__snapfile_path(g_dir, "m", -1, p, sizeof p, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv__snapfile_path(g_dir, "m", 1, p, 8, &err), -ENAMETOOLONG);
}

static void test_write_read(void **state)
{
    (void)state;
    static const char img[] = "not really a snapshot, but bytes";
    tv_error err = {0};
    bool ex = true;
    int fd = -1;
    void *buf = NULL;
    size_t len = 0;
    char p[TV__SNAPFILE_PATH_MAX];

    assert_int_equal(tv__snapfile_exists(g_dir, "org/name", 1, &ex, &err), 0);
    assert_false(ex);
    assert_int_equal(tv__snapfile_open(g_dir, "org/name", 1, &fd, &buf, &len, &err),
                     TV_E_NOT_FOUND);
    assert_int_equal(fd, -1);
    assert_null(buf);
    assert_int_equal(tv__snapfile_write(g_dir, "org/name", 1, img, sizeof img, &err), 0);
    assert_int_equal(tv__snapfile_exists(g_dir, "org/name", 1, &ex, &err), 0);
    assert_true(ex);
    assert_int_equal(tv__snapfile_path(g_dir, "org/name", 1, p, sizeof p, &err), 0);
    struct stat sb;
    assert_int_equal(stat(p, &sb), 0);
    assert_int_equal(sb.st_size, sizeof img);

    assert_int_equal(tv__snapfile_open(g_dir, "org/name", 1, &fd, &buf, &len, &err), 0);
    assert_true(fd >= 0);
    assert_int_equal(len, sizeof img);
    assert_memory_equal(buf, img, len);
    tv__snapfile_unmap(buf, len);
    close(fd);

    /* Immutable: a second write of the same generation is refused. */
    assert_int_equal(tv__snapfile_write(g_dir, "org/name", 1, "other", 5, &err), -EEXIST);
    assert_int_equal(stat(p, &sb), 0);
    assert_int_equal(sb.st_size, sizeof img);

    /* "../x" stays inside DIR/snapshots. */
    assert_int_equal(tv__snapfile_write(g_dir, "../x", 2, img, sizeof img, &err), 0);
    char outside[TV__SNAPFILE_PATH_MAX];
    snprintf(outside, sizeof outside, "%s/x", g_dir);
    assert_false(exists(outside));
    snprintf(outside, sizeof outside, "%s/snapshots/%%2E.%%2Fx/2.tvsnap", g_dir);
    assert_true(exists(outside));

    /* No temporary file left behind. */
    size_t n = 99;
    assert_int_equal(tv__snapfile_clean_temps(g_dir, "org/name", &n, &err), 0);
    assert_int_equal(n, 0);

    assert_int_equal(tv__snapfile_write(g_dir, "m", 1, NULL, 4, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv__snapfile_write(g_dir, "m", 1, img, 0, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv__snapfile_write(g_dir, "m", 0, img, 4, &err), TV_E_INVALID_ARG);
}

static void test_active(void **state)
{
    (void)state;
    tv_error err = {0};
    int64_t gen = 0;
    char p[TV__SNAPFILE_PATH_MAX];
    assert_int_equal(tv__snapfile_read_active(g_dir, "org/m", &gen, &err), TV_E_NOT_FOUND);
    assert_int_equal(tv__snapfile_write_active(g_dir, "org/m", 0, &err), 0); /* absent: fine */
    assert_int_equal(tv__snapfile_write_active(g_dir, "org/m", 5, &err), 0);
    assert_int_equal(tv__snapfile_read_active(g_dir, "org/m", &gen, &err), 0);
    assert_int_equal(gen, 5);
    assert_int_equal(tv__snapfile_write_active(g_dir, "org/m", 12345678901LL, &err), 0);
    assert_int_equal(tv__snapfile_read_active(g_dir, "org/m", &gen, &err), 0);
    assert_int_equal(gen, 12345678901LL);
    assert_int_equal(tv__snapfile_write_active(g_dir, "org/m", 0, &err), 0);
    assert_int_equal(tv__snapfile_read_active(g_dir, "org/m", &gen, &err), TV_E_NOT_FOUND);
    assert_int_equal(tv__snapfile_write_active(g_dir, "org/m", -1, &err), TV_E_INVALID_ARG);

    /* Malformed pointers. */
    assert_int_equal(tv__snapfile_write_active(g_dir, "org/m", 1, &err), 0);
    assert_int_equal(tv__snapfile_active_path(g_dir, "org/m", p, sizeof p, &err), 0);
    static const char *const bad[] = {
        "", "0", "0\n", "007\n", "abc", "12x", "12\n\n", "-3", "99999999999999999999\n", " 4"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        tv_test_write_text(p, bad[i]);
        assert_int_equal(tv__snapfile_read_active(g_dir, "org/m", &gen, &err), TV_E_SNAPSHOT);
    }
    tv_test_write_text(p, "42");
    assert_int_equal(tv__snapfile_read_active(g_dir, "org/m", &gen, &err), 0);
    assert_int_equal(gen, 42);
}

static void test_alias_pointers(void **state)
{
    (void)state;
    tv_error err = {0};
    int64_t gen = 0;
    char p[TV__SNAPFILE_PATH_MAX], want[TV__SNAPFILE_PATH_MAX];
    /* the rule */
    static const char *const good[] = {"prod", "a", "Canary-2", "x.y_z", "A9"};
    static const char *const badn[] = {"",   "active", "9",   "3x",  "_a",  ".a",
                                       "-a", "a b",    "a/b", "a@b", "a%b", NULL};
    for (size_t i = 0; i < TV_ARRAY_LEN(good); i++)
        assert_true(tv__snapfile_alias_valid(good[i]));
    for (size_t i = 0; i < TV_ARRAY_LEN(badn); i++)
        assert_false(tv__snapfile_alias_valid(badn[i]));
    char lng[80];
    memset(lng, 'a', 64);
    lng[64] = '\0';
    assert_true(tv__snapfile_alias_valid(lng));
    lng[64] = 'a';
    lng[65] = '\0';
    assert_false(tv__snapfile_alias_valid(lng));

    assert_int_equal(tv__snapfile_alias_path(g_dir, "org/m", "prod", p, sizeof p, &err), 0);
    snprintf(want, sizeof want, "%s/snapshots/org%%2Fm/alias.prod", g_dir);
    assert_string_equal(p, want);
    assert_int_equal(tv__snapfile_alias_path(g_dir, "org/m", "../x", p, sizeof p, &err), TV_E_NAME);
    assert_int_equal(tv__snapfile_read_alias(g_dir, "org/m", "prod", &gen, &err), TV_E_NOT_FOUND);
    assert_int_equal(tv__snapfile_write_alias(g_dir, "org/m", "prod", 0, &err), 0); /* absent */
    assert_int_equal(tv__snapfile_write_alias(g_dir, "org/m", "prod", 3, &err), 0);
    assert_int_equal(tv__snapfile_write_alias(g_dir, "org/m", "canary", 4, &err), 0);
    assert_int_equal(tv__snapfile_write_active(g_dir, "org/m", 4, &err), 0);
    assert_int_equal(tv__snapfile_read_alias(g_dir, "org/m", "prod", &gen, &err), 0);
    assert_int_equal(gen, 3);
    assert_int_equal(tv__snapfile_write_alias(g_dir, "org/m", "prod", 5, &err), 0);
    assert_int_equal(tv__snapfile_read_alias(g_dir, "org/m", "prod", &gen, &err), 0);
    assert_int_equal(gen, 5);
    assert_int_equal(tv__snapfile_read_active(g_dir, "org/m", &gen, &err), 0);
    assert_int_equal(gen, 4); /* separate files */
    assert_int_equal(tv__snapfile_write_alias(g_dir, "org/m", "prod", -1, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv__snapfile_write_alias(g_dir, "org/m", "active", 1, &err), TV_E_NAME);
    /* malformed, or with a "from" line (only the active pointer has one) */
    assert_int_equal(tv__snapfile_alias_path(g_dir, "org/m", "prod", p, sizeof p, &err), 0);
    tv_test_write_text(p, "7\nfrom 3\n");
    assert_int_equal(tv__snapfile_read_alias(g_dir, "org/m", "prod", &gen, &err), TV_E_SNAPSHOT);
    tv_test_write_text(p, "x");
    assert_int_equal(tv__snapfile_read_alias(g_dir, "org/m", "prod", &gen, &err), TV_E_SNAPSHOT);
    tv_test_write_text(p, "5\n");
    /* listing: names only, junk skipped */
    char junk[TV__SNAPFILE_PATH_MAX + 16];
    char md[TV__SNAPFILE_PATH_MAX];
    assert_int_equal(tv__snapfile_model_dir(g_dir, "org/m", md, sizeof md, &err), 0);
    snprintf(junk, sizeof junk, "%s/alias.9bad", md);
    tv_test_write_text(junk, "1\n");
    tv__snapfile_alias *list = NULL;
    size_t n = 0;
    assert_int_equal(tv__snapfile_list_aliases(g_dir, "org/m", &list, &n, &err), 0);
    assert_int_equal(n, 2);
    bool saw_prod = false, saw_canary = false;
    for (size_t i = 0; i < n; i++) {
        saw_prod |= !strcmp(list[i].name, "prod");
        saw_canary |= !strcmp(list[i].name, "canary");
    }
    assert_true(saw_prod && saw_canary);
    free(list);
    assert_int_equal(tv__snapfile_list_aliases(g_dir, "none", &list, &n, &err), 0);
    assert_int_equal(n, 0);
    assert_null(list);
    /* removal */
    assert_int_equal(tv__snapfile_write_alias(g_dir, "org/m", "canary", 0, &err), 0);
    assert_int_equal(tv__snapfile_read_alias(g_dir, "org/m", "canary", &gen, &err), TV_E_NOT_FOUND);

    /* the model directory goes whole, unless a reader holds a generation */
    assert_int_equal(tv__snapfile_write(g_dir, "org/m", 5, "five", 4, &err), 0);
    int fd = -1;
    void *buf = NULL;
    size_t len = 0;
    int64_t opened = 0;
    assert_int_equal(
        tv__snapfile_open_alias(g_dir, "org/m", "prod", &opened, &fd, &buf, &len, &err), 0);
    assert_int_equal(opened, 5);
    assert_memory_equal(buf, "five", 4);
    tv__snapfile_unmap(buf, len);
    int fd2 = 0;
    assert_int_equal(
        tv__snapfile_open_alias(g_dir, "org/m", "nope", &opened, &fd2, &buf, &len, &err),
        TV_E_NOT_FOUND);
    assert_int_equal(fd2, -1);
    assert_int_equal(tv__snapfile_remove_model(g_dir, "org/m", &err), TV_E_LEASED);
    close(fd);
    unlink(junk); /* not ours to remove: it would stop the rmdir */
    assert_int_equal(tv__snapfile_remove_model(g_dir, "org/m", &err), 0);
    struct stat sb;
    assert_int_equal(lstat(md, &sb), -1);
    assert_int_equal(tv__snapfile_remove_model(g_dir, "org/m", &err), 0); /* absent: fine */
    /* anything unknown in the directory is kept and reported */
    assert_int_equal(tv__snapfile_write_alias(g_dir, "org/m", "prod", 1, &err), 0);
    snprintf(junk, sizeof junk, "%s/notes.txt", md);
    tv_test_write_text(junk, "mine");
    assert_int_equal(tv__snapfile_remove_model(g_dir, "org/m", &err), -ENOTEMPTY);
    assert_true(exists(junk));
    assert_int_equal(tv__snapfile_read_alias(g_dir, "org/m", "prod", &gen, &err), TV_E_NOT_FOUND);
}

static void test_open_active(void **state)
{
    (void)state;
    tv_error err = {0};
    int fd = -1;
    void *buf = NULL;
    size_t len = 0;
    assert_int_equal(tv__snapfile_open(g_dir, "m", 0, &fd, &buf, &len, &err), TV_E_NOT_FOUND);
    assert_int_equal(tv__snapfile_write(g_dir, "m", 1, "one", 3, &err), 0);
    assert_int_equal(tv__snapfile_write(g_dir, "m", 2, "two!", 4, &err), 0);
    assert_int_equal(tv__snapfile_write_active(g_dir, "m", 2, &err), 0);
    assert_int_equal(tv__snapfile_open(g_dir, "m", 0, &fd, &buf, &len, &err), 0);
    assert_int_equal(len, 4);
    assert_memory_equal(buf, "two!", 4);
    tv__snapfile_unmap(buf, len);
    close(fd);
    /* A pointer to a missing file. */
    assert_int_equal(tv__snapfile_write_active(g_dir, "m", 3, &err), 0);
    assert_int_equal(tv__snapfile_open(g_dir, "m", 0, &fd, &buf, &len, &err), TV_E_NOT_FOUND);
    assert_int_equal(fd, -1);
    /* Not a regular file. */
    char p[TV__SNAPFILE_PATH_MAX];
    assert_int_equal(tv__snapfile_path(g_dir, "m", 3, p, sizeof p, &err), 0);
    assert_int_equal(mkdir(p, 0700), 0);
    assert_int_equal(tv__snapfile_open(g_dir, "m", 3, &fd, &buf, &len, &err), TV_E_SNAPSHOT);
    assert_int_equal(fd, -1);
    assert_int_equal(tv__snapfile_open(g_dir, "m", -1, &fd, &buf, &len, &err), TV_E_INVALID_ARG);
}

static void test_lease(void **state)
{
    (void)state;
    tv_error err = {0};
    int fd1 = -1, fd2 = -1;
    void *b1 = NULL, *b2 = NULL;
    size_t l1, l2;
    bool leased = true;
    assert_int_equal(tv__snapfile_try_exclusive(g_dir, "org/m", 4, &leased, &err), 0);
    assert_false(leased); /* no file */
    assert_int_equal(tv__snapfile_write(g_dir, "org/m", 4, "four", 4, &err), 0);
    assert_int_equal(tv__snapfile_try_exclusive(g_dir, "org/m", 4, &leased, &err), 0);
    assert_false(leased);

    /* Two readers share the lock. */
    assert_int_equal(tv__snapfile_open(g_dir, "org/m", 4, &fd1, &b1, &l1, &err), 0);
    assert_int_equal(tv__snapfile_open(g_dir, "org/m", 4, &fd2, &b2, &l2, &err), 0);
    assert_int_equal(tv__snapfile_try_exclusive(g_dir, "org/m", 4, &leased, &err), 0);
    assert_true(leased);
    assert_int_equal(tv__snapfile_remove(g_dir, "org/m", 4, &err), TV_E_LEASED);
    close(fd1);
    assert_int_equal(tv__snapfile_try_exclusive(g_dir, "org/m", 4, &leased, &err), 0);
    assert_true(leased);
    close(fd2);
    tv__snapfile_unmap(b1, l1);
    tv__snapfile_unmap(b2, l2);
    assert_int_equal(tv__snapfile_try_exclusive(g_dir, "org/m", 4, &leased, &err), 0);
    assert_false(leased);

    /* try_exclusive released its lock: a reader gets in. */
    assert_int_equal(tv__snapfile_open(g_dir, "org/m", 4, &fd1, &b1, &l1, &err), 0);
    close(fd1);
    tv__snapfile_unmap(b1, l1);

    assert_int_equal(tv__snapfile_remove(g_dir, "org/m", 4, &err), 0);
    bool ex = true;
    assert_int_equal(tv__snapfile_exists(g_dir, "org/m", 4, &ex, &err), 0);
    assert_false(ex);
    assert_int_equal(tv__snapfile_remove(g_dir, "org/m", 4, &err), 0); /* already gone */
    assert_int_equal(tv__snapfile_open(g_dir, "org/m", 4, &fd1, &b1, &l1, &err), TV_E_NOT_FOUND);
}

/* A reader that opened the file just before gc unlinked it (gc holding the
 * exclusive lock) must not use it once it gets its shared lock. */
typedef struct opener {
    int rc;
    int fd;
} opener;

static void *open_thread(void *arg)
{
    opener *o = arg;
    void *buf = NULL;
    size_t len = 0;
    o->rc = tv__snapfile_open(g_dir, "race", 1, &o->fd, &buf, &len, NULL);
    tv__snapfile_unmap(buf, len);
    return NULL;
}

static void test_reader_races_gc(void **state)
{
    (void)state;
    tv_error err = {0};
    char p[TV__SNAPFILE_PATH_MAX];
    assert_int_equal(tv__snapfile_write(g_dir, "race", 1, "bytes", 5, &err), 0);
    assert_int_equal(tv__snapfile_path(g_dir, "race", 1, p, sizeof p, &err), 0);
    int gc = open(p, O_RDONLY | O_CLOEXEC);
    assert_true(gc >= 0);
    assert_int_equal(flock(gc, LOCK_EX), 0);
    opener o = {.rc = 1, .fd = -1};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, open_thread, &o), 0);
    usleep(100 * 1000); /* the reader has opened the file and waits for LOCK_SH */
    assert_int_equal(unlink(p), 0);
    assert_int_equal(flock(gc, LOCK_UN), 0);
    assert_int_equal(pthread_join(th, NULL), 0);
    close(gc);
    assert_int_equal(o.rc, TV_E_NOT_FOUND);
    assert_int_equal(o.fd, -1);
}

static ssize_t pwrite_short(int fd, const void *buf, size_t len, off_t off)
{
    return pwrite(fd, buf, len > 3 ? 3 : len, off); /* loops to completion */
}

static void test_write_faults(void **state)
{
    (void)state;
    tv_error err = {0};
    bool ex = true;
    size_t n = 99;
    tv_test_fault_install();
    tv_test_fault_fail(TV_TEST_SYS_PWRITE, 1, EIO, true);
    assert_int_equal(tv__snapfile_write(g_dir, "f", 1, "abcdef", 6, &err), -EIO);
    assert_int_equal(tv__snapfile_write_active(g_dir, "f", 1, &err), -EIO);
    tv_test_fault_clear();
    tv_test_fault_fail(TV_TEST_SYS_FDATASYNC, 1, EIO, true);
    assert_int_equal(tv__snapfile_write(g_dir, "f", 1, "abcdef", 6, &err), -EIO);
    tv_test_fault_reset();
    assert_int_equal(tv__snapfile_exists(g_dir, "f", 1, &ex, &err), 0);
    assert_false(ex);
    int64_t gen;
    assert_int_equal(tv__snapfile_read_active(g_dir, "f", &gen, &err), TV_E_NOT_FOUND);
    assert_int_equal(tv__snapfile_clean_temps(g_dir, "f", &n, &err), 0);
    assert_int_equal(n, 0); /* failures removed their temporary files */

    tv__sys.pwrite = pwrite_short;
    assert_int_equal(tv__snapfile_write(g_dir, "f", 1, "abcdefgh", 8, &err), 0);
    tv__sys_reset();
    int fd;
    void *buf;
    size_t len;
    assert_int_equal(tv__snapfile_open(g_dir, "f", 1, &fd, &buf, &len, &err), 0);
    assert_int_equal(len, 8);
    assert_memory_equal(buf, "abcdefgh", 8);
    tv__snapfile_unmap(buf, len);
    close(fd);

    /* Leftovers of a crash mid-write are cleaned; real files are kept. */
    char md[TV__SNAPFILE_PATH_MAX], p[TV__SNAPFILE_PATH_MAX + 32];
    assert_int_equal(tv__snapfile_model_dir(g_dir, "f", md, sizeof md, &err), 0);
    snprintf(p, sizeof p, "%s/.tmp-7-1234-0", md);
    tv_test_write_text(p, "partial");
    snprintf(p, sizeof p, "%s/.tmp-active-1234-1", md);
    tv_test_write_text(p, "9\n");
    assert_int_equal(tv__snapfile_clean_temps(g_dir, "f", &n, &err), 0);
    assert_int_equal(n, 2);
    assert_int_equal(tv__snapfile_exists(g_dir, "f", 1, &ex, &err), 0);
    assert_true(ex);
    assert_int_equal(tv__snapfile_clean_temps(g_dir, "nothing-here", &n, &err), 0);
    assert_int_equal(n, 0);
}

/* The pointer parser on bytes (the fuzz target's function): both forms,
 * and everything else refused. */
static void test_parse_active(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        int64_t gen, from; /* gen 0: refused */
    } cases[] = {
        {"1", 1, -1},
        {"1\n", 1, -1},
        {"42\nfrom 41\n", 42, 41},
        {"3\nfrom 0\n", 3, 0},
        {"9223372036854775807\nfrom 9223372036854775807\n", INT64_MAX, INT64_MAX},
        {"9223372036854775808\n", 0, 0},
        {"3\nfrom 00\n", 0, 0},
        {"3\nfrom 01\n", 0, 0},
        {"3\nfrom 2", 0, 0},
        {"3\nfrom 2\n\n", 0, 0},
        {"3\nfrom -2\n", 0, 0},
        {"3\nfrom \n", 0, 0},
        {"3from 2\n", 0, 0},
        {"3\nFROM 2\n", 0, 0},
        {"3\n from 2\n", 0, 0},
        {"3\nfrom  2\n", 0, 0},
        {"\n", 0, 0},
        {"0\nfrom 1\n", 0, 0},
    };
    tv_error err = {0};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int64_t g = -7, fr = -7;
        int rc = tv__snapfile_parse_active(cases[i].text, strlen(cases[i].text), &g, &fr, &err);
        if (cases[i].gen == 0) {
            if (rc != TV_E_SNAPSHOT)
                fail_msg("'%s' accepted", cases[i].text);
            continue;
        }
        if (rc)
            fail_msg("'%s': %s", cases[i].text, err.msg);
        assert_int_equal(g, cases[i].gen);
        assert_int_equal(fr, cases[i].from);
    }
    /* embedded NUL, over the size limit */
    int64_t g, fr;
    assert_int_equal(tv__snapfile_parse_active("1\0", 2, &g, &fr, &err), TV_E_SNAPSHOT);
    char big[TV__SNAPFILE_POINTER_MAX + 8];
    memset(big, '1', sizeof big);
    assert_int_equal(tv__snapfile_parse_active(big, sizeof big, &g, &fr, &err), TV_E_SNAPSHOT);
    assert_int_equal(tv__snapfile_parse_active(NULL, 0, &g, &fr, &err), TV_E_SNAPSHOT);
    assert_int_equal(tv__snapfile_parse_active("1", 1, NULL, &fr, &err), TV_E_INVALID_ARG);

    /* the writer's forms read back */
    assert_int_equal(tv__snapfile_write_pointer(g_dir, "p", 8, 5, &err), 0);
    assert_int_equal(tv__snapfile_read_pointer(g_dir, "p", &g, &fr, &err), 0);
    assert_int_equal(g, 8);
    assert_int_equal(fr, 5);
    assert_int_equal(tv__snapfile_write_pointer(g_dir, "p", 9, -1, &err), 0);
    assert_int_equal(tv__snapfile_read_pointer(g_dir, "p", &g, &fr, &err), 0);
    assert_int_equal(g, 9);
    assert_int_equal(fr, -1);
    assert_int_equal(tv__snapfile_write_pointer(g_dir, "p", 0, 3, &err), TV_E_INVALID_ARG);
}

static void on_alarm(int sig)
{
    (void)sig;
    static const char msg[] = "blocked opening a FIFO\n";
    if (write(2, msg, sizeof msg - 1) < 0) {
    }
    _exit(1);
}

/* Snapshot files and pointers are opened safely: a symbolic link, FIFO or
 * directory in their place (or a link in place of DIR/snapshots or the
 * model directory) is refused with TV_E_SNAPSHOT, never followed, never
 * blocked on; the writer does not write through a linked directory. */
static void test_unsafe_files(void **state)
{
    (void)state;
    tv_error err = {0};
    char p[TV__SNAPFILE_PATH_MAX], md[TV__SNAPFILE_PATH_MAX], q[TV__SNAPFILE_PATH_MAX + 32];
    int fd = -1;
    void *buf = NULL;
    size_t len = 0;
    int64_t gen = 0;
    bool leased = true;
    signal(SIGALRM, on_alarm);
    alarm(10); /* a blocking open of a FIFO fails the test instead of hanging */
    assert_int_equal(tv__snapfile_write(g_dir, "m", 1, "one", 3, &err), 0);
    assert_int_equal(tv__snapfile_write_active(g_dir, "m", 1, &err), 0);
    assert_int_equal(tv__snapfile_model_dir(g_dir, "m", md, sizeof md, &err), 0);

    /* generation 2 is a symbolic link to generation 1's file */
    assert_int_equal(tv__snapfile_path(g_dir, "m", 2, p, sizeof p, &err), 0);
    assert_int_equal(symlink("1.tvsnap", p), 0);
    assert_int_equal(tv__snapfile_open(g_dir, "m", 2, &fd, &buf, &len, &err), TV_E_SNAPSHOT);
    assert_non_null(strstr(err.msg, "symbolic link"));
    assert_int_equal(fd, -1);
    assert_int_equal(tv__snapfile_try_exclusive(g_dir, "m", 2, &leased, &err), 0);
    assert_false(leased);
    assert_int_equal(tv__snapfile_remove(g_dir, "m", 2, &err), 0); /* the link, not its target */
    assert_int_equal(access(p, F_OK), -1);
    assert_int_equal(tv__snapfile_open(g_dir, "m", 1, &fd, &buf, &len, &err), 0);
    tv__snapfile_unmap(buf, len);
    close(fd);

    /* a FIFO in place of generation 3 and of the pointer */
    assert_int_equal(tv__snapfile_path(g_dir, "m", 3, p, sizeof p, &err), 0);
    assert_int_equal(mkfifo(p, 0600), 0);
    assert_int_equal(tv__snapfile_open(g_dir, "m", 3, &fd, &buf, &len, &err), TV_E_SNAPSHOT);
    assert_non_null(strstr(err.msg, "FIFO"));
    assert_int_equal(tv__snapfile_remove(g_dir, "m", 3, &err), 0);
    assert_int_equal(tv__snapfile_active_path(g_dir, "m", p, sizeof p, &err), 0);
    assert_int_equal(unlink(p), 0);
    assert_int_equal(mkfifo(p, 0600), 0);
    assert_int_equal(tv__snapfile_read_active(g_dir, "m", &gen, &err), TV_E_SNAPSHOT);
    assert_int_equal(tv__snapfile_open(g_dir, "m", 0, &fd, &buf, &len, &err), TV_E_SNAPSHOT);
    /* the writer replaces it (rename replaces the entry itself) */
    assert_int_equal(tv__snapfile_write_active(g_dir, "m", 1, &err), 0);
    assert_int_equal(tv__snapfile_read_active(g_dir, "m", &gen, &err), 0);
    assert_int_equal(gen, 1);

    /* the pointer is a directory, then a symbolic link */
    assert_int_equal(unlink(p), 0);
    assert_int_equal(mkdir(p, 0700), 0);
    assert_int_equal(tv__snapfile_read_active(g_dir, "m", &gen, &err), TV_E_SNAPSHOT);
    assert_non_null(strstr(err.msg, "directory"));
    assert_int_equal(rmdir(p), 0);
    snprintf(q, sizeof q, "%s/elsewhere", g_dir);
    tv_test_write_text(q, "1\n");
    assert_int_equal(symlink(q, p), 0);
    assert_int_equal(tv__snapfile_read_active(g_dir, "m", &gen, &err), TV_E_SNAPSHOT);
    assert_int_equal(tv__snapfile_open(g_dir, "m", 0, &fd, &buf, &len, &err), TV_E_SNAPSHOT);
    assert_int_equal(tv__snapfile_write_active(g_dir, "m", 1, &err), 0);
    assert_int_equal(tv__snapfile_read_active(g_dir, "m", &gen, &err), 0);
    struct stat sb;
    assert_int_equal(lstat(p, &sb), 0);
    assert_true(S_ISREG(sb.st_mode)); /* the link was replaced, q untouched */
    assert_int_equal(lstat(q, &sb), 0);
    assert_int_equal(sb.st_size, 2);

    /* a model directory that is a symbolic link to another model's */
    assert_int_equal(tv__snapfile_model_dir(g_dir, "n", q, sizeof q, &err), 0);
    assert_int_equal(symlink("m", q), 0);
    assert_int_equal(tv__snapfile_open(g_dir, "n", 1, &fd, &buf, &len, &err), TV_E_SNAPSHOT);
    assert_non_null(strstr(err.msg, "symbolic link"));
    assert_int_equal(tv__snapfile_read_active(g_dir, "n", &gen, &err), TV_E_SNAPSHOT);
    assert_int_equal(tv__snapfile_write(g_dir, "n", 5, "five", 4, &err), TV_E_SNAPSHOT);
    assert_int_equal(tv__snapfile_write_active(g_dir, "n", 5, &err), TV_E_SNAPSHOT);
    bool ex = true;
    assert_int_equal(tv__snapfile_exists(g_dir, "m", 5, &ex, &err), 0);
    assert_false(ex); /* nothing written through the link */
    assert_int_equal(unlink(q), 0);

    /* DIR/snapshots itself is a symbolic link */
    char top[TV__SNAPFILE_PATH_MAX], moved[TV__SNAPFILE_PATH_MAX];
    snprintf(top, sizeof top, "%s/snapshots", g_dir);
    snprintf(moved, sizeof moved, "%s/real-snapshots", g_dir);
    assert_int_equal(rename(top, moved), 0);
    assert_int_equal(symlink("real-snapshots", top), 0);
    assert_int_equal(tv__snapfile_open(g_dir, "m", 1, &fd, &buf, &len, &err), TV_E_SNAPSHOT);
    assert_int_equal(tv__snapfile_read_active(g_dir, "m", &gen, &err), TV_E_SNAPSHOT);
    assert_int_equal(tv__snapfile_write(g_dir, "m", 6, "six!", 4, &err), TV_E_SNAPSHOT);
    assert_int_equal(unlink(top), 0);
    assert_int_equal(rename(moved, top), 0);
    assert_int_equal(tv__snapfile_open(g_dir, "m", 1, &fd, &buf, &len, &err), 0);
    tv__snapfile_unmap(buf, len);
    close(fd);
    alarm(0);
}

/* ---- the mapped image ------------------------------------------------- */

static int g_maps, g_unmaps;
static size_t g_unmapped_len;
static void *count_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
    g_maps++;
    assert_int_equal(prot, PROT_READ); /* never writable */
    return mmap(addr, len, prot, flags, fd, off);
}
static int count_munmap(void *addr, size_t len)
{
    g_unmaps++;
    g_unmapped_len = len;
    return munmap(addr, len);
}
static void *fail_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
    (void)addr, (void)len, (void)prot, (void)flags, (void)fd, (void)off;
    errno = ENOMEM;
    return MAP_FAILED;
}

/* The image is mapped read-only through tv__sys (one mmap, one munmap of
 * the whole file); the mapping outlives the lease fd and an unlink; an
 * empty file, one over the limit and a failing mmap are refused cleanly. */
static void test_mapped_open(void **state)
{
    (void)state;
    tv_error err = {0};
    int fd = -1;
    void *buf = NULL;
    size_t len = 0;
    char p[TV__SNAPFILE_PATH_MAX];
    assert_int_equal(tv__snapfile_write(g_dir, "m", 1, "abcdefgh", 8, &err), 0);
    g_maps = g_unmaps = 0;
    tv__sys.mmap = count_mmap;
    tv__sys.munmap = count_munmap;
    assert_int_equal(tv__snapfile_open(g_dir, "m", 1, &fd, &buf, &len, &err), 0);
    assert_int_equal(g_maps, 1);
    assert_int_equal(len, 8);
    close(fd);
    assert_int_equal(tv__snapfile_path(g_dir, "m", 1, p, sizeof p, &err), 0);
    assert_int_equal(unlink(p), 0);
    assert_memory_equal(buf, "abcdefgh", 8); /* still mapped: pages stay */
    tv__snapfile_unmap(buf, len);
    assert_int_equal(g_unmaps, 1);
    assert_int_equal(g_unmapped_len, 8);
    tv__snapfile_unmap(NULL, 0);
    assert_int_equal(g_unmaps, 1);

    /* An empty file (never written by tv__snapfile_write). */
    assert_int_equal(tv__snapfile_path(g_dir, "m", 2, p, sizeof p, &err), 0);
    tv_test_write_file(p, "", 0);
    buf = (void *)1;
    assert_int_equal(tv__snapfile_open(g_dir, "m", 2, &fd, &buf, &len, &err), TV_E_SNAPSHOT);
    assert_non_null(strstr(err.msg, "empty"));
    assert_int_equal(fd, -1);
    assert_null(buf);
    /* Over the limit (sparse). */
    assert_int_equal(tv__snapfile_path(g_dir, "m", 3, p, sizeof p, &err), 0);
    tv_test_write_file(p, "x", 1);
    assert_int_equal(truncate(p, (off_t)TV__SNAPFILE_MAX_LEN + 1), 0);
    assert_int_equal(tv__snapfile_open(g_dir, "m", 3, &fd, &buf, &len, &err), TV_E_SNAPSHOT);
    assert_non_null(strstr(err.msg, "limit"));
    assert_int_equal(fd, -1);
    assert_int_equal(g_maps, 1); /* neither was mapped */
    /* mmap fails: the error, no fd, no buffer. */
    assert_int_equal(tv__snapfile_write(g_dir, "m", 4, "four", 4, &err), 0);
    tv__sys.mmap = fail_mmap;
    assert_int_equal(tv__snapfile_open(g_dir, "m", 4, &fd, &buf, &len, &err), -ENOMEM);
    assert_non_null(strstr(err.msg, "mmap"));
    assert_int_equal(fd, -1);
    assert_null(buf);
    bool leased = true;
    assert_int_equal(tv__snapfile_try_exclusive(g_dir, "m", 4, &leased, &err), 0);
    assert_false(leased); /* the lease fd was closed */
    tv__sys_reset();
}

/* A single flipped byte anywhere in a snapshot file on disk is refused at
 * open (tv__snapfile_open + tv__snap_open, as tv_model_open does): every
 * byte of a small generation's file. */
static void test_flipped_byte_in_file_refused(void **state)
{
    (void)state;
    tv_error err = {0};
    static const uint64_t shape[] = {4};
    tv__snap_device_in dev = {.uuid = {1, 2, 3},
                              .path = "/var/lib/tv/image0",
                              .kind = TV__DEV_FILE,
                              .lba_size = 512,
                              .io_align = 4096,
                              .object_align = 64 * 1024,
                              .size_bytes = 16 << 20,
                              .region_off = 1 << 20,
                              .region_len = 15 << 20,
                              .data_off = (1 << 20) + 64 * 1024};
    tv__snap_replica_in rep = {0, 11, (1 << 20) + 64 * 1024, 64 * 1024};
    tv__snap_shard_in sh = {.name = "model.safetensors",
                            .file_len = 8 + 64 + 8,
                            .header_len = 64,
                            .n_replicas = 1,
                            .replicas = &rep};
    tv__snap_tensor_in t[2] = {
        {.name = "a",
         .name_len = 1,
         .dtype = TV_DTYPE_U8,
         .rank = 1,
         .shape = shape,
         .begin_off = 0,
         .end_off = 4},
        {.name = "b",
         .name_len = 1,
         .dtype = TV_DTYPE_U8,
         .rank = 1,
         .shape = shape,
         .begin_off = 4,
         .end_off = 8},
    };
    tv__snap_in in = {.model = "m",
                      .generation = 1,
                      .n_devices = 1,
                      .devices = &dev,
                      .n_shards = 1,
                      .shards = &sh,
                      .n_tensors = 2,
                      .tensors = t,
                      .hash_seed = 9};
    void *img = NULL;
    size_t img_len = 0;
    if (tv__snap_build(&in, &img, &img_len, &err))
        fail_msg("build: %s", err.msg);
    assert_int_equal(tv__snapfile_write(g_dir, "m", 1, img, img_len, &err), 0);
    char p[TV__SNAPFILE_PATH_MAX];
    assert_int_equal(tv__snapfile_path(g_dir, "m", 1, p, sizeof p, &err), 0);
    int wfd = open(p, O_RDWR | O_CLOEXEC);
    assert_true(wfd >= 0);
    const uint8_t *good = img;
    for (size_t at = 0; at <= img_len; at++) {
        /* at == img_len: the restored file opens again */
        uint8_t bad = (uint8_t)(good[at < img_len ? at : 0] ^ 0x10);
        if (at < img_len)
            assert_int_equal(pwrite(wfd, &bad, 1, (off_t)at), 1);
        int fd = -1;
        void *buf = NULL;
        size_t len = 0;
        tv__snap s;
        assert_int_equal(tv__snapfile_open(g_dir, "m", 1, &fd, &buf, &len, &err), 0);
        int rc = tv__snap_open(buf, len, TV__SNAP_VERIFY_CHECKSUM, &s, &err);
        if (at < img_len && rc != TV_E_SNAPSHOT)
            fail_msg("byte %zu of %zu flipped: open returned %d", at, img_len, rc);
        if (at == img_len)
            assert_int_equal(rc, 0);
        tv__snapfile_unmap(buf, len);
        close(fd);
        if (at < img_len)
            assert_int_equal(pwrite(wfd, good + at, 1, (off_t)at), 1);
    }
    close(wfd);
    free(img);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_escape, setup, teardown),
        cmocka_unit_test_setup_teardown(test_paths, setup, teardown),
        cmocka_unit_test_setup_teardown(test_write_read, setup, teardown),
        cmocka_unit_test_setup_teardown(test_active, setup, teardown),
        cmocka_unit_test_setup_teardown(test_alias_pointers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_open_active, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lease, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reader_races_gc, setup, teardown),
        cmocka_unit_test_setup_teardown(test_write_faults, setup, teardown),
        cmocka_unit_test_setup_teardown(test_parse_active, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unsafe_files, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mapped_open, setup, teardown),
        cmocka_unit_test_setup_teardown(test_flipped_byte_in_file_refused, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
