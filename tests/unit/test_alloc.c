/* Unit tests of the extent allocator (server/import/alloc.c): first fit,
 * alignment, exact fits, out of space, overflow near UINT64_MAX, input
 * validation, and a randomized alloc/free sequence checked against a
 * brute-force bitmap. No SQLite: the pure functions only. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "import/alloc.h"

#define KiB 1024ull
#define A   (64 * KiB) /* object_align in most tests */

static int fit(const tv__alloc_region *r, const tv__extent *used, size_t n, uint64_t len,
               tv__extent *out, tv_error *err)
{
    memset(out, 0xa5, sizeof *out);
    return tv__alloc_first_fit(r, used, n, len, out, err);
}

static void test_empty_region_first_object_at_data_off(void **state)
{
    (void)state;
    tv__alloc_region r = {.data_off = A, .end_off = 16 * A, .object_align = A};
    tv__extent got;
    assert_int_equal(fit(&r, NULL, 0, 1, &got, NULL), 0);
    assert_int_equal(got.off, A);
    assert_int_equal(got.len, A);
    assert_int_equal(fit(&r, NULL, 0, A + 1, &got, NULL), 0);
    assert_int_equal(got.off, A);
    assert_int_equal(got.len, 2 * A);
}

static void test_first_fit_picks_lowest_gap(void **state)
{
    (void)state;
    tv__alloc_region r = {.data_off = A, .end_off = 64 * A, .object_align = A};
    /* gaps: [2A,3A) 1 unit, [5A,8A) 3 units, [9A,64A) 55 units */
    tv__extent used[] = {{A, A}, {3 * A, 2 * A}, {8 * A, A}};
    tv__extent got;
    assert_int_equal(fit(&r, used, 3, 100, &got, NULL), 0);
    assert_int_equal(got.off, 2 * A);
    assert_int_equal(fit(&r, used, 3, A + 1, &got, NULL), 0); /* 2 units: skips the 1-unit gap */
    assert_int_equal(got.off, 5 * A);
    assert_int_equal(got.len, 2 * A);
    assert_int_equal(fit(&r, used, 3, 3 * A, &got, NULL), 0); /* exactly the 3-unit gap */
    assert_int_equal(got.off, 5 * A);
    assert_int_equal(fit(&r, used, 3, 3 * A + 1, &got, NULL), 0); /* 4 units: the tail */
    assert_int_equal(got.off, 9 * A);
}

static void test_alignment_of_unaligned_bounds(void **state)
{
    (void)state;
    /* data_off and an extent end that are not aligned: the next object
     * starts on the next boundary. */
    tv__alloc_region r = {.data_off = A + 100, .end_off = 10 * A, .object_align = A};
    tv__extent got;
    assert_int_equal(fit(&r, NULL, 0, 1, &got, NULL), 0);
    assert_int_equal(got.off, 2 * A);
    tv__extent used[] = {{2 * A, A + 1}};
    assert_int_equal(fit(&r, used, 1, 1, &got, NULL), 0);
    assert_int_equal(got.off, 4 * A);
    assert_int_equal(got.off % A, 0);

    /* A non-power-of-two alignment (lcm of odd geometries) works too. */
    const uint64_t a3 = 3 * A;
    tv__alloc_region r3 = {.data_off = 1, .end_off = 100 * A, .object_align = a3};
    assert_int_equal(fit(&r3, NULL, 0, a3 + 1, &got, NULL), 0);
    assert_int_equal(got.off, a3);
    assert_int_equal(got.len, 2 * a3);

    /* An unaligned region end: the last partial unit is never used. */
    tv__alloc_region rt = {.data_off = A, .end_off = 3 * A - 1, .object_align = A};
    assert_int_equal(fit(&rt, NULL, 0, A, &got, NULL), 0);
    assert_int_equal(got.off, A);
    assert_int_equal(fit(&rt, NULL, 0, 2 * A, &got, NULL), TV_E_NO_SPACE);
}

static void test_exact_fit(void **state)
{
    (void)state;
    tv__alloc_region r = {.data_off = A, .end_off = 5 * A, .object_align = A};
    tv__extent got, used[] = {{A, A}, {3 * A, A}};
    /* the hole [2A, 3A) is exactly one unit */
    assert_int_equal(fit(&r, used, 2, A, &got, NULL), 0);
    assert_int_equal(got.off, 2 * A);
    /* the tail [4A, 5A) is exactly one unit: a full region end fits */
    tv__extent used2[] = {{A, 3 * A}};
    assert_int_equal(fit(&r, used2, 1, A, &got, NULL), 0);
    assert_int_equal(got.off, 4 * A);
    assert_int_equal(got.off + got.len, r.end_off);
    /* the whole region */
    assert_int_equal(fit(&r, NULL, 0, 4 * A, &got, NULL), 0);
    assert_int_equal(got.off, A);
    assert_int_equal(got.len, 4 * A);
}

static void test_out_of_space(void **state)
{
    (void)state;
    tv__alloc_region r = {.data_off = A, .end_off = 8 * A, .object_align = A};
    tv__extent used[] = {{A, A}, {4 * A, A}}; /* free: [2A,4A) 2 units, [5A,8A) 3 units */
    tv__extent got;
    tv_error err = {0};
    assert_int_equal(fit(&r, used, 2, 3 * A + 1, &got, &err), TV_E_NO_SPACE);
    assert_int_equal(err.code, TV_E_NO_SPACE);
    char want[64];
    snprintf(want, sizeof want, "%llu bytes", (unsigned long long)(3 * A + 1));
    assert_non_null(strstr(err.msg, want)); /* requested */
    snprintf(want, sizeof want, "largest free extent is %llu bytes", (unsigned long long)(3 * A));
    assert_non_null(strstr(err.msg, want));

    /* a full region */
    tv__extent full[] = {{A, 7 * A}};
    assert_int_equal(fit(&r, full, 1, 1, &got, &err), TV_E_NO_SPACE);
    assert_non_null(strstr(err.msg, "largest free extent is 0 bytes"));
    /* an empty region (data_off == end) */
    tv__alloc_region e = {.data_off = A, .end_off = A, .object_align = A};
    assert_int_equal(fit(&e, NULL, 0, 1, &got, NULL), TV_E_NO_SPACE);
}

static void test_overflow_near_uint64_max(void **state)
{
    (void)state;
    tv__extent got;
    tv_error err = {0};
    tv__alloc_region r = {.data_off = A, .end_off = 8 * A, .object_align = A};
    /* align_up(len) overflows */
    assert_int_equal(fit(&r, NULL, 0, UINT64_MAX, &got, &err), TV_E_OVERFLOW);
    assert_int_equal(fit(&r, NULL, 0, UINT64_MAX - A + 2, &got, NULL), TV_E_OVERFLOW);
    /* the largest len that still aligns is merely too big */
    assert_int_equal(fit(&r, NULL, 0, UINT64_MAX - A + 1, &got, NULL), TV_E_NO_SPACE);

    /* A region at the top of the address space: aligned starts beyond the
     * last extent would wrap; they must saturate instead. */
    const uint64_t top = UINT64_MAX - UINT64_MAX % A; /* last aligned offset */
    tv__alloc_region hi = {.data_off = top - 4 * A, .end_off = UINT64_MAX, .object_align = A};
    assert_int_equal(fit(&hi, NULL, 0, 4 * A, &got, NULL), 0);
    assert_int_equal(got.off, top - 4 * A);
    assert_int_equal(fit(&hi, NULL, 0, 5 * A, &got, NULL), TV_E_NO_SPACE);
    tv__extent used[] = {{top - 4 * A, 4 * A + 10}}; /* ends past the last boundary */
    assert_int_equal(fit(&hi, used, 1, 1, &got, &err), TV_E_NO_SPACE);
    /* data_off whose alignment overflows: no room at all */
    tv__alloc_region none = {.data_off = top + 1, .end_off = UINT64_MAX, .object_align = A};
    assert_int_equal(fit(&none, NULL, 0, 1, &got, NULL), TV_E_NO_SPACE);
    /* an extent whose end overflows */
    tv__extent wrap[] = {{top - A, 2 * A + UINT64_MAX % A}};
    assert_int_equal(fit(&hi, wrap, 1, 1, &got, &err), TV_E_OVERFLOW);

    /* region_off + region_len from a device row */
    tv__reg_device d = {
        .object_align = A, .data_off = A, .region_off = UINT64_MAX - 10, .region_len = 11};
    assert_int_equal(tv__alloc_region_of(&d, &r, NULL), TV_E_OVERFLOW);
    d.region_len = 10;
    assert_int_equal(tv__alloc_region_of(&d, &r, NULL), 0);
    assert_int_equal(r.end_off, UINT64_MAX);
}

static void test_invalid_inputs(void **state)
{
    (void)state;
    tv__extent got;
    tv__alloc_region r = {.data_off = A, .end_off = 8 * A, .object_align = A};
    assert_int_equal(fit(&r, NULL, 0, 0, &got, NULL), TV_E_INVALID_ARG);
    tv__alloc_region z = {.data_off = A, .end_off = 8 * A, .object_align = 0};
    assert_int_equal(fit(&z, NULL, 0, 1, &got, NULL), TV_E_INVALID_ARG);
    tv__alloc_region back = {.data_off = 8 * A, .end_off = A, .object_align = A};
    assert_int_equal(fit(&back, NULL, 0, 1, &got, NULL), TV_E_INVALID_ARG);
    tv__extent unsorted[] = {{4 * A, A}, {2 * A, A}};
    assert_int_equal(fit(&r, unsorted, 2, 1, &got, NULL), TV_E_INVALID_ARG);
    tv__extent overlap[] = {{2 * A, 2 * A}, {3 * A, A}};
    assert_int_equal(fit(&r, overlap, 2, 1, &got, NULL), TV_E_INVALID_ARG);
    tv__extent empty[] = {{2 * A, 0}};
    assert_int_equal(fit(&r, empty, 1, 1, &got, NULL), TV_E_INVALID_ARG);
    tv__extent before[] = {{0, A}};
    assert_int_equal(fit(&r, before, 1, 1, &got, NULL), TV_E_INVALID_ARG);
    tv__extent past[] = {{7 * A, 2 * A}};
    assert_int_equal(fit(&r, past, 1, 1, &got, NULL), TV_E_INVALID_ARG);
    assert_int_equal(tv__alloc_first_fit(NULL, NULL, 0, 1, &got, NULL), TV_E_INVALID_ARG);
    assert_int_equal(tv__alloc_first_fit(&r, NULL, 0, 1, NULL, NULL), TV_E_INVALID_ARG);
    assert_int_equal(tv__alloc_first_fit(&r, NULL, 2, 1, &got, NULL), TV_E_INVALID_ARG);
}

static void test_space_accounting(void **state)
{
    (void)state;
    tv__alloc_region r = {.data_off = A, .end_off = 10 * A + 5, .object_align = A};
    tv__extent used[] = {{A, A}, {4 * A, 2 * A}}; /* free: [2A,4A), [6A,10A) */
    tv__alloc_space s;
    assert_int_equal(tv__alloc_space_of(&r, used, 2, &s, NULL), 0);
    assert_int_equal(s.total_len, 9 * A);
    assert_int_equal(s.used_len, 3 * A);
    assert_int_equal(s.free_len, 6 * A);
    assert_int_equal(s.largest_free_len, 4 * A);
    assert_int_equal(s.n_used, 2);
    assert_int_equal(s.n_free, 2);
    assert_int_equal(tv__alloc_space_of(&r, NULL, 0, &s, NULL), 0);
    assert_int_equal(s.free_len, 9 * A);
    assert_int_equal(s.largest_free_len, 9 * A);
    assert_int_equal(s.n_free, 1);
}

/* ---- randomized sequence against a brute-force bitmap ------------------- */

#define UNITS 160

static uint64_t rng_next(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

typedef struct live {
    tv__extent e[UNITS];
    size_t n;
} live;

static void live_insert(live *l, tv__extent e)
{
    size_t i = l->n;
    while (i > 0 && l->e[i - 1].off > e.off) {
        l->e[i] = l->e[i - 1];
        i--;
    }
    l->e[i] = e;
    l->n++;
}

static void live_remove(live *l, size_t i)
{
    memmove(&l->e[i], &l->e[i + 1], (l->n - i - 1) * sizeof l->e[0]);
    l->n--;
}

/* Lowest unit index of a free run of k units in the bitmap, or -1. */
static long brute_first_fit(const unsigned char *bm, size_t k)
{
    for (size_t i = 0; i + k <= UNITS; i++) {
        size_t j = 0;
        while (j < k && !bm[i + j])
            j++;
        if (j == k)
            return (long)i;
    }
    return -1;
}

static void brute_space(const unsigned char *bm, size_t *n_free, size_t *largest, size_t *free_u)
{
    *n_free = *largest = *free_u = 0;
    size_t run = 0;
    for (size_t i = 0; i <= UNITS; i++) {
        if (i < UNITS && !bm[i]) {
            run++;
            continue;
        }
        if (run) {
            (*n_free)++;
            *free_u += run;
            if (run > *largest)
                *largest = run;
        }
        run = 0;
    }
}

static void run_random(uint64_t seed, uint64_t align)
{
    /* data_off and the end are deliberately unaligned */
    const uint64_t base = 3 * align; /* first aligned offset */
    tv__alloc_region r = {
        .data_off = 2 * align + 123, .end_off = base + UNITS * align + 77, .object_align = align};
    unsigned char bm[UNITS] = {0};
    live l = {.n = 0};
    uint64_t s = seed;
    for (int step = 0; step < 4000; step++) {
        bool do_free = l.n && (rng_next(&s) % 100 < 40);
        if (do_free) {
            size_t i = (size_t)(rng_next(&s) % l.n);
            uint64_t u0 = (l.e[i].off - base) / align, u1 = u0 + l.e[i].len / align;
            for (uint64_t u = u0; u < u1; u++) {
                assert_true(bm[u]);
                bm[u] = 0;
            }
            live_remove(&l, i);
        } else {
            uint64_t units = 1 + rng_next(&s) % 12;
            uint64_t len = units * align - rng_next(&s) % align; /* 1 .. units*align bytes */
            tv__extent got;
            tv_error err = {0};
            int rc = tv__alloc_first_fit(&r, l.e, l.n, len, &got, &err);
            long want = brute_first_fit(bm, (size_t)units);
            if (want < 0) {
                assert_int_equal(rc, TV_E_NO_SPACE);
            } else {
                assert_int_equal(rc, 0);
                assert_int_equal(got.off, base + (uint64_t)want * align);
                assert_int_equal(got.len, units * align);
                assert_int_equal(got.off % align, 0);
                assert_true(got.off >= r.data_off);
                assert_true(got.off + got.len <= r.end_off);
                for (uint64_t u = (uint64_t)want; u < (uint64_t)want + units; u++) {
                    assert_false(bm[u]); /* no overlap */
                    bm[u] = 1;
                }
                live_insert(&l, got);
            }
        }
        tv__alloc_space sp;
        assert_int_equal(tv__alloc_space_of(&r, l.e, l.n, &sp, NULL), 0);
        size_t n_free, largest, free_u;
        brute_space(bm, &n_free, &largest, &free_u);
        assert_int_equal(sp.total_len, UNITS * align);
        assert_int_equal(sp.free_len, free_u * align);
        assert_int_equal(sp.largest_free_len, largest * align);
        assert_int_equal(sp.n_free, n_free);
        assert_int_equal(sp.used_len + sp.free_len, sp.total_len);
    }
}

static void test_randomized_against_bitmap(void **state)
{
    (void)state;
    static const uint64_t seeds[] = {1, 0x9e3779b97f4a7c15ull, 42, 0xdeadbeefull};
    for (size_t i = 0; i < sizeof seeds / sizeof seeds[0]; i++) {
        run_random(seeds[i], A);
        run_random(seeds[i], 3 * A); /* non-power-of-two alignment */
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_empty_region_first_object_at_data_off),
        cmocka_unit_test(test_first_fit_picks_lowest_gap),
        cmocka_unit_test(test_alignment_of_unaligned_bounds),
        cmocka_unit_test(test_exact_fit),
        cmocka_unit_test(test_out_of_space),
        cmocka_unit_test(test_overflow_near_uint64_max),
        cmocka_unit_test(test_invalid_inputs),
        cmocka_unit_test(test_space_accounting),
        cmocka_unit_test(test_randomized_against_bitmap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
