/* Unit tests of the Prometheus metrics (server/http/metrics.c): counters by
 * route and status, read bytes by route, the read-latency histogram (only
 * data routes feed it; buckets are cumulative), label escaping, the series
 * bound, and the registry gauges (devices, generations, jobs by state) on a
 * temp store; rendering without a registry still gives the counters; the
 * fast path's series are always there (zeros without a fast path). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "http/metrics.h"
#include "tv_test_store.h"

static char *render(tv__reg *reg)
{
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(tv__metrics_render(reg, NULL, &text, &len), 0);
    assert_non_null(text);
    assert_int_equal(strlen(text), len);
    return text;
}

static void test_counters_and_histogram(void **state)
{
    (void)state;
    tv__metrics_reset();
    const char *data = "GET /v1/models/{name}/generations/{gen}/tensors/{tensor}/data";
    tv__metrics_request("GET /v1/models", 200, 1000);
    tv__metrics_request("GET /v1/models", 200, 1000);
    tv__metrics_request("GET /v1/models", 404, 1000);
    tv__metrics_request(NULL, 404, 1000);
    tv__metrics_request(data, 206, 2 * 1000 * 1000); /* 2 ms */
    tv__metrics_request(data, 200, 20000000000ull);  /* 20 s: only +Inf */
    tv__metrics_read_bytes(data, 100);
    tv__metrics_read_bytes(data, 23);
    tv__metrics_request("GET /we\"ird\\", 200, 1);
    char *t = render(NULL);
    assert_non_null(
        strstr(t, "tensorvault_http_requests_total{route=\"GET /v1/models\",status=\"200\"} 2\n"));
    assert_non_null(
        strstr(t, "tensorvault_http_requests_total{route=\"GET /v1/models\",status=\"404\"} 1\n"));
    assert_non_null(
        strstr(t, "tensorvault_http_requests_total{route=\"other\",status=\"404\"} 1\n"));
    assert_non_null(strstr(t, "route=\"GET /we\\\"ird\\\\\",status=\"200\"} 1\n"));
    /* imported bytes are the job pool's (tv__jobs_imported_bytes): none here */
    assert_non_null(strstr(t, "tensorvault_imported_bytes_total 0\n"));
    char want[300];
    snprintf(want, sizeof(want), "tensorvault_read_bytes_total{route=\"%s\"} 123\n", data);
    assert_non_null(strstr(t, want));
    assert_non_null(strstr(t, "tensorvault_read_duration_seconds_bucket{le=\"0.001\"} 0\n"));
    assert_non_null(strstr(t, "tensorvault_read_duration_seconds_bucket{le=\"0.0025\"} 1\n"));
    assert_non_null(strstr(t, "tensorvault_read_duration_seconds_bucket{le=\"10\"} 1\n"));
    assert_non_null(strstr(t, "tensorvault_read_duration_seconds_bucket{le=\"+Inf\"} 2\n"));
    assert_non_null(strstr(t, "tensorvault_read_duration_seconds_count 2\n"));
    assert_non_null(strstr(t, "# TYPE tensorvault_http_requests_total counter\n"));
    assert_non_null(strstr(t, "# TYPE tensorvault_read_duration_seconds histogram\n"));
    assert_non_null(strstr(t, "tensorvault_build_info{version=\""));
    assert_null(strstr(t, "tensorvault_generations{")); /* no registry: no gauges */
    free(t);
}

static void test_series_bound(void **state)
{
    (void)state;
    tv__metrics_reset();
    for (int i = 0; i < TV__METRICS_MAX_SERIES + 50; i++) {
        char route[32];
        snprintf(route, sizeof(route), "GET /r%d", i);
        tv__metrics_request(route, 200, 1);
    }
    char *t = render(NULL);
    size_t n = 0;
    for (const char *p = t; (p = strstr(p, "tensorvault_http_requests_total{")); p++)
        n++;
    assert_true(n <= TV__METRICS_MAX_SERIES);
    /* The overflow lands on route="other". */
    assert_non_null(strstr(t, "tensorvault_http_requests_total{route=\"other\",status=\"200\"}"));
    free(t);
}

static void test_registry_gauges(void **state)
{
    (void)state;
    char ckpt[600], reg_path[700];
    tv_error err = {0};
    tv_test_store s;
    tv_test_store_setup(&s, "metrics", &(tv_test_store_opts){.image_size = 64u << 20});
    const char *image = s.image[0];
    tv_test_path(ckpt, sizeof(ckpt), "%s/m.safetensors", s.dir);
    tv_test_tensor t[] = {{"w", "U8", 100000, 1}};
    tv_test_write_shard(ckpt, t, 1, 3);
    tv_test_store_import(&s, "m", ckpt, NULL);
    tv__reg_job spec;
    memset(&spec, 0, sizeof(spec));
    spec.kind = TV__JOB_VERIFY;
    int64_t id = 0;
    assert_int_equal(tv__reg_job_create(s.st->reg, &spec, &id, &err), 0);
    assert_int_equal(
        tv__reg_job_finish(s.st->reg, id, TV__JOB_FAILED, TV_E_HASH_MISMATCH, "x", 0, NULL, &err),
        0);
    tv_test_store_close_writer(&s);
    tv_test_path(reg_path, sizeof(reg_path), "%s/registry.db", s.store);
    tv__reg *reg = NULL;
    assert_int_equal(tv__reg_open_ex(reg_path, TV__REG_READONLY, &reg, &err), 0);
    tv__metrics_reset();
    char *text = render(reg);
    assert_non_null(strstr(text, "tensorvault_generations{state=\"ready\"} 1\n"));
    assert_non_null(strstr(text, "tensorvault_generations{state=\"retired\"} 0\n"));
    assert_non_null(strstr(text, "tensorvault_import_jobs{state=\"failed\"} 1\n"));
    assert_non_null(strstr(text, "tensorvault_import_jobs{state=\"succeeded\"} 0\n"));
    char want[800];
    snprintf(want, sizeof(want), "tensorvault_device_capacity_bytes{device=\"1\",path=\"%s\"} ",
             image);
    char real[600];
    if (!strstr(text, want) && realpath(image, real)) /* registered by its real path */
        snprintf(want, sizeof(want), "tensorvault_device_capacity_bytes{device=\"1\",path=\"%s\"} ",
                 real);
    assert_non_null(strstr(text, want));
    const char *used = strstr(text, "tensorvault_device_used_bytes{device=\"1\"");
    assert_non_null(used);
    unsigned long long u = strtoull(strstr(used, "} ") + 2, NULL, 10);
    assert_true(u >= 100000); /* the one object, padded to object_align */
    free(text);
    tv__reg_close(reg);
    tv_test_store_teardown(&s);
}

/* Without a fast path (disabled, or before tv__fp_start) every
 * tensorvault_fastpath_* series is rendered with its type and 0. */
static void test_fastpath_series(void **state)
{
    (void)state;
    static const char *const gauges[] = {"tensorvault_fastpath_sessions",
                                         "tensorvault_fastpath_groups"};
    static const char *const counters[] = {"tensorvault_fastpath_sessions_total",
                                           "tensorvault_fastpath_device_read_bytes_total",
                                           "tensorvault_fastpath_delivered_bytes_total",
                                           "tensorvault_fastpath_shared_bytes_total",
                                           "tensorvault_fastpath_refused_total",
                                           "tensorvault_fastpath_protocol_errors_total"};
    char want[200];
    tv__metrics_set_fastpath(NULL);
    char *t = render(NULL);
    for (size_t i = 0; i < sizeof gauges / sizeof *gauges; i++) {
        snprintf(want, sizeof want, "# TYPE %s gauge\n%s 0\n", gauges[i], gauges[i]);
        if (!strstr(t, want))
            fail_msg("no \"%s\" in:\n%s", want, t);
    }
    for (size_t i = 0; i < sizeof counters / sizeof *counters; i++) {
        snprintf(want, sizeof want, "# TYPE %s counter\n%s 0\n", counters[i], counters[i]);
        if (!strstr(t, want))
            fail_msg("no \"%s\" in:\n%s", want, t);
        snprintf(want, sizeof want, "# HELP %s ", counters[i]);
        assert_non_null(strstr(t, want));
    }
    free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_counters_and_histogram),
        cmocka_unit_test(test_series_bound),
        cmocka_unit_test(test_registry_gauges),
        cmocka_unit_test(test_fastpath_series),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
