/* Unit tests for util/sha256.c: the NIST FIPS 180-2 example vectors one-shot
 * and fed in pieces that cross the 64-byte block boundary at every offset,
 * and the context's lifetime rules (free NULL-safe and twice, reusable only
 * through init). */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "util/hex.h"
#include "util/sha256.h"

static const struct {
    const char *msg;
    const char *digest;
} VECTORS[] = {
    {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
    {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
    /* 448 bits: the padding no longer fits the first block */
    {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
     "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
    /* 896 bits */
    {"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu",
     "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"},
};

static void digest_hex(const void *p, size_t len, char out[65])
{
    tv__sha256 h;
    uint8_t d[32];
    assert_int_equal(tv__sha256_init(&h), 0);
    tv__sha256_update(&h, p, len);
    tv__sha256_final(&h, d);
    tv__hex_encode(d, sizeof d, false, out);
}

static void test_nist_vectors(void **state)
{
    (void)state;
    char hex[65];
    for (size_t i = 0; i < sizeof VECTORS / sizeof VECTORS[0]; i++) {
        digest_hex(VECTORS[i].msg, strlen(VECTORS[i].msg), hex);
        assert_string_equal(hex, VECTORS[i].digest);
    }
}

/* One million 'a': given as 1000 updates of 1000 bytes (crossing block
 * boundaries at varying offsets), and one-shot. */
static void test_million_a(void **state)
{
    (void)state;
    static const char want[] = "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0";
    char chunk[1000], hex[65];
    uint8_t d[32];
    memset(chunk, 'a', sizeof chunk);
    tv__sha256 h;
    assert_int_equal(tv__sha256_init(&h), 0);
    for (int i = 0; i < 1000; i++)
        tv__sha256_update(&h, chunk, sizeof chunk);
    tv__sha256_final(&h, d);
    tv__hex_encode(d, sizeof d, false, hex);
    assert_string_equal(hex, want);

    char *all = malloc(1000000);
    assert_non_null(all);
    memset(all, 'a', 1000000);
    digest_hex(all, 1000000, hex);
    assert_string_equal(hex, want);
    free(all);
}

/* Incremental updates agree with one-shot for every split point of a
 * 300-byte message (more than four blocks), and for a split into three
 * pieces around each block boundary, with empty updates between them. */
static void test_incremental_matches_oneshot(void **state)
{
    (void)state;
    uint8_t msg[300], want[32], got[32];
    for (size_t i = 0; i < sizeof msg; i++)
        msg[i] = (uint8_t)(i * 131 + 7);
    tv__sha256 h;
    assert_int_equal(tv__sha256_init(&h), 0);
    tv__sha256_update(&h, msg, sizeof msg);
    tv__sha256_final(&h, want);

    for (size_t cut = 0; cut <= sizeof msg; cut++) {
        assert_int_equal(tv__sha256_init(&h), 0);
        tv__sha256_update(&h, msg, cut);
        tv__sha256_update(&h, msg + cut, 0);
        tv__sha256_update(&h, msg + cut, sizeof msg - cut);
        tv__sha256_final(&h, got);
        assert_memory_equal(got, want, 32);
    }
    for (size_t b = 64; b < sizeof msg; b += 64) {
        for (size_t a = b - 3; a <= b + 3; a++) {
            assert_int_equal(tv__sha256_init(&h), 0);
            tv__sha256_update(&h, msg, a - 1);
            tv__sha256_update(&h, msg + a - 1, 1);
            tv__sha256_update(&h, NULL, 0);
            tv__sha256_update(&h, msg + a, sizeof msg - a);
            tv__sha256_final(&h, got);
            assert_memory_equal(got, want, 32);
        }
    }
}

/* final frees the context; free is NULL-safe and safe twice; a freed
 * context takes updates without effect and init makes it usable again. */
static void test_hex_of_a_buffer(void **state)
{
    (void)state;
    char hex[65];
    assert_int_equal(tv__sha256_hex("abc", 3, hex), 0);
    assert_string_equal(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    assert_int_equal(tv__sha256_hex(NULL, 0, hex), 0);
    assert_string_equal(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

static void test_lifetime(void **state)
{
    (void)state;
    tv__sha256 h;
    uint8_t d[32];
    char hex[65];
    tv__sha256_free(NULL);
    assert_int_equal(tv__sha256_init(&h), 0);
    tv__sha256_update(&h, "abc", 3);
    tv__sha256_free(&h);
    assert_null(h.md);
    tv__sha256_free(&h);
    tv__sha256_update(&h, "ignored", 7);

    assert_int_equal(tv__sha256_init(&h), 0);
    tv__sha256_update(&h, "abc", 3);
    tv__sha256_final(&h, d);
    assert_null(h.md);
    tv__sha256_free(&h);
    tv__hex_encode(d, sizeof d, false, hex);
    assert_string_equal(hex, VECTORS[1].digest);

    /* Reused after final, through init: a fresh digest, not a continuation. */
    assert_int_equal(tv__sha256_init(&h), 0);
    tv__sha256_final(&h, d);
    tv__hex_encode(d, sizeof d, false, hex);
    assert_string_equal(hex, VECTORS[0].digest);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nist_vectors),
        cmocka_unit_test(test_million_a),
        cmocka_unit_test(test_incremental_matches_oneshot),
        cmocka_unit_test(test_lifetime),
        cmocka_unit_test(test_hex_of_a_buffer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
