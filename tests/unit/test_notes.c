/* Unit tests of the registry's notes, events and diff core
 * (server/registry/notes.c, events.c) and of the importer's per-tensor
 * hashes (server/import/tensor_hash.c): the tag and description limits,
 * applying a tags patch, the diff of two tensor lists, an update and its
 * event in one transaction (a rollback leaves neither), event pages with a
 * visibility filter, and XXH3-128 of each tensor whatever the chunking. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <sqlite3.h>
#include <xxhash.h>

#include "import/tensor_hash.h"
#include "registry/notes.h"
#include "registry/registry.h"
#include "tv_test.h"
#include "util/hex.h"

static void test_tag_keys_and_values(void **state)
{
    (void)state;
    tv_error err = {0};
    char k64[65];
    memset(k64, 'k', 64);
    k64[64] = '\0';
    assert_int_equal(tv__notes_check_tag_key("team", &err), 0);
    assert_int_equal(tv__notes_check_tag_key("a.b_c/d-E9", &err), 0);
    assert_int_equal(tv__notes_check_tag_key(k64, &err), 0);
    assert_int_equal(tv__notes_check_tag_key("", &err), TV_E_INVALID_ARG);
    assert_non_null(strstr(err.msg, "empty"));
    k64[0] = 'x';
    char k65[66];
    snprintf(k65, sizeof k65, "%sx", k64);
    assert_int_equal(tv__notes_check_tag_key(k65, &err), TV_E_INVALID_ARG);
    assert_non_null(strstr(err.msg, "longer than 64"));
    assert_int_equal(tv__notes_check_tag_key("a b", &err), TV_E_INVALID_ARG);
    assert_non_null(strstr(err.msg, "'a b'"));
    assert_int_equal(tv__notes_check_tag_key("a=b", &err), TV_E_INVALID_ARG);
    assert_int_equal(tv__notes_check_tag_key("caf\xc3\xa9", &err), TV_E_INVALID_ARG);

    char v[1026];
    memset(v, 'v', sizeof v);
    assert_int_equal(tv__notes_check_tag_value("k", v, 1024, &err), 0);
    assert_int_equal(tv__notes_check_tag_value("k", v, 1025, &err), TV_E_INVALID_ARG);
    assert_non_null(strstr(err.msg, "tags.k"));
    assert_int_equal(tv__notes_check_tag_value("k", "\xc3\xa9t\xc3\xa9", 5, &err), 0);
    assert_int_equal(tv__notes_check_tag_value("k", "\xc3", 1, &err), TV_E_INVALID_ARG);
    assert_non_null(strstr(err.msg, "UTF-8"));
}

static void test_description(void **state)
{
    (void)state;
    tv_error err = {0};
    char *d = malloc(4097);
    assert_non_null(d);
    memset(d, 'x', 4097);
    assert_int_equal(tv__notes_check_description(d, 4096, &err), 0);
    assert_int_equal(tv__notes_check_description(d, 4097, &err), TV_E_INVALID_ARG);
    assert_non_null(strstr(err.msg, "description"));
    assert_non_null(strstr(err.msg, "4096"));
    /* 2048 two-byte characters are 4096 bytes: the limit is in bytes */
    for (size_t i = 0; i + 1 < 4096; i += 2) {
        d[i] = '\xc3';
        d[i + 1] = '\xa9';
    }
    assert_int_equal(tv__notes_check_description(d, 4096, &err), 0);
    assert_int_equal(tv__notes_check_description(d, 4095, &err), TV_E_INVALID_ARG); /* cut */
    assert_int_equal(tv__notes_check_description("a\0b", 3, &err), TV_E_INVALID_ARG);
    assert_non_null(strstr(err.msg, "NUL"));
    const char *bad[] = {"\xc0\x80", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xff", "\xe2\x82"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        assert_int_equal(tv__notes_check_description(bad[i], strlen(bad[i]), &err),
                         TV_E_INVALID_ARG);
    assert_int_equal(tv__notes_check_description("\xf0\x9f\x98\x80", 4, &err), 0);
    free(d);
}

static void test_apply_tags(void **state)
{
    (void)state;
    tv_error err = {0};
    json_t *tags = json_pack("{s:s,s:s}", "a", "1", "b", "2");
    json_t *patch = json_pack("{s:n,s:s,s:s}", "a", "b", "3", "c", "4");
    assert_int_equal(tv__notes_apply_tags(tags, patch, &err), 0);
    json_t *want = json_pack("{s:s,s:s}", "b", "3", "c", "4");
    assert_true(json_equal(tags, want));
    json_decref(patch);
    json_decref(want);
    /* the count is of the result: 64 fit, 65 do not */
    json_t *many = json_object();
    for (int i = 0; i < 62; i++) {
        char k[8];
        snprintf(k, sizeof k, "t%d", i);
        json_object_set_new(many, k, json_string("v"));
    }
    json_t *copy = json_deep_copy(tags);
    assert_int_equal(tv__notes_apply_tags(copy, many, &err), 0);
    assert_int_equal(json_object_size(copy), 64);
    json_decref(copy);
    json_object_set_new(many, "t62", json_string("v"));
    copy = json_deep_copy(tags);
    assert_int_equal(tv__notes_apply_tags(copy, many, &err), TV_E_INVALID_ARG);
    assert_non_null(strstr(err.msg, "more than the limit of 64"));
    json_decref(copy);
    json_decref(many);
    patch = json_pack("{s:i}", "x", 3);
    assert_int_equal(tv__notes_apply_tags(tags, patch, &err), TV_E_INVALID_ARG);
    assert_non_null(strstr(err.msg, "tags.x"));
    json_decref(patch);
    json_decref(tags);
}

static tv__reg_diff_tensor T(const char *name, tv_dtype dt, const char *shape, const char *x,
                             const char *sh)
{
    tv__reg_diff_tensor t = {.name = (char *)name, .dtype = dt};
    snprintf(t.shape, sizeof t.shape, "%s", shape);
    snprintf(t.xxh3, sizeof t.xxh3, "%s", x);
    snprintf(t.shard_sha256, sizeof t.shard_sha256, "%s", sh);
    return t;
}

static const char *names(const json_t *arr, char *buf, size_t len)
{
    size_t i, off = 0;
    json_t *v;
    buf[0] = '\0';
    json_array_foreach(arr, i, v)
    {
        const char *n = json_string_value(json_object_get(v, "name"));
        off += (size_t)snprintf(buf + off, len - off, "%s%s", off ? "," : "", n);
    }
    return buf;
}

static void test_diff_core(void **state)
{
    (void)state;
    char b[256];
    const char *H1 = "00000000000000000000000000000001", *H2 = "00000000000000000000000000000002";
    const char *S1 = "aa", *S2 = "bb";
    tv__reg_diff_tensor a[] = {
        T("c", TV_DTYPE_F32, "[2]", H1, S1),    T("dt", TV_DTYPE_F32, "[4]", H1, S1),
        T("gone", TV_DTYPE_U8, "[1]", H1, S1),  T("same", TV_DTYPE_F32, "[3]", H1, S1),
        T("sh", TV_DTYPE_F32, "[2,3]", H1, S1),
    };
    tv__reg_diff_tensor bb[] = {
        T("c", TV_DTYPE_F32, "[2]", H2, S2),    T("dt", TV_DTYPE_F16, "[4]", H1, S2),
        T("new", TV_DTYPE_I32, "[5]", H1, S2),  T("same", TV_DTYPE_F32, "[3]", H1, S2),
        T("sh", TV_DTYPE_F32, "[3,2]", H1, S2),
    };
    json_t *d = tv__diff_tensors_json(a, 5, bb, 5);
    assert_non_null(d);
    assert_string_equal(names(json_object_get(d, "added"), b, sizeof b), "new");
    assert_string_equal(names(json_object_get(d, "removed"), b, sizeof b), "gone");
    assert_string_equal(names(json_object_get(d, "changed"), b, sizeof b), "dt,sh");
    assert_string_equal(names(json_object_get(d, "content_changed"), b, sizeof b), "c");
    assert_int_equal(json_integer_value(json_object_get(d, "unchanged")), 1);
    assert_string_equal(json_string_value(json_object_get(d, "basis")), "xxh3");
    json_t *added = json_array_get(json_object_get(d, "added"), 0);
    assert_string_equal(json_string_value(json_object_get(added, "dtype")), "I32");
    assert_int_equal(json_integer_value(json_array_get(json_object_get(added, "shape"), 0)), 5);
    json_decref(d);

    /* without tensor hashes on one side: the shards' SHA-256 decide */
    for (size_t i = 0; i < 5; i++)
        a[i].xxh3[0] = '\0';
    d = tv__diff_tensors_json(a, 5, bb, 5);
    assert_string_equal(names(json_object_get(d, "content_changed"), b, sizeof b), "c,same");
    json_t *c0 = json_array_get(json_object_get(d, "content_changed"), 0);
    assert_string_equal(json_string_value(json_object_get(c0, "note")),
                        "content may differ (shard hash differs)");
    assert_string_equal(json_string_value(json_object_get(c0, "basis")), "shard_sha256");
    assert_string_equal(json_string_value(json_object_get(d, "basis")), "shard_sha256");
    json_decref(d);
    d = tv__diff_tensors_json(a, 5, a, 5);
    assert_int_equal(json_integer_value(json_object_get(d, "unchanged")), 5);
    json_decref(d);
    /* one side empty */
    d = tv__diff_tensors_json(NULL, 0, bb, 5);
    assert_int_equal(json_array_size(json_object_get(d, "added")), 5);
    assert_int_equal(json_integer_value(json_object_get(d, "unchanged")), 0);
    json_decref(d);
}

typedef struct fixture {
    char dir[96];
    char path[128];
    tv__reg *reg;
} fixture;

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    assert_non_null(f);
    tv_test_tmpdir(f->dir, sizeof f->dir, "notes");
    snprintf(f->path, sizeof f->path, "%s/registry.db", f->dir);
    assert_int_equal(tv__reg_open(f->path, &f->reg, NULL), 0);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    tv__reg_close(f->reg);
    tv_test_rmtree(f->dir);
    free(f);
    tv__reg_actor_set(NULL);
    return 0;
}

static size_t n_events(tv__reg *reg, const char *model)
{
    tv__reg_event_row *rows = NULL;
    size_t n = 0;
    bool more = false;
    assert_int_equal(tv__reg_events_page(reg, model, 0, 1000, NULL, NULL, &rows, &n, &more, NULL),
                     0);
    tv__reg_events_free(rows, n);
    return n;
}

static void test_update_and_event_are_one_transaction(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    assert_int_equal(tv__reg_generation_create(f->reg, "m", "/src", 1, NULL, &err), 0);
    tv__reg_actor_set("tester");
    json_t *patch = json_pack("{s:s}", "team", "nlp");
    assert_int_equal(tv__reg_notes_update(f->reg, "m", 0, "hello", patch, &err), 0);
    tv__reg_event_row *rows = NULL;
    size_t n = 0;
    bool more = false;
    assert_int_equal(tv__reg_events_page(f->reg, "m", 0, 10, NULL, NULL, &rows, &n, &more, &err),
                     0);
    assert_int_equal(n, 1);
    assert_string_equal(rows[0].actor, "tester");
    assert_string_equal(rows[0].action, "notes");
    assert_string_equal(rows[0].before, "{\"description\":\"\",\"tags\":{}}");
    assert_string_equal(rows[0].after, "{\"description\":\"hello\",\"tags\":{\"team\":\"nlp\"}}");
    tv__reg_events_free(rows, n);
    char *desc = NULL;
    json_t *tags = NULL;
    assert_int_equal(tv__reg_notes_get(f->reg, "m", 0, &desc, &tags, &err), 0);
    assert_string_equal(desc, "hello");
    assert_string_equal(json_string_value(json_object_get(tags, "team")), "nlp");
    free(desc);
    json_decref(tags);
    /* inside a transaction that rolls back: neither the change nor its event */
    assert_int_equal(tv__reg_begin(f->reg, &err), 0);
    assert_int_equal(tv__reg_notes_update(f->reg, "m", 1, "gen one", NULL, &err), 0);
    assert_int_equal(tv__reg_rollback(f->reg), 0);
    assert_int_equal(n_events(f->reg, "m"), 1);
    assert_int_equal(tv__reg_notes_get(f->reg, "m", 1, &desc, NULL, &err), 0);
    assert_string_equal(desc, "");
    free(desc);
    /* a refused update changes nothing and writes nothing */
    json_t *bad = json_pack("{s:s}", "bad key", "v");
    assert_int_equal(tv__reg_notes_update(f->reg, "m", 0, "x", bad, &err), TV_E_INVALID_ARG);
    assert_int_equal(n_events(f->reg, "m"), 1);
    assert_int_equal(tv__reg_notes_update(f->reg, "nosuch", 0, "x", NULL, &err), TV_E_NOT_FOUND);
    assert_int_equal(tv__reg_notes_update(f->reg, "m", 7, "x", NULL, &err), TV_E_NOT_FOUND);
    bool has = false;
    assert_int_equal(tv__reg_notes_has_tag(f->reg, "m", 0, "team", "nlp", &has, &err), 0);
    assert_true(has);
    assert_int_equal(tv__reg_notes_has_tag(f->reg, "m", 0, "team", "cv", &has, &err), 0);
    assert_false(has);
    json_decref(bad);
    json_decref(patch);
}

static bool only_a(void *ctx, const char *model)
{
    (void)ctx;
    return model && !strcmp(model, "a");
}

static void test_event_pages_filtered(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    /* a, b, a, b, ... and one of no model */
    for (int i = 0; i < 10; i++)
        assert_int_equal(tv__reg_event(f->reg, "test", i % 2 ? "b" : "a", 0, NULL,
                                       json_pack("{s:i}", "i", i), &err),
                         0);
    assert_int_equal(tv__reg_event(f->reg, "test", NULL, 0, NULL, NULL, &err), 0);
    int64_t before = 0;
    size_t seen = 0;
    for (int page = 0; page < 10; page++) {
        tv__reg_event_row *rows = NULL;
        size_t n = 0;
        bool more = false;
        assert_int_equal(
            tv__reg_events_page(f->reg, NULL, before, 2, only_a, NULL, &rows, &n, &more, &err), 0);
        for (size_t i = 0; i < n; i++) {
            assert_string_equal(rows[i].model, "a");
            assert_string_equal(rows[i].actor, "daemon");
            assert_true(before == 0 || rows[i].id < before);
        }
        seen += n;
        before = n ? rows[n - 1].id : before;
        tv__reg_events_free(rows, n);
        if (!more)
            break;
        assert_int_equal(n, 2);
    }
    assert_int_equal(seen, 5);
    assert_int_equal(n_events(f->reg, "b"), 5);
    assert_int_equal(n_events(f->reg, NULL), 11);
}

/* XXH3-128 of p[0, n) as canonical hex. */
static void xxh_hex(const uint8_t *p, size_t n, char out[33])
{
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(p, n));
    tv__hex_encode(c.digest, sizeof c.digest, false, out);
}

static void test_tensor_hashes_any_chunking(void **state)
{
    fixture *f = *state;
    char shard[160];
    snprintf(shard, sizeof shard, "%s/model.safetensors", f->dir);
    tv_test_tensor ts[] = {
        {"a", "F32", 1000, 4}, {"e", "U8", 0, 1}, {"b", "U8", 77, 1}, {"c", "F16", 4097, 2}};
    uint64_t len = tv_test_write_shard(shard, ts, 4, 5);
    size_t flen = 0;
    uint8_t *file = tv_test_read_file(shard, &flen);
    assert_int_equal(flen, len);
    tv_checkpoint *ck = NULL;
    assert_int_equal(tv_checkpoint_open(shard, NULL, &ck, NULL), 0);
    size_t chunks[] = {1, 7, 4096, 100000};
    for (size_t c = 0; c < sizeof chunks / sizeof *chunks; c++) {
        tv__thash *t = NULL;
        assert_int_equal(tv__thash_new(ck, &t, NULL), 0);
        /* a first pass cut short, then a whole one from offset 0 */
        tv__thash_feed(t, 0, 0, file, 100);
        for (size_t off = 0; off < flen; off += chunks[c])
            tv__thash_feed(t, 0, off, file + off, flen - off < chunks[c] ? flen - off : chunks[c]);
        tv__reg *reg = f->reg;
        tv__reg_generation g;
        char model[16];
        snprintf(model, sizeof model, "m%zu", c);
        assert_int_equal(tv__reg_generation_create(reg, model, "/s", flen, &g, NULL), 0);
        tv_shard_info si;
        tv_checkpoint_shard(ck, 0, &si);
        char sha[65];
        memset(sha, 'a', 64);
        sha[64] = '\0';
        tv__reg_shard_in in = {.idx = 0,
                               .name = "model.safetensors",
                               .file_len = si.file_len,
                               .header_len = si.header_len,
                               .sha256_hex = sha,
                               .header_sha256_hex = sha};
        assert_int_equal(tv__reg_shard_add(reg, g.id, &in, NULL, NULL), 0);
        size_t nt = tv_checkpoint_n_tensors(ck);
        tv_tensor_info *infos = calloc(nt, sizeof *infos);
        for (size_t i = 0; i < nt; i++)
            tv_checkpoint_tensor(ck, i, &infos[i]);
        assert_int_equal(
            tv__reg_tensors_insert_hashed(reg, g.id, infos, nt, tv__thash_hexes(t), NULL), 0);
        tv__reg_diff_tensor *dt = NULL;
        size_t n = 0;
        assert_int_equal(tv__reg_diff_tensors(reg, g.id, &dt, &n, NULL), 0);
        assert_int_equal(n, 4);
        for (size_t i = 0; i < n; i++) {
            tv_tensor_info ti = {0};
            for (size_t k = 0; k < nt; k++)
                if (!strcmp(infos[k].name, dt[i].name))
                    ti = infos[k];
            char want[33];
            xxh_hex(file + ti.file_off, (size_t)ti.nbytes, want);
            assert_string_equal(dt[i].xxh3, want);
        }
        tv__reg_diff_tensors_free(dt, n);
        free(infos);
        tv__thash_free(t);
    }
    /* a gap: no hashes recorded for the shard */
    tv__thash *t = NULL;
    assert_int_equal(tv__thash_new(ck, &t, NULL), 0);
    tv__thash_feed(t, 0, 0, file, 10);
    tv__thash_feed(t, 0, 20, file + 20, flen - 20);
    const char *const *hx = tv__thash_hexes(t);
    for (size_t i = 0; i < tv_checkpoint_n_tensors(ck); i++)
        assert_null(hx[i]);
    tv__thash_free(t);
    tv_checkpoint_close(ck);
    free(file);
}

static void test_files_diff(void **state)
{
    fixture *f = *state;
    tv_error err = {0};
    tv__reg_generation a, b;
    assert_int_equal(tv__reg_generation_create(f->reg, "m", "/a", 1, &a, &err), 0);
    assert_int_equal(tv__reg_generation_create(f->reg, "m", "/b", 1, &b, &err), 0);
    json_t *d = NULL;
    assert_int_equal(tv__reg_files_diff(f->reg, a.id, b.id, &d, &err), 0);
    json_t *none = json_pack("{s:[],s:[],s:[]}", "added", "removed", "changed");
    assert_true(json_equal(d, none));
    json_decref(none);
    json_decref(d);
    /* rows as an import publishes them (migrations/0007_sidecar_files.sql) */
    sqlite3 *db = tv__reg_sqlite(f->reg);
    char sql[1024];
    snprintf(sql, sizeof sql,
             "INSERT INTO sidecar_blobs VALUES ('%064d', x''), ('%064d', x''), ('%064d', x''), "
             "('%064d', x'');"
             "INSERT INTO generation_files VALUES (%lld, 'config.json', 0, '%064d'), "
             "(%lld, 'gone.txt', 0, '%064d'), (%lld, 'tok.json', 0, '%064d'), "
             "(%lld, 'config.json', 0, '%064d'), (%lld, 'new.txt', 0, '%064d'), "
             "(%lld, 'tok.json', 0, '%064d')",
             1, 2, 3, 4, (long long)a.id, 1, (long long)a.id, 2, (long long)a.id, 3,
             (long long)b.id, 1, (long long)b.id, 2, (long long)b.id, 4);
    char *msg = NULL;
    if (sqlite3_exec(db, sql, NULL, NULL, &msg) != SQLITE_OK)
        fail_msg("%s", msg);
    assert_int_equal(tv__reg_files_diff(f->reg, a.id, b.id, &d, &err), 0);
    json_t *want = json_pack("{s:[s],s:[s],s:[s]}", "added", "new.txt", "removed", "gone.txt",
                             "changed", "tok.json");
    assert_true(json_equal(d, want));
    json_decref(want);
    json_decref(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tag_keys_and_values),
        cmocka_unit_test(test_description),
        cmocka_unit_test(test_apply_tags),
        cmocka_unit_test(test_diff_core),
        cmocka_unit_test_setup_teardown(test_update_and_event_are_one_transaction, setup, teardown),
        cmocka_unit_test_setup_teardown(test_event_pages_filtered, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tensor_hashes_any_chunking, setup, teardown),
        cmocka_unit_test_setup_teardown(test_files_diff, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
