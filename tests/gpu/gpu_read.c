/* GPU check of the CUDA destination, driven by tests/gpu/run.sh:
 *
 *   gpu_read write-ckpt OUT.safetensors SIZE[K|M|G]
 *       writes a valid safetensors checkpoint of about SIZE bytes (BF16 and
 *       F32 tensors of 1..64 MiB with odd-length U8, zero-size and rank-0
 *       tensors between them so offsets are unaligned; every 512-byte piece
 *       is stamped with its file offset). Needs no GPU.
 *   gpu_read probe
 *       says whether a CUDA device is usable (exit 0, or 77 when none).
 *   gpu_read check STORE NAME[@GEN] [--bench] [--engine auto|uring|pread] [--repeat N]
 *       reads every tensor with tv_read_into (host) and tv_read_into_cuda
 *       (into a cudaMalloc'd buffer with guard bytes on both sides, on the
 *       default stream and on a created stream), copies back with cudaMemcpy
 *       and compares; then reads all tensors at once with tv_read_batch and
 *       tv_read_batch_cuda into arenas with a gap byte between destinations,
 *       compares the arenas and reports host and GPU GB/s of the batches.
 *       --bench: batches only (for large checkpoints).
 *       Prints a line "RESULT tensors=.. mismatches=.. bytes=.. host_gbs=..
 *       gpu_gbs=..".
 *
 * Exit status: 0 every byte equal; 1 a mismatch or an error; 2 usage;
 * 77 no CUDA device (skipped, with the reason on stderr). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "tensorvault/tensorvault.h"

#define GPU_TOOL "gpu_read"
#include "gpu_common.h"

static int parse_size(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s)
        return -1;
    switch (*end) {
    case 'G':
        v <<= 30;
        end++;
        break;
    case 'M':
        v <<= 20;
        end++;
        break;
    case 'K':
        v <<= 10;
        end++;
        break;
    default:
        break;
    }
    if (*end)
        return -1;
    *out = v;
    return 0;
}

/* ---- write-ckpt ----------------------------------------------------------- */

typedef struct wt {
    const char *dtype;
    unsigned elem_len;
    uint64_t shape[2];
    uint32_t rank;
    uint64_t nbytes;
} wt;

static int write_ckpt(const char *path, uint64_t total)
{
    /* One round: sizes chosen so BEGINs drift off every alignment. */
    static const uint64_t big[] = {(4u << 20) + 6, 16u << 20,       (1u << 20) + 2,
                                   64u << 20,      (8u << 20) + 10, 3u << 20};
    size_t cap = 1024, n = 0;
    wt *t = malloc(cap * sizeof(*t));
    uint64_t sum = 0;
    int rc = 1;
    char *hdr = NULL;
    uint8_t *buf = NULL;
    int fd = -1;
    if (!t)
        goto out;
    for (size_t i = 0; sum < total; i++) {
        if (n + 4 > cap) {
            cap *= 2;
            wt *nt = realloc(t, cap * sizeof(*t));
            if (!nt)
                goto out;
            t = nt;
        }
        size_t n0 = n;
        uint64_t b = big[i % 6];
        if (i % 3 == 2) /* F32 [rows, 1024] */
            t[n++] = (wt){"F32", 4, {b / 4096 ? b / 4096 : 1, 1024}, 2, 0};
        else /* BF16, 1-D */
            t[n++] = (wt){"BF16", 2, {b / 2, 0}, 1, 0};
        t[n++] = (wt){"U8", 1, {1 + (i * 7) % 13, 0}, 1, 0};
        if (i % 5 == 0)
            t[n++] = (wt){"F32", 4, {0, 8}, 2, 0};
        if (i % 7 == 0)
            t[n++] = (wt){"I32", 4, {0, 0}, 0, 0};
        for (size_t k = n0; k < n; k++) {
            uint64_t e = 1;
            for (uint32_t d = 0; d < t[k].rank; d++)
                e *= t[k].shape[d];
            t[k].nbytes = e * t[k].elem_len;
            sum += t[k].nbytes;
        }
    }
    size_t hcap = 256 + n * 160, hl = 0;
    if (!(hdr = malloc(hcap)))
        goto out;
    hl += (size_t)snprintf(hdr + hl, hcap - hl, "{\"__metadata__\":{\"writer\":\"gpu_read\"}");
    uint64_t off = 0;
    for (size_t k = 0; k < n; k++) {
        hl += (size_t)snprintf(hdr + hl, hcap - hl,
                               ",\"layers.%zu.%s\":{\"dtype\":\"%s\",\"shape\":[", k, t[k].dtype,
                               t[k].dtype);
        for (uint32_t d = 0; d < t[k].rank; d++)
            hl += (size_t)snprintf(hdr + hl, hcap - hl, "%s%" PRIu64, d ? "," : "", t[k].shape[d]);
        hl += (size_t)snprintf(hdr + hl, hcap - hl, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}",
                               off, off + t[k].nbytes);
        off += t[k].nbytes;
    }
    hl += (size_t)snprintf(hdr + hl, hcap - hl, "}");
    while (hl % 8)
        hdr[hl++] = ' ';
    if (hl >= hcap)
        goto out;
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        perror(path);
        goto out;
    }
    uint8_t len_le[8];
    for (int i = 0; i < 8; i++)
        len_le[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    if (write(fd, len_le, 8) != 8 || write(fd, hdr, hl) != (ssize_t)hl)
        goto io_fail;
    enum { BUF = 8 << 20 };
    if (!(buf = malloc(BUF)))
        goto out;
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < BUF; i += 8) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        memcpy(buf + i, &x, 8);
    }
    uint64_t pos = 8 + hl; /* file offset of buf[0] */
    for (uint64_t done = 0; done < off;) {
        size_t len = off - done < BUF ? (size_t)(off - done) : BUF;
        /* stamp every 512-byte piece with its file offset */
        for (size_t i = 0; i + 8 <= len; i += 512) {
            uint64_t o = pos + i;
            memcpy(buf + i, &o, 8);
        }
        for (size_t w = 0; w < len;) {
            ssize_t k = write(fd, buf + w, len - w);
            if (k <= 0)
                goto io_fail;
            w += (size_t)k;
        }
        done += len;
        pos += len;
    }
    if (close(fd)) {
        fd = -1;
        goto io_fail;
    }
    fd = -1;
    printf("%s: %zu tensors, %" PRIu64 " bytes of data\n", path, n, off);
    rc = 0;
    goto out;
io_fail:
    perror(path);
out:
    if (fd >= 0)
        close(fd);
    free(buf);
    free(hdr);
    free(t);
    return rc;
}

/* ---- check ---------------------------------------------------------------- */

/* 0 when a CUDA device is usable and the library has CUDA; 77 (skip) when
 * there is no device; 1 when the library was built without CUDA. */
static int probe(bool verbose)
{
    int n_dev = 0;
    cudaError_t ce = cudaGetDeviceCount(&n_dev);
    if (ce != cudaSuccess || n_dev == 0) {
        fprintf(stderr, "gpu_read: no CUDA device (%s): skipped\n",
                ce != cudaSuccess ? cudaGetErrorName(ce) : "0 devices");
        return EXIT_SKIP;
    }
    if (!tv_cuda_available()) {
        fprintf(stderr, "gpu_read: libtensorvault was built without CUDA (configure with "
                        "-DTV_CUDA=ON)\n");
        return 1;
    }
    if (verbose) {
        struct cudaDeviceProp prop;
        int drv = 0, rt = 0;
        CU(cudaGetDeviceProperties(&prop, 0));
        cudaDriverGetVersion(&drv);
        cudaRuntimeGetVersion(&rt);
        printf("gpu_read: %d CUDA device(s); device 0: %s, %.1f GiB, driver %d, runtime %d\n",
               n_dev, prop.name, (double)prop.totalGlobalMem / (1 << 30), drv, rt);
    }
    return 0;
}

/* Every tensor on its own: host read vs CUDA read (with device-side guard
 * bytes), alternating the default stream and a created one. */
static int per_tensor(tv_model *m, size_t n, cudaStream_t st)
{
    tv_error err = {0};
    for (size_t i = 0; i < n; i++) {
        tv_tensor_desc d;
        tv_model_tensor(m, i, &d);
        size_t len = (size_t)d.nbytes, total = len + 2 * GUARD + 1;
        uint8_t *host = malloc(len ? len : 1), *back = malloc(total);
        uint8_t *dev = NULL;
        if (!host || !back) {
            fprintf(stderr, "gpu_read: out of memory\n");
            return 1;
        }
        int rc = tv_read_into(m, d.name, host, len, &err);
        if (rc)
            return fail_tv("tv_read_into", d.name, rc, &err);
        CU(cudaMalloc((void **)&dev, total));
        CU(cudaMemset(dev, PAT, total));
        void *stream = i % 2 ? (void *)st : NULL;
        rc = tv_read_into_cuda(m, d.name, dev + GUARD + 1, len, stream, &err);
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

static int check(int argc, char **argv)
{
    const char *store = argv[0], *spec = argv[1];
    int rc;
    bool bench_only = false;
    unsigned repeat = 2;
    tv_open_opts o = {0};
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--bench")) {
            bench_only = true;
        } else if (!strcmp(argv[i], "--repeat") && i + 1 < argc) {
            repeat = (unsigned)strtoul(argv[++i], NULL, 10);
            if (!repeat)
                repeat = 1;
        } else if (!strcmp(argv[i], "--engine") && i + 1 < argc) {
            const char *e = argv[++i];
            o.engine = !strcmp(e, "uring")   ? TV_ENGINE_URING
                       : !strcmp(e, "pread") ? TV_ENGINE_PREAD
                                             : TV_ENGINE_AUTO;
        } else {
            fprintf(stderr, "gpu_read: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }

    /* No device: skip before touching the store. */
    if ((rc = probe(false)))
        return rc;
    struct cudaDeviceProp prop;
    CU(cudaGetDeviceProperties(&prop, 0));
    CU(cudaFree(NULL)); /* create the context outside the timings */

    tv_model *m = NULL;
    tv_error err = {0};
    rc = tv_model_open(store, spec, &o, &m, &err);
    if (rc)
        return fail_tv("tv_model_open", spec, rc, &err);
    size_t n = tv_model_n_tensors(m);
    cudaStream_t st;
    CU(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    if (!bench_only && (rc = per_tensor(m, n, st)))
        return rc;

    /* Batches: destinations packed with one gap byte between them (odd
     * offsets); identical layouts on the host and on the GPU. */
    tv_read_req *rq = calloc(n ? n : 1, sizeof(*rq));
    uint64_t *at = calloc(n ? n : 1, sizeof(*at));
    uint64_t arena = 1, payload = 0;
    if (!rq || !at) {
        fprintf(stderr, "gpu_read: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < n; i++) {
        tv_tensor_desc d;
        tv_model_tensor(m, i, &d);
        at[i] = arena;
        arena += d.nbytes + 1;
        payload += d.nbytes;
    }
    uint8_t *h = malloc(arena), *back = malloc(arena), *g = NULL;
    if (!h || !back) {
        fprintf(stderr, "gpu_read: out of memory for a %" PRIu64 "-byte arena\n", arena);
        return 1;
    }
    CU(cudaMalloc((void **)&g, arena));
    double host_best = 0, gpu_best = 0;
    for (unsigned r = 0; r < repeat; r++) {
        memset(h, PAT, arena);
        for (size_t i = 0; i < n; i++)
            rq[i] = (tv_read_req){.index = i, .dest = h + at[i], .dest_len = arena - at[i]};
        double t0 = now();
        rc = tv_read_batch(m, rq, n, &err);
        double dt = now() - t0;
        if (rc)
            return fail_tv("tv_read_batch", spec, rc, &err);
        if (dt > 0 && (double)payload / dt > host_best)
            host_best = (double)payload / dt;

        CU(cudaMemset(g, PAT, arena));
        CU(cudaDeviceSynchronize());
        for (size_t i = 0; i < n; i++)
            rq[i] = (tv_read_req){.index = i, .dest = g + at[i], .dest_len = arena - at[i]};
        void *stream = r % 2 ? (void *)st : NULL;
        t0 = now();
        rc = tv_read_batch_cuda(m, rq, n, stream, &err);
        dt = now() - t0;
        if (rc)
            return fail_tv("tv_read_batch_cuda", spec, rc, &err);
        for (size_t i = 0; i < n; i++)
            if (rq[i].result) {
                tv_tensor_desc d;
                tv_model_tensor(m, i, &d);
                return fail_tv("tv_read_batch_cuda request", d.name, rq[i].result, &err);
            }
        if (dt > 0 && (double)payload / dt > gpu_best)
            gpu_best = (double)payload / dt;
        CU(cudaMemcpy(back, g, arena, cudaMemcpyDeviceToHost));
        size_t d0 = first_diff(back, h, arena);
        if (d0 < arena) {
            size_t k = 0;
            while (k + 1 < n && at[k + 1] <= d0)
                k++;
            tv_tensor_desc d;
            tv_model_tensor(m, k, &d);
            mismatch(d0 < at[k] + d.nbytes && d0 >= at[k] ? "payload (tv_read_batch_cuda)"
                                                          : "gap byte (tv_read_batch_cuda)",
                     d.name, (size_t)(d0 - at[k]));
        }
    }
    printf("gpu_read: %s on %s: %zu tensors, %.3f GB, %zu mismatches; batch host %.2f GB/s, "
           "GPU %.2f GB/s (best of %u)\n",
           spec, prop.name, n, (double)payload / 1e9, g_mismatch, host_best / 1e9, gpu_best / 1e9,
           repeat);
    printf("RESULT tensors=%zu mismatches=%zu bytes=%" PRIu64 " host_gbs=%.2f gpu_gbs=%.2f\n", n,
           g_mismatch, payload, host_best / 1e9, gpu_best / 1e9);
    CU(cudaFree(g));
    CU(cudaStreamDestroy(st));
    free(h);
    free(back);
    free(rq);
    free(at);
    tv_model_close(m);
    return g_mismatch ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc == 4 && !strcmp(argv[1], "write-ckpt")) {
        uint64_t size;
        if (parse_size(argv[3], &size) || size == 0) {
            fprintf(stderr, "gpu_read: bad size '%s'\n", argv[3]);
            return 2;
        }
        return write_ckpt(argv[2], size);
    }
    if (argc == 2 && !strcmp(argv[1], "probe"))
        return probe(true);
    if (argc >= 4 && !strcmp(argv[1], "check"))
        return check(argc - 2, argv + 2);
    fprintf(stderr, "usage: gpu_read probe\n"
                    "       gpu_read write-ckpt OUT.safetensors SIZE[K|M|G]\n"
                    "       gpu_read check STORE NAME[@GEN] [--bench] [--engine auto|uring|pread] "
                    "[--repeat N]\n");
    return 2;
}
