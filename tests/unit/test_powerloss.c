/* Power loss at every sync point of every writer command, with the harness
 * of powerloss.h: the writes since each file's last successful sync and the
 * directory entries since their directory's last fsync are dropped, SQLite
 * test6.c-style, and the command dies on the spot. (Alias moves do not
 * exist yet; when they do, they get a sweep like activate's.)
 *
 * For each command (import of a 2-shard checkpoint with and without
 * --activate, into an empty store, and one whose shards are all already
 * stored; activate of an older generation; retire; gc with two objects to
 * free) a clean run in a child counts its K sync points; then for every
 * k in 1..K, and once after the command returned (its unsynced writes
 * dropped), a fresh copy of the "before" store runs the command with the
 * power cut at k, and the parent checks:
 *   1. before any repair, a reader (tv_model_open) opens the model and reads
 *      back byte-identical the generation active before the command or the
 *      one active after it (where pointer and registry disagree, the
 *      writer's repair settles it in a documented direction, and never
 *      takes back a generation readers have already been opening); a
 *      snapshot file exists only for a ready or retired generation whose
 *      shards all have committed objects (checked again after the repair);
 *   2. the store opens as a writer (repairing), holds no 'writing' object,
 *      and every committed object passes verify;
 *   3. the registry is exactly in the state before the command or after it,
 *      or in the one documented state between (gc: some objects freed;
 *      import --activate: the generation imported, the activation not
 *      done), never going back as k grows; it moves only at an xSync of
 *      the registry or at the directory fsync that makes a new active
 *      pointer durable, and a command that returned success is durable;
 *   4. the reader's active generation is the registry's, and every ready
 *      generation reads back byte-identical to its checkpoint;
 *   5. after the next writer command (gc) no space leaks: every object on
 *      the device is committed and bound to a ready generation, the
 *      allocator's used space is exactly theirs, no snapshot file is left
 *      for a generation that is not readable and no temporary file remains.
 * Every cut is run twice: once dropping every unsynced write, once keeping a
 * random subset of the unsynced sectors (test6.c's model; the registry may
 * then be ahead of the first run's state, never behind it).
 * The CLI subcommands run in the children exactly as the binary runs them. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <sqlite3.h>

#include "cli/cli.h"
#include "import/alloc.h"
#include "import/import.h"
#include "store/store.h"
#include "powerloss.h"
#include "tv_test.h"
#include "registry/registry.h"
#include "snap/snapfile.h"
#include "tensorvault/tensorvault.h"
#include "util/internal.h"
#include "util/sys.h"

#define MODEL     "m"
#define IMAGE_LEN "2M"
#define MAX_T     4

/* ---- checkpoints ---------------------------------------------------------- */

typedef tv_test_tensor tdesc;

typedef struct ckpt {
    char index[512];
    size_t n;
    char names[MAX_T][32];
    uint8_t *data[MAX_T];
    size_t len[MAX_T];
} ckpt;

static const tdesc SHARD1[] = {{"layers.0.w", "F32", 700, 4}, {"layers.0.b", "U8", 13, 1}};
static const tdesc SHARD2[] = {{"head.w", "BF16", 900, 2}};

/* Writes a safetensors file (tv_test_write_shard) and keeps each tensor's
 * bytes, as read back from the file, in ck. */
static void write_shard(ckpt *ck, const char *path, const tdesc *t, size_t n, unsigned seed)
{
    uint64_t file_len = tv_test_write_shard(path, t, n, seed);
    size_t got = 0;
    uint8_t *buf = tv_test_read_file(path, &got);
    assert_non_null(buf);
    assert_int_equal(got, file_len);
    uint64_t off = 8;
    for (int i = 0; i < 8; i++)
        off += (uint64_t)buf[i] << (8 * i);
    for (size_t i = 0; i < n; i++) {
        size_t k = ck->n++;
        assert_true(k < MAX_T);
        snprintf(ck->names[k], sizeof ck->names[k], "%s", t[i].name);
        ck->len[k] = t[i].n_elems * t[i].elem_len;
        assert_true(off + ck->len[k] <= file_len);
        ck->data[k] = malloc(ck->len[k]);
        assert_non_null(ck->data[k]);
        memcpy(ck->data[k], buf + off, ck->len[k]);
        off += ck->len[k];
    }
    free(buf);
}

static void make_ckpt(ckpt *ck, const char *dir, unsigned seed)
{
    char p[512];
    assert_int_equal(mkdir(dir, 0700), 0);
    snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", dir);
    write_shard(ck, p, SHARD1, 2, seed);
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", dir);
    write_shard(ck, p, SHARD2, 1, seed + 1);
    snprintf(ck->index, sizeof ck->index, "%s/model.safetensors.index.json", dir);
    tv_test_write_text(ck->index, "{\"metadata\":{},\"weight_map\":{"
                                  "\"layers.0.w\":\"model-00001-of-00002.safetensors\","
                                  "\"layers.0.b\":\"model-00001-of-00002.safetensors\","
                                  "\"head.w\":\"model-00002-of-00002.safetensors\"}}");
}

/* ---- the fixture: one temporary directory, saved "before" states ---------- */

/* Saved states: an empty store; gen 1 = A active; + gen 2 = B active; and
 * gen 1 retired. Generation 3 exists only in the dedup case (A again). */
enum { ST_EMPTY, ST_A, ST_AB, ST_AB_RETIRED, N_STATES };
static const int GEN_CK[4] = {-1, 0, 1, 0};

static struct {
    char dir[256];
    char store[512];
    char image[512];
    char saved[N_STATES][512];
    ckpt ck[2]; /* generation 1 = ck[0], generation 2 = ck[1] */
    tv_pl_trace *trace, *clean;
    char ctx[256]; /* what the current case is, for failure messages */
} F;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            char m_[4096];                                                                         \
            snprintf(m_, sizeof m_, __VA_ARGS__);                                                  \
            fail_msg("%s: %s (%s)", F.ctx, m_, #cond);                                             \
        }                                                                                          \
    } while (0)

/* Copies a file, leaving all-zero 64 KiB blocks as holes. */
static void copy_file(const char *from, const char *to, mode_t mode)
{
    static uint8_t buf[64 * 1024], zero[64 * 1024];
    int in = open(from, O_RDONLY | O_CLOEXEC);
    assert_true(in >= 0);
    int out = open(to, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode & 0777);
    assert_true(out >= 0);
    off_t off = 0;
    ssize_t n;
    while ((n = read(in, buf, sizeof buf)) > 0) {
        if ((size_t)n != sizeof buf || memcmp(buf, zero, sizeof buf) != 0)
            assert_int_equal(pwrite(out, buf, (size_t)n, off), n);
        off += n;
    }
    assert_int_equal(n, 0);
    assert_int_equal(ftruncate(out, off), 0);
    close(in);
    close(out);
}

static void copy_tree(const char *from, const char *to)
{
    struct stat sb;
    assert_int_equal(stat(from, &sb), 0);
    assert_int_equal(mkdir(to, sb.st_mode & 0777), 0);
    DIR *d = opendir(from);
    assert_non_null(d);
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        char a[1024], b[1024];
        snprintf(a, sizeof a, "%s/%s", from, e->d_name);
        snprintf(b, sizeof b, "%s/%s", to, e->d_name);
        assert_int_equal(lstat(a, &sb), 0);
        if (S_ISDIR(sb.st_mode))
            copy_tree(a, b);
        else if (S_ISREG(sb.st_mode))
            copy_file(a, b, sb.st_mode);
    }
    closedir(d);
}

static void save_state(int s)
{
    char p[600];
    tv_test_rmtree(F.saved[s]);
    assert_int_equal(mkdir(F.saved[s], 0700), 0);
    snprintf(p, sizeof p, "%s/store", F.saved[s]);
    copy_tree(F.store, p);
    snprintf(p, sizeof p, "%s/image", F.saved[s]);
    copy_file(F.image, p, 0600);
}

/* The store and its image back in saved state s, at the same paths (the
 * registry names the image by path). */
static void restore_state(int s)
{
    char p[600];
    tv_test_rmtree(F.store);
    snprintf(p, sizeof p, "%s/store", F.saved[s]);
    copy_tree(p, F.store);
    snprintf(p, sizeof p, "%s/image", F.saved[s]);
    copy_file(p, F.image, 0600);
}

/* ---- commands (run in the children) ----------------------------------------- */

typedef struct pl_cmd {
    const char *label;
    int before; /* saved state it starts from */
    int argc;
    char *argv[10]; /* from the command word on */
} pl_cmd;

static int run_cmd(void *ctx)
{
    pl_cmd *c = ctx;
    char *argv[1 + TV_ARRAY_LEN(c->argv)] = {"tensorvault"};
    memcpy(argv + 1, c->argv, sizeof(c->argv));
    return tv__cli_main(c->argc + 1, argv);
}

static void run_clean(pl_cmd *c)
{
    int rc = tv_pl_run(run_cmd, c, TV_PL_COUNT, F.trace);
    CHECK(rc == 0, "%s exited with %d (TV_PL_VERBOSE=1 shows its output)", c->argv[0], rc);
}

static pl_cmd cmd_import(bool activate, int gen_ck)
{
    pl_cmd c = {.argc = 0};
    c.argv[c.argc++] = "import";
    c.argv[c.argc++] = "--store";
    c.argv[c.argc++] = F.store;
    c.argv[c.argc++] = MODEL;
    c.argv[c.argc++] = F.ck[gen_ck].index;
    c.argv[c.argc++] = "--chunk";
    c.argv[c.argc++] = "64K";
    if (activate)
        c.argv[c.argc++] = "--activate";
    return c;
}

static pl_cmd cmd_gen(char *name, char *gen)
{
    pl_cmd c = {.argc = 5, .argv = {name, "--store", F.store, MODEL, gen}};
    return c;
}

static pl_cmd cmd_gc(void)
{
    pl_cmd c = {.argc = 3, .argv = {"gc", "--store", F.store}};
    return c;
}

/* ---- inspection (parent) ------------------------------------------------------ */

static tv__store *open_store(unsigned flags)
{
    tv_error err = {0};
    tv__store *st = NULL;
    int rc = tv__store_open(F.store, flags, &st, &err);
    CHECK(rc == 0, "store open%s: %s: %s", flags ? " as writer" : "", tv_err_name(rc), err.msg);
    return st;
}

static int64_t device_id(tv__store *st)
{
    tv_error err = {0};
    tv__reg_device *d = NULL;
    size_t n = 0;
    assert_int_equal(tv__reg_device_list(st->reg, &d, &n, &err), 0);
    assert_int_equal(n, 1);
    int64_t id = d[0].id;
    free(d);
    return id;
}

/* The model's generations; none when the model does not exist yet. */
static void list_gens(tv__store *st, tv__reg_generation **g, size_t *n)
{
    tv_error err = {0};
    int rc = tv__reg_generations_list(st->reg, MODEL, g, n, &err);
    if (rc == TV_E_NOT_FOUND) {
        *g = NULL;
        *n = 0;
        return;
    }
    CHECK(rc == 0, "generations: %s: %s", tv_err_name(rc), err.msg);
}

typedef struct view {
    char gens[128]; /* "1:ready* 2:ready" (* = active) */
    int64_t active;
    size_t n_objects; /* committed objects on the device */
    size_t n_writing;
} view;

static void registry_view(tv__store *st, view *v)
{
    tv_error err = {0};
    memset(v, 0, sizeof *v);
    tv__reg_generation *g = NULL;
    size_t n = 0;
    int rc;
    list_gens(st, &g, &n);
    size_t l = 0;
    for (size_t i = 0; i < n; i++) {
        l += (size_t)snprintf(v->gens + l, sizeof v->gens - l, "%s%" PRId64 ":%s%s", i ? " " : "",
                              g[i].number, tv__gen_state_name(g[i].state), g[i].active ? "*" : "");
        if (g[i].active)
            v->active = g[i].number;
    }
    free(g);
    tv__reg_object *o = NULL;
    rc = tv__reg_objects_on_device(st->reg, device_id(st), &o, &n, &err);
    CHECK(rc == 0, "objects: %s", err.msg);
    for (size_t i = 0; i < n; i++) {
        if (o[i].state == TV__OBJ_COMMITTED)
            v->n_objects++;
        else
            v->n_writing++;
    }
    free(o);
}

/* Opens spec through the public reader and compares every tensor with the
 * checkpoint of the generation it opened. Returns that generation, or 0
 * when the reader refuses with TV_E_NOT_FOUND and may_be_missing. */
static int64_t read_back(const char *spec, bool may_be_missing)
{
    tv_error err = {0};
    tv_model *m = NULL;
    tv_open_opts o = {.engine = TV_ENGINE_PREAD, .n_threads = 1, .no_direct = true};
    int rc = tv_model_open(F.store, spec, &o, &m, &err);
    if (rc == TV_E_NOT_FOUND && may_be_missing)
        return 0;
    CHECK(rc == 0, "reader open %s: %s: %s", spec, tv_err_name(rc), err.msg);
    int64_t gen = tv_model_generation(m);
    CHECK(gen >= 1 && gen <= 3, "reader opened generation %" PRId64, gen);
    const ckpt *ck = &F.ck[GEN_CK[gen]];
    CHECK(tv_model_n_tensors(m) == ck->n, "generation %" PRId64 ": %zu tensors", gen,
          tv_model_n_tensors(m));
    for (size_t i = 0; i < ck->n; i++) {
        uint8_t buf[4096];
        assert_true(ck->len[i] <= sizeof buf);
        memset(buf, 0xa5, sizeof buf);
        rc = tv_read_into(m, ck->names[i], buf, sizeof buf, &err);
        CHECK(rc == 0, "read %s@%" PRId64 " %s: %s: %s", MODEL, gen, ck->names[i], tv_err_name(rc),
              err.msg);
        CHECK(memcmp(buf, ck->data[i], ck->len[i]) == 0, "%s@%" PRId64 " tensor %s differs", MODEL,
              gen, ck->names[i]);
    }
    tv_model_close(m);
    return gen;
}

/* A snapshot file is what readers trust: one may exist only for a ready
 * or retired generation whose every shard is bound to committed objects
 * (a file naming freed extents would read whatever reuses them). */
static void check_snapshot_files(tv__store *st)
{
    tv_error err = {0};
    tv__reg_generation *g = NULL;
    size_t n = 0;
    list_gens(st, &g, &n);
    for (int64_t num = 1; num <= 3; num++) {
        bool exists = false;
        assert_int_equal(tv__snapfile_exists(F.store, MODEL, num, &exists, &err), 0);
        if (!exists)
            continue;
        const tv__reg_generation *gen = NULL;
        for (size_t i = 0; i < n; i++)
            if (g[i].number == num)
                gen = &g[i];
        CHECK(gen && (gen->state == TV__GEN_READY || gen->state == TV__GEN_RETIRED),
              "a snapshot file of generation %" PRId64 " exists, the registry has it %s", num,
              gen ? tv__gen_state_name(gen->state) : "not at all");
        tv__reg_manifest *m = NULL;
        assert_int_equal(tv__reg_tensors_list(st->reg, gen->id, &m, &err), 0);
        for (size_t sh = 0; sh < m->n_shards; sh++) {
            bool ok = m->shards[sh].n_replicas > 0;
            for (size_t r = 0; r < m->shards[sh].n_replicas; r++) {
                tv__reg_object o;
                ok =
                    ok && m->shards[sh].replicas[r].committed &&
                    tv__reg_object_get(st->reg, m->shards[sh].replicas[r].object_id, &o, &err) == 0;
            }
            CHECK(ok,
                  "generation %" PRId64
                  " has a snapshot file but shard %zu has no committed object",
                  num, sh);
        }
        tv__reg_manifest_free(m);
    }
    free(g);
}

/* Step 2: the writer open repairs; nothing half-written survives it and
 * every committed object verifies. */
static void writer_open_and_verify(view *v)
{
    tv__store *st = open_store(TV__STORE_WRITE);
    registry_view(st, v);
    CHECK(v->n_writing == 0, "%zu 'writing' objects after the writer open", v->n_writing);
    tv_error err = {0};
    tv__reg_object *o = NULL;
    size_t n = 0;
    assert_int_equal(tv__reg_objects_list_committed(st->reg, 0, &o, &n, &err), 0);
    for (size_t i = 0; i < n; i++) {
        int rc = tv__verify_object(st, &o[i], &err);
        CHECK(rc == 0, "verify object %" PRId64 ": %s: %s", o[i].id, tv_err_name(rc), err.msg);
    }
    free(o);
    tv__store_close(st);
}

/* Step 4: readers agree with the registry; every ready generation reads
 * back identical. */
static void check_readers(const view *v)
{
    int64_t got = read_back(MODEL, v->active == 0);
    CHECK(got == v->active, "reader opened generation %" PRId64 ", registry's active is %" PRId64,
          got, v->active);
    tv__store *st = open_store(0);
    tv__reg_generation *g = NULL;
    size_t n = 0;
    check_snapshot_files(st);
    list_gens(st, &g, &n);
    tv__store_close(st);
    for (size_t i = 0; i < n; i++) {
        if (g[i].state != TV__GEN_READY)
            continue;
        char spec[64];
        snprintf(spec, sizeof spec, "%s@%" PRId64, MODEL, g[i].number);
        CHECK(read_back(spec, false) == g[i].number, "%s opened another generation", spec);
    }
    free(g);
}

static bool in_list(const int64_t *ids, size_t n, int64_t id)
{
    for (size_t i = 0; i < n; i++)
        if (ids[i] == id)
            return true;
    return false;
}

/* Step 5, after the next gc: no leaked extent, snapshot or temporary file. */
static void check_no_leak(void)
{
    tv_error err = {0};
    tv__store *st = open_store(0);
    int64_t dev = device_id(st);
    tv__reg_generation *g = NULL;
    size_t n_g = 0;
    list_gens(st, &g, &n_g);
    int64_t live[16];
    size_t n_live = 0;
    uint64_t live_len = 0;
    for (size_t i = 0; i < n_g; i++) {
        char p[1024];
        bool has_snap = false;
        assert_int_equal(tv__snapfile_path(F.store, MODEL, g[i].number, p, sizeof p, &err), 0);
        has_snap = access(p, F_OK) == 0;
        if (g[i].state != TV__GEN_READY) {
            /* gc ran: a retired generation's objects are gone, and so must its snapshot */
            CHECK(!has_snap, "generation %" PRId64 " (%s) still has a snapshot file after gc",
                  g[i].number, tv__gen_state_name(g[i].state));
            continue;
        }
        CHECK(has_snap, "ready generation %" PRId64 " has no snapshot file", g[i].number);
        tv__reg_manifest *m = NULL;
        assert_int_equal(tv__reg_tensors_list(st->reg, g[i].id, &m, &err), 0);
        for (size_t s = 0; s < m->n_shards; s++)
            for (size_t r = 0; r < m->shards[s].n_replicas; r++) {
                const tv__reg_replica *rp = &m->shards[s].replicas[r];
                CHECK(rp->committed, "generation %" PRId64 " binds an uncommitted object",
                      g[i].number);
                if (!in_list(live, n_live, rp->object_id)) {
                    assert_true(n_live < 16);
                    live[n_live++] = rp->object_id;
                    live_len += rp->alloc_len;
                }
            }
        tv__reg_manifest_free(m);
    }
    free(g);
    tv__reg_object *o = NULL;
    size_t n = 0;
    assert_int_equal(tv__reg_objects_on_device(st->reg, dev, &o, &n, &err), 0);
    for (size_t i = 0; i < n; i++) {
        CHECK(o[i].state == TV__OBJ_COMMITTED, "object %" PRId64 " still 'writing' after gc",
              o[i].id);
        CHECK(in_list(live, n_live, o[i].id),
              "object %" PRId64 " (%" PRIu64 " bytes at %" PRIu64 ") leaked: no ready generation "
              "binds it after gc",
              o[i].id, o[i].alloc_len, o[i].base_off);
    }
    CHECK(n == n_live, "%zu objects on the device, %zu bound to ready generations", n, n_live);
    free(o);
    assert_int_equal(tv__reg_objects_unreferenced(st->reg, &o, &n, &err), 0);
    free(o);
    CHECK(n == 0, "%zu unreferenced objects after gc", n);
    tv__alloc_space sp;
    assert_int_equal(tv__alloc_device_space(st->reg, dev, &sp, &err), 0);
    CHECK(sp.used_len == live_len && sp.n_used == n_live,
          "allocator: %" PRIu64 " bytes in %zu extents used, live objects hold %" PRIu64
          " bytes in %zu",
          sp.used_len, sp.n_used, live_len, n_live);
    tv__store_close(st);

    char md[1024];
    assert_int_equal(tv__snapfile_model_dir(F.store, MODEL, md, sizeof md, &err), 0);
    DIR *d = opendir(md);
    if (!d && errno == ENOENT && n_g == 0)
        return; /* no model: no snapshot directory either */
    CHECK(d != NULL, "no snapshot directory %s", md);
    struct dirent *e;
    while ((e = readdir(d)))
        CHECK(strncmp(e->d_name, TV__SNAPFILE_TMP_PREFIX, strlen(TV__SNAPFILE_TMP_PREFIX)) != 0,
              "temporary file %s left in %s", e->d_name, md);
    closedir(d);
}

/* ---- the sweep ------------------------------------------------------------------ */

/* The same generations in the same states, whichever is active. */
static bool same_gens_but_active(const char *a, const char *b)
{
    for (; *a || *b; a++, b++) {
        a += *a == '*';
        b += *b == '*';
        if (*a != *b)
            return false;
        if (!*a)
            break;
    }
    return true;
}

static bool same_view(const view *a, const view *b)
{
    return !strcmp(a->gens, b->gens) && a->n_objects == b->n_objects;
}

static const char *sync_desc(const tv_pl_trace *t, int k, char *buf, size_t len)
{
    if (k < 1 || k > t->n_syncs || k > TV_PL_MAX_SYNCS)
        snprintf(buf, len, "none");
    else
        snprintf(buf, len, "#%d %s %s%s%s", k, t->sync[k - 1].op, t->sync[k - 1].file,
                 t->sync[k - 1].after[0] ? " after crash point " : "", t->sync[k - 1].after);
    return buf;
}

/* Where a command's change can become durable: an xSync of the registry,
 * or the fsync of the model's snapshot directory that makes a renamed
 * active pointer durable (an activation the writer's repair completes
 * from the pointer). */
static bool is_commit_sync(const tv_pl_sync *s)
{
    return (!strcmp(s->op, "xSync") && strstr(s->file, "registry.db") != NULL) ||
           (!strcmp(s->op, "fsync") && !strcmp(s->file, TV__SNAPFILE_DIR "/" MODEL));
}

/* Restores c's "before" state, runs c with the power cut at k (K + 1:
 * after its end), then checks steps 1, 2, 4 and 5 and returns the state the
 * registry is in (0 before, 2 after, 1 in between: gc freed some objects). */
static int cut_and_check(pl_cmd *c, int k, int K, const view *before, const view *after,
                         uint64_t seed, int *reverted)
{
    view v;
    char d1[200], d2[200];
    int cut = k <= K ? k : TV_PL_AT_END;
    snprintf(F.ctx, sizeof F.ctx, "%s: power loss %s %s, %s", c->label,
             k <= K ? "at sync" : "after the end; last sync",
             sync_desc(F.clean, k <= K ? k : K, d1, sizeof d1),
             seed ? "random unsynced sectors kept" : "every unsynced write dropped");
    if (seed)
        snprintf(F.ctx + strlen(F.ctx), sizeof F.ctx - strlen(F.ctx), " (seed %" PRIu64 ")", seed);
    restore_state(c->before);
    tv_pl_keep_random(seed);
    int rc = tv_pl_run(run_cmd, c, cut, F.trace);
    tv_pl_keep_random(0);
    CHECK(rc == TV_PL_CUT,
          "the child was not cut (it returned %d after %d syncs; TV_PL_VERBOSE=1 shows its output)",
          rc, F.trace->n_syncs);
    CHECK(k > K || !strcmp(F.trace->sync[k - 1].op, F.clean->sync[k - 1].op),
          "sync points differ from the clean run's: %s", sync_desc(F.trace, k, d2, sizeof d2));
    *reverted += F.trace->n_reverted;

    /* 1. before any repair */
    tv__store *st = open_store(0);
    registry_view(st, &v);
    check_snapshot_files(st);
    tv__store_close(st);
    int64_t g = read_back(MODEL, before->active == 0);
    CHECK(g == before->active || g == after->active,
          "before repair the reader opens generation %" PRId64 ", neither the one active before "
          "the command (%" PRId64 ") nor after it (%" PRId64 "); the registry has %" PRId64,
          g, before->active, after->active, v.active);
    int64_t pre_registry = v.active;

    /* 2. writer open, verify */
    writer_open_and_verify(&v);
    CHECK(g == pre_registry || v.active == pre_registry || v.active == g,
          "pointer (%" PRId64 ") and registry (%" PRId64 ") disagreed; the repair chose %" PRId64,
          g, pre_registry, v.active);
    CHECK(g != after->active || g == before->active || v.active == g,
          "readers were opening generation %" PRId64 " before the repair, which took it back "
          "to %" PRId64,
          g, v.active);

    /* 3 (the caller checks the order): before, after, or (gc) in between */
    int state = -1;
    if (same_view(&v, before))
        state = 0;
    else if (same_view(&v, after))
        state = 2;
    else if (!strcmp(v.gens, before->gens) && !strcmp(v.gens, after->gens) &&
             ((v.n_objects > after->n_objects && v.n_objects < before->n_objects) ||
              (v.n_objects < after->n_objects && v.n_objects > before->n_objects)))
        state = 1;
    else if (v.n_objects == after->n_objects && v.active == before->active &&
             same_gens_but_active(v.gens, after->gens))
        state = 1; /* import --activate: imported, activation not done */
    CHECK(state >= 0,
          "registry in neither the state before (%s, %zu objects) nor after (%s, "
          "%zu objects) the command: %s, %zu objects",
          before->gens, before->n_objects, after->gens, after->n_objects, v.gens, v.n_objects);

    /* 4. readers agree */
    check_readers(&v);

    /* 5. the next writer command; nothing leaks */
    pl_cmd gc = cmd_gc();
    rc = tv_pl_run(run_cmd, &gc, TV_PL_COUNT, F.trace);
    CHECK(rc == 0, "the next gc failed (%d; TV_PL_VERBOSE=1 shows its output)", rc);
    check_no_leak();
    return state;
}

/* Runs c with the power cut at every sync point and after its end, once
 * dropping every unsynced write and once keeping a random subset. */
static void sweep(pl_cmd *c)
{
    view before, after;
    char d1[200], d2[200];
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);

    snprintf(F.ctx, sizeof F.ctx, "%s: clean run", c->label);
    restore_state(c->before);
    tv__store *st = open_store(0);
    registry_view(st, &before);
    tv__store_close(st);
    run_clean(c);
    memcpy(F.clean, F.trace, sizeof *F.clean);
    int K = F.clean->n_syncs;
    CHECK(K > 0 && K <= TV_PL_MAX_SYNCS, "%d sync points", K);
    if (getenv("TV_PL_TRACE"))
        for (int k = 1; k <= K; k++)
            printf("  %s: %s\n", c->label, sync_desc(F.clean, k, d1, sizeof d1));
    st = open_store(0);
    registry_view(st, &after);
    tv__store_close(st);
    CHECK(!same_view(&before, &after), "the command changed nothing (%s)", before.gens);
    check_readers(&after);

    int prev = 0, moved_at[3] = {0, 0, 0}, n_moves = 0, reverted = 0, kept = 0, n_lucky = 0;
    for (int k = 1; k <= K + 1; k++) {
        int state = cut_and_check(c, k, K, &before, &after, 0, &reverted);
        /* 3. never backwards; moves only at a registry sync; success is durable */
        CHECK(state >= prev, "the registry went back to an earlier state");
        if (state > prev) {
            /* syncs 1..k-1 were performed: the last one made the change durable */
            CHECK(k >= 2 && (k > K || is_commit_sync(&F.clean->sync[k - 2])),
                  "the registry changed at a sync that commits nothing: %s",
                  sync_desc(F.clean, k - 1, d2, sizeof d2));
            if (n_moves < 3)
                moved_at[n_moves++] = k - 1;
        }
        prev = state;
        if (k == K + 1)
            CHECK(state == 2, "the command returned success but its change was lost");

        /* Some unsynced sectors survive: what was synced still does, and the
         * rest may only move the registry forward, never to a third state. */
        uint64_t seed = 0x9e3779b97f4a7c15ull * (uint64_t)(k + 1) + (uint64_t)c->before;
        int lucky = cut_and_check(c, k, K, &before, &after, seed, &kept);
        CHECK(lucky >= state,
              "with random unsynced sectors kept the registry is behind the synced state (%d < "
              "%d)",
              lucky, state);
        n_lucky += lucky > state;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("powerloss: %-26s %3d sync points + end, each twice (%d unsynced writes dropped; "
           "random sectors kept: %d cuts ahead of the synced state), %.2f s; registry changed at",
           c->label, K, reverted, n_lucky,
           (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9);
    for (int i = 0; i < n_moves; i++)
        printf(" %s", sync_desc(F.clean, moved_at[i], d1, sizeof d1));
    printf("\n");
    fflush(stdout);
}

/* ---- setup and tests ----------------------------------------------------------- */

static int run_or_die(pl_cmd *c)
{
    int rc = tv_pl_run(run_cmd, c, TV_PL_COUNT, F.trace);
    if (rc != 0)
        fprintf(stderr, "setup: %s failed (%d); TV_PL_VERBOSE=1 shows why\n", c->argv[0], rc);
    return rc;
}

static int group_setup(void **state)
{
    (void)state;
    tv__log_set_level(TV_LOG_ERROR);
    tv_test_tmpdir(F.dir, sizeof F.dir, "powerloss");
    snprintf(F.store, sizeof F.store, "%s/store", F.dir);
    snprintf(F.image, sizeof F.image, "%s/image", F.dir);
    for (int s = 0; s < N_STATES; s++)
        snprintf(F.saved[s], sizeof F.saved[s], "%s/saved%d", F.dir, s);
    char p[512];
    snprintf(p, sizeof p, "%s/ck-a", F.dir);
    make_ckpt(&F.ck[0], p, 1);
    snprintf(p, sizeof p, "%s/ck-b", F.dir);
    make_ckpt(&F.ck[1], p, 5);
    snprintf(p, sizeof p, "%s/stash", F.dir);
    if (mkdir(p, 0700) < 0)
        return -1;
    tv_pl_model_dirs(p);
    F.trace = tv_pl_trace_new();
    F.clean = tv_pl_trace_new();
    if (!F.trace || !F.clean)
        return -1;

    pl_cmd init = {
        .argc = 8,
        .argv = {"store", "init", "--store", F.store, "--image", F.image, "--size", IMAGE_LEN}};
    pl_cmd imp_a = cmd_import(true, 0), imp_b = cmd_import(true, 1);
    pl_cmd retire = cmd_gen("retire", "1");
    if (run_or_die(&init))
        return -1;
    save_state(ST_EMPTY);
    if (run_or_die(&imp_a))
        return -1;
    save_state(ST_A);
    if (run_or_die(&imp_b))
        return -1;
    save_state(ST_AB);
    if (run_or_die(&retire))
        return -1;
    save_state(ST_AB_RETIRED);
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    tv_test_rmtree(F.dir);
    for (int c = 0; c < 2; c++)
        for (size_t i = 0; i < F.ck[c].n; i++)
            free(F.ck[c].data[i]);
    tv_pl_trace_free(F.trace);
    tv_pl_trace_free(F.clean);
    return 0;
}

/* ---- the harness itself: what it drops and what it keeps ------------------- */

static char g_hfile[600];

/* 4 bytes, synced; then an overwrite and an append that are never synced. */
static int harness_file_writes(void *ctx)
{
    (void)ctx;
    int fd = open(g_hfile, O_RDWR | O_CLOEXEC);
    if (fd < 0 || tv__sys_pwrite_full(fd, "AAAA", 4, 0) || tv__sys_fdatasync(fd) ||
        tv__sys_pwrite_full(fd, "BB", 2, 1) || tv__sys_pwrite_full(fd, "CCCC", 4, 8) ||
        tv__sys.ftruncate(fd, 10))
        return 1;
    close(fd);
    return 0;
}

static void file_is(const char *want, size_t len)
{
    char buf[64];
    int fd = open(g_hfile, O_RDONLY | O_CLOEXEC);
    assert_true(fd >= 0);
    ssize_t n = read(fd, buf, sizeof buf);
    close(fd);
    assert_int_equal(n, (ssize_t)len);
    assert_memory_equal(buf, want, len);
}

static void test_harness_drops_unsynced_file_writes(void **state)
{
    (void)state;
    snprintf(F.ctx, sizeof F.ctx, "harness");
    snprintf(g_hfile, sizeof g_hfile, "%s/harness-file", F.dir);
    tv_test_write_text(g_hfile, "");
    assert_int_equal(tv_pl_run(harness_file_writes, NULL, TV_PL_COUNT, F.trace), 0);
    assert_int_equal(F.trace->n_syncs, 1);
    file_is("ABBA\0\0\0\0CC", 10); /* no cut: everything stays */
    tv_test_write_text(g_hfile, "");
    assert_int_equal(tv_pl_run(harness_file_writes, NULL, 1, F.trace), TV_PL_CUT);
    file_is("", 0); /* cut at the sync: the first write is gone too */
    tv_test_write_text(g_hfile, "");
    assert_int_equal(tv_pl_run(harness_file_writes, NULL, TV_PL_AT_END, F.trace), TV_PL_CUT);
    assert_int_equal(F.trace->n_reverted, 3);
    file_is("AAAA", 4); /* after the end: only the synced write survives */
}

/* A new file renamed over an old one (the way pointers are replaced): the
 * rename is lost unless the directory was fsynced. */
static int harness_dir_ops(void *ctx)
{
    bool sync_dir = ctx != NULL;
    char tmp[700];
    snprintf(tmp, sizeof tmp, "%s.tmp", g_hfile);
    int fd = tv__sys_open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0 || tv__sys_pwrite_full(fd, "NEW", 3, 0) || tv__sys_fdatasync(fd))
        return 1;
    close(fd);
    if (tv__sys.rename(tmp, g_hfile) < 0 || (sync_dir && tv__sys_fsync_dir(F.dir)))
        return 1;
    return 0;
}

static void test_harness_drops_unsynced_dir_entries(void **state)
{
    (void)state;
    char tmp[700];
    snprintf(g_hfile, sizeof g_hfile, "%s/harness-dir", F.dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", g_hfile);
    tv_test_write_text(g_hfile, "OLD");
    assert_int_equal(tv_pl_run(harness_dir_ops, NULL, TV_PL_AT_END, F.trace), TV_PL_CUT);
    file_is("OLD", 3); /* the rename and the new file are gone */
    assert_int_equal(access(tmp, F_OK), -1);
    assert_int_equal(tv_pl_run(harness_dir_ops, "sync", TV_PL_AT_END, F.trace), TV_PL_CUT);
    assert_int_equal(F.trace->n_syncs, 2);
    file_is("NEW", 3); /* fsync of the directory: durable */
    assert_int_equal(access(tmp, F_OK), -1);
    unlink(g_hfile);
}

/* A committed transaction survives a power loss only if SQLite synced it:
 * with synchronous=OFF the wrapper VFS must drop it. */
static int harness_sqlite(void *ctx)
{
    const char *sync = ctx;
    char path[700], sql[256];
    snprintf(path, sizeof path, "%s/harness.db", F.dir);
    sqlite3 *db = NULL;
    snprintf(sql, sizeof sql,
             "PRAGMA synchronous=%s; PRAGMA journal_mode=WAL; CREATE TABLE t(x);"
             "INSERT INTO t VALUES (42);",
             sync);
    int rc = sqlite3_open(path, &db) || sqlite3_exec(db, sql, NULL, NULL, NULL);
    /* no sqlite3_close: the checkpoint on close would sync */
    return rc;
}

static int harness_rows(void)
{
    char path[700];
    snprintf(path, sizeof path, "%s/harness.db", F.dir);
    sqlite3 *db = NULL;
    sqlite3_stmt *q = NULL;
    int n = -1;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    if (sqlite3_prepare_v2(db, "SELECT count(*) FROM t", -1, &q, NULL) == SQLITE_OK &&
        sqlite3_step(q) == SQLITE_ROW)
        n = sqlite3_column_int(q, 0);
    else
        n = 0; /* no table: the CREATE was lost */
    sqlite3_finalize(q);
    sqlite3_close(db);
    return n;
}

static void rm_harness_db(void)
{
    static const char *const sfx[] = {"", "-wal", "-shm"};
    for (int i = 0; i < 3; i++) {
        char p[700];
        snprintf(p, sizeof p, "%s/harness.db%s", F.dir, sfx[i]);
        unlink(p);
    }
}

static void test_harness_drops_unsynced_sqlite(void **state)
{
    (void)state;
    snprintf(F.ctx, sizeof F.ctx, "harness");
    rm_harness_db();
    assert_int_equal(tv_pl_run(harness_sqlite, "OFF", TV_PL_AT_END, F.trace), TV_PL_CUT);
    assert_int_equal(F.trace->n_syncs, 0);
    assert_true(F.trace->n_reverted > 0);
    assert_int_equal(harness_rows(), 0);
    rm_harness_db();
    assert_int_equal(tv_pl_run(harness_sqlite, "FULL", TV_PL_AT_END, F.trace), TV_PL_CUT);
    assert_true(F.trace->n_syncs > 0);
    assert_string_equal(F.trace->sync[0].op, "xSync");
    assert_int_equal(harness_rows(), 1);
    rm_harness_db();
}

static void test_import_activate(void **state)
{
    (void)state;
    pl_cmd c = cmd_import(true, 1);
    c.label = "import --activate";
    c.before = ST_A;
    sweep(&c);
}

static void test_import_first(void **state)
{
    (void)state;
    pl_cmd c = cmd_import(true, 0);
    c.label = "import --activate (first)";
    c.before = ST_EMPTY;
    sweep(&c);
}

/* Every shard is already committed: nothing is written to the device. */
static void test_import_dedup(void **state)
{
    (void)state;
    pl_cmd c = cmd_import(true, 0);
    c.label = "import --activate (dedup)";
    c.before = ST_AB;
    sweep(&c);
}

static void test_import(void **state)
{
    (void)state;
    pl_cmd c = cmd_import(false, 1);
    c.label = "import";
    c.before = ST_A;
    sweep(&c);
}

static void test_activate_older(void **state)
{
    (void)state;
    pl_cmd c = cmd_gen("activate", "1");
    c.label = "activate (older generation)";
    c.before = ST_AB;
    sweep(&c);
}

static void test_retire(void **state)
{
    (void)state;
    pl_cmd c = cmd_gen("retire", "1");
    c.label = "retire";
    c.before = ST_AB;
    sweep(&c);
}

static void test_gc(void **state)
{
    (void)state;
    pl_cmd c = cmd_gc();
    c.label = "gc (2 objects to free)";
    c.before = ST_AB_RETIRED;
    sweep(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_harness_drops_unsynced_file_writes),
        cmocka_unit_test(test_harness_drops_unsynced_dir_entries),
        cmocka_unit_test(test_harness_drops_unsynced_sqlite),
        cmocka_unit_test(test_import_activate),
        cmocka_unit_test(test_import),
        cmocka_unit_test(test_import_first),
        cmocka_unit_test(test_import_dedup),
        cmocka_unit_test(test_activate_older),
        cmocka_unit_test(test_retire),
        cmocka_unit_test(test_gc),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
