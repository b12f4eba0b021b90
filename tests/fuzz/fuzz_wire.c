/* libFuzzer target: the fast-path wire decoder (tv__fp_decode and the entry
 * accessors) on arbitrary datagrams, before negotiation (version 0) and
 * after (versions 1 and 2).
 * Invariants: any input returns 0, TV_E_PROTOCOL or (after negotiation)
 * TV_E_VERSION, never aborts and never reads past size; what decodes points
 * inside the input; every entry of a list message is walked; and the codec
 * is canonical: re-encoding what decoded gives back exactly the input
 * (header version: the message's when this build speaks it, else
 * TV__FP_V1; HELLO's min_version; HELLO_OK's own), and a list with an
 * entry its accessor rejects is refused by the encoder too. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "wire/wire.h"
#include "util/endian.h"

static tv__fp_read_ent g_reads[TV__FP_MAX_READS];
static tv__fp_chunk_ent g_chunks[TV__FP_MAX_CHUNKS];
static tv__fp_done_ent g_dones[TV__FP_MAX_DONES];
static uint32_t g_slots[TV__FP_MAX_RELEASE];
static uint8_t g_again[TV__FP_MAX_MSG];

#define CHECK(c)                                                                                   \
    do {                                                                                           \
        if (!(c))                                                                                  \
            abort();                                                                               \
    } while (0)

/* Walks the entries into the arrays above; true when every one is valid. */
static int walk(const tv__fp_msg *m)
{
    tv_error err;
    int all_ok = 1;
    for (uint32_t i = 0; i < m->u.list.n; i++) {
        int rc = 0;
        switch (m->type) {
        case TV__FP_READ:
            rc = tv__fp_read_entry(m, i, &g_reads[i], &err);
            break;
        case TV__FP_CHUNK:
            rc = tv__fp_chunk_entry(m, i, &g_chunks[i], &err);
            break;
        case TV__FP_DONE:
            rc = tv__fp_done_entry(m, i, &g_dones[i], &err);
            break;
        default:
            rc = tv__fp_release_entry(m, i, &g_slots[i], &err);
            break;
        }
        CHECK(rc == 0 || rc == TV_E_PROTOCOL);
        if (rc)
            all_ok = 0;
    }
    /* one past the end is an argument error, never a read */
    tv__fp_read_ent r;
    CHECK(tv__fp_read_entry(m, m->u.list.n, &r, &err) == TV_E_INVALID_ARG);
    return all_ok;
}

static void check(const uint8_t *buf, size_t size, uint16_t version)
{
    tv__fp_msg m;
    tv_error err;
    int rc = tv__fp_decode(buf, size, version, &m, &err);
    if (rc != 0) {
        CHECK(rc == TV_E_PROTOCOL || (version != 0 && rc == TV_E_VERSION));
        return;
    }
    CHECK(m.len == size && m.version != 0 && (version == 0 || m.version == version));
    if (m.text)
        CHECK(m.text >= (const char *)buf && m.text_len <= size &&
              m.text + m.text_len <= (const char *)buf + size);
    size_t n = 0;
    int all_ok = 1;
    /* the version to re-encode with: a pre-HELLO decode takes any header
     * version, the encoders write only those this build speaks (entries of
     * another version were checked as version 1's: no flags) */
    uint16_t ev = m.version >= TV__FP_VERSION_MIN && m.version <= TV__FP_VERSION_MAX
                      ? m.version
                      : (uint16_t)TV__FP_V1;
    uint16_t want_version = ev;
    switch (m.type) {
    case TV__FP_HELLO:
        want_version = m.u.hello.min_version;
        n = tv__fp_encode_hello(g_again, sizeof g_again, m.u.hello.min_version,
                                m.u.hello.max_version);
        break;
    case TV__FP_HELLO_OK:
        want_version = m.u.hello_ok.version;
        n = tv__fp_encode_hello_ok(g_again, sizeof g_again, &m.u.hello_ok);
        break;
    case TV__FP_OPEN:
        n = tv__fp_encode_open(g_again, sizeof g_again, ev, m.u.open.open_id, m.text, m.text_len);
        break;
    case TV__FP_OPENED:
        n = tv__fp_encode_opened(g_again, sizeof g_again, ev, &m.u.opened);
        break;
    case TV__FP_CLOSE:
    case TV__FP_CLOSED:
        n = tv__fp_encode_close(g_again, sizeof g_again, ev, m.type, m.u.close.handle);
        break;
    case TV__FP_READ:
        all_ok = walk(&m);
        n = tv__fp_encode_read(g_again, sizeof g_again, ev, m.u.list.handle, g_reads, m.u.list.n);
        break;
    case TV__FP_CHUNK:
        all_ok = walk(&m);
        n = tv__fp_encode_chunk(g_again, sizeof g_again, ev, g_chunks, m.u.list.n);
        break;
    case TV__FP_DONE:
        all_ok = walk(&m);
        n = tv__fp_encode_done(g_again, sizeof g_again, ev, g_dones, m.u.list.n);
        break;
    case TV__FP_RELEASE:
        all_ok = walk(&m);
        CHECK(all_ok); /* a slot is any 32-bit value */
        n = tv__fp_encode_release(g_again, sizeof g_again, ev, m.u.list.handle, g_slots,
                                  m.u.list.n);
        break;
    case TV__FP_RELEASE_VIEW: /* version 3: RELEASE's layout */
        all_ok = walk(&m);
        CHECK(all_ok);
        n = tv__fp_encode_release_view(g_again, sizeof g_again, ev, m.u.list.handle, g_slots,
                                       m.u.list.n);
        break;
    case TV__FP_ERROR:
        n = tv__fp_encode_error(g_again, sizeof g_again, ev, m.u.error.code, m.u.error.flags,
                                m.u.error.req_id, m.u.error.open_id, m.text, m.text_len);
        break;
    default:
        abort(); /* the decoder accepted an unknown type */
    }
    if (!all_ok) {
        CHECK(n == 0);
        return;
    }
    CHECK(n == size);
    CHECK(tv__le16_get(g_again + 4) == want_version);
    /* identical but for the header version, which a pre-HELLO decode
     * accepts whatever it is */
    CHECK(memcmp(g_again, buf, 4) == 0);
    CHECK(memcmp(g_again + 6, buf + 6, size - 6) == 0);
    CHECK(version == 0 || m.type == TV__FP_HELLO || m.version == want_version);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* a heap copy of exactly size bytes, so ASan sees any overread */
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf)
        return 0;
    memcpy(buf, data, size);
    check(buf, size, 0);
    check(buf, size, TV__FP_V1);
    check(buf, size, TV__FP_V2);
    /* the same bytes with a valid header in front of the body: the fuzzer
     * need not find magic and length to reach the body checks */
    if (size >= 8 && size + TV__FP_HDR_LEN - 8 <= TV__FP_MAX_MSG) {
        size_t len = size + TV__FP_HDR_LEN - 8;
        uint8_t *msg = malloc(len);
        if (msg) {
            tv__le32_put(msg, TV__FP_MAGIC);
            tv__le16_put(msg + 4, (uint16_t)(TV__FP_V1 + (data[1] & 1)));
            tv__le16_put(msg + 6, (uint16_t)(1 + data[0] % 11));
            tv__le32_put(msg + 8, (uint32_t)len);
            tv__le32_put(msg + 12, 0);
            memcpy(msg + TV__FP_HDR_LEN, data + 8, size - 8);
            check(msg, len, 0);
            check(msg, len, TV__FP_V1);
            check(msg, len, TV__FP_V2);
            free(msg);
        }
    }
    free(buf);
    return 0;
}
