/* What the service layer reads and changes besides imports: one model, model
 * delete, pages of models, generations and tensors, aliases, generation
 * specs ("3" | "prod" | "active") and API tokens.
 *
 * Invariants: an alias names a ready generation of its model and moves in
 * one statement (the schema's triggers are the backstop); "active" is never
 * an alias row; a model is deleted only when nothing is active, aliased,
 * importing or leased, in one transaction; pages are keyset pages (the
 * cursor is the last row's key), so concurrent inserts never repeat or skip
 * a row that existed before; a token's secret is never stored, only its
 * SHA-256, and lookups compare the digest in constant time. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>

#include "registry/notes.h"
#include "registry/reg_internal.h"
#include "snap/snapfile.h"
#include "util/hex.h"
#include "util/sha256.h"

/* ------------------------------------------------------------------------ */
/* Models                                                                   */
/* ------------------------------------------------------------------------ */

#define MODEL_SELECT                                                                               \
    "SELECT m.id, m.name, ifnull(m.active_generation, 0), "                                        \
    "(SELECT count(*) FROM generations g WHERE g.model_id = m.id), m.created_at FROM models m "

static int read_model_row(sqlite3_stmt *st, void *record, tv_error *err)
{
    (void)err;
    tv__reg_model *m = record;
    memset(m, 0, sizeof *m);
    m->id = sqlite3_column_int64(st, 0);
    tv__reg_col_text(st, 1, m->name, sizeof m->name);
    m->active_generation = sqlite3_column_int64(st, 2);
    m->n_generations = sqlite3_column_int64(st, 3);
    m->created_at = sqlite3_column_int64(st, 4);
    return 0;
}

int tv__reg_model_get(tv__reg *reg, const char *model, tv__reg_model *out, tv_error *err)
{
    if (!reg || !model || !out)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_model_get: NULL argument");
    int rc = tv__reg_query_one(reg, read_model_row, out, "reading a model", err,
                               MODEL_SELECT "WHERE m.name = ?1", "t", model);
    if (rc == TV_E_NOT_FOUND)
        rc = tv__seterr(err, TV_E_NOT_FOUND, "model '%s' not found", model);
    return rc;
}

static int check_limit(size_t limit, const char *what, tv_error *err)
{
    if (limit == 0 || limit > 100000)
        return tv__seterr(err, TV_E_INVALID_ARG, "%s: page limit %zu out of range (1..100000)",
                          what, limit);
    return 0;
}

/* Cuts a limit + 1 row result to limit rows and says whether more follow. */
static void cut_page(tv__reg_vec *v, size_t limit, bool *more)
{
    *more = v->n > limit;
    if (*more)
        v->n = limit;
}

int tv__reg_models_page(tv__reg *reg, const char *after_name, size_t limit, tv__reg_model **out,
                        size_t *n, bool *more, tv_error *err)
{
    if (!reg || !out || !n || !more)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_models_page: NULL argument");
    *out = NULL;
    *n = 0;
    *more = false;
    int rc = check_limit(limit, "listing models", err);
    if (rc)
        return rc;
    tv__reg_vec v = {.size = sizeof(tv__reg_model)};
    rc = tv__reg_query_list(reg, &v, read_model_row, "listing models", err,
                            MODEL_SELECT "WHERE m.name > ?1 ORDER BY m.name LIMIT ?2", "ti",
                            after_name ? after_name : "", (int64_t)limit + 1);
    if (rc)
        return rc;
    cut_page(&v, limit, more);
    *out = v.items;
    *n = v.n;
    return 0;
}

int tv__reg_generations_page(tv__reg *reg, const char *model, int64_t after_number, size_t limit,
                             tv__reg_generation **out, size_t *n, bool *more, tv_error *err)
{
    if (!reg || !model || !out || !n || !more)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_generations_page: NULL argument");
    *out = NULL;
    *n = 0;
    *more = false;
    int rc = check_limit(limit, "listing generations", err);
    if (rc)
        return rc;
    if (after_number < 0)
        return tv__seterr(err, TV_E_INVALID_ARG, "generation cursor %lld is negative",
                          (long long)after_number);
    tv__reg_vec v = {.size = sizeof(tv__reg_generation)};
    tv__reg_model m;
    if ((rc = tv__reg_level_begin(reg, false, err)))
        return rc;
    if ((rc = tv__reg_model_get(reg, model, &m, err)) == 0)
        rc = tv__reg_generations_query(reg, &v, model, after_number, (int64_t)limit + 1, err);
    rc = tv__reg_level_end(reg, rc, err);
    if (rc) {
        free(v.items);
        return rc;
    }
    cut_page(&v, limit, more);
    *out = v.items;
    *n = v.n;
    return 0;
}

typedef struct delete_check {
    int64_t n_active, n_aliased, n_importing, n_leased, n_gens;
} delete_check;

static int read_delete_check(sqlite3_stmt *st, void *record, tv_error *err)
{
    (void)err;
    delete_check *c = record;
    c->n_active = sqlite3_column_int64(st, 0);
    c->n_aliased = sqlite3_column_int64(st, 1);
    c->n_importing = sqlite3_column_int64(st, 2);
    c->n_leased = sqlite3_column_int64(st, 3);
    c->n_gens = sqlite3_column_int64(st, 4);
    return 0;
}

int tv__reg_model_delete(tv__reg *reg, const char *model, size_t *n_retired, tv_error *err)
{
    if (!reg || !model)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_model_delete: NULL argument");
    tv__reg_model m;
    delete_check c = {0};
    tv__reg_alias first = {0};
    int rc = tv__reg_level_begin(reg, true, err);
    if (rc)
        return rc;
    if ((rc = tv__reg_model_get(reg, model, &m, err)))
        goto done;
    if (m.active_generation) {
        rc = tv__seterr(
            err, TV_E_STATE,
            "model '%s' has active generation %lld: a model with an active generation cannot be deleted",
            model, (long long)m.active_generation);
        goto done;
    }
    rc = tv__reg_query_one(
        reg, read_delete_check, &c, "checking a model before delete", err,
        "SELECT 0, (SELECT count(*) FROM aliases a WHERE a.model_id = ?1), "
        "(SELECT count(*) FROM generations g WHERE g.model_id = ?1 AND g.state = 'importing'), "
        "(SELECT count(*) FROM leases l JOIN generations g ON g.id = l.generation_id "
        " WHERE g.model_id = ?1), "
        "(SELECT count(*) FROM generations g WHERE g.model_id = ?1)",
        "i", m.id);
    if (rc)
        goto done;
    if (c.n_aliased) {
        size_t n = 0;
        tv__reg_alias *list = NULL;
        if ((rc = tv__reg_aliases_list(reg, model, &list, &n, err)))
            goto done;
        if (n)
            first = list[0];
        free(list);
        rc = tv__seterr(
            err, TV_E_STATE,
            "model '%s' has %lld aliases (alias '%s' names generation %lld): remove them before deleting the model",
            model, (long long)c.n_aliased, first.alias, (long long)first.generation);
        goto done;
    }
    if (c.n_importing) {
        rc = tv__seterr(err, TV_E_STATE,
                        "model '%s' has a generation still importing: wait for it or cancel it",
                        model);
        goto done;
    }
    if (c.n_leased) {
        rc = tv__seterr(err, TV_E_LEASED,
                        "model '%s' has %lld leases on its generations: readers still use it",
                        model, (long long)c.n_leased);
        goto done;
    }
    /* Retire first (through the state triggers), then delete: shards,
     * bindings and tensors go by ON DELETE CASCADE. */
    if ((rc = tv__reg_exec(reg, "retiring a model's generations", err,
                           "UPDATE generations SET state = 'retired' "
                           "WHERE model_id = ?1 AND state != 'retired'",
                           "i", m.id)) ||
        (rc = tv__reg_exec(reg, "deleting a model's generations", err,
                           "DELETE FROM generations WHERE model_id = ?1", "i", m.id)) ||
        (rc = tv__reg_exec(reg, "deleting a model", err, "DELETE FROM models WHERE id = ?1", "i",
                           m.id)) ||
        (rc = tv__reg_event(reg, "model.delete", model, 0,
                            json_pack("{s:I}", "n_generations", (json_int_t)c.n_gens), NULL, err)))
        goto done;
done:
    rc = tv__reg_level_end(reg, rc, err);
    if (rc == 0) {
        tv__log(tv__reg_log_level(reg, 0), "registry: model '%s' deleted (%lld generations)", model,
                (long long)c.n_gens);
        if (n_retired)
            *n_retired = (size_t)c.n_gens;
    }
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Tensors                                                                  */
/* ------------------------------------------------------------------------ */

#define TENSOR_SELECT                                                                              \
    "SELECT t.id, t.name, t.dtype, t.shape, s.idx, s.name, t.begin_off, t.end_off, "               \
    "s.header_len FROM tensors t JOIN shards s ON s.id = t.shard_id "

static int read_tensor_row(sqlite3_stmt *st, void *record, tv_error *err)
{
    tv__reg_tensor_row *t = record;
    memset(t, 0, sizeof *t);
    t->row_id = sqlite3_column_int64(st, 0);
    const unsigned char *name = sqlite3_column_text(st, 1);
    if (!(t->name = strdup(name ? (const char *)name : "")))
        return tv__seterr(err, -ENOMEM, "reading tensors: out of memory");
    int64_t dtype = sqlite3_column_int64(st, 2);
    if (dtype < 0 || dtype >= TV_DTYPE_COUNT ||
        tv__reg_parse_shape((const char *)sqlite3_column_text(st, 3), t->shape, &t->rank))
        return tv__seterr(err, TV_E_REGISTRY, "tensor '%.200s' has a corrupt dtype or shape",
                          t->name);
    t->dtype = (tv_dtype)dtype;
    t->shard_idx = (uint32_t)sqlite3_column_int64(st, 4);
    tv__reg_col_text(st, 5, t->shard, sizeof t->shard);
    t->begin_off = tv__reg_col_u64(st, 6);
    t->end_off = tv__reg_col_u64(st, 7);
    t->header_len = tv__reg_col_u64(st, 8);
    return 0;
}

void tv__reg_tensor_rows_free(tv__reg_tensor_row *rows, size_t n)
{
    if (!rows)
        return;
    for (size_t i = 0; i < n; i++)
        free(rows[i].name);
    free(rows);
}

typedef struct tensor_collect {
    tv__reg_vec v;
} tensor_collect;

static int collect_tensor(sqlite3_stmt *st, void *arg, tv_error *err)
{
    tensor_collect *c = arg;
    tv__reg_tensor_row *t = tv__reg_vec_push(&c->v);
    if (!t)
        return tv__seterr(err, -ENOMEM, "reading tensors: out of memory");
    return read_tensor_row(st, t, err);
}

static int generation_exists(tv__reg *reg, int64_t generation_id, tv_error *err)
{
    int rc = tv__reg_query_one(reg, NULL, NULL, "reading a generation", err,
                               "SELECT 1 FROM generations WHERE id = ?1", "i", generation_id);
    if (rc == TV_E_NOT_FOUND)
        rc =
            tv__seterr(err, TV_E_NOT_FOUND, "no generation with id %lld", (long long)generation_id);
    return rc;
}

/* Rows whose name starts with ?2 (bytes): the range test uses the
 * (generation_id, name) index, the substr test makes it exact. */
#define PREFIX_WHERE                                                                               \
    "t.generation_id = ?1 AND t.name >= ?2 "                                                       \
    "AND substr(CAST(t.name AS BLOB), 1, length(CAST(?2 AS BLOB))) = CAST(?2 AS BLOB) "

/* Rows whose name holds the bytes of ?5 (?6) anywhere ('' = every row):
 * instr on blobs compares bytes, so the match is case-sensitive. */
#define CONTAINS_WHERE_5 "AND (?5 = '' OR instr(CAST(t.name AS BLOB), CAST(?5 AS BLOB)) > 0) "
#define CONTAINS_WHERE_6 "AND (?6 = '' OR instr(CAST(t.name AS BLOB), CAST(?6 AS BLOB)) > 0) "

int tv__reg_tensors_page(tv__reg *reg, int64_t generation_id, const char *prefix,
                         tv__reg_tensor_order order, int64_t after_row_id, uint64_t after_nbytes,
                         const char *after_name, size_t limit, tv__reg_tensor_row **out, size_t *n,
                         bool *more, tv_error *err)
{
    return tv__reg_tensors_search(reg, generation_id, prefix, NULL, order, after_row_id,
                                  after_nbytes, after_name, limit, out, n, more, err);
}

int tv__reg_tensors_search(tv__reg *reg, int64_t generation_id, const char *prefix,
                           const char *contains, tv__reg_tensor_order order, int64_t after_row_id,
                           uint64_t after_nbytes, const char *after_name, size_t limit,
                           tv__reg_tensor_row **out, size_t *n, bool *more, tv_error *err)
{
    if (!reg || !out || !n || !more)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_tensors_search: NULL argument");
    *out = NULL;
    *n = 0;
    *more = false;
    int rc = check_limit(limit, "listing tensors", err);
    if (rc)
        return rc;
    if (order != TV__REG_TENSORS_FILE && order != TV__REG_TENSORS_NAME &&
        order != TV__REG_TENSORS_SIZE)
        return tv__seterr(err, TV_E_INVALID_ARG, "listing tensors: unknown order %d", (int)order);
    if (after_row_id < 0)
        return tv__seterr(err, TV_E_INVALID_ARG, "tensor cursor %lld is negative",
                          (long long)after_row_id);
    tensor_collect c = {{.size = sizeof(tv__reg_tensor_row)}};
    const char *p = prefix ? prefix : "";
    const char *sub = contains ? contains : "";
    if ((rc = tv__reg_level_begin(reg, false, err)))
        return rc;
    if ((rc = generation_exists(reg, generation_id, err)))
        goto done;
    if (order == TV__REG_TENSORS_NAME) {
        rc = tv__reg_query_each(reg, collect_tensor, &c, "listing tensors", err,
                                TENSOR_SELECT "WHERE " PREFIX_WHERE CONTAINS_WHERE_5
                                              "AND t.name > ?3 ORDER BY t.name LIMIT ?4",
                                "ittit", generation_id, p, after_name ? after_name : "",
                                (int64_t)limit + 1, sub);
        goto done;
    }
    if (order == TV__REG_TENSORS_SIZE) {
        /* Keyset on (nbytes desc, name): the rows after the cursor's key. */
        rc = tv__reg_query_each(reg, collect_tensor, &c, "listing tensors", err,
                                TENSOR_SELECT "WHERE " PREFIX_WHERE CONTAINS_WHERE_6
                                              "AND (?3 = '' OR t.end_off - t.begin_off < ?4 "
                                              "OR (t.end_off - t.begin_off = ?4 AND t.name > ?3)) "
                                              "ORDER BY t.end_off - t.begin_off DESC, t.name "
                                              "LIMIT ?5",
                                "ittuit", generation_id, p, after_name ? after_name : "",
                                after_nbytes, "tensor cursor size", (int64_t)limit + 1, sub);
        goto done;
    }
    if (after_row_id) {
        rc = tv__reg_query_one(reg, NULL, NULL, "reading a tensor cursor", err,
                               "SELECT 1 FROM tensors WHERE id = ?1 AND generation_id = ?2", "ii",
                               after_row_id, generation_id);
        if (rc == TV_E_NOT_FOUND)
            rc = tv__seterr(err, TV_E_INVALID_ARG,
                            "tensor cursor %lld names no tensor of generation %lld",
                            (long long)after_row_id, (long long)generation_id);
        if (rc)
            goto done;
    }
    rc = tv__reg_query_each(reg, collect_tensor, &c, "listing tensors", err,
                            TENSOR_SELECT
                            "WHERE " PREFIX_WHERE CONTAINS_WHERE_5
                            "AND (?3 = 0 OR (s.idx, t.begin_off, t.id) > "
                            "(SELECT s2.idx, t2.begin_off, t2.id FROM tensors t2 "
                            " JOIN shards s2 ON s2.id = t2.shard_id WHERE t2.id = ?3)) "
                            "ORDER BY s.idx, t.begin_off, t.id LIMIT ?4",
                            "itiit", generation_id, p, after_row_id, (int64_t)limit + 1, sub);
done:
    rc = tv__reg_level_end(reg, rc, err);
    if (rc) {
        tv__reg_tensor_rows_free(c.v.items, c.v.n);
        return rc;
    }
    if (c.v.n > limit) {
        tv__reg_tensor_row *rows = c.v.items;
        free(rows[limit].name);
        c.v.n = limit;
        *more = true;
    }
    *out = c.v.items;
    *n = c.v.n;
    return 0;
}

int tv__reg_tensor_get(tv__reg *reg, int64_t generation_id, const char *name,
                       tv__reg_tensor_row *out, tv_error *err)
{
    if (!reg || !name || !out)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_tensor_get: NULL argument");
    memset(out, 0, sizeof *out);
    int rc = tv__reg_level_begin(reg, false, err);
    if (rc)
        return rc;
    if ((rc = generation_exists(reg, generation_id, err)))
        goto done;
    rc = tv__reg_query_one(reg, read_tensor_row, out, "reading a tensor", err,
                           TENSOR_SELECT "WHERE t.generation_id = ?1 AND t.name = ?2", "it",
                           generation_id, name);
    if (rc == TV_E_NOT_FOUND)
        rc = tv__seterr(err, TV_E_NOT_FOUND, "generation %lld has no tensor '%.200s'",
                        (long long)generation_id, name);
done:
    rc = tv__reg_level_end(reg, rc, err);
    if (rc) {
        free(out->name);
        out->name = NULL;
    }
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Aliases                                                                  */
/* ------------------------------------------------------------------------ */

_Static_assert(TV__ALIAS_MAX == TV__SNAPFILE_ALIAS_MAX, "one alias length limit");

static const char ALIAS_RULE[] = "an alias is 1-64 bytes of [A-Za-z][A-Za-z0-9._-]*, not 'active'";

int tv__alias_name_valid(const char *alias, tv_error *err)
{
    /* One rule, core's (readers check NAME@ALIAS without the registry);
     * what follows only says why a name is refused. */
    if (tv__snapfile_alias_valid(alias))
        return 0;
    if (!alias || !*alias)
        return tv__seterr(err, TV_E_NAME, "alias name is empty; %s", ALIAS_RULE);
    size_t len = strnlen(alias, TV__ALIAS_MAX + 1);
    if (len > TV__ALIAS_MAX)
        return tv__seterr(err, TV_E_NAME, "alias '%.32s...' is longer than %d bytes; %s", alias,
                          TV__ALIAS_MAX, ALIAS_RULE);
    if (!strcmp(alias, "active"))
        return tv__seterr(err, TV_E_NAME, "alias 'active' is reserved for the active generation");
    bool printable = true;
    for (size_t i = 0; i < len; i++)
        printable &= alias[i] >= 0x20 && alias[i] < 0x7f;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)alias[i];
        bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
        bool ok = letter || (i > 0 && ((c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-'));
        if (!ok)
            return tv__seterr(err, TV_E_NAME, "alias '%.64s' is refused at byte %zu (0x%02x); %s",
                              printable ? alias : "(unprintable)", i, c, ALIAS_RULE);
    }
    return tv__seterr(err, TV_E_NAME, "alias '%.64s' is refused; %s", alias, ALIAS_RULE);
}

static int read_alias(sqlite3_stmt *st, void *record, tv_error *err)
{
    (void)err;
    tv__reg_alias *a = record;
    memset(a, 0, sizeof *a);
    tv__reg_col_text(st, 0, a->model, sizeof a->model);
    tv__reg_col_text(st, 1, a->alias, sizeof a->alias);
    a->generation = sqlite3_column_int64(st, 2);
    a->updated_at = sqlite3_column_int64(st, 3);
    return 0;
}

#define ALIAS_SELECT                                                                               \
    "SELECT m.name, a.name, a.generation, a.updated_at FROM aliases a "                            \
    "JOIN models m ON m.id = a.model_id "

int tv__reg_alias_set(tv__reg *reg, const char *model, const char *alias, int64_t number,
                      tv_error *err)
{
    if (!reg || !model || !alias)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_alias_set: NULL argument");
    if (!strcmp(alias, "active"))
        return tv__reg_generation_activate(reg, model, number, err);
    int rc = tv__alias_name_valid(alias, err);
    if (rc)
        return rc;
    if (number <= 0)
        return tv__seterr(err, TV_E_INVALID_ARG, "generation number %lld: must be >= 1",
                          (long long)number);
    tv__reg_generation g;
    int64_t previous = 0;
    if ((rc = tv__reg_level_begin(reg, true, err)))
        return rc;
    if ((rc = tv__reg_generation_get(reg, model, number, &g, err)))
        goto done;
    if (g.state != TV__GEN_READY) {
        rc = tv__seterr(err, TV_E_STATE,
                        "model '%s' generation %lld is %s: only ready generations can be aliased",
                        model, (long long)number, tv__gen_state_name(g.state));
        goto done;
    }
    rc = tv__reg_query_one(reg, tv__reg_read_i64, &previous, "reading an alias", err,
                           "SELECT generation FROM aliases WHERE model_id = ?1 AND name = ?2", "it",
                           g.model_id, alias);
    if (rc == TV_E_NOT_FOUND)
        rc = 0;
    if (rc || previous == number)
        goto done;
    rc =
        tv__reg_exec(reg, "setting an alias", err,
                     "INSERT INTO aliases (model_id, name, generation) VALUES (?1, ?2, ?3) "
                     "ON CONFLICT (model_id, name) DO UPDATE SET generation = excluded.generation, "
                     "updated_at = CAST(strftime('%s', 'now') AS INTEGER)",
                     "iti", g.model_id, alias, number);
    if (rc == 0)
        rc = tv__reg_event(reg, "alias.set", model, number,
                           json_pack("{s:s,s:o}", "alias", alias, "generation",
                                     previous ? json_integer(previous) : json_null()),
                           json_pack("{s:s,s:I}", "alias", alias, "generation", (json_int_t)number),
                           err);
    if (rc == 0)
        tv__log(tv__reg_log_level(reg, 1), "registry: model '%s' alias '%s' %lld -> %lld", model,
                alias, (long long)previous, (long long)number);
done:
    return tv__reg_level_end(reg, rc, err);
}

/* The model's id, TV_E_NOT_FOUND naming it. */
static int model_id(tv__reg *reg, const char *model, int64_t *id, tv_error *err)
{
    int rc = tv__reg_query_one(reg, tv__reg_read_i64, id, "looking up a model", err,
                               "SELECT id FROM models WHERE name = ?1", "t", model);
    if (rc == TV_E_NOT_FOUND)
        rc = tv__seterr(err, TV_E_NOT_FOUND, "model '%s' not found", model);
    return rc;
}

int tv__reg_alias_get(tv__reg *reg, const char *model, const char *alias, int64_t *number,
                      tv_error *err)
{
    if (!reg || !model || !alias || !number)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_alias_get: NULL argument");
    if (!strcmp(alias, "active"))
        return tv__reg_active_generation(reg, model, number, err);
    int rc = tv__alias_name_valid(alias, err);
    if (rc)
        return rc;
    int64_t id = 0;
    if ((rc = tv__reg_level_begin(reg, false, err)))
        return rc;
    if ((rc = model_id(reg, model, &id, err)))
        goto done;
    rc = tv__reg_query_one(reg, tv__reg_read_i64, number, "reading an alias", err,
                           "SELECT generation FROM aliases WHERE model_id = ?1 AND name = ?2", "it",
                           id, alias);
    if (rc == TV_E_NOT_FOUND)
        rc = tv__seterr(err, TV_E_NOT_FOUND, "model '%s' has no alias '%s'", model, alias);
done:
    return tv__reg_level_end(reg, rc, err);
}

int tv__reg_alias_remove(tv__reg *reg, const char *model, const char *alias, int64_t *number,
                         tv_error *err)
{
    if (!reg || !model || !alias)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_alias_remove: NULL argument");
    int rc = tv__alias_name_valid(alias, err);
    if (rc)
        return rc;
    int64_t gen = 0, id = 0;
    if ((rc = tv__reg_level_begin(reg, true, err)))
        return rc;
    if ((rc = tv__reg_alias_get(reg, model, alias, &gen, err)) ||
        (rc = model_id(reg, model, &id, err)) ||
        (rc = tv__reg_exec(reg, "removing an alias", err,
                           "DELETE FROM aliases WHERE model_id = ?1 AND name = ?2", "it", id,
                           alias)) ||
        (rc = tv__reg_event(reg, "alias.remove", model, gen,
                            json_pack("{s:s,s:I}", "alias", alias, "generation", (json_int_t)gen),
                            json_pack("{s:s,s:n}", "alias", alias, "generation"), err)))
        goto done;
    tv__log(tv__reg_log_level(reg, 1), "registry: model '%s' alias '%s' (generation %lld) removed",
            model, alias, (long long)gen);
done:
    rc = tv__reg_level_end(reg, rc, err);
    if (rc == 0 && number)
        *number = gen;
    return rc;
}

int tv__reg_aliases_list(tv__reg *reg, const char *model, tv__reg_alias **out, size_t *n,
                         tv_error *err)
{
    if (!reg || !model || !out || !n)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_aliases_list: NULL argument");
    *out = NULL;
    *n = 0;
    tv__reg_vec v = {.size = sizeof(tv__reg_alias)};
    int64_t id = 0;
    int rc = tv__reg_level_begin(reg, false, err);
    if (rc)
        return rc;
    if ((rc = model_id(reg, model, &id, err)) == 0)
        rc = tv__reg_query_list(reg, &v, read_alias, "listing aliases", err,
                                ALIAS_SELECT "WHERE a.model_id = ?1 ORDER BY a.name", "i", id);
    rc = tv__reg_level_end(reg, rc, err);
    if (rc) {
        free(v.items);
        return rc;
    }
    *out = v.items;
    *n = v.n;
    return 0;
}

int tv__reg_resolve_gen(tv__reg *reg, const char *model, const char *gen_spec, int64_t *number,
                        tv_error *err)
{
    if (!reg || !model || !gen_spec || !number)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_resolve_gen: NULL argument");
    if (gen_spec[0] >= '0' && gen_spec[0] <= '9') {
        int64_t v = 0;
        if (!tv__parse_pos_i64(gen_spec, &v))
            return tv__seterr(
                err, TV_E_NAME,
                "generation '%.32s' of model '%s' is not a number 1, 2, ... (no leading zero), 'active' or an alias",
                gen_spec, model);
        tv__reg_generation g;
        int rc = tv__reg_generation_get(reg, model, v, &g, err);
        if (rc == 0)
            *number = v;
        return rc;
    }
    return tv__reg_alias_get(reg, model, gen_spec, number, err);
}

/* ------------------------------------------------------------------------ */
/* Tokens                                                                   */
/* ------------------------------------------------------------------------ */

static const char *const g_scopes[] = {NULL, "read", "admin", "fleet"};

const char *tv__scope_name(tv__scope s)
{
    return (unsigned)s < TV_ARRAY_LEN(g_scopes) ? g_scopes[s] : NULL;
}

int tv__scope_parse(const char *s, tv__scope *out)
{
    int v = 0;
    int rc = tv__reg_parse_name(s, g_scopes, TV_ARRAY_LEN(g_scopes), &v); /* [0] is NULL */
    if (rc == 0)
        *out = (tv__scope)v;
    return rc;
}

#define TOKEN_PREFIX "tvk_"

static int read_token(sqlite3_stmt *st, void *record, tv_error *err)
{
    (void)err;
    tv__reg_token *t = record;
    memset(t, 0, sizeof *t);
    t->id = sqlite3_column_int64(st, 0);
    tv__reg_col_text(st, 1, t->name, sizeof t->name);
    tv__scope s = TV__SCOPE_NONE;
    t->scope = tv__scope_parse((const char *)sqlite3_column_text(st, 2), &s) ? TV__SCOPE_NONE : s;
    t->created_at = sqlite3_column_int64(st, 3);
    t->revoked_at = sqlite3_column_int64(st, 4);
    return 0;
}

#define TOKEN_COLS "id, name, scope, created_at, ifnull(revoked_at, 0) "

/* SHA-256 of a secret as 64 hex digits. */
static int secret_hash(const char *secret, char hex[TV__REG_SHA256_HEX_LEN + 1], tv_error *err)
{
    tv__sha256 h;
    uint8_t d[32];
    int rc = tv__sha256_init(&h);
    if (rc)
        return tv__seterr(err, rc, "hashing a token: %s", tv_strerror(rc));
    tv__sha256_update(&h, secret, strlen(secret));
    tv__sha256_final(&h, d);
    tv__sha256_free(&h);
    tv__reg_sha256_hex(d, hex);
    return 0;
}

int tv__reg_token_create(tv__reg *reg, const char *name, tv__scope scope,
                         char secret_out[TV__TOKEN_SECRET_LEN + 1], tv__reg_token *out,
                         tv_error *err)
{
    if (!reg || !secret_out)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_token_create: NULL argument");
    int rc = tv__reg_check_name(name, "token name", err);
    if (rc)
        return rc;
    if (scope != TV__SCOPE_READ && scope != TV__SCOPE_ADMIN && scope != TV__SCOPE_FLEET)
        return tv__seterr(err, TV_E_INVALID_ARG, "token '%s': scope %d is not read, admin or fleet",
                          name, (int)scope);
    uint8_t raw[32];
    char secret[TV__TOKEN_SECRET_LEN + 1];
    char hash[TV__REG_SHA256_HEX_LEN + 1];
    int64_t id = 0;
    if (RAND_bytes(raw, (int)sizeof raw) != 1)
        return tv__seterr(err, -EIO, "token '%s': no random bytes available", name);
    /* Error paths below wipe secret whole: initialize all of it. */
    memset(secret, 0, sizeof secret);
    memcpy(secret, TOKEN_PREFIX, 4);
    tv__hex_encode(raw, sizeof raw, false, secret + 4);
    OPENSSL_cleanse(raw, sizeof raw);
    if ((rc = secret_hash(secret, hash, err)))
        goto done;
    if ((rc = tv__reg_level_begin(reg, true, err)))
        goto done;
    rc = tv__reg_exec(reg, "creating a token", err,
                      "INSERT INTO api_tokens (name, sha256, scope) VALUES (?1, ?2, ?3)", "ttt",
                      name, hash, tv__scope_name(scope));
    if (rc == 0)
        id = sqlite3_last_insert_rowid(reg->db);
    if (rc == 0 && out)
        rc = tv__reg_query_one(reg, read_token, out, "reading a token", err,
                               "SELECT " TOKEN_COLS "FROM api_tokens WHERE id = ?1", "i", id);
    if (rc == 0)
        rc = tv__reg_event(reg, "token.create", NULL, 0, NULL,
                           json_pack("{s:I,s:s,s:s}", "id", (json_int_t)id, "name", name, "scope",
                                     tv__scope_name(scope)),
                           err);
    rc = tv__reg_level_end(reg, rc, err);
    if (rc == 0) {
        memcpy(secret_out, secret, sizeof secret);
        tv__log(tv__reg_log_level(reg, 0), "registry: token %lld '%s' (%s) created", (long long)id,
                name, tv__scope_name(scope));
    }
done:
    OPENSSL_cleanse(secret, sizeof secret);
    return rc;
}

typedef struct token_hit {
    char sha256[TV__REG_SHA256_HEX_LEN + 1];
    tv__reg_token t;
    char scope[8];
} token_hit;

static int read_token_hit(sqlite3_stmt *st, void *record, tv_error *err)
{
    (void)err;
    token_hit *h = record;
    tv__reg_col_text(st, 0, h->sha256, sizeof h->sha256);
    h->t.id = sqlite3_column_int64(st, 1);
    tv__reg_col_text(st, 2, h->scope, sizeof h->scope);
    h->t.revoked_at = sqlite3_column_int64(st, 3);
    tv__reg_col_text(st, 4, h->t.name, sizeof h->t.name);
    h->t.created_at = sqlite3_column_int64(st, 5);
    return 0;
}

static bool secret_shape_ok(const char *s)
{
    if (strncmp(s, TOKEN_PREFIX, 4) || strnlen(s, TV__TOKEN_SECRET_LEN + 1) != TV__TOKEN_SECRET_LEN)
        return false;
    for (size_t i = 4; i < TV__TOKEN_SECRET_LEN; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return false;
    return true;
}

int tv__reg_token_check(tv__reg *reg, const char *secret, tv__scope *scope, tv__reg_token *tok,
                        tv_error *err)
{
    if (!reg || !secret || !scope)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_token_check: NULL argument");
    *scope = TV__SCOPE_NONE;
    if (!secret_shape_ok(secret))
        return tv__seterr(err, TV_E_UNAUTHORIZED,
                          "the bearer token is malformed (expected tvk_ and 64 hex digits)");
    char hash[TV__REG_SHA256_HEX_LEN + 1];
    token_hit h;
    memset(&h, 0, sizeof h);
    int rc = secret_hash(secret, hash, err);
    if (rc)
        return rc;
    rc = tv__reg_query_one(
        reg, read_token_hit, &h, "looking up a token", err,
        "SELECT sha256, id, scope, ifnull(revoked_at, 0), name, created_at FROM api_tokens "
        "WHERE sha256 = ?1",
        "t", hash);
    if (rc == TV_E_NOT_FOUND ||
        (rc == 0 && CRYPTO_memcmp(h.sha256, hash, TV__REG_SHA256_HEX_LEN) != 0))
        return tv__seterr(err, TV_E_UNAUTHORIZED, "the bearer token is unknown");
    if (rc)
        return rc;
    if (h.t.revoked_at)
        return tv__seterr(err, TV_E_UNAUTHORIZED, "token %lld was revoked", (long long)h.t.id);
    tv__scope s = TV__SCOPE_NONE;
    if (tv__scope_parse(h.scope, &s))
        return tv__seterr(err, TV_E_REGISTRY, "token %lld has an unknown scope", (long long)h.t.id);
    *scope = s;
    h.t.scope = s;
    if (tok)
        *tok = h.t;
    return 0;
}

int tv__reg_tokens_list(tv__reg *reg, tv__reg_token **out, size_t *n, tv_error *err)
{
    if (!reg || !out || !n)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_tokens_list: NULL argument");
    tv__reg_vec v = {.size = sizeof(tv__reg_token)};
    int rc = tv__reg_query_list(reg, &v, read_token, "listing tokens", err,
                                "SELECT " TOKEN_COLS "FROM api_tokens ORDER BY id", "");
    *out = v.items;
    *n = v.n;
    return rc;
}

int tv__reg_token_revoke(tv__reg *reg, int64_t id, tv__reg_token *out, tv_error *err)
{
    if (!reg)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_token_revoke: NULL registry");
    tv__reg_token t;
    int64_t was_revoked = 0;
    int rc = tv__reg_level_begin(reg, true, err);
    if (rc)
        return rc;
    if ((rc = tv__reg_query_one(reg, tv__reg_read_i64, &was_revoked, "reading a token", err,
                                "SELECT ifnull(revoked_at, 0) FROM api_tokens WHERE id = ?1", "i",
                                id)) == TV_E_NOT_FOUND)
        rc = 0; /* answered below */
    if (rc)
        goto done;
    if ((rc = tv__reg_exec(reg, "revoking a token", err,
                           "UPDATE api_tokens SET revoked_at = "
                           "coalesce(revoked_at, CAST(strftime('%s', 'now') AS INTEGER)) "
                           "WHERE id = ?1",
                           "i", id)))
        goto done;
    rc = tv__reg_query_one(reg, read_token, &t, "reading a token", err,
                           "SELECT " TOKEN_COLS "FROM api_tokens WHERE id = ?1", "i", id);
    if (rc == TV_E_NOT_FOUND)
        rc = tv__seterr(err, TV_E_NOT_FOUND, "no token with id %lld", (long long)id);
    if (rc == 0 && !was_revoked)
        rc = tv__reg_event(
            reg, "token.revoke", NULL, 0,
            json_pack("{s:I,s:s,s:n}", "id", (json_int_t)id, "name", t.name, "revoked_at"),
            json_pack("{s:I,s:s,s:I}", "id", (json_int_t)id, "name", t.name, "revoked_at",
                      (json_int_t)t.revoked_at),
            err);
done:
    rc = tv__reg_level_end(reg, rc, err);
    if (rc == 0) {
        tv__log(tv__reg_log_level(reg, 0), "registry: token %lld '%s' revoked", (long long)id,
                t.name);
        if (out)
            *out = t;
    }
    return rc;
}
