/* tensorvault error codes: 0, a negative errno, or a library code from the
 * reserved range [-1999, -1000].
 *
 * Invariants: codes are append-only and never renumbered (they cross the
 * wire protocol and the REST API by name and number); every code has a
 * stable upper-case name and a one-line description. */
#ifndef TENSORVAULT_ERRORS_H
#define TENSORVAULT_ERRORS_H

#ifdef __cplusplus
extern "C" {
#endif

/* X(NAME, value, description) */
#define TV_ERROR_TABLE(X)                                                                          \
    X(TV_E_INTERNAL, -1000, "internal error")                                                      \
    X(TV_E_OVERFLOW, -1001, "arithmetic overflow")                                                 \
    X(TV_E_NOT_SUPPORTED, -1002, "operation not supported by this build or device")                \
    X(TV_E_INVALID_ARG, -1003, "invalid argument")                                                 \
    X(TV_E_NOT_FOUND, -1004, "not found")                                                          \
    X(TV_E_FILE_SHORT, -1010, "file shorter than the 8-byte safetensors length prefix")            \
    X(TV_E_ST_HEADER_EMPTY, -1011, "safetensors header length is 0")                               \
    X(TV_E_ST_HEADER_TOO_LARGE, -1012, "safetensors header length over the limit")                 \
    X(TV_E_ST_HEADER_PAST_EOF, -1013, "safetensors header extends past the end of the file")       \
    X(TV_E_ST_HEADER_START, -1014, "safetensors header does not start with '{'")                   \
    X(TV_E_ST_UTF8, -1015, "safetensors header is not valid UTF-8")                                \
    X(TV_E_ST_JSON, -1016, "safetensors header is not valid JSON")                                 \
    X(TV_E_ST_DUPLICATE_KEY, -1017, "duplicate JSON object key")                                   \
    X(TV_E_ST_TOO_DEEP, -1018, "JSON nesting deeper than the limit")                               \
    X(TV_E_ST_METADATA, -1019, "__metadata__ is not a string-to-string object")                    \
    X(TV_E_ST_TENSOR_FIELDS, -1020,                                                                \
      "tensor entry does not have exactly dtype, shape, data_offsets")                             \
    X(TV_E_ST_DTYPE, -1021, "unknown dtype")                                                       \
    X(TV_E_ST_SHAPE, -1022, "shape is not a list of non-negative integers")                        \
    X(TV_E_ST_RANK, -1023, "tensor rank over the limit")                                           \
    X(TV_E_ST_OVERFLOW, -1024, "element count or offset arithmetic overflows")                     \
    X(TV_E_ST_OFFSETS, -1025, "data_offsets malformed or END < BEGIN")                             \
    X(TV_E_ST_LENGTH, -1026, "byte length does not match shape x dtype")                           \
    X(TV_E_ST_OVERLAP, -1027, "tensor data ranges overlap")                                        \
    X(TV_E_ST_HOLE, -1028, "hole between tensor data ranges")                                      \
    X(TV_E_ST_TRAILING, -1029, "unindexed bytes after the last tensor")                            \
    X(TV_E_ST_TRUNCATED, -1030, "data section shorter than the last tensor's END")                 \
    X(TV_E_ST_NOT_BYTE_ADDRESSABLE, -1031, "sub-byte dtype is not byte-addressable for reads")     \
    X(TV_E_ST_NAME_EMPTY, -1032, "tensor name is empty (the registry cannot store it)")            \
    X(TV_E_ST_NUL, -1033, "NUL (\\u0000) in a tensor name or __metadata__")                        \
    X(TV_E_ST_INT_RANGE, -1034, "integer in a tensor entry above INT64_MAX")                       \
    X(TV_E_IDX_JSON, -1040, "index file is not valid JSON")                                        \
    X(TV_E_IDX_WEIGHT_MAP, -1041, "index weight_map is not a string-to-string object")             \
    X(TV_E_IDX_SHARD_NAME, -1042, "index shard name is absolute, has '..', a backslash or NUL")    \
    X(TV_E_IDX_SHARD_ESCAPE, -1043, "index shard resolves outside the index directory")            \
    X(TV_E_IDX_MISSING_TENSOR, -1044, "tensor listed in the index is missing from its shard")      \
    X(TV_E_IDX_UNLISTED_TENSOR, -1045, "tensor present in a shard is not listed in the index")     \
    X(TV_E_IDX_DUPLICATE_TENSOR, -1046, "tensor present in two shards")                            \
    X(TV_E_IDX_TOO_MANY_SHARDS, -1047, "index names more shards than the limit")                   \
    X(TV_E_CKPT_NOT_FOUND, -1048, "no safetensors checkpoint at that path")                        \
    X(TV_E_DEVICE_MISMATCH, -1100, "device label, geometry or identity does not match")            \
    X(TV_E_NO_SPACE, -1101, "no free extent large enough in the device region")                    \
    X(TV_E_LOCKED, -1102, "store is locked by another writer")                                     \
    X(TV_E_STATE, -1103, "object is in the wrong state for this operation")                        \
    X(TV_E_HASH_MISMATCH, -1104, "content hash does not match the registry")                       \
    X(TV_E_SHORT_IO, -1105, "short read or write")                                                 \
    X(TV_E_REGISTRY, -1106, "registry (SQLite) error")                                             \
    X(TV_E_SOURCE_CHANGED, -1107, "source file changed during import")                             \
    X(TV_E_LEASED, -1108, "generation is referenced by a live reader lease")                       \
    X(TV_E_REGISTRY_TOO_NEW, -1109, "registry schema is newer than this binary supports")          \
    X(TV_E_SNAPSHOT, -1110, "manifest snapshot is malformed")                                      \
    X(TV_E_TIMEOUT, -1111, "device read timed out")                                                \
    X(TV_E_DEVICE_IN_USE, -1112,                                                                   \
      "device holds a store label or data (store init --force overwrites)")                        \
    X(TV_E_SNAPSHOT_IDENTITY, -1120, "snapshot belongs to another model or generation")            \
    X(TV_E_NAME, -1125, "model or alias name breaks the name rule")                                \
    X(TV_E_NO_REPLICA, -1130, "no valid replica: every device holding the shard is excluded")      \
    X(TV_E_UNAUTHORIZED, -1200, "missing or invalid API token")                                    \
    X(TV_E_FORBIDDEN, -1201, "the API token lacks the scope this call needs")                      \
    X(TV_E_TOO_LARGE, -1202, "request body or header too large")                                   \
    X(TV_E_BUSY, -1203, "job queue is full")                                                       \
    X(TV_E_OUTSIDE_ROOTS, -1204, "import source resolves outside the configured import roots")     \
    X(TV_E_RANGE, -1205, "requested byte range is not satisfiable")                                \
    X(TV_E_BAD_REQUEST, -1206, "malformed request")                                                \
    X(TV_E_CONFLICT, -1207, "the operation conflicts with the current state")                      \
    X(TV_E_NO_DAEMON, -1208, "no tensorvaultd answers at that URL")                                \
    X(TV_E_PROTOCOL, -1300, "fast-path message malformed, oversized or out of order")              \
    X(TV_E_VERSION, -1301, "no fast-path protocol version in common with the peer")                \
    X(TV_E_PEER_DENIED, -1302, "the peer's uid and groups are not allowed this model")             \
    X(TV_E_CANCELLED, -1303, "request cancelled: its handle or session was closed")                \
    X(TV_E_DISCONNECTED, -1304, "the fast-path connection to tensorvaultd closed")

enum tv_error_code {
#define TV__ERR_ENUM(name, value, desc) name = value,
    TV_ERROR_TABLE(TV__ERR_ENUM)
#undef TV__ERR_ENUM
};

/* Human-readable description of any return code (0, -errno, or TV_E_*).
 * Never returns NULL; the string is static. */
const char *tv_strerror(int code);

/* Stable symbolic name: "TV_E_ST_OVERLAP", "EIO", "OK", or "UNKNOWN". */
const char *tv_err_name(int code);

/* Detailed error: the code plus a message naming the tensor, offset or path
 * involved. Functions that take a tv_error * fill it on failure (if non-NULL)
 * and leave it untouched on success. */
typedef struct tv_error {
    int code;
    char msg[512];
} tv_error;

#ifdef __cplusplus
}
#endif
#endif
