/* CUDA destination: staged chunks are copied to device memory with
 * cudaMemcpyAsync on the caller's stream; one event per staging slot fences
 * its reuse, so device reads overlap host-to-device copies. See xfer.h. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

#include <cuda_runtime_api.h>

#include "xfer/xfer.h"

struct tv__cuda_sink {
    cudaStream_t stream;
    uint32_t n_slots;
    cudaEvent_t *ev;
    bool *armed;
    cudaError_t first_error;
    void *staging; /* pinned, owned by the caller */
    size_t staging_len;
};

static int cuda_fail(tv_error *err, cudaError_t e, const char *what)
{
    return tv__seterr(err, -EIO, "%s: %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e));
}

bool tv__cuda_available(void)
{
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

int tv__cuda_sink_create(void *stream, uint32_t n_slots, tv__cuda_sink **out, tv_error *err)
{
    *out = NULL;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        cudaGetLastError(); /* clear the sticky "no device" error */
        return tv__seterr(err, TV_E_NOT_SUPPORTED, "no usable CUDA device (%s)",
                          e == cudaSuccess ? "0 devices" : cudaGetErrorName(e));
    }
    tv__cuda_sink *s = calloc(1, sizeof(*s));
    if (!s)
        return tv__seterr(err, -ENOMEM, "out of memory");
    s->stream = (cudaStream_t)stream;
    s->n_slots = n_slots ? n_slots : 1;
    s->ev = calloc(s->n_slots, sizeof(*s->ev));
    s->armed = calloc(s->n_slots, sizeof(*s->armed));
    if (!s->ev || !s->armed) {
        tv__cuda_sink_destroy(s);
        return tv__seterr(err, -ENOMEM, "out of memory");
    }
    for (uint32_t i = 0; i < s->n_slots; i++) {
        if ((e = cudaEventCreateWithFlags(&s->ev[i], cudaEventDisableTiming)) != cudaSuccess) {
            s->n_slots = i;
            tv__cuda_sink_destroy(s);
            return cuda_fail(err, e, "cudaEventCreate");
        }
    }
    *out = s;
    return 0;
}

void tv__cuda_sink_destroy(tv__cuda_sink *s)
{
    if (!s)
        return;
    for (uint32_t i = 0; s->ev && i < s->n_slots; i++)
        cudaEventDestroy(s->ev[i]);
    free(s->ev);
    free(s->armed);
    free(s);
}

static int sink_copy(void *ctx, void *dest, uint64_t dest_off, const void *src, size_t n,
                     uint32_t slot)
{
    tv__cuda_sink *s = ctx;
    cudaError_t e =
        cudaMemcpyAsync((char *)dest + dest_off, src, n, cudaMemcpyHostToDevice, s->stream);
    if (e == cudaSuccess && slot < s->n_slots) {
        e = cudaEventRecord(s->ev[slot], s->stream);
        s->armed[slot] = e == cudaSuccess;
    }
    if (e != cudaSuccess) {
        if (s->first_error == cudaSuccess)
            s->first_error = e;
        return -EIO;
    }
    return 0;
}

static int sink_wait_slot(void *ctx, uint32_t slot)
{
    tv__cuda_sink *s = ctx;
    if (slot >= s->n_slots || !s->armed[slot])
        return 0;
    cudaError_t e = cudaEventSynchronize(s->ev[slot]);
    s->armed[slot] = false;
    if (e != cudaSuccess) {
        if (s->first_error == cudaSuccess)
            s->first_error = e;
        return -EIO;
    }
    return 0;
}

static int sink_finish(void *ctx)
{
    tv__cuda_sink *s = ctx;
    cudaError_t e = cudaStreamSynchronize(s->stream);
    for (uint32_t i = 0; i < s->n_slots; i++)
        s->armed[i] = false;
    if (e != cudaSuccess && s->first_error == cudaSuccess)
        s->first_error = e;
    return s->first_error == cudaSuccess ? 0 : -EIO;
}

static void *sink_alloc_staging(void *ctx, size_t len, size_t align)
{
    tv__cuda_sink *s = ctx;
    if (!s->staging || len > s->staging_len || (uintptr_t)s->staging % align)
        return NULL; /* the engine falls back to its own (pageable) staging */
    return s->staging;
}

void tv__cuda_sink_bind(tv__cuda_sink *s, tv__io_sink *out)
{
    *out = (tv__io_sink){
        .ctx = s,
        .copy = sink_copy,
        .wait_slot = sink_wait_slot,
        .finish = sink_finish,
        .alloc_staging = sink_alloc_staging,
        .free_staging = NULL, /* the staging outlives the batch */
    };
}

void tv__cuda_sink_set_staging(tv__cuda_sink *s, void *p, size_t len)
{
    s->staging = p;
    s->staging_len = len;
}

int tv__cuda_host_alloc(size_t len, void **out, tv_error *err)
{
    *out = NULL;
    cudaError_t e = cudaHostAlloc(out, len, cudaHostAllocPortable);
    if (e != cudaSuccess) {
        cudaGetLastError();
        *out = NULL;
        return cuda_fail(err, e, "cudaHostAlloc");
    }
    return 0;
}

void tv__cuda_host_free(void *p)
{
    if (p && cudaFreeHost(p) != cudaSuccess)
        cudaGetLastError();
}

int tv__cuda_pin(void *p, size_t len, tv_error *err)
{
    cudaError_t e = cudaHostRegister(p, len, cudaHostRegisterDefault);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return cuda_fail(err, e, "cudaHostRegister");
    }
    return 0;
}

int tv__cuda_pin_readonly(void *p, size_t len, tv_error *err)
{
    int dev = 0, ok = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&ok, cudaDevAttrHostRegisterReadOnlySupported, dev) != cudaSuccess) {
        cudaGetLastError();
        ok = 0;
    }
    if (!ok)
        return tv__seterr(
            err, TV_E_NOT_SUPPORTED,
            "this GPU cannot register read-only host memory (cudaDevAttrHostRegisterReadOnlySupported)");
    cudaError_t e = cudaHostRegister(p, len, cudaHostRegisterReadOnly);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return cuda_fail(err, e, "cudaHostRegister(cudaHostRegisterReadOnly)");
    }
    return 0;
}

void tv__cuda_unpin(void *p)
{
    if (p && cudaHostUnregister(p) != cudaSuccess)
        cudaGetLastError();
}

int tv__cuda_check_dest(const void *ptr, size_t len, tv_error *err)
{
    struct cudaPointerAttributes a;
    if (!ptr)
        return tv__seterr(err, TV_E_INVALID_ARG, "NULL device pointer");
    cudaError_t e = cudaPointerGetAttributes(&a, ptr);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return cuda_fail(err, e, "cudaPointerGetAttributes");
    }
    if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged)
        return tv__seterr(err, TV_E_INVALID_ARG,
                          "destination %p (%zu bytes) is not CUDA device memory", ptr, len);
    return 0;
}
