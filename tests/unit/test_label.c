/* Unit tests of the store label (core/src/dev/label.c): on-disk encoding,
 * round trip, every corruption and mismatch -> TV_E_DEVICE_MISMATCH, region
 * validation, and injected I/O faults (tv__sys restored by the teardown). */
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

#define MIB        (1024u * 1024u)
#define IMG_LEN    (16 * MIB)
#define REGION_OFF 4096u
#define REGION_LEN (IMG_LEN - REGION_OFF)

static char g_dir[256];
static char g_img[300];
static const uint8_t g_uuid[16] = {0x10, 0x32, 0x54, 0x76, 0x98, 0xba, 0x4c, 0xde,
                                   0x8f, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd};

static int setup(void **state)
{
    (void)state;
    tv_test_tmpdir(g_dir, sizeof g_dir, "label");
    tv_test_path(g_img, sizeof g_img, "%s/image", g_dir);
    if (tv__dev_create_image(g_img, IMG_LEN, NULL) != 0)
        return -1;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    tv_test_fault_reset();
    tv_test_rmtree(g_dir);
    return 0;
}

static tv__dev *open_rw(void)
{
    tv__dev *d = NULL;
    tv_error err = {0};
    if (tv__dev_open(g_img, TV__DEV_O_RDWR, &d, &err) != 0)
        fail_msg("open %s: %s", g_img, err.msg);
    return d;
}

/* Writes a fresh label and returns the device with it, plus the label. */
static tv__dev *labelled(tv__label *l)
{
    tv__dev *d = open_rw();
    tv_error err = {0};
    assert_int_equal(tv__label_init(l, d, g_uuid, REGION_OFF, REGION_LEN, &err), 0);
    assert_int_equal(tv__label_write(d, l, &err), 0);
    return d;
}

/* Raw access to the image, behind the library's back. */
static void poke(uint64_t off, const void *p, size_t n)
{
    int fd = open(g_img, O_WRONLY);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, p, n, (off_t)off), (ssize_t)n);
    close(fd);
}
static void peek(uint64_t off, void *p, size_t n)
{
    int fd = open(g_img, O_RDONLY);
    assert_true(fd >= 0);
    assert_int_equal(pread(fd, p, n, (off_t)off), (ssize_t)n);
    close(fd);
}

static void expect_mismatch(int rc, const tv_error *err, const char *needle)
{
    assert_int_equal(rc, TV_E_DEVICE_MISMATCH);
    assert_int_equal(err->code, TV_E_DEVICE_MISMATCH);
    if (!strstr(err->msg, needle))
        fail_msg("message \"%s\" does not mention \"%s\"", err->msg, needle);
}

/* ---- encoding ----------------------------------------------------------- */

static void test_round_trip(void **state)
{
    (void)state;
    tv__label l, back;
    tv_error err = {0};
    tv__dev *d = labelled(&l);

    assert_int_equal(tv__label_read(d, REGION_OFF, &back, &err), 0);
    assert_memory_equal(back.magic, TV__LABEL_MAGIC, 8);
    assert_int_equal(back.version, 1);
    assert_int_equal(back.label_len, 512);
    assert_memory_equal(back.store_uuid, g_uuid, 16);
    assert_int_equal(back.lba_size, 512);
    assert_int_equal(back.io_align, 4096);
    assert_int_equal(back.object_align, 65536);
    assert_int_equal(back.region_off, REGION_OFF);
    assert_int_equal(back.region_len, REGION_LEN);
    assert_int_equal(back.size_bytes, IMG_LEN);
    assert_int_equal(back.dev_kind, TV__DEV_FILE);
    assert_int_equal(tv__label_check(&back, &l, d, &err), 0);
    assert_int_equal(tv__label_check(&back, NULL, d, &err), 0);
    /* Objects start at the first 64 KiB boundary after the label block. */
    assert_int_equal(tv__region_data_off(&back), 65536);
    tv__dev_close(d);

    /* And again through a read-only, buffered open. */
    assert_int_equal(tv__dev_open(g_img, TV__DEV_O_RDONLY | TV__DEV_O_NODIRECT, &d, &err), 0);
    assert_int_equal(tv__label_read(d, REGION_OFF, &back, &err), 0);
    assert_int_equal(tv__label_check(&back, &l, d, &err), 0);
    tv__dev_close(d);
}

static void test_on_disk_bytes(void **state)
{
    (void)state;
    tv__label l;
    tv__dev *d = labelled(&l);
    uint8_t raw[4096];

    tv__dev_close(d);
    peek(REGION_OFF, raw, sizeof raw);
    assert_memory_equal(raw, "TVSTORE1", 8);
    /* Little-endian whatever the host. */
    static const uint8_t version[4] = {1, 0, 0, 0}, len[4] = {0, 2, 0, 0};
    static const uint8_t io_align[4] = {0, 0x10, 0, 0};
    static const uint8_t region_off[8] = {0, 0x10, 0, 0, 0, 0, 0, 0};
    static const uint8_t dev_size[8] = {0, 0, 0, 1, 0, 0, 0, 0};
    assert_memory_equal(raw + 8, version, 4);
    assert_memory_equal(raw + 12, len, 4);
    assert_memory_equal(raw + 16, g_uuid, 16);
    assert_memory_equal(raw + 36, io_align, 4);
    assert_memory_equal(raw + 40, region_off, 8);
    assert_memory_equal(raw + 64, dev_size, 8);
    assert_int_equal(raw[72], TV__DEV_FILE);
    /* Reserved bytes and the rest of the block are zero. */
    for (size_t i = 164; i < 480; i++)
        assert_int_equal(raw[i], 0);
    for (size_t i = 512; i < sizeof raw; i++)
        assert_int_equal(raw[i], 0);
    /* Nothing was written before the region (LBA 0 stays untouched). */
    peek(0, raw, 4096);
    for (size_t i = 0; i < 4096; i++)
        assert_int_equal(raw[i], 0);

    /* encode/decode are inverse and deterministic. */
    uint8_t a[512], b[512];
    tv__label back;
    tv__label_encode(&l, a);
    assert_int_equal(tv__label_decode(a, &back, NULL), 0);
    tv__label_encode(&back, b);
    assert_memory_equal(a, b, 512);
}

/* ---- corruption ---------------------------------------------------------- */

static void test_bad_magic(void **state)
{
    (void)state;
    tv__label l, back;
    tv_error err = {0};
    tv__dev *d = labelled(&l);

    poke(REGION_OFF, "X", 1);
    expect_mismatch(tv__label_read(d, REGION_OFF, &back, &err), &err, "magic");
    assert_non_null(strstr(err.msg, g_img));
    /* An unlabelled region (all zero) is a mismatch too, not garbage. */
    expect_mismatch(tv__label_read(d, 8 * REGION_OFF, &back, &err), &err, "magic");
    tv__dev_close(d);
}

static void test_bad_checksum(void **state)
{
    (void)state;
    tv__label l, back;
    tv_error err = {0};
    tv__dev *d = labelled(&l);
    static const size_t where[] = {16, 40, 64, 72, 100, 200, 479, 480, 511};

    for (size_t i = 0; i < TV_ARRAY_LEN(where); i++) {
        uint8_t orig, flip;
        peek(REGION_OFF + where[i], &orig, 1);
        flip = orig ^ 0x01;
        poke(REGION_OFF + where[i], &flip, 1);
        expect_mismatch(tv__label_read(d, REGION_OFF, &back, &err), &err, "checksum");
        poke(REGION_OFF + where[i], &orig, 1);
    }
    assert_int_equal(tv__label_read(d, REGION_OFF, &back, &err), 0);
    tv__dev_close(d);
}

static void test_bad_version_and_len(void **state)
{
    (void)state;
    tv__label l, back;
    tv_error err = {0};
    tv__dev *d = labelled(&l);
    uint8_t raw[512];

    /* A well-formed label of a future version (valid checksum). */
    l.version = 2;
    tv__label_encode(&l, raw);
    poke(REGION_OFF, raw, sizeof raw);
    expect_mismatch(tv__label_read(d, REGION_OFF, &back, &err), &err, "version 2");
    l.version = 1;
    l.label_len = 1024;
    tv__label_encode(&l, raw);
    poke(REGION_OFF, raw, sizeof raw);
    expect_mismatch(tv__label_read(d, REGION_OFF, &back, &err), &err, "label_len");
    tv__dev_close(d);
}

static void test_label_moved(void **state)
{
    (void)state;
    tv__label l, back;
    tv_error err = {0};
    tv__dev *d = labelled(&l);
    uint8_t raw[512];

    /* A label block copied to another offset does not describe that region. */
    peek(REGION_OFF, raw, sizeof raw);
    poke(2 * MIB, raw, sizeof raw);
    expect_mismatch(tv__label_read(d, 2 * MIB, &back, &err), &err, "records region offset");
    tv__dev_close(d);
}

/* ---- mismatches against the registry and the device ----------------------- */

static void test_changed_uuid(void **state)
{
    (void)state;
    tv__label l, back, expected;
    tv_error err = {0};
    tv__dev *d = labelled(&l);

    assert_int_equal(tv__label_read(d, REGION_OFF, &back, &err), 0);
    expected = l;
    expected.store_uuid[15] ^= 0xff;
    expect_mismatch(tv__label_check(&back, &expected, d, &err), &err, "store uuid");
    assert_non_null(strstr(err.msg, "10325476-98ba-4cde-8f01-23456789abcd"));
    assert_non_null(strstr(err.msg, "10325476-98ba-4cde-8f01-23456789ab32"));
    tv__dev_close(d);
}

static void test_expected_fields(void **state)
{
    (void)state;
    tv__label l, back, e;
    tv_error err = {0};
    tv__dev *d = labelled(&l);

    assert_int_equal(tv__label_read(d, REGION_OFF, &back, &err), 0);
    e = l;
    e.region_off = 8192;
    expect_mismatch(tv__label_check(&back, &e, d, &err), &err, "region offset");
    assert_non_null(strstr(err.msg, "4096"));
    assert_non_null(strstr(err.msg, "8192"));
    e = l;
    e.region_len -= 4096;
    expect_mismatch(tv__label_check(&back, &e, d, &err), &err, "region length");
    e = l;
    e.size_bytes *= 2;
    expect_mismatch(tv__label_check(&back, &e, d, &err), &err, "device size");
    e = l;
    e.dev_kind = TV__DEV_NVME;
    expect_mismatch(tv__label_check(&back, &e, d, &err), &err, "kind: label has file");
    e = l;
    e.object_align = 131072;
    expect_mismatch(tv__label_check(&back, &e, d, &err), &err, "object_align");
    tv__dev_close(d);
}

/* The record the registry and the snapshot keep for a device maps to the
 * label tv__label_init writes for it, and a record that differs in one
 * field makes tv__label_check name that field. */
static void test_expected_from_record(void **state)
{
    (void)state;
    tv__label l, back, want;
    tv_error err = {0};
    tv__dev *d = labelled(&l);
    tv__dev_record rec = {.kind = TV__DEV_FILE,
                          .lba_size = d->lba_size,
                          .io_align = d->io_align,
                          .object_align = d->object_align,
                          .size_bytes = d->size_bytes,
                          .region_off = REGION_OFF,
                          .region_len = REGION_LEN};
    memcpy(rec.store_uuid, g_uuid, 16);

    memset(&want, 0xee, sizeof want);
    tv__label_expected(&rec, &want);
    assert_memory_equal(&want, &l, sizeof l); /* every byte, reserved and checksum zero */
    assert_int_equal(tv__label_read(d, REGION_OFF, &back, &err), 0);
    assert_int_equal(tv__label_check(&back, &want, d, &err), 0);

    tv__dev_record r = rec;
    r.size_bytes += 4096;
    tv__label_expected(&r, &want);
    expect_mismatch(tv__label_check(&back, &want, d, &err), &err, "device size");
    r = rec;
    r.store_uuid[15] ^= 1;
    tv__label_expected(&r, &want);
    expect_mismatch(tv__label_check(&back, &want, d, &err), &err, "uuid");
    r = rec;
    memcpy(r.serial, "S123", 4);
    tv__label_expected(&r, &want);
    expect_mismatch(tv__label_check(&back, &want, d, &err), &err, "serial");
    r = rec;
    r.eui64[0] = 1;
    tv__label_expected(&r, &want);
    expect_mismatch(tv__label_check(&back, &want, d, &err), &err, "eui64");
    tv__dev_close(d);
}

static void test_resized_image(void **state)
{
    (void)state;
    tv__label l, back;
    tv_error err = {0};
    tv__dev *d = labelled(&l);
    tv__dev_close(d);

    assert_int_equal(truncate(g_img, IMG_LEN + 1 * MIB), 0);
    assert_int_equal(tv__dev_open(g_img, TV__DEV_O_RDWR, &d, &err), 0);
    assert_int_equal(tv__label_read(d, REGION_OFF, &back, &err), 0);
    expect_mismatch(tv__label_check(&back, &l, d, &err), &err, "device size");
    assert_non_null(strstr(err.msg, "16777216"));
    assert_non_null(strstr(err.msg, "17825792"));
    tv__dev_close(d);

    /* Shrunk below the region: still a mismatch (never a crash or a read
     * past the end). */
    assert_int_equal(truncate(g_img, 8 * MIB), 0);
    assert_int_equal(tv__dev_open(g_img, TV__DEV_O_RDWR, &d, &err), 0);
    assert_int_equal(tv__label_read(d, REGION_OFF, &back, &err), 0);
    expect_mismatch(tv__label_check(&back, &l, d, &err), &err, "device size");
    tv__dev_close(d);
}

static void test_different_lba_size(void **state)
{
    (void)state;
    tv__label l, back, e;
    tv_error err = {0};
    tv__dev *d = labelled(&l);

    assert_int_equal(tv__label_read(d, REGION_OFF, &back, &err), 0);
    /* The registry recorded a 4096-byte-sector device. */
    e = l;
    e.lba_size = 4096;
    expect_mismatch(tv__label_check(&back, &e, d, &err), &err, "lba size");
    assert_non_null(strstr(err.msg, "512"));
    assert_non_null(strstr(err.msg, "4096"));
    /* The device now reports another sector size (e.g. reformatted). */
    d->lba_size = 4096;
    expect_mismatch(tv__label_check(&back, &l, d, &err), &err, "lba size");
    assert_non_null(strstr(err.msg, "device has 4096"));
    d->lba_size = 512;
    d->io_align = 8192;
    expect_mismatch(tv__label_check(&back, &l, d, &err), &err, "io_align");
    d->io_align = 4096;
    d->kind = TV__DEV_BLOCK;
    expect_mismatch(tv__label_check(&back, &l, d, &err), &err, "kind");
    tv__dev_close(d);
}

static void test_nvme_identity(void **state)
{
    (void)state;
    tv__label l, back, e;
    tv_error err = {0};
    tv__dev *d = open_rw();

    /* Pretend the image is an NVMe namespace with an identity. */
    d->kind = TV__DEV_NVME;
    strcpy(d->ident.serial, "S64ANS0T123456");
    memset(d->ident.model, 'M', 40); /* a model that fills its 40 bytes */
    d->ident.model[40] = '\0';
    d->ident.nsid = 1;
    for (int i = 0; i < 16; i++)
        d->ident.nguid[i] = (uint8_t)(0xa0 + i);
    for (int i = 0; i < 8; i++)
        d->ident.eui64[i] = (uint8_t)(0x30 + i);
    assert_int_equal(tv__label_init(&l, d, g_uuid, REGION_OFF, REGION_LEN, &err), 0);
    assert_memory_equal(l.serial, "S64ANS0T123456\0\0\0\0\0\0", 20);
    assert_memory_equal(l.model, d->ident.model, 40); /* full, no NUL */
    assert_int_equal(tv__label_write(d, &l, &err), 0);
    assert_int_equal(tv__label_read(d, REGION_OFF, &back, &err), 0);
    assert_int_equal(tv__label_check(&back, &l, d, &err), 0);
    assert_int_equal(back.nsid, 1);

    /* A swapped disk: each identity field on its own. */
    strcpy(d->ident.serial, "S64ANS0T999999");
    expect_mismatch(tv__label_check(&back, &l, d, &err), &err, "nvme serial");
    assert_non_null(strstr(err.msg, "S64ANS0T123456"));
    assert_non_null(strstr(err.msg, "S64ANS0T999999"));
    strcpy(d->ident.serial, "S64ANS0T123456");
    d->ident.model[0] = 'X';
    expect_mismatch(tv__label_check(&back, &l, d, &err), &err, "nvme model");
    d->ident.model[0] = 'M';
    d->ident.nsid = 2;
    expect_mismatch(tv__label_check(&back, &l, d, &err), &err, "nvme nsid");
    d->ident.nsid = 1;
    d->ident.nguid[15] ^= 1;
    expect_mismatch(tv__label_check(&back, &l, d, &err), &err, "nvme nguid");
    assert_non_null(strstr(err.msg, "a0a1a2a3a4a5a6a7a8a9aaabacadaeaf"));
    d->ident.nguid[15] ^= 1;
    d->ident.eui64[0] ^= 1;
    expect_mismatch(tv__label_check(&back, &l, d, &err), &err, "nvme eui64");
    d->ident.eui64[0] ^= 1;
    assert_int_equal(tv__label_check(&back, &l, d, &err), 0);
    /* The registry expects another namespace. */
    e = l;
    e.nsid = 7;
    expect_mismatch(tv__label_check(&back, &e, d, &err), &err, "nvme nsid");
    tv__dev_close(d);
}

/* ---- region validation ------------------------------------------------------ */

static void test_region_validation(void **state)
{
    (void)state;
    tv__label l;
    tv_error err = {0};
    tv__dev *d = open_rw();

    /* Offset 0 (LBA 0) is never used. */
    assert_int_equal(tv__label_init(&l, d, g_uuid, 0, IMG_LEN, &err), TV_E_INVALID_ARG);
    assert_non_null(strstr(err.msg, "offset 0"));
    assert_int_equal(tv__label_read(d, 0, &l, &err), TV_E_INVALID_ARG);
    /* Misaligned. */
    assert_int_equal(tv__label_init(&l, d, g_uuid, 512, IMG_LEN - 512, &err), TV_E_INVALID_ARG);
    assert_non_null(strstr(err.msg, "io_align"));
    assert_int_equal(tv__label_read(d, 512, &l, &err), TV_E_INVALID_ARG);
    /* Past the end. */
    assert_int_equal(tv__label_init(&l, d, g_uuid, 4096, IMG_LEN, &err), TV_E_INVALID_ARG);
    assert_non_null(strstr(err.msg, "past the end"));
    assert_int_equal(tv__label_init(&l, d, g_uuid, IMG_LEN + 4096, 1 * MIB, &err),
                     TV_E_INVALID_ARG);
    assert_int_equal(tv__label_read(d, IMG_LEN, &l, &err), TV_E_INVALID_ARG);
    /* Overflow. */
    assert_int_equal(tv__label_init(&l, d, g_uuid, UINT64_MAX - 4095, 8192, &err), TV_E_OVERFLOW);
    assert_int_equal(tv__label_read(d, UINT64_MAX - 4095, &l, &err), TV_E_INVALID_ARG);
    /* Too small for the label plus one object: [4096, 64K) has no room, and
     * data starts at 64K so the region must reach 128K. */
    assert_int_equal(tv__label_init(&l, d, g_uuid, 4096, 65536 - 4096, &err), TV_E_INVALID_ARG);
    assert_non_null(strstr(err.msg, "too small"));
    assert_int_equal(tv__label_init(&l, d, g_uuid, 4096, 131072 - 4096 - 1, &err),
                     TV_E_INVALID_ARG);
    assert_int_equal(tv__label_init(&l, d, g_uuid, 4096, 131072 - 4096, &err), 0);
    assert_int_equal(tv__region_data_off(&l), 65536);
    /* A region starting on an object boundary: data starts one object later. */
    assert_int_equal(tv__label_init(&l, d, g_uuid, 65536, 2 * 65536, &err), 0);
    assert_int_equal(tv__region_data_off(&l), 131072);
    /* A label whose region is tampered with is refused on write. */
    l.region_off = 0;
    assert_int_equal(tv__label_write(d, &l, &err), TV_E_INVALID_ARG);
    l.region_off = 65536;
    l.region_len = IMG_LEN;
    assert_int_equal(tv__label_write(d, &l, &err), TV_E_INVALID_ARG);
    /* Bad input never crashes the offset helper. */
    l.region_off = UINT64_MAX - 4095;
    assert_int_equal(tv__region_data_off(&l), 0);
    assert_int_equal(tv__region_data_off(NULL), 0);
    tv__dev_close(d);
}

/* ---- faults ---------------------------------------------------------------- */

static void test_io_faults(void **state)
{
    (void)state;
    tv__label l, back;
    tv_error err = {0};
    tv__dev *d = open_rw();

    assert_int_equal(tv__label_init(&l, d, g_uuid, REGION_OFF, REGION_LEN, &err), 0);
    tv_test_fault_install();
    tv_test_fault_fail(TV_TEST_SYS_PWRITE, 1, EIO, true);
    assert_int_equal(tv__label_write(d, &l, &err), -EIO);
    tv_test_fault_clear();
    tv_test_fault_fail(TV_TEST_SYS_FDATASYNC, 1, EIO, true);
    assert_int_equal(tv__label_write(d, &l, &err), -EIO);
    assert_true(tv_test_fault_fired() > 0);
    tv_test_fault_clear();
    tv_test_fault_fail(TV_TEST_SYS_PREAD, 1, EIO, true);
    assert_int_equal(tv__label_read(d, REGION_OFF, &back, &err), -EIO);
    tv_test_fault_reset();
    assert_int_equal(tv__label_read(d, REGION_OFF, &back, &err), 0);
    tv__dev_close(d);
}

static void test_uuid(void **state)
{
    (void)state;
    uint8_t a[16], b[16];
    char s[37];

    assert_int_equal(tv__uuid_random(a, NULL), 0);
    assert_int_equal(tv__uuid_random(b, NULL), 0);
    assert_memory_not_equal(a, b, 16);
    assert_int_equal(a[6] >> 4, 4);
    assert_int_equal(a[8] & 0xc0, 0x80);
    tv__uuid_format(g_uuid, s);
    assert_string_equal(s, "10325476-98ba-4cde-8f01-23456789abcd");
}

static void test_null_args(void **state)
{
    (void)state;
    tv__label l;
    tv_error err = {0};
    tv__dev *d = open_rw();
    assert_int_equal(tv__label_init(NULL, d, g_uuid, REGION_OFF, REGION_LEN, &err),
                     TV_E_INVALID_ARG);
    assert_int_equal(tv__label_init(&l, NULL, g_uuid, REGION_OFF, REGION_LEN, &err),
                     TV_E_INVALID_ARG);
    assert_int_equal(tv__label_write(NULL, &l, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv__label_read(d, REGION_OFF, NULL, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv__label_check(NULL, NULL, d, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv__label_decode(NULL, &l, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv__region_validate(NULL, REGION_OFF, REGION_LEN, &err), TV_E_INVALID_ARG);
    tv__dev_close(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_on_disk_bytes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_magic, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_checksum, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_version_and_len, setup, teardown),
        cmocka_unit_test_setup_teardown(test_label_moved, setup, teardown),
        cmocka_unit_test_setup_teardown(test_changed_uuid, setup, teardown),
        cmocka_unit_test_setup_teardown(test_expected_fields, setup, teardown),
        cmocka_unit_test_setup_teardown(test_expected_from_record, setup, teardown),
        cmocka_unit_test_setup_teardown(test_resized_image, setup, teardown),
        cmocka_unit_test_setup_teardown(test_different_lba_size, setup, teardown),
        cmocka_unit_test_setup_teardown(test_nvme_identity, setup, teardown),
        cmocka_unit_test_setup_teardown(test_region_validation, setup, teardown),
        cmocka_unit_test_setup_teardown(test_io_faults, setup, teardown),
        cmocka_unit_test_setup_teardown(test_uuid, setup, teardown),
        cmocka_unit_test_setup_teardown(test_null_args, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
