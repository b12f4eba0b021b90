/* Unit tests of tensorvaultd's configuration (server/daemon/config.c):
 * defaults, the INI file, TENSORVAULT_* variables, flags and their
 * precedence (file < environment < flags), and bad values or unknown keys
 * refused with a message naming FILE:LINE (or the variable, or the flag)
 * and the key; the [fastpath] keys and the [access] rule lists. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "daemon/config.h"
#include "tv_test.h"
#include "util/internal.h"

static char g_dir[512];

static int setup(void **state)
{
    (void)state;
    tv_test_tmpdir(g_dir, sizeof(g_dir), "config");
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    tv_test_rmtree(g_dir);
    return 0;
}

static const char *write_ini(const char *name, const char *text)
{
    static char path[600];
    tv_test_path(path, sizeof(path), "%s/%s", g_dir, name);
    tv_test_write_text(path, text);
    return path;
}

static void test_defaults(void **state)
{
    (void)state;
    tv__config c;
    tv__config_action act;
    tv_error err = {0};
    char *argv[] = {"tensorvaultd", NULL};
    char *envp[] = {"PATH=/bin", "TENSORVAULT_URL=http://x:1", "TENSORVAULT_STORE=/s", NULL};
    assert_int_equal(tv__config_load(&c, 1, argv, envp, &act, &err), 0);
    assert_int_equal(act, TV__CFG_RUN);
    assert_string_equal(c.http_listen, "127.0.0.1:8470");
    assert_int_equal(c.http_threads, 0);
    assert_int_equal(c.http_connection_timeout_s, 30);
    assert_int_equal(c.http_per_ip_connections, 256);
    assert_int_equal(c.http_memory_limit, 64u << 10);
    assert_int_equal(c.http_max_body_bytes, 64u << 10);
    assert_int_equal(c.http_max_header_bytes, 8u << 10);
    assert_int_equal(c.http_anonymous_reads, TV__CFG_ANON_LOOPBACK);
    assert_string_equal(c.store_dir, "./var");
    assert_string_equal(c.store_image, "./var/store.img");
    assert_true(c.store_image_size == (UINT64_C(16) << 30));
    assert_string_equal(c.store_device, "");
    assert_string_equal(c.store_admin_token, "./var/admin.token");
    assert_int_equal(c.store_admin_token_mode, 0600);
    char cwd[TV__CFG_STR_MAX];
    assert_non_null(getcwd(cwd, sizeof(cwd)));
    assert_string_equal(c.import_roots, cwd);
    assert_int_equal(c.import_workers, 2);
    assert_int_equal(c.import_queue, 16);
    assert_false(c.import_strict);
    assert_int_equal(c.log_level, TV_LOG_INFO);
    assert_string_equal(c.log_file, "stderr");
    assert_string_equal(c.demo_source, "");
    assert_true(c.fastpath_enabled);
    assert_string_equal(c.fastpath_socket, "./var/run/tensorvault.sock");
    assert_int_equal(c.fastpath_mode, 0660);
    assert_int_equal(c.fastpath_slot_len, 1u << 20);
    assert_int_equal(c.fastpath_group_slots, 128);
    assert_int_equal(c.fastpath_credit, 32);
    assert_int_equal(c.fastpath_max_sessions, 256);
    assert_int_equal(c.fastpath_max_sessions_per_uid, 0); /* max_sessions / 4 */
    assert_int_equal(c.fastpath_max_groups, 16);
    assert_int_equal(c.fastpath_hold_timeout_ms, 10000);
    assert_int_equal(c.fastpath_max_groups_per_uid, 0);   /* max_groups / 2 */
    assert_int_equal(c.fastpath_max_groups_per_model, 0); /* max_groups / 4 */
    assert_int_equal(c.fastpath_max_requests, 16384);
    assert_int_equal(c.fastpath_readahead, 16);
    char own[64];
    snprintf(own, sizeof own, "uid:%u gid:%u token:*", (unsigned)getuid(), (unsigned)getgid());
    assert_string_equal(c.access_default, own);
    assert_int_equal(c.n_access, 0);
}

/* [fastpath] and [access]: every key from a file, the socket following
 * store.dir unless given, model lists replaced by a later layer. */
static void test_fastpath_and_access(void **state)
{
    (void)state;
    const char *p = write_ini("fp.ini", "[store]\n"
                                        "dir = /srv/tv\n"
                                        "[fastpath]\n"
                                        "enabled = no\n"
                                        "mode = 0600\n"
                                        "slot_len = 4M\n"
                                        "group_slots = 64\n"
                                        "credit = 8\n"
                                        "max_sessions = 5\n"
                                        "max_sessions_per_uid = 3\n"
                                        "max_groups = 2\n"
                                        "hold_timeout_ms = 2500\n"
                                        "max_groups_per_uid = 7\n"
                                        "max_groups_per_model = 6\n"
                                        "max_requests = 100\n"
                                        "readahead = 0\n"
                                        "[access]\n"
                                        "; anyone may read demo\n"
                                        "default = uid:0, gid:0\n"
                                        "demo = *\n"
                                        "acme/tiny = uid:1000 gid:1000\n");
    tv__config c;
    tv__config_action act;
    tv_error err = {0};
    char *argv[] = {"tensorvaultd", "--config", (char *)p, "--set", "access.demo=uid:7", NULL};
    char *envp[] = {"TENSORVAULT_ACCESS_Other=gid:9", NULL};
    int rc = tv__config_load(&c, 5, argv, envp, &act, &err);
    if (rc)
        fail_msg("%s", err.msg);
    assert_false(c.fastpath_enabled);
    assert_string_equal(c.fastpath_socket, "/srv/tv/run/tensorvault.sock"); /* follows */
    assert_int_equal(c.fastpath_mode, 0600);
    assert_int_equal(c.fastpath_slot_len, 4u << 20);
    assert_int_equal(c.fastpath_group_slots, 64);
    assert_int_equal(c.fastpath_credit, 8);
    assert_int_equal(c.fastpath_max_sessions, 5);
    assert_int_equal(c.fastpath_max_sessions_per_uid, 3);
    assert_int_equal(c.fastpath_max_groups, 2);
    assert_int_equal(c.fastpath_hold_timeout_ms, 2500);
    assert_int_equal(c.fastpath_max_groups_per_uid, 7);
    assert_int_equal(c.fastpath_max_groups_per_model, 6);
    assert_int_equal(c.fastpath_max_requests, 100);
    assert_int_equal(c.fastpath_readahead, 0);
    assert_string_equal(c.access_default, "uid:0, gid:0");
    assert_int_equal(c.n_access, 3);
    assert_string_equal(c.access[0].model, "demo");
    assert_string_equal(c.access[0].rules, "uid:7"); /* --set over the file */
    assert_string_equal(c.access[1].model, "acme/tiny");
    assert_string_equal(c.access[1].rules, "uid:1000 gid:1000");
    assert_string_equal(c.access[2].model, "Other"); /* the environment, as written */
    assert_string_equal(c.access[2].rules, "gid:9");

    /* a given socket is kept, an environment one too */
    char *argv2[] = {"tensorvaultd", "--store", "/x", NULL};
    char *envp2[] = {"TENSORVAULT_FASTPATH_SOCKET=/run/tv.sock", NULL};
    assert_int_equal(tv__config_load(&c, 3, argv2, envp2, &act, &err), 0);
    assert_string_equal(c.fastpath_socket, "/run/tv.sock");
    assert_true(c.fastpath_enabled);

    /* too long for a socket address: refused when given */
    char longsock[200], set[240];
    memset(longsock, 'a', sizeof longsock - 1);
    longsock[0] = '/';
    longsock[sizeof longsock - 1] = '\0';
    snprintf(set, sizeof set, "fastpath.socket=%s", longsock);
    char *argv3[] = {"tensorvaultd", "--set", set, NULL};
    char *envp3[] = {NULL};
    assert_int_equal(tv__config_load(&c, 3, argv3, envp3, &act, &err), TV_E_INVALID_ARG);
    assert_non_null(strstr(err.msg, "fastpath.socket"));
    assert_non_null(strstr(err.msg, "at most 107"));

    /* group_slots under 2 x credit */
    char *argv4[] = {"tensorvaultd", "--set", "fastpath.credit=65", NULL};
    assert_int_equal(tv__config_load(&c, 3, argv4, envp3, &act, &err), TV_E_INVALID_ARG);
    assert_non_null(strstr(err.msg, "fastpath.group_slots 128 is under 2 x fastpath.credit (65)"));

    /* a bad rule names the file, line and word */
    p = write_ini("badaccess.ini", "[access]\ndemo = uid:1\nlab = uid:1 bob\n");
    tv__config_defaults(&c);
    assert_int_equal(tv__config_load_file(&c, p, &err), TV_E_INVALID_ARG);
    char want[700];
    snprintf(want, sizeof(want), "%s:3: access.lab: access rule 'bob'", p);
    if (!strstr(err.msg, want))
        fail_msg("\"%s\" lacks \"%s\"", err.msg, want);

    /* the model table is bounded */
    tv__config_defaults(&c);
    for (int i = 0; i < TV__CFG_MAX_ACCESS; i++) {
        char key[64];
        snprintf(key, sizeof key, "access.m%d", i);
        assert_int_equal(tv__config_set(&c, key, "*", "t", &err), 0);
    }
    assert_int_equal(tv__config_set(&c, "access.m0", "uid:1", "t", &err), 0); /* replaces */
    assert_int_equal(tv__config_set(&c, "access.one-more", "*", "t", &err), TV_E_INVALID_ARG);
    assert_non_null(strstr(err.msg, "more than 64 models"));
    assert_int_equal(tv__config_set(&c, "access.", "*", "t", &err), TV_E_INVALID_ARG);
}

static void test_file_sets_every_kind(void **state)
{
    (void)state;
    const char *p = write_ini("all.ini", "; comment\n"
                                         "[http]\n"
                                         "listen = 0.0.0.0:9000\n"
                                         "threads = 3\n"
                                         "memory_limit = 2M\n"
                                         "max_body_bytes = 128K\n"
                                         "anonymous_reads = never\n"
                                         "[store]\n"
                                         "dir = /srv/tv\n"
                                         "image_size = 1G\n"
                                         "[import]\n"
                                         "roots = /a:/b::/c\n"
                                         "strict = yes\n"
                                         "workers = 4\n"
                                         "[log]\n"
                                         "level = debug\n"
                                         "[demo]\n"
                                         "source = /data/demo\n");
    tv__config c;
    tv__config_action act;
    tv_error err = {0};
    char *argv[] = {"tensorvaultd", "--config", (char *)p, NULL};
    char *envp[] = {NULL};
    assert_int_equal(tv__config_load(&c, 3, argv, envp, &act, &err), 0);
    assert_string_equal(c.http_listen, "0.0.0.0:9000");
    assert_int_equal(c.http_threads, 3);
    assert_int_equal(c.http_memory_limit, 2u << 20);
    assert_int_equal(c.http_max_body_bytes, 128u << 10);
    assert_int_equal(c.http_anonymous_reads, TV__CFG_ANON_NEVER);
    assert_string_equal(c.store_dir, "/srv/tv");
    assert_string_equal(c.store_image, "/srv/tv/store.img");         /* follows the directory */
    assert_string_equal(c.store_admin_token, "/srv/tv/admin.token"); /* so does the token */
    assert_true(c.store_image_size == (UINT64_C(1) << 30));
    assert_true(c.import_strict);
    assert_int_equal(c.import_workers, 4);
    assert_int_equal(c.log_level, TV_LOG_DEBUG);
    assert_string_equal(c.demo_source, "/data/demo");
    char buf[TV__CFG_STR_MAX];
    const char *roots[TV__CFG_MAX_ROOTS];
    assert_int_equal(tv__config_roots(&c, buf, roots), 3);
    assert_string_equal(roots[0], "/a");
    assert_string_equal(roots[1], "/b");
    assert_string_equal(roots[2], "/c");
}

static void test_precedence_file_env_flags(void **state)
{
    (void)state;
    const char *p = write_ini("prec.ini", "[http]\nlisten = 10.0.0.1:1\nthreads = 5\n"
                                          "[import]\nworkers = 7\nqueue = 9\n"
                                          "[store]\nimage = /img/file.img\n");
    tv__config c;
    tv__config_action act;
    tv_error err = {0};
    char *argv[] = {"tensorvaultd", "--config",       (char *)p,     "--listen", "127.0.0.1:0",
                    "--set",        "import.queue=3", "--store=/st", NULL};
    char *envp[] = {"TENSORVAULT_HTTP_LISTEN=10.0.0.2:2", "TENSORVAULT_IMPORT_WORKERS=6",
                    "TENSORVAULT_HTTP_THREADS=2", NULL};
    assert_int_equal(tv__config_load(&c, 8, argv, envp, &act, &err), 0);
    assert_string_equal(c.http_listen, "127.0.0.1:0"); /* flag over env over file */
    assert_int_equal(c.http_threads, 2);               /* env over file */
    assert_int_equal(c.import_workers, 6);             /* env over file */
    assert_int_equal(c.import_queue, 3);               /* --set over file */
    assert_string_equal(c.store_dir, "/st");
    assert_string_equal(c.store_image, "/img/file.img"); /* given: not derived */
}

static void test_bad_value_names_file_line_and_key(void **state)
{
    (void)state;
    const char *p = write_ini("bad.ini", "[http]\nlisten = 127.0.0.1:8470\n\nthreads = lots\n");
    tv__config c;
    tv_error err = {0};
    tv__config_defaults(&c);
    assert_int_equal(tv__config_load_file(&c, p, &err), TV_E_INVALID_ARG);
    char want[700];
    snprintf(want, sizeof(want), "%s:4: http.threads: 'lots'", p);
    assert_non_null(strstr(err.msg, want));

    p = write_ini("unknown.ini", "[import]\nworkers = 2\nwrokers = 3\n");
    assert_int_equal(tv__config_load_file(&c, p, &err), TV_E_INVALID_ARG);
    snprintf(want, sizeof(want), "%s:3: unknown configuration key 'import.wrokers'", p);
    assert_non_null(strstr(err.msg, want));

    p = write_ini("section.ini", "[htp]\nlisten = 1.2.3.4:5\n");
    assert_int_equal(tv__config_load_file(&c, p, &err), TV_E_INVALID_ARG);
    snprintf(want, sizeof(want), "%s:2: unknown configuration key 'htp.listen'", p);
    assert_non_null(strstr(err.msg, want));

    p = write_ini("syntax.ini", "[http]\nthis is not a key\n");
    assert_int_equal(tv__config_load_file(&c, p, &err), TV_E_INVALID_ARG);
    snprintf(want, sizeof(want), "%s:2: syntax error", p);
    assert_non_null(strstr(err.msg, want));

    char missing[600];
    tv_test_path(missing, sizeof(missing), "%s/none.ini", g_dir);
    assert_int_equal(tv__config_load_file(&c, missing, &err), -ENOENT);
    assert_non_null(strstr(err.msg, missing));
}

static void test_bad_values_each_kind(void **state)
{
    (void)state;
    static const char *const bad[][2] = {
        {"http.listen", "8470"},
        {"http.listen", "host:99999"},
        {"http.listen", ":80"},
        {"http.threads", "-1"},
        {"http.threads", "2x"},
        {"http.connection_timeout_s", "0"},
        {"http.memory_limit", "1K"},
        {"http.max_body_bytes", "12Q"},
        {"http.anonymous_reads", "some"},
        {"store.dir", ""},
        {"store.image_size", "1"},
        {"import.workers", "0"},
        {"import.strict", "maybe"},
        {"log.level", "loud"},
        {"log.file", ""},
        {"fastpath.enabled", "sometimes"},
        {"fastpath.socket", ""},
        {"fastpath.mode", "0668"},
        {"fastpath.mode", "1777"},
        {"fastpath.mode", "rw"},
        {"fastpath.mode", "0"},
        {"fastpath.slot_len", "1000"},
        {"fastpath.slot_len", "6000"},
        {"fastpath.slot_len", "1G"},
        {"fastpath.group_slots", "1"},
        {"fastpath.credit", "0"},
        {"fastpath.max_sessions", "0"},
        {"fastpath.max_sessions_per_uid", "65537"},
        {"fastpath.hold_timeout_ms", "99"},
        {"fastpath.hold_timeout_ms", "86400001"},
        {"fastpath.max_groups_per_uid", "1025"},
        {"fastpath.max_groups_per_model", "-1"},
        {"fastpath.max_groups", "2000"},
        {"fastpath.max_requests", "0"},
        {"fastpath.nope", "1"},
        {"access.default", "uid:abc"},
        {"access.demo", "user:no-such-user-tv"},
    };
    tv__config c;
    tv__config_defaults(&c);
    for (size_t i = 0; i < TV_ARRAY_LEN(bad); i++) {
        tv_error err = {0};
        assert_int_equal(tv__config_set(&c, bad[i][0], bad[i][1], "--set", &err), TV_E_INVALID_ARG);
        assert_non_null(strstr(err.msg, bad[i][0]));
        assert_non_null(strstr(err.msg, "--set"));
    }
    /* Nothing changed. */
    assert_string_equal(c.http_listen, "127.0.0.1:8470");
    assert_int_equal(c.import_workers, 2);
    /* The accepted forms. */
    assert_int_equal(tv__config_set(&c, "http.listen", "[::1]:8080", "t", NULL), 0);
    assert_int_equal(tv__config_set(&c, "store.image_size", "16GiB", "t", NULL), 0);
    assert_true(c.store_image_size == (UINT64_C(16) << 30));
    assert_int_equal(tv__config_set(&c, "import.strict", "ON", "t", NULL), 0);
    assert_true(c.import_strict);
    assert_int_equal(tv__config_set(&c, "fastpath.mode", "640", "t", NULL), 0);
    assert_int_equal(c.fastpath_mode, 0640);
    assert_int_equal(tv__config_set(&c, "fastpath.slot_len", "64K", "t", NULL), 0);
    assert_int_equal(c.fastpath_slot_len, 64u << 10);
    assert_int_equal(tv__config_set(&c, "access.demo", "", "t", NULL), 0); /* nobody */
    assert_int_equal(c.n_access, 1);
}

static void test_env_bad_value_names_variable(void **state)
{
    (void)state;
    tv__config c;
    tv_error err = {0};
    tv__config_defaults(&c);
    char *envp[] = {"TENSORVAULT_IMPORT_QUEUE=none", NULL};
    assert_int_equal(tv__config_load_env(&c, envp, &err), TV_E_INVALID_ARG);
    assert_non_null(strstr(err.msg, "environment TENSORVAULT_IMPORT_QUEUE: import.queue"));
    char *envp2[] = {"TENSORVAULT_HTTP_NOPE=1", NULL};
    assert_int_equal(tv__config_load_env(&c, envp2, &err), TV_E_INVALID_ARG);
    assert_non_null(strstr(err.msg, "unknown configuration key 'http.nope'"));
    char *envp3[] = {"TENSORVAULT_HTTP_CONNECTION_TIMEOUT_S=5", "TENSORVAULT_LOG=debug", NULL};
    assert_int_equal(tv__config_load_env(&c, envp3, &err), 0);
    assert_int_equal(c.http_connection_timeout_s, 5);
}

/* TENSORVAULT_ACCESS_<MODEL>: the section matches in any case, the model
 * name after it is taken exactly as written (model names are
 * case-sensitive: a lower-cased "llama" would leave model "Llama" to the
 * default list); the key default in any case is access.default; the other
 * sections' keys are lower-cased as before. */
static void test_env_access_model_case(void **state)
{
    (void)state;
    tv__config c;
    tv_error err = {0};
    tv__config_defaults(&c);
    char *envp[] = {"TENSORVAULT_ACCESS_Llama=uid:1000",   "TENSORVAULT_access_org/Model.V2=gid:7",
                    "TENSORVAULT_Access_DEFAULT=uid:5",    "TENSORVAULT_ACCESS_llama=uid:1001",
                    "TENSORVAULT_FASTPATH_MAX_SESSIONS=9", NULL};
    assert_int_equal(tv__config_load_env(&c, envp, &err), 0);
    assert_int_equal(c.n_access, 3);
    assert_string_equal(c.access[0].model, "Llama");
    assert_string_equal(c.access[0].rules, "uid:1000");
    assert_string_equal(c.access[1].model, "org/Model.V2");
    assert_string_equal(c.access[1].rules, "gid:7");
    assert_string_equal(c.access[2].model, "llama"); /* another model */
    assert_string_equal(c.access[2].rules, "uid:1001");
    assert_string_equal(c.access_default, "uid:5");
    assert_int_equal(c.fastpath_max_sessions, 9);
    char *bad[] = {"TENSORVAULT_ACCESS_Llama=uid:x", NULL};
    assert_int_equal(tv__config_load_env(&c, bad, &err), TV_E_INVALID_ARG);
    assert_non_null(strstr(err.msg, "environment TENSORVAULT_ACCESS_Llama: access.Llama:"));
}

static void test_flags(void **state)
{
    (void)state;
    tv__config c;
    tv__config_action act;
    tv_error err = {0};
    char *envp[] = {NULL};
    char *help[] = {"tensorvaultd", "--listen", "x:1", "--help", NULL};
    assert_int_equal(tv__config_load(&c, 4, help, envp, &act, &err), 0);
    assert_int_equal(act, TV__CFG_HELP);
    char *ver[] = {"tensorvaultd", "--version", NULL};
    assert_int_equal(tv__config_load(&c, 2, ver, envp, &act, &err), 0);
    assert_int_equal(act, TV__CFG_VERSION);
    char *unknown[] = {"tensorvaultd", "--lisen", "x:1", NULL};
    assert_int_equal(tv__config_load(&c, 3, unknown, envp, &act, &err), TV_E_INVALID_ARG);
    assert_non_null(strstr(err.msg, "--lisen"));
    char *novalue[] = {"tensorvaultd", "--store", NULL};
    assert_int_equal(tv__config_load(&c, 2, novalue, envp, &act, &err), TV_E_INVALID_ARG);
    assert_non_null(strstr(err.msg, "--store needs a value"));
    char *badset[] = {"tensorvaultd", "--set", "import.workers", NULL};
    assert_int_equal(tv__config_load(&c, 3, badset, envp, &act, &err), TV_E_INVALID_ARG);
    assert_non_null(strstr(err.msg, "SECTION.KEY=VALUE"));
    char *badlevel[] = {"tensorvaultd", "--log-level", "chatty", NULL};
    assert_int_equal(tv__config_load(&c, 3, badlevel, envp, &act, &err), TV_E_INVALID_ARG);
    assert_non_null(strstr(err.msg, "--log-level: log.level: 'chatty'"));
    char *ok[] = {"tensorvaultd", "--demo", "/d", "--log-level=warn", NULL};
    assert_int_equal(tv__config_load(&c, 4, ok, envp, &act, &err), 0);
    assert_string_equal(c.demo_source, "/d");
    assert_int_equal(c.log_level, TV_LOG_WARN);
    assert_non_null(strstr(tv__config_usage(), "--set"));
}

/* [fleet]: standalone by default, the node named after the host; the
 * conninfo from the environment; an empty node name refused. */
static void test_fleet_keys(void **state)
{
    (void)state;
    tv__config c;
    tv__config_action act;
    tv_error err = {0};
    char *argv[] = {"tensorvaultd", "--set", "fleet.node=n1", NULL};
    char *envp[] = {"TENSORVAULT_FLEET_POSTGRES=postgresql://u:pw@h/db", NULL};
    char *none[] = {NULL};
    assert_int_equal(tv__config_load(&c, 1, argv, none, &act, &err), 0);
    assert_string_equal(c.fleet_postgres, "");
    assert_true(c.fleet_node[0] != '\0');
    assert_int_equal(tv__config_load(&c, 3, argv, envp, &act, &err), 0);
    assert_string_equal(c.fleet_postgres, "postgresql://u:pw@h/db");
    assert_string_equal(c.fleet_node, "n1");
    assert_int_equal(tv__config_set(&c, "fleet.node", "", "--set", &err), TV_E_INVALID_ARG);
    assert_int_equal(tv__config_set(&c, "fleet.postgres", "", "--set", &err), 0);
}

static void test_s3_keys_and_aws_env(void **state)
{
    (void)state;
    tv__config c;
    tv__config_action act;
    tv_error err = {0};
    char *argv[] = {"tensorvaultd", "--set", "s3.region=eu-west-1", NULL};
    char *none[] = {NULL};
    assert_int_equal(tv__config_load(&c, 1, argv, none, &act, &err), 0);
    assert_string_equal(c.s3_endpoint, "");
    assert_string_equal(c.s3_region, "");
    assert_string_equal(c.s3_access_key_id, "");
    char *envp[] = {"AWS_ENDPOINT_URL=http://127.0.0.1:9000",
                    "AWS_REGION=us-west-2",
                    "AWS_DEFAULT_REGION=ap-south-1",
                    "AWS_ACCESS_KEY_ID=AKENV",
                    "AWS_SECRET_ACCESS_KEY=skenv",
                    "AWS_SESSION_TOKEN=tok",
                    NULL};
    assert_int_equal(tv__config_load(&c, 1, argv, envp, &act, &err), 0);
    assert_string_equal(c.s3_endpoint, "http://127.0.0.1:9000");
    assert_string_equal(c.s3_region, "us-west-2");
    assert_string_equal(c.s3_access_key_id, "AKENV");
    assert_string_equal(c.s3_secret_access_key, "skenv");
    assert_string_equal(c.s3_session_token, "tok");
    /* the config wins; a key pair never mixes config and environment */
    char *argv2[] = {"tensorvaultd",           "--set", "s3.region=eu-west-1",        "--set",
                     "s3.access_key_id=AKCFG", "--set", "s3.secret_access_key=skcfg", NULL};
    assert_int_equal(tv__config_load(&c, 7, argv2, envp, &act, &err), 0);
    assert_string_equal(c.s3_region, "eu-west-1");
    assert_string_equal(c.s3_access_key_id, "AKCFG");
    assert_string_equal(c.s3_secret_access_key, "skcfg");
    assert_string_equal(c.s3_session_token, "");
    char *envp2[] = {"AWS_DEFAULT_REGION=ap-south-1", NULL};
    assert_int_equal(tv__config_load(&c, 1, argv, envp2, &act, &err), 0);
    assert_string_equal(c.s3_region, "ap-south-1");
    char *argv3[] = {"tensorvaultd", "--set", "s3.access_key_id=AKCFG", NULL};
    assert_int_equal(tv__config_load(&c, 3, argv3, none, &act, &err), TV_E_INVALID_ARG);
    assert_non_null(strstr(err.msg, "s3.secret_access_key"));
}

/* store.admin_token and its mode: the installed layout puts the token
 * beside the store directory, readable by the daemon's group; a mode that
 * lets others in (or anyone but the owner write, or execute) is refused. */
static void test_admin_token_file(void **state)
{
    (void)state;
    const char *p = write_ini("token.ini", "[store]\n"
                                           "dir = /var/lib/tensorvault/store\n"
                                           "admin_token = /var/lib/tensorvault/admin.token\n"
                                           "admin_token_mode = 0640\n");
    tv__config c;
    tv__config_action act;
    tv_error err = {0};
    char *argv[] = {"tensorvaultd", "--config", (char *)p, NULL};
    char *envp[] = {NULL};
    assert_int_equal(tv__config_load(&c, 3, argv, envp, &act, &err), 0);
    assert_string_equal(c.store_admin_token, "/var/lib/tensorvault/admin.token");
    assert_int_equal(c.store_admin_token_mode, 0640);
    /* given: it stays where it was put when store.dir moves */
    char *argv2[] = {"tensorvaultd", "--config", (char *)p, "--store", "/elsewhere", NULL};
    assert_int_equal(tv__config_load(&c, 5, argv2, envp, &act, &err), 0);
    assert_string_equal(c.store_admin_token, "/var/lib/tensorvault/admin.token");
    assert_string_equal(c.store_image, "/elsewhere/store.img");
    static const char *const ok[] = {"0600", "0640", "0400", "0440"};
    for (size_t i = 0; i < TV_ARRAY_LEN(ok); i++) {
        char set[64];
        snprintf(set, sizeof set, "store.admin_token_mode=%s", ok[i]);
        char *a[] = {"tensorvaultd", "--set", set, NULL};
        assert_int_equal(tv__config_load(&c, 3, a, envp, &act, &err), 0);
    }
    static const char *const bad[] = {"0644", "0660", "0700", "0604", "0200", "0641"};
    for (size_t i = 0; i < TV_ARRAY_LEN(bad); i++) {
        char set[64];
        snprintf(set, sizeof set, "store.admin_token_mode=%s", bad[i]);
        char *a[] = {"tensorvaultd", "--set", set, NULL};
        memset(&err, 0, sizeof err);
        assert_int_equal(tv__config_load(&c, 3, a, envp, &act, &err), TV_E_INVALID_ARG);
        assert_non_null(strstr(err.msg, "store.admin_token_mode"));
        assert_non_null(strstr(err.msg, bad[i]));
    }
    char *empty[] = {"tensorvaultd", "--set", "store.admin_token=", NULL};
    assert_int_equal(tv__config_load(&c, 3, empty, envp, &act, &err), TV_E_INVALID_ARG);
    assert_non_null(strstr(err.msg, "store.admin_token"));
}

/* import.hf_*: the Hub's endpoint and token file, the daemon's HF_ENDPOINT
 * and HF_TOKEN over them (the daemon fetches: its token is its own). */
static void test_hf_keys_and_env(void **state)
{
    (void)state;
    tv__config c;
    tv__config_action act;
    tv_error err = {0};
    char *none[] = {NULL};
    char *argv[] = {"tensorvaultd", NULL};
    assert_int_equal(tv__config_load(&c, 1, argv, none, &act, &err), 0);
    assert_string_equal(c.import_hf_endpoint, "https://huggingface.co");
    assert_string_equal(c.hf_token, "");
    assert_false(c.import_hf_redirect_http);
    assert_false(c.import_hf_redirect_private);
    const char *tok = write_ini("hf.token", "hf_from_file\nsecond line\n");
    char set[700];
    snprintf(set, sizeof set, "import.hf_token_file=%s", tok);
    char *argv2[] = {"tensorvaultd",
                     "--set",
                     set,
                     "--set",
                     "import.hf_endpoint=http://mirror:8080/",
                     "--set",
                     "import.hf_redirect_private=yes",
                     NULL};
    assert_int_equal(tv__config_load(&c, 7, argv2, none, &act, &err), 0);
    assert_string_equal(c.hf_token, "hf_from_file");
    assert_string_equal(c.import_hf_endpoint, "http://mirror:8080/");
    assert_true(c.import_hf_redirect_private);
    char *envp[] = {"HF_TOKEN=hf_from_env", "HF_ENDPOINT=https://hf-mirror.example", NULL};
    assert_int_equal(tv__config_load(&c, 7, argv2, envp, &act, &err), 0);
    assert_string_equal(c.hf_token, "hf_from_env");
    assert_string_equal(c.import_hf_endpoint, "https://hf-mirror.example");
    /* a token file that cannot be read, or holds nothing, stops the daemon */
    char *argv3[] = {"tensorvaultd", "--set", "import.hf_token_file=/nonexistent/hf.token", NULL};
    assert_int_equal(tv__config_load(&c, 3, argv3, none, &act, &err), -ENOENT);
    assert_non_null(strstr(err.msg, "import.hf_token_file"));
    const char *empty = write_ini("hf.empty", "\n");
    snprintf(set, sizeof set, "import.hf_token_file=%s", empty);
    char *argv4[] = {"tensorvaultd", "--set", set, NULL};
    assert_int_equal(tv__config_load(&c, 3, argv4, none, &act, &err), TV_E_INVALID_ARG);
    assert_non_null(strstr(err.msg, "holds no token"));
    char *argv5[] = {"tensorvaultd", "--set", "import.hf_endpoint=ftp://x", NULL};
    assert_int_equal(tv__config_load(&c, 3, argv5, none, &act, &err), TV_E_INVALID_ARG);
    assert_non_null(strstr(err.msg, "import.hf_endpoint"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_file_sets_every_kind),
        cmocka_unit_test(test_fastpath_and_access),
        cmocka_unit_test(test_precedence_file_env_flags),
        cmocka_unit_test(test_bad_value_names_file_line_and_key),
        cmocka_unit_test(test_bad_values_each_kind),
        cmocka_unit_test(test_env_bad_value_names_variable),
        cmocka_unit_test(test_env_access_model_case),
        cmocka_unit_test(test_flags),
        cmocka_unit_test(test_fleet_keys),
        cmocka_unit_test(test_s3_keys_and_aws_env),
        cmocka_unit_test(test_admin_token_file),
        cmocka_unit_test(test_hf_keys_and_env),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
