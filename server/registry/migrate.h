/* Registry schema migrations: the embedded list (generated at build time
 * from migrations/NNNN_description.sql) and the runner.
 *
 * Invariants: PRAGMA user_version is the number of the last applied
 * migration; migration i (1-based) has number i; each pending migration is
 * applied in its own BEGIN IMMEDIATE transaction that also sets
 * user_version, so a failure leaves the database at the previous version
 * with nothing of the failed file applied; a database whose user_version is
 * newer than the list is never touched. */
#ifndef TV_REGISTRY_MIGRATE_H
#define TV_REGISTRY_MIGRATE_H

#include <stddef.h>

#include "tensorvault/errors.h"

struct sqlite3;

typedef struct tv__migration {
    int number;       /* NNNN of the file name */
    const char *name; /* "0001_init.sql" */
    const char *sql;  /* NUL-terminated; no BEGIN/COMMIT of its own */
} tv__migration;

/* The migrations built into this binary, in order (generated file). */
extern const tv__migration tv__migrations[];
extern const size_t tv__n_migrations;

/* Brings db up to list[n - 1].number. Safe against a concurrent runner on
 * another connection: user_version is re-read after the write lock is taken.
 * *applied (may be NULL) receives how many migrations this call applied.
 * Returns 0; TV_E_REGISTRY_TOO_NEW when user_version > the last number
 * (the message names both); TV_E_INTERNAL for a malformed list (numbers not
 * 1..n); TV_E_REGISTRY when a migration fails (the message names the file
 * and carries sqlite3_errmsg); TV_E_LOCKED when another writer holds the
 * database past the busy timeout. */
int tv__migrate(struct sqlite3 *db, const tv__migration *list, size_t n, size_t *applied,
                tv_error *err);

/* Reads PRAGMA user_version. Returns 0 or TV_E_REGISTRY. */
int tv__migrate_version(struct sqlite3 *db, int *version, tv_error *err);

#endif
