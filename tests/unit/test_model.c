/* Unit tests of the reader API (tensorvault.h) on a model opened from a
 * store (the common layer core/src/reader/model.c over the store backend,
 * reader/store.c; the daemon backend is test_client's) built here: a file
 * image, a checkpoint written by the test (so the source bytes are known),
 * imported and published with the server's importer, then read only
 * through the public API with both engines (io_uring and pread), chunk_len
 * 64 KiB and queue depth 4.
 *
 * The checkpoint has a fixed header length (data section at file offset
 * 4008, unaligned), several dtypes, an odd-length U8 so later offsets are
 * unaligned, zero-size and rank-0 tensors, a tensor of ~6 chunks, one whose
 * device range is exactly 4 KiB aligned (the direct-read path), an F4
 * tensor whose rows are not whole bytes, and the special values of every
 * float format the float32 conversion knows.
 *
 * Invariants checked: every read returns the source bytes and writes only
 * [dest, dest + nbytes) (4 KiB of guard pattern on both sides, odd and
 * aligned destinations); refused calls write nothing; batch results are per
 * request; injected device faults (tv__io_fault) surface as errors of
 * exactly the requests they touch; a corrupted snapshot or a resized device
 * is refused at open, before any device read; a reader's lease keeps a
 * retired generation's objects through gc; CUDA entry points fail cleanly
 * with TV_E_NOT_SUPPORTED where there is no GPU; tv_read_range reads any
 * byte range (unaligned, 0 length, refused past the end) and only its
 * envelope; NAME@ALIAS and NAME@active open what the pointers name, and a
 * reader keeps its generation after the alias moves; the serve.h accessors
 * give the validated snapshot image and device descriptors (excluded: -1);
 * tv_read_shard_header returns each shard's first 8 + header_len bytes (one
 * and two shards), refuses bad shards and small destinations without a read
 * or a write, fails over to another replica and fails a shard without one. */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "import/import.h"
#include "store/snapbuild.h"
#include "store/store.h"
#include "io/engine.h"
#include "reader/serve.h"
#include "registry/registry.h"
#include "snap/snapfile.h"
#include "snap/snapshot.h"
#include "tensorvault/tensorvault.h"
#include "util/sys.h"
#include "tv_test.h"

#define KiB       1024ull
#define MiB       (1024ull * 1024ull)
#define MODEL     "acme/tiny" /* '/' exercises the snapshot path escaping */
#define HDR_LEN   4000u       /* JSON header, space-padded: data section at 4008 */
#define DATA_BASE (8u + HDR_LEN)
#define GUARD     4096u
#define PAT       0xA5
#define CHUNK     (64 * KiB)
#define ALIGN     4096u /* io_align of a file image */

/* ---- the checkpoint ----------------------------------------------------- */

typedef struct tspec {
    const char *name;
    tv_dtype dtype;
    const char *dts;
    uint32_t rank;
    uint64_t shape[4];
    /* computed */
    uint64_t begin, nbytes, n_elems;
} tspec;

enum {
    T_FIRST,
    T_ODD,
    T_I16,
    T_EMPTY,
    T_SCALAR,
    T_BF16,
    T_F16,
    T_E4M3,
    T_E5M2,
    T_E8M0,
    T_F4,
    T_I32,
    T_ROWS,
    T_F64,
    T_BIG,
    T_PAD,
    T_ALIGNED,
    T_AFTER,
    T_EMPTY2,
    T_LAST,
    N_T
};

#define TS(n, dt, s, r, ...)                                                                       \
    {                                                                                              \
        .name = n, .dtype = dt, .dts = s, .rank = r, .shape = { __VA_ARGS__ }                      \
    }
static tspec g_t[N_T] = {
    [T_FIRST] = TS("first.f32", TV_DTYPE_F32, "F32", 1, 5),
    [T_ODD] = TS("odd.u8", TV_DTYPE_U8, "U8", 1, 3),
    [T_I16] = TS("mat.i16", TV_DTYPE_I16, "I16", 2, 3, 5),
    [T_EMPTY] = TS("empty.f32", TV_DTYPE_F32, "F32", 2, 0, 4),
    [T_SCALAR] = TS("scalar.i32", TV_DTYPE_I32, "I32", 0, 0),
    [T_BF16] = TS("sp.bf16", TV_DTYPE_BF16, "BF16", 1, 11),
    [T_F16] = TS("sp.f16", TV_DTYPE_F16, "F16", 1, 12),
    [T_E4M3] = TS("sp.e4m3", TV_DTYPE_F8_E4M3, "F8_E4M3", 1, 11),
    [T_E5M2] = TS("sp.e5m2", TV_DTYPE_F8_E5M2, "F8_E5M2", 1, 13),
    [T_E8M0] = TS("sp.e8m0", TV_DTYPE_F8_E8M0, "F8_E8M0", 1, 6),
    [T_F4] = TS("w.f4", TV_DTYPE_F4, "F4", 2, 2, 3), /* 3 bytes; a row is 12 bits */
    [T_I32] = TS("v.i32", TV_DTYPE_I32, "I32", 1, 7),
    [T_ROWS] = TS("rows.u8", TV_DTYPE_U8, "U8", 2, 9, 5),
    [T_F64] = TS("v.f64", TV_DTYPE_F64, "F64", 1, 3),
    [T_BIG] = TS("big.f32", TV_DTYPE_F32, "F32", 2, 100, 1000), /* 400000 bytes, 4000 a row */
    [T_PAD] = TS("pad.u8", TV_DTYPE_U8, "U8", 1, 0),            /* length set by layout() */
    [T_ALIGNED] = TS("aligned.f32", TV_DTYPE_F32, "F32", 1, 2048),
    [T_AFTER] = TS("after.bf16", TV_DTYPE_BF16, "BF16", 2, 4, 7),
    [T_EMPTY2] = TS("empty.u8", TV_DTYPE_U8, "U8", 1, 0),
    [T_LAST] = TS("last.u8", TV_DTYPE_U8, "U8", 1, 13),
};

/* Special values (raw little-endian bits) and their float32 bits, computed
 * by hand from the formats (and equal to numpy / ml_dtypes astype). */
static const uint16_t SP_BF16[11] = {0x0000, 0x8000, 0x0001, 0x807f, 0x7f7f, 0xff7f,
                                     0x7f80, 0xff80, 0x7fc1, 0xffa5, 0x3f80};
static const uint32_t SP_BF16_F32[11] = {0x00000000, 0x80000000, 0x00010000, 0x807f0000,
                                         0x7f7f0000, 0xff7f0000, 0x7f800000, 0xff800000,
                                         0x7fc10000, 0xffa50000, 0x3f800000};
static const uint16_t SP_F16[12] = {0x0000, 0x8000, 0x0001, 0x03ff, 0x0400, 0x7bff,
                                    0xfbff, 0x7c00, 0xfc00, 0x7e01, 0xfd00, 0x3c00};
static const uint32_t SP_F16_F32[12] = {0x00000000, 0x80000000, 0x33800000, 0x387fc000,
                                        0x38800000, 0x477fe000, 0xc77fe000, 0x7f800000,
                                        0xff800000, 0x7fc02000, 0xffa00000, 0x3f800000};
static const uint8_t SP_E4M3[11] = {0x00, 0x80, 0x01, 0x07, 0x08, 0x7e,
                                    0xfe, 0x7f, 0xff, 0x38, 0x81};
static const uint32_t SP_E4M3_F32[11] = {0x00000000, 0x80000000, 0x3b000000, 0x3c600000,
                                         0x3c800000, 0x43e00000, 0xc3e00000, 0x7fc00000,
                                         0xffc00000, 0x3f800000, 0xbb000000};
static const uint8_t SP_E5M2[13] = {0x00, 0x80, 0x01, 0x03, 0x04, 0x7b, 0xfb,
                                    0x7c, 0xfc, 0x7d, 0xfe, 0x7f, 0x3c};
static const uint32_t SP_E5M2_F32[13] = {0x00000000, 0x80000000, 0x37800000, 0x38400000, 0x38800000,
                                         0x47600000, 0xc7600000, 0x7f800000, 0xff800000, 0x7fc00000,
                                         0xffc00000, 0x7fc00000, 0x3f800000};
static const uint8_t SP_E8M0[6] = {0x00, 0x01, 0x7f, 0xfe, 0xff, 0x80};
static const uint32_t SP_E8M0_F32[6] = {0x00400000, 0x00800000, 0x3f800000,
                                        0x7f000000, 0x7fc00000, 0x40000000};

static uint64_t g_data_len; /* bytes of the data section */

/* Computes begins and lengths; pad.u8 makes aligned.f32 start on a 4 KiB
 * boundary of the file (objects are 64 KiB aligned, so of the device too). */
static void layout(void)
{
    uint64_t cur = 0;
    for (int i = 0; i < N_T; i++) {
        tspec *t = &g_t[i];
        if (i == T_PAD) {
            uint64_t p = (ALIGN - (DATA_BASE + cur) % ALIGN) % ALIGN;
            t->shape[0] = p ? p : ALIGN;
        }
        t->n_elems = 1;
        for (uint32_t d = 0; d < t->rank; d++)
            t->n_elems *= t->shape[d];
        t->nbytes = t->n_elems * tv_dtype_bits(t->dtype) / 8;
        t->begin = cur;
        cur += t->nbytes;
    }
    g_data_len = cur;
}

static uint64_t file_off(int i)
{
    return DATA_BASE + g_t[i].begin;
}

/* The checkpoint's bytes for seed (malloc'd, g_file_len bytes). */
static uint8_t *make_file(unsigned seed, uint64_t *len)
{
    char hdr[HDR_LEN + 1];
    size_t hl = 0;
    hl += (size_t)snprintf(hdr + hl, sizeof hdr - hl, "{\"__metadata__\":{\"seed\":\"%u\"}", seed);
    for (int i = 0; i < N_T; i++) {
        const tspec *t = &g_t[i];
        hl += (size_t)snprintf(hdr + hl, sizeof hdr - hl, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[",
                               t->name, t->dts);
        for (uint32_t d = 0; d < t->rank; d++)
            hl += (size_t)snprintf(hdr + hl, sizeof hdr - hl, "%s%llu", d ? "," : "",
                                   (unsigned long long)t->shape[d]);
        hl += (size_t)snprintf(hdr + hl, sizeof hdr - hl, "],\"data_offsets\":[%llu,%llu]}",
                               (unsigned long long)t->begin,
                               (unsigned long long)(t->begin + t->nbytes));
        assert_true(hl < HDR_LEN);
    }
    hl += (size_t)snprintf(hdr + hl, sizeof hdr - hl, "}");
    assert_true(hl <= HDR_LEN);
    memset(hdr + hl, ' ', HDR_LEN - hl);
    *len = DATA_BASE + g_data_len;
    uint8_t *b = malloc(*len);
    assert_non_null(b);
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)((uint64_t)HDR_LEN >> (8 * i));
    memcpy(b + 8, hdr, HDR_LEN);
    for (uint64_t i = DATA_BASE; i < *len; i++)
        b[i] = (uint8_t)(i * 131u + seed * 7u + (i >> 12) + (i >> 9) * seed);
    for (size_t k = 0; k < 11; k++) {
        b[file_off(T_BF16) + 2 * k] = (uint8_t)SP_BF16[k];
        b[file_off(T_BF16) + 2 * k + 1] = (uint8_t)(SP_BF16[k] >> 8);
    }
    for (size_t k = 0; k < 12; k++) {
        b[file_off(T_F16) + 2 * k] = (uint8_t)SP_F16[k];
        b[file_off(T_F16) + 2 * k + 1] = (uint8_t)(SP_F16[k] >> 8);
    }
    memcpy(b + file_off(T_E4M3), SP_E4M3, sizeof SP_E4M3);
    memcpy(b + file_off(T_E5M2), SP_E5M2, sizeof SP_E5M2);
    memcpy(b + file_off(T_E8M0), SP_E8M0, sizeof SP_E8M0);
    return b;
}

/* ---- stores --------------------------------------------------------------- */

typedef struct store_fx {
    char dir[128];
    char store[256];
    char image[256];
    char ck1[256], ck2[256];
    uint8_t *src1, *src2; /* file bytes of generations 1 and 2 */
    uint64_t len1, len2;
    uint64_t base1; /* device offset of generation 1's object */
    tv__store *st;  /* the writer, open while the test needs it */
} store_fx;

static void import_ck(store_fx *f, const char *ck)
{
    tv_error err = {0};
    tv__import_opts o = {.activate = true, .strict = true};
    if (tv__import(f->st, MODEL, ck, &o, NULL, &err))
        fail_msg("import %s: %s", ck, err.msg);
}

/* A fresh store on a 16 MiB image with generation 1 (seed 1) imported and
 * active; the writer stays open in f->st. */
static store_fx *store_new(void)
{
    store_fx *f = calloc(1, sizeof(*f));
    assert_non_null(f);
    tv_test_tmpdir(f->dir, sizeof f->dir, "model");
    snprintf(f->store, sizeof f->store, "%s/store", f->dir);
    snprintf(f->image, sizeof f->image, "%s/image", f->dir);
    snprintf(f->ck1, sizeof f->ck1, "%s/ck1.safetensors", f->dir);
    snprintf(f->ck2, sizeof f->ck2, "%s/ck2.safetensors", f->dir);
    f->src1 = make_file(1, &f->len1);
    f->src2 = make_file(2, &f->len2);
    tv_test_write_file(f->ck1, f->src1, f->len1);
    tv_test_write_file(f->ck2, f->src2, f->len2);
    tv_error err = {0};
    tv__store_init_opts o = {.image = f->image, .image_size_bytes = 16 * MiB};
    if (tv__store_init(f->store, &o, NULL, &err))
        fail_msg("store init: %s", err.msg);
    if (tv__store_open(f->store, TV__STORE_WRITE, &f->st, &err))
        fail_msg("store open: %s", err.msg);
    import_ck(f, f->ck1);
    tv__reg_object *objs = NULL;
    size_t n = 0;
    assert_int_equal(tv__reg_objects_list_committed(f->st->reg, 0, &objs, &n, &err), 0);
    assert_int_equal(n, 1);
    f->base1 = objs[0].base_off;
    assert_int_equal(f->base1 % (64 * KiB), 0);
    free(objs);
    return f;
}

static void store_free(store_fx *f)
{
    if (!f)
        return;
    tv__io_fault = NULL;
    tv__store_close(f->st);
    tv_test_rmtree(f->dir);
    free(f->src1);
    free(f->src2);
    free(f);
}

/* ---- fault hooks (called from pread workers concurrently) ------------------ */

static atomic_long g_reads;
static uint64_t g_fail_lo, g_fail_hi; /* device range whose reads fail */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t g_failed[256][2]; /* [off, end) of every failed read */
static size_t g_n_failed;

static void hook_count(uint32_t dev, uint64_t off, size_t len, int64_t *res)
{
    (void)dev, (void)off, (void)len, (void)res;
    atomic_fetch_add(&g_reads, 1);
}

static void hook_eio_all(uint32_t dev, uint64_t off, size_t len, int64_t *res)
{
    (void)dev, (void)off, (void)len;
    atomic_fetch_add(&g_reads, 1);
    *res = -EIO;
}

static void hook_short_all(uint32_t dev, uint64_t off, size_t len, int64_t *res)
{
    (void)dev, (void)off, (void)len;
    atomic_fetch_add(&g_reads, 1);
    if (*res > 0)
        *res -= 1;
}

static void hook_eio_range(uint32_t dev, uint64_t off, size_t len, int64_t *res)
{
    (void)dev;
    atomic_fetch_add(&g_reads, 1);
    if (off < g_fail_hi && g_fail_lo < off + len) {
        *res = -EIO;
        pthread_mutex_lock(&g_mu);
        assert_true(g_n_failed < 256);
        g_failed[g_n_failed][0] = off;
        g_failed[g_n_failed][1] = off + len;
        g_n_failed++;
        pthread_mutex_unlock(&g_mu);
    }
}

static void hooks_reset(void)
{
    tv__io_fault = NULL;
    atomic_store(&g_reads, 0);
    g_n_failed = 0;
}

/* ---- helpers ---------------------------------------------------------------- */

static store_fx *g_fx; /* the shared read-only store (group fixture) */
static int ENG_URING = TV_ENGINE_URING, ENG_PREAD = TV_ENGINE_PREAD;

static int open_m(const char *store, const char *spec, int engine, tv_model **m, tv_error *err)
{
    tv_open_opts o = {.engine = engine, .chunk_len = CHUNK, .queue_depth = 4};
    return tv_model_open(store, spec, &o, m, err);
}

/* Opens spec with engine or skips the test when io_uring is unavailable. */
static tv_model *open_ok(const char *store, const char *spec, int engine)
{
    tv_model *m = NULL;
    tv_error err = {0};
    int rc = open_m(store, spec, engine, &m, &err);
    if (rc == TV_E_NOT_SUPPORTED && engine == TV_ENGINE_URING) {
        printf("# io_uring unavailable here (%s): skipped\n", err.msg);
        skip();
    }
    if (rc)
        fail_msg("open %s: %s: %s", spec, tv_err_name(rc), err.msg);
    return m;
}

static int engine_of(void **state)
{
    return *(int *)*state;
}

/* A buffer of n payload bytes at offset mis (0..4095) after GUARD bytes of
 * pattern, with GUARD bytes of pattern after it. */
typedef struct gbuf {
    uint8_t *raw;
    uint8_t *p;
    size_t n;
    size_t raw_len;
} gbuf;

static gbuf gbuf_new(size_t n, size_t mis)
{
    gbuf g;
    g.n = n;
    g.raw_len = GUARD + mis + n + GUARD;
    assert_int_equal(posix_memalign((void **)&g.raw, ALIGN, g.raw_len + ALIGN), 0);
    memset(g.raw, PAT, g.raw_len + ALIGN);
    g.p = g.raw + GUARD + mis;
    return g;
}

/* Everything outside [p, p + n) still holds the pattern. */
static void gbuf_check(const gbuf *g, const char *what)
{
    for (uint8_t *q = g->raw; q < g->p; q++)
        if (*q != PAT)
            fail_msg("%s: guard byte %td before the destination changed", what, g->p - q);
    for (uint8_t *q = g->p + g->n; q < g->raw + g->raw_len + ALIGN; q++)
        if (*q != PAT)
            fail_msg("%s: guard byte %td after the destination changed", what, q - (g->p + g->n));
}

/* The whole buffer, destination included, still holds the pattern. */
static void gbuf_untouched(const gbuf *g, const char *what)
{
    for (size_t i = 0; i < g->raw_len + ALIGN; i++)
        if (g->raw[i] != PAT)
            fail_msg("%s: byte %zu written by a refused call", what, i);
}

static void gbuf_free(gbuf *g)
{
    free(g->raw);
    g->raw = NULL;
}

static const uint8_t *src_of(const uint8_t *src, int i)
{
    return src + file_off(i);
}

/* Reads every tensor with tv_read_into at misalignment mis and compares. */
static void read_all_into(tv_model *m, const uint8_t *src, size_t mis, const char *label)
{
    tv_error err = {0};
    for (int i = 0; i < N_T; i++) {
        gbuf g = gbuf_new(g_t[i].nbytes, mis);
        int rc = tv_read_into(m, g_t[i].name, g.p, g.n, &err);
        if (rc)
            fail_msg("%s: read_into %s (mis %zu): %s: %s", label, g_t[i].name, mis, tv_err_name(rc),
                     err.msg);
        if (memcmp(g.p, src_of(src, i), g.n))
            fail_msg("%s: %s (mis %zu): bytes differ", label, g_t[i].name, mis);
        gbuf_check(&g, g_t[i].name);
        gbuf_free(&g);
    }
}

/* ---- group fixture ------------------------------------------------------------ */

static int group_setup(void **state)
{
    (void)state;
    layout();
    assert_int_equal((DATA_BASE + g_t[T_ALIGNED].begin) % ALIGN, 0);
    assert_true(g_t[T_BIG].nbytes > 4 * CHUNK);
    g_fx = store_new();
    tv__store_close(g_fx->st); /* readers need no writer */
    g_fx->st = NULL;
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    store_free(g_fx);
    g_fx = NULL;
    return 0;
}

static int teardown_hooks(void **state)
{
    (void)state;
    hooks_reset();
    return 0;
}

/* ---- opening, names, iteration ---------------------------------------------------- */

static void test_open_and_describe(void **state)
{
    int eng = engine_of(state);
    tv_error err = {0};
    tv_model *m = open_ok(g_fx->store, MODEL, eng);
    tv_model *m1 = open_ok(g_fx->store, MODEL "@1", eng);
    assert_int_equal(tv_model_generation(m), 1);
    assert_int_equal(tv_model_generation(m1), 1);
    assert_string_equal(tv_model_name(m), MODEL);
    assert_string_equal(tv_model_name(m1), MODEL);
    assert_int_equal(tv_model_n_tensors(m), N_T);

    /* iteration in file order, with dtype, shape, sizes */
    tv_tensor_desc d;
    for (int i = 0; i < N_T; i++) {
        assert_int_equal(tv_model_tensor(m, (size_t)i, &d), 0);
        assert_int_equal(d.name_len, strlen(g_t[i].name));
        assert_memory_equal(d.name, g_t[i].name, d.name_len);
        assert_int_equal(d.dtype, g_t[i].dtype);
        assert_int_equal(d.rank, g_t[i].rank);
        for (uint32_t k = 0; k < d.rank; k++)
            assert_int_equal(d.shape[k], g_t[i].shape[k]);
        assert_int_equal(d.nbytes, g_t[i].nbytes);
        assert_int_equal(d.n_elements, g_t[i].n_elems);
        assert_int_equal(d.shard, 0);
        size_t idx = 999;
        assert_int_equal(tv_model_find(m, g_t[i].name, strlen(g_t[i].name), &idx), 0);
        assert_int_equal(idx, (size_t)i);
    }
    assert_int_equal(tv_model_tensor(m, N_T, &d), TV_E_INVALID_ARG);
    assert_int_equal(tv_model_tensor(m, 0, NULL), TV_E_INVALID_ARG);
    assert_int_equal(tv_model_tensor(NULL, 0, &d), TV_E_INVALID_ARG);
    size_t idx = 999;
    assert_int_equal(tv_model_find(m, "nope", 4, &idx), TV_E_NOT_FOUND);
    assert_int_equal(idx, 999);
    assert_int_equal(tv_model_find(m, "big.f32", 3, &idx), TV_E_NOT_FOUND); /* a prefix */
    assert_int_equal(tv_model_find(m, "big.f32x", 7, &idx), 0);             /* len counts */
    assert_int_equal(idx, T_BIG);
    assert_int_equal(tv_model_find(m, "", 0, &idx), TV_E_NOT_FOUND);
    assert_int_equal(tv_model_find(NULL, "big.f32", 7, &idx), TV_E_NOT_FOUND);
    assert_int_equal(tv_model_find(m, NULL, 0, &idx), TV_E_NOT_FOUND);

    /* unknown model / generation, bad specs */
    tv_model *x = (tv_model *)&err;
    assert_int_equal(open_m(g_fx->store, "acme/none", eng, &x, &err), TV_E_NOT_FOUND);
    assert_null(x);
    assert_int_equal(open_m(g_fx->store, MODEL "@2", eng, &x, &err), TV_E_NOT_FOUND);
    assert_int_equal(open_m(g_fx->store, MODEL "@99", eng, &x, &err), TV_E_NOT_FOUND);
    /* "@x" is an alias this model does not have */
    assert_int_equal(open_m(g_fx->store, MODEL "@x", eng, &x, &err), TV_E_NOT_FOUND);
    assert_null(x);
    static const char *const bad[] = {"",
                                      "@1",
                                      MODEL "@",
                                      MODEL "@0",
                                      MODEL "@-1",
                                      MODEL "@x y",
                                      MODEL "@1x",
                                      MODEL "@ 1",
                                      MODEL "@01",
                                      MODEL "@+1",
                                      MODEL "@1 ",
                                      MODEL "@_x",
                                      MODEL "@99999999999999999999"};
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        int rc = open_m(g_fx->store, bad[k], eng, &x, &err);
        if (rc != TV_E_INVALID_ARG)
            fail_msg("spec '%s': %s, want TV_E_INVALID_ARG", bad[k], tv_err_name(rc));
        assert_null(x);
    }
    assert_int_equal(open_m(g_fx->store, NULL, eng, &x, &err), TV_E_INVALID_ARG);
    assert_int_equal(open_m(NULL, MODEL, eng, &x, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv_model_open(g_fx->store, MODEL, NULL, NULL, &err), TV_E_INVALID_ARG);
    char nostore[300];
    snprintf(nostore, sizeof nostore, "%s/absent", g_fx->dir);
    assert_int_equal(open_m(nostore, MODEL, eng, &x, &err), TV_E_NOT_FOUND);
    /* opts NULL (defaults: auto engine, default chunk and depth) works too */
    assert_int_equal(tv_model_open(g_fx->store, MODEL, NULL, &x, &err), 0);
    read_all_into(x, g_fx->src1, 1, "default opts");
    tv_model_close(x);

    /* accessors and destructors are NULL-safe */
    assert_int_equal(tv_model_generation(NULL), 0);
    assert_null(tv_model_name(NULL));
    assert_int_equal(tv_model_n_tensors(NULL), 0);
    tv_model_close(NULL);
    tv_model_close(m1);
    tv_model_close(m);
}

/* ---- tv_read_into ------------------------------------------------------------------- */

static void test_read_into_every_tensor(void **state)
{
    tv_model *m = open_ok(g_fx->store, MODEL, engine_of(state));
    /* odd, 8-byte and 4 KiB aligned destinations: the last takes the
     * direct-read path for aligned.f32 */
    for (size_t mis = 0; mis < 8; mis++)
        read_all_into(m, g_fx->src1, mis, "into");
    read_all_into(m, g_fx->src1, 2048, "into");
    read_all_into(m, g_fx->src1, 4095, "into");
    tv_model_close(m);
}

static void test_read_into_refusals(void **state)
{
    tv_model *m = open_ok(g_fx->store, MODEL, engine_of(state));
    tv_error err = {0};
    for (int i = 0; i < N_T; i++) {
        if (!g_t[i].nbytes)
            continue;
        gbuf g = gbuf_new(g_t[i].nbytes, 1);
        int rc = tv_read_into(m, g_t[i].name, g.p, g.n - 1, &err);
        assert_int_equal(rc, TV_E_INVALID_ARG);
        assert_non_null(strstr(err.msg, g_t[i].name));
        gbuf_untouched(&g, g_t[i].name);
        assert_int_equal(tv_read_into(m, g_t[i].name, NULL, g.n, &err), TV_E_INVALID_ARG);
        assert_int_equal(tv_read_into(m, g_t[i].name, g.p, 0, &err), TV_E_INVALID_ARG);
        gbuf_untouched(&g, g_t[i].name);
        gbuf_free(&g);
    }
    uint8_t b[16];
    memset(b, PAT, sizeof b);
    assert_int_equal(tv_read_into(m, "no.such", b, sizeof b, &err), TV_E_NOT_FOUND);
    assert_non_null(strstr(err.msg, "no.such"));
    assert_int_equal(tv_read_into(m, NULL, b, sizeof b, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv_read_into(NULL, "odd.u8", b, sizeof b, &err), TV_E_INVALID_ARG);
    for (size_t k = 0; k < sizeof b; k++)
        assert_int_equal(b[k], PAT);
    /* a larger destination than needed: only nbytes are written */
    gbuf g = gbuf_new(g_t[T_ODD].nbytes + 100, 3);
    assert_int_equal(tv_read_into(m, "odd.u8", g.p, g.n, &err), 0);
    assert_memory_equal(g.p, src_of(g_fx->src1, T_ODD), 3);
    g.n = 3;
    gbuf_check(&g, "odd.u8 in a larger buffer");
    gbuf_free(&g);
    /* zero-size tensors read into a zero-length destination */
    uint8_t z = PAT;
    assert_int_equal(tv_read_into(m, "empty.f32", &z, 0, &err), 0);
    assert_int_equal(tv_read_into(m, "empty.u8", &z, 0, &err), 0);
    assert_int_equal(z, PAT);
    tv_model_close(m);
}

/* ---- tv_read_batch ---------------------------------------------------------------------- */

static void test_read_batch(void **state)
{
    tv_model *m = open_ok(g_fx->store, MODEL, engine_of(state));
    tv_error err = {0};
    gbuf g[N_T];
    tv_read_req r[N_T + 2];
    for (size_t mis = 0; mis < 3; mis++) {
        memset(r, 0, sizeof r);
        for (int i = 0; i < N_T; i++) {
            g[i] = gbuf_new(g_t[i].nbytes, mis == 2 ? 0 : 1 + 2 * (size_t)i * mis);
            /* half by name, half by index */
            if (i % 2)
                r[i].name = g_t[i].name;
            else
                r[i].index = (size_t)i;
            r[i].dest = g[i].p;
            r[i].dest_len = g[i].n;
            r[i].result = 12345;
        }
        int rc = tv_read_batch(m, r, N_T, &err);
        if (rc)
            fail_msg("batch: %s: %s", tv_err_name(rc), err.msg);
        for (int i = 0; i < N_T; i++) {
            assert_int_equal(r[i].result, 0);
            if (memcmp(g[i].p, src_of(g_fx->src1, i), g[i].n))
                fail_msg("batch: %s: bytes differ", g_t[i].name);
            gbuf_check(&g[i], g_t[i].name);
            gbuf_free(&g[i]);
        }
    }

    /* one request with a too-small destination, one unknown name, one bad
     * index: those fail, every other is read */
    memset(r, 0, sizeof r);
    for (int i = 0; i < N_T; i++) {
        g[i] = gbuf_new(g_t[i].nbytes, 5);
        r[i].name = g_t[i].name;
        r[i].dest = g[i].p;
        r[i].dest_len = g[i].n - (i == T_E4M3 ? 1 : 0);
    }
    r[N_T].name = "no.such";
    r[N_T].dest = g[0].p;
    r[N_T].dest_len = g[0].n;
    r[N_T + 1].index = 10000;
    r[N_T + 1].dest = g[0].p;
    r[N_T + 1].dest_len = g[0].n;
    memset(&err, 0, sizeof err);
    int rc = tv_read_batch(m, r, N_T + 2, &err);
    assert_int_equal(rc, TV_E_INVALID_ARG);
    assert_non_null(strstr(err.msg, "sp.e4m3"));
    assert_int_equal(r[N_T].result, TV_E_NOT_FOUND);
    assert_int_equal(r[N_T + 1].result, TV_E_INVALID_ARG);
    for (int i = 0; i < N_T; i++) {
        if (i == T_E4M3) {
            assert_int_equal(r[i].result, TV_E_INVALID_ARG);
            gbuf_untouched(&g[i], "refused request");
        } else {
            assert_int_equal(r[i].result, 0);
            assert_memory_equal(g[i].p, src_of(g_fx->src1, i), g[i].n);
            gbuf_check(&g[i], g_t[i].name);
        }
        gbuf_free(&g[i]);
    }

    /* the same tensor twice, and an empty batch */
    gbuf a = gbuf_new(g_t[T_BIG].nbytes, 1), b = gbuf_new(g_t[T_BIG].nbytes, 7);
    tv_read_req two[2] = {{.name = "big.f32", .dest = a.p, .dest_len = a.n},
                          {.index = T_BIG, .dest = b.p, .dest_len = b.n}};
    assert_int_equal(tv_read_batch(m, two, 2, &err), 0);
    assert_memory_equal(a.p, src_of(g_fx->src1, T_BIG), a.n);
    assert_memory_equal(b.p, src_of(g_fx->src1, T_BIG), b.n);
    gbuf_check(&a, "dup a");
    gbuf_check(&b, "dup b");
    gbuf_free(&a);
    gbuf_free(&b);
    assert_int_equal(tv_read_batch(m, NULL, 0, &err), 0);
    assert_int_equal(tv_read_batch(m, NULL, 1, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv_read_batch(NULL, two, 2, &err), TV_E_INVALID_ARG);
    tv_model_close(m);
}

/* ---- tv_get_tensor --------------------------------------------------------------------------- */

static void test_get_tensor(void **state)
{
    tv_model *m = open_ok(g_fx->store, MODEL, engine_of(state));
    tv_error err = {0};
    for (int i = 0; i < N_T; i++) {
        tv_tensor *t = NULL;
        int rc = tv_get_tensor(m, g_t[i].name, &t, &err);
        if (rc)
            fail_msg("get %s: %s: %s", g_t[i].name, tv_err_name(rc), err.msg);
        assert_int_equal(t->nbytes, g_t[i].nbytes);
        assert_int_equal(t->dtype, g_t[i].dtype);
        assert_int_equal(t->rank, g_t[i].rank);
        for (uint32_t k = 0; k < t->rank; k++)
            assert_int_equal(t->shape[k], g_t[i].shape[k]);
        if (t->nbytes) {
            assert_non_null(t->data);
            assert_memory_equal(t->data, src_of(g_fx->src1, i), t->nbytes);
            /* zero copy: the device's aligned envelope landed in an aligned
             * arena, so the payload sits at the device offset's alignment */
            assert_int_equal((uintptr_t)t->data % ALIGN, (g_fx->base1 + file_off(i)) % ALIGN);
        }
        tv_tensor_free(t);
    }
    tv_tensor *t = (tv_tensor *)&err;
    assert_int_equal(tv_get_tensor(m, "no.such", &t, &err), TV_E_NOT_FOUND);
    assert_null(t);
    assert_int_equal(tv_get_tensor(m, "odd.u8", NULL, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv_get_tensor(NULL, "odd.u8", &t, &err), TV_E_INVALID_ARG);
    tv_tensor_free(NULL);
    tv_model_close(m);
}

/* ---- tv_read_rows --------------------------------------------------------------------------- */

static void rows_ok(tv_model *m, int i, uint64_t r0, uint64_t r1, size_t mis)
{
    tv_error err = {0};
    uint64_t row_len = g_t[i].nbytes / g_t[i].shape[0];
    gbuf g = gbuf_new((size_t)((r1 - r0) * row_len), mis);
    int rc = tv_read_rows(m, g_t[i].name, r0, r1, g.p, g.n, &err);
    if (rc)
        fail_msg("rows %s [%llu, %llu): %s: %s", g_t[i].name, (unsigned long long)r0,
                 (unsigned long long)r1, tv_err_name(rc), err.msg);
    if (memcmp(g.p, src_of(g_fx->src1, i) + r0 * row_len, g.n))
        fail_msg("rows %s [%llu, %llu): bytes differ", g_t[i].name, (unsigned long long)r0,
                 (unsigned long long)r1);
    gbuf_check(&g, g_t[i].name);
    gbuf_free(&g);
}

static void rows_refused(tv_model *m, const char *name, uint64_t r0, uint64_t r1, size_t len,
                         int want)
{
    tv_error err = {0};
    gbuf g = gbuf_new(len, 1);
    int rc = tv_read_rows(m, name, r0, r1, g.p, g.n, &err);
    if (rc != want)
        fail_msg("rows %s [%llu, %llu): %s, want %s", name, (unsigned long long)r0,
                 (unsigned long long)r1, tv_err_name(rc), tv_err_name(want));
    gbuf_untouched(&g, name);
    gbuf_free(&g);
}

static void test_read_rows(void **state)
{
    tv_model *m = open_ok(g_fx->store, MODEL, engine_of(state));
    static const uint64_t big[][2] = {{0, 1},   {0, 100}, {99, 100}, {3, 50},   {16, 17},
                                      {15, 33}, {42, 42}, {0, 0},    {100, 100}};
    for (size_t k = 0; k < sizeof big / sizeof *big; k++)
        for (size_t mis = 0; mis < 3; mis++)
            rows_ok(m, T_BIG, big[k][0], big[k][1], mis * 3);
    static const uint64_t small[][2] = {{2, 7}, {8, 9}, {0, 9}, {9, 9}, {0, 1}};
    for (size_t k = 0; k < sizeof small / sizeof *small; k++)
        rows_ok(m, T_ROWS, small[k][0], small[k][1], 1);
    rows_ok(m, T_I16, 1, 3, 1);
    rows_ok(m, T_I16, 0, 3, 0);
    rows_ok(m, T_AFTER, 0, 4, 0);
    rows_ok(m, T_AFTER, 3, 4, 5);
    rows_ok(m, T_FIRST, 4, 5, 1);
    rows_ok(m, T_LAST, 12, 13, 1);
    rows_ok(m, T_ALIGNED, 0, 2048, 0);
    rows_ok(m, T_ALIGNED, 1024, 2048, 0); /* aligned rows into an aligned dest */
    /* zero-size tensor: shape [0, 4] has no rows; [0, 0) is fine */
    uint8_t z = PAT;
    tv_error err = {0};
    assert_int_equal(tv_read_rows(m, "empty.f32", 0, 0, &z, 0, &err), 0);
    assert_int_equal(z, PAT);

    rows_refused(m, "big.f32", 5, 2, 16000, TV_E_INVALID_ARG);    /* r0 > r1 */
    rows_refused(m, "big.f32", 0, 101, 404000, TV_E_INVALID_ARG); /* r1 > rows */
    rows_refused(m, "big.f32", 101, 101, 16, TV_E_INVALID_ARG);
    rows_refused(m, "big.f32", 0, 2, 7999, TV_E_INVALID_ARG); /* destination too small */
    rows_refused(m, "empty.f32", 0, 1, 16, TV_E_INVALID_ARG);
    rows_refused(m, "scalar.i32", 0, 1, 16, TV_E_INVALID_ARG); /* rank 0 */
    rows_refused(m, "scalar.i32", 0, 0, 16, TV_E_INVALID_ARG);
    rows_refused(m, "w.f4", 0, 1, 16, TV_E_ST_NOT_BYTE_ADDRESSABLE); /* 12-bit rows */
    rows_refused(m, "w.f4", 0, 2, 16, TV_E_ST_NOT_BYTE_ADDRESSABLE);
    rows_refused(m, "no.such", 0, 1, 16, TV_E_NOT_FOUND);
    assert_int_equal(tv_read_rows(m, "big.f32", 0, 1, NULL, 4000, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv_read_rows(NULL, "big.f32", 0, 1, &z, 1, &err), TV_E_INVALID_ARG);
    /* the F4 tensor as a whole is bytes */
    gbuf g = gbuf_new(3, 1);
    assert_int_equal(tv_read_into(m, "w.f4", g.p, 3, &err), 0);
    assert_memory_equal(g.p, src_of(g_fx->src1, T_F4), 3);
    gbuf_check(&g, "w.f4");
    gbuf_free(&g);
    tv_model_close(m);
}

/* ---- float32 conversion ---------------------------------------------------------------------- */

static void f32_expect(tv_model *m, int i, const uint32_t *want, size_t n)
{
    tv_error err = {0};
    assert_int_equal(g_t[i].n_elems, n);
    /* the destination need not be float-aligned */
    static const size_t mis[] = {0, 1, 4, 7};
    for (size_t a = 0; a < 4; a++) {
        gbuf g = gbuf_new(n * 4, mis[a]);
        int rc = tv_read_f32(m, g_t[i].name, g.p, g.n, &err);
        if (rc)
            fail_msg("f32 %s: %s: %s", g_t[i].name, tv_err_name(rc), err.msg);
        for (size_t k = 0; k < n; k++) {
            uint32_t got;
            memcpy(&got, g.p + 4 * k, 4);
            if (got != want[k])
                fail_msg("f32 %s[%zu] (mis %zu): 0x%08x, want 0x%08x", g_t[i].name, k, mis[a], got,
                         want[k]);
        }
        gbuf_check(&g, g_t[i].name);
        gbuf_free(&g);
    }
}

static void test_read_f32(void **state)
{
    tv_model *m = open_ok(g_fx->store, MODEL, engine_of(state));
    tv_error err = {0};
    f32_expect(m, T_BF16, SP_BF16_F32, 11);
    f32_expect(m, T_F16, SP_F16_F32, 12);
    f32_expect(m, T_E4M3, SP_E4M3_F32, 11);
    f32_expect(m, T_E5M2, SP_E5M2_F32, 13);
    f32_expect(m, T_E8M0, SP_E8M0_F32, 6);
    /* BF16 at an aligned begin with arbitrary bits: bits << 16 */
    uint32_t after[28];
    for (size_t k = 0; k < 28; k++) {
        const uint8_t *s = src_of(g_fx->src1, T_AFTER) + 2 * k;
        after[k] = (uint32_t)(s[0] | s[1] << 8) << 16;
    }
    f32_expect(m, T_AFTER, after, 28);
    /* F32 copies, big ones across chunks too */
    static const int f32s[] = {T_FIRST, T_BIG, T_ALIGNED};
    for (size_t k = 0; k < 3; k++) {
        int i = f32s[k];
        gbuf g = gbuf_new(g_t[i].nbytes, 4);
        assert_int_equal(tv_read_f32(m, g_t[i].name, g.p, g.n, &err), 0);
        assert_memory_equal(g.p, src_of(g_fx->src1, i), g.n);
        gbuf_check(&g, g_t[i].name);
        gbuf_free(&g);
    }
    float f = 0;
    assert_int_equal(tv_read_f32(m, "empty.f32", &f, 0, &err), 0);
    /* unsupported dtypes and refusals write nothing */
    static const int unsup[] = {T_I32, T_SCALAR, T_ODD, T_F4, T_F64, T_I16};
    for (size_t k = 0; k < sizeof unsup / sizeof *unsup; k++) {
        int i = unsup[k];
        gbuf g = gbuf_new(g_t[i].n_elems * 4 + 64, 4);
        int rc = tv_read_f32(m, g_t[i].name, g.p, g.n, &err);
        if (rc != TV_E_NOT_SUPPORTED)
            fail_msg("f32 %s: %s, want TV_E_NOT_SUPPORTED", g_t[i].name, tv_err_name(rc));
        assert_non_null(strstr(err.msg, g_t[i].name));
        gbuf_untouched(&g, g_t[i].name);
        gbuf_free(&g);
    }
    gbuf g = gbuf_new(11 * 4, 4);
    assert_int_equal(tv_read_f32(m, "sp.bf16", g.p, 11 * 4 - 1, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv_read_f32(m, "sp.bf16", g.p, 11 * 2, &err),
                     TV_E_INVALID_ARG); /* big enough for the raw bytes, not the floats */
    assert_int_equal(tv_read_f32(m, "sp.bf16", NULL, 44, &err), TV_E_INVALID_ARG);
    gbuf_untouched(&g, "f32 refused");
    gbuf_free(&g);
    assert_int_equal(tv_read_f32(m, "no.such", &f, 4, &err), TV_E_NOT_FOUND);
    tv_model_close(m);
}

static void convert_expect(tv_dtype dt, const void *src, const uint32_t *want, size_t n)
{
    /* into an aligned and an odd destination: bytes around stay untouched */
    for (size_t mis = 0; mis < 2; mis++) {
        uint8_t out[1 + 16 * 4];
        memset(out, PAT, sizeof out);
        assert_int_equal(tv_convert_f32(dt, src, n, out + mis), 0);
        for (size_t k = 0; k < n; k++) {
            uint32_t got;
            memcpy(&got, out + mis + 4 * k, 4);
            if (got != want[k])
                fail_msg("convert %s[%zu] (mis %zu): 0x%08x, want 0x%08x", tv_dtype_name(dt), k,
                         mis, got, want[k]);
        }
        for (size_t k = 0; k < sizeof out; k++)
            if (k < mis || k >= mis + 4 * n)
                assert_int_equal(out[k], PAT);
    }
}

static void test_convert_f32(void **state)
{
    (void)state;
    uint8_t le[32];
    for (size_t k = 0; k < 11; k++)
        le[2 * k] = (uint8_t)SP_BF16[k], le[2 * k + 1] = (uint8_t)(SP_BF16[k] >> 8);
    convert_expect(TV_DTYPE_BF16, le, SP_BF16_F32, 11);
    for (size_t k = 0; k < 12; k++)
        le[2 * k] = (uint8_t)SP_F16[k], le[2 * k + 1] = (uint8_t)(SP_F16[k] >> 8);
    convert_expect(TV_DTYPE_F16, le, SP_F16_F32, 12);
    convert_expect(TV_DTYPE_F8_E4M3, SP_E4M3, SP_E4M3_F32, 11);
    convert_expect(TV_DTYPE_F8_E5M2, SP_E5M2, SP_E5M2_F32, 13);
    convert_expect(TV_DTYPE_F8_E8M0, SP_E8M0, SP_E8M0_F32, 6);
    convert_expect(TV_DTYPE_F32, SP_BF16_F32, SP_BF16_F32, 11);
    /* the source is read as little-endian bytes: an odd address is fine */
    uint8_t odd[1 + 24];
    memcpy(odd + 1, le, 24);
    convert_expect(TV_DTYPE_F16, odd + 1, SP_F16_F32, 12);
    /* every 8-bit NaN, whatever its payload, is sign | 0x7fc00000 */
    for (unsigned b = 0; b < 256; b++) {
        uint8_t v = (uint8_t)b;
        float o;
        uint32_t u;
        assert_int_equal(tv_convert_f32(TV_DTYPE_F8_E5M2, &v, 1, &o), 0);
        memcpy(&u, &o, 4);
        if ((b & 0x7f) > 0x7c)
            assert_int_equal(u, (b & 0x80 ? 0x80000000u : 0) | 0x7fc00000u);
        assert_int_equal(tv_convert_f32(TV_DTYPE_F8_E4M3, &v, 1, &o), 0);
        memcpy(&u, &o, 4);
        if ((b & 0x7f) == 0x7f)
            assert_int_equal(u, (b & 0x80 ? 0x80000000u : 0) | 0x7fc00000u);
        else
            assert_true((u & 0x7f800000u) != 0x7f800000u); /* no inf, no other NaN */
    }
    float o[2] = {1, 2};
    assert_int_equal(tv_convert_f32(TV_DTYPE_BF16, le, 0, o), 0);
    assert_true(o[0] == 1 && o[1] == 2);
    static const tv_dtype unsup[] = {TV_DTYPE_I32,  TV_DTYPE_U8,          TV_DTYPE_F64,
                                     TV_DTYPE_F4,   TV_DTYPE_F8_E4M3FNUZ, TV_DTYPE_BOOL,
                                     TV_DTYPE_COUNT};
    for (size_t k = 0; k < sizeof unsup / sizeof *unsup; k++)
        assert_int_equal(tv_convert_f32(unsup[k], le, 1, o), TV_E_NOT_SUPPORTED);
    assert_true(o[0] == 1 && o[1] == 2);
}

/* ---- device faults ------------------------------------------------------------------------- */

static uint64_t phys(int i)
{
    return g_fx->base1 + file_off(i);
}

static bool overlaps_failed(int i)
{
    uint64_t lo = phys(i), hi = lo + g_t[i].nbytes;
    for (size_t k = 0; k < g_n_failed; k++)
        if (lo < g_failed[k][1] && g_failed[k][0] < hi)
            return true;
    return false;
}

/* Fails every read that overlaps [lo, hi) of the device and reads all
 * tensors in one batch (aligned destinations when mis is 0): exactly the
 * non-empty requests whose bytes overlap a failed read fail with -EIO. */
static void batch_with_eio_range(tv_model *m, uint64_t lo, uint64_t hi, int target, size_t mis)
{
    tv_error err = {0};
    gbuf g[N_T];
    tv_read_req r[N_T];
    memset(r, 0, sizeof r);
    for (int i = 0; i < N_T; i++) {
        g[i] = gbuf_new(g_t[i].nbytes, mis);
        r[i] = (tv_read_req){.name = g_t[i].name, .dest = g[i].p, .dest_len = g[i].n};
    }
    hooks_reset();
    g_fail_lo = lo;
    g_fail_hi = hi;
    tv__io_fault = hook_eio_range;
    int rc = tv_read_batch(m, r, N_T, &err);
    tv__io_fault = NULL;
    assert_int_equal(rc, -EIO);
    assert_true(g_n_failed > 0);
    size_t n_failed = 0, n_ok = 0;
    for (int i = 0; i < N_T; i++) {
        if (g_t[i].nbytes && overlaps_failed(i)) {
            if (r[i].result != -EIO)
                fail_msg("%s overlaps a failed read but got %s", g_t[i].name,
                         tv_err_name(r[i].result));
            n_failed++;
        } else {
            if (r[i].result != 0)
                fail_msg("%s overlaps no failed read but got %s", g_t[i].name,
                         tv_err_name(r[i].result));
            if (memcmp(g[i].p, src_of(g_fx->src1, i), g[i].n))
                fail_msg("%s: bytes differ beside a failed read", g_t[i].name);
            n_ok++;
        }
        gbuf_check(&g[i], g_t[i].name); /* a failed read still writes only its range */
        gbuf_free(&g[i]);
    }
    assert_int_equal(r[target].result, -EIO);
    assert_true(n_failed >= 1 && n_ok >= 5);
}

static void test_faults(void **state)
{
    tv_model *m = open_ok(g_fx->store, MODEL, engine_of(state));
    tv_error err = {0};
    gbuf g = gbuf_new(g_t[T_BIG].nbytes, 1);

    /* EIO on every read: every non-empty read fails, whatever API */
    hooks_reset();
    tv__io_fault = hook_eio_all;
    for (int i = 0; i < N_T; i++) {
        int rc = tv_read_into(m, g_t[i].name, g.p, g_t[i].nbytes, &err);
        if (rc != (g_t[i].nbytes ? -EIO : 0))
            fail_msg("EIO: read_into %s: %s", g_t[i].name, tv_err_name(rc));
        if (rc)
            assert_non_null(strstr(err.msg, g_t[i].name));
    }
    tv_tensor *t = (tv_tensor *)&err;
    assert_int_equal(tv_get_tensor(m, "big.f32", &t, &err), -EIO);
    assert_null(t);
    assert_int_equal(tv_read_rows(m, "big.f32", 3, 9, g.p, g.n, &err), -EIO);
    float f[16];
    assert_int_equal(tv_read_f32(m, "sp.bf16", f, sizeof f, &err), -EIO);
    tv_read_req r[N_T];
    gbuf b[N_T];
    for (int i = 0; i < N_T; i++) {
        b[i] = gbuf_new(g_t[i].nbytes, 3);
        r[i] = (tv_read_req){.name = g_t[i].name, .dest = b[i].p, .dest_len = b[i].n};
    }
    assert_int_equal(tv_read_batch(m, r, N_T, &err), -EIO);
    for (int i = 0; i < N_T; i++)
        assert_int_equal(r[i].result, g_t[i].nbytes ? -EIO : 0);
    assert_true(atomic_load(&g_reads) > 0);

    /* short reads, always: never success, TV_E_SHORT_IO */
    hooks_reset();
    tv__io_fault = hook_short_all;
    for (int i = 0; i < N_T; i++) {
        int rc = tv_read_into(m, g_t[i].name, g.p, g_t[i].nbytes, &err);
        if (rc != (g_t[i].nbytes ? TV_E_SHORT_IO : 0))
            fail_msg("short: read_into %s: %s", g_t[i].name, tv_err_name(rc));
    }
    assert_int_equal(tv_read_batch(m, r, N_T, &err), TV_E_SHORT_IO);
    for (int i = 0; i < N_T; i++) {
        assert_int_equal(r[i].result, g_t[i].nbytes ? TV_E_SHORT_IO : 0);
        gbuf_check(&b[i], g_t[i].name);
    }
    assert_int_equal(tv_get_tensor(m, "odd.u8", &t, &err), TV_E_SHORT_IO);
    assert_null(t);
    hooks_reset();

    /* the handle is still good afterwards */
    read_all_into(m, g_fx->src1, 1, "after faults");

    /* EIO only where one tensor's bytes are: exactly the requests that
     * share a failed read fail */
    batch_with_eio_range(m, phys(T_E4M3), phys(T_E4M3) + g_t[T_E4M3].nbytes, T_E4M3, 1);
    batch_with_eio_range(m, phys(T_ALIGNED), phys(T_ALIGNED) + g_t[T_ALIGNED].nbytes, T_ALIGNED, 0);
    batch_with_eio_range(m, phys(T_ALIGNED), phys(T_ALIGNED) + g_t[T_ALIGNED].nbytes, T_ALIGNED, 1);
    uint64_t mid = phys(T_BIG) + 200000;
    batch_with_eio_range(m, mid, mid + 1, T_BIG, 1);
    batch_with_eio_range(m, phys(T_LAST), phys(T_LAST) + 1, T_LAST, 1);
    read_all_into(m, g_fx->src1, 0, "after targeted faults");

    for (int i = 0; i < N_T; i++)
        gbuf_free(&b[i]);
    gbuf_free(&g);
    tv_model_close(m);
}

/* ---- per-test stores: corruption, resized device, leases ------------------------------------ */

typedef struct tfx {
    int engine;
    store_fx *f;
} tfx;

static int setup_store(void **state)
{
    tfx *x = calloc(1, sizeof(*x));
    assert_non_null(x);
    x->engine = *(int *)*state;
    x->f = store_new();
    *state = x;
    return 0;
}

static int teardown_store(void **state)
{
    tfx *x = *state;
    hooks_reset();
    store_free(x->f);
    free(x);
    return 0;
}

static uint8_t *read_whole(const char *path, size_t *len)
{
    struct stat sb;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    assert_true(fd >= 0);
    assert_int_equal(fstat(fd, &sb), 0);
    uint8_t *b = malloc((size_t)sb.st_size);
    assert_non_null(b);
    assert_int_equal(pread(fd, b, (size_t)sb.st_size, 0), sb.st_size);
    close(fd);
    *len = (size_t)sb.st_size;
    return b;
}

static void test_corrupt_snapshot(void **state)
{
    tfx *x = *state;
    tv_error err = {0};
    char path[TV__SNAPFILE_PATH_MAX];
    assert_int_equal(tv__snapfile_path(x->f->store, MODEL, 1, path, sizeof path, &err), 0);
    size_t len;
    uint8_t *img = read_whole(path, &len);
    tv__snap s;
    assert_int_equal(tv__snap_open(img, len, TV__SNAP_VERIFY_CHECKSUM, &s, &err), 0);
    assert_true(s.tensors_off + 8 < len);

    /* the in-memory image opens and reads; truncated ones are refused */
    tv_open_opts o = {.engine = x->engine, .chunk_len = CHUNK, .queue_depth = 4};
    tv_model *m = NULL;
    int rc = tv_model_open_snapshot(img, len, &o, &m, &err);
    if (rc == TV_E_NOT_SUPPORTED)
        skip();
    assert_int_equal(rc, 0);
    assert_int_equal(tv_model_generation(m), 1);
    assert_string_equal(tv_model_name(m), MODEL);
    read_all_into(m, x->f->src1, 1, "from snapshot");
    tv_model_close(m);
    hooks_reset();
    tv__io_fault = hook_count;
    static const size_t cut[] = {0, 1, 100, TV__SNAP_HEADER_LEN, 0x1000, 1};
    for (size_t k = 0; k < sizeof cut / sizeof *cut; k++) {
        size_t l = k == sizeof cut / sizeof *cut - 1 ? len - 1 : (cut[k] < len ? cut[k] : len / 2);
        m = (tv_model *)&err;
        rc = tv_model_open_snapshot(img, l, &o, &m, &err);
        if (rc != TV_E_SNAPSHOT)
            fail_msg("snapshot cut to %zu bytes: %s", l, tv_err_name(rc));
        assert_null(m);
    }
    assert_int_equal(tv_model_open_snapshot(NULL, len, &o, &m, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv_model_open_snapshot(img, len, &o, NULL, &err), TV_E_INVALID_ARG);
    /* a flipped byte in memory */
    img[s.tensors_off + 5] ^= 0x40;
    assert_int_equal(tv_model_open_snapshot(img, len, &o, &m, &err), TV_E_SNAPSHOT);
    img[s.tensors_off + 5] ^= 0x40;

    /* a flipped byte in the tensor section of the file on disk */
    int fd = open(path, O_RDWR | O_CLOEXEC);
    assert_true(fd >= 0);
    uint8_t byte = img[s.tensors_off + 5] ^ 0x40;
    assert_int_equal(pwrite(fd, &byte, 1, (off_t)(s.tensors_off + 5)), 1);
    close(fd);
    rc = open_m(x->f->store, MODEL, x->engine, &m, &err);
    if (rc != TV_E_SNAPSHOT)
        fail_msg("corrupt snapshot file: %s: %s", tv_err_name(rc), err.msg);
    assert_null(m);
    assert_int_equal(open_m(x->f->store, MODEL "@1", x->engine, &m, &err), TV_E_SNAPSHOT);
    assert_int_equal(atomic_load(&g_reads), 0);
    free(img);
}

static void test_device_changed(void **state)
{
    tfx *x = *state;
    tv_error err = {0};
    tv_model *m = open_ok(x->f->store, MODEL, x->engine);
    tv_model_close(m);
    struct stat sb;
    assert_int_equal(stat(x->f->image, &sb), 0);
    assert_int_equal(truncate(x->f->image, sb.st_size + 4096), 0);
    hooks_reset();
    tv__io_fault = hook_count;
    m = (tv_model *)&err;
    int rc = open_m(x->f->store, MODEL, x->engine, &m, &err);
    if (rc != TV_E_DEVICE_MISMATCH)
        fail_msg("resized device: %s: %s", tv_err_name(rc), err.msg);
    assert_null(m);
    assert_int_equal(open_m(x->f->store, MODEL "@1", x->engine, &m, &err), TV_E_DEVICE_MISMATCH);
    assert_int_equal(atomic_load(&g_reads), 0);
    /* back to its size: accepted again */
    assert_int_equal(truncate(x->f->image, sb.st_size), 0);
    m = open_ok(x->f->store, MODEL, x->engine);
    read_all_into(m, x->f->src1, 1, "restored device");
    tv_model_close(m);
}

/* gc as `tensorvault gc` does it: snapshots first, then unleased objects.
 * Returns the number of objects freed; *n_kept those a lease kept. */
static size_t gc(store_fx *f, size_t *n_kept)
{
    tv_error err = {0};
    tv__reg_object *o = NULL;
    size_t n = 0, freed = 0;
    assert_int_equal(tv__reg_objects_unreferenced(f->st->reg, &o, &n, &err), 0);
    bool *keep = calloc(n ? n : 1, sizeof(*keep));
    assert_non_null(keep);
    int rc = tv__store_gc_snapshots(f->st, o, n, keep, &err);
    if (rc)
        fail_msg("gc snapshots: %s", err.msg);
    *n_kept = 0;
    for (size_t i = 0; i < n; i++) {
        if (keep[i]) {
            (*n_kept)++;
            continue;
        }
        rc = tv__reg_object_delete(f->st->reg, o[i].id, &err);
        if (rc)
            fail_msg("gc delete: %s", err.msg);
        freed++;
    }
    free(keep);
    free(o);
    return freed;
}

static void test_lease_keeps_retired_generation(void **state)
{
    tfx *x = *state;
    store_fx *f = x->f;
    tv_error err = {0};
    size_t kept;
    tv_model *m1 = open_ok(f->store, MODEL "@1", x->engine);

    import_ck(f, f->ck2); /* generation 2, activated */
    assert_int_equal(tv__reg_generation_retire(f->st->reg, MODEL, 1, &err), 0);
    tv_model *m2 = open_ok(f->store, MODEL, x->engine);
    assert_int_equal(tv_model_generation(m2), 2);
    read_all_into(m2, f->src2, 1, "generation 2");

    /* gc while generation 1 is leased: nothing freed, its snapshot stays */
    assert_int_equal(gc(f, &kept), 0);
    assert_int_equal(kept, 1);
    bool exists = false;
    assert_int_equal(tv__snapfile_exists(f->store, MODEL, 1, &exists, &err), 0);
    assert_true(exists);
    assert_int_equal(tv_model_generation(m1), 1);
    read_all_into(m1, f->src1, 1, "leased generation 1");
    tv_model *again = open_ok(f->store, MODEL "@1", x->engine); /* still openable */
    tv_model_close(again);

    /* released: gc frees generation 1's object and its snapshot */
    tv_model_close(m1);
    assert_int_equal(gc(f, &kept), 1);
    assert_int_equal(kept, 0);
    assert_int_equal(tv__snapfile_exists(f->store, MODEL, 1, &exists, &err), 0);
    assert_false(exists);
    tv_model *m = (tv_model *)&err;
    assert_int_equal(open_m(f->store, MODEL "@1", x->engine, &m, &err), TV_E_NOT_FOUND);
    assert_null(m);
    /* generation 2 is untouched, in the open handle and a new one */
    read_all_into(m2, f->src2, 0, "generation 2 after gc");
    tv_model_close(m2);
    m2 = open_ok(f->store, MODEL, x->engine);
    assert_int_equal(tv_model_generation(m2), 2);
    read_all_into(m2, f->src2, 3, "generation 2 reopened");
    tv_model_close(m2);
    assert_int_equal(gc(f, &kept), 0);
}

/* A snapshot copied or renamed to another generation's or model's path is
 * refused at open (its header names the model and generation it belongs
 * to), before any device read. */
static void copy_file(const char *from, const char *to)
{
    size_t len;
    uint8_t *b = read_whole(from, &len);
    unlink(to);
    tv_test_write_file(to, b, len);
    free(b);
}

static void test_swapped_snapshot(void **state)
{
    tfx *x = *state;
    store_fx *f = x->f;
    tv_error err = {0};
    char p1[TV__SNAPFILE_PATH_MAX], p2[TV__SNAPFILE_PATH_MAX], po[TV__SNAPFILE_PATH_MAX];
    import_ck(f, f->ck2); /* generation 2, active */
    assert_int_equal(tv__snapfile_path(f->store, MODEL, 1, p1, sizeof p1, &err), 0);
    assert_int_equal(tv__snapfile_path(f->store, MODEL, 2, p2, sizeof p2, &err), 0);
    copy_file(p1, p2);
    hooks_reset();
    tv__io_fault = hook_count;
    tv_model *m = (tv_model *)&err;
    assert_int_equal(open_m(f->store, MODEL "@2", x->engine, &m, &err), TV_E_SNAPSHOT_IDENTITY);
    assert_null(m);
    assert_non_null(strstr(err.msg, "generation 1, not model '" MODEL "' generation 2"));
    m = (tv_model *)&err;
    assert_int_equal(open_m(f->store, MODEL, x->engine, &m, &err), TV_E_SNAPSHOT_IDENTITY);
    assert_null(m);
    /* another model's path */
    assert_int_equal(tv__snapfile_write(f->store, "other", 1, "x", 1, &err), 0);
    assert_int_equal(tv__snapfile_path(f->store, "other", 1, po, sizeof po, &err), 0);
    copy_file(p1, po);
    assert_int_equal(tv__snapfile_write_active(f->store, "other", 1, &err), 0);
    m = (tv_model *)&err;
    assert_int_equal(open_m(f->store, "other", x->engine, &m, &err), TV_E_SNAPSHOT_IDENTITY);
    assert_null(m);
    assert_non_null(strstr(err.msg, "not model 'other' generation 1"));
    assert_int_equal(atomic_load(&g_reads), 0);
    /* the right file still opens */
    m = open_ok(f->store, MODEL "@1", x->engine);
    assert_int_equal(tv_model_generation(m), 1);
    tv_model_close(m);
}

/* Through the public API: a FIFO in place of the active pointer or of a
 * snapshot file is refused without blocking. */
static void test_unsafe_snapshot_files(void **state)
{
    tfx *x = *state;
    store_fx *f = x->f;
    tv_error err = {0};
    char p[TV__SNAPFILE_PATH_MAX];
    alarm(10);
    assert_int_equal(tv__snapfile_path(f->store, MODEL, 7, p, sizeof p, &err), 0);
    assert_int_equal(mkfifo(p, 0600), 0);
    tv_model *m = (tv_model *)&err;
    assert_int_equal(open_m(f->store, MODEL "@7", x->engine, &m, &err), TV_E_SNAPSHOT);
    assert_null(m);
    assert_int_equal(unlink(p), 0);
    assert_int_equal(tv__snapfile_active_path(f->store, MODEL, p, sizeof p, &err), 0);
    assert_int_equal(unlink(p), 0);
    assert_int_equal(symlink("1.tvsnap", p), 0);
    m = (tv_model *)&err;
    assert_int_equal(open_m(f->store, MODEL, x->engine, &m, &err), TV_E_SNAPSHOT);
    assert_null(m);
    alarm(0);
}

/* ---- CUDA where there is no GPU ------------------------------------------------------------ */

static void test_cuda_absent(void **state)
{
    tv_model *m = open_ok(g_fx->store, MODEL, engine_of(state));
    tv_error err = {0};
    uint8_t host[64];
    memset(host, PAT, sizeof host);
    /* With a GPU, a host pointer is not device memory; without one (or in
     * a build without CUDA) every CUDA call is TV_E_NOT_SUPPORTED. */
    bool gpu = tv_cuda_available();
    int want = gpu ? TV_E_INVALID_ARG : TV_E_NOT_SUPPORTED;
    if (gpu)
        printf("# a CUDA device is present: checking host-pointer refusal only\n");
    int rc = tv_read_into_cuda(m, "odd.u8", host, sizeof host, NULL, &err);
    if (rc != want)
        fail_msg("read_into_cuda: %s (%s), want %s", tv_err_name(rc), err.msg, tv_err_name(want));
    assert_true(strlen(err.msg) > 0);
    if (!gpu) {
        assert_true(strstr(err.msg, "CUDA") != NULL);
        printf("# no CUDA: \"%s\"\n", err.msg);
    }
    tv_read_req r[3] = {{.name = "odd.u8", .dest = host, .dest_len = 3},
                        {.index = T_LAST, .dest = host + 8, .dest_len = 13},
                        {.name = "empty.u8", .dest = NULL, .dest_len = 0}};
    memset(&err, 0, sizeof err);
    assert_int_equal(tv_read_batch_cuda(m, r, 3, NULL, &err), want);
    assert_true(strlen(err.msg) > 0);
    memset(&err, 0, sizeof err);
    rc = tv_read_batch_cuda(m, NULL, 0, NULL, &err);
    assert_int_equal(rc, gpu ? 0 : TV_E_NOT_SUPPORTED);
    assert_int_equal(tv_read_into_cuda(NULL, "odd.u8", host, 3, NULL, &err),
                     gpu ? TV_E_INVALID_ARG : TV_E_INVALID_ARG);
    assert_int_equal(tv_read_batch_cuda(NULL, r, 3, NULL, &err), TV_E_INVALID_ARG);
    for (size_t k = 0; k < sizeof host; k++)
        assert_int_equal(host[k], PAT);
    /* host reads are unaffected by the failed CUDA calls */
    read_all_into(m, g_fx->src1, 1, "after CUDA refusal");
    tv_model_close(m);
}

/* ---- replica failover: excluded devices --------------------------------------------------------
 */

#define N_REP 3

/* A store of N_REP file images with generation 1 (seed 1) replicated on
 * every one of them; the writer stays open in f->st. */
typedef struct rep_fx {
    store_fx f;
    char img[N_REP][256];
    char other[256]; /* a second store, whose label is copied by foreign_label */
    int engine;
} rep_fx;

static void rep_store(rep_fx *x)
{
    store_fx *f = &x->f;
    tv_test_tmpdir(f->dir, sizeof f->dir, "rep");
    snprintf(f->store, sizeof f->store, "%s/store", f->dir);
    snprintf(f->ck1, sizeof f->ck1, "%s/ck1.safetensors", f->dir);
    snprintf(x->other, sizeof x->other, "%s/other", f->dir);
    f->src1 = make_file(1, &f->len1);
    tv_test_write_file(f->ck1, f->src1, f->len1);
    tv_error err = {0};
    int64_t ids[N_REP];
    for (int i = 0; i < N_REP; i++) {
        snprintf(x->img[i], sizeof x->img[i], "%s/image%d", f->dir, i);
        tv__store_init_opts o = {.image = x->img[i], .image_size_bytes = 16 * MiB};
        if (tv__store_init(f->store, &o, &ids[i], &err))
            fail_msg("store init %s: %s", x->img[i], err.msg);
    }
    if (tv__store_open(f->store, TV__STORE_WRITE, &f->st, &err))
        fail_msg("store open: %s", err.msg);
    tv__import_opts io = {.activate = true, .strict = true, .devices = ids, .n_devices = N_REP};
    if (tv__import(f->st, MODEL, f->ck1, &io, NULL, &err))
        fail_msg("replicated import: %s", err.msg);
}

static int setup_rep(void **state)
{
    rep_fx *x = calloc(1, sizeof(*x));
    assert_non_null(x);
    x->engine = *(int *)*state;
    rep_store(x);
    *state = x;
    return 0;
}

static int teardown_rep(void **state)
{
    rep_fx *x = *state;
    hooks_reset();
    tv__sys_reset();
    tv__store_close(x->f.st);
    tv_test_rmtree(x->f.dir);
    free(x->f.src1);
    free(x);
    return 0;
}

/* Reads per engine device index (tv__io_fault: both engines), and preads
 * through tv__sys on the file at g_spy_path (the pread engine and labels). */
static atomic_long g_dev_reads[8];
static atomic_long g_spy_preads;
static char g_spy_path[PATH_MAX];

static void hook_dev_count(uint32_t dev, uint64_t off, size_t len, int64_t *res)
{
    (void)off, (void)len, (void)res;
    if (dev < 8)
        atomic_fetch_add(&g_dev_reads[dev], 1);
}

static ssize_t pread_spy(int fd, void *buf, size_t len, off_t off)
{
    char link[64], target[PATH_MAX];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, target, sizeof target - 1);
    if (n > 0) {
        target[n] = '\0';
        if (!strcmp(target, g_spy_path))
            atomic_fetch_add(&g_spy_preads, 1);
    }
    return pread(fd, buf, len, off);
}

static void counters_reset(void)
{
    for (int i = 0; i < 8; i++)
        atomic_store(&g_dev_reads[i], 0);
    atomic_store(&g_spy_preads, 0);
}

enum damage { D_DELETE, D_GROW, D_SHRINK, D_ZERO_LABEL, D_FOREIGN_LABEL };

static void write_at(const char *path, const void *b, size_t n, off_t off)
{
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, b, n, off), (ssize_t)n);
    assert_int_equal(fsync(fd), 0);
    close(fd);
}

#define LABEL_OFF (1 * MiB) /* the default region start: the label block */

static void damage(rep_fx *x, int i, enum damage how)
{
    const char *p = x->img[i];
    uint8_t blk[4096];
    switch (how) {
    case D_DELETE:
        assert_int_equal(unlink(p), 0);
        break;
    case D_GROW:
        assert_int_equal(truncate(p, 16 * MiB + 4096), 0);
        break;
    case D_SHRINK:
        assert_int_equal(truncate(p, 8 * MiB), 0);
        break;
    case D_ZERO_LABEL:
        memset(blk, 0, sizeof blk);
        write_at(p, blk, 512, LABEL_OFF);
        break;
    case D_FOREIGN_LABEL: {
        /* A valid label of another store (another uuid), same geometry. */
        char img[300], st[300];
        tv_error err = {0};
        snprintf(st, sizeof st, "%s/store", x->other);
        snprintf(img, sizeof img, "%s.img", x->other);
        assert_int_equal(mkdir(x->other, 0700), 0);
        tv__store_init_opts o = {.image = img, .image_size_bytes = 16 * MiB};
        if (tv__store_init(st, &o, NULL, &err))
            fail_msg("other store: %s", err.msg);
        int fd = open(img, O_RDONLY | O_CLOEXEC);
        assert_true(fd >= 0);
        assert_int_equal(pread(fd, blk, sizeof blk, LABEL_OFF), (ssize_t)sizeof blk);
        close(fd);
        write_at(p, blk, sizeof blk, LABEL_OFF);
        break;
    }
    }
}

static int dev_index(tv_model *m, const char *path)
{
    tv_device_status ds;
    for (size_t i = 0; i < tv_model_n_devices(m); i++) {
        assert_int_equal(tv_model_device(m, i, &ds), 0);
        if (!strcmp(ds.path, path))
            return (int)i;
    }
    fail_msg("no device %s in the model", path);
    return -1;
}

/* Runs fn with stderr captured into a buffer (the library's log lines). */
static char g_log[8192];

static void log_begin(int *saved, FILE **f)
{
    fflush(stderr);
    *f = tmpfile();
    assert_non_null(*f);
    *saved = dup(2);
    assert_true(*saved >= 0);
    assert_true(dup2(fileno(*f), 2) >= 0);
}

static void log_end(int saved, FILE *f)
{
    fflush(stderr);
    assert_true(dup2(saved, 2) >= 0);
    close(saved);
    rewind(f);
    size_t n = fread(g_log, 1, sizeof g_log - 1, f);
    g_log[n] = '\0';
    fclose(f);
}

/* Every read API on the whole model, compared with the source. */
static void read_everything(tv_model *m, const uint8_t *src, const char *label)
{
    tv_error err = {0};
    read_all_into(m, src, 1, label);
    read_all_into(m, src, 0, label);
    tv_read_req r[N_T];
    gbuf b[N_T];
    for (int i = 0; i < N_T; i++) {
        b[i] = gbuf_new(g_t[i].nbytes, (size_t)i % 3);
        r[i] = (tv_read_req){.name = g_t[i].name, .dest = b[i].p, .dest_len = b[i].n};
    }
    if (tv_read_batch(m, r, N_T, &err))
        fail_msg("%s: batch: %s", label, err.msg);
    for (int i = 0; i < N_T; i++) {
        assert_int_equal(r[i].result, 0);
        if (memcmp(b[i].p, src_of(src, i), b[i].n))
            fail_msg("%s: batch %s: bytes differ", label, g_t[i].name);
        gbuf_check(&b[i], g_t[i].name);
        gbuf_free(&b[i]);
    }
    tv_tensor *t = NULL;
    if (tv_get_tensor(m, "big.f32", &t, &err))
        fail_msg("%s: get_tensor: %s", label, err.msg);
    assert_memory_equal(t->data, src_of(src, T_BIG), g_t[T_BIG].nbytes);
    tv_tensor_free(t);
    gbuf g = gbuf_new(4000 * 7, 1);
    assert_int_equal(tv_read_rows(m, "big.f32", 13, 20, g.p, g.n, &err), 0);
    assert_memory_equal(g.p, src_of(src, T_BIG) + 13 * 4000, g.n);
    gbuf_free(&g);
}

/* One device damaged: the open succeeds, reports it excluded with the
 * reason, logs it, and every tensor reads identical without one read of
 * the damaged device (neither through the engine nor a pread syscall). */
static void failover_case(rep_fx *x, int bad, enum damage how, int want_reason,
                          const char *want_msg)
{
    tv_error err = {0};
    tv_model *m = NULL;
    assert_non_null(realpath(x->img[bad], g_spy_path));
    damage(x, bad, how);
    counters_reset();
    tv__io_fault = hook_dev_count;
    tv__sys.pread = pread_spy;
    int saved;
    FILE *lf;
    log_begin(&saved, &lf);
    int rc = open_m(x->f.store, MODEL, x->engine, &m, &err);
    log_end(saved, lf);
    if (rc == TV_E_NOT_SUPPORTED && x->engine == TV_ENGINE_URING) {
        printf("# io_uring unavailable here (%s): skipped\n", err.msg);
        skip();
    }
    if (rc)
        fail_msg("open with device %d damaged (%d): %s: %s", bad, how, tv_err_name(rc), err.msg);
    assert_int_equal(tv_model_n_devices(m), N_REP);
    assert_int_equal(tv_model_n_excluded_devices(m), 1);
    tv_device_status ds;
    for (int i = 0; i < N_REP; i++) {
        int k = dev_index(m, x->img[i]);
        assert_int_equal(tv_model_device(m, (size_t)k, &ds), 0);
        if (i != bad) {
            assert_false(ds.excluded);
            assert_int_equal(ds.reason, 0);
            assert_string_equal(ds.message, "");
            continue;
        }
        assert_true(ds.excluded);
        if (ds.reason != want_reason)
            fail_msg("device %s: reason %s (%s), want %s", ds.path, tv_err_name(ds.reason),
                     ds.message, tv_err_name(want_reason));
        assert_non_null(strstr(ds.message, x->img[bad]));
        if (!strstr(ds.message, want_msg))
            fail_msg("reason \"%s\" lacks \"%s\"", ds.message, want_msg);
    }
    assert_int_equal(tv_model_device(m, N_REP, &ds), TV_E_INVALID_ARG);
    if (!strstr(g_log, "excluded") || !strstr(g_log, x->img[bad]) ||
        !strstr(g_log, tv_err_name(want_reason)))
        fail_msg("no warning naming the excluded device in the log: \"%s\"", g_log);
    int kbad = dev_index(m, x->img[bad]);
    counters_reset(); /* the label check of open may read it; nothing after */
    read_everything(m, x->f.src1, "one device excluded");
    assert_int_equal(atomic_load(&g_dev_reads[kbad]), 0);
    assert_int_equal(atomic_load(&g_spy_preads), 0);
    long others = 0;
    for (int i = 0; i < N_REP; i++)
        others += atomic_load(&g_dev_reads[i]);
    assert_true(others > 0);
    tv_model_close(m);
    tv__sys_reset();
}

static void test_failover_missing_device(void **state)
{
    rep_fx *x = *state;
    failover_case(x, 0, D_DELETE, -ENOENT, "No such file");
}

static void test_failover_grown_device(void **state)
{
    rep_fx *x = *state;
    failover_case(x, 1, D_GROW, TV_E_DEVICE_MISMATCH, "resized");
}

static void test_failover_shrunk_device(void **state)
{
    rep_fx *x = *state;
    failover_case(x, 2, D_SHRINK, TV_E_DEVICE_MISMATCH, "resized");
}

static void test_failover_label_overwritten(void **state)
{
    rep_fx *x = *state;
    failover_case(x, 1, D_ZERO_LABEL, TV_E_DEVICE_MISMATCH, "magic");
}

static void test_failover_foreign_label(void **state)
{
    rep_fx *x = *state;
    failover_case(x, 0, D_FOREIGN_LABEL, TV_E_DEVICE_MISMATCH, "store uuid");
}

/* ---- reader/serve.h: what the fast-path server sees of an open model ------ */

/* One device excluded (resized): the accessors give the validated snapshot
 * view, the exact image (the snapshot file's bytes, checksum valid) and each
 * device's read-only descriptor as validated, the excluded one as fd -1 with
 * its reason. */
static void test_serve_accessors(void **state)
{
    rep_fx *x = *state;
    tv_error err = {0};
    tv_model *m = NULL;
    damage(x, 1, D_GROW);
    int saved;
    FILE *lf;
    log_begin(&saved, &lf);
    int rc = open_m(x->f.store, MODEL, x->engine, &m, &err);
    log_end(saved, lf);
    if (rc == TV_E_NOT_SUPPORTED && x->engine == TV_ENGINE_URING)
        skip();
    if (rc)
        fail_msg("open: %s: %s", tv_err_name(rc), err.msg);
    const tv__snap *s = tv__model_snap(m);
    assert_non_null(s);
    assert_int_equal(s->generation, tv_model_generation(m));
    assert_int_equal(s->n_devices, N_REP);
    assert_int_equal(s->n_tensors, tv_model_n_tensors(m));
    const void *img = NULL;
    size_t len = 0;
    assert_int_equal(tv__model_snap_image(m, &img, &len), 0);
    assert_ptr_equal(img, s->base);
    assert_int_equal(len, s->len);
    char path[TV__SNAPFILE_PATH_MAX];
    assert_int_equal(
        tv__snapfile_path(x->f.store, MODEL, tv_model_generation(m), path, sizeof path, &err), 0);
    size_t flen = 0;
    uint8_t *file = tv_test_read_file(path, &flen);
    assert_non_null(file);
    assert_int_equal(flen, len);
    assert_memory_equal(file, img, len);
    free(file);
    tv__snap s2;
    assert_int_equal(tv__snap_open(img, len, TV__SNAP_VERIFY_CHECKSUM, &s2, &err), 0);
    const char *nm;
    size_t nl;
    assert_int_equal(tv__snap_model(&s2, &nm, &nl, &err), 0);
    assert_int_equal(nl, strlen(MODEL));
    assert_memory_equal(nm, MODEL, nl);

    tv__model_dev d;
    for (int i = 0; i < N_REP; i++) {
        int k = dev_index(m, x->img[i]);
        memset(&d, 0x5A, sizeof d);
        assert_int_equal(tv__model_dev_info(m, (uint32_t)k, &d), 0);
        if (i == 1) {
            assert_int_equal(d.fd, -1);
            assert_int_equal(d.reason, TV_E_DEVICE_MISMATCH);
            continue;
        }
        assert_int_equal(d.reason, 0);
        assert_true(d.fd >= 0);
        assert_true(d.io_align >= 4096 && d.io_align % 4096 == 0);
        struct stat sb;
        assert_int_equal(stat(x->img[i], &sb), 0);
        assert_int_equal(d.size_bytes, (uint64_t)sb.st_size);
        int fl = fcntl(d.fd, F_GETFL);
        assert_true(fl >= 0);
        assert_int_equal(fl & O_ACCMODE, O_RDONLY);
        assert_int_equal(!!(fl & O_DIRECT), d.direct);
        struct stat fsb;
        assert_int_equal(fstat(d.fd, &fsb), 0);
        assert_int_equal(fsb.st_ino, sb.st_ino);
    }
    assert_int_equal(tv__model_dev_info(m, N_REP, &d), TV_E_INVALID_ARG);
    assert_int_equal(tv__model_dev_info(m, 0, NULL), TV_E_INVALID_ARG);
    assert_int_equal(tv__model_dev_info(NULL, 0, &d), TV_E_INVALID_ARG);
    assert_int_equal(tv__model_snap_image(NULL, &img, &len), TV_E_INVALID_ARG);
    assert_int_equal(tv__model_snap_image(m, NULL, &len), TV_E_INVALID_ARG);
    assert_int_equal(tv__model_snap_image(m, &img, NULL), TV_E_INVALID_ARG);
    assert_null(tv__model_snap(NULL));
    tv_model_close(m);
}

/* Every replica damaged: the open fails, naming every device and reason. */
static void test_failover_all_devices_bad(void **state)
{
    rep_fx *x = *state;
    tv_error err = {0};
    tv_model *m = (tv_model *)&err;
    damage(x, 0, D_ZERO_LABEL);
    damage(x, 1, D_DELETE);
    damage(x, 2, D_FOREIGN_LABEL);
    counters_reset();
    tv__io_fault = hook_dev_count;
    int rc = open_m(x->f.store, MODEL, x->engine, &m, &err);
    if (rc == TV_E_NOT_SUPPORTED && x->engine == TV_ENGINE_URING)
        skip();
    if (rc != TV_E_DEVICE_MISMATCH)
        fail_msg("all devices bad: %s: %s", tv_err_name(rc), err.msg);
    assert_null(m);
    for (int i = 0; i < N_REP; i++)
        if (!strstr(err.msg, x->img[i]))
            fail_msg("error \"%s\" does not name %s", err.msg, x->img[i]);
    assert_non_null(strstr(err.msg, "No such file"));
    assert_non_null(strstr(err.msg, "store uuid"));
    for (int i = 0; i < 8; i++)
        assert_int_equal(atomic_load(&g_dev_reads[i]), 0);
}

/* A snapshot of the replicated generation in which the second half of the
 * tensors belongs to a second shard ("b.safetensors": the same object) whose
 * only replica is on device `only` (engine index); the rest stays on all. */
static void *split_snapshot(store_fx *f, uint32_t only, size_t *len)
{
    tv_error err = {0};
    void *buf = NULL;
    size_t blen = 0;
    tv__snap s;
    if (tv__store_build_snapshot(f->st, MODEL, 0, &buf, &blen, &err) ||
        tv__snap_open(buf, blen, TV__SNAP_VERIFY_CHECKSUM, &s, &err))
        fail_msg("snapshot: %s", err.msg);
    assert_int_equal(s.n_shards, 1);
    tv__snap_device_in dev[N_REP];
    tv__snap_replica_in rep[N_REP], one;
    tv__snap_shard_in sh[2];
    tv__snap_tensor_in t[N_T];
    uint64_t shape[N_T][4];
    assert_int_equal(s.n_devices, N_REP);
    for (uint32_t i = 0; i < N_REP; i++) {
        tv__snap_device_info d;
        assert_int_equal(tv__snap_device(&s, i, &d, &err), 0);
        dev[i] = (tv__snap_device_in){.path = d.path,
                                      .kind = d.kind,
                                      .lba_size = d.lba_size,
                                      .io_align = d.io_align,
                                      .object_align = d.object_align,
                                      .size_bytes = d.size_bytes,
                                      .region_off = d.region_off,
                                      .region_len = d.region_len,
                                      .data_off = d.data_off,
                                      .nsid = d.nsid};
        memcpy(dev[i].uuid, d.uuid, 16);
        memcpy(dev[i].serial, d.serial, sizeof d.serial);
        memcpy(dev[i].model, d.model, sizeof d.model);
        memcpy(dev[i].nguid, d.nguid, 16);
        memcpy(dev[i].eui64, d.eui64, 8);
    }
    tv__snap_shard_info si;
    assert_int_equal(tv__snap_shard(&s, 0, &si, &err), 0);
    assert_int_equal(si.n_replicas, N_REP);
    bool found = false;
    for (uint32_t r = 0; r < N_REP; r++) {
        tv__snap_replica_info ri;
        assert_int_equal(tv__snap_replica(&s, si.first_replica + r, &ri, &err), 0);
        rep[r] = (tv__snap_replica_in){.device = ri.device,
                                       .object_id = ri.object_id,
                                       .base_off = ri.base_off,
                                       .alloc_len = ri.alloc_len};
        if (ri.device == only) {
            one = rep[r];
            found = true;
        }
    }
    assert_true(found);
    sh[0] = (tv__snap_shard_in){.name = "a.safetensors",
                                .file_len = si.file_len,
                                .header_len = si.header_len,
                                .n_replicas = N_REP,
                                .replicas = rep};
    memcpy(sh[0].sha256, si.sha256, 32);
    sh[1] = sh[0];
    sh[1].name = "b.safetensors";
    sh[1].n_replicas = 1;
    sh[1].replicas = &one;
    assert_int_equal(s.n_tensors, N_T);
    for (uint32_t i = 0; i < N_T; i++) {
        tv__snap_tensor_info ti;
        assert_int_equal(tv__snap_tensor(&s, i, &ti, &err), 0);
        for (uint32_t d = 0; d < ti.rank; d++)
            shape[i][d] = tv__snap_dim(&ti, d);
        t[i] = (tv__snap_tensor_in){.name = ti.name,
                                    .name_len = ti.name_len,
                                    .dtype = ti.dtype,
                                    .rank = ti.rank,
                                    .shape = shape[i],
                                    .shard = i < N_T / 2 ? 0 : 1,
                                    .begin_off = ti.begin_off,
                                    .end_off = ti.end_off};
    }
    tv__snap_in in = {.model = MODEL,
                      .generation = s.generation,
                      .n_devices = N_REP,
                      .devices = dev,
                      .n_shards = 2,
                      .shards = sh,
                      .n_tensors = N_T,
                      .tensors = t,
                      .hash_seed = 7};
    void *out = NULL;
    if (tv__snap_build(&in, &out, len, &err))
        fail_msg("split snapshot: %s", err.msg);
    free(buf);
    return out;
}

/* Opens split_snapshot(bad) after zeroing image 1's label (bad: its engine
 * index): the second shard's only replica is then excluded. */
static tv_model *open_split_damaged(rep_fx *x, int bad)
{
    tv_error err = {0};
    tv_model *m = NULL;
    size_t len = 0;
    void *img = split_snapshot(&x->f, (uint32_t)bad, &len);
    damage(x, 1, D_ZERO_LABEL);
    tv_open_opts o = {.engine = x->engine, .chunk_len = CHUNK, .queue_depth = 4};
    int rc = tv_model_open_snapshot(img, len, &o, &m, &err);
    free(img);
    if (rc)
        fail_msg("open split snapshot: %s: %s", tv_err_name(rc), err.msg);
    return m;
}

/* A shard whose only replica is on the damaged device: its tensors fail
 * with TV_E_NO_REPLICA naming the shard and the device's reason, writing
 * nothing; every other tensor reads identical; the bad device gets no read. */
static void test_failover_shard_without_valid_replica(void **state)
{
    rep_fx *x = *state;
    tv_error err = {0};
    /* the engine index of image 1, from a handle on the intact store */
    tv_model *probe = open_ok(x->f.store, MODEL, x->engine);
    int bad = dev_index(probe, x->img[1]);
    tv_model_close(probe);
    tv_model *m = open_split_damaged(x, bad);
    assert_int_equal(tv_model_n_excluded_devices(m), 1);
    counters_reset();
    tv__io_fault = hook_dev_count;
    size_t n_ok = 0, n_refused = 0;
    tv_read_req r[N_T];
    gbuf b[N_T];
    for (int i = 0; i < N_T; i++) {
        size_t idx;
        tv_tensor_desc d;
        assert_int_equal(tv_model_find(m, g_t[i].name, strlen(g_t[i].name), &idx), 0);
        assert_int_equal(tv_model_tensor(m, idx, &d), 0);
        gbuf g = gbuf_new(g_t[i].nbytes, 1);
        int rc = tv_read_into(m, g_t[i].name, g.p, g.n, &err);
        if (d.shard == 0) {
            if (rc)
                fail_msg("%s (shard a): %s: %s", g_t[i].name, tv_err_name(rc), err.msg);
            assert_memory_equal(g.p, src_of(x->f.src1, i), g.n);
            gbuf_check(&g, g_t[i].name);
            n_ok++;
        } else {
            if (rc != TV_E_NO_REPLICA)
                fail_msg("%s (shard b): %s, want TV_E_NO_REPLICA", g_t[i].name, tv_err_name(rc));
            if (!strstr(err.msg, "b.safetensors") || !strstr(err.msg, x->img[1]) ||
                !strstr(err.msg, "magic") || !strstr(err.msg, g_t[i].name))
                fail_msg("error \"%s\" does not name the shard, tensor and reason", err.msg);
            gbuf_untouched(&g, g_t[i].name);
            tv_tensor *t = (tv_tensor *)&err;
            assert_int_equal(tv_get_tensor(m, g_t[i].name, &t, &err), TV_E_NO_REPLICA);
            assert_null(t);
            n_refused++;
        }
        gbuf_free(&g);
        b[i] = gbuf_new(g_t[i].nbytes, 0);
        r[i] = (tv_read_req){.name = g_t[i].name, .dest = b[i].p, .dest_len = b[i].n};
        r[i].result = d.shard; /* remembered until the batch overwrites it */
    }
    assert_true(n_ok > 3 && n_refused > 3);
    int shard_of[N_T];
    for (int i = 0; i < N_T; i++)
        shard_of[i] = r[i].result;
    assert_int_equal(tv_read_batch(m, r, N_T, &err), TV_E_NO_REPLICA);
    for (int i = 0; i < N_T; i++) {
        if (shard_of[i] == 0) {
            assert_int_equal(r[i].result, 0);
            assert_memory_equal(b[i].p, src_of(x->f.src1, i), b[i].n);
            gbuf_check(&b[i], g_t[i].name);
        } else {
            assert_int_equal(r[i].result, TV_E_NO_REPLICA);
            gbuf_untouched(&b[i], g_t[i].name);
        }
        gbuf_free(&b[i]);
    }
    assert_int_equal(atomic_load(&g_dev_reads[bad]), 0);
    tv_model_close(m);
}

/* ---- read options: bounded before anything is opened ------------------------------------------
 */

static atomic_long g_sys_calls;

static ssize_t pread_counted(int fd, void *buf, size_t len, off_t off)
{
    atomic_fetch_add(&g_sys_calls, 1);
    return pread(fd, buf, len, off);
}

static int open_counted(const char *path, int flags, mode_t mode)
{
    atomic_fetch_add(&g_sys_calls, 1);
    return open(path, flags, mode);
}

/* Refused options: the named error, no handle, no file opened or read. */
static void opts_refused(int engine, uint32_t qd, uint64_t chunk, const char *needle)
{
    tv_error err = {0};
    tv_model *m = (tv_model *)&err;
    tv_open_opts o = {.engine = engine, .queue_depth = qd, .chunk_len = (size_t)chunk};
    atomic_store(&g_sys_calls, 0);
    tv__sys.pread = pread_counted;
    tv__sys.open = open_counted;
    int rc = tv_model_open(g_fx->store, MODEL, &o, &m, &err);
    tv__sys_reset();
    if (rc != TV_E_INVALID_ARG)
        fail_msg("qd %u chunk %llu: %s (%s), want TV_E_INVALID_ARG", qd, (unsigned long long)chunk,
                 tv_err_name(rc), err.msg);
    assert_null(m);
    if (!strstr(err.msg, needle))
        fail_msg("qd %u chunk %llu: \"%s\" lacks \"%s\"", qd, (unsigned long long)chunk, err.msg,
                 needle);
    assert_int_equal(atomic_load(&g_sys_calls), 0);
    m = (tv_model *)&err;
    rc = tv_model_open_snapshot("x", 1, &o, &m, &err);
    assert_int_equal(rc, TV_E_INVALID_ARG);
    assert_null(m);
}

static void opts_ok(int engine, uint32_t qd, uint64_t chunk, bool read)
{
    tv_error err = {0};
    tv_model *m = NULL;
    tv_open_opts o = {.engine = engine, .queue_depth = qd, .chunk_len = (size_t)chunk};
    int rc = tv_model_open(g_fx->store, MODEL, &o, &m, &err);
    if (rc == TV_E_NOT_SUPPORTED && engine == TV_ENGINE_URING)
        skip();
    if (rc)
        fail_msg("qd %u chunk %llu: %s: %s", qd, (unsigned long long)chunk, tv_err_name(rc),
                 err.msg);
    if (read)
        read_all_into(m, g_fx->src1, 1, "bounded options");
    tv_model_close(m);
}

static void test_read_options_bounded(void **state)
{
    int eng = engine_of(state);
    char s[64];
    /* chunk: 0 (default), 1, io_align - 1, io_align, unaligned: rounded up */
    opts_ok(eng, 4, 0, true);
    opts_ok(eng, 4, 1, true);
    opts_ok(eng, 4, ALIGN - 1, true);
    opts_ok(eng, 4, ALIGN + 1, true);
    opts_ok(eng, 1, 1, true);
    /* the caps themselves (staging allocated on the first read: not read) */
    opts_ok(eng, 1, TV_READ_MAX_CHUNK, false);
    opts_ok(eng, 4, TV_READ_MAX_STAGING / 4, false);
    opts_ok(eng, TV_READ_MAX_QUEUE_DEPTH, 0, false); /* default chunk lowered to fit */
    opts_ok(eng, TV_READ_MAX_QUEUE_DEPTH, TV_READ_MAX_STAGING / TV_READ_MAX_QUEUE_DEPTH, false);
    /* over the caps, and values near 2^62 and 2^64 */
    snprintf(s, sizeof s, "%llu", (unsigned long long)TV_READ_MAX_CHUNK);
    opts_refused(eng, 1, TV_READ_MAX_CHUNK + 1, "over the maximum");
    opts_refused(eng, 1, 1ull << 62, "4611686018427387904");
    opts_refused(eng, 1, 1ull << 63, "9223372036854775808");
    opts_refused(eng, 1, UINT64_MAX, "18446744073709551615");
    opts_refused(eng, 1, UINT64_MAX - ALIGN + 2, s);    /* rounding up would wrap */
    opts_refused(eng, 0, TV_READ_MAX_CHUNK, "staging"); /* 32 x 1 GiB */
    opts_refused(eng, 4, TV_READ_MAX_STAGING / 4 + 1, "staging");
    opts_refused(eng, 2, TV_READ_MAX_STAGING / 2 + ALIGN, "staging");
    opts_refused(eng, TV_READ_MAX_QUEUE_DEPTH, 1 * MiB, "staging");
    /* queue depth: over the io_uring limit and huge */
    opts_refused(eng, TV_READ_MAX_QUEUE_DEPTH + 1, 0, "queue depth 4097");
    opts_refused(eng, UINT32_MAX, 0, "queue depth 4294967295");
    opts_refused(eng, UINT32_MAX, ALIGN, "queue depth");
    opts_refused(7, 1, 0, "unknown engine 7");
    /* n_threads over the queue depth is capped, not refused */
    tv_error err = {0};
    tv_model *m = NULL;
    tv_open_opts o = {.engine = eng, .queue_depth = 2, .n_threads = UINT32_MAX};
    int rc = tv_model_open(g_fx->store, MODEL, &o, &m, &err);
    if (rc == TV_E_NOT_SUPPORTED && eng == TV_ENGINE_URING)
        skip();
    assert_int_equal(rc, 0);
    read_all_into(m, g_fx->src1, 0, "n_threads capped");
    tv_model_close(m);
}

/* Row ranges: every check before any allocation or read, at and past the
 * ends, with values whose products overflow. */
static void test_rows_bounds(void **state)
{
    tv_model *m = open_ok(g_fx->store, MODEL, engine_of(state));
    tv_error err = {0};
    uint64_t len = 77;
    assert_int_equal(tv_rows_len(m, "big.f32", 0, 100, &len, &err), 0);
    assert_int_equal(len, 400000);
    assert_int_equal(tv_rows_len(m, "big.f32", 100, 100, &len, &err), 0);
    assert_int_equal(len, 0);
    assert_int_equal(tv_rows_len(m, "big.f32", 99, 100, &len, &err), 0);
    assert_int_equal(len, 4000);
    assert_int_equal(tv_rows_len(m, "empty.f32", 0, 0, &len, &err), 0);
    assert_int_equal(len, 0);
    static const uint64_t bad[][2] = {{0, 101},
                                      {100, 101},
                                      {101, 101},
                                      {5, 4},
                                      {0, 1ull << 62},
                                      {1ull << 62, 1ull << 62},
                                      {0, 1ull << 63},
                                      {0, UINT64_MAX},
                                      {UINT64_MAX, UINT64_MAX},
                                      {UINT64_MAX / 4000 + 1, UINT64_MAX / 4000 + 2}};
    atomic_store(&g_reads, 0);
    tv__io_fault = hook_count;
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        len = 77;
        int rc = tv_rows_len(m, "big.f32", bad[k][0], bad[k][1], &len, &err);
        if (rc != TV_E_INVALID_ARG)
            fail_msg("rows_len [%llu, %llu): %s", (unsigned long long)bad[k][0],
                     (unsigned long long)bad[k][1], tv_err_name(rc));
        assert_int_equal(len, 0);
        assert_non_null(strstr(err.msg, "big.f32"));
        rows_refused(m, "big.f32", bad[k][0], bad[k][1], 16, TV_E_INVALID_ARG);
        /* even with a destination that claims to be huge: nothing is read */
        gbuf g = gbuf_new(16, 0);
        assert_int_equal(tv_read_rows(m, "big.f32", bad[k][0], bad[k][1], g.p, SIZE_MAX, &err),
                         TV_E_INVALID_ARG);
        gbuf_untouched(&g, "huge dest_len");
        gbuf_free(&g);
    }
    assert_int_equal(atomic_load(&g_reads), 0);
    assert_int_equal(tv_rows_len(m, "scalar.i32", 0, 0, &len, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv_rows_len(m, "w.f4", 0, 1, &len, &err), TV_E_ST_NOT_BYTE_ADDRESSABLE);
    assert_int_equal(tv_rows_len(m, "no.such", 0, 1, &len, &err), TV_E_NOT_FOUND);
    assert_int_equal(tv_rows_len(m, "big.f32", 0, 1, NULL, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv_rows_len(NULL, "big.f32", 0, 1, &len, &err), TV_E_INVALID_ARG);
    tv__io_fault = NULL;
    /* float32 conversion: element counts whose byte size overflows */
    float o[2] = {1, 2};
    assert_int_equal(tv_convert_f32(TV_DTYPE_BF16, o, SIZE_MAX / 2, o), TV_E_OVERFLOW);
    assert_int_equal(tv_convert_f32(TV_DTYPE_F32, o, (SIZE_MAX / 4) + 1, o), TV_E_OVERFLOW);
    assert_int_equal(tv_convert_f32(TV_DTYPE_F16, NULL, 1, o), TV_E_INVALID_ARG);
    assert_int_equal(tv_convert_f32(TV_DTYPE_F16, o, 1, NULL), TV_E_INVALID_ARG);
    assert_true(o[0] == 1 && o[1] == 2);
    tv_model_close(m);
}

/* ---- byte ranges (tv_read_range) --------------------------------------------------------------
 */

static uint64_t g_lo_read, g_hi_read; /* device bytes read: [lo, hi) */

static void hook_span(uint32_t dev, uint64_t off, size_t len, int64_t *res)
{
    (void)dev, (void)res;
    pthread_mutex_lock(&g_mu);
    if (off < g_lo_read)
        g_lo_read = off;
    if (off + len > g_hi_read)
        g_hi_read = off + len;
    pthread_mutex_unlock(&g_mu);
    atomic_fetch_add(&g_reads, 1);
}

/* Reads [off, off + len) of tensor i at misalignment mis, compares with the
 * source and checks that only the envelope of those bytes was read. */
static void range_ok(tv_model *m, int i, uint64_t off, uint64_t len, size_t mis)
{
    tv_error err = {0};
    gbuf g = gbuf_new((size_t)len, mis);
    g_lo_read = UINT64_MAX;
    g_hi_read = 0;
    atomic_store(&g_reads, 0);
    tv__io_fault = hook_span;
    int rc = tv_read_range(m, g_t[i].name, off, len, g.p, g.n, &err);
    tv__io_fault = NULL;
    if (rc)
        fail_msg("range %s [%llu, +%llu): %s: %s", g_t[i].name, (unsigned long long)off,
                 (unsigned long long)len, tv_err_name(rc), err.msg);
    if (memcmp(g.p, src_of(g_fx->src1, i) + off, g.n))
        fail_msg("range %s [%llu, +%llu): bytes differ", g_t[i].name, (unsigned long long)off,
                 (unsigned long long)len);
    gbuf_check(&g, g_t[i].name);
    gbuf_free(&g);
    if (len == 0) {
        assert_int_equal(atomic_load(&g_reads), 0);
        return;
    }
    uint64_t lo = phys(i) + off, hi = lo + len;
    uint64_t env_lo = lo / ALIGN * ALIGN, env_hi = (hi + ALIGN - 1) / ALIGN * ALIGN;
    if (g_lo_read < env_lo || g_hi_read > env_hi)
        fail_msg("range %s [%llu, +%llu): read [%llu, %llu), outside the envelope [%llu, %llu)",
                 g_t[i].name, (unsigned long long)off, (unsigned long long)len,
                 (unsigned long long)g_lo_read, (unsigned long long)g_hi_read,
                 (unsigned long long)env_lo, (unsigned long long)env_hi);
}

static void test_read_range(void **state)
{
    tv_model *m = open_ok(g_fx->store, MODEL, engine_of(state));
    uint64_t big = g_t[T_BIG].nbytes;
    const uint64_t cases[][2] = {
        {0, 1},       {1, 1},    {3, 5},        {0, big},     {big - 1, 1},
        {7, 4096},    {4095, 2}, {1000, 70000}, {big - 3, 3}, {12345, 3 * CHUNK + 17},
        {big / 2, 1}, {0, 0},    {big, 0},      {17, 0},
    };
    for (size_t k = 0; k < TV_ARRAY_LEN(cases); k++)
        for (size_t mis = 0; mis < 3; mis++)
            range_ok(m, T_BIG, cases[k][0], cases[k][1], mis * 5);
    range_ok(m, T_ODD, 0, g_t[T_ODD].nbytes, 1);
    range_ok(m, T_ODD, 2, g_t[T_ODD].nbytes - 3, 0);
    range_ok(m, T_ALIGNED, 0, 4096, 0);
    range_ok(m, T_ALIGNED, 4096, 4096, 0);
    range_ok(m, T_LAST, g_t[T_LAST].nbytes - 1, 1, 3);
    range_ok(m, T_F4, 1, 2, 1); /* bytes of a sub-byte dtype are fine */
    range_ok(m, T_SCALAR, 0, g_t[T_SCALAR].nbytes, 2);
    /* zero-size tensor: only [0, 0) */
    tv_error err = {0};
    assert_int_equal(tv_read_range(m, "empty.f32", 0, 0, NULL, 0, &err), 0);
    /* refusals write nothing */
    static const struct {
        const char *name;
        uint64_t off, len;
        size_t dest;
        int want;
    } bad[] = {
        {"big.f32", 0, 1, 0, TV_E_INVALID_ARG},           /* destination too small */
        {"big.f32", 10, 100, 99, TV_E_INVALID_ARG},       /* destination too small */
        {"big.f32", 1, UINT64_MAX, 16, TV_E_INVALID_ARG}, /* overflows */
        {"big.f32", UINT64_MAX, 1, 16, TV_E_INVALID_ARG}, /* overflows */
        {"empty.f32", 0, 1, 16, TV_E_INVALID_ARG},        /* past the end */
        {"no.such", 0, 1, 16, TV_E_NOT_FOUND},
    };
    for (size_t k = 0; k < TV_ARRAY_LEN(bad); k++) {
        gbuf g = gbuf_new(bad[k].dest, 1);
        int rc = tv_read_range(m, bad[k].name, bad[k].off, bad[k].len, g.p, g.n, &err);
        if (rc != bad[k].want)
            fail_msg("range %s [%llu, +%llu): %s, want %s", bad[k].name,
                     (unsigned long long)bad[k].off, (unsigned long long)bad[k].len,
                     tv_err_name(rc), tv_err_name(bad[k].want));
        gbuf_untouched(&g, bad[k].name);
        gbuf_free(&g);
    }
    /* past the end by one byte, and starting past the end */
    gbuf g = gbuf_new(16, 0);
    assert_int_equal(tv_read_range(m, "big.f32", big - 3, 4, g.p, g.n, &err), TV_E_INVALID_ARG);
    assert_non_null(strstr(err.msg, "big.f32"));
    assert_int_equal(tv_read_range(m, "big.f32", big + 1, 0, g.p, g.n, &err), TV_E_INVALID_ARG);
    gbuf_untouched(&g, "past the end");
    gbuf_free(&g);
    assert_int_equal(tv_read_range(m, "big.f32", 0, 1, NULL, 16, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv_read_range(NULL, "big.f32", 0, 1, &err, 1, &err), TV_E_INVALID_ARG);
    tv_model_close(m);
}

/* ---- NAME@ALIAS and NAME@active ----------------------------------------------------------------
 */

static void read_one_is(tv_model *m, const uint8_t *src, int i)
{
    tv_error err = {0};
    gbuf g = gbuf_new(g_t[i].nbytes, 1);
    int rc = tv_read_into(m, g_t[i].name, g.p, g.n, &err);
    if (rc)
        fail_msg("read %s: %s", g_t[i].name, err.msg);
    assert_memory_equal(g.p, src_of(src, i), g.n);
    gbuf_free(&g);
}

static void test_alias_open(void **state)
{
    tfx *x = *state;
    store_fx *f = x->f;
    tv_error err = {0};
    import_ck(f, f->ck2); /* generation 2, active */
    assert_int_equal(tv__store_alias_set(f->st, MODEL, "prod", 1, &err), 0);
    tv_model *act = open_ok(f->store, MODEL "@active", x->engine);
    assert_int_equal(tv_model_generation(act), 2);
    tv_model *prod = open_ok(f->store, MODEL "@prod", x->engine);
    assert_int_equal(tv_model_generation(prod), 1);
    read_one_is(prod, f->src1, T_BIG);

    /* the alias moves: the open reader keeps generation 1, a new one gets 2 */
    assert_int_equal(tv__store_alias_set(f->st, MODEL, "prod", 2, &err), 0);
    assert_int_equal(tv_model_generation(prod), 1);
    read_one_is(prod, f->src1, T_BIG);
    tv_model *prod2 = open_ok(f->store, MODEL "@prod", x->engine);
    assert_int_equal(tv_model_generation(prod2), 2);
    read_one_is(prod2, f->src2, T_BIG);
    /* retire and gc generation 1 while the old reader holds it: kept */
    assert_int_equal(tv__store_activate(f->st, MODEL, 2, &err), 0);
    assert_int_equal(tv__reg_generation_retire(f->st->reg, MODEL, 1, &err), 0);
    size_t n_freed = 9;
    assert_int_equal(tv__store_gc(f->st, &n_freed, NULL, &err), 0);
    assert_int_equal(n_freed, 0);
    read_one_is(prod, f->src1, T_LAST);
    tv_model_close(prod);
    assert_int_equal(tv__store_gc(f->st, &n_freed, NULL, &err), 0);
    assert_int_equal(n_freed, 1);

    /* removed alias, bad alias names, digits-only = a generation */
    assert_int_equal(tv__store_alias_remove(f->st, MODEL, "prod", NULL, &err), 0);
    tv_model *m = NULL;
    assert_int_equal(open_m(f->store, MODEL "@prod", x->engine, &m, &err), TV_E_NOT_FOUND);
    assert_null(m);
    assert_int_equal(open_m(f->store, MODEL "@nope", x->engine, &m, &err), TV_E_NOT_FOUND);
    assert_int_equal(open_m(f->store, MODEL "@bad name", x->engine, &m, &err), TV_E_INVALID_ARG);
    assert_int_equal(open_m(f->store, MODEL "@_x", x->engine, &m, &err), TV_E_INVALID_ARG);
    assert_int_equal(open_m(f->store, MODEL "@", x->engine, &m, &err), TV_E_INVALID_ARG);
    assert_int_equal(open_m(f->store, MODEL "@01", x->engine, &m, &err), TV_E_INVALID_ARG);
    assert_int_equal(open_m(f->store, MODEL "@2x", x->engine, &m, &err), TV_E_INVALID_ARG);
    assert_int_equal(open_m(f->store, "nosuch@prod", x->engine, &m, &err), TV_E_NOT_FOUND);
    tv_model *g2 = open_ok(f->store, MODEL "@2", x->engine);
    assert_int_equal(tv_model_generation(g2), 2);
    tv_model_close(g2);
    /* a pointer copied from another alias still opens what it names, and
     * the snapshot's identity is checked as for any generation */
    assert_int_equal(tv__store_alias_set(f->st, MODEL, "canary", 2, &err), 0);
    tv_model *c = open_ok(f->store, MODEL "@canary", x->engine);
    assert_int_equal(tv_model_generation(c), 2);
    tv_model_close(c);
    tv_model_close(prod2);
    tv_model_close(act);
}

/* ---- shard headers ------------------------------------------------------------------------- */

/* Shard `shard`'s header read into a guarded buffer (misalignment mis,
 * dest_len extra bytes larger than needed) equals want[0, n); only n bytes
 * are written. */
static void header_ok(tv_model *m, size_t shard, const uint8_t *want, size_t n, size_t mis,
                      size_t extra)
{
    tv_error err = {0};
    gbuf g = gbuf_new(n, mis);
    int rc = tv_read_shard_header(m, shard, g.p, n + extra, &err);
    if (rc)
        fail_msg("header of shard %zu: %s: %s", shard, tv_err_name(rc), err.msg);
    if (memcmp(g.p, want, n))
        fail_msg("header of shard %zu (mis %zu): bytes differ", shard, mis);
    gbuf_check(&g, "shard header");
    gbuf_free(&g);
}

/* A refused header read: code, a message holding needle, nothing written. */
static void header_refused(tv_model *m, size_t shard, size_t n, size_t dest_len, bool null_dest,
                           int want, const char *needle)
{
    tv_error err = {0};
    gbuf g = gbuf_new(n, 3);
    int rc = tv_read_shard_header(m, shard, null_dest ? NULL : g.p, dest_len, &err);
    if (rc != want)
        fail_msg("header of shard %zu: %s, want %s (%s)", shard, tv_err_name(rc), tv_err_name(want),
                 err.msg);
    if (needle && !strstr(err.msg, needle))
        fail_msg("error \"%s\" lacks \"%s\"", err.msg, needle);
    gbuf_untouched(&g, "refused header read");
    gbuf_free(&g);
}

/* The single-shard checkpoint: describe, read (any alignment, a larger
 * destination), refusals (shard out of range, dest NULL or one byte short,
 * NULL model), and device errors as for a tensor read. */
static void test_shard_header(void **state)
{
    tv_model *m = open_ok(g_fx->store, MODEL, engine_of(state));
    tv_shard_desc sd = {.name = "x"};
    assert_int_equal(tv_model_n_shards(m), 1);
    assert_int_equal(tv_model_n_shards(NULL), 0);
    assert_int_equal(tv_model_shard(m, 0, &sd), 0);
    assert_int_equal(sd.file_len, g_fx->len1);
    assert_int_equal(sd.header_len, HDR_LEN);
    assert_true(sd.name_len > 0 && sd.name_len == strlen("ck1.safetensors"));
    assert_memory_equal(sd.name, "ck1.safetensors", sd.name_len);
    assert_int_equal(tv_model_shard(m, 1, &sd), TV_E_INVALID_ARG);
    assert_string_equal(sd.name, "");
    assert_int_equal(sd.header_len, 0);
    assert_int_equal(tv_model_shard(NULL, 0, &sd), TV_E_INVALID_ARG);
    assert_int_equal(tv_model_shard(m, 0, NULL), TV_E_INVALID_ARG);
    for (size_t mis = 0; mis < 3; mis++)
        header_ok(m, 0, g_fx->src1, DATA_BASE, mis, mis * 1000);
    atomic_store(&g_reads, 0);
    tv__io_fault = hook_count;
    header_refused(m, 1, DATA_BASE, DATA_BASE, false, TV_E_INVALID_ARG, "shard 1 out of range");
    header_refused(m, 0, DATA_BASE, DATA_BASE - 1, false, TV_E_INVALID_ARG, "4008 bytes");
    header_refused(m, 0, DATA_BASE, DATA_BASE, true, TV_E_INVALID_ARG, "ck1.safetensors");
    header_refused(m, SIZE_MAX, DATA_BASE, DATA_BASE, false, TV_E_INVALID_ARG, "out of range");
    assert_int_equal(atomic_load(&g_reads), 0); /* every check before any read */
    tv_error err = {0};
    uint8_t one[8] = {0};
    assert_int_equal(tv_read_shard_header(NULL, 0, one, sizeof one, &err), TV_E_INVALID_ARG);
    tv__io_fault = hook_eio_all;
    header_refused(m, 0, DATA_BASE, DATA_BASE, false, -EIO, "header");
    tv__io_fault = hook_short_all;
    header_refused(m, 0, DATA_BASE, DATA_BASE, false, TV_E_SHORT_IO, "shard 0");
    hooks_reset();
    header_ok(m, 0, g_fx->src1, DATA_BASE, 1, 0);
    tv_model_close(m);
}

/* A checkpoint of two shards with different header lengths, imported from
 * a directory with an index: every header equals its file's first 8 +
 * header_len bytes, and the descriptors follow tv_tensor_desc.shard. */
static void test_shard_header_multi(void **state)
{
    tfx *x = *state;
    store_fx *f = x->f;
    tv_error err = {0};
    char dir[300], p0[340], p1[340], idx[340];
    static const tv_test_tensor_nd s0[] = {{"w.a", "F32", "[1000]", 4000}, {"w.b", "U8", "[7]", 7}};
    static const tv_test_tensor_nd s1[] = {{"w.c", "BF16", "[3,5]", 30},
                                           {"w.long.name.of.a.tensor.d", "I64", "[9]", 72},
                                           {"w.e", "U8", "[0]", 0}};
    tv_test_path(dir, sizeof dir, "%s/multi", f->dir);
    assert_int_equal(mkdir(dir, 0700), 0);
    tv_test_path(p0, sizeof p0, "%s/model-00001-of-00002.safetensors", dir);
    tv_test_path(p1, sizeof p1, "%s/model-00002-of-00002.safetensors", dir);
    tv_test_path(idx, sizeof idx, "%s/model.safetensors.index.json", dir);
    tv_test_write_shard_nd(p0, s0, 2, 5);
    tv_test_write_shard_nd(p1, s1, 3, 6);
    const char *index = "{\"metadata\":{\"total_size\":4109},\"weight_map\":{"
                        "\"w.a\":\"model-00001-of-00002.safetensors\","
                        "\"w.b\":\"model-00001-of-00002.safetensors\","
                        "\"w.c\":\"model-00002-of-00002.safetensors\","
                        "\"w.long.name.of.a.tensor.d\":\"model-00002-of-00002.safetensors\","
                        "\"w.e\":\"model-00002-of-00002.safetensors\"}}";
    tv_test_write_file(idx, index, strlen(index));
    tv__import_opts o = {.activate = true, .strict = true};
    if (tv__import(f->st, "acme/multi", dir, &o, NULL, &err))
        fail_msg("import %s: %s", dir, err.msg);
    tv_model *m = open_ok(f->store, "acme/multi", x->engine);
    assert_int_equal(tv_model_n_shards(m), 2);
    const char *paths[2] = {p0, p1};
    for (size_t s = 0; s < 2; s++) {
        size_t flen = 0;
        uint8_t *file = read_whole(paths[s], &flen);
        tv_shard_desc sd;
        assert_int_equal(tv_model_shard(m, s, &sd), 0);
        const char *base = strrchr(paths[s], '/') + 1;
        assert_int_equal(sd.name_len, strlen(base));
        assert_memory_equal(sd.name, base, sd.name_len);
        assert_int_equal(sd.file_len, flen);
        uint64_t hl = 0;
        for (int k = 0; k < 8; k++)
            hl |= (uint64_t)file[k] << (8 * k);
        assert_int_equal(sd.header_len, hl);
        for (size_t mis = 0; mis < 2; mis++)
            header_ok(m, s, file, (size_t)(8 + hl), mis, 1);
        header_refused(m, s, (size_t)(8 + hl), (size_t)(8 + hl - 1), false, TV_E_INVALID_ARG, base);
        free(file);
    }
    for (size_t i = 0; i < tv_model_n_tensors(m); i++) {
        tv_tensor_desc d;
        assert_int_equal(tv_model_tensor(m, i, &d), 0);
        assert_int_equal(d.shard, d.name[2] == 'a' || d.name[2] == 'b' ? 0 : 1);
    }
    header_refused(m, 2, 64, 64, false, TV_E_INVALID_ARG, "acme/multi@1: shard 2 out of range");
    tv_model_close(m);
}

/* Replicated: a replica whose reads fail falls over to another; a shard
 * with no valid replica is TV_E_NO_REPLICA naming it, nothing written, and
 * the other shard's header still reads. */
static uint32_t g_bad_dev;

static void hook_eio_dev(uint32_t dev, uint64_t off, size_t len, int64_t *res)
{
    (void)off, (void)len;
    if (dev < 8)
        atomic_fetch_add(&g_dev_reads[dev], 1);
    if (dev == g_bad_dev)
        *res = -EIO;
}

static void test_shard_header_failover(void **state)
{
    rep_fx *x = *state;
    tv_model *m = open_ok(x->f.store, MODEL, x->engine);
    for (uint32_t bad = 0; bad < N_REP; bad++) {
        counters_reset();
        g_bad_dev = bad;
        tv__io_fault = hook_eio_dev;
        header_ok(m, 0, x->f.src1, DATA_BASE, 1, 0);
        long others = 0;
        for (uint32_t i = 0; i < N_REP; i++)
            others += i == bad ? 0 : atomic_load(&g_dev_reads[i]);
        assert_true(others > 0);
    }
    tv__io_fault = NULL;
    int bad = dev_index(m, x->img[1]);
    tv_model_close(m);
    m = open_split_damaged(x, bad);
    assert_int_equal(tv_model_n_shards(m), 2);
    counters_reset();
    tv__io_fault = hook_dev_count;
    header_ok(m, 0, x->f.src1, DATA_BASE, 0, 0);
    header_refused(m, 1, DATA_BASE, DATA_BASE, false, TV_E_NO_REPLICA, "b.safetensors");
    header_refused(m, 1, DATA_BASE, DATA_BASE, false, TV_E_NO_REPLICA, x->img[1]);
    assert_int_equal(atomic_load(&g_dev_reads[bad]), 0);
    tv_model_close(m);
}

#define BOTH(f)                                                                                    \
    cmocka_unit_test_prestate_setup_teardown(f, NULL, teardown_hooks, &ENG_URING),                 \
        cmocka_unit_test_prestate_setup_teardown(f, NULL, teardown_hooks, &ENG_PREAD)
#define BOTH_STORE(f)                                                                              \
    cmocka_unit_test_prestate_setup_teardown(f, setup_store, teardown_store, &ENG_URING),          \
        cmocka_unit_test_prestate_setup_teardown(f, setup_store, teardown_store, &ENG_PREAD)

#define BOTH_REP(f)                                                                                \
    cmocka_unit_test_prestate_setup_teardown(f, setup_rep, teardown_rep, &ENG_URING),              \
        cmocka_unit_test_prestate_setup_teardown(f, setup_rep, teardown_rep, &ENG_PREAD)

int main(void)
{
    const struct CMUnitTest tests[] = {
        BOTH(test_open_and_describe),
        BOTH(test_read_into_every_tensor),
        BOTH(test_read_into_refusals),
        BOTH(test_read_batch),
        BOTH(test_get_tensor),
        BOTH(test_read_rows),
        BOTH(test_read_range),
        BOTH(test_read_f32),
        cmocka_unit_test(test_convert_f32),
        BOTH(test_faults),
        BOTH(test_cuda_absent),
        BOTH_STORE(test_corrupt_snapshot),
        BOTH_STORE(test_device_changed),
        BOTH_STORE(test_lease_keeps_retired_generation),
        BOTH_STORE(test_alias_open),
        BOTH_STORE(test_swapped_snapshot),
        BOTH_STORE(test_unsafe_snapshot_files),
        BOTH(test_read_options_bounded),
        BOTH(test_rows_bounds),
        BOTH_REP(test_failover_missing_device),
        BOTH_REP(test_failover_grown_device),
        BOTH_REP(test_failover_shrunk_device),
        BOTH_REP(test_failover_label_overwritten),
        BOTH_REP(test_failover_foreign_label),
        BOTH_REP(test_failover_all_devices_bad),
        BOTH_REP(test_failover_shard_without_valid_replica),
        BOTH_REP(test_serve_accessors),
        BOTH(test_shard_header),
        BOTH_STORE(test_shard_header_multi),
        BOTH_REP(test_shard_header_failover),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
