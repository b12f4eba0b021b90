/* The fast-path wire protocol (docs/fastpath.md): the messages a worker and
 * tensorvaultd exchange over the UNIX socket (SOCK_SEQPACKET: one message
 * per datagram), their encoder and their decoder. Both ends use it: the
 * library's fast-path client and the server (server/fastpath/).
 *
 * Invariants:
 *   - every message is a 16-byte header (magic "TVFP", version, type, total
 *     length, reserved 0) followed by a fixed body and, for list messages,
 *     n fixed-size entries; all fields are fixed-width little-endian, and
 *     the structs below are the layout (static_assert on size and every
 *     offset in wire.c) but are never cast from a buffer: tv__fp_decode
 *     reads field by field, so the buffer needs no alignment;
 *   - the decoder accepts a message only when the header's length equals the
 *     datagram length, the type is known, the body and n entries fill the
 *     message exactly, every reserved field and reserved flag bit is 0, and
 *     every count is within the limits below; anything else is
 *     TV_E_PROTOCOL (or TV_E_VERSION for another version) with a message
 *     naming the field. It never allocates and never reads outside [buf,
 *     buf + len);
 *   - entries of list messages stay in the buffer and are decoded one at a
 *     time (tv__fp_*_entry), so a 64 KiB message costs no allocation;
 *   - every encoder checks its capacity and its counts and returns the
 *     number of bytes written, or 0 when they do not fit (nothing useful is
 *     left in buf then). */
#ifndef TV_WIRE_WIRE_H
#define TV_WIRE_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "util/internal.h"

#define TV__FP_MAGIC 0x50465654u /* "TVFP" as little-endian bytes */
#define TV__FP_V1    1u          /* version 1: the base protocol */
#define TV__FP_V2    2u          /* version 2: + READ flag TV__FP_READ_SHARD_HEADER */
#define TV__FP_V3                                                                                  \
    3u                         /* version 3: + the memory tier: OPENED flags, READ flag VIEW,      \
                                  RELEASE_VIEW */
#define TV__FP_VERSION_MIN  1u /* this build speaks versions MIN..MAX */
#define TV__FP_VERSION_MAX  3u
#define TV__FP_HDR_LEN      16u
#define TV__FP_MAX_MSG      65536u /* largest datagram either side sends or accepts */
#define TV__FP_MAX_SPEC     512u   /* OPEN's model spec, bytes (no NUL inside) */
#define TV__FP_MAX_TEXT     512u   /* ERROR's message, bytes */
#define TV__FP_MAX_READS    2047u  /* entries per READ:    16 + 8 + n x 32 <= 65536 */
#define TV__FP_MAX_CHUNKS   2047u  /* entries per CHUNK:   16 + 8 + n x 32 */
#define TV__FP_MAX_DONES    4094u  /* entries per DONE:    16 + 8 + n x 16 <= 65536 */
#define TV__FP_MAX_RELEASE  16378u /* entries per RELEASE: 16 + 8 + n x 4 */
#define TV__FP_N_FDS_OPENED 2u     /* OPENED carries [snapshot memfd, arena memfd] */

enum tv__fp_type {
    TV__FP_HELLO = 1,    /* C->S  first message: versions the client speaks */
    TV__FP_HELLO_OK = 2, /* S->C  the chosen version and the session's id */
    TV__FP_OPEN = 3,     /* C->S  open a model spec (NAME, NAME@GEN, NAME@ALIAS) */
    TV__FP_OPENED = 4,   /* S->C  handle + 2 fds (SCM_RIGHTS): snapshot, staging arena */
    TV__FP_CLOSE = 5,    /* C->S  close a handle: its requests end CANCELLED, its slots return */
    TV__FP_CLOSED = 6,   /* S->C  the handle is gone (after every DONE of its requests) */
    TV__FP_READ = 7,     /* C->S  n read requests of one handle */
    TV__FP_CHUNK = 8,    /* S->C  n chunk-ready entries: copy slot bytes to the destination */
    TV__FP_DONE = 9,     /* S->C  n requests finished (0: every byte was sent in CHUNKs before) */
    TV__FP_RELEASE = 10, /* C->S  n slot references of one handle given back */
    TV__FP_ERROR = 11,   /* S->C  an error: of a request, of an OPEN, or fatal (session closes) */
    TV__FP_RELEASE_VIEW = 12, /* C->S  (version 3) n view references of one handle given back */
};
/* The highest message type version v defines (a version this build does
 * not speak, seen before negotiation, is read as version 1's, as its READ
 * flags are). */
#define TV__FP_MAX_TYPE(v)                                                                         \
    ((v) >= TV__FP_V3 && (v) <= TV__FP_VERSION_MAX ? TV__FP_RELEASE_VIEW : TV__FP_ERROR)

#define TV__FP_ERROR_FATAL 0x1u /* ERROR.flags: the daemon closes the session after it */

/* READ entry flags (version 2; in version 1 every bit is reserved): the
 * entry's tensor field is a shard index and [off, off + len) is relative to
 * the start of the shard's object, inside its first 8 + header_len bytes. */
#define TV__FP_READ_SHARD_HEADER 0x1u
/* READ entry flag (version 3): a view. The request's CHUNK entries are view
 * references (not copies): the client keeps the bytes where they are, in
 * the arena, until it gives each back with RELEASE_VIEW; they count
 * against neither its credit nor the hold timeout (docs/fastpath.md 8.12). */
#define TV__FP_READ_VIEW 0x2u
/* The READ entry flags version v defines (0 for unknown versions). */
#define TV__FP_READ_FLAGS(v)                                                                       \
    ((v) >= TV__FP_V3 && (v) <= TV__FP_VERSION_MAX   ? 0x3u                                        \
     : (v) >= TV__FP_V2 && (v) <= TV__FP_VERSION_MAX ? 0x1u                                        \
                                                     : 0x0u)
/* OPENED flags (version 3; the field is reserved before): the arena is the
 * generation's memory tier, laid out like its objects (docs/fastpath.md
 * 8.2): slot i is chunk i of the generation, so the bytes of one request
 * are contiguous in it. */
#define TV__FP_OPENED_TIER 0x1u
/* The OPENED flags version v defines. */
#define TV__FP_OPENED_FLAGS(v) ((v) >= TV__FP_V3 && (v) <= TV__FP_VERSION_MAX ? 0x1u : 0x0u)

/* ---- the layout of every message part (little-endian on the wire) ---- */

typedef struct tv__fp_hdr {
    uint32_t magic; /* TV__FP_MAGIC */
    uint16_t version;
    uint16_t type;     /* enum tv__fp_type */
    uint32_t len;      /* total message bytes, header included = datagram length */
    uint32_t reserved; /* 0 */
} tv__fp_hdr;

typedef struct tv__fp_hello {
    uint16_t min_version, max_version; /* min <= max; the server picks the highest it speaks */
    uint32_t reserved;                 /* 0 */
} tv__fp_hello;

typedef struct tv__fp_hello_ok {
    uint16_t version;      /* chosen */
    uint16_t reserved0;    /* 0 */
    uint32_t max_msg_len;  /* TV__FP_MAX_MSG */
    uint32_t max_requests; /* requests a session may have outstanding (READ entries not DONE) */
    uint32_t max_handles;  /* handles a session may have open */
    uint64_t session_id;   /* as GET /v1/sessions lists it */
} tv__fp_hello_ok;

typedef struct tv__fp_open {
    uint32_t open_id;  /* the client's tag (>= 1), echoed by OPENED or ERROR.open_id */
    uint32_t spec_len; /* 1..TV__FP_MAX_SPEC bytes of spec follow (no NUL) */
} tv__fp_open;

typedef struct tv__fp_opened {
    uint32_t open_id;
    uint32_t handle; /* >= 1, unique in the session */
    int64_t generation;
    uint64_t snap_len;  /* bytes of the snapshot memfd (sealed: write, grow, shrink, seal) */
    uint64_t arena_len; /* bytes of the arena memfd, >= n_slots x slot_len (read-only for
                           the client: F_SEAL_FUTURE_WRITE, shrink, grow) */
    uint32_t slot_len;  /* bytes per slot, a multiple of 4096 */
    uint32_t n_slots;
    uint32_t credit; /* slot references the session may hold at once (all its handles of
                        this arena): the daemon never sends more */
    uint32_t flags;  /* version 3: TV__FP_OPENED_TIER; before: reserved, 0 */
} tv__fp_opened;

typedef struct tv__fp_close {
    uint32_t handle;
    uint32_t reserved; /* 0 */
} tv__fp_close;        /* CLOSE and CLOSED */

typedef struct tv__fp_list {
    uint32_t handle; /* READ, RELEASE: the handle; CHUNK, DONE: 0 (entries carry it) */
    uint32_t n;      /* entries that follow: 1..TV__FP_MAX_* of the type */
} tv__fp_list;

typedef struct tv__fp_read_ent {
    uint64_t req_id; /* the client's, unique among its outstanding requests */
    uint32_t tensor; /* index in the snapshot (file order); a shard index with
                        TV__FP_READ_SHARD_HEADER */
    uint32_t flags;  /* 0, or (version 2) TV__FP_READ_SHARD_HEADER, (version 3) also
                        TV__FP_READ_VIEW */
    uint64_t off;    /* byte range [off, off + len) of the tensor's data (of the shard's
                        object with the flag); len 0 is valid */
    uint64_t len;
} tv__fp_read_ent;

typedef struct tv__fp_chunk_ent {
    uint64_t req_id;
    uint32_t handle;
    uint32_t slot;     /* < n_slots of the handle's arena */
    uint32_t slot_off; /* payload starts here inside the slot */
    uint32_t len;      /* slot_off + len <= slot_len; len >= 1 */
    uint64_t dest_off; /* byte offset inside the request's range; dest_off + len <= req len */
} tv__fp_chunk_ent;

typedef struct tv__fp_done_ent {
    uint64_t req_id;
    int32_t result; /* 0, or the error (an ERROR naming req_id came just before) */
    uint32_t handle;
} tv__fp_done_ent;

typedef struct tv__fp_release_ent {
    uint32_t slot; /* one reference given back per entry */
} tv__fp_release_ent;

typedef struct tv__fp_error {
    int32_t code;      /* TV_E_* or -errno */
    uint32_t flags;    /* TV__FP_ERROR_FATAL; other bits 0 */
    uint64_t req_id;   /* the failed request, or 0 */
    uint32_t open_id;  /* the failed OPEN's tag, or 0 */
    uint32_t text_len; /* 0..TV__FP_MAX_TEXT bytes of UTF-8 follow (no NUL) */
} tv__fp_error;

/* Fixed sizes (static_assert in wire.c). */
#define TV__FP_HELLO_LEN     8u
#define TV__FP_HELLO_OK_LEN  24u
#define TV__FP_OPEN_LEN      8u
#define TV__FP_OPENED_LEN    48u
#define TV__FP_CLOSE_LEN     8u
#define TV__FP_LIST_LEN      8u
#define TV__FP_READ_ENT_LEN  32u
#define TV__FP_CHUNK_ENT_LEN 32u
#define TV__FP_DONE_ENT_LEN  16u
#define TV__FP_REL_ENT_LEN   4u
#define TV__FP_ERROR_LEN     24u

/* ---- decoding ---- */

/* A decoded message: host-order fixed parts; variable parts point into the
 * decoded buffer (keep it alive while using them). */
typedef struct tv__fp_msg {
    uint16_t version;
    uint16_t type;
    uint32_t len;
    union {
        tv__fp_hello hello;
        tv__fp_hello_ok hello_ok;
        tv__fp_open open;
        tv__fp_opened opened;
        tv__fp_close close; /* CLOSE, CLOSED */
        tv__fp_list list;   /* READ, CHUNK, DONE, RELEASE, RELEASE_VIEW */
        tv__fp_error error;
    } u;
    const char *text; /* OPEN's spec, ERROR's text (not NUL-terminated), else NULL */
    size_t text_len;
    const uint8_t *entries; /* list messages: u.list.n encoded entries */
} tv__fp_msg;

/* Decodes one datagram of len bytes. `version` is the negotiated version
 * (0 before HELLO/HELLO_OK: then only a header whose version is between 1
 * and 0xffff is accepted and HELLO's body is checked whatever its
 * version; after, the header's version must equal it). Checks everything
 * listed at the top; for OPEN also that the spec has no NUL byte; for ERROR
 * that the text has none. The value checks (docs/fastpath.md lists them):
 * HELLO 1 <= min_version <= max_version; HELLO_OK version == the header's,
 * max_msg_len >= 552 (an ERROR of the longest text fits), max_requests and
 * max_handles >= 1; OPEN and OPENED open_id >= 1; every handle field >= 1
 * (CHUNK's and DONE's list handle is reserved: 0); OPENED slot_len a
 * positive multiple of 4096, n_slots and credit >= 1, arena_len >= n_slots x
 * slot_len; ERROR code < 0. Request ranges (READ off + len) are the
 * server's to check, not the decoder's. Does not check which side may send
 * the type (the state machines do). Returns 0 and *out; TV_E_PROTOCOL
 * naming the field (also for header version 0, never a version);
 * TV_E_VERSION (header version != the negotiated one); TV_E_INVALID_ARG
 * (NULL buf with len > 0, NULL out). On failure *out is zeroed. */
int tv__fp_decode(const void *buf, size_t len, uint16_t version, tv__fp_msg *out, tv_error *err);

/* Entry i (< u.list.n) of a decoded READ / CHUNK / DONE / RELEASE, decoded
 * with its checks (reserved fields zero; READ flags: only the bits the
 * message's header version defines (TV__FP_READ_FLAGS); CHUNK len >= 1,
 * handle >= 1, slot_off + len and dest_off + len not overflowing; DONE
 * handle >= 1, result <= 0).
 * Returns 0, TV_E_INVALID_ARG (wrong type or i out of range) or
 * TV_E_PROTOCOL. */
int tv__fp_read_entry(const tv__fp_msg *m, uint32_t i, tv__fp_read_ent *out, tv_error *err);
int tv__fp_chunk_entry(const tv__fp_msg *m, uint32_t i, tv__fp_chunk_ent *out, tv_error *err);
int tv__fp_done_entry(const tv__fp_msg *m, uint32_t i, tv__fp_done_ent *out, tv_error *err);
/* RELEASE and RELEASE_VIEW entries alike. */
int tv__fp_release_entry(const tv__fp_msg *m, uint32_t i, uint32_t *slot, tv_error *err);

/* ---- encoding (return bytes written, 0 when cap is too small or a count
 *      or length is over its limit, or a value the decoder would reject:
 *      the codec is canonical, whatever encodes decodes and re-encodes to
 *      the same bytes). `version` is the negotiated version (the header's;
 *      TV__FP_VERSION_MIN..MAX, else 0 is returned); HELLO's header carries
 *      min_version (so a 1..2 HELLO reads as version 1 to a version-1
 *      daemon), HELLO_OK's m->version. ---- */

size_t tv__fp_encode_hello(void *buf, size_t cap, uint16_t min_version, uint16_t max_version);
size_t tv__fp_encode_hello_ok(void *buf, size_t cap, const tv__fp_hello_ok *m);
size_t tv__fp_encode_open(void *buf, size_t cap, uint16_t version, uint32_t open_id,
                          const char *spec, size_t spec_len);
size_t tv__fp_encode_opened(void *buf, size_t cap, uint16_t version, const tv__fp_opened *m);
/* type TV__FP_CLOSE or TV__FP_CLOSED */
size_t tv__fp_encode_close(void *buf, size_t cap, uint16_t version, uint16_t type, uint32_t handle);
/* entry flags: those TV__FP_READ_FLAGS(version) defines */
size_t tv__fp_encode_read(void *buf, size_t cap, uint16_t version, uint32_t handle,
                          const tv__fp_read_ent *e, uint32_t n);
size_t tv__fp_encode_chunk(void *buf, size_t cap, uint16_t version, const tv__fp_chunk_ent *e,
                           uint32_t n);
size_t tv__fp_encode_done(void *buf, size_t cap, uint16_t version, const tv__fp_done_ent *e,
                          uint32_t n);
size_t tv__fp_encode_release(void *buf, size_t cap, uint16_t version, uint32_t handle,
                             const uint32_t *slots, uint32_t n);
/* version >= 3 only (0 otherwise) */
size_t tv__fp_encode_release_view(void *buf, size_t cap, uint16_t version, uint32_t handle,
                                  const uint32_t *slots, uint32_t n);
/* text is cut to TV__FP_MAX_TEXT bytes (at a UTF-8 boundary); NUL bytes in
 * it are replaced by '?'. */
size_t tv__fp_encode_error(void *buf, size_t cap, uint16_t version, int32_t code, uint32_t flags,
                           uint64_t req_id, uint32_t open_id, const char *text, size_t text_len);

/* The name of a message type ("READ"), or "UNKNOWN". */
const char *tv__fp_type_name(uint16_t type);

/* ---- the socket side (both ends use these; through util/sys for faults) ----
 * sendmsg/recvmsg of one datagram with MSG_NOSIGNAL / MSG_CMSG_CLOEXEC. */

/* Sends len bytes and n_fds descriptors (0..TV__FP_N_FDS_OPENED) as one
 * datagram. Returns 0; -EAGAIN (non-blocking socket full: nothing sent);
 * -EPIPE / -ECONNRESET; TV_E_SHORT_IO (partial datagram: impossible on
 * SEQPACKET, checked anyway). */
int tv__fp_send(int sock, const void *buf, size_t len, const int *fds, size_t n_fds, tv_error *err);
/* Receives one datagram into buf (cap >= TV__FP_MAX_MSG) and up to max_fds
 * descriptors (the rest, and all of them when max_fds is 0, are closed at
 * once: a peer cannot leak descriptors into us). *n_fds gets the number
 * kept. Returns the datagram length (> 0); 0 at orderly EOF; -EAGAIN;
 * TV_E_PROTOCOL for a datagram longer than cap (MSG_TRUNC) or a control
 * message that was cut (MSG_CTRUNC: descriptors closed); -errno. */
ssize_t tv__fp_recv(int sock, void *buf, size_t cap, int *fds, size_t max_fds, size_t *n_fds,
                    tv_error *err);

#endif
