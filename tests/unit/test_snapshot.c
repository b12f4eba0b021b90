/* Unit tests of the manifest snapshot (core/src/snap/snapshot.c): build and
 * open round trip (devices, shards with two replicas, tensors of rank 0 and
 * of zero size, file order, name lookup), a 130k-tensor snapshot, the
 * checksum, the builder's input checks, rejection of every corrupted header
 * field and record the reader follows, an index that never ends, and 1000
 * seeded random corruptions walked end to end (checksum off, so only the
 * structural checks stand between the bytes and the reader).
 *
 * Layout offsets below are docs/formats.md's: a change to them is a format
 * change and must fail here. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <xxhash.h>

#include "dev/dev.h"
#include "snap/snapshot.h"
#include "util/endian.h"
#include "util/hash.h"
#include "tv_test.h"

#define KiB 1024ull
#define MiB (1024ull * 1024ull)

/* Header field offsets (docs/formats.md). */
enum {
    H_VERSION = 8,
    H_HEADER_LEN = 12,
    H_TOTAL_LEN = 16,
    H_CHECKSUM = 24,
    H_GENERATION = 56,
    H_N_DEVICES = 64,
    H_N_SHARDS = 68,
    H_N_REPLICAS = 72,
    H_N_TENSORS = 76,
    H_N_INDEX = 80,
    H_FLAGS = 84,
    H_N_DIMS = 88,
    H_STRINGS_LEN = 96,
    H_DEVICES_OFF = 104,
    H_SHARDS_OFF = 112,
    H_REPLICAS_OFF = 120,
    H_TENSORS_OFF = 128,
    H_DIMS_OFF = 136,
    H_STRINGS_OFF = 144,
    H_INDEX_OFF = 152,
    H_SEED = 160,
    H_MODEL_OFF = 168,
    H_MODEL_LEN = 172,
    H_RESERVED = 176,
};
/* Record field offsets. */
enum {
    D_PATH_OFF = 16,
    D_PATH_LEN = 20,
    D_KIND = 24,
    D_LBA = 28,
    D_IO_ALIGN = 32,
    D_OBJECT_ALIGN = 40,
    D_DATA_OFF = 72,
    D_RESERVED = 164
};
enum {
    S_NAME_OFF = 0,
    S_NAME_LEN = 4,
    S_FILE_LEN = 8,
    S_HEADER_LEN = 16,
    S_FIRST_REP = 56,
    S_N_REPS = 60
};
enum { R_DEVICE = 0, R_RESERVED = 4, R_BASE_OFF = 16, R_ALLOC_LEN = 24 };
enum {
    T_NAME_OFF = 0,
    T_NAME_LEN = 4,
    T_DTYPE = 8,
    T_RANK = 12,
    T_FIRST_DIM = 16,
    T_SHARD = 20,
    T_BEGIN = 24,
    T_END = 32
};

/* ---- a small generation ---------------------------------------------------- */

static const uint64_t SH_A[] = {4, 8}, SH_B[] = {8}, SH_E[] = {0, 5}, SH_W[] = {3, 3},
                      SH_F4[] = {4};

/* Shard 0: 168 data bytes after a 120-byte header; shard 1: 20 after 64.
 * Given out of file order on purpose. */
static const tv__snap_tensor_in TENSORS[] = {
    {"b.w", 3, TV_DTYPE_BF16, 2, SH_W, 1, 0, 18},
    {"a.bias", 6, TV_DTYPE_F32, 1, SH_B, 0, 128, 160},
    {"empty", 5, TV_DTYPE_F16, 2, SH_E, 0, 168, 168},
    {"scalar", 6, TV_DTYPE_I64, 0, NULL, 0, 160, 168},
    {"a.weight", 8, TV_DTYPE_F32, 2, SH_A, 0, 0, 128},
    {"b.f4", 4, TV_DTYPE_F4, 1, SH_F4, 1, 18, 20},
};
/* File order: shard, begin, end. */
static const char *const FILE_ORDER[] = {"a.weight", "a.bias", "scalar", "empty", "b.w", "b.f4"};

typedef struct gen_fixture {
    tv__snap_device_in devs[2];
    tv__snap_replica_in reps0[2], reps1[2];
    tv__snap_shard_in shards[2];
    tv__snap_in in;
} gen_fixture;

static void fill_generation(gen_fixture *g)
{
    memset(g, 0, sizeof *g);
    tv__snap_device_in *d = &g->devs[0];
    for (int i = 0; i < 16; i++)
        d->uuid[i] = (uint8_t)(0x10 + i);
    d->path = "/var/lib/tv/image0";
    d->kind = TV__DEV_FILE;
    d->lba_size = 512;
    d->io_align = 4096;
    d->object_align = 64 * KiB;
    d->size_bytes = 16 * MiB;
    d->region_off = 1 * MiB;
    d->region_len = 15 * MiB;
    d->data_off = 1 * MiB + 64 * KiB;

    d = &g->devs[1];
    for (int i = 0; i < 16; i++)
        d->uuid[i] = (uint8_t)(0xA0 + i);
    d->path = "/dev/nvme0n1";
    d->kind = TV__DEV_NVME;
    d->lba_size = 4096;
    d->io_align = 4096;
    d->object_align = 64 * KiB;
    d->size_bytes = 64 * MiB;
    d->region_off = 4 * MiB;
    d->region_len = 32 * MiB;
    d->data_off = 4 * MiB + 64 * KiB;
    memcpy(d->serial, "S1234567890123456789", 20); /* full width: not NUL-terminated */
    memcpy(d->model, "Acme NVMe 9000", 14);
    d->nsid = 1;
    for (int i = 0; i < 16; i++)
        d->nguid[i] = (uint8_t)(0x30 + i);
    for (int i = 0; i < 8; i++)
        d->eui64[i] = (uint8_t)(0x50 + i);

    g->reps0[0] = (tv__snap_replica_in){0, 11, 1 * MiB + 64 * KiB, 64 * KiB};
    g->reps0[1] = (tv__snap_replica_in){1, 12, 4 * MiB + 128 * KiB, 64 * KiB};
    g->reps1[0] = (tv__snap_replica_in){0, 13, 1 * MiB + 128 * KiB, 64 * KiB};
    g->reps1[1] = (tv__snap_replica_in){1, 14, 4 * MiB + 64 * KiB, 128 * KiB};

    g->shards[0].name = "model-00001-of-00002.safetensors";
    g->shards[0].file_len = 8 + 120 + 168;
    g->shards[0].header_len = 120;
    memset(g->shards[0].sha256, 0xAB, 32);
    g->shards[0].n_replicas = 2;
    g->shards[0].replicas = g->reps0;
    g->shards[1].name = "model-00002-of-00002.safetensors";
    g->shards[1].file_len = 8 + 64 + 20;
    g->shards[1].header_len = 64;
    memset(g->shards[1].sha256, 0xCD, 32);
    g->shards[1].n_replicas = 2;
    g->shards[1].replicas = g->reps1;

    g->in = (tv__snap_in){.model = "org/model-7b",
                          .generation = 3,
                          .n_devices = 2,
                          .devices = g->devs,
                          .n_shards = 2,
                          .shards = g->shards,
                          .n_tensors = TV_ARRAY_LEN(TENSORS),
                          .tensors = TENSORS,
                          .hash_seed = 0x0123456789ABCDEFull};
}

static uint8_t *build(const tv__snap_in *in, size_t *len)
{
    void *buf = NULL;
    tv_error err = {0};
    int rc = tv__snap_build(in, &buf, len, &err);
    if (rc)
        fail_msg("build: %s", err.msg);
    return buf;
}

static uint8_t *build_small(size_t *len)
{
    gen_fixture g;
    fill_generation(&g);
    return build(&g.in, len);
}

static void open_ok(const uint8_t *buf, size_t len, tv__snap *s)
{
    tv_error err = {0};
    int rc = tv__snap_open(buf, len, TV__SNAP_VERIFY_CHECKSUM, s, &err);
    if (rc)
        fail_msg("open: %s", err.msg);
}

static uint8_t *dup_image(const uint8_t *buf, size_t len)
{
    uint8_t *p = malloc(len);
    assert_non_null(p);
    memcpy(p, buf, len);
    return p;
}

/* ---- round trip ---------------------------------------------------------- */

static void test_roundtrip(void **state)
{
    (void)state;
    gen_fixture g;
    fill_generation(&g);
    size_t len;
    uint8_t *buf = build(&g.in, &len);
    assert_int_equal(len % 8, 0);
    assert_memory_equal(buf, TV__SNAP_MAGIC, 8);
    assert_int_equal(tv__le32_get(buf + H_VERSION), TV__SNAP_VERSION);
    assert_int_equal(tv__le32_get(buf + H_HEADER_LEN), TV__SNAP_HEADER_LEN);
    assert_int_equal(tv__le64_get(buf + H_TOTAL_LEN), len);

    tv__snap s;
    tv_error err = {0};
    open_ok(buf, len, &s);
    assert_int_equal(s.generation, 3);
    assert_int_equal(s.n_devices, 2);
    assert_int_equal(s.n_shards, 2);
    assert_int_equal(s.n_replicas, 4);
    assert_int_equal(s.n_tensors, 6);
    assert_int_equal(s.n_index, 16);
    assert_int_equal(s.n_dims, 8);
    assert_int_equal(s.hash_seed, 0x0123456789ABCDEFull);

    const char *model;
    size_t model_len;
    assert_int_equal(tv__snap_model(&s, &model, &model_len, &err), 0);
    assert_int_equal(model_len, strlen("org/model-7b"));
    assert_string_equal(model, "org/model-7b"); /* NUL-terminated inside the image */

    for (uint32_t i = 0; i < 2; i++) {
        tv__snap_device_info d;
        assert_int_equal(tv__snap_device(&s, i, &d, &err), 0);
        const tv__snap_device_in *w = &g.devs[i];
        assert_memory_equal(d.uuid, w->uuid, 16);
        assert_int_equal(d.path_len, strlen(w->path));
        assert_string_equal(d.path, w->path);
        assert_int_equal(d.kind, w->kind);
        assert_int_equal(d.lba_size, w->lba_size);
        assert_int_equal(d.io_align, w->io_align);
        assert_int_equal(d.object_align, w->object_align);
        assert_int_equal(d.size_bytes, w->size_bytes);
        assert_int_equal(d.region_off, w->region_off);
        assert_int_equal(d.region_len, w->region_len);
        assert_int_equal(d.data_off, w->data_off);
        assert_memory_equal(d.serial, w->serial, 20);
        assert_memory_equal(d.model, w->model, 40);
        assert_int_equal(d.nsid, w->nsid);
        assert_memory_equal(d.nguid, w->nguid, 16);
        assert_memory_equal(d.eui64, w->eui64, 8);
    }
    for (uint32_t i = 0; i < 2; i++) {
        tv__snap_shard_info sh;
        assert_int_equal(tv__snap_shard(&s, i, &sh, &err), 0);
        assert_int_equal(sh.name_len, strlen(g.shards[i].name));
        assert_memory_equal(sh.name, g.shards[i].name, sh.name_len);
        assert_int_equal(sh.file_len, g.shards[i].file_len);
        assert_int_equal(sh.header_len, g.shards[i].header_len);
        assert_int_equal(sh.data_off, 8 + g.shards[i].header_len);
        assert_memory_equal(sh.sha256, g.shards[i].sha256, 32);
        assert_int_equal(sh.first_replica, 2 * i);
        assert_int_equal(sh.n_replicas, 2);
        for (uint32_t r = 0; r < 2; r++) {
            tv__snap_replica_info rp;
            const tv__snap_replica_in *w = &g.shards[i].replicas[r];
            assert_int_equal(tv__snap_replica(&s, sh.first_replica + r, &rp, &err), 0);
            assert_int_equal(rp.device, w->device);
            assert_int_equal(rp.object_id, w->object_id);
            assert_int_equal(rp.base_off, w->base_off);
            assert_int_equal(rp.alloc_len, w->alloc_len);
        }
    }
    for (uint32_t i = 0; i < s.n_tensors; i++) {
        tv__snap_tensor_info t;
        assert_int_equal(tv__snap_tensor(&s, i, &t, &err), 0);
        assert_int_equal(t.name_len, strlen(FILE_ORDER[i]));
        assert_string_equal(t.name, FILE_ORDER[i]);
        const tv__snap_tensor_in *w = NULL;
        for (size_t j = 0; j < TV_ARRAY_LEN(TENSORS); j++)
            if (!strcmp(TENSORS[j].name, FILE_ORDER[i]))
                w = &TENSORS[j];
        assert_non_null(w);
        assert_int_equal(t.dtype, w->dtype);
        assert_int_equal(t.rank, w->rank);
        for (uint32_t d = 0; d < t.rank; d++)
            assert_int_equal(tv__snap_dim(&t, d), w->shape[d]);
        assert_int_equal(tv__snap_dim(&t, t.rank), 0);
        assert_int_equal(t.shard, w->shard);
        assert_int_equal(t.begin_off, w->begin_off);
        assert_int_equal(t.end_off, w->end_off);
        assert_int_equal(t.nbytes, w->end_off - w->begin_off);
        uint32_t idx = 99;
        assert_int_equal(tv__snap_find(&s, FILE_ORDER[i], strlen(FILE_ORDER[i]), &idx, &err), 0);
        assert_int_equal(idx, i);
    }
    tv__snap_tensor_info t;
    assert_int_equal(tv__snap_tensor(&s, 2, &t, &err), 0); /* "scalar": rank 0, 1 element */
    assert_int_equal(t.rank, 0);
    assert_int_equal(t.n_elements, 1);
    assert_int_equal(tv__snap_tensor(&s, 3, &t, &err), 0); /* "empty": 0 x 5 */
    assert_int_equal(t.n_elements, 0);
    assert_int_equal(t.nbytes, 0);

    uint32_t idx;
    assert_int_equal(tv__snap_find(&s, "a.weigh", 7, &idx, &err), TV_E_NOT_FOUND);
    assert_int_equal(tv__snap_find(&s, "a.weightx", 9, &idx, &err), TV_E_NOT_FOUND);
    assert_int_equal(tv__snap_find(&s, NULL, 0, &idx, &err), TV_E_NOT_FOUND);
    assert_int_equal(tv__snap_find(&s, "b.w", 3, NULL, &err), 0);
    free(buf);
}

static void test_args_and_ranges(void **state)
{
    (void)state;
    size_t len;
    uint8_t *buf = build_small(&len);
    tv__snap s;
    tv_error err = {0};
    tv__snap_device_info d;
    tv__snap_shard_info sh;
    tv__snap_replica_info r;
    tv__snap_tensor_info t;
    open_ok(buf, len, &s);
    assert_int_equal(tv__snap_open(NULL, len, 0, &s, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv__snap_open(buf, len, 0, NULL, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv__snap_device(&s, 2, &d, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv__snap_shard(&s, 2, &sh, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv__snap_replica(&s, 4, &r, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv__snap_tensor(&s, 6, &t, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv__snap_tensor(NULL, 0, &t, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv__snap_find(&s, NULL, 3, NULL, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv__snap_dim(NULL, 0), 0);
    free(buf);
}

/* The index hash is part of the format (docs/formats.md): pin it. */
static void test_hash_is_stable(void **state)
{
    (void)state;
    assert_int_equal(tv__hash_bytes("", 0, 0), 0xb40f98f1779bc757ull);
    assert_int_equal(tv__hash_bytes("model.embed_tokens.weight", 25, 0x0123456789ABCDEFull),
                     0x82769d3c15275de1ull);
}

static void test_deterministic(void **state)
{
    (void)state;
    gen_fixture g;
    fill_generation(&g);
    size_t l1, l2, l3;
    uint8_t *a = build(&g.in, &l1), *b = build(&g.in, &l2);
    assert_int_equal(l1, l2);
    assert_memory_equal(a, b, l1);
    g.in.hash_seed = 0; /* random */
    uint8_t *c = build(&g.in, &l3);
    tv__snap s;
    open_ok(c, l3, &s);
    assert_int_not_equal(s.hash_seed, 0);
    for (size_t i = 0; i < TV_ARRAY_LEN(FILE_ORDER); i++) {
        uint32_t idx;
        assert_int_equal(tv__snap_find(&s, FILE_ORDER[i], strlen(FILE_ORDER[i]), &idx, NULL), 0);
        assert_int_equal(idx, i);
    }
    free(a);
    free(b);
    free(c);
}

static void test_empty_generation(void **state)
{
    (void)state;
    tv__snap_in in = {.model = "m", .generation = 1, .hash_seed = 7};
    size_t len;
    uint8_t *buf = build(&in, &len);
    tv__snap s;
    open_ok(buf, len, &s);
    assert_int_equal(s.n_tensors, 0);
    assert_int_equal(s.n_index, 16);
    assert_int_equal(tv__snap_find(&s, "x", 1, NULL, NULL), TV_E_NOT_FOUND);
    free(buf);
}

/* ---- 130k tensors ---------------------------------------------------------- */

static size_t sample_positions(const tv__snap *s, size_t *at, size_t cap);
static void expect_flips_refused(const uint8_t *good, size_t len, const size_t *at, size_t n,
                                 uint8_t mask);

static void test_large(void **state)
{
    (void)state;
    enum { N = 130000, PER_SHARD = 50000 };
    gen_fixture g;
    fill_generation(&g);
    tv__snap_tensor_in *t = calloc(N, sizeof *t);
    char *names = malloc((size_t)N * 64);
    static const uint64_t shape[] = {2, 2};
    assert_non_null(t);
    assert_non_null(names);
    tv__snap_shard_in shards[3];
    tv__snap_replica_in reps[3];
    for (int i = 0; i < 3; i++) {
        reps[i] = (tv__snap_replica_in){0, 100 + i, 1 * MiB + 64 * KiB * (uint64_t)(1 + i * 8),
                                        8 * 64 * KiB};
        shards[i] = (tv__snap_shard_in){.name = i == 0   ? "s0"
                                                : i == 1 ? "s1"
                                                         : "s2",
                                        .file_len = 8 + 64 + (uint64_t)PER_SHARD * 8,
                                        .header_len = 64,
                                        .n_replicas = 1,
                                        .replicas = &reps[i]};
    }
    /* Inserted in reverse so the builder has to sort. */
    for (int i = 0; i < N; i++) {
        int k = N - 1 - i;
        char *nm = names + (size_t)k * 64;
        int n = snprintf(nm, 64, "model.layers.%d.mlp.experts.%d.w%d", k / 1000, k % 1000, k % 7);
        t[i] = (tv__snap_tensor_in){.name = nm,
                                    .name_len = (size_t)n,
                                    .dtype = TV_DTYPE_BF16,
                                    .rank = 2,
                                    .shape = shape,
                                    .shard = (uint32_t)(k / PER_SHARD),
                                    .begin_off = (uint64_t)(k % PER_SHARD) * 8,
                                    .end_off = (uint64_t)(k % PER_SHARD) * 8 + 8};
    }
    g.in.n_shards = 3;
    g.in.shards = shards;
    g.in.n_tensors = N;
    g.in.tensors = t;
    size_t len;
    uint8_t *buf = build(&g.in, &len);
    tv__snap s;
    open_ok(buf, len, &s);
    assert_int_equal(s.n_tensors, N);
    assert_int_equal(s.n_index, 262144);
    tv_error err = {0};
    for (uint32_t i = 0; i < N; i++) {
        tv__snap_tensor_info ti;
        assert_int_equal(tv__snap_tensor(&s, i, &ti, &err), 0);
        const char *want = names + (size_t)i * 64; /* file order = k order */
        assert_int_equal(ti.name_len, strlen(want));
        assert_memory_equal(ti.name, want, ti.name_len);
        uint32_t idx = UINT32_MAX;
        assert_int_equal(tv__snap_find(&s, want, strlen(want), &idx, &err), 0);
        assert_int_equal(idx, i);
    }
    assert_int_equal(tv__snap_find(&s, "model.layers.0.mlp.experts.0.w1", 31, NULL, &err),
                     TV_E_NOT_FOUND);
    /* One flipped byte in the header, any section or the string table of a
     * 130k-tensor image is refused at open. */
    size_t pos[TV__SNAP_HEADER_LEN + 64];
    size_t n = sample_positions(&s, pos, TV_ARRAY_LEN(pos));
    assert_true(n > TV__SNAP_HEADER_LEN + 30);
    expect_flips_refused(buf, len, pos, n, 0x04);
    free(buf);
    free(t);
    free(names);
}

/* ---- builder input checks ------------------------------------------------ */

static void expect_build_error(const tv__snap_in *in, int code, const char *needle)
{
    void *buf = (void *)1;
    size_t len = 1;
    tv_error err = {0};
    int rc = tv__snap_build(in, &buf, &len, &err);
    if (rc != code)
        fail_msg("build returned %d (%s), expected %d", rc, err.msg, code);
    assert_null(buf);
    assert_int_equal(len, 0);
    if (needle && !strstr(err.msg, needle))
        fail_msg("message '%s' lacks '%s'", err.msg, needle);
}

static void test_build_rejects(void **state)
{
    (void)state;
    gen_fixture g;
    tv__snap_tensor_in t[TV_ARRAY_LEN(TENSORS)];

#define RESET()                                                                                    \
    do {                                                                                           \
        fill_generation(&g);                                                                       \
        memcpy(t, TENSORS, sizeof t);                                                              \
        g.in.tensors = t;                                                                          \
    } while (0)

    RESET();
    t[1].name = "b.w", t[1].name_len = 3, t[1].shard = 1, t[1].dtype = TV_DTYPE_U8;
    t[1].rank = 1, t[1].shape = SH_B, t[1].begin_off = 0, t[1].end_off = 8;
    expect_build_error(&g.in, TV_E_INVALID_ARG, "appears twice");
    RESET();
    t[1].end_off = 170, t[1].begin_off = 138; /* past shard 0's 168 data bytes */
    expect_build_error(&g.in, TV_E_INVALID_ARG, "past its shard");
    RESET();
    t[1].begin_off = 132, t[1].end_off = 160; /* 28 bytes for 8 x F32 */
    expect_build_error(&g.in, TV_E_INVALID_ARG, "shape x dtype");
    RESET();
    t[1].begin_off = 160, t[1].end_off = 128;
    expect_build_error(&g.in, TV_E_INVALID_ARG, "end before begin");
    RESET();
    t[1].dtype = TV_DTYPE_COUNT;
    expect_build_error(&g.in, TV_E_INVALID_ARG, "unknown dtype");
    RESET();
    t[1].rank = TV_ST_MAX_RANK + 1;
    expect_build_error(&g.in, TV_E_INVALID_ARG, "rank");
    RESET();
    t[1].shard = 2;
    expect_build_error(&g.in, TV_E_INVALID_ARG, "shard 2 out of range");
    RESET();
    g.reps1[1].alloc_len = 0;
    expect_build_error(&g.in, TV_E_INVALID_ARG, "object_align");
    RESET();
    g.shards[0].file_len = 64 * KiB + 8; /* longer than its first replica */
    expect_build_error(&g.in, TV_E_INVALID_ARG, "shorter than the file");
    RESET();
    g.shards[1].header_len = 100; /* 8 + 100 > 92 */
    expect_build_error(&g.in, TV_E_INVALID_ARG, "header extends");
    RESET();
    g.shards[1].n_replicas = 0;
    expect_build_error(&g.in, TV_E_INVALID_ARG, "no replica");
    RESET();
    g.reps0[1].device = 2;
    expect_build_error(&g.in, TV_E_INVALID_ARG, "device 2 out of range");
    RESET();
    g.reps0[0].base_off = 1 * MiB; /* before data_off */
    expect_build_error(&g.in, TV_E_INVALID_ARG, "outside the device's data region");
    RESET();
    g.reps0[0].base_off = 16 * MiB - 64 * KiB + 64 * KiB; /* region end */
    expect_build_error(&g.in, TV_E_INVALID_ARG, "outside the device's data region");
    RESET();
    g.reps0[0].base_off += 4096;
    expect_build_error(&g.in, TV_E_INVALID_ARG, "object_align");
    RESET();
    g.devs[0].lba_size = 1000;
    expect_build_error(&g.in, TV_E_INVALID_ARG, "lba size");
    RESET();
    g.devs[0].io_align = 512;
    expect_build_error(&g.in, TV_E_INVALID_ARG, "io_align");
    RESET();
    g.devs[0].region_len = 16 * MiB;
    expect_build_error(&g.in, TV_E_INVALID_ARG, "region extends past");
    RESET();
    g.devs[0].data_off = 1 * MiB;
    expect_build_error(&g.in, TV_E_INVALID_ARG, "data offset");
    RESET();
    g.devs[0].kind = 9;
    expect_build_error(&g.in, TV_E_INVALID_ARG, "kind");
    RESET();
    g.devs[0].path = "";
    expect_build_error(&g.in, TV_E_INVALID_ARG, "no path");
    RESET();
    g.in.generation = 0;
    expect_build_error(&g.in, TV_E_INVALID_ARG, "generation");
    RESET();
    g.in.model = "";
    expect_build_error(&g.in, TV_E_INVALID_ARG, "model name");
    RESET();
    g.in.tensors = NULL;
    expect_build_error(&g.in, TV_E_INVALID_ARG, "NULL");
    RESET();
    g.in.n_tensors = (size_t)UINT32_MAX;
    expect_build_error(&g.in, TV_E_OVERFLOW, "too many");
    expect_build_error(NULL, TV_E_INVALID_ARG, NULL);
#undef RESET
}

/* ---- corruption ------------------------------------------------------------ */

/* Mutates a copy of good with fn, reseals it (so the structural check, not
 * the checksum, must catch it) and expects open to fail. */
static void expect_open_error(const uint8_t *good, size_t len, size_t new_len,
                              void (*fn)(uint8_t *p, void *ctx), void *ctx, const char *needle)
{
    uint8_t *p = malloc(len > new_len ? len : new_len);
    assert_non_null(p);
    memcpy(p, good, len < new_len ? len : new_len);
    fn(p, ctx);
    if (new_len >= TV__SNAP_HEADER_LEN)
        tv__snap_seal(p, new_len);
    tv__snap s;
    tv_error err = {0};
    int rc = tv__snap_open(p, new_len, TV__SNAP_VERIFY_CHECKSUM, &s, &err);
    if (rc != TV_E_SNAPSHOT)
        fail_msg("open returned %d (%s), expected TV_E_SNAPSHOT (%s)", rc, err.msg, needle);
    if (needle && !strstr(err.msg, needle))
        fail_msg("message '%s' lacks '%s'", err.msg, needle);
    assert_int_equal(tv__snap_open(p, new_len, 0, &s, &err), TV_E_SNAPSHOT);
    free(p);
}

typedef struct poke {
    size_t off;
    unsigned width; /* 1, 4 or 8 */
    uint64_t value;
} poke;

static void do_poke(uint8_t *p, void *ctx)
{
    const poke *k = ctx;
    if (k->width == 1)
        p[k->off] = (uint8_t)k->value;
    else if (k->width == 4)
        tv__le32_put(p + k->off, (uint32_t)k->value);
    else
        tv__le64_put(p + k->off, k->value);
}

static void do_nothing(uint8_t *p, void *ctx)
{
    (void)p, (void)ctx;
}

static void poke_expect(const uint8_t *good, size_t len, size_t off, unsigned width, uint64_t value,
                        const char *needle)
{
    poke k = {off, width, value};
    expect_open_error(good, len, len, do_poke, &k, needle);
}

static void test_header_corruptions(void **state)
{
    (void)state;
    size_t len;
    uint8_t *buf = build_small(&len);
    tv__snap s;
    open_ok(buf, len, &s);

    poke_expect(buf, len, 0, 1, 'X', "magic");
    poke_expect(buf, len, 7, 1, '2', "magic");
    poke_expect(buf, len, H_VERSION, 4, 1, "version"); /* the SHA-256 format */
    poke_expect(buf, len, H_VERSION, 4, 3, "version");
    poke_expect(buf, len, H_VERSION, 4, 0, "version");
    poke_expect(buf, len, H_HEADER_LEN, 4, 248, "header_len");
    poke_expect(buf, len, H_HEADER_LEN, 4, 512, "header_len");
    poke_expect(buf, len, H_TOTAL_LEN, 8, len + 8, "total_len");
    poke_expect(buf, len, H_TOTAL_LEN, 8, len - 8, "total_len");
    expect_open_error(buf, len, len - 8, do_nothing, NULL, "total_len"); /* truncated image */
    expect_open_error(buf, len, 100, do_nothing, NULL, "shorter than");
    poke_expect(buf, len, H_FLAGS, 4, 1, "reserved");
    poke_expect(buf, len, H_RESERVED + 40, 1, 1, "reserved");
    poke_expect(buf, len, H_GENERATION, 8, 0, "generation");
    poke_expect(buf, len, H_GENERATION, 8, (uint64_t)-5, "generation");

    /* Section offsets: outside, misaligned, inside the header, overlapping. */
    poke_expect(buf, len, H_TENSORS_OFF, 8, len, "tensors");
    poke_expect(buf, len, H_TENSORS_OFF, 8, UINT64_MAX - 7, "tensors");
    poke_expect(buf, len, H_INDEX_OFF, 8, len - 8, "index");
    poke_expect(buf, len, H_DEVICES_OFF, 8, s.devices_off + 4, "not 8-byte aligned");
    poke_expect(buf, len, H_STRINGS_OFF, 8, s.strings_off + 1, "not 8-byte aligned");
    poke_expect(buf, len, H_SHARDS_OFF, 8, 128, "outside");
    poke_expect(buf, len, H_SHARDS_OFF, 8, s.devices_off, "overlap");
    poke_expect(buf, len, H_REPLICAS_OFF, 8, s.shards_off + 8, "overlap");
    poke_expect(buf, len, H_INDEX_OFF, 8, s.strings_off, "overlap");
    poke_expect(buf, len, H_DIMS_OFF, 8, s.tensors_off + 16, "overlap");

    /* Counts. */
    poke_expect(buf, len, H_N_INDEX, 4, 24, "power of two");
    poke_expect(buf, len, H_N_INDEX, 4, 0, "power of two");
    poke_expect(buf, len, H_N_INDEX, 4, 4, "above the tensor count"); /* 4 <= 6 tensors */
    poke_expect(buf, len, H_N_TENSORS, 4, 16, "above the tensor count");
    poke_expect(buf, len, H_N_DIMS, 8, 1ull << 61, "overflows");
    poke_expect(buf, len, H_N_DIMS, 8, 1ull << 40, "dims");
    poke_expect(buf, len, H_STRINGS_LEN, 8, 1ull << 33, "4 GiB");
    poke_expect(buf, len, H_N_TENSORS, 4, UINT32_MAX, "power of two");
    poke_expect(buf, len, H_N_REPLICAS, 4, UINT32_MAX, "replicas");
    poke_expect(buf, len, H_N_DEVICES, 4, 1000, "devices");
    poke_expect(buf, len, H_N_SHARDS, 4, 100000, "shards");

    /* The model name ref. */
    poke_expect(buf, len, H_MODEL_LEN, 4, 0, "model name");
    poke_expect(buf, len, H_MODEL_LEN, 4, (uint32_t)s.strings_len, "model name");
    poke_expect(buf, len, H_MODEL_OFF, 4, UINT32_MAX, "model name");
    poke_expect(buf, len, H_MODEL_LEN, 4, 3, "model name"); /* not followed by NUL */
    free(buf);
}

static uint8_t *build_seed(int which, const char **name, size_t *len);

static void test_checksum(void **state)
{
    (void)state;
    size_t len;
    uint8_t *buf = build_small(&len);
    tv__snap s;
    tv_error err = {0};
    open_ok(buf, len, &s);
    /* A byte inside a name: structurally fine, caught only by the checksum. */
    const char *model;
    size_t ml;
    assert_int_equal(tv__snap_model(&s, &model, &ml, &err), 0);
    size_t at = (size_t)((const uint8_t *)model - buf) + 1;
    buf[at] ^= 0x20;
    assert_int_equal(tv__snap_open(buf, len, TV__SNAP_VERIFY_CHECKSUM, &s, &err), TV_E_SNAPSHOT);
    assert_non_null(strstr(err.msg, "checksum"));
    assert_int_equal(tv__snap_open(buf, len, 0, &s, &err), 0);
    /* The checksum field itself. */
    buf[at] ^= 0x20;
    buf[H_CHECKSUM + 5] ^= 1;
    assert_int_equal(tv__snap_open(buf, len, TV__SNAP_VERIFY_CHECKSUM, &s, &err), TV_E_SNAPSHOT);
    assert_int_equal(tv__snap_seal(buf, len), 0);
    open_ok(buf, len, &s);
    uint8_t sum[32];
    assert_int_equal(tv__snap_checksum(buf, len, sum), 0);
    assert_memory_equal(sum, buf + H_CHECKSUM, 32);
    assert_int_equal(tv__snap_checksum(buf, 10, sum), TV_E_INVALID_ARG);
    /* The definition in docs/formats.md, computed independently: XXH3-128
     * (one shot) of the image with the field zeroed, canonical (big-endian),
     * then 16 zero bytes. */
    uint8_t *z = dup_image(buf, len);
    memset(z + H_CHECKSUM, 0, 32);
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(z, len));
    assert_memory_equal(buf + H_CHECKSUM, c.digest, 16);
    static const uint8_t zero16[16];
    assert_memory_equal(buf + H_CHECKSUM + 16, zero16, 16);
    free(z);
    /* The field's zero half is checked too. */
    buf[H_CHECKSUM + 31] ^= 0x80;
    assert_int_equal(tv__snap_open(buf, len, TV__SNAP_VERIFY_CHECKSUM, &s, &err), TV_E_SNAPSHOT);
    free(buf);
}

/* Flipping one byte at each of n positions (each on its own copy) makes a
 * checksum-verified open fail with TV_E_SNAPSHOT. */
static void expect_flips_refused(const uint8_t *good, size_t len, const size_t *at, size_t n,
                                 uint8_t mask)
{
    uint8_t *p = dup_image(good, len);
    for (size_t i = 0; i < n; i++) {
        tv__snap s;
        tv_error err = {0};
        assert_true(at[i] < len);
        p[at[i]] ^= mask;
        int rc = tv__snap_open(p, len, TV__SNAP_VERIFY_CHECKSUM, &s, &err);
        if (rc != TV_E_SNAPSHOT)
            fail_msg("byte %zu of %zu flipped (^0x%02x): open returned %d, not TV_E_SNAPSHOT",
                     at[i], len, mask, rc);
        p[at[i]] ^= mask;
    }
    free(p);
}

/* Sampled positions: the header (every byte), and the first, second,
 * middle, next-to-last and last byte of every section, the string table and
 * the model name included. Returns the count written to at. */
static size_t sample_positions(const tv__snap *s, size_t *at, size_t cap)
{
    const struct {
        uint64_t off, len;
    } sec[] = {
        {s->devices_off, (uint64_t)s->n_devices * TV__SNAP_DEVICE_LEN},
        {s->shards_off, (uint64_t)s->n_shards * TV__SNAP_SHARD_LEN},
        {s->replicas_off, (uint64_t)s->n_replicas * TV__SNAP_REPLICA_LEN},
        {s->tensors_off, (uint64_t)s->n_tensors * TV__SNAP_TENSOR_LEN},
        {s->dims_off, s->n_dims * 8},
        {s->strings_off, s->strings_len},
        {s->index_off, (uint64_t)s->n_index * TV__SNAP_SLOT_LEN},
        {s->strings_off + s->model_off, s->model_len},
    };
    size_t n = 0;
    for (size_t i = 0; i < TV__SNAP_HEADER_LEN && n < cap; i++)
        at[n++] = i;
    for (size_t i = 0; i < TV_ARRAY_LEN(sec); i++) {
        if (sec[i].len == 0)
            continue;
        uint64_t pick[] = {0, 1, sec[i].len / 2, sec[i].len - 2, sec[i].len - 1};
        for (size_t k = 0; k < TV_ARRAY_LEN(pick) && n < cap; k++)
            if (pick[k] < sec[i].len)
                at[n++] = (size_t)(sec[i].off + pick[k]);
    }
    if (n < cap)
        at[n++] = s->len - 1;
    return n;
}

/* A single flipped byte anywhere in an image is refused at open: every
 * byte of the small and the dense generation, with two masks. */
static void test_any_flipped_byte_refused(void **state)
{
    (void)state;
    for (int which = 0; which < 3; which++) {
        const char *name;
        size_t len;
        uint8_t *buf = build_seed(which, &name, &len);
        assert_non_null(buf);
        tv__snap s;
        open_ok(buf, len, &s);
        size_t *at = malloc(len * sizeof *at);
        assert_non_null(at);
        for (size_t i = 0; i < len; i++)
            at[i] = i;
        expect_flips_refused(buf, len, at, len, 0x01);
        expect_flips_refused(buf, len, at, len, 0x80);
        /* The sampler itself covers every section of these images. */
        size_t pos[TV__SNAP_HEADER_LEN + 64];
        size_t n = sample_positions(&s, pos, TV_ARRAY_LEN(pos));
        assert_true(n > TV__SNAP_HEADER_LEN + (which == 1 ? 10 : 30));
        expect_flips_refused(buf, len, pos, n, 0xFF);
        free(at);
        free(buf);
    }
}

/* Record-level corruption: open succeeds (the header is intact), following
 * the record fails. */
typedef enum { F_DEVICE, F_SHARD, F_REPLICA, F_TENSOR, F_FIND } follow;

static void record_expect(const uint8_t *good, size_t len, size_t off, unsigned width,
                          uint64_t value, follow what, uint32_t i, const char *needle)
{
    uint8_t *p = dup_image(good, len);
    poke k = {off, width, value};
    do_poke(p, &k);
    tv__snap_seal(p, len);
    tv__snap s;
    tv_error err = {0};
    open_ok(p, len, &s);
    int rc;
    tv__snap_device_info d;
    tv__snap_shard_info sh;
    tv__snap_replica_info r;
    tv__snap_tensor_info t;
    switch (what) {
    case F_DEVICE:
        rc = tv__snap_device(&s, i, &d, &err);
        break;
    case F_SHARD:
        rc = tv__snap_shard(&s, i, &sh, &err);
        break;
    case F_REPLICA:
        rc = tv__snap_replica(&s, i, &r, &err);
        break;
    case F_TENSOR:
        rc = tv__snap_tensor(&s, i, &t, &err);
        break;
    default:
        rc = tv__snap_find(&s, FILE_ORDER[i], strlen(FILE_ORDER[i]), NULL, &err);
        break;
    }
    if (rc != TV_E_SNAPSHOT)
        fail_msg("follow %d/%u returned %d (%s), expected TV_E_SNAPSHOT (%s)", (int)what, i, rc,
                 err.msg, needle);
    if (needle && !strstr(err.msg, needle))
        fail_msg("message '%s' lacks '%s'", err.msg, needle);
    free(p);
}

static void test_record_corruptions(void **state)
{
    (void)state;
    size_t len;
    uint8_t *buf = build_small(&len);
    tv__snap s;
    open_ok(buf, len, &s);
    size_t dev0 = s.devices_off, dev1 = dev0 + TV__SNAP_DEVICE_LEN;
    size_t sh0 = s.shards_off, sh1 = sh0 + TV__SNAP_SHARD_LEN;
    size_t rep0 = s.replicas_off, rep3 = rep0 + 3 * TV__SNAP_REPLICA_LEN;
    size_t t0 = s.tensors_off, t1 = t0 + TV__SNAP_TENSOR_LEN, t4 = t0 + 4 * TV__SNAP_TENSOR_LEN;
    uint32_t sl = (uint32_t)s.strings_len;

    /* Tensors. */
    record_expect(buf, len, t1 + T_NAME_OFF, 4, sl, F_TENSOR, 1, "name ref");
    record_expect(buf, len, t1 + T_NAME_OFF, 4, UINT32_MAX, F_TENSOR, 1, "name ref");
    record_expect(buf, len, t1 + T_NAME_LEN, 4, UINT32_MAX, F_TENSOR, 1, "name ref");
    record_expect(buf, len, t1 + T_NAME_LEN, 4, 2, F_TENSOR, 1, "name ref"); /* no NUL after */
    record_expect(buf, len, t1 + T_SHARD, 4, 2, F_TENSOR, 1, "shard 2 out of range");
    record_expect(buf, len, t1 + T_SHARD, 4, UINT32_MAX, F_TENSOR, 1, "out of range");
    record_expect(buf, len, t1 + T_END, 8, 169, F_TENSOR, 1, "past its shard");
    record_expect(buf, len, t1 + T_END, 8, UINT64_MAX, F_TENSOR, 1, "past its shard");
    record_expect(buf, len, t4 + T_BEGIN, 8, 1, F_TENSOR, 4, "shape x dtype");
    record_expect(buf, len, t1 + T_BEGIN, 8, 161, F_TENSOR, 1, "end before begin");
    record_expect(buf, len, t1 + T_DTYPE, 4, TV_DTYPE_COUNT, F_TENSOR, 1, "dtype");
    record_expect(buf, len, t1 + T_DTYPE, 4, TV_DTYPE_U8, F_TENSOR, 1, "shape x dtype");
    record_expect(buf, len, t1 + T_RANK, 4, TV_ST_MAX_RANK + 1, F_TENSOR, 1, "rank");
    record_expect(buf, len, t1 + T_RANK, 4, 8, F_TENSOR, 1, "dims"); /* past n_dims = 8 */
    record_expect(buf, len, t1 + T_FIRST_DIM, 4, 8, F_TENSOR, 1, "dims");
    record_expect(buf, len, t1 + T_FIRST_DIM, 4, UINT32_MAX, F_TENSOR, 1, "dims");
    record_expect(buf, len, s.dims_off, 8, 1ull << 62, F_TENSOR, 0, "overflows");
    record_expect(buf, len, s.dims_off + 8, 8, 9, F_TENSOR, 0, "shape x dtype");

    /* Shards (also reached through a tensor). */
    record_expect(buf, len, sh0 + S_NAME_OFF, 4, sl + 10, F_SHARD, 0, "name ref");
    record_expect(buf, len, sh0 + S_HEADER_LEN, 8, UINT64_MAX, F_SHARD, 0, "header");
    record_expect(buf, len, sh0 + S_HEADER_LEN, 8, 500, F_TENSOR, 0, "header");
    record_expect(buf, len, sh0 + S_FILE_LEN, 8, 8 + 120 + 100, F_TENSOR, 1, "past its shard");
    record_expect(buf, len, sh1 + S_FIRST_REP, 4, 3, F_SHARD, 1, "out of range");
    record_expect(buf, len, sh1 + S_FIRST_REP, 4, UINT32_MAX, F_SHARD, 1, "out of range");
    record_expect(buf, len, sh1 + S_N_REPS, 4, 0, F_SHARD, 1, "empty");
    record_expect(buf, len, sh1 + S_N_REPS, 4, UINT32_MAX, F_SHARD, 1, "out of range");
    record_expect(buf, len, sh0 + S_FILE_LEN, 8, 64 * KiB + 1, F_SHARD, 0, "longer than replica");

    /* Replicas (also reached through their shard). */
    record_expect(buf, len, rep3 + R_DEVICE, 4, 2, F_REPLICA, 3, "device 2 out of range");
    record_expect(buf, len, rep3 + R_DEVICE, 4, 2, F_SHARD, 1, "device 2 out of range");
    record_expect(buf, len, rep3 + R_RESERVED, 4, 1, F_REPLICA, 3, "reserved");
    record_expect(buf, len, rep0 + R_BASE_OFF, 8, 0, F_REPLICA, 0, "outside");
    record_expect(buf, len, rep0 + R_BASE_OFF, 8, UINT64_MAX - 65535, F_REPLICA, 0, "outside");
    record_expect(buf, len, rep0 + R_BASE_OFF, 8, 1 * MiB + 64 * KiB + 512, F_REPLICA, 0,
                  "object_align");
    record_expect(buf, len, rep0 + R_ALLOC_LEN, 8, 0, F_REPLICA, 0, "empty");
    record_expect(buf, len, rep0 + R_ALLOC_LEN, 8, 16 * MiB, F_REPLICA, 0, "outside");

    /* Devices (also reached through a replica). */
    record_expect(buf, len, dev1 + D_PATH_OFF, 4, sl, F_DEVICE, 1, "path ref");
    record_expect(buf, len, dev1 + D_PATH_LEN, 4, 0, F_DEVICE, 1, "path ref");
    record_expect(buf, len, dev1 + D_KIND, 4, 0, F_DEVICE, 1, "kind");
    record_expect(buf, len, dev1 + D_LBA, 4, 3000, F_REPLICA, 1, "lba size");
    record_expect(buf, len, dev1 + D_IO_ALIGN, 4, 12288, F_DEVICE, 1, "io_align");
    record_expect(buf, len, dev1 + D_OBJECT_ALIGN, 8, 4096, F_DEVICE, 1, "object_align");
    record_expect(buf, len, dev1 + D_DATA_OFF, 8, 100 * MiB, F_DEVICE, 1, "data offset");
    record_expect(buf, len, dev0 + D_RESERVED, 4, 7, F_DEVICE, 0, "reserved");

    /* Index: a slot naming a tensor out of range, a name ref out of the table
     * met by a probe, and an index with no empty slot (the probe must end). */
    uint8_t *p = dup_image(buf, len);
    for (uint32_t k = 0; k < s.n_index; k++)
        if (tv__le32_get(p + s.index_off + 8 * k + 4))
            tv__le32_put(p + s.index_off + 8 * k + 4, 7);
    tv__snap s2;
    assert_int_equal(tv__snap_open(p, len, 0, &s2, NULL), 0); /* checksum now stale: off */
    assert_int_equal(tv__snap_find(&s2, "a.weight", 8, NULL, NULL), TV_E_SNAPSHOT);
    free(p);

    p = dup_image(buf, len);
    for (uint32_t k = 0; k < s.n_index; k++) {
        tv__le32_put(p + s.index_off + 8 * k, 0xFFFFFFFFu);
        tv__le32_put(p + s.index_off + 8 * k + 4, 2); /* all name tensor 1: "a.bias" */
    }
    tv_error err = {0};
    assert_int_equal(tv__snap_open(p, len, 0, &s2, &err), 0);
    assert_int_equal(tv__snap_find(&s2, "nope", 4, NULL, &err), TV_E_SNAPSHOT);
    assert_non_null(strstr(err.msg, "no empty slot"));
    /* Every slot carries the query's hash: the full name comparison decides. */
    uint64_t h = tv__hash_bytes("nope", 4, s2.hash_seed);
    for (uint32_t k = 0; k < s.n_index; k++)
        tv__le32_put(p + s.index_off + 8 * k, (uint32_t)(h >> 32));
    assert_int_equal(tv__snap_find(&s2, "nope", 4, NULL, &err), TV_E_SNAPSHOT);
    uint32_t idx = 0;
    h = tv__hash_bytes("a.bias", 6, s2.hash_seed);
    for (uint32_t k = 0; k < s.n_index; k++)
        tv__le32_put(p + s.index_off + 8 * k, (uint32_t)(h >> 32));
    assert_int_equal(tv__snap_find(&s2, "a.bias", 6, &idx, &err), 0);
    assert_int_equal(idx, 1);
    /* A matching slot whose tensor's name ref is bad. */
    tv__le32_put(p + t1 + T_NAME_OFF, sl + 100);
    assert_int_equal(tv__snap_find(&s2, "a.bias", 6, &idx, &err), TV_E_SNAPSHOT);
    free(p);
    free(buf);
}

/* ---- random corruption ----------------------------------------------------- */

static uint64_t rng_next(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

static int ok_or_snapshot(int rc)
{
    return rc == 0 || rc == TV_E_SNAPSHOT;
}

/* Opens (no checksum) and follows everything; returns how many records
 * decoded. Every call must return 0 or TV_E_SNAPSHOT (find: also
 * TV_E_NOT_FOUND). */
static size_t walk(const uint8_t *p, size_t len)
{
    tv__snap s;
    size_t good = 0;
    int rc = tv__snap_open(p, len, 0, &s, NULL);
    assert_true(ok_or_snapshot(rc));
    if (rc)
        return 0;
    const char *m;
    size_t ml;
    assert_true(ok_or_snapshot(tv__snap_model(&s, &m, &ml, NULL)));
    for (uint32_t i = 0; i < s.n_devices; i++) {
        tv__snap_device_info d;
        rc = tv__snap_device(&s, i, &d, NULL);
        assert_true(ok_or_snapshot(rc));
        good += rc == 0;
    }
    for (uint32_t i = 0; i < s.n_replicas; i++) {
        tv__snap_replica_info r;
        rc = tv__snap_replica(&s, i, &r, NULL);
        assert_true(ok_or_snapshot(rc));
        good += rc == 0;
    }
    for (uint32_t i = 0; i < s.n_shards; i++) {
        tv__snap_shard_info sh;
        rc = tv__snap_shard(&s, i, &sh, NULL);
        assert_true(ok_or_snapshot(rc));
        good += rc == 0;
    }
    for (uint32_t i = 0; i < s.n_tensors; i++) {
        tv__snap_tensor_info t;
        rc = tv__snap_tensor(&s, i, &t, NULL);
        assert_true(ok_or_snapshot(rc));
        if (rc)
            continue;
        good++;
        uint64_t bytes = 0;
        for (uint32_t d = 0; d <= t.rank; d++)
            bytes += tv__snap_dim(&t, d);
        (void)bytes;
        rc = tv__snap_find(&s, t.name, t.name_len, NULL, NULL);
        assert_true(ok_or_snapshot(rc) || rc == TV_E_NOT_FOUND);
    }
    rc = tv__snap_find(&s, "no.such.tensor", 14, NULL, NULL);
    assert_true(rc == TV_E_NOT_FOUND || rc == TV_E_SNAPSHOT);
    return good;
}

static void test_random_flips(void **state)
{
    (void)state;
    size_t len;
    uint8_t *good = build_small(&len);
    uint64_t x = 0x9E3779B97F4A7C15ull;
    size_t opened = 0;
    assert_true(walk(good, len) > 0);
    for (int iter = 0; iter < 1000; iter++) {
        uint8_t *p = dup_image(good, len);
        int n = 1 + (int)(rng_next(&x) % 4);
        for (int k = 0; k < n; k++) {
            size_t at = (size_t)(rng_next(&x) % len);
            /* Half of the flips hit the header or the records, where the
             * structure lives; the rest anywhere. */
            if (k == 0 && (iter & 1))
                at = (size_t)(rng_next(&x) % (len < 1024 ? len : 1024));
            uint64_t r = rng_next(&x);
            if (r & 1)
                p[at] ^= (uint8_t)(1u << (r >> 1 & 7));
            else
                p[at] = (uint8_t)(r >> 8);
        }
        opened += walk(p, len) > 0;
        free(p);
    }
    /* Most corruptions leave the header intact: the record checks ran. */
    assert_true(opened > 300);
    free(good);
}

/* ---- fuzz seeds and byte stability ------------------------------------------ */

/* The seed corpus (tests/fuzz/corpus/snapshot), by number: the small
 * generation, an empty one, and 64 tensors in one shard (a denser index).
 * Deterministic (fixed hash seeds). NULL name past the last one. */
static uint8_t *build_seed(int which, const char **name, size_t *len)
{
    static const uint64_t shape[] = {2};
    enum { N = 64 };
    tv__snap_tensor_in t[N];
    char names[N][16];
    gen_fixture g;

    *name = NULL;
    switch (which) {
    case 0:
        *name = "small.tvsnap";
        return build_small(len);
    case 1: {
        tv__snap_in empty = {.model = "m", .generation = 1, .hash_seed = 7};
        *name = "empty.tvsnap";
        return build(&empty, len);
    }
    case 2: {
        fill_generation(&g);
        tv__snap_shard_in sh = {.name = "model.safetensors",
                                .file_len = 8 + 64 + N * 2,
                                .header_len = 64,
                                .n_replicas = 1,
                                .replicas = g.reps0};
        for (int i = 0; i < N; i++) {
            int n = snprintf(names[i], sizeof names[i], "t%d", i);
            t[i] = (tv__snap_tensor_in){.name = names[i],
                                        .name_len = (size_t)n,
                                        .dtype = TV_DTYPE_U8,
                                        .rank = 1,
                                        .shape = shape,
                                        .begin_off = (uint64_t)i * 2,
                                        .end_off = (uint64_t)i * 2 + 2};
        }
        g.in.n_devices = 1;
        g.in.n_shards = 1;
        g.in.shards = &sh;
        g.in.n_tensors = N;
        g.in.tensors = t;
        g.in.hash_seed = 42;
        *name = "dense.tvsnap";
        return build(&g.in, len);
    }
    default:
        return NULL;
    }
}

/* With TV_SNAPSHOT_SEED_DIR set, writes the fuzz seed corpus. */
static void test_write_fuzz_seeds(void **state)
{
    (void)state;
    const char *dir = getenv("TV_SNAPSHOT_SEED_DIR");
    if (!dir || !*dir)
        skip();
    const char *name;
    size_t len;
    uint8_t *buf;
    for (int i = 0; (buf = build_seed(i, &name, &len)); i++) {
        char p[512];
        tv_test_write_file(tv_test_path(p, sizeof p, "%s/%s", dir, name), buf, len);
        free(buf);
    }
}

/* The builder's output is part of the format: the committed seed corpus
 * (built by version 2 of the builder) must come out byte for byte. */
static void test_build_is_byte_stable(void **state)
{
    (void)state;
    const char *name;
    size_t len, want_len;
    uint8_t *buf;
    int n = 0;
    for (int i = 0; (buf = build_seed(i, &name, &len)); i++, n++) {
        char p[512];
        uint8_t *want = tv_test_read_file(
            tv_test_path(p, sizeof p, "fuzz/corpus/snapshot/%s", name), &want_len);
        if (!want)
            fail_msg("%s: cannot read the committed seed (tests run from tests/)", p);
        assert_int_equal(len, want_len);
        assert_memory_equal(buf, want, len);
        free(want);
        free(buf);
    }
    assert_int_equal(n, 3);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),          cmocka_unit_test(test_args_and_ranges),
        cmocka_unit_test(test_hash_is_stable),     cmocka_unit_test(test_deterministic),
        cmocka_unit_test(test_empty_generation),   cmocka_unit_test(test_large),
        cmocka_unit_test(test_build_rejects),      cmocka_unit_test(test_header_corruptions),
        cmocka_unit_test(test_checksum),           cmocka_unit_test(test_any_flipped_byte_refused),
        cmocka_unit_test(test_record_corruptions), cmocka_unit_test(test_random_flips),
        cmocka_unit_test(test_write_fuzz_seeds),   cmocka_unit_test(test_build_is_byte_stable),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
