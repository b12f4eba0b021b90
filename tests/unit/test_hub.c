/* Unit tests of the Hugging Face Hub importer's pure parts
 * (server/import/src_hub.c): hf:// source parsing (what is refused and
 * why), the revision listing's JSON, the git blob SHA-1; and the redirect
 * rules of server/httpc/httpc.c (a hop's URL, private addresses). */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "httpc/httpc.h"
#include "import/source.h"
#include "util/internal.h"

static void test_parse_accepts(void **state)
{
    (void)state;
    tv__hub_ref r;
    assert_int_equal(tv__hub_parse("hf://meta-llama/Llama-3.1-8B", &r, NULL), 0);
    assert_string_equal(r.repo, "meta-llama/Llama-3.1-8B");
    assert_string_equal(r.rev, "main");
    assert_false(r.is_commit);
    assert_int_equal(tv__hub_parse("HF://gpt2@v1.0", &r, NULL), 0);
    assert_string_equal(r.repo, "gpt2");
    assert_string_equal(r.rev, "v1.0");
    assert_int_equal(tv__hub_parse("hf://org/m_x@refs/pr/1", &r, NULL), 0);
    assert_string_equal(r.rev, "refs/pr/1");
    assert_int_equal(tv__hub_parse("hf://org/m@0123456789abcdef0123456789abcdef01234567", &r, NULL),
                     0);
    assert_true(r.is_commit);
    /* upper-case hex is a branch name to the Hub, not a commit */
    assert_int_equal(tv__hub_parse("hf://org/m@0123456789ABCDEF0123456789abcdef01234567", &r, NULL),
                     0);
    assert_false(r.is_commit);
    assert_true(tv__src_is_hub("hf://x"));
    assert_false(tv__src_is_hub("https://huggingface.co/x"));
    assert_false(tv__src_is_url("hf://org/m")); /* resolved into a pull, not an origin */
}

static void test_parse_refuses(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "hf://",
        "hf://@main",
        "hf://org/",
        "hf:///m",
        "hf://a/b/c",
        "hf://org/..",
        "hf://../m",
        "hf://org/a..b",
        "hf://org/a--b",
        "hf://org/-m",
        "hf://org/m.",
        "hf://org/m x",
        "hf://org/m%2e",
        "hf://org/m@",
        "hf://org/m@a..b",
        "hf://org/m@/main",
        "hf://org/m@main/",
        "hf://org/m@a//b",
        "hf://org/m@a b",
        "hf://org/m@a?b",
        "hf://org/m@a@b",
        "hf://user:pw@org/m",
        "https://huggingface.co/org/m",
        "hf://0123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789/m",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        tv__hub_ref r;
        tv_error e = {0};
        int rc = tv__hub_parse(bad[i], &r, &e);
        if (rc != TV_E_BAD_REQUEST)
            fail_msg("'%s' was not refused (rc %d)", bad[i], rc);
        assert_true(strlen(e.msg) > 0);
    }
}

static const char listing[] =
    "{\"_id\":\"x\",\"id\":\"org/m\",\"sha\":\"ABCDEF0123456789abcdef0123456789abcdef01\","
    "\"siblings\":["
    "{\"rfilename\":\".gitattributes\",\"size\":1519,"
    "\"blobId\":\"a6344aac8c09253b3b630fb776ae94478aa0275b\"},"
    "{\"rfilename\":\"config.json\",\"size\":665,"
    "\"blobId\":\"10c66461e4c7a7e7ca2dfa8c3b0a4d7a6b7c3f2e\"},"
    "{\"rfilename\":\"model.safetensors\",\"size\":548105171,"
    "\"blobId\":\"9b3c2e1e0d2b0f1a8f7e6d5c4b3a291807f6e5d4\","
    "\"lfs\":{\"sha256\":\"248DFC3911869EC493C76E65BF2FCF7F615828B0254C12B473182F0F81D3A707\","
    "\"size\":548105171,\"pointerSize\":135}},"
    "{\"rfilename\":\"sub/dir/x.txt\"}"
    "]}";

static void test_listing_parse(void **state)
{
    (void)state;
    tv__hub_listing *l = NULL;
    assert_int_equal(tv__hub_listing_parse(listing, strlen(listing), &l, NULL), 0);
    assert_string_equal(l->commit, "abcdef0123456789abcdef0123456789abcdef01");
    assert_int_equal(l->n_files, 4);
    assert_string_equal(l->files[1].path, "config.json");
    assert_int_equal(l->files[1].size, 665);
    assert_string_equal(l->files[1].blob, "10c66461e4c7a7e7ca2dfa8c3b0a4d7a6b7c3f2e");
    assert_string_equal(l->files[1].sha256, "");
    assert_string_equal(l->files[2].sha256,
                        "248dfc3911869ec493c76e65bf2fcf7f615828b0254c12b473182f0f81d3a707");
    assert_int_equal(l->files[2].size, 548105171);
    assert_int_equal(l->files[3].size, UINT64_MAX); /* without ?blobs=true: unknown */
    tv__hub_listing_free(l);
    tv__hub_listing_free(NULL);
}

static void test_listing_refuses(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "",
        "[]",
        "{\"sha\":\"abc\",\"siblings\":[]}",
        "{\"siblings\":[]}",
        "{\"sha\":\"abcdef0123456789abcdef0123456789abcdef01\"}",
        "{\"sha\":\"abcdef0123456789abcdef0123456789abcdef01\",\"siblings\":{}}",
        "{\"sha\":\"abcdef0123456789abcdef0123456789abcdef01\",\"siblings\":[{}]}",
        "{\"sha\":\"abcdef0123456789abcdef0123456789abcdef01\",\"siblings\":[{\"rfilename\":\"\"}]}",
        "{\"sha\":\"abcdef0123456789abcdef0123456789abcdef01\",\"siblings\":[{\"rfilename\":\"a\",\"size\":-1}]}",
        "{\"sha\":\"abcdef0123456789abcdef0123456789abcdef01\",\"siblings\":[{\"rfilename\":\"a\",\"size\":\"1\"}]}",
        "{\"sha\":\"abcdef0123456789abcdef0123456789abcdef01\",\"siblings\":[{\"rfilename\":\"a\",\"lfs\":{\"sha256\":\"00\",\"size\":1}}]}",
        "{\"sha\":\"abcdef0123456789abcdef0123456789abcdef01\",\"siblings\":[{\"rfilename\":\"a\",\"lfs\":{\"size\":1}}]}",
        "{\"sha\":\"abcdef0123456789abcdef0123456789abcdef01\",\"sha\":\"abcdef0123456789abcdef0123456789abcdef01\",\"siblings\":[]}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        tv__hub_listing *l = NULL;
        tv_error e = {0};
        int rc = tv__hub_listing_parse(bad[i], strlen(bad[i]), &l, &e);
        if (rc != TV_E_BAD_REQUEST)
            fail_msg("listing %zu was not refused (rc %d)", i, rc);
        assert_null(l);
        assert_true(strlen(e.msg) > 0);
    }
}

static void test_git_blob_sha1(void **state)
{
    (void)state;
    char hex[41];
    /* git hash-object of an empty file, and of "hello world\n" */
    tv__hub_git_blob_sha1("", 0, hex);
    assert_string_equal(hex, "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391");
    tv__hub_git_blob_sha1("hello world\n", 12, hex);
    assert_string_equal(hex, "3b18e512dba79e4c8300dd08aeb37f8e728b8dad");
}

static void test_redirect_rules(void **state)
{
    (void)state;
    const tv__http_redirects strict = {.max = 5}, lax = {.max = 5, .allow_http = true};
    const char *first = "https://huggingface.co/org/m/resolve/abc/model.safetensors";
    tv_error e = {0};
    assert_int_equal(tv__http_redirect_check(
                         &strict, first, "https://cdn-lfs.hf.co/repos/x/y?X-Amz-Signature=z", &e),
                     0);
    assert_int_equal(tv__http_redirect_check(&strict, first, "http://cdn-lfs.hf.co/x", &e),
                     TV_E_FORBIDDEN);
    assert_non_null(strstr(e.msg, "https"));
    assert_int_equal(tv__http_redirect_check(&lax, first, "http://cdn-lfs.hf.co/x", &e), 0);
    /* an http endpoint's own relative hops keep its scheme */
    assert_int_equal(
        tv__http_redirect_check(&strict, "http://127.0.0.1:8/a", "http://127.0.0.1:8/b", &e), 0);
    assert_int_equal(tv__http_redirect_check(&lax, first, "ftp://cdn/x", &e), TV_E_FORBIDDEN);
    assert_int_equal(tv__http_redirect_check(&lax, first, "file:///etc/passwd", &e),
                     TV_E_FORBIDDEN);
    assert_int_equal(tv__http_redirect_check(&lax, first, "https://u:p@cdn/x", &e), TV_E_FORBIDDEN);
    assert_int_equal(tv__http_redirect_check(&lax, first, "/relative", &e), TV_E_FORBIDDEN);
    char o[300];
    assert_int_equal(tv__http_origin("HTTPS://HuggingFace.co/x?y", o, sizeof(o)), 0);
    assert_string_equal(o, "https://huggingface.co:443");
    assert_int_equal(tv__http_origin("http://127.0.0.2:81/", o, sizeof(o)), 0);
    assert_string_equal(o, "http://127.0.0.2:81");
    assert_int_equal(tv__http_origin("s3://b/k", o, sizeof(o)), -1);
}

static void test_private_addresses(void **state)
{
    (void)state;
    static const char *const priv[] = {"127.0.0.1",
                                       "127.0.0.2",
                                       "10.1.2.3",
                                       "172.16.0.1",
                                       "172.31.255.255",
                                       "192.168.1.1",
                                       "169.254.169.254",
                                       "100.64.0.1",
                                       "0.0.0.0",
                                       "224.0.0.1",
                                       "::1",
                                       "::",
                                       "fe80::1",
                                       "fd00::1",
                                       "fc00::2",
                                       "::ffff:127.0.0.1",
                                       "::ffff:10.0.0.1",
                                       "ff02::1",
                                       "not an address",
                                       ""};
    static const char *const pub[] = {"18.154.227.67",  "172.32.0.1",
                                      "100.128.0.1",    "2600:9000:2489:7200:17:d4e1:b400:93a1",
                                      "::ffff:8.8.8.8", "192.169.0.1"};
    for (size_t i = 0; i < sizeof(priv) / sizeof(priv[0]); i++)
        if (!tv__http_addr_private(priv[i]))
            fail_msg("%s is private", priv[i]);
    for (size_t i = 0; i < sizeof(pub) / sizeof(pub[0]); i++)
        if (tv__http_addr_private(pub[i]))
            fail_msg("%s is public", pub[i]);
    assert_true(tv__http_addr_private(NULL));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_accepts),     cmocka_unit_test(test_parse_refuses),
        cmocka_unit_test(test_listing_parse),     cmocka_unit_test(test_listing_refuses),
        cmocka_unit_test(test_git_blob_sha1),     cmocka_unit_test(test_redirect_rules),
        cmocka_unit_test(test_private_addresses),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
