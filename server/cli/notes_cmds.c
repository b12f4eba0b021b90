/* The notes, diff and event commands of the tensorvault CLI, clients of
 * the one API like the others (reg_cmds.c): describe, tag, diff, events.
 * Invariants: a usage error (exit 2) is found before anything is sent; the
 * --json output is the API's document as it is; NAME alone is the model,
 * NAME@GEN one generation of it (for describe and tag). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/client.h"
#include "util/internal.h"

#define SEG_MAX  1024
#define PATH_LEN (3 * SEG_MAX)

/* NAME or NAME@GEN into model and gen ("" when no '@'). Returns 0 or 2
 * (usage printed). */
static int split_ref(const char *cmd, const char *spec, bool gen_needed, char *model, size_t ml,
                     char *gen, size_t gl)
{
    bool at = strchr(spec, '@') != NULL;
    if ((!at && gen_needed) ||
        (at ? tv__cli_parse_ref(spec, model, ml, gen, gl) != 0
            : (!*spec || strlen(spec) >= ml || (snprintf(model, ml, "%s", spec), false))))
        return tv__cli_usage(cmd, "'%s' is not %s", spec,
                             gen_needed ? "NAME@GEN (GEN a number, an alias or active)"
                                        : "NAME or NAME@GEN (GEN a number, an alias or active)");
    if (!at)
        gen[0] = '\0';
    return 0;
}

/* "/v1/models/NAME[/generations/GEN][tail]", segments encoded. */
static int model_path(char *buf, size_t len, const char *model, const char *gen, const char *tail,
                      tv_error *err)
{
    char m[SEG_MAX], g[SEG_MAX];
    int rc = tv__cli_seg(model, m, sizeof m, err);
    if (!rc && gen[0])
        rc = tv__cli_seg(gen, g, sizeof g, err);
    if (rc)
        return rc;
    snprintf(buf, len, "/v1/models/%s%s%s%s", m, gen[0] ? "/generations/" : "", gen[0] ? g : "",
             tail ? tail : "");
    return 0;
}

/* One request; prints with print(doc) or, with --json, the document. */
static int request(const tv__cli_ctx *c, bool writer, const char *method, const char *path,
                   const char *query, json_t *body, void (*print)(const json_t *doc))
{
    json_t *doc = NULL;
    int rc = tv__cli_request(c, writer, method, path, query, body, &doc);
    if (rc)
        return rc;
    if (c->json) {
        json_dumpf(doc, stdout, JSON_INDENT(2) | JSON_ENSURE_ASCII);
        fputc('\n', stdout);
    } else {
        print(doc);
    }
    json_decref(doc);
    return TV__EXIT_OK;
}

static void print_notes(const json_t *doc)
{
    const char *k;
    json_t *v;
    const json_t *g = json_object_get(doc, "generation");
    if (g)
        printf("%s@%" JSON_INTEGER_FORMAT "\n", json_string_value(json_object_get(doc, "model")),
               json_integer_value(g));
    else
        printf("%s\n", json_string_value(json_object_get(doc, "name")));
    const char *d = json_string_value(json_object_get(doc, "description"));
    printf("description: %s\n", d && *d ? d : "-");
    printf("tags:");
    bool any = false;
    json_object_foreach((json_t *)json_object_get(doc, "tags"), k, v)
    {
        printf(" %s=%s", k, json_string_value(v));
        any = true;
    }
    printf("%s\n", any ? "" : " -");
}

/* PATCH the notes of NAME or NAME@GEN with body. */
static int patch_notes(const tv__cli_ctx *c, const char *spec, json_t *body)
{
    char model[TV__CLI_SPEC_MAX], gen[TV__CLI_ALIAS_LEN], path[PATH_LEN];
    tv_error err = {0};
    int u = split_ref(c->cmd->name, spec, false, model, sizeof model, gen, sizeof gen);
    if (u) {
        json_decref(body);
        return u;
    }
    int rc = model_path(path, sizeof path, model, gen, NULL, &err);
    if (rc) {
        json_decref(body);
        return tv__cli_failed(c, rc, &err);
    }
    return request(c, true, "PATCH", path, NULL, body, print_notes);
}

static int describe_run(const tv__cli_ctx *c)
{
    return patch_notes(c, c->a.pos[0], json_pack("{s:s}", "description", c->a.pos[1]));
}

static int tag_run(const tv__cli_ctx *c)
{
    json_t *tags = json_object();
    const char *rm = tv__cli_get(&c->a, "--rm");
    if (c->a.n_pos < 2 && !rm) {
        json_decref(tags);
        return tv__cli_usage(c->cmd->name, "give KEY=VALUE ... or --rm KEY");
    }
    for (size_t i = 1; i < c->a.n_pos; i++) {
        const char *kv = c->a.pos[i], *eq = strchr(kv, '=');
        if (!eq || eq == kv) {
            json_decref(tags);
            return tv__cli_usage(c->cmd->name, "'%s' is not KEY=VALUE", kv);
        }
        char *key = strndup(kv, (size_t)(eq - kv));
        if (!key || json_object_set_new(tags, key, json_string(eq + 1))) {
            free(key);
            json_decref(tags);
            fprintf(stderr, "tensorvault: %s: out of memory\n", c->cmd->name);
            return TV__EXIT_FAIL;
        }
        free(key);
    }
    if (rm)
        json_object_set_new(tags, rm, json_null());
    return patch_notes(c, c->a.pos[0], json_pack("{s:o}", "tags", tags));
}

static void print_diff_list(const char *mark, const json_t *arr)
{
    size_t i;
    json_t *t;
    json_array_foreach(arr, i, t)
    {
        char *shape = json_dumps(json_object_get(t, "shape"), JSON_COMPACT);
        printf("%s %s  %s %s\n", mark, json_string_value(json_object_get(t, "name")),
               json_string_value(json_object_get(t, "dtype")), shape ? shape : "?");
        free(shape);
    }
}

static void print_diff(const json_t *doc)
{
    size_t i;
    json_t *t;
    const json_t *from = json_object_get(doc, "from"), *to = json_object_get(doc, "to");
    printf("diff %s@%" JSON_INTEGER_FORMAT " -> %s@%" JSON_INTEGER_FORMAT "\n",
           json_string_value(json_object_get(from, "model")),
           json_integer_value(json_object_get(from, "generation")),
           json_string_value(json_object_get(to, "model")),
           json_integer_value(json_object_get(to, "generation")));
    print_diff_list("+", json_object_get(doc, "added"));
    print_diff_list("-", json_object_get(doc, "removed"));
    json_array_foreach(json_object_get(doc, "changed"), i, t)
    {
        const json_t *a = json_object_get(t, "from"), *b = json_object_get(t, "to");
        char *sa = json_dumps(json_object_get(a, "shape"), JSON_COMPACT);
        char *sb = json_dumps(json_object_get(b, "shape"), JSON_COMPACT);
        printf("~ %s  %s %s -> %s %s\n", json_string_value(json_object_get(t, "name")),
               json_string_value(json_object_get(a, "dtype")), sa ? sa : "?",
               json_string_value(json_object_get(b, "dtype")), sb ? sb : "?");
        free(sa);
        free(sb);
    }
    json_array_foreach(json_object_get(doc, "content_changed"), i, t)
        printf("* %s  %s (%s)\n", json_string_value(json_object_get(t, "name")),
               json_string_value(json_object_get(t, "note")),
               json_string_value(json_object_get(t, "basis")));
    const json_t *files = json_object_get(doc, "files");
    const char *fk[] = {"added", "removed", "changed"}, *fm[] = {"+ file", "- file", "* file"};
    for (size_t k = 0; json_is_object(files) && k < 3; k++)
        json_array_foreach(json_object_get(files, fk[k]), i, t)
            printf("%s %s\n", fm[k], json_string_value(t));
    printf(
        "%zu added, %zu removed, %zu changed in dtype or shape, %zu changed in content, %lld unchanged (content compared by %s)\n",
        json_array_size(json_object_get(doc, "added")),
        json_array_size(json_object_get(doc, "removed")),
        json_array_size(json_object_get(doc, "changed")),
        json_array_size(json_object_get(doc, "content_changed")),
        (long long)json_integer_value(json_object_get(doc, "unchanged")),
        json_string_value(json_object_get(doc, "basis")));
}

static int diff_run(const tv__cli_ctx *c)
{
    char ma[TV__CLI_SPEC_MAX], ga[TV__CLI_ALIAS_LEN], mb[TV__CLI_SPEC_MAX], gb[TV__CLI_ALIAS_LEN];
    char path[PATH_LEN], q[4 * SEG_MAX] = "";
    tv_error err = {0};
    int u;
    if ((u = split_ref(c->cmd->name, c->a.pos[0], true, ma, sizeof ma, ga, sizeof ga)) ||
        (u = split_ref(c->cmd->name, c->a.pos[1], true, mb, sizeof mb, gb, sizeof gb)))
        return u;
    int rc = model_path(path, sizeof path, ma, "", "/diff", &err);
    if (!rc)
        rc = tv__cli_query_add(q, sizeof q, "from", ga, &err);
    if (!rc)
        rc = tv__cli_query_add(q, sizeof q, "to", gb, &err);
    if (!rc && strcmp(ma, mb))
        rc = tv__cli_query_add(q, sizeof q, "to_model", mb, &err);
    if (rc)
        return tv__cli_failed(c, rc, &err);
    return request(c, false, "GET", path, q, NULL, print_diff);
}

static void print_obj(const char *label, const json_t *o)
{
    if (!json_is_object(o))
        return;
    char *s = json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS);
    printf(" %s %s", label, s ? s : "?");
    free(s);
}

static void print_events(const json_t *doc)
{
    size_t i;
    json_t *e;
    printf("%6s  %-19s  %-20s  %-14s  %s\n", "ID", "TIME", "ACTOR", "ACTION", "MODEL");
    json_array_foreach(json_object_get(doc, "events"), i, e)
    {
        char t[32], g[32] = "";
        const json_t *gen = json_object_get(e, "generation");
        const char *model = json_string_value(json_object_get(e, "model"));
        if (json_is_integer(gen))
            snprintf(g, sizeof g, "@%" JSON_INTEGER_FORMAT, json_integer_value(gen));
        printf("%6" JSON_INTEGER_FORMAT "  %-19s  %-20s  %-14s  %s%s",
               json_integer_value(json_object_get(e, "id")),
               tv__cli_fmt_time(json_integer_value(json_object_get(e, "time")), t, sizeof t),
               json_string_value(json_object_get(e, "actor")),
               json_string_value(json_object_get(e, "action")), model ? model : "-", g);
        print_obj("before", json_object_get(e, "before"));
        print_obj("after", json_object_get(e, "after"));
        putchar('\n');
    }
}

static int events_run(const tv__cli_ctx *c)
{
    char q[2 * SEG_MAX] = "";
    tv_error err = {0};
    uint64_t limit = 50;
    int u = tv__cli_opt_uint(c->cmd->name, &c->a, "--limit", 1, 1000, &limit);
    if (u)
        return u;
    char lim[24];
    snprintf(lim, sizeof lim, "%" PRIu64, limit);
    int rc = tv__cli_query_add(q, sizeof q, "limit", lim, &err);
    if (!rc && c->a.n_pos)
        rc = tv__cli_query_add(q, sizeof q, "model", c->a.pos[0], &err);
    if (!rc && tv__cli_get(&c->a, "--before"))
        rc = tv__cli_query_add(q, sizeof q, "before", tv__cli_get(&c->a, "--before"), &err);
    if (rc)
        return tv__cli_failed(c, rc, &err);
    return request(c, false, "GET", "/v1/events", q, NULL, print_events);
}

const tv__cli_cmd tv__cli_cmd_describe = {
    .name = "describe",
    .run = describe_run,
    .positionals = "NAME[@GEN] TEXT",
    .min_pos = 2,
    .max_pos = 2,
    .opts = {TV__CLI_CLIENT_OPTS},
    .about = "Set the description of model NAME, or of its generation GEN (a number, an alias\n"
             "or active): at most 4096 bytes of UTF-8; \"\" clears it.",
    .example = "tensorvault describe llama \"Llama 3 8B, instruction tuned\"\n"
               "tensorvault describe llama@3 \"retrained on the March data\"",
};

const tv__cli_cmd tv__cli_cmd_tag = {
    .name = "tag",
    .run = tag_run,
    .positionals = "NAME[@GEN] [KEY=VALUE...]",
    .min_pos = 1,
    .max_pos = TV__CLI_MAX_POS,
    .opts = {{"--rm", "KEY", NULL, "remove tag KEY"}, TV__CLI_CLIENT_OPTS},
    .about = "Set tags (KEY=VALUE) on model NAME, or on its generation GEN, and/or remove one\n"
             "(--rm KEY). Other tags stay. Keys: 1..64 bytes of [A-Za-z0-9._/-]; values: at\n"
             "most 1024 bytes; at most 64 tags each.",
    .example = "tensorvault tag llama team=nlp stage=prod\n"
               "tensorvault tag llama@3 --rm stage",
};

const tv__cli_cmd tv__cli_cmd_diff = {
    .name = "diff",
    .run = diff_run,
    .positionals = "NAME@A NAME@B|OTHER@B",
    .min_pos = 2,
    .max_pos = 2,
    .opts = {TV__CLI_CLIENT_OPTS},
    .about = "What changed from generation A to generation B (of the same model, or of\n"
             "another): tensors added (+), removed (-), changed in dtype or shape (~), changed\n"
             "in content (*; by the tensors' XXH3-128, or by their shards' SHA-256 for\n"
             "generations imported without tensor hashes: \"content may differ\"), the\n"
             "unchanged count, and the sidecar files (config, tokenizer, ...) added, removed\n"
             "and changed (\"+ file\", \"- file\", \"* file\").",
    .example = "tensorvault diff llama@2 llama@3\n"
               "tensorvault diff llama@prod llama-ft@1",
};

const tv__cli_cmd tv__cli_cmd_events = {
    .name = "events",
    .run = events_run,
    .positionals = "[NAME]",
    .min_pos = 0,
    .max_pos = 1,
    .opts = {{"--limit", "N", NULL, "at most N events (1..1000, default 50)"},
             {"--before", "ID", NULL, "only events older than event ID (paging)"},
             TV__CLI_CLIENT_OPTS},
    .about = "The event log, newest first: who (a token's name, \"local uid N\", \"cli\"),\n"
             "what (import.queued, publish, activate, rollback, alias.set, notes, ...), when,\n"
             "and the state before and after; of model NAME only when given.",
    .example = "tensorvault events llama --limit 20",
};
