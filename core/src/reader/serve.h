/* What the fast-path server (server/fastpath) needs of an open model beyond
 * the public reader API: the validated snapshot view and image, and each
 * device's read descriptor as validated at open (excluded devices are
 * reported, never to be read). The server plans its own chunk reads on the
 * shards' objects (snap/snapshot.h gives the replicas) and runs them on
 * io/aio.h; the model keeps the devices open and the lease held until
 * tv_model_close.
 *
 * Invariants: the pointers returned stay valid until tv_model_close; the
 * image is exactly the bytes the snapshot checksum covers. */
#ifndef TV_READER_SERVE_H
#define TV_READER_SERVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "snap/snapshot.h"
#include "tensorvault/tensorvault.h"

typedef struct tv__model_dev {
    int fd;              /* O_RDONLY (| O_DIRECT when direct); -1 when excluded */
    uint32_t io_align;   /* power of two, multiple of 4096 */
    uint64_t size_bytes; /* reads never pass it */
    bool direct;
    int reason; /* 0 usable; else why excluded (as tv_model_device) */
} tv__model_dev;

/* The validated snapshot view of the open generation (NULL for NULL). */
const tv__snap *tv__model_snap(const tv_model *m);
/* The snapshot image: *buf and *len exactly as validated (the memfd's contents).
 * Returns 0 or TV_E_INVALID_ARG. */
int tv__model_snap_image(const tv_model *m, const void **buf, size_t *len);
/* Device i (snapshot index). Returns 0 or TV_E_INVALID_ARG (NULL, i out of
 * range). */
int tv__model_dev_info(const tv_model *m, uint32_t i, tv__model_dev *out);

#endif
