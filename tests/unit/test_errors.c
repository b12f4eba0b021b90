/* Unit tests of the error helpers (core/src/util/errors.c): tv__seterr and
 * tv__seterr_wrap never garble a message built from err->msg itself,
 * truncate safely and accept NULL; tv_strerror / tv_err_name name every
 * entry of TV_ERROR_TABLE, 0, negative errno values and unknown codes. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tensorvault/errors.h"
#include "util/internal.h"

static void test_seterr_from_own_buffer(void **state)
{
    (void)state;
    tv_error e = {0};
    assert_int_equal(tv__seterr(&e, TV_E_INTERNAL, "inner %d", 7), TV_E_INTERNAL);
    assert_string_equal(e.msg, "inner 7");
    /* The bug class: formatting err->msg into itself. */
    assert_int_equal(tv__seterr(&e, TV_E_DEVICE_MISMATCH, "device %s: %s", "/dev/x", e.msg),
                     TV_E_DEVICE_MISMATCH);
    assert_string_equal(e.msg, "device /dev/x: inner 7");
    assert_int_equal(e.code, TV_E_DEVICE_MISMATCH);
    assert_int_equal(tv__seterr(&e, -EIO, "%s (again)", e.msg), -EIO);
    assert_string_equal(e.msg, "device /dev/x: inner 7 (again)");
    assert_int_equal(tv__seterr(NULL, -EIO, "x %s", "y"), -EIO);
}

static void test_wrap(void **state)
{
    (void)state;
    tv_error e = {0};
    tv__seterr(&e, -EIO, "label read /dev/x: %s", "Input/output error");
    assert_int_equal(
        tv__seterr_wrap(&e, TV_E_DEVICE_MISMATCH, "device %d (%s): label unreadable", 3, "/dev/x"),
        TV_E_DEVICE_MISMATCH);
    assert_int_equal(e.code, TV_E_DEVICE_MISMATCH);
    assert_string_equal(
        e.msg, "device 3 (/dev/x): label unreadable: label read /dev/x: Input/output error");
    /* No previous message: the prefix alone. */
    tv_error f = {0};
    assert_int_equal(tv__seterr_wrap(&f, -ENOENT, "open %s", "p"), -ENOENT);
    assert_string_equal(f.msg, "open p");
    /* The prefix may itself name err->msg. */
    tv__seterr(&f, -EIO, "abc");
    tv__seterr_wrap(&f, -EIO, "[%s]", f.msg);
    assert_string_equal(f.msg, "[abc]: abc");
    assert_int_equal(tv__seterr_wrap(NULL, -EIO, "x"), -EIO);
}

static void test_wrap_truncates(void **state)
{
    (void)state;
    tv_error e = {0};
    char big[2 * sizeof(e.msg)];
    memset(big, 'a', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    /* A full old message: the result is cut at the buffer, NUL-terminated. */
    tv__seterr(&e, -EIO, "%s", big);
    assert_int_equal(strlen(e.msg), sizeof(e.msg) - 1);
    tv__seterr_wrap(&e, -EIO, "prefix");
    assert_int_equal(strlen(e.msg), sizeof(e.msg) - 1);
    assert_memory_equal(e.msg, "prefix: aaa", 11);
    /* A full prefix: the old message does not fit at all. */
    tv__seterr(&e, -EIO, "old");
    tv__seterr_wrap(&e, -EIO, "%s", big);
    assert_int_equal(strlen(e.msg), sizeof(e.msg) - 1);
    assert_null(strstr(e.msg, "old"));
    /* A prefix that leaves exactly room for ": " but nothing after. */
    char p[sizeof(e.msg)];
    memset(p, 'p', sizeof(p) - 3);
    p[sizeof(p) - 3] = '\0';
    tv__seterr(&e, -EIO, "old");
    tv__seterr_wrap(&e, -EIO, "%s", p);
    assert_int_equal(strlen(e.msg), sizeof(e.msg) - 1);
    assert_string_equal(e.msg + sizeof(p) - 3, ": ");
}

static void test_every_table_entry(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        int value;
        const char *desc;
    } table[] = {
#define ROW(n, v, d) {#n, v, d},
        TV_ERROR_TABLE(ROW)
#undef ROW
    };
    for (size_t i = 0; i < TV_ARRAY_LEN(table); i++) {
        assert_true(table[i].value <= -1000 && table[i].value >= -1999);
        assert_string_equal(tv_err_name(table[i].value), table[i].name);
        assert_string_equal(tv_strerror(table[i].value), table[i].desc);
        assert_true(strlen(table[i].desc) > 0);
        /* Names and values are unique (append-only, never reused). */
        for (size_t j = 0; j < i; j++) {
            assert_int_not_equal(table[i].value, table[j].value);
            assert_string_not_equal(table[i].name, table[j].name);
        }
    }
}

/* The fast-path codes: fixed values (the wire carries them),
 * their names and texts. */
static void test_fastpath_codes(void **state)
{
    (void)state;
    static const struct {
        int value, want;
        const char *name, *text;
    } codes[] = {
        {TV_E_PROTOCOL, -1300, "TV_E_PROTOCOL",
         "fast-path message malformed, oversized or out of order"},
        {TV_E_VERSION, -1301, "TV_E_VERSION",
         "no fast-path protocol version in common with the peer"},
        {TV_E_PEER_DENIED, -1302, "TV_E_PEER_DENIED",
         "the peer's uid and groups are not allowed this model"},
        {TV_E_CANCELLED, -1303, "TV_E_CANCELLED",
         "request cancelled: its handle or session was closed"},
        {TV_E_DISCONNECTED, -1304, "TV_E_DISCONNECTED",
         "the fast-path connection to tensorvaultd closed"},
    };
    for (size_t i = 0; i < TV_ARRAY_LEN(codes); i++) {
        assert_int_equal(codes[i].value, codes[i].want);
        assert_string_equal(tv_err_name(codes[i].value), codes[i].name);
        assert_string_equal(tv_strerror(codes[i].value), codes[i].text);
    }
    /* The neighbours are not assigned. */
    assert_string_equal(tv_err_name(-1299), "UNKNOWN");
    assert_string_equal(tv_err_name(-1305), "UNKNOWN");
}

static void test_zero_errno_and_unknown(void **state)
{
    (void)state;
    assert_string_equal(tv_err_name(0), "OK");
    assert_string_equal(tv_strerror(0), "success");
    assert_string_equal(tv_err_name(-EIO), "EIO");
    assert_string_equal(tv_strerror(-EIO), strerror(EIO));
    assert_string_equal(tv_err_name(-ENOENT), "ENOENT");
    assert_string_equal(tv_err_name(-ENOSPC), "ENOSPC");
    assert_string_equal(tv_strerror(-ENOMEM), strerror(ENOMEM));
    /* Unknown: positive, an unassigned library code, out of range. */
    static const int unknown[] = {1, 42, -999999, INT32_MIN, -1999, -1005, -4096};
    for (size_t i = 0; i < TV_ARRAY_LEN(unknown); i++) {
        assert_non_null(tv_err_name(unknown[i]));
        assert_non_null(tv_strerror(unknown[i]));
        if (unknown[i] <= -1000 || unknown[i] > 0) {
            assert_string_equal(tv_err_name(unknown[i]), "UNKNOWN");
            assert_string_equal(tv_strerror(unknown[i]), "unknown error");
        }
    }
    /* An errno value without a name still gets a non-NULL string. */
    assert_non_null(tv_err_name(-4000));
    assert_non_null(tv_strerror(-4000));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_seterr_from_own_buffer), cmocka_unit_test(test_wrap),
        cmocka_unit_test(test_wrap_truncates),         cmocka_unit_test(test_every_table_entry),
        cmocka_unit_test(test_zero_errno_and_unknown), cmocka_unit_test(test_fastpath_codes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
