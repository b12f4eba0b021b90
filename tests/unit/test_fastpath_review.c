/* An attacker's review of the fast-path server (server/fastpath): each test
 * here reproduces a finding of the review and failed before its fix. The
 * harness (store, server, a small wire client) is the one of
 * test_fastpath.c: a file image with one imported checkpoint served by
 * tv__fp in-process on a SOCK_SEQPACKET socket with buffered reads.
 *
 * Invariants checked: the daemon's descriptors stay bounded whatever a
 * peer sends without reading its replies; the loop does not spin when
 * accept(2) fails for want of descriptors, and accepts again once there
 * are some; (behind #if 0 until the session.c fix is applied) a session
 * waiting for a slot of a full group is served before the sessions that
 * keep the group full. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <dirent.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "client/wire.h"
#include "fastpath/fastpath.h"
#include "import/import.h"
#include "snap/snapfile.h"
#include "snap/snapshot.h"
#include "store/snapbuild.h"
#include "store/store.h"
#include "tensorvault/tensorvault.h"
#include "util/sys.h"
#include "tv_test.h"

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
    char dir[128], store[192], image[2][192], ck[192], ck2[192], sock[192];
    size_t n_tensors;
    char names[MAXT][16];
    uint8_t *ref[MAXT];
    uint64_t ref_len[MAXT];
    uint64_t file_len;
    int engine;
} g;

static tv__fp *g_fp;
static int g_run_engine; /* the read engine of this run of the group */

/* ---- the store ---------------------------------------------------------- */

/* Two file images; generation 1 (active) replicated on both, generation 2
 * (another seed, not active) on the first. */
static int group_setup(void **state)
{
    tv_error err = {0};
    tv__store *st = NULL;
    tv_model *m = NULL;
    int64_t ids[2];
    (void)state;
    g.engine = g_run_engine;
    tv_test_tmpdir(g.dir, sizeof g.dir, "fp");
    tv_test_path(g.store, sizeof g.store, "%s/store", g.dir);
    tv_test_path(g.ck, sizeof g.ck, "%s/ck.safetensors", g.dir);
    tv_test_path(g.ck2, sizeof g.ck2, "%s/ck2.safetensors", g.dir);
    tv_test_path(g.sock, sizeof g.sock, "%s/run/tv.sock", g.dir);
    g.file_len = tv_test_write_shard_nd(g.ck, g_spec, TV_ARRAY_LEN(g_spec), 3);
    tv_test_write_shard_nd(g.ck2, g_spec, TV_ARRAY_LEN(g_spec), 4);
    for (int i = 0; i < 2; i++) {
        tv_test_path(g.image[i], sizeof g.image[i], "%s/image%d", g.dir, i);
        tv__store_init_opts o = {.image = g.image[i], .image_size_bytes = 16u << 20};
        if (tv__store_init(g.store, &o, &ids[i], &err))
            fail_msg("store init: %s", err.msg);
    }
    if (tv__store_open(g.store, TV__STORE_WRITE, &st, &err))
        fail_msg("store open: %s", err.msg);
    tv__import_opts io = {.activate = true, .strict = true, .devices = ids, .n_devices = 2};
    if (tv__import(st, MODEL, g.ck, &io, NULL, &err))
        fail_msg("import: %s", err.msg);
    tv__import_opts io2 = {.strict = true};
    if (tv__import(st, MODEL, g.ck2, &io2, NULL, &err))
        fail_msg("import 2: %s", err.msg);
    tv__store_close(st);
    tv_open_opts oo = {.no_direct = true};
    if (tv_model_open(g.store, MODEL, &oo, &m, &err))
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
    tv_test_rmtree(g.dir);
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
    return (tv__fp_opts){.socket_path = g.sock,
                         .store_dir = g.store,
                         .no_direct = true,
                         .engine = g.engine,
                         .slot_len = SLOT,
                         .group_slots = NSLOTS,
                         .credit = CREDIT,
                         .max_sessions = 8,
                         .max_requests = 256,
                         .max_handles = 4};
}

static void fp_up(const tv__fp_opts *o)
{
    tv_error err = {0};
    int rc = tv__fp_start(o, &g_fp, &err);
    if (rc)
        fail_msg("tv__fp_start: %s (%d)", err.msg, rc);
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

__attribute__((unused)) static tv__fp_stats stats(void)
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

static void sock_addr(struct sockaddr_un *sa)
{
    size_t n = strlen(g.sock);
    assert_true(n < sizeof sa->sun_path);
    memcpy(sa->sun_path, g.sock, n + 1);
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

static void cl_hello(cl *c)
{
    tv__fp_msg m;
    tv_error err = {0};
    cl_send(c, g_buf, tv__fp_encode_hello(g_buf, sizeof g_buf, 1, 1));
    ssize_t n = cl_recv(c, NULL, NULL, WAIT_MS);
    assert_true(n > 0);
    assert_int_equal(tv__fp_decode(g_buf, (size_t)n, 0, &m, &err), 0);
    assert_int_equal(m.type, TV__FP_HELLO_OK);
    assert_int_equal(m.u.hello_ok.version, 1);
    assert_int_equal(m.u.hello_ok.max_msg_len, TV__FP_MAX_MSG);
    assert_true(m.u.hello_ok.session_id >= 1);
    c->session = m.u.hello_ok.session_id;
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
        cl_send(c, g_buf,
                tv__fp_encode_release(g_buf, sizeof g_buf, c->handle, slots, (uint32_t)n));
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
    assert_int_equal(tv__fp_decode(g_buf, (size_t)n, 1, &m, &err), 0);
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
    cl_send(c, g_buf, tv__fp_encode_open(g_buf, sizeof g_buf, open_id, spec, strlen(spec)));
    ssize_t n = cl_recv(c, fds, &nf, WAIT_MS);
    assert_true(n > 0);
    assert_int_equal(tv__fp_decode(g_buf, (size_t)n, 1, &m, &err), 0);
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
__attribute__((unused)) static void cl_ready(cl *c)
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
    cl_send(c, g_buf, tv__fp_encode_read(g_buf, sizeof g_buf, c->handle, &e, 1));
    return r;
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

/* A client that reads tensor t whole and checks it (the session still works). */
static void check_other_works(cl *c, uint32_t t)
{
    size_t first = c->n_reqs;
    cl_read(c, t, 0, g.ref_len[t]);
    cl_wait_all(c);
    assert_int_equal(c->reqs[first].result, 0);
    assert_memory_equal(c->reqs[first].dest, g.ref[t], g.ref_len[t]);
}

/* ---- tests -------------------------------------------------------------- */

/* Descriptors open in this process (the daemon runs in it). */
__attribute__((unused)) static int fd_count(void)
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

/* Fails on main: server/fastpath/session.c keeps the two descriptors of every OPENED it could not
 * send in the outbox; the outbox bound counts entries only (credit + max_requests + ...), so a peer
 * that sends OPEN / CLOSE pairs and never reads makes the daemon hold thousands of memfd
 * descriptors (RLIMIT_NOFILE: then accept, memfd_create and every model open fail for everyone).
 * Fix in the report. */
#if 0 /* fails on main: see above */
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
        size_t len = tv__fp_encode_open(g_buf, sizeof g_buf, 2 + i, MODEL, strlen(MODEL));
        closed = tv__fp_send(x.fd, g_buf, len, NULL, 0, &err) != 0;
        len = tv__fp_encode_close(g_buf, sizeof g_buf, TV__FP_CLOSE, 2 + i);
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
#endif

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

__attribute__((unused)) static int setup_fp_small(void **state)
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
__attribute__((unused)) static void read_spread(cl *c, uint32_t t, uint64_t off0, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        cl_read(c, t, off0 + (uint64_t)i * SLOT, 1);
}

__attribute__((unused)) static void pump_chunks(cl *c, size_t want)
{
    while (c->n_chunks < want) {
        int t = cl_pump(c, WAIT_MS);
        if (t <= 0)
            fail_msg("session %llu: %s after %zu of %zu chunks", (unsigned long long)c->session,
                     t ? "timeout" : "EOF", c->n_chunks, want);
    }
}

/* Fails on main: tv__fp_schedule (server/fastpath/session.c) starts every pass at fp->s_head, so a
 * freed slot of a full group always goes to the first session in connection order that wants one: a
 * later session waits for as long as earlier ones keep releasing and asking. Fix in the report. */
#if 0 /* fails on main: see above */
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
#endif

int main(void)
{
    const struct CMUnitTest tests[] = {
#if 0 /* the session.c findings: enable with their fixes */
        cmocka_unit_test_setup_teardown(test_outbox_fds_bounded, setup_fp, teardown_fp),
        cmocka_unit_test_setup_teardown(test_fair_slot_handoff, setup_fp_small, teardown_fp),
#endif
        cmocka_unit_test_setup_teardown(test_accept_emfile, setup_fp, teardown_fp),
    };
    g_run_engine = TV_ENGINE_PREAD;
    int rc = _cmocka_run_group_tests("fastpath_review_pread", tests, TV_ARRAY_LEN(tests),
                                     group_setup, group_teardown);
    g_run_engine = TV_ENGINE_AUTO;
    rc |= _cmocka_run_group_tests("fastpath_review_auto", tests, TV_ARRAY_LEN(tests), group_setup,
                                  group_teardown);
    return rc;
}
