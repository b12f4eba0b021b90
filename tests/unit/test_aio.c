/* Unit tests of the asynchronous read door (core/src/io/aio.c): reads land
 * byte-exact in the region, alignment and region checks, TV_E_BUSY at the
 * queue depth, short reads resubmitted and 0-byte reads failing with
 * TV_E_SHORT_IO (through tv__io_fault), EIO, the eventfd's readability,
 * timeouts, and destroy with reads in flight; the lazy fixed-buffer
 * registration (create pins nothing, a read pins only its piece, a read
 * spanning two pieces is a plain read, refusals under RLIMIT_MEMLOCK 0 read
 * plain). Every case runs twice: with io_uring (fixed buffers) and with the
 * pread pool (two cmocka groups). TV_AIO_TIMING=1 prints the create time for
 * a 128 MiB region against an eager registration of it (no timing asserts).
 *
 * The substrate is a file image whose byte at offset x is tv_test_pat(x), on the
 * real disk ($TMPDIR, else /var/tmp: not tmpfs) opened with O_DIRECT
 * (buffered when the filesystem refuses, reported once). */
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
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <liburing.h>
#include <linux/capability.h>
#include <sys/mman.h>
#include <sys/syscall.h>

#include "dev/dev.h"
#include "io/aio.h"
#include "io/engine.h"
#include "tensorvault/tensorvault.h"
#include "util/sys.h"
#include "tv_test.h"

#define KIB        1024u
#define MIB        (1024u * 1024u)
#define IMG_LEN    (8u * MIB)
#define REGION_LEN (4u * MIB)

static char g_dir[256];
static char g_img[300];
static tv__dev *g_dev;
static int g_engine;
static uint8_t *g_region;

static int group_setup(void **state)
{
    (void)state;
    tv_error err = {0};
    tv_test_tmpdir_at(g_dir, sizeof g_dir, "aio", "/var/tmp");
    snprintf(g_img, sizeof g_img, "%s/image", g_dir);
    if (tv_test_write_pat_image(g_img, IMG_LEN) ||
        tv__dev_open(g_img, TV__DEV_O_RDONLY, &g_dev, &err)) {
        fprintf(stderr, "image %s: %s\n", g_img, err.msg);
        return -1;
    }
    if (posix_memalign((void **)&g_region, 4096, REGION_LEN))
        return -1;
    static bool told;
    if (!told)
        printf("# image on %s: %s, io_align %u\n", g_dir,
               g_dev->direct ? "O_DIRECT" : "buffered (O_DIRECT refused)", g_dev->io_align);
    told = true;
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    tv__dev_close(g_dev);
    g_dev = NULL;
    tv_test_rmtree(g_dir);
    free(g_region);
    g_region = NULL;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    tv__io_fault = NULL;
    tv__sys_reset();
    return 0;
}

static tv__aio *make_aio_opts(uint32_t qd, uint32_t timeout_ms)
{
    tv__aio_opts o = {.engine = g_engine,
                      .queue_depth = qd,
                      .region = g_region,
                      .region_len = REGION_LEN,
                      .timeout_ms = timeout_ms,
                      .n_threads = 4};
    tv__aio *a = NULL;
    tv_error err = {0};
    int rc = tv__aio_create(&o, &a, &err);
    if (rc == TV_E_NOT_SUPPORTED)
        skip();
    if (rc)
        fail_msg("tv__aio_create: %s", err.msg);
    assert_int_equal(tv__aio_engine(a), g_engine);
    return a;
}

static tv__aio *make_aio(uint32_t qd)
{
    return make_aio_opts(qd, 0);
}

static bool efd_readable(const tv__aio *a, int timeout_ms)
{
    struct pollfd p = {.fd = tv__aio_event_fd(a), .events = POLLIN};
    return poll(&p, 1, timeout_ms) == 1 && (p.revents & POLLIN);
}

/* Waits on the eventfd and reaps until n completions arrived (5 s at most
 * per wait); returns how many. */
static size_t wait_done(tv__aio *a, tv__aio_done *out, size_t n)
{
    size_t got = 0;
    while (got < n) {
        if (!efd_readable(a, 5000))
            break;
        got += tv__aio_reap(a, out + got, n - got);
    }
    return got;
}

static void submit_ok(tv__aio *a, uint64_t off, size_t region_off, size_t len, uint64_t tag)
{
    tv_error err = {0};
    int rc = tv__aio_submit(a, g_dev->fd, g_dev->io_align, 0, off, g_region + region_off, len, tag,
                            &err);
    if (rc)
        fail_msg("submit %llu+%zu: %s", (unsigned long long)off, len, err.msg);
}

static void check_bytes(size_t region_off, uint64_t off, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (g_region[region_off + i] != tv_test_pat(off + i))
            fail_msg("byte %zu of the read at %llu: %02x, want %02x", i, (unsigned long long)off,
                     g_region[region_off + i], tv_test_pat(off + i));
}

static int one_read(tv__aio *a, uint64_t off, size_t region_off, size_t len)
{
    tv__aio_done d = {0};
    submit_ok(a, off, region_off, len, 77);
    assert_int_equal(tv__aio_flush(a, NULL), 0);
    assert_int_equal(wait_done(a, &d, 1), 1);
    assert_int_equal(d.tag, 77);
    assert_int_equal(tv__aio_in_flight(a), 0);
    return d.result;
}

/* ---- reads land byte-exact ------------------------------------------------ */

static void test_reads_exact(void **state)
{
    (void)state;
    enum { N = 24 };
    tv__aio *a = make_aio(32);
    tv__aio_done d[N];
    uint64_t offs[N];
    size_t lens[N], at = 0;
    memset(g_region, 0xEE, REGION_LEN);
    for (int i = 0; i < N; i++) {
        lens[i] = (size_t)(i % 5 + 1) * 4096 * (i % 3 == 0 ? 16 : 1);
        offs[i] = (uint64_t)((i * 7919) % 1900) * 4096;
        submit_ok(a, offs[i], at, lens[i], (uint64_t)i + 1000);
        at += lens[i] + 4096; /* a gap that must stay untouched */
    }
    assert_int_equal(tv__aio_in_flight(a), N);
    assert_int_equal(tv__aio_flush(a, NULL), 0);
    assert_int_equal(wait_done(a, d, N), N);
    assert_int_equal(tv__aio_in_flight(a), 0);
    bool seen[N] = {0};
    for (int i = 0; i < N; i++) {
        assert_int_equal(d[i].result, 0);
        assert_true(d[i].tag >= 1000 && d[i].tag < 1000 + N);
        assert_false(seen[d[i].tag - 1000]);
        seen[d[i].tag - 1000] = true;
    }
    at = 0;
    for (int i = 0; i < N; i++) {
        check_bytes(at, offs[i], lens[i]);
        for (size_t g = 0; g < 4096; g++)
            assert_int_equal(g_region[at + lens[i] + g], 0xEE);
        at += lens[i] + 4096;
    }
    /* a read at the very end of the image and one that fills the region */
    assert_int_equal(one_read(a, IMG_LEN - 8192, 0, 8192), 0);
    check_bytes(0, IMG_LEN - 8192, 8192);
    assert_int_equal(one_read(a, 1 * MIB, 0, REGION_LEN), 0);
    check_bytes(0, 1 * MIB, REGION_LEN);
    /* nothing queued: flush and reap are no-ops */
    assert_int_equal(tv__aio_flush(a, NULL), 0);
    assert_int_equal(tv__aio_reap(a, d, N), 0);
    assert_int_equal(tv__aio_reap(a, d, 0), 0);
    tv__aio_destroy(a);
}

/* ---- validation ----------------------------------------------------------- */

static void test_alignment_rejected(void **state)
{
    (void)state;
    tv__aio *a = make_aio(8);
    tv_error err = {0};
    int fd = g_dev->fd;
    uint32_t al = g_dev->io_align;
    static uint8_t outside[8192] __attribute__((aligned(4096)));
    struct {
        int fd;
        uint32_t align;
        uint64_t off;
        uint8_t *buf;
        size_t len;
    } bad[] = {
        {fd, al, 512, g_region, 4096},                   /* offset */
        {fd, al, 0, g_region, 4000},                     /* length */
        {fd, al, 0, g_region + 512, 4096},               /* buffer */
        {fd, al, 0, g_region, 0},                        /* empty */
        {fd, al, 0, g_region + REGION_LEN - 4096, 8192}, /* past the region's end */
        {fd, al, 0, outside, 4096},                      /* outside the region */
        {fd, al, 0, NULL, 4096},
        {fd, al, 0, g_region, (size_t)(1ull << 30) + 4096}, /* over 1 GiB */
        {fd, 1000, 0, g_region, 4096},                      /* not a power of two */
        {fd, 256, 0, g_region, 4096},                       /* under 512 */
        {-1, al, 0, g_region, 4096},
        {fd, al, UINT64_MAX - 4095, g_region, 4096}, /* offset + length overflow */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err.msg[0] = '\0';
        int rc = tv__aio_submit(a, bad[i].fd, bad[i].align, 3, bad[i].off, bad[i].buf, bad[i].len,
                                1, &err);
        if (rc != TV_E_INVALID_ARG)
            fail_msg("case %zu: %d (%s), want TV_E_INVALID_ARG", i, rc, tv_err_name(rc));
        assert_non_null(strstr(err.msg, "aio"));
    }
    assert_non_null(strstr(err.msg, "device 3"));
    assert_int_equal(tv__aio_in_flight(a), 0);
    assert_int_equal(tv__aio_submit(NULL, fd, al, 0, 0, g_region, 4096, 1, NULL), TV_E_INVALID_ARG);
    /* nothing was queued: a flush sends nothing and nothing completes */
    assert_int_equal(tv__aio_flush(a, NULL), 0);
    assert_false(efd_readable(a, 50));
    tv__aio_destroy(a);

    /* bad options */
    tv__aio *b = NULL;
    tv__aio_opts o = {.engine = g_engine, .region = g_region, .region_len = REGION_LEN};
    assert_int_equal(tv__aio_create(NULL, &b, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv__aio_create(&o, NULL, &err), TV_E_INVALID_ARG);
    tv__aio_opts bo = o;
    bo.queue_depth = 4097;
    assert_int_equal(tv__aio_create(&bo, &b, &err), TV_E_INVALID_ARG);
    assert_non_null(strstr(err.msg, "4097"));
    bo = o;
    bo.region = g_region + 512;
    assert_int_equal(tv__aio_create(&bo, &b, &err), TV_E_INVALID_ARG);
    bo = o;
    bo.region_len = 4000;
    assert_int_equal(tv__aio_create(&bo, &b, &err), TV_E_INVALID_ARG);
    bo = o;
    bo.region = NULL;
    assert_int_equal(tv__aio_create(&bo, &b, &err), TV_E_INVALID_ARG);
    bo = o;
    bo.engine = 99;
    assert_int_equal(tv__aio_create(&bo, &b, &err), TV_E_INVALID_ARG);
    assert_null(b);
    tv__aio_destroy(NULL);
    assert_int_equal(tv__aio_engine(NULL), TV_E_INVALID_ARG);
    assert_int_equal(tv__aio_event_fd(NULL), -1);
    assert_int_equal(tv__aio_in_flight(NULL), 0);
}

static void test_busy_at_queue_depth(void **state)
{
    (void)state;
    tv__aio *a = make_aio(4);
    tv__aio_done d[4];
    tv_error err = {0};
    for (int i = 0; i < 4; i++)
        submit_ok(a, (uint64_t)i * 65536, (size_t)i * 65536, 65536, (uint64_t)i);
    assert_int_equal(
        tv__aio_submit(a, g_dev->fd, g_dev->io_align, 0, 0, g_region + 4 * 65536, 4096, 9, &err),
        TV_E_BUSY);
    assert_non_null(strstr(err.msg, "queue depth 4"));
    assert_int_equal(tv__aio_flush(a, NULL), 0);
    /* completed but not reaped still count */
    usleep(50000);
    assert_int_equal(tv__aio_in_flight(a), 4);
    assert_int_equal(
        tv__aio_submit(a, g_dev->fd, g_dev->io_align, 0, 0, g_region + 4 * 65536, 4096, 9, &err),
        TV_E_BUSY);
    assert_int_equal(wait_done(a, d, 4), 4);
    for (int i = 0; i < 4; i++)
        assert_int_equal(d[i].result, 0);
    for (int i = 0; i < 4; i++)
        check_bytes((size_t)i * 65536, (uint64_t)i * 65536, 65536);
    /* room again */
    assert_int_equal(one_read(a, 8 * 65536, 0, 65536), 0);
    check_bytes(0, 8 * 65536, 65536);
    tv__aio_destroy(a);
}

/* ---- faults through tv__io_fault -------------------------------------------- */

static atomic_int g_calls;
static atomic_int g_fired;

static void hook_short_once(uint32_t dev, uint64_t off, size_t len, int64_t *res)
{
    (void)dev, (void)off;
    atomic_fetch_add(&g_calls, 1);
    if (*res == (int64_t)len && len > 8192 && atomic_fetch_add(&g_fired, 1) == 0)
        *res = (int64_t)(len / 2 + 100); /* not even aligned: the rest restarts aligned */
}

static void hook_short_then_zero(uint32_t dev, uint64_t off, size_t len, int64_t *res)
{
    (void)dev, (void)off, (void)len;
    if (atomic_fetch_add(&g_calls, 1) == 0)
        *res = 8192;
    else
        *res = 0;
}

static void hook_zero(uint32_t dev, uint64_t off, size_t len, int64_t *res)
{
    (void)dev, (void)off, (void)len;
    atomic_fetch_add(&g_calls, 1);
    *res = 0;
}

static void hook_eio(uint32_t dev, uint64_t off, size_t len, int64_t *res)
{
    (void)off, (void)len;
    atomic_fetch_add(&g_calls, 1);
    if (dev == 5)
        *res = -EIO;
}

static void hook_tiny(uint32_t dev, uint64_t off, size_t len, int64_t *res)
{
    (void)dev, (void)off, (void)len;
    atomic_fetch_add(&g_calls, 1);
    *res = 100; /* never a whole aligned block */
}

static void hook_eintr_once(uint32_t dev, uint64_t off, size_t len, int64_t *res)
{
    (void)dev, (void)off, (void)len;
    if (atomic_fetch_add(&g_calls, 1) == 0)
        *res = -EINTR;
}

static void test_short_read_resubmitted(void **state)
{
    (void)state;
    tv__aio *a = make_aio(8);
    memset(g_region, 0, 256 * KIB);
    atomic_store(&g_calls, 0);
    atomic_store(&g_fired, 0);
    tv__io_fault = hook_short_once;
    assert_int_equal(one_read(a, 3 * MIB, 0, 256 * KIB), 0);
    assert_int_equal(atomic_load(&g_fired) >= 1, 1);
    assert_true(atomic_load(&g_calls) >= 2); /* the rest was read again */
    check_bytes(0, 3 * MIB, 256 * KIB);
    if (g_engine == TV_ENGINE_URING) {
        /* plain reads by default: no table, the rest re-sent plain too */
        tv__aio_stats st;
        tv__aio_get_stats(a, &st);
        assert_int_equal(st.n_pieces, 0);
        assert_int_equal(st.n_registered, 0);
        assert_int_equal(st.n_fixed_reads, 0);
        assert_true(st.n_plain_reads >= 2);
    }

    /* EINTR is re-sent */
    atomic_store(&g_calls, 0);
    tv__io_fault = hook_eintr_once;
    assert_int_equal(one_read(a, 64 * KIB, 0, 64 * KIB), 0);
    assert_int_equal(atomic_load(&g_calls), 2);
    check_bytes(0, 64 * KIB, 64 * KIB);
    tv__aio_destroy(a);
}

static void test_zero_read_short_io(void **state)
{
    (void)state;
    tv__aio *a = make_aio(8);
    /* a resubmission that returns 0 bytes */
    atomic_store(&g_calls, 0);
    tv__io_fault = hook_short_then_zero;
    assert_int_equal(one_read(a, 0, 0, 64 * KIB), TV_E_SHORT_IO);
    assert_int_equal(atomic_load(&g_calls), 2);
    /* a first read of 0 bytes */
    atomic_store(&g_calls, 0);
    tv__io_fault = hook_zero;
    assert_int_equal(one_read(a, 0, 0, 64 * KIB), TV_E_SHORT_IO);
    assert_int_equal(atomic_load(&g_calls), 1);
    /* short reads that never advance an aligned block end too */
    atomic_store(&g_calls, 0);
    tv__io_fault = hook_tiny;
    assert_int_equal(one_read(a, 0, 0, 64 * KIB), TV_E_SHORT_IO);
    assert_true(atomic_load(&g_calls) > 1 && atomic_load(&g_calls) < 10);
    /* the real end of the device: a read past it gets 0 bytes */
    tv__io_fault = NULL;
    tv_error err = {0};
    assert_int_equal(
        tv__aio_submit(a, g_dev->fd, g_dev->io_align, 0, IMG_LEN, g_region, 4096, 5, &err), 0);
    tv__aio_done d;
    assert_int_equal(tv__aio_flush(a, NULL), 0);
    assert_int_equal(wait_done(a, &d, 1), 1);
    assert_int_equal(d.result, TV_E_SHORT_IO);
    tv__aio_destroy(a);
}

static void test_eio(void **state)
{
    (void)state;
    tv__aio *a = make_aio(8);
    tv__aio_done d[2];
    tv_error err = {0};
    atomic_store(&g_calls, 0);
    tv__io_fault = hook_eio;
    /* dev 5 fails, dev 0 (the same fd) succeeds: the tag tells them apart */
    assert_int_equal(tv__aio_submit(a, g_dev->fd, g_dev->io_align, 5, 0, g_region, 65536, 50, &err),
                     0);
    assert_int_equal(
        tv__aio_submit(a, g_dev->fd, g_dev->io_align, 0, 0, g_region + 65536, 65536, 60, &err), 0);
    assert_int_equal(tv__aio_flush(a, NULL), 0);
    assert_int_equal(wait_done(a, d, 2), 2);
    for (int i = 0; i < 2; i++)
        assert_int_equal(d[i].result, d[i].tag == 50 ? -EIO : 0);
    assert_int_equal(atomic_load(&g_calls), 2); /* an error is not retried */
    check_bytes(65536, 0, 65536);
    tv__aio_destroy(a);
}

/* ---- the eventfd ----------------------------------------------------------- */

static void test_eventfd(void **state)
{
    (void)state;
    tv__aio *a = make_aio(8);
    tv__aio_done d[3];
    int efd = tv__aio_event_fd(a);
    assert_true(efd >= 0);
    assert_int_equal(fcntl(efd, F_GETFL) & O_NONBLOCK, O_NONBLOCK);
    assert_false(efd_readable(a, 0));
    for (int i = 0; i < 3; i++)
        submit_ok(a, (uint64_t)i * 65536, (size_t)i * 65536, 65536, (uint64_t)i);
    assert_false(efd_readable(a, 50)); /* nothing was sent before the flush */
    assert_int_equal(tv__aio_flush(a, NULL), 0);
    assert_true(efd_readable(a, 5000));
    /* wait for all three, one at a time: a reap that leaves some keeps it readable */
    size_t got = 0;
    for (int spins = 0; got < 3 && spins < 500; spins++) {
        assert_true(efd_readable(a, 5000));
        got += tv__aio_reap(a, d + got, 1);
    }
    assert_int_equal(got, 3);
    assert_int_equal(tv__aio_in_flight(a), 0);
    /* drained: not readable (io_uring may still post its timeouts' CQEs) */
    for (int spins = 0; spins < 10 && efd_readable(a, 20); spins++)
        assert_int_equal(tv__aio_reap(a, d, 3), 0);
    assert_false(efd_readable(a, 20));
    tv__aio_destroy(a);
}

/* ---- timeouts and destroy with reads in flight ---------------------------- */

static atomic_int g_slow_done;
static ssize_t (*g_real_pread)(int, void *, size_t, off_t);

static ssize_t slow_pread(int fd, void *buf, size_t len, off_t off)
{
    struct timespec ts = {0, 300 * 1000000L};
    nanosleep(&ts, NULL);
    ssize_t n = g_real_pread(fd, buf, len, off);
    atomic_fetch_add(&g_slow_done, 1);
    return n;
}

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void test_timeout(void **state)
{
    (void)state;
    tv__aio_done d;
    tv_error err = {0};
    tv__aio *a = make_aio_opts(4, 100);
    if (g_engine == TV_ENGINE_PREAD) {
        /* a pread that takes 300 ms against 100 ms: reported when it returns */
        g_real_pread = tv__sys.pread;
        tv__sys.pread = slow_pread;
        assert_int_equal(one_read(a, 0, 0, 4096), TV_E_TIMEOUT);
        tv__sys_reset();
        assert_int_equal(one_read(a, 0, 0, 4096), 0); /* usable again */
        check_bytes(0, 0, 4096);
        tv__aio_destroy(a);
        return;
    }
    /* io_uring: a pipe that never delivers: cancelled by the linked timeout */
    int p[2];
    assert_int_equal(pipe(p), 0);
    memset(g_region, 0x11, 8192);
    uint64_t t0 = mono_ms();
    assert_int_equal(tv__aio_submit(a, p[0], 4096, 0, 0, g_region, 8192, 3, &err), 0);
    assert_int_equal(tv__aio_flush(a, NULL), 0);
    assert_int_equal(wait_done(a, &d, 1), 1);
    assert_int_equal(d.result, TV_E_TIMEOUT);
    uint64_t took = mono_ms() - t0;
    assert_true(took >= 90 && took < 5000);
    /* the pipe delivers later: nothing lands in the region */
    char junk[8192];
    memset(junk, 0x22, sizeof junk);
    assert_int_equal(write(p[1], junk, sizeof junk), (ssize_t)sizeof junk);
    usleep(20000);
    for (size_t i = 0; i < 8192; i++)
        assert_int_equal(g_region[i], 0x11);
    assert_int_equal(one_read(a, 0, 0, 4096), 0);
    check_bytes(0, 0, 4096);
    tv__aio_destroy(a);
    close(p[0]);
    close(p[1]);
}

static void test_destroy_in_flight(void **state)
{
    (void)state;
    tv_error err = {0};
    if (g_engine == TV_ENGINE_PREAD) {
        /* destroy waits for the reads the workers are doing */
        tv__aio *a = make_aio(4);
        atomic_store(&g_slow_done, 0);
        g_real_pread = tv__sys.pread;
        tv__sys.pread = slow_pread;
        for (int i = 0; i < 2; i++)
            submit_ok(a, (uint64_t)i * 65536, (size_t)i * 65536, 65536, (uint64_t)i);
        assert_int_equal(tv__aio_flush(a, NULL), 0);
        submit_ok(a, 0, 2 * 65536, 4096, 2); /* queued, never flushed: dropped */
        usleep(50000);                       /* the workers are inside pread now */
        tv__aio_destroy(a);
        assert_int_equal(atomic_load(&g_slow_done), 2);
        tv__sys_reset();
        return;
    }
    /* io_uring: reads on a pipe that never deliver are cancelled by destroy,
     * which returns promptly; nothing lands in the region afterwards */
    tv__aio *a = make_aio_opts(8, 60000);
    int p[2];
    assert_int_equal(pipe(p), 0);
    memset(g_region, 0x11, 4 * 8192);
    for (int i = 0; i < 4; i++)
        assert_int_equal(
            tv__aio_submit(a, p[0], 4096, 0, 0, g_region + i * 8192, 8192, (uint64_t)i, &err), 0);
    submit_ok(a, 0, 8 * 8192, 65536, 9); /* a disk read too */
    assert_int_equal(tv__aio_flush(a, NULL), 0);
    usleep(20000);
    assert_int_equal(tv__aio_in_flight(a), 5);
    uint64_t t0 = mono_ms();
    tv__aio_destroy(a);
    assert_true(mono_ms() - t0 < 5000);
    char junk[4 * 8192];
    memset(junk, 0x22, sizeof junk);
    assert_int_equal(write(p[1], junk, sizeof junk), (ssize_t)sizeof junk);
    usleep(20000);
    for (size_t i = 0; i < 4 * 8192; i++)
        assert_int_equal(g_region[i], 0x11);
    close(p[0]);
    close(p[1]);
}

/* ---- engine selection and the fixed-buffer fallback --------------------- */

static void test_engines(void **state)
{
    (void)state;
    tv__aio *a = NULL;
    tv_error err = {0};
    tv__aio_opts o = {.engine = TV_ENGINE_AUTO, .region = g_region, .region_len = REGION_LEN};
    assert_int_equal(tv__aio_create(&o, &a, &err), 0);
    int e = tv__aio_engine(a);
    assert_true(e == TV_ENGINE_URING || e == TV_ENGINE_PREAD);
    tv__aio_destroy(a);
    /* identical bytes from the other engine */
    o.engine = g_engine == TV_ENGINE_URING ? TV_ENGINE_PREAD : TV_ENGINE_URING;
    int rc = tv__aio_create(&o, &a, &err);
    if (rc == TV_E_NOT_SUPPORTED)
        return;
    assert_int_equal(rc, 0);
    memset(g_region, 0, 65536);
    assert_int_equal(one_read(a, 5 * MIB, 0, 65536), 0);
    check_bytes(0, 5 * MIB, 65536);
    tv__aio_destroy(a);
}

/* Drops CAP_IPC_LOCK (a root test run could pin past RLIMIT_MEMLOCK).
 * Returns true when the process now lacks it. */
static bool drop_ipc_lock(void)
{
    struct __user_cap_header_struct h = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
    struct __user_cap_data_struct d[2];
    memset(d, 0, sizeof d);
    if (syscall(SYS_capget, &h, d))
        return false;
    d[CAP_IPC_LOCK / 32].effective &= ~(1u << (CAP_IPC_LOCK % 32));
    d[CAP_IPC_LOCK / 32].permitted &= ~(1u << (CAP_IPC_LOCK % 32));
    d[CAP_IPC_LOCK / 32].inheritable &= ~(1u << (CAP_IPC_LOCK % 32));
    if (syscall(SYS_capset, &h, d))
        return false;
    return true;
}

/* Six 64 KiB reads into six pieces of 512 KiB of the region (in a child:
 * returns 0 or an exit code). */
static int six_reads(tv__aio *a)
{
    tv_error err = {0};
    tv__aio_done d;
    for (uint32_t k = 0; k < 6; k++) {
        size_t at = (size_t)k * 512 * KIB + 64 * KIB;
        uint64_t off = 2 * MIB + (uint64_t)k * 128 * KIB;
        memset(g_region + at, 0, 64 * KIB);
        if (tv__aio_submit(a, g_dev->fd, g_dev->io_align, 0, off, g_region + at, 64 * KIB, k,
                           &err) ||
            tv__aio_flush(a, &err))
            return 3;
        size_t got = 0;
        for (int i = 0; i < 100 && !got; i++) {
            if (efd_readable(a, 100))
                got = tv__aio_reap(a, &d, 1);
        }
        if (got != 1 || d.result || d.tag != k)
            return 4;
        for (size_t i = 0; i < 64 * KIB; i++)
            if (g_region[at + i] != tv_test_pat(off + i))
                return 5;
    }
    return 0;
}

/* A child without CAP_IPC_LOCK. RLIMIT_MEMLOCK 0: io_uring may refuse even
 * its ring (then AUTO reads with the pread pool), and no piece can be
 * registered; reads are identical. RLIMIT_MEMLOCK 256 KiB: the ring fits,
 * every 512 KiB piece registration is refused, reads are plain and
 * identical, and after AIO_MAX_REFUSALS (4) refused pieces the aio stops
 * trying. */
static void test_no_memlock(void **state)
{
    (void)state;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct rlimit rl = {0, 256 * KIB};
        bool dropped = drop_ipc_lock();
        if (setrlimit(RLIMIT_MEMLOCK, &rl))
            _exit(1);
        tv__aio_opts o = {.engine = TV_ENGINE_AUTO,
                          .queue_depth = 4,
                          .region = g_region,
                          .region_len = REGION_LEN,
                          .piece_len = 512 * KIB,
                          .fixed_buffers = true};
        tv__aio *a = NULL;
        tv_error err = {0};
        tv__aio_stats st;
        int rc;
        if (tv__aio_create(&o, &a, &err)) {
            fprintf(stderr, "# tv__aio_create (RLIMIT_MEMLOCK 0): %s\n", err.msg);
            _exit(2);
        }
        if ((rc = six_reads(a)))
            _exit(rc);
        tv__aio_get_stats(a, &st);
        if (dropped && st.n_registered)
            _exit(6);
        tv__aio_destroy(a);

        rl.rlim_cur = 256 * KIB;
        if (setrlimit(RLIMIT_MEMLOCK, &rl))
            _exit(1);
        o.engine = g_engine;
        if (tv__aio_create(&o, &a, &err)) {
            fprintf(stderr, "# tv__aio_create (RLIMIT_MEMLOCK 256 KiB): %s\n", err.msg);
            _exit(2);
        }
        if ((rc = six_reads(a)))
            _exit(rc + 10);
        tv__aio_get_stats(a, &st);
        if (g_engine == TV_ENGINE_URING) {
            if (st.n_pieces != REGION_LEN / (512 * KIB) || st.n_fixed_reads + st.n_plain_reads < 6)
                _exit(7);
            if (dropped && (st.n_registered != 0 || st.n_refused != 4 || st.n_plain_reads < 6))
                _exit(8);
        } else if (st.n_pieces || st.n_registered || st.n_refused) {
            _exit(9);
        }
        tv__aio_destroy(a);
        _exit(dropped ? 0 : 30);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    if (WEXITSTATUS(st) == 30)
        printf("# CAP_IPC_LOCK could not be dropped: refusals not checked\n");
    else
        assert_int_equal(WEXITSTATUS(st), 0);
}

/* ---- lazy fixed-buffer registration ---------------------------------------- */

#define BIG_LEN (128u * MIB)

/* VmPin of this process in KiB, or -1 when the kernel does not report it. */
static long vm_pin_kib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    if (!f)
        return -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmPin: %ld kB", &v) == 1)
            break;
    fclose(f);
    return v;
}

/* A region like the fast path's arena: shared memory (memfd) of len bytes. */
static uint8_t *map_shm(size_t len)
{
    int fd = memfd_create("tv-test-aio", MFD_CLOEXEC);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, (off_t)len), 0);
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    assert_true(p != MAP_FAILED);
    return p;
}

static int read_into(tv__aio *a, uint8_t *region, uint64_t off, size_t region_off, size_t len)
{
    tv__aio_done d = {0};
    tv_error err = {0};
    memset(region + region_off, 0xEE, len);
    int rc =
        tv__aio_submit(a, g_dev->fd, g_dev->io_align, 0, off, region + region_off, len, 42, &err);
    if (rc)
        fail_msg("submit %llu+%zu: %s", (unsigned long long)off, len, err.msg);
    assert_int_equal(tv__aio_flush(a, NULL), 0);
    assert_int_equal(wait_done(a, &d, 1), 1);
    assert_int_equal(d.tag, 42);
    for (size_t i = 0; i < len; i++)
        if (region[region_off + i] != tv_test_pat(off + i))
            fail_msg("byte %zu of the read at %llu into %zu: %02x, want %02x", i,
                     (unsigned long long)off, region_off, region[region_off + i],
                     tv_test_pat(off + i));
    return d.result;
}

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* TV_AIO_TIMING=1: what create cost before registration was lazy (the whole
 * region registered up front) against the lazy create just measured. */
static void print_timing(uint64_t lazy_ns)
{
    const char *t = getenv("TV_AIO_TIMING");
    if (!t || strcmp(t, "1"))
        return;
    printf("# %s: tv__aio_create with a 128 MiB shared-memory region: %.3f ms\n",
           g_engine == TV_ENGINE_URING ? "io_uring (lazy)" : "pread", (double)lazy_ns / 1e6);
    if (g_engine != TV_ENGINE_URING)
        return;
    struct io_uring ring;
    uint8_t *r = map_shm(BIG_LEN);
    struct iovec iov = {.iov_base = r, .iov_len = BIG_LEN};
    if (io_uring_queue_init(8, &ring, 0) == 0) {
        uint64_t t0 = mono_ns();
        int rc = io_uring_register_buffers(&ring, &iov, 1);
        uint64_t t1 = mono_ns();
        printf("# io_uring (eager, the old create): io_uring_register_buffers of 128 MiB: %.3f ms "
               "(%s)\n",
               (double)(t1 - t0) / 1e6, rc ? strerror(-rc) : "ok");
        io_uring_queue_exit(&ring);
    }
    munmap(r, BIG_LEN);
    /* what the lazy registration moves to the first read into a piece: the
     * flush that registers a fresh 1 MiB piece against one into a piece
     * already registered */
    r = map_shm(BIG_LEN);
    tv__aio_opts o = {.engine = g_engine, .queue_depth = 8, .region = r, .region_len = BIG_LEN};
    tv__aio *a = NULL;
    tv_error err = {0};
    tv__aio_done d;
    uint64_t fl[2];
    if (tv__aio_create(&o, &a, &err) == 0) {
        for (int i = 0; i < 2; i++) {
            uint64_t t0 = mono_ns();
            if (tv__aio_submit(a, g_dev->fd, g_dev->io_align, 0, 0,
                               r + 3 * MIB + (size_t)i * 64 * KIB, 64 * KIB, 1, &err) ||
                tv__aio_flush(a, &err))
                fail_msg("read: %s", err.msg);
            fl[i] = mono_ns() - t0;
            assert_int_equal(wait_done(a, &d, 1), 1);
        }
        printf(
            "# io_uring (lazy): flush of the first read into a 1 MiB piece (registers it): %.3f ms, "
            "of a read into a registered piece: %.3f ms\n",
            (double)fl[0] / 1e6, (double)fl[1] / 1e6);
        tv__aio_destroy(a);
    }
    munmap(r, BIG_LEN);
}

/* A kernel without sparse buffer tables (< 5.19, simulated): every piece is
 * registered at create, reads are fixed and byte-identical. */
static void test_no_sparse_table(void **state)
{
    (void)state;
    const size_t len = 8 * MIB;
    uint8_t *r = map_shm(len);
    tv__aio_opts o = {.engine = g_engine,
                      .queue_depth = 4,
                      .region = r,
                      .region_len = len,
                      .fixed_buffers = true};
    tv__aio *a = NULL;
    tv_error err = {0};
    tv__aio_stats st;
    tv__aio_test_no_sparse = true;
    int rc = tv__aio_create(&o, &a, &err);
    tv__aio_test_no_sparse = false;
    if (rc == TV_E_NOT_SUPPORTED) {
        munmap(r, len);
        skip();
    }
    if (rc)
        fail_msg("tv__aio_create: %s", err.msg);
    tv__aio_get_stats(a, &st);
    if (g_engine == TV_ENGINE_PREAD) {
        assert_int_equal(st.n_pieces, 0);
    } else {
        assert_int_equal(st.n_pieces, 8);
        assert_int_equal(st.n_registered, 8); /* all at once */
    }
    assert_int_equal(read_into(a, r, 1 * MIB, 3 * MIB + 64 * KIB, 64 * KIB), 0);
    assert_int_equal(read_into(a, r, 2 * MIB, 7 * MIB, 1 * MIB), 0);
    tv__aio_get_stats(a, &st);
    if (g_engine != TV_ENGINE_PREAD) {
        assert_int_equal(st.n_registered, 8);
        assert_int_equal(st.n_fixed_reads, 2);
        assert_int_equal(st.n_plain_reads, 0);
    }
    tv__aio_destroy(a);
    munmap(r, len);
}

static void test_lazy_registration(void **state)
{
    (void)state;
    uint8_t *big = map_shm(BIG_LEN);
    long pin0 = vm_pin_kib();
    tv__aio_opts o = {.engine = g_engine,
                      .queue_depth = 8,
                      .region = big,
                      .region_len = BIG_LEN,
                      .fixed_buffers = true};
    tv__aio *a = NULL;
    tv_error err = {0};
    tv__aio_stats st;
    uint64_t t0 = mono_ns();
    int rc = tv__aio_create(&o, &a, &err);
    uint64_t t1 = mono_ns();
    if (rc == TV_E_NOT_SUPPORTED) {
        munmap(big, BIG_LEN);
        skip();
    }
    if (rc)
        fail_msg("tv__aio_create: %s", err.msg);
    /* create pins nothing */
    if (pin0 >= 0)
        assert_int_equal(vm_pin_kib(), pin0);
    tv__aio_get_stats(a, &st);
    assert_int_equal(st.n_registered, 0);
    assert_int_equal(st.n_refused, 0);
    if (g_engine == TV_ENGINE_PREAD) {
        assert_int_equal(st.n_pieces, 0);
        assert_int_equal(read_into(a, big, 1 * MIB, 5 * MIB + 64 * KIB, 64 * KIB), 0);
        assert_int_equal(read_into(a, big, 3 * MIB, 10 * MIB - 64 * KIB, 128 * KIB), 0);
        if (pin0 >= 0)
            assert_int_equal(vm_pin_kib(), pin0);
        tv__aio_destroy(a);
        munmap(big, BIG_LEN);
        print_timing(t1 - t0);
        return;
    }
    assert_int_equal(st.piece_len, 1 * MIB);
    assert_int_equal(st.n_pieces, 128);

    /* a read into piece 5 registers piece 5 alone and reads fixed */
    assert_int_equal(read_into(a, big, 1 * MIB, 5 * MIB + 64 * KIB, 64 * KIB), 0);
    tv__aio_get_stats(a, &st);
    assert_int_equal(st.n_registered, 1);
    assert_int_equal(st.n_fixed_reads, 1);
    assert_int_equal(st.n_plain_reads, 0);
    long pin1 = vm_pin_kib();
    if (pin0 >= 0) /* one piece: 1 MiB (a huge page would count whole) */
        assert_true(pin1 - pin0 >= 1024 && pin1 - pin0 <= 4096);
    /* again into piece 5: no new registration */
    assert_int_equal(read_into(a, big, 2 * MIB, 5 * MIB + 512 * KIB, 256 * KIB), 0);
    tv__aio_get_stats(a, &st);
    assert_int_equal(st.n_registered, 1);
    assert_int_equal(st.n_fixed_reads, 2);
    if (pin0 >= 0)
        assert_int_equal(vm_pin_kib(), pin1);
    /* piece 7, then a whole piece (the last one) */
    assert_int_equal(read_into(a, big, 4 * MIB, 7 * MIB, 4096), 0);
    assert_int_equal(read_into(a, big, 6 * MIB, BIG_LEN - 1 * MIB, 1 * MIB), 0);
    tv__aio_get_stats(a, &st);
    assert_int_equal(st.n_registered, 3);
    assert_int_equal(st.n_fixed_reads, 4);
    /* a read spanning pieces 9 and 10: plain, correct, registers nothing */
    assert_int_equal(read_into(a, big, 3 * MIB, 10 * MIB - 64 * KIB, 128 * KIB), 0);
    tv__aio_get_stats(a, &st);
    assert_int_equal(st.n_registered, 3);
    assert_int_equal(st.n_plain_reads, 1);
    assert_int_equal(st.n_refused, 0);
    if (pin0 >= 0) {
        long pin = vm_pin_kib();
        assert_true(pin - pin0 >= 3 * 1024 && pin - pin0 <= 3 * 4096);
    }
    tv__aio_destroy(a);
    /* destroy unpinned everything (the ring's teardown may finish a little later) */
    for (int i = 0; pin0 >= 0 && i < 100 && vm_pin_kib() != pin0; i++)
        usleep(10000);
    if (pin0 >= 0)
        assert_int_equal(vm_pin_kib(), pin0);
    munmap(big, BIG_LEN);
    print_timing(t1 - t0);
}

/* Without fixed_buffers (the default): no table, nothing pinned, every read
 * plain (whole pieces, pieces spanned, resubmissions), bytes identical to
 * the same reads with fixed buffers. */
static void test_plain_default(void **state)
{
    (void)state;
    uint8_t *big = map_shm(BIG_LEN);
    long pin0 = vm_pin_kib();
    for (int fixed = 0; fixed <= 1; fixed++) {
        tv__aio_opts o = {.engine = g_engine,
                          .queue_depth = 8,
                          .region = big,
                          .region_len = BIG_LEN,
                          .fixed_buffers = fixed};
        tv__aio *a = NULL;
        tv_error err = {0};
        tv__aio_stats st;
        int rc = tv__aio_create(&o, &a, &err);
        if (rc == TV_E_NOT_SUPPORTED) {
            munmap(big, BIG_LEN);
            skip();
        }
        if (rc)
            fail_msg("tv__aio_create: %s", err.msg);
        memset(big, 0, 12 * MIB);
        assert_int_equal(read_into(a, big, 1 * MIB, 0, 1 * MIB), 0);
        assert_int_equal(read_into(a, big, 3 * MIB, 2 * MIB - 64 * KIB, 128 * KIB), 0);
        assert_int_equal(read_into(a, big, 4 * MIB + 4096, 7 * MIB, 3 * MIB), 0);
        tv__aio_get_stats(a, &st);
        if (g_engine == TV_ENGINE_URING && !fixed) {
            assert_int_equal(st.n_pieces, 0);
            assert_int_equal(st.n_registered, 0);
            assert_int_equal(st.n_fixed_reads, 0);
            assert_int_equal(st.n_plain_reads, 3);
            if (pin0 >= 0)
                assert_int_equal(vm_pin_kib(), pin0);
        } else if (g_engine == TV_ENGINE_URING) {
            assert_true(st.n_pieces > 0);
            assert_int_equal(st.n_fixed_reads + st.n_plain_reads, 3);
        }
        tv__aio_destroy(a);
    }
    munmap(big, BIG_LEN);
}

/* piece_len: checked, raised to fit the table, a shorter last piece */
static void test_piece_len(void **state)
{
    (void)state;
    uint8_t *big = map_shm(BIG_LEN);
    tv__aio_opts o = {.engine = g_engine,
                      .queue_depth = 4,
                      .region = big,
                      .region_len = BIG_LEN,
                      .fixed_buffers = true};
    tv__aio *a = NULL;
    tv_error err = {0};
    tv__aio_stats st;
    size_t bad[] = {1000, 4096 + 512, (size_t)(1ull << 30) + 4096};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        o.piece_len = bad[i];
        err.msg[0] = '\0';
        assert_int_equal(tv__aio_create(&o, &a, &err), TV_E_INVALID_ARG);
        assert_null(a);
        assert_non_null(strstr(err.msg, "piece_len"));
    }
    /* 4 KiB pieces of 128 MiB: 32768 entries, over the kernel's 16384: 8 KiB */
    o.piece_len = 4096;
    int rc = tv__aio_create(&o, &a, &err);
    if (rc == TV_E_NOT_SUPPORTED) {
        munmap(big, BIG_LEN);
        skip();
    }
    assert_int_equal(rc, 0);
    tv__aio_get_stats(a, &st);
    if (g_engine == TV_ENGINE_URING) {
        assert_int_equal(st.piece_len, 8192);
        assert_int_equal(st.n_pieces, 16384);
        /* an 8 KiB read at an 8 KiB boundary is fixed, one at 4 KiB spans two */
        assert_int_equal(read_into(a, big, 0, 64 * KIB, 8192), 0);
        assert_int_equal(read_into(a, big, 0, 68 * KIB, 8192), 0);
        tv__aio_get_stats(a, &st);
        assert_int_equal(st.n_registered, 1);
        assert_int_equal(st.n_fixed_reads, 1);
        assert_int_equal(st.n_plain_reads, 1);
    } else {
        assert_int_equal(st.n_pieces, 0);
        assert_int_equal(read_into(a, big, 0, 68 * KIB, 8192), 0);
    }
    tv__aio_destroy(a);
    a = NULL;
    munmap(big, BIG_LEN);

    /* 3 MiB pieces of the 4 MiB region: the last one is 1 MiB */
    o.region = g_region;
    o.region_len = REGION_LEN;
    o.piece_len = 3 * MIB;
    assert_int_equal(tv__aio_create(&o, &a, &err), 0);
    tv__aio_get_stats(a, &st);
    assert_int_equal(read_into(a, g_region, 1 * MIB, 3 * MIB, 1 * MIB), 0);
    assert_int_equal(read_into(a, g_region, 0, 0, 3 * MIB), 0);
    assert_int_equal(read_into(a, g_region, 0, 3 * MIB - 4096, 8192), 0);
    if (g_engine == TV_ENGINE_URING) {
        assert_int_equal(st.n_pieces, 2);
        tv__aio_get_stats(a, &st);
        assert_int_equal(st.n_registered, 2);
        assert_int_equal(st.n_fixed_reads, 2);
        assert_int_equal(st.n_plain_reads, 1);
    }
    tv__aio_destroy(a);
    tv__aio_get_stats(NULL, &st);
    assert_int_equal(st.n_pieces, 0);
    tv__aio_get_stats(NULL, NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_reads_exact, teardown),
        cmocka_unit_test_teardown(test_alignment_rejected, teardown),
        cmocka_unit_test_teardown(test_busy_at_queue_depth, teardown),
        cmocka_unit_test_teardown(test_short_read_resubmitted, teardown),
        cmocka_unit_test_teardown(test_zero_read_short_io, teardown),
        cmocka_unit_test_teardown(test_eio, teardown),
        cmocka_unit_test_teardown(test_eventfd, teardown),
        cmocka_unit_test_teardown(test_timeout, teardown),
        cmocka_unit_test_teardown(test_destroy_in_flight, teardown),
        cmocka_unit_test_teardown(test_engines, teardown),
        cmocka_unit_test_teardown(test_no_memlock, teardown),
        cmocka_unit_test_teardown(test_lazy_registration, teardown),
        cmocka_unit_test_teardown(test_no_sparse_table, teardown),
        cmocka_unit_test_teardown(test_piece_len, teardown),
        cmocka_unit_test_teardown(test_plain_default, teardown),
    };
    return TV_TEST_RUN_PER_ENGINE(g_engine, tests, group_setup, group_teardown);
}
