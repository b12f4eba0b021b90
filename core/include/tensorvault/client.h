/* libtensorvault's fast-path session: a connection to a co-located
 * tensorvaultd over its UNIX socket and shared memory, without device
 * permissions, SQLite or HTTP (docs/fastpath.md). A session only connects:
 * models are opened in it with tv_model_open_daemon and read with the same
 * functions as a model opened from a store directory (tensorvault.h).
 *
 *   tv_client *c = NULL;
 *   tv_model *m;
 *   tv_error err;
 *   if (tv_client_connect(NULL, NULL, &c, &err) == 0 &&
 *       tv_model_open_daemon(c, "llama@prod", NULL, &m, &err) == 0) {
 *       tv_read_into(m, "lm_head.weight", buf, len, &err);
 *       tv_model_close(m);
 *   }
 *   tv_client_close(c);
 *
 * Invariants: a session is live until it fails or is closed; anything
 * unexpected from the daemon closes it for good (every later call on it, or
 * on a model opened in it, answers TV_E_DISCONNECTED naming why). Models
 * opened in a session are the caller's: tv_client_close detaches them
 * (their handles at the daemon are released with the connection; their
 * metadata stays, reads fail with TV_E_DISCONNECTED), and only
 * tv_model_close frees them. A tv_client and its models may be used from
 * one thread at a time (external locking otherwise). Destructors accept
 * NULL. */
#ifndef TENSORVAULT_CLIENT_H
#define TENSORVAULT_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tensorvault/tensorvault.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The socket of the embedded default daemon, relative to its start
 * directory; $TENSORVAULT_SOCKET overrides it when socket_path is NULL. */
#define TV_CLIENT_DEFAULT_SOCKET "var/run/tensorvault.sock"

typedef struct tv_client_opts {
    uint32_t timeout_ms; /* a reply later than this fails the call with TV_E_TIMEOUT and
                            closes the session; 0 = 60000 */
    bool cuda_register;  /* cudaHostRegister the arena mappings of the models opened in
                            the session (pinned-speed GPU copies); ignored without CUDA */
} tv_client_opts;

/* Connects to the daemon's fast-path socket and negotiates the protocol
 * version (this library speaks 1 and 2). socket_path NULL: the
 * environment's $TENSORVAULT_SOCKET, else TV_CLIENT_DEFAULT_SOCKET. opts
 * may be NULL (the defaults).
 * Returns 0 and *out (close with tv_client_close); TV_E_INVALID_ARG (NULL
 * out; a path empty or longer than a socket address holds); TV_E_NO_DAEMON
 * (no socket or nobody listening: the message names the path);
 * TV_E_VERSION (no protocol version in common); TV_E_BUSY (the daemon's
 * session or per-user limits: it refused the connection);
 * TV_E_PEER_DENIED (the daemon refuses this uid); TV_E_PROTOCOL (a bad
 * answer); TV_E_TIMEOUT (no answer within timeout_ms); TV_E_DISCONNECTED
 * (the daemon closed the connection); -errno (socket, connect); -ENOMEM. */
int tv_client_connect(const char *socket_path, const tv_client_opts *opts, tv_client **out,
                      tv_error *err);
/* Closes the session: the connection closes and the daemon releases every
 * handle of it. Models opened in it stay allocated, detached: close each
 * with tv_model_close (before or after this). NULL-safe. */
void tv_client_close(tv_client *c);
/* The daemon's id for this session (GET /v1/sessions lists it); 0 for
 * NULL. */
uint64_t tv_client_session_id(const tv_client *c);

#ifdef __cplusplus
}
#endif
#endif
