/* Tiny option parser shared by the CLI subcommands: --flag, --opt VALUE,
 * --opt=VALUE and positionals. Invariant: unknown options are usage errors. */
#ifndef TV_CLI_ARGS_H
#define TV_CLI_ARGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct tv_cli_opt {
    const char *name;  /* "--store" */
    bool takes_value;
    const char *value; /* set when seen (flags get "1") */
} tv_cli_opt;

typedef struct tv_cli_args {
    tv_cli_opt *opts;
    size_t n_opts;
    const char *pos[8];
    size_t n_pos;
} tv_cli_args;

/* Returns 0, or prints a message and returns 2 (usage). argv[0] is the
 * subcommand name. */
int tv_cli_parse(const char *cmd, int argc, char **argv, tv_cli_args *a);
const char *tv_cli_get(const tv_cli_args *a, const char *name);
bool tv_cli_flag(const tv_cli_args *a, const char *name);
/* Parses "123", "64K", "512M", "2G", "1T" (binary units; an optional "iB"
 * or "B" suffix). Returns 0 or -1. */
int tv_cli_parse_size(const char *s, uint64_t *out);

#endif
