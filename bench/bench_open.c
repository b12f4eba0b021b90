/* Time to first tensor: opens a generation (tv_model_open: the snapshot
 * file, its checks and name index, the devices) and reads one tensor with
 * tv_read_into, timing each step in this new process; run it after dropping
 * the page cache for the cold figure (find is not timed: tv_model_find is a
 * hash probe). Prints one JSON object:
 *   {"tensors": N, "open_ms": ..., "read_us": ..., "first_tensor_ms": ...,
 *    "reopen_ms": ...}
 * where first_tensor_ms = open + find + read (the caller's wait for its
 * first bytes) and reopen_ms is a second open of the same generation in the
 * same process (snapshot file in the page cache: the in-memory cost).
 *
 * With --drop-caches (root) it first opens and reads once (so the code it
 * runs is paged in and stays mapped), then syncs and drops the page cache,
 * then times: cold data (snapshot, pointer, label, tensor) with warm code,
 * as in a long-running server.
 *
 * --drop-pagecache drops file contents only (dentries and inodes stay).
 *
 * usage: bench_open [--drop-caches | --drop-pagecache] STORE SPEC [TENSOR]   (default: the first
 * tensor) TV_BENCH_ENGINE=pread uses the pread engine (default: auto). */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tensorvault/tensorvault.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int drop_caches(const char *what)
{
    sync();
    FILE *f = fopen("/proc/sys/vm/drop_caches", "w");
    if (!f)
        return -1;
    int rc = fputs(what, f) < 0;
    return fclose(f) || rc ? -1 : 0;
}

int main(int argc, char **argv)
{
    /* --drop-caches: page cache, dentries and inodes (3); --drop-pagecache:
     * file contents only (1), the path lookups stay cached */
    const char *what = NULL;
    if (argc > 1 && !strcmp(argv[1], "--drop-caches"))
        what = "3\n";
    else if (argc > 1 && !strcmp(argv[1], "--drop-pagecache"))
        what = "1\n";
    bool drop = what != NULL;
    if (drop) {
        argv++;
        argc--;
    }
    if (argc < 3 || argc > 4) {
        fprintf(stderr, "usage: bench_open STORE SPEC [TENSOR]\n");
        return 2;
    }
    tv_error err = {0};
    tv_open_opts oo = {0};
    const char *e = getenv("TV_BENCH_ENGINE");
    oo.engine = e && !strcmp(e, "pread") ? TV_ENGINE_PREAD : TV_ENGINE_AUTO;
    tv_model *m = NULL;
    tv_tensor_desc d;
    size_t idx = 0;
    if (drop) {
        char one[4096];
        if (tv_model_open(argv[1], argv[2], &oo, &m, &err) == 0) {
            tv_model_tensor(m, 0, &d);
            if (d.nbytes <= sizeof one) {
                char *nm = strndup(d.name, d.name_len);
                if (nm)
                    tv_read_into(m, nm, one, sizeof one, &err);
                free(nm);
            }
            tv_model_close(m);
            m = NULL;
        }
        if (drop_caches(what)) {
            fprintf(stderr, "bench_open: cannot drop the page cache (not root?)\n");
            return 77;
        }
    }
    double t0 = now();
    int rc = tv_model_open(argv[1], argv[2], &oo, &m, &err);
    double t1 = now();
    if (rc) {
        fprintf(stderr, "bench_open: %s\n", err.msg);
        return 1;
    }
    if (argc == 4 && tv_model_find(m, argv[3], strlen(argv[3]), &idx)) {
        fprintf(stderr, "bench_open: no tensor '%s'\n", argv[3]);
        return 1;
    }
    tv_model_tensor(m, idx, &d);
    char *name = strndup(d.name, d.name_len); /* names are not NUL-terminated */
    void *buf = malloc(d.nbytes ? d.nbytes : 1);
    if (!buf || !name)
        return 1;
    double t2 = now();
    rc = tv_read_into(m, name, buf, d.nbytes, &err);
    double t3 = now();
    if (rc) {
        fprintf(stderr, "bench_open: %s\n", err.msg);
        return 1;
    }
    size_t n = tv_model_n_tensors(m);
    tv_model *m2 = NULL;
    double t4 = now();
    rc = tv_model_open(argv[1], argv[2], &oo, &m2, &err);
    double t5 = now();
    if (rc) {
        fprintf(stderr, "bench_open: reopen: %s\n", err.msg);
        return 1;
    }
    printf(
        "{\"tensors\": %zu, \"tensor\": \"%s\", \"bytes\": %" PRIu64
        ", \"open_ms\": %.4f, \"read_us\": %.2f, \"first_tensor_ms\": %.4f, \"reopen_ms\": %.4f}\n",
        n, name, d.nbytes, (t1 - t0) * 1e3, (t3 - t2) * 1e6, (t3 - t0) * 1e3, (t5 - t4) * 1e3);
    tv_model_close(m2);
    tv_model_close(m);
    free(buf);
    free(name);
    return 0;
}
