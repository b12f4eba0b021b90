/* Descriptions and tags of models and generations, and the rows a diff
 * compares (registry/notes.h; migrations/0008_registry_notes.sql).
 *
 * Invariants: every limit is checked before anything is written, so a
 * refused update changes nothing; an update and its "notes" event are one
 * transaction level; stored tags are a JSON object of string values. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "registry/notes.h"
#include "registry/reg_internal.h"

/* ---- limits ------------------------------------------------------------- */

/* Whether s[0, len) is well-formed UTF-8 (no overlongs, surrogates or
 * code points past U+10FFFF); *bad = the offset of the first bad byte. */
static bool utf8_valid(const unsigned char *s, size_t len, size_t *bad)
{
    size_t i = 0;
    while (i < len) {
        unsigned c = s[i];
        size_t n = c < 0x80             ? 0
                   : (c & 0xe0) == 0xc0 ? 1
                   : (c & 0xf0) == 0xe0 ? 2
                   : (c & 0xf8) == 0xf0 ? 3
                                        : 4;
        if (n == 4 || (n == 1 && c < 0xc2) || n > len - i - 1) {
            *bad = i;
            return false;
        }
        unsigned cp = n == 0 ? c : c & (0x3fu >> n);
        for (size_t k = 1; k <= n; k++) {
            if ((s[i + k] & 0xc0) != 0x80) {
                *bad = i;
                return false;
            }
            cp = cp << 6 | (s[i + k] & 0x3f);
        }
        if ((n == 2 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ||
            (n == 3 && (cp < 0x10000 || cp > 0x10ffff))) {
            *bad = i;
            return false;
        }
        i += n + 1;
    }
    return true;
}

int tv__notes_check_description(const char *s, size_t len, tv_error *err)
{
    size_t bad = 0;
    if (!s)
        return tv__seterr(err, TV_E_INVALID_ARG, "description: NULL");
    if (len > TV__NOTES_DESCRIPTION_MAX)
        return tv__seterr(err, TV_E_INVALID_ARG,
                          "description: %zu bytes, longer than the limit of %d bytes (UTF-8)", len,
                          TV__NOTES_DESCRIPTION_MAX);
    if (memchr(s, '\0', len))
        return tv__seterr(err, TV_E_INVALID_ARG, "description: holds a NUL character");
    if (!utf8_valid((const unsigned char *)s, len, &bad))
        return tv__seterr(err, TV_E_INVALID_ARG, "description: not valid UTF-8 at byte %zu", bad);
    return 0;
}

int tv__notes_check_tag_key(const char *key, tv_error *err)
{
    if (!key || !*key)
        return tv__seterr(err, TV_E_INVALID_ARG, "tags: a tag key is empty (1..%d bytes)",
                          TV__NOTES_TAG_KEY_MAX);
    size_t len = strlen(key);
    if (len > TV__NOTES_TAG_KEY_MAX)
        return tv__seterr(err, TV_E_INVALID_ARG,
                          "tags: tag key '%.64s...' is %zu bytes, longer than %d", key, len,
                          TV__NOTES_TAG_KEY_MAX);
    for (size_t i = 0; i < len; i++) {
        char c = key[i];
        if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '/' || c == '-'))
            return tv__seterr(
                err, TV_E_INVALID_ARG,
                "tags: tag key '%s' has a character outside [A-Za-z0-9._/-] at byte %zu", key, i);
    }
    return 0;
}

int tv__notes_check_tag_value(const char *key, const char *value, size_t len, tv_error *err)
{
    size_t bad = 0;
    if (!value)
        return tv__seterr(err, TV_E_INVALID_ARG, "tags.%s: NULL value", key);
    if (len > TV__NOTES_TAG_VALUE_MAX)
        return tv__seterr(err, TV_E_INVALID_ARG,
                          "tags.%s: the value is %zu bytes, longer than the limit of %d bytes", key,
                          len, TV__NOTES_TAG_VALUE_MAX);
    if (memchr(value, '\0', len))
        return tv__seterr(err, TV_E_INVALID_ARG, "tags.%s: the value holds a NUL character", key);
    if (!utf8_valid((const unsigned char *)value, len, &bad))
        return tv__seterr(err, TV_E_INVALID_ARG,
                          "tags.%s: the value is not valid UTF-8 at byte %zu", key, bad);
    return 0;
}

int tv__notes_apply_tags(json_t *tags, const json_t *patch, tv_error *err)
{
    const char *k;
    json_t *v;
    int rc;
    if (!json_is_object(tags) || !json_is_object(patch))
        return tv__seterr(err, TV_E_INVALID_ARG,
                          "tags: must be an object of KEY: \"value\" or null");
    json_object_foreach((json_t *)patch, k, v)
    {
        if ((rc = tv__notes_check_tag_key(k, err)))
            return rc;
        if (json_is_null(v)) {
            json_object_del(tags, k);
            continue;
        }
        if (!json_is_string(v))
            return tv__seterr(err, TV_E_INVALID_ARG,
                              "tags.%s: must be a string (or null to remove the tag)", k);
        if ((rc = tv__notes_check_tag_value(k, json_string_value(v), json_string_length(v), err)))
            return rc;
        if (json_object_set(tags, k, v))
            return tv__seterr(err, -ENOMEM, "tags: out of memory");
    }
    if (json_object_size(tags) > TV__NOTES_TAGS_MAX)
        return tv__seterr(err, TV_E_INVALID_ARG, "tags: %zu tags, more than the limit of %d",
                          json_object_size(tags), TV__NOTES_TAGS_MAX);
    return 0;
}

/* ---- reading and writing ------------------------------------------------ */

typedef struct notes_row {
    int64_t id; /* models.id or generations.id */
    char *description;
    char *tags;
} notes_row;

static int read_notes(sqlite3_stmt *st, void *record, tv_error *err)
{
    notes_row *r = record;
    const unsigned char *d = sqlite3_column_text(st, 1), *t = sqlite3_column_text(st, 2);
    r->id = sqlite3_column_int64(st, 0);
    r->description = strdup(d ? (const char *)d : "");
    r->tags = strdup(t ? (const char *)t : "{}");
    if (!r->description || !r->tags)
        return tv__seterr(err, -ENOMEM, "reading notes: out of memory");
    return 0;
}

static void notes_row_free(notes_row *r)
{
    free(r->description);
    free(r->tags);
    r->description = r->tags = NULL;
}

static int notes_read(tv__reg *reg, const char *model, int64_t number, notes_row *r, tv_error *err)
{
    int rc;
    if (number == 0)
        rc = tv__reg_query_one(reg, read_notes, r, "reading a model's notes", err,
                               "SELECT id, description, tags FROM models WHERE name = ?1", "t",
                               model);
    else
        rc = tv__reg_query_one(reg, read_notes, r, "reading a generation's notes", err,
                               "SELECT g.id, g.description, g.tags FROM generations g "
                               "JOIN models m ON m.id = g.model_id "
                               "WHERE m.name = ?1 AND g.number = ?2",
                               "ti", model, number);
    if (rc)
        notes_row_free(r);
    if (rc == TV_E_NOT_FOUND)
        return number ? tv__seterr(err, TV_E_NOT_FOUND, "model '%s' has no generation %lld", model,
                                   (long long)number)
                      : tv__seterr(err, TV_E_NOT_FOUND, "no model named '%s'", model);
    return rc;
}

static json_t *tags_parse(const char *text, tv_error *err)
{
    json_t *t = json_loads(text, 0, NULL);
    if (!json_is_object(t)) {
        json_decref(t);
        tv__seterr(err, TV_E_REGISTRY, "stored tags are not a JSON object");
        return NULL;
    }
    return t;
}

int tv__reg_notes_get(tv__reg *reg, const char *model, int64_t number, char **description,
                      json_t **tags, tv_error *err)
{
    notes_row r = {0};
    if (!reg || !model || number < 0)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_notes_get: bad argument");
    int rc = notes_read(reg, model, number, &r, err);
    if (rc)
        return rc;
    if (tags && !(*tags = tags_parse(r.tags, err)))
        rc = TV_E_REGISTRY;
    if (!rc && description) {
        *description = r.description;
        r.description = NULL;
    }
    notes_row_free(&r);
    return rc;
}

int tv__reg_notes_has_tag(tv__reg *reg, const char *model, int64_t number, const char *key,
                          const char *value, bool *has, tv_error *err)
{
    json_t *tags = NULL;
    int rc = tv__reg_notes_get(reg, model, number, NULL, &tags, err);
    if (rc)
        return rc;
    const char *v = json_string_value(json_object_get(tags, key));
    *has = v && value && !strcmp(v, value);
    json_decref(tags);
    return 0;
}

/* The event's before and after: only the fields that change. */
static int notes_event(tv__reg *reg, const char *model, int64_t number, const notes_row *old,
                       const char *description, json_t *old_tags, json_t *new_tags, tv_error *err)
{
    json_t *b = json_object(), *a = json_object();
    if (!b || !a) {
        json_decref(b);
        json_decref(a);
        return tv__seterr(err, -ENOMEM, "notes: out of memory");
    }
    if (description && strcmp(description, old->description)) {
        json_object_set_new(b, "description", json_string(old->description));
        json_object_set_new(a, "description", json_string(description));
    }
    if (new_tags && !json_equal(old_tags, new_tags)) {
        json_object_set(b, "tags", old_tags);
        json_object_set(a, "tags", new_tags);
    }
    return tv__reg_event(reg, "notes", model, number, b, a, err);
}

int tv__reg_notes_update(tv__reg *reg, const char *model, int64_t number, const char *description,
                         const json_t *tags_patch, tv_error *err)
{
    notes_row r = {0};
    json_t *old_tags = NULL, *tags = NULL;
    char *tags_text = NULL;
    if (!reg || !model || number < 0)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_notes_update: bad argument");
    int rc;
    if (description && (rc = tv__notes_check_description(description, strlen(description), err)))
        return rc;
    if ((rc = tv__reg_level_begin(reg, true, err)))
        return rc;
    if ((rc = notes_read(reg, model, number, &r, err)))
        goto done;
    if (!(old_tags = tags_parse(r.tags, err))) {
        rc = TV_E_REGISTRY;
        goto done;
    }
    if (tags_patch) {
        if (!(tags = json_deep_copy(old_tags))) {
            rc = tv__seterr(err, -ENOMEM, "notes: out of memory");
            goto done;
        }
        if ((rc = tv__notes_apply_tags(tags, tags_patch, err)))
            goto done;
        if (!(tags_text = json_dumps(tags, JSON_COMPACT | JSON_SORT_KEYS))) {
            rc = tv__seterr(err, -ENOMEM, "notes: out of memory");
            goto done;
        }
    }
    rc = tv__reg_exec(reg, "changing notes", err,
                      number ? "UPDATE generations SET description = coalesce(?2, description), "
                               "tags = coalesce(?3, tags) WHERE id = ?1"
                             : "UPDATE models SET description = coalesce(?2, description), "
                               "tags = coalesce(?3, tags) WHERE id = ?1",
                      "itt", r.id, description, tags_text);
    if (rc == 0)
        rc = notes_event(reg, model, number, &r, description, old_tags, tags, err);
done:
    rc = tv__reg_level_end(reg, rc, err);
    json_decref(old_tags);
    json_decref(tags);
    free(tags_text);
    notes_row_free(&r);
    return rc;
}

/* ---- what a diff compares ------------------------------------------------ */

static int read_diff_tensor(sqlite3_stmt *st, void *record, tv_error *err)
{
    tv__reg_diff_tensor *t = record;
    const unsigned char *name = sqlite3_column_text(st, 0);
    if (!(t->name = strdup(name ? (const char *)name : "")))
        return tv__seterr(err, -ENOMEM, "reading tensors: out of memory");
    t->dtype = (tv_dtype)sqlite3_column_int(st, 1);
    tv__reg_col_text(st, 2, t->shape, sizeof t->shape);
    t->nbytes = tv__reg_col_u64(st, 3);
    tv__reg_col_text(st, 4, t->xxh3, sizeof t->xxh3);
    tv__reg_col_text(st, 5, t->shard_sha256, sizeof t->shard_sha256);
    return 0;
}

int tv__reg_diff_tensors(tv__reg *reg, int64_t generation_id, tv__reg_diff_tensor **out, size_t *n,
                         tv_error *err)
{
    tv__reg_vec v = {.size = sizeof(tv__reg_diff_tensor)};
    if (!reg || !out || !n)
        return tv__seterr(err, TV_E_INVALID_ARG, "tv__reg_diff_tensors: NULL argument");
    *out = NULL;
    *n = 0;
    int rc = tv__reg_query_one(reg, NULL, NULL, "reading a generation", err,
                               "SELECT 1 FROM generations WHERE id = ?1", "i", generation_id);
    if (rc == TV_E_NOT_FOUND)
        return tv__seterr(err, TV_E_NOT_FOUND, "no generation with id %lld",
                          (long long)generation_id);
    if (rc)
        return rc;
    rc = tv__reg_query_list(reg, &v, read_diff_tensor, "reading tensors", err,
                            "SELECT t.name, t.dtype, t.shape, t.end_off - t.begin_off, "
                            "ifnull(t.xxh3, ''), s.sha256 FROM tensors t "
                            "JOIN shards s ON s.id = t.shard_id WHERE t.generation_id = ?1 "
                            "ORDER BY CAST(t.name AS BLOB)",
                            "i", generation_id);
    if (rc) {
        /* names read before the failure */
        return rc;
    }
    *out = v.items;
    *n = v.n;
    return 0;
}

void tv__reg_diff_tensors_free(tv__reg_diff_tensor *t, size_t n)
{
    for (size_t i = 0; t && i < n; i++)
        free(t[i].name);
    free(t);
}

/* ---- the diff core --------------------------------------------------------- */

static json_t *brief_json(const tv__reg_diff_tensor *t)
{
    const char *dt = tv_dtype_name(t->dtype);
    json_t *shape = json_loads(t->shape, 0, NULL);
    return json_pack("{s:s,s:s,s:o}", "name", t->name, "dtype", dt ? dt : "?", "shape",
                     shape ? shape : json_array());
}

static bool append(json_t *arr, json_t *v)
{
    return v && json_array_append_new(arr, v) == 0;
}

json_t *tv__diff_tensors_json(const tv__reg_diff_tensor *a, size_t na, const tv__reg_diff_tensor *b,
                              size_t nb)
{
    json_t *added = json_array(), *removed = json_array(), *changed = json_array(),
           *content = json_array();
    size_t i = 0, k = 0, unchanged = 0, by_xxh3 = 0, by_shard = 0;
    bool ok = added && removed && changed && content;
    while (ok && (i < na || k < nb)) {
        int cmp = i == na ? 1 : k == nb ? -1 : strcmp(a[i].name, b[k].name);
        if (cmp < 0) {
            ok = append(removed, brief_json(&a[i++]));
            continue;
        }
        if (cmp > 0) {
            ok = append(added, brief_json(&b[k++]));
            continue;
        }
        const tv__reg_diff_tensor *x = &a[i++], *y = &b[k++];
        if (x->dtype != y->dtype || strcmp(x->shape, y->shape)) {
            ok = append(changed, json_pack("{s:s,s:o,s:o}", "name", x->name, "from", brief_json(x),
                                           "to", brief_json(y)));
            continue;
        }
        bool hashed = x->xxh3[0] && y->xxh3[0];
        bool same = hashed ? !strcmp(x->xxh3, y->xxh3) : !strcmp(x->shard_sha256, y->shard_sha256);
        if (hashed)
            by_xxh3++;
        else
            by_shard++;
        if (same) {
            unchanged++;
            continue;
        }
        ok = append(content, json_pack("{s:s,s:s,s:s}", "name", x->name, "basis",
                                       hashed ? "xxh3" : "shard_sha256", "note",
                                       hashed ? "content differs"
                                              : "content may differ (shard hash differs)"));
    }
    if (!ok) {
        json_decref(added);
        json_decref(removed);
        json_decref(changed);
        json_decref(content);
        return NULL;
    }
    const char *basis = by_shard == 0 ? "xxh3" : by_xxh3 == 0 ? "shard_sha256" : "mixed";
    return json_pack("{s:o,s:o,s:o,s:o,s:I,s:s}", "added", added, "removed", removed, "changed",
                     changed, "content_changed", content, "unchanged", (json_int_t)unchanged,
                     "basis", basis);
}

/* ---- sidecar files ------------------------------------------------------- */

typedef struct file_row {
    char *path;
    char sha256[TV__REG_SHA256_HEX_LEN + 1];
} file_row;

static int read_file_row(sqlite3_stmt *st, void *record, tv_error *err)
{
    file_row *f = record;
    const unsigned char *p = sqlite3_column_text(st, 0);
    if (!(f->path = strdup(p ? (const char *)p : "")))
        return tv__seterr(err, -ENOMEM, "reading files: out of memory");
    tv__reg_col_text(st, 1, f->sha256, sizeof f->sha256);
    return 0;
}

static int files_of(tv__reg *reg, int64_t generation_id, tv__reg_vec *v, tv_error *err)
{
    *v = (tv__reg_vec){.size = sizeof(file_row)};
    return tv__reg_query_list(reg, v, read_file_row, "reading a generation's files", err,
                              "SELECT path, sha256 FROM generation_files WHERE generation_id = ?1 "
                              "ORDER BY CAST(path AS BLOB)",
                              "i", generation_id);
}

static void files_free(tv__reg_vec *v)
{
    file_row *f = v->items;
    for (size_t i = 0; f && i < v->n; i++)
        free(f[i].path);
    free(v->items);
}

int tv__reg_files_diff(tv__reg *reg, int64_t from_id, int64_t to_id, json_t **out, tv_error *err)
{
    tv__reg_vec a = {0}, b = {0};
    json_t *added = NULL, *removed = NULL, *changed = NULL;
    *out = NULL;
    int rc;
    if ((rc = files_of(reg, from_id, &a, err)) || (rc = files_of(reg, to_id, &b, err)))
        goto out;
    added = json_array();
    removed = json_array();
    changed = json_array();
    const file_row *x = a.items, *y = b.items;
    size_t i = 0, k = 0;
    bool ok = added && removed && changed;
    while (ok && (i < a.n || k < b.n)) {
        int cmp = i == a.n ? 1 : k == b.n ? -1 : strcmp(x[i].path, y[k].path);
        if (cmp < 0)
            ok = !json_array_append_new(removed, json_string(x[i++].path));
        else if (cmp > 0)
            ok = !json_array_append_new(added, json_string(y[k++].path));
        else if (strcmp(x[i].sha256, y[k].sha256))
            ok = !json_array_append_new(changed, json_string(x[i++].path)), k++;
        else
            i++, k++;
    }
    if (!ok || !(*out = json_pack("{s:O,s:O,s:O}", "added", added, "removed", removed, "changed",
                                  changed)))
        rc = tv__seterr(err, -ENOMEM, "diffing files: out of memory");
out:
    json_decref(added);
    json_decref(removed);
    json_decref(changed);
    files_free(&a);
    files_free(&b);
    return rc;
}
