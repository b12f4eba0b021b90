/* Fault injection at every system call (SQLite's way): every command of the
 * store (store init; import of one file, of two shards, with --replicas and
 * a dedup hit; activate; retire; gc; verify) and a reader (open + batch read
 * + zero-copy get, with the pread and the io_uring engines) first runs once
 * on a prepared store, counting its calls through the tv__sys table and the
 * read engines' tv__io_fault hook (tv_test.h); then, from the same prepared
 * state each time, it runs again once per call with that call failed: EIO,
 * ENOSPC for writes and syncs, and a short transfer (half the length) for
 * pread, pwrite and engine reads.
 *
 * Invariants checked after every injected fault:
 *   - the command returns an error, or succeeds only when the failed call is
 *     one the code legitimately tolerates (tolerated(), which lists them and
 *     why), and then its effect is complete;
 *   - nothing crashes, hangs or leaks (ASan + LSan in the asan build);
 *   - the store opens, `verify` passes, the generation that was active
 *     before reads back byte-identical (and so does every ready one);
 *   - a reader that reports success returned the right bytes;
 *   - the next writer command (gc) leaves no 'writing' object, nothing
 *     unreferenced, and exactly the space of either the state before or the
 *     state after a clean run in use (tv__alloc_device_space): no leaked
 *     extent.
 * Each command runs from a byte copy of its prepared store (registry,
 * snapshots and the sparse device images), so every run sees the same
 * state; checkpoints are small (a few hundred KiB), so the whole file runs
 * in a few seconds. TV_TEST_VERBOSE=1 shows the commands' own output. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "cli/cli.h"
#include "import/alloc.h"
#include "store/store.h"
#include "registry/registry.h"
#include "tensorvault/tensorvault.h"
#include "tv_test.h"

#define MODEL    "m"
#define MAX_GENS 4

/* ---- checkpoints ------------------------------------------------------------ */

typedef struct ck_file {
    const char *name; /* file name inside the checkpoint directory */
    const tv_test_tensor *t;
    size_t n;
    unsigned seed;
} ck_file;

typedef struct ckdef {
    const char *dir; /* under the test's temporary directory */
    size_t n_files;  /* 1: a single model.safetensors; 2: sharded with an index */
    ck_file f[2];
} ckdef;

static const tv_test_tensor TA[] = {{"a.w", "F32", 20000, 4}, {"a.b", "U8", 13, 1}};
static const tv_test_tensor TB1[] = {{"b.w", "F32", 30000, 4}, {"b.b", "U8", 7, 1}};
static const tv_test_tensor TB2[] = {{"b.h", "BF16", 5000, 2}};
static const tv_test_tensor TC[] = {{"c.x", "U8", 70000, 1}};

static const ckdef CK_A = {"ck_a", 1, {{"model.safetensors", TA, 2, 1}}};
static const ckdef CK_B = {"ck_b",
                           2,
                           {{"model-00001-of-00002.safetensors", TB1, 2, 2},
                            {"model-00002-of-00002.safetensors", TB2, 1, 3}}};
static const ckdef CK_C = {"ck_c", 1, {{"model.safetensors", TC, 1, 4}}};

static char g_root[256];   /* the test's temporary directory */
static char g_work[320];   /* W: store + images the commands run on */
static char g_gold[320];   /* G: the prepared state, restored before each run */
static char g_store[400];  /* W/store */
static char g_img[2][400]; /* W/img1, W/img2 */
static bool g_have_uring = true;

static void ck_path(const ckdef *c, char *out, size_t len)
{
    tv_test_path(out, len, "%s/%s", g_root, c->dir);
}

static void write_ck(const ckdef *c)
{
    char d[400], p[512];
    ck_path(c, d, sizeof d);
    TV_TEST_CHECK(mkdir(d, 0700) == 0);
    for (size_t i = 0; i < c->n_files; i++)
        tv_test_write_shard(tv_test_path(p, sizeof p, "%s/%s", d, c->f[i].name), c->f[i].t,
                            c->f[i].n, c->f[i].seed);
    if (c->n_files == 2) {
        char idx[1024];
        size_t n = (size_t)snprintf(idx, sizeof idx, "{\"metadata\":{},\"weight_map\":{");
        for (size_t i = 0; i < c->n_files; i++)
            for (size_t k = 0; k < c->f[i].n; k++)
                n += (size_t)snprintf(idx + n, sizeof idx - n, "%s\"%s\":\"%s\"", i || k ? "," : "",
                                      c->f[i].t[k].name, c->f[i].name);
        snprintf(idx + n, sizeof idx - n, "}}");
        tv_test_write_text(tv_test_path(p, sizeof p, "%s/model.safetensors.index.json", d), idx);
    }
}

/* Reads every tensor of the open model m (one batch, or one by one plus one
 * zero-copy get) and checks each read that reported success is c's, byte
 * for byte. Returns 0, or the first read error (a wrong byte is a test
 * failure, never an error). */
static int check_model_bytes(tv_model *m, const ckdef *c, bool batch)
{
    size_t n_total = 0;
    for (size_t i = 0; i < c->n_files; i++)
        n_total += c->f[i].n;
    if (tv_model_n_tensors(m) != n_total)
        fail_msg("model has %zu tensors, checkpoint %s has %zu", tv_model_n_tensors(m), c->dir,
                 n_total);
    tv_read_req reqs[4];
    uint8_t *bufs[4] = {0};
    const tv_test_tensor *desc[4];
    uint64_t offs[4];
    unsigned seeds[4];
    size_t n = 0;
    for (size_t i = 0; i < c->n_files; i++) {
        uint64_t off = 0;
        for (size_t k = 0; k < c->f[i].n; k++) {
            uint64_t len = c->f[i].t[k].n_elems * c->f[i].t[k].elem_len;
            TV_TEST_CHECK(n < 4);
            bufs[n] = malloc(len);
            TV_TEST_CHECK(bufs[n] != NULL);
            reqs[n] = (tv_read_req){
                .name = c->f[i].t[k].name, .dest = bufs[n], .dest_len = len, .result = 1};
            desc[n] = &c->f[i].t[k];
            offs[n] = off;
            seeds[n] = c->f[i].seed;
            off += len;
            n++;
        }
    }
    tv_error err = {0};
    int rc = 0;
    if (batch) {
        rc = tv_read_batch(m, reqs, n, &err);
    } else {
        for (size_t i = 0; i < n && !rc; i++)
            reqs[i].result = rc =
                tv_read_into(m, reqs[i].name, reqs[i].dest, reqs[i].dest_len, &err);
        /* and once zero-copy */
        tv_tensor *t = NULL;
        if (!rc && (rc = tv_get_tensor(m, reqs[0].name, &t, &err)) == 0) {
            uint64_t len = desc[0]->n_elems * desc[0]->elem_len;
            assert_int_equal(t->nbytes, len);
            for (uint64_t b = 0; b < len; b++)
                if (((const uint8_t *)t->data)[b] != tv_test_shard_byte(offs[0] + b, seeds[0]))
                    fail_msg("tv_get_tensor('%s') succeeded with a wrong byte at %llu",
                             reqs[0].name, (unsigned long long)b);
            tv_tensor_free(t);
        }
    }
    for (size_t i = 0; i < n; i++) {
        uint64_t len = desc[i]->n_elems * desc[i]->elem_len;
        if (reqs[i].result == 0) /* read and reported good: every byte must be */
            for (uint64_t b = 0; b < len; b++)
                if (bufs[i][b] != tv_test_shard_byte(offs[i] + b, seeds[i]))
                    fail_msg("read of '%s' (%s) succeeded with a wrong byte at %llu", reqs[i].name,
                             c->dir, (unsigned long long)b);
        free(bufs[i]);
    }
    return rc;
}

/* Opens spec in the work store and checks every byte (faults off). */
static void assert_reads_back(const char *spec, const ckdef *c)
{
    tv_open_opts o = {.engine = TV_ENGINE_PREAD, .no_direct = true};
    tv_model *m = NULL;
    tv_error err = {0};
    int rc = tv_model_open(g_store, spec, &o, &m, &err);
    if (rc)
        fail_msg("open %s: %s (%s)", spec, err.msg, tv_err_name(rc));
    if ((rc = check_model_bytes(m, c, true)))
        fail_msg("read %s: %s", spec, tv_err_name(rc));
    tv_model_close(m);
}

/* ---- running commands ----------------------------------------------------------- */

static char g_out_path[400];

/* Runs the CLI in this process (the same dispatcher as the binary), its
 * stdout and stderr going to W/../cmd.out unless TV_TEST_VERBOSE is set. */
static int cli(const char *first, ...)
{
    char *argv[16];
    int argc = 0;
    argv[argc++] = (char *)"tensorvault";
    va_list ap;
    va_start(ap, first);
    for (const char *a = first; a; a = va_arg(ap, const char *)) {
        TV_TEST_CHECK(argc < 15);
        argv[argc++] = (char *)a;
    }
    va_end(ap);
    argv[argc] = NULL;
    bool quiet = !getenv("TV_TEST_VERBOSE");
    int so = -1, se = -1;
    fflush(stdout);
    fflush(stderr);
    if (quiet) {
        int fd = open(g_out_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        TV_TEST_CHECK(fd >= 0);
        so = dup(1);
        se = dup(2);
        dup2(fd, 1);
        dup2(fd, 2);
        close(fd);
    }
    int rc = tv__cli_main(argc, argv);
    fflush(stdout);
    fflush(stderr);
    if (quiet) {
        dup2(so, 1);
        dup2(se, 2);
        close(so);
        close(se);
    }
    return rc;
}

/* The last command's output (for failure messages). */
static const char *cli_output(void)
{
    static char buf[2048];
    buf[0] = '\0';
    int fd = open(g_out_path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t n = read(fd, buf, sizeof buf - 1);
        buf[n > 0 ? n : 0] = '\0';
        close(fd);
    }
    return buf;
}

/* ---- copying the prepared state ------------------------------------------------ */

/* Copies a file, keeping holes (device images are sparse). */
static void copy_file(const char *from, const char *to)
{
    int in = open(from, O_RDONLY | O_CLOEXEC);
    TV_TEST_CHECK(in >= 0);
    struct stat sb;
    TV_TEST_CHECK(fstat(in, &sb) == 0);
    int out = open(to, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, sb.st_mode & 0777);
    TV_TEST_CHECK(out >= 0);
    TV_TEST_CHECK(ftruncate(out, sb.st_size) == 0);
    static uint8_t buf[1 << 16];
    off_t pos = 0;
    while (pos < sb.st_size) {
        off_t data = lseek(in, pos, SEEK_DATA);
        if (data < 0)
            break; /* only a hole is left */
        off_t hole = lseek(in, data, SEEK_HOLE);
        TV_TEST_CHECK(hole > data);
        for (off_t o = data; o < hole;) {
            size_t want = (size_t)(hole - o) < sizeof buf ? (size_t)(hole - o) : sizeof buf;
            ssize_t n = pread(in, buf, want, o);
            TV_TEST_CHECK(n > 0);
            TV_TEST_CHECK(pwrite(out, buf, (size_t)n, o) == n);
            o += n;
        }
        pos = hole;
    }
    close(in);
    TV_TEST_CHECK(close(out) == 0);
}

static void copy_tree(const char *from, const char *to)
{
    struct stat sb;
    TV_TEST_CHECK(lstat(from, &sb) == 0);
    if (S_ISREG(sb.st_mode)) {
        copy_file(from, to);
        return;
    }
    TV_TEST_CHECK(S_ISDIR(sb.st_mode));
    TV_TEST_CHECK(mkdir(to, sb.st_mode & 0777) == 0);
    DIR *d = opendir(from);
    TV_TEST_CHECK(d != NULL);
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        char a[600], b[600];
        copy_tree(tv_test_path(a, sizeof a, "%s/%s", from, e->d_name),
                  tv_test_path(b, sizeof b, "%s/%s", to, e->d_name));
    }
    closedir(d);
}

/* W := G (or W := empty when G holds nothing). */
static void restore(void)
{
    tv_test_fault_reset();
    tv_test_rmtree(g_work);
    copy_tree(g_gold, g_work);
}

/* G := W */
static void save_gold(void)
{
    tv_test_rmtree(g_gold);
    copy_tree(g_work, g_gold);
}

/* ---- store checks --------------------------------------------------------------- */

/* Bytes in use on every device of the store (allocator accounting), after
 * checking that no 'writing' object is left; n_unref: unreferenced objects. */
static uint64_t used_bytes(size_t *n_unref)
{
    tv__store *st = NULL;
    tv_error err = {0};
    int rc = tv__store_open(g_store, 0, &st, &err);
    if (rc)
        fail_msg("reader open of the store: %s (%s)", err.msg, tv_err_name(rc));
    tv__reg_device *devs = NULL;
    size_t n_devs = 0;
    assert_int_equal(tv__reg_device_list(st->reg, &devs, &n_devs, &err), 0);
    uint64_t used = 0;
    for (size_t i = 0; i < n_devs; i++) {
        tv__alloc_space sp;
        assert_int_equal(tv__alloc_device_space(st->reg, devs[i].id, &sp, &err), 0);
        used += sp.used_len;
        tv__reg_object *o = NULL;
        size_t n = 0;
        assert_int_equal(tv__reg_objects_on_device(st->reg, devs[i].id, &o, &n, &err), 0);
        for (size_t k = 0; k < n; k++)
            if (o[k].state != TV__OBJ_COMMITTED)
                fail_msg("object %lld at %llu is still 'writing' after gc", (long long)o[k].id,
                         (unsigned long long)o[k].base_off);
        free(o);
    }
    free(devs);
    tv__reg_object *u = NULL;
    assert_int_equal(tv__reg_objects_unreferenced(st->reg, &u, n_unref, &err), 0);
    free(u);
    tv__store_close(st);
    return used;
}

/* Generations of MODEL that are ready, from the registry; *active gets the
 * active one (0: none). */
static size_t ready_gens(int64_t *gens, int64_t *active)
{
    tv__store *st = NULL;
    tv_error err = {0};
    int rc = tv__store_open(g_store, 0, &st, &err);
    if (rc)
        fail_msg("reader open of the store: %s (%s)", err.msg, tv_err_name(rc));
    tv__reg_generation *g = NULL;
    size_t n = 0, k = 0;
    *active = 0;
    if (tv__reg_generations_list(st->reg, MODEL, &g, &n, &err) == 0) {
        for (size_t i = 0; i < n; i++) {
            if (g[i].state == TV__GEN_READY && k < MAX_GENS)
                gens[k++] = g[i].number;
            if (g[i].active)
                *active = g[i].number;
        }
        free(g);
    }
    tv__store_close(st);
    return k;
}

/* ---- the commands ---------------------------------------------------------------- */

typedef struct fcase fcase;
struct fcase {
    const char *name;
    void (*prepare)(void);       /* builds the state in W, faults off */
    int (*run)(const fcase *c);  /* the command under test: 0 = success */
    int64_t prev_gen;            /* active before (must read back); 0 = none */
    const ckdef *gens[MAX_GENS]; /* content of generation 1, 2, ... */
    const char *arg;             /* import: the checkpoint directory */
    int variant;                 /* import: IMPORT_*; readers: the engine */
};

enum { IMPORT_ACTIVATE, IMPORT_PLAIN, IMPORT_REPLICAS };

static int init_store(const char *img)
{
    return cli("store", "init", "--store", g_store, "--image", img, "--size", "8M", NULL);
}

static void import_ok(const ckdef *c, bool activate, const char *replicas)
{
    char d[400];
    ck_path(c, d, sizeof d);
    int rc = replicas   ? cli("import", "--store", g_store, MODEL, d, "--activate", "--replicas",
                              replicas, NULL)
             : activate ? cli("import", "--store", g_store, MODEL, d, "--activate", NULL)
                        : cli("import", "--store", g_store, MODEL, d, NULL);
    if (rc)
        fail_msg("prepare: import %s: %s", c->dir, cli_output());
}

static void prep_empty(void)
{
}
static void prep_one(void) /* 1 device, generation 1 = A active */
{
    assert_int_equal(init_store(g_img[0]), 0);
    import_ok(&CK_A, true, NULL);
}
static void prep_two_devices(void)
{
    prep_one();
    assert_int_equal(init_store(g_img[1]), 0);
}
static void prep_ready(void) /* + generation 2 = B ready */
{
    prep_one();
    import_ok(&CK_B, false, NULL);
}
static void prep_switched(void) /* + generation 2 = B active */
{
    prep_one();
    import_ok(&CK_B, true, NULL);
}
static void prep_retired(void) /* + generation 1 retired */
{
    prep_switched();
    if (cli("retire", "--store", g_store, MODEL, "1", NULL))
        fail_msg("prepare: retire: %s", cli_output());
}

static int run_init(const fcase *c)
{
    (void)c;
    return init_store(g_img[0]);
}
static int run_import(const fcase *c)
{
    char d[400];
    tv_test_path(d, sizeof d, "%s/%s", g_root, c->arg);
    if (c->variant == IMPORT_REPLICAS)
        return cli("import", "--store", g_store, MODEL, d, "--activate", "--replicas", "1,2", NULL);
    if (c->variant == IMPORT_PLAIN)
        return cli("import", "--store", g_store, MODEL, d, NULL);
    return cli("import", "--store", g_store, MODEL, d, "--activate", NULL);
}
static int run_activate(const fcase *c)
{
    (void)c;
    return cli("activate", "--store", g_store, MODEL, "2", NULL);
}
static int run_retire(const fcase *c)
{
    (void)c;
    return cli("retire", "--store", g_store, MODEL, "1", NULL);
}
static int run_gc(const fcase *c)
{
    (void)c;
    return cli("gc", "--store", g_store, NULL);
}
static int run_verify(const fcase *c)
{
    (void)c;
    return cli("verify", "--store", g_store, NULL);
}
/* A reader: open the active generation, batch-read everything, then one by
 * one and zero-copy. Success means every byte was right. */
static int run_read(const fcase *c)
{
    tv_open_opts o = {.engine = c->variant, .queue_depth = 4, .chunk_len = 16384};
    tv_model *m = NULL;
    tv_error err = {0};
    int rc = tv_model_open(g_store, MODEL, &o, &m, &err);
    if (rc == TV_E_NOT_SUPPORTED && c->variant == TV_ENGINE_URING && !tv_test_fault_fired()) {
        g_have_uring = false;
        return 0;
    }
    if (rc)
        return rc;
    if (tv_model_generation(m) != 1)
        fail_msg("reader opened generation %lld, the active one is 1",
                 (long long)tv_model_generation(m));
    rc = check_model_bytes(m, c->gens[0], true);
    if (!rc)
        rc = check_model_bytes(m, c->gens[0], false);
    tv_model_close(m);
    return rc;
}

/* Calls whose failure a command legitimately survives, so success is right
 * (the checks after the run then prove its effect complete):
 *   - close: Linux releases the descriptor anyway, and nothing written
 *     through it is lost (every write is followed by fdatasync/fsync before
 *     close); the close of a new snapshot temp file is still checked;
 *   - writers, everything on snapshot files and pointers (snapshots/): the
 *     registry is the truth; a missing or stale snapshot or pointer is
 *     rebuilt by the next writer's open (tv__store_sync_snapshots), so
 *     import (after publish) and every writer's open only warn;
 *   - a short pread, pwrite or engine read: every transfer loop (util/sys.c
 *     helpers, the engines, engine.h) asks again for the rest, so the
 *     command succeeds with every byte moved.
 * Returns true when a fault of kind (short: a short transfer) on path may
 * leave the command successful. */
static bool tolerated(const fcase *c, int kind, bool is_short, const char *path)
{
    bool snap = strstr(path, "/snapshots") != NULL;
    bool writer = c->run != run_read && c->run != run_verify;
    if (kind == TV_TEST_SYS_CLOSE && !strstr(path, "/.tmp"))
        return true;
    if (snap && writer)
        return true;
    if (!writer && kind == TV_TEST_SYS_FSTAT && strstr(path, ".tvsnap"))
        return true; /* still_linked() fails: the open is retried (tv__snapfile_open) */
    if (is_short)
        return true; /* every transfer loop (util/sys.c, the engines) takes the rest */
    return false;
}

/* ---- the driver ---------------------------------------------------------------------- */

typedef struct stats {
    long runs, failed, tolerated, not_reached;
} stats;

/* After a run (failed or not): the store opens and verifies, every
 * generation the registry calls ready reads back identical (the previously
 * active one always), and gc leaves no leak. */
static void check_after(const fcase *c, uint64_t used_before, uint64_t used_after, int kind,
                        long nth, int err, int cmd_rc, const char *path)
{
    char what[800];
    snprintf(what, sizeof what, "%s, %s #%ld %s on '%s'", c->name, tv_test_sys_name(kind), nth,
             err ? strerror(err) : "short", path);
    if (c->run == run_init) {
        /* A failed init leaves nothing behind (neither the store directory
         * nor the image existed before it); a tolerated one made a store
         * that verifies. Either way a retry on the same paths works. */
        if (cmd_rc && (access(g_store, F_OK) == 0 || access(g_img[0], F_OK) == 0)) {
            char left[512] = "";
            DIR *dd = opendir(g_store);
            for (struct dirent *de; dd && (de = readdir(dd));)
                if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
                    snprintf(left + strlen(left), sizeof left - strlen(left), " %s", de->d_name);
            if (dd)
                closedir(dd);
            fail_msg("%s: failed init left %s behind (holding:%s)", what,
                     access(g_store, F_OK) == 0 ? g_store : g_img[0], left);
        }
        if (!cmd_rc && cli("verify", "--store", g_store, NULL))
            fail_msg("%s: init succeeded but verify fails: %s", what, cli_output());
        tv_test_rmtree(g_store);
        unlink(g_img[0]);
        if (init_store(g_img[0]))
            fail_msg("%s: retrying init failed: %s", what, cli_output());
        return;
    }
    if (cli("verify", "--store", g_store, NULL))
        fail_msg("%s: verify fails afterwards: %s", what, cli_output());
    char spec[64];
    if (c->prev_gen) {
        snprintf(spec, sizeof spec, "%s@%lld", MODEL, (long long)c->prev_gen);
        assert_reads_back(spec, c->gens[c->prev_gen - 1]);
    }
    if (cli("gc", "--store", g_store, NULL))
        fail_msg("%s: gc fails afterwards: %s", what, cli_output());
    /* After the next writer (it rebuilds missing snapshots), every ready
     * generation opens and reads back. */
    int64_t gens[MAX_GENS], active = 0;
    size_t n = ready_gens(gens, &active);
    for (size_t i = 0; i < n; i++) {
        snprintf(spec, sizeof spec, "%s@%lld", MODEL, (long long)gens[i]);
        assert_reads_back(spec, c->gens[gens[i] - 1]);
    }
    /* ... and readers open the generation the registry calls active. */
    tv_open_opts o = {.engine = TV_ENGINE_PREAD, .no_direct = true};
    tv_model *m = NULL;
    tv_error e = {0};
    int rc = tv_model_open(g_store, MODEL, &o, &m, &e);
    if (rc)
        fail_msg("%s: reader open of the active generation %lld: %s", what, (long long)active,
                 e.msg);
    if (tv_model_generation(m) != active)
        fail_msg("%s: after gc readers open generation %lld, the registry's active one is %lld",
                 what, (long long)tv_model_generation(m), (long long)active);
    tv_model_close(m);
    size_t n_unref = 0;
    uint64_t used = used_bytes(&n_unref);
    if (n_unref)
        fail_msg("%s: %zu unreferenced objects left after gc", what, n_unref);
    if (used != used_before && used != used_after)
        fail_msg("%s: %llu bytes in use after gc, expected %llu (before) or %llu (after a clean "
                 "run): an extent leaked",
                 what, (unsigned long long)used, (unsigned long long)used_before,
                 (unsigned long long)used_after);
}

static void run_case(const fcase *c)
{
    stats s = {0};
    /* The prepared state. */
    tv_test_fault_reset();
    tv_test_rmtree(g_work);
    TV_TEST_CHECK(mkdir(g_work, 0700) == 0);
    c->prepare();
    save_gold();
    bool init = c->run == run_init;
    uint64_t used_before = 0, used_after = 0;
    size_t n_unref;
    if (!init) {
        TV_TEST_CHECK(cli("gc", "--store", g_store, NULL) == 0);
        used_before = used_bytes(&n_unref);
        restore();
    }
    /* The counting run. */
    tv_test_fault_install();
    int rc = c->run(c);
    long count[TV_TEST_SYS_N];
    for (int k = 0; k < TV_TEST_SYS_N; k++)
        count[k] = tv_test_fault_count(k);
    tv_test_fault_reset();
    if (rc)
        fail_msg("%s: clean run failed (%s): %s", c->name, tv_err_name(rc), cli_output());
    if (c->run == run_read && c->variant == TV_ENGINE_URING && !g_have_uring) {
        printf("%s: io_uring unavailable here, case not run\n", c->name);
        return;
    }
    if (!init) {
        TV_TEST_CHECK(cli("gc", "--store", g_store, NULL) == 0);
        used_after = used_bytes(&n_unref);
    }
    long total = 0;
    for (int k = 0; k < TV_TEST_SYS_N; k++)
        total += count[k];
    assert_true(total > 0);
    assert_true(total < 2000); /* bounded: small checkpoints */

    /* One run per call and way of failing. */
    for (int k = 0; k < TV_TEST_SYS_N; k++) {
        bool rw = k == TV_TEST_SYS_PREAD || k == TV_TEST_SYS_PWRITE || k == TV_TEST_SYS_IO_READ;
        bool wr = k == TV_TEST_SYS_PWRITE || k == TV_TEST_SYS_FSYNC || k == TV_TEST_SYS_FDATASYNC ||
                  k == TV_TEST_SYS_FTRUNCATE;
        int errs[2] = {wr ? ENOSPC : EIO, 0};
        for (long j = 1; j <= count[k]; j++) {
            for (int v = 0; v < (rw ? 2 : 1); v++) {
                restore();
                tv_test_fault_install();
                tv_test_fault_fail(k, j, errs[v], false);
                rc = c->run(c);
                long fired = tv_test_fault_fired();
                char path[512];
                snprintf(path, sizeof path, "%s", tv_test_fault_last_path());
                tv_test_fault_reset();
                s.runs++;
                if (!fired) {
                    s.not_reached++; /* threads made this run take fewer calls */
                    continue;
                }
                if (rc == 0) {
                    s.tolerated++;
                    if (!tolerated(c, k, errs[v] == 0, path))
                        fail_msg("%s: %s #%ld (%s) on '%s' failed but the command succeeded",
                                 c->name, tv_test_sys_name(k), j,
                                 errs[v] ? strerror(errs[v]) : "short", path);
                } else {
                    s.failed++;
                }
                check_after(c, used_before, used_after, k, j, errs[v], rc, path);
            }
        }
    }
    printf("%s: %ld calls counted (", c->name, total);
    for (int k = 0; k < TV_TEST_SYS_N; k++)
        if (count[k])
            printf(" %s %ld", tv_test_sys_name(k), count[k]);
    printf(" ); %ld runs: %ld failed cleanly, %ld tolerated, %ld not reached\n", s.runs, s.failed,
           s.tolerated, s.not_reached);
    assert_true(s.not_reached * 4 <= s.runs); /* the injection really hit */
}

/* ---- tests ----------------------------------------------------------------------------- */

#define GENS(...)                                                                                  \
    {                                                                                              \
        __VA_ARGS__                                                                                \
    }

static void test_init(void **state)
{
    (void)state;
    fcase c = {"store init", prep_empty, run_init, 0, GENS(NULL), NULL, 0};
    run_case(&c);
}

static void test_import_single(void **state)
{
    (void)state;
    fcase c = {"import single file", prep_one, run_import, 1, GENS(&CK_A, &CK_C), "ck_c", 0};
    run_case(&c);
}

static void test_import_sharded(void **state)
{
    (void)state;
    fcase c = {"import 2 shards", prep_one, run_import, 1, GENS(&CK_A, &CK_B), "ck_b", 0};
    run_case(&c);
}

static void test_import_replicas(void **state)
{
    (void)state;
    fcase c = {"import 2 shards --replicas 1,2",
               prep_two_devices,
               run_import,
               1,
               GENS(&CK_A, &CK_B),
               "ck_b",
               2};
    run_case(&c);
}

static void test_import_dedup(void **state)
{
    (void)state;
    fcase c = {"import dedup hit", prep_one, run_import, 1, GENS(&CK_A, &CK_A), "ck_a", 0};
    run_case(&c);
}

static void test_activate(void **state)
{
    (void)state;
    fcase c = {"activate", prep_ready, run_activate, 1, GENS(&CK_A, &CK_B), NULL, 0};
    run_case(&c);
}

static void test_retire(void **state)
{
    (void)state;
    fcase c = {"retire", prep_switched, run_retire, 2, GENS(&CK_A, &CK_B), NULL, 0};
    run_case(&c);
}

static void test_gc(void **state)
{
    (void)state;
    fcase c = {"gc", prep_retired, run_gc, 2, GENS(&CK_A, &CK_B), NULL, 0};
    run_case(&c);
}

static void test_verify(void **state)
{
    (void)state;
    fcase c = {"verify", prep_ready, run_verify, 1, GENS(&CK_A, &CK_B), NULL, 0};
    run_case(&c);
}

static void test_read_pread(void **state)
{
    (void)state;
    fcase c = {"reader (pread engine)", prep_ready, run_read,       1,
               GENS(&CK_A, &CK_B),      NULL,       TV_ENGINE_PREAD};
    run_case(&c);
}

static void test_read_uring(void **state)
{
    (void)state;
    fcase c = {"reader (io_uring engine)", prep_ready, run_read,       1,
               GENS(&CK_A, &CK_B),         NULL,       TV_ENGINE_URING};
    run_case(&c);
}

static int setup_all(void **state)
{
    (void)state;
    /* tmpfs when TMPDIR is not set: hundreds of runs of fsync-heavy commands
     * (the failures are injected; real durability is not what this tests). */
    if (!getenv("TMPDIR") && access("/dev/shm", W_OK | X_OK) == 0)
        setenv("TMPDIR", "/dev/shm", 1);
    tv_test_tmpdir(g_root, sizeof g_root, "faults");
    tv_test_path(g_work, sizeof g_work, "%s/w", g_root);
    tv_test_path(g_gold, sizeof g_gold, "%s/g", g_root);
    tv_test_path(g_store, sizeof g_store, "%s/store", g_work);
    tv_test_path(g_img[0], sizeof g_img[0], "%s/img1", g_work);
    tv_test_path(g_img[1], sizeof g_img[1], "%s/img2", g_work);
    tv_test_path(g_out_path, sizeof g_out_path, "%s/cmd.out", g_root);
    write_ck(&CK_A);
    write_ck(&CK_B);
    write_ck(&CK_C);
    setenv("TENSORVAULT_LOG", "error", 1);
    return 0;
}

static int teardown_all(void **state)
{
    (void)state;
    tv_test_fault_reset();
    tv_test_rmtree(g_root);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_init),           cmocka_unit_test(test_import_single),
        cmocka_unit_test(test_import_sharded), cmocka_unit_test(test_import_replicas),
        cmocka_unit_test(test_import_dedup),   cmocka_unit_test(test_activate),
        cmocka_unit_test(test_retire),         cmocka_unit_test(test_gc),
        cmocka_unit_test(test_verify),         cmocka_unit_test(test_read_pread),
        cmocka_unit_test(test_read_uring),
    };
    return cmocka_run_group_tests(tests, setup_all, teardown_all);
}
