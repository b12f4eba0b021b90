/* Unit tests for the safetensors layer (core/src/st): header parsing and
 * validation, tiling of the data section, dtypes, the HF index, directory
 * discovery and the name index.
 *
 * Invariants kept by these tests: every rejection asserts the exact TV_E_*
 * code, that err.code matches it, that *out stays NULL, and that err.msg
 * names the offending tensor or shard; shard images are built in memory
 * (8-byte little-endian length + header + data) and freed before the
 * checkpoint is inspected, so a parser that kept pointers into its input
 * fails under ASan; index and directory cases live in a mkdtemp() tree under
 * /tmp that each test's teardown removes. */
#include <errno.h>
#include <ftw.h>
#include <jansson.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <setjmp.h>

#include <cmocka.h>

#include "tensorvault/checkpoint.h"
#include "tensorvault/errors.h"
#include "tv_test.h"

#define SHARD "model.safetensors"
#define S1    "model-00001-of-00002.safetensors"
#define S2    "model-00002-of-00002.safetensors"
#define IDX   "model.safetensors.index.json"

/* ---- helpers: string builder, images, assertions ---- */

typedef struct sb {
    char *p;
    size_t len, cap;
} sb;

static void sb_printf(sb *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sb *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    assert_true(n >= 0);
    if (b->len + (size_t)n + 1 > b->cap) {
        size_t ncap = b->cap ? b->cap : 256;
        while (ncap < b->len + (size_t)n + 1)
            ncap *= 2;
        b->p = realloc(b->p, ncap);
        assert_non_null(b->p);
        b->cap = ncap;
    }
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

/* Copy of s with ' turned into " so JSON reads naturally in C literals. */
static char *jq(const char *s)
{
    char *r = strdup(s);
    assert_non_null(r);
    for (char *p = r; *p; p++)
        if (*p == '\'')
            *p = '"';
    return r;
}

/* prefix(n) + payload, little-endian, regardless of what payload holds. */
static unsigned char *raw_image(uint64_t n, const void *payload, size_t payload_len,
                                size_t *img_len)
{
    unsigned char *img = malloc(8 + payload_len);
    assert_non_null(img);
    for (int i = 0; i < 8; i++)
        img[i] = (unsigned char)(n >> (8 * i));
    if (payload_len)
        memcpy(img + 8, payload, payload_len);
    *img_len = 8 + payload_len;
    return img;
}

/* 8-byte LE length + header (after jq) + data_len bytes of a pattern. */
static unsigned char *shard_image(const char *hdr, size_t data_len, size_t *img_len)
{
    char *h = jq(hdr);
    size_t hl = strlen(h);
    unsigned char *img = malloc(8 + hl + data_len);
    assert_non_null(img);
    for (int i = 0; i < 8; i++)
        img[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(img + 8, h, hl);
    for (size_t i = 0; i < data_len; i++)
        img[8 + hl + i] = (unsigned char)(i * 7 + 1);
    *img_len = 8 + hl + data_len;
    free(h);
    return img;
}

static int parse_hdr(const char *hdr, size_t data_len, const tv_st_limits *lim, tv_checkpoint **ck,
                     tv_error *err)
{
    size_t len;
    unsigned char *img = shard_image(hdr, data_len, &len);
    int rc = tv_checkpoint_parse_shard(img, len, len, SHARD, lim, ck, err);
    free(img);
    return rc;
}

/* rc must be want; on failure err->code must be want and err->msg must hold
 * every needle. */
static void check_rc_at(const char *file, int line, int rc, int want, const tv_error *err,
                        const char *const *needles)
{
    if (rc != want) {
        print_error("rc %s (%d), want %s (%d); msg: %s\n", tv_err_name(rc), rc, tv_err_name(want),
                    want, err->msg);
        _fail(file, line);
    }
    if (want == 0)
        return;
    if (err->code != want) {
        print_error("err.code %s, want %s\n", tv_err_name(err->code), tv_err_name(want));
        _fail(file, line);
    }
    for (; *needles; needles++) {
        if (!strstr(err->msg, *needles)) {
            print_error("err.msg \"%s\" does not mention \"%s\"\n", err->msg, *needles);
            _fail(file, line);
        }
    }
}
#define NEEDLES(...) ((const char *const[]){__VA_ARGS__, NULL})
#define CHECK_RC(rc, want, err, ...)                                                               \
    check_rc_at(__FILE__, __LINE__, (rc), (want), (err), NEEDLES(__VA_ARGS__))

static void reject_at(const char *file, int line, const char *hdr, size_t data_len,
                      const tv_st_limits *lim, int want, const char *const *needles)
{
    tv_checkpoint *ck = (tv_checkpoint *)&ck; /* must be reset to NULL */
    tv_error err = {0};
    int rc = parse_hdr(hdr, data_len, lim, &ck, &err);
    bool out_null = ck == NULL;
    if (rc == 0)
        tv_checkpoint_close(ck);
    check_rc_at(file, line, rc, want, &err, needles);
    if (!out_null) {
        print_error("*out not NULL after a failure\n");
        _fail(file, line);
    }
}
/* Every header-level rejection names the shard; callers add more needles. */
#define REJECT(hdr, data_len, want, ...)                                                           \
    reject_at(__FILE__, __LINE__, (hdr), (data_len), NULL, (want), NEEDLES(SHARD, __VA_ARGS__))
#define REJECT_LIM(hdr, data_len, lim, want, ...)                                                  \
    reject_at(__FILE__, __LINE__, (hdr), (data_len), (lim), (want), NEEDLES(SHARD, __VA_ARGS__))

static tv_checkpoint *accept_at(const char *file, int line, const char *hdr, size_t data_len,
                                const tv_st_limits *lim)
{
    tv_checkpoint *ck = NULL;
    tv_error err = {0};
    int rc = parse_hdr(hdr, data_len, lim, &ck, &err);
    if (rc != 0 || !ck) {
        print_error("rejected: %s: %s\n", tv_err_name(rc), err.msg);
        _fail(file, line);
    }
    return ck;
}
#define ACCEPT(hdr, data_len) accept_at(__FILE__, __LINE__, (hdr), (data_len), NULL)

static tv_tensor_info tensor_at(const tv_checkpoint *ck, size_t i)
{
    tv_tensor_info ti;
    memset(&ti, 0, sizeof(ti));
    assert_int_equal(tv_checkpoint_tensor(ck, i, &ti), 0);
    return ti;
}

static size_t find_name(const tv_checkpoint *ck, const char *name)
{
    size_t idx = SIZE_MAX;
    assert_int_equal(tv_checkpoint_find(ck, name, strlen(name), &idx), 0);
    return idx;
}

/* Shard 0's metadata presence, pair count and tensor count. */
static void check_shard0(const tv_checkpoint *ck, bool has_metadata, size_t n_metadata,
                         size_t n_tensors)
{
    tv_shard_info si;
    assert_int_equal(tv_checkpoint_shard(ck, 0, &si), 0);
    assert_int_equal(si.has_metadata, has_metadata);
    assert_int_equal(si.n_metadata, n_metadata);
    assert_int_equal(si.n_tensors, n_tensors);
}

/* ---- header framing ---- */

static void test_header_len_zero(void **state)
{
    (void)state;
    size_t len;
    unsigned char *img = raw_image(0, "{}", 2, &len);
    tv_checkpoint *ck = NULL;
    tv_error err = {0};
    int rc = tv_checkpoint_parse_shard(img, len, len, SHARD, NULL, &ck, &err);
    free(img);
    CHECK_RC(rc, TV_E_ST_HEADER_EMPTY, &err, SHARD, "length is 0");
    assert_null(ck);
}

static void test_header_too_large_limit(void **state)
{
    (void)state;
    const char *hdr = "{'t':{'dtype':'U8','shape':[1],'data_offsets':[0,1]}}";
    size_t n = strlen(hdr);
    tv_st_limits lim = {.max_header_len = n - 1};
    REJECT_LIM(hdr, 1, &lim, TV_E_ST_HEADER_TOO_LARGE, "over the limit");
    lim.max_header_len = n; /* the limit itself is allowed */
    tv_checkpoint *ck = NULL;
    tv_error err = {0};
    assert_int_equal(parse_hdr(hdr, 1, &lim, &ck, &err), 0);
    tv_checkpoint_close(ck);
}

static void test_header_too_large_default(void **state)
{
    (void)state;
    tv_checkpoint *ck = NULL;
    tv_error err = {0};
    size_t len;
    unsigned char *img = raw_image(TV_ST_DEFAULT_MAX_HEADER_LEN + 1, "{}      ", 8, &len);
    int rc = tv_checkpoint_parse_shard(img, len, len, SHARD, NULL, &ck, &err);
    CHECK_RC(rc, TV_E_ST_HEADER_TOO_LARGE, &err, SHARD, "100000001", "100000000");
    assert_null(ck);
    /* A caller that read only the prefix of a big file: the limit still
     * decides, not the buffer size. */
    memset(&err, 0, sizeof(err));
    rc = tv_checkpoint_parse_shard(img, len, 200000000, SHARD, NULL, &ck, &err);
    CHECK_RC(rc, TV_E_ST_HEADER_TOO_LARGE, &err, SHARD, "100000001");
    assert_null(ck);
    /* An explicit 0 in the limits also means the default. */
    tv_st_limits lim = {0};
    rc = tv_checkpoint_parse_shard(img, len, len, SHARD, &lim, &ck, &err);
    CHECK_RC(rc, TV_E_ST_HEADER_TOO_LARGE, &err, SHARD);
    free(img);
    /* Exactly the default is within the limit: it fails later, past EOF. */
    img = raw_image(TV_ST_DEFAULT_MAX_HEADER_LEN, "{}      ", 8, &len);
    rc = tv_checkpoint_parse_shard(img, len, len, SHARD, NULL, &ck, &err);
    CHECK_RC(rc, TV_E_ST_HEADER_PAST_EOF, &err, SHARD);
    free(img);
    /* A hostile N of 2^64-1 is over the limit, never an allocation. */
    img = raw_image(UINT64_MAX, "{}", 2, &len);
    rc = tv_checkpoint_parse_shard(img, len, len, SHARD, NULL, &ck, &err);
    CHECK_RC(rc, TV_E_ST_HEADER_TOO_LARGE, &err, SHARD);
    free(img);
}

static void test_header_past_eof(void **state)
{
    (void)state;
    tv_checkpoint *ck = NULL;
    tv_error err = {0};
    size_t len;
    const char *hdr = "{'t':{'dtype':'U8','shape':[1],'data_offsets':[0,1]}}";
    unsigned char *img = raw_image(100, hdr, 20, &len);
    int rc = tv_checkpoint_parse_shard(img, len, len, SHARD, NULL, &ck, &err);
    CHECK_RC(rc, TV_E_ST_HEADER_PAST_EOF, &err, SHARD, "past the end");
    assert_null(ck);
    /* Buffer holds less than file_len says, but still less than 8 + N. */
    rc = tv_checkpoint_parse_shard(img, len, 8 + 99, SHARD, NULL, &ck, &err);
    CHECK_RC(rc, TV_E_ST_HEADER_PAST_EOF, &err, SHARD);
    free(img);
    /* 8 + N overflows uint64 when the limit is lifted. */
    tv_st_limits lim = {.max_header_len = UINT64_MAX};
    img = raw_image(UINT64_MAX, "{}", 2, &len);
    rc = tv_checkpoint_parse_shard(img, len, len, SHARD, &lim, &ck, &err);
    CHECK_RC(rc, TV_E_ST_HEADER_PAST_EOF, &err, SHARD);
    assert_null(ck);
    free(img);
}

static void test_header_buffer_too_small(void **state)
{
    (void)state;
    tv_checkpoint *ck = NULL;
    tv_error err = {0};
    size_t len;
    unsigned char *img = raw_image(100, "{}", 2, &len);
    /* The file is big enough, but the caller's buffer does not hold N. */
    int rc = tv_checkpoint_parse_shard(img, len, 1000, SHARD, NULL, &ck, &err);
    CHECK_RC(rc, TV_E_INVALID_ARG, &err, SHARD);
    assert_null(ck);
    free(img);
    assert_int_equal(tv_checkpoint_parse_shard(NULL, 8, 8, SHARD, NULL, &ck, &err),
                     TV_E_INVALID_ARG);
}

static void test_file_short(void **state)
{
    (void)state;
    tv_checkpoint *ck = (tv_checkpoint *)&ck;
    tv_error err = {0};
    const unsigned char b[7] = {2, 0, 0, 0, 0, 0, 0};
    int rc = tv_checkpoint_parse_shard(b, sizeof(b), sizeof(b), SHARD, NULL, &ck, &err);
    CHECK_RC(rc, TV_E_FILE_SHORT, &err, SHARD);
    assert_null(ck);
    rc = tv_checkpoint_parse_shard(NULL, 0, 0, SHARD, NULL, &ck, &err);
    CHECK_RC(rc, TV_E_FILE_SHORT, &err, SHARD);
    /* Buffer of 8 but a file_len under 8. */
    const unsigned char b8[8] = {0};
    rc = tv_checkpoint_parse_shard(b8, sizeof(b8), 7, SHARD, NULL, &ck, &err);
    CHECK_RC(rc, TV_E_FILE_SHORT, &err, SHARD);
}

static void test_header_start(void **state)
{
    (void)state;
    REJECT(" {}", 0, TV_E_ST_HEADER_START, "0x20");
    REJECT("[]", 0, TV_E_ST_HEADER_START, "0x5b");
    REJECT("\n{}", 0, TV_E_ST_HEADER_START, "'{'");
    REJECT("null", 0, TV_E_ST_HEADER_START, "'{'");
}

static void test_utf8_bad_continuation(void **state)
{
    (void)state;
    REJECT("{'t\xC3\x28':1}", 0, TV_E_ST_UTF8, "invalid UTF-8", "byte 3");
    /* A lead byte with nothing after it at the very end of the header. */
    REJECT("{}  \xE2\x82", 0, TV_E_ST_UTF8, "invalid UTF-8");
    /* A stray continuation byte. */
    REJECT("{'\x80':1}", 0, TV_E_ST_UTF8, "invalid UTF-8");
}

static void test_utf8_overlong(void **state)
{
    (void)state;
    REJECT("{'\xC0\xAF':1}", 0, TV_E_ST_UTF8, "invalid UTF-8");
    REJECT("{'\xC1\xBF':1}", 0, TV_E_ST_UTF8, "invalid UTF-8");
    REJECT("{'\xE0\x80\xAF':1}", 0, TV_E_ST_UTF8, "invalid UTF-8");
    REJECT("{'\xF0\x80\x80\xAF':1}", 0, TV_E_ST_UTF8, "invalid UTF-8");
}

static void test_utf8_surrogate(void **state)
{
    (void)state;
    REJECT("{'\xED\xA0\x80':1}", 0, TV_E_ST_UTF8, "invalid UTF-8");
    REJECT("{'\xED\xBF\xBF':1}", 0, TV_E_ST_UTF8, "invalid UTF-8");
    /* Above U+10FFFF. */
    REJECT("{'\xF4\x90\x80\x80':1}", 0, TV_E_ST_UTF8, "invalid UTF-8");
    REJECT("{'\xF5\x80\x80\x80':1}", 0, TV_E_ST_UTF8, "invalid UTF-8");
}

static void test_utf8_valid_multibyte_names(void **state)
{
    (void)state;
    /* 2-, 3- and 4-byte sequences at their edges are accepted. */
    const char *hdr = "{'gewicht.\xC3\xBC':{'dtype':'U8','shape':[1],'data_offsets':[0,1]},"
                      "'\xE2\x82\xAC\xEF\xBF\xBD':{'dtype':'U8','shape':[1],'data_offsets':[1,2]},"
                      "'\xF0\x9F\x98\x80\xF4\x8F\xBF\xBF':{'dtype':'U8','shape':[1],"
                      "'data_offsets':[2,3]}}";
    tv_checkpoint *ck = ACCEPT(hdr, 3);
    assert_int_equal(tv_checkpoint_n_tensors(ck), 3);
    assert_int_equal(find_name(ck, "gewicht.\xC3\xBC"), 0);
    assert_int_equal(find_name(ck, "\xE2\x82\xAC\xEF\xBF\xBD"), 1);
    assert_int_equal(find_name(ck, "\xF0\x9F\x98\x80\xF4\x8F\xBF\xBF"), 2);
    tv_checkpoint_close(ck);
}

#define ENT_A "'a':{'dtype':'U8','shape':[1],'data_offsets':[0,1]}"
#define ENT_B "'b':{'dtype':'U8','shape':[1],'data_offsets':[1,2]}"

static void test_invalid_json(void **state)
{
    (void)state;
    REJECT("{'t':", 0, TV_E_ST_JSON, "header");
    REJECT("{" ENT_A ",}", 1, TV_E_ST_JSON, "header");
    REJECT("{} x", 0, TV_E_ST_JSON, "header");
    REJECT("{" ENT_A "}}", 1, TV_E_ST_JSON, "header");
    REJECT("{" ENT_A, 1, TV_E_ST_JSON, "header");
    REJECT("{" ENT_A " " ENT_B "}", 2, TV_E_ST_JSON, "header");
    REJECT("{'a' "
           "{'dtype':'U8','shape':[1],'data_offsets':[0,1]}}",
           1, TV_E_ST_JSON, "header");
    REJECT("{'a'}", 0, TV_E_ST_JSON, "header");
    REJECT("{", 0, TV_E_ST_JSON, "header");
    REJECT("{'a':}", 0, TV_E_ST_JSON, "header");
    REJECT("{'a':]}", 0, TV_E_ST_JSON, "header");
    REJECT("{1:2}", 0, TV_E_ST_JSON, "header");
    REJECT("{,}", 0, TV_E_ST_JSON, "header");
    REJECT("{'unterminated", 0, TV_E_ST_JSON, "header");
    REJECT("{'t':{'dtype':'U8' 'shape':[1]}}", 0, TV_E_ST_JSON, "header");
    REJECT("{'t':{'dtype':'U8','shape':[1],'data_offsets':[0,1}}", 1, TV_E_ST_JSON, "header");
    REJECT("{" ENT_A ",'b':tru}", 1, TV_E_ST_JSON, "header");
    REJECT("{'a\\x':1}", 0, TV_E_ST_JSON, "header");
    /* NUL padding is not JSON whitespace. */
    size_t len;
    unsigned char *img = raw_image(4, "{}\0\0", 4, &len);
    tv_checkpoint *ck = NULL;
    tv_error err = {0};
    int rc = tv_checkpoint_parse_shard(img, len, len, SHARD, NULL, &ck, &err);
    free(img);
    CHECK_RC(rc, TV_E_ST_JSON, &err, SHARD);
    assert_null(ck);
}

/* The header is walked entry by entry: whitespace, escapes and punctuation
 * inside strings must not confuse the walker. */
static void test_json_walker_tricky_but_valid(void **state)
{
    (void)state;
    tv_checkpoint *ck = ACCEPT("{ \t\r\n'a' \n: {'dtype' : 'U8' , 'shape':[ 1 ],"
                               "'data_offsets':[0,1] } \r\n, 'x,}]{[y':{'dtype':'U8','shape':[1],"
                               "'data_offsets':[1,2]},'q\\\"\\\\\\u0077':{'dtype':'U8',"
                               "'shape':[1],'data_offsets':[2,3]},"
                               "'__metadata__':{'k':'],}{[\\\\','\\u00e9':'\\\"'}\n}\t  ",
                               3);
    assert_int_equal(tv_checkpoint_n_tensors(ck), 3);
    assert_int_equal(find_name(ck, "a"), 0);
    assert_int_equal(find_name(ck, "x,}]{[y"), 1);
    assert_int_equal(find_name(ck, "q\"\\w"), 2);
    const char *k = NULL, *v = NULL;
    assert_int_equal(tv_checkpoint_shard_metadata(ck, 0, 0, &k, &v), 0);
    assert_string_equal(k, "k");
    assert_string_equal(v, "],}{[\\");
    assert_int_equal(tv_checkpoint_shard_metadata(ck, 0, 1, &k, &v), 0);
    assert_string_equal(k, "\xC3\xA9");
    assert_string_equal(v, "\"");
    tv_checkpoint_close(ck);
    /* An escaped key that spells __metadata__ is the metadata. */
    ck = ACCEPT("{'__metadata\\u005f_':{'a':'b'}}", 0);
    assert_int_equal(tv_checkpoint_n_tensors(ck), 0);
    check_shard0(ck, true, 1, 0);
    tv_checkpoint_close(ck);
}

static void test_duplicate_key_top(void **state)
{
    (void)state;
    REJECT("{'w':{'dtype':'U8','shape':[1],'data_offsets':[0,1]},"
           "'w':{'dtype':'U8','shape':[1],'data_offsets':[1,2]}}",
           2, TV_E_ST_DUPLICATE_KEY, "duplicate", "'w'");
    /* Far apart, and spelled differently: the decoded names collide. */
    REJECT("{'w':{'dtype':'U8','shape':[1],'data_offsets':[0,1]}," ENT_B ","
           "'\\u0077':{'dtype':'U8','shape':[0],'data_offsets':[2,2]}}",
           2, TV_E_ST_DUPLICATE_KEY, "duplicate", "'w'");
    REJECT("{'__metadata__':{'a':'b'}," ENT_A ",'__metadata__':{'a':'b'}}", 1,
           TV_E_ST_DUPLICATE_KEY, "duplicate", "__metadata__");
}

static void test_duplicate_key_in_tensor(void **state)
{
    (void)state;
    REJECT("{'w':{'dtype':'U8','shape':[1],'dtype':'U8'}}", 1, TV_E_ST_DUPLICATE_KEY, "duplicate",
           "dtype");
}

static void test_duplicate_key_in_metadata(void **state)
{
    (void)state;
    REJECT("{'__metadata__':{'format':'pt','format':'np'}}", 0, TV_E_ST_DUPLICATE_KEY, "duplicate",
           "format");
}

static void test_too_deep(void **state)
{
    (void)state;
    /* 9 levels of objects. */
    REJECT("{'a':{'b':{'c':{'d':{'e':{'f':{'g':{'h':{'i':1}}}}}}}}}", 0, TV_E_ST_TOO_DEEP,
           "nesting deeper than 8");
    /* 9 levels mixing an object and arrays. */
    REJECT("{'a':[[[[[[[[1]]]]]]]]}", 0, TV_E_ST_TOO_DEEP, "nesting");
    /* 8 levels pass the depth check and fail on the entry's shape. */
    REJECT("{'a':[[[[[[[1]]]]]]]}", 0, TV_E_ST_TENSOR_FIELDS, "'a'");
    REJECT("{'__metadata__':{'b':{'c':{'d':{'e':{'f':{'g':{'h':1}}}}}}}}", 0, TV_E_ST_METADATA,
           "'b'");
    /* Brackets inside strings do not count. */
    tv_checkpoint *ck =
        ACCEPT("{'[[[[[[[[[[{{{{{{{{{{':{'dtype':'U8','shape':[1],'data_offsets':[0,1]}}", 1);
    assert_int_equal(find_name(ck, "[[[[[[[[[[{{{{{{{{{{"), 0);
    tv_checkpoint_close(ck);
    /* A pathologically deep document is refused without recursion. */
    sb b = {0};
    sb_printf(&b, "{\"a\":");
    for (int i = 0; i < 100000; i++)
        sb_printf(&b, "[");
    for (int i = 0; i < 100000; i++)
        sb_printf(&b, "]");
    sb_printf(&b, "}");
    REJECT(b.p, 0, TV_E_ST_TOO_DEEP, "nesting");
    free(b.p);
}

/* ---- __metadata__ ---- */

static void test_metadata_not_object(void **state)
{
    (void)state;
    REJECT("{'__metadata__':'pt'}", 0, TV_E_ST_METADATA, "__metadata__ is not an object");
    REJECT("{'__metadata__':[]}", 0, TV_E_ST_METADATA, "__metadata__ is not an object");
}

static void test_metadata_non_string_value(void **state)
{
    (void)state;
    REJECT("{'__metadata__':{'format':'pt','step':100}}", 0, TV_E_ST_METADATA, "'step'",
           "not a string");
    REJECT("{'__metadata__':{'nested':{'a':'b'}}}", 0, TV_E_ST_METADATA, "'nested'");
    REJECT("{'__metadata__':{'none':null}}", 0, TV_E_ST_METADATA, "'none'");
}

static void test_metadata_pairs(void **state)
{
    (void)state;
    tv_checkpoint *ck = ACCEPT("{'w':{'dtype':'U8','shape':[2],'data_offsets':[0,2]},"
                               "'__metadata__':{'format':'pt','zeta':'1','alpha':'x\\u00e9'}}",
                               2);
    check_shard0(ck, true, 3, 1);
    const char *want[3][2] = {{"format", "pt"}, {"zeta", "1"}, {"alpha", "x\xC3\xA9"}};
    for (size_t j = 0; j < 3; j++) {
        const char *k = NULL, *v = NULL;
        assert_int_equal(tv_checkpoint_shard_metadata(ck, 0, j, &k, &v), 0);
        assert_string_equal(k, want[j][0]);
        assert_string_equal(v, want[j][1]);
    }
    assert_int_equal(tv_checkpoint_shard_metadata(ck, 0, 3, NULL, NULL), TV_E_INVALID_ARG);
    assert_int_equal(tv_checkpoint_shard_metadata(ck, 1, 0, NULL, NULL), TV_E_INVALID_ARG);
    /* __metadata__ is not a tensor. */
    assert_int_equal(tv_checkpoint_find(ck, "__metadata__", 12, NULL), TV_E_NOT_FOUND);
    tv_checkpoint_close(ck);

    ck = ACCEPT("{'w':{'dtype':'U8','shape':[2],'data_offsets':[0,2]}}", 2);
    check_shard0(ck, false, 0, 1);
    assert_int_equal(tv_checkpoint_shard_metadata(ck, 0, 0, NULL, NULL), TV_E_INVALID_ARG);
    tv_checkpoint_close(ck);

    ck = ACCEPT("{'__metadata__':{}}", 0);
    check_shard0(ck, true, 0, 0);
    assert_int_equal(tv_checkpoint_n_tensors(ck), 0);
    tv_checkpoint_close(ck);
}

/* ---- tensor entries ---- */

static void test_tensor_missing_offsets(void **state)
{
    (void)state;
    REJECT("{'w.missing':{'dtype':'U8','shape':[1]}}", 1, TV_E_ST_TENSOR_FIELDS, "'w.missing'",
           "exactly dtype, shape, data_offsets");
    /* Three keys, but not the right three. */
    REJECT("{'w.wrong':{'dtype':'U8','shape':[1],'offsets':[0,1]}}", 1, TV_E_ST_TENSOR_FIELDS,
           "'w.wrong'");
}

static void test_tensor_extra_key(void **state)
{
    (void)state;
    REJECT("{'w.extra':{'dtype':'U8','shape':[1],'data_offsets':[0,1],'stride':[1]}}", 1,
           TV_E_ST_TENSOR_FIELDS, "'w.extra'");
}

static void test_tensor_not_object(void **state)
{
    (void)state;
    REJECT("{'w.arr':['U8',[1],[0,1]]}", 1, TV_E_ST_TENSOR_FIELDS, "'w.arr'");
    REJECT("{'w.str':'U8'}", 1, TV_E_ST_TENSOR_FIELDS, "'w.str'");
    REJECT("{'w.null':null}", 1, TV_E_ST_TENSOR_FIELDS, "'w.null'");
}

static void test_tensor_unknown_dtype(void **state)
{
    (void)state;
    REJECT("{'w.f128':{'dtype':'F128','shape':[1],'data_offsets':[0,16]}}", 16, TV_E_ST_DTYPE,
           "'w.f128'", "'F128'");
    REJECT("{'w.lower':{'dtype':'f32','shape':[1],'data_offsets':[0,4]}}", 4, TV_E_ST_DTYPE,
           "'w.lower'", "'f32'");
    REJECT("{'w.num':{'dtype':14,'shape':[1],'data_offsets':[0,4]}}", 4, TV_E_ST_DTYPE, "'w.num'",
           "not a string");
    REJECT("{'w.empty':{'dtype':'','shape':[1],'data_offsets':[0,4]}}", 4, TV_E_ST_DTYPE,
           "'w.empty'");
}

static void test_shape_negative(void **state)
{
    (void)state;
    REJECT("{'w.neg':{'dtype':'U8','shape':[2,-1],'data_offsets':[0,2]}}", 2, TV_E_ST_SHAPE,
           "'w.neg'", "shape[1]");
}

static void test_shape_float(void **state)
{
    (void)state;
    REJECT("{'w.flt':{'dtype':'U8','shape':[2.0],'data_offsets':[0,2]}}", 2, TV_E_ST_SHAPE,
           "'w.flt'", "shape[0]");
}

static void test_shape_string(void **state)
{
    (void)state;
    REJECT("{'w.str':{'dtype':'U8','shape':['2'],'data_offsets':[0,2]}}", 2, TV_E_ST_SHAPE,
           "'w.str'");
    REJECT("{'w.scalar':{'dtype':'U8','shape':2,'data_offsets':[0,2]}}", 2, TV_E_ST_SHAPE,
           "'w.scalar'", "not a list");
}

static void test_rank_over_limit(void **state)
{
    (void)state;
    REJECT("{'w.r17':{'dtype':'U8','shape':[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1],"
           "'data_offsets':[0,1]}}",
           1, TV_E_ST_RANK, "'w.r17'", "rank 17");
    /* Exactly TV_ST_MAX_RANK is fine. */
    tv_checkpoint *ck = ACCEPT("{'w.r16':{'dtype':'U8','shape':[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,2],"
                               "'data_offsets':[0,2]}}",
                               2);
    tv_tensor_info ti = tensor_at(ck, 0);
    assert_int_equal(ti.rank, TV_ST_MAX_RANK);
    assert_int_equal(ti.shape[15], 2);
    assert_int_equal(ti.n_elements, 2);
    tv_checkpoint_close(ck);
}

static void test_element_overflow(void **state)
{
    (void)state;
    REJECT("{'w.huge':{'dtype':'U8','shape':[4294967296,4294967296,16],'data_offsets':[0,1]}}", 1,
           TV_E_ST_OVERFLOW, "'w.huge'", "overflows");
    /* Elements fit, elements x bits does not. */
    REJECT("{'w.bits':{'dtype':'F64','shape':[2305843009213693952],'data_offsets':[0,1]}}", 1,
           TV_E_ST_OVERFLOW, "'w.bits'");
    /* The product is checked in shape order, as the official loader does: a
     * zero after the overflow does not save it... */
    REJECT("{'w.zero':{'dtype':'U8','shape':[4294967296,4294967296,16,0],'data_offsets':[0,0]}}", 0,
           TV_E_ST_OVERFLOW, "'w.zero'", "overflows");
    REJECT("{'w.z3':{'dtype':'U8','shape':[4294967296,4294967296,0],'data_offsets':[0,0]}}", 0,
           TV_E_ST_OVERFLOW, "'w.z3'");
    /* ...a zero before it does (every later product is 0). */
    tv_checkpoint *ck = ACCEPT("{'w.zero':{'dtype':'U8','shape':[4294967296,0,4294967296,16],"
                               "'data_offsets':[0,0]}}",
                               0);
    tv_tensor_info ti = tensor_at(ck, 0);
    assert_int_equal(ti.n_elements, 0);
    assert_int_equal(ti.nbytes, 0);
    assert_int_equal(ti.rank, 4);
    assert_int_equal(ti.shape[0], 4294967296ull);
    assert_int_equal(ti.shape[2], 4294967296ull);
    tv_checkpoint_close(ck);
    ck = ACCEPT("{'w.z0':{'dtype':'F64','shape':[0,4294967296,4294967296],'data_offsets':[0,0]}}",
                0);
    assert_int_equal(tensor_at(ck, 0).n_elements, 0);
    tv_checkpoint_close(ck);
}

/* ---- agreement with the official parser (docs/formats.md: deliberate differences) ---- */

static void test_negative_zero(void **state)
{
    (void)state;
    /* The official parser reads -0 as a float and refuses it; jansson reads 0. */
    REJECT("{'w':{'dtype':'U8','shape':[-0],'data_offsets':[0,0]}}", 0, TV_E_ST_SHAPE, "'w'", "-0");
    REJECT("{'w':{'dtype':'U8','shape':[2,-0],'data_offsets':[0,0]}}", 0, TV_E_ST_SHAPE, "'w'");
    REJECT("{'w':{'dtype':'U8','shape':[0],'data_offsets':[-0,0]}}", 0, TV_E_ST_OFFSETS, "'w'",
           "data_offsets", "-0");
    REJECT("{'w':{'dtype':'U8','shape':[0],'data_offsets':[0, -0]}}", 0, TV_E_ST_OFFSETS, "'w'");
    REJECT("{'w':{'data_offsets':[0,0],'shape':[0],'dtype':'U8'},"
           "'v':{'shape':[ -0 ],'dtype':'U8','data_offsets':[0,0]}}",
           0, TV_E_ST_SHAPE, "'v'");
    /* The member is named by its decoded key. */
    REJECT("{'w':{'dtype':'U8','sha\\u0070e':[-0],'data_offsets':[0,0]}}", 0, TV_E_ST_SHAPE, "'w'");
    /* '-' inside strings is not a number. */
    tv_checkpoint *ck = ACCEPT("{'a-0':{'dtype':'U8','shape':[0],'data_offsets':[0,0]},"
                               "'__metadata__':{'k-0':'-0'}}",
                               0);
    assert_int_equal(find_name(ck, "a-0"), 0);
    tv_checkpoint_close(ck);
}

static void test_metadata_null(void **state)
{
    (void)state;
    /* null is the official loader's "no metadata". */
    tv_checkpoint *ck = ACCEPT("{'__metadata__':null,'w':{'dtype':'U8','shape':[2],"
                               "'data_offsets':[0,2]}}",
                               2);
    check_shard0(ck, false, 0, 1);
    assert_int_equal(tv_checkpoint_shard_metadata(ck, 0, 0, NULL, NULL), TV_E_INVALID_ARG);
    assert_int_equal(tv_checkpoint_find(ck, "__metadata__", 12, NULL), TV_E_NOT_FOUND);
    tv_checkpoint_close(ck);
    ck = ACCEPT("{'__metadata__':null}", 0);
    assert_int_equal(tv_checkpoint_n_tensors(ck), 0);
    tv_checkpoint_close(ck);
    /* Still only once. */
    REJECT("{'__metadata__':null,'__metadata__':{'a':'b'}}", 0, TV_E_ST_DUPLICATE_KEY,
           "__metadata__");
    REJECT("{'__metadata__':{'a':'b'},'__metadata__':null}", 0, TV_E_ST_DUPLICATE_KEY,
           "__metadata__");
    REJECT("{'__metadata__':null,'__metadata__':null}", 0, TV_E_ST_DUPLICATE_KEY, "__metadata__");
}

static void test_nul_in_names_and_metadata(void **state)
{
    (void)state;
    REJECT("{'a\\u0000b':{'dtype':'U8','shape':[1],'data_offsets':[0,1]}}", 1, TV_E_ST_NUL,
           "tensor name 'a'", "NUL");
    /* Not mistaken for __metadata__ either. */
    REJECT("{'__metadata__\\u0000':{'dtype':'U8','shape':[1],'data_offsets':[0,1]}}", 1,
           TV_E_ST_NUL, "'__metadata__'");
    REJECT("{'__metadata__':{'k\\u0000':'v'},'w':{'dtype':'U8','shape':[1],"
           "'data_offsets':[0,1]}}",
           1, TV_E_ST_NUL, "__metadata__", "key");
    REJECT("{'__metadata__':{'k':'v\\u0000w'}}", 0, TV_E_ST_NUL, "'k'", "value");
    /* In a dtype it is just an unknown dtype, as for the official loader. */
    REJECT("{'w':{'dtype':'U8\\u0000','shape':[1],'data_offsets':[0,1]}}", 1, TV_E_ST_DTYPE, "'w'");
}

static void test_empty_tensor_name(void **state)
{
    (void)state;
    /* The registry's tensors.name has CHECK (length(name) > 0). */
    REJECT("{'':{'dtype':'U8','shape':[1],'data_offsets':[0,1]}}", 1, TV_E_ST_NAME_EMPTY,
           "empty name");
    REJECT("{'w':{'dtype':'U8','shape':[1],'data_offsets':[0,1]},"
           "'':{'dtype':'U8','shape':[0],'data_offsets':[1,1]}}",
           1, TV_E_ST_NAME_EMPTY, "empty name");
}

static void test_int_above_int64_max(void **state)
{
    (void)state;
    /* The official loader takes any usize; numpy, torch and the registry
     * hold int64, so a dimension above INT64_MAX (only possible next to a
     * zero) is refused by name. */
    REJECT("{'w':{'dtype':'U8','shape':[9223372036854775808,0],'data_offsets':[0,0]}}", 0,
           TV_E_ST_INT_RANGE, "'w'", "INT64_MAX");
    REJECT("{'w':{'dtype':'U8','shape':[0,18446744073709551615],'data_offsets':[0,0]}}", 0,
           TV_E_ST_INT_RANGE, "'w'");
    REJECT("{'w':{'dtype':'U8','shape':[18446744073709551616,0],'data_offsets':[0,0]}}", 0,
           TV_E_ST_INT_RANGE, "'w'");
    REJECT("{'w':{'dtype':'U8','shape':[0],'data_offsets':[9223372036854775808,"
           "9223372036854775808]}}",
           0, TV_E_ST_INT_RANGE, "'w'");
    REJECT("{'__metadata__':{'k':99999999999999999999}}", 0, TV_E_ST_METADATA, "__metadata__");
    /* INT64_MAX itself is fine. */
    tv_checkpoint *ck = ACCEPT("{'w':{'dtype':'F64','shape':[9223372036854775807,0],"
                               "'data_offsets':[0,0]}}",
                               0);
    tv_tensor_info ti = tensor_at(ck, 0);
    assert_int_equal(ti.shape[0], 9223372036854775807ull);
    assert_int_equal(ti.n_elements, 0);
    tv_checkpoint_close(ck);
}

static void test_offsets_three_entries(void **state)
{
    (void)state;
    REJECT("{'w.three':{'dtype':'U8','shape':[2],'data_offsets':[0,1,2]}}", 2, TV_E_ST_OFFSETS,
           "'w.three'");
    REJECT("{'w.one':{'dtype':'U8','shape':[2],'data_offsets':[2]}}", 2, TV_E_ST_OFFSETS,
           "'w.one'");
    REJECT("{'w.obj':{'dtype':'U8','shape':[2],'data_offsets':{'b':0,'e':2}}}", 2, TV_E_ST_OFFSETS,
           "'w.obj'");
    REJECT("{'w.flt':{'dtype':'U8','shape':[2],'data_offsets':[0.0,2.0]}}", 2, TV_E_ST_OFFSETS,
           "'w.flt'");
}

static void test_offsets_negative(void **state)
{
    (void)state;
    REJECT("{'w.neg':{'dtype':'U8','shape':[2],'data_offsets':[-2,0]}}", 2, TV_E_ST_OFFSETS,
           "'w.neg'");
    REJECT("{'w.neg2':{'dtype':'U8','shape':[2],'data_offsets':[0,-2]}}", 2, TV_E_ST_OFFSETS,
           "'w.neg2'");
}

static void test_offsets_end_before_begin(void **state)
{
    (void)state;
    REJECT("{'w.back':{'dtype':'U8','shape':[0],'data_offsets':[4,2]}}", 4, TV_E_ST_OFFSETS,
           "'w.back'", "END 2 < BEGIN 4");
}

static void test_length_mismatch(void **state)
{
    (void)state;
    REJECT("{'w.len':{'dtype':'F32','shape':[2],'data_offsets':[0,7]}}", 7, TV_E_ST_LENGTH,
           "'w.len'", "7 bytes", "needs 8");
    REJECT("{'w.len2':{'dtype':'BF16','shape':[2,3],'data_offsets':[0,16]}}", 16, TV_E_ST_LENGTH,
           "'w.len2'", "needs 12");
}

static void test_f4_odd_elements(void **state)
{
    (void)state;
    REJECT("{'w.f4':{'dtype':'F4','shape':[3],'data_offsets':[0,2]}}", 2, TV_E_ST_LENGTH, "'w.f4'",
           "12 bits");
    REJECT("{'w.f6':{'dtype':'F6_E3M2','shape':[2],'data_offsets':[0,2]}}", 2, TV_E_ST_LENGTH,
           "'w.f6'", "12 bits");
}

static void test_f4_even_accepted(void **state)
{
    (void)state;
    tv_checkpoint *ck = ACCEPT("{'w.f4':{'dtype':'F4','shape':[4],'data_offsets':[0,2]}}", 2);
    tv_tensor_info ti = tensor_at(ck, 0);
    assert_int_equal(ti.dtype, TV_DTYPE_F4);
    assert_int_equal(ti.nbytes, 2);
    assert_int_equal(ti.n_elements, 4);
    assert_false(tv_dtype_byte_addressable(ti.dtype));
    tv_checkpoint_close(ck);
}

static void test_f6_accepted(void **state)
{
    (void)state;
    tv_checkpoint *ck = ACCEPT("{'w.f6a':{'dtype':'F6_E2M3','shape':[4],'data_offsets':[0,3]},"
                               "'w.f6b':{'dtype':'F6_E3M2','shape':[2,4],'data_offsets':[3,9]}}",
                               9);
    tv_tensor_info ti = tensor_at(ck, 0);
    assert_string_equal(ti.name, "w.f6a");
    assert_int_equal(ti.dtype, TV_DTYPE_F6_E2M3);
    assert_int_equal(ti.nbytes, 3);
    assert_int_equal(ti.n_elements, 4);
    assert_false(tv_dtype_byte_addressable(ti.dtype));
    ti = tensor_at(ck, 1);
    assert_int_equal(ti.dtype, TV_DTYPE_F6_E3M2);
    assert_int_equal(ti.nbytes, 6);
    assert_int_equal(ti.begin_off, 3);
    tv_checkpoint_close(ck);
}

/* ---- tiling of the data section ---- */

static void test_overlap(void **state)
{
    (void)state;
    REJECT("{'first':{'dtype':'F32','shape':[2],'data_offsets':[0,8]},"
           "'second':{'dtype':'F32','shape':[2],'data_offsets':[4,12]}}",
           12, TV_E_ST_OVERLAP, "'second'", "'first'");
    /* Identical ranges overlap too. */
    REJECT("{'twin.a':{'dtype':'F32','shape':[1],'data_offsets':[0,4]},"
           "'twin.b':{'dtype':'F32','shape':[1],'data_offsets':[0,4]}}",
           4, TV_E_ST_OVERLAP, "twin.");
    /* A zero-size tensor inside another one's range. */
    REJECT("{'big':{'dtype':'F32','shape':[2],'data_offsets':[0,8]},"
           "'inside':{'dtype':'F32','shape':[0],'data_offsets':[4,4]}}",
           8, TV_E_ST_OVERLAP, "'inside'", "'big'");
}

static void test_hole(void **state)
{
    (void)state;
    REJECT("{'first':{'dtype':'F32','shape':[1],'data_offsets':[0,4]},"
           "'second':{'dtype':'F32','shape':[1],'data_offsets':[8,12]}}",
           12, TV_E_ST_HOLE, "'second'", "hole of 4 bytes");
    /* A hole before the first tensor. */
    REJECT("{'late':{'dtype':'F32','shape':[1],'data_offsets':[4,8]}}", 8, TV_E_ST_HOLE, "'late'",
           "data offset 0");
}

static void test_trailing(void **state)
{
    (void)state;
    REJECT("{'w':{'dtype':'F32','shape':[1],'data_offsets':[0,4]}}", 6, TV_E_ST_TRAILING,
           "2 unindexed bytes");
    REJECT("{}", 3, TV_E_ST_TRAILING, "3 unindexed bytes");
    REJECT("{'__metadata__':{'a':'b'}}", 1, TV_E_ST_TRAILING, "unindexed");
}

static void test_truncated(void **state)
{
    (void)state;
    REJECT("{'w.trunc':{'dtype':'F32','shape':[2],'data_offsets':[0,8]}}", 6, TV_E_ST_TRUNCATED,
           "'w.trunc'", "ends at data offset 8", "holds 6");
    REJECT("{'w.a':{'dtype':'F32','shape':[1],'data_offsets':[0,4]},"
           "'w.b':{'dtype':'F32','shape':[1],'data_offsets':[4,8]}}",
           0, TV_E_ST_TRUNCATED, "'w.a'");
}

static void test_zero_size_tensors(void **state)
{
    (void)state;
    tv_checkpoint *ck = ACCEPT("{'zend':{'dtype':'F16','shape':[3,0],'data_offsets':[8,8]},"
                               "'b':{'dtype':'F32','shape':[1],'data_offsets':[4,8]},"
                               "'zmid':{'dtype':'I64','shape':[0,5],'data_offsets':[4,4]},"
                               "'a':{'dtype':'F32','shape':[1],'data_offsets':[0,4]},"
                               "'z0':{'dtype':'U8','shape':[0],'data_offsets':[0,0]}}",
                               8);
    const char *order[] = {"z0", "a", "zmid", "b", "zend"};
    const uint64_t nb[] = {0, 4, 0, 4, 0};
    assert_int_equal(tv_checkpoint_n_tensors(ck), 5);
    for (size_t i = 0; i < 5; i++) {
        tv_tensor_info ti = tensor_at(ck, i);
        assert_string_equal(ti.name, order[i]);
        assert_int_equal(ti.nbytes, nb[i]);
        assert_int_equal(ti.n_elements, nb[i] ? 1 : 0);
        assert_int_equal(find_name(ck, order[i]), i);
    }
    assert_int_equal(tv_checkpoint_total_bytes(ck), 8);
    tv_checkpoint_close(ck);
    /* Only zero-size tensors and an empty data section. */
    ck = ACCEPT("{'e1':{'dtype':'F32','shape':[0],'data_offsets':[0,0]},"
                "'e2':{'dtype':'F32','shape':[0],'data_offsets':[0,0]}}",
                0);
    assert_int_equal(tv_checkpoint_n_tensors(ck), 2);
    assert_int_equal(tv_checkpoint_total_bytes(ck), 0);
    tv_checkpoint_close(ck);
}

static void test_scalar_tensor(void **state)
{
    (void)state;
    tv_checkpoint *ck = ACCEPT("{'step':{'dtype':'I64','shape':[],'data_offsets':[4,12]},"
                               "'lr':{'dtype':'F32','shape':[],'data_offsets':[0,4]}}",
                               12);
    tv_tensor_info ti = tensor_at(ck, 0);
    assert_string_equal(ti.name, "lr");
    assert_int_equal(ti.rank, 0);
    assert_int_equal(ti.n_elements, 1);
    assert_int_equal(ti.nbytes, 4);
    ti = tensor_at(ck, 1);
    assert_string_equal(ti.name, "step");
    assert_int_equal(ti.rank, 0);
    assert_int_equal(ti.n_elements, 1);
    assert_int_equal(ti.nbytes, 8);
    assert_int_equal(ti.begin_off, 4);
    tv_checkpoint_close(ck);
}

/* ---- happy paths ---- */

static void test_all_dtypes_unaligned(void **state)
{
    (void)state;
    /* pad (U8 [3]) first so every later BEGIN starts off any alignment. */
    struct ent {
        char name[32];
        tv_dtype dt;
        uint64_t shape[2];
        uint32_t rank;
        uint64_t n_elem, begin, end;
    } e[TV_DTYPE_COUNT + 1];
    size_t n = 0;
    snprintf(e[0].name, sizeof(e[0].name), "pad");
    e[0].dt = TV_DTYPE_U8;
    e[0].shape[0] = 3;
    e[0].rank = 1;
    e[0].n_elem = 3;
    e[0].begin = 0;
    e[0].end = 3;
    n = 1;
    for (unsigned d = 0; d < TV_DTYPE_COUNT; d++) {
        if (!tv_dtype_byte_addressable((tv_dtype)d))
            continue;
        struct ent *x = &e[n];
        snprintf(x->name, sizeof(x->name), "w.%s", tv_dtype_name((tv_dtype)d));
        x->dt = (tv_dtype)d;
        x->rank = d % 2 ? 2 : 1;
        x->shape[0] = d % 3 + 1;
        x->shape[1] = 3;
        x->n_elem = x->rank == 2 ? x->shape[0] * 3 : x->shape[0];
        x->begin = e[n - 1].end;
        x->end = x->begin + x->n_elem * tv_dtype_bits(x->dt) / 8;
        n++;
    }
    assert_int_equal(n, 20); /* 19 byte-addressable dtypes + pad */
    /* The JSON lists the entries in reverse file order. */
    sb b = {0};
    sb_printf(&b, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (size_t i = n; i-- > 0;) {
        sb_printf(&b, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%llu", e[i].name,
                  tv_dtype_name(e[i].dt), (unsigned long long)e[i].shape[0]);
        if (e[i].rank == 2)
            sb_printf(&b, ",%llu", (unsigned long long)e[i].shape[1]);
        sb_printf(&b, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)e[i].begin,
                  (unsigned long long)e[i].end);
    }
    sb_printf(&b, "}");
    uint64_t data_len = e[n - 1].end;
    uint64_t hdr_len = b.len;
    tv_checkpoint *ck = ACCEPT(b.p, data_len);
    free(b.p);
    assert_int_equal(tv_checkpoint_n_tensors(ck), n);
    assert_int_equal(tv_checkpoint_n_shards(ck), 1);
    assert_int_equal(tv_checkpoint_total_bytes(ck), data_len);
    assert_null(tv_checkpoint_index_path(ck));
    assert_false(tv_checkpoint_index_total_size(ck, NULL));
    tv_shard_info si;
    assert_int_equal(tv_checkpoint_shard(ck, 0, &si), 0);
    assert_string_equal(si.name, SHARD);
    assert_int_equal(si.header_len, hdr_len);
    assert_int_equal(si.data_off, 8 + hdr_len);
    assert_int_equal(si.data_len, data_len);
    assert_int_equal(si.file_len, 8 + hdr_len + data_len);
    assert_int_equal(si.n_tensors, n);
    assert_int_equal(tv_checkpoint_shard(ck, 1, &si), TV_E_INVALID_ARG);
    for (size_t i = 0; i < n; i++) {
        tv_tensor_info ti = tensor_at(ck, i);
        assert_string_equal(ti.name, e[i].name);
        assert_int_equal(ti.name_len, strlen(e[i].name));
        assert_int_equal(ti.dtype, e[i].dt);
        assert_int_equal(ti.rank, e[i].rank);
        for (uint32_t d = 0; d < ti.rank; d++)
            assert_int_equal(ti.shape[d], e[i].shape[d]);
        assert_int_equal(ti.shard, 0);
        assert_int_equal(ti.begin_off, e[i].begin);
        assert_int_equal(ti.end_off, e[i].end);
        assert_int_equal(ti.file_off, 8 + hdr_len + e[i].begin);
        assert_int_equal(ti.nbytes, e[i].end - e[i].begin);
        assert_int_equal(ti.n_elements, e[i].n_elem);
        assert_int_equal(find_name(ck, e[i].name), i);
    }
    assert_int_equal(e[1].begin, 3); /* odd */
    tv_tensor_info ti;
    assert_int_equal(tv_checkpoint_tensor(ck, n, &ti), TV_E_INVALID_ARG);
    assert_int_equal(tv_checkpoint_tensor(NULL, 0, &ti), TV_E_INVALID_ARG);
    assert_int_equal(tv_checkpoint_tensor(ck, 0, NULL), TV_E_INVALID_ARG);
    tv_checkpoint_close(ck);
}

static void test_iteration_file_order(void **state)
{
    (void)state;
    tv_checkpoint *ck = ACCEPT("{'c':{'dtype':'U8','shape':[1],'data_offsets':[5,6]},"
                               "'a':{'dtype':'U16','shape':[1],'data_offsets':[3,5]},"
                               "'b':{'dtype':'U8','shape':[3],'data_offsets':[0,3]}}",
                               6);
    const char *order[] = {"b", "a", "c"};
    for (size_t i = 0; i < 3; i++) {
        assert_string_equal(tensor_at(ck, i).name, order[i]);
        assert_int_equal(find_name(ck, order[i]), i);
    }
    tv_checkpoint_close(ck);
}

static void test_header_padding(void **state)
{
    (void)state;
    const char *hdr = "{'w':{'dtype':'U8','shape':[3],'data_offsets':[0,3]}}       ";
    tv_checkpoint *ck = ACCEPT(hdr, 3);
    tv_shard_info si;
    assert_int_equal(tv_checkpoint_shard(ck, 0, &si), 0);
    assert_int_equal(si.header_len, strlen(hdr));
    tv_tensor_info ti = tensor_at(ck, 0);
    assert_int_equal(ti.file_off, 8 + strlen(hdr));
    tv_checkpoint_close(ck);
    /* Padding to an 8-byte boundary as writers do, including a newline. */
    ck = ACCEPT("{}\n     ", 0);
    assert_int_equal(tv_checkpoint_n_tensors(ck), 0);
    tv_checkpoint_close(ck);
}

static void test_dtype_round_trip(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        unsigned bits;
    } want[TV_DTYPE_COUNT] = {
        {"BOOL", 8},    {"U8", 8},          {"I8", 8},          {"F8_E5M2", 8}, {"F8_E4M3", 8},
        {"F8_E8M0", 8}, {"F8_E4M3FNUZ", 8}, {"F8_E5M2FNUZ", 8}, {"I16", 16},    {"U16", 16},
        {"F16", 16},    {"BF16", 16},       {"I32", 32},        {"U32", 32},    {"F32", 32},
        {"C64", 64},    {"F64", 64},        {"I64", 64},        {"U64", 64},    {"F4", 4},
        {"F6_E2M3", 6}, {"F6_E3M2", 6},
    };
    for (unsigned i = 0; i < TV_DTYPE_COUNT; i++) {
        const char *nm = tv_dtype_name((tv_dtype)i);
        assert_non_null(nm);
        assert_string_equal(nm, want[i].name);
        tv_dtype dt = TV_DTYPE_COUNT;
        assert_int_equal(tv_dtype_from_name(nm, strlen(nm), &dt), 0);
        assert_int_equal(dt, i);
        assert_int_equal(tv_dtype_bits((tv_dtype)i), want[i].bits);
        assert_int_equal(tv_dtype_byte_addressable((tv_dtype)i), want[i].bits % 8 == 0);
    }
    assert_int_equal(tv_dtype_bits(TV_DTYPE_F4), 4);
    assert_int_equal(tv_dtype_bits(TV_DTYPE_F6_E2M3), 6);
    assert_int_equal(tv_dtype_bits(TV_DTYPE_F6_E3M2), 6);
    assert_int_equal(tv_dtype_bits(TV_DTYPE_BF16), 16);
    assert_int_equal(tv_dtype_bits(TV_DTYPE_C64), 64);
    assert_null(tv_dtype_name(TV_DTYPE_COUNT));
    assert_null(tv_dtype_name((tv_dtype)-1));
    assert_int_equal(tv_dtype_bits(TV_DTYPE_COUNT), 0);
    assert_false(tv_dtype_byte_addressable(TV_DTYPE_COUNT));
    /* The length decides, not a NUL: "F16x" read as 3 bytes is F16. */
    tv_dtype dt;
    assert_int_equal(tv_dtype_from_name("F16x", 3, &dt), 0);
    assert_int_equal(dt, TV_DTYPE_F16);
    assert_int_equal(tv_dtype_from_name("F16", 2, &dt), TV_E_ST_DTYPE);
    assert_int_equal(tv_dtype_from_name("F128", 4, &dt), TV_E_ST_DTYPE);
    assert_int_equal(tv_dtype_from_name("bf16", 4, &dt), TV_E_ST_DTYPE);
    assert_int_equal(tv_dtype_from_name("", 0, &dt), TV_E_ST_DTYPE);
}

/* ---- name index ---- */

#define N_BIG 130000u

static void big_name(char *buf, size_t len, unsigned k)
{
    snprintf(buf, len, "model.layers.%u.mlp.experts.%u.w%u.weight", k / 384, (k / 3) % 128,
             k % 3 + 1);
}

static void test_name_index_130k(void **state)
{
    (void)state;
    char name[96];
    sb b = {0};
    sb_printf(&b, "{");
    /* Tensor k lives at data offset k; the JSON lists them in a scrambled
     * order (7919 is coprime with 130000, so this is a permutation). */
    for (unsigned j = 0; j < N_BIG; j++) {
        unsigned k = (unsigned)(((uint64_t)j * 7919u) % N_BIG);
        big_name(name, sizeof(name), k);
        sb_printf(&b, "%s\"%s\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[%u,%u]}",
                  j ? "," : "", name, k, k + 1);
    }
    sb_printf(&b, "}");
    tv_checkpoint *ck = ACCEPT(b.p, N_BIG);
    free(b.p);
    assert_int_equal(tv_checkpoint_n_tensors(ck), N_BIG);
    assert_int_equal(tv_checkpoint_total_bytes(ck), N_BIG);
    for (unsigned k = 0; k < N_BIG; k++) {
        big_name(name, sizeof(name), k);
        size_t idx = SIZE_MAX;
        size_t nl = strlen(name);
        if (tv_checkpoint_find(ck, name, nl, &idx) != 0 || idx != k)
            fail_msg("'%s' found at %zu, want %u", name, idx, k);
        tv_tensor_info ti = tensor_at(ck, idx);
        assert_int_equal(ti.begin_off, k);
        assert_int_equal(ti.name_len, nl);
        assert_memory_equal(ti.name, name, nl + 1);
        /* Every proper prefix of the name, passed by length only. */
        assert_int_equal(tv_checkpoint_find(ck, name, nl - 1, NULL), TV_E_NOT_FOUND);
        assert_int_equal(tv_checkpoint_find(ck, name, nl - 7, NULL), TV_E_NOT_FOUND);
    }
    size_t idx = 42;
    const char *missing[] = {"model.layers.999.mlp.experts.0.w1.weight",
                             "model.layers.0.mlp.experts.0.w4.weight",
                             "model.layers.0.mlp.experts.0.w1.weightx",
                             "model.layers.0.mlp.experts.0.w1",
                             "model.layers.1",
                             "model.",
                             ""};
    for (size_t i = 0; i < sizeof(missing) / sizeof(missing[0]); i++) {
        assert_int_equal(tv_checkpoint_find(ck, missing[i], strlen(missing[i]), &idx),
                         TV_E_NOT_FOUND);
        assert_int_equal(idx, 42); /* untouched on a miss */
    }
    assert_int_equal(tv_checkpoint_find(ck, NULL, 0, &idx), TV_E_NOT_FOUND);
    assert_int_equal(tv_checkpoint_find(NULL, "x", 1, &idx), TV_E_NOT_FOUND);
    tv_checkpoint_close(ck);
}

/* ---- parsing beside other jansson users and other threads ---- */

/* A header of n U8 tensors plus metadata; tensor k at offset k. */
static char *medium_header(unsigned n)
{
    sb b = {0};
    sb_printf(&b, "{\"__metadata__\":{\"format\":\"pt\",\"n\":\"%u\"}", n);
    for (unsigned k = 0; k < n; k++)
        sb_printf(&b, ",\"layer.%u.w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[%u,%u]}",
                  k, k, k + 1);
    sb_printf(&b, "}");
    return b.p;
}

/* jansson used by the caller around (and after failed) parses must keep
 * working with ordinary heap memory. */
static void jansson_roundtrip(int seed)
{
    json_t *o = json_pack("{s:i,s:[s,s],s:{s:b}}", "seed", seed, "list", "a", "bb", "obj", "t", 1);
    assert_non_null(o);
    for (int i = 0; i < 64; i++) {
        char key[16];
        snprintf(key, sizeof(key), "k%d", i);
        assert_int_equal(json_object_set_new(o, key, json_integer(i * seed)), 0);
    }
    char *txt = json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS);
    assert_non_null(txt);
    json_error_t je;
    json_t *back = json_loads(txt, 0, &je);
    assert_non_null(back);
    assert_true(json_equal(o, back));
    free(txt);
    json_decref(back);
    json_decref(o);
}

static void test_parse_beside_caller_jansson(void **state)
{
    (void)state;
    json_t *before = json_pack("{s:s}", "made", "before");
    assert_non_null(before);
    tv_checkpoint *ck = ACCEPT("{" ENT_A "," ENT_B ",'__metadata__':{'x':'y'}}", 2);
    jansson_roundtrip(1);
    /* Freed after a parse: plain heap memory, freed for real. */
    json_decref(before);
    /* A parse that fails half way leaves the caller's jansson working. */
    REJECT("{" ENT_A ",'b':{'dtype':'U8','shape':[1],'data_offsets':[1,2]},'c':tru}", 2,
           TV_E_ST_JSON, "header");
    jansson_roundtrip(2);
    REJECT("{" ENT_A ",'b':{'dtype':'F128','shape':[1],'data_offsets':[1,2]}}", 2, TV_E_ST_DTYPE,
           "'b'");
    jansson_roundtrip(3);
    /* Values read back after the parse are the checkpoint's own copies. */
    tv_tensor_info ti = tensor_at(ck, 1);
    assert_string_equal(ti.name, "b");
    const char *k = NULL, *v = NULL;
    assert_int_equal(tv_checkpoint_shard_metadata(ck, 0, 0, &k, &v), 0);
    assert_string_equal(k, "x");
    assert_string_equal(v, "y");
    tv_checkpoint_close(ck);
}

#define PARSE_THREADS 4
#define ARENA_ROUNDS  25
#define ARENA_TENSORS 600u

typedef struct parse_job {
    const unsigned char *img;
    size_t len;
    int failures;
} parse_job;

static void *parse_worker(void *arg)
{
    parse_job *j = arg;
    for (int r = 0; r < ARENA_ROUNDS; r++) {
        tv_checkpoint *ck = NULL;
        tv_error err;
        size_t idx = 0;
        if (tv_checkpoint_parse_shard(j->img, j->len, j->len, SHARD, NULL, &ck, &err) != 0 ||
            tv_checkpoint_n_tensors(ck) != ARENA_TENSORS ||
            tv_checkpoint_find(ck, "layer.17.w", 10, &idx) != 0 || idx != 17)
            j->failures++;
        tv_checkpoint_close(ck);
        /* Ordinary jansson use on a parsing thread between parses. */
        json_t *o = json_pack("{s:i}", "round", r);
        if (!o || json_integer_value(json_object_get(o, "round")) != r)
            j->failures++;
        json_decref(o);
    }
    return NULL;
}

static void test_parse_threads(void **state)
{
    (void)state;
    char *hdr = medium_header(ARENA_TENSORS);
    size_t len;
    unsigned char *img = shard_image(hdr, ARENA_TENSORS, &len);
    free(hdr);
    pthread_t th[PARSE_THREADS];
    parse_job jobs[PARSE_THREADS];
    for (int i = 0; i < PARSE_THREADS; i++) {
        jobs[i] = (parse_job){.img = img, .len = len, .failures = 0};
        assert_int_equal(pthread_create(&th[i], NULL, parse_worker, &jobs[i]), 0);
    }
    /* Meanwhile this thread allocates and frees jansson nodes through the
     * same process-wide hooks. */
    for (int i = 0; i < 200; i++)
        jansson_roundtrip(i);
    for (int i = 0; i < PARSE_THREADS; i++) {
        assert_int_equal(pthread_join(th[i], NULL), 0);
        assert_int_equal(jobs[i].failures, 0);
    }
    free(img);
}

/* ---- errors and lifetime ---- */

static void test_error_names(void **state)
{
    (void)state;
    assert_string_equal(tv_err_name(TV_E_ST_OVERLAP), "TV_E_ST_OVERLAP");
    assert_string_equal(tv_err_name(-EIO), "EIO");
    assert_string_equal(tv_err_name(0), "OK");
    assert_string_equal(tv_err_name(TV_E_IDX_SHARD_ESCAPE), "TV_E_IDX_SHARD_ESCAPE");
    assert_string_equal(tv_err_name(-999999), "UNKNOWN");
    assert_string_equal(tv_strerror(TV_E_ST_OVERLAP), "tensor data ranges overlap");
    assert_string_equal(tv_strerror(-EIO), strerror(EIO));
    assert_non_null(tv_strerror(0));
    assert_non_null(tv_strerror(-999999));
    assert_non_null(tv_strerror(12345));
}

static void test_close_null(void **state)
{
    (void)state;
    tv_checkpoint_close(NULL);
    tv_checkpoint_close(NULL);
    assert_int_equal(tv_checkpoint_n_tensors(NULL), 0);
    assert_int_equal(tv_checkpoint_n_shards(NULL), 0);
    assert_int_equal(tv_checkpoint_total_bytes(NULL), 0);
    assert_null(tv_checkpoint_index_path(NULL));
    assert_false(tv_checkpoint_index_total_size(NULL, NULL));
}

/* ---- files, indexes and directories ---- */

typedef struct fx {
    char root[256];     /* tv_test_tmpdir() */
    char dir[PATH_MAX]; /* root/ckpt: the checkpoint directory */
} fx;

static int fx_setup(void **state)
{
    fx *f = calloc(1, sizeof(*f));
    if (!f)
        return -1;
    tv_test_tmpdir(f->root, sizeof(f->root), "st");
    snprintf(f->dir, sizeof(f->dir), "%s/ckpt", f->root);
    if (mkdir(f->dir, 0700) < 0) {
        rmdir(f->root);
        free(f);
        return -1;
    }
    *state = f;
    return 0;
}

static int fx_teardown(void **state)
{
    fx *f = *state;
    tv_test_rmtree(f->root);
    free(f);
    return 0;
}

static void path_join(char *out, const char *dir, const char *name)
{
    int n = snprintf(out, PATH_MAX, "%s/%s", dir, name);
    assert_true(n > 0 && n < PATH_MAX);
}

static void write_file(const char *dir, const char *name, const void *data, size_t len)
{
    char p[PATH_MAX];
    path_join(p, dir, name);
    tv_test_write_file(p, data, len);
}

static void write_json(const char *dir, const char *name, const char *json)
{
    char *j = jq(json);
    write_file(dir, name, j, strlen(j));
    free(j);
}

static void write_shard(const char *dir, const char *name, const char *hdr, size_t data_len)
{
    size_t len;
    unsigned char *img = shard_image(hdr, data_len, &len);
    write_file(dir, name, img, len);
    free(img);
}

#define T_EMBED "model.embed_tokens.weight"
#define T_NORM  "model.norm.weight"
#define T_HEAD  "lm_head.weight"
#define SHARD1_HDR                                                                                 \
    "{'__metadata__':{'format':'pt'},"                                                             \
    "'" T_NORM "':{'dtype':'U8','shape':[3],'data_offsets':[8,11]},"                               \
    "'" T_EMBED "':{'dtype':'F32','shape':[2],'data_offsets':[0,8]}}"
#define SHARD2_HDR "{'" T_HEAD "':{'dtype':'BF16','shape':[2,2],'data_offsets':[0,8]}}"

static void write_two_shards(const fx *f)
{
    write_shard(f->dir, S1, SHARD1_HDR, 11);
    write_shard(f->dir, S2, SHARD2_HDR, 8);
}

static tv_checkpoint *open_ok_at(const char *file, int line, const char *path,
                                 const tv_st_limits *lim)
{
    tv_checkpoint *ck = NULL;
    tv_error err = {0};
    int rc = tv_checkpoint_open(path, lim, &ck, &err);
    if (rc != 0 || !ck) {
        print_error("open %s: %s: %s\n", path, tv_err_name(rc), err.msg);
        _fail(file, line);
    }
    return ck;
}
#define OPEN_OK(path, lim) open_ok_at(__FILE__, __LINE__, (path), (lim))

static void open_rejects_at(const char *file, int line, const char *path, const tv_st_limits *lim,
                            int want, const char *const *needles)
{
    tv_checkpoint *ck = (tv_checkpoint *)&ck;
    tv_error err = {0};
    int rc = tv_checkpoint_open(path, lim, &ck, &err);
    bool out_null = ck == NULL;
    if (rc == 0)
        tv_checkpoint_close(ck);
    check_rc_at(file, line, rc, want, &err, needles);
    if (!out_null) {
        print_error("*out not NULL after a failure\n");
        _fail(file, line);
    }
}
#define OPEN_REJECTS(path, lim, want, ...)                                                         \
    open_rejects_at(__FILE__, __LINE__, (path), (lim), (want), NEEDLES(__VA_ARGS__))

/* Writes index json into f->dir and expects opening it to fail. */
static void index_rejects_at(const char *file, int line, const fx *f, const char *json,
                             const tv_st_limits *lim, int want, const char *const *needles)
{
    char p[PATH_MAX];
    write_json(f->dir, IDX, json);
    path_join(p, f->dir, IDX);
    open_rejects_at(file, line, p, lim, want, needles);
    /* The same through the directory. */
    open_rejects_at(file, line, f->dir, lim, want, needles);
}
#define INDEX_REJECTS(f, json, want, ...)                                                          \
    index_rejects_at(__FILE__, __LINE__, (f), (json), NULL, (want), NEEDLES(__VA_ARGS__))

#define GOOD_WEIGHT_MAP                                                                            \
    "'weight_map':{'" T_HEAD "':'" S2 "','" T_EMBED "':'" S1 "','" T_NORM "':'" S1 "'}"

static void check_two_shards(const fx *f, tv_checkpoint *ck)
{
    assert_int_equal(tv_checkpoint_n_shards(ck), 2);
    assert_int_equal(tv_checkpoint_n_tensors(ck), 3);
    assert_int_equal(tv_checkpoint_total_bytes(ck), 19);
    uint64_t ts = 0;
    assert_true(tv_checkpoint_index_total_size(ck, &ts));
    assert_int_equal(ts, 19);
    const char *ip = tv_checkpoint_index_path(ck);
    assert_non_null(ip);
    assert_non_null(strstr(ip, "/ckpt/" IDX));
    char real_dir[PATH_MAX];
    assert_non_null(realpath(f->dir, real_dir));

    const char *names[] = {S1, S2};
    const uint64_t hdr_len[] = {strlen(SHARD1_HDR), strlen(SHARD2_HDR)};
    const size_t n_t[] = {2, 1};
    for (size_t i = 0; i < 2; i++) {
        tv_shard_info si;
        assert_int_equal(tv_checkpoint_shard(ck, i, &si), 0);
        assert_string_equal(si.name, names[i]);
        char want_path[PATH_MAX];
        path_join(want_path, real_dir, names[i]);
        assert_string_equal(si.path, want_path);
        assert_int_equal(si.header_len, hdr_len[i]);
        assert_int_equal(si.n_tensors, n_t[i]);
        assert_int_equal(si.file_len, 8 + hdr_len[i] + (i == 0 ? 11 : 8));
    }
    const char *k = NULL, *v = NULL;
    assert_int_equal(tv_checkpoint_shard_metadata(ck, 0, 0, &k, &v), 0);
    assert_string_equal(k, "format");
    assert_string_equal(v, "pt");

    /* File order: shard, then offset. */
    const char *order[] = {T_EMBED, T_NORM, T_HEAD};
    const uint32_t shard[] = {0, 0, 1};
    const uint64_t begin[] = {0, 8, 0};
    for (size_t i = 0; i < 3; i++) {
        tv_tensor_info ti = tensor_at(ck, i);
        assert_string_equal(ti.name, order[i]);
        assert_int_equal(ti.shard, shard[i]);
        assert_int_equal(ti.begin_off, begin[i]);
        assert_int_equal(ti.file_off, 8 + hdr_len[shard[i]] + begin[i]);
        assert_int_equal(find_name(ck, order[i]), i);
    }
    tv_tensor_info ti = tensor_at(ck, 2);
    assert_int_equal(ti.dtype, TV_DTYPE_BF16);
    assert_int_equal(ti.rank, 2);
    assert_int_equal(ti.shape[0], 2);
    assert_int_equal(ti.shape[1], 2);
}

static void test_index_two_shards(void **state)
{
    fx *f = *state;
    write_two_shards(f);
    write_json(f->dir, IDX, "{'metadata':{'total_size':19}," GOOD_WEIGHT_MAP "}");
    char p[PATH_MAX];
    path_join(p, f->dir, IDX);
    tv_checkpoint *ck = OPEN_OK(p, NULL);
    check_two_shards(f, ck);
    tv_checkpoint_close(ck);
    ck = OPEN_OK(f->dir, NULL);
    check_two_shards(f, ck);
    tv_checkpoint_close(ck);
    /* The index wins over a lone model.safetensors beside it. */
    write_shard(f->dir, SHARD, "{}", 0);
    ck = OPEN_OK(f->dir, NULL);
    check_two_shards(f, ck);
    tv_checkpoint_close(ck);
}

static void test_index_total_size_absent(void **state)
{
    fx *f = *state;
    write_two_shards(f);
    /* total_size differs from the real sum: reported, not validated. */
    write_json(f->dir, IDX, "{'metadata':{'total_size':1234567}," GOOD_WEIGHT_MAP "}");
    tv_checkpoint *ck = OPEN_OK(f->dir, NULL);
    uint64_t ts = 0;
    assert_true(tv_checkpoint_index_total_size(ck, &ts));
    assert_int_equal(ts, 1234567);
    assert_int_equal(tv_checkpoint_total_bytes(ck), 19);
    tv_checkpoint_close(ck);
    write_json(f->dir, IDX, "{" GOOD_WEIGHT_MAP "}");
    ck = OPEN_OK(f->dir, NULL);
    assert_false(tv_checkpoint_index_total_size(ck, &ts));
    tv_checkpoint_close(ck);
}

static void test_index_total_size_huge(void **state)
{
    fx *f = *state;
    write_two_shards(f);
    /* Never enforced, so never a reason to refuse: above INT64_MAX (and
     * above UINT64_MAX) it is accepted and not reported. */
    const char *huge[] = {"9223372036854775808", "18446744073709551616", "1e30", "-5"};
    for (size_t i = 0; i < sizeof(huge) / sizeof(huge[0]); i++) {
        char j[512];
        snprintf(j, sizeof(j), "{'metadata':{'total_size':%s}," GOOD_WEIGHT_MAP "}", huge[i]);
        write_json(f->dir, IDX, j);
        tv_checkpoint *ck = OPEN_OK(f->dir, NULL);
        uint64_t ts = 0;
        assert_false(tv_checkpoint_index_total_size(ck, &ts));
        assert_int_equal(tv_checkpoint_total_bytes(ck), 19);
        assert_int_equal(tv_checkpoint_n_tensors(ck), 3);
        tv_checkpoint_close(ck);
        size_t n_sh = 0, n_t = 0;
        char *jj = jq(j);
        tv_error err = {0};
        assert_int_equal(tv_index_validate_buffer(jj, strlen(jj), NULL, &n_sh, &n_t, &err), 0);
        assert_int_equal(n_sh, 2);
        assert_int_equal(n_t, 3);
        free(jj);
    }
    /* INT64_MAX is reported; so is a small one beside a huge other number. */
    write_json(f->dir, IDX, "{'metadata':{'total_size':9223372036854775807}," GOOD_WEIGHT_MAP "}");
    tv_checkpoint *ck = OPEN_OK(f->dir, NULL);
    uint64_t ts = 0;
    assert_true(tv_checkpoint_index_total_size(ck, &ts));
    assert_int_equal(ts, 9223372036854775807ull);
    tv_checkpoint_close(ck);
    write_json(f->dir, IDX,
               "{'metadata':{'total_size':19,'x':99999999999999999999}," GOOD_WEIGHT_MAP "}");
    ck = OPEN_OK(f->dir, NULL);
    assert_true(tv_checkpoint_index_total_size(ck, &ts));
    assert_int_equal(ts, 19);
    tv_checkpoint_close(ck);
}

static void test_index_tensor_name_rules(void **state)
{
    fx *f = *state;
    write_two_shards(f);
    /* The shard parser's name rules hold in weight_map too. */
    INDEX_REJECTS(f, "{'weight_map':{'':'" S1 "'}}", TV_E_ST_NAME_EMPTY, "empty");
    INDEX_REJECTS(f, "{'weight_map':{'a\\u0000b':'" S1 "'}}", TV_E_ST_NUL, "index", "NUL");
}

static void test_single_shard_file(void **state)
{
    fx *f = *state;
    write_shard(f->dir, SHARD, SHARD2_HDR, 8);
    char p[PATH_MAX];
    path_join(p, f->dir, SHARD);
    tv_checkpoint *ck = OPEN_OK(p, NULL);
    assert_null(tv_checkpoint_index_path(ck));
    assert_int_equal(tv_checkpoint_n_tensors(ck), 1);
    tv_shard_info si;
    assert_int_equal(tv_checkpoint_shard(ck, 0, &si), 0);
    assert_string_equal(si.name, SHARD);
    tv_checkpoint_close(ck);
    ck = OPEN_OK(f->dir, NULL);
    assert_int_equal(find_name(ck, T_HEAD), 0);
    tv_checkpoint_close(ck);
    /* A lone *.safetensors with another name is picked too. */
    assert_int_equal(unlink(p), 0);
    write_shard(f->dir, "weights.safetensors", SHARD2_HDR, 8);
    ck = OPEN_OK(f->dir, NULL);
    assert_int_equal(tv_checkpoint_shard(ck, 0, &si), 0);
    assert_string_equal(si.name, "weights.safetensors");
    tv_checkpoint_close(ck);
}

static void test_index_weight_map_missing(void **state)
{
    fx *f = *state;
    write_two_shards(f);
    INDEX_REJECTS(f, "{'metadata':{'total_size':19}}", TV_E_IDX_WEIGHT_MAP, "weight_map");
    INDEX_REJECTS(f, "[]", TV_E_IDX_WEIGHT_MAP, "weight_map");
}

static void test_index_weight_map_not_object(void **state)
{
    fx *f = *state;
    write_two_shards(f);
    INDEX_REJECTS(f, "{'weight_map':['" S1 "']}", TV_E_IDX_WEIGHT_MAP, "weight_map");
    INDEX_REJECTS(f, "{'weight_map':null}", TV_E_IDX_WEIGHT_MAP, "weight_map");
}

static void test_index_weight_map_non_string(void **state)
{
    fx *f = *state;
    write_two_shards(f);
    INDEX_REJECTS(f, "{'weight_map':{'" T_EMBED "':1}}", TV_E_IDX_WEIGHT_MAP, "'" T_EMBED "'",
                  "not a string");
    INDEX_REJECTS(f, "{'weight_map':{'" T_EMBED "':'" S1 "','" T_HEAD "':['" S2 "']}}",
                  TV_E_IDX_WEIGHT_MAP, "'" T_HEAD "'");
}

static void test_index_shard_name_absolute(void **state)
{
    fx *f = *state;
    write_two_shards(f);
    INDEX_REJECTS(f, "{'weight_map':{'" T_EMBED "':'/etc/passwd'}}", TV_E_IDX_SHARD_NAME,
                  "'/etc/passwd'", "absolute");
}

static void test_index_shard_name_dotdot(void **state)
{
    fx *f = *state;
    write_two_shards(f);
    INDEX_REJECTS(f, "{'weight_map':{'" T_EMBED "':'../" S1 "'}}", TV_E_IDX_SHARD_NAME,
                  "'../" S1 "'", "'..'");
    INDEX_REJECTS(f, "{'weight_map':{'" T_EMBED "':'sub/../../x.safetensors'}}",
                  TV_E_IDX_SHARD_NAME, "sub/../../x.safetensors");
}

static void test_index_shard_name_backslash(void **state)
{
    fx *f = *state;
    write_two_shards(f);
    INDEX_REJECTS(f, "{'weight_map':{'" T_EMBED "':'sub\\\\x.safetensors'}}", TV_E_IDX_SHARD_NAME,
                  "'sub\\x.safetensors'", "backslash");
    INDEX_REJECTS(f, "{'weight_map':{'" T_EMBED "':''}}", TV_E_IDX_SHARD_NAME, "empty");
    INDEX_REJECTS(f, "{'weight_map':{'" T_EMBED "':'a\\u0000b'}}", TV_E_IDX_SHARD_NAME, "NUL");
}

static void test_index_shard_escape_symlink(void **state)
{
    fx *f = *state;
    /* The real shard lives beside the checkpoint directory, not in it. */
    write_shard(f->root, "outside.safetensors", SHARD2_HDR, 8);
    char link[PATH_MAX];
    path_join(link, f->dir, S2);
    assert_int_equal(symlink("../outside.safetensors", link), 0);
    write_shard(f->dir, S1, SHARD1_HDR, 11);
    INDEX_REJECTS(f, "{" GOOD_WEIGHT_MAP "}", TV_E_IDX_SHARD_ESCAPE, "'" S2 "'",
                  "outside.safetensors");
    /* An absolute symlink escapes just the same. */
    char target[PATH_MAX];
    path_join(target, f->root, "outside.safetensors");
    assert_int_equal(unlink(link), 0);
    assert_int_equal(symlink(target, link), 0);
    INDEX_REJECTS(f, "{" GOOD_WEIGHT_MAP "}", TV_E_IDX_SHARD_ESCAPE, "'" S2 "'");
    /* A symlink that stays inside the directory is fine. */
    assert_int_equal(unlink(link), 0);
    write_shard(f->dir, "real-00002.safetensors", SHARD2_HDR, 8);
    assert_int_equal(symlink("real-00002.safetensors", link), 0);
    tv_checkpoint *ck = OPEN_OK(f->dir, NULL);
    assert_int_equal(tv_checkpoint_n_tensors(ck), 3);
    tv_checkpoint_close(ck);
}

static void test_index_missing_tensor(void **state)
{
    fx *f = *state;
    write_two_shards(f);
    INDEX_REJECTS(f,
                  "{'weight_map':{'" T_HEAD "':'" S2 "','" T_EMBED "':'" S1 "','" T_NORM "':'" S1
                  "','model.ghost.weight':'" S2 "'}}",
                  TV_E_IDX_MISSING_TENSOR, "'model.ghost.weight'", "'" S2 "'");
    /* Listed under the wrong shard: missing from the shard it names. */
    INDEX_REJECTS(
        f, "{'weight_map':{'" T_HEAD "':'" S1 "','" T_EMBED "':'" S1 "','" T_NORM "':'" S1 "'}}",
        TV_E_IDX_MISSING_TENSOR, "'" T_HEAD "'", "'" S1 "'");
}

static void test_index_unlisted_tensor(void **state)
{
    fx *f = *state;
    write_two_shards(f);
    INDEX_REJECTS(f, "{'weight_map':{'" T_HEAD "':'" S2 "','" T_EMBED "':'" S1 "'}}",
                  TV_E_IDX_UNLISTED_TENSOR, "'" T_NORM "'", "'" S1 "'");
}

static void test_index_duplicate_tensor(void **state)
{
    fx *f = *state;
    write_shard(f->dir, S1, SHARD1_HDR, 11);
    write_shard(f->dir, S2,
                "{'" T_HEAD "':{'dtype':'BF16','shape':[2,2],'data_offsets':[0,8]},"
                "'" T_NORM "':{'dtype':'U8','shape':[3],'data_offsets':[8,11]}}",
                11);
    INDEX_REJECTS(f, "{" GOOD_WEIGHT_MAP "}", TV_E_IDX_DUPLICATE_TENSOR, "'" T_NORM "'", "'" S1 "'",
                  "'" S2 "'");
}

static void test_index_too_many_shards(void **state)
{
    fx *f = *state;
    write_two_shards(f);
    write_shard(f->dir, "model-extra.safetensors",
                "{'extra':{'dtype':'U8','shape':[1],'data_offsets':[0,1]}}", 1);
    const char *json = "{'weight_map':{'" T_HEAD "':'" S2 "','" T_EMBED "':'" S1 "','" T_NORM
                       "':'" S1 "','extra':'model-extra.safetensors'}}";
    tv_st_limits lim = {.max_shards = 2};
    char p[PATH_MAX];
    write_json(f->dir, IDX, json);
    path_join(p, f->dir, IDX);
    OPEN_REJECTS(p, &lim, TV_E_IDX_TOO_MANY_SHARDS, "3 shards", "limit 2");
    OPEN_REJECTS(f->dir, &lim, TV_E_IDX_TOO_MANY_SHARDS, "3 shards");
    /* At the limit: fine. */
    lim.max_shards = 3;
    tv_checkpoint *ck = OPEN_OK(p, &lim);
    assert_int_equal(tv_checkpoint_n_shards(ck), 3);
    assert_int_equal(tv_checkpoint_n_tensors(ck), 4);
    tv_checkpoint_close(ck);
}

static void test_index_validate_buffer_good(void **state)
{
    (void)state;
    char *j = jq("{'metadata':{'total_size':19}," GOOD_WEIGHT_MAP "}");
    size_t n_shards = 0, n_tensors = 0;
    tv_error err = {0};
    assert_int_equal(tv_index_validate_buffer(j, strlen(j), NULL, &n_shards, &n_tensors, &err), 0);
    assert_int_equal(n_shards, 2);
    assert_int_equal(n_tensors, 3);
    assert_int_equal(tv_index_validate_buffer(j, strlen(j), NULL, NULL, NULL, NULL), 0);
    tv_st_limits lim = {.max_shards = 2};
    assert_int_equal(tv_index_validate_buffer(j, strlen(j), &lim, NULL, NULL, &err), 0);
    free(j);
    j = jq("{'weight_map':{}}");
    assert_int_equal(tv_index_validate_buffer(j, strlen(j), NULL, &n_shards, &n_tensors, &err), 0);
    assert_int_equal(n_shards, 0);
    assert_int_equal(n_tensors, 0);
    free(j);
}

static void validate_rejects_at(const char *file, int line, const char *json,
                                const tv_st_limits *lim, int want, const char *const *needles)
{
    char *j = jq(json);
    tv_error err = {0};
    size_t n_shards = 77, n_tensors = 77;
    int rc = tv_index_validate_buffer(j, strlen(j), lim, &n_shards, &n_tensors, &err);
    free(j);
    check_rc_at(file, line, rc, want, &err, needles);
}
#define VALIDATE_REJECTS(json, lim, want, ...)                                                     \
    validate_rejects_at(__FILE__, __LINE__, (json), (lim), (want), NEEDLES(__VA_ARGS__))

static void test_index_validate_buffer_bad(void **state)
{
    (void)state;
    VALIDATE_REJECTS("{'weight_map':{", NULL, TV_E_IDX_JSON, "index");
    VALIDATE_REJECTS("", NULL, TV_E_IDX_JSON, "index");
    VALIDATE_REJECTS("{'weight_map':{'a':'x.safetensors','a':'y.safetensors'}}", NULL,
                     TV_E_ST_DUPLICATE_KEY, "duplicate");
    VALIDATE_REJECTS("{'weight_map':{'a':[[[[[[[[1]]]]]]]]}}", NULL, TV_E_ST_TOO_DEEP, "index");
    VALIDATE_REJECTS("{'weight_map':{'\xC0\xAF':'x.safetensors'}}", NULL, TV_E_ST_UTF8, "index");
    VALIDATE_REJECTS("{'weight_map':'x.safetensors'}", NULL, TV_E_IDX_WEIGHT_MAP, "weight_map");
    VALIDATE_REJECTS("{'weight_map':{'t.a':5}}", NULL, TV_E_IDX_WEIGHT_MAP, "'t.a'");
    VALIDATE_REJECTS("{'weight_map':{'t.a':'/abs.safetensors'}}", NULL, TV_E_IDX_SHARD_NAME,
                     "'/abs.safetensors'");
    VALIDATE_REJECTS("{'weight_map':{'t.a':'..\\\\x'}}", NULL, TV_E_IDX_SHARD_NAME, "index");
    tv_st_limits lim = {.max_shards = 2};
    VALIDATE_REJECTS("{'weight_map':{'a':'1.safetensors','b':'2.safetensors',"
                     "'c':'3.safetensors','d':'1.safetensors'}}",
                     &lim, TV_E_IDX_TOO_MANY_SHARDS, "3 shards", "limit 2");
    tv_error err = {0};
    assert_int_equal(tv_index_validate_buffer(NULL, 4, NULL, NULL, NULL, &err), TV_E_INVALID_ARG);
}

/* ---- the Hugging Face hub cache layout ---- */

#define HUB_REPO "models--org--name"
#define HUB_REV  "0123456789abcdef0123456789abcdef01234567"
#define BLOB_IDX "a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1"
#define BLOB_S1  "b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2"
#define BLOB_S2  "c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3"

static void mkdir_p(const char *root, const char *rel)
{
    char p[PATH_MAX];
    path_join(p, root, rel);
    for (char *q = p + strlen(root) + 1; *q; q++) {
        if (*q == '/') {
            *q = '\0';
            assert_true(mkdir(p, 0700) == 0 || errno == EEXIST);
            *q = '/';
        }
    }
    assert_true(mkdir(p, 0700) == 0 || errno == EEXIST);
}

static void link_at(const char *dir, const char *name, const char *target)
{
    char p[PATH_MAX];
    path_join(p, dir, name);
    unlink(p);
    assert_int_equal(symlink(target, p), 0);
}

/* root/hub/models--org--name/{blobs,snapshots/REV} as huggingface_hub makes
 * it: every file of the snapshot is a relative link ../../blobs/<hash>.
 * Writes the snapshot directory to snap. */
static void make_hub(const fx *f, const char *repo, char *snap)
{
    char rel[PATH_MAX], blobs[PATH_MAX];
    snprintf(rel, sizeof(rel), "hub/%s/blobs", repo);
    mkdir_p(f->root, rel);
    path_join(blobs, f->root, rel);
    snprintf(rel, sizeof(rel), "hub/%s/snapshots/" HUB_REV, repo);
    mkdir_p(f->root, rel);
    path_join(snap, f->root, rel);
    write_shard(blobs, BLOB_S1, SHARD1_HDR, 11);
    write_shard(blobs, BLOB_S2, SHARD2_HDR, 8);
    write_json(blobs, BLOB_IDX, "{'metadata':{'total_size':19}," GOOD_WEIGHT_MAP "}");
    link_at(snap, IDX, "../../blobs/" BLOB_IDX);
    link_at(snap, S1, "../../blobs/" BLOB_S1);
    link_at(snap, S2, "../../blobs/" BLOB_S2);
}

static void check_hub(const char *snap, tv_checkpoint *ck)
{
    char real_snap[PATH_MAX], want[PATH_MAX];
    assert_non_null(realpath(snap, real_snap));
    assert_int_equal(tv_checkpoint_n_tensors(ck), 3);
    assert_int_equal(tv_checkpoint_n_shards(ck), 2);
    /* Shards keep the link names; the index is named by its link. */
    path_join(want, real_snap, IDX);
    assert_string_equal(tv_checkpoint_index_path(ck), want);
    const char *names[] = {S1, S2}, *blobs[] = {BLOB_S1, BLOB_S2};
    for (size_t i = 0; i < 2; i++) {
        tv_shard_info si;
        assert_int_equal(tv_checkpoint_shard(ck, i, &si), 0);
        assert_string_equal(si.name, names[i]);
        assert_non_null(strstr(si.path, "/" HUB_REPO "/blobs/"));
        assert_string_equal(strrchr(si.path, '/') + 1, blobs[i]);
    }
    assert_int_equal(tensor_at(ck, find_name(ck, T_HEAD)).shard, 1);
}

static void test_hub_cache_layout(void **state)
{
    fx *f = *state;
    char snap[PATH_MAX], p[PATH_MAX];
    make_hub(f, HUB_REPO, snap);
    tv_checkpoint *ck = OPEN_OK(snap, NULL);
    check_hub(snap, ck);
    tv_checkpoint_close(ck);
    path_join(p, snap, IDX);
    ck = OPEN_OK(p, NULL);
    check_hub(snap, ck);
    tv_checkpoint_close(ck);
    /* An absolute link into the same blobs is the same thing. */
    char blob[PATH_MAX], real_blob[PATH_MAX];
    path_join(blob, snap, "../../blobs/" BLOB_S2);
    assert_non_null(realpath(blob, real_blob));
    link_at(snap, S2, real_blob);
    ck = OPEN_OK(snap, NULL);
    check_hub(snap, ck);
    tv_checkpoint_close(ck);
    /* A file in a subfolder of the snapshot links one level further up. */
    char sub[PATH_MAX];
    path_join(sub, snap, "sub");
    assert_int_equal(mkdir(sub, 0700), 0);
    link_at(sub, S2, "../../../blobs/" BLOB_S2);
    write_json(f->root, "hub/" HUB_REPO "/blobs/" BLOB_IDX,
               "{'weight_map':{'" T_HEAD "':'sub/" S2 "','" T_EMBED "':'" S1 "','" T_NORM "':'" S1
               "'}}");
    ck = OPEN_OK(snap, NULL);
    tv_shard_info si;
    assert_int_equal(tv_checkpoint_shard(ck, 1, &si), 0);
    assert_string_equal(si.name, "sub/" S2);
    assert_string_equal(strrchr(si.path, '/') + 1, BLOB_S2);
    tv_checkpoint_close(ck);
}

static void test_hub_cache_single_file(void **state)
{
    fx *f = *state;
    char snap[PATH_MAX], p[PATH_MAX];
    make_hub(f, HUB_REPO, snap);
    path_join(p, snap, IDX);
    assert_int_equal(unlink(p), 0);
    path_join(p, snap, S1);
    assert_int_equal(unlink(p), 0);
    path_join(p, snap, S2);
    assert_int_equal(unlink(p), 0);
    link_at(snap, SHARD, "../../blobs/" BLOB_S2);
    tv_checkpoint *ck = OPEN_OK(snap, NULL);
    tv_shard_info si;
    assert_int_equal(tv_checkpoint_shard(ck, 0, &si), 0);
    assert_string_equal(si.name, SHARD);
    assert_string_equal(strrchr(si.path, '/') + 1, BLOB_S2);
    assert_null(tv_checkpoint_index_path(ck));
    assert_int_equal(find_name(ck, T_HEAD), 0);
    tv_checkpoint_close(ck);
    path_join(p, snap, SHARD);
    ck = OPEN_OK(p, NULL);
    assert_int_equal(tv_checkpoint_shard(ck, 0, &si), 0);
    assert_string_equal(si.name, SHARD);
    tv_checkpoint_close(ck);
}

static void test_hub_cache_escapes(void **state)
{
    fx *f = *state;
    char snap[PATH_MAX], p[PATH_MAX], other[PATH_MAX];
    make_hub(f, HUB_REPO, snap);
    write_shard(f->root, "outside.safetensors", SHARD2_HDR, 8);
    /* A link out of the cache, absolute or relative. */
    link_at(snap, S2, "../../../../outside.safetensors");
    OPEN_REJECTS(snap, NULL, TV_E_IDX_SHARD_ESCAPE, "'" S2 "'", "outside.safetensors");
    path_join(p, f->root, "outside.safetensors");
    link_at(snap, S2, p);
    OPEN_REJECTS(snap, NULL, TV_E_IDX_SHARD_ESCAPE, "'" S2 "'");
    /* .. games that leave blobs, or stay in it but below it. */
    link_at(snap, S2, "../../blobs/../../../outside.safetensors");
    OPEN_REJECTS(snap, NULL, TV_E_IDX_SHARD_ESCAPE, "'" S2 "'");
    mkdir_p(f->root, "hub/" HUB_REPO "/blobs/sub");
    path_join(p, f->root, "hub/" HUB_REPO "/blobs/sub");
    write_shard(p, BLOB_S2, SHARD2_HDR, 8);
    link_at(snap, S2, "../../blobs/sub/" BLOB_S2);
    OPEN_REJECTS(snap, NULL, TV_E_IDX_SHARD_ESCAPE, "'" S2 "'", "blobs");
    /* A link to a directory in blobs. */
    link_at(snap, S2, "../../blobs/sub");
    OPEN_REJECTS(snap, NULL, TV_E_IDX_SHARD_ESCAPE, "'" S2 "'", "regular file");
    /* Another repository's blobs. */
    make_hub(f, "models--org--other", other);
    link_at(snap, S2, "../../../models--org--other/blobs/" BLOB_S2);
    OPEN_REJECTS(snap, NULL, TV_E_IDX_SHARD_ESCAPE, "'" S2 "'");
    /* The index itself may not leave either when the directory is named. */
    link_at(snap, S2, "../../blobs/" BLOB_S2);
    tv_checkpoint_close(OPEN_OK(snap, NULL));
    path_join(p, f->root, "outside.json");
    write_json(f->root, "outside.json", "{'metadata':{'total_size':19}," GOOD_WEIGHT_MAP "}");
    link_at(snap, IDX, p);
    OPEN_REJECTS(snap, NULL, TV_E_IDX_SHARD_ESCAPE, "'" IDX "'");
    link_at(snap, IDX, "../../blobs/" BLOB_IDX);
    /* A directory on the way that is a link (only the file may be one). */
    link_at(snap, "sub", "../../blobs");
    write_json(f->root, "hub/" HUB_REPO "/blobs/" BLOB_IDX,
               "{'weight_map':{'" T_HEAD "':'sub/" BLOB_S2 "','" T_EMBED "':'" S1 "','" T_NORM
               "':'" S1 "'}}");
    OPEN_REJECTS(snap, NULL, TV_E_IDX_SHARD_ESCAPE, "'sub/" BLOB_S2 "'");
    write_json(f->root, "hub/" HUB_REPO "/blobs/" BLOB_IDX,
               "{'metadata':{'total_size':19}," GOOD_WEIGHT_MAP "}");
    tv_checkpoint_close(OPEN_OK(snap, NULL));
}

static void test_hub_cache_blobs_dir_is_a_link(void **state)
{
    fx *f = *state;
    char snap[PATH_MAX], p[PATH_MAX], q[PATH_MAX];
    make_hub(f, HUB_REPO, snap);
    /* Move blobs elsewhere and leave a link: every blob now resolves out of
     * the repository. */
    path_join(p, f->root, "hub/" HUB_REPO "/blobs");
    path_join(q, f->root, "elsewhere");
    assert_int_equal(rename(p, q), 0);
    assert_int_equal(symlink(q, p), 0);
    OPEN_REJECTS(snap, NULL, TV_E_IDX_SHARD_ESCAPE, "'" IDX "'");
    path_join(p, snap, IDX);
    OPEN_REJECTS(p, NULL, TV_E_IDX_SHARD_ESCAPE, "'" S1 "'");
}

static void test_hub_layout_needs_a_models_repo(void **state)
{
    fx *f = *state;
    char snap[PATH_MAX];
    /* The same tree under a name that is not a hub repository. */
    make_hub(f, "notmodels--org--name", snap);
    OPEN_REJECTS(snap, NULL, TV_E_IDX_SHARD_ESCAPE, "Hugging Face");
    /* And a plain directory whose lone shard links out is refused when the
     * directory is named (named directly, the file is the caller's). */
    write_shard(f->root, "outside.safetensors", SHARD2_HDR, 8);
    link_at(f->dir, SHARD, "../outside.safetensors");
    OPEN_REJECTS(f->dir, NULL, TV_E_IDX_SHARD_ESCAPE, "'" SHARD "'");
    char p[PATH_MAX];
    path_join(p, f->dir, SHARD);
    tv_checkpoint *ck = OPEN_OK(p, NULL);
    tv_shard_info si;
    assert_int_equal(tv_checkpoint_shard(ck, 0, &si), 0);
    assert_string_equal(si.name, SHARD);
    tv_checkpoint_close(ck);
}

static void test_dir_no_checkpoint(void **state)
{
    fx *f = *state;
    OPEN_REJECTS(f->dir, NULL, TV_E_CKPT_NOT_FOUND, "ckpt", "no single safetensors");
    write_json(f->dir, "config.json", "{'model_type':'llama'}");
    OPEN_REJECTS(f->dir, NULL, TV_E_CKPT_NOT_FOUND, "ckpt");
    /* Two lone shards and no index: ambiguous. */
    write_two_shards(f);
    OPEN_REJECTS(f->dir, NULL, TV_E_CKPT_NOT_FOUND, "2 .safetensors");
    /* A path that does not exist at all is an errno. */
    char p[PATH_MAX];
    path_join(p, f->dir, "nope.safetensors");
    OPEN_REJECTS(p, NULL, -ENOENT, "nope.safetensors");
}

static void test_open_file_short(void **state)
{
    fx *f = *state;
    write_file(f->dir, SHARD, "\x02\0\0\0\0\0\0", 7);
    char p[PATH_MAX];
    path_join(p, f->dir, SHARD);
    OPEN_REJECTS(p, NULL, TV_E_FILE_SHORT, SHARD);
    write_file(f->dir, SHARD, "", 0);
    OPEN_REJECTS(p, NULL, TV_E_FILE_SHORT, SHARD);
}

static void test_open_header_limits(void **state)
{
    fx *f = *state;
    char p[PATH_MAX];
    path_join(p, f->dir, SHARD);
    /* A sparse 200 MB file claiming a 100000001-byte header: refused by
     * size before anything is allocated or read. */
    size_t len;
    unsigned char *img = raw_image(TV_ST_DEFAULT_MAX_HEADER_LEN + 1, "{}", 2, &len);
    write_file(f->dir, SHARD, img, len);
    free(img);
    assert_int_equal(truncate(p, 200000000), 0);
    OPEN_REJECTS(p, NULL, TV_E_ST_HEADER_TOO_LARGE, SHARD, "100000001");
    /* Header past EOF. */
    img = raw_image(64, "{}", 2, &len);
    write_file(f->dir, SHARD, img, len);
    free(img);
    OPEN_REJECTS(p, NULL, TV_E_ST_HEADER_PAST_EOF, SHARD);
    /* Length 0. */
    img = raw_image(0, "{}", 2, &len);
    write_file(f->dir, SHARD, img, len);
    free(img);
    OPEN_REJECTS(p, NULL, TV_E_ST_HEADER_EMPTY, SHARD);
    /* A small limit applies to files as well. */
    write_shard(f->dir, SHARD, SHARD2_HDR, 8);
    tv_st_limits lim = {.max_header_len = 8};
    OPEN_REJECTS(p, &lim, TV_E_ST_HEADER_TOO_LARGE, SHARD);
}

static void test_index_shard_error_names_shard(void **state)
{
    fx *f = *state;
    write_shard(f->dir, S1, SHARD1_HDR, 11);
    write_shard(f->dir, S2, "{'" T_HEAD "':{'dtype':'BF16','shape':[2,2],'data_offsets':[4,12]}}",
                12);
    INDEX_REJECTS(f, "{" GOOD_WEIGHT_MAP "}", TV_E_ST_HOLE, "'" S2 "'", "'" T_HEAD "'");
    /* A shard the index names but that is not there. */
    char p[PATH_MAX];
    path_join(p, f->dir, S2);
    assert_int_equal(unlink(p), 0);
    INDEX_REJECTS(f, "{" GOOD_WEIGHT_MAP "}", -ENOENT, "'" S2 "'");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_header_len_zero),
        cmocka_unit_test(test_header_too_large_limit),
        cmocka_unit_test(test_header_too_large_default),
        cmocka_unit_test(test_header_past_eof),
        cmocka_unit_test(test_header_buffer_too_small),
        cmocka_unit_test(test_file_short),
        cmocka_unit_test(test_header_start),
        cmocka_unit_test(test_utf8_bad_continuation),
        cmocka_unit_test(test_utf8_overlong),
        cmocka_unit_test(test_utf8_surrogate),
        cmocka_unit_test(test_utf8_valid_multibyte_names),
        cmocka_unit_test(test_invalid_json),
        cmocka_unit_test(test_json_walker_tricky_but_valid),
        cmocka_unit_test(test_duplicate_key_top),
        cmocka_unit_test(test_duplicate_key_in_tensor),
        cmocka_unit_test(test_duplicate_key_in_metadata),
        cmocka_unit_test(test_too_deep),
        cmocka_unit_test(test_metadata_not_object),
        cmocka_unit_test(test_metadata_non_string_value),
        cmocka_unit_test(test_metadata_pairs),
        cmocka_unit_test(test_tensor_missing_offsets),
        cmocka_unit_test(test_tensor_extra_key),
        cmocka_unit_test(test_tensor_not_object),
        cmocka_unit_test(test_tensor_unknown_dtype),
        cmocka_unit_test(test_shape_negative),
        cmocka_unit_test(test_shape_float),
        cmocka_unit_test(test_shape_string),
        cmocka_unit_test(test_rank_over_limit),
        cmocka_unit_test(test_element_overflow),
        cmocka_unit_test(test_negative_zero),
        cmocka_unit_test(test_metadata_null),
        cmocka_unit_test(test_nul_in_names_and_metadata),
        cmocka_unit_test(test_empty_tensor_name),
        cmocka_unit_test(test_int_above_int64_max),
        cmocka_unit_test(test_offsets_three_entries),
        cmocka_unit_test(test_offsets_negative),
        cmocka_unit_test(test_offsets_end_before_begin),
        cmocka_unit_test(test_length_mismatch),
        cmocka_unit_test(test_f4_odd_elements),
        cmocka_unit_test(test_f4_even_accepted),
        cmocka_unit_test(test_f6_accepted),
        cmocka_unit_test(test_overlap),
        cmocka_unit_test(test_hole),
        cmocka_unit_test(test_trailing),
        cmocka_unit_test(test_truncated),
        cmocka_unit_test(test_zero_size_tensors),
        cmocka_unit_test(test_scalar_tensor),
        cmocka_unit_test(test_all_dtypes_unaligned),
        cmocka_unit_test(test_iteration_file_order),
        cmocka_unit_test(test_header_padding),
        cmocka_unit_test(test_dtype_round_trip),
        cmocka_unit_test(test_name_index_130k),
        cmocka_unit_test(test_parse_beside_caller_jansson),
        cmocka_unit_test(test_parse_threads),
        cmocka_unit_test(test_error_names),
        cmocka_unit_test(test_close_null),
        cmocka_unit_test_setup_teardown(test_index_two_shards, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_index_total_size_absent, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_index_total_size_huge, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_index_tensor_name_rules, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_single_shard_file, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_index_weight_map_missing, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_index_weight_map_not_object, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_index_weight_map_non_string, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_index_shard_name_absolute, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_index_shard_name_dotdot, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_index_shard_name_backslash, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_index_shard_escape_symlink, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_index_missing_tensor, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_index_unlisted_tensor, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_index_duplicate_tensor, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_index_too_many_shards, fx_setup, fx_teardown),
        cmocka_unit_test(test_index_validate_buffer_good),
        cmocka_unit_test(test_index_validate_buffer_bad),
        cmocka_unit_test_setup_teardown(test_dir_no_checkpoint, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_hub_cache_layout, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_hub_cache_single_file, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_hub_cache_escapes, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_hub_cache_blobs_dir_is_a_link, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_hub_layout_needs_a_models_repo, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_open_file_short, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_open_header_limits, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_index_shard_error_names_shard, fx_setup, fx_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
