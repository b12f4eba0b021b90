/* Unit tests of the fast path's access rules (server/fastpath/access.c):
 * the rule syntax (uid:N gid:N user:NAME group:NAME *, space or comma
 * separated), names resolved to ids, the daemon's own uid and gid as the
 * default, a model's list replacing the default, primary and supplementary
 * gids, the refusal's code and message, and whether a peer passes any list
 * at all (a peer that passes none may open no model). */
#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "fastpath/access.h"
#include "tensorvault/errors.h"

static tv__fp_access *make(const char *dflt, const char *const *models, const char *const *rules,
                           size_t n)
{
    tv__fp_access *a = NULL;
    tv_error err = {0};
    int rc = tv__fp_access_create(dflt, models, rules, n, &a, &err);
    if (rc)
        fail_msg("tv__fp_access_create: %s", err.msg);
    return a;
}

static void test_syntax(void **state)
{
    (void)state;
    tv_error err = {0};
    static const char *const ok[] = {"",
                                     "*",
                                     "uid:0",
                                     "gid:0",
                                     "uid:1000 gid:1000",
                                     "uid:1,gid:2",
                                     "  uid:1 ,, gid:2\t*  ",
                                     "user:root",
                                     "group:root",
                                     "uid:4294967294"};
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++)
        if (tv__fp_access_validate(ok[i], &err))
            fail_msg("'%s' refused: %s", ok[i], err.msg);
    static const struct {
        const char *text, *want;
    } bad[] = {
        {"uid:", "uid:"},
        {"uid:x", "a uid"},
        {"uid:-1", "uid:-1"},
        {"gid:1x", "a gid"},
        {"uid:4294967295", "below 4294967295"},
        {"uid:99999999999999999999", "uid:9999"},
        {"root",
         "expected uid:N, gid:N, user:NAME, group:NAME, *, token:NAME, token:* or anonymous"},
        {"token:", "token:"},
        {"anonymous:1", "anonymous:1"},
        {"uid:1 bogus:2", "bogus:2"},
        {"user:", "user:"},
        {"user:no-such-user-tv", "no such user"},
        {"group:no-such-group-tv", "no such group"},
        {"**", "**"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        err.msg[0] = '\0';
        int rc = tv__fp_access_validate(bad[i].text, &err);
        if (rc != TV_E_INVALID_ARG)
            fail_msg("'%s': %d, want TV_E_INVALID_ARG", bad[i].text, rc);
        if (!strstr(err.msg, bad[i].want))
            fail_msg("'%s': message \"%s\" lacks \"%s\"", bad[i].text, err.msg, bad[i].want);
    }
    char big[TV__FP_ACCESS_MAX_TEXT + 8];
    memset(big, ' ', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    assert_int_equal(tv__fp_access_validate(big, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv__fp_access_validate(NULL, &err), TV_E_INVALID_ARG);
}

static void test_default_is_the_daemon(void **state)
{
    (void)state;
    tv_error err = {0};
    tv__fp_access *a = make(NULL, NULL, NULL, 0);
    char want[64];
    snprintf(want, sizeof want, "uid:%u gid:%u token:*", (unsigned)getuid(), (unsigned)getgid());
    assert_string_equal(tv__fp_access_rules(a, "demo"), want);
    gid_t mine = getgid(), other = 54321;
    assert_int_equal(tv__fp_access_check(a, "demo", getuid(), &other, 1, &err), 0);
    assert_int_equal(tv__fp_access_check(a, "demo", 54321, &mine, 1, &err), 0);
    /* the daemon's gid as a supplementary group */
    gid_t both[2] = {other, mine};
    assert_int_equal(tv__fp_access_check(a, "demo", 54321, both, 2, &err), 0);
    assert_int_equal(tv__fp_access_check(a, "demo", 54321, &other, 1, &err), TV_E_PEER_DENIED);
    char msg[256];
    snprintf(msg, sizeof msg, "uid 54321 (gid 54321) may not open model 'demo' (allowed: %s)",
             want);
    assert_string_equal(err.msg, msg);
    tv__fp_access_free(a);
}

static void test_model_replaces_default(void **state)
{
    (void)state;
    tv_error err = {0};
    const char *models[] = {"demo", "open/model", "shut", "demo"};
    const char *rules[] = {"uid:1000", "*", "", "uid:1000, gid:2000"};
    tv__fp_access *a = make("uid:0 gid:0", models, rules, 4);
    gid_t g65534 = 65534, g2000 = 2000, g0 = 0;
    /* the later demo line wins */
    assert_string_equal(tv__fp_access_rules(a, "demo"), "uid:1000 gid:2000");
    assert_int_equal(tv__fp_access_check(a, "demo", 1000, &g65534, 1, &err), 0);
    assert_int_equal(tv__fp_access_check(a, "demo", 7, &g2000, 1, &err), 0);
    /* the default no longer applies to demo */
    assert_int_equal(tv__fp_access_check(a, "demo", 0, &g0, 1, &err), TV_E_PEER_DENIED);
    assert_string_equal(err.msg,
                        "uid 0 (gid 0) may not open model 'demo' (allowed: uid:1000 gid:2000)");
    /* anyone */
    assert_int_equal(tv__fp_access_check(a, "open/model", 65534, &g65534, 1, &err), 0);
    assert_int_equal(tv__fp_access_check(a, "open/model", 65534, NULL, 0, &err), 0);
    /* nobody */
    assert_int_equal(tv__fp_access_check(a, "shut", 0, &g0, 1, &err), TV_E_PEER_DENIED);
    assert_non_null(strstr(err.msg, "(allowed: nobody)"));
    /* other models: the default */
    assert_int_equal(tv__fp_access_check(a, "other", 0, &g65534, 1, &err), 0);
    assert_int_equal(tv__fp_access_check(a, "other", 65534, &g65534, 1, &err), TV_E_PEER_DENIED);
    assert_string_equal(err.msg,
                        "uid 65534 (gid 65534) may not open model 'other' (allowed: uid:0 gid:0)");
    /* no gids at all */
    assert_int_equal(tv__fp_access_check(a, "other", 5, NULL, 0, &err), TV_E_PEER_DENIED);
    assert_non_null(strstr(err.msg, "uid 5 (gid none)"));
    /* model names match exactly */
    assert_int_equal(tv__fp_access_check(a, "Demo", 1000, &g65534, 1, &err), TV_E_PEER_DENIED);
    assert_int_equal(tv__fp_access_check(NULL, "demo", 0, &g0, 1, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv__fp_access_check(a, NULL, 0, &g0, 1, &err), TV_E_INVALID_ARG);
    assert_null(tv__fp_access_rules(NULL, "demo"));
    tv__fp_access_free(a);
    tv__fp_access_free(NULL);
}

static void test_names_resolved(void **state)
{
    (void)state;
    tv_error err = {0};
    struct passwd *pw = getpwuid(0);
    struct group *gr = getgrgid(0);
    if (!pw || !gr)
        skip();
    char u[300], g[300];
    snprintf(u, sizeof u, "user:%s", pw->pw_name);
    snprintf(g, sizeof g, "group:%s", gr->gr_name);
    const char *models[] = {"byuser", "bygroup"};
    const char *rules[] = {u, g};
    tv__fp_access *a = make("", models, rules, 2);
    gid_t g0 = 0, g9 = 9999;
    assert_int_equal(tv__fp_access_check(a, "byuser", 0, &g9, 1, &err), 0);
    assert_int_equal(tv__fp_access_check(a, "byuser", 9999, &g0, 1, &err), TV_E_PEER_DENIED);
    assert_non_null(strstr(err.msg, u)); /* the list as written */
    assert_int_equal(tv__fp_access_check(a, "bygroup", 9999, &g0, 1, &err), 0);
    assert_int_equal(tv__fp_access_check(a, "bygroup", 0, &g9, 1, &err), TV_E_PEER_DENIED);
    /* empty default: nobody */
    assert_int_equal(tv__fp_access_check(a, "x", 0, &g0, 1, &err), TV_E_PEER_DENIED);
    tv__fp_access_free(a);
}

static void test_create_errors(void **state)
{
    (void)state;
    tv_error err = {0};
    tv__fp_access *a = (tv__fp_access *)&err;
    assert_int_equal(tv__fp_access_create("uid:x", NULL, NULL, 0, &a, &err), TV_E_INVALID_ARG);
    assert_null(a);
    assert_non_null(strstr(err.msg, "[access] default: access rule 'uid:x'"));
    const char *models[] = {"demo"};
    const char *rules[] = {"gid:1 nope"};
    assert_int_equal(tv__fp_access_create(NULL, models, rules, 1, &a, &err), TV_E_INVALID_ARG);
    assert_non_null(strstr(err.msg, "[access] demo: access rule 'nope'"));
    assert_int_equal(tv__fp_access_create(NULL, NULL, NULL, 1, &a, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv__fp_access_create(NULL, NULL, NULL, 0, NULL, &err), TV_E_INVALID_ARG);
}

/* tv__fp_access_any: the default list or any model's list lets the peer
 * open something; none does: TV_E_PEER_DENIED naming the uid and gid. */
static void test_any_list(void **state)
{
    (void)state;
    tv_error err = {0};
    const char *models[] = {"llama", "shut"};
    const char *rules[] = {"uid:1000 gid:2000", ""};
    tv__fp_access *a = make("uid:0", models, rules, 2);
    gid_t g0 = 0, g2000 = 2000, g65534 = 65534, sup[] = {65534, 2000};
    assert_int_equal(tv__fp_access_any(a, 0, &g65534, 1, &err), 0);    /* the default */
    assert_int_equal(tv__fp_access_any(a, 1000, &g65534, 1, &err), 0); /* llama's uid */
    assert_int_equal(tv__fp_access_any(a, 7, &g2000, 1, &err), 0);     /* llama's gid */
    assert_int_equal(tv__fp_access_any(a, 7, sup, 2, &err), 0);        /* a supplementary one */
    assert_int_equal(tv__fp_access_any(a, 65534, &g65534, 1, &err), TV_E_PEER_DENIED);
    assert_string_equal(
        err.msg,
        "uid 65534 (gid 65534) may open no model on this daemon (no [access] rule list allows it)");
    assert_int_equal(tv__fp_access_any(a, 65534, NULL, 0, &err), TV_E_PEER_DENIED);
    assert_non_null(strstr(err.msg, "uid 65534 (gid none)"));
    assert_int_equal(tv__fp_access_any(NULL, 0, &g0, 1, &err), TV_E_INVALID_ARG);
    tv__fp_access_free(a);
    /* a list with * lets anyone in; an empty default with no model lists nobody */
    const char *star[] = {"*"};
    a = make("", models, star, 1);
    assert_int_equal(tv__fp_access_any(a, 65534, &g65534, 1, &err), 0);
    tv__fp_access_free(a);
    a = make("", NULL, NULL, 0);
    assert_int_equal(tv__fp_access_any(a, 0, &g0, 1, &err), TV_E_PEER_DENIED);
    tv__fp_access_free(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_syntax),
        cmocka_unit_test(test_default_is_the_daemon),
        cmocka_unit_test(test_model_replaces_default),
        cmocka_unit_test(test_names_resolved),
        cmocka_unit_test(test_create_errors),
        cmocka_unit_test(test_any_list),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
