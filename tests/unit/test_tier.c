/* Unit tests of the memory tier's bookkeeping (server/fastpath/tier.c):
 * which idle chunk makes room. Another generation's least recently used
 * chunk goes first; a generation read in one pass larger than the budget
 * gives up its own most recently used chunk, so it keeps its first chunks
 * and the next pass reads them from memory (least recently used first
 * would have evicted each of them before that pass came back). Chunks kept
 * keep their bytes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "fastpath/tier.h"
#include "tv_test.h"

#define CHUNK (4u * 4096u)

static tv__tier_gen *new_gen(tv__tier *t, const char *name, uint32_t n_chunks)
{
    uint8_t key[32] = {0};
    tv__tier_gen *g = NULL;
    tv_error err = {0};
    memcpy(key, name, strlen(name) < sizeof key ? strlen(name) : sizeof key);
    assert_int_equal(tv__tier_gen_new(t, name, 1, key, n_chunks, CHUNK, 4096, &g, &err), 0);
    tv__tier_gen_open(g, CHUNK); /* a floor of one chunk */
    return g;
}

/* A device read of chunk i (its bytes: i + 1), then a copy taken and
 * released: the chunk is idle and resident. Returns whether it was a hit
 * (resident already; its bytes are checked). */
static bool load(tv__tier_gen *g, uint32_t i)
{
    bool hit = g->c[i].state == TV__TIER_RESIDENT;
    uint8_t *p = g->base + (size_t)i * CHUNK;
    if (hit) {
        for (size_t k = 0; k < CHUNK; k += 511)
            assert_int_equal(p[k], (uint8_t)(i + 1));
    } else {
        assert_int_equal(tv__tier_reserve(g, i, 0, CHUNK), 0);
        memset(p, (int)(i + 1), CHUNK);
        tv__tier_landed(g, i, true);
    }
    tv__tier_ref(g, i);
    tv__tier_unref(g, i, 1);
    return hit;
}

static tv__tier *small_tier(uint32_t budget_chunks)
{
    tv__tier *t = NULL;
    tv_error err = {0};
    assert_int_equal(tv__tier_create((uint64_t)budget_chunks * CHUNK, &t, &err), 0);
    tv__tier_use_small_pages(t);
    return t;
}

static void test_a_pass_larger_than_the_budget_keeps_its_head(void **state)
{
    (void)state;
    tv__tier *t = small_tier(4); /* bound: 4 + the floor's 1 = 5 chunks */
    tv__tier_gen *g = new_gen(t, "big", 10);
    for (uint32_t i = 0; i < 10; i++)
        assert_false(load(g, i));
    tv__tier_stats st;
    tv__tier_get_stats(t, &st);
    assert_int_equal(st.resident_len, 5 * CHUNK);
    for (uint32_t i = 0; i < 4; i++)
        assert_int_equal(g->c[i].state, TV__TIER_RESIDENT);
    unsigned hits2 = 0, hits3 = 0;
    for (uint32_t i = 0; i < 10; i++)
        hits2 += load(g, i);
    for (uint32_t i = 0; i < 10; i++)
        hits3 += load(g, i);
    /* least recently used first: 0 hits in every pass */
    assert_true(hits2 >= 4);
    assert_true(hits3 >= 4);
    tv__tier_get_stats(t, &st);
    assert_true(st.resident_len <= 5 * CHUNK);
    tv__tier_destroy(t);
}

static void test_another_generation_goes_first(void **state)
{
    (void)state;
    tv__tier *t = small_tier(4);
    tv__tier_gen *a = new_gen(t, "a", 4);
    for (uint32_t i = 0; i < 4; i++)
        load(a, i);
    tv__tier_gen_close(a); /* dormant: its floor goes, its chunks stay */
    tv__tier_gen *b = new_gen(t, "b", 4);
    load(b, 0); /* 4 + 1 = the bound: nothing goes */
    for (uint32_t i = 0; i < 4; i++)
        assert_int_equal(a->c[i].state, TV__TIER_RESIDENT);
    load(b, 1); /* a's least recently used chunk goes, not b's */
    assert_int_equal(a->c[0].state, TV__TIER_ABSENT);
    assert_int_equal(a->c[1].state, TV__TIER_RESIDENT);
    assert_int_equal(b->c[0].state, TV__TIER_RESIDENT);
    load(b, 2);
    load(b, 3);
    assert_int_equal(a->c[1].state, TV__TIER_ABSENT);
    assert_int_equal(a->c[2].state, TV__TIER_ABSENT);
    assert_int_equal(a->c[3].state, TV__TIER_RESIDENT);
    for (uint32_t i = 0; i < 4; i++)
        assert_true(load(b, i));
    tv__tier_destroy(t);
}

static void test_a_chunk_in_use_is_never_the_victim(void **state)
{
    (void)state;
    tv__tier *t = small_tier(1); /* bound: 1 + 1 = 2 chunks */
    tv__tier_gen *g = new_gen(t, "g", 4);
    load(g, 0);
    tv__tier_ref(g, 0); /* a copy in progress */
    load(g, 1);
    assert_int_equal(tv__tier_reserve(g, 2, 0, CHUNK), 0); /* 1 goes, not 0 */
    assert_int_equal(g->c[0].state, TV__TIER_RESIDENT);
    assert_int_equal(g->c[1].state, TV__TIER_ABSENT);
    assert_int_equal(tv__tier_reserve(g, 3, 0, CHUNK), TV_E_BUSY); /* 0 in use, 2 reading */
    tv__tier_unref(g, 0, 1);
    assert_int_equal(tv__tier_reserve(g, 3, 0, CHUNK), 0);
    assert_int_equal(g->c[0].state, TV__TIER_ABSENT);
    assert_int_equal(g->c[2].state, TV__TIER_READING);
    tv__tier_landed(g, 3, false);
    assert_int_equal(g->c[3].state, TV__TIER_ABSENT);
    tv__tier_landed(g, 2, true);
    tv__tier_destroy(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_pass_larger_than_the_budget_keeps_its_head),
        cmocka_unit_test(test_another_generation_goes_first),
        cmocka_unit_test(test_a_chunk_in_use_is_never_the_victim),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
