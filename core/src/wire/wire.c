/* The fast-path wire codec (docs/fastpath.md): encoder, decoder and the
 * one-datagram send/receive both ends use.
 *
 * Invariants: the structs of wire.h are the layout (the static asserts
 * below pin every size and offset) but bytes are only ever read and written
 * field by field through util/endian.h, so no buffer needs alignment; the
 * codec is canonical: the encoders refuse exactly what the decoder rejects
 * (both run the same check_* functions), so whatever decodes re-encodes to
 * the same bytes and whatever encodes decodes; the decoder never allocates
 * and never reads outside [buf, buf + len); tv__fp_recv never keeps a
 * descriptor the caller did not ask for. */
#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>

#include "wire/wire.h"
#include "util/endian.h"
#include "util/sys.h"

/* ---- the layout, pinned ---- */

#define TV__FP_ASSERT_AT(type, field, off)                                                         \
    _Static_assert(offsetof(type, field) == (off), #type "." #field " must be at offset " #off)

_Static_assert(sizeof(tv__fp_hdr) == TV__FP_HDR_LEN, "header is 16 bytes");
TV__FP_ASSERT_AT(tv__fp_hdr, magic, 0);
TV__FP_ASSERT_AT(tv__fp_hdr, version, 4);
TV__FP_ASSERT_AT(tv__fp_hdr, type, 6);
TV__FP_ASSERT_AT(tv__fp_hdr, len, 8);
TV__FP_ASSERT_AT(tv__fp_hdr, reserved, 12);

_Static_assert(sizeof(tv__fp_hello) == TV__FP_HELLO_LEN, "HELLO body is 8 bytes");
TV__FP_ASSERT_AT(tv__fp_hello, min_version, 0);
TV__FP_ASSERT_AT(tv__fp_hello, max_version, 2);
TV__FP_ASSERT_AT(tv__fp_hello, reserved, 4);

_Static_assert(sizeof(tv__fp_hello_ok) == TV__FP_HELLO_OK_LEN, "HELLO_OK body is 24 bytes");
TV__FP_ASSERT_AT(tv__fp_hello_ok, version, 0);
TV__FP_ASSERT_AT(tv__fp_hello_ok, reserved0, 2);
TV__FP_ASSERT_AT(tv__fp_hello_ok, max_msg_len, 4);
TV__FP_ASSERT_AT(tv__fp_hello_ok, max_requests, 8);
TV__FP_ASSERT_AT(tv__fp_hello_ok, max_handles, 12);
TV__FP_ASSERT_AT(tv__fp_hello_ok, session_id, 16);

_Static_assert(sizeof(tv__fp_open) == TV__FP_OPEN_LEN, "OPEN body is 8 bytes");
TV__FP_ASSERT_AT(tv__fp_open, open_id, 0);
TV__FP_ASSERT_AT(tv__fp_open, spec_len, 4);

_Static_assert(sizeof(tv__fp_opened) == TV__FP_OPENED_LEN, "OPENED body is 48 bytes");
TV__FP_ASSERT_AT(tv__fp_opened, open_id, 0);
TV__FP_ASSERT_AT(tv__fp_opened, handle, 4);
TV__FP_ASSERT_AT(tv__fp_opened, generation, 8);
TV__FP_ASSERT_AT(tv__fp_opened, snap_len, 16);
TV__FP_ASSERT_AT(tv__fp_opened, arena_len, 24);
TV__FP_ASSERT_AT(tv__fp_opened, slot_len, 32);
TV__FP_ASSERT_AT(tv__fp_opened, n_slots, 36);
TV__FP_ASSERT_AT(tv__fp_opened, credit, 40);
TV__FP_ASSERT_AT(tv__fp_opened, flags, 44);

_Static_assert(sizeof(tv__fp_close) == TV__FP_CLOSE_LEN, "CLOSE body is 8 bytes");
TV__FP_ASSERT_AT(tv__fp_close, handle, 0);
TV__FP_ASSERT_AT(tv__fp_close, reserved, 4);

_Static_assert(sizeof(tv__fp_list) == TV__FP_LIST_LEN, "list body is 8 bytes");
TV__FP_ASSERT_AT(tv__fp_list, handle, 0);
TV__FP_ASSERT_AT(tv__fp_list, n, 4);

_Static_assert(sizeof(tv__fp_read_ent) == TV__FP_READ_ENT_LEN, "READ entry is 32 bytes");
TV__FP_ASSERT_AT(tv__fp_read_ent, req_id, 0);
TV__FP_ASSERT_AT(tv__fp_read_ent, tensor, 8);
TV__FP_ASSERT_AT(tv__fp_read_ent, flags, 12);
TV__FP_ASSERT_AT(tv__fp_read_ent, off, 16);
TV__FP_ASSERT_AT(tv__fp_read_ent, len, 24);

_Static_assert(sizeof(tv__fp_chunk_ent) == TV__FP_CHUNK_ENT_LEN, "CHUNK entry is 32 bytes");
TV__FP_ASSERT_AT(tv__fp_chunk_ent, req_id, 0);
TV__FP_ASSERT_AT(tv__fp_chunk_ent, handle, 8);
TV__FP_ASSERT_AT(tv__fp_chunk_ent, slot, 12);
TV__FP_ASSERT_AT(tv__fp_chunk_ent, slot_off, 16);
TV__FP_ASSERT_AT(tv__fp_chunk_ent, len, 20);
TV__FP_ASSERT_AT(tv__fp_chunk_ent, dest_off, 24);

_Static_assert(sizeof(tv__fp_done_ent) == TV__FP_DONE_ENT_LEN, "DONE entry is 16 bytes");
TV__FP_ASSERT_AT(tv__fp_done_ent, req_id, 0);
TV__FP_ASSERT_AT(tv__fp_done_ent, result, 8);
TV__FP_ASSERT_AT(tv__fp_done_ent, handle, 12);

_Static_assert(sizeof(tv__fp_release_ent) == TV__FP_REL_ENT_LEN, "RELEASE entry is 4 bytes");
TV__FP_ASSERT_AT(tv__fp_release_ent, slot, 0);

_Static_assert(sizeof(tv__fp_error) == TV__FP_ERROR_LEN, "ERROR body is 24 bytes");
TV__FP_ASSERT_AT(tv__fp_error, code, 0);
TV__FP_ASSERT_AT(tv__fp_error, flags, 4);
TV__FP_ASSERT_AT(tv__fp_error, req_id, 8);
TV__FP_ASSERT_AT(tv__fp_error, open_id, 16);
TV__FP_ASSERT_AT(tv__fp_error, text_len, 20);

/* The limits fill a datagram exactly or nearly, never more. */
_Static_assert(TV__FP_HDR_LEN + TV__FP_LIST_LEN + TV__FP_MAX_READS * TV__FP_READ_ENT_LEN <=
                   TV__FP_MAX_MSG,
               "READ limit");
_Static_assert(TV__FP_HDR_LEN + TV__FP_LIST_LEN + TV__FP_MAX_CHUNKS * TV__FP_CHUNK_ENT_LEN <=
                   TV__FP_MAX_MSG,
               "CHUNK limit");
_Static_assert(TV__FP_HDR_LEN + TV__FP_LIST_LEN + TV__FP_MAX_DONES * TV__FP_DONE_ENT_LEN <=
                   TV__FP_MAX_MSG,
               "DONE limit");
_Static_assert(TV__FP_HDR_LEN + TV__FP_LIST_LEN + TV__FP_MAX_RELEASE * TV__FP_REL_ENT_LEN <=
                   TV__FP_MAX_MSG,
               "RELEASE limit");
_Static_assert(TV__FP_HDR_LEN + TV__FP_OPEN_LEN + TV__FP_MAX_SPEC <= TV__FP_MAX_MSG, "OPEN limit");
_Static_assert(TV__FP_HDR_LEN + TV__FP_ERROR_LEN + TV__FP_MAX_TEXT <= TV__FP_MAX_MSG,
               "ERROR limit");

/* Slot lengths are multiples of this (OPENED.slot_len). */
#define FP_SLOT_ALIGN 4096u
/* The largest number of descriptors one SCM_RIGHTS message can carry
 * (the kernel's SCM_MAX_FD): recv's control buffer holds that many, so
 * every descriptor a peer sends arrives and is closed, none is cut. */
#define FP_MAX_PEER_FDS 253

const char *tv__fp_type_name(uint16_t type)
{
    switch (type) {
    case TV__FP_HELLO:
        return "HELLO";
    case TV__FP_HELLO_OK:
        return "HELLO_OK";
    case TV__FP_OPEN:
        return "OPEN";
    case TV__FP_OPENED:
        return "OPENED";
    case TV__FP_CLOSE:
        return "CLOSE";
    case TV__FP_CLOSED:
        return "CLOSED";
    case TV__FP_READ:
        return "READ";
    case TV__FP_CHUNK:
        return "CHUNK";
    case TV__FP_DONE:
        return "DONE";
    case TV__FP_RELEASE:
        return "RELEASE";
    case TV__FP_ERROR:
        return "ERROR";
    case TV__FP_RELEASE_VIEW:
        return "RELEASE_VIEW";
    default:
        return "UNKNOWN";
    }
}

/* Entry size and count limit of a list type (0 for the others). */
static size_t list_ent_len(uint16_t type, uint32_t *max_n)
{
    switch (type) {
    case TV__FP_READ:
        *max_n = TV__FP_MAX_READS;
        return TV__FP_READ_ENT_LEN;
    case TV__FP_CHUNK:
        *max_n = TV__FP_MAX_CHUNKS;
        return TV__FP_CHUNK_ENT_LEN;
    case TV__FP_DONE:
        *max_n = TV__FP_MAX_DONES;
        return TV__FP_DONE_ENT_LEN;
    case TV__FP_RELEASE:
    case TV__FP_RELEASE_VIEW:
        *max_n = TV__FP_MAX_RELEASE;
        return TV__FP_REL_ENT_LEN;
    default:
        *max_n = 0;
        return 0;
    }
}

/* ---- the checks both directions share (err may be NULL) ---- */

static int check_hello(const tv__fp_hello *h, tv_error *err)
{
    if (h->reserved != 0)
        return tv__seterr(err, TV_E_PROTOCOL, "HELLO: reserved 0x%x must be 0", h->reserved);
    if (h->min_version == 0)
        return tv__seterr(err, TV_E_PROTOCOL, "HELLO: min_version 0 is not a protocol version");
    if (h->min_version > h->max_version)
        return tv__seterr(err, TV_E_PROTOCOL, "HELLO: min_version %u > max_version %u",
                          h->min_version, h->max_version);
    return 0;
}

static int check_hello_ok(const tv__fp_hello_ok *h, uint16_t hdr_version, tv_error *err)
{
    if (h->reserved0 != 0)
        return tv__seterr(err, TV_E_PROTOCOL, "HELLO_OK: reserved0 0x%x must be 0", h->reserved0);
    if (h->version != hdr_version)
        return tv__seterr(err, TV_E_PROTOCOL, "HELLO_OK: version %u != header version %u",
                          h->version, hdr_version);
    if (h->max_msg_len < TV__FP_HDR_LEN + TV__FP_ERROR_LEN + TV__FP_MAX_TEXT)
        return tv__seterr(err, TV_E_PROTOCOL, "HELLO_OK: max_msg_len %u is below %u",
                          h->max_msg_len, TV__FP_HDR_LEN + TV__FP_ERROR_LEN + TV__FP_MAX_TEXT);
    if (h->max_requests == 0)
        return tv__seterr(err, TV_E_PROTOCOL, "HELLO_OK: max_requests must be >= 1");
    if (h->max_handles == 0)
        return tv__seterr(err, TV_E_PROTOCOL, "HELLO_OK: max_handles must be >= 1");
    return 0;
}

/* OPEN's spec or ERROR's text: no NUL byte. */
static int check_no_nul(const char *what, const char *field, const char *s, size_t len,
                        tv_error *err)
{
    const char *nul = len ? memchr(s, '\0', len) : NULL;
    if (nul)
        return tv__seterr(err, TV_E_PROTOCOL, "%s: %s has a NUL byte at offset %zu", what, field,
                          (size_t)(nul - s));
    return 0;
}

static int check_open(uint32_t open_id, const char *spec, size_t spec_len, tv_error *err)
{
    if (open_id == 0)
        return tv__seterr(err, TV_E_PROTOCOL, "OPEN: open_id must be >= 1");
    if (spec_len == 0)
        return tv__seterr(err, TV_E_PROTOCOL, "OPEN: spec_len 0 (the spec is empty)");
    if (spec_len > TV__FP_MAX_SPEC)
        return tv__seterr(err, TV_E_PROTOCOL, "OPEN: spec_len %zu is over the limit %u", spec_len,
                          TV__FP_MAX_SPEC);
    return check_no_nul("OPEN", "spec", spec, spec_len, err);
}

static int check_opened(uint16_t version, const tv__fp_opened *o, tv_error *err)
{
    uint64_t slots_len = 0;
    uint32_t known = TV__FP_OPENED_FLAGS(version);
    if (o->flags & ~known) {
        if (known == 0)
            return tv__seterr(err, TV_E_PROTOCOL, "OPENED: reserved 0x%x must be 0", o->flags);
        return tv__seterr(err, TV_E_PROTOCOL,
                          "OPENED: flags 0x%x has reserved bits set (version %u defines 0x%x)",
                          o->flags, version, known);
    }
    if (o->open_id == 0)
        return tv__seterr(err, TV_E_PROTOCOL, "OPENED: open_id must be >= 1");
    if (o->handle == 0)
        return tv__seterr(err, TV_E_PROTOCOL, "OPENED: handle must be >= 1");
    if (o->slot_len == 0 || o->slot_len % FP_SLOT_ALIGN != 0)
        return tv__seterr(err, TV_E_PROTOCOL,
                          "OPENED: slot_len %u is not a positive multiple of %u", o->slot_len,
                          FP_SLOT_ALIGN);
    if (o->n_slots == 0)
        return tv__seterr(err, TV_E_PROTOCOL, "OPENED: n_slots must be >= 1");
    if (o->credit == 0)
        return tv__seterr(err, TV_E_PROTOCOL, "OPENED: credit must be >= 1");
    if (tv__mul_u64(o->n_slots, o->slot_len, &slots_len) || o->arena_len < slots_len)
        return tv__seterr(err, TV_E_PROTOCOL,
                          "OPENED: arena_len %" PRIu64 " is less than n_slots %u x slot_len %u",
                          o->arena_len, o->n_slots, o->slot_len);
    return 0;
}

static int check_close(uint16_t type, const tv__fp_close *c, tv_error *err)
{
    if (c->reserved != 0)
        return tv__seterr(err, TV_E_PROTOCOL, "%s: reserved 0x%x must be 0", tv__fp_type_name(type),
                          c->reserved);
    if (c->handle == 0)
        return tv__seterr(err, TV_E_PROTOCOL, "%s: handle must be >= 1", tv__fp_type_name(type));
    return 0;
}

/* The list body: READ and RELEASE name a handle (>= 1), CHUNK and DONE
 * carry it per entry (the body's handle is reserved, 0); n within 1..max. */
static int check_list(uint16_t type, uint32_t handle, uint32_t n, tv_error *err)
{
    uint32_t max_n = 0;
    list_ent_len(type, &max_n);
    const char *name = tv__fp_type_name(type);
    if (type == TV__FP_READ || type == TV__FP_RELEASE || type == TV__FP_RELEASE_VIEW) {
        if (handle == 0)
            return tv__seterr(err, TV_E_PROTOCOL, "%s: handle must be >= 1", name);
    } else if (handle != 0) {
        return tv__seterr(err, TV_E_PROTOCOL, "%s: handle %u must be 0 (entries carry it)", name,
                          handle);
    }
    if (n == 0)
        return tv__seterr(err, TV_E_PROTOCOL, "%s: n 0 (a list message has 1..%u entries)", name,
                          max_n);
    if (n > max_n)
        return tv__seterr(err, TV_E_PROTOCOL, "%s: n %u is over the limit %u", name, n, max_n);
    return 0;
}

/* READ entry flags: only the bits version defines (none in version 1). */
static int check_read_ent(uint16_t version, uint32_t i, const tv__fp_read_ent *e, tv_error *err)
{
    uint32_t known = TV__FP_READ_FLAGS(version);
    if (e->flags & ~known) {
        if (known == 0)
            return tv__seterr(err, TV_E_PROTOCOL, "READ: entry %u flags 0x%x must be 0", i,
                              e->flags);
        return tv__seterr(
            err, TV_E_PROTOCOL,
            "READ: entry %u flags 0x%x has reserved bits set (version %u defines 0x%x)", i,
            e->flags, version, known);
    }
    return 0;
}

/* A version the encoders write. */
static bool version_ok(uint16_t version)
{
    return version >= TV__FP_VERSION_MIN && version <= TV__FP_VERSION_MAX;
}

static int check_chunk_ent(uint32_t i, const tv__fp_chunk_ent *e, tv_error *err)
{
    uint64_t end = 0;
    if (e->handle == 0)
        return tv__seterr(err, TV_E_PROTOCOL, "CHUNK: entry %u handle must be >= 1", i);
    if (e->len == 0)
        return tv__seterr(err, TV_E_PROTOCOL, "CHUNK: entry %u len 0 (a chunk entry has >= 1 byte)",
                          i);
    if ((uint64_t)e->slot_off + e->len > UINT32_MAX)
        return tv__seterr(err, TV_E_PROTOCOL, "CHUNK: entry %u slot_off %u + len %u overflows", i,
                          e->slot_off, e->len);
    if (tv__add_u64(e->dest_off, e->len, &end))
        return tv__seterr(err, TV_E_PROTOCOL,
                          "CHUNK: entry %u dest_off %" PRIu64 " + len %u overflows", i, e->dest_off,
                          e->len);
    return 0;
}

static int check_done_ent(uint32_t i, const tv__fp_done_ent *e, tv_error *err)
{
    if (e->handle == 0)
        return tv__seterr(err, TV_E_PROTOCOL, "DONE: entry %u handle must be >= 1", i);
    if (e->result > 0)
        return tv__seterr(err, TV_E_PROTOCOL, "DONE: entry %u result %d must be 0 or an error code",
                          i, e->result);
    return 0;
}

static int check_error(int32_t code, uint32_t flags, size_t text_len, const char *text,
                       tv_error *err)
{
    if (code >= 0)
        return tv__seterr(err, TV_E_PROTOCOL, "ERROR: code %d must be negative", code);
    if (flags & ~TV__FP_ERROR_FATAL)
        return tv__seterr(err, TV_E_PROTOCOL, "ERROR: flags 0x%x has reserved bits set", flags);
    if (text_len > TV__FP_MAX_TEXT)
        return tv__seterr(err, TV_E_PROTOCOL, "ERROR: text_len %zu is over the limit %u", text_len,
                          TV__FP_MAX_TEXT);
    return check_no_nul("ERROR", "text", text, text_len, err);
}

/* ---- decoding ---- */

/* The 16-byte header of a datagram of len bytes: magic, the version (any
 * but 0 before the session negotiated one, else exactly `version`), the
 * length (the datagram's), reserved 0 and a known type. */
static int decode_header(const uint8_t *p, size_t len, uint16_t version, uint16_t *hver,
                         uint16_t *type, tv_error *err)
{
    if (len < TV__FP_HDR_LEN)
        return tv__seterr(err, TV_E_PROTOCOL,
                          "message of %zu bytes is shorter than the %u-byte header", len,
                          TV__FP_HDR_LEN);
    if (len > TV__FP_MAX_MSG)
        return tv__seterr(err, TV_E_PROTOCOL, "message of %zu bytes is over the limit %u", len,
                          TV__FP_MAX_MSG);
    uint32_t magic = tv__le32_get(p);
    uint32_t hlen = tv__le32_get(p + 8);
    uint32_t reserved = tv__le32_get(p + 12);
    *hver = tv__le16_get(p + 4);
    *type = tv__le16_get(p + 6);
    if (magic != TV__FP_MAGIC)
        return tv__seterr(err, TV_E_PROTOCOL, "header magic 0x%08x is not 0x%08x (\"TVFP\")", magic,
                          TV__FP_MAGIC);
    if (version == 0 && *hver == 0)
        return tv__seterr(err, TV_E_PROTOCOL, "header version 0 is not a protocol version");
    if (version != 0 && *hver != version)
        return tv__seterr(err, TV_E_VERSION, "header version %u, the session speaks version %u",
                          *hver, version);
    if (hlen != len)
        return tv__seterr(err, TV_E_PROTOCOL, "header length %u != datagram length %zu", hlen, len);
    if (reserved != 0)
        return tv__seterr(err, TV_E_PROTOCOL, "header reserved 0x%x must be 0", reserved);
    if (*type < TV__FP_HELLO || *type > TV__FP_MAX_TYPE(*hver))
        return tv__seterr(err, TV_E_PROTOCOL, "unknown message type %u", *type);
    return 0;
}

/* The bodies of one fixed size (HELLO, HELLO_OK, OPENED, CLOSE, CLOSED):
 * *want gets that size; the fields are decoded and checked only when the
 * body has it (the caller reports a length mismatch). */
static int decode_fixed(tv__fp_msg *out, const uint8_t *b, size_t body_len, size_t *want,
                        tv_error *err)
{
    switch (out->type) {
    case TV__FP_HELLO:
        if (body_len != (*want = TV__FP_HELLO_LEN))
            return 0;
        out->u.hello.min_version = tv__le16_get(b);
        out->u.hello.max_version = tv__le16_get(b + 2);
        out->u.hello.reserved = tv__le32_get(b + 4);
        return check_hello(&out->u.hello, err);
    case TV__FP_HELLO_OK:
        if (body_len != (*want = TV__FP_HELLO_OK_LEN))
            return 0;
        out->u.hello_ok.version = tv__le16_get(b);
        out->u.hello_ok.reserved0 = tv__le16_get(b + 2);
        out->u.hello_ok.max_msg_len = tv__le32_get(b + 4);
        out->u.hello_ok.max_requests = tv__le32_get(b + 8);
        out->u.hello_ok.max_handles = tv__le32_get(b + 12);
        out->u.hello_ok.session_id = tv__le64_get(b + 16);
        return check_hello_ok(&out->u.hello_ok, out->version, err);
    case TV__FP_OPENED:
        if (body_len != (*want = TV__FP_OPENED_LEN))
            return 0;
        out->u.opened.open_id = tv__le32_get(b);
        out->u.opened.handle = tv__le32_get(b + 4);
        out->u.opened.generation = (int64_t)tv__le64_get(b + 8);
        out->u.opened.snap_len = tv__le64_get(b + 16);
        out->u.opened.arena_len = tv__le64_get(b + 24);
        out->u.opened.slot_len = tv__le32_get(b + 32);
        out->u.opened.n_slots = tv__le32_get(b + 36);
        out->u.opened.credit = tv__le32_get(b + 40);
        out->u.opened.flags = tv__le32_get(b + 44);
        return check_opened(out->version, &out->u.opened, err);
    default: /* TV__FP_CLOSE, TV__FP_CLOSED */
        if (body_len != (*want = TV__FP_CLOSE_LEN))
            return 0;
        out->u.close.handle = tv__le32_get(b);
        out->u.close.reserved = tv__le32_get(b + 4);
        return check_close(out->type, &out->u.close, err);
    }
}

/* OPEN: the fixed part, then spec_len bytes of spec (*want: both). */
static int decode_open(tv__fp_msg *out, const uint8_t *b, size_t body_len, size_t *want,
                       tv_error *err)
{
    if (body_len < (*want = TV__FP_OPEN_LEN))
        return 0;
    out->u.open.open_id = tv__le32_get(b);
    out->u.open.spec_len = tv__le32_get(b + 4);
    if (out->u.open.spec_len > TV__FP_MAX_SPEC)
        return tv__seterr(err, TV_E_PROTOCOL, "OPEN: spec_len %u is over the limit %u",
                          out->u.open.spec_len, TV__FP_MAX_SPEC);
    if (body_len != (*want += out->u.open.spec_len))
        return 0;
    out->text = (const char *)(b + TV__FP_OPEN_LEN);
    out->text_len = out->u.open.spec_len;
    return check_open(out->u.open.open_id, out->text, out->text_len, err);
}

/* READ, CHUNK, DONE, RELEASE: the list body, then n entries of the type's
 * size, left encoded (tv__fp_*_entry decodes them one at a time). */
static int decode_list(tv__fp_msg *out, const uint8_t *b, size_t body_len, size_t *want,
                       tv_error *err)
{
    uint32_t max_n = 0;
    size_t ent_len = list_ent_len(out->type, &max_n);
    int rc;
    if (body_len < (*want = TV__FP_LIST_LEN))
        return 0;
    out->u.list.handle = tv__le32_get(b);
    out->u.list.n = tv__le32_get(b + 4);
    if ((rc = check_list(out->type, out->u.list.handle, out->u.list.n, err)))
        return rc;
    *want += (size_t)out->u.list.n * ent_len; /* n <= max_n: no overflow */
    if (body_len == *want)
        out->entries = b + TV__FP_LIST_LEN;
    return 0;
}

/* ERROR: the fixed part, then text_len bytes of text (*want: both). */
static int decode_error(tv__fp_msg *out, const uint8_t *b, size_t body_len, size_t *want,
                        tv_error *err)
{
    if (body_len < (*want = TV__FP_ERROR_LEN))
        return 0;
    out->u.error.code = (int32_t)tv__le32_get(b);
    out->u.error.flags = tv__le32_get(b + 4);
    out->u.error.req_id = tv__le64_get(b + 8);
    out->u.error.open_id = tv__le32_get(b + 16);
    out->u.error.text_len = tv__le32_get(b + 20);
    if (out->u.error.text_len > TV__FP_MAX_TEXT)
        return tv__seterr(err, TV_E_PROTOCOL, "ERROR: text_len %u is over the limit %u",
                          out->u.error.text_len, TV__FP_MAX_TEXT);
    if (body_len != (*want += out->u.error.text_len))
        return 0;
    out->text = (const char *)(b + TV__FP_ERROR_LEN);
    out->text_len = out->u.error.text_len;
    return check_error(out->u.error.code, out->u.error.flags, out->text_len, out->text, err);
}

int tv__fp_decode(const void *buf, size_t len, uint16_t version, tv__fp_msg *out, tv_error *err)
{
    uint16_t hver = 0, type = 0;
    size_t want = 0; /* the body length the fixed part says */
    int rc;
    if (!out || (!buf && len > 0))
        return tv__seterr(err, TV_E_INVALID_ARG, "fast-path decode: NULL buffer or message");
    memset(out, 0, sizeof *out);
    if ((rc = decode_header(buf, len, version, &hver, &type, err)))
        return rc;
    const uint8_t *b = (const uint8_t *)buf + TV__FP_HDR_LEN;
    size_t body_len = len - TV__FP_HDR_LEN;
    out->version = hver;
    out->type = type;
    out->len = (uint32_t)len;
    if (type == TV__FP_OPEN)
        rc = decode_open(out, b, body_len, &want, err);
    else if (type == TV__FP_ERROR)
        rc = decode_error(out, b, body_len, &want, err);
    else if (type == TV__FP_READ || type == TV__FP_CHUNK || type == TV__FP_DONE ||
             type == TV__FP_RELEASE || type == TV__FP_RELEASE_VIEW)
        rc = decode_list(out, b, body_len, &want, err);
    else
        rc = decode_fixed(out, b, body_len, &want, err);
    if (rc == 0 && body_len != want)
        rc = tv__seterr(err, TV_E_PROTOCOL, "%s: body of %zu bytes, the message needs %zu",
                        tv__fp_type_name(type), body_len, want);
    if (rc)
        memset(out, 0, sizeof *out);
    return rc;
}

/* The entry i of a decoded list message of the given type, or NULL with
 * TV_E_INVALID_ARG in err. */
static const uint8_t *entry_at(const tv__fp_msg *m, uint16_t type, uint32_t i, tv_error *err)
{
    uint32_t max_n = 0;
    size_t ent_len = list_ent_len(type, &max_n);
    if (!m || m->type != type || !m->entries) {
        tv__seterr(err, TV_E_INVALID_ARG, "fast-path: not a decoded %s message",
                   tv__fp_type_name(type));
        return NULL;
    }
    if (i >= m->u.list.n) {
        tv__seterr(err, TV_E_INVALID_ARG, "%s: entry %u of %u", tv__fp_type_name(type), i,
                   m->u.list.n);
        return NULL;
    }
    return m->entries + (size_t)i * ent_len;
}

int tv__fp_read_entry(const tv__fp_msg *m, uint32_t i, tv__fp_read_ent *out, tv_error *err)
{
    const uint8_t *e = entry_at(m, TV__FP_READ, i, err);
    if (!e)
        return TV_E_INVALID_ARG;
    if (!out)
        return tv__seterr(err, TV_E_INVALID_ARG, "READ: NULL entry");
    out->req_id = tv__le64_get(e);
    out->tensor = tv__le32_get(e + 8);
    out->flags = tv__le32_get(e + 12);
    out->off = tv__le64_get(e + 16);
    out->len = tv__le64_get(e + 24);
    return check_read_ent(m->version, i, out, err);
}

int tv__fp_chunk_entry(const tv__fp_msg *m, uint32_t i, tv__fp_chunk_ent *out, tv_error *err)
{
    const uint8_t *e = entry_at(m, TV__FP_CHUNK, i, err);
    if (!e)
        return TV_E_INVALID_ARG;
    if (!out)
        return tv__seterr(err, TV_E_INVALID_ARG, "CHUNK: NULL entry");
    out->req_id = tv__le64_get(e);
    out->handle = tv__le32_get(e + 8);
    out->slot = tv__le32_get(e + 12);
    out->slot_off = tv__le32_get(e + 16);
    out->len = tv__le32_get(e + 20);
    out->dest_off = tv__le64_get(e + 24);
    return check_chunk_ent(i, out, err);
}

int tv__fp_done_entry(const tv__fp_msg *m, uint32_t i, tv__fp_done_ent *out, tv_error *err)
{
    const uint8_t *e = entry_at(m, TV__FP_DONE, i, err);
    if (!e)
        return TV_E_INVALID_ARG;
    if (!out)
        return tv__seterr(err, TV_E_INVALID_ARG, "DONE: NULL entry");
    out->req_id = tv__le64_get(e);
    out->result = (int32_t)tv__le32_get(e + 8);
    out->handle = tv__le32_get(e + 12);
    return check_done_ent(i, out, err);
}

int tv__fp_release_entry(const tv__fp_msg *m, uint32_t i, uint32_t *slot, tv_error *err)
{
    const uint8_t *e = entry_at(
        m, m && m->type == TV__FP_RELEASE_VIEW ? TV__FP_RELEASE_VIEW : TV__FP_RELEASE, i, err);
    if (!e)
        return TV_E_INVALID_ARG;
    if (!slot)
        return tv__seterr(err, TV_E_INVALID_ARG, "RELEASE: NULL entry");
    *slot = tv__le32_get(e);
    return 0;
}

/* ---- encoding ---- */

/* Writes the header of a message of len bytes (len <= TV__FP_MAX_MSG). */
static void put_hdr(uint8_t *p, uint16_t version, uint16_t type, size_t len)
{
    tv__le32_put(p, TV__FP_MAGIC);
    tv__le16_put(p + 4, version);
    tv__le16_put(p + 6, type);
    tv__le32_put(p + 8, (uint32_t)len);
    tv__le32_put(p + 12, 0);
}

/* The total length of a message with a body of body_len bytes, or 0 when it
 * does not fit cap (or the datagram limit). */
static size_t fit(const void *buf, size_t cap, size_t body_len)
{
    size_t len = TV__FP_HDR_LEN + body_len;
    if (!buf || body_len > TV__FP_MAX_MSG - TV__FP_HDR_LEN || len > cap)
        return 0;
    return len;
}

size_t tv__fp_encode_hello(void *buf, size_t cap, uint16_t min_version, uint16_t max_version)
{
    tv__fp_hello h = {.min_version = min_version, .max_version = max_version};
    size_t len = fit(buf, cap, TV__FP_HELLO_LEN);
    if (!len || check_hello(&h, NULL))
        return 0;
    uint8_t *p = buf;
    put_hdr(p, min_version, TV__FP_HELLO, len);
    tv__le16_put(p + 16, min_version);
    tv__le16_put(p + 18, max_version);
    tv__le32_put(p + 20, 0);
    return len;
}

size_t tv__fp_encode_hello_ok(void *buf, size_t cap, const tv__fp_hello_ok *m)
{
    size_t len = fit(buf, cap, TV__FP_HELLO_OK_LEN);
    if (!len || !m || m->version == 0 || check_hello_ok(m, m->version, NULL))
        return 0;
    uint8_t *p = buf;
    put_hdr(p, m->version, TV__FP_HELLO_OK, len);
    tv__le16_put(p + 16, m->version);
    tv__le16_put(p + 18, 0);
    tv__le32_put(p + 20, m->max_msg_len);
    tv__le32_put(p + 24, m->max_requests);
    tv__le32_put(p + 28, m->max_handles);
    tv__le64_put(p + 32, m->session_id);
    return len;
}

size_t tv__fp_encode_open(void *buf, size_t cap, uint16_t version, uint32_t open_id,
                          const char *spec, size_t spec_len)
{
    if (!version_ok(version) || !spec || spec_len > TV__FP_MAX_SPEC ||
        check_open(open_id, spec, spec_len, NULL))
        return 0;
    size_t len = fit(buf, cap, TV__FP_OPEN_LEN + spec_len);
    if (!len)
        return 0;
    uint8_t *p = buf;
    put_hdr(p, version, TV__FP_OPEN, len);
    tv__le32_put(p + 16, open_id);
    tv__le32_put(p + 20, (uint32_t)spec_len);
    memcpy(p + 24, spec, spec_len);
    return len;
}

size_t tv__fp_encode_opened(void *buf, size_t cap, uint16_t version, const tv__fp_opened *m)
{
    size_t len = fit(buf, cap, TV__FP_OPENED_LEN);
    if (!len || !version_ok(version) || !m || check_opened(version, m, NULL))
        return 0;
    uint8_t *p = buf;
    put_hdr(p, version, TV__FP_OPENED, len);
    tv__le32_put(p + 16, m->open_id);
    tv__le32_put(p + 20, m->handle);
    tv__le64_put(p + 24, (uint64_t)m->generation);
    tv__le64_put(p + 32, m->snap_len);
    tv__le64_put(p + 40, m->arena_len);
    tv__le32_put(p + 48, m->slot_len);
    tv__le32_put(p + 52, m->n_slots);
    tv__le32_put(p + 56, m->credit);
    tv__le32_put(p + 60, m->flags);
    return len;
}

size_t tv__fp_encode_close(void *buf, size_t cap, uint16_t version, uint16_t type, uint32_t handle)
{
    tv__fp_close c = {.handle = handle};
    size_t len = fit(buf, cap, TV__FP_CLOSE_LEN);
    if (!len || !version_ok(version) || (type != TV__FP_CLOSE && type != TV__FP_CLOSED) ||
        check_close(type, &c, NULL))
        return 0;
    uint8_t *p = buf;
    put_hdr(p, version, type, len);
    tv__le32_put(p + 16, handle);
    tv__le32_put(p + 20, 0);
    return len;
}

/* Header and list body of a list message of n entries; 0 when it does not
 * fit or the counts are wrong. The entries are the caller's to write at
 * buf + 24. */
static size_t put_list(void *buf, size_t cap, uint16_t version, uint16_t type, uint32_t handle,
                       const void *e, uint32_t n)
{
    uint32_t max_n = 0;
    size_t ent_len = list_ent_len(type, &max_n);
    if (!version_ok(version) || !e || check_list(type, handle, n, NULL))
        return 0;
    size_t len = fit(buf, cap, TV__FP_LIST_LEN + (size_t)n * ent_len); /* n <= max_n */
    if (!len)
        return 0;
    uint8_t *p = buf;
    put_hdr(p, version, type, len);
    tv__le32_put(p + 16, handle);
    tv__le32_put(p + 20, n);
    return len;
}

size_t tv__fp_encode_read(void *buf, size_t cap, uint16_t version, uint32_t handle,
                          const tv__fp_read_ent *e, uint32_t n)
{
    size_t len = put_list(buf, cap, version, TV__FP_READ, handle, e, n);
    uint8_t *p = (uint8_t *)buf + TV__FP_HDR_LEN + TV__FP_LIST_LEN;
    for (uint32_t i = 0; len && i < n; i++, p += TV__FP_READ_ENT_LEN) {
        if (check_read_ent(version, i, &e[i], NULL))
            return 0;
        tv__le64_put(p, e[i].req_id);
        tv__le32_put(p + 8, e[i].tensor);
        tv__le32_put(p + 12, e[i].flags);
        tv__le64_put(p + 16, e[i].off);
        tv__le64_put(p + 24, e[i].len);
    }
    return len;
}

size_t tv__fp_encode_chunk(void *buf, size_t cap, uint16_t version, const tv__fp_chunk_ent *e,
                           uint32_t n)
{
    size_t len = put_list(buf, cap, version, TV__FP_CHUNK, 0, e, n);
    uint8_t *p = (uint8_t *)buf + TV__FP_HDR_LEN + TV__FP_LIST_LEN;
    for (uint32_t i = 0; len && i < n; i++, p += TV__FP_CHUNK_ENT_LEN) {
        if (check_chunk_ent(i, &e[i], NULL))
            return 0;
        tv__le64_put(p, e[i].req_id);
        tv__le32_put(p + 8, e[i].handle);
        tv__le32_put(p + 12, e[i].slot);
        tv__le32_put(p + 16, e[i].slot_off);
        tv__le32_put(p + 20, e[i].len);
        tv__le64_put(p + 24, e[i].dest_off);
    }
    return len;
}

size_t tv__fp_encode_done(void *buf, size_t cap, uint16_t version, const tv__fp_done_ent *e,
                          uint32_t n)
{
    size_t len = put_list(buf, cap, version, TV__FP_DONE, 0, e, n);
    uint8_t *p = (uint8_t *)buf + TV__FP_HDR_LEN + TV__FP_LIST_LEN;
    for (uint32_t i = 0; len && i < n; i++, p += TV__FP_DONE_ENT_LEN) {
        if (check_done_ent(i, &e[i], NULL))
            return 0;
        tv__le64_put(p, e[i].req_id);
        tv__le32_put(p + 8, (uint32_t)e[i].result);
        tv__le32_put(p + 12, e[i].handle);
    }
    return len;
}

size_t tv__fp_encode_release(void *buf, size_t cap, uint16_t version, uint32_t handle,
                             const uint32_t *slots, uint32_t n)
{
    size_t len = put_list(buf, cap, version, TV__FP_RELEASE, handle, slots, n);
    uint8_t *p = (uint8_t *)buf + TV__FP_HDR_LEN + TV__FP_LIST_LEN;
    for (uint32_t i = 0; len && i < n; i++, p += TV__FP_REL_ENT_LEN)
        tv__le32_put(p, slots[i]);
    return len;
}

size_t tv__fp_encode_release_view(void *buf, size_t cap, uint16_t version, uint32_t handle,
                                  const uint32_t *slots, uint32_t n)
{
    if (version < TV__FP_V3)
        return 0;
    size_t len = put_list(buf, cap, version, TV__FP_RELEASE_VIEW, handle, slots, n);
    uint8_t *p = (uint8_t *)buf + TV__FP_HDR_LEN + TV__FP_LIST_LEN;
    for (uint32_t i = 0; len && i < n; i++, p += TV__FP_REL_ENT_LEN)
        tv__le32_put(p, slots[i]);
    return len;
}

size_t tv__fp_encode_error(void *buf, size_t cap, uint16_t version, int32_t code, uint32_t flags,
                           uint64_t req_id, uint32_t open_id, const char *text, size_t text_len)
{
    if (!text)
        text_len = 0;
    if (text_len > TV__FP_MAX_TEXT) {
        /* Cut before a continuation byte: the text stays whole characters. */
        text_len = TV__FP_MAX_TEXT;
        while (text_len > 0 && ((unsigned char)text[text_len] & 0xC0) == 0x80)
            text_len--;
    }
    if (!version_ok(version) || check_error(code, flags, 0, NULL, NULL))
        return 0;
    size_t len = fit(buf, cap, TV__FP_ERROR_LEN + text_len);
    if (!len)
        return 0;
    uint8_t *p = buf;
    put_hdr(p, version, TV__FP_ERROR, len);
    tv__le32_put(p + 16, (uint32_t)code);
    tv__le32_put(p + 20, flags);
    tv__le64_put(p + 24, req_id);
    tv__le32_put(p + 32, open_id);
    tv__le32_put(p + 36, (uint32_t)text_len);
    for (size_t i = 0; i < text_len; i++)
        p[40 + i] = text[i] == '\0' ? '?' : (uint8_t)text[i];
    return len;
}

/* ---- the socket side ---- */

/* The type name of an encoded message, for messages about it. */
static const char *msg_name(const void *buf, size_t len)
{
    return len >= 8 ? tv__fp_type_name(tv__le16_get((const uint8_t *)buf + 6)) : "short";
}

int tv__fp_send(int sock, const void *buf, size_t len, const int *fds, size_t n_fds, tv_error *err)
{
    union {
        struct cmsghdr h;
        char b[CMSG_SPACE(sizeof(int) * TV__FP_N_FDS_OPENED)];
    } ctl;
    struct iovec iov = {.iov_base = (void *)(uintptr_t)buf, .iov_len = len};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    ssize_t n;
    int rc = 0;
    if (!buf || len == 0 || len > TV__FP_MAX_MSG || n_fds > TV__FP_N_FDS_OPENED ||
        (n_fds > 0 && !fds)) {
        rc = tv__seterr(
            err, TV_E_INVALID_ARG,
            "fast-path send: %zu bytes and %zu descriptors (1..%u bytes, 0..%u descriptors)", len,
            n_fds, TV__FP_MAX_MSG, TV__FP_N_FDS_OPENED);
        goto out;
    }
    if (n_fds > 0) {
        memset(&ctl, 0, sizeof ctl);
        mh.msg_control = ctl.b;
        mh.msg_controllen = CMSG_SPACE(sizeof(int) * n_fds);
        struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * n_fds);
        memcpy(CMSG_DATA(c), fds, sizeof(int) * n_fds);
    }
    while ((n = tv__sys.sendmsg(sock, &mh, MSG_NOSIGNAL)) < 0 && errno == EINTR)
        ;
    if (n < 0) {
        int e = errno == EWOULDBLOCK ? EAGAIN : errno;
        rc = tv__seterr(err, -e, "fast-path send of a %s message (%zu bytes) on socket %d: %s",
                        msg_name(buf, len), len, sock, strerror(e));
        goto out;
    }
    if ((size_t)n != len)
        rc = tv__seterr(err, TV_E_SHORT_IO,
                        "fast-path send of a %s message: %zd of %zu bytes went out",
                        msg_name(buf, len), n, len);
out:
    return rc;
}

/* Closes the descriptors of every SCM_RIGHTS message in mh from index keep
 * on (counting across messages) and copies the first keep (at most) to fds;
 * returns how many were kept. */
static size_t take_fds(struct msghdr *mh, int *fds, size_t keep)
{
    size_t seen = 0, kept = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(mh); c; c = CMSG_NXTHDR(mh, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS || c->cmsg_len < CMSG_LEN(0))
            continue;
        size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        const unsigned char *d = CMSG_DATA(c);
        for (size_t i = 0; i < n; i++, seen++) {
            int fd;
            memcpy(&fd, d + i * sizeof(int), sizeof fd);
            if (seen < keep && fds)
                fds[kept++] = fd;
            else
                tv__sys.close(fd);
        }
    }
    return kept;
}

ssize_t tv__fp_recv(int sock, void *buf, size_t cap, int *fds, size_t max_fds, size_t *n_fds,
                    tv_error *err)
{
    union {
        struct cmsghdr h;
        char b[CMSG_SPACE(sizeof(int) * FP_MAX_PEER_FDS)];
    } ctl;
    struct iovec iov = {.iov_base = buf, .iov_len = cap};
    struct msghdr mh = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b, .msg_controllen = sizeof ctl.b};
    ssize_t n;
    ssize_t rc = 0;
    if (n_fds)
        *n_fds = 0;
    if (!buf || cap == 0 || (max_fds > 0 && (!fds || !n_fds))) {
        rc = tv__seterr(err, TV_E_INVALID_ARG,
                        "fast-path receive: NULL buffer, no room or no descriptor array");
        goto out;
    }
    while ((n = tv__sys.recvmsg(sock, &mh, MSG_CMSG_CLOEXEC)) < 0 && errno == EINTR)
        ;
    if (n < 0) {
        int e = errno == EWOULDBLOCK ? EAGAIN : errno;
        rc = tv__seterr(err, -e, "fast-path receive on socket %d: %s", sock, strerror(e));
        goto out;
    }
    if (mh.msg_flags & MSG_CTRUNC) {
        take_fds(&mh, NULL, 0);
        rc = tv__seterr(
            err, TV_E_PROTOCOL,
            "fast-path receive on socket %d: control message cut (more than %d descriptors?)", sock,
            FP_MAX_PEER_FDS);
        goto out;
    }
    if (mh.msg_flags & MSG_TRUNC) {
        take_fds(&mh, NULL, 0);
        rc =
            tv__seterr(err, TV_E_PROTOCOL,
                       "fast-path receive on socket %d: datagram longer than %zu bytes", sock, cap);
        goto out;
    }
    if (n == 0) { /* orderly EOF (or an empty datagram, which no peer sends) */
        take_fds(&mh, NULL, 0);
        goto out;
    }
    size_t kept = take_fds(&mh, fds, max_fds);
    if (n_fds)
        *n_fds = kept;
    rc = n;
out:
    return rc;
}
