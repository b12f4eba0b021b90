/* Unit tests of the sidecar files' rules (server/import/sidecar.c): the
 * path rule (absolute, '..', '.', empty components, backslashes, control
 * characters, length), which files of a directory are never sidecars (dot
 * files, shards, the index, other weight formats), the per-file cap (a
 * file skipped and listed "skipped: NAME (N bytes > cap)"), the total cap
 * (TV_E_TOO_LARGE naming import.sidecar_total_bytes), the hash; and the
 * walk of a local source (src_local.c): subdirectories, a FIFO, a symlink
 * out of the directory and one out of the import roots skipped, a Hugging
 * Face snapshot's links into its blobs kept. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
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

#include "import/source.h"
#include "tv_test.h"

/* The test's paths are short: a truncated one fails its mkdir or open. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wformat-truncation"
#endif

static void test_path_rule(void **state)
{
    (void)state;
    tv_error e = {0};
    static const char *const good[] = {"config.json", "1_Pooling/config.json", "a/b/c/d.txt",
                                       "README.md",   "with space.txt",        "..a/b..",
                                       NULL};
    for (size_t i = 0; good[i]; i++)
        assert_int_equal(tv__sidecar_path_valid(good[i], &e), 0);
    static const char *const bad[] = {"",     "/etc/passwd", "../x",    "a/../b", "a/..", "..",
                                      "a//b", "a/",          "./x",     "a/./b",  ".",    "a\\b",
                                      "a\nb", "tab\there",   "del\x7f", NULL};
    for (size_t i = 0; bad[i]; i++) {
        memset(&e, 0, sizeof e);
        assert_int_equal(tv__sidecar_path_valid(bad[i], &e), TV_E_BAD_REQUEST);
        assert_true(e.msg[0] != '\0');
    }
    assert_int_equal(tv__sidecar_path_valid(NULL, &e), TV_E_BAD_REQUEST);
    char longp[TV__SIDECAR_PATH_MAX + 2];
    memset(longp, 'a', sizeof longp - 1);
    longp[sizeof longp - 1] = '\0';
    assert_int_equal(tv__sidecar_path_valid(longp, &e), TV_E_BAD_REQUEST);
    longp[TV__SIDECAR_PATH_MAX] = '\0';
    assert_int_equal(tv__sidecar_path_valid(longp, &e), 0);
    tv__sidecar_path_valid("/abs", &e);
    assert_non_null(strstr(e.msg, "absolute"));
    tv__sidecar_path_valid("a/../b", &e);
    assert_non_null(strstr(e.msg, "'..'"));
    tv__sidecar_path_valid("a\x01", &e);
    assert_non_null(strstr(e.msg, "control character"));
}

static void test_excluded(void **state)
{
    (void)state;
    static const char *const out[] = {".hidden",
                                      "a/.git/config",
                                      ".cache/x.json",
                                      "model.safetensors",
                                      "model-00001-of-00002.safetensors",
                                      "model.safetensors.index.json",
                                      "pytorch_model.bin",
                                      "x.pt",
                                      "x.pth",
                                      "x.ckpt",
                                      "tf_model.h5",
                                      "flax_model.msgpack",
                                      "model.onnx",
                                      "m.Q4.gguf",
                                      "sub/model.onnx",
                                      NULL};
    for (size_t i = 0; out[i]; i++)
        assert_true(tv__sidecar_excluded(out[i]));
    static const char *const in[] = {"config.json",  "tokenizer.json",  "README.md",
                                     "vocab.txt",    "merges.txt",      "x.bin.txt",
                                     "binaries.txt", "a.b/config.json", NULL};
    for (size_t i = 0; in[i]; i++)
        assert_false(tv__sidecar_excluded(in[i]));
}

static void test_caps_and_hash(void **state)
{
    (void)state;
    tv__sidecars set = {0};
    const tv__sidecar_caps caps = {.max_len = 10, .total_len = 25};
    tv_error e = {0};
    char ten[10];
    memset(ten, 'x', sizeof ten);
    assert_int_equal(tv__sidecars_add(&set, &caps, "b.txt", "abc", 3, &e), 0);
    assert_string_equal(set.files[0].sha256,
                        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    assert_int_equal(tv__sidecars_add(&set, &caps, "big.txt", "01234567890", 11, &e), 0);
    assert_int_equal(set.n, 1);
    assert_int_equal(set.n_skipped, 1);
    assert_string_equal(set.skipped[0], "skipped: big.txt (11 bytes > 10)");
    assert_int_equal(tv__sidecars_add(&set, &caps, "a.txt", ten, 10, &e), 0);
    assert_int_equal(tv__sidecars_add(&set, &caps, "empty", "", 0, &e), 0);
    assert_int_equal(set.total_len, 13);
    assert_int_equal(tv__sidecars_add(&set, &caps, "a.txt", "y", 1, &e), TV_E_BAD_REQUEST);
    assert_int_equal(tv__sidecars_add(&set, &caps, "../x", "y", 1, &e), TV_E_BAD_REQUEST);
    assert_int_equal(tv__sidecars_add(&set, &caps, "c.txt", ten, 10, &e), 0); /* 23 */
    memset(&e, 0, sizeof e);
    assert_int_equal(tv__sidecars_add(&set, &caps, "d.txt", "xyz", 3, &e), TV_E_TOO_LARGE);
    assert_non_null(strstr(e.msg, "import.sidecar_total_bytes (25 bytes)"));
    assert_non_null(strstr(e.msg, "'d.txt'"));
    assert_int_equal(set.n, 4);
    assert_int_equal(set.total_len, 23);
    tv__sidecars_sort(&set);
    assert_string_equal(set.files[0].path, "a.txt");
    assert_string_equal(set.files[1].path, "b.txt");
    assert_string_equal(set.files[3].path, "empty");
    assert_memory_equal(set.files[1].data, "abc", 3);
    tv__sidecars_clear(&set);
    tv__sidecars_clear(&set);
    assert_int_equal(set.n, 0);
    /* the defaults: 4 MiB a file */
    uint8_t *big = calloc(1, TV__SIDECAR_DEFAULT_MAX + 1);
    assert_non_null(big);
    assert_int_equal(tv__sidecars_add(&set, NULL, "big", big, TV__SIDECAR_DEFAULT_MAX + 1, &e), 0);
    assert_int_equal(tv__sidecars_add(&set, NULL, "max", big, TV__SIDECAR_DEFAULT_MAX, &e), 0);
    assert_int_equal(set.n, 1);
    assert_int_equal(set.n_skipped, 1);
    free(big);
    tv__sidecars_clear(&set);
}

static void put(const char *dir, const char *name, const char *text)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static const tv__sidecar *find(const tv__sidecars *set, const char *path)
{
    for (size_t i = 0; i < set->n; i++)
        if (!strcmp(set->files[i].path, path))
            return &set->files[i];
    return NULL;
}

static bool skipped(const tv__sidecars *set, const char *prefix)
{
    for (size_t i = 0; i < set->n_skipped; i++)
        if (!strncmp(set->skipped[i], prefix, strlen(prefix)))
            return true;
    return false;
}

static void test_local_walk(void **state)
{
    (void)state;
    char top[PATH_MAX], root[PATH_MAX], dir[PATH_MAX], p[PATH_MAX], q[PATH_MAX];
    snprintf(top, sizeof top, "/tmp/tv_sidecar_XXXXXX");
    assert_non_null(mkdtemp(top));
    snprintf(root, sizeof root, "%s/root", top);
    snprintf(dir, sizeof dir, "%s/m", root);
    assert_int_equal(mkdir(root, 0755), 0);
    assert_int_equal(mkdir(dir, 0755), 0);
    put(dir, "model.safetensors", "not read here");
    put(dir, "config.json", "{\"a\": 1}");
    put(dir, ".hidden", "dot");
    put(dir, "big.txt", "0123456789abcdef");
    snprintf(p, sizeof p, "%s/sub", dir);
    assert_int_equal(mkdir(p, 0755), 0);
    put(p, "vocab.txt", "hello\n");
    snprintf(p, sizeof p, "%s/pipe", dir);
    assert_int_equal(mkfifo(p, 0644), 0);
    put(root, "beside.txt", "in the roots, not in the directory");
    put(top, "secret.txt", "outside the roots");
    snprintf(p, sizeof p, "%s/out.txt", dir);
    assert_int_equal(symlink("../beside.txt", p), 0);
    snprintf(p, sizeof p, "%s/secret.txt", dir);
    assert_int_equal(symlink("../../secret.txt", p), 0);
    snprintf(p, sizeof p, "%s/link.json", dir);
    assert_int_equal(symlink("config.json", p), 0);
    snprintf(p, sizeof p, "%s/subdir-link", dir);
    assert_int_equal(symlink("sub", p), 0);
    snprintf(p, sizeof p, "%s/var", dir); /* a store: never walked */
    assert_int_equal(mkdir(p, 0755), 0);
    put(p, "registry.db", "x");
    put(p, "admin.token", "tvk_secret");

    const char *roots[] = {root};
    tv__src_local *l = NULL;
    tv_error e = {0};
    assert_int_equal(tv__src_local_open(dir, roots, 1, &l, &e), 0);
    tv__sidecars set = {0};
    const tv__sidecar_caps caps = {.max_len = 15};
    assert_int_equal(tv__src_local_sidecars(l, &caps, &set, &e), 0);
    assert_int_equal(set.n, 3);
    assert_string_equal(set.files[0].path, "config.json"); /* sorted */
    assert_string_equal(set.files[1].path, "link.json");
    assert_string_equal(set.files[2].path, "sub/vocab.txt");
    assert_memory_equal(find(&set, "sub/vocab.txt")->data, "hello\n", 6);
    assert_true(skipped(&set, "skipped: big.txt (16 bytes > 15)"));
    assert_true(skipped(&set, "skipped: pipe (not a regular file)"));
    assert_true(skipped(&set, "skipped: out.txt (resolves to "));
    assert_true(skipped(&set, "skipped: secret.txt (resolves to "));
    assert_null(find(&set, "subdir-link/vocab.txt"));
    assert_false(skipped(&set, "skipped: .hidden"));
    assert_true(skipped(&set, "skipped: var (a directory holding a tensorvault store)"));
    assert_null(find(&set, "var/admin.token"));
    assert_null(find(&set, "model.safetensors"));
    tv__sidecars_clear(&set);
    tv__src_local_free(l);

    /* a Hugging Face cache snapshot: its links into ../../blobs are kept */
    char hub[PATH_MAX], snap[PATH_MAX], blobs[PATH_MAX];
    snprintf(hub, sizeof hub, "%s/models--org--m", root);
    snprintf(blobs, sizeof blobs, "%s/blobs", hub);
    snprintf(snap, sizeof snap, "%s/snapshots", hub);
    assert_int_equal(mkdir(hub, 0755), 0);
    assert_int_equal(mkdir(blobs, 0755), 0);
    assert_int_equal(mkdir(snap, 0755), 0);
    strncat(snap, "/rev1", sizeof snap - strlen(snap) - 1);
    assert_int_equal(mkdir(snap, 0755), 0);
    put(blobs, "0123abcd", "{\"hub\": true}");
    snprintf(p, sizeof p, "%s/config.json", snap);
    assert_int_equal(symlink("../../blobs/0123abcd", p), 0);
    snprintf(q, sizeof q, "%s/model.safetensors", snap);
    put(snap, "model.safetensors", "x");
    assert_int_equal(tv__src_local_open(snap, roots, 1, &l, &e), 0);
    assert_int_equal(tv__src_local_sidecars(l, NULL, &set, &e), 0);
    assert_int_equal(set.n, 1);
    assert_string_equal(set.files[0].path, "config.json");
    assert_memory_equal(set.files[0].data, "{\"hub\": true}", 13);
    tv__sidecars_clear(&set);
    tv__src_local_free(l);

    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", top);
    assert_int_equal(system(cmd), 0);
}

/* A pull's files with sidecar set (in memory: no network): kept, checked
 * against their sha256; a mismatch, a hostile name and the caps. */
static const char ST_HDR[] = "{\"w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}";

static size_t tiny_safetensors(uint8_t *out)
{
    uint64_t n = sizeof(ST_HDR) - 1;
    for (int i = 0; i < 8; i++)
        out[i] = (uint8_t)(n >> (8 * i));
    memcpy(out + 8, ST_HDR, n);
    memcpy(out + 8 + n, "abcd", 4);
    return 8 + n + 4;
}

static int pull_sidecars(tv__src_pull_file *files, size_t n, const tv__sidecar_caps *caps,
                         tv__sidecars *set, tv_error *e)
{
    tv__src_pull p = {.first = "model.safetensors", .files = files, .n_files = n, .source = "t"};
    tv__src *s = NULL;
    tv_checkpoint *ck = NULL;
    char real[64];
    int rc = tv__src_open_pull(&p, NULL, &s, &ck, real, sizeof real, e);
    assert_int_equal(rc, 0);
    rc = tv__src_sidecars(s, caps, set, e);
    tv_checkpoint_close(ck);
    tv__src_free(s);
    return rc;
}

static void test_pull_sidecars(void **state)
{
    (void)state;
    uint8_t st[256];
    size_t st_len = tiny_safetensors(st);
    static const char cfg[] = "{\"model_type\": \"x\"}";
    /* sha256("abc") */
    static const char abc_sha[] =
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
    char cfg_sha[65];
    tv__sidecars tmp = {0};
    tv_error e = {0};
    assert_int_equal(tv__sidecars_add(&tmp, NULL, "x", cfg, sizeof cfg - 1, &e), 0);
    memcpy(cfg_sha, tmp.files[0].sha256, sizeof cfg_sha);
    tv__sidecars_clear(&tmp);

    tv__src_pull_file files[] = {
        {.name = "model.safetensors", .data = st, .data_len = st_len},
        {.name = "config.json",
         .data = cfg,
         .data_len = sizeof cfg - 1,
         .sha256 = cfg_sha,
         .sidecar = true},
        {.name = "tok/vocab.txt", .data = "abc", .data_len = 3, .sidecar = true},
        {.name = "big.txt",
         .data = "012345678901234567890123456789",
         .data_len = 30,
         .sidecar = true},
        {.name = "not-a-sidecar.txt", .data = "abc", .data_len = 3},
    };
    const tv__sidecar_caps caps = {.max_len = 25};
    tv__sidecars set = {0};
    assert_int_equal(pull_sidecars(files, 5, &caps, &set, &e), 0);
    assert_int_equal(set.n, 2);
    assert_string_equal(set.files[0].path, "config.json");
    assert_string_equal(set.files[0].sha256, cfg_sha);
    assert_string_equal(set.files[1].path, "tok/vocab.txt");
    assert_string_equal(set.files[1].sha256, abc_sha);
    assert_int_equal(set.n_skipped, 1);
    assert_string_equal(set.skipped[0], "skipped: big.txt (30 bytes > 25)");
    tv__sidecars_clear(&set);

    /* a file that is not its sha256 fails the import */
    files[1].sha256 = abc_sha;
    memset(&e, 0, sizeof e);
    assert_int_equal(pull_sidecars(files, 2, NULL, &set, &e), TV_E_HASH_MISMATCH);
    assert_non_null(strstr(e.msg, "config.json"));
    tv__sidecars_clear(&set);
    files[1].sha256 = cfg_sha;

    /* hostile names are refused */
    static const char *const bad[] = {"../etc/passwd", "/etc/passwd", "a/../../b", "x\ty"};
    for (size_t i = 0; i < 4; i++) {
        files[2].name = bad[i];
        assert_int_equal(pull_sidecars(files, 3, NULL, &set, &e), TV_E_BAD_REQUEST);
        tv__sidecars_clear(&set);
    }
    files[2].name = "tok/vocab.txt";

    /* over the total cap */
    const tv__sidecar_caps small = {.total_len = 20};
    assert_int_equal(pull_sidecars(files, 3, &small, &set, &e), TV_E_TOO_LARGE);
    assert_non_null(strstr(e.msg, "import.sidecar_total_bytes"));
    tv__sidecars_clear(&set);

    /* the copy keeps the flag */
    tv__src_pull p = {.first = "model.safetensors", .files = files, .n_files = 3}, *c = NULL;
    assert_int_equal(tv__src_pull_dup(&p, &c, &e), 0);
    assert_false(c->files[0].sidecar);
    assert_true(c->files[1].sidecar && c->files[2].sidecar);
    tv__src_pull_free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_path_rule),     cmocka_unit_test(test_excluded),
        cmocka_unit_test(test_caps_and_hash), cmocka_unit_test(test_local_walk),
        cmocka_unit_test(test_pull_sidecars),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
