/* libtensorvault's fast-path client: read tensors from a co-located
 * tensorvaultd over its UNIX socket and shared memory, without device
 * permissions, SQLite or HTTP (docs/fastpath.md).
 *
 * A tv_client is one session (one connection). tv_client_open opens a model
 * spec in it and returns a tv_client_model, which holds the daemon's lease
 * on that generation until it is closed (or the process dies: the socket
 * closes and the daemon releases it). Metadata calls (keys, find, info) are
 * answered from the daemon's sealed snapshot without a round trip.
 *
 * Invariants kept for every read, as for the in-process reader
 * (tensorvault.h): only [dest, dest + nbytes) is written; a call returns 0
 * only when every byte arrived; on failure the destination holds no
 * promise, and no byte is written into it after the call returned; every
 * slot the daemon lent is given back before the call returns (or the
 * session is closed). Error codes are the reader's plus TV_E_PROTOCOL,
 * TV_E_VERSION, TV_E_PEER_DENIED, TV_E_CANCELLED, TV_E_DISCONNECTED (the
 * daemon went away: reconnect with tv_client_connect) and TV_E_NO_DAEMON
 * (nothing listens on the socket).
 * A tv_client and its models may be used from one thread at a time
 * (external locking otherwise). Destructors accept NULL. */
#ifndef TENSORVAULT_CLIENT_H
#define TENSORVAULT_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tensorvault/tensorvault.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tv_client tv_client;
typedef struct tv_client_model tv_client_model;

/* The socket of the embedded default daemon, relative to its start
 * directory; $TENSORVAULT_SOCKET overrides it when socket_path is NULL. */
#define TV_CLIENT_DEFAULT_SOCKET "var/run/tensorvault.sock"

typedef struct tv_client_opts {
    uint32_t timeout_ms; /* a reply later than this fails the call with TV_E_TIMEOUT and
                            closes the session; 0 = 60000 */
    bool cuda_register;  /* cudaHostRegister the arena mappings (pinned-speed GPU copies);
                            ignored without CUDA */
} tv_client_opts;

/* Connects and negotiates the protocol version. socket_path NULL: the
 * environment's $TENSORVAULT_SOCKET, else TV_CLIENT_DEFAULT_SOCKET.
 * Returns 0 and *out; TV_E_NO_DAEMON (no socket or nobody listening: the
 * message names the path); TV_E_VERSION; TV_E_BUSY (the daemon's session
 * limit); TV_E_PROTOCOL; -errno. */
int tv_client_connect(const char *socket_path, const tv_client_opts *opts, tv_client **out,
                      tv_error *err);
/* Closes the session (every model of it too: their handles are freed, so
 * neither use nor close them afterwards). */
void tv_client_close(tv_client *c);
/* The daemon's id for this session (GET /v1/sessions). */
uint64_t tv_client_session_id(const tv_client *c);

/* Opens spec ("NAME", "NAME@GEN", "NAME@ALIAS", as tv_model_open) in the
 * session. Returns 0 and *out; TV_E_NOT_FOUND (no such model, generation,
 * alias, or a retired generation); TV_E_PEER_DENIED; TV_E_BUSY (handle or
 * group limit); TV_E_SNAPSHOT (the snapshot received fails validation);
 * TV_E_PROTOCOL; TV_E_DISCONNECTED; the daemon's open errors. */
int tv_client_open(tv_client *c, const char *spec, tv_client_model **out, tv_error *err);
/* Closes the model: its lease is released (the daemon's CLOSE). NULL-safe. */
void tv_client_model_close(tv_client_model *m);

int64_t tv_client_model_generation(const tv_client_model *m);
const char *tv_client_model_name(const tv_client_model *m);
size_t tv_client_n_tensors(const tv_client_model *m);
/* As tv_model_tensor / tv_model_find (tensorvault.h). */
int tv_client_tensor(const tv_client_model *m, size_t i, tv_tensor_desc *out);
int tv_client_find(const tv_client_model *m, const char *name, size_t name_len, size_t *index);
/* As tv_model_n_shards / tv_model_shard (tensorvault.h). */
size_t tv_client_n_shards(const tv_client_model *m);
int tv_client_shard(const tv_client_model *m, size_t i, tv_shard_desc *out);
/* As tv_read_shard_header, through the daemon (protocol version 2: READ
 * flag TV__FP_READ_SHARD_HEADER, docs/fastpath.md). Returns its codes and
 * TV_E_NOT_SUPPORTED when the daemon negotiated protocol version 1 (nothing
 * sent, nothing written); the session's errors (TV_E_DISCONNECTED,
 * TV_E_PROTOCOL, ...). */
int tv_client_read_shard_header(tv_client_model *m, size_t shard, void *dest, size_t dest_len,
                                tv_error *err);

/* As tv_read_into, tv_read_batch, tv_read_range, tv_read_rows, tv_rows_len,
 * tv_read_f32 and tv_get_tensor (free with tv_tensor_free), through the
 * daemon. A batch is sent as few READ messages and completes as the chunks
 * arrive, in any order. */
int tv_client_read_into(tv_client_model *m, const char *name, void *dest, size_t dest_len,
                        tv_error *err);
int tv_client_read_batch(tv_client_model *m, tv_read_req *reqs, size_t n, tv_error *err);
int tv_client_read_range(tv_client_model *m, const char *name, uint64_t off, uint64_t len,
                         void *dest, size_t dest_len, tv_error *err);
int tv_client_read_rows(tv_client_model *m, const char *name, uint64_t r0, uint64_t r1, void *dest,
                        size_t dest_len, tv_error *err);
int tv_client_rows_len(const tv_client_model *m, const char *name, uint64_t r0, uint64_t r1,
                       uint64_t *len, tv_error *err);
int tv_client_read_f32(tv_client_model *m, const char *name, void *dest, size_t dest_len,
                       tv_error *err);
int tv_client_get_tensor(tv_client_model *m, const char *name, tv_tensor **out, tv_error *err);

/* CUDA destinations (device pointers), copied with cudaMemcpyAsync on
 * stream from the arena; returns when the bytes are on the GPU. As
 * tv_read_into_cuda: TV_E_NOT_SUPPORTED without CUDA or a GPU. */
int tv_client_read_into_cuda(tv_client_model *m, const char *name, void *dev_ptr, size_t dev_len,
                             void *stream, tv_error *err);
int tv_client_read_batch_cuda(tv_client_model *m, tv_read_req *reqs, size_t n, void *stream,
                              tv_error *err);

#ifdef __cplusplus
}
#endif
#endif
