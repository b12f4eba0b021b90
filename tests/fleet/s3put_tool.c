/* Test driver of server/fleet/s3put.c (tests/fleet/test_s3put.py):
 *   s3put_tool head S3URL [--cancel-after MS]
 *   s3put_tool copy SRC_URL LEN SHA256|- S3URL [--bearer T] [--part-len N]
 *              [--parallel N] [--retries N] [--timeout S] [--cancel-after MS]
 * --cancel-after: the options' cancel says stop MS milliseconds after the
 * start (what a stopping daemon does to its uploads).
 * The store's endpoint, region and keys come from AWS_ENDPOINT_URL,
 * AWS_REGION, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and
 * AWS_SESSION_TOKEN. Prints one JSON line ({"exists":..,"length":..} /
 * {"copied":LEN}) and exits 0, or prints `error NAME: message` and exits 1
 * (2: bad usage). */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fleet/s3put.h"

static int usage(void)
{
    fprintf(stderr, "usage: s3put_tool head S3URL [--cancel-after MS]\n"
                    "       s3put_tool copy SRC_URL LEN SHA256|- S3URL [--bearer T] [--part-len N] "
                    "[--parallel N] [--retries N] [--timeout S] [--cancel-after MS]\n");
    return 2;
}

static int num(const char *s, uint64_t *v)
{
    char *end;
    if (!s || !*s || *s == '-')
        return -1;
    *v = strtoull(s, &end, 10);
    return *end ? -1 : 0;
}

static atomic_bool g_cancel;
static uint64_t g_cancel_ms;

static bool cancelled(void *ctx)
{
    (void)ctx;
    return atomic_load(&g_cancel);
}

static void *canceller(void *arg)
{
    (void)arg;
    struct timespec ts = {.tv_sec = (time_t)(g_cancel_ms / 1000),
                          .tv_nsec = (long)(g_cancel_ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0)
        ;
    atomic_store(&g_cancel, true);
    return NULL;
}

/* --cancel-after MS: a thread that sets the cancel flag then. */
static int start_canceller(const char *ms, tv__s3put_opts *o)
{
    pthread_t t;
    if (num(ms, &g_cancel_ms) || pthread_create(&t, NULL, canceller, NULL))
        return -1;
    pthread_detach(t);
    o->cancel = (tv__http_cancel){.cancelled = cancelled};
    return 0;
}

int main(int argc, char **argv)
{
    tv__s3put_opts o = {0};
    tv_error err = {0};
    int rc;
    o.s3.endpoint = getenv("AWS_ENDPOINT_URL");
    o.s3.region = getenv("AWS_REGION");
    o.s3.access_key_id = getenv("AWS_ACCESS_KEY_ID");
    o.s3.secret_access_key = getenv("AWS_SECRET_ACCESS_KEY");
    o.s3.session_token = getenv("AWS_SESSION_TOKEN");
    if ((argc == 3 || (argc == 5 && strcmp(argv[3], "--cancel-after") == 0)) &&
        strcmp(argv[1], "head") == 0) {
        if (argc == 5 && start_canceller(argv[4], &o))
            return usage();
        bool exists;
        uint64_t len;
        if ((rc = tv__s3_head(&o, argv[2], &exists, &len, &err)))
            goto fail;
        printf("{\"exists\": %s, \"length\": %" PRIu64 "}\n", exists ? "true" : "false", len);
        return 0;
    }
    if (argc < 6 || strcmp(argv[1], "copy") != 0)
        return usage();
    uint64_t len, v;
    const char *bearer = NULL;
    if (num(argv[3], &len))
        return usage();
    for (int i = 6; i < argc; i++) {
        if (i + 1 >= argc)
            return usage();
        const char *a = argv[i], *b = argv[++i];
        if (strcmp(a, "--bearer") == 0)
            bearer = b;
        else if (strcmp(a, "--cancel-after") == 0 && start_canceller(b, &o))
            return usage();
        else if (strcmp(a, "--cancel-after") == 0)
            continue;
        else if (num(b, &v) || v > UINT32_MAX)
            return usage();
        else if (strcmp(a, "--part-len") == 0)
            o.part_len = v;
        else if (strcmp(a, "--parallel") == 0)
            o.parallel = (unsigned)v;
        else if (strcmp(a, "--retries") == 0)
            o.retries = (unsigned)v;
        else if (strcmp(a, "--timeout") == 0)
            o.timeout_s = (unsigned)v;
        else
            return usage();
    }
    const char *sha = strcmp(argv[4], "-") == 0 ? NULL : argv[4];
    if ((rc = tv__s3_copy_from_url(&o, argv[2], bearer, len, sha, argv[5], &err)))
        goto fail;
    printf("{\"copied\": %" PRIu64 "}\n", len);
    return 0;
fail:
    printf("error %s: %s\n", tv_err_name(rc), err.msg);
    return 1;
}
