/* Internals of the fast-path client (client.c): the session and model
 * structs and the per-request bookkeeping that keeps a hostile daemon from
 * writing outside a destination or reporting an incomplete one ready.
 *
 * Invariants: a session (tv_client) is either live (sock >= 0) or dead
 * (sock -1, dead_code and dead_msg say why): a dead session sends and
 * receives nothing; every model keeps its snapshot and arena mappings until
 * it is closed, so descriptors handed out (tensor names, shapes) stay valid
 * after the session died. A request's delivered ranges (spans) are disjoint,
 * sorted and inside [0, len): a chunk overlapping one of them, or reaching
 * past len, is refused before a byte of it is copied. */
#ifndef TV_CLIENT_CLIENT_INTERNAL_H
#define TV_CLIENT_CLIENT_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "wire/wire.h"
#include "reader/desc.h"
#include "snap/snapshot.h"
#include "tensorvault/client.h"

/* A delivered byte range [a, b) of one request. */
typedef struct tv__fpc_span {
    uint64_t a, b;
} tv__fpc_span;

/* The delivered ranges of one request: disjoint, sorted, adjacent ones
 * merged (in-order delivery keeps one span); inline storage for two. */
typedef struct tv__fpc_spans {
    uint32_t n, cap;
    tv__fpc_span *v; /* inl, or malloc'd when more than two */
    tv__fpc_span inl[2];
    uint64_t delivered; /* sum of the spans' lengths */
} tv__fpc_spans;

void tv__fpc_spans_init(tv__fpc_spans *s);
void tv__fpc_spans_free(tv__fpc_spans *s);
/* Adds [a, a + len) (len >= 1) when it overlaps no span and ends at or
 * before limit. Returns 0; TV_E_OVERFLOW (a + len overflows, or past
 * limit); TV_E_PROTOCOL (overlaps bytes already delivered); -ENOMEM. */
int tv__fpc_spans_add(tv__fpc_spans *s, uint64_t a, uint64_t len, uint64_t limit);

/* The highest protocol version tv_client_connect offers (test hook; default
 * TV__FP_VERSION_MAX, a value outside TV__FP_VERSION_MIN..MAX is that too):
 * a test sets TV__FP_V1 to act as a version-1 client. */
extern uint16_t tv__fpc_max_version;

/* A tensor record (reader/desc.h) decoded on first use. */
typedef struct tv__fpc_tensor {
    bool ready;
    tv__tdesc d;
} tv__fpc_tensor;

struct tv_client_model {
    tv_client *c; /* NULL once the session closed it */
    tv_client_model *next;
    uint32_t handle;
    int64_t generation;
    char *name;
    void *snap_map;
    size_t snap_len;
    tv__snap snap;
    tv__fpc_tensor *t; /* n_tensors, decoded on first use */
    const uint8_t *arena;
    size_t arena_len;
    uint32_t slot_len, n_slots, credit;
    bool pinned; /* cudaHostRegister'ed */
};

struct tv_client {
    int sock; /* -1 once dead */
    int dead_code;
    char dead_msg[512];
    char path[108];
    uint32_t timeout_ms;
    bool cuda_register;
    uint16_t version;
    uint32_t max_requests, max_handles, n_handles;
    uint64_t session_id;
    uint32_t next_open_id;
    uint64_t next_req_id;
    tv_client_model *models;
    uint8_t rbuf[TV__FP_MAX_MSG];
    uint8_t sbuf[TV__FP_MAX_MSG];
    /* a read's scratch, here so that a small read allocates nothing */
    uint32_t rel[TV__FP_MAX_RELEASE];       /* slots to RELEASE */
    tv__fp_read_ent ents[TV__FP_MAX_READS]; /* the next READ's entries */
};

#endif
