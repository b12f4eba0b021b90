/* Unit tests of the fast-path wire codec (core/src/wire/wire.c): every
 * message type round-trips (also at its largest), the bytes sit at the
 * offsets docs/fastpath.md gives, every malformed message is rejected
 * naming the field, encoders refuse what does not fit or what the decoder
 * would reject, and tv__fp_send / tv__fp_recv move one datagram with its
 * descriptors over a SOCK_SEQPACKET socketpair: descriptors kept are
 * close-on-exec, surplus ones are closed, an oversized datagram is
 * TV_E_PROTOCOL, EOF is 0, and failures of the tv__sys entries surface. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "wire/wire.h"
#include "util/endian.h"
#include "util/sys.h"

static uint8_t g_buf[TV__FP_MAX_MSG + 64];
static uint8_t g_rbuf[TV__FP_MAX_MSG + 64];

static int teardown(void **state)
{
    (void)state;
    tv__sys_reset();
    return 0;
}

/* ---- helpers ---- */

/* Writes a header (len = 16 + body_len) and body into b; returns the length. */
static size_t raw(uint8_t *b, uint16_t version, uint16_t type, const void *body, size_t body_len)
{
    tv__le32_put(b, TV__FP_MAGIC);
    tv__le16_put(b + 4, version);
    tv__le16_put(b + 6, type);
    tv__le32_put(b + 8, (uint32_t)(TV__FP_HDR_LEN + body_len));
    tv__le32_put(b + 12, 0);
    if (body_len)
        memcpy(b + TV__FP_HDR_LEN, body, body_len);
    return TV__FP_HDR_LEN + body_len;
}

/* Decodes and expects code with a message containing want. */
static void reject(const uint8_t *b, size_t len, uint16_t version, int code, const char *want)
{
    tv__fp_msg m;
    tv_error err = {0};
    int rc = tv__fp_decode(b, len, version, &m, &err);
    if (rc != code || !strstr(err.msg, want))
        fail_msg("decode: rc %d (%s) message '%s', want %d with '%s'", rc, tv_err_name(rc), err.msg,
                 code, want);
    assert_int_equal(err.code, code);
    assert_int_equal(m.type, 0); /* out is cleared on failure */
}

static void decode_ok(const uint8_t *b, size_t len, uint16_t version, tv__fp_msg *m)
{
    tv_error err = {0};
    int rc = tv__fp_decode(b, len, version, m, &err);
    if (rc != 0)
        fail_msg("decode: rc %d (%s) '%s'", rc, tv_err_name(rc), err.msg);
}

/* ---- round trips ---- */

static void test_roundtrip_hello(void **state)
{
    (void)state;
    tv__fp_msg m;
    size_t len = tv__fp_encode_hello(g_buf, sizeof g_buf, 1, 3);
    assert_int_equal(len, 24);
    static const uint8_t want[24] = {'T', 'V', 'F', 'P', 1, 0, 1, 0, 24, 0, 0, 0,
                                     0,   0,   0,   0,   1, 0, 3, 0, 0,  0, 0, 0};
    assert_memory_equal(g_buf, want, 24);
    decode_ok(g_buf, len, 0, &m);
    assert_int_equal(m.version, 1);
    assert_int_equal(m.type, TV__FP_HELLO);
    assert_int_equal(m.len, 24);
    assert_int_equal(m.u.hello.min_version, 1);
    assert_int_equal(m.u.hello.max_version, 3);
    assert_null(m.text);
    assert_null(m.entries);
    /* Before negotiation a HELLO of any header version decodes (a newer
     * client's); its body is checked all the same. */
    tv__le16_put(g_buf + 4, 9);
    decode_ok(g_buf, len, 0, &m);
    assert_int_equal(m.version, 9);
    assert_string_equal(tv__fp_type_name(TV__FP_HELLO), "HELLO");
}

static void test_roundtrip_hello_ok(void **state)
{
    (void)state;
    tv__fp_hello_ok h = {.version = 1,
                         .max_msg_len = TV__FP_MAX_MSG,
                         .max_requests = 16384,
                         .max_handles = 64,
                         .session_id = 0x1122334455667788ull};
    size_t len = tv__fp_encode_hello_ok(g_buf, sizeof g_buf, &h);
    assert_int_equal(len, 16 + 24);
    assert_int_equal(tv__le32_get(g_buf + 20), TV__FP_MAX_MSG);
    assert_int_equal(tv__le64_get(g_buf + 32), 0x1122334455667788ull);
    tv__fp_msg m;
    decode_ok(g_buf, len, 0, &m);
    assert_int_equal(m.type, TV__FP_HELLO_OK);
    assert_int_equal(m.u.hello_ok.version, 1);
    assert_int_equal(m.u.hello_ok.max_msg_len, TV__FP_MAX_MSG);
    assert_int_equal(m.u.hello_ok.max_requests, 16384);
    assert_int_equal(m.u.hello_ok.max_handles, 64);
    assert_int_equal(m.u.hello_ok.session_id, 0x1122334455667788ull);
    decode_ok(g_buf, len, 1, &m);
}

static void test_roundtrip_open(void **state)
{
    (void)state;
    tv__fp_msg m;
    size_t len = tv__fp_encode_open(g_buf, sizeof g_buf, TV__FP_V1, 42, "demo@prod", 9);
    assert_int_equal(len, 16 + 8 + 9);
    assert_int_equal(tv__le32_get(g_buf + 16), 42);
    assert_int_equal(tv__le32_get(g_buf + 20), 9);
    assert_memory_equal(g_buf + 24, "demo@prod", 9);
    decode_ok(g_buf, len, 1, &m);
    assert_int_equal(m.type, TV__FP_OPEN);
    assert_int_equal(m.u.open.open_id, 42);
    assert_int_equal(m.u.open.spec_len, 9);
    assert_int_equal(m.text_len, 9);
    assert_ptr_equal(m.text, (const char *)g_buf + 24);
    /* The longest spec. */
    char spec[TV__FP_MAX_SPEC];
    memset(spec, 'a', sizeof spec);
    len = tv__fp_encode_open(g_buf, sizeof g_buf, TV__FP_V1, 1, spec, sizeof spec);
    assert_int_equal(len, 16 + 8 + TV__FP_MAX_SPEC);
    decode_ok(g_buf, len, 1, &m);
    assert_int_equal(m.text_len, TV__FP_MAX_SPEC);
}

static void test_roundtrip_opened(void **state)
{
    (void)state;
    tv__fp_opened o = {.open_id = 3,
                       .handle = 1,
                       .generation = 12,
                       .snap_len = 123456,
                       .arena_len = 128ull << 20,
                       .slot_len = 1u << 20,
                       .n_slots = 128,
                       .credit = 32};
    size_t len = tv__fp_encode_opened(g_buf, sizeof g_buf, TV__FP_V1, &o);
    assert_int_equal(len, 16 + 48);
    assert_int_equal(tv__le64_get(g_buf + 24), 12);
    assert_int_equal(tv__le32_get(g_buf + 48), 1u << 20);
    assert_int_equal(tv__le32_get(g_buf + 56), 32);
    tv__fp_msg m;
    decode_ok(g_buf, len, 1, &m);
    assert_int_equal(m.type, TV__FP_OPENED);
    assert_int_equal(m.u.opened.open_id, 3);
    assert_int_equal(m.u.opened.handle, 1);
    assert_int_equal(m.u.opened.generation, 12);
    assert_int_equal(m.u.opened.snap_len, 123456);
    assert_int_equal(m.u.opened.arena_len, 128ull << 20);
    assert_int_equal(m.u.opened.slot_len, 1u << 20);
    assert_int_equal(m.u.opened.n_slots, 128);
    assert_int_equal(m.u.opened.credit, 32);
}

static void test_roundtrip_close(void **state)
{
    (void)state;
    tv__fp_msg m;
    size_t len = tv__fp_encode_close(g_buf, sizeof g_buf, TV__FP_V1, TV__FP_CLOSE, 7);
    assert_int_equal(len, 24);
    decode_ok(g_buf, len, 1, &m);
    assert_int_equal(m.type, TV__FP_CLOSE);
    assert_int_equal(m.u.close.handle, 7);
    len = tv__fp_encode_close(g_buf, sizeof g_buf, TV__FP_V1, TV__FP_CLOSED, 8);
    assert_int_equal(len, 24);
    decode_ok(g_buf, len, 1, &m);
    assert_int_equal(m.type, TV__FP_CLOSED);
    assert_int_equal(m.u.close.handle, 8);
    /* Only CLOSE and CLOSED. */
    assert_int_equal(tv__fp_encode_close(g_buf, sizeof g_buf, TV__FP_V1, TV__FP_OPEN, 8), 0);
}

static void test_roundtrip_read(void **state)
{
    (void)state;
    static tv__fp_read_ent e[TV__FP_MAX_READS];
    for (uint32_t i = 0; i < TV__FP_MAX_READS; i++)
        e[i] = (tv__fp_read_ent){.req_id = 1000 + i, .tensor = i * 3, .off = i, .len = 7ull * i};
    e[1].off = UINT64_MAX; /* the server checks ranges, not the codec */
    e[1].len = UINT64_MAX;
    size_t len = tv__fp_encode_read(g_buf, sizeof g_buf, TV__FP_V1, 5, e, 2);
    assert_int_equal(len, 16 + 8 + 2 * 32);
    assert_int_equal(tv__le64_get(g_buf + 24 + 32), 1001);
    assert_int_equal(tv__le64_get(g_buf + 24 + 32 + 16), UINT64_MAX);
    tv__fp_msg m;
    tv_error err = {0};
    decode_ok(g_buf, len, 1, &m);
    assert_int_equal(m.type, TV__FP_READ);
    assert_int_equal(m.u.list.handle, 5);
    assert_int_equal(m.u.list.n, 2);
    assert_ptr_equal(m.entries, g_buf + 24);
    tv__fp_read_ent got;
    assert_int_equal(tv__fp_read_entry(&m, 1, &got, &err), 0);
    assert_int_equal(got.req_id, 1001);
    assert_int_equal(got.off, UINT64_MAX);
    assert_int_equal(tv__fp_read_entry(&m, 0, &got, &err), 0);
    assert_int_equal(got.req_id, 1000);
    assert_int_equal(got.tensor, 0);
    assert_int_equal(got.len, 0);
    /* The fullest READ. */
    len = tv__fp_encode_read(g_buf, sizeof g_buf, TV__FP_V1, 5, e, TV__FP_MAX_READS);
    assert_int_equal(len, 16 + 8 + TV__FP_MAX_READS * 32);
    decode_ok(g_buf, len, 1, &m);
    for (uint32_t i = 2; i < TV__FP_MAX_READS; i++) {
        assert_int_equal(tv__fp_read_entry(&m, i, &got, &err), 0);
        assert_memory_equal(&got, &e[i], sizeof got);
    }
}

static void test_roundtrip_chunk(void **state)
{
    (void)state;
    static tv__fp_chunk_ent e[TV__FP_MAX_CHUNKS];
    for (uint32_t i = 0; i < TV__FP_MAX_CHUNKS; i++)
        e[i] = (tv__fp_chunk_ent){.req_id = i,
                                  .handle = 1 + i % 3,
                                  .slot = i,
                                  .slot_off = 4096 * (i % 4),
                                  .len = 1 + i,
                                  .dest_off = 1ull << 40 | i};
    size_t len = tv__fp_encode_chunk(g_buf, sizeof g_buf, TV__FP_V1, e, TV__FP_MAX_CHUNKS);
    assert_int_equal(len, 16 + 8 + TV__FP_MAX_CHUNKS * 32);
    assert_int_equal(tv__le32_get(g_buf + 16), 0); /* the list's handle: reserved */
    tv__fp_msg m;
    tv_error err = {0};
    decode_ok(g_buf, len, 1, &m);
    assert_int_equal(m.type, TV__FP_CHUNK);
    assert_int_equal(m.u.list.n, TV__FP_MAX_CHUNKS);
    for (uint32_t i = 0; i < TV__FP_MAX_CHUNKS; i++) {
        tv__fp_chunk_ent got;
        assert_int_equal(tv__fp_chunk_entry(&m, i, &got, &err), 0);
        assert_memory_equal(&got, &e[i], sizeof got);
    }
    /* Byte offsets of one entry. */
    const uint8_t *p = g_buf + 24 + 5 * 32;
    assert_int_equal(tv__le64_get(p), 5);
    assert_int_equal(tv__le32_get(p + 8), e[5].handle);
    assert_int_equal(tv__le32_get(p + 12), 5);
    assert_int_equal(tv__le32_get(p + 16), e[5].slot_off);
    assert_int_equal(tv__le32_get(p + 20), 6);
    assert_int_equal(tv__le64_get(p + 24), e[5].dest_off);
}

static void test_roundtrip_done(void **state)
{
    (void)state;
    static tv__fp_done_ent e[TV__FP_MAX_DONES];
    for (uint32_t i = 0; i < TV__FP_MAX_DONES; i++)
        e[i] = (tv__fp_done_ent){
            .req_id = UINT64_MAX - i, .result = i % 2 ? TV_E_CANCELLED : 0, .handle = 1 + i};
    size_t len = tv__fp_encode_done(g_buf, sizeof g_buf, TV__FP_V1, e, TV__FP_MAX_DONES);
    assert_int_equal(len, 16 + 8 + TV__FP_MAX_DONES * 16);
    assert_true(len <= TV__FP_MAX_MSG);
    tv__fp_msg m;
    tv_error err = {0};
    decode_ok(g_buf, len, 1, &m);
    assert_int_equal(m.type, TV__FP_DONE);
    assert_int_equal(m.u.list.n, TV__FP_MAX_DONES);
    for (uint32_t i = 0; i < TV__FP_MAX_DONES; i++) {
        tv__fp_done_ent got;
        assert_int_equal(tv__fp_done_entry(&m, i, &got, &err), 0);
        assert_memory_equal(&got, &e[i], sizeof got);
    }
    assert_int_equal((int32_t)tv__le32_get(g_buf + 24 + 16 + 8), TV_E_CANCELLED);
    /* One more does not fit a datagram. */
    static tv__fp_done_ent more[TV__FP_MAX_DONES + 1];
    for (uint32_t i = 0; i <= TV__FP_MAX_DONES; i++)
        more[i] = (tv__fp_done_ent){.req_id = i, .handle = 1};
    assert_int_equal(tv__fp_encode_done(g_buf, sizeof g_buf, TV__FP_V1, more, TV__FP_MAX_DONES + 1),
                     0);
}

static void test_roundtrip_release(void **state)
{
    (void)state;
    static uint32_t slots[TV__FP_MAX_RELEASE];
    for (uint32_t i = 0; i < TV__FP_MAX_RELEASE; i++)
        slots[i] = i * 7;
    size_t len =
        tv__fp_encode_release(g_buf, sizeof g_buf, TV__FP_V1, 2, slots, TV__FP_MAX_RELEASE);
    assert_int_equal(len, TV__FP_MAX_MSG); /* exactly a full datagram */
    tv__fp_msg m;
    tv_error err = {0};
    decode_ok(g_buf, len, 1, &m);
    assert_int_equal(m.type, TV__FP_RELEASE);
    assert_int_equal(m.u.list.handle, 2);
    for (uint32_t i = 0; i < TV__FP_MAX_RELEASE; i++) {
        uint32_t s = 0;
        assert_int_equal(tv__fp_release_entry(&m, i, &s, &err), 0);
        assert_int_equal(s, i * 7);
    }
}

static void test_roundtrip_error(void **state)
{
    (void)state;
    const char *text = "chunk 3 of demo tensor w: device 0 offset 4096: Input/output error";
    size_t tl = strlen(text);
    size_t len = tv__fp_encode_error(g_buf, sizeof g_buf, TV__FP_V1, -EIO, 0, 77, 0, text, tl);
    assert_int_equal(len, 16 + 24 + tl);
    tv__fp_msg m;
    decode_ok(g_buf, len, 1, &m);
    assert_int_equal(m.type, TV__FP_ERROR);
    assert_int_equal(m.u.error.code, -EIO);
    assert_int_equal(m.u.error.flags, 0);
    assert_int_equal(m.u.error.req_id, 77);
    assert_int_equal(m.u.error.open_id, 0);
    assert_int_equal(m.text_len, tl);
    assert_memory_equal(m.text, text, tl);
    /* Fatal, no text. */
    len = tv__fp_encode_error(g_buf, sizeof g_buf, TV__FP_V1, TV_E_PROTOCOL, TV__FP_ERROR_FATAL, 0,
                              9, NULL, 0);
    assert_int_equal(len, 40);
    decode_ok(g_buf, len, 1, &m);
    assert_int_equal(m.u.error.code, TV_E_PROTOCOL);
    assert_int_equal(m.u.error.flags, TV__FP_ERROR_FATAL);
    assert_int_equal(m.u.error.open_id, 9);
    assert_int_equal(m.text_len, 0);
    /* NUL bytes become '?'. */
    len = tv__fp_encode_error(g_buf, sizeof g_buf, TV__FP_V1, TV_E_BUSY, 0, 0, 0, "a\0b", 3);
    decode_ok(g_buf, len, 1, &m);
    assert_memory_equal(m.text, "a?b", 3);
    /* A long text is cut at TV__FP_MAX_TEXT, before a character that would
     * be split: 511 ASCII bytes then a 2-byte character. */
    char big[TV__FP_MAX_TEXT + 10];
    memset(big, 'x', sizeof big);
    big[TV__FP_MAX_TEXT - 1] = (char)0xc3;
    big[TV__FP_MAX_TEXT] = (char)0xa9;
    len = tv__fp_encode_error(g_buf, sizeof g_buf, TV__FP_V1, -EIO, 0, 0, 0, big, sizeof big);
    decode_ok(g_buf, len, 1, &m);
    assert_int_equal(m.text_len, TV__FP_MAX_TEXT - 1);
    /* Without a split character: exactly the limit. */
    memset(big, 'y', sizeof big);
    len = tv__fp_encode_error(g_buf, sizeof g_buf, TV__FP_V1, -EIO, 0, 0, 0, big, sizeof big);
    decode_ok(g_buf, len, 1, &m);
    assert_int_equal(m.text_len, TV__FP_MAX_TEXT);
    /* Codes must be errors, flags known. */
    assert_int_equal(tv__fp_encode_error(g_buf, sizeof g_buf, TV__FP_V1, 0, 0, 0, 0, "x", 1), 0);
    assert_int_equal(tv__fp_encode_error(g_buf, sizeof g_buf, TV__FP_V1, -EIO, 2, 0, 0, "x", 1), 0);
}

static void test_type_names(void **state)
{
    (void)state;
    static const char *const names[] = {"UNKNOWN", "HELLO", "HELLO_OK", "OPEN", "OPENED",  "CLOSE",
                                        "CLOSED",  "READ",  "CHUNK",    "DONE", "RELEASE", "ERROR"};
    for (uint16_t t = 0; t < TV_ARRAY_LEN(names); t++)
        assert_string_equal(tv__fp_type_name(t), names[t]);
    assert_string_equal(tv__fp_type_name(12), "RELEASE_VIEW");
    assert_string_equal(tv__fp_type_name(13), "UNKNOWN");
    assert_string_equal(tv__fp_type_name(0xffff), "UNKNOWN");
}

/* ---- rejections ---- */

static void test_reject_header(void **state)
{
    (void)state;
    uint8_t b[64];
    uint8_t body[8] = {1, 0, 1, 0};
    size_t len = raw(b, 1, TV__FP_HELLO, body, 8);
    tv__fp_msg m;
    decode_ok(b, len, 0, &m);

    reject(b, 15, 0, TV_E_PROTOCOL, "shorter than the 16-byte header");
    reject(b, 0, 0, TV_E_PROTOCOL, "message of 0 bytes");
    reject(g_buf, TV__FP_MAX_MSG + 1, 1, TV_E_PROTOCOL, "over the limit 65536");
    b[0] = 'X';
    reject(b, len, 0, TV_E_PROTOCOL, "header magic");
    b[0] = 'T';
    /* Version 0 is never a version; another version after negotiation is
     * TV_E_VERSION. */
    tv__le16_put(b + 4, 0);
    reject(b, len, 0, TV_E_PROTOCOL, "header version 0");
    reject(b, len, 1, TV_E_VERSION, "header version 0, the session speaks version 1");
    tv__le16_put(b + 4, 2);
    reject(b, len, 1, TV_E_VERSION, "header version 2, the session speaks version 1");
    tv__le16_put(b + 4, 1);
    /* The header's length must be the datagram's. */
    reject(b, len - 1, 0, TV_E_PROTOCOL, "header length 24 != datagram length 23");
    tv__le32_put(b + 8, 25);
    reject(b, len, 0, TV_E_PROTOCOL, "header length 25 != datagram length 24");
    tv__le32_put(b + 8, 24);
    tv__le32_put(b + 12, 0x10);
    reject(b, len, 0, TV_E_PROTOCOL, "header reserved 0x10 must be 0");
    tv__le32_put(b + 12, 0);
    tv__le16_put(b + 6, 0);
    reject(b, len, 0, TV_E_PROTOCOL, "unknown message type 0");
    tv__le16_put(b + 6, 12);
    reject(b, len, 0, TV_E_PROTOCOL, "unknown message type 12");
    tv__le16_put(b + 6, 0x8001);
    reject(b, len, 1, TV_E_PROTOCOL, "unknown message type 32769");

    /* Bad arguments. */
    tv_error err = {0};
    assert_int_equal(tv__fp_decode(NULL, 16, 0, &m, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv__fp_decode(b, len, 0, NULL, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv__fp_decode(NULL, 0, 0, &m, &err), TV_E_PROTOCOL);
}

static void test_reject_fixed_bodies(void **state)
{
    (void)state;
    uint8_t b[128], body[64] = {0};
    /* Every fixed-size type with a body one byte short and one byte long. */
    static const struct {
        uint16_t type;
        size_t len;
    } fixed[] = {{TV__FP_HELLO, 8},
                 {TV__FP_HELLO_OK, 24},
                 {TV__FP_OPENED, 48},
                 {TV__FP_CLOSE, 8},
                 {TV__FP_CLOSED, 8}};
    for (size_t i = 0; i < TV_ARRAY_LEN(fixed); i++) {
        char want[64];
        snprintf(want, sizeof want, "%s: body of %zu bytes, the message needs %zu",
                 tv__fp_type_name(fixed[i].type), fixed[i].len + 1, fixed[i].len);
        reject(b, raw(b, 1, fixed[i].type, body, fixed[i].len + 1), 1, TV_E_PROTOCOL, want);
        snprintf(want, sizeof want, "%s: body of %zu bytes, the message needs %zu",
                 tv__fp_type_name(fixed[i].type), fixed[i].len - 1, fixed[i].len);
        reject(b, raw(b, 1, fixed[i].type, body, fixed[i].len - 1), 1, TV_E_PROTOCOL, want);
    }
    /* Variable types shorter than their fixed part. */
    reject(b, raw(b, 1, TV__FP_OPEN, body, 7), 1, TV_E_PROTOCOL, "OPEN: body of 7 bytes");
    reject(b, raw(b, 1, TV__FP_ERROR, body, 23), 1, TV_E_PROTOCOL, "ERROR: body of 23 bytes");
    reject(b, raw(b, 1, TV__FP_READ, body, 0), 1, TV_E_PROTOCOL, "READ: body of 0 bytes");
    reject(b, raw(b, 1, TV__FP_DONE, body, 4), 1, TV_E_PROTOCOL, "DONE: body of 4 bytes");

    /* HELLO: reserved, min 0, min > max. */
    uint8_t h[8] = {1, 0, 1, 0, 0, 0, 0, 1};
    reject(b, raw(b, 1, TV__FP_HELLO, h, 8), 0, TV_E_PROTOCOL,
           "HELLO: reserved 0x1000000 must be 0");
    uint8_t h0[8] = {0, 0, 1, 0};
    reject(b, raw(b, 1, TV__FP_HELLO, h0, 8), 0, TV_E_PROTOCOL, "HELLO: min_version 0");
    uint8_t h2[8] = {3, 0, 2, 0};
    reject(b, raw(b, 1, TV__FP_HELLO, h2, 8), 0, TV_E_PROTOCOL,
           "HELLO: min_version 3 > max_version 2");

    /* HELLO_OK: reserved0, version != header, limits. */
    tv__fp_hello_ok ok = {
        .version = 1, .max_msg_len = TV__FP_MAX_MSG, .max_requests = 1, .max_handles = 1};
    size_t len = tv__fp_encode_hello_ok(b, sizeof b, &ok);
    assert_int_equal(len, 40);
    tv__le16_put(b + 18, 1);
    reject(b, len, 0, TV_E_PROTOCOL, "HELLO_OK: reserved0 0x1 must be 0");
    tv__le16_put(b + 18, 0);
    tv__le16_put(b + 16, 2);
    reject(b, len, 0, TV_E_PROTOCOL, "HELLO_OK: version 2 != header version 1");
    tv__le16_put(b + 16, 1);
    tv__le32_put(b + 20, 100);
    reject(b, len, 0, TV_E_PROTOCOL, "HELLO_OK: max_msg_len 100 is below");
    tv__le32_put(b + 20, TV__FP_MAX_MSG);
    tv__le32_put(b + 24, 0);
    reject(b, len, 0, TV_E_PROTOCOL, "HELLO_OK: max_requests must be >= 1");
    tv__le32_put(b + 24, 1);
    tv__le32_put(b + 28, 0);
    reject(b, len, 0, TV_E_PROTOCOL, "HELLO_OK: max_handles must be >= 1");

    /* OPENED: reserved, ids, slot geometry, arena size. */
    tv__fp_opened o = {.open_id = 1,
                       .handle = 1,
                       .generation = 1,
                       .arena_len = 8192,
                       .slot_len = 4096,
                       .n_slots = 2,
                       .credit = 1};
    len = tv__fp_encode_opened(b, sizeof b, TV__FP_V1, &o);
    assert_int_equal(len, 64);
    static const struct {
        size_t off;
        uint32_t v;
        const char *want;
    } bad[] = {
        {60, 5, "OPENED: reserved 0x5 must be 0"},
        {16, 0, "OPENED: open_id must be >= 1"},
        {20, 0, "OPENED: handle must be >= 1"},
        {48, 0, "OPENED: slot_len 0 is not a positive multiple of 4096"},
        {48, 4097, "OPENED: slot_len 4097 is not a positive multiple of 4096"},
        {52, 0, "OPENED: n_slots must be >= 1"},
        {56, 0, "OPENED: credit must be >= 1"},
        {52, 3, "OPENED: arena_len 8192 is less than n_slots 3 x slot_len 4096"},
    };
    for (size_t i = 0; i < TV_ARRAY_LEN(bad); i++) {
        uint8_t c[64];
        memcpy(c, b, len);
        tv__le32_put(c + bad[i].off, bad[i].v);
        reject(c, len, 1, TV_E_PROTOCOL, bad[i].want);
        /* and the encoder refuses the same */
        tv__fp_msg m;
        tv_error err = {0};
        if (tv__fp_decode(c, len, 1, &m, &err) == TV_E_PROTOCOL) {
            tv__fp_opened oo = o;
            oo.flags = bad[i].off == 60 ? bad[i].v : 0;
            oo.open_id = bad[i].off == 16 ? bad[i].v : o.open_id;
            oo.handle = bad[i].off == 20 ? bad[i].v : o.handle;
            oo.slot_len = bad[i].off == 48 ? bad[i].v : o.slot_len;
            oo.n_slots = bad[i].off == 52 ? bad[i].v : o.n_slots;
            oo.credit = bad[i].off == 56 ? bad[i].v : o.credit;
            assert_int_equal(tv__fp_encode_opened(c, sizeof c, TV__FP_V1, &oo), 0);
        }
    }
    /* n_slots x slot_len overflowing 64 bits cannot happen (32 x 32 bits),
     * but the largest product must still be checked against arena_len. */
    o.n_slots = UINT32_MAX;
    o.slot_len = 0xfffff000u;
    o.arena_len = UINT64_MAX;
    assert_int_equal(tv__fp_encode_opened(b, sizeof b, TV__FP_V1, &o), 64);

    /* CLOSE / CLOSED: reserved, handle 0. */
    len = tv__fp_encode_close(b, sizeof b, TV__FP_V1, TV__FP_CLOSE, 1);
    tv__le32_put(b + 20, 2);
    reject(b, len, 1, TV_E_PROTOCOL, "CLOSE: reserved 0x2 must be 0");
    tv__le32_put(b + 20, 0);
    tv__le32_put(b + 16, 0);
    reject(b, len, 1, TV_E_PROTOCOL, "CLOSE: handle must be >= 1");
    tv__le16_put(b + 6, TV__FP_CLOSED);
    reject(b, len, 1, TV_E_PROTOCOL, "CLOSED: handle must be >= 1");
    assert_int_equal(tv__fp_encode_close(b, sizeof b, TV__FP_V1, TV__FP_CLOSED, 0), 0);
}

static void test_reject_open(void **state)
{
    (void)state;
    uint8_t b[1024];
    size_t len = tv__fp_encode_open(b, sizeof b, TV__FP_V1, 1, "demo", 4);
    tv__fp_msg m;
    decode_ok(b, len, 1, &m);
    /* spec with a NUL */
    b[24 + 2] = '\0';
    reject(b, len, 1, TV_E_PROTOCOL, "OPEN: spec has a NUL byte at offset 2");
    assert_int_equal(tv__fp_encode_open(b, sizeof b, TV__FP_V1, 1, "de\0o", 4), 0);
    /* empty spec */
    len = raw(b, 1, TV__FP_OPEN, (uint8_t[8]){1}, 8);
    reject(b, len, 1, TV_E_PROTOCOL, "OPEN: spec_len 0 (the spec is empty)");
    assert_int_equal(tv__fp_encode_open(b, sizeof b, TV__FP_V1, 1, "", 0), 0);
    /* open_id 0 */
    len = tv__fp_encode_open(b, sizeof b, TV__FP_V1, 1, "demo", 4);
    tv__le32_put(b + 16, 0);
    reject(b, len, 1, TV_E_PROTOCOL, "OPEN: open_id must be >= 1");
    assert_int_equal(tv__fp_encode_open(b, sizeof b, TV__FP_V1, 0, "demo", 4), 0);
    /* spec_len not matching the message */
    len = tv__fp_encode_open(b, sizeof b, TV__FP_V1, 1, "demo", 4);
    tv__le32_put(b + 20, 5);
    reject(b, len, 1, TV_E_PROTOCOL, "OPEN: body of 12 bytes, the message needs 13");
    tv__le32_put(b + 20, 3);
    reject(b, len, 1, TV_E_PROTOCOL, "OPEN: body of 12 bytes, the message needs 11");
    /* spec too long: rejected on the length field before anything else */
    char spec[TV__FP_MAX_SPEC + 1];
    memset(spec, 's', sizeof spec);
    assert_int_equal(tv__fp_encode_open(b, sizeof b, TV__FP_V1, 1, spec, sizeof spec), 0);
    uint8_t body[8 + TV__FP_MAX_SPEC + 1];
    tv__le32_put(body, 1);
    tv__le32_put(body + 4, TV__FP_MAX_SPEC + 1);
    memcpy(body + 8, spec, sizeof spec);
    len = raw(b, 1, TV__FP_OPEN, body, sizeof body);
    reject(b, len, 1, TV_E_PROTOCOL, "OPEN: spec_len 513 is over the limit 512");
    tv__le32_put(b + 20, UINT32_MAX);
    reject(b, len, 1, TV_E_PROTOCOL, "OPEN: spec_len 4294967295 is over the limit 512");
    assert_int_equal(tv__fp_encode_open(b, sizeof b, TV__FP_V1, 1, NULL, 3), 0);
}

static void test_reject_error(void **state)
{
    (void)state;
    uint8_t b[1024];
    size_t len = tv__fp_encode_error(b, sizeof b, TV__FP_V1, -EIO, 0, 1, 0, "boom", 4);
    tv__fp_msg m;
    decode_ok(b, len, 1, &m);
    b[40 + 3] = '\0';
    reject(b, len, 1, TV_E_PROTOCOL, "ERROR: text has a NUL byte at offset 3");
    b[40 + 3] = 'm';
    tv__le32_put(b + 16, 0);
    reject(b, len, 1, TV_E_PROTOCOL, "ERROR: code 0 must be negative");
    tv__le32_put(b + 16, 5);
    reject(b, len, 1, TV_E_PROTOCOL, "ERROR: code 5 must be negative");
    tv__le32_put(b + 16, (uint32_t)-EIO);
    tv__le32_put(b + 20, 3);
    reject(b, len, 1, TV_E_PROTOCOL, "ERROR: flags 0x3 has reserved bits set");
    tv__le32_put(b + 20, 1);
    decode_ok(b, len, 1, &m);
    tv__le32_put(b + 36, 5);
    reject(b, len, 1, TV_E_PROTOCOL, "ERROR: body of 28 bytes, the message needs 29");
    /* text too long */
    uint8_t body[24 + TV__FP_MAX_TEXT + 1];
    memset(body, 't', sizeof body);
    tv__le32_put(body, (uint32_t)-EIO);
    tv__le32_put(body + 4, 0);
    tv__le64_put(body + 8, 0);
    tv__le32_put(body + 16, 0);
    tv__le32_put(body + 20, TV__FP_MAX_TEXT + 1);
    len = raw(b, 1, TV__FP_ERROR, body, sizeof body);
    reject(b, len, 1, TV_E_PROTOCOL, "ERROR: text_len 513 is over the limit 512");
    tv__le32_put(body + 20, TV__FP_MAX_TEXT);
    len = raw(b, 1, TV__FP_ERROR, body, sizeof body - 1);
    decode_ok(b, len, 1, &m);
    assert_int_equal(m.text_len, TV__FP_MAX_TEXT);
}

static void test_reject_lists(void **state)
{
    (void)state;
    static const struct {
        uint16_t type;
        size_t ent_len;
        uint32_t max_n;
        uint32_t handle; /* a valid list handle */
    } lists[] = {
        {TV__FP_READ, 32, TV__FP_MAX_READS, 1},
        {TV__FP_CHUNK, 32, TV__FP_MAX_CHUNKS, 0},
        {TV__FP_DONE, 16, TV__FP_MAX_DONES, 0},
        {TV__FP_RELEASE, 4, TV__FP_MAX_RELEASE, 1},
    };
    static uint8_t body[TV__FP_MAX_MSG];
    char want[128];
    for (size_t i = 0; i < TV_ARRAY_LEN(lists); i++) {
        const char *name = tv__fp_type_name(lists[i].type);
        /* Entries that are valid for every type: a handle field of 1 and a
         * CHUNK len of 1 (byte 20 of a 32-byte entry, byte 12 of DONE's). */
        memset(body, 0, sizeof body);
        for (uint32_t k = 0; 8 + (k + 1) * lists[i].ent_len <= sizeof body; k++) {
            uint8_t *e = body + 8 + k * lists[i].ent_len;
            if (lists[i].ent_len == 32) {
                tv__le32_put(e + 8, 1); /* CHUNK handle / READ tensor */
                tv__le32_put(e + 20, lists[i].type == TV__FP_CHUNK ? 1 : 0);
            } else if (lists[i].ent_len == 16) {
                tv__le32_put(e + 12, 1); /* DONE handle */
            }
        }
        tv__le32_put(body, lists[i].handle);
        /* n over the limit (and the bytes for it: too long for a datagram
         * for every type but still rejected on n first when it fits) */
        tv__le32_put(body + 4, lists[i].max_n + 1);
        size_t blen = 8 + (size_t)(lists[i].max_n + 1) * lists[i].ent_len;
        if (TV__FP_HDR_LEN + blen > TV__FP_MAX_MSG)
            blen = TV__FP_MAX_MSG - TV__FP_HDR_LEN;
        snprintf(want, sizeof want, "%s: n %u is over the limit %u", name, lists[i].max_n + 1,
                 lists[i].max_n);
        reject(g_buf, raw(g_buf, 1, lists[i].type, body, blen), 1, TV_E_PROTOCOL, want);
        tv__le32_put(body + 4, UINT32_MAX);
        reject(g_buf, raw(g_buf, 1, lists[i].type, body, 8 + lists[i].ent_len), 1, TV_E_PROTOCOL,
               "is over the limit");
        /* n 0 */
        tv__le32_put(body + 4, 0);
        snprintf(want, sizeof want, "%s: n 0", name);
        reject(g_buf, raw(g_buf, 1, lists[i].type, body, 8), 1, TV_E_PROTOCOL, want);
        /* the full limit decodes */
        tv__le32_put(body + 4, lists[i].max_n);
        tv__fp_msg m;
        decode_ok(g_buf,
                  raw(g_buf, 1, lists[i].type, body, 8 + (size_t)lists[i].max_n * lists[i].ent_len),
                  1, &m);
        assert_int_equal(m.u.list.n, lists[i].max_n);
        /* n that does not fill the message, either way */
        tv__le32_put(body + 4, 3);
        snprintf(want, sizeof want, "%s: body of %zu bytes, the message needs %zu", name,
                 8 + 2 * lists[i].ent_len, 8 + 3 * lists[i].ent_len);
        reject(g_buf, raw(g_buf, 1, lists[i].type, body, 8 + 2 * lists[i].ent_len), 1,
               TV_E_PROTOCOL, want);
        snprintf(want, sizeof want, "%s: body of %zu bytes, the message needs %zu", name,
                 8 + 4 * lists[i].ent_len, 8 + 3 * lists[i].ent_len);
        reject(g_buf, raw(g_buf, 1, lists[i].type, body, 8 + 4 * lists[i].ent_len), 1,
               TV_E_PROTOCOL, want);
        snprintf(want, sizeof want, "%s: body of %zu bytes", name, 8 + 3 * lists[i].ent_len - 1);
        reject(g_buf, raw(g_buf, 1, lists[i].type, body, 8 + 3 * lists[i].ent_len - 1), 1,
               TV_E_PROTOCOL, want);
        /* the list handle: READ/RELEASE need one, CHUNK/DONE reserve it */
        tv__le32_put(body, lists[i].handle ? 0 : 4);
        if (lists[i].handle)
            snprintf(want, sizeof want, "%s: handle must be >= 1", name);
        else
            snprintf(want, sizeof want, "%s: handle 4 must be 0 (entries carry it)", name);
        reject(g_buf, raw(g_buf, 1, lists[i].type, body, 8 + 3 * lists[i].ent_len), 1,
               TV_E_PROTOCOL, want);
    }
}

static void test_reject_entries(void **state)
{
    (void)state;
    tv__fp_msg m;
    tv_error err = {0};
    /* READ flags */
    tv__fp_read_ent r[5] = {{.req_id = 1}, {.req_id = 2}, {.req_id = 3}, {.req_id = 4}};
    size_t len = tv__fp_encode_read(g_buf, sizeof g_buf, TV__FP_V1, 1, r, 5);
    tv__le32_put(g_buf + 24 + 3 * 32 + 12, 2);
    decode_ok(g_buf, len, 1, &m);
    tv__fp_read_ent re;
    assert_int_equal(tv__fp_read_entry(&m, 2, &re, &err), 0);
    assert_int_equal(tv__fp_read_entry(&m, 3, &re, &err), TV_E_PROTOCOL);
    assert_string_equal(err.msg, "READ: entry 3 flags 0x2 must be 0");
    r[3].flags = 2;
    assert_int_equal(tv__fp_encode_read(g_buf, sizeof g_buf, TV__FP_V1, 1, r, 5), 0);
    /* wrong type, index out of range, NULL out */
    assert_int_equal(tv__fp_read_entry(&m, 5, &re, &err), TV_E_INVALID_ARG);
    assert_string_equal(err.msg, "READ: entry 5 of 5");
    assert_int_equal(tv__fp_chunk_entry(&m, 0, &(tv__fp_chunk_ent){0}, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv__fp_done_entry(&m, 0, &(tv__fp_done_ent){0}, &err), TV_E_INVALID_ARG);
    uint32_t slot;
    assert_int_equal(tv__fp_release_entry(&m, 0, &slot, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv__fp_read_entry(NULL, 0, &re, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv__fp_read_entry(&m, 0, NULL, &err), TV_E_INVALID_ARG);

    /* CHUNK: len 0, handle 0, slot_off + len and dest_off + len overflow */
    tv__fp_chunk_ent c[2] = {{.req_id = 1, .handle = 1, .slot = 0, .len = 10},
                             {.req_id = 2, .handle = 1, .slot = 1, .len = 10}};
    len = tv__fp_encode_chunk(g_buf, sizeof g_buf, TV__FP_V1, c, 2);
    assert_int_equal(len, 24 + 64);
    uint8_t *e1 = g_buf + 24 + 32;
    tv__fp_chunk_ent ce;
    tv__le32_put(e1 + 20, 0);
    decode_ok(g_buf, len, 1, &m);
    assert_int_equal(tv__fp_chunk_entry(&m, 0, &ce, &err), 0);
    assert_int_equal(tv__fp_chunk_entry(&m, 1, &ce, &err), TV_E_PROTOCOL);
    assert_string_equal(err.msg, "CHUNK: entry 1 len 0 (a chunk entry has >= 1 byte)");
    tv__le32_put(e1 + 20, 10);
    tv__le32_put(e1 + 8, 0);
    assert_int_equal(tv__fp_chunk_entry(&m, 1, &ce, &err), TV_E_PROTOCOL);
    assert_string_equal(err.msg, "CHUNK: entry 1 handle must be >= 1");
    tv__le32_put(e1 + 8, 1);
    tv__le32_put(e1 + 16, UINT32_MAX - 5);
    assert_int_equal(tv__fp_chunk_entry(&m, 1, &ce, &err), TV_E_PROTOCOL);
    assert_non_null(strstr(err.msg, "CHUNK: entry 1 slot_off 4294967290 + len 10 overflows"));
    tv__le32_put(e1 + 16, 0);
    tv__le64_put(e1 + 24, UINT64_MAX - 5);
    assert_int_equal(tv__fp_chunk_entry(&m, 1, &ce, &err), TV_E_PROTOCOL);
    assert_non_null(strstr(err.msg, "CHUNK: entry 1 dest_off"));
    c[1].len = 0;
    assert_int_equal(tv__fp_encode_chunk(g_buf, sizeof g_buf, TV__FP_V1, c, 2), 0);
    c[1].len = 10;
    c[1].handle = 0;
    assert_int_equal(tv__fp_encode_chunk(g_buf, sizeof g_buf, TV__FP_V1, c, 2), 0);

    /* DONE: handle 0, positive result */
    tv__fp_done_ent d[1] = {{.req_id = 1, .result = 0, .handle = 1}};
    len = tv__fp_encode_done(g_buf, sizeof g_buf, TV__FP_V1, d, 1);
    tv__fp_done_ent de;
    tv__le32_put(g_buf + 24 + 8, 3);
    decode_ok(g_buf, len, 1, &m);
    assert_int_equal(tv__fp_done_entry(&m, 0, &de, &err), TV_E_PROTOCOL);
    assert_string_equal(err.msg, "DONE: entry 0 result 3 must be 0 or an error code");
    tv__le32_put(g_buf + 24 + 8, 0);
    tv__le32_put(g_buf + 24 + 12, 0);
    assert_int_equal(tv__fp_done_entry(&m, 0, &de, &err), TV_E_PROTOCOL);
    assert_string_equal(err.msg, "DONE: entry 0 handle must be >= 1");
    d[0].result = 1;
    assert_int_equal(tv__fp_encode_done(g_buf, sizeof g_buf, TV__FP_V1, d, 1), 0);
}

/* ---- encoders and capacity ---- */

static void test_encode_capacity(void **state)
{
    (void)state;
    uint8_t b[256];
    tv__fp_hello_ok ok = {
        .version = 1, .max_msg_len = TV__FP_MAX_MSG, .max_requests = 1, .max_handles = 1};
    tv__fp_opened o = {
        .open_id = 1, .handle = 1, .arena_len = 4096, .slot_len = 4096, .n_slots = 1, .credit = 1};
    tv__fp_read_ent r[2] = {{.req_id = 1}, {.req_id = 2}};
    tv__fp_chunk_ent c[2] = {{.handle = 1, .len = 1}, {.handle = 1, .len = 1}};
    tv__fp_done_ent d[2] = {{.handle = 1}, {.handle = 1}};
    uint32_t s[2] = {0, 1};
    for (int t = 0; t < 11; t++) {
        size_t want = 0, got = 0;
        for (size_t cap = 0; cap <= sizeof b; cap++) {
            memset(b, 0xee, sizeof b);
            switch (t) {
            case 0:
                got = tv__fp_encode_hello(b, cap, 1, 1);
                break;
            case 1:
                got = tv__fp_encode_hello_ok(b, cap, &ok);
                break;
            case 2:
                got = tv__fp_encode_open(b, cap, TV__FP_V1, 1, "m@1", 3);
                break;
            case 3:
                got = tv__fp_encode_opened(b, cap, TV__FP_V1, &o);
                break;
            case 4:
                got = tv__fp_encode_close(b, cap, TV__FP_V1, TV__FP_CLOSE, 1);
                break;
            case 5:
                got = tv__fp_encode_close(b, cap, TV__FP_V1, TV__FP_CLOSED, 1);
                break;
            case 6:
                got = tv__fp_encode_read(b, cap, TV__FP_V1, 1, r, 2);
                break;
            case 7:
                got = tv__fp_encode_chunk(b, cap, TV__FP_V1, c, 2);
                break;
            case 8:
                got = tv__fp_encode_done(b, cap, TV__FP_V1, d, 2);
                break;
            case 9:
                got = tv__fp_encode_release(b, cap, TV__FP_V1, 1, s, 2);
                break;
            default:
                got = tv__fp_encode_error(b, cap, TV__FP_V1, -EIO, 0, 0, 0, "text", 4);
                break;
            }
            if (got) {
                want = got;
                /* the first capacity that works is exactly the length */
                assert_int_equal(cap, got);
                assert_int_equal(b[got], 0xee); /* nothing past the message */
                tv__fp_msg m;
                decode_ok(b, got, 1, &m);
                break;
            }
        }
        assert_true(want >= TV__FP_HDR_LEN);
        /* Never past cap: a NULL buffer or cap 0 gives 0. */
        assert_int_equal(tv__fp_encode_hello(NULL, 64, 1, 1), 0);
    }
    /* Counts: 0 entries, over the limit, NULL entries. */
    assert_int_equal(tv__fp_encode_read(g_buf, sizeof g_buf, TV__FP_V1, 1, r, 0), 0);
    assert_int_equal(tv__fp_encode_read(g_buf, sizeof g_buf, TV__FP_V1, 1, NULL, 1), 0);
    assert_int_equal(tv__fp_encode_read(g_buf, sizeof g_buf, TV__FP_V1, 0, r, 1), 0);
    assert_int_equal(tv__fp_encode_read(g_buf, sizeof g_buf, TV__FP_V1, 1, r, TV__FP_MAX_READS + 1),
                     0);
    assert_int_equal(tv__fp_encode_chunk(g_buf, sizeof g_buf, TV__FP_V1, c, TV__FP_MAX_CHUNKS + 1),
                     0);
    assert_int_equal(
        tv__fp_encode_release(g_buf, sizeof g_buf, TV__FP_V1, 1, s, TV__FP_MAX_RELEASE + 1), 0);
    assert_int_equal(tv__fp_encode_release(g_buf, sizeof g_buf, TV__FP_V1, 0, s, 1), 0);
    assert_int_equal(tv__fp_encode_done(g_buf, sizeof g_buf, TV__FP_V1, d, 0), 0);
    assert_int_equal(tv__fp_encode_hello(g_buf, sizeof g_buf, 0, 1), 0);
    assert_int_equal(tv__fp_encode_hello(g_buf, sizeof g_buf, 2, 1), 0);
    assert_int_equal(tv__fp_encode_hello_ok(g_buf, sizeof g_buf, NULL), 0);
    ok.version = 0;
    assert_int_equal(tv__fp_encode_hello_ok(g_buf, sizeof g_buf, &ok), 0);
    assert_int_equal(tv__fp_encode_opened(g_buf, sizeof g_buf, TV__FP_V1, NULL), 0);
}

/* ---- the socket side ---- */

static void seqpair(int sv[2])
{
    assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
}

/* The n lowest descriptor numbers free now (the next ones the kernel hands out). */
static void next_fds(int *out, int n)
{
    for (int i = 0; i < n; i++)
        assert_true((out[i] = open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0);
    for (int i = 0; i < n; i++)
        close(out[i]);
}

static bool fd_open(int fd)
{
    return fcntl(fd, F_GETFD) >= 0;
}

static void test_send_recv_fds(void **state)
{
    (void)state;
    int sv[2], p1[2], p2[2];
    seqpair(sv);
    assert_int_equal(pipe(p1), 0);
    assert_int_equal(pipe(p2), 0);
    tv_error err = {0};
    size_t len = tv__fp_encode_close(g_buf, sizeof g_buf, TV__FP_V1, TV__FP_CLOSED, 3);
    int give[2] = {p1[0], p2[0]};
    assert_int_equal(tv__fp_send(sv[0], g_buf, len, give, 2, &err), 0);
    int got[2] = {-1, -1};
    size_t n_got = 99;
    ssize_t n = tv__fp_recv(sv[1], g_rbuf, TV__FP_MAX_MSG, got, 2, &n_got, &err);
    assert_int_equal(n, len);
    assert_memory_equal(g_rbuf, g_buf, len);
    assert_int_equal(n_got, 2);
    /* Kept descriptors are close-on-exec and are the same pipes. */
    for (int i = 0; i < 2; i++) {
        assert_true(got[i] >= 0);
        assert_int_equal(fcntl(got[i], F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
    }
    char c = 0;
    assert_int_equal(write(p1[1], "a", 1), 1);
    assert_int_equal(read(got[0], &c, 1), 1);
    assert_int_equal(c, 'a');
    assert_int_equal(write(p2[1], "b", 1), 1);
    assert_int_equal(read(got[1], &c, 1), 1);
    assert_int_equal(c, 'b');
    close(got[0]);
    close(got[1]);

    /* Surplus descriptors are closed: keep one of two, then none of two. */
    int nxt[2];
    assert_int_equal(tv__fp_send(sv[0], g_buf, len, give, 2, &err), 0);
    next_fds(nxt, 2);
    n = tv__fp_recv(sv[1], g_rbuf, TV__FP_MAX_MSG, got, 1, &n_got, &err);
    assert_int_equal(n, len);
    assert_int_equal(n_got, 1);
    assert_int_equal(got[0], nxt[0]);
    assert_true(fd_open(nxt[0]));
    assert_false(fd_open(nxt[1]));
    close(got[0]);
    assert_int_equal(tv__fp_send(sv[0], g_buf, len, give, 2, &err), 0);
    next_fds(nxt, 2);
    n = tv__fp_recv(sv[1], g_rbuf, TV__FP_MAX_MSG, NULL, 0, NULL, &err);
    assert_int_equal(n, len);
    assert_false(fd_open(nxt[0]));
    assert_false(fd_open(nxt[1]));

    /* No descriptors sent: none received. */
    assert_int_equal(tv__fp_send(sv[0], g_buf, len, NULL, 0, &err), 0);
    n = tv__fp_recv(sv[1], g_rbuf, TV__FP_MAX_MSG, got, 2, &n_got, &err);
    assert_int_equal(n, len);
    assert_int_equal(n_got, 0);

    /* A peer sending more than the wire ever carries (raw sendmsg of 5). */
    {
        int five[5] = {p1[0], p1[1], p2[0], p2[1], p1[0]};
        union {
            struct cmsghdr h;
            char b[CMSG_SPACE(sizeof five)];
        } ctl = {0};
        struct iovec iov = {.iov_base = g_buf, .iov_len = len};
        struct msghdr mh = {
            .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b, .msg_controllen = sizeof ctl.b};
        struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof five);
        memcpy(CMSG_DATA(cm), five, sizeof five);
        assert_int_equal(sendmsg(sv[0], &mh, 0), (ssize_t)len);
        int nx[5];
        next_fds(nx, 5);
        n = tv__fp_recv(sv[1], g_rbuf, TV__FP_MAX_MSG, got, 2, &n_got, &err);
        assert_int_equal(n, len);
        assert_int_equal(n_got, 2);
        assert_int_equal(got[0], nx[0]);
        assert_int_equal(got[1], nx[1]);
        for (int i = 2; i < 5; i++)
            assert_false(fd_open(nx[i]));
        close(got[0]);
        close(got[1]);
    }

    /* Bad arguments. */
    assert_int_equal(tv__fp_send(sv[0], g_buf, len, give, 3, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv__fp_send(sv[0], g_buf, 0, NULL, 0, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv__fp_send(sv[0], g_buf, TV__FP_MAX_MSG + 1, NULL, 0, &err),
                     TV_E_INVALID_ARG);
    assert_int_equal(tv__fp_send(sv[0], g_buf, len, NULL, 1, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv__fp_recv(sv[1], NULL, 10, NULL, 0, NULL, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv__fp_recv(sv[1], g_rbuf, 10, NULL, 2, &n_got, &err), TV_E_INVALID_ARG);

    for (int i = 0; i < 2; i++) {
        close(sv[i]);
        close(p1[i]);
        close(p2[i]);
    }
}

static void test_recv_oversized_eof(void **state)
{
    (void)state;
    int sv[2], p[2];
    seqpair(sv);
    assert_int_equal(pipe(p), 0);
    tv_error err = {0};
    /* A datagram over the limit, with a descriptor: TV_E_PROTOCOL, the
     * descriptor closed; the next datagram still arrives. */
    memset(g_buf, 'z', TV__FP_MAX_MSG + 1);
    {
        union {
            struct cmsghdr h;
            char b[CMSG_SPACE(sizeof(int))];
        } ctl = {0};
        struct iovec iov = {.iov_base = g_buf, .iov_len = TV__FP_MAX_MSG + 1};
        struct msghdr mh = {
            .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b, .msg_controllen = sizeof ctl.b};
        struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(cm), &p[0], sizeof(int));
        assert_int_equal(sendmsg(sv[0], &mh, 0), TV__FP_MAX_MSG + 1);
    }
    int nx[1], got[2];
    size_t n_got = 9;
    next_fds(nx, 1);
    ssize_t n = tv__fp_recv(sv[1], g_rbuf, TV__FP_MAX_MSG, got, 2, &n_got, &err);
    assert_int_equal(n, TV_E_PROTOCOL);
    assert_non_null(strstr(err.msg, "datagram longer than 65536 bytes"));
    assert_int_equal(n_got, 0);
    assert_false(fd_open(nx[0]));
    size_t len = tv__fp_encode_hello(g_buf, sizeof g_buf, 1, 1);
    assert_int_equal(tv__fp_send(sv[0], g_buf, len, NULL, 0, &err), 0);
    assert_int_equal(tv__fp_recv(sv[1], g_rbuf, TV__FP_MAX_MSG, got, 2, &n_got, &err), len);

    /* Non-blocking and empty: -EAGAIN. */
    assert_int_equal(fcntl(sv[1], F_SETFL, O_NONBLOCK), 0);
    assert_int_equal(tv__fp_recv(sv[1], g_rbuf, TV__FP_MAX_MSG, got, 2, &n_got, &err), -EAGAIN);
    /* Non-blocking and full: -EAGAIN, nothing sent. */
    assert_int_equal(fcntl(sv[0], F_SETFL, O_NONBLOCK), 0);
    memset(g_buf, 0, TV__FP_MAX_MSG);
    int rc, sent = 0;
    while ((rc = tv__fp_send(sv[0], g_buf, TV__FP_MAX_MSG, NULL, 0, &err)) == 0)
        sent++;
    assert_int_equal(rc, -EAGAIN);
    assert_true(sent >= 1);
    for (int i = 0; i < sent; i++)
        assert_int_equal(tv__fp_recv(sv[1], g_rbuf, TV__FP_MAX_MSG, got, 2, &n_got, &err),
                         TV__FP_MAX_MSG);
    assert_int_equal(tv__fp_recv(sv[1], g_rbuf, TV__FP_MAX_MSG, got, 2, &n_got, &err), -EAGAIN);

    /* Orderly EOF: 0. Then the other way: a send to a closed peer is
     * -EPIPE, without SIGPIPE killing the test. */
    close(sv[0]);
    assert_int_equal(tv__fp_recv(sv[1], g_rbuf, TV__FP_MAX_MSG, got, 2, &n_got, &err), 0);
    assert_int_equal(n_got, 0);
    int sv2[2];
    seqpair(sv2);
    close(sv2[1]);
    len = tv__fp_encode_hello(g_buf, sizeof g_buf, 1, 1);
    rc = tv__fp_send(sv2[0], g_buf, len, NULL, 0, &err);
    assert_int_equal(rc, -EPIPE);
    assert_non_null(strstr(err.msg, "fast-path send of a HELLO message (24 bytes)"));
    close(sv2[0]);
    close(sv[1]);
    close(p[0]);
    close(p[1]);
}

/* ---- faults through the tv__sys table ---- */

static int g_fail_calls;
static int g_fail_errno;
static ssize_t fail_sendmsg(int sock, const struct msghdr *msg, int flags)
{
    (void)sock, (void)msg, (void)flags;
    if (g_fail_calls-- > 0) {
        errno = g_fail_errno;
        return -1;
    }
    return sendmsg(sock, msg, flags);
}
static ssize_t short_sendmsg(int sock, const struct msghdr *msg, int flags)
{
    (void)sock, (void)flags;
    return (ssize_t)msg->msg_iov[0].iov_len - 1;
}
static int g_send_flags;
static ssize_t flags_sendmsg(int sock, const struct msghdr *msg, int flags)
{
    g_send_flags = flags;
    return sendmsg(sock, msg, flags);
}
static ssize_t fail_recvmsg(int sock, struct msghdr *msg, int flags)
{
    if (g_fail_calls-- > 0) {
        errno = g_fail_errno;
        return -1;
    }
    return recvmsg(sock, msg, flags);
}
static int g_recv_flags;
static ssize_t ctrunc_recvmsg(int sock, struct msghdr *msg, int flags)
{
    g_recv_flags = flags;
    ssize_t n = recvmsg(sock, msg, flags);
    if (n >= 0)
        msg->msg_flags |= MSG_CTRUNC;
    return n;
}

static void test_sys_faults(void **state)
{
    (void)state;
    int sv[2], p[2];
    seqpair(sv);
    assert_int_equal(pipe(p), 0);
    tv_error err = {0};
    size_t len = tv__fp_encode_close(g_buf, sizeof g_buf, TV__FP_V1, TV__FP_CLOSE, 1);
    int got[2];
    size_t n_got = 0;

    /* A failing sendmsg: its errno, nothing sent. */
    tv__sys.sendmsg = fail_sendmsg;
    g_fail_calls = 1;
    g_fail_errno = ECONNRESET;
    assert_int_equal(tv__fp_send(sv[0], g_buf, len, NULL, 0, &err), -ECONNRESET);
    assert_int_equal(err.code, -ECONNRESET);
    assert_non_null(strstr(err.msg, "fast-path send of a CLOSE message (24 bytes)"));
    /* EINTR is retried. */
    g_fail_calls = 2;
    g_fail_errno = EINTR;
    assert_int_equal(tv__fp_send(sv[0], g_buf, len, NULL, 0, &err), 0);
    assert_int_equal(tv__fp_recv(sv[1], g_rbuf, TV__FP_MAX_MSG, got, 2, &n_got, &err), len);
    /* EWOULDBLOCK is reported as -EAGAIN. */
    g_fail_calls = 1;
    g_fail_errno = EWOULDBLOCK;
    assert_int_equal(tv__fp_send(sv[0], g_buf, len, NULL, 0, &err), -EAGAIN);
    /* A short datagram. */
    tv__sys.sendmsg = short_sendmsg;
    assert_int_equal(tv__fp_send(sv[0], g_buf, len, NULL, 0, &err), TV_E_SHORT_IO);
    assert_non_null(strstr(err.msg, "23 of 24 bytes"));
    /* MSG_NOSIGNAL always. */
    tv__sys.sendmsg = flags_sendmsg;
    g_send_flags = 0;
    assert_int_equal(tv__fp_send(sv[0], g_buf, len, &p[0], 1, &err), 0);
    assert_int_equal(g_send_flags & MSG_NOSIGNAL, MSG_NOSIGNAL);

    /* A failing recvmsg. */
    tv__sys.recvmsg = fail_recvmsg;
    g_fail_calls = 1;
    g_fail_errno = EIO;
    assert_int_equal(tv__fp_recv(sv[1], g_rbuf, TV__FP_MAX_MSG, got, 2, &n_got, &err), -EIO);
    assert_non_null(strstr(err.msg, "fast-path receive on socket"));
    /* A cut control message (MSG_CTRUNC): TV_E_PROTOCOL, descriptors closed;
     * MSG_CMSG_CLOEXEC always. */
    tv__sys.recvmsg = ctrunc_recvmsg;
    int nx[1];
    next_fds(nx, 1);
    assert_int_equal(tv__fp_recv(sv[1], g_rbuf, TV__FP_MAX_MSG, got, 2, &n_got, &err),
                     TV_E_PROTOCOL);
    assert_non_null(strstr(err.msg, "control message cut"));
    assert_int_equal(n_got, 0);
    assert_false(fd_open(nx[0]));
    assert_int_equal(g_recv_flags & MSG_CMSG_CLOEXEC, MSG_CMSG_CLOEXEC);

    tv__sys_reset();
    for (int i = 0; i < 2; i++) {
        close(sv[i]);
        close(p[i]);
    }
}

/* Version 2: READ flag TV__FP_READ_SHARD_HEADER encodes and decodes in a
 * version-2 message; version 1 rejects it (encoder and decoder); any other
 * flag bit is rejected in both; every encoder writes the version it is
 * given and refuses one this build does not speak. */
static void test_versions(void **state)
{
    (void)state;
    tv__fp_msg m;
    tv_error err = {0};
    tv__fp_read_ent re;
    tv__fp_read_ent r[2] = {
        {.req_id = 1, .tensor = 3, .off = 0, .len = 8},
        {.req_id = 2, .tensor = 0, .flags = TV__FP_READ_SHARD_HEADER, .off = 8, .len = 4000}};
    /* v2 accepts the flag */
    size_t len = tv__fp_encode_read(g_buf, sizeof g_buf, TV__FP_V2, 1, r, 2);
    assert_int_equal(len, 16 + 8 + 2 * 32);
    assert_int_equal(tv__le16_get(g_buf + 4), 2);
    assert_int_equal(tv__le32_get(g_buf + 24 + 32 + 12), TV__FP_READ_SHARD_HEADER);
    decode_ok(g_buf, len, TV__FP_V2, &m);
    assert_int_equal(m.version, 2);
    assert_int_equal(tv__fp_read_entry(&m, 1, &re, &err), 0);
    assert_memory_equal(&re, &r[1], sizeof re);
    assert_int_equal(tv__fp_read_entry(&m, 0, &re, &err), 0);
    assert_int_equal(re.flags, 0);
    /* the same bytes in a version-1 session: a wrong header version */
    reject(g_buf, len, TV__FP_V1, TV_E_VERSION, "header version 2, the session speaks version 1");
    /* v1 rejects the flag: the encoder refuses, the decoder's entry check fails */
    assert_int_equal(tv__fp_encode_read(g_buf, sizeof g_buf, TV__FP_V1, 1, r, 2), 0);
    len = tv__fp_encode_read(g_buf, sizeof g_buf, TV__FP_V1, 1, r, 1);
    assert_true(len > 0);
    tv__le32_put(g_buf + 24 + 12, TV__FP_READ_SHARD_HEADER);
    decode_ok(g_buf, len, TV__FP_V1, &m);
    assert_int_equal(tv__fp_read_entry(&m, 0, &re, &err), TV_E_PROTOCOL);
    assert_string_equal(err.msg, "READ: entry 0 flags 0x1 must be 0");
    /* unknown bits: rejected in both versions, with or without the flag */
    static const uint32_t bad[] = {0x2, 0x3, 0x80000000u, 0xffffffffu};
    for (size_t i = 0; i < TV_ARRAY_LEN(bad); i++) {
        for (uint16_t v = TV__FP_V1; v <= TV__FP_V2; v++) {
            tv__fp_read_ent b = {.req_id = 9, .flags = bad[i], .len = 1};
            assert_int_equal(tv__fp_encode_read(g_buf, sizeof g_buf, v, 1, &b, 1), 0);
            b.flags = 0;
            len = tv__fp_encode_read(g_buf, sizeof g_buf, v, 1, &b, 1);
            assert_true(len > 0);
            tv__le32_put(g_buf + 24 + 12, bad[i]);
            decode_ok(g_buf, len, v, &m);
            assert_int_equal(tv__fp_read_entry(&m, 0, &re, &err), TV_E_PROTOCOL);
            assert_non_null(strstr(err.msg, "READ: entry 0 flags"));
        }
    }
    tv__fp_read_entry(&m, 0, &re, &err);
    assert_string_equal(
        err.msg, "READ: entry 0 flags 0xffffffff has reserved bits set (version 2 defines 0x1)");
    /* every encoder writes the version it is given, and only 1..2 */
    tv__fp_opened op = {.open_id = 1,
                        .handle = 1,
                        .generation = 2,
                        .snap_len = 4096,
                        .arena_len = 4096,
                        .slot_len = 4096,
                        .n_slots = 1,
                        .credit = 1};
    tv__fp_chunk_ent ch = {.req_id = 1, .handle = 1, .len = 1};
    tv__fp_done_ent dn = {.req_id = 1, .handle = 1};
    uint32_t sl = 0;
    for (uint16_t v = 0; v <= 3; v++) {
        size_t n[8] = {
            tv__fp_encode_open(g_buf, sizeof g_buf, v, 1, "m", 1),
            tv__fp_encode_opened(g_buf + 1024, sizeof g_buf - 1024, v, &op),
            tv__fp_encode_close(g_buf + 2048, sizeof g_buf - 2048, v, TV__FP_CLOSE, 1),
            tv__fp_encode_read(g_buf + 3072, sizeof g_buf - 3072, v, 1, r, 1),
            tv__fp_encode_chunk(g_buf + 4096, sizeof g_buf - 4096, v, &ch, 1),
            tv__fp_encode_done(g_buf + 5120, sizeof g_buf - 5120, v, &dn, 1),
            tv__fp_encode_release(g_buf + 6144, sizeof g_buf - 6144, v, 1, &sl, 1),
            tv__fp_encode_error(g_buf + 7168, sizeof g_buf - 7168, v, -EIO, 0, 1, 0, "x", 1),
        };
        for (int k = 0; k < 8; k++) {
            if (v < TV__FP_VERSION_MIN || v > TV__FP_VERSION_MAX) {
                assert_int_equal(n[k], 0);
                continue;
            }
            assert_true(n[k] > 0);
            assert_int_equal(tv__le16_get(g_buf + 1024 * k + 4), v);
            decode_ok(g_buf + 1024 * k, n[k], v, &m);
        }
    }
    /* HELLO's header: min_version (1 for every client of this build) */
    len = tv__fp_encode_hello(g_buf, sizeof g_buf, 1, 2);
    assert_int_equal(tv__le16_get(g_buf + 4), 1);
    decode_ok(g_buf, len, 0, &m);
    assert_int_equal(m.u.hello.max_version, 2);
    tv__fp_hello_ok ok = {.version = 2,
                          .max_msg_len = TV__FP_MAX_MSG,
                          .max_requests = 1,
                          .max_handles = 1,
                          .session_id = 9};
    len = tv__fp_encode_hello_ok(g_buf, sizeof g_buf, &ok);
    assert_int_equal(tv__le16_get(g_buf + 4), 2);
    decode_ok(g_buf, len, 0, &m);
    assert_int_equal(m.u.hello_ok.version, 2);
}

/* ---- the fuzz seed corpus (tests/fuzz/corpus/wire/) ---- */

/* Seed i into b (its name in *name, whether it decodes in *valid); 0 past
 * the last. */
static size_t seed(int i, uint8_t *b, size_t cap, const char **name, bool *valid)
{
    static const tv__fp_hello_ok ok = {.version = 1,
                                       .max_msg_len = TV__FP_MAX_MSG,
                                       .max_requests = 16384,
                                       .max_handles = 64,
                                       .session_id = 3};
    static const tv__fp_opened op = {.open_id = 1,
                                     .handle = 1,
                                     .generation = 2,
                                     .snap_len = 4096,
                                     .arena_len = 4u << 20,
                                     .slot_len = 1u << 20,
                                     .n_slots = 4,
                                     .credit = 2};
    static const tv__fp_read_ent rd[3] = {{.req_id = 1, .tensor = 0, .off = 0, .len = 100},
                                          {.req_id = 2, .tensor = 1, .off = 8, .len = 0},
                                          {.req_id = 3, .tensor = 2, .off = 4096, .len = 1u << 21}};
    static const tv__fp_chunk_ent ch[2] = {
        {.req_id = 1, .handle = 1, .slot = 0, .slot_off = 24, .len = 100, .dest_off = 0},
        {.req_id = 3, .handle = 1, .slot = 2, .slot_off = 0, .len = 4096, .dest_off = 1u << 20}};
    static const tv__fp_done_ent dn[2] = {{.req_id = 1, .result = 0, .handle = 1},
                                          {.req_id = 3, .result = TV_E_CANCELLED, .handle = 1}};
    static const uint32_t sl[3] = {0, 2, 3};
    static const tv__fp_hello_ok ok2 = {.version = 2,
                                        .max_msg_len = TV__FP_MAX_MSG,
                                        .max_requests = 16384,
                                        .max_handles = 16,
                                        .session_id = 4};
    static const tv__fp_read_ent rd2[2] = {
        {.req_id = 1, .tensor = 0, .flags = TV__FP_READ_SHARD_HEADER, .off = 0, .len = 4096},
        {.req_id = 2, .tensor = 1, .off = 0, .len = 100}};
    static const char text[] = "demo tensor w: device 0 offset 1048576: Input/output error";
    *valid = true;
    size_t n = 0;
    switch (i) {
    case 0:
        *name = "hello.bin";
        return tv__fp_encode_hello(b, cap, 1, 1);
    case 1:
        *name = "hello_ok.bin";
        return tv__fp_encode_hello_ok(b, cap, &ok);
    case 2:
        *name = "open.bin";
        return tv__fp_encode_open(b, cap, TV__FP_V1, 1, "demo@prod", 9);
    case 3:
        *name = "opened.bin";
        return tv__fp_encode_opened(b, cap, TV__FP_V1, &op);
    case 4:
        *name = "close.bin";
        return tv__fp_encode_close(b, cap, TV__FP_V1, TV__FP_CLOSE, 1);
    case 5:
        *name = "closed.bin";
        return tv__fp_encode_close(b, cap, TV__FP_V1, TV__FP_CLOSED, 1);
    case 6:
        *name = "read.bin";
        return tv__fp_encode_read(b, cap, TV__FP_V1, 1, rd, 3);
    case 7:
        *name = "chunk.bin";
        return tv__fp_encode_chunk(b, cap, TV__FP_V1, ch, 2);
    case 8:
        *name = "done.bin";
        return tv__fp_encode_done(b, cap, TV__FP_V1, dn, 2);
    case 9:
        *name = "release.bin";
        return tv__fp_encode_release(b, cap, TV__FP_V1, 1, sl, 3);
    case 10:
        *name = "error.bin";
        return tv__fp_encode_error(b, cap, TV__FP_V1, -EIO, 0, 3, 0, text, sizeof text - 1);
    case 11:
        *name = "error_fatal.bin";
        return tv__fp_encode_error(b, cap, TV__FP_V1, TV_E_PROTOCOL, TV__FP_ERROR_FATAL, 0, 0,
                                   "file descriptors are not accepted", 33);
    case 12:
        *name = "bad_magic.bin";
        n = tv__fp_encode_hello(b, cap, 1, 1);
        b[3] = 'Q';
        break;
    case 13:
        *name = "bad_length.bin";
        n = tv__fp_encode_close(b, cap, TV__FP_V1, TV__FP_CLOSE, 1);
        tv__le32_put(b + 8, 23);
        break;
    case 14:
        *name = "bad_type.bin";
        n = tv__fp_encode_close(b, cap, TV__FP_V1, TV__FP_CLOSE, 1);
        tv__le16_put(b + 6, 12);
        break;
    case 15:
        *name = "bad_read_flags.bin"; /* decodes; entry 1 is rejected */
        n = tv__fp_encode_read(b, cap, TV__FP_V1, 1, rd, 3);
        tv__le32_put(b + 24 + 32 + 12, 1);
        return n;
    case 16:
        *name = "bad_open_nul.bin";
        n = tv__fp_encode_open(b, cap, TV__FP_V1, 1, "demo@prod", 9);
        b[24 + 4] = '\0';
        break;
    case 17:
        *name = "bad_list_n.bin";
        n = tv__fp_encode_done(b, cap, TV__FP_V1, dn, 2);
        tv__le32_put(b + 20, 3);
        break;
    case 18:
        *name = "hello_v2.bin";
        return tv__fp_encode_hello(b, cap, 1, 2);
    case 19:
        *name = "hello_ok_v2.bin";
        return tv__fp_encode_hello_ok(b, cap, &ok2);
    case 20:
        *name = "read_v2_header.bin";
        return tv__fp_encode_read(b, cap, TV__FP_V2, 1, rd2, 2);
    case 21:
        *name = "bad_read_v2_flags.bin"; /* decodes; entry 1 is rejected */
        n = tv__fp_encode_read(b, cap, TV__FP_V2, 1, rd2, 2);
        tv__le32_put(b + 24 + 32 + 12, 3);
        return n;
    default:
        return 0;
    }
    *valid = false;
    return n;
}

/* With TV_WIRE_WRITE_CORPUS=DIR the seeds are (re)written there; without,
 * the committed corpus must be exactly what the codec encodes now. */
static void test_corpus(void **state)
{
    (void)state;
    const char *out = getenv("TV_WIRE_WRITE_CORPUS");
    const char *name = NULL;
    bool valid = false;
    int i = 0;
    for (size_t len; (len = seed(i, g_buf, sizeof g_buf, &name, &valid)) > 0; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", out ? out : "fuzz/corpus/wire", name);
        tv__fp_msg m;
        tv_error err = {0};
        int rc = tv__fp_decode(g_buf, len, 0, &m, &err);
        assert_int_equal(rc == 0, valid || strcmp(name, "bad_read_flags.bin") == 0 ||
                                      strcmp(name, "bad_read_v2_flags.bin") == 0);
        if (out) {
            FILE *f = fopen(path, "wb");
            assert_non_null(f);
            assert_int_equal(fwrite(g_buf, 1, len, f), len);
            assert_int_equal(fclose(f), 0);
            continue;
        }
        FILE *f = fopen(path, "rb");
        if (!f)
            fail_msg("%s: missing (run test_wire with TV_WIRE_WRITE_CORPUS=tests/fuzz/corpus/wire)",
                     path);
        size_t got = fread(g_rbuf, 1, sizeof g_rbuf, f);
        fclose(f);
        if (got != len || memcmp(g_rbuf, g_buf, len) != 0)
            fail_msg("%s: %zu bytes differ from the %zu the codec encodes", path, got, len);
    }
    assert_int_equal(i, 22);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_hello),
        cmocka_unit_test(test_roundtrip_hello_ok),
        cmocka_unit_test(test_roundtrip_open),
        cmocka_unit_test(test_roundtrip_opened),
        cmocka_unit_test(test_roundtrip_close),
        cmocka_unit_test(test_roundtrip_read),
        cmocka_unit_test(test_roundtrip_chunk),
        cmocka_unit_test(test_roundtrip_done),
        cmocka_unit_test(test_roundtrip_release),
        cmocka_unit_test(test_roundtrip_error),
        cmocka_unit_test(test_type_names),
        cmocka_unit_test(test_reject_header),
        cmocka_unit_test(test_reject_fixed_bodies),
        cmocka_unit_test(test_reject_open),
        cmocka_unit_test(test_reject_error),
        cmocka_unit_test(test_reject_lists),
        cmocka_unit_test(test_reject_entries),
        cmocka_unit_test(test_encode_capacity),
        cmocka_unit_test(test_send_recv_fds),
        cmocka_unit_test(test_recv_oversized_eof),
        cmocka_unit_test_teardown(test_sys_faults, teardown),
        cmocka_unit_test(test_versions),
        cmocka_unit_test(test_corpus),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
