/* The fleet catalog on PostgreSQL (catalog.h). Every public call runs its
 * work once and, when that failed because the connection dropped (PQstatus
 * CONNECTION_BAD), resets the connection and runs it once more. */
#include "fleet/catalog.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <libpq-fe.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/internal.h"

struct tv__catalog {
    PGconn *conn;
    char *conninfo;
    char where[320]; /* "host=H port=P dbname=D user=U": for messages */
    bool listening;
};

/* ---- redaction --------------------------------------------------------- */

void tv__catalog_redact(const char *conninfo, char *out, size_t len)
{
    if (!out || len == 0)
        return;
    out[0] = '\0';
    char *perr = NULL;
    PQconninfoOption *opts = conninfo ? PQconninfoParse(conninfo, &perr) : NULL;
    if (!opts) {
        PQfreemem(perr);
        snprintf(out, len, "(unparsable conninfo)");
        return;
    }
    static const char *const shown[] = {"host", "hostaddr", "port", "dbname", "user"};
    size_t used = 0;
    for (size_t s = 0; s < TV_ARRAY_LEN(shown); s++)
        for (PQconninfoOption *o = opts; o->keyword; o++) {
            if (strcmp(o->keyword, shown[s]) != 0 || !o->val || !o->val[0])
                continue;
            int n =
                snprintf(out + used, len - used, "%s%s=%s", used ? " " : "", o->keyword, o->val);
            if (n < 0 || (size_t)n >= len - used) {
                out[used] = '\0';
                PQconninfoFree(opts);
                return;
            }
            used += (size_t)n;
        }
    if (!used)
        snprintf(out, len, "(libpq defaults)");
    PQconninfoFree(opts);
}

/* libpq's multi-line messages as one line. */
static void one_line(const char *in, char *out, size_t len)
{
    size_t j = 0;
    for (size_t i = 0; in && in[i] && j + 1 < len; i++) {
        char ch = in[i];
        if (ch == '\n' || ch == '\r') {
            if (in[i + 1] && j + 2 < len) {
                out[j++] = ';';
                out[j++] = ' ';
            }
            continue;
        }
        out[j++] = ch;
    }
    out[j] = '\0';
    while (j > 0 && (out[j - 1] == ' ' || out[j - 1] == ';'))
        out[--j] = '\0';
}

/* libpq's reason for an unparsable conninfo, without what it quotes: it
 * quotes the offending token, which may be (part of) the password. */
static void parse_reason(const char *in, char *out, size_t len)
{
    char line[400];
    one_line(in, line, sizeof line);
    size_t j = 0;
    bool quoted = false;
    for (size_t i = 0; line[i] && j + 1 < len; i++) {
        if (line[i] == '"') {
            quoted = !quoted;
            if (quoted && j + 5 < len) {
                memcpy(out + j, "\"...\"", 5);
                j += 5;
            }
            continue;
        }
        if (!quoted)
            out[j++] = line[i];
    }
    out[j] = '\0';
}

static int conn_err(tv__catalog *cat, tv_error *err, const char *what)
{
    char msg[400];
    one_line(PQerrorMessage(cat->conn), msg, sizeof msg);
    return tv__seterr(err, -ECONNREFUSED, "fleet catalog (%s): %s: %s", cat->where, what,
                      msg[0] ? msg : "connection failed");
}

/* ---- statements -------------------------------------------------------- */

static bool dropped(const tv__catalog *cat)
{
    return !cat->conn || PQstatus(cat->conn) != CONNECTION_OK;
}

/* A result that failed: TV_E_CONFLICT for a unique violation (another
 * writer won), -ECONNREFUSED for a dropped connection, else TV_E_REGISTRY. */
static int res_err(tv__catalog *cat, PGresult *res, const char *what, tv_error *err)
{
    if (dropped(cat))
        return conn_err(cat, err, what);
    const char *state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
    char msg[400];
    one_line(res ? PQresultErrorMessage(res) : PQerrorMessage(cat->conn), msg, sizeof msg);
    /* unique_violation: a conflict; lock_not_available and query_canceled
     * (a brief connection's lock_timeout, statement_timeout): busy, try again */
    int code = !state                                                       ? TV_E_REGISTRY
               : strcmp(state, "23505") == 0                                ? TV_E_CONFLICT
               : strcmp(state, "55P03") == 0 || strcmp(state, "57014") == 0 ? TV_E_BUSY
                                                                            : TV_E_REGISTRY;
    return tv__seterr(err, code, "fleet catalog (%s): %s: %s", cat->where, what, msg);
}

/* Runs sql with text parameters (n may be 0; NULL values are SQL NULL).
 * *out (may be NULL) receives the result to PQclear. */
static int q(tv__catalog *cat, const char *sql, int n, const char *const *params, PGresult **out,
             const char *what, tv_error *err)
{
    if (out)
        *out = NULL;
    PGresult *res =
        n ? PQexecParams(cat->conn, sql, n, NULL, params, NULL, NULL, 0) : PQexec(cat->conn, sql);
    ExecStatusType s = res ? PQresultStatus(res) : PGRES_FATAL_ERROR;
    if (s != PGRES_COMMAND_OK && s != PGRES_TUPLES_OK) {
        int rc = res_err(cat, res, what, err);
        PQclear(res);
        return rc;
    }
    if (out)
        *out = res;
    else
        PQclear(res);
    return 0;
}

static void rollback(tv__catalog *cat)
{
    if (!dropped(cat) && PQtransactionStatus(cat->conn) != PQTRANS_IDLE)
        PQclear(PQexec(cat->conn, "ROLLBACK"));
}

/* Reconnects a dropped connection (and LISTENs again). */
static int reconnect(tv__catalog *cat, tv_error *err)
{
    PQreset(cat->conn);
    if (PQstatus(cat->conn) != CONNECTION_OK)
        return conn_err(cat, err, "reconnecting");
    tv__log(TV_LOG_INFO, "fleet catalog (%s): reconnected", cat->where);
    if (cat->listening)
        return q(cat, "LISTEN " TV__CATALOG_CHANNEL, 0, NULL, NULL, "LISTEN", err);
    return 0;
}

typedef int (*op_fn)(tv__catalog *cat, void *ctx, tv_error *err);

/* fn once; once more after a reconnect when the connection had dropped. */
static int with_retry(tv__catalog *cat, op_fn fn, void *ctx, tv_error *err)
{
    if (!cat)
        return tv__seterr(err, TV_E_INVALID_ARG, "fleet catalog: NULL handle");
    int rc;
    if (dropped(cat) && (rc = reconnect(cat, err)))
        return rc;
    rc = fn(cat, ctx, err);
    if (rc == 0 || !dropped(cat))
        return rc;
    tv_error first = err ? *err : (tv_error){0}, again = {0};
    if ((rc = reconnect(cat, &again)))
        return tv__seterr(err, rc, "%s (then %s)", first.msg, again.msg);
    return fn(cat, ctx, err);
}

/* ---- migrations -------------------------------------------------------- */

static int read_version(tv__catalog *cat, int *version, tv_error *err)
{
    PGresult *res = NULL;
    int rc = q(cat, "SELECT version FROM tv_schema", 0, NULL, &res, "reading tv_schema", err);
    if (rc)
        return rc;
    if (PQntuples(res) == 0) {
        PQclear(res);
        *version = 0;
        return q(cat, "INSERT INTO tv_schema (version) VALUES (0)", 0, NULL, NULL,
                 "creating tv_schema", err);
    }
    *version = atoi(PQgetvalue(res, 0, 0));
    PQclear(res);
    return 0;
}

static int too_new(tv__catalog *cat, int version, tv_error *err)
{
    return tv__seterr(
        err, TV_E_REGISTRY_TOO_NEW,
        "fleet catalog (%s): schema version %d is newer than this tensorvault supports (%zu); upgrade tensorvault",
        cat->where, version, tv__fleet_n_migrations);
}

static int migrate(tv__catalog *cat, void *ctx, tv_error *err)
{
    (void)ctx;
    int rc;
    for (;;) {
        char lock[128];
        snprintf(lock, sizeof lock,
                 "BEGIN; SELECT pg_advisory_xact_lock(%" PRId64
                 "); CREATE TABLE IF NOT EXISTS tv_schema (version int NOT NULL)",
                 TV__CATALOG_LOCK);
        if ((rc = q(cat, lock, 0, NULL, NULL, "locking for migrations", err)))
            goto fail;
        int version = 0;
        if ((rc = read_version(cat, &version, err)))
            goto fail;
        if (version < 0 || (size_t)version > tv__fleet_n_migrations) {
            rc = version < 0 ? tv__seterr(err, TV_E_REGISTRY,
                                          "fleet catalog (%s): tv_schema.version is %d (corrupt)",
                                          cat->where, version)
                             : too_new(cat, version, err);
            goto fail;
        }
        if ((size_t)version == tv__fleet_n_migrations)
            return q(cat, "COMMIT", 0, NULL, NULL, "committing", err);
        const tv__migration *m = &tv__fleet_migrations[version];
        char what[160], set[64];
        snprintf(what, sizeof what, "migration fleet/%s", m->name);
        snprintf(set, sizeof set, "UPDATE tv_schema SET version = %d", m->number);
        if ((rc = q(cat, m->sql, 0, NULL, NULL, what, err)) ||
            (rc = q(cat, set, 0, NULL, NULL, what, err)) ||
            (rc = q(cat, "COMMIT", 0, NULL, NULL, what, err)))
            goto fail;
        tv__log(TV_LOG_INFO, "fleet catalog (%s): applied migration fleet/%s", cat->where, m->name);
    }
fail:
    rollback(cat);
    return rc;
}

int tv__catalog_version(tv__catalog *cat, int *version, tv_error *err)
{
    if (!cat || !version)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__catalog_version: NULL argument");
    PGresult *res = NULL;
    int rc = q(cat, "SELECT coalesce(max(version), 0) FROM tv_schema", 0, NULL, &res,
               "reading tv_schema", err);
    if (rc)
        return rc;
    *version = atoi(PQgetvalue(res, 0, 0));
    PQclear(res);
    return 0;
}

/* ---- open / close ------------------------------------------------------ */

/* A connection that only serves requests: the schema must be there (the
 * fleet thread migrates it); statements give up instead of waiting. */
static int check_schema(tv__catalog *cat, void *ctx, tv_error *err)
{
    (void)ctx;
    int version = 0;
    int rc = tv__catalog_version(cat, &version, err);
    if (rc)
        return rc;
    if ((size_t)version < tv__fleet_n_migrations)
        return tv__seterr(
            err, TV_E_BUSY,
            "fleet catalog (%s): schema version %d, this daemon needs %zu (the fleet thread migrates it: try again)",
            cat->where, version, tv__fleet_n_migrations);
    if ((size_t)version > tv__fleet_n_migrations)
        return too_new(cat, version, err);
    return 0;
}

int tv__catalog_open(const char *conninfo, tv__catalog **out, tv_error *err)
{
    return tv__catalog_open_ex(conninfo, 0, out, err);
}

int tv__catalog_open_ex(const char *conninfo, unsigned flags, tv__catalog **out, tv_error *err)
{
    if (!out)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__catalog_open: NULL argument");
    *out = NULL;
    if (!conninfo || !conninfo[0])
        return tv__seterr(err, TV_E_INVALID_ARG, "fleet.postgres is empty");
    char *perr = NULL;
    PQconninfoOption *opts = PQconninfoParse(conninfo, &perr);
    if (!opts) {
        char msg[300];
        parse_reason(perr, msg, sizeof msg);
        PQfreemem(perr);
        return tv__seterr(err, TV_E_INVALID_ARG, "fleet.postgres is not a libpq conninfo: %s", msg);
    }
    PQconninfoFree(opts);
    tv__catalog *cat = calloc(1, sizeof(*cat));
    if (!cat || !(cat->conninfo = strdup(conninfo))) {
        free(cat);
        return tv__seterr(err, -ENOMEM, "fleet catalog: out of memory");
    }
    tv__catalog_redact(conninfo, cat->where, sizeof cat->where);
    /* connect_timeout first: a value in conninfo (expanded at dbname) wins.
     * client_encoding last, so it always wins: the registry's names are
     * UTF-8, and libpq's default is the database's encoding (a LATIN1
     * catalog stored them as mojibake). keepalives and tcp_user_timeout
     * (defaults the conninfo may override): a server lost without a reset
     * (a network gone) fails the call blocked on it within about 30 s, not
     * the system's 2 h. */
    bool brief = flags & TV__CATALOG_BRIEF;
    /* a brief connection's timeouts are connection options, so a reconnect
     * (PQreset) keeps them */
    const char *const keys[] = {"connect_timeout",
                                "application_name",
                                "keepalives",
                                "keepalives_idle",
                                "keepalives_interval",
                                "keepalives_count",
                                "tcp_user_timeout",
                                "options",
                                "dbname",
                                "client_encoding",
                                NULL};
    const char *const vals[] = {brief ? "2" : "5",
                                brief ? "tensorvaultd (alias moves)" : "tensorvaultd",
                                "1",
                                "10",
                                "5",
                                "3",
                                "30000",
                                brief ? "-c lock_timeout=1000 -c statement_timeout=3000" : "",
                                conninfo,
                                "UTF8",
                                NULL};
    cat->conn = PQconnectdbParams(keys, vals, 1);
    int rc;
    if (!cat->conn) {
        rc = tv__seterr(err, -ENOMEM, "fleet catalog: out of memory");
        goto fail;
    }
    if (PQstatus(cat->conn) != CONNECTION_OK) {
        rc = conn_err(cat, err, "cannot connect");
        goto fail;
    }
    PQclear(PQexec(cat->conn, "SET client_min_messages = warning"));
    if ((rc = with_retry(cat, brief ? check_schema : migrate, NULL, err)))
        goto fail;
    *out = cat;
    return 0;
fail:
    tv__catalog_close(cat);
    return rc;
}

void tv__catalog_close(tv__catalog *cat)
{
    if (!cat)
        return;
    if (cat->conn)
        PQfinish(cat->conn);
    free(cat->conninfo);
    free(cat);
}

/* ---- nodes ------------------------------------------------------------- */

typedef struct node_ctx {
    const char *node, *url;
    char down_s[16];
} node_ctx;

static int node_seen(tv__catalog *cat, void *p, tv_error *err)
{
    node_ctx *c = p;
    const char *params[] = {c->node, c->url ? c->url : "", c->down_s};
    PGresult *res = NULL;
    /* A name another daemon (another URL) used in the last node_down_s
     * seconds is that daemon's: two nodes under one name would overwrite
     * each other's reports. */
    int rc = q(cat,
               "WITH up AS (INSERT INTO nodes (name, url, last_seen, state) "
               "VALUES ($1, $2, now(), 'up') ON CONFLICT (name) DO UPDATE SET url = excluded.url, "
               "last_seen = now(), state = 'up' WHERE nodes.url = excluded.url OR nodes.url = '' "
               "OR nodes.last_seen < now() - make_interval(secs => $3::int) RETURNING 1) "
               "SELECT (SELECT count(*) FROM up), n.url, "
               "extract(epoch FROM now() - n.last_seen)::bigint FROM (SELECT 1) AS one "
               "LEFT JOIN nodes n ON n.name = $1",
               3, params, &res, "registering the node", err);
    if (rc)
        return rc;
    if (PQntuples(res) == 1 && strcmp(PQgetvalue(res, 0, 0), "0") == 0)
        rc = tv__seterr(
            err, TV_E_CONFLICT,
            "fleet node name '%s' is in use by %s (seen %s s ago): give every node its own fleet.node",
            c->node, PQgetvalue(res, 0, 1), PQgetvalue(res, 0, 2));
    PQclear(res);
    return rc;
}

int tv__catalog_node_seen(tv__catalog *cat, const char *node, const char *url, unsigned down_s,
                          tv_error *err)
{
    if (!node || !node[0])
        return tv__seterr(err, TV_E_INVALID_ARG, "fleet catalog: empty node name");
    node_ctx c = {.node = node, .url = url};
    snprintf(c.down_s, sizeof c.down_s, "%u", down_s ? down_s : 30);
    return with_retry(cat, node_seen, &c, err);
}

/* ---- publishing -------------------------------------------------------- */

/* A growable COPY buffer flushed to the connection in 256 KiB pieces. */
typedef struct copybuf {
    tv__catalog *cat;
    char *p;
    size_t len, cap;
    bool failed;
} copybuf;

static void cb_put(copybuf *b, const char *s, size_t n)
{
    if (b->failed)
        return;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 1u << 18;
        while (cap < b->len + n)
            cap *= 2;
        char *np = realloc(b->p, cap);
        if (!np) {
            b->failed = true;
            return;
        }
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
}

static void cb_flush(copybuf *b, bool force)
{
    if (b->failed || b->len == 0 || (!force && b->len < (1u << 18)))
        return;
    if (b->len > INT32_MAX || PQputCopyData(b->cat->conn, b->p, (int)b->len) != 1)
        b->failed = true;
    b->len = 0;
}

/* COPY text format: backslash, tab, newline and carriage return escaped. */
static void cb_text(copybuf *b, const char *s, size_t n)
{
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        const char *esc = s[i] == '\\'   ? "\\\\"
                          : s[i] == '\t' ? "\\t"
                          : s[i] == '\n' ? "\\n"
                          : s[i] == '\r' ? "\\r"
                                         : NULL;
        if (!esc)
            continue;
        cb_put(b, s + run, i - run);
        cb_put(b, esc, 2);
        run = i + 1;
    }
    cb_put(b, s + run, n - run);
}

static void cb_fmt(copybuf *b, const char *fmt, uint64_t v)
{
    char num[32];
    int n = snprintf(num, sizeof num, fmt, v);
    cb_put(b, num, (size_t)n);
}

typedef struct pub_ctx {
    const char *node;
    const tv__reg_manifest *m;
    const tv__reg_file *files;
    size_t n_files;
    int published;
} pub_ctx;

/* Inside the publish transaction: the generation's sidecar files, each
 * once (a path recorded already is left as it is). */
static int publish_files(tv__catalog *cat, const pub_ctx *c, const char *num, tv_error *err)
{
    int rc = 0;
    for (size_t i = 0; !rc && i < c->n_files; i++) {
        const tv__reg_file *fl = &c->files[i];
        char len[32];
        snprintf(len, sizeof len, "%" PRIu64, fl->len);
        const char *fp[] = {c->m->generation.model, num, fl->path, len, fl->sha256};
        rc = q(cat,
               "INSERT INTO generation_files (model, number, path, len, sha256) "
               "VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
               5, fp, NULL, "adding a sidecar file", err);
    }
    return rc;
}

/* The generation is there: same shard hashes = no-op, else a conflict. */
static int compare_existing(tv__catalog *cat, const tv__reg_manifest *m, PGresult *res,
                            tv_error *err)
{
    const tv__reg_generation *g = &m->generation;
    int n = PQntuples(res);
    for (size_t i = 0; i < m->n_shards || i < (size_t)n; i++) {
        const char *there = i < (size_t)n ? PQgetvalue(res, (int)i, 1) : "(none)";
        const char *here = i < m->n_shards ? m->shards[i].sha256 : "(none)";
        if (strcmp(there, here) != 0)
            return tv__seterr(
                err, TV_E_CONFLICT,
                "fleet catalog (%s): model '%s' generation %" PRId64
                " is already published with other content: shard %zu has sha256 %s in the catalog, %s here",
                cat->where, g->model, g->number, i, there, here);
    }
    return 0;
}

static int publish(tv__catalog *cat, void *p, tv_error *err)
{
    pub_ctx *c = p;
    const tv__reg_manifest *m = c->m;
    const tv__reg_generation *g = &m->generation;
    char num[32], total[32], nsh[32], nten[32];
    snprintf(num, sizeof num, "%" PRId64, g->number);
    snprintf(total, sizeof total, "%" PRIu64, g->total_bytes);
    snprintf(nsh, sizeof nsh, "%zu", m->n_shards);
    snprintf(nten, sizeof nten, "%zu", m->n_tensors);
    PGresult *res = NULL;
    copybuf b = {.cat = cat};
    c->published = 0;
    const char *key[] = {g->model, num};
    int rc = q(cat, "BEGIN", 0, NULL, NULL, "BEGIN", err);
    if (rc)
        return rc;
    /* Two nodes publishing the same (model, number) at once: one at a time. */
    if ((rc = q(cat, "SELECT pg_advisory_xact_lock(hashtextextended($1 || '/' || $2, 0))", 2, key,
                NULL, "locking the generation", err)))
        goto fail;
    if ((rc = q(cat,
                "SELECT s.idx, s.sha256 FROM generations g LEFT JOIN shards s "
                "ON s.model = g.model AND s.number = g.number "
                "WHERE g.model = $1 AND g.number = $2 ORDER BY s.idx",
                2, key, &res, "reading the published generation", err)))
        goto fail;
    if (PQntuples(res) > 0) {
        rc = compare_existing(cat, m, res, err);
        PQclear(res);
        res = NULL;
        if (rc || (rc = publish_files(cat, c, num, err)))
            goto fail;
        return q(cat, "COMMIT", 0, NULL, NULL, "COMMIT", err);
    }
    PQclear(res);
    res = NULL;
    const char *node[] = {c->node};
    const char *model[] = {g->model};
    const char *gen[] = {g->model, num,    tv__gen_state_name(g->state), total, g->source, nsh,
                         nten,     c->node};
    if ((rc = q(cat, "INSERT INTO nodes (name) VALUES ($1) ON CONFLICT DO NOTHING", 1, node, NULL,
                "registering the node", err)) ||
        (rc = q(cat, "INSERT INTO models (name) VALUES ($1) ON CONFLICT DO NOTHING", 1, model, NULL,
                "adding the model", err)) ||
        (rc = q(cat,
                "INSERT INTO generations (model, number, state, total_bytes, source, n_shards, "
                "n_tensors, published_by) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
                8, gen, NULL, "adding the generation", err)))
        goto fail;
    for (size_t i = 0; i < m->n_shards; i++) {
        const tv__reg_shard *s = &m->shards[i];
        char idx[16], fb[32], hb[32];
        snprintf(idx, sizeof idx, "%" PRIu32, s->idx);
        snprintf(fb, sizeof fb, "%" PRIu64, s->file_len);
        snprintf(hb, sizeof hb, "%" PRIu64, s->header_len);
        const char *sp[] = {g->model, num, idx, s->name, s->sha256, s->header_sha256, fb, hb};
        if ((rc = q(cat,
                    "INSERT INTO shards (model, number, idx, name, sha256, header_sha256, "
                    "file_bytes, header_bytes) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
                    8, sp, NULL, "adding a shard", err)))
            goto fail;
    }
    res = PQexec(cat->conn, "COPY tensors (model, number, name, dtype, shape, shard, \"begin\", "
                            "\"end\") FROM STDIN");
    if (!res || PQresultStatus(res) != PGRES_COPY_IN) {
        rc = res_err(cat, res, "starting COPY tensors", err);
        goto fail;
    }
    PQclear(res);
    res = NULL;
    for (size_t i = 0; i < m->n_tensors && !b.failed; i++) {
        const tv__reg_tensor *t = &m->tensors[i];
        cb_text(&b, g->model, strlen(g->model));
        cb_fmt(&b, "\t%" PRIu64 "\t", (uint64_t)g->number);
        cb_text(&b, t->name, t->name_len);
        cb_put(&b, "\t", 1);
        const char *dt = tv_dtype_name(t->dtype);
        cb_text(&b, dt ? dt : "?", strlen(dt ? dt : "?"));
        cb_put(&b, "\t{", 2);
        for (uint32_t d = 0; d < t->rank && d < TV_ST_MAX_RANK; d++)
            cb_fmt(&b, d ? ",%" PRIu64 : "%" PRIu64, t->shape[d]);
        cb_put(&b, "}", 1);
        cb_fmt(&b, "\t%" PRIu64, t->shard_idx);
        cb_fmt(&b, "\t%" PRIu64, t->begin_off);
        cb_fmt(&b, "\t%" PRIu64 "\n", t->end_off);
        cb_flush(&b, false);
    }
    cb_flush(&b, true);
    free(b.p);
    b.p = NULL;
    if (PQputCopyEnd(cat->conn, b.failed ? "tensorvault: building the COPY data failed" : NULL) !=
        1) {
        rc = conn_err(cat, err, "ending COPY tensors");
        goto fail;
    }
    res = PQgetResult(cat->conn);
    if (!res || PQresultStatus(res) != PGRES_COMMAND_OK) {
        rc = b.failed ? tv__seterr(err, -ENOMEM, "fleet catalog: COPY tensors: out of memory")
                      : res_err(cat, res, "COPY tensors", err);
        PQclear(res);
        while ((res = PQgetResult(cat->conn)))
            PQclear(res);
        goto fail;
    }
    PQclear(res);
    while ((res = PQgetResult(cat->conn)))
        PQclear(res);
    if ((rc = publish_files(cat, c, num, err)))
        goto fail;
    json_t *j = json_pack("{s:s, s:s, s:I, s:s}", "kind", "generation", "model", g->model,
                          "generation", (json_int_t)g->number, "node", c->node);
    char *payload = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    const char *np[] = {TV__CATALOG_CHANNEL, payload ? payload : "{}"};
    rc = q(cat, "SELECT pg_notify($1, $2)", 2, np, NULL, "NOTIFY", err);
    free(payload);
    if (rc || (rc = q(cat, "COMMIT", 0, NULL, NULL, "COMMIT", err)))
        goto fail;
    c->published = 1;
    return 0;
fail:
    free(b.p);
    PQclear(res);
    rollback(cat);
    return rc;
}

int tv__catalog_publish_generation(tv__catalog *cat, const char *node, const tv__reg_manifest *m,
                                   int *published, tv_error *err)
{
    return tv__catalog_publish_generation_ex(cat, node, m, NULL, 0, published, err);
}

int tv__catalog_publish_generation_ex(tv__catalog *cat, const char *node, const tv__reg_manifest *m,
                                      const tv__reg_file *files, size_t n_files, int *published,
                                      tv_error *err)
{
    if (published)
        *published = 0;
    if (!m || !node || !node[0])
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__catalog_publish_generation: NULL argument");
    if (m->generation.state != TV__GEN_READY)
        return tv__seterr(
            err, TV_E_STATE, "fleet catalog: model '%s' generation %" PRId64 " is %s, not ready",
            m->generation.model, m->generation.number, tv__gen_state_name(m->generation.state));
    pub_ctx c = {.node = node, .m = m, .files = files, .n_files = n_files};
    int rc = with_retry(cat, publish, &c, err);
    if (rc == 0 && published)
        *published = c.published;
    return rc;
}

/* ---- aliases ----------------------------------------------------------- */

typedef struct alias_ctx {
    const char *model, *alias;
    int64_t generation;
    const char *const *placement;
    int64_t expect, now;
    int quorum, timeout_s; /* 0: NULL (every placed node); 0: 600 */
} alias_ctx;

/* {"a","b"}: a text[] literal, every element quoted. NULL on ENOMEM. */
static char *array_literal(const char *const *v)
{
    size_t cap = 3;
    for (size_t i = 0; v[i]; i++)
        cap += 2 * strlen(v[i]) + 3;
    char *out = malloc(cap), *p = out;
    if (!out)
        return NULL;
    *p++ = '{';
    for (size_t i = 0; v[i]; i++) {
        if (i)
            *p++ = ',';
        *p++ = '"';
        for (const char *s = v[i]; *s; s++) {
            if (*s == '"' || *s == '\\')
                *p++ = '\\';
            *p++ = *s;
        }
        *p++ = '"';
    }
    *p++ = '}';
    *p = '\0';
    return out;
}

static int set_alias(tv__catalog *cat, void *p, tv_error *err)
{
    alias_ctx *c = p;
    char num[32], expect[32];
    snprintf(num, sizeof num, "%" PRId64, c->generation);
    snprintf(expect, sizeof expect, "%" PRId64, c->expect);
    char *place = c->placement ? array_literal(c->placement) : NULL;
    if (c->placement && !place)
        return tv__seterr(err, -ENOMEM, "fleet catalog: out of memory");
    PGresult *res = NULL;
    char *payload = NULL;
    const char *gk[] = {c->model, num};
    const char *ak[] = {c->model, c->alias};
    int rc = q(cat, "BEGIN", 0, NULL, NULL, "BEGIN", err);
    if (rc)
        goto out;
    if ((rc = q(cat, "SELECT 1 FROM generations WHERE model = $1 AND number = $2", 2, gk, &res,
                "reading the generation", err)))
        goto fail;
    if (PQntuples(res) == 0) {
        rc = tv__seterr(err, TV_E_NOT_FOUND,
                        "fleet catalog (%s): model '%s' has no generation %" PRId64
                        " in the catalog",
                        cat->where, c->model, c->generation);
        goto fail;
    }
    PQclear(res);
    if ((rc = q(cat, "SELECT version FROM aliases WHERE model = $1 AND alias = $2 FOR UPDATE", 2,
                ak, &res, "reading the alias", err)))
        goto fail;
    int64_t have = PQntuples(res) ? strtoll(PQgetvalue(res, 0, 0), NULL, 10) : 0;
    PQclear(res);
    res = NULL;
    if (have != c->expect) {
        rc = tv__seterr(err, TV_E_CONFLICT,
                        "fleet catalog: alias '%s' of model '%s' is at version %" PRId64
                        ", not %" PRId64 " (moved by someone else: read it again)",
                        c->alias, c->model, have, c->expect);
        goto fail;
    }
    char quorum[16], timeout[16];
    snprintf(quorum, sizeof quorum, "%d", c->quorum);
    snprintf(timeout, sizeof timeout, "%d", c->timeout_s > 0 ? c->timeout_s : 600);
    const char *up[] = {c->model, c->alias, num, place, c->quorum > 0 ? quorum : NULL, timeout};
    if ((rc = q(cat,
                have ? "UPDATE aliases SET generation = $3, placement = $4, quorum = $5, "
                       "timeout_s = $6, version = version + 1, "
                       "updated_at = now() WHERE model = $1 AND alias = $2 RETURNING version"
                     : "INSERT INTO aliases (model, alias, generation, placement, quorum, "
                       "timeout_s, version) VALUES ($1, $2, $3, $4, $5, $6, 1) RETURNING version",
                6, up, &res, "moving the alias", err))) {
        if (rc == TV_E_CONFLICT)
            tv__seterr(
                err, TV_E_CONFLICT,
                "fleet catalog: alias '%s' of model '%s' was created by someone else meanwhile (expected version 0): read it again",
                c->alias, c->model);
        goto fail;
    }
    c->now = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
    PQclear(res);
    res = NULL;
    json_t *j =
        json_pack("{s:s, s:s, s:s, s:I, s:I}", "kind", "alias", "model", c->model, "alias",
                  c->alias, "generation", (json_int_t)c->generation, "version", (json_int_t)c->now);
    payload = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    const char *np[] = {TV__CATALOG_CHANNEL, payload ? payload : "{}"};
    if ((rc = q(cat, "SELECT pg_notify($1, $2)", 2, np, NULL, "NOTIFY", err)) ||
        (rc = q(cat, "COMMIT", 0, NULL, NULL, "COMMIT", err)))
        goto fail;
    goto out;
fail:
    PQclear(res);
    rollback(cat);
out:
    free(payload);
    free(place);
    return rc;
}

int tv__catalog_set_alias(tv__catalog *cat, const char *model, const char *alias,
                          int64_t generation, const char *const *placement, int64_t expect_version,
                          int64_t *new_version, tv_error *err)
{
    if (!model || !model[0] || !alias || !alias[0] || generation <= 0 || expect_version < 0)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__catalog_set_alias: bad argument");
    tv__catalog_alias_move m = {.model = model,
                                .alias = alias,
                                .generation = generation,
                                .placement = placement,
                                .expect_version = expect_version};
    return tv__catalog_move_alias(cat, &m, new_version, err);
}

int tv__catalog_move_alias(tv__catalog *cat, const tv__catalog_alias_move *m, int64_t *new_version,
                           tv_error *err)
{
    if (!m || !m->model || !m->model[0] || !m->alias || !m->alias[0] || m->generation <= 0 ||
        m->expect_version < 0 || m->quorum < 0 || m->timeout_s < 0)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__catalog_move_alias: bad argument");
    alias_ctx c = {m->model,          m->alias, m->generation, m->placement,
                   m->expect_version, 0,        m->quorum,     m->timeout_s};
    int rc = with_retry(cat, set_alias, &c, err);
    if (rc == 0 && new_version)
        *new_version = c.now;
    return rc;
}

/* ---- generic statements (the fleet thread's reports and reads) ---------- */

typedef struct stmt_ctx {
    const char *sql, *what;
    int n;
    const char *const *params;
    json_t *out; /* json: the document */
    bool json;
} stmt_ctx;

static int stmt_op(tv__catalog *cat, void *p, tv_error *err)
{
    stmt_ctx *c = p;
    PGresult *res = NULL;
    int rc = q(cat, c->sql, c->n, c->params, c->json ? &res : NULL, c->what, err);
    if (rc || !c->json)
        return rc;
    if (PQntuples(res) == 0 || PQnfields(res) < 1 || PQgetisnull(res, 0, 0)) {
        c->out = json_null();
    } else {
        json_error_t je;
        c->out = json_loads(PQgetvalue(res, 0, 0), JSON_DECODE_ANY, &je);
        if (!c->out)
            rc = tv__seterr(err, TV_E_REGISTRY, "fleet catalog (%s): %s: not JSON: %s", cat->where,
                            c->what, je.text);
    }
    PQclear(res);
    return rc;
}

int tv__catalog_exec(tv__catalog *cat, const char *sql, int n, const char *const *params,
                     const char *what, tv_error *err)
{
    stmt_ctx c = {sql, what, n, params, NULL, false};
    return with_retry(cat, stmt_op, &c, err);
}

int tv__catalog_json(tv__catalog *cat, const char *sql, int n, const char *const *params,
                     const char *what, json_t **out, tv_error *err)
{
    stmt_ctx c = {sql, what, n, params, NULL, true};
    *out = NULL;
    int rc = with_retry(cat, stmt_op, &c, err);
    if (rc == 0)
        *out = c.out;
    return rc;
}

/* ---- LISTEN / NOTIFY --------------------------------------------------- */

static int listen_op(tv__catalog *cat, void *p, tv_error *err)
{
    (void)p;
    int rc = q(cat, "LISTEN " TV__CATALOG_CHANNEL, 0, NULL, NULL, "LISTEN", err);
    if (rc == 0)
        cat->listening = true;
    return rc;
}

int tv__catalog_listen(tv__catalog *cat, tv_error *err)
{
    return with_retry(cat, listen_op, NULL, err);
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int tv__catalog_wait(tv__catalog *cat, int timeout_ms, char *payload, size_t len, tv_error *err)
{
    if (!cat || !payload || len == 0)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__catalog_wait: bad argument");
    if (!cat->listening)
        return tv__seterr(err, TV_E_STATE, "tv__catalog_wait: tv__catalog_listen first");
    payload[0] = '\0';
    int64_t deadline = timeout_ms < 0 ? INT64_MAX : now_ms() + timeout_ms;
    bool reconnected = false;
    for (;;) {
        int rc;
        if (dropped(cat)) {
            if (reconnected)
                return conn_err(cat, err, "waiting for notifications");
            if ((rc = reconnect(cat, err)))
                return rc;
            reconnected = true;
        }
        PGnotify *n = PQnotifies(cat->conn);
        if (n) {
            snprintf(payload, len, "%s", n->extra ? n->extra : "");
            PQfreemem(n);
            return 1;
        }
        int64_t left = deadline == INT64_MAX ? -1 : deadline - now_ms();
        if (deadline != INT64_MAX && left <= 0)
            return 0;
        struct pollfd pfd = {.fd = PQsocket(cat->conn), .events = POLLIN};
        if (pfd.fd < 0)
            continue; /* dropped: reconnect above */
        int pr = poll(&pfd, 1, left > INT32_MAX ? INT32_MAX : (int)left);
        if (pr < 0 && errno != EINTR)
            return tv__seterr(err, -errno, "fleet catalog: poll: %s", strerror(errno));
        if (pr > 0 && PQconsumeInput(cat->conn) != 1 && !dropped(cat))
            return conn_err(cat, err, "reading notifications");
    }
}
