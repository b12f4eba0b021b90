/* Block-device test of the device layer on a real loop device with
 * 4096-byte sectors: kind and geometry from BLKSSZGET/BLKGETSIZE64, O_DIRECT
 * I/O, the label round trip, ioctl faults through tv__sys, the claim keys
 * (the loop device is the same device as its backing file) and a resize.
 * Needs root and a working losetup; otherwise exits 77 with the reason.
 * The loop device is always detached (after the group, or at exit). */
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "dev/dev.h"
#include "util/sys.h"
#include "tv_test.h"

#define MIB     (1024u * 1024u)
#define IMG_LEN (64 * MIB)

static char g_dir[256];
static char g_img[300];
static char g_loop[1024];
static bool g_attached;

/* Runs argv, capturing stdout+stderr into out. Returns the exit status, or
 * -1 if it could not run. No shell: paths are passed as they are. */
static int run(char *const argv[], char *out, size_t n)
{
    int p[2];
    if (pipe(p) != 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0) {
        close(p[0]);
        close(p[1]);
        return -1;
    }
    if (pid == 0) {
        dup2(p[1], 1);
        dup2(p[1], 2);
        close(p[0]);
        close(p[1]);
        execvp(argv[0], argv);
        _exit(127);
    }
    close(p[1]);
    size_t len = 0;
    ssize_t r;
    while ((r = read(p[0], out + len, n - 1 - len)) > 0 || (r < 0 && errno == EINTR))
        if (r > 0)
            len += (size_t)r;
    out[len] = '\0';
    close(p[0]);
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR)
            return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void detach(void)
{
    char out[512];
    if (g_attached) {
        char *argv[] = {"losetup", "--detach", g_loop, NULL};
        if (run(argv, out, sizeof out) != 0)
            fprintf(stderr, "warning: losetup --detach %s failed: %s\n", g_loop, out);
        g_attached = false;
    }
    g_img[0] = '\0';
    if (g_dir[0]) {
        tv_test_rmtree(g_dir);
        g_dir[0] = '\0';
    }
}

static int resize_loop(uint64_t bytes)
{
    char out[512];
    char *argv[] = {"losetup", "--set-capacity", g_loop, NULL};
    if (truncate(g_img, (off_t)bytes) != 0)
        return -1;
    return run(argv, out, sizeof out);
}

static int teardown(void **state)
{
    (void)state;
    tv__sys_reset();
    return 0;
}

static tv__dev *open_loop(unsigned flags)
{
    tv__dev *d = NULL;
    tv_error err = {0};
    if (tv__dev_open(g_loop, flags, &d, &err) != 0)
        fail_msg("open %s: %s", g_loop, err.msg);
    return d;
}

static void test_geometry(void **state)
{
    (void)state;
    static const tv__dev_identity zero;
    tv__dev *d = open_loop(TV__DEV_O_RDWR);

    assert_int_equal(d->kind, TV__DEV_BLOCK);
    assert_int_equal(d->lba_size, 4096);
    assert_int_equal(d->io_align, 4096);
    assert_int_equal(d->object_align, 65536);
    assert_int_equal(d->size_bytes, IMG_LEN);
    assert_true(d->direct);
    assert_memory_equal(&d->ident, &zero, sizeof zero);
    tv__dev_close(d);
}

static void test_direct_io(void **state)
{
    (void)state;
    tv__dev *d = open_loop(TV__DEV_O_RDWR);
    tv_error err = {0};
    const size_t len = 1 * MIB;
    uint8_t *w = tv__dev_alloc_aligned(d, len), *r = tv__dev_alloc_aligned(d, len);
    for (size_t i = 0; i < len; i++)
        w[i] = (uint8_t)(i * 7 + (i >> 12));

    assert_int_equal(tv__dev_pwrite_full(d, w, len, 3 * MIB, &err), 0);
    assert_int_equal(tv__dev_flush(d, &err), 0);
    assert_int_equal(tv__dev_pread_full(d, r, len, 3 * MIB, &err), 0);
    assert_memory_equal(w, r, len);
    /* The bytes landed in the backing image at the same offset. */
    int fd = open(g_img, O_RDONLY);
    assert_true(fd >= 0);
    memset(r, 0, len);
    assert_int_equal(pread(fd, r, len, 3 * MIB), (ssize_t)len);
    close(fd);
    assert_memory_equal(w, r, len);
    /* The last sector is reachable, the one after is not. */
    assert_int_equal(tv__dev_pread_full(d, r, 4096, IMG_LEN - 4096, &err), 0);
    assert_int_equal(tv__dev_pread_full(d, r, 4096, IMG_LEN, &err), TV_E_INVALID_ARG);

    /* 512-byte units are not enough on a 4096-byte-sector device. */
    assert_int_equal(tv__dev_pread_full(d, r, 512, 4096, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv__dev_pwrite_full(d, w, 4096, 512, &err), TV_E_INVALID_ARG);
    /* Without our check the kernel itself refuses: the error is -EINVAL
     * with device, offset and length in the message. */
    d->direct = false;
    assert_int_equal(tv__dev_pread_full(d, r + 512, 4096, 512, &err), -EINVAL);
    assert_non_null(strstr(err.msg, g_loop));
    assert_non_null(strstr(err.msg, "offset 512"));
    d->direct = true;
    free(w);
    free(r);
    tv__dev_close(d);
}

static void test_label(void **state)
{
    (void)state;
    tv__dev *d = open_loop(TV__DEV_O_RDWR);
    tv_error err = {0};
    tv__label l, back;
    uint8_t uuid[16];

    assert_int_equal(tv__uuid_random(uuid, &err), 0);
    assert_int_equal(tv__label_init(&l, d, uuid, 65536, IMG_LEN - 65536, &err), 0);
    assert_int_equal(l.lba_size, 4096);
    assert_int_equal(l.dev_kind, TV__DEV_BLOCK);
    assert_int_equal(tv__label_write(d, &l, &err), 0);
    tv__dev_close(d);

    d = open_loop(TV__DEV_O_RDONLY);
    assert_int_equal(tv__label_read(d, 65536, &back, &err), 0);
    assert_int_equal(tv__label_check(&back, &l, d, &err), 0);
    assert_int_equal(tv__region_data_off(&back), 131072);
    tv__dev_close(d);

    /* The same bytes seen through the image file: another kind and sector
     * size, so a mismatch, never a silent success. */
    assert_int_equal(tv__dev_open(g_img, TV__DEV_O_RDONLY, &d, &err), 0);
    assert_int_equal(tv__label_read(d, 65536, &back, &err), 0);
    assert_int_equal(tv__label_check(&back, &l, d, &err), TV_E_DEVICE_MISMATCH);
    assert_non_null(strstr(err.msg, "lba size: label has 4096, device has 512"));
    tv__dev_close(d);
}

/* ---- ioctl faults ---------------------------------------------------------- */

static int g_fake_ssz;
static uint64_t g_fake_size;
static unsigned long g_fail_req;

static int fake_ioctl(int fd, unsigned long req, void *arg)
{
    if (req == g_fail_req) {
        errno = EIO;
        return -1;
    }
    if (req == BLKSSZGET && g_fake_ssz) {
        *(int *)arg = g_fake_ssz;
        return 0;
    }
    if (req == BLKGETSIZE64 && g_fake_size != UINT64_MAX) {
        *(uint64_t *)arg = g_fake_size;
        return 0;
    }
    return ioctl(fd, req, arg);
}

static void test_ioctl_faults(void **state)
{
    (void)state;
    tv__dev *d = NULL;
    tv_error err = {0};

    tv__sys.ioctl = fake_ioctl;
    g_fake_ssz = 0;
    g_fake_size = UINT64_MAX;
    g_fail_req = BLKSSZGET;
    assert_int_equal(tv__dev_open(g_loop, TV__DEV_O_RDONLY, &d, &err), -EIO);
    assert_null(d);
    assert_non_null(strstr(err.msg, "BLKSSZGET"));
    g_fail_req = BLKGETSIZE64;
    assert_int_equal(tv__dev_open(g_loop, TV__DEV_O_RDONLY, &d, &err), -EIO);
    assert_non_null(strstr(err.msg, "BLKGETSIZE64"));
    g_fail_req = 0;

    g_fake_ssz = 520;
    assert_int_equal(tv__dev_open(g_loop, TV__DEV_O_RDONLY, &d, &err), TV_E_INVALID_ARG);
    g_fake_ssz = -1;
    assert_int_equal(tv__dev_open(g_loop, TV__DEV_O_RDONLY, &d, &err), TV_E_INVALID_ARG);
    g_fake_ssz = 0;
    g_fake_size = 0;
    assert_int_equal(tv__dev_open(g_loop, TV__DEV_O_RDONLY, &d, &err), TV_E_INVALID_ARG);
    assert_non_null(strstr(err.msg, "empty"));
    g_fake_size = UINT64_MAX;

    /* A device reporting 8 KiB sectors gets 8 KiB I/O alignment. */
    g_fake_ssz = 8192;
    assert_int_equal(tv__dev_open(g_loop, TV__DEV_O_RDONLY, &d, &err), 0);
    assert_int_equal(d->lba_size, 8192);
    assert_int_equal(d->io_align, 8192);
    assert_int_equal(d->object_align, 65536);
    uint8_t *b = tv__dev_alloc_aligned(d, 8192);
    assert_int_equal(tv__dev_pread_full(d, b, 4096, 8192, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv__dev_pread_full(d, b, 8192, 8192, &err), 0);
    free(b);
    tv__dev_close(d);
}

/* Last: grows the device. */
static void test_resized(void **state)
{
    (void)state;
    tv__dev *d = open_loop(TV__DEV_O_RDWR);
    tv_error err = {0};
    tv__label l, back;
    uint8_t uuid[16] = {1, 2, 3};

    assert_int_equal(tv__label_init(&l, d, uuid, 4096, IMG_LEN - 4096, &err), 0);
    assert_int_equal(tv__label_write(d, &l, &err), 0);
    tv__dev_close(d);
    if (resize_loop(IMG_LEN + 16 * MIB) != 0) {
        print_message("losetup --set-capacity failed; resize not tested\n");
        skip();
    }
    d = open_loop(TV__DEV_O_RDONLY);
    assert_int_equal(d->size_bytes, IMG_LEN + 16 * MIB);
    assert_int_equal(tv__label_read(d, 4096, &back, &err), 0);
    assert_int_equal(tv__label_check(&back, &l, d, &err), TV_E_DEVICE_MISMATCH);
    assert_non_null(strstr(err.msg, "device size"));
    tv__dev_close(d);
}

/* The loop device and its backing file are the same device: they share the
 * backing file's key (LOOP_GET_STATUS64), whatever their paths; the in-use
 * scan sees a label written through either. */
static void test_claim_backing_file(void **state)
{
    (void)state;
    tv_error err = {0};
    tv__dev *d = open_loop(TV__DEV_O_RDWR), *f = NULL;
    assert_int_equal(tv__dev_open(g_img, TV__DEV_O_RDONLY | TV__DEV_O_NODIRECT, &f, &err), 0);
    tv__dev_claim kd, kf;
    assert_int_equal(tv__dev_claim_keys(d, &kd, &err), 0);
    assert_int_equal(tv__dev_claim_keys(f, &kf, &err), 0);
    assert_int_equal(kd.n_keys, 2);
    assert_true(!strncmp(kd.keys[0], "blk:7:", 6));
    assert_string_equal(kd.keys[1], kf.keys[0]);
    assert_true(tv__dev_claim_same(&kd, &kf));
    /* A label at an unusual region offset (8 MiB) is found by the scan of a
     * region that starts at 1 MiB (after the earlier cases' labels are
     * wiped). */
    void *zero = tv__dev_alloc_aligned(d, 16 * MIB);
    assert_non_null(zero);
    assert_int_equal(tv__dev_pwrite_full(d, zero, 16 * MIB, 0, &err), 0);
    tv__label l;
    uint8_t uuid[16] = {9, 8, 7};
    assert_int_equal(tv__label_init(&l, d, uuid, 8 * MIB, IMG_LEN - 8 * MIB, &err), 0);
    assert_int_equal(tv__label_write(d, &l, &err), 0);
    tv__dev_scan sc;
    assert_int_equal(tv__dev_claim_scan(d, MIB, IMG_LEN - MIB, &sc, &err), 0);
    assert_true(sc.label && sc.label_valid);
    assert_int_equal(sc.label_off, 8 * MIB);
    assert_memory_equal(sc.label_uuid, uuid, 16);
    /* Clean it again for the other cases. */
    assert_int_equal(tv__dev_pwrite_full(d, zero, d->io_align, 8 * MIB, &err), 0);
    assert_int_equal(tv__dev_flush(d, &err), 0);
    free(zero);
    tv__dev_close(f);
    tv__dev_close(d);
}

int main(void)
{
    char out[1024];

    if (geteuid() != 0)
        tv_test_skip("loop-device test needs root (losetup); running as uid %u",
                     (unsigned)geteuid());
    tv_test_tmpdir(g_dir, sizeof g_dir, "loop");
    atexit(detach);
    snprintf(g_img, sizeof g_img, "%s/image", g_dir);
    tv_error err = {0};
    if (tv__dev_create_image(g_img, IMG_LEN, &err) != 0)
        tv_test_skip("create image: %s", err.msg);
    char *argv[] = {"losetup", "--find", "--show", "--sector-size", "4096", g_img, NULL};
    int rc = run(argv, out, sizeof out);
    if (rc != 0 || strncmp(out, "/dev/", 5) != 0)
        tv_test_skip("losetup --find --show --sector-size 4096 failed (status %d): %s", rc, out);
    out[strcspn(out, "\n")] = '\0';
    snprintf(g_loop, sizeof g_loop, "%s", out);
    g_attached = true;
    struct stat st;
    if (stat(g_loop, &st) != 0 || !S_ISBLK(st.st_mode))
        tv_test_skip("%s attached but no block device node (no devtmpfs?)", g_loop);
    printf("testing on %s (backing %s)\n", g_loop, g_img);

    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_geometry, teardown),
        cmocka_unit_test_teardown(test_direct_io, teardown),
        cmocka_unit_test_teardown(test_label, teardown),
        cmocka_unit_test_teardown(test_ioctl_faults, teardown),
        cmocka_unit_test_teardown(test_claim_backing_file, teardown),
        cmocka_unit_test_teardown(test_resized, teardown),
    };
    rc = cmocka_run_group_tests(tests, NULL, NULL);
    detach();
    return rc;
}
