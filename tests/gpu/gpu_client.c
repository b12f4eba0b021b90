/* GPU check of the fast path's CUDA destination (a tv_model opened with
 * tv_model_open_daemon in a session of core/include/tensorvault/client.h),
 * driven by tests/gpu/run.sh against a tensorvaultd it started on the store
 * of the in-process checks. The same read functions serve both models: the
 * daemon's (x.m) and, with --store, the one opened in-process (x.ref).
 *
 *   gpu_client check SOCKET SPEC [--store STORE] [--register 0|1] [--bench] [--repeat N]
 *       connects (tv_client_opts.cuda_register as given, default 0), opens
 *       SPEC through the daemon and reads every tensor with tv_read_into
 *       (host); with --store, tv_read_into of the same tensor of the model
 *       opened in-process must equal it. With a CUDA device, tv_read_into_cuda of every tensor
 *       into a cudaMalloc'd buffer with guard bytes on both sides (odd
 *       offset; default stream and a created one, alternating) is copied
 *       back and compared with the host bytes. Then every tensor at once:
 *       tv_read_batch into a host arena (one gap byte between
 *       destinations; with --store equal to the in-process tv_read_batch),
 *       and tv_read_batch_cuda into the same layout on the GPU,
 *       copied back and compared byte for byte (gaps included); host and GPU
 *       GB/s of the best of N batches. --bench: batches only.
 *       Without a CUDA device the host part still runs; then exit 77.
 *   gpu_client refuse SOCKET SPEC [--store STORE]
 *       the CUDA calls refuse cleanly: without a GPU (or CUDA) they return
 *       TV_E_NOT_SUPPORTED, with one a host pointer is TV_E_INVALID_ARG;
 *       for tv_read_into_cuda and tv_read_batch_cuda (every
 *       request's result set), with cuda_register true and false: nothing
 *       is written into the buffer and the session still reads (host bytes
 *       equal the in-process reader's with --store). Needs no GPU.
 *
 * Both print "RESULT tensors=.. mismatches=.. bytes=.. host_gbs=..
 * gpu_gbs=.." (gpu_gbs=- when no GPU part ran). Exit status: 0 every check
 * passed; 1 a mismatch or an error; 2 usage; 77 no CUDA device (check). */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "tensorvault/client.h"
#include "tensorvault/tensorvault.h"

#define GPU_TOOL "gpu_client"
#include "gpu_common.h"

/* true when a CUDA device is usable by the runtime and by the library. */
static bool have_gpu(void)
{
    int n_dev = 0;
    cudaError_t ce = cudaGetDeviceCount(&n_dev);
    if (ce != cudaSuccess || n_dev == 0) {
        cudaGetLastError();
        fprintf(stderr, "gpu_client: no CUDA device (%s)\n",
                ce != cudaSuccess ? cudaGetErrorName(ce) : "0 devices");
        return false;
    }
    return tv_cuda_available();
}

typedef struct ctx {
    tv_client *c;
    tv_model *m;
    tv_model *ref; /* in-process reader of --store, or NULL */
    size_t n;
} ctx;

static int ctx_open(ctx *x, const char *sock, const char *spec, const char *store, bool reg)
{
    tv_error err = {0};
    tv_client_opts co = {.timeout_ms = 120000, .cuda_register = reg};
    int rc = tv_client_connect(sock, &co, &x->c, &err);
    if (rc)
        return fail_tv("tv_client_connect", sock, rc, &err);
    if ((rc = tv_model_open_daemon(x->c, spec, NULL, &x->m, &err)))
        return fail_tv("tv_model_open_daemon", spec, rc, &err);
    if (store) {
        tv_open_opts o = {0};
        if ((rc = tv_model_open(store, spec, &o, &x->ref, &err)))
            return fail_tv("tv_model_open", spec, rc, &err);
        if (tv_model_n_tensors(x->ref) != tv_model_n_tensors(x->m) ||
            tv_model_generation(x->ref) != tv_model_generation(x->m)) {
            fprintf(stderr,
                    "gpu_client: '%s': the daemon's model (%zu tensors, generation %" PRId64
                    ") is not the store's (%zu tensors, generation %" PRId64 ")\n",
                    spec, tv_model_n_tensors(x->m), tv_model_generation(x->m),
                    tv_model_n_tensors(x->ref), tv_model_generation(x->ref));
            return 1;
        }
    }
    x->n = tv_model_n_tensors(x->m);
    printf("gpu_client: session %" PRIu64 ": %s generation %" PRId64 ", %zu tensors, "
           "cuda_register %s\n",
           tv_client_session_id(x->c), tv_model_name(x->m), tv_model_generation(x->m), x->n,
           reg ? "true" : "false");
    return 0;
}

static void ctx_close(ctx *x)
{
    tv_model_close(x->m);
    tv_client_close(x->c);
    tv_model_close(x->ref);
}

/* Host bytes of tensor d through the fast path (checked against the
 * in-process reader when there is one) into host (d->nbytes bytes). */
static int host_read(ctx *x, const tv_tensor_desc *d, uint8_t *host)
{
    tv_error err = {0};
    size_t len = (size_t)d->nbytes;
    int rc = tv_read_into(x->m, d->name, host, len, &err);
    if (rc)
        return fail_tv("tv_read_into", d->name, rc, &err);
    if (x->ref) {
        uint8_t *want = xmalloc(len);
        if ((rc = tv_read_into(x->ref, d->name, want, len, &err))) {
            free(want);
            return fail_tv("tv_read_into", d->name, rc, &err);
        }
        size_t at = first_diff(host, want, len);
        if (at < len)
            mismatch("fast-path host bytes vs the in-process reader", d->name, at);
        free(want);
    }
    return 0;
}

/* Every tensor on its own: host, then (with a GPU) CUDA with guard bytes. */
static int per_tensor(ctx *x, bool gpu, cudaStream_t st)
{
    tv_error err = {0};
    for (size_t i = 0; i < x->n; i++) {
        tv_tensor_desc d;
        tv_model_tensor(x->m, i, &d);
        size_t len = (size_t)d.nbytes, total = len + 2 * GUARD + 1;
        uint8_t *host = xmalloc(len);
        int rc = host_read(x, &d, host);
        if (rc || !gpu) {
            free(host);
            if (rc)
                return rc;
            continue;
        }
        uint8_t *back = xmalloc(total), *dev = NULL;
        CU(cudaMalloc((void **)&dev, total));
        CU(cudaMemset(dev, PAT, total));
        void *stream = i % 2 ? (void *)st : NULL;
        rc = tv_read_into_cuda(x->m, d.name, dev + GUARD + 1, len, stream, &err);
        if (rc)
            return fail_tv("tv_read_into_cuda", d.name, rc, &err);
        CU(cudaMemcpy(back, dev, total, cudaMemcpyDeviceToHost));
        check_guarded(back, host, len, d.name, "tv_read_into_cuda");
        CU(cudaFree(dev));
        free(host);
        free(back);
    }
    return 0;
}

/* The tensor holding arena byte p (for a mismatch message). */
static void arena_mismatch(ctx *x, const uint64_t *at, uint64_t p, const char *what)
{
    size_t k = 0;
    while (k + 1 < x->n && at[k + 1] <= p)
        k++;
    tv_tensor_desc d;
    tv_model_tensor(x->m, k, &d);
    char buf[128];
    snprintf(buf, sizeof(buf), "%s (%s)",
             p >= at[k] && p < at[k] + d.nbytes ? "payload" : "gap byte", what);
    mismatch(buf, d.name, (size_t)(p - at[k]));
}

static int check(int argc, char **argv)
{
    const char *sock = argv[0], *spec = argv[1], *store = NULL;
    bool bench_only = false, reg = false;
    unsigned repeat = 2;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--bench")) {
            bench_only = true;
        } else if (!strcmp(argv[i], "--repeat") && i + 1 < argc) {
            repeat = (unsigned)strtoul(argv[++i], NULL, 10);
            if (!repeat)
                repeat = 1;
        } else if (!strcmp(argv[i], "--store") && i + 1 < argc) {
            store = argv[++i];
        } else if (!strcmp(argv[i], "--register") && i + 1 < argc) {
            reg = strcmp(argv[++i], "0") != 0;
        } else {
            fprintf(stderr, "gpu_client: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    bool gpu = have_gpu();
    struct cudaDeviceProp prop;
    cudaStream_t st = NULL;
    if (gpu) {
        CU(cudaGetDeviceProperties(&prop, 0));
        CU(cudaFree(NULL)); /* the context, outside the timings */
        CU(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    }
    ctx x = {0};
    tv_error err = {0};
    int rc = ctx_open(&x, sock, spec, store, reg);
    if (rc)
        return rc;
    if (!bench_only && (rc = per_tensor(&x, gpu, st)))
        return rc;

    /* Batches: destinations packed with one gap byte between them (odd
     * offsets); the same layout on the host and on the GPU. */
    size_t n = x.n;
    tv_read_req *rq = xmalloc(n * sizeof(*rq));
    uint64_t *at = xmalloc(n * sizeof(*at));
    uint64_t arena = 1, payload = 0;
    for (size_t i = 0; i < n; i++) {
        tv_tensor_desc d;
        tv_model_tensor(x.m, i, &d);
        at[i] = arena;
        arena += d.nbytes + 1;
        payload += d.nbytes;
    }
    uint8_t *h = xmalloc(arena), *back = xmalloc(arena), *g = NULL;
    if (gpu)
        CU(cudaMalloc((void **)&g, arena));
    double host_best = 0, gpu_best = 0;
    for (unsigned r = 0; r < repeat; r++) {
        memset(h, PAT, arena);
        for (size_t i = 0; i < n; i++)
            rq[i] = (tv_read_req){.index = i, .dest = h + at[i], .dest_len = arena - at[i]};
        double t0 = now();
        rc = tv_read_batch(x.m, rq, n, &err);
        double dt = now() - t0;
        if (rc)
            return fail_tv("tv_read_batch", spec, rc, &err);
        if (dt > 0 && (double)payload / dt > host_best)
            host_best = (double)payload / dt;
        if (r == 0 && x.ref) { /* the in-process batch, same layout */
            memset(back, PAT, arena);
            for (size_t i = 0; i < n; i++)
                rq[i] = (tv_read_req){.index = i, .dest = back + at[i], .dest_len = arena - at[i]};
            if ((rc = tv_read_batch(x.ref, rq, n, &err)))
                return fail_tv("tv_read_batch", spec, rc, &err);
            size_t d0 = first_diff(h, back, arena);
            if (d0 < arena)
                arena_mismatch(&x, at, d0,
                               "tv_read_batch: the daemon's model vs the in-process one");
        }
        if (!gpu)
            continue;
        CU(cudaMemset(g, PAT, arena));
        CU(cudaDeviceSynchronize());
        for (size_t i = 0; i < n; i++)
            rq[i] = (tv_read_req){.index = i, .dest = g + at[i], .dest_len = arena - at[i]};
        void *stream = r % 2 ? (void *)st : NULL;
        t0 = now();
        rc = tv_read_batch_cuda(x.m, rq, n, stream, &err);
        dt = now() - t0;
        if (rc)
            return fail_tv("tv_read_batch_cuda", spec, rc, &err);
        for (size_t i = 0; i < n; i++)
            if (rq[i].result) {
                tv_tensor_desc d;
                tv_model_tensor(x.m, i, &d);
                return fail_tv("tv_read_batch_cuda request", d.name, rq[i].result, &err);
            }
        if (dt > 0 && (double)payload / dt > gpu_best)
            gpu_best = (double)payload / dt;
        CU(cudaMemcpy(back, g, arena, cudaMemcpyDeviceToHost));
        size_t d0 = first_diff(back, h, arena);
        if (d0 < arena)
            arena_mismatch(&x, at, d0, "tv_read_batch_cuda");
    }
    char gbs[32] = "-";
    if (gpu)
        snprintf(gbs, sizeof(gbs), "%.2f", gpu_best / 1e9);
    printf("gpu_client: %s via %s on %s: %zu tensors, %.3f GB, %zu mismatches; batch host %.2f "
           "GB/s, GPU %s GB/s (best of %u, cuda_register %s)\n",
           spec, sock, gpu ? prop.name : "no GPU", n, (double)payload / 1e9, g_mismatch,
           host_best / 1e9, gbs, repeat, reg ? "true" : "false");
    printf("RESULT tensors=%zu mismatches=%zu bytes=%" PRIu64 " host_gbs=%.2f gpu_gbs=%s\n", n,
           g_mismatch, payload, host_best / 1e9, gbs);
    if (gpu) {
        CU(cudaFree(g));
        CU(cudaStreamDestroy(st));
    }
    free(h);
    free(back);
    free(rq);
    free(at);
    ctx_close(&x);
    if (g_mismatch)
        return 1;
    if (!gpu) {
        fprintf(stderr, "gpu_client: no CUDA device: the CUDA reads were skipped (the host "
                        "part passed)\n");
        return EXIT_SKIP;
    }
    return 0;
}

static bool all_pat(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != PAT)
            return false;
    return true;
}

/* One refusal: rc must be want, err.msg set, buf untouched. */
static int expect_refusal(const char *what, int rc, int want, const tv_error *err,
                          const uint8_t *buf, size_t len)
{
    if (rc != want) {
        fprintf(stderr, "gpu_client: %s returned %s (%s), expected %s\n", what, tv_err_name(rc),
                err->msg, tv_err_name(want));
        return 1;
    }
    if (!err->msg[0]) {
        fprintf(stderr, "gpu_client: %s: %s without a message\n", what, tv_err_name(rc));
        return 1;
    }
    if (!all_pat(buf, len)) {
        fprintf(stderr, "gpu_client: %s wrote into the destination it refused\n", what);
        return 1;
    }
    printf("gpu_client: %s: %s (%s)\n", what, tv_err_name(rc), err->msg);
    return 0;
}

static int refuse(int argc, char **argv)
{
    const char *sock = argv[0], *spec = argv[1], *store = NULL;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--store") && i + 1 < argc) {
            store = argv[++i];
        } else {
            fprintf(stderr, "gpu_client: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    bool gpu = have_gpu();
    /* No GPU: not supported; a GPU: a host buffer is not device memory. */
    int want = gpu ? TV_E_INVALID_ARG : TV_E_NOT_SUPPORTED;
    int fails = 0;
    size_t checked = 0;
    uint64_t bytes = 0;
    for (int reg = 0; reg < 2; reg++) {
        ctx x = {0};
        int rc = ctx_open(&x, sock, spec, store, reg);
        if (rc)
            return rc;
        if (x.n == 0) {
            fprintf(stderr, "gpu_client: '%s' has no tensors\n", spec);
            return 1;
        }
        /* The largest tensor (at most 64 MiB) and the first three. */
        size_t big = 0;
        tv_tensor_desc d;
        uint64_t best = 0;
        for (size_t i = 0; i < x.n; i++) {
            tv_model_tensor(x.m, i, &d);
            if (d.nbytes > best && d.nbytes <= (64u << 20))
                best = d.nbytes, big = i;
        }
        tv_model_tensor(x.m, big, &d);
        size_t len = (size_t)d.nbytes;
        uint8_t *buf = xmalloc(len + 1);
        memset(buf, PAT, len + 1);
        tv_error err = {0};
        char what[160];
        snprintf(what, sizeof(what), "tv_read_into_cuda('%s', host buffer, register %d)", d.name,
                 reg);
        rc = tv_read_into_cuda(x.m, d.name, buf, len, NULL, &err);
        fails += expect_refusal(what, rc, want, &err, buf, len + 1);
        checked++;

        size_t nb = x.n < 3 ? x.n : 3;
        tv_read_req rq[3];
        uint64_t off = 0;
        for (size_t i = 0; i < nb; i++) {
            tv_model_tensor(x.m, i, &d);
            off += d.nbytes;
        }
        uint8_t *bb = xmalloc((size_t)off + 1);
        memset(bb, PAT, (size_t)off + 1);
        off = 0;
        for (size_t i = 0; i < nb; i++) {
            tv_model_tensor(x.m, i, &d);
            rq[i] = (tv_read_req){
                .index = i, .dest = bb + off, .dest_len = (size_t)d.nbytes, .result = 12345};
            off += d.nbytes;
        }
        err = (tv_error){0};
        snprintf(what, sizeof(what), "tv_read_batch_cuda(%zu requests, register %d)", nb, reg);
        rc = tv_read_batch_cuda(x.m, rq, nb, NULL, &err);
        fails += expect_refusal(what, rc, want, &err, bb, (size_t)off + 1);
        for (size_t i = 0; i < nb; i++)
            if (rq[i].result != want) {
                fprintf(stderr, "gpu_client: %s: request %zu's result is %d, expected %s\n", what,
                        i, rq[i].result, tv_err_name(want));
                fails++;
            }
        checked++;
        if (!gpu) { /* even an empty batch: no CUDA, no call */
            err = (tv_error){0};
            rc = tv_read_batch_cuda(x.m, NULL, 0, NULL, &err);
            fails += expect_refusal("tv_read_batch_cuda(0 requests)", rc, want, &err, bb, 0);
            checked++;
        }
        free(bb);

        /* The session still reads: the host bytes of that tensor. */
        tv_model_tensor(x.m, big, &d);
        if ((rc = host_read(&x, &d, buf)))
            return rc;
        bytes += d.nbytes;
        checked++;
        free(buf);
        ctx_close(&x);
    }
    printf("RESULT tensors=%zu mismatches=%zu bytes=%" PRIu64 " host_gbs=- gpu_gbs=-\n", checked,
           g_mismatch + (size_t)fails, bytes);
    return fails || g_mismatch ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc >= 4 && !strcmp(argv[1], "check"))
        return check(argc - 2, argv + 2);
    if (argc >= 4 && !strcmp(argv[1], "refuse"))
        return refuse(argc - 2, argv + 2);
    fprintf(stderr, "usage: gpu_client check SOCKET SPEC [--store STORE] [--register 0|1] "
                    "[--bench] [--repeat N]\n"
                    "       gpu_client refuse SOCKET SPEC [--store STORE]\n");
    return 2;
}
