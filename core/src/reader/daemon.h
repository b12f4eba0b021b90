/* Internals of the daemon backend of tv_model: the fast-path session
 * (tv_client, reader/session.c: the connection, its failure rule, sending
 * and receiving), the model opened in it (reader/daemon.c: its handle,
 * snapshot and arena mappings, its reads) and the per-request bookkeeping
 * that keeps a hostile daemon from writing outside a destination or
 * reporting an incomplete one ready.
 *
 * Invariants: a session (tv_client) is either live (sock >= 0) or dead
 * (sock -1, dead_code and dead_msg say why): a dead session sends and
 * receives nothing. Every model opened in a session is on its list until
 * it is closed; tv_client_close detaches them (c NULL: their reads fail
 * with TV_E_DISCONNECTED), and a model keeps its snapshot and arena
 * mappings until tv_model_close, so descriptors handed out (tensor names,
 * shapes) stay valid after the session died or was closed. A request's
 * delivered ranges (spans) are disjoint, sorted and inside [0, len): a
 * chunk overlapping one of them, or reaching past len, is refused before a
 * byte of it is copied. A model's handle at the daemon and its arena
 * mapping belong to its hold, which the views taken of it share: a model
 * closed while views of it live leaves its hold on the session's orphan
 * list (the handle stays open, its pins with it) until the last view is
 * released, so a view's bytes stay mapped and pinned for as long as the
 * view lives (or, once the session is gone, mapped). */
#ifndef TV_READER_DAEMON_H
#define TV_READER_DAEMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "reader/model.h"
#include "tensorvault/client.h"
#include "util/internal.h"
#include "wire/wire.h"

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

/* printf precision for the text of a daemon's message (OPEN's spec,
 * ERROR's text): at most 400 bytes of it, so that it fits a tv_error with
 * the words around it. */
#define TV__FPC_TEXT_PREC(m) ((int)((m)->text_len > 400 ? 400 : (m)->text_len))

typedef struct tv__fpc_model tv__fpc_model;
typedef struct tv__fpc_hold tv__fpc_hold;

/* A handle at the daemon and the arena mapping it lends from: the model's,
 * and its views' (they may outlive the model). */
struct tv__fpc_hold {
    tv_client *c; /* NULL once the session was closed */
    uint32_t handle;
    const uint8_t *arena;
    size_t arena_len;
    int tier_fd;        /* the tier's memfd (a version-3 handle), else -1: private view maps */
    size_t page_len;    /* its pages' length (st_blksize: 4096, or a hugetlb page's) */
    bool pinned;        /* cudaHostRegister'ed */
    uint32_t n_views;   /* live views */
    bool model_closed;  /* the model is gone: the last view closes the handle */
    tv__fpc_hold *next; /* on the session's orphan list once model_closed */
};

/* A model opened in a session (ops: the daemon backend). */
struct tv__fpc_model {
    tv_model m;   /* first: a tv_model * of the daemon backend is a tv__fpc_model * */
    tv_client *c; /* NULL once the session was closed */
    tv__fpc_model *next;
    tv__fpc_hold *hold;
    uint32_t handle;
    void *snap_map;
    size_t snap_len;
    const uint8_t *arena; /* = hold->arena */
    size_t arena_len;
    uint32_t slot_len, n_slots, credit;
    bool tier; /* the arena is the daemon's memory tier (version 3, OPENED TIER flag):
                  a request's bytes are contiguous there, so it can be viewed */
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
    tv__fpc_model *models; /* open in this session */
    tv__fpc_hold *orphans; /* holds of closed models whose views live */
    uint8_t rbuf[TV__FP_MAX_MSG];
    uint8_t sbuf[TV__FP_MAX_MSG];
    /* a read's scratch, here so that a small read allocates nothing */
    uint32_t rel[TV__FP_MAX_RELEASE];       /* slots to RELEASE */
    tv__fp_read_ent ents[TV__FP_MAX_READS]; /* the next READ's entries */
};

/* ---- the session's primitives (reader/session.c) ---- */

/* Closes the session for good: err gets code and the message, and every
 * later call answers TV_E_DISCONNECTED naming it. Returns code. */
int tv__fpc_fail(tv_client *c, tv_error *err, int code, const char *fmt, ...) TV_PRINTF(4, 5);
/* Checks a descriptor the daemon sent: a regular file of exactly len bytes
 * carrying every seal of want; or, when tier, a file of the daemon's
 * cache.dir, which cannot carry seals: unnamed (no link), with no write
 * permission, on a tmpfs. what names it in the message. Returns 0 or
 * TV_E_PROTOCOL (the message says which rule failed). */
int tv__fpc_check_memfd(int fd, uint64_t len, int want, bool tier, const char *what, tv_error *err);
/* TV_E_DISCONNECTED naming why the (dead) session closed. */
int tv__fpc_dead(const tv_client *c, tv_error *err);
/* A fatal ERROR the daemon sent: closes the session with its code and text. */
int tv__fpc_fatal(tv_client *c, const tv__fp_msg *m, tv_error *err);
/* m arrived when something else was expected (`when` says what): a fatal
 * ERROR closes the session with its code, anything else with
 * TV_E_PROTOCOL. */
int tv__fpc_unexpected(tv_client *c, const tv__fp_msg *m, const char *when, tv_error *err);
/* Closes the descriptors of fds[0, n) that are open (-1 afterwards). */
void tv__fpc_close_fds(int *fds, size_t n);
/* Waits until the socket is ready for events (POLLIN / POLLOUT).
 * TV_E_TIMEOUT closes the session. */
int tv__fpc_wait(tv_client *c, short events, tv_error *err);
/* Sends one message; wait: block (poll, timeout) while the socket is full,
 * else return -EAGAIN then (nothing sent). A failed send closes the session
 * (with the fatal ERROR the daemon queued before closing, when there is one). */
int tv__fpc_send(tv_client *c, const void *buf, size_t len, bool wait, tv_error *err);
/* Receives and decodes one message into c->rbuf / *m, keeping up to max_fds
 * descriptors (*n_fds; the caller closes them). wait: block (poll with the
 * timeout) until one arrives; else return 1 when none is there. A bad
 * message, EOF or a receive error closes the session. */
int tv__fpc_recv(tv_client *c, tv__fp_msg *m, int *fds, size_t max_fds, size_t *n_fds, bool wait,
                 tv_error *err);
/* Detaches every model of c (tv_client_close): their reads fail with
 * TV_E_DISCONNECTED from now on (reader/daemon.c). */
void tv__fpc_detach_models(tv_client *c);

#endif
