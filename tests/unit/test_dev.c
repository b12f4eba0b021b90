/* Unit tests of the device layer (core/src/dev/dev.c) on file images:
 * creation, open and geometry, alignments, full-length I/O, and faults
 * injected through the tv__sys table (always restored by the teardown). */
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

#include "dev/dev.h"
#include "util/sys.h"
#include "tv_test.h"

#define MIB (1024u * 1024u)

static char g_dir[256];
static char g_img[300];

static int setup(void **state)
{
    (void)state;
    tv_test_tmpdir(g_dir, sizeof g_dir, "dev");
    tv_test_path(g_img, sizeof g_img, "%s/image", g_dir);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    tv_test_fault_reset();
    tv_test_rmtree(g_dir);
    return 0;
}

static tv__dev *open_image(uint64_t size, unsigned flags)
{
    tv_error err = {0};
    tv__dev *d = NULL;
    assert_int_equal(tv__dev_create_image(g_img, size, &err), 0);
    int rc = tv__dev_open(g_img, flags, &d, &err);
    if (rc)
        fail_msg("open %s: %s", g_img, err.msg);
    assert_non_null(d);
    return d;
}

static void fill(uint8_t *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)((i * 131u + seed * 7u + (i >> 9)) & 0xff);
}

/* ---- pure helpers ------------------------------------------------------ */

static void test_compute_align(void **state)
{
    (void)state;
    uint32_t io = 0;
    uint64_t obj = 0;
    static const struct {
        uint32_t lba, io;
        uint64_t obj;
    } ok[] = {{512, 4096, 65536},  {1024, 4096, 65536},   {4096, 4096, 65536},
              {8192, 8192, 65536}, {16384, 16384, 65536}, {65536, 65536, 65536}};
    for (size_t i = 0; i < TV_ARRAY_LEN(ok); i++) {
        assert_int_equal(tv__dev_compute_align(ok[i].lba, &io, &obj, NULL), 0);
        assert_int_equal(io, ok[i].io);
        assert_int_equal(obj, ok[i].obj);
    }
    static const uint32_t bad[] = {0, 1, 256, 520, 4095, 4097, 131072, 0x80000000u};
    for (size_t i = 0; i < TV_ARRAY_LEN(bad); i++)
        assert_int_equal(tv__dev_compute_align(bad[i], &io, &obj, NULL), TV_E_INVALID_ARG);
}

static void test_nvme_names(void **state)
{
    (void)state;
    assert_true(tv__dev_is_nvme_name("nvme0n1"));
    assert_true(tv__dev_is_nvme_name("nvme12n345"));
    assert_true(tv__dev_is_nvme_name("nvme0c1n1"));
    assert_false(tv__dev_is_nvme_name("nvme0n1p1"));
    assert_false(tv__dev_is_nvme_name("nvme0"));
    assert_false(tv__dev_is_nvme_name("nvmen1"));
    assert_false(tv__dev_is_nvme_name("nvme0n"));
    assert_false(tv__dev_is_nvme_name("nvme0c1"));
    assert_false(tv__dev_is_nvme_name("nvme-fabrics"));
    assert_false(tv__dev_is_nvme_name("loop0"));
    assert_false(tv__dev_is_nvme_name("sda"));
    assert_false(tv__dev_is_nvme_name(""));
    assert_false(tv__dev_is_nvme_name(NULL));
    assert_string_equal(tv__dev_kind_name(TV__DEV_NVME), "nvme");
    assert_string_equal(tv__dev_kind_name(99), "unknown");
}

/* ---- image creation and open ------------------------------------------ */

static void test_create_image(void **state)
{
    (void)state;
    tv_error err = {0};
    struct stat st;

    assert_int_equal(tv__dev_create_image(g_img, 64 * MIB, &err), 0);
    assert_int_equal(stat(g_img, &st), 0);
    assert_true(S_ISREG(st.st_mode));
    assert_int_equal(st.st_size, 64 * MIB);
    assert_true((uint64_t)st.st_blocks * 512u < 64 * MIB); /* sparse */
    assert_int_equal(st.st_mode & 0777, 0600);

    /* Never overwrites: existing content and size survive. */
    int fd = open(g_img, O_WRONLY);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, "keep", 4, 0), 4);
    close(fd);
    assert_int_equal(tv__dev_create_image(g_img, 4096, &err), -EEXIST);
    assert_non_null(strstr(err.msg, g_img));
    assert_int_equal(stat(g_img, &st), 0);
    assert_int_equal(st.st_size, 64 * MIB);
    char buf[4] = {0};
    fd = open(g_img, O_RDONLY);
    assert_int_equal(pread(fd, buf, 4, 0), 4);
    close(fd);
    assert_memory_equal(buf, "keep", 4);
    unlink(g_img);

    assert_int_equal(tv__dev_create_image(g_img, 0, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv__dev_create_image(g_img, 4097, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv__dev_create_image(g_img, UINT64_MAX - 4095, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv__dev_create_image(NULL, 4096, &err), TV_E_INVALID_ARG);
    assert_int_equal(access(g_img, F_OK), -1);
}

static void test_open_file_geometry(void **state)
{
    (void)state;
    tv__dev *d = open_image(64 * MIB, TV__DEV_O_RDWR);
    static const tv__dev_identity zero;

    assert_int_equal(d->kind, TV__DEV_FILE);
    assert_string_equal(d->path, g_img);
    assert_true(d->fd >= 0);
    assert_int_equal(d->lba_size, 512);
    assert_int_equal(d->size_bytes, 64 * MIB);
    assert_int_equal(d->io_align, 4096);
    assert_int_equal(d->object_align, 65536);
    assert_true(d->writable);
    assert_memory_equal(&d->ident, &zero, sizeof zero);
    print_message("image on %s: O_DIRECT %s\n", g_dir, d->direct ? "yes" : "no (fallback)");
    tv__dev_close(d);

    tv_error err = {0};
    assert_int_equal(tv__dev_open(g_img, TV__DEV_O_RDONLY | TV__DEV_O_NODIRECT, &d, &err), 0);
    assert_false(d->direct);
    assert_false(d->writable);
    tv__dev_close(d);
    tv__dev_close(NULL);
}

static void test_open_errors(void **state)
{
    (void)state;
    tv_error err = {0};
    tv__dev *d = (tv__dev *)&err; /* must be reset to NULL on failure */

    assert_int_equal(tv__dev_open(g_img, TV__DEV_O_RDONLY, &d, &err), -ENOENT);
    assert_null(d);
    assert_non_null(strstr(err.msg, g_img));

    assert_int_equal(tv__dev_open(g_img, 0x80, &d, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv__dev_open(NULL, 0, &d, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv__dev_open(g_img, 0, NULL, &err), TV_E_INVALID_ARG);

    /* A directory and a character device are neither file nor block. */
    assert_int_equal(tv__dev_open(g_dir, TV__DEV_O_RDONLY, &d, &err), TV_E_INVALID_ARG);
    assert_null(d);
    assert_int_equal(tv__dev_open("/dev/null", TV__DEV_O_RDONLY, &d, &err), TV_E_INVALID_ARG);

    /* An empty image has no room for anything. */
    int fd = open(g_img, O_CREAT | O_WRONLY, 0600);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(tv__dev_open(g_img, TV__DEV_O_RDONLY, &d, &err), TV_E_INVALID_ARG);
    assert_non_null(strstr(err.msg, "empty"));
}

/* ---- I/O --------------------------------------------------------------- */

static void round_trip(unsigned flags)
{
    tv__dev *d = open_image(16 * MIB, flags);
    tv_error err = {0};
    const size_t len = 256 * 1024;
    uint8_t *w = tv__dev_alloc_aligned(d, len), *r = tv__dev_alloc_aligned(d, len);
    assert_non_null(w);
    assert_non_null(r);
    assert_int_equal((uintptr_t)w % d->io_align, 0);
    fill(w, len, 3);

    assert_int_equal(tv__dev_pwrite_full(d, w, len, 1 * MIB, &err), 0);
    assert_int_equal(tv__dev_flush(d, &err), 0);
    assert_int_equal(tv__dev_pread_full(d, r, len, 1 * MIB, &err), 0);
    assert_memory_equal(w, r, len);
    /* The last block of the device is reachable; one past it is not. */
    assert_int_equal(tv__dev_pwrite_full(d, w, 4096, 16 * MIB - 4096, &err), 0);
    assert_int_equal(tv__dev_pread_full(d, r, 4096, 16 * MIB - 4096, &err), 0);
    assert_memory_equal(w, r, 4096);
    assert_int_equal(tv__dev_pread_full(d, r, 8192, 16 * MIB - 4096, &err), TV_E_INVALID_ARG);
    assert_non_null(strstr(err.msg, "past the end"));
    assert_int_equal(tv__dev_pwrite_full(d, w, 4096, 16 * MIB, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv__dev_pread_full(d, r, 4096, UINT64_MAX - 4095, &err), TV_E_OVERFLOW);
    /* Zero-length transfers are no-ops. */
    assert_int_equal(tv__dev_pread_full(d, r, 0, 0, &err), 0);

    /* The image did not grow. */
    struct stat st;
    assert_int_equal(stat(g_img, &st), 0);
    assert_int_equal(st.st_size, 16 * MIB);
    free(w);
    free(r);
    tv__dev_close(d);
}

static void test_round_trip_direct(void **state)
{
    (void)state;
    round_trip(TV__DEV_O_RDWR);
}

static void test_round_trip_buffered(void **state)
{
    (void)state;
    round_trip(TV__DEV_O_RDWR | TV__DEV_O_NODIRECT);
    /* Buffered I/O has no alignment requirement. */
    tv__dev *d = NULL;
    tv_error err = {0};
    char msg[] = "unaligned bytes";
    char back[sizeof msg];
    assert_int_equal(tv__dev_open(g_img, TV__DEV_O_RDWR | TV__DEV_O_NODIRECT, &d, &err), 0);
    assert_int_equal(tv__dev_pwrite_full(d, msg, sizeof msg, 12345, &err), 0);
    assert_int_equal(tv__dev_pread_full(d, back, sizeof back, 12345, &err), 0);
    assert_string_equal(back, msg);
    tv__dev_close(d);
}

static void test_read_only_write(void **state)
{
    (void)state;
    tv__dev *d = open_image(1 * MIB, TV__DEV_O_RDONLY);
    tv_error err = {0};
    uint8_t *b = tv__dev_alloc_aligned(d, 4096);
    assert_int_equal(tv__dev_pwrite_full(d, b, 4096, 4096, &err), -EBADF);
    assert_non_null(strstr(err.msg, "read-only"));
    free(b);
    tv__dev_close(d);
}

static int g_calls;

static ssize_t counting_pread(int fd, void *buf, size_t len, off_t off)
{
    g_calls++;
    return pread(fd, buf, len, off);
}

static void test_direct_alignment_rejected(void **state)
{
    (void)state;
    tv__dev *d = open_image(1 * MIB, TV__DEV_O_RDWR | TV__DEV_O_NODIRECT);
    tv_error err = {0};
    uint8_t *b = tv__dev_alloc_aligned(d, 3 * 4096);

    /* The check depends only on d->direct, not on the filesystem. */
    d->direct = true;
    tv__sys.pread = counting_pread;
    g_calls = 0;
    assert_int_equal(tv__dev_pread_full(d, b, 4096, 512, &err), TV_E_INVALID_ARG);
    assert_non_null(strstr(err.msg, "O_DIRECT"));
    assert_int_equal(tv__dev_pread_full(d, b, 512, 4096, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv__dev_pread_full(d, b + 8, 4096, 4096, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv__dev_pwrite_full(d, b + 512, 4096, 0, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv__dev_pwrite_full(d, b, 4095, 0, &err), TV_E_INVALID_ARG);
    assert_int_equal(g_calls, 0); /* refused before any syscall */
    assert_int_equal(tv__dev_pread_full(d, b, 8192, 4096, &err), 0);
    assert_int_equal(g_calls, 1);
    free(b);
    tv__dev_close(d);
}

/* ---- fault injection ---------------------------------------------------- */

static size_t g_cap;
static int g_eintr_left;

static ssize_t short_pread(int fd, void *buf, size_t len, off_t off)
{
    g_calls++;
    return pread(fd, buf, len < g_cap ? len : g_cap, off);
}
static ssize_t short_pwrite(int fd, const void *buf, size_t len, off_t off)
{
    g_calls++;
    return pwrite(fd, buf, len < g_cap ? len : g_cap, off);
}
static ssize_t eof_pread(int fd, void *buf, size_t len, off_t off)
{
    /* Delivers one chunk, then end of data (a device that shrank). */
    if (g_calls++ == 0)
        return pread(fd, buf, len < g_cap ? len : g_cap, off);
    return 0;
}
static ssize_t zero_pwrite(int fd, const void *buf, size_t len, off_t off)
{
    (void)fd, (void)buf, (void)len, (void)off;
    return 0;
}
static ssize_t eintr_pread(int fd, void *buf, size_t len, off_t off)
{
    g_calls++;
    if (g_eintr_left > 0) {
        g_eintr_left--;
        errno = EINTR;
        return -1;
    }
    return pread(fd, buf, len, off);
}
/* A broken pread/pwrite that claims more bytes than it was asked for. */
static ssize_t overlong_pread(int fd, void *buf, size_t len, off_t off)
{
    (void)fd, (void)buf, (void)off;
    g_calls++;
    return (ssize_t)len + 1;
}
static ssize_t overlong_pwrite(int fd, const void *buf, size_t len, off_t off)
{
    (void)fd, (void)buf, (void)off;
    g_calls++;
    return (ssize_t)len + 1;
}
static int eintr_fdatasync(int fd)
{
    if (g_eintr_left > 0) {
        g_eintr_left--;
        errno = EINTR;
        return -1;
    }
    return fdatasync(fd);
}

static void test_inject_eio(void **state)
{
    (void)state;
    tv__dev *d = open_image(1 * MIB, TV__DEV_O_RDWR);
    tv_error err = {0};
    uint8_t *b = tv__dev_alloc_aligned(d, 8192);

    tv_test_fault_install();
    tv_test_fault_fail(TV_TEST_SYS_PREAD, 1, EIO, true);
    assert_int_equal(tv__dev_pread_full(d, b, 8192, 65536, &err), -EIO);
    assert_int_equal(err.code, -EIO);
    assert_non_null(strstr(err.msg, g_img));
    assert_non_null(strstr(err.msg, "65536"));
    assert_non_null(strstr(err.msg, "8192"));

    tv_test_fault_clear();
    tv_test_fault_fail(TV_TEST_SYS_FDATASYNC, 1, EIO, true);
    assert_int_equal(tv__dev_flush(d, &err), -EIO);
    assert_non_null(strstr(err.msg, "fdatasync"));
    tv_test_fault_reset();
    assert_int_equal(tv__dev_pread_full(d, b, 8192, 65536, &err), 0);
    free(b);
    tv__dev_close(d);
}

static void test_inject_enospc(void **state)
{
    (void)state;
    tv__dev *d = open_image(1 * MIB, TV__DEV_O_RDWR);
    tv_error err = {0};
    uint8_t *b = tv__dev_alloc_aligned(d, 4096);

    tv_test_fault_install();
    tv_test_fault_fail(TV_TEST_SYS_PWRITE, 1, ENOSPC, true);
    assert_int_equal(tv__dev_pwrite_full(d, b, 4096, 4096, &err), -ENOSPC);
    assert_non_null(strstr(err.msg, "write"));
    assert_non_null(strstr(err.msg, "4096"));
    tv__sys.pwrite = zero_pwrite;
    assert_int_equal(tv__dev_pwrite_full(d, b, 4096, 4096, &err), TV_E_SHORT_IO);
    free(b);
    tv__dev_close(d);
}

static void short_transfers(unsigned flags, size_t cap)
{
    tv__dev *d = open_image(4 * MIB, flags);
    tv_error err = {0};
    const size_t len = 64 * 1024;
    uint8_t *w = tv__dev_alloc_aligned(d, len), *r = tv__dev_alloc_aligned(d, len);
    fill(w, len, 9);

    g_cap = cap;
    g_calls = 0;
    tv__sys.pwrite = short_pwrite;
    assert_int_equal(tv__dev_pwrite_full(d, w, len, 8192, &err), 0);
    assert_int_equal(g_calls, (len + cap - 1) / cap);
    g_calls = 0;
    tv__sys.pread = short_pread;
    assert_int_equal(tv__dev_pread_full(d, r, len, 8192, &err), 0);
    assert_int_equal(g_calls, (len + cap - 1) / cap);
    assert_memory_equal(w, r, len);

    /* A 0-byte read before the end is a short read, never success. */
    g_calls = 0;
    memset(r, 0, len);
    tv__sys.pread = eof_pread;
    assert_int_equal(tv__dev_pread_full(d, r, len, 8192, &err), TV_E_SHORT_IO);
    assert_int_equal(err.code, TV_E_SHORT_IO);
    assert_non_null(strstr(err.msg, "8192"));
    free(w);
    free(r);
    tv__dev_close(d);
}

static void test_short_reads_direct(void **state)
{
    (void)state;
    short_transfers(TV__DEV_O_RDWR, 4096); /* O_DIRECT: short counts stay aligned */
}

static void test_short_reads_buffered(void **state)
{
    (void)state;
    short_transfers(TV__DEV_O_RDWR | TV__DEV_O_NODIRECT, 1000);
}

static void test_eintr_retried(void **state)
{
    (void)state;
    tv__dev *d = open_image(1 * MIB, TV__DEV_O_RDWR);
    tv_error err = {0};
    uint8_t *b = tv__dev_alloc_aligned(d, 4096);

    g_calls = 0;
    g_eintr_left = 3;
    tv__sys.pread = eintr_pread;
    assert_int_equal(tv__dev_pread_full(d, b, 4096, 0, &err), 0);
    assert_int_equal(g_calls, 4);
    g_eintr_left = 2;
    tv__sys.fdatasync = eintr_fdatasync;
    assert_int_equal(tv__dev_flush(d, &err), 0);
    assert_int_equal(g_eintr_left, 0);
    free(b);
    tv__dev_close(d);
}

/* One transfer loop serves both directions: an overlong count is EIO, at once. */
static void test_overlong_transfer(void **state)
{
    (void)state;
    tv__dev *d = open_image(1 * MIB, TV__DEV_O_RDWR);
    tv_error err = {0};
    uint8_t *b = tv__dev_alloc_aligned(d, 4096);

    g_calls = 0;
    tv__sys.pread = overlong_pread;
    assert_int_equal(tv__dev_pread_full(d, b, 4096, 8192, &err), -EIO);
    assert_non_null(strstr(err.msg, "read"));
    assert_non_null(strstr(err.msg, "8192"));
    assert_int_equal(g_calls, 1);
    g_calls = 0;
    tv__sys.pwrite = overlong_pwrite;
    assert_int_equal(tv__dev_pwrite_full(d, b, 4096, 8192, &err), -EIO);
    assert_non_null(strstr(err.msg, "write"));
    assert_non_null(strstr(err.msg, "8192"));
    assert_int_equal(g_calls, 1);
    free(b);
    tv__dev_close(d);
}

static void test_null_args(void **state)
{
    (void)state;
    tv_error err = {0};
    char b[16];
    assert_int_equal(tv__dev_pread_full(NULL, b, 16, 0, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv__dev_pwrite_full(NULL, b, 16, 0, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv__dev_flush(NULL, &err), TV_E_INVALID_ARG);
    assert_null(tv__dev_alloc_aligned(NULL, 16));
    tv__dev *d = open_image(1 * MIB, TV__DEV_O_RDWR);
    assert_int_equal(tv__dev_pread_full(d, NULL, 4096, 0, &err), TV_E_INVALID_ARG);
    assert_null(tv__dev_alloc_aligned(d, SIZE_MAX));
    tv__dev_close(d);
}

/* ---- opens that must not block or follow --------------------------------- */

static void test_open_fifo_does_not_block(void **state)
{
    (void)state;
    tv_error err = {0};
    tv__dev *d = NULL;
    assert_int_equal(mkfifo(g_img, 0600), 0);
    alarm(10); /* a blocking open would hang here: SIGALRM fails the test */
    assert_int_equal(tv__dev_open(g_img, TV__DEV_O_RDONLY, &d, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv__dev_open(g_img, TV__DEV_O_RDWR, &d, &err), TV_E_INVALID_ARG);
    alarm(0);
    assert_null(d);
    assert_non_null(strstr(err.msg, "neither a regular file nor a block device"));
}

static void test_open_nofollow(void **state)
{
    (void)state;
    tv_error err = {0};
    tv__dev *d = NULL;
    char target[320];
    snprintf(target, sizeof target, "%s/target", g_dir);
    assert_int_equal(tv__dev_create_image(target, MIB, &err), 0);
    assert_int_equal(symlink(target, g_img), 0);
    assert_int_equal(tv__dev_open(g_img, TV__DEV_O_RDONLY | TV__DEV_O_NOFOLLOW, &d, &err), -ELOOP);
    assert_non_null(strstr(err.msg, "symlink"));
    assert_int_equal(tv__dev_open(g_img, TV__DEV_O_RDONLY, &d, &err), 0);
    tv__dev_close(d);
    /* Creating an image never writes through a symlink. */
    assert_int_equal(unlink(target), 0);
    assert_int_equal(tv__dev_create_image(g_img, MIB, &err), -EEXIST);
    assert_int_equal(access(target, F_OK), -1);
}

static int ftruncate_enospc(int fd, off_t len)
{
    (void)fd, (void)len;
    errno = ENOSPC;
    return -1;
}

static void test_create_image_enospc(void **state)
{
    (void)state;
    tv_error err = {0};
    tv__sys.ftruncate = ftruncate_enospc;
    assert_int_equal(tv__dev_create_image(g_img, 4 * MIB, &err), -ENOSPC);
    assert_non_null(strstr(err.msg, "no space left on the filesystem"));
    assert_non_null(strstr(err.msg, g_img));
    assert_int_equal(access(g_img, F_OK), -1); /* nothing left behind */
}

static void test_claim_keys_nvme(void **state)
{
    (void)state;
    tv_error err = {0};
    tv__dev *a = open_image(MIB, TV__DEV_O_RDONLY);
    char other[320];
    snprintf(other, sizeof other, "%s/other", g_dir);
    assert_int_equal(tv__dev_create_image(other, MIB, &err), 0);
    tv__dev *b = NULL;
    assert_int_equal(tv__dev_open(other, TV__DEV_O_RDONLY, &b, &err), 0);
    tv__dev_claim ka, kb;
    assert_int_equal(tv__dev_claim_keys(a, &ka, &err), 0);
    assert_int_equal(tv__dev_claim_keys(b, &kb, &err), 0);
    assert_false(tv__dev_claim_same(&ka, &kb));
    /* The same NVMe namespace seen through two nodes: identity matches. */
    a->kind = b->kind = TV__DEV_NVME;
    static const tv__dev_identity id = {
        .serial = "S1", .model = "M", .nsid = 1, .nguid = {1, 2, 3}, .eui64 = {4, 5}};
    a->ident = b->ident = id;
    assert_int_equal(tv__dev_claim_keys(a, &ka, &err), 0);
    assert_int_equal(tv__dev_claim_keys(b, &kb, &err), 0);
    assert_int_equal(ka.n_keys, 2);
    assert_true(tv__dev_claim_same(&ka, &kb));
    b->ident.nsid = 2; /* another namespace of the same controller */
    assert_int_equal(tv__dev_claim_keys(b, &kb, &err), 0);
    assert_false(tv__dev_claim_same(&ka, &kb));
    tv__dev_close(a);
    tv__dev_close(b);
    unlink(other);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_compute_align, setup, teardown),
        cmocka_unit_test_setup_teardown(test_nvme_names, setup, teardown),
        cmocka_unit_test_setup_teardown(test_create_image, setup, teardown),
        cmocka_unit_test_setup_teardown(test_open_file_geometry, setup, teardown),
        cmocka_unit_test_setup_teardown(test_open_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_round_trip_direct, setup, teardown),
        cmocka_unit_test_setup_teardown(test_round_trip_buffered, setup, teardown),
        cmocka_unit_test_setup_teardown(test_read_only_write, setup, teardown),
        cmocka_unit_test_setup_teardown(test_direct_alignment_rejected, setup, teardown),
        cmocka_unit_test_setup_teardown(test_inject_eio, setup, teardown),
        cmocka_unit_test_setup_teardown(test_inject_enospc, setup, teardown),
        cmocka_unit_test_setup_teardown(test_short_reads_direct, setup, teardown),
        cmocka_unit_test_setup_teardown(test_short_reads_buffered, setup, teardown),
        cmocka_unit_test_setup_teardown(test_overlong_transfer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_eintr_retried, setup, teardown),
        cmocka_unit_test_setup_teardown(test_null_args, setup, teardown),
        cmocka_unit_test_setup_teardown(test_open_fifo_does_not_block, setup, teardown),
        cmocka_unit_test_setup_teardown(test_open_nofollow, setup, teardown),
        cmocka_unit_test_setup_teardown(test_create_image_enospc, setup, teardown),
        cmocka_unit_test_setup_teardown(test_claim_keys_nvme, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
