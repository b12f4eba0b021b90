/* The tensorvault command: shared declarations of its subcommands, their
 * tables (name, positionals, options: the usage line and --help are made
 * from them) and the prologue every subcommand starts with.
 * Invariant: every subcommand returns the process exit status (0 success,
 * 1 failure with one clear line on stderr, 2 usage error). */
#ifndef TV_CLI_H
#define TV_CLI_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include <jansson.h>

#include "cli/args.h"
#include "tensorvault/errors.h"

#define TV__EXIT_OK    0
#define TV__EXIT_FAIL  1
#define TV__EXIT_USAGE 2

/* What the prologue does for a command (tv__cli_cmd.flags). */
#define TV__CLI_STORE 1u /* --store DIR or $TENSORVAULT_STORE is required (store init) */
#define TV__CLI_SPEC  2u /* pos[0] is NAME[@GEN] */
#define TV__CLI_GEN   4u /* pos[1] is GEN */

#define TV__CLI_SPEC_MAX 512 /* bytes of NAME in NAME[@GEN], NUL included */

typedef struct tv__cli_ctx tv__cli_ctx;

typedef struct tv__cli_cmd {
    const char *name;                 /* "import"; "store init" (dispatched on its first word) */
    int (*run)(const tv__cli_ctx *c); /* after the prologue, tv__cli_begin */
    const char *positionals;          /* the usage line's text for them: "NAME SRC"; "" for none */
    unsigned min_pos, max_pos;
    unsigned flags;                     /* TV__CLI_* */
    size_t spec_len;                    /* TV__CLI_SPEC: NAME's buffer (0: TV__CLI_SPEC_MAX) */
    tv__cli_opt opts[TV__CLI_MAX_OPTS]; /* ends at the first without a name */
    const char *about;                  /* --help: what it does, what the positionals are */
    const char *example;                /* --help: example command lines, one per line */
} tv__cli_cmd;

/* Every command, in the order `tensorvault --help` lists them. */
extern const tv__cli_cmd *const tv__cli_cmds[];
extern const size_t tv__cli_n_cmds;

extern const tv__cli_cmd tv__cli_cmd_inspect, tv__cli_cmd_store, tv__cli_cmd_import,
    tv__cli_cmd_models, tv__cli_cmd_generations, tv__cli_cmd_generation, tv__cli_cmd_tensors,
    tv__cli_cmd_tensor, tv__cli_cmd_devices, tv__cli_cmd_activate, tv__cli_cmd_rollback,
    tv__cli_cmd_deactivate, tv__cli_cmd_retire, tv__cli_cmd_alias_set, tv__cli_cmd_alias_rm,
    tv__cli_cmd_alias_list, tv__cli_cmd_delete, tv__cli_cmd_gc, tv__cli_cmd_verify,
    tv__cli_cmd_jobs, tv__cli_cmd_job, tv__cli_cmd_cancel, tv__cli_cmd_token_create,
    tv__cli_cmd_token_list, tv__cli_cmd_token_revoke, tv__cli_cmd_status, tv__cli_cmd_version,
    tv__cli_cmd_demo, tv__cli_cmd_get, tv__cli_cmd_bench, tv__cli_cmd_sessions, tv__cli_cmd_fleet,
    tv__cli_cmd_fleet_alias, tv__cli_cmd_files, tv__cli_cmd_checkout;

/* verify on a local store dir, read-only (no job row, no lock: works on a
 * read-only mount and beside a writer); device_id 0 = every device. */
int tv__cli_verify_local(const tv__cli_ctx *c, const char *dir, int64_t device_id);

int tv__cli_inspect(const tv__cli_ctx *c);
int tv__cli_store(const tv__cli_ctx *c);
int tv__cli_import(const tv__cli_ctx *c);
/* The importer run directly on --store DIR (c->store, else --store), for
 * import --replicas/--chunk (the API has neither); every other import, local
 * or remote, is a job through the API. */
int tv__cli_import_local(const tv__cli_ctx *c);
int tv__cli_models(const tv__cli_ctx *c);
int tv__cli_generations(const tv__cli_ctx *c);
int tv__cli_generation(const tv__cli_ctx *c);
int tv__cli_tensors(const tv__cli_ctx *c);
int tv__cli_tensor(const tv__cli_ctx *c);
int tv__cli_devices(const tv__cli_ctx *c);
int tv__cli_activate(const tv__cli_ctx *c);
int tv__cli_rollback(const tv__cli_ctx *c);
int tv__cli_deactivate(const tv__cli_ctx *c);
int tv__cli_retire(const tv__cli_ctx *c);
int tv__cli_alias_set(const tv__cli_ctx *c);
int tv__cli_alias_rm(const tv__cli_ctx *c);
int tv__cli_alias_list(const tv__cli_ctx *c);
int tv__cli_delete(const tv__cli_ctx *c);
int tv__cli_gc(const tv__cli_ctx *c);
int tv__cli_verify(const tv__cli_ctx *c);
int tv__cli_jobs(const tv__cli_ctx *c);
int tv__cli_job(const tv__cli_ctx *c);
int tv__cli_cancel(const tv__cli_ctx *c);
int tv__cli_sessions(const tv__cli_ctx *c);
int tv__cli_fleet(const tv__cli_ctx *c);
int tv__cli_fleet_alias(const tv__cli_ctx *c);
int tv__cli_token_create(const tv__cli_ctx *c);
int tv__cli_token_list(const tv__cli_ctx *c);
int tv__cli_token_revoke(const tv__cli_ctx *c);
int tv__cli_status(const tv__cli_ctx *c);
int tv__cli_version(const tv__cli_ctx *c);
int tv__cli_demo(const tv__cli_ctx *c);
int tv__cli_get_tensor(const tv__cli_ctx *c);
int tv__cli_bench(const tv__cli_ctx *c);
int tv__cli_files(const tv__cli_ctx *c);    /* files_cmds.c */
int tv__cli_checkout(const tv__cli_ctx *c); /* files_cmds.c */

/* The whole CLI: dispatches argv[1] to its subcommand; returns the exit status. */
int tv__cli_main(int argc, char **argv);

/* A command's usage line (after "tensorvault "), from its table. */
const char *tv__cli_cmd_usage(const tv__cli_cmd *cmd, char *buf, size_t len);

/* `tensorvault CMD --help`: the usage line, what the command does, every
 * option with what it means, an example, and the rules that apply to it
 * (value grammars, where the daemon is found, exit codes). */
void tv__cli_cmd_help(FILE *f, const tv__cli_cmd *cmd);

/* What the prologue found. */
struct tv__cli_ctx {
    const tv__cli_cmd *cmd;
    tv__cli_args a;
    bool json;                    /* --json */
    const char *store;            /* TV__CLI_STORE: the store directory */
    char model[TV__CLI_SPEC_MAX]; /* TV__CLI_SPEC: NAME */
    int64_t gen;                  /* TV__CLI_SPEC: GEN or 0 (active); TV__CLI_GEN: pos[1] */
};

/* The prologue of every command (tv__cli_main runs it before cmd->run), in
 * this order: parse the options against cmd's table, the store directory
 * (TV__CLI_STORE), the positional count, NAME[@GEN] (TV__CLI_SPEC) and GEN
 * (TV__CLI_GEN). argv[0] is the command word. Returns 0, or 2 with the
 * usage error printed. */
int tv__cli_begin(const tv__cli_cmd *cmd, int argc, char **argv, tv__cli_ctx *c);

/* Sets err to code with "what: strerror" and returns code. */
int tv__cli_err(tv_error *err, int code, const char *what);

/* Prints "tensorvault: CMD: NAME: message" to stderr and, with json, the
 * error object {"error":{"code","message"}} to stdout. */
void tv__cli_fail(const char *cmd, bool json, int code, const char *msg);

/* tv__cli_fail for the command of c with err's message (or the code's
 * text when empty); returns TV__EXIT_FAIL. */
int tv__cli_failed(const tv__cli_ctx *c, int code, const tv_error *err);

#endif
