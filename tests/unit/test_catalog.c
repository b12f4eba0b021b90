/* Unit tests of the fleet catalog (server/fleet/catalog.c). Without
 * PostgreSQL: the embedded migration list (numbers 1..n in name order, the
 * schema's tables), conninfo redaction (never the password), and a refused
 * connection failing with a message naming host and database but not the
 * password. With TV_TEST_PG_DSN (tests/fleet/test_catalog.py sets it to a
 * fresh database): migrations once under concurrency, publishing (new,
 * idempotent, conflicting), alias compare-and-set with two concurrent
 * setters (one wins, one TV_E_CONFLICT) and a listener receiving the
 * NOTIFY. Those tests print "pg: ran" so the pytest knows they ran; without
 * the variable they are skipped with the reason. */
#include <errno.h>
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <pthread.h>

#include "fleet/catalog.h"
#include "tensorvault/checkpoint.h"
#include "util/internal.h"

static const char *pg_dsn(void)
{
    const char *d = getenv("TV_TEST_PG_DSN");
    if (!d || !d[0]) {
        print_message("skipped: TV_TEST_PG_DSN is not set (tests/fleet/test_catalog.py runs this "
                      "test against a PostgreSQL of its own)\n");
        return NULL;
    }
    return d;
}

static void test_migration_list(void **state)
{
    (void)state;
    assert_true(tv__fleet_n_migrations >= 1);
    for (size_t i = 0; i < tv__fleet_n_migrations; i++) {
        const tv__migration *m = &tv__fleet_migrations[i];
        assert_int_equal(m->number, (int)i + 1);
        char prefix[8];
        snprintf(prefix, sizeof prefix, "%04d_", m->number);
        assert_memory_equal(m->name, prefix, 5);
        assert_non_null(m->sql);
        assert_true(strlen(m->sql) > 0);
        if (i)
            assert_true(strcmp(tv__fleet_migrations[i - 1].name, m->name) < 0);
    }
    const char *s = tv__fleet_migrations[0].sql;
    const char *tables[] = {"CREATE TABLE nodes",       "CREATE TABLE models",
                            "CREATE TABLE generations", "CREATE TABLE shards",
                            "CREATE TABLE tensors",     "CREATE TABLE aliases"};
    for (size_t i = 0; i < TV_ARRAY_LEN(tables); i++)
        assert_non_null(strstr(s, tables[i]));
    /* The registry's own list is a different one. */
    assert_ptr_not_equal(tv__fleet_migrations, tv__migrations);
}

static void test_redact(void **state)
{
    (void)state;
    char out[256];
    tv__catalog_redact("postgresql://tv:s3cr%21t@db.example:5433/cat?sslmode=require", out,
                       sizeof out);
    assert_string_equal(out, "host=db.example port=5433 dbname=cat user=tv");
    assert_null(strstr(out, "s3cr"));
    tv__catalog_redact("host=h1 dbname=d password=hunter2 user=u", out, sizeof out);
    assert_string_equal(out, "host=h1 dbname=d user=u");
    tv__catalog_redact("host='unterminated", out, sizeof out);
    assert_string_equal(out, "(unparsable conninfo)");
    tv__catalog_redact("", out, sizeof out);
    assert_true(strcmp(out, "(libpq defaults)") == 0 || strncmp(out, "host=", 5) == 0 ||
                strncmp(out, "user=", 5) == 0 || strncmp(out, "dbname=", 7) == 0);
    /* cut, never overrun, never the password */
    char small[12];
    tv__catalog_redact("host=averyveryverylonghost password=pw", small, sizeof small);
    assert_true(strlen(small) < sizeof small);
    assert_null(strstr(small, "pw"));
}

static void test_open_refused(void **state)
{
    (void)state;
    tv__catalog *cat = (tv__catalog *)1;
    tv_error err = {0};
    /* port 1 on loopback: refused at once */
    int rc = tv__catalog_open("postgresql://u:topsecret@127.0.0.1:1/catdb?connect_timeout=2", &cat,
                              &err);
    assert_int_equal(rc, -ECONNREFUSED);
    assert_null(cat);
    assert_non_null(strstr(err.msg, "127.0.0.1"));
    assert_non_null(strstr(err.msg, "catdb"));
    assert_null(strstr(err.msg, "topsecret"));
    assert_int_equal(tv__catalog_open("", &cat, &err), TV_E_INVALID_ARG);
    assert_int_equal(tv__catalog_open("host='x", &cat, &err), TV_E_INVALID_ARG);
    /* An unparsable conninfo: libpq's reason quotes the offending token,
     * which may be the password (a bare '%' in a URI's password, an
     * unquoted space in a keyword one): the message never carries it. */
    const char *bad[] = {"postgresql://u:hunter%zz2@127.0.0.1:1/catdb",
                         "postgresql://u:hunter%002@127.0.0.1:1/catdb",
                         "host=127.0.0.1 password=hunter two dbname=catdb"};
    for (size_t i = 0; i < TV_ARRAY_LEN(bad); i++) {
        err = (tv_error){0};
        assert_int_equal(tv__catalog_open(bad[i], &cat, &err), TV_E_INVALID_ARG);
        assert_null(cat);
        assert_non_null(strstr(err.msg, "fleet.postgres"));
        assert_null(strstr(err.msg, "hunter"));
        assert_null(strstr(err.msg, "two"));
    }
    tv__catalog_close(NULL);
}

/* ---- with PostgreSQL --------------------------------------------------- */

typedef struct opener {
    const char *dsn;
    tv__catalog *cat;
    int rc;
    tv_error err;
} opener;

static void *open_thread(void *p)
{
    opener *o = p;
    o->rc = tv__catalog_open(o->dsn, &o->cat, &o->err);
    return NULL;
}

/* A manifest of nt tensors over 2 shards; shard 1's hash from salt. */
typedef struct fake {
    tv__reg_manifest m;
    tv__reg_shard shards[2];
    tv__reg_tensor *t;
} fake;

static void fake_init(fake *f, const char *model, int64_t number, size_t nt, char salt)
{
    memset(f, 0, sizeof(*f));
    f->m.generation.number = number;
    f->m.generation.state = TV__GEN_READY;
    snprintf(f->m.generation.model, sizeof f->m.generation.model, "%s", model);
    snprintf(f->m.generation.source, sizeof f->m.generation.source, "/src/%s", model);
    f->m.generation.total_bytes = 12345;
    for (int i = 0; i < 2; i++) {
        tv__reg_shard *s = &f->shards[i];
        s->idx = (uint32_t)i;
        s->name = i ? "model-00002-of-00002.safetensors" : "model-00001-of-00002.safetensors";
        s->file_len = 6000 + (uint64_t)i;
        s->header_len = 200;
        memset(s->sha256, i ? salt : 'a', 64);
        memset(s->header_sha256, 'c', 64);
    }
    f->m.shards = f->shards;
    f->m.n_shards = 2;
    f->t = calloc(nt, sizeof(*f->t));
    assert_non_null(f->t);
    for (size_t i = 0; i < nt; i++) {
        char *name = malloc(48);
        assert_non_null(name);
        /* a tab and a backslash in one name: COPY escaping */
        snprintf(name, 48, i == 1 ? "odd\tname\\%zu" : "layer.%zu.weight", i);
        f->t[i].name = name;
        f->t[i].name_len = strlen(name);
        f->t[i].dtype = TV_DTYPE_F16;
        f->t[i].rank = i == 0 ? 0 : 2;
        f->t[i].shape[0] = 4;
        f->t[i].shape[1] = i;
        f->t[i].shard_idx = (uint32_t)(i % 2);
        f->t[i].begin_off = 8 * i;
        f->t[i].end_off = 8 * i + 8;
    }
    f->m.tensors = f->t;
    f->m.n_tensors = nt;
}

static void fake_free(fake *f)
{
    for (size_t i = 0; i < f->m.n_tensors; i++)
        free((char *)f->t[i].name);
    free(f->t);
}

static void test_pg_migrate_once(void **state)
{
    (void)state;
    const char *dsn = pg_dsn();
    if (!dsn)
        skip();
    opener o[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        o[i] = (opener){.dsn = dsn};
        assert_int_equal(pthread_create(&th[i], NULL, open_thread, &o[i]), 0);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < 4; i++) {
        if (o[i].rc)
            fail_msg("open %d: %s", i, o[i].err.msg);
        int v = 0;
        tv_error err = {0};
        assert_int_equal(tv__catalog_version(o[i].cat, &v, &err), 0);
        assert_int_equal(v, (int)tv__fleet_n_migrations);
        tv__catalog_close(o[i].cat);
    }
    print_message("pg: ran migrate_once\n");
}

static void test_pg_publish(void **state)
{
    (void)state;
    const char *dsn = pg_dsn();
    if (!dsn)
        skip();
    tv__catalog *cat = NULL;
    tv_error err = {0};
    if (tv__catalog_open(dsn, &cat, &err))
        fail_msg("%s", err.msg);
    fake f;
    fake_init(&f, "unit-pub", 1, 120000, 'b');
    int published = -1;
    if (tv__catalog_publish_generation(cat, "unit-node", &f.m, &published, &err))
        fail_msg("%s", err.msg);
    assert_int_equal(published, 1);
    /* again, same content: a no-op */
    assert_int_equal(tv__catalog_publish_generation(cat, "unit-node", &f.m, &published, &err), 0);
    assert_int_equal(published, 0);
    /* other content under the same number: a conflict naming both hashes */
    fake g;
    fake_init(&g, "unit-pub", 1, 10, 'e');
    assert_int_equal(tv__catalog_publish_generation(cat, "unit-node", &g.m, &published, &err),
                     TV_E_CONFLICT);
    assert_non_null(strstr(err.msg, "bbbbbbbbbbbbbbbb"));
    assert_non_null(strstr(err.msg, "eeeeeeeeeeeeeeee"));
    /* not ready: refused */
    g.m.generation.state = TV__GEN_IMPORTING;
    assert_int_equal(tv__catalog_publish_generation(cat, "unit-node", &g.m, NULL, &err),
                     TV_E_STATE);
    fake_free(&g);
    fake_free(&f);
    tv__catalog_close(cat);
    print_message("pg: ran publish\n");
}

typedef struct setter {
    const char *dsn;
    pthread_barrier_t *bar;
    int64_t expect, now;
    int rc;
    tv_error err;
} setter;

static void *set_thread(void *p)
{
    setter *s = p;
    tv__catalog *cat = NULL;
    s->rc = tv__catalog_open(s->dsn, &cat, &s->err);
    pthread_barrier_wait(s->bar);
    if (s->rc == 0) {
        const char *place[] = {"node-a", "node \"b\"", NULL};
        s->rc =
            tv__catalog_set_alias(cat, "unit-alias", "prod", 1, place, s->expect, &s->now, &s->err);
    }
    tv__catalog_close(cat);
    return NULL;
}

static void test_pg_alias_cas_notify(void **state)
{
    (void)state;
    const char *dsn = pg_dsn();
    if (!dsn)
        skip();
    tv__catalog *cat = NULL, *lis = NULL;
    tv_error err = {0};
    if (tv__catalog_open(dsn, &cat, &err) || tv__catalog_open(dsn, &lis, &err))
        fail_msg("%s", err.msg);
    fake f;
    fake_init(&f, "unit-alias", 1, 4, 'b');
    if (tv__catalog_publish_generation(cat, "unit-node", &f.m, NULL, &err))
        fail_msg("%s", err.msg);
    fake_free(&f);
    if (tv__catalog_listen(lis, &err))
        fail_msg("%s", err.msg);
    char payload[512];
    /* drain the generation's own notification, if any */
    while (tv__catalog_wait(lis, 200, payload, sizeof payload, &err) == 1)
        ;
    /* an unknown generation */
    assert_int_equal(tv__catalog_set_alias(cat, "unit-alias", "prod", 99, NULL, 0, NULL, &err),
                     TV_E_NOT_FOUND);
    int64_t v = 0;
    if (tv__catalog_set_alias(cat, "unit-alias", "prod", 1, NULL, 0, &v, &err))
        fail_msg("%s", err.msg);
    assert_int_equal(v, 1);
    assert_int_equal(tv__catalog_wait(lis, 5000, payload, sizeof payload, &err), 1);
    assert_non_null(strstr(payload, "\"kind\":\"alias\""));
    assert_non_null(strstr(payload, "\"alias\":\"prod\""));
    assert_non_null(strstr(payload, "\"version\":1"));
    /* a stale version */
    assert_int_equal(tv__catalog_set_alias(cat, "unit-alias", "prod", 1, NULL, 0, NULL, &err),
                     TV_E_CONFLICT);
    /* two setters at once, both expecting version 1: one wins */
    for (int round = 0; round < 5; round++) {
        pthread_barrier_t bar;
        pthread_barrier_init(&bar, NULL, 2);
        setter s[2] = {{.dsn = dsn, .bar = &bar, .expect = v},
                       {.dsn = dsn, .bar = &bar, .expect = v}};
        pthread_t th[2];
        for (int i = 0; i < 2; i++)
            assert_int_equal(pthread_create(&th[i], NULL, set_thread, &s[i]), 0);
        for (int i = 0; i < 2; i++)
            pthread_join(th[i], NULL);
        pthread_barrier_destroy(&bar);
        int wins = (s[0].rc == 0) + (s[1].rc == 0);
        int conflicts = (s[0].rc == TV_E_CONFLICT) + (s[1].rc == TV_E_CONFLICT);
        if (wins != 1 || conflicts != 1)
            fail_msg("round %d: rc %d (%s) and %d (%s)", round, s[0].rc, s[0].err.msg, s[1].rc,
                     s[1].err.msg);
        int64_t now = s[0].rc == 0 ? s[0].now : s[1].now;
        assert_int_equal(now, v + 1);
        v = now;
        assert_int_equal(tv__catalog_wait(lis, 5000, payload, sizeof payload, &err), 1);
        char want[64];
        snprintf(want, sizeof want, "\"version\":%" PRId64, v);
        assert_non_null(strstr(payload, want));
        assert_int_equal(tv__catalog_wait(lis, 100, payload, sizeof payload, &err), 0);
    }
    tv__catalog_close(lis);
    tv__catalog_close(cat);
    print_message("pg: ran alias_cas_notify\n");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_migration_list), cmocka_unit_test(test_redact),
        cmocka_unit_test(test_open_refused),   cmocka_unit_test(test_pg_migrate_once),
        cmocka_unit_test(test_pg_publish),     cmocka_unit_test(test_pg_alias_cas_notify),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
