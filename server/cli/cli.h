/* The tensorvault command: shared declarations of its subcommands.
 * Invariant: every subcommand returns the process exit status (0 success,
 * 1 failure with one clear line on stderr, 2 usage error). */
#ifndef TV_CLI_H
#define TV_CLI_H

#include <stdbool.h>
#include <stdio.h>

#include "tensorvault/errors.h"

#define TV_EXIT_OK 0
#define TV_EXIT_FAIL 1
#define TV_EXIT_USAGE 2

typedef struct tv_cli_cmd {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *usage;
} tv_cli_cmd;

int tv_cli_inspect(int argc, char **argv);
int tv_cli_store(int argc, char **argv);
int tv_cli_import(int argc, char **argv);
int tv_cli_models(int argc, char **argv);
int tv_cli_generations(int argc, char **argv);
int tv_cli_tensors(int argc, char **argv);
int tv_cli_devices(int argc, char **argv);
int tv_cli_activate(int argc, char **argv);
int tv_cli_retire(int argc, char **argv);
int tv_cli_gc(int argc, char **argv);
int tv_cli_verify(int argc, char **argv);
int tv_cli_get_tensor(int argc, char **argv);
int tv_cli_bench(int argc, char **argv);

/* The whole CLI: dispatches argv[1] to its subcommand; returns the exit status. */
int tv__cli_main(int argc, char **argv);

/* Sets err to code with "what: strerror" and returns code. */
int tv__cli_err(tv_error *err, int code, const char *what);

/* Prints "tensorvault: CMD: NAME: message" to stderr and, with json, the
 * error object {"error":{"code","message"}} to stdout. */
void tv_cli_fail(const char *cmd, bool json, int code, const char *msg);

#endif
