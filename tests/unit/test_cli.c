/* Unit tests of the CLI's value and option parsers (server/cli/args.c):
 * generation numbers, NAME[@GEN] specs, --rows ranges, sizes with every
 * suffix in every case and every refused form, comma lists (--replicas),
 * plain counts, and the option parser's strictness (twice, unknown,
 * missing or empty value, "--"); the command tables (usage lines, --help
 * text for every command and option); the text output (IEC sizes, local
 * times, durations, the printer of each document); and where the daemon,
 * its sockets and its token are found (server/cli/where.c: the order, what
 * each place held, the failure text). */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "cli/args.h"
#include "cli/cli.h"
#include "cli/client.h"
#include "cli/http.h"
#include "cli/where.h"
#include "tv_test.h"
#include "util/internal.h"

static void test_gen_accepts(void **state)
{
    (void)state;
    int64_t g = -7;
    assert_int_equal(tv__cli_parse_gen("1", &g), 0);
    assert_int_equal(g, 1);
    assert_int_equal(tv__cli_parse_gen("10", &g), 0);
    assert_int_equal(g, 10);
    assert_int_equal(tv__cli_parse_gen("9223372036854775807", &g), 0);
    assert_true(g == INT64_MAX);
}

static void test_gen_refuses(void **state)
{
    (void)state;
    static const char *bad[] = {"",   "0",  "00",  "01",  "+1",  "-1",  " 1", "1 ",
                                "1x", "x1", "1.0", "0x1", "1e3", "\t1", "١",  "1\n"};
    for (size_t i = 0; i < TV_ARRAY_LEN(bad); i++) {
        int64_t g = 42;
        assert_int_equal(tv__cli_parse_gen(bad[i], &g), -EINVAL);
        assert_int_equal(g, 42); /* untouched */
    }
    int64_t g = 42;
    assert_int_equal(tv__cli_parse_gen("9223372036854775808", &g), -ERANGE);
    assert_int_equal(tv__cli_parse_gen("18446744073709551616", &g), -ERANGE);
    assert_int_equal(tv__cli_parse_gen("99999999999999999999999999", &g), -ERANGE);
    assert_int_equal(g, 42);
    assert_int_equal(tv__cli_parse_gen(NULL, &g), -EINVAL);
}

static void test_spec(void **state)
{
    (void)state;
    char name[8];
    int64_t g = -1;
    const char *gs = "x";
    assert_int_equal(tv__cli_parse_spec("llama", name, sizeof(name), &g, &gs), 0);
    assert_string_equal(name, "llama");
    assert_int_equal(g, 0);
    assert_null(gs);
    assert_int_equal(tv__cli_parse_spec("llama@12", name, sizeof(name), &g, &gs), 0);
    assert_string_equal(name, "llama");
    assert_int_equal(g, 12);
    assert_string_equal(gs, "12");
    /* The last '@' splits, as tv_model_open does. */
    assert_int_equal(tv__cli_parse_spec("a@b@3", name, sizeof(name), &g, &gs), 0);
    assert_string_equal(name, "a@b");
    assert_int_equal(g, 3);
    /* Every bad generation form, reported with the text after '@'. */
    static const char *bad_gen[] = {"m@", "m@0", "m@01", "m@+1", "m@-1", "m@ 1", "m@1 ", "m@x"};
    for (size_t i = 0; i < TV_ARRAY_LEN(bad_gen); i++) {
        assert_int_equal(tv__cli_parse_spec(bad_gen[i], name, sizeof(name), &g, &gs), -EINVAL);
        assert_non_null(gs);
        assert_ptr_equal(gs, strrchr(bad_gen[i], '@') + 1);
    }
    assert_int_equal(tv__cli_parse_spec("m@9223372036854775808", name, sizeof(name), &g, &gs),
                     -ERANGE);
    /* Bad names: empty, too long for the buffer. */
    assert_int_equal(tv__cli_parse_spec("", name, sizeof(name), &g, &gs), -EINVAL);
    assert_int_equal(tv__cli_parse_spec("@1", name, sizeof(name), &g, &gs), -EINVAL);
    assert_null(gs);
    assert_int_equal(tv__cli_parse_spec("12345678", name, sizeof(name), &g, &gs), -EINVAL);
    assert_int_equal(tv__cli_parse_spec("1234567", name, sizeof(name), &g, &gs), 0);
}

static void test_ref(void **state)
{
    (void)state;
    char name[8], gen[72];
    assert_int_equal(tv__cli_parse_ref("llama", name, sizeof name, gen, sizeof gen), 0);
    assert_string_equal(name, "llama");
    assert_string_equal(gen, "active");
    assert_int_equal(tv__cli_parse_ref("a@b@12", name, sizeof name, gen, sizeof gen), 0);
    assert_string_equal(name, "a@b");
    assert_string_equal(gen, "12");
    assert_int_equal(tv__cli_parse_ref("m@prod", name, sizeof name, gen, sizeof gen), 0);
    assert_string_equal(gen, "prod");
    assert_int_equal(tv__cli_parse_ref("m@canary-2.x_y", name, sizeof name, gen, sizeof gen), 0);
    assert_string_equal(gen, "canary-2.x_y");
    assert_int_equal(tv__cli_parse_ref("m@active", name, sizeof name, gen, sizeof gen), 0);
    assert_string_equal(gen, "active");
    static const char *bad[] = {"m@",   "m@0",  "m@01",  "m@+1",     "m@-x",
                                "m@ 1", "m@1 ", "m@p q", "m@_p",     "m@p/q",
                                "",     "@1",   "@p",    "12345678", "m@\xc3\xa9"};
    for (size_t i = 0; i < TV_ARRAY_LEN(bad); i++)
        if (tv__cli_parse_ref(bad[i], name, sizeof name, gen, sizeof gen) != -EINVAL)
            fail_msg("'%s' was accepted", bad[i]);
    assert_int_equal(tv__cli_parse_ref("m@9223372036854775808", name, sizeof name, gen, sizeof gen),
                     -ERANGE);
    char a65[80] = "m@a";
    memset(a65 + 3, 'b', 64);
    a65[67] = '\0'; /* 65 characters after '@' */
    assert_int_equal(tv__cli_parse_ref(a65, name, sizeof name, gen, sizeof gen), -EINVAL);
    a65[66] = '\0';
    assert_int_equal(tv__cli_parse_ref(a65, name, sizeof name, gen, sizeof gen), 0);
    assert_int_equal(strlen(gen), 64);
}

static void test_rows(void **state)
{
    (void)state;
    uint64_t a = 7, b = 7;
    assert_int_equal(tv__cli_parse_rows("8:16", &a, &b), 0);
    assert_true(a == 8 && b == 16);
    assert_int_equal(tv__cli_parse_rows("0:0", &a, &b), 0); /* empty, as numpy a[0:0] */
    assert_true(a == 0 && b == 0);
    assert_int_equal(tv__cli_parse_rows("5:5", &a, &b), 0);
    assert_true(a == 5 && b == 5);
    assert_int_equal(tv__cli_parse_rows("007:010", &a, &b), 0); /* decimal, not octal */
    assert_true(a == 7 && b == 10);
    assert_int_equal(tv__cli_parse_rows("0:18446744073709551615", &a, &b), 0);
    assert_true(a == 0 && b == UINT64_MAX);

    static const char *bad[] = {"",     ":",    "1",    "1:",    ":2",    "1:2x",  "1:2:3",
                                "-1:2", "1:-2", "+1:2", "1:+2",  " 1:2",  "1 :2",  "1: 2",
                                "1:2 ", "1,2",  "a:b",  "1.0:2", "0x1:2", "1e1:20"};
    for (size_t i = 0; i < TV_ARRAY_LEN(bad); i++) {
        a = b = 99;
        assert_int_equal(tv__cli_parse_rows(bad[i], &a, &b), -EINVAL);
        assert_true(a == 99 && b == 99);
    }
    assert_int_equal(tv__cli_parse_rows("16:8", &a, &b), -EDOM);
    assert_int_equal(tv__cli_parse_rows("1:18446744073709551616", &a, &b), -ERANGE);
    assert_int_equal(tv__cli_parse_rows("18446744073709551616:1", &a, &b), -ERANGE);
    assert_true(a == 99 && b == 99);
}

static void test_size_every_suffix_and_case(void **state)
{
    (void)state;
    static const struct {
        const char *s;
        uint64_t v;
    } ok[] = {
        {"0", 0},
        {"1", 1},
        {"4096", 4096},
        {"007", 7},
        {"18446744073709551615", UINT64_MAX},
        {"1k", 1ull << 10},
        {"1K", 1ull << 10},
        {"1kib", 1ull << 10},
        {"1KiB", 1ull << 10},
        {"1KIB", 1ull << 10},
        {"1kIb", 1ull << 10},
        {"3m", 3ull << 20},
        {"3M", 3ull << 20},
        {"3mib", 3ull << 20},
        {"3MiB", 3ull << 20},
        {"3MIB", 3ull << 20},
        {"2g", 2ull << 30},
        {"2G", 2ull << 30},
        {"2gib", 2ull << 30},
        {"2GiB", 2ull << 30},
        {"2GIB", 2ull << 30},
        {"5t", 5ull << 40},
        {"5T", 5ull << 40},
        {"5tib", 5ull << 40},
        {"5TiB", 5ull << 40},
        {"5TIB", 5ull << 40},
        {"0G", 0},
        {"16777215T", 16777215ull << 40}, /* the largest T that fits */
        {"17179869183G", 17179869183ull << 30},
    };
    for (size_t i = 0; i < TV_ARRAY_LEN(ok); i++) {
        uint64_t v = 12345;
        assert_int_equal(tv__cli_parse_size(ok[i].s, &v), 0);
        assert_true(v == ok[i].v);
    }
}

static void test_size_refuses(void **state)
{
    (void)state;
    static const char *bad[] = {"",     "K",     "KiB", "1GB", "1gb",  "1KB", "1B",   "1b",
                                "1.5G", "1,5G",  "1 G", " 1G", "1G ",  "+1G", "-1G",  "-1",
                                "1Gi",  "1GiBB", "1GG", "1P",  "1PiB", "1E",  "0x10", "1e3",
                                "1kB",  "1 ",    "\t1", "1\n", "G1",   "1iB", "1Ki",  "1KiBytes"};
    for (size_t i = 0; i < TV_ARRAY_LEN(bad); i++) {
        uint64_t v = 12345;
        int rc = tv__cli_parse_size(bad[i], &v);
        if (rc != -EINVAL)
            fail_msg("size '%s': rc %d, want -EINVAL", bad[i], rc);
        assert_true(v == 12345);
    }
    static const char *range[] = {"18446744073709551616", "16777216T",
                                  "17179869184G",         "17592186044416M",
                                  "18014398509481984K",   "99999999999999999999999999999999999999",
                                  "99999999999T"};
    for (size_t i = 0; i < TV_ARRAY_LEN(range); i++) {
        uint64_t v = 12345;
        int rc = tv__cli_parse_size(range[i], &v);
        if (rc != -ERANGE)
            fail_msg("size '%s': rc %d, want -ERANGE", range[i], rc);
        assert_true(v == 12345);
    }
    uint64_t v;
    assert_int_equal(tv__cli_parse_size(NULL, &v), -EINVAL);
}

static void test_uint(void **state)
{
    (void)state;
    uint64_t v = 5;
    assert_int_equal(tv__cli_parse_uint("32", 4096, &v), 0);
    assert_true(v == 32);
    assert_int_equal(tv__cli_parse_uint("4096", 4096, &v), 0);
    assert_int_equal(tv__cli_parse_uint("4097", 4096, &v), -ERANGE);
    assert_int_equal(tv__cli_parse_uint("18446744073709551616", UINT64_MAX, &v), -ERANGE);
    static const char *bad[] = {"", "+1", "-1", " 1", "1 ", "1K", "0x1", "1.0"};
    for (size_t i = 0; i < TV_ARRAY_LEN(bad); i++)
        assert_int_equal(tv__cli_parse_uint(bad[i], UINT64_MAX, &v), -EINVAL);
    assert_true(v == 4096);
}

static void test_list(void **state)
{
    (void)state;
    char buf[64];
    const char *items[4], *why = NULL;
    size_t n = 99;
    assert_int_equal(tv__cli_parse_list("1", buf, sizeof(buf), items, 4, &n, &why), 0);
    assert_int_equal(n, 1);
    assert_string_equal(items[0], "1");
    assert_int_equal(tv__cli_parse_list("1,/dev/x,abc-uuid", buf, sizeof(buf), items, 4, &n, &why),
                     0);
    assert_int_equal(n, 3);
    assert_string_equal(items[0], "1");
    assert_string_equal(items[1], "/dev/x");
    assert_string_equal(items[2], "abc-uuid");

    static const char *empty[] = {"", ",", ",,", "a,,b", "a,", ",a", ",,,a"};
    for (size_t i = 0; i < TV_ARRAY_LEN(empty); i++) {
        why = NULL;
        assert_int_equal(tv__cli_parse_list(empty[i], buf, sizeof(buf), items, 4, &n, &why),
                         -EINVAL);
        assert_non_null(why);
        assert_true(strstr(why, "empty") != NULL);
        assert_int_equal(n, 0);
    }
    assert_int_equal(tv__cli_parse_list("a,b,a", buf, sizeof(buf), items, 4, &n, &why), -EINVAL);
    assert_string_equal(why, "item named twice");
    assert_int_equal(tv__cli_parse_list("1,1", buf, sizeof(buf), items, 4, &n, &why), -EINVAL);
    assert_int_equal(tv__cli_parse_list("a,b,c,d,e", buf, sizeof(buf), items, 4, &n, &why),
                     -ERANGE);
    assert_string_equal(why, "too many items");
    assert_int_equal(tv__cli_parse_list("a,b,c,d", buf, sizeof(buf), items, 4, &n, &why), 0);
    char big[100];
    memset(big, 'x', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    assert_int_equal(tv__cli_parse_list(big, buf, sizeof(buf), items, 4, &n, &why), -ERANGE);
    /* why may be NULL. */
    assert_int_equal(tv__cli_parse_list(",", buf, sizeof(buf), items, 4, &n, NULL), -EINVAL);
}

/* ---- the option parser ---------------------------------------------------- */

static int parse(const tv__cli_opt *opts, size_t n_opts, tv__cli_args *a, const char **args)
{
    char *argv[16];
    int argc = 0;
    argv[argc++] = (char *)"cmd";
    for (; *args; args++)
        argv[argc++] = (char *)*args;
    a->opts = opts;
    a->n_opts = n_opts;
    a->n_pos = 0;
    return tv__cli_parse("cmd", argc, argv, a);
}

#define OPTS                                                                                       \
    tv__cli_opt opts[] = {                                                                         \
        {"--store", "DIR", NULL, NULL}, {"--json", NULL, NULL, NULL}, {"-o", "FILE", NULL, NULL}}; \
    tv__cli_args a

static void test_parse_ok(void **state)
{
    (void)state;
    OPTS;
    const char *args[] = {"--store", "S", "x", "-o", "-", "--json", "y", NULL};
    assert_int_equal(parse(opts, 3, &a, args), 0);
    assert_string_equal(tv__cli_get(&a, "--store"), "S");
    assert_string_equal(tv__cli_get(&a, "-o"), "-");
    assert_true(tv__cli_flag(&a, "--json"));
    assert_int_equal(a.n_pos, 2);
    assert_string_equal(a.pos[0], "x");
    assert_string_equal(a.pos[1], "y");
    const char *eq[] = {"--store=S=T", NULL};
    assert_int_equal(parse(opts, 3, &a, eq), 0);
    assert_string_equal(tv__cli_get(&a, "--store"), "S=T");
    assert_false(tv__cli_flag(&a, "--json"));
    /* "--" ends the options; a value may look like a foreign option. */
    const char *dd[] = {"-o", "-1:2", "--", "--json", "-x", NULL};
    assert_int_equal(parse(opts, 3, &a, dd), 0);
    assert_string_equal(tv__cli_get(&a, "-o"), "-1:2");
    assert_false(tv__cli_flag(&a, "--json"));
    assert_int_equal(a.n_pos, 2);
    assert_string_equal(a.pos[0], "--json");
    assert_string_equal(a.pos[1], "-x");
    /* "-1" is a positional (for the generation parser to refuse by name). */
    const char *neg[] = {"-1", "-5:3", NULL};
    assert_int_equal(parse(opts, 3, &a, neg), 0);
    assert_int_equal(a.n_pos, 2);
    assert_string_equal(a.pos[0], "-1");
}

static void test_parse_refuses(void **state)
{
    (void)state;
    static const char *cases[][6] = {
        {"--store", "S", "--store", "T", NULL}, /* given twice */
        {"--json", "--json", NULL},             /* flag twice */
        {"--store=S", "--store", "S", NULL},    /* twice, mixed forms */
        {"--nope", NULL},                       /* unknown */
        {"-x", NULL},                           /* unknown short */
        {"--stor", "S", NULL},                  /* prefix is not a match */
        {"--store", NULL},                      /* missing value at the end */
        {"--store", "--json", NULL},            /* the next argument is an option */
        {"--store", "-o", "f", NULL},           /* ... a short one */
        {"--store=", NULL},                     /* empty value */
        {"--store", "", NULL},                  /* empty value */
        {"--json=1", NULL},                     /* flag given a value */
    };
    for (size_t i = 0; i < TV_ARRAY_LEN(cases); i++) {
        OPTS;
        if (parse(opts, 3, &a, cases[i]) != 2)
            fail_msg("case %zu (%s ...) was accepted", i, cases[i][0]);
    }
    OPTS;
    const char *many[] = {"1", "2", "3", "4", "5", "6", "7", "8", "9", NULL};
    assert_int_equal(parse(opts, 3, &a, many), 2);
    const char *eight[] = {"1", "2", "3", "4", "5", "6", "7", "8", NULL};
    assert_int_equal(parse(opts, 3, &a, eight), 0);
    assert_int_equal(tv__cli_npos("cmd", &a, 0, 7, "cmd"), 2);
    assert_int_equal(tv__cli_npos("cmd", &a, 8, 8, "cmd"), 0);
    assert_int_equal(tv__cli_npos("cmd", &a, 9, 9, "cmd"), 2);
}

static void test_opt_size_bounds(void **state)
{
    (void)state;
    tv__cli_opt opts[] = {{"--chunk", "SIZE", NULL, NULL}};
    tv__cli_args a;
    uint64_t v = 77;
    const char *none[] = {NULL};
    assert_int_equal(parse(opts, 1, &a, none), 0);
    assert_int_equal(tv__cli_opt_size("cmd", &a, "--chunk", 4096, 1 << 30, &v), 0);
    assert_true(v == 77); /* absent: untouched */
    const char *ok[] = {"--chunk", "1GiB", NULL};
    assert_int_equal(parse(opts, 1, &a, ok), 0);
    assert_int_equal(tv__cli_opt_size("cmd", &a, "--chunk", 4096, 1 << 30, &v), 0);
    assert_true(v == 1u << 30);
    static const char *bad[] = {"4095", "1025M", "2G", "1.5G", "1GB", "16777216T", "-4K"};
    for (size_t i = 0; i < TV_ARRAY_LEN(bad); i++) {
        const char *args[] = {"--chunk", bad[i], NULL};
        assert_int_equal(parse(opts, 1, &a, args), 0);
        v = 77;
        assert_int_equal(tv__cli_opt_size("cmd", &a, "--chunk", 4096, 1 << 30, &v), 2);
        assert_true(v == 77);
    }
    tv__cli_opt qopts[] = {{"--qd", "N", NULL, NULL}};
    static const char *bad_qd[] = {"0", "4097", "-1", "+1", "1K", "18446744073709551616"};
    for (size_t i = 0; i < TV_ARRAY_LEN(bad_qd); i++) {
        const char *args[] = {"--qd", bad_qd[i], NULL};
        assert_int_equal(parse(qopts, 1, &a, args), 0);
        assert_int_equal(tv__cli_opt_uint("cmd", &a, "--qd", 1, TV__CLI_MAX_QD, &v), 2);
    }
}

/* ---- usage lines from the command tables ------------------------------------ */

/* The usage lines the tables must produce (the --help text users know);
 * the registry commands take the client options (--store, --url,
 * --token-file) since they became clients of the API. */
static const char *const g_usage[][2] = {
    {"inspect", "inspect PATH [--json]"},
    {"store init", "store init --store DIR (--image FILE --size SIZE | --device PATH) "
                   "[--region-offset SIZE] [--region-size SIZE] [--force] [--json]"},
    {"import",
     "import NAME SRC [--activate] [--alias A] [--strict] [--wait] [--replicas DEV,...] [--chunk SIZE] [--store DIR] [--url URL] [--token-file FILE] [--json]"},
    {"models", "models [NAME] [--store DIR] [--url URL] [--token-file FILE] [--json]"},
    {"generations", "generations NAME [--store DIR] [--url URL] [--token-file FILE] [--json]"},
    {"generation",
     "generation NAME[@GEN|@ALIAS] [--store DIR] [--url URL] [--token-file FILE] [--json]"},
    {"tensors",
     "tensors NAME[@GEN|@ALIAS] [--prefix P] [--order file|name|size] [--limit N] [--store DIR] [--url URL] [--token-file FILE] [--json]"},
    {"tensor",
     "tensor NAME[@GEN|@ALIAS] TENSOR [--store DIR] [--url URL] [--token-file FILE] [--json]"},
    {"devices", "devices [--store DIR] [--url URL] [--token-file FILE] [--json]"},
    {"activate", "activate NAME GEN|ALIAS [--store DIR] [--url URL] [--token-file FILE] [--json]"},
    {"rollback", "rollback NAME [--store DIR] [--url URL] [--token-file FILE] [--json]"},
    {"deactivate", "deactivate NAME [--store DIR] [--url URL] [--token-file FILE] [--json]"},
    {"retire", "retire NAME GEN [--store DIR] [--url URL] [--token-file FILE] [--json]"},
    {"alias set",
     "alias set NAME ALIAS GEN [--store DIR] [--url URL] [--token-file FILE] [--json]"},
    {"alias rm", "alias rm NAME ALIAS [--store DIR] [--url URL] [--token-file FILE] [--json]"},
    {"alias list", "alias list NAME [--store DIR] [--url URL] [--token-file FILE] [--json]"},
    {"delete", "delete NAME [--store DIR] [--url URL] [--token-file FILE] [--json]"},
    {"gc", "gc [--store DIR] [--url URL] [--token-file FILE] [--json]"},
    {"verify", "verify [--device ID] [--store DIR] [--url URL] [--token-file FILE] [--json]"},
    {"jobs", "jobs [--state S] [--kind K] [--store DIR] [--url URL] [--token-file FILE] [--json]"},
    {"job", "job ID [--store DIR] [--url URL] [--token-file FILE] [--json]"},
    {"cancel", "cancel ID [--store DIR] [--url URL] [--token-file FILE] [--json]"},
    {"sessions", "sessions [--store DIR] [--url URL] [--token-file FILE] [--json]"},
    {"fleet", "fleet [--store DIR] [--url URL] [--token-file FILE] [--json]"},
    {"fleet alias", "fleet alias MODEL ALIAS GENERATION [--expect V] [--placement N1,N2] "
                    "[--quorum Q] [--timeout S] [--store DIR] [--url URL] [--token-file FILE] "
                    "[--json]"},
    {"token create",
     "token create NAME [--scope admin|read|fleet] [--store DIR] [--url URL] [--token-file FILE] [--json]"},
    {"token list", "token list [--store DIR] [--url URL] [--token-file FILE] [--json]"},
    {"token revoke", "token revoke ID [--store DIR] [--url URL] [--token-file FILE] [--json]"},
    {"files", "files NAME[@GEN|@ALIAS] [--store DIR] [--url URL] [--token-file FILE] [--json]"},
    {"checkout", "checkout NAME[@GEN|@ALIAS] DIR [--force] [--store DIR] [--url URL] "
                 "[--token-file FILE] [--json]"},
    {"status", "status [--store DIR] [--url URL] [--token-file FILE] [--json]"},
    {"version", "version [--json]"},
    {"demo", "demo [--layers N] [--dir D] [--store DIR] [--url URL] [--token-file FILE] [--json]"},
    {"get", "get NAME[@GEN|@ALIAS] TENSOR -o FILE|- [--rows R0:R1 | --f32] "
            "[--engine auto|uring|pread] [--qd N] [--chunk SIZE] [--no-direct] [--store DIR] "
            "[--socket PATH] [--fastpath [SOCKET]] [--json]"},
};

static void test_usage_from_tables(void **state)
{
    (void)state;
    char line[1024];
    size_t seen = 0;
    for (size_t i = 0; i < tv__cli_n_cmds; i++) {
        const tv__cli_cmd *cmd = tv__cli_cmds[i];
        tv__cli_cmd_usage(cmd, line, sizeof(line));
        for (size_t k = 0; k < TV_ARRAY_LEN(g_usage); k++)
            if (!strcmp(g_usage[k][0], cmd->name)) {
                assert_string_equal(line, g_usage[k][1]);
                seen++;
            }
        /* Every option but an alias appears in the line, as itself and
         * followed by its value's name; --json is everywhere. Every
         * command says what it does, with an example, and every option
         * what it means (its --help). */
        bool json = false;
        if (!cmd->about || strlen(cmd->about) < 40 || !cmd->example ||
            strncmp(cmd->example, "tensorvault ", 12))
            fail_msg("%s: no about text or example for --help", cmd->name);
        for (size_t k = 0; k < TV__CLI_MAX_OPTS && cmd->opts[k].name; k++) {
            const tv__cli_opt *o = &cmd->opts[k];
            if (!o->help || strlen(o->help) < 8)
                fail_msg("%s: option %s has no help text", cmd->name, o->name);
            json |= !strcmp(o->name, "--json");
            if (!strcmp(o->name, "--output"))
                continue; /* the alias of -o */
            char want[128];
            snprintf(want, sizeof want, "%s%s%s", o->name, o->metavar ? " " : "",
                     o->metavar ? o->metavar : "");
            if (!strstr(line, want))
                fail_msg("%s: usage '%s' does not show '%s'", cmd->name, line, want);
        }
        assert_true(json);
        assert_true(cmd->min_pos <= cmd->max_pos && cmd->max_pos <= TV__CLI_MAX_POS);
    }
    assert_int_equal(seen, TV_ARRAY_LEN(g_usage));
    /* Every command but bench is pinned above. */
    assert_int_equal(seen, tv__cli_n_cmds - 1);
}

/* ---- the prologue ------------------------------------------------------------ */

static int begin(const tv__cli_cmd *cmd, tv__cli_ctx *c, const char **args)
{
    char *argv[16];
    int argc = 0;
    argv[argc++] = (char *)cmd->name;
    for (; *args; args++)
        argv[argc++] = (char *)*args;
    return tv__cli_begin(cmd, argc, argv, c);
}

static void test_prologue(void **state)
{
    (void)state;
    tv__cli_ctx c;
    unsetenv("TENSORVAULT_STORE");
    const char *spec[] = {"--store", "S", "org/m@12", "w", "-o", "-", "--json", NULL};
    assert_int_equal(begin(&tv__cli_cmd_get, &c, spec), 0);
    assert_string_equal(tv__cli_get(&c.a, "--store"), "S");
    assert_string_equal(c.model, "org/m");
    assert_true(c.gen == 12);
    assert_true(c.json);
    assert_int_equal(c.a.n_pos, 2);
    assert_string_equal(tv__cli_get(&c.a, "-o"), "-");
    const char *active[] = {"--store=S", "m", NULL};
    assert_int_equal(begin(&tv__cli_cmd_bench, &c, active), 0);
    assert_string_equal(c.model, "m");
    assert_true(c.gen == 0);
    assert_false(c.json);
    const char *gen[] = {"--store", "S", "m", "7", NULL};
    assert_int_equal(begin(&tv__cli_cmd_retire, &c, gen), 0);
    assert_true(c.gen == 7);
    /* store init's store comes from $TENSORVAULT_STORE when --store is
     * absent; get, bench and the registry commands need none (they may
     * read through a daemon). */
    const char *init[] = {"--image", "i", "--size", "1M", NULL};
    assert_int_equal(begin(&tv__cli_cmd_store, &c, init), 2);
    setenv("TENSORVAULT_STORE", "E", 1);
    assert_int_equal(begin(&tv__cli_cmd_store, &c, init), 0);
    assert_string_equal(c.store, "E");
    setenv("TENSORVAULT_STORE", "", 1);
    assert_int_equal(begin(&tv__cli_cmd_store, &c, init), 2);
    unsetenv("TENSORVAULT_STORE");
    const char *none[] = {"m", NULL};
    assert_int_equal(begin(&tv__cli_cmd_bench, &c, none), 0);
    assert_null(c.store);
    assert_int_equal(begin(&tv__cli_cmd_models, &c, none), 0);
    assert_null(c.store);
    /* Usage errors: positionals, NAME[@GEN], GEN; inspect needs no store. */
    static const char *bad[][6] = {
        {"--store", "S", "x", "y", NULL},    /* models takes at most one */
        {"--store", "S", "m@01", "w", NULL}, /* get: bad GEN */
        {"--store", "S", "@1", "w", NULL},   /* get: empty NAME */
        {"--store", "S", "m", "0", NULL},    /* retire: bad GEN */
        {"--store", "S", "m", NULL},         /* retire: too few */
    };
    const tv__cli_cmd *cmds[] = {&tv__cli_cmd_models, &tv__cli_cmd_get, &tv__cli_cmd_get,
                                 &tv__cli_cmd_retire, &tv__cli_cmd_retire};
    for (size_t i = 0; i < TV_ARRAY_LEN(bad); i++)
        if (begin(cmds[i], &c, bad[i]) != 2)
            fail_msg("case %zu (%s %s) was accepted", i, cmds[i]->name, bad[i][2]);
    /* NAME length: tensors refuses what the registry cannot hold (255
     * bytes), get leaves a longer one to the library. */
    char longname[301];
    memset(longname, 'a', 300);
    longname[300] = '\0';
    char *lt[] = {"tensorvault", "tensors", "--url", "http://127.0.0.1:1", longname, NULL};
    assert_int_equal(tv__cli_main(5, lt), 2); /* refused before anything is sent */
    const char *lg[] = {"--store", "S", longname, "w", NULL};
    assert_int_equal(begin(&tv__cli_cmd_get, &c, lg), 0);
    assert_int_equal(strlen(c.model), 300);
    /* get and bench take NAME@ALIAS (the reader opens what it names now). */
    const char *al[] = {"--store", "S", "org/m@prod", "w", NULL};
    assert_int_equal(begin(&tv__cli_cmd_get, &c, al), 0);
    assert_string_equal(c.model, "org/m");
    assert_true(c.gen == 0);
    const char *bad_al[] = {"--store", "S", "m@_x", "w", NULL};
    assert_int_equal(begin(&tv__cli_cmd_get, &c, bad_al), 2);
    const char *path[] = {"x.safetensors", NULL};
    assert_int_equal(begin(&tv__cli_cmd_inspect, &c, path), 0);
    assert_null(c.store);
}

/* get/bench --fastpath [SOCKET]: the value is taken only when the next
 * argument names an existing socket. */
static void test_fastpath_option(void **state)
{
    (void)state;
    tv__cli_ctx c;
    char sock[] = "/tmp/tv-test-cli-fp-XXXXXX";
    int fd = mkstemp(sock);
    assert_true(fd >= 0);
    close(fd);
    const char *file[] = {"--fastpath", sock, "m", NULL}; /* a plain file: a positional */
    assert_int_equal(begin(&tv__cli_cmd_bench, &c, file), 2);
    unlink(sock);
    int s = socket(AF_UNIX, SOCK_SEQPACKET, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    memcpy(sa.sun_path, sock, strlen(sock));
    assert_int_equal(bind(s, (struct sockaddr *)&sa, sizeof(sa)), 0);
    unsetenv("TENSORVAULT_STORE");
    const char *with[] = {"--fastpath", sock, "m@2", "w", "-o", "-", NULL};
    assert_int_equal(begin(&tv__cli_cmd_get, &c, with), 0);
    assert_string_equal(tv__cli_get(&c.a, "--fastpath"), sock);
    assert_int_equal(c.a.n_pos, 2);
    assert_string_equal(c.model, "m");
    assert_null(c.store);
    const char *alone[] = {"--fastpath", "m", "w", "-o", "-", NULL};
    assert_int_equal(begin(&tv__cli_cmd_get, &c, alone), 0);
    assert_string_equal(tv__cli_get(&c.a, "--fastpath"), "");
    assert_string_equal(c.a.pos[0], "m");
    const char *last[] = {"m", "--fastpath", NULL};
    assert_int_equal(begin(&tv__cli_cmd_bench, &c, last), 0);
    assert_string_equal(tv__cli_get(&c.a, "--fastpath"), "");
    const char *before_opt[] = {"m", "--fastpath", "--json", NULL};
    assert_int_equal(begin(&tv__cli_cmd_bench, &c, before_opt), 0);
    assert_true(c.json);
    const char *eq[] = {"m", "--fastpath=/run/x.sock", NULL};
    assert_int_equal(begin(&tv__cli_cmd_bench, &c, eq), 0);
    assert_string_equal(tv__cli_get(&c.a, "--fastpath"), "/run/x.sock");
    const char *empty[] = {"m", "--fastpath=", NULL};
    assert_int_equal(begin(&tv__cli_cmd_bench, &c, empty), 2);
    const char *twice[] = {"m", "--fastpath", "--fastpath", NULL};
    assert_int_equal(begin(&tv__cli_cmd_bench, &c, twice), 2);
    /* Without --fastpath nothing is required: the socket is looked for. */
    const char *none[] = {"m", NULL};
    assert_int_equal(begin(&tv__cli_cmd_bench, &c, none), 0);
    close(s);
    unlink(sock);
}

/* ---- the client: percent-encoding, the printer, the progress bar ---------- */

static void test_pct_encode(void **state)
{
    (void)state;
    char out[64];
    assert_int_equal(tv__cli_pct_encode("AZaz09-._~", out, sizeof out), 0);
    assert_string_equal(out, "AZaz09-._~");
    /* '/', '%', space, '@' and non-ASCII bytes (UTF-8) are all encoded. */
    assert_int_equal(tv__cli_pct_encode("org/m x%@\xc3\xa9", out, sizeof out), 0);
    assert_string_equal(out, "org%2Fm%20x%25%40%C3%A9");
    assert_int_equal(tv__cli_pct_encode("", out, sizeof out), 0);
    assert_string_equal(out, "");
    /* Exact fit and one byte short. */
    assert_int_equal(tv__cli_pct_encode("a/", out, 5), 0);
    assert_string_equal(out, "a%2F");
    assert_int_equal(tv__cli_pct_encode("a/", out, 4), -ERANGE);
    assert_int_equal(tv__cli_pct_encode("ab", out, 2), -ERANGE);
}

static void test_progress_format(void **state)
{
    (void)state;
    char b[256];
    tv__cli_progress_format(b, sizeof b, 50u << 20, 100u << 20, 10e6, 5, "write");
    assert_string_equal(
        b,
        "[###############...............]  50.0%     50.0 / 100.0 MiB     10.0 MB/s  ETA  0:05  write");
    tv__cli_progress_format(b, sizeof b, 0, 0, 0, -1, NULL);
    assert_string_equal(
        b, "[..............................]   0.0%      0.0 / 0.0 MiB      0.0 MB/s  ETA    -");
    tv__cli_progress_format(b, sizeof b, 3u << 20, 2u << 20, 1e6, 7300, "");
    assert_string_equal(
        b, "[##############################] 100.0%      3.0 / 2.0 MiB      1.0 MB/s  ETA 2h01");
}

/* What tv__cli_print writes for doc (JSON text), as a malloc'd string. */
static char *printed(bool json, tv__cli_doc kind, const char *doc_text)
{
    json_error_t je;
    json_t *doc = json_loads(doc_text, 0, &je);
    if (!doc)
        fail_msg("bad test JSON: %s", je.text);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    tv__cli_print(f, json, kind, doc);
    fclose(f);
    json_decref(doc);
    return buf;
}

static void expect_print(tv__cli_doc kind, const char *doc, const char *want)
{
    char *got = printed(false, kind, doc);
    if (strcmp(got, want))
        fail_msg("printed\n%s\nwanted\n%s", got, want);
    free(got);
}

static void test_print_text(void **state)
{
    (void)state;
    setenv("TZ", "UTC0", 1); /* local times are UTC here */
    tzset();
    expect_print(TV__DOC_MODELS,
                 "{\"models\":[{\"name\":\"m\",\"active_generation\":2,\"aliases\":{\"prod\":1,"
                 "\"canary\":2},\"n_generations\":3,\"created_at\":1},{\"name\":\"n\","
                 "\"active_generation\":null,\"aliases\":{},\"n_generations\":1}],"
                 "\"next_cursor\":null}",
                 "MODEL                                      ACTIVE  GENERATIONS  ALIASES\n"
                 "m                                               2            3  prod=1,canary=2\n"
                 "n                                               -            1  -\n");
    expect_print(
        TV__DOC_GENERATIONS,
        "{\"model\":\"m\",\"generations\":[{\"generation\":1,\"state\":\"ready\","
        "\"active\":true,\"aliases\":[\"prod\"],\"n_shards\":2,\"n_tensors\":5,"
        "\"total_bytes\":1024,\"source\":\"/ck\",\"created_at\":1796542262}]}",
        " GEN STATE     ACTIVE  SHARDS   TENSORS        SIZE  CREATED              ALIASES          SOURCE\n"
        "   1 ready          *       2         5     1.0 KiB  2026-12-06 07:31:02  prod             /ck\n");
    expect_print(
        TV__DOC_TENSORS,
        "{\"tensors\":[{\"name\":\"h.0.w\",\"dtype\":\"BF16\",\"shape\":[2,3],"
        "\"shard\":\"a.safetensors\",\"shard_index\":0,\"data_offsets\":[0,12],"
        "\"nbytes\":12}]}",
        "TENSOR                                           DTYPE  SHAPE                     SIZE  SHARD\n"
        "h.0.w                                            BF16   [2,3]                     12 B  a.safetensors\n");
    expect_print(
        TV__DOC_DEVICES,
        "{\"devices\":[{\"id\":1,\"kind\":\"file\",\"path\":\"/i\",\"lba_size\":512,"
        "\"region_bytes\":4096,\"used_bytes\":0,\"free_bytes\":4096,\"status\":"
        "\"missing\",\"message\":\"label unreadable\"}]}",
        " ID KIND   PATH                                    LBA      REGION        USED        FREE  STATUS\n"
        "  1 file   /i                                      512     4.0 KiB         0 B     4.0 KiB  missing: label unreadable\n");
    expect_print(TV__DOC_IMPORT,
                 "{\"model\":\"m\",\"generation\":3,\"active\":true,\"aliases\":[\"prod\"],"
                 "\"n_shards\":2,\"n_tensors\":5,\"total_bytes\":2000000,\"written_bytes\":"
                 "1000000,\"deduplicated_bytes\":1000000,\"seconds\":0.5}",
                 "imported m generation 3 (active) alias prod: 2 shards, 5 tensors, 1.9 MiB; "
                 "976.6 KiB written, 976.6 KiB deduplicated in 0.5 s (1.9 MiB/s)\n");
    expect_print(TV__DOC_VERIFY,
                 "{\"n_objects\":4,\"n_failed\":1,\"verified_bytes\":100,\"objects\":[]}",
                 "verify: 4 objects, 100 B, 1 failed\n");
    expect_print(TV__DOC_GC, "{\"n_objects_freed\":2,\"freed_bytes\":8192}",
                 "gc: freed 2 objects, 8.0 KiB\n");
    expect_print(TV__DOC_ALIAS, "{\"model\":\"m\",\"alias\":\"prod\",\"generation\":4}",
                 "m@prod -> generation 4\n");
    expect_print(TV__DOC_TOKEN,
                 "{\"id\":3,\"name\":\"ci\",\"scope\":\"read\",\"created_at\":5,"
                 "\"revoked_at\":null,\"token\":\"tvk_ab\"}",
                 "token ci (id 3, scope read); the secret is shown once:\ntvk_ab\n");
    expect_print(TV__DOC_ACTIVATED, "{\"model\":\"m\",\"generation\":2,\"active\":true}",
                 "activated generation 2 of m\n");
    /* Jobs: sizes, when each started and how long it ran. */
    expect_print(
        TV__DOC_JOBS,
        "{\"jobs\":[{\"id\":7,\"kind\":\"import\",\"state\":\"succeeded\",\"model\":\"m\","
        "\"step\":null,\"bytes_done\":248928051,\"bytes_total\":248928051,\"generation\":2,"
        "\"created_at\":1796542200,\"started_at\":1796542262,\"finished_at\":1796542449}]}",
        "    ID KIND   STATE     MODEL                            STEP            DONE       TOTAL  GEN  STARTED              DURATION\n"
        "     7 import succeeded m                                -          237.4 MiB   237.4 MiB    2  2026-12-06 07:31:02     3m07s\n");
    /* Tokens: times, "-" for never. */
    expect_print(TV__DOC_TOKENS,
                 "{\"tokens\":[{\"id\":3,\"name\":\"ci\",\"scope\":\"read\",\"created_at\":5,"
                 "\"revoked_at\":null}]}",
                 "  ID NAME                             SCOPE  CREATED              REVOKED\n"
                 "   3 ci                               read   1970-01-01 00:00:05  -\n");
    /* One generation: exact bytes beside the IEC size, shards by name. */
    char *gen =
        printed(false, TV__DOC_GENERATION,
                "{\"model\":\"m\",\"generation\":2,\"state\":\"ready\",\"active\":true,"
                "\"aliases\":[],\"n_shards\":1,\"n_tensors\":3,\"total_bytes\":248928051,"
                "\"source\":\"/ck\",\"created_at\":1796542262,\"shards\":[{\"index\":0,\"name\":"
                "\"model-00001-of-00001.safetensors\",\"file_bytes\":248928051,\"sha256\":\"ab\","
                "\"replicas\":[]}]}");
    assert_non_null(strstr(gen, "size:        237.4 MiB (248928051 bytes)\n"));
    assert_non_null(strstr(gen, "created:     2026-12-06 07:31:02\n"));
    assert_non_null(
        strstr(gen, "shard 0: model-00001-of-00001.safetensors  237.4 MiB  sha256 ab\n"));
    free(gen);
    /* An activation says which generation it replaced. */
    json_error_t je;
    json_t *act = json_loads("{\"model\":\"m\",\"generation\":3,\"active\":true}", 0, &je);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    tv__cli_print_activated(f, act, 2);
    tv__cli_print_activated(f, act, 0);
    tv__cli_print_activated(f, act, -1);
    fclose(f);
    assert_string_equal(buf, "activated generation 3 of m (was 2)\n"
                             "activated generation 3 of m (was none)\n"
                             "activated generation 3 of m\n");
    free(buf);
    json_decref(act);
    /* Missing fields print "-", never crash. */
    expect_print(
        TV__DOC_JOBS, "{\"jobs\":[{}]}",
        "    ID KIND   STATE     MODEL                            STEP            DONE       TOTAL  GEN  STARTED              DURATION\n"
        "     - -      -         -                                -                  -           -    -  -                           -\n");
    /* --json prints the document itself. */
    char *j = printed(true, TV__DOC_GC, "{\"n_objects_freed\":2,\"freed_bytes\":8192}");
    assert_string_equal(j, "{\n  \"n_objects_freed\": 2,\n  \"freed_bytes\": 8192\n}\n");
    free(j);
}

/* ---- the formatting of the text output -------------------------------------- */

static void test_fmt_bytes(void **state)
{
    (void)state;
    static const struct {
        uint64_t n;
        const char *want;
    } cases[] = {
        {0, "0 B"},
        {1, "1 B"},
        {1023, "1023 B"},
        {1024, "1.0 KiB"},
        {1536, "1.5 KiB"},
        {248928051, "237.4 MiB"},
        {1048575, "1.0 MiB"}, /* 1023.999 KiB rounds up to the next unit, not "1024.0 KiB" */
        {1048576, "1.0 MiB"},
        {(uint64_t)16 << 30, "16.0 GiB"},
        {(uint64_t)3 << 40, "3.0 TiB"},
        {(uint64_t)5 << 50, "5.0 PiB"},
        {UINT64_MAX, "16.0 EiB"},
    };
    char b[32];
    for (size_t i = 0; i < TV_ARRAY_LEN(cases); i++) {
        tv__cli_fmt_bytes(cases[i].n, b, sizeof b);
        if (strcmp(b, cases[i].want))
            fail_msg("%llu bytes: '%s', wanted '%s'", (unsigned long long)cases[i].n, b,
                     cases[i].want);
    }
    /* A short buffer truncates, never overflows. */
    char small[4];
    assert_string_equal(tv__cli_fmt_bytes(248928051, small, sizeof small), "237");
}

static void test_fmt_time(void **state)
{
    (void)state;
    char b[32];
    const char *tz = getenv("TZ");
    char *saved = tz ? strdup(tz) : NULL;
    setenv("TZ", "UTC0", 1);
    tzset();
    assert_string_equal(tv__cli_fmt_time(0, b, sizeof b), "1970-01-01 00:00:00");
    assert_string_equal(tv__cli_fmt_time(1796542262, b, sizeof b), "2026-12-06 07:31:02");
    /* Local time: a zone two hours east of UTC (POSIX TZ: "<+02>-2"). */
    setenv("TZ", "<+02>-2", 1);
    tzset();
    assert_string_equal(tv__cli_fmt_time(1796542262, b, sizeof b), "2026-12-06 09:31:02");
    if (saved)
        setenv("TZ", saved, 1);
    else
        unsetenv("TZ");
    tzset();
    free(saved);
}

static void test_fmt_duration(void **state)
{
    (void)state;
    static const struct {
        double s;
        const char *want;
    } cases[] = {{0, "0.0 s"},     {4.24, "4.2 s"},    {59.94, "59.9 s"}, {60, "1m00s"},
                 {187, "3m07s"},   {3599.4, "59m59s"}, {3600, "1h00m"},   {7500, "2h05m"},
                 {97200, "1d03h"}, {-1, "-"},          {1e300, "-"}};
    char b[32];
    for (size_t i = 0; i < TV_ARRAY_LEN(cases); i++) {
        tv__cli_fmt_duration(cases[i].s, b, sizeof b);
        if (strcmp(b, cases[i].want))
            fail_msg("%g s: '%s', wanted '%s'", cases[i].s, b, cases[i].want);
    }
    tv__cli_fmt_duration(NAN, b, sizeof b);
    assert_string_equal(b, "-");
}

/* ---- where the daemon is found (cli/where.h) --------------------------------- */

/* A temp dir with a listening UNIX socket at dir/NAME; returns its fd. */
static int listen_at(const char *path)
{
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    assert_true(s >= 0 && strlen(path) < sizeof sa.sun_path);
    memcpy(sa.sun_path, path, strlen(path));
    assert_int_equal(bind(s, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(s, 1), 0);
    return s;
}

static void test_where_order(void **state)
{
    (void)state;
    char dir[256], inst[300], dev[300], tok[300], devtok[300], secret[64];
    tv_test_tmpdir(dir, sizeof dir, "where");
    snprintf(inst, sizeof inst, "%s/inst.sock", dir);
    snprintf(dev, sizeof dev, "%s/dev.sock", dir);
    snprintf(tok, sizeof tok, "%s/inst.token", dir);
    snprintf(devtok, sizeof devtok, "%s/dev.token", dir);
    tv__cli_defaults d = {inst, dev}, dt = {tok, devtok};
    tv__cli_where w;
    tv_error err = {0};
    unsetenv("TENSORVAULT_SOCKET");
    unsetenv("TENSORVAULT_URL");
    unsetenv("TENSORVAULT_TOKEN");
    unsetenv("TENSORVAULT_TOKEN_FILE");

    /* Nothing exists: not found, and the list names each place. */
    tv__cli_find_socket(NULL, "--socket", &d, &w);
    assert_false(w.found);
    assert_non_null(strstr(w.looked, "$TENSORVAULT_SOCKET (unset)"));
    assert_non_null(strstr(w.looked, inst));
    assert_non_null(strstr(w.looked, dev));
    assert_non_null(strstr(w.looked, "absent"));
    /* ./var's socket; then the installed one wins over it. */
    int s_dev = listen_at(dev);
    tv__cli_find_socket(NULL, "--socket", &d, &w);
    assert_true(w.found);
    assert_string_equal(w.value, dev);
    assert_string_equal(w.from, "./var");
    int s_inst = listen_at(inst);
    tv__cli_find_socket(NULL, "--socket", &d, &w);
    assert_string_equal(w.value, inst);
    /* The variable beats the defaults, the flag beats the variable; both
     * are taken as given, even when nothing is there. */
    setenv("TENSORVAULT_SOCKET", "/nonexistent/e.sock", 1);
    tv__cli_find_socket(NULL, "--socket", &d, &w);
    assert_string_equal(w.value, "/nonexistent/e.sock");
    assert_string_equal(w.from, "$TENSORVAULT_SOCKET");
    tv__cli_find_socket("/nonexistent/f.sock", "--socket", &d, &w);
    assert_string_equal(w.value, "/nonexistent/f.sock");
    assert_string_equal(w.from, "--socket");
    unsetenv("TENSORVAULT_SOCKET");
    /* A regular file where a socket should be is not a socket. */
    close(s_inst);
    unlink(inst);
    tv_test_write_text(inst, "x");
    tv__cli_find_socket(NULL, "--socket", &d, &w);
    assert_string_equal(w.value, dev);
    assert_non_null(strstr(w.looked, "not a socket"));

    /* HTTP: the sockets, then the built-in URL; URLs and socket paths. */
    assert_int_equal(tv__cli_find_http(NULL, &d, &w, &err), 0);
    assert_true(w.is_unix);
    assert_string_equal(w.value, dev);
    close(s_dev);
    unlink(dev);
    assert_int_equal(tv__cli_find_http(NULL, &d, &w, &err), 0);
    assert_false(w.is_unix);
    assert_string_equal(w.value, TV__CLI_DEFAULT_URL);
    assert_non_null(strstr(w.looked, "$TENSORVAULT_URL (unset)"));
    setenv("TENSORVAULT_URL", "unix:/run/x/http.sock", 1);
    assert_int_equal(tv__cli_find_http(NULL, &d, &w, &err), 0);
    assert_true(w.is_unix);
    assert_string_equal(w.value, "/run/x/http.sock");
    assert_int_equal(tv__cli_find_http("https://h:1", &d, &w, &err), 0);
    assert_false(w.is_unix);
    assert_string_equal(w.from, "--url");
    assert_int_equal(tv__cli_find_http("./var/run/http.sock", &d, &w, &err), 0);
    assert_true(w.is_unix);
    static const char *bad[] = {"file:///etc/passwd", "ftp://h:1", "127.0.0.1:8470",
                                "unix:", "./x://y"};
    for (size_t i = 0; i < TV_ARRAY_LEN(bad); i++)
        if (tv__cli_find_http(bad[i], &d, &w, &err) != TV_E_INVALID_ARG)
            fail_msg("URL '%s' was accepted", bad[i]);
    unsetenv("TENSORVAULT_URL");

    /* Tokens: --token-file, $TENSORVAULT_TOKEN, $TENSORVAULT_TOKEN_FILE,
     * then the default files that can be read. */
    assert_int_equal(tv__cli_find_token(NULL, &dt, &w, secret, sizeof secret, &err), 0);
    assert_false(w.found);
    assert_string_equal(secret, "");
    assert_non_null(strstr(w.looked, "$TENSORVAULT_TOKEN_FILE (unset)"));
    assert_non_null(strstr(w.looked, devtok));
    tv_test_write_text(devtok, "  tvk_dev \n");
    assert_int_equal(tv__cli_find_token(NULL, &dt, &w, secret, sizeof secret, &err), 0);
    assert_string_equal(secret, "tvk_dev");
    assert_string_equal(w.from, "./var");
    tv_test_write_text(tok, "tvk_inst\n");
    assert_int_equal(tv__cli_find_token(NULL, &dt, &w, secret, sizeof secret, &err), 0);
    assert_string_equal(secret, "tvk_inst");
    if (geteuid() != 0) { /* root reads a 0000 file: nothing to pass over */
        chmod(tok, 0);
        assert_int_equal(tv__cli_find_token(NULL, &dt, &w, secret, sizeof secret, &err), 0);
        assert_string_equal(secret, "tvk_dev");
        assert_non_null(strstr(w.looked, "Permission denied"));
        chmod(tok, 0600);
    }
    setenv("TENSORVAULT_TOKEN_FILE", devtok, 1);
    assert_int_equal(tv__cli_find_token(NULL, &dt, &w, secret, sizeof secret, &err), 0);
    assert_string_equal(secret, "tvk_dev");
    assert_string_equal(w.from, "$TENSORVAULT_TOKEN_FILE");
    setenv("TENSORVAULT_TOKEN_FILE", "/nonexistent/t", 1);
    assert_int_equal(tv__cli_find_token(NULL, &dt, &w, secret, sizeof secret, &err), -ENOENT);
    assert_non_null(strstr(err.msg, "/nonexistent/t"));
    assert_non_null(strstr(err.msg, "$TENSORVAULT_TOKEN_FILE"));
    setenv("TENSORVAULT_TOKEN", "tvk_env", 1);
    assert_int_equal(tv__cli_find_token(NULL, &dt, &w, secret, sizeof secret, &err), 0);
    assert_string_equal(secret, "tvk_env");
    assert_int_equal(tv__cli_find_token(tok, &dt, &w, secret, sizeof secret, &err), 0);
    assert_string_equal(secret, "tvk_inst");
    assert_string_equal(w.from, "--token-file");
    unsetenv("TENSORVAULT_TOKEN");
    unsetenv("TENSORVAULT_TOKEN_FILE");

    /* The failure text: the message, the hint, then every place. */
    tv__cli_find_socket(NULL, "--socket", &(tv__cli_defaults){"/nonexistent/a", NULL}, &w);
    tv__seterr(&err, TV_E_NO_DAEMON, "no socket");
    assert_int_equal(tv__cli_where_fail(&err, &w, "set TENSORVAULT_SOCKET"), TV_E_NO_DAEMON);
    assert_string_equal(err.msg, "no socket; set TENSORVAULT_SOCKET; looked at: "
                                 "$TENSORVAULT_SOCKET (unset), /nonexistent/a (absent)");
    assert_int_equal(tv_test_rmtree(dir), 0);
}

static void test_doc_error(void **state)
{
    (void)state;
    tv_error err = {0};
    json_error_t je;
    json_t *d = json_loads("{\"error\":{\"code\":\"TV_E_NOT_FOUND\",\"message\":\"model 'x' "
                           "not found\",\"errno\":-1004}}",
                           0, &je);
    assert_int_equal(tv__cli_doc_error(d, 404, &err), -1004);
    assert_string_equal(err.msg, "model 'x' not found");
    json_decref(d);
    /* No error object: an internal error naming the status. */
    assert_int_equal(tv__cli_doc_error(NULL, 502, &err), TV_E_INTERNAL);
    assert_non_null(strstr(err.msg, "502"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gen_accepts),
        cmocka_unit_test(test_gen_refuses),
        cmocka_unit_test(test_spec),
        cmocka_unit_test(test_ref),
        cmocka_unit_test(test_rows),
        cmocka_unit_test(test_size_every_suffix_and_case),
        cmocka_unit_test(test_size_refuses),
        cmocka_unit_test(test_uint),
        cmocka_unit_test(test_list),
        cmocka_unit_test(test_parse_ok),
        cmocka_unit_test(test_parse_refuses),
        cmocka_unit_test(test_opt_size_bounds),
        cmocka_unit_test(test_usage_from_tables),
        cmocka_unit_test(test_prologue),
        cmocka_unit_test(test_fastpath_option),
        cmocka_unit_test(test_pct_encode),
        cmocka_unit_test(test_progress_format),
        cmocka_unit_test(test_print_text),
        cmocka_unit_test(test_doc_error),
        cmocka_unit_test(test_fmt_bytes),
        cmocka_unit_test(test_fmt_time),
        cmocka_unit_test(test_fmt_duration),
        cmocka_unit_test(test_where_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
