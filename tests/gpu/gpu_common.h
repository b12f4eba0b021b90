/* What the GPU check tools (gpu_read.c: the in-process reader; gpu_client.c:
 * the fast-path client) share: the guard pattern, CUDA and library error
 * reports, byte comparison, and the check of a device destination read back
 * with its guard bytes. Each tool defines GPU_TOOL (its name, for messages)
 * before including this file. */
#ifndef TV_TESTS_GPU_COMMON_H
#define TV_TESTS_GPU_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "tensorvault/errors.h"

#define GUARD     4096 /* bytes of PAT either side of every destination */
#define PAT       0xA5
#define EXIT_SKIP 77

#define CU(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, GPU_TOOL ": %s: %s (%s)\n", #call, cudaGetErrorName(e_),               \
                    cudaGetErrorString(e_));                                                       \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static size_t g_mismatch; /* mismatches reported (the first 20 are printed) */

static inline double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline void mismatch(const char *what, const char *name, size_t at)
{
    if (g_mismatch++ < 20)
        fprintf(stderr, GPU_TOOL ": MISMATCH %s '%s' at byte %zu\n", what, name, at);
}

/* The first index where a and b differ, n when they are equal. */
static inline size_t first_diff(const uint8_t *a, const uint8_t *b, size_t n)
{
    if (!memcmp(a, b, n)) /* the common case, at memcmp speed (GB arenas) */
        return n;
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i])
            return i;
    return n;
}

static inline int fail_tv(const char *what, const char *name, int rc, const tv_error *err)
{
    fprintf(stderr, GPU_TOOL ": %s '%s': %s: %s\n", what, name, tv_err_name(rc), err->msg);
    return 1;
}

static inline void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, GPU_TOOL ": out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

/* back: a device buffer of len + 2 x GUARD + 1 bytes copied back to the
 * host, the destination at GUARD + 1 (odd), PAT around it. Reports a
 * payload that differs from want (what names the call) and the first
 * changed guard byte on either side. */
static inline void check_guarded(const uint8_t *back, const uint8_t *want, size_t len,
                                 const char *name, const char *what)
{
    size_t total = len + 2 * GUARD + 1, at = first_diff(back + GUARD + 1, want, len);
    char msg[128];
    if (at < len) {
        snprintf(msg, sizeof msg, "payload (%s)", what);
        mismatch(msg, name, at);
    }
    for (size_t k = 0; k < GUARD + 1; k++)
        if (back[k] != PAT) {
            mismatch("guard byte before the device destination", name, k);
            break;
        }
    for (size_t k = GUARD + 1 + len; k < total; k++)
        if (back[k] != PAT) {
            mismatch("guard byte after the device destination", name, k);
            break;
        }
}

#endif
