/* The sidecar file commands of the tensorvault CLI (docs/cli.md): `files`
 * lists a generation's sidecar files, `checkout` writes them into a
 * directory a loader can be pointed at, with the generation's
 * model.safetensors.index.json and the record tensorvault.json naming the
 * model and the generation number they came from (python/tensorvault
 * resolves the index's shard names through it: the weights are read from
 * that generation, never from a file beside the config).
 *
 * Invariants: checkout resolves NAME@GEN|@ALIAS to a number once and reads
 * every file from that number; every file is downloaded and checked
 * against its size and SHA-256, and every target checked, before the
 * first is written (a refusal changes nothing); a different file already
 * in DIR is replaced only with --force; each file is written to a
 * temporary name beside it, flushed, then renamed over; a path is never
 * followed through a symbolic link inside DIR; the record is written last
 * and holds no time, so the same checkout twice writes nothing new. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/client.h"
#include "import/source.h"
#include "util/hex.h"
#include "util/internal.h"
#include "util/sha256.h"
#include "util/sys.h"

#define PATH_BUF      8192
#define RECORD_NAME   "tensorvault.json"
#define INDEX_NAME    "model.safetensors.index.json"
#define TENSORS_LIMIT "1000"

/* "/v1/models/NAME/generations/GEN[/tail[/FILE]]": NAME, GEN and FILE one
 * segment each (a file's '/'s as %2F: any depth fits the router). */
static int gen_path(char *buf, size_t len, const char *name, const char *gen, const char *tail,
                    const char *file, tv_error *err)
{
    char n[1024], g[1024], f[3 * TV__SIDECAR_PATH_MAX + 1];
    int rc;
    if ((rc = tv__cli_seg(name, n, sizeof n, err)) || (rc = tv__cli_seg(gen, g, sizeof g, err)) ||
        (file && (rc = tv__cli_seg(file, f, sizeof f, err))))
        return rc;
    int w = snprintf(buf, len, "/v1/models/%s/generations/%s%s%s%s%s", n, g, tail ? "/" : "",
                     tail ? tail : "", file ? "/" : "", file ? f : "");
    if (w < 0 || (size_t)w >= len)
        return tv__seterr(err, TV_E_INVALID_ARG, "request path too long");
    return 0;
}

static int spec_of(const tv__cli_ctx *c, char *name, size_t name_len, char *gen, size_t gen_len)
{
    const char *spec = c->a.pos[0];
    if (tv__cli_parse_ref(spec, name, name_len, gen, gen_len))
        return tv__cli_usage(c->cmd->name, "bad model '%s' (NAME, NAME@GEN or NAME@ALIAS)", spec);
    return 0;
}

/* ---- files ---------------------------------------------------------------------- */

const tv__cli_cmd tv__cli_cmd_files = {
    .name = "files",
    .run = tv__cli_files,
    .positionals = "NAME[@GEN|@ALIAS]",
    .min_pos = 1,
    .max_pos = 1,
    .opts = {TV__CLI_CLIENT_OPTS},
    .about = "List the sidecar files of a generation (NAME alone: the active one): the\n"
             "config, tokenizer and other non-weight files its import stored, with their\n"
             "sizes and SHA-256.",
    .example = "tensorvault files llama@prod\n"
               "tensorvault files llama@2 --json",
};

int tv__cli_files(const tv__cli_ctx *c)
{
    char name[TV__CLI_SPEC_MAX], gen[TV__ALIAS_MAX + 1], path[PATH_BUF], sz[32];
    tv_error err = {0};
    tv__cli_client cl;
    json_t *doc = NULL;
    int rc = spec_of(c, name, sizeof name, gen, sizeof gen);
    if (rc)
        return rc;
    if ((rc = gen_path(path, sizeof path, name, gen, "files", NULL, &err)))
        return tv__cli_failed(c, TV_E_INVALID_ARG, &err);
    rc = tv__cli_client_open(c, false, &cl, &err);
    if (!rc)
        rc = tv__cli_call(&cl, "GET", path, NULL, NULL, &doc, NULL, &err);
    tv__cli_client_close(&cl);
    if (rc) {
        json_decref(doc);
        return tv__cli_failed(c, rc, &err);
    }
    if (c->json) {
        json_dumpf(doc, stdout, JSON_INDENT(2) | JSON_ENSURE_ASCII);
        fputc('\n', stdout);
    } else {
        json_t *fs = json_object_get(doc, "files");
        size_t i;
        json_t *f;
        printf("%-48s %10s  %s\n", "PATH", "SIZE", "SHA256");
        json_array_foreach(fs, i, f)
        {
            const char *sha = json_string_value(json_object_get(f, "sha256"));
            const char *p = json_string_value(json_object_get(f, "path"));
            printf("%-48s %10s  %.12s\n", p ? p : "-",
                   tv__cli_fmt_bytes((uint64_t)json_integer_value(json_object_get(f, "size")), sz,
                                     sizeof sz),
                   sha ? sha : "-");
        }
        printf("%zu files of %s generation %" PRId64 "\n", json_array_size(fs), name,
               (int64_t)json_integer_value(json_object_get(doc, "generation")));
    }
    json_decref(doc);
    return TV__EXIT_OK;
}

/* ---- checkout ------------------------------------------------------------------- */

const tv__cli_cmd tv__cli_cmd_checkout = {
    .name = "checkout",
    .run = tv__cli_checkout,
    .positionals = "NAME[@GEN|@ALIAS] DIR",
    .min_pos = 2,
    .max_pos = 2,
    .opts = {{"--force", NULL, NULL, "replace files in DIR that differ from the generation's"},
             TV__CLI_CLIENT_OPTS},
    .about = "Write a generation's sidecar files (config, tokenizer, ...) into DIR (created),\n"
             "with model.safetensors.index.json naming its shards and tensorvault.json\n"
             "recording the model and the generation NUMBER they came from. Point a loader\n"
             "at DIR under tensorvault.patched() (docs/python.md): the weights are read\n"
             "from that generation, so config and weights cannot drift apart. A different\n"
             "file already in DIR is refused without --force.",
    .example = "tensorvault checkout llama@prod /srv/models/llama\n"
               "tensorvault checkout minilm@1 ./minilm --force",
};

typedef struct out_file {
    char path[TV__SIDECAR_PATH_MAX + 1];
    char *data;
    size_t len;
    bool same; /* DIR holds it already, byte for byte */
} out_file;

/* Whether DIR/path holds f's bytes (f->same), or a different file that
 * only --force replaces; a symbolic link on the way is refused. */
static int check_target(const char *dir, out_file *f, bool force, tv_error *err)
{
    char p[PATH_MAX];
    struct stat sb;
    f->same = false;
    for (const char *s = strchr(f->path, '/');; s = strchr(s + 1, '/')) {
        size_t l = s ? (size_t)(s - f->path) : strlen(f->path);
        if ((size_t)snprintf(p, sizeof p, "%s/%.*s", dir, (int)l, f->path) >= sizeof p)
            return tv__seterr(err, -ENAMETOOLONG, "%s/%s: path too long", dir, f->path);
        if (lstat(p, &sb) < 0) {
            if (errno == ENOENT)
                return 0;
            return tv__cli_err(err, -errno, p);
        }
        if (S_ISLNK(sb.st_mode) && (s || !force))
            return tv__seterr(err, TV_E_CONFLICT,
                              "%s is a symbolic link: refusing to write through it%s", p,
                              s ? "" : " (--force replaces the link)");
        if (s && !S_ISDIR(sb.st_mode))
            return tv__seterr(err, TV_E_CONFLICT, "%s is not a directory", p);
        if (!s)
            break;
    }
    if (S_ISLNK(sb.st_mode))
        return 0;
    if (!S_ISREG(sb.st_mode))
        return tv__seterr(err, TV_E_CONFLICT, "%s exists and is not a regular file", p);
    int fd = tv__sys_open(p, O_RDONLY | O_NOFOLLOW | O_CLOEXEC, 0);
    if (fd < 0)
        return tv__cli_err(err, fd, p);
    bool same = (uint64_t)sb.st_size == f->len;
    char *have = same ? malloc(f->len ? f->len : 1) : NULL;
    if (same && (!have || tv__sys_pread_exact(fd, have, f->len, 0) ||
                 (f->len && memcmp(have, f->data, f->len))))
        same = false;
    free(have);
    tv__sys.close(fd);
    f->same = same;
    if (!same && !force)
        return tv__seterr(
            err, TV_E_CONFLICT,
            "%s exists and differs from the generation's '%s': refusing to overwrite it (--force replaces it)",
            p, f->path);
    return 0;
}

/* DIR/path's directories (made), then the bytes through a temporary name
 * beside it, flushed and renamed over. */
static int write_target(const char *dir, const out_file *f, tv_error *err)
{
    char p[PATH_MAX], tmp[PATH_MAX + 32];
    int rc;
    for (const char *s = strchr(f->path, '/'); s; s = strchr(s + 1, '/')) {
        snprintf(p, sizeof p, "%s/%.*s", dir, (int)(s - f->path), f->path);
        if (tv__sys.mkdir(p, 0755) < 0 && errno != EEXIST)
            return tv__cli_err(err, -errno, p);
    }
    snprintf(p, sizeof p, "%s/%s", dir, f->path);
    snprintf(tmp, sizeof tmp, "%s.tv-%ld.tmp", p, (long)getpid());
    int fd = tv__sys_open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0)
        return tv__cli_err(err, fd, tmp);
    if ((rc = tv__sys_pwrite_full(fd, f->data, f->len, 0)) || (rc = tv__sys_fsync(fd))) {
        tv__sys.close(fd);
        tv__sys.unlink(tmp);
        return tv__cli_err(err, rc, tmp);
    }
    tv__sys.close(fd);
    if (tv__sys.rename(tmp, p) < 0) {
        rc = -errno;
        tv__sys.unlink(tmp);
        return tv__cli_err(err, rc, p);
    }
    return 0;
}

typedef struct checkout {
    tv__cli_client cl;
    char name[TV__CLI_SPEC_MAX];
    int64_t number;
    json_t *files;  /* the API's list */
    json_t *gen;    /* the generation document (its shards) */
    json_t *record; /* tensorvault.json */
    out_file *out;
    size_t n_out, cap_out; /* files, then the index and the record */
} checkout;

/* Every sidecar file, downloaded and checked against the list. */
static int fetch_files(checkout *k, tv_error *err)
{
    char path[PATH_BUF], num[24], sha[65];
    size_t i, n = json_array_size(k->files);
    json_t *f;
    int rc = 0;
    snprintf(num, sizeof num, "%" PRId64, k->number);
    if (!(k->out = calloc(n + 2, sizeof(*k->out))))
        return tv__seterr(err, -ENOMEM, "out of memory");
    k->cap_out = n + 2;
    json_array_foreach(k->files, i, f)
    {
        const char *p = json_string_value(json_object_get(f, "path"));
        const char *want = json_string_value(json_object_get(f, "sha256"));
        json_int_t size = json_integer_value(json_object_get(f, "size"));
        /* The daemon's names pass the import's rule; checked again here,
         * since they become paths under DIR. */
        if ((rc = tv__sidecar_path_valid(p, err)))
            return rc;
        if (!strcmp(p, RECORD_NAME) || !strcmp(p, INDEX_NAME))
            continue; /* the checkout writes its own */
        out_file *o = &k->out[k->n_out];
        snprintf(o->path, sizeof o->path, "%s", p);
        if ((rc = gen_path(path, sizeof path, k->name, num, "files", p, err)) ||
            (rc = tv__cli_call_bytes(&k->cl, path, &o->data, &o->len, err)))
            return rc;
        k->n_out++;
        tv__sha256_hex(o->data, o->len, sha);
        if ((json_int_t)o->len != size || !want || strcmp(sha, want))
            return tv__seterr(
                err, TV_E_HASH_MISMATCH,
                "'%s' came as %zu bytes hashing to %s; the generation lists %lld bytes, %s", p,
                o->len, sha, (long long)size, want ? want : "no hash");
    }
    return 0;
}

/* The generation's weights as a loader finds them: a safetensors index
 * naming every tensor's shard (a single-shard generation too). */
static int make_index(checkout *k, out_file *o, tv_error *err)
{
    char path[PATH_BUF], num[24];
    json_t *map = json_object(), *doc = NULL;
    int rc = 0;
    snprintf(num, sizeof num, "%" PRId64, k->number);
    if ((rc = gen_path(path, sizeof path, k->name, num, "tensors", NULL, err)))
        goto out;
    char *cursor = NULL;
    for (;;) {
        char q[4096], enc[2048] = "";
        if (cursor && tv__cli_seg(cursor, enc, sizeof enc, err)) {
            rc = TV_E_INVALID_ARG;
            break;
        }
        snprintf(q, sizeof q, "limit=" TENSORS_LIMIT "%s%s", cursor ? "&cursor=" : "", enc);
        free(cursor);
        cursor = NULL;
        json_decref(doc);
        doc = NULL;
        if ((rc = tv__cli_call(&k->cl, "GET", path, q, NULL, &doc, NULL, err)))
            break;
        size_t i;
        json_t *t;
        json_array_foreach(json_object_get(doc, "tensors"), i, t)
        {
            const char *tn = json_string_value(json_object_get(t, "name"));
            if (tn && json_is_string(json_object_get(t, "shard")))
                json_object_set(map, tn, json_object_get(t, "shard"));
        }
        const char *next = json_string_value(json_object_get(doc, "next_cursor"));
        if (!next)
            break;
        if (!(cursor = strdup(next))) {
            rc = tv__seterr(err, -ENOMEM, "out of memory");
            break;
        }
    }
    free(cursor);
    if (rc)
        goto out;
    json_t *idx = json_pack("{s:{s:O},s:O}", "metadata", "total_size",
                            json_object_get(k->gen, "total_bytes"), "weight_map", map);
    snprintf(o->path, sizeof o->path, "%s", INDEX_NAME);
    o->data = idx ? json_dumps(idx, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
    json_decref(idx);
    if (!o->data) {
        rc = tv__seterr(err, -ENOMEM, "out of memory");
        goto out;
    }
    o->len = strlen(o->data);
out:
    json_decref(doc);
    json_decref(map);
    return rc;
}

/* tensorvault.json: where the files came from, and what. */
static int make_record(checkout *k, out_file *o, tv_error *err)
{
    json_t *shards = json_array(), *s;
    size_t i;
    json_array_foreach(json_object_get(k->gen, "shards"), i, s)
        json_array_append_new(shards, json_pack("{s:O,s:O,s:O}", "name", json_object_get(s, "name"),
                                                "size", json_object_get(s, "file_bytes"), "sha256",
                                                json_object_get(s, "sha256")));
    k->record =
        json_pack("{s:s,s:I,s:O,s:o,s:s}", "model", k->name, "generation", (json_int_t)k->number,
                  "files", k->files, "shards", shards, "index", INDEX_NAME);
    if (!k->record)
        return tv__seterr(err, -ENOMEM, "out of memory");
    const char *key = k->cl.local ? "store" : k->cl.http.is_unix ? "socket" : "url";
    const char *val = k->cl.local ? k->cl.store : k->cl.http.is_unix ? k->cl.http.value : k->cl.url;
    json_object_set_new(k->record, key, json_string(val ? val : ""));
    snprintf(o->path, sizeof o->path, "%s", RECORD_NAME);
    if (!(o->data = json_dumps(k->record, JSON_INDENT(2) | JSON_SORT_KEYS)))
        return tv__seterr(err, -ENOMEM, "out of memory");
    o->len = strlen(o->data);
    return 0;
}

static int resolve(checkout *k, const char *gen, tv_error *err)
{
    char path[PATH_BUF], num[24];
    int rc;
    json_t *files = NULL;
    if ((rc = gen_path(path, sizeof path, k->name, gen, NULL, NULL, err)) ||
        (rc = tv__cli_call(&k->cl, "GET", path, NULL, NULL, &k->gen, NULL, err)))
        return rc;
    k->number = (int64_t)json_integer_value(json_object_get(k->gen, "generation"));
    if (k->number <= 0)
        return tv__seterr(err, TV_E_INTERNAL, "the generation document has no number");
    snprintf(num, sizeof num, "%" PRId64, k->number);
    if ((rc = gen_path(path, sizeof path, k->name, num, "files", NULL, err)) ||
        (rc = tv__cli_call(&k->cl, "GET", path, NULL, NULL, &files, NULL, err))) {
        json_decref(files);
        return rc;
    }
    k->files = json_incref(json_object_get(files, "files"));
    json_decref(files);
    return k->files ? 0 : tv__seterr(err, TV_E_INTERNAL, "the file list has no files");
}

int tv__cli_checkout(const tv__cli_ctx *c)
{
    char gen[TV__ALIAS_MAX + 1];
    const char *dir = c->a.pos[1];
    bool force = tv__cli_flag(&c->a, "--force");
    tv_error err = {0};
    checkout k;
    memset(&k, 0, sizeof k);
    int rc = spec_of(c, k.name, sizeof k.name, gen, sizeof gen);
    if (rc)
        return rc;
    if (!*dir)
        return tv__cli_usage(c->cmd->name, "an empty DIR");
    if ((rc = tv__cli_client_open(c, false, &k.cl, &err)) || (rc = resolve(&k, gen, &err)) ||
        (rc = fetch_files(&k, &err)) || (rc = make_index(&k, &k.out[k.n_out], &err)))
        goto out;
    k.n_out++;
    if ((rc = make_record(&k, &k.out[k.n_out], &err)))
        goto out;
    k.n_out++;
    if (tv__sys.mkdir(dir, 0755) < 0 && errno != EEXIST) {
        rc = tv__cli_err(&err, -errno, dir);
        goto out;
    }
    struct stat sb;
    if (lstat(dir, &sb) < 0 || !S_ISDIR(sb.st_mode)) {
        rc = tv__seterr(&err, -ENOTDIR, "%s is not a directory", dir);
        goto out;
    }
    for (size_t i = 0; i < k.n_out; i++)
        if ((rc = check_target(dir, &k.out[i], force, &err)))
            goto out;
    size_t n_same = 0;
    for (size_t i = 0; i < k.n_out; i++) {
        if (k.out[i].same) {
            n_same++;
            continue;
        }
        if ((rc = write_target(dir, &k.out[i], &err)))
            goto out;
    }
    (void)tv__sys_fsync_dir(dir);
    if (c->json) {
        json_dumpf(k.record, stdout, JSON_INDENT(2) | JSON_ENSURE_ASCII);
        fputc('\n', stdout);
    } else {
        printf("checked out %s generation %" PRId64 " into %s: %zu files (%zu unchanged), %s, %s\n",
               k.name, k.number, dir, k.n_out - 2, n_same, INDEX_NAME, RECORD_NAME);
    }
out:
    tv__cli_client_close(&k.cl);
    for (size_t i = 0; i < k.cap_out; i++)
        free(k.out[i].data);
    free(k.out);
    json_decref(k.files);
    json_decref(k.gen);
    json_decref(k.record);
    return rc ? tv__cli_failed(c, rc, &err) : TV__EXIT_OK;
}
