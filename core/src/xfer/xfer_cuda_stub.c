/* CUDA destination stub for builds without the CUDA toolkit: every entry
 * point reports TV_E_NOT_SUPPORTED. */
#include "xfer/xfer.h"

bool tv__cuda_available(void)
{
    return false;
}

int tv__cuda_sink_create(void *stream, uint32_t n_slots, tv__cuda_sink **out, tv_error *err)
{
    (void)stream;
    (void)n_slots;
    *out = NULL;
    return tv__seterr(err, TV_E_NOT_SUPPORTED, "this build has no CUDA support");
}

void tv__cuda_sink_destroy(tv__cuda_sink *s)
{
    (void)s;
}

void tv__cuda_sink_bind(tv__cuda_sink *s, tv__io_sink *out)
{
    (void)s;
    (void)out;
}

int tv__cuda_pin(void *p, size_t len, tv_error *err)
{
    (void)p;
    (void)len;
    return tv__seterr(err, TV_E_NOT_SUPPORTED, "this build has no CUDA support");
}

int tv__cuda_pin_readonly(void *p, size_t len, tv_error *err)
{
    (void)p;
    (void)len;
    return tv__seterr(err, TV_E_NOT_SUPPORTED, "this build has no CUDA support");
}

void tv__cuda_unpin(void *p)
{
    (void)p;
}

int tv__cuda_check_dest(const void *ptr, size_t len, tv_error *err)
{
    (void)ptr;
    (void)len;
    return tv__seterr(err, TV_E_NOT_SUPPORTED, "this build has no CUDA support");
}

int tv__cuda_host_alloc(size_t len, void **out, tv_error *err)
{
    (void)len;
    *out = NULL;
    return tv__seterr(err, TV_E_NOT_SUPPORTED, "this build has no CUDA support");
}

void tv__cuda_host_free(void *p)
{
    (void)p;
}

void tv__cuda_sink_set_staging(tv__cuda_sink *s, void *p, size_t len)
{
    (void)s;
    (void)p;
    (void)len;
}
