/* Fleet alias moves of the REST API, off its threads: one thread with a
 * catalog connection of its own (TV__CATALOG_BRIEF: connect, lock and
 * statement timeouts of a few seconds, no migration) runs the moves
 * PUT /v1/fleet/aliases queues, so no HTTP thread ever waits on
 * PostgreSQL.
 *
 * Invariants: at most TV__MOVER_QUEUE moves wait (more: TV_E_BUSY at once);
 * a move is claimed (claim(ctx)) before the catalog is touched, and one its
 * caller gave up on is skipped; every queued move gets exactly one done
 * (or is skipped after a failed claim), also at stop (TV_E_BUSY). */
#ifndef TV_FLEET_MOVER_H
#define TV_FLEET_MOVER_H

#include <stdbool.h>
#include <stdint.h>

#include "fleet/catalog.h"
#include "tensorvault/errors.h"

#define TV__MOVER_QUEUE 16

typedef struct tv__mover tv__mover;

typedef struct tv__mover_req {
    tv__catalog_alias_move move; /* copied by tv__mover_submit */
    /* On the mover's thread: claim when the move's turn comes (false: the
     * caller gave up, the move is skipped); done with its result. */
    bool (*claim)(void *ctx);
    void (*done)(void *ctx, int rc, int64_t new_version, const tv_error *err);
    void *ctx;
} tv__mover_req;

/* Starts the thread (it connects on the first move). Returns 0 and *out;
 * TV_E_INVALID_ARG (empty conninfo); -ENOMEM; -errno of pthread_create. */
int tv__mover_start(const char *conninfo, tv__mover **out, tv_error *err);

/* Queues a copy of r. Returns 0; TV_E_BUSY when TV__MOVER_QUEUE moves wait
 * (done is not called); TV_E_STATE when stopping; -ENOMEM. */
int tv__mover_submit(tv__mover *m, const tv__mover_req *r, tv_error *err);

/* Answers the moves still queued with TV_E_BUSY, joins the thread (at most
 * 5 s: one blocked in libpq on a frozen server is left to the process's
 * exit) and closes its connection. NULL-safe. */
void tv__mover_stop(tv__mover *m);

#endif
