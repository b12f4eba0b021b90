/* Unit tests of the HTTP import source's pure parts: source URL parsing
 * (server/httpc/url.c: what is refused and why), the import.origins
 * prefix match, Content-Range parsing, the backoff between tries and its
 * cancel (httpc/httpc.h: tv__http_cancel); and tv_checkpoint_open_io (core: a
 * checkpoint validated through caller callbacks, as src_http.c does). */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>
#include <curl/curl.h>

#include "httpc/httpc.h"
#include "httpc/url.h"
#include "tensorvault/checkpoint.h"
#include "util/internal.h"

static void test_parse_accepts(void **state)
{
    (void)state;
    tv__url u;
    assert_int_equal(tv__url_parse("http://127.0.0.1:8000/models/a.safetensors", &u, NULL), 0);
    assert_false(u.https);
    assert_string_equal(u.host, "127.0.0.1");
    assert_int_equal(u.port, 8000);
    assert_string_equal(u.path, "/models/a.safetensors");
    assert_int_equal(tv__url_parse("HTTPS://Example.COM/x/", &u, NULL), 0);
    assert_true(u.https);
    assert_string_equal(u.host, "example.com");
    assert_int_equal(u.port, 443);
    assert_int_equal(tv__url_parse("http://[::1]:9/a%20b.safetensors", &u, NULL), 0);
    assert_string_equal(u.host, "[::1]");
    assert_int_equal(u.port, 9);
    assert_int_equal(tv__url_parse("http://h/", &u, NULL), 0);
    assert_int_equal(u.port, 80);
    assert_int_equal(tv__url_parse("http://h/a..b/c.d", &u, NULL), 0); /* not a dot segment */
}

static void test_parse_refuses(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "ftp://h/a",          "http:/h/a",         "http://",         "http:///a",
        "http://h",           "http://h:/a",       "http://h:0/a",    "http://h:65536/a",
        "http://h:12x/a",     "http://h?x",        "http://h/a?x=1",  "http://h/a#f",
        "http://h/a/../b",    "http://h/a/./b",    "http://h/..",     "http://h/a/..",
        "http://h/%2e%2e/b",  "http://h/a%2Fb",    "http://h/a%5cb",  "http://h/a%00",
        "http://h/a%4",       "http://h/a%zz",     "http://h/a b",    "http://h/a\\b",
        "http://h/a\"b",      "http://h/\xc3\xa9", "http://h_x/a",    "http://[::1/a",
        "http://[]/a",        "http://[::1]x/a",   "http://[g::1]/a", "http://h/a\n",
        "file:///etc/passwd",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        tv__url u;
        tv_error e = {0};
        if (tv__url_parse(bad[i], &u, &e) != TV_E_BAD_REQUEST)
            fail_msg("accepted '%s'", bad[i]);
        assert_non_null(strstr(e.msg, "refused") ? e.msg : strstr(e.msg, "URL"));
    }
}

static void test_credentials_refused_and_not_repeated(void **state)
{
    (void)state;
    tv__url u;
    tv_error e = {0};
    assert_int_equal(tv__url_parse("http://user:s3cret@h:1/a.safetensors", &u, &e),
                     TV_E_BAD_REQUEST);
    assert_non_null(strstr(e.msg, "credentials"));
    assert_null(strstr(e.msg, "s3cret"));
    assert_null(strstr(e.msg, "//user"));
    assert_int_equal(tv__url_parse("https://tok@h/a", &u, &e), TV_E_BAD_REQUEST);
    assert_null(strstr(e.msg, "tok"));
}

static int check(const char *url, const char *origins)
{
    tv_error e = {0};
    return tv__url_origins_check(url, origins, &e);
}

static void test_origins(void **state)
{
    (void)state;
    const char *o = "http://127.0.0.1:8000/models/, https://hub.example/org";
    assert_int_equal(check("http://127.0.0.1:8000/models/a.safetensors", o), 0);
    assert_int_equal(check("http://127.0.0.1:8000/models/x/y/", o), 0);
    assert_int_equal(check("HTTP://127.0.0.1:8000/models/a", o), 0);
    assert_int_equal(check("https://HUB.example/org", o), 0);
    assert_int_equal(check("https://hub.example/org/m/a.safetensors", o), 0);
    assert_int_equal(check("https://hub.example:443/org/a", o), 0); /* default port */
    assert_int_equal(check("https://hub.example/organisation/a", o), TV_E_OUTSIDE_ROOTS);
    assert_int_equal(check("http://hub.example/org/a", o), TV_E_OUTSIDE_ROOTS); /* scheme */
    assert_int_equal(check("http://127.0.0.1:80001/models/a", o), TV_E_BAD_REQUEST);
    assert_int_equal(check("http://127.0.0.1:800/models/a", o), TV_E_OUTSIDE_ROOTS);
    assert_int_equal(check("http://127.0.0.10:8000/models/a", o), TV_E_OUTSIDE_ROOTS);
    assert_int_equal(check("http://127.0.0.1:8000/model/a", o), TV_E_OUTSIDE_ROOTS);
    assert_int_equal(check("http://127.0.0.1:8000/models", o), TV_E_OUTSIDE_ROOTS);
    assert_int_equal(check("http://127.0.0.1:8000/models/../etc/", o), TV_E_BAD_REQUEST);
    tv_error e = {0};
    assert_int_equal(tv__url_origins_check("http://h/a", "", &e), TV_E_OUTSIDE_ROOTS);
    assert_non_null(strstr(e.msg, "import.origins"));
    assert_int_equal(tv__url_origins_check("http://h/a", NULL, &e), TV_E_OUTSIDE_ROOTS);
    assert_int_equal(tv__url_origins_check("http://h/a", " , ", &e), TV_E_OUTSIDE_ROOTS);
    assert_int_equal(tv__url_origins_check("http://h/a", "http://x/,nope", &e), TV_E_INVALID_ARG);
    assert_int_equal(tv__url_origins_validate("http://a/, https://b:9/c", &e), 0);
    assert_int_equal(tv__url_origins_validate("", &e), 0);
    assert_int_equal(tv__url_origins_validate("http://u:p@a/", &e), TV_E_INVALID_ARG);
    assert_int_equal(tv__url_origins_validate("ftp://a/", &e), TV_E_INVALID_ARG);
}

static void test_s3_parse(void **state)
{
    (void)state;
    tv__url u;
    assert_int_equal(tv__url_parse("s3://my-bucket.1/models/a.safetensors", &u, NULL), 0);
    assert_true(u.s3);
    assert_false(u.https);
    assert_string_equal(u.host, "my-bucket.1");
    assert_int_equal(u.port, 0);
    assert_string_equal(u.path, "/models/a.safetensors");
    assert_int_equal(tv__url_parse("S3://bkt/", &u, NULL), 0);
    assert_string_equal(u.path, "/");
    static const char *const bad[] = {
        "s3://",
        "s3://bkt",
        "s3://ab/k",
        "s3://Bkt/k",
        "s3://bk_t/k",
        "s3://-bkt/k",
        "s3://bkt-/k",
        "s3://bkt:9000/k",
        "s3://u:p@bkt/k",
        "s3://bkt/a/../b",
        "s3://bkt/a?x=1",
        "s3://bkt/a%2Fb",
        "s3://bkt/a b",
        "s3://[::1]/k",
        "s3://a234567890123456789012345678901234567890123456789012345678901234/k",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        tv_error e = {0};
        if (tv__url_parse(bad[i], &u, &e) != TV_E_BAD_REQUEST)
            fail_msg("accepted '%s'", bad[i]);
        assert_null(strstr(e.msg, "u:p"));
    }
}

static void test_s3_origins(void **state)
{
    (void)state;
    const char *o = "s3://bkt/models/, http://127.0.0.1:9000/bkt/, s3://other/";
    assert_int_equal(check("s3://bkt/models/a.safetensors", o), 0);
    assert_int_equal(check("s3://bkt/models/x/", o), 0);
    assert_int_equal(check("s3://bkt/modelsx/a.safetensors", o), TV_E_OUTSIDE_ROOTS);
    assert_int_equal(check("s3://bkt/a.safetensors", o), TV_E_OUTSIDE_ROOTS);
    assert_int_equal(check("s3://bkt2/models/a.safetensors", o), TV_E_OUTSIDE_ROOTS);
    assert_int_equal(check("s3://other/any/thing.safetensors", o), 0); /* a whole bucket */
    assert_int_equal(check("s3://othe/x.safetensors", o), TV_E_OUTSIDE_ROOTS);
    /* An http prefix naming the same bytes path-style is not an s3 prefix. */
    assert_int_equal(check("s3://bkt/x.safetensors", "http://127.0.0.1:9000/bkt/"),
                     TV_E_OUTSIDE_ROOTS);
    assert_int_equal(check("http://127.0.0.1:9000/bkt/x.safetensors", "s3://bkt/"),
                     TV_E_OUTSIDE_ROOTS);
    tv_error e = {0};
    assert_int_equal(tv__url_origins_validate("s3://bkt/models/, https://h/", &e), 0);
    assert_int_equal(tv__url_origins_validate("s3://BKT/", &e), TV_E_INVALID_ARG);
}

static void test_s3_object_url(void **state)
{
    (void)state;
    tv__url u;
    char out[TV__URL_MAX + 1];
    tv_error e = {0};
    assert_int_equal(tv__url_parse("s3://bkt/models/m/a%20b.safetensors", &u, NULL), 0);
    assert_int_equal(
        tv__s3_object_url("http://127.0.0.1:9000", "eu-west-1", &u, out, sizeof out, &e), 0);
    assert_string_equal(out, "http://127.0.0.1:9000/bkt/models/m/a%20b.safetensors");
    assert_int_equal(
        tv__s3_object_url("https://minio.example:9000//", NULL, &u, out, sizeof out, &e), 0);
    assert_string_equal(out, "https://minio.example:9000/bkt/models/m/a%20b.safetensors");
    assert_int_equal(tv__s3_object_url("", "eu-west-1", &u, out, sizeof out, &e), 0);
    assert_string_equal(out, "https://s3.eu-west-1.amazonaws.com/bkt/models/m/a%20b.safetensors");
    assert_int_equal(tv__s3_object_url(NULL, "", &u, out, sizeof out, &e), 0);
    assert_string_equal(out, "https://s3.us-east-1.amazonaws.com/bkt/models/m/a%20b.safetensors");
    static const char *const bad_ep[] = {"127.0.0.1:9000", "http://h/base", "ftp://h",
                                         "http://u:p@h",   "s3://bkt",      "http://h?x"};
    for (size_t i = 0; i < sizeof bad_ep / sizeof *bad_ep; i++) {
        if (tv__s3_object_url(bad_ep[i], NULL, &u, out, sizeof out, &e) != TV_E_INVALID_ARG)
            fail_msg("accepted endpoint '%s'", bad_ep[i]);
        assert_non_null(strstr(e.msg, "s3.endpoint"));
    }
    assert_int_equal(tv__s3_object_url("http://h", NULL, &u, out, 20, &e), TV_E_BAD_REQUEST);
    tv__url h;
    assert_int_equal(tv__url_parse("http://h/a", &h, NULL), 0);
    assert_int_equal(tv__s3_object_url("http://h", NULL, &h, out, sizeof out, &e), TV_E_INTERNAL);
}

static void test_content_range(void **state)
{
    (void)state;
    uint64_t a, b, t;
    assert_int_equal(tv__content_range_parse("bytes 0-99/100", &a, &b, &t), 0);
    assert_true(a == 0 && b == 99 && t == 100);
    assert_int_equal(tv__content_range_parse("  Bytes 5-5/6\r\n", &a, &b, &t), 0);
    assert_true(a == 5 && b == 5 && t == 6);
    assert_int_equal(
        tv__content_range_parse("bytes 0-18446744073709551614/18446744073709551615", &a, &b, &t),
        0);
    assert_true(b == UINT64_MAX - 1 && t == UINT64_MAX);
    static const char *const bad[] = {
        NULL,
        "",
        "bytes",
        "bytes */100",
        "bytes 0-99/*",
        "bytes 5-4/100",
        "bytes 0-100/100",
        "bytes 0-9/10x",
        "items 0-9/10",
        "bytes -1-9/10",
        "bytes 0-9",
        "bytes 0 -9/10",
        "bytes 0-99999999999999999999/100000000000000000000",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        if (tv__content_range_parse(bad[i], &a, &b, &t) == 0)
            fail_msg("accepted '%s'", bad[i] ? bad[i] : "(null)");
}

/* ---- tv_checkpoint_open_io over in-memory files ---- */

typedef struct mem_file {
    const char *name;
    char *data;
    size_t len;
} mem_file;

typedef struct mem_fs {
    mem_file f[4];
    size_t n, stats, reads;
} mem_fs;

static mem_file *mem_find(mem_fs *fs, const char *name)
{
    for (size_t i = 0; i < fs->n; i++)
        if (strcmp(fs->f[i].name, name) == 0)
            return &fs->f[i];
    return NULL;
}

static int mem_stat(void *ctx, const char *name, uint64_t *len, char *path, size_t path_len,
                    tv_error *err)
{
    mem_fs *fs = ctx;
    mem_file *f = mem_find(fs, name);
    fs->stats++;
    if (!f)
        return tv__seterr(err, TV_E_CKPT_NOT_FOUND, "%s: not found", name);
    *len = f->len;
    snprintf(path, path_len, "mem://%s", name);
    return 0;
}

static int mem_read(void *ctx, const char *name, void *buf, size_t len, uint64_t off, tv_error *err)
{
    mem_fs *fs = ctx;
    mem_file *f = mem_find(fs, name);
    fs->reads++;
    if (!f || off > f->len || len > f->len - off)
        return tv__seterr(err, -EIO, "%s: bad read", name);
    memcpy(buf, f->data + off, len);
    return 0;
}

static void add_shard(mem_fs *fs, const char *name, const char *hdr, size_t data_len)
{
    size_t n = strlen(hdr);
    mem_file *f = &fs->f[fs->n++];
    f->name = name;
    f->len = 8 + n + data_len;
    f->data = calloc(1, f->len);
    for (int i = 0; i < 8; i++)
        f->data[i] = (char)((n >> (8 * i)) & 0xff);
    memcpy(f->data + 8, hdr, n);
}

static void add_text(mem_fs *fs, const char *name, const char *text)
{
    mem_file *f = &fs->f[fs->n++];
    f->name = name;
    f->len = strlen(text);
    f->data = strdup(text);
}

static void mem_free(mem_fs *fs)
{
    for (size_t i = 0; i < fs->n; i++)
        free(fs->f[i].data);
}

static void test_open_io(void **state)
{
    (void)state;
    mem_fs fs = {0};
    add_shard(&fs, "s1.safetensors",
              "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8);
    add_shard(&fs, "s2.safetensors",
              "{\"b\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]}}", 3);
    add_text(&fs, "model.safetensors.index.json",
             "{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s2.safetensors\"}}");
    tv_checkpoint_io io = {.ctx = &fs, .stat = mem_stat, .read = mem_read};
    tv_checkpoint *ck = NULL;
    tv_error e = {0};
    assert_int_equal(
        tv_checkpoint_open_io(&io, "model.safetensors.index.json", true, NULL, &ck, &e), 0);
    assert_int_equal(tv_checkpoint_n_shards(ck), 2);
    assert_int_equal(tv_checkpoint_n_tensors(ck), 2);
    assert_string_equal(tv_checkpoint_index_path(ck), "mem://model.safetensors.index.json");
    tv_shard_info si;
    assert_int_equal(tv_checkpoint_shard(ck, 1, &si), 0);
    assert_string_equal(si.name, "s2.safetensors");
    assert_string_equal(si.path, "mem://s2.safetensors");
    assert_int_equal(si.file_len, fs.f[1].len);
    assert_int_equal(si.inode, 0);
    tv_checkpoint_close(ck);
    /* one shard */
    assert_int_equal(tv_checkpoint_open_io(&io, "s1.safetensors", false, NULL, &ck, &e), 0);
    assert_int_equal(tv_checkpoint_n_tensors(ck), 1);
    assert_null(tv_checkpoint_index_path(ck));
    tv_checkpoint_close(ck);
    /* the index lists a tensor the shard lacks */
    free(fs.f[2].data);
    fs.f[2].data = strdup("{\"weight_map\":{\"a\":\"s1.safetensors\",\"c\":\"s2.safetensors\"}}");
    fs.f[2].len = strlen(fs.f[2].data);
    assert_int_not_equal(
        tv_checkpoint_open_io(&io, "model.safetensors.index.json", true, NULL, &ck, &e), 0);
    assert_null(ck);
    /* a shard name that leaves the directory is refused before any read of it */
    free(fs.f[2].data);
    fs.f[2].data = strdup("{\"weight_map\":{\"a\":\"../s1.safetensors\"}}");
    fs.f[2].len = strlen(fs.f[2].data);
    fs.stats = 0;
    assert_int_equal(
        tv_checkpoint_open_io(&io, "model.safetensors.index.json", true, NULL, &ck, &e),
        TV_E_IDX_SHARD_NAME);
    assert_int_equal(fs.stats, 1);
    /* a missing shard: the callback's code */
    assert_int_equal(tv_checkpoint_open_io(&io, "nope.safetensors", false, NULL, &ck, &e),
                     TV_E_CKPT_NOT_FOUND);
    /* an index over the header limit is refused before it is read */
    tv_st_limits lim = {.max_header_len = 8};
    fs.reads = 0;
    assert_int_equal(
        tv_checkpoint_open_io(&io, "model.safetensors.index.json", true, &lim, &ck, &e),
        TV_E_ST_HEADER_TOO_LARGE);
    assert_int_equal(fs.reads, 0);
    /* a corrupt header */
    mem_fs bad = {0};
    add_shard(&bad, "x.safetensors",
              "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]", 8);
    io.ctx = &bad;
    assert_int_not_equal(tv_checkpoint_open_io(&io, "x.safetensors", false, NULL, &ck, &e), 0);
    assert_null(ck);
    assert_int_equal(tv_checkpoint_open_io(NULL, "x", false, NULL, &ck, &e), TV_E_INVALID_ARG);
    mem_free(&bad);
    mem_free(&fs);
}

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Says stop once its deadline (mono_s) passed. */
static bool after_deadline(void *ctx)
{
    return mono_s() >= *(const double *)ctx;
}

/* The backoff sleeps its time without a cancel, and returns within 100 ms
 * of a cancel (at once for one already said), true; a transfer cut short
 * by the cancel is told apart from a network error. */
static void test_backoff_and_cancel(void **state)
{
    (void)state;
    double t0 = mono_s();
    assert_false(tv__http_backoff(1, NULL)); /* 200 ms */
    double took = mono_s() - t0;
    assert_true(took >= 0.19 && took < 1.0);
    double deadline = mono_s() + 0.15;
    tv__http_cancel c = {.cancelled = after_deadline, .ctx = &deadline};
    t0 = mono_s();
    assert_true(tv__http_backoff(6, &c)); /* 6.4 s, cancelled after 150 ms */
    took = mono_s() - t0;
    assert_true(took >= 0.14 && took < 0.5);
    t0 = mono_s();
    assert_true(tv__http_backoff(6, &c)); /* already cancelled */
    assert_true(mono_s() - t0 < 0.05);
    assert_true(tv__http_cancelled(&c));
    assert_false(tv__http_cancelled(NULL));
    assert_false(tv__http_cancelled(&(tv__http_cancel){0}));
    assert_true(tv__http_was_cancelled(CURLE_ABORTED_BY_CALLBACK, NULL));
    assert_true(tv__http_was_cancelled(CURLE_RECV_ERROR, &c));
    assert_false(tv__http_was_cancelled(CURLE_OK, &c));
    assert_false(tv__http_was_cancelled(CURLE_RECV_ERROR, NULL));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_accepts),
        cmocka_unit_test(test_parse_refuses),
        cmocka_unit_test(test_credentials_refused_and_not_repeated),
        cmocka_unit_test(test_origins),
        cmocka_unit_test(test_s3_parse),
        cmocka_unit_test(test_s3_origins),
        cmocka_unit_test(test_s3_object_url),
        cmocka_unit_test(test_content_range),
        cmocka_unit_test(test_backoff_and_cancel),
        cmocka_unit_test(test_open_io),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
