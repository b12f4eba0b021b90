/* TEMPORARY (helper client): a minimal wire codec so the client builds and
 * its tests run before helper wire's wire.c is on main. Delete when it is. */
#include <errno.h>
#include <string.h>
#include <sys/socket.h>

#include "client/wire.h"
#include "util/sys.h"

static void put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static uint16_t get16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}
static uint32_t get32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}
static uint64_t get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static size_t hdr(uint8_t *b, size_t cap, uint16_t type, size_t len)
{
    if (cap < len || len > TV__FP_MAX_MSG)
        return 0;
    memset(b, 0, len);
    put32(b, TV__FP_MAGIC);
    put16(b + 4, TV__FP_VERSION);
    put16(b + 6, type);
    put32(b + 8, (uint32_t)len);
    return len;
}

size_t tv__fp_encode_hello(void *buf, size_t cap, uint16_t min_version, uint16_t max_version)
{
    uint8_t *b = buf;
    if (!hdr(b, cap, TV__FP_HELLO, 24))
        return 0;
    put16(b + 16, min_version);
    put16(b + 18, max_version);
    return 24;
}

size_t tv__fp_encode_hello_ok(void *buf, size_t cap, const tv__fp_hello_ok *m)
{
    uint8_t *b = buf;
    if (!hdr(b, cap, TV__FP_HELLO_OK, 40))
        return 0;
    put16(b + 16, m->version);
    put32(b + 20, m->max_msg_len);
    put32(b + 24, m->max_requests);
    put32(b + 28, m->max_handles);
    put64(b + 32, m->session_id);
    return 40;
}

size_t tv__fp_encode_open(void *buf, size_t cap, uint32_t open_id, const char *spec,
                          size_t spec_len)
{
    uint8_t *b = buf;
    if (spec_len == 0 || spec_len > TV__FP_MAX_SPEC || !hdr(b, cap, TV__FP_OPEN, 24 + spec_len))
        return 0;
    put32(b + 16, open_id);
    put32(b + 20, (uint32_t)spec_len);
    memcpy(b + 24, spec, spec_len);
    return 24 + spec_len;
}

size_t tv__fp_encode_opened(void *buf, size_t cap, const tv__fp_opened *m)
{
    uint8_t *b = buf;
    if (!hdr(b, cap, TV__FP_OPENED, 64))
        return 0;
    put32(b + 16, m->open_id);
    put32(b + 20, m->handle);
    put64(b + 24, (uint64_t)m->generation);
    put64(b + 32, m->snap_len);
    put64(b + 40, m->arena_len);
    put32(b + 48, m->slot_len);
    put32(b + 52, m->n_slots);
    put32(b + 56, m->credit);
    return 64;
}

size_t tv__fp_encode_close(void *buf, size_t cap, uint16_t type, uint32_t handle)
{
    uint8_t *b = buf;
    if ((type != TV__FP_CLOSE && type != TV__FP_CLOSED) || !hdr(b, cap, type, 24))
        return 0;
    put32(b + 16, handle);
    return 24;
}

static size_t list(uint8_t *b, size_t cap, uint16_t type, uint32_t handle, uint32_t n, size_t ent,
                   uint32_t max)
{
    if (n == 0 || n > max || !hdr(b, cap, type, 24 + n * ent))
        return 0;
    put32(b + 16, handle);
    put32(b + 20, n);
    return 24 + n * ent;
}

size_t tv__fp_encode_read(void *buf, size_t cap, uint32_t handle, const tv__fp_read_ent *e,
                          uint32_t n)
{
    uint8_t *b = buf;
    size_t len = list(b, cap, TV__FP_READ, handle, n, 32, TV__FP_MAX_READS);
    for (uint32_t i = 0; len && i < n; i++) {
        uint8_t *p = b + 24 + 32 * i;
        put64(p, e[i].req_id);
        put32(p + 8, e[i].tensor);
        put32(p + 12, e[i].flags);
        put64(p + 16, e[i].off);
        put64(p + 24, e[i].len);
    }
    return len;
}

size_t tv__fp_encode_chunk(void *buf, size_t cap, const tv__fp_chunk_ent *e, uint32_t n)
{
    uint8_t *b = buf;
    size_t len = list(b, cap, TV__FP_CHUNK, 0, n, 32, TV__FP_MAX_CHUNKS);
    for (uint32_t i = 0; len && i < n; i++) {
        uint8_t *p = b + 24 + 32 * i;
        put64(p, e[i].req_id);
        put32(p + 8, e[i].handle);
        put32(p + 12, e[i].slot);
        put32(p + 16, e[i].slot_off);
        put32(p + 20, e[i].len);
        put64(p + 24, e[i].dest_off);
    }
    return len;
}

size_t tv__fp_encode_done(void *buf, size_t cap, const tv__fp_done_ent *e, uint32_t n)
{
    uint8_t *b = buf;
    size_t len = list(b, cap, TV__FP_DONE, 0, n, 16, TV__FP_MAX_DONES);
    for (uint32_t i = 0; len && i < n; i++) {
        uint8_t *p = b + 24 + 16 * i;
        put64(p, e[i].req_id);
        put32(p + 8, (uint32_t)e[i].result);
        put32(p + 12, e[i].handle);
    }
    return len;
}

size_t tv__fp_encode_release(void *buf, size_t cap, uint32_t handle, const uint32_t *slots,
                             uint32_t n)
{
    uint8_t *b = buf;
    size_t len = list(b, cap, TV__FP_RELEASE, handle, n, 4, TV__FP_MAX_RELEASE);
    for (uint32_t i = 0; len && i < n; i++)
        put32(b + 24 + 4 * i, slots[i]);
    return len;
}

size_t tv__fp_encode_error(void *buf, size_t cap, int32_t code, uint32_t flags, uint64_t req_id,
                           uint32_t open_id, const char *text, size_t text_len)
{
    uint8_t *b = buf;
    if (text_len > TV__FP_MAX_TEXT)
        text_len = TV__FP_MAX_TEXT;
    if (!hdr(b, cap, TV__FP_ERROR, 40 + text_len))
        return 0;
    put32(b + 16, (uint32_t)code);
    put32(b + 20, flags);
    put64(b + 24, req_id);
    put32(b + 32, open_id);
    put32(b + 36, (uint32_t)text_len);
    for (size_t i = 0; i < text_len; i++)
        b[40 + i] = text[i] ? (uint8_t)text[i] : '?';
    return 40 + text_len;
}

const char *tv__fp_type_name(uint16_t type)
{
    static const char *const names[] = {"UNKNOWN", "HELLO", "HELLO_OK", "OPEN", "OPENED",  "CLOSE",
                                        "CLOSED",  "READ",  "CHUNK",    "DONE", "RELEASE", "ERROR"};
    return type < TV_ARRAY_LEN(names) ? names[type] : "UNKNOWN";
}

int tv__fp_decode(const void *buf, size_t len, uint16_t version, tv__fp_msg *out, tv_error *err)
{
    const uint8_t *b = buf;
    if (!out || (!buf && len))
        return tv__seterr(err, TV_E_INVALID_ARG, "NULL argument");
    memset(out, 0, sizeof(*out));
    if (len < 16 || get32(b) != TV__FP_MAGIC || get32(b + 8) != len || get32(b + 12))
        return tv__seterr(err, TV_E_PROTOCOL, "bad header");
    out->version = get16(b + 4);
    out->type = get16(b + 6);
    out->len = (uint32_t)len;
    if (version && out->version != version)
        return tv__seterr(err, TV_E_VERSION, "version %u", out->version);
    const uint8_t *p = b + 16;
    size_t body = len - 16;
    switch (out->type) {
    case TV__FP_HELLO:
        if (body != 8)
            return tv__seterr(err, TV_E_PROTOCOL, "HELLO length");
        out->u.hello.min_version = get16(p);
        out->u.hello.max_version = get16(p + 2);
        return 0;
    case TV__FP_HELLO_OK:
        if (body != 24)
            return tv__seterr(err, TV_E_PROTOCOL, "HELLO_OK length");
        out->u.hello_ok.version = get16(p);
        out->u.hello_ok.max_msg_len = get32(p + 4);
        out->u.hello_ok.max_requests = get32(p + 8);
        out->u.hello_ok.max_handles = get32(p + 12);
        out->u.hello_ok.session_id = get64(p + 16);
        return 0;
    case TV__FP_OPEN:
        if (body < 8 || body != 8 + get32(p + 4))
            return tv__seterr(err, TV_E_PROTOCOL, "OPEN length");
        out->u.open.open_id = get32(p);
        out->u.open.spec_len = get32(p + 4);
        out->text = (const char *)p + 8;
        out->text_len = out->u.open.spec_len;
        return 0;
    case TV__FP_OPENED:
        if (body != 48)
            return tv__seterr(err, TV_E_PROTOCOL, "OPENED length");
        out->u.opened.open_id = get32(p);
        out->u.opened.handle = get32(p + 4);
        out->u.opened.generation = (int64_t)get64(p + 8);
        out->u.opened.snap_len = get64(p + 16);
        out->u.opened.arena_len = get64(p + 24);
        out->u.opened.slot_len = get32(p + 32);
        out->u.opened.n_slots = get32(p + 36);
        out->u.opened.credit = get32(p + 40);
        return 0;
    case TV__FP_CLOSE:
    case TV__FP_CLOSED:
        if (body != 8)
            return tv__seterr(err, TV_E_PROTOCOL, "CLOSE length");
        out->u.close.handle = get32(p);
        return 0;
    case TV__FP_READ:
    case TV__FP_CHUNK:
    case TV__FP_DONE:
    case TV__FP_RELEASE: {
        size_t ent = out->type == TV__FP_DONE ? 16 : out->type == TV__FP_RELEASE ? 4 : 32;
        if (body < 8 || get32(p + 4) == 0 || body != 8 + ent * get32(p + 4))
            return tv__seterr(err, TV_E_PROTOCOL, "list length");
        out->u.list.handle = get32(p);
        out->u.list.n = get32(p + 4);
        out->entries = p + 8;
        return 0;
    }
    case TV__FP_ERROR:
        if (body < 24 || body != 24 + get32(p + 20))
            return tv__seterr(err, TV_E_PROTOCOL, "ERROR length");
        out->u.error.code = (int32_t)get32(p);
        out->u.error.flags = get32(p + 4);
        out->u.error.req_id = get64(p + 8);
        out->u.error.open_id = get32(p + 16);
        out->u.error.text_len = get32(p + 20);
        out->text = (const char *)p + 24;
        out->text_len = out->u.error.text_len;
        return 0;
    default:
        return tv__seterr(err, TV_E_PROTOCOL, "unknown type %u", out->type);
    }
}

int tv__fp_read_entry(const tv__fp_msg *m, uint32_t i, tv__fp_read_ent *out, tv_error *err)
{
    if (m->type != TV__FP_READ || i >= m->u.list.n)
        return tv__seterr(err, TV_E_INVALID_ARG, "entry");
    const uint8_t *p = m->entries + 32 * i;
    out->req_id = get64(p);
    out->tensor = get32(p + 8);
    out->flags = get32(p + 12);
    out->off = get64(p + 16);
    out->len = get64(p + 24);
    return out->flags ? tv__seterr(err, TV_E_PROTOCOL, "flags") : 0;
}

int tv__fp_chunk_entry(const tv__fp_msg *m, uint32_t i, tv__fp_chunk_ent *out, tv_error *err)
{
    if (m->type != TV__FP_CHUNK || i >= m->u.list.n)
        return tv__seterr(err, TV_E_INVALID_ARG, "entry");
    const uint8_t *p = m->entries + 32 * i;
    out->req_id = get64(p);
    out->handle = get32(p + 8);
    out->slot = get32(p + 12);
    out->slot_off = get32(p + 16);
    out->len = get32(p + 20);
    out->dest_off = get64(p + 24);
    return out->len ? 0 : tv__seterr(err, TV_E_PROTOCOL, "CHUNK len 0");
}

int tv__fp_done_entry(const tv__fp_msg *m, uint32_t i, tv__fp_done_ent *out, tv_error *err)
{
    if (m->type != TV__FP_DONE || i >= m->u.list.n)
        return tv__seterr(err, TV_E_INVALID_ARG, "entry");
    const uint8_t *p = m->entries + 16 * i;
    out->req_id = get64(p);
    out->result = (int32_t)get32(p + 8);
    out->handle = get32(p + 12);
    return 0;
}

int tv__fp_release_entry(const tv__fp_msg *m, uint32_t i, uint32_t *slot, tv_error *err)
{
    if (m->type != TV__FP_RELEASE || i >= m->u.list.n)
        return tv__seterr(err, TV_E_INVALID_ARG, "entry");
    *slot = get32(m->entries + 4 * i);
    return 0;
}

int tv__fp_send(int sock, const void *buf, size_t len, const int *fds, size_t n_fds, tv_error *err)
{
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
    union {
        char b[CMSG_SPACE(sizeof(int) * TV__FP_N_FDS_OPENED)];
        struct cmsghdr align;
    } u;
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    if (n_fds) {
        memset(&u, 0, sizeof(u));
        mh.msg_control = u.b;
        mh.msg_controllen = CMSG_SPACE(sizeof(int) * n_fds);
        struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * n_fds);
        memcpy(CMSG_DATA(c), fds, sizeof(int) * n_fds);
    }
    ssize_t n;
    do
        n = sendmsg(sock, &mh, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    if (n < 0)
        return errno == EAGAIN || errno == EWOULDBLOCK ? -EAGAIN
                                                       : tv__seterr(err, -errno, "sendmsg");
    return (size_t)n == len ? 0 : tv__seterr(err, TV_E_SHORT_IO, "short send");
}

ssize_t tv__fp_recv(int sock, void *buf, size_t cap, int *fds, size_t max_fds, size_t *n_fds,
                    tv_error *err)
{
    struct iovec iov = {.iov_base = buf, .iov_len = cap};
    union {
        char b[CMSG_SPACE(sizeof(int) * 8)];
        struct cmsghdr align;
    } u;
    struct msghdr mh = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.b, .msg_controllen = sizeof(u.b)};
    if (n_fds)
        *n_fds = 0;
    ssize_t n;
    do
        n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
    while (n < 0 && errno == EINTR);
    if (n < 0)
        return errno == EAGAIN || errno == EWOULDBLOCK ? -EAGAIN
                                                       : tv__seterr(err, -errno, "recvmsg");
    size_t kept = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        int got[8];
        memcpy(got, CMSG_DATA(c), sizeof(int) * (k > 8 ? 8 : k));
        for (size_t i = 0; i < k && i < 8; i++) {
            if (kept < max_fds && fds)
                fds[kept++] = got[i];
            else
                tv__sys.close(got[i]);
        }
    }
    if (n_fds)
        *n_fds = kept;
    if (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC))
        return tv__seterr(err, TV_E_PROTOCOL, "truncated datagram");
    return n;
}
