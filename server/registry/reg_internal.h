/* Internals shared by the registry's source files: the handle, transaction
 * levels, SQLite error mapping, checked binding of unsigned values, and the
 * query helpers (tv__reg_stmt/_exec/_query_one/_query_each/_query_list)
 * that every registry query goes through.
 *
 * Invariants: reg->depth counts open transaction levels (explicit and
 * internal); level 1 is a BEGIN (IMMEDIATE for writes), deeper levels are
 * savepoints; every internal level is closed before its function returns;
 * a uint64_t is bound only when it fits in an SQLite INTEGER (<= INT64_MAX). */
#ifndef TV_REGISTRY_REG_INTERNAL_H
#define TV_REGISTRY_REG_INTERNAL_H

#include <sqlite3.h>

#include "registry/registry.h"
#include "util/internal.h"

#if SQLITE_VERSION_NUMBER < 3037000
#error "tensorvault needs SQLite >= 3.37 (STRICT tables)"
/* A model's generations numbered above after_number, by number, at most
 * limit rows, appended to v (records tv__reg_generation; generations.c). */
int tv__reg_generations_query(tv__reg *reg, tv__reg_vec *v, const char *model, int64_t after_number,
                              int64_t limit, tv_error *err);

#endif

struct tv__reg {
    sqlite3 *db;
    int depth;
    sqlite3_stmt *data_version; /* PRAGMA data_version, prepared on first use, finalized at close */
};

/* Maps an SQLite failure to TV_E_LOCKED (busy past the timeout) or
 * TV_E_REGISTRY; the message is "<what>: <sqlite3_errmsg> (<code name>)".
 * Call right after the failing call, before anything resets the message. */
int tv__sqlerr(sqlite3 *db, tv_error *err, int rc, const char *what);

/* Opens a transaction level: BEGIN IMMEDIATE (write) or BEGIN (read) at
 * depth 0, else a savepoint. */
int tv__reg_level_begin(tv__reg *reg, bool write, tv_error *err);
/* Closes the innermost level: commits/releases when rc == 0, else rolls it
 * back. Returns rc, or the commit error when rc == 0 and commit fails. */
int tv__reg_level_end(tv__reg *reg, int rc, tv_error *err);

/* sqlite3_prepare_v2 with error mapping. */
int tv__reg_prepare(tv__reg *reg, const char *sql, sqlite3_stmt **st, tv_error *err);

/* Steps a statement expected to finish (INSERT/UPDATE/DELETE). Returns 0,
 * -EEXIST for a UNIQUE or PRIMARY KEY violation, or the mapped error. */
int tv__reg_step_done(tv__reg *reg, sqlite3_stmt *st, const char *what, tv_error *err);

/* Binds v, refusing values over INT64_MAX with TV_E_OVERFLOW naming what. */
int tv__reg_bind_u64(tv__reg *reg, sqlite3_stmt *st, int idx, uint64_t v, const char *what,
                     tv_error *err);
/* Binds a NUL-terminated string (SQLITE_TRANSIENT) or NULL. */
int tv__reg_bind_text(tv__reg *reg, sqlite3_stmt *st, int idx, const char *s, tv_error *err);
int tv__reg_bind_i64(tv__reg *reg, sqlite3_stmt *st, int idx, int64_t v, tv_error *err);

/* Column readers: negative integers (impossible under the schema's CHECKs)
 * read as 0; text is copied with truncation and always NUL-terminated. */
uint64_t tv__reg_col_u64(sqlite3_stmt *st, int col);
void tv__reg_col_text(sqlite3_stmt *st, int col, char *out, size_t cap);

/* Checks a name: 1..TV__REG_NAME_MAX bytes, no control characters. */
int tv__reg_check_name(const char *s, const char *what, tv_error *err);
/* Checks a path-like string: 1..TV__REG_PATH_MAX - 1 bytes. */
int tv__reg_check_path(const char *s, const char *what, tv_error *err);

/* Log level for a state change: INFO when it commits as the calling
 * function returns, DEBUG inside a caller's transaction (it may still be
 * rolled back). inner = levels the calling function itself still has open. */
static inline int tv__reg_log_level(const tv__reg *reg, int inner)
{
    return reg->depth > inner ? TV_LOG_DEBUG : TV_LOG_INFO;
}

/* Generation states as stored. */
int tv__reg_gen_state_from_text(const unsigned char *s, tv__gen_state *out);

/* Growable array of fixed-size records for the list functions. */
typedef struct tv__reg_vec {
    void *items;
    size_t n;
    size_t cap;
    size_t size;
} tv__reg_vec;
/* Appends one zeroed record; returns it, or NULL on overflow/ENOMEM. */
void *tv__reg_vec_push(tv__reg_vec *v);

/* Reads the current row into record (or a caller's context); returns 0 or
 * an error with err set, which stops the query. */
typedef int (*tv__reg_row_fn)(sqlite3_stmt *st, void *record, tv_error *err);

/* The query helpers: every registry query is one of these. sql's
 * parameters ?1, ?2, ... are bound from the arguments after types, one
 * letter each: 'i' int64_t, 't' const char * (NULL binds NULL), 'u'
 * uint64_t followed by the const char * naming it (TV_E_OVERFLOW over
 * INT64_MAX). Pass exactly those types (cast counts to int64_t). SQLite
 * failures say "what". */

/* Prepares and binds; the caller steps and finalizes *st (NULL on failure). */
int tv__reg_stmt(tv__reg *reg, sqlite3_stmt **st, tv_error *err, const char *sql, const char *types,
                 ...);

/* Runs a statement to completion (INSERT/UPDATE/DELETE). Returns 0, -EEXIST
 * for a UNIQUE or PRIMARY KEY violation, or the mapped error. */
int tv__reg_exec(tv__reg *reg, const char *what, tv_error *err, const char *sql, const char *types,
                 ...);

/* A row reader for column 0 as an int64_t (NULL reads as 0). */
int tv__reg_read_i64(sqlite3_stmt *st, void *record, tv_error *err);

/* Reads the first row with read(st, out, err) (read NULL: only whether
 * there is one). TV_E_NOT_FOUND, with
 * "<what>: no such row" that callers replace with their own message, when
 * there is none. */
int tv__reg_query_one(tv__reg *reg, tv__reg_row_fn read, void *out, const char *what, tv_error *err,
                      const char *sql, const char *types, ...);

/* Calls each(st, ctx, err) for every row until it returns nonzero. */
int tv__reg_query_each(tv__reg *reg, tv__reg_row_fn each, void *ctx, const char *what,
                       tv_error *err, const char *sql, const char *types, ...);

/* Appends one zeroed record per row to v (v->size set, v->items NULL) and
 * fills it with read. On failure v->items is freed and v is empty. */
int tv__reg_query_list(tv__reg *reg, tv__reg_vec *v, tv__reg_row_fn read, const char *what,
                       tv_error *err, const char *sql, const char *types, ...);

/* A model's generations numbered above after_number, by number, at most
 * limit rows, appended to v (records tv__reg_generation; generations.c). */
int tv__reg_generations_query(tv__reg *reg, tv__reg_vec *v, const char *model, int64_t after_number,
                              int64_t limit, tv_error *err);

/* A stored tensor shape (a JSON array of non-negative integers) into
 * shape[TV_ST_MAX_RANK] and *rank. Returns 0 or TV_E_REGISTRY (malformed). */
int tv__reg_parse_shape(const char *text, uint64_t *shape, uint32_t *rank);

/* The index of s in names[0..n) (NULL entries never match) into *out, for
 * the state, kind and scope parsers. Returns 0 or TV_E_INVALID_ARG. */
int tv__reg_parse_name(const char *s, const char *const *names, size_t n, int *out);

#endif
