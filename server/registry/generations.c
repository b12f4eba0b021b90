/* Models and generations: numbering, shards and their object bindings,
 * tensor metadata (bulk insert and listing), state changes, activation,
 * deactivation, rollback and retirement.
 *
 * Invariants: generation numbers come from models.last_generation, bumped
 * in the creating transaction, so they are never reused; a generation
 * becomes ready only with shards idx 0..n-1, each bound to at least one
 * committed object of its length and hash and to no 'writing' one; the
 * active generation changes in a single UPDATE of models.active_generation,
 * so a reader sees the old or the new one and never neither (only a
 * deactivation, one UPDATE to NULL, leaves none on purpose); every change
 * runs in one transaction level (savepoint inside an explicit transaction). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "registry/reg_internal.h"
#include "util/sys.h"

static const char *const g_gen_states[] = {"importing", "ready", "failed", "retired"};

const char *tv__gen_state_name(tv__gen_state s)
{
    return (unsigned)s < TV_ARRAY_LEN(g_gen_states) ? g_gen_states[s] : NULL;
}

int tv__gen_state_parse(const char *s, tv__gen_state *out)
{
    int v = 0;
    int rc = tv__reg_parse_name(s, g_gen_states, TV_ARRAY_LEN(g_gen_states), &v);
    if (rc == 0)
        *out = (tv__gen_state)v;
    return rc;
}

int tv__reg_parse_name(const char *s, const char *const *names, size_t n, int *out)
{
    for (size_t i = 0; s && i < n; i++)
        if (names[i] && !strcmp(s, names[i])) {
            *out = (int)i;
            return 0;
        }
    return TV_E_INVALID_ARG;
}

int tv__reg_gen_state_from_text(const unsigned char *s, tv__gen_state *out)
{
    return tv__gen_state_parse((const char *)s, out);
}

/* ------------------------------------------------------------------------ */
/* Reading generations                                                      */
/* ------------------------------------------------------------------------ */

#define GEN_SELECT                                                                                 \
    "SELECT g.id, g.model_id, m.name, g.number, g.state, m.active_generation IS g.number, "        \
    "g.source, g.total_bytes, "                                                                    \
    "(SELECT count(*) FROM shards s WHERE s.generation_id = g.id), "                               \
    "(SELECT count(*) FROM tensors t WHERE t.generation_id = g.id), g.created_at, "                \
    "(SELECT count(*) FROM generation_files f WHERE f.generation_id = g.id) "                      \
    "FROM generations g JOIN models m ON m.id = g.model_id "

static int read_generation(sqlite3_stmt *st, void *record, tv_error *err)
{
    (void)err;
    tv__reg_generation *g = record;
    memset(g, 0, sizeof *g);
    g->id = sqlite3_column_int64(st, 0);
    g->model_id = sqlite3_column_int64(st, 1);
    tv__reg_col_text(st, 2, g->model, sizeof g->model);
    g->number = sqlite3_column_int64(st, 3);
    if (tv__reg_gen_state_from_text(sqlite3_column_text(st, 4), &g->state))
        g->state = TV__GEN_FAILED; /* impossible under the CHECK constraint */
    g->active = sqlite3_column_int(st, 5) != 0;
    tv__reg_col_text(st, 6, g->source, sizeof g->source);
    g->total_bytes = tv__reg_col_u64(st, 7);
    g->n_shards = sqlite3_column_int64(st, 8);
    g->n_tensors = sqlite3_column_int64(st, 9);
    g->created_at = sqlite3_column_int64(st, 10);
    g->n_files = sqlite3_column_int64(st, 11);
    return 0;
}

int tv__reg_generation_get_by_id(tv__reg *reg, int64_t generation_id, tv__reg_generation *out,
                                 tv_error *err)
{
    if (!reg || !out)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_generation_get_by_id: NULL argument");
    int rc = tv__reg_query_one(reg, read_generation, out, "reading a generation", err,
                               GEN_SELECT "WHERE g.id = ?1", "i", generation_id);
    if (rc == TV_E_NOT_FOUND)
        rc =
            tv__seterr(err, TV_E_NOT_FOUND, "no generation with id %lld", (long long)generation_id);
    return rc;
}

/* Model name -> its active generation number (0 when none). */
static int model_active(tv__reg *reg, const char *model, int64_t *number, const char *what,
                        tv_error *err)
{
    int rc = tv__reg_query_one(reg, tv__reg_read_i64, number, what, err,
                               "SELECT active_generation FROM models WHERE name = ?1", "t", model);
    if (rc == TV_E_NOT_FOUND)
        rc = tv__seterr(err, TV_E_NOT_FOUND, "no model named '%s'", model);
    return rc;
}

/* Why (model, number) matched nothing: no model, no active generation, or
 * no such number. Always returns TV_E_NOT_FOUND (or a lookup error). */
static int not_found(tv__reg *reg, const char *model, int64_t number, tv_error *err)
{
    int64_t active = 0;
    int rc = model_active(reg, model, &active, "looking up a model", err);
    if (rc)
        return rc;
    if (number == 0)
        return tv__seterr(err, TV_E_NOT_FOUND, "model '%s' has no active generation", model);
    return tv__seterr(err, TV_E_NOT_FOUND, "model '%s' has no generation %lld", model,
                      (long long)number);
}

int tv__reg_generation_get(tv__reg *reg, const char *model, int64_t number, tv__reg_generation *out,
                           tv_error *err)
{
    if (!reg || !model || !out)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_generation_get: NULL argument");
    if (number < 0)
        return tv__seterr(err, TV_E_INVALID_ARG, "generation number %lld is negative",
                          (long long)number);
    int rc = tv__reg_query_one(reg, read_generation, out, "reading a generation", err,
                               GEN_SELECT "WHERE m.name = ?1 AND g.number = "
                                          "CASE WHEN ?2 = 0 THEN m.active_generation ELSE ?2 END",
                               "ti", model, number);
    if (rc == TV_E_NOT_FOUND)
        rc = not_found(reg, model, number, err);
    return rc;
}

int tv__reg_active_generation(tv__reg *reg, const char *model, int64_t *number, tv_error *err)
{
    if (!reg || !model || !number)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_active_generation: NULL argument");
    int64_t active = 0;
    int rc = model_active(reg, model, &active, "reading the active generation", err);
    if (rc)
        return rc;
    if (active == 0) /* NULL: numbers start at 1 */
        return tv__seterr(err, TV_E_NOT_FOUND, "model '%s' has no active generation", model);
    *number = active;
    return 0;
}

static int read_model(sqlite3_stmt *st, void *record, tv_error *err)
{
    (void)err;
    tv__reg_model *m = record;
    m->id = sqlite3_column_int64(st, 0);
    tv__reg_col_text(st, 1, m->name, sizeof m->name);
    m->active_generation = sqlite3_column_int64(st, 2);
    m->n_generations = sqlite3_column_int64(st, 3);
    m->created_at = sqlite3_column_int64(st, 4);
    return 0;
}

int tv__reg_models_list(tv__reg *reg, tv__reg_model **out, size_t *n, tv_error *err)
{
    if (!reg || !out || !n)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_models_list: NULL argument");
    tv__reg_vec v = {.size = sizeof(tv__reg_model)};
    int rc = tv__reg_query_list(reg, &v, read_model, "listing models", err,
                                "SELECT m.id, m.name, ifnull(m.active_generation, 0), "
                                "(SELECT count(*) FROM generations g WHERE g.model_id = m.id), "
                                "m.created_at FROM models m ORDER BY m.name",
                                "");
    *out = v.items;
    *n = v.n;
    return rc;
}

int tv__reg_generations_list(tv__reg *reg, const char *model, tv__reg_generation **out, size_t *n,
                             tv_error *err)
{
    if (!reg || !model || !out || !n)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_generations_list: NULL argument");
    *out = NULL;
    *n = 0;
    tv__reg_vec v = {.size = sizeof(tv__reg_generation)};
    int rc = tv__reg_level_begin(reg, false, err);
    if (rc)
        return rc;
    rc = tv__reg_query_list(reg, &v, read_generation, "listing generations", err,
                            GEN_SELECT "WHERE m.name = ?1 ORDER BY g.number", "t", model);
    /* A model row is created with its first generation, so no rows means
     * no model. */
    if (rc == 0 && v.n == 0)
        rc = tv__seterr(err, TV_E_NOT_FOUND, "no model named '%s'", model);
    rc = tv__reg_level_end(reg, rc, err);
    if (rc == 0) {
        *out = v.items;
        *n = v.n;
    } else {
        free(v.items);
    }
    return rc;
}

int tv__reg_generations_query(tv__reg *reg, tv__reg_vec *v, const char *model, int64_t after_number,
                              int64_t limit, tv_error *err)
{
    return tv__reg_query_list(reg, v, read_generation, "listing generations", err,
                              GEN_SELECT "WHERE m.name = ?1 AND g.number > ?2 "
                                         "ORDER BY g.number LIMIT ?3",
                              "tii", model, after_number, limit);
}

/* ------------------------------------------------------------------------ */
/* Creating generations, shards, bindings                                   */
/* ------------------------------------------------------------------------ */

/* Columns 0 and 1 as int64_t[2]. */
static int read_two_i64(sqlite3_stmt *st, void *record, tv_error *err)
{
    (void)err;
    int64_t *v = record;
    v[0] = sqlite3_column_int64(st, 0);
    v[1] = sqlite3_column_int64(st, 1);
    return 0;
}

int tv__reg_generation_create(tv__reg *reg, const char *model, const char *source,
                              uint64_t total_bytes, tv__reg_generation *out, tv_error *err)
{
    return tv__reg_generation_create_as(reg, model, source, total_bytes, 0, out, err);
}

int tv__reg_generation_create_as(tv__reg *reg, const char *model, const char *source,
                                 uint64_t total_bytes, int64_t number, tv__reg_generation *out,
                                 tv_error *err)
{
    if (!reg)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_generation_create: NULL registry");
    int rc;
    if ((rc = tv__reg_check_name(model, "model name", err)) ||
        (rc = tv__reg_check_path(source, "import source", err)))
        return rc;
    if (total_bytes > (uint64_t)INT64_MAX)
        return tv__seterr(err, TV_E_OVERFLOW, "total_bytes %llu over INT64_MAX",
                          (unsigned long long)total_bytes);
    int64_t ids[2] = {0, 0}, gen_id = 0; /* model id, generation number */
    if ((rc = tv__reg_level_begin(reg, true, err)))
        return rc;
    if ((rc = tv__reg_exec(reg, "creating a model", err,
                           "INSERT INTO models (name) VALUES (?1) ON CONFLICT DO NOTHING", "t",
                           model)))
        goto done;
    /* RETURNING: the whole UPDATE runs in the first step. */
    if (number > 0) {
        /* A fleet generation keeps its catalog number on every node. */
        int64_t have[2] = {0, 0};
        rc = tv__reg_query_one(reg, read_two_i64, have, "reading a generation number", err,
                               "SELECT count(*), 0 FROM generations g JOIN models m "
                               "ON m.id = g.model_id WHERE m.name = ?1 AND g.number = ?2",
                               "ti", model, number);
        if (rc)
            goto done;
        if (have[0]) {
            rc = tv__seterr(
                err, TV_E_CONFLICT,
                "model '%s' already has a generation %lld here (the catalog's generation %lld has other content, or is imported already)",
                model, (long long)number, (long long)number);
            goto done;
        }
        rc = tv__reg_query_one(reg, read_two_i64, ids, "numbering a generation", err,
                               "UPDATE models SET last_generation = max(last_generation, ?2) "
                               "WHERE name = ?1 RETURNING id, ?2",
                               "ti", model, number);
    } else {
        rc = tv__reg_query_one(reg, read_two_i64, ids, "numbering a generation", err,
                               "UPDATE models SET last_generation = last_generation + 1 "
                               "WHERE name = ?1 RETURNING id, last_generation",
                               "t", model);
    }
    if (rc)
        goto done;
    if ((rc = tv__reg_exec(reg, "creating a generation", err,
                           "INSERT INTO generations (model_id, number, source, total_bytes) "
                           "VALUES (?1, ?2, ?3, ?4)",
                           "iitu", ids[0], ids[1], source, total_bytes, "total_bytes")))
        goto done;
    gen_id = sqlite3_last_insert_rowid(reg->db);
    if (out)
        rc = tv__reg_generation_get_by_id(reg, gen_id, out, err);
done:
    rc = tv__reg_level_end(reg, rc, err);
    if (rc == 0)
        tv__log(tv__reg_log_level(reg, 0), "registry: model '%s' generation %lld created", model,
                (long long)ids[1]);
    return rc;
}

typedef struct gen_brief_row {
    int64_t id;
    tv__gen_state *state;
    char *model;
    size_t model_cap;
    int64_t *number;
} gen_brief_row;

static int read_gen_brief(sqlite3_stmt *st, void *record, tv_error *err)
{
    gen_brief_row *b = record;
    int rc = 0;
    if (tv__reg_gen_state_from_text(sqlite3_column_text(st, 0), b->state))
        rc = tv__seterr(err, TV_E_REGISTRY, "generation %lld has an unknown state",
                        (long long)b->id);
    tv__reg_col_text(st, 1, b->model, b->model_cap);
    *b->number = sqlite3_column_int64(st, 2);
    return rc;
}

/* State, model name and number of a generation, cheaply (no counts). */
static int gen_brief(tv__reg *reg, int64_t generation_id, tv__gen_state *state, char *model,
                     size_t model_cap, int64_t *number, tv_error *err)
{
    gen_brief_row b = {generation_id, state, model, model_cap, number};
    int rc = tv__reg_query_one(reg, read_gen_brief, &b, "reading a generation", err,
                               "SELECT g.state, m.name, g.number FROM generations g "
                               "JOIN models m ON m.id = g.model_id WHERE g.id = ?1",
                               "i", generation_id);
    if (rc == TV_E_NOT_FOUND)
        rc =
            tv__seterr(err, TV_E_NOT_FOUND, "no generation with id %lld", (long long)generation_id);
    return rc;
}

/* Fails with TV_E_STATE unless the generation is importing. */
static int require_importing(tv__reg *reg, int64_t generation_id, const char *what, tv_error *err)
{
    tv__gen_state state = TV__GEN_IMPORTING;
    char model[TV__REG_NAME_MAX + 1];
    int64_t number = 0;
    int rc = gen_brief(reg, generation_id, &state, model, sizeof model, &number, err);
    if (rc)
        return rc;
    if (state != TV__GEN_IMPORTING)
        return tv__seterr(err, TV_E_STATE, "%s: model '%s' generation %lld is %s, not importing",
                          what, model, (long long)number, tv__gen_state_name(state));
    return 0;
}

int tv__reg_shard_add(tv__reg *reg, int64_t generation_id, const tv__reg_shard_in *in,
                      int64_t *shard_id, tv_error *err)
{
    if (!reg || !in)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_shard_add: NULL argument");
    int rc;
    if ((rc = tv__reg_check_path(in->name, "shard name", err)))
        return rc;
    uint64_t header_end;
    if (in->header_len == 0 || tv__add_u64(8, in->header_len, &header_end) ||
        header_end > in->file_len)
        return tv__seterr(err, TV_E_INVALID_ARG,
                          "shard '%s': header of %llu bytes does not fit in a %llu-byte file",
                          in->name, (unsigned long long)in->header_len,
                          (unsigned long long)in->file_len);
    if (!tv__reg_sha256_valid(in->sha256_hex) || !tv__reg_sha256_valid(in->header_sha256_hex))
        return tv__seterr(err, TV_E_INVALID_ARG,
                          "shard '%s': sha256 values must be 64 lower-case hex digits", in->name);
    if ((rc = tv__reg_level_begin(reg, true, err)))
        return rc;
    if ((rc = require_importing(reg, generation_id, "adding a shard", err)))
        goto done;
    rc = tv__reg_exec(reg, "adding a shard", err,
                      "INSERT INTO shards (generation_id, idx, name, file_len, header_len, "
                      "sha256, header_sha256) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                      "iituutt", generation_id, (int64_t)in->idx, in->name, in->file_len,
                      "shard file_len", in->header_len, "shard header_len", in->sha256_hex,
                      in->header_sha256_hex);
    if (rc) {
        if (rc == -EEXIST)
            tv__seterr(err, rc, "generation %lld already has a shard with idx %u or name '%s'",
                       (long long)generation_id, in->idx, in->name);
        goto done;
    }
    if (shard_id)
        *shard_id = sqlite3_last_insert_rowid(reg->db);
done:
    return tv__reg_level_end(reg, rc, err);
}

typedef struct shard_brief {
    int64_t generation_id;
    char name[TV__REG_PATH_MAX];
    uint64_t file_len;
    char sha256[TV__REG_SHA256_HEX_LEN + 1];
} shard_brief;

static int read_shard_brief(sqlite3_stmt *st, void *record, tv_error *err)
{
    (void)err;
    shard_brief *b = record;
    b->generation_id = sqlite3_column_int64(st, 0);
    tv__reg_col_text(st, 1, b->name, sizeof b->name);
    b->file_len = tv__reg_col_u64(st, 2);
    tv__reg_col_text(st, 3, b->sha256, sizeof b->sha256);
    return 0;
}

int tv__reg_shard_bind(tv__reg *reg, int64_t shard_id, int64_t object_id, tv_error *err)
{
    if (!reg)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_shard_bind: NULL registry");
    tv__reg_object o;
    shard_brief sh;
    int64_t bound = 0;
    int rc = tv__reg_level_begin(reg, true, err);
    if (rc)
        return rc;
    rc = tv__reg_query_one(reg, read_shard_brief, &sh, "reading a shard", err,
                           "SELECT generation_id, name, file_len, sha256 FROM shards "
                           "WHERE id = ?1",
                           "i", shard_id);
    if (rc == TV_E_NOT_FOUND)
        rc = tv__seterr(err, TV_E_NOT_FOUND, "no shard with id %lld", (long long)shard_id);
    if (rc)
        goto done;
    if ((rc = require_importing(reg, sh.generation_id, "binding a shard", err)) ||
        (rc = tv__reg_object_get(reg, object_id, &o, err)))
        goto done;
    if (o.canonical_len != sh.file_len) {
        rc =
            tv__seterr(err, TV_E_INVALID_ARG, "shard '%s' is %llu bytes but object %lld holds %llu",
                       sh.name, (unsigned long long)sh.file_len, (long long)object_id,
                       (unsigned long long)o.canonical_len);
        goto done;
    }
    if (o.state == TV__OBJ_COMMITTED && strcmp(o.sha256, sh.sha256)) {
        rc =
            tv__seterr(err, TV_E_HASH_MISMATCH, "shard '%s' has sha256 %s but object %lld holds %s",
                       sh.name, sh.sha256, (long long)object_id, o.sha256);
        goto done;
    }
    rc = tv__reg_query_one(reg, tv__reg_read_i64, &bound, "reading shard bindings", err,
                           "SELECT o.id FROM shard_objects so JOIN objects o "
                           "ON o.id = so.object_id WHERE so.shard_id = ?1 AND o.device_id = ?2",
                           "ii", shard_id, o.device_id);
    if (rc == 0) {
        rc = tv__seterr(err, -EEXIST, "shard '%s' is already bound to object %lld on device %lld",
                        sh.name, (long long)bound, (long long)o.device_id);
        goto done;
    }
    if (rc != TV_E_NOT_FOUND)
        goto done;
    rc = tv__reg_exec(reg, "binding a shard to an object", err,
                      "INSERT INTO shard_objects (shard_id, object_id) VALUES (?1, ?2)", "ii",
                      shard_id, object_id);
done:
    return tv__reg_level_end(reg, rc, err);
}

/* ------------------------------------------------------------------------ */
/* Tensors                                                                  */
/* ------------------------------------------------------------------------ */

typedef struct shard_row {
    int64_t id;
    uint32_t idx;
    uint64_t data_len; /* file_len - 8 - header_len */
} shard_row;

static int read_shard_row(sqlite3_stmt *st, void *record, tv_error *err)
{
    (void)err;
    shard_row *s = record;
    s->id = sqlite3_column_int64(st, 0);
    s->idx = (uint32_t)sqlite3_column_int64(st, 1);
    uint64_t file_len = tv__reg_col_u64(st, 2), header_len = tv__reg_col_u64(st, 3);
    s->data_len = file_len - 8 - header_len; /* CHECK: header_len <= file_len - 8 */
    return 0;
}

static int load_shard_rows(tv__reg *reg, int64_t generation_id, tv__reg_vec *v, tv_error *err)
{
    return tv__reg_query_list(reg, v, read_shard_row, "loading shards", err,
                              "SELECT id, idx, file_len, header_len FROM shards "
                              "WHERE generation_id = ?1 ORDER BY idx",
                              "i", generation_id);
}

static const shard_row *find_shard(const tv__reg_vec *v, uint32_t idx)
{
    const shard_row *rows = v->items;
    if (idx < v->n && rows[idx].idx == idx) /* the usual, contiguous case */
        return &rows[idx];
    size_t lo = 0, hi = v->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (rows[mid].idx < idx)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < v->n && rows[lo].idx == idx ? &rows[lo] : NULL;
}

/* Formats a shape as a JSON array of integers. cap must hold
 * 2 + TV_ST_MAX_RANK * 21 bytes. */
static void format_shape(const uint64_t *shape, uint32_t rank, char *out, size_t cap)
{
    size_t o = 0;
    out[o++] = '[';
    for (uint32_t i = 0; i < rank; i++)
        o += (size_t)snprintf(out + o, cap - o, i ? ",%" PRIu64 : "%" PRIu64, shape[i]);
    out[o++] = ']';
    out[o] = '\0';
}

static int check_tensor(const tv_tensor_info *t, size_t i, const tv__reg_vec *shards,
                        const shard_row **row, tv_error *err)
{
    if (!t->name || !t->name_len || memchr(t->name, '\0', t->name_len) || t->name_len > INT32_MAX)
        return tv__seterr(err, TV_E_INVALID_ARG, "tensor %zu has an empty or NUL-containing name",
                          i);
    int nl = (int)(t->name_len > 200 ? 200 : t->name_len);
    if ((unsigned)t->dtype >= TV_DTYPE_COUNT)
        return tv__seterr(err, TV_E_INVALID_ARG, "tensor '%.*s': dtype %d out of range", nl,
                          t->name, (int)t->dtype);
    if (t->rank > TV_ST_MAX_RANK || (t->rank && !t->shape))
        return tv__seterr(err, TV_E_INVALID_ARG, "tensor '%.*s': rank %u over %d or no shape", nl,
                          t->name, t->rank, TV_ST_MAX_RANK);
    for (uint32_t d = 0; d < t->rank; d++)
        if (t->shape[d] > (uint64_t)INT64_MAX)
            return tv__seterr(err, TV_E_OVERFLOW,
                              "tensor '%.*s': dimension %u is %llu, over INT64_MAX", nl, t->name, d,
                              (unsigned long long)t->shape[d]);
    *row = find_shard(shards, t->shard);
    if (!*row)
        return tv__seterr(err, TV_E_NOT_FOUND,
                          "tensor '%.*s': no shard with idx %u in this generation", nl, t->name,
                          t->shard);
    if (t->end_off < t->begin_off || t->end_off > (*row)->data_len)
        return tv__seterr(
            err, TV_E_INVALID_ARG,
            "tensor '%.*s': [%llu, %llu) is not inside shard %u's %llu-byte data section", nl,
            t->name, (unsigned long long)t->begin_off, (unsigned long long)t->end_off, t->shard,
            (unsigned long long)(*row)->data_len);
    return 0;
}

int tv__reg_tensors_insert(tv__reg *reg, int64_t generation_id, const tv_tensor_info *t, size_t n,
                           tv_error *err)
{
    if (!reg || (!t && n))
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_tensors_insert: NULL argument");
    sqlite3_stmt *st = NULL;
    tv__reg_vec shards = {.size = sizeof(shard_row)};
    char shape[2 + TV_ST_MAX_RANK * 21 + 1];
    int rc = tv__reg_level_begin(reg, true, err);
    if (rc)
        return rc;
    if ((rc = require_importing(reg, generation_id, "adding tensors", err)) ||
        (rc = load_shard_rows(reg, generation_id, &shards, err)))
        goto done;
    rc = sqlite3_prepare_v3(reg->db,
                            "INSERT INTO tensors (generation_id, shard_id, name, dtype, shape, "
                            "begin_off, end_off) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                            -1, SQLITE_PREPARE_PERSISTENT, &st, NULL);
    if (rc != SQLITE_OK) {
        rc = tv__sqlerr(reg->db, err, rc, "preparing the tensor insert");
        goto done;
    }
    if ((rc = tv__reg_bind_i64(reg, st, 1, generation_id, err)))
        goto done;
    for (size_t i = 0; i < n; i++) {
        const shard_row *row = NULL;
        if ((rc = check_tensor(&t[i], i, &shards, &row, err)))
            goto done;
        format_shape(t[i].shape, t[i].rank, shape, sizeof shape);
        sqlite3_reset(st);
        if ((rc = tv__reg_bind_i64(reg, st, 2, row->id, err)) ||
            (rc = sqlite3_bind_text(st, 3, t[i].name, (int)t[i].name_len, SQLITE_STATIC)) ||
            (rc = tv__reg_bind_i64(reg, st, 4, (int64_t)t[i].dtype, err)) ||
            (rc = sqlite3_bind_text(st, 5, shape, -1, SQLITE_STATIC)) ||
            (rc = tv__reg_bind_u64(reg, st, 6, t[i].begin_off, "tensor begin", err)) ||
            (rc = tv__reg_bind_u64(reg, st, 7, t[i].end_off, "tensor end", err))) {
            if (rc > 0) /* a raw sqlite3_bind_text code */
                rc = tv__sqlerr(reg->db, err, rc, "binding a tensor");
            goto done;
        }
        if ((rc = tv__reg_step_done(reg, st, "inserting a tensor", err))) {
            if (rc == -EEXIST)
                tv__seterr(err, rc, "tensor '%.*s' appears twice in the generation",
                           (int)(t[i].name_len > 200 ? 200 : t[i].name_len), t[i].name);
            goto done;
        }
    }
done:
    sqlite3_finalize(st);
    free(shards.items);
    return tv__reg_level_end(reg, rc, err);
}

/* ------------------------------------------------------------------------ */
/* State changes                                                            */
/* ------------------------------------------------------------------------ */

static bool transition_allowed(tv__gen_state from, tv__gen_state to)
{
    switch (from) {
    case TV__GEN_IMPORTING:
        return to == TV__GEN_READY || to == TV__GEN_FAILED;
    case TV__GEN_READY:
    case TV__GEN_FAILED:
        return to == TV__GEN_RETIRED;
    default:
        return false;
    }
}

typedef struct complete_ctx {
    const char *model;
    int64_t number;
    int64_t expect; /* the next shard idx */
} complete_ctx;

static int check_shard_complete(sqlite3_stmt *st, void *arg, tv_error *err)
{
    complete_ctx *c = arg;
    int64_t idx = sqlite3_column_int64(st, 0);
    const char *name = (const char *)sqlite3_column_text(st, 1);
    int64_t n_obj = sqlite3_column_int64(st, 2), n_writing = sqlite3_column_int64(st, 3);
    int64_t n_bad = sqlite3_column_int64(st, 4);
    const char *why = idx != c->expect ? "is out of sequence (shard idx must be 0..n-1)"
                      : n_obj == 0     ? "has no object"
                      : n_writing      ? "is bound to an object still being written"
                      : n_bad          ? "is bound to an object with another hash"
                                       : NULL;
    if (why)
        return tv__seterr(err, TV_E_STATE,
                          "model '%s' generation %lld cannot be ready: shard %lld '%s' %s",
                          c->model, (long long)c->number, (long long)idx, name, why);
    c->expect++;
    return 0;
}

/* A generation may become ready only when complete: shards idx 0..n-1, each
 * bound to >= 1 committed object with its hash and to no writing one. */
static int check_complete(tv__reg *reg, int64_t generation_id, const char *model, int64_t number,
                          tv_error *err)
{
    complete_ctx c = {model, number, 0};
    int rc =
        tv__reg_query_each(reg, check_shard_complete, &c, "checking a generation's shards", err,
                           "SELECT s.idx, s.name, count(o.id), "
                           "  ifnull(sum(o.state = 'writing'), 0), "
                           "  ifnull(sum(o.state = 'committed' AND o.sha256 != s.sha256), 0) "
                           "FROM shards s LEFT JOIN shard_objects so ON so.shard_id = s.id "
                           "LEFT JOIN objects o ON o.id = so.object_id "
                           "WHERE s.generation_id = ?1 GROUP BY s.id ORDER BY s.idx",
                           "i", generation_id);
    if (rc == 0 && c.expect == 0)
        rc = tv__seterr(err, TV_E_STATE,
                        "model '%s' generation %lld cannot be ready: it has no shards", model,
                        (long long)number);
    return rc;
}

static int is_active(tv__reg *reg, int64_t generation_id, bool *active, tv_error *err)
{
    int64_t v = 0;
    int rc = tv__reg_query_one(reg, tv__reg_read_i64, &v, "reading models", err,
                               "SELECT m.active_generation IS g.number FROM generations g "
                               "JOIN models m ON m.id = g.model_id WHERE g.id = ?1",
                               "i", generation_id);
    if (rc == TV_E_NOT_FOUND)
        rc = 0;
    *active = rc == 0 && v != 0;
    return rc;
}

static int read_text_alias(sqlite3_stmt *st, void *record, tv_error *err)
{
    (void)err;
    tv__reg_col_text(st, 0, record, TV__ALIAS_MAX + 1);
    return 0;
}

/* TV_E_STATE naming the first alias that points at the generation. */
static int check_unaliased(tv__reg *reg, int64_t generation_id, const char *model, int64_t number,
                           tv_error *err)
{
    char alias[TV__ALIAS_MAX + 1] = "";
    int rc = tv__reg_query_one(reg, read_text_alias, alias, "reading aliases", err,
                               "SELECT a.name FROM aliases a JOIN generations g "
                               "ON g.model_id = a.model_id AND g.number = a.generation "
                               "WHERE g.id = ?1 ORDER BY a.name",
                               "i", generation_id);
    if (rc == TV_E_NOT_FOUND)
        return 0;
    if (rc)
        return rc;
    return tv__seterr(
        err, TV_E_STATE,
        "model '%s' generation %lld is aliased as '%s': move or remove the alias first", model,
        (long long)number, alias);
}

/* Called inside a level. */
static int set_state(tv__reg *reg, int64_t generation_id, tv__gen_state to, tv_error *err)
{
    if (!tv__gen_state_name(to))
        return tv__seterr(err, TV_E_INVALID_ARG, "generation state %d out of range", (int)to);
    tv__gen_state from;
    char model[TV__REG_NAME_MAX + 1];
    int64_t number = 0;
    bool active = false;
    int rc = gen_brief(reg, generation_id, &from, model, sizeof model, &number, err);
    if (rc || from == to)
        return rc;
    if (!transition_allowed(from, to))
        return tv__seterr(err, TV_E_STATE, "model '%s' generation %lld cannot go from %s to %s",
                          model, (long long)number, tv__gen_state_name(from),
                          tv__gen_state_name(to));
    if ((rc = is_active(reg, generation_id, &active, err)))
        return rc;
    if (active)
        return tv__seterr(err, TV_E_STATE,
                          "model '%s' generation %lld is active: activate another generation first",
                          model, (long long)number);
    if (to != TV__GEN_READY && (rc = check_unaliased(reg, generation_id, model, number, err)))
        return rc;
    if (to == TV__GEN_READY && (rc = check_complete(reg, generation_id, model, number, err)))
        return rc;
    rc = tv__reg_exec(reg, "changing a generation's state", err,
                      "UPDATE generations SET state = ?2 WHERE id = ?1", "it", generation_id,
                      tv__gen_state_name(to));
    if (rc == 0)
        tv__log(tv__reg_log_level(reg, 1), "registry: model '%s' generation %lld %s -> %s", model,
                (long long)number, tv__gen_state_name(from), tv__gen_state_name(to));
    return rc;
}

int tv__reg_generation_set_state(tv__reg *reg, int64_t generation_id, tv__gen_state state,
                                 tv_error *err)
{
    if (!reg)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_generation_set_state: NULL registry");
    int rc = tv__reg_level_begin(reg, true, err);
    if (rc)
        return rc;
    rc = set_state(reg, generation_id, state, err);
    return tv__reg_level_end(reg, rc, err);
}

int tv__reg_generation_activate(tv__reg *reg, const char *model, int64_t number, tv_error *err)
{
    if (!reg || !model)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_generation_activate: NULL argument");
    if (number <= 0)
        return tv__seterr(err, TV_E_INVALID_ARG, "generation number %lld: must be >= 1",
                          (long long)number);
    tv__reg_generation g;
    int64_t previous = 0;
    int rc = tv__reg_level_begin(reg, true, err);
    if (rc)
        return rc;
    if ((rc = tv__reg_generation_get(reg, model, number, &g, err)))
        goto done;
    if (g.state != TV__GEN_READY) {
        rc = tv__seterr(err, TV_E_STATE,
                        "model '%s' generation %lld is %s: only ready generations can be activated",
                        model, (long long)number, tv__gen_state_name(g.state));
        goto done;
    }
    if (g.active)
        goto done;
    if ((rc = tv__reg_active_generation(reg, model, &previous, NULL)) == TV_E_NOT_FOUND)
        previous = 0;
    if ((rc = tv__reg_exec(reg, "activating a generation", err,
                           "UPDATE models SET active_generation = ?2 WHERE id = ?1", "ii",
                           g.model_id, number)))
        goto done;
    tv__log(tv__reg_log_level(reg, 1), "registry: model '%s' active generation %lld -> %lld", model,
            (long long)previous, (long long)number);
done:
    return tv__reg_level_end(reg, rc, err);
}

int tv__reg_generation_deactivate(tv__reg *reg, const char *model, int64_t *was, tv_error *err)
{
    if (!reg || !model)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_generation_deactivate: NULL argument");
    int64_t previous = 0;
    int rc = tv__reg_level_begin(reg, true, err);
    if (rc)
        return rc;
    if ((rc = model_active(reg, model, &previous, "reading the active generation", err)))
        goto done;
    if (previous == 0)
        goto done; /* nothing active: nothing to change */
    if ((rc = tv__reg_exec(reg, "deactivating a model", err,
                           "UPDATE models SET active_generation = NULL WHERE name = ?1", "t",
                           model)))
        goto done;
    tv__log(tv__reg_log_level(reg, 1), "registry: model '%s' active generation %lld -> none", model,
            (long long)previous);
done:
    rc = tv__reg_level_end(reg, rc, err);
    if (rc == 0 && was)
        *was = previous;
    return rc;
}

int tv__reg_generation_retire(tv__reg *reg, const char *model, int64_t number, tv_error *err)
{
    if (!reg || !model)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_generation_retire: NULL argument");
    if (number <= 0)
        return tv__seterr(err, TV_E_INVALID_ARG, "generation number %lld: must be >= 1",
                          (long long)number);
    tv__reg_generation g;
    int rc = tv__reg_level_begin(reg, true, err);
    if (rc)
        return rc;
    if ((rc = tv__reg_generation_get(reg, model, number, &g, err)) == 0)
        rc = set_state(reg, g.id, TV__GEN_RETIRED, err);
    rc = tv__reg_level_end(reg, rc, err);
    if (!rc && reg->depth == 0)
        tv__crash_point("retire.commit");
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Listing a generation's manifest                                          */
/* ------------------------------------------------------------------------ */

typedef struct manifest_mem {
    char *arena; /* shard and tensor names, NUL-terminated */
    size_t arena_len;
    size_t arena_cap;
    tv__reg_vec replicas;
    size_t *replica_first; /* per shard: index of its first replica */
} manifest_mem;

/* Appends a string to the arena; returns its offset or SIZE_MAX. */
static size_t arena_add(manifest_mem *mm, const unsigned char *s, size_t len)
{
    uint64_t need;
    if (tv__add_u64(mm->arena_len, len, &need) || tv__add_u64(need, 1, &need) ||
        need > SIZE_MAX / 2)
        return SIZE_MAX;
    if (need > mm->arena_cap) {
        size_t cap = mm->arena_cap ? mm->arena_cap : 4096;
        while (cap < need)
            cap *= 2;
        char *p = realloc(mm->arena, cap);
        if (!p)
            return SIZE_MAX;
        mm->arena = p;
        mm->arena_cap = cap;
    }
    size_t off = mm->arena_len;
    if (len)
        memcpy(mm->arena + off, s, len);
    mm->arena[off + len] = '\0';
    mm->arena_len = (size_t)need;
    return off;
}

/* Parses a stored shape (a JSON array of non-negative integers) into
 * shape[TV_ST_MAX_RANK] and *rank. Returns 0 or TV_E_REGISTRY. */
int tv__reg_parse_shape(const char *text, uint64_t *shape, uint32_t *rank)
{
    json_error_t jerr;
    json_t *a = text ? json_loads(text, JSON_REJECT_DUPLICATES, &jerr) : NULL;
    int rc = TV_E_REGISTRY;
    if (!a || !json_is_array(a) || json_array_size(a) > TV_ST_MAX_RANK)
        goto done;
    *rank = (uint32_t)json_array_size(a);
    for (uint32_t i = 0; i < *rank; i++) {
        json_t *d = json_array_get(a, i);
        if (!json_is_integer(d) || json_integer_value(d) < 0)
            goto done;
        shape[i] = (uint64_t)json_integer_value(d);
    }
    rc = 0;
done:
    json_decref(a);
    return rc;
}

typedef struct manifest_ctx {
    tv__reg_manifest *m;
    manifest_mem *mm;
    tv__reg_vec *rows; /* shards or tensors being loaded */
} manifest_ctx;

#define MANIFEST_OOM "loading a manifest: out of memory"

static int read_manifest_shard(sqlite3_stmt *st, void *arg, tv_error *err)
{
    manifest_ctx *c = arg;
    tv__reg_shard *s = tv__reg_vec_push(c->rows);
    if (!s)
        return tv__seterr(err, -ENOMEM, MANIFEST_OOM);
    s->id = sqlite3_column_int64(st, 0);
    int64_t idx = sqlite3_column_int64(st, 1);
    if (idx != (int64_t)c->rows->n - 1)
        return tv__seterr(err, TV_E_REGISTRY,
                          "generation %lld: shard idx %lld out of sequence (expected %zu)",
                          (long long)c->m->generation.id, (long long)idx, c->rows->n - 1);
    s->idx = (uint32_t)idx;
    size_t off = arena_add(c->mm, sqlite3_column_text(st, 2), (size_t)sqlite3_column_bytes(st, 2));
    if (off == SIZE_MAX)
        return tv__seterr(err, -ENOMEM, MANIFEST_OOM);
    s->name = (const char *)(uintptr_t)off; /* fixed up once the arena stops moving */
    s->file_len = tv__reg_col_u64(st, 3);
    s->header_len = tv__reg_col_u64(st, 4);
    s->data_off = s->header_len + 8; /* CHECK: header_len <= file_len - 8 */
    tv__reg_col_text(st, 5, s->sha256, sizeof s->sha256);
    tv__reg_col_text(st, 6, s->header_sha256, sizeof s->header_sha256);
    return 0;
}

static int read_manifest_replica(sqlite3_stmt *st, void *arg, tv_error *err)
{
    manifest_ctx *c = arg;
    int64_t idx = sqlite3_column_int64(st, 0);
    tv__reg_replica *r = tv__reg_vec_push(&c->mm->replicas);
    if (!r)
        return tv__seterr(err, -ENOMEM, MANIFEST_OOM);
    if (idx < 0 || (uint64_t)idx >= c->m->n_shards) /* impossible after the shard pass */
        return tv__seterr(err, TV_E_REGISTRY, "replica of unknown shard idx %lld", (long long)idx);
    r->device_id = sqlite3_column_int64(st, 1);
    r->object_id = sqlite3_column_int64(st, 2);
    r->base_off = tv__reg_col_u64(st, 3);
    r->alloc_len = tv__reg_col_u64(st, 4);
    r->committed = !strcmp((const char *)sqlite3_column_text(st, 5), "committed");
    if (c->m->shards[idx].n_replicas++ == 0)
        c->mm->replica_first[idx] = c->mm->replicas.n - 1;
    return 0;
}

static int read_manifest_tensor(sqlite3_stmt *st, void *arg, tv_error *err)
{
    manifest_ctx *c = arg;
    tv__reg_tensor *t = tv__reg_vec_push(c->rows);
    if (!t)
        return tv__seterr(err, -ENOMEM, MANIFEST_OOM);
    t->name_len = (size_t)sqlite3_column_bytes(st, 0);
    size_t off = arena_add(c->mm, sqlite3_column_text(st, 0), t->name_len);
    if (off == SIZE_MAX)
        return tv__seterr(err, -ENOMEM, MANIFEST_OOM);
    t->name = (const char *)(uintptr_t)off;
    int64_t dtype = sqlite3_column_int64(st, 1);
    int64_t idx = sqlite3_column_int64(st, 3);
    const char *shape = (const char *)sqlite3_column_text(st, 2);
    if (dtype < 0 || dtype >= TV_DTYPE_COUNT || idx < 0 || (uint64_t)idx >= c->m->n_shards ||
        !shape || tv__reg_parse_shape(shape, t->shape, &t->rank))
        return tv__seterr(err, TV_E_REGISTRY,
                          "generation %lld: tensor '%.200s' has a corrupt dtype, shard or shape",
                          (long long)c->m->generation.id, c->mm->arena + off);
    t->dtype = (tv_dtype)dtype;
    t->shard_idx = (uint32_t)idx;
    t->begin_off = tv__reg_col_u64(st, 4);
    t->end_off = tv__reg_col_u64(st, 5);
    return 0;
}

static int load_manifest_shards(tv__reg *reg, tv__reg_manifest *m, manifest_mem *mm,
                                tv__reg_vec *shards, tv_error *err)
{
    manifest_ctx c = {m, mm, shards};
    return tv__reg_query_each(reg, read_manifest_shard, &c, "loading shards", err,
                              "SELECT id, idx, name, file_len, header_len, sha256, header_sha256 "
                              "FROM shards WHERE generation_id = ?1 ORDER BY idx",
                              "i", m->generation.id);
}

static int load_manifest_replicas(tv__reg *reg, tv__reg_manifest *m, manifest_mem *mm,
                                  tv_error *err)
{
    manifest_ctx c = {m, mm, NULL};
    return tv__reg_query_each(reg, read_manifest_replica, &c, "loading replicas", err,
                              "SELECT s.idx, o.device_id, o.id, o.base_off, o.alloc_len, o.state "
                              "FROM shard_objects so JOIN shards s ON s.id = so.shard_id "
                              "JOIN objects o ON o.id = so.object_id "
                              "WHERE s.generation_id = ?1 ORDER BY s.idx, o.device_id",
                              "i", m->generation.id);
}

static int load_manifest_tensors(tv__reg *reg, tv__reg_manifest *m, manifest_mem *mm,
                                 tv__reg_vec *tensors, tv_error *err)
{
    manifest_ctx c = {m, mm, tensors};
    return tv__reg_query_each(reg, read_manifest_tensor, &c, "loading tensors", err,
                              "SELECT t.name, t.dtype, t.shape, s.idx, t.begin_off, t.end_off "
                              "FROM tensors t JOIN shards s ON s.id = t.shard_id "
                              "WHERE t.generation_id = ?1 ORDER BY s.idx, t.begin_off, t.name",
                              "i", m->generation.id);
}

void tv__reg_manifest_free(tv__reg_manifest *m)
{
    if (!m)
        return;
    manifest_mem *mm = m->mem_;
    if (mm) {
        free(mm->arena);
        free(mm->replicas.items);
        free(mm->replica_first);
        free(mm);
    }
    free(m->shards);
    free(m->tensors);
    free(m);
}

static int load_manifest(tv__reg *reg, int64_t generation_id, bool with_tensors,
                         tv__reg_manifest **out, tv_error *err)
{
    if (!reg || !out)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_tensors_list: NULL argument");
    *out = NULL;
    tv__reg_manifest *m = calloc(1, sizeof *m);
    manifest_mem *mm = calloc(1, sizeof *mm);
    tv__reg_vec shards = {.size = sizeof(tv__reg_shard)};
    tv__reg_vec tensors = {.size = sizeof(tv__reg_tensor)};
    int rc;
    if (!m || !mm) {
        free(m);
        free(mm);
        return tv__seterr(err, -ENOMEM, "loading a manifest: out of memory");
    }
    m->mem_ = mm;
    mm->replicas.size = sizeof(tv__reg_replica);
    if ((rc = tv__reg_level_begin(reg, false, err)))
        goto fail;
    if ((rc = tv__reg_generation_get_by_id(reg, generation_id, &m->generation, err)) ||
        (rc = load_manifest_shards(reg, m, mm, &shards, err)))
        goto fail_level;
    m->shards = shards.items;
    m->n_shards = shards.n;
    shards.items = NULL;
    if (m->n_shards && !(mm->replica_first = calloc(m->n_shards, sizeof(size_t)))) {
        rc = tv__seterr(err, -ENOMEM, "loading a manifest: out of memory");
        goto fail_level;
    }
    if ((rc = load_manifest_replicas(reg, m, mm, err)) ||
        (with_tensors && (rc = load_manifest_tensors(reg, m, mm, &tensors, err))))
        goto fail_level;
    m->tensors = tensors.items;
    m->n_tensors = tensors.n;
    tensors.items = NULL;
    if ((rc = tv__reg_level_end(reg, 0, err)))
        goto fail;
    /* The arena and replica array no longer move: turn offsets into pointers. */
    const tv__reg_replica *reps = mm->replicas.items;
    for (size_t i = 0; i < m->n_shards; i++) {
        m->shards[i].name = mm->arena + (uintptr_t)m->shards[i].name;
        m->shards[i].replicas = m->shards[i].n_replicas ? reps + mm->replica_first[i] : NULL;
    }
    for (size_t i = 0; i < m->n_tensors; i++)
        m->tensors[i].name = mm->arena + (uintptr_t)m->tensors[i].name;
    *out = m;
    return 0;

fail_level:
    tv__reg_level_end(reg, rc, err);
fail:
    free(shards.items);
    free(tensors.items);
    tv__reg_manifest_free(m);
    return rc;
}

int tv__reg_tensors_list(tv__reg *reg, int64_t generation_id, tv__reg_manifest **out, tv_error *err)
{
    return load_manifest(reg, generation_id, true, out, err);
}

int tv__reg_shards_list(tv__reg *reg, int64_t generation_id, tv__reg_manifest **out, tv_error *err)
{
    return load_manifest(reg, generation_id, false, out, err);
}
