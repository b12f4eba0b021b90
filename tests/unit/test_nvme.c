/* Unit tests of the NVMe Identify decoder (core/src/dev/nvme_identify.c),
 * without hardware: fixtures from tests/data/nvme (made by gen_identify.py)
 * plus buffers built here for each malformed case. The hardware test is
 * test_nvme_hw.c. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "dev/dev.h"
#include "util/endian.h"

#define ID_LEN TV__NVME_IDENTIFY_LEN

static uint8_t g_ctrl[ID_LEN], g_ns[ID_LEN];

static void load(const char *name, uint8_t *buf)
{
    char path[256];
    snprintf(path, sizeof path, "data/nvme/%s", name);
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        fail_msg("open fixture %s (tests run from tests/): %s", path, strerror(errno));
    assert_int_equal(read(fd, buf, ID_LEN), ID_LEN);
    close(fd);
}

/* A namespace of nsze blocks with n_formats LBA formats whose LBADS are
 * given, format `active` in use. */
static void make_ns(uint8_t *ns, uint64_t nsze, const unsigned *lbads, unsigned n_formats,
                    unsigned active)
{
    memset(ns, 0, ID_LEN);
    tv__le64_put(ns, nsze);
    tv__le64_put(ns + 8, nsze);
    ns[25] = (uint8_t)(n_formats - 1);
    ns[26] = (uint8_t)((active & 0x0f) | ((active >> 4) & 0x03) << 5);
    for (unsigned i = 0; i < n_formats; i++)
        tv__le32_put(ns + 128 + 4 * i, lbads[i] << 16);
}

static void make_ctrl(uint8_t *c, const char *sn, const char *mn, const char *fr)
{
    memset(c, 0, ID_LEN);
    memset(c + 4, ' ', 20 + 40 + 8);
    memcpy(c + 4, sn, strlen(sn));
    memcpy(c + 24, mn, strlen(mn));
    memcpy(c + 64, fr, strlen(fr));
}

static int setup(void **state)
{
    (void)state;
    make_ctrl(g_ctrl, "SN1", "Model", "FW1");
    return 0;
}

/* ---- fixtures ------------------------------------------------------------- */

static void test_fixture_4k(void **state)
{
    (void)state;
    tv__dev_identity id;
    tv_error err = {0};
    static const uint8_t nguid[16] = {0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17,
                                      0x18, 0x19, 0x1a, 0x1b, 0x1c, 0x1d, 0x1e, 0x1f};
    static const uint8_t eui64[8] = {0x00, 0x25, 0x38, 0xb1, 0x21, 0x90, 0x4a, 0x7f};

    load("id_ctrl.bin", g_ctrl);
    load("id_ns_4k.bin", g_ns);
    memset(&id, 0xee, sizeof id);
    assert_int_equal(tv__nvme_parse_identify(g_ctrl, g_ns, 1, &id, &err), 0);
    assert_string_equal(id.serial, "S64ANS0T123456");
    assert_string_equal(id.model, "SAMSUNG MZQL23T8HCLS-00A07");
    assert_string_equal(id.firmware, "GDC5602Q");
    assert_int_equal(id.nsid, 1);
    assert_int_equal(id.lba_size, 4096); /* LBADS 12 */
    assert_int_equal(id.capacity_lba, 937684566);
    assert_memory_equal(id.nguid, nguid, 16);
    assert_memory_equal(id.eui64, eui64, 8);
}

static void test_fixture_512(void **state)
{
    (void)state;
    tv__dev_identity id;
    tv_error err = {0};

    load("id_ctrl.bin", g_ctrl);
    load("id_ns_512.bin", g_ns);
    assert_int_equal(tv__nvme_parse_identify(g_ctrl, g_ns, 3, &id, &err), 0);
    assert_int_equal(id.lba_size, 512); /* LBADS 9 */
    assert_int_equal(id.capacity_lba, 7501476528ull);
    assert_int_equal(id.nsid, 3);
    /* Same drive, both formats: the same bytes of capacity. */
    assert_int_equal(id.capacity_lba * id.lba_size, 937684566ull * 4096);
}

/* ---- LBA formats ------------------------------------------------------------ */

static void test_lbads_range(void **state)
{
    (void)state;
    tv__dev_identity id;
    tv_error err = {0};

    for (unsigned lbads = 9; lbads <= 16; lbads++) {
        make_ns(g_ns, 1000, &lbads, 1, 0);
        assert_int_equal(tv__nvme_parse_identify(g_ctrl, g_ns, 1, &id, &err), 0);
        assert_int_equal(id.lba_size, 1u << lbads);
    }
    static const unsigned bad[] = {0, 1, 8, 17, 31, 63, 255};
    for (size_t i = 0; i < TV_ARRAY_LEN(bad); i++) {
        make_ns(g_ns, 1000, &bad[i], 1, 0);
        assert_int_equal(tv__nvme_parse_identify(g_ctrl, g_ns, 1, &id, &err), TV_E_INVALID_ARG);
        assert_non_null(strstr(err.msg, "LBADS"));
    }
}

static void test_flbas_index(void **state)
{
    (void)state;
    tv__dev_identity id;
    tv_error err = {0};
    unsigned lbads[20];
    for (unsigned i = 0; i < 20; i++)
        lbads[i] = 9 + i % 4; /* 512, 1K, 2K, 4K, ... */

    /* Low nibble only. */
    make_ns(g_ns, 1000, lbads, 4, 3);
    assert_int_equal(tv__nvme_parse_identify(g_ctrl, g_ns, 1, &id, &err), 0);
    assert_int_equal(id.lba_size, 4096);
    /* More than 16 formats: bits 6:5 of FLBAS are the high bits (17 -> 1K). */
    make_ns(g_ns, 1000, lbads, 20, 17);
    assert_int_equal(g_ns[26], 0x21);
    assert_int_equal(tv__nvme_parse_identify(g_ctrl, g_ns, 1, &id, &err), 0);
    assert_int_equal(id.lba_size, 1024);
    /* Bit 4 (extended metadata) is not part of the index. */
    make_ns(g_ns, 1000, lbads, 4, 2);
    g_ns[26] |= 0x10;
    assert_int_equal(tv__nvme_parse_identify(g_ctrl, g_ns, 1, &id, &err), 0);
    assert_int_equal(id.lba_size, 2048);
    /* Active format beyond the listed ones. */
    make_ns(g_ns, 1000, lbads, 2, 2);
    assert_int_equal(tv__nvme_parse_identify(g_ctrl, g_ns, 1, &id, &err), TV_E_INVALID_ARG);
    assert_non_null(strstr(err.msg, "LBA format"));
    make_ns(g_ns, 1000, lbads, 4, 0);
    g_ns[26] = 0x20; /* index 16 with only 4 formats */
    assert_int_equal(tv__nvme_parse_identify(g_ctrl, g_ns, 1, &id, &err), TV_E_INVALID_ARG);
    /* NLBAF itself out of range (at most 64 formats). */
    make_ns(g_ns, 1000, lbads, 1, 0);
    g_ns[25] = 64;
    assert_int_equal(tv__nvme_parse_identify(g_ctrl, g_ns, 1, &id, &err), TV_E_INVALID_ARG);
    g_ns[25] = 0xff;
    g_ns[26] = 0x6f; /* the largest encodable index, 63 */
    assert_int_equal(tv__nvme_parse_identify(g_ctrl, g_ns, 1, &id, &err), TV_E_INVALID_ARG);
}

static void test_capacity(void **state)
{
    (void)state;
    tv__dev_identity id;
    tv_error err = {0};
    unsigned l12 = 12;

    make_ns(g_ns, 0, &l12, 1, 0);
    assert_int_equal(tv__nvme_parse_identify(g_ctrl, g_ns, 1, &id, &err), TV_E_INVALID_ARG);
    assert_non_null(strstr(err.msg, "NSZE"));
    make_ns(g_ns, UINT64_MAX / 4096 + 1, &l12, 1, 0);
    assert_int_equal(tv__nvme_parse_identify(g_ctrl, g_ns, 1, &id, &err), TV_E_OVERFLOW);
    make_ns(g_ns, UINT64_MAX / 4096, &l12, 1, 0);
    assert_int_equal(tv__nvme_parse_identify(g_ctrl, g_ns, 1, &id, &err), 0);
    assert_int_equal(id.capacity_lba, UINT64_MAX / 4096);
}

/* ---- ASCII fields ------------------------------------------------------------ */

static void test_ascii_trim(void **state)
{
    (void)state;
    tv__dev_identity id;
    tv_error err = {0};
    unsigned l9 = 9;
    make_ns(g_ns, 100, &l9, 1, 0);

    /* Fields that fill their width keep every byte. */
    make_ctrl(g_ctrl, "ABCDEFGHIJKLMNOPQRST", "0123456789012345678901234567890123456789",
              "12345678");
    assert_int_equal(tv__nvme_parse_identify(g_ctrl, g_ns, 1, &id, &err), 0);
    assert_string_equal(id.serial, "ABCDEFGHIJKLMNOPQRST");
    assert_string_equal(id.model, "0123456789012345678901234567890123456789");
    assert_string_equal(id.firmware, "12345678");

    /* Leading spaces (right-justified serials), NUL padding, inner spaces. */
    make_ctrl(g_ctrl, "      XYZ123", "Vendor  Model X", "1.0");
    memset(g_ctrl + 24 + 15, 0, 25);
    assert_int_equal(tv__nvme_parse_identify(g_ctrl, g_ns, 1, &id, &err), 0);
    assert_string_equal(id.serial, "XYZ123");
    assert_string_equal(id.model, "Vendor  Model X");
    assert_string_equal(id.firmware, "1.0");

    /* All blank, and unprintable bytes (never a NUL inside, never raw
     * control characters in messages). */
    make_ctrl(g_ctrl, "",
              "A\nB\x01"
              "C\xff",
              "");
    g_ctrl[4 + 3] = 0; /* an embedded NUL followed by text */
    g_ctrl[4 + 4] = 'Z';
    assert_int_equal(tv__nvme_parse_identify(g_ctrl, g_ns, 1, &id, &err), 0);
    assert_string_equal(id.serial, "?Z");
    assert_string_equal(id.model, "A?B?C?");
    assert_string_equal(id.firmware, "");
}

static void test_bad_args(void **state)
{
    (void)state;
    tv__dev_identity id;
    tv_error err = {0};
    assert_int_equal(tv__nvme_parse_identify(NULL, g_ns, 1, &id, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv__nvme_parse_identify(g_ctrl, NULL, 1, &id, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv__nvme_parse_identify(g_ctrl, g_ns, 1, NULL, &err), TV_E_INVALID_ARG);
}

/* Any bytes at all: never a crash, and on success a sane identity. */
static void test_random_bytes(void **state)
{
    (void)state;
    tv__dev_identity id;
    uint32_t x = 12345;
    for (int round = 0; round < 2000; round++) {
        for (size_t i = 0; i < ID_LEN; i++) {
            x = x * 1103515245u + 12345u;
            g_ctrl[i] = (uint8_t)(x >> 16);
            x = x * 1103515245u + 12345u;
            g_ns[i] = (uint8_t)(x >> 16);
        }
        g_ns[25] = (uint8_t)(round % 70);
        int rc = tv__nvme_parse_identify(g_ctrl, g_ns, 1, &id, NULL);
        if (rc == 0) {
            assert_true(id.lba_size >= 512 && id.lba_size <= 65536);
            assert_true(strlen(id.serial) <= 20 && strlen(id.model) <= 40);
            for (const char *p = id.model; *p; p++)
                assert_true(*p >= 0x20 && *p < 0x7f);
        } else {
            assert_true(rc == TV_E_INVALID_ARG || rc == TV_E_OVERFLOW);
        }
    }
}

/* tv__nvme_identify on something that is not an NVMe namespace fails
 * cleanly: not-supported without libnvme, an errno with it. */
static void test_identify_not_nvme(void **state)
{
    (void)state;
    tv__dev_identity id;
    tv_error err = {0};
    int fd = open("/dev/null", O_RDONLY);
    assert_true(fd >= 0);
    int rc = tv__nvme_identify(fd, &id, &err);
    close(fd);
    assert_int_not_equal(rc, 0);
    assert_int_equal(err.code, rc);
    print_message("tv__nvme_identify(/dev/null): %s (%s)\n", tv_err_name(rc), err.msg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_fixture_4k, setup),
        cmocka_unit_test_setup(test_fixture_512, setup),
        cmocka_unit_test_setup(test_lbads_range, setup),
        cmocka_unit_test_setup(test_flbas_index, setup),
        cmocka_unit_test_setup(test_capacity, setup),
        cmocka_unit_test_setup(test_ascii_trim, setup),
        cmocka_unit_test_setup(test_bad_args, setup),
        cmocka_unit_test_setup(test_random_bytes, setup),
        cmocka_unit_test_setup(test_identify_not_nvme, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
