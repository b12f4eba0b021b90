/* The migration runner: applies the embedded migrations/NNNN_*.sql files in
 * order, each in its own BEGIN IMMEDIATE transaction that also advances
 * PRAGMA user_version.
 *
 * Invariants: user_version is only ever set inside the transaction that
 * applied the matching file; it is re-read after the write lock is taken so
 * two processes opening a fresh database apply each file once; a version
 * newer than this binary knows is refused before anything is written. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>

#include "registry/migrate.h"
#include "registry/reg_internal.h"

int tv__migrate_version(sqlite3 *db, int *version, tv_error *err)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &st, NULL);
    if (rc != SQLITE_OK)
        return tv__sqlerr(db, err, rc, "reading user_version");
    rc = sqlite3_step(st);
    if (rc != SQLITE_ROW) {
        rc = tv__sqlerr(db, err, rc, "reading user_version");
        sqlite3_finalize(st);
        return rc;
    }
    *version = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    return 0;
}

/* Executes sql (possibly several statements); on failure maps the error
 * with the message sqlite3_exec returned. */
static int exec(sqlite3 *db, const char *sql, const char *what, tv_error *err)
{
    char *msg = NULL;
    int rc = sqlite3_exec(db, sql, NULL, NULL, &msg);
    if (rc == SQLITE_OK)
        return 0;
    int code = (rc & 0xff) == SQLITE_BUSY ? TV_E_LOCKED : TV_E_REGISTRY;
    tv__seterr(err, code, "%s: %s (%s)", what, msg ? msg : sqlite3_errmsg(db), sqlite3_errstr(rc));
    sqlite3_free(msg);
    return code;
}

static int too_new(int version, int latest, tv_error *err)
{
    return tv__seterr(
        err, TV_E_REGISTRY_TOO_NEW,
        "registry schema version %d is newer than this tensorvault supports (%d); upgrade tensorvault or open a registry it created",
        version, latest);
}

int tv__migrate(sqlite3 *db, const tv__migration *list, size_t n, size_t *applied, tv_error *err)
{
    if (applied)
        *applied = 0;
    if (!db || (!list && n))
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__migrate: NULL argument");
    if (n > INT_MAX)
        return tv__seterr(err, TV_E_INTERNAL, "tv__migrate: %zu migrations", n);
    for (size_t i = 0; i < n; i++)
        if (list[i].number != (int)i + 1 || !list[i].sql || !list[i].name)
            return tv__seterr(err, TV_E_INTERNAL,
                              "embedded migration %zu is malformed (number %d, expected %zu)", i,
                              list[i].number, i + 1);
    const int latest = (int)n;
    int version = 0;
    int rc = tv__migrate_version(db, &version, err);
    if (rc)
        return rc;
    if (version < 0)
        return tv__seterr(err, TV_E_REGISTRY, "registry user_version is %d (corrupt)", version);
    if (version > latest)
        return too_new(version, latest, err);

    while (version < latest) {
        const tv__migration *m = &list[version];
        char what[128];
        snprintf(what, sizeof what, "migration %s", m->name);
        if ((rc = exec(db, "BEGIN IMMEDIATE", what, err)))
            return rc;
        /* Another connection may have migrated while we waited for the lock. */
        int now = 0;
        if ((rc = tv__migrate_version(db, &now, err)))
            goto fail_rollback;
        if (now != version) {
            exec(db, "ROLLBACK", what, NULL);
            if (now > latest)
                return too_new(now, latest, err);
            if (now < version)
                return tv__seterr(err, TV_E_REGISTRY,
                                  "registry user_version went back from %d to %d", version, now);
            version = now;
            continue;
        }
        if ((rc = exec(db, m->sql, what, err)))
            goto fail_rollback;
        char pragma[64];
        snprintf(pragma, sizeof pragma, "PRAGMA user_version = %d", m->number);
        if ((rc = exec(db, pragma, what, err)))
            goto fail_rollback;
        if ((rc = exec(db, "COMMIT", what, err)))
            goto fail_rollback;
        tv__log(TV_LOG_INFO, "registry: applied migration %s", m->name);
        version = m->number;
        if (applied)
            (*applied)++;
    }
    return 0;

fail_rollback:
    if (!sqlite3_get_autocommit(db))
        exec(db, "ROLLBACK", "rollback", NULL);
    return rc;
}
