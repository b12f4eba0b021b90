/* Unit tests of the read engine (core/src/io): envelope math, single reads at
 * every alignment boundary with guard bytes around each destination,
 * coalesced batches, envelope mode, replicas (split and failover), faults
 * injected through tv__io_fault and tv__sys (EIO, short reads, a vanished
 * device, EINTR, timeouts), validation, custom sinks and engine selection.
 * Every case runs twice: once with io_uring and once with the pread pool
 * (two cmocka groups); the fault hook and tv__sys are restored after each.
 *
 * The substrate is a file image whose byte at offset x is tv_test_pat(x), opened
 * with O_DIRECT (buffered when the filesystem refuses, reported once). */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "dev/dev.h"
#include "io/engine.h"
#include "io/io_internal.h"
#include "tensorvault/tensorvault.h"
#include "util/sys.h"
#include "tv_test.h"

#define KIB     1024u
#define MIB     (1024u * 1024u)
#define IMG_LEN (16u * MIB)
#define CHUNK   (64u * KIB)
#define GUARD   4096u /* guard bytes around a single destination */
#define TGAP    64u   /* guard bytes between the tensors of a batch arena */

static char g_dir[256];
static char g_img[2][300];
static tv__dev *g_dev[2];
static int g_engine; /* the group's engine */

static inline uint8_t guard_byte(size_t i)
{
    return (uint8_t)(0xA5 ^ (i * 7));
}

static uint64_t rng_state = 0x9d2c5680u;
static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static int group_setup(void **state)
{
    (void)state;
    tv_error err = {0};
    tv_test_tmpdir_at(g_dir, sizeof g_dir, "io", "/tmp");
    for (int i = 0; i < 2; i++) {
        snprintf(g_img[i], sizeof g_img[i], "%s/image%d", g_dir, i);
        if (tv_test_write_pat_image(g_img[i], IMG_LEN) ||
            tv__dev_open(g_img[i], TV__DEV_O_RDONLY, &g_dev[i], &err)) {
            fprintf(stderr, "image %s: %s\n", g_img[i], err.msg);
            return -1;
        }
    }
    static bool told;
    if (!told)
        printf("# images on %s: %s, io_align %u\n", g_dir,
               g_dev[0]->direct ? "O_DIRECT" : "buffered (O_DIRECT refused)", g_dev[0]->io_align);
    told = true;
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    for (int i = 0; i < 2; i++) {
        tv__dev_close(g_dev[i]);
        g_dev[i] = NULL;
    }
    tv_test_rmtree(g_dir);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    tv__io_fault = NULL;
    tv__sys_reset();
    return 0;
}

static tv__io_dev iodev(int i)
{
    return (tv__io_dev){.fd = g_dev[i]->fd,
                        .io_align = g_dev[i]->io_align,
                        .size_bytes = g_dev[i]->size_bytes,
                        .direct = g_dev[i]->direct};
}

/* tv__io_create that must succeed; skips where the engine is unsupported. */
static tv__io *create_io(const tv__io_dev *d, size_t n_devs, const tv__io_opts *o)
{
    tv__io *io = NULL;
    tv_error err = {0};
    int rc = tv__io_create(d, n_devs, o, &io, &err);
    if (rc == TV_E_NOT_SUPPORTED)
        skip();
    if (rc)
        fail_msg("tv__io_create: %s", err.msg);
    return io;
}

static tv__io *make_io_opts(int n_devs, uint32_t qd, uint32_t timeout_ms)
{
    tv__io_dev d[2] = {iodev(0), iodev(n_devs > 1 ? 1 : 0)};
    tv__io_opts o = {.engine = g_engine,
                     .queue_depth = qd,
                     .chunk_len = CHUNK,
                     .n_threads = 4,
                     .timeout_ms = timeout_ms};
    tv__io *io = create_io(d, (size_t)n_devs, &o);
    assert_int_equal(tv__io_engine(io), g_engine);
    return io;
}

static tv__io *make_io(int n_devs)
{
    return make_io_opts(n_devs, 8, 0);
}

static tv__io_req req1(uint32_t dev, uint64_t off, uint64_t len, void *dest)
{
    tv__io_req r;
    memset(&r, 0, sizeof(r));
    r.n_src = 1;
    r.src[0] = (tv__io_src){.dev = dev, .off = off};
    r.len = len;
    r.dest = dest;
    return r;
}

static tv__io_req req2(uint64_t off, uint64_t len, void *dest)
{
    tv__io_req r = req1(0, off, len, dest);
    r.n_src = 2;
    r.src[1] = (tv__io_src){.dev = 1, .off = off};
    return r;
}

/* A destination inside a guarded buffer: [GUARD + mis] guard bytes before,
 * GUARD after. */
typedef struct guarded {
    uint8_t *base;
    size_t total;
    uint8_t *dest;
} guarded;

static guarded guarded_alloc(size_t len, size_t mis)
{
    guarded g;
    void *p = NULL;
    g.total = GUARD + mis + len + GUARD;
    assert_int_equal(posix_memalign(&p, 4096, g.total), 0);
    g.base = p;
    for (size_t i = 0; i < g.total; i++)
        g.base[i] = guard_byte(i);
    g.dest = g.base + GUARD + mis;
    return g;
}

static void check_guarded(const guarded *g, uint64_t off, size_t len, const char *what)
{
    size_t head = (size_t)(g->dest - g->base);
    for (size_t i = 0; i < head; i++)
        if (g->base[i] != guard_byte(i))
            fail_msg("%s: guard byte %zu before dest changed", what, head - i);
    for (size_t i = head + len; i < g->total; i++)
        if (g->base[i] != guard_byte(i))
            fail_msg("%s: guard byte %zu after dest changed", what, i - head - len);
    for (size_t i = 0; i < len; i++)
        if (g->dest[i] != tv_test_pat(off + i))
            fail_msg("%s: byte %zu is %02x, want %02x", what, i, g->dest[i], tv_test_pat(off + i));
}

static bool bytes_ok(const uint8_t *p, uint64_t off, uint64_t len)
{
    for (uint64_t i = 0; i < len; i++)
        if (p[i] != tv_test_pat(off + i))
            return false;
    return true;
}

/* ---- hooks ------------------------------------------------------------- */

static atomic_long g_calls;
static atomic_ullong g_dev_bytes[2];
static atomic_long g_limit;
static atomic_int g_picked;
static uint64_t g_pick_from, g_fail_off, g_fail_len;

static void reset_counters(void)
{
    atomic_store(&g_calls, 0);
    atomic_store(&g_dev_bytes[0], 0);
    atomic_store(&g_dev_bytes[1], 0);
    atomic_store(&g_picked, 0);
}

static void hook_count(uint32_t dev, uint64_t off, size_t len, int64_t *res)
{
    (void)off;
    (void)len;
    atomic_fetch_add(&g_calls, 1);
    if (*res > 0 && dev < 2)
        atomic_fetch_add(&g_dev_bytes[dev], (unsigned long long)*res);
}

static void hook_eio_dev0(uint32_t dev, uint64_t off, size_t len, int64_t *res)
{
    hook_count(dev, off, len, res);
    if (dev == 0)
        *res = -EIO;
}

static void hook_eio_all(uint32_t dev, uint64_t off, size_t len, int64_t *res)
{
    hook_count(dev, off, len, res);
    *res = -EIO;
}

/* EIO on exactly one read: the first whose offset is >= g_pick_from. */
static void hook_eio_one(uint32_t dev, uint64_t off, size_t len, int64_t *res)
{
    int zero = 0;
    hook_count(dev, off, len, res);
    if (off >= g_pick_from && atomic_compare_exchange_strong(&g_picked, &zero, 1)) {
        g_fail_off = off;
        g_fail_len = len;
        *res = -EIO;
    }
}

/* The first read is cut short by 1000 bytes (unaligned) once. */
static void hook_short_once(uint32_t dev, uint64_t off, size_t len, int64_t *res)
{
    int zero = 0;
    hook_count(dev, off, len, res);
    if (*res > 1000 && atomic_compare_exchange_strong(&g_picked, &zero, 1))
        *res -= 1000;
}

static void hook_short_always(uint32_t dev, uint64_t off, size_t len, int64_t *res)
{
    hook_count(dev, off, len, res);
    if (*res > 0)
        *res /= 2;
}

static void hook_zero_once(uint32_t dev, uint64_t off, size_t len, int64_t *res)
{
    int zero = 0;
    hook_count(dev, off, len, res);
    if (atomic_compare_exchange_strong(&g_picked, &zero, 1))
        *res = 0;
}

static void hook_gone_after(uint32_t dev, uint64_t off, size_t len, int64_t *res)
{
    (void)dev;
    (void)off;
    (void)len;
    if (atomic_fetch_add(&g_calls, 1) >= atomic_load(&g_limit))
        *res = -ENXIO;
}

static void hook_eintr_eagain(uint32_t dev, uint64_t off, size_t len, int64_t *res)
{
    long n = atomic_fetch_add(&g_calls, 1);
    (void)dev;
    (void)off;
    (void)len;
    if (n == 0)
        *res = -EINTR;
    else if (n == 1)
        *res = -EAGAIN;
}

/* ---- pure helpers ------------------------------------------------------ */

static void test_envelope_math(void **state)
{
    (void)state;
    uint64_t b, e, s;
    static const struct {
        uint64_t off, len, b, e, s;
    } cases[] = {
        {0, 0, 0, 0, 0},
        {0, 1, 0, 4096, 0},
        {1, 0, 0, 4096, 1},
        {4095, 1, 0, 4096, 4095},
        {4095, 2, 0, 8192, 4095},
        {4096, 4096, 4096, 8192, 0},
        {4097, 4095, 4096, 8192, 1},
        {8, 8, 0, 4096, 8},
        {4096, 0, 4096, 4096, 0},
        {12345, 100000, 12288, 114688, 57},
    };
    for (size_t i = 0; i < TV_ARRAY_LEN(cases); i++) {
        assert_int_equal(tv__io_envelope(cases[i].off, cases[i].len, 4096, &b, &e, &s), 0);
        assert_int_equal(b, cases[i].b);
        assert_int_equal(e, cases[i].e);
        assert_int_equal(s, cases[i].s);
    }
    assert_int_equal(tv__io_envelope(8192 + 100, 10, 8192, &b, &e, &s), 0);
    assert_int_equal(b, 8192);
    assert_int_equal(e, 16384);
    assert_int_equal(s, 100);
    assert_int_equal(tv__io_envelope(UINT64_MAX - 5, 10, 4096, &b, &e, &s), TV_E_OVERFLOW);
    assert_int_equal(tv__io_envelope(UINT64_MAX - 4095, 1, 4096, &b, &e, &s), TV_E_OVERFLOW);
    assert_int_equal(tv__io_envelope(UINT64_MAX - 8191, 4096, 4096, &b, &e, &s), 0);
    assert_int_equal(e, UINT64_MAX - 4095);
    assert_int_equal(tv__io_envelope(0, 1, 0, &b, &e, &s), TV_E_INVALID_ARG);
    assert_int_equal(tv__io_envelope(0, 1, 3000, &b, &e, &s), TV_E_INVALID_ARG);
    assert_int_equal(tv__io_envelope(5, 1, 4096, NULL, NULL, NULL), 0);
}

/* ---- single reads -------------------------------------------------------- */

static void read_checked(tv__io *io, uint64_t off, size_t len, size_t mis)
{
    char what[128];
    guarded g = guarded_alloc(len, mis);
    tv__io_req r = req1(0, off, len, g.dest);
    tv_error err = {0};
    snprintf(what, sizeof what, "off %llu len %zu mis %zu", (unsigned long long)off, len, mis);
    int rc = tv__io_run(io, &r, 1, NULL, &err);
    if (rc || r.result)
        fail_msg("%s: rc %d result %d: %s", what, rc, r.result, err.msg);
    check_guarded(&g, off, len, what);
    free(g.base);
}

static void test_single_boundaries(void **state)
{
    (void)state;
    tv__io *io = make_io(1);
    static const uint64_t offs[] = {0,
                                    1,
                                    7,
                                    8,
                                    4095,
                                    4096,
                                    4097,
                                    8191,
                                    65535,
                                    65536,
                                    65537,
                                    3 * 65536 - 5,
                                    12345,
                                    70000,
                                    131072 + 4096,
                                    IMG_LEN / 2 + 1};
    static const size_t lens[] = {0,    1,     7,     8,     4095,   4096,  4097,
                                  8192, 65535, 65536, 65537, 131072, 200003};
    static const size_t miss[] = {0, 1, 8, 4095};
    for (size_t i = 0; i < TV_ARRAY_LEN(offs); i++)
        for (size_t j = 0; j < TV_ARRAY_LEN(lens); j++)
            for (size_t k = 0; k < TV_ARRAY_LEN(miss); k++)
                read_checked(io, offs[i], lens[j], miss[k]);
    /* the last bytes of the device */
    static const size_t tails[] = {1, 7, 8, 4095, 4096, 4097, 65535, 65536, 65537, 300000};
    for (size_t j = 0; j < TV_ARRAY_LEN(tails); j++)
        for (size_t k = 0; k < TV_ARRAY_LEN(miss); k++) {
            read_checked(io, IMG_LEN - tails[j], tails[j], miss[k]);
            read_checked(io, IMG_LEN - tails[j] - 1, tails[j], miss[k]);
        }
    /* zero-size at the very end and with a NULL destination */
    tv__io_req r = req1(0, IMG_LEN, 0, NULL);
    assert_int_equal(tv__io_run(io, &r, 1, NULL, NULL), 0);
    assert_int_equal(r.result, 0);
    tv__io_destroy(io);
}

static void test_large_payloads(void **state)
{
    (void)state;
    tv__io *io = make_io(1);
    reset_counters();
    tv__io_fault = hook_count;
    /* spans many chunks, unaligned everywhere */
    read_checked(io, 4095, 3 * MIB + 123, 3);
    /* aligned: read straight into the destination, split into chunk pieces */
    long before = atomic_load(&g_calls);
    read_checked(io, 1 * MIB, 2 * MIB, 0);
    assert_int_equal(atomic_load(&g_calls) - before, (2 * MIB) / CHUNK);
    /* aligned payload but an unaligned destination: staged */
    read_checked(io, 1 * MIB, 2 * MIB, 512);
    /* the whole device */
    read_checked(io, 0, IMG_LEN, 0);
    read_checked(io, 0, IMG_LEN, 1);
    tv__io_destroy(io);
}

/* ---- batches ------------------------------------------------------------ */

typedef struct tensor {
    uint64_t off, len;
    size_t at; /* destination offset in the arena */
} tensor;

/* A simulated checkpoint: n contiguous tensors with random sizes (some 0),
 * each with its own guarded destination in one arena. */
static tensor *make_tensors(size_t n, uint64_t start, uint64_t max_len, size_t *arena_len)
{
    tensor *t = calloc(n, sizeof(*t));
    uint64_t off = start;
    size_t at = TGAP;
    assert_non_null(t);
    for (size_t i = 0; i < n; i++) {
        uint64_t len = rnd() % 10 == 0 ? 0 : (rnd() % (max_len / 8)) * 8;
        if (off + len > IMG_LEN)
            len = 0;
        t[i].off = off;
        t[i].len = len;
        at += rnd() % 16; /* unaligned destinations */
        t[i].at = at;
        at += len + TGAP;
        off += len;
    }
    *arena_len = at;
    return t;
}

static uint8_t *arena_alloc(size_t len)
{
    uint8_t *a = malloc(len);
    assert_non_null(a);
    for (size_t i = 0; i < len; i++)
        a[i] = guard_byte(i);
    return a;
}

/* Guard bytes: every byte outside the tensors' destinations is unchanged. */
static void check_arena_guards(const uint8_t *a, size_t len, const tensor *t, size_t n)
{
    size_t prev = 0;
    for (size_t i = 0; i <= n; i++) {
        size_t end = i < n ? t[i].at : len;
        for (size_t j = prev; j < end; j++)
            if (a[j] != guard_byte(j))
                fail_msg("guard byte at arena offset %zu (before tensor %zu) changed", j, i);
        if (i < n)
            prev = t[i].at + t[i].len;
    }
}

/* Every request succeeded with its tensor's bytes, and nothing outside the
 * tensors' destinations changed. */
static void check_reads_ok(const tv__io_req *r, const uint8_t *a, size_t alen, const tensor *t,
                           size_t n)
{
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(r[i].result, 0);
        assert_true(bytes_ok(a + t[i].at, t[i].off, t[i].len));
    }
    check_arena_guards(a, alen, t, n);
}

static void test_batch_checkpoint(void **state)
{
    (void)state;
    enum { N = 5000 };
    tv__io *io = make_io(1);
    size_t alen;
    tensor *t = make_tensors(N, 4096 + 24, 3000, &alen);
    uint8_t *a = arena_alloc(alen);
    tv__io_req *r = calloc(N, sizeof(*r));
    size_t *perm = calloc(N, sizeof(*perm));
    uint64_t total = 0;
    assert_non_null(r);
    assert_non_null(perm);
    for (size_t i = 0; i < N; i++)
        perm[i] = i;
    for (size_t i = N - 1; i > 0; i--) { /* the batch order does not matter */
        size_t j = rnd() % (i + 1), x = perm[i];
        perm[i] = perm[j];
        perm[j] = x;
    }
    for (size_t i = 0; i < N; i++) {
        const tensor *x = &t[perm[i]];
        r[i] = req1(0, x->off, x->len, a + x->at);
        total += x->len;
    }
    reset_counters();
    tv__io_fault = hook_count;
    tv_error err = {0};
    int rc = tv__io_run(io, r, N, NULL, &err);
    if (rc)
        fail_msg("batch: %s", err.msg);
    for (size_t i = 0; i < N; i++) {
        const tensor *x = &t[perm[i]];
        assert_int_equal(r[i].result, 0);
        if (!bytes_ok(a + x->at, x->off, x->len))
            fail_msg("tensor %zu (off %llu len %llu): wrong bytes", perm[i],
                     (unsigned long long)x->off, (unsigned long long)x->len);
    }
    check_arena_guards(a, alen, t, N);
    long reads = atomic_load(&g_calls);
    long ideal = (long)((total + CHUNK - 1) / CHUNK) + 1;
    printf("# %s: %d tensors, %llu bytes, %ld device reads (%ld chunk-sized would do)\n",
           g_engine == TV_ENGINE_URING ? "io_uring" : "pread", N, (unsigned long long)total, reads,
           ideal);
    assert_true(reads <= ideal + ideal / 10 + 2);
    assert_true(atomic_load(&g_dev_bytes[0]) < total + total / 10 + 2 * CHUNK);
    free(r);
    free(perm);
    free(a);
    free(t);
    tv__io_destroy(io);
}

/* Overlapping and duplicated requests read correct bytes. */
static void test_overlapping_requests(void **state)
{
    (void)state;
    tv__io *io = make_io(1);
    enum { N = 6 };
    static const uint64_t spec[N][2] = {{5000, 100000}, {5000, 100000},  {6000, 10},
                                        {4096, 200000}, {104000, 70000}, {0, 4096}};
    guarded g[N];
    tv__io_req r[N];
    for (int i = 0; i < N; i++) {
        g[i] = guarded_alloc(spec[i][1], (size_t)i * 3);
        r[i] = req1(0, spec[i][0], spec[i][1], g[i].dest);
    }
    assert_int_equal(tv__io_run(io, r, N, NULL, NULL), 0);
    for (int i = 0; i < N; i++) {
        assert_int_equal(r[i].result, 0);
        check_guarded(&g[i], spec[i][0], spec[i][1], "overlap");
        free(g[i].base);
    }
    tv__io_destroy(io);
}

/* 100k tiny tensors: planning stays small and fast. */
static void test_batch_100k(void **state)
{
    (void)state;
    enum { N = 100000 };
    tv__io *io = make_io_opts(1, 16, 0);
    size_t alen;
    tensor *t = make_tensors(N, 8, 64, &alen);
    uint8_t *a = arena_alloc(alen);
    tv__io_req *r = calloc(N, sizeof(*r));
    assert_non_null(r);
    for (size_t i = 0; i < N; i++)
        r[i] = req1(0, t[i].off, t[i].len, a + t[i].at);
    assert_int_equal(tv__io_run(io, r, N, NULL, NULL), 0);
    check_reads_ok(r, a, alen, t, N);
    free(r);
    free(a);
    free(t);
    tv__io_destroy(io);
}

/* ---- envelope mode ------------------------------------------------------ */

static void test_envelope_mode(void **state)
{
    (void)state;
    tv__io *io = make_io(1);
    static const uint64_t spec[][2] = {{0, 1},           {8, 8},         {4095, 2},
                                       {4096, 4096},     {12345, 70000}, {100, 300000},
                                       {IMG_LEN - 5, 5}, {65536, 0},     {65537, 0}};
    for (size_t i = 0; i < TV_ARRAY_LEN(spec); i++) {
        uint64_t off = spec[i][0], len = spec[i][1], ib, ie, sk, skip = 777;
        assert_int_equal(tv__io_envelope(off, len, 4096, &ib, &ie, &sk), 0);
        uint8_t *arena = NULL;
        size_t alen = (size_t)(ie - ib) + 4096;
        assert_int_equal(posix_memalign((void **)&arena, 4096, alen), 0);
        memset(arena, 0xEE, alen);
        tv__io_req r = req1(0, off, len, arena);
        r.envelope_into_dest = true;
        r.payload_skip = &skip;
        tv_error err = {0};
        if (tv__io_run(io, &r, 1, NULL, &err) || r.result)
            fail_msg("envelope off %llu len %llu: %s", (unsigned long long)off,
                     (unsigned long long)len, err.msg);
        assert_int_equal(skip, sk);
        assert_int_equal(skip, off % 4096);
        if (len) {
            /* the whole envelope arrived, payload included */
            assert_true(bytes_ok(arena, ib, ie - ib));
            assert_true(bytes_ok(arena + skip, off, len));
        }
        /* nothing past the envelope */
        for (size_t j = (size_t)(len ? ie - ib : 0); j < alen; j++)
            assert_int_equal(arena[j], 0xEE);
        free(arena);
    }
    /* a misaligned arena is refused before any I/O */
    uint8_t *arena = NULL;
    uint64_t skip = 0;
    assert_int_equal(posix_memalign((void **)&arena, 4096, 3 * 4096), 0);
    tv__io_req r = req1(0, 100, 100, arena + 8);
    r.envelope_into_dest = true;
    r.payload_skip = &skip;
    assert_int_equal(tv__io_run(io, &r, 1, NULL, NULL), TV_E_INVALID_ARG);
    assert_int_equal(r.result, TV_E_INVALID_ARG);
    r.dest = arena;
    r.payload_skip = NULL;
    assert_int_equal(tv__io_run(io, &r, 1, NULL, NULL), TV_E_INVALID_ARG);
    free(arena);
    tv__io_destroy(io);
}

/* ---- replicas ------------------------------------------------------------ */

static void test_replicas_split(void **state)
{
    (void)state;
    tv__io *io = make_io(2);
    /* one big read */
    guarded g = guarded_alloc(8 * MIB + 77, 5);
    tv__io_req r = req2(4096 + 3, 8 * MIB + 77, g.dest);
    reset_counters();
    tv__io_fault = hook_count;
    assert_int_equal(tv__io_run(io, &r, 1, NULL, NULL), 0);
    assert_int_equal(r.result, 0);
    check_guarded(&g, 4096 + 3, 8 * MIB + 77, "replicated read");
    unsigned long long b0 = atomic_load(&g_dev_bytes[0]), b1 = atomic_load(&g_dev_bytes[1]);
    printf("# %s: 8 MiB read from 2 replicas: %llu / %llu bytes\n",
           g_engine == TV_ENGINE_URING ? "io_uring" : "pread", b0, b1);
    assert_true(b0 >= 2 * MIB && b1 >= 2 * MIB);
    assert_true(b0 + b1 < 8 * MIB + 77 + 2 * 4096 * 64);
    free(g.base);
    tv__io_destroy(io);

    /* a batch of adjacent tensors (a fresh engine: seeded equal estimates) */
    io = make_io(2);
    enum { N = 2000 };
    size_t alen;
    tensor *t = make_tensors(N, 8, 8000, &alen);
    uint8_t *a = arena_alloc(alen);
    tv__io_req *rs = calloc(N, sizeof(*rs));
    assert_non_null(rs);
    for (size_t i = 0; i < N; i++)
        rs[i] = req2(t[i].off, t[i].len, a + t[i].at);
    reset_counters();
    assert_int_equal(tv__io_run(io, rs, N, NULL, NULL), 0);
    check_reads_ok(rs, a, alen, t, N);
    b0 = atomic_load(&g_dev_bytes[0]);
    b1 = atomic_load(&g_dev_bytes[1]);
    assert_true(b0 >= (b0 + b1) / 4 && b1 >= (b0 + b1) / 4);
    free(rs);
    free(a);
    free(t);
    tv__io_destroy(io);
}

static void test_replica_failover(void **state)
{
    (void)state;
    tv__io *io = make_io(2);
    enum { N = 500 };
    size_t alen;
    tensor *t = make_tensors(N, 4096 + 8, 20000, &alen);
    uint8_t *a = arena_alloc(alen);
    tv__io_req *rs = calloc(N, sizeof(*rs));
    tv_error err = {0};
    assert_non_null(rs);
    for (size_t i = 0; i < N; i++)
        rs[i] = req2(t[i].off, t[i].len, a + t[i].at);
    reset_counters();
    tv__io_fault = hook_eio_dev0;
    int rc = tv__io_run(io, rs, N, NULL, &err);
    if (rc)
        fail_msg("failover: %s", err.msg);
    check_reads_ok(rs, a, alen, t, N);
    assert_true(atomic_load(&g_dev_bytes[1]) > 0);

    /* both replicas fail: every non-empty request fails with -EIO */
    tv__io_fault = hook_eio_all;
    rc = tv__io_run(io, rs, N, NULL, &err);
    assert_int_equal(rc, -EIO);
    assert_non_null(strstr(err.msg, "request"));
    for (size_t i = 0; i < N; i++)
        assert_int_equal(rs[i].result, rs[i].len ? -EIO : 0);
    /* the engine is still usable afterwards */
    tv__io_fault = NULL;
    assert_int_equal(tv__io_run(io, rs, N, NULL, NULL), 0);
    free(rs);
    free(a);
    free(t);
    tv__io_destroy(io);
}

/* Device 1 made slow (100 ms per read, inside the measured time): after one
 * batch has measured both, the next gives device 1 a small share only. The
 * delay dwarfs what a loaded machine adds to device 0's reads, so the
 * measured ratio, and the share, hold however busy the host is. */
static void hook_slow_dev1(uint32_t dev, uint64_t off, size_t len, int64_t *res)
{
    hook_count(dev, off, len, res);
    if (dev == 1) {
        struct timespec ts = {0, 100 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

static void test_replicas_bandwidth(void **state)
{
    (void)state;
    tv__io *io = make_io(2);
    guarded g = guarded_alloc(8 * MIB, 0);
    tv__io_req r = req2(0, 8 * MIB, g.dest);
    tv__io_req warm = req2(0, 2 * MIB, g.dest);
    tv__io_fault = hook_slow_dev1;
    assert_int_equal(tv__io_run(io, &warm, 1, NULL, NULL), 0); /* measures both */
    reset_counters();
    assert_int_equal(tv__io_run(io, &r, 1, NULL, NULL), 0);
    check_guarded(&g, 0, 8 * MIB, "slow replica");
    unsigned long long b0 = atomic_load(&g_dev_bytes[0]), b1 = atomic_load(&g_dev_bytes[1]);
    printf("# %s: slow replica got %llu of %llu bytes\n",
           g_engine == TV_ENGINE_URING ? "io_uring" : "pread", b1, b0 + b1);
    assert_true(b1 > 0);
    assert_true(b1 < (b0 + b1) / 4);
    free(g.base);
    tv__io_destroy(io);
}

/* Devices with different io_align (device 1 declared 8192): split reads are
 * right on both; envelope mode skips a replica where its envelope is not
 * aligned. */
static void test_mixed_align(void **state)
{
    (void)state;
    tv__io_dev d[2] = {iodev(0), iodev(1)};
    d[1].io_align = 8192;
    tv__io_opts o = {.engine = g_engine, .queue_depth = 8, .chunk_len = 60000, .n_threads = 4};
    tv__io *io = NULL;
    tv_error err = {0};
    assert_int_equal(tv__io_create(d, 2, &o, &io, &err), 0);
    guarded g = guarded_alloc(1 * MIB + 3, 1);
    tv__io_req r = req2(4096 + 5, 1 * MIB + 3, g.dest);
    reset_counters();
    tv__io_fault = hook_count;
    assert_int_equal(tv__io_run(io, &r, 1, NULL, &err), 0);
    check_guarded(&g, 4096 + 5, 1 * MIB + 3, "mixed align");
    assert_true(atomic_load(&g_dev_bytes[0]) > 0 && atomic_load(&g_dev_bytes[1]) > 0);
    free(g.base);
    /* envelope mode at 4096 + 100: the 4096 envelope starts at 4096, not
     * 8192-aligned on device 1, which is therefore not used */
    uint8_t *arena = NULL;
    uint64_t skip = 0;
    assert_int_equal(posix_memalign((void **)&arena, 8192, 2 * MIB), 0);
    r = req2(4096 + 100, 1 * MIB, arena);
    r.envelope_into_dest = true;
    r.payload_skip = &skip;
    reset_counters();
    assert_int_equal(tv__io_run(io, &r, 1, NULL, &err), 0);
    assert_int_equal(skip, 100);
    assert_true(bytes_ok(arena, 4096, 100 + 1 * MIB));
    assert_int_equal(atomic_load(&g_dev_bytes[1]), 0);
    /* at 8192 + 100 with an 8192-multiple envelope both agree: both
     * replicas may serve it */
    r = req2(8192 + 100, 1 * MIB - 100, arena);
    r.envelope_into_dest = true;
    r.payload_skip = &skip;
    reset_counters();
    assert_int_equal(tv__io_run(io, &r, 1, NULL, &err), 0);
    assert_int_equal(skip, 100);
    assert_true(bytes_ok(arena, 8192, 1 * MIB));
    assert_true(atomic_load(&g_dev_bytes[1]) > 0);
    free(arena);
    tv__io_destroy(io);
}

/* A buffered device: short remainders continue at the exact byte. */
static void test_buffered_device(void **state)
{
    (void)state;
    tv__dev *bd = NULL;
    tv_error err = {0};
    assert_int_equal(tv__dev_open(g_img[0], TV__DEV_O_RDONLY | TV__DEV_O_NODIRECT, &bd, &err), 0);
    tv__io_dev d = {
        .fd = bd->fd, .io_align = bd->io_align, .size_bytes = bd->size_bytes, .direct = false};
    tv__io_opts o = {.engine = g_engine, .queue_depth = 4, .chunk_len = CHUNK};
    tv__io *io = NULL;
    assert_int_equal(tv__io_create(&d, 1, &o, &io, &err), 0);
    guarded g = guarded_alloc(150000, 7);
    tv__io_req r = req1(0, 777, 150000, g.dest);
    reset_counters();
    tv__io_fault = hook_short_once;
    assert_int_equal(tv__io_run(io, &r, 1, NULL, &err), 0);
    assert_int_equal(atomic_load(&g_picked), 1);
    check_guarded(&g, 777, 150000, "buffered short once");
    free(g.base);
    tv__io_destroy(io);
    tv__dev_close(bd);
}

/* ---- faults ------------------------------------------------------------- */

static void test_fault_eio_one_run(void **state)
{
    (void)state;
    tv__io *io = make_io(1);
    enum { N = 800 };
    size_t alen;
    tensor *t = make_tensors(N, 4096 + 40, 20000, &alen);
    uint8_t *a = arena_alloc(alen);
    tv__io_req *rs = calloc(N, sizeof(*rs));
    assert_non_null(rs);
    for (size_t i = 0; i < N; i++)
        rs[i] = req1(0, t[i].off, t[i].len, a + t[i].at);
    reset_counters();
    g_pick_from = 2 * MIB;
    tv__io_fault = hook_eio_one;
    int rc = tv__io_run(io, rs, N, NULL, NULL);
    assert_int_equal(rc, -EIO);
    assert_int_equal(atomic_load(&g_picked), 1);
    size_t n_failed = 0;
    for (size_t i = 0; i < N; i++) {
        bool hit =
            t[i].len && t[i].off < g_fail_off + g_fail_len && g_fail_off < t[i].off + t[i].len;
        if (hit) {
            assert_int_equal(rs[i].result, -EIO);
            n_failed++;
        } else {
            assert_int_equal(rs[i].result, 0);
            assert_true(bytes_ok(a + t[i].at, t[i].off, t[i].len));
        }
    }
    assert_true(n_failed > 0);
    check_arena_guards(a, alen, t, N);
    free(rs);
    free(a);
    free(t);
    tv__io_destroy(io);
}

static void test_fault_short_reads(void **state)
{
    (void)state;
    tv__io *io = make_io(1);
    /* short once: retried, success (staged and direct) */
    static const uint64_t spec[][3] = {{4097, 100000, 3}, {8192, 3 * CHUNK, 0}, {0, 5000, 1}};
    for (size_t i = 0; i < TV_ARRAY_LEN(spec); i++) {
        guarded g = guarded_alloc(spec[i][1], spec[i][2]);
        tv__io_req r = req1(0, spec[i][0], spec[i][1], g.dest);
        reset_counters();
        tv__io_fault = hook_short_once;
        assert_int_equal(tv__io_run(io, &r, 1, NULL, NULL), 0);
        assert_int_equal(r.result, 0);
        assert_int_equal(atomic_load(&g_picked), 1);
        check_guarded(&g, spec[i][0], spec[i][1], "short once");
        /* a zero-byte read once is retried too */
        memset(g.dest, 0, spec[i][1]);
        reset_counters();
        tv__io_fault = hook_zero_once;
        assert_int_equal(tv__io_run(io, &r, 1, NULL, NULL), 0);
        check_guarded(&g, spec[i][0], spec[i][1], "zero once");
        free(g.base);
    }
    /* short always: TV_E_SHORT_IO, for every request of a batch */
    enum { N = 50 };
    size_t alen;
    tensor *t = make_tensors(N, 100, 30000, &alen);
    uint8_t *a = arena_alloc(alen);
    tv__io_req rs[N];
    for (size_t i = 0; i < N; i++)
        rs[i] = req1(0, t[i].off, t[i].len, a + t[i].at);
    tv__io_fault = hook_short_always;
    tv_error err = {0};
    assert_int_equal(tv__io_run(io, rs, N, NULL, &err), TV_E_SHORT_IO);
    for (size_t i = 0; i < N; i++)
        assert_int_equal(rs[i].result, t[i].len ? TV_E_SHORT_IO : 0);
    check_arena_guards(a, alen, t, N);
    free(a);
    free(t);
    tv__io_destroy(io);
}

static void test_fault_device_gone(void **state)
{
    (void)state;
    tv__io *io = make_io_opts(1, 4, 0);
    enum { N = 1000 };
    size_t alen;
    tensor *t = make_tensors(N, 1000, 16000, &alen);
    uint8_t *a = arena_alloc(alen);
    tv__io_req *rs = calloc(N, sizeof(*rs));
    assert_non_null(rs);
    for (size_t i = 0; i < N; i++)
        rs[i] = req1(0, t[i].off, t[i].len, a + t[i].at);
    reset_counters();
    atomic_store(&g_limit, 20);
    tv__io_fault = hook_gone_after;
    assert_int_equal(tv__io_run(io, rs, N, NULL, NULL), -ENXIO);
    size_t ok = 0, failed = 0;
    for (size_t i = 0; i < N; i++) {
        if (rs[i].result == 0) {
            ok += t[i].len > 0;
            if (!bytes_ok(a + t[i].at, t[i].off, t[i].len))
                fail_msg("request %zu reported complete with wrong bytes", i);
        } else {
            assert_int_equal(rs[i].result, -ENXIO);
            failed++;
        }
    }
    assert_true(ok > 0 && failed > 0);
    check_arena_guards(a, alen, t, N);
    free(rs);
    free(a);
    free(t);
    tv__io_destroy(io);
}

static void test_fault_eintr_eagain(void **state)
{
    (void)state;
    tv__io *io = make_io(1);
    guarded g = guarded_alloc(70000, 1);
    tv__io_req r = req1(0, 333, 70000, g.dest);
    reset_counters();
    tv__io_fault = hook_eintr_eagain;
    assert_int_equal(tv__io_run(io, &r, 1, NULL, NULL), 0);
    check_guarded(&g, 333, 70000, "eintr");
    free(g.base);
    tv__io_destroy(io);
}

static ssize_t slow_pread(int fd, void *buf, size_t len, off_t off)
{
    struct timespec ts = {0, 300 * 1000000L};
    nanosleep(&ts, NULL);
    return pread(fd, buf, len, off);
}

static void test_timeout(void **state)
{
    (void)state;
    tv_error err = {0};
    if (g_engine == TV_ENGINE_PREAD) {
        /* a pread that takes 300 ms against a 50 ms timeout */
        tv__io *io = make_io_opts(1, 4, 50);
        guarded g = guarded_alloc(5000, 0);
        tv__io_req r = req1(0, 10, 5000, g.dest);
        tv__sys.pread = slow_pread;
        assert_int_equal(tv__io_run(io, &r, 1, NULL, &err), TV_E_TIMEOUT);
        assert_int_equal(r.result, TV_E_TIMEOUT);
        tv__sys_reset();
        assert_int_equal(tv__io_run(io, &r, 1, NULL, NULL), 0); /* usable again */
        check_guarded(&g, 10, 5000, "after timeout");
        free(g.base);
        tv__io_destroy(io);
        return;
    }
    /* io_uring: device 1 is a pipe that never delivers; its reads time out,
     * are cancelled, and the request is served by device 0. */
    int p[2];
    assert_int_equal(pipe(p), 0);
    tv__io_dev d[2] = {iodev(0),
                       {.fd = p[0], .io_align = 4096, .size_bytes = IMG_LEN, .direct = false}};
    tv__io_opts o = {
        .engine = TV_ENGINE_URING, .queue_depth = 4, .chunk_len = CHUNK, .timeout_ms = 100};
    tv__io *io = NULL;
    assert_int_equal(tv__io_create(d, 2, &o, &io, &err), 0);
    guarded g = guarded_alloc(4 * CHUNK, 0);
    tv__io_req r = req2(0, 4 * CHUNK, g.dest);
    uint64_t t0 = (uint64_t)time(NULL);
    int rc = tv__io_run(io, &r, 1, NULL, &err);
    if (rc)
        fail_msg("replica after timeout: %s", err.msg);
    check_guarded(&g, 0, 4 * CHUNK, "replica after timeout");
    /* only the pipe: TV_E_TIMEOUT, and nothing in flight afterwards */
    tv__io_req r1 = req1(1, 0, 8192, g.dest);
    assert_int_equal(tv__io_run(io, &r1, 1, NULL, &err), TV_E_TIMEOUT);
    assert_int_equal(r1.result, TV_E_TIMEOUT);
    assert_true((uint64_t)time(NULL) - t0 < 5);
    /* the pipe delivers later: nothing may land in the destination now */
    memset(g.dest, 0x11, 8192);
    char junk[8192];
    memset(junk, 0x22, sizeof junk);
    assert_int_equal(write(p[1], junk, sizeof junk), (ssize_t)sizeof junk);
    usleep(20000);
    for (size_t i = 0; i < 8192; i++)
        assert_int_equal(g.dest[i], 0x11);
    free(g.base);
    tv__io_destroy(io);
    close(p[0]);
    close(p[1]);
}

/* ---- validation ---------------------------------------------------------- */

static void test_validation(void **state)
{
    (void)state;
    tv__io *io = make_io(2);
    uint8_t buf[16384];
    tv_error err = {0};
    tv__io_req bad[] = {
        req1(0, IMG_LEN - 1, 2, buf),       /* passes the end */
        req1(0, IMG_LEN, 1, buf),           /* starts at the end */
        req1(0, IMG_LEN + 4096, 0, NULL),   /* empty, past the end */
        req1(0, IMG_LEN - 4095, 4096, buf), /* one byte past the end */
        req1(0, UINT64_MAX - 5, 10, buf),   /* overflow */
        req1(0, UINT64_MAX - 1, 1, buf),    /* the aligned end overflows */
        req1(0, 4096, 100, NULL),           /* NULL destination */
        req1(7, 0, 100, buf),               /* no such device */
        req2(0, 100, buf),                  /* a replica past the end (below) */
    };
    bad[8].src[1].off = IMG_LEN;
    tv__io_req none = req1(0, 0, 10, buf);
    none.n_src = 0;
    reset_counters();
    tv__io_fault = hook_count;
    for (size_t i = 0; i < TV_ARRAY_LEN(bad); i++) {
        bad[i].result = 12345;
        assert_int_equal(tv__io_run(io, &bad[i], 1, NULL, &err), TV_E_INVALID_ARG);
        assert_int_equal(bad[i].result, TV_E_INVALID_ARG);
        assert_non_null(strstr(err.msg, "request 0"));
    }
    assert_int_equal(tv__io_run(io, &none, 1, NULL, &err), TV_E_INVALID_ARG);
    none.n_src = TV__IO_MAX_REPLICAS + 1;
    assert_int_equal(tv__io_run(io, &none, 1, NULL, &err), TV_E_INVALID_ARG);
    /* the whole bad batch at once: still no I/O */
    assert_int_equal(tv__io_run(io, bad, TV_ARRAY_LEN(bad), NULL, &err), TV_E_INVALID_ARG);
    assert_int_equal(atomic_load(&g_calls), 0);
    /* a bad request does not stop the good ones; the error names the first */
    tv__io_req mix[3] = {req1(0, 100, 1000, buf), req1(0, IMG_LEN, 8, buf),
                         req1(0, IMG_LEN - 8, 8, buf + 2000)};
    assert_int_equal(tv__io_run(io, mix, 3, NULL, &err), TV_E_INVALID_ARG);
    assert_non_null(strstr(err.msg, "request 1"));
    assert_int_equal(mix[0].result, 0);
    assert_int_equal(mix[1].result, TV_E_INVALID_ARG);
    assert_int_equal(mix[2].result, 0);
    assert_true(bytes_ok(buf, 100, 1000));
    assert_true(bytes_ok(buf + 2000, IMG_LEN - 8, 8));
    /* API misuse */
    assert_int_equal(tv__io_run(NULL, mix, 1, NULL, NULL), TV_E_INVALID_ARG);
    assert_int_equal(tv__io_run(io, NULL, 1, NULL, NULL), TV_E_INVALID_ARG);
    assert_int_equal(tv__io_run(io, NULL, 0, NULL, NULL), 0);
    tv__io_destroy(io);
}

/* ---- custom sink ---------------------------------------------------------- */

typedef struct test_sink {
    long copies, waits, finishes, allocs, frees;
    uint64_t bytes;
    int finish_rc;
    void *staging;
} test_sink;

static int ts_copy(void *ctx, void *dest, uint64_t dest_off, const void *src, size_t n,
                   uint32_t slot)
{
    test_sink *s = ctx;
    assert_true(slot < 8);
    memcpy((uint8_t *)dest + dest_off, src, n);
    s->copies++;
    s->bytes += n;
    return 0;
}
static int ts_wait(void *ctx, uint32_t slot)
{
    test_sink *s = ctx;
    assert_true(slot < 8);
    s->waits++;
    return 0;
}
static int ts_finish(void *ctx)
{
    test_sink *s = ctx;
    s->finishes++;
    return s->finish_rc;
}
static void *ts_alloc(void *ctx, size_t len, size_t align)
{
    test_sink *s = ctx;
    void *p = NULL;
    assert_int_equal(len, 8 * CHUNK);
    if (posix_memalign(&p, align, len))
        return NULL;
    s->allocs++;
    s->staging = p;
    return p;
}
static void ts_free(void *ctx, void *p)
{
    test_sink *s = ctx;
    assert_ptr_equal(p, s->staging);
    s->frees++;
    free(p);
}

static void test_sink_paths(void **state)
{
    (void)state;
    tv__io *io = make_io(1);
    test_sink ts = {0};
    tv__io_sink sink = {.ctx = &ts,
                        .copy = ts_copy,
                        .wait_slot = ts_wait,
                        .finish = ts_finish,
                        .alloc_staging = ts_alloc,
                        .free_staging = ts_free};
    enum { N = 300 };
    size_t alen;
    tensor *t = make_tensors(N, 4096, 40000, &alen);
    uint8_t *a = arena_alloc(alen);
    tv__io_req *rs = calloc(N + 1, sizeof(*rs));
    uint64_t total = 0;
    assert_non_null(rs);
    for (size_t i = 0; i < N; i++) {
        rs[i] = req1(0, t[i].off, t[i].len, a + t[i].at);
        total += t[i].len;
    }
    /* aligned request and destination: still copied (dest is opaque) */
    void *al = NULL;
    assert_int_equal(posix_memalign(&al, 4096, 2 * CHUNK), 0);
    rs[N] = req1(0, 8 * MIB, 2 * CHUNK, al);
    total += 2 * CHUNK;
    assert_int_equal(tv__io_run(io, rs, N + 1, &sink, NULL), 0);
    for (size_t i = 0; i < N; i++)
        assert_true(bytes_ok(a + t[i].at, t[i].off, t[i].len));
    assert_true(bytes_ok(al, 8 * MIB, 2 * CHUNK));
    check_arena_guards(a, alen, t, N);
    assert_int_equal(ts.bytes, total);
    assert_true(ts.waits > 0);
    assert_int_equal(ts.finishes, 1);
    assert_int_equal(ts.allocs, 1);
    assert_int_equal(ts.frees, 1);
    /* finish failing: nothing is reported complete */
    ts.finish_rc = -EIO;
    assert_int_equal(tv__io_run(io, rs, N + 1, &sink, NULL), -EIO);
    for (size_t i = 0; i <= N; i++)
        assert_int_equal(rs[i].result, rs[i].len ? -EIO : 0);
    /* a sink without alloc_staging uses the engine's staging */
    ts.finish_rc = 0;
    sink.alloc_staging = NULL;
    sink.free_staging = NULL;
    assert_int_equal(tv__io_run(io, rs, N + 1, &sink, NULL), 0);
    assert_int_equal(ts.allocs, 2);
    free(al);
    free(rs);
    free(a);
    free(t);
    tv__io_destroy(io);
}

/* ---- excluded devices -------------------------------------------------- */

/* Device 0 excluded (fd -1, as a reader marks a device that failed its
 * label check): multi-replica requests are read from device 1 only, split
 * or not; a request whose only source is excluded fails with
 * TV_E_NO_REPLICA before any I/O; envelope mode needs src[0] usable. */
static void test_excluded_device(void **state)
{
    (void)state;
    tv__io_dev d[2] = {{.fd = -1, .excluded = true}, iodev(1)};
    tv__io_opts o = {.engine = g_engine, .queue_depth = 8, .chunk_len = CHUNK, .n_threads = 4};
    tv__io *io = create_io(d, 2, &o);
    tv_error err = {0};
    int rc;
    enum { N = 300 };
    size_t alen;
    tensor *t = make_tensors(N, 4096 + 8, 20000, &alen);
    uint8_t *a = arena_alloc(alen);
    tv__io_req *rs = calloc(N + 1, sizeof(*rs));
    assert_non_null(rs);
    for (size_t i = 0; i < N; i++)
        rs[i] = req2(t[i].off, t[i].len, a + t[i].at);
    /* sources in both orders: the excluded one first and second */
    for (size_t i = 0; i < N; i += 2) {
        tv__io_src s0 = rs[i].src[0];
        rs[i].src[0] = rs[i].src[1];
        rs[i].src[1] = s0;
    }
    reset_counters();
    tv__io_fault = hook_count;
    rc = tv__io_run(io, rs, N, NULL, &err);
    if (rc)
        fail_msg("excluded replica: %s", err.msg);
    check_reads_ok(rs, a, alen, t, N);
    assert_int_equal(atomic_load(&g_dev_bytes[0]), 0);
    assert_true(atomic_load(&g_dev_bytes[1]) > 0);
    /* EIO on device 1 is not retried on the excluded device */
    tv__io_fault = hook_eio_all;
    reset_counters();
    rc = tv__io_run(io, rs, 4, NULL, &err);
    assert_int_equal(rc, -EIO);
    /* only source excluded */
    uint8_t buf[100];
    memset(buf, 0x5a, sizeof buf);
    tv__io_req one = req1(0, 4096, sizeof buf, buf);
    reset_counters();
    assert_int_equal(tv__io_run(io, &one, 1, NULL, &err), TV_E_NO_REPLICA);
    assert_int_equal(one.result, TV_E_NO_REPLICA);
    assert_non_null(strstr(err.msg, "excluded"));
    assert_int_equal(atomic_load(&g_calls), 0);
    for (size_t i = 0; i < sizeof buf; i++)
        assert_int_equal(buf[i], 0x5a);
    /* envelope mode: src[0] excluded is refused; src[1] excluded is ignored */
    uint64_t skip = 0;
    uint8_t *arena = NULL;
    assert_int_equal(posix_memalign((void **)&arena, 4096, 4 * 4096), 0);
    tv__io_req env = req2(4096 + 100, 5000, arena);
    env.src[0].dev = 0;
    env.src[1].dev = 1;
    env.envelope_into_dest = true;
    env.payload_skip = &skip;
    assert_int_equal(tv__io_run(io, &env, 1, NULL, &err), TV_E_INVALID_ARG);
    env.src[0].dev = 1;
    env.src[1].dev = 0;
    tv__io_fault = NULL;
    assert_int_equal(tv__io_run(io, &env, 1, NULL, &err), 0);
    assert_int_equal(skip, 100);
    assert_true(bytes_ok(arena + skip, 4096 + 100, 5000));
    free(arena);
    tv__io_destroy(io);
    /* every device excluded: refused at create */
    d[1].excluded = true;
    io = (tv__io *)&err;
    assert_int_equal(tv__io_create(d, 2, &o, &io, &err), TV_E_INVALID_ARG);
    assert_null(io);
    assert_non_null(strstr(err.msg, "excluded"));
    free(rs);
    free(a);
    free(t);
}

/* ---- option bounds ----------------------------------------------------- */

static void create_refused(uint32_t qd, uint64_t chunk, const char *needle)
{
    tv__io_dev d = iodev(0);
    tv__io_opts o = {.engine = g_engine, .queue_depth = qd, .chunk_len = (size_t)chunk};
    tv__io *io = (tv__io *)&o;
    tv_error err = {0};
    int rc = tv__io_create(&d, 1, &o, &io, &err);
    if (rc != TV_E_INVALID_ARG)
        fail_msg("qd %u chunk %llu: %s (%s), want TV_E_INVALID_ARG", qd, (unsigned long long)chunk,
                 tv_err_name(rc), err.msg);
    assert_null(io);
    if (!strstr(err.msg, needle))
        fail_msg("qd %u chunk %llu: \"%s\" lacks \"%s\"", qd, (unsigned long long)chunk, err.msg,
                 needle);
}

/* Creates, checks the chunk in use, and reads through it when asked. */
static void create_ok(uint32_t qd, uint64_t chunk, uint64_t want_chunk, bool read)
{
    tv__io_dev d = iodev(0);
    tv__io_opts o = {.engine = g_engine, .queue_depth = qd, .chunk_len = (size_t)chunk};
    tv__io *io = NULL;
    tv_error err = {0};
    int rc = tv__io_create(&d, 1, &o, &io, &err);
    if (rc == TV_E_NOT_SUPPORTED)
        skip();
    if (rc)
        fail_msg("qd %u chunk %llu: %s", qd, (unsigned long long)chunk, err.msg);
    assert_int_equal(tv__io_chunk_len(io), want_chunk);
    if (read) {
        guarded g = guarded_alloc(3 * 4096 + 77, 3);
        tv__io_req r = req1(0, 4096 * 5 + 11, 3 * 4096 + 77, g.dest);
        assert_int_equal(tv__io_run(io, &r, 1, NULL, &err), 0);
        check_guarded(&g, 4096 * 5 + 11, 3 * 4096 + 77, "bounded options");
        free(g.base);
    }
    tv__io_destroy(io);
}

static void test_option_bounds(void **state)
{
    (void)state;
    uint32_t a = g_dev[0]->io_align;
    /* chunk: 0, 1, io_align - 1, io_align, io_align + 1 (rounded up, checked) */
    create_ok(4, 0, TV__IO_DEFAULT_CHUNK, true);
    create_ok(4, 1, a, true);
    create_ok(4, a - 1, a, true);
    create_ok(4, a, a, true);
    create_ok(1, a + 1, 2ull * a, true);
    /* the caps (staging is allocated on the first batch: not read) */
    create_ok(1, TV__IO_MAX_CHUNK, TV__IO_MAX_CHUNK, false);
    create_ok(8, TV__IO_MAX_STAGING / 8, TV__IO_MAX_STAGING / 8, false);
    create_ok(TV__IO_MAX_QD, 0, TV__IO_MAX_STAGING / TV__IO_MAX_QD, false); /* default lowered */
    create_ok(1024, 0, TV__IO_DEFAULT_CHUNK, false);
    create_ok(2048, 0, TV__IO_MAX_STAGING / 2048, false);
    /* past the caps and near 2^62 / 2^64 */
    create_refused(1, TV__IO_MAX_CHUNK + 1ull, "over");
    create_refused(1, 1ull << 62, "4611686018427387904");
    create_refused(1, 1ull << 63, "9223372036854775808");
    create_refused(1, UINT64_MAX, "18446744073709551615");
    create_refused(1, UINT64_MAX - a + 2, "over");
    create_refused(2, TV__IO_MAX_STAGING / 2 + 1, "staging");
    create_refused(32, TV__IO_MAX_CHUNK, "staging");
    create_refused(TV__IO_MAX_QD, 1u << 20, "staging");
    create_refused(TV__IO_MAX_QD, TV__IO_MAX_CHUNK, "staging");
    /* queue depth */
    create_ok(1, CHUNK, CHUNK, true);
    create_refused(TV__IO_MAX_QD + 1, 0, "queue depth 4097");
    create_refused(UINT32_MAX, 0, "queue depth 4294967295");
    /* a device over INT64_MAX bytes cannot be addressed with off_t */
    tv__io_dev big = iodev(0);
    big.size_bytes = (uint64_t)INT64_MAX + 1;
    tv__io_opts o = {.engine = g_engine};
    tv__io *io = NULL;
    tv_error err = {0};
    assert_int_equal(tv__io_create(&big, 1, &o, &io, &err), TV_E_INVALID_ARG);
    assert_null(io);
    assert_int_equal(tv__io_chunk_len(NULL), 0);
}

/* With fixed_buffers, the staging ring is registered (pinned) only by a
 * batch that stages at least the whole ring: a first small read does not
 * pay for pinning it. Without, it never is. */
static void test_lazy_registration(void **state)
{
    (void)state;
    tv__io_dev d = iodev(0);
    tv__io_opts o = {.engine = g_engine, .queue_depth = 8, .chunk_len = CHUNK, .n_threads = 4};
    tv__io *plain = create_io(&d, 1, &o);
    read_checked(plain, 4095, 2 * MIB + 3, 3);
    assert_null(plain->reg_base);
    tv__io_destroy(plain);
    o.fixed_buffers = true;
    tv__io *io = create_io(&d, 1, &o); /* 8 x 64 KiB ring */
    read_checked(io, 4096 * 3 + 5, 100, 1);
    read_checked(io, 100, 200 * KIB, 1); /* staged, less than the ring */
    assert_null(io->reg_base);
    read_checked(io, 4095, 2 * MIB + 3, 3); /* staged, more than the ring */
    if (g_engine == TV_ENGINE_URING)
        assert_true(io->reg_base == io->own_staging || io->own_refused);
    else
        assert_null(io->reg_base);
    read_checked(io, 4096 * 3 + 5, 100, 1); /* registered staging stays */
    tv__io_destroy(io);
}

/* The staging ring starts on 4 KiB pages for a batch that stages less than
 * the ring and is replaced, once, by a 2 MiB-aligned ring advised onto huge
 * pages by the first batch that stages the whole ring; reads before, across
 * and after the replacement deliver the same bytes, with and without fixed
 * buffers. */
static void test_huge_staging(void **state)
{
    (void)state;
    for (int fixed = 0; fixed <= 1; fixed++) {
        tv__io_dev d = iodev(0);
        tv__io_opts o = {.engine = g_engine,
                         .queue_depth = 4,
                         .chunk_len = MIB,
                         .n_threads = 4,
                         .fixed_buffers = fixed};
        tv__io *io = create_io(&d, 1, &o); /* 4 x 1 MiB ring */
        read_checked(io, 4096 * 5 + 3, 300, 1);
        assert_non_null(io->own_staging);
        assert_false(io->own_huge);
        assert_null(io->reg_base);
        read_checked(io, 12345, 6 * MIB + 7, 5); /* stages more than the ring */
        assert_true(io->own_huge);
        assert_int_equal((uintptr_t)io->own_staging % TV__IO_HUGE_PAGE, 0);
        uint8_t *ring = io->own_staging;
        if (fixed && g_engine == TV_ENGINE_URING)
            assert_true(io->reg_base == io->own_staging || io->own_refused);
        else
            assert_null(io->reg_base);
        read_checked(io, 77, 1000, 3);
        read_checked(io, 4096, 5 * MIB + 4096, 4097);
        assert_ptr_equal(io->own_staging, ring); /* replaced once, then kept */
        tv__io_destroy(io);
    }
}

/* ---- copy-out pool ------------------------------------------------------ */

/* Staged copies of at least 128 KiB go to the copy-out pool: with 1 MiB
 * chunks, unaligned destinations (every byte staged) and tensors from a few
 * bytes to over a chunk, each thread count delivers the same bytes and no
 * guard byte between the destinations changes; the workers did start. */
static void test_copy_pool(void **state)
{
    (void)state;
    enum { N = 40 };
    static const uint32_t threads[] = {1, 2, 4, TV__IO_MAX_COPY_THREADS};
    for (size_t ti = 0; ti < TV_ARRAY_LEN(threads); ti++) {
        tv__io_dev d = iodev(0);
        tv__io_opts o = {.engine = g_engine,
                         .queue_depth = 4,
                         .chunk_len = MIB,
                         .n_threads = 4,
                         .copy_threads = threads[ti]};
        tv__io *io = create_io(&d, 1, &o);
        size_t alen;
        tensor *t = make_tensors(N, 4096 + 24, 3 * MIB / 2, &alen);
        uint8_t *a = arena_alloc(alen);
        tv__io_req *r = calloc(N, sizeof(*r));
        assert_non_null(r);
        for (size_t i = 0; i < N; i++)
            r[i] = req1(0, t[i].off, t[i].len, a + t[i].at + (t[i].at % 4096 == 0));
        for (size_t i = 0; i < N; i++)
            if ((uintptr_t)r[i].dest % 4096 == 0)
                fail_msg("tensor %zu: aligned destination", i);
        /* destinations moved by one byte above stay inside the arena gap */
        for (size_t i = 0; i < N; i++)
            t[i].at = (size_t)((uint8_t *)r[i].dest - a);
        tv_error err = {0};
        if (tv__io_run(io, r, N, NULL, &err))
            fail_msg("copy threads %u: %s", threads[ti], err.msg);
        for (size_t i = 0; i < N; i++) {
            assert_int_equal(r[i].result, 0);
            if (!bytes_ok(r[i].dest, t[i].off, t[i].len))
                fail_msg("copy threads %u: tensor %zu (off %llu len %llu): wrong bytes",
                         threads[ti], i, (unsigned long long)t[i].off,
                         (unsigned long long)t[i].len);
        }
        check_arena_guards(a, alen, t, N);
        if (threads[ti] > 1 && tv__io_copy_default_threads() > 0)
            assert_true(io->cp_started >= 1);
        else
            assert_int_equal(io->cp_started, 0);
        free(r);
        free(a);
        free(t);
        tv__io_destroy(io);
    }
    /* the limit */
    tv__io_dev d = iodev(0);
    tv__io_opts o = {.engine = g_engine, .copy_threads = TV__IO_MAX_COPY_THREADS + 1};
    tv__io *io = NULL;
    tv_error err = {0};
    assert_int_equal(tv__io_create(&d, 1, &o, &io, &err), TV_E_INVALID_ARG);
    assert_null(io);
    assert_non_null(strstr(err.msg, "65 copy threads"));
}

/* ---- engine selection -------------------------------------------------- */

static void test_engine_selection(void **state)
{
    (void)state;
    tv__io_dev d = iodev(0);
    tv__io_opts o = {.engine = TV_ENGINE_PREAD};
    tv__io *io = NULL;
    tv_error err = {0};
    assert_int_equal(tv__io_create(&d, 1, &o, &io, &err), 0);
    assert_int_equal(tv__io_engine(io), TV_ENGINE_PREAD);
    tv__io_destroy(io);
    o.engine = TV_ENGINE_AUTO;
    assert_int_equal(tv__io_create(&d, 1, &o, &io, &err), 0);
    int auto_engine = tv__io_engine(io);
    tv__io_destroy(io);
    o.engine = TV_ENGINE_URING;
    int rc = tv__io_create(&d, 1, &o, &io, &err);
    if (g_engine == TV_ENGINE_URING)
        printf("# engine AUTO -> %s; URING -> %s\n",
               auto_engine == TV_ENGINE_URING ? "io_uring" : "pread", rc ? err.msg : "ok");
    if (rc == 0) {
        assert_int_equal(auto_engine, TV_ENGINE_URING);
        tv__io_destroy(io);
    } else {
        assert_int_equal(rc, TV_E_NOT_SUPPORTED);
        assert_int_equal(auto_engine, TV_ENGINE_PREAD);
    }
    /* invalid arguments */
    assert_int_equal(tv__io_create(&d, 1, &o, NULL, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv__io_create(NULL, 1, &o, &io, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv__io_create(&d, 0, &o, &io, &err), TV_E_INVALID_ARG);
    tv__io_dev bad = d;
    bad.io_align = 3000;
    assert_int_equal(tv__io_create(&bad, 1, &o, &io, &err), TV_E_INVALID_ARG);
    bad = d;
    bad.fd = -1;
    assert_int_equal(tv__io_create(&bad, 1, &o, &io, &err), TV_E_INVALID_ARG);
    o.engine = 9;
    assert_int_equal(tv__io_create(&d, 1, &o, &io, &err), TV_E_INVALID_ARG);
    o.engine = TV_ENGINE_PREAD;
    o.queue_depth = TV__IO_MAX_QD + 1;
    assert_int_equal(tv__io_create(&d, 1, &o, &io, &err), TV_E_INVALID_ARG);
    o.queue_depth = 0;
    o.chunk_len = (size_t)TV__IO_MAX_CHUNK + 1;
    assert_int_equal(tv__io_create(&d, 1, &o, &io, &err), TV_E_INVALID_ARG);
    assert_null(io);
    /* defaults */
    assert_int_equal(tv__io_create(&d, 1, NULL, &io, &err), 0);
    assert_int_equal(tv__io_engine(NULL), TV_E_INVALID_ARG);
    tv__io_destroy(io);
    tv__io_destroy(NULL);
}

/* In a child whose io_uring_setup fails with ENOSYS (a seccomp filter, as
 * in many containers): AUTO falls back to pread and reads correctly; URING
 * is TV_E_NOT_SUPPORTED. */
static int child_without_io_uring(void)
{
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (ENOSYS & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {.len = (unsigned short)TV_ARRAY_LEN(f), .filter = f};
    tv__io_dev d = iodev(0);
    tv__io_opts o = {.engine = TV_ENGINE_AUTO, .chunk_len = CHUNK};
    tv__io *io = NULL;
    uint8_t buf[10000];
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog))
        return 77;
    if (tv__io_create(&d, 1, &o, &io, NULL) || tv__io_engine(io) != TV_ENGINE_PREAD)
        return 1;
    tv__io_req r = req1(0, 5000, sizeof buf, buf);
    if (tv__io_run(io, &r, 1, NULL, NULL) || r.result || !bytes_ok(buf, 5000, sizeof buf))
        return 2;
    tv__io_destroy(io);
    o.engine = TV_ENGINE_URING;
    if (tv__io_create(&d, 1, &o, &io, NULL) != TV_E_NOT_SUPPORTED || io)
        return 3;
    return 0;
}

static void test_engine_fallback(void **state)
{
    (void)state;
    int st = 0;
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        _exit(child_without_io_uring());
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    if (WEXITSTATUS(st) == 77)
        skip();
    assert_int_equal(WEXITSTATUS(st), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_envelope_math, teardown),
        cmocka_unit_test_teardown(test_single_boundaries, teardown),
        cmocka_unit_test_teardown(test_large_payloads, teardown),
        cmocka_unit_test_teardown(test_batch_checkpoint, teardown),
        cmocka_unit_test_teardown(test_overlapping_requests, teardown),
        cmocka_unit_test_teardown(test_batch_100k, teardown),
        cmocka_unit_test_teardown(test_envelope_mode, teardown),
        cmocka_unit_test_teardown(test_replicas_split, teardown),
        cmocka_unit_test_teardown(test_replica_failover, teardown),
        cmocka_unit_test_teardown(test_replicas_bandwidth, teardown),
        cmocka_unit_test_teardown(test_mixed_align, teardown),
        cmocka_unit_test_teardown(test_buffered_device, teardown),
        cmocka_unit_test_teardown(test_fault_eio_one_run, teardown),
        cmocka_unit_test_teardown(test_fault_short_reads, teardown),
        cmocka_unit_test_teardown(test_fault_device_gone, teardown),
        cmocka_unit_test_teardown(test_fault_eintr_eagain, teardown),
        cmocka_unit_test_teardown(test_timeout, teardown),
        cmocka_unit_test_teardown(test_validation, teardown),
        cmocka_unit_test_teardown(test_sink_paths, teardown),
        cmocka_unit_test_teardown(test_engine_selection, teardown),
        cmocka_unit_test_teardown(test_engine_fallback, teardown),
        cmocka_unit_test_teardown(test_excluded_device, teardown),
        cmocka_unit_test_teardown(test_option_bounds, teardown),
        cmocka_unit_test_teardown(test_copy_pool, teardown),
        cmocka_unit_test_teardown(test_lazy_registration, teardown),
        cmocka_unit_test_teardown(test_huge_staging, teardown),
    };
    return TV_TEST_RUN_PER_ENGINE(g_engine, tests, group_setup, group_teardown);
}
