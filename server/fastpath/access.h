/* Who may read which model: the [access] rules of the daemon's
 * configuration (deploy/tensorvaultd.ini), one policy that every route
 * applies: the fast path checks the peer's credentials (SO_PEERCRED uid and
 * gid, SO_PEERGROUPS) per OPEN and, at connect, whether the peer passes any
 * list at all (a peer that may open nothing gets no session); HTTP checks
 * the peer it identified (http/peer.h: a local user by uid, a token by
 * name, or nobody) on every route that shows a model's bytes or metadata
 * (docs/security.md).
 *
 * A rule list is space or comma separated words: uid:N, gid:N, user:NAME,
 * group:NAME (resolved to their ids when parsed: a name this system does
 * not know is refused), * (any local user), token:NAME (an HTTP read token
 * of that name), token:* (any read token) and anonymous (an HTTP request
 * with no identity at all: no token, not a local user); an empty list
 * allows nobody. The default list applies to every model without a list of
 * its own. Admin tokens are not subject to the rules (they may change
 * everything anyway); fleet tokens read content-addressed blobs only.
 *
 * Invariants: a tv__fp_access is immutable once built (any thread may check
 * against it); a local peer is allowed when its uid matches a uid rule, or
 * one of its gids (the primary one first, then the supplementary groups)
 * matches a gid rule, or the list has *; a token peer when the list names
 * it or has token:*; an anonymous peer only when the list has anonymous;
 * the refusal names the peer, the model and the list as written
 * (normalized to single spaces). */
#ifndef TV_FASTPATH_ACCESS_H
#define TV_FASTPATH_ACCESS_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "util/internal.h"

#define TV__FP_ACCESS_MAX_TEXT 1024 /* bytes of one rule list, NUL included */

typedef struct tv__fp_access tv__fp_access;

/* Checks one rule list's syntax (and that its user and group names exist).
 * Returns 0; TV_E_INVALID_ARG naming the word and what is expected; -ENOMEM. */
int tv__fp_access_validate(const char *rules, tv_error *err);

/* Builds the rules: dflt for every model (NULL = "uid:<getuid()>
 * gid:<getgid()> token:*": the daemon's own user and group, and read
 * tokens), then n model lists (models[i] ->
 * rules[i]; a model named twice keeps the last). Returns 0 and *out;
 * TV_E_INVALID_ARG (a bad list: the message names the model and the word);
 * -ENOMEM. */
int tv__fp_access_create(const char *dflt, const char *const *models, const char *const *rules,
                         size_t n, tv__fp_access **out, tv_error *err);
/* NULL-safe. */
void tv__fp_access_free(tv__fp_access *a);

/* Whether the peer (uid; gids[0] its primary gid, then its supplementary
 * groups; n may be 0) may open model. Returns 0; TV_E_PEER_DENIED "uid 65534
 * (gid 65534) may not open model 'demo' (allowed: uid:0 gid:0)";
 * TV_E_INVALID_ARG for a NULL a or model. */
int tv__fp_access_check(const tv__fp_access *a, const char *model, uid_t uid, const gid_t *gids,
                        size_t n, tv_error *err);

/* A peer as the access rules see it. local: uid and gids are known (the
 * fast path, HTTP over its UNIX socket, a loopback TCP client identified
 * by the kernel's socket table); token: the name of the read token the
 * request carries (HTTP), else NULL. Neither: anonymous. */
typedef struct tv__access_peer {
    bool local;
    uid_t uid;
    const gid_t *gids; /* primary gid first; n_gids may be 0 */
    size_t n_gids;
    const char *token;
} tv__access_peer;

/* Whether peer p may read model (any route). Returns 0; TV_E_PEER_DENIED
 * naming the peer, the model and the list ("uid 65534 (gid 65534) may not
 * read model 'demo' (allowed: uid:0 gid:0)"); TV_E_INVALID_ARG for NULL
 * arguments. */
int tv__access_check_peer(const tv__fp_access *a, const char *model, const tv__access_peer *p,
                          tv_error *err);

/* The normalized rule list that applies to model (the default when it has
 * none); NULL for NULL arguments. Valid until tv__fp_access_free. */
const char *tv__fp_access_rules(const tv__fp_access *a, const char *model);

/* Whether the peer (as for tv__fp_access_check) passes some list: the
 * default or any model's, i.e. may open at least one model. Returns 0;
 * TV_E_PEER_DENIED "uid 65534 (gid 65534) may open no model on this daemon
 * (no [access] rule list allows it)"; TV_E_INVALID_ARG for a NULL a. */
int tv__fp_access_any(const tv__fp_access *a, uid_t uid, const gid_t *gids, size_t n,
                      tv_error *err);

#endif
