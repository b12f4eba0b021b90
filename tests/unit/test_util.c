/* Unit tests for the shared helpers of util/: hex (encode both cases, exact
 * decode), endian (little-endian get/put of 16, 32 and 64 bits at any
 * alignment), hash (seeded, length-sensitive, stable) and the uuid text form
 * built on hex (dev/label.c). */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dev/dev.h"
#include "util/endian.h"
#include "util/hash.h"
#include "util/hex.h"
#include "util/internal.h"

/* ---- hex -------------------------------------------------------------------- */

static void test_hex_encode(void **state)
{
    (void)state;
    static const uint8_t b[] = {0x00, 0x01, 0x7f, 0x80, 0xab, 0xcd, 0xef, 0xff};
    char out[2 * sizeof b + 2];
    memset(out, 'x', sizeof out);
    tv__hex_encode(b, sizeof b, false, out);
    assert_string_equal(out, "00017f80abcdefff");
    assert_int_equal(out[2 * sizeof b + 1], 'x'); /* nothing past the NUL */
    tv__hex_encode(b, sizeof b, true, out);
    assert_string_equal(out, "00017F80ABCDEFFF");
    out[0] = 'x';
    tv__hex_encode(b, 0, false, out);
    assert_string_equal(out, "");
}

static void test_hex_digit(void **state)
{
    (void)state;
    for (int c = 0; c < 256; c++) {
        int want = -1;
        if (c >= '0' && c <= '9')
            want = c - '0';
        else if (c >= 'a' && c <= 'f')
            want = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F')
            want = c - 'A' + 10;
        assert_int_equal(tv__hex_digit((char)c), want);
    }
}

static void test_hex_decode(void **state)
{
    (void)state;
    uint8_t out[4], all[256];
    char text[2 * sizeof all + 1];
    assert_int_equal(tv__hex_decode("0aFf7E10", 8, out, 4), 0);
    assert_int_equal(out[0], 0x0a);
    assert_int_equal(out[1], 0xff);
    assert_int_equal(out[2], 0x7e);
    assert_int_equal(out[3], 0x10);
    assert_int_equal(tv__hex_decode("", 0, out, 0), 0);

    /* Exact: wrong lengths, bad digits, NULL; out untouched on failure. */
    memset(out, 0x55, sizeof out);
    assert_int_equal(tv__hex_decode("0aff7e1", 7, out, 4), -EINVAL);
    assert_int_equal(tv__hex_decode("0aff7e1000", 10, out, 4), -EINVAL);
    assert_int_equal(tv__hex_decode("0aff7e1g", 8, out, 4), -EINVAL);
    assert_int_equal(tv__hex_decode("0a-f7e10", 8, out, 4), -EINVAL);
    assert_int_equal(tv__hex_decode(" aff7e10", 8, out, 4), -EINVAL);
    assert_int_equal(tv__hex_decode("0aff7e1\0", 8, out, 4), -EINVAL);
    assert_int_equal(tv__hex_decode(NULL, 8, out, 4), -EINVAL);
    assert_int_equal(tv__hex_decode("00", 2, out, SIZE_MAX), -EINVAL);
    for (size_t i = 0; i < sizeof out; i++)
        assert_int_equal(out[i], 0x55);

    /* Round trip of every byte value, both cases. */
    for (size_t i = 0; i < sizeof all; i++)
        all[i] = (uint8_t)i;
    for (int upper = 0; upper < 2; upper++) {
        uint8_t back[sizeof all];
        tv__hex_encode(all, sizeof all, upper, text);
        assert_int_equal(tv__hex_decode(text, 2 * sizeof all, back, sizeof back), 0);
        assert_memory_equal(back, all, sizeof all);
    }
}

static void test_uuid_text(void **state)
{
    (void)state;
    uint8_t u[16], back[16];
    char text[37];
    for (int i = 0; i < 16; i++)
        u[i] = (uint8_t)(0x10 * i + 0x0f - i);
    tv__uuid_format(u, text);
    assert_string_equal(text, "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0");
    assert_int_equal(tv__uuid_parse(text, back), 0);
    assert_memory_equal(back, u, 16);
    assert_int_equal(tv__uuid_parse("0F1E2D3C-4B5A-6978-8796-A5B4C3D2E1F0", back), 0);
    assert_memory_equal(back, u, 16);

    memset(back, 0x55, sizeof back);
    static const char *const bad[] = {
        "",
        "0f1e2d3c4b5a69788796a5b4c3d2e1f0",      /* no dashes */
        "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f",   /* short */
        "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f00", /* long */
        "0f1e2d3-c4b5a-6978-8796-a5b4c3d2e1f0",  /* dash misplaced */
        "0f1e2d3c-4b5a-6978-8796_a5b4c3d2e1f0",
        "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1fg",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(tv__uuid_parse(bad[i], back), -EINVAL);
    assert_int_equal(tv__uuid_parse(NULL, back), -EINVAL);
    for (size_t i = 0; i < sizeof back; i++)
        assert_int_equal(back[i], 0x55);
}

/* ---- endian ----------------------------------------------------------------- */

static void test_endian(void **state)
{
    (void)state;
    uint8_t buf[9 + 8];
    /* Every alignment: the helpers work on bytes. */
    for (size_t a = 0; a < 8; a++) {
        uint8_t *p = buf + a;
        memset(buf, 0xee, sizeof buf);
        tv__le16_put(p, 0xa1b2);
        assert_int_equal(p[0], 0xb2);
        assert_int_equal(p[1], 0xa1);
        assert_int_equal(p[2], 0xee);
        assert_int_equal(tv__le16_get(p), 0xa1b2);

        memset(buf, 0xee, sizeof buf);
        tv__le32_put(p, 0x01020304u);
        static const uint8_t w32[] = {4, 3, 2, 1, 0xee};
        assert_memory_equal(p, w32, sizeof w32);
        assert_int_equal(tv__le32_get(p), 0x01020304u);

        memset(buf, 0xee, sizeof buf);
        tv__le64_put(p, 0x8877665544332211ull);
        static const uint8_t w64[] = {0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0xee};
        assert_memory_equal(p, w64, sizeof w64);
        assert_true(tv__le64_get(p) == 0x8877665544332211ull);
    }
    /* High bits survive (no sign extension through int promotion). */
    static const uint8_t ff[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    assert_int_equal(tv__le16_get(ff), 0xffff);
    assert_int_equal(tv__le32_get(ff), 0xffffffffu);
    assert_true(tv__le64_get(ff) == UINT64_MAX);
    static const uint8_t top[8] = {0, 0, 0, 0x80, 0, 0, 0, 0x80};
    assert_int_equal(tv__le32_get(top), 0x80000000u);
    assert_true(tv__le64_get(top) == 0x8000000080000000ull);
}

/* ---- hash ------------------------------------------------------------------- */

static void test_hash(void **state)
{
    (void)state;
    /* Part of the snapshot format: these values never change. */
    assert_true(tv__hash_bytes("", 0, 0) == 0xb40f98f1779bc757ull);
    assert_true(tv__hash_bytes(NULL, 0, 0) == 0xb40f98f1779bc757ull);
    /* Seed-, length- and content-sensitive, across the 8- and 16-byte
     * paths. */
    char s[40];
    memset(s, 'x', sizeof s);
    for (size_t n = 0; n < 33; n++) {
        uint64_t h = tv__hash_bytes(s, n, 1);
        assert_true(h != tv__hash_bytes(s, n, 2));
        assert_true(h != tv__hash_bytes(s, n + 1, 1));
        if (n) {
            s[n - 1] = 'y';
            assert_true(h != tv__hash_bytes(s, n, 1));
            s[n - 1] = 'x';
        }
        assert_true(h == tv__hash_bytes(s, n, 1));
    }
}

static void test_parse_pos_i64(void **state)
{
    (void)state;
    int64_t v = 7;
    assert_true(tv__parse_pos_i64("1", &v) && v == 1);
    assert_true(tv__parse_pos_i64("9223372036854775807", &v) && v == INT64_MAX);
    v = 7;
    const char *bad[] = {"",
                         "0",
                         "01",
                         "+1",
                         "-1",
                         " 1",
                         "1 ",
                         "1a",
                         "0x1",
                         "9223372036854775808",
                         "18446744073709551616",
                         "99999999999999999999",
                         NULL};
    for (size_t i = 0; bad[i]; i++) {
        if (tv__parse_pos_i64(bad[i], &v))
            fail_msg("'%s' accepted", bad[i]);
        assert_int_equal(v, 7); /* untouched */
    }
    assert_false(tv__parse_pos_i64(NULL, &v));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hex_encode),    cmocka_unit_test(test_hex_digit),
        cmocka_unit_test(test_parse_pos_i64), cmocka_unit_test(test_hex_decode),
        cmocka_unit_test(test_uuid_text),     cmocka_unit_test(test_endian),
        cmocka_unit_test(test_hash),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
