/* Shared helpers of the unit tests (header-only: every function is static
 * inline, every piece of state lives in a function-local static, so a test
 * that includes this header and uses none of it compiles warning-free).
 *
 * What is here: the skip exit (77), the temp-dir fixture (tv_test_tmpdir,
 * tv_test_rmtree), temporary files, a tiny safetensors shard writer, and
 * the fault-injection layer: a wrapper table
 * installed over tv__sys (and the read engines' tv__io_fault hook) that
 * counts every call per kind and can fail the Nth call of one kind (or of
 * any kind) with a chosen errno, or make a pread/pwrite short.
 *
 * Invariants: tv_test_fault_install() wraps whatever table is in place at
 * that moment (so it stacks over another test layer, e.g. a power-loss
 * table), and tv_test_fault_reset() restores the real syscalls (tv__sys_reset)
 * and clears every counter and planned fault. The counters are atomics: the
 * importer and the pread engine call the table from worker threads.
 * Helpers that fail print the reason and abort the test (cmocka's fail_msg
 * when cmocka.h was included first, else abort()). The server tests' store
 * fixtures (a store on images, imports, a fast-path server) are in
 * tv_test_store.h; docs/testing.md describes both. */
#ifndef TV_TEST_H
#define TV_TEST_H

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/engine.h"
#include "tensorvault/tensorvault.h"
#include "util/sys.h"

/* ---- failing and skipping ------------------------------------------------ */

#ifdef fail_msg
#define TV_TEST_DIE(...) fail_msg(__VA_ARGS__)
#else
#define TV_TEST_DIE(...) (fprintf(stderr, __VA_ARGS__), fputc('\n', stderr), abort())
#endif
/* Aborts the test with the failed condition's text unless cond holds. */
#define TV_TEST_CHECK(cond)                                                                        \
    do {                                                                                           \
        if (!(cond))                                                                               \
            TV_TEST_DIE("%s:%d: check failed: %s (errno %d)", __FILE__, __LINE__, #cond, errno);   \
    } while (0)

#define TV_TEST_SKIP 77 /* ctest's SKIP_RETURN_CODE */

/* Prints "SKIP: " and the reason (printf format) and exits 77: the test
 * needs something this machine lacks (hardware, root, a kernel feature).
 * Exiting runs the atexit handlers, as a return from main would. */
__attribute__((format(printf, 1, 2), noreturn)) static inline void tv_test_skip(const char *fmt,
                                                                                ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("SKIP: ", stdout);
    vprintf(fmt, ap);
    va_end(ap);
    fputc('\n', stdout);
    fflush(stdout);
    exit(TV_TEST_SKIP);
}

/* ---- temporary directories and files ------------------------------------- */

/* Creates a fresh directory $TMPDIR/tv-test-TAG-XXXXXX (0700) into out;
 * base instead of $TMPDIR when that is unset or empty (e.g. "/var/tmp" for
 * a test that needs a disk, not tmpfs). Fails the test when it cannot. */
static inline void tv_test_tmpdir_at(char *out, size_t len, const char *tag, const char *base)
{
    const char *tmp = getenv("TMPDIR");
    int n = snprintf(out, len, "%s/tv-test-%s-XXXXXX", tmp && *tmp ? tmp : base, tag);
    TV_TEST_CHECK(n > 0 && (size_t)n < len);
    TV_TEST_CHECK(mkdtemp(out) != NULL);
}

/* The same under $TMPDIR, else /tmp: the temp dir of most tests. */
static inline void tv_test_tmpdir(char *out, size_t len, const char *tag)
{
    tv_test_tmpdir_at(out, len, tag, "/tmp");
}

static inline int *tv_test__rm_failed(void)
{
    static int failed;
    return &failed;
}

static inline int tv_test__rm_entry(const char *path, const struct stat *sb, int type,
                                    struct FTW *ftw)
{
    (void)sb, (void)type, (void)ftw;
    if (remove(path) != 0)
        *tv_test__rm_failed() = 1;
    return 0;
}

/* Removes dir and everything below it with the real syscalls (never follows
 * symlinks); NULL or "" is a no-op. Returns 0 when everything is gone, -1
 * when dir could not be walked or an entry could not be removed (the walk
 * goes on past it). */
static inline int tv_test_rmtree(const char *dir)
{
    if (!dir || !*dir)
        return 0;
    *tv_test__rm_failed() = 0;
    int rc = nftw(dir, tv_test__rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return rc != 0 || *tv_test__rm_failed() ? -1 : 0;
}

/* Formats a path into out (aborts when it does not fit); returns out. */
static inline char *tv_test_path(char *out, size_t len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(out, len, fmt, ap);
    va_end(ap);
    TV_TEST_CHECK(n >= 0 && (size_t)n < len);
    return out;
}

/* Writes len bytes to path (created 0600 or truncated), with the real syscalls. */
static inline void tv_test_write_file(const char *path, const void *data, size_t len)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    TV_TEST_CHECK(fd >= 0);
    size_t done = 0;
    while (done < len) {
        ssize_t n = write(fd, (const char *)data + done, len - done);
        TV_TEST_CHECK(n > 0);
        done += (size_t)n;
    }
    TV_TEST_CHECK(close(fd) == 0);
}

/* Writes a NUL-terminated text to path. */
static inline void tv_test_write_text(const char *path, const char *text)
{
    tv_test_write_file(path, text, strlen(text));
}

/* Reads the whole of path into a malloc'ed buffer (*len_out its length);
 * NULL when the file cannot be opened. */
static inline uint8_t *tv_test_read_file(const char *path, size_t *len_out)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    struct stat sb;
    TV_TEST_CHECK(fstat(fd, &sb) == 0);
    size_t len = (size_t)sb.st_size;
    uint8_t *buf = malloc(len ? len : 1);
    TV_TEST_CHECK(buf != NULL);
    size_t done = 0;
    while (done < len) {
        ssize_t n = pread(fd, buf + done, len - done, (off_t)done);
        TV_TEST_CHECK(n > 0);
        done += (size_t)n;
    }
    close(fd);
    *len_out = len;
    return buf;
}

/* ---- both read engines ------------------------------------------------------ */

#ifdef cmocka_unit_test
/* Runs the cmocka group tests[0..n) twice: *engine = TV_ENGINE_URING (group
 * "io_uring"), then TV_ENGINE_PREAD ("pread"). Returns main's exit status. */
static inline int tv_test_run_per_engine(int *engine, const struct CMUnitTest *tests, size_t n,
                                         CMFixtureFunction setup, CMFixtureFunction teardown)
{
    int rc = 0;
    *engine = TV_ENGINE_URING;
    rc |= _cmocka_run_group_tests("io_uring", tests, n, setup, teardown);
    *engine = TV_ENGINE_PREAD;
    rc |= _cmocka_run_group_tests("pread", tests, n, setup, teardown);
    return rc ? 1 : 0;
}
#define TV_TEST_RUN_PER_ENGINE(engine, tests, setup, teardown)                                     \
    tv_test_run_per_engine(&(engine), (tests), sizeof(tests) / sizeof((tests)[0]), (setup),        \
                           (teardown))
#endif

/* ---- pattern images -------------------------------------------------------- */

/* The byte at offset x of a pattern image (the read engines' substrate). */
static inline uint8_t tv_test_pat(uint64_t x)
{
    uint64_t h = (x + 0x1234567ull) * 0x9E3779B97F4A7C15ull;
    return (uint8_t)((h >> 56) ^ (x >> 12));
}

/* Creates path (new, 0600) of len bytes (a multiple of 1 MiB) whose byte at
 * every offset x is tv_test_pat(x), fsynced. Returns 0 or -1. */
static inline int tv_test_write_pat_image(const char *path, uint64_t len)
{
    const size_t mib = 1024u * 1024u;
    uint8_t *buf = malloc(mib);
    int rc = 0, fd = buf ? open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600) : -1;
    if (fd < 0) {
        free(buf);
        return -1;
    }
    for (uint64_t o = 0; o < len && !rc; o += mib) {
        for (size_t i = 0; i < mib; i++)
            buf[i] = tv_test_pat(o + i);
        if (pwrite(fd, buf, mib, (off_t)o) != (ssize_t)mib)
            rc = -1;
    }
    if (fsync(fd))
        rc = -1;
    close(fd);
    free(buf);
    return rc;
}

/* ---- safetensors shard writer --------------------------------------------- */

typedef struct tv_test_tensor {
    const char *name;
    const char *dtype; /* "F32", "U8", ... */
    uint64_t n_elems;  /* 1-D shape [n_elems] */
    unsigned elem_len; /* bytes per element, matching dtype */
} tv_test_tensor;

/* A tensor of any shape, for tv_test_write_shard_nd. */
typedef struct tv_test_tensor_nd {
    const char *name;
    const char *dtype; /* "F32", "U8", ... */
    const char *shape; /* JSON list: "[10,20]", "[]" */
    uint64_t n_bytes;  /* matching dtype and shape */
} tv_test_tensor_nd;

/* Payload byte i of a shard written with seed (what tv_test_write_shard stores). */
static inline uint8_t tv_test_shard_byte(uint64_t i, unsigned seed)
{
    return (uint8_t)(i * 131u + seed * 7u + (i >> 12));
}

/* Writes a safetensors file: 8-byte LE header length, JSON header padded
 * with spaces to a multiple of 8, then the tensors back to back filled with
 * tv_test_shard_byte(i, seed). Returns the file length. */
static inline uint64_t tv_test_write_shard_nd(const char *path, const tv_test_tensor_nd *t,
                                              size_t n, unsigned seed)
{
    char hdr[8192];
    size_t hl = 0;
    uint64_t off = 0;
    hl += (size_t)snprintf(hdr + hl, sizeof hdr - hl, "{");
    for (size_t i = 0; i < n; i++) {
        hl += (size_t)snprintf(
            hdr + hl, sizeof hdr - hl,
            "%s\"%s\":{\"dtype\":\"%s\",\"shape\":%s,\"data_offsets\":[%llu,%llu]}", i ? "," : "",
            t[i].name, t[i].dtype, t[i].shape, (unsigned long long)off,
            (unsigned long long)(off + t[i].n_bytes));
        TV_TEST_CHECK(hl < sizeof hdr);
        off += t[i].n_bytes;
    }
    hl += (size_t)snprintf(hdr + hl, sizeof hdr - hl, "}");
    TV_TEST_CHECK(hl + 8 < sizeof hdr);
    while (hl % 8)
        hdr[hl++] = ' ';
    uint64_t file_len = 8 + hl + off;
    uint8_t *buf = malloc(file_len);
    TV_TEST_CHECK(buf != NULL);
    for (int i = 0; i < 8; i++)
        buf[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(buf + 8, hdr, hl);
    for (uint64_t i = 0; i < off; i++)
        buf[8 + hl + i] = tv_test_shard_byte(i, seed);
    tv_test_write_file(path, buf, file_len);
    free(buf);
    return file_len;
}

/* The same for 1-D tensors of n_elems elements. */
static inline uint64_t tv_test_write_shard(const char *path, const tv_test_tensor *t, size_t n,
                                           unsigned seed)
{
    tv_test_tensor_nd *nd = calloc(n ? n : 1, sizeof *nd);
    char(*shape)[24] = calloc(n ? n : 1, sizeof *shape);
    TV_TEST_CHECK(nd != NULL && shape != NULL);
    for (size_t i = 0; i < n; i++) {
        snprintf(shape[i], sizeof shape[i], "[%llu]", (unsigned long long)t[i].n_elems);
        nd[i] = (tv_test_tensor_nd){t[i].name, t[i].dtype, shape[i], t[i].n_elems * t[i].elem_len};
    }
    uint64_t file_len = tv_test_write_shard_nd(path, nd, n, seed);
    free(shape);
    free(nd);
    return file_len;
}

/* ---- fault injection -------------------------------------------------------- */

/* One kind per tv__sys entry, plus the read engines' completed device reads
 * (tv__io_fault: io_uring and pread engines). */
typedef enum tv_test_sys_kind {
    TV_TEST_SYS_OPEN,
    TV_TEST_SYS_CLOSE,
    TV_TEST_SYS_PREAD,
    TV_TEST_SYS_PWRITE,
    TV_TEST_SYS_FSYNC,
    TV_TEST_SYS_FDATASYNC,
    TV_TEST_SYS_FTRUNCATE,
    TV_TEST_SYS_FSTAT,
    TV_TEST_SYS_IOCTL,
    TV_TEST_SYS_FLOCK,
    TV_TEST_SYS_RENAME,
    TV_TEST_SYS_RENAME_NOREPLACE,
    TV_TEST_SYS_LINK,
    TV_TEST_SYS_UNLINK,
    TV_TEST_SYS_MKDIR,
    TV_TEST_SYS_IO_READ, /* a device read completed by a tv__io engine */
    TV_TEST_SYS_N,
    TV_TEST_SYS_ANY = -1 /* tv_test_fault_fail: the Nth call of any kind */
} tv_test_sys_kind;

/* Name of a kind ("pread", ...; "any" for TV_TEST_SYS_ANY). */
static inline const char *tv_test_sys_name(int kind)
{
    static const char *const names[TV_TEST_SYS_N] = {
        "open",      "close",  "pread", "pwrite",  "fsync",  "fdatasync",
        "ftruncate", "fstat",  "ioctl", "flock",   "rename", "rename_noreplace",
        "link",      "unlink", "mkdir", "io_read",
    };
    return kind >= 0 && kind < TV_TEST_SYS_N ? names[kind] : "any";
}

#define TV_TEST_MAX_FDS 1024

typedef struct tv_test_fault_state {
    tv__sys_ops under;        /* the table wrapped by tv_test_fault_install */
    tv__io_fault_fn under_io; /* the io hook wrapped */
    atomic_long count[TV_TEST_SYS_N];
    atomic_long total;                  /* calls of every kind */
    atomic_long fired;                  /* faults injected so far */
    int kind;                           /* planned fault: kind or TV_TEST_SYS_ANY */
    long nth;                           /* 1-based call (of kind) to fail; 0 = none */
    int err;                            /* errno to fail with; 0 = a short transfer */
    bool persist;                       /* fail every matching call from the nth on */
    int only_fd;                        /* count/fail only calls on this fd (-1: all) */
    atomic_long last_fired_kind;        /* kind of the last injected fault */
    char last_path[512];                /* what the last injected fault hit */
    char fd_path[TV_TEST_MAX_FDS][256]; /* path each fd was opened with */
} tv_test_fault_state;

static inline tv_test_fault_state *tv_test__fs(void)
{
    static tv_test_fault_state s = {.nth = 0, .only_fd = -1};
    return &s;
}

/* Counts one call of kind on fd (-1: not an fd call) and decides whether it
 * fails: returns 0 (run it), 1 (fail with errno set) or 2 (make it short). */
static inline int tv_test__fault_step(int kind, int fd, const char *path)
{
    tv_test_fault_state *s = tv_test__fs();
    if (s->only_fd >= 0 && fd != s->only_fd)
        return 0;
    long n_kind = atomic_fetch_add(&s->count[kind], 1) + 1;
    long n_all = atomic_fetch_add(&s->total, 1) + 1;
    if (s->nth <= 0)
        return 0;
    long n = s->kind == TV_TEST_SYS_ANY ? n_all : (s->kind == kind ? n_kind : 0);
    if (n == 0 || (s->persist ? n < s->nth : n != s->nth))
        return 0;
    atomic_fetch_add(&s->fired, 1);
    atomic_store(&s->last_fired_kind, kind);
    if (!path && fd >= 0 && fd < TV_TEST_MAX_FDS)
        path = s->fd_path[fd];
    snprintf(s->last_path, sizeof s->last_path, "%s", path ? path : "");
    bool can_short =
        kind == TV_TEST_SYS_PREAD || kind == TV_TEST_SYS_PWRITE || kind == TV_TEST_SYS_IO_READ;
    if (s->err == 0 && can_short)
        return 2;
    errno = s->err ? s->err : EIO;
    return 1;
}

/* Half of len, rounded down to 4 KiB when that leaves something (O_DIRECT). */
static inline size_t tv_test__short_len(size_t len)
{
    size_t half = len / 2;
    return half >= 4096 ? half / 4096 * 4096 : half;
}

static inline int tv_test__open(const char *path, int flags, mode_t mode)
{
    if (tv_test__fault_step(TV_TEST_SYS_OPEN, -1, path))
        return -1;
    int fd = tv_test__fs()->under.open(path, flags, mode);
    if (fd >= 0 && fd < TV_TEST_MAX_FDS)
        snprintf(tv_test__fs()->fd_path[fd], sizeof tv_test__fs()->fd_path[fd], "%s", path);
    return fd;
}
static inline int tv_test__close(int fd)
{
    /* A failed close still releases the descriptor (Linux semantics). */
    if (tv_test__fault_step(TV_TEST_SYS_CLOSE, fd, NULL)) {
        int e = errno;
        tv_test__fs()->under.close(fd);
        errno = e;
        return -1;
    }
    return tv_test__fs()->under.close(fd);
}
static inline ssize_t tv_test__pread(int fd, void *buf, size_t len, off_t off)
{
    int f = tv_test__fault_step(TV_TEST_SYS_PREAD, fd, NULL);
    if (f == 1)
        return -1;
    return tv_test__fs()->under.pread(fd, buf, f == 2 ? tv_test__short_len(len) : len, off);
}
static inline ssize_t tv_test__pwrite(int fd, const void *buf, size_t len, off_t off)
{
    int f = tv_test__fault_step(TV_TEST_SYS_PWRITE, fd, NULL);
    if (f == 1)
        return -1;
    return tv_test__fs()->under.pwrite(fd, buf, f == 2 ? tv_test__short_len(len) : len, off);
}
static inline int tv_test__fsync(int fd)
{
    return tv_test__fault_step(TV_TEST_SYS_FSYNC, fd, NULL) ? -1 : tv_test__fs()->under.fsync(fd);
}
static inline int tv_test__fdatasync(int fd)
{
    return tv_test__fault_step(TV_TEST_SYS_FDATASYNC, fd, NULL)
               ? -1
               : tv_test__fs()->under.fdatasync(fd);
}
static inline int tv_test__ftruncate(int fd, off_t len)
{
    return tv_test__fault_step(TV_TEST_SYS_FTRUNCATE, fd, NULL)
               ? -1
               : tv_test__fs()->under.ftruncate(fd, len);
}
static inline int tv_test__fstat(int fd, struct stat *sb)
{
    return tv_test__fault_step(TV_TEST_SYS_FSTAT, fd, NULL) ? -1
                                                            : tv_test__fs()->under.fstat(fd, sb);
}
static inline int tv_test__ioctl(int fd, unsigned long req, void *arg)
{
    return tv_test__fault_step(TV_TEST_SYS_IOCTL, fd, NULL)
               ? -1
               : tv_test__fs()->under.ioctl(fd, req, arg);
}
static inline int tv_test__flock(int fd, int op)
{
    return tv_test__fault_step(TV_TEST_SYS_FLOCK, fd, NULL) ? -1
                                                            : tv_test__fs()->under.flock(fd, op);
}
static inline int tv_test__rename(const char *from, const char *to)
{
    return tv_test__fault_step(TV_TEST_SYS_RENAME, -1, from)
               ? -1
               : tv_test__fs()->under.rename(from, to);
}
static inline int tv_test__rename_noreplace(const char *from, const char *to)
{
    return tv_test__fault_step(TV_TEST_SYS_RENAME_NOREPLACE, -1, from)
               ? -1
               : tv_test__fs()->under.rename_noreplace(from, to);
}
static inline int tv_test__link(const char *from, const char *to)
{
    return tv_test__fault_step(TV_TEST_SYS_LINK, -1, from) ? -1
                                                           : tv_test__fs()->under.link(from, to);
}
static inline int tv_test__unlink(const char *path)
{
    return tv_test__fault_step(TV_TEST_SYS_UNLINK, -1, path) ? -1
                                                             : tv_test__fs()->under.unlink(path);
}
static inline int tv_test__mkdir(const char *path, mode_t mode)
{
    return tv_test__fault_step(TV_TEST_SYS_MKDIR, -1, path)
               ? -1
               : tv_test__fs()->under.mkdir(path, mode);
}
static inline void tv_test__io_fault(uint32_t dev, uint64_t off, size_t len, int64_t *res)
{
    tv_test_fault_state *s = tv_test__fs();
    if (s->under_io)
        s->under_io(dev, off, len, res);
    int f = tv_test__fault_step(TV_TEST_SYS_IO_READ, -1, "(tv__io engine device read)");
    if (f == 1)
        *res = -(int64_t)errno;
    else if (f == 2 && *res > 0)
        *res = (int64_t)tv_test__short_len((size_t)*res);
}

/* Clears the counters and the planned fault, keeps the wrappers installed. */
static inline void tv_test_fault_clear(void)
{
    tv_test_fault_state *s = tv_test__fs();
    for (int k = 0; k < TV_TEST_SYS_N; k++)
        atomic_store(&s->count[k], 0);
    atomic_store(&s->total, 0);
    atomic_store(&s->fired, 0);
    atomic_store(&s->last_fired_kind, -1);
    s->last_path[0] = '\0';
    s->kind = TV_TEST_SYS_ANY;
    s->nth = 0;
    s->err = 0;
    s->persist = false;
    s->only_fd = -1;
}

/* Restores the real syscalls (tv__sys_reset), removes the io hook and clears
 * every counter and planned fault. Call after each case. */
static inline void tv_test_fault_reset(void)
{
    tv__sys_reset();
    tv__io_fault = NULL;
    tv_test__fs()->under_io = NULL;
    tv_test_fault_clear();
}

/* Installs the counting wrappers over the table (and io hook) now in place;
 * counters start at zero, no fault planned. */
static inline void tv_test_fault_install(void)
{
    tv_test_fault_state *s = tv_test__fs();
    tv_test_fault_clear();
    if (tv__sys.open == tv_test__open)
        return; /* already installed */
    s->under = tv__sys;
    s->under_io = tv__io_fault;
    tv__sys = (tv__sys_ops){
        .open = tv_test__open,
        .openat = s->under.openat, /* pass-through: not counted, never failed */
        .close = tv_test__close,
        .pread = tv_test__pread,
        .pwrite = tv_test__pwrite,
        .fsync = tv_test__fsync,
        .fdatasync = tv_test__fdatasync,
        .ftruncate = tv_test__ftruncate,
        .fstat = tv_test__fstat,
        .ioctl = tv_test__ioctl,
        .flock = tv_test__flock,
        .rename = tv_test__rename,
        .rename_noreplace = tv_test__rename_noreplace,
        .link = tv_test__link,
        .unlink = tv_test__unlink,
        .mkdir = tv_test__mkdir,
        .mmap = s->under.mmap, /* pass-through: not counted, never failed */
        .munmap = s->under.munmap,
        .lseek = s->under.lseek,     /* pass-through: not counted, never failed */
        .sendmsg = s->under.sendmsg, /* pass-through (the fast-path socket) */
        .recvmsg = s->under.recvmsg,
    };
    tv__io_fault = tv_test__io_fault;
}

/* Plans a fault: the nth (1-based) call of kind (or TV_TEST_SYS_ANY) fails
 * with err; err 0 makes a pread/pwrite/io_read short (half the length) and
 * any other kind fail with EIO. persist: every matching call from the nth on
 * fails (a dead disk), not only the nth. Counters keep running. */
static inline void tv_test_fault_fail(int kind, long nth, int err, bool persist)
{
    tv_test_fault_state *s = tv_test__fs();
    s->kind = kind;
    s->err = err;
    s->persist = persist;
    s->nth = nth;
}

/* Restricts counting and faults to calls on fd (-1: every call again);
 * path calls (open, rename, link, unlink, mkdir) are then never counted. */
static inline void tv_test_fault_only_fd(int fd)
{
    tv_test__fs()->only_fd = fd;
}

/* Calls of kind (TV_TEST_SYS_ANY: of every kind) since install/clear. */
static inline long tv_test_fault_count(int kind)
{
    tv_test_fault_state *s = tv_test__fs();
    return kind == TV_TEST_SYS_ANY ? atomic_load(&s->total) : atomic_load(&s->count[kind]);
}

/* Faults injected since install/clear (0: the planned call never happened). */
static inline long tv_test_fault_fired(void)
{
    return atomic_load(&tv_test__fs()->fired);
}

/* What the last injected fault hit: the path of a path call, the path an
 * fd was opened with through the table, or "" (an fd opened elsewhere). */
static inline const char *tv_test_fault_last_path(void)
{
    return tv_test__fs()->last_path;
}

/* Kind of the last injected fault (-1: none yet). */
static inline int tv_test_fault_last_kind(void)
{
    return (int)atomic_load(&tv_test__fs()->last_fired_kind);
}

#endif
