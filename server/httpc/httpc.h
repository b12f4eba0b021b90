/* The libcurl settings every outbound request of tensorvault shares (the
 * importer's sources, the fleet's uploads, the CLI's requests to a
 * tensorvaultd): http and https only, no redirects, no signals; and for the
 * long transfers (imports, uploads) the timeouts, the proxy, the one
 * progress callback that hears a cancel within a second, the retry backoff
 * and SigV4 signing.
 *
 * Invariants: libcurl never follows a redirect (an origin check made on a
 * URL must hold for every byte, and a bearer token must not follow one;
 * the one caller that follows them does it hop by hop under
 * tv__http_redirects, below); a
 * transfer set up with a cancel ends within about a second of it saying
 * stop, whatever the far end does (tests/unit/test_url.c). */
#ifndef TV_HTTPC_HTTPC_H
#define TV_HTTPC_HTTPC_H

#include <stdbool.h>
#include <stddef.h>

#include "tensorvault/errors.h"

/* Copies the value of header line p (len bytes, as libcurl's header
 * callback gets it) into out when its name is name (case-insensitive);
 * trims spaces and CRLF. Leaves out as it is otherwise. */
void tv__http_header_value(const char *p, size_t len, const char *name, char *out, size_t out_len);

/* What stops the transfers of one job or one thread: cancelled(ctx)
 * returns true once they must end (a cancelled import, a stopping
 * daemon). It is polled at least once a second by every transfer (the
 * progress callback tv__http_setup installs, every curl_multi loop, the
 * backoff between tries), which then ends with TV_E_CANCELLED, never with
 * a network error and never tried again. cancelled NULL: never. */
typedef struct tv__http_cancel {
    bool (*cancelled)(void *ctx);
    void *ctx;
} tv__http_cancel;

/* Whether c says stop (false for NULL c or a NULL callback). */
bool tv__http_cancelled(const tv__http_cancel *c);

/* How often at least a curl_multi loop polls its cancel (ms). */
#define TV__HTTP_POLL_MS 1000

/* Sleeps before try attempt_no + 1 of a request: 100 ms doubling, at most
 * 6.4 s (the importer's and the uploader's retries), in steps of at most
 * 100 ms, each after a look at cancel. Returns true (at once) when cancel
 * says stop: the caller makes no further try. */
bool tv__http_backoff(unsigned attempt_no, const tv__http_cancel *cancel);

/* What every libcurl request of tensorvault sets (tv__http_setup and the
 * CLI's requests both): http and https only; no redirects; no signals. c is
 * a CURL *. */
void tv__http_defaults(void *c);

/* What a long transfer (the importer's, the uploader's) is set to: url;
 * tv__http_defaults (no redirect: an origin check made on url must hold
 * for every byte); connect timeout and "no byte for timeout_s" (a slow
 * transfer that moves lives); agent;
 * the header and body callbacks with their ctx; errbuf (cleared,
 * CURL_ERROR_SIZE bytes); proxy (NULL or "": libcurl's default); the one
 * progress callback of tensorvault, which aborts the transfer
 * (CURLE_ABORTED_BY_CALLBACK) once cancel says stop: libcurl calls it about
 * once a second even while no byte moves (cancel must outlive the
 * transfer; NULL: none). c is a CURL * (void here: this header does not
 * need curl.h). */
typedef size_t (*tv__http_cb)(char *p, size_t sz, size_t n, void *ctx);
void tv__http_setup(void *c, const char *url, long timeout_s, const char *agent, const char *proxy,
                    tv__http_cb on_header, tv__http_cb on_body, void *ctx, char *errbuf,
                    const tv__http_cancel *cancel);
/* Whether a transfer that ended with CURLcode cc (an int here) was cut
 * short by cancel: aborted by the progress callback, or any failure once
 * cancel says stop. */
bool tv__http_was_cancelled(int cc, const tv__http_cancel *cancel);
/* Signs c's requests with AWS Signature V4 (sigv4: "aws:amz:REGION:s3")
 * with the key pair; no-op without an access key id. */
void tv__http_sigv4(void *c, const char *sigv4, const char *key_id, const char *secret);

/* ---- redirects (the Hugging Face Hub's importer, import/src_hub.c) ----
 *
 * Nothing above follows a redirect. A caller that must (the Hub answers
 * every LFS file with a redirect to its file CDN) follows them itself, one
 * hop at a time with CURLOPT_FOLLOWLOCATION still off, and checks each hop
 * here before it is requested: at most max hops; http(s) only, https only
 * unless allow_http (a hop back to the first URL's own origin keeps its
 * scheme); no credentials in the URL; and, unless allow_private, the
 * connection a hop's request makes must not reach a loopback, private,
 * link-local, shared (100.64/10), multicast or unspecified address (checked
 * on the address actually connected to, so a DNS name cannot smuggle one
 * in). A bearer token goes only to the first URL's origin: the caller drops
 * it at the first hop that leaves that origin. */
typedef struct tv__http_redirects {
    unsigned max;       /* hops followed at most; 0: none (a 3xx fails) */
    bool allow_http;    /* a hop may lead to http:// */
    bool allow_private; /* a hop may connect to a private address (a mirror in the LAN, tests) */
} tv__http_redirects;
#define TV__HTTP_DEFAULT_REDIRECTS 5

/* scheme://host:port of an absolute http(s) URL (lowercased, the default
 * port written out). Returns 0, or -1 when url is not one. */
int tv__http_origin(const char *url, char *out, size_t out_len);

/* Checks a hop to `to` (absolute) of a transfer that began at `first`.
 * Returns 0, or TV_E_FORBIDDEN with err naming the hop and the rule it
 * breaks. */
int tv__http_redirect_check(const tv__http_redirects *p, const char *first, const char *to,
                            tv_error *err);

/* Whether ip (numeric text, IPv4 or IPv6) is loopback, private (10/8,
 * 172.16/12, 192.168/16, fc00::/7), link-local (169.254/16, fe80::/10),
 * shared (100.64/10), multicast, unspecified or an IPv4-mapped one of
 * these; text that does not parse counts as private. */
bool tv__http_addr_private(const char *ip);

/* What tv__http_refuse_private saw: refused is set (and ip copied) when a
 * connection to a private address was stopped before the request went. */
typedef struct tv__http_refusal {
    bool refused;
    char ip[64];
} tv__http_refusal;
/* Makes the transfer of c (a CURL *) stop before its request is sent when
 * the connection reached a private address (tv__http_addr_private); the
 * transfer then ends with CURLE_ABORTED_BY_CALLBACK and r says why (check
 * r before tv__http_was_cancelled). r must outlive the transfer. */
void tv__http_refuse_private(void *c, tv__http_refusal *r);

#endif
