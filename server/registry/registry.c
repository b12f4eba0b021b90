/* Registry connection: open (pragmas, defensive mode, migrations), close,
 * transaction levels, shared helpers, and the devices table.
 *
 * Invariants: a handle is returned only after WAL, synchronous=FULL,
 * foreign_keys=ON and the busy timeout are confirmed in effect and the
 * schema is current; reg->depth mirrors the open BEGIN/SAVEPOINT levels and
 * is reset when SQLite rolls a transaction back on its own (a busy or I/O
 * error), so the next call starts clean. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "registry/migrate.h"
#include "registry/reg_internal.h"
#include "util/hex.h"
#include "util/sys.h"

/* ------------------------------------------------------------------------ */
/* Helpers                                                                  */
/* ------------------------------------------------------------------------ */

int tv__sqlerr(sqlite3 *db, tv_error *err, int rc, const char *what)
{
    if ((rc & 0xff) == SQLITE_FULL)
        return tv__seterr(err, -ENOSPC, "%s: no space left on the store's filesystem (%s)", what,
                          sqlite3_errstr(rc));
    int code = (rc & 0xff) == SQLITE_BUSY ? TV_E_LOCKED : TV_E_REGISTRY;
    return tv__seterr(err, code, "%s: %s (%s)", what, db ? sqlite3_errmsg(db) : "no connection",
                      sqlite3_errstr(rc));
}

int tv__reg_prepare(tv__reg *reg, const char *sql, sqlite3_stmt **st, tv_error *err)
{
    int rc = sqlite3_prepare_v2(reg->db, sql, -1, st, NULL);
    if (rc != SQLITE_OK) {
        *st = NULL;
        return tv__sqlerr(reg->db, err, rc, "preparing a registry statement");
    }
    return 0;
}

int tv__reg_step_done(tv__reg *reg, sqlite3_stmt *st, const char *what, tv_error *err)
{
    int rc = sqlite3_step(st);
    if (rc == SQLITE_DONE || rc == SQLITE_ROW)
        return 0;
    if (rc == SQLITE_CONSTRAINT_UNIQUE || rc == SQLITE_CONSTRAINT_PRIMARYKEY)
        return tv__seterr(err, -EEXIST, "%s: %s", what, sqlite3_errmsg(reg->db));
    return tv__sqlerr(reg->db, err, rc, what);
}

int tv__reg_bind_u64(tv__reg *reg, sqlite3_stmt *st, int idx, uint64_t v, const char *what,
                     tv_error *err)
{
    if (v > (uint64_t)INT64_MAX)
        return tv__seterr(err, TV_E_OVERFLOW, "%s %llu does not fit in the registry (max %lld)",
                          what, (unsigned long long)v, (long long)INT64_MAX);
    int rc = sqlite3_bind_int64(st, idx, (sqlite3_int64)v);
    return rc == SQLITE_OK ? 0 : tv__sqlerr(reg->db, err, rc, "binding a value");
}

int tv__reg_bind_text(tv__reg *reg, sqlite3_stmt *st, int idx, const char *s, tv_error *err)
{
    int rc = s ? sqlite3_bind_text(st, idx, s, -1, SQLITE_TRANSIENT) : sqlite3_bind_null(st, idx);
    return rc == SQLITE_OK ? 0 : tv__sqlerr(reg->db, err, rc, "binding a string");
}

int tv__reg_bind_i64(tv__reg *reg, sqlite3_stmt *st, int idx, int64_t v, tv_error *err)
{
    int rc = sqlite3_bind_int64(st, idx, (sqlite3_int64)v);
    return rc == SQLITE_OK ? 0 : tv__sqlerr(reg->db, err, rc, "binding a value");
}

uint64_t tv__reg_col_u64(sqlite3_stmt *st, int col)
{
    sqlite3_int64 v = sqlite3_column_int64(st, col);
    return v < 0 ? 0 : (uint64_t)v;
}

void tv__reg_col_text(sqlite3_stmt *st, int col, char *out, size_t cap)
{
    const unsigned char *s = sqlite3_column_text(st, col);
    size_t len = s ? (size_t)sqlite3_column_bytes(st, col) : 0;
    if (len >= cap)
        len = cap - 1;
    if (len)
        memcpy(out, s, len);
    out[len] = '\0';
}

int tv__reg_check_name(const char *s, const char *what, tv_error *err)
{
    if (!s || !*s)
        return tv__seterr(err, TV_E_INVALID_ARG, "%s is empty", what);
    size_t len = strnlen(s, TV__REG_NAME_MAX + 1);
    if (len > TV__REG_NAME_MAX)
        return tv__seterr(err, TV_E_INVALID_ARG, "%s is longer than %d bytes", what,
                          TV__REG_NAME_MAX);
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
            return tv__seterr(err, TV_E_INVALID_ARG, "%s has a control character at byte %zu", what,
                              i);
    return 0;
}

int tv__reg_check_path(const char *s, const char *what, tv_error *err)
{
    if (!s || !*s)
        return tv__seterr(err, TV_E_INVALID_ARG, "%s is empty", what);
    if (strnlen(s, TV__REG_PATH_MAX) >= TV__REG_PATH_MAX)
        return tv__seterr(err, TV_E_INVALID_ARG, "%s is longer than %d bytes", what,
                          TV__REG_PATH_MAX - 1);
    return 0;
}

/* Prepares sql and binds ?1.. from types (see reg_internal.h). */
static int stmt_v(tv__reg *reg, sqlite3_stmt **st, tv_error *err, const char *sql,
                  const char *types, va_list ap)
{
    int rc = tv__reg_prepare(reg, sql, st, err);
    for (int i = 0; !rc && types[i]; i++) {
        if (types[i] == 'i') {
            rc = tv__reg_bind_i64(reg, *st, i + 1, va_arg(ap, int64_t), err);
        } else if (types[i] == 't') {
            rc = tv__reg_bind_text(reg, *st, i + 1, va_arg(ap, const char *), err);
        } else if (types[i] == 'u') {
            uint64_t v = va_arg(ap, uint64_t);
            rc = tv__reg_bind_u64(reg, *st, i + 1, v, va_arg(ap, const char *), err);
        } else {
            rc = tv__seterr(err, TV_E_INTERNAL, "registry: bad parameter type '%c' in \"%s\"",
                            types[i], sql);
        }
    }
    if (rc) {
        sqlite3_finalize(*st);
        *st = NULL;
    }
    return rc;
}

int tv__reg_stmt(tv__reg *reg, sqlite3_stmt **st, tv_error *err, const char *sql, const char *types,
                 ...)
{
    va_list ap;
    va_start(ap, types);
    int rc = stmt_v(reg, st, err, sql, types, ap);
    va_end(ap);
    return rc;
}

int tv__reg_exec(tv__reg *reg, const char *what, tv_error *err, const char *sql, const char *types,
                 ...)
{
    sqlite3_stmt *st = NULL;
    va_list ap;
    va_start(ap, types);
    int rc = stmt_v(reg, &st, err, sql, types, ap);
    va_end(ap);
    if (rc == 0)
        rc = tv__reg_step_done(reg, st, what, err);
    sqlite3_finalize(st);
    return rc;
}

/* Steps st to the end (or only to its first row when one), calling fn per
 * row; TV_E_NOT_FOUND when one and there is no row. */
static int run_rows(tv__reg *reg, sqlite3_stmt *st, bool one, tv__reg_row_fn fn, void *arg,
                    const char *what, tv_error *err)
{
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        int frc = fn ? fn(st, arg, err) : 0;
        if (frc || one)
            return frc;
    }
    if (rc != SQLITE_DONE)
        return tv__sqlerr(reg->db, err, rc, what);
    return one ? tv__seterr(err, TV_E_NOT_FOUND, "%s: no such row", what) : 0;
}

static int query_v(tv__reg *reg, bool one, tv__reg_row_fn fn, void *arg, const char *what,
                   tv_error *err, const char *sql, const char *types, va_list ap)
{
    sqlite3_stmt *st = NULL;
    int rc = stmt_v(reg, &st, err, sql, types, ap);
    if (rc == 0)
        rc = run_rows(reg, st, one, fn, arg, what, err);
    sqlite3_finalize(st);
    return rc;
}

int tv__reg_query_one(tv__reg *reg, tv__reg_row_fn read, void *out, const char *what, tv_error *err,
                      const char *sql, const char *types, ...)
{
    va_list ap;
    va_start(ap, types);
    int rc = query_v(reg, true, read, out, what, err, sql, types, ap);
    va_end(ap);
    return rc;
}

int tv__reg_query_each(tv__reg *reg, tv__reg_row_fn each, void *ctx, const char *what,
                       tv_error *err, const char *sql, const char *types, ...)
{
    va_list ap;
    va_start(ap, types);
    int rc = query_v(reg, false, each, ctx, what, err, sql, types, ap);
    va_end(ap);
    return rc;
}

int tv__reg_read_i64(sqlite3_stmt *st, void *record, tv_error *err)
{
    (void)err;
    *(int64_t *)record = sqlite3_column_int64(st, 0);
    return 0;
}

typedef struct collect_ctx {
    tv__reg_vec *v;
    tv__reg_row_fn read;
    const char *what;
} collect_ctx;

static int collect_row(sqlite3_stmt *st, void *arg, tv_error *err)
{
    collect_ctx *c = arg;
    void *rec = tv__reg_vec_push(c->v);
    if (!rec)
        return tv__seterr(err, -ENOMEM, "%s: out of memory", c->what);
    return c->read(st, rec, err); /* raw-syscall-ok: the row-reader callback, not read(2) */
}

int tv__reg_query_list(tv__reg *reg, tv__reg_vec *v, tv__reg_row_fn read, const char *what,
                       tv_error *err, const char *sql, const char *types, ...)
{
    collect_ctx c = {v, read, what};
    va_list ap;
    va_start(ap, types);
    int rc = query_v(reg, false, collect_row, &c, what, err, sql, types, ap);
    va_end(ap);
    if (rc) {
        free(v->items);
        v->items = NULL;
        v->n = v->cap = 0;
    }
    return rc;
}

void *tv__reg_vec_push(tv__reg_vec *v)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 16;
        uint64_t bytes;
        if (cap < v->cap || tv__mul_u64(cap, v->size, &bytes) || bytes > SIZE_MAX)
            return NULL;
        void *p = realloc(v->items, (size_t)bytes);
        if (!p)
            return NULL;
        v->items = p;
        v->cap = cap;
    }
    void *item = (char *)v->items + v->n * v->size;
    memset(item, 0, v->size);
    v->n++;
    return item;
}

void tv__reg_sha256_hex(const uint8_t digest[32], char out[TV__REG_SHA256_HEX_LEN + 1])
{
    tv__hex_encode(digest, 32, false, out);
}

static bool is_lower_hex(char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
}

bool tv__reg_sha256_valid(const char *hex)
{
    if (!hex)
        return false;
    for (size_t i = 0; i < TV__REG_SHA256_HEX_LEN; i++)
        if (!is_lower_hex(hex[i]))
            return false;
    return hex[TV__REG_SHA256_HEX_LEN] == '\0';
}

/* ------------------------------------------------------------------------ */
/* Transactions                                                             */
/* ------------------------------------------------------------------------ */

static int exec_simple(tv__reg *reg, const char *sql, tv_error *err)
{
    int rc = sqlite3_exec(reg->db, sql, NULL, NULL, NULL);
    return rc == SQLITE_OK ? 0 : tv__sqlerr(reg->db, err, rc, sql);
}

/* SQLite rolls a whole transaction back on its own after some errors (busy
 * during commit, I/O, out of memory); then every level we count is gone. */
static void sync_depth(tv__reg *reg)
{
    if (reg->depth > 0 && sqlite3_get_autocommit(reg->db))
        reg->depth = 0;
}

int tv__reg_level_begin(tv__reg *reg, bool write, tv_error *err)
{
    sync_depth(reg);
    int rc;
    if (reg->depth == 0)
        rc = exec_simple(reg, write ? "BEGIN IMMEDIATE" : "BEGIN", err);
    else
        rc = exec_simple(reg, "SAVEPOINT tv_level", err);
    if (rc == 0)
        reg->depth++;
    return rc;
}

static int level_commit(tv__reg *reg, tv_error *err)
{
    if (reg->depth > 0 && sqlite3_get_autocommit(reg->db)) {
        reg->depth--;
        return tv__seterr(err, TV_E_REGISTRY,
                          "the transaction was rolled back by SQLite after an earlier error");
    }
    if (reg->depth == 0)
        return tv__seterr(err, TV_E_STATE, "no registry transaction is open");
    int rc = exec_simple(reg, reg->depth == 1 ? "COMMIT" : "RELEASE tv_level", err);
    if (rc) {
        /* A failed COMMIT leaves the transaction open: undo it so the
         * handle stays usable. */
        tv__reg_rollback(reg);
        return rc;
    }
    reg->depth--;
    return 0;
}

int tv__reg_rollback(tv__reg *reg)
{
    if (!reg)
        return TV_E_INVALID_ARG;
    if (reg->depth == 0)
        return TV_E_STATE;
    if (sqlite3_get_autocommit(reg->db)) {
        reg->depth--;
        return 0;
    }
    if (reg->depth == 1)
        sqlite3_exec(reg->db, "ROLLBACK", NULL, NULL, NULL);
    else
        sqlite3_exec(reg->db, "ROLLBACK TO tv_level; RELEASE tv_level", NULL, NULL, NULL);
    reg->depth--;
    return 0;
}

int tv__reg_level_end(tv__reg *reg, int rc, tv_error *err)
{
    if (rc) {
        tv__reg_rollback(reg);
        return rc;
    }
    return level_commit(reg, err);
}

int tv__reg_begin(tv__reg *reg, tv_error *err)
{
    if (!reg)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_begin: NULL registry");
    return tv__reg_level_begin(reg, true, err);
}

int tv__reg_commit(tv__reg *reg, tv_error *err)
{
    if (!reg)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_commit: NULL registry");
    return level_commit(reg, err);
}

int tv__reg_tx_depth(const tv__reg *reg)
{
    return reg ? reg->depth : 0;
}

/* ------------------------------------------------------------------------ */
/* Open and close                                                           */
/* ------------------------------------------------------------------------ */

typedef struct text_out {
    char *buf;
    size_t cap;
} text_out;

static int read_text0(sqlite3_stmt *st, void *arg, tv_error *err)
{
    (void)err;
    text_out *t = arg;
    tv__reg_col_text(st, 0, t->buf, t->cap);
    return 0;
}

static int pragma_text(tv__reg *reg, const char *sql, char *out, size_t cap, tv_error *err)
{
    text_out t = {out, cap};
    int rc = tv__reg_query_one(reg, read_text0, &t, sql, err, sql, "");
    if (rc == TV_E_NOT_FOUND)
        rc = tv__seterr(err, TV_E_REGISTRY, "%s: no result row", sql);
    return rc;
}

static int configure(tv__reg *reg, const char *path, bool readonly, tv_error *err)
{
    sqlite3 *db = reg->db;
    int rc, on = 0;
    sqlite3_extended_result_codes(db, 1);
    if ((rc = sqlite3_busy_timeout(db, TV__REG_BUSY_TIMEOUT_MS)) != SQLITE_OK)
        return tv__sqlerr(db, err, rc, "setting busy_timeout");
    /* Defensive: no writable_schema, no direct shadow-table writes, so a
     * bad query cannot corrupt the file. Double-quoted strings are errors,
     * not silent string literals. */
    static const int flags[][2] = {
        {SQLITE_DBCONFIG_DEFENSIVE, 1},      {SQLITE_DBCONFIG_ENABLE_FKEY, 1},
        {SQLITE_DBCONFIG_DQS_DDL, 0},        {SQLITE_DBCONFIG_DQS_DML, 0},
        {SQLITE_DBCONFIG_ENABLE_TRIGGER, 1},
    };
    for (size_t i = 0; i < TV_ARRAY_LEN(flags); i++) {
        rc = sqlite3_db_config(db, flags[i][0], flags[i][1], &on);
        if (rc != SQLITE_OK)
            return tv__sqlerr(db, err, rc, "sqlite3_db_config");
        if (on != flags[i][1])
            return tv__seterr(err, TV_E_REGISTRY, "sqlite3_db_config option %d did not take",
                              flags[i][0]);
    }
    if ((rc = exec_simple(reg, "PRAGMA foreign_keys = ON", err)) ||
        (rc = exec_simple(reg, "PRAGMA temp_store = MEMORY", err)) ||
        (rc = exec_simple(reg, "PRAGMA cache_size = -32768", err)))
        return rc;
    char v[16];
    if ((rc = pragma_text(reg, "PRAGMA foreign_keys", v, sizeof v, err)))
        return rc;
    if (strcmp(v, "1"))
        return tv__seterr(err, TV_E_REGISTRY, "this SQLite cannot enforce foreign keys");
    if (readonly) /* journal_mode and synchronous only matter to writers */
        return 0;
    char mode[16];
    if ((rc = pragma_text(reg, "PRAGMA journal_mode = WAL", mode, sizeof mode, err)))
        return rc;
    if (strcmp(mode, "wal"))
        return tv__seterr(
            err, TV_E_REGISTRY,
            "registry %s: cannot use WAL (journal_mode is '%s'); it must be a file on a local filesystem",
            path, mode);
    /* A publish writes ~100k tensor rows in one transaction, inside a
     * savepoint: keep its statement journal and working set in memory
     * instead of spilling pages to temporary files. */
    if ((rc = exec_simple(reg, "PRAGMA synchronous = FULL", err)))
        return rc;
    if ((rc = pragma_text(reg, "PRAGMA synchronous", v, sizeof v, err)))
        return rc;
    if (strcmp(v, "2"))
        return tv__seterr(err, TV_E_REGISTRY, "PRAGMA synchronous = FULL did not take (%s)", v);
    return 0;
}

/* "file:" URI of path with the characters URIs reserve escaped, plus a
 * query string. Returns 0 or -ENAMETOOLONG. */
static int file_uri(const char *path, const char *query, char *out, size_t cap)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t o = 0;
    const char *pre = "file:";
    for (const char *p = pre; *p; p++)
        if (o + 1 < cap)
            out[o++] = *p;
    for (const unsigned char *p = (const unsigned char *)path; *p; p++) {
        if (*p == '%' || *p == '?' || *p == '#' || *p < 0x20 || *p >= 0x7f) {
            if (o + 4 >= cap)
                return -ENAMETOOLONG;
            out[o++] = '%';
            out[o++] = hex[*p >> 4];
            out[o++] = hex[*p & 15];
        } else {
            if (o + 2 >= cap)
                return -ENAMETOOLONG;
            out[o++] = (char)*p;
        }
    }
    int n = snprintf(out + o, cap - o, "?%s", query);
    return n < 0 || (size_t)n >= cap - o ? -ENAMETOOLONG : 0;
}

/* True when the directory holding path is on a read-only filesystem or not
 * writable by us: then SQLite cannot create the -shm file a WAL reader
 * needs, and nobody can be writing the database through this mount. */
static bool dir_readonly(const char *path)
{
    char dir[4096];
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else
        snprintf(dir, sizeof dir, "%.*s", (int)(slash > path ? slash - path : 1), path);
    struct statvfs vfs;
    if (statvfs(dir, &vfs) == 0 && (vfs.f_flag & ST_RDONLY))
        return true;
    return access(dir, W_OK) != 0;
}

static const char *full_hint(int e)
{
    return e == ENOSPC   ? " (no space left on the store's filesystem)"
           : e == EDQUOT ? " (disk quota exceeded on the store's filesystem)"
                         : "";
}

/* Checks the file before SQLite sees it: SQLite would silently turn an empty
 * file into a new database. */
static int precheck(const char *path, unsigned flags, tv_error *err)
{
    int fd;
    if (flags & TV__REG_CREATE) {
        /* Create the file ourselves so it is private from the first byte
         * (it holds API token hashes); SQLite gives -wal/-shm the same mode. */
        fd = tv__sys_open(path, O_RDWR | O_CREAT | O_NONBLOCK | O_CLOEXEC, 0600);
        if (fd < 0)
            return tv__seterr(err, fd, "registry %s: %s%s", path, strerror(-fd), full_hint(-fd));
    } else {
        fd = tv__sys_open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC, 0);
        if (fd == -ENOENT)
            return tv__seterr(err, fd, "registry %s is missing", path);
        if (fd < 0)
            return tv__seterr(err, fd, "registry %s: %s", path, strerror(-fd));
    }
    struct stat sb;
    int rc = 0;
    if (tv__sys.fstat(fd, &sb) != 0)
        rc = tv__seterr(err, -errno, "registry %s: fstat: %s", path, strerror(errno));
    else if (!S_ISREG(sb.st_mode))
        rc = tv__seterr(err, TV_E_REGISTRY, "registry %s is not a regular file", path);
    else if (!(flags & TV__REG_CREATE) && sb.st_size == 0)
        rc = tv__seterr(err, TV_E_REGISTRY,
                        "registry %s is empty (0 bytes): restore it (never re-created)", path);
    tv__sys.close(fd);
    return rc;
}

/* The first read of the file: a non-database or corrupt file fails here,
 * with a message that names it. */
static int probe(tv__reg *reg, const char *path, tv_error *err)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(reg->db, "SELECT count(*) FROM sqlite_schema", -1, &st, NULL);
    if (rc == SQLITE_OK) {
        rc = sqlite3_step(st);
        rc = rc == SQLITE_ROW ? SQLITE_OK : rc;
    }
    sqlite3_finalize(st);
    if (rc == SQLITE_OK)
        return 0;
    int prim = rc & 0xff;
    if (prim == SQLITE_NOTADB || prim == SQLITE_CORRUPT)
        return tv__seterr(err, TV_E_REGISTRY,
                          "registry %s is corrupt or not an SQLite database (%s)", path,
                          sqlite3_errstr(rc));
    if (prim == SQLITE_BUSY)
        return tv__sqlerr(reg->db, err, rc, "opening the registry");
    return tv__seterr(err, TV_E_REGISTRY, "registry %s: %s (%s)", path, sqlite3_errmsg(reg->db),
                      sqlite3_errstr(rc));
}

/* Opens the connection: read-write, or read-only with mode=ro and, where the
 * -shm file cannot be created, immutable=1. */
static int connect(tv__reg *reg, const char *path, unsigned flags, tv_error *err)
{
    int rc;
    if (!(flags & TV__REG_READONLY)) {
        rc = sqlite3_open_v2(path, &reg->db, SQLITE_OPEN_READWRITE, NULL);
    } else {
        /* immutable=1 skips the WAL: safe only when there is none to read
         * (a writer that died leaves -wal and -shm behind, and then plain
         * mode=ro reads them, -shm read-only). */
        char uri[4200], wal[4200];
        struct stat wsb;
        bool immutable = dir_readonly(path);
        if (immutable && (size_t)snprintf(wal, sizeof wal, "%s-wal", path) < sizeof wal &&
            stat(wal, &wsb) == 0 && wsb.st_size > 0)
            immutable = false;
        if (file_uri(path, immutable ? "mode=ro&immutable=1" : "mode=ro", uri, sizeof uri))
            return tv__seterr(err, -ENAMETOOLONG, "registry %s: path too long", path);
        rc = sqlite3_open_v2(uri, &reg->db, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI, NULL);
    }
    if (rc != SQLITE_OK)
        return reg->db ? tv__seterr(err, TV_E_REGISTRY, "registry %s: %s", path,
                                    sqlite3_errmsg(reg->db))
                       : tv__seterr(err, -ENOMEM, "registry %s: out of memory", path);
    return probe(reg, path, err);
}

/* The schema check of a read-only or non-creating open. */
static int check_schema(tv__reg *reg, const char *path, unsigned flags, tv_error *err)
{
    int version = 0, latest = (int)tv__n_migrations;
    int rc = tv__migrate_version(reg->db, &version, err);
    if (rc)
        return rc;
    if (version == 0)
        return tv__seterr(err, TV_E_REGISTRY,
                          "registry %s has no tensorvault schema (user_version 0)", path);
    if (version > latest || !(flags & TV__REG_READONLY))
        return 0; /* tv__migrate refuses a newer one, or migrates an older one */
    if (version < latest)
        return tv__seterr(err, TV_E_REGISTRY,
                          "registry %s: schema %d is older than %d; a writer command migrates it",
                          path, version, latest);
    return 0;
}

int tv__reg_open(const char *path, tv__reg **out, tv_error *err)
{
    return tv__reg_open_ex(path, TV__REG_CREATE, out, err);
}

int tv__reg_open_ex(const char *path, unsigned flags, tv__reg **out, tv_error *err)
{
    int rc;
    if (!out)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_open: NULL out");
    *out = NULL;
    if (!path || !*path || !strcmp(path, ":memory:"))
        return tv__seterr(err, TV_E_INVALID_ARG, "registry path must name a file");
    if ((flags & ~(TV__REG_CREATE | TV__REG_READONLY)) ||
        (flags & (TV__REG_CREATE | TV__REG_READONLY)) == (TV__REG_CREATE | TV__REG_READONLY))
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_open: bad flags 0x%x", flags);
    if (sqlite3_libversion_number() < 3037000)
        return tv__seterr(err, TV_E_NOT_SUPPORTED,
                          "SQLite %s is too old: the registry needs 3.37 or newer",
                          sqlite3_libversion());
    if ((rc = precheck(path, flags, err)))
        return rc;

    tv__reg *reg = calloc(1, sizeof *reg);
    if (!reg)
        return tv__seterr(err, -ENOMEM, "registry %s: out of memory", path);
    if ((rc = connect(reg, path, flags, err)) ||
        (rc = configure(reg, path, (flags & TV__REG_READONLY) != 0, err)))
        goto fail_db;
    if (!(flags & TV__REG_CREATE) && (rc = check_schema(reg, path, flags, err)))
        goto fail_db;
    if (flags & TV__REG_READONLY) {
        int version = 0;
        if ((rc = tv__migrate_version(reg->db, &version, err)))
            goto fail_db;
        if (version > (int)tv__n_migrations) {
            rc = tv__seterr(err, TV_E_REGISTRY_TOO_NEW,
                            "registry schema version %d is newer than this tensorvault (%d)",
                            version, (int)tv__n_migrations);
            goto fail_db;
        }
    } else if ((rc = tv__migrate(reg->db, tv__migrations, tv__n_migrations, NULL, err))) {
        goto fail_db;
    }
    *out = reg;
    return 0;

fail_db:
    sqlite3_close_v2(reg->db);
    free(reg);
    return rc;
}

void tv__reg_close(tv__reg *reg)
{
    if (!reg)
        return;
    if (reg->db && !sqlite3_get_autocommit(reg->db))
        sqlite3_exec(reg->db, "ROLLBACK", NULL, NULL, NULL);
    sqlite3_finalize(reg->data_version);
    sqlite3_close_v2(reg->db);
    free(reg);
}

int tv__reg_data_version(tv__reg *reg, int64_t *version, tv_error *err)
{
    int rc;
    if (!reg || !version)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_data_version: NULL argument");
    /* Prepared once: this runs on every cached lookup, where preparing a
     * statement would cost what the cache saves. */
    if (!reg->data_version &&
        (rc = sqlite3_prepare_v3(reg->db, "PRAGMA data_version", -1, SQLITE_PREPARE_PERSISTENT,
                                 &reg->data_version, NULL)) != SQLITE_OK) {
        reg->data_version = NULL;
        return tv__sqlerr(reg->db, err, rc, "preparing PRAGMA data_version");
    }
    rc = sqlite3_step(reg->data_version);
    if (rc == SQLITE_ROW)
        *version = sqlite3_column_int64(reg->data_version, 0);
    int rrc = sqlite3_reset(reg->data_version);
    if (rc != SQLITE_ROW)
        return tv__sqlerr(reg->db, err, rrc != SQLITE_OK ? rrc : rc, "reading PRAGMA data_version");
    return 0;
}

sqlite3 *tv__reg_sqlite(tv__reg *reg)
{
    return reg ? reg->db : NULL;
}

int tv__reg_schema_version(tv__reg *reg, int *version, tv_error *err)
{
    if (!reg || !version)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_schema_version: NULL argument");
    return tv__migrate_version(reg->db, version, err);
}

int tv__reg_schema_latest(void)
{
    return (int)tv__n_migrations;
}

/* ------------------------------------------------------------------------ */
/* Devices                                                                  */
/* ------------------------------------------------------------------------ */

static bool uuid_valid(const char *s)
{
    for (size_t i = 0; i < TV__REG_UUID_LEN; i++) {
        bool dash = i == 8 || i == 13 || i == 18 || i == 23;
        if (dash ? s[i] != '-' : !is_lower_hex(s[i]))
            return false;
    }
    return s[TV__REG_UUID_LEN] == '\0';
}

static int check_geometry(const tv__reg_device *d, tv_error *err)
{
    const char *u = d->uuid;
    if (d->lba_size < 512 || (d->lba_size & (d->lba_size - 1)))
        return tv__seterr(err, TV_E_INVALID_ARG,
                          "device %s: lba_size %llu is not a power of two >= 512", u,
                          (unsigned long long)d->lba_size);
    if (!d->io_align || d->io_align % d->lba_size || d->io_align % 4096)
        return tv__seterr(err, TV_E_INVALID_ARG,
                          "device %s: io_align %llu is not a multiple of lba_size %llu and 4096", u,
                          (unsigned long long)d->io_align, (unsigned long long)d->lba_size);
    if (!d->object_align || d->object_align % d->io_align || d->object_align % 65536)
        return tv__seterr(
            err, TV_E_INVALID_ARG,
            "device %s: object_align %llu is not a multiple of io_align %llu and 64 KiB", u,
            (unsigned long long)d->object_align, (unsigned long long)d->io_align);
    if (d->size_bytes > (uint64_t)INT64_MAX)
        return tv__seterr(err, TV_E_OVERFLOW, "device %s: size %llu is over INT64_MAX", u,
                          (unsigned long long)d->size_bytes);
    uint64_t region_end;
    if (tv__add_u64(d->region_off, d->region_len, &region_end))
        return tv__seterr(err, TV_E_OVERFLOW, "device %s: region_off + region_len overflows", u);
    if (!d->region_off || d->region_off % d->io_align || !d->region_len ||
        region_end > d->size_bytes)
        return tv__seterr(
            err, TV_E_INVALID_ARG,
            "device %s: region [%llu, %llu) must start after byte 0 on an io_align boundary and lie inside the %llu-byte device",
            u, (unsigned long long)d->region_off, (unsigned long long)region_end,
            (unsigned long long)d->size_bytes);
    if (d->data_off <= d->region_off || d->data_off > region_end || d->data_off % d->object_align)
        return tv__seterr(
            err, TV_E_INVALID_ARG,
            "device %s: data_off %llu must be object_align aligned and inside the region (%llu, %llu]",
            u, (unsigned long long)d->data_off, (unsigned long long)d->region_off,
            (unsigned long long)region_end);
    return 0;
}

int tv__reg_device_add(tv__reg *reg, const tv__reg_device *in, int64_t *id, tv_error *err)
{
    int rc;
    sqlite3_stmt *st = NULL;
    if (!reg || !in)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_device_add: NULL argument");
    if (!uuid_valid(in->uuid))
        return tv__seterr(err, TV_E_INVALID_ARG,
                          "device uuid '%.40s' is not a lower-case canonical UUID", in->uuid);
    if (strcmp(in->kind, "file") && strcmp(in->kind, "block") && strcmp(in->kind, "nvme"))
        return tv__seterr(err, TV_E_INVALID_ARG, "device kind '%.8s' is not file, block or nvme",
                          in->kind);
    if (strnlen(in->path, sizeof in->path) == sizeof in->path ||
        strnlen(in->identity, sizeof in->identity) == sizeof in->identity)
        return tv__seterr(err, TV_E_INVALID_ARG, "device path or identity is not NUL-terminated");
    if ((rc = tv__reg_check_path(in->path, "device path", err)) || (rc = check_geometry(in, err)))
        return rc;
    const char *identity = in->identity[0] ? in->identity : "{}";

    if ((rc = tv__reg_stmt(reg, &st, err,
                           "INSERT INTO devices (uuid, path, kind, lba_size, io_align, "
                           "object_align, size_bytes, region_off, region_len, data_off, "
                           "identity) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, "
                           "CASE WHEN json_valid(?11) AND json_type(?11) = 'object' "
                           "THEN ?11 END)",
                           "tttuuuuuuut", in->uuid, in->path, in->kind, in->lba_size, "lba_size",
                           in->io_align, "io_align", in->object_align, "object_align",
                           in->size_bytes, "size_bytes", in->region_off, "region_off",
                           in->region_len, "region_len", in->data_off, "data_off", identity)))
        return rc;
    rc = sqlite3_step(st);
    if (rc == SQLITE_DONE) {
        rc = 0;
        if (id)
            *id = sqlite3_last_insert_rowid(reg->db);
    } else if (rc == SQLITE_CONSTRAINT_UNIQUE) {
        rc = tv__seterr(err, -EEXIST, "device %s is already registered", in->uuid);
    } else if (rc == SQLITE_CONSTRAINT_NOTNULL) {
        rc =
            tv__seterr(err, TV_E_INVALID_ARG, "device %s: identity is not a JSON object", in->uuid);
    } else {
        rc = tv__sqlerr(reg->db, err, rc, "adding a device");
    }
    sqlite3_finalize(st);
    return rc;
}

#define DEVICE_COLS                                                                                \
    "id, uuid, path, kind, lba_size, io_align, object_align, size_bytes, region_off, "             \
    "region_len, data_off, identity, created_at"

static int read_device(sqlite3_stmt *st, void *record, tv_error *err)
{
    (void)err;
    tv__reg_device *d = record;
    memset(d, 0, sizeof *d);
    d->id = sqlite3_column_int64(st, 0);
    tv__reg_col_text(st, 1, d->uuid, sizeof d->uuid);
    tv__reg_col_text(st, 2, d->path, sizeof d->path);
    tv__reg_col_text(st, 3, d->kind, sizeof d->kind);
    d->lba_size = tv__reg_col_u64(st, 4);
    d->io_align = tv__reg_col_u64(st, 5);
    d->object_align = tv__reg_col_u64(st, 6);
    d->size_bytes = tv__reg_col_u64(st, 7);
    d->region_off = tv__reg_col_u64(st, 8);
    d->region_len = tv__reg_col_u64(st, 9);
    d->data_off = tv__reg_col_u64(st, 10);
    tv__reg_col_text(st, 11, d->identity, sizeof d->identity);
    d->created_at = sqlite3_column_int64(st, 12);
    return 0;
}

int tv__reg_device_get(tv__reg *reg, int64_t id, tv__reg_device *out, tv_error *err)
{
    if (!reg || !out)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_device_get: NULL argument");
    int rc = tv__reg_query_one(reg, read_device, out, "reading a device", err,
                               "SELECT " DEVICE_COLS " FROM devices WHERE id = ?1", "i", id);
    if (rc == TV_E_NOT_FOUND)
        rc = tv__seterr(err, TV_E_NOT_FOUND, "no device with id %lld", (long long)id);
    return rc;
}

int tv__reg_device_get_by_uuid(tv__reg *reg, const char *uuid, tv__reg_device *out, tv_error *err)
{
    if (!reg || !uuid || !out)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_device_get_by_uuid: NULL argument");
    int rc = tv__reg_query_one(reg, read_device, out, "reading a device", err,
                               "SELECT " DEVICE_COLS " FROM devices WHERE uuid = ?1", "t", uuid);
    if (rc == TV_E_NOT_FOUND)
        rc = tv__seterr(err, TV_E_NOT_FOUND, "no device with uuid %.40s", uuid);
    return rc;
}

int tv__reg_device_list(tv__reg *reg, tv__reg_device **out, size_t *n, tv_error *err)
{
    if (!reg || !out || !n)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_device_list: NULL argument");
    tv__reg_vec v = {.size = sizeof(tv__reg_device)};
    int rc = tv__reg_query_list(reg, &v, read_device, "listing devices", err,
                                "SELECT " DEVICE_COLS " FROM devices ORDER BY id", "");
    *out = v.items;
    *n = v.n;
    return rc;
}
