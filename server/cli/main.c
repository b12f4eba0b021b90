/* The tensorvault command's dispatcher, tv__cli_main (in the tv_server
 * library so test tools can run the same CLI; main() is cli/entry.c), the
 * prologue every command starts with, and the usage text made from the
 * command tables. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "http/api.h"
#include "cli/cli.h"
#include "cli/client.h"
#include "cli/where.h"
#include "util/internal.h"
#include "tensorvault/errors.h"
#include "tensorvault/version.h"

const tv__cli_cmd *const tv__cli_cmds[] = {
    &tv__cli_cmd_inspect,      &tv__cli_cmd_store,        &tv__cli_cmd_import,
    &tv__cli_cmd_models,       &tv__cli_cmd_generations,  &tv__cli_cmd_generation,
    &tv__cli_cmd_tensors,      &tv__cli_cmd_tensor,       &tv__cli_cmd_devices,
    &tv__cli_cmd_activate,     &tv__cli_cmd_rollback,     &tv__cli_cmd_deactivate,
    &tv__cli_cmd_retire,       &tv__cli_cmd_alias_set,    &tv__cli_cmd_alias_rm,
    &tv__cli_cmd_alias_list,   &tv__cli_cmd_delete,       &tv__cli_cmd_gc,
    &tv__cli_cmd_verify,       &tv__cli_cmd_jobs,         &tv__cli_cmd_job,
    &tv__cli_cmd_cancel,       &tv__cli_cmd_token_create, &tv__cli_cmd_token_list,
    &tv__cli_cmd_token_revoke, &tv__cli_cmd_status,       &tv__cli_cmd_version,
    &tv__cli_cmd_demo,         &tv__cli_cmd_get,          &tv__cli_cmd_bench,
    &tv__cli_cmd_sessions,     &tv__cli_cmd_fleet_alias,  &tv__cli_cmd_fleet,
    &tv__cli_cmd_files,        &tv__cli_cmd_checkout,
};
const size_t tv__cli_n_cmds = TV_ARRAY_LEN(tv__cli_cmds);

static size_t n_opts(const tv__cli_cmd *cmd)
{
    size_t n = 0;
    while (n < TV__CLI_MAX_OPTS && cmd->opts[n].name)
        n++;
    return n;
}

const char *tv__cli_cmd_usage(const tv__cli_cmd *cmd, char *buf, size_t len)
{
    return tv__cli_usage_line(cmd->name, (cmd->flags & TV__CLI_STORE) != 0, cmd->positionals,
                              cmd->opts, n_opts(cmd), buf, len);
}

int tv__cli_begin(const tv__cli_cmd *cmd, int argc, char **argv, tv__cli_ctx *c)
{
    char usage[1024];
    int u;
    memset(c, 0, sizeof(*c));
    c->cmd = cmd;
    c->a.opts = cmd->opts;
    c->a.n_opts = n_opts(cmd);
    if ((u = tv__cli_parse(cmd->name, argc, argv, &c->a)))
        return u;
    c->json = tv__cli_flag(&c->a, "--json");
    if (cmd->flags & TV__CLI_STORE) {
        c->store = tv__cli_get(&c->a, "--store");
        if (!c->store)
            c->store = getenv("TENSORVAULT_STORE");
        if (!c->store || !*c->store)
            return tv__cli_usage(cmd->name, "--store DIR is required (or TENSORVAULT_STORE)");
    }
    if ((u = tv__cli_npos(cmd->name, &c->a, cmd->min_pos, cmd->max_pos,
                          tv__cli_cmd_usage(cmd, usage, sizeof(usage)))))
        return u;
    size_t nl =
        cmd->spec_len && cmd->spec_len < sizeof(c->model) ? cmd->spec_len : sizeof(c->model);
    char alias[TV__CLI_ALIAS_LEN];
    /* NAME@ALIAS (or @active) is the reader's too; a number goes through the
     * generation grammar, which names what is wrong. */
    if ((cmd->flags & TV__CLI_SPEC) &&
        !(tv__cli_parse_ref(c->a.pos[0], c->model, nl, alias, sizeof alias) == 0 &&
          !(alias[0] >= '0' && alias[0] <= '9')) &&
        (u = tv__cli_spec(cmd->name, c->a.pos[0], c->model, nl, &c->gen)))
        return u;
    if ((cmd->flags & TV__CLI_GEN) && (u = tv__cli_gen(cmd->name, c->a.pos[1], &c->gen)))
        return u;
    return 0;
}

int tv__cli_err(tv_error *err, int code, const char *what)
{
    /* tv__seterr formats aside, so what may be err->msg itself. */
    return tv__seterr(err, code, "%s: %s", what, tv_strerror(code));
}

void tv__cli_fail(const char *cmd, bool json, int code, const char *msg)
{
    fprintf(stderr, "tensorvault: %s: %s: %s\n", cmd, tv_err_name(code), msg);
    if (json) {
        json_t *o = json_pack("{s:{s:s,s:i,s:s}}", "error", "code", tv_err_name(code), "errno",
                              code, "message", msg);
        if (o) {
            json_dumpf(o, stdout, JSON_INDENT(2));
            fputc('\n', stdout);
            json_decref(o);
        }
    }
}

int tv__cli_failed(const tv__cli_ctx *c, int code, const tv_error *err)
{
    tv__cli_fail(c->cmd->name, c->json, code, err->msg[0] ? err->msg : tv_strerror(code));
    return TV__EXIT_FAIL;
}

const tv__cli_cmd tv__cli_cmd_version = {
    .name = "version",
    .run = tv__cli_version,
    .positionals = "",
    .min_pos = 0,
    .max_pos = 0,
    .opts = {{"--json", NULL, NULL, "as JSON (the API's Version)"}},
    .about = "Print this tensorvault's version, git revision, API version and build features.",
    .example = "tensorvault version --json",
};

int tv__cli_version(const tv__cli_ctx *c)
{
    json_t *v = tv__api_version_json();
    tv__cli_print(stdout, c->json, TV__DOC_VERSION, v);
    json_decref(v);
    return TV__EXIT_OK;
}

/* What a command's table says it takes: which rules its --help states. */
static bool has_opt(const tv__cli_cmd *cmd, const char *name)
{
    for (size_t k = 0; k < TV__CLI_MAX_OPTS && cmd->opts[k].name; k++)
        if (!strcmp(cmd->opts[k].name, name))
            return true;
    return false;
}

static bool has_size(const tv__cli_cmd *cmd)
{
    for (size_t k = 0; k < TV__CLI_MAX_OPTS && cmd->opts[k].name; k++)
        if (cmd->opts[k].metavar && !strcmp(cmd->opts[k].metavar, "SIZE"))
            return true;
    return false;
}

static void note_size(FILE *f)
{
    fputs("SIZE: bytes, or digits with a binary suffix K, M, G, T or\n", f);
    fputs("  KiB, MiB, GiB, TiB in any case (all powers of 1024: 64K = 64kib = 65536);\n", f);
    fputs("  1GB, 1B, 1.5G, 1 G, signs and sizes above 2^64-1 are refused.\n", f);
}

static void note_gen(FILE *f)
{
    fputs("GEN: a generation number from 1, digits only (no sign, spaces, leading zeros).\n", f);
    fputs("NAME@GEN|@ALIAS: a generation, an alias ([A-Za-z][A-Za-z0-9._-]*) or @active;\n", f);
    fputs("  NAME alone is the active generation.\n", f);
}

static void note_rows(FILE *f)
{
    fputs("R0:R1 (--rows): rows [R0, R1) of dimension 0, decimal,\n", f);
    fputs("  0 <= R0 <= R1 <= dim 0; R0 == R1 writes nothing (numpy's a[r:r] is empty).\n", f);
}

static void note_read(FILE *f)
{
    fputs("--qd 1..4096 (default 32), --chunk 4K..1G (default 1M, rounded up to the\n", f);
    fputs("  device's io alignment), --qd x --chunk at most 1G; in-process reads only\n", f);
    fputs("  (through the daemon the device options are the daemon's).\n", f);
}

static void note_daemon(FILE *f)
{
    fputs("Finding the daemon (the first that exists): --store DIR runs in this process;\n", f);
    fputs("  else --url, $TENSORVAULT_URL, $TENSORVAULT_STORE (in this process),\n", f);
    fputs("  " TV__CLI_INSTALLED_HTTP ", ./" TV__CLI_DEV_HTTP ", " TV__CLI_DEFAULT_URL ".\n", f);
    fputs("  The token: --token-file, $TENSORVAULT_TOKEN (the secret itself),\n", f);
    fputs("  $TENSORVAULT_TOKEN_FILE, " TV__CLI_INSTALLED_TOKEN ", ./" TV__CLI_DEV_TOKEN ".\n", f);
}

static void note_socket(FILE *f)
{
    fputs("Reading (the first that exists): --store DIR in this process; --socket PATH or\n", f);
    fputs("  --fastpath [SOCKET] through the daemon; $TENSORVAULT_SOCKET; $TENSORVAULT_STORE\n", f);
    fputs("  (in this process); " TV__CLI_INSTALLED_SOCKET "; ./" TV__CLI_DEV_SOCKET ".\n", f);
}

static void note_common(FILE *f)
{
    fputs("Each option at most once; --opt VALUE or --opt=VALUE; -- ends the options.\n", f);
    fputs("Exit status: 0 success, 1 failure (one line on stderr: tensorvault: CMD: CODE:\n", f);
    fputs("  message; with --json also {\"error\": ...} on stdout), 2 usage error.\n", f);
}

/* The top-level --help's notes: every rule, once. */
static void notes(FILE *f)
{
    fputs("\n`tensorvault COMMAND --help` says what a command does, with its options and an\n", f);
    fputs("example; docs/cli.md has all of it.\n", f);
    note_daemon(f);
    note_socket(f);
    note_size(f);
    note_gen(f);
    note_rows(f);
    note_read(f);
    fputs("import --chunk: 4K..256M (default 8M; 4 chunks in flight).\n", f);
    fputs("store init: --region-offset is a multiple of the device's io alignment.\n", f);
    note_common(f);
}

void tv__cli_cmd_help(FILE *f, const tv__cli_cmd *cmd)
{
    char line[1024];
    fprintf(f, "usage: tensorvault %s\n\n", tv__cli_cmd_usage(cmd, line, sizeof(line)));
    if (cmd->about)
        fprintf(f, "%s\n", cmd->about);
    fputs("\nOptions:\n", f);
    for (size_t k = 0; k < TV__CLI_MAX_OPTS && cmd->opts[k].name; k++) {
        const tv__cli_opt *o = &cmd->opts[k];
        char lhs[64];
        snprintf(lhs, sizeof lhs, "%s%s%s", o->name, o->metavar ? " " : "",
                 o->metavar ? o->metavar : "");
        if (strlen(lhs) > 20)
            fprintf(f, "  %s\n  %-20s %s\n", lhs, "", o->help ? o->help : "");
        else
            fprintf(f, "  %-20s %s\n", lhs, o->help ? o->help : "");
    }
    if (cmd->example) {
        fputs("\nExample:\n", f);
        for (const char *p = cmd->example; *p;) {
            size_t n = strcspn(p, "\n");
            fprintf(f, "  %.*s\n", (int)n, p);
            p += n + (p[n] == '\n');
        }
    }
    fputc('\n', f);
    if (has_opt(cmd, "--url"))
        note_daemon(f);
    if (has_opt(cmd, "--socket"))
        note_socket(f);
    if (has_size(cmd))
        note_size(f);
    if (strstr(cmd->positionals, "GEN") || strstr(cmd->positionals, "@"))
        note_gen(f);
    if (has_opt(cmd, "--rows"))
        note_rows(f);
    if (has_opt(cmd, "--qd"))
        note_read(f);
    note_common(f);
}

static void usage(FILE *f)
{
    char line[1024];
    fprintf(f, "usage: tensorvault COMMAND [ARGS]\n\ncommands:\n");
    for (size_t i = 0; i < tv__cli_n_cmds; i++)
        fprintf(f, "  %s\n", tv__cli_cmd_usage(tv__cli_cmds[i], line, sizeof(line)));
    notes(f);
}

/* `tensorvault CMD --help` (or -h right after CMD): its usage and the notes. */
static bool wants_help(int argc, char **argv)
{
    if (argc > 2 && !strcmp(argv[2], "-h"))
        return true;
    for (int i = 2; i < argc && strcmp(argv[i], "--"); i++)
        if (!strcmp(argv[i], "--help"))
            return true;
    return false;
}

static void set_log_level(void)
{
    /* The CLI is quiet by default: warnings and errors only. */
    const char *lv = getenv("TENSORVAULT_LOG");
    int level = TV_LOG_WARN;
    if (lv && !strcmp(lv, "debug"))
        level = TV_LOG_DEBUG;
    else if (lv && !strcmp(lv, "info"))
        level = TV_LOG_INFO;
    else if (lv && !strcmp(lv, "error"))
        level = TV_LOG_ERROR;
    tv__log_set_level(level);
}

int tv__cli_main(int argc, char **argv)
{
    set_log_level();
    if (argc < 2) {
        usage(stderr);
        return TV__EXIT_USAGE;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return TV__EXIT_OK;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("tensorvault %s\n", tv_version());
        return TV__EXIT_OK;
    }
    bool word = false; /* argv[1] is the first word of some command */
    for (size_t i = 0; i < tv__cli_n_cmds; i++) {
        const tv__cli_cmd *cmd = tv__cli_cmds[i];
        size_t wl = strcspn(cmd->name, " "); /* "store init" runs as "store" */
        if (strlen(argv[1]) != wl || strncmp(argv[1], cmd->name, wl))
            continue;
        word = true;
        int skip = 1; /* argv + skip starts at the command's last word */
        if (cmd->name[wl]) {
            /* "alias set": its second word must follow */
            if (argc < 3 || strcmp(argv[2], cmd->name + wl + 1) != 0)
                continue;
            skip = 2;
        }
        if (wants_help(argc - skip + 1, argv + skip - 1)) {
            tv__cli_cmd_help(stdout, cmd);
            return TV__EXIT_OK;
        }
        tv__cli_ctx c;
        int u = tv__cli_begin(cmd, argc - skip, argv + skip, &c);
        return u ? u : cmd->run(&c);
    }
    if (word) {
        /* A two-word command without (or with an unknown) second word: the
         * usage of every command of that word. */
        bool help = argc > 2 && (!strcmp(argv[2], "--help") || !strcmp(argv[2], "-h"));
        FILE *f = help ? stdout : stderr;
        if (argc > 2 && !help)
            fprintf(stderr, "tensorvault: %s: unknown subcommand '%s'\n", argv[1], argv[2]);
        for (size_t i = 0; i < tv__cli_n_cmds; i++) {
            char line[1024];
            size_t wl = strcspn(tv__cli_cmds[i]->name, " ");
            if (strlen(argv[1]) == wl && !strncmp(argv[1], tv__cli_cmds[i]->name, wl))
                fprintf(f, "usage: tensorvault %s\n%s%s",
                        tv__cli_cmd_usage(tv__cli_cmds[i], line, sizeof(line)),
                        help && tv__cli_cmds[i]->about ? tv__cli_cmds[i]->about : "",
                        help ? "\n\n" : "");
        }
        if (help)
            fprintf(stdout, "`tensorvault %s SUBCOMMAND --help` says more of each.\n", argv[1]);
        return help ? TV__EXIT_OK : TV__EXIT_USAGE;
    }
    fprintf(stderr, "tensorvault: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return TV__EXIT_USAGE;
}
