/* The inside of a tv_model (tensorvault.h): a common part that every read
 * function of the public API works on, and a table of operations, one per
 * backend, that moves the bytes (in the spirit of SQLite's
 * sqlite3_io_methods). Two backends:
 *   the store  (reader/store.c):  opened in-process from a store directory
 *                                 (or a snapshot image): its devices are
 *                                 validated and read with the engine
 *                                 (io/engine.h);
 *   the daemon (reader/daemon.c): opened in a fast-path session
 *                                 (reader/session.c): tensorvaultd reads,
 *                                 the bytes are copied from the arena it
 *                                 shares (wire/wire.h).
 * The common layer (reader/model.c) does everything that does not depend on
 * where the bytes come from: name lookup, tensor descriptors decoded on
 * first use, every argument check of every read, the rows and range
 * arithmetic, the float32 conversion, the tv_get_tensor arena, batch
 * validation and results, the CUDA destination checks. A backend sees only
 * requests that passed those checks.
 *
 * Invariants: a backend's model struct starts with a tv_model (so a
 * tv_model * is the backend's struct, and m->ops says which); m->snap is the
 * validated snapshot view and stays valid (with every pointer into it)
 * until tv_model_close; a request reaches ops->read or ops->read_one only
 * after the common checks, so it is inside its tensor (or its shard's
 * header) and its destination holds len bytes; an error a backend returns
 * reaches the caller unchanged (code and message). */
#ifndef TV_READER_MODEL_H
#define TV_READER_MODEL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "io/engine.h"
#include "reader/desc.h"
#include "snap/snapshot.h"
#include "tensorvault/tensorvault.h"
#include "xfer/xfer.h"

/* What a request reads (tv__mreq.flags). SHARD_HEADER: index is a shard,
 * and [off, off + len) lies in its file's first 8 + header_len bytes.
 * ENVELOPE (tv_get_tensor): dest is an arena aligned to
 * tv_model.arena_align with room for the read's envelope on either side;
 * a backend with arena_envelope reads the aligned envelope into it and
 * sets skip, the others read the payload at dest. */
#define TV__MREQ_SHARD_HEADER 0x1u
#define TV__MREQ_ENVELOPE     0x2u

/* One checked request: bytes [off, off + len) of tensor `index` (t its
 * record), or of shard `index`'s header, into dest. */
typedef struct tv__mreq {
    uint32_t index;
    uint32_t flags;
    const tv__tdesc *t; /* NULL for a shard header */
    uint64_t off, len;
    void *dest; /* len bytes: host memory, or a device pointer for a CUDA sink */
    /* out */
    uint64_t skip; /* TV__MREQ_ENVELOPE: where the payload starts in dest (else 0) */
    int result;    /* 0 (every byte arrived) or the request's error */
} tv__mreq;

/* The operations of a backend. Every function gets a model of its own
 * backend; every request passed the common checks. */
typedef struct tv__model_ops {
    /* Whether r can be read at all, asked for each request of a batch
     * before anything is read (so that a batch's first failure is its
     * lowest failed request): the store's TV_E_NO_REPLICA. NULL: always. */
    int (*check)(const tv_model *m, const tv__mreq *r, tv_error *err);
    /* Reads one request into host memory (tv_read_into, tv_read_range,
     * tv_read_rows, tv_read_f32, tv_get_tensor, tv_read_shard_header).
     * Returns 0, or its error with a message naming what it reads. */
    int (*read_one)(tv_model *m, tv__mreq *r, tv_error *err);
    /* Reads n requests (n >= 1) through sink (NULL: host memcpy): each
     * r[j].result gets its own. Returns 0 when all succeeded, else an error
     * whose message err names (the common layer keeps a batch's first). */
    int (*read)(tv_model *m, tv__mreq *r, size_t n, const tv__io_sink *sink, tv_error *err);
    /* A CUDA sink for stream, with the backend's fences and staging.
     * Returns 0; TV_E_NOT_SUPPORTED (no CUDA or no GPU); -EIO. */
    int (*cuda_sink)(tv_model *m, void *stream, tv__cuda_sink **out, tv_error *err);
    /* The devices this process opened for the model (tv_model_device):
     * their number (only the excluded ones when `excluded`) and device i.
     * NULL: none (a daemon model: tensorvaultd holds the devices). */
    size_t (*n_devices)(const tv_model *m, bool excluded);
    int (*device)(const tv_model *m, size_t i, tv_device_status *out);
    /* Releases what the backend holds (its devices or its daemon handle,
     * mappings, buffers); tv_model_close calls it first, then frees the
     * common part and the handle (one calloc'd block of the backend's
     * struct). Must accept a model whose open failed half-way. */
    void (*close)(tv_model *m);
} tv__model_ops;

/* A tensor's record, decoded and validated on first use (not at open, so
 * opening a generation costs the same for 100 or 120,000 tensors): `ready`
 * is set (release) after the fields are written, under the model's plan
 * lock; readers check it (acquire) first, so concurrent metadata calls on
 * one handle are safe. */
typedef struct tv__tplan {
    tv__tdesc d;
    _Atomic bool ready;
} tv__tplan;

struct tv_model {
    const tv__model_ops *ops;
    tv__snap snap; /* validated by the backend before tv__model_init */
    char *name;    /* the snapshot's model name */
    tv__tplan *t;  /* snap.n_tensors, each decoded on first use */
    pthread_mutex_t plan_mu;
    bool plan_mu_ok;
    bool any_owned_shape; /* some record has an owned_shape to free */
    /* tv_get_tensor's arena: aligned to arena_align (a power of two >=
     * sizeof(void *)); arena_envelope: the backend reads the aligned
     * envelope into it (room for it on either side of the payload). */
    uint32_t arena_align;
    bool arena_envelope;
};

/* Checks the read options before anything is opened or allocated (both
 * openings take the same tv_open_opts). Returns 0 or TV_E_INVALID_ARG
 * naming the value. */
int tv__model_check_opts(const tv_open_opts *o, tv_error *err);
/* Fills the common part of m once the backend set ops and a validated
 * snap: the name, the record table and its lock. Returns 0, -ENOMEM or
 * the lock's -errno (then tv_model_close frees what was made). */
int tv__model_init(tv_model *m, tv_error *err);
/* The record of tensor i, decoded on first use. Returns 0;
 * TV_E_INVALID_ARG (i out of range); the record's TV_E_SNAPSHOT; -ENOMEM. */
int tv__model_tensor(const tv_model *m, size_t i, const tv__tdesc **out, tv_error *err);

#endif
