/* The names the daemon answers to over TCP (http.allowed_hosts): a Host
 * header, or an Origin's authority, is one of them or the request is
 * refused (DNS rebinding: a page of another site whose name resolves to
 * this host sends that name).
 *
 * A rule NAME matches NAME and NAME:<the listen port>; NAME:PORT that port
 * only; [IPV6] and [IPV6]:PORT the same way; * anything. Names compare
 * case-insensitively. The default list (no allowed_hosts): localhost,
 * 127.0.0.1, [::1], the listen host and the extra names; with a wildcard
 * listen address (0.0.0.0, [::]) also any IP literal, which a rebinding
 * page never sends (it sends its own DNS name).
 *
 * Invariants: a value is matched as bytes, never trusted: anything that is
 * not NAME[:PORT] with printable name bytes (no '/', '@', space) and a
 * decimal port from 1 to 65535 without leading zeros matches nothing. */
#ifndef TV_HTTP_HOSTS_H
#define TV_HTTP_HOSTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tensorvault/errors.h"

#define TV__HTTP_MAX_HOSTS 32

typedef struct tv__http_hosts tv__http_hosts;

/* The list: allowed (','-separated rules; NULL or "" = the default list
 * built from listen "HOST:PORT" and extra, ','-separated names). Returns 0
 * and *out; TV_E_INVALID_ARG naming a malformed rule or more than
 * TV__HTTP_MAX_HOSTS; -ENOMEM. */
int tv__http_hosts_make(const char *allowed, const char *listen, const char *extra,
                        tv__http_hosts **out, tv_error *err);
/* NULL-safe. */
void tv__http_hosts_free(tv__http_hosts *h);

/* Whether value[0, len) (a Host header, an Origin's authority) names this
 * daemon listening on port. */
bool tv__http_host_allowed(const tv__http_hosts *h, const char *value, size_t len, uint16_t port);

#endif
