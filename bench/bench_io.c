/* Benchmark of the read engine: reads an existing file (or block device) in
 * one batch of chunk-sized requests with io_uring and with the pread pool at
 * several queue depths, and prints GB/s next to a baseline (one thread, a
 * plain O_DIRECT pread loop) so a noisy machine still gives comparable
 * ratios. "direct" lines read into aligned destinations (no staging copy);
 * "staged" lines use destinations off by one byte, so every byte goes
 * through the staging ring and a memcpy.
 *
 * usage: bench_io FILE [chunk_kib (4096)] [max_mib (all)] [repeats (3, best kept)]
 * With O_DIRECT the page cache is bypassed; when the filesystem refuses it,
 * or TV_BENCH_BUFFERED=1 is set (to see the engine's own overhead on a
 * cached file), the figures are page-cache figures (printed in the header).
 * The baseline is measured before and after the engines (best kept): a
 * virtual disk often warms up. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dev/dev.h"
#include "io/engine.h"
#include "tensorvault/tensorvault.h"

#define N_DEST 64 /* destinations are reused: the bytes are not checked */

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* One thread, chunk-sized O_DIRECT preads into the same rotating
 * destinations as the engine runs. */
static double baseline(tv__dev *d, uint64_t len, size_t chunk, uint8_t **dest)
{
    double t0 = now();
    size_t i = 0;
    for (uint64_t off = 0; off < len; off += chunk, i++) {
        size_t n = len - off < chunk ? (size_t)(len - off) : chunk;
        if (tv__dev_pread_full(d, dest[i % N_DEST], n, off, NULL))
            return -1;
    }
    return (double)len / (now() - t0) / 1e9;
}

static double run_engine(tv__dev *d, int engine, uint32_t qd, size_t chunk, uint64_t len,
                         uint8_t **dest, size_t mis, int repeats, int *used)
{
    tv__io_dev iod = {
        .fd = d->fd, .io_align = d->io_align, .size_bytes = d->size_bytes, .direct = d->direct};
    tv__io_opts o = {
        .engine = engine, .queue_depth = qd, .chunk_len = chunk, .n_threads = qd < 32 ? qd : 32};
    tv__io *io = NULL;
    tv_error err = {0};
    size_t n = (size_t)((len + chunk - 1) / chunk);
    tv__io_req *r = calloc(n, sizeof(*r));
    double best = 0;
    if (!r || tv__io_create(&iod, 1, &o, &io, &err)) {
        fprintf(stderr, "engine: %s\n", err.msg);
        free(r);
        return -1;
    }
    *used = tv__io_engine(io);
    for (int rep = 0; rep < repeats; rep++) {
        for (size_t i = 0; i < n; i++) {
            uint64_t off = (uint64_t)i * chunk;
            memset(&r[i], 0, sizeof(r[i]));
            r[i].n_src = 1;
            r[i].src[0].off = off;
            r[i].len = len - off < chunk ? len - off : chunk;
            r[i].dest = dest[i % N_DEST] + mis;
        }
        double t0 = now();
        int rc = tv__io_run(io, r, n, NULL, &err);
        double dt = now() - t0;
        if (rc) {
            fprintf(stderr, "run: %s\n", err.msg);
            best = -1;
            break;
        }
        double gbs = (double)len / dt / 1e9;
        if (gbs > best)
            best = gbs;
    }
    tv__io_destroy(io);
    free(r);
    return best;
}

int main(int argc, char **argv)
{
    tv__dev *d = NULL;
    tv_error err = {0};
    size_t chunk = 4u << 20;
    uint64_t len, max = UINT64_MAX;
    int repeats = 3, rc = 1;
    uint8_t *dest[N_DEST] = {0};

    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE [chunk_kib] [max_mib] [repeats]\n", argv[0]);
        return 2;
    }
    if (argc > 2)
        chunk = (size_t)strtoull(argv[2], NULL, 10) * 1024;
    if (argc > 3)
        max = strtoull(argv[3], NULL, 10) << 20;
    if (argc > 4)
        repeats = atoi(argv[4]);
    if (!chunk || repeats < 1) {
        fprintf(stderr, "bad arguments\n");
        return 2;
    }
    const char *buffered = getenv("TV_BENCH_BUFFERED");
    unsigned flags = TV__DEV_O_RDONLY;
    if (buffered && *buffered == '1')
        flags |= TV__DEV_O_NODIRECT;
    if (tv__dev_open(argv[1], flags, &d, &err)) {
        fprintf(stderr, "%s: %s\n", argv[1], err.msg);
        return 1;
    }
    len = tv__align_down_u64(d->size_bytes < max ? d->size_bytes : max, d->io_align);
    chunk = (size_t)((chunk + d->io_align - 1) / d->io_align * d->io_align);
    for (int i = 0; i < N_DEST; i++)
        if (!(dest[i] = tv__dev_alloc_aligned(d, chunk + d->io_align))) {
            fprintf(stderr, "out of memory\n");
            goto out;
        }
    printf("file %s: %.1f MiB read, %s, io_align %u, chunk %zu KiB, best of %d\n", argv[1],
           (double)len / (1 << 20), d->direct ? "O_DIRECT" : "buffered (page cache!)", d->io_align,
           chunk >> 10, repeats);
    double base = 0, res[2][2][5];
    int used[2][2][5];
    static const uint32_t qds[] = {1, 4, 16, 32, 64};
    static const int engines[] = {TV_ENGINE_URING, TV_ENGINE_PREAD};
    for (int rep = 0; rep < repeats; rep++) {
        double b = baseline(d, len, chunk, dest);
        if (b > base)
            base = b;
    }
    for (size_t e = 0; e < 2; e++)
        for (int mis = 0; mis <= 1; mis++)
            for (size_t q = 0; q < 5; q++)
                res[e][mis][q] = mis && qds[q] != 32
                                     ? -2
                                     : run_engine(d, engines[e], qds[q], chunk, len, dest,
                                                  (size_t)mis, repeats, &used[e][mis][q]);
    for (int rep = 0; rep < repeats; rep++) {
        double b = baseline(d, len, chunk, dest);
        if (b > base)
            base = b;
    }
    printf("%-8s %-7s %5s %8s %8s\n", "engine", "dest", "qd", "GB/s", "x base");
    printf("%-8s %-7s %5d %8.2f %8.2f\n", "baseline", "direct", 1, base, 1.0);
    for (size_t e = 0; e < 2; e++)
        for (int mis = 0; mis <= 1; mis++)
            for (size_t q = 0; q < 5; q++) {
                double g = res[e][mis][q];
                const char *name = engines[e] == TV_ENGINE_URING ? "io_uring" : "pread";
                if (g == -2)
                    continue;
                if (g < 0) {
                    printf("%-8s %-7s %5u %8s\n", name, mis ? "staged" : "direct", qds[q], "n/a");
                    continue;
                }
                if (used[e][mis][q] != engines[e])
                    name = "pread(fallback)";
                printf("%-8s %-7s %5u %8.2f %8.2f\n", name, mis ? "staged" : "direct", qds[q], g,
                       base > 0 ? g / base : 0);
            }
    rc = 0;
out:
    for (int i = 0; i < N_DEST; i++)
        free(dest[i]);
    tv__dev_close(d);
    return rc;
}
