/* Unit tests of the throughput history (server/http/history.c): the ring
 * keeps its newest samples and copies them oldest first (below capacity,
 * full, wrapped many times, a copy shorter than the ring), bad arguments
 * are refused, and the sampler thread pushes the counters /metrics shows
 * (read bytes fed through tv__metrics_read_bytes), one sampler at a time,
 * stops at once and keeps its samples. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <cmocka.h>

#include "http/history.h"
#include "http/metrics.h"
#include "tv_test.h"

static tv__history_sample at(int64_t i)
{
    return (tv__history_sample){
        .time_ms = 1000 * i, .read_bytes = 10 * (uint64_t)i, .import_bytes = 100 * (uint64_t)i};
}

static void test_ring_order_and_wrap(void **state)
{
    (void)state;
    tv__history_sample buf[4], out[8];
    tv__history h;
    assert_int_equal(tv__history_init(&h, buf, 4), 0);
    assert_int_equal(tv__history_copy(&h, out, 8), 0);
    for (int64_t i = 1; i <= 3; i++) {
        tv__history_sample x = at(i);
        tv__history_push(&h, &x);
    }
    assert_int_equal(tv__history_copy(&h, out, 8), 3);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(out[i].time_ms, 1000 * (i + 1));
        assert_int_equal(out[i].read_bytes, 10 * (i + 1));
        assert_int_equal(out[i].import_bytes, 100 * (i + 1));
    }
    /* 1..11 pushed into 4 slots: 8..11 are kept, oldest first. */
    for (int64_t i = 4; i <= 11; i++) {
        tv__history_sample x = at(i);
        tv__history_push(&h, &x);
    }
    assert_int_equal(tv__history_copy(&h, out, 8), 4);
    for (int i = 0; i < 4; i++)
        assert_int_equal(out[i].time_ms, 1000 * (8 + i));
    /* A shorter copy: the newest two. */
    assert_int_equal(tv__history_copy(&h, out, 2), 2);
    assert_int_equal(out[0].time_ms, 10000);
    assert_int_equal(out[1].time_ms, 11000);
    assert_int_equal(tv__history_copy(&h, out, 0), 0);
}

static void test_ring_of_one(void **state)
{
    (void)state;
    tv__history_sample buf[1], out[2];
    tv__history h;
    assert_int_equal(tv__history_init(&h, buf, 1), 0);
    for (int64_t i = 1; i <= 5; i++) {
        tv__history_sample x = at(i);
        tv__history_push(&h, &x);
        assert_int_equal(tv__history_copy(&h, out, 2), 1);
        assert_int_equal(out[0].time_ms, 1000 * i);
    }
}

static void test_bad_arguments(void **state)
{
    (void)state;
    tv__history_sample buf[2], out[2];
    tv__history h;
    tv__history_sampler *s = NULL;
    size_t n;
    uint32_t iv;
    assert_int_equal(tv__history_init(NULL, buf, 2), -EINVAL);
    assert_int_equal(tv__history_init(&h, NULL, 2), -EINVAL);
    assert_int_equal(tv__history_init(&h, buf, 0), -EINVAL);
    assert_int_equal(tv__history_start(NULL, 0, &s), -EINVAL);
    assert_int_equal(tv__history_start(NULL, 10, NULL), -EINVAL);
    assert_int_equal(tv__history_snapshot(NULL, 2, &n, &iv), -EINVAL);
    assert_int_equal(tv__history_snapshot(out, 2, NULL, &iv), -EINVAL);
    assert_int_equal(tv__history_snapshot(out, 2, &n, NULL), -EINVAL);
    tv__history_stop(NULL);
}

/* Waits (bounded) until the process-wide ring holds at least want samples. */
static size_t wait_samples(tv__history_sample *out, size_t max, size_t want, uint32_t *iv)
{
    size_t n = 0;
    for (int i = 0; i < 500; i++) {
        assert_int_equal(tv__history_snapshot(out, max, &n, iv), 0);
        if (n >= want)
            break;
        nanosleep(&(struct timespec){.tv_nsec = 10 * 1000 * 1000}, NULL);
    }
    return n;
}

static void test_sampler(void **state)
{
    (void)state;
    static tv__history_sample out[TV__HISTORY_SAMPLES];
    tv__history_sampler *s = NULL, *t = NULL;
    uint32_t iv = 0;
    size_t n;
    tv__metrics_reset();
    assert_int_equal(tv__history_start(NULL, 5, &s), 0);
    assert_non_null(s);
    assert_int_equal(tv__history_start(NULL, 5, &t), -EBUSY);
    assert_null(t);
    n = wait_samples(out, TV__HISTORY_SAMPLES, 2, &iv);
    assert_true(n >= 2);
    assert_int_equal(iv, 5);
    assert_int_equal(out[0].read_bytes, 0);
    assert_int_equal(out[0].import_bytes, 0);
    tv__metrics_read_bytes("GET /v1/models/{name}/generations/{gen}/tensors/{tensor}/data", 4096);
    n = wait_samples(out, TV__HISTORY_SAMPLES, n + 2, &iv);
    assert_int_equal(out[n - 1].read_bytes, 4096);
    for (size_t i = 1; i < n; i++) {
        assert_true(out[i].time_ms >= out[i - 1].time_ms);
        assert_true(out[i].read_bytes >= out[i - 1].read_bytes);
    }
    /* Stopping wakes the thread at once (a long interval would not). */
    tv__history_stop(s);
    assert_int_equal(tv__history_snapshot(out, TV__HISTORY_SAMPLES, &n, &iv), 0);
    assert_true(n >= 2);
    assert_int_equal(iv, 0);
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    assert_int_equal(tv__history_start(NULL, 60 * 1000, &s), 0);
    assert_true(wait_samples(out, TV__HISTORY_SAMPLES, 1, &iv) == 1); /* restarted: emptied */
    assert_int_equal(iv, 60 * 1000);
    tv__history_stop(s);
    clock_gettime(CLOCK_MONOTONIC, &b);
    assert_true(b.tv_sec - a.tv_sec < 30);
    tv__metrics_reset();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ring_order_and_wrap),
        cmocka_unit_test(test_ring_of_one),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_sampler),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
