/* Unit tests of the fast-path server (server/fastpath: tv__fp_start/stop,
 * sessions, read groups, fan-out, credit, close paths, leases) on a store
 * built here: a file image with one imported checkpoint of ~1.2 MiB (about
 * 19 chunks of the 64 KiB slots used here), served by tv__fp on a socket in
 * a temp directory with buffered reads, and spoken to from the test with
 * the wire codec (wire/wire.h) over real SOCK_SEQPACKET sockets.
 *
 * Invariants checked: every tensor (and sub-ranges) read through the fast
 * path equals what the in-process reader returns; the snapshot memfd and
 * the arena are sealed as documented and cannot be mapped writable; two
 * sessions reading the same tensors at once cause about one device copy
 * (shared bytes > 0); a session that never releases gets exactly `credit`
 * CHUNK entries and nothing more while another session completes; every
 * protocol violation (double release, release never held, unknown handle,
 * a message before HELLO, a bad version, descriptors sent by the client, a
 * truncated datagram, a server-to-client type) ends that session with a
 * fatal ERROR then EOF while another session keeps working; CLOSE with
 * requests outstanding answers DONE CANCELLED before CLOSED; a client that
 * vanishes gives its slots back; a handle holds the generation's lease and
 * its close releases it; admit refusals are ERROR TV_E_PEER_DENIED, not
 * fatal; a live socket is not taken over, a stale one is; a failing replica
 * is replaced by the other, and a chunk that fails on every replica fails
 * its request (ERROR naming model, tensor, device, offset, then DONE) and
 * nothing else; a handle keeps its generation when the active one moves;
 * max_groups / max_groups_per_model / max_groups_per_uid / max_handles
 * refuse that OPEN only; a client that never reads
 * is closed once its outbox passes the bound; a peer the peer callback
 * refuses, or one over max_sessions_per_uid, gets its fatal ERROR at
 * connect and holds no session; sessions that hold every slot of a group
 * without releasing are closed (TV_E_TIMEOUT) once another session waits
 * for a slot longer than hold_timeout_ms. Everything runs twice: with
 * the pread engine and with AUTO (io_uring where the kernel has it). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "reader/daemon.h"
#include "wire/wire.h"
#include "fastpath/fastpath.h"
#include "import/import.h"
#include "snap/snapfile.h"
#include "snap/snapshot.h"
#include "store/snapbuild.h"
#include "store/store.h"
#include "tensorvault/client.h"
#include "tensorvault/tensorvault.h"
#include "util/endian.h"
#include "util/sys.h"
#include "tv_test_store.h"

#define MODEL   "fp/demo"
#define SLOT    (64u * 1024u)
#define NSLOTS  16u
#define CREDIT  8u
#define MAXT    16
#define WAIT_MS 10000

static const tv_test_tensor_nd g_spec[] = {
    {"a", "F32", "[100000]", 400000}, {"b", "U8", "[3]", 3},
    {"c", "F16", "[150001]", 300002}, {"empty", "F32", "[0]", 0},
    {"d", "U8", "[333333]", 333333},  {"e", "BF16", "[2,50000]", 200000},
};

static struct {
    tv_test_store s; /* two 16 MiB images; the writer closed after the imports */
    char ck[192], ck2[192];
    size_t n_tensors;
    char names[MAXT][16];
    uint8_t *ref[MAXT];
    uint64_t ref_len[MAXT];
    uint64_t file_len;
    int engine;
} g;

static tv__fp *g_fp;
static int g_run_engine;      /* the read engine of this run of the group */
static uint16_t g_cl_version; /* what cl_hello negotiates in this run: 1 (the legacy arena of
                                 copies) or 3 (the memory tier itself) */

/* ---- the store ---------------------------------------------------------- */

/* Two file images; generation 1 (active) replicated on both, generation 2
 * (another seed, not active) on the first. */
static int group_setup(void **state)
{
    tv_error err = {0};
    tv_model *m = NULL;
    (void)state;
    g.engine = g_run_engine;
    tv_test_store_dir(&g.s, "fp");
    tv_test_path(g.ck, sizeof g.ck, "%s/ck.safetensors", g.s.dir);
    tv_test_path(g.ck2, sizeof g.ck2, "%s/ck2.safetensors", g.s.dir);
    g.file_len = tv_test_write_shard_nd(g.ck, g_spec, TV_ARRAY_LEN(g_spec), 3);
    tv_test_write_shard_nd(g.ck2, g_spec, TV_ARRAY_LEN(g_spec), 4);
    tv_test_store_create(&g.s, &(tv_test_store_opts){.n_images = 2});
    tv__import_opts io = {.activate = true, .strict = true, .devices = g.s.dev, .n_devices = 2};
    tv_test_store_import(&g.s, MODEL, g.ck, &io);
    tv__import_opts io2 = {.strict = true};
    tv_test_store_import(&g.s, MODEL, g.ck2, &io2);
    tv_test_store_close_writer(&g.s);
    tv_open_opts oo = {.no_direct = true};
    if (tv_model_open(g.s.store, MODEL, &oo, &m, &err))
        fail_msg("model open: %s", err.msg);
    assert_int_equal(tv_model_generation(m), 1);
    assert_int_equal(tv_model_n_devices(m), 2);
    g.n_tensors = tv_model_n_tensors(m);
    assert_int_equal(g.n_tensors, TV_ARRAY_LEN(g_spec));
    for (size_t i = 0; i < g.n_tensors; i++) {
        tv_tensor_desc d;
        assert_int_equal(tv_model_tensor(m, i, &d), 0);
        snprintf(g.names[i], sizeof g.names[i], "%s", d.name);
        g.ref_len[i] = d.nbytes;
        g.ref[i] = malloc(d.nbytes ? d.nbytes : 1);
        assert_non_null(g.ref[i]);
        if (d.nbytes)
            assert_int_equal(tv_read_into(m, d.name, g.ref[i], d.nbytes, &err), 0);
    }
    tv_model_close(m);
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    for (size_t i = 0; i < g.n_tensors; i++)
        free(g.ref[i]);
    tv_test_store_teardown(&g.s);
    memset(&g, 0, sizeof g);
    return 0;
}

static size_t tensor_index(const char *name)
{
    for (size_t i = 0; i < g.n_tensors; i++)
        if (strcmp(g.names[i], name) == 0)
            return i;
    fail_msg("no tensor %s", name);
    return 0;
}

/* ---- the server --------------------------------------------------------- */

static tv__fp_opts base_opts(void)
{
    return (tv__fp_opts){.socket_path = g.s.sock,
                         .store_dir = g.s.store,
                         .no_direct = true,
                         .engine = g.engine,
                         .slot_len = SLOT,
                         .group_slots = NSLOTS,
                         .credit = CREDIT,
                         .max_sessions = 8,
                         .max_sessions_per_uid = 8,
                         .max_requests = 256,
                         .max_handles = 4,
                         .readahead = 4}; /* NSLOTS / 4, the most it reads ahead */
}

static void fp_up(const tv__fp_opts *o)
{
    g_fp = tv_test_store_fp_start(&g.s, o);
}

static int setup_fp(void **state)
{
    (void)state;
    tv__fp_opts o = base_opts();
    fp_up(&o);
    return 0;
}

static int teardown_fp(void **state)
{
    (void)state;
    tv__fp_stop(g_fp);
    g_fp = NULL;
    return 0;
}

static tv__fp_stats stats(void)
{
    tv__fp_stats s;
    tv__fp_get_stats(g_fp, &s);
    return s;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ---- a small client ----------------------------------------------------- */

typedef struct creq {
    uint64_t id;
    uint32_t tensor;
    uint8_t *dest;
    uint64_t len;
    bool done;
    int result;
    int n_err;
} creq;

typedef struct cl {
    int fd;
    uint16_t version; /* negotiated (0 before HELLO: version 1's codec) */
    uint64_t session;
    uint32_t handle;
    tv__fp_opened op;
    int snap_fd, arena_fd;
    const uint8_t *arena;
    bool auto_release;
    uint32_t held[4096];
    size_t n_held;
    bool deferred; /* keep CHUNK entries, copy them at release time */
    tv__fp_chunk_ent later[4096];
    size_t n_later;
    creq reqs[64];
    size_t n_reqs;
    size_t n_chunks;
    int err_code;
    uint32_t err_flags;
    uint32_t err_open;
    uint64_t err_req;
    char err_text[TV__FP_MAX_TEXT + 1];
    uint32_t closed;
    bool eof;
} cl;

static uint8_t g_buf[TV__FP_MAX_MSG];

static uint16_t cl_ver(const cl *c)
{
    return c->version ? c->version : (uint16_t)TV__FP_V1;
}

static void sock_addr(struct sockaddr_un *sa)
{
    size_t n = strlen(g.s.sock);
    assert_true(n < sizeof sa->sun_path);
    memcpy(sa->sun_path, g.s.sock, n + 1);
}

static void cl_connect(cl *c)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    memset(c, 0, sizeof(*c));
    c->snap_fd = c->arena_fd = -1;
    c->auto_release = true;
    c->fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    assert_true(c->fd >= 0);
    sock_addr(&sa);
    assert_int_equal(connect(c->fd, (struct sockaddr *)&sa, sizeof sa), 0);
}

static void cl_send(cl *c, const void *buf, size_t len)
{
    tv_error err = {0};
    assert_true(len > 0);
    int rc = tv__fp_send(c->fd, buf, len, NULL, 0, &err);
    if (rc)
        fail_msg("send: %s (%d)", err.msg, rc);
}

/* One datagram into g_buf: its length, 0 at EOF, -1 on timeout. */
static ssize_t cl_recv(cl *c, int *fds, size_t *n_fds, int timeout_ms)
{
    struct pollfd p = {.fd = c->fd, .events = POLLIN};
    tv_error err = {0};
    size_t nf = 0;
    int rc = poll(&p, 1, timeout_ms);
    if (rc == 0)
        return -1;
    assert_int_equal(rc, 1);
    ssize_t n =
        tv__fp_recv(c->fd, g_buf, sizeof g_buf, fds, fds ? TV__FP_N_FDS_OPENED : 0, &nf, &err);
    if (n == -ECONNRESET)
        n = 0;
    if (n < 0)
        fail_msg("recv: %s (%zd)", err.msg, n);
    if (n_fds)
        *n_fds = nf;
    return n;
}

/* HELLO 1..g_cl_version: the daemon picks g_cl_version. */
static void cl_hello(cl *c)
{
    tv__fp_msg m;
    tv_error err = {0};
    uint16_t v = g_cl_version ? g_cl_version : (uint16_t)TV__FP_V1;
    cl_send(c, g_buf, tv__fp_encode_hello(g_buf, sizeof g_buf, 1, v));
    ssize_t n = cl_recv(c, NULL, NULL, WAIT_MS);
    assert_true(n > 0);
    assert_int_equal(tv__fp_decode(g_buf, (size_t)n, 0, &m, &err), 0);
    assert_int_equal(m.type, TV__FP_HELLO_OK);
    assert_int_equal(m.u.hello_ok.version, v);
    assert_int_equal(m.u.hello_ok.max_msg_len, TV__FP_MAX_MSG);
    assert_true(m.u.hello_ok.session_id >= 1);
    c->session = m.u.hello_ok.session_id;
    c->version = v;
}

/* HELLO 1..2: the daemon picks version 2 (the header's too). */
static void cl_hello2(cl *c)
{
    tv__fp_msg m;
    tv_error err = {0};
    cl_send(c, g_buf, tv__fp_encode_hello(g_buf, sizeof g_buf, 1, 2));
    ssize_t n = cl_recv(c, NULL, NULL, WAIT_MS);
    assert_true(n > 0);
    assert_int_equal(tv__fp_decode(g_buf, (size_t)n, 0, &m, &err), 0);
    assert_int_equal(m.type, TV__FP_HELLO_OK);
    assert_int_equal(m.version, 2);
    assert_int_equal(m.u.hello_ok.version, 2);
    c->session = m.u.hello_ok.session_id;
    c->version = 2;
}

static creq *cl_find(cl *c, uint64_t id)
{
    for (size_t i = 0; i < c->n_reqs; i++)
        if (c->reqs[i].id == id)
            return &c->reqs[i];
    fail_msg("reply for unknown request %llu", (unsigned long long)id);
    return NULL;
}

static void cl_release(cl *c, const uint32_t *slots, size_t n)
{
    if (n)
        cl_send(
            c, g_buf,
            tv__fp_encode_release(g_buf, sizeof g_buf, cl_ver(c), c->handle, slots, (uint32_t)n));
}

/* Handles one message; returns its type, 0 at EOF, -1 on timeout. */
static int cl_pump(cl *c, int timeout_ms)
{
    int fds[TV__FP_N_FDS_OPENED];
    size_t nf = 0;
    tv__fp_msg m;
    tv_error err = {0};
    ssize_t n = cl_recv(c, fds, &nf, timeout_ms);
    if (n <= 0) {
        if (n == 0)
            c->eof = true;
        return (int)n;
    }
    assert_int_equal(nf, 0);
    assert_int_equal(tv__fp_decode(g_buf, (size_t)n, cl_ver(c), &m, &err), 0);
    switch (m.type) {
    case TV__FP_CHUNK: {
        uint32_t rel[TV__FP_MAX_CHUNKS];
        size_t n_rel = 0;
        for (uint32_t i = 0; i < m.u.list.n; i++) {
            tv__fp_chunk_ent e;
            assert_int_equal(tv__fp_chunk_entry(&m, i, &e, &err), 0);
            creq *r = cl_find(c, e.req_id);
            assert_false(r->done);
            assert_int_equal(e.handle, c->handle);
            assert_true(e.slot < c->op.n_slots);
            assert_true((uint64_t)e.slot_off + e.len <= c->op.slot_len);
            assert_true(e.dest_off + e.len <= r->len);
            c->n_chunks++;
            if (c->deferred) {
                assert_true(c->n_later < TV_ARRAY_LEN(c->later));
                c->later[c->n_later++] = e;
                continue;
            }
            memcpy(r->dest + e.dest_off, c->arena + (size_t)e.slot * c->op.slot_len + e.slot_off,
                   e.len);
            if (c->auto_release)
                rel[n_rel++] = e.slot;
            else
                c->held[c->n_held++] = e.slot;
        }
        cl_release(c, rel, n_rel);
        break;
    }
    case TV__FP_DONE:
        for (uint32_t i = 0; i < m.u.list.n; i++) {
            tv__fp_done_ent e;
            assert_int_equal(tv__fp_done_entry(&m, i, &e, &err), 0);
            creq *r = cl_find(c, e.req_id);
            assert_false(r->done);
            r->done = true;
            r->result = e.result;
        }
        break;
    case TV__FP_ERROR:
        c->err_code = m.u.error.code;
        c->err_flags = m.u.error.flags;
        c->err_open = m.u.error.open_id;
        c->err_req = m.u.error.req_id;
        snprintf(c->err_text, sizeof c->err_text, "%.*s", (int)m.text_len, m.text);
        if (m.u.error.req_id)
            cl_find(c, m.u.error.req_id)->n_err++;
        break;
    case TV__FP_CLOSED:
        c->closed = m.u.close.handle;
        break;
    default:
        fail_msg("unexpected %s", tv__fp_type_name(m.type));
    }
    return m.type;
}

/* OPEN spec: 0 (handle mapped) or the ERROR's code. */
static int cl_open(cl *c, const char *spec, uint32_t open_id)
{
    int fds[TV__FP_N_FDS_OPENED] = {-1, -1};
    size_t nf = 0;
    tv__fp_msg m;
    tv_error err = {0};
    cl_send(c, g_buf,
            tv__fp_encode_open(g_buf, sizeof g_buf, cl_ver(c), open_id, spec, strlen(spec)));
    ssize_t n = cl_recv(c, fds, &nf, WAIT_MS);
    assert_true(n > 0);
    assert_int_equal(tv__fp_decode(g_buf, (size_t)n, cl_ver(c), &m, &err), 0);
    if (m.type == TV__FP_ERROR) {
        assert_int_equal(nf, 0);
        c->err_code = m.u.error.code;
        c->err_flags = m.u.error.flags;
        c->err_open = m.u.error.open_id;
        snprintf(c->err_text, sizeof c->err_text, "%.*s", (int)m.text_len, m.text);
        return m.u.error.code;
    }
    assert_int_equal(m.type, TV__FP_OPENED);
    assert_int_equal(nf, 2);
    c->op = m.u.opened;
    assert_int_equal(c->op.open_id, open_id);
    c->handle = c->op.handle;
    c->snap_fd = fds[0];
    c->arena_fd = fds[1];
    void *p = mmap(NULL, c->op.arena_len, PROT_READ, MAP_SHARED, c->arena_fd, 0);
    assert_true(p != MAP_FAILED);
    c->arena = p;
    return 0;
}

static void cl_close(cl *c)
{
    if (c->arena)
        munmap((void *)c->arena, c->op.arena_len);
    if (c->snap_fd >= 0)
        close(c->snap_fd);
    if (c->arena_fd >= 0)
        close(c->arena_fd);
    for (size_t i = 0; i < c->n_reqs; i++)
        free(c->reqs[i].dest);
    if (c->fd >= 0)
        close(c->fd);
    memset(c, 0, sizeof(*c));
    c->fd = c->snap_fd = c->arena_fd = -1;
}

/* A connected, greeted client with MODEL open. */
static void cl_ready(cl *c)
{
    cl_connect(c);
    cl_hello(c);
    assert_int_equal(cl_open(c, MODEL, 1), 0);
}

static creq *cl_add(cl *c, uint32_t tensor, uint64_t off, uint64_t len)
{
    assert_true(c->n_reqs < TV_ARRAY_LEN(c->reqs));
    creq *r = &c->reqs[c->n_reqs++];
    (void)off;
    *r = (creq){.id = 1000 + c->n_reqs, .tensor = tensor, .len = len};
    r->dest = calloc(1, len ? len : 1);
    assert_non_null(r->dest);
    return r;
}

/* READ of [off, off + len) of tensor t. */
static creq *cl_read(cl *c, uint32_t t, uint64_t off, uint64_t len)
{
    creq *r = cl_add(c, t, off, len);
    tv__fp_read_ent e = {.req_id = r->id, .tensor = t, .off = off, .len = len};
    cl_send(c, g_buf, tv__fp_encode_read(g_buf, sizeof g_buf, cl_ver(c), c->handle, &e, 1));
    return r;
}

/* One READ message with every tensor, whole. */
static void cl_read_all(cl *c)
{
    tv__fp_read_ent e[MAXT];
    for (size_t i = 0; i < g.n_tensors; i++) {
        creq *r = cl_add(c, (uint32_t)i, 0, g.ref_len[i]);
        e[i] = (tv__fp_read_ent){.req_id = r->id, .tensor = (uint32_t)i, .len = g.ref_len[i]};
    }
    cl_send(
        c, g_buf,
        tv__fp_encode_read(g_buf, sizeof g_buf, cl_ver(c), c->handle, e, (uint32_t)g.n_tensors));
}

static bool cl_all_done(const cl *c)
{
    for (size_t i = 0; i < c->n_reqs; i++)
        if (!c->reqs[i].done)
            return false;
    return true;
}

static void cl_wait_all(cl *c)
{
    while (!cl_all_done(c)) {
        int t = cl_pump(c, WAIT_MS);
        if (t <= 0)
            fail_msg("session %llu: %s while requests are outstanding (last error: %s)",
                     (unsigned long long)c->session, t ? "timeout" : "EOF", c->err_text);
    }
}

/* Every request of c done with 0 and equal to the reference bytes. */
static void cl_check_all(const cl *c)
{
    for (size_t i = 0; i < c->n_reqs; i++) {
        const creq *r = &c->reqs[i];
        assert_true(r->done);
        assert_int_equal(r->result, 0);
        assert_int_equal(r->n_err, 0);
        assert_int_equal(r->len, g.ref_len[r->tensor]);
        if (r->len)
            assert_memory_equal(r->dest, g.ref[r->tensor], r->len);
    }
}

/* The session ends with a fatal ERROR of code, then EOF. */
static void cl_expect_fatal(cl *c, int code, const char *text)
{
    for (;;) {
        int t = cl_pump(c, WAIT_MS);
        if (t <= 0)
            fail_msg("no fatal ERROR before %s", t ? "timeout" : "EOF");
        if (t == TV__FP_ERROR && (c->err_flags & TV__FP_ERROR_FATAL))
            break;
    }
    assert_int_equal(c->err_code, code);
    if (text && !strstr(c->err_text, text))
        fail_msg("fatal ERROR '%s' does not say '%s'", c->err_text, text);
    assert_int_equal(cl_pump(c, WAIT_MS), 0);
}

/* A client that reads tensor t whole and checks it (the session still works). */
static void check_other_works(cl *c, uint32_t t)
{
    size_t first = c->n_reqs;
    cl_read(c, t, 0, g.ref_len[t]);
    cl_wait_all(c);
    assert_int_equal(c->reqs[first].result, 0);
    assert_memory_equal(c->reqs[first].dest, g.ref[t], g.ref_len[t]);
}

static bool leased(void)
{
    bool l = false;
    tv_error err = {0};
    assert_int_equal(tv__snapfile_try_exclusive(g.s.store, MODEL, 1, &l, &err), 0);
    return l;
}

/* leased() once it is `want`, polled for a while: a group is torn down (its
 * lease released) at the end of the loop turn, after CLOSED went out. */
static bool leased_settled(bool want)
{
    bool l = leased();
    for (int i = 0; i < 500 && l != want; i++) {
        sleep_ms(10);
        l = leased();
    }
    return l;
}

/* The counters once the daemon's reads settled (a read ahead lands after the
 * DONE of the request that started it): unchanged over 3 x 20 ms. */
static tv__fp_stats stats_settled(void)
{
    tv__fp_stats a = stats(), b;
    int same = 0;
    for (int i = 0; i < 500 && same < 3; i++) {
        sleep_ms(20);
        b = stats();
        same = b.device_read_bytes == a.device_read_bytes ? same + 1 : 0;
        a = b;
    }
    return a;
}

/* slots_held of session id once the daemon has read what the client sent
 * (RELEASEs go out before the DONE that ends a wait): polled for a while. */
static uint32_t slots_held_settled(uint64_t id, uint32_t want)
{
    uint32_t held = UINT32_MAX;
    for (int i = 0; i < 300; i++) {
        tv__fp_session_info *v = NULL;
        size_t n = 0;
        assert_int_equal(tv__fp_sessions(g_fp, &v, &n), 0);
        for (size_t j = 0; j < n; j++)
            if (v[j].id == id)
                held = v[j].slots_held;
        tv__fp_sessions_free(v, n);
        if (held == want)
            break;
        sleep_ms(10);
    }
    return held;
}

/* ---- tests -------------------------------------------------------------- */

static uint64_t one_copy_bytes(void);

static void test_read_every_tensor(void **state)
{
    (void)state;
    cl c;
    tv_error err = {0};
    cl_ready(&c);
    assert_int_equal(c.handle, 1);
    assert_int_equal(c.op.generation, 1);
    assert_int_equal(c.op.slot_len, SLOT);
    if (c.version >= TV__FP_V3) { /* the tier: one slot per chunk of the generation */
        assert_int_equal(c.op.flags, TV__FP_OPENED_TIER);
        assert_int_equal(c.op.n_slots, one_copy_bytes() / SLOT);
        assert_int_equal(c.op.arena_len, (uint64_t)c.op.n_slots * SLOT);
    } else {
        assert_int_equal(c.op.flags, 0);
        assert_int_equal(c.op.n_slots, NSLOTS);
        assert_true(c.op.arena_len >= (uint64_t)NSLOTS * SLOT);
    }
    assert_int_equal(c.op.credit, CREDIT);

    /* the snapshot memfd: sealed, exactly the image of this generation */
    struct stat sb;
    assert_int_equal(fstat(c.snap_fd, &sb), 0);
    assert_int_equal((uint64_t)sb.st_size, c.op.snap_len);
    int seals = fcntl(c.snap_fd, F_GET_SEALS);
    assert_int_equal(seals & (F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL),
                     F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
    uint8_t *img = malloc(c.op.snap_len);
    assert_non_null(img);
    assert_int_equal(pread(c.snap_fd, img, c.op.snap_len, 0), (ssize_t)c.op.snap_len);
    tv__snap snap;
    assert_int_equal(tv__snap_open(img, c.op.snap_len, TV__SNAP_VERIFY_CHECKSUM, &snap, &err), 0);
    const char *name;
    size_t name_len;
    assert_int_equal(tv__snap_model(&snap, &name, &name_len, &err), 0);
    assert_int_equal(name_len, strlen(MODEL));
    assert_memory_equal(name, MODEL, name_len);
    assert_int_equal(snap.generation, c.op.generation);
    assert_int_equal(snap.n_tensors, g.n_tensors);
    free(img);

    /* the arena: read-only for clients */
    assert_int_equal(fstat(c.arena_fd, &sb), 0);
    assert_int_equal((uint64_t)sb.st_size, c.op.arena_len);
    seals = fcntl(c.arena_fd, F_GET_SEALS);
    if (c.version >= TV__FP_V3) {
        /* the tier punches holes: no write seal, a read-only descriptor
         * whose inode may not be reopened writable by another uid */
        assert_int_equal(seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL),
                         F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
        assert_int_equal(fcntl(c.arena_fd, F_GETFL) & O_ACCMODE, O_RDONLY);
        assert_int_equal(sb.st_mode & 0777, 0400);
    } else {
        assert_true(seals & F_SEAL_FUTURE_WRITE);
        assert_true(seals & F_SEAL_SEAL);
    }
    assert_true(mmap(NULL, c.op.arena_len, PROT_READ | PROT_WRITE, MAP_SHARED, c.arena_fd, 0) ==
                MAP_FAILED);
    assert_int_not_equal(ftruncate(c.arena_fd, 0), 0);

    cl_read_all(&c);
    cl_wait_all(&c);
    cl_check_all(&c);

    /* sub-ranges, unaligned, across chunk boundaries */
    uint32_t a = (uint32_t)tensor_index("a"), d = (uint32_t)tensor_index("d");
    creq *r1 = cl_read(&c, a, 12345, 200001);
    creq *r2 = cl_read(&c, d, 333332, 1);
    creq *r3 = cl_read(&c, d, 7, 0);
    cl_wait_all(&c);
    assert_int_equal(r1->result, 0);
    assert_memory_equal(r1->dest, g.ref[a] + 12345, 200001);
    assert_int_equal(r2->result, 0);
    assert_int_equal(r2->dest[0], g.ref[d][333332]);
    assert_int_equal(r3->result, 0);

    /* refused requests: ERROR + DONE, not fatal */
    creq *b1 = cl_read(&c, (uint32_t)g.n_tensors, 0, 1);
    creq *b2 = cl_read(&c, d, 333333, 1);
    creq *b3 = cl_read(&c, d, UINT64_MAX, 2);
    cl_wait_all(&c);
    assert_int_equal(b1->result, TV_E_INVALID_ARG);
    assert_int_equal(b1->n_err, 1);
    assert_int_equal(b2->result, TV_E_INVALID_ARG);
    assert_int_equal(b2->n_err, 1);
    assert_int_equal(b3->result, TV_E_INVALID_ARG);
    assert_int_equal(c.err_flags & TV__FP_ERROR_FATAL, 0);
    check_other_works(&c, (uint32_t)tensor_index("e"));

    /* the session listing */
    assert_int_equal(slots_held_settled(c.session, 0), 0);
    tv__fp_session_info *v = NULL;
    size_t n = 0;
    assert_int_equal(tv__fp_sessions(g_fp, &v, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(v[0].id, c.session);
    assert_int_equal(v[0].pid, getpid());
    assert_int_equal(v[0].uid, getuid());
    assert_true(v[0].bytes_delivered >= g.file_len - 8 - 200);
    assert_int_equal(v[0].n_handles, 1);
    assert_string_equal(v[0].handles[0].model, MODEL);
    assert_string_equal(v[0].handles[0].spec, MODEL);
    assert_int_equal(v[0].handles[0].generation, 1);
    assert_int_equal(v[0].handles[0].bytes_delivered, v[0].bytes_delivered);
    tv__fp_sessions_free(v, n);

    tv__fp_stats s = stats();
    assert_int_equal(s.sessions, 1);
    assert_int_equal(s.sessions_total, 1);
    assert_int_equal(s.groups, 1);
    assert_true(s.device_read_bytes > 0);
    assert_true(s.delivered_bytes > 0);
    assert_int_equal(s.protocol_errors, 0);

    /* no such model: ERROR naming the OPEN, not fatal */
    assert_int_equal(cl_open(&c, "nosuch", 7), TV_E_NOT_FOUND);
    assert_int_equal(c.err_open, 7);
    assert_int_equal(c.err_flags, 0);
    cl_close(&c);
}

/* Two sessions of the same generation reading everything at once: one
 * group (same arena memfd), about one device copy, shared bytes. */
static void test_fanout(void **state)
{
    (void)state;
    cl a, b;
    struct stat sa, sb;
    cl_ready(&a);
    cl_ready(&b);
    assert_int_equal(fstat(a.arena_fd, &sa), 0);
    assert_int_equal(fstat(b.arena_fd, &sb), 0);
    assert_int_equal(sa.st_ino, sb.st_ino);
    assert_int_equal(stats().groups, 1);
    cl_read_all(&a);
    cl_read_all(&b);
    time_t t0 = time(NULL);
    while (!cl_all_done(&a) || !cl_all_done(&b)) {
        if (!cl_all_done(&a))
            cl_pump(&a, 20);
        if (!cl_all_done(&b))
            cl_pump(&b, 20);
        assert_true(time(NULL) - t0 < 20);
    }
    cl_check_all(&a);
    cl_check_all(&b);
    tv__fp_stats s = stats();
    uint64_t data = 0;
    for (size_t i = 0; i < g.n_tensors; i++)
        data += g.ref_len[i];
    uint64_t one_copy = (g.file_len + SLOT - 1) / SLOT * SLOT;
    assert_int_equal(s.delivered_bytes, 2 * data);
    assert_true(s.device_read_bytes >= data);
    assert_true(s.device_read_bytes <= one_copy + g.n_tensors * SLOT);
    assert_true(s.shared_bytes > 0);
    assert_true(s.shared_bytes >= s.delivered_bytes - s.device_read_bytes);
    cl_close(&a);
    cl_close(&b);
}

/* A small read far from the handle's previous one reads only its envelope
 * from the device; one that follows the previous request reads whole
 * chunks; a small read inside a chunk cached whole reads nothing. Every
 * read delivers the right bytes. */
static uint64_t g_ahead_before;

/* The device bytes the request read itself (its read ahead excluded). */
static uint64_t wait_read(cl *c, creq *r, const uint8_t *want, uint64_t *before)
{
    cl_wait_all(c);
    assert_int_equal(r->result, 0);
    assert_memory_equal(r->dest, want, r->len);
    tv__fp_stats st = stats_settled();
    uint64_t d = st.device_read_bytes - *before, ahead = st.readahead_bytes - g_ahead_before;
    assert_true(ahead <= d);
    *before = st.device_read_bytes;
    g_ahead_before = st.readahead_bytes;
    return d - ahead;
}

static void test_small_reads(void **state)
{
    (void)state;
    cl c, c2;
    cl_ready(&c);
    uint32_t a = (uint32_t)tensor_index("a"), d = (uint32_t)tensor_index("d");
    uint64_t before = stats().device_read_bytes, n;
    g_ahead_before = stats().readahead_bytes;
    /* random small reads: their envelope (one or two 4 KiB blocks), no read ahead */
    creq *r = cl_read(&c, a, 200000, 100);
    n = wait_read(&c, r, g.ref[a] + 200000, &before);
    assert_true(n >= 4096 && n <= 8192);
    r = cl_read(&c, d, 300000, 3000);
    n = wait_read(&c, r, g.ref[d] + 300000, &before);
    assert_true(n >= 4096 && n <= 8192);
    assert_int_equal(stats().readahead_bytes, 0);
    /* the next one follows it: whole chunks (and a read ahead past them) */
    r = cl_read(&c, d, 303000, 3000);
    n = wait_read(&c, r, g.ref[d] + 303000, &before);
    assert_true(n > 8192 && n <= 2 * SLOT);
    assert_true(stats().readahead_bytes > 0);
    /* a large read over the chunk that holds an envelope only: whole chunks */
    r = cl_read(&c, a, 0, g.ref_len[a]);
    n = wait_read(&c, r, g.ref[a], &before);
    assert_true(n >= g.ref_len[a] - 8192);
    /* another session's small read inside a chunk cached whole: no device read */
    cl_ready(&c2);
    r = cl_read(&c2, a, 150000, 50);
    n = wait_read(&c2, r, g.ref[a] + 150000, &before);
    assert_int_equal(n, 0);
    cl_close(&c2);
    cl_close(&c);
}

/* A session that never releases gets exactly `credit` CHUNK entries, then
 * nothing; another session completes meanwhile. */
static void test_credit(void **state)
{
    (void)state;
    cl a, b;
    cl_ready(&a);
    cl_ready(&b);
    a.auto_release = false;
    cl_read_all(&a);
    while (a.n_chunks < CREDIT)
        assert_true(cl_pump(&a, WAIT_MS) > 0);
    assert_int_equal(a.n_chunks, CREDIT);
    cl_read_all(&b);
    cl_wait_all(&b);
    cl_check_all(&b);
    /* nothing more for a (DONE of requests whose chunks all came may) */
    for (;;) {
        int t = cl_pump(&a, 300);
        if (t == -1)
            break;
        assert_int_equal(t, TV__FP_DONE);
    }
    assert_int_equal(a.n_chunks, CREDIT);
    tv__fp_session_info *v = NULL;
    size_t n = 0;
    assert_int_equal(tv__fp_sessions(g_fp, &v, &n), 0);
    assert_int_equal(n, 2);
    assert_int_equal(v[0].id, a.session);
    assert_int_equal(v[0].slots_held, CREDIT);
    tv__fp_sessions_free(v, n);
    assert_int_equal(slots_held_settled(b.session, 0), 0);
    /* releasing lets a finish */
    a.auto_release = true;
    cl_release(&a, a.held, a.n_held);
    a.n_held = 0;
    cl_wait_all(&a);
    cl_check_all(&a);
    cl_close(&a);
    cl_close(&b);
}

/* A fresh greeted session X with MODEL open and a working session G. */
static void fatal_case(void (*act)(cl *x), int code, const char *text, bool open)
{
    cl g0, x;
    uint64_t before = stats().protocol_errors;
    cl_ready(&g0);
    cl_connect(&x);
    if (open) {
        cl_hello(&x);
        assert_int_equal(cl_open(&x, MODEL, 1), 0);
    }
    act(&x);
    cl_expect_fatal(&x, code, text);
    check_other_works(&g0, (uint32_t)tensor_index("c"));
    /* the server forgot x */
    for (int i = 0; i < 200 && stats().sessions != 1; i++)
        sleep_ms(10);
    assert_int_equal(stats().sessions, 1);
    assert_int_equal(stats().protocol_errors, before + 1);
    cl_close(&x);
    cl_close(&g0);
}

static void act_double_release(cl *x)
{
    uint32_t b = (uint32_t)tensor_index("b");
    x->auto_release = false;
    cl_read(x, b, 0, 3);
    cl_wait_all(x);
    assert_int_equal(x->n_held, 1);
    uint32_t two[2] = {x->held[0], x->held[0]};
    cl_release(x, two, 2);
}

static void act_release_not_held(cl *x)
{
    uint32_t s = 3;
    cl_release(x, &s, 1);
}

static void act_unknown_handle(cl *x)
{
    tv__fp_read_ent e = {.req_id = 5, .tensor = 0, .len = 4};
    cl_send(x, g_buf, tv__fp_encode_read(g_buf, sizeof g_buf, cl_ver(x), 99, &e, 1));
}

static void act_before_hello(cl *x)
{
    cl_send(x, g_buf, tv__fp_encode_open(g_buf, sizeof g_buf, TV__FP_V1, 1, MODEL, strlen(MODEL)));
}

static void act_bad_version(cl *x)
{
    cl_send(x, g_buf, tv__fp_encode_hello(g_buf, sizeof g_buf, TV__FP_VERSION_MAX + 1, 9));
}

static void act_send_fd(cl *x)
{
    tv_error err = {0};
    int efd = eventfd(0, EFD_CLOEXEC);
    assert_true(efd >= 0);
    size_t len = tv__fp_encode_hello(g_buf, sizeof g_buf, 1, 1);
    assert_int_equal(tv__fp_send(x->fd, g_buf, len, &efd, 1, &err), 0);
    close(efd);
}

static void act_truncated(cl *x)
{
    size_t len = tv__fp_encode_open(g_buf, sizeof g_buf, cl_ver(x), 1, MODEL, strlen(MODEL));
    cl_send(x, g_buf, len - 3);
}

static void act_server_type(cl *x)
{
    cl_send(x, g_buf, tv__fp_encode_close(g_buf, sizeof g_buf, cl_ver(x), TV__FP_CLOSED, 1));
}

static void act_second_hello(cl *x)
{
    /* its header says the session's version (a HELLO's is its min_version) */
    cl_send(x, g_buf, tv__fp_encode_hello(g_buf, sizeof g_buf, cl_ver(x), cl_ver(x)));
}

static void act_header_version(cl *x)
{
    uint32_t slot = 0;
    size_t len = tv__fp_encode_release(g_buf, sizeof g_buf, cl_ver(x), x->handle, &slot, 1);
    g_buf[4] = cl_ver(x) == 2 ? 1 : 2; /* another header version than the one chosen */
    cl_send(x, g_buf, len);
}

static void test_fatal_header_version(void **state)
{
    (void)state;
    fatal_case(act_header_version, TV_E_VERSION, NULL, true);
}

static void test_fatal_double_release(void **state)
{
    (void)state;
    fatal_case(act_double_release, TV_E_PROTOCOL, "released but not held", true);
}

static void test_fatal_release_not_held(void **state)
{
    (void)state;
    fatal_case(act_release_not_held, TV_E_PROTOCOL, "slot 3 of handle 1 released but not held",
               true);
}

static void test_fatal_unknown_handle(void **state)
{
    (void)state;
    fatal_case(act_unknown_handle, TV_E_PROTOCOL, "handle 99", true);
}

static void test_fatal_before_hello(void **state)
{
    (void)state;
    fatal_case(act_before_hello, TV_E_PROTOCOL, "HELLO", false);
}

static void test_fatal_bad_version(void **state)
{
    (void)state;
    fatal_case(act_bad_version, TV_E_VERSION, NULL, false);
}

static void test_fatal_fds(void **state)
{
    (void)state;
    fatal_case(act_send_fd, TV_E_PROTOCOL, "file descriptors are not accepted", false);
}

static void test_fatal_truncated(void **state)
{
    (void)state;
    fatal_case(act_truncated, TV_E_PROTOCOL, NULL, true);
}

static void test_fatal_server_type(void **state)
{
    (void)state;
    fatal_case(act_server_type, TV_E_PROTOCOL, "CLOSED", true);
}

static void test_fatal_second_hello(void **state)
{
    (void)state;
    fatal_case(act_second_hello, TV_E_PROTOCOL, "HELLO", true);
}

/* CLOSE with requests outstanding: DONE CANCELLED for them, then CLOSED;
 * the references are gone. */
static void test_close_cancels(void **state)
{
    (void)state;
    cl a;
    tv__fp_session_info *v = NULL;
    size_t n = 0;
    cl_ready(&a);
    a.auto_release = false;
    cl_read_all(&a);
    while (a.n_chunks < CREDIT)
        assert_true(cl_pump(&a, WAIT_MS) > 0);
    cl_send(&a, g_buf,
            tv__fp_encode_close(g_buf, sizeof g_buf, cl_ver(&a), TV__FP_CLOSE, a.handle));
    while (!a.closed) {
        int t = cl_pump(&a, WAIT_MS);
        assert_true(t == TV__FP_DONE || t == TV__FP_CLOSED);
        if (t == TV__FP_CLOSED)
            assert_true(cl_all_done(&a)); /* every DONE came before CLOSED */
    }
    assert_int_equal(a.closed, a.handle);
    int cancelled = 0;
    for (size_t i = 0; i < a.n_reqs; i++) {
        assert_true(a.reqs[i].result == 0 || a.reqs[i].result == TV_E_CANCELLED);
        assert_int_equal(a.reqs[i].n_err, 0);
        cancelled += a.reqs[i].result == TV_E_CANCELLED;
    }
    assert_true(cancelled > 0);
    assert_int_equal(tv__fp_sessions(g_fp, &v, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(v[0].slots_held, 0);
    assert_int_equal(v[0].n_handles, 0);
    assert_int_equal(v[0].bytes_delivered, 0); /* of the open handles: none */
    assert_int_equal(v[0].requests_done, g.n_tensors);
    tv__fp_sessions_free(v, n);
    assert_int_equal(stats().groups, 0);
    /* the closed handle is gone: using it is a protocol error */
    uint32_t h1 = a.handle;
    munmap((void *)a.arena, a.op.arena_len);
    close(a.snap_fd);
    close(a.arena_fd);
    a.arena = NULL;
    assert_int_equal(cl_open(&a, MODEL, 2), 0);
    assert_int_equal(a.handle, h1 + 1); /* never reused */
    a.auto_release = true;
    for (size_t i = 0; i < a.n_reqs; i++)
        free(a.reqs[i].dest);
    a.n_reqs = 0;
    a.n_chunks = 0;
    cl_read_all(&a);
    cl_wait_all(&a);
    cl_check_all(&a);
    tv__fp_read_ent e = {.req_id = 5, .tensor = 0, .len = 4};
    cl_send(&a, g_buf, tv__fp_encode_read(g_buf, sizeof g_buf, cl_ver(&a), h1, &e, 1));
    cl_expect_fatal(&a, TV_E_PROTOCOL, "handle 1");
    cl_close(&a);
}

/* Clients that vanish while holding every slot give them back: a new
 * session with credit = group_slots / 2 reads everything. */
static void test_vanished_clients_free_slots(void **state)
{
    (void)state;
    cl a1, a2, b;
    cl_ready(&a1);
    cl_ready(&a2);
    a1.auto_release = a2.auto_release = false;
    cl_read_all(&a1);
    cl_read_all(&a2);
    while (a1.n_chunks < CREDIT)
        assert_true(cl_pump(&a1, WAIT_MS) > 0);
    while (a2.n_chunks < CREDIT)
        assert_true(cl_pump(&a2, WAIT_MS) > 0);
    /* a1 + a2 reference every slot of the group now */
    tv__fp_session_info *v = NULL;
    size_t n = 0;
    assert_int_equal(tv__fp_sessions(g_fp, &v, &n), 0);
    assert_int_equal(n, 2);
    assert_int_equal(v[0].slots_held + v[1].slots_held, NSLOTS);
    tv__fp_sessions_free(v, n);
    cl_close(&a1); /* like kill -9: no CLOSE, just gone */
    cl_close(&a2);
    cl_ready(&b);
    cl_read_all(&b);
    cl_wait_all(&b);
    cl_check_all(&b);
    for (int i = 0; i < 200 && stats().sessions != 1; i++)
        sleep_ms(10);
    assert_int_equal(stats().sessions, 1);
    assert_int_equal(stats().protocol_errors, 0);
    cl_close(&b);
}

/* An open handle holds the generation's lease; CLOSE and EOF release it. */
static void test_lease(void **state)
{
    (void)state;
    cl a;
    assert_false(leased());
    cl_ready(&a);
    assert_true(leased());
    cl_send(&a, g_buf,
            tv__fp_encode_close(g_buf, sizeof g_buf, cl_ver(&a), TV__FP_CLOSE, a.handle));
    assert_int_equal(cl_pump(&a, WAIT_MS), TV__FP_CLOSED);
    assert_false(leased_settled(false)); /* released right after CLOSED went out */
    assert_int_equal(cl_open(&a, MODEL, 2), 0);
    assert_true(leased());
    cl_close(&a);
    for (int i = 0; i < 200 && stats().sessions != 0; i++)
        sleep_ms(10);
    assert_int_equal(stats().sessions, 0);
    assert_false(leased_settled(false)); /* the group goes at the end of that turn */
}

static int g_admit_calls;
static uid_t g_admit_uid;
static gid_t g_admit_gid0;
static int64_t g_admit_gen;
static bool g_admit_pass_first;

static int admit_deny(void *ctx, const char *model, int64_t generation, pid_t pid, uid_t uid,
                      const gid_t *gids, size_t n_gids, tv_error *err)
{
    assert_ptr_equal(ctx, &g_admit_calls);
    assert_true(!strcmp(model, MODEL) || !strcmp(model, "fp/nosuch"));
    assert_int_equal(pid, getpid());
    assert_true(n_gids >= 1);
    g_admit_calls++;
    g_admit_uid = uid;
    g_admit_gid0 = gids[0];
    g_admit_gen = generation;
    if (generation == 0 && g_admit_pass_first)
        return 0; /* the access rules pass; refuse the resolved generation */
    return tv__seterr(err, TV_E_PEER_DENIED,
                      "uid %u (gid %u) may not open model '%s' (allowed: uid:0)", (unsigned)uid,
                      (unsigned)gids[0], model);
}

static void test_admit_refused(void **state)
{
    (void)state;
    cl a;
    tv__fp_opts o = base_opts();
    o.admit = admit_deny;
    o.admit_ctx = &g_admit_calls;
    g_admit_calls = 0;
    fp_up(&o);
    cl_connect(&a);
    cl_hello(&a);
    assert_int_equal(cl_open(&a, MODEL, 4), TV_E_PEER_DENIED);
    assert_int_equal(a.err_open, 4);
    assert_int_equal(a.err_flags, 0);
    assert_non_null(strstr(a.err_text, "may not open model 'fp/demo'"));
    /* refused before anything was opened: generation 0, the spec's name */
    assert_int_equal(g_admit_calls, 1);
    assert_int_equal(g_admit_uid, getuid());
    assert_int_equal(g_admit_gid0, getgid());
    assert_int_equal(g_admit_gen, 0);
    assert_int_equal(cl_open(&a, MODEL "@1", 5), TV_E_PEER_DENIED); /* not fatal */
    assert_int_equal(g_admit_gen, 0);
    /* a peer the rules pass is admitted again with the resolved generation */
    g_admit_pass_first = true;
    g_admit_calls = 0;
    assert_int_equal(cl_open(&a, MODEL, 6), TV_E_PEER_DENIED);
    assert_int_equal(g_admit_calls, 2);
    assert_int_equal(g_admit_gen, 1);
    g_admit_pass_first = false;
    /* a model that does not exist is refused the same way: nothing says it is missing */
    assert_int_equal(cl_open(&a, "fp/nosuch", 7), TV_E_PEER_DENIED);
    assert_int_equal(stats().refused_total, 4);
    assert_int_equal(stats().groups, 0);
    assert_false(leased());
    cl_close(&a);
    tv__fp_stop(g_fp);
    g_fp = NULL;
}

/* max_sessions: the next connection gets ERROR TV_E_BUSY (fatal), then EOF. */
static void test_busy_sessions(void **state)
{
    (void)state;
    cl a, b;
    tv__fp_opts o = base_opts();
    o.max_sessions = 1;
    fp_up(&o);
    cl_connect(&a);
    cl_hello(&a);
    cl_connect(&b);
    cl_expect_fatal(&b, TV_E_BUSY, NULL);
    cl_close(&b);
    cl_close(&a);
    tv__fp_stop(g_fp);
    g_fp = NULL;
}

static bool g_peer_allow;

static int peer_gate(void *ctx, pid_t pid, uid_t uid, const gid_t *gids, size_t n_gids,
                     tv_error *err)
{
    assert_ptr_equal(ctx, &g_admit_calls);
    assert_int_equal(pid, getpid());
    assert_int_equal(uid, getuid());
    assert_true(n_gids >= 1 && gids[0] == getgid());
    g_admit_calls++;
    if (g_peer_allow)
        return 0;
    return tv__seterr(err, TV_E_PEER_DENIED, "uid %u (gid %u) may open no model on this daemon",
                      (unsigned)uid, (unsigned)gids[0]);
}

/* A peer the peer callback refuses gets ERROR{TV_E_PEER_DENIED, FATAL} as
 * the first message (no HELLO needed), then EOF, and holds nothing: more of
 * them than max_sessions, all still connected, leave the sessions to a peer
 * the callback lets in. */
static void test_peer_refused_at_connect(void **state)
{
    (void)state;
    cl x[3], ok;
    tv__fp_opts o = base_opts();
    o.peer = peer_gate;
    o.admit_ctx = &g_admit_calls;
    o.max_sessions = 2;
    g_admit_calls = 0;
    g_peer_allow = false;
    fp_up(&o);
    for (size_t i = 0; i < TV_ARRAY_LEN(x); i++) {
        cl_connect(&x[i]);
        cl_expect_fatal(&x[i], TV_E_PEER_DENIED, "may open no model on this daemon");
    }
    assert_int_equal(g_admit_calls, 3);
    assert_int_equal(stats().sessions, 0);
    assert_int_equal(stats().sessions_total, 0);
    g_peer_allow = true;
    cl_ready(&ok);
    check_other_works(&ok, (uint32_t)tensor_index("b"));
    assert_int_equal(stats().sessions, 1);
    for (size_t i = 0; i < TV_ARRAY_LEN(x); i++)
        cl_close(&x[i]);
    cl_close(&ok);
    tv__fp_stop(g_fp);
    g_fp = NULL;
}

/* max_sessions_per_uid: a connection of a uid that has that many sessions
 * gets ERROR{TV_E_BUSY, FATAL} naming the uid and the key, before its
 * HELLO; the uid's sessions work on, and once one ended the uid connects
 * again. */
static void test_busy_per_uid(void **state)
{
    (void)state;
    cl a, b, c, d;
    char want[96];
    tv__fp_opts o = base_opts();
    o.max_sessions_per_uid = 2;
    fp_up(&o);
    cl_ready(&a);
    cl_ready(&b);
    cl_connect(&c);
    snprintf(want, sizeof want,
             "uid %u has 2 fast-path sessions (fastpath.max_sessions_per_uid = 2)",
             (unsigned)getuid());
    cl_expect_fatal(&c, TV_E_BUSY, want);
    check_other_works(&a, (uint32_t)tensor_index("b"));
    cl_close(&b);
    for (int i = 0; i < 500 && stats().sessions != 1; i++)
        sleep_ms(10);
    assert_int_equal(stats().sessions, 1);
    cl_ready(&d);
    check_other_works(&d, (uint32_t)tensor_index("b"));
    cl_close(&a);
    cl_close(&c);
    cl_close(&d);
    tv__fp_stop(g_fp);
    g_fp = NULL;
}

/* A live socket is refused (-EADDRINUSE); a stale one is replaced; stop
 * unlinks it. */
static void test_socket_takeover(void **state)
{
    (void)state;
    tv__fp *second = NULL;
    tv_error err = {0};
    struct stat sb;
    tv__fp_opts o = base_opts();
    fp_up(&o);
    assert_int_equal(stat(g.s.sock, &sb), 0);
    assert_true(S_ISSOCK(sb.st_mode));
    assert_int_equal(sb.st_mode & 0777, 0660);
    /* bound under a temporary name, then renamed: none is left */
    char tmp[256];
    snprintf(tmp, sizeof tmp, "%s.%ld.tmp", g.s.sock, (long)getpid());
    assert_int_not_equal(stat(tmp, &sb), 0);
    assert_int_equal(tv__fp_start(&o, &second, &err), -EADDRINUSE);
    assert_null(second);
    tv__fp_stop(g_fp);
    g_fp = NULL;
    assert_int_not_equal(stat(g.s.sock, &sb), 0);
    /* a stale socket file: bound, never listened, closed */
    int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    sock_addr(&sa);
    assert_int_equal(bind(s, (struct sockaddr *)&sa, sizeof sa), 0);
    close(s);
    assert_int_equal(stat(g.s.sock, &sb), 0);
    fp_up(&o);
    cl c;
    cl_ready(&c);
    check_other_works(&c, (uint32_t)tensor_index("b"));
    cl_close(&c);
    tv__fp_stop(g_fp);
    g_fp = NULL;
    /* bad options */
    o.slot_len = 1000;
    assert_int_equal(tv__fp_start(&o, &second, &err), TV_E_INVALID_ARG);
    o = base_opts();
    o.group_slots = CREDIT;
    assert_int_equal(tv__fp_start(&o, &second, &err), TV_E_INVALID_ARG);
    char long_path[200];
    memset(long_path, 'x', sizeof long_path - 1);
    long_path[0] = '/';
    long_path[sizeof long_path - 1] = '\0';
    o = base_opts();
    o.socket_path = long_path;
    assert_int_equal(tv__fp_start(&o, &second, &err), TV_E_INVALID_ARG);
    assert_null(second);
    tv__fp_stop(NULL);
    tv__fp_stats z;
    tv__fp_get_stats(NULL, &z);
    assert_int_equal(z.sessions_total, 0);
}

/* tv__fp_stop with a session mid-transfer: the client sees EOF, the lease
 * is released. */
static void test_stop_with_sessions(void **state)
{
    (void)state;
    cl a;
    tv__fp_opts o = base_opts();
    fp_up(&o);
    cl_ready(&a);
    a.auto_release = false;
    cl_read_all(&a);
    while (a.n_chunks < CREDIT)
        assert_true(cl_pump(&a, WAIT_MS) > 0);
    tv__fp_stop(g_fp);
    g_fp = NULL;
    for (;;) {
        int t = cl_pump(&a, WAIT_MS);
        assert_true(t >= 0);
        if (t == 0)
            break;
    }
    assert_false(leased_settled(false));
    cl_close(&a);
}

/* A client that sends zero-length READs (each answered by a DONE) and never
 * reads: its outbox passes the bound and the daemon closes it. */
static void test_outbox_bound(void **state)
{
    (void)state;
    cl x;
    tv_error err = {0};
    static tv__fp_read_ent e[TV__FP_MAX_READS];
    uint64_t id = 1;
    bool closed = false;
    cl_ready(&x);
    for (int i = 0; i < 400 && !closed; i++) {
        for (uint32_t j = 0; j < TV__FP_MAX_READS; j++)
            e[j] = (tv__fp_read_ent){.req_id = id++, .tensor = 0, .len = 0};
        size_t len =
            tv__fp_encode_read(g_buf, sizeof g_buf, cl_ver(&x), x.handle, e, TV__FP_MAX_READS);
        assert_true(len > 0);
        if (tv__fp_send(x.fd, g_buf, len, NULL, 0, &err))
            closed = true;
    }
    assert_true(closed);
    for (;;) { /* what was queued before the close, then EOF */
        ssize_t n = cl_recv(&x, NULL, NULL, WAIT_MS);
        assert_true(n >= 0);
        if (n == 0)
            break;
    }
    for (int i = 0; i < 200 && stats().sessions != 0; i++)
        sleep_ms(10);
    assert_int_equal(stats().sessions, 0);
    assert_int_equal(stats().protocol_errors, 1);
    assert_false(leased_settled(false));
    cl_close(&x);
}

/* ---- device faults (tv__io_fault: called from the engines' threads) ---- */

static atomic_int g_fail_mask; /* bit d: every read of device d fails with EIO */
static atomic_long g_fault_hits;

static void hook_fail(uint32_t dev, uint64_t off, size_t len, int64_t *res)
{
    (void)off, (void)len;
    if (dev < 31 && (atomic_load(&g_fail_mask) & (1 << dev))) {
        atomic_fetch_add(&g_fault_hits, 1);
        *res = -EIO;
    }
}

static void read_all_ok(void)
{
    cl c;
    cl_ready(&c);
    cl_read_all(&c);
    cl_wait_all(&c);
    cl_check_all(&c);
    cl_close(&c);
}

/* Every read of one replica's device fails: the other replica serves. */
static void test_replica_failover(void **state)
{
    (void)state;
    atomic_store(&g_fault_hits, 0);
    tv__io_fault = hook_fail;
    for (int d = 0; d < 2; d++) {
        atomic_store(&g_fail_mask, 1 << d);
        read_all_ok();
        /* a fresh server: nothing cached */
        tv__fp_stop(g_fp);
        tv__fp_opts o = base_opts();
        fp_up(&o);
    }
    tv__io_fault = NULL;
    atomic_store(&g_fail_mask, 0);
    assert_true(atomic_load(&g_fault_hits) > 0); /* the first replica failed once at least */
}

/* Every replica fails: the request gets ERROR (naming model, tensor,
 * device, offset) then DONE with the error; the session goes on. */
static void test_read_failure(void **state)
{
    (void)state;
    cl c;
    uint32_t d = (uint32_t)tensor_index("d"), a = (uint32_t)tensor_index("a");
    cl_ready(&c);
    tv__io_fault = hook_fail;
    atomic_store(&g_fail_mask, 3);
    creq *r = cl_read(&c, d, 0, g.ref_len[d]);
    cl_wait_all(&c);
    /* Chunk reads of d still in flight fail too (a later waiter on such a
     * chunk gets its failure): clear the fault only when they are done, i.e.
     * when no failure was injected for 500 ms. */
    for (long hits = -1; hits != atomic_load(&g_fault_hits);) {
        hits = atomic_load(&g_fault_hits);
        usleep(500 * 1000);
    }
    tv__io_fault = NULL;
    atomic_store(&g_fail_mask, 0);
    assert_int_equal(r->result, -EIO);
    assert_int_equal(r->n_err, 1);
    assert_int_equal(c.err_code, -EIO);
    assert_int_equal(c.err_flags, 0);
    assert_int_equal(c.err_req, r->id);
    const char *want[] = {"fp/demo", "tensor 'd'", "device", "offset"};
    for (size_t i = 0; i < TV_ARRAY_LEN(want); i++)
        if (!strstr(c.err_text, want[i]))
            fail_msg("ERROR text '%s' does not name %s", c.err_text, want[i]);
    /* the failed chunks were not kept: the same tensor reads now */
    check_other_works(&c, d);
    check_other_works(&c, a);
    assert_int_equal(slots_held_settled(c.session, 0), 0);
    assert_int_equal(stats().protocol_errors, 0);
    cl_close(&c);
}

/* An OPENed handle whose descriptors the test does not keep. */
static uint32_t cl_open_drop(cl *c, const char *spec, uint32_t open_id, int *rc)
{
    *rc = cl_open(c, spec, open_id);
    if (*rc)
        return 0;
    munmap((void *)c->arena, c->op.arena_len);
    close(c->snap_fd);
    close(c->arena_fd);
    c->arena = NULL;
    c->snap_fd = c->arena_fd = -1;
    return c->handle;
}

/* max_groups and max_handles: TV_E_BUSY for that OPEN, not fatal; the
 * same generation through another spec joins its group. */
static void test_limits(void **state)
{
    (void)state;
    cl c;
    int rc;
    tv__fp_opts o = base_opts();
    o.max_groups = 1;
    o.max_handles = 2;
    fp_up(&o);
    cl_connect(&c);
    cl_hello(&c);
    uint32_t h1 = cl_open_drop(&c, MODEL, 1, &rc);
    assert_int_equal(rc, 0);
    cl_open_drop(&c, MODEL "@2", 2, &rc);
    assert_int_equal(rc, TV_E_BUSY);
    assert_int_equal(c.err_open, 2);
    assert_int_equal(c.err_flags, 0);
    cl_open_drop(&c, MODEL "@9", 3, &rc);
    assert_int_equal(rc, TV_E_NOT_FOUND);
    uint32_t h2 = cl_open_drop(&c, MODEL "@1", 4, &rc);
    assert_int_equal(rc, 0);
    assert_int_equal(h2, h1 + 1);
    assert_int_equal(stats().groups, 1);
    cl_open_drop(&c, MODEL, 5, &rc);
    assert_int_equal(rc, TV_E_BUSY);
    assert_non_null(strstr(c.err_text, "max_handles"));
    cl_send(&c, g_buf, tv__fp_encode_close(g_buf, sizeof g_buf, cl_ver(&c), TV__FP_CLOSE, h1));
    assert_int_equal(cl_pump(&c, WAIT_MS), TV__FP_CLOSED);
    assert_int_equal(c.closed, h1);
    assert_int_equal(stats().groups, 1); /* h2 keeps it */
    cl_send(&c, g_buf, tv__fp_encode_close(g_buf, sizeof g_buf, cl_ver(&c), TV__FP_CLOSE, h2));
    assert_int_equal(cl_pump(&c, WAIT_MS), TV__FP_CLOSED);
    assert_int_equal(stats().groups, 0);
    /* generation 2 (not active) by number: its own bytes */
    assert_int_equal(cl_open(&c, MODEL "@2", 6), 0);
    assert_int_equal(c.op.generation, 2);
    uint32_t b = (uint32_t)tensor_index("b");
    creq *r = cl_read(&c, b, 0, 3);
    cl_wait_all(&c);
    assert_int_equal(r->result, 0);
    for (uint64_t i = 0; i < 3; i++)
        assert_int_equal(r->dest[i], tv_test_shard_byte(400000 + i, 4));
    tv__fp_session_info *v = NULL;
    size_t n = 0;
    assert_int_equal(tv__fp_sessions(g_fp, &v, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(v[0].n_handles, 1);
    assert_int_equal(v[0].handles[0].generation, 2);
    assert_string_equal(v[0].handles[0].spec, MODEL "@2");
    tv__fp_sessions_free(v, n);
    cl_close(&c);
    tv__fp_stop(g_fp);
    g_fp = NULL;
}

/* A model's generations past max_groups_per_model (default max_groups / 4),
 * and a uid's groups past max_groups_per_uid (default max_groups / 2):
 * TV_E_BUSY naming the key, for that OPEN only; a group the uid has a
 * handle on already is no new one for it. */
static void test_group_shares(void **state)
{
    (void)state;
    cl c, d;
    int rc;
    char want[128];
    tv__fp_opts o = base_opts();
    o.max_groups = 4; /* 1 generation per model, 2 groups per uid */
    fp_up(&o);
    cl_connect(&c);
    cl_hello(&c);
    cl_open_drop(&c, MODEL "@1", 1, &rc);
    assert_int_equal(rc, 0);
    cl_open_drop(&c, MODEL "@2", 2, &rc);
    assert_int_equal(rc, TV_E_BUSY);
    assert_int_equal(c.err_open, 2);
    assert_int_equal(c.err_flags, 0);
    assert_non_null(strstr(
        c.err_text, "model 'fp/demo' has 1 generations open (fastpath.max_groups_per_model = 1)"));
    cl_close(&c);
    tv__fp_stop(g_fp);

    o.max_groups_per_model = 2;
    o.max_groups_per_uid = 1;
    fp_up(&o);
    cl_connect(&c);
    cl_hello(&c);
    cl_open_drop(&c, MODEL "@1", 1, &rc);
    assert_int_equal(rc, 0);
    cl_open_drop(&c, MODEL "@2", 2, &rc);
    assert_int_equal(rc, TV_E_BUSY);
    snprintf(want, sizeof want,
             "uid %u has handles on 1 model generations (fastpath.max_groups_per_uid = 1)",
             (unsigned)getuid());
    assert_non_null(strstr(c.err_text, want));
    cl_connect(&d); /* another session of the uid joins the uid's group */
    cl_hello(&d);
    cl_open_drop(&d, MODEL "@1", 1, &rc);
    assert_int_equal(rc, 0);
    assert_int_equal(stats().groups, 1);
    cl_close(&c);
    cl_close(&d);
    tv__fp_stop(g_fp);
    g_fp = NULL;
}

static void activate(int64_t gen)
{
    tv__store *st = NULL;
    tv_error err = {0};
    if (tv__store_open(g.s.store, TV__STORE_WRITE, &st, &err))
        fail_msg("store open: %s", err.msg);
    if (tv__store_activate(st, MODEL, gen, &err))
        fail_msg("activate %lld: %s", (long long)gen, err.msg);
    tv__store_close(st);
}

/* Byte j of tensor t as written with seed (the checkpoint's data section is
 * g_spec's tensors back to back). */
static uint8_t src_byte(size_t t, uint64_t j, unsigned seed)
{
    uint64_t begin = 0;
    for (size_t i = 0; i < TV_ARRAY_LEN(g_spec) && strcmp(g_spec[i].name, g.names[t]); i++)
        begin += g_spec[i].n_bytes;
    return tv_test_shard_byte(begin + j, seed);
}

/* The active generation moves while a handle is open: the handle keeps
 * its generation, a new OPEN of the same spec gets the new one, in another
 * group with its own arena. */
static void test_two_generations(void **state)
{
    (void)state;
    cl a, b;
    struct stat sa, sb;
    cl_ready(&a);
    assert_int_equal(a.op.generation, 1);
    activate(2);
    cl_ready(&b);
    assert_int_equal(b.op.generation, 2);
    assert_int_equal(stats().groups, 2);
    assert_int_equal(fstat(a.arena_fd, &sa), 0);
    assert_int_equal(fstat(b.arena_fd, &sb), 0);
    assert_int_not_equal(sa.st_ino, sb.st_ino);
    cl_read_all(&a);
    cl_read_all(&b);
    cl_wait_all(&a);
    cl_wait_all(&b);
    cl_check_all(&a); /* generation 1's bytes (seed 3) */
    for (size_t i = 0; i < b.n_reqs; i++) {
        const creq *r = &b.reqs[i];
        assert_int_equal(r->result, 0);
        for (uint64_t j = 0; j < r->len; j += 997)
            assert_int_equal(r->dest[j], src_byte(r->tensor, j, 4));
        for (uint64_t j = 0; j < a.reqs[i].len; j += 997)
            assert_int_equal(a.reqs[i].dest[j], src_byte(a.reqs[i].tensor, j, 3));
    }
    activate(1);
    cl_close(&a);
    cl_close(&b);
}

/* ---- random traffic ------------------------------------------------------ */

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;

static uint64_t rnd(uint64_t n)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return n ? g_rng % n : 0;
}

/* Copies and releases a random part of c's deferred entries (all of them
 * when all): a slot's bytes must still be the chunk's when copied late. */
static void cl_copy_later(cl *c, bool all)
{
    uint32_t rel[4096];
    size_t n_rel = 0, kept = 0;
    for (size_t i = 0; i < c->n_later; i++) {
        const tv__fp_chunk_ent *e = &c->later[i];
        if (!all && rnd(3) == 0) {
            c->later[kept++] = *e;
            continue;
        }
        creq *r = cl_find(c, e->req_id);
        memcpy(r->dest + e->dest_off, c->arena + (size_t)e->slot * c->op.slot_len + e->slot_off,
               e->len);
        rel[n_rel++] = e->slot;
    }
    c->n_later = kept;
    cl_release(c, rel, n_rel);
}

static size_t cl_outstanding(const cl *c)
{
    size_t n = 0;
    for (size_t i = 0; i < c->n_reqs; i++)
        n += !c->reqs[i].done;
    return n;
}

/* Three sessions read random ranges (some shared, most not) with late,
 * out-of-order copies and releases; one of them leaves half-way and comes
 * back. Every finished range equals the source. */
static void test_random_traffic(void **state)
{
    (void)state;
    enum { N = 3, PER = 60 };
    cl c[N];
    uint64_t want_off[N][64];
    size_t issued[N] = {0};
    for (int i = 0; i < N; i++) {
        cl_ready(&c[i]);
        c[i].deferred = true;
        c[i].auto_release = false;
    }
    const char *seed = getenv("TV_TEST_SEED"); /* another run of the same test */
    if (seed && *seed)
        g_rng = strtoull(seed, NULL, 0) | 1;
    bool left = false;
    time_t t0 = time(NULL);
    for (;;) {
        bool busy = false;
        for (int i = 0; i < N; i++) {
            cl *x = &c[i];
            while (issued[i] < PER && cl_outstanding(x) < 6) {
                uint32_t t = (uint32_t)rnd(g.n_tensors);
                uint64_t len = g.ref_len[t];
                uint64_t off = rnd(len + 1);
                len = rnd(len - off + 1);
                if (rnd(4) == 0) { /* the whole tensor: shared with the others */
                    off = 0;
                    len = g.ref_len[t];
                }
                want_off[i][x->n_reqs] = off;
                cl_read(x, t, off, len);
                issued[i]++;
            }
            if (issued[i] < PER || cl_outstanding(x) || x->n_later)
                busy = true;
            int type = cl_pump(x, 2);
            assert_true(type != 0);
            if (type == -1 || rnd(4) == 0)
                cl_copy_later(x, false);
            if (!cl_outstanding(x) && x->n_later)
                cl_copy_later(x, true);
        }
        if (!left && issued[0] >= PER / 2) {
            /* session 0 vanishes with references and requests; a new one
             * takes its place and its checks (those finished so far) */
            for (size_t r = 0; r < c[0].n_reqs; r++)
                free(c[0].reqs[r].dest);
            c[0].n_reqs = 0;
            close(c[0].fd);
            c[0].fd = -1;
            cl_close(&c[0]);
            cl_ready(&c[0]);
            c[0].deferred = true;
            c[0].auto_release = false;
            issued[0] = 0;
            left = true;
        }
        if (!busy)
            break;
        assert_true(time(NULL) - t0 < 60);
    }
    for (int i = 0; i < N; i++) {
        for (size_t r = 0; r < c[i].n_reqs; r++) {
            const creq *q = &c[i].reqs[r];
            assert_true(q->done);
            assert_int_equal(q->result, 0);
            if (q->len && memcmp(q->dest, g.ref[q->tensor] + want_off[i][r], q->len))
                fail_msg("session %d request %zu: tensor %u [%llu, +%llu) differs", i, r, q->tensor,
                         (unsigned long long)want_off[i][r], (unsigned long long)q->len);
        }
        assert_int_equal(slots_held_settled(c[i].session, 0), 0);
    }
    tv__fp_stats s = stats();
    assert_true(s.shared_bytes > 0);
    assert_int_equal(s.protocol_errors, 0);
    for (int i = 0; i < N; i++)
        cl_close(&c[i]);
}

/* ---- found by the attacker's review: each failed before its fix ---------- */

/* Descriptors open in this process (the daemon runs in it). */
static int fd_count(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    assert_non_null(d);
    while (readdir(d))
        n++;
    closedir(d);
    return n - 3; /* ".", ".." and the DIR's own descriptor */
}

static uint64_t cpu_us(void)
{
    struct rusage ru;
    assert_int_equal(getrusage(RUSAGE_SELF, &ru), 0);
    return (uint64_t)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000000u +
           (uint64_t)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

/* Failed before its fix: server/fastpath/session.c keeps the two descriptors of every OPENED it
 * could not send in the outbox; the outbox bound counts entries only (credit + max_requests + ...),
 * so a peer that sends OPEN / CLOSE pairs and never reads makes the daemon hold thousands of memfd
 * descriptors (RLIMIT_NOFILE: then accept, memfd_create and every model open fail for everyone).
 * Fix in the report. */
/* A peer that opens and closes a second handle again and again without
 * reading a reply: the descriptors the daemon holds for it stay bounded
 * (the session is closed once more OPENED replies wait than it may have
 * handles), and every one is given back when it ends. */
static void test_outbox_fds_bounded(void **state)
{
    (void)state;
    cl x;
    tv_error err = {0};
    cl_ready(&x);
    int base = fd_count(), peak = base;
    bool closed = false;
    for (uint32_t i = 0; i < 3000 && !closed; i++) {
        size_t len =
            tv__fp_encode_open(g_buf, sizeof g_buf, cl_ver(&x), 2 + i, MODEL, strlen(MODEL));
        closed = tv__fp_send(x.fd, g_buf, len, NULL, 0, &err) != 0;
        len = tv__fp_encode_close(g_buf, sizeof g_buf, cl_ver(&x), TV__FP_CLOSE, 2 + i);
        closed = closed || tv__fp_send(x.fd, g_buf, len, NULL, 0, &err) != 0;
        if (i % 50 == 0) {
            int n = fd_count();
            peak = n > peak ? n : peak;
            if (peak - base > 200)
                break; /* do not exhaust the test's own descriptors */
        }
    }
    sleep_ms(200);
    int n = fd_count();
    peak = n > peak ? n : peak;
    if (peak - base > 4 * 4 + 16) /* max_handles 4: two descriptors each, some slack */
        fail_msg("the daemon held %d more descriptors for a peer that does not read", peak - base);
    cl_close(&x);
    for (int i = 0; i < 200 && stats().sessions != 0; i++)
        sleep_ms(10);
    assert_int_equal(stats().sessions, 0);
    assert_true(fd_count() <= base);
}

/* accept(2) failing with EMFILE (the process out of descriptors) must not
 * make the loop spin on the still-readable listening socket (100% CPU and a
 * warning per turn); once descriptors are back the waiting peer is
 * accepted and served. */
static void test_accept_emfile(void **state)
{
    (void)state;
    struct rlimit old, lim;
    static int dummies[4096];
    int n_dummies = 0, top = 0;
    cl x;
    assert_int_equal(getrlimit(RLIMIT_NOFILE, &old), 0);
    /* the highest descriptor in use: the new limit leaves a few above it */
    for (int fd = 0; fd < 4096; fd++)
        if (fcntl(fd, F_GETFD) >= 0)
            top = fd;
    lim = old;
    lim.rlim_cur = (rlim_t)top + 1 + 8;
    assert_true(lim.rlim_cur <= old.rlim_cur);
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &lim), 0);
    for (;;) {
        int fd = dup(0);
        if (fd < 0)
            break;
        if (n_dummies == (int)TV_ARRAY_LEN(dummies)) {
            close(fd);
            break;
        }
        dummies[n_dummies++] = fd;
    }
    int e = errno;
    if (e != EMFILE || n_dummies < 2) {
        while (n_dummies)
            close(dummies[--n_dummies]);
        assert_int_equal(setrlimit(RLIMIT_NOFILE, &old), 0);
        fail_msg("could not use up the descriptors below the limit (errno %d)", e);
    }
    close(dummies[--n_dummies]); /* the client's socket takes it: accept has none */
    cl_connect(&x);
    tv__log_set_level(TV_LOG_ERROR); /* on main: a warning per turn */
    sleep_ms(100);
    uint64_t t0 = cpu_us();
    sleep_ms(500);
    uint64_t spent = cpu_us() - t0;
    tv__log_set_level(TV_LOG_INFO);
    while (n_dummies)
        close(dummies[--n_dummies]);
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &old), 0);
    if (spent > 150000)
        fail_msg("the loop spun while accept had no descriptor: %llu us of CPU in 500 ms",
                 (unsigned long long)spent);
    /* descriptors are back: the peer waiting in the backlog is served */
    cl_hello(&x);
    assert_int_equal(cl_open(&x, MODEL, 1), 0);
    check_other_works(&x, (uint32_t)tensor_index("b"));
    cl_close(&x);
}

static int setup_fp_small(void **state)
{
    (void)state;
    tv__fp_opts o = base_opts();
    o.credit = 4;
    o.group_slots = 8;
    fp_up(&o);
    return 0;
}

/* Reads of one byte at offsets off0 + i x SLOT (i < n) of tensor t: n
 * distinct chunks. */
static void read_spread(cl *c, uint32_t t, uint64_t off0, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        cl_read(c, t, off0 + (uint64_t)i * SLOT, 1);
}

static void pump_chunks(cl *c, size_t want)
{
    while (c->n_chunks < want) {
        int t = cl_pump(c, WAIT_MS);
        if (t <= 0)
            fail_msg("session %llu: %s after %zu of %zu chunks", (unsigned long long)c->session,
                     t ? "timeout" : "EOF", c->n_chunks, want);
    }
}

/* Failed before its fix: tv__fp_schedule (server/fastpath/session.c) starts every pass at
 * fp->s_head, so a freed slot of a full group always goes to the first session in connection order
 * that wants one: a later session waits for as long as earlier ones keep releasing and asking. Fix
 * in the report. */
/* Credit 4, 8 slots: A and B each hold 4 slots of the group and want one
 * more chunk; C waits for one. A gives one slot back: it goes to C (the
 * session that has waited), not back to A. */
static void test_fair_slot_handoff(void **state)
{
    (void)state;
    cl a, b, c;
    uint32_t ta = (uint32_t)tensor_index("a"), td = (uint32_t)tensor_index("d"),
             te = (uint32_t)tensor_index("e");
    cl_ready(&a);
    cl_ready(&b);
    cl_ready(&c);
    a.auto_release = b.auto_release = false;
    read_spread(&a, ta, 0, 5); /* object chunks 0..4 */
    pump_chunks(&a, 4);
    read_spread(&b, td, 0, 5); /* chunks 10..14 */
    pump_chunks(&b, 4);
    cl_read(&c, te, 120000, 1);             /* chunk 17 */
    assert_int_equal(cl_pump(&c, 300), -1); /* every slot is held */
    cl_release(&a, &a.held[0], 1);
    a.n_held--;
    int t = cl_pump(&c, 2000);
    if (t != TV__FP_CHUNK)
        fail_msg("the waiting session got %s when a slot came free (A has %zu chunks)",
                 t < 0 ? "nothing" : tv__fp_type_name((uint16_t)t), a.n_chunks);
    cl_wait_all(&c);
    assert_int_equal(c.reqs[0].result, 0);
    assert_int_equal(c.reqs[0].dest[0], g.ref[te][120000]);
    cl_close(&a);
    cl_close(&b);
    cl_close(&c);
}

/* Credit 4, 8 slots, hold_timeout_ms 300: A and B take 4 slots each (all 8)
 * and release nothing; C wants one chunk after they have held theirs for
 * over 300 ms without a release: both get ERROR{TV_E_TIMEOUT, FATAL} naming
 * the model, the slots and the key, their slots return and C's read
 * completes. */
static void test_hold_timeout(void **state)
{
    (void)state;
    cl a, b, c;
    uint32_t ta = (uint32_t)tensor_index("a"), td = (uint32_t)tensor_index("d"),
             te = (uint32_t)tensor_index("e");
    tv__fp_opts o = base_opts();
    o.credit = 4;
    o.group_slots = 8;
    o.hold_timeout_ms = 300;
    fp_up(&o);
    cl_ready(&a);
    cl_ready(&b);
    cl_ready(&c);
    a.auto_release = b.auto_release = false;
    read_spread(&a, ta, 0, 5); /* object chunks 0..4: 4 delivered, then at its credit */
    pump_chunks(&a, 4);
    read_spread(&b, td, 0, 5); /* chunks 10..14 */
    pump_chunks(&b, 4);
    sleep_ms(400);                        /* both past the hold timeout */
    creq *r = cl_read(&c, te, 120000, 1); /* chunk 17: no free slot */
    cl_wait_all(&c);
    assert_int_equal(r->result, 0);
    assert_int_equal(r->dest[0], g.ref[te][120000]);
    cl_expect_fatal(&a, TV_E_TIMEOUT, "fastpath.hold_timeout_ms = 300");
    cl_expect_fatal(&b, TV_E_TIMEOUT, "model 'fp/demo' generation 1: 4 slots held for");
    check_other_works(&c, ta);
    cl_close(&a);
    cl_close(&b);
    cl_close(&c);
    tv__fp_stop(g_fp);
    g_fp = NULL;
}

/* As above with hold_timeout_ms 1000, but B took its slots just before C
 * asks: A (past the timeout) is closed, its slots let C complete, and B,
 * which then stalls no one, is left alone and completes once it releases. */
static void test_hold_timeout_closes_only_the_stale(void **state)
{
    (void)state;
    cl a, b, c;
    uint32_t ta = (uint32_t)tensor_index("a"), td = (uint32_t)tensor_index("d"),
             te = (uint32_t)tensor_index("e");
    tv__fp_opts o = base_opts();
    o.credit = 4;
    o.group_slots = 8;
    o.hold_timeout_ms = 1000;
    fp_up(&o);
    cl_ready(&a);
    cl_ready(&b);
    cl_ready(&c);
    a.auto_release = b.auto_release = false;
    read_spread(&a, ta, 0, 5);
    pump_chunks(&a, 4);
    sleep_ms(1200); /* A past the hold timeout, B not */
    read_spread(&b, td, 0, 5);
    pump_chunks(&b, 4);
    creq *r = cl_read(&c, te, 120000, 1);
    cl_wait_all(&c);
    assert_int_equal(r->result, 0);
    assert_int_equal(r->dest[0], g.ref[te][120000]);
    cl_expect_fatal(&a, TV_E_TIMEOUT, "fastpath.hold_timeout_ms = 1000");
    assert_int_equal(slots_held_settled(b.session, 4), 4); /* B lives on, at its credit */
    b.auto_release = true;
    cl_release(&b, b.held, b.n_held);
    b.n_held = 0;
    cl_wait_all(&b);
    for (size_t i = 0; i < b.n_reqs; i++) {
        assert_int_equal(b.reqs[i].result, 0);
        assert_int_equal(b.reqs[i].dest[0], g.ref[td][i * SLOT]);
    }
    cl_close(&a);
    cl_close(&b);
    cl_close(&c);
    tv__fp_stop(g_fp);
    g_fp = NULL;
}

/* A connection that sends no HELLO within hello_timeout_ms is closed; one
 * that did is not, however long it stays idle. */
static void test_hello_timeout(void **state)
{
    (void)state;
    cl idle, ok;
    tv__fp_opts o = base_opts();
    o.hello_timeout_ms = 300;
    fp_up(&o);
    cl_connect(&idle);
    cl_ready(&ok);
    int t = cl_pump(&idle, WAIT_MS);
    assert_int_equal(t, 0); /* EOF, no ERROR: it never spoke */
    usleep(400 * 1000);
    check_other_works(&ok, (uint32_t)tensor_index("b"));
    cl_close(&idle);
    cl_close(&ok);
    tv__fp_stop(g_fp);
    g_fp = NULL;
}

/* ---- shard headers (protocol version 2) ---------------------------------- */

/* The first 8 + header_len bytes of the imported file (malloc'd). */
static uint8_t *file_header(const char *path, size_t *len)
{
    uint8_t b8[8];
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    assert_int_equal(fread(b8, 1, 8, f), 8);
    uint64_t hl = tv__le64_get(b8);
    assert_true(hl > 0 && hl < (1u << 20));
    *len = (size_t)(8 + hl);
    uint8_t *h = malloc(*len);
    assert_non_null(h);
    memcpy(h, b8, 8);
    assert_int_equal(fread(h + 8, 1, (size_t)hl, f), (size_t)hl);
    fclose(f);
    return h;
}

/* A header READ entry of c: shard s, [off, off + len) of its object. */
static creq *cl_hdr(cl *c, tv__fp_read_ent *e, uint32_t s, uint64_t off, uint64_t len)
{
    creq *r = cl_add(c, UINT32_MAX, off, len);
    *e = (tv__fp_read_ent){
        .req_id = r->id, .tensor = s, .flags = TV__FP_READ_SHARD_HEADER, .off = off, .len = len};
    return r;
}

/* Version 2: header reads (whole, parts, 0 bytes) interleaved with a
 * tensor read in one READ return the file's bytes; a bad shard index or a
 * range past the header is that request's ERROR + DONE TV_E_INVALID_ARG
 * naming model, shard and range, and the session carries on; the library
 * client reads the same bytes, and forced to version 1 says
 * TV_E_NOT_SUPPORTED while its tensor reads still work. */
static void test_shard_header(void **state)
{
    (void)state;
    size_t hlen = 0;
    uint8_t *want = file_header(g.ck, &hlen);
    cl c;
    cl_connect(&c);
    cl_hello2(&c);
    assert_int_equal(cl_open(&c, MODEL, 1), 0);
    tv__fp_read_ent e[8];
    uint32_t b = (uint32_t)tensor_index("b");
    creq *whole = cl_hdr(&c, &e[0], 0, 0, hlen);
    creq *body = cl_hdr(&c, &e[1], 0, 8, hlen - 8);
    creq *mid = cl_hdr(&c, &e[2], 0, 3, 5);
    creq *none = cl_hdr(&c, &e[3], 0, hlen, 0);
    creq *t = cl_add(&c, b, 0, g.ref_len[b]);
    e[4] = (tv__fp_read_ent){.req_id = t->id, .tensor = b, .len = g.ref_len[b]};
    cl_send(&c, g_buf, tv__fp_encode_read(g_buf, sizeof g_buf, 2, c.handle, e, 5));
    cl_wait_all(&c);
    for (creq *r = whole; r <= t; r++) {
        assert_int_equal(r->result, 0);
        assert_int_equal(r->n_err, 0);
    }
    assert_memory_equal(whole->dest, want, hlen);
    assert_memory_equal(body->dest, want + 8, hlen - 8);
    assert_memory_equal(mid->dest, want + 3, 5);
    assert_int_equal(none->len, 0);
    assert_memory_equal(t->dest, g.ref[b], g.ref_len[b]);
    /* refusals: not fatal, ERROR then DONE, naming model, shard and range */
    static const struct {
        uint32_t shard;
        uint64_t off, len;
        const char *text;
    } bad[] = {
        {1, 0, 8, "model 'fp/demo' generation 1: shard index 1 out of range (1 shards)"},
        {UINT32_MAX, 0, 8, "shard index 4294967295 out of range"},
        {0, 0, 0, "shard 0: header range of"},
        {0, UINT64_MAX, 2, "shard 0: header range of 2 bytes at 18446744073709551615"},
    };
    for (size_t i = 0; i < TV_ARRAY_LEN(bad); i++) {
        creq *r = cl_hdr(&c, &e[0], bad[i].shard, bad[i].off, bad[i].len);
        if (i == 2) { /* one byte past the header */
            r->len = e[0].len = hlen - 10 + 1;
            e[0].off = 10;
        }
        cl_send(&c, g_buf, tv__fp_encode_read(g_buf, sizeof g_buf, 2, c.handle, e, 1));
        cl_wait_all(&c);
        assert_int_equal(r->result, TV_E_INVALID_ARG);
        assert_int_equal(r->n_err, 1);
        assert_int_equal(c.err_code, TV_E_INVALID_ARG);
        assert_int_equal(c.err_flags, 0);
        if (!strstr(c.err_text, bad[i].text))
            fail_msg("case %zu: ERROR '%s' does not say '%s'", i, c.err_text, bad[i].text);
    }
    assert_non_null(strstr(c.err_text, "header bytes"));
    check_other_works(&c, (uint32_t)tensor_index("c"));
    cl_close(&c);

    /* the library: a model opened through the daemon */
    for (int v = 2; v >= 1; v--) {
        tv_client *lc = NULL;
        tv_model *lm = NULL;
        tv_error err = {0};
        tv__fpc_max_version = (uint16_t)v;
        if (tv_client_connect(g.s.sock, NULL, &lc, &err) ||
            tv_model_open_daemon(lc, MODEL, NULL, &lm, &err))
            fail_msg("client: %s", err.msg);
        assert_int_equal(tv_model_n_shards(lm), 1);
        tv_shard_desc sd;
        assert_int_equal(tv_model_shard(lm, 0, &sd), 0);
        assert_int_equal(sd.header_len + 8, hlen);
        assert_int_equal(sd.file_len, g.file_len);
        uint8_t *d = malloc(hlen + 16);
        assert_non_null(d);
        memset(d, 0xA5, hlen + 16);
        int rc = tv_read_shard_header(lm, 0, d, hlen + 16, &err);
        if (v == 2) {
            if (rc)
                fail_msg("header over the library: %s: %s", tv_err_name(rc), err.msg);
            assert_memory_equal(d, want, hlen);
        } else {
            assert_int_equal(rc, TV_E_NOT_SUPPORTED);
            assert_non_null(strstr(err.msg, "version 1"));
            for (size_t i = 0; i < hlen; i++)
                assert_int_equal(d[i], 0xA5);
        }
        for (size_t i = hlen; i < hlen + 16; i++)
            assert_int_equal(d[i], 0xA5);
        assert_int_equal(tv_read_shard_header(lm, 1, d, hlen, &err), TV_E_INVALID_ARG);
        uint8_t *td = malloc(g.ref_len[b]);
        assert_non_null(td);
        assert_int_equal(tv_read_into(lm, g.names[b], td, g.ref_len[b], &err), 0);
        assert_memory_equal(td, g.ref[b], g.ref_len[b]);
        free(td);
        free(d);
        tv_model_close(lm);
        tv_client_close(lc);
    }
    tv__fpc_max_version = TV__FP_VERSION_MAX;
    free(want);
}

/* Version 1: the header flag is a reserved bit, fatal as before. */
static void act_header_flag_v1(cl *x)
{
    tv__fp_read_ent e = {.req_id = 5, .tensor = 0, .len = 8};
    size_t len = tv__fp_encode_read(g_buf, sizeof g_buf, TV__FP_V1, x->handle, &e, 1);
    tv__le32_put(g_buf + 24 + 12, TV__FP_READ_SHARD_HEADER);
    cl_send(x, g_buf, len);
}

static void test_fatal_header_flag_v1(void **state)
{
    (void)state;
    uint16_t v = g_cl_version;
    g_cl_version = TV__FP_V1;
    fatal_case(act_header_flag_v1, TV_E_PROTOCOL, "READ: entry 0 flags 0x1 must be 0", true);
    g_cl_version = v;
}

/* Version 2: any other flag bit stays fatal. */
static void test_fatal_unknown_flag_v2(void **state)
{
    (void)state;
    cl g0, x;
    uint64_t before = stats().protocol_errors;
    cl_ready(&g0);
    cl_connect(&x);
    cl_hello2(&x);
    assert_int_equal(cl_open(&x, MODEL, 1), 0);
    tv__fp_read_ent e = {.req_id = 5, .tensor = 0, .len = 8};
    size_t len = tv__fp_encode_read(g_buf, sizeof g_buf, TV__FP_V2, x.handle, &e, 1);
    tv__le32_put(g_buf + 24 + 12, TV__FP_READ_SHARD_HEADER | 0x4);
    cl_send(&x, g_buf, len);
    cl_expect_fatal(&x, TV_E_PROTOCOL, "flags 0x5 has reserved bits set");
    check_other_works(&g0, (uint32_t)tensor_index("c"));
    for (int i = 0; i < 200 && stats().sessions != 1; i++)
        sleep_ms(10);
    assert_int_equal(stats().protocol_errors, before + 1);
    cl_close(&x);
    cl_close(&g0);
}

/* ---- readahead and the close order ---------------------------------------- */

static const char *const g_file_order[] = {"a", "b", "c", "empty", "d", "e"}; /* g_spec's */

static uint64_t one_copy_bytes(void)
{
    return (g.file_len + SLOT - 1) / SLOT * SLOT;
}

/* Reads every tensor whole, one request at a time in file order (the
 * safe_open pattern); returns how many tensors larger than a slot needed no
 * device read of their own (every byte came from slots read ahead). */
static int read_one_by_one(cl *c)
{
    int from_ahead = 0;
    for (size_t i = 0; i < TV_ARRAY_LEN(g_file_order); i++) {
        uint32_t t = (uint32_t)tensor_index(g_file_order[i]);
        if (!g.ref_len[t])
            continue;
        tv__fp_stats s0 = stats_settled();
        creq *r = cl_read(c, t, 0, g.ref_len[t]);
        cl_wait_all(c);
        assert_int_equal(r->result, 0);
        assert_memory_equal(r->dest, g.ref[t], g.ref_len[t]);
        tv__fp_stats s1 = stats_settled();
        uint64_t dev = s1.device_read_bytes - s0.device_read_bytes;
        uint64_t ahead = s1.readahead_bytes - s0.readahead_bytes;
        assert_true(ahead <= dev);
        if (g.ref_len[t] > SLOT && dev == ahead && s1.readahead_hit_bytes > s0.readahead_hit_bytes)
            from_ahead++;
    }
    return from_ahead;
}

/* Tensor after tensor: the later ones come from slots read ahead (their
 * device reads happened before their request), every chunk is read once,
 * the bytes are the source's. */
static void test_readahead_sequential(void **state)
{
    (void)state;
    cl c;
    cl_ready(&c);
    assert_true(read_one_by_one(&c) >= 1);
    tv__fp_stats st = stats_settled();
    assert_true(st.readahead_bytes > 0);
    assert_true(st.readahead_hit_bytes > 0);
    assert_true(st.readahead_hit_bytes <= st.readahead_bytes);
    assert_true(st.device_read_bytes <= one_copy_bytes()); /* no chunk read twice */
    /* The working set, not the slot count, decides how much of the arena is
     * ever used (its shmem pages allocated): one request at a time holds at
     * most CREDIT slots, plus those read ahead; the model is larger than
     * the arena, so reusing free slots last would have used all of them. */
    assert_true(one_copy_bytes() / SLOT > NSLOTS);
    if (c.version < TV__FP_V3) { /* the legacy arena's slots */
        assert_true(st.slots_used >= 1);
        assert_true(st.slots_used <= CREDIT + 4);
    } else { /* the tier keeps what was read: once */
        assert_int_equal(st.slots_used, 0);
        assert_true(st.tier_resident_bytes <= one_copy_bytes());
    }
    cl_close(&c);
}

static int setup_fp_no_readahead(void **state)
{
    (void)state;
    tv__fp_opts o = base_opts();
    o.readahead = 0;
    fp_up(&o);
    return 0;
}

/* readahead = 0: nothing is read ahead, every request reads its own chunks. */
static void test_readahead_off(void **state)
{
    (void)state;
    cl c;
    cl_ready(&c);
    assert_int_equal(read_one_by_one(&c), 0);
    tv__fp_stats st = stats_settled();
    assert_int_equal(st.readahead_bytes, 0);
    assert_int_equal(st.readahead_hit_bytes, 0);
    assert_true(st.device_read_bytes > 0);
    cl_close(&c);
}

/* A session holds credit's worth of slots it has not copied yet while
 * another reads tensor after tensor with read-ahead on: the read ahead
 * never takes a held slot nor a chunk the laggard is owed (the held slots
 * are never overwritten, both get the source's bytes) and reads no chunk
 * twice (device bytes at most one copy). */
static void test_readahead_spares_held_slots(void **state)
{
    (void)state;
    cl a, b;
    cl_ready(&a);
    cl_ready(&b);
    a.deferred = true; /* copies at release time: an overwritten slot shows */
    cl_read_all(&a);
    while (a.n_chunks < CREDIT)
        assert_true(cl_pump(&a, WAIT_MS) > 0);
    assert_int_equal(slots_held_settled(a.session, CREDIT), CREDIT);
    read_one_by_one(&b);
    cl_check_all(&b);
    while (!cl_all_done(&a)) {
        cl_copy_later(&a, true);
        cl_pump(&a, 20);
    }
    cl_copy_later(&a, true);
    cl_check_all(&a);
    assert_true(stats_settled().device_read_bytes <= one_copy_bytes());
    cl_close(&a);
    cl_close(&b);
}

/* Three sessions load the model together tensor after tensor (each sends
 * its next READ when the previous is done): the read ahead never reads a
 * chunk another session has in flight, device bytes stay <= 1.1 x one copy. */
static void test_readahead_fanout(void **state)
{
    (void)state;
    enum { N = 3 };
    cl c[N];
    size_t next[N] = {0};
    creq *cur[N] = {NULL};
    for (int i = 0; i < N; i++)
        cl_ready(&c[i]);
    time_t t0 = time(NULL);
    for (;;) {
        bool all = true;
        for (int i = 0; i < N; i++) {
            if (cur[i] && !cur[i]->done) {
                all = false;
                cl_pump(&c[i], 5);
                continue;
            }
            while (next[i] < TV_ARRAY_LEN(g_file_order) &&
                   !g.ref_len[tensor_index(g_file_order[next[i]])])
                next[i]++;
            if (next[i] == TV_ARRAY_LEN(g_file_order))
                continue;
            uint32_t t = (uint32_t)tensor_index(g_file_order[next[i]++]);
            cur[i] = cl_read(&c[i], t, 0, g.ref_len[t]);
            all = false;
        }
        if (all)
            break;
        assert_true(time(NULL) - t0 < 30);
    }
    for (int i = 0; i < N; i++)
        cl_check_all(&c[i]);
    tv__fp_stats st = stats_settled();
    assert_true(st.device_read_bytes <= one_copy_bytes() + one_copy_bytes() / 10);
    assert_true(st.shared_bytes > 0);
    for (int i = 0; i < N; i++)
        cl_close(&c[i]);
}

/* CLOSE of the last handle: CLOSED comes before the group's teardown (the
 * arena's munmap is held until the client has its CLOSED: version 1's
 * legacy arena; version 3's tier generation, freed at the teardown with no
 * tier to keep it), then the lease goes. */
static atomic_bool g_hold_unmap, g_unmap_held, g_unmap_go;
static size_t g_hold_len;
static int (*g_real_munmap)(void *, size_t);

static int setup_fp_no_cache(void **state)
{
    (void)state;
    tv__fp_opts o = base_opts();
    o.cache_len = -1;
    fp_up(&o);
    return 0;
}

static int hold_munmap(void *addr, size_t len)
{
    if (len == g_hold_len && atomic_load(&g_hold_unmap)) {
        atomic_store(&g_unmap_held, true);
        for (int i = 0; i < 2000 && !atomic_load(&g_unmap_go); i++)
            sleep_ms(5);
    }
    return g_real_munmap(addr, len);
}

static void test_closed_before_teardown(void **state)
{
    (void)state;
    cl a;
    cl_ready(&a);
    check_other_works(&a, (uint32_t)tensor_index("c"));
    assert_true(leased());
    g_real_munmap = tv__sys.munmap;
    g_hold_len = a.version >= TV__FP_V3 ? (size_t)one_copy_bytes() : (size_t)SLOT * NSLOTS;
    atomic_store(&g_unmap_go, false);
    atomic_store(&g_unmap_held, false);
    atomic_store(&g_hold_unmap, true);
    tv__sys.munmap = hold_munmap;
    cl_send(&a, g_buf,
            tv__fp_encode_close(g_buf, sizeof g_buf, cl_ver(&a), TV__FP_CLOSE, a.handle));
    int t = cl_pump(&a, 5000); /* the old order: munmap held, no CLOSED: times out */
    bool leased_at_closed = leased();
    atomic_store(&g_unmap_go, true);
    assert_int_equal(t, TV__FP_CLOSED);
    assert_true(leased_at_closed); /* the teardown had not happened yet */
    assert_false(leased_settled(false));
    assert_true(atomic_load(&g_unmap_held));
    assert_int_equal(stats().groups, 0);
    tv__sys.munmap = g_real_munmap;
    atomic_store(&g_hold_unmap, false);
    cl_close(&a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_read_every_tensor, setup_fp, teardown_fp),
        cmocka_unit_test_setup_teardown(test_fanout, setup_fp, teardown_fp),
        cmocka_unit_test_setup_teardown(test_credit, setup_fp, teardown_fp),
        cmocka_unit_test_setup_teardown(test_small_reads, setup_fp, teardown_fp),
        cmocka_unit_test_setup_teardown(test_fatal_double_release, setup_fp, teardown_fp),
        cmocka_unit_test_setup_teardown(test_fatal_release_not_held, setup_fp, teardown_fp),
        cmocka_unit_test_setup_teardown(test_fatal_unknown_handle, setup_fp, teardown_fp),
        cmocka_unit_test_setup_teardown(test_fatal_before_hello, setup_fp, teardown_fp),
        cmocka_unit_test_setup_teardown(test_fatal_bad_version, setup_fp, teardown_fp),
        cmocka_unit_test_setup_teardown(test_fatal_fds, setup_fp, teardown_fp),
        cmocka_unit_test_setup_teardown(test_fatal_truncated, setup_fp, teardown_fp),
        cmocka_unit_test_setup_teardown(test_fatal_server_type, setup_fp, teardown_fp),
        cmocka_unit_test_setup_teardown(test_fatal_second_hello, setup_fp, teardown_fp),
        cmocka_unit_test_setup_teardown(test_fatal_header_version, setup_fp, teardown_fp),
        cmocka_unit_test_setup_teardown(test_outbox_bound, setup_fp, teardown_fp),
        cmocka_unit_test_setup_teardown(test_close_cancels, setup_fp, teardown_fp),
        cmocka_unit_test_setup_teardown(test_vanished_clients_free_slots, setup_fp, teardown_fp),
        cmocka_unit_test_setup_teardown(test_lease, setup_fp, teardown_fp),
        cmocka_unit_test_setup_teardown(test_replica_failover, setup_fp, teardown_fp),
        cmocka_unit_test_setup_teardown(test_read_failure, setup_fp, teardown_fp),
        cmocka_unit_test_setup_teardown(test_two_generations, setup_fp, teardown_fp),
        cmocka_unit_test_setup_teardown(test_random_traffic, setup_fp, teardown_fp),
        cmocka_unit_test_setup_teardown(test_outbox_fds_bounded, setup_fp, teardown_fp),
        cmocka_unit_test_setup_teardown(test_fair_slot_handoff, setup_fp_small, teardown_fp),
        cmocka_unit_test_setup_teardown(test_accept_emfile, setup_fp, teardown_fp),
        cmocka_unit_test_setup_teardown(test_shard_header, setup_fp, teardown_fp),
        cmocka_unit_test_setup_teardown(test_fatal_header_flag_v1, setup_fp, teardown_fp),
        cmocka_unit_test_setup_teardown(test_fatal_unknown_flag_v2, setup_fp, teardown_fp),
        cmocka_unit_test_setup_teardown(test_readahead_sequential, setup_fp, teardown_fp),
        cmocka_unit_test_setup_teardown(test_readahead_off, setup_fp_no_readahead, teardown_fp),
        cmocka_unit_test_setup_teardown(test_readahead_spares_held_slots, setup_fp, teardown_fp),
        cmocka_unit_test_setup_teardown(test_readahead_fanout, setup_fp, teardown_fp),
        cmocka_unit_test_setup_teardown(test_closed_before_teardown, setup_fp_no_cache,
                                        teardown_fp),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_group_shares),
        cmocka_unit_test(test_admit_refused),
        cmocka_unit_test(test_busy_sessions),
        cmocka_unit_test(test_peer_refused_at_connect),
        cmocka_unit_test(test_busy_per_uid),
        cmocka_unit_test(test_socket_takeover),
        cmocka_unit_test(test_stop_with_sessions),
        cmocka_unit_test(test_hello_timeout),
        cmocka_unit_test(test_hold_timeout),
        cmocka_unit_test(test_hold_timeout_closes_only_the_stale),
    };
    /* both arenas a client may get: version 1's legacy arena of copies,
     * then version 3's memory tier itself (the reads use the aio's pread
     * pool either way: group.c) */
    g_run_engine = TV_ENGINE_AUTO;
    g_cl_version = TV__FP_V1;
    int rc = _cmocka_run_group_tests("fastpath_v1", tests, TV_ARRAY_LEN(tests), group_setup,
                                     group_teardown);
    g_cl_version = TV__FP_V3;
    rc |= _cmocka_run_group_tests("fastpath_v3", tests, TV_ARRAY_LEN(tests), group_setup,
                                  group_teardown);
    return rc;
}
