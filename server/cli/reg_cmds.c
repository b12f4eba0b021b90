/* The registry commands of the tensorvault CLI as clients of the one API
 * (docs/openapi.yaml): each builds a request (method, path, query, body), sends it
 * through tv__cli_call (in-process api on --store, or a tensorvaultd) and
 * prints the answer with tv__cli_print. models, generations, generation,
 * tensors, tensor, devices, import, activate, rollback, retire, alias
 * set/rm/list, delete, gc, verify, jobs, job, cancel, sessions, token
 * create/list/revoke, status, demo.
 * Invariants: local and remote mode print the same document; a usage error
 * (exit 2) is found before anything is sent; list commands follow
 * next_cursor to the end unless told a --limit. */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli/client.h"
#include "import/import.h"
#include "import/source.h"
#include "util/internal.h"
#include "util/sys.h"

#ifndef TV__CLI_SOURCE_DIR
#define TV__CLI_SOURCE_DIR "."
#endif

#define SEG_MAX 1024 /* an encoded path segment (a 255-byte name is at most 765) */

/* "/v1/a/b/...": each segment percent-encoded; the list ends with NULL. */
static int path_of(char *buf, size_t len, tv_error *err, ...)
{
    va_list ap;
    size_t off = 0;
    int rc = 0;
    buf[0] = '\0';
    va_start(ap, err);
    for (const char *s; (s = va_arg(ap, const char *));) {
        if (off + 2 >= len) {
            rc = tv__seterr(err, TV_E_INVALID_ARG, "request path too long at '%.64s'", s);
            break;
        }
        buf[off++] = '/';
        if ((rc = tv__cli_seg(s, buf + off, len - off, err)))
            break;
        off += strlen(buf + off);
    }
    va_end(ap);
    return rc;
}

/* One request and its printing: the common body of most commands. */
static int one(const tv__cli_ctx *c, bool writer, const char *method, const char *path,
               const char *query, json_t *body, tv__cli_doc kind)
{
    json_t *doc = NULL;
    int rc = tv__cli_request(c, writer, method, path, query, body, &doc);
    if (rc)
        return rc;
    tv__cli_print(stdout, c->json, kind, doc);
    json_decref(doc);
    return TV__EXIT_OK;
}

/* GET path?query, following next_cursor to the end; the arrays under key
 * are concatenated into the first page's document (next_cursor null when
 * the listing is paginated). */
static int fetch_all(tv__cli_client *cl, const char *path, const char *query, const char *key,
                     json_t **out, tv_error *err)
{
    int rc = 0;
    json_t *all = NULL;
    char q[4096];
    char *cursor = NULL;
    *out = NULL;
    for (;;) {
        snprintf(q, sizeof q, "%s", query ? query : "");
        if (cursor && (rc = tv__cli_query_add(q, sizeof q, "cursor", cursor, err)))
            break;
        json_t *page = NULL;
        rc = tv__cli_call(cl, "GET", path, q[0] ? q : NULL, NULL, &page, NULL, err);
        if (rc) {
            json_decref(page);
            break;
        }
        free(cursor);
        cursor = NULL;
        const char *next = json_string_value(json_object_get(page, "next_cursor"));
        if (next && !(cursor = strdup(next))) {
            json_decref(page);
            rc = tv__seterr(err, -ENOMEM, "out of memory");
            break;
        }
        if (!all) {
            all = page;
        } else {
            json_array_extend(json_object_get(all, key), json_object_get(page, key));
            json_decref(page);
        }
        if (!cursor)
            break;
    }
    free(cursor);
    if (rc) {
        json_decref(all);
        return rc;
    }
    /* A paginated listing ends with next_cursor null; one that has no
     * pagination (devices) keeps its shape. */
    if (json_object_get(all, "next_cursor"))
        json_object_set_new(all, "next_cursor", json_null());
    *out = all;
    return 0;
}

static int listing(const tv__cli_ctx *c, const char *path, const char *query, const char *key,
                   tv__cli_doc kind, json_t **keep)
{
    tv_error err = {0};
    tv__cli_client cl;
    json_t *doc = NULL;
    int rc = tv__cli_client_open(c, false, &cl, &err);
    if (!rc)
        rc = fetch_all(&cl, path, query, key, &doc, &err);
    tv__cli_client_close(&cl);
    if (rc)
        return tv__cli_failed(c, rc, &err);
    tv__cli_print(stdout, c->json, kind, doc);
    if (keep)
        *keep = doc;
    else
        json_decref(doc);
    return TV__EXIT_OK;
}

/* NAME[@GEN|@ALIAS] -> name and generation spec ("active" without '@'). */
static int ref(const tv__cli_ctx *c, const char *spec, char *name, size_t name_len, char *gen,
               size_t gen_len)
{
    int rc = tv__cli_parse_ref(spec, name, name_len, gen, gen_len);
    const char *at = strrchr(spec, '@');
    if (!rc)
        return 0;
    if (at && at != spec && (size_t)(at - spec) < name_len) {
        if (rc == -ERANGE)
            return tv__cli_usage(c->cmd->name, "generation '%s' in '%s' is above %" PRId64, at + 1,
                                 spec, INT64_MAX);
        return tv__cli_usage(c->cmd->name, "bad generation '%s' in '%s': %s, or an alias (%s)",
                             at + 1, spec, TV__CLI_GEN_GRAMMAR, TV__CLI_ALIAS_GRAMMAR);
    }
    return tv__cli_usage(c->cmd->name, "bad model '%s' (NAME, NAME@GEN or NAME@ALIAS)", spec);
}

/* A GEN|ALIAS argument. */
static int gen_or_alias(const tv__cli_ctx *c, const char *s, char *gen, size_t gen_len)
{
    char name[2] = "x", spec[TV__CLI_SPEC_MAX + 2];
    snprintf(spec, sizeof spec, "x@%s", s);
    int rc = tv__cli_parse_ref(spec, name, sizeof name, gen, gen_len);
    if (rc == -ERANGE)
        return tv__cli_usage(c->cmd->name, "generation '%s' is above %" PRId64, s, INT64_MAX);
    if (rc)
        return tv__cli_usage(c->cmd->name, "bad generation '%s': %s, or an alias (%s)", s,
                             TV__CLI_GEN_GRAMMAR, TV__CLI_ALIAS_GRAMMAR);
    return 0;
}

/* ---- listings -------------------------------------------------------------- */

const tv__cli_cmd tv__cli_cmd_models = {
    .name = "models",
    .run = tv__cli_models,
    .positionals = "[NAME]",
    .min_pos = 0,
    .max_pos = 1,
    .opts = {TV__CLI_CLIENT_OPTS},
    .about = "List the models of the registry, or show one: its active generation, how many\n"
             "generations it has and its aliases (alias=generation).",
    .example = "tensorvault models\n"
               "tensorvault models meta-llama/Llama-3-8B --json",
};

int tv__cli_models(const tv__cli_ctx *c)
{
    char path[SEG_MAX + 16];
    tv_error err = {0};
    if (c->a.n_pos == 0)
        return listing(c, "/v1/models", NULL, "models", TV__DOC_MODELS, NULL);
    if (path_of(path, sizeof path, &err, "v1", "models", c->a.pos[0], NULL))
        return tv__cli_failed(c, TV_E_INVALID_ARG, &err);
    return one(c, false, "GET", path, NULL, NULL, TV__DOC_MODEL);
}

const tv__cli_cmd tv__cli_cmd_generations = {
    .name = "generations",
    .run = tv__cli_generations,
    .positionals = "NAME",
    .min_pos = 1,
    .max_pos = 1,
    .opts = {TV__CLI_CLIENT_OPTS},
    .about = "List the generations of model NAME, by number: state (importing, ready, failed,\n"
             "retired), whether it is active (*), shards, tensors, size, creation time,\n"
             "aliases and the source it was imported from.",
    .example = "tensorvault generations llama",
};

int tv__cli_generations(const tv__cli_ctx *c)
{
    char path[SEG_MAX + 32];
    tv_error err = {0};
    if (path_of(path, sizeof path, &err, "v1", "models", c->a.pos[0], "generations", NULL))
        return tv__cli_failed(c, TV_E_INVALID_ARG, &err);
    return listing(c, path, NULL, "generations", TV__DOC_GENERATIONS, NULL);
}

const tv__cli_cmd tv__cli_cmd_generation = {
    .name = "generation",
    .run = tv__cli_generation,
    .positionals = "NAME[@GEN|@ALIAS]",
    .min_pos = 1,
    .max_pos = 1,
    .opts = {TV__CLI_CLIENT_OPTS},
    .about = "Show one generation (NAME alone: the active one) with its shards: file name,\n"
             "size, SHA-256, and where each replica lies on which device.",
    .example = "tensorvault generation llama@2\n"
               "tensorvault generation llama@prod --json",
};

int tv__cli_generation(const tv__cli_ctx *c)
{
    char name[TV__CLI_SPEC_MAX], gen[TV__ALIAS_MAX + 1], path[2 * SEG_MAX];
    tv_error err = {0};
    int u = ref(c, c->a.pos[0], name, sizeof name, gen, sizeof gen);
    if (u)
        return u;
    if (path_of(path, sizeof path, &err, "v1", "models", name, "generations", gen, NULL))
        return tv__cli_failed(c, TV_E_INVALID_ARG, &err);
    return one(c, false, "GET", path, NULL, NULL, TV__DOC_GENERATION);
}

const tv__cli_cmd tv__cli_cmd_tensors = {
    .name = "tensors",
    .run = tv__cli_tensors,
    .positionals = "NAME[@GEN|@ALIAS]",
    .min_pos = 1,
    .max_pos = 1,
    .opts = {{"--prefix", "P", NULL, "only the tensors whose name starts with P"},
             {"--order", "file|name|size", NULL, "file order (default), by name, or largest first"},
             {"--limit", "N", NULL,
              "at most N tensors (1..1000); without it every page is fetched"},
             TV__CLI_CLIENT_OPTS},
    .about = "List the tensors of a generation (NAME alone: the active one): name, dtype,\n"
             "shape, size and the shard file holding it.",
    .example = "tensorvault tensors llama --prefix model.layers.0. --order name\n"
               "tensorvault tensors llama@2 --order size --limit 10",
};

int tv__cli_tensors(const tv__cli_ctx *c)
{
    char name[TV__CLI_SPEC_MAX], gen[TV__ALIAS_MAX + 1], path[2 * SEG_MAX + 64], q[2048] = "";
    tv_error err = {0};
    const char *order = tv__cli_get(&c->a, "--order"), *lim = tv__cli_get(&c->a, "--limit");
    uint64_t limit = 0;
    int u = ref(c, c->a.pos[0], name, sizeof name, gen, sizeof gen);
    if (u)
        return u;
    if (strlen(name) > TV__REG_NAME_MAX)
        return tv__cli_usage(c->cmd->name, "bad model '%s': longer than %d bytes", c->a.pos[0],
                             TV__REG_NAME_MAX);
    if (order && strcmp(order, "file") && strcmp(order, "name") && strcmp(order, "size"))
        return tv__cli_usage(c->cmd->name, "bad --order '%s': file, name or size", order);
    if ((u = tv__cli_opt_uint(c->cmd->name, &c->a, "--limit", 1, 1000, &limit)))
        return u;
    if (path_of(path, sizeof path, &err, "v1", "models", name, "generations", gen, "tensors",
                NULL) ||
        tv__cli_query_add(q, sizeof q, "prefix", tv__cli_get(&c->a, "--prefix"), &err) ||
        tv__cli_query_add(q, sizeof q, "order", order, &err))
        return tv__cli_failed(c, TV_E_INVALID_ARG, &err);
    if (!lim)
        return listing(c, path, q[0] ? q : NULL, "tensors", TV__DOC_TENSORS, NULL);
    tv__cli_query_add(q, sizeof q, "limit", lim, &err);
    return one(c, false, "GET", path, q, NULL, TV__DOC_TENSORS);
}

const tv__cli_cmd tv__cli_cmd_tensor = {
    .name = "tensor",
    .run = tv__cli_tensor,
    .positionals = "NAME[@GEN|@ALIAS] TENSOR",
    .min_pos = 2,
    .max_pos = 2,
    .opts = {TV__CLI_CLIENT_OPTS},
    .about = "Show one tensor: dtype, shape, shard, its data offsets in the safetensors\n"
             "header, its offset in the shard file, and where its first byte lies on each\n"
             "device holding a replica.",
    .example = "tensorvault tensor llama@prod model.norm.weight",
};

int tv__cli_tensor(const tv__cli_ctx *c)
{
    char name[TV__CLI_SPEC_MAX], gen[TV__ALIAS_MAX + 1], path[3 * SEG_MAX + 64];
    tv_error err = {0};
    int u = ref(c, c->a.pos[0], name, sizeof name, gen, sizeof gen);
    if (u)
        return u;
    if (path_of(path, sizeof path, &err, "v1", "models", name, "generations", gen, "tensors",
                c->a.pos[1], NULL))
        return tv__cli_failed(c, TV_E_INVALID_ARG, &err);
    return one(c, false, "GET", path, NULL, NULL, TV__DOC_TENSOR);
}

const tv__cli_cmd tv__cli_cmd_devices = {
    .name = "devices",
    .run = tv__cli_devices,
    .positionals = "",
    .min_pos = 0,
    .max_pos = 0,
    .opts = {TV__CLI_CLIENT_OPTS},
    .about = "List the store's devices: kind, path, LBA size, region, space used and free,\n"
             "and whether its label and identity still match (exit 1 when one does not).",
    .example = "tensorvault devices",
};

int tv__cli_devices(const tv__cli_ctx *c)
{
    json_t *doc = NULL;
    int rc = listing(c, "/v1/devices", NULL, "devices", TV__DOC_DEVICES, &doc);
    if (rc)
        return rc;
    /* A device that is not "ok" (missing, resized, unreadable) fails the
     * command, after the whole table is shown. */
    size_t i;
    json_t *d;
    json_array_foreach(json_object_get(doc, "devices"), i, d)
    {
        const char *s = json_string_value(json_object_get(d, "status"));
        if (!s || strcmp(s, "ok"))
            rc = TV__EXIT_FAIL;
    }
    json_decref(doc);
    return rc;
}

/* ---- generation changes ------------------------------------------------------ */

const tv__cli_cmd tv__cli_cmd_activate = {
    .name = "activate",
    .run = tv__cli_activate,
    .positionals = "NAME GEN|ALIAS",
    .min_pos = 2,
    .max_pos = 2,
    .opts = {TV__CLI_CLIENT_OPTS},
    .about = "Make a ready generation of model NAME the active one (what NAME and NAME@active\n"
             "open from now on; readers keep the generation they opened). GEN is a number,\n"
             "or an alias: the generation it points at. Says which generation was active\n"
             "before.",
    .example = "tensorvault activate llama 3\n"
               "tensorvault activate llama prod",
};

const tv__cli_cmd tv__cli_cmd_retire = {
    .name = "retire",
    .run = tv__cli_retire,
    .positionals = "NAME GEN",
    .min_pos = 2,
    .max_pos = 2,
    .flags = TV__CLI_GEN,
    .opts = {TV__CLI_CLIENT_OPTS},
    .about = "Retire generation GEN of model NAME: it is no longer opened, and `gc` frees its\n"
             "objects once no reader holds it. The active generation and an aliased one\n"
             "cannot be retired (move the alias or activate another first).",
    .example = "tensorvault retire llama 2 && tensorvault gc",
};

/* POST path, an activation of model (activate, rollback): the text says
 * from which generation to which, read from the model just before (not in
 * --json, whose document is the API's Generation as it is). */
static int activation(const tv__cli_ctx *c, const char *model, const char *path)
{
    tv_error err = {0};
    tv__cli_client cl;
    json_t *doc = NULL;
    int64_t was = -1;
    char mpath[SEG_MAX + 16];
    int rc = tv__cli_client_open(c, true, &cl, &err);
    if (!rc && !c->json && !path_of(mpath, sizeof mpath, &err, "v1", "models", model, NULL)) {
        tv_error e2 = {0};
        json_t *m = NULL;
        int st = 0, grc = tv__cli_call(&cl, "GET", mpath, NULL, NULL, &m, &st, &e2);
        if (!grc) {
            json_t *a = json_object_get(m, "active_generation");
            was = json_is_integer(a) ? (int64_t)json_integer_value(a) : json_is_null(a) ? 0 : -1;
        } else if (!st || st >= 500) {
            /* no answer (no daemon, the store did not open) or a failure of
             * its own: that is the error, nothing is activated */
            rc = grc;
            err = e2;
        } /* a refusal (404, 403): the activation itself says what is wrong */
        json_decref(m);
    }
    json_t *body = json_object();
    if (!rc)
        rc = tv__cli_call(&cl, "POST", path, NULL, body, &doc, NULL, &err);
    tv__cli_client_close(&cl);
    json_decref(body);
    if (rc) {
        json_decref(doc);
        return tv__cli_failed(c, rc, &err);
    }
    if (c->json)
        tv__cli_print(stdout, true, TV__DOC_ACTIVATED, doc);
    else
        tv__cli_print_activated(stdout, doc, was);
    json_decref(doc);
    return TV__EXIT_OK;
}

static int gen_post(const tv__cli_ctx *c, const char *verb, bool alias_ok, tv__cli_doc kind)
{
    char gen[TV__ALIAS_MAX + 1], path[3 * SEG_MAX];
    tv_error err = {0};
    int u = alias_ok ? gen_or_alias(c, c->a.pos[1], gen, sizeof gen) : 0;
    if (u)
        return u;
    if (!alias_ok) /* TV__CLI_GEN: the prologue parsed it */
        snprintf(gen, sizeof gen, "%" PRId64, c->gen);
    if (path_of(path, sizeof path, &err, "v1", "models", c->a.pos[0], "generations", gen, verb,
                NULL))
        return tv__cli_failed(c, TV_E_INVALID_ARG, &err);
    if (kind == TV__DOC_ACTIVATED)
        return activation(c, c->a.pos[0], path);
    return one(c, true, "POST", path, NULL, json_object(), kind);
}

int tv__cli_activate(const tv__cli_ctx *c)
{
    return gen_post(c, "activate", true, TV__DOC_ACTIVATED);
}

int tv__cli_retire(const tv__cli_ctx *c)
{
    return gen_post(c, "retire", false, TV__DOC_RETIRED);
}

const tv__cli_cmd tv__cli_cmd_rollback = {
    .name = "rollback",
    .run = tv__cli_rollback,
    .positionals = "NAME",
    .min_pos = 1,
    .max_pos = 1,
    .opts = {TV__CLI_CLIENT_OPTS},
    .about = "Activate the highest ready generation below the active one of model NAME (409\n"
             "when there is none), and say from which generation to which.",
    .example = "tensorvault rollback llama",
};

int tv__cli_rollback(const tv__cli_ctx *c)
{
    char path[SEG_MAX + 32];
    tv_error err = {0};
    if (path_of(path, sizeof path, &err, "v1", "models", c->a.pos[0], "rollback", NULL))
        return tv__cli_failed(c, TV_E_INVALID_ARG, &err);
    return activation(c, c->a.pos[0], path);
}

const tv__cli_cmd tv__cli_cmd_deactivate = {
    .name = "deactivate",
    .run = tv__cli_deactivate,
    .positionals = "NAME",
    .min_pos = 1,
    .max_pos = 1,
    .opts = {TV__CLI_CLIENT_OPTS},
    .about = "Leave model NAME without an active generation: NAME no longer opens (NAME@GEN\n"
             "and NAME@ALIAS still do), so that the model can be deleted. A no-op when none\n"
             "is active.",
    .example = "tensorvault deactivate llama && tensorvault delete llama",
};

int tv__cli_deactivate(const tv__cli_ctx *c)
{
    char path[SEG_MAX + 32];
    tv_error err = {0};
    if (path_of(path, sizeof path, &err, "v1", "models", c->a.pos[0], "deactivate", NULL))
        return tv__cli_failed(c, TV_E_INVALID_ARG, &err);
    return one(c, true, "POST", path, NULL, json_object(), TV__DOC_DEACTIVATED);
}

const tv__cli_cmd tv__cli_cmd_delete = {
    .name = "delete",
    .run = tv__cli_delete,
    .positionals = "NAME",
    .min_pos = 1,
    .max_pos = 1,
    .opts = {TV__CLI_CLIENT_OPTS},
    .about = "Delete model NAME: every generation is retired and its objects freed. Refused\n"
             "while a generation is active or aliased (deactivate it, remove the aliases).",
    .example = "tensorvault delete llama",
};

int tv__cli_delete(const tv__cli_ctx *c)
{
    char path[SEG_MAX + 32];
    tv_error err = {0};
    if (path_of(path, sizeof path, &err, "v1", "models", c->a.pos[0], NULL))
        return tv__cli_failed(c, TV_E_INVALID_ARG, &err);
    return one(c, true, "DELETE", path, NULL, NULL, TV__DOC_DELETED);
}

/* ---- aliases ------------------------------------------------------------------ */

const tv__cli_cmd tv__cli_cmd_alias_set = {
    .name = "alias set",
    .run = tv__cli_alias_set,
    .positionals = "NAME ALIAS GEN",
    .min_pos = 3,
    .max_pos = 3,
    .opts = {TV__CLI_CLIENT_OPTS},
    .about = "Point alias ALIAS of model NAME at ready generation GEN, atomically (readers\n"
             "that opened NAME@ALIAS keep the generation they opened). ALIAS is a letter,\n"
             "then up to 63 letters, digits, '.', '_' or '-'; \"active\" activates GEN.",
    .example = "tensorvault alias set llama prod 3\n"
               "tensorvault get llama@prod model.norm.weight -o w.bin",
};

const tv__cli_cmd tv__cli_cmd_alias_rm = {
    .name = "alias rm",
    .run = tv__cli_alias_rm,
    .positionals = "NAME ALIAS",
    .min_pos = 2,
    .max_pos = 2,
    .opts = {TV__CLI_CLIENT_OPTS},
    .about = "Remove alias ALIAS of model NAME (the generation stays). \"active\" cannot be\n"
             "removed: activate another generation, or deactivate the model.",
    .example = "tensorvault alias rm llama canary",
};

const tv__cli_cmd tv__cli_cmd_alias_list = {
    .name = "alias list",
    .run = tv__cli_alias_list,
    .positionals = "NAME",
    .min_pos = 1,
    .max_pos = 1,
    .opts = {TV__CLI_CLIENT_OPTS},
    .about = "List the aliases of model NAME and the generation each points at.",
    .example = "tensorvault alias list llama",
};

static int alias_path(const tv__cli_ctx *c, char *path, size_t len, const char *alias)
{
    tv_error err = {0};
    if (path_of(path, len, &err, "v1", "models", c->a.pos[0], "aliases", alias, NULL))
        return tv__cli_failed(c, TV_E_INVALID_ARG, &err);
    return 0;
}

int tv__cli_alias_set(const tv__cli_ctx *c)
{
    char path[2 * SEG_MAX + 32];
    int64_t g;
    int u = tv__cli_gen(c->cmd->name, c->a.pos[2], &g);
    if (u || (u = alias_path(c, path, sizeof path, c->a.pos[1])))
        return u;
    return one(c, true, "PUT", path, NULL, json_pack("{s:I}", "generation", (json_int_t)g),
               TV__DOC_ALIAS);
}

int tv__cli_alias_rm(const tv__cli_ctx *c)
{
    char path[2 * SEG_MAX + 32];
    int u = alias_path(c, path, sizeof path, c->a.pos[1]);
    return u ? u : one(c, true, "DELETE", path, NULL, NULL, TV__DOC_ALIAS_REMOVED);
}

int tv__cli_alias_list(const tv__cli_ctx *c)
{
    char path[2 * SEG_MAX + 32];
    int u = alias_path(c, path, sizeof path, NULL);
    return u ? u : one(c, false, "GET", path, NULL, NULL, TV__DOC_ALIASES);
}

/* ---- jobs: import, verify, gc, jobs, job, cancel -------------------------------- */

static bool job_finished(const json_t *job)
{
    const char *s = json_string_value(json_object_get(job, "state"));
    return s && (!strcmp(s, "succeeded") || !strcmp(s, "failed") || !strcmp(s, "cancelled"));
}

/* The failed or cancelled job's error into err; returns its code. */
static int job_error(const json_t *job, tv_error *err)
{
    json_t *e = json_object_get(job, "error");
    if (json_is_object(e)) {
        json_t *w = json_pack("{s:O}", "error", e);
        int rc = tv__cli_doc_error(w, 0, err);
        json_decref(w);
        return rc;
    }
    return tv__seterr(err, TV_E_STATE, "job %" JSON_INTEGER_FORMAT " %s",
                      json_integer_value(json_object_get(job, "id")),
                      json_string_value(json_object_get(job, "state")));
}

/* Polls GET /v1/jobs/ID every 200 ms until the job ends, drawing the bar;
 * *job is replaced by the final document. */
static int follow(tv__cli_client *cl, json_t **job, tv__cli_progress *bar, tv_error *err)
{
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%" JSON_INTEGER_FORMAT,
             json_integer_value(json_object_get(*job, "id")));
    while (!job_finished(*job)) {
        tv__cli_progress_job(bar, *job);
        struct timespec ts = {0, 200 * 1000 * 1000};
        nanosleep(&ts, NULL);
        json_t *now = NULL;
        int rc = tv__cli_call(cl, "GET", path, NULL, NULL, &now, NULL, err);
        if (rc) {
            json_decref(now);
            return rc;
        }
        json_decref(*job);
        *job = now;
    }
    tv__cli_progress_job(bar, *job);
    tv__cli_progress_end(bar);
    return 0;
}

/* Source paths go to the daemon absolute (it does not share our cwd). */
static int absolute(const char *src, char *out, size_t len, tv_error *err)
{
    char cwd[TV__CLI_PATH_MAX];
    if (src[0] == '/' || tv__src_is_url(src) || tv__src_is_hub(src)) { /* a URL goes as given */
        if (strlen(src) >= len)
            return tv__seterr(err, TV_E_INVALID_ARG, "source path '%.64s...' is too long", src);
        memcpy(out, src, strlen(src) + 1);
        return 0;
    }
    if (!getcwd(cwd, sizeof cwd))
        return tv__seterr(err, -errno, "source '%s': the current directory: %s", src,
                          strerror(errno));
    int w = snprintf(out, len, "%s/%s", cwd, src);
    if (w < 0 || (size_t)w >= len)
        return tv__seterr(err, TV_E_INVALID_ARG, "source path '%.64s...' is too long", src);
    return 0;
}

/* Submits a job (POST path body) through cl (NULL: a client of its own),
 * follows it when asked (always in local mode, where the api runs it
 * inline), prints the finished job's result as kind, or the Job itself when
 * not followed. A job that did not succeed is a failure naming its error,
 * unless keep_result and it has a result (verify: the result says which
 * objects failed); *result_out (may be NULL) gets the result. Returns the
 * exit status. */
static int run_job(const tv__cli_ctx *c, tv__cli_client *cl, const char *path, json_t *body,
                   bool wait, tv__cli_doc kind, bool keep_result, json_t **result_out)
{
    tv_error err = {0};
    tv__cli_client own;
    tv__cli_progress bar;
    json_t *job = NULL;
    int rc = 0;
    tv__cli_progress_start(&bar, c->json);
    if (!cl) {
        cl = &own;
        rc = tv__cli_client_open(c, true, cl, &err);
    }
    cl->progress = &bar;
    if (!rc)
        rc = tv__cli_call(cl, "POST", path, NULL, body, &job, NULL, &err);
    bool follow_it = wait || bar.on || cl->local;
    if (!rc && follow_it)
        rc = follow(cl, &job, &bar, &err);
    tv__cli_progress_end(&bar);
    cl->progress = NULL;
    if (cl == &own)
        tv__cli_client_close(cl);
    json_decref(body);
    const char *state = json_string_value(json_object_get(job, "state"));
    json_t *res = json_object_get(job, "result");
    bool ok = state && !strcmp(state, "succeeded");
    if (!rc && follow_it && !ok && !(keep_result && json_is_object(res)))
        rc = job_error(job, &err);
    if (rc) {
        json_decref(job);
        return tv__cli_failed(c, rc, &err);
    }
    if (!follow_it) {
        tv__cli_print(stdout, c->json, TV__DOC_JOB, job);
        json_decref(job);
        return TV__EXIT_OK;
    }
    tv__cli_print(stdout, c->json, kind, res ? res : json_null());
    if (result_out)
        *result_out = json_incref(res);
    json_decref(job);
    return ok ? TV__EXIT_OK : TV__EXIT_FAIL;
}

const tv__cli_cmd tv__cli_cmd_import = {
    .name = "import",
    .run = tv__cli_import,
    .positionals = "NAME SRC",
    .min_pos = 2,
    .max_pos = 2,
    .opts = {{"--activate", NULL, NULL, "make the new generation active once it is ready"},
             {"--alias", "A", NULL, "point alias A at the new generation once it is ready"},
             {"--strict", NULL, NULL,
              "read every written object back and re-hash it before publishing"},
             {"--wait", NULL, NULL,
              "follow the job to its end off a terminal too (exit 1 if it fails)"},
             {"--replicas", "DEV,...", NULL,
              "a copy on each named device (id, path or UUID; needs --store)"},
             {"--chunk", "SIZE", NULL, "bytes per write, 4K..256M (default 8M; needs --store)"},
             TV__CLI_CLIENT_OPTS},
    .about = "Import a safetensors checkpoint as a new generation of model NAME. SRC is a\n"
             ".safetensors file, a model.safetensors.index.json, a directory holding one, or\n"
             "an http(s):// or s3:// URL, or hf://ORG/REPO[@REVISION] from the Hugging Face\n"
             "Hub. The daemon takes local sources only under its import roots (import.roots\n"
             "in its config, --set import.roots=DIR1:DIR2, or $TENSORVAULT_IMPORT_ROOTS) and\n"
             "URLs only under import.origins; it fetches hf:// sources with its own\n"
             "HF_TOKEN (this command never sends its environment's; with --store it is the\n"
             "one fetching and reads HF_ENDPOINT and HF_TOKEN). The import is a\n"
             "job: on a terminal (or with --wait) a progress bar follows it and the result is\n"
             "printed; otherwise the queued job is printed (follow it with `job ID`).",
    .example = "tensorvault import llama ./Llama-3-8B --activate --alias prod --wait\n"
               "tensorvault import --store /srv/tv llama ./ckpt --replicas 1,2\n"
               "tensorvault import qwen hf://Qwen/Qwen2.5-0.5B@main --wait",
};

int tv__cli_import(const tv__cli_ctx *c)
{
    const tv__cli_args *a = &c->a;
    tv_error err = {0};
    char src[TV__CLI_PATH_MAX];
    /* --replicas and --chunk are the local importer's own knobs (the API
     * has neither): with them the importer runs here, directly. */
    if (tv__cli_get(a, "--replicas") || tv__cli_get(a, "--chunk")) {
        if (!tv__cli_get(a, "--store"))
            return tv__cli_usage(c->cmd->name,
                                 "--replicas and --chunk need --store DIR (local mode)");
        return tv__cli_import_local(c);
    }
    int rc = tv__name_valid(a->pos[0], "model name", &err);
    if (rc)
        return tv__cli_failed(c, rc, &err);
    if ((rc = absolute(a->pos[1], src, sizeof src, &err)))
        return tv__cli_failed(c, rc, &err);
    json_t *body = json_pack("{s:s,s:s,s:b,s:b}", "model", a->pos[0], "source", src, "activate",
                             tv__cli_flag(a, "--activate"), "strict", tv__cli_flag(a, "--strict"));
    if (tv__cli_get(a, "--alias"))
        json_object_set_new(body, "alias", json_string(tv__cli_get(a, "--alias")));
    return run_job(c, NULL, "/v1/imports", body, tv__cli_flag(a, "--wait"), TV__DOC_IMPORT, false,
                   NULL);
}

const tv__cli_cmd tv__cli_cmd_verify = {
    .name = "verify",
    .run = tv__cli_verify,
    .positionals = "",
    .min_pos = 0,
    .max_pos = 0,
    .opts = {{"--device", "ID", NULL, "only the objects on device ID"}, TV__CLI_CLIENT_OPTS},
    .about = "Re-hash every stored object (or those on one device) against the registry's\n"
             "SHA-256 and wait for the result. Each failed object is named on stderr with the\n"
             "models, generations and shards using it; exit 1 when one failed. On a local\n"
             "store (--store) it runs here, read-only.",
    .example = "tensorvault verify\n"
               "tensorvault verify --device 2 --json",
};

int tv__cli_verify(const tv__cli_ctx *c)
{
    uint64_t dev = 0;
    json_t *res = NULL, *h = NULL;
    tv_error err = {0};
    tv__cli_client cl;
    int u = tv__cli_opt_uint(c->cmd->name, &c->a, "--device", 1, INT64_MAX, &dev);
    if (u)
        return u;
    /* A local store is verified here, read-only: a verify job would be a
     * writer (its row), and verify works on a read-only mount and beside a
     * running writer. A daemon is asked first (GET /healthz) so that the
     * no-daemon fallback to $TENSORVAULT_STORE decides the same way. */
    int hs = 0, rc = tv__cli_client_open(c, true, &cl, &err);
    if (!rc && !cl.local &&
        (rc = tv__cli_call(&cl, "GET", "/healthz", NULL, NULL, &h, &hs, &err)) && hs)
        rc = 0; /* any answer: a daemon is there */
    json_decref(h);
    if (rc) {
        tv__cli_client_close(&cl);
        return tv__cli_failed(c, rc, &err);
    }
    if (cl.local) {
        const char *dir = cl.store;
        tv__cli_client_close(&cl);
        return tv__cli_verify_local(c, dir, (int64_t)dev);
    }
    json_t *body = dev ? json_pack("{s:I}", "device_id", (json_int_t)dev) : json_object();
    rc = run_job(c, &cl, "/v1/verify", body, true, TV__DOC_VERIFY, true, &res);
    tv__cli_client_close(&cl);
    if (!res)
        return rc;
    /* Every failed object on stderr, naming who uses it (both modes). */
    size_t i, k;
    json_t *o, *u2;
    json_array_foreach(json_object_get(res, "objects"), i, o)
    {
        const char *st = json_string_value(json_object_get(o, "status"));
        if (st && !strcmp(st, "ok"))
            continue;
        fprintf(stderr,
                "tensorvault: verify: object %" JSON_INTEGER_FORMAT
                " on device %" JSON_INTEGER_FORMAT ":",
                json_integer_value(json_object_get(o, "object_id")),
                json_integer_value(json_object_get(o, "device_id")));
        json_array_foreach(json_object_get(o, "used_by"), k, u2)
            fprintf(stderr, "%s model '%s' generation %" JSON_INTEGER_FORMAT "%s shard '%s'",
                    k ? ";" : "", json_string_value(json_object_get(u2, "model")),
                    json_integer_value(json_object_get(u2, "generation")),
                    json_is_true(json_object_get(u2, "active")) ? " (active)" : "",
                    json_string_value(json_object_get(u2, "shard")));
        if (!json_array_size(json_object_get(o, "used_by")))
            fprintf(stderr, " no generation");
        /* The code name, as the local verifier always printed it. */
        fprintf(stderr, ": %s: %s\n",
                st && !strcmp(st, "mismatch") ? tv_err_name(TV_E_HASH_MISMATCH) : "error",
                json_string_value(json_object_get(o, "message")));
    }
    if (json_integer_value(json_object_get(res, "n_failed")))
        rc = TV__EXIT_FAIL;
    json_decref(res);
    return rc;
}

const tv__cli_cmd tv__cli_cmd_gc = {
    .name = "gc",
    .run = tv__cli_gc,
    .positionals = "",
    .min_pos = 0,
    .max_pos = 0,
    .opts = {TV__CLI_CLIENT_OPTS},
    .about = "Free the objects no ready or importing generation uses (retired generations',\n"
             "once no reader holds them) and say how much space came back.",
    .example = "tensorvault retire llama 1 && tensorvault gc",
};

int tv__cli_gc(const tv__cli_ctx *c)
{
    return one(c, true, "POST", "/v1/gc", NULL, json_object(), TV__DOC_GC);
}

const tv__cli_cmd tv__cli_cmd_jobs = {
    .name = "jobs",
    .run = tv__cli_jobs,
    .positionals = "",
    .min_pos = 0,
    .max_pos = 0,
    .opts = {{"--state", "S", NULL,
              "only jobs in state S: queued, running, succeeded, failed, cancelled"},
             {"--kind", "K", NULL, "only jobs of kind K: import or verify"},
             TV__CLI_CLIENT_OPTS},
    .about = "List import and verify jobs, newest first: state, model, step, bytes done of\n"
             "the total, the generation made, when it started and how long it ran (or runs).",
    .example = "tensorvault jobs --state running",
};

int tv__cli_jobs(const tv__cli_ctx *c)
{
    static const char *const states[] = {"queued", "running", "succeeded", "failed", "cancelled"};
    const char *st = tv__cli_get(&c->a, "--state"), *kind = tv__cli_get(&c->a, "--kind");
    char q[256] = "";
    tv_error err = {0};
    bool ok = !st;
    for (size_t i = 0; st && i < TV_ARRAY_LEN(states); i++)
        ok |= !strcmp(st, states[i]);
    if (!ok)
        return tv__cli_usage(
            c->cmd->name, "bad --state '%s': queued, running, succeeded, failed or cancelled", st);
    if (kind && strcmp(kind, "import") && strcmp(kind, "verify"))
        return tv__cli_usage(c->cmd->name, "bad --kind '%s': import or verify", kind);
    tv__cli_query_add(q, sizeof q, "state", st, &err);
    tv__cli_query_add(q, sizeof q, "kind", kind, &err);
    return listing(c, "/v1/jobs", q[0] ? q : NULL, "jobs", TV__DOC_JOBS, NULL);
}

/* The fast path's connected workers (GET /v1/sessions): an empty table in
 * local mode and when the daemon runs without the fast path. */
const tv__cli_cmd tv__cli_cmd_sessions = {
    .name = "sessions",
    .run = tv__cli_sessions,
    .positionals = "",
    .min_pos = 0,
    .max_pos = 0,
    .opts = {TV__CLI_CLIENT_OPTS},
    .about = "List the workers connected to the daemon's fast path, one line per open model\n"
             "handle: session, pid, uid, model, generation, bytes delivered.",
    .example = "tensorvault sessions",
};

int tv__cli_sessions(const tv__cli_ctx *c)
{
    return one(c, false, "GET", "/v1/sessions", NULL, NULL, TV__DOC_SESSIONS);
}

/* The fleet as the daemon's fleet thread last read it (GET /v1/fleet); a
 * standalone node answers mode "standalone" with empty lists. */
const tv__cli_cmd tv__cli_cmd_fleet = {
    .name = "fleet",
    .run = tv__cli_fleet,
    .positionals = "",
    .min_pos = 0,
    .max_pos = 0,
    .opts = {TV__CLI_CLIENT_OPTS},
    .about = "Show the fleet as this node last read it from the catalog: nodes, fleet\n"
             "aliases with each placed node's pull state, and the catalog's generations.",
    .example = "tensorvault fleet",
};

int tv__cli_fleet(const tv__cli_ctx *c)
{
    return one(c, false, "GET", "/v1/fleet", NULL, NULL, TV__DOC_FLEET);
}

/* Moves a fleet alias in the catalog (PUT /v1/fleet/aliases/MODEL/ALIAS):
 * compare-and-set on --expect (0 for a new alias). */
const tv__cli_cmd tv__cli_cmd_fleet_alias = {
    .name = "fleet alias",
    .run = tv__cli_fleet_alias,
    .positionals = "MODEL ALIAS GENERATION",
    .min_pos = 3,
    .max_pos = 3,
    .opts = {{"--expect", "V", NULL,
              "the alias's version as read (0 for a new alias): compare-and-set"},
             {"--placement", "N1,N2", NULL, "the nodes that hold it (default: every node)"},
             {"--quorum", "Q", NULL,
              "0: every placed node ready before any switches; N: N ready nodes"},
             {"--timeout", "S", NULL, "seconds before a quorum switch (0 = 600)"},
             TV__CLI_CLIENT_OPTS},
    .about = "Move (or create) fleet alias ALIAS of MODEL to GENERATION in the catalog:\n"
             "every placed node pulls the generation, then switches. 409 when the alias's\n"
             "version moved since it was read (--expect).",
    .example = "tensorvault fleet alias llama prod 2 --expect 1 --placement n1,n2 --quorum 1",
};

int tv__cli_fleet_alias(const tv__cli_ctx *c)
{
    char path[3 * SEG_MAX];
    tv_error err = {0};
    int64_t gen = 0;
    uint64_t expect = 0, quorum = 0, timeout = 0;
    const char *pl = tv__cli_get(&c->a, "--placement");
    int u;
    if (tv__cli_parse_gen(c->a.pos[2], &gen))
        return tv__cli_usage(c->cmd->name, "bad generation '%s': a number from 1, digits only",
                             c->a.pos[2]);
    if (!tv__cli_get(&c->a, "--expect"))
        return tv__cli_usage(c->cmd->name,
                             "--expect V is required (the alias's version; 0 for a new alias)");
    if ((u = tv__cli_opt_uint(c->cmd->name, &c->a, "--expect", 0, INT64_MAX, &expect)) ||
        (u = tv__cli_opt_uint(c->cmd->name, &c->a, "--quorum", 0, 4096, &quorum)) ||
        (u = tv__cli_opt_uint(c->cmd->name, &c->a, "--timeout", 0, 86400, &timeout)))
        return u;
    json_t *placement = json_null();
    if (pl) {
        placement = json_array();
        for (const char *p = pl;;) {
            size_t n = strcspn(p, ",");
            if (n == 0 || n > 255) {
                json_decref(placement);
                return tv__cli_usage(c->cmd->name,
                                     "bad --placement '%s': node names (1..255 bytes) split by ','",
                                     pl);
            }
            json_array_append_new(placement, json_stringn(p, n));
            if (!p[n])
                break;
            p += n + 1;
        }
    }
    if (path_of(path, sizeof path, &err, "v1", "fleet", "aliases", c->a.pos[0], c->a.pos[1],
                NULL)) {
        json_decref(placement);
        return tv__cli_failed(c, TV_E_INVALID_ARG, &err);
    }
    json_t *body = json_pack("{s:I,s:I,s:o,s:I,s:I}", "generation", (json_int_t)gen,
                             "expect_version", (json_int_t)expect, "placement", placement, "quorum",
                             (json_int_t)quorum, "timeout_s", (json_int_t)timeout);
    return one(c, true, "PUT", path, NULL, body, TV__DOC_FLEET_ALIAS);
}

const tv__cli_cmd tv__cli_cmd_job = {
    .name = "job",
    .run = tv__cli_job,
    .positionals = "ID",
    .min_pos = 1,
    .max_pos = 1,
    .opts = {TV__CLI_CLIENT_OPTS},
    .about = "Show job ID: state, step, progress, times, and its error if it failed.",
    .example = "tensorvault job 7",
};

const tv__cli_cmd tv__cli_cmd_cancel = {
    .name = "cancel",
    .run = tv__cli_cancel,
    .positionals = "ID",
    .min_pos = 1,
    .max_pos = 1,
    .opts = {TV__CLI_CLIENT_OPTS},
    .about = "Cancel queued or running job ID: nothing is published and its reservations are\n"
             "released. Answers at once with the job as it is (a running job stops within\n"
             "about a second).",
    .example = "tensorvault cancel 7",
};

/* An ID positional: 1..INT64_MAX. */
static int id_arg(const tv__cli_ctx *c, const char *what, const char *s, int64_t *id)
{
    if (tv__cli_parse_gen(s, id))
        return tv__cli_usage(c->cmd->name, "bad %s id '%s': a number from 1, digits only", what, s);
    return 0;
}

int tv__cli_job(const tv__cli_ctx *c)
{
    int64_t id;
    char path[64];
    int u = id_arg(c, "job", c->a.pos[0], &id);
    if (u)
        return u;
    snprintf(path, sizeof path, "/v1/jobs/%" PRId64, id);
    return one(c, false, "GET", path, NULL, NULL, TV__DOC_JOB);
}

int tv__cli_cancel(const tv__cli_ctx *c)
{
    int64_t id;
    char path[64];
    int u = id_arg(c, "job", c->a.pos[0], &id);
    if (u)
        return u;
    snprintf(path, sizeof path, "/v1/jobs/%" PRId64 "/cancel", id);
    return one(c, true, "POST", path, NULL, json_object(), TV__DOC_CANCELLED);
}

/* ---- tokens, status ---------------------------------------------------------- */

const tv__cli_cmd tv__cli_cmd_token_create = {
    .name = "token create",
    .run = tv__cli_token_create,
    .positionals = "NAME",
    .min_pos = 1,
    .max_pos = 1,
    .opts = {{"--scope", "admin|read|fleet", NULL,
              "admin: every route; read (default): the read routes; fleet: a peer's blob routes"},
             TV__CLI_CLIENT_OPTS},
    .about = "Create API token NAME and print its secret, once (the registry keeps only its\n"
             "hash). Give it to a client with --token-file or $TENSORVAULT_TOKEN_FILE.",
    .example = "tensorvault token create ci --scope read > ci.token",
};

const tv__cli_cmd tv__cli_cmd_token_list = {
    .name = "token list",
    .run = tv__cli_token_list,
    .positionals = "",
    .min_pos = 0,
    .max_pos = 0,
    .opts = {TV__CLI_CLIENT_OPTS},
    .about = "List the API tokens (never their secrets): scope, created, revoked.",
    .example = "tensorvault token list",
};

const tv__cli_cmd tv__cli_cmd_token_revoke = {
    .name = "token revoke",
    .run = tv__cli_token_revoke,
    .positionals = "ID",
    .min_pos = 1,
    .max_pos = 1,
    .opts = {TV__CLI_CLIENT_OPTS},
    .about = "Revoke token ID (revoking twice is a no-op).",
    .example = "tensorvault token revoke 3",
};

int tv__cli_token_create(const tv__cli_ctx *c)
{
    const char *scope = tv__cli_get(&c->a, "--scope");
    if (!scope)
        scope = "read";
    if (strcmp(scope, "admin") && strcmp(scope, "read") && strcmp(scope, "fleet"))
        return tv__cli_usage(c->cmd->name, "bad --scope '%s': admin, read or fleet", scope);
    return one(c, true, "POST", "/v1/tokens", NULL,
               json_pack("{s:s,s:s}", "name", c->a.pos[0], "scope", scope), TV__DOC_TOKEN);
}

int tv__cli_token_list(const tv__cli_ctx *c)
{
    return one(c, false, "GET", "/v1/tokens", NULL, NULL, TV__DOC_TOKENS);
}

int tv__cli_token_revoke(const tv__cli_ctx *c)
{
    int64_t id;
    char path[64];
    int u = id_arg(c, "token", c->a.pos[0], &id);
    if (u)
        return u;
    snprintf(path, sizeof path, "/v1/tokens/%" PRId64, id);
    return one(c, true, "DELETE", path, NULL, NULL, TV__DOC_TOKEN_REVOKED);
}

const tv__cli_cmd tv__cli_cmd_status = {
    .name = "status",
    .run = tv__cli_status,
    .positionals = "",
    .min_pos = 0,
    .max_pos = 0,
    .opts = {TV__CLI_CLIENT_OPTS},
    .about = "Show the daemon's status: version, store, uptime, models, devices, jobs,\n"
             "whether this client may read without a token, and the memory tier.",
    .example = "tensorvault status",
};

int tv__cli_status(const tv__cli_ctx *c)
{
    return one(c, false, "GET", "/v1/status", NULL, NULL, TV__DOC_STATUS);
}

/* ---- demo ---------------------------------------------------------------------- */

const tv__cli_cmd tv__cli_cmd_demo = {
    .name = "demo",
    .run = tv__cli_demo,
    .positionals = "",
    .min_pos = 0,
    .max_pos = 0,
    .opts = {{"--layers", "N", NULL,
              "transformer layers, 1..96 (default 12: GPT-2 small, about 250 MB)"},
             {"--dir", "D", NULL, "where the checkpoint is written (default var/demo)"},
             TV__CLI_CLIENT_OPTS},
    .about = "Generate a GPT-2-shaped BF16 checkpoint (scripts/gen_demo.py of the source\n"
             "tree, with its .venv python or $TENSORVAULT_PYTHON) and import it as model\n"
             "\"demo\", activated.",
    .example = "tensorvault demo --layers 2",
};

/* The venv python of the source tree (or $TENSORVAULT_PYTHON). */
static const char *python(char *buf, size_t len)
{
    const char *p = getenv("TENSORVAULT_PYTHON");
    if (p && *p)
        return p;
    snprintf(buf, len, "%s/.venv/bin/python", TV__CLI_SOURCE_DIR);
    return access(buf, X_OK) == 0 ? buf : "python3";
}

int tv__cli_demo(const tv__cli_ctx *c)
{
    uint64_t layers = 12;
    char py[TV__CLI_PATH_MAX], script[TV__CLI_PATH_MAX], lay[24];
    const char *dir = tv__cli_get(&c->a, "--dir");
    int u = tv__cli_opt_uint(c->cmd->name, &c->a, "--layers", 1, 96, &layers);
    if (u)
        return u;
    if (!dir)
        dir = "var/demo";
    snprintf(script, sizeof script, "%s/scripts/gen_demo.py", TV__CLI_SOURCE_DIR);
    snprintf(lay, sizeof lay, "%" PRIu64, layers);
    const char *pyexe = python(py, sizeof py);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        /* The generator prints the index path: keep stdout for our document. */
        if (dup2(2, 1) < 0)
            _exit(127);
        execlp(pyexe, pyexe, script, dir, "--layers", lay, (char *)NULL);
        fprintf(stderr, "tensorvault: demo: cannot run %s: %s\n", pyexe, strerror(errno));
        _exit(127);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        tv_error err = {0};
        tv__seterr(&err, TV_E_INTERNAL, "%s %s %s --layers %s failed (status %d)", pyexe, script,
                   dir, lay, status);
        return tv__cli_failed(c, TV_E_INTERNAL, &err);
    }
    /* Then `import demo DIR --activate --wait` with the same mode, token
     * and output: the import command itself, on a made-up command line. */
    static const char *const pass[] = {"--store", "--url", "--token-file"};
    char *argv[16];
    int argc = 0;
    argv[argc++] = (char *)"import";
    argv[argc++] = (char *)"demo";
    argv[argc++] = (char *)dir;
    argv[argc++] = (char *)"--activate";
    argv[argc++] = (char *)"--wait";
    for (size_t i = 0; i < TV_ARRAY_LEN(pass); i++) {
        const char *v = tv__cli_get(&c->a, pass[i]);
        if (v) {
            argv[argc++] = (char *)pass[i];
            argv[argc++] = (char *)v;
        }
    }
    if (c->json)
        argv[argc++] = (char *)"--json";
    argv[argc] = NULL;
    tv__cli_ctx ic;
    int u2 = tv__cli_begin(&tv__cli_cmd_import, argc, argv, &ic);
    return u2 ? u2 : tv__cli_import(&ic);
}
