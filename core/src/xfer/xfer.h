/* Destinations of the read engine: host memory (plain memcpy, the engine's
 * default) and CUDA device memory (a sink that copies each staged chunk with
 * cudaMemcpyAsync on the caller's stream and fences a staging slot before
 * it is reused). xfer_cuda.c is built when CUDA is found, else
 * xfer_cuda_stub.c, whose functions return TV_E_NOT_SUPPORTED.
 *
 * Invariant: a CUDA sink never lets the engine overwrite a staging slot
 * whose copy has not completed (one event per slot), and finish() returns
 * only when every byte is on the GPU. */
#ifndef TV_XFER_XFER_H
#define TV_XFER_XFER_H

#include <stdbool.h>
#include <stddef.h>

#include "io/engine.h"

typedef struct tv__cuda_sink tv__cuda_sink;

/* True when CUDA is compiled in and cudaGetDeviceCount reports a device. */
bool tv__cuda_available(void);

/* Creates a sink for stream (a cudaStream_t; NULL = default stream) with
 * n_slots fences. Returns 0; TV_E_NOT_SUPPORTED (no CUDA build or no GPU);
 * -EIO with the CUDA error named in err. */
int tv__cuda_sink_create(void *stream, uint32_t n_slots, tv__cuda_sink **out, tv_error *err);
void tv__cuda_sink_destroy(tv__cuda_sink *s);
/* Fills an engine sink backed by s. */
void tv__cuda_sink_bind(tv__cuda_sink *s, tv__io_sink *out);
/* Pins (cudaHostRegister) host memory that will be used as staging so
 * cudaMemcpyAsync from it is truly asynchronous. Returns 0 or an error;
 * failures are not fatal for correctness (copies stay correct, slower). */
int tv__cuda_pin(void *p, size_t len, tv_error *err);
/* The same for a read-only mapping (the fast-path arena: PROT_READ, shared),
 * with cudaHostRegisterReadOnly, which CUDA requires for memory the process
 * may not write; TV_E_NOT_SUPPORTED where the GPU lacks it
 * (cudaDevAttrHostRegisterReadOnlySupported). */
int tv__cuda_pin_readonly(void *p, size_t len, tv_error *err);
void tv__cuda_unpin(void *p);
/* Pinned host memory (cudaHostAlloc) for the staging ring, so that
 * cudaMemcpyAsync from it is truly asynchronous. Returns 0 or an error. */
int tv__cuda_host_alloc(size_t len, void **out, tv_error *err);
void tv__cuda_host_free(void *p);
/* Offers p (len bytes, pinned) to the engine as this sink's staging. */
void tv__cuda_sink_set_staging(tv__cuda_sink *s, void *p, size_t len);
/* Checks that ptr is device memory with at least len bytes reachable.
 * Returns 0, TV_E_INVALID_ARG, or TV_E_NOT_SUPPORTED. */
int tv__cuda_check_dest(const void *ptr, size_t len, tv_error *err);

#endif
