/* Models and generations: numbering, shards and their object bindings,
 * tensor metadata (bulk insert and listing), state changes, activation,
 * rollback and retirement.
 *
 * Invariants: generation numbers come from models.last_generation, bumped
 * in the creating transaction, so they are never reused; a generation
 * becomes ready only with shards idx 0..n-1, each bound to at least one
 * committed object of its length and hash and to no 'writing' one; the
 * active generation changes in a single UPDATE of models.active_generation,
 * so a reader sees the old or the new one and never neither; every change
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
    for (size_t i = 0; s && i < TV_ARRAY_LEN(g_gen_states); i++)
        if (!strcmp(s, g_gen_states[i])) {
            *out = (tv__gen_state)i;
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
    "(SELECT count(*) FROM tensors t WHERE t.generation_id = g.id), g.created_at "                 \
    "FROM generations g JOIN models m ON m.id = g.model_id "

static void read_generation(sqlite3_stmt *st, void *record)
{
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
}

int tv__reg_generation_get_by_id(tv__reg *reg, int64_t generation_id, tv__reg_generation *out,
                                 tv_error *err)
{
    if (!reg || !out)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_generation_get_by_id: NULL argument");
    sqlite3_stmt *st = NULL;
    int rc = tv__reg_prepare(reg, GEN_SELECT "WHERE g.id = ?1", &st, err);
    if (rc)
        return rc;
    if ((rc = tv__reg_bind_i64(reg, st, 1, generation_id, err)))
        goto done;
    rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        read_generation(st, out);
        rc = 0;
    } else if (rc == SQLITE_DONE) {
        rc =
            tv__seterr(err, TV_E_NOT_FOUND, "no generation with id %lld", (long long)generation_id);
    } else {
        rc = tv__sqlerr(reg->db, err, rc, "reading a generation");
    }
done:
    sqlite3_finalize(st);
    return rc;
}

/* Why (model, number) matched nothing: no model, no active generation, or
 * no such number. Always returns TV_E_NOT_FOUND (or a lookup error). */
static int not_found(tv__reg *reg, const char *model, int64_t number, tv_error *err)
{
    sqlite3_stmt *st = NULL;
    int rc = tv__reg_prepare(reg, "SELECT active_generation FROM models WHERE name = ?1", &st, err);
    if (rc)
        return rc;
    if ((rc = tv__reg_bind_text(reg, st, 1, model, err)))
        goto done;
    rc = sqlite3_step(st);
    if (rc == SQLITE_DONE)
        rc = tv__seterr(err, TV_E_NOT_FOUND, "no model named '%s'", model);
    else if (rc != SQLITE_ROW)
        rc = tv__sqlerr(reg->db, err, rc, "looking up a model");
    else if (number == 0)
        rc = tv__seterr(err, TV_E_NOT_FOUND, "model '%s' has no active generation", model);
    else
        rc = tv__seterr(err, TV_E_NOT_FOUND, "model '%s' has no generation %lld", model,
                        (long long)number);
done:
    sqlite3_finalize(st);
    return rc;
}

int tv__reg_generation_get(tv__reg *reg, const char *model, int64_t number, tv__reg_generation *out,
                           tv_error *err)
{
    if (!reg || !model || !out)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_generation_get: NULL argument");
    if (number < 0)
        return tv__seterr(err, TV_E_INVALID_ARG, "generation number %lld is negative",
                          (long long)number);
    sqlite3_stmt *st = NULL;
    int rc = tv__reg_prepare(reg,
                             GEN_SELECT "WHERE m.name = ?1 AND g.number = "
                                        "CASE WHEN ?2 = 0 THEN m.active_generation ELSE ?2 END",
                             &st, err);
    if (rc)
        return rc;
    if ((rc = tv__reg_bind_text(reg, st, 1, model, err)) ||
        (rc = tv__reg_bind_i64(reg, st, 2, number, err)))
        goto done;
    rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        read_generation(st, out);
        rc = 0;
    } else if (rc == SQLITE_DONE) {
        rc = not_found(reg, model, number, err);
    } else {
        rc = tv__sqlerr(reg->db, err, rc, "reading a generation");
    }
done:
    sqlite3_finalize(st);
    return rc;
}

int tv__reg_active_generation(tv__reg *reg, const char *model, int64_t *number, tv_error *err)
{
    if (!reg || !model || !number)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_active_generation: NULL argument");
    sqlite3_stmt *st = NULL;
    int rc = tv__reg_prepare(reg, "SELECT active_generation FROM models WHERE name = ?1", &st, err);
    if (rc)
        return rc;
    if ((rc = tv__reg_bind_text(reg, st, 1, model, err)))
        goto done;
    rc = sqlite3_step(st);
    if (rc == SQLITE_ROW && sqlite3_column_type(st, 0) != SQLITE_NULL) {
        *number = sqlite3_column_int64(st, 0);
        rc = 0;
    } else if (rc == SQLITE_ROW) {
        rc = tv__seterr(err, TV_E_NOT_FOUND, "model '%s' has no active generation", model);
    } else if (rc == SQLITE_DONE) {
        rc = tv__seterr(err, TV_E_NOT_FOUND, "no model named '%s'", model);
    } else {
        rc = tv__sqlerr(reg->db, err, rc, "reading the active generation");
    }
done:
    sqlite3_finalize(st);
    return rc;
}

static void read_model(sqlite3_stmt *st, void *record)
{
    tv__reg_model *m = record;
    m->id = sqlite3_column_int64(st, 0);
    tv__reg_col_text(st, 1, m->name, sizeof m->name);
    m->active_generation = sqlite3_column_int64(st, 2);
    m->n_generations = sqlite3_column_int64(st, 3);
    m->created_at = sqlite3_column_int64(st, 4);
}

int tv__reg_models_list(tv__reg *reg, tv__reg_model **out, size_t *n, tv_error *err)
{
    if (!reg || !out || !n)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_models_list: NULL argument");
    *out = NULL;
    *n = 0;
    sqlite3_stmt *st = NULL;
    tv__reg_vec v = {.size = sizeof(tv__reg_model)};
    int rc = tv__reg_prepare(reg,
                             "SELECT m.id, m.name, ifnull(m.active_generation, 0), "
                             "(SELECT count(*) FROM generations g WHERE g.model_id = m.id), "
                             "m.created_at FROM models m ORDER BY m.name",
                             &st, err);
    if (rc)
        return rc;
    if ((rc = tv__reg_collect(reg, st, &v, read_model, "listing models", err)))
        goto fail;
    sqlite3_finalize(st);
    *out = v.items;
    *n = v.n;
    return 0;
fail:
    sqlite3_finalize(st);
    free(v.items);
    return rc;
}

int tv__reg_generations_list(tv__reg *reg, const char *model, tv__reg_generation **out, size_t *n,
                             tv_error *err)
{
    if (!reg || !model || !out || !n)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_generations_list: NULL argument");
    *out = NULL;
    *n = 0;
    sqlite3_stmt *st = NULL;
    tv__reg_vec v = {.size = sizeof(tv__reg_generation)};
    int rc = tv__reg_level_begin(reg, false, err);
    if (rc)
        return rc;
    if ((rc = tv__reg_prepare(reg, GEN_SELECT "WHERE m.name = ?1 ORDER BY g.number", &st, err)) ||
        (rc = tv__reg_bind_text(reg, st, 1, model, err)))
        goto done;
    if ((rc = tv__reg_collect(reg, st, &v, read_generation, "listing generations", err)))
        goto done;
    /* A model row is created with its first generation, so no rows means
     * no model. */
    rc = v.n ? 0 : tv__seterr(err, TV_E_NOT_FOUND, "no model named '%s'", model);
done:
    sqlite3_finalize(st);
    rc = tv__reg_level_end(reg, rc, err);
    if (rc == 0) {
        *out = v.items;
        *n = v.n;
    } else {
        free(v.items);
    }
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Creating generations, shards, bindings                                   */
/* ------------------------------------------------------------------------ */

int tv__reg_generation_create(tv__reg *reg, const char *model, const char *source,
                              uint64_t total_bytes, tv__reg_generation *out, tv_error *err)
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
    sqlite3_stmt *st = NULL;
    int64_t model_id = 0, number = 0, gen_id = 0;
    if ((rc = tv__reg_level_begin(reg, true, err)))
        return rc;
    if ((rc = tv__reg_prepare(reg, "INSERT INTO models (name) VALUES (?1) ON CONFLICT DO NOTHING",
                              &st, err)) ||
        (rc = tv__reg_bind_text(reg, st, 1, model, err)) ||
        (rc = tv__reg_step_done(reg, st, "creating a model", err)))
        goto done;
    sqlite3_finalize(st);
    if ((rc = tv__reg_prepare(reg,
                              "UPDATE models SET last_generation = last_generation + 1 "
                              "WHERE name = ?1 RETURNING id, last_generation",
                              &st, err)) ||
        (rc = tv__reg_bind_text(reg, st, 1, model, err)))
        goto done;
    rc = sqlite3_step(st);
    if (rc != SQLITE_ROW) {
        rc = tv__sqlerr(reg->db, err, rc, "numbering a generation");
        goto done;
    }
    model_id = sqlite3_column_int64(st, 0);
    number = sqlite3_column_int64(st, 1);
    if ((rc = tv__reg_step_done(reg, st, "numbering a generation", err)))
        goto done;
    sqlite3_finalize(st);
    if ((rc = tv__reg_prepare(reg,
                              "INSERT INTO generations (model_id, number, source, total_bytes) "
                              "VALUES (?1, ?2, ?3, ?4)",
                              &st, err)) ||
        (rc = tv__reg_bind_i64(reg, st, 1, model_id, err)) ||
        (rc = tv__reg_bind_i64(reg, st, 2, number, err)) ||
        (rc = tv__reg_bind_text(reg, st, 3, source, err)) ||
        (rc = tv__reg_bind_u64(reg, st, 4, total_bytes, "total_bytes", err)) ||
        (rc = tv__reg_step_done(reg, st, "creating a generation", err)))
        goto done;
    gen_id = sqlite3_last_insert_rowid(reg->db);
    if (out)
        rc = tv__reg_generation_get_by_id(reg, gen_id, out, err);
done:
    sqlite3_finalize(st);
    rc = tv__reg_level_end(reg, rc, err);
    if (rc == 0)
        tv__log(tv__reg_log_level(reg, 0), "registry: model '%s' generation %lld created", model,
                (long long)number);
    return rc;
}

/* State, model name and number of a generation, cheaply (no counts). */
static int gen_brief(tv__reg *reg, int64_t generation_id, tv__gen_state *state, char *model,
                     size_t model_cap, int64_t *number, tv_error *err)
{
    sqlite3_stmt *st = NULL;
    int rc = tv__reg_prepare(reg,
                             "SELECT g.state, m.name, g.number FROM generations g "
                             "JOIN models m ON m.id = g.model_id WHERE g.id = ?1",
                             &st, err);
    if (rc)
        return rc;
    if ((rc = tv__reg_bind_i64(reg, st, 1, generation_id, err)))
        goto done;
    rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        rc = tv__reg_gen_state_from_text(sqlite3_column_text(st, 0), state);
        if (rc)
            rc = tv__seterr(err, TV_E_REGISTRY, "generation %lld has an unknown state",
                            (long long)generation_id);
        tv__reg_col_text(st, 1, model, model_cap);
        *number = sqlite3_column_int64(st, 2);
    } else if (rc == SQLITE_DONE) {
        rc =
            tv__seterr(err, TV_E_NOT_FOUND, "no generation with id %lld", (long long)generation_id);
    } else {
        rc = tv__sqlerr(reg->db, err, rc, "reading a generation");
    }
done:
    sqlite3_finalize(st);
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
                          "shard '%s': sha256 values must be 64 lower-case hex digits",
                          in->name);
    sqlite3_stmt *st = NULL;
    if ((rc = tv__reg_level_begin(reg, true, err)))
        return rc;
    if ((rc = require_importing(reg, generation_id, "adding a shard", err)))
        goto done;
    if ((rc = tv__reg_prepare(reg,
                              "INSERT INTO shards (generation_id, idx, name, file_len, header_len, "
                              "sha256, header_sha256) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                              &st, err)) ||
        (rc = tv__reg_bind_i64(reg, st, 1, generation_id, err)) ||
        (rc = tv__reg_bind_i64(reg, st, 2, in->idx, err)) ||
        (rc = tv__reg_bind_text(reg, st, 3, in->name, err)) ||
        (rc = tv__reg_bind_u64(reg, st, 4, in->file_len, "shard file_len", err)) ||
        (rc = tv__reg_bind_u64(reg, st, 5, in->header_len, "shard header_len", err)) ||
        (rc = tv__reg_bind_text(reg, st, 6, in->sha256_hex, err)) ||
        (rc = tv__reg_bind_text(reg, st, 7, in->header_sha256_hex, err)))
        goto done;
    if ((rc = tv__reg_step_done(reg, st, "adding a shard", err))) {
        if (rc == -EEXIST)
            tv__seterr(err, rc, "generation %lld already has a shard with idx %u or name '%s'",
                       (long long)generation_id, in->idx, in->name);
        goto done;
    }
    if (shard_id)
        *shard_id = sqlite3_last_insert_rowid(reg->db);
done:
    sqlite3_finalize(st);
    return tv__reg_level_end(reg, rc, err);
}

int tv__reg_shard_bind(tv__reg *reg, int64_t shard_id, int64_t object_id, tv_error *err)
{
    if (!reg)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_shard_bind: NULL registry");
    sqlite3_stmt *st = NULL;
    tv__reg_object o;
    int rc = tv__reg_level_begin(reg, true, err);
    if (rc)
        return rc;
    if ((rc = tv__reg_prepare(reg,
                              "SELECT generation_id, name, file_len, sha256 FROM shards "
                              "WHERE id = ?1",
                              &st, err)) ||
        (rc = tv__reg_bind_i64(reg, st, 1, shard_id, err)))
        goto done;
    rc = sqlite3_step(st);
    if (rc != SQLITE_ROW) {
        rc = rc == SQLITE_DONE
                 ? tv__seterr(err, TV_E_NOT_FOUND, "no shard with id %lld", (long long)shard_id)
                 : tv__sqlerr(reg->db, err, rc, "reading a shard");
        goto done;
    }
    int64_t gen_id = sqlite3_column_int64(st, 0);
    char name[TV__REG_PATH_MAX], sha[TV__REG_SHA256_HEX_LEN + 1];
    tv__reg_col_text(st, 1, name, sizeof name);
    uint64_t file_len = tv__reg_col_u64(st, 2);
    tv__reg_col_text(st, 3, sha, sizeof sha);
    sqlite3_finalize(st);
    st = NULL;
    if ((rc = require_importing(reg, gen_id, "binding a shard", err)) ||
        (rc = tv__reg_object_get(reg, object_id, &o, err)))
        goto done;
    if (o.canonical_len != file_len) {
        rc = tv__seterr(err, TV_E_INVALID_ARG,
                        "shard '%s' is %llu bytes but object %lld holds %llu",
                        name, (unsigned long long)file_len, (long long)object_id,
                        (unsigned long long)o.canonical_len);
        goto done;
    }
    if (o.state == TV__OBJ_COMMITTED && strcmp(o.sha256, sha)) {
        rc = tv__seterr(err, TV_E_HASH_MISMATCH,
                        "shard '%s' has sha256 %s but object %lld holds %s",
                        name, sha, (long long)object_id, o.sha256);
        goto done;
    }
    if ((rc = tv__reg_prepare(reg,
                              "SELECT o.id FROM shard_objects so JOIN objects o "
                              "ON o.id = so.object_id WHERE so.shard_id = ?1 AND o.device_id = ?2",
                              &st, err)) ||
        (rc = tv__reg_bind_i64(reg, st, 1, shard_id, err)) ||
        (rc = tv__reg_bind_i64(reg, st, 2, o.device_id, err)))
        goto done;
    rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        rc = tv__seterr(err, -EEXIST, "shard '%s' is already bound to object %lld on device %lld",
                        name, (long long)sqlite3_column_int64(st, 0), (long long)o.device_id);
        goto done;
    }
    if (rc != SQLITE_DONE) {
        rc = tv__sqlerr(reg->db, err, rc, "reading shard bindings");
        goto done;
    }
    sqlite3_finalize(st);
    if ((rc = tv__reg_prepare(
             reg, "INSERT INTO shard_objects (shard_id, object_id) VALUES (?1, ?2)", &st, err)) ||
        (rc = tv__reg_bind_i64(reg, st, 1, shard_id, err)) ||
        (rc = tv__reg_bind_i64(reg, st, 2, object_id, err)) ||
        (rc = tv__reg_step_done(reg, st, "binding a shard to an object", err)))
        goto done;
done:
    sqlite3_finalize(st);
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

static int load_shard_rows(tv__reg *reg, int64_t generation_id, tv__reg_vec *v, tv_error *err)
{
    sqlite3_stmt *st = NULL;
    int rc = tv__reg_prepare(reg,
                             "SELECT id, idx, file_len, header_len FROM shards "
                             "WHERE generation_id = ?1 ORDER BY idx",
                             &st, err);
    if (rc)
        return rc;
    if ((rc = tv__reg_bind_i64(reg, st, 1, generation_id, err)))
        goto done;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        shard_row *s = tv__reg_vec_push(v);
        if (!s) {
            rc = tv__seterr(err, -ENOMEM, "loading shards: out of memory");
            goto done;
        }
        s->id = sqlite3_column_int64(st, 0);
        s->idx = (uint32_t)sqlite3_column_int64(st, 1);
        uint64_t file_len = tv__reg_col_u64(st, 2), header_len = tv__reg_col_u64(st, 3);
        s->data_len = file_len - 8 - header_len; /* CHECK: header_len <= file_len - 8 */
    }
    rc = rc == SQLITE_DONE ? 0 : tv__sqlerr(reg->db, err, rc, "loading shards");
done:
    sqlite3_finalize(st);
    return rc;
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
                              "tensor '%.*s': dimension %u is %llu, over INT64_MAX",
                              nl, t->name, d, (unsigned long long)t->shape[d]);
    *row = find_shard(shards, t->shard);
    if (!*row)
        return tv__seterr(err, TV_E_NOT_FOUND,
                          "tensor '%.*s': no shard with idx %u in this generation",
                          nl, t->name, t->shard);
    if (t->end_off < t->begin_off || t->end_off > (*row)->data_len)
        return tv__seterr(err, TV_E_INVALID_ARG,
                          "tensor '%.*s': [%llu, %llu) is not inside shard %u's %llu-byte data section",
                          nl, t->name, (unsigned long long)t->begin_off,
                          (unsigned long long)t->end_off, t->shard,
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

/* A generation may become ready only when complete: shards idx 0..n-1, each
 * bound to >= 1 committed object with its hash and to no writing one. */
static int check_complete(tv__reg *reg, int64_t generation_id, const char *model, int64_t number,
                          tv_error *err)
{
    sqlite3_stmt *st = NULL;
    int rc = tv__reg_prepare(reg,
                             "SELECT s.idx, s.name, count(o.id), "
                             "  ifnull(sum(o.state = 'writing'), 0), "
                             "  ifnull(sum(o.state = 'committed' AND o.sha256 != s.sha256), 0) "
                             "FROM shards s LEFT JOIN shard_objects so ON so.shard_id = s.id "
                             "LEFT JOIN objects o ON o.id = so.object_id "
                             "WHERE s.generation_id = ?1 GROUP BY s.id ORDER BY s.idx",
                             &st, err);
    if (rc)
        return rc;
    if ((rc = tv__reg_bind_i64(reg, st, 1, generation_id, err)))
        goto done;
    int64_t expect = 0;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        int64_t idx = sqlite3_column_int64(st, 0);
        const char *name = (const char *)sqlite3_column_text(st, 1);
        int64_t n_obj = sqlite3_column_int64(st, 2), n_writing = sqlite3_column_int64(st, 3);
        int64_t n_bad = sqlite3_column_int64(st, 4);
        const char *why = idx != expect ? "is out of sequence (shard idx must be 0..n-1)"
                          : n_obj == 0  ? "has no object"
                          : n_writing   ? "is bound to an object still being written"
                          : n_bad       ? "is bound to an object with another hash"
                                        : NULL;
        if (why) {
            rc = tv__seterr(err, TV_E_STATE,
                            "model '%s' generation %lld cannot be ready: shard %lld '%s' %s",
                            model, (long long)number, (long long)idx, name, why);
            goto done;
        }
        expect++;
    }
    if (rc != SQLITE_DONE) {
        rc = tv__sqlerr(reg->db, err, rc, "checking a generation's shards");
        goto done;
    }
    rc = expect ? 0
                : tv__seterr(err, TV_E_STATE,
                             "model '%s' generation %lld cannot be ready: it has no shards",
                             model, (long long)number);
done:
    sqlite3_finalize(st);
    return rc;
}

static int is_active(tv__reg *reg, int64_t generation_id, bool *active, tv_error *err)
{
    sqlite3_stmt *st = NULL;
    int rc = tv__reg_prepare(reg,
                             "SELECT m.active_generation IS g.number FROM generations g "
                             "JOIN models m ON m.id = g.model_id WHERE g.id = ?1",
                             &st, err);
    if (rc)
        return rc;
    if ((rc = tv__reg_bind_i64(reg, st, 1, generation_id, err)) == 0) {
        rc = sqlite3_step(st);
        *active = rc == SQLITE_ROW && sqlite3_column_int(st, 0);
        rc = rc == SQLITE_ROW || rc == SQLITE_DONE ? 0
                                                   : tv__sqlerr(reg->db, err, rc, "reading models");
    }
    sqlite3_finalize(st);
    return rc;
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
    if (to == TV__GEN_READY && (rc = check_complete(reg, generation_id, model, number, err)))
        return rc;
    sqlite3_stmt *st = NULL;
    if ((rc = tv__reg_prepare(reg, "UPDATE generations SET state = ?2 WHERE id = ?1", &st, err)) ==
            0 &&
        (rc = tv__reg_bind_i64(reg, st, 1, generation_id, err)) == 0 &&
        (rc = tv__reg_bind_text(reg, st, 2, tv__gen_state_name(to), err)) == 0)
        rc = tv__reg_step_done(reg, st, "changing a generation's state", err);
    sqlite3_finalize(st);
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
    sqlite3_stmt *st = NULL;
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
    if ((rc = tv__reg_prepare(reg, "UPDATE models SET active_generation = ?2 WHERE id = ?1", &st,
                              err)) ||
        (rc = tv__reg_bind_i64(reg, st, 1, g.model_id, err)) ||
        (rc = tv__reg_bind_i64(reg, st, 2, number, err)) ||
        (rc = tv__reg_step_done(reg, st, "activating a generation", err)))
        goto done;
    tv__log(tv__reg_log_level(reg, 1), "registry: model '%s' active generation %lld -> %lld", model,
            (long long)previous, (long long)number);
done:
    sqlite3_finalize(st);
    rc = tv__reg_level_end(reg, rc, err);
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

/* Parses a stored shape (a JSON array of non-negative integers). */
static int parse_shape(const char *text, tv__reg_tensor *t)
{
    json_error_t jerr;
    json_t *a = json_loads(text, JSON_REJECT_DUPLICATES, &jerr);
    int rc = TV_E_REGISTRY;
    if (!a || !json_is_array(a) || json_array_size(a) > TV_ST_MAX_RANK)
        goto done;
    t->rank = (uint32_t)json_array_size(a);
    for (uint32_t i = 0; i < t->rank; i++) {
        json_t *d = json_array_get(a, i);
        if (!json_is_integer(d) || json_integer_value(d) < 0)
            goto done;
        t->shape[i] = (uint64_t)json_integer_value(d);
    }
    rc = 0;
done:
    json_decref(a);
    return rc;
}

static int load_manifest_shards(tv__reg *reg, tv__reg_manifest *m, manifest_mem *mm,
                                tv__reg_vec *shards, tv_error *err)
{
    sqlite3_stmt *st = NULL;
    int rc = tv__reg_prepare(reg,
                             "SELECT id, idx, name, file_len, header_len, sha256, header_sha256 "
                             "FROM shards WHERE generation_id = ?1 ORDER BY idx",
                             &st, err);
    if (rc)
        return rc;
    if ((rc = tv__reg_bind_i64(reg, st, 1, m->generation.id, err)))
        goto done;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        tv__reg_shard *s = tv__reg_vec_push(shards);
        if (!s) {
            rc = tv__seterr(err, -ENOMEM, "loading a manifest: out of memory");
            goto done;
        }
        s->id = sqlite3_column_int64(st, 0);
        int64_t idx = sqlite3_column_int64(st, 1);
        if (idx != (int64_t)shards->n - 1) {
            rc = tv__seterr(err, TV_E_REGISTRY,
                            "generation %lld: shard idx %lld out of sequence (expected %zu)",
                            (long long)m->generation.id, (long long)idx, shards->n - 1);
            goto done;
        }
        s->idx = (uint32_t)idx;
        size_t off = arena_add(mm, sqlite3_column_text(st, 2), (size_t)sqlite3_column_bytes(st, 2));
        if (off == SIZE_MAX) {
            rc = tv__seterr(err, -ENOMEM, "loading a manifest: out of memory");
            goto done;
        }
        s->name = (const char *)(uintptr_t)off; /* fixed up once the arena stops moving */
        s->file_len = tv__reg_col_u64(st, 3);
        s->header_len = tv__reg_col_u64(st, 4);
        s->data_off = s->header_len + 8; /* CHECK: header_len <= file_len - 8 */
        tv__reg_col_text(st, 5, s->sha256, sizeof s->sha256);
        tv__reg_col_text(st, 6, s->header_sha256, sizeof s->header_sha256);
    }
    rc = rc == SQLITE_DONE ? 0 : tv__sqlerr(reg->db, err, rc, "loading shards");
done:
    sqlite3_finalize(st);
    return rc;
}

static int load_manifest_replicas(tv__reg *reg, tv__reg_manifest *m, manifest_mem *mm,
                                  tv_error *err)
{
    sqlite3_stmt *st = NULL;
    int rc = tv__reg_prepare(reg,
                             "SELECT s.idx, o.device_id, o.id, o.base_off, o.alloc_len, o.state "
                             "FROM shard_objects so JOIN shards s ON s.id = so.shard_id "
                             "JOIN objects o ON o.id = so.object_id "
                             "WHERE s.generation_id = ?1 ORDER BY s.idx, o.device_id",
                             &st, err);
    if (rc)
        return rc;
    if ((rc = tv__reg_bind_i64(reg, st, 1, m->generation.id, err)))
        goto done;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        int64_t idx = sqlite3_column_int64(st, 0);
        tv__reg_replica *r = tv__reg_vec_push(&mm->replicas);
        if (!r) {
            rc = tv__seterr(err, -ENOMEM, "loading a manifest: out of memory");
            goto done;
        }
        if (idx < 0 || (uint64_t)idx >= m->n_shards) { /* impossible after the shard pass */
            rc =
                tv__seterr(err, TV_E_REGISTRY, "replica of unknown shard idx %lld", (long long)idx);
            goto done;
        }
        r->device_id = sqlite3_column_int64(st, 1);
        r->object_id = sqlite3_column_int64(st, 2);
        r->base_off = tv__reg_col_u64(st, 3);
        r->alloc_len = tv__reg_col_u64(st, 4);
        r->committed = !strcmp((const char *)sqlite3_column_text(st, 5), "committed");
        if (m->shards[idx].n_replicas++ == 0)
            mm->replica_first[idx] = mm->replicas.n - 1;
    }
    rc = rc == SQLITE_DONE ? 0 : tv__sqlerr(reg->db, err, rc, "loading replicas");
done:
    sqlite3_finalize(st);
    return rc;
}

static int load_manifest_tensors(tv__reg *reg, tv__reg_manifest *m, manifest_mem *mm,
                                 tv__reg_vec *tensors, tv_error *err)
{
    sqlite3_stmt *st = NULL;
    int rc = tv__reg_prepare(reg,
                             "SELECT t.name, t.dtype, t.shape, s.idx, t.begin_off, t.end_off "
                             "FROM tensors t JOIN shards s ON s.id = t.shard_id "
                             "WHERE t.generation_id = ?1 ORDER BY s.idx, t.begin_off, t.name",
                             &st, err);
    if (rc)
        return rc;
    if ((rc = tv__reg_bind_i64(reg, st, 1, m->generation.id, err)))
        goto done;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        tv__reg_tensor *t = tv__reg_vec_push(tensors);
        if (!t) {
            rc = tv__seterr(err, -ENOMEM, "loading a manifest: out of memory");
            goto done;
        }
        t->name_len = (size_t)sqlite3_column_bytes(st, 0);
        size_t off = arena_add(mm, sqlite3_column_text(st, 0), t->name_len);
        if (off == SIZE_MAX) {
            rc = tv__seterr(err, -ENOMEM, "loading a manifest: out of memory");
            goto done;
        }
        t->name = (const char *)(uintptr_t)off;
        int64_t dtype = sqlite3_column_int64(st, 1);
        int64_t idx = sqlite3_column_int64(st, 3);
        const char *shape = (const char *)sqlite3_column_text(st, 2);
        if (dtype < 0 || dtype >= TV_DTYPE_COUNT || idx < 0 || (uint64_t)idx >= m->n_shards ||
            !shape || parse_shape(shape, t)) {
            rc = tv__seterr(err, TV_E_REGISTRY,
                            "generation %lld: tensor '%.200s' has a corrupt dtype, shard or shape",
                            (long long)m->generation.id, mm->arena + off);
            goto done;
        }
        t->dtype = (tv_dtype)dtype;
        t->shard_idx = (uint32_t)idx;
        t->begin_off = tv__reg_col_u64(st, 4);
        t->end_off = tv__reg_col_u64(st, 5);
    }
    rc = rc == SQLITE_DONE ? 0 : tv__sqlerr(reg->db, err, rc, "loading tensors");
done:
    sqlite3_finalize(st);
    return rc;
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

int tv__reg_tensors_list(tv__reg *reg, int64_t generation_id, tv__reg_manifest **out, tv_error *err)
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
        (rc = load_manifest_tensors(reg, m, mm, &tensors, err)))
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
