/* Unit tests of tv_model's daemon backend and its session
 * (core/src/reader/daemon.c, session.c), read through the one read API of
 * tensorvault.h, against a fake daemon: a thread on a listening
 * SOCK_SEQPACKET socket that speaks the
 * wire codec (wire/wire.h), hands out its own sealed memfd snapshot (a
 * small tv__snap_build image) and staging arena, and answers READs with
 * chunks of a known byte pattern on the protocol's chunk grid.
 *
 * Covered: connect (no daemon, a busy daemon, another version, a daemon that
 * never answers, a daemon that refuses at accept and closes before or
 * after the HELLO arrived), open (metadata, a refused open, an unsealed memfd, a
 * corrupted snapshot, another model's snapshot), every read call (into,
 * batch split at the session's max_requests, range, rows, f32, get_tensor)
 * with guard bytes around every destination, chunks out of order several to
 * a message, a request failing with ERROR + DONE, and every hostile reply
 * (slot out of range, slot_off + len past the slot, overlapping chunks,
 * dest_off past the end, DONE before all bytes, unknown req_id, EOF mid-read,
 * an unexpected message type): the right error, the session closed, guards
 * untouched, and every slot lent released exactly once. Protocol version 2
 * (the fake's default): shard header reads (READ flag
 * TV__FP_READ_SHARD_HEADER), their refusals and hostile replies; a version-1
 * daemon, or the client forced to offer 1: TV_E_NOT_SUPPORTED, nothing sent.
 * A closed session leaves its models open but detached (reads
 * TV_E_DISCONNECTED, nothing written or sent; metadata stays).
 * The table of operations (reader/model.h) with a backend of the test's
 * own: its errors reach the caller unchanged through every read function,
 * the common checks come first (a refused call never reaches the backend),
 * its check runs before a batch reads anything; a NULL model. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

#include "reader/daemon.h"
#include "reader/serve.h"
#include "wire/wire.h"
#include "snap/snapshot.h"
#include "tensorvault/client.h"
#include "tv_test.h"
#include "util/sys.h"

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif

#define KiB       1024ull
#define MiB       (1024ull * 1024ull)
#define SLOT_LEN  4096u
#define N_SLOTS   8u
#define HDR_LEN   120u
#define DATA_OFF  (8u + HDR_LEN)
#define GUARD     64u
#define GUARD_VAL 0xA5

/* The fake model: tensors laid out back to back in one shard. */
static const uint64_t SH_A[] = {10, 100}; /* F32: 4000 bytes */
static const uint64_t SH_B[] = {3, 2049}; /* BF16: 12294 bytes, four chunks */
static const uint64_t SH_ODD[] = {77};    /* U8 */
static const uint64_t SH_H[] = {8};       /* F16 */
static const uint64_t SH_E[] = {0, 4};    /* F16: empty */
static const tv__snap_tensor_in TENSORS[] = {
    {"a", 1, TV_DTYPE_F32, 2, SH_A, 0, 0, 4000},
    {"b", 1, TV_DTYPE_BF16, 2, SH_B, 0, 4000, 16294},
    {"odd", 3, TV_DTYPE_U8, 1, SH_ODD, 0, 16294, 16371},
    {"h", 1, TV_DTYPE_F16, 1, SH_H, 0, 16371, 16387},
    {"s", 1, TV_DTYPE_I64, 0, NULL, 0, 16387, 16395},
    {"e", 1, TV_DTYPE_F16, 2, SH_E, 0, 16395, 16395},
};
#define N_T      TV_ARRAY_LEN(TENSORS)
#define DATA_LEN 16395u
#define FILE_LEN (DATA_OFF + DATA_LEN)
#define MODEL    "org/fake"
#define GEN      4

/* Object byte x of the shard's object. */
static uint8_t pat(uint64_t x)
{
    return (uint8_t)(x * 131u + 7u + (x >> 9));
}

enum mode {
    M_OK = 0,
    M_REVERSE,     /* every chunk of a request in one CHUNK message, last first */
    M_SLOT_RANGE,  /* slot == n_slots */
    M_SLOT_OFF,    /* slot_off + len past the slot */
    M_OVERLAP,     /* the first chunk twice */
    M_DEST_PAST,   /* dest_off + len past the request */
    M_DONE_EARLY,  /* the last chunk left out, DONE 0 */
    M_UNKNOWN_REQ, /* req_id never sent */
    M_EOF,         /* close after the first chunk */
    M_REQ_ERROR,   /* tensor 'b' fails: ERROR + DONE -EIO */
    M_BAD_TYPE,    /* HELLO_OK in the middle of a read */
    M_UNSEALED,    /* snapshot memfd without seals */
    M_BAD_SNAP,    /* a flipped byte in the snapshot */
    M_OTHER_MODEL, /* the snapshot of another model */
    M_OPEN_DENIED, /* OPEN answered ERROR TV_E_PEER_DENIED */
    M_BUSY,        /* fatal ERROR TV_E_BUSY instead of HELLO_OK */
    M_VERSION,     /* HELLO_OK with version 4 (the client offers 1..3) */
    M_SILENT,      /* never answers HELLO */
    M_MANY,        /* max_requests 5000 (a batch over several READs of 2047) */
    M_STALL,       /* never answers a READ */
    M_FATAL,       /* a fatal ERROR instead of a READ's chunks */
    M_RANDOM,      /* one chunk in three mutated at random (seeded) */
    M_DONE_EMPTY,  /* DONE 0 at once, without a chunk */
    /* refusals at accept, as tensorvaultd refuses a connection over its
     * limits: a fatal ERROR first, then the socket closed unread */
    M_BUSY_RESET,   /* TV_E_BUSY once the HELLO arrived: closed with it unread (a reset) */
    M_DENIED_RESET, /* the same with TV_E_PEER_DENIED */
    M_BUSY_EPIPE,   /* TV_E_BUSY and closed before the HELLO is sent (it fails: EPIPE) */
};

typedef struct fake {
    char dir[256], path[108];
    int lsock;
    pthread_t th;
    enum mode mode;
    uint16_t max_version; /* the fake speaks 1..max_version (fake_start: 2) */
    uint16_t version;     /* negotiated (0 before HELLO) */
    uint16_t hello_max;   /* the client's HELLO max_version */
    uint32_t max_requests;
    uint8_t *img;
    size_t img_len;
    int snap_fd, arena_fd;
    uint8_t *arena;
    char failure[256]; /* the fake's own check that failed, if any */
    uint32_t held[N_SLOTS];
    unsigned n_reads, n_closes, n_releases;
    tv__fp_read_ent q[8192]; /* requests received, not yet served */
    unsigned q_head, q_n, outstanding, max_read_n;
    uint64_t rng; /* M_RANDOM's state: set before the client connects */
    bool mutated; /* M_RANDOM changed, dropped or repeated a chunk */
} fake;

static void fake_fail(fake *f, const char *fmt, ...) TV_PRINTF(2, 3);
static void fake_fail(fake *f, const char *fmt, ...)
{
    va_list ap;
    if (f->failure[0])
        return;
    va_start(ap, fmt);
    vsnprintf(f->failure, sizeof(f->failure), fmt, ap);
    va_end(ap);
}

static uint8_t *build_image(const char *model, size_t *len)
{
    tv__snap_device_in d = {0};
    for (int i = 0; i < 16; i++)
        d.uuid[i] = (uint8_t)(0x40 + i);
    d.path = "/var/lib/tv/fake.img";
    d.kind = TV__DEV_FILE;
    d.lba_size = 512;
    d.io_align = 4096;
    d.object_align = 64 * KiB;
    d.size_bytes = 16 * MiB;
    d.region_off = 1 * MiB;
    d.region_len = 15 * MiB;
    d.data_off = 1 * MiB + 64 * KiB;
    tv__snap_replica_in rep = {0, 21, 1 * MiB + 64 * KiB, 64 * KiB};
    tv__snap_shard_in sh = {0};
    sh.name = "model.safetensors";
    sh.file_len = FILE_LEN;
    sh.header_len = HDR_LEN;
    sh.n_replicas = 1;
    sh.replicas = &rep;
    tv__snap_in in = {.model = model,
                      .generation = GEN,
                      .n_devices = 1,
                      .devices = &d,
                      .n_shards = 1,
                      .shards = &sh,
                      .n_tensors = N_T,
                      .tensors = TENSORS,
                      .hash_seed = 0x1234};
    void *buf = NULL;
    tv_error err = {0};
    if (tv__snap_build(&in, &buf, len, &err))
        fail_msg("snapshot build: %s", err.msg);
    return buf;
}

static int make_memfd(const char *name, const void *data, size_t len, unsigned seals)
{
    int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    TV_TEST_CHECK(fd >= 0);
    TV_TEST_CHECK(ftruncate(fd, (off_t)len) == 0);
    if (data)
        TV_TEST_CHECK(pwrite(fd, data, len, 0) == (ssize_t)len);
    if (seals)
        TV_TEST_CHECK(fcntl(fd, F_ADD_SEALS, seals) == 0);
    return fd;
}

/* ---- the fake daemon's side of the protocol ---- */

static uint8_t sbuf[TV__FP_MAX_MSG], rbuf[TV__FP_MAX_MSG];

/* Sends sbuf's first len bytes (0: the message did not encode, a bug of
 * the fake). */
static int srv_send(int s, size_t len, const int *fds, size_t n_fds)
{
    if (!len) {
        fprintf(stderr, "fake daemon: a message did not encode\n");
        return -1;
    }
    return tv__fp_send(s, sbuf, len, fds, n_fds, NULL);
}

/* Receives one message (blocking); 0, or -1 at EOF or on a bad one. */
static int srv_recv(fake *f, int s, tv__fp_msg *m)
{
    size_t nf = 0;
    ssize_t n = tv__fp_recv(s, rbuf, sizeof(rbuf), NULL, 0, &nf, NULL);
    if (n <= 0)
        return -1;
    tv_error e = {0};
    if (tv__fp_decode(rbuf, (size_t)n, f->version, m, &e)) {
        fake_fail(f, "client sent a bad message: %s", e.msg);
        return -1;
    }
    return 0;
}

/* Queues the requests of a READ (the client sends more as requests end). */
static int queue_reads(fake *f, const tv__fp_msg *m)
{
    f->n_reads++;
    for (uint32_t i = 0; i < m->u.list.n; i++) {
        tv__fp_read_ent r;
        if (tv__fp_read_entry(m, i, &r, NULL) || f->q_n == TV_ARRAY_LEN(f->q)) {
            fake_fail(f, "READ entry %u", i);
            return -1;
        }
        if (r.len == 0)
            fake_fail(f, "READ of 0 bytes sent");
        f->q[(f->q_head + f->q_n++) % TV_ARRAY_LEN(f->q)] = r;
        if (++f->outstanding > f->max_requests)
            fake_fail(f, "%u requests outstanding, max_requests %u", f->outstanding,
                      f->max_requests);
    }
    return 0;
}

/* Waits for the RELEASE of exactly the slots just lent. */
static int srv_await_release(fake *f, int s, const uint32_t *slots, uint32_t n)
{
    tv__fp_msg m;
    do
        if (srv_recv(f, s, &m))
            return -1;
    while (m.type == TV__FP_READ && queue_reads(f, &m) == 0);
    if (m.type != TV__FP_RELEASE || m.u.list.handle != 1) {
        fake_fail(f, "expected RELEASE of handle 1, got %s", tv__fp_type_name(m.type));
        return -1;
    }
    if (m.u.list.n != n)
        fake_fail(f, "RELEASE of %u slots, %u were lent", m.u.list.n, n);
    for (uint32_t i = 0; i < m.u.list.n; i++) {
        uint32_t slot;
        if (tv__fp_release_entry(&m, i, &slot, NULL) || slot >= N_SLOTS || !f->held[slot])
            fake_fail(f, "slot %u released but not held", slot);
        else
            f->held[slot]--;
    }
    for (uint32_t i = 0; i < n; i++)
        if (slots[i] < N_SLOTS && f->held[slots[i]])
            fake_fail(f, "slot %u still held after RELEASE", slots[i]);
    f->n_releases++;
    return 0;
}

static uint64_t rnd(fake *f)
{
    f->rng = f->rng * 6364136223846793005ull + 1442695040888963407ull;
    return f->rng >> 33;
}

static int send_done(fake *f, int s, uint64_t req_id, int32_t result)
{
    f->outstanding--;
    tv__fp_done_ent d = {.req_id = req_id, .result = result, .handle = 1};
    return srv_send(s, tv__fp_encode_done(sbuf, sizeof(sbuf), f->version, &d, 1), NULL, 0);
}

/* Answers one request; returns -1 to end the session. */
static int serve_req(fake *f, int s, const tv__fp_read_ent *r)
{
    bool header = r->flags & TV__FP_READ_SHARD_HEADER;
    if (header && (f->version < 2 || r->tensor != 0 || r->off + r->len > DATA_OFF)) {
        fake_fail(f, "READ of shard %u header [%llu, +%llu) in version %u", r->tensor,
                  (unsigned long long)r->off, (unsigned long long)r->len, f->version);
        return -1;
    }
    if (!header && r->tensor >= N_T) {
        fake_fail(f, "READ of tensor %u", r->tensor);
        return -1;
    }
    /* A header read: object bytes [off, off + len) of the one shard. */
    uint64_t P = header ? r->off : DATA_OFF + TENSORS[r->tensor].begin_off + r->off;
    uint64_t E = P + r->len;
    if (f->mode == M_DONE_EMPTY)
        return send_done(f, s, r->req_id, 0);
    if (f->mode == M_REQ_ERROR && r->tensor == 1) {
        const char *txt = "tensor 'b': device /var/lib/tv/fake.img: read failed at offset 69632";
        srv_send(s,
                 tv__fp_encode_error(sbuf, sizeof(sbuf), f->version, -EIO, 0, r->req_id, 0, txt,
                                     strlen(txt)),
                 NULL, 0);
        return send_done(f, s, r->req_id, -EIO);
    }
    tv__fp_chunk_ent ents[8];
    uint32_t slots[8], n = 0;
    for (uint64_t k = P / SLOT_LEN; r->len && k <= (E - 1) / SLOT_LEN; k++) {
        uint64_t lo = k * SLOT_LEN, s0 = P > lo ? P : lo;
        uint64_t e0 = E < lo + SLOT_LEN ? E : lo + SLOT_LEN;
        uint32_t slot = (uint32_t)(k % N_SLOTS);
        for (uint32_t i = 0; i < SLOT_LEN; i++)
            f->arena[(size_t)slot * SLOT_LEN + i] = pat(lo + i);
        tv__fp_chunk_ent c = {.req_id = r->req_id,
                              .handle = 1,
                              .slot = slot,
                              .slot_off = (uint32_t)(s0 - lo),
                              .len = (uint32_t)(e0 - s0),
                              .dest_off = s0 - P};
        bool last = k == (E - 1) / SLOT_LEN, twice = false;
        if (f->mode == M_DONE_EARLY && last && k > P / SLOT_LEN)
            break;
        if (f->mode == M_RANDOM && rnd(f) % 3 == 0) {
            f->mutated = true;
            switch (rnd(f) % 7) {
            case 0:
                c.slot = (uint32_t)(rnd(f) % (2 * N_SLOTS));
                break;
            case 1:
                c.slot_off = (uint32_t)(rnd(f) % SLOT_LEN);
                break;
            case 2:
                c.len = (uint32_t)(1 + rnd(f) % SLOT_LEN);
                break;
            case 3:
                c.dest_off = rnd(f) % (2 * r->len);
                break;
            case 4:
                c.req_id += rnd(f) % 2 ? 1 : (uint64_t)-1;
                break;
            case 5:
                twice = true;
                break;
            default:
                continue; /* dropped */
            }
        }
        if (f->mode == M_SLOT_RANGE)
            c.slot = N_SLOTS;
        if (f->mode == M_SLOT_OFF)
            c.slot_off = SLOT_LEN - c.len + 1;
        if (f->mode == M_DEST_PAST)
            c.dest_off = r->len - c.len + 1;
        if (f->mode == M_UNKNOWN_REQ)
            c.req_id += 1000;
        for (int copies = f->mode == M_OVERLAP || twice ? 2 : 1; copies > 0; copies--) {
            f->held[c.slot < N_SLOTS ? c.slot : 0] += c.slot < N_SLOTS ? 1 : 0;
            ents[n] = c;
            slots[n++] = c.slot;
        }
        if (f->mode == M_REVERSE && !last)
            continue; /* all of them in one message below */
        if (f->mode == M_REVERSE)
            for (uint32_t i = 0; i < n / 2; i++) {
                tv__fp_chunk_ent tmp = ents[i];
                ents[i] = ents[n - 1 - i];
                ents[n - 1 - i] = tmp;
            }
        if (srv_send(s, tv__fp_encode_chunk(sbuf, sizeof(sbuf), f->version, ents, n), NULL, 0))
            return -1;
        /* M_EOF: the daemon goes away once the client gave the chunk back
         * (closing with its RELEASE unread would reset the connection, and
         * the client would report a reset instead of the close under test). */
        if (f->mode == M_EOF) {
            (void)srv_await_release(f, s, slots, n);
            return -1;
        }
        if (f->mode == M_SLOT_RANGE || f->mode == M_SLOT_OFF || f->mode == M_OVERLAP ||
            f->mode == M_DEST_PAST || f->mode == M_UNKNOWN_REQ)
            return -1; /* the client closes the session */
        if (srv_await_release(f, s, slots, n))
            return -1;
        if (f->mode == M_BAD_TYPE) {
            tv__fp_hello_ok h = {.version = f->version,
                                 .max_msg_len = TV__FP_MAX_MSG,
                                 .max_requests = 3,
                                 .max_handles = 4};
            if (srv_send(s, tv__fp_encode_hello_ok(sbuf, sizeof(sbuf), &h), NULL, 0))
                fake_fail(f, "HELLO_OK does not encode");
            return -1;
        }
        n = 0;
    }
    return send_done(f, s, r->req_id, 0);
}

/* A refusal at accept: the HELLO is never read. */
static bool refuses_at_accept(const fake *f)
{
    return f->mode == M_BUSY_RESET || f->mode == M_DENIED_RESET || f->mode == M_BUSY_EPIPE;
}

static void serve(fake *f, int s)
{
    tv__fp_msg m;
    if (refuses_at_accept(f)) {
        if (f->mode != M_BUSY_EPIPE) {
            struct pollfd p = {.fd = s, .events = POLLIN};
            if (poll(&p, 1, 5000) != 1)
                fake_fail(f, "no HELLO came");
        }
        bool busy = f->mode != M_DENIED_RESET;
        const char *txt = busy ? "tensorvaultd has 64 fast-path sessions (fastpath.max_sessions)"
                               : "uid 65534 (gid 65534) may open no model on this daemon";
        srv_send(s,
                 tv__fp_encode_error(sbuf, sizeof(sbuf), TV__FP_V1,
                                     busy ? TV_E_BUSY : TV_E_PEER_DENIED, TV__FP_ERROR_FATAL, 0, 0,
                                     txt, strlen(txt)),
                 NULL, 0);
        return;
    }
    if (f->mode == M_SILENT) {
        srv_recv(f, s, &m);
        srv_recv(f, s, &m); /* until the client gives up and closes */
        return;
    }
    if (srv_recv(f, s, &m) || m.type != TV__FP_HELLO) {
        fake_fail(f, "expected HELLO");
        return;
    }
    if (m.u.hello.min_version != 1 || m.u.hello.max_version < 1 ||
        m.u.hello.max_version > TV__FP_VERSION_MAX)
        fake_fail(f, "HELLO %u..%u", m.u.hello.min_version, m.u.hello.max_version);
    f->hello_max = m.u.hello.max_version;
    f->version = m.u.hello.max_version < f->max_version ? m.u.hello.max_version : f->max_version;
    if (f->mode == M_BUSY) {
        const char *txt = "64 sessions are open (max_sessions)";
        srv_send(s,
                 tv__fp_encode_error(sbuf, sizeof(sbuf), f->version, TV_E_BUSY, TV__FP_ERROR_FATAL,
                                     0, 0, txt, strlen(txt)),
                 NULL, 0);
        return;
    }
    if (f->mode == M_VERSION)
        f->version =
            TV__FP_VERSION_MAX + 1; /* past what the client offered (the codec is the test's) */
    tv__fp_hello_ok h = {.version = f->version,
                         .max_msg_len = TV__FP_MAX_MSG,
                         .max_requests = f->max_requests,
                         .max_handles = 4,
                         .session_id = 77};
    srv_send(s, tv__fp_encode_hello_ok(sbuf, sizeof(sbuf), &h), NULL, 0);
    while (srv_recv(f, s, &m) == 0) {
        if (m.type == TV__FP_OPEN) {
            if (f->mode == M_OPEN_DENIED) {
                const char *txt = "uid 65534 (gid 65534) may not open model 'org/fake'";
                srv_send(s,
                         tv__fp_encode_error(sbuf, sizeof(sbuf), f->version, TV_E_PEER_DENIED, 0, 0,
                                             m.u.open.open_id, txt, strlen(txt)),
                         NULL, 0);
                continue;
            }
            tv__fp_opened o = {.open_id = m.u.open.open_id,
                               .handle = 1,
                               .generation = GEN,
                               .snap_len = f->img_len,
                               .arena_len = (uint64_t)N_SLOTS * SLOT_LEN,
                               .slot_len = SLOT_LEN,
                               .n_slots = N_SLOTS,
                               .credit = N_SLOTS};
            int fds[2] = {f->snap_fd, f->arena_fd};
            srv_send(s, tv__fp_encode_opened(sbuf, sizeof(sbuf), f->version, &o), fds, 2);
        } else if (m.type == TV__FP_CLOSE) {
            f->n_closes++;
            srv_send(s,
                     tv__fp_encode_close(sbuf, sizeof(sbuf), f->version, TV__FP_CLOSED,
                                         m.u.close.handle),
                     NULL, 0);
        } else if (m.type == TV__FP_READ) {
            if (m.u.list.n > f->max_read_n)
                f->max_read_n = m.u.list.n;
            if (queue_reads(f, &m))
                return;
            if (f->mode == M_STALL)
                continue;
            if (f->mode == M_FATAL) {
                const char *txt = "slot 7 of handle 1 released but not held";
                srv_send(s,
                         tv__fp_encode_error(sbuf, sizeof(sbuf), f->version, TV_E_PROTOCOL,
                                             TV__FP_ERROR_FATAL, 0, 0, txt, strlen(txt)),
                         NULL, 0);
                return;
            }
            while (f->q_n) {
                tv__fp_read_ent r = f->q[f->q_head];
                f->q_head = (f->q_head + 1) % TV_ARRAY_LEN(f->q);
                f->q_n--;
                if (serve_req(f, s, &r))
                    return;
            }
        } else {
            fake_fail(f, "unexpected %s from the client", tv__fp_type_name(m.type));
            return;
        }
    }
}

static void *fake_main(void *arg)
{
    fake *f = arg;
    int s = accept4(f->lsock, NULL, NULL, SOCK_CLOEXEC);
    if (s < 0) {
        fake_fail(f, "accept: %s", strerror(errno));
        return NULL;
    }
    serve(f, s);
    /* Until the client closes (it must, after a hostile reply), except
     * where the test is the daemon going away. */
    tv__fp_msg m;
    while (f->mode != M_EOF && !refuses_at_accept(f) && srv_recv(f, s, &m) == 0)
        ;
    shutdown(s, SHUT_RDWR);
    close(s);
    return NULL;
}

static fake *fake_start(enum mode mode)
{
    fake *f = calloc(1, sizeof(*f));
    TV_TEST_CHECK(f);
    f->mode = mode;
    f->max_version = 2;
    f->max_requests = mode == M_MANY ? 5000 : 3;
    tv_test_tmpdir(f->dir, sizeof(f->dir), "client");
    tv_test_path(f->path, sizeof(f->path), "%s/tv.sock", f->dir);
    f->img = build_image(mode == M_OTHER_MODEL ? "org/other" : MODEL, &f->img_len);
    if (mode == M_BAD_SNAP)
        f->img[f->img_len - 1] ^= 0x40;
    f->snap_fd = make_memfd(
        "tv-snap", f->img, f->img_len,
        mode == M_UNSEALED ? 0 : F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
    f->arena_fd = make_memfd("tv-arena", NULL, (size_t)N_SLOTS * SLOT_LEN, 0);
    f->arena =
        mmap(NULL, (size_t)N_SLOTS * SLOT_LEN, PROT_READ | PROT_WRITE, MAP_SHARED, f->arena_fd, 0);
    TV_TEST_CHECK(f->arena != MAP_FAILED);
    TV_TEST_CHECK(fcntl(f->arena_fd, F_ADD_SEALS,
                        F_SEAL_FUTURE_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0);
    f->lsock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    TV_TEST_CHECK(f->lsock >= 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    memcpy(sa.sun_path, f->path, strlen(f->path));
    TV_TEST_CHECK(bind(f->lsock, (struct sockaddr *)&sa, sizeof(sa)) == 0);
    TV_TEST_CHECK(listen(f->lsock, 4) == 0);
    TV_TEST_CHECK(pthread_create(&f->th, NULL, fake_main, f) == 0);
    return f;
}

/* Joins the fake (the client must have closed its session) and checks
 * that every slot it lent came back. */
static void fake_stop(fake *f, bool all_released)
{
    pthread_join(f->th, NULL);
    if (f->failure[0])
        fail_msg("fake daemon: %s", f->failure);
    for (uint32_t i = 0; all_released && i < N_SLOTS; i++)
        if (f->held[i])
            fail_msg("slot %u still held (%u references)", i, f->held[i]);
    close(f->lsock);
    close(f->snap_fd);
    munmap(f->arena, (size_t)N_SLOTS * SLOT_LEN);
    close(f->arena_fd);
    free(f->img);
    tv_test_rmtree(f->dir);
    free(f);
}

/* ---- guarded destinations ---- */

typedef struct gbuf {
    uint8_t *raw;
    size_t len;
} gbuf;

static uint8_t *gbuf_new(gbuf *g, size_t len)
{
    g->len = len;
    g->raw = malloc(len + 2 * GUARD);
    TV_TEST_CHECK(g->raw);
    memset(g->raw, GUARD_VAL, len + 2 * GUARD);
    return g->raw + GUARD;
}

static void gbuf_check(const gbuf *g, const char *what)
{
    for (size_t i = 0; i < GUARD; i++)
        if (g->raw[i] != GUARD_VAL || g->raw[GUARD + g->len + i] != GUARD_VAL)
            fail_msg("%s: guard byte %zu changed", what, i);
}

static void gbuf_free(gbuf *g)
{
    free(g->raw);
}

/* The expected bytes of tensor t from off. */
static void expect_bytes(size_t t, uint64_t off, const uint8_t *got, size_t len, const char *what)
{
    for (size_t i = 0; i < len; i++) {
        uint8_t want = pat(DATA_OFF + TENSORS[t].begin_off + off + i);
        if (got[i] != want)
            fail_msg("%s: byte %zu is 0x%02x, expected 0x%02x", what, i, got[i], want);
    }
}

static tv_client *connect_ms(fake *f, uint32_t timeout_ms)
{
    tv_client *c = NULL;
    tv_error err = {0};
    tv_client_opts o = {.timeout_ms = timeout_ms};
    int rc = tv_client_connect(f->path, &o, &c, &err);
    if (rc)
        fail_msg("connect: %s: %s", tv_err_name(rc), err.msg);
    return c;
}

static tv_client *connect_ok(fake *f)
{
    return connect_ms(f, 5000);
}

static int count_fds(void)
{
    int n = 0;
    for (int fd = 0; fd < 1024; fd++)
        n += fcntl(fd, F_GETFD) >= 0;
    return n;
}

static tv_model *open_ok(tv_client *c)
{
    tv_model *m = NULL;
    tv_error err = {0};
    int rc = tv_model_open_daemon(c, MODEL "@4", NULL, &m, &err);
    if (rc)
        fail_msg("open: %s: %s", tv_err_name(rc), err.msg);
    return m;
}

/* ---- tests ---- */

static void test_spans(void **state)
{
    (void)state;
    tv__fpc_spans s;
    tv__fpc_spans_init(&s);
    assert_int_equal(tv__fpc_spans_add(&s, 100, 50, 1000), 0);
    assert_int_equal(tv__fpc_spans_add(&s, 10, 20, 1000), 0);
    assert_int_equal(tv__fpc_spans_add(&s, 500, 10, 1000), 0); /* past inline storage */
    assert_int_equal(tv__fpc_spans_add(&s, 149, 2, 1000), TV_E_PROTOCOL);
    assert_int_equal(tv__fpc_spans_add(&s, 99, 2, 1000), TV_E_PROTOCOL);
    assert_int_equal(tv__fpc_spans_add(&s, 0, 11, 1000), TV_E_PROTOCOL);
    assert_int_equal(tv__fpc_spans_add(&s, 120, 1, 1000), TV_E_PROTOCOL); /* inside */
    assert_int_equal(tv__fpc_spans_add(&s, 0, 2000, 1000), TV_E_OVERFLOW);
    assert_int_equal(tv__fpc_spans_add(&s, UINT64_MAX, 2, UINT64_MAX), TV_E_OVERFLOW);
    assert_int_equal(tv__fpc_spans_add(&s, 995, 6, 1000), TV_E_OVERFLOW);
    assert_int_equal(tv__fpc_spans_add(&s, 5, 0, 1000), TV_E_PROTOCOL);
    assert_int_equal(s.n, 3);
    assert_int_equal(tv__fpc_spans_add(&s, 30, 70, 1000), 0); /* joins [10,30) and [100,150) */
    assert_int_equal(s.n, 2);
    assert_int_equal(tv__fpc_spans_add(&s, 0, 10, 1000), 0);
    assert_int_equal(tv__fpc_spans_add(&s, 150, 350, 1000), 0);
    assert_int_equal(tv__fpc_spans_add(&s, 510, 490, 1000), 0);
    assert_int_equal(s.n, 1);
    assert_true(s.delivered == 1000);
    assert_true(s.v[0].a == 0 && s.v[0].b == 1000);
    tv__fpc_spans_free(&s);
    /* Many disjoint pieces in random order, then the gaps. */
    tv__fpc_spans_init(&s);
    for (uint64_t i = 0; i < 200; i++)
        assert_int_equal(tv__fpc_spans_add(&s, ((i * 37) % 200) * 10, 5, 2000), 0);
    assert_int_equal(s.n, 200);
    for (uint64_t i = 0; i < 200; i++)
        assert_int_equal(tv__fpc_spans_add(&s, ((i * 91) % 200) * 10 + 5, 5, 2000), 0);
    assert_int_equal(s.n, 1);
    assert_true(s.delivered == 2000);
    tv__fpc_spans_free(&s);
    tv__fpc_spans_free(NULL);
}

/* reader/desc.h: the rules and texts of the common layer, on hand-made
 * descriptors (the reads of both backends are tested with them in
 * test_model and below). */
static void test_shared_desc_rules(void **state)
{
    (void)state;
    static const uint64_t shape[] = {6, 5};
    tv__tdesc d = {.name = "w",
                   .name_len = 1,
                   .dtype = TV_DTYPE_BF16,
                   .rank = 2,
                   .shape = shape,
                   .nbytes = 60,
                   .n_elements = 30};
    uint8_t buf[128];
    uint64_t off = 1, len = 1;
    tv_error err = {0};
    assert_int_equal(tv__tdesc_rows(&d, "w", 2, 5, &off, &len, &err), 0);
    assert_true(off == 20 && len == 30);
    assert_int_equal(tv__tdesc_rows(&d, "w", 3, 7, &off, &len, &err), TV_E_INVALID_ARG);
    assert_true(off == 0 && len == 0);
    assert_non_null(strstr(err.msg, "rows [3, 7) outside [0, 6)"));
    tv__tdesc sub = d;
    sub.dtype = TV_DTYPE_F4; /* 5 x 4 bits: a row is not whole bytes */
    sub.nbytes = 15;
    assert_int_equal(tv__tdesc_rows(&sub, "w", 0, 1, &off, &len, &err),
                     TV_E_ST_NOT_BYTE_ADDRESSABLE);
    assert_int_equal(tv__tdesc_rows(&sub, "w", 1, 1, &off, &len, &err), 0);
    tv__tdesc scalar = {.name = "s", .name_len = 1, .dtype = TV_DTYPE_I64, .nbytes = 8};
    assert_int_equal(tv__tdesc_rows(&scalar, "s", 0, 0, &off, &len, &err), TV_E_INVALID_ARG);
    assert_non_null(strstr(err.msg, "is a scalar"));
    assert_int_equal(tv__tdesc_check_f32(&d, "w", buf, 120, &err), 0);
    assert_int_equal(tv__tdesc_check_f32(&d, "w", buf, 119, &err), TV_E_INVALID_ARG);
    assert_non_null(strstr(err.msg, "as float32 needs 120 bytes"));
    assert_int_equal(tv__tdesc_check_f32(&scalar, "s", buf, 8, &err), TV_E_NOT_SUPPORTED);
    assert_int_equal(tv__tdesc_check_range(&d, "w", 50, 10, buf, 10, &err), 0);
    assert_int_equal(tv__tdesc_check_range(&d, "w", 60, 0, NULL, 0, &err), 0);
    assert_int_equal(tv__tdesc_check_range(&d, "w", 51, 10, buf, 10, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv__tdesc_check_range(&d, "w", UINT64_MAX, 2, buf, 2, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv__tdesc_check_into(&d, "w", buf, 59, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv__tdesc_check_batch(&d, 3, buf, 59, &err), TV_E_INVALID_ARG);
    assert_non_null(strstr(err.msg, "request 3 (tensor 'w')"));
    tv_tensor_desc pub;
    tv__tdesc_public(&d, &pub);
    assert_true(pub.nbytes == 60 && pub.rank == 2 && pub.shape == shape && !strcmp(pub.name, "w"));
    tv__tdesc_public(NULL, &pub);
    assert_true(pub.nbytes == 0 && pub.rank == 0 && pub.name && !*pub.name);
    /* the first failure is a batch's answer */
    tv__batch_err b = {0};
    tv_error e1 = {.msg = "first"}, e2 = {.msg = "second"};
    assert_int_equal(tv__batch_note(&b, 0, &e1), 0);
    assert_int_equal(tv__batch_note(&b, TV_E_NOT_FOUND, &e1), TV_E_NOT_FOUND);
    assert_int_equal(tv__batch_note(&b, TV_E_INVALID_ARG, &e2), TV_E_INVALID_ARG);
    assert_int_equal(tv__batch_answer(&b, &err), TV_E_NOT_FOUND);
    assert_string_equal(err.msg, "first");
    /* a tensor's arena and view; freed by tv_tensor_free */
    tv_tensor *t;
    void *arena;
    assert_int_equal(tv__tensor_new(128, 64, &t, &arena, &err), 0);
    assert_true((uintptr_t)arena % 64 == 0);
    tv__tensor_set(t, 8, &d);
    assert_ptr_equal(t->data, (uint8_t *)arena + 8);
    assert_true(t->nbytes == 60 && t->rank == 2 && t->shape[1] == 5 && t->shape != shape);
    tv_tensor_free(t);
}

static void test_no_daemon(void **state)
{
    (void)state;
    char dir[256], path[300];
    tv_test_tmpdir(dir, sizeof(dir), "client-nod");
    tv_test_path(path, sizeof(path), "%s/none.sock", dir);
    tv_client *c = (tv_client *)1;
    tv_error err = {0};
    assert_int_equal(tv_client_connect(path, NULL, &c, &err), TV_E_NO_DAEMON);
    assert_null(c);
    assert_non_null(strstr(err.msg, path));
    /* A socket nobody listens on any more. */
    int s = socket(AF_UNIX, SOCK_SEQPACKET, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    memcpy(sa.sun_path, path, strlen(path));
    assert_int_equal(bind(s, (struct sockaddr *)&sa, sizeof(sa)), 0);
    close(s);
    assert_int_equal(tv_client_connect(path, NULL, &c, &err), TV_E_NO_DAEMON);
    /* The environment's socket when the path is NULL. */
    setenv("TENSORVAULT_SOCKET", path, 1);
    assert_int_equal(tv_client_connect(NULL, NULL, &c, &err), TV_E_NO_DAEMON);
    assert_non_null(strstr(err.msg, path));
    unsetenv("TENSORVAULT_SOCKET");
    char longp[200];
    memset(longp, 'x', sizeof(longp) - 1);
    longp[sizeof(longp) - 1] = '\0';
    assert_int_equal(tv_client_connect(longp, NULL, &c, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv_client_connect(path, NULL, NULL, &err), TV_E_INVALID_ARG);
    tv_client_close(NULL);
    tv_model_close(NULL);
    tv_test_rmtree(dir);
}

/* A misbehaving fake daemon and what the client must answer: code, with a
 * message holding needle; session_lives: whether the session survives. */
typedef struct fake_case {
    enum mode mode;
    int code;
    const char *needle;
    bool session_lives;
} fake_case;

/* Fails naming case i unless rc and the message are what case k expects. */
static void expect_case(const fake_case *k, size_t i, int rc, const tv_error *err)
{
    if (rc != k->code || !strstr(err->msg, k->needle))
        fail_msg("case %zu: %s: %s", i, tv_err_name(rc), err->msg);
}

static void test_refused_sessions(void **state)
{
    (void)state;
    static const fake_case cases[] = {
        {M_BUSY, TV_E_BUSY, "max_sessions", false},
        {M_VERSION, TV_E_VERSION, "version 4", false},
        {M_SILENT, TV_E_TIMEOUT, "within 200 ms", false},
    };
    for (size_t i = 0; i < TV_ARRAY_LEN(cases); i++) {
        fake *f = fake_start(cases[i].mode);
        tv_client *c = NULL;
        tv_error err = {0};
        tv_client_opts o = {.timeout_ms = 200};
        int rc = tv_client_connect(f->path, &o, &c, &err);
        expect_case(&cases[i], i, rc, &err);
        assert_null(c);
        fake_stop(f, true);
    }
}

/* The client's HELLO waits until the fake has closed its end (then it
 * fails with EPIPE); other messages go out as usual. */
static ssize_t hello_after_close(int sock, const struct msghdr *msg, int flags)
{
    const uint8_t *b = msg->msg_iov[0].iov_base;
    if (msg->msg_iov[0].iov_len >= TV__FP_HDR_LEN && b[6] == TV__FP_HELLO && b[7] == 0) {
        struct pollfd p = {.fd = sock, .events = POLLRDHUP};
        (void)poll(&p, 1, 5000);
    }
    return sendmsg(sock, msg, flags);
}

/* A daemon over its limits refuses at accept: ERROR{code, FATAL} queued,
 * then the socket closed, the HELLO unread (Linux reports a reset before
 * the queued ERROR) or not yet sent (the HELLO fails with EPIPE). The
 * client reports the ERROR's code and text, not TV_E_DISCONNECTED. */
static void test_refused_at_accept(void **state)
{
    (void)state;
    static const fake_case cases[] = {
        {M_BUSY_RESET, TV_E_BUSY,
         "refused the session: tensorvaultd has 64 fast-path sessions (fastpath.max_sessions)",
         false},
        {M_DENIED_RESET, TV_E_PEER_DENIED, "uid 65534 (gid 65534) may open no model on this daemon",
         false},
        {M_BUSY_EPIPE, TV_E_BUSY,
         "refused the session: tensorvaultd has 64 fast-path sessions (fastpath.max_sessions)",
         false},
    };
    for (size_t i = 0; i < TV_ARRAY_LEN(cases); i++) {
        fake *f = fake_start(cases[i].mode);
        tv_client *c = NULL;
        tv_error err = {0};
        tv_client_opts o = {.timeout_ms = 5000};
        if (cases[i].mode == M_BUSY_EPIPE)
            tv__sys.sendmsg = hello_after_close;
        int rc = tv_client_connect(f->path, &o, &c, &err);
        tv__sys_reset();
        expect_case(&cases[i], i, rc, &err);
        assert_null(c);
        fake_stop(f, true);
    }
}

static void test_open_and_metadata(void **state)
{
    (void)state;
    fake *f = fake_start(M_OK);
    tv_client *c = connect_ok(f);
    assert_true(tv_client_session_id(c) == 77);
    tv_model *m = open_ok(c);
    assert_string_equal(tv_model_name(m), MODEL);
    assert_true(tv_model_generation(m) == GEN);
    assert_int_equal(tv_model_n_tensors(m), N_T);
    for (size_t i = 0; i < N_T; i++) {
        tv_tensor_desc d;
        size_t idx = 99;
        assert_int_equal(tv_model_tensor(m, i, &d), 0);
        assert_int_equal(tv_model_find(m, d.name, d.name_len, &idx), 0);
        assert_int_equal(idx, i);
        assert_int_equal(d.nbytes, TENSORS[i].end_off - TENSORS[i].begin_off);
        assert_int_equal(d.rank, TENSORS[i].rank);
        for (uint32_t k = 0; k < d.rank; k++)
            assert_true(d.shape[k] == TENSORS[i].shape[k]);
    }
    tv_tensor_desc d;
    assert_int_equal(tv_model_tensor(m, N_T, &d), TV_E_INVALID_ARG);
    assert_int_equal(tv_model_find(m, "zz", 2, NULL), TV_E_NOT_FOUND);
    /* Not found, bad destinations: errors before anything is sent. */
    tv_error err = {0};
    uint8_t small[16];
    assert_int_equal(tv_read_into(m, "zz", small, sizeof small, &err), TV_E_NOT_FOUND);
    assert_non_null(strstr(err.msg, "zz"));
    assert_int_equal(tv_read_into(m, "a", small, sizeof small, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv_read_range(m, "a", 3990, 11, small, sizeof small, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv_read_rows(m, "s", 0, 1, small, sizeof small, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv_read_f32(m, "odd", small, sizeof small, &err), TV_E_NOT_SUPPORTED);
    uint64_t rl = 0;
    assert_int_equal(tv_rows_len(m, "b", 1, 3, &rl, &err), 0);
    assert_true(rl == 2 * 2049 * 2);
    assert_int_equal(tv_rows_len(m, "b", 2, 4, &rl, &err), TV_E_INVALID_ARG);
    assert_int_equal(f->n_reads, 0);
    tv_model_close(m);
    assert_int_equal(f->n_closes, 1);
    tv_client_close(c);
    fake_stop(f, true);
}

/* Every read call on every tensor, with guards; mode M_OK or M_REVERSE. */
static void reads_all(enum mode mode)
{
    fake *f = fake_start(mode);
    tv_client *c = connect_ok(f);
    tv_model *m = open_ok(c);
    tv_error err = {0};
    char what[64];
    for (size_t i = 0; i < N_T; i++) {
        size_t len = (size_t)(TENSORS[i].end_off - TENSORS[i].begin_off);
        gbuf g;
        uint8_t *d = gbuf_new(&g, len);
        snprintf(what, sizeof what, "read_into %s", TENSORS[i].name);
        int rc = tv_read_into(m, TENSORS[i].name, d, len, &err);
        if (rc)
            fail_msg("%s: %s", what, err.msg);
        expect_bytes(i, 0, d, len, what);
        gbuf_check(&g, what);
        gbuf_free(&g);
        /* get_tensor */
        tv_tensor *t = NULL;
        assert_int_equal(tv_get_tensor(m, TENSORS[i].name, &t, &err), 0);
        assert_true(t->nbytes == len);
        assert_int_equal(t->rank, TENSORS[i].rank);
        expect_bytes(i, 0, t->data, len, "get_tensor");
        tv_tensor_free(t);
    }
    /* A batch of every tensor: 6 requests in READs of at most 3. */
    tv_read_req reqs[N_T];
    gbuf gs[N_T];
    for (size_t i = 0; i < N_T; i++) {
        size_t len = (size_t)(TENSORS[i].end_off - TENSORS[i].begin_off);
        reqs[i] = (tv_read_req){.index = i, .dest = gbuf_new(&gs[i], len), .dest_len = len};
    }
    reqs[3].name = "h";
    unsigned reads0 = f->n_reads;
    assert_int_equal(tv_read_batch(m, reqs, N_T, &err), 0);
    assert_true(f->n_reads - reads0 >= 2);
    for (size_t i = 0; i < N_T; i++) {
        assert_int_equal(reqs[i].result, 0);
        expect_bytes(i, 0, reqs[i].dest, gs[i].len, "batch");
        gbuf_check(&gs[i], "batch");
        gbuf_free(&gs[i]);
    }
    /* Range at an odd offset across chunks, rows, f32. */
    gbuf g;
    uint8_t *d = gbuf_new(&g, 9001);
    assert_int_equal(tv_read_range(m, "b", 1001, 9001, d, 9001, &err), 0);
    expect_bytes(1, 1001, d, 9001, "range");
    gbuf_check(&g, "range");
    gbuf_free(&g);
    d = gbuf_new(&g, 2 * 2049 * 2);
    assert_int_equal(tv_read_rows(m, "b", 1, 3, d, 2 * 2049 * 2, &err), 0);
    expect_bytes(1, 2049 * 2, d, 2 * 2049 * 2, "rows");
    gbuf_check(&g, "rows");
    gbuf_free(&g);
    assert_int_equal(tv_read_rows(m, "b", 2, 2, NULL, 0, &err), 0);
    float want[8];
    uint8_t raw[16];
    for (int i = 0; i < 16; i++)
        raw[i] = pat(DATA_OFF + TENSORS[3].begin_off + (uint64_t)i);
    assert_int_equal(tv_convert_f32(TV_DTYPE_F16, raw, 8, want), 0);
    d = gbuf_new(&g, sizeof want);
    assert_int_equal(tv_read_f32(m, "h", d, sizeof want, &err), 0);
    assert_memory_equal(d, want, sizeof want);
    gbuf_check(&g, "f32");
    gbuf_free(&g);
    d = gbuf_new(&g, 4000);
    assert_int_equal(tv_read_f32(m, "a", d, 4000, &err), 0);
    expect_bytes(0, 0, d, 4000, "f32 of F32");
    gbuf_check(&g, "f32 of F32");
    gbuf_free(&g);
    /* CUDA without a GPU (or a CUDA build): not supported, nothing sent. */
    if (!tv_cuda_available()) {
        unsigned r0 = f->n_reads;
        uint8_t x[8];
        assert_int_equal(tv_read_into_cuda(m, "s", x, sizeof x, NULL, &err), TV_E_NOT_SUPPORTED);
        assert_int_equal(f->n_reads, r0);
    }
    tv_model_close(m);
    tv_client_close(c);
    fake_stop(f, true);
}

static void test_reads(void **state)
{
    (void)state;
    reads_all(M_OK);
}

static void test_reads_out_of_order(void **state)
{
    (void)state;
    reads_all(M_REVERSE);
}

static void test_request_error(void **state)
{
    (void)state;
    fake *f = fake_start(M_REQ_ERROR);
    tv_client *c = connect_ok(f);
    tv_model *m = open_ok(c);
    tv_error err = {0};
    tv_read_req reqs[3];
    gbuf gs[3];
    size_t idx[3] = {0, 1, 2};
    for (size_t i = 0; i < 3; i++) {
        size_t len = (size_t)(TENSORS[idx[i]].end_off - TENSORS[idx[i]].begin_off);
        reqs[i] = (tv_read_req){.index = idx[i], .dest = gbuf_new(&gs[i], len), .dest_len = len};
    }
    assert_int_equal(tv_read_batch(m, reqs, 3, &err), -EIO);
    assert_non_null(strstr(err.msg, "offset 69632"));
    assert_non_null(strstr(err.msg, "'b'"));
    assert_int_equal(reqs[0].result, 0);
    assert_int_equal(reqs[1].result, -EIO);
    assert_int_equal(reqs[2].result, 0);
    expect_bytes(0, 0, reqs[0].dest, gs[0].len, "a");
    expect_bytes(2, 0, reqs[2].dest, gs[2].len, "odd");
    for (size_t i = 0; i < 3; i++) {
        gbuf_check(&gs[i], "request error");
        gbuf_free(&gs[i]);
    }
    /* The session carries on. */
    gbuf g;
    uint8_t *d = gbuf_new(&g, 77);
    assert_int_equal(tv_read_into(m, "odd", d, 77, &err), 0);
    expect_bytes(2, 0, d, 77, "after an error");
    /* Closing the session detaches the model: its reads fail, its
     * metadata stays, and it is the caller's to close. */
    tv_client_close(c);
    memset(d, GUARD_VAL, 77);
    assert_int_equal(tv_read_into(m, "odd", d, 77, &err), TV_E_DISCONNECTED);
    assert_non_null(strstr(err.msg, "closed"));
    for (size_t i = 0; i < 77; i++)
        assert_int_equal(d[i], GUARD_VAL);
    gbuf_check(&g, "after the session closed");
    gbuf_free(&g);
    assert_int_equal(tv_model_n_tensors(m), N_T);
    assert_string_equal(tv_model_name(m), MODEL);
    tv_model_close(m);
    fake_stop(f, true);
}

static void test_hostile_replies(void **state)
{
    (void)state;
    static const fake_case cases[] = {
        {M_SLOT_RANGE, TV_E_PROTOCOL, "outside 8 slots", false},
        {M_SLOT_OFF, TV_E_PROTOCOL, "outside 8 slots", false},
        {M_OVERLAP, TV_E_PROTOCOL, "delivered twice", false},
        {M_DEST_PAST, TV_E_PROTOCOL, "past the request", false},
        {M_DONE_EARLY, TV_E_PROTOCOL, "DONE for tensor 'b' after", false},
        {M_UNKNOWN_REQ, TV_E_PROTOCOL, "not outstanding", false},
        {M_EOF, TV_E_DISCONNECTED, "closed the session", false},
        {M_BAD_TYPE, TV_E_PROTOCOL, "HELLO_OK during a read", false},
    };
    for (size_t i = 0; i < TV_ARRAY_LEN(cases); i++) {
        fake *f = fake_start(cases[i].mode);
        tv_client *c = connect_ok(f);
        tv_model *m = open_ok(c);
        tv_error err = {0};
        gbuf g;
        size_t len = 12294;
        uint8_t *d = gbuf_new(&g, len);
        int rc = tv_read_into(m, "b", d, len, &err);
        expect_case(&cases[i], i, rc, &err);
        gbuf_check(&g, "hostile reply");
        /* The session is closed: later calls say so, metadata still works. */
        assert_int_equal(tv_read_into(m, "b", d, len, &err), TV_E_DISCONNECTED);
        assert_int_equal(tv_model_n_tensors(m), N_T);
        gbuf_check(&g, "after");
        gbuf_free(&g);
        tv_model *m2 = NULL;
        assert_int_equal(tv_model_open_daemon(c, MODEL, NULL, &m2, &err), TV_E_DISCONNECTED);
        tv_model_close(m);
        tv_client_close(c);
        fake_stop(f, false);
    }
}

/* The shard's header bytes (object bytes [0, DATA_OFF)) landed in d. */
static void expect_header(const uint8_t *d, const char *what)
{
    for (size_t i = 0; i < DATA_OFF; i++)
        if (d[i] != pat(i))
            fail_msg("%s: header byte %zu is 0x%02x, expected 0x%02x", what, i, d[i], pat(i));
}

/* Version 2: tv_read_shard_header asks with the READ flag and gets
 * the header bytes; the descriptors come from the snapshot; refusals
 * (shard out of range, dest too small or NULL) send nothing and write
 * nothing. A version-1 daemon (or a client forced to offer 1 only):
 * TV_E_NOT_SUPPORTED, nothing sent, tensor reads unaffected. */
static void test_shard_header(void **state)
{
    (void)state;
    tv_error err = {0};
    tv_shard_desc sd;
    fake *f = fake_start(M_OK);
    tv_client *c = connect_ok(f);
    assert_int_equal(f->hello_max, TV__FP_VERSION_MAX);
    tv_model *m = open_ok(c);
    assert_int_equal(tv_model_n_shards(m), 1);
    assert_int_equal(tv_model_n_shards(NULL), 0);
    assert_int_equal(tv_model_shard(m, 0, &sd), 0);
    assert_int_equal(sd.name_len, strlen("model.safetensors"));
    assert_memory_equal(sd.name, "model.safetensors", sd.name_len);
    assert_int_equal(sd.file_len, FILE_LEN);
    assert_int_equal(sd.header_len, HDR_LEN);
    assert_int_equal(tv_model_shard(m, 1, &sd), TV_E_INVALID_ARG);
    assert_string_equal(sd.name, "");
    assert_int_equal(tv_model_shard(NULL, 0, &sd), TV_E_INVALID_ARG);
    assert_int_equal(tv_model_shard(m, 0, NULL), TV_E_INVALID_ARG);
    gbuf g;
    uint8_t *d = gbuf_new(&g, DATA_OFF);
    assert_int_equal(tv_read_shard_header(m, 0, d, DATA_OFF, &err), 0);
    expect_header(d, "header");
    gbuf_check(&g, "header");
    unsigned reads = f->n_reads;
    memset(d, GUARD_VAL, DATA_OFF);
    assert_int_equal(tv_read_shard_header(m, 1, d, DATA_OFF, &err), TV_E_INVALID_ARG);
    assert_non_null(strstr(err.msg, "shard 1 out of range"));
    assert_int_equal(tv_read_shard_header(m, 0, d, DATA_OFF - 1, &err), TV_E_INVALID_ARG);
    assert_non_null(strstr(err.msg, "model.safetensors"));
    assert_int_equal(tv_read_shard_header(m, 0, NULL, DATA_OFF, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv_read_shard_header(NULL, 0, d, DATA_OFF, &err), TV_E_INVALID_ARG);
    for (size_t i = 0; i < DATA_OFF; i++)
        assert_int_equal(d[i], GUARD_VAL);
    gbuf_check(&g, "refused header reads");
    assert_int_equal(f->n_reads, reads); /* nothing sent */
    /* a larger destination: only the header's bytes are written */
    gbuf g2;
    uint8_t *d2 = gbuf_new(&g2, DATA_OFF + 40);
    assert_int_equal(tv_read_shard_header(m, 0, d2, DATA_OFF + 40, &err), 0);
    expect_header(d2, "header into a larger destination");
    for (size_t i = DATA_OFF; i < DATA_OFF + 40; i++)
        assert_int_equal(d2[i], GUARD_VAL);
    gbuf_free(&g2);
    tv_model_close(m);
    tv_client_close(c);
    fake_stop(f, true);

    /* a daemon of version 1, then a client that offers version 1 only */
    for (int k = 0; k < 2; k++) {
        f = fake_start(M_OK);
        if (k == 0)
            f->max_version = 1; /* read after accept: the client has not connected yet */
        else
            tv__fpc_max_version = TV__FP_V1;
        c = connect_ok(f);
        assert_int_equal(f->hello_max, k == 0 ? TV__FP_VERSION_MAX : 1);
        assert_int_equal(f->version, 1);
        m = open_ok(c);
        memset(d, GUARD_VAL, DATA_OFF);
        reads = f->n_reads;
        assert_int_equal(tv_read_shard_header(m, 0, d, DATA_OFF, &err), TV_E_NOT_SUPPORTED);
        assert_non_null(strstr(err.msg, "version 1"));
        assert_int_equal(f->n_reads, reads);
        for (size_t i = 0; i < DATA_OFF; i++)
            assert_int_equal(d[i], GUARD_VAL);
        assert_int_equal(tv_model_shard(m, 0, &sd), 0); /* metadata needs no round trip */
        gbuf g3;
        uint8_t *d3 = gbuf_new(&g3, 77);
        assert_int_equal(tv_read_into(m, "odd", d3, 77, &err), 0);
        expect_bytes(2, 0, d3, 77, "odd over version 1");
        gbuf_free(&g3);
        tv_model_close(m);
        tv_client_close(c);
        fake_stop(f, true);
        tv__fpc_max_version = TV__FP_VERSION_MAX;
    }
    gbuf_free(&g);
}

/* Hostile replies to a header read: the same checks as for a tensor
 * request (the message names the shard), the session closed, nothing
 * written outside the destination. */
static void test_shard_header_hostile(void **state)
{
    (void)state;
    static const fake_case cases[] = {
        {M_SLOT_RANGE, TV_E_PROTOCOL, "shard header 'model.safetensors': slot 8", false},
        {M_SLOT_OFF, TV_E_PROTOCOL, "outside 8 slots", false},
        {M_OVERLAP, TV_E_PROTOCOL, "delivered twice", false},
        {M_DEST_PAST, TV_E_PROTOCOL, "past the request's 128", false},
        {M_DONE_EMPTY, TV_E_PROTOCOL,
         "DONE for shard header 'model.safetensors' after 0 of its 128", false},
        {M_UNKNOWN_REQ, TV_E_PROTOCOL, "not outstanding", false},
        {M_EOF, TV_E_DISCONNECTED, "closed the session", false},
        {M_BAD_TYPE, TV_E_PROTOCOL, "HELLO_OK during a read", false},
    };
    for (size_t i = 0; i < TV_ARRAY_LEN(cases); i++) {
        fake *f = fake_start(cases[i].mode);
        tv_client *c = connect_ok(f);
        tv_model *m = open_ok(c);
        tv_error err = {0};
        gbuf g;
        uint8_t *d = gbuf_new(&g, DATA_OFF);
        int rc = tv_read_shard_header(m, 0, d, DATA_OFF, &err);
        expect_case(&cases[i], i, rc, &err);
        gbuf_check(&g, "hostile reply to a header read");
        assert_int_equal(tv_read_shard_header(m, 0, d, DATA_OFF, &err), TV_E_DISCONNECTED);
        assert_int_equal(tv_model_n_shards(m), 1);
        gbuf_free(&g);
        tv_model_close(m);
        tv_client_close(c);
        fake_stop(f, false);
    }
}

static void test_bad_opens(void **state)
{
    (void)state;
    static const fake_case cases[] = {
        {M_OPEN_DENIED, TV_E_PEER_DENIED, "may not open model", true},
        {M_UNSEALED, TV_E_PROTOCOL, "not sealed", false},
        {M_BAD_SNAP, TV_E_SNAPSHOT, "checksum", true},
        {M_OTHER_MODEL, TV_E_SNAPSHOT, "org/other", true},
    };
    for (size_t i = 0; i < TV_ARRAY_LEN(cases); i++) {
        fake *f = fake_start(cases[i].mode);
        tv_client *c = connect_ok(f);
        tv_model *m = (tv_model *)1;
        tv_error err = {0};
        int rc = tv_model_open_daemon(c, MODEL, NULL, &m, &err);
        expect_case(&cases[i], i, rc, &err);
        assert_null(m);
        if (cases[i].mode == M_BAD_SNAP || cases[i].mode == M_OTHER_MODEL)
            assert_int_equal(f->n_closes, 1); /* the handle went back */
        /* A live session answers the next open; a dead one says it is closed. */
        rc = tv_model_open_daemon(c, MODEL, NULL, &m, &err);
        assert_int_equal(rc, cases[i].session_lives ? cases[i].code : TV_E_DISCONNECTED);
        tv_client_close(c);
        fake_stop(f, true);
    }
    /* Bad specs never reach the daemon. */
    fake *f = fake_start(M_OK);
    tv_client *c = connect_ok(f);
    tv_model *m = NULL;
    tv_error err = {0};
    assert_int_equal(tv_model_open_daemon(c, "", NULL, &m, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv_model_open_daemon(c, "@3", NULL, &m, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv_model_open_daemon(c, "m@", NULL, &m, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv_model_open_daemon(c, "m@01", NULL, &m, &err), TV_E_INVALID_ARG);
    /* the options are checked as tv_model_open checks them, before any OPEN */
    tv_open_opts bad = {.engine = 7};
    assert_int_equal(tv_model_open_daemon(c, MODEL, &bad, &m, &err), TV_E_INVALID_ARG);
    assert_non_null(strstr(err.msg, "unknown engine 7"));
    bad = (tv_open_opts){.queue_depth = TV_READ_MAX_QUEUE_DEPTH + 1};
    assert_int_equal(tv_model_open_daemon(c, MODEL, &bad, &m, &err), TV_E_INVALID_ARG);
    assert_null(m);
    /* NAME@GEN must get that generation (the fake always sends 4). */
    assert_int_equal(tv_model_open_daemon(c, MODEL "@5", NULL, &m, &err), TV_E_SNAPSHOT);
    assert_non_null(strstr(err.msg, "generation"));
    m = open_ok(c);
    tv_model_close(m);
    tv_client_close(c);
    fake_stop(f, true);
}

/* A batch over several READs: 2047 entries a message at most, the
 * session's max_requests outstanding at most (the fake checks both). */
static void test_large_batch(void **state)
{
    (void)state;
    fake *f = fake_start(M_MANY);
    tv_client *c = connect_ok(f);
    tv_model *m = open_ok(c);
    enum { N = 6000 };
    tv_read_req *reqs = calloc(N, sizeof(*reqs));
    uint8_t *dst = malloc((size_t)N * 8 + 2 * GUARD);
    assert_non_null(reqs);
    assert_non_null(dst);
    memset(dst, GUARD_VAL, (size_t)N * 8 + 2 * GUARD);
    for (size_t i = 0; i < N; i++)
        reqs[i] = (tv_read_req){.index = 4, .dest = dst + GUARD + 8 * i, .dest_len = 8};
    tv_error err = {0};
    assert_int_equal(tv_read_batch(m, reqs, N, &err), 0);
    for (size_t i = 0; i < N; i++) {
        assert_int_equal(reqs[i].result, 0);
        expect_bytes(4, 0, dst + GUARD + 8 * i, 8, "large batch");
    }
    for (size_t i = 0; i < GUARD; i++)
        assert_true(dst[i] == GUARD_VAL && dst[GUARD + (size_t)N * 8 + i] == GUARD_VAL);
    assert_int_equal(f->max_read_n, TV__FP_MAX_READS);
    assert_true(f->n_reads >= 3);
    free(reqs);
    free(dst);
    tv_model_close(m);
    tv_client_close(c);
    fake_stop(f, true);
}

/* A daemon that stops answering, or closes the session with a fatal ERROR,
 * in the middle of a read. */
static void test_stalled_and_fatal(void **state)
{
    (void)state;
    fake *f = fake_start(M_STALL);
    tv_client *c = connect_ms(f, 300);
    tv_model *m = open_ok(c);
    tv_error err = {0};
    gbuf g;
    uint8_t *d = gbuf_new(&g, 12294);
    assert_int_equal(tv_read_into(m, "b", d, 12294, &err), TV_E_TIMEOUT);
    assert_non_null(strstr(err.msg, "within 300 ms"));
    assert_int_equal(tv_read_into(m, "b", d, 12294, &err), TV_E_DISCONNECTED);
    gbuf_check(&g, "stalled");
    tv_model_close(m); /* the session is dead: nothing is sent */
    tv_client_close(c);
    fake_stop(f, false);
    f = fake_start(M_FATAL);
    c = connect_ok(f);
    m = open_ok(c);
    assert_int_equal(tv_read_into(m, "b", d, 12294, &err), TV_E_PROTOCOL);
    assert_non_null(strstr(err.msg, "slot 7 of handle 1 released but not held"));
    assert_int_equal(tv_read_into(m, "b", d, 12294, &err), TV_E_DISCONNECTED);
    assert_non_null(strstr(err.msg, "released but not held"));
    gbuf_check(&g, "fatal");
    gbuf_free(&g);
    tv_client_close(c); /* before the model, this time: either order */
    tv_model_close(m);
    fake_stop(f, false);
}

/* The descriptors an OPEN brings are closed once mapped; closing the model
 * and the session leaves none behind. */
static void test_no_descriptor_leak(void **state)
{
    (void)state;
    fake *f = fake_start(M_OK);
    int before = count_fds();
    tv_client *c = connect_ok(f);
    for (int i = 0; i < 5; i++) {
        tv_model *m = open_ok(c);
        assert_int_equal(count_fds(), before + 2); /* the two ends of the session only */
        tv_model_close(m);
    }
    tv_client_close(c);
    fake_stop(f, true);
    f = fake_start(M_BAD_SNAP);
    before = count_fds();
    c = connect_ok(f);
    tv_model *m = NULL;
    tv_error err = {0};
    assert_int_equal(tv_model_open_daemon(c, MODEL, NULL, &m, &err), TV_E_SNAPSHOT);
    assert_int_equal(count_fds(), before + 2);
    tv_client_close(c);
    fake_stop(f, true);
}

/* Chunks mutated at random (slot, slot_off, len, dest_off, req_id; an
 * entry repeated or dropped): whatever the daemon sends, nothing outside the
 * destination changes, and a read either fails with TV_E_PROTOCOL or
 * succeeds with the right bytes when nothing was changed. */
static void test_random_hostile_chunks(void **state)
{
    (void)state;
    unsigned ok = 0, refused = 0;
    for (unsigned it = 0; it < 120; it++) {
        fake *f = fake_start(M_RANDOM);
        f->rng = 0x9E3779B97F4A7C15ull * (it + 1);
        tv_client *c = connect_ok(f);
        tv_model *m = open_ok(c);
        tv_error err = {0};
        gbuf g;
        uint8_t *d = gbuf_new(&g, 12294);
        int rc = tv_read_into(m, "b", d, 12294, &err);
        gbuf_check(&g, "random chunks");
        if (rc == 0 && !f->mutated) {
            expect_bytes(1, 0, d, 12294, "random chunks, none changed");
            ok++;
        } else if (rc) {
            if (rc != TV_E_PROTOCOL)
                fail_msg("iteration %u: %s: %s", it, tv_err_name(rc), err.msg);
            refused++;
        }
        gbuf_free(&g);
        tv_model_close(m);
        tv_client_close(c);
        fake_stop(f, rc == 0);
    }
    printf("random chunks: %u read right, %u refused\n", ok, refused);
    assert_true(ok > 5 && refused > 50);
}

/* ---- the table of operations (reader/model.h) ---- */

/* A backend of the test's own over the fake snapshot: every operation
 * counts its calls; read_one, read and cuda_sink fail with `code` and a
 * message of their own, check with `check_code` (0: passes). */
typedef struct test_backend {
    tv_model m; /* first, as every backend's */
    uint8_t *img;
    int code, check_code;
    unsigned n_check, n_read_one, n_read, n_cuda, n_close;
    unsigned *closed; /* set at close: the model is gone by then */
} test_backend;

static test_backend *tb_of(const tv_model *m)
{
    return (test_backend *)m;
}

static int tb_check(const tv_model *m, const tv__mreq *r, tv_error *err)
{
    test_backend *b = tb_of(m);
    b->n_check++;
    if (!b->check_code)
        return 0;
    return tv__seterr(err, b->check_code, "test backend: no request %u", r->index);
}

static int tb_read_one(tv_model *m, tv__mreq *r, tv_error *err)
{
    tb_of(m)->n_read_one++;
    return r->result = tv__seterr(err, tb_of(m)->code, "test backend: read_one of %u [%llu, +%llu)",
                                  r->index, (unsigned long long)r->off, (unsigned long long)r->len);
}

static int tb_read(tv_model *m, tv__mreq *r, size_t n, const tv__io_sink *sink, tv_error *err)
{
    (void)sink;
    tb_of(m)->n_read++;
    for (size_t j = 0; j < n; j++)
        r[j].result = tb_of(m)->code;
    return tv__seterr(err, tb_of(m)->code, "test backend: read of %zu requests", n);
}

static int tb_cuda_sink(tv_model *m, void *stream, tv__cuda_sink **out, tv_error *err)
{
    (void)stream;
    (void)out;
    tb_of(m)->n_cuda++;
    return tv__seterr(err, tb_of(m)->code, "test backend: no CUDA sink");
}

static void tb_close(tv_model *m)
{
    (*tb_of(m)->closed)++;
    free(tb_of(m)->img);
}

static const tv__model_ops TB_OPS = {
    .check = tb_check,
    .read_one = tb_read_one,
    .read = tb_read,
    .cuda_sink = tb_cuda_sink,
    .close = tb_close,
};

static tv_model *tb_open(int code, unsigned *closed)
{
    test_backend *b = calloc(1, sizeof(*b));
    size_t len = 0;
    tv_error err = {0};
    TV_TEST_CHECK(b);
    b->m.ops = &TB_OPS;
    b->m.arena_align = 64;
    b->code = code;
    b->closed = closed;
    b->img = build_image(MODEL, &len);
    if (tv__snap_open(b->img, len, TV__SNAP_VERIFY_CHECKSUM, &b->m.snap, &err) ||
        tv__model_init(&b->m, &err))
        fail_msg("test backend: %s", err.msg);
    return &b->m;
}

/* Every read function hands a backend's error back as it came (code and
 * message), after the common checks (a request that fails them never
 * reaches the backend), and writes nothing. */
static void test_ops_errors_pass_through(void **state)
{
    (void)state;
    unsigned closed = 0;
    tv_model *m = tb_open(-EHOSTDOWN, &closed);
    test_backend *b = tb_of(m);
    tv_error err = {0};
    gbuf g;
    uint8_t *d = gbuf_new(&g, 16384);
    memset(d, GUARD_VAL, 16384);
    /* metadata is the common layer's: no operation */
    assert_string_equal(tv_model_name(m), MODEL);
    assert_true(tv_model_generation(m) == GEN);
    assert_int_equal(tv_model_n_tensors(m), N_T);
    assert_int_equal(tv_model_n_shards(m), 1);
    assert_int_equal(tv_model_n_devices(m), 0); /* no n_devices operation */
    tv_device_status ds;
    assert_int_equal(tv_model_device(m, 0, &ds), TV_E_INVALID_ARG);
    struct {
        const char *what;
        int rc;
        const char *msg;
    } cases[] = {
        {"read_into", tv_read_into(m, "b", d, 12294, &err), "read_one of 1 [0, +12294)"},
        {"read_range", tv_read_range(m, "b", 7, 11, d, 11, &err), "read_one of 1 [7, +11)"},
        {"read_rows", tv_read_rows(m, "b", 1, 2, d, 4098, &err), "read_one of 1 [4098, +4098)"},
        {"read_f32 (F32)", tv_read_f32(m, "a", d, 4000, &err), "read_one of 0 [0, +4000)"},
        {"read_f32 (F16)", tv_read_f32(m, "h", d, 32, &err), "read_one of 3 [0, +16)"},
        {"shard_header", tv_read_shard_header(m, 0, d, DATA_OFF, &err), "read_one of 0 [0, +128)"},
    };
    for (size_t i = 0; i < TV_ARRAY_LEN(cases); i++) {
        if (cases[i].rc != -EHOSTDOWN)
            fail_msg("%s: %s, want EHOSTDOWN", cases[i].what, tv_err_name(cases[i].rc));
        /* each case's err was overwritten by the next: check the code only */
    }
    assert_int_equal(b->n_read_one, TV_ARRAY_LEN(cases));
    assert_int_equal(tv_read_into(m, "odd", d, 77, &err), -EHOSTDOWN);
    assert_string_equal(err.msg, "test backend: read_one of 2 [0, +77)");
    tv_tensor *t = (tv_tensor *)1;
    assert_int_equal(tv_get_tensor(m, "b", &t, &err), -EHOSTDOWN);
    assert_null(t);
    assert_string_equal(err.msg, "test backend: read_one of 1 [0, +12294)");
    /* batches: the backend's answer is the batch's; every request its result */
    tv_read_req reqs[3] = {{.name = "a", .dest = d, .dest_len = 4000},
                           {.index = 2, .dest = d + 4000, .dest_len = 77},
                           {.name = "zz", .dest = d, .dest_len = 16}};
    assert_int_equal(tv_read_batch(m, reqs, 2, &err), -EHOSTDOWN);
    assert_string_equal(err.msg, "test backend: read of 2 requests");
    assert_true(reqs[0].result == -EHOSTDOWN && reqs[1].result == -EHOSTDOWN);
    /* a request that fails the common checks is the answer when it comes first */
    tv_read_req r2[2] = {reqs[2], reqs[0]};
    assert_int_equal(tv_read_batch(m, r2, 2, &err), TV_E_NOT_FOUND);
    assert_non_null(strstr(err.msg, "no tensor 'zz'"));
    assert_true(r2[0].result == TV_E_NOT_FOUND && r2[1].result == -EHOSTDOWN);
    assert_int_equal(b->n_read, 2);
    /* the backend's check comes before any read: nothing is read */
    b->check_code = TV_E_NO_REPLICA;
    assert_int_equal(tv_read_batch(m, reqs, 2, &err), TV_E_NO_REPLICA);
    assert_string_equal(err.msg, "test backend: no request 0");
    assert_true(reqs[0].result == TV_E_NO_REPLICA && reqs[1].result == TV_E_NO_REPLICA);
    assert_int_equal(b->n_read, 2);
    b->check_code = 0;
    /* CUDA: the backend's sink error, every request carrying it */
    assert_int_equal(tv_read_batch_cuda(m, reqs, 2, NULL, &err), -EHOSTDOWN);
    assert_string_equal(err.msg, "test backend: no CUDA sink");
    assert_true(reqs[0].result == -EHOSTDOWN && reqs[1].result == -EHOSTDOWN);
    assert_int_equal(tv_read_into_cuda(m, "a", d, 4000, NULL, &err), -EHOSTDOWN);
    assert_int_equal(b->n_cuda, 2);
    /* refused by the common checks: the backend is never asked */
    unsigned calls = b->n_read_one + b->n_read + b->n_check + b->n_cuda;
    uint64_t rl = 0;
    assert_int_equal(tv_read_into(m, "b", d, 12293, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv_read_into(m, "zz", d, 16, &err), TV_E_NOT_FOUND);
    assert_int_equal(tv_read_range(m, "b", 12290, 5, d, 5, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv_read_range(m, "b", 5, 0, NULL, 0, &err), 0);
    assert_int_equal(tv_read_rows(m, "b", 2, 4, d, 16384, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv_read_rows(m, "b", 2, 2, NULL, 0, &err), 0);
    assert_int_equal(tv_rows_len(m, "b", 0, 3, &rl, &err), 0);
    assert_true(rl == 12294);
    assert_int_equal(tv_read_f32(m, "odd", d, 16384, &err), TV_E_NOT_SUPPORTED);
    assert_int_equal(tv_read_shard_header(m, 1, d, DATA_OFF, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv_read_shard_header(m, 0, d, DATA_OFF - 1, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv_read_batch(m, NULL, 1, &err), TV_E_INVALID_ARG);
    assert_int_equal(b->n_read_one + b->n_read + b->n_check + b->n_cuda, calls);
    for (size_t i = 0; i < 16384; i++)
        if (d[i] != GUARD_VAL)
            fail_msg("byte %zu of the destination was written", i);
    gbuf_check(&g, "test backend");
    gbuf_free(&g);
    tv_model_close(m);
    assert_int_equal(closed, 1);
}

/* A NULL model: every function answers without a backend. */
static void test_ops_null_model(void **state)
{
    (void)state;
    tv_error err = {0};
    uint8_t d[16];
    tv_tensor_desc td;
    tv_shard_desc sd;
    tv_device_status ds;
    tv_tensor *t = (tv_tensor *)1;
    uint64_t rl = 1;
    size_t idx = 7;
    tv_read_req r = {.name = "a", .dest = d, .dest_len = sizeof d};
    assert_null(tv_model_name(NULL));
    assert_true(tv_model_generation(NULL) == 0);
    assert_int_equal(tv_model_n_tensors(NULL), 0);
    assert_int_equal(tv_model_n_shards(NULL), 0);
    assert_int_equal(tv_model_n_devices(NULL), 0);
    assert_int_equal(tv_model_n_excluded_devices(NULL), 0);
    assert_int_equal(tv_model_device(NULL, 0, &ds), TV_E_INVALID_ARG);
    assert_int_equal(tv_model_tensor(NULL, 0, &td), TV_E_INVALID_ARG);
    assert_int_equal(tv_model_find(NULL, "a", 1, &idx), TV_E_NOT_FOUND);
    assert_int_equal(idx, 7);
    assert_int_equal(tv_model_shard(NULL, 0, &sd), TV_E_INVALID_ARG);
    assert_string_equal(sd.name, "");
    assert_int_equal(tv_read_into(NULL, "a", d, sizeof d, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv_read_range(NULL, "a", 0, 1, d, sizeof d, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv_read_rows(NULL, "a", 0, 1, d, sizeof d, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv_rows_len(NULL, "a", 0, 1, &rl, &err), TV_E_INVALID_ARG);
    assert_true(rl == 0);
    assert_int_equal(tv_read_f32(NULL, "a", d, sizeof d, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv_get_tensor(NULL, "a", &t, &err), TV_E_INVALID_ARG);
    assert_null(t);
    assert_int_equal(tv_read_shard_header(NULL, 0, d, sizeof d, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv_read_batch(NULL, &r, 1, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv_read_into_cuda(NULL, "a", d, sizeof d, NULL, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv_read_batch_cuda(NULL, &r, 1, NULL, &err), TV_E_INVALID_ARG);
    assert_string_equal(err.msg, "NULL argument");
    tv_model_close(NULL);
    tv_model *m = (tv_model *)1;
    assert_int_equal(tv_model_open_daemon(NULL, MODEL, NULL, &m, &err), TV_E_INVALID_ARG);
}

/* A daemon model whose session was closed (or died): every read function
 * answers TV_E_DISCONNECTED, writes nothing and sends nothing; metadata
 * stays; tv_model_close frees it. */
static void test_ops_closed_session(void **state)
{
    (void)state;
    fake *f = fake_start(M_OK);
    tv_client *c = connect_ok(f);
    tv_model *m = open_ok(c);
    tv_model_close(m); /* closed while the session lives: CLOSE sent */
    assert_int_equal(f->n_closes, 1);
    m = open_ok(c); /* the fake hands out handle 1 again */
    tv_client_close(c);
    tv_error err = {0};
    gbuf g;
    uint8_t *d = gbuf_new(&g, 16384);
    tv_tensor *t = (tv_tensor *)1;
    tv_read_req r[2] = {{.name = "a", .dest = d, .dest_len = 4000},
                        {.index = 2, .dest = d + 4000, .dest_len = 77}};
    int rcs[] = {
        tv_read_into(m, "b", d, 12294, &err),
        tv_read_range(m, "b", 3, 9, d, 9, &err),
        tv_read_rows(m, "b", 0, 1, d, 4098, &err),
        tv_read_f32(m, "h", d, 32, &err),
        tv_get_tensor(m, "a", &t, &err),
        tv_read_shard_header(m, 0, d, DATA_OFF, &err),
        tv_read_batch(m, r, 2, &err),
    };
    for (size_t i = 0; i < TV_ARRAY_LEN(rcs); i++)
        if (rcs[i] != TV_E_DISCONNECTED)
            fail_msg("call %zu: %s, want TV_E_DISCONNECTED", i, tv_err_name(rcs[i]));
    assert_null(t);
    assert_true(r[0].result == TV_E_DISCONNECTED && r[1].result == TV_E_DISCONNECTED);
    assert_non_null(strstr(err.msg, "session"));
    for (size_t i = 0; i < 16384; i++)
        if (d[i] != GUARD_VAL)
            fail_msg("byte %zu of the destination was written", i);
    gbuf_check(&g, "closed session");
    gbuf_free(&g);
    tv_tensor_desc td;
    assert_int_equal(tv_model_tensor(m, 1, &td), 0);
    assert_true(td.nbytes == 12294 && !strcmp(td.name, "b"));
    /* what the fast-path server asks of a model: the snapshot, never a
     * device (a daemon model has none) */
    tv__model_dev md;
    const void *img;
    size_t img_len = 0;
    assert_non_null(tv__model_snap(m));
    assert_int_equal(tv__model_snap_image(m, &img, &img_len), 0);
    assert_true(img_len > 0);
    assert_int_equal(tv__model_dev_info(m, 0, &md), TV_E_INVALID_ARG);
    assert_int_equal(f->n_reads, 0);
    tv_model_close(m);
    assert_int_equal(f->n_closes, 1); /* nothing sent for m */
    fake_stop(f, true);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spans),
        cmocka_unit_test(test_shared_desc_rules),
        cmocka_unit_test(test_no_daemon),
        cmocka_unit_test(test_refused_sessions),
        cmocka_unit_test(test_refused_at_accept),
        cmocka_unit_test(test_open_and_metadata),
        cmocka_unit_test(test_reads),
        cmocka_unit_test(test_reads_out_of_order),
        cmocka_unit_test(test_request_error),
        cmocka_unit_test(test_hostile_replies),
        cmocka_unit_test(test_shard_header),
        cmocka_unit_test(test_shard_header_hostile),
        cmocka_unit_test(test_bad_opens),
        cmocka_unit_test(test_large_batch),
        cmocka_unit_test(test_stalled_and_fatal),
        cmocka_unit_test(test_no_descriptor_leak),
        cmocka_unit_test(test_random_hostile_chunks),
        cmocka_unit_test(test_ops_errors_pass_through),
        cmocka_unit_test(test_ops_null_model),
        cmocka_unit_test(test_ops_closed_session),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
